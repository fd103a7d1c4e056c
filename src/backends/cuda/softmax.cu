/* softmax.cu: row-wise softmax, f32 and bf16.
 * One block per row. Rows of up to 256 * 8 16-byte vectors (8192 f32 or
 * 16384 bf16, cols a multiple of the vector) stay in registers: one read,
 * one write. Longer rows use an online
 * (max, sum) pass then a normalize pass (two reads; the second mostly hits L2).
 */
#include "backends/cuda/common.cuh"

#define KN_SM_THREADS 256

struct f4 { float v[4]; };
__device__ __forceinline__ f4 sm_ld4(const float *p) {
    float4 t = __ldg((const float4 *)p); f4 r = {{t.x, t.y, t.z, t.w}}; return r;
}
__device__ __forceinline__ f4 sm_ld4(const uint16_t *p) {
    uint2 t = *(const uint2 *)p;
    f4 r = {{kn_bf2f(t.x & 0xffff), kn_bf2f(t.x >> 16), kn_bf2f(t.y & 0xffff), kn_bf2f(t.y >> 16)}};
    return r;
}
__device__ __forceinline__ void sm_st4(float *p, f4 a) { *(float4 *)p = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]); }
__device__ __forceinline__ void sm_st4(uint16_t *p, f4 a) {
    uint2 t; t.x = kn_f2bf(a.v[0]) | ((uint32_t)kn_f2bf(a.v[1]) << 16);
    t.y = kn_f2bf(a.v[2]) | ((uint32_t)kn_f2bf(a.v[3]) << 16);
    *(uint2 *)p = t;
}
__device__ __forceinline__ float sm_ld1(const float *p) { return *p; }
__device__ __forceinline__ float sm_ld1(const uint16_t *p) { return kn_bf2f(*p); }
__device__ __forceinline__ void sm_st1(float *p, float v) { *p = v; }
__device__ __forceinline__ void sm_st1(uint16_t *p, float v) { *p = kn_f2bf(v); }

/* 16-byte vectors: 4 f32 or 8 bf16 elements. */
template <typename T> struct SmVec;
template <> struct SmVec<float> {
    static constexpr int E = 4;
    static __device__ __forceinline__ void ld(const float *p, float *o) {
        float4 t = __ldcs((const float4 *)p); o[0] = t.x; o[1] = t.y; o[2] = t.z; o[3] = t.w;
    }
    static __device__ __forceinline__ void st(float *p, const float *o) {
        __stcs((float4 *)p, make_float4(o[0], o[1], o[2], o[3]));
    }
};
template <> struct SmVec<uint16_t> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void ld(const uint16_t *p, float *o) {
        uint4 t = __ldcs((const uint4 *)p);
        uint32_t w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int q = 0; q < 4; q++) { o[2 * q] = kn_bf2f(w[q] & 0xffff); o[2 * q + 1] = kn_bf2f(w[q] >> 16); }
    }
    static __device__ __forceinline__ void st(uint16_t *p, const float *o) {
        uint4 t;
        t.x = kn_f2bf(o[0]) | ((uint32_t)kn_f2bf(o[1]) << 16);
        t.y = kn_f2bf(o[2]) | ((uint32_t)kn_f2bf(o[3]) << 16);
        t.z = kn_f2bf(o[4]) | ((uint32_t)kn_f2bf(o[5]) << 16);
        t.w = kn_f2bf(o[6]) | ((uint32_t)kn_f2bf(o[7]) << 16);
        __stcs((uint4 *)p, t);
    }
};

/* Row held in registers: cols % E == 0, cols <= KN_SM_THREADS * E * VPT.
 * All loads are issued before the first reduction. */
template <typename T, int VPT>
__global__ void __launch_bounds__(KN_SM_THREADS)
softmax_reg_kernel(T *y, const T *x, int cols) {
    constexpr int E = SmVec<T>::E;
    __shared__ float sh[32];
    const T *xr = x + (int64_t)blockIdx.x * cols;
    T *yr = y + (int64_t)blockIdx.x * cols;
    float r[VPT][E];
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_SM_THREADS) * E;
        if (i < cols) SmVec<T>::ld(xr + i, r[j]);
    }
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_SM_THREADS) * E;
        if (i < cols)
#pragma unroll
            for (int q = 0; q < E; q++) m = fmaxf(m, r[j][q]);
    }
    m = kn_block_max(m, sh);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_SM_THREADS) * E;
        if (i < cols)
#pragma unroll
            for (int q = 0; q < E; q++) { r[j][q] = __expf(r[j][q] - m); s += r[j][q]; }
    }
    s = kn_block_sum(s, sh);
    float inv = 1.f / s;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_SM_THREADS) * E;
        if (i < cols) {
#pragma unroll
            for (int q = 0; q < E; q++) r[j][q] *= inv;
            SmVec<T>::st(yr + i, r[j]);
        }
    }
}

#define KN_SM_ONLINE_THREADS 1024   /* long rows: few rows, so many threads per row */
template <typename T>
__global__ void __launch_bounds__(KN_SM_ONLINE_THREADS)
softmax_online_kernel(T *y, const T *x, int64_t cols, bool vec) {
    __shared__ float shm[32], shs[32];
    const T *xr = x + (int64_t)blockIdx.x * cols;
    T *yr = y + (int64_t)blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    if (vec && sizeof(T) == 4) {
        kn_sweep4<4>((const float *)xr, cols, [&](int64_t, float4 a) {
            float mx = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
            kn_ms_merge(m, s, mx, __expf(a.x - mx) + __expf(a.y - mx) + __expf(a.z - mx) + __expf(a.w - mx));
        });
    } else if (vec) {
        for (int64_t i = threadIdx.x * 4; i < cols; i += KN_SM_ONLINE_THREADS * 4) {
            f4 a = sm_ld4(xr + i);
            float mx = fmaxf(fmaxf(a.v[0], a.v[1]), fmaxf(a.v[2], a.v[3]));
            float t = __expf(a.v[0] - mx) + __expf(a.v[1] - mx) + __expf(a.v[2] - mx) + __expf(a.v[3] - mx);
            kn_ms_merge(m, s, mx, t);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += KN_SM_ONLINE_THREADS) kn_ms_merge(m, s, sm_ld1(xr + i), 1.f);
    }
    /* merge (m, s) over the warp, then over warps */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { shm[w] = m; shs[w] = s; }
    __syncthreads();
    m = -INFINITY; s = 0.f;
    for (int k = 0; k < KN_SM_ONLINE_THREADS / 32; k++) kn_ms_merge(m, s, shm[k], shs[k]);
    float inv = 1.f / s;
    if (vec && sizeof(T) == 4) {
        kn_sweep4<4>((const float *)xr, cols, [&](int64_t i, float4 a) {
            __stcs((float4 *)((float *)yr + i), make_float4(__expf(a.x - m) * inv, __expf(a.y - m) * inv,
                                                             __expf(a.z - m) * inv, __expf(a.w - m) * inv));
        });
    } else if (vec) {
        for (int64_t i = threadIdx.x * 4; i < cols; i += KN_SM_ONLINE_THREADS * 4) {
            f4 a = sm_ld4(xr + i);
#pragma unroll
            for (int q = 0; q < 4; q++) a.v[q] = __expf(a.v[q] - m) * inv;
            sm_st4(yr + i, a);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += KN_SM_ONLINE_THREADS)
            sm_st1(yr + i, __expf(sm_ld1(xr + i) - m) * inv);
    }
}

template <typename T>
static kn_status softmax_launch(const char *name, T *y, const T *x, int64_t rows, int64_t cols,
                                void *stream, int align) {
    KN_CUDA_REQUIRE(rows >= 0 && cols > 0 && rows <= INT32_MAX,
                    "%s: bad shape rows=%lld cols=%lld", name, (long long)rows, (long long)cols);
    if (rows == 0) return KN_OK;
    KN_CUDA_REQUIRE(x && y, "%s: NULL pointer", name);
    constexpr int E = SmVec<T>::E;
    bool vec = cols % 4 == 0 && ((uintptr_t)x % align) == 0 && ((uintptr_t)y % align) == 0;
    bool vec16 = cols % E == 0 && kn_aligned16(x) && kn_aligned16(y);
    if (vec16 && cols <= KN_SM_THREADS * E * 8) {
        /* fewest vectors per thread that cover the row */
        int64_t per = (cols / E + KN_SM_THREADS - 1) / KN_SM_THREADS;
        cudaStream_t st = kn_stream(stream);
        if (per <= 1) softmax_reg_kernel<T, 1><<<(unsigned)rows, KN_SM_THREADS, 0, st>>>(y, x, (int)cols);
        else if (per <= 2) softmax_reg_kernel<T, 2><<<(unsigned)rows, KN_SM_THREADS, 0, st>>>(y, x, (int)cols);
        else if (per <= 4) softmax_reg_kernel<T, 4><<<(unsigned)rows, KN_SM_THREADS, 0, st>>>(y, x, (int)cols);
        else softmax_reg_kernel<T, 8><<<(unsigned)rows, KN_SM_THREADS, 0, st>>>(y, x, (int)cols);
    } else
        softmax_online_kernel<T><<<(unsigned)rows, KN_SM_ONLINE_THREADS, 0, kn_stream(stream)>>>(y, x, cols, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

extern "C" kn_status kn_cuda_softmax_f32(float *y, const float *x, int64_t rows, int64_t cols,
                                         void *stream) {
    return softmax_launch<float>("kn_cuda_softmax_f32", y, x, rows, cols, stream, 16);
}
extern "C" kn_status kn_cuda_softmax_bf16(uint16_t *y, const uint16_t *x, int64_t rows,
                                          int64_t cols, void *stream) {
    return softmax_launch<uint16_t>("kn_cuda_softmax_bf16", y, x, rows, cols, stream, 8);
}
