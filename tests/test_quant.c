/* test_quant.c: GGUF block types (src/backends/quant/quant.h).
 *
 * - layout: struct sizes against the dtype table, and hand-decoded known blocks
 *   for every type (catches a layout that merely round-trips with itself);
 * - round trip: dequantize(quantize(x)) within a per-type error bound;
 * - dots: every path this CPU can run (scalar, AVX2, AVX-512) against
 *   dequantize-both-then-sum-in-double, on quantized and raw random blocks,
 *   and against the f32 activation within the activation-quantization bound;
 * - matvec_rows against per-row vec_dot with odd row ranges and strides;
 * - Q16 (16-bit) activations: quantizer bounds, every dot against the same
 *   double reference and the f32-activation bound;
 * - bad arguments give a status / NaN and a message, not a crash.
 */
#include "kn_test.h"
#include "backends/quant/quant.h"
#include "core/cpu.h"
#include "core/fp16.h"

static const kn_dtype QTYPES[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q8_1,
                                  KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_Q8_K};
#define NQ (int)(sizeof QTYPES / sizeof QTYPES[0])
static const kn_dtype DOTTYPES[] = {KN_F32, KN_F16, KN_BF16, KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1,
                                    KN_Q8_0, KN_Q8_1, KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_Q8_K};
#define ND (int)(sizeof DOTTYPES / sizeof DOTTYPES[0])

static int64_t bsize(kn_dtype t) { return kn_dtype_get(t)->block_size; }
static size_t tsize(kn_dtype t) { return kn_dtype_get(t)->type_size; }

/* ---- layout --------------------------------------------------------------- */

TEST(layout_sizes_match_dtype_table) {
    struct { kn_dtype t; size_t sz; int64_t bs; } L[] = {
        {KN_Q4_0, sizeof(kn_block_q4_0), 32}, {KN_Q4_1, sizeof(kn_block_q4_1), 32},
        {KN_Q5_0, sizeof(kn_block_q5_0), 32}, {KN_Q5_1, sizeof(kn_block_q5_1), 32},
        {KN_Q8_0, sizeof(kn_block_q8_0), 32}, {KN_Q8_1, sizeof(kn_block_q8_1), 32},
        {KN_Q4_K, sizeof(kn_block_q4_K), 256}, {KN_Q5_K, sizeof(kn_block_q5_K), 256},
        {KN_Q6_K, sizeof(kn_block_q6_K), 256}, {KN_Q8_K, sizeof(kn_block_q8_K), 256},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        const kn_dtype_info *d = kn_dtype_get(L[i].t);
        REQUIRE(d, "no dtype info for %d", (int)L[i].t);
        CHECK(d->type_size == L[i].sz, "%s: table says %zu bytes, struct is %zu", d->name, d->type_size, L[i].sz);
        CHECK(d->block_size == L[i].bs, "%s: block size %lld", d->name, (long long)d->block_size);
        CHECK(d->is_quant, "%s not marked quantized", d->name);
    }
    /* field offsets as in the GGUF layouts */
    CHECK(offsetof(kn_block_q5_1, qh) == 4 && offsetof(kn_block_q5_1, qs) == 8, "q5_1 offsets");
    CHECK(offsetof(kn_block_q4_K, scales) == 4 && offsetof(kn_block_q4_K, qs) == 16, "q4_K offsets");
    CHECK(offsetof(kn_block_q5_K, qh) == 16 && offsetof(kn_block_q5_K, qs) == 48, "q5_K offsets");
    CHECK(offsetof(kn_block_q6_K, qh) == 128 && offsetof(kn_block_q6_K, scales) == 192 &&
          offsetof(kn_block_q6_K, d) == 208, "q6_K offsets");
    CHECK(offsetof(kn_block_q8_K, qs) == 4 && offsetof(kn_block_q8_K, bsums) == 260, "q8_K offsets");
}

#define H1 0x3c00   /* fp16 1.0 */
#define H2 0x4000   /* fp16 2.0 */
#define HHALF 0x3800 /* fp16 0.5 */

TEST(layout_known_blocks_32) {
    float y[32];
    { kn_block_q4_0 b = {H2, {0}}; b.qs[0] = 0x21; b.qs[15] = 0xf0;
      REQUIRE(kn_dequantize_row(KN_Q4_0, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[0] == 2 * (1 - 8) && y[16] == 2 * (2 - 8), "q4_0 nibble order: %g %g", y[0], y[16]);
      CHECK(y[15] == -16 && y[31] == 2 * 7 && y[1] == -16, "q4_0: %g %g %g", y[15], y[31], y[1]); }
    { kn_block_q4_1 b = {H2, HHALF, {0}}; b.qs[3] = 0x5a;
      REQUIRE(kn_dequantize_row(KN_Q4_1, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[3] == 2 * 10 + 0.5f && y[19] == 2 * 5 + 0.5f && y[0] == 0.5f, "q4_1: %g %g %g", y[3], y[19], y[0]); }
    { kn_block_q5_0 b = {H1, {0x01, 0x00, 0x02, 0x80}, {0}}; b.qs[0] = 0x13; b.qs[1] = 0x04; b.qs[15] = 0x70;
      /* qh = 0x80020001: bits 0, 17, 31 set */
      REQUIRE(kn_dequantize_row(KN_Q5_0, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[0] == 3, "q5_0 e0 (bit 0 set): %g", y[0]);
      CHECK(y[16] == 1 - 16, "q5_0 e16 (bit 16 clear): %g", y[16]);
      CHECK(y[17] == 0 + 16 - 16, "q5_0 e17 (bit 17 set): %g", y[17]);
      CHECK(y[1] == 4 - 16 && y[31] == 7, "q5_0: %g %g", y[1], y[31]); }
    { kn_block_q5_1 b = {H1, H1, {0x00, 0x00, 0x01, 0x00}, {0}}; b.qs[0] = 0x32;
      REQUIRE(kn_dequantize_row(KN_Q5_1, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[0] == 2 + 1 && y[16] == 3 + 16 + 1, "q5_1: %g %g", y[0], y[16]); }
    { kn_block_q8_0 b = {HHALF, {0}}; b.qs[0] = -128; b.qs[31] = 127;
      REQUIRE(kn_dequantize_row(KN_Q8_0, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[0] == -64 && y[31] == 63.5f, "q8_0: %g %g", y[0], y[31]); }
    { kn_block_q8_1 b = {H2, 0, {0}}; b.qs[5] = -3;
      REQUIRE(kn_dequantize_row(KN_Q8_1, &b, y, 32) == KN_OK, "%s", kn_last_error());
      CHECK(y[5] == -6 && y[4] == 0, "q8_1: %g", y[5]); }
}

TEST(layout_known_blocks_K) {
    static float y[256];
    {   /* Q4_K: sub-block 1 (elements 32..63, high nibbles of qs[0..31]), sub-block 5 (j >= 4 packing) */
        kn_block_q4_K b; memset(&b, 0, sizeof b);
        b.d = H1; b.dmin = HHALF;
        b.scales[1] = 3 | (2 << 6);      /* sc1 = 3; high bits of sc5 = 2 */
        b.scales[5] = 7 | (1 << 6);      /* m1 = 7;  high bits of m5 = 1  */
        b.scales[9] = 0x54;              /* sc5 low = 4, m5 low = 5       */
        b.qs[0] = 0x90;                  /* e0: 0, e32: 9 */
        b.qs[64 + 2] = 0xa0;             /* chunk 2: e128+2 (sub-block 4, low), e160+2 (sub-block 5, high = 10) */
        REQUIRE(kn_dequantize_row(KN_Q4_K, &b, y, 256) == KN_OK, "%s", kn_last_error());
        CHECK(y[32] == 3 * 9 - 0.5f * 7, "q4_K e32: %g", y[32]);
        CHECK(y[162] == (4 | 2 << 4) * 10 - 0.5f * (5 | 1 << 4), "q4_K e162: %g", y[162]);
        CHECK(y[0] == 0 && y[130] == 0, "q4_K: zero scales give 0: %g %g", y[0], y[130]);
    }
    {   /* Q5_K: 5th bit of element 32*i + l is bit i of qh[l] */
        kn_block_q5_K b; memset(&b, 0, sizeof b);
        b.d = H1; b.dmin = H1;
        b.scales[1] = 1; b.scales[5] = 2;           /* sc1 = 1, m1 = 2 */
        b.qh[4] = 1 << 1;                           /* element 32 + 4 */
        b.qs[4] = 0x30;                             /* element 36 low bits: 3 */
        REQUIRE(kn_dequantize_row(KN_Q5_K, &b, y, 256) == KN_OK, "%s", kn_last_error());
        CHECK(y[36] == (3 + 16) - 2, "q5_K e36: %g", y[36]);
        CHECK(y[37] == 0 - 2, "q5_K e37: %g", y[37]);
    }
    {   /* Q6_K: element 128*h + e, see quant.h */
        kn_block_q6_K b; memset(&b, 0, sizeof b);
        b.d = H2;
        for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)(j + 1);
        b.scales[14] = -3;                          /* half 1, e103: scales[8 + 103/16] */
        b.ql[64 + 32 + 7] = 0x5c;                   /* half 1: e39 low = 12, e103 low = 5 */
        b.qh[32 + 7] = (2 << 2) | (3 << 6);         /* e39 high = 2, e103 high = 3 */
        REQUIRE(kn_dequantize_row(KN_Q6_K, &b, y, 256) == KN_OK, "%s", kn_last_error());
        CHECK(y[128 + 39] == 2.0f * 11 * ((12 | 2 << 4) - 32), "q6_K e167: %g", y[128 + 39]);
        CHECK(y[128 + 103] == 2.0f * -3 * ((5 | 3 << 4) - 32), "q6_K e231: %g", y[128 + 103]);
        CHECK(y[0] == 2.0f * 1 * -32, "q6_K e0: %g", y[0]);
    }
    {
        kn_block_q8_K b; memset(&b, 0, sizeof b);
        b.d = 0.25f; b.qs[200] = -100;
        REQUIRE(kn_dequantize_row(KN_Q8_K, &b, y, 256) == KN_OK, "%s", kn_last_error());
        CHECK(y[200] == -25 && y[199] == 0, "q8_K: %g", y[200]);
    }
}

/* ---- data ----------------------------------------------------------------- */

/* Mixed test signal: uniform, a sparse outlier per 64, a zero block, an all-positive block. */
static void fill_signal(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)kn_test_uniform(-1, 1);
        if ((kn_test_u64() & 63) == 0) x[i] *= 6;
    }
    if (n >= 512) {
        for (int i = 256; i < 288; i++) x[i] = 0;
        for (int i = 288; i < 320; i++) x[i] = 2.5f + (float)kn_test_uniform(0, 1);
    }
}
static uint16_t rand_half(double lo, double hi) {
    double v = kn_test_uniform(lo, hi);
    return kn_fp32_to_fp16((float)((kn_test_u64() & 1) ? -v : v));
}
/* Random raw bytes, with every scale field set to a finite value. */
static void fill_raw(kn_dtype t, void *dst, int64_t n) {
    uint8_t *p = dst;
    size_t bytes = kn_dtype_nbytes(t, n), ts = tsize(t);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)kn_test_u64();
    for (size_t off = 0; off < bytes; off += ts) {
        uint8_t *b = p + off;
        uint16_t h[2] = {rand_half(1e-3, 0.1), rand_half(1e-3, 0.1)};
        switch (t) {
        case KN_Q4_0: case KN_Q5_0: case KN_Q8_0: memcpy(b, h, 2); break;
        case KN_Q4_1: case KN_Q5_1: case KN_Q8_1: case KN_Q4_K: case KN_Q5_K: memcpy(b, h, 4); break;
        case KN_Q6_K: memcpy(b + 208, h, 2); break;
        case KN_Q8_K: { float d = (float)kn_test_uniform(1e-3, 0.1); memcpy(b, &d, 4); } break;
        default: break;
        }
    }
}

/* ---- round trip ----------------------------------------------------------- */

static double rt_bound(kn_dtype t) {
    /* Relative RMS error on fill_signal data, about 1.25x what the quantizers
     * reach there. Uniform data alone gives step / sqrt(12) / rms(x) (0.063 for
     * Q4_0); the 6x outliers in about half the 32-blocks widen their steps. */
    switch (t) {
    case KN_Q4_0: return 0.15;
    case KN_Q4_1: case KN_Q4_K: return 0.10;
    case KN_Q5_0: return 0.07;
    case KN_Q5_1: case KN_Q5_K: return 0.05;
    case KN_Q6_K: return 0.026;
    case KN_Q8_0: case KN_Q8_1: return 0.01;
    case KN_Q8_K: return 0.017;
    case KN_F16: return 1e-3;
    case KN_BF16: return 5e-3;
    default: return 0;
    }
}

/* Per-element bound of the symmetric 32-blocks: |x - d*q| <= |d|/2 except the
 * element opposite the extremum, which may clamp (then <= |d|); plus fp16 d. */
static int check_sym_max_err(kn_dtype t, const float *x, const void *q, const float *y, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i += 32) {
        const uint8_t *b = (const uint8_t *)q + (i / 32) * tsize(t);
        uint16_t d16; memcpy(&d16, b, 2);
        float d = fabsf(kn_fp16_to_fp32(d16)), amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i + j]));
        float lim = (t == KN_Q8_0 ? 0.5f : 1.0f) * d + amax * 1e-3f + 1e-30f;
        for (int j = 0; j < 32; j++) bad += !(fabsf(y[i + j] - x[i + j]) <= lim);
    }
    return bad;
}

TEST(roundtrip_error_bounds) {
    kn_test_seed(1);
    const int64_t n = 4096;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    void *q = malloc(kn_dtype_nbytes(KN_F32, n));
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    REQUIRE(x && y && q && a && b, "oom");
    kn_dtype types[NQ + 2];
    memcpy(types, QTYPES, sizeof QTYPES); types[NQ] = KN_F16; types[NQ + 1] = KN_BF16;
    for (int k = 0; k < NQ + 2; k++) {
        kn_dtype t = types[k];
        fill_signal(x, n);
        REQUIRE(kn_quantize_row(t, x, q, n) == KN_OK, "%s: %s", kn_dtype_name(t), kn_last_error());
        REQUIRE(kn_dequantize_row(t, q, y, n) == KN_OK, "%s: %s", kn_dtype_name(t), kn_last_error());
        for (int64_t i = 0; i < n; i++) { a[i] = y[i]; b[i] = x[i]; }
        double e = kn_rel_err(a, b, n);
        if (getenv("KN_VERBOSE")) printf("  %s rel err %.4g\n", kn_dtype_name(t), e);
        CHECK(e < rt_bound(t), "%s: rel err %.4g >= %.4g", kn_dtype_name(t), e, rt_bound(t));
        if (t == KN_Q4_0 || t == KN_Q5_0 || t == KN_Q8_0) {
            int bad = check_sym_max_err(t, x, q, y, n);
            CHECK(bad == 0, "%s: %d elements beyond the per-block step bound", kn_dtype_name(t), bad);
        }
        /* a block of zeros stays exactly zero; every type keeps the constant-positive block close */
        for (int i = 256; i < 288; i++) CHECK(y[i] == 0, "%s: zero block -> %g at %d", kn_dtype_name(t), y[i], i);
        for (int i = 288; i < 320; i++)
            CHECK(fabsf(y[i] - x[i]) < 2.5 * rt_bound(t), "%s: %g vs %g at %d", kn_dtype_name(t), y[i], x[i], i);
        /* quantizing the dequantized values again is (nearly) a fixed point: catches pack/unpack mismatches */
        float *z = malloc(n * sizeof *z); void *q2 = malloc(kn_dtype_nbytes(KN_F32, n));
        REQUIRE(z && q2, "oom");
        REQUIRE(kn_quantize_row(t, y, q2, n) == KN_OK, "%s", kn_last_error());
        REQUIRE(kn_dequantize_row(t, q2, z, n) == KN_OK, "%s", kn_last_error());
        for (int64_t i = 0; i < n; i++) { a[i] = z[i]; b[i] = y[i]; }
        double e2 = kn_rel_err(a, b, n);
        CHECK(e2 < rt_bound(t) / 2, "%s: re-quantization drifts: %.4g", kn_dtype_name(t), e2);
        free(z); free(q2);
    }
    free(x); free(y); free(q); free(a); free(b);
}

TEST(activation_quants_in_range_and_bsums) {
    kn_test_seed(2);
    const int64_t n = 1024;
    float x[1024];
    fill_signal(x, n);
    x[3] = -7; x[700] = 9;   /* block extremes of both signs */
    kn_block_q8_K k[4]; kn_block_q8_0 b0[32]; kn_block_q8_1 b1[32];
    REQUIRE(kn_quantize_row(KN_Q8_K, x, k, n) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_quantize_row(KN_Q8_0, x, b0, n) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_quantize_row(KN_Q8_1, x, b1, n) == KN_OK, "%s", kn_last_error());
    int bad = 0, badsum = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) { s += k[i].qs[16 * j + l]; bad += k[i].qs[16 * j + l] == -128; }
            badsum += s != k[i].bsums[j];
        }
    for (int i = 0; i < 32; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) { bad += b0[i].qs[j] == -128 || b1[i].qs[j] == -128; s += b1[i].qs[j]; }
        float want = kn_fp16_to_fp32(b1[i].d) * s, got = kn_fp16_to_fp32(b1[i].s);
        badsum += fabsf(got - want) > 1e-3f * fabsf(want) + 1e-6f;
    }
    CHECK(bad == 0, "%d activation quants are -128 (must be in [-127, 127])", bad);
    CHECK(badsum == 0, "%d wrong q8_K bsums / q8_1 s fields", badsum);
}

/* ---- dots ----------------------------------------------------------------- */

static double dot_ref(kn_dtype t, int64_t n, const void *w, const void *a, double *abs_sum) {
    float *wf = malloc(n * sizeof *wf), *af = malloc(n * sizeof *af);
    kn_dequantize_row(t, w, wf, n);
    kn_dequantize_row(kn_quant_vec_dot_type(t), a, af, n);
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) { s += (double)wf[i] * af[i]; as += fabs((double)wf[i] * af[i]); }
    free(wf); free(af);
    *abs_sum = as;
    return s;
}
/* Extra error from the fp16 s = d*sum(q) field of Q8_1 (used by the Q4_1/Q5_1 min term). */
static double s_field_err(kn_dtype t, int64_t n, const void *w, const void *a) {
    if (t != KN_Q4_1 && t != KN_Q5_1) return 0;
    double e = 0;
    const kn_block_q8_1 *ab = a;
    for (int64_t i = 0; i < n / 32; i++) {
        uint16_t m = t == KN_Q4_1 ? ((const kn_block_q4_1 *)w)[i].m : ((const kn_block_q5_1 *)w)[i].m;
        e += fabs(kn_fp16_to_fp32(m) * kn_fp16_to_fp32(ab[i].s)) * (1.0 / 1024);
    }
    return e;
}

/* Paths: 0 scalar, 1 avx2, 2 avx512 (with VNNI where the CPU has it), 3 avx512 without VNNI. */
static int n_paths(void) {
    int isa = (int)kn_cpu()->isa;
    return isa + 1 + (isa >= KN_ISA_AVX512 && kn_cpu()->avx512vnni);
}
static const char *path_name(int p) {
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512-novnni"};
    return names[p];
}
static void use_path(int p) {
    kn_quant_force_isa(p == 3 ? 2 : p);
    kn_quant_force_no_vnni(p == 3);
}
static void auto_path(void) { kn_quant_force_isa(-1); kn_quant_force_no_vnni(0); }

static void check_dots(kn_dtype t, int64_t n, int raw) {
    kn_dtype at = kn_quant_vec_dot_type(t);
    void *w = malloc(kn_dtype_nbytes(t, n) + 64), *a = malloc(kn_dtype_nbytes(at, n) + 64);
    float *x = malloc(n * sizeof *x), *xw = malloc(n * sizeof *xw);
    if (!w || !a || !x || !xw) { CHECK(0, "oom"); return; }
    fill_signal(x, n);
    if (raw && kn_dtype_get(t)->is_quant) fill_raw(t, w, n);
    else {
        for (int64_t i = 0; i < n; i++) xw[i] = (float)kn_test_uniform(-1, 1);
        if (kn_quantize_row(t, xw, w, n) != KN_OK) { CHECK(0, "%s", kn_last_error()); return; }
    }
    if (kn_quantize_row(at, x, a, n) != KN_OK) { CHECK(0, "%s", kn_last_error()); return; }
    double abs_sum, ref = dot_ref(t, n, w, a, &abs_sum);
    double tol = 3e-5 * abs_sum + s_field_err(t, n, w, a) + 1e-30;
    /* bound against the unquantized activation: |sum w (x - a)| <= sum |w| * d_a / 2 */
    float *wf = malloc(n * sizeof *wf), *af = malloc(n * sizeof *af);
    kn_dequantize_row(t, w, wf, n);
    kn_dequantize_row(at, a, af, n);
    double exact = 0, act_bound = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wf[i] * x[i];
        act_bound += fabs((double)wf[i]) * fabs((double)x[i] - af[i]);   /* realized, <= bound */
    }
    double act_max = 0;
    if (at != KN_F32) {   /* the a-priori bound: |x - a| <= d/2 per element */
        int64_t bs = bsize(at);
        for (int64_t i = 0; i < n; i += bs) {
            float amax = 0;
            for (int64_t j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(x[i + j]));
            float d = at == KN_Q8_K ? amax / 127 : kn_fp16_to_fp32(kn_fp32_to_fp16(amax / 127));
            for (int64_t j = 0; j < bs; j++) act_max += fabs((double)wf[i + j]) * d * 0.5;
        }
    }
    CHECK(act_bound <= act_max * (1 + 1e-6) + 1e-12, "%s: activation error %.4g above d/2 bound %.4g",
          kn_dtype_name(t), act_bound, act_max);
    for (int p = 0; p < n_paths(); p++) {
        use_path(p);
        CHECK(kn_quant_isa() == (p == 3 ? 2 : p), "path %d gave isa %d", p, kn_quant_isa());
        float got = kn_quant_vec_dot(t, n, w, a);
        CHECK(fabs(got - ref) <= tol, "%s %s n=%lld raw=%d: dot %.9g vs ref %.9g (tol %.3g)",
              kn_dtype_name(t), path_name(p), (long long)n, raw, got, ref, tol);
        CHECK(fabs(got - exact) <= act_max + tol, "%s %s: dot %.6g vs f32-activation %.6g beyond %.3g",
              kn_dtype_name(t), path_name(p), got, exact, act_max + tol);
    }
    auto_path();
    free(w); free(a); free(x); free(xw); free(wf); free(af);
}

TEST(vec_dot_all_paths_quantized_weights) {
    kn_test_seed(3);
    printf("# dot paths tested:");
    for (int p = 0; p < n_paths(); p++) printf(" %s", path_name(p));
    printf("\n");
    for (int k = 0; k < ND; k++) {
        kn_dtype t = DOTTYPES[k];
        int64_t bs = bsize(t) == 1 ? 1 : bsize(t);
        /* 1 block, odd block counts (pair loops' tails), a model-sized row */
        int64_t ns[] = {bs == 1 ? 37 : bs, bs == 1 ? 1000 : 7 * bs, bs == 1 ? 4096 : (4096 / bs) * bs + bs};
        for (int i = 0; i < 3; i++) check_dots(t, ns[i], 0);
    }
}

TEST(vec_dot_all_paths_raw_weights) {
    kn_test_seed(4);
    for (int k = 0; k < NQ; k++)
        for (int rep = 0; rep < 3; rep++) check_dots(QTYPES[k], rep == 0 ? 2 * bsize(QTYPES[k]) : 2048, 1);
}

/* SIMD paths agree with the scalar oracle on many short random rows. */
TEST(vec_dot_paths_agree) {
    kn_test_seed(5);
    if (n_paths() < 2) SKIP("this CPU has no SIMD path (isa %d)", (int)kn_cpu()->isa);
    for (int k = 0; k < NQ; k++) {
        kn_dtype t = QTYPES[k], at = kn_quant_vec_dot_type(t);
        int64_t n = 2 * bsize(t) > 64 ? 2 * bsize(t) : 64 * 3;
        void *w = malloc(kn_dtype_nbytes(t, n)), *a = malloc(kn_dtype_nbytes(at, n));
        float *x = malloc(n * sizeof *x);
        REQUIRE(w && a && x, "oom");
        int bad = 0;
        for (int rep = 0; rep < 200; rep++) {
            fill_raw(t, w, n);
            fill_signal(x, n);
            kn_quantize_row(at, x, a, n);
            double abs_sum, ref = dot_ref(t, n, w, a, &abs_sum);
            double tol = 3e-5 * abs_sum + s_field_err(t, n, w, a) + 1e-30;
            use_path(0);
            float s = kn_quant_vec_dot(t, n, w, a);
            bad += !(fabs(s - ref) <= tol);
            for (int p = 1; p < n_paths(); p++) {
                use_path(p);
                float v = kn_quant_vec_dot(t, n, w, a);
                if (!(fabs(v - s) <= 2 * tol)) {
                    if (bad++ < 3) fprintf(stderr, "  %s %s rep %d: %.9g vs scalar %.9g\n", kn_dtype_name(t), path_name(p), rep, v, s);
                }
            }
        }
        auto_path();
        CHECK(bad == 0, "%s: %d mismatches", kn_dtype_name(t), bad);
        free(w); free(a); free(x);
    }
}

/* ---- Q16 activations ------------------------------------------------------- */

static const kn_dtype Q16TYPES[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K};
#define NQ16 (int)(sizeof Q16TYPES / sizeof Q16TYPES[0])

TEST(q16_quantize_bounds_and_sums) {
    kn_test_seed(21);
    int64_t n = 1024;
    float *x = malloc(n * sizeof *x);
    kn_block_q16 *y = malloc(kn_quant_q16_nbytes(n));
    REQUIRE(x && y && kn_quant_q16_nbytes(n) == 32 * sizeof(kn_block_q16), "oom / size");
    fill_signal(x, n);
    REQUIRE(kn_quantize_q16(x, y, n) == KN_OK, "%s", kn_last_error());
    int bad = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0; long sum = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        for (int j = 0; j < 32; j++) {
            sum += y[b].qs[j];
            bad += y[b].qs[j] < -32767 || fabsf(x[32 * b + j] - y[b].d * y[b].qs[j]) > y[b].d * 0.5f * (1 + 1e-5f) + 1e-30f;
        }
        bad += fabsf(y[b].d - amax / 32767) > 1e-7f * amax;
        bad += fabsf(y[b].s - y[b].d * (float)sum) > 1e-6f * fabsf(y[b].d) * 32 * 32767;
    }
    CHECK(bad == 0, "%d quants / scales / sums off", bad);
    /* the SIMD quantizer (when this CPU runs one) is bit-identical to the scalar */
    kn_block_q16 *z = malloc(kn_quant_q16_nbytes(n));
    kn_quant_force_isa(KN_ISA_SCALAR);
    REQUIRE(z && kn_quantize_q16(x, z, n) == KN_OK, "scalar quantize");
    kn_quant_force_isa(-1);
    CHECK(!memcmp(y, z, kn_quant_q16_nbytes(n)), "SIMD and scalar Q16 quants differ");
    free(z);
    x[37] = NAN;
    CHECK(kn_quantize_q16(x, y, n) == KN_ERR_INVALID && strstr(kn_last_error(), "x[37]"), "NaN rejected: %s", kn_last_error());
    CHECK(kn_quantize_q16(x, y, 33) == KN_ERR_INVALID, "n not a multiple of 32 rejected");
    free(x); free(y);
}

/* Every Q16 dot this CPU has, scalar and SIMD, against the weights and the
 * activation quants dequantized and summed in double, and against the f32
 * activations within the quantization bound sum |w| * d / 2. */
static void check_q16(kn_dtype t, int64_t n, int raw) {
    void *w = malloc(kn_dtype_nbytes(t, n));
    kn_block_q16 *a = malloc(kn_quant_q16_nbytes(n));
    float *x = malloc(n * sizeof *x), *wf = malloc(n * sizeof *wf);
    if (!w || !a || !x || !wf) { CHECK(0, "oom"); return; }
    fill_signal(x, n);
    if (raw) fill_raw(t, w, n);
    else {
        for (int64_t i = 0; i < n; i++) wf[i] = (float)kn_test_uniform(-1, 1);
        kn_quantize_row(t, wf, w, n);
    }
    kn_quantize_q16(x, a, n);
    kn_dequantize_row(t, w, wf, n);
    double ref = 0, abs_sum = 0, exact = 0, bound = 0;
    for (int64_t i = 0; i < n; i++) {
        double av = (double)a[i / 32].d * a[i / 32].qs[i % 32];
        ref += wf[i] * av; abs_sum += fabs(wf[i] * av);
        exact += (double)wf[i] * x[i];
        bound += fabs((double)wf[i]) * a[i / 32].d * 0.5;
    }
    double tol = 1e-5 * abs_sum + 1e-30;
    kn_vec_dot_fn fs = kn_quant_q16_dot_scalar(t);
    REQUIRE(fs, "%s: no scalar q16 dot", kn_dtype_name(t));
    float s = fs(n, w, a);
    CHECK(fabs(s - ref) <= tol, "%s scalar n=%lld raw=%d: %.9g vs ref %.9g (tol %.3g)", kn_dtype_name(t), (long long)n, raw, s, ref, tol);
    CHECK(fabs(s - exact) <= bound + tol, "%s: %.9g vs f32 activations %.9g beyond %.3g", kn_dtype_name(t), s, exact, bound + tol);
    if (kn_cpu()->isa >= KN_ISA_AVX2) {
        kn_vec_dot_fn fv = kn_quant_q16_dot(t);
        CHECK(fv != NULL, "%s: no SIMD q16 dot", kn_dtype_name(t));
        float v = fv ? fv(n, w, a) : NAN;
        CHECK(fabs(v - ref) <= tol, "%s simd n=%lld raw=%d: %.9g vs ref %.9g (tol %.3g)", kn_dtype_name(t), (long long)n, raw, v, ref, tol);
    }
    free(w); free(a); free(x); free(wf);
}

TEST(activation_mode_from_environment) {
    CHECK(kn_quant_act_mode_parse(NULL, NULL) == KN_QACT_AUTO && kn_quant_act_mode_parse("auto", NULL) == KN_QACT_AUTO, "auto");
    CHECK(kn_quant_act_mode_parse("q8", NULL) == KN_QACT_Q8 && kn_quant_act_mode_parse("q16", "1") == KN_QACT_Q16, "q8 / q16");
    CHECK(kn_quant_act_mode_parse("f32", NULL) == KN_QACT_F32 && kn_quant_act_mode_parse(NULL, "1") == KN_QACT_F32 &&
          kn_quant_act_mode_parse(NULL, "0") == KN_QACT_AUTO, "f32 / KN_QMM_EXACT");
}

TEST(q16_dots_match_reference) {
    kn_test_seed(22);
    for (int k = 0; k < NQ16; k++) {
        kn_dtype t = Q16TYPES[k];
        int64_t bs = bsize(t);
        int64_t ns[] = {bs, 7 * bs, (4096 / bs) * bs + bs};
        for (int i = 0; i < 3; i++) { check_q16(t, ns[i], 0); check_q16(t, ns[i], 1); }
        for (int rep = 0; rep < 50; rep++) check_q16(t, 2 * bs, 1);
    }
    CHECK(kn_quant_q16_dot(KN_F32) == NULL && kn_quant_q16_dot_scalar(KN_F16) == NULL, "float weights have no q16 dot");
}

/* the four-row Q16 dots against four single dots (the same products summed
 * in another order: to 1e-6 of the sum of |products|) */
TEST(q16_dot4_matches_single_dots) {
    kn_test_seed(23);
    int have = 0;
    for (int k = 0; k < NQ16; k++) {
        kn_dtype t = Q16TYPES[k];
        kn_vec_dot4_fn f4 = kn_quant_q16_dot4(t);
        kn_vec_dot_fn f1 = kn_quant_q16_dot_scalar(t);
        if (!f4) continue;
        have++;
        int64_t n = 13 * 32;
        size_t ab = kn_quant_q16_nbytes(n);
        void *w = malloc(kn_dtype_nbytes(t, n));
        char *a = malloc(ab * 4);
        float *x = malloc(sizeof(float) * (size_t)n);
        for (int rep = 0; rep < 20; rep++) {
            fill_raw(t, w, n);
            for (int r = 0; r < 4; r++) {
                for (int64_t i = 0; i < n; i++) x[i] = (float)kn_test_uniform(-3, 3);
                kn_quantize_q16(x, (kn_block_q16 *)(a + r * ab), n);
            }
            float y[4];
            f4(n, w, a, ab, y);
            for (int r = 0; r < 4; r++) {
                float want = f1(n, w, a + r * ab);
                CHECK(fabs(y[r] - want) <= 1e-5 * (fabs(want) + 1), "%s row %d: %.9g vs %.9g", kn_dtype_name(t), r, y[r], want);
            }
        }
        free(w); free(a); free(x);
    }
    CHECK(have == (kn_cpu()->isa >= KN_ISA_AVX2 ? 5 : 0), "dot4 for the five 32-element types on AVX2: %d", have);
}

/* ---- matvec ---------------------------------------------------------------- */

TEST(matvec_rows_matches_vec_dot) {
    kn_test_seed(6);
    for (int k = 0; k < ND; k++) {
        kn_dtype t = DOTTYPES[k], at = kn_quant_vec_dot_type(t);
        int64_t n = bsize(t) == 1 ? 96 : 2 * bsize(t), rows = 13;
        size_t rb = kn_dtype_nbytes(t, n) + 8;   /* padded stride (rows stay 4-byte aligned) */
        char *W = malloc(rb * rows); void *a = malloc(kn_dtype_nbytes(at, n));
        float *x = malloc(n * sizeof *x), y[13], z[13];
        REQUIRE(W && a && x, "oom");
        for (int64_t r = 0; r < rows; r++) {
            fill_signal(x, n);
            REQUIRE(kn_quantize_row(t, x, W + r * rb, n) == KN_OK, "%s", kn_last_error());
        }
        fill_signal(x, n);
        REQUIRE(kn_quantize_row(at, x, a, n) == KN_OK, "%s", kn_last_error());
        for (int p = 0; p < n_paths(); p++) {
            use_path(p);
            int64_t ranges[][2] = {{0, 13}, {3, 10}, {5, 6}, {7, 7}, {12, 13}};
            for (int q = 0; q < 5; q++) {
                for (int i = 0; i < 13; i++) y[i] = z[i] = -12345.0f;
                kn_quant_matvec_rows(t, n, W, rb, a, y, ranges[q][0], ranges[q][1]);
                for (int64_t r = ranges[q][0]; r < ranges[q][1]; r++) z[r] = kn_quant_vec_dot(t, n, W + r * rb, a);
                for (int i = 0; i < 13; i++)
                    CHECK(y[i] == z[i], "%s %s range [%lld,%lld) row %d: %g vs %g", kn_dtype_name(t), path_name(p),
                          (long long)ranges[q][0], (long long)ranges[q][1], i, y[i], z[i]);
            }
        }
        auto_path();
        free(W); free(a); free(x);
    }
}

/* ---- bad arguments --------------------------------------------------------- */

TEST(bad_arguments_give_errors) {
    float x[512] = {0}, y[512];
    uint8_t buf[4096] = {0};
    kn_clear_error();
    CHECK(kn_quantize_row(KN_Q4_0, x, buf, 33) == KN_ERR_INVALID, "n=33 q4_0 quantize");
    CHECK(strstr(kn_last_error(), "33") != NULL, "message names n: '%s'", kn_last_error());
    CHECK(kn_dequantize_row(KN_Q4_K, buf, y, 128) == KN_ERR_INVALID, "n=128 q4_K dequantize");
    CHECK(kn_dequantize_row(KN_Q8_0, buf, y, -32) == KN_ERR_INVALID, "negative n");
    CHECK(kn_dequantize_row(KN_Q8_0, NULL, y, 32) == KN_ERR_INVALID, "NULL src");
    CHECK(kn_quantize_row(KN_Q8_0, x, NULL, 32) == KN_ERR_INVALID, "NULL dst");
    CHECK(kn_dequantize_row((kn_dtype)99, buf, y, 32) == KN_ERR_INVALID, "unknown dtype");
    CHECK(kn_dequantize_row(KN_I32, buf, y, 32) == KN_ERR_UNSUPPORTED, "i32 dequantize");
    CHECK(kn_quantize_row(KN_I8, x, buf, 32) == KN_ERR_UNSUPPORTED, "i8 quantize");
    x[5] = NAN;
    CHECK(kn_quantize_row(KN_Q8_0, x, buf, 32) == KN_ERR_INVALID, "NaN input");
    x[5] = INFINITY;
    CHECK(kn_quantize_row(KN_Q4_K, x, buf, 256) == KN_ERR_INVALID, "inf input");
    x[5] = 0;
    CHECK(kn_dequantize_row(KN_Q8_0, buf, y, 0) == KN_OK, "n = 0 is fine");

    kn_clear_error();
    CHECK(isnan(kn_quant_vec_dot(KN_Q4_0, 48, buf, buf + 1024)), "vec_dot n=48 -> NaN");
    CHECK(kn_last_error()[0] != 0, "vec_dot sets a message");
    CHECK(isnan(kn_quant_vec_dot(KN_I32, 32, buf, buf + 1024)), "vec_dot i32 -> NaN");
    CHECK(isnan(kn_quant_vec_dot(KN_Q8_0, 32, NULL, buf)), "vec_dot NULL -> NaN");
    CHECK(kn_quant_vec_dot_type(KN_I32) == KN_DTYPE_COUNT, "no dot type for i32");

    for (int i = 0; i < 8; i++) y[i] = 1;
    kn_clear_error();
    kn_quant_matvec_rows(KN_Q6_K, 100, buf, 210, buf + 2048, y, 0, 4);
    CHECK(isnan(y[0]) && isnan(y[3]) && y[4] == 1, "matvec bad n -> NaN rows only in range");
    CHECK(kn_last_error()[0] != 0, "matvec sets a message");
    for (int i = 0; i < 8; i++) y[i] = 1;
    kn_quant_matvec_rows(KN_Q8_0, 64, buf, 34, buf + 2048, y, 0, 2);   /* stride < 68 */
    CHECK(isnan(y[0]) && isnan(y[1]), "matvec short row stride -> NaN");
    kn_clear_error();
    kn_quant_matvec_rows(KN_Q8_0, 32, buf, 34, buf + 2048, y, 3, 1);     /* r1 < r0: no write */
    CHECK(kn_last_error()[0] != 0 && y[2] == 1, "matvec reversed range");
    kn_quant_matvec_rows(KN_Q8_0, 32, buf, 34, buf + 2048, NULL, 0, 1);
    CHECK(kn_last_error()[0] != 0, "matvec NULL y");
}

KN_TEST_MAIN()
