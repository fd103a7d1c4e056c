/* test_epilogue.c: matmul epilogue fusion (src/compile/epilogue.c; the
 * backends' kn_epilogue paths: ref_epilogue.c, cpu_epilogue.c; docs/COMPILER.md
 * "Matmul epilogues").
 *
 * Each case builds y = cast?(res? + act?(a @ b + bias?)) (and the variants the
 * predicate must refuse) three times with the same data: on the reference
 * backend planned with and without fusion, and on the fast backend (the
 * default, KN_BACKEND) with and without fusion (kn_plan_opts.no_fuse). It
 * checks how many nodes went into epilogues, that the fused plans give the
 * unfused plans' bits where nothing else is fused (every backend rounds each
 * step to the node's dtype as the unfused nodes do), and the reference within
 * a dtype tolerance. Shapes are odd (M, K, N not multiples of any tile);
 * operands transposed (non-contiguous), batched and broadcast batch cases;
 * a training graph's gradients through a fused forward.
 *   build/tests/test_epilogue     (KN_TEST_VERBOSE=1: each case's plan)
 */
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"
#include "backends/quant/quant.h"   // defines: kn_quantize_row
#include <stdint.h>

#define NONE_DT ((kn_dtype)-1)

typedef struct {
    const char *name;
    kn_dtype dt;          /* a, b and the matmul */
    int64_t B, M, K, N;   /* B = 0: 2-d */
    bool ta, tb;          /* a / b are transposed views (non-contiguous) */
    int bias;             /* 0 none, 1 [N], 2 [1, N], 3 [N] in bf16 (promotes to the f32 matmul) */
    kn_op act;            /* KN_OP_NONE or an activation */
    int res;              /* 0 none, 1 add(h, res), 2 add(res, h) */
    kn_dtype cast;        /* NONE_DT: no cast */
    int bad;              /* 0; 1 broadcasting residual [M, 1]; 2 the bias add is also an output; 3 the act is read by another node */
    int expect;           /* nodes (besides the matmul) the predicate takes */
    int wk;               /* b (a weight, tb): 0 in dt; 1 f16, 2 bf16, 3 Q8_0, 4 Q4_0 (f32 activations) */
} ecase;

static uint32_t rnd(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

static kn_tensor *rand_t(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *d = malloc(sizeof *d * (size_t)(n ? n : 1));
    uint32_t s = seed;
    for (int64_t i = 0; i < n; i++) d[i] = (float)rnd(&s) / (float)(1u << 24) * 2.0f - 1.0f;
    kn_tensor *t = kn_from_data(ctx, KN_F32, ndim, shape, d);
    free(d);
    return dt == KN_F32 ? t : kn_cast(ctx, t, dt);
}

/* [B,] R x C, or its transpose viewed back to R x C */
static kn_tensor *operand(kn_ctx *ctx, const ecase *c, int64_t R, int64_t C, bool trans, uint32_t seed) {
    int64_t sh[3];
    int nd = 0;
    if (c->B) sh[nd++] = c->B;
    sh[nd++] = trans ? C : R;
    sh[nd++] = trans ? R : C;
    kn_tensor *t = rand_t(ctx, c->dt, nd, sh, seed);
    return trans ? kn_transpose(ctx, t, nd - 2, nd - 1) : t;
}

/* W [N, K] in dtype wt (f16, bf16 or a block type), viewed as W^T [K, N] */
static kn_tensor *weight(kn_ctx *ctx, kn_dtype wt, int64_t K, int64_t N, uint32_t seed) {
    int64_t sh[2] = {N, K};
    kn_tensor *w;
    if (!kn_dtype_get(wt)->is_quant) {
        w = rand_t(ctx, wt, 2, sh, seed);
    } else {
        float *d = malloc(sizeof *d * (size_t)(N * K));
        char *q = malloc(kn_dtype_nbytes(wt, N * K));
        uint32_t s = seed;
        for (int64_t i = 0; i < N * K; i++) d[i] = (float)rnd(&s) / (float)(1u << 24) * 2.0f - 1.0f;
        for (int64_t r = 0; r < N; r++) kn_quantize_row(wt, d + r * K, q + kn_dtype_nbytes(wt, K) * r, K);
        w = kn_from_data(ctx, wt, 2, sh, q);
        free(d); free(q);
    }
    return kn_transpose(ctx, w, 0, 1);
}

/* the case's graph; returns the number of outputs */
static int build(kn_ctx *ctx, const ecase *c, kn_tensor **outs) {
    int no = 1, nd = c->B ? 3 : 2;
    int64_t osh[3] = {c->B, c->M, c->N}, *sh = c->B ? osh : osh + 1;
    static const kn_dtype wts[] = {KN_F32, KN_F16, KN_BF16, KN_Q8_0, KN_Q4_0};
    kn_tensor *b = c->wk ? weight(ctx, wts[c->wk], c->K, c->N, 12) : operand(ctx, c, c->K, c->N, c->tb, 12);
    kn_tensor *y = kn_matmul(ctx, operand(ctx, c, c->M, c->K, c->ta, 11), b);
    if (c->bias) {
        int64_t bsh[2] = {1, c->N};
        kn_tensor *bias = c->bias == 2 ? rand_t(ctx, c->dt, 2, bsh, 13) : rand_t(ctx, c->bias == 3 ? KN_BF16 : c->dt, 1, bsh + 1, 13);
        y = kn_add(ctx, y, bias);
        if (c->bad == 2) outs[no++] = y;
    }
    if (c->act != KN_OP_NONE) {
        y = kn_unary(ctx, c->act, y);
        if (c->bad == 3) outs[no++] = kn_mul(ctx, y, y);
    }
    if (c->res) {
        kn_tensor *r = rand_t(ctx, c->dt, nd, sh, 14);
        y = c->res == 1 ? kn_add(ctx, y, r) : kn_add(ctx, r, y);
    }
    if (c->bad == 1) {
        int64_t col[2] = {c->M, 1};
        y = kn_add(ctx, y, rand_t(ctx, c->dt, 2, col, 15));
    }
    if (c->cast != NONE_DT) y = kn_cast(ctx, y, c->cast);
    outs[0] = y;
    return no;
}

static float *read_f32(kn_tensor *t, int64_t *n) {
    *n = kn_numel(t);
    float *d = malloc(sizeof *d * (size_t)(*n ? *n : 1));
    if (kn_tensor_read(t, d, KN_F32) != KN_OK) { free(d); return NULL; }
    return d;
}

/* bits equal (tol < 0) or within tol relative to 1 + |b| */
static int64_t differ(const float *a, const float *b, int64_t n, double tol, int64_t *first) {
    int64_t bad = 0;
    *first = -1;
    for (int64_t i = 0; i < n; i++) {
        bool ok = tol < 0 ? memcmp(&a[i], &b[i], 4) == 0 || (isnan(a[i]) && isnan(b[i]))
                          : fabs((double)a[i] - b[i]) <= tol * (1.0 + fabs((double)b[i]));
        if (!ok) { if (*first < 0) *first = i; bad++; }
    }
    return bad;
}

/* Plans outs with and without fusion on ctx's backend; *fused, *plain: the outputs read back. */
typedef struct { float *v[3]; int64_t n[3]; int epi, epi_nodes; } got;
static bool run_pair(kn_ctx *cf, kn_ctx *cp, const ecase *c, got *gf, got *gp) {
    kn_tensor *of[3], *op[3];
    int no = build(cf, c, of);
    build(cp, c, op);
    kn_plan *pf = kn_plan_new(cf, no, of, NULL);
    kn_plan *pp = kn_plan_new(cp, no, op, &(kn_plan_opts){.no_fuse = true});
    bool ok = pf && pp && kn_plan_run(pf) == KN_OK && kn_plan_run(pp) == KN_OK;
    CHECK(ok, "%s: plan/run: %s", c->name, kn_last_error());
    if (ok && getenv("KN_TEST_VERBOSE")) kn_plan_print(pf, stderr);
    kn_plan_stats st;
    kn_plan_get_stats(pf, &st);
    gf->epi = st.epilogues; gf->epi_nodes = st.epilogue_nodes;
    kn_plan_get_stats(pp, &st);
    gp->epi = st.epilogues; gp->epi_nodes = st.epilogue_nodes;
    for (int o = 0; o < no && ok; o++) {
        gf->v[o] = read_f32(of[o], &gf->n[o]);
        gp->v[o] = read_f32(op[o], &gp->n[o]);
        ok = gf->v[o] && gp->v[o];
    }
    kn_plan_free(pf); kn_plan_free(pp);
    return ok ? no : 0;
}

static void free_got(got *g) { for (int i = 0; i < 3; i++) free(g->v[i]); }

static double tol_of(kn_dtype dt) { return dt == KN_F64 ? 1e-9 : dt == KN_F32 ? 1e-5 : dt == KN_F16 ? 4e-3 : 3e-2; }

static void run_case(const ecase *c) {
    kn_ctx *rf = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), *rp = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_ctx *ff = kn_ctx_new(NULL), *fp = kn_ctx_new(NULL);
    got grf = {0}, grp = {0}, gff = {0}, gfp = {0};
    int no = run_pair(rf, rp, c, &grf, &grp);
    int no2 = run_pair(ff, fp, c, &gff, &gfp);
    const char *be = kn_backend_default()->name;
    bool host = !strcmp(be, "cpu") || !strcmp(be, "ref");
    CHECK(grf.epi_nodes == c->expect && grf.epi == (c->expect > 0), "%s: ref took %d nodes into %d epilogues, expected %d",
          c->name, grf.epi_nodes, grf.epi, c->expect);
    CHECK(host ? gff.epi_nodes == c->expect : gff.epi_nodes <= c->expect, "%s: %s took %d nodes, expected %d", c->name, be, gff.epi_nodes, c->expect);
    CHECK(grp.epi == 0 && gfp.epi == 0, "%s: no_fuse plans took epilogues", c->name);
    kn_dtype odt = c->cast != NONE_DT ? c->cast : c->dt;
    /* bit for bit where nothing but the epilogue is fused (bad == 0: the whole
     * chain is in it); else the generated kernels' float math may differ in an ulp */
    double tight = c->bad ? tol_of(odt) : -1;
    for (int o = 0; o < no && no == no2; o++) {
        int64_t n = grf.n[o], at;
        int64_t bad = differ(grf.v[o], grp.v[o], n, -1, &at);
        CHECK(!bad, "%s out %d: ref fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o,
              (long long)bad, (long long)n, (long long)at, bad ? grf.v[o][at] : 0, bad ? grp.v[o][at] : 0);
        bad = differ(gff.v[o], gfp.v[o], n, host ? tight : tol_of(odt), &at);
        CHECK(!bad, "%s out %d: %s fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o, be,
              (long long)bad, (long long)n, (long long)at, bad ? gff.v[o][at] : 0, bad ? gfp.v[o][at] : 0);
        /* quantized weights: the CPU quantizes the activations (decode) */
        bad = differ(gff.v[o], grf.v[o], n, c->wk >= 3 ? 3e-2 : tol_of(odt) * 4, &at);
        CHECK(!bad, "%s out %d: %s fused vs reference: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o, be,
              (long long)bad, (long long)n, (long long)at, bad ? gff.v[o][at] : 0, bad ? grf.v[o][at] : 0);
    }
    CHECK(no > 0 && no == no2, "%s: outputs %d vs %d", c->name, no, no2);
    free_got(&grf); free_got(&grp); free_got(&gff); free_got(&gfp);
    kn_ctx_free(rf); kn_ctx_free(rp); kn_ctx_free(ff); kn_ctx_free(fp);
}

#define F32 KN_F32
#define N_ KN_OP_NONE
static const ecase g_cases[] = {
    /* name              dt      B  M   K   N   ta tb bias act            res cast    bad expect */
    {"plain",            F32,    0, 37, 29, 43, 0, 0, 0, N_,              0, NONE_DT, 0, 0},
    {"bias",             F32,    0, 37, 29, 43, 0, 0, 1, N_,              0, NONE_DT, 0, 1},
    {"bias_1n",          F32,    0, 37, 29, 43, 0, 0, 2, N_,              0, NONE_DT, 0, 1},
    {"bias_bf16",        F32,    0, 37, 29, 43, 0, 0, 3, N_,              0, NONE_DT, 0, 1},
    {"relu",             F32,    0, 37, 29, 43, 0, 0, 0, KN_OP_RELU,      0, NONE_DT, 0, 1},
    {"gelu",             F32,    0, 37, 29, 43, 0, 0, 0, KN_OP_GELU,      0, NONE_DT, 0, 1},
    {"gelu_tanh",        F32,    0, 37, 29, 43, 0, 0, 0, KN_OP_GELU_TANH, 0, NONE_DT, 0, 1},
    {"silu",             F32,    0, 37, 29, 43, 0, 0, 0, KN_OP_SILU,      0, NONE_DT, 0, 1},
    {"res",              F32,    0, 37, 29, 43, 0, 0, 0, N_,              1, NONE_DT, 0, 1},
    {"res_first",        F32,    0, 37, 29, 43, 0, 0, 0, N_,              2, NONE_DT, 0, 1},
    {"cast_bf16",        F32,    0, 37, 29, 43, 0, 0, 0, N_,              0, KN_BF16, 0, 1},
    {"bias_gelu",        F32,    0, 37, 29, 43, 0, 0, 1, KN_OP_GELU,      0, NONE_DT, 0, 2},
    {"bias_gelu_tanh_res_f16", F32, 0, 37, 29, 43, 0, 0, 1, KN_OP_GELU_TANH, 2, KN_F16, 0, 4},
    {"all_bf16_out",     F32,    0, 65, 70, 33, 0, 0, 1, KN_OP_SILU,      1, KN_BF16, 0, 4},
    {"decode_row",       F32,    0, 1, 64, 77,  0, 1, 1, KN_OP_GELU,      1, NONE_DT, 0, 3},
    {"decode_col",       F32,    0, 23, 64, 1,  0, 0, 1, KN_OP_RELU,      1, NONE_DT, 0, 3},
    {"two_rows",         F32,    0, 2, 50, 67,  0, 0, 1, KN_OP_SILU,      0, NONE_DT, 0, 2},
    {"trans_a",          F32,    0, 37, 29, 43, 1, 0, 1, KN_OP_GELU,      1, NONE_DT, 0, 3},
    {"trans_b",          F32,    0, 37, 29, 43, 0, 1, 1, KN_OP_RELU,      1, NONE_DT, 0, 3},
    {"batched",          F32,    3, 17, 29, 21, 0, 0, 1, KN_OP_GELU,      1, NONE_DT, 0, 3},
    {"batched_trans",    F32,    2, 17, 29, 21, 1, 1, 1, KN_OP_SILU,      2, KN_BF16, 0, 4},
    {"big",              F32,    0, 203, 131, 517, 0, 1, 1, KN_OP_GELU,   1, NONE_DT, 0, 3},
    {"bf16",             KN_BF16, 0, 37, 29, 43, 0, 0, 1, KN_OP_GELU,     1, KN_F32,  0, 4},
    {"f16",              KN_F16, 0, 37, 29, 43, 0, 1, 1, KN_OP_SILU,      2, NONE_DT, 0, 3},
    {"f64",              KN_F64, 0, 19, 29, 23, 0, 0, 1, KN_OP_GELU_TANH, 1, NONE_DT, 0, 3},
    /* weights in f16, bf16 and block types: the GEMV / quantized-dot / dequantize+SGEMM paths */
    {"w_bf16_decode",    F32,    0, 1, 64, 77,  0, 1, 1, KN_OP_GELU,      1, NONE_DT, 0, 3, 2},
    {"w_f16_rows",       F32,    0, 5, 64, 77,  0, 1, 1, KN_OP_SILU,      1, KN_BF16, 0, 4, 1},
    {"w_q8_decode",      F32,    0, 1, 64, 77,  0, 1, 1, KN_OP_GELU,      1, NONE_DT, 0, 3, 3},
    {"w_q8_rows",        F32,    0, 7, 64, 77,  0, 1, 1, KN_OP_RELU,      2, NONE_DT, 0, 3, 3},
    {"w_q4_prefill",     F32,    0, 40, 64, 77, 0, 1, 1, KN_OP_GELU_TANH, 1, KN_F16,  0, 4, 4},
    /* must stop: a broadcasting residual is no residual (the cast after it stays too) */
    {"bcast_res",        F32,    0, 37, 29, 43, 0, 0, 1, KN_OP_RELU,      0, KN_BF16, 1, 2},
    /* an absorbed value read elsewhere: the bias add is an output, the act is read by a mul */
    {"bias_is_output",   F32,    0, 37, 29, 43, 0, 0, 1, KN_OP_GELU,      1, NONE_DT, 2, 1},
    {"act_read_twice",   F32,    0, 37, 29, 43, 0, 0, 1, KN_OP_GELU,      1, NONE_DT, 3, 2},
};

TEST(epilogue_forms) {
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) run_case(&g_cases[i]);
}

/* A training step's graph: loss = mean(gelu(x @ w + b)^2); gradients of w, b
 * with the forward's bias add in the matmul's epilogue (gelu's gradient reads
 * the add, so the chain stops there) equal the unfused plan's. */
static int grad_graph(kn_ctx *ctx, kn_tensor **outs) {
    int64_t xs[2] = {13, 21}, ws[2] = {21, 17}, bs[1] = {17};
    kn_tensor *x = rand_t(ctx, KN_F32, 2, xs, 1), *w = rand_t(ctx, KN_F32, 2, ws, 2), *b = rand_t(ctx, KN_F32, 1, bs, 3);
    kn_set_requires_grad(w, true);
    kn_set_requires_grad(b, true);
    kn_tensor *h = kn_unary(ctx, KN_OP_GELU, kn_add(ctx, kn_matmul(ctx, x, w), b));
    kn_tensor *loss = kn_mean_all(ctx, kn_mul(ctx, h, h));
    if (kn_backward(ctx, loss) != KN_OK) return 0;
    outs[0] = loss; outs[1] = kn_grad(w); outs[2] = kn_grad(b);
    return 3;
}

TEST(gradients_through_fused_forward) {
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_default()};
    for (int k = 0; k < 2; k++) {
        kn_ctx *cf = kn_ctx_new(&(kn_ctx_opts){.backend = bes[k]}), *cp = kn_ctx_new(&(kn_ctx_opts){.backend = bes[k]});
        kn_tensor *of[3], *op[3];
        REQUIRE(grad_graph(cf, of) == 3 && grad_graph(cp, op) == 3, "graph: %s", kn_last_error());
        kn_plan *pf = kn_plan_new(cf, 3, of, NULL), *pp = kn_plan_new(cp, 3, op, &(kn_plan_opts){.no_fuse = true});
        REQUIRE(pf && pp && !kn_plan_run(pf) && !kn_plan_run(pp), "run: %s", kn_last_error());
        kn_plan_stats st;
        kn_plan_get_stats(pf, &st);
        CHECK(st.epilogues >= 1, "%s: no epilogue in the training graph", bes[k]->name);
        for (int o = 0; o < 3; o++) {
            int64_t n, n2, at;
            float *a = read_f32(of[o], &n), *b = read_f32(op[o], &n2);
            REQUIRE(a && b && n == n2, "read");
            int64_t bad = differ(a, b, n, bes[k] == kn_backend_ref() ? -1 : 1e-5, &at);
            CHECK(!bad, "%s output %d: %lld of %lld differ, first [%lld] %.9g vs %.9g", bes[k]->name, o, (long long)bad,
                  (long long)n, (long long)at, bad ? a[at] : 0, bad ? b[at] : 0);
            free(a); free(b);
        }
        kn_plan_free(pf); kn_plan_free(pp);
        kn_ctx_free(cf); kn_ctx_free(cp);
    }
}

/* The no-fusion switch (KN_NOFUSE is read once: kn_plan_opts here) and eager
 * reads take no epilogue; symbolic rows (a decode/prefill plan) do. */
TEST(symbolic_rows_and_eager) {
    kn_ctx *ctx = kn_ctx_new(NULL), *cr = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_tensor *outs[2];
    kn_ctx *cs[2] = {ctx, cr};
    for (int k = 0; k < 2; k++) {
        int64_t xs[2] = {29, 40}, ws[2] = {40, 35}, bs[1] = {35};
        kn_tensor *x = rand_t(cs[k], KN_F32, 2, xs, 5);
        int T = kn_sym_new(cs[k], "T", 29);
        x = kn_slice_sym(cs[k], x, 0, 0, T);
        kn_tensor *h = kn_add(cs[k], kn_matmul(cs[k], x, rand_t(cs[k], KN_F32, 2, ws, 6)), rand_t(cs[k], KN_F32, 1, bs, 7));
        outs[k] = kn_unary(cs[k], KN_OP_SILU, h);
    }
    kn_plan *p = kn_plan_new(ctx, 1, &outs[0], NULL), *pr = kn_plan_new(cr, 1, &outs[1], &(kn_plan_opts){.no_fuse = true});
    REQUIRE(p && pr, "plan: %s", kn_last_error());
    kn_plan_stats st;
    kn_plan_get_stats(p, &st);
    CHECK(!strcmp(kn_backend_default()->name, "cpu") ? st.epilogues == 1 && st.epilogue_nodes == 2 : 1, "epilogues %d nodes %d", st.epilogues, st.epilogue_nodes);
    int64_t vals[3] = {29, 1, 7};
    for (int r = 0; r < 3; r++) {
        kn_sym_set(ctx, 1, vals[r]); kn_sym_set(cr, 1, vals[r]);
        REQUIRE(!kn_plan_run(p) && !kn_plan_run(pr), "run: %s", kn_last_error());
        float *a = malloc(29 * 35 * 4), *b = malloc(29 * 35 * 4);
        int64_t at;
        REQUIRE(!kn_tensor_read(outs[0], a, KN_F32) && !kn_tensor_read(outs[1], b, KN_F32), "read");
        int64_t bad = differ(a, b, vals[r] * 35, 4e-5, &at);
        CHECK(!bad, "T=%lld: %lld differ at %lld: %g vs %g", (long long)vals[r], (long long)bad, (long long)at, bad ? a[at] : 0, bad ? b[at] : 0);
        free(a); free(b);
    }
    kn_plan_free(p); kn_plan_free(pr);
    kn_ctx_free(ctx); kn_ctx_free(cr);
}

/* add(a @ b, c @ d): both products' only reader is the add; the first
 * matmul takes it (the other product is its residual; gelu after a residual
 * is not of the form), the second runs
 * plainly. Caught in train_llama_one_plan, where both once claimed it. */
TEST(two_matmuls_one_add) {
    kn_tensor *outs[3];
    kn_ctx *cs[3] = {kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), kn_ctx_new(NULL), kn_ctx_new(NULL)};
    kn_plan *ps[3];
    for (int k = 0; k < 3; k++) {
        int64_t as[2] = {19, 23}, bs[2] = {23, 31}, cs_[2] = {19, 9}, ds[2] = {9, 31};
        kn_tensor *p = kn_matmul(cs[k], rand_t(cs[k], KN_F32, 2, as, 1), rand_t(cs[k], KN_F32, 2, bs, 2));
        kn_tensor *q = kn_matmul(cs[k], rand_t(cs[k], KN_F32, 2, cs_, 3), rand_t(cs[k], KN_F32, 2, ds, 4));
        outs[k] = kn_unary(cs[k], KN_OP_GELU, kn_add(cs[k], p, q));
        ps[k] = kn_plan_new(cs[k], 1, &outs[k], &(kn_plan_opts){.no_fuse = k == 2});
        REQUIRE(ps[k] && !kn_plan_run(ps[k]), "plan/run %d: %s", k, kn_last_error());
    }
    kn_plan_stats st;
    kn_plan_get_stats(ps[0], &st);
    CHECK(st.epilogues == 1 && st.epilogue_nodes == 1, "ref: %d epilogues, %d nodes", st.epilogues, st.epilogue_nodes);
    float *v[3];
    int64_t n, at;
    for (int k = 0; k < 3; k++) v[k] = read_f32(outs[k], &n);
    int64_t bad = differ(v[1], v[2], n, -1, &at);
    CHECK(!bad, "fused vs unfused: %lld differ", (long long)bad);
    bad = differ(v[1], v[0], n, 4e-5, &at);
    CHECK(!bad, "fused vs ref: %lld differ", (long long)bad);
    for (int k = 0; k < 3; k++) { free(v[k]); kn_plan_free(ps[k]); kn_ctx_free(cs[k]); }
}

KN_TEST_MAIN()
