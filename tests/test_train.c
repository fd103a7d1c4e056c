/* test_train.c: the training loop (kiln_train.h) and `kiln train`
 * (tools/train.c, included below to reach kn_cli_train): a few steps of an
 * MLP, a CNN and a GPT reduce the loss; a run stopped by SIGINT and resumed
 * from its checkpoint gives the bit-identical loss sequence of an
 * uninterrupted run; bad data paths, corrupt files and mismatched
 * checkpoints give clear errors (exit code 1 from the CLI). */
#include "kn_test.h"
#include "kiln_train.h"
#include "../tools/train.c"
#include "../tools/cmd_run.c"   /* kn_cli_launch (train --gpus) */
#include "../tools/cli_num.c"   /* train.c parses numbers with it */
#include <signal.h>
#include <sys/stat.h>

static char g_dir[256];
static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/kn_test_train_%d", (int)getpid());
        mkdir(g_dir, 0700);
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* ---- a small classification setup driven by the trainer ---------------------------- */

enum { N = 64, F = 8, K = 3, BS = 16, MAXS = 64 };

typedef struct setup {
    kn_ctx *ctx;
    kn_module *m;
    kn_optim *o;
    kn_plan *p;
    kn_tensor *x, *y, *loss;
    float xd[N * F];
    int64_t yd[N];
    double losses[MAXS];
    int64_t stop_at;      /* raise SIGINT after this step (-1: never) */
} setup;

static kn_status s_batch(void *ud, int64_t s) {
    setup *u = ud;
    int64_t b0 = (s % (N / BS)) * BS;
    kn_status st = kn_tensor_write(u->x, u->xd + b0 * F, KN_F32);
    return st ? st : kn_tensor_write(u->y, u->yd + b0, KN_I64);
}
static double s_lr(void *ud, int64_t s) { (void)ud; return kn_sched_cosine(s, 0.02, 0.002, 2, 40); }
static void s_on_step(void *ud, int64_t s, double loss) {
    setup *u = ud;
    if (s < MAXS) u->losses[s] = loss;
    if (s == u->stop_at) raise(SIGINT);
}

static bool setup_new(setup *u, uint64_t init_seed, int64_t hidden) {
    memset(u, 0, sizeof *u);
    u->stop_at = -1;
    kn_test_seed(77);   /* same data every time */
    for (int i = 0; i < N; i++) {
        for (int f = 0; f < F; f++) u->xd[i * F + f] = (float)kn_test_uniform(-1, 1);
        float *r = u->xd + i * F;
        u->yd[i] = r[0] > r[1] ? (r[0] > r[2] ? 0 : 2) : (r[1] > r[2] ? 1 : 2);
    }
    u->ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(init_seed);
    u->m = kn_sequential_new(u->ctx, "MLP");
    kn_sequential_add(u->m, kn_linear_new(u->ctx, F, hidden, true));
    kn_sequential_add(u->m, kn_act_new(u->ctx, KN_ACT_RELU));
    kn_sequential_add(u->m, kn_linear_new(u->ctx, hidden, K, true));
    int64_t bs = BS;
    u->x = kn_input(u->ctx, KN_F32, 2, (int64_t[]){BS, F});
    u->y = kn_input(u->ctx, KN_I64, 1, &bs);
    u->loss = kn_cross_entropy(u->ctx, kn_module_forward(u->m, u->x), u->y, NULL);
    if (!u->loss || kn_backward(u->ctx, u->loss)) return false;
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 0.01;
    oc.clip_norm = 1.0;
    u->o = kn_optim_new_decay_groups(u->ctx, u->m, &oc);
    if (!u->o) return false;
    u->p = step_plan(u->ctx, u->loss, u->o);
    return u->p != NULL;
}

static void setup_free(setup *u) {
    kn_plan_free(u->p); kn_optim_free(u->o); kn_module_free(u->m); kn_ctx_free(u->ctx);
}

static kn_trainer_cfg setup_cfg(setup *u, int64_t steps, const char *ckpt) {
    static const char *meta[] = {"model", "test-mlp"};
    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = u->p; c.loss = u->loss; c.opt = u->o; c.model = u->m;
    c.steps = steps; c.items_per_step = BS; c.items_name = "samples"; c.ud = u;
    c.load_batch = s_batch; c.lr_at = s_lr; c.on_step = s_on_step;
    c.ckpt_path = ckpt; c.n_meta = 1; c.meta_kv = meta;
    c.quiet = true;
    return c;
}

TEST(mlp_steps_reduce_loss) {
    setup u;
    REQUIRE(setup_new(&u, 5, 32), "%s", kn_last_error());
    kn_trainer_cfg c = setup_cfg(&u, 40, NULL);
    kn_train_result r;
    REQUIRE(kn_train_run(&c, 0, &r) == KN_OK, "%s", kn_last_error());
    CHECK(r.next_step == 40 && !r.interrupted, "next %lld", (long long)r.next_step);
    double first = (u.losses[0] + u.losses[1] + u.losses[2] + u.losses[3]) / 4;
    double last = (u.losses[36] + u.losses[37] + u.losses[38] + u.losses[39]) / 4;
    CHECK(first > 0.8 && last < 0.5 * first, "loss %g -> %g", first, last);
    CHECK(r.items_per_s > 0 && r.last_loss == u.losses[39], "rate %g", r.items_per_s);
    setup_free(&u);
}

/* ---- SIGINT, checkpoint, resume ------------------------------------------------------- */

TEST(resume_is_bit_identical) {
    enum { S = 10 };
    const char *ck = tmp_path("resume.safetensors");
    setup a, b, c;
    REQUIRE(setup_new(&a, 3, 24), "%s", kn_last_error());
    kn_trainer_cfg ca = setup_cfg(&a, S, NULL);
    kn_train_result r;
    REQUIRE(kn_train_run(&ca, 0, &r) == KN_OK, "%s", kn_last_error());

    /* same run, Ctrl-C during step 3: checkpoint after 4 steps */
    REQUIRE(setup_new(&b, 3, 24), "%s", kn_last_error());
    b.stop_at = 3;
    kn_train_catch_sigint(true);
    kn_trainer_cfg cb = setup_cfg(&b, S, ck);
    kn_status st = kn_train_run(&cb, 0, &r);
    kn_train_catch_sigint(false);
    bool stopped = kn_train_stop_requested();
    kn_train_clear_stop();
    REQUIRE(st == KN_OK, "%s", kn_last_error());
    CHECK(stopped && r.interrupted && r.next_step == 4, "interrupted %d next %lld", r.interrupted, (long long)r.next_step);
    CHECK(!memcmp(a.losses, b.losses, 4 * sizeof(double)), "first steps differ: %.9g vs %.9g", a.losses[3], b.losses[3]);

    /* a fresh model with another init, loaded from the checkpoint, goes on */
    REQUIRE(setup_new(&c, 999, 24), "%s", kn_last_error());
    const char *meta[] = {"model", "test-mlp"};
    int64_t start = -1;
    REQUIRE(kn_train_load(ck, c.m, c.o, 1, meta, &start) == KN_OK, "%s", kn_last_error());
    CHECK(start == 4 && kn_optim_step_count(c.o) == 4, "start %lld, optimizer step %lld", (long long)start,
          (long long)kn_optim_step_count(c.o));
    kn_trainer_cfg cc = setup_cfg(&c, S, NULL);
    REQUIRE(kn_train_run(&cc, start, &r) == KN_OK, "%s", kn_last_error());
    int same = 0;
    for (int s = 4; s < S; s++) same += !memcmp(&a.losses[s], &c.losses[s], sizeof(double));
    CHECK(same == S - 4, "%d of %d resumed losses bit-identical (step 4: %.12g vs %.12g)", same, S - 4, a.losses[4],
          c.losses[4]);
    /* and the parameters end equal too */
    kn_tensor *wa = kn_module_find(a.m, "0.weight"), *wc = kn_module_find(c.m, "0.weight");
    float va[F * 24], vc[F * 24];
    REQUIRE(!kn_tensor_read(wa, va, KN_F32) && !kn_tensor_read(wc, vc, KN_F32), "%s", kn_last_error());
    CHECK(!memcmp(va, vc, sizeof va), "final weights differ");
    setup_free(&a); setup_free(&b); setup_free(&c);
    remove(ck);
}

TEST(checkpoint_mismatch_errors) {
    const char *ck = tmp_path("mismatch.safetensors");
    setup a, b;
    REQUIRE(setup_new(&a, 3, 24) && setup_new(&b, 4, 16), "%s", kn_last_error());
    const char *meta[] = {"model", "test-mlp"}, *other[] = {"model", "test-cnn"};
    REQUIRE(kn_train_save(ck, a.m, a.o, 7, 1, meta) == KN_OK, "%s", kn_last_error());
    float before[16 * F], after[16 * F];
    kn_tensor_read(kn_module_find(b.m, "0.weight"), before, KN_F32);
    int64_t step = -1;
    /* other shapes: refused, every difference named, nothing written */
    CHECK(kn_train_load(ck, b.m, b.o, 1, meta, &step) == KN_ERR_INVALID && strstr(kn_last_error(), "0.weight") &&
              strstr(kn_last_error(), "optim.exp_avg.0.weight"), "%s", kn_last_error());
    kn_tensor_read(kn_module_find(b.m, "0.weight"), after, KN_F32);
    CHECK(!memcmp(before, after, sizeof before) && step == -1, "a refused load changed the model");
    /* another kind of model: metadata names the key and both values */
    CHECK(kn_train_load(ck, a.m, a.o, 1, other, &step) == KN_ERR_INVALID && strstr(kn_last_error(), "model") &&
              strstr(kn_last_error(), "test-mlp") && strstr(kn_last_error(), "test-cnn"), "%s", kn_last_error());
    /* missing file */
    CHECK(kn_train_load(tmp_path("nope.safetensors"), a.m, a.o, 0, NULL, &step) == KN_ERR_IO &&
              strstr(kn_last_error(), "nope.safetensors"), "%s", kn_last_error());
    /* the matching one loads, with its step */
    CHECK(kn_train_load(ck, a.m, a.o, 1, meta, &step) == KN_OK && step == 7, "%s", kn_last_error());
    /* a model checkpoint without optimizer state still loads the weights (optimizer NULL) */
    CHECK(kn_train_load(ck, a.m, NULL, 1, meta, &step) == KN_OK, "%s", kn_last_error());
    setup_free(&a); setup_free(&b);
    remove(ck);
}

/* ---- CNN and GPT: a few steps reduce the loss ------------------------------------------ */

typedef struct simple { kn_tensor *x, *y; const void *xd, *yd; kn_dtype xt; } simple;
static kn_status simple_batch(void *ud, int64_t s) {
    simple *u = ud;
    kn_status st = kn_tensor_write(u->x, u->xd, u->xt);
    return st ? st : kn_tensor_write(u->y, u->yd, KN_I64);
}
static double rec_losses[64];
static void rec(void *ud, int64_t s, double l) { (void)ud; if (s < 64) rec_losses[s] = l; }

static double run_simple(kn_ctx *ctx, kn_module *m, kn_tensor *loss, simple *u, double lr, int steps) {
    if (!loss || kn_backward(ctx, loss)) return NAN;
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = lr;
    kn_optim *o = kn_optim_new_decay_groups(ctx, m, &oc);
    kn_plan *p = o ? step_plan(ctx, loss, o) : NULL;
    if (!p) { kn_optim_free(o); return NAN; }
    kn_trainer_cfg c = kn_trainer_defaults();
    c.step = p; c.loss = loss; c.opt = o; c.model = m; c.steps = steps; c.items_per_step = 1;
    c.load_batch = simple_batch; c.on_step = rec; c.ud = u; c.quiet = true;
    kn_train_result r;
    kn_status st = kn_train_run(&c, 0, &r);
    kn_plan_free(p); kn_optim_free(o);
    return st ? NAN : rec_losses[steps - 1] / rec_losses[0];
}

TEST(cnn_steps_reduce_loss) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(9); kn_test_seed(9);
    enum { B = 8 };
    float xd[B * 64];
    int64_t yd[B];
    for (int b = 0; b < B; b++) {   /* class 1: the top half is brighter */
        yd[b] = b & 1;
        for (int i = 0; i < 64; i++) xd[b * 64 + i] = (float)(kn_test_uniform(0, 0.5) + ((i < 32) == (b & 1) ? 0.5 : 0));
    }
    const int k3[2] = {3, 3}, p1[2] = {1, 1}, k2[2] = {2, 2};
    kn_module *net = kn_sequential_new(ctx, "CNN");
    kn_sequential_add(net, kn_conv2d_new(ctx, 1, 4, k3, NULL, p1, NULL, 1, true));
    kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
    kn_sequential_add(net, kn_max_pool2d_new(ctx, k2, k2, NULL));
    kn_sequential_add(net, kn_flatten_new(ctx, 1, -1));
    kn_sequential_add(net, kn_linear_new(ctx, 4 * 4 * 4, 2, true));
    int64_t bb = B;
    simple u = {.x = kn_input(ctx, KN_F32, 4, (int64_t[]){B, 1, 8, 8}), .y = kn_input(ctx, KN_I64, 1, &bb),
                .xd = xd, .yd = yd, .xt = KN_F32};
    kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, u.x), u.y, NULL);
    double ratio = run_simple(ctx, net, loss, &u, 0.02, 15);
    CHECK(ratio < 0.5, "cnn loss ratio %g (%s)", ratio, kn_last_error());
    kn_module_free(net);
    kn_ctx_free(ctx);
}

TEST(gpt_steps_reduce_loss) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(13); kn_test_seed(13);
    enum { B = 2, T = 8, V = 16 };
    int32_t xd[B * T];
    int64_t yd[B * T];
    for (int i = 0; i < B * T; i++) { xd[i] = (int32_t)(kn_test_u64() % V); yd[i] = (xd[i] * 5 + 1) % V; }
    kn_gpt2_cfg gc = {.vocab = V, .max_seq = T, .dim = 16, .n_layers = 1, .n_heads = 2};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    simple u = {.x = kn_input(ctx, KN_I32, 2, (int64_t[]){B, T}), .y = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T}),
                .xd = xd, .yd = yd, .xt = KN_I32};
    kn_tensor *loss = kn_cross_entropy(ctx, kn_gpt2_forward(m, u.x), u.y, NULL);
    double ratio = run_simple(ctx, m, loss, &u, 0.01, 20);
    CHECK(ratio < 0.6, "gpt loss ratio %g (%s)", ratio, kn_last_error());
    CHECK(fabs(rec_losses[0] - log((double)V)) < 0.5, "initial loss %g near log V", rec_losses[0]);
    kn_module_free(m);
    kn_ctx_free(ctx);
}

TEST(loop_errors) {
    kn_trainer_cfg c = kn_trainer_defaults();
    kn_train_result r;
    CHECK(kn_train_run(&c, 0, &r) == KN_ERR_INVALID && strstr(kn_last_error(), "kn_train_run"), "%s", kn_last_error());
    setup u;
    REQUIRE(setup_new(&u, 5, 8), "%s", kn_last_error());
    c = setup_cfg(&u, 4, NULL);
    CHECK(kn_train_run(&c, 9, &r) == KN_ERR_INVALID && strstr(kn_last_error(), "start step"), "%s", kn_last_error());
    setup_free(&u);
    char b[32];
    CHECK(!strcmp(kn_train_fmt_duration(3725, b, sizeof b), "1h02m") && !strcmp(kn_train_fmt_duration(65, b, sizeof b), "1m05s"),
          "%s", b);
}

/* ---- the CLI ---------------------------------------------------------------------------- */

static int cli(int n, const char **args) {
    char *argv[48];
    argv[0] = "kiln"; argv[1] = "train";
    for (int i = 0; i < n && i < 46; i++) argv[i + 2] = (char *)args[i];
    kn_clear_error();
    return kn_cli_train(n + 2, argv);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(data, 1, n, f); fclose(f); }
}

TEST(cli_bad_data) {
    CHECK(cli(5, (const char *[]){"mnist", "--model", "mlp", "--data", "/nonexistent/kn_dir"}) == 1 &&
              strstr(kn_last_error(), "not found") && strstr(kn_last_error(), "/nonexistent/kn_dir"), "%s", kn_last_error());
    CHECK(cli(3, (const char *[]){"mnist", "--model", "resnet"}) == 2, "bad model name is a usage error");
    /* a corrupt idx header (wrong magic) */
    char dir[300];
    snprintf(dir, sizeof dir, "%s", tmp_path("mnist"));
    mkdir(dir, 0700);
    unsigned char bad[32] = {0, 0, 9, 9, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char p[400];
    for (int i = 0; i < 4; i++) { snprintf(p, sizeof p, "%s/%s", dir, names[i]); write_file(p, bad, sizeof bad); }
    CHECK(cli(5, (const char *[]){"mnist", "--model", "mlp", "--data", dir}) == 1 && strstr(kn_last_error(), "magic"),
          "%s", kn_last_error());
    for (int i = 0; i < 4; i++) { snprintf(p, sizeof p, "%s/%s", dir, names[i]); remove(p); }
    rmdir(dir);
    CHECK(cli(3, (const char *[]){"char", "--data", "/nonexistent/kn.txt"}) == 1 && strstr(kn_last_error(), "/nonexistent/kn.txt"),
          "%s", kn_last_error());
    /* a shard with a bad header */
    int32_t hdr[256] = {1234, 1, 10};
    const char *sh = tmp_path("bad_shard.bin");
    write_file(sh, hdr, sizeof hdr);
    CHECK(cli(5, (const char *[]){"gpt2", "--data", sh, "--tokenizer", "/nonexistent/tok.gguf"}) == 1 &&
              strstr(kn_last_error(), "magic"), "%s", kn_last_error());
    remove(sh);
    CHECK(cli(1, (const char *[]){"bogus"}) == 2, "unknown task");
}

TEST(cli_char_run_resume_mismatch) {
    const char *txt = tmp_path("tiny.txt"), *ck = tmp_path("char.safetensors");
    char text[3000];
    size_t n = 0;
    while (n + 13 < sizeof text) { memcpy(text + n, "hello world!\n", 13); n += 13; }
    write_file(txt, text, n);
    const char *common[] = {"char", "--data", txt, "--layers", "1", "--dim", "16", "--heads", "2", "--ctx", "16",
                            "--batch", "2", "--eval-batches", "1", "--sample-len", "8", "--out", ck, "--log-every", "100"};
    const char *a1[32], *a2[32], *a3[32];
    int nc = (int)(sizeof common / sizeof common[0]);
    memcpy(a1, common, sizeof common);
    a1[nc] = "--steps"; a1[nc + 1] = "3";
    CHECK(cli(nc + 2, a1) == 0, "char run: %s", kn_last_error());
    struct stat sb;
    CHECK(stat(ck, &sb) == 0 && sb.st_size > 0, "checkpoint written");
    /* resume with the same options for two more steps */
    memcpy(a2, a1, sizeof common + 2 * sizeof(char *));
    a2[nc + 1] = "5"; a2[nc + 2] = "--resume"; a2[nc + 3] = ck;
    CHECK(cli(nc + 4, a2) == 0, "char resume: %s", kn_last_error());
    char step[16];
    CHECK(kn_ckpt_meta(ck, "step", step, sizeof step) == KN_OK && !strcmp(step, "5"), "step %s", step);
    /* resume with another width: refused with exit 1 naming the difference */
    memcpy(a3, a2, sizeof(char *) * (size_t)(nc + 4));
    a3[6] = "32";
    CHECK(cli(nc + 4, a3) == 1 && strstr(kn_last_error(), "dim") && strstr(kn_last_error(), "16"), "%s", kn_last_error());
    /* another number of heads keeps every shape: the metadata catches it */
    memcpy(a3, a2, sizeof(char *) * (size_t)(nc + 4));
    a3[8] = "4";
    CHECK(cli(nc + 4, a3) == 1 && strstr(kn_last_error(), "heads"), "%s", kn_last_error());
    remove(txt); remove(ck);
    rmdir(g_dir);
}

/* --precision: a bad value is a usage error; bf16 and f16 runs train (or, on
 * a CPU without the instructions, are refused up front with exit 2). */
TEST(cli_char_precision) {
    CHECK(cli(5, (const char *[]){"char", "--data", "/nonexistent/kn.txt", "--precision", "f8"}) == 2, "--precision f8");
    const char *txt = tmp_path("prec.txt");
    mkdir(g_dir, 0700);                  /* an earlier test may have removed it */
    char text[3000];
    size_t n = 0;
    while (n + 13 < sizeof text) { memcpy(text + n, "hello world!\n", 13); n += 13; }
    write_file(txt, text, n);
    const char *precs[] = {"bf16", "f16"};
    for (int i = 0; i < 2; i++) {
        kn_ctx *probe = kn_ctx_new(NULL);
        kn_precision p = KN_PREC_F32;
        kn_precision_parse(precs[i], &p);
        bool can = !kn_precision_check(probe, p);
        kn_ctx_free(probe);
        const char *args[] = {"char", "--data", txt, "--layers", "1", "--dim", "16", "--heads", "2", "--ctx", "16",
                              "--batch", "2", "--eval-batches", "1", "--sample-len", "0", "--steps", "3",
                              "--log-every", "100", "--precision", precs[i]};
        int rc = cli((int)(sizeof args / sizeof args[0]), args);
        CHECK(rc == (can ? 0 : 2), "--precision %s: exit %d (%s)", precs[i], rc, kn_last_error());
    }
    remove(txt);
    rmdir(g_dir);
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = false;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}
/* --dropout: masks drawn from the step number, so 4 steps == 2 steps + resume
 * to 4, bit for bit (parameters and optimizer state in the checkpoint) */
TEST(cli_char_dropout_resume_bit_identical) {
    const char *txt = tmp_path("drop.txt"), *ca = tmp_path("drop_a.safetensors"), *cb = tmp_path("drop_b.safetensors");
    mkdir(g_dir, 0700);                               /* an earlier test removes it */
    char text[3000];
    size_t n = 0;
    while (n + 24 < sizeof text) { memcpy(text + n, "to be or not to be, so.\n", 24); n += 24; }
    write_file(txt, text, n);
    const char *common[] = {"char", "--data", txt, "--layers", "1", "--dim", "16", "--heads", "2", "--ctx", "16",
                            "--batch", "2", "--eval-batches", "1", "--sample-len", "8", "--log-every", "100",
                            "--dropout", "0.3", "--eval-every", "100", "--sample-every", "100"};
    int nc = (int)(sizeof common / sizeof common[0]);
    const char *a[40];
    memcpy(a, common, sizeof common);
    a[nc] = "--steps"; a[nc + 1] = "4"; a[nc + 2] = "--out"; a[nc + 3] = ca;
    CHECK(cli(nc + 4, a) == 0, "4 steps: %s", kn_last_error());
    a[nc + 1] = "2"; a[nc + 3] = cb;
    CHECK(cli(nc + 4, a) == 0, "2 steps: %s", kn_last_error());
    a[nc + 1] = "4"; a[nc + 2] = "--resume";
    CHECK(cli(nc + 4, a) == 0, "resume to 4: %s", kn_last_error());
    CHECK(same_file(ca, cb), "checkpoints after 4 steps differ between the straight and the resumed run");
    a[nc - 5] = "0"; a[nc + 1] = "4"; a[nc + 2] = "--out";  /* no dropout: another result */
    CHECK(cli(nc + 4, a) == 0 && !same_file(ca, cb), "--dropout 0.3 made no difference: %s", kn_last_error());
    a[nc - 5] = "1";                                  /* --dropout 1 */
    CHECK(cli(nc + 2, a) == 2, "--dropout 1 is a usage error");
    /* --attn-dropout alone: the same resume rule, and not the run without it
     * (cb: --dropout 0, 4 steps, from above) */
    char tx[512], cc[512], cd[512];                   /* tmp_path keeps 4 names: copies */
    snprintf(tx, sizeof tx, "%s", txt);
    a[2] = txt = tx;
    snprintf(cc, sizeof cc, "%s", tmp_path("drop_c.safetensors"));
    snprintf(cd, sizeof cd, "%s", tmp_path("drop_d.safetensors"));
    a[nc - 5] = "0";
    a[nc] = "--steps"; a[nc + 1] = "4"; a[nc + 2] = "--out"; a[nc + 3] = cc; a[nc + 4] = "--attn-dropout"; a[nc + 5] = "0.3";
    CHECK(cli(nc + 6, a) == 0, "4 steps, --attn-dropout 0.3: %s", kn_last_error());
    CHECK(!same_file(cc, cb), "--attn-dropout 0.3 made no difference");
    a[nc + 1] = "2"; a[nc + 3] = cd;
    CHECK(cli(nc + 6, a) == 0, "2 steps: %s", kn_last_error());
    a[nc + 1] = "4"; a[nc + 2] = "--resume";
    CHECK(cli(nc + 6, a) == 0, "resume to 4: %s", kn_last_error());
    CHECK(same_file(cc, cd), "--attn-dropout: checkpoints after 4 steps differ between the straight and the resumed run");
    a[nc + 2] = "--out"; a[nc + 5] = "1";
    CHECK(cli(nc + 6, a) == 2, "--attn-dropout 1 is a usage error");
    remove(txt); remove(ca); remove(cb); remove(cc); remove(cd);
    rmdir(g_dir);
}

KN_TEST_MAIN()
