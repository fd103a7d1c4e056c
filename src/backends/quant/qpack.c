/* qpack.c: the 16-row packed layout of Q4_0 / Q4_1 / Q8_0 weights (qpack.h):
 * packing, the scalar matrix-vector kernel (the oracle of qpack_avx512.c),
 * dequantizing a group, and the choice of kernel for this CPU. */
#include "backends/quant/qpack.h"
#include "core/cpu.h"       /* defines: kn_cpu, KN_ISA_* */
#include "core/fp16.h"      /* defines: kn_fp16_to_fp32  */
#include <string.h>

enum { R = KN_QPACK_ROWS };

bool kn_qpack_type_ok(kn_dtype t) { return t == KN_Q4_0 || t == KN_Q4_1 || t == KN_Q8_0; }

/* bytes of the scale part and of the quant part of one record */
static size_t scale_bytes(kn_dtype t) { return t == KN_Q4_1 ? 4 * R : 2 * R; }
static size_t quant_bytes(kn_dtype t) { return t == KN_Q8_0 ? R * KN_QK : R * KN_QK / 2; }

size_t kn_qpack_record_bytes(kn_dtype t) { return scale_bytes(t) + quant_bytes(t); }

size_t kn_qpack_nbytes(kn_dtype t, int64_t rows, int64_t K) {
    int64_t groups = (rows + R - 1) / R;
    return (size_t)groups * (size_t)(K / KN_QK) * kn_qpack_record_bytes(t);
}

/* element e (0..31) of a file block as its unsigned quant (Q4) or signed one (Q8) */
static int q4_at(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

void kn_qpack_pack(kn_dtype t, const void *src, size_t row_bytes, int64_t rows, int64_t K, int64_t g0, int64_t g1,
                   void *dst) {
    const int64_t nb = K / KN_QK;
    const size_t rec = kn_qpack_record_bytes(t), sb = scale_bytes(t);
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
                if (t == KN_Q8_0) {
                    const kn_block_q8_0 *w = (const kn_block_q8_0 *)blk + b;
                    d[r] = w->d;
                    for (int c = 0; c < KN_QK / 2; c++)
                        for (int j = 0; j < 2; j++) q[c * 2 * R + 2 * r + j] = (uint8_t)w->qs[2 * c + j];
                } else {
                    const uint8_t *qs;
                    if (t == KN_Q4_0) { const kn_block_q4_0 *w = (const kn_block_q4_0 *)blk + b; d[r] = w->d; qs = w->qs; }
                    else { const kn_block_q4_1 *w = (const kn_block_q4_1 *)blk + b; d[r] = w->d; m[r] = w->m; qs = w->qs; }
                    for (int c = 0; c < 8; c++)
                        for (int j = 0; j < 2; j++)
                            q[c * 2 * R + 2 * r + j] = (uint8_t)(q4_at(qs, 2 * c + j) | q4_at(qs, 2 * (c + 8) + j) << 4);
                }
            }
        }
    }
}

/* quant of element e of row r in a record's quant part */
static int rec_quant(kn_dtype t, const uint8_t *q, int r, int e) {
    if (t == KN_Q8_0) return (int8_t)q[(e / 2) * 2 * R + 2 * r + (e & 1)];
    int p = e / 2, hi = p >= 8;
    uint8_t byte = q[(p - 8 * hi) * 2 * R + 2 * r + (e & 1)];
    return hi ? byte >> 4 : byte & 15;
}

static void gemv_scalar(kn_dtype t, const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x,
                        float *y) {
    const int64_t nb = K / KN_QK;
    const size_t rec = kn_qpack_record_bytes(t), sb = scale_bytes(t);
    for (int64_t g = g0; g < g1; g++) {
        float acc[R] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb + b) * rec;
            const uint16_t *d = (const uint16_t *)o, *m = d + R;
            const kn_block_q16 *a = &x[b];
            for (int r = 0; r < R; r++) {
                int32_t sum = 0;
                for (int e = 0; e < KN_QK; e++) sum += rec_quant(t, o + sb, r, e) * a->qs[e];
                float dw = kn_fp16_to_fp32(d[r]);
                if (t == KN_Q8_0) acc[r] += dw * a->d * (float)sum;
                else if (t == KN_Q4_0) acc[r] += dw * (a->d * (float)sum - 8.0f * a->s);
                else acc[r] += dw * a->d * (float)sum + kn_fp16_to_fp32(m[r]) * a->s;
            }
        }
        memcpy(y + (g - g0) * R, acc, sizeof acc);
    }
}
static void gemv_q8_0(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) {
    gemv_scalar(KN_Q8_0, p, g0, g1, K, x, y);
}
static void gemv_q4_0(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) {
    gemv_scalar(KN_Q4_0, p, g0, g1, K, x, y);
}
static void gemv_q4_1(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) {
    gemv_scalar(KN_Q4_1, p, g0, g1, K, x, y);
}

kn_qpack_gemv_fn kn_qpack_gemv_scalar(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return gemv_q8_0;
    case KN_Q4_0: return gemv_q4_0;
    case KN_Q4_1: return gemv_q4_1;
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

kn_qpack_gemv_fn kn_qpack_gemv(kn_dtype t) {
    kn_qpack_gemv_fn f = kn_qpack_gemv_simd(t);
    return f ? f : kn_qpack_gemv_scalar(t);
}

void kn_qpack_dequant_group(kn_dtype t, const void *packed, int64_t g, int64_t K, float *out) {
    const int64_t nb = K / KN_QK;
    const size_t rec = kn_qpack_record_bytes(t), sb = scale_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb + b) * rec;
        const uint16_t *d = (const uint16_t *)o, *m = d + R;
        for (int r = 0; r < R; r++) {
            float dw = kn_fp16_to_fp32(d[r]), mw = t == KN_Q4_1 ? kn_fp16_to_fp32(m[r]) : 0.0f;
            float *row = out + (size_t)r * (size_t)K + b * KN_QK;
            for (int e = 0; e < KN_QK; e++) {
                int q = rec_quant(t, o + sb, r, e);
                row[e] = t == KN_Q4_0 ? dw * (float)(q - 8) : t == KN_Q4_1 ? dw * (float)q + mw : dw * (float)q;
            }
        }
    }
}
