/* quant_x86.h: small AVX2 helpers shared by quant_avx2.c, quant16_avx2.c and
 * the CPU's matrix-vector dot (backends/cpu/gemm_avx2.c: dot_f32_avx2)
 * (include only from files compiled with -mavx2 -mfma -mf16c). */
#ifndef KN_QUANT_X86_H
#define KN_QUANT_X86_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* scale fields: one F16C conversion (vcvtph2ps) instead of the software one */
#define F16(x) _cvtsh_ss(x)

/* ---- helpers ---- */

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* w . a over n floats: four 8-wide FMA chains over blocks of 32 (independent
 * chains, one sequential stream a row), then 8 at a time, the rest scalar */
static inline float dot_f32_avx2(int64_t n, const float *w, const float *a) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += w[i] * a[i];
    return s;
}
static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* 32 bits (little-endian) -> 32 bytes, 0xff where bit i is set. */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t v; memcpy(&v, p, 4);
    __m256i x = _mm256_set1_epi32((int)v);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                            0x0202020202020202LL, 0x0303030303030303LL);
    x = _mm256_shuffle_epi8(x, shuf);                     /* byte i = byte i/8 of v */
    const __m256i m = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(x, m), m);
}
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* 16 packed nibbles -> 32 bytes: low nibbles (elements 0..15) then high. */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(15));
}
/* Two adjacent fp16 fields (d, m of Q4_1/Q5_1; d, s of Q8_1) -> lanes 0, 1. */
static inline __m128 f16x2(const uint16_t *p) {
    int v; memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* The 8 6-bit scales and 8 mins of a Q4_K/Q5_K block (packing in quant.h),
 * unpacked four at a time in 32-bit words: out[0] = sc0..3, out[1] = sc4..7,
 * out[2] = m0..3, out[3] = m4..7, one byte each. */
static inline void unpack_sc_m(const uint8_t *s, uint32_t out[4]) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4); memcpy(&u1, s + 4, 4); memcpy(&u2, s + 8, 4);
    out[0] = u0 & 0x3f3f3f3fu;
    out[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    out[2] = u1 & 0x3f3f3f3fu;
    out[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
}
/* Q6_K: the 6-bit quants (0..63) of one half (128 elements) as four groups
 * of 32 bytes, from ql (64 bytes of that half) and qh (32 bytes); the bit
 * layout is in quant.h. */
static inline void q6_groups(const uint8_t *ql, const uint8_t *qh8, __m256i q[4]) {
    const __m256i m15 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i l0 = load256(ql), l1 = load256(ql + 32), qh = load256(qh8);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}
#endif
