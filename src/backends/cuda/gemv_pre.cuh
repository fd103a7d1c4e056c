/* gemv_pre.cuh: the activation row of a GEMV as its dot reads it, for the
 * matmul prologues (kn_cuda_gemv_pre, kn_cuda.h; docs/COMPILER.md "Matmul
 * prologues"). Each loader returns float4 j of the row (elements 4j ..
 * 4j+3): gx_plain as stored, gx_norm the row times the norm's weight
 * (the norm's scale applied to the dot), gx_silu the gated unit silu(x) * u. Used by gemv.cu (dense W) and gemv_quant.cu. */
#ifndef KN_CUDA_GEMV_PRE_CUH
#define KN_CUDA_GEMV_PRE_CUH
#include "backends/cuda/common.cuh"   // defines: kn_warp_sum
#include "backends/cuda/kn_cuda.h"    // defines: KN_GV_PRE_*

struct gx_plain {
    const float4 *x;
    __device__ __forceinline__ float4 operator()(int j) { return __ldg(x + j); }
};

/* The RMS norm, folded: dot(W_n, x * s * w) = s * dot(W_n, x * w), so the
 * loader returns x * w and adds up x . x as it goes; the kernel multiplies
 * its sum by s = 1 / sqrt(ss / K + eps) at the end. Every element of the
 * row is loaded once per block, so each block has the whole sum of squares
 * with no extra pass over x (the scale waits for no barrier). */
struct gx_norm {
    const float4 *x, *w;   /* w: NULL for a norm without weight */
    float ss;
    __device__ __forceinline__ float4 operator()(int j) {
        float4 v = __ldg(x + j);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        if (w) {
            float4 g = __ldg(w + j);
            v.x *= g.x; v.y *= g.y; v.z *= g.z; v.w *= g.w;
        }
        return v;
    }
};
__device__ __forceinline__ float gx_norm_scale(float ss, int K, float eps) { return 1.f / sqrtf(ss / (float)K + eps); }

/* silu as the generated kernels compute it in float (render.c kn_s_sigmoid) */
__device__ __forceinline__ float gx_silu1(float v) {
    float e = expf(-fabsf(v));
    return v * ((v >= 0.f ? 1.f : e) / (1.f + e));
}
struct gx_silu {
    const float4 *x, *u;
    __device__ __forceinline__ float4 operator()(int j) {
        float4 a = __ldg(x + j), b = __ldg(u + j);
        return make_float4(gx_silu1(a.x) * b.x, gx_silu1(a.y) * b.y, gx_silu1(a.z) * b.z, gx_silu1(a.w) * b.w);
    }
};

#endif
