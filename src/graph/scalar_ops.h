/* scalar_ops.h: the scalar math of every elementwise op, made from the op
 * table (include/kiln_ops.def) and compiled twice: as C for the reference
 * backend (src/backends/ref/ref_elementwise.c) and as CUDA device code for
 * the generic kernels (src/backends/cuda/cuda_ops_elementwise.cu), so the two
 * cannot drift apart. All arithmetic is in double.
 *
 * It defines, for C and CUDA alike:
 *   the vocabulary of the table's expressions (KN_EXP, KN_RINT, KN_SIGMOID, ...);
 *   kn_sop_<ID>(x, p0, p1) / kn_sop_<ID>(a, b): one function per unary / binary op;
 *   kn_scalar_unary(op, x, p0, p1), kn_scalar_binary(op, a, b): dispatch by op
 *   (NaN for an op that is not elementwise).
 * and for C only (tests, and a check that the gradient expressions are valid
 * scalar code as the compiler's generators will render them):
 *   kn_sgrad_<ID>(x, y, g, p0, p1), kn_sgrad_a_<ID> / kn_sgrad_b_<ID>(a, b, y, g);
 *   kn_scalar_grad(op, k, u, v, y, g, p0, p1, &out): operand k's gradient.
 * Non-goals: the fast paths (CPU vector kernels, CUDA float kernels) are
 * written per backend and tested against these functions through the
 * reference backend.
 */
#ifndef KN_SCALAR_OPS_H
#define KN_SCALAR_OPS_H
#include "kiln.h"
#include <math.h>
#include <stdbool.h>

#ifdef __CUDACC__
#define KN_SFN static __device__ __forceinline__
#define KN_NAN __longlong_as_double(0x7ff8000000000000ll)
#else
#define KN_SFN static inline
#define KN_NAN ((double)NAN)
#endif

/* ---- vocabulary: functions (libm names; the same on the host and the device) ---- */
#define KN_FABS(v) fabs(v)
#define KN_EXP(v) exp(v)
#define KN_EXP2(v) exp2(v)
#define KN_LOG(v) log(v)
#define KN_LOG2(v) log2(v)
#define KN_LOG1P(v) log1p(v)
#define KN_EXPM1(v) expm1(v)
#define KN_SQRT(v) sqrt(v)
#define KN_SIN(v) sin(v)
#define KN_COS(v) cos(v)
#define KN_TAN(v) tan(v)
#define KN_ASIN(v) asin(v)
#define KN_ACOS(v) acos(v)
#define KN_ATAN(v) atan(v)
#define KN_SINH(v) sinh(v)
#define KN_COSH(v) cosh(v)
#define KN_TANH(v) tanh(v)
#define KN_ASINH(v) asinh(v)
#define KN_ACOSH(v) acosh(v)
#define KN_ATANH(v) atanh(v)
#define KN_ERF(v) erf(v)
#define KN_FLOOR(v) floor(v)
#define KN_CEIL(v) ceil(v)
#define KN_TRUNC(v) trunc(v)
#define KN_RINT(v) nearbyint(v)        /* half to even (the default rounding mode) */
#define KN_ISNAN(v) isnan(v)
#define KN_POW(u, v) pow(u, v)
#define KN_FMOD(u, v) fmod(u, v)
#define KN_ATAN2(u, v) atan2(u, v)

/* ---- vocabulary: small functions of several ops ---- */
KN_SFN double kn_s_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x == 0 ? 0.0 : x; }   /* NaN stays NaN */
KN_SFN double kn_s_rsqrt(double x) { return 1.0 / sqrt(x); }
KN_SFN double kn_s_reciprocal(double x) { return 1.0 / x; }
KN_SFN double kn_s_square(double x) { return x * x; }
KN_SFN double kn_s_sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }
KN_SFN double kn_s_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }   /* torch's threshold 20 */
#define KN_SIGN(v) kn_s_sign(v)
#define KN_RSQRT(v) kn_s_rsqrt(v)
#define KN_RECIPROCAL(v) kn_s_reciprocal(v)
#define KN_SQUARE(v) kn_s_square(v)
#define KN_SIGMOID(v) kn_s_sigmoid(v)
#define KN_SOFTPLUS(v) kn_s_softplus(v)

/* ---- vocabulary of the gradient expressions (calls only: they are graph ops too) ---- */
#define KN_ADD(u, v) ((u) + (v))
#define KN_SUB(u, v) ((u) - (v))
#define KN_MUL(u, v) ((u) * (v))
#define KN_DIV(u, v) ((u) / (v))
#define KN_NEG(u) (-(u))
#define KN_C(v) ((double)(v))
#define KN_WHERE(c, u, v) ((c) != 0 ? (u) : (v))
#define KN_GT(u, v) ((double)((u) > (v)))
#define KN_GE(u, v) ((double)((u) >= (v)))
#define KN_LT(u, v) ((double)((u) < (v)))
#define KN_LE(u, v) ((double)((u) <= (v)))
#define KN_EQ(u, v) ((double)((u) == (v)))
#define KN_AND(u, v) ((double)((u) != 0 && (v) != 0))
#define KN_MASK(c) (c)
#define KN_ZEROS_LIKE(u) 0.0
#define KN_GELU_TANH_GRAD(v) kn_sop_GELU_TANH_GRAD(v, 0, 0)

/* ---- one forward function per elementwise op ---- */
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad) \
    KN_SFN double kn_sop_##ID(double x, double p0, double p1) { (void)p0; (void)p1; return fwd; }
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b) \
    KN_SFN double kn_sop_##ID(double a, double b) { return fwd; }
#include "kiln_ops.def"

KN_SFN double kn_scalar_unary(int op, double x, double p0, double p1) {
    switch (op) {
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad) case KN_OP_##ID: return kn_sop_##ID(x, p0, p1);
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b)
#include "kiln_ops.def"
    default: return KN_NAN;
    }
}

KN_SFN double kn_scalar_binary(int op, double a, double b) {
    switch (op) {
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad)
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b) case KN_OP_##ID: return kn_sop_##ID(a, b);
#include "kiln_ops.def"
    default: return KN_NAN;
    }
}

/* ---- gradient functions (C only) ---- */
#ifndef __CUDACC__
/* keep a row's gradient functions only when it has gradient expressions */
#define KN__IF_GRAD_E(...) __VA_ARGS__
#define KN__IF_GRAD_H(...) __VA_ARGS__
#define KN__IF_GRAD_Z(...)
#define KN__IF_GRAD_N(...)
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad)                                          \
    KN__IF_GRAD_##GRAD(static inline double kn_sgrad_##ID(double x, double y, double g, double p0, double p1) { \
        (void)x; (void)y; (void)p0; (void)p1; return grad; })
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b)                               \
    KN__IF_GRAD_##GRAD(static inline double kn_sgrad_a_##ID(double a, double b, double y, double g) {       \
        (void)a; (void)b; (void)y; return grad_a; }                                                   \
        static inline double kn_sgrad_b_##ID(double a, double b, double y, double g) {                \
        (void)a; (void)b; (void)y; return grad_b; })
#include "kiln_ops.def"

/* Gradient of operand k (0, or 1 for binary ops) of op: u = x (unary) or a, v = b,
 * y = the output, g = its gradient. False when the op has no gradient expression. */
static inline bool kn_scalar_grad(int op, int k, double u, double v, double y, double g, double p0, double p1,
                                  double *out) {
    (void)v; (void)p0; (void)p1;
    switch (op) {
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad) \
    KN__IF_GRAD_##GRAD(case KN_OP_##ID: if (k != 0) return false; *out = kn_sgrad_##ID(u, y, g, p0, p1); return true;)
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b) \
    KN__IF_GRAD_##GRAD(case KN_OP_##ID: *out = k ? kn_sgrad_b_##ID(u, v, y, g) : kn_sgrad_a_##ID(u, v, y, g); return true;)
#include "kiln_ops.def"
    default: return false;
    }
}
#undef KN__IF_GRAD_E
#undef KN__IF_GRAD_H
#undef KN__IF_GRAD_Z
#undef KN__IF_GRAD_N
#endif /* !__CUDACC__ */

#endif
