/* crossentropy.cu: fused softmax cross-entropy, forward and backward in one
 * kernel over logits[B,V]: loss[b] = logsumexp(x[b]) - x[b,t] and
 * dlogits = dloss * (softmax - onehot) (which may overwrite the logits).
 * When V is a multiple of 4 and the pointers are 16-byte aligned, the row is
 * held in registers by the kernel of rowsoftmax.cuh, split over a cluster of
 * up to 8 blocks (1 read + 1 write of V; dev/cuda/softmax/, v3 reductions).
 * Otherwise one block per row runs an online (max, sum) pass and re-reads the
 * row (mostly from L2) to write dlogits. */
#include "kernels/kernels.h"   /* their declarations (extern "C") */
#include "backends/cuda/rowsoftmax.cuh"   // defines: rowsm_kernel, rowsm_plan

#define KN_CE_THREADS 1024

/* Fallback: any V, any alignment; vec: V % 4 == 0 and 16-byte aligned rows. */
__global__ void __launch_bounds__(KN_CE_THREADS)
ce_kernel(float *losses, float *dlogits, const float *logits, const int32_t *targets, int64_t V,
          float dloss, bool vec) {
    __shared__ float shm[32], shs[32];
    const int64_t b = blockIdx.x;
    const float *xr = logits + b * V;
    const int t = targets[b];
    const bool valid = t >= 0 && t < V;
    const float xt = valid ? xr[t] : 0.f;     // read before any in-place write
    float m = -INFINITY, s = 0.f;
    if (vec) {
        kn_sweep4<4>(xr, V, [&](int64_t, float4 a) {
            float mx = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
            if (mx != -INFINITY)    // four -inf: nothing to add (exp(-inf - -inf) is NaN)
                kn_ms_merge(m, s, mx, __expf(a.x - mx) + __expf(a.y - mx) + __expf(a.z - mx) + __expf(a.w - mx));
        });
    } else {
        for (int64_t i = threadIdx.x; i < V; i += KN_CE_THREADS) kn_ms_merge(m, s, xr[i], 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { shm[w] = m; shs[w] = s; }
    __syncthreads();
    m = -INFINITY; s = 0.f;
    for (int k = 0; k < KN_CE_THREADS / 32; k++) kn_ms_merge(m, s, shm[k], shs[k]);
    if (threadIdx.x == 0) losses[b] = valid ? (logf(s) + m - xt) : 0.f;
    if (!dlogits) return;
    float *dr = dlogits + b * V;
    const float sc = valid ? dloss / s : 0.f;
    if (vec) {
        auto emit = [&](int64_t i, float4 a) {
            float4 g = make_float4(__expf(a.x - m) * sc, __expf(a.y - m) * sc,
                                   __expf(a.z - m) * sc, __expf(a.w - m) * sc);
            if (valid && t >= i && t < i + 4) (&g.x)[t - i] -= dloss;
            *(float4 *)(dr + i) = g;
        };
        kn_sweep4<4>(xr, V, emit);
    } else {
        for (int64_t i = threadIdx.x; i < V; i += KN_CE_THREADS) {
            float g = __expf(xr[i] - m) * sc;
            if (valid && i == t) g -= dloss;
            dr[i] = g;
        }
    }
}

extern "C" kn_status kn_cuda_crossentropy_fwd_bwd(float *losses, float *dlogits,
                                                  const float *logits, const int32_t *targets,
                                                  int64_t B, int64_t V, float dloss,
                                                  void *stream) {
    KN_CUDA_REQUIRE(B >= 0 && B <= INT32_MAX && V > 0 && V <= INT32_MAX,
                    "kn_cuda_crossentropy_fwd_bwd: bad shape B=%lld V=%lld", (long long)B,
                    (long long)V);
    if (B == 0) return KN_OK;
    KN_CUDA_REQUIRE(losses && logits && targets, "kn_cuda_crossentropy_fwd_bwd: NULL pointer");
    bool vec = V % 4 == 0 && kn_aligned16(logits) && (!dlogits || kn_aligned16(dlogits));
    if (vec) {
        int nsm = 0;
        bool cluster_ok = false;
        kn_status st = rowsm_device(&nsm, &cluster_ok);
        if (st) return st;
        RsmPlan p;
        if (rowsm_plan<float>(B, V, nsm, cluster_ok, &p)) {
            RsmArgs a = {};
            a.y = dlogits; a.x = logits; a.cols = V;
            a.losses = losses; a.targets = targets; a.dloss = dloss;
            return rowsm_launch<float, RSM_XENT>(p, B, a, kn_stream(stream));
        }
    }
    ce_kernel<<<(unsigned)B, KN_CE_THREADS, 0, kn_stream(stream)>>>(losses, dlogits, logits, targets,
                                                                     V, dloss, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
