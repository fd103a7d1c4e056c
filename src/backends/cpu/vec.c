/* vec.c: dispatch of the f32 row kernels (vec.h) and their scalar `_generic`
 * twins, which are plain loops over libm that serve as the readable oracle and
 * as the path for CPUs without AVX2 (and for KN_CPU=scalar).
 *
 * Non-goals: threading (the caller splits rows), strided rows, f64.
 */
#include "backends/cpu/vec.h"   // defines: kn_vec_*, kn_vec_impl
#include "core/cpu.h"           // defines: kn_cpu, KN_ISA_*
#include "core/fp16.h"          // defines: kn_fp32_to_fp16 and friends
#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ============================================================================
 * Scalar generic kernels
 * ========================================================================== */

static void add_generic(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}
static void sub_generic(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i];
}
static void mul_generic(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}
static void div_generic(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i];
}
static void add_scalar_generic(float *y, const float *a, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + s;
}
static void mul_scalar_generic(float *y, const float *a, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * s;
}
static void fma_scalar_generic(float *y, const float *a, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += s * a[i];
}
static void copy_generic(float *y, const float *a, int64_t n) {
    if (y != a && n > 0) memmove(y, a, (size_t)n * sizeof(float));
}

/* gelu (tanh form): 0.5x(1+tanh(u)) == x*sigmoid(2u), which stays accurate for
 * x << 0 where 1+tanh(u) would cancel. u = sqrt(2/pi)*(x + 0.044715x^3). */
static float gelu_tanh1(float x) {
    float u = 0.797884583f * x * (1.0f + 0.044715f * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* Stable sigmoid: e = exp(-|x|) never overflows, so tiny results stay exact-ish. */
static float sigmoid1(float x) {
    float e = expf(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
static float silu1(float x) {
    float e = expf(-fabsf(x));
    return x * (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* d gelu_tanh / dx with s = sigmoid(2u), 2u = 1.5957691 x + 0.0713548 x^3:
 * s + x s (1 - s) (1.5957691 + 0.2140644 x^2), and 1 - s = s e (e = exp(-2u),
 * clamped so s * s * e stays finite when s underflows); |x| > 20 gives 0 or 1. */
static float gelu_tanh_grad1(float x) {
    x = x < -20.0f ? -20.0f : x > 20.0f ? 20.0f : x;     /* the value is 0 / 1 beyond; keeps x^2 finite (NaN passes) */
    float m2u = x * (-1.59576917f - 0.0713548162f * x * x);
    float e = expf(m2u < 80.0f ? m2u : 80.0f), s = 1.0f / (1.0f + e);
    return s + x * (s * s * e) * (1.59576917f + 0.214064449f * x * x);
}

static void unary_generic(kn_vec_unary_op op, float *y, const float *x, int64_t n) {
    int64_t i;
    switch (op) {
    case KN_VU_EXP:       for (i = 0; i < n; i++) y[i] = expf(x[i]); break;
    case KN_VU_TANH:      for (i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
    case KN_VU_SIGMOID:   for (i = 0; i < n; i++) y[i] = sigmoid1(x[i]); break;
    case KN_VU_SILU:      for (i = 0; i < n; i++) y[i] = silu1(x[i]); break;
    case KN_VU_GELU_TANH: for (i = 0; i < n; i++) y[i] = gelu_tanh1(x[i]); break;
    case KN_VU_GELU_TANH_GRAD: for (i = 0; i < n; i++) y[i] = gelu_tanh_grad1(x[i]); break;
    case KN_VU_GELU_ERF:
        for (i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.707106769f));
        break;
    case KN_VU_RELU:      for (i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i]; break;
    case KN_VU_NEG:       for (i = 0; i < n; i++) y[i] = -x[i]; break;
    case KN_VU_SQRT:      for (i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case KN_VU_RSQRT:     for (i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
    case KN_VU_LOG:       for (i = 0; i < n; i++) y[i] = logf(x[i]); break;
    default: break;
    }
}

/* The scalar reductions accumulate in double: simple and more accurate than
 * the SIMD bound (vec.h). */
static float sum_generic(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return (float)s;
}
static float max_generic(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) return x[i];
        if (x[i] > m) m = x[i];
    }
    return m;
}
static float dot_generic(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

static void softmax_generic(float *y, const float *x, int64_t n) {
    float m = max_generic(x, n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) { y[i] = expf(x[i] - m); s += y[i]; }
    float r = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) y[i] *= r;
}
static void softmax_bwd_generic(float *ds, const float *p, const float *dp, const float *dcap, float scale,
                                int64_t n) {
    float d = dot_generic(p, dp, n);
    for (int64_t i = 0; i < n; i++) {
        float t = (dp[i] - d) * p[i];
        if (dcap) t *= dcap[i];
        ds[i] = t * scale;
    }
}
static void log_softmax_generic(float *y, const float *x, int64_t n) {
    float m = max_generic(x, n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += expf(x[i] - m);
    float lse = (float)log(s);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) - lse;
}

static void layer_norm_generic(float *y, const float *x, const float *w, const float *b,
                               float eps, int64_t n, float *mean_out, float *rstd_out) {
    double s = 0, v = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    float mean = n > 0 ? (float)(s / (double)n) : 0.0f;
    for (int64_t i = 0; i < n; i++) { double d = (double)x[i] - mean; v += d * d; }
    float var = n > 0 ? (float)(v / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < n; i++) {
        float t = (x[i] - mean) * rstd;
        if (w) t *= w[i];
        if (b) t += b[i];
        y[i] = t;
    }
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

static void rms_norm_generic(float *y, const float *x, const float *w, float eps, int64_t n,
                             float *rstd_out) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    float ms = n > 0 ? (float)(s / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(ms + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w ? x[i] * rstd * w[i] : x[i] * rstd;
    if (rstd_out) *rstd_out = rstd;
}

static void norm_bwd_generic(float *dx, float *dw, float *db, const float *x, const float *g,
                             const float *w, float eps, bool rms, int64_t n) {
    double s = 0, v = 0, sg = 0, sgx = 0;
    if (!rms) for (int64_t i = 0; i < n; i++) s += x[i];
    float mean = n > 0 && !rms ? (float)(s / (double)n) : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - mean, gw = w ? (double)g[i] * w[i] : g[i];
        v += d * d; sg += gw; sgx += gw * d;
    }
    float rstd = 1.0f / sqrtf((n > 0 ? (float)(v / (double)n) : 0.0f) + eps);
    float m1 = rms || n == 0 ? 0.0f : (float)(sg / (double)n), m2 = n > 0 ? (float)(sgx / (double)n) * rstd : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float xh = (x[i] - mean) * rstd, gw = w ? g[i] * w[i] : g[i];
        dx[i] = rstd * (gw - m1 - xh * m2);
        if (dw) dw[i] += g[i] * xh;
        if (db) db[i] += g[i];
    }
}

static void f32_to_f16_generic(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kn_fp32_to_fp16(x[i]);
}
static void f16_to_f32_generic(float *y, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kn_fp16_to_fp32(x[i]);
}
static void f32_to_bf16_generic(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kn_fp32_to_bf16(x[i]);
}
static void bf16_to_f32_generic(float *y, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kn_bf16_to_fp32(x[i]);
}

static void adam_generic(float *p, float *m, float *v, const float *g, int64_t n, const kn_vec_adam_k *k) {
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i], gi = g[i] + k->l2 * pi;
        float mi = m[i] + (gi - m[i]) * k->b1c;
        float vi = v[i] * k->b2 + (gi * gi) * k->b2c;
        m[i] = mi; v[i] = vi;
        p[i] = pi * k->c0 - (mi / (sqrtf(vi) / k->c2 + k->eps)) * k->c1;
    }
}

const kn_vec_impl kn_vec_impl_generic = {
    add_generic, sub_generic, mul_generic, div_generic,
    add_scalar_generic, mul_scalar_generic, fma_scalar_generic, copy_generic,
    unary_generic, sum_generic, max_generic, dot_generic,
    softmax_generic, log_softmax_generic, layer_norm_generic, rms_norm_generic, norm_bwd_generic, softmax_bwd_generic,
    f32_to_f16_generic, f16_to_f32_generic, f32_to_bf16_generic, bf16_to_f32_generic, adam_generic,
};

/* ============================================================================
 * Dispatch
 * ========================================================================== */

static atomic_int g_force = -1;

void kn_vec_force_isa(int isa) { atomic_store_explicit(&g_force, isa, memory_order_relaxed); }

int kn_vec_isa(void) {
    int hw = (int)kn_cpu()->isa;
    int f = atomic_load_explicit(&g_force, memory_order_relaxed);
    int isa = (f < 0 || f > hw) ? hw : f;
#if defined(KN_NO_X86)
    isa = KN_ISA_SCALAR;
#elif defined(KN_NO_AVX512)
    if (isa > KN_ISA_AVX2) isa = KN_ISA_AVX2;
#endif
    return isa;
}

static const kn_vec_impl *impl(void) {
    switch (kn_vec_isa()) {
#if !defined(KN_NO_X86)
    case KN_ISA_AVX2: return &kn_vec_impl_avx2;
#if !defined(KN_NO_AVX512)
    case KN_ISA_AVX512: return &kn_vec_impl_avx512;
#endif
#endif
    default: return &kn_vec_impl_generic;
    }
}

void kn_vec_add(float *y, const float *a, const float *b, int64_t n) { impl()->add(y, a, b, n); }
void kn_vec_sub(float *y, const float *a, const float *b, int64_t n) { impl()->sub(y, a, b, n); }
void kn_vec_mul(float *y, const float *a, const float *b, int64_t n) { impl()->mul(y, a, b, n); }
void kn_vec_div(float *y, const float *a, const float *b, int64_t n) { impl()->div(y, a, b, n); }
void kn_vec_add_scalar(float *y, const float *a, float s, int64_t n) { impl()->add_scalar(y, a, s, n); }
void kn_vec_mul_scalar(float *y, const float *a, float s, int64_t n) { impl()->mul_scalar(y, a, s, n); }
void kn_vec_fma_scalar(float *y, const float *a, float s, int64_t n) { impl()->fma_scalar(y, a, s, n); }
void kn_vec_copy(float *y, const float *a, int64_t n) { impl()->copy(y, a, n); }
void kn_vec_unary(kn_vec_unary_op op, float *y, const float *x, int64_t n) {
    if ((int)op < 0 || op >= KN_VU_COUNT) return;
    impl()->unary(op, y, x, n);
}
float kn_vec_sum(const float *x, int64_t n) { return impl()->sum(x, n); }
float kn_vec_max(const float *x, int64_t n) { return impl()->max(x, n); }
float kn_vec_dot(const float *a, const float *b, int64_t n) { return impl()->dot(a, b, n); }
void kn_vec_softmax(float *y, const float *x, int64_t n) { impl()->softmax(y, x, n); }
void kn_vec_log_softmax(float *y, const float *x, int64_t n) { impl()->log_softmax(y, x, n); }
void kn_vec_layer_norm(float *y, const float *x, const float *w, const float *b, float eps,
                       int64_t n, float *mean_out, float *rstd_out) {
    impl()->layer_norm(y, x, w, b, eps, n, mean_out, rstd_out);
}
void kn_vec_softmax_bwd(float *ds, const float *p, const float *dp, const float *dcap, float scale, int64_t n) {
    impl()->softmax_bwd(ds, p, dp, dcap, scale, n);
}
void kn_vec_norm_bwd(float *dx, float *dw, float *db, const float *x, const float *g, const float *w,
                     float eps, bool rms, int64_t n) {
    impl()->norm_bwd(dx, dw, db, x, g, w, eps, rms, n);
}
void kn_vec_rms_norm(float *y, const float *x, const float *w, float eps, int64_t n,
                     float *rstd_out) {
    impl()->rms_norm(y, x, w, eps, n, rstd_out);
}
void kn_vec_f32_to_f16(uint16_t *y, const float *x, int64_t n) { impl()->f32_to_f16(y, x, n); }
void kn_vec_f16_to_f32(float *y, const uint16_t *x, int64_t n) { impl()->f16_to_f32(y, x, n); }
void kn_vec_f32_to_bf16(uint16_t *y, const float *x, int64_t n) { impl()->f32_to_bf16(y, x, n); }
void kn_vec_bf16_to_f32(float *y, const uint16_t *x, int64_t n) { impl()->bf16_to_f32(y, x, n); }
void kn_vec_adam(float *p, float *m, float *v, const float *g, int64_t n, const kn_vec_adam_k *k) {
    if (n > 0) impl()->adam(p, m, v, g, n, k);
}
