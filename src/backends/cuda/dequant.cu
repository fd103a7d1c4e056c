/* dequant.cu: GGUF blocks to bf16 or f32 on the GPU, one thread a run of 8
 * consecutive weights (quant_blocks.cuh kq_run), so that neighbouring threads
 * read neighbouring bytes and store one contiguous span (16-byte bf16
 * vectors). The quantized
 * matmul's GEMM path (prefill, M > 8) expands W [N, K] into pooled bf16
 * scratch for the tensor-core kernel; layouts the GEMV and that path do not
 * take expand to f32 for the generic kernels. Cost: one read of the blocks
 * and one write of 2 (bf16) or 4 (f32) bytes a weight per matmul, which a
 * fused dequantize-in-the-tile GEMM would save (not done yet).
 */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/quant_blocks.cuh"   // defines: kq_run, kn_qt

__device__ __forceinline__ void dq_store8(uint16_t *o, const float *w) {
    uint4 v;
    v.x = kn_f2bf(w[0]) | (uint32_t)kn_f2bf(w[1]) << 16;
    v.y = kn_f2bf(w[2]) | (uint32_t)kn_f2bf(w[3]) << 16;
    v.z = kn_f2bf(w[4]) | (uint32_t)kn_f2bf(w[5]) << 16;
    v.w = kn_f2bf(w[6]) | (uint32_t)kn_f2bf(w[7]) << 16;
    *(uint4 *)o = v;
}
__device__ __forceinline__ void dq_store8(float *o, const float *w) {
    *(float4 *)o = make_float4(w[0], w[1], w[2], w[3]);
    *(float4 *)(o + 4) = make_float4(w[4], w[5], w[6], w[7]);
}

/* out [nruns * 8] (16-byte aligned) from the blocks at W (2-byte aligned) */
template <int T, typename O>
__global__ void dequant_kernel(O *out, const uint8_t *__restrict__ W, int64_t nruns) {
    typedef kn_qt<T> Q;
    constexpr int RPB = Q::QK / 8;
    KN_GRID_LOOP(i, nruns) {
        float w[8];
        kq_run<T>(W + (i / RPB) * Q::BPB, (int)(i % RPB), w);
        dq_store8(out + 8 * i, w);
    }
}

template <int T>
static void dequant_go(void *out, int out_dt, const void *W, int64_t n, cudaStream_t s) {
    int64_t np = n / 8;
    if (out_dt == KN_BF16) dequant_kernel<T, uint16_t><<<kn_blocks(np), KN_THREADS, 0, s>>>((uint16_t *)out, (const uint8_t *)W, np);
    else dequant_kernel<T, float><<<kn_blocks(np), KN_THREADS, 0, s>>>((float *)out, (const uint8_t *)W, np);
}

/* out (n elements of out_dt, KN_BF16 or KN_F32) = the n / QK blocks at W of type wt */
extern "C" kn_status kn_cuda_dequant(int wt, void *out, int out_dt, const void *W, int64_t n, void *stream) {
    const kn_dtype_info *di = kn_dtype_get((kn_dtype)wt);
    KN_CUDA_REQUIRE(kn_cuda_quant_supported(wt), "kn_cuda_dequant: %s blocks are not decoded on the GPU", di ? di->name : "?");
    KN_CUDA_REQUIRE(out_dt == KN_BF16 || out_dt == KN_F32, "kn_cuda_dequant: output must be bf16 or f32");
    KN_CUDA_REQUIRE(n >= 0 && n % di->block_size == 0, "kn_cuda_dequant: %lld elements is not whole %s blocks", (long long)n, di->name);
    KN_CUDA_REQUIRE(kn_aligned16(out) && ((uintptr_t)W & 1) == 0, "kn_cuda_dequant: out must be 16-byte aligned, W 2-byte");
    if (n == 0) return KN_OK;
    cudaStream_t s = kn_stream(stream);
    switch (wt) {
#define QCASE(T) case T: dequant_go<T>(out, out_dt, W, n, s); break;
    KN_QUANT_GPU_TYPES(QCASE)
#undef QCASE
    }
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
