/* gemv_quant.cu: y[m, n] = x[m, :] . W[n, :] for a GGUF-quantized weight W
 * [N, K] (raw blocks, rows of K/QK blocks back to back) and a few f32
 * activation rows x [M, K], M <= 8: decode, the LLM's x @ W^T with weights
 * kept as stored (KN_WEIGHTS_FILE). Letters: N output rows, K the reduced
 * dim (a multiple of the block's QK), M activation rows.
 *
 * Bound by reading W once (K/QK * BPB bytes a row: 0.56 bytes a weight for
 * Q4_0 against 2 for bf16), so the load path is what matters:
 *   - one warp per R weight rows (R = 1, or 2 for tall matrices so that the
 *     activations a lane loads serve two rows); 4 warps a block;
 *   - per step a warp covers 32 pieces (quant_blocks.cuh: 32 weights each,
 *     1024 columns): it copies the blocks' bytes of each of its rows into a
 *     shared-memory window with coalesced 16-byte loads (the window starts
 *     at the 16-byte boundary below the first block: blocks of 18..210 bytes
 *     are not 16-byte aligned, a 16-byte granule holding any byte of the row
 *     is always mapped), then each lane decodes its piece from shared memory
 *     into 32 f32 registers and dots it with the f32 activations (float4
 *     loads through the read-only cache), f32 accumulation;
 *   - the warp's lanes sum by shuffles; lane 0 stores y (+ bias[n], + res[n]
 *     for M = 1: the matmul epilogue of the GEMV, each step rounded to f32 as
 *     the unfused nodes round it).
 * Activations stay f32 (no q8 quantization of x as llama.cpp's MMVQ does):
 * the error is then only the f32 summation order against a dequantized
 * reference. Non-goals: M > 8 (the GEMM path dequantizes to bf16), strided
 * W rows, K not a multiple of QK.
 */
#include "backends/cuda/common.cuh"
#include "backends/cuda/quant_blocks.cuh"   // defines: kq_piece, kn_qt
#include "backends/cuda/tune.cuh"           // defines: kn_cuda_tune

#define QG_WARPS 4
/* bytes of one warp step of one row: 32 pieces' blocks + 16 of alignment slack */
#define QG_WIN16(T) ((32 / kn_qt<T>::PPB * kn_qt<T>::BPB + 31) / 16)

/* x: [M, ldx] f32, 16-byte aligned rows; y: [M, ldy]; W: N rows of row_bytes;
 * nblk blocks a row; MM >= M the unrolled activation rows */
template <int T, int R, int MM>
__global__ void __launch_bounds__(QG_WARPS * 32)
qgemv_kernel(float *y, int64_t ldy, const uint8_t *__restrict__ W, int64_t row_bytes, const float *__restrict__ x,
             int64_t ldx, int M, int N, int nblk, const float *__restrict__ bias, const float *__restrict__ res) {
    typedef kn_qt<T> Q;
    constexpr int BPG = 32 / Q::PPB;                     /* blocks a warp step */
    constexpr int W16 = QG_WIN16(T);
    __shared__ uint4 win[QG_WARPS][R][W16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * QG_WARPS + warp) * R;
    if (row0 >= N) return;                               /* no block-wide sync below */
    const int blk = lane / Q::PPB, piece = lane % Q::PPB;
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.f;
    for (int b0 = 0; b0 < nblk; b0 += BPG) {
        const int nb = nblk - b0 < BPG ? nblk - b0 : BPG;
        int shoff[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = row0 + r < N ? row0 + r : N - 1;   /* a missing second row reads the last (unused) */
            const uint8_t *s = W + (int64_t)row * row_bytes + (int64_t)b0 * Q::BPB;
            uintptr_t a0 = (uintptr_t)s & ~(uintptr_t)15, a1 = ((uintptr_t)s + (uintptr_t)(nb * Q::BPB) + 15) & ~(uintptr_t)15;
            int n16 = (int)((a1 - a0) >> 4);
            const uint4 *g = (const uint4 *)a0;
            for (int i = lane; i < n16; i += 32) win[warp][r][i] = __ldcs(g + i);
            shoff[r] = (int)((uintptr_t)s - a0);
        }
        __syncwarp();
        if (blk < nb) {
            float w[R][32];
            int off[4];
#pragma unroll
            for (int r = 0; r < R; r++)
                kq_piece<T>((const uint8_t *)win[warp][r] + shoff[r] + blk * Q::BPB, piece, w[r], off);
            const int64_t col = (int64_t)(b0 + blk) * Q::QK;
#pragma unroll
            for (int m = 0; m < MM; m++) {
                if (m >= M) break;
                const float *xr = x + (int64_t)m * ldx + col;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 xa = __ldg((const float4 *)(xr + off[u])), xb = __ldg((const float4 *)(xr + off[u] + 4));
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float *wr = w[r] + 8 * u;
                        acc[r][m] += wr[0] * xa.x + wr[1] * xa.y + wr[2] * xa.z + wr[3] * xa.w +
                                     wr[4] * xb.x + wr[5] * xb.y + wr[6] * xb.z + wr[7] * xb.w;
                    }
                }
            }
        }
        __syncwarp();                                    /* the window is rewritten next step */
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = row0 + r;
#pragma unroll
        for (int m = 0; m < MM; m++) {
            float v = kn_warp_sum(acc[r][m]);
            if (lane == 0 && m < M && row < N) {
                if (bias) v = v + bias[row];
                if (res) v = res[row] + v;
                y[(int64_t)m * ldy + row] = v;
            }
        }
    }
}

template <int T, int R, int MM>
static void qgemv_go(float *y, int64_t ldy, const void *W, const float *x, int64_t ldx, int M, int64_t N, int64_t K,
                     const float *bias, const float *res, cudaStream_t s) {
    typedef kn_qt<T> Q;
    int64_t nblk = K / Q::QK, rows_per_block = (int64_t)QG_WARPS * R;
    qgemv_kernel<T, R, MM><<<(unsigned)((N + rows_per_block - 1) / rows_per_block), QG_WARPS * 32, 0, s>>>(
        y, ldy, (const uint8_t *)W, nblk * Q::BPB, x, ldx, M, (int)N, (int)nblk, bias, res);
}

template <int T>
static void qgemv_type(float *y, int64_t ldy, const void *W, const float *x, int64_t ldx, int M, int64_t N, int64_t K,
                       const float *bias, const float *res, cudaStream_t s) {
    /* two rows a warp where the matrix has rows to spare (32 warps a block
     * slot's worth on every SM at one row a warp): measured in docs/PERF.md;
     * KN_CUDA_TUNE=qgemv_r=1|2 forces one */
    static const int rt = kn_cuda_tune("qgemv_r", 0);
    int R = rt == 1 || rt == 2 ? rt : N >= 8192 ? 2 : 1;
    if (M == 1) {
        if (R == 2) qgemv_go<T, 2, 1>(y, ldy, W, x, ldx, M, N, K, bias, res, s);
        else qgemv_go<T, 1, 1>(y, ldy, W, x, ldx, M, N, K, bias, res, s);
    } else if (M == 2) qgemv_go<T, 1, 2>(y, ldy, W, x, ldx, M, N, K, bias, res, s);
    else if (M <= 4) qgemv_go<T, 1, 4>(y, ldy, W, x, ldx, M, N, K, bias, res, s);
    else qgemv_go<T, 1, 8>(y, ldy, W, x, ldx, M, N, K, bias, res, s);
}

extern "C" int kn_cuda_quant_supported(int wt) {
    switch (wt) {
#define QCASE(T) case T:
    KN_QUANT_GPU_TYPES(QCASE)
#undef QCASE
        return 1;
    default: return 0;
    }
}

/* y [M, ldy] = x [M, ldx] @ W^T, W [N, K] quantized rows of type wt; bias
 * [N] or NULL; res [N] or NULL (M = 1 only). KN_ERR_UNSUPPORTED (nothing
 * launched) for another type, M outside 1..8, or unaligned x. */
extern "C" kn_status kn_cuda_gemv_quant(int wt, float *y, int64_t ldy, const void *W, const float *x, int64_t ldx,
                                        int64_t M, int64_t N, int64_t K, const float *bias, const float *res,
                                        void *stream) {
    if (!kn_cuda_quant_supported(wt) || M < 1 || M > 8 || (res && M != 1) || !kn_aligned16(x) || ldx % 4)
        return KN_ERR_UNSUPPORTED;
    const kn_dtype_info *di = kn_dtype_get((kn_dtype)wt);
    KN_CUDA_REQUIRE(K > 0 && K % di->block_size == 0 && K / di->block_size <= INT32_MAX && N >= 0 && N <= INT32_MAX,
                    "kn_cuda_gemv_quant: %s W [%lld, %lld]: K must be a positive multiple of %lld", di->name,
                    (long long)N, (long long)K, (long long)di->block_size);
    KN_CUDA_REQUIRE(((uintptr_t)W & 1) == 0, "kn_cuda_gemv_quant: W must be 2-byte aligned");
    if (N == 0) return KN_OK;
    cudaStream_t s = kn_stream(stream);
    switch (wt) {
#define QCASE(T) case T: qgemv_type<T>(y, ldy, W, x, ldx, (int)M, N, K, bias, res, s); break;
    KN_QUANT_GPU_TYPES(QCASE)
#undef QCASE
    default: return KN_ERR_UNSUPPORTED;
    }
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
