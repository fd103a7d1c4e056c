/* topk.cu: top-k and top-p (nucleus) selection over rows of logits.
 * Radix select on order-preserving float keys (key(f) is the float bits with
 * the sign bit flipped for positives and all bits flipped for negatives, so
 * unsigned key order equals float order). Four 8-bit digit passes, each a
 * shared-memory histogram over the elements that still match the prefix,
 * find the exact key of the k-th largest element; a collect pass gathers the
 * winners and a bitonic sort in shared memory orders them. Top-p uses the
 * same passes with a histogram of probability mass instead of counts.
 * On sm_90 a row is split over a thread-block cluster and held in shared
 * memory (the cluster path below, v4 of dev/cuda/topk/); elsewhere one block
 * of 1024 threads per row re-reads the row from L2.
 * Non-goals: NaN logits; k > 1024. */
#include "kernels/kernels.h"   /* their declarations (extern "C") */
#include "backends/cuda/common.cuh"   // defines: kn_sweep4, kn_block_max, kn_ms_merge
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune
#include <cooperative_groups.h>
#include <type_traits>

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

/* Bitonic sort of sv/si[0..kpow2) in shared memory, descending by value;
 * the whole block takes part (contains __syncthreads). */
__device__ void tk_bitonic_desc(float *sv, int *si, int kpow2) {
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
    tk_bitonic_desc(sv, si, kpow2);
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

/* ---- cluster path (sm_90): the row split over the blocks of a cluster -------------
 * Block `rank` of a cluster of cl blocks copies its chunk of the row into
 * shared memory once; a 151936-entry row takes cl = 8 or 16 SMs instead of
 * one. Digit passes build per-block histograms that the blocks read from
 * each other through distributed shared memory (one cluster barrier each).
 *
 * Pass 1 (top 8 bits of the key) sees every element. Its histogram is
 * lane-replicated (32 copies, row stride 257 words; lane l adds into copy l),
 * so the 32 atomics of one warp instruction hit 32 different banks even when
 * all lanes land in one bin (logits crowd a few top-digit bins). Top-k builds
 * it while copying the chunk in. After pass 1 a compaction pass walks the
 * chunk once more: elements above the chosen bin are winners outright (top-k
 * sends them to rank 0; top-p counts them), elements in it go to a short list
 * of 16-bit local indices. Passes 2-4 and the final collect walk only that
 * list, with one plain 256-bin histogram. A block whose list overflows
 * (TKC_CAP) walks its whole chunk instead, with the same predicates.
 *
 * Top-p weights are probability masses in 64-bit fixed point (exp(x - max)
 * * 2^mshift, rounded), added as two native 32-bit shared atomics with a
 * carry (tk_add64): float or 64-bit atomicAdd on shared memory compiles to a
 * compare-and-swap loop on sm_90. Integer sums are also exact, so every
 * block of the cluster sees the same totals whatever the order of adds.
 *
 * The top-k winners go straight into rank 0's shared memory (distributed-
 * shared-memory atomics), which sorts only those k. */
#define TKC_THREADS 512
#define TKC_REP 257
#define TKC_WORDS (32 * TKC_REP)       /* the replicated histogram, 32-bit words    */
/* after pass 1 the replicated histogram's words are reused as: */
#define TKC_SV 0                       /* rank 0 (top-k): values [TK_KMAX], indices [TK_KMAX] */
#define TKC_H1 (2 * TK_KMAX)           /* passes 2-4: lo[256], hi[256]             */
#define TKC_GLOB (TKC_H1 + 512)        /* the cluster's histogram, 256 x 64 bits   */
#define TKC_LIST (TKC_GLOB + 512)      /* candidates: 16-bit local indices         */
#define TKC_CAP (2 * (TKC_WORDS - TKC_LIST))

struct TkcArgs {
    const float *x;     /* [rows, V]                                          */
    int64_t V;
    int chunk;          /* elements per block, a multiple of 4, < 65536       */
    int cl;             /* blocks per row (cluster size)                      */
    bool vec;           /* V % 4 == 0 and x 16-byte aligned                   */
    int k, kpow2;       /* top-k                                              */
    float *vals;        /* [rows, k]                                          */
    int32_t *idx;       /* [rows, k]                                          */
    float p;            /* top-p                                              */
    float mscale;       /* top-p: 2^mshift, the fixed-point unit of mass 1    */
    int32_t *n_keep;    /* [rows]                                             */
    float *thresh;      /* [rows]                                             */
};

#if __CUDA_ARCH__ >= 900
namespace cg = cooperative_groups;
typedef unsigned long long tk_u64;
/* The pointer `q` of this block's shared memory, as seen in block `r` of the cluster. */
template <typename P> __device__ __forceinline__ P *tkc_peer(P *q, int r, int cl) {
    return cl > 1 ? cg::this_cluster().map_shared_rank(q, r) : q;
}
__device__ __forceinline__ void tkc_sync(int cl) {
    if (cl > 1) cg::this_cluster().sync(); else __syncthreads();
}

/* v into the 64-bit counter (hi:lo) with two native 32-bit atomics: the add
 * carries out of lo exactly when the value lo held before it, plus v's low
 * word, wraps. */
__device__ __forceinline__ void tk_add64(unsigned *lo, unsigned *hi, tk_u64 v) {
    const unsigned l = (unsigned)v, old = atomicAdd(lo, l);
    const unsigned h = (unsigned)(v >> 32) + (old + l < old);
    if (h) atomicAdd(hi, h);
}

/* Call f(i, v) for every element v = xs[i] of the chunk (n elements). */
template <typename F> __device__ __forceinline__ void tkc_each(const float *xs, int n, F f) {
    const int n4 = n >> 2;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = ((const float4 *)xs)[i];
        f(4 * i, v.x); f(4 * i + 1, v.y); f(4 * i + 2, v.z); f(4 * i + 3, v.w);
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) f(i, xs[i]);
}
/* The same walk in warp-uniform steps: all lanes of a warp make the same
 * calls f(i, v, ok), ok = false past the end, so f may use warp votes. */
template <typename F> __device__ __forceinline__ void tkc_each_u(const float *xs, int n, F f) {
    const int n4 = n >> 2, lim = (n4 + 31) & ~31;
    for (int i = threadIdx.x; i < lim; i += blockDim.x) {
        const bool ok = i < n4;
        const float4 v = ok ? ((const float4 *)xs)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        f(4 * i, v.x, ok); f(4 * i + 1, v.y, ok); f(4 * i + 2, v.z, ok); f(4 * i + 3, v.w, ok);
    }
    if (threadIdx.x < 32) {
        const int i = 4 * n4 + threadIdx.x;
        f(i, i < n ? xs[i] : 0.f, i < n);
    }
}
/* Call f(i, xs[i]) for the candidates: the list when it held all nc of them,
 * else every element of the chunk (f's own predicate then filters). */
template <typename F>
__device__ __forceinline__ void tkc_each_c(const float *xs, int n, const uint16_t *list, int nc, F f) {
    if (nc <= TKC_CAP) {
        for (int j = threadIdx.x; j < nc; j += blockDim.x) { const int i = list[j]; f(i, xs[i]); }
    } else {
        tkc_each(xs, n, f);
    }
}
/* Append local index i to the list when `in` (warp-aggregated: one shared
 * atomic per warp); every lane of the warp must call it. */
__device__ __forceinline__ void tkc_append(uint16_t *list, int *ncand, int i, bool in) {
    const unsigned b = __ballot_sync(0xffffffffu, in);
    if (!b) return;
    const int lane = threadIdx.x & 31;
    int base = 0;
    if (lane == 0) base = atomicAdd(ncand, __popc(b));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int pos = base + __popc(b & ((1u << lane) - 1u));
    if (in && pos < TKC_CAP) list[pos] = (uint16_t)i;
}

/* Pass 1's replicated histogram: count (32 copies, one per lane) or 64-bit
 * mass (16 copies of lo[257], hi[257]; lanes l and l + 16 share one). */
__device__ __forceinline__ void tkc_rep_count(unsigned *rep, int bin) {
    atomicAdd(rep + (threadIdx.x & 31) * TKC_REP + bin, 1u);
}
__device__ __forceinline__ void tkc_rep_mass(unsigned *rep, int bin, tk_u64 w) {
    unsigned *c = rep + (threadIdx.x & 15) * 2 * TKC_REP;
    tk_add64(c + bin, c + TKC_REP + bin, w);
}
/* tb[256] = the sum of the copies. */
__device__ void tkc_rep_sum(const unsigned *rep, unsigned *tb) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        unsigned s = 0;
#pragma unroll 8
        for (int c = 0; c < 32; c++) s += rep[c * TKC_REP + b];
        tb[b] = s;
    }
}
__device__ void tkc_rep_sum(const unsigned *rep, tk_u64 *tb) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        tk_u64 s = 0;
#pragma unroll 4
        for (int c = 0; c < 16; c++)
            s += ((tk_u64)rep[c * 2 * TKC_REP + TKC_REP + b] << 32) | rep[c * 2 * TKC_REP + b];
        tb[b] = s;
    }
}
/* glob[256] = the sum over the cluster's blocks of their tb[256]; begins with
 * the cluster barrier that publishes every tb, ends with a __syncthreads. */
template <typename W> __device__ void tkc_merge(W *tb, W *glob, int cl) {
    tkc_sync(cl);
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        W s = 0;
        for (int r = 0; r < cl; r++) s += tkc_peer(tb, r, cl)[b];
        glob[b] = s;
    }
    __syncthreads();
}
/* Passes 2-4: the cluster's histogram of digit (key >> shift) & 255 over the
 * candidates matching prefix under mask, counts (W = unsigned) or masses
 * exp(x - M) * mscale (W = 64-bit), into glob. h1: 512 words of scratch. */
template <typename W>
__device__ void tkc_pass(const float *xs, int n, const uint16_t *list, int nc, uint32_t prefix, uint32_t mask,
                         int shift, float M, float mscale, unsigned *h1, W *tb, W *glob, int cl) {
    for (int b = threadIdx.x; b < 512; b += blockDim.x) h1[b] = 0;
    __syncthreads();
    tkc_each_c(xs, n, list, nc, [&](int, float f) {
        const uint32_t key = tk_key(f);
        if ((key & mask) == prefix) {
            const int bin = (key >> shift) & 255;
            if constexpr (std::is_same<W, tk_u64>::value) tk_add64(h1 + bin, h1 + 256 + bin, __float2ull_rn(__expf(f - M) * mscale));
            else atomicAdd(h1 + bin, 1u);
        }
    });
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        if constexpr (std::is_same<W, tk_u64>::value) tb[b] = ((tk_u64)h1[256 + b] << 32) | h1[b];
        else tb[b] = h1[b];
    }
    tkc_merge(tb, glob, cl);
}

/* Warp 0: walk glob from bin 255 down until the running total reaches
 * `remaining`; *bin = that bin, *rem = what is still needed inside it. If the
 * total never reaches it (remaining = "all"), the lowest non-empty bin, with
 * *rem = the largest W. Ends with a __syncthreads. */
template <typename W>
__device__ void tkc_scan(const W *glob, W remaining, int *bin, W *rem) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        W local = 0;
        for (int q = 0; q < 8; q++) local += glob[255 - (lane * 8 + q)];
        W incl = local;
        for (int o = 1; o < 32; o <<= 1) {
            W t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        W excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0) excl = 0;
        unsigned hit = __ballot_sync(0xffffffffu, excl < remaining && incl >= remaining);
        if (hit) {
            if (lane == __ffs(hit) - 1) {
                W c = excl;
                for (int q = 0; q < 8; q++) {
                    int b = 255 - (lane * 8 + q);
                    W h = glob[b];
                    if (h > 0 && c + h >= remaining) { *bin = b; *rem = remaining - c; break; }
                    c += h;
                }
            }
        } else {
            unsigned ne = __ballot_sync(0xffffffffu, local > 0);
            int l = ne ? 31 - __clz(ne) : 0;
            if (lane == l) {
                int b = 255 - lane * 8;
                for (int q = 0; q < 8; q++) if (glob[255 - (lane * 8 + q)] > 0) b = 255 - (lane * 8 + q);
                *bin = b;
                *rem = ~(W)0;
            }
        }
    }
    __syncthreads();
}
#endif

/* Load this block's chunk of row blockIdx.x / cl into xs, calling f(v) on
 * each element on the way (pass-1 work that needs nothing else); returns the
 * chunk's length. Ends with a __syncthreads. */
template <typename F>
__device__ __forceinline__ int tkc_load(const TkcArgs &a, float *xs, int64_t row, int rank, F f) {
    const int64_t lo = (int64_t)rank * a.chunk;
    const int n = (int)(a.V - lo < a.chunk ? (a.V - lo > 0 ? a.V - lo : 0) : a.chunk);
    const float *xr = a.x + row * a.V + lo;
    if (a.vec) {
        const int n4 = n >> 2, T = blockDim.x;
        int i = threadIdx.x;
        for (; i < n4; i += 8 * T) {          // 8 loads in flight: 64 KB per block
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i + u * T < n4) v[u] = __ldcs((const float4 *)xr + i + u * T);
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i + u * T < n4) { ((float4 *)xs)[i + u * T] = v[u]; f(v[u].x); f(v[u].y); f(v[u].z); f(v[u].w); }
        }
        for (i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) { xs[i] = xr[i]; f(xs[i]); }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) { xs[i] = xr[i]; f(xs[i]); }
    }
    __syncthreads();
    return n;
}

__global__ void __launch_bounds__(TKC_THREADS, 2)
topk_cluster_kernel(TkcArgs a) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ float4 tkc_dyn[];
    float *xs = (float *)tkc_dyn;
    __shared__ __align__(16) unsigned rep[TKC_WORDS];
    __shared__ unsigned tot[2][256];
    __shared__ int sel_bin, cnt_gt, cnt_eq, ncand;
    __shared__ unsigned sel_rem;
    const int cl = a.cl, rank = blockIdx.x % cl;
    const int64_t row = blockIdx.x / cl;
    if (threadIdx.x == 0) { cnt_gt = 0; cnt_eq = 0; ncand = 0; }
    for (int i = threadIdx.x; i < TKC_WORDS; i += blockDim.x) rep[i] = 0;
    __syncthreads();
    /* pass 1 (top digit), counted while the chunk is copied in */
    const int n = tkc_load(a, xs, row, rank, [&](float f) { tkc_rep_count(rep, tk_key(f) >> 24); });
    tkc_rep_sum(rep, tot[0]);
    unsigned *glob = rep + TKC_GLOB, *h1 = rep + TKC_H1;
    uint16_t *list = (uint16_t *)(rep + TKC_LIST);
    tkc_merge(tot[0], glob, cl);     // from here on rep holds the reused areas
    tkc_scan<unsigned>(glob, (unsigned)a.k, &sel_bin, &sel_rem);
    const uint32_t top = (uint32_t)sel_bin;
    uint32_t prefix = top << 24, mask = 0xff000000u;
    unsigned remaining = sel_rem;
    /* compaction: above the bin = winners (to rank 0), in the bin = candidates */
    float *sv0 = tkc_peer((float *)rep + TKC_SV, 0, cl);
    int *si0 = tkc_peer((int *)rep + TKC_SV + TK_KMAX, 0, cl);
    int *gt0 = tkc_peer(&cnt_gt, 0, cl), *eq0 = tkc_peer(&cnt_eq, 0, cl);
    const int64_t lo = (int64_t)rank * a.chunk;
    tkc_each_u(xs, n, [&](int i, float f, bool ok) {
        const uint32_t kt = tk_key(f) >> 24;
        if (ok && kt > top) {
            int s = atomicAdd(gt0, 1);
            sv0[s] = f; si0[s] = (int)(lo + i);
        }
        tkc_append(list, &ncand, i, ok && kt == top);
    });
    __syncthreads();
    const int nc = ncand;
    for (int round = 1; round < 4; round++) {
        const int shift = 24 - 8 * round;
        tkc_pass<unsigned>(xs, n, list, nc, prefix, mask, shift, 0.f, 0.f, h1, tot[round & 1], glob, cl);
        tkc_scan<unsigned>(glob, remaining, &sel_bin, &sel_rem);
        prefix |= (uint32_t)sel_bin << shift;
        mask |= 255u << shift;
        remaining = sel_rem;
    }
    /* prefix is the key of the k-th largest; `remaining` elements equal to it belong to the top k */
    const int n_eq = (int)remaining, n_gt = a.k - n_eq;
    tkc_each_c(xs, n, list, nc, [&](int i, float f) {
        const uint32_t key = tk_key(f);
        if ((key >> 24) != top) return;          // (chunk walk after an overflow) already taken or out
        if (key > prefix) {
            int s = atomicAdd(gt0, 1);
            sv0[s] = f; si0[s] = (int)(lo + i);
        } else if (key == prefix) {
            int s = atomicAdd(eq0, 1);
            if (s < n_eq) { sv0[n_gt + s] = f; si0[n_gt + s] = (int)(lo + i); }
        }
    });
    tkc_sync(cl);       // all winners are in rank 0
    if (rank != 0) return;
    float *sv = (float *)rep + TKC_SV;
    int *si = (int *)rep + TKC_SV + TK_KMAX;
    for (int i = a.k + threadIdx.x; i < a.kpow2; i += blockDim.x) { sv[i] = -INFINITY; si[i] = -1; }
    __syncthreads();
    tk_bitonic_desc(sv, si, a.kpow2);
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) {
        a.vals[row * a.k + i] = sv[i];
        a.idx[row * a.k + i] = si[i];
    }
#endif
}

__global__ void __launch_bounds__(TKC_THREADS, 2)
topp_cluster_kernel(TkcArgs a) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ float4 tkc_dyn[];
    float *xs = (float *)tkc_dyn;
    __shared__ __align__(16) unsigned rep[TKC_WORDS];
    __shared__ tk_u64 tot[2][256];
    __shared__ float sh[32], stat[2];           // this block's max and -min
    __shared__ int sel_bin, ncand;
    __shared__ tk_u64 sel_rem;
    __shared__ unsigned cnt;
    const int cl = a.cl, rank = blockIdx.x % cl;
    const int64_t row = blockIdx.x / cl;
    if (threadIdx.x == 0) { cnt = 0; ncand = 0; }
    for (int i = threadIdx.x; i < TKC_WORDS; i += blockDim.x) rep[i] = 0;
    __syncthreads();
    /* the row's max M and min, taken while the chunk is copied in */
    float mx = -INFINITY, nmn = -INFINITY;
    const int n = tkc_load(a, xs, row, rank, [&](float f) { mx = fmaxf(mx, f); nmn = fmaxf(nmn, -f); });
    mx = kn_block_max(mx, sh);
    nmn = kn_block_max(nmn, sh);
    if (threadIdx.x == 0) { stat[0] = mx; stat[1] = nmn; }
    tkc_sync(cl);
    float M = -INFINITY, MN = INFINITY;
    for (int r = 0; r < cl; r++) {
        const float *q = tkc_peer(stat, r, cl);
        M = fmaxf(M, q[0]); MN = fminf(MN, -q[1]);
    }
    uint32_t prefix = 0;
    unsigned c = 0;
    if (a.p < 1.f) {
        const float ms = a.mscale;
        tkc_each(xs, n, [&](int, float f) { tkc_rep_mass(rep, tk_key(f) >> 24, __float2ull_rn(__expf(f - M) * ms)); });
        __syncthreads();
        tkc_rep_sum(rep, tot[0]);
        tk_u64 *glob = (tk_u64 *)(rep + TKC_GLOB);
        unsigned *h1 = rep + TKC_H1;
        uint16_t *list = (uint16_t *)(rep + TKC_LIST);
        tkc_merge(tot[0], glob, cl);
        if (threadIdx.x < 32) {      // the total mass S; the target is p * S
            tk_u64 S = 0;
            for (int q = 0; q < 8; q++) S += glob[threadIdx.x * 8 + q];
            for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(0xffffffffu, S, o);
            if (threadIdx.x == 0) sel_rem = (tk_u64)((double)a.p * (double)S);
        }
        __syncthreads();
        tk_u64 remaining = sel_rem;
        __syncthreads();
        tkc_scan<tk_u64>(glob, remaining, &sel_bin, &sel_rem);
        const uint32_t top = (uint32_t)sel_bin;
        uint32_t mask = 0xff000000u;
        prefix = top << 24;
        remaining = sel_rem;
        /* compaction: above the bin = kept (counted), in the bin = candidates */
        tkc_each_u(xs, n, [&](int i, float f, bool ok) {
            const uint32_t kt = tk_key(f) >> 24;
            c += ok && kt > top;
            tkc_append(list, &ncand, i, ok && kt == top);
        });
        __syncthreads();
        const int nc = ncand;
        for (int round = 1; round < 4; round++) {
            const int shift = 24 - 8 * round;
            tkc_pass<tk_u64>(xs, n, list, nc, prefix, mask, shift, M, ms, h1, tot[round & 1], glob, cl);
            tkc_scan<tk_u64>(glob, remaining, &sel_bin, &sel_rem);
            prefix |= (uint32_t)sel_bin << shift;
            mask |= 255u << shift;
            remaining = sel_rem;
        }
        tkc_each_c(xs, n, list, nc, [&](int, float f) {
            const uint32_t key = tk_key(f);
            c += (key >> 24) == top && key >= prefix;
        });
    } else {
        prefix = tk_key(MN);      // p = 1: everything is kept
        c = threadIdx.x == 0 ? (unsigned)n : 0u;
    }
    c = __reduce_add_sync(0xffffffffu, c);
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(tkc_peer(&cnt, 0, cl), c);
    tkc_sync(cl);       // every count is in rank 0 (and no peer reads our memory after this)
    if (rank == 0 && threadIdx.x == 0) {
        a.n_keep[row] = (int32_t)cnt;
        uint32_t u = (prefix & 0x80000000u) ? (prefix & 0x7fffffffu) : ~prefix;
        a.thresh[row] = __uint_as_float(u);
    }
#endif
}

/* Cluster size for a row of V, and the shared memory a block needs; false
 * when the device has no clusters or the chunk does not fit. Measured (H200,
 * 151936 columns): one row 27.8 us with 8 blocks, 23.9 with 16; 64 rows 80.7
 * with 8, 114 with 16, 105 with 4. So 16 blocks (a non-portable cluster size)
 * for up to 8 rows, 8 above; KN_CUDA_TUNE topk_cl overrides. */
static bool tkc_plan(int64_t rows, int64_t V, bool vec, size_t *dyn, int *cl_out, int *chunk_out) {
    static const int cl_tune = kn_cuda_tune("topk_cl", 0);
    const int cl_pref = cl_tune > 0 ? cl_tune : rows <= 8 ? 16 : 8;
    int dev = 0, clus = 0, maxsm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&clus, cudaDevAttrClusterLaunch, dev) != cudaSuccess || !clus) return false;
    if (cudaDeviceGetAttribute(&maxsm, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
    int cl = cl_pref < 1 ? 1 : cl_pref > 16 ? 16 : cl_pref;
    while (cl > 1 && V < (int64_t)cl * 2048) cl >>= 1;      // short rows: fewer, fuller blocks
    int64_t chunk = ((V + cl - 1) / cl + 3) / 4 * 4;
    size_t need = (size_t)chunk * sizeof(float);
    /* static shared memory: ~37 KB (histogram copies, totals); the candidate
     * list holds 16-bit local indices */
    if (need + 40 * 1024 > (size_t)maxsm || chunk > 65535 || rows * cl > INT32_MAX) return false;
    (void)vec;
    *dyn = need;
    *cl_out = cl;
    *chunk_out = (int)chunk;
    return true;
}

static kn_status tkc_launch(void (*kern)(TkcArgs), TkcArgs a, int64_t rows, size_t dyn, void *stream) {
    /* raise the kernel's dynamic shared-memory limit once per device (and size) */
    static size_t set_bytes[2][16];
    int dev = 0;
    KN_CUDA_TRY(cudaGetDevice(&dev));
    size_t *sb = &set_bytes[kern == topp_cluster_kernel][dev & 15];
    if (*sb < dyn + 1) {      // +1: the first call also allows clusters of 16
        KN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
        KN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        *sb = dyn + 1;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3((unsigned)(rows * a.cl));
    cfg.blockDim = dim3(TKC_THREADS);
    cfg.dynamicSmemBytes = dyn;
    cfg.stream = kn_stream(stream);
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)a.cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    KN_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, a));
    KN_CUDA_LAUNCHED();
    return KN_OK;
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
    size_t dyn = 0;
    int cl = 0, chunk = 0;
    if (tkc_plan(rows, V, vec, &dyn, &cl, &chunk)) {
        TkcArgs a = {};
        a.x = x; a.V = V; a.chunk = chunk; a.cl = cl; a.vec = vec;
        a.k = k; a.kpow2 = kp; a.vals = vals; a.idx = idx;
        return tkc_launch(topk_cluster_kernel, a, rows, dyn, stream);
    }
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
    size_t dyn = 0;
    int cl = 0, chunk = 0;
    if (tkc_plan(rows, V, vec, &dyn, &cl, &chunk)) {
        TkcArgs a = {};
        a.x = x; a.V = V; a.chunk = chunk; a.cl = cl; a.vec = vec;
        a.p = p; a.n_keep = n_keep; a.thresh = thresh;
        /* masses exp(x - max) <= 1 in units of 2^-mshift: the row's sum stays under 2^62 */
        int lg = 0;
        while (((int64_t)1 << lg) < V) lg++;
        a.mscale = ldexpf(1.f, lg > 22 ? 62 - lg : 40);
        return tkc_launch(topp_cluster_kernel, a, rows, dyn, stream);
    }
    topp_kernel<<<(unsigned)rows, TK_THREADS, 0, kn_stream(stream)>>>(n_keep, thresh, x, V, p, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
