/* quant_blocks.cuh: GGUF block decoding on the GPU, shared by the quantized
 * GEMV (gemv_quant.cu) and the dequantizing copy (dequant.cu).
 *
 * The unit is a "piece": 32 weights of one block that one thread decodes into
 * registers. Simple types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: 32 weights a block)
 * have one piece per block; the K types (Q4_K, Q5_K, Q6_K: 256 a super-block)
 * have 8. A piece's 32 weights are 4 runs of 8 consecutive elements of the
 * block, at element offsets off[0..3] (so a thread reads its activations as
 * 8 float4 loads): the runs follow the packing, so that a thread reads each
 * quant byte once:
 *   simple: runs 0, 8, 16, 24 (low nibbles are elements 0..15, high 16..31)
 *   Q4_K/Q5_K piece p: chunk c = p/2 of 64 elements, bytes 16*(p%2).. of its
 *     32: low nibbles at 64c + 16(p%2) (+8), high at 64c + 32 + 16(p%2) (+8)
 *   Q6_K piece p: half h = p/4, l0 = 8*(p%4): runs at 128h + l0 + {0,32,64,96}
 * Layouts: src/backends/quant/quant.h (bit-for-bit ggml); the CPU decoders
 * (quant.c deq_*) are the reference these follow.
 *
 * Alignment: every block size and every 16-bit field offset is even, so a
 * block that starts at an even address (GGUF data: 32-byte aligned rows of
 * whole blocks; a shared-memory window keeps the address parity) is read
 * with 16-bit loads; nothing here reads 32 bits at once.
 * Internal: not installed.
 */
#pragma once
#include "kiln_base.h"          // defines: KN_Q4_0 ...
#include <cuda_fp16.h>          // defines: __half2float
#include <stdint.h>

template <int T> struct kn_qt;  /* QK: elements a block, BPB: bytes a block */
template <> struct kn_qt<KN_Q4_0> { enum { QK = 32, BPB = 18 }; };
template <> struct kn_qt<KN_Q4_1> { enum { QK = 32, BPB = 20 }; };
template <> struct kn_qt<KN_Q5_0> { enum { QK = 32, BPB = 22 }; };
template <> struct kn_qt<KN_Q5_1> { enum { QK = 32, BPB = 24 }; };
template <> struct kn_qt<KN_Q8_0> { enum { QK = 32, BPB = 34 }; };
template <> struct kn_qt<KN_Q4_K> { enum { QK = 256, BPB = 144 }; };
template <> struct kn_qt<KN_Q5_K> { enum { QK = 256, BPB = 176 }; };
template <> struct kn_qt<KN_Q6_K> { enum { QK = 256, BPB = 210 }; };

__device__ __forceinline__ uint32_t kq_u16(const uint8_t *p, int i) { return *(const uint16_t *)(p + i); }
__device__ __forceinline__ float kq_h(const uint8_t *p, int i) { return __half2float(__ushort_as_half((unsigned short)kq_u16(p, i))); }

/* q (< 2^23) as a float without I2F (a quarter-rate instruction on Hopper):
 * the float with exponent 2^23 and q in its mantissa is 2^23 + q, exactly;
 * minus 2^23 leaves q (one OR, one FADD). Exact either way; on the H200 the
 * GEMV measured the same with I2F (v3) and with this (v4), so I2F was not
 * what bounds it (docs/PERF.md). */
__device__ __forceinline__ float kq_f(uint32_t q) { return __uint_as_float(0x4B000000u | q) - 8388608.f; }

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (quant.h) */
__device__ __forceinline__ void kq_sc_m(const uint8_t *s, int j, float &sc, float &m) {
    if (j < 4) { sc = kq_f(s[j] & 63); m = kq_f(s[j + 4] & 63); }
    else {
        sc = kq_f((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        m = kq_f((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* Run j (< QK/8) of the block at b into w[0..7]. The GEMV gives one run to
 * each lane, so that a warp's 32 lanes cover 256 consecutive columns and
 * their activation loads are one contiguous kilobyte. */
template <int T> __device__ __forceinline__ void kq_run(const uint8_t *b, int j, float *w);

/* 8 nibbles (hi: the high ones) of the 8 bytes at q (even address): w = q*a + c */
__device__ __forceinline__ void kq_nib8(const uint8_t *q, int hi, float a, float c, float *w) {
    int sh = 4 * hi;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t v = kq_u16(q, 2 * k) >> sh;
        w[2 * k] = kq_f(v & 15) * a + c;
        w[2 * k + 1] = kq_f((v >> 8) & 15) * a + c;
    }
}
/* 5-bit: 5th bit of element e is bit e of qh; elements e0 .. e0+7 */
__device__ __forceinline__ void kq_nib8_h(const uint8_t *q, int hi, uint32_t qh, int e0, float a, float c, float *w) {
    int sh = 4 * hi;
    qh >>= e0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t v = kq_u16(q, 2 * k) >> sh;
        w[2 * k] = kq_f((v & 15) | ((qh >> (2 * k)) & 1) << 4) * a + c;
        w[2 * k + 1] = kq_f(((v >> 8) & 15) | ((qh >> (2 * k + 1)) & 1) << 4) * a + c;
    }
}
/* simple types: run j: bytes 8(j&1) .. of qs, low nibbles for j < 2 */
template <> __device__ __forceinline__ void kq_run<KN_Q4_0>(const uint8_t *b, int j, float *w) {
    float d = kq_h(b, 0);
    kq_nib8(b + 2 + 8 * (j & 1), j >> 1, d, -8.f * d, w);
}
template <> __device__ __forceinline__ void kq_run<KN_Q4_1>(const uint8_t *b, int j, float *w) {
    kq_nib8(b + 4 + 8 * (j & 1), j >> 1, kq_h(b, 0), kq_h(b, 2), w);
}
template <> __device__ __forceinline__ void kq_run<KN_Q5_0>(const uint8_t *b, int j, float *w) {
    float d = kq_h(b, 0);
    kq_nib8_h(b + 6 + 8 * (j & 1), j >> 1, kq_u16(b, 2) | kq_u16(b, 4) << 16, 8 * j, d, -16.f * d, w);
}
template <> __device__ __forceinline__ void kq_run<KN_Q5_1>(const uint8_t *b, int j, float *w) {
    kq_nib8_h(b + 8 + 8 * (j & 1), j >> 1, kq_u16(b, 4) | kq_u16(b, 6) << 16, 8 * j, kq_h(b, 0), kq_h(b, 2), w);
}
template <> __device__ __forceinline__ void kq_run<KN_Q8_0>(const uint8_t *b, int j, float *w) {
    float d = kq_h(b, 0), c = -128.f * d;     /* int8 q = (q ^ 0x80) - 128; (u - 128) d in one FFMA */
    const uint8_t *q = b + 2 + 8 * j;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t v = kq_u16(q, 2 * k) ^ 0x8080u;
        w[2 * k] = kq_f(v & 255) * d + c;
        w[2 * k + 1] = kq_f(v >> 8) * d + c;
    }
}
/* Q4_K / Q5_K run j: chunk c = j/8 of 64, i = j%8: i < 4 low nibbles of bytes
 * 8i.. of the chunk's 32 (sub-block 2c), else high nibbles of 8(i-4).. (2c+1) */
template <> __device__ __forceinline__ void kq_run<KN_Q4_K>(const uint8_t *b, int j, float *w) {
    int c = j >> 3, i = j & 7, hi = i >> 2;
    float sc, m;
    kq_sc_m(b + 4, 2 * c + hi, sc, m);
    kq_nib8(b + 16 + 32 * c + 8 * (i & 3), hi, kq_h(b, 0) * sc, -kq_h(b, 2) * m, w);
}
template <> __device__ __forceinline__ void kq_run<KN_Q5_K>(const uint8_t *b, int j, float *w) {
    int c = j >> 3, i = j & 7, hi = i >> 2, l0 = 8 * (i & 3);
    float sc, m;
    kq_sc_m(b + 4, 2 * c + hi, sc, m);
    float a = kq_h(b, 0) * sc, cc = -kq_h(b, 2) * m;
    const uint8_t *q = b + 48 + 32 * c + l0, *qh = b + 16 + l0;
    int sh = 4 * hi, hb = 2 * c + hi;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t v = kq_u16(q, 2 * k) >> sh, h = kq_u16(qh, 2 * k) >> hb;
        w[2 * k] = kq_f((v & 15) | (h & 1) << 4) * a + cc;
        w[2 * k + 1] = kq_f(((v >> 8) & 15) | ((h >> 8) & 1) << 4) * a + cc;
    }
}
/* Q6_K run j: half h = j/16, t = 8(j%16) within it, group g = t/32, l = t%32:
 * ql[64h + l + 32(g&1)] nibble g>>1, qh[32h + l] bits 2g, scale 8h + t/16 */
template <> __device__ __forceinline__ void kq_run<KN_Q6_K>(const uint8_t *b, int j, float *w) {
    int h = j >> 4, t = 8 * (j & 15), g = t >> 5, l = t & 31;
    const uint8_t *ql = b + 64 * h + l + 32 * (g & 1), *qh = b + 128 + 32 * h + l;
    float a = kq_h(b, 208) * (float)((const int8_t *)b)[192 + 8 * h + t / 16], c = -32.f * a;   /* (q - 32) a */
    int sl = 4 * (g >> 1), shh = 2 * g;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t v = kq_u16(ql, 2 * k) >> sl, u = kq_u16(qh, 2 * k) >> shh;
        w[2 * k] = kq_f((v & 15) | (u & 3) << 4) * a + c;
        w[2 * k + 1] = kq_f(((v >> 8) & 15) | ((u >> 8) & 3) << 4) * a + c;
    }
}

/* X(T): every type the GPU decodes (the dispatch switches below expand it) */
#define KN_QUANT_GPU_TYPES(X) X(KN_Q4_0) X(KN_Q4_1) X(KN_Q5_0) X(KN_Q5_1) X(KN_Q8_0) X(KN_Q4_K) X(KN_Q5_K) X(KN_Q6_K)
