/* kn_cuda.h: kiln's hand-written CUDA kernels, as a plain C API.
 *
 * Every pointer argument named d_* or documented as "device" lives in device
 * memory; the caller owns it. `stream` is a cudaStream_t passed as void* so
 * that C code can include this header without the CUDA headers (NULL = the
 * legacy default stream). Calls are asynchronous: a KN_OK return means the
 * launch was accepted; errors of the kernel itself show at the next sync.
 * Each function checks its arguments and returns KN_ERR_INVALID with a
 * message (kn_last_error()) on bad shapes, and KN_ERR_BACKEND when a CUDA
 * call fails. Nothing here exits or aborts.
 *
 * Layout letters: M,N,K are GEMM dims; rows x cols for row-wise ops; all
 * matrices are row-major and dense unless a leading dimension (ld*, in
 * elements) is given. bf16 is stored as uint16_t (the top half of an f32).
 *
 * Non-goals: no graph, no tensors, no dtype dispatch; the CUDA backend
 * (src/backends/cuda/backend.c, later) maps ops onto these calls.
 *
 * Example:
 *     float *a, *b, *c;  // device, M*K, K*N, M*N
 *     if (kn_cuda_sgemm(false, false, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N, NULL))
 *         fprintf(stderr, "%s\n", kn_last_error());
 */
#ifndef KN_CUDA_H
#define KN_CUDA_H
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM ------------------------------------------------------------------ */

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, fp32 (plain FFMA, no tf32).
 * op(A) is M x K: A is M x K (lda >= K) or, with trans_a, K x M (lda >= M).
 * op(B) is K x N: B is K x N (ldb >= N) or, with trans_b, N x K (ldb >= K).
 * With beta == 0, C is not read (it may hold NaN). */
kn_status kn_cuda_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                        void *stream);

/* Batched form: the same GEMM over a batch of nb dims (row-major over ne);
 * entry (i_0..i_{nb-1}) uses A + sum i_d*sa[d], B + sum i_d*sb[d] and
 * C + sum i_d*sc[d] (element strides; 0 shares an operand across that dim).
 * One launch for the whole batch, so many small GEMMs (attention heads,
 * [B,T,C] @ [C,O] per sequence) fill the GPU. batch == NULL: one GEMM. */
#define KN_CUDA_MAX_BATCH_DIMS 6
typedef struct kn_cuda_gemm_batch {
    int nb;
    int64_t ne[KN_CUDA_MAX_BATCH_DIMS];
    int64_t sa[KN_CUDA_MAX_BATCH_DIMS], sb[KN_CUDA_MAX_BATCH_DIMS], sc[KN_CUDA_MAX_BATCH_DIMS];
} kn_cuda_gemm_batch;
kn_status kn_cuda_sgemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                float alpha, const float *A, int64_t lda,
                                const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                                const kn_cuda_gemm_batch *batch, void *stream);

typedef enum kn_cuda_epilogue {
    KN_CUDA_EPI_NONE = 0,   /* C = A @ W^T (+ bias)                               */
    KN_CUDA_EPI_GELU = 1,   /* C = gelu_tanh(A @ W^T (+ bias))                    */
} kn_cuda_epilogue;

/* bf16 GEMM, fp32 accumulation, for linear layers:
 * C[M,N] (bf16) = epi(A[M,K] @ W[N,K]^T + bias[N]); bias is f32 or NULL.
 * On sm_90a it runs a wgmma + TMA kernel (needs K % 8 == 0 and 16-byte
 * aligned A, W); elsewhere a plain tiled fallback. */
kn_status kn_cuda_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *A,
                            const uint16_t *W, const float *bias, kn_cuda_epilogue epi,
                            uint16_t *C, void *stream);
/* 1 when kn_cuda_gemm_bf16 takes the wgmma path on the current device. */
int kn_cuda_gemm_bf16_uses_wgmma(void);

/* ---- GEMV (batch-1 decode) ----------------------------------------------------
 * y[N] = W[N,K] @ x[K] (+ bias[N] if not NULL), f32 accumulation.
 * Needs K % 4 == 0 (f32) or K % 8 == 0 (bf16) and 16-byte aligned W, x. */
kn_status kn_cuda_gemv_f32(float *y, const float *W, const float *x, const float *bias,
                           int64_t N, int64_t K, void *stream);
kn_status kn_cuda_gemv_bf16(float *y, const uint16_t *W, const float *x, const float *bias,
                            int64_t N, int64_t K, void *stream);

/* ---- softmax over the last axis -------------------------------------------------
 * y[r, :] = softmax(x[r, :]); y may equal x. */
kn_status kn_cuda_softmax_f32(float *y, const float *x, int64_t rows, int64_t cols, void *stream);
kn_status kn_cuda_softmax_bf16(uint16_t *y, const uint16_t *x, int64_t rows, int64_t cols,
                               void *stream);

/* ---- norms (row-wise over C) -------------------------------------------------
 * layer norm: y = (x - mean) * rstd * w + b; mean, rstd: [rows] (written, may
 * be NULL in forward when not needed for backward).
 * backward: dx = (written), dw += , db += (accumulated; zero them first).  */
kn_status kn_cuda_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                const float *w, const float *b, int64_t rows, int64_t C,
                                float eps, void *stream);
kn_status kn_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dy,
                                const float *x, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t C, void *stream);
/* RMS norm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). */
kn_status kn_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w,
                              int64_t rows, int64_t C, float eps, void *stream);
kn_status kn_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x,
                              const float *w, const float *rstd, int64_t rows, int64_t C,
                              void *stream);
/* The NORM_BWD node's kernel: dx and (parts = 1: dw; 2: dw then db, packed in
 * dwb) of a layer norm (rms false) or RMS norm, the statistics recomputed
 * from x; w NULL means no weight. dw/db are deterministic: per-block partial
 * sums in `part` (kn_cuda_norm_bwd_part_floats floats) are added in block
 * order. Needs kn_cuda_norm_bwd_fused_ok (C % 4 == 0, C <= 8192, 16-byte
 * aligned pointers). */
bool kn_cuda_norm_bwd_fused_ok(int64_t C, const void *dx, const void *dy, const void *x, const void *w,
                               const void *dwb);
kn_status kn_cuda_norm_bwd_part_floats(int64_t rows, int64_t C, bool rms, int parts, int64_t *n);
kn_status kn_cuda_norm_bwd_fused(float *dx, float *dwb, int parts, const float *dy, const float *x,
                                 const float *w, float eps, bool rms, int64_t rows, int64_t C,
                                 float *part, void *stream);
/* bf16 in/out variants (f32 math, w/b f32). */
kn_status kn_cuda_rmsnorm_fwd_bf16(uint16_t *y, float *rstd, const uint16_t *x, const float *w,
                                   int64_t rows, int64_t C, float eps, void *stream);

/* ---- caching device allocator ---------------------------------------------------
 * Size classes of 4 steps per power of two (>= 512 bytes); freed blocks go to
 * the free list of their class and are reused without cudaMalloc. On
 * cudaMalloc failure the cache is trimmed once and the call retried; then
 * KN_ERR_NOMEM with the sizes. Thread-safe (one mutex). */
typedef struct kn_cuda_pool kn_cuda_pool;
typedef struct kn_cuda_pool_stats {
    size_t  current_bytes;   /* handed out now (class-rounded)                  */
    size_t  peak_bytes;      /* max of current_bytes                            */
    size_t  cached_bytes;    /* held in free lists                              */
    size_t  requested_bytes; /* handed out now, as asked                        */
    int64_t n_device_allocs; /* cudaMalloc calls so far                         */
    int64_t n_allocs;        /* kn_cuda_pool_alloc calls so far                 */
} kn_cuda_pool_stats;

/* limit_bytes caps current+cached (0 = no cap beyond the device). */
kn_status kn_cuda_pool_new(kn_cuda_pool **out, size_t limit_bytes);
void      kn_cuda_pool_free(kn_cuda_pool *p);   /* frees everything; NULL ok  */
kn_status kn_cuda_pool_alloc(kn_cuda_pool *p, size_t nbytes, void **d_ptr);
kn_status kn_cuda_pool_release(kn_cuda_pool *p, void *d_ptr);  /* NULL ok      */
kn_status kn_cuda_pool_trim(kn_cuda_pool *p);   /* cudaFree all cached blocks   */
void      kn_cuda_pool_get_stats(kn_cuda_pool *p, kn_cuda_pool_stats *s);

/* ---- tensor-core GEMM for bf16/f16 operands (gemm_tc.cu, sm_80+) -----------------
 * C[z] = alpha * op(A[z]) @ op(B[z]) over the batch (NULL: one GEMM); layouts and
 * leading dimensions as kn_cuda_sgemm (elements), A and B both of dtype ab
 * (KN_BF16 or KN_F16), C of c_dtype (KN_F32, KN_F16 or KN_BF16; C is not
 * read). mma.sync m16n8k16 with fp32 accumulation; any M, N, K >= 1.
 * KN_ERR_UNSUPPORTED on GPUs older than sm_80. */
kn_status kn_cuda_gemm_tc(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                          void *C, kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch,
                          void *stream);
/* 1 when kn_cuda_gemm_tc can run on the current device (compute capability >= 8.0). */
int kn_cuda_gemm_tc_available(void);

/* ---- mixed precision and f16 GEMV for LLM inference (gemm_tc.cu, gemv.cu) ----------
 * kn_cuda_gemm_tc_f32a: as kn_cuda_gemm_tc with A f32, stored M x K (lda >= K,
 * 16-byte loads when A is aligned and lda % 4 == 0), rounded to b_dtype (bf16
 * or f16, RNE) as its tiles are loaded; B of b_dtype, fp32 accumulation. For
 * f32 activations times half-precision weights (x @ W^T: trans_b, C f32).
 * kn_cuda_gemv_f16: kn_cuda_gemv_bf16 with an f16 W (K % 8 == 0). */
kn_status kn_cuda_gemm_tc_f32a(kn_dtype b_dtype, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                               const float *A, int64_t lda, const void *B, int64_t ldb, void *C,
                               kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream);
kn_status kn_cuda_gemv_f16(float *y, const uint16_t *W, const float *x, const float *bias,
                           int64_t N, int64_t K, void *stream);

/* ---- GGUF-quantized weights (quant_blocks.cuh, gemv_quant.cu, dequant.cu) ----------
 * Weights of a quantized type stay in their raw GGUF blocks in device memory
 * (W [N, K]: N rows of K / block_size blocks back to back, 2-byte aligned).
 * kn_cuda_quant_supported: 1 for the types the GPU decodes (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), else 0.
 * kn_cuda_gemv_quant: y [M, ldy] = x [M, ldx] @ W^T (+ bias [N]) (+ res [N],
 * M = 1 only), M in 1..8, x f32 16-byte aligned with ldx % 4 == 0, f32
 * accumulation; KN_ERR_UNSUPPORTED (nothing launched) when those do not
 * hold, KN_ERR_INVALID when K is not whole blocks.
 * kn_cuda_dequant: n elements (whole blocks) of W expanded to bf16 or f32
 * (out_dt KN_BF16 / KN_F32) at out (16-byte aligned). */
int kn_cuda_quant_supported(int wt);
/* A matmul prologue in the GEMV kernels (kn_epilogue.pre, one activation
 * row): the row they dot with W is computed from x as it is loaded.
 *   KN_GV_PRE_NORM: x[k] * s * p[k], s = 1 / sqrt(sum(x^2) / K + eps) over
 *                   the row (p NULL: no weight); the RMS norm
 *   KN_GV_PRE_SILU: silu(x[k]) * p[k]; a gated unit (SwiGLU)
 * p: f32 [K], 16-byte aligned. NULL or KN_GV_PRE_NONE: x as stored. */
enum { KN_GV_PRE_NONE, KN_GV_PRE_NORM, KN_GV_PRE_SILU };
typedef struct { int kind; const float *p; float eps; } kn_cuda_gemv_pre;
/* pre: M = 1 only (else KN_ERR_UNSUPPORTED, nothing launched) */
kn_status kn_cuda_gemv_quant(int wt, float *y, int64_t ldy, const void *W, const float *x, int64_t ldx,
                             int64_t M, int64_t N, int64_t K, const float *bias, const float *res,
                             const kn_cuda_gemv_pre *pre, void *stream);
kn_status kn_cuda_dequant(int wt, void *out, int out_dt, const void *W, int64_t n, void *stream);

/* ---- general wgmma GEMM for bf16/f16 operands (gemm_bf16_sm90.cu, sm_90a) --------
 * Same contract as kn_cuda_gemm_tc with alpha = 1: C[z] = op(A[z]) @ op(B[z]),
 * trans_a: A stored K x M, trans_b: B stored N x K; C of dtype ab (f32 C:
 * kn_cuda_gemm_tc).
 * kn_cuda_gemm_wgmma_fits says whether it takes the product: an sm_90a
 * device and build, A and B 16-byte aligned with lda, ldb and their batch
 * strides multiples of 8, batch dims that collapse to one stride per
 * operand (or 0: shared), at most 65535 batch entries and enough block
 * tiles to fill the GPU. Otherwise kn_cuda_gemm_wgmma returns
 * KN_ERR_UNSUPPORTED; use kn_cuda_gemm_tc. */
int kn_cuda_gemm_wgmma_fits(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const void *A, int64_t lda, const void *B, int64_t ldb, const void *C,
                            kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch);
kn_status kn_cuda_gemm_wgmma(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                             kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream);

/* Split-K on the wgmma kernel for a product of few output tiles over a long
 * K (a weight gradient dY^T X): kn_cuda_gemm_wgmma_split returns the number
 * of K slices S it would cut (and their length, *kslice; the last may be
 * shorter), 0 where it does not take the product (another device or build,
 * misaligned operands, odd N, enough tiles without it, a short K).
 * kn_cuda_gemm_wgmma_splitk then writes each slice's f32 product into
 * part [S, M, N] (the caller sums the slices in order). */
int kn_cuda_gemm_wgmma_split(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             const void *A, int64_t lda, const void *B, int64_t ldb, int64_t *kslice);
kn_status kn_cuda_gemm_wgmma_splitk(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    const void *A, int64_t lda, const void *B, int64_t ldb, float *part,
                                    void *stream);

#ifdef __cplusplus
}
#endif
#endif
