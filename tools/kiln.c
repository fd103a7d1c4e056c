/* kiln.c: the command-line program.
 *
 *   kiln generate -m MODEL -p PROMPT [-n N] [--temp T --top-k K --top-p P --min-p M --seed S] [--chat]
 *   kiln chat -m MODEL [--system TEXT] [--chat-template chatml|llama2|llama3]
 *   kiln info MODEL
 *   kiln bench -m MODEL [-p 512] [-n 128] [-r 3]
 *   kiln perplexity -m MODEL -f TEXT [--ctx N]
 *   (generate, chat, bench, perplexity, tokenize: --backend cpu|cuda, --gpu-dtype bf16|f16|f32)
 *
 * Generated text goes to stdout; statistics and messages go to stderr, so
 * stdout holds only the text. Exit status: 0 ok, 1 error, 2 usage.
 */
#include "kiln.h"
#include "kiln_chat.h"
#include "kiln_llm.h"
#include "kiln_backend.h"
#include "backends/cpu/threadpool.h"
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *model, *prompt, *tokenizer, *file, *system, *tmpl, *backend, *gpu_dtype;
    int n, ctx, batch, reps, n_prompt_bench, threads;
    bool chat, have_temp, kv_f16;
    kn_sampler_params sp;
    const char *stop[8];
    int n_stop;
} args;

static void usage(void) {
    fprintf(stderr,
            "usage: kiln <command> [options]\n"
            "  generate -m MODEL -p PROMPT   generate text (stdout), speed on stderr\n"
            "  chat -m MODEL                 interactive chat (/reset to start over, Ctrl-D to quit)\n"
            "  info MODEL                    architecture, hyperparameters, tensors, tokenizer\n"
            "  bench -m MODEL                prefill and decode tokens/s (median of runs)\n"
            "  perplexity -m MODEL -f FILE   perplexity of a text file\n"
            "  tokenize -m MODEL -p TEXT     print the token ids of TEXT\n"
            "  train mnist|char|gpt2 ...     train a model (kiln train --help)\n"
            "options:\n"
            "  -m FILE        model: GGUF (llama), llama2.c .bin, llm.c GPT-2 .bin, or a Hugging Face\n"
            "                 safetensors file/directory with config.json (Llama, GPT-2)\n"
            "  -z FILE        tokenizer: llama2.c tokenizer.bin, a GGUF vocabulary (.gguf), or llm.c\n"
            "                 gpt2_tokenizer.bin (decode only); needed for models without one\n"
            "  --kv-f16       keep the KV cache in f16 (half the memory)\n"
            "  -p TEXT        prompt                      -n N      tokens to generate (default 256)\n"
            "  --temp T       temperature, 0 = greedy     --seed S  random seed\n"
            "  --top-k K  --top-p P  --min-p M  --repeat-penalty R  --frequency-penalty F  --presence-penalty P\n"
            "  --stop TEXT    stop string (repeatable)    --chat    wrap -p in the model's chat template\n"
            "  --system TEXT  system prompt for chat      --chat-template chatml|llama2|llama3\n"
            "  --backend cpu|cuda  where the model runs (default: KN_BACKEND, else cpu)\n"
            "  --gpu-dtype bf16|f16|f32  weight matrices on the GPU (default bf16; f32 = the CPU's exact path)\n"
            "  --ctx N        context length              -t N      threads (default: all cores)\n"
            "  -f FILE        text for perplexity         -r N      bench repetitions (default 3)\n");
}

static int parse(int argc, char **argv, int start, args *a) {
    a->n = 256; a->reps = 3; a->n_prompt_bench = 512;
    a->sp = kn_sampler_defaults();
    for (int i = start; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
#define NEXT() (has ? argv[++i] : (fprintf(stderr, "kiln: option %s needs a value\n", o), (char *)NULL))
        if (!strcmp(o, "-m")) { if (!(a->model = NEXT())) return -1; }
        else if (!strcmp(o, "-p")) { if (!(a->prompt = NEXT())) return -1; }
        else if (!strcmp(o, "-z")) { if (!(a->tokenizer = NEXT())) return -1; }
        else if (!strcmp(o, "-f")) { if (!(a->file = NEXT())) return -1; }
        else if (!strcmp(o, "--system")) { if (!(a->system = NEXT())) return -1; }
        else if (!strcmp(o, "--chat-template")) { if (!(a->tmpl = NEXT())) return -1; }
        else if (!strcmp(o, "--backend")) { if (!(a->backend = NEXT())) return -1; }
        else if (!strcmp(o, "--gpu-dtype")) { if (!(a->gpu_dtype = NEXT())) return -1; }
        else if (!strcmp(o, "--stop")) { const char *s = NEXT(); if (!s) return -1; if (a->n_stop < 8) a->stop[a->n_stop++] = s; }
        else if (!strcmp(o, "--chat")) a->chat = true;
        else if (!strcmp(o, "--kv-f16")) a->kv_f16 = true;
        else {
            const char *v = NEXT();
            if (!v) return -1;
            char *end;
            double x = strtod(v, &end);
            if (*end) { fprintf(stderr, "kiln: %s expects a number, got '%s'\n", o, v); return -1; }
            if (!strcmp(o, "-n")) a->n = (int)x;
            else if (!strcmp(o, "--temp")) { a->sp.temp = (float)x; a->have_temp = true; }
            else if (!strcmp(o, "--top-k")) a->sp.top_k = (int)x;
            else if (!strcmp(o, "--top-p")) a->sp.top_p = (float)x;
            else if (!strcmp(o, "--min-p")) a->sp.min_p = (float)x;
            else if (!strcmp(o, "--seed")) a->sp.seed = (uint64_t)x;
            else if (!strcmp(o, "--repeat-penalty")) a->sp.repeat_penalty = (float)x;
            else if (!strcmp(o, "--frequency-penalty")) a->sp.freq_penalty = (float)x;
            else if (!strcmp(o, "--presence-penalty")) a->sp.presence_penalty = (float)x;
            else if (!strcmp(o, "--ctx")) a->ctx = (int)x;
            else if (!strcmp(o, "--batch")) a->batch = (int)x;
            else if (!strcmp(o, "-t")) a->threads = (int)x;
            else if (!strcmp(o, "-r")) a->reps = (int)x;
            else if (!strcmp(o, "--bench-prompt")) a->n_prompt_bench = (int)x;
            else { fprintf(stderr, "kiln: unknown option %s\n", o); return -1; }
        }
#undef NEXT
    }
    if (a->threads > 0) kn_pool_set_threads(a->threads);
    return 0;
}

/* --backend cpu|cuda (else KN_BACKEND, through kn_backend_default); NULL
 * after a message when the choice cannot be honoured */
static kn_backend *pick_backend(const args *a) {
    const char *b = a->backend;
    if (!b) return kn_backend_default();   /* KN_BACKEND=cuda without a GPU: a warning, then the CPU */
    if (!strcmp(b, "cpu")) return kn_backend_cpu();
    if (!strcmp(b, "cuda")) {
#ifdef KN_CUDA
        kn_backend *g = kn_backend_cuda();
        if (!g) fprintf(stderr, "kiln: --backend cuda: %s\n", kn_last_error());
        return g;
#else
        fprintf(stderr, "kiln: --backend cuda: this kiln was built without CUDA; rebuild with `make CUDA=1` on a machine with nvcc\n");
        return NULL;
#endif
    }
    fprintf(stderr, "kiln: --backend must be cpu or cuda, got '%s'\n", b);
    return NULL;
}

static kn_model *load(const args *a) {
    if (!a->model) { fprintf(stderr, "kiln: no model given (-m FILE)\n"); return NULL; }
    kn_backend *be = pick_backend(a);
    if (!be) return NULL;
    kn_weight_dtype wd = KN_WEIGHTS_AUTO;
    if (a->gpu_dtype) {
        if (!strcmp(a->gpu_dtype, "bf16")) wd = KN_WEIGHTS_BF16;
        else if (!strcmp(a->gpu_dtype, "f16")) wd = KN_WEIGHTS_F16;
        else if (!strcmp(a->gpu_dtype, "f32")) wd = KN_WEIGHTS_F32;
        else { fprintf(stderr, "kiln: --gpu-dtype must be bf16, f16 or f32, got '%s'\n", a->gpu_dtype); return NULL; }
        if (be->device == KN_DEVICE_HOST) {
            fprintf(stderr, "kiln: --gpu-dtype applies to --backend cuda; the %s backend uses the file's weights\n", kn_backend_name(be));
            return NULL;
        }
    }
    kn_model_opts o = {.tokenizer_path = a->tokenizer, .n_ctx = a->ctx, .n_batch = a->batch, .kv_f16 = a->kv_f16,
                       .backend = be, .weight_dtype = wd};
    kn_model *m;
    if (kn_model_load(a->model, &o, &m) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return NULL; }
    return m;
}

static bool print_cb(void *ud, int32_t tok, const char *text, size_t len) {
    (void)ud; (void)tok;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static bool get_template(kn_model *m, const args *a, kn_chat_tmpl *t) {
    kn_status st;
    if (a->tmpl) st = kn_chat_template_from_name(a->tmpl, t);
    else if (kn_model_chat_template(m)) st = kn_chat_template_from_string(kn_model_chat_template(m), t);
    else st = kn_set_error(KN_ERR_UNSUPPORTED, "the model file has no chat template; choose one with --chat-template chatml|llama2|llama3");
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
    return st == KN_OK;
}

static char *render(const kn_chat_tmpl *t, const kn_chat_msg *msgs, size_t n) {
    size_t need = 0;
    kn_chat_apply(t, msgs, n, true, NULL, 0, &need);
    char *buf = malloc(need + 1);
    if (buf && kn_chat_apply(t, msgs, n, true, buf, need + 1, &need) != KN_OK) { free(buf); return NULL; }
    return buf;
}

static int cmd_generate(const args *a) {
    if (!a->prompt) { fprintf(stderr, "kiln generate: no prompt (-p TEXT)\n"); return 2; }
    kn_model *m = load(a);
    if (!m) return 1;
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = a->n;
    gp.sampling = a->sp;
    gp.stop = a->stop; gp.n_stop = a->n_stop;
    char *text = NULL;
    const char *prompt = a->prompt;
    if (a->chat) {
        kn_chat_tmpl t;
        if (!get_template(m, a, &t)) { kn_model_free(m); return 1; }
        kn_chat_msg msgs[2]; size_t n = 0;
        if (a->system) msgs[n++] = (kn_chat_msg){"system", a->system};
        msgs[n++] = (kn_chat_msg){"user", a->prompt};
        text = render(&t, msgs, n);
        prompt = text;
        if (text && getenv("KN_DEBUG")) fprintf(stderr, "--- chat prompt ---\n%s\n-------------------\n", text);
    }
    kn_generate_stats s;
    kn_status st = prompt ? kn_generate(m, prompt, &gp, print_cb, NULL, &s) : KN_ERR_NOMEM;
    printf("\n");
    fflush(stdout);                    /* the text ends its line before the stats on stderr */
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
    else {
        if (s.hit_context_limit) fprintf(stderr, "kiln: stopped at the context limit (%d tokens)\n", kn_model_n_ctx(m));
        fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s)\n",
                s.n_prompt, s.prefill_s, s.prefill_s > 0 ? s.n_prompt / s.prefill_s : 0,
                s.n_generated, s.decode_s, s.decode_s > 0 ? s.n_generated / s.decode_s : 0);
    }
    free(text);
    kn_model_free(m);
    return st ? 1 : 0;
}

/* prints each piece and keeps the whole reply for the conversation history */
typedef struct { char *buf; size_t len, cap; } reply_buf;
static bool chat_cb(void *ud, int32_t tok, const char *text, size_t len) {
    reply_buf *r = ud;
    print_cb(NULL, tok, text, len);
    if (r->len + len + 1 > r->cap) {
        size_t c = r->cap ? r->cap * 2 : 1024;
        while (c < r->len + len + 1) c *= 2;
        char *b = realloc(r->buf, c);
        if (!b) return false;
        r->buf = b; r->cap = c;
    }
    memcpy(r->buf + r->len, text, len);
    r->len += len;
    r->buf[r->len] = 0;
    return true;
}

static int cmd_chat(const args *a) {
    kn_model *m = load(a);
    if (!m) return 1;
    kn_chat_tmpl t;
    if (!get_template(m, a, &t)) { kn_model_free(m); return 1; }
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = a->n;
    gp.sampling = a->sp;
    if (!a->have_temp) gp.sampling.temp = 0.7f;
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;                 /* each turn evaluates only what the cache lacks */
    size_t cap = 64, n = 0;
    kn_chat_msg *msgs = malloc(sizeof *msgs * cap);
    char **owned = malloc(sizeof *owned * cap);
    if (!msgs || !owned) { kn_model_free(m); return 1; }
    if (a->system) { msgs[n] = (kn_chat_msg){"system", a->system}; owned[n++] = NULL; }
    size_t n_sys = n;
    char line[8192];
    bool tty = isatty(0);
    int rc = 0;
    for (;;) {
        if (tty) { fprintf(stderr, "> "); fflush(stderr); }
        if (!fgets(line, sizeof line, stdin)) break;            /* Ctrl-D or end of piped input */
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/reset")) {
            for (size_t i = n_sys; i < n; i++) free(owned[i]);
            n = n_sys;
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (n + 2 > cap) {
            cap *= 2;
            kn_chat_msg *m2 = realloc(msgs, sizeof *msgs * cap);
            char **o2 = realloc(owned, sizeof *owned * cap);
            if (!m2 || !o2) { rc = 1; break; }
            msgs = m2; owned = o2;
        }
        owned[n] = strdup(line);
        msgs[n] = (kn_chat_msg){"user", owned[n]};
        n++;
        /* The whole conversation is rendered each turn (right for any
         * template); gp.reuse skips the tokens the KV cache already holds. */
        char *prompt = render(&t, msgs, n);
        if (!prompt) { fprintf(stderr, "kiln: cannot render the chat template\n"); rc = 1; break; }
        reply_buf r = {0};
        kn_generate_stats s;
        kn_status st = kn_generate(m, prompt, &gp, chat_cb, &r, &s);
        free(prompt);
        printf("\n");
        fflush(stdout);
        if (st) {
            fprintf(stderr, "kiln: %s\n", kn_last_error());
            free(r.buf);
            n--; free(owned[n]);
            if (st == KN_ERR_LIMIT) { fprintf(stderr, "(the conversation no longer fits the context: /reset starts over)\n"); continue; }
            rc = 1; break;
        }
        owned[n] = r.buf ? r.buf : strdup("");
        msgs[n] = (kn_chat_msg){"assistant", owned[n]};
        n++;
    }
    for (size_t i = 0; i < n; i++) free(owned[i]);
    free(msgs); free(owned);
    kn_kv_tokens_free(&kv);
    kn_model_free(m);
    return rc;
}

/* kiln tokenize: print the token ids of -p TEXT (one line, space separated) */
static int cmd_tokenize(const args *a) {
    if (!a->prompt) { fprintf(stderr, "kiln tokenize: no text (-p TEXT)\n"); return 2; }
    kn_model *m = load(a);
    if (!m) return 1;
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int cap = (int)strlen(a->prompt) + 8, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    kn_status st = ids ? kn_tokenize(tok, a->prompt, strlen(a->prompt), kn_tokenizer_add_bos(tok), true, ids, cap, &n) : KN_ERR_NOMEM;
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
    else { for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]); printf("\n"); }
    free(ids);
    kn_model_free(m);
    return st ? 1 : 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }

static int cmd_bench(const args *a) {
    kn_model *m = load(a);
    if (!m) return 1;
    const kn_model_config *c = kn_model_get_config(m);
    int np = a->n_prompt_bench, ng = a->n > 0 && a->n != 256 ? a->n : 128, reps = a->reps > 0 ? a->reps : 3;
    if (np + ng > kn_model_n_ctx(m)) np = kn_model_n_ctx(m) - ng;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(np > 0 ? np : 1));
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab);
    for (int i = 0; i < np; i++) toks[i] = (int32_t)((i * 7919 + 13) % c->n_vocab);
    double *pp = malloc(sizeof(double) * (size_t)reps), *tg = malloc(sizeof(double) * (size_t)reps);
    int rc = 0;
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = now_s();
        if (kn_model_eval(m, toks, np, 0, logits, false)) { rc = 1; break; }
        pp[r] = np / (now_s() - t0);
        t0 = now_s();
        /* decode from an empty context, one token per step, like llama-bench's
         * tg test; a fixed token pattern (as scripts/bench_llamacpp.py uses) */
        for (int i = 0; i < ng; i++) {
            int32_t t = (int32_t)((i * 31 + 7) % c->n_vocab);
            if (kn_model_eval(m, &t, 1, i, logits, false)) { rc = 1; break; }
        }
        tg[r] = ng / (now_s() - t0);
    }
    if (rc) fprintf(stderr, "kiln bench: %s\n", kn_last_error());
    else {
        qsort(pp, (size_t)reps, sizeof(double), cmp_d);
        qsort(tg, (size_t)reps, sizeof(double), cmp_d);
        printf("| model | type | params | threads | test | tokens/s (median of %d) |\n|---|---|---|---|---|---|\n", reps);
        /* on a GPU: the uploaded weight dtype, and the backend in the threads column */
        char th[32], ty[48];
        if (kn_model_backend(m)->device != KN_DEVICE_HOST) { snprintf(th, sizeof th, "gpu"); snprintf(ty, sizeof ty, "%s (file %s)", kn_dtype_name(c->run_weight_type), kn_dtype_name(c->weight_type)); }
        else { snprintf(th, sizeof th, "%d", kn_pool_nthreads()); snprintf(ty, sizeof ty, "%s", kn_dtype_name(c->weight_type)); }
        printf("| %s | %s | %.1fM | %s | pp%d | %.2f |\n", c->name, ty, c->n_params / 1e6, th, np, pp[reps / 2]);
        printf("| %s | %s | %.1fM | %s | tg%d | %.2f |\n", c->name, ty, c->n_params / 1e6, th, ng, tg[reps / 2]);
    }
    free(toks); free(logits); free(pp); free(tg);
    kn_model_free(m);
    return rc;
}

static int cmd_perplexity(const args *a) {
    if (!a->file) { fprintf(stderr, "kiln perplexity: no text file (-f FILE)\n"); return 2; }
    FILE *f = fopen(a->file, "rb");
    if (!f) { fprintf(stderr, "kiln: cannot open %s\n", a->file); return 1; }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)sz + 1);
    size_t got = fread(text, 1, (size_t)sz, f);
    text[got] = 0;
    fclose(f);
    kn_model *m = load(a);
    if (!m) { free(text); return 1; }
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int cap = (int)got + 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    kn_status st = kn_tokenize(tok, text, got, true, false, ids, cap, &n);
    int rc = 0;
    if (st) { fprintf(stderr, "kiln: %s\n", kn_last_error()); rc = 1; }
    int V = kn_model_get_config(m)->n_vocab, chunk = kn_model_n_ctx(m);
    float *logits = malloc(sizeof(float) * (size_t)chunk * V);
    double nll = 0; long count = 0;
    for (int s = 0; !rc && s + 1 < n; s += chunk) {
        int len = n - s < chunk ? n - s : chunk;
        if (kn_model_eval(m, ids + s, len, 0, logits, true)) { fprintf(stderr, "kiln: %s\n", kn_last_error()); rc = 1; break; }
        for (int i = 0; i + 1 < len; i++) {
            const float *l = logits + (size_t)i * V;
            float mx = l[0];
            for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
            double se = 0;
            for (int v = 0; v < V; v++) se += exp((double)l[v] - mx);
            nll += -((double)l[ids[s + i + 1]] - mx - log(se));
            count++;
        }
        fprintf(stderr, "\r%ld tokens, perplexity so far %.4f", count, exp(nll / (double)(count ? count : 1)));
    }
    if (!rc) printf("\nperplexity: %.4f over %ld tokens (%.4f nats/token)\n", exp(nll / count), count, nll / count);
    free(logits); free(ids); free(text);
    kn_model_free(m);
    return rc;
}

int kn_cli_train(int argc, char **argv);   /* tools/train.c */

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(); return argc < 2 ? 2 : 0; }
    args a = {0};
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) {
        if (argc < 3) { fprintf(stderr, "usage: kiln info MODEL\n"); return 2; }
        if (kn_model_print_info(argv[2], stdout) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
        return 0;
    }
    if (!strcmp(cmd, "train")) return kn_cli_train(argc, argv);
    if (parse(argc, argv, 2, &a)) { usage(); return 2; }
    if (!strcmp(cmd, "generate")) return cmd_generate(&a);
    if (!strcmp(cmd, "chat")) return cmd_chat(&a);
    if (!strcmp(cmd, "bench")) return cmd_bench(&a);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(&a);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&a);
    fprintf(stderr, "kiln: unknown command '%s'\n", cmd);
    usage();
    return 2;
}
