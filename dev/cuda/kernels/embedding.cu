/* embedding.cu: embedding gather (forward) and scatter-add (backward).
 * One block per token row; 16-byte accesses when C % 4 == 0. The backward
 * adds with atomics (float4 atomics on sm_90), so repeated ids are safe. */
#include "kernels/kernels.h"   /* their declarations (extern "C") */
#include "backends/cuda/common.cuh"

__global__ void emb_fwd_kernel(float *out, const float *table, const int32_t *ids, int64_t V,
                               int64_t C, bool vec) {
    const int64_t r = blockIdx.x;
    const int id = ids[r];
    const bool ok = id >= 0 && id < V;
    float *o = out + r * C;
    const float *t = table + (int64_t)(ok ? id : 0) * C;
    if (vec) {
        for (int64_t i = threadIdx.x * 4; i < C; i += blockDim.x * 4)
            *(float4 *)(o + i) = ok ? __ldg((const float4 *)(t + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) o[i] = ok ? t[i] : 0.f;
    }
}

__global__ void emb_bwd_kernel(float *dtable, const float *dout, const int32_t *ids, int64_t V,
                               int64_t C, bool vec) {
    const int64_t r = blockIdx.x;
    const int id = ids[r];
    if (id < 0 || id >= V) return;
    const float *d = dout + r * C;
    float *t = dtable + (int64_t)id * C;
    if (vec) {
        for (int64_t i = threadIdx.x * 4; i < C; i += blockDim.x * 4) {
            float4 g = __ldg((const float4 *)(d + i));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd((float4 *)(t + i), g);
#else
            atomicAdd(t + i, g.x); atomicAdd(t + i + 1, g.y);
            atomicAdd(t + i + 2, g.z); atomicAdd(t + i + 3, g.w);
#endif
        }
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(t + i, d[i]);
    }
}

static int emb_threads(int64_t C) {
    int64_t t = (C % 4 == 0 ? C / 4 : C);
    if (t > 256) t = 256;
    return t < 32 ? 32 : (int)((t + 31) / 32 * 32);
}

extern "C" kn_status kn_cuda_embedding_fwd(float *out, const float *table, const int32_t *ids,
                                           int64_t n, int64_t V, int64_t C, void *stream) {
    KN_CUDA_REQUIRE(n >= 0 && n <= INT32_MAX && V > 0 && C > 0,
                    "kn_cuda_embedding_fwd: bad shape n=%lld V=%lld C=%lld", (long long)n,
                    (long long)V, (long long)C);
    if (n == 0) return KN_OK;
    KN_CUDA_REQUIRE(out && table && ids, "kn_cuda_embedding_fwd: NULL pointer");
    bool vec = C % 4 == 0 && kn_aligned16(out) && kn_aligned16(table);
    emb_fwd_kernel<<<(unsigned)n, emb_threads(C), 0, kn_stream(stream)>>>(out, table, ids, V, C, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
extern "C" kn_status kn_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
                                           int64_t n, int64_t V, int64_t C, void *stream) {
    KN_CUDA_REQUIRE(n >= 0 && n <= INT32_MAX && V > 0 && C > 0,
                    "kn_cuda_embedding_bwd: bad shape n=%lld V=%lld C=%lld", (long long)n,
                    (long long)V, (long long)C);
    if (n == 0) return KN_OK;
    KN_CUDA_REQUIRE(dtable && dout && ids, "kn_cuda_embedding_bwd: NULL pointer");
    bool vec = C % 4 == 0 && kn_aligned16(dtable) && kn_aligned16(dout);
    emb_bwd_kernel<<<(unsigned)n, emb_threads(C), 0, kn_stream(stream)>>>(dtable, dout, ids, V, C, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
