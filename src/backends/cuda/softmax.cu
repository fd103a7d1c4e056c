/* softmax.cu: row-wise softmax, f32 and bf16.
 * Rows whose length is a multiple of the 16-byte vector (4 f32 / 8 bf16), up
 * to 8 x 32768 elements, run the register kernel of rowsoftmax.cuh: one read
 * and one write, long rows split over a cluster of up to 8 blocks (v6 of
 * dev/cuda/softmax/). Other rows use an online (max, sum) pass then a
 * normalize pass (two reads; the second mostly hits L2).
 */
#include "backends/cuda/rowsoftmax.cuh"   // defines: rowsm_kernel, rowsm_plan, SmVec

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
            if (mx != -INFINITY)    // four -inf: nothing to add (exp(-inf - -inf) is NaN)
                kn_ms_merge(m, s, mx, __expf(a.x - mx) + __expf(a.y - mx) + __expf(a.z - mx) + __expf(a.w - mx));
        });
    } else if (vec) {
        for (int64_t i = threadIdx.x * 4; i < cols; i += KN_SM_ONLINE_THREADS * 4) {
            f4 a = sm_ld4(xr + i);
            float mx = fmaxf(fmaxf(a.v[0], a.v[1]), fmaxf(a.v[2], a.v[3]));
            float t = __expf(a.v[0] - mx) + __expf(a.v[1] - mx) + __expf(a.v[2] - mx) + __expf(a.v[3] - mx);
            if (mx != -INFINITY) kn_ms_merge(m, s, mx, t);
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
    if (vec16) {
        int nsm = 0;
        bool cluster_ok = false;
        kn_status s = rowsm_device(&nsm, &cluster_ok);
        if (s) return s;
        RsmPlan p;
        if (rowsm_plan<T>(rows, cols, nsm, cluster_ok, &p)) {
            RsmArgs a = {};
            a.y = y; a.x = x; a.cols = cols;
            return rowsm_launch<T, RSM_SOFTMAX>(p, rows, a, kn_stream(stream));
        }
    }
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
