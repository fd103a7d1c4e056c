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
 * Tiles are handed out M-fastest (the pairs of one column of B tiles, then
 * the next column): the blocks running at once share few B tiles, which
 * keeps a classifier's [50257, 768] weight from being streamed from memory
 * once per row band.
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
#include "backends/cuda/tune.cuh"    // kn_cuda_tune: gemm_cluster, gemm_persist, gemm_bn, gemm_split
#include <stdio.h>
#include <cuda.h>          // defines: CUtensorMap and its enums (no libcuda link: entry point via cudart)
#include <cuda_fp16.h>     // defines: __float2half_rn
#include <string.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KN_SM90A_DEVICE 1
#endif

#define G_BM 128
#define G_BK 64
/* Per tile width BN: stages of the ring (a stage holds A's 128 x 64 and
 * B's BN x 64 tiles) and the shared bytes: the ring, the epilogue's two
 * staging boxes a consumer (64 rows x 64 columns of 16-bit values, 8 KB,
 * in TMA's 128-byte swizzle), 1024 of alignment slack, the barriers.
 * 227 KB an SM: 4 stages at BN = 256, 6 at 128. */
#define G_STAGES(BN) ((BN) == 256 ? 4 : 6)
#define G_STAGE_BYTES(BN) ((G_BM + (BN)) * G_BK * 2)
#define G_BOX 8192
#define G_SMEM_BYTES(BN) (G_STAGES(BN) * G_STAGE_BYTES(BN) + 4 * G_BOX + 1024 + 2 * 8 * G_STAGES(BN))
/* the odd-N epilogue's padded rows (64 values and 16 bytes: a warp's
 * 4-byte writes to 8 rows hit 32 banks) fit a consumer's two boxes */
#define G_SROW (64 * 2 + 16)
static_assert(64 * G_SROW <= 2 * G_BOX, "padded staging fits");
static_assert(G_SMEM_BYTES(256) <= 227 * 1024 && G_SMEM_BYTES(128) <= 227 * 1024, "shared memory");

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
#ifdef G_TRACE
    unsigned long long *trace;   /* [grid][3 warpgroups][8] */
#endif
};

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

#ifdef KN_SM90A_DEVICE
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* a special register: G_SREG(r, "%%cluster_ctarank") */
#define G_SREG(var, name) asm volatile("mov.u32 %0, " name ";" : "=r"(var))
#ifdef G_TRACE   /* diagnostics build: cycles per phase, per block (not in the library) */
#define G_TCLK(v) uint64_t v = clock64()
#define G_TADD(slot, v0) (tr[slot] += clock64() - (v0))
#else
#define G_TCLK(v)
#define G_TADD(slot, v0)
#endif
/* every thread of the cluster: arrive (release) and wait (acquire) */
__device__ __forceinline__ void cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    uint32_t a = smem_u32(b), ok = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok) : "r"(a), "r"(parity) : "memory");
    } while (!ok);
}
/* Arrive on the barrier at b's offset in block `rank` of the cluster (this
 * block's own included). Default semantics (release at CTA scope), as a
 * stage hand-back needs: with .release.cluster every GPT-2 product ran
 * 2-2.7x slower on an H100 (KN_CUDA_TUNE=gemm_heavy=1 of that build). */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(b)), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(r) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
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
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int x, int y, int z,
                                            uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)(uintptr_t)map), "r"(x), "r"(y), "r"(z),
                 "r"(smem_u32(bar)) : "memory");
}
/* the same box written at dst's offset in every block of `mask` (and
 * completing on each one's barrier at bar's offset) */
__device__ __forceinline__ void tma_load_3d_mc(void *dst, const CUtensorMap *map, int x, int y, int z,
                                               uint64_t *bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3, %4}], [%5], %6;"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)(uintptr_t)map), "r"(x), "r"(y), "r"(z),
                 "r"(smem_u32(bar)), "h"(mask) : "memory");
}
/* TMA store of the box at src (this block's shared memory) to the map's
 * box at {x, y, z}; rows and columns past the matrix are not written.
 * bulk_commit closes a group of them (an empty group where none). */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, const void *src, int x, int y, int z) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
                 ::"l"((uint64_t)(uintptr_t)map), "r"(smem_u32(src)), "r"(x), "r"(y), "r"(z) : "memory");
}
__device__ __forceinline__ void bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* Shared-memory matrix descriptor, 128-byte swizzle. K-major: rows of 128
 * bytes of k, 8-row core groups 1024 bytes apart (SBO), LBO unused (1).
 * MN-major: 64 m/n per 128-byte row, next 8 k rows 1024 bytes on (SBO),
 * next 64 m/n one 8 KB box on (LBO). Fields are in 16-byte units. */
template <int MN> __device__ __forceinline__ uint64_t wg_desc(const void *p) {
    uint64_t a = smem_u32(p);
    uint64_t lbo = MN ? (8192 >> 4) : 1;
    return ((a & 0x3FFFFull) >> 4) | (lbo << 16) | (64ull << 32) | (1ull << 62);
}
/* One wgmma m64nBNk16 (BN = 256: 128 accumulators per thread, 128: 64),
 * D += A * B with A from descriptor da, B from db; AMN / BMN set the
 * transpose bits (operand stored MN-major); F16 picks .f16 over .bf16. The
 * scale-d predicate is always 1: accumulators start at zero. */
template <int AMN, int BMN> __device__ __forceinline__ void wg_mma_256_bf16(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(AMN), "n"(BMN));
}
template <int AMN, int BMN> __device__ __forceinline__ void wg_mma_256_f16(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(AMN), "n"(BMN));
}
template <int AMN, int BMN> __device__ __forceinline__ void wg_mma_128_bf16(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(AMN), "n"(BMN));
}
template <int AMN, int BMN> __device__ __forceinline__ void wg_mma_128_f16(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(AMN), "n"(BMN));
}
template <int BN, int AMN, int BMN, int F16>
__device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db) {
    static_assert(BN == 256 || BN == 128, "only the m64n256k16 and m64n128k16 shapes are written");
    if constexpr (BN == 256) {
        if constexpr (F16) wg_mma_256_f16<AMN, BMN>(d, da, db); else wg_mma_256_bf16<AMN, BMN>(d, da, db);
    } else {
        if constexpr (F16) wg_mma_128_f16<AMN, BMN>(d, da, db); else wg_mma_128_bf16<AMN, BMN>(d, da, db);
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

/* Unit u of the tile list (M-tile group fastest, then N tile, then batch
 * entry): this block's batch entry z and tile origin (m0, n0). A group is a
 * pair of M tiles in a cluster of two (rank 0 the upper), one tile alone. */
__device__ __forceinline__ void wg_tile(const wg_args &p, int u, int ncta, int rank, int bn, int &z, int &m0,
                                        int &n0) {
    const int per_z = p.npair * p.nnt;
    z = u / per_z;
    const int r = u - z * per_z, nt = r / p.npair, mp = r - nt * p.npair;
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
                            if (BMN) {
#pragma unroll
                                for (int j = 0; j < BN / 128; j++) {
                                    const int jj = rank * (BN / 128) + j;
                                    tma_load_3d_mc(b + jj * 8192, &tmB, n0 + jj * 64, k0 + kt * G_BK, zb, &full[s], 3);
                                }
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

static int wgmma_available(void) {
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

extern "C" int kn_cuda_gemm_bf16_uses_wgmma(void) { return wgmma_available(); }

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
static int wg_sms(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
            cudaGetLastError();
            n = 132;
        }
    }
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
 * else the width whose last round of units over the SMs wastes less, a
 * 128-wide unit taken as 0.55 of a 256-wide one (its B traffic per output
 * is the same, its A traffic twice). GPT-2's projection [8192, 768] has 96
 * units of 256 x 256 for 66 clusters (2 rounds, the second a third full)
 * and 192 of 256 x 128 (3 rounds): 128. KN_CUDA_TUNE=gemm_bn=128 or 256
 * forces a width. */
static int wg_bn(int64_t M, int64_t N, int64_t nz) {
    if (N <= 128) return 128;
    static int force = -1;
    if (force < 0) force = kn_cuda_tune("gemm_bn", 0);
    if (force == 128 || force == 256) return force;
    const int ncta = wg_ncta(M);
    const int64_t groups = nz * (((M + G_BM - 1) / G_BM + ncta - 1) / ncta), ncl = wg_sms() / ncta;
    const int64_t r256 = (groups * ((N + 255) / 256) + ncl - 1) / ncl;
    const int64_t r128 = (groups * ((N + 127) / 128) + ncl - 1) / ncl;
    return 0.55 * (double)r128 < (double)r256 ? 128 : 256;
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
                 vec, (int)npair, (int)nnt, (int)units};
    /* a bias or GELU (kn_cuda_gemm_bf16: A [M,K], W [N,K], bf16) has kernels of its own */
    const bool ex = bias || epi != KN_CUDA_EPI_NONE;
    int key = (ex ? 32 : 0) | (bn == 256 ? 8 : 0) | (amn ? 4 : 0) | (bmn ? 2 : 0) | (f16 ? 1 : 0);
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
    case 32: return wg_launch<128, 0, 0, 0, 1>(ma, mb, mc, p, ncta, st);
    case 40: return wg_launch<256, 0, 0, 0, 1>(ma, mb, mc, p, ncta, st);
    default:
        return kn_set_error(KN_ERR_UNSUPPORTED, "gemm_bf16_sm90: no kernel for a bias or GELU with %s operands%s%s",
                            f16 ? "f16" : "bf16", amn ? ", A stored [K,M]" : "", bmn ? ", B stored [K,N]" : "");
    }
}

/* ---- split-K: few output tiles over a long K (weight gradients) ---- */

/* Slices (and their length, *kslice, a multiple of 64; and the cluster size,
 * *ncta) for splitting a product of few 128 x 128 tiles (< WG_MIN_TILES)
 * over K >= 2048: the count whose rounds of units over the resident
 * clusters times k-steps a slice is least, with or without pairs; 0 where
 * one unsplit pass would do as well. */
static int wg_split_plan(int64_t M, int64_t N, int64_t K, int64_t *kslice, int *ncta) {
    const int64_t mt = (M + G_BM - 1) / G_BM, nt = (N + 127) / 128;
    if (mt * nt >= WG_MIN_TILES || K < 2048) return 0;
    int best_s = 0;
    int64_t best = 0;
    for (int c = 1; c <= wg_ncta(M); c++) {
        const int64_t u = (mt + c - 1) / c * nt, ncl = wg_sms() / c;
        for (int64_t S = 1; S <= 16 && S <= K / 512; S++) {
            const int64_t ks = (K + S * G_BK - 1) / (S * G_BK) * G_BK, Sa = (K + ks - 1) / ks;
            const int64_t cost = (u * Sa + ncl - 1) / ncl * (ks / G_BK);
            if (best_s == 0 || cost < best) { best = cost; best_s = (int)Sa; *kslice = ks; *ncta = c; }
        }
    }
    return best_s >= 2 ? best_s : 0;
}

extern "C" int kn_cuda_gemm_wgmma_split(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                        const void *A, int64_t lda, const void *B, int64_t ldb, int64_t *kslice) {
    (void)trans_a; (void)trans_b;
    if ((ab != KN_BF16 && ab != KN_F16) || M < 1 || N < 2 || N % 2 || M >= INT32_MAX || N >= INT32_MAX ||
        K >= INT32_MAX || M * N >= INT32_MAX)
        return 0;
    if (!A || !B || !kn_aligned16(A) || !kn_aligned16(B) || lda % 8 || ldb % 8) return 0;
    /* KN_CUDA_TUNE=gemm_split=0: the mma.sync slices instead (for comparison) */
    static int on = -1;
    if (on < 0) on = kn_cuda_tune("gemm_split", 1) != 0;
    if (!on || !wgmma_available()) return 0;
    int ncta = 1;
    return wg_split_plan(M, N, K, kslice, &ncta);
}

extern "C" kn_status kn_cuda_gemm_wgmma_splitk(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                               int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                                               float *part, void *stream) {
    int64_t ks = 0;
    int ncta = 1;
    const int S = kn_cuda_gemm_wgmma_split(ab, trans_a, trans_b, M, N, K, A, lda, B, ldb, &ks) ?
                  wg_split_plan(M, N, K, &ks, &ncta) : 0;
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
                 0, (int)npair, (int)nnt, (int)(S * npair * nnt), (int)ks};
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
    if (wgmma_available() && K % 8 == 0 && kn_aligned16(A) && kn_aligned16(W))
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
    return wgmma_available();
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
