/* common.cuh: shared helpers for kiln's CUDA kernels (error checks, warp
 * reductions, bf16 conversion, vector loads). Internal: not installed. */
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>               // defines: getenv (kn_cu_pdl)
#include <string.h>               // defines: strcmp
#include "kiln_base.h"            // defines: kn_status, kn_set_error
#include "backends/cuda/kn_cuda.h"  // defines: the public C API

/* Return KN_ERR_BACKEND with file:line and the CUDA message when `call` fails. */
#define KN_CUDA_TRY(call)                                                          \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess)                                                     \
            return kn_set_error(KN_ERR_BACKEND, "%s:%d: %s failed: %s (%s)",       \
                                __FILE__, __LINE__, #call, cudaGetErrorName(e_),   \
                                cudaGetErrorString(e_));                           \
    } while (0)
/* After a <<<>>> launch: catch bad launch configurations at once. */
#define KN_CUDA_LAUNCHED() KN_CUDA_TRY(cudaGetLastError())

#define KN_CUDA_REQUIRE(cond, ...)                                                 \
    do {                                                                           \
        if (!(cond)) return kn_set_error(KN_ERR_INVALID, __VA_ARGS__);             \
    } while (0)

static inline cudaStream_t kn_stream(void *s) { return (cudaStream_t)s; }
static inline bool kn_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Programmatic dependent launch (sm_90+). A kernel launched with
 * kn_launch_pdl may be scheduled while the kernel before it in the stream
 * is still running, which hides the launch gap between small kernels (a
 * decode step is hundreds of them, inside a CUDA graph as well). Such a
 * kernel must call kn_pdl_enter() before its first global memory access,
 * read or write: the wait returns once the previous grid has completed and
 * its writes are visible; the trigger after it lets the next kernel be
 * scheduled now (it waits in turn). The one exception: memory no kernel can
 * be writing may be read before it (a GEMV's weights, kn_exec.fixed), so
 * that its latency passes while the kernel before still runs; the kernel
 * before that one has finished by then (its successor waited for it before
 * letting this one be scheduled). A kernel that never waits must be
 * launched plainly. Below sm_90 both are no-ops. */
__device__ __forceinline__ void kn_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* The current device's compute capability major (0 when it cannot be read),
 * asked once a file */
static inline int kn_cu_cc_major(void) {
    static int major = -1;
    if (major < 0) {
        int dev = 0, m = 0;
        major = cudaGetDevice(&dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess ? m : 0;
    }
    return major;
}
/* The device takes it (sm_90+) and KN_CUDA_PDL is not "0". Read here, once
 * a file, like KN_CUDA_TUNE (tune.cuh): the standalone kernel benches
 * (scripts/cuda_run.sh) build these files without the library. */
static inline bool kn_cu_pdl(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KN_CUDA_PDL");
        on = !(e && !strcmp(e, "0")) && kn_cu_cc_major() >= 9;
    }
    return on != 0;
}
/* Writes the programmatic-serialization attribute into *at and returns the
 * number of attributes it adds to a launch: 1, or 0 where PDL is off */
static inline unsigned kn_pdl_attr(cudaLaunchAttribute *at) {
    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    return kn_cu_pdl() ? 1u : 0u;
}
template <typename... P, typename... A>
static inline cudaError_t kn_launch_pdl(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                        A... args) {
    cudaLaunchAttribute at;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = st;
    c.attrs = &at;
    c.numAttrs = kn_pdl_attr(&at);
    return cudaLaunchKernelEx(&c, kern, args...);
}

__device__ __forceinline__ float kn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kn_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Block-wide sum; every thread gets the result. `sh` needs 32 floats; blockDim
 * a multiple of 32. Contains two __syncthreads. */
__device__ __forceinline__ float kn_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kn_warp_sum(v);
    __syncthreads();                 // sh may still be read from a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return kn_warp_sum(v);
}
__device__ __forceinline__ float kn_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kn_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return kn_warp_max(v);
}
/* Online-softmax pair merge: (m, s) with s = sum exp(x - m). */
__device__ __forceinline__ void kn_ms_merge(float &m, float &s, float m2, float s2) {
    /* a NaN anywhere in the row makes the row NaN, as torch and the reference
     * backend: fmaxf drops NaN, and a NaN merged into an empty pair (m = -inf)
     * used to vanish (seen by test_fuse on an H100) */
    if (m != m || s != s || m2 != m2 || s2 != s2) { m = s = __int_as_float(0x7fc00000); return; }
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) { m = mn; s = 0.f; return; }
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ float kn_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* (lo, hi) -> two 16-bit values (BF: bf16, else f16) in one cvt, round to
 * nearest even, lo in the low half; a NaN becomes the canonical NaN (where
 * kn_f2bf keeps the payload). Its operands are plain floats: on wgmma
 * accumulators kn_f2bf's integer operations made ptxas serialize the
 * wgmmas (C7514). */
template <bool BF> __device__ __forceinline__ uint32_t kn_pack16(float lo, float hi) {
    uint32_t r;
    if (BF) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ uint16_t kn_f2bf(float f) {  // round to nearest even, NaN kept
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Block-strided sweep over x[0, n) in float4s (n % 4 == 0, x 16-byte aligned):
 * each thread loads U float4s before using any, so that U loads are in flight
 * per thread, then calls f(i, v) for the float4 v = x[i..i+3]. */
template <int U, typename F>
__device__ __forceinline__ void kn_sweep4(const float *x, int64_t n, F f) {
    const int64_t T4 = (int64_t)blockDim.x * 4;
    for (int64_t b = (int64_t)threadIdx.x * 4; b < n; b += T4 * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t i = b + u * T4;
            if (i < n) v[u] = __ldg((const float4 *)(x + i));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t i = b + u * T4;
            if (i < n) f(i, v[u]);
        }
    }
}
