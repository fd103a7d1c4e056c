/* quant_avx2.c: AVX2 + FMA + F16C dot products for the GGUF block types.
 * Each function computes what its scalar twin in quant.c computes (same
 * name, same integer sums per block), only the float accumulation order
 * differs. Integer products use maddubs (u8 x s8 -> s16 pairs) then madd
 * (s16 pairs -> s32); no sum can saturate s16 (largest: 128*127*2 for Q8_0,
 * with activation quants in [-127, 127] as quant.h requires).
 * Compiled with -mavx2 -mfma -mf16c (Makefile rule for *_avx2.c).
 */
#include "backends/quant/quant.h"      /* defines: block structs, kn_vec_dot_fn */
#include "core/fp16.h"      /* defines: kn_bf16_to_fp32 */
#include "backends/quant/quant_x86.h"  /* defines: F16, hsum_ps, f16x2, unpack_sc_m, q6_groups, ... */
#include <immintrin.h>
#include <string.h>

/* u8 x s8, groups of 4 -> 8 x s32. */
static inline __m256i dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* s8 x s8 (a in [-127,127] for the second operand) -> 8 x s32. */
static inline __m256i dot_ss(__m256i w, __m256i a) {
    return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}
/* ---- 32-element blocks --------------------------------------------------- */

static float dot_q4_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_0 *w = vw; const kn_block_q8_0 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i q0 = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(8));
        __m256i q1 = _mm256_sub_epi8(nibbles32(w[i + 1].qs), _mm256_set1_epi8(8));
        __m256 p0 = _mm256_cvtepi32_ps(dot_ss(q0, load256(a[i].qs)));
        __m256 p1 = _mm256_cvtepi32_ps(dot_ss(q1, load256(a[i + 1].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i + 1].d) * F16(a[i + 1].d)), p1, acc1);
    }
    for (; i < nb; i++) {
        __m256i q0 = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(8));
        __m256 p0 = _mm256_cvtepi32_ps(dot_ss(q0, load256(a[i].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p0, acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* Q4_1/Q5_1: one conversion gives [dw, mw] x [da, sa] = [dw*da, mw*sa]; lane 1
 * (the min term) is summed in a vector, lane 0 broadcast as the block scale. */
/* Four blocks per iteration with independent accumulators: one block's work
 * is a short chain (unpack, maddubs, madd, convert, fma), so a single
 * accumulator leaves the core waiting on FMA latency. The m * s terms (block
 * minimum times activation sum) are summed as 4-lane vectors of (d*d, m*s)
 * pairs and folded at the end. */
static float dot_q4_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_1 *w = vw; const kn_block_q8_1 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    __m128 summ0 = _mm_setzero_ps(), summ1 = _mm_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m128 ds0 = _mm_mul_ps(f16x2(&w[i].d), f16x2(&a[i].d));
        __m128 ds1 = _mm_mul_ps(f16x2(&w[i + 1].d), f16x2(&a[i + 1].d));
        __m128 ds2 = _mm_mul_ps(f16x2(&w[i + 2].d), f16x2(&a[i + 2].d));
        __m128 ds3 = _mm_mul_ps(f16x2(&w[i + 3].d), f16x2(&a[i + 3].d));
        __m256 p0 = _mm256_cvtepi32_ps(dot_us(nibbles32(w[i].qs), load256(a[i].qs)));
        __m256 p1 = _mm256_cvtepi32_ps(dot_us(nibbles32(w[i + 1].qs), load256(a[i + 1].qs)));
        __m256 p2 = _mm256_cvtepi32_ps(dot_us(nibbles32(w[i + 2].qs), load256(a[i + 2].qs)));
        __m256 p3 = _mm256_cvtepi32_ps(dot_us(nibbles32(w[i + 3].qs), load256(a[i + 3].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds0), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds1), p1, acc1);
        acc2 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds2), p2, acc2);
        acc3 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds3), p3, acc3);
        summ0 = _mm_add_ps(summ0, _mm_add_ps(ds0, ds1));
        summ1 = _mm_add_ps(summ1, _mm_add_ps(ds2, ds3));
    }
    for (; i < nb; i++) {
        __m128 ds = _mm_mul_ps(f16x2(&w[i].d), f16x2(&a[i].d));
        __m256 p = _mm256_cvtepi32_ps(dot_us(nibbles32(w[i].qs), load256(a[i].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds), p, acc0);
        summ0 = _mm_add_ps(summ0, ds);
    }
    __m128 summ = _mm_add_ps(summ0, summ1);
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + _mm_cvtss_f32(_mm_movehdup_ps(summ));
}

static float dot_q5_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q5_0 *w = vw; const kn_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KN_QK; i++) {
        /* q - 16 = nibble | 0xf0 (i.e. nibble - 16) where the 5th bit is clear */
        __m256i hi = _mm256_andnot_si256(bits32(w[i].qh), _mm256_set1_epi8((char)0xf0));
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), hi);
        __m256 p = _mm256_cvtepi32_ps(dot_ss(q, load256(a[i].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p, acc);
    }
    return hsum_ps(acc);
}

static float dot_q5_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q5_1 *w = vw; const kn_block_q8_1 *a = va;
    __m256 acc = _mm256_setzero_ps();
    __m128 summ = _mm_setzero_ps();
    for (int64_t i = 0; i < n / KN_QK; i++) {
        __m128 ds = _mm_mul_ps(f16x2(&w[i].d), f16x2(&a[i].d));
        __m256i hi = _mm256_and_si256(bits32(w[i].qh), _mm256_set1_epi8(0x10));
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), hi);
        __m256 p = _mm256_cvtepi32_ps(dot_us(q, load256(a[i].qs)));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds), p, acc);
        summ = _mm_add_ps(summ, ds);
    }
    return hsum_ps(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summ));
}

static float dot_q8_0_q8_0(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_0 *w = vw; const kn_block_q8_0 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256 p0 = _mm256_cvtepi32_ps(dot_ss(load256(w[i].qs), load256(a[i].qs)));
        __m256 p1 = _mm256_cvtepi32_ps(dot_ss(load256(w[i + 1].qs), load256(a[i + 1].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i + 1].d) * F16(a[i + 1].d)), p1, acc1);
    }
    for (; i < nb; i++) {
        __m256 p0 = _mm256_cvtepi32_ps(dot_ss(load256(w[i].qs), load256(a[i].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p0, acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float dot_q8_1_q8_1(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_1 *w = vw; const kn_block_q8_1 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KN_QK; i++) {
        __m256 p = _mm256_cvtepi32_ps(dot_ss(load256(w[i].qs), load256(a[i].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), p, acc);
    }
    return hsum_ps(acc);
}

/* ---- K-quants ------------------------------------------------------------- */

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) for the 8 mins in sm[2..3]. */
static inline int min_term(const uint32_t sm[4], const int16_t *bsums) {
    __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    __m128i pairs = _mm_hadd_epi16(b0, b1);                       /* 8 x s16, |.| <= 4064 */
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 2)));
    __m128i p = _mm_madd_epi16(pairs, m);
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4e));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1));
    return _mm_cvtsi128_si32(p);
}

/* Q4_K and Q5_K share one body: Q5_K adds bit j of each qh byte as bit 4 of
 * sub-block j. Both layouts start d, dmin, scales[12]; Q5_K has qh[32] before
 * qs. Inlined into each wrapper, so `five` is a constant there. */
static inline __attribute__((always_inline)) float dot_q45_K(int64_t n, const uint8_t *base, size_t bsize,
                                                             const kn_block_q8_K *a, const bool five) {
    __m256 acc = _mm256_setzero_ps();
    float summ = 0;
    const __m256i m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / KN_QK_K; i++, base += bsize) {
        const uint16_t *dd = (const uint16_t *)base;
        const uint8_t *qs = base + (five ? 48 : 16);
        uint32_t sm[4];
        unpack_sc_m(base + 4, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        summ += a[i].d * F16(dd[1]) * (float)min_term(sm, a[i].bsums);
        __m256i qh = five ? load256(base + 16) : _mm256_setzero_si256(), sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = load256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(q, m15), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
            if (five) {     /* bit 2c / 2c+1 of each qh byte -> 0x10 */
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            __m256i p0 = _mm256_maddubs_epi16(lo, load256(a[i].qs + 64 * c));
            __m256i p1 = _mm256_maddubs_epi16(hi, load256(a[i].qs + 64 * c + 32));
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * F16(dd[0])), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - summ;
}
static float dot_q4_K_q8_K(int64_t n, const void *w, const void *a) {
    return dot_q45_K(n, w, sizeof(kn_block_q4_K), a, false);
}
static float dot_q5_K_q8_K(int64_t n, const void *w, const void *a) {
    return dot_q45_K(n, w, sizeof(kn_block_q5_K), a, true);
}

/* Q6_K: dot of the unsigned 6-bit q (0..63) with y, minus 32 * sum(y) via bsums. */
static float dot_q6_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q6_K *w = vw; const kn_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    /* group g of a half uses scale 2g (int16 lanes 0..7) and 2g+1 (lanes 8..15):
     * byte shuffles that broadcast s16 element 2g in the low 128 bits, 2g+1 in the high */
    __m256i bcast[4];
    for (int g = 0; g < 4; g++)
        bcast[g] = _mm256_setr_m128i(_mm_set1_epi16((short)((4 * g + 1) << 8 | 4 * g)),
                                     _mm_set1_epi16((short)((4 * g + 3) << 8 | (4 * g + 2))));
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);                        /* 16 x s16 */
        __m256i offv = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a[i].bsums));
        __m256i sumi = _mm256_slli_epi32(offv, 5);                        /* 32 * sc * bsum, subtracted below */
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h;
            const int8_t *y = a[i].qs + 128 * h;
            __m256i sch = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16));
            __m256i q[4];
            q6_groups(ql, w[i].qh + 32 * h, q);
            for (int g = 0; g < 4; g++) {
                __m256i p = _mm256_maddubs_epi16(q[g], load256(y + 32 * g));
                /* int16 lanes 0..7 are elements 0..15 (scale 2g), 8..15 the rest */
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sch, bcast[g])));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * F16(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

static float dot_q8_K_q8_K(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_K *w = vw; const kn_block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++)
            s = _mm256_add_epi32(s, dot_ss(load256(w[i].qs + 32 * c), load256(a[i].qs + 32 * c)));
        sum += w[i].d * a[i].d * (float)hsum_epi32(s);
    }
    return sum;
}

/* ---- float weights -------------------------------------------------------- */

static float dot_f32_f32(int64_t n, const void *vw, const void *va) { return dot_f32_avx2(n, vw, va); }

static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static float dot_f16_f32(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw; const float *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(ld_f16(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(ld_f16(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(ld_f16(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(ld_f16(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(ld_f16(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += F16(w[i]) * a[i];
    return s;
}

static inline __m256 ld_bf16(const uint16_t *p) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
static float dot_bf16_f32(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw; const float *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(ld_bf16(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(ld_bf16(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(ld_bf16(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(ld_bf16(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(ld_bf16(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += kn_bf16_to_fp32(w[i]) * a[i];
    return s;
}

kn_vec_dot_fn kn_quant_avx2_dot(kn_dtype t) {
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

/* ---- activation quantization (the decode hot path) ------------------------- */
/* One block of 32 floats -> d (fp16 bits) and 32 int8, exactly as the scalar
 * quant.c does: d = fp16(amax / 127), q = clamp(rint(x / d), -127, 127).
 * Returns the sum of the quants (for Q8_1's s field). */
static inline int q8_block_avx2(const float *x, uint16_t *d16, int8_t *qs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    *d16 = kn_fp32_to_fp16(amax / 127);
    float d = F16(*d16), id = d != 0 ? 1.0f / d : 0;
    __m256 vid = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    i0 = _mm256_min_epi32(_mm256_max_epi32(i0, lo), hi); i1 = _mm256_min_epi32(_mm256_max_epi32(i1, lo), hi);
    i2 = _mm256_min_epi32(_mm256_max_epi32(i2, lo), hi); i3 = _mm256_min_epi32(_mm256_max_epi32(i3, lo), hi);
    int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    /* packs work within 128-bit lanes: fix the order with one permute */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, p);
    return sum;
}

void kn_quant_q8_0_avx2(const float *x, void *vy, int64_t nb) {
    kn_block_q8_0 *y = vy;
    for (int64_t i = 0; i < nb; i++) q8_block_avx2(x + i * KN_QK, &y[i].d, y[i].qs);
}
void kn_quant_q8_1_avx2(const float *x, void *vy, int64_t nb) {
    kn_block_q8_1 *y = vy;
    for (int64_t i = 0; i < nb; i++) {
        int sum = q8_block_avx2(x + i * KN_QK, &y[i].d, y[i].qs);
        y[i].s = kn_fp32_to_fp16(F16(y[i].d) * (float)sum);
    }
}
