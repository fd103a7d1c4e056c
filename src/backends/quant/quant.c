/* quant.c: scalar reference (de)quantization and dot products for the GGUF
 * block types, plus the run-time dispatch to the AVX2 / AVX-512 kernels.
 *
 * The scalar dots here are the oracle: they read every block field directly
 * (they never use the redundant Q8_K bsums or the Q8_1 sum field s, except
 * where the ggml definition of the Q4_1/Q5_1 dot needs s) and sum integer
 * products per block exactly, like the SIMD kernels do.
 * Non-goals: speed of (de)quantization (activations are one row per token).
 */
#include "backends/quant/quant.h"      /* defines: block structs, kn_quantize_row, ...   */
#include "core/cpu.h"       /* defines: kn_cpu, KN_ISA_*                      */
#include "core/fp16.h"      /* defines: kn_fp16_to_fp32, kn_fp32_to_fp16, bf16 */
#include <math.h>
#include <string.h>

#define F16(x) kn_fp16_to_fp32(x)

/* ---- helpers ------------------------------------------------------------- */

static inline int nearest_int(float x) { return (int)lrintf(x); }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void put_sc_m(uint8_t *s, const uint8_t sc[8], const uint8_t m[8]) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) { s[j] |= sc[j] & 63; s[j + 4] |= m[j] & 63; }
        else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | ((m[j] & 15) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

/* ---- dequantization ------------------------------------------------------ */

static void deq_q4_0(const kn_block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * ((x[i].qs[j] & 15) - 8);
            y[j + 16] = d * ((x[i].qs[j] >> 4) - 8);
        }
    }
}
static void deq_q4_1(const kn_block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d), m = F16(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (x[i].qs[j] & 15) + m;
            y[j + 16] = d * (x[i].qs[j] >> 4) + m;
        }
    }
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void deq_q5_0(const kn_block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d);
        uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (x[i].qs[j] & 15) | ((qh >> j) & 1) << 4;
            int q1 = (x[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (q0 - 16);
            y[j + 16] = d * (q1 - 16);
        }
    }
}
static void deq_q5_1(const kn_block_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d), m = F16(x[i].m);
        uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (x[i].qs[j] & 15) | ((qh >> j) & 1) << 4;
            int q1 = (x[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * q0 + m;
            y[j + 16] = d * q1 + m;
        }
    }
}
static void deq_q8_0(const kn_block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d);
        for (int j = 0; j < KN_QK; j++) y[j] = d * x[i].qs[j];
    }
}
static void deq_q8_1(const kn_block_q8_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK) {
        float d = F16(x[i].d);
        for (int j = 0; j < KN_QK; j++) y[j] = d * x[i].qs[j];
    }
}
static void deq_q4_K(const kn_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = F16(x[i].d), dmin = F16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int c = 0; c < 4; c++, q += 32) {      /* chunk of 64: sub-blocks 2c, 2c+1 */
            int sc0, m0, sc1, m1;
            kn_q45k_sc_m(x[i].scales, 2 * c, &sc0, &m0);
            kn_q45k_sc_m(x[i].scales, 2 * c + 1, &sc1, &m1);
            float d0 = d * sc0, n0 = dmin * m0, d1 = d * sc1, n1 = dmin * m1;
            for (int l = 0; l < 32; l++) *y++ = d0 * (q[l] & 15) - n0;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] >> 4) - n1;
        }
    }
}
static void deq_q5_K(const kn_block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = F16(x[i].d), dmin = F16(x[i].dmin);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        for (int c = 0; c < 4; c++, q += 32) {
            int sc0, m0, sc1, m1;
            kn_q45k_sc_m(x[i].scales, 2 * c, &sc0, &m0);
            kn_q45k_sc_m(x[i].scales, 2 * c + 1, &sc1, &m1);
            float d0 = d * sc0, n0 = dmin * m0, d1 = d * sc1, n1 = dmin * m1;
            for (int l = 0; l < 32; l++)
                *y++ = d0 * ((q[l] & 15) | ((qh[l] >> (2 * c)) & 1) << 4) - n0;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4) - n1;
        }
    }
}
static void deq_q6_K(const kn_block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = F16(x[i].d);
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 128; e++)
                *y++ = d * x[i].scales[8 * h + e / 16] * (kn_q6k_at(&x[i], 128 * h + e) - 32);
    }
}
static void deq_q8_K(const kn_block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += KN_QK_K)
        for (int j = 0; j < KN_QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

/* ---- quantization -------------------------------------------------------- */

/* Value of largest magnitude (keeps its sign), and the max |x|. */
static float signed_absmax(const float *x, int n, float *amax) {
    float m = 0, a = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > a) { a = fabsf(x[j]); m = x[j]; }
    *amax = a;
    return m;
}

/* Symmetric blocks: d = extremum / -half so the extremum maps to -half; q in [0, 2*half). */
static void q_sym(const float *x, int half, uint16_t *d16, uint8_t *q) {
    float amax, m = signed_absmax(x, KN_QK, &amax);
    *d16 = kn_fp32_to_fp16(m / -half);
    float d = F16(*d16), id = d != 0 ? 1.0f / d : 0;
    for (int j = 0; j < KN_QK; j++) q[j] = (uint8_t)clampi(nearest_int(x[j] * id) + half, 0, 2 * half - 1);
}
/* Asymmetric blocks: x = d*q + m, q in [0, levels]. */
static void q_asym(const float *x, int levels, uint16_t *d16, uint16_t *m16, uint8_t *q) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < KN_QK; j++) { lo = fminf(lo, x[j]); hi = fmaxf(hi, x[j]); }
    *d16 = kn_fp32_to_fp16((hi - lo) / levels);
    *m16 = kn_fp32_to_fp16(lo);
    float d = F16(*d16), m = F16(*m16), id = d != 0 ? 1.0f / d : 0;
    for (int j = 0; j < KN_QK; j++) q[j] = (uint8_t)clampi(nearest_int((x[j] - m) * id), 0, levels);
}
static void pack_nibbles(const uint8_t q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
}
static void pack_qh32(const uint8_t q[32], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void quant_q4_0(const float *x, kn_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        uint8_t q[32]; q_sym(x, 8, &y[i].d, q); pack_nibbles(q, y[i].qs);
    }
}
static void quant_q4_1(const float *x, kn_block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        uint8_t q[32]; q_asym(x, 15, &y[i].d, &y[i].m, q); pack_nibbles(q, y[i].qs);
    }
}
static void quant_q5_0(const float *x, kn_block_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        uint8_t q[32]; q_sym(x, 16, &y[i].d, q);
        pack_nibbles(q, y[i].qs); pack_qh32(q, y[i].qh);
    }
}
static void quant_q5_1(const float *x, kn_block_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        uint8_t q[32]; q_asym(x, 31, &y[i].d, &y[i].m, q);
        pack_nibbles(q, y[i].qs); pack_qh32(q, y[i].qh);
    }
}
/* Q8 blocks: d = amax / 127 (rounded to fp16 first), q = round(x / d) in [-127, 127]. */
static void q8_block(const float *x, int n, float d, int8_t *q) {
    float id = d != 0 ? 1.0f / d : 0;
    for (int j = 0; j < n; j++) q[j] = (int8_t)clampi(nearest_int(x[j] * id), -127, 127);
}
static void quant_q8_0(const float *x, kn_block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        float amax; signed_absmax(x, KN_QK, &amax);
        y[i].d = kn_fp32_to_fp16(amax / 127);
        q8_block(x, KN_QK, F16(y[i].d), y[i].qs);
    }
}
static void quant_q8_1(const float *x, kn_block_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        float amax; signed_absmax(x, KN_QK, &amax);
        y[i].d = kn_fp32_to_fp16(amax / 127);
        q8_block(x, KN_QK, F16(y[i].d), y[i].qs);
        int sum = 0;
        for (int j = 0; j < KN_QK; j++) sum += y[i].qs[j];
        y[i].s = kn_fp32_to_fp16(F16(y[i].d) * (float)sum);
    }
}
static void quant_q8_K(const float *x, kn_block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK_K) {
        float amax; signed_absmax(x, KN_QK_K, &amax);
        y[i].d = amax / 127;
        q8_block(x, KN_QK_K, y[i].d, y[i].qs);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
    }
}
/* Q4_K / Q5_K: per 32-sub-block x ~ scale*q - min with min = -min(0, lo) >= 0,
 * scale = (hi + min) / levels; then 6-bit sc/m against the super-block d/dmin,
 * and the quants recomputed with the rounded scales. */
static void quant_kq(const float *x, int levels, uint16_t *d16, uint16_t *dmin16,
                     uint8_t scales[12], uint8_t q[256]) {
    float scale[8], mn[8], maxs = 0, maxm = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0;   /* range always includes 0: min stays >= 0 */
        for (int l = 0; l < 32; l++) { lo = fminf(lo, x[32 * j + l]); hi = fmaxf(hi, x[32 * j + l]); }
        mn[j] = -lo;
        scale[j] = (hi - lo) / levels;
        maxs = fmaxf(maxs, scale[j]); maxm = fmaxf(maxm, mn[j]);
    }
    *d16 = kn_fp32_to_fp16(maxs / 63);
    *dmin16 = kn_fp32_to_fp16(maxm / 63);
    float d = F16(*d16), dmin = F16(*dmin16);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)clampi(d != 0 ? nearest_int(scale[j] / d) : 0, 0, 63);
        m[j] = (uint8_t)clampi(dmin != 0 ? nearest_int(mn[j] / dmin) : 0, 0, 63);
        float ds = d * sc[j], dm = dmin * m[j], id = ds != 0 ? 1.0f / ds : 0;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)clampi(nearest_int((x[32 * j + l] + dm) * id), 0, levels);
    }
    put_sc_m(scales, sc, m);
}
static void quant_q4_K(const float *x, kn_block_q4_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK_K) {
        uint8_t q[256];
        quant_kq(x, 15, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}
static void quant_q5_K(const float *x, kn_block_q5_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK_K) {
        uint8_t q[256];
        quant_kq(x, 31, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int a = q[64 * c + l], b = q[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((a & 15) | (b & 15) << 4);
                y[i].qh[l] |= (uint8_t)(((a >> 4) & 1) << (2 * c) | ((b >> 4) & 1) << (2 * c + 1));
            }
    }
}
/* Q6_K: per 16-sub-block scale = extremum / -32; 8-bit signed scales against d. */
static void quant_q6_K(const float *x, kn_block_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += KN_QK_K) {
        float scale[16], maxa = 0;
        for (int j = 0; j < 16; j++) {
            float a, m = signed_absmax(x + 16 * j, 16, &a);
            scale[j] = m / -32;
            maxa = fmaxf(maxa, fabsf(scale[j]));
        }
        y[i].d = kn_fp32_to_fp16(maxa / 127);
        float d = F16(y[i].d);
        uint8_t q[256];
        for (int j = 0; j < 16; j++) {
            int s = clampi(d != 0 ? nearest_int(scale[j] / d) : 0, -128, 127);
            y[i].scales[j] = (int8_t)s;
            float ds = d * s, id = ds != 0 ? 1.0f / ds : 0;
            for (int l = 0; l < 16; l++)
                q[16 * j + l] = (uint8_t)clampi(nearest_int(x[16 * j + l] * id) + 32, 0, 63);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((qq[l] & 15) | (qq[l + 64] & 15) << 4);
                ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
                qh[l] = (uint8_t)((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 |
                                  (qq[l + 64] >> 4) << 4 | (qq[l + 96] >> 4) << 6);
            }
        }
    }
}

/* ---- scalar dot products (the reference) --------------------------------- */

static float dot_q4_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_0 *w = vw; const kn_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += ((w[i].qs[j] & 15) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        sum += F16(w[i].d) * F16(a[i].d) * (float)s;
    }
    return sum;
}
static float dot_q4_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_1 *w = vw; const kn_block_q8_1 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += (w[i].qs[j] & 15) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
        sum += F16(w[i].d) * F16(a[i].d) * (float)s + F16(w[i].m) * F16(a[i].s);
    }
    return sum;
}
static float dot_q5_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q5_0 *w = vw; const kn_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        uint32_t qh = le32(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((w[i].qs[j] & 15) | ((qh >> j) & 1) << 4) - 16;
            int q1 = ((w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16;
            s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        sum += F16(w[i].d) * F16(a[i].d) * (float)s;
    }
    return sum;
}
static float dot_q5_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q5_1 *w = vw; const kn_block_q8_1 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        uint32_t qh = le32(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (w[i].qs[j] & 15) | ((qh >> j) & 1) << 4;
            int q1 = (w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        sum += F16(w[i].d) * F16(a[i].d) * (float)s + F16(w[i].m) * F16(a[i].s);
    }
    return sum;
}
static float dot_q8_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_0 *w = vw; const kn_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        int s = 0;
        for (int j = 0; j < KN_QK; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += F16(w[i].d) * F16(a[i].d) * (float)s;
    }
    return sum;
}
static float dot_q8_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_1 *w = vw; const kn_block_q8_1 *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK; i++) {
        int s = 0;
        for (int j = 0; j < KN_QK; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += F16(w[i].d) * F16(a[i].d) * (float)s;
    }
    return sum;
}
static float dot_q4_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_K *w = vw; const kn_block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, s = 0, sy = 0;
            kn_q45k_sc_m(w[i].scales, j, &sc, &m);
            const uint8_t *q = w[i].qs + 32 * (j / 2);
            const int8_t *y = a[i].qs + 32 * j;
            for (int l = 0; l < 32; l++) {
                s += ((j & 1) ? q[l] >> 4 : q[l] & 15) * y[l];
                sy += y[l];
            }
            sumi += sc * s; summ += m * sy;
        }
        sum += a[i].d * (F16(w[i].d) * (float)sumi - F16(w[i].dmin) * (float)summ);
    }
    return sum;
}
static float dot_q5_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q5_K *w = vw; const kn_block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, s = 0, sy = 0;
            kn_q45k_sc_m(w[i].scales, j, &sc, &m);
            const uint8_t *q = w[i].qs + 32 * (j / 2);
            const int8_t *y = a[i].qs + 32 * j;
            for (int l = 0; l < 32; l++) {
                int v = ((j & 1) ? q[l] >> 4 : q[l] & 15) | ((w[i].qh[l] >> j) & 1) << 4;
                s += v * y[l];
                sy += y[l];
            }
            sumi += sc * s; summ += m * sy;
        }
        sum += a[i].d * (F16(w[i].d) * (float)sumi - F16(w[i].dmin) * (float)summ);
    }
    return sum;
}
static float dot_q6_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q6_K *w = vw; const kn_block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 8; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++) {
                    int e = 16 * j + l;
                    s += (kn_q6k_at(&w[i], 128 * h + e) - 32) * a[i].qs[128 * h + e];
                }
                sumi += w[i].scales[8 * h + j] * s;
            }
        sum += a[i].d * F16(w[i].d) * (float)sumi;
    }
    return sum;
}
static float dot_q8_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_K *w = vw; const kn_block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        int s = 0;
        for (int j = 0; j < KN_QK_K; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += w[i].d * a[i].d * (float)s;
    }
    return sum;
}
/* Float rows: 8 partial sums so the scalar build still pipelines. */
static float dot_f32_f32(int64_t n, const void *vw, const void *va) {
    const float *w = vw, *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += w[i + k] * a[i + k];
    for (; i < n; i++) s[0] += w[i] * a[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
static float dot_f16_f32(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw; const float *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += F16(w[i + k]) * a[i + k];
    for (; i < n; i++) s[0] += F16(w[i]) * a[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
static float dot_bf16_f32(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw; const float *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += kn_bf16_to_fp32(w[i + k]) * a[i + k];
    for (; i < n; i++) s[0] += kn_bf16_to_fp32(w[i]) * a[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static kn_vec_dot_fn scalar_dot(kn_dtype t) {
    switch (t) {
    case KN_F32: return dot_f32_f32;
    case KN_F16: return dot_f16_f32;
    case KN_BF16: return dot_bf16_f32;
    case KN_Q4_0: return dot_q4_0_q8_0;
    case KN_Q4_1: return dot_q4_1_q8_1;
    case KN_Q5_0: return dot_q5_0_q8_0;
    case KN_Q5_1: return dot_q5_1_q8_1;
    case KN_Q8_0: return dot_q8_0_q8_0;
    case KN_Q8_1: return dot_q8_1_q8_1;
    case KN_Q4_K: return dot_q4_K_q8_K;
    case KN_Q5_K: return dot_q5_K_q8_K;
    case KN_Q6_K: return dot_q6_K_q8_K;
    case KN_Q8_K: return dot_q8_K_q8_K;
    default: return NULL;
    }
}

/* ---- public entry points -------------------------------------------------- */

static int g_force = -1, g_no_vnni;

void kn_quant_force_isa(int isa) { g_force = isa; }
void kn_quant_force_no_vnni(int on) { g_no_vnni = on; }

int kn_quant_isa(void) {
    int isa = (int)kn_cpu()->isa;
    if (g_force >= 0 && g_force < isa) isa = g_force;
    return isa;
}

kn_vec_dot_fn kn_quant_dot_fn(kn_dtype t) {
    kn_vec_dot_fn f = NULL;
    int isa = kn_quant_isa();
    (void)isa;
#ifdef KN_QUANT_AVX512
    if (isa >= KN_ISA_AVX512) f = kn_quant_avx512_dot(t, kn_cpu()->avx512vnni && !g_no_vnni);
#endif
#ifdef KN_QUANT_X86
    if (!f && isa >= KN_ISA_AVX2) f = kn_quant_avx2_dot(t);
#endif
    return f ? f : scalar_dot(t);
}

kn_dtype kn_quant_vec_dot_type(kn_dtype t) {
    switch (t) {
    case KN_F32: case KN_F16: case KN_BF16: return KN_F32;
    case KN_Q4_0: case KN_Q5_0: case KN_Q8_0: return KN_Q8_0;
    case KN_Q4_1: case KN_Q5_1: case KN_Q8_1: return KN_Q8_1;
    case KN_Q4_K: case KN_Q5_K: case KN_Q6_K: case KN_Q8_K: return KN_Q8_K;
    default: return KN_DTYPE_COUNT;
    }
}

/* Validates (t, n) for a row op; returns the block size or sets an error. */
static kn_status check_row(const char *fn, kn_dtype t, int64_t n, const void *p, const void *q) {
    const kn_dtype_info *di = kn_dtype_get(t);
    if (!di) return kn_set_error(KN_ERR_INVALID, "%s: unknown dtype %d; pass a kn_dtype value", fn, (int)t);
    if (!p || !q) return kn_set_error(KN_ERR_INVALID, "%s(%s): NULL pointer argument", fn, di->name);
    if (n < 0 || n % di->block_size)
        return kn_set_error(KN_ERR_INVALID, "%s(%s): n = %lld is not a non-negative multiple of the "
                            "block size %lld; pad the row or use another dtype",
                            fn, di->name, (long long)n, (long long)di->block_size);
    return KN_OK;
}

kn_status kn_dequantize_row(kn_dtype t, const void *src, float *dst, int64_t n) {
    kn_status st = check_row("kn_dequantize_row", t, n, src, dst);
    if (st) return st;
    int64_t nb = n / kn_dtype_get(t)->block_size;
    switch (t) {
    case KN_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case KN_F16: { const uint16_t *s = src; for (int64_t i = 0; i < n; i++) dst[i] = F16(s[i]); } break;
    case KN_BF16: { const uint16_t *s = src; for (int64_t i = 0; i < n; i++) dst[i] = kn_bf16_to_fp32(s[i]); } break;
    case KN_Q4_0: deq_q4_0(src, dst, nb); break;
    case KN_Q4_1: deq_q4_1(src, dst, nb); break;
    case KN_Q5_0: deq_q5_0(src, dst, nb); break;
    case KN_Q5_1: deq_q5_1(src, dst, nb); break;
    case KN_Q8_0: deq_q8_0(src, dst, nb); break;
    case KN_Q8_1: deq_q8_1(src, dst, nb); break;
    case KN_Q4_K: deq_q4_K(src, dst, nb); break;
    case KN_Q5_K: deq_q5_K(src, dst, nb); break;
    case KN_Q6_K: deq_q6_K(src, dst, nb); break;
    case KN_Q8_K: deq_q8_K(src, dst, nb); break;
    default:
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_dequantize_row: dtype %s cannot be dequantized to f32; "
                            "only f32/f16/bf16 and the block-quantized types can", kn_dtype_name(t));
    }
    return KN_OK;
}

kn_status kn_quantize_row(kn_dtype t, const float *src, void *dst, int64_t n) {
    kn_status st = check_row("kn_quantize_row", t, n, src, dst);
    if (st) return st;
    if (kn_quant_vec_dot_type(t) == KN_DTYPE_COUNT)
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_quantize_row: cannot quantize f32 to %s; "
                            "only f32/f16/bf16 and the block-quantized types are targets", kn_dtype_name(t));
    if (kn_dtype_get(t)->is_quant)
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(src[i]))
                return kn_set_error(KN_ERR_INVALID, "kn_quantize_row(%s): src[%lld] = %g is not finite; "
                                    "block quantization needs finite values", kn_dtype_name(t),
                                    (long long)i, (double)src[i]);
    int64_t nb = n / kn_dtype_get(t)->block_size;
    switch (t) {
    case KN_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case KN_F16: { uint16_t *d = dst; for (int64_t i = 0; i < n; i++) d[i] = kn_fp32_to_fp16(src[i]); } break;
    case KN_BF16: { uint16_t *d = dst; for (int64_t i = 0; i < n; i++) d[i] = kn_fp32_to_bf16(src[i]); } break;
    case KN_Q4_0: quant_q4_0(src, dst, nb); break;
    case KN_Q4_1: quant_q4_1(src, dst, nb); break;
    case KN_Q5_0: quant_q5_0(src, dst, nb); break;
    case KN_Q5_1: quant_q5_1(src, dst, nb); break;
#if !defined(KN_NO_X86)
    case KN_Q8_0: if (kn_quant_isa() >= KN_ISA_AVX2) kn_quant_q8_0_avx2(src, dst, nb); else quant_q8_0(src, dst, nb); break;
    case KN_Q8_1: if (kn_quant_isa() >= KN_ISA_AVX2) kn_quant_q8_1_avx2(src, dst, nb); else quant_q8_1(src, dst, nb); break;
#else
    case KN_Q8_0: quant_q8_0(src, dst, nb); break;
    case KN_Q8_1: quant_q8_1(src, dst, nb); break;
#endif
    case KN_Q4_K: quant_q4_K(src, dst, nb); break;
    case KN_Q5_K: quant_q5_K(src, dst, nb); break;
    case KN_Q6_K: quant_q6_K(src, dst, nb); break;
    case KN_Q8_K: quant_q8_K(src, dst, nb); break;
    default: break;   /* excluded above */
    }
    return KN_OK;
}

float kn_quant_vec_dot(kn_dtype t, int64_t n, const void *w, const void *a) {
    if (check_row("kn_quant_vec_dot", t, n, w, a)) return NAN;
    kn_vec_dot_fn f = kn_quant_dot_fn(t);
    if (!f) {
        kn_set_error(KN_ERR_UNSUPPORTED, "kn_quant_vec_dot: no dot product for dtype %s; "
                     "convert the weights to f32/f16/bf16 or a block-quantized type", kn_dtype_name(t));
        return NAN;
    }
    return f(n, w, a);
}

void kn_quant_matvec_rows(kn_dtype t, int64_t n, const void *W, size_t row_bytes,
                          const void *a, float *y, int64_t r0, int64_t r1) {
    if (!y || r0 < 0 || r1 < r0) {
        kn_set_error(KN_ERR_INVALID, "kn_quant_matvec_rows: bad output or row range [%lld, %lld); "
                     "need y != NULL and 0 <= r0 <= r1", (long long)r0, (long long)r1);
        return;
    }
    kn_vec_dot_fn f = NULL;
    if (!check_row("kn_quant_matvec_rows", t, n, W, a)) {
        f = kn_quant_dot_fn(t);
        if (!f)
            kn_set_error(KN_ERR_UNSUPPORTED, "kn_quant_matvec_rows: no dot product for dtype %s; "
                         "convert the weights to a supported type", kn_dtype_name(t));
        else if (row_bytes < kn_dtype_nbytes(t, n)) {
            kn_set_error(KN_ERR_INVALID, "kn_quant_matvec_rows(%s): row_bytes %zu is smaller than one row "
                         "of %lld elements (%zu bytes); pass the true row stride",
                         kn_dtype_name(t), row_bytes, (long long)n, kn_dtype_nbytes(t, n));
            f = NULL;
        }
    }
    if (!f) { for (int64_t r = r0; r < r1; r++) y[r] = NAN; return; }
    const char *base = W;
    /* no software prefetch: measured slower than the hardware prefetchers */
    for (int64_t r = r0; r < r1; r++) y[r] = f(n, base + (size_t)r * row_bytes, a);
}
