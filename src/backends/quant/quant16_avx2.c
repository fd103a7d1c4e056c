/* quant16_avx2.c: AVX2 dots of block-quantized weights with Q16 activations
 * (16-bit quants per block of 32, f32 scale d and d * sum; backends/quant/quant.h).
 *
 * Weights widen to int16 (vpmovzx/vpmovsx) and multiply with the activation
 * quants through vpmaddwd (s16 x s16 pairs -> s32): the same number of
 * multiply instructions per 32 elements as the 8-bit path (maddubs + madd),
 * one more widening. Integer sums per activation block, one FMA per block
 * with the product of the scales. No sum overflows s32: the largest per
 * block is 32 * 128 * 32767 (Q8_0), 32 * 4096 * 32767 / 16 per lane for the
 * Q6_K products with the scale folded in.
 *
 * Offsets of the unsigned types (Q4_0's -8, Q5_0's -16) and the block
 * minimums (Q4_1/Q5_1 m, K-type dmin * m) use the activation sum s:
 *   sum_j (dw*q_j + c) * da*qa_j = dw*da * sum q*qa + c * s.
 * Compiled with -mavx2 -mfma -mf16c (Makefile rule for *_avx2.c).
 */
#include "backends/quant/quant.h"      /* defines: block structs, kn_block_q16, kn_q45k_sc_m */
#include "backends/quant/quant_x86.h"  /* defines: F16, hsum_ps, f16x2, q6_groups, nibbles32, bits32, load256 */
#include <immintrin.h>

/* 32 bytes (each 0..255) -> two 16 x s16 halves: elements 0..15, 16..31 */
static inline __m256i lo16u(__m256i b) { return _mm256_cvtepu8_epi16(_mm256_castsi256_si128(b)); }
static inline __m256i hi16u(__m256i b) { return _mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1)); }
/* sum over one block of 32: w (two s16 halves) x the block's activation quants */
static inline __m256i madd32(__m256i w0, __m256i w1, const int16_t *q) {
    return _mm256_add_epi32(_mm256_madd_epi16(w0, load256(q)), _mm256_madd_epi16(w1, load256(q + 16)));
}
/* 32 unsigned byte quants x one activation block -> 8 x f32 partial sums (K types) */
static inline __m256 dot_u8(__m256i b, const kn_block_q16 *a) {
    return _mm256_cvtepi32_ps(madd32(lo16u(b), hi16u(b), a->qs));
}

/* ---- 32-element blocks: w = dw * (q - off) or dw * q + m ------------------ */

/* Each type gives, per block: the 32 weight quants as two 16 x s16 halves,
 * and a pair [dw * da, c * s] where c is the block's offset term (m, or
 * -8 dw / -16 dw). Four blocks per iteration into independent accumulators:
 * one block is a short dependent chain, a single accumulator waits on FMA
 * latency. The offset terms are summed as vectors and lane 1 read at the end. */
#define BLOCK32_STEP(QUANTS, SCALES, k, acc)                                            \
    do {                                                                                \
        __m256i w0, w1;                                                                 \
        QUANTS(&w[k], &w0, &w1);                                                        \
        __m128 ds = SCALES(&w[k], &a[k]);                                               \
        __m256 p = _mm256_cvtepi32_ps(madd32(w0, w1, a[k].qs));                         \
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds), p, acc);                       \
        offs = _mm_add_ps(offs, ds);                                                    \
    } while (0)
#define BLOCK32_DOT(name, WT, QUANTS, SCALES)                                           \
    static float name(int64_t n, const void *vw, const void *va) {                      \
        const WT *w = vw; const kn_block_q16 *a = va;                                   \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;       \
        __m128 offs = _mm_setzero_ps();                                                 \
        int64_t nb = n / KN_QK, i = 0;                                                  \
        for (; i + 4 <= nb; i += 4) {                                                   \
            BLOCK32_STEP(QUANTS, SCALES, i, acc0);                                      \
            BLOCK32_STEP(QUANTS, SCALES, i + 1, acc1);                                  \
            BLOCK32_STEP(QUANTS, SCALES, i + 2, acc2);                                  \
            BLOCK32_STEP(QUANTS, SCALES, i + 3, acc3);                                  \
        }                                                                               \
        for (; i < nb; i++) BLOCK32_STEP(QUANTS, SCALES, i, acc0);                      \
        __m256 s = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)); \
        return hsum_ps(s) + _mm_cvtss_f32(_mm_shuffle_ps(offs, offs, 1));               \
    }

/* [da, sa] of an activation block in lanes 0, 1 */
static inline __m128 act_ds(const kn_block_q16 *a) { return _mm_castpd_ps(_mm_load_sd((const double *)&a->d)); }
/* 16 bytes of packed nibbles: low nibbles are elements 0..15, high 16..31.
 * One widening (byte i -> s16 lane i) then mask and shift: one shuffle-port
 * uop per block instead of two. */
static inline void nib_halves(const uint8_t *qs, __m256i *w0, __m256i *w1) {
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
    const __m256i m15 = _mm256_set1_epi16(15);
    *w0 = _mm256_and_si256(b, m15);
    *w1 = _mm256_srli_epi16(b, 4);
}
/* nibbles | 5th bit << 4 (Q5_0/Q5_1) */
static inline void q5_halves(const uint8_t *qs, const uint8_t *qh, __m256i *w0, __m256i *w1) {
    __m256i b = _mm256_or_si256(nibbles32(qs), _mm256_and_si256(bits32(qh), _mm256_set1_epi8(16)));
    *w0 = lo16u(b); *w1 = hi16u(b);
}
static inline void q4_0_q(const kn_block_q4_0 *b, __m256i *w0, __m256i *w1) { nib_halves(b->qs, w0, w1); }
static inline void q4_1_q(const kn_block_q4_1 *b, __m256i *w0, __m256i *w1) { nib_halves(b->qs, w0, w1); }
static inline void q5_0_q(const kn_block_q5_0 *b, __m256i *w0, __m256i *w1) { q5_halves(b->qs, b->qh, w0, w1); }
static inline void q5_1_q(const kn_block_q5_1 *b, __m256i *w0, __m256i *w1) { q5_halves(b->qs, b->qh, w0, w1); }
/* [dw*da, -off*dw*sa] for the offset types, [dw*da, mw*sa] for the min types */
static inline __m128 off_ds(uint16_t d, const kn_block_q16 *a, float off) {
    return _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(F16(d)), act_ds(a)), _mm_setr_ps(1, -off, 0, 0));
}
static inline __m128 q4_0_s(const kn_block_q4_0 *b, const kn_block_q16 *a) { return off_ds(b->d, a, 8); }
static inline __m128 q5_0_s(const kn_block_q5_0 *b, const kn_block_q16 *a) { return off_ds(b->d, a, 16); }
static inline __m128 q4_1_s(const kn_block_q4_1 *b, const kn_block_q16 *a) { return _mm_mul_ps(f16x2(&b->d), act_ds(a)); }
static inline __m128 q5_1_s(const kn_block_q5_1 *b, const kn_block_q16 *a) { return _mm_mul_ps(f16x2(&b->d), act_ds(a)); }

BLOCK32_DOT(dot_q4_0_q16, kn_block_q4_0, q4_0_q, q4_0_s)
BLOCK32_DOT(dot_q4_1_q16, kn_block_q4_1, q4_1_q, q4_1_s)
BLOCK32_DOT(dot_q5_0_q16, kn_block_q5_0, q5_0_q, q5_0_s)
BLOCK32_DOT(dot_q5_1_q16, kn_block_q5_1, q5_1_q, q5_1_s)

/* Four activation rows against one weight row (batched decode: T rows of
 * several sequences meet every weight row): the weight block is widened once
 * for the four, each row keeps one accumulator (four independent FMA chains
 * hide the latency the single dot covers with four accumulators). The same
 * products as four single dots, summed in another order (last-bit rounding
 * differences). as: bytes between the activation rows. */
#define BLOCK32_DOT4_STEP(QUANTS_UNUSED, SCALES, a, k, acc, offs)                        \
    do {                                                                                \
        __m128 ds = SCALES(&w[k], &a[k]);                                               \
        __m256 p = _mm256_cvtepi32_ps(madd32(w0, w1, a[k].qs));                         \
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds), p, acc);                       \
        offs = _mm_add_ps(offs, ds);                                                    \
    } while (0)
#define BLOCK32_DOT4(name, WT, QUANTS, SCALES)                                          \
    static void name(int64_t n, const void *vw, const void *va, size_t as, float *y) {  \
        const WT *w = vw;                                                               \
        const kn_block_q16 *a0 = va, *a1 = (const kn_block_q16 *)((const char *)va + as); \
        const kn_block_q16 *a2 = (const kn_block_q16 *)((const char *)va + 2 * as);     \
        const kn_block_q16 *a3 = (const kn_block_q16 *)((const char *)va + 3 * as);     \
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;                     \
        __m128 o0 = _mm_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;                        \
        for (int64_t i = 0; i < n / KN_QK; i++) {                                       \
            __m256i w0, w1;                                                             \
            QUANTS(&w[i], &w0, &w1);                                                    \
            BLOCK32_DOT4_STEP(QUANTS, SCALES, a0, i, c0, o0);                           \
            BLOCK32_DOT4_STEP(QUANTS, SCALES, a1, i, c1, o1);                           \
            BLOCK32_DOT4_STEP(QUANTS, SCALES, a2, i, c2, o2);                           \
            BLOCK32_DOT4_STEP(QUANTS, SCALES, a3, i, c3, o3);                           \
        }                                                                               \
        y[0] = hsum_ps(c0) + _mm_cvtss_f32(_mm_shuffle_ps(o0, o0, 1));                  \
        y[1] = hsum_ps(c1) + _mm_cvtss_f32(_mm_shuffle_ps(o1, o1, 1));                  \
        y[2] = hsum_ps(c2) + _mm_cvtss_f32(_mm_shuffle_ps(o2, o2, 1));                  \
        y[3] = hsum_ps(c3) + _mm_cvtss_f32(_mm_shuffle_ps(o3, o3, 1));                  \
    }
BLOCK32_DOT4(dot4_q4_0_q16, kn_block_q4_0, q4_0_q, q4_0_s)
BLOCK32_DOT4(dot4_q4_1_q16, kn_block_q4_1, q4_1_q, q4_1_s)
BLOCK32_DOT4(dot4_q5_0_q16, kn_block_q5_0, q5_0_q, q5_0_s)
BLOCK32_DOT4(dot4_q5_1_q16, kn_block_q5_1, q5_1_q, q5_1_s)

/* Q8_0: signed weights widen with vpmovsx; no offset term */
static inline void q8_0_q(const kn_block_q8_0 *b, __m256i *w0, __m256i *w1) {
    *w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->qs));
    *w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b->qs + 16)));
}
static inline __m128 q8_0_s(const kn_block_q8_0 *b, const kn_block_q16 *a) { return _mm_set_ss(F16(b->d) * a->d); }
BLOCK32_DOT(dot_q8_0_q16, kn_block_q8_0, q8_0_q, q8_0_s)
BLOCK32_DOT4(dot4_q8_0_q16, kn_block_q8_0, q8_0_q, q8_0_s)

/* ---- K types: 256-element super-blocks, 8 activation blocks each ------------- */

/* Q4_K/Q5_K: sub-block j (32 elements) = low (j even) or high (j odd) nibbles
 * of the 32 bytes of chunk j/2; Q5_K adds bit j of qh[l] as bit 4. */
static float dot_q45_K(int64_t n, const uint8_t *base, size_t bsize,
                                                             const kn_block_q16 *a, const bool five) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float mins = 0;
    const __m256i m15 = _mm256_set1_epi8(15), b16 = _mm256_set1_epi8(16);
    for (int64_t i = 0; i < n / KN_QK_K; i++, base += bsize, a += 8) {
        /* d, dmin, scales[12] lead both layouts; Q5_K has qh[32] before qs */
        const uint16_t *dd = (const uint16_t *)base;
        const uint8_t *scales = base + 4, *qh = base + 16, *qs = base + (five ? 48 : 16);
        float d = F16(dd[0]), mb = 0;
        __m256i hb = five ? load256(qh) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i raw = load256(qs + 32 * c);
            __m256i q0 = _mm256_and_si256(raw, m15), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
            if (five) {     /* bits 2c and 2c+1 of each qh byte -> 16 */
                __m256i h0 = _mm256_set1_epi8((char)(1 << (2 * c))), h1 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
                q0 = _mm256_or_si256(q0, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, h0), h0), b16));
                q1 = _mm256_or_si256(q1, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, h1), h1), b16));
            }
            const kn_block_q16 *a0 = &a[2 * c], *a1 = &a[2 * c + 1];
            int sc0, m0, sc1, m1;          /* from the bytes directly: cheaper here than unpack_sc_m */
            kn_q45k_sc_m(scales, 2 * c, &sc0, &m0);
            kn_q45k_sc_m(scales, 2 * c + 1, &sc1, &m1);
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc0 * a0->d), dot_u8(q0, a0), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc1 * a1->d), dot_u8(q1, a1), acc1);
            mb += (float)m0 * a0->s + (float)m1 * a1->s;
        }
        mins += F16(dd[1]) * mb;      /* x = d*sc*q - dmin*m */
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1)) - mins;
}
static float dot_q4_K_q16(int64_t n, const void *w, const void *a) {
    return dot_q45_K(n, w, sizeof(kn_block_q4_K), a, false);
}
static float dot_q5_K_q16(int64_t n, const void *w, const void *a) {
    return dot_q45_K(n, w, sizeof(kn_block_q5_K), a, true);
}

/* Q6_K: per half of 128, four groups of 32 (one activation block each; the
 * bit layout is in quant.h), each group two 16-element sub-blocks with int8
 * scales. The scale is folded into the int16 weights: (q - 32) * sc fits
 * (|.| <= 32 * 128), so one vpmaddwd pair per group. */
static float dot_q6_K_q16(int64_t n, const void *vw, const void *va) {
    const kn_block_q6_K *w = vw; const kn_block_q16 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i c32 = _mm256_set1_epi16(32);
    for (int64_t i = 0; i < n / KN_QK_K; i++, a += 8) {
        float d = F16(w[i].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h;
            const int8_t *sc = w[i].scales + 8 * h;
            __m256i q[4];
            q6_groups(ql, w[i].qh + 32 * h, q);
            for (int g = 0; g < 4; g++) {
                const kn_block_q16 *ab = &a[4 * h + g];
                __m256i w0 = _mm256_mullo_epi16(_mm256_sub_epi16(lo16u(q[g]), c32), _mm256_set1_epi16(sc[2 * g]));
                __m256i w1 = _mm256_mullo_epi16(_mm256_sub_epi16(hi16u(q[g]), c32), _mm256_set1_epi16(sc[2 * g + 1]));
                __m256 p = _mm256_cvtepi32_ps(madd32(w0, w1, ab->qs));
                if (g & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), p, acc1);
                else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), p, acc0);
            }
        }
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

kn_vec_dot_fn kn_quant_q16_avx2_dot(kn_dtype t) {
    switch (t) {
    case KN_Q4_0: return dot_q4_0_q16;
    case KN_Q4_1: return dot_q4_1_q16;
    case KN_Q5_0: return dot_q5_0_q16;
    case KN_Q5_1: return dot_q5_1_q16;
    case KN_Q8_0: return dot_q8_0_q16;
    case KN_Q4_K: return dot_q4_K_q16;
    case KN_Q5_K: return dot_q5_K_q16;
    case KN_Q6_K: return dot_q6_K_q16;
    default: return NULL;
    }
}

kn_vec_dot4_fn kn_quant_q16_avx2_dot4(kn_dtype t) {
    switch (t) {
    case KN_Q4_0: return dot4_q4_0_q16;
    case KN_Q4_1: return dot4_q4_1_q16;
    case KN_Q5_0: return dot4_q5_0_q16;
    case KN_Q5_1: return dot4_q5_1_q16;
    case KN_Q8_0: return dot4_q8_0_q16;
    default: return NULL;
    }
}

/* ---- quantizer ------------------------------------------------------------- */

/* Bit-identical to the scalar kn_quantize_q16 (same d, same round-to-nearest-
 * even through vcvtps2dq). Returns false, leaving y partly written, when x
 * holds a non-finite value (the caller reports it). */
bool kn_quant_q16_avx2(const float *x, kn_block_q16 *y, int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 bad = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += KN_QK) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        /* x - x is NaN exactly for inf and NaN */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v0, v0), _mm256_sub_ps(v1, v1), _CMP_UNORD_Q));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v2, v2), _mm256_sub_ps(v3, v3), _CMP_UNORD_Q));
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 32767, id = d != 0 ? 1 / d : 0;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        const __m256i lo = _mm256_set1_epi32(-32767);
        i0 = _mm256_max_epi32(i0, lo); i1 = _mm256_max_epi32(i1, lo); i2 = _mm256_max_epi32(i2, lo); i3 = _mm256_max_epi32(i3, lo);
        int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        /* packs saturates to 32767 and works within 128-bit lanes: fix the order */
        __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xd8);
        __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xd8);
        _mm256_storeu_si256((__m256i *)y[i].qs, p0);
        _mm256_storeu_si256((__m256i *)(y[i].qs + 16), p1);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
    return _mm256_movemask_ps(bad) == 0;
}
