/* train.c: `kiln train`: real training runs on the CPU with the trainer loop
 * of kiln_train.h.
 *
 *   kiln train mnist --model mlp|cnn [--epochs N --batch B --lr LR --data DIR --out CKPT]
 *   kiln train char  --data FILE [--layers L --dim C --heads H --ctx T --steps N ...]
 *   kiln train gpt2  --data SHARD[,SHARD...]|TEXT.txt [--layers 4 --dim 256 ...]
 *
 * Every step is one plan (forward + backward + AdamW update) compiled once
 * and replayed; evaluation is a second plan over the same parameters, and
 * text samples a third (LMs). Batches are a pure function of the step
 * (a seeked loader for MNIST, windows at hashed offsets for LMs), so
 * `--resume CKPT` continues bit for bit. Ctrl-C saves the checkpoint.
 *
 * Options come from one table (k_opts): each is range-checked with
 * cli_num.h, belongs to some tasks, and has a default per task (and per
 * MNIST model) that --help prints; nothing falls back to a default
 * silently. --out is checked writable (and its disk big enough for one
 * checkpoint) before any work. The char and gpt2 checkpoints also record
 * their vocabulary, so `kiln generate`/`kiln chat` load them and `kiln
 * export` writes them as GGUF (src/llm/model_ckpt.h).
 *
 * Dimension letters: B batch, T context, C width, V vocabulary.
 * Exit status: 0 ok, 1 error (missing data, bad files, mismatched
 * checkpoint, divergence, a failed save), 2 usage, 130 stopped by Ctrl-C
 * (the checkpoint saved; stderr says where and how to continue).
 * `--dropout P` (LMs) drops embeddings and the attention and MLP outputs with a mask
 * drawn from the step number, so resumed runs still repeat bit for bit.
 * `--gpus N` (LMs) trains data-parallel over N ranks (kiln_dist.h): without a
 * launcher around it, kiln train starts N copies of itself through `kiln run`
 * (tools/cmd_run.c); each rank takes its own B windows of the step (global
 * batch N x B), gradients are averaged, rank 0 logs, evaluates and saves.
 */
#include "kiln.h"
#include "kiln_ckpt.h"
#include "kiln_data.h"
#include "kiln_dist.h"
#include "kiln_nn.h"
#include "kiln_tokenizer.h"
#include "kiln_train.h"
#include "cli.h"
#include "cli_num.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

int kn_cli_train(int argc, char **argv);

/* ---- options -------------------------------------------------------------------- */

enum { T_MNIST = 1, T_CHAR = 2, T_GPT2 = 4, T_LM = T_CHAR | T_GPT2, T_ALL = 7 };

typedef struct targs {
    const char *what;                  /* mnist, char, gpt2 */
    unsigned task;                     /* T_MNIST, T_CHAR or T_GPT2 */
    const char *model, *data, *out, *resume, *tokenizer, *shards, *precision;
    int64_t epochs, batch, steps, layers, dim, heads, ctx, eval_every, ckpt_every, sample_every, sample_len,
        eval_batches, warmup, log_every, threads, full_vocab, gpus, zero;
    double lr, min_lr_frac, wd, beta1, beta2, val_frac, temp, clip, dropout, attn_dropout;
    uint64_t seed;
    kn_precision prec;                 /* parsed --precision */
    bool set[64];                      /* set[i]: option i was given */
    char **argv; int argc;             /* for the resume hint */
    kn_dist *dist;                     /* --gpus: this rank's communicator */
} targs;

typedef enum { O_STR, O_INT, O_REAL, O_U64 } okind;

/* One option: its value lands at offset `off` of targs (a const char *,
 * int64_t, double or uint64_t by kind); numbers must lie in [lo, hi] (lo
 * excluded when lo_open, hi when hi_open). `dflt` is the default's text
 * where it is not a plain value of targs (computed from other options, or
 * none). */
typedef struct topt {
    const char *name, *arg, *help;
    okind kind;
    unsigned tasks;
    double lo, hi;
    bool lo_open, hi_open;
    size_t off;
    const char *dflt;
} topt;

#define F(field) offsetof(targs, field)
static const topt k_opts[] = {
    {"--model", "mlp|cnn", "MNIST network", O_STR, T_MNIST, 0, 0, false, false, F(model), NULL},
    {"--data", "PATH", "training data (mnist: DIR of idx files; char: text FILE; gpt2: SHARD[,SHARD...] or TEXT.txt)",
     O_STR, T_ALL, 0, 0, false, false, F(data), NULL},
    {"--out", "CKPT", "checkpoint (.safetensors) written every --ckpt-every steps, at the end and on Ctrl-C",
     O_STR, T_ALL, 0, 0, false, false, F(out), "none: nothing is saved"},
    {"--resume", "CKPT", "continue a run (same options) from its checkpoint; keeps writing it unless --out says otherwise",
     O_STR, T_ALL, 0, 0, false, false, F(resume), "none"},
    {"--epochs", "N", "passes over the training images", O_INT, T_MNIST, 1, 1000, false, false, F(epochs), NULL},
    {"--steps", "N", "optimizer steps", O_INT, T_LM, 1, 1e9, false, false, F(steps), NULL},
    {"--batch", "B", "batch size (images, or windows of --ctx tokens)", O_INT, T_ALL, 1, 65536, false, false, F(batch), NULL},
    {"--lr", "LR", "peak learning rate (AdamW, cosine schedule to lr/10)", O_REAL, T_ALL, 0, 10, true, false, F(lr), NULL},
    {"--wd", "W", "weight decay (matrices only)", O_REAL, T_ALL, 0, 10, false, false, F(wd), NULL},
    {"--beta1", "B", "AdamW's first-moment decay", O_REAL, T_ALL, 0, 1, false, true, F(beta1), NULL},
    {"--beta2", "B", "AdamW's second-moment decay (0.99 suits small batches of tokens: nanoGPT's char recipe)", O_REAL,
     T_ALL, 0, 1, false, true, F(beta2), NULL},
    {"--warmup", "N", "linear warm-up steps", O_INT, T_ALL, 0, 1e9, false, false, F(warmup), NULL},
    {"--clip", "NORM", "clip the gradient norm (0: off)", O_REAL, T_ALL, 0, 1e6, false, false, F(clip), NULL},
    {"--layers", "L", "transformer blocks", O_INT, T_LM, 1, 1024, false, false, F(layers), NULL},
    {"--dim", "C", "model width (a multiple of --heads)", O_INT, T_LM, 1, 65536, false, false, F(dim), NULL},
    {"--heads", "H", "attention heads", O_INT, T_LM, 1, 65536, false, false, F(heads), NULL},
    {"--ctx", "T", "context length (tokens per window)", O_INT, T_LM, 1, 65536, false, false, F(ctx), NULL},
    {"--dropout", "P", "dropout on embeddings and the attention and MLP outputs while training, in [0, 1)", O_REAL, T_LM, 0, 1,
     false, true, F(dropout), NULL},
    {"--attn-dropout", "P", "dropout on the attention probabilities while training, in [0, 1) (GPT-2's attn_pdrop; above 0 "
     "the training forward runs attention unfused, slower than the flash kernels)", O_REAL, T_LM, 0, 1, false, true,
     F(attn_dropout), NULL},
    {"--val-frac", "F", "fraction of the tokens held out for validation, in (0, 1)", O_REAL, T_LM, 0, 1, true,
     true, F(val_frac), NULL},
    {"--eval-every", "N", "evaluate every N steps (0: at the end only)", O_INT, T_ALL, 0, 1e9, false, false,
     F(eval_every), NULL},
    {"--eval-batches", "N", "validation batches per evaluation", O_INT, T_LM, 1, 1e6, false, false, F(eval_batches),
     NULL},
    {"--ckpt-every", "N", "also save the checkpoint every N steps (0: only at the end and on Ctrl-C)", O_INT, T_ALL, 0,
     1e9, false, false, F(ckpt_every), NULL},
    {"--sample-every", "N", "print a text sample every N steps (0: at the end only)", O_INT, T_LM, 0, 1e9, false,
     false, F(sample_every), NULL},
    {"--sample-len", "N", "tokens per sample (0: no samples)", O_INT, T_LM, 0, 1e6, false, false, F(sample_len), NULL},
    {"--temp", "T", "sampling temperature", O_REAL, T_LM, 0, 100, true, false, F(temp), NULL},
    {"--seed", "S", "seed of the initialisation, batches and samples", O_U64, T_ALL, 0, 0, false, false, F(seed), NULL},
    {"--tokenizer", "FILE", "GGUF with the GPT-2 vocabulary", O_STR, T_GPT2, 0, 0, false, false, F(tokenizer),
     "$KN_ASSETS/gguf/ggml-vocab-gpt-2.gguf"},
    {"--shards", "PREFIX", "where a .txt is tokenized to", O_STR, T_GPT2, 0, 0, false, false, F(shards),
     "/tmp/kiln_NAME_gpt2"},
    {"--full-vocab", "0|1", "1: keep all 50257 GPT-2 ids; 0: only the ids of the training tokens, renumbered, + one for "
     "unseen ones (same tokens, smaller softmax)", O_INT, T_GPT2, 0, 1, false, false, F(full_vocab), NULL},
    {"--log-every", "N", "progress line every N steps when stderr is not a terminal", O_INT, T_ALL, 1, 1e9, false,
     false, F(log_every), NULL},
    {"--precision", "f32|bf16|f16", "compute dtype of the matmuls; weights and optimizer state stay f32 (bf16: CUDA, or "
     "a CPU with AVX512_BF16; f16: with dynamic loss scaling)", O_STR, T_ALL, 0, 0, false, false, F(precision), NULL},
    {"-t", "N", "threads", O_INT, T_ALL, 1, 512, false, false, F(threads), "all cores"},
    {"--gpus", "N", "data-parallel ranks, one process per GPU (KN_BACKEND=cuda) or per CPU rank; --batch is per rank "
     "(0: one process, no communicator)", O_INT, T_LM, 0, 256, false, false, F(gpus), NULL},
    {"--zero", "STAGE", "with --gpus: 1 keeps each parameter's optimizer state on one rank only (ZeRO-1: about 1/N of it "
     "a rank, the same results), 0 on every rank", O_INT, T_LM, 0, 1, false, false, F(zero), NULL},
};
#undef F
enum { N_OPTS = (int)(sizeof k_opts / sizeof k_opts[0]) };
_Static_assert(N_OPTS <= 64, "targs.set has room for 64 options");

static int opt_index(const char *name) {
    for (int i = 0; i < N_OPTS; i++) if (!strcmp(k_opts[i].name, name)) return i;
    return -1;
}
static bool given(const targs *a, const char *name) { int i = opt_index(name); return i >= 0 && a->set[i]; }

static const char *task_name(unsigned t) { return t == T_MNIST ? "mnist" : t == T_CHAR ? "char" : "gpt2"; }

/* Every default that is a plain value; the ones computed from other options
 * (warmup, eval_every for LMs) are filled in by derive_defaults. */
static void set_defaults(targs *a, unsigned task) {
    bool gpt2 = task == T_GPT2, cnn = a->model && !strcmp(a->model, "cnn");
    a->task = task;
    if (task == T_MNIST && !a->model) a->model = "mlp";
    a->seed = 1337; a->min_lr_frac = 0.1; a->precision = "f32"; a->log_every = task == T_MNIST ? 50 : 10;
    a->wd = task == T_MNIST ? 0.0 : 0.01;
    kn_optim_cfg od = kn_optim_defaults(KN_OPTIM_ADAMW);   /* the library's betas, not a copy of them */
    a->beta1 = od.beta1; a->beta2 = od.beta2;
    a->clip = 1.0;
    if (task == T_MNIST) {
        a->epochs = cnn ? 3 : 8; a->batch = cnn ? 64 : 128; a->lr = cnn ? 2e-3 : 1e-3; a->warmup = 100;
        return;
    }
    a->layers = 4; a->dim = gpt2 ? 256 : 128; a->heads = 4; a->ctx = 128;
    a->batch = gpt2 ? 8 : 32; a->steps = gpt2 ? 600 : 2000; a->lr = gpt2 ? 1e-3 : 2e-3;
    a->eval_batches = gpt2 ? 4 : 8; a->sample_len = gpt2 ? 120 : 400;
    a->val_frac = gpt2 ? 0.05 : 0.1; a->temp = gpt2 ? 0.9 : 0.8;
}

/* Options not given take their defaults (which may depend on --model). */
static void fill_defaults(targs *a) {
    targs d = {.model = a->model};
    set_defaults(&d, a->task);
    for (int i = 0; i < N_OPTS; i++) {
        if (a->set[i]) continue;
        size_t sz = k_opts[i].kind == O_STR ? sizeof(const char *) : 8;
        memcpy((char *)a + k_opts[i].off, (const char *)&d + k_opts[i].off, sz);
    }
    a->min_lr_frac = d.min_lr_frac;
}

static void derive_defaults(targs *a) {
    if (a->task == T_MNIST) return;                     /* eval: once per epoch unless given */
    if (!given(a, "--warmup")) a->warmup = a->steps / 20 + 1;
    if (!given(a, "--eval-every")) a->eval_every = a->steps / 5 > 0 ? a->steps / 5 : 1;
}

/* The plain default value of option o for task (and MNIST model). */
static void value_text(const topt *o, unsigned task, const char *model, char *buf, size_t cap) {
    targs d = {.model = model};
    set_defaults(&d, task);
    const char *p = (const char *)&d + o->off;
    switch (o->kind) {
    case O_STR: snprintf(buf, cap, "%s", *(const char *const *)p ? *(const char *const *)p : "none"); break;
    case O_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)p); break;
    case O_REAL: snprintf(buf, cap, "%g", *(const double *)p); break;
    case O_U64: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    }
}

/* The default of option o for task (printed by --help). */
static void default_text(const topt *o, unsigned task, char *buf, size_t cap) {
    if (o->dflt) { snprintf(buf, cap, "%s", o->dflt); return; }
    if (!strcmp(o->name, "--warmup") && task != T_MNIST) { snprintf(buf, cap, "steps/20 + 1"); return; }
    if (!strcmp(o->name, "--eval-every")) { snprintf(buf, cap, task == T_MNIST ? "once per epoch" : "steps/5"); return; }
    if (!strcmp(o->name, "--data") && task == T_MNIST) { snprintf(buf, cap, "$KN_ASSETS/datasets/mnist"); return; }
    if (!strcmp(o->name, "--model")) { snprintf(buf, cap, "mlp"); return; }
    if (!strcmp(o->name, "--data")) { snprintf(buf, cap, "required"); return; }
    char mlp[32], cnn[32];
    value_text(o, task, "mlp", mlp, sizeof mlp);
    value_text(o, task, "cnn", cnn, sizeof cnn);
    if (task == T_MNIST && strcmp(mlp, cnn)) snprintf(buf, cap, "mlp %.20s, cnn %.20s", mlp, cnn);
    else snprintf(buf, cap, "%s", mlp);
}

/* "  HEAD   text" with the text wrapped at 100 columns under itself. */
static void print_wrapped(FILE *f, const char *head, const char *text) {
    enum { INDENT = 23, WIDTH = 100 };
    fprintf(f, "  %-20s ", head);
    size_t col = INDENT;
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (!w) break;
        if (col > INDENT && col + 1 + w > WIDTH) { fprintf(f, "\n%*s", INDENT, ""); col = INDENT; }
        else if (col > INDENT) { fputc(' ', f); col++; }
        fwrite(p, 1, w, f);
        col += w;
        p += w;
    }
    fputc('\n', f);
}

/* Usage on stdout (--help) or stderr; tasks: the tasks whose options and
 * defaults are listed (T_ALL: every task, defaults per task). */
static void train_usage(FILE *f, unsigned tasks) {
    fprintf(f,
            "usage: kiln train mnist|char|gpt2 [options]   (kiln train TASK --help: that task's options)\n"
            "  mnist --model mlp|cnn   MNIST classifier (data: DIR with the idx files)\n"
            "  char  --data FILE       character-level GPT on a text file\n"
            "  gpt2  --data SHARDS|TXT GPT-2 on llm.c token shards (comma separated), or a .txt that is\n"
            "                          tokenized first (GPT-2 BPE from gguf/ggml-vocab-gpt-2.gguf)\n"
            "Ctrl-C stops after the current step and saves the checkpoint (exit status 130).\n"
            "Then: kiln generate -m CKPT -p TEXT samples from a char/gpt2 checkpoint; kiln export -m CKPT -o OUT.gguf.\n"
            "options%s%s:\n", tasks == T_ALL ? "" : " of ", tasks == T_ALL ? "" : task_name(tasks));
    for (int i = 0; i < N_OPTS; i++) {
        const topt *o = &k_opts[i];
        if (!(o->tasks & tasks)) continue;
        char head[40], line[600];
        size_t n = 0;
        snprintf(head, sizeof head, "%s %s", o->name, o->arg);
        n += (size_t)snprintf(line + n, sizeof line - n, "%s", o->help);
        if (o->tasks != T_ALL && tasks == T_ALL)
            n += (size_t)snprintf(line + n, sizeof line - n, " (%s)", o->tasks == T_MNIST ? "mnist"
                                  : o->tasks == T_LM ? "char, gpt2" : o->tasks == T_CHAR ? "char" : "gpt2");
        /* the default, per task where they differ */
        char d[3][64];
        int nd = 0;
        unsigned ts[3];
        for (unsigned t = T_MNIST; t <= T_GPT2; t <<= 1)
            if (o->tasks & tasks & t) { ts[nd] = t; default_text(o, t, d[nd], sizeof d[nd]); nd++; }
        bool same = true;
        for (int k = 1; k < nd; k++) same = same && !strcmp(d[k], d[0]);
        if (same && nd) n += (size_t)snprintf(line + n, sizeof line - n, " [default %s]", d[0]);
        else {
            n += (size_t)snprintf(line + n, sizeof line - n, " [default");
            for (int k = 0; k < nd && n < sizeof line; k++)
                n += (size_t)snprintf(line + n, sizeof line - n, "%s %s %s", k ? "," : "", task_name(ts[k]), d[k]);
            if (n < sizeof line) snprintf(line + n, sizeof line - n, "]");
        }
        print_wrapped(f, head, line);
    }
}

static bool is_help(const char *s) { return !strcmp(s, "-h") || !strcmp(s, "--help"); }

/* Parses argv[3..] into a (defaults already set). -1: a message was printed
 * (usage error). */
static int parse_targs(int argc, char **argv, targs *a) {
    const char *prog = a->task == T_MNIST ? "kiln train mnist" : a->task == T_CHAR ? "kiln train char" : "kiln train gpt2";
    for (int i = 3; i < argc; i++) {
        const char *name = argv[i];
        int k = opt_index(name);
        if (k < 0) {
            fprintf(stderr, "%s: unknown option '%s' (kiln train %s --help lists them)\n", prog, name, a->what);
            return -1;
        }
        const topt *o = &k_opts[k];
        if (!(o->tasks & a->task)) {
            fprintf(stderr, "%s: %s does not apply to %s (kiln train %s --help lists its options)\n", prog, name,
                    a->what, a->what);
            return -1;
        }
        if (i + 1 >= argc) { fprintf(stderr, "%s: option %s needs a value (%s)\n", prog, name, o->arg); return -1; }
        const char *v = argv[++i];
        void *p = (char *)a + o->off;
        switch (o->kind) {
        case O_STR:
            if (!*v) { fprintf(stderr, "%s: %s needs a non-empty value (%s)\n", prog, name, o->arg); return -1; }
            *(const char **)p = v;
            break;
        case O_INT: if (!cli_int(prog, name, v, (int64_t)o->lo, (int64_t)o->hi, p)) return -1; break;
        case O_U64: if (!cli_u64(prog, name, v, p)) return -1; break;
        case O_REAL: {
            double x;
            if (!cli_real(prog, name, v, o->lo, o->hi, &x)) return -1;
            if ((o->lo_open && x == o->lo) || (o->hi_open && x == o->hi)) {
                fprintf(stderr, "%s: %s must be %s %g and %s %g, got %s\n", prog, name,
                        o->lo_open ? "greater than" : "at least", o->lo, o->hi_open ? "less than" : "at most", o->hi, v);
                return -1;
            }
            *(double *)p = x;
            break;
        }
        }
        a->set[k] = true;
    }
    return 0;
}

/* Checks between options, before any data is read. */
static int check_targs(targs *a) {
    const char *prog = a->task == T_MNIST ? "kiln train mnist" : a->task == T_CHAR ? "kiln train char" : "kiln train gpt2";
    if (a->task == T_MNIST && strcmp(a->model, "mlp") && strcmp(a->model, "cnn")) {
        fprintf(stderr, "%s: --model must be mlp or cnn, got '%s'\n", prog, a->model);
        return -1;
    }
    if (a->task != T_MNIST) {
        if (a->heads > a->dim || a->dim % a->heads) {
            fprintf(stderr, "%s: --dim %lld must be a multiple of --heads %lld (e.g. --dim %lld)\n", prog,
                    (long long)a->dim, (long long)a->heads,
                    (long long)(a->heads * ((a->dim + a->heads - 1) / a->heads)));
            return -1;
        }
        if (a->warmup > a->steps) {
            fprintf(stderr, "%s: --warmup %lld is longer than --steps %lld\n", prog, (long long)a->warmup,
                    (long long)a->steps);
            return -1;
        }
        if (a->zero && a->gpus < 1) {
            fprintf(stderr, "%s: --zero %lld shards the optimizer state over data-parallel ranks: give --gpus N too\n", prog,
                    (long long)a->zero);
            return -1;
        }
        if (a->batch * a->ctx > ((int64_t)1 << 24)) {
            fprintf(stderr, "%s: --batch %lld x --ctx %lld = %lld tokens per step is too many (at most 16777216)\n",
                    prog, (long long)a->batch, (long long)a->ctx, (long long)(a->batch * a->ctx));
            return -1;
        }
    }
    if (kn_precision_parse(a->precision, &a->prec)) {
        fprintf(stderr, "%s: --precision must be f32, bf16 or f16, got '%s'\n", prog, a->precision);
        return -1;
    }
    if (a->prec != KN_PREC_F32) {              /* can this machine compute in it? before any data is read */
        kn_ctx *probe = kn_ctx_new(NULL);
        kn_status st = probe ? kn_precision_check(probe, a->prec) : KN_ERR_NOMEM;
        kn_ctx_free(probe);
        if (st) { fprintf(stderr, "%s: --precision %s: %s\n", prog, a->precision, kn_last_error()); return -1; }
    }
    if (a->resume && !a->out) a->out = a->resume;   /* a resumed run keeps writing its checkpoint */
    if (a->threads > 0) kn_set_threads((int)a->threads);
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "kiln train: %s\n", what);
    return 1;
}

/* ---- the checkpoint path ------------------------------------------------------------ */

/* --out must be writable before any work is done: checkpoints are written to
 * OUT.tmp and renamed over OUT (so a failed write never destroys the last
 * good checkpoint), so OUT.tmp must be creatable now. */
static int check_out(const targs *a) {
    struct stat sb;
    if (stat(a->out, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kiln train: --out %s is a directory; name a file, e.g. %s/model.safetensors\n", a->out, a->out);
        return 1;
    }
    const char *inputs[] = {a->data, a->tokenizer};          /* files the run reads */
    for (int i = 0; i < 2; i++) {
        struct stat si;
        if (inputs[i] && stat(inputs[i], &si) == 0 && stat(a->out, &sb) == 0 && si.st_dev == sb.st_dev &&
            si.st_ino == sb.st_ino) {
            fprintf(stderr, "kiln train: --out %s is the run's input %s; name another file (e.g. model.safetensors)\n",
                    a->out, inputs[i]);
            return 1;
        }
    }
    size_t n = strlen(a->out);
    char *tmp = malloc(n + 5);
    if (!tmp) return fail("out of memory");
    memcpy(tmp, a->out, n);
    memcpy(tmp + n, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    bool created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = open(tmp, O_WRONLY);      /* left by an earlier run: reused */
    if (fd < 0) {
        fprintf(stderr, "kiln train: cannot write the checkpoint --out %s (creating %s: %s); name a file in an "
                "existing, writable directory\n", a->out, tmp, strerror(errno));
        free(tmp);
        return 1;
    }
    close(fd);
    if (created) unlink(tmp);
    free(tmp);
    if (!a->resume && access(a->out, F_OK) == 0)
        fprintf(stderr, "kiln train: note: %s exists and will be replaced by this run's checkpoint\n", a->out);
    return 0;
}

/* Refuses to start when the disk of --out cannot hold one checkpoint: the
 * parameters and AdamW's two moments, 4 bytes each (a lower bound). */
static int check_space(const char *out, int64_t n_params) {
    char dir[PATH_MAX];
    const char *slash = strrchr(out, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == out) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - out), out);
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return 0;                       /* unknown: the save will tell */
    double need = 12.0 * (double)n_params, have = (double)vs.f_bavail * (double)vs.f_frsize;
    if (have >= need) return 0;
    fprintf(stderr, "kiln train: a checkpoint of this model needs about %.1f MB but only %.1f MB are free where "
            "--out %s goes; free some space or pick another --out\n", need / 1e6, have / 1e6, out);
    return 1;
}

/* The command that continues this run: the same options with --resume OUT. */
static void print_resume_cmd(const targs *a, FILE *f) {
    fprintf(f, "kiln train %s", a->what);
    for (int i = 3; i < a->argc; i++) {
        if (!strcmp(a->argv[i], "--resume") && i + 1 < a->argc) { i++; continue; }
        const char *w = a->argv[i];
        bool plain = *w && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./,=:+") == strlen(w);
        if (plain) fprintf(f, " %s", w);
        else {
            fputs(" '", f);
            for (const char *c = w; *c; c++) { if (*c == '\'') fputs("'\\''", f); else fputc(*c, f); }
            fputc('\'', f);
        }
    }
    fprintf(f, " --resume %s", a->out);
}

/* How a run that did not finish ends: a failed step or save (1), or Ctrl-C
 * (130, as a shell reports a process killed by SIGINT). A failed save stops
 * the run: the disk or the path will not take later checkpoints either, so
 * going on would only train steps that cannot be kept; the last good
 * checkpoint is still in place (written to a temporary file and renamed). */
static int run_end(const targs *a, kn_status st, const kn_train_result *res) {
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        if (a->out && st == KN_ERR_IO) {
            fprintf(stderr, "kiln train: saving the checkpoint after step %lld failed: %s; training stopped",
                    (long long)res->next_step, msg);
            if (access(a->out, R_OK) == 0) {
                fprintf(stderr, "; fix the cause, then continue from the last good checkpoint with: ");
                print_resume_cmd(a, stderr);
                fputc('\n', stderr);
            } else {
                fprintf(stderr, "; no checkpoint was saved\n");
            }
            return 1;
        }
        return fail(msg);
    }
    if (!a->out) {
        fprintf(stderr, "kiln train: interrupted after step %lld; nothing was saved (no --out)\n",
                (long long)res->next_step);
        return 130;
    }
    fprintf(stderr, "kiln train: interrupted after step %lld; checkpoint saved to %s; continue with: ",
            (long long)res->next_step, a->out);
    print_resume_cmd(a, stderr);
    fputc('\n', stderr);
    return 130;
}

static const char *assets_dir(void) {
    const char *e = getenv("KN_ASSETS");
    return e && *e ? e : "../shared/assets";
}

/* splitmix64: batch offsets are hash(seed, step, row), a pure function of the step */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static double u01(uint64_t *s) { *s = mix64(*s); return (double)(*s >> 11) * (1.0 / 9007199254740992.0); }

static double cos_lr(const targs *a, int64_t total, int64_t s) {
    return kn_sched_cosine(s, a->lr, a->lr * a->min_lr_frac, a->warmup, total);
}

/* Build loss + optimizer effects into one plan. */
static kn_plan *step_plan(kn_ctx *ctx, kn_tensor *loss, kn_optim *opt) {
    static kn_tensor *outs[KN_NN_MAX_OUTS];
    int n = 0;
    outs[n++] = loss;
    int ne = kn_optim_build(opt, NULL, outs + n, KN_NN_MAX_OUTS - n);
    if (ne < 0) return NULL;
    n += ne;
    return kn_plan_new(ctx, n, outs, NULL);
}

static kn_optim *make_opt(kn_ctx *ctx, kn_module *m, const targs *a) {
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = a->lr;
    oc.weight_decay = a->wd;
    oc.beta1 = a->beta1;
    oc.beta2 = a->beta2;
    oc.clip_norm = a->clip;
    return kn_optim_new_decay_groups(ctx, m, &oc);
}

/* Backward of the step and its optimizer, under --precision: f16 backpropagates
 * loss * scale and gives the optimizer a loss scaler (kn_train_run updates it
 * after every step); the model's policy was set before its forward. */
static kn_status backward_and_opt(kn_ctx *ctx, kn_module *m, kn_tensor *loss, const targs *a, kn_optim **opt,
                                  kn_loss_scaler **sc) {
    *opt = NULL; *sc = NULL;
    if (a->prec == KN_PREC_F16 && !(*sc = kn_loss_scaler_new(ctx, NULL))) return KN_ERR_INVALID;
    kn_status st = kn_backward(ctx, *sc ? kn_loss_scaler_scale(*sc, loss) : loss);
    if (st) return st;
    if (!(*opt = make_opt(ctx, m, a))) return KN_ERR_INVALID;
    return *sc ? kn_optim_set_loss_scaler(*opt, *sc) : KN_OK;
}

static void report_skipped(const kn_train_result *res, const kn_optim *opt) {
    const kn_loss_scaler *sc = kn_optim_loss_scaler(opt);
    if (sc && res->skipped_steps)
        fprintf(stderr, "f16: %lld steps skipped on gradient overflow; loss scale now %g\n", (long long)res->skipped_steps,
                kn_loss_scaler_get_scale(sc));
}

static kn_status resume(const targs *a, kn_module *m, kn_optim *o, int n_meta, const char *const *kv, int64_t *start) {
    *start = 0;
    if (!a->resume) return KN_OK;
    kn_status st = kn_train_load(a->resume, m, o, n_meta, kv, start);
    if (!st) fprintf(stderr, "resumed from %s at step %lld\n", a->resume, (long long)*start);
    return st;
}

/* ==== MNIST ========================================================================== */

typedef struct mnist_run {
    const targs *a;
    kn_mnist *train, *test;
    kn_dataset *ds;
    kn_loader *ld;
    int64_t nb, next_e, next_i, total;
    kn_tensor *x, *y;                 /* step inputs [B,...], [B]           */
    kn_tensor *ex, *elogits;          /* eval input [EB,...], logits [EB,10] */
    kn_plan *eval;
    int64_t EB;
    float *xbuf, *lbuf;
    double best_acc, last_acc;
    bool evaluated;
} mnist_run;

static kn_status mnist_batch(void *ud, int64_t s) {
    mnist_run *r = ud;
    int64_t e = s / r->nb, i = s % r->nb;
    kn_status st;
    if ((e != r->next_e || i != r->next_i) && (st = kn_loader_seek(r->ld, e, i))) return st;
    kn_batch b;
    if ((st = kn_loader_next(r->ld, &b))) return st;
    if (b.size == 0 && (st = kn_loader_next(r->ld, &b))) return st;
    if (b.epoch != e || b.index != i)
        return kn_set_error(KN_ERR_STATE, "mnist: loader gave batch %lld of epoch %lld, expected %lld of %lld",
                            (long long)b.index, (long long)b.epoch, (long long)i, (long long)e);
    r->next_e = e; r->next_i = i + 1;
    if (r->next_i == r->nb) { r->next_e = e + 1; r->next_i = 0; }
    if ((st = kn_batch_write(&b, r->ds, 0, r->x))) return st;
    return kn_batch_write(&b, r->ds, 1, r->y);
}

static double mnist_lr(void *ud, int64_t s) { mnist_run *r = ud; return cos_lr(r->a, r->total, s); }

static kn_status mnist_eval(void *ud, int64_t s, double *metric) {
    mnist_run *r = ud;
    int64_t n = r->test->n, px = r->test->rows * r->test->cols, correct = 0;
    double nll = 0;
    for (int64_t b0 = 0; b0 + r->EB <= n; b0 += r->EB) {
        for (int64_t k = 0; k < r->EB * px; k++) r->xbuf[k] = (float)r->test->images[b0 * px + k] / 255.0f;
        kn_status st;
        if ((st = kn_tensor_write(r->ex, r->xbuf, KN_F32)) || (st = kn_plan_run(r->eval))) return st;
        if ((st = kn_tensor_read(r->elogits, r->lbuf, KN_F32))) return st;
        for (int64_t k = 0; k < r->EB; k++) {
            const float *l = r->lbuf + k * 10;
            int best = 0;
            float mx = l[0];
            for (int c = 1; c < 10; c++) if (l[c] > mx) { mx = l[c]; best = c; }
            double se = 0;
            for (int c = 0; c < 10; c++) se += exp((double)l[c] - mx);
            int lab = r->test->labels[b0 + k];
            nll += log(se) - ((double)l[lab] - mx);
            correct += best == lab;
        }
    }
    int64_t seen = n / r->EB * r->EB;
    r->last_acc = 100.0 * (double)correct / (double)seen;
    if (r->last_acc > r->best_acc) r->best_acc = r->last_acc;
    fprintf(stderr, "eval after step %lld (epoch %.2f): test loss %.4f accuracy %.2f%% (%lld/%lld)\n",
            (long long)(s + 1), (double)(s + 1) / (double)r->nb, nll / (double)seen, r->last_acc,
            (long long)correct, (long long)seen);
    *metric = r->last_acc;
    r->evaluated = true;
    return KN_OK;
}

static kn_status mnist_file(const char *dir, const char *base, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s.gz", dir, base);
    if (access(buf, R_OK) == 0) return KN_OK;
    snprintf(buf, cap, "%s/%s", dir, base);
    if (access(buf, R_OK) == 0) return KN_OK;
    return kn_set_error(KN_ERR_IO, "MNIST file %s(.gz) not found in '%s'; pass --data DIR holding "
                        "train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), t10k-*", base, dir);
}

static kn_module *mnist_model(kn_ctx *ctx, bool cnn) {
    kn_module *net = kn_sequential_new(ctx, cnn ? "CNN" : "MLP");
    if (!net) return NULL;
    if (cnn) {
        const int k3[2] = {3, 3}, p1[2] = {1, 1}, k2[2] = {2, 2};
        kn_sequential_add(net, kn_conv2d_new(ctx, 1, 16, k3, NULL, p1, NULL, 1, true));
        kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        kn_sequential_add(net, kn_max_pool2d_new(ctx, k2, k2, NULL));
        kn_sequential_add(net, kn_conv2d_new(ctx, 16, 32, k3, NULL, p1, NULL, 1, true));
        kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        kn_sequential_add(net, kn_max_pool2d_new(ctx, k2, k2, NULL));
        kn_sequential_add(net, kn_flatten_new(ctx, 1, -1));
        kn_sequential_add(net, kn_linear_new(ctx, 32 * 7 * 7, 128, true));
        kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        kn_sequential_add(net, kn_linear_new(ctx, 128, 10, true));
    } else {
        kn_sequential_add(net, kn_linear_new(ctx, 784, 512, true));
        kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        kn_sequential_add(net, kn_linear_new(ctx, 512, 256, true));
        kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        kn_sequential_add(net, kn_linear_new(ctx, 256, 10, true));
    }
    return net;
}

static int train_mnist(targs *a) {
    bool cnn = !strcmp(a->model, "cnn");
    char dirbuf[1024];
    const char *dir = a->data;
    if (!dir) { snprintf(dirbuf, sizeof dirbuf, "%s/datasets/mnist", assets_dir()); dir = dirbuf; }
    char ti[1200], tl[1200], vi[1200], vl[1200];
    mnist_run r = {.a = a, .next_e = -1};
    int rc = 1;
    kn_ctx *ctx = NULL;
    kn_module *net = NULL;
    kn_optim *opt = NULL;
    kn_loss_scaler *sc = NULL;
    kn_plan *step = NULL;
    if (mnist_file(dir, "train-images-idx3-ubyte", ti, sizeof ti) || mnist_file(dir, "train-labels-idx1-ubyte", tl, sizeof tl) ||
        mnist_file(dir, "t10k-images-idx3-ubyte", vi, sizeof vi) || mnist_file(dir, "t10k-labels-idx1-ubyte", vl, sizeof vl) ||
        kn_mnist_load(ti, tl, &r.train) || kn_mnist_load(vi, vl, &r.test)) { fail(kn_last_error()); goto done; }
    if (r.train->rows != 28 || r.train->cols != 28 || r.test->rows != 28 || r.test->cols != 28) {
        fail("MNIST images must be 28x28"); goto done;
    }
    kn_loader_opts lo = kn_loader_defaults();
    lo.batch_size = a->batch; lo.shuffle = true; lo.seed = a->seed; lo.drop_last = true; lo.prefetch = true;
    if (kn_mnist_dataset(r.train, true, &r.ds) || kn_loader_new(r.ds, &lo, &r.ld)) { fail(kn_last_error()); goto done; }
    r.nb = kn_loader_n_batches(r.ld);
    r.total = r.nb * a->epochs;

    ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(a->seed + 1);
    net = mnist_model(ctx, cnn);
    if (net && kn_module_set_precision(net, a->prec)) { fail(kn_last_error()); goto done; }
    int64_t B = a->batch;
    int64_t xs_mlp[2] = {B, 784}, xs_cnn[4] = {B, 1, 28, 28};
    r.x = cnn ? kn_input(ctx, KN_F32, 4, xs_cnn) : kn_input(ctx, KN_F32, 2, xs_mlp);
    r.y = kn_input(ctx, KN_I64, 1, &B);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, r.x), r.y, NULL);
    if (!loss || backward_and_opt(ctx, net, loss, a, &opt, &sc) || !(step = step_plan(ctx, loss, opt))) {
        fail(kn_last_error()); goto done;
    }
    /* eval plan: the same parameters, a fresh forward over [EB, ...] */
    r.EB = 500;
    int64_t es_mlp[2] = {r.EB, 784}, es_cnn[4] = {r.EB, 1, 28, 28};
    kn_module_train(net, false);
    kn_no_grad_begin(ctx);
    r.ex = cnn ? kn_input(ctx, KN_F32, 4, es_cnn) : kn_input(ctx, KN_F32, 2, es_mlp);
    r.elogits = kn_module_forward(net, r.ex);
    kn_no_grad_end(ctx);
    kn_module_train(net, true);
    if (!r.elogits || !(r.eval = kn_plan_new(ctx, 1, &r.elogits, NULL))) { fail(kn_last_error()); goto done; }
    r.xbuf = malloc(sizeof(float) * (size_t)(r.EB * 784));
    r.lbuf = malloc(sizeof(float) * (size_t)(r.EB * 10));
    if (!r.xbuf || !r.lbuf) { fail("out of memory"); goto done; }

    const char *meta[] = {"model", cnn ? "mnist-cnn" : "mnist-mlp"};
    int64_t start;
    if (resume(a, net, opt, 1, meta, &start)) { fail(kn_last_error()); goto done; }
    if (a->out && check_space(a->out, kn_module_n_params(net))) goto done;
    fprintf(stderr, "mnist %s: %lld parameters, %lld train / %lld test images, batch %lld, %lld epochs = %lld steps, "
            "AdamW lr %g (cosine), %d threads, %d kernels per step\n", a->model, (long long)kn_module_n_params(net),
            (long long)r.train->n, (long long)r.test->n, (long long)B, (long long)a->epochs, (long long)r.total, a->lr,
            kn_threads(), kn_plan_n_kernels(step));

    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = step; c.loss = loss; c.opt = opt; c.model = net;
    c.steps = r.total; c.items_per_step = B; c.items_name = "samples"; c.ud = &r;
    c.load_batch = mnist_batch; c.lr_at = mnist_lr; c.eval = mnist_eval;
    c.eval_every = given(a, "--eval-every") ? a->eval_every : r.nb;
    c.ckpt_every = a->ckpt_every; c.ckpt_path = a->out; c.n_meta = 1; c.meta_kv = meta;
    c.log_every = a->log_every;
    kn_train_catch_sigint(true);
    kn_train_result res;
    kn_status rs = kn_train_run(&c, start, &res);
    kn_train_catch_sigint(false);
    if (rs || res.interrupted) { rc = run_end(a, rs, &res); goto done; }
    if (!r.evaluated) {   /* resumed a finished run: still report */
        double acc;
        if (mnist_eval(&r, res.next_step - 1, &acc)) { fail(kn_last_error()); goto done; }
    }
    char db[32];
    report_skipped(&res, opt);
    fprintf(stderr, "done: %lld steps in %s, %.0f samples/s (training only)\n", (long long)(res.next_step - start),
            kn_train_fmt_duration(res.seconds, db, sizeof db), res.items_per_s);
    printf("final test accuracy: %.2f%%\n", r.last_acc);
    rc = 0;
done:
    kn_plan_free(step); kn_plan_free(r.eval);
    kn_optim_free(opt); kn_loss_scaler_free(sc); kn_module_free(net); kn_ctx_free(ctx);
    kn_loader_free(r.ld); kn_dataset_free(r.ds);
    kn_mnist_free(r.train); kn_mnist_free(r.test);
    free(r.xbuf); free(r.lbuf);
    return rc;
}

/* ==== language models (char and GPT-2) ================================================ */

typedef struct lm_run {
    const targs *a;
    const int32_t *train, *val;        /* token ids                                   */
    int64_t n_train, n_val, total, B, T, V;
    kn_tensor *x, *y;                  /* step inputs: ids i32 [B,T], targets i64 [B,T] */
    kn_tensor *rng;                    /* 0-d i64: the step number, dropout's stream offset */
    kn_tensor *ex, *ey, *eloss;        /* eval: same shapes, mean loss                 */
    kn_plan *eval;
    int n_sp;                          /* sample plans, lengths 16, 32, ..., T        */
    int64_t sp_len[16];
    kn_tensor *sp_ids[16], *sp_logits[16];
    kn_plan *sp[16];
    int32_t *ib; int64_t *tb; float *lb;
    /* decoding */
    const kn_char_vocab *cv;
    const kn_tokenizer *tok;
    int32_t bos;                       /* sample start token                          */
    int32_t eot;                       /* stop token (-1 none)                        */
    const int32_t *orig;               /* compact id -> GPT-2 id (NULL: identity; -1 unseen) */
    double last_val, best_val;
    bool evaluated;
} lm_run;

static void window(const int32_t *src, int64_t off, int64_t T, int32_t *x, int64_t *y) {
    for (int64_t t = 0; t < T; t++) { x[t] = src[off + t]; y[t] = src[off + t + 1]; }
}

/* The B windows of step s; with --gpus N, rank k's B of the step's N x B
 * (window k B + b), so N ranks see the windows one process with batch N B
 * sees, and the dropout stream (rng) differs per rank. */
static kn_status lm_batch(void *ud, int64_t s) {
    lm_run *r = ud;
    uint64_t span = (uint64_t)(r->n_train - r->T - 1);
    uint64_t W = (uint64_t)kn_dist_world(r->a->dist), k = (uint64_t)kn_dist_rank(r->a->dist);
    int64_t rs = s * (int64_t)W + (int64_t)k;
    for (int64_t b = 0; b < r->B; b++) {
        uint64_t h = mix64(r->a->seed * 0x100000001b3ull ^ mix64((uint64_t)s * W * (uint64_t)r->B + k * (uint64_t)r->B + (uint64_t)b));
        window(r->train, (int64_t)(h % span), r->T, r->ib + b * r->T, r->tb + b * r->T);
    }
    kn_status st = kn_tensor_write(r->x, r->ib, KN_I32);
    if (!st && r->rng) st = kn_tensor_write(r->rng, &rs, KN_I64);
    return st ? st : kn_tensor_write(r->y, r->tb, KN_I64);
}

static double lm_lr(void *ud, int64_t s) { lm_run *r = ud; return cos_lr(r->a, r->total, s); }

/* Mean loss over eval_batches batches of windows at evenly spaced offsets of
 * the validation tokens: the same windows every time. */
static kn_status lm_eval(void *ud, int64_t s, double *metric) {
    lm_run *r = ud;
    int64_t nw = r->a->eval_batches * r->B;
    int64_t span = r->n_val - r->T - 1;
    double sum = 0;
    for (int64_t k = 0; k < r->a->eval_batches; k++) {
        for (int64_t b = 0; b < r->B; b++) {
            int64_t w = k * r->B + b;
            window(r->val, nw > 1 ? span * w / (nw - 1) : 0, r->T, r->ib + b * r->T, r->tb + b * r->T);
        }
        kn_status st;
        if ((st = kn_tensor_write(r->ex, r->ib, KN_I32)) || (st = kn_tensor_write(r->ey, r->tb, KN_I64)) ||
            (st = kn_plan_run(r->eval)))
            return st;
        sum += kn_item(r->eloss);
    }
    r->last_val = sum / (double)r->a->eval_batches;
    if (r->last_val < r->best_val) r->best_val = r->last_val;
    fprintf(stderr, "eval after step %lld: val loss %.4f (%lld windows of %lld)\n", (long long)(s + 1), r->last_val,
            (long long)nw, (long long)r->T);
    *metric = r->last_val;
    r->evaluated = true;
    return KN_OK;
}

static void emit(const lm_run *r, int32_t id) {
    if (r->cv) {
        char buf[8]; size_t len;
        if (kn_char_decode(r->cv, &id, 1, buf, sizeof buf, &len) == KN_OK) fwrite(buf, 1, len, stdout);
    } else if (r->orig && r->orig[id] < 0) {
        printf("<unk>");
    } else if (r->tok) {
        size_t len;
        const char *p = kn_token_to_piece(r->tok, r->orig ? r->orig[id] : id, false, &len);
        if (p) fwrite(p, 1, len, stdout);
    } else {
        printf("%d ", id);
    }
}

/* Autoregressive sample: the context (last T tokens at most) goes into the
 * smallest sample plan that holds it; the next token is drawn from the
 * softmax(logits / temp) of the last position. */
static kn_status lm_sample(void *ud, int64_t s) {
    lm_run *r = ud;
    int64_t n_gen = r->a->sample_len;
    int32_t *seq = malloc(sizeof *seq * (size_t)(n_gen + 1));
    double *p = malloc(sizeof *p * (size_t)r->V);
    if (!seq || !p) { free(seq); free(p); return kn_set_error(KN_ERR_NOMEM, "sample: out of memory"); }
    uint64_t rng = mix64(r->a->seed + 0x5eed + (uint64_t)s);
    int64_t n = 0;
    seq[n++] = r->bos;
    printf("---- sample after step %lld ----\n", (long long)(s + 1));
    if (r->cv) emit(r, r->bos);
    kn_status st = KN_OK;
    for (int64_t g = 0; g < n_gen; g++) {
        int64_t len = n < r->T ? n : r->T, from = n - len;
        int k = 0;
        while (r->sp_len[k] < len) k++;
        int64_t L = r->sp_len[k];
        for (int64_t t = 0; t < L; t++) r->ib[t] = t < len ? seq[from + t] : 0;
        if ((st = kn_tensor_write(r->sp_ids[k], r->ib, KN_I32)) || (st = kn_plan_run(r->sp[k])) ||
            (st = kn_tensor_read(r->sp_logits[k], r->lb, KN_F32)))
            break;
        const float *l = r->lb + (len - 1) * r->V;
        double mx = -INFINITY, se = 0;
        for (int64_t v = 0; v < r->V; v++) if (l[v] > mx) mx = l[v];
        double temp = r->a->temp > 0 ? r->a->temp : 1.0;
        for (int64_t v = 0; v < r->V; v++) se += (p[v] = exp(((double)l[v] - mx) / temp));
        double u = u01(&rng) * se, acc = 0;
        int32_t id = (int32_t)(r->V - 1);
        for (int64_t v = 0; v < r->V; v++) { acc += p[v]; if (u < acc) { id = (int32_t)v; break; } }
        if (id == r->eot) break;
        emit(r, id);
        fflush(stdout);
        seq[n++] = id;
    }
    printf("\n----\n");
    fflush(stdout);
    free(seq); free(p);
    return st;
}

typedef struct lm_data {
    int32_t *ids; int64_t n; int64_t V;
    int32_t *orig;                     /* compact vocabulary: id -> GPT-2 id           */
    kn_char_vocab *cv; kn_tokenizer *tok; int32_t bos, eot;
    char meta_vocab[32];
    char tok_path[PATH_MAX];           /* gpt2: the GPT-2 vocabulary file (absolute), or "" */
} lm_data;

/* Comma-separated decimal list: a char model's code points (id order), or
 * a compact gpt2 model's GPT-2 ids (all but the last, unseen-ids, id). */
static char *lm_vocab_meta(const lm_data *d, bool gpt2) {
    int64_t n = gpt2 ? (d->orig ? d->V - 1 : 0) : d->V;
    size_t cap = (size_t)n * 12 + 1, o = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        unsigned long v = gpt2 ? (unsigned long)d->orig[i] : (unsigned long)kn_char_vocab_char(d->cv, (int32_t)i);
        o += (size_t)snprintf(s + o, cap - o, i ? ",%lu" : "%lu", v);
    }
    return s;
}

static int train_lm(targs *a, lm_data *d, const char *kind) {
    bool gpt2 = !strcmp(kind, "gpt2");
    lm_run r = {.a = a, .V = d->V, .cv = d->cv, .tok = d->tok, .bos = d->bos, .eot = d->eot, .orig = d->orig,
                .best_val = INFINITY};
    r.B = a->batch; r.T = a->ctx; r.total = a->steps;
    int64_t n_val = (int64_t)((double)d->n * a->val_frac);
    r.n_train = d->n - n_val; r.n_val = n_val;
    r.train = d->ids; r.val = d->ids + r.n_train;
    if (r.n_train < r.T + 2 || r.n_val < r.T + 2) {
        fprintf(stderr, "kiln train: %lld tokens are too few for context %lld with a %.0f%% validation split\n",
                (long long)d->n, (long long)r.T, 100 * a->val_frac);
        return 1;
    }
    int rc = 1;
    char *vocab_meta = NULL;
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(a->seed + 1);
    kn_gpt2_cfg gc = {.vocab = r.V, .max_seq = r.T, .dim = a->dim, .n_layers = (int)a->layers, .n_heads = (int)a->heads,
                      .dropout = a->dropout, .attn_dropout = a->attn_dropout};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    kn_optim *opt = NULL;
    kn_loss_scaler *sc = NULL;
    kn_plan *step = NULL;
    if (m && kn_module_set_precision(m, a->prec)) { fail(kn_last_error()); goto done; }
    if (m && (a->dropout > 0 || a->attn_dropout > 0)) {   /* a new mask every step, a function of the step */
        r.rng = kn_input(ctx, KN_I64, 0, NULL);
        if (!r.rng || kn_module_set_rng_step(m, r.rng)) { fail(kn_last_error()); goto done; }
    }
    int64_t sb[2] = {r.B, r.T};
    r.x = kn_input(ctx, KN_I32, 2, sb);
    r.y = kn_input(ctx, KN_I64, 2, sb);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_gpt2_forward(m, r.x), r.y, NULL);
    if (!m || !loss || backward_and_opt(ctx, m, loss, a, &opt, &sc) || (a->dist && kn_optim_set_dist(opt, a->dist, 0)) ||
        (a->dist && a->zero && kn_optim_set_zero1(opt, true)) || !(step = step_plan(ctx, loss, opt))) {
        fail(kn_last_error()); goto done;
    }
    /* eval and sample plans: fresh forwards over the same parameters */
    kn_module_train(m, false);
    kn_no_grad_begin(ctx);
    r.ex = kn_input(ctx, KN_I32, 2, sb);
    r.ey = kn_input(ctx, KN_I64, 2, sb);
    r.eloss = kn_cross_entropy(ctx, kn_gpt2_forward(m, r.ex), r.ey, NULL);
    if (r.eloss) r.eval = kn_plan_new(ctx, 1, &r.eloss, NULL);
    for (int64_t L = 16;; L *= 2) {
        if (L > r.T) L = r.T;
        int k = r.n_sp;
        r.sp_len[k] = L;
        int64_t s1[2] = {1, L};
        r.sp_ids[k] = kn_input(ctx, KN_I32, 2, s1);
        r.sp_logits[k] = kn_gpt2_forward(m, r.sp_ids[k]);
        if (!r.sp_logits[k] || !(r.sp[k] = kn_plan_new(ctx, 1, &r.sp_logits[k], NULL))) break;
        r.n_sp++;
        if (L == r.T || r.n_sp == 16) break;
    }
    kn_no_grad_end(ctx);
    kn_module_train(m, true);
    if (!r.eval || r.sp_len[r.n_sp > 0 ? r.n_sp - 1 : 0] != r.T) { fail(kn_last_error()); goto done; }
    r.ib = malloc(sizeof *r.ib * (size_t)(r.B * r.T));
    r.tb = malloc(sizeof *r.tb * (size_t)(r.B * r.T));
    r.lb = malloc(sizeof *r.lb * (size_t)(r.T * r.V));
    if (!r.ib || !r.tb || !r.lb) { fail("out of memory"); goto done; }

    char sv[32], sl[32], sd[32], sh[32], st_[32];
    snprintf(sv, sizeof sv, "%lld", (long long)r.V); snprintf(sl, sizeof sl, "%lld", (long long)a->layers);
    snprintf(sd, sizeof sd, "%lld", (long long)a->dim); snprintf(sh, sizeof sh, "%lld", (long long)a->heads);
    snprintf(st_, sizeof st_, "%lld", (long long)r.T);
    /* The first 7 pairs identify the run (a resume must match them); the
     * rest let `kiln generate` and `kiln export` rebuild the vocabulary:
     * the characters, or the GPT-2 ids of a compact vocabulary and the
     * GPT-2 vocabulary file (model_ckpt.h). */
    vocab_meta = lm_vocab_meta(d, gpt2);
    if (!vocab_meta) { fail("out of memory"); goto done; }
    const char *meta[] = {"model", gpt2 ? "gpt2" : "char-gpt", "vocab", sv, "layers", sl, "dim", sd, "heads", sh,
                          "ctx", st_, "vocab_chars", d->meta_vocab,
                          gpt2 ? "gpt2_ids" : "char_codepoints", vocab_meta, "tokenizer", d->tok_path};
    int n_meta = 7;
    int n_saved = 7 + (gpt2 ? (d->orig != NULL) + (d->tok_path[0] != 0) : 1);
    if (gpt2 && !d->orig) { meta[14] = "tokenizer"; meta[15] = d->tok_path; }   /* full vocabulary: no id list */
    int64_t start;
    if (resume(a, m, opt, n_meta, meta, &start)) { fail(kn_last_error()); goto done; }
    if (a->out && check_space(a->out, kn_module_n_params(m))) goto done;
    bool lead = kn_dist_rank(a->dist) == 0;
    if (a->dist) {          /* every rank must build the same run */
        char what[512];
        snprintf(what, sizeof what, "%s L%lld C%lld H%lld T%lld V%lld B%lld steps %lld lr %g seed %llu precision %s zero %lld",
                 kind, (long long)a->layers, (long long)a->dim, (long long)a->heads, (long long)r.T, (long long)r.V,
                 (long long)r.B, (long long)r.total, a->lr, (unsigned long long)a->seed, a->precision, (long long)a->zero);
        if (kn_dist_check_same(a->dist, "the run", what)) { fail(kn_last_error()); goto done; }
        if (lead)
            fprintf(stderr, "data parallel: %d ranks x batch %lld = %lld windows a step%s\n", kn_dist_world(a->dist),
                    (long long)r.B, (long long)r.B * kn_dist_world(a->dist),
                    a->zero ? "; ZeRO-1: each rank keeps its share of the optimizer state" : "");
    }
    if (lead) fprintf(stderr, "%s: GPT-2 architecture, %d layers, dim %lld, %lld heads, ctx %lld, vocab %lld: %lld parameters; "
            "%lld train / %lld val tokens; batch %lld x %lld, %lld steps, AdamW lr %g (cosine, warmup %lld), "
            "%d threads, %d kernels per step, %.0f MiB of activations and temporaries a step\n", kind, (int)a->layers,
            (long long)a->dim, (long long)a->heads, (long long)r.T, (long long)r.V, (long long)kn_module_n_params(m),
            (long long)r.n_train, (long long)r.n_val, (long long)r.B, (long long)r.T, (long long)r.total, a->lr,
            (long long)a->warmup, kn_threads(), kn_plan_n_kernels(step), (double)kn_plan_peak_bytes(step) / (1 << 20));

    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = step; c.loss = loss; c.opt = opt; c.model = m;
    c.steps = r.total; c.items_per_step = r.B * r.T * kn_dist_world(a->dist); c.items_name = "tok"; c.ud = &r;
    c.dist = a->dist;
    c.load_batch = lm_batch; c.lr_at = lm_lr; c.eval = lm_eval; c.sample = lm_sample;
    c.eval_every = a->eval_every; c.sample_every = a->sample_every;
    c.ckpt_every = a->ckpt_every; c.ckpt_path = a->out; c.n_meta = n_saved; c.meta_kv = meta;
    c.log_every = a->log_every;
    kn_train_catch_sigint(true);
    kn_train_result res;
    kn_status rs = kn_train_run(&c, start, &res);
    kn_train_catch_sigint(false);
    if (rs || res.interrupted) { rc = run_end(a, rs, &res); goto done; }
    char db[32];
    if (!lead) { rc = 0; goto done; }
    if (!r.evaluated) {   /* resumed a finished run: still report */
        double v;
        if (lm_eval(&r, res.next_step - 1, &v)) { fail(kn_last_error()); goto done; }
    }
    report_skipped(&res, opt);
    fprintf(stderr, "done: %lld steps in %s, %.0f tok/s (training only)\n", (long long)(res.next_step - start),
            kn_train_fmt_duration(res.seconds, db, sizeof db), res.items_per_s);
    printf("final: train loss %.4f, val loss %.4f (best %.4f) nats/%s\n", res.last_loss, r.last_val, r.best_val,
           gpt2 ? "token" : "char");
    if (a->out) fprintf(stderr, "sample from it: kiln generate -m %s -p TEXT\n", a->out);
    rc = 0;
done:
    free(vocab_meta);
    for (int k = 0; k < r.n_sp; k++) kn_plan_free(r.sp[k]);
    kn_plan_free(r.eval); kn_plan_free(step);
    kn_optim_free(opt); kn_loss_scaler_free(sc); kn_module_free(m); kn_ctx_free(ctx);
    free(r.ib); free(r.tb); free(r.lb);
    return rc;
}

static int train_char(targs *a) {
    if (!a->data) { fprintf(stderr, "kiln train char: --data FILE is required (e.g. %s/datasets/tinyshakespeare/input.txt)\n", assets_dir()); return 2; }
    char *text = NULL;
    size_t len = 0;
    lm_data d = {.eot = -1};
    int rc = 1;
    if (kn_text_read(a->data, &text, &len) || kn_char_vocab_build(text, len, false, &d.cv)) { fail(kn_last_error()); goto done; }
    d.ids = malloc(sizeof *d.ids * (len + 1));
    if (!d.ids) { fail("out of memory"); goto done; }
    if (kn_char_encode(d.cv, text, len, d.ids, &d.n)) { fail(kn_last_error()); goto done; }
    d.V = kn_char_vocab_size(d.cv);
    /* the vocabulary itself (as hex of the sorted characters' hash) guards a resume on other text */
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < d.V; i++) h = (h ^ kn_char_vocab_char(d.cv, i)) * 1099511628211ull;
    snprintf(d.meta_vocab, sizeof d.meta_vocab, "%016llx", (unsigned long long)h);
    d.bos = d.ids[0];
    for (int32_t i = 0; i < d.V; i++) if (kn_char_vocab_char(d.cv, i) == '\n') d.bos = i;
    fprintf(stderr, "char: %s: %lld characters, vocabulary %lld\n", a->data, (long long)d.n, (long long)d.V);
    rc = train_lm(a, &d, "char");
done:
    free(text); free(d.ids); kn_char_vocab_free(d.cv);
    return rc;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static kn_tokenizer *gpt2_tokenizer(const targs *a, bool required, char *used, size_t cap) {
    char buf[1024];
    const char *p = a->tokenizer;
    if (!p) { snprintf(buf, sizeof buf, "%s/gguf/ggml-vocab-gpt-2.gguf", assets_dir()); p = buf; }
    kn_tokenizer *tok = NULL;
    if (kn_tokenizer_load_gguf(p, &tok)) {
        if (required) fprintf(stderr, "kiln train: GPT-2 tokenizer '%s': %s (pass --tokenizer FILE.gguf)\n", p, kn_last_error());
        else fprintf(stderr, "kiln train: no GPT-2 tokenizer at '%s' (%s): samples are printed as token ids\n", p, kn_last_error());
        tok = NULL;
    }
    char abs[PATH_MAX];                     /* recorded in the checkpoint: an absolute path */
    if (tok && realpath(p, abs) && strlen(abs) < cap) snprintf(used, cap, "%s", abs);
    return tok;
}

static int train_gpt2(targs *a) {
    if (!a->data) {
        fprintf(stderr, "kiln train gpt2: --data SHARD[,SHARD...] or TEXT.txt is required (e.g. "
                "%s/datasets/tinystories/TinyStories-train.first2MiB.txt)\n", assets_dir());
        return 2;
    }
    lm_data d = {.V = 50257, .bos = 50256, .eot = 50256};
    int rc = 1;
    char *list = NULL;
    bool txt = ends_with(a->data, ".txt");
    d.tok = gpt2_tokenizer(a, txt, d.tok_path, sizeof d.tok_path);
    if (txt && !d.tok) goto done;
    if (txt) {
        char prefix[1024];
        if (a->shards) snprintf(prefix, sizeof prefix, "%s", a->shards);
        else {
            const char *b = strrchr(a->data, '/');
            b = b ? b + 1 : a->data;
            snprintf(prefix, sizeof prefix, "/tmp/kiln_%.*s_gpt2", (int)(strlen(b) - 4), b);
        }
        int ns = 0;
        int64_t nt = 0;
        /* --gpus: one rank a machine writes the shards (ranks share /tmp), the others wait for it */
        if (kn_dist_local_rank(a->dist) == 0) {
            fprintf(stderr, "tokenizing %s (GPT-2 BPE, documents split at <|endoftext|>) ...\n", a->data);
            if (kn_tokenize_file_to_shards(d.tok, a->data, "<|endoftext|>", 50256, prefix, (int64_t)1 << 30, &ns, &nt)) {
                fail(kn_last_error()); goto done;
            }
            fprintf(stderr, "wrote %d shard(s) %s_000000.bin ...: %lld tokens\n", ns, prefix, (long long)nt);
        }
        if (a->dist && (kn_dist_barrier(a->dist) || kn_dist_broadcast_host(a->dist, &ns, sizeof ns, 0))) {
            fail(kn_last_error()); goto done;
        }
        size_t cap = strlen(prefix) * (size_t)ns + 32 * (size_t)ns + 1;
        list = calloc(1, cap);
        if (!list) { fail("out of memory"); goto done; }
        for (int i = 0; i < ns; i++)
            snprintf(list + strlen(list), cap - strlen(list), "%s%s_%06d.bin", i ? "," : "", prefix, i);
    } else {
        list = strdup(a->data);
        if (!list) { fail("out of memory"); goto done; }
    }
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        uint16_t *t;
        int64_t n;
        if (kn_shard_read(f, &t, &n)) { fail(kn_last_error()); goto done; }
        int32_t *nid = realloc(d.ids, sizeof *nid * (size_t)(d.n + n));
        if (!nid) { free(t); fail("out of memory"); goto done; }
        d.ids = nid;
        for (int64_t i = 0; i < n; i++) {
            if (t[i] >= d.V) {
                fprintf(stderr, "kiln train: %s: token %d at %lld is outside the GPT-2 vocabulary (50257)\n", f, t[i], (long long)i);
                free(t); goto done;
            }
            d.ids[d.n + i] = t[i];
        }
        d.n += n;
        free(t);
    }
    /* unigram entropy of the training tokens: the loss of a model that ignores context */
    {
        int64_t n_train = d.n - (int64_t)((double)d.n * a->val_frac);
        int64_t *cnt = calloc((size_t)d.V, sizeof *cnt);
        if (!cnt) { fail("out of memory"); goto done; }
        for (int64_t i = 0; i < n_train; i++) cnt[d.ids[i]]++;
        double H = 0;
        int64_t distinct = 0;
        for (int64_t v = 0; v < d.V; v++)
            if (cnt[v]) { double p = (double)cnt[v] / (double)n_train; H -= p * log(p); distinct++; }
        free(cnt);
        fprintf(stderr, "gpt2: %lld tokens (%lld distinct in the training part); unigram entropy %.4f nats/token "
                "(log V = %.4f)\n", (long long)d.n, (long long)distinct, H, log((double)d.V));
        printf("unigram entropy of the training tokens: %.4f nats/token\n", H);
    }
    snprintf(d.meta_vocab, sizeof d.meta_vocab, "gpt2");
    if (a->full_vocab == 0) {
        /* Compact vocabulary: the GPT-2 ids that occur in the training part, in
         * increasing order, then one id for every other token. Same tokens and
         * the same loss definition; only the softmax is smaller. */
        int64_t n_train = d.n - (int64_t)((double)d.n * a->val_frac);
        int32_t *map = malloc(sizeof *map * 65536);
        d.orig = malloc(sizeof *d.orig * 65537);
        if (!map || !d.orig) { free(map); fail("out of memory"); goto done; }
        for (int i = 0; i < 65536; i++) map[i] = -1;
        for (int64_t i = 0; i < n_train; i++) map[d.ids[i]] = 0;
        int32_t nv = 0;
        for (int i = 0; i < 65536; i++) if (map[i] == 0) { d.orig[nv] = i; map[i] = nv++; }
        d.orig[nv] = -1;
        int64_t unseen = 0;
        for (int64_t i = 0; i < d.n; i++) { int32_t m = map[d.ids[i]]; unseen += m < 0; d.ids[i] = m < 0 ? nv : m; }
        d.bos = d.eot = map[50256] >= 0 ? map[50256] : nv;
        d.V = nv + 1;
        free(map);
        uint64_t h = 1469598103934665603ull;
        for (int32_t i = 0; i < nv; i++) h = (h ^ (uint64_t)d.orig[i]) * 1099511628211ull;
        snprintf(d.meta_vocab, sizeof d.meta_vocab, "%016llx", (unsigned long long)h);
        fprintf(stderr, "gpt2: compact vocabulary of the %d GPT-2 ids seen in training + 1 for unseen ids "
                "(%lld validation tokens unseen); --full-vocab 1 keeps all 50257\n", nv, (long long)unseen);
    }
    rc = train_lm(a, &d, "gpt2");
done:
    free(list); free(d.ids); free(d.orig); kn_tokenizer_free(d.tok);
    return rc;
}

int kn_cli_train(int argc, char **argv) {
    if (argc < 3) { train_usage(stderr, T_ALL); return 2; }
    if (is_help(argv[2])) { train_usage(stdout, T_ALL); return 0; }
    unsigned task = !strcmp(argv[2], "mnist") ? T_MNIST : !strcmp(argv[2], "char") ? T_CHAR
                  : !strcmp(argv[2], "gpt2") ? T_GPT2 : 0;
    if (!task) {
        fprintf(stderr, "kiln train: unknown task '%s'; use mnist, char or gpt2 (kiln train --help)\n", argv[2]);
        return 2;
    }
    for (int i = 3; i < argc; i++)          /* help anywhere (not as an option's value) */
        if (is_help(argv[i])) { train_usage(stdout, task); return 0; }
        else if (opt_index(argv[i]) >= 0) i++;
    targs a = {.what = argv[2], .task = task, .argv = argv, .argc = argc};
    if (parse_targs(argc, argv, &a)) return 2;
    fill_defaults(&a);
    derive_defaults(&a);
    if (check_targs(&a)) return 2;
    if (a.out && check_out(&a)) return 1;
    /* Ctrl-C from here on stops after the current (or first) step with the
     * checkpoint saved: building the step plan can take seconds (generated
     * kernels are compiled on a cold cache), and a shell starts a background
     * job with SIGINT ignored until a handler is installed */
    if (a.gpus > 0) {
        const char *ws = getenv("WORLD_SIZE");
        if (a.gpus > 1 && !ws) return kn_cli_launch_self((int)a.gpus, "127.0.0.1", 0, argc, argv);   /* becomes the launcher */
        if (kn_dist_init_env(&a.dist)) return fail(kn_last_error());
        if (kn_dist_world(a.dist) != a.gpus) {
            fprintf(stderr, "kiln train: --gpus %lld but WORLD_SIZE is %d; give the launcher's rank count\n", (long long)a.gpus,
                    kn_dist_world(a.dist));
            kn_dist_free(a.dist);
            return 2;
        }
    }
    kn_train_catch_sigint(true);
    int rc = task == T_MNIST ? train_mnist(&a) : task == T_CHAR ? train_char(&a) : train_gpt2(&a);
    kn_train_catch_sigint(false);
    kn_dist_free(a.dist);
    return rc;
}
