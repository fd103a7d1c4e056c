/* test_precision.c: mixed-precision training (kiln_nn.h "mixed precision").
 *
 * - the compiled step plan of a bf16 MLP has bf16 matmuls only (forward and
 *   backward), while parameters, gradients and optimizer state are f32: fails
 *   when the policy silently stays in f32;
 * - the CPU's 16-bit matmul path (widened SGEMM) against the reference backend;
 * - a tiny GPT-2 trained in bf16 and f16 tracks the f32 run from the same init;
 * - f16 loss scaling: a forced overflow skips the step (weights, state and
 *   step count untouched) and halves the scale; the scale grows after
 *   growth_interval finite steps;
 * - the losses of PyTorch's bf16 autocast on a bias-free MLP
 *   (tests/fixtures/amp_mlp.bin, scripts/amp_ref.py).
 * Tests that need the CPU's bf16 (f16) support skip where it is missing. */
#include "kn_test.h"
#include "kn_fixture.h"
#include "kiln_nn.h"
#include "kiln_train.h"
#include <unistd.h>
#include "runtime/runtime.h"     // defines: struct kn_plan (the schedule, to count matmul dtypes)

static kn_ctx *ctx_on(kn_backend *be) { return kn_ctx_new(&(kn_ctx_opts){be}); }

/* skip-reason when ctx's backend cannot run p */
static bool prec_ok(kn_ctx *ctx, kn_precision p, char *why, size_t n) {
    if (!kn_precision_check(ctx, p)) return true;
    snprintf(why, n, "%s", kn_last_error());
    return false;
}

/* ---- an MLP step plan ---------------------------------------------------------------
 * x [B,IN] -> Linear(IN,H) -> tanh -> Linear(H,OUT) -> cross entropy with y [B]. */
enum { B = 16, IN = 12, H = 24, OUT = 5 };
typedef struct mlp {
    kn_ctx *ctx; kn_module *net; kn_optim *opt; kn_plan *plan; kn_loss_scaler *sc;
    kn_tensor *x, *y, *loss;
} mlp;

static bool mlp_new(mlp *u, kn_precision p, bool scaler, const kn_loss_scaler_cfg *sc_cfg, kn_optim_kind kind) {
    memset(u, 0, sizeof *u);
    kn_ctx *ctx = u->ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(5);
    u->net = kn_sequential_new(ctx, "mlp");
    kn_sequential_add(u->net, kn_linear_new(ctx, IN, H, true));
    kn_sequential_add(u->net, kn_act_new(ctx, KN_ACT_TANH));
    kn_sequential_add(u->net, kn_linear_new(ctx, H, OUT, true));
    if (kn_module_set_precision(u->net, p)) return false;
    u->x = kn_input(ctx, KN_F32, 2, (int64_t[]){B, IN});
    u->y = kn_input(ctx, KN_I64, 1, (int64_t[]){B});
    u->loss = kn_cross_entropy(ctx, kn_module_forward(u->net, u->x), u->y, NULL);
    kn_tensor *root = u->loss;
    if (scaler) root = kn_loss_scaler_scale(u->sc = kn_loss_scaler_new(ctx, sc_cfg), u->loss);
    if (!root || kn_backward(ctx, root)) return false;
    kn_optim_cfg oc = kn_optim_defaults(kind);
    oc.lr = 0.05;
    u->opt = kn_optim_new(ctx, u->net, &oc);
    if (!u->opt || (scaler && kn_optim_set_loss_scaler(u->opt, u->sc))) return false;
    kn_tensor *outs[64];
    int n = 0;
    outs[n++] = u->loss;
    int ne = kn_optim_build(u->opt, NULL, outs + n, 64 - n);
    if (ne < 0) return false;
    u->plan = kn_plan_new(ctx, n + ne, outs, NULL);
    if (!u->plan) return false;
    float xd[B * IN]; int64_t yd[B];
    kn_test_seed(11);
    for (int i = 0; i < B * IN; i++) xd[i] = (float)kn_test_uniform(-2, 2);
    for (int i = 0; i < B; i++) yd[i] = i % OUT;
    return !kn_tensor_write(u->x, xd, KN_F32) && !kn_tensor_write(u->y, yd, KN_I64);
}
static void mlp_free(mlp *u) {
    kn_plan_free(u->plan); kn_optim_free(u->opt); kn_loss_scaler_free(u->sc); kn_module_free(u->net); kn_ctx_free(u->ctx);
}
static double mlp_step(mlp *u) {
    if (kn_optim_prepare(u->opt) || kn_plan_run(u->plan)) return NAN;
    return kn_item(u->loss);
}

/* matmul nodes the plan runs, by dtype: in its schedule, and those an
 * epilogue's last node runs (src/compile/epilogue.c takes them out of it) */
static void count_matmuls(const kn_plan *p, int *n16, int *n32) {
    *n16 = *n32 = 0;
    for (int i = 0; i < p->n + p->nepi; i++) {
        const kn_tensor *t = i < p->n ? p->order[i] : p->epi[i - p->n].mm;
        if (t->op != KN_OP_MATMUL) continue;
        /* a matmul's dtype is the promotion of its operands': bf16 only when both are */
        if (t->dtype == KN_BF16 || t->dtype == KN_F16) (*n16)++;
        else (*n32)++;
    }
}

TEST(bf16_plan_has_16bit_matmuls_and_f32_master_state) {
    mlp u;
    char why[512];
    kn_ctx *probe = kn_ctx_new(NULL);
    bool ok = prec_ok(probe, KN_PREC_BF16, why, sizeof why);
    kn_ctx_free(probe);
    if (!ok) SKIP("%s", why);
    REQUIRE(mlp_new(&u, KN_PREC_BF16, false, NULL, KN_OPTIM_ADAMW), "%s", kn_last_error());
    int n16, n32;
    count_matmuls(u.plan, &n16, &n32);
    /* forward 2, dW 2, dx of the second layer 1 (x needs no gradient) */
    CHECK(n16 >= 5 && n32 == 0, "bf16 policy: %d bf16 and %d f32 matmuls in the plan (want >= 5 and 0)", n16, n32);
    CHECK(kn_module_precision(kn_module_child(u.net, 0)) == KN_PREC_BF16, "children inherit the precision");
    for (int i = 0; i < kn_optim_n_params(u.opt); i++) {
        kn_tensor *p = kn_optim_param(u.opt, i);
        CHECK(p->dtype == KN_F32, "master weight %d is %s", i, kn_dtype_name(p->dtype));
        CHECK(kn_grad(p) && kn_grad(p)->dtype == KN_F32, "gradient %d is not f32", i);
        kn_tensor *m = kn_optim_state(u.opt, i, "exp_avg"), *v = kn_optim_state(u.opt, i, "exp_avg_sq");
        CHECK(m && v && m->dtype == KN_F32 && v->dtype == KN_F32, "optimizer state %d is not f32", i);
    }
    double l0 = mlp_step(&u), l1 = l0;
    for (int s = 0; s < 10; s++) l1 = mlp_step(&u);
    CHECK(isfinite(l0) && l1 < l0, "bf16 training: loss %g -> %g", l0, l1);
    mlp_free(&u);
    /* and the count does see f32: the same model under the f32 policy */
    REQUIRE(mlp_new(&u, KN_PREC_F32, false, NULL, KN_OPTIM_ADAMW), "%s", kn_last_error());
    count_matmuls(u.plan, &n16, &n32);
    CHECK(n16 == 0 && n32 >= 5, "f32 policy: %d 16-bit and %d f32 matmuls", n16, n32);
    mlp_free(&u);
}

TEST(precision_names_and_checks) {
    kn_precision p = KN_PREC_F32;
    CHECK(!kn_precision_parse("bf16", &p) && p == KN_PREC_BF16, "bf16");
    CHECK(!kn_precision_parse("FP16", &p) && p == KN_PREC_F16, "FP16");
    CHECK(!kn_precision_parse("f32", &p) && p == KN_PREC_F32, "f32");
    CHECK(kn_precision_parse("f8", &p) == KN_ERR_INVALID && strstr(kn_last_error(), "f32, bf16, f16"), "f8: %s", kn_last_error());
    CHECK(!strcmp(kn_precision_name(KN_PREC_BF16), "bf16") && kn_precision_dtype(KN_PREC_F16) == KN_F16, "names");
    kn_ctx *ctx = kn_ctx_new(NULL);
    CHECK(!kn_precision_check(ctx, KN_PREC_F32), "f32 always runs");
    CHECK(kn_precision_check(ctx, (kn_precision)7) == KN_ERR_INVALID, "unknown precision");
    kn_status st = kn_precision_check(ctx, KN_PREC_BF16);
    CHECK(!st || (st == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "AVX512_BF16")), "bf16 check: %s", kn_last_error());
    CHECK(kn_module_set_precision(NULL, KN_PREC_BF16) == KN_ERR_INVALID, "NULL module");
    kn_ctx_free(ctx);
}

/* ---- the CPU's 16-bit matmul against the reference ------------------------------- */
static double max_rel(const float *a, const float *b, int n) {
    double m = 0, s = 0;
    for (int i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (d > m) m = d; s = fmax(s, fabs((double)b[i])); }
    return m / (s > 0 ? s : 1);
}
TEST(cpu_half_matmul_matches_reference) {
    enum { M = 37, K = 70, N = 29, Z = 3 };
    float a[Z * M * K], w[N * K];
    kn_test_seed(3);
    for (int i = 0; i < Z * M * K; i++) a[i] = (float)kn_test_uniform(-1, 1);
    for (int i = 0; i < N * K; i++) w[i] = (float)kn_test_uniform(-1, 1);
    kn_dtype dts[2] = {KN_BF16, KN_F16};
    for (int d = 0; d < 2; d++) {
        float out[2][Z * M * N], outb[2][Z * M * M];
        for (int b = 0; b < 2; b++) {
            kn_ctx *ctx = ctx_on(b ? kn_backend_ref() : kn_backend_cpu());
            kn_tensor *A = kn_from_data(ctx, KN_F32, 3, (int64_t[]){Z, M, K}, a), *W = kn_from_data(ctx, KN_F32, 2, (int64_t[]){N, K}, w);
            REQUIRE(A && W, "%s", kn_last_error());
            kn_tensor *Ah = kn_cast(ctx, A, dts[d]), *Wh = kn_cast(ctx, W, dts[d]);
            /* x @ W^T (transposed right operand, shared over the batch) and a batched A @ A^T */
            kn_tensor *y = kn_cast(ctx, kn_matmul(ctx, Ah, kn_transpose(ctx, Wh, 0, 1)), KN_F32);
            kn_tensor *yb = kn_cast(ctx, kn_matmul(ctx, Ah, kn_transpose(ctx, Ah, 1, 2)), KN_F32);
            REQUIRE(y && yb && !kn_tensor_read(y, out[b], KN_F32) && !kn_tensor_read(yb, outb[b], KN_F32), "%s", kn_last_error());
            kn_ctx_free(ctx);
        }
        /* both round the same exact products' sums (f32 vs f64) to 16 bits: an ulp at most */
        double e1 = max_rel(out[0], out[1], Z * M * N), e2 = max_rel(outb[0], outb[1], Z * M * M);
        CHECK(e1 < 1e-2 && e2 < 1e-2, "%s: cpu vs ref %g %g", kn_dtype_name(dts[d]), e1, e2);
    }
}

/* ---- a tiny GPT-2 in each precision ------------------------------------------------- */
enum { GB = 4, GT = 16, GV = 32, GSTEPS = 25 };
static bool gpt_losses(kn_precision p, double *losses) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(42);
    kn_gpt2_cfg gc = {.vocab = GV, .max_seq = GT, .dim = 32, .n_layers = 2, .n_heads = 2};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    bool ok = m && !kn_module_set_precision(m, p);
    kn_tensor *ids = kn_input(ctx, KN_I64, 2, (int64_t[]){GB, GT}), *tg = kn_input(ctx, KN_I64, 2, (int64_t[]){GB, GT});
    kn_tensor *loss = ok ? kn_cross_entropy(ctx, kn_gpt2_forward(m, ids), tg, NULL) : NULL;
    kn_loss_scaler *sc = p == KN_PREC_F16 ? kn_loss_scaler_new(ctx, NULL) : NULL;
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 3e-3;
    kn_optim *o = NULL;
    kn_plan *plan = NULL;
    if (loss && !kn_backward(ctx, sc ? kn_loss_scaler_scale(sc, loss) : loss) && (o = kn_optim_new(ctx, m, &oc)) &&
        (!sc || !kn_optim_set_loss_scaler(o, sc))) {
        kn_tensor *outs[KN_NN_MAX_OUTS];
        outs[0] = loss;
        int ne = kn_optim_build(o, NULL, outs + 1, KN_NN_MAX_OUTS - 1);
        if (ne >= 0) plan = kn_plan_new(ctx, 1 + ne, outs, NULL);
    }
    int64_t idd[GB * GT], tgd[GB * GT];
    for (int i = 0; i < GB * GT; i++) { idd[i] = (i * 7 + i / GT) % GV; tgd[i] = (idd[i] * 3 + 1) % GV; }
    ok = plan && !kn_tensor_write(ids, idd, KN_I64) && !kn_tensor_write(tg, tgd, KN_I64);
    for (int s = 0; s < GSTEPS && ok; s++) {
        ok = !kn_optim_prepare(o) && !kn_plan_run(plan) && (!sc || !kn_loss_scaler_update(sc, NULL));
        losses[s] = kn_item(loss);
    }
    if (ok && sc && kn_loss_scaler_skipped(sc)) ok = false;   /* nothing should overflow at this size */
    kn_plan_free(plan); kn_optim_free(o); kn_loss_scaler_free(sc); kn_module_free(m); kn_ctx_free(ctx);
    return ok;
}
TEST(gpt2_bf16_and_f16_track_f32) {
    double l32[GSTEPS], l16[GSTEPS];
    REQUIRE(gpt_losses(KN_PREC_F32, l32), "f32 run: %s", kn_last_error());
    CHECK(l32[GSTEPS - 1] < 0.7 * l32[0], "f32 loss %g -> %g", l32[0], l32[GSTEPS - 1]);
    kn_precision ps[2] = {KN_PREC_BF16, KN_PREC_F16};
    for (int k = 0; k < 2; k++) {
        char why[512];
        kn_ctx *probe = kn_ctx_new(NULL);
        bool ok = prec_ok(probe, ps[k], why, sizeof why);
        kn_ctx_free(probe);
        if (!ok) { fprintf(stderr, "  (%s skipped: %s)\n", kn_precision_name(ps[k]), why); continue; }
        REQUIRE(gpt_losses(ps[k], l16), "%s run: %s", kn_precision_name(ps[k]), kn_last_error());
        double maxd = 0, sumd = 0;
        for (int s = 0; s < GSTEPS; s++) { double d = fabs(l16[s] - l32[s]); maxd = fmax(maxd, d); sumd += d; }
        fprintf(stderr, "  %s vs f32 over %d steps: max loss gap %.2e, loss %.3f -> %.3f\n", kn_precision_name(ps[k]), GSTEPS,
                maxd, l16[0], l16[GSTEPS - 1]);
        /* bf16 keeps 8 mantissa bits: about 1e-3 of loss after 25 steps here */
        CHECK(maxd < 0.01 * l32[0], "%s vs f32: max loss gap %g", kn_precision_name(ps[k]), maxd);
        CHECK(sumd > 0, "%s losses are bit-identical to f32: the policy did nothing", kn_precision_name(ps[k]));
        CHECK(l16[GSTEPS - 1] < 0.7 * l16[0], "%s loss %g -> %g", kn_precision_name(ps[k]), l16[0], l16[GSTEPS - 1]);
    }
}

/* ---- f16 loss scaling ----------------------------------------------------------------- */
static void read_params(kn_optim *o, float *buf, int cap) {
    int off = 0;
    for (int i = 0; i < kn_optim_n_params(o); i++) {
        kn_tensor *p = kn_optim_param(o, i);
        if (off + kn_numel(p) > cap) return;
        kn_tensor_read(p, buf + off, KN_F32);
        off += (int)kn_numel(p);
        kn_tensor *m = kn_optim_state(o, i, "exp_avg");
        if (m && off + kn_numel(m) <= cap) { kn_tensor_read(m, buf + off, KN_F32); off += (int)kn_numel(m); }
    }
}
TEST(f16_overflow_skips_the_step_and_halves_the_scale) {
    char why[512];
    kn_ctx *probe = kn_ctx_new(NULL);
    bool ok = prec_ok(probe, KN_PREC_F16, why, sizeof why);
    kn_ctx_free(probe);
    if (!ok) SKIP("%s", why);
    /* 2^100: the f32 loss times it is finite, its f16 gradients are not */
    kn_loss_scaler_cfg c = kn_loss_scaler_defaults();
    c.init_scale = ldexp(1, 100);
    c.growth_interval = 2;
    mlp u;
    REQUIRE(mlp_new(&u, KN_PREC_F16, true, &c, KN_OPTIM_ADAMW), "%s", kn_last_error());
    enum { CAP = 2 * (IN * H + H + H * OUT + OUT) };
    static float before[CAP], after[CAP];
    read_params(u.opt, before, CAP);
    double loss = mlp_step(&u);
    bool skipped = false;
    REQUIRE(!kn_loss_scaler_update(u.sc, &skipped), "%s", kn_last_error());
    CHECK(isfinite(loss), "the reported loss is unscaled and finite: %g", loss);
    CHECK(skipped && kn_loss_scaler_skipped(u.sc) == 1, "overflow not detected");
    CHECK(kn_loss_scaler_get_scale(u.sc) == ldexp(1, 99), "scale %g, want 2^99", kn_loss_scaler_get_scale(u.sc));
    CHECK(kn_optim_step_count(u.opt) == 0, "a skipped step counts: %lld", (long long)kn_optim_step_count(u.opt));
    read_params(u.opt, after, CAP);
    CHECK(!memcmp(before, after, sizeof before), "a skipped step changed the weights or the optimizer state");
    /* a sane scale: the step runs, then after growth_interval = 2 finite steps the scale doubles */
    REQUIRE(!kn_loss_scaler_set_scale(u.sc, 1024), "%s", kn_last_error());
    double l0 = mlp_step(&u);
    REQUIRE(!kn_loss_scaler_update(u.sc, &skipped), "%s", kn_last_error());
    CHECK(!skipped && kn_optim_step_count(u.opt) == 1, "step with scale 1024 skipped");
    read_params(u.opt, after, CAP);
    CHECK(memcmp(before, after, sizeof before), "the finite step changed nothing");
    CHECK(kn_loss_scaler_get_scale(u.sc) == 1024, "scale changed after 1 good step");
    mlp_step(&u);
    REQUIRE(!kn_loss_scaler_update(u.sc, &skipped), "%s", kn_last_error());
    CHECK(kn_loss_scaler_get_scale(u.sc) == 2048, "scale %g after 2 good steps, want 2048", kn_loss_scaler_get_scale(u.sc));
    double l = l0;
    for (int s = 0; s < 10; s++) { l = mlp_step(&u); kn_loss_scaler_update(u.sc, NULL); }
    CHECK(l < l0, "f16 training with loss scaling: %g -> %g", l0, l);
    mlp_free(&u);
    /* misuse is reported */
    kn_loss_scaler_cfg bad = kn_loss_scaler_defaults();
    bad.backoff_factor = 1.5;
    kn_ctx *ctx = kn_ctx_new(NULL);
    CHECK(!kn_loss_scaler_new(ctx, &bad) && strstr(kn_last_error(), "backoff_factor"), "bad cfg: %s", kn_last_error());
    kn_ctx_free(ctx);
}

/* SGD (no Adam state) takes the same masked path */
TEST(f16_overflow_skip_sgd) {
    char why[512];
    kn_ctx *probe = kn_ctx_new(NULL);
    bool ok = prec_ok(probe, KN_PREC_F16, why, sizeof why);
    kn_ctx_free(probe);
    if (!ok) SKIP("%s", why);
    kn_loss_scaler_cfg c = kn_loss_scaler_defaults();
    c.init_scale = ldexp(1, 100);
    mlp u;
    REQUIRE(mlp_new(&u, KN_PREC_F16, true, &c, KN_OPTIM_SGD), "%s", kn_last_error());
    enum { CAP = IN * H + H + H * OUT + OUT };
    static float before[CAP], after[CAP];
    read_params(u.opt, before, CAP);
    mlp_step(&u);
    bool skipped = false;
    REQUIRE(!kn_loss_scaler_update(u.sc, &skipped), "%s", kn_last_error());
    read_params(u.opt, after, CAP);
    CHECK(skipped && !memcmp(before, after, sizeof before), "SGD: overflow skipped %d, weights unchanged %d", skipped,
          !memcmp(before, after, sizeof before));
    /* a NaN gradient (from a NaN input) at a sane scale is skipped too */
    REQUIRE(!kn_loss_scaler_set_scale(u.sc, 1024), "%s", kn_last_error());
    float xd[B * IN];
    for (int i = 0; i < B * IN; i++) xd[i] = i == 5 ? NAN : 0.25f;
    REQUIRE(!kn_tensor_write(u.x, xd, KN_F32), "%s", kn_last_error());
    mlp_step(&u);
    REQUIRE(!kn_loss_scaler_update(u.sc, &skipped), "%s", kn_last_error());
    read_params(u.opt, after, CAP);
    CHECK(skipped && !memcmp(before, after, sizeof before) && kn_loss_scaler_get_scale(u.sc) == 512,
          "NaN gradients: skipped %d, scale %g", skipped, kn_loss_scaler_get_scale(u.sc));
    mlp_free(&u);
}

/* the scaler's state travels in the checkpoint (f16 resume continues bit for bit) */
TEST(f16_scaler_state_in_checkpoint) {
    char why[512];
    kn_ctx *probe = kn_ctx_new(NULL);
    bool ok = prec_ok(probe, KN_PREC_F16, why, sizeof why);
    kn_ctx_free(probe);
    if (!ok) SKIP("%s", why);
    char path[64];
    snprintf(path, sizeof path, "/tmp/kn_test_prec_%d.safetensors", (int)getpid());
    mlp u, w;
    REQUIRE(mlp_new(&u, KN_PREC_F16, true, NULL, KN_OPTIM_ADAMW), "%s", kn_last_error());
    REQUIRE(!kn_loss_scaler_set_state(u.sc, 1024, 3), "%s", kn_last_error());
    REQUIRE(!kn_train_save(path, u.net, u.opt, 7, 0, NULL), "%s", kn_last_error());
    REQUIRE(mlp_new(&w, KN_PREC_F16, true, NULL, KN_OPTIM_ADAMW), "%s", kn_last_error());
    int64_t step = 0, good = 0;
    double scale = 0;
    CHECK(!kn_train_load(path, w.net, w.opt, 0, NULL, &step) && step == 7, "load: %s", kn_last_error());
    kn_loss_scaler_get_state(w.sc, &scale, &good);
    CHECK(scale == 1024 && good == 3, "restored scale %g, growth count %lld", scale, (long long)good);
    remove(path);
    mlp_free(&u); mlp_free(&w);
}

/* ---- PyTorch bf16 autocast ------------------------------------------------------------ */
TEST(bf16_matches_torch_autocast) {
    kn_fx fx;
    REQUIRE(!kn_fx_load("tests/fixtures/amp_mlp.bin", &fx), "tests/fixtures/amp_mlp.bin: %s (run from the repo root; "
            "regenerate with scripts/amp_ref.py)", kn_fx_error());
    const kn_fx_tensor *x = kn_fx_get(&fx, "in.x"), *y = kn_fx_get(&fx, "in.y"), *lf = kn_fx_get(&fx, "loss.f32"),
                       *lb = kn_fx_get(&fx, "loss.bf16"), *lr = kn_fx_get(&fx, "cfg.lr");
    const kn_fx_tensor *w[3] = {kn_fx_get(&fx, "w0"), kn_fx_get(&fx, "w1"), kn_fx_get(&fx, "w2")};
    REQUIRE(x && y && lf && lb && lr && w[0] && w[1] && w[2], "fixture lacks a tensor");
    int steps = (int)lf->numel;
    kn_precision ps[2] = {KN_PREC_F32, KN_PREC_BF16};
    double got[2][64];
    REQUIRE(steps <= 64, "%d steps", steps);
    for (int k = 0; k < 2; k++) {
        kn_ctx *ctx = kn_ctx_new(NULL);
        char why[512];
        if (k == 1 && !prec_ok(ctx, KN_PREC_BF16, why, sizeof why)) { kn_ctx_free(ctx); kn_fx_free(&fx); SKIP("%s", why); }
        kn_module *net = kn_sequential_new(ctx, "mlp");
        for (int i = 0; i < 3; i++) {
            kn_sequential_add(net, kn_linear_new(ctx, w[i]->shape[1], w[i]->shape[0], false));
            if (i < 2) kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
        }
        REQUIRE(!kn_module_set_precision(net, ps[k]), "%s", kn_last_error());
        for (int i = 0; i < 3; i++) {
            char nm[16];
            snprintf(nm, sizeof nm, "%d.weight", 2 * i);
            REQUIRE(!kn_module_load_param(net, nm, w[i]->v, KN_F64), "%s", kn_last_error());
        }
        kn_tensor *xt = kn_fx_tensor_new(ctx, x, KN_F32), *yt = kn_fx_tensor_new(ctx, y, KN_I64);
        kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, xt), yt, NULL);
        REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
        kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_SGD);
        oc.lr = lr->v[0];
        kn_optim *o = kn_optim_new(ctx, net, &oc);
        kn_tensor *outs[16];
        outs[0] = loss;
        int ne = kn_optim_build(o, NULL, outs + 1, 15);
        kn_plan *plan = ne >= 0 ? kn_plan_new(ctx, 1 + ne, outs, NULL) : NULL;
        REQUIRE(plan, "%s", kn_last_error());
        for (int s = 0; s < steps; s++) {
            REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(plan), "%s", kn_last_error());
            got[k][s] = kn_item(loss);
        }
        kn_plan_free(plan); kn_optim_free(o); kn_module_free(net); kn_ctx_free(ctx);
    }
    double e32 = 0, e16 = 0, gap = 0;
    for (int s = 0; s < steps; s++) {
        e32 = fmax(e32, fabs(got[0][s] - lf->v[s]));
        e16 = fmax(e16, fabs(got[1][s] - lb->v[s]));
        gap = fmax(gap, fabs(lb->v[s] - lf->v[s]));
    }
    fprintf(stderr, "  losses vs torch: f32 %.2e, bf16 %.2e (torch's own bf16-f32 gap %.2e)\n", e32, e16, gap);
    CHECK(e32 < 1e-4, "f32 losses differ from torch's by %g", e32);
    /* the same rounding points as autocast: far closer to torch's bf16 run than to its f32 run */
    CHECK(e16 < 0.5 * gap, "bf16 losses differ from torch autocast's by %g (its gap to f32 is %g)", e16, gap);
    kn_fx_free(&fx);
}

/* GPT-2 (a small one) trained 20 AdamW steps from PyTorch's initial weights
 * on PyTorch's batches (scripts/amp_gpt2_ref.py): kiln f32 against torch f32,
 * kiln bf16 against torch under bf16 autocast. The two policies round at
 * slightly different points (autocast adds a Linear's bias and applies gelu
 * in bf16, kiln in f32 after the cast back), so bf16 is held to bf16
 * tolerance of torch's bf16 run, and must differ from kiln's own f32 run. */
TEST(gpt2_bf16_tracks_torch_autocast) {
    kn_fx fx;
    REQUIRE(!kn_fx_load("tests/fixtures/amp_gpt2.bin", &fx), "tests/fixtures/amp_gpt2.bin: %s (run from the repo root; "
            "regenerate with scripts/amp_gpt2_ref.py)", kn_fx_error());
    const kn_fx_tensor *ids = kn_fx_get(&fx, "in.ids"), *lf = kn_fx_get(&fx, "loss.f32"), *lb = kn_fx_get(&fx, "loss.bf16"),
                       *cfg = kn_fx_get(&fx, "cfg");
    REQUIRE(ids && lf && lb && cfg && cfg->numel == 8 && ids->ndim == 3, "fixture lacks a tensor");
    int64_t V = (int64_t)cfg->v[0], T = (int64_t)cfg->v[1], C = (int64_t)cfg->v[2], B = (int64_t)cfg->v[5];
    int L = (int)cfg->v[3], H = (int)cfg->v[4], steps = (int)lf->numel;
    REQUIRE(steps <= 64 && ids->shape[0] == steps && ids->shape[1] == B && ids->shape[2] == T + 1, "fixture shapes");
    kn_precision ps[2] = {KN_PREC_F32, KN_PREC_BF16};
    double got[2][64];
    int64_t *xin = malloc(sizeof(int64_t) * (size_t)(B * T)), *yin = malloc(sizeof(int64_t) * (size_t)(B * T));
    REQUIRE(xin && yin, "out of memory");
    for (int k = 0; k < 2; k++) {
        kn_ctx *ctx = kn_ctx_new(NULL);
        char why[512];
        if (k == 1 && !prec_ok(ctx, KN_PREC_BF16, why, sizeof why)) {
            kn_ctx_free(ctx); kn_fx_free(&fx); free(xin); free(yin);
            SKIP("%s", why);
        }
        kn_gpt2_cfg gc = {.vocab = V, .max_seq = T, .dim = C, .n_layers = L, .n_heads = H, .dropout = 0};
        kn_module *net = kn_gpt2_new(ctx, &gc);
        REQUIRE(net && !kn_module_set_precision(net, ps[k]), "%s", kn_last_error());
        int loaded = 0;
        for (int i = 0; i < fx.n; i++) {
            if (strncmp(fx.t[i].name, "w.", 2)) continue;
            REQUIRE(!kn_module_load_param(net, fx.t[i].name + 2, fx.t[i].v, KN_F64), "%s: %s", fx.t[i].name, kn_last_error());
            loaded++;
        }
        CHECK(loaded == kn_module_named_params(net, false, NULL, 0), "loaded %d of %d parameters", loaded,
              kn_module_named_params(net, false, NULL, 0));
        kn_tensor *x = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T}), *y = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T});
        kn_tensor *loss = kn_cross_entropy(ctx, kn_gpt2_forward(net, x), y, NULL);
        REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
        kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
        oc.lr = cfg->v[6];
        oc.weight_decay = cfg->v[7];
        kn_optim *o = kn_optim_new(ctx, net, &oc);
        kn_tensor *outs[256];
        outs[0] = loss;
        int ne = kn_optim_build(o, NULL, outs + 1, 255);
        kn_plan *plan = ne >= 0 ? kn_plan_new(ctx, 1 + ne, outs, NULL) : NULL;
        REQUIRE(plan, "%s", kn_last_error());
        for (int s = 0; s < steps; s++) {
            for (int64_t r = 0; r < B; r++)
                for (int64_t t = 0; t < T; t++) {
                    xin[r * T + t] = (int64_t)ids->v[(s * B + r) * (T + 1) + t];
                    yin[r * T + t] = (int64_t)ids->v[(s * B + r) * (T + 1) + t + 1];
                }
            REQUIRE(!kn_tensor_write(x, xin, KN_I64) && !kn_tensor_write(y, yin, KN_I64), "%s", kn_last_error());
            REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(plan), "%s", kn_last_error());
            got[k][s] = kn_item(loss);
        }
        kn_plan_free(plan); kn_optim_free(o); kn_module_free(net); kn_ctx_free(ctx);
    }
    double e32 = 0, e16 = 0, gap = 0, own = 0;
    for (int s = 0; s < steps; s++) {
        e32 = fmax(e32, fabs(got[0][s] - lf->v[s]));
        e16 = fmax(e16, fabs(got[1][s] - lb->v[s]));
        gap = fmax(gap, fabs(lb->v[s] - lf->v[s]));
        own = fmax(own, fabs(got[1][s] - got[0][s]));
    }
    fprintf(stderr, "  GPT-2 losses vs torch over %d steps (%.3f -> %.3f): f32 %.2e, bf16 %.2e (torch's bf16-f32 gap %.2e, "
            "kiln's %.2e)\n", steps, lf->v[0], lf->v[steps - 1], e32, e16, gap, own);
    CHECK(lf->v[steps - 1] < 0.8 * lf->v[0], "the reference run does not learn: %g -> %g", lf->v[0], lf->v[steps - 1]);
    CHECK(e32 < 2e-4, "f32 losses differ from torch's by %g", e32);
    /* within bf16 rounding of torch's run: measured 8.4e-4 (torch's own
     * bf16-f32 gap 6.9e-4) on losses of 2.5-4.2, so 2.5e-3 (3x) leaves room
     * for platform differences and catches a policy that rounds elsewhere */
    CHECK(e16 < 2.5e-3, "bf16 losses differ from torch autocast's by %g", e16);
    CHECK(own > 0, "kiln's bf16 losses equal its f32 losses: the policy did nothing");
    kn_fx_free(&fx);
    free(xin); free(yin);
}

KN_TEST_MAIN()
