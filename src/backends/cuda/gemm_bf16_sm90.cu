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
 * Block tile 128 x BN x 64 (BN = 256, or 128 for narrow N), 3 warpgroups:
 * warpgroup 0 is the producer (one thread issues TMA bulk tensor copies into
 * a ring of stages, completing on "full" mbarriers), warpgroups 1 and 2 are
 * consumers, each doing wgmma m64nBNk16 over its 64 rows and releasing the
 * stage on an "empty" mbarrier. setmaxnreg gives the consumers 232 registers
 * (up to 128 accumulators each).
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
 * past the matrix edge (partial tiles, K % 64) are zero-filled by TMA and
 * never read from the next batch entry; the epilogue masks the stores.
 * Other GPUs / builds (and misaligned inputs, lda % 8 != 0): the entry
 * points say so (kn_cuda_gemm_wgmma_fits) and the caller uses gemm_tc.cu;
 * kn_cuda_gemm_bf16 keeps a plain tiled FFMA kernel (correct, slow).
 */
#include "backends/cuda/common.cuh"
#include <cuda.h>          // defines: CUtensorMap and its enums (no libcuda link: entry point via cudart)
#include <cuda_fp16.h>     // defines: __float2half_rn
#include <string.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KN_SM90A_DEVICE 1
#endif

#define G_BM 128
#define G_BK 64
/* per tile width BN: stages and shared-memory bytes (a stage holds A's
 * 128 x 64 and B's BN x 64 tiles; 1024 of alignment slack; the barriers) */
#define G_STAGES(BN) ((BN) == 256 ? 4 : 6)
#define G_STAGE_BYTES(BN) ((G_BM + (BN)) * G_BK * 2)
#define G_SMEM_BYTES(BN) (G_STAGES(BN) * G_STAGE_BYTES(BN) + 1024 + 2 * 8 * G_STAGES(BN))
/* the epilogue stages 128 rows of BN f32 (+16 bytes a row) in the stages */
static_assert(128 * (256 * 4 + 16) <= G_STAGES(256) * G_STAGE_BYTES(256), "staging fits");
static_assert(128 * (128 * 4 + 16) <= G_STAGES(128) * G_STAGE_BYTES(128), "staging fits");

/* output dtype codes of the kernel */
#define G_OUT_BF16 0
#define G_OUT_F16 1
#define G_OUT_F32 2
/* v in a 16-bit output dtype (G_OUT_BF16 or G_OUT_F16), rounded to nearest even */
__device__ __forceinline__ uint32_t g_to16(int c_out, float v) {
    return c_out == G_OUT_F16 ? __half_as_ushort(__float2half_rn(v)) : kn_f2bf(v);
}

struct wg_args {
    int M, N, K;
    const float *bias;      /* [N] f32 or NULL */
    int epi;                /* kn_cuda_epilogue */
    void *C;
    int c_out;              /* G_OUT_* */
    int64_t ldc, sc;        /* C row stride and batch stride, elements */
    int a_z, b_z;           /* 1 when the operand steps with the batch entry */
    int vec_out;            /* 16-byte stores allowed (base, ldc, sc aligned) */
};

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

#ifdef KN_SM90A_DEVICE
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
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
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
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

template <int BN, int AMN, int BMN, int F16>
__global__ void __launch_bounds__(384, 1)
gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                  const wg_args p) {
#ifdef KN_SM90A_DEVICE
    constexpr int STAGES = G_STAGES(BN), A_BYTES = G_BM * G_BK * 2, B_BYTES = BN * G_BK * 2;
    constexpr int NACC = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = base;                                   // [STAGES][A_BYTES]
    uint8_t *sB = base + STAGES * A_BYTES;                // [STAGES][B_BYTES]
    uint64_t *full = (uint64_t *)(base + STAGES * (A_BYTES + B_BYTES));
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int m0 = blockIdx.y * G_BM, n0 = blockIdx.x * BN, z = blockIdx.z;
    const int nk = (p.K + G_BK - 1) / G_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 2); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            const int za = p.a_z ? z : 0, zb = p.b_z ? z : 0;
            for (int kt = 0; kt < nk; kt++) {
                int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
                /* the full box counts even where TMA zero-fills past the edge */
                mbar_expect_tx(&full[s], A_BYTES + B_BYTES);
                uint8_t *a = sA + s * A_BYTES, *b = sB + s * B_BYTES;
                if (AMN) {       // A stored [K,M]: two 64(m) x 64(k) boxes
                    tma_load_3d(a, &tmA, m0, kt * G_BK, za, &full[s]);
                    tma_load_3d(a + 8192, &tmA, m0 + 64, kt * G_BK, za, &full[s]);
                } else {         // A stored [M,K]: one 64(k) x 128(m) box
                    tma_load_3d(a, &tmA, kt * G_BK, m0, za, &full[s]);
                }
                if (BMN) {       // B stored [K,N]: BN/64 boxes of 64(n) x 64(k)
#pragma unroll
                    for (int j = 0; j < BN / 64; j++) tma_load_3d(b + j * 8192, &tmB, n0 + j * 64, kt * G_BK, zb, &full[s]);
                } else {         // B stored [N,K]: one 64(k) x BN(n) box
                    tma_load_3d(b, &tmB, kt * G_BK, n0, zb, &full[s]);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1;
        float d[NACC];
#pragma unroll
        for (int i = 0; i < NACC; i++) d[i] = 0.f;
        /* byte step between the k16 slices of a 64-deep tile */
        constexpr int A_KSTEP = AMN ? 2048 : 32, B_KSTEP = BMN ? 2048 : 32;
        for (int kt = 0; kt < nk; kt++) {
            int s = kt % STAGES;
            mbar_wait(&full[s], (kt / STAGES) & 1);
            /* this consumer's 64 rows of A: 8 KB on in either form */
            const uint8_t *a = sA + s * A_BYTES + cw * 8192;
            const uint8_t *b = sB + s * B_BYTES;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < G_BK / 16; kk++)
                wg_mma<BN, AMN, BMN, F16>(d, wg_desc<AMN>(a + kk * A_KSTEP), wg_desc<BMN>(b + kk * B_KSTEP));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            /* keep this k-tile's wgmmas in flight; the previous ones are done,
             * so their stage can go back to the producer */
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (kt > 0 && tid == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        /* Epilogue, staged through shared memory as f32 so that global
         * stores are 16-byte and row-contiguous (and so that no branch on
         * the output dtype touches the accumulators: ptxas then serializes
         * the wgmmas, C7514). Fragment j of a thread is row warp*16 +
         * lane/4 (+8), col (j/4)*8 + (lane%4)*2 (+1). The pipeline buffers
         * are reused: both consumers first finish reading them (the
         * producer's copies have all landed: every full barrier was waited). */
        asm volatile("bar.sync 1, 256;" ::: "memory");
        constexpr int SROW = BN * 4 + 16;                 // padded staging row, bytes
        uint8_t *stg = base + cw * 64 * SROW;
        const int warp = tid / 32, lane = tid % 32;
#pragma unroll
        for (int j = 0; j < NACC; j += 2) {
            int rl = warp * 16 + lane / 4 + ((j & 2) ? 8 : 0);
            int cl = (j / 4) * 8 + (lane % 4) * 2;
            int col = n0 + cl;
            float v0 = d[j], v1 = d[j + 1];
            if (p.bias) { if (col < p.N) v0 += p.bias[col]; if (col + 1 < p.N) v1 += p.bias[col + 1]; }
            if (p.epi == KN_CUDA_EPI_GELU) { v0 = gelu_tanh(v0); v1 = gelu_tanh(v1); }
            *(float2 *)(stg + rl * SROW + cl * 4) = make_float2(v0, v1);
        }
        asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
        const int esz = p.c_out == G_OUT_F32 ? 4 : 2;
        uint8_t *cz = (uint8_t *)p.C + (int64_t)z * p.sc * esz;
        if (!p.vec_out) {
            /* rows not 16-byte aligned (an odd N such as a vocabulary of
             * 50257): each row of the tile is cut where its addresses cross
             * 16 bytes, into a head of h < V elements (V = 16 / esz), whole
             * 16-byte chunks and a tail; item 0 of a row is its head, item
             * k >= 1 the chunk from column h + (k-1) V. Chunks store as the
             * aligned path does, head and tail one element at a time. (One
             * element per thread, the previous way, ran the [8192, 50257]
             * logits in 2.1 ms against 1.07 for the aligned products of the
             * same size.) */
            const int V = 16 / esz, per = BN / V + 1;
            for (int c = tid; c < 64 * per; c += 128) {
                const int rl = c / per, k = c % per, row = m0 + cw * 64 + rl;
                if (row >= p.M) continue;
                uint8_t *rp = cz + ((int64_t)row * p.ldc + n0) * esz;        /* the row's column n0 */
                const int h = (int)((16 - ((uintptr_t)rp & 15)) & 15) / esz;
                const int c0 = k == 0 ? 0 : h + (k - 1) * V, c1 = k == 0 ? h : min(h + k * V, BN);
                if (c0 >= c1) continue;
                const float *sv = (const float *)(stg + rl * SROW);
                if (c1 - c0 == V && n0 + c1 <= p.N) {
                    if (esz == 4) {
                        *(float4 *)(rp + c0 * 4) = make_float4(sv[c0], sv[c0 + 1], sv[c0 + 2], sv[c0 + 3]);
                    } else {
                        uint32_t w[4];
#pragma unroll
                        for (int q = 0; q < 4; q++) w[q] = g_to16(p.c_out, sv[c0 + 2 * q]) | g_to16(p.c_out, sv[c0 + 2 * q + 1]) << 16;
                        *(uint4 *)(rp + c0 * 2) = make_uint4(w[0], w[1], w[2], w[3]);
                    }
                } else {
                    for (int q = c0; q < c1 && n0 + q < p.N; q++) {
                        float v = sv[q];
                        if (esz == 4) ((float *)rp)[q] = v;
                        else ((uint16_t *)rp)[q] = (uint16_t)g_to16(p.c_out, v);
                    }
                }
            }
            return;
        }
        /* chunks of 8 columns: 32 bytes of f32 or 16 of bf16/f16 */
        for (int c = tid; c < 64 * (BN / 8); c += 128) {
            int rl = c / (BN / 8), ch = c % (BN / 8);
            int row = m0 + cw * 64 + rl, col = n0 + ch * 8;
            if (row >= p.M || col >= p.N) continue;
            const float4 lo = *(const float4 *)(stg + rl * SROW + ch * 32);
            const float4 hi = *(const float4 *)(stg + rl * SROW + ch * 32 + 16);
            const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            uint8_t *cp = cz + ((int64_t)row * p.ldc + col) * esz;
            const bool whole = p.vec_out && col + 8 <= p.N;
            if (esz == 4) {
                if (whole) {
                    ((float4 *)cp)[0] = lo;
                    ((float4 *)cp)[1] = hi;
                } else {
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        if (col + q < p.N) ((float *)cp)[q] = v[q];
                }
            } else {
                uint16_t h[8];
#pragma unroll
                for (int q = 0; q < 8; q++)
                    h[q] = (uint16_t)g_to16(p.c_out, v[q]);
                if (whole) {
                    *(uint4 *)cp = make_uint4(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16),
                                              h[4] | ((uint32_t)h[5] << 16), h[6] | ((uint32_t)h[7] << 16));
                } else {
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        if (col + q < p.N) ((uint16_t *)cp)[q] = h[q];
                }
            }
        }
    }
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

/* Launch one instantiation; > 48 KB of dynamic shared memory needs an
 * opt-in, once per kernel. */
template <int BN, int AMN, int BMN, int F16>
static kn_status wg_launch(const CUtensorMap &ma, const CUtensorMap &mb, const wg_args &p, dim3 grid,
                           cudaStream_t st) {
    static bool attr = false;
    if (!attr) {
        KN_CUDA_TRY(cudaFuncSetAttribute(gemm_wgmma_kernel<BN, AMN, BMN, F16>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, G_SMEM_BYTES(BN)));
        attr = true;
    }
    gemm_wgmma_kernel<BN, AMN, BMN, F16><<<grid, 384, G_SMEM_BYTES(BN), st>>>(ma, mb, p);
    KN_CUDA_LAUNCHED();
    return KN_OK;
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
    if (wgmma_available() && K % 8 == 0 && kn_aligned16(A) && kn_aligned16(W)) {
        CUtensorMap ma, mb;
        kn_status s = make_map(&ma, A, false, K, M, K, 1, 0, G_BM);
        if (s) return s;
        if ((s = make_map(&mb, W, false, K, N, K, 1, 0, 256))) return s;
        wg_args p = {(int)M, (int)N, (int)K, bias, (int)epi, C, G_OUT_BF16, N, 0, 0, 0,
                     (N % 8) == 0 && kn_aligned16(C)};
        dim3 grid((unsigned)((N + 255) / 256), (unsigned)((M + G_BM - 1) / G_BM));
        KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_gemm_bf16: M=%lld too large", (long long)M);
        return wg_launch<256, 0, 0, 0>(ma, mb, p, grid, st);
    }
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

/* Fewer block tiles than this leave most of the 132 SMs idle; mma.sync's
 * 128 x 128 tiles (2 blocks per SM) do better there. */
#define WG_MIN_TILES 66
#define WG_SMS 132                  /* H100 / H200 SXM */

/* Tile width: 128 for narrow products (N <= 128: attention's P @ V with a
 * head dim of 64), else 256, except where 256-wide tiles would fill less
 * than one wave of the SMs and 128-wide ones still fit in one: there the
 * narrow tiles halve the time of the only wave (a weight gradient
 * dW [2304, 768] over 8192 rows: 54 tiles of 128 x 256 left it on the
 * mma.sync kernel at 142 TFLOP/s on an H200; 108 of 128 x 128 fit a wave). */
static int wg_bn(int64_t M, int64_t N, int64_t nz) {
    if (N <= 128) return 128;
    int64_t mt = nz * ((M + G_BM - 1) / G_BM);
    return mt * ((N + 255) / 256) < WG_SMS && mt * ((N + 127) / 128) <= WG_SMS ? 128 : 256;
}

extern "C" int kn_cuda_gemm_wgmma_fits(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       const void *A, int64_t lda, const void *B, int64_t ldb, const void *C,
                                       kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch) {
    /* C in the operand dtype only: the kernel's f32 (and cross-dtype) output
     * path is written but has not run against a reference on a GPU yet */
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
    if ((M + G_BM - 1) / G_BM > 65535 || tiles < WG_MIN_TILES) return 0;
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
    const bool f16 = ab == KN_F16, amn = trans_a, bmn = !trans_b;
    const int bn = wg_bn(M, N, nz);
    CUtensorMap ma, mb;
    kn_status s;
    /* stored shapes: A [M,K] or [K,M]; B [N,K] or [K,N] */
    if (amn) s = make_map(&ma, A, f16, M, K, lda, sa ? nz : 1, sa, 64);
    else s = make_map(&ma, A, f16, K, M, lda, sa ? nz : 1, sa, G_BM);
    if (s) return s;
    if (bmn) s = make_map(&mb, B, f16, N, K, ldb, sb ? nz : 1, sb, 64);
    else s = make_map(&mb, B, f16, K, N, ldb, sb ? nz : 1, sb, (uint32_t)bn);
    if (s) return s;
    const int esz = c_dtype == KN_F32 ? 4 : 2;
    wg_args p = {(int)M, (int)N, (int)K, NULL, KN_CUDA_EPI_NONE, C,
                 c_dtype == KN_F32 ? G_OUT_F32 : c_dtype == KN_F16 ? G_OUT_F16 : G_OUT_BF16, ldc, sc,
                 sa != 0, sb != 0, kn_aligned16(C) && (ldc * esz) % 16 == 0 && (sc * esz) % 16 == 0};
    dim3 grid((unsigned)((N + bn - 1) / bn), (unsigned)((M + G_BM - 1) / G_BM), (unsigned)nz);
    cudaStream_t st = kn_stream(stream);
    int key = (bn == 256 ? 8 : 0) | (amn ? 4 : 0) | (bmn ? 2 : 0) | (f16 ? 1 : 0);
    switch (key) {
    case 0: return wg_launch<128, 0, 0, 0>(ma, mb, p, grid, st);
    case 1: return wg_launch<128, 0, 0, 1>(ma, mb, p, grid, st);
    case 2: return wg_launch<128, 0, 1, 0>(ma, mb, p, grid, st);
    case 3: return wg_launch<128, 0, 1, 1>(ma, mb, p, grid, st);
    case 4: return wg_launch<128, 1, 0, 0>(ma, mb, p, grid, st);
    case 5: return wg_launch<128, 1, 0, 1>(ma, mb, p, grid, st);
    case 6: return wg_launch<128, 1, 1, 0>(ma, mb, p, grid, st);
    case 7: return wg_launch<128, 1, 1, 1>(ma, mb, p, grid, st);
    case 8: return wg_launch<256, 0, 0, 0>(ma, mb, p, grid, st);
    case 9: return wg_launch<256, 0, 0, 1>(ma, mb, p, grid, st);
    case 10: return wg_launch<256, 0, 1, 0>(ma, mb, p, grid, st);
    case 11: return wg_launch<256, 0, 1, 1>(ma, mb, p, grid, st);
    case 12: return wg_launch<256, 1, 0, 0>(ma, mb, p, grid, st);
    case 13: return wg_launch<256, 1, 0, 1>(ma, mb, p, grid, st);
    case 14: return wg_launch<256, 1, 1, 0>(ma, mb, p, grid, st);
    default: return wg_launch<256, 1, 1, 1>(ma, mb, p, grid, st);
    }
}
