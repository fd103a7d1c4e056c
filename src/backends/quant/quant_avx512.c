/* quant_avx512.c: AVX-512 dot products for the hottest GGUF types: Q8_0,
 * Q4_0, Q4_1 (256-bit AVX512-VL + VNNI), Q4_K, Q6_K (512-bit) and F16 weights.
 * Other types, and Q8_0/Q4_0/Q4_1 on CPUs without VNNI, use the AVX2 kernels
 * (every AVX-512 CPU has AVX2).
 *
 * The K kernels are one body instantiated twice: with vpdpbusd (AVX512-VNNI,
 * u8 x s8 groups of 4 summed straight into s32) and without it (vpmaddubsw +
 * vpmaddwd, exact for the value ranges here, as in quant_avx2.c). A 512-bit
 * register holds two 32-element sub-blocks; s32 lanes 0..7 belong to the
 * first, 8..15 to the second. The scalar twins are in quant.c; the tests force
 * each path (kn_quant_force_isa, kn_quant_force_no_vnni).
 * Compiled with the *_avx512.c flags from the Makefile.
 */
#include "backends/quant/quant.h"      /* defines: block structs, kn_vec_dot_fn */
#include "backends/quant/quant_x86.h"  /* defines: F16, hsum_ps, load256, nibbles32, f16x2, unpack_sc_m */
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- helpers ------------------------------------------------------------- */

/* u8 x s8 in groups of 4 -> 16 x s32 */
INLINE __m512i dot4(__m512i u, __m512i s, const int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}
INLINE __m512i cat(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
INLINE __m512i cat_epi32(int lo, int hi) {
    return cat(_mm256_set1_epi32(lo), _mm256_set1_epi32(hi));
}
INLINE __m512i load512(const void *p) { return _mm512_loadu_si512(p); }
/* Instantiates body(n, w, a, vnni) as name_vnni and name_novnni. */
#define TWO_VARIANTS(name, body)                                                         \
    static float name##_vnni(int64_t n, const void *w, const void *a) { return body(n, w, a, 1); } \
    static float name##_novnni(int64_t n, const void *w, const void *a) { return body(n, w, a, 0); }

/* ---- 32-element blocks ---------------------------------------------------
 * One block is 32 bytes of quants, so these stay 256-bit: on a Sapphire Rapids
 * Xeon, pairing two blocks per 512-bit register (two inserts and two scale
 * broadcasts per pair) measured slower than 256-bit. With VNNI (AVX512-VL),
 * vpdpbusd replaces vpmaddubsw + vpmaddwd; without VNNI these types use the
 * AVX2 kernels (kn_quant_avx512_dot returns NULL). */

INLINE __m256 dot_blocks_ss(__m256i x, __m256i y) {   /* s8 x s8, y in [-127, 127] */
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
}

static float dot_q8_0_vnni(int64_t n, const void *vw, const void *va) {
    const kn_block_q8_0 *w = vw; const kn_block_q8_0 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 2 <= nb; i += 2) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), dot_blocks_ss(load256(w[i].qs), load256(a[i].qs)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i + 1].d) * F16(a[i + 1].d)),
                               dot_blocks_ss(load256(w[i + 1].qs), load256(a[i + 1].qs)), acc1);
    }
    if (i < nb)
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), dot_blocks_ss(load256(w[i].qs), load256(a[i].qs)), acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float dot_q4_0_vnni(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_0 *w = vw; const kn_block_q8_0 *a = va;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i x0 = _mm256_sub_epi8(nibbles32(w[i].qs), eight), x1 = _mm256_sub_epi8(nibbles32(w[i + 1].qs), eight);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)), dot_blocks_ss(x0, load256(a[i].qs)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i + 1].d) * F16(a[i + 1].d)), dot_blocks_ss(x1, load256(a[i + 1].qs)), acc1);
    }
    if (i < nb)
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(F16(w[i].d) * F16(a[i].d)),
                               dot_blocks_ss(_mm256_sub_epi8(nibbles32(w[i].qs), eight), load256(a[i].qs)), acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float dot_q4_1_vnni(int64_t n, const void *vw, const void *va) {
    const kn_block_q4_1 *w = vw; const kn_block_q8_1 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 summ = _mm_setzero_ps();
    int64_t nb = n / KN_QK, i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m128 ds0 = _mm_mul_ps(f16x2(&w[i].d), f16x2(&a[i].d)), ds1 = _mm_mul_ps(f16x2(&w[i + 1].d), f16x2(&a[i + 1].d));
        __m256i p0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(w[i].qs), load256(a[i].qs));
        __m256i p1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(w[i + 1].qs), load256(a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds0), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds1), _mm256_cvtepi32_ps(p1), acc1);
        summ = _mm_add_ps(summ, _mm_add_ps(ds0, ds1));
    }
    if (i < nb) {
        __m128 ds0 = _mm_mul_ps(f16x2(&w[i].d), f16x2(&a[i].d));
        __m256i p0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(w[i].qs), load256(a[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(ds0), _mm256_cvtepi32_ps(p0), acc0);
        summ = _mm_add_ps(summ, ds0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(summ));
}

/* ---- K-quants ------------------------------------------------------------- */

INLINE float q4_K_body(int64_t n, const void *vw, const void *va, const int vnni) {
    const kn_block_q4_K *w = vw; const kn_block_q8_K *a = va;
    const __m512i m15 = _mm512_set1_epi8(15);
    __m512 acc = _mm512_setzero_ps();
    float summ = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        uint32_t sm[4];
        unpack_sc_m(w[i].scales, sm);          /* 6-bit scales/mins, four at a time */
        const uint8_t *sc = (const uint8_t *)sm, *m = sc + 8;
        /* sum_j m[j] * (bsums[2j] + bsums[2j+1]) */
        __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        __m256i m2 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)m),
                                                           _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
        __m256i mt8 = _mm256_madd_epi16(bs, m2);
        __m128i mt4 = _mm_add_epi32(_mm256_castsi256_si128(mt8), _mm256_extracti128_si256(mt8, 1));
        mt4 = _mm_add_epi32(mt4, _mm_shuffle_epi32(mt4, 0x4e));
        mt4 = _mm_add_epi32(mt4, _mm_shuffle_epi32(mt4, 0xb1));
        summ += a[i].d * F16(w[i].dmin) * (float)_mm_cvtsi128_si32(mt4);
        const int8_t *y = a[i].qs;
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 2; c++) {
            /* bytes 0..31: chunk 2c (sub-blocks 4c low, 4c+1 high), 32..63: chunk 2c+1 (4c+2, 4c+3) */
            __m512i q = load512(w[i].qs + 64 * c);
            __m512i lo = _mm512_and_si512(q, m15), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m15);
            __m512i ylo = cat(load256(y + 128 * c), load256(y + 128 * c + 64));
            __m512i yhi = cat(load256(y + 128 * c + 32), load256(y + 128 * c + 96));
            __m512i plo = _mm512_mullo_epi32(dot4(lo, ylo, vnni), cat_epi32(sc[4 * c], sc[4 * c + 2]));
            __m512i phi = _mm512_mullo_epi32(dot4(hi, yhi, vnni), cat_epi32(sc[4 * c + 1], sc[4 * c + 3]));
            sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(plo, phi));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[i].d * F16(w[i].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - summ;
}
TWO_VARIANTS(dot_q4_K, q4_K_body)

/* Q6_K: unsigned 6-bit q (0..63) dotted with y, minus 32 * sum(y) from bsums. */
INLINE float q6_K_body(int64_t n, const void *vw, const void *va, const int vnni) {
    const kn_block_q6_K *w = vw; const kn_block_q8_K *a = va;
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    /* s32 lane k of a 64-element product covers elements 4k..4k+3: scale k/4 */
    const __m512i idx01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i idx23 = _mm512_add_epi32(idx01, _mm512_set1_epi32(4));
    float sum = 0;
    for (int64_t i = 0; i < n / KN_QK_K; i++) {
        /* -32 * sum_j scales[j] * bsums[j], as 8 s32 partial sums in the low half */
        __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales)),
                                         _mm256_loadu_si256((const __m256i *)a[i].bsums));
        __m512i sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5)));
        for (int h = 0; h < 2; h++) {
            __m512i ql = load512(w[i].ql + 64 * h);
            __m256i qh = load256(w[i].qh + 32 * h);
            __m512i hA = cat(_mm256_and_si256(_mm256_slli_epi16(qh, 4), m30), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            __m512i hB = cat(_mm256_and_si256(qh, m30), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m15), hA);                         /* e 0..63   */
            __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m15), hB);   /* e 64..127 */
            const int8_t *y = a[i].qs + 128 * h;
            __m128i sc8 = _mm_loadl_epi64((const __m128i *)(w[i].scales + 8 * h));
            __m512i sc32 = _mm512_castsi256_si512(_mm256_cvtepi8_epi32(sc8));
            __m512i p01 = _mm512_mullo_epi32(dot4(q01, load512(y), vnni), _mm512_permutexvar_epi32(idx01, sc32));
            __m512i p23 = _mm512_mullo_epi32(dot4(q23, load512(y + 64), vnni), _mm512_permutexvar_epi32(idx23, sc32));
            sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p01, p23));
        }
        sum += a[i].d * F16(w[i].d) * (float)_mm512_reduce_add_epi32(sumi);
    }
    return sum;
}
TWO_VARIANTS(dot_q6_K, q6_K_body)

/* ---- F16 weights ---------------------------------------------------------- */

static float dot_f16_f32(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw; const float *a = va;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(load256(w + i)), _mm512_loadu_ps(a + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(load256(w + i + 16)), _mm512_loadu_ps(a + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(load256(w + i)), _mm512_loadu_ps(a + i), s0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++) s += F16(w[i]) * a[i];
    return s;
}

kn_vec_dot_fn kn_quant_avx512_dot(kn_dtype t, int vnni) {
    switch (t) {
    case KN_F16: return dot_f16_f32;
    case KN_Q8_0: return vnni ? dot_q8_0_vnni : NULL;   /* NULL: the AVX2 kernel */
    case KN_Q4_0: return vnni ? dot_q4_0_vnni : NULL;
    case KN_Q4_1: return vnni ? dot_q4_1_vnni : NULL;
    case KN_Q4_K: return vnni ? dot_q4_K_vnni : dot_q4_K_novnni;
    case KN_Q6_K: return vnni ? dot_q6_K_vnni : dot_q6_K_novnni;
    default: return NULL;
    }
}
