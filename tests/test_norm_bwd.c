/* test_norm_bwd.c: the fused gradient of layer_norm and rms_norm (one
 * NORM_BWD node, src/graph/ops_nn.c) against the lazy-op composite it
 * replaces (KN_NORM_COMPOSITE=1) on the reference backend in f64, and the
 * fast CPU path (cpu_norm_softmax.c) against the reference in f32: odd
 * shapes, several normalised dims, with and without weight and bias, a
 * transposed input, only the parameters wanting gradients, a symbolic
 * batch (which keeps the composite), and thread-count independence. The
 * finite-difference checks of both norms are in test_ops_nn_grad.c; the
 * CUDA kernels are checked in test_cuda_ops.c. */
#include "kn_test.h"
#include "kiln.h"
#include "core/env.h"          // defines: kn_env_reload (KN_NORM_COMPOSITE)
#include "graph/graph.h"       // defines: kn_tensor internals (view_src)
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    bool rms;
    int nd, n_norm;
    int64_t shape[4];
    bool w, b;              /* affine parameters present                     */
    bool tr;                /* x is the transpose of a [shape[1], shape[0]] tensor (2-d) */
    bool x_grad;            /* x wants a gradient (w and b always do)         */
    kn_dtype dt;
} nb_case;

typedef struct {
    double *g[3];           /* dx, dw, db (NULL when not wanted / absent) */
    int64_t n[3];
    kn_op op;               /* the op owning the storage of the first gradient */
} nb_res;

static void res_free(nb_res *r) { for (int i = 0; i < 3; i++) free(r->g[i]); memset(r, 0, sizeof *r); }

static void set_composite(bool on) {
    if (on) setenv("KN_NORM_COMPOSITE", "1", 1);
    else unsetenv("KN_NORM_COMPOSITE");
    kn_env_reload();
}

static double *rd(kn_tensor *t, int64_t *n) {
    *n = kn_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    if (kn_tensor_read(t, v, KN_F64) != KN_OK) { fprintf(stderr, "  read: %s\n", kn_last_error()); free(v); return NULL; }
    return v;
}

/* a leaf of shape s filled with uniform [lo, hi) values from a seeded stream */
static kn_tensor *leaf(kn_ctx *ctx, kn_dtype dt, int nd, const int64_t *s, double lo, double hi, uint64_t seed, kn_status *st) {
    kn_tensor *t = kn_empty(ctx, dt, nd, s);
    int64_t n = t ? kn_numel(t) : 0;
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {        /* splitmix64 */
        z += 0x9E3779B97F4A7C15ull;
        uint64_t q = z;
        q = (q ^ (q >> 30)) * 0xBF58476D1CE4E5B9ull;
        q = (q ^ (q >> 27)) * 0x94D049BB133111EBull;
        q ^= q >> 31;
        v[i] = lo + (hi - lo) * (double)(q >> 11) / 9007199254740992.0;
    }
    if (!*st) *st = t ? kn_tensor_write(t, v, KN_F64) : kn_ctx_status(ctx);
    free(v);
    return t;
}

/* loss = sum(norm(x) * c) with c fixed random: g = c */
static kn_status run(kn_backend *be, const nb_case *c, uint64_t seed, bool composite, nb_res *r) {
    memset(r, 0, sizeof *r);
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    if (!ctx) return KN_ERR_STATE;
    int64_t xs[4];
    memcpy(xs, c->shape, sizeof xs);
    if (c->tr) { xs[0] = c->shape[1]; xs[1] = c->shape[0]; }
    const int64_t *ps = c->shape + (c->nd - c->n_norm);
    kn_status st = KN_OK;
    kn_tensor *x0 = leaf(ctx, c->dt, c->nd, xs, -2, 3, seed, &st);
    kn_tensor *w = c->w ? leaf(ctx, c->dt, c->n_norm, ps, 0.5, 1.5, seed + 1, &st) : NULL;
    kn_tensor *b = c->b ? leaf(ctx, c->dt, c->n_norm, ps, -1, 1, seed + 2, &st) : NULL;
    kn_tensor *cw = leaf(ctx, c->dt, c->nd, c->shape, -1, 1, seed + 3, &st);
    if (c->x_grad) kn_set_requires_grad(x0, true);
    if (w) kn_set_requires_grad(w, true);
    if (b) kn_set_requires_grad(b, true);
    kn_tensor *x = c->tr ? kn_transpose(ctx, x0, 0, 1) : x0;
    set_composite(composite);
    kn_tensor *y = c->rms ? kn_rms_norm(ctx, x, c->n_norm, w, 1e-5) : kn_layer_norm(ctx, x, c->n_norm, w, b, 1e-5);
    int axes[4] = {0, 1, 2, 3};
    kn_tensor *loss = kn_sum(ctx, kn_mul(ctx, y, cw), c->nd, axes, false);
    if (!st && !loss) st = kn_ctx_status(ctx);
    if (!st) st = kn_backward(ctx, loss);
    set_composite(false);
    kn_tensor *gs[3] = {c->x_grad ? kn_grad(x0) : NULL, w ? kn_grad(w) : NULL, b ? kn_grad(b) : NULL};
    for (int i = 0; i < 3 && !st && !r->op; i++)     /* before reading: a read makes the node a leaf */
        if (gs[i]) r->op = (gs[i]->view_src ? gs[i]->view_src : gs[i])->op;
    for (int i = 0; i < 3 && !st; i++)
        if (gs[i] && !(r->g[i] = rd(gs[i], &r->n[i]))) st = KN_ERR_INVALID;
    kn_ctx_free(ctx);
    if (st) res_free(r);
    return st;
}

static double cmp(const nb_res *a, const nb_res *b) {
    double e = 0;
    for (int i = 0; i < 3; i++) {
        if (!a->g[i] != !b->g[i] || a->n[i] != b->n[i]) return INFINITY;
        if (a->g[i]) { double ei = kn_rel_err(a->g[i], b->g[i], a->n[i]); if (!(ei <= e)) e = ei; }
    }
    return e;
}

static const nb_case k_cases[] = {
    {false, 2, 1, {5, 7}, true, true, false, true, KN_F64},
    {false, 3, 2, {3, 4, 5}, false, false, false, true, KN_F64},
    {false, 2, 1, {6, 9}, true, false, false, true, KN_F64},     /* weight, no bias */
    {false, 2, 1, {6, 9}, false, true, false, true, KN_F64},     /* bias, no weight */
    {false, 2, 1, {4, 11}, true, true, true, true, KN_F64},      /* transposed x */
    {false, 3, 1, {2, 3, 13}, true, true, false, false, KN_F64}, /* only the parameters want gradients */
    {false, 2, 2, {1, 1}, true, true, false, true, KN_F64},      /* one element a row */
    {true, 2, 1, {5, 7}, true, false, false, true, KN_F64},
    {true, 3, 2, {2, 3, 4}, false, false, false, true, KN_F64},
    {true, 2, 1, {4, 11}, true, false, true, true, KN_F64},
    {true, 3, 1, {3, 2, 6}, true, false, false, false, KN_F64},
};

TEST(norm_bwd_matches_composite) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        nb_res f, p;
        REQUIRE(run(kn_backend_ref(), &k_cases[i], 100 + i, false, &f) == KN_OK, "case %zu fused: %s", i, kn_last_error());
        REQUIRE(run(kn_backend_ref(), &k_cases[i], 100 + i, true, &p) == KN_OK, "case %zu composite: %s", i, kn_last_error());
        CHECK(cmp(&f, &p) < 1e-12, "case %zu: rel err %g", i, cmp(&f, &p));
        CHECK(f.op == KN_OP_NORM_BWD && p.op != KN_OP_NORM_BWD, "case %zu: fused gradient from %s, composite from %s", i,
              kn_op_name(f.op), kn_op_name(p.op));
        CHECK(k_cases[i].x_grad == (f.g[0] != NULL), "case %zu: dx only when x wants it", i);
        res_free(&f); res_free(&p);
    }
}

/* the fast CPU path in f32 against the reference in f64, at every thread count */
TEST(norm_bwd_cpu) {
    nb_case cs[] = {
        {false, 2, 1, {300, 256}, true, true, false, true, KN_F32},
        {false, 3, 1, {2, 37, 768}, true, true, false, true, KN_F32},
        {false, 3, 2, {5, 6, 7}, false, true, false, true, KN_F32},
        {true, 2, 1, {130, 96}, true, false, false, true, KN_F32},
        {true, 2, 1, {9, 33}, false, false, false, true, KN_F32},
    };
    int nt0 = kn_threads();
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        nb_res ref, one, two;
        /* the same inputs on both; the reference computes in f64 and rounds to f32 */
        REQUIRE(run(kn_backend_ref(), &cs[i], 7 + i, false, &ref) == KN_OK, "case %zu ref: %s", i, kn_last_error());
        kn_set_threads(1);
        REQUIRE(run(kn_backend_cpu(), &cs[i], 7 + i, false, &one) == KN_OK, "case %zu cpu: %s", i, kn_last_error());
        kn_set_threads(2);
        REQUIRE(run(kn_backend_cpu(), &cs[i], 7 + i, false, &two) == KN_OK, "case %zu cpu: %s", i, kn_last_error());
        kn_set_threads(nt0);
        CHECK(cmp(&one, &ref) < 2e-5, "case %zu: cpu against reference, rel err %g", i, cmp(&one, &ref));
        CHECK(cmp(&one, &two) == 0, "case %zu: 1 and 2 threads differ (rel %g)", i, cmp(&one, &two));
        CHECK(one.op == KN_OP_NORM_BWD, "case %zu: gradient from %s", i, kn_op_name(one.op));
        res_free(&ref); res_free(&one); res_free(&two);
    }
}

/* a symbolic batch keeps the lazy-op gradient, and it still runs */
TEST(norm_bwd_symbolic_batch) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    int T = kn_sym_new(ctx, "T", 8);
    kn_tensor *x = kn_input(ctx, KN_F64, 2, (int64_t[]){8, 5});
    kn_status st = KN_OK;
    kn_tensor *w = leaf(ctx, KN_F64, 1, (int64_t[]){5}, 0.5, 1.5, 3, &st);
    REQUIRE(st == KN_OK, "%s", kn_last_error());
    kn_set_requires_grad(w, true);
    kn_tensor *y = kn_layer_norm(ctx, kn_slice_sym(ctx, x, 0, 0, T), 1, w, NULL, 1e-5);
    kn_tensor *loss = kn_sum(ctx, kn_square(ctx, y), 2, (int[]){0, 1}, false);
    REQUIRE(kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
    kn_tensor *gw = kn_grad(w);
    REQUIRE(gw, "no gradient");
    CHECK((gw->view_src ? gw->view_src : gw)->op != KN_OP_NORM_BWD, "a symbolic batch got the fused node");
    double in[40], out[5];
    for (int i = 0; i < 40; i++) in[i] = sin(i * 0.7);
    kn_tensor_write(x, in, KN_F64);
    kn_plan *p = kn_plan_new(ctx, 1, &gw, NULL);
    REQUIRE(p, "%s", kn_last_error());
    REQUIRE(kn_sym_set(ctx, T, 3) == KN_OK && kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tensor_read(gw, out, KN_F64) == KN_OK && isfinite(out[0]), "%s", kn_last_error());
    /* y^2 summed: d/dw = sum_rows 2 y xhat; with w > 0 every term is 2 w xhat^2 >= 0 */
    CHECK(out[0] > 0, "dw[0] = %g", out[0]);
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
