/* kn_epitest.h: the matmul-epilogue test harness that tests/test_epilogue.c
 * (ref and the default backend) and tests/test_cuda_epilogue.c (the GPU)
 * share: the case table, the graph of a case, and one case run fused and
 * unfused on a backend next to the reference.
 */
#ifndef KN_EPITEST_H
#define KN_EPITEST_H
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"
#include "kiln_backend.h"         // defines: kn_store
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
    int wk;               /* b (a weight, tb): 0 in dt; 1 f16, 2 bf16, 3 Q8_0, 4 Q4_0 (f32 activations); 5: b in dt, 2-d, shared by the batch */
} ecase;

/* block-type weights (Q8_0, Q4_0): host backends only */
static bool quant_weight(const ecase *c) { return c->wk == 3 || c->wk == 4; }

static uint32_t rnd(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* a leaf of dtype dt (data, not a cast node: the plan keeps no copy of it) */
static kn_tensor *rand_t(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    char *d = malloc(kn_dtype_nbytes(dt, n ? n : 1));
    uint32_t s = seed;
    for (int64_t i = 0; i < n; i++) kn_store(dt, d, i, (float)rnd(&s) / (float)(1u << 24) * 2.0f - 1.0f);
    kn_tensor *t = kn_from_data(ctx, dt, ndim, shape, d);
    free(d);
    return t;
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
    ecase c2 = *c;
    c2.B = 0;
    kn_tensor *b = c->wk == 5 ? operand(ctx, &c2, c->K, c->N, c->tb, 12)
                 : c->wk ? weight(ctx, wts[c->wk], c->K, c->N, 12) : operand(ctx, c, c->K, c->N, c->tb, 12);
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

/* Case c on the reference (fused and unfused: bits equal) and on backend be
 * (fused and unfused; exact: bits equal where nothing but the epilogue is
 * fused, else within the dtype's tolerance; all_taken: be accepts every
 * epilogue the predicate finds), be against the reference within tolerance. */
static void run_case(const ecase *c, kn_backend *be, bool exact, bool all_taken) {
    kn_ctx *rf = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), *rp = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_ctx *ff = kn_ctx_new(&(kn_ctx_opts){.backend = be}), *fp = kn_ctx_new(&(kn_ctx_opts){.backend = be});
    got grf = {0}, grp = {0}, gff = {0}, gfp = {0};
    int no = run_pair(rf, rp, c, &grf, &grp);
    int no2 = run_pair(ff, fp, c, &gff, &gfp);
    CHECK(grf.epi_nodes == c->expect && grf.epi == (c->expect > 0), "%s: ref took %d nodes into %d epilogues, expected %d",
          c->name, grf.epi_nodes, grf.epi, c->expect);
    CHECK(all_taken ? gff.epi_nodes == c->expect : gff.epi_nodes <= c->expect, "%s: %s took %d nodes, expected %d", c->name,
          be->name, gff.epi_nodes, c->expect);
    CHECK(grp.epi == 0 && gfp.epi == 0, "%s: no_fuse plans took epilogues", c->name);
    kn_dtype odt = c->cast != NONE_DT ? c->cast : c->dt;
    /* bit for bit where nothing but the epilogue is fused (bad == 0: the whole
     * chain is in it); else the generated kernels' float math may differ in an ulp */
    double tight = c->bad || !exact ? tol_of(odt) : -1;
    for (int o = 0; o < no && no == no2; o++) {
        int64_t n = grf.n[o], at;
        int64_t bad = differ(grf.v[o], grp.v[o], n, -1, &at);
        CHECK(!bad, "%s out %d: ref fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o,
              (long long)bad, (long long)n, (long long)at, bad ? grf.v[o][at] : 0, bad ? grp.v[o][at] : 0);
        bad = differ(gff.v[o], gfp.v[o], n, tight, &at);
        CHECK(!bad, "%s out %d: %s fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o, be->name,
              (long long)bad, (long long)n, (long long)at, bad ? gff.v[o][at] : 0, bad ? gfp.v[o][at] : 0);
        /* against the reference the tolerance of the least precise dtype
         * the product passes through: quantized weights (the CPU quantizes
         * the activations at decode), a 16-bit matmul whose result is then
         * cast up, 16-bit weights with f32 activations (a GPU's tensor-core
         * path rounds the activations to the weights' dtype; the unfused
         * plan on the same backend does the same: fused vs unfused above
         * stays exact) */
        double rt = tol_of(odt);
        if (tol_of(c->dt) > rt) rt = tol_of(c->dt);
        if ((c->wk == 1 || c->wk == 2) && tol_of(c->wk == 1 ? KN_F16 : KN_BF16) > rt) rt = tol_of(c->wk == 1 ? KN_F16 : KN_BF16);
        bad = differ(gff.v[o], grf.v[o], n, quant_weight(c) ? 3e-2 : rt * 4, &at);
        CHECK(!bad, "%s out %d: %s fused vs reference: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, o, be->name,
              (long long)bad, (long long)n, (long long)at, bad ? gff.v[o][at] : 0, bad ? grf.v[o][at] : 0);
    }
    CHECK(no > 0 && no == no2, "%s: outputs %d vs %d", c->name, no, no2);
    free_got(&grf); free_got(&grp); free_got(&gff); free_got(&gfp);
    kn_ctx_free(rf); kn_ctx_free(rp); kn_ctx_free(ff); kn_ctx_free(fp);
}

/* ---- prologues: y = res? + A @ W^T with A = rms_norm(x) * w? or silu(g) * u ---- */
typedef struct {
    const char *name;
    int64_t M, K, N;
    kn_op pre;            /* KN_OP_RMS_NORM or KN_OP_SILU (g, u: the two halves of one [M, 2K] tensor, as gate | up) */
    bool w;               /* the norm's weight */
    int wk;               /* W [N, K]: 0 f32, 1 f16, 2 bf16, 3 Q8_0, 4 Q4_0 */
    bool res;             /* + a residual [M, N] (the epilogue) */
    int bad;              /* 1: A is also an output (no prologue) */
} pcase;

static int pbuild(kn_ctx *ctx, const pcase *c, kn_tensor **outs) {
    int no = 1;
    int64_t xsh[2] = {c->M, c->pre == KN_OP_SILU ? 2 * c->K : c->K}, ysh[2] = {c->M, c->N};
    kn_tensor *x = rand_t(ctx, KN_F32, 2, xsh, 21), *a;
    if (c->pre == KN_OP_RMS_NORM)
        a = kn_rms_norm(ctx, x, 1, c->w ? rand_t(ctx, KN_F32, 1, &c->K, 22) : NULL, 1e-5f);
    else
        a = kn_mul(ctx, kn_silu(ctx, kn_narrow(ctx, x, 1, 0, c->K)), kn_narrow(ctx, x, 1, c->K, c->K));
    if (c->bad == 1) outs[no++] = a;
    static const kn_dtype wts[] = {KN_F32, KN_F16, KN_BF16, KN_Q8_0, KN_Q4_0};
    kn_tensor *y = kn_matmul(ctx, a, weight(ctx, wts[c->wk], c->K, c->N, 23));
    if (c->res) y = kn_add(ctx, y, rand_t(ctx, KN_F32, 2, ysh, 24));
    outs[0] = y;
    return no;
}

/* Case c: the reference fused (prologue taken) and unfused give the same
 * bits; backend be fused against its unfused plan and the reference within
 * tolerance (a prologue sums the squares in its own order; quantized
 * weights: the CPU quantizes A at decode). taken: be must take the prologue. */
static void run_pcase(const pcase *c, kn_backend *be, bool taken) {
    kn_backend *bes[2] = {kn_backend_ref(), be};
    float *v[2][2][2] = {{{0}}};   /* [backend][fused?][output] */
    int64_t n[2] = {0, 0};
    int no = 0;
    for (int b = 0; b < 2; b++)
        for (int f = 0; f < 2; f++) {
            kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = bes[b]});
            kn_tensor *o[2];
            no = pbuild(ctx, c, o);
            kn_plan *p = kn_plan_new(ctx, no, o, f ? NULL : &(kn_plan_opts){.no_fuse = true});
            bool ok = p && kn_plan_run(p) == KN_OK;
            CHECK(ok, "%s on %s: plan/run: %s", c->name, bes[b]->name, kn_last_error());
            if (ok && f && getenv("KN_TEST_VERBOSE")) kn_plan_print(p, stderr);
            kn_plan_stats st;
            kn_plan_get_stats(p, &st);
            bool want = f && !c->bad && (b == 0 || taken);
            CHECK(st.prologues == (int)want, "%s on %s (%s): %d prologues, expected %d", c->name, bes[b]->name,
                  f ? "fused" : "no_fuse", st.prologues, (int)want);
            for (int k = 0; k < no && ok; k++) v[b][f][k] = read_f32(o[k], &n[k]);
            kn_plan_free(p);
            kn_ctx_free(ctx);
        }
    /* against the reference: quantized weights (the CPU quantizes A at
     * decode), and 16-bit weights over several rows (a GPU's tensor-core
     * path rounds A to the weights' dtype), as run_case allows */
    double tol = c->wk >= 3 ? 3e-2 : c->wk == 2 ? 4 * tol_of(KN_BF16) : c->wk == 1 ? 4 * tol_of(KN_F16) : 2e-5;
    for (int k = 0; k < no; k++) {
        if (!v[0][0][k] || !v[0][1][k] || !v[1][0][k] || !v[1][1][k]) { CHECK(0, "%s: read back", c->name); break; }
        int64_t at, bad = differ(v[0][1][k], v[0][0][k], n[k], -1, &at);
        CHECK(!bad, "%s out %d: ref fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, k,
              (long long)bad, (long long)n[k], (long long)at, bad ? v[0][1][k][at] : 0, bad ? v[0][0][k][at] : 0);
        bad = differ(v[1][1][k], v[1][0][k], n[k], c->wk >= 3 ? 3e-2 : 2e-5, &at);
        CHECK(!bad, "%s out %d: %s fused vs unfused: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, k, be->name,
              (long long)bad, (long long)n[k], (long long)at, bad ? v[1][1][k][at] : 0, bad ? v[1][0][k][at] : 0);
        bad = differ(v[1][1][k], v[0][0][k], n[k], tol, &at);
        CHECK(!bad, "%s out %d: %s fused vs reference: %lld of %lld differ, first [%lld] %.9g vs %.9g", c->name, k, be->name,
              (long long)bad, (long long)n[k], (long long)at, bad ? v[1][1][k][at] : 0, bad ? v[0][0][k][at] : 0);
    }
    for (int b = 0; b < 2; b++) for (int f = 0; f < 2; f++) for (int k = 0; k < 2; k++) free(v[b][f][k]);
}

static const pcase g_pcases[] = {
    /* name            M  K     N    pre             w  wk res bad */
    {"norm_f32",       1, 1088, 77,  KN_OP_RMS_NORM, 1, 0, 1, 0},
    {"norm_f16",       1, 1088, 77,  KN_OP_RMS_NORM, 1, 1, 0, 0},
    {"norm_bf16_res",  1, 1088, 77,  KN_OP_RMS_NORM, 1, 2, 1, 0},
    {"norm_no_weight", 1, 576,  33,  KN_OP_RMS_NORM, 0, 2, 0, 0},
    {"norm_q8",        1, 1088, 77,  KN_OP_RMS_NORM, 1, 3, 1, 0},
    {"norm_q4",        1, 2080, 45,  KN_OP_RMS_NORM, 1, 4, 0, 0},
    {"silu_f32",       1, 1088, 77,  KN_OP_SILU,     0, 0, 0, 0},
    {"silu_bf16_res",  1, 1536, 77,  KN_OP_SILU,     0, 2, 1, 0},
    {"silu_f16",       1, 64,   300, KN_OP_SILU,     0, 1, 1, 0},
    {"silu_q8_res",    1, 1088, 77,  KN_OP_SILU,     0, 3, 1, 0},
    {"silu_q4",        1, 2080, 45,  KN_OP_SILU,     0, 4, 0, 0},
    {"norm_rows",      5, 1088, 77,  KN_OP_RMS_NORM, 1, 2, 1, 0},   /* not a decode row: the GPU leaves it to fusion */
    {"silu_rows",      3, 1088, 77,  KN_OP_SILU,     0, 0, 1, 0},
    {"norm_is_output", 1, 1088, 77,  KN_OP_RMS_NORM, 1, 2, 1, 1},   /* A is read elsewhere: stays a node */
    {"silu_is_output", 1, 1088, 77,  KN_OP_SILU,     0, 2, 0, 1},
};

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
    {"batch_shared_w",   F32,    3, 17, 29, 21, 0, 1, 1, KN_OP_GELU,      1, NONE_DT, 0, 3, 5},
    {"batch_shared_w_ta",F32,    2, 17, 29, 21, 1, 0, 2, KN_OP_RELU,      2, KN_F16,  0, 4, 5},
    {"batch_shared_bf16",KN_BF16,2, 17, 29, 21, 0, 1, 1, KN_OP_SILU,      1, NONE_DT, 0, 3, 5},
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

#endif
