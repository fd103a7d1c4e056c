/* test_vec.c: the f32 row kernels of src/backends/cpu/vec.h on every SIMD path
 * this CPU can run (scalar always, AVX2 and AVX-512 when present), against
 * double-precision loops, with the tolerances stated in vec.h.
 *
 * Every sized test runs n in {0,1,3,7,8,9,15,16,17,31,33,100,1000,4099}, with
 * unaligned pointers, a guard zone after the row (tails must not write past n)
 * and in-place aliasing. Conversions are compared bit for bit with
 * src/core/fp16.h: all 65536 half values, and edge + random f32 bit patterns.
 */
#include "kn_test.h"
#include "backends/cpu/vec.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include <float.h>
#include <stdint.h>
#include <string.h>

static const int64_t SIZES[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 4099};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))
#define GUARD 16
#define SENT (-12345.0f)
static const char *ISA_NAME[] = {"scalar", "avx2", "avx512"};

/* The paths this machine runs: forced one by one, kept when the force took. */
static int g_paths[3], g_npaths = -1;
static int npaths(void) {
    if (g_npaths < 0) {
        g_npaths = 0;
        for (int i = 0; i < 3; i++) {
            kn_vec_force_isa(i);
            if (kn_vec_isa() == i) g_paths[g_npaths++] = i;
        }
        kn_vec_force_isa(-1);
    }
    return g_npaths;
}
#define FOR_PATHS(isa)                                                                \
    for (int pi_ = 0, isa = 0; pi_ < npaths() && (kn_vec_force_isa(isa = g_paths[pi_]), 1); \
         pi_++)

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static int same_bits(float a, float b) { return fbits(a) == fbits(b) || (isnan(a) && isnan(b)); }

/* Buffer of n floats at an odd offset (unaligned), followed by a guard zone. */
static float *fbuf(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n + GUARD + 1));
    for (int64_t i = 0; i < n + GUARD + 1; i++) p[i] = SENT;
    return p + 1;
}
static void ffree(float *p) { free(p - 1); }
static int guard_ok(const float *p, int64_t n) {
    for (int i = 0; i < GUARD; i++) if (fbits(p[n + i]) != fbits(SENT)) return 0;
    return 1;
}

TEST(paths) {
    printf("# paths run:");
    for (int i = 0; i < npaths(); i++) printf(" %s", ISA_NAME[g_paths[i]]);
    printf(" (cpu isa %s)\n", ISA_NAME[kn_cpu()->isa]);
    CHECK(npaths() >= 1 && g_paths[0] == KN_ISA_SCALAR, "scalar path must always run");
#if !defined(KN_NO_X86)
    if (kn_cpu()->isa >= KN_ISA_AVX2) CHECK(npaths() >= 2, "AVX2 cpu but AVX2 path not forced");
#endif
}

/* ============================================================================
 * Elementwise
 * ========================================================================== */

TEST(binary_exact) {
    static const char *nm[] = {"add", "sub", "mul", "div"};
    void (*fn[])(float *, const float *, const float *, int64_t) = {kn_vec_add, kn_vec_sub, kn_vec_mul, kn_vec_div};
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) for (int op = 0; op < 4; op++) {
        int64_t n = SIZES[s];
        float *a = fbuf(n), *b = fbuf(n), *y = fbuf(n), *a2 = fbuf(n), *b2 = fbuf(n);
        kn_test_seed(7 + (unsigned)n);
        kn_test_fill_f32(a, n, -100, 100);
        for (int64_t i = 0; i < n; i++) b[i] = (float)kn_test_uniform(0.5, 2.0) * (i & 1 ? -1.f : 1.f);
        memcpy(a2, a, sizeof(float) * (size_t)n); memcpy(b2, b, sizeof(float) * (size_t)n);
        fn[op](y, a, b, n);
        int bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            double r = op == 0 ? (double)a[i] + b[i] : op == 1 ? (double)a[i] - b[i]
                     : op == 2 ? (double)a[i] * b[i] : (double)a[i] / b[i];
            if (!same_bits(y[i], (float)r)) bad = (int)i;
        }
        CHECK(bad < 0, "%s %s n=%lld: element %d not correctly rounded", ISA_NAME[isa], nm[op], (long long)n, bad);
        CHECK(guard_ok(y, n), "%s %s n=%lld wrote past the row", ISA_NAME[isa], nm[op], (long long)n);
        /* in place, into either operand */
        fn[op](a2, a2, b, n);
        fn[op](b2, a, b2, n);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= same_bits(a2[i], y[i]) && same_bits(b2[i], y[i]);
        CHECK(ok, "%s %s n=%lld in-place result differs", ISA_NAME[isa], nm[op], (long long)n);
        ffree(a); ffree(b); ffree(y); ffree(a2); ffree(b2);
    }
    kn_vec_force_isa(-1);
}

/* The Adam step: every path gives the bits of the scalar sequence written
 * out here (vec.h: no FMA contraction), over the sizes' tails; nothing past
 * the row is written. */
TEST(adam_step_same_bits) {
    kn_vec_adam_k k = {0.999f, 1.25e-3f, 0.0316f, 0.1f, 0.999f, 1e-3f, 1e-8f, 0.01f};
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *p = fbuf(n), *m = fbuf(n), *v = fbuf(n), *g = fbuf(n);
        kn_test_seed(31 + (unsigned)n);
        kn_test_fill_f32(p, n, -2, 2);
        kn_test_fill_f32(m, n, -0.1, 0.1);
        kn_test_fill_f32(g, n, -1, 1);
        for (int64_t i = 0; i < n; i++) v[i] = (float)kn_test_uniform(0, 0.01);
        float *pe = malloc(sizeof(float) * (size_t)(n + 1)), *me = malloc(sizeof(float) * (size_t)(n + 1)),
              *ve = malloc(sizeof(float) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) {
            volatile float pi = p[i], gi = g[i] + k.l2 * pi;    /* volatile: one rounding per operation */
            volatile float mi = m[i] + (gi - m[i]) * k.b1c;
            volatile float t1 = v[i] * k.b2, t2 = (gi * gi) * k.b2c, vi = t1 + t2;
            volatile float den = sqrtf(vi) / k.c2 + k.eps, q = mi / den, a = pi * k.c0, b = q * k.c1;
            pe[i] = a - b; me[i] = mi; ve[i] = vi;
        }
        kn_vec_adam(p, m, v, g, n, &k);
        int bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (!same_bits(p[i], pe[i]) || !same_bits(m[i], me[i]) || !same_bits(v[i], ve[i])) bad = (int)i;
        CHECK(bad < 0, "%s adam n=%lld: element %d differs from the scalar sequence", ISA_NAME[isa], (long long)n, bad);
        CHECK(guard_ok(p, n) && guard_ok(m, n) && guard_ok(v, n), "%s adam n=%lld wrote past the row", ISA_NAME[isa], (long long)n);
        ffree(p); ffree(m); ffree(v); ffree(g); free(pe); free(me); free(ve);
    }
    kn_vec_force_isa(-1);
}

TEST(scalar_ops_copy) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *a = fbuf(n), *y = fbuf(n), *z = fbuf(n), *y0 = fbuf(n);
        kn_test_seed(11 + (unsigned)n);
        kn_test_fill_f32(a, n, -10, 10);
        kn_test_fill_f32(y0, n, -10, 10);
        const float sc = -1.37f;
        kn_vec_add_scalar(y, a, sc, n);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= same_bits(y[i], (float)((double)a[i] + sc));
        CHECK(ok && guard_ok(y, n), "%s add_scalar n=%lld", ISA_NAME[isa], (long long)n);
        kn_vec_mul_scalar(y, a, sc, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= same_bits(y[i], (float)((double)a[i] * sc));
        CHECK(ok && guard_ok(y, n), "%s mul_scalar n=%lld", ISA_NAME[isa], (long long)n);
        /* fma_scalar: y += s*a, within one rounding of each of the two steps */
        memcpy(z, y0, sizeof(float) * (size_t)n);
        kn_vec_fma_scalar(z, a, sc, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) {
            double r = (double)y0[i] + (double)sc * a[i];
            double tol = 0x1p-24 * (fabs(y0[i]) + fabs((double)sc * a[i])) * 2;
            ok &= fabs(z[i] - r) <= tol;
        }
        CHECK(ok && guard_ok(z, n), "%s fma_scalar n=%lld", ISA_NAME[isa], (long long)n);
        /* in place */
        memcpy(z, a, sizeof(float) * (size_t)n);
        kn_vec_mul_scalar(z, z, sc, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= same_bits(z[i], y[i]);
        CHECK(ok, "%s mul_scalar in place n=%lld", ISA_NAME[isa], (long long)n);
        /* copy, and copy onto itself */
        kn_vec_copy(y, a, n);
        CHECK(!memcmp(y, a, sizeof(float) * (size_t)n) && guard_ok(y, n), "%s copy n=%lld", ISA_NAME[isa], (long long)n);
        kn_vec_copy(y, y, n);
        CHECK(!memcmp(y, a, sizeof(float) * (size_t)n), "%s copy in place n=%lld", ISA_NAME[isa], (long long)n);
        ffree(a); ffree(y); ffree(z); ffree(y0);
    }
    kn_vec_force_isa(-1);
}

/* ============================================================================
 * Unary
 * ========================================================================== */

static const char *UNAME[KN_VU_COUNT] = {"exp", "tanh", "sigmoid", "silu", "gelu_tanh", "gelu_erf",
                                        "relu", "neg", "sqrt", "rsqrt", "log", "gelu_tanh_grad"};

static double ref_unary(int op, double x) {
    switch (op) {
    case KN_VU_EXP: return exp(x);
    case KN_VU_TANH: return tanh(x);
    case KN_VU_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case KN_VU_SILU: return x / (1.0 + exp(-x));
    case KN_VU_GELU_TANH: {
        double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        return x / (1.0 + exp(-2.0 * u));
    }
    case KN_VU_GELU_ERF: return 0.5 * x * erfc(-x / sqrt(2.0));
    case KN_VU_RELU: return x < 0 ? 0.0 : x;
    case KN_VU_NEG: return -x;
    case KN_VU_SQRT: return sqrt(x);
    case KN_VU_RSQRT: return 1.0 / sqrt(x);
    case KN_VU_LOG: return log(x);
    case KN_VU_GELU_TANH_GRAD: {       /* the tanh form of d gelu_tanh / dx */
        double t = tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * x * x);
    }
    }
    return NAN;
}

/* Error of y against ref in units of the op's tolerance (<= 1 passes).
 * exact ops: 0 or inf. relative ops: |y-r| / (3e-7*|r|), results below FLT_MIN
 * may be off by one subnormal step (2^-149). gelu: absolute, 4e-7 per unit |x|. */
static double err_units(int op, double x, float y, double r) {
    if (isnan(r) || isnan(y)) return isnan(r) && isnan(y) ? 0 : INFINITY;
    if (isinf((float)r) || isinf(y)) return y == (float)r ? 0 : INFINITY;   /* overflow to inf */
    double d = fabs((double)y - r);
    if (d == 0) return 0;
    switch (op) {
    case KN_VU_RELU: case KN_VU_NEG: case KN_VU_SQRT:
        return same_bits(y, (float)r) ? 0 : INFINITY;
    case KN_VU_RSQRT: return d / (2e-7 * fabs(r));
    case KN_VU_GELU_TANH: case KN_VU_GELU_ERF: {
        double t = 4e-7 * fabs(x);
        return d <= 0x1p-149 ? 0 : d / t;
    }
    case KN_VU_GELU_TANH_GRAD:   /* absolute: values in [-0.17, 1.13]; float rounding of s, e, x^2 */
        return d / (1e-6 * (1 + fabs(x)));
    case KN_VU_SILU:   /* x < -87.3: x * (subnormal sigmoid), whose step 2^-149 scales by |x| */
        if (fabs(r) < FLT_MIN * fmax(1, fabs(x))) return d <= 0x1p-149 * fmax(1, fabs(x)) ? 0 : INFINITY;
        return d / (3e-7 * fabs(r));
    default:
        if (fabs(r) < FLT_MIN) return d <= 0x1p-149 ? 0 : INFINITY;
        return d / (3e-7 * fabs(r));
    }
}

/* Op-specific random inputs: wide ranges plus the interesting middle. */
static float gen_input(int op, int64_t i) {
    double u = kn_test_uniform(0, 1);
    switch (op) {
    /* blocks of 64 alternate between wide ranges and ranges inside |x| <= 87, so
     * SIMD paths with a separate fast path for moderate |x| run both */
    case KN_VU_EXP:
        return (float)((i >> 6) & 1 ? kn_test_uniform(-110, 92) : i & 1 ? kn_test_uniform(-87, 87) : kn_test_uniform(-3, 3));
    case KN_VU_TANH: return (float)(i & 1 ? kn_test_uniform(-12, 12) : kn_test_uniform(-1.3, 1.3) * pow(10, -4 * u));
    case KN_VU_SIGMOID: case KN_VU_SILU:
        return (float)((i >> 6) & 1 ? kn_test_uniform(-120, 120) : i & 1 ? kn_test_uniform(-87, 87) : kn_test_uniform(-10, 10));
    case KN_VU_GELU_TANH: case KN_VU_GELU_ERF: case KN_VU_GELU_TANH_GRAD:
        return (float)(i & 1 ? kn_test_uniform(-15, 15) : kn_test_uniform(-4, 4));
    case KN_VU_SQRT: case KN_VU_RSQRT: case KN_VU_LOG:
        if (i % 3 == 0) return (float)kn_test_uniform(0.6, 1.6);
        return (float)(ldexp(1.0 + u, (int)kn_test_uniform(-149, 127)));
    default: return (float)kn_test_uniform(-50, 50);
    }
}

TEST(unary_accuracy) {
    const int64_t N = 1 << 16;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    FOR_PATHS(isa) {
        printf("# %-6s max error / tolerance:", ISA_NAME[isa]);
        for (int op = 0; op < KN_VU_COUNT; op++) {
            kn_test_seed(100 + (unsigned)op);
            for (int64_t i = 0; i < N; i++) x[i] = gen_input(op, i);
            kn_vec_unary((kn_vec_unary_op)op, y, x, N);
            double worst = 0; int64_t wi = 0;
            for (int64_t i = 0; i < N; i++) {
                double e = err_units(op, x[i], y[i], ref_unary(op, x[i]));
                if (!(e <= worst)) { worst = e; wi = i; }
            }
            printf(" %s %.2f", UNAME[op], worst);
            CHECK(worst <= 1.0, "%s %s: x=%.9g y=%.9g ref=%.9g (%.2f x tolerance)", ISA_NAME[isa], UNAME[op],
                  x[wi], y[wi], ref_unary(op, x[wi]), worst);
        }
        printf("\n");
    }
    kn_vec_force_isa(-1);
    free(x); free(y);
}

TEST(unary_special_values) {
    const float inf = INFINITY, nan = NAN, dmin = 0x1p-149f;
    const float xs[] = {0.0f, -0.0f, inf, -inf, nan, 88.72f, 88.73f, 89.0f, -87.3f, -87.34f, -100.0f,
                        -103.9f, -104.0f, -200.0f, 1.0f, -1.0f, 9.0f, -9.5f, 1e-30f, -1e-30f, 3.9f, 4.5f,
                        dmin, 1e-40f, FLT_MIN, FLT_MAX, -FLT_MAX, 0.5f, 1.0f - 0x1p-24f, 1.0f + 0x1p-23f};
    const int nx = (int)(sizeof xs / sizeof xs[0]);
    float y[64];
    FOR_PATHS(isa) for (int op = 0; op < KN_VU_COUNT; op++) {
        /* silu/gelu of -inf are NaN by the formula (vec.h); skip infinities there */
        int skip_inf = op == KN_VU_SILU || op == KN_VU_GELU_TANH || op == KN_VU_GELU_ERF || op == KN_VU_GELU_TANH_GRAD;
        /* run twice: from offset 0 and offset 3 so specials land in vector bodies and tails */
        for (int off = 0; off < 2; off++) {
            float in[64];
            int m = 0;
            if (off) { in[m++] = 0.25f; in[m++] = 0.5f; in[m++] = 0.75f; }
            for (int i = 0; i < nx; i++) in[m++] = xs[i];
            kn_vec_unary((kn_vec_unary_op)op, y, in, m);
            for (int i = 0; i < m; i++) {
                if (skip_inf && isinf(in[i])) continue;
                double r = ref_unary(op, in[i]);
                double e = err_units(op, in[i], y[i], r);
                CHECK(e <= 1.0, "%s %s(%.9g) = %.9g, want %.9g", ISA_NAME[isa], UNAME[op], in[i], y[i], r);
            }
        }
    }
    /* a few exact expectations the error model above could hide */
    FOR_PATHS(isa) {
        float in[4] = {-inf, inf, -0.0f, nan}, out[4];
        kn_vec_unary(KN_VU_EXP, out, in, 4);
        CHECK(out[0] == 0 && out[1] == inf && out[2] == 1.0f && isnan(out[3]), "%s exp specials", ISA_NAME[isa]);
        kn_vec_unary(KN_VU_TANH, out, in, 4);
        CHECK(out[0] == -1 && out[1] == 1 && out[2] == 0 && signbit(out[2]) && isnan(out[3]), "%s tanh specials", ISA_NAME[isa]);
        kn_vec_unary(KN_VU_SIGMOID, out, in, 4);
        CHECK(out[0] == 0 && out[1] == 1 && out[2] == 0.5f && isnan(out[3]), "%s sigmoid specials", ISA_NAME[isa]);
        float lin[4] = {0.0f, -1.0f, inf, 1.0f};
        kn_vec_unary(KN_VU_LOG, out, lin, 4);
        CHECK(out[0] == -inf && isnan(out[1]) && out[2] == inf && out[3] == 0, "%s log specials", ISA_NAME[isa]);
        kn_vec_unary(KN_VU_RELU, out, in, 4);
        CHECK(out[0] == 0 && out[1] == inf && isnan(out[3]), "%s relu specials (NaN stays NaN)", ISA_NAME[isa]);
    }
    kn_vec_force_isa(-1);
}

TEST(unary_sizes_tails_inplace) {
    FOR_PATHS(isa) for (int op = 0; op < KN_VU_COUNT; op++) for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *x = fbuf(n), *y = fbuf(n), *z = fbuf(n);
        kn_test_seed(300 + (unsigned)(op * 100 + s));
        for (int64_t i = 0; i < n; i++) x[i] = gen_input(op, i);
        kn_vec_unary((kn_vec_unary_op)op, y, x, n);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = err_units(op, x[i], y[i], ref_unary(op, x[i]));
            if (!(e <= worst)) worst = e;
        }
        CHECK(worst <= 1.0, "%s %s n=%lld: %.2f x tolerance", ISA_NAME[isa], UNAME[op], (long long)n, worst);
        CHECK(guard_ok(y, n), "%s %s n=%lld wrote past the row", ISA_NAME[isa], UNAME[op], (long long)n);
        memcpy(z, x, sizeof(float) * (size_t)n);
        kn_vec_unary((kn_vec_unary_op)op, z, z, n);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "%s %s n=%lld in place differs", ISA_NAME[isa], UNAME[op], (long long)n);
        ffree(x); ffree(y); ffree(z);
    }
    /* an invalid op leaves y alone */
    float a[3] = {1, 2, 3}, b[3] = {7, 7, 7};
    kn_vec_unary(KN_VU_COUNT, b, a, 3);
    CHECK(b[0] == 7 && b[2] == 7, "invalid op wrote y");
    kn_vec_force_isa(-1);
}

/* ============================================================================
 * Reductions
 * ========================================================================== */

#define SUM_TOL(abs_sum, ref) (40 * 0x1p-24 * (abs_sum) + 0x1p-24 * fabs(ref))

TEST(sum_dot_max) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *a = fbuf(n), *b = fbuf(n);
        kn_test_seed(500 + (unsigned)n);
        kn_test_fill_f32(a, n, -3, 5);
        kn_test_fill_f32(b, n, -2, 2);
        double rs = 0, ra = 0, rd = 0, rda = 0, rm = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            rs += a[i]; ra += fabs(a[i]);
            rd += (double)a[i] * b[i]; rda += fabs((double)a[i] * b[i]);
            if (a[i] > rm) rm = a[i];
        }
        float fs = kn_vec_sum(a, n), fd = kn_vec_dot(a, b, n), fm = kn_vec_max(a, n);
        CHECK(fabs(fs - rs) <= SUM_TOL(ra, rs), "%s sum n=%lld: %.9g vs %.9g", ISA_NAME[isa], (long long)n, fs, rs);
        CHECK(fabs(fd - rd) <= SUM_TOL(rda, rd), "%s dot n=%lld: %.9g vs %.9g", ISA_NAME[isa], (long long)n, fd, rd);
        CHECK((double)fm == rm, "%s max n=%lld: %.9g vs %.9g", ISA_NAME[isa], (long long)n, fm, rm);
        /* NaN anywhere (first, middle, last = tail) makes max NaN */
        for (int64_t k = 0; k < n; k += (n > 3 ? n / 3 : 1)) {
            float keep = a[k]; a[k] = NAN;
            CHECK(isnan(kn_vec_max(a, n)), "%s max n=%lld ignores NaN at %lld", ISA_NAME[isa], (long long)n, (long long)k);
            a[k] = keep;
        }
        if (n > 0) {
            float keep = a[n - 1]; a[n - 1] = NAN;
            CHECK(isnan(kn_vec_max(a, n)), "%s max n=%lld ignores NaN in the last element", ISA_NAME[isa], (long long)n);
            a[n - 1] = keep;
        }
        ffree(a); ffree(b);
    }
    FOR_PATHS(isa) {
        CHECK(kn_vec_sum(NULL, 0) == 0 && kn_vec_dot(NULL, NULL, 0) == 0 && kn_vec_max(NULL, 0) == -INFINITY,
              "%s empty reductions", ISA_NAME[isa]);
        float ninf[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        CHECK(kn_vec_max(ninf, 5) == -INFINITY, "%s max of -inf row", ISA_NAME[isa]);
    }
    kn_vec_force_isa(-1);
}

/* A long sum where one float accumulator would drift: 2^21 copies of 0.1f. */
TEST(sum_long_accuracy) {
    const int64_t n = 1 << 21;
    float *x = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) x[i] = 0.1f;
    double ref = (double)n * 0.1f;
    /* a plain float loop, to show the test can tell */
    float naive = 0;
    for (int64_t i = 0; i < n; i++) naive += x[i];
    CHECK(fabs(naive - ref) > SUM_TOL(ref, ref), "naive float sum unexpectedly accurate: test would not catch drift");
    FOR_PATHS(isa) {
        float s = kn_vec_sum(x, n), d = kn_vec_dot(x, x, n);
        double rd = (double)n * 0.1f * 0.1f;
        printf("# %s sum rel err %.3g, dot rel err %.3g\n", ISA_NAME[isa], fabs(s - ref) / ref, fabs(d - rd) / rd);
        CHECK(fabs(s - ref) <= SUM_TOL(ref, ref), "%s sum %.9g vs %.9g", ISA_NAME[isa], s, ref);
        CHECK(fabs(d - rd) <= SUM_TOL(rd, rd), "%s dot %.9g vs %.9g", ISA_NAME[isa], d, rd);
    }
    kn_vec_force_isa(-1);
    free(x);
}

/* ============================================================================
 * Softmax, log softmax
 * ========================================================================== */

static void ref_softmax(double *r, double *lr, const float *x, int64_t n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++) if (x[i] > m) m = x[i];
    for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - m);
    for (int64_t i = 0; i < n; i++) { r[i] = exp((double)x[i] - m) / s; lr[i] = ((double)x[i] - m) - log(s); }
}

TEST(softmax_rows) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *x = fbuf(n), *y = fbuf(n), *z = fbuf(n);
        double *r = malloc(sizeof(double) * (size_t)(n + 1)), *lr = malloc(sizeof(double) * (size_t)(n + 1));
        kn_test_seed(700 + (unsigned)n);
        kn_test_fill_f32(x, n, -30, 20);
        ref_softmax(r, lr, x, n);
        kn_vec_softmax(y, x, n);
        int ok = 1; int64_t bad = -1;
        for (int64_t i = 0; i < n; i++)
            if (!(fabs(y[i] - r[i]) <= (6e-7 + 0x1p-24 * fabs(lr[i])) * r[i] + 1e-38)) { ok = 0; bad = i; }
        CHECK(ok, "%s softmax n=%lld: y[%lld]=%.9g ref %.9g", ISA_NAME[isa], (long long)n, (long long)bad,
              bad >= 0 ? y[bad] : 0, bad >= 0 ? r[bad] : 0);
        CHECK(guard_ok(y, n), "%s softmax n=%lld wrote past the row", ISA_NAME[isa], (long long)n);
        memcpy(z, x, sizeof(float) * (size_t)n);
        kn_vec_softmax(z, z, n);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "%s softmax in place n=%lld", ISA_NAME[isa], (long long)n);

        kn_vec_log_softmax(y, x, n);
        ok = 1; bad = -1;
        for (int64_t i = 0; i < n; i++)
            if (!(fabs(y[i] - lr[i]) <= 3e-7 * (fabs(lr[i]) + 1))) { ok = 0; bad = i; }
        CHECK(ok, "%s log_softmax n=%lld: y[%lld]=%.9g ref %.9g", ISA_NAME[isa], (long long)n, (long long)bad,
              bad >= 0 ? y[bad] : 0, bad >= 0 ? lr[bad] : 0);
        CHECK(guard_ok(y, n), "%s log_softmax n=%lld wrote past the row", ISA_NAME[isa], (long long)n);
        memcpy(z, x, sizeof(float) * (size_t)n);
        kn_vec_log_softmax(z, z, n);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "%s log_softmax in place n=%lld", ISA_NAME[isa], (long long)n);
        ffree(x); ffree(y); ffree(z); free(r); free(lr);
    }
    kn_vec_force_isa(-1);
}

TEST(softmax_special_rows) {
    const int64_t ns[] = {1, 5, 17, 100};
    FOR_PATHS(isa) for (int k = 0; k < 4; k++) {
        int64_t n = ns[k];
        float x[100], y[100];
        /* one finite value among -inf (at the end: lands in the tail) */
        for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
        x[n - 1] = 3.5f;
        kn_vec_softmax(y, x, n);
        int ok = y[n - 1] == 1.0f;
        for (int64_t i = 0; i < n - 1; i++) ok &= y[i] == 0.0f;
        CHECK(ok, "%s softmax of -inf row with one finite value n=%lld", ISA_NAME[isa], (long long)n);
        kn_vec_log_softmax(y, x, n);
        ok = y[n - 1] == 0.0f;
        for (int64_t i = 0; i < n - 1; i++) ok &= y[i] == -INFINITY;
        CHECK(ok, "%s log_softmax of -inf row with one finite value n=%lld", ISA_NAME[isa], (long long)n);
        /* all -inf: NaN everywhere, like PyTorch */
        x[n - 1] = -INFINITY;
        kn_vec_softmax(y, x, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= isnan(y[i]);
        CHECK(ok, "%s softmax of all -inf row must be NaN n=%lld", ISA_NAME[isa], (long long)n);
        kn_vec_log_softmax(y, x, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= isnan(y[i]);
        CHECK(ok, "%s log_softmax of all -inf row must be NaN n=%lld", ISA_NAME[isa], (long long)n);
        /* a NaN poisons the row */
        for (int64_t i = 0; i < n; i++) x[i] = (float)i;
        x[n / 2] = NAN;
        kn_vec_softmax(y, x, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= isnan(y[i]);
        CHECK(ok, "%s softmax with a NaN must be NaN n=%lld", ISA_NAME[isa], (long long)n);
        /* huge values: stable */
        for (int64_t i = 0; i < n; i++) x[i] = 1e30f;
        kn_vec_softmax(y, x, n);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= fabs(y[i] - 1.0 / (double)n) <= 1e-6 / (double)n;
        CHECK(ok, "%s softmax of equal huge values n=%lld", ISA_NAME[isa], (long long)n);
    }
    kn_vec_force_isa(-1);
}

/* ============================================================================
 * Norms
 * ========================================================================== */

/* one row of NORM_BWD on every path against a double reference: dx written,
 * dw/db accumulated onto what they held, with and without weight, rms too */
TEST(norm_bwd_rows) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) for (int v = 0; v < 4; v++) {
        int64_t n = SIZES[s];
        const float eps = 1e-5f;
        const bool rms = v & 2;
        float *x = fbuf(n), *g = fbuf(n), *w = fbuf(n), *dx = fbuf(n), *dw = fbuf(n), *db = fbuf(n);
        kn_test_seed(1900 + (unsigned)n);
        kn_test_fill_f32(x, n, -3, 5);
        kn_test_fill_f32(g, n, -1, 1);
        kn_test_fill_f32(w, n, 0.5, 1.5);
        for (int64_t i = 0; i < n; i++) { dw[i] = 0.25f; db[i] = -0.5f; }
        const float *wp = (v & 1) ? w : NULL;
        double m = 0, var = 0, s1 = 0, s2 = 0;
        if (!rms) for (int64_t i = 0; i < n; i++) m += x[i];
        m = n && !rms ? m / n : 0;
        for (int64_t i = 0; i < n; i++) var += ((double)x[i] - m) * ((double)x[i] - m);
        double rstd = 1.0 / sqrt((n ? var / n : 0) + eps);
        for (int64_t i = 0; i < n; i++) {
            double gw = (double)g[i] * (wp ? wp[i] : 1), xh = ((double)x[i] - m) * rstd;
            s1 += gw; s2 += gw * xh;
        }
        s1 = rms || !n ? 0 : s1 / n; s2 = n ? s2 / n : 0;
        kn_vec_norm_bwd(dx, dw, rms ? NULL : db, x, g, wp, eps, rms, n);
        int ok = 1, okw = 1;
        for (int64_t i = 0; i < n; i++) {
            double gw = (double)g[i] * (wp ? wp[i] : 1), xh = ((double)x[i] - m) * rstd;
            double r = rstd * (gw - s1 - xh * s2), rw = 0.25 + g[i] * xh, rb = -0.5 + g[i];
            ok &= fabs(dx[i] - r) <= 2e-5 * (1 + fabs(r));
            okw &= fabs(dw[i] - rw) <= 1e-5 * (1 + fabs(rw)) && (rms ? db[i] == -0.5f : fabs(db[i] - rb) <= 1e-6 * (1 + fabs(rb)));
        }
        CHECK(ok && guard_ok(dx, n), "%s norm_bwd dx n=%lld w=%d rms=%d", ISA_NAME[isa], (long long)n, !!wp, rms);
        CHECK(okw && guard_ok(dw, n) && guard_ok(db, n), "%s norm_bwd dw/db n=%lld w=%d rms=%d", ISA_NAME[isa],
              (long long)n, !!wp, rms);
        ffree(x); ffree(g); ffree(w); ffree(dx); ffree(dw); ffree(db);
    }
    kn_vec_force_isa(-1);
}

/* one row of the softmax gradient on every path, without and with a
 * softcap's derivative: against a double reference, bit-equal to the calls
 * it replaces (dot, add_scalar, mul, [mul,] mul_scalar), in place (ds
 * aliasing dp) too, nothing written past the row */
TEST(softmax_bwd_rows) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) for (int capped = 0; capped < 2; capped++) {
        int64_t n = SIZES[s];
        const float scale = 0.3f;
        float *p = fbuf(n), *dp = fbuf(n), *dc = fbuf(n), *ds = fbuf(n), *old = fbuf(n), *in = fbuf(n);
        kn_test_seed(2100 + (unsigned)n);
        kn_test_fill_f32(p, n, 0, 1);
        kn_test_fill_f32(dp, n, -2, 2);
        kn_test_fill_f32(dc, n, 0, 1);
        const float *dcap = capped ? dc : NULL;
        double d = 0;
        for (int64_t i = 0; i < n; i++) d += (double)p[i] * dp[i];
        kn_vec_softmax_bwd(ds, p, dp, dcap, scale, n);
        float di = kn_vec_dot(p, dp, n);
        kn_vec_add_scalar(old, dp, -di, n);
        kn_vec_mul(old, old, p, n);
        if (dcap) kn_vec_mul(old, old, dcap, n);
        kn_vec_mul_scalar(old, old, scale, n);
        for (int64_t i = 0; i < n; i++) in[i] = dp[i];
        kn_vec_softmax_bwd(in, p, in, dcap, scale, n);
        int ok = 1, same = 1;
        for (int64_t i = 0; i < n; i++) {
            double r = scale * (double)p[i] * ((double)dp[i] - d) * (dcap ? dcap[i] : 1);
            ok &= fabs(ds[i] - r) <= 1e-5 * (1 + fabs(d));
            same &= memcmp(&ds[i], &old[i], sizeof(float)) == 0 && memcmp(&in[i], &old[i], sizeof(float)) == 0;
        }
        CHECK(ok && guard_ok(ds, n) && guard_ok(in, n), "%s softmax_bwd n=%lld cap=%d", ISA_NAME[isa], (long long)n, capped);
        CHECK(same, "%s softmax_bwd n=%lld cap=%d: not the bits of the separate calls", ISA_NAME[isa], (long long)n, capped);
        ffree(p); ffree(dp); ffree(dc); ffree(ds); ffree(old); ffree(in);
    }
    kn_vec_force_isa(-1);
}

TEST(layer_norm_rms_norm) {
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) for (int v = 0; v < 4; v++) {
        int64_t n = SIZES[s];
        const float eps = 1e-5f;
        float *x = fbuf(n), *w = fbuf(n), *b = fbuf(n), *y = fbuf(n), *z = fbuf(n);
        kn_test_seed(900 + (unsigned)n);
        kn_test_fill_f32(x, n, -3, 5);
        kn_test_fill_f32(w, n, 0.5, 1.5);
        kn_test_fill_f32(b, n, -1, 1);
        const float *wp = (v & 1) ? w : NULL, *bp = (v & 2) ? b : NULL;
        double m = 0, var = 0, ms = 0;
        for (int64_t i = 0; i < n; i++) { m += x[i]; ms += (double)x[i] * x[i]; }
        m = n ? m / n : 0; ms = n ? ms / n : 0;
        for (int64_t i = 0; i < n; i++) var += ((double)x[i] - m) * ((double)x[i] - m);
        var = n ? var / n : 0;
        double rstd = 1.0 / sqrt(var + eps), rr = 1.0 / sqrt(ms + eps);
        float mo = -1, ro = -1;
        kn_vec_layer_norm(y, x, wp, bp, eps, n, &mo, &ro);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) {
            double r = ((double)x[i] - m) * rstd * (wp ? wp[i] : 1) + (bp ? bp[i] : 0);
            ok &= fabs(y[i] - r) <= 2e-6 * (1 + fabs(r));
        }
        CHECK(ok && guard_ok(y, n), "%s layer_norm n=%lld w=%d b=%d", ISA_NAME[isa], (long long)n, !!wp, !!bp);
        CHECK(fabs(mo - m) <= 1e-6 * (1 + fabs(m)) && fabs(ro - rstd) <= 1e-6 * rstd,
              "%s layer_norm n=%lld mean %.9g (%.9g) rstd %.9g (%.9g)", ISA_NAME[isa], (long long)n, mo, m, ro, rstd);
        memcpy(z, x, sizeof(float) * (size_t)n);
        kn_vec_layer_norm(z, z, wp, bp, eps, n, NULL, NULL);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "%s layer_norm in place n=%lld", ISA_NAME[isa], (long long)n);

        kn_vec_rms_norm(y, x, wp, eps, n, &ro);
        ok = 1;
        for (int64_t i = 0; i < n; i++) {
            double r = (double)x[i] * rr * (wp ? wp[i] : 1);
            ok &= fabs(y[i] - r) <= 1e-6 * (1 + fabs(r));
        }
        CHECK(ok && guard_ok(y, n), "%s rms_norm n=%lld w=%d", ISA_NAME[isa], (long long)n, !!wp);
        CHECK(fabs(ro - rr) <= 1e-6 * rr, "%s rms_norm rstd %.9g vs %.9g", ISA_NAME[isa], ro, rr);
        memcpy(z, x, sizeof(float) * (size_t)n);
        kn_vec_rms_norm(z, z, wp, eps, n, NULL);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "%s rms_norm in place n=%lld", ISA_NAME[isa], (long long)n);
        ffree(x); ffree(w); ffree(b); ffree(y); ffree(z);
    }
    /* constant row: variance 0, output is exactly b; large offset keeps precision */
    FOR_PATHS(isa) {
        float x[37], b[37], y[37], mo, ro;
        for (int i = 0; i < 37; i++) { x[i] = 3.0f; b[i] = (float)i * 0.25f; }
        kn_vec_layer_norm(y, x, NULL, b, 1e-5f, 37, &mo, &ro);
        int ok = mo == 3.0f;
        for (int i = 0; i < 37; i++) ok &= y[i] == b[i];
        CHECK(ok, "%s layer_norm of a constant row", ISA_NAME[isa]);
        for (int i = 0; i < 37; i++) x[i] = 1000.0f + (i & 1 ? 0.5f : -0.5f);
        kn_vec_layer_norm(y, x, NULL, NULL, 0.0f, 37, &mo, &ro);
        double m = 1000.0 - 0.5 / 37, var = 0;
        for (int i = 0; i < 37; i++) var += (x[i] - m) * (x[i] - m);
        CHECK(fabs(ro - 1.0 / sqrt(var / 37)) <= 1e-5 * ro, "%s layer_norm variance with offset: rstd %.9g want %.9g",
              ISA_NAME[isa], ro, 1.0 / sqrt(var / 37));
    }
    kn_vec_force_isa(-1);
}

/* ============================================================================
 * Conversions
 * ========================================================================== */

TEST(f16_to_f32_exhaustive) {
    uint16_t *h = malloc(2 * 65536 + 2);
    float *y = malloc(4 * 65536 + 4);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    FOR_PATHS(isa) for (int off = 0; off < 2; off++) {      /* off 1: unaligned + odd tail */
        int64_t n = 65536 - off;
        kn_vec_f16_to_f32(y, h + off, n);
        int bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (fbits(y[i]) != fbits(kn_fp16_to_fp32(h[off + i]))) bad = (int)(off + i);
        CHECK(bad < 0, "%s f16 0x%04x -> %08x, fp16.h %08x", ISA_NAME[isa], bad < 0 ? 0 : bad,
              bad < 0 ? 0 : fbits(y[bad - off]), bad < 0 ? 0 : fbits(kn_fp16_to_fp32((uint16_t)bad)));
        kn_vec_bf16_to_f32(y, h + off, n);
        bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (fbits(y[i]) != fbits(kn_bf16_to_fp32(h[off + i]))) bad = (int)(off + i);
        CHECK(bad < 0, "%s bf16 0x%04x differs from fp16.h", ISA_NAME[isa], bad < 0 ? 0 : bad);
    }
    kn_vec_force_isa(-1);
    free(h); free(y);
}

/* f32 test set: every f16/bf16 value widened, its neighbours and the exact
 * midpoints (ties) to the next value, the special values, and random bits. */
static int64_t f32_edge_set(float *x, int64_t cap) {
    int64_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t u = fbits(kn_fp16_to_fp32((uint16_t)h));
        uint32_t ub = h << 16;
        uint32_t cand[] = {u, u + 1, u - 1, u + 0x1000, u + 0xfff, u + 0x1001, ub, ub + 0x8000, ub + 0x7fff, ub + 0x8001, ub + 1};
        for (int k = 0; k < 11 && n < cap; k++) x[n++] = bitsf(cand[k]);
    }
    /* f16 subnormal midpoints: (m + 0.5) * 2^-24 */
    for (int m = 0; m < 1024 && n < cap; m++) x[n++] = (float)((m + 0.5) * 0x1p-24);
    for (int m = 0; m < 1024 && n < cap; m++) x[n++] = -(float)((m + 0.5) * 0x1p-24);
    const float sp[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e10f, INFINITY, -INFINITY, NAN, -NAN,
                        bitsf(0x7f800001), bitsf(0xff800001), bitsf(0x7fbfffff), bitsf(0x7fc00001), 0x1p-149f,
                        0x1p-126f, FLT_MAX, -FLT_MAX, 0x1p-25f, 0x1p-25f * 1.0000001f, 0x1p-24f * 1.5f};
    for (unsigned k = 0; k < sizeof sp / sizeof sp[0] && n < cap; k++) x[n++] = sp[k];
    kn_test_seed(1234);
    while (n < cap) x[n++] = bitsf((uint32_t)kn_test_u64());
    return n;
}

TEST(f32_to_f16_bf16_bit_exact) {
    const int64_t cap = 65536 * 11 + 2048 + 20 + (1 << 20);
    float *x = malloc(sizeof(float) * (size_t)cap);
    uint16_t *y = malloc(2 * (size_t)cap + 2);
    int64_t n = f32_edge_set(x, cap);
    FOR_PATHS(isa) for (int off = 0; off < 2; off++) {
        int64_t m = n - off;
        kn_vec_f32_to_f16(y, x + off, m);
        int64_t bad = -1;
        for (int64_t i = 0; i < m && bad < 0; i++) if (y[i] != kn_fp32_to_fp16(x[off + i])) bad = i;
        CHECK(bad < 0, "%s f32 %08x -> f16 %04x, fp16.h %04x", ISA_NAME[isa], bad < 0 ? 0 : fbits(x[off + bad]),
              bad < 0 ? 0 : y[bad], bad < 0 ? 0 : kn_fp32_to_fp16(x[off + bad]));
        kn_vec_f32_to_bf16(y, x + off, m);
        bad = -1;
        for (int64_t i = 0; i < m && bad < 0; i++) if (y[i] != kn_fp32_to_bf16(x[off + i])) bad = i;
        CHECK(bad < 0, "%s f32 %08x -> bf16 %04x, fp16.h %04x", ISA_NAME[isa], bad < 0 ? 0 : fbits(x[off + bad]),
              bad < 0 ? 0 : y[bad], bad < 0 ? 0 : kn_fp32_to_bf16(x[off + bad]));
    }
    /* sizes, and no write past n */
    FOR_PATHS(isa) for (int s = 0; s < NSIZES; s++) {
        int64_t k = SIZES[s];
        uint16_t out[4099 + GUARD];
        float back[4099 + GUARD];
        for (int i = 0; i < 4099 + GUARD; i++) { out[i] = 0xabcd; back[i] = SENT; }
        kn_vec_f32_to_f16(out, x + 5, k);
        int ok = 1;
        for (int64_t i = 0; i < k; i++) ok &= out[i] == kn_fp32_to_fp16(x[5 + i]);
        for (int i = 0; i < GUARD; i++) ok &= out[k + i] == 0xabcd;
        kn_vec_f16_to_f32(back, out, k);
        for (int64_t i = 0; i < k; i++) ok &= fbits(back[i]) == fbits(kn_fp16_to_fp32(out[i]));
        for (int i = 0; i < GUARD; i++) ok &= fbits(back[k + i]) == fbits(SENT);
        CHECK(ok, "%s f16 conversions n=%lld", ISA_NAME[isa], (long long)k);
        for (int i = 0; i < 4099 + GUARD; i++) { out[i] = 0xabcd; back[i] = SENT; }
        kn_vec_f32_to_bf16(out, x + 5, k);
        ok = 1;
        for (int64_t i = 0; i < k; i++) ok &= out[i] == kn_fp32_to_bf16(x[5 + i]);
        for (int i = 0; i < GUARD; i++) ok &= out[k + i] == 0xabcd;
        kn_vec_bf16_to_f32(back, out, k);
        for (int64_t i = 0; i < k; i++) ok &= fbits(back[i]) == fbits(kn_bf16_to_fp32(out[i]));
        for (int i = 0; i < GUARD; i++) ok &= fbits(back[k + i]) == fbits(SENT);
        CHECK(ok, "%s bf16 conversions n=%lld", ISA_NAME[isa], (long long)k);
    }
    kn_vec_force_isa(-1);
    free(x); free(y);
}

KN_TEST_MAIN()
