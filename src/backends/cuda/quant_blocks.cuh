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

template <int T> struct kn_qt;  /* QK: elements a block, BPB: bytes a block, PPB: pieces a block */
template <> struct kn_qt<KN_Q4_0> { enum { QK = 32, BPB = 18, PPB = 1 }; };
template <> struct kn_qt<KN_Q4_1> { enum { QK = 32, BPB = 20, PPB = 1 }; };
template <> struct kn_qt<KN_Q5_0> { enum { QK = 32, BPB = 22, PPB = 1 }; };
template <> struct kn_qt<KN_Q5_1> { enum { QK = 32, BPB = 24, PPB = 1 }; };
template <> struct kn_qt<KN_Q8_0> { enum { QK = 32, BPB = 34, PPB = 1 }; };
template <> struct kn_qt<KN_Q4_K> { enum { QK = 256, BPB = 144, PPB = 8 }; };
template <> struct kn_qt<KN_Q5_K> { enum { QK = 256, BPB = 176, PPB = 8 }; };
template <> struct kn_qt<KN_Q6_K> { enum { QK = 256, BPB = 210, PPB = 8 }; };

__device__ __forceinline__ uint32_t kq_u16(const uint8_t *p, int i) { return *(const uint16_t *)(p + i); }
__device__ __forceinline__ float kq_h(const uint8_t *p, int i) { return __half2float(__ushort_as_half((unsigned short)kq_u16(p, i))); }

/* 16 bytes at p (even address) as 16 nibble pairs: w[j] = lo*a + b, w[16+j] = hi*a + b */
__device__ __forceinline__ void kq_nib16(const uint8_t *q, float a, float b, float *w) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t v = kq_u16(q, 2 * j);
        w[2 * j] = (float)(v & 15) * a + b;
        w[2 * j + 1] = (float)((v >> 8) & 15) * a + b;
        w[16 + 2 * j] = (float)((v >> 4) & 15) * a + b;
        w[16 + 2 * j + 1] = (float)((v >> 12) & 15) * a + b;
    }
}
/* 5-bit variant: the 5th bits of elements j and 16+j are bits j, 16+j of qh */
__device__ __forceinline__ void kq_nib16_h(const uint8_t *q, uint32_t qh, float a, float b, float *w) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t v = kq_u16(q, 2 * j);
        int e = 2 * j;
        w[e] = (float)((v & 15) | ((qh >> e) & 1) << 4) * a + b;
        w[e + 1] = (float)(((v >> 8) & 15) | ((qh >> (e + 1)) & 1) << 4) * a + b;
        w[16 + e] = (float)(((v >> 4) & 15) | ((qh >> (e + 16)) & 1) << 4) * a + b;
        w[16 + e + 1] = (float)(((v >> 12) & 15) | ((qh >> (e + 17)) & 1) << 4) * a + b;
    }
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (quant.h) */
__device__ __forceinline__ void kq_sc_m(const uint8_t *s, int j, float &sc, float &m) {
    if (j < 4) { sc = (float)(s[j] & 63); m = (float)(s[j + 4] & 63); }
    else {
        sc = (float)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        m = (float)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* Piece p of the block at b: 32 weights into w, their runs' element offsets into off. */
template <int T> __device__ __forceinline__ void kq_piece(const uint8_t *b, int p, float *w, int *off);

template <> __device__ __forceinline__ void kq_piece<KN_Q4_0>(const uint8_t *b, int p, float *w, int *off) {
    float d = kq_h(b, 0);
    kq_nib16(b + 2, d, -8.f * d, w);
    off[0] = 0; off[1] = 8; off[2] = 16; off[3] = 24;
}
template <> __device__ __forceinline__ void kq_piece<KN_Q4_1>(const uint8_t *b, int p, float *w, int *off) {
    kq_nib16(b + 4, kq_h(b, 0), kq_h(b, 2), w);
    off[0] = 0; off[1] = 8; off[2] = 16; off[3] = 24;
}
template <> __device__ __forceinline__ void kq_piece<KN_Q5_0>(const uint8_t *b, int p, float *w, int *off) {
    float d = kq_h(b, 0);
    kq_nib16_h(b + 6, kq_u16(b, 2) | kq_u16(b, 4) << 16, d, -16.f * d, w);
    off[0] = 0; off[1] = 8; off[2] = 16; off[3] = 24;
}
template <> __device__ __forceinline__ void kq_piece<KN_Q5_1>(const uint8_t *b, int p, float *w, int *off) {
    kq_nib16_h(b + 8, kq_u16(b, 4) | kq_u16(b, 6) << 16, kq_h(b, 0), kq_h(b, 2), w);
    off[0] = 0; off[1] = 8; off[2] = 16; off[3] = 24;
}
template <> __device__ __forceinline__ void kq_piece<KN_Q8_0>(const uint8_t *b, int p, float *w, int *off) {
    float d = kq_h(b, 0);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        uint32_t v = kq_u16(b, 2 + 2 * j);
        w[2 * j] = (float)(int8_t)(v & 255) * d;
        w[2 * j + 1] = (float)(int8_t)(v >> 8) * d;
    }
    off[0] = 0; off[1] = 8; off[2] = 16; off[3] = 24;
}
/* Q4_K: d, dmin at 0, 2; scales[12] at 4; qs[128] at 16 */
template <> __device__ __forceinline__ void kq_piece<KN_Q4_K>(const uint8_t *b, int p, float *w, int *off) {
    int c = p >> 1, hb = p & 1;
    float d = kq_h(b, 0), dmin = kq_h(b, 2), s0, m0, s1, m1;
    kq_sc_m(b + 4, 2 * c, s0, m0);
    kq_sc_m(b + 4, 2 * c + 1, s1, m1);
    const uint8_t *q = b + 16 + 32 * c + 16 * hb;
    float a0 = d * s0, b0 = -dmin * m0, a1 = d * s1, b1 = -dmin * m1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t v = kq_u16(q, 2 * j);
        w[2 * j] = (float)(v & 15) * a0 + b0;
        w[2 * j + 1] = (float)((v >> 8) & 15) * a0 + b0;
        w[16 + 2 * j] = (float)((v >> 4) & 15) * a1 + b1;
        w[16 + 2 * j + 1] = (float)((v >> 12) & 15) * a1 + b1;
    }
    int e = 64 * c + 16 * hb;
    off[0] = e; off[1] = e + 8; off[2] = e + 32; off[3] = e + 40;
}
/* Q5_K: d, dmin at 0, 2; scales[12] at 4; qh[32] at 16; qs[128] at 48 */
template <> __device__ __forceinline__ void kq_piece<KN_Q5_K>(const uint8_t *b, int p, float *w, int *off) {
    int c = p >> 1, hb = p & 1;
    float d = kq_h(b, 0), dmin = kq_h(b, 2), s0, m0, s1, m1;
    kq_sc_m(b + 4, 2 * c, s0, m0);
    kq_sc_m(b + 4, 2 * c + 1, s1, m1);
    const uint8_t *q = b + 48 + 32 * c + 16 * hb, *qh = b + 16 + 16 * hb;
    float a0 = d * s0, b0 = -dmin * m0, a1 = d * s1, b1 = -dmin * m1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t v = kq_u16(q, 2 * j), h = kq_u16(qh, 2 * j) >> (2 * c);   /* bit 2c: low, 2c+1: high; bytes 0, 8 */
        w[2 * j] = (float)((v & 15) | (h & 1) << 4) * a0 + b0;
        w[2 * j + 1] = (float)(((v >> 8) & 15) | ((h >> 8) & 1) << 4) * a0 + b0;
        w[16 + 2 * j] = (float)(((v >> 4) & 15) | ((h >> 1) & 1) << 4) * a1 + b1;
        w[16 + 2 * j + 1] = (float)(((v >> 12) & 15) | ((h >> 9) & 1) << 4) * a1 + b1;
    }
    int e = 64 * c + 16 * hb;
    off[0] = e; off[1] = e + 8; off[2] = e + 32; off[3] = e + 40;
}
/* Q6_K: ql[128] at 0, qh[64] at 128, scales[16] (int8) at 192, d at 208 */
template <> __device__ __forceinline__ void kq_piece<KN_Q6_K>(const uint8_t *b, int p, float *w, int *off) {
    int h = p >> 2, l0 = 8 * (p & 3);
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
    float d = kq_h(b, 208);
    /* runs g = 0..3: elements l0 + 32g .. +8 of the half, scale index (l0 + 32g) / 16 */
    float a0 = d * sc[l0 / 16], a1 = d * sc[(l0 + 32) / 16], a2 = d * sc[(l0 + 64) / 16], a3 = d * sc[(l0 + 96) / 16];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int l = l0 + 2 * j;
        uint32_t lo = kq_u16(ql, l), hi = kq_u16(ql, l + 32), hb = kq_u16(qh, l);
#pragma unroll
        for (int t = 0; t < 2; t++) {
            uint32_t L = (lo >> (8 * t)) & 255, H = (hi >> (8 * t)) & 255, Q = (hb >> (8 * t)) & 255;
            int k = 2 * j + t;
            w[k] = (float)((int)((L & 15) | (Q & 3) << 4) - 32) * a0;
            w[8 + k] = (float)((int)((H & 15) | ((Q >> 2) & 3) << 4) - 32) * a1;
            w[16 + k] = (float)((int)((L >> 4) | ((Q >> 4) & 3) << 4) - 32) * a2;
            w[24 + k] = (float)((int)((H >> 4) | ((Q >> 6) & 3) << 4) - 32) * a3;
        }
    }
    int e = 128 * h + l0;
    off[0] = e; off[1] = e + 32; off[2] = e + 64; off[3] = e + 96;
}

/* X(T): every type the GPU decodes (the dispatch switches below expand it) */
#define KN_QUANT_GPU_TYPES(X) X(KN_Q4_0) X(KN_Q4_1) X(KN_Q5_0) X(KN_Q5_1) X(KN_Q8_0) X(KN_Q4_K) X(KN_Q5_K) X(KN_Q6_K)
