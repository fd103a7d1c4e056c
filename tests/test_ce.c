/* test_ce.c: the fused cross-entropy (CROSS_ENTROPY, CROSS_ENTROPY_BWD;
 * src/graph/ops_loss.c) against
 *  - the composite (KN_CE_COMPOSITE=1: log_softmax, gather, masks) on the
 *    reference backend, f64 logits: loss and gradient to 1e-12;
 *  - central finite differences of the loss (reference, f64);
 *  - the reference kernel, on the fast CPU backend and (built with CUDA, on
 *    a GPU) the CUDA backend: f32/bf16/f16 logits, odd C (7, 1001, 50257),
 *    C % 8 == 0, C == 1, odd N, ignored rows, label smoothing;
 *  - PyTorch's F.cross_entropy (tests/fixtures/ce_torch.bin from
 *    scripts/ce_ref.py): mean and per-row losses, the gradient;
 * and the edges: every row ignored (mean NaN like torch, gradient 0), a
 * target out of range (an error naming the op and the target, and neither
 * the loss nor the gradient written), the gradient's row stride a multiple
 * of 8, and bf16 logits read before their cast to f32 (the mixed-precision
 * classifier). Letters: N rows, C classes. */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_nn.h"
#include "core/env.h"          // defines: kn_env_reload (KN_CE_COMPOSITE)
#include "graph/graph.h"       // defines: kn_tensor internals (view_src)
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif
#include <stdint.h>
#include <string.h>

#define SH(...) ((int64_t[]){__VA_ARGS__})

/* ---- one run: loss (reduced or per row) and d(loss)/d(logits) ---------------- */
typedef struct {
    int64_t N, C;
    kn_dtype dt;            /* logits dtype */
    int64_t ign;
    double ls;
    kn_reduction red;
    bool composite;         /* KN_CE_COMPOSITE=1 while building */
    bool cast;              /* logits given as kn_cast(x, f32) of x in dt */
} ce_case;

typedef struct {
    double *loss;           /* 1 value (mean/sum) or N */
    double *grad;           /* N*C, NULL for reduction none */
    kn_op grad_op;          /* op of the gradient's storage owner */
    int64_t grad_ld;        /* the gradient's row stride */
    kn_dtype grad_dt;
} ce_res;

static void res_free(ce_res *r) { free(r->loss); free(r->grad); memset(r, 0, sizeof *r); }

static void set_composite(bool on) {
    if (on) setenv("KN_CE_COMPOSITE", "1", 1);
    else unsetenv("KN_CE_COMPOSITE");
    kn_env_reload();
}

static double *rd(kn_tensor *t) {
    int64_t n = kn_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (kn_tensor_read(t, v, KN_F64) != KN_OK) { fprintf(stderr, "  read: %s\n", kn_last_error()); free(v); return NULL; }
    return v;
}

/* x: N*C values (written into dt, rounding), t: N targets */
static kn_status run_ce(kn_backend *be, const ce_case *c, const double *x, const int64_t *t, ce_res *r) {
    memset(r, 0, sizeof *r);
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    if (!ctx) return KN_ERR_STATE;
    kn_tensor *xt = kn_empty(ctx, c->dt, 2, SH(c->N, c->C));
    kn_status st = kn_tensor_write(xt, x, KN_F64);
    kn_set_requires_grad(xt, true);
    kn_tensor *tg = kn_from_data(ctx, KN_I64, 1, SH(c->N), t);
    kn_ce_opts o = kn_ce_defaults();
    o.ignore_index = c->ign; o.label_smoothing = c->ls; o.reduction = c->red;
    set_composite(c->composite);
    kn_tensor *loss = kn_cross_entropy(ctx, c->cast ? kn_cast(ctx, xt, KN_F32) : xt, tg, &o);
    set_composite(false);
    if (!st && !loss) st = kn_ctx_status(ctx);
    if (!st && c->red != KN_REDUCE_NONE) st = kn_backward(ctx, loss);
    if (!st && !(r->loss = rd(loss))) st = KN_ERR_INVALID;
    if (!st && c->red != KN_REDUCE_NONE) {
        kn_tensor *g = kn_grad(xt);
        if (!g || !(r->grad = rd(g))) st = KN_ERR_INVALID;
        else {
            kn_tensor *own = g->view_src ? g->view_src : g;
            r->grad_op = own->op; r->grad_ld = g->stride[0]; r->grad_dt = g->dtype;
        }
    }
    kn_ctx_free(ctx);
    if (st) res_free(r);
    return st;
}

static double rel(const double *a, const double *b, int64_t n) { return a && b ? kn_rel_err(a, b, n) : INFINITY; }

/* values exactly representable in dt (through a reference context) */
static void round_to(kn_dtype dt, double *v, int64_t n) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *t = kn_empty(ctx, dt, 1, SH(n));
    kn_tensor_write(t, v, KN_F64);
    kn_tensor_read(t, v, KN_F64);
    kn_ctx_free(ctx);
}

/* random logits in [-s, s] and targets in [0, C), every 4th row (and row 1) ignored */
static void make_data(int64_t N, int64_t C, double s, int64_t ign, double **x, int64_t **t) {
    *x = malloc(sizeof(double) * (size_t)(N * C));
    *t = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < N * C; i++) (*x)[i] = kn_test_uniform(-s, s);
    for (int64_t i = 0; i < N; i++) {
        (*t)[i] = (int64_t)floor(kn_test_uniform(0, (double)C));
        if ((*t)[i] >= C) (*t)[i] = C - 1;
        if (i % 4 == 3 || (i == 1 && N > 2)) (*t)[i] = ign;
    }
}

/* ---- the fused nodes against the composite (reference, f64) ------------------- */
TEST(ce_fused_matches_composite) {
    kn_test_seed(71);
    struct { int64_t N, C, ign; double ls; } cs[] = {{5, 7, -100, 0}, {9, 11, 2, 0.1}, {1, 1, -100, 0}, {7, 33, -1, 0.3}};
    kn_reduction reds[3] = {KN_REDUCE_MEAN, KN_REDUCE_SUM, KN_REDUCE_NONE};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        double *x; int64_t *t;
        make_data(cs[i].N, cs[i].C, 4, cs[i].ign, &x, &t);
        for (int k = 0; k < 3; k++) {
            ce_case c = {cs[i].N, cs[i].C, KN_F64, cs[i].ign, cs[i].ls, reds[k], false, false};
            ce_res f, p;
            REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &f) == KN_OK, "fused: %s", kn_last_error());
            c.composite = true;
            REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &p) == KN_OK, "composite: %s", kn_last_error());
            int64_t nl = reds[k] == KN_REDUCE_NONE ? cs[i].N : 1;
            CHECK(rel(f.loss, p.loss, nl) < 1e-12, "case %zu red %d: loss %g vs %g", i, k, f.loss[0], p.loss[0]);
            if (reds[k] != KN_REDUCE_NONE) {
                CHECK(rel(f.grad, p.grad, cs[i].N * cs[i].C) < 1e-12, "case %zu red %d: grad rel err %g", i, k,
                      rel(f.grad, p.grad, cs[i].N * cs[i].C));
                CHECK(f.grad_op == KN_OP_CROSS_ENTROPY_BWD && p.grad_op != KN_OP_CROSS_ENTROPY_BWD,
                      "case %zu: the fused gradient is one CROSS_ENTROPY_BWD node (%s), the composite's is not (%s)", i,
                      kn_op_name(f.grad_op), kn_op_name(p.grad_op));
                CHECK(cs[i].N == 1 || (f.grad_ld % 8 == 0 && f.grad_ld >= cs[i].C), "case %zu: gradient row stride %lld", i, (long long)f.grad_ld);
            }
            res_free(&f); res_free(&p);
        }
        free(x); free(t);
    }
}

/* ---- the gradient against central differences (reference, f64) ---------------- */
TEST(ce_gradient_finite_differences) {
    kn_test_seed(72);
    int64_t N = 3, C = 5;
    double *x; int64_t *t;
    make_data(N, C, 2, -100, &x, &t);
    t[1] = -100;
    for (int s = 0; s < 2; s++) {
        ce_case c = {N, C, KN_F64, -100, s ? 0.2 : 0, KN_REDUCE_MEAN, false, false};
        ce_res r;
        REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &r) == KN_OK, "%s", kn_last_error());
        double fd[15], h = 1e-5;
        for (int64_t i = 0; i < N * C; i++) {
            double keep = x[i], lp, lm;
            ce_res a, b;
            x[i] = keep + h;
            REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &a) == KN_OK, "%s", kn_last_error());
            x[i] = keep - h;
            REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &b) == KN_OK, "%s", kn_last_error());
            x[i] = keep;
            lp = a.loss[0]; lm = b.loss[0];
            fd[i] = (lp - lm) / (2 * h);
            res_free(&a); res_free(&b);
        }
        double e = rel(r.grad, fd, N * C);
        CHECK(e < 1e-8, "smoothing %g: gradient vs finite differences rel err %g", c.ls, e);
        for (int64_t j = 0; j < C; j++) CHECK(r.grad[C + j] == 0, "ignored row: gradient %g", r.grad[C + j]);
        res_free(&r);
    }
    free(x); free(t);
}

/* ---- a backend against the reference kernel and the f32 composite -------------- */
/* tolerances: the loss is f32 (f32 arithmetic against double); the gradient
 * is stored in the logits' dtype */
static double grad_tol(kn_dtype dt) { return dt == KN_BF16 ? 8e-3 : dt == KN_F16 ? 1.5e-3 : 2e-5; }

static void backend_vs_ref(kn_backend *be, const char *name) {
    kn_test_seed(73);
    kn_dtype dts[3] = {KN_F32, KN_BF16, KN_F16};
    struct { int64_t N, C; double s, ls; } cs[] = {{7, 7, 4, 0}, {3, 50257, 8, 0}, {5, 64, 3, 0.1}, {33, 1, 1, 0},
                                                  {9, 1001, 10, 0.05}, {2, 50257, 4, 0.1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int d = 0; d < 3; d++) {
            double *x; int64_t *t;
            int64_t N = cs[i].N, C = cs[i].C;
            make_data(N, C, cs[i].s, -100, &x, &t);
            round_to(dts[d], x, N * C);
            for (int k = 0; k < 2; k++) {
                kn_reduction red = k ? KN_REDUCE_NONE : KN_REDUCE_MEAN;
                ce_case c = {N, C, dts[d], -100, cs[i].ls, red, false, false};
                ce_res a, b, p;
                REQUIRE(run_ce(be, &c, x, t, &a) == KN_OK, "%s: %s", name, kn_last_error());
                REQUIRE(run_ce(kn_backend_ref(), &c, x, t, &b) == KN_OK, "ref: %s", kn_last_error());
                /* the composite on the same values in f32 (exact for bf16/f16 values) */
                ce_case cc = c;
                cc.dt = KN_F32; cc.composite = true;
                REQUIRE(run_ce(kn_backend_ref(), &cc, x, t, &p) == KN_OK, "composite: %s", kn_last_error());
                int64_t nl = red == KN_REDUCE_NONE ? N : 1;
                CHECK(rel(a.loss, b.loss, nl) < 5e-6, "%s %s N %lld C %lld ls %g red %d: loss rel err %g", name,
                      kn_dtype_name(dts[d]), (long long)N, (long long)C, cs[i].ls, k, rel(a.loss, b.loss, nl));
                CHECK(rel(a.loss, p.loss, nl) < 5e-6, "%s %s N %lld C %lld: loss vs composite rel err %g", name,
                      kn_dtype_name(dts[d]), (long long)N, (long long)C, rel(a.loss, p.loss, nl));
                if (red != KN_REDUCE_NONE) {
                    double e1 = rel(a.grad, b.grad, N * C), e2 = rel(a.grad, p.grad, N * C);
                    CHECK(e1 < grad_tol(dts[d]) && e2 < grad_tol(dts[d]), "%s %s N %lld C %lld ls %g: grad rel err %g (ref) %g (composite)",
                          name, kn_dtype_name(dts[d]), (long long)N, (long long)C, cs[i].ls, e1, e2);
                    CHECK(a.grad_dt == dts[d] && a.grad_ld % 8 == 0, "%s: gradient %s, row stride %lld", name,
                          kn_dtype_name(a.grad_dt), (long long)a.grad_ld);
                    for (int64_t j = 0; j < C && N > 3; j++) CHECK(a.grad[3 * C + j] == 0, "%s: ignored row 3 got %g", name, a.grad[3 * C + j]);
                }
                res_free(&a); res_free(&b); res_free(&p);
            }
            free(x); free(t);
        }
}
TEST(ce_cpu_vs_reference) { backend_vs_ref(kn_backend_cpu(), "cpu"); }

/* ---- the mixed-precision classifier: bf16 logits cast to f32 --------------------- */
TEST(ce_reads_bf16_before_the_cast) {
    kn_test_seed(74);
    int64_t N = 5, C = 37;
    double *x; int64_t *t;
    make_data(N, C, 4, -100, &x, &t);
    round_to(KN_BF16, x, N * C);
    ce_case c = {N, C, KN_BF16, -100, 0, KN_REDUCE_MEAN, false, true};
    ce_res a, p;
    REQUIRE(run_ce(kn_backend_cpu(), &c, x, t, &a) == KN_OK, "%s", kn_last_error());
    c.composite = true;
    REQUIRE(run_ce(kn_backend_cpu(), &c, x, t, &p) == KN_OK, "%s", kn_last_error());
    CHECK(a.grad_op == KN_OP_CROSS_ENTROPY_BWD && a.grad_dt == KN_BF16, "the gradient of the bf16 logits: %s %s",
          kn_op_name(a.grad_op), kn_dtype_name(a.grad_dt));
    CHECK(rel(a.loss, p.loss, 1) < 1e-6, "loss %g vs composite %g", a.loss[0], p.loss[0]);
    CHECK(rel(a.grad, p.grad, N * C) < grad_tol(KN_BF16), "grad rel err %g", rel(a.grad, p.grad, N * C));
    res_free(&a); res_free(&p);
    free(x); free(t);
}

/* ---- every row ignored: mean NaN (0/0, like torch), sum 0, gradient 0 ----------- */
static void all_ignored(kn_backend *be, const char *name) {
    int64_t N = 3, C = 9, t[3] = {-100, -100, -100};
    double x[27];
    for (int i = 0; i < 27; i++) x[i] = i * 0.1;
    for (int k = 0; k < 2; k++) {
        ce_case c = {N, C, k ? KN_BF16 : KN_F32, -100, 0, k ? KN_REDUCE_SUM : KN_REDUCE_MEAN, false, false};
        ce_res r;
        REQUIRE(run_ce(be, &c, x, t, &r) == KN_OK, "%s: %s", name, kn_last_error());
        CHECK(k ? r.loss[0] == 0 : isnan(r.loss[0]), "%s: %s over no rows = %g", name, k ? "sum" : "mean", r.loss[0]);
        bool zero = true;
        for (int i = 0; i < 27; i++) zero &= r.grad[i] == 0;
        CHECK(k == 0 || zero, "%s: gradient of the sum over no rows is 0", name);
        res_free(&r);
    }
}
TEST(ce_all_ignored) {
    all_ignored(kn_backend_ref(), "ref");
    all_ignored(kn_backend_cpu(), "cpu");
}

/* ---- a bad target: the message, and nothing written ----------------------------- */
/* A plan with persistent outputs: a good run, then bad targets: the run
 * fails naming the op and the target, and the outputs keep the good run's
 * values. fwd: the per-row loss; else the gradient node alone. */
static void bad_target(kn_backend *be, const char *name, bool fwd) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    int64_t N = 3, C = 10, good[3] = {1, -100, 9}, bad[3] = {1, 10, 2};
    double xv[30];
    for (int i = 0; i < 30; i++) xv[i] = sin(i);
    kn_tensor *x = kn_empty(ctx, KN_BF16, 2, SH(N, C));
    kn_tensor_write(x, xv, KN_F64);
    kn_set_requires_grad(x, true);
    kn_tensor *tg = kn_input(ctx, KN_I64, 1, SH(N));
    kn_tensor *loss = kn_cross_entropy_rows(ctx, x, tg, -100, 0), *out = loss;
    if (!fwd) {
        kn_tensor *seed = kn_ones(ctx, KN_F32, 1, SH(N)), *g = NULL;
        REQUIRE(kn_gradients(ctx, 1, &loss, &seed, 1, &x, &g) == KN_OK, "%s", kn_last_error());
        out = g;
    }
    kn_plan *p = kn_plan_new(ctx, 1, &out, NULL);
    REQUIRE(p, "%s: plan: %s", name, kn_last_error());
    int64_t n = kn_numel(out);
    double v0[30], v1[30];
    REQUIRE(kn_tensor_write(tg, good, KN_I64) == KN_OK && kn_plan_run(p) == KN_OK && kn_tensor_read(out, v0, KN_F64) == KN_OK,
            "%s: good run: %s", name, kn_last_error());
    kn_tensor_write(tg, bad, KN_I64);
    kn_status st = kn_plan_run(p);
    const char *msg = kn_last_error();
    CHECK(st == KN_ERR_INVALID && strstr(msg, fwd ? "cross_entropy" : "cross_entropy_bwd") && strstr(msg, "target 10") &&
          strstr(msg, "10 classes"), "%s %s: bad target gave %d: %s", name, fwd ? "fwd" : "bwd", (int)st, msg);
    CHECK(kn_tensor_read(out, v1, KN_F64) == KN_OK && !memcmp(v0, v1, sizeof(double) * (size_t)n),
          "%s %s: the output changed in a failed run", name, fwd ? "fwd" : "bwd");
    /* and the context keeps working */
    kn_tensor_write(tg, good, KN_I64);
    CHECK(kn_plan_run(p) == KN_OK, "%s: run after the error: %s", name, kn_last_error());
    kn_plan_free(p);
    kn_ctx_free(ctx);
}
TEST(ce_bad_target_is_an_error) {
    bad_target(kn_backend_ref(), "ref", true);
    bad_target(kn_backend_ref(), "ref", false);
    bad_target(kn_backend_cpu(), "cpu", true);
    bad_target(kn_backend_cpu(), "cpu", false);
}

/* ---- bad arguments at construction ---------------------------------------------- */
TEST(ce_bad_arguments) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, SH(3, 4)), *t = kn_zeros(ctx, KN_I64, 1, SH(3));
    CHECK(!kn_cross_entropy_rows(ctx, x, kn_zeros(ctx, KN_F32, 1, SH(3)), -100, 0) && strstr(kn_last_error(), "integer"),
          "float targets: %s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_cross_entropy_rows(ctx, x, kn_zeros(ctx, KN_I64, 1, SH(4)), -100, 0) && strstr(kn_last_error(), "[N,C]"),
          "mismatched N: %s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_cross_entropy_rows(ctx, kn_zeros(ctx, KN_I32, 2, SH(3, 4)), t, -100, 0) && strstr(kn_last_error(), "logits"),
          "integer logits: %s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_cross_entropy_rows(ctx, x, t, -100, 1.0) && strstr(kn_last_error(), "label_smoothing"), "smoothing 1: %s",
          kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- PyTorch: F.cross_entropy values and gradients --------------------------------- */
typedef struct { char name[64]; int64_t n; float *d; } rec;
static int load_fixture(const char *path, rec **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char magic[4]; uint32_t ver, cnt;
    int n = -1;
    if (fread(magic, 1, 4, f) == 4 && !memcmp(magic, "KNNN", 4) && fread(&ver, 4, 1, f) == 1 && ver == 1 &&
        fread(&cnt, 4, 1, f) == 1 && cnt < 1000) {
        rec *r = calloc(cnt, sizeof *r);
        n = 0;
        for (uint32_t i = 0; i < cnt; i++) {
            uint32_t len, nd; int64_t sh[8];
            if (fread(&len, 4, 1, f) != 1 || len >= sizeof r[i].name || fread(r[i].name, 1, len, f) != len ||
                fread(&nd, 4, 1, f) != 1 || nd > 8 || fread(sh, 8, nd, f) != nd) break;
            r[i].n = 1;
            for (uint32_t k = 0; k < nd; k++) r[i].n *= sh[k];
            r[i].d = malloc(sizeof(float) * (size_t)(r[i].n ? r[i].n : 1));
            if (fread(r[i].d, 4, (size_t)r[i].n, f) != (size_t)r[i].n) { free(r[i].d); break; }
            n++;
        }
        *out = r;
    }
    fclose(f);
    return n;
}
static const rec *get(const rec *r, int n, const char *name) {
    for (int i = 0; i < n; i++) if (!strcmp(r[i].name, name)) return &r[i];
    fprintf(stderr, "  fixture record %s missing\n", name);
    return NULL;
}
static double *to_d(const rec *r) {
    double *v = malloc(sizeof(double) * (size_t)r->n);
    for (int64_t i = 0; i < r->n; i++) v[i] = r->d[i];
    return v;
}

static void torch_parity(kn_backend *be, const char *bname) {
    rec *r = NULL;
    int n = load_fixture("tests/fixtures/ce_torch.bin", &r);
    REQUIRE(n > 0, "tests/fixtures/ce_torch.bin unreadable (run from the repo root; regenerate with scripts/ce_ref.py)");
    const rec *cnt = get(r, n, "ce.count");
    REQUIRE(cnt && cnt->d[0] >= 4, "fixture: ce.count");
    for (int k = 0; k < (int)cnt->d[0]; k++) {
        char nm[6][64];
        const char *parts[6] = {"cfg", "logits", "targets", "mean", "none", "grad"};
        const rec *f[6];
        for (int j = 0; j < 6; j++) { snprintf(nm[j], sizeof nm[j], "ce.%d.%s", k, parts[j]); f[j] = get(r, n, nm[j]); }
        REQUIRE(f[0] && f[1] && f[2] && f[3] && f[4] && f[5], "fixture case %d incomplete", k);
        int64_t N = (int64_t)f[0]->d[0], C = (int64_t)f[0]->d[1];
        bool bf16 = f[0]->d[4] != 0;
        double *x = to_d(f[1]);
        int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
        for (int64_t i = 0; i < N; i++) t[i] = (int64_t)f[2]->d[i];
        ce_case c = {N, C, bf16 ? KN_BF16 : KN_F32, (int64_t)f[0]->d[2], f[0]->d[3], KN_REDUCE_MEAN, false, false};
        ce_res a, b;
        REQUIRE(run_ce(be, &c, x, t, &a) == KN_OK, "%s case %d: %s", bname, k, kn_last_error());
        c.red = KN_REDUCE_NONE;
        REQUIRE(run_ce(be, &c, x, t, &b) == KN_OK, "%s case %d: %s", bname, k, kn_last_error());
        double *want_mean = to_d(f[3]), *want_none = to_d(f[4]), *want_grad = to_d(f[5]);
        CHECK(rel(a.loss, want_mean, 1) < 2e-6, "%s case %d: mean %.8g, torch %.8g", bname, k, a.loss[0], want_mean[0]);
        CHECK(rel(b.loss, want_none, N) < 2e-6, "%s case %d: per-row rel err %g", bname, k, rel(b.loss, want_none, N));
        CHECK(rel(a.grad, want_grad, N * C) < (bf16 ? grad_tol(KN_BF16) : 1e-5), "%s case %d: grad rel err %g", bname, k,
              rel(a.grad, want_grad, N * C));
        res_free(&a); res_free(&b);
        free(x); free(t); free(want_mean); free(want_none); free(want_grad);
    }
    for (int i = 0; i < n; i++) free(r[i].d);
    free(r);
}
TEST(ce_matches_torch) {
    torch_parity(kn_backend_ref(), "ref");
    torch_parity(kn_backend_cpu(), "cpu");
}

/* ---- CUDA: the same checks on the GPU ---------------------------------------------- */
#ifndef KN_CUDA
TEST(ce_cuda) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#define NEED_GPU() do { if (!kn_backend_cuda()) SKIP("no GPU: %s", kn_last_error()); } while (0)
TEST(ce_cuda_vs_reference) { NEED_GPU(); backend_vs_ref(kn_backend_cuda(), "cuda"); }
TEST(ce_cuda_matches_torch) { NEED_GPU(); torch_parity(kn_backend_cuda(), "cuda"); }
TEST(ce_cuda_all_ignored) { NEED_GPU(); all_ignored(kn_backend_cuda(), "cuda"); }
TEST(ce_cuda_bad_target_is_an_error) {
    NEED_GPU();
    bad_target(kn_backend_cuda(), "cuda", true);
    bad_target(kn_backend_cuda(), "cuda", false);
}
/* the classifier as in bf16 training: logits = h @ W^T in bf16, cast to
 * f32, the loss; dh and dW come from matmuls that read dlogits through its
 * [N, Cp] row stride (the tensor-core path on the GPU) */
TEST(ce_cuda_classifier_gradients) {
    NEED_GPU();
    kn_test_seed(76);
    int64_t N = 48, C = 4099, D = 64;
    double *h = malloc(sizeof(double) * (size_t)(N * D)), *w = malloc(sizeof(double) * (size_t)(C * D)), *x; int64_t *t;
    for (int64_t i = 0; i < N * D; i++) h[i] = kn_test_uniform(-1, 1);
    for (int64_t i = 0; i < C * D; i++) w[i] = kn_test_uniform(-0.3, 0.3);
    make_data(N, C, 1, -100, &x, &t);
    double *g[2][2] = {{0}};
    for (int b = 0; b < 2; b++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){b ? kn_backend_cuda() : kn_backend_ref()});
        kn_tensor *ht = kn_empty(ctx, KN_BF16, 2, SH(N, D)), *wt = kn_empty(ctx, KN_BF16, 2, SH(C, D));
        kn_tensor_write(ht, h, KN_F64); kn_tensor_write(wt, w, KN_F64);
        kn_set_requires_grad(ht, true); kn_set_requires_grad(wt, true);
        kn_tensor *tg = kn_from_data(ctx, KN_I64, 1, SH(N), t);
        kn_tensor *loss = kn_cross_entropy(ctx, kn_cast(ctx, kn_linear(ctx, ht, wt, NULL), KN_F32), tg, NULL);
        REQUIRE(loss && kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
        g[b][0] = rd(kn_grad(ht)); g[b][1] = rd(kn_grad(wt));
        kn_ctx_free(ctx);
    }
    double e0 = rel(g[1][0], g[0][0], N * D), e1 = rel(g[1][1], g[0][1], C * D);
    CHECK(e0 < 1e-2 && e1 < 1e-2, "cuda vs ref: dh rel err %g, dW rel err %g", e0, e1);
    for (int b = 0; b < 2; b++) { free(g[b][0]); free(g[b][1]); }
    free(h); free(w); free(x); free(t);
}

/* the generic kernel: f64 logits, i32 and u8 targets, transposed (strided) logits */
TEST(ce_cuda_generic_layouts) {
    NEED_GPU();
    kn_test_seed(75);
    int64_t N = 6, C = 13;
    double *x; int64_t *t;
    make_data(N, C, 3, -100, &x, &t);
    for (int i = 0; i < N; i++) if (t[i] < 0) t[i] = 200;      /* u8 can't hold -100: ignore 200 */
    kn_dtype tds[3] = {KN_I32, KN_U8, KN_I64};
    for (int k = 0; k < 3; k++) {
        double out[2][2 * 6 * 13 + 1];
        for (int b = 0; b < 2; b++) {
            kn_backend *be = b ? kn_backend_cuda() : kn_backend_ref();
            kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
            /* logits stored [C, N] and used transposed: class stride N */
            kn_tensor *xs = kn_empty(ctx, k == 2 ? KN_F32 : KN_F64, 2, SH(C, N));
            double xtr[6 * 13];
            for (int i = 0; i < N; i++) for (int j = 0; j < C; j++) xtr[j * N + i] = x[i * C + j];
            kn_tensor_write(xs, xtr, KN_F64);
            kn_set_requires_grad(xs, true);
            kn_tensor *xv = kn_transpose(ctx, xs, 0, 1);
            kn_tensor *tg = kn_empty(ctx, tds[k], 1, SH(N));
            kn_tensor_write(tg, t, KN_I64);
            kn_tensor *l = kn_cross_entropy_rows(ctx, xv, tg, 200, 0.1);
            kn_tensor *s = kn_sum_all(ctx, l);
            REQUIRE(kn_backward(ctx, s) == KN_OK, "%s", kn_last_error());
            CHECK(kn_tensor_read(l, out[b], KN_F64) == KN_OK && kn_tensor_read(kn_grad(xs), out[b] + N, KN_F64) == KN_OK,
                  "%s", kn_last_error());
            kn_ctx_free(ctx);
        }
        double e = rel(out[1], out[0], N + N * C);
        CHECK(e < (k == 2 ? 2e-6 : 1e-12), "targets %s: cuda generic vs ref rel err %g", kn_dtype_name(tds[k]), e);
    }
    free(x); free(t);
}
#endif

KN_TEST_MAIN()
