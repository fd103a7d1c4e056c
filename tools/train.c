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
 * Dimension letters: B batch, T context, C width, V vocabulary.
 * Exit status: 0 ok, 1 error (missing data, bad files, mismatched
 * checkpoint, divergence), 2 usage.
 * `--dropout P` (LMs) drops attention outputs and embeddings with a mask
 * drawn from the step number, so resumed runs still repeat bit for bit.
 * Non-goals: multi-GPU, mixed precision.
 */
#include "kiln.h"
#include "kiln_ckpt.h"
#include "kiln_data.h"
#include "kiln_nn.h"
#include "kiln_tokenizer.h"
#include "kiln_train.h"
#include "backends/cpu/threadpool.h"   /* defines: kn_pool_set_threads, kn_pool_nthreads */
#include "llm/gguf.h"                  /* defines: kn_gguf_open, kn_gguf_free */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kn_cli_train(int argc, char **argv);

/* ---- options -------------------------------------------------------------------- */

typedef struct targs {
    const char *what, *model, *data, *out, *resume, *tokenizer, *shards;
    int64_t epochs, batch, steps, layers, dim, heads, ctx, eval_every, ckpt_every, sample_every, sample_len,
        eval_batches, warmup, log_every, threads;
    double lr, min_lr_frac, wd, val_frac, temp, clip, full_vocab, dropout;
    uint64_t seed;
} targs;

static void train_usage(void) {
    fprintf(stderr,
            "usage: kiln train mnist|char|gpt2 [options]\n"
            "  mnist --model mlp|cnn   MNIST classifier (data: DIR with the idx files, default\n"
            "                          $KN_ASSETS/datasets/mnist or ../shared/assets/datasets/mnist)\n"
            "  char  --data FILE       character-level GPT on a text file (90/10 train/val split)\n"
            "  gpt2  --data SHARDS|TXT GPT-2 on llm.c token shards (comma separated), or a .txt that is\n"
            "                          tokenized first (GPT-2 BPE from gguf/ggml-vocab-gpt-2.gguf)\n"
            "options:\n"
            "  --epochs N (mnist)  --steps N (LMs)  --batch B  --lr LR  --wd W  --warmup N  --clip NORM\n"
            "  --layers L --dim C --heads H --ctx T     transformer shape\n"
            "  --dropout P         LMs: dropout on embeddings and attention outputs while training (default 0)\n"
            "  --out CKPT          checkpoint written every --ckpt-every steps, at the end and on Ctrl-C\n"
            "  --resume CKPT       continue a run (same options) from its checkpoint (and keep writing it\n"
            "                      unless --out names another file)\n"
            "  --eval-every N --eval-batches N --sample-every N --sample-len N --temp T --seed S\n"
            "  --tokenizer FILE (gpt2: GGUF with the GPT-2 vocab)  --shards PREFIX (where a .txt is tokenized to)\n"
            "  --full-vocab 1      gpt2: keep all 50257 GPT-2 ids (default: only the ids of the training\n"
            "                      tokens, renumbered, + one for unseen ones: same tokens, smaller softmax)\n"
            "  --log-every N  -t N (threads)\n");
}

static int parse_targs(int argc, char **argv, targs *a) {
    for (int i = 3; i < argc; i++) {
        const char *o = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "kiln train: option %s needs a value\n", o); return -1; }
        const char *v = argv[++i];
        const char **sp = !strcmp(o, "--model") ? &a->model : !strcmp(o, "--data") ? &a->data
                        : !strcmp(o, "--out") ? &a->out : !strcmp(o, "--resume") ? &a->resume
                        : !strcmp(o, "--tokenizer") ? &a->tokenizer : !strcmp(o, "--shards") ? &a->shards : NULL;
        if (sp) { *sp = v; continue; }
        char *end;
        double x = strtod(v, &end);
        if (*end || end == v) { fprintf(stderr, "kiln train: %s expects a number, got '%s'\n", o, v); return -1; }
        int64_t ix = (int64_t)x;
        if (!strcmp(o, "--epochs")) a->epochs = ix;
        else if (!strcmp(o, "--batch")) a->batch = ix;
        else if (!strcmp(o, "--steps")) a->steps = ix;
        else if (!strcmp(o, "--layers")) a->layers = ix;
        else if (!strcmp(o, "--dim")) a->dim = ix;
        else if (!strcmp(o, "--heads")) a->heads = ix;
        else if (!strcmp(o, "--ctx")) a->ctx = ix;
        else if (!strcmp(o, "--eval-every")) a->eval_every = ix;
        else if (!strcmp(o, "--eval-batches")) a->eval_batches = ix;
        else if (!strcmp(o, "--ckpt-every")) a->ckpt_every = ix;
        else if (!strcmp(o, "--sample-every")) a->sample_every = ix;
        else if (!strcmp(o, "--sample-len")) a->sample_len = ix;
        else if (!strcmp(o, "--warmup")) a->warmup = ix;
        else if (!strcmp(o, "--log-every")) a->log_every = ix;
        else if (!strcmp(o, "-t")) a->threads = ix;
        else if (!strcmp(o, "--lr")) a->lr = x;
        else if (!strcmp(o, "--wd")) a->wd = x;
        else if (!strcmp(o, "--clip")) a->clip = x;
        else if (!strcmp(o, "--temp")) a->temp = x;
        else if (!strcmp(o, "--val-frac")) a->val_frac = x;
        else if (!strcmp(o, "--full-vocab")) a->full_vocab = x;
        else if (!strcmp(o, "--dropout")) {
            if (!(x < 1)) { fprintf(stderr, "kiln train: --dropout must be in [0, 1), got %s\n", v); return -1; }
            a->dropout = x;
        }
        else if (!strcmp(o, "--seed")) a->seed = (uint64_t)x;
        else { fprintf(stderr, "kiln train: unknown option %s\n", o); return -1; }
        if (x < 0) { fprintf(stderr, "kiln train: %s must not be negative\n", o); return -1; }
    }
    if (a->threads > 0) kn_pool_set_threads((int)a->threads);
    if (a->resume && !a->out) a->out = a->resume;   /* a resumed run keeps writing its checkpoint */
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "kiln train: %s\n", what);
    return 1;
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
    oc.clip_norm = a->clip;
    return kn_optim_new_decay_groups(ctx, m, &oc);
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
    if (!a->model) a->model = "mlp";
    bool cnn = !strcmp(a->model, "cnn");
    if (!cnn && strcmp(a->model, "mlp")) { fprintf(stderr, "kiln train mnist: --model mlp|cnn, got '%s'\n", a->model); return 2; }
    if (!a->epochs) a->epochs = cnn ? 3 : 8;
    if (!a->batch) a->batch = cnn ? 64 : 128;
    if (a->lr == 0) a->lr = cnn ? 2e-3 : 1e-3;
    if (!a->warmup) a->warmup = 100;
    char dirbuf[1024];
    const char *dir = a->data;
    if (!dir) { snprintf(dirbuf, sizeof dirbuf, "%s/datasets/mnist", assets_dir()); dir = dirbuf; }
    char ti[1200], tl[1200], vi[1200], vl[1200];
    mnist_run r = {.a = a, .next_e = -1};
    int rc = 1;
    kn_ctx *ctx = NULL;
    kn_module *net = NULL;
    kn_optim *opt = NULL;
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
    int64_t B = a->batch;
    int64_t xs_mlp[2] = {B, 784}, xs_cnn[4] = {B, 1, 28, 28};
    r.x = cnn ? kn_input(ctx, KN_F32, 4, xs_cnn) : kn_input(ctx, KN_F32, 2, xs_mlp);
    r.y = kn_input(ctx, KN_I64, 1, &B);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, r.x), r.y, NULL);
    if (!loss || kn_backward(ctx, loss) || !(opt = make_opt(ctx, net, a)) || !(step = step_plan(ctx, loss, opt))) {
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
    fprintf(stderr, "mnist %s: %lld parameters, %lld train / %lld test images, batch %lld, %lld epochs = %lld steps, "
            "AdamW lr %g (cosine), %d threads, %d kernels per step\n", a->model, (long long)kn_module_n_params(net),
            (long long)r.train->n, (long long)r.test->n, (long long)B, (long long)a->epochs, (long long)r.total, a->lr,
            kn_pool_nthreads(), kn_plan_n_kernels(step));

    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = step; c.loss = loss; c.opt = opt; c.model = net;
    c.steps = r.total; c.items_per_step = B; c.items_name = "samples"; c.ud = &r;
    c.load_batch = mnist_batch; c.lr_at = mnist_lr; c.eval = mnist_eval;
    c.eval_every = a->eval_every ? a->eval_every : r.nb;
    c.ckpt_every = a->ckpt_every; c.ckpt_path = a->out; c.n_meta = 1; c.meta_kv = meta;
    c.log_every = a->log_every ? a->log_every : 50;
    kn_train_catch_sigint(true);
    kn_train_result res;
    if (kn_train_run(&c, start, &res)) { fail(kn_last_error()); goto done; }
    kn_train_catch_sigint(false);
    if (!r.evaluated && !res.interrupted) {   /* resumed a finished run: still report */
        double acc;
        if (mnist_eval(&r, res.next_step - 1, &acc)) { fail(kn_last_error()); goto done; }
    }
    char db[32];
    fprintf(stderr, "done: %lld steps in %s, %.0f samples/s (training only)\n", (long long)(res.next_step - start),
            kn_train_fmt_duration(res.seconds, db, sizeof db), res.items_per_s);
    if (!res.interrupted) printf("final test accuracy: %.2f%%\n", r.last_acc);
    rc = 0;
done:
    kn_plan_free(step); kn_plan_free(r.eval);
    kn_optim_free(opt); kn_module_free(net); kn_ctx_free(ctx);
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

static kn_status lm_batch(void *ud, int64_t s) {
    lm_run *r = ud;
    uint64_t span = (uint64_t)(r->n_train - r->T - 1);
    for (int64_t b = 0; b < r->B; b++) {
        uint64_t h = mix64(r->a->seed * 0x100000001b3ull ^ mix64((uint64_t)s * (uint64_t)r->B + (uint64_t)b));
        window(r->train, (int64_t)(h % span), r->T, r->ib + b * r->T, r->tb + b * r->T);
    }
    kn_status st = kn_tensor_write(r->x, r->ib, KN_I32);
    if (!st && r->rng) st = kn_tensor_write(r->rng, &s, KN_I64);
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
} lm_data;

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
    if (a->heads <= 0 || a->dim % a->heads) { fprintf(stderr, "kiln train: --dim must be a multiple of --heads\n"); return 2; }
    int rc = 1;
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(a->seed + 1);
    kn_gpt2_cfg gc = {.vocab = r.V, .max_seq = r.T, .dim = a->dim, .n_layers = (int)a->layers, .n_heads = (int)a->heads,
                      .dropout = a->dropout};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    kn_optim *opt = NULL;
    kn_plan *step = NULL;
    if (m && a->dropout > 0) {                 /* a new mask every step, a function of the step */
        r.rng = kn_input(ctx, KN_I64, 0, NULL);
        if (!r.rng || kn_module_set_rng_step(m, r.rng)) { fail(kn_last_error()); goto done; }
    }
    int64_t sb[2] = {r.B, r.T};
    r.x = kn_input(ctx, KN_I32, 2, sb);
    r.y = kn_input(ctx, KN_I64, 2, sb);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_gpt2_forward(m, r.x), r.y, NULL);
    if (!m || !loss || kn_backward(ctx, loss) || !(opt = make_opt(ctx, m, a)) || !(step = step_plan(ctx, loss, opt))) {
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
    const char *meta[] = {"model", gpt2 ? "gpt2" : "char-gpt", "vocab", sv, "layers", sl, "dim", sd, "heads", sh,
                          "ctx", st_, "vocab_chars", d->meta_vocab};
    int n_meta = 7;
    int64_t start;
    if (resume(a, m, opt, n_meta, meta, &start)) { fail(kn_last_error()); goto done; }
    fprintf(stderr, "%s: GPT-2 architecture, %d layers, dim %lld, %lld heads, ctx %lld, vocab %lld: %lld parameters; "
            "%lld train / %lld val tokens; batch %lld x %lld, %lld steps, AdamW lr %g (cosine, warmup %lld), "
            "%d threads, %d kernels per step\n", kind, (int)a->layers, (long long)a->dim, (long long)a->heads,
            (long long)r.T, (long long)r.V, (long long)kn_module_n_params(m), (long long)r.n_train,
            (long long)r.n_val, (long long)r.B, (long long)r.T, (long long)r.total, a->lr, (long long)a->warmup,
            kn_pool_nthreads(), kn_plan_n_kernels(step));

    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = step; c.loss = loss; c.opt = opt; c.model = m;
    c.steps = r.total; c.items_per_step = r.B * r.T; c.items_name = "tok"; c.ud = &r;
    c.load_batch = lm_batch; c.lr_at = lm_lr; c.eval = lm_eval; c.sample = lm_sample;
    c.eval_every = a->eval_every; c.sample_every = a->sample_every;
    c.ckpt_every = a->ckpt_every; c.ckpt_path = a->out; c.n_meta = n_meta; c.meta_kv = meta;
    c.log_every = a->log_every ? a->log_every : 10;
    kn_train_catch_sigint(true);
    kn_train_result res;
    if (kn_train_run(&c, start, &res)) { fail(kn_last_error()); goto done; }
    kn_train_catch_sigint(false);
    char db[32];
    if (!r.evaluated && !res.interrupted) {   /* resumed a finished run: still report */
        double v;
        if (lm_eval(&r, res.next_step - 1, &v)) { fail(kn_last_error()); goto done; }
    }
    fprintf(stderr, "done: %lld steps in %s, %.0f tok/s (training only)\n", (long long)(res.next_step - start),
            kn_train_fmt_duration(res.seconds, db, sizeof db), res.items_per_s);
    if (!res.interrupted)
        printf("final: train loss %.4f, val loss %.4f (best %.4f) nats/%s\n", res.last_loss, r.last_val, r.best_val,
               gpt2 ? "token" : "char");
    rc = 0;
done:
    for (int k = 0; k < r.n_sp; k++) kn_plan_free(r.sp[k]);
    kn_plan_free(r.eval); kn_plan_free(step);
    kn_optim_free(opt); kn_module_free(m); kn_ctx_free(ctx);
    free(r.ib); free(r.tb); free(r.lb);
    return rc;
}

static void lm_defaults(targs *a, bool gpt2) {
    if (!a->layers) a->layers = 4;
    if (!a->dim) a->dim = gpt2 ? 256 : 128;
    if (!a->heads) a->heads = 4;
    if (!a->ctx) a->ctx = gpt2 ? 128 : 128;
    if (!a->batch) a->batch = gpt2 ? 8 : 32;
    if (!a->steps) a->steps = gpt2 ? 600 : 2000;
    if (a->lr == 0) a->lr = gpt2 ? 1e-3 : 2e-3;
    if (!a->warmup) a->warmup = a->steps / 20 + 1;
    if (!a->eval_every) a->eval_every = a->steps / 5 > 0 ? a->steps / 5 : 1;
    if (!a->eval_batches) a->eval_batches = gpt2 ? 4 : 8;
    if (!a->sample_len) a->sample_len = gpt2 ? 120 : 400;
    if (a->val_frac == 0) a->val_frac = gpt2 ? 0.05 : 0.1;
    if (a->clip == 0) a->clip = 1.0;
    if (a->temp == 0) a->temp = gpt2 ? 0.9 : 0.8;
}

static int train_char(targs *a) {
    lm_defaults(a, false);
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

static kn_tokenizer *gpt2_tokenizer(const targs *a, bool required) {
    char buf[1024];
    const char *p = a->tokenizer;
    if (!p) { snprintf(buf, sizeof buf, "%s/gguf/ggml-vocab-gpt-2.gguf", assets_dir()); p = buf; }
    kn_gguf *g = NULL;
    kn_tokenizer *tok = NULL;
    if (kn_gguf_open(p, &g) || kn_tokenizer_from_gguf(g, &tok)) {
        if (required) fprintf(stderr, "kiln train: GPT-2 tokenizer '%s': %s (pass --tokenizer FILE.gguf)\n", p, kn_last_error());
        else fprintf(stderr, "kiln train: no GPT-2 tokenizer at '%s' (%s): samples are printed as token ids\n", p, kn_last_error());
        tok = NULL;
    }
    kn_gguf_close(g);
    return tok;
}

static int train_gpt2(targs *a) {
    lm_defaults(a, true);
    if (!a->data) {
        fprintf(stderr, "kiln train gpt2: --data SHARD[,SHARD...] or TEXT.txt is required (e.g. "
                "%s/datasets/tinystories/TinyStories-train.first2MiB.txt)\n", assets_dir());
        return 2;
    }
    lm_data d = {.V = 50257, .bos = 50256, .eot = 50256};
    int rc = 1;
    char *list = NULL;
    bool txt = ends_with(a->data, ".txt");
    d.tok = gpt2_tokenizer(a, txt);
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
        fprintf(stderr, "tokenizing %s (GPT-2 BPE, documents split at <|endoftext|>) ...\n", a->data);
        if (kn_tokenize_file_to_shards(d.tok, a->data, "<|endoftext|>", 50256, prefix, (int64_t)1 << 30, &ns, &nt)) {
            fail(kn_last_error()); goto done;
        }
        fprintf(stderr, "wrote %d shard(s) %s_000000.bin ...: %lld tokens\n", ns, prefix, (long long)nt);
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
    if (argc < 3 || !strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) { train_usage(); return argc < 3 ? 2 : 0; }
    targs a = {.what = argv[2], .seed = 1337, .min_lr_frac = 0.1, .wd = -1};
    if (parse_targs(argc, argv, &a)) { train_usage(); return 2; }
    if (!strcmp(a.what, "mnist")) { if (a.wd < 0) a.wd = 0.0; return train_mnist(&a); }
    if (!strcmp(a.what, "char")) { if (a.wd < 0) a.wd = 0.01; return train_char(&a); }
    if (!strcmp(a.what, "gpt2")) { if (a.wd < 0) a.wd = 0.01; return train_gpt2(&a); }
    fprintf(stderr, "kiln train: unknown task '%s' (mnist, char, gpt2)\n", a.what);
    train_usage();
    return 2;
}
