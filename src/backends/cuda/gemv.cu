/* gemv.cu: y[N] = W[N,K] @ x[K] (+ bias) for batch-1 decode; W f32, bf16 or f16.
 * Bound by reading W once: N*K*sizeof(w) bytes; x (K floats, shared by every
 * row) is read through the read-only cache.
 * v2 (default, dev/cuda/gemv/): one block per row, each thread issuing U
 * 16-byte loads of W (4 f32 or 8 bf16) before it uses any, so that a 16 KB
 * row is requested at once (256 threads x 4 x 16 B) and a 4096-row matrix is
 * 4096 small blocks that the scheduler balances over the SMs.
 * v1: one warp per row, two 16-byte loads in flight per lane (kept for
 * KN_CUDA_TUNE=gemv_v=1 comparisons). */
#include "backends/cuda/common.cuh"
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune
#include "graph/scalar_ops.h"          // defines: kn_scalar_unary (matmul epilogues: the unfused kernels' math)
#include <cuda_fp16.h>                 // defines: __half22float2

#define KN_GV_WARPS 8

__global__ void __launch_bounds__(KN_GV_WARPS * 32)
gemv_f32_kernel(float *y, const float *__restrict__ W, const float *__restrict__ x,
                const float *__restrict__ bias, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * KN_GV_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    const float4 *w4 = (const float4 *)(W + (int64_t)row * K);
    const float4 *x4 = (const float4 *)x;
    const int k4 = K / 4;
    float a0 = 0.f, a1 = 0.f;
    int i = lane;
    for (; i + 32 < k4; i += 64) {
        float4 w0 = __ldcs(w4 + i), w1 = __ldcs(w4 + i + 32);
        float4 x0 = __ldg(x4 + i), x1 = __ldg(x4 + i + 32);
        a0 += w0.x * x0.x + w0.y * x0.y + w0.z * x0.z + w0.w * x0.w;
        a1 += w1.x * x1.x + w1.y * x1.y + w1.z * x1.z + w1.w * x1.w;
    }
    for (; i < k4; i += 32) {
        float4 w0 = __ldcs(w4 + i), x0 = __ldg(x4 + i);
        a0 += w0.x * x0.x + w0.y * x0.y + w0.z * x0.z + w0.w * x0.w;
    }
    float a = kn_warp_sum(a0 + a1);
    if (lane == 0) y[row] = a + (bias ? bias[row] : 0.f);
}

__device__ __forceinline__ float gv_dot8v(uint4 w, float4 xa, float4 xb) {
    return kn_bf2f(w.x & 0xffff) * xa.x + kn_bf2f(w.x >> 16) * xa.y +
           kn_bf2f(w.y & 0xffff) * xa.z + kn_bf2f(w.y >> 16) * xa.w +
           kn_bf2f(w.z & 0xffff) * xb.x + kn_bf2f(w.z >> 16) * xb.y +
           kn_bf2f(w.w & 0xffff) * xb.z + kn_bf2f(w.w >> 16) * xb.w;
}
__device__ __forceinline__ float gv_dot8(uint4 w, const float4 *x) { return gv_dot8v(w, __ldg(x), __ldg(x + 1)); }

__global__ void __launch_bounds__(KN_GV_WARPS * 32)
gemv_bf16_kernel(float *y, const uint16_t *__restrict__ W, const float *__restrict__ x,
                 const float *__restrict__ bias, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * KN_GV_WARPS + (threadIdx.x >> 5);
    if (row >= N) return;
    const uint4 *w8 = (const uint4 *)(W + (int64_t)row * K);
    const float4 *x4 = (const float4 *)x;
    const int k8 = K / 8;
    float a0 = 0.f, a1 = 0.f;
    int i = lane;
    for (; i + 32 < k8; i += 64) {
        uint4 w0 = __ldcs(w8 + i), w1 = __ldcs(w8 + i + 32);
        a0 += gv_dot8(w0, x4 + 2 * i);
        a1 += gv_dot8(w1, x4 + 2 * (i + 32));
    }
    for (; i < k8; i += 32) a0 += gv_dot8(__ldcs(w8 + i), x4 + 2 * i);
    float a = kn_warp_sum(a0 + a1);
    if (lane == 0) y[row] = a + (bias ? bias[row] : 0.f);
}

/* ---- v2: one block per row, U loads in flight per thread ----------------------------- */
/* The activation row as the dot reads it, float4 j (elements 4j .. 4j+3):
 * as stored, or a matmul prologue's A computed from it (gemv_pre.cuh,
 * shared with gemv_quant.cu) */
#include "backends/cuda/gemv_pre.cuh"   // defines: gx_plain, gx_norm, gx_silu, gx_norm_scale

template <class GX> __device__ __forceinline__ float gv_dot(float4 w, GX &g, int i) {
    float4 xv = g(i);
    return w.x * xv.x + w.y * xv.y + w.z * xv.z + w.w * xv.w;
}
template <class GX> __device__ __forceinline__ float gv_dot(uint4 w, GX &g, int i) {
    float4 xa = g(2 * i), xb = g(2 * i + 1);
    return gv_dot8v(w, xa, xb);
}

/* 8 f16 weights: a type of its own so that the row kernel's overloads pick
 * the f16 dot; loaded as one 16-byte streaming load like the bf16 vector */
struct __align__(16) gv_h8 { uint4 u; };
__device__ __forceinline__ float2 gv_h2f(uint32_t u) {
    return __half22float2(__halves2half2(__ushort_as_half((unsigned short)(u & 0xffff)), __ushort_as_half((unsigned short)(u >> 16))));
}
template <class GX> __device__ __forceinline__ float gv_dot(gv_h8 w, GX &g, int i) {
    float4 xa = g(2 * i), xb = g(2 * i + 1);
    float2 a = gv_h2f(w.u.x), b = gv_h2f(w.u.y), c = gv_h2f(w.u.z), d = gv_h2f(w.u.w);
    return a.x * xa.x + a.y * xa.y + b.x * xa.z + b.y * xa.w + c.x * xb.x + c.y * xb.y + d.x * xb.z + d.y * xb.w;
}
__device__ __forceinline__ float4 gv_load(const float4 *p) { return __ldcs(p); }
__device__ __forceinline__ uint4 gv_load(const uint4 *p) { return __ldcs(p); }
__device__ __forceinline__ gv_h8 gv_load(const gv_h8 *p) { gv_h8 r; r.u = __ldcs((const uint4 *)p); return r; }

/* float4s of activations one weight vector meets: 1 for 4 f32, 2 for 8 bf16/f16 */
template <typename VT> struct gv_xper { static constexpr int n = 2; };
template <> struct gv_xper<float4> { static constexpr int n = 1; };

/* One row's U-vector batch from vector b on (a thread's vectors b, b + bd, ..) */
template <typename VT, int U>
__device__ __forceinline__ void gv_fetch(const VT *__restrict__ w, int b, int nv, VT (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int i = b + u * blockDim.x;
        if (i < nv) v[u] = gv_load(w + i);
    }
}
/* One row's dot over nv vectors, U loads in flight per thread: this
 * thread's share of the sum. v holds its first batch (gv_fetch from
 * threadIdx.x), each next batch is loaded once the last is used. Every
 * vector index is one thread's, once. */
template <typename VT, int U, class GX>
__device__ __forceinline__ float gv_row(const VT *__restrict__ w, GX &g, int nv, VT (&v)[U]) {
    float acc = 0.f;
    for (int b = threadIdx.x; b < nv;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = b + u * blockDim.x;
            if (i < nv) acc += gv_dot(v[u], g, i);
        }
        b += blockDim.x * U;
        if (b < nv) gv_fetch<VT, U>(w, b, nv, v);
    }
    return acc;
}

/* VT: float4 (f32 W), uint4 (8 bf16) or gv_h8 (8 f16); nv = K / elements per vector.
 * A matmul epilogue in the store (kn_cuda_gemv_epi): y = res + act(dot + bias),
 * ACT an op (0: none) applied as the unfused f32 unary kernel does (the op
 * table's double function, rounded to float), res [N] f32 or NULL.
 * PRE a prologue (KN_GV_PRE_*; pp its vector, eps the norm's): the
 * activation row computed as it is read (the norm's scale applied to the
 * dot, gemv_pre.cuh). */
template <typename VT, int U, int ACT, int PRE>
__global__ void __launch_bounds__(256)
gemv_row_kernel(float *y, const VT *__restrict__ W, const float *__restrict__ x,
                const float *__restrict__ bias, int nv, const float *__restrict__ res,
                const float *__restrict__ pp, float eps, int wfix) {
    __shared__ float sh[8], shs[8];
    const int row = blockIdx.x;
    const VT *w = W + (int64_t)row * nv;
    /* wfix: no kernel of the plan writes W (kn_exec.fixed), so its first
     * batch is loaded before the wait for the kernel before (PDL,
     * common.cuh) and its DRAM latency passes while that kernel runs */
    VT v[U];
    if (wfix) gv_fetch<VT, U>(w, threadIdx.x, nv, v);
    kn_pdl_enter();
    if (!wfix) gv_fetch<VT, U>(w, threadIdx.x, nv, v);
    const float4 *x4 = (const float4 *)x;
    float acc, ss = 0.f;
    if (PRE == KN_GV_PRE_NORM) {
        gx_norm g{x4, (const float4 *)pp, 0.f};
        acc = gv_row<VT, U>(w, g, nv, v);
        ss = kn_warp_sum(g.ss);
    } else if (PRE == KN_GV_PRE_SILU) {
        gx_silu g{x4, (const float4 *)pp};
        acc = gv_row<VT, U>(w, g, nv, v);
    } else {
        gx_plain g{x4};
        acc = gv_row<VT, U>(w, g, nv, v);
    }
    acc = kn_warp_sum(acc);
    if ((threadIdx.x & 31) == 0) { sh[threadIdx.x >> 5] = acc; shs[threadIdx.x >> 5] = ss; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f, t = 0.f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) { s += sh[i]; t += shs[i]; }
        if (PRE == KN_GV_PRE_NORM) s *= gx_norm_scale(t, nv * 4 * gv_xper<VT>::n, eps);
        float v = s + (bias ? bias[row] : 0.f);
        if (ACT) v = (float)kn_scalar_unary(ACT, (double)v, 0.0, 0.0);
        if (res) v = res[row] + v;
        y[row] = v;
    }
}

/* Threads per block: enough for U vectors each to cover the row, 32..256. */
template <typename VT, int ACT, int PRE = KN_GV_PRE_NONE>
static kn_status gemv_row_launch_act(float *y, const VT *W, const float *x, const float *bias, int64_t N,
                                     int64_t nv, const float *res, void *stream, const float *pp = NULL, float eps = 0.f,
                                     int wfix = 0) {
    static const int U = kn_cuda_tune("gemv_u", 4);
    int64_t th = (nv + (U >= 8 ? 8 : 4) - 1) / (U >= 8 ? 8 : 4);
    th = th < 32 ? 32 : th > 256 ? 256 : (th + 31) / 32 * 32;
    if (U >= 8)
        KN_CUDA_TRY(kn_launch_pdl(gemv_row_kernel<VT, 8, ACT, PRE>, dim3((unsigned)N), dim3((unsigned)th), 0, kn_stream(stream),
                                  y, W, x, bias, (int)nv, res, pp, eps, wfix));
    else
        KN_CUDA_TRY(kn_launch_pdl(gemv_row_kernel<VT, 4, ACT, PRE>, dim3((unsigned)N), dim3((unsigned)th), 0, kn_stream(stream),
                                  y, W, x, bias, (int)nv, res, pp, eps, wfix));
    return KN_OK;
}
template <typename VT>
static kn_status gemv_row_launch(float *y, const VT *W, const float *x, const float *bias, int64_t N,
                                 int64_t nv, void *stream) {
    return gemv_row_launch_act<VT, 0>(y, W, x, bias, N, nv, NULL, stream);
}
/* act: 0 or one of the four epilogue activations; pre: a prologue (act 0 only) */
template <typename VT>
static kn_status gemv_row_launch_epi(float *y, const VT *W, const float *x, const float *bias, int64_t N,
                                     int64_t nv, int act, const float *res, const kn_cuda_gemv_pre *pre, int wfix,
                                     void *stream) {
    if (pre && pre->kind == KN_GV_PRE_NORM && !act)
        return gemv_row_launch_act<VT, 0, KN_GV_PRE_NORM>(y, W, x, bias, N, nv, res, stream, pre->p, pre->eps, wfix);
    if (pre && pre->kind == KN_GV_PRE_SILU && !act)
        return gemv_row_launch_act<VT, 0, KN_GV_PRE_SILU>(y, W, x, bias, N, nv, res, stream, pre->p, 0.f, wfix);
    if (pre && pre->kind != KN_GV_PRE_NONE) return KN_ERR_UNSUPPORTED;
    switch (act) {
    case 0: return gemv_row_launch_act<VT, 0>(y, W, x, bias, N, nv, res, stream, NULL, 0.f, wfix);
    case KN_OP_RELU: return gemv_row_launch_act<VT, KN_OP_RELU>(y, W, x, bias, N, nv, res, stream, NULL, 0.f, wfix);
    case KN_OP_GELU: return gemv_row_launch_act<VT, KN_OP_GELU>(y, W, x, bias, N, nv, res, stream, NULL, 0.f, wfix);
    case KN_OP_GELU_TANH: return gemv_row_launch_act<VT, KN_OP_GELU_TANH>(y, W, x, bias, N, nv, res, stream, NULL, 0.f, wfix);
    case KN_OP_SILU: return gemv_row_launch_act<VT, KN_OP_SILU>(y, W, x, bias, N, nv, res, stream, NULL, 0.f, wfix);
    default: return KN_ERR_UNSUPPORTED;
    }
}

static kn_status gemv_check(const char *name, const void *y, const void *W, const void *x,
                            int64_t N, int64_t K, int kdiv) {
    KN_CUDA_REQUIRE(N >= 0 && N <= INT32_MAX && K > 0 && K <= INT32_MAX && K % kdiv == 0,
                    "%s: bad shape N=%lld K=%lld (K must be a positive multiple of %d)", name,
                    (long long)N, (long long)K, kdiv);
    KN_CUDA_REQUIRE(N == 0 || (y && W && x), "%s: NULL pointer", name);
    KN_CUDA_REQUIRE(N == 0 || (kn_aligned16(W) && kn_aligned16(x)),
                    "%s: W and x must be 16-byte aligned", name);
    return KN_OK;
}

extern "C" kn_status kn_cuda_gemv_f32(float *y, const float *W, const float *x, const float *bias,
                                      int64_t N, int64_t K, void *stream) {
    kn_status s = gemv_check("kn_cuda_gemv_f32", y, W, x, N, K, 4);
    if (s || N == 0) return s;
    static const int ver = kn_cuda_tune("gemv_v", 2);
    if (ver != 1) return gemv_row_launch<float4>(y, (const float4 *)W, x, bias, N, K / 4, stream);
    gemv_f32_kernel<<<(unsigned)((N + KN_GV_WARPS - 1) / KN_GV_WARPS), KN_GV_WARPS * 32, 0,
                      kn_stream(stream)>>>(y, W, x, bias, (int)N, (int)K);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
extern "C" kn_status kn_cuda_gemv_bf16(float *y, const uint16_t *W, const float *x,
                                       const float *bias, int64_t N, int64_t K, void *stream) {
    kn_status s = gemv_check("kn_cuda_gemv_bf16", y, W, x, N, K, 8);
    if (s || N == 0) return s;
    static const int ver = kn_cuda_tune("gemv_v", 2);
    if (ver != 1) return gemv_row_launch<uint4>(y, (const uint4 *)W, x, bias, N, K / 8, stream);
    gemv_bf16_kernel<<<(unsigned)((N + KN_GV_WARPS - 1) / KN_GV_WARPS), KN_GV_WARPS * 32, 0,
                       kn_stream(stream)>>>(y, W, x, bias, (int)N, (int)K);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
extern "C" kn_status kn_cuda_gemv_f16(float *y, const uint16_t *W, const float *x,
                                      const float *bias, int64_t N, int64_t K, void *stream) {
    kn_status s = gemv_check("kn_cuda_gemv_f16", y, W, x, N, K, 8);
    if (s || N == 0) return s;
    return gemv_row_launch<gv_h8>(y, (const gv_h8 *)W, x, bias, N, K / 8, stream);
}

/* The GEMV with a matmul epilogue in its store (the CUDA backend's
 * cuda_ops_epilogue.cu): y[n] = res[n] + act(W[n,:] . x + bias[n]), each
 * step rounded to float as the unfused f32 nodes round it; with a prologue
 * (pre, act 0 only) x is the row it computes. wt: KN_F32, KN_BF16 or
 * KN_F16 W; act 0 or KN_OP_RELU / GELU / GELU_TANH / SILU; bias, res: f32
 * [N] or NULL. KN_ERR_UNSUPPORTED (nothing launched) for another act, W
 * dtype, an unaligned prologue vector, or the v1 kernels
 * (KN_CUDA_TUNE=gemv_v=1): the caller then runs the epilogue after a plain
 * GEMV (and the prologue before it). wfix: no kernel writes W while this one
 * may overlap the kernel before it (kn_exec.fixed): its first loads of W
 * are then made before the PDL wait. */
extern "C" kn_status kn_cuda_gemv_epi(int wt, float *y, const void *W, const float *x, const float *bias, int act,
                                      const float *res, int64_t N, int64_t K, const kn_cuda_gemv_pre *pre, int wfix,
                                      void *stream) {
    static const int ver = kn_cuda_tune("gemv_v", 2);
    bool has_pre = pre && pre->kind != KN_GV_PRE_NONE;
    if ((ver == 1 && (wt != KN_F16 || has_pre)) ||
        (act && act != KN_OP_RELU && act != KN_OP_GELU && act != KN_OP_GELU_TANH && act != KN_OP_SILU))
        return KN_ERR_UNSUPPORTED;
    if (has_pre && ((pre->p && !kn_aligned16(pre->p)) || (pre->kind == KN_GV_PRE_SILU && !pre->p))) return KN_ERR_UNSUPPORTED;
    kn_status s = gemv_check("kn_cuda_gemv_epi", y, W, x, N, K, wt == KN_F32 ? 4 : 8);
    if (s || N == 0) return s;
    if (wt == KN_F32) return gemv_row_launch_epi<float4>(y, (const float4 *)W, x, bias, N, K / 4, act, res, pre, wfix, stream);
    if (wt == KN_BF16) return gemv_row_launch_epi<uint4>(y, (const uint4 *)W, x, bias, N, K / 8, act, res, pre, wfix, stream);
    if (wt == KN_F16) return gemv_row_launch_epi<gv_h8>(y, (const gv_h8 *)W, x, bias, N, K / 8, act, res, pre, wfix, stream);
    return KN_ERR_UNSUPPORTED;
}
