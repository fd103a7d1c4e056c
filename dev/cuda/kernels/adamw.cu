/* adamw.cu: fused AdamW update, in place over params, m, v (f32).
 * Bytes per element: read p, g, m, v; write p, m, v (28 bytes). */
#include "kernels/kernels.h"   /* their declarations (extern "C") */
#include "backends/cuda/common.cuh"

__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g, float lr,
                                          float b1, float b2, float eps, float wd, float c1,
                                          float c2) {
    m = b1 * m + (1.f - b1) * g;
    v = b2 * v + (1.f - b2) * g * g;
    float mh = m / c1, vh = v / c2;
    p -= lr * (mh / (sqrtf(vh) + eps) + wd * p);
}

__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float c1, float c2,
                             bool vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t i = t0; i < n4; i += stride) {
            float4 pp = ((float4 *)p)[i], mm = ((float4 *)m)[i], vv = ((float4 *)v)[i];
            float4 gg = __ldg((const float4 *)g + i);
            adamw_one(pp.x, mm.x, vv.x, gg.x, lr, b1, b2, eps, wd, c1, c2);
            adamw_one(pp.y, mm.y, vv.y, gg.y, lr, b1, b2, eps, wd, c1, c2);
            adamw_one(pp.z, mm.z, vv.z, gg.z, lr, b1, b2, eps, wd, c1, c2);
            adamw_one(pp.w, mm.w, vv.w, gg.w, lr, b1, b2, eps, wd, c1, c2);
            ((float4 *)p)[i] = pp; ((float4 *)m)[i] = mm; ((float4 *)v)[i] = vv;
        }
        for (int64_t i = n4 * 4 + t0; i < n; i += stride)
            adamw_one(p[i], m[i], v[i], g[i], lr, b1, b2, eps, wd, c1, c2);
    } else {
        for (int64_t i = t0; i < n; i += stride)
            adamw_one(p[i], m[i], v[i], g[i], lr, b1, b2, eps, wd, c1, c2);
    }
}

extern "C" kn_status kn_cuda_adamw(float *params, float *m, float *v, const float *grads,
                                   int64_t n, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int t, void *stream) {
    KN_CUDA_REQUIRE(n >= 0, "kn_cuda_adamw: n=%lld < 0", (long long)n);
    KN_CUDA_REQUIRE(t >= 1, "kn_cuda_adamw: step t=%d, must start at 1", t);
    KN_CUDA_REQUIRE(beta1 >= 0.f && beta1 < 1.f && beta2 >= 0.f && beta2 < 1.f,
                    "kn_cuda_adamw: betas (%g, %g) must be in [0, 1)", beta1, beta2);
    if (n == 0) return KN_OK;
    KN_CUDA_REQUIRE(params && m && v && grads, "kn_cuda_adamw: NULL pointer");
    float c1 = (float)(1.0 - pow((double)beta1, t)), c2 = (float)(1.0 - pow((double)beta2, t));
    bool vec = kn_aligned16(params) && kn_aligned16(m) && kn_aligned16(v) && kn_aligned16(grads);
    int dev = 0, nsm = 0;
    KN_CUDA_TRY(cudaGetDevice(&dev));
    KN_CUDA_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    int64_t need = ((vec ? n / 4 : n) + 255) / 256;
    int64_t grid = need < (int64_t)nsm * 8 ? need : (int64_t)nsm * 8;
    if (grid < 1) grid = 1;
    adamw_kernel<<<(unsigned)grid, 256, 0, kn_stream(stream)>>>(params, m, v, grads, n, lr, beta1,
                                                               beta2, eps, weight_decay, c1, c2, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
