/* test_torch_golden.c: kiln vs PyTorch on composite computations (issue 2).
 *
 * tests/torch_refs.py computes five small cases in PyTorch (float64) and
 * writes inputs, outputs and gradients to tests/fixtures/golden_*.bin (KNFX
 * format, read with kn_fixture.h). Each case here rebuilds the computation
 * from kiln ops, takes gradients with kn_backward / kn_gradients, and compares
 * every named result with PyTorch's, in three configurations:
 *   ref backend, f64   tolerance 1e-10 (the oracle must match torch exactly)
 *   cpu backend, f64   tolerance 1e-10
 *   cpu backend, f32   tolerance 1e-5  (inputs rounded to f32)
 * The error of a result is max(||a-b|| / ||b||, max|a-b| / max|b|), so one
 * wrong element in a large tensor is not averaged away. Run with KN_CPU=scalar
 * to cover the scalar paths of the cpu backend.
 *
 * Regenerate the fixtures: . scripts/torch_env.sh; python3 tests/torch_refs.py
 */
#include <unistd.h>
#include "kn_test.h"
#include "kn_fixture.h"
#include "kiln.h"

/* ---- harness ------------------------------------------------------------------- */

#define G_MAX 96

/* One build of one case: the context, the float dtype, the fixture, and
 * the list of (fixture name, kiln tensor) pairs to compare. */
typedef struct golden {
    kn_ctx *ctx;
    kn_dtype dt;
    const kn_fx *fx;
    int n;
    char name[G_MAX][64];     /* fixture name; "" = expect all zeros */
    char scale[G_MAX][64];    /* "" or a fixture tensor whose max |.| is the error's scale */
    kn_tensor *t[G_MAX];
    bool bad;                 /* a fixture tensor was missing */
} golden;

/* Float fixture tensor `name` as a kiln tensor of g->dt (requires grad if asked). */
static kn_tensor *g_in(golden *g, const char *name, bool grad) {
    const kn_fx_tensor *f = kn_fx_get(g->fx, name);
    if (!f) { fprintf(stderr, "  fixture has no tensor %s\n", name); g->bad = true; return NULL; }
    kn_tensor *t = kn_fx_tensor_new(g->ctx, f, g->dt);
    if (t && grad) kn_set_requires_grad(t, true);
    return t;
}
/* Integer fixture tensor as kiln dtype dt. */
static kn_tensor *g_int(golden *g, const char *name, kn_dtype dt) {
    const kn_fx_tensor *f = kn_fx_get(g->fx, name);
    if (!f) { fprintf(stderr, "  fixture has no tensor %s\n", name); g->bad = true; return NULL; }
    return kn_fx_tensor_new(g->ctx, f, dt);
}
static double g_hp(golden *g, const char *name) {
    const kn_fx_tensor *f = kn_fx_get(g->fx, name);
    if (!f || f->numel != 1) { fprintf(stderr, "  fixture has no scalar %s\n", name); g->bad = true; return NAN; }
    return f->v[0];
}
/* Compare kiln tensor t with fixture tensor `name` (NULL: t must be all zeros). */
static void g_want(golden *g, const char *name, kn_tensor *t) {
    if (g->n >= G_MAX) { fprintf(stderr, "  too many results (G_MAX)\n"); g->bad = true; return; }
    snprintf(g->name[g->n], sizeof g->name[0], "%s", name ? name : "");
    g->scale[g->n][0] = 0;
    g->t[g->n++] = t;
}
/* Like g_want for a result that is zero in exact arithmetic (torch's value is
 * rounding noise): the error is max|a-b| / max|scale_name|, an absolute test
 * at the magnitude of a related result. */
static void g_want_near_zero(golden *g, const char *name, kn_tensor *t, const char *scale_name) {
    g_want(g, name, t);
    if (g->n && g->t[g->n - 1] == t) snprintf(g->scale[g->n - 1], sizeof g->scale[0], "%s", scale_name);
}

typedef void (*golden_build)(golden *g);

typedef struct gconf { const char *label; kn_backend *(*be)(void); kn_dtype dt; double tol; } gconf;

/* Build the case on each configuration and compare every registered result. */
static void golden_run(const char *file, golden_build build) {
    kn_fx fx;
    if (kn_fx_load(file, &fx)) { CHECK(0, "%s", kn_fx_error()); return; }
    const gconf confs[] = {
        {"ref/f64", kn_backend_ref, KN_F64, 1e-10},
        {"cpu/f64", kn_backend_cpu, KN_F64, 1e-10},
        {"cpu/f32", kn_backend_cpu, KN_F32, 1e-5},
    };
    for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
        kn_ctx_opts o = {confs[c].be()};
        golden g = {0};
        g.ctx = kn_ctx_new(&o); g.dt = confs[c].dt; g.fx = &fx;
        if (!g.ctx) { CHECK(0, "out of memory"); break; }
        build(&g);
        CHECK(!g.bad, "%s %s: fixture incomplete", file, confs[c].label);
        CHECK(kn_ctx_status(g.ctx) == KN_OK, "%s %s: building the graph failed: %s", file, confs[c].label, kn_last_error());
        double worst = 0; const char *worst_name = "-";
        for (int i = 0; i < g.n; i++) {
            const char *nm = g.name[i][0] ? g.name[i] : "(zeros)";
            kn_tensor *t = g.t[i];
            const kn_fx_tensor *ref = g.name[i][0] ? kn_fx_get(&fx, g.name[i]) : NULL;
            if (!t) { CHECK(0, "%s %s: %s: kiln result is NULL (%s)", file, confs[c].label, nm, kn_last_error()); continue; }
            if (g.name[i][0] && !ref) { CHECK(0, "%s %s: fixture has no %s", file, confs[c].label, nm); continue; }
            int64_t n = kn_numel(t);
            bool shape_ok = !ref || (ref->numel == n && ref->ndim == t->ndim);
            for (int d = 0; ref && shape_ok && d < t->ndim; d++) shape_ok = ref->shape[d] == t->shape[d];
            if (!shape_ok) { CHECK(0, "%s %s: %s: shape differs from torch's", file, confs[c].label, nm); continue; }
            double *a = malloc(sizeof(double) * (size_t)(n ? n : 1)), *z = NULL;
            kn_status st = kn_tensor_read(t, a, KN_F64);
            if (st != KN_OK) { CHECK(0, "%s %s: %s: read failed: %s", file, confs[c].label, nm, kn_last_error()); free(a); continue; }
            const double *b = ref ? ref->v : (z = calloc((size_t)(n ? n : 1), sizeof(double)));
            const kn_fx_tensor *sc = g.scale[i][0] ? kn_fx_get(&fx, g.scale[i]) : NULL;
            if (g.scale[i][0] && !sc) { CHECK(0, "%s %s: fixture has no %s", file, confs[c].label, g.scale[i]); free(a); free(z); continue; }
            double e = sc ? 0 : kn_rel_err(a, b, n), mx = 0, mref = 0;
            for (int64_t k = 0; k < n; k++) {
                double d = fabs(a[k] - b[k]);
                if (isnan(a[k]) || isnan(b[k])) d = INFINITY;
                if (d > mx) mx = d;
                if (!sc && fabs(b[k]) > mref) mref = fabs(b[k]);
            }
            for (int64_t k = 0; sc && k < sc->numel; k++) if (fabs(sc->v[k]) > mref) mref = fabs(sc->v[k]);
            double em = mx / (mref > 1e-300 ? mref : 1.0);
            if (em > e) e = em;
            if (!(e <= confs[c].tol)) {
                int64_t k0 = 0;
                for (int64_t k = 0; k < n; k++) if (!(fabs(a[k] - b[k]) <= fabs(a[k0] - b[k0]))) k0 = k;
                CHECK(0, "%s %s: %s: rel err %.3g > %.0e (worst at [%lld]: kiln %.10g torch %.10g)", file, confs[c].label, nm,
                      e, confs[c].tol, (long long)k0, n ? a[k0] : 0.0, n ? b[k0] : 0.0);
            }
            if (!(e <= worst)) { worst = e; worst_name = nm; }
            free(a); free(z);
        }
        printf("#   %-32s %s: %2d results, worst rel err %.2e (%s)\n", file, confs[c].label, g.n, worst, worst_name);
        kn_ctx_free(g.ctx);
    }
    kn_fx_free(&fx);
}

/* ---- 1. MLP training step ----------------------------------------------------------
 * x [8,20] -> linear(20,32) -> gelu -> linear(32,10) -> cross-entropy vs labels y
 * (cross-entropy = -mean(log_softmax(logits) gathered at y)); kn_backward; SGD
 * step p - lr * grad with kiln ops; the loss of the stepped parameters. */
static kn_tensor *mlp_fwd(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_tensor **p, kn_tensor **logits) {
    kn_tensor *l = kn_linear(ctx, kn_gelu(ctx, kn_linear(ctx, x, p[0], p[1])), p[2], p[3]);
    if (logits) *logits = l;
    int64_t ys[2] = {8, 1};
    kn_tensor *picked = kn_gather(ctx, kn_log_softmax(ctx, l, 1), 1, kn_reshape(ctx, y, 2, ys));
    return kn_neg(ctx, kn_mean_all(ctx, picked));
}
static void build_mlp(golden *g) {
    kn_ctx *ctx = g->ctx;
    static const char *pn[4] = {"w1", "b1", "w2", "b2"};
    kn_tensor *x = g_in(g, "in.x", false), *y = g_int(g, "in.y", KN_I64), *p[4];
    for (int i = 0; i < 4; i++) {
        char nm[32]; snprintf(nm, sizeof nm, "in.%s", pn[i]);
        const kn_fx_tensor *f = kn_fx_get(g->fx, nm);
        if (!f) { g->bad = true; return; }
        p[i] = kn_param(ctx, g->dt, f->ndim, f->shape);          /* parameters the usual way */
        if (!p[i] || kn_tensor_write(p[i], f->v, KN_F64) != KN_OK) { g->bad = true; return; }
    }
    double lr = g_hp(g, "hp.lr");
    kn_tensor *logits = NULL, *loss = mlp_fwd(ctx, x, y, p, &logits);
    g_want(g, "out.logits", logits);
    g_want(g, "out.loss", loss);
    if (kn_backward(ctx, loss) != KN_OK) { g->bad = true; return; }
    kn_tensor *np[4];
    kn_no_grad_begin(ctx);
    for (int i = 0; i < 4; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "grad.%s", pn[i]); g_want(g, nm, kn_grad(p[i]));
        np[i] = kn_sub(ctx, p[i], kn_mul_scalar(ctx, kn_grad(p[i]), lr));
        snprintf(nm, sizeof nm, "step.%s", pn[i]); g_want(g, nm, np[i]);
    }
    g_want(g, "out.loss_after", mlp_fwd(ctx, x, y, np, NULL));
    kn_no_grad_end(ctx);
}
TEST(golden_mlp_step) { golden_run("tests/fixtures/golden_mlp.bin", build_mlp); }

/* Three training steps as ONE plan replayed three times: x, y are plan inputs
 * (a new batch each run), SGD with momentum updates the parameters and the
 * momentum buffers in place with kn_assign (so the plan must run every update
 * after every read of the old value). Compared: each step's loss and the
 * parameters after the third step (torch.optim.SGD, momentum 0.9). */
static void build_mlp_train(golden *g) {
    kn_ctx *ctx = g->ctx;
    static const char *pn[4] = {"w1", "b1", "w2", "b2"};
    const kn_fx_tensor *fxs = kn_fx_get(g->fx, "train.x"), *fys = kn_fx_get(g->fx, "train.y");
    if (!fxs || !fys || fxs->ndim != 3 || fys->ndim != 2) { g->bad = true; return; }
    const int64_t xs[2] = {fxs->shape[1], fxs->shape[2]}, ysh[1] = {fys->shape[1]};
    int nstep = (int)fxs->shape[0];
    kn_tensor *x = kn_input(ctx, g->dt, 2, xs), *y = kn_input(ctx, KN_I64, 1, ysh), *p[4], *buf[4];
    for (int i = 0; i < 4; i++) {
        char nm[32]; snprintf(nm, sizeof nm, "in.%s", pn[i]);
        const kn_fx_tensor *f = kn_fx_get(g->fx, nm);
        if (!f) { g->bad = true; return; }
        p[i] = kn_param(ctx, g->dt, f->ndim, f->shape);
        buf[i] = kn_empty(ctx, g->dt, f->ndim, f->shape);
        double *zero = calloc((size_t)f->numel, sizeof(double));
        bool ok = p[i] && buf[i] && zero && kn_tensor_write(p[i], f->v, KN_F64) == KN_OK && kn_tensor_write(buf[i], zero, KN_F64) == KN_OK;
        free(zero);
        if (!ok) { g->bad = true; return; }
    }
    double lr = g_hp(g, "hp.lr"), mom = g_hp(g, "hp.momentum");
    kn_tensor *loss = mlp_fwd(ctx, x, y, p, NULL);
    if (kn_backward(ctx, loss) != KN_OK) { g->bad = true; return; }
    kn_tensor *outs[9] = {loss};
    kn_no_grad_begin(ctx);
    for (int i = 0; i < 4; i++) {
        kn_tensor *nb = kn_add(ctx, kn_mul_scalar(ctx, buf[i], mom), kn_grad(p[i]));   /* torch: buf = m buf + g */
        outs[1 + 2 * i] = kn_assign(ctx, p[i], kn_sub(ctx, p[i], kn_mul_scalar(ctx, nb, lr)));
        outs[2 + 2 * i] = kn_assign(ctx, buf[i], nb);
    }
    kn_no_grad_end(ctx);
    kn_plan *plan = kn_plan_new(ctx, 9, outs, NULL);
    if (!plan) { CHECK(0, "plan: %s", kn_last_error()); g->bad = true; return; }
    int64_t nx = xs[0] * xs[1];
    kn_tensor *losses = kn_empty(ctx, g->dt, 1, (int64_t[]){nstep});
    double *lv = calloc((size_t)nstep, sizeof(double));
    for (int s = 0; s < nstep && lv; s++) {
        if (kn_tensor_write(x, fxs->v + s * nx, KN_F64) != KN_OK || kn_tensor_write(y, fys->v + s * ysh[0], KN_F64) != KN_OK ||
            kn_plan_run(plan) != KN_OK) { CHECK(0, "step %d: %s", s, kn_last_error()); g->bad = true; break; }
        lv[s] = kn_item(loss);
    }
    if (lv) kn_tensor_write(losses, lv, KN_F64);
    free(lv);
    kn_plan_free(plan);
    g_want(g, "train.loss", losses);
    for (int i = 0; i < 4; i++) { char nm[32]; snprintf(nm, sizeof nm, "train.%s", pn[i]); g_want(g, nm, p[i]); }
}
TEST(golden_mlp_train_plan) { golden_run("tests/fixtures/golden_mlp.bin", build_mlp_train); }

/* ---- 2. conv-net step -------------------------------------------------------------------
 * x [2,3,12,12] -> conv(3->6,k3,s1,p1) -> relu -> maxpool 2 -> conv(6->8,k3,s2,p1,g2)
 * -> batch_norm(training) -> silu -> adaptive avg pool 1 -> flatten -> linear(8,5)
 * -> mse vs target; gradients of the input and every parameter. */
static void build_conv(golden *g) {
    kn_ctx *ctx = g->ctx;
    static const char *ln[9] = {"x", "c1w", "c1b", "c2w", "c2b", "bnw", "bnb", "lw", "lb"};
    kn_tensor *L[9];
    for (int i = 0; i < 9; i++) { char nm[32]; snprintf(nm, sizeof nm, "in.%s", ln[i]); L[i] = g_in(g, nm, true); }
    kn_tensor *tgt = g_in(g, "in.target", false);
    double eps = g_hp(g, "hp.eps");
    const int one[2] = {1, 1}, two[2] = {2, 2}, zero[2] = {0, 0};
    kn_tensor *h = kn_relu(ctx, kn_conv2d(ctx, L[0], L[1], L[2], one, one, one, 1));
    h = kn_max_pool2d(ctx, h, two, two, zero, one, false);
    h = kn_conv2d(ctx, h, L[3], L[4], two, one, one, 2);
    h = kn_silu(ctx, kn_batch_norm(ctx, h, NULL, NULL, L[5], L[6], true, eps));
    h = kn_flatten(ctx, kn_adaptive_avg_pool2d(ctx, h, 1, 1), 1, 3);
    kn_tensor *y = kn_linear(ctx, h, L[7], L[8]);
    kn_tensor *loss = kn_mean_all(ctx, kn_square(ctx, kn_sub(ctx, y, tgt)));
    g_want(g, "out.y", y);
    g_want(g, "out.loss", loss);
    kn_tensor *gr[9] = {0};
    if (kn_gradients(ctx, 1, &loss, NULL, 9, L, gr) != KN_OK) { g->bad = true; return; }
    for (int i = 0; i < 9; i++) {
        char nm[32]; snprintf(nm, sizeof nm, "grad.%s", ln[i]);
        /* batch norm subtracts the per-channel mean, so conv2's bias has no
         * effect: its gradient is 0 and torch's value is rounding noise */
        if (!strcmp(ln[i], "c2b")) g_want_near_zero(g, nm, gr[i], "grad.c2w");
        else g_want(g, nm, gr[i]);
    }
}
TEST(golden_conv_step) { golden_run("tests/fixtures/golden_conv.bin", build_conv); }

/* ---- 3. attention ------------------------------------------------------------------------------
 * a) q [B,T,Hq,D] / k [B,T,Hkv,D] transposed to [B,H,T,D] views, v [B,Hkv,T,D];
 *    causal GQA sdpa; loss sum(o * wo).  b) Tq 3 < Tk 5, causal (bottom-right),
 *    GQA 4:1, scale 0.3.  c) as b) without the mask. */
static void attn_case(golden *g, const char *tag, bool bthd, bool causal, double scale) {
    kn_ctx *ctx = g->ctx;
    char nq[32], nk[32], nv[32], nm[48];
    snprintf(nq, sizeof nq, bthd ? "in.%s.q_bthd" : "in.%s.q", tag);
    snprintf(nk, sizeof nk, bthd ? "in.%s.k_bthd" : "in.%s.k", tag);
    snprintf(nv, sizeof nv, "in.%s.v", tag);
    kn_tensor *L[3] = {g_in(g, nq, true), g_in(g, nk, true), g_in(g, nv, true)};
    snprintf(nm, sizeof nm, "in.%s.wo", tag);
    kn_tensor *wo = g_in(g, nm, false);
    kn_tensor *q = bthd ? kn_transpose(ctx, L[0], 1, 2) : L[0], *k = bthd ? kn_transpose(ctx, L[1], 1, 2) : L[1];
    kn_tensor *o = kn_sdpa(ctx, q, k, L[2], causal, scale);
    snprintf(nm, sizeof nm, "out.%s.o", tag); g_want(g, nm, o);
    kn_tensor *loss = kn_sum_all(ctx, kn_mul(ctx, o, wo)), *gr[3] = {0};
    if (kn_gradients(ctx, 1, &loss, NULL, 3, L, gr) != KN_OK) { g->bad = true; return; }
    for (int i = 0; i < 3; i++) {
        const char *in = i == 0 ? nq : i == 1 ? nk : nv;
        snprintf(nm, sizeof nm, "grad.%s", in + 3);
        g_want(g, nm, gr[i]);
    }
}
static void build_attn(golden *g) {
    attn_case(g, "a", true, true, 0);
    attn_case(g, "b", false, true, 0.3);
    attn_case(g, "c", false, false, 0.3);
}
TEST(golden_attention) { golden_run("tests/fixtures/golden_attn.bin", build_attn); }

/* ---- 4. norm / softmax / reduction chains ------------------------------------------------------
 * x [3,5,16]; seven scalar terms (see torch_refs.py), each with its own
 * gradients w.r.t. x, w, b, wr (torch gives none where a term does not use a
 * leaf: kiln must give NULL or zeros there). */
static kn_tensor *norm_term(golden *g, int i, kn_tensor **L, kn_tensor *y, kn_tensor *z, kn_tensor *u) {
    kn_ctx *ctx = g->ctx;
    kn_tensor *x = L[0];
    switch (i) {
    case 0: return kn_sum_all(ctx, kn_mul(ctx, kn_softmax(ctx, kn_layer_norm(ctx, x, 1, L[1], L[2], g_hp(g, "hp.eps_ln")), 2), y));
    case 1: return kn_sum_all(ctx, kn_mul(ctx, kn_log_softmax(ctx, kn_rms_norm(ctx, x, 1, L[3], g_hp(g, "hp.eps_rms")), 1), z));
    case 2: {
        const int perm[3] = {2, 0, 1}, ax[1] = {2};
        kn_tensor *s = kn_slice(ctx, kn_permute(ctx, x, perm), 0, 1, 13, 3);
        return kn_sum_all(ctx, kn_logsumexp(ctx, s, 1, ax, false));
    }
    case 3: {
        const int64_t es[3] = {3, 5, 16};
        const int ax[2] = {0, 2};
        kn_tensor *e = kn_expand(ctx, kn_slice(ctx, x, 1, 2, 3, 1), 3, es);
        return kn_sum_all(ctx, kn_var(ctx, kn_mul(ctx, x, e), 2, ax, 1, false));
    }
    case 4: {
        const int ax[1] = {2};
        return kn_sum_all(ctx, kn_mul(ctx, kn_std(ctx, kn_transpose(ctx, x, 1, 2), 1, ax, 0, false), u));
    }
    case 5: { const int ax[1] = {2}; return kn_sum_all(ctx, kn_norm(ctx, x, 3, 1, ax, false)); }
    default: { const int ax[1] = {-1}; return kn_sum_all(ctx, kn_mul(ctx, kn_var(ctx, x, 1, ax, 2, true), x)); }
    }
}
static void build_norm(golden *g) {
    static const char *ln[4] = {"x", "w", "b", "wr"};
    kn_tensor *L[4];
    for (int i = 0; i < 4; i++) { char nm[32]; snprintf(nm, sizeof nm, "in.%s", ln[i]); L[i] = g_in(g, nm, true); }
    kn_tensor *y = g_in(g, "in.y", false), *z = g_in(g, "in.z", false), *u = g_in(g, "in.u", false);
    for (int i = 0; i < 7; i++) {
        char nm[48];
        kn_tensor *t = norm_term(g, i, L, y, z, u), *gr[4] = {0};
        snprintf(nm, sizeof nm, "out.t%d", i + 1); g_want(g, nm, t);
        if (!t || kn_gradients(g->ctx, 1, &t, NULL, 4, L, gr) != KN_OK) { g->bad = true; return; }
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "grad.t%d.%s", i + 1, ln[k]);
            if (kn_fx_get(g->fx, nm)) g_want(g, nm, gr[k]);
            else if (gr[k]) g_want(g, NULL, gr[k]);
        }
    }
}
TEST(golden_norm_chains) { golden_run("tests/fixtures/golden_norm.bin", build_norm); }

/* ---- 5. rope, embedding and index chains -----------------------------------------------------------
 * E [11,16], ids [2,5] -> embedding -> view [2,5,2,8] -> transpose [2,2,5,8]
 * (B,H,T,D) -> rope interleaved (n_rot 6, theta 1e4, pos 3..7) = r1 -> rope
 * neox (n_rot 8, theta 500, freq_scale 0.25) = r2 -> index_select(dim 2,
 * [4,0,0,2]) -> gather(dim 3) = g -> scatter_add(base, 3, gidx, g*g) = s;
 * loss = sum(s * ws) + sum(r1 * wr). */
static void build_rope(golden *g) {
    kn_ctx *ctx = g->ctx;
    kn_tensor *E = g_in(g, "in.E", true), *base = g_in(g, "in.base", true);
    kn_tensor *ids = g_int(g, "in.ids", KN_I64), *pos = g_int(g, "in.pos", KN_I32);
    kn_tensor *isel = g_int(g, "in.isel", KN_I64), *gidx = g_int(g, "in.gidx", KN_I64);
    kn_tensor *ws = g_in(g, "in.ws", false), *wr = g_in(g, "in.wr", false);
    const int64_t hs[4] = {2, 5, 2, 8};
    kn_tensor *h = kn_transpose(ctx, kn_reshape(ctx, kn_embedding(ctx, E, ids), 4, hs), 1, 2);
    kn_tensor *r1 = kn_rope(ctx, h, pos, 6, 10000.0, false, 1.0);
    kn_tensor *r2 = kn_rope(ctx, r1, pos, 8, 500.0, true, 0.25);
    kn_tensor *gg = kn_gather(ctx, kn_index_select(ctx, r2, 2, isel), 3, gidx);
    kn_tensor *s = kn_scatter_add(ctx, base, 3, gidx, kn_mul(ctx, gg, gg));
    kn_tensor *loss = kn_add(ctx, kn_sum_all(ctx, kn_mul(ctx, s, ws)), kn_sum_all(ctx, kn_mul(ctx, r1, wr)));
    g_want(g, "out.r1", r1); g_want(g, "out.r2", r2); g_want(g, "out.g", gg);
    g_want(g, "out.s", s); g_want(g, "out.loss", loss);
    kn_tensor *L[2] = {E, base}, *gr[2] = {0};
    if (kn_gradients(ctx, 1, &loss, NULL, 2, L, gr) != KN_OK) { g->bad = true; return; }
    g_want(g, "grad.E", gr[0]); g_want(g, "grad.base", gr[1]);
}
TEST(golden_rope_index) { golden_run("tests/fixtures/golden_rope.bin", build_rope); }

/* ---- 6. more nn ops --------------------------------------------------------------------------------
 * x [1,4,5,5]; seven terms sum(f_k(...) * r_k) (see torch_refs.py): conv_transpose2d,
 * avg_pool2d (ceil, padding not counted) + group_norm + gelu_tanh, dilated
 * max_pool2d (ceil) + softplus, an activation mix, cumsum * cumprod,
 * reflect/replicate pad + dilated grouped conv1d, where/tril/masked_fill/clamp. */
static kn_tensor *misc_term(golden *g, int i, kn_tensor **L) {
    kn_ctx *ctx = g->ctx;
    kn_tensor *x = L[0];
    const int one[2] = {1, 1}, two[2] = {2, 2}, three[2] = {3, 3};
    switch (i) {
    case 0: case 1: {
        kn_tensor *ct = kn_conv_transpose2d(ctx, x, L[1], L[2], two, one, one, one, 2);
        if (i == 0) return ct;
        kn_tensor *a = kn_avg_pool2d(ctx, ct, three, two, one, true, false);
        return kn_gelu_tanh(ctx, kn_group_norm(ctx, a, 3, L[3], L[4], 1e-5));
    }
    case 2: return kn_softplus(ctx, kn_max_pool2d(ctx, x, three, one, one, two, true));
    case 3: {
        kn_tensor *y = kn_add(ctx, kn_mish(ctx, x), kn_mul(ctx, kn_elu(ctx, x, 0.7), kn_leaky_relu(ctx, x, 0.1)));
        y = kn_add(ctx, kn_add(ctx, y, kn_hardsigmoid(ctx, x)), kn_selu(ctx, x));
        return kn_sub(ctx, y, kn_hardtanh(ctx, x, -0.5, 0.8));
    }
    case 4: return kn_mul(ctx, kn_cumsum(ctx, x, 1), kn_cumprod(ctx, x, 3));
    case 5: {
        const int64_t p1[2] = {1, 2}, p2[4] = {0, 0, 2, 1};
        kn_tensor *p = kn_pad(ctx, kn_pad(ctx, x, 1, p1, KN_PAD_REFLECT, 0), 2, p2, KN_PAD_REPLICATE, 0);
        return kn_tanh(ctx, kn_conv1d(ctx, kn_flatten(ctx, p, 2, 3), L[5], NULL, 2, 2, 2, 2));
    }
    default: {
        kn_tensor *w = kn_where(ctx, kn_gt(ctx, x, kn_scalar(ctx, g->dt, 0.3)), kn_mul(ctx, x, x), kn_sin(ctx, x));
        kn_tensor *m = kn_masked_fill(ctx, kn_tril(ctx, w, 1), kn_lt(ctx, x, kn_scalar(ctx, g->dt, -1.5)), 0.25);
        return kn_clamp(ctx, m, -0.7, 1.2);
    }
    }
}
static void build_misc(golden *g) {
    static const char *ln[6] = {"x", "wt", "bt", "gw", "gb", "w1d"};
    kn_tensor *L[6];
    for (int i = 0; i < 6; i++) { char nm[32]; snprintf(nm, sizeof nm, "in.%s", ln[i]); L[i] = g_in(g, nm, true); }
    for (int i = 0; i < 7; i++) {
        char nm[48];
        snprintf(nm, sizeof nm, "in.rt%d", i + 1);
        kn_tensor *y = misc_term(g, i, L), *r = g_in(g, nm, false), *gr[6] = {0};
        kn_tensor *t = kn_sum_all(g->ctx, kn_mul(g->ctx, y, r));
        snprintf(nm, sizeof nm, "out.t%d", i + 1); g_want(g, nm, y);
        snprintf(nm, sizeof nm, "out.sumt%d", i + 1); g_want(g, nm, t);
        if (!t || kn_gradients(g->ctx, 1, &t, NULL, 6, L, gr) != KN_OK) { g->bad = true; return; }
        for (int k = 0; k < 6; k++) {
            snprintf(nm, sizeof nm, "grad.t%d.%s", i + 1, ln[k]);
            if (kn_fx_get(g->fx, nm)) g_want(g, nm, gr[k]);
            else if (gr[k]) g_want(g, NULL, gr[k]);
        }
    }
}
TEST(golden_misc_nn) { golden_run("tests/fixtures/golden_misc.bin", build_misc); }

/* ---- the fixture reader itself ----------------------------------------------------------------------- */
TEST(fixture_reader_rejects_bad_files) {
    kn_fx fx;
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/kn_golden_bad_%d.bin", dir && *dir ? dir : "/tmp", (int)getpid());
    CHECK(kn_fx_load("tests/fixtures/no_such_file.bin", &fx) != 0 && strstr(kn_fx_error(), "cannot open"), "missing file: %s", kn_fx_error());
    /* a valid one-tensor file, then corruptions of it */
    unsigned char good[64]; size_t n = 0;
    uint32_t u; int64_t s = 2; double v[2] = {1.5, -2};
    memcpy(good + n, "KNFX", 4); n += 4;
    u = 1; memcpy(good + n, &u, 4); n += 4;
    u = 1; memcpy(good + n, &u, 4); n += 4;
    u = 1; memcpy(good + n, &u, 4); n += 4; good[n++] = 'a';
    u = 0; memcpy(good + n, &u, 4); n += 4;
    u = 1; memcpy(good + n, &u, 4); n += 4;
    memcpy(good + n, &s, 8); n += 8;
    memcpy(good + n, v, 16); n += 16;
    struct { const char *what; size_t at, len; unsigned char byte; const char *msg; } cases[] = {
        {"valid", n, n, 0, NULL},
        {"bad magic", 0, n, 'X', "magic"},
        {"bad version", 4, n, 9, "version"},
        {"truncated", n, n - 3, 0, "truncated"},
        {"bad dtype", 17, n, 7, "dtype"},
        {"trailing", n, n + 1, 0, "trailing"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char buf[80];
        memcpy(buf, good, n); buf[n] = 0;
        if (cases[c].at < n) buf[cases[c].at] = cases[c].byte;
        FILE *f = fopen(path, "wb");
        REQUIRE(f, "cannot write %s", path);
        fwrite(buf, 1, cases[c].len, f); fclose(f);
        int rc = kn_fx_load(path, &fx);
        if (!cases[c].msg) {
            CHECK(rc == 0, "valid file rejected: %s", kn_fx_error());
            const kn_fx_tensor *t = rc ? NULL : kn_fx_get(&fx, "a");
            CHECK(t && t->ndim == 1 && t->shape[0] == 2 && t->v[0] == 1.5 && t->v[1] == -2, "valid file misread");
            CHECK(rc || !kn_fx_get(&fx, "b"), "kn_fx_get found a tensor that is not there");
            kn_fx_free(&fx);
        } else {
            CHECK(rc != 0 && strstr(kn_fx_error(), cases[c].msg), "%s: rc %d, error '%s'", cases[c].what, rc, kn_fx_error());
        }
    }
    remove(path);
}

KN_TEST_MAIN()
