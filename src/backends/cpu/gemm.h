/* gemm.h: single-precision GEMM for the CPU backend (row-major, BLAS-like).
 *
 * Letters: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C. op(X) is X
 * transposed when transX; a transposed operand is stored as its transpose
 * (op(A) = A^T means A is stored [K,M]). lda/ldb/ldc are row strides in
 * elements (>= the stored row length). beta == 0 means C is only written
 * (it may hold NaN); alpha == 0 or K == 0 means A and B are not read.
 * Bad arguments (negative sizes, a stride shorter than its stored row, NULL
 * data that would be touched) leave C untouched and record KN_ERR_INVALID for
 * kn_last_error().
 *
 *   // y[4096] = W[4096,4096] @ x[4096]  (decode matrix-vector)
 *   kn_sgemm(false, false, 4096, 1, 4096, 1.0f, W, 4096, x, 1, 0.0f, y, 1);
 *   // logits[T,V] = h[T,C] @ wte[V,C]^T
 *   kn_sgemm(false, true, T, V, C, 1.0f, h, C, wte, C, 0.0f, logits, V);
 *
 * Implementation (gemm.c): packed, cache-blocked GotoBLAS/BLIS loops with a
 * register-tiled micro-kernel per ISA (scalar 4x8, AVX2 6x16, AVX-512 14x32),
 * a streaming matrix-vector path for M == 1 or N == 1, threads from the CPU
 * pool (threadpool.h) splitting M and N. The SIMD path is chosen at run time
 * from kn_cpu() (env KN_CPU caps it).
 * Non-goals: complex types, integer GEMM, column-major entry points.
 */
#ifndef KN_GEMM_H
#define KN_GEMM_H
#include <stdbool.h>
#include <stdint.h>

/* C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C ; op = transpose if transX.
   lda/ldb/ldc are row strides in elements. beta==0 means C is not read (may hold NaN). */
void kn_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb,
              float beta, float *C, int64_t ldc);
/* Batched: batch b uses A + b*strideA etc. (stride 0 = broadcast). strideC == 0
   makes every batch update the same C, in batch order. */
void kn_sgemm_batched(int64_t batch, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
              float alpha, const float *A, int64_t lda, int64_t strideA,
              const float *B, int64_t ldb, int64_t strideB, float beta,
              float *C, int64_t ldc, int64_t strideC);
/* kn_sgemm with a hook on finished pieces of C: post->fn(ctx, C, ldc, m0, m1,
   n0, n1) runs once on each rectangle [m0,m1) x [n0,n1) of C (rows and columns
   relative to C) as soon as its sum over all of K is stored, on the thread
   that computed it, while it is still in cache (the CPU backend's matmul
   epilogues: cpu_epilogue.c). Every element of C is covered exactly once.
   post NULL: kn_sgemm. */
typedef struct kn_sgemm_post {
    void (*fn)(void *ctx, float *C, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
    void *ctx;
} kn_sgemm_post;
void kn_sgemm_ep(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb,
                 float beta, float *C, int64_t ldc, const kn_sgemm_post *post);
/* Rows of C one micro-kernel tile covers on this CPU (14 with AVX-512, 6 with
   AVX2, 4 without): products of many short blocks (attention) run fastest
   with M a multiple of it. */
int kn_sgemm_tile_rows(void);
/* Thread count used by kn_sgemm: the pool size unless capped by this (0 = no cap). */
void kn_sgemm_set_max_threads(int n);

/* ---- bf16 products (gemm_bf16.c) ------------------------------------------------
 * C[M,N] (f32, row stride ldc, overwritten) = op(A)[M,K] @ op(B)[K,N] for bf16
 * A and B (raw 16-bit words), op and strides as kn_sgemm. ukr: the
 * micro-kernel, kn_bgemm_kernel() for this CPU's (AMX, else AVX512_BF16;
 * NULL when the CPU or the OS has neither: the caller widens to f32
 * instead), or kn_bgemm_ukr_generic
 * (tests). Micro-kernels: a 32 x 32 block of C over kp k-pairs (a multiple of
 * 16), Ap row-major [32][2 kp] bf16, Bp [kp][32] pair words. Threads from the
 * CPU pool. */
typedef void (*kn_bgemm_ukr_fn)(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc);
kn_bgemm_ukr_fn kn_bgemm_kernel(void);
/* the AVX512_BF16 micro-kernel where the CPU (and KN_CPU) allows it, else
 * NULL; kn_bgemm_kernel's choice without AMX (tests run it beside AMX) */
kn_bgemm_ukr_fn kn_bgemm_kernel_dpbf16(void);
void kn_bgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
              const uint16_t *B, int64_t ldb, float *C, int64_t ldc, kn_bgemm_ukr_fn ukr);
void kn_bgemm_ukr_generic(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc);
void kn_bgemm_ukr_32x32_amx(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc);
void kn_bgemm_ukr_32x32_dpbf16(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc);

/* ---- internal: for tests and the ISA files ------------------------------------ */

/* Force the SIMD path (KN_ISA_SCALAR/AVX2/AVX512 from core/cpu.h); -1 = back to
 * kn_cpu()->isa. A level above what the CPU (or this build) supports is lowered
 * to the best supported one. Returns the level now in use. Not thread-safe
 * against concurrent kn_sgemm calls: for tests. */
int kn_sgemm_force_isa(int isa);

/* Micro-kernel: C[MR,NR] = alpha * Ap @ Bp + beta * C for one full tile.
 * Ap: packed MR x kc (column k holds MR consecutive floats), Bp: packed kc x NR
 * (row k holds NR consecutive floats), both 64-byte aligned. beta == 0: C not read. */
typedef void (*kn_sgemm_ukr_fn)(int64_t kc, const float *Ap, const float *Bp,
                                float *C, int64_t ldc, float alpha, float beta);
/* The micro-kernel with MR rows of A read in place: element (r, k) of the
 * MR x kc panel at A[r * lda + k] (A not transposed). Bp packed as above. */
typedef void (*kn_sgemm_ukr_direct_fn)(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                       float *C, int64_t ldc, float alpha, float beta);
/* y[i] = dot(X[i*ld .. i*ld+K), x) for i in [0, rows).            (matrix-vector, "dot" form) */
typedef void (*kn_sgemv_dot_fn)(int64_t rows, int64_t K, const float *X, int64_t ld,
                                const float *x, float *y);
/* y[j] = sum_k x[k] * X[k*ld + j] for j in [0, cols).              (matrix-vector, "axpy" form) */
typedef void (*kn_sgemv_axpy_fn)(int64_t K, int64_t cols, const float *X, int64_t ld,
                                 const float *x, float *y);

/* Transposing pack: dst[k*dstride + i] = src[i*ld + k] for i < rows, k < kc. */
typedef void (*kn_sgemm_pack_t_fn)(const float *src, int64_t ld, int rows, int64_t kc,
                                   float *dst, int64_t dstride);

void kn_sgemm_pack_t_generic(const float *src, int64_t ld, int rows, int64_t kc,
                             float *dst, int64_t dstride);
void kn_sgemm_ukr_4x8_generic(int64_t kc, const float *Ap, const float *Bp,
                              float *C, int64_t ldc, float alpha, float beta);
void kn_sgemm_ukr_4x8_direct_generic(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                     float *C, int64_t ldc, float alpha, float beta);
void kn_sgemv_dot_generic(int64_t rows, int64_t K, const float *X, int64_t ld,
                          const float *x, float *y);
void kn_sgemv_axpy_generic(int64_t K, int64_t cols, const float *X, int64_t ld,
                           const float *x, float *y);
#if !defined(KN_NO_X86) && (defined(__x86_64__) || defined(__i386__))
void kn_sgemm_ukr_6x16_avx2(int64_t kc, const float *Ap, const float *Bp,
                            float *C, int64_t ldc, float alpha, float beta);
void kn_sgemm_ukr_6x16_direct_avx2(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                   float *C, int64_t ldc, float alpha, float beta);
void kn_sgemv_dot_avx2(int64_t rows, int64_t K, const float *X, int64_t ld,
                       const float *x, float *y);
void kn_sgemv_axpy_avx2(int64_t K, int64_t cols, const float *X, int64_t ld,
                        const float *x, float *y);
void kn_sgemm_pack_t_avx2(const float *src, int64_t ld, int rows, int64_t kc,
                          float *dst, int64_t dstride);   /* also used by the AVX-512 path */
#ifndef KN_NO_AVX512
void kn_sgemm_ukr_14x32_avx512(int64_t kc, const float *Ap, const float *Bp,
                               float *C, int64_t ldc, float alpha, float beta);
void kn_sgemm_ukr_14x32_direct_avx512(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                      float *C, int64_t ldc, float alpha, float beta);
void kn_sgemv_dot_avx512(int64_t rows, int64_t K, const float *X, int64_t ld,
                         const float *x, float *y);
void kn_sgemv_axpy_avx512(int64_t K, int64_t cols, const float *X, int64_t ld,
                          const float *x, float *y);
#endif
#endif
/* cpu_attention.c: the matrix-vector kernels above for the current ISA (as
 * attention uses them; kn_cpu_attention_force_isa can lower it) */
void kn_cpu_pick_gemv(kn_sgemv_dot_fn *dot, kn_sgemv_axpy_fn *axpy);

#endif
