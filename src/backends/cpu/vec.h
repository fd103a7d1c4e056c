/* vec.h: f32 row kernels of the fast CPU backend (elementwise, unary math,
 * reductions, softmax, norms, f16/bf16 conversions), SIMD with a scalar twin.
 *
 * Every kernel works on ONE contiguous row of n elements (n = element count,
 * int64_t); the caller splits a tensor into rows and rows across threads
 * (src/backends/cpu/threadpool.h). Outputs come first; y may equal an input
 * (exact aliasing, in place), partial overlap is not allowed. n == 0 is a
 * no-op (reductions return their identity: sum 0, dot 0, max -inf).
 *
 * The SIMD path is picked on every call from kn_cpu()->isa (env KN_CPU caps it)
 * or from kn_vec_force_isa(); AVX2 needs AVX2+FMA+F16C, AVX-512 needs F/BW/VL/DQ.
 * Unaligned pointers are fine.
 *
 * Accuracy (what tests/test_vec.c checks against double-precision loops):
 *   add, sub, mul, div, add_scalar, mul_scalar, copy, neg, relu, sqrt: exactly
 *     IEEE rounded (same bits on every path). fma_scalar: y + s*a, one fused
 *     rounding on SIMD paths, two on the scalar one.
 *   rsqrt = 1/sqrt(x): relative error <= 2e-7.
 *   exp, log, tanh, sigmoid, silu: relative error <= 3e-7 where the result is a
 *     normal float (measured: <= 2.2e-7); subnormal results within 2^-149
 *     (silu: 2^-149*|x|). exp overflows to inf above ~88.72 and is subnormal,
 *     then 0, below -87.3 / -103.97, like expf.
 *   gelu_tanh (x*sigmoid(2u), u = sqrt(2/pi)(x + 0.044715x^3)) and gelu_erf
 *     (0.5x(1 + erf(x/sqrt2)), PyTorch's formula): |err| <= 4e-7*|x|; for
 *     x << 0 the value is tiny and only this absolutely accurate.
 *   sum/dot: float partial sums over blocks of 1024, blocks added in double:
 *     |err| <= 40*2^-24*sum|x_i| (+ final rounding), independent of n.
 *   max: NaN if any element is NaN (like torch.max).
 *   softmax/log_softmax: stable (max subtracted); an all -inf row gives NaN
 *     (like PyTorch); -inf entries give 0 (log: -inf).
 *   conversions: bit-identical to src/core/fp16.h on every path (RNE; f32->f16
 *     NaN becomes sign|0x7e00; f16->f32 keeps the NaN payload and quiet bit;
 *     f32->bf16 NaN keeps sign+top payload with the quiet bit set).
 *   Infinite inputs of silu/gelu follow the formula: +inf -> +inf, -inf -> NaN.
 *
 *   float row[4096]; ...
 *   kn_vec_softmax(row, row, 4096);                 // in place
 *   kn_vec_unary(KN_VU_SILU, y, x, n);
 *   kn_vec_layer_norm(y, x, w, b, 1e-5f, 768, NULL, NULL);
 */
#ifndef KN_BACKENDS_CPU_VEC_H
#define KN_BACKENDS_CPU_VEC_H
#include <stdint.h>
#include <stdbool.h>

/* ---- elementwise -------------------------------------------------------- */
void kn_vec_add(float *y, const float *a, const float *b, int64_t n);   /* y = a + b */
void kn_vec_sub(float *y, const float *a, const float *b, int64_t n);   /* y = a - b */
void kn_vec_mul(float *y, const float *a, const float *b, int64_t n);   /* y = a * b */
void kn_vec_div(float *y, const float *a, const float *b, int64_t n);   /* y = a / b */
void kn_vec_add_scalar(float *y, const float *a, float s, int64_t n);   /* y = a + s */
void kn_vec_mul_scalar(float *y, const float *a, float s, int64_t n);   /* y = a * s */
void kn_vec_fma_scalar(float *y, const float *a, float s, int64_t n);   /* y += s * a */
void kn_vec_copy(float *y, const float *a, int64_t n);

/* ---- unary math --------------------------------------------------------- */
typedef enum {
    KN_VU_EXP, KN_VU_TANH, KN_VU_SIGMOID, KN_VU_SILU, KN_VU_GELU_TANH, KN_VU_GELU_ERF,
    KN_VU_RELU, KN_VU_NEG, KN_VU_SQRT, KN_VU_RSQRT, KN_VU_LOG,
    KN_VU_GELU_TANH_GRAD,     /* d gelu_tanh(x) / dx */
    KN_VU_COUNT
} kn_vec_unary_op;
/* y = op(x); an op outside [0, KN_VU_COUNT) leaves y untouched. */
void kn_vec_unary(kn_vec_unary_op op, float *y, const float *x, int64_t n);

/* ---- reductions --------------------------------------------------------- */
float kn_vec_sum(const float *x, int64_t n);
float kn_vec_max(const float *x, int64_t n);
float kn_vec_dot(const float *a, const float *b, int64_t n);

/* ---- rows ----------------------------------------------------------------- */
void kn_vec_softmax(float *y, const float *x, int64_t n);               /* y may alias x */
void kn_vec_log_softmax(float *y, const float *x, int64_t n);
/* y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased (/n).
 * w, b, mean_out, rstd_out may each be NULL. */
void kn_vec_layer_norm(float *y, const float *x, const float *w, const float *b, float eps,
                       int64_t n, float *mean_out, float *rstd_out);
/* y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); w and rstd_out may be NULL. */
void kn_vec_rms_norm(float *y, const float *x, const float *w, float eps, int64_t n,
                     float *rstd_out);
/* One row of layer/rms norm's gradient (NORM_BWD): with xhat = (x - mean) *
 * rstd recomputed (rms: x * rstd) and gw = g * w (g when w is NULL):
 *   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))     (rms: no mean(gw))
 *   dw[i] += g[i] * xhat[i],  db[i] += g[i]                  (each may be NULL) */
void kn_vec_norm_bwd(float *dx, float *dw, float *db, const float *x, const float *g, const float *w,
                     float eps, bool rms, int64_t n);
/* The softmax gradient of one row: ds = ((dp - d) * p) * scale with d =
   kn_vec_dot(p, dp), or ((dp - d) * p * dcap) * scale where dcap (a softcap's
   derivative) is not NULL; each step rounded in that order (the bits of the
   kn_vec_dot, add_scalar, mul(s) and mul_scalar calls it replaces); ds may
   alias dp. */
void kn_vec_softmax_bwd(float *ds, const float *p, const float *dp, const float *dcap, float scale, int64_t n);

/* ---- conversions (bit-exact with src/core/fp16.h) -------------------------- */
void kn_vec_f32_to_f16(uint16_t *y, const float *x, int64_t n);
void kn_vec_f16_to_f32(float *y, const uint16_t *x, int64_t n);
void kn_vec_f32_to_bf16(uint16_t *y, const float *x, int64_t n);
void kn_vec_bf16_to_f32(float *y, const uint16_t *x, int64_t n);

/* Tests and benches: use this path (KN_ISA_SCALAR/AVX2/AVX512 from core/cpu.h),
 * capped at what the CPU (and KN_CPU) allows; -1 = automatic. Process-wide. */
void kn_vec_force_isa(int isa);
int  kn_vec_isa(void);           /* the path the next call will take */

/* One Adam/AdamW step over n contiguous elements, the operation sequence of
 * the CPU backend's fused update (cpu_elementwise.c; no FMA contraction, so
 * every path gives the same bits):
 *   g' = g + l2 p;  m = m + (g' - m) b1c;  v = v b2 + g'^2 b2c;
 *   p = p c0 - (m / (sqrt(v) / c2 + eps)) c1                                  */
typedef struct { float c0, c1, c2, b1c, b2, b2c, eps, l2; } kn_vec_adam_k;
void kn_vec_adam(float *p, float *m, float *v, const float *g, int64_t n, const kn_vec_adam_k *k);

/* ---- internal: one table per instruction set ------------------------------
 * vec.c holds the scalar `_generic` table and the dispatch; vec_avx2.c and
 * vec_avx512.c each define one table with the same contract. */
typedef struct kn_vec_impl {
    void (*add)(float *, const float *, const float *, int64_t);
    void (*sub)(float *, const float *, const float *, int64_t);
    void (*mul)(float *, const float *, const float *, int64_t);
    void (*div)(float *, const float *, const float *, int64_t);
    void (*add_scalar)(float *, const float *, float, int64_t);
    void (*mul_scalar)(float *, const float *, float, int64_t);
    void (*fma_scalar)(float *, const float *, float, int64_t);
    void (*copy)(float *, const float *, int64_t);
    void (*unary)(kn_vec_unary_op, float *, const float *, int64_t);
    float (*sum)(const float *, int64_t);
    float (*max)(const float *, int64_t);
    float (*dot)(const float *, const float *, int64_t);
    void (*softmax)(float *, const float *, int64_t);
    void (*log_softmax)(float *, const float *, int64_t);
    void (*layer_norm)(float *, const float *, const float *, const float *, float, int64_t,
                       float *, float *);
    void (*rms_norm)(float *, const float *, const float *, float, int64_t, float *);
    void (*norm_bwd)(float *, float *, float *, const float *, const float *, const float *, float, bool,
                     int64_t);
    void (*softmax_bwd)(float *, const float *, const float *, const float *, float, int64_t);
    void (*f32_to_f16)(uint16_t *, const float *, int64_t);
    void (*f16_to_f32)(float *, const uint16_t *, int64_t);
    void (*f32_to_bf16)(uint16_t *, const float *, int64_t);
    void (*bf16_to_f32)(float *, const uint16_t *, int64_t);
    void (*adam)(float *, float *, float *, const float *, int64_t, const kn_vec_adam_k *);
} kn_vec_impl;

extern const kn_vec_impl kn_vec_impl_generic;   /* vec.c        */
extern const kn_vec_impl kn_vec_impl_avx2;      /* vec_avx2.c   */
extern const kn_vec_impl kn_vec_impl_avx512;    /* vec_avx512.c */

/* Block length of the blocked float accumulation used by sum/dot/norms. */
#define KN_VEC_SUM_BLOCK 1024
#endif
