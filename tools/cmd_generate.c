/* cmd_generate.c: kiln generate, kiln tokenize and kiln bench. */
#include "cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_generate(const cli_args *a) {
    if (!a->prompt) { fprintf(stderr, "kiln generate: no prompt (-p TEXT)\n"); return 2; }
    kn_model *m = cli_load(a);
    if (!m) return 1;
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = a->n;
    gp.sampling = a->sp;
    gp.stop = a->stop; gp.n_stop = a->n_stop;
    cli_progress prog = {0};                 /* a long prompt shows its progress on a terminal */
    gp.progress = cli_show_progress; gp.progress_ud = &prog;
    char *text = NULL;
    const char *prompt = a->prompt;
    if (a->chat) {
        kn_chat_tmpl t;
        if (!cli_get_template(m, a, &t)) { kn_model_free(m); return 1; }
        kn_chat_msg msgs[2]; size_t n = 0;
        if (a->system) msgs[n++] = (kn_chat_msg){"system", a->system};
        msgs[n++] = (kn_chat_msg){"user", a->prompt};
        text = cli_render(&t, msgs, n);
        kn_chat_tmpl_free(&t);
        prompt = text;
        if (text && getenv("KN_DEBUG")) fprintf(stderr, "--- chat prompt ---\n%s\n-------------------\n", text);
    }
    kn_generate_stats s;
    kn_status st = prompt ? kn_generate(m, prompt, &gp, cli_print_token, NULL, &s) : KN_ERR_NOMEM;
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

/* kiln tokenize: print the token ids of -p TEXT (one line, space separated) */
int cmd_tokenize(const cli_args *a) {
    if (!a->prompt) { fprintf(stderr, "kiln tokenize: no text (-p TEXT)\n"); return 2; }
    kn_model *m = cli_load(a);
    if (!m) return 1;
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    if (!tok) {
        fprintf(stderr, "kiln tokenize: the model has no tokenizer; give one with -z FILE\n");
        kn_model_free(m);
        return 1;
    }
    int cap = (int)strlen(a->prompt) + 8, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    kn_status st = ids ? kn_tokenize(tok, a->prompt, strlen(a->prompt), kn_tokenizer_add_bos(tok), true, ids, cap, &n) : KN_ERR_NOMEM;
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
    else { for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]); printf("\n"); }
    free(ids);
    kn_model_free(m);
    return st ? 1 : 0;
}

static int cmp_d(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }

int cmd_bench(const cli_args *a) {
    kn_model *m = cli_load(a);
    if (!m) return 1;
    const kn_model_config *c = kn_model_get_config(m);
    int np = a->n_prompt_bench, ng = a->n, reps = a->reps, n_ctx = kn_model_n_ctx(m);
    /* the decode test runs from position 0 and must fit the context; the
     * prompt test is shortened to fit beside it */
    if (ng >= n_ctx) {
        fprintf(stderr, "kiln bench: -n %d does not fit the context of %d tokens; use a smaller -n or a larger --ctx\n", ng, n_ctx);
        kn_model_free(m);
        return 1;
    }
    if (np + ng > n_ctx) {
        np = n_ctx - ng;
        fprintf(stderr, "kiln bench: prompt test shortened to %d tokens to fit the context of %d\n", np, n_ctx);
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)np);
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab);
    double *pp = malloc(sizeof(double) * (size_t)reps), *tg = malloc(sizeof(double) * (size_t)reps);
    if (!toks || !logits || !pp || !tg) {
        fprintf(stderr, "kiln bench: out of memory\n");
        free(toks); free(logits); free(pp); free(tg);
        kn_model_free(m);
        return 1;
    }
    for (int i = 0; i < np; i++) toks[i] = (int32_t)((i * 7919 + 13) % c->n_vocab);
    const bool dev = kn_model_top_on_device(m);
    const int top_k = kn_sampler_defaults().top_k < c->n_vocab ? kn_sampler_defaults().top_k : c->n_vocab;
    int32_t top_ids[KN_MODEL_TOP_MAX];
    float top_lg[KN_MODEL_TOP_MAX];
    /* an untimed warm-up, like llama-bench's: first launches, pool blocks,
     * and on a GPU the sizes run once, so the timed repetitions replay
     * CUDA graphs from the second on (src/runtime/replay.c) instead of
     * counting a cold run and a capture among three */
    int rc = kn_model_eval(m, toks, np, 0, logits, false) != KN_OK;
    kn_plan_stats s0, s1;                   /* plan runs of the decode tests alone */
    uint64_t tg_runs = 0, tg_replays = 0;
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = cli_now_s();
        if (kn_model_eval(m, toks, np, 0, logits, false)) { rc = 1; break; }
        pp[r] = np / (cli_now_s() - t0);
        kn_model_plan_stats(m, &s0);
        t0 = cli_now_s();
        /* decode from an empty context, one token per step, like llama-bench's
         * tg test; a fixed token pattern (as scripts/bench_llamacpp.py uses) */
        for (int i = 0; i < ng; i++) {
            int32_t t = (int32_t)((i * 31 + 7) % c->n_vocab);
            /* where the device selects the candidates (KN_LLM_TOP=1), a
             * step returns what generation's default sampler reads (its
             * top-k); elsewhere the logits, as llama-bench's tg test reads
             * them */
            kn_status st = dev ? kn_model_eval_top(m, &t, 1, i, top_k, top_ids, top_lg) : kn_model_eval(m, &t, 1, i, logits, false);
            if (st) { rc = 1; break; }
        }
        tg[r] = ng / (cli_now_s() - t0);
        kn_model_plan_stats(m, &s1);
        tg_runs += s1.runs - s0.runs;
        tg_replays += s1.replays - s0.replays;
    }
    if (rc) fprintf(stderr, "kiln bench: %s\n", kn_last_error());
    else {
        qsort(pp, (size_t)reps, sizeof(double), cmp_d);
        qsort(tg, (size_t)reps, sizeof(double), cmp_d);
        printf("| model | type | params | threads | test | tokens/s (median of %d) |\n|---|---|---|---|---|---|\n", reps);
        /* on a GPU: the uploaded weight dtype, and the backend in the threads column */
        char th[32], ty[48];
        if (kn_model_backend(m)->device != KN_DEVICE_HOST) { snprintf(th, sizeof th, "gpu"); snprintf(ty, sizeof ty, "%s (file %s)", kn_dtype_name(c->run_weight_type), kn_dtype_name(c->weight_type)); }
        else { snprintf(th, sizeof th, "%d", kn_threads()); snprintf(ty, sizeof ty, "%s", kn_dtype_name(c->weight_type)); }
        printf("| %s | %s | %.1fM | %s | pp%d | %.2f |\n", c->name, ty, c->n_params / 1e6, th, np, pp[reps / 2]);
        printf("| %s | %s | %.1fM | %s | tg%d | %.2f |\n", c->name, ty, c->n_params / 1e6, th, ng, tg[reps / 2]);
        /* a replayed step is one graph launch from the host, a plain one a launch per kernel node */
        kn_plan_stats s;
        kn_model_plan_stats(m, &s);
        double per = tg_runs ? ((double)(tg_runs - tg_replays) * s.kernels + (double)tg_replays) / (double)tg_runs : 0;
        printf("decode: %.1f host launches per token (%d kernel nodes a plain step; %llu of %llu steps graph replays); "
               "plan: %llu runs, %llu graphs captured\n", per, s.kernels, (unsigned long long)tg_replays,
               (unsigned long long)tg_runs, (unsigned long long)s.runs, (unsigned long long)s.captures);
        printf("compiler: %d kernel launches per plain step, %d of them generated kernels fusing %d nodes; %d matmuls "
               "took %d nodes into epilogues and prologues (%d prologues) (KN_NOFUSE=1: off)\n",
               s.kernels, s.generated, s.fused_nodes, s.epilogues, s.epilogue_nodes, s.prologues);
    }
    free(toks); free(logits); free(pp); free(tg);
    kn_model_free(m);
    return rc;
}
