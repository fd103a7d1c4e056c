/* philox.c: Philox4x32-10 counter-based random numbers (Salmon et al., 2011).
 * Element i of a random tensor with seed s is a pure function of (s, i), so
 * every backend and thread count draws the same numbers. */
#include "core/core.h"
#include <math.h>

void kn_philox4x32(uint64_t ctr, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0x2545F491u, c3 = 0x9E3779B9u;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* One draw for element i. Uniforms use 24 random bits (exact in f32), so f32
 * and f64 tensors with the same seed agree. */
double kn_rand_at(kn_rand_kind kind, double a, double b, uint64_t seed, uint64_t i) {
    uint32_t r[4];
    kn_philox4x32(i, seed, r);
    double u0 = (double)(r[0] >> 8) * (1.0 / 16777216.0);
    switch (kind) {
    case KN_RAND_UNIFORM: return a + (b - a) * u0;
    case KN_RAND_BERNOULLI: return u0 < a ? 1.0 : 0.0;
    case KN_RAND_NORMAL: {
        double u1 = ((double)(r[1] >> 8) + 1.0) * (1.0 / 16777216.0);   /* (0,1]: log is finite */
        return a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u0);
    }
    case KN_RAND_INT: {
        uint64_t range = (uint64_t)(b - a);
        uint64_t x = ((uint64_t)r[2] << 32) | r[3];
        /* multiply-shift maps 64 random bits onto [0, range): the high 64
         * bits of x * range, from 32-bit halves (no __int128 in ISO C) */
        uint64_t xl = x & 0xffffffffu, xh = x >> 32, rl = range & 0xffffffffu, rh = range >> 32;
        uint64_t ll = xl * rl, lh = xl * rh, hl = xh * rl, hh = xh * rh;
        uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
        uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
        return a + (double)hi;
    }
    }
    return 0;
}
