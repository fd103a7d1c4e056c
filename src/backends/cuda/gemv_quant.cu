/* gemv_quant.cu: y[m, n] = x[m, :] . W[n, :] for a GGUF-quantized weight W
 * [N, K] (raw blocks, rows of K/QK blocks back to back) and a few f32
 * activation rows x [M, K], M <= 8: decode, the LLM's x @ W^T with weights
 * kept as stored (KN_WEIGHTS_FILE). Letters: N output rows, K the reduced
 * dim (a multiple of the block's QK), M activation rows.
 *
 * Bound by reading W once (K/QK * BPB bytes a row: 0.56 bytes a weight for
 * Q4_0 against 2 for bf16), so the load path is what matters:
 *   - one block of 4 warps per R weight rows (R = 1, or 2 for tall matrices
 *     so that the activations a lane loads serve two rows); the warps split
 *     the row into steps of 512 columns (warp w: steps w, w+4, ...) and add
 *     their partial sums in shared memory at the end;
 *   - a step's blocks are copied into a per-warp shared-memory window with
 *     coalesced 16-byte loads (the window starts at the 16-byte boundary
 *     below the first block: blocks of 18..210 bytes are not 16-byte
 *     aligned; a 16-byte granule holding any byte of the row is always
 *     mapped); the next step's granules are loaded into registers while
 *     this one computes;
 *   - in 2 sub-steps of 256 columns each lane decodes one run of 8 weights
 *     (quant_blocks.cuh kq_run) from the window into registers and dots it
 *     with the f32 activations, f32 accumulation. Lane l takes columns
 *     8l .. 8l+7 of the sub-step, so the warp's two float4 activation loads
 *     read one contiguous kilobyte;
 *   - y = the warps' sums in order (+ bias[n], + res[n] for M = 1: the
 *     matmul epilogue of the GEMV, each step rounded to f32 as the unfused
 *     nodes round it).
 * History (H200, docs/PERF.md): v1 gave each lane a 32-weight piece of its
 * own block (lanes 128 bytes apart: every activation load touched 32 cache
 * lines) and one warp a whole row: 450-1400 GB/s; v2, a run a lane: 800-1900
 * GB/s, still latency-bound (a warp's steps one after another, nothing in
 * flight while it computed); v3 splits rows over 4 warps and prefetches;
 * v4 (this) converts quants without I2F and takes two rows a block: Q4_0
 * 920-1210 GB/s, Q8_0 1550-2160, Q4_K 770-950, against 4040 GB/s of copy
 * and 3790 of the bf16 GEMV (0.19-0.53x copy; the 0.8x target is not met). Every type
 * runs at about the same weights per second (2 T/s, as the bf16 GEMV), so
 * the cost is per weight, not per byte; next: more weights per instruction
 * (activations quantized to int8 and dp4a on packed quants, as llama.cpp's
 * MMVQ does, or half2 decode), not fewer bytes.
 * Activations stay f32 (no q8 quantization of x as llama.cpp's MMVQ does):
 * the error is then only the f32 summation order against a dequantized
 * reference. Non-goals: M > 8 (the GEMM path dequantizes to bf16), strided
 * W rows, K not a multiple of QK.
 */
#include "backends/cuda/common.cuh"
#include "backends/cuda/quant_blocks.cuh"   // defines: kq_run, kn_qt
#include "backends/cuda/gemv_pre.cuh"       // defines: gx_norm, gx_silu, gx_norm_scale (matmul prologues)
#include "backends/cuda/tune.cuh"           // defines: kn_cuda_tune

#define QG_WARPS 4
#define QG_STEP 512     /* columns a warp step: 2 sub-steps of 256 */
/* 16-byte granules of one step's window: the blocks + 16 of alignment slack */
#define QG_WIN16(T) ((QG_STEP / kn_qt<T>::QK * kn_qt<T>::BPB + 31) / 16)
#define QG_PRE(T) ((QG_WIN16(T) + 31) / 32)   /* granules a lane holds in flight */

/* x: [M, ldx] f32, 16-byte aligned rows; y: [M, ldy]; W: N rows of row_bytes;
 * nblk blocks a row; MM >= M the unrolled activation rows. A block takes R
 * rows; its warps split the row's steps (warp w: steps w, w + 4, ...).
 * PK: a matmul prologue (KN_GV_PRE_*, MM = 1 only; pp its vector, eps the
 * norm's): the activation row computed as it is loaded. */
template <int T, int R, int MM, int PK>
__global__ void __launch_bounds__(QG_WARPS * 32)
qgemv_kernel(float *y, int64_t ldy, const uint8_t *__restrict__ W, int64_t row_bytes, const float *__restrict__ x,
             int64_t ldx, int M, int N, int nblk, const float *__restrict__ bias, const float *__restrict__ res,
             const float *__restrict__ pp, float eps, int early, int wr) {
    static_assert(PK == KN_GV_PRE_NONE || MM == 1, "a prologue computes one activation row");
    typedef kn_qt<T> Q;
    constexpr int BPG = QG_STEP / Q::QK;                 /* blocks a step */
    constexpr int RPB = Q::QK / 8;                       /* runs of 8 a block */
    constexpr int W16 = QG_WIN16(T), PRE = QG_PRE(T);
    __shared__ uint4 win[QG_WARPS][R][W16];
    __shared__ float part[QG_WARPS][R][MM], part_ss[QG_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* wr (short rows): warp w owns rows of its own and walks all their steps,
     * so that a block takes QG_WARPS * R rows; else the warps split R rows */
    const int row0 = wr ? (blockIdx.x * QG_WARPS + warp) * R : blockIdx.x * R;
    const int bstep = wr ? BPG : QG_WARPS * BPG;          /* blocks between a warp's steps */
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.f;
    /* the window of step b0 (first block) of each row: its granules into registers */
    uint4 pre[R][PRE];
    int shoff[R], n16[R];
    auto fetch = [&](int b0) {
        const int nb = nblk - b0 < BPG ? nblk - b0 : BPG;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = row0 + r < N ? row0 + r : N - 1;   /* a missing second row reads the last (unused) */
            const uint8_t *s = W + (int64_t)row * row_bytes + (int64_t)b0 * Q::BPB;
            uintptr_t a0 = (uintptr_t)s & ~(uintptr_t)15, a1 = ((uintptr_t)s + (uintptr_t)(nb * Q::BPB) + 15) & ~(uintptr_t)15;
            n16[r] = (int)((a1 - a0) >> 4);
            shoff[r] = (int)((uintptr_t)s - a0);
#pragma unroll
            for (int k = 0; k < PRE; k++)
                if (lane + 32 * k < n16[r]) pre[r][k] = __ldcs((const uint4 *)a0 + lane + 32 * k);
        }
    };
    /* early: the first step's weights are loaded before the wait for the
     * kernel before (PDL, common.cuh), so that their DRAM latency passes
     * while it still runs: no kernel writes quantized data (the GPU takes
     * quantized tensors only as a matmul's weight, written by uploads, which
     * are stream-ordered copies), so W is the same before the wait as after. */
    int b0 = wr ? 0 : warp * BPG;
    if (early && b0 < nblk) fetch(b0);
    kn_pdl_enter();
    if (!early && b0 < nblk) fetch(b0);
    /* prologue loaders; the norm's adds up the row's squares as it goes (each
     * element once a block: the warps split the steps, the lanes the runs) */
    gx_norm nrm{(const float4 *)x, (const float4 *)pp, 0.f};
    gx_silu slu{(const float4 *)x, (const float4 *)pp};
    for (; b0 < nblk; b0 += bstep) {
        const int nb = nblk - b0 < BPG ? nblk - b0 : BPG;
        int off[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int k = 0; k < PRE; k++)
                if (lane + 32 * k < n16[r]) win[warp][r][lane + 32 * k] = pre[r][k];
            off[r] = shoff[r];
        }
        __syncwarp();
        if (b0 + bstep < nblk) fetch(b0 + bstep);        /* in flight while this step computes */
        /* 2 sub-steps of 256 columns: lane -> run g = 32 sub + lane (block g / RPB) */
        const int nruns = nb * RPB;
        const float *xs = x + (int64_t)b0 * Q::QK;
#pragma unroll
        for (int sub = 0; sub < QG_STEP / 256; sub++) {
            const int g = 32 * sub + lane;
            if (g >= nruns) break;
            float w[R][8];
#pragma unroll
            for (int r = 0; r < R; r++)
                kq_run<T>((const uint8_t *)win[warp][r] + off[r] + (g / RPB) * Q::BPB, g % RPB, w[r]);
#pragma unroll
            for (int m = 0; m < MM; m++) {
                if (m >= M) break;
                const float4 *xr = (const float4 *)(xs + (int64_t)m * ldx + 8 * g);
                const int j = (b0 * Q::QK + 8 * g) / 4;   /* the float4 of xr in the row (a prologue: m = 0) */
                float4 xa, xb;
                if (PK == KN_GV_PRE_NORM) { xa = nrm(j); xb = nrm(j + 1); }
                else if (PK == KN_GV_PRE_SILU) { xa = slu(j); xb = slu(j + 1); }
                else { xa = __ldg(xr); xb = __ldg(xr + 1); }
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][m] += w[r][0] * xa.x + w[r][1] * xa.y + w[r][2] * xa.z + w[r][3] * xa.w +
                                 w[r][4] * xb.x + w[r][5] * xb.y + w[r][6] * xb.z + w[r][7] * xb.w;
            }
        }
        __syncwarp();                                    /* the window is rewritten next step */
    }
    /* y[m, row] from the row's dot v and its squares ss (the norm's scale,
     * gemv_pre.cuh), + bias[row], + res[row] */
    auto store = [&](int row, int m, float v, float ss) {
        if (PK == KN_GV_PRE_NORM) v *= gx_norm_scale(ss, nblk * Q::QK, eps);
        if (bias) v = v + bias[row];
        if (res) v = res[row] + v;
        y[(int64_t)m * ldy + row] = v;
    };
    if (wr) {                                            /* the warp has its rows' whole sums */
        float t = PK == KN_GV_PRE_NORM ? kn_warp_sum(nrm.ss) : 0.f;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float v = kn_warp_sum(acc[r][m]);
                if (lane == 0 && m < M && row0 + r < N) store(row0 + r, m, v, t);
            }
        return;
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) {
            float v = kn_warp_sum(acc[r][m]);
            if (lane == 0) part[warp][r][m] = v;
        }
    if (PK == KN_GV_PRE_NORM) {
        float t = kn_warp_sum(nrm.ss);
        if (lane == 0) part_ss[warp] = t;
    }
    __syncthreads();
    /* thread (r, m) of warp 0 adds the warps' partial sums in order */
    if (threadIdx.x < R * MM) {
        const int r = threadIdx.x / MM, m = threadIdx.x % MM, row = row0 + r;
        if (m < M && row < N) {
            float v = 0.f, t = 0.f;
#pragma unroll
            for (int k = 0; k < QG_WARPS; k++) v += part[k][r][m];
            if (PK == KN_GV_PRE_NORM)
#pragma unroll
                for (int k = 0; k < QG_WARPS; k++) t += part_ss[k];
            store(row, m, v, t);
        }
    }
}

template <int T, int R, int MM, int PK = KN_GV_PRE_NONE>
static void qgemv_go(float *y, int64_t ldy, const void *W, const float *x, int64_t ldx, int M, int64_t N, int64_t K,
                     const float *bias, const float *res, cudaStream_t s, const float *pp = NULL, float eps = 0.f) {
    typedef kn_qt<T> Q;
    int64_t nblk = K / Q::QK;
    /* gemv_early (default 1): the first weights loaded before the PDL wait,
     * so their DRAM latency passes while the kernel before still runs
     * (SmolLM2 Q4_1 decode on an H100: 1315 -> 1374 tok/s alone) */
    static const int early = kn_cuda_tune("gemv_early", 1);
    /* qgemv_wr=S (default 2): rows of at most S steps take a warp each.
     * Split over the 4 warps, such a row leaves 2 or 3 of them idle, and a
     * tall matrix (the LM head: 49152 rows of K = 576) runs as many small
     * blocks as it has row pairs, a dozen waves of them (1315 -> 1372 tok/s
     * alone; 0 turns it off) */
    static const int wr_steps = kn_cuda_tune("qgemv_wr", 2);
    const int wr = nblk <= (int64_t)wr_steps * (QG_STEP / Q::QK);
    const int64_t rows_per_block = wr ? (int64_t)QG_WARPS * R : R;
    kn_launch_pdl(qgemv_kernel<T, R, MM, PK>, dim3((unsigned)((N + rows_per_block - 1) / rows_per_block)), dim3(QG_WARPS * 32), 0, s,
                  y, ldy, (const uint8_t *)W, nblk * Q::BPB, x, ldx, M, (int)N, (int)nblk, bias, res, pp, eps, early != 0, wr);
}

template <int T>
static void qgemv_type(float *y, int64_t ldy, const void *W, const float *x, int64_t ldx, int M, int64_t N, int64_t K,
                       const float *bias, const float *res, const kn_cuda_gemv_pre *pre, cudaStream_t s) {
    if (pre && pre->kind == KN_GV_PRE_NORM) return qgemv_go<T, 2, 1, KN_GV_PRE_NORM>(y, ldy, W, x, ldx, M, N, K, bias, res, s, pre->p, pre->eps);
    if (pre && pre->kind == KN_GV_PRE_SILU) return qgemv_go<T, 2, 1, KN_GV_PRE_SILU>(y, ldy, W, x, ldx, M, N, K, bias, res, s, pre->p);
    /* two rows a block: the activations a lane loads serve both; faster on
     * every shape measured (docs/PERF.md); KN_CUDA_TUNE=qgemv_r=1 for one */
    static const int rt = kn_cuda_tune("qgemv_r", 2);
    int R = rt == 1 ? 1 : 2;
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
 * [N] or NULL; res [N] or NULL (M = 1 only); pre a prologue or NULL (M = 1
 * only). KN_ERR_UNSUPPORTED (nothing launched) for another type, M outside
 * 1..8, or unaligned x or prologue vector. */
extern "C" kn_status kn_cuda_gemv_quant(int wt, float *y, int64_t ldy, const void *W, const float *x, int64_t ldx,
                                        int64_t M, int64_t N, int64_t K, const float *bias, const float *res,
                                        const kn_cuda_gemv_pre *pre, void *stream) {
    bool has_pre = pre && pre->kind != KN_GV_PRE_NONE;
    if (!kn_cuda_quant_supported(wt) || M < 1 || M > 8 || (res && M != 1) || !kn_aligned16(x) || ldx % 4)
        return KN_ERR_UNSUPPORTED;
    if (has_pre && (M != 1 || (pre->p && !kn_aligned16(pre->p)) || (pre->kind == KN_GV_PRE_SILU && !pre->p)))
        return KN_ERR_UNSUPPORTED;
    const kn_dtype_info *di = kn_dtype_get((kn_dtype)wt);
    KN_CUDA_REQUIRE(K > 0 && K % di->block_size == 0 && K / di->block_size <= INT32_MAX && N >= 0 && N <= INT32_MAX,
                    "kn_cuda_gemv_quant: %s W [%lld, %lld]: K must be a positive multiple of %lld", di->name,
                    (long long)N, (long long)K, (long long)di->block_size);
    KN_CUDA_REQUIRE(((uintptr_t)W & 1) == 0, "kn_cuda_gemv_quant: W must be 2-byte aligned");
    if (N == 0) return KN_OK;
    cudaStream_t s = kn_stream(stream);
    switch (wt) {
#define QCASE(T) case T: qgemv_type<T>(y, ldy, W, x, ldx, (int)M, N, K, bias, res, has_pre ? pre : NULL, s); break;
    KN_QUANT_GPU_TYPES(QCASE)
#undef QCASE
    default: return KN_ERR_UNSUPPORTED;
    }
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
