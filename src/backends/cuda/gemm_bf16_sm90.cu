/* gemm_bf16_sm90.cu: bf16/f16 GEMM on Hopper's wgmma + TMA, fp32 accumulation.
 *
 *   C[z][M,N] = epi(op(A[z]) @ op(B[z]) + bias)      (z: batch entry)
 *
 * Two entry points share one kernel:
 *  - kn_cuda_gemm_bf16: linear layers, A[M,K] @ W[N,K]^T, bf16 out, optional
 *    f32 bias and tanh-GELU epilogue (no batch);
 *  - kn_cuda_gemm_wgmma: the backend's matmul node, any of the four operand
 *    layouts (A stored [M,K] or [K,M], B stored [N,K] or [K,N]), bf16 or f16
 *    operands, C in the operand dtype, a batch whose strides collapse to one per
 *    operand (attention heads: [B,H,T,D] contiguous).
 *
 * Block tile 128 x BN x 64 (BN = 256, or 128 where it fills the SMs
 * better), 3 warpgroups: warpgroup 0 is the producer (one thread issues TMA
 * bulk tensor copies into a ring of stages, completing on "full"
 * mbarriers), warpgroups 1 and 2 are consumers, each doing wgmma m64nBNk16
 * over its 64 rows and releasing the stage on an "empty" mbarrier.
 * setmaxnreg gives the consumers 232 registers (up to 128 accumulators
 * each).
 *
 * The kernel is persistent: one block an SM walks a list of output tiles,
 * and the ring of stages runs on across tiles, so the producer loads the
 * next tile's first k-steps while the consumers store the last tile (with
 * K = 768, GPT-2's width, a tile is only 12 k-steps: a block a tile left
 * the pipeline fill and the epilogue between every 12 of them). The
 * epilogue converts to 16 bits in registers, writes 64 columns at a time
 * into a shared box of its own (not the ring) and stores it by TMA; the
 * consumers go on to the next tile while the copy engine writes it out.
 *
 * Blocks run in clusters of two along M where M has two tiles or more: the
 * pair computes a 256 x BN unit, each block loads its own 128 rows of A and
 * half of B's BN rows, and TMA multicasts that half into both blocks' stage
 * (B's traffic from L2 halves: alone, a 128 x 256 tile reads 384 rows of
 * operands a k-step, in a pair 256). A stage is free again only when the
 * consumers of *both* blocks are done with it (each arrives on both
 * blocks' "empty" barrier); the pair leaves the kernel together (a cluster
 * barrier) so that no late arrival reaches an exited block.
 *
 * The epilogue is compiled twice: with the bias and GELU of the linear
 * layers (EX), and without (every matmul node). With their checks inline
 * in every kernel, the code was eight times the size and a 128-wide tile's
 * epilogue took ~5,000 cycles (G_TRACE, H200), mostly waiting for
 * instructions; without them ~1,300 (docs/PERF.md "GPU, session 19":
 * GPT-2's products 1.07-1.54x faster, 0.67-1.00 of cuBLAS; 4096^3 0.98).
 *
 * G_TRACE (a diagnostics build, not the library's: nvcc -DG_TRACE of this
 * file linked into bench_cuda_backend) prints, every tenth launch, the
 * cycles each warpgroup of a block spent waiting for stages, for wgmmas
 * and in the epilogue.
 *
 * Tiles are handed out in swaths of M-tile groups (wg_swath, wg_tile): M
 * fastest within a swath, the swath's N tiles in turn, sized so that the
 * blocks running at once read the larger operand from memory once (a
 * classifier's [50257, 768] weight: the whole column of M tiles a swath; a
 * 50 MB A against a small B: one group a swath).
 *
 * Shared tiles use the 128-byte swizzle (TMA writes it, the wgmma
 * descriptors read it), in one of two forms per operand:
 *  - K-major (A [M,K], B [N,K]): one TMA box of 64 k x rows; each row is
 *    128 bytes of k; the k16 steps of a 64-deep tile start 32 bytes apart.
 *  - MN-major (A [K,M], B [K,N]): boxes of 64 m/n x 64 k, 8 KB each; each
 *    128-byte row holds 64 m/n values of one k. wgmma reads it with its
 *    transpose bit set; descriptor: LBO = 8 KB (next 64 m/n), SBO = 1 KB
 *    (next 8 k rows); the k16 steps start 2 KB apart.
 * Each operand's tensor map is 3-D (inner, outer, batch), so rows/columns
 * past the matrix edge (partial tiles, K % 64, the second block of a pair
 * past M) are zero-filled by TMA and never read from the next batch entry;
 * the epilogue masks the stores.
 * Other GPUs / builds (and misaligned inputs, lda % 8 != 0): the entry
 * points say so (kn_cuda_gemm_wgmma_fits) and the caller uses gemm_tc.cu;
 * kn_cuda_gemm_bf16 keeps a plain tiled FFMA kernel (correct, slow).
 */
#include "backends/cuda/common.cuh"
#include "backends/cuda/sm90.cuh"     // defines: KN_SM90A_DEVICE, mbarrier / TMA / wgmma wrappers, kn_sm90_map
#include "backends/cuda/tune.cuh"    // kn_cuda_tune: gemm_cluster, gemm_persist, gemm_bn, gemm_swath, gemm_split, gemm_split_kb
#include <stdio.h>
#include <cuda_fp16.h>     // defines: __float2half_rn
#include <string.h>


#define G_BM 128
#define G_BK 64
/* Per tile width BN: stages of the ring (a stage holds A's 128 x 64 and
 * B's BN x 64 tiles) and the shared bytes: the ring, the epilogue's two
 * staging boxes a consumer (64 rows x 64 columns of 16-bit values, 8 KB,
 * in TMA's 128-byte swizzle), 1024 of alignment slack, the barriers.
 * 227 KB an SM: 4 stages at BN = 256 and 192, 6 at 128. */
#define G_STAGES(BN) ((BN) == 128 ? 6 : 4)
#define G_STAGE_BYTES(BN) ((G_BM + (BN)) * G_BK * 2)
#define G_BOX 8192
#define G_SMEM_BYTES(BN) (G_STAGES(BN) * G_STAGE_BYTES(BN) + 4 * G_BOX + 1024 + 2 * 8 * G_STAGES(BN))
/* the odd-N epilogue's padded rows (64 values and 16 bytes: a warp's
 * 4-byte writes to 8 rows hit 32 banks) fit a consumer's two boxes */
#define G_SROW (64 * 2 + 16)
static_assert(64 * G_SROW <= 2 * G_BOX, "padded staging fits");
static_assert(G_SMEM_BYTES(256) <= 227 * 1024 && G_SMEM_BYTES(192) <= 227 * 1024 && G_SMEM_BYTES(128) <= 227 * 1024,
              "shared memory");

struct wg_args {
    int M, N, K;
    const float *bias;      /* [N] f32 or NULL */
    int epi;                /* kn_cuda_epilogue */
    void *C;                /* in the operand dtype (F16 ? f16 : bf16) */
    int64_t ldc, sc;        /* C row stride and batch stride, elements */
    int a_z, b_z;           /* 1 when the operand steps with the batch entry */
    int vec_out;            /* C by TMA (base, ldc, sc 16-byte aligned: the map tmC); else element stores */
    int npair, nnt, units;  /* M-tile groups (pairs, or single tiles without a cluster), N tiles, groups x N tiles x batch */
    int kslice;             /* split-K (EX == 2): batch entry z is K's slice [z kslice, (z+1) kslice), a multiple of 64; else 0 */
    int swath;              /* M-tile groups a swath of the tile order (1 .. npair; wg_swath) */
#ifdef G_TRACE
    unsigned long long *trace;   /* [grid][3 warpgroups][8] */
#endif
};

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

#ifdef KN_SM90A_DEVICE
/* a special register: G_SREG(r, "%%cluster_ctarank") */
#define G_SREG(var, name) asm volatile("mov.u32 %0, " name ";" : "=r"(var))
#ifdef G_TRACE   /* diagnostics build: cycles per phase, per block (not in the library) */
#define G_TCLK(v) uint64_t v = clock64()
#define G_TADD(slot, v0) (tr[slot] += clock64() - (v0))
#else
#define G_TCLK(v)
#define G_TADD(slot, v0)
#endif
/* a consumer hands stage b back: to this block's producer, and in a pair to
 * both blocks'. (Clusters are of 1 or 2 blocks; a loop over ncta compiled
 * to a 16-way unrolled, branching one.) */
__device__ __forceinline__ void stage_release(uint64_t *b, int ncta) {
    if (ncta == 1) {
        mbar_arrive(b);
    } else {
        mbar_arrive_cluster(b, 0);
        mbar_arrive_cluster(b, 1);
    }
}
#endif /* KN_SM90A_DEVICE */

/* Accumulators j, j + 1 of a consumer thread (warp, lane) in the epilogue's
 * pass of 64 columns from column nq: the pair's row rl of the consumer's 64
 * and column cl of the pass (fragment j is row warp*16 + lane/4 (+8), col
 * (j/4)*8 + (lane%4)*2 (+1)), and the two values (EX: with bias and GELU
 * where p asks), packed in the operand dtype. */
template <int F16, bool EX>
__device__ __forceinline__ uint32_t wg_epi_pair(const wg_args &p, const float *d, int j, int warp, int lane, int nq,
                                                int &rl, int &cl) {
    rl = warp * 16 + lane / 4 + ((j & 2) ? 8 : 0);
    cl = ((j / 4) % 8) * 8 + (lane % 4) * 2;
    const int col = nq + cl;
    float v0 = d[j], v1 = d[j + 1];
    if (EX && p.bias) { if (col < p.N) v0 += p.bias[col]; if (col + 1 < p.N) v1 += p.bias[col + 1]; }
    if (EX && p.epi == KN_CUDA_EPI_GELU) { v0 = gelu_tanh(v0); v1 = gelu_tanh(v1); }
    return kn_pack16<!F16>(v0, v1);
}

#ifdef KN_SM90A_DEVICE
/* The epilogue of one 64-row slab of a tile: rows r0 .. r0 + 63 of C[z],
 * columns n0 .. n0 + BN - 1, from a consumer's accumulators d (wgmma's
 * m64nBN fragments), 64 columns at a time: bias and GELU in f32, 16-bit
 * pairs into shared memory (wg_epi_pair), then out. stg: the consumer's
 * two staging boxes; bar: its named barrier (128 threads); nbox: the boxes
 * it has stored by TMA so far. EX: p may ask for a bias or GELU (a kernel
 * of its own, see the top; no branch here may choose between epilogues or
 * dtypes on the accumulators: ptxas would then serialize the wgmmas, C7514). */
template <int BN, int F16, bool EX>
__device__ __forceinline__ void wg_store_slab(const wg_args &p, const CUtensorMap *tmC, const float *d, int z,
                                              int r0, int n0, uint8_t *stg, uint32_t &nbox, int bar, int tid) {
    const int warp = tid / 32, lane = tid % 32;
    if (p.vec_out) {
        /* Each pass fills one of the two boxes in TMA's 128-byte swizzle
         * (16-byte chunk c of row r at chunk c ^ (r % 8): a warp's writes
         * to 8 rows hit 32 banks) and one thread stores it by TMA, which
         * runs on while the consumer goes on to its next tile's k-steps. A
         * box is written again two passes later, once its store has read
         * it (wait_group.read 1: all but the newest store). */
#pragma unroll
        for (int q = 0; q < BN / 64; q++, nbox++) {
            uint8_t *box = stg + (nbox & 1) * G_BOX;
            if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
#pragma unroll
            for (int j = q * 32; j < q * 32 + 32; j += 2) {
                int rl, cl;
                const uint32_t v = wg_epi_pair<F16, EX>(p, d, j, warp, lane, n0 + q * 64, rl, cl);
                *(uint32_t *)(box + rl * 128 + (((cl / 8) ^ (rl % 8)) * 16) + (cl % 8) * 2) = v;
            }
            /* the writes above must be seen by the async proxy (TMA) */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
            if (tid == 0) {
                /* one group a pass, empty past the matrix, so that "all but
                 * the newest" is always the other box */
                if (r0 < p.M && n0 + q * 64 < p.N) tma_store_3d(tmC, box, n0 + q * 64, r0, z);
                bulk_commit();
            }
        }
    } else {
        /* Rows not 16-byte aligned (an odd N such as a vocabulary of
         * 50257): padded rows in the two boxes' room, and each row's 64
         * columns cut where their addresses cross 16 bytes, into a head of
         * h < 8 elements, whole 16-byte chunks and a tail; item 0 of a row
         * is its head, item k >= 1 the chunk from column h + (k-1) 8. (One
         * element a thread, the first way, ran the [8192, 50257] logits in
         * 2.1 ms against 1.07 for aligned products of that size.) The first
         * barrier of a pass: the consumer's reads of the last pass are done. */
        uint16_t *cz = (uint16_t *)p.C + (int64_t)z * p.sc;
#pragma unroll
        for (int q = 0; q < BN / 64; q++) {
            const int nq = n0 + q * 64;      // the pass's first column
            asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
#pragma unroll
            for (int j = q * 32; j < q * 32 + 32; j += 2) {
                int rl, cl;
                const uint32_t v = wg_epi_pair<F16, EX>(p, d, j, warp, lane, nq, rl, cl);
                *(uint32_t *)(stg + rl * G_SROW + cl * 2) = v;
            }
            asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
            if (nq >= p.N) continue;
            for (int c = tid; c < 64 * 9; c += 128) {
                const int rl = c / 9, k = c % 9, row = r0 + rl;
                if (row >= p.M) continue;
                uint16_t *rp = cz + (int64_t)row * p.ldc + nq;        /* the row's column nq */
                const int h = (int)((16 - ((uintptr_t)rp & 15)) & 15) / 2;
                const int c0 = k == 0 ? 0 : h + (k - 1) * 8, c1 = k == 0 ? h : min(h + k * 8, 64);
                if (c0 >= c1) continue;
                const uint16_t *sv = (const uint16_t *)(stg + rl * G_SROW);
                if (c1 - c0 == 8 && nq + c1 <= p.N) {
                    uint32_t w[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) w[e] = (uint32_t)sv[c0 + 2 * e] | (uint32_t)sv[c0 + 2 * e + 1] << 16;
                    *(uint4 *)(rp + c0) = make_uint4(w[0], w[1], w[2], w[3]);
                } else {
                    for (int e = c0; e < c1 && nq + e < p.N; e++) rp[e] = sv[e];
                }
            }
        }
    }
}

/* Split-K's epilogue: a consumer's 64 rows of the slice's f32 partial sums
 * into C[z] (f32, row stride ldc even, 8-byte aligned), pairs of columns as
 * they lie in the fragments (row warp*16 + lane/4 (+8), column (j/4)*8 +
 * (lane%4)*2); a long K makes the element stores' cost small. */
template <int BN>
__device__ __forceinline__ void wg_store_f32(const wg_args &p, const float *d, int z, int r0, int n0, int tid) {
    const int warp = tid / 32, lane = tid % 32;
    float *cz = (float *)p.C + (int64_t)z * p.sc;
#pragma unroll
    for (int j = 0; j < BN / 2; j += 2) {
        const int row = r0 + warp * 16 + lane / 4 + ((j & 2) ? 8 : 0), col = n0 + (j / 4) * 8 + (lane % 4) * 2;
        if (row >= p.M || col >= p.N) continue;
        float *o = cz + (int64_t)row * p.ldc + col;
        if (col + 1 < p.N) *(float2 *)o = make_float2(d[j], d[j + 1]);
        else *o = d[j];
    }
}
#endif /* KN_SM90A_DEVICE */

/* Unit u of the tile list: batch entry slowest; within an entry, swaths of
 * p.swath M-tile groups, each swath all its N tiles, M-tile group fastest
 * inside it (p.swath = npair: the whole column of M tiles, then the next N
 * tile). Gives this block's batch entry z and tile origin (m0, n0). A group
 * is a pair of M tiles in a cluster of two (rank 0 the upper), one tile
 * alone. */
__device__ __forceinline__ void wg_tile(const wg_args &p, int u, int ncta, int rank, int bn, int &z, int &m0,
                                        int &n0) {
    const int per_z = p.npair * p.nnt;
    z = u / per_z;
    const int r = u - z * per_z, g0 = r / (p.swath * p.nnt) * p.swath, gs = min(p.swath, p.npair - g0);
    const int q = r - g0 * p.nnt, nt = q / gs, mp = g0 + (q - nt * gs);
    m0 = (mp * ncta + rank) * G_BM;
    n0 = nt * bn;
}

/* k-steps of unit z's product: all of K's, or split-K's slice z's */
__device__ __forceinline__ int wg_nk(const wg_args &p, int z) {
    const int k = p.kslice ? min(p.kslice, p.K - z * p.kslice) : p.K;
    return (k + G_BK - 1) / G_BK;
}

/* EX: 0 the plain epilogue, 1 with bias and GELU, 2 f32 partial sums of a
 * K slice (split-K) */
template <int BN, int AMN, int BMN, int F16, int EX>
__global__ void __launch_bounds__(384, 1)
gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                  const __grid_constant__ CUtensorMap tmC, const wg_args p) {
#ifdef KN_SM90A_DEVICE
    constexpr int STAGES = G_STAGES(BN), A_BYTES = G_BM * G_BK * 2, B_BYTES = BN * G_BK * 2;
    constexpr int NACC = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = base;                                   // [STAGES][A_BYTES]
    uint8_t *sB = base + STAGES * A_BYTES;                // [STAGES][B_BYTES]
    uint8_t *stg0 = base + STAGES * (A_BYTES + B_BYTES);  // [2 consumers][2 boxes][G_BOX]
    uint64_t *full = (uint64_t *)(stg0 + 4 * G_BOX);
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    uint32_t rank_, ncta_, cid_, ncl_;     /* this block in its cluster, the cluster in the grid */
    G_SREG(rank_, "%%cluster_ctarank");
    G_SREG(ncta_, "%%cluster_nctarank");
    G_SREG(cid_, "%%clusterid.x");
    G_SREG(ncl_, "%%nclusterid.x");
    const int rank = (int)rank_, ncta = (int)ncta_, cid = (int)cid_, ncl = (int)ncl_;
    if (threadIdx.x == 0) {
        /* a stage is free when both consumers of every block in the cluster are done with it */
        for (int s = 0; s < STAGES; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 2 * ncta); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_sync();
    /* launched with programmatic dependent launch (common.cuh): the setup
     * above ran beside the previous kernel's tail */
    kn_pdl_enter();
#ifdef G_TRACE
    uint64_t tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};   /* 0 total, 1 full/empty waits, 2 mma waits, 3 epilogue, 4 tiles */
    const uint64_t t_start = clock64();
#endif
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        /* warp 0 walks the tiles, converged (the other three warps wait at
         * the closing cluster barrier); lane 0 issues */
        if (tid < 32) {
            uint32_t it = 0;     // k-steps issued, over all of this block's tiles
            for (int u = cid; u < p.units; u += ncl) {
                int z, m0, n0;
                wg_tile(p, u, ncta, rank, BN, z, m0, n0);
                const int za = p.a_z ? z : 0, zb = p.b_z ? z : 0;
                const int k0 = p.kslice * z, nku = wg_nk(p, z);
                for (int kt = 0; kt < nku; kt++, it++) {
                    const uint32_t s = it % STAGES;
                    G_TCLK(t0);
                    if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
                    G_TADD(1, t0);
                    if (tid == 0) {
                        /* the full box counts even where TMA zero-fills past
                         * the edge; in a pair, half of B comes from the other
                         * block */
                        mbar_expect_tx(&full[s], A_BYTES + B_BYTES);
                        uint8_t *a = sA + s * A_BYTES, *b = sB + s * B_BYTES;
                        if (AMN) {       // A stored [K,M]: two 64(m) x 64(k) boxes
                            tma_load_3d(a, &tmA, m0, k0 + kt * G_BK, za, &full[s]);
                            tma_load_3d(a + 8192, &tmA, m0 + 64, k0 + kt * G_BK, za, &full[s]);
                        } else {         // A stored [M,K]: one 64(k) x 128(m) box
                            tma_load_3d(a, &tmA, k0 + kt * G_BK, m0, za, &full[s]);
                        }
                        if (ncta == 1) {
                            if (BMN) {   // B stored [K,N]: BN/64 boxes of 64(n) x 64(k)
#pragma unroll
                                for (int j = 0; j < BN / 64; j++)
                                    tma_load_3d(b + j * 8192, &tmB, n0 + j * 64, k0 + kt * G_BK, zb, &full[s]);
                            } else {     // B stored [N,K]: one 64(k) x BN(n) box
                                tma_load_3d(b, &tmB, k0 + kt * G_BK, n0, zb, &full[s]);
                            }
                        } else {         // this block's half of B's rows, into both blocks
                            if (BMN) {   // the 64-wide boxes alternate between the blocks (BN = 192: 2 and 1)
#pragma unroll
                                for (int j = 0; j < BN / 64; j++)
                                    if (j % 2 == rank)
                                        tma_load_3d_mc(b + j * 8192, &tmB, n0 + j * 64, k0 + kt * G_BK, zb, &full[s], 3);
                            } else {     // 64(k) x BN/2(n): BN/2 rows of 128 bytes
                                tma_load_3d_mc(b + rank * (BN / 2) * 128, &tmB, k0 + kt * G_BK, n0 + rank * (BN / 2),
                                               zb, &full[s], 3);
                            }
                        }
                    }
                    __syncwarp();
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1;
        uint8_t *stg = stg0 + cw * 2 * G_BOX;            // this consumer's two boxes
        uint32_t nbox = 0;                               // boxes stored so far (TMA path)
        /* byte step between the k16 slices of a 64-deep tile */
        constexpr int A_KSTEP = AMN ? 2048 : 32, B_KSTEP = BMN ? 2048 : 32;
        uint32_t it = 0;     // the ring's k-steps up to here, over all of this block's tiles
        for (int u = cid; u < p.units; u += ncl) {
            int z, m0, n0;
            wg_tile(p, u, ncta, rank, BN, z, m0, n0);
            float d[NACC];
#pragma unroll
            for (int e = 0; e < NACC; e++) d[e] = 0.f;
            const int nku = wg_nk(p, z);
            for (int kt = 0; kt < nku; kt++, it++) {
                const uint32_t s = it % STAGES;
                G_TCLK(t0);
                mbar_wait(&full[s], (it / STAGES) & 1);
                G_TADD(1, t0);
                /* this consumer's 64 rows of A: 8 KB on in either form */
                const uint8_t *a = sA + s * A_BYTES + cw * 8192;
                const uint8_t *b = sB + s * B_BYTES;
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < G_BK / 16; kk++)
                    wg_mma<BN, AMN, BMN, F16>(d, wg_desc<AMN>(a + kk * A_KSTEP), wg_desc<BMN>(b + kk * B_KSTEP));
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                /* keep this k-step's wgmmas in flight; the previous ones are
                 * done, so their stage can go back (to every block's producer) */
                G_TCLK(t1);
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
                G_TADD(2, t1);
                if (kt > 0 && tid == 0) stage_release(&empty[(it - 1) % STAGES], ncta);
            }
            G_TCLK(t2);
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            G_TADD(2, t2);
            if (tid == 0) stage_release(&empty[(it - 1) % STAGES], ncta);
            G_TCLK(t3);

            /* the epilogue: this consumer's 64 rows */
            if constexpr (EX == 2) wg_store_f32<BN>(p, d, z, m0 + cw * 64, n0, tid);
            else wg_store_slab<BN, F16, EX == 1>(p, &tmC, d, z, m0 + cw * 64, n0, stg, nbox, 2 + cw, tid);
            G_TADD(3, t3);
#ifdef G_TRACE
            tr[4]++;
#endif
        }
        /* the stores by TMA are done before the block leaves */
        if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
#ifdef G_TRACE
    if (tid == 0 && p.trace) {
        tr[0] = clock64() - t_start;
        for (int k = 0; k < 8; k++) p.trace[((size_t)blockIdx.x * 3 + wg) * 8 + k] = tr[k];
    }
#endif
    /* the pair leaves together: the other block's consumers may still
     * arrive on this block's barriers */
    cluster_sync();
#endif
}

/* Fallback: 64x64 tiles, 256 threads, 4x4 per thread, f32 FFMA. */
__global__ void __launch_bounds__(256)
gemm_bf16_simple_kernel(int M, int N, int K, const uint16_t *__restrict__ A,
                        const uint16_t *__restrict__ W, const float *__restrict__ bias, int epi,
                        uint16_t *__restrict__ C) {
    __shared__ float As[16][65], Ws[16][65];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            int r = e / 16, k = e % 16;
            As[k][r] = (m0 + r < M && k0 + k < K) ? kn_bf2f(A[(int64_t)(m0 + r) * K + k0 + k]) : 0.f;
            Ws[k][r] = (n0 + r < N && k0 + k < K) ? kn_bf2f(W[(int64_t)(n0 + r) * K + k0 + k]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 16; k++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += As[k][ty * 4 + i] * Ws[k][tx * 4 + j];
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= M || n >= N) continue;
            float v = acc[i][j] + (bias ? bias[n] : 0.f);
            if (epi == KN_CUDA_EPI_GELU) v = gelu_tanh(v);
            C[(int64_t)m * N + n] = kn_f2bf(v);
        }
}

/* Does the loaded module hold the sm_90a kernel body for this device? */
__global__ void gemm_bf16_probe_kernel(int *out) {
#ifdef KN_SM90A_DEVICE
    *out = 1;
#else
    *out = 0;
#endif
}

typedef CUresult (*kn_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                       const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                       const cuuint32_t *, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill);

static int g_wgmma_state = -1;     // -1 unknown, 0 no, 1 yes (per process; first device)
static kn_encode_tiled_fn g_encode = NULL;

int kn_sm90_available(void) {
    if (g_wgmma_state >= 0) return g_wgmma_state;
    int dev = 0, major = 0, ok = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        major != 9) {
        cudaGetLastError();
        return g_wgmma_state = 0;
    }
    int *d = NULL, h = 0;
    if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
        gemm_bf16_probe_kernel<<<1, 1>>>(d);
        if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess) ok = h;
        cudaFree(d);
    }
    cudaGetLastError();
    if (ok) {
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn) {
            cudaGetLastError();
            ok = 0;
        } else {
            g_encode = (kn_encode_tiled_fn)fn;
        }
    }
    return g_wgmma_state = ok;
}

extern "C" int kn_cuda_gemm_bf16_uses_wgmma(void) { return kn_sm90_available(); }

kn_status kn_sm90_map(CUtensorMap *map, const void *ptr, bool f16, int rank, const uint64_t *dims,
                      const uint64_t *strides, const uint32_t *box, const char *what) {
    if (!kn_sm90_available() || rank < 2 || rank > 5)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: no sm_90a tensor maps here (rank %d)", what, rank);
    cuuint64_t d[5], st[4];
    cuuint32_t bx[5], es[5];
    for (int i = 0; i < rank; i++) {
        d[i] = (cuuint64_t)dims[i];
        bx[i] = (cuuint32_t)box[i];
        es[i] = 1;
        if (i + 1 < rank) st[i] = (cuuint64_t)strides[i];
    }
    CUresult r = g_encode(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank,
                          (void *)ptr, d, st, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kn_set_error(KN_ERR_BACKEND, "%s: cuTensorMapEncodeTiled failed (%d) for a %dd view of %llu x %llu "
                            "(innermost first)", what, (int)r, rank, (unsigned long long)dims[0],
                            (unsigned long long)dims[1]);
    return KN_OK;
}

/* A 3-D map over a stored matrix [outer][inner] (row stride ld elements) and
 * nz batch entries sz elements apart; box: 64 inner x box_outer, 128-byte
 * swizzle (64 half elements = 128 bytes per box row). */
static kn_status make_map(CUtensorMap *map, const void *ptr, bool f16, int64_t inner, int64_t outer,
                          int64_t ld, int64_t nz, int64_t sz, uint32_t box_outer) {
    cuuint64_t dims[3] = {(cuuint64_t)inner, (cuuint64_t)outer, (cuuint64_t)nz};
    cuuint64_t strides[2] = {(cuuint64_t)ld * 2, (cuuint64_t)(nz > 1 ? sz : ld * outer) * 2};
    cuuint32_t box[3] = {64, box_outer, 1};
    cuuint32_t es[3] = {1, 1, 1};
    CUresult r = g_encode(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                          (void *)ptr, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kn_set_error(KN_ERR_BACKEND, "gemm_bf16_sm90: cuTensorMapEncodeTiled failed (%d) for a "
                            "%lld x %lld matrix (ld %lld) x %lld batch entries", (int)r, (long long)outer,
                            (long long)inner, (long long)ld, (long long)nz);
    return KN_OK;
}

/* SMs of the current device (132 on an H100 / H200 SXM) */
/* An attribute of the current device, dflt where it cannot be read */
static int wg_dev_attr(cudaDeviceAttr attr, int dflt) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v < 1) {
        cudaGetLastError();
        return dflt;
    }
    return v;
}
static int wg_sms(void) {
    static int n = 0;
    if (!n) n = wg_dev_attr(cudaDevAttrMultiProcessorCount, 132);
    return n;
}

/* Fewer block tiles than this leave most of the SMs idle; mma.sync's
 * 128 x 128 tiles (2 blocks per SM) do better there. */
#define WG_MIN_TILES 66

/* Blocks an M-tile group: 2 (a cluster sharing B's tile) from two M tiles;
 * KN_CUDA_TUNE=gemm_cluster=1 keeps every block alone. */
static int wg_ncta(int64_t M) {
    static int pair = -1;
    if (pair < 0) pair = kn_cuda_tune("gemm_cluster", 2) == 2;
    return pair && (M + G_BM - 1) / G_BM >= 2 ? 2 : 1;
}

/* Tile width: 128 for N <= 128 (attention's P @ V with a head dim of 64),
 * else the width whose rounds of units over the resident clusters take
 * least time, a unit's time taken as its width's weight: a 256-wide unit
 * 1, a 192-wide 0.78, a 128-wide 0.55. The narrower tiles do less work a
 * unit but read more shared memory per product (a consumer's m64nBNk16
 * reads 64 rows of A and BN of B; with TMA's writes a 128-wide tile needs
 * ~160 bytes a cycle of the SM's 128). GPT-2's fc2 forward [8192, 768] in
 * pairs: 192 units of 128 columns (3 rounds over 66 clusters, 1.65), 128 of
 * 192 (2 rounds, 1.56), 96 of 256 (2 rounds, 2). KN_CUDA_TUNE=gemm_bn=128,
 * 192 or 256 forces a width. */
static int wg_bn(int64_t M, int64_t N, int64_t nz) {
    if (N <= 128) return 128;
    static int force = -1;
    if (force < 0) force = kn_cuda_tune("gemm_bn", 0);
    if (force == 128 || force == 192 || force == 256) return force;
    const int ncta = wg_ncta(M);
    const int64_t groups = nz * (((M + G_BM - 1) / G_BM + ncta - 1) / ncta), ncl = wg_sms() / ncta;
    static const int width[3] = {256, 192, 128};
    static const double weight[3] = {1.0, 0.78, 0.55};
    int best = 256;
    double best_t = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t rounds = (groups * ((N + width[i] - 1) / width[i]) + ncl - 1) / ncl;
        const double t = weight[i] * (double)rounds;
        if (i == 0 || t < best_t) { best_t = t; best = width[i]; }
    }
    return best;
}

/* M-tile groups a swath of the tile order (wg_tile). The clusters resident
 * at once work on a window of units, a few groups by a few N tiles; what
 * that window reads from memory is its A rows (groups x 128 ncta x K) and
 * its B columns (N tiles x bn x K), unless the whole operand stays in L2
 * (half of it, or less) and is read once. The swath whose window reads the
 * fewest bytes, the widest of equals: GPT-2's fc2 forward [8192, 3072] @
 * [3072, 768] has an A of 50 MB and a B of 4.7 MB, and with whole columns
 * of M tiles (the widest swath) the window of 66 clusters spans 2 of 6 N
 * tiles, so all of A came from memory three times; one group a swath reads
 * it once. KN_CUDA_TUNE=gemm_swath=G forces G groups. */
static int wg_swath(int64_t M, int64_t N, int64_t K, int64_t npair, int64_t nnt, int bn, int ncta, int64_t units) {
    static int force = -1;
    static int64_t l2 = 0;
    if (force < 0) {
        force = kn_cuda_tune("gemm_swath", 0);
        l2 = wg_dev_attr(cudaDevAttrL2CacheSize, 50 << 20);
    }
    if (force > 0) return (int)(force < npair ? force : npair);
    const bool a_fits = M * K * 2 <= l2 / 2, b_fits = N * K * 2 <= l2 / 2;
    const int64_t w = units < wg_sms() / ncta ? units : wg_sms() / ncta;
    int64_t best = -1, best_g = npair;
    for (int64_t g = npair; g >= 1; g--) {
        const int64_t cols = (w + g - 1) / g < nnt ? (w + g - 1) / g : nnt;
        const int64_t bytes = (a_fits ? 0 : g * G_BM * ncta) + (b_fits ? 0 : cols * bn);
        if (best < 0 || bytes < best) { best = bytes; best_g = g; }
    }
    return (int)best_g;
}

/* Launch one instantiation over p.units units: as many clusters as fit on
 * the GPU at once (each walks units cid, cid + ncl, ...), each of ncta
 * blocks, with programmatic dependent launch where it is on. > 48 KB of
 * dynamic shared memory needs an opt-in, once per kernel. */
template <int BN, int AMN, int BMN, int F16, int EX>
static kn_status wg_launch(const CUtensorMap &ma, const CUtensorMap &mb, const CUtensorMap &mc, const wg_args &p, int ncta,
                           cudaStream_t st) {
    void (*kern)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const wg_args) = gemm_wgmma_kernel<BN, AMN, BMN, F16, EX>;
    static bool attr = false;
    static int fit[3];       /* clusters of 1 and 2 blocks resident at once */
    if (!attr) {
        KN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, G_SMEM_BYTES(BN)));
        attr = true;
    }
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)ncta;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t c = {};
    c.blockDim = dim3(384);
    c.dynamicSmemBytes = G_SMEM_BYTES(BN);
    c.stream = st;
    c.attrs = at;
    c.numAttrs = 1;
    if (!fit[ncta]) {
        /* a GPC with an odd number of SMs has one that no pair can use */
        c.gridDim = dim3((unsigned)(ncta * (wg_sms() / ncta)));
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, (const void *)kern, &c) != cudaSuccess || n < 1) {
            cudaGetLastError();
            n = wg_sms() / ncta;
        }
        fit[ncta] = n;
        /* KN_DEBUG read here, not through core/env.h: scripts/cuda_run.sh
         * builds this file without the library */
        const char *dbg = getenv("KN_DEBUG");
        if (dbg && *dbg && strcmp(dbg, "0") != 0)
            fprintf(stderr, "gemm_bf16_sm90: %d x %d tiles%s%s%s, clusters of %d: %d resident (%d SMs)\n", G_BM, BN,
                    AMN ? ", A stored [K,M]" : "", BMN ? ", B stored [K,N]" : "", F16 ? ", f16" : "", ncta, n, wg_sms());
    }
    /* KN_CUDA_TUNE=gemm_persist=0: a cluster a unit (for comparison; the
     * grid's x is at most 2^31 - 1 blocks) */
    static int persist = -1;
    if (persist < 0) persist = kn_cuda_tune("gemm_persist", 1) != 0;
    int ncl = p.units < fit[ncta] ? p.units : fit[ncta];
    if (!persist) ncl = p.units < INT32_MAX / 2 ? p.units : INT32_MAX / 2;
    c.gridDim = dim3((unsigned)(ncta * ncl));
    c.numAttrs = 1 + kn_pdl_attr(&at[1]);
#ifdef G_TRACE
    static unsigned long long *tbuf = NULL;
    static int nl = 0;
    const int nblk = (int)c.gridDim.x;
    if (!tbuf) KN_CUDA_TRY(cudaMalloc(&tbuf, sizeof(unsigned long long) * 24 * 4096));
    wg_args pt = p;
    pt.trace = nblk <= 4096 ? tbuf : NULL;
    KN_CUDA_TRY(cudaLaunchKernelEx(&c, kern, ma, mb, mc, pt));
    if (pt.trace && ++nl % 10 == 0) {
        static unsigned long long h[24 * 4096];
        KN_CUDA_TRY(cudaMemcpy(h, tbuf, sizeof(unsigned long long) * 24 * nblk, cudaMemcpyDeviceToHost));
        double a[3][5] = {{0}};
        for (int b = 0; b < nblk; b++)
            for (int w = 0; w < 3; w++)
                for (int k = 0; k < 5; k++) a[w][k] += (double)h[(b * 3 + w) * 8 + k] / nblk;
        fprintf(stderr, "G_TRACE M=%d N=%d K=%d BN=%d blocks %d: kcyc/block total %.1f | producer empty-wait %.1f | "
                "consumer1 full-wait %.1f mma-wait %.1f epi %.1f tiles %.2f | consumer2 full-wait %.1f mma-wait %.1f epi %.1f tiles %.2f\n",
                p.M, p.N, p.K, BN, nblk, a[1][0] / 1e3, a[0][1] / 1e3, a[1][1] / 1e3, a[1][2] / 1e3, a[1][3] / 1e3,
                a[1][4], a[2][1] / 1e3, a[2][2] / 1e3, a[2][3] / 1e3, a[2][4]);
    }
#else
    KN_CUDA_TRY(cudaLaunchKernelEx(&c, kern, ma, mb, mc, p));
#endif
    return KN_OK;
}

/* Maps, arguments and launch of C[z] = epi(op(A[z]) @ op(B[z]) + bias) with
 * nz batch entries (sa, sb, sc elements apart; sa or sb 0: shared). amn:
 * A stored [K,M]; bmn: B stored [K,N]. Shape and alignment were checked. */
static kn_status wg_run(bool f16, bool amn, bool bmn, int64_t M, int64_t N, int64_t K, const void *A,
                        int64_t lda, int64_t sa, const void *B, int64_t ldb, int64_t sb, void *C, int64_t ldc,
                        int64_t sc, int64_t nz, const float *bias, int epi, cudaStream_t st) {
    const int bn = wg_bn(M, N, nz), ncta = wg_ncta(M);
    CUtensorMap ma, mb;
    kn_status s;
    /* stored shapes: A [M,K] or [K,M]; B [N,K] or [K,N] (in a pair each
     * block loads half of B's rows of a tile: the K-major box is bn/ncta) */
    if (amn) s = make_map(&ma, A, f16, M, K, lda, sa ? nz : 1, sa, 64);
    else s = make_map(&ma, A, f16, K, M, lda, sa ? nz : 1, sa, G_BM);
    if (s) return s;
    if (bmn) s = make_map(&mb, B, f16, N, K, ldb, sb ? nz : 1, sb, 64);
    else s = make_map(&mb, B, f16, K, N, ldb, sb ? nz : 1, sb, (uint32_t)(bn / ncta));
    if (s) return s;
    /* C by TMA where its rows are 16-byte aligned: boxes of 64 x 64 */
    const bool vec = kn_aligned16(C) && (ldc * 2) % 16 == 0 && (sc * 2) % 16 == 0;
    CUtensorMap mc;
    memset(&mc, 0, sizeof mc);
    if (vec && (s = make_map(&mc, C, f16, N, M, ldc, sc ? nz : 1, sc, 64))) return s;
    const int64_t mt = (M + G_BM - 1) / G_BM, npair = (mt + ncta - 1) / ncta, nnt = (N + bn - 1) / bn;
    const int64_t units = nz * npair * nnt;
    if (units >= INT32_MAX)
        return kn_set_error(KN_ERR_UNSUPPORTED, "gemm_bf16_sm90: %lld tiles of %lld x %lld x %lld batch entries "
                            "are too many", (long long)units, (long long)M, (long long)N, (long long)nz);
    wg_args p = {(int)M, (int)N, (int)K, bias, epi, C, ldc, sc, sa != 0, sb != 0,
                 vec, (int)npair, (int)nnt, (int)units, 0, wg_swath(M, N, K, npair, nnt, bn, ncta, units)};
    /* a bias or GELU (kn_cuda_gemm_bf16: A [M,K], W [N,K], bf16) has kernels of its own */
    const bool ex = bias || epi != KN_CUDA_EPI_NONE;
    int key = (ex ? 32 : 0) | (bn == 192 ? 16 : 0) | (bn == 256 ? 8 : 0) | (amn ? 4 : 0) | (bmn ? 2 : 0) | (f16 ? 1 : 0);
    switch (key) {
    case 0: return wg_launch<128, 0, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 1: return wg_launch<128, 0, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 2: return wg_launch<128, 0, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 3: return wg_launch<128, 0, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 4: return wg_launch<128, 1, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 5: return wg_launch<128, 1, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 6: return wg_launch<128, 1, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 7: return wg_launch<128, 1, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 8: return wg_launch<256, 0, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 9: return wg_launch<256, 0, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 10: return wg_launch<256, 0, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 11: return wg_launch<256, 0, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 12: return wg_launch<256, 1, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 13: return wg_launch<256, 1, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 14: return wg_launch<256, 1, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 15: return wg_launch<256, 1, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 16: return wg_launch<192, 0, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 17: return wg_launch<192, 0, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 18: return wg_launch<192, 0, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 19: return wg_launch<192, 0, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 20: return wg_launch<192, 1, 0, 0, 0>(ma, mb, mc, p, ncta, st);
    case 21: return wg_launch<192, 1, 0, 1, 0>(ma, mb, mc, p, ncta, st);
    case 22: return wg_launch<192, 1, 1, 0, 0>(ma, mb, mc, p, ncta, st);
    case 23: return wg_launch<192, 1, 1, 1, 0>(ma, mb, mc, p, ncta, st);
    case 32: return wg_launch<128, 0, 0, 0, 1>(ma, mb, mc, p, ncta, st);
    case 40: return wg_launch<256, 0, 0, 0, 1>(ma, mb, mc, p, ncta, st);
    case 48: return wg_launch<192, 0, 0, 0, 1>(ma, mb, mc, p, ncta, st);
    default:
        return kn_set_error(KN_ERR_UNSUPPORTED, "gemm_bf16_sm90: no kernel for a bias or GELU with %s operands%s%s",
                            f16 ? "f16" : "bf16", amn ? ", A stored [K,M]" : "", bmn ? ", B stored [K,N]" : "");
    }
}

/* ---- split-K: few output tiles over a long K (weight gradients) ---- */

/* Slices (and their length, *kslice, a multiple of 64; and the cluster size,
 * *ncta) for splitting a product of few 128 x 128 tiles (< WG_MIN_TILES)
 * over K >= 2048: the count whose time is least, with or without pairs; 0
 * where one unsplit pass would do as well. Time in k-steps of a tile (128 x
 * 128 x 64, ~0.3 us on an H100): rounds of units over the resident clusters
 * times k-steps a slice, plus the slices' f32 partial sums written and read
 * back (M N 8 bytes a slice; ~900 KB of memory traffic a k-step's time).
 * Without that term GPT-2's proj dW [768, 768] over K = 8192 took 11 slices
 * of 12 k-steps (26 MB of partial sums, 40 us); with it, 3 of 43.
 * KN_CUDA_TUNE=gemm_split_kb=B sets the KB a k-step (0: partials free). */
static int wg_split_plan(int64_t M, int64_t N, int64_t K, int64_t *kslice, int *ncta) {
    const int64_t mt = (M + G_BM - 1) / G_BM, nt = (N + 127) / 128;
    if (mt * nt >= WG_MIN_TILES || K < 2048) return 0;
    static int kb = -1;
    if (kb < 0) kb = kn_cuda_tune("gemm_split_kb", 900);
    const double part = kb > 0 ? (double)M * (double)N * 8.0 / (kb * 1024.0) : 0;   /* k-steps a slice's partials cost */
    int best_s = 0;
    double best = 0;
    for (int c = 1; c <= wg_ncta(M); c++) {
        const int64_t u = (mt + c - 1) / c * nt, ncl = wg_sms() / c;
        for (int64_t S = 1; S <= 16 && S <= K / 512; S++) {
            const int64_t ks = (K + S * G_BK - 1) / (S * G_BK) * G_BK, Sa = (K + ks - 1) / ks;
            const double cost = (double)((u * Sa + ncl - 1) / ncl * (ks / G_BK)) + (Sa > 1 ? part * (double)Sa : 0);
            if (best_s == 0 || cost < best) { best = cost; best_s = (int)Sa; *kslice = ks; *ncta = c; }
        }
    }
    return best_s >= 2 ? best_s : 0;
}

/* The checks of kn_cuda_gemm_wgmma_split, then the plan (wg_split_plan) */
static int wg_split(kn_dtype ab, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                    int64_t ldb, int64_t *kslice, int *ncta) {
    if ((ab != KN_BF16 && ab != KN_F16) || M < 1 || N < 2 || N % 2 || M >= INT32_MAX || N >= INT32_MAX ||
        K >= INT32_MAX || M * N >= INT32_MAX)
        return 0;
    if (!A || !B || !kn_aligned16(A) || !kn_aligned16(B) || lda % 8 || ldb % 8) return 0;
    /* KN_CUDA_TUNE=gemm_split=0: the mma.sync slices instead (for comparison) */
    static int on = -1;
    if (on < 0) on = kn_cuda_tune("gemm_split", 1) != 0;
    if (!on || !kn_sm90_available()) return 0;
    return wg_split_plan(M, N, K, kslice, ncta);
}

extern "C" int kn_cuda_gemm_wgmma_split(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                        const void *A, int64_t lda, const void *B, int64_t ldb, int64_t *kslice) {
    (void)trans_a; (void)trans_b;
    int ncta = 1;
    return wg_split(ab, M, N, K, A, lda, B, ldb, kslice, &ncta);
}

extern "C" kn_status kn_cuda_gemm_wgmma_splitk(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                               int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                                               float *part, void *stream) {
    int64_t ks = 0;
    int ncta = 1;
    const int S = wg_split(ab, M, N, K, A, lda, B, ldb, &ks, &ncta);
    if (!S || !part)
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_cuda_gemm_wgmma_splitk: this product is not split here "
                            "(check kn_cuda_gemm_wgmma_split first)");
    const bool f16 = ab == KN_F16, amn = trans_a, bmn = !trans_b;
    CUtensorMap ma, mb, mc;
    memset(&mc, 0, sizeof mc);
    kn_status s;
    if (amn) s = make_map(&ma, A, f16, M, K, lda, 1, 0, 64);
    else s = make_map(&ma, A, f16, K, M, lda, 1, 0, G_BM);
    if (s) return s;
    if (bmn) s = make_map(&mb, B, f16, N, K, ldb, 1, 0, 64);
    else s = make_map(&mb, B, f16, K, N, ldb, 1, 0, (uint32_t)(128 / ncta));
    if (s) return s;
    const int64_t npair = ((M + G_BM - 1) / G_BM + ncta - 1) / ncta, nnt = (N + 127) / 128;
    wg_args p = {(int)M, (int)N, (int)K, NULL, KN_CUDA_EPI_NONE, part, N, M * N, 0, 0,
                 0, (int)npair, (int)nnt, (int)(S * npair * nnt), (int)ks, (int)npair};
    cudaStream_t st = kn_stream(stream);
    switch ((amn ? 4 : 0) | (bmn ? 2 : 0) | (f16 ? 1 : 0)) {
    case 0: return wg_launch<128, 0, 0, 0, 2>(ma, mb, mc, p, ncta, st);
    case 1: return wg_launch<128, 0, 0, 1, 2>(ma, mb, mc, p, ncta, st);
    case 2: return wg_launch<128, 0, 1, 0, 2>(ma, mb, mc, p, ncta, st);
    case 3: return wg_launch<128, 0, 1, 1, 2>(ma, mb, mc, p, ncta, st);
    case 4: return wg_launch<128, 1, 0, 0, 2>(ma, mb, mc, p, ncta, st);
    case 5: return wg_launch<128, 1, 0, 1, 2>(ma, mb, mc, p, ncta, st);
    case 6: return wg_launch<128, 1, 1, 0, 2>(ma, mb, mc, p, ncta, st);
    default: return wg_launch<128, 1, 1, 1, 2>(ma, mb, mc, p, ncta, st);
    }
}

extern "C" kn_status kn_cuda_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *A,
                                       const uint16_t *W, const float *bias, kn_cuda_epilogue epi,
                                       uint16_t *C, void *stream) {
    KN_CUDA_REQUIRE(M >= 0 && N >= 0 && K > 0 && M < INT32_MAX && N < INT32_MAX && K < INT32_MAX,
                    "kn_cuda_gemm_bf16: bad shape M=%lld N=%lld K=%lld", (long long)M,
                    (long long)N, (long long)K);
    KN_CUDA_REQUIRE(epi == KN_CUDA_EPI_NONE || epi == KN_CUDA_EPI_GELU,
                    "kn_cuda_gemm_bf16: unknown epilogue %d", (int)epi);
    if (M == 0 || N == 0) return KN_OK;
    KN_CUDA_REQUIRE(A && W && C, "kn_cuda_gemm_bf16: NULL pointer");
    cudaStream_t st = kn_stream(stream);
    if (kn_sm90_available() && K % 8 == 0 && kn_aligned16(A) && kn_aligned16(W))
        return wg_run(false, false, false, M, N, K, A, K, 0, W, K, 0, C, N, 0, 1, bias, (int)epi, st);
    dim3 grid((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64));
    KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_gemm_bf16: M=%lld too large", (long long)M);
    gemm_bf16_simple_kernel<<<grid, 256, 0, st>>>((int)M, (int)N, (int)K, A, W, bias, (int)epi, C);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- the general entry point (the backend's matmul node) ---- */

/* One stride per operand for the whole batch: the batch dims of
 * kn_cuda_gemm_batch (row-major over ne) collapse when each dim's stride is
 * the next one's times its size (a contiguous [B,H] batch), or when all are
 * 0 (the operand is shared). nz: the batch entries; s = -1: no such stride. */
static int64_t batch_stride(const kn_cuda_gemm_batch *bt, const int64_t *s) {
    bool zero = true;
    for (int i = 0; i < bt->nb; i++) zero = zero && s[i] == 0;
    if (zero) return 0;
    for (int i = 0; i + 1 < bt->nb; i++)
        if (s[i] != s[i + 1] * bt->ne[i + 1]) return -1;
    return s[bt->nb - 1] > 0 ? s[bt->nb - 1] : -1;
}

extern "C" int kn_cuda_gemm_wgmma_fits(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       const void *A, int64_t lda, const void *B, int64_t ldb, const void *C,
                                       kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch) {
    /* C in the operand dtype only (the epilogue converts to it) */
    if ((ab != KN_BF16 && ab != KN_F16) || c_dtype != ab) return 0;
    if (M < 1 || N < 1 || K < 1 || M >= INT32_MAX || N >= INT32_MAX || K >= INT32_MAX) return 0;
    if (!A || !B || !C || !kn_aligned16(A) || !kn_aligned16(B) || lda % 8 || ldb % 8) return 0;
    if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N) return 0;
    kn_cuda_gemm_batch none;
    memset(&none, 0, sizeof none);
    const kn_cuda_gemm_batch *bt = batch ? batch : &none;
    if (bt->nb < 0 || bt->nb > KN_CUDA_MAX_BATCH_DIMS) return 0;
    int64_t nz = 1;
    for (int i = 0; i < bt->nb; i++) nz *= bt->ne[i];
    if (nz < 1 || nz > 65535) return 0;
    if (nz > 1) {
        int64_t sa = batch_stride(bt, bt->sa), sb = batch_stride(bt, bt->sb), sc = batch_stride(bt, bt->sc);
        if (sa < 0 || sb < 0 || sc <= 0 || sa % 8 || sb % 8) return 0;
        /* batch entries of an operand must not overlap (the map's rows end
         * before the next entry starts) */
        if (sa && sa < (trans_a ? K : M) * lda) return 0;
        if (sb && sb < (trans_b ? N : K) * ldb) return 0;
    }
    const int64_t bn = wg_bn(M, N, nz);
    int64_t tiles = nz * ((M + G_BM - 1) / G_BM) * ((N + bn - 1) / bn);
    if (tiles < WG_MIN_TILES) return 0;
    return kn_sm90_available();
}

extern "C" kn_status kn_cuda_gemm_wgmma(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                        const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                                        kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream) {
    if (!kn_cuda_gemm_wgmma_fits(ab, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, c_dtype, ldc, batch))
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_cuda_gemm_wgmma: this device, layout or alignment is not "
                            "supported (check kn_cuda_gemm_wgmma_fits first; kn_cuda_gemm_tc takes any layout)");
    int64_t nz = 1, sa = 0, sb = 0, sc = 0;
    if (batch && batch->nb > 0) {
        for (int i = 0; i < batch->nb; i++) nz *= batch->ne[i];
        if (nz > 1) { sa = batch_stride(batch, batch->sa); sb = batch_stride(batch, batch->sb); sc = batch_stride(batch, batch->sc); }
    }
    return wg_run(ab == KN_F16, trans_a, !trans_b, M, N, K, A, lda, sa, B, ldb, sb, C, ldc, sc, nz, NULL,
                  KN_CUDA_EPI_NONE, kn_stream(stream));
}
