/* quant_x86.h: small AVX2 helpers shared by quant_avx2.c and quant16_avx2.c
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
#endif
