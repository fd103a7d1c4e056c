/* topk.cu: top-k and top-p (nucleus) selection over rows of logits.
 * Radix select on order-preserving float keys (key(f) is the float bits with
 * the sign bit flipped for positives and all bits flipped for negatives, so
 * unsigned key order equals float order). Four 8-bit digit passes, each a
 * shared-memory histogram over the elements that still match the prefix,
 * find the exact key of the k-th largest element; a collect pass gathers the
 * winners and a bitonic sort in shared memory orders them.
 * Top-p uses the same passes with a histogram of probability mass instead of
 * counts. One block of 1024 threads per row; rows are re-read from L2.
 * Non-goals: NaN logits; k > 1024; several blocks per row (batch-1 decode of
 * a 150k vocabulary runs on one SM: ~a few tens of microseconds). */
#include "backends/cuda/common.cuh"

#define TK_THREADS 1024
#define TK_KMAX 1024

__device__ __forceinline__ uint32_t tk_key(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Find the key of the k-th largest element of xr[0..V). Returns the key and
 * sets *n_eq_take = how many elements equal to it belong to the top k. */
__device__ uint32_t tk_select(const float *xr, int64_t V, bool vec, int k, int *n_eq_take,
                              unsigned *hist /*256*/, int *sh /*4*/) {
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        /* plain shared atomics: a warp-aggregated (match_any) version measured
         * slower here (245 vs 178 us for 1 x 151936, k = 50, H200) */
        auto add = [&](float f) {
            uint32_t key = tk_key(f);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        };
        if (vec) kn_sweep4<4>(xr, V, [&](int64_t, float4 v) { add(v.x); add(v.y); add(v.z); add(v.w); });
        else for (int64_t i = threadIdx.x; i < V; i += blockDim.x) add(xr[i]);
        __syncthreads();
        if (threadIdx.x < 32) {
            /* scan bins from 255 down; warp-parallel over 8 bins per lane */
            int lane = threadIdx.x;
            unsigned local = 0;
            for (int q = 0; q < 8; q++) local += hist[255 - (lane * 8 + q)];
            unsigned incl = local;                    // inclusive prefix over lanes
            for (int o = 1; o < 32; o <<= 1) {
                unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            unsigned excl = incl - local;
            if (excl < (unsigned)remaining && incl >= (unsigned)remaining) {
                unsigned c = excl;
                for (int q = 0; q < 8; q++) {
                    int bin = 255 - (lane * 8 + q);
                    unsigned h = hist[bin];
                    if (c + h >= (unsigned)remaining) { sh[0] = bin; sh[1] = remaining - (int)c; break; }
                    c += h;
                }
            }
        }
        __syncthreads();
        prefix |= (uint32_t)sh[0] << shift;
        mask |= 255u << shift;
        remaining = sh[1];
        __syncthreads();
    }
    *n_eq_take = remaining;
    return prefix;
}

__global__ void __launch_bounds__(TK_THREADS)
topk_kernel(float *vals, int32_t *idx, const float *x, int64_t V, int k, int kpow2, bool vec) {
    __shared__ unsigned hist[256];
    __shared__ int sh[4];
    __shared__ float sv[TK_KMAX];
    __shared__ int si[TK_KMAX];
    __shared__ int cnt_gt, cnt_eq;
    const float *xr = x + (int64_t)blockIdx.x * V;
    int n_eq = 0;
    uint32_t kth = tk_select(xr, V, vec, k, &n_eq, hist, sh);
    if (threadIdx.x == 0) { cnt_gt = 0; cnt_eq = 0; }
    for (int i = threadIdx.x; i < kpow2; i += blockDim.x) { sv[i] = -INFINITY; si[i] = -1; }
    __syncthreads();
    const int n_gt = k - n_eq;
    auto take = [&](int64_t i, float f) {
        uint32_t key = tk_key(f);
        if (key > kth) {
            int s = atomicAdd(&cnt_gt, 1);
            sv[s] = f; si[s] = (int)i;
        } else if (key == kth) {
            int s = atomicAdd(&cnt_eq, 1);
            if (s < n_eq) { sv[n_gt + s] = f; si[n_gt + s] = (int)i; }
        }
    };
    if (vec) kn_sweep4<4>(xr, V, [&](int64_t i, float4 v) { take(i, v.x); take(i + 1, v.y); take(i + 2, v.z); take(i + 3, v.w); });
    else for (int64_t i = threadIdx.x; i < V; i += blockDim.x) take(i, xr[i]);
    __syncthreads();
    /* bitonic sort, descending by value */
    for (int size = 2; size <= kpow2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < kpow2; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    float a = sv[i], b = sv[j];
                    if (desc ? (a < b) : (a > b)) {
                        sv[i] = b; sv[j] = a;
                        int t = si[i]; si[i] = si[j]; si[j] = t;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        vals[(int64_t)blockIdx.x * k + i] = sv[i];
        idx[(int64_t)blockIdx.x * k + i] = si[i];
    }
}

__global__ void __launch_bounds__(TK_THREADS)
topp_kernel(int32_t *n_keep, float *thresh, const float *x, int64_t V, float p, bool vec) {
    __shared__ float hmass[256];
    __shared__ float shm[32], shs[32];
    __shared__ int sh[2];
    __shared__ float sh_rem;
    __shared__ unsigned cnt;
    const float *xr = x + (int64_t)blockIdx.x * V;
    /* pass 0: max and sum of exp (online) */
    float m = -INFINITY, s = 0.f;
    if (vec) {
        kn_sweep4<4>(xr, V, [&](int64_t, float4 a) {
            float mx = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
            kn_ms_merge(m, s, mx, __expf(a.x - mx) + __expf(a.y - mx) + __expf(a.z - mx) + __expf(a.w - mx));
        });
    } else {
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) kn_ms_merge(m, s, xr[i], 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
    }
    if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = m; shs[threadIdx.x >> 5] = s; }
    __syncthreads();
    m = -INFINITY; s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) kn_ms_merge(m, s, shm[w], shs[w]);
    /* mass is measured in units of exp(x - m); the target is p * s */
    float remaining = p >= 1.f ? INFINITY : p * s;    // p = 1: keep everything
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hmass[i] = 0.f;
        __syncthreads();
        /* warp-aggregated: one shared atomic per distinct bin per warp. All
         * lanes of a warp run the loop together (the ballots need that). */
        auto add = [&](float f, bool in) {
            int bin = -1;
            float q = 0.f;
            if (in) {
                uint32_t key = tk_key(f);
                if ((key & mask) == prefix) { bin = (key >> shift) & 255; q = __expf(f - m); }
            }
            unsigned todo = __ballot_sync(0xffffffffu, bin >= 0);
            while (todo) {
                int lb = __shfl_sync(0xffffffffu, bin, __ffs(todo) - 1);
                bool mine = bin == lb;
                float v = kn_warp_sum(mine ? q : 0.f);
                if ((threadIdx.x & 31) == __ffs(todo) - 1) atomicAdd(&hmass[lb], v);
                todo &= ~__ballot_sync(0xffffffffu, mine);
            }
        };
        if (vec) {
            for (int64_t i0 = (threadIdx.x & ~31) * 4; i0 < V; i0 += (int64_t)blockDim.x * 4) {
                int64_t i = i0 + (threadIdx.x & 31) * 4;
                bool in = i < V;
                float4 a = in ? __ldg((const float4 *)(xr + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
                add(a.x, in); add(a.y, in); add(a.z, in); add(a.w, in);
            }
        } else {
            for (int64_t i0 = threadIdx.x & ~31; i0 < V; i0 += blockDim.x) {
                int64_t i = i0 + (threadIdx.x & 31);
                add(i < V ? xr[i] : 0.f, i < V);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            /* Target reached inside some bin: refine within it next pass. Not
             * reached (rounding of the mass sums, or p = 1): keep the lowest
             * non-empty bin, and keep taking the lowest later (remaining = inf). */
            float c = 0.f;
            int bin = -1, lowest = 0;
            for (int b = 255; b >= 0; b--) {
                if (hmass[b] <= 0.f) continue;
                lowest = b;
                if (remaining != INFINITY && c + hmass[b] >= remaining) { bin = b; break; }
                c += hmass[b];
            }
            sh[0] = bin >= 0 ? bin : lowest;
            sh_rem = bin >= 0 ? remaining - c : INFINITY;
        }
        __syncthreads();
        prefix |= (uint32_t)sh[0] << shift;
        mask |= 255u << shift;
        remaining = sh_rem;
        __syncthreads();
    }
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    unsigned c = 0;
    if (vec)
        kn_sweep4<4>(xr, V, [&](int64_t, float4 a) {
            c += (tk_key(a.x) >= prefix) + (tk_key(a.y) >= prefix) + (tk_key(a.z) >= prefix) + (tk_key(a.w) >= prefix);
        });
    else
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) c += tk_key(xr[i]) >= prefix;
    atomicAdd(&cnt, c);
    __syncthreads();
    if (threadIdx.x == 0) {
        n_keep[blockIdx.x] = (int32_t)cnt;
        uint32_t u = (prefix & 0x80000000u) ? (prefix & 0x7fffffffu) : ~prefix;
        thresh[blockIdx.x] = __uint_as_float(u);
    }
}

extern "C" kn_status kn_cuda_topk_f32(float *vals, int32_t *idx, const float *x, int64_t rows,
                                      int64_t V, int k, void *stream) {
    KN_CUDA_REQUIRE(rows >= 0 && rows <= INT32_MAX && V > 0 && V <= INT32_MAX,
                    "kn_cuda_topk_f32: bad shape rows=%lld V=%lld", (long long)rows, (long long)V);
    KN_CUDA_REQUIRE(k >= 1 && k <= TK_KMAX && k <= V,
                    "kn_cuda_topk_f32: k=%d must be in [1, min(V=%lld, %d)]", k, (long long)V, TK_KMAX);
    if (rows == 0) return KN_OK;
    KN_CUDA_REQUIRE(vals && idx && x, "kn_cuda_topk_f32: NULL pointer");
    int kp = 1;
    while (kp < k) kp <<= 1;
    bool vec = V % 4 == 0 && kn_aligned16(x);
    topk_kernel<<<(unsigned)rows, TK_THREADS, 0, kn_stream(stream)>>>(vals, idx, x, V, k, kp, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

extern "C" kn_status kn_cuda_topp_f32(int32_t *n_keep, float *thresh, const float *x, int64_t rows,
                                      int64_t V, float p, void *stream) {
    KN_CUDA_REQUIRE(rows >= 0 && rows <= INT32_MAX && V > 0 && V <= INT32_MAX,
                    "kn_cuda_topp_f32: bad shape rows=%lld V=%lld", (long long)rows, (long long)V);
    KN_CUDA_REQUIRE(p > 0.f && p <= 1.f, "kn_cuda_topp_f32: p=%g must be in (0, 1]", p);
    if (rows == 0) return KN_OK;
    KN_CUDA_REQUIRE(n_keep && thresh && x, "kn_cuda_topp_f32: NULL pointer");
    bool vec = V % 4 == 0 && kn_aligned16(x);
    topp_kernel<<<(unsigned)rows, TK_THREADS, 0, kn_stream(stream)>>>(n_keep, thresh, x, V, p, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
