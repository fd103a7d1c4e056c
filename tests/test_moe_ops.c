/* test_moe_ops.c: the mixture-of-experts ops (src/graph/ops_moe.c):
 *  - MUL_MAT_ID (y[t, j] = W[ids[t, j]] . x[t, j]) on the reference backend
 *    against a plain loop in this file, then the fast CPU backend (and, built
 *    with CUDA on a GPU, the CUDA backend) against the reference on random
 *    data: odd C and N, E not a power of two, k = 1, 2, 8, x [T, C],
 *    [T, 1, C], [T, k, C] and a transposed view, T from 1 (decode: the GEMV
 *    and quantized dots) to 70 (the dequantize-once SGEMM), experts that get
 *    no row, i32 and i64 ids, W f32, f16, bf16 and GGUF blocks (Q4_0, Q8_0,
 *    Q4_K, Q6_K; exact with f32 activations, within the activation
 *    quantization's error by default); an id out of range is an error;
 *  - its gradient (to x and W) by finite differences in f64 for every x
 *    layout, and the CPU backend's f32 gradient against the reference's; a
 *    quantized W has none (backward says so).
 *  - TOPK: values and indices against a sort in this file (largest and
 *    smallest, k = 1 .. n, ties to the lower index, leading dims, x
 *    contiguous and a transposed view), the
 *    gradient to the values by finite differences, bad k refused.
 * Letters: T tokens, K slots per token, C input width, E experts, N output width.
 */
#include "kn_optest.h"
#include "kiln.h"
#include "backends/quant/qpack.h"
#include "kiln_backend.h"        // defines: struct kn_backend (name), kn_store
#include "backends/quant/quant.h"
#include "core/core.h"       // defines: struct kn_buffer (derived)
#include "core/cpu.h"
#include <stdatomic.h>   // defines: kn_quantize_row, kn_dequantize_row, kn_quant_force_act_mode
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SH(...) ((int64_t[]){__VA_ARGS__})

typedef struct {
    int64_t T, K, E, N, C;
    int xmode;              /* 0: x [T, K, C]; 1: [T, C]; 2: [T, 1, C]; 3: [T, K, C] as a transposed view */
    kn_dtype wdt;
    kn_dtype idt;           /* KN_I32 or KN_I64 */
} mm_case;

typedef struct {
    double *x;              /* as x's logical shape */
    float *wf;              /* [E, N, C] as W holds it (rounded through wdt) */
    void *wraw;             /* W's storage in wdt */
    int64_t *ids;           /* [T, K] */
} mm_data;

static int64_t x_rows(const mm_case *c) { return c->xmode == 1 || c->xmode == 2 ? 1 : c->K; }

/* random data; ids: each token a duplicate-free draw of K experts, expert
 * `skip` never chosen (an expert with no row) when E > K */
static void mm_make(const mm_case *c, mm_data *d, int64_t skip) {
    int64_t nx = c->T * x_rows(c) * c->C, nw = c->E * c->N * c->C;
    d->x = malloc(sizeof(double) * (size_t)nx);
    for (int64_t i = 0; i < nx; i++) d->x[i] = kn_test_uniform(-1, 1);
    float *w = malloc(sizeof(float) * (size_t)nw);
    for (int64_t i = 0; i < nw; i++) w[i] = (float)kn_test_uniform(-1, 1);
    size_t rb = kn_dtype_nbytes(c->wdt, c->C);
    d->wraw = malloc(rb * (size_t)(c->E * c->N));
    d->wf = malloc(sizeof(float) * (size_t)nw);
    for (int64_t r = 0; r < c->E * c->N; r++) {
        char *dst = (char *)d->wraw + rb * (size_t)r;
        if (c->wdt == KN_F32) memcpy(dst, w + r * c->C, rb);
        else if (c->wdt == KN_F16 || c->wdt == KN_BF16)
            for (int64_t i = 0; i < c->C; i++) kn_store(c->wdt, dst, i, w[r * c->C + i]);
        else kn_quantize_row(c->wdt, w + r * c->C, dst, c->C);
        kn_dequantize_row(c->wdt, dst, d->wf + r * c->C, c->C);
    }
    free(w);
    d->ids = malloc(sizeof(int64_t) * (size_t)(c->T * c->K));
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)c->E);
    for (int64_t t = 0; t < c->T; t++) {
        int64_t n = 0;
        for (int64_t e = 0; e < c->E; e++) if (e != skip || c->E <= c->K) perm[n++] = e;
        for (int64_t j = 0; j < c->K; j++) {
            int64_t p = j + (int64_t)(kn_test_uniform(0, 1) * (double)(n - j));
            if (p >= n) p = n - 1;
            int64_t s = perm[j]; perm[j] = perm[p]; perm[p] = s;
            d->ids[t * c->K + j] = perm[j];
        }
    }
    free(perm);
}
static void mm_free(mm_data *d) { free(d->x); free(d->wf); free(d->wraw); free(d->ids); }

/* the plain loop: y[t, j, n] = sum_c wf[id, n, c] * x[t, j', c] */
static double *mm_naive(const mm_case *c, const mm_data *d) {
    double *y = malloc(sizeof(double) * (size_t)(c->T * c->K * c->N));
    int64_t xr = x_rows(c);
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t j = 0; j < c->K; j++) {
            int64_t id = d->ids[t * c->K + j];
            const double *xv = d->x + (t * xr + (xr == 1 ? 0 : j)) * c->C;
            for (int64_t n = 0; n < c->N; n++) {
                double s = 0;
                for (int64_t i = 0; i < c->C; i++) s += (double)d->wf[(id * c->N + n) * c->C + i] * xv[i];
                y[(t * c->K + j) * c->N + n] = s;
            }
        }
    return y;
}

static bool g_constant;      /* mark W constant (kn_set_constant): the CPU may pack it */
static int g_packed;         /* runs in which W got a packed copy */

/* the op on backend be; *out [T*K*N] (malloc'd); ids_bad: replace one id by E */
static kn_status mm_run(kn_backend *be, const mm_case *c, const mm_data *d, bool ids_bad, double **out) {
    *out = NULL;
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *x;
    int64_t T = c->T, K = c->K, C = c->C;
    if (c->xmode == 1) x = kn_empty(ctx, KN_F32, 2, SH(T, C));
    else if (c->xmode == 2) x = kn_empty(ctx, KN_F32, 3, SH(T, 1, C));
    else if (c->xmode == 0) x = kn_empty(ctx, KN_F32, 3, SH(T, K, C));
    else x = kn_transpose(ctx, kn_empty(ctx, KN_F32, 3, SH(T, C, K)), 1, 2);
    kn_status st = kn_tensor_write(x, d->x, KN_F64);
    kn_tensor *w = kn_from_data(ctx, c->wdt, 3, SH(c->E, c->N, C), d->wraw);
    if (g_constant && w) kn_set_constant(w);
    kn_tensor *ids = kn_empty(ctx, c->idt, 2, SH(T, K));
    double *iv = malloc(sizeof(double) * (size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) iv[i] = (double)d->ids[i];
    if (ids_bad) iv[(T * K) / 2] = (double)c->E;
    if (!st) st = kn_tensor_write(ids, iv, KN_F64);
    free(iv);
    kn_tensor *y = kn_mul_mat_id(ctx, x, w, ids);
    if (!st && !y) st = kn_ctx_status(ctx);
    if (!st) {
        *out = malloc(sizeof(double) * (size_t)(T * K * c->N));
        st = kn_tensor_read(y, *out, KN_F64);
        if (st) { free(*out); *out = NULL; }
        if (!st && __atomic_load_n(&w->buf->derived, __ATOMIC_ACQUIRE)) g_packed++;
    }
    kn_ctx_free(ctx);
    return st;
}

static const mm_case g_cases[] = {
    /*  T  K   E   N    C  xmode  wdt     idt */
    {1, 1, 3, 5, 7, 1, KN_F32, KN_I32},
    {1, 2, 5, 33, 19, 2, KN_F32, KN_I64},
    {7, 2, 5, 17, 23, 0, KN_F32, KN_I32},
    {9, 8, 11, 13, 31, 3, KN_F32, KN_I32},
    {70, 2, 7, 45, 37, 1, KN_F32, KN_I64},
    {5, 8, 9, 21, 64, 2, KN_F16, KN_I32},
    {3, 2, 6, 19, 96, 0, KN_BF16, KN_I32},
    {70, 2, 5, 24, 64, 1, KN_BF16, KN_I32},
    {1, 2, 7, 40, 64, 1, KN_Q4_0, KN_I32},
    {6, 8, 10, 24, 96, 2, KN_Q8_0, KN_I64},
    {40, 2, 6, 17, 64, 3, KN_Q4_0, KN_I32},
    {5, 2, 4, 32, 64, 1, KN_Q4_1, KN_I32},      /* experts of 16k rows: a packed copy serves them (qpack.h) */
    {3, 2, 6, 48, 96, 0, KN_Q8_0, KN_I64},
    {2, 2, 5, 12, 256, 1, KN_Q4_K, KN_I32},
    {37, 1, 3, 9, 256, 2, KN_Q6_K, KN_I32},
};
#define N_CASES (int)(sizeof g_cases / sizeof g_cases[0])

static void case_str(const mm_case *c, char *b, size_t n) {
    snprintf(b, n, "T %lld K %lld E %lld N %lld C %lld x%d %s ids %s", (long long)c->T, (long long)c->K, (long long)c->E,
             (long long)c->N, (long long)c->C, c->xmode, kn_dtype_name(c->wdt), kn_dtype_name(c->idt));
}

TEST(mul_mat_id_reference_vs_loop) {
    kn_test_seed(11);
    for (int i = 0; i < N_CASES; i++) {
        const mm_case *c = &g_cases[i];
        mm_data d;
        mm_make(c, &d, 2);
        double *want = mm_naive(c, &d), *got;
        kn_status st = mm_run(kn_backend_ref(), c, &d, false, &got);
        char s[160];
        case_str(c, s, sizeof s);
        CHECK(!st, "%s: %s", s, kn_last_error());
        if (!st) {
            double e = kn_rel_err(got, want, (long)(c->T * c->K * c->N));
            CHECK(e < 1e-6, "%s: ref vs loop rel err %g", s, e);
        }
        free(want); free(got); mm_free(&d);
    }
}

/* the backend against the reference; act_f32: quantized W meets f32
 * activations on the CPU (exact up to f32 sums) */
static void backend_vs_ref(kn_backend *be, const char *name, bool act_f32) {
    kn_test_seed(12);
    if (act_f32) kn_quant_force_act_mode(KN_QACT_F32);
    for (int i = 0; i < N_CASES; i++) {
        const mm_case *c = &g_cases[i];
        mm_data d;
        mm_make(c, &d, i % 3);
        double *want = NULL, *got = NULL;
        char s[160];
        case_str(c, s, sizeof s);
        kn_status st = mm_run(kn_backend_ref(), c, &d, false, &want);
        if (!st) st = mm_run(be, c, &d, false, &got);
        CHECK(!st, "%s on %s: %s", s, name, kn_last_error());
        if (!st) {
            bool quant_act = kn_dtype_get(c->wdt)->is_quant && !act_f32;   /* groups under 48 rows quantize x */
            /* a packed copy (constant W, 16-row experts): 16-bit activations, error ~1e-5 */
            bool packed = g_constant && quant_act && c->N % 16 == 0 && kn_cpu()->avx512vnni && kn_qpack_type_ok(c->wdt);
            double tol = packed ? 1e-4 : quant_act ? 2e-2 : 1e-5;
            double e = kn_rel_err(got, want, (long)(c->T * c->K * c->N));
            CHECK(e < tol, "%s: %s vs ref rel err %g (tolerance %g)", s, name, e, tol);
        }
        free(want); free(got); mm_free(&d);
    }
    if (act_f32) kn_quant_force_act_mode(-1);
}
TEST(mul_mat_id_cpu_vs_reference) { backend_vs_ref(kn_backend_cpu(), "cpu", false); }
TEST(mul_mat_id_cpu_vs_reference_f32_activations) { backend_vs_ref(kn_backend_cpu(), "cpu", true); }
TEST(mul_mat_id_cpu_packed_experts) {
    g_constant = true; g_packed = 0;
    backend_vs_ref(kn_backend_cpu(), "cpu", false);
    g_constant = false;
    bool can = kn_cpu()->isa >= KN_ISA_AVX512 && kn_cpu()->avx512vnni;
#ifdef KN_NO_AVX512
    can = false;
#endif
    CHECK(can ? g_packed >= 2 : g_packed == 0, "packed copies in %d runs (CPU can: %d)", g_packed, can);
}

/* every slot of every token on one expert, and all experts used */
TEST(mul_mat_id_one_expert_and_all_experts) {
    kn_test_seed(13);
    mm_case c = {12, 1, 4, 9, 16, 1, KN_F32, KN_I32};
    mm_data d;
    mm_make(&c, &d, -1);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t t = 0; t < c.T; t++) d.ids[t] = pass ? t % c.E : 3;
        double *want = mm_naive(&c, &d), *got;
        kn_status st = mm_run(kn_backend_cpu(), &c, &d, false, &got);
        CHECK(!st, "%s", kn_last_error());
        if (!st) CHECK(kn_rel_err(got, want, (long)(c.T * c.N)) < 1e-5, "pass %d: cpu vs loop", pass);
        free(want); free(got);
    }
    mm_free(&d);
}

TEST(mul_mat_id_bad_id_is_an_error) {
    kn_test_seed(14);
    mm_case c = {4, 2, 5, 6, 8, 0, KN_F32, KN_I32};
    mm_data d;
    mm_make(&c, &d, -1);
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
    for (int b = 0; b < 2; b++) {
        double *got;
        kn_status st = mm_run(bes[b], &c, &d, true, &got);
        CHECK(st == KN_ERR_INVALID && strstr(kn_last_error(), "mul_mat_id") && strstr(kn_last_error(), "index 5"),
              "%s: status %d, message '%s'", bes[b]->name, st, kn_last_error());
        free(got);
    }
    mm_free(&d);
}

TEST(mul_mat_id_shape_errors_and_quantized_backward) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, SH(3, 8));
    kn_tensor *w = kn_zeros(ctx, KN_F32, 3, SH(4, 5, 8));
    kn_tensor *ids = kn_zeros(ctx, KN_I32, 2, SH(3, 2));
    CHECK(!kn_mul_mat_id(ctx, x, kn_zeros(ctx, KN_F32, 3, SH(4, 5, 9)), ids) && strstr(kn_last_error(), "mul_mat_id"), "C mismatch");
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    x = kn_zeros(ctx, KN_F32, 2, SH(3, 8));
    ids = kn_zeros(ctx, KN_I32, 2, SH(3, 2));
    CHECK(!kn_mul_mat_id(ctx, x, kn_zeros(ctx, KN_Q4_0, 3, SH(4, 5, 8)), ids) && strstr(kn_last_error(), "block size"), "q4_0 C = 8");
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    x = kn_zeros(ctx, KN_F32, 2, SH(3, 8));
    CHECK(!kn_mul_mat_id(ctx, x, kn_zeros(ctx, KN_F32, 3, SH(4, 5, 8)), kn_zeros(ctx, KN_F32, 2, SH(3, 2))) &&
          strstr(kn_last_error(), "integer"), "float ids");
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    x = kn_zeros(ctx, KN_F32, 2, SH(3, 32));
    w = kn_zeros(ctx, KN_Q8_0, 3, SH(4, 5, 32));
    ids = kn_zeros(ctx, KN_I32, 2, SH(3, 2));
    kn_set_requires_grad(x, true);
    kn_tensor *y = kn_mul_mat_id(ctx, x, w, ids);
    kn_status st = kn_backward(ctx, kn_sum_all(ctx, y));
    CHECK(st == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "quantized (q8_0) W"), "backward: %d %s", st, kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- mul_mat_id's gradient ------------------------------------------------------- */
typedef struct { int xmode; int64_t K; } mmg_ud;    /* xmode as mm_case */
static kn_tensor *build_mmid(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const mmg_ud *u = ud;
    kn_tensor *x = in[0];
    if (u->xmode == 3) x = kn_transpose(ctx, x, 1, 2);        /* stored [T, C, K] */
    return kn_mul_mat_id(ctx, x, in[1], kn_cast(ctx, in[2], KN_I32));   /* gradcheck makes every input f64 */
}
/* finite differences in f64 (reference), with ids hitting a few experts twice
 * per token and some experts never */
TEST(mul_mat_id_gradient) {
    kn_test_seed(15);
    for (int xm = 0; xm < 4; xm++) {
        int64_t T = 3, K = 2, E = 5, N = 4, C = 6;
        mmg_ud u = {xm, K};
        kn_opin in[3] = {
            {xm == 1 ? 2 : 3, {0}, -1, 1, KN_F64},
            {3, {E, N, C}, -1, 1, KN_F64},
            {2, {T, K}, 0, 4, KN_I32, false, true},                 /* experts 0..3: expert 4 gets nothing */
        };
        if (xm == 1) { in[0].shape[0] = T; in[0].shape[1] = C; }
        else if (xm == 2) { in[0].shape[0] = T; in[0].shape[1] = 1; in[0].shape[2] = C; }
        else if (xm == 0) { in[0].shape[0] = T; in[0].shape[1] = K; in[0].shape[2] = C; }
        else { in[0].shape[0] = T; in[0].shape[1] = C; in[0].shape[2] = K; }
        bool req[3] = {true, true, false};
        double e = kn_gradcheck(build_mmid, &u, 3, in, req);
        CHECK(e < 1e-6, "x mode %d: gradient rel err %g", xm, e);
    }
}

/* the f32 gradients the CPU backend computes (W^T through the SGEMM) against
 * the reference's */
TEST(mul_mat_id_gradient_cpu_vs_reference) {
    kn_test_seed(16);
    int64_t T = 37, K = 2, E = 7, N = 19, C = 23;
    double *xv = malloc(sizeof(double) * (size_t)(T * C)), *wv = malloc(sizeof(double) * (size_t)(E * N * C));
    double *iv = malloc(sizeof(double) * (size_t)(T * K));
    for (int64_t i = 0; i < T * C; i++) xv[i] = kn_test_uniform(-1, 1);
    for (int64_t i = 0; i < E * N * C; i++) wv[i] = kn_test_uniform(-1, 1);
    for (int64_t t = 0; t < T; t++) { iv[t * K] = (double)(t % E); iv[t * K + 1] = (double)((t + 3) % E); }
    double *g[2][2] = {{0}};
    for (int b = 0; b < 2; b++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){b ? kn_backend_cpu() : kn_backend_ref()});
        kn_tensor *x = kn_empty(ctx, KN_F32, 2, SH(T, C)), *w = kn_empty(ctx, KN_F32, 3, SH(E, N, C));
        kn_tensor *ids = kn_empty(ctx, KN_I32, 2, SH(T, K));
        kn_tensor_write(x, xv, KN_F64); kn_tensor_write(w, wv, KN_F64); kn_tensor_write(ids, iv, KN_F64);
        kn_set_requires_grad(x, true); kn_set_requires_grad(w, true);
        kn_tensor *y = kn_mul_mat_id(ctx, x, w, ids);
        kn_tensor *loss = kn_sum_all(ctx, kn_mul(ctx, y, y));
        kn_status st = kn_backward(ctx, loss);
        CHECK(!st, "%s", kn_last_error());
        g[b][0] = malloc(sizeof(double) * (size_t)(T * C)); g[b][1] = malloc(sizeof(double) * (size_t)(E * N * C));
        if (!st) { kn_tensor_read(x->grad, g[b][0], KN_F64); kn_tensor_read(w->grad, g[b][1], KN_F64); }
        kn_ctx_free(ctx);
    }
    double ex = kn_rel_err(g[1][0], g[0][0], (long)(T * C)), ew = kn_rel_err(g[1][1], g[0][1], (long)(E * N * C));
    CHECK(ex < 1e-5 && ew < 1e-5, "cpu vs ref: dx rel err %g, dW rel err %g", ex, ew);
    for (int b = 0; b < 2; b++) { free(g[b][0]); free(g[b][1]); }
    free(xv); free(wv); free(iv);
}

/* ---- topk ----------------------------------------------------------------------- */
/* sorted order of row v[n] (largest or smallest first, ties: lower index) */
static void sort_idx(const double *v, int64_t n, bool largest, int64_t *idx) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int64_t i = 1; i < n; i++)   /* insertion sort: stable */
        for (int64_t j = i; j > 0; j--) {
            double a = v[idx[j]], b = v[idx[j - 1]];
            if (largest ? a > b : a < b) { int64_t s = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = s; }
            else break;
        }
}

/* the same order by qsort, for long rows */
static const double *g_sv;
static int g_largest;
static int cmp_sv(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    double x = g_sv[a], y = g_sv[b];
    if (x != y) return (g_largest ? x > y : x < y) ? -1 : 1;
    return a < b ? -1 : 1;
}
static void sort_idx_long(const double *v, int64_t n, bool largest, int64_t *idx) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    g_sv = v;
    g_largest = largest;
    qsort(idx, (size_t)n, sizeof(int64_t), cmp_sv);
}

/* strided: x is a transposed view (the last dim has stride rows_b) */
static void topk_case_s(kn_backend *be, int64_t rows_a, int64_t rows_b, int64_t n, int64_t k, bool largest, bool ties,
                        bool strided) {
    int64_t R = rows_a * rows_b, nx = R * n;
    double *x = malloc(sizeof(double) * (size_t)nx);
    /* f32 values (the tensor's), so the reference sorts what the kernel sees */
    for (int64_t i = 0; i < nx; i++) x[i] = ties ? floor(kn_test_uniform(0, 3)) : (float)kn_test_uniform(-2, 2);
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *xt = strided ? kn_transpose(ctx, kn_empty(ctx, KN_F32, 3, SH(rows_a, n, rows_b)), 1, 2)
                            : kn_empty(ctx, KN_F32, 3, SH(rows_a, rows_b, n));
    kn_tensor_write(xt, x, KN_F64);
    kn_tensor *idx = NULL, *val = kn_topk(ctx, xt, k, largest, &idx);
    REQUIRE(val && idx && idx->dtype == KN_I32 && val->shape[2] == k && idx->shape[2] == k, "topk: %s", kn_last_error());
    double *gv = malloc(sizeof(double) * (size_t)(R * k)), *gi = malloc(sizeof(double) * (size_t)(R * k));
    kn_status st = kn_tensor_read(val, gv, KN_F64);
    if (!st) st = kn_tensor_read(idx, gi, KN_F64);
    CHECK(!st, "%s", kn_last_error());
    int64_t *want = malloc(sizeof(int64_t) * (size_t)n);
    int bad = 0;
    for (int64_t r = 0; r < R && !st; r++) {
        if (n > 256) sort_idx_long(x + r * n, n, largest, want);
        else sort_idx(x + r * n, n, largest, want);
        for (int64_t j = 0; j < k; j++)
            if (gi[r * k + j] != (double)want[j] || gv[r * k + j] != (double)(float)x[r * n + want[j]]) bad++;
    }
    CHECK(!bad, "%s: n %lld k %lld %s%s: %d wrong", be->name, (long long)n, (long long)k, largest ? "largest" : "smallest",
          ties ? " (ties)" : "", bad);
    free(want); free(gv); free(gi); free(x);
    kn_ctx_free(ctx);
}
/* a masked vocabulary: all but `finite` values -inf (largest) or +inf
 * (smallest), so the k-th best is an infinity and a short last chunk pads */
static void topk_masked_case(kn_backend *be, int64_t n, int64_t k, int64_t finite, bool largest) {
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = largest ? -INFINITY : INFINITY;
    for (int64_t i = 0; i < finite; i++) x[(i * 7919) % n] = (float)kn_test_uniform(-2, 2);
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *xt = kn_empty(ctx, KN_F32, 1, SH(n));
    kn_tensor_write(xt, x, KN_F64);
    kn_tensor *idx = NULL, *val = kn_topk(ctx, xt, k, largest, &idx);
    double *gi = malloc(sizeof(double) * (size_t)k);
    int64_t *want = malloc(sizeof(int64_t) * (size_t)n);
    CHECK(val && !kn_tensor_read(idx, gi, KN_F64), "%s", kn_last_error());
    sort_idx_long(x, n, largest, want);
    int bad = 0;
    for (int64_t j = 0; j < k; j++) bad += gi[j] != (double)want[j];
    CHECK(!bad, "%s: masked row n %lld k %lld (%lld finite) %s: %d wrong", be->name, (long long)n, (long long)k, (long long)finite,
          largest ? "largest" : "smallest", bad);
    free(x); free(gi); free(want);
    kn_ctx_free(ctx);
}
static void topk_case(kn_backend *be, int64_t rows_a, int64_t rows_b, int64_t n, int64_t k, bool largest, bool ties) {
    topk_case_s(be, rows_a, rows_b, n, k, largest, ties, false);
    topk_case_s(be, rows_a, rows_b, n, k, largest, ties, true);
}

TEST(topk_against_sort) {
    kn_test_seed(21);
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
    for (int b = 0; b < 2; b++) {
        int64_t ns[] = {1, 5, 8, 60, 129, 3001};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            int64_t n = ns[i], ks[] = {1, 2, n < 8 ? n : 8, n};
            for (int j = 0; j < 4; j++) {
                if (ks[j] > n) continue;
                topk_case(bes[b], 2, 3, n, ks[j], true, false);
                topk_case(bes[b], 1, 5, n, ks[j], false, false);
                topk_case(bes[b], 3, 1, n, ks[j], true, true);
            }
        }
        topk_masked_case(bes[b], 4100, 64, 10, true);
        topk_masked_case(bes[b], 300, 40, 0, false);
    }
}

static kn_tensor *build_topk_sum(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int64_t k = *(int64_t *)ud;
    return kn_mul(ctx, kn_topk(ctx, in[0], k, true, NULL), kn_topk(ctx, in[0], k, true, NULL));
}
TEST(topk_gradient_to_values) {
    kn_test_seed(22);
    for (int64_t k = 1; k <= 4; k += 3) {
        kn_opin in = {3, {2, 3, 7}, -2, 2, KN_F64};
        bool req = true;
        double e = kn_gradcheck(build_topk_sum, &k, 1, &in, &req);
        CHECK(e < 1e-6, "k %lld: gradient rel err %g", (long long)k, e);
    }
}

TEST(topk_bad_k_and_dtype) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, SH(3, 4)), *idx = (kn_tensor *)1;
    CHECK(!kn_topk(ctx, x, 5, true, &idx) && !idx && strstr(kn_last_error(), "topk: k = 5"), "k > n: %s", kn_last_error());
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    x = kn_zeros(ctx, KN_F32, 2, SH(3, 4));
    CHECK(!kn_topk(ctx, x, 0, true, NULL), "k = 0");
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    CHECK(!kn_topk(ctx, kn_zeros(ctx, KN_I32, 1, SH(4)), 1, true, NULL) && strstr(kn_last_error(), "float"), "int x");
    kn_ctx_free(ctx);
}

#ifdef KN_CUDA
#define NEED_GPU() do { if (!kn_backend_cuda()) SKIP("no GPU: %s", kn_last_error()); } while (0)
TEST(mul_mat_id_cuda_vs_reference) { NEED_GPU(); backend_vs_ref(kn_backend_cuda(), "cuda", false); }
TEST(mul_mat_id_cuda_bad_id) {
    NEED_GPU();
    kn_test_seed(14);
    mm_case c = {4, 2, 5, 6, 8, 0, KN_F32, KN_I32};
    mm_data d;
    mm_make(&c, &d, -1);
    double *got;
    kn_status st = mm_run(kn_backend_cuda(), &c, &d, true, &got);
    CHECK(st == KN_ERR_INVALID && strstr(kn_last_error(), "mul_mat_id"), "status %d, message '%s'", st, kn_last_error());
    free(got);
    mm_free(&d);
}
TEST(topk_cuda_against_sort) {
    NEED_GPU();
    kn_test_seed(23);
    int64_t ns[] = {1, 8, 60, 129};
    for (int i = 0; i < 4; i++) {
        int64_t n = ns[i], ks[] = {1, 2, n < 8 ? n : 8, n};
        for (int j = 0; j < 4; j++) {
            if (ks[j] > n) continue;
            topk_case(kn_backend_cuda(), 2, 3, n, ks[j], true, false);
            topk_case(kn_backend_cuda(), 1, 5, n, ks[j], false, true);
        }
    }
}
/* vocabulary-long rows (the LLM's sampling candidates): the chunked radix
 * select, one chunk and a partial one, many chunks, heavy ties (3 distinct
 * values: the lower index must win), both orders, strided rows */
TEST(topk_cuda_long_rows) {
    NEED_GPU();
    kn_test_seed(24);
    int64_t ns[] = {1024, 5000, 49189};
    int64_t ks[] = {1, 40, 64, 256};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            topk_case(kn_backend_cuda(), 1, 2, ns[i], ks[j], true, false);
            topk_case(kn_backend_cuda(), 2, 1, ns[i], ks[j], false, false);
            topk_case(kn_backend_cuda(), 1, 3, ns[i], ks[j], true, true);
            topk_case(kn_backend_cuda(), 1, 1, ns[i], ks[j], false, true);
        }
    for (int64_t f = 0; f <= 70; f += 10) {
        topk_masked_case(kn_backend_cuda(), 4100, 64, f, true);
        topk_masked_case(kn_backend_cuda(), 8193, 64, f, false);
    }
}
#else
TEST(moe_ops_cuda) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

KN_TEST_MAIN()
