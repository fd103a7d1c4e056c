/* render.c: source code for a fused kernel (kernel.h), in C or CUDA C.
 *
 * One emitter writes what every language shares: the op functions (each op's
 * scalar expression from the op table, include/kiln_ops.def, over float), the
 * per-item program (loads, ops, rounding casts, stores) and the index
 * arithmetic. A dialect says what differs: the prelude (how a float's bits
 * are read, NaN and infinity, the function qualifier), the kernel's head and
 * its loop over items. A GLSL dialect would add its own prelude, head
 * (a compute shader's buffers and push constants) and loop.
 *
 * C kernels walk their items [begin, end) row by row, with the innermost dim
 * as a plain counted loop that the C compiler vectorises; CUDA kernels are a
 * grid-stride loop, one item per thread per step, with 32-bit index math when
 * every offset fits.
 *
 * The vocabulary is rendered in float (expf, not exp): the hand kernels of the
 * CPU and CUDA backends compute f32, f16 and bf16 in float too, and a value of
 * a node whose dtype is f16 or bf16 is rounded to it after each op, as the
 * unfused graph would store it.
 */
#include "compile/kernel.h"
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct { char *p; size_t n, cap; bool over; } sb;

static void put(sb *b, const char *fmt, ...) {
    if (b->over) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= b->cap - b->n) { b->over = true; return; }
    b->n += (size_t)w;
}

typedef struct dialect {
    const char *lang;
    const char *prelude;    /* types, NaN and infinity, bit casts: before the vocabulary */
    const char *rint;       /* round half to even in the current rounding mode */
    bool cuda;
} dialect;

/* What the two dialects need before the shared text. */
static const char c_prelude[] =
    "#include <stdint.h>\n"
    "#include <math.h>\n"
    "typedef uint32_t kn_u32;\n"
    "typedef uint16_t kn_u16;\n"
    "typedef int64_t kn_i64;\n"
    "typedef struct { char *buf[%d]; const kn_i64 *syms; kn_i64 n; void *err; void *scratch; } kn_kargs;\n"
    "#define KN_FN static inline\n"
    "#define KN_NAN NAN\n"
    "#define KN_INF INFINITY\n"
    "typedef union { float f; kn_u32 u; } kn_fu;\n"
    "KN_FN kn_u32 kn_f2u(float f) { kn_fu x; x.f = f; return x.u; }\n"
    "KN_FN float kn_u2f(kn_u32 u) { kn_fu x; x.u = u; return x.f; }\n";
static const char cuda_prelude[] =
    "typedef unsigned int kn_u32;\n"
    "typedef unsigned short kn_u16;\n"
    "typedef long long kn_i64;\n"
    "typedef struct { char *buf[%d]; const kn_i64 *syms; kn_i64 n; void *err; void *scratch; } kn_kargs;\n"
    "#define KN_FN static __device__ __forceinline__\n"
    "#define KN_NAN __int_as_float(0x7fc00000)\n"
    "#define KN_INF __int_as_float(0x7f800000)\n"
    "KN_FN kn_u32 kn_f2u(float f) { return __float_as_uint(f); }\n"
    "KN_FN float kn_u2f(kn_u32 u) { return __uint_as_float(u); }\n"
    /* programmatic dependent launch (the backend's common.cuh says the
     * contract): wait for the previous kernel before the first global
     * access, then let the next one be scheduled */
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    "#define KN_PDL_ENTER() do { asm volatile(\"griddepcontrol.wait;\" ::: \"memory\"); "
    "asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\"); } while (0)\n"
    "#else\n"
    "#define KN_PDL_ENTER() do { } while (0)\n"
    "#endif\n";

/* The vocabulary of the op table's expressions (src/graph/scalar_ops.h has
 * the double versions the reference backend uses), over kn_real (float, or
 * double in a kernel with an f64 value): libm names with an f suffix or not. */
static const char *const g_fns[][2] = {
    {"FABS", "fabs"}, {"EXP", "exp"}, {"EXP2", "exp2"}, {"LOG", "log"}, {"LOG2", "log2"}, {"LOG1P", "log1p"},
    {"EXPM1", "expm1"}, {"SQRT", "sqrt"}, {"SIN", "sin"}, {"COS", "cos"}, {"TAN", "tan"}, {"ASIN", "asin"},
    {"ACOS", "acos"}, {"ATAN", "atan"}, {"SINH", "sinh"}, {"COSH", "cosh"}, {"TANH", "tanh"}, {"ASINH", "asinh"},
    {"ACOSH", "acosh"}, {"ATANH", "atanh"}, {"ERF", "erf"}, {"FLOOR", "floor"}, {"CEIL", "ceil"}, {"TRUNC", "trunc"},
};
/* C, float: exp, log, tanh and erf as straight-line code (range reduction,
 * polynomials, selects instead of branches) that the C compiler vectorises
 * inside the item loop; libm's expf is a call per element. The same
 * algorithms and coefficients as the CPU backend's AVX2 kernels
 * (src/backends/cpu/vec_avx2.c: relative error <= 3e-7), so fused and hand
 * kernels agree; NaN passes through, overflow gives inf. */
static const char c_float_math[] =
    "KN_FN float kn_m_exp(float x) {\n"
    "    float c = x != x ? 0.0f : x > 88.8f ? 88.8f : x < -104.0f ? -104.0f : x;\n"
    "    float t = c * 1.44269502f + 12582912.0f;\n"   /* n + 1.5*2^23: n in the low mantissa bits */
    "    float n = t - 12582912.0f;\n"
    "    float r = c - n * 0.693147182f;\n"
    "    r = r - n * -1.90465432e-09f;\n"
    "    float p = 0.00139485905f;\n"
    "    p = p * r + 0.00837513525f; p = p * r + 0.0416662171f; p = p * r + 0.166664153f;\n"
    "    p = p * r + 0.5f; p = p * r + 1.0f; p = p * r + 1.0f;\n"
    "    int ni = (int)(kn_f2u(t) - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;\n"
    "    float y = p * kn_u2f((kn_u32)(n1 + 127) << 23) * kn_u2f((kn_u32)(n2 + 127) << 23);\n"
    "    return x != x ? x : y;\n"
    "}\n"
    "KN_FN float kn_m_log(float x) {\n"
    "    int tiny = x < 1.17549435e-38f;\n"
    "    float xs = tiny ? x * 8388608.0f : x;\n"
    "    kn_u32 ix = kn_f2u(xs);\n"
    "    float e = (float)((int)(ix >> 23) - 127) - (tiny ? 23.0f : 0.0f);\n"
    "    float m = kn_u2f((ix & 0x007fffffu) | 0x3f800000u);\n"
    "    int big = m > 1.41421356f;\n"
    "    m = big ? m * 0.5f : m;\n"
    "    e = big ? e + 1.0f : e;\n"
    "    float f = m - 1.0f, s = f / (2.0f + f), z = s * s;\n"
    "    float R = (2.0f / 11) * z + (2.0f / 9); R = R * z + (2.0f / 7); R = R * z + (2.0f / 5); R = R * z + (2.0f / 3);\n"
    "    R = R * z;\n"
    "    float hfsq = 0.5f * f * f, t = s * (hfsq + R) + e * -1.90465432e-09f;\n"
    "    float y = e * 0.693147182f - ((hfsq - t) - f);\n"
    "    y = x == 0.0f ? -KN_INF : x < 0.0f ? KN_NAN : y;\n"
    "    return (x != x || x == KN_INF) ? x : y;\n"
    "}\n"
    /* tanh: |x| <= 1 the odd polynomial, else (1 - e) / (1 + e) with
     * e = exp(-2|x|) (no overflow, no clamp: a clamp's constant lets the
     * compiler thread jumps and the loop no longer vectorises); signs by bits */
    "KN_FN float kn_m_tanh(float x) {\n"
    "    kn_u32 sx = kn_f2u(x) & 0x80000000u;\n"
    "    float a = kn_u2f(kn_f2u(x) & 0x7fffffffu), z = x * x;\n"
    "    float p = 0.00012176919f;\n"
    "    p = p * z - 0.000842288719f; p = p * z + 0.00308037712f; p = p * z - 0.0085965246f;\n"
    "    p = p * z + 0.0217853282f; p = p * z - 0.0539532267f; p = p * z + 0.133332014f; p = p * z - 0.333333284f;\n"
    "    float small = kn_u2f((kn_f2u(x * z * p + x) & 0x7fffffffu) | sx);\n"
    "    float e = kn_m_exp(-2.0f * a);\n"
    "    float big = kn_u2f(kn_f2u((1.0f - e) / (1.0f + e)) | sx);\n"
    "    return a <= 1.0f ? small : (x != x ? x : big);\n"
    "}\n"
    "KN_FN float kn_m_erf(float x) {\n"
    "    float a = x < 0 ? -x : x, z = x * x;\n"
    "    float p = 7.88249672e-05f;\n"
    "    p = p * z - 0.000801885501f; p = p * z + 0.00518931216f; p = p * z - 0.0268543288f;\n"
    "    p = p * z + 0.112835974f; p = p * z - 0.37612626f; p = p * z + 1.12837911f;\n"
    "    float small = x * p;\n"
    "    float ac = a < 1.0f ? 1.0f : a > 4.0f ? 4.0f : a;\n"
    "    float t = 1.0f / ac, u = t - 0.625f;\n"
    "    float q = -0.0473638512f;\n"
    "    q = q * u + 0.0548653826f; q = q * u - 0.0247461293f; q = q * u - 0.0112171127f; q = q * u + 0.0496267565f;\n"
    "    q = q * u - 0.0779847354f; q = q * u + 0.0721013844f; q = q * u - 0.00129544886f; q = q * u - 0.171585649f;\n"
    "    q = q * u + 0.489524782f;\n"
    "    float big = 1.0f - kn_m_exp(-(ac * ac)) * t * q;\n"
    "    big = x < 0 ? -big : big;\n"
    "    return a <= 1.0f ? small : (x != x ? x : big);\n"
    "}\n";

static void put_vocabulary(sb *b, bool f64, const char *rint, bool cmath) {
    const char *f = f64 ? "" : "f";
    put(b, "typedef %s kn_real;\n", f64 ? "double" : "float");
    bool own = cmath && !f64;
    if (own) put(b, "%s", c_float_math);
    for (size_t i = 0; i < sizeof g_fns / sizeof g_fns[0]; i++) {
        const char *nm = g_fns[i][1];
        if (own && (!strcmp(nm, "exp") || !strcmp(nm, "log") || !strcmp(nm, "tanh") || !strcmp(nm, "erf")))
            put(b, "#define KN_%s(v) kn_m_%s(v)\n", g_fns[i][0], nm);
        else put(b, "#define KN_%s(v) %s%s(v)\n", g_fns[i][0], nm, f);
    }
    put(b, "#define KN_RINT(v) %s%s(v)\n#define KN_POW(u, v) pow%s(u, v)\n#define KN_FMOD(u, v) fmod%s(u, v)\n"
           "#define KN_ATAN2(u, v) atan2%s(u, v)\n", rint, f, f, f, f);
}

/* What does not depend on the compute type: small functions of the
 * vocabulary, and f16/bf16 rounding (to nearest even; NaN stays NaN,
 * overflow goes to infinity). */
static const char shared_prelude[] =
    "#define KN_ISNAN(v) isnan(v)\n"
    "KN_FN kn_real kn_s_sign(kn_real x) { return x > 0 ? (kn_real)1 : x < 0 ? (kn_real)-1 : x == 0 ? (kn_real)0 : x; }\n"
    "KN_FN kn_real kn_s_sigmoid(kn_real x) { kn_real e = KN_EXP(-KN_FABS(x)); return (x >= 0 ? 1 : e) / (1 + e); }\n"
    "KN_FN kn_real kn_s_softplus(kn_real x) { return x > 20 ? x : KN_LOG1P(KN_EXP(x)); }\n"
    "#define KN_SIGN(v) kn_s_sign(v)\n#define KN_RSQRT(v) (1 / KN_SQRT(v))\n#define KN_RECIPROCAL(v) (1 / (v))\n"
    "#define KN_SQUARE(v) ((v) * (v))\n#define KN_SIGMOID(v) kn_s_sigmoid(v)\n#define KN_SOFTPLUS(v) kn_s_softplus(v)\n"
    "KN_FN float kn_bf16_f32(kn_u16 h) { return kn_u2f((kn_u32)h << 16); }\n"
    "KN_FN kn_u16 kn_f32_bf16(float f) {\n"
    "    kn_u32 u = kn_f2u(f);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (kn_u16)((u >> 16) | 0x40u);\n"
    "    return (kn_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "KN_FN float kn_f16_f32(kn_u16 h) {\n"
    "    kn_u32 s = (kn_u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }\n"
    "    if (e == 31) return kn_u2f(s | 0x7f800000u | (m << 13));\n"
    "    return kn_u2f(s | ((e + 112u) << 23) | (m << 13));\n"
    "}\n"
    "KN_FN kn_u16 kn_f32_f16(float f) {\n"
    "    kn_u32 x = kn_f2u(f), s = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;\n"
    "    if (ax >= 0x7f800000u) return (kn_u16)(s | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));\n"
    "    if (ax >= 0x477ff000u) return (kn_u16)(s | 0x7c00u);\n"
    "    if (ax < 0x38800000u) return (kn_u16)(s | (kn_f2u(kn_u2f(ax) + 0.5f) - 0x3f000000u));\n"
    "    return (kn_u16)(s | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13));\n"
    "}\n";

static const char *ctype(kn_dtype dt) {
    return dt == KN_F32 ? "float" : dt == KN_F64 ? "double" : dt == KN_I32 ? "int" : dt == KN_I64 ? "kn_i64" : "kn_u16";
}
static bool is_index_dt(kn_dtype dt) { return dt == KN_I32 || dt == KN_I64; }
static const char *load_fn(kn_dtype dt) { return dt == KN_BF16 ? "kn_bf16_f32" : dt == KN_F16 ? "kn_f16_f32" : ""; }
/* to the dtype's storage: a double kernel rounds to float first */
static const char *store_fn(kn_dtype dt) { return dt == KN_BF16 ? "kn_f32_bf16" : dt == KN_F16 ? "kn_f32_f16" : dt == KN_F32 ? "(float)" : ""; }

/* A constant of the compute type, exactly (hex float) */
static void put_const(sb *b, double v, bool f64) {
    double x = f64 ? v : (double)(float)v;
    if (isnan(x)) put(b, "(kn_real)KN_NAN");
    else if (isinf(x)) put(b, x > 0 ? "(kn_real)KN_INF" : "(kn_real)(-KN_INF)");
    else put(b, f64 ? "%a" : "%af", x);
}

/* An op table expression with its floating literals typed for the compute
 * type: "0.5" becomes "0.5f" in a float kernel, so no operation is promoted
 * to double (which would halve the vector width). Integer literals stay. */
static void put_expr(sb *b, const char *e, bool f64) {
    for (const char *c = e; *c;) {
        bool ident_before = c > e && (isalnum((unsigned char)c[-1]) || c[-1] == '_');
        if (!ident_before && (isdigit((unsigned char)*c) || (*c == '.' && isdigit((unsigned char)c[1])))) {
            const char *s0 = c;
            bool flt = false;
            while (isdigit((unsigned char)*c) || *c == '.' || *c == 'e' || *c == 'E' ||
                   ((*c == '+' || *c == '-') && (c[-1] == 'e' || c[-1] == 'E'))) {
                flt |= *c == '.' || *c == 'e' || *c == 'E';
                c++;
            }
            put(b, "%.*s%s", (int)(c - s0), s0, flt && !f64 ? "f" : "");
            continue;
        }
        put(b, "%c", *c++);
    }
}

/* One function per op the kernel uses, from the op table's expression. */
static void op_functions(sb *b, const kn_kernel *k) {
    bool done[KN_OP_COUNT] = {0};
    for (int i = 0; i < k->ninst; i++) {
        const kn_kinst *in = &k->inst[i];
        if ((in->kind != KN_KI_UNARY && in->kind != KN_KI_BINARY) || done[in->op]) continue;
        done[in->op] = true;
        const kn_op_info *oi = kn_op_get(in->op);
        if (in->kind == KN_KI_UNARY) put(b, "KN_FN kn_real kn_op_%s(kn_real x, kn_real p0, kn_real p1) { (void)p0; (void)p1; return (kn_real)(", oi->name);
        else put(b, "KN_FN kn_real kn_op_%s(kn_real a, kn_real b) { return (kn_real)(", oi->name);
        put_expr(b, oi->expr, k->f64);
        put(b, "); }\n");
    }
}

static int64_t max_items(const kn_kernel *k) {
    int64_t n = 1;
    for (int d = 0; d < k->ndim; d++) n *= k->ext[d];
    return n;
}

/* Largest element offset a buffer is read or written at, plus one. */
static int64_t max_offset(const kn_kernel *k, int bi) {
    int64_t o = 0;
    for (int d = 0; d < k->ndim; d++) o += (k->ext[d] - 1) * (k->buf[bi].st[d] < 0 ? -k->buf[bi].st[d] : k->buf[bi].st[d]);
    return o + 1;
}

/* E<d> of dims [0, nd) (symbolic ones read from syms), one line each at indent ind */
static void put_extents_of(sb *b, int nd, const int64_t *ext, const int8_t *sym, const int64_t *mul, const char *ity,
                           const char *syms, const char *ind) {
    for (int d = 0; d < nd; d++) {
        if (sym[d]) put(b, "%sconst %s E%d = (%s)%s[%d] * %lld;\n", ind, ity, d, ity, syms, sym[d], (long long)mul[d]);
        else put(b, "%sconst %s E%d = %lld;\n", ind, ity, d, (long long)ext[d]);
    }
}
/* A CUDA kernel's first lines: every generated kernel is launched with
 * programmatic dependent launch where the device has it (cuda_jit.cu
 * looks for the KN_PDL_ENTER call), so it waits before reading a.syms. */
static void cuda_open(sb *b, const kn_kernel *k) {
    put(b, "extern \"C\" __global__ void %s(kn_kargs a) {\n", k->name);
    put(b, "    KN_PDL_ENTER();\n");
}
static void put_extents(sb *b, const kn_kernel *k, const char *ity, const char *syms) {
    put_extents_of(b, k->ndim, k->ext, k->sym, k->mul, ity, syms, "    ");
}
/* the coordinates i0..i<nd-1> of item i (row-major over E<d>) */
static void put_item_coords(sb *b, int nd, const char *ity, const char *ind) {
    if (nd == 1) { put(b, "%sconst %s i0 = i;\n", ind, ity); return; }
    put(b, "%s%s r = i;\n", ind, ity);
    for (int d = nd - 1; d >= 1; d--) put(b, "%sconst %s i%d = r %% E%d; r /= E%d;\n", ind, ity, d, d, d);
    put(b, "%sconst %s i0 = r;\n", ind, ity);
}

static void put_buffers(sb *b, const kn_kernel *k, const char *args) {
    for (int i = 0; i < k->nbuf; i++)
        put(b, "    %s%s *b%d = (%s%s *)%sbuf[%d];\n", k->buf[i].out ? "" : "const ", ctype(k->buf[i].dt), i,
            k->buf[i].out ? "" : "const ", ctype(k->buf[i].dt), args, i);
}

static void offset_expr_skip(char *out, size_t cap, const kn_kernel *k, int bi, int nd, const char *pre, int skip);

/* the dims of the segment instruction i belongs to */
static int seg_ndim(const kn_kernel *k, int i) {
    int nd = k->ndim;
    for (int s = 1; s < k->nseg; s++) if (i >= k->seg[s].i0) nd = k->seg[s].ndim;
    return nd;
}

/* rope of buffer in->buf at this item (CUDA: coordinates i<d>, the last dim
 * kept by the fuser): the item's element and its pair partner (2p, 2p+1, or
 * p, p + n_rot/2 with neox) rotated by pos * freq_scale * theta^(-2p/n_rot)
 * (/ the pair's frequency divisor); past n_rot the element passes through.
 * theta^(-2p/n_rot) comes from a table the host wrote as the reference forms
 * it (put_rope_tables). The angle is formed in double (positions reach 10^5
 * radians); in a float kernel it is reduced to [-pi, pi] in double (whole
 * turns off) and its sine and cosine are taken in float (sincospif, no
 * large-argument path), as the CPU backend rounds them
 * (cuda_ops_nn.cu's rope_cs does the same): double pow, cos and sin per
 * element cost an 8B-shaped prompt 44 us a layer. Index math in the item
 * coordinates' own type (auto: int where the kernel's offsets fit). */
static void put_rope(sb *b, const kn_kernel *k, int i, const char *ind, const char *const *idx) {
    const kn_kinst *in = &k->inst[i];
    int L = seg_ndim(k, i) - 1, h = in->rot / 2;
    int64_t sx = k->buf[in->buf].st[L];
    const char *ld = load_fn(k->buf[in->buf].dt);
    put(b, "%skn_real v%d;\n%s{\n", ind, i, ind);
    put(b, "%s    const auto jj = i%d;\n%s    const auto o = %s;\n", ind, L, ind, idx[in->buf]);
    put(b, "%s    if (jj >= %d) v%d = (kn_real)%s(b%d[o]);\n", ind, in->rot, i, ld, in->buf);
    put(b, "%s    else {\n", ind);
    if (in->neox) put(b, "%s        const auto pr = jj < %d ? jj : jj - %d, ja = pr, jb = pr + %d;\n", ind, h, h, h);
    else put(b, "%s        const auto pr = jj >> 1, ja = 2 * pr, jb = ja + 1;\n", ind);
    put(b, "%s        double ang = (double)v%d * %a * kn_rope_if%d[pr];\n", ind, in->b, in->p1, i);
    if (in->aux >= 0) put(b, "%s        ang /= (double)%s(b%d[pr * %lld]);\n", ind, load_fn(k->buf[in->aux].dt), in->aux, (long long)in->ast);
    if (k->f64) {
        put(b, "%s        const double c = cos(ang), s = sin(ang);\n", ind);
    } else {   /* the angle in turns, less whole turns, as a fraction of pi in [-1, 1] */
        put(b, "%s        const double t = ang * %a;\n", ind, 1.0 / (2.0 * 3.14159265358979323846));
        put(b, "%s        float s, c;\n%s        sincospif((float)(2.0 * (t - rint(t))), &s, &c);\n", ind, ind);
    }
    put(b, "%s        const kn_real xa = (kn_real)%s(b%d[o + (ja - jj) * %lld]), xb = (kn_real)%s(b%d[o + (jb - jj) * %lld]);\n",
        ind, ld, in->buf, (long long)sx, ld, in->buf, (long long)sx);
    put(b, "%s        v%d = jj == ja ? xa * c - xb * s : xa * s + xb * c;\n%s    }\n%s}\n", ind, i, ind, ind);
}

/* Each rope's theta^(-2p/n_rot), p < n_rot/2, as the reference computes it
 * (pow in double), a table in global memory read by pair (L1-cached; a
 * constant bank would serialise a warp's different pairs). */
static void put_rope_tables(sb *b, const kn_kernel *k) {
    for (int i = 0; i < k->ninst; i++) {
        const kn_kinst *in = &k->inst[i];
        if (in->kind != KN_KI_ROPE) continue;
        put(b, "static __device__ const double kn_rope_if%d[%d] = {", i, in->rot / 2);
        for (int p = 0; p < in->rot / 2; p++) put(b, "%s%a", p ? (p % 4 ? ", " : ",\n    ") : "\n    ", pow(in->p0, -2.0 * p / in->rot));
        put(b, "};\n");
    }
}

/* index_copy at this item: every index of the vector is checked (a bad one
 * is reported into the op's error slot and nothing is written, as the hand
 * kernel does), and a later equal index wins (this item then writes
 * nothing); the destination row is the item's index value. */
static void put_scatter(sb *b, const kn_kernel *k, int i, const char *ind) {
    const kn_kinst *in = &k->inst[i];
    int d = in->dim;
    char ob[256];                            /* the destination's offset without dim d */
    offset_expr_skip(ob, sizeof ob, k, in->buf, seg_ndim(k, i), "i", d);
    put(b, "%s{\n%s    const kn_i64 at = v%d;\n%s    bool ok = true;\n", ind, ind, in->b, ind);
    put(b, "%s    for (kn_i64 q = 0; q < E%d; q++) {\n", ind, d);
    put(b, "%s        const kn_i64 w = (kn_i64)b%d[q * %lld];\n", ind, in->aux, (long long)in->ast);
    put(b, "%s        if (w < 0 || w >= %lld) { kn_kerr_set((kn_kerr *)a.err + %d, %d, (double)w, %lld); ok = false; break; }\n",
        ind, (long long)in->bound, (int)KN_OP_INDEX_COPY, in->odim, (long long)in->bound);
    put(b, "%s        if (q > i%d && w == at) ok = false;\n%s    }\n", ind, d, ind);
    put(b, "%s    if (ok) b%d[%s + at * %lld] = %s(v%d);\n%s}\n", ind, in->buf, ob, (long long)k->buf[in->buf].st[d],
        store_fn(in->dt), in->a, ind);
}

/* index_select at this item: the source's element at the item's
 * coordinates with dim d's replaced by the index value; a bad index reads
 * 0 and is reported into index_select's slot (the hand kernel skips it and
 * the plan fails at its end either way) */
static void put_gather(sb *b, const kn_kernel *k, int i, const char *ind) {
    const kn_kinst *in = &k->inst[i];
    int d = in->dim;
    char ob[256];                            /* the source's offset without dim d */
    offset_expr_skip(ob, sizeof ob, k, in->buf, seg_ndim(k, i), "i", d);
    put(b, "%skn_real v%d;\n%s{\n%s    const kn_i64 w = v%d;\n", ind, i, ind, ind, in->b);
    put(b, "%s    if (w < 0 || w >= %lld) { kn_kerr_set((kn_kerr *)a.err + %d, %d, (double)w, %lld); v%d = 0; }\n", ind,
        (long long)in->bound, (int)KN_OP_INDEX_SELECT, in->odim, (long long)in->bound, i);
    put(b, "%s    else v%d = (kn_real)%s(b%d[%s + w * %lld]);\n%s}\n", ind, i, load_fn(in->dt), in->buf, ob,
        (long long)k->buf[in->buf].st[d], ind);
}

/* The per-item program; idx(b) is the element offset expression of buffer b.
 * stores says what its stored values become: reloaded from the buffer the
 * first pass wrote (PUT_RELOAD: the later passes of a normalisation), stored
 * (PUT_STORE), or kept in st<i>[kk] for a store loop after the pass
 * (PUT_DEFER: a CUDA row normalisation's cached first pass, rn_deferred_stores). */
enum { PUT_RELOAD = 0, PUT_STORE = 1, PUT_DEFER = 2 };
static void put_program_r(sb *b, const kn_kernel *k, const char *ind, const char *const *idx, int stores, int i0, int i1);
static void put_program_s(sb *b, const kn_kernel *k, const char *ind, const char *const *idx, int stores) {
    put_program_r(b, k, ind, idx, stores, 0, k->ninst);
}
/* instructions [i0, i1) only (a segment) */
static void put_program_r(sb *b, const kn_kernel *k, const char *ind, const char *const *idx, int stores, int i0, int i1) {
    int ld[KN_KMAX_INST];
    kn__kernel_stored_values(k, ld);
    for (int i = i0; i < i1; i++) {
        const kn_kinst *in = &k->inst[i];
        if (!stores && ld[i] >= 0) {   /* a later pass reads the value the first pass stored */
            put(b, "%sconst kn_real v%d = %s(b%d[%s]);\n", ind, i, load_fn(k->buf[ld[i]].dt), ld[i], idx[ld[i]]);
            continue;
        }
        switch ((kn_kinst_kind)in->kind) {
        case KN_KI_LOAD:
            if (is_index_dt(in->dt)) put(b, "%sconst kn_i64 v%d = (kn_i64)b%d[%s];\n", ind, i, in->buf, idx[in->buf]);
            else put(b, "%sconst kn_real v%d = %s(b%d[%s]);\n", ind, i, load_fn(in->dt), in->buf, idx[in->buf]);
            break;
        case KN_KI_ROPE:
            put_rope(b, k, i, ind, idx);
            break;
        case KN_KI_SCATTER:
            if (stores) put_scatter(b, k, i, ind);
            break;
        case KN_KI_GATHER:
            put_gather(b, k, i, ind);
            break;
        case KN_KI_CONST:
            put(b, "%sconst kn_real v%d = ", ind, i); put_const(b, in->p0, k->f64); put(b, ";\n");
            break;
        case KN_KI_UNARY:
            put(b, "%sconst kn_real v%d = kn_op_%s(v%d, ", ind, i, kn_op_get(in->op)->name, in->a);
            put_const(b, in->p0, k->f64); put(b, ", "); put_const(b, in->p1, k->f64); put(b, ");\n");
            break;
        case KN_KI_BINARY:
            put(b, "%sconst kn_real v%d = kn_op_%s(v%d, v%d);\n", ind, i, kn_op_get(in->op)->name, in->a, in->b);
            break;
        case KN_KI_CAST:   /* round to the dtype and back (f16, bf16 through float) */
            put(b, "%sconst kn_real v%d = %s(%s(v%d));\n", ind, i, load_fn(in->dt), store_fn(in->dt), in->a);
            break;
        case KN_KI_STORE:
            if (stores == PUT_DEFER) put(b, "%sst%d[kk] = v%d;\n", ind, i, in->a);
            else if (stores) put(b, "%sb%d[%s] = %s(v%d);\n", ind, in->buf, idx[in->buf], store_fn(in->dt), in->a);
            break;
        }
    }
}
static void put_program(sb *b, const kn_kernel *k, const char *ind, const char *const *idx) { put_program_s(b, k, ind, idx, true); }

/* "i0 * 96 + i1" for buffer bi over dims [0, nd) with index names i0..; "0" when all strides are 0 */
static void offset_expr_skip(char *out, size_t cap, const kn_kernel *k, int bi, int nd, const char *pre, int skip) {
    size_t n = 0;
    out[0] = 0;
    for (int d = 0; d < nd; d++) {
        int64_t s = k->buf[bi].st[d];
        if (!s || d == skip) continue;
        int w = s == 1 ? snprintf(out + n, cap - n, "%s%s%d", n ? " + " : "", pre, d)
                       : snprintf(out + n, cap - n, "%s%s%d * %lld", n ? " + " : "", pre, d, (long long)s);
        if (w < 0 || (size_t)w >= cap - n) break;
        n += (size_t)w;
    }
    if (!n) snprintf(out, cap, "0");
}
static void offset_expr(char *out, size_t cap, const kn_kernel *k, int bi, int nd, const char *pre) {
    offset_expr_skip(out, cap, k, bi, nd, pre, -1);
}

/* Every buffer's offset expression over all of k's dims (index names i<d>),
 * as put_program takes them. */
typedef struct {
    char ix[KN_KERNEL_MAXBUF][256];
    const char *idx[KN_KERNEL_MAXBUF];
} kidx;
static void full_index(kidx *x, const kn_kernel *k) {
    for (int i = 0; i < k->nbuf; i++) { offset_expr(x->ix[i], sizeof x->ix[i], k, i, k->ndim, "i"); x->idx[i] = x->ix[i]; }
}

static void render_c(sb *b, const kn_kernel *k) {
    int nd = k->ndim, last = nd - 1;
    put(b, "void %s(const kn_kargs *a, kn_i64 begin, kn_i64 end) {\n", k->name);
    put_extents(b, k, "kn_i64", "a->syms");
    put_buffers(b, k, "a->");
    put(b, "    for (kn_i64 i = begin; i < end;) {\n");
    put(b, "        kn_i64 r = i / E%d;\n", last);
    put(b, "        const kn_i64 j0 = i - r * E%d;\n", last);
    for (int d = last - 1; d >= 0; d--) {
        if (d > 0) put(b, "        const kn_i64 i%d = r %% E%d; r /= E%d;\n", d, d, d);
        else put(b, "        const kn_i64 i0 = r;\n");
    }
    put(b, "        kn_i64 cnt = E%d - j0;\n        if (cnt > end - i) cnt = end - i;\n", last);
    char ob[KN_KERNEL_MAXBUF][256], ix[KN_KERNEL_MAXBUF][320];
    const char *idx[KN_KERNEL_MAXBUF];
    for (int i = 0; i < k->nbuf; i++) {
        offset_expr(ob[i], sizeof ob[i], k, i, last, "i");
        put(b, "        const kn_i64 o%d = %s;\n", i, ob[i]);
        int64_t s = k->buf[i].st[last];
        if (!s) snprintf(ix[i], sizeof ix[i], "o%d", i);
        else if (s == 1) snprintf(ix[i], sizeof ix[i], "o%d + j", i);
        else snprintf(ix[i], sizeof ix[i], "o%d + j * %lld", i, (long long)s);
        idx[i] = ix[i];
    }
    if (k->tune.unroll > 1) put(b, "#pragma GCC unroll %d\n", k->tune.unroll);   /* kernel search (search.c) */
    put(b, "        for (kn_i64 j = j0; j < j0 + cnt; j++) {\n");
    put_program(b, k, "            ", idx);
    put(b, "        }\n        i += cnt;\n    }\n}\n");
}

/* The elementwise kernel with k->tune.unroll = U > 1 (kernel search): each
 * thread takes U items per grid-stride step, base + u * stride for u < U, so
 * each of the U loads of a warp is still coalesced. The U copies of the
 * program are written in three phases, every copy's loads, then every copy's
 * arithmetic, then every copy's stores, so a thread has U loads of each
 * buffer in flight before it waits for the first (the compiler may not move
 * a load above an earlier store itself: without restrict an output may be an
 * input). That order is safe for the same reason the one-item loop is: a
 * kernel writes an input only in place, item i over item i (fuse.c,
 * kn__fuse_aligned_reads), and items of other copies are other threads'
 * items in the one-item loop. Values are v<inst>_<copy>; a copy past n
 * loads nothing (0) and stores nothing. 32-bit index math only below 2^30
 * items: base + (U - 1) * stride must not overflow (a grid is at most
 * waves x SMs x 2048 threads, far below 2^30 / U). */
static void put_copy_inst(sb *b, const kn_kernel *k, int i, int u, const char *idx) {
    const kn_kinst *in = &k->inst[i];
    switch ((kn_kinst_kind)in->kind) {   /* the spelling of put_program_s, per copy */
    case KN_KI_LOAD:
        put(b, "        const kn_real v%d_%d = in%d ? (kn_real)%s(b%d[%s]) : (kn_real)0;\n", i, u, u, load_fn(in->dt), in->buf, idx);
        break;
    case KN_KI_CONST:
        put(b, "        const kn_real v%d_%d = ", i, u); put_const(b, in->p0, k->f64); put(b, ";\n");
        break;
    case KN_KI_UNARY:
        put(b, "        const kn_real v%d_%d = kn_op_%s(v%d_%d, ", i, u, kn_op_get(in->op)->name, in->a, u);
        put_const(b, in->p0, k->f64); put(b, ", "); put_const(b, in->p1, k->f64); put(b, ");\n");
        break;
    case KN_KI_BINARY:
        put(b, "        const kn_real v%d_%d = kn_op_%s(v%d_%d, v%d_%d);\n", i, u, kn_op_get(in->op)->name, in->a, u, in->b, u);
        break;
    case KN_KI_CAST:
        put(b, "        const kn_real v%d_%d = %s(%s(v%d_%d));\n", i, u, load_fn(in->dt), store_fn(in->dt), in->a, u);
        break;
    case KN_KI_STORE:
        put(b, "        if (in%d) b%d[%s] = %s(v%d_%d);\n", u, in->buf, idx, store_fn(in->dt), in->a, u);
        break;
    case KN_KI_ROPE: case KN_KI_SCATTER: case KN_KI_GATHER:   /* such kernels are never unrolled (kn__kernel_indexed) */
        break;
    }
}

/* An elementwise CUDA kernel's head: the signature, the extents, n, the
 * buffers. Returns the index type: int when items below item_limit and every
 * offset fit 32 bits. */
static const char *cuda_ew_head(sb *b, const kn_kernel *k, int64_t item_limit) {
    bool narrow = max_items(k) < item_limit;
    for (int i = 0; i < k->nbuf && narrow; i++) narrow = max_offset(k, i) < ((int64_t)1 << 31);
    const char *ity = narrow ? "int" : "long long";
    cuda_open(b, k);
    put_extents(b, k, ity, "a.syms");
    put(b, "    const %s n = E0", ity);
    for (int d = 1; d < k->ndim; d++) put(b, " * E%d", d);
    put(b, ";\n");
    put_buffers(b, k, "a.");
    return ity;
}

static void render_cuda_unrolled(sb *b, const kn_kernel *k) {
    int nd = k->ndim, U = k->tune.unroll;
    /* base + U * stride stays below 2^31 */
    const char *ity = cuda_ew_head(b, k, (int64_t)1 << 30);
    put(b, "    const %s stride = (%s)gridDim.x * blockDim.x;\n", ity, ity);
    put(b, "    for (%s base = blockIdx.x * (%s)blockDim.x + threadIdx.x; base < n; base += stride * %d) {\n", ity, ity, U);
    /* copy u's item and its indices u<u>i<d> */
    char ix[KN_KERNEL_MAXBUF][256], pre[16];
    for (int u = 0; u < U; u++) {
        put(b, "        const %s i_%d = base + %d * stride;\n        const bool in%d = i_%d < n;\n", ity, u, u, u, u);
        if (nd == 1) put(b, "        const %s u%di0 = i_%d;\n", ity, u, u);
        else {
            put(b, "        %s r_%d = i_%d;\n", ity, u, u);
            for (int d = nd - 1; d >= 1; d--) put(b, "        const %s u%di%d = r_%d %% E%d; r_%d /= E%d;\n", ity, u, d, u, d, u, d);
            put(b, "        const %s u%di0 = r_%d;\n", ity, u, u);
        }
    }
    for (int phase = 0; phase < 3; phase++)   /* loads, arithmetic, stores */
        for (int u = 0; u < U; u++) {
            snprintf(pre, sizeof pre, "u%di", u);
            for (int i = 0; i < k->nbuf; i++) offset_expr(ix[i], sizeof ix[i], k, i, nd, pre);
            for (int i = 0; i < k->ninst; i++) {
                int kind = k->inst[i].kind, ph = kind == KN_KI_LOAD ? 0 : kind == KN_KI_STORE ? 2 : 1;
                if (ph == phase) put_copy_inst(b, k, i, u, ix[k->inst[i].buf]);
            }
        }
    put(b, "    }\n}\n");
}

static void put_kerr(sb *b, const kn_kernel *k) {
    if (k->err_op != KN_OP_NONE)
        put(b, "typedef struct { int code; int dim; double value; kn_i64 size; } kn_kerr;\n"
               "KN_FN void kn_kerr_set(kn_kerr *e, int dim, double v, kn_i64 n) {\n"
               "    if (atomicCAS(&e->code, 0, 1) == 0) { e->dim = dim; e->value = v; e->size = n; }\n"
               "}\n");
}

/* A kernel of several item spaces (fuse.c, merge_segments): one grid-stride
 * loop over all their items; item i runs the segment whose range holds it,
 * with that segment's extents and index names in a block of its own. */
static void render_cuda_segments(sb *b, const kn_kernel *k) {
    put_kerr(b, k);
    bool narrow = true;
    int64_t total = 0;
    for (int s = 0; s < k->nseg; s++) {
        int i0, i1, nd;
        const int64_t *ext, *mul;
        const int8_t *sym;
        kn__kernel_seg(k, s, &i0, &i1, &nd, &ext, &sym, &mul);
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= ext[d];
        total += n;
        for (int bi = 0; bi < k->nbuf; bi++) {
            if (k->buf[bi].seg != s) continue;
            int64_t o = 0;
            for (int d = 0; d < nd; d++) o += (ext[d] - 1) * (k->buf[bi].st[d] < 0 ? -k->buf[bi].st[d] : k->buf[bi].st[d]);
            narrow &= o + 1 < ((int64_t)1 << 31);
        }
    }
    narrow &= total < ((int64_t)1 << 31);
    const char *ity = narrow ? "int" : "long long";
    cuda_open(b, k);
    for (int s = 0; s < k->nseg; s++) {
        int i0, i1, nd;
        const int64_t *ext, *mul;
        const int8_t *sym;
        kn__kernel_seg(k, s, &i0, &i1, &nd, &ext, &sym, &mul);
        put(b, "    const %s n%d = 1", ity, s);
        for (int d = 0; d < nd; d++) {
            if (sym[d]) put(b, " * (%s)a.syms[%d] * %lld", ity, sym[d], (long long)mul[d]);
            else put(b, " * %lld", (long long)ext[d]);
        }
        put(b, ";\n");
    }
    put(b, "    const %s n = n0", ity);
    for (int s = 1; s < k->nseg; s++) put(b, " + n%d", s);
    put(b, ";\n");
    put_buffers(b, k, "a.");
    put(b, "    for (%s it = blockIdx.x * (%s)blockDim.x + threadIdx.x; it < n; it += (%s)gridDim.x * blockDim.x) {\n", ity, ity, ity);
    for (int s = 0; s < k->nseg; s++) {
        int i0, i1, nd;
        const int64_t *ext, *mul;
        const int8_t *sym;
        kn__kernel_seg(k, s, &i0, &i1, &nd, &ext, &sym, &mul);
        /* segment s: items [n0 + ... + n(s-1), + ns) */
        char lo[128] = "", *p = lo;
        for (int j = 0; j < s; j++) p += snprintf(p, sizeof lo - (size_t)(p - lo), " - n%d", j);
        if (s + 1 < k->nseg) {
            put(b, "        %sif (it%s < n%d) {\n", s ? "else " : "", lo, s);
        } else put(b, "        else {\n");
        put(b, "            const %s i = it%s;\n", ity, lo);
        put_extents_of(b, nd, ext, sym, mul, ity, "a.syms", "            ");
        put_item_coords(b, nd, ity, "            ");
        kidx x;
        for (int bi = 0; bi < k->nbuf; bi++) {
            if (k->buf[bi].seg == s) offset_expr(x.ix[bi], sizeof x.ix[bi], k, bi, nd, "i");
            else snprintf(x.ix[bi], sizeof x.ix[bi], "0");
            x.idx[bi] = x.ix[bi];
        }
        put_program_r(b, k, "            ", x.idx, true, i0, i1);
        put(b, "        }\n");
    }
    put(b, "    }\n}\n");
}

/* The vector loop (kn__kernel_vec): a thread loads each contiguous buffer's
 * 8 items as 16-byte words into a local array, runs the program 8 times
 * over them (the buffer names shadowed by the arrays, lane index u; a
 * broadcast buffer is read once, at the vector's first item), and stores the
 * outputs' arrays as words. Items stay with the thread that loads them, so
 * in-place writes (item over item) keep the one-item loop's order. Taken
 * when every vector buffer is 16-byte aligned (a view may start anywhere);
 * the one-item loop below it runs otherwise. */
static void put_vector_loop(sb *b, const kn_kernel *k, const char *ity) {
    int nd = k->ndim, L = nd - 1;
    bool vec[KN_KERNEL_MAXBUF];
    put(b, "    if (((0");
    for (int i = 0; i < k->nbuf; i++) {
        vec[i] = k->buf[i].st[L] == 1;
        if (vec[i]) put(b, " | (size_t)b%d", i);
    }
    put(b, ") & 15) == 0) {\n");
    put(b, "        for (%s iv = blockIdx.x * (%s)blockDim.x + threadIdx.x; iv < n / 8; iv += (%s)gridDim.x * blockDim.x) {\n",
        ity, ity, ity);
    put(b, "            const %s i = iv * 8;\n", ity);
    put_item_coords(b, nd, ity, "            ");
    kidx x;
    full_index(&x, k);
    for (int i = 0; i < k->nbuf; i++) {
        if (!vec[i]) continue;
        int words = (int)kn_dtype_get(k->buf[i].dt)->type_size / 2;   /* 16-byte words of 8 items */
        put(b, "            __align__(16) %s l%d[8];\n", ctype(k->buf[i].dt), i);
        if (k->buf[i].out) continue;
        for (int w = 0; w < words; w++)
            put(b, "            ((uint4 *)l%d)[%d] = ((const uint4 *)(b%d + %s))[%d];\n", i, w, i, x.idx[i], w);
    }
    put(b, "            {\n");
    for (int i = 0; i < k->nbuf; i++)
        if (vec[i]) put(b, "                %s%s *b%d = l%d;\n", k->buf[i].out ? "" : "const ", ctype(k->buf[i].dt), i, i);
    put(b, "                #pragma unroll\n                for (int u = 0; u < 8; u++) {\n");
    kidx lx;
    for (int i = 0; i < k->nbuf; i++) {
        if (vec[i]) snprintf(lx.ix[i], sizeof lx.ix[i], "u");
        else memcpy(lx.ix[i], x.ix[i], sizeof lx.ix[i]);
        lx.idx[i] = lx.ix[i];
    }
    put_program(b, k, "                    ", lx.idx);
    put(b, "                }\n            }\n");
    for (int i = 0; i < k->nbuf; i++) {
        if (!vec[i] || !k->buf[i].out) continue;
        int words = (int)kn_dtype_get(k->buf[i].dt)->type_size / 2;
        for (int w = 0; w < words; w++)
            put(b, "            ((uint4 *)(b%d + %s))[%d] = ((const uint4 *)l%d)[%d];\n", i, x.idx[i], w, i, w);
    }
    put(b, "        }\n        return;\n    }\n");
}

static void render_cuda(sb *b, const kn_kernel *k) {
    if (k->nseg > 1) { render_cuda_segments(b, k); return; }
    if (k->tune.unroll > 1 && !kn__kernel_indexed(k)) { render_cuda_unrolled(b, k); return; }
    put_kerr(b, k);
    int nd = k->ndim;
    const char *ity = cuda_ew_head(b, k, (int64_t)1 << 31);
    if (kn__kernel_vec(k) == 8) put_vector_loop(b, k, ity);
    put(b, "    for (%s i = blockIdx.x * (%s)blockDim.x + threadIdx.x; i < n; i += (%s)gridDim.x * blockDim.x) {\n", ity, ity, ity);
    put_item_coords(b, nd, ity, "        ");
    kidx x;
    full_index(&x, k);
    put_program(b, k, "        ", x.idx);
    put(b, "    }\n}\n");
}

/* ---- reductions: an item is one output element ---------------------------- */
static const char *red_ident(kn_op op) { return op == KN_OP_MAX ? "(-KN_INF)" : op == KN_OP_MIN ? "KN_INF" : "0"; }
/* ind acc = combine(acc, v); as a line: max and min let a NaN win, as
 * torch; any other op (sum, mean) adds */
static void put_combine(sb *b, kn_op op, const char *ind, const char *acc, const char *v) {
    if (op == KN_OP_MAX) put(b, "%s%s = (%s > %s || %s != %s) ? %s : %s;\n", ind, acc, v, acc, v, v, v, acc);
    else if (op == KN_OP_MIN) put(b, "%s%s = (%s < %s || %s != %s) ? %s : %s;\n", ind, acc, v, acc, v, v, v, acc);
    else put(b, "%s%s += %s;\n", ind, acc, v);
}
/* index names i<d> for the dims with redd == red, from an item number */
static void put_decompose(sb *b, const kn_kernel *k, bool red, const char *ity, const char *from, const char *ind) {
    int first = -1;
    for (int d = 0; d < k->ndim; d++) if (k->redd[d] == red) { first = d; break; }
    if (first < 0) return;
    put(b, "%s%s rr = %s;\n", ind, ity, from);
    for (int d = k->ndim - 1; d > first; d--)
        if (k->redd[d] == red) put(b, "%sconst %s i%d = rr %% E%d; rr /= E%d;\n", ind, ity, d, d, d);
    put(b, "%sconst %s i%d = rr;\n", ind, ity, first);
}
static void put_counts(sb *b, const kn_kernel *k, const char *ity) {
    put(b, "    const %s NOUT = 1", ity);
    for (int d = 0; d < k->ndim; d++) if (!k->redd[d]) put(b, " * E%d", d);
    put(b, ";\n    const %s RN = 1", ity);
    for (int d = 0; d < k->ndim; d++) if (k->redd[d]) put(b, " * E%d", d);
    put(b, ";\n");
}
static void put_red_store(sb *b, const kn_kernel *k, const char *ind, const char *acc) {
    char ob[256];
    offset_expr(ob, sizeof ob, k, k->red_buf, k->ndim, "i");
    if (k->red == KN_OP_MEAN) put(b, "%sb%d[%s] = %s((kn_real)(%s / (kn_acc)RN));\n", ind, k->red_buf, ob, store_fn(k->red_dt), acc);
    else put(b, "%sb%d[%s] = %s((kn_real)%s);\n", ind, k->red_buf, ob, store_fn(k->red_dt), acc);
}

/* The head of a kernel whose item is a whole reduction: C, the function,
 * extents, NOUT and RN, buffers; CUDA, the same and a shared array of nsh
 * accumulators, then the loop of blocks over items and the item's indices. */
static void c_item_head(sb *b, const kn_kernel *k) {
    put(b, "void %s(const kn_kargs *a, kn_i64 begin, kn_i64 end) {\n", k->name);
    put_extents(b, k, "kn_i64", "a->syms");
    put_counts(b, k, "kn_i64");
    put(b, "    (void)NOUT;\n");
    put_buffers(b, k, "a->");
}
static void cuda_item_head(sb *b, const kn_kernel *k, int nsh) {
    cuda_open(b, k);
    put_extents(b, k, "kn_i64", "a.syms");
    put_counts(b, k, "kn_i64");
    put_buffers(b, k, "a.");
    put(b, "    __shared__ kn_acc sh[%d];\n", nsh);
    put(b, "    for (kn_i64 o = blockIdx.x; o < NOUT; o += gridDim.x) {\n");
    put_decompose(b, k, false, "kn_i64", "o", "        ");
}

/* The block's threads combine acc: within warps, then the warps' results
 * (in thread 0's acc); ind is the indentation of the statements. */
static void put_block_combine(sb *b, const kn_kernel *k, const char *ind) {
    char i2[48], i3[48];
    snprintf(i2, sizeof i2, "%s    ", ind);
    snprintf(i3, sizeof i3, "%s        ", ind);
    put(b, "%sfor (int d = 16; d > 0; d >>= 1) { const kn_acc w = __shfl_down_sync(0xffffffffu, acc, d);\n", ind);
    put_combine(b, k->red, i2, "acc", "w");
    put(b, "%s}\n%sif ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;\n%s__syncthreads();\n", ind, ind, ind);
    put(b, "%sif (threadIdx.x < 32) {\n%sacc = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : %s;\n", ind, i2, red_ident(k->red));
    put(b, "%sfor (int d = 16; d > 0; d >>= 1) { const kn_acc w = __shfl_down_sync(0xffffffffu, acc, d);\n", i2);
    put_combine(b, k->red, i3, "acc", "w");
    put(b, "%s}\n%s}\n", i2, ind);
}

/* Slice s of the reduced elements, [s CH, min((s+1) CH, RN)), from q = s CH
 * + start in steps of step: the program at each, combined into acc. */
static void put_slice_loop(sb *b, const kn_kernel *k, const char *ind, const char *start, const char *step) {
    char i2[48];
    snprintf(i2, sizeof i2, "%s    ", ind);
    put(b, "%sconst kn_i64 q1 = (s + 1) * CH < RN ? (s + 1) * CH : RN;\n", ind);
    /* unrolled, a thread has 4 rows' loads in flight (a column sum over a
     * [8192, 768] f32 gradient ran at ~1.4 TB/s with one); the sum's order
     * is unchanged */
    put(b, "%s#pragma unroll 4\n", ind);
    put(b, "%sfor (kn_i64 q = s * CH + %s; q < q1; q += %s) {\n", ind, start, step);
    put_decompose(b, k, true, "kn_i64", "q", i2);
    kidx x;
    full_index(&x, k);
    put_program(b, k, i2, x.idx);
    char v[16];
    snprintf(v, sizeof v, "v%d", k->red_val);
    put_combine(b, k->red, i2, "acc", v);
    put(b, "%s}\n", ind);
}

/* A split reduction (kn_kernel.split = S, protocol in kiln_backend.h): an
 * item is (output o, slice s) and reduces q in [s CH, (s+1) CH); the block's
 * partial goes to scratch, and the output's last block combines the S
 * partials (each thread a fixed stride of them, then the block's fixed
 * tree: the same order every run) and stores. */
static void render_cuda_reduce_split(sb *b, const kn_kernel *k) {
    cuda_open(b, k);
    put_extents(b, k, "kn_i64", "a.syms");
    put_counts(b, k, "kn_i64");
    put_buffers(b, k, "a.");
    put(b, "    __shared__ kn_acc sh[32];\n    __shared__ int last;\n");
    put(b, "    const kn_i64 S = %d, CH = (RN + S - 1) / S;\n", k->split);
    put(b, "    kn_acc *part = (kn_acc *)a.scratch;\n");
    put(b, "    unsigned *cnt = (unsigned *)((char *)a.scratch + %zu);\n", KN_KSPLIT_CNT);
    put(b, "    for (kn_i64 os = blockIdx.x; os < NOUT * S; os += gridDim.x) {\n");
    put(b, "        const kn_i64 o = os / S, s = os %% S;\n");
    put_decompose(b, k, false, "kn_i64", "o", "        ");
    put(b, "        kn_acc acc = %s;\n", red_ident(k->red));
    put_slice_loop(b, k, "        ", "threadIdx.x", "blockDim.x");
    put_block_combine(b, k, "        ");
    /* publish the partial, then count: the fence orders the two for the
     * block that sees the count complete */
    put(b, "        if (threadIdx.x == 0) {\n            part[o * S + s] = acc;\n            __threadfence();\n");
    put(b, "            last = atomicAdd(&cnt[o], 1u) == (unsigned)(S - 1);\n        }\n        __syncthreads();\n");
    put(b, "        if (last) {\n            __threadfence();\n            acc = %s;\n", red_ident(k->red));
    put(b, "            for (kn_i64 j = threadIdx.x; j < S; j += blockDim.x) {\n                const kn_acc w = __ldcg(&part[o * S + j]);\n");
    put_combine(b, k->red, "                ", "acc", "w");
    put(b, "            }\n            __syncthreads();\n");
    put_block_combine(b, k, "            ");
    put(b, "            if (threadIdx.x == 0) {\n");
    put_red_store(b, k, "                ", "acc");
    put(b, "                cnt[o] = 0;\n            }\n        }\n        __syncthreads();\n    }\n}\n");
}

/* Column templates: the kept coordinates before the last dim, i<d>, from
 * rr (the run of the last dim an item lies in), at the item loop's indent */
static void put_kept_rows(sb *b, const kn_kernel *k) {
    int last = k->ndim - 1, first = -1;
    for (int d = 0; d < last; d++) if (!k->redd[d]) { first = d; break; }
    for (int d = last - 1; d >= 0; d--) {
        if (k->redd[d]) continue;
        if (d > first) put(b, "        const kn_i64 i%d = rr %% E%d; rr /= E%d;\n", d, d, d);
        else put(b, "        const kn_i64 i%d = rr;\n", d);
    }
    if (first < 0) put(b, "        (void)rr;\n");
}

/* A reduction that keeps the last dim (column sums: bias and norm-weight
 * gradients), CUDA (kn_kernel.cols): an item is a tile of 32 consecutive
 * columns of one run of the last dim (and a slice of the rows, with split).
 * Lane l of each warp takes column j0 + l, so a warp reads 32 neighbours;
 * the block's W warps take every W-th row of the slice; the warps' partials
 * are combined in warp order through shared memory. Split: lane l of warp 0
 * writes its column's partial, the tile's last block (a counter per tile)
 * combines the slices in order, as render_cuda_reduce_split does. */
static void render_cuda_reduce_cols(sb *b, const kn_kernel *k) {
    int last = k->ndim - 1, S = k->split > 1 ? k->split : 1;
    cuda_open(b, k);
    put_extents(b, k, "kn_i64", "a.syms");
    put_counts(b, k, "kn_i64");
    put_buffers(b, k, "a.");
    put(b, "    __shared__ kn_acc sh[32][33];\n");
    if (S > 1) put(b, "    __shared__ int last;\n    kn_acc *part = (kn_acc *)a.scratch;\n"
                      "    unsigned *cnt = (unsigned *)((char *)a.scratch + %zu);\n", KN_KSPLIT_CNT);
    put(b, "    const kn_i64 S = %d, CH = (RN + S - 1) / S, TPR = (E%d + 31) / 32, NT = NOUT / E%d * TPR;\n", S, last, last);
    put(b, "    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, W = blockDim.x >> 5;\n");
    put(b, "    for (kn_i64 ts = blockIdx.x; ts < NT * S; ts += gridDim.x) {\n");
    put(b, "        const kn_i64 t = ts / S, s = ts %% S;\n");
    put(b, "        kn_i64 rr = t / TPR;\n        const kn_i64 i%d = (t - rr * TPR) * 32 + lane;\n", last);
    put_kept_rows(b, k);
    put(b, "        kn_acc acc = %s;\n", red_ident(k->red));
    put(b, "        if (i%d < E%d) {\n", last, last);
    put_slice_loop(b, k, "            ", "wp", "W");
    put(b, "        }\n");
    put(b, "        sh[wp][lane] = acc;\n        __syncthreads();\n");
    put(b, "        if (wp == 0) {\n            for (int w = 1; w < W; w++) {\n                const kn_acc u = sh[w][lane];\n");
    put_combine(b, k->red, "                ", "acc", "u");
    put(b, "            }\n");
    if (S == 1) {
        put(b, "            if (i%d < E%d) {\n", last, last);
        put_red_store(b, k, "                ", "acc");
        put(b, "            }\n        }\n        __syncthreads();\n    }\n}\n");
        return;
    }
    /* the output's number: its kept coordinates, row-major */
    put(b, "            const kn_i64 o = t / TPR * E%d + i%d;\n", last, last);
    put(b, "            if (i%d < E%d) part[o * S + s] = acc;\n            __threadfence();\n            __syncwarp();\n", last, last);
    put(b, "            if (lane == 0) last = atomicAdd(&cnt[t], 1u) == (unsigned)(S - 1);\n        }\n        __syncthreads();\n");
    put(b, "        if (last && wp == 0) {\n            __threadfence();\n");
    put(b, "            if (i%d < E%d) {\n                const kn_i64 o = t / TPR * E%d + i%d;\n                acc = %s;\n", last, last, last,
        last, red_ident(k->red));
    put(b, "                for (kn_i64 j = 0; j < S; j++) {\n                    const kn_acc u = __ldcg(&part[o * S + j]);\n");
    put_combine(b, k->red, "                    ", "acc", "u");
    put(b, "                }\n");
    put_red_store(b, k, "                ", "acc");
    put(b, "            }\n            if (lane == 0) cnt[t] = 0;\n        }\n        __syncthreads();\n    }\n}\n");
}

static void render_cuda_reduce(sb *b, const kn_kernel *k) {
    put(b, "typedef kn_real kn_acc;\n");
    if (k->cols) { render_cuda_reduce_cols(b, k); return; }
    if (k->split > 1) { render_cuda_reduce_split(b, k); return; }
    cuda_item_head(b, k, 32);
    put(b, "        kn_acc acc = %s;\n", red_ident(k->red));
    put(b, "#pragma unroll 4\n");   /* loads in flight, as put_slice_loop */
    put(b, "        for (kn_i64 q = threadIdx.x; q < RN; q += blockDim.x) {\n");
    put_decompose(b, k, true, "kn_i64", "q", "            ");
    kidx x;
    full_index(&x, k);
    put_program(b, k, "            ", x.idx);
    char v[16];
    snprintf(v, sizeof v, "v%d", k->red_val);
    put_combine(b, k->red, "            ", "acc", v);
    put(b, "        }\n");
    /* the block's threads combine: within warps, then the warps' results */
    put(b, "        for (int s = 16; s > 0; s >>= 1) { const kn_acc w = __shfl_down_sync(0xffffffffu, acc, s);\n");
    put_combine(b, k->red, "            ", "acc", "w");
    put(b, "        }\n        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;\n        __syncthreads();\n");
    put(b, "        if (threadIdx.x < 32) {\n            acc = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : %s;\n", red_ident(k->red));
    put(b, "            for (int s = 16; s > 0; s >>= 1) { const kn_acc w = __shfl_down_sync(0xffffffffu, acc, s);\n");
    put_combine(b, k->red, "                ", "acc", "w");
    put(b, "            }\n            if (threadIdx.x == 0) {\n");
    put_red_store(b, k, "                ", "acc");
    put(b, "            }\n        }\n        __syncthreads();\n    }\n}\n");
}

/* ---- row normalisations: an item is one row -------------------------------
 * rms_norm:    y = v / sqrt(mean(v^2) + eps) * w
 * layer_norm:  y = (v - mean) / sqrt(mean((v - mean)^2) + eps) * w + b
 * softmax:     y = exp(v - max) / sum(exp(v - max));  log_softmax: v - max - log(sum)
 * (v: the group's value at the element, recomputed in each pass; the group's
 * stored values are written in the first pass). Passes: rms 2, others 3. */
typedef struct {
    const kn_kernel *k;
    bool cuda;
    const char *ind;          /* indentation of the pass loops */
    const char *ity;
    kidx x;                   /* every buffer's offset at the element */
    int K;                    /* CUDA: a thread's K elements of the row kept in registers (vc[]); 0: none */
    int blk;                  /* CUDA: threads per block (the stride between a thread's elements) */
    int full;                 /* CUDA, K > 0: the first `full` of the K elements are in the row for every thread (RN / blk) */
    bool defer;               /* CUDA, K > 0: the first pass's stores wait in st<i>[K] for a loop of their own */
} rn_ctx;

/* Opens a loop over a thread's K elements of the row (q = threadIdx.x +
 * kk * block) and the bounds test, the element's coordinates decomposed;
 * the caller closes both. The test is on the last element only, where the
 * block does not divide the row (kk < full folds once kk is unrolled): a
 * test on every one took a predicate register each, and with seven of them
 * nvcc issued the loads two at a time, each pair a round trip to memory
 * (an add + RMS norm of [512, 4096] at 1.6 TB/s). */
static void rn_kk_open(sb *b, rn_ctx *c, const char *in2, const char *in3) {
    put(b, "%s#pragma unroll\n%sfor (int kk = 0; kk < %d; kk++) {\n", c->ind, c->ind, c->K);
    put(b, "%sconst kn_i64 q = threadIdx.x + (kn_i64)kk * %d;\n", in2, c->blk);
    if (c->full >= c->K) put(b, "%s{\n", in2);
    else put(b, "%sif (kk < %d || q < RN) {\n", in2, c->full);
    put_decompose(b, c->k, true, c->ity, "q", in3);
}

/* The stores of the cached first pass, after it: a store among its loads
 * may alias the next load for all nvcc knows, so each of a thread's K
 * elements would cost a round trip to memory in turn (a [1, 4096] add + RMS
 * norm: 15 us; the hand kernels' pair: 8) */
static void rn_deferred_stores(sb *b, rn_ctx *c, const char *in2, const char *in3) {
    const kn_kernel *k = c->k;
    rn_kk_open(b, c, in2, in3);
    for (int i = 0; i < k->ninst; i++)
        if (k->inst[i].kind == KN_KI_STORE)
            put(b, "%sb%d[%s] = %s(st%d[kk]);\n", in3, k->inst[i].buf, c->x.idx[k->inst[i].buf], store_fn(k->inst[i].dt), i);
    put(b, "%s}\n%s}\n", in2, c->ind);
}

/* CUDA with a register row: for each of the thread's K elements of the row
 * the first pass computes the group's value and keeps it in vc[kk]; later
 * passes read vc[kk] as the value (no load, no recomputation). Opens the
 * loop and the bounds test; the caller closes both. */
static void rn_cached_open(sb *b, rn_ctx *c, bool first, const char *in2, const char *in3) {
    rn_kk_open(b, c, in2, in3);
    if (first) {
        put_program_s(b, c->k, in3, c->x.idx, c->defer ? PUT_DEFER : PUT_STORE);
        put(b, "%svc[kk] = v%d;\n", in3, c->k->red_val);
    } else {
        put(b, "%sconst kn_real v%d = vc[kk];\n", in3, c->k->red_val);
    }
}

#define RN_LANES 16

/* One pass over the row, accumulating expr (over the program's values) into
 * the scalar acc (declared by the caller, holding the identity). C: RN_LANES
 * partial accumulators, one per position in a block of the row, so the
 * compiler vectorises the pass (a single accumulator is a serial chain it may
 * not reorder); they are combined in order at the end. CUDA: each thread
 * strides over the row; the caller combines the threads. */
static void rn_accum_pre(sb *b, rn_ctx *c, bool stores, const char *acc, kn_op kind, const char *ident, const char *expr,
                         const char *pre);
static void rn_accum(sb *b, rn_ctx *c, bool stores, const char *acc, kn_op kind, const char *ident, const char *expr) {
    rn_accum_pre(b, c, stores, acc, kind, ident, expr, NULL);
}
/* the same, with the statement pre before each combine (it may define what expr uses) */
static void rn_accum_pre(sb *b, rn_ctx *c, bool stores, const char *acc, kn_op kind, const char *ident, const char *expr,
                         const char *pre) {
    const char *ind = c->ind;
    char in2[40], in3[40], lane[48];
    snprintf(in2, sizeof in2, "%s    ", ind);
    snprintf(in3, sizeof in3, "%s        ", ind);
    if (c->cuda && c->K) {
        rn_cached_open(b, c, stores, in2, in3);
        if (pre) put(b, "%s%s\n", in3, pre);
        put_combine(b, kind, in3, acc, expr);
        put(b, "%s}\n%s}\n", in2, ind);
        if (stores && c->defer) rn_deferred_stores(b, c, in2, in3);
        return;
    }
    if (c->cuda) {
        put(b, "%sfor (kn_i64 q = threadIdx.x; q < RN; q += blockDim.x) {\n", ind);
        put_decompose(b, c->k, true, c->ity, "q", in2);
        put_program_s(b, c->k, in2, c->x.idx, stores);
        if (pre) put(b, "%s%s\n", in2, pre);
        put_combine(b, kind, in2, acc, expr);
        put(b, "%s}\n", ind);
        return;
    }
    put(b, "%s{\n%s    kn_acc %s_l[%d];\n", ind, ind, acc, RN_LANES);
    put(b, "%s    for (int l = 0; l < %d; l++) %s_l[l] = %s;\n", ind, RN_LANES, acc, ident);
    put(b, "%s    kn_i64 q0 = 0;\n", ind);
    char in4[48];
    snprintf(in4, sizeof in4, "%s        ", ind);
    snprintf(lane, sizeof lane, "%s_l[l]", acc);
    /* whole blocks (a constant trip count: one vector step), then the rest */
    for (int part = 0; part < 2; part++) {
        if (part == 0) put(b, "%s    for (; q0 + %d <= RN; q0 += %d) for (int l = 0; l < %d; l++) {\n", ind, RN_LANES, RN_LANES, RN_LANES);
        else put(b, "%s    for (int l = 0; q0 + l < RN; l++) {\n", ind);
        put(b, "%sconst kn_i64 q = q0 + l;\n", in4);
        put_decompose(b, c->k, true, c->ity, "q", in4);
        put_program_s(b, c->k, in4, c->x.idx, stores);
        if (pre) put(b, "%s%s\n", in4, pre);
        put_combine(b, kind, in4, lane, expr);
        put(b, "%s    }\n", ind);
    }
    put(b, "%s    for (int l = 0; l < %d; l++) ", ind, RN_LANES);
    put_combine(b, kind, "", acc, lane);
    put(b, "%s}\n", ind);
    (void)in3;
}

/* The last pass: the row's output, value (an expression of the element's
 * value v<red_val>), stored at every element. */
static void rn_write(sb *b, rn_ctx *c, const char *value) {
    const kn_kernel *k = c->k;
    const char *ind = c->ind;
    char in2[40], in3[48];
    snprintf(in2, sizeof in2, "%s    ", ind);
    snprintf(in3, sizeof in3, "%s        ", ind);
    if (c->cuda && c->K) {   /* the outputs into vc[], then their stores (loads first, as rn_deferred_stores) */
        rn_cached_open(b, c, false, in2, in3);
        put(b, "%svc[kk] = %s;\n%s}\n%s}\n", in3, value, in2, ind);
        rn_kk_open(b, c, in2, in3);
        put(b, "%sb%d[%s] = %s(vc[kk]);\n%s}\n%s}\n", in3, k->red_buf, c->x.idx[k->red_buf], store_fn(k->red_dt), in2, ind);
        return;
    }
    if (c->cuda) put(b, "%sfor (kn_i64 q = threadIdx.x; q < RN; q += blockDim.x) {\n", ind);
    else put(b, "%sfor (kn_i64 q = 0; q < RN; q++) {\n", ind);
    put_decompose(b, k, true, c->ity, "q", in2);
    put_program_s(b, k, in2, c->x.idx, false);
    put(b, "%sb%d[%s] = %s(%s);\n%s}\n", in2, k->red_buf, c->x.idx[k->red_buf], store_fn(k->red_dt), value, ind);
}

/* stmt at every element of the row, without the program (a pass over the output) */
static void rn_over_out(sb *b, rn_ctx *c, const char *stmt) {
    const char *ind = c->ind;
    char in2[40];
    snprintf(in2, sizeof in2, "%s    ", ind);
    if (c->cuda) put(b, "%sfor (kn_i64 q = threadIdx.x; q < RN; q += blockDim.x) {\n", ind);
    else put(b, "%sfor (kn_i64 q = 0; q < RN; q++) {\n", ind);
    put_decompose(b, c->k, true, c->ity, "q", in2);
    put(b, "%s%s\n%s}\n", in2, stmt, ind);
}

/* the statistics and the write; in CUDA the threads' partials are combined
 * by kn_bsum / kn_bmax (every thread gets the row's value) */
static void rn_body(sb *b, rn_ctx *c) {
    const kn_kernel *k = c->k;
    const char *sum = c->cuda ? "kn_bsum" : "", *max = c->cuda ? "kn_bmax" : "", *shp = c->cuda ? ", sh" : "";
    char st[320], v[16], e[96];
    snprintf(v, sizeof v, "v%d", k->red_val);
    char w[128] = "", bb[128] = "";
    if (k->norm_w >= 0) snprintf(w, sizeof w, " * %s(b%d[%s])", load_fn(k->buf[k->norm_w].dt), k->norm_w, c->x.idx[k->norm_w]);
    if (k->norm_b >= 0) snprintf(bb, sizeof bb, " + %s(b%d[%s])", load_fn(k->buf[k->norm_b].dt), k->norm_b, c->x.idx[k->norm_b]);
    const char *ind = c->ind;
    switch (k->red) {
    case KN_OP_RMS_NORM:
        put(b, "%skn_acc s1 = 0;\n", ind);
        snprintf(e, sizeof e, "(kn_acc)%s * (kn_acc)%s", v, v);
        rn_accum(b, c, true, "s1", KN_OP_SUM, "0", e);
        if (c->cuda) put(b, "%ss1 = %s(s1%s);\n", ind, sum, shp);
        put(b, "%sconst kn_real rs = (kn_real)(1 / KN_SQRT_ACC(s1 / (kn_acc)RN + (kn_acc)%a));\n", ind, k->eps);
        snprintf(st, sizeof st, "(kn_real)(%s * rs)%s", v, w);
        rn_write(b, c, st);
        break;
    case KN_OP_LAYER_NORM:
        put(b, "%skn_acc s1 = 0;\n", ind);
        snprintf(e, sizeof e, "(kn_acc)%s", v);
        rn_accum(b, c, true, "s1", KN_OP_SUM, "0", e);
        if (c->cuda) put(b, "%ss1 = %s(s1%s);\n", ind, sum, shp);
        put(b, "%sconst kn_acc mean = s1 / (kn_acc)RN;\n%skn_acc s2 = 0;\n", ind, ind);
        snprintf(e, sizeof e, "((kn_acc)%s - mean) * ((kn_acc)%s - mean)", v, v);
        rn_accum(b, c, false, "s2", KN_OP_SUM, "0", e);
        if (c->cuda) put(b, "%ss2 = %s(s2%s);\n", ind, sum, shp);
        put(b, "%sconst kn_acc rs = 1 / KN_SQRT_ACC(s2 / (kn_acc)RN + (kn_acc)%a);\n", ind, k->eps);
        snprintf(st, sizeof st, "(kn_real)(((kn_acc)%s - mean) * rs)%s%s", v, w, bb);
        rn_write(b, c, st);
        break;
    default: {   /* softmax, log_softmax */
        bool lg = k->red == KN_OP_LOG_SOFTMAX;
        put(b, "%skn_acc m = -KN_INF;\n", ind);
        snprintf(e, sizeof e, "(kn_acc)%s", v);
        rn_accum(b, c, true, "m", KN_OP_MAX, "-KN_INF", e);
        if (c->cuda) put(b, "%sm = %s(m%s);\n", ind, max, shp);
        put(b, "%skn_acc s2 = 0;\n", ind);
        if (!lg && k->red_dt == KN_F32 && !k->f64) {
            /* exp once: written to the output with the sum, then scaled by 1/sum
             * (the output is f32, so nothing is rounded in between) */
            char pre[256];
            snprintf(pre, sizeof pre, "const kn_real ex = KN_EXP(%s - (kn_real)m); b%d[%s] = ex;", v, k->red_buf, c->x.idx[k->red_buf]);
            rn_accum_pre(b, c, false, "s2", KN_OP_SUM, "0", "(kn_acc)ex", pre);
            if (c->cuda) put(b, "%ss2 = %s(s2%s);\n", ind, sum, shp);
            put(b, "%sconst kn_real is = (kn_real)(1 / s2);\n", ind);
            snprintf(st, sizeof st, "b%d[%s] *= is;", k->red_buf, c->x.idx[k->red_buf]);
            rn_over_out(b, c, st);
            break;
        }
        snprintf(e, sizeof e, "(kn_acc)KN_EXP((kn_real)((kn_acc)%s - m))", v);
        rn_accum(b, c, false, "s2", KN_OP_SUM, "0", e);
        if (c->cuda) put(b, "%ss2 = %s(s2%s);\n", ind, sum, shp);
        if (lg) {
            put(b, "%sconst kn_acc ls = KN_LOG_ACC(s2);\n", ind);
            snprintf(st, sizeof st, "(kn_real)((kn_acc)%s - m - ls)", v);
        } else {
            put(b, "%sconst kn_real is = (kn_real)(1 / s2);\n", ind);
            snprintf(st, sizeof st, "KN_EXP((kn_real)((kn_acc)%s - m)) * is", v);
        }
        rn_write(b, c, st);
        break;
    }
    }
}

/* A reduction that keeps the last dim (column sums): tiles of up to 256
 * consecutive items (columns) of one run of the last dim; for each reduced
 * element (row) one pass over the tile's columns, which the compiler
 * vectorises (the tile's partials in an array). */
static void render_c_reduce_cols(sb *b, const kn_kernel *k) {
    int last = k->ndim - 1;
    put(b, "typedef double kn_acc;\n");
    c_item_head(b, k);
    put(b, "    kn_acc acc[256];\n");
    put(b, "    for (kn_i64 o0 = begin; o0 < end;) {\n");
    put(b, "        kn_i64 rr = o0 / E%d;\n        const kn_i64 j0 = o0 - rr * E%d;\n", last, last);
    put(b, "        kn_i64 nt = E%d - j0;\n        if (nt > end - o0) nt = end - o0;\n        if (nt > 256) nt = 256;\n", last);
    put_kept_rows(b, k);
    put(b, "        for (kn_i64 l = 0; l < nt; l++) acc[l] = %s;\n", red_ident(k->red));
    put(b, "        for (kn_i64 q = 0; q < RN; q++) {\n");
    put_decompose(b, k, true, "kn_i64", "q", "            ");
    put(b, "            for (kn_i64 l = 0; l < nt; l++) {\n                const kn_i64 i%d = j0 + l;\n", last);
    kidx x;
    full_index(&x, k);
    put_program(b, k, "                ", x.idx);
    char v[16];
    snprintf(v, sizeof v, "(kn_acc)v%d", k->red_val);
    put_combine(b, k->red, "                ", "acc[l]", v);
    put(b, "            }\n        }\n");
    put(b, "        for (kn_i64 l = 0; l < nt; l++) {\n            const kn_i64 i%d = j0 + l;\n", last);
    put_red_store(b, k, "            ", "acc[l]");
    put(b, "        }\n        o0 += nt;\n    }\n}\n");
}

static void render_c_reduce(sb *b, const kn_kernel *k) {
    if (k->ndim > 0 && !k->redd[k->ndim - 1]) { render_c_reduce_cols(b, k); return; }
    put(b, "typedef double kn_acc;\n");   /* sums of float in double: one rounding at the end */
    c_item_head(b, k);
    put(b, "    for (kn_i64 o = begin; o < end; o++) {\n");
    put_decompose(b, k, false, "kn_i64", "o", "        ");
    put(b, "        kn_acc acc = %s;\n", red_ident(k->red));
    rn_ctx c = {k, false, "        ", "kn_i64", {{{0}}, {0}}, 0, 0};
    full_index(&c.x, k);
    char v[16];
    snprintf(v, sizeof v, "(kn_acc)v%d", k->red_val);
    rn_accum(b, &c, true, "acc", k->red, red_ident(k->red), v);
    put_red_store(b, k, "        ", "acc");
    put(b, "    }\n}\n");
}

static void render_c_rownorm(sb *b, const kn_kernel *k) {
    put(b, "typedef double kn_acc;\n#define KN_SQRT_ACC(v) sqrt(v)\n#define KN_LOG_ACC(v) log(v)\n");
    c_item_head(b, k);
    put(b, "    for (kn_i64 o = begin; o < end; o++) {\n");
    put_decompose(b, k, false, "kn_i64", "o", "        ");
    rn_ctx c = {k, false, "        ", "kn_i64", {{{0}}, {0}}, 0, 0};
    full_index(&c.x, k);
    rn_body(b, &c);
    put(b, "    }\n}\n");
}

/* block-wide sum and max (NaN wins) of every thread's partial, returned to
 * all threads; blockDim.x a multiple of 32, at most 1024 */
static const char cuda_block_reduce[] =
    "KN_FN kn_acc kn_bsum(kn_acc v, kn_acc *sh) {\n"
    "    for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xffffffffu, v, s);\n"
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x < 32) {\n"
    "        v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : (kn_acc)0;\n"
    "        for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xffffffffu, v, s);\n"
    "        if (threadIdx.x == 0) sh[32] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    v = sh[32];\n"
    "    __syncthreads();\n"
    "    return v;\n"
    "}\n"
    "KN_FN kn_acc kn_bmax(kn_acc v, kn_acc *sh) {\n"
    "    for (int s = 16; s > 0; s >>= 1) { kn_acc w = __shfl_down_sync(0xffffffffu, v, s); v = (w > v || w != w) ? w : v; }\n"
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x < 32) {\n"
    "        v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : -KN_INF;\n"
    "        for (int s = 16; s > 0; s >>= 1) { kn_acc w = __shfl_down_sync(0xffffffffu, v, s); v = (w > v || w != w) ? w : v; }\n"
    "        if (threadIdx.x == 0) sh[32] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    v = sh[32];\n"
    "    __syncthreads();\n"
    "    return v;\n"
    "}\n";

static void render_cuda_rownorm(sb *b, const kn_kernel *k) {
    put(b, "typedef kn_real kn_acc;\n#define KN_SQRT_ACC(v) KN_SQRT(v)\n#define KN_LOG_ACC(v) KN_LOG(v)\n%s", cuda_block_reduce);
    cuda_item_head(b, k, 33);
    rn_ctx c = {k, true, "        ", "kn_i64", {{{0}}, {0}}, 0, 0};
    full_index(&c.x, k);
    /* a row of static length up to 16 elements a thread stays in registers
     * between the passes (one read of the operands instead of one per pass) */
    int64_t rn = 1;
    bool fixed = true;
    for (int d = 0; d < k->ndim; d++) if (k->redd[d]) { rn *= k->ext[d]; fixed &= !k->sym[d]; }
    /* the block the launch uses (kernel search may choose it): it is in the
     * source here, as the stride between a thread's elements */
    int blk = kn__ktune_resolve(k, &k->tune).block;
    int64_t K = blk > 0 ? (rn + blk - 1) / blk : 0;
    if (fixed && K >= 1 && K <= 16) {
        c.K = (int)K;
        c.blk = blk;
        c.full = (int)(rn / blk);
        put(b, "        kn_real vc[%d];\n", c.K);
        /* at most 2 stored values: 2 K more registers */
        int nst = 0;
        for (int i = 0; i < k->ninst; i++) nst += k->inst[i].kind == KN_KI_STORE;
        if (K > 1 && nst >= 1 && nst <= 2) {
            c.defer = true;
            for (int i = 0; i < k->ninst; i++)
                if (k->inst[i].kind == KN_KI_STORE) put(b, "        kn_real st%d[%d];\n", i, c.K);
        }
    }
    rn_body(b, &c);
    put(b, "    }\n}\n");
}

static void render_all(sb *b, const dialect *d, const kn_kernel *k) {
    put(b, "/* kiln generated kernel %s (%s): %d dims, %d buffers, %d instructions */\n", k->name, d->lang, k->ndim, k->nbuf, k->ninst);
    put(b, d->prelude, KN_KERNEL_MAXBUF);
    put_vocabulary(b, k->f64, d->rint, !d->cuda);
    put(b, "%s", shared_prelude);
    op_functions(b, k);
    if (d->cuda) put_rope_tables(b, k);
    if (kn__is_rownorm(k->red)) {
        if (d->cuda) render_cuda_rownorm(b, k);
        else render_c_rownorm(b, k);
    } else if (k->red != KN_OP_NONE) {
        if (d->cuda) render_cuda_reduce(b, k);
        else render_c_reduce(b, k);
    } else if (d->cuda) render_cuda(b, k);
    else render_c(b, k);
}

static const dialect g_dialects[] = {
    {"c", c_prelude, "nearbyint", false},
    {"cuda", cuda_prelude, "rint", true},
};

int kn__render(const char *lang, kn_kernel *k, char *buf, size_t cap) {
    const dialect *d = NULL;
    for (size_t i = 0; i < sizeof g_dialects / sizeof g_dialects[0]; i++)
        if (lang && !strcmp(lang, g_dialects[i].lang)) d = &g_dialects[i];
    if (!d || !cap) return -1;
    if (!d->cuda && (kn__kernel_indexed(k) || k->nseg > 1)) return -1;   /* rope, scatter, segments: CUDA only (fuse.c) */
    kn_kernel kk = *k;
    if (kk.ndim == 0) { kk.ndim = 1; kk.ext[0] = 1; kk.sym[0] = 0; kk.mul[0] = 1; kk.redd[0] = kk.red != KN_OP_NONE; for (int i = 0; i < kk.nbuf; i++) kk.buf[i].st[0] = 0; }
    /* the name is a hash of the source written with a placeholder name */
    snprintf(kk.name, sizeof kk.name, "kn_k");
    sb b = {buf, 0, cap, false};
    render_all(&b, d, &kk);
    if (b.over) return -1;
    snprintf(k->name, sizeof k->name, "kn_k%016llx", (unsigned long long)kn__fnv1a(buf, b.n));
    memcpy(kk.name, k->name, sizeof kk.name);
    b = (sb){buf, 0, cap, false};
    render_all(&b, d, &kk);
    return b.over ? -1 : (int)b.n;
}
