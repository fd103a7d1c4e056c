/* rowsoftmax.cuh: softmax statistics of a row held in registers, the row
 * optionally split over the blocks of a thread-block cluster. Used by
 * softmax.cu (y = softmax(x)) and crossentropy.cu (loss and dlogits).
 *
 * A row of `cols` elements is cut into `cl` chunks of `chunk` elements (a
 * multiple of the 16-byte vector: 4 f32 or 8 bf16); block `rank` of the
 * cluster loads its chunk once into registers (VPT vectors per thread, all
 * loads issued before the first use), takes the chunk's max m and
 * s = sum exp(x - m), and, when cl > 1, the blocks swap (m, s) pairs through
 * distributed shared memory (one cluster barrier). Each block then writes its
 * chunk: the row is read once and written once, and a long row (128 x 131072)
 * runs on cl SMs instead of one. cl == 1 is a plain block per row.
 * Needs sm_90 for cl > 1 (the launcher checks cudaDevAttrClusterLaunch).
 * Internal: not installed. */
#pragma once
#include "backends/cuda/common.cuh"   // defines: kn_block_max/sum, kn_ms_merge, bf16 helpers
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune
#include <cooperative_groups.h>
#include <stdio.h>

/* 16-byte vectors: 4 f32 or 8 bf16 elements, converted to f32 in registers.
 * Streaming (evict-first) loads and stores: each byte is touched once. */
template <typename T> struct SmVec;
template <> struct SmVec<float> {
    static constexpr int E = 4;
    static __device__ __forceinline__ void ld(const float *p, float *o) {
        float4 t = __ldcs((const float4 *)p); o[0] = t.x; o[1] = t.y; o[2] = t.z; o[3] = t.w;
    }
    static __device__ __forceinline__ void lds(const float *p, float *o) {
        float4 t = *(const float4 *)p; o[0] = t.x; o[1] = t.y; o[2] = t.z; o[3] = t.w;
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
    static __device__ __forceinline__ void lds(const uint16_t *p, float *o) { cvt(*(const uint4 *)p, o); }
    static __device__ __forceinline__ void cvt(uint4 t, float *o) {
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
    int64_t rows;            /* persistent kernel only: rows in all          */
    int stages;              /* persistent kernel only: shared-memory stages */
};

/* More than 32 f32 values per thread would not fit under the 64-register cap
 * of 1024-thread blocks: such variants are limited to 512 threads. */
#define RSM_MAXT(T, VPT, PACK) ((PACK ? VPT * SmVec<T>::E / 2 : VPT * SmVec<T>::E) <= 32 ? 1024 : 512)

/* PACK (bf16 only): keep the loaded 16-byte vectors as they are (4 registers
 * each instead of 8 floats) and convert them again in each pass; exp is then
 * taken twice per element (sum, output) instead of once. Half the registers,
 * so twice the blocks per SM and twice the bytes in flight. */
template <typename T, int VPT, int MODE, bool PACK>
__global__ void __launch_bounds__(RSM_MAXT(T, VPT, PACK))
rowsm_kernel(RsmArgs a) {
    constexpr int E = SmVec<T>::E;
    static_assert(!PACK || E == 8, "PACK is for bf16");
    __shared__ float sh[32];
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
    m = kn_block_max(m, sh);
    const float mm = m == -INFINITY ? 0.f : m;    // an all -inf chunk gives 0s, not NaN
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * blockDim.x) * E;
        if (i < n)
#pragma unroll
            for (int q = 0; q < E; q++) {
                float e = __expf(val(j, q) - mm);
                if constexpr (!PACK) r[j][q] = e;
                s += e;
            }
    }
    s = kn_block_sum(s, sh);
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
    /* y = exp(x - M) / S = exp(x - m) * exp(m - M) / S */
    if (MODE == RSM_SOFTMAX) {
        const float f = __expf(mm - M) / S;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * blockDim.x) * E;
            if (i < n) {
                float o[E];
#pragma unroll
                for (int q = 0; q < E; q++) o[q] = (PACK ? __expf(val(j, q) - mm) : val(j, q)) * f;
                SmVec<T>::st(yr + i, o);
            }
        }
    } else {
        /* loss = log S + M - x[t], by the thread that loaded x[t]; ignored rows: 0 by rank 0 */
        if (valid && t >= 0 && t < n && (t / E) % blockDim.x == threadIdx.x) a.losses[row] = logf(S) + M - xt;
        if (!valid && rank == 0 && threadIdx.x == 0) a.losses[row] = 0.f;
        if (yr) {
            const float f = valid ? a.dloss * __expf(mm - M) / S : 0.f;
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

/* ---- persistent, TMA-fed variant (sm_90): rowsm_pipe_kernel -----------------------
 * The kernel above holds a block's chunk in registers from load to store, so
 * at 2 blocks per SM the blocks of a 128 x 131072 softmax run in ~4 lockstep
 * waves (load, reduce + cluster barrier, store) and HBM idles between them.
 * Here a grid of G persistent clusters (cl blocks each, G = what fits at
 * once) walks the rows: cluster g takes rows g, g + G, g + 2G, ... Each block
 * keeps `stages` chunk buffers in shared memory; thread 0 fills them with 1D
 * bulk copies (cp.async.bulk, the copy engine) that complete on one mbarrier
 * per stage, issued `stages` rows ahead. A row's math is the register
 * kernel's (chunk -> registers, max, sum of exp, cluster swap of (max, sum),
 * store from registers), but while it runs the next rows are already on
 * their way, so loads overlap the reductions, the cluster barrier and the
 * stores, and a block's bytes in flight no longer cost registers (which is
 * what limited bf16). Stage s of row iteration it is refilled with row
 * it + stages as soon as every thread has copied it to registers (the first
 * block barrier of the row). The cluster swap double-buffers its (max, sum)
 * slot by row parity, so one cluster barrier per row suffices. */
#define RSP_MAXS 8

__device__ __forceinline__ uint32_t rsp_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void rsp_wait(uint64_t *b, unsigned parity) {
    uint32_t ok = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(ok) : "r"(rsp_u32(b)), "r"(parity) : "memory");
    } while (!ok);
}
/* Expect `bytes` on barrier b (and arrive), then copy them global -> shared. */
__device__ __forceinline__ void rsp_fill(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rsp_u32(b)), "r"(bytes) : "memory");
    if (bytes)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(rsp_u32(dst)), "l"(src), "r"(bytes), "r"(rsp_u32(b)) : "memory");
}

/* Per-thread alternative to the bulk copy: each thread copies its own
 * vectors of a row with cp.async (16 bytes each, L1 bypassed) and later reads
 * only those, so a thread's cp.async.wait_group alone makes its data ready
 * and a stage needs no barrier before it is refilled. One commit group per
 * row; wait_group takes an immediate, hence the switch over `stages`. */
__device__ __forceinline__ void rsp_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(rsp_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void rsp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void rsp_wait_rows(int pending) {     // at most `pending` groups left in flight
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}

/* Merge every thread's (m, s) pair (s = sum exp(x - m)) into the block's, in
 * every thread. sh: 32 pairs, not used again before the next __syncthreads. */
__device__ __forceinline__ void rsp_block_ms(float &m, float &s, float2 *sh) {
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

template <typename T, int VPT, int MODE, bool BULK>
__global__ void __launch_bounds__(RSM_MAXT(T, VPT, false))
rowsm_pipe_kernel(RsmArgs a) {
#if __CUDA_ARCH__ >= 900
    constexpr int E = SmVec<T>::E;
    namespace cg = cooperative_groups;
    extern __shared__ float4 rsp_dyn[];            // [stages][chunk] of T
    __shared__ __align__(8) uint64_t full[RSP_MAXS];
    __shared__ float2 shp[2][32];                   // per-warp (max, sum), by row parity
    __shared__ float2 pair[2], tot;                 // this block's (max, sum) by row parity; the row's
    const int cl = a.cl, S = a.stages;
    const int rank = blockIdx.x % cl;
    const int64_t G = gridDim.x / cl;
    const int64_t lo = (int64_t)rank * a.chunk;
    const int n = (int)(a.cols - lo < a.chunk ? (a.cols - lo > 0 ? a.cols - lo : 0) : a.chunk);
    const unsigned bytes = (unsigned)n * sizeof(T);
    T *stage0 = (T *)rsp_dyn;
    const T *x = (const T *)a.x;
    int64_t row = blockIdx.x / cl;
    /* copy row r's chunk into stage s: bulk (thread 0) or this thread's vectors */
    auto fill = [&](int s, int64_t r) {
        T *dst = stage0 + (size_t)s * a.chunk;
        const T *src = x + r * a.cols + lo;
        if constexpr (BULK) {
            if (threadIdx.x == 0) rsp_fill(dst, src, bytes, &full[s]);
        } else {
#pragma unroll
            for (int j = 0; j < VPT; j++) {
                int i = (threadIdx.x + j * blockDim.x) * E;
                if (i < n) rsp_cp16(dst + i, src + i);
            }
        }
    };
    if constexpr (BULK) {
        if (threadIdx.x == 0) {
            for (int s = 0; s < S; s++)
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rsp_u32(&full[s])));
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
    for (int s = 0; s < S; s++) {
        if (row + s * G < a.rows) fill(s, row + s * G);
        if constexpr (!BULK) rsp_commit();     // one group per row, empty past the end
    }
    for (int it = 0; row < a.rows; it++, row += G) {
        const int s = it % S;
        const T *xs = stage0 + (size_t)s * a.chunk;
        T *yr = a.y ? (T *)a.y + row * a.cols + lo : nullptr;
        int t = -1;
        bool valid = false;
        if (MODE == RSM_XENT) {
            int tg = a.targets[row];
            valid = tg >= 0 && tg < a.cols;
            t = valid ? (int)(tg - lo) : -1;
        }
        if constexpr (BULK) rsp_wait(&full[s], (unsigned)(it / S) & 1u);
        else rsp_wait_rows(S - 1);
        float r[VPT][E] = {};
        float xt = 0.f, m = -INFINITY;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * blockDim.x) * E;
            if (i < n) {
                SmVec<T>::lds(xs + i, r[j]);
#pragma unroll
                for (int q = 0; q < E; q++) {
                    m = fmaxf(m, r[j][q]);
                    if (MODE == RSM_XENT && i + q == t) xt = r[j][q];
                }
            }
        }
        if constexpr (!BULK) {       // this thread has its values of stage s: refill it now
            if (row + S * G < a.rows) fill(s, row + S * G);
            rsp_commit();
        }
        /* this thread's e = exp(x - mt), mt its own max; then the block's
         * (max, sum) pair in one reduction (one barrier instead of four) */
        const float mt = m == -INFINITY ? 0.f : m;    // no values, or all -inf: 0s, not NaN
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * blockDim.x) * E;
            if (i < n)
#pragma unroll
                for (int q = 0; q < E; q++) { r[j][q] = __expf(r[j][q] - mt); sum += r[j][q]; }
        }
        rsp_block_ms(m, sum, shp[it & 1]);   // its barrier: every thread is done with stage s
        if (BULK && row + S * G < a.rows) fill(s, row + S * G);
        float M = m, SS = sum;
        if (cl > 1) {
            cg::cluster_group cluster = cg::this_cluster();
            if (threadIdx.x == 0) pair[it & 1] = make_float2(m, sum);
            cluster.sync();           // every block's pair of this row is written
            if (threadIdx.x < 32) {
                float pm = -INFINITY, ps = 0.f;
                if ((int)threadIdx.x < cl) {
                    float2 q = *cluster.map_shared_rank(&pair[it & 1], (int)threadIdx.x);
                    pm = q.x; ps = q.y;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    float m2 = __shfl_xor_sync(0xffffffffu, pm, o), s2 = __shfl_xor_sync(0xffffffffu, ps, o);
                    kn_ms_merge(pm, ps, m2, s2);
                }
                if (threadIdx.x == 0) tot = make_float2(pm, ps);
            }
            __syncthreads();
            M = tot.x; SS = tot.y;
        }
        if (MODE == RSM_SOFTMAX) {
            const float f = __expf(mt - M) / SS;
#pragma unroll
            for (int j = 0; j < VPT; j++) {
                int i = (threadIdx.x + j * blockDim.x) * E;
                if (i < n) {
#pragma unroll
                    for (int q = 0; q < E; q++) r[j][q] *= f;
                    SmVec<T>::st(yr + i, r[j]);
                }
            }
        } else {
            if (valid && t >= 0 && t < n && (t / E) % blockDim.x == threadIdx.x) a.losses[row] = logf(SS) + M - xt;
            if (!valid && rank == 0 && threadIdx.x == 0) a.losses[row] = 0.f;
            if (yr) {
                const float f = valid ? a.dloss * __expf(mt - M) / SS : 0.f;
#pragma unroll
                for (int j = 0; j < VPT; j++) {
                    int i = (threadIdx.x + j * blockDim.x) * E;
                    if (i < n) {
#pragma unroll
                        for (int q = 0; q < E; q++) {
                            r[j][q] *= f;
                            if (i + q == t) r[j][q] -= a.dloss;
                        }
                        SmVec<T>::st(yr + i, r[j]);
                    }
                }
            }
        }
    }
    if (cl > 1) cg::this_cluster().sync();     // peers may still read this block's `pair`
#endif
}

/* Plan of the persistent kernel: the same split as rowsm_plan (cl blocks per
 * row, chunk), unpacked vectors (8 f32 / 4 bf16 per thread, 32 floats in
 * registers), stages = clamp(48 KB / chunk bytes, 3, 8) within 200 KB of
 * shared memory (KN_CUDA_TUNE rowsm_st overrides), and G = the clusters that
 * fit on the GPU at once (occupancy query, cached), at most `rows`. Returns
 * false when the chunk does not fit (caller falls back to rowsm_kernel). */
struct RspPlan { RsmPlan p; int stages, groups; size_t dyn; void (*k)(RsmArgs); };

template <typename T, int MODE>
static kn_status rsp_plan(int64_t rows, int64_t cols, int nsm, RspPlan *q, bool *ok) {
    static const int st_tune = kn_cuda_tune("rowsm_st", 0);
    static const int fill_tune = kn_cuda_tune("rowsm_fill", 0);    // 0: cp.async, 1: bulk copy
    constexpr int E = SmVec<T>::E;
    *ok = false;
    RsmPlan p;
    if (!rowsm_plan<T>(rows, cols, nsm, true, &p)) return KN_OK;
    const int64_t nv = p.chunk / E;
    const int vpt = E == 4 ? 8 : 4;
    int64_t th = ((nv + vpt - 1) / vpt + 31) / 32 * 32;
    if (th > 1024 || p.cl > 16) return KN_OK;
    const size_t cb = (size_t)p.chunk * sizeof(T);
    int S = st_tune > 0 ? st_tune : (int)((48 * 1024) / cb);
    if (st_tune <= 0 && S < 3) S = 3;
    if (S > RSP_MAXS) S = RSP_MAXS;
    while (S > 2 && S * cb > 200 * 1024) S--;
    if (S < 2 || S * cb > 200 * 1024) return KN_OK;
    p.vpt = vpt;
    p.threads = (int)th;
    p.pack = false;
    q->p = p;
    q->stages = S;
    q->dyn = S * cb;
    q->k = fill_tune == 1 ? rowsm_pipe_kernel<T, (E == 4 ? 8 : 4), MODE, true> : rowsm_pipe_kernel<T, (E == 4 ? 8 : 4), MODE, false>;
    /* occupancy: clusters (or blocks) that fit at once; cached per configuration */
    struct Memo { void (*k)(RsmArgs); int dev, th, cl; size_t dyn; int g; };
    static Memo memo[16];
    static int nmemo = 0;
    int dev = 0;
    KN_CUDA_TRY(cudaGetDevice(&dev));
    for (int i = 0; i < nmemo; i++)
        if (memo[i].k == q->k && memo[i].dev == dev && memo[i].th == p.threads && memo[i].cl == p.cl && memo[i].dyn == q->dyn) {
            q->groups = memo[i].g;
            goto found;
        }
    {
        KN_CUDA_TRY(cudaFuncSetAttribute(q->k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)q->dyn));
        if (p.cl > 8) KN_CUDA_TRY(cudaFuncSetAttribute(q->k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        int g = 0;
        if (p.cl > 1) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr[1];
            cfg.gridDim = dim3((unsigned)p.cl);
            cfg.blockDim = dim3((unsigned)p.threads);
            cfg.dynamicSmemBytes = q->dyn;
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = (unsigned)p.cl;
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            KN_CUDA_TRY(cudaOccupancyMaxActiveClusters(&g, q->k, &cfg));
        } else {
            KN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&g, q->k, p.threads, q->dyn));
            g *= nsm;
        }
        if (nmemo < 16) memo[nmemo++] = {q->k, dev, p.threads, p.cl, q->dyn, g};
        if (kn_cuda_tune("rowsm_log", 0))
            fprintf(stderr, "rowsm_pipe: %lld x %lld %s: cl %d, chunk %lld, threads %d, stages %d, %d groups fit\n",
                    (long long)rows, (long long)cols, sizeof(T) == 4 ? "f32" : "bf16", p.cl, (long long)p.chunk,
                    p.threads, S, g);
        q->groups = g;
    }
found:
    if (q->groups < 1) return KN_OK;
    if (q->groups > rows) q->groups = (int)rows;
    *ok = true;
    return KN_OK;
}

static kn_status rsp_launch(const RspPlan &q, RsmArgs a, int64_t rows, cudaStream_t st) {
    a.chunk = (int)q.p.chunk;
    a.cl = q.p.cl;
    a.rows = rows;
    a.stages = q.stages;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3((unsigned)(q.groups * q.p.cl));
    cfg.blockDim = dim3((unsigned)q.p.threads);
    cfg.dynamicSmemBytes = q.dyn;
    cfg.stream = st;
    if (q.p.cl > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)q.p.cl;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    KN_CUDA_TRY(cudaLaunchKernelEx(&cfg, q.k, a));
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* The persistent kernel when the device has clusters and bulk copies (sm_90)
 * and KN_CUDA_TUNE rowsm_pipe allows it (0: never, 1: always, 2: only rows
 * split over a cluster, 3: only rows on one block); *done = false: use
 * rowsm_kernel. */
template <typename T, int MODE>
static kn_status rsp_try(int64_t rows, int64_t cols, int nsm, bool cluster_ok, RsmArgs a, cudaStream_t st,
                         bool *done) {
    static const int pipe = kn_cuda_tune("rowsm_pipe", 1);
    *done = false;
    if (!pipe || !cluster_ok) return KN_OK;
    RspPlan q;
    bool ok = false;
    kn_status s = rsp_plan<T, MODE>(rows, cols, nsm, &q, &ok);
    if (s || !ok || (pipe == 2 && q.p.cl == 1) || (pipe == 3 && q.p.cl > 1)) return s;
    *done = true;
    return rsp_launch(q, a, rows, st);
}
