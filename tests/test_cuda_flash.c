/* test_cuda_flash.c: the CUDA flash attention kernels (backends/cuda/
 * flash_attn.cu) against the reference backend, and 16-bit attention under
 * the mixed-precision policy.
 *
 * Each case builds y = sdpa(q, k, v) and, through kn_gradients with a random
 * dL/dy, the three gradients, on the reference backend and on CUDA from the
 * same 16-bit inputs (values rounded once to bf16/f16, then both backends
 * read the same bits). y, dq, dk, dv are compared one by one: the largest
 * error relative to the largest reference magnitude, and the rms error
 * relative to the rms reference (a few ulps of the dtype: the kernels round
 * P and dS to it before their MMAs). NaN must sit where the reference has it
 * (rows with no visible key). Shapes: q [B,Hq,Tq,D], k, v [B,Hkv,Tk,D];
 * "strided" cases take q, k, v as head views of one [B,T,3C] tensor (row
 * stride 3C) and differentiate that tensor. kn_cu_flash_runs() tells that
 * the flash kernels ran (a fallback would pass the comparison too); D = 80
 * must fall back and still be right. The gradient reads the log-sum-exp the
 * forward kept in its own block (sdpa's p.sdpa.lse, set because q, k, v
 * need gradients; kn__aux_bytes); a second pass over some cases clears that flag so that the
 * gradient recomputes it (the pre-pass), and the counters tell which ran.
 * Built without CUDA or run without a GPU, the tests SKIP.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_nn.h"

#ifndef KN_CUDA
TEST(cuda_flash) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#include "kiln_cuda.h"

uint64_t kn_cu_flash_runs(int which);    /* flash_attn.cu: 0 forward, 1 backward, 2 backward reading the kept L, 3 forward on wgmma */
void kn_cu_flash_sm90_mode(int mode);    /* flash_sm90.cu: 1 the wgmma forward wherever it fits, 0 never, -1 its own rule */
int kn_cuda_gemm_bf16_uses_wgmma(void);  /* 1 on an sm_90 device with wgmma */
static bool fa_keep = true;              /* false: clear the sdpa node's lse flag (the gradient's pre-pass runs) */
static int fa_want9 = -1;                /* the wgmma forward must (1) or must not (0) have run; -1 either */

static kn_backend *gpu(void) { return kn_backend_cuda(); }
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

typedef struct {
    kn_dtype dt;
    int B, Hq, Hkv, Tq, Tk, D, causal, strided;
    int flash;                 /* 1: must take the flash kernels, 0: must not */
} fa_case;

/* the inputs in the case's dtype; *leaf: what the gradients are taken of */
static int fa_build(kn_ctx *ctx, const fa_case *c, double *const *vals, kn_tensor **y, kn_tensor **gr, int *ngr, kn_tensor **g) {
    int64_t B = c->B, D = c->D;
    kn_tensor *q, *k, *v, *leaf[3];
    if (c->strided) {                    /* q, k, v: head views of [B,T,3C] (Tq == Tk, Hq == Hkv) */
        int64_t T = c->Tq, H = c->Hq, C = H * D;
        kn_tensor *qkv = kn_empty(ctx, c->dt, 3, (int64_t[]){B, T, 3 * C});
        kn_tensor_write(qkv, vals[0], KN_F64);
        kn_set_requires_grad(qkv, true);
        static const int perm[4] = {0, 2, 1, 3};
        kn_tensor *hv[3];
        for (int i = 0; i < 3; i++)
            hv[i] = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, qkv, 2, i * C, C), 4, (int64_t[]){B, T, H, D}), perm);
        q = hv[0]; k = hv[1]; v = hv[2];
        leaf[0] = qkv;
        *ngr = 1;
    } else {
        q = kn_empty(ctx, c->dt, 4, (int64_t[]){B, c->Hq, c->Tq, D});
        k = kn_empty(ctx, c->dt, 4, (int64_t[]){B, c->Hkv, c->Tk, D});
        v = kn_empty(ctx, c->dt, 4, (int64_t[]){B, c->Hkv, c->Tk, D});
        kn_tensor_write(q, vals[0], KN_F64);
        kn_tensor_write(k, vals[1], KN_F64);
        kn_tensor_write(v, vals[2], KN_F64);
        leaf[0] = q; leaf[1] = k; leaf[2] = v;
        for (int i = 0; i < 3; i++) kn_set_requires_grad(leaf[i], true);
        *ngr = 3;
    }
    *g = kn_empty(ctx, c->dt, 4, (int64_t[]){B, c->Hq, c->Tq, D});
    kn_tensor_write(*g, vals[3], KN_F64);
    *y = kn_sdpa(ctx, q, k, v, c->causal, 0);
    if (!*y) return -1;
    if (!fa_keep) (*y)->p.sdpa.lse = false;
    return kn_gradients(ctx, 1, y, g, *ngr, leaf, gr) == KN_OK ? 0 : -1;
}

/* outputs [0] = y, [1..] = gradients, as doubles */
static int fa_run(kn_backend *be, const fa_case *c, double *const *vals, double **out, int64_t *nout) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *y, *g, *gr[3] = {0};
    int ngr = 0, rc = fa_build(ctx, c, vals, &y, gr, &ngr, &g);
    for (int i = 0; rc == 0 && i <= ngr; i++) {
        kn_tensor *t = i ? gr[i - 1] : y;
        nout[i] = kn_numel(t);
        out[i] = malloc(sizeof(double) * (size_t)nout[i]);
        if (kn_tensor_read(t, out[i], KN_F64) != KN_OK) rc = -1;
    }
    if (rc) fprintf(stderr, "  %s: %s\n", kn_backend_name(be), kn_last_error());
    kn_ctx_free(ctx);
    return rc ? -1 : ngr + 1;
}

/* worst of (max |a-r| / max |r|) / mtol and (rms(a-r) / rms(r)) / rtol over the
 * non-NaN elements; NaN placement must match */
static double fa_err(const double *a, const double *r, int64_t n, double mtol, double rtol, const char *what) {
    double mx = 0, mr = 0, se = 0, sr = 0;
    int64_t nnan = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(r[i])) { fprintf(stderr, "  %s[%lld]: cuda %g ref %g\n", what, (long long)i, a[i], r[i]); return INFINITY; }
        if (isnan(r[i])) { nnan++; continue; }
        double d = fabs(a[i] - r[i]);
        if (d > mx) mx = d;
        if (fabs(r[i]) > mr) mr = fabs(r[i]);
        se += d * d; sr += r[i] * r[i];
    }
    /* floors: a reference that is exactly 0 (Tq = Tk = 1: dS = P (dP - D) = 0)
     * is matched to rounding noise, not to 0 bits */
    int64_t m = n - nnan;
    double em = mx / fmax(mr, 1e-2), er = m ? sqrt(se / (double)m) / fmax(sqrt(sr / (double)m), 1e-3) : 0;
    double w = fmax(em / mtol, er / rtol);
    if (w > 1) fprintf(stderr, "  %s: max err %.3g of max %.3g (rel %.3g), rms rel %.3g\n", what, mx, mr, em, er);
    return w;
}

static void fa_check(const fa_case *c, int idx) {
    int64_t n[4];
    if (c->strided) n[0] = (int64_t)c->B * c->Tq * 3 * c->Hq * c->D;
    else {
        n[0] = (int64_t)c->B * c->Hq * c->Tq * c->D;
        n[1] = n[2] = (int64_t)c->B * c->Hkv * c->Tk * c->D;
    }
    n[3] = (int64_t)c->B * c->Hq * c->Tq * c->D;
    double *vals[4];
    for (int i = 0; i < 4; i++) {
        if (c->strided && (i == 1 || i == 2)) { vals[i] = NULL; continue; }
        vals[i] = malloc(sizeof(double) * (size_t)n[i]);
        for (int64_t j = 0; j < n[i]; j++) vals[i][j] = kn_test_uniform(-2, 2);
    }
    double *ro[4] = {0}, *co[4] = {0};
    int64_t rn[4] = {0}, cn[4] = {0};
    uint64_t f0 = kn_cu_flash_runs(0), b0 = kn_cu_flash_runs(1), k0 = kn_cu_flash_runs(2), w0 = kn_cu_flash_runs(3);
    int nr = fa_run(kn_backend_ref(), c, vals, ro, rn), nc = fa_run(gpu(), c, vals, co, cn);
    uint64_t df = kn_cu_flash_runs(0) - f0, db = kn_cu_flash_runs(1) - b0, dk = kn_cu_flash_runs(2) - k0;
    uint64_t dw = kn_cu_flash_runs(3) - w0;
    CHECK(nr > 0 && nc == nr, "case %d: ref %d cuda %d outputs", idx, nr, nc);
    bool bf = c->dt == KN_BF16;
    double mtol = bf ? 0.02 : 0.004, rtol = bf ? 0.01 : 0.002;   /* ~2-4 ulps of the dtype */
    static const char *names[4] = {"y", "dq", "dk", "dv"};
    for (int i = 0; nr > 0 && i < nr && nc == nr; i++) {
        CHECK(rn[i] == cn[i], "case %d %s: sizes %lld vs %lld", idx, names[i], (long long)rn[i], (long long)cn[i]);
        if (rn[i] != cn[i]) continue;
        double e = fa_err(co[i], ro[i], rn[i], mtol, rtol, c->strided && i ? "dqkv" : names[i]);
        CHECK(e <= 1, "case %d (%s D=%d Hq=%d Hkv=%d Tq=%d Tk=%d causal=%d strided=%d): %s off by %.3g x tol",
              idx, bf ? "bf16" : "f16", c->D, c->Hq, c->Hkv, c->Tq, c->Tk, c->causal, c->strided, names[i], e);
    }
    if (c->flash) CHECK(df >= 1 && db >= 1, "case %d: flash forward ran %llu times, backward %llu (want both)", idx,
                        (unsigned long long)df, (unsigned long long)db);
    if (c->flash) CHECK(fa_keep ? dk == db : dk == 0, "case %d (keep %d): %llu of %llu backward runs read the kept log-sum-exp",
                        idx, fa_keep, (unsigned long long)dk, (unsigned long long)db);
    else CHECK(df == 0 && db == 0, "case %d: must fall back, but flash ran %llu + %llu times", idx,
               (unsigned long long)df, (unsigned long long)db);
    if (c->flash && fa_want9 >= 0)
        CHECK(fa_want9 ? dw == df : dw == 0, "case %d: %llu of %llu forwards on the wgmma kernel (want %s)", idx,
              (unsigned long long)dw, (unsigned long long)df, fa_want9 ? "all" : "none");
    for (int i = 0; i < 4; i++) { free(vals[i]); free(ro[i]); free(co[i]); }
}

TEST(flash_attention_matches_reference) {
    NEED_GPU();
    kn_test_seed(71);
    static const fa_case C[] = {
        /* dt       B  Hq Hkv Tq   Tk   D   causal strided flash */
        {KN_BF16,   2, 2, 2,  200, 200, 64,  1, 0, 1},
        {KN_F16,    2, 2, 2,  37,  37,  64,  0, 0, 1},
        {KN_BF16,   1, 2, 2,  37,  200, 128, 1, 0, 1},    /* causal offset Tk - Tq = 163 */
        {KN_F16,    2, 3, 3,  1,   1,   128, 1, 0, 1},
        {KN_F16,    1, 2, 2,  64,  129, 64,  1, 0, 1},
        {KN_BF16,   2, 8, 2,  130, 130, 64,  1, 0, 1},    /* grouped-query */
        {KN_F16,    1, 8, 2,  64,  129, 128, 0, 0, 1},
        {KN_BF16,   2, 2, 2,  100, 100, 64,  1, 1, 1},    /* views of [B,T,3C] */
        {KN_F16,    1, 2, 2,  77,  77,  128, 0, 1, 1},
        {KN_BF16,   1, 2, 1,  40,  30,  64,  1, 0, 1},    /* Tq > Tk: rows 0..9 see no key (NaN y, dq) */
        {KN_BF16,   1, 2, 2,  50,  50,  80,  1, 0, 0},    /* D = 80: falls back */
    };
    /* on an sm_90 GPU every case runs on both forward kernels: flash_sm90.cu's
     * (wgmma + TMA) and flash_attn.cu's (mma.sync); elsewhere once */
    const bool sm90 = kn_cuda_gemm_bf16_uses_wgmma() != 0;
    for (int mode = sm90 ? 1 : -1; mode >= (sm90 ? 0 : -1); mode--) {
        kn_cu_flash_sm90_mode(mode);
        fa_want9 = mode;
        for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) fa_check(&C[i], (int)i + (mode == 0 ? 200 : 0));
    }
    kn_cu_flash_sm90_mode(-1);
    fa_want9 = -1;
    /* the gradient's own pre-pass (no kept log-sum-exp): causal, offset, GQA, views, rows without keys */
    static const int again[] = {0, 2, 5, 7, 9};
    fa_keep = false;
    for (size_t i = 0; i < sizeof again / sizeof again[0]; i++) fa_check(&C[again[i]], 100 + again[i]);
    fa_keep = true;
}

/* the sdpa node under graph y (NULL if none) */
static kn_tensor *find_sdpa(kn_tensor *t, int depth) {
    if (!t || depth > 64) return NULL;
    if (t->op == KN_OP_SDPA) return t;
    for (int i = 0; i < KN_MAX_SRC; i++) {
        kn_tensor *s = find_sdpa(t->src[i], depth + 1);
        if (s) return s;
    }
    return t->view_src && t->view_src != t ? find_sdpa(t->view_src, depth + 1) : NULL;
}

/* bf16 policy on CUDA: the Attention module's sdpa gets 16-bit operands and
 * runs the flash kernels; the output stays close to the f32 module's */
TEST(bf16_policy_runs_16bit_attention) {
    NEED_GPU();
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_nn_manual_seed(3);
    kn_attn_cfg cfg = {.dim = 128, .n_heads = 2, .fused_qkv = true, .causal = true, .bias = true};
    kn_module *m = kn_attention_new(ctx, &cfg);
    REQUIRE(m, "%s", kn_last_error());
    kn_test_seed(5);
    int64_t B = 2, T = 48, n = B * T * cfg.dim;
    float *x = malloc(sizeof(float) * (size_t)n), *y0 = malloc(sizeof(float) * (size_t)n), *y1 = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)kn_test_uniform(-1, 1);
    kn_tensor *xt = kn_from_data(ctx, KN_F32, 3, (int64_t[]){B, T, cfg.dim}, x);
    kn_tensor *y = kn_attention_forward(m, xt, NULL);
    REQUIRE(y && kn_tensor_read(y, y0, KN_F32) == KN_OK, "f32 forward: %s", kn_last_error());
    kn_tensor *s = find_sdpa(y, 0);
    REQUIRE(s, "no sdpa node under the f32 module's output");
    CHECK(s->src[0]->dtype == KN_F32, "f32 policy: sdpa q is %s", kn_dtype_name(s->src[0]->dtype));

    REQUIRE(kn_module_set_precision(m, KN_PREC_BF16) == KN_OK, "%s", kn_last_error());
    uint64_t f0 = kn_cu_flash_runs(0);
    y = kn_attention_forward(m, xt, NULL);
    REQUIRE(y && kn_tensor_read(y, y1, KN_F32) == KN_OK, "bf16 forward: %s", kn_last_error());
    s = find_sdpa(y, 0);
    REQUIRE(s, "no sdpa node under the bf16 module's output");
    for (int i = 0; i < 3; i++)
        CHECK(s->src[i]->dtype == KN_BF16, "bf16 policy on CUDA: sdpa source %d is %s (attention stayed f32?)", i,
              kn_dtype_name(s->src[i]->dtype));
    CHECK(y->dtype == KN_F32, "the module's output is %s, want f32", kn_dtype_name(y->dtype));
    CHECK(kn_cu_flash_runs(0) > f0, "the bf16 attention did not run the flash kernel");
    double se = 0, sr = 0;
    for (int64_t i = 0; i < n; i++) { se += (y1[i] - y0[i]) * (double)(y1[i] - y0[i]); sr += (double)y0[i] * y0[i]; }
    CHECK(sqrt(se / sr) < 0.02, "bf16 vs f32 attention: rms rel %g", sqrt(se / sr));
    free(x); free(y0); free(y1);
    kn_ctx_free(ctx);
}
#endif

KN_TEST_MAIN()
