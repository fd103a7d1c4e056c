/* rowsoftmax.cuh: softmax statistics of a row held in registers, the row
 * optionally split over the blocks of a thread-block cluster. Used by
 * softmax.cu (y = softmax(x)) and crossentropy.cu (loss and dlogits).
 *
 * A row of `cols` elements is cut into `cl` chunks of `chunk` elements (a
 * multiple of the 16-byte vector: 4 f32 or 8 bf16); block `rank` of the
 * cluster loads its chunk once into registers (VPT vectors per thread, all
 * loads issued before the first use), takes the chunk's max m and
 * s = sum exp(x - m) (softmax: per thread, then merged as (m, s) pairs in one
 * block reduction), and, when cl > 1, the blocks swap (m, s) pairs through
 * distributed shared memory (one cluster barrier). Each block then writes its
 * chunk: the row is read once and written once, and a long row (128 x 131072)
 * runs on cl SMs instead of one. cl == 1 is a plain block per row.
 * Needs sm_90 for cl > 1 (the launcher checks cudaDevAttrClusterLaunch).
 * Internal: not installed. */
#pragma once
#include "backends/cuda/common.cuh"   // defines: kn_block_max/sum, kn_ms_merge, bf16 helpers
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune
#include <cooperative_groups.h>

/* 16-byte vectors: 4 f32 or 8 bf16 elements, converted to f32 in registers.
 * Streaming (evict-first) loads and stores: each byte is touched once. */
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
        cvt(__ldcs((const uint4 *)p), o);
    }
    static __device__ __forceinline__ void cvt(uint4 t, float *o) {
        uint32_t w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int q = 0; q < 4; q++) { o[2 * q] = kn_bf2f(w[q] & 0xffff); o[2 * q + 1] = kn_bf2f(w[q] >> 16); }
    }
    /* two floats -> two bf16 (round to nearest even) in one cvt.rn.bf16x2
     * instruction; kn_f2bf's integer rounding costs ~6 instructions each */
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        union { __nv_bfloat162 h; uint32_t u; } c;
        c.h = __floats2bfloat162_rn(lo, hi);
        return c.u;
    }
    static __device__ __forceinline__ void st(uint16_t *p, const float *o) {
        __stcs((uint4 *)p, make_uint4(pack2(o[0], o[1]), pack2(o[2], o[3]), pack2(o[4], o[5]), pack2(o[6], o[7])));
    }
};

enum { RSM_SOFTMAX = 0, RSM_XENT = 1 };

/* y, x: [rows, cols]; chunk: elements per block (multiple of E).
 * Cross-entropy (MODE RSM_XENT, T = float): y = dlogits (NULL: loss only),
 * losses[rows], targets[rows] in [0, cols) or anything else (ignored row). */
struct RsmArgs {
    void *y;
    const void *x;
    int64_t cols;
    int chunk;
    int cl;                  /* blocks per row (the cluster size)            */
    float *losses;
    const int32_t *targets;
    float dloss;
};

/* More than 32 f32 values per thread would not fit under the 64-register cap
 * of 1024-thread blocks: such variants are limited to 512 threads. */
#define RSM_MAXT(T, VPT, PACK) ((PACK ? VPT * SmVec<T>::E / 2 : VPT * SmVec<T>::E) <= 32 ? 1024 : 512)

/* Merge every thread's (m, s) pair (s = sum exp(x - m)) into the block's, in
 * every thread; one __syncthreads. sh: 32 pairs, free on entry (a block
 * calls this once). */
__device__ __forceinline__ void rsm_block_ms(float &m, float &s, float2 *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31;
    if (lane == 0) sh[threadIdx.x >> 5] = make_float2(m, s);
    __syncthreads();
    m = -INFINITY; s = 0.f;
    if (lane < (int)(blockDim.x >> 5)) { m = sh[lane].x; s = sh[lane].y; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
    }
}

/* PACK (bf16 only): keep the loaded 16-byte vectors as they are (4 registers
 * each instead of 8 floats) and convert them again in each pass; exp is then
 * taken twice per element (sum, output) instead of once. Half the registers,
 * so twice the blocks per SM and twice the bytes in flight. */
template <typename T, int VPT, int MODE, bool PACK>
__global__ void __launch_bounds__(RSM_MAXT(T, VPT, PACK))
rowsm_kernel(RsmArgs a) {
    constexpr int E = SmVec<T>::E;
    static_assert(!PACK || E == 8, "PACK is for bf16");
    __shared__ float2 sh[32];
    const int cl = a.cl;
    const int64_t row = blockIdx.x / cl;
    const int rank = blockIdx.x % cl;
    const int64_t lo = (int64_t)rank * a.chunk;
    const int n = (int)(a.cols - lo < a.chunk ? a.cols - lo : a.chunk);   // may be <= 0
    const T *xr = (const T *)a.x + row * a.cols + lo;
    T *yr = a.y ? (T *)a.y + row * a.cols + lo : nullptr;
    int t = -1;            // target column, local to this chunk (cross-entropy)
    bool valid = false;
    if (MODE == RSM_XENT) {
        int tg = a.targets[row];
        valid = tg >= 0 && tg < a.cols;
        t = valid ? (int)(tg - lo) : -1;
    }
    float r[PACK ? 1 : VPT][E] = {};          // zeros: only vectors with i < n are ever read
    uint4 raw[PACK ? VPT : 1] = {};
    /* element q of vector j, as f32 */
    auto val = [&](int j, int q) -> float {
        if constexpr (PACK) {
            uint32_t w = q < 2 ? raw[j].x : q < 4 ? raw[j].y : q < 6 ? raw[j].z : raw[j].w;
            return kn_bf2f((q & 1) ? (w >> 16) : (w & 0xffff));
        } else {
            return r[j][q];
        }
    };
    float xt = 0.f;        // logit at the target, in the thread that loads it
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * blockDim.x) * E;
        if (i < n) {
            if constexpr (PACK) raw[j] = __ldcs((const uint4 *)(xr + i));
            else SmVec<T>::ld(xr + i, r[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * blockDim.x) * E;
        if (i < n) {
#pragma unroll
            for (int q = 0; q < E; q++) {
                m = fmaxf(m, val(j, q));
                if (MODE == RSM_XENT && i + q == t) xt = val(j, q);
            }
        }
    }
    /* softmax: e = exp(x - mt) with mt this thread's own max, then the
     * block's (max, sum) pair in one merge (one barrier; a max pass and a sum
     * pass take four), each thread rescaling by exp(mt - M) / S at the end:
     * bf16 8192 x 4096 0.78 -> 0.83 of copy. Cross-entropy keeps the two
     * passes (mt = the block's max): in the merge form it measured 0.78 ->
     * 0.70, and it needed 58 registers instead of 56 (likely 4 blocks of 224
     * threads per SM instead of 5). */
    if constexpr (MODE == RSM_XENT) m = kn_block_max(m, (float *)sh);
    const float mt = m == -INFINITY ? 0.f : m;    // no values, or all -inf: 0s, not NaN
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * blockDim.x) * E;
        if (i < n)
#pragma unroll
            for (int q = 0; q < E; q++) {
                float e = __expf(val(j, q) - mt);
                if constexpr (!PACK) r[j][q] = e;
                s += e;
            }
    }
    if constexpr (MODE == RSM_XENT) s = kn_block_sum(s, (float *)sh);
    else rsm_block_ms(m, s, sh);
    float M = m, S = s;
#if __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    if (cl > 1) {
        __shared__ float2 pair, tot;    // this block's (max, sum); the row's (max, sum)
        cg::cluster_group cluster = cg::this_cluster();
        if (threadIdx.x == 0) pair = make_float2(m, s);
        cluster.sync();                           // every block's pair is written
        if (threadIdx.x < 32) {
            float pm = -INFINITY, ps = 0.f;
            if ((int)threadIdx.x < cl) {
                float2 q = *cluster.map_shared_rank(&pair, (int)threadIdx.x);
                pm = q.x; ps = q.y;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float m2 = __shfl_xor_sync(0xffffffffu, pm, o), s2 = __shfl_xor_sync(0xffffffffu, ps, o);
                kn_ms_merge(pm, ps, m2, s2);
            }
            if (threadIdx.x == 0) tot = make_float2(pm, ps);
        }
        cluster.barrier_arrive();                 // done reading the peers' pairs
        __syncthreads();
        M = tot.x; S = tot.y;
    }
#endif
    /* y = exp(x - M) / S = exp(x - mt) * exp(mt - M) / S */
    if (MODE == RSM_SOFTMAX) {
        const float f = __expf(mt - M) / S;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * blockDim.x) * E;
            if (i < n) {
                float o[E];
#pragma unroll
                for (int q = 0; q < E; q++) o[q] = (PACK ? __expf(val(j, q) - mt) : val(j, q)) * f;
                SmVec<T>::st(yr + i, o);
            }
        }
    } else {
        /* loss = log S + M - x[t], by the thread that loaded x[t]; ignored rows: 0 by rank 0 */
        if (valid && t >= 0 && t < n && (t / E) % blockDim.x == threadIdx.x) a.losses[row] = logf(S) + M - xt;
        if (!valid && rank == 0 && threadIdx.x == 0) a.losses[row] = 0.f;
        if (yr) {
            const float f = valid ? a.dloss * __expf(mt - M) / S : 0.f;
#pragma unroll
            for (int j = 0; j < VPT; j++) {
                int i = (threadIdx.x + j * blockDim.x) * E;
                if (i < n) {
                    float o[E];
#pragma unroll
                    for (int q = 0; q < E; q++) {
                        o[q] = val(j, q) * f;
                        if (i + q == t) o[q] -= a.dloss;
                    }
                    SmVec<T>::st(yr + i, o);
                }
            }
        }
    }
#if __CUDA_ARCH__ >= 900
    if (cl > 1) cooperative_groups::this_cluster().barrier_wait();   // peers may still read `pair`
#endif
}

/* Launch plan: blocks per row (cl, a power of two <= 8), vectors per thread
 * (4 or 8), threads per block, bf16 packing. Rows are split until a block
 * holds at most 2048 vectors, and further while the grid would not fill the
 * GPU twice (rows * cl < 2 * SMs) and a chunk keeps at least 2048 vectors.
 * Each block then takes ceil(chunk / vpt) threads, rounded up to a warp.
 * f32 takes 8 vectors per thread (fewer, fuller blocks: cross-entropy
 * 2048 x 50304 0.64 -> 0.72 of copy); bf16 takes 4 unpacked vectors per
 * thread on one block per row (8 unpacked: 104 registers, 0.77 -> 0.63; 4
 * packed: 0.69) and 8 packed vectors per thread when split (128 x 131072:
 * 0.42 -> 0.45). Measurements: dev/cuda/softmax/README.md (H200). Returns
 * false when the row does not fit (more than 8 blocks of 8192 vectors).
 * KN_CUDA_TUNE rowsm_maxv, rowsm_maxcl (up to 16), rowsm_vpt, rowsm_pack
 * override the choices. */
struct RsmPlan { int cl, vpt, threads; bool pack; int64_t chunk; };
template <typename T>
static bool rowsm_plan(int64_t rows, int64_t cols, int nsm, bool cluster_ok, RsmPlan *p) {
    constexpr int E = SmVec<T>::E;
    static const int maxv = kn_cuda_tune("rowsm_maxv", 2048);
    static const int maxcl = kn_cuda_tune("rowsm_maxcl", 8);
    static const int vtune = kn_cuda_tune("rowsm_vpt", 0);
    static const int ptune = kn_cuda_tune("rowsm_pack", -1);
    if (cols % E) return false;
    const int64_t nvec = cols / E;
    int cl = 1;
    while (cl < maxcl && cl < 16 && cluster_ok) {
        int64_t nv = (nvec + cl - 1) / cl;
        if (nv > maxv || (rows * cl < 2 * (int64_t)nsm && nv >= 2048)) cl *= 2;
        else break;
    }
    int64_t nv = (nvec + cl - 1) / cl;
    const bool pk = E == 8 && (ptune >= 0 ? ptune != 0 : cl > 1);
    const int64_t cap = E == 4 || pk ? 8 * 1024 : 8 * 512;
    if (nv > cap || rows * cl > INT32_MAX) return false;
    const int vpref = vtune ? vtune : (E == 4 || pk) ? 8 : 4;
    int vpt = vpref >= 8 || nv > 4 * 512 ? 8 : 4;
    int64_t th = (nv + vpt - 1) / vpt;
    th = (th + 31) / 32 * 32;
    p->cl = cl;
    p->vpt = vpt;
    p->threads = (int)th;
    p->pack = pk;
    p->chunk = nv * E;
    return true;
}

template <typename T, int MODE>
static kn_status rowsm_launch(const RsmPlan &p, int64_t rows, RsmArgs a, cudaStream_t st) {
    a.chunk = (int)p.chunk;
    a.cl = p.cl;
    void (*k)(RsmArgs);
    if (p.pack && SmVec<T>::E == 8)
        k = p.vpt == 4 ? rowsm_kernel<T, 4, MODE, SmVec<T>::E == 8> : rowsm_kernel<T, 8, MODE, SmVec<T>::E == 8>;
    else
        k = p.vpt == 4 ? rowsm_kernel<T, 4, MODE, false> : rowsm_kernel<T, 8, MODE, false>;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3((unsigned)(rows * p.cl));
    cfg.blockDim = dim3((unsigned)p.threads);
    cfg.stream = st;
    if (p.cl > 1) {
        if (p.cl > 8) KN_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)p.cl;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    KN_CUDA_TRY(cudaLaunchKernelEx(&cfg, k, a));
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* SMs and cluster support of the current device (cached per device id). */
static inline kn_status rowsm_device(int *nsm, bool *cluster_ok) {
    int dev = 0, c = 0;
    KN_CUDA_TRY(cudaGetDevice(&dev));
    KN_CUDA_TRY(cudaDeviceGetAttribute(nsm, cudaDevAttrMultiProcessorCount, dev));
    KN_CUDA_TRY(cudaDeviceGetAttribute(&c, cudaDevAttrClusterLaunch, dev));
    *cluster_ok = c != 0;
    return KN_OK;
}
