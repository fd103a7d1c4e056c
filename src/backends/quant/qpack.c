/* qpack.c: the 16-row packed layout of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K weights (qpack.h):
 * packing, the scalar matrix-vector kernel (the oracle of qpack_avx512.c),
 * dequantizing a group, and the choice of kernel for this CPU. */
#include "backends/quant/qpack.h"
#include "core/cpu.h"       /* defines: kn_cpu, KN_ISA_* */
#include "core/fp16.h"      /* defines: kn_fp16_to_fp32  */
#include <string.h>

enum { R = KN_QPACK_ROWS };

bool kn_qpack_type_ok(kn_dtype t) {
    return t == KN_Q4_0 || t == KN_Q4_1 || t == KN_Q5_0 || t == KN_Q5_1 || t == KN_Q8_0 || t == KN_Q4_K || t == KN_Q5_K ||
           t == KN_Q6_K;
}
static bool is_k(kn_dtype t) { return t == KN_Q4_K || t == KN_Q5_K || t == KN_Q6_K; }
static bool is_k45(kn_dtype t) { return t == KN_Q4_K || t == KN_Q5_K; }   /* d, dmin, 6-bit scales and mins */
static bool is_q5(kn_dtype t) { return t == KN_Q5_0 || t == KN_Q5_1 || t == KN_Q5_K; }   /* a plane of fifth bits */
static bool has_min(kn_dtype t) { return t == KN_Q4_1 || t == KN_Q5_1 || t == KN_Q4_K || t == KN_Q5_K; }

/* elements of one record (the file's block), bytes of its scale part and of
 * its quant part (Q4_K: d, dmin, then the 8 sub-blocks' 6-bit scales and
 * mins as bytes, [8][16] each; the quants sub-block by sub-block as Q4_0's) */
static int64_t block_elems(kn_dtype t) { return is_k(t) ? KN_QK_K : KN_QK; }
static size_t scale_bytes(kn_dtype t) {
    return is_k45(t) ? 4 * R + 16 * R : t == KN_Q6_K ? 2 * R + 16 * R : has_min(t) ? 4 * R : 2 * R;
}
/* bytes of one 32-element quant part: Q4 nibbles (+ Q5's bit plane, Q6_K's two) */
static size_t part_bytes(kn_dtype t) { return R * KN_QK / 2 + (is_q5(t) ? 4 * R : t == KN_Q6_K ? 8 * R : 0); }
static size_t quant_bytes(kn_dtype t) {
    return t == KN_Q8_0 ? R * KN_QK : (size_t)(block_elems(t) / KN_QK) * part_bytes(t);
}

static size_t record_bytes(kn_dtype t) { return scale_bytes(t) + quant_bytes(t); }

size_t kn_qpack_nbytes(kn_dtype t, int64_t rows, int64_t K) {
    int64_t groups = (rows + R - 1) / R;
    return (size_t)groups * (size_t)(K / block_elems(t)) * record_bytes(t);
}

/* element e (0..31) of a file block's nibbles (Q4, Q5's low 4 bits) */
static int q4_at(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

/* the 16 bytes of a Q4 quant part holding 32 elements, one row: chunk c
 * byte 2r + j = element 2c + j (low nibble) | element 2(c + 8) + j (high) */
static void put_q4(uint8_t *q, int r, const uint8_t e[32]) {
    for (int c = 0; c < 8; c++)
        for (int j = 0; j < 2; j++) q[c * 2 * R + 2 * r + j] = (uint8_t)(e[2 * c + j] | e[2 * (c + 8) + j] << 4);
}

/* the high bits of a Q5 block's 32 elements (bit e of qh, little-endian)
 * into the plane: h[2r + j] bit c = element 2c + j, bit 8 + c = element
 * 2(c + 8) + j, the pairs of the nibble chunks' low and high halves */
static void put_q5h(uint8_t *hp, int r, const uint8_t qh[4]) {
    uint32_t bits = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 2; j++) {
        uint16_t w = 0;
        for (int c = 0; c < 8; c++) {
            w |= (uint16_t)(((bits >> (2 * c + j)) & 1u) << c);
            w |= (uint16_t)(((bits >> (2 * (c + 8) + j)) & 1u) << (8 + c));
        }
        memcpy(hp + 2 * (2 * r + j), &w, 2);
    }
}

/* Q6_K's high two bits of a 32-element part's elements e[] (0..63) into its
 * planes after the nibbles: h0[2r + j] bits 2c, 2c + 1 = element 2c + j, h1
 * the same for element 2(c + 8) + j */
static void put_q6h(uint8_t *hp, int r, const uint8_t e[32]) {
    for (int half = 0; half < 2; half++)
        for (int j = 0; j < 2; j++) {
            uint16_t w = 0;
            for (int c = 0; c < 8; c++) w |= (uint16_t)((e[16 * half + 2 * c + j] >> 4) << (2 * c));
            memcpy(hp + half * 4 * R + 2 * (2 * r + j), &w, 2);
        }
}

void kn_qpack_pack(kn_dtype t, const void *src, size_t row_bytes, int64_t rows, int64_t K, int64_t g0, int64_t g1,
                   void *dst) {
    const int64_t nb = K / block_elems(t);
    const size_t rec = record_bytes(t), sb = scale_bytes(t);
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)dst + (size_t)(g * nb + b) * rec;
            uint16_t *d = (uint16_t *)o, *m = d + R;
            uint8_t *q = o + sb;
            memset(o, 0, rec);             /* padding rows: zero scales and quants */
            for (int r = 0; r < R; r++) {
                int64_t row = g * R + r;
                if (row >= rows) break;
                const char *blk = (const char *)src + (size_t)row * row_bytes;
                uint8_t e[32];
                if (t == KN_Q8_0) {
                    const kn_block_q8_0 *w = (const kn_block_q8_0 *)blk + b;
                    d[r] = w->d;
                    for (int c = 0; c < KN_QK / 2; c++)
                        for (int j = 0; j < 2; j++) q[c * 2 * R + 2 * r + j] = (uint8_t)w->qs[2 * c + j];
                } else if (is_k45(t)) {                 /* Q5_K: Q4_K's layout, each part with its bit plane */
                    const uint8_t *scales, *qs0, *qh = NULL;
                    if (t == KN_Q4_K) {
                        const kn_block_q4_K *w = (const kn_block_q4_K *)blk + b;
                        d[r] = w->d; m[r] = w->dmin; scales = w->scales; qs0 = w->qs;
                    } else {
                        const kn_block_q5_K *w = (const kn_block_q5_K *)blk + b;
                        d[r] = w->d; m[r] = w->dmin; scales = w->scales; qs0 = w->qs; qh = w->qh;
                    }
                    uint8_t *sc = o + 4 * R, *mn = sc + 8 * R;
                    for (int sub = 0; sub < 8; sub++) {      /* sub-block 2c: low nibbles of chunk c, 2c+1: high */
                        int scv, mv;
                        kn_q45k_sc_m(scales, sub, &scv, &mv);
                        sc[sub * R + r] = (uint8_t)scv; mn[sub * R + r] = (uint8_t)mv;
                        const uint8_t *qs = qs0 + 32 * (sub / 2);
                        uint8_t hb[4] = {0, 0, 0, 0};
                        for (int l = 0; l < 32; l++) {
                            e[l] = sub & 1 ? qs[l] >> 4 : qs[l] & 15;
                            if (qh) hb[l / 8] |= (uint8_t)(((qh[l] >> sub) & 1) << (l % 8));
                        }
                        uint8_t *qp = q + (size_t)sub * part_bytes(t);
                        put_q4(qp, r, e);
                        if (qh) put_q5h(qp + R * KN_QK / 2, r, hb);
                    }
                } else if (t == KN_Q6_K) {
                    const kn_block_q6_K *w = (const kn_block_q6_K *)blk + b;
                    int8_t *sc = (int8_t *)(o + 2 * R);
                    d[r] = w->d;
                    for (int j = 0; j < 16; j++) sc[j * R + r] = w->scales[j];
                    for (int sub = 0; sub < 8; sub++) {
                        uint8_t *qp = q + (size_t)sub * part_bytes(t), n4[32];
                        for (int l = 0; l < 32; l++) { e[l] = (uint8_t)kn_q6k_at(w, 32 * sub + l); n4[l] = e[l] & 15; }
                        put_q4(qp, r, n4);
                        put_q6h(qp + R * KN_QK / 2, r, e);
                    }
                } else {                                /* Q4_0, Q4_1, Q5_0, Q5_1 */
                    const uint8_t *qs, *qh = NULL;
                    if (t == KN_Q4_0) { const kn_block_q4_0 *w = (const kn_block_q4_0 *)blk + b; d[r] = w->d; qs = w->qs; }
                    else if (t == KN_Q4_1) { const kn_block_q4_1 *w = (const kn_block_q4_1 *)blk + b; d[r] = w->d; m[r] = w->m; qs = w->qs; }
                    else if (t == KN_Q5_0) { const kn_block_q5_0 *w = (const kn_block_q5_0 *)blk + b; d[r] = w->d; qs = w->qs; qh = w->qh; }
                    else { const kn_block_q5_1 *w = (const kn_block_q5_1 *)blk + b; d[r] = w->d; m[r] = w->m; qs = w->qs; qh = w->qh; }
                    for (int l = 0; l < 32; l++) e[l] = (uint8_t)q4_at(qs, l);
                    put_q4(q, r, e);
                    if (qh) put_q5h(q + R * KN_QK / 2, r, qh);
                }
            }
        }
    }
}

/* quant of element e of row r in a record's quant part (Q4_K: e < 256,
 * sub-block e / 32 is its own 32-element Q4 part) */
static int rec_quant(kn_dtype t, const uint8_t *q, int r, int e) {
    if (t == KN_Q8_0) return (int8_t)q[(e / 2) * 2 * R + 2 * r + (e & 1)];
    q += (size_t)(e / KN_QK) * part_bytes(t);
    e %= KN_QK;
    int p = e / 2, hi = p >= 8;
    uint8_t byte = q[(p - 8 * hi) * 2 * R + 2 * r + (e & 1)];
    int v = hi ? byte >> 4 : byte & 15;
    if (is_q5(t)) {                  /* the plane after the nibbles: bit p of h[2r + j] */
        uint16_t h;
        memcpy(&h, q + R * KN_QK / 2 + 2 * (2 * r + (e & 1)), 2);
        v |= ((h >> p) & 1) << 4;
    } else if (t == KN_Q6_K) {       /* two planes: bits 2c, 2c + 1 of h_hi[2r + j], c = p mod 8; minus 32 */
        uint16_t h;
        memcpy(&h, q + R * KN_QK / 2 + hi * 4 * R + 2 * (2 * r + (e & 1)), 2);
        v = (v | ((h >> (2 * (p - 8 * hi))) & 3) << 4) - 32;
    }
    return v;
}

static void gemv_scalar(kn_dtype t, const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x,
                        float *y) {
    const int64_t be = block_elems(t), nb = K / be;
    const size_t rec = record_bytes(t), sb = scale_bytes(t);
    for (int64_t g = g0; g < g1; g++) {
        float acc[R] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb + b) * rec;
            const uint16_t *d = (const uint16_t *)o, *m = d + R;
            for (int r = 0; r < R; r++) {
                float dw = kn_fp16_to_fp32(d[r]);
                for (int sub = 0; sub < be / KN_QK; sub++) {         /* 32-element activation blocks */
                    const kn_block_q16 *a = &x[b * (be / KN_QK) + sub];
                    int32_t sum = 0, half[2] = {0, 0};
                    for (int e = 0; e < KN_QK; e++) {
                        int32_t p = rec_quant(t, o + sb, r, sub * KN_QK + e) * a->qs[e];
                        sum += p; half[e >= 16] += p;
                    }
                    if (t == KN_Q6_K) {                              /* d (sc_2j s_lo + sc_2j+1 s_hi) da */
                        const int8_t *sc = (const int8_t *)(o + 2 * R);
                        acc[r] += dw * (a->d * ((float)sc[2 * sub * R + r] * (float)half[0] +
                                                (float)sc[(2 * sub + 1) * R + r] * (float)half[1]));
                    } else if (t == KN_Q8_0) acc[r] += dw * a->d * (float)sum;
                    else if (t == KN_Q4_0) acc[r] += dw * (a->d * (float)sum - 8.0f * a->s);
                    else if (t == KN_Q5_0) acc[r] += dw * (a->d * (float)sum - 16.0f * a->s);
                    else if (t == KN_Q4_1 || t == KN_Q5_1) acc[r] += dw * a->d * (float)sum + kn_fp16_to_fp32(m[r]) * a->s;
                    else {                                           /* Q4_K, Q5_K: d sc q - dmin m */
                        const uint8_t *sc = o + 4 * R, *mn = sc + 8 * R;
                        acc[r] += dw * (float)sc[sub * R + r] * a->d * (float)sum -
                                  kn_fp16_to_fp32(m[r]) * (float)mn[sub * R + r] * a->s;
                    }
                }
            }
        }
        memcpy(y + (g - g0) * R, acc, sizeof acc);
    }
}
#define GEMV(T, name) \
    static void name(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) { gemv_scalar(T, p, g0, g1, K, x, y); }
GEMV(KN_Q8_0, gemv_q8_0) GEMV(KN_Q4_0, gemv_q4_0) GEMV(KN_Q4_1, gemv_q4_1) GEMV(KN_Q5_0, gemv_q5_0)
GEMV(KN_Q5_1, gemv_q5_1) GEMV(KN_Q4_K, gemv_q4_K) GEMV(KN_Q5_K, gemv_q5_K) GEMV(KN_Q6_K, gemv_q6_K)
#undef GEMV

kn_qpack_gemv_fn kn_qpack_gemv_scalar(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return gemv_q8_0;
    case KN_Q4_0: return gemv_q4_0;
    case KN_Q4_1: return gemv_q4_1;
    case KN_Q5_0: return gemv_q5_0;
    case KN_Q5_1: return gemv_q5_1;
    case KN_Q4_K: return gemv_q4_K;
    case KN_Q5_K: return gemv_q5_K;
    case KN_Q6_K: return gemv_q6_K;
    default: return NULL;
    }
}

kn_qpack_gemv_fn kn_qpack_gemv_simd(kn_dtype t) {
#if defined(KN_QUANT_AVX512)
    if (kn_quant_isa() >= KN_ISA_AVX512 && kn_cpu()->avx512vnni) return kn_qpack_avx512_gemv(t);
#endif
    (void)t;
    return NULL;
}

kn_qpack_gemm4_fn kn_qpack_gemm4_simd(kn_dtype t) {
#if defined(KN_QUANT_AVX512)
    if (kn_quant_isa() >= KN_ISA_AVX512 && kn_cpu()->avx512vnni) return kn_qpack_avx512_gemm4(t);
#endif
    (void)t;
    return NULL;
}

static void dequant_scalar(kn_dtype t, const void *packed, int64_t g, int64_t K, float *out, int64_t ldo) {
    const int64_t be = block_elems(t), nb = K / be;
    const size_t rec = record_bytes(t), sb = scale_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb + b) * rec;
        const uint16_t *d = (const uint16_t *)o, *m = d + R;
        for (int r = 0; r < R; r++) {
            float dw = kn_fp16_to_fp32(d[r]), mw = has_min(t) ? kn_fp16_to_fp32(m[r]) : 0.0f;
            for (int e = 0; e < be; e++) {
                int q = rec_quant(t, o + sb, r, e);
                float v;
                if (t == KN_Q6_K) {          /* as quant.c's deq_q6_K: (d sc) (q - 32) */
                    v = dw * (float)((const int8_t *)(o + 2 * R))[(e / 16) * R + r] * (float)q;
                } else if (is_k45(t)) {      /* as quant.c's deq_q4_K / deq_q5_K: (d sc) q - (dmin m) */
                    const uint8_t *sc = o + 4 * R, *mn = sc + 8 * R;
                    float ds = dw * (float)sc[(e / 32) * R + r], dm = mw * (float)mn[(e / 32) * R + r];
                    v = ds * (float)q - dm;
                } else if (t == KN_Q4_0 || t == KN_Q5_0) v = dw * (float)(q - (t == KN_Q4_0 ? 8 : 16));
                else v = t == KN_Q4_1 || t == KN_Q5_1 ? dw * (float)q + mw : dw * (float)q;
                out[(b * be + e) * ldo + r] = v;
            }
        }
    }
}
#define DEQ(T, name) static void name(const void *p, int64_t g, int64_t K, float *out, int64_t ldo) { dequant_scalar(T, p, g, K, out, ldo); }
DEQ(KN_Q8_0, deq_q8_0) DEQ(KN_Q4_0, deq_q4_0) DEQ(KN_Q4_1, deq_q4_1) DEQ(KN_Q5_0, deq_q5_0) DEQ(KN_Q5_1, deq_q5_1)
DEQ(KN_Q4_K, deq_q4_K) DEQ(KN_Q5_K, deq_q5_K) DEQ(KN_Q6_K, deq_q6_K)
#undef DEQ

kn_qpack_dequant_fn kn_qpack_dequant_scalar(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return deq_q8_0;
    case KN_Q4_0: return deq_q4_0;
    case KN_Q4_1: return deq_q4_1;
    case KN_Q5_0: return deq_q5_0;
    case KN_Q5_1: return deq_q5_1;
    case KN_Q4_K: return deq_q4_K;
    case KN_Q5_K: return deq_q5_K;
    case KN_Q6_K: return deq_q6_K;
    default: return NULL;
    }
}

kn_qpack_dequant_fn kn_qpack_dequant(kn_dtype t) {
    kn_qpack_dequant_fn f = NULL;
#if defined(KN_QUANT_AVX512)
    if (kn_quant_isa() >= KN_ISA_AVX512 && kn_cpu()->avx512vnni) f = kn_qpack_avx512_dequant(t);
#endif
    return f ? f : kn_qpack_dequant_scalar(t);
}
