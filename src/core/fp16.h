/* fp16.h: scalar IEEE half and bfloat16 conversions (round to nearest even).
 * Internal header; the fast vector versions live in src/backends/cpu/.
 * defines: kn_fp32_to_fp16, kn_fp16_to_fp32, kn_fp32_to_bf16, kn_bf16_to_fp32 */
#ifndef KN_FP16_H
#define KN_FP16_H
#include <stdint.h>
#include <string.h>

static inline uint32_t kn__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float kn__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float kn_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return kn__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    if (exp == 0) {                                                        /* zero / subnormal */
        if (!man) return kn__bits_f32(sign);
        float f = (float)man * (1.0f / 16777216.0f);                       /* man * 2^-24 */
        return sign ? -f : f;
    }
    return kn__bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t kn_fp32_to_fp16(float f) {
    uint32_t u = kn__f32_bits(f), sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);                 /* overflow -> inf */
    if (a < 0x38800000u) {                                                 /* subnormal half */
        /* value * 2^24 rounded to nearest even gives the subnormal mantissa */
        float v = kn__bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v; float r = v - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t mant = a & 0x7fffff, exp = (a >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13), rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;                 /* may carry into exp: ok */
    return (uint16_t)(sign | h);
}

static inline float kn_bf16_to_fp32(uint16_t b) { return kn__bits_f32((uint32_t)b << 16); }
static inline uint16_t kn_fp32_to_bf16(float f) {
    uint32_t u = kn__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
#endif
