/* sgemm.cu: fp32 GEMM with plain FFMA (no tensor cores, no tf32).
 *
 * Fast path (v6 of dev/cuda/sgemm/): 128x128 block tile, BK = 8, 256 threads.
 * Warps are 4 (M) x 2 (N), each owning a 32 x 64 sub-tile; lanes are 4 x 8 and
 * each lane an 8x8 micro-tile split into 2x2 sub-tiles of 4x4 (rows lm*4 and
 * lm*4+16, cols ln*4 and ln*4+32), so every 16-byte shared-memory fragment
 * read of a warp is one wavefront (4 per k). A is kept transposed in shared memory (As[k][m]),
 * padded by 4 floats so that the transposing stores do not conflict. The next
 * K-slab is loaded into registers while the current one is multiplied, and
 * shared memory is double-buffered: one __syncthreads per slab.
 * Transposes are handled in the tile loaders (template flags), so NN, NT, TN,
 * TT all run the same inner loop.
 * Fast-path needs: M, N, K, lda, ldb, ldc multiples of 4 and 16-byte aligned
 * pointers; otherwise a plain 16x16 shared-memory kernel runs (correct, slow).
 */
#include "backends/cuda/common.cuh"
#include <string.h>

#define SG_BM 128
#define SG_BN 128
#define SG_BK 8
#define SG_PAD 4

/* Batch of a batched launch, by value: blockIdx.z + z0 is the flat batch
 * index over ne[0..nb) (row-major); each operand moves by its own strides
 * (0 for an operand shared by the whole batch). nb == 0: a single GEMM. */
struct sg_batch {
    int nb;
    int64_t z0;
    int64_t ne[KN_CUDA_MAX_BATCH_DIMS], sa[KN_CUDA_MAX_BATCH_DIMS], sb[KN_CUDA_MAX_BATCH_DIMS],
        sc[KN_CUDA_MAX_BATCH_DIMS];
};
/* Element offsets of A, B, C for this block's batch entry. Integer divisions
 * once per block, not per element. */
__device__ __forceinline__ void sg_batch_offsets(const sg_batch &bt, int64_t &oa, int64_t &ob, int64_t &oc) {
    int64_t z = bt.z0 + blockIdx.z;
    oa = ob = oc = 0;
    for (int d = bt.nb - 1; d >= 0; d--) {
        int64_t q = z % bt.ne[d];
        z /= bt.ne[d];
        oa += q * bt.sa[d]; ob += q * bt.sb[d]; oc += q * bt.sc[d];
    }
}
#define SG_BATCH_MOVE()                          \
    do {                                         \
        int64_t oa_, ob_, oc_;                   \
        sg_batch_offsets(bt, oa_, ob_, oc_);     \
        A += oa_; B += ob_; C += oc_;            \
    } while (0)

/* Load one BK-slab of op(A) (BM x BK) into registers: one float4 per thread.
 * Not transposed: A[M,K], thread reads row m0 + tid/2, cols k0 + (tid%2)*4.
 * Transposed: A^T stored [K,M], thread reads row k0 + tid/32, cols m0 + (tid%32)*4. */
template <bool TA>
__device__ __forceinline__ float4 sg_load_a(const float *A, int64_t lda, int M, int K, int m0,
                                            int k0, int tid) {
    float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!TA) {
        int m = m0 + (tid >> 1), k = k0 + ((tid & 1) << 2);
        if (m < M && k < K) return __ldg((const float4 *)(A + (int64_t)m * lda + k));
    } else {
        int k = k0 + (tid >> 5), m = m0 + ((tid & 31) << 2);
        if (m < M && k < K) return __ldg((const float4 *)(A + (int64_t)k * lda + m));
    }
    return z;
}
template <bool TA>
__device__ __forceinline__ void sg_store_a(float (*As)[SG_BM + SG_PAD], float4 v, int tid) {
    if (!TA) {
        int m = tid >> 1, k = (tid & 1) << 2;
        As[k + 0][m] = v.x; As[k + 1][m] = v.y; As[k + 2][m] = v.z; As[k + 3][m] = v.w;
    } else {
        int k = tid >> 5, m = (tid & 31) << 2;
        *(float4 *)&As[k][m] = v;
    }
}
/* op(B) is K x N. Not transposed: B[K,N]; transposed: B^T stored [N,K]. */
template <bool TB>
__device__ __forceinline__ float4 sg_load_b(const float *B, int64_t ldb, int N, int K, int n0,
                                            int k0, int tid) {
    float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!TB) {
        int k = k0 + (tid >> 5), n = n0 + ((tid & 31) << 2);
        if (n < N && k < K) return __ldg((const float4 *)(B + (int64_t)k * ldb + n));
    } else {
        int n = n0 + (tid >> 1), k = k0 + ((tid & 1) << 2);
        if (n < N && k < K) return __ldg((const float4 *)(B + (int64_t)n * ldb + k));
    }
    return z;
}
template <bool TB>
__device__ __forceinline__ void sg_store_b(float (*Bs)[SG_BN + SG_PAD], float4 v, int tid) {
    if (!TB) {
        int k = tid >> 5, n = (tid & 31) << 2;
        *(float4 *)&Bs[k][n] = v;
    } else {
        int n = tid >> 1, k = (tid & 1) << 2;
        Bs[k + 0][n] = v.x; Bs[k + 1][n] = v.y; Bs[k + 2][n] = v.z; Bs[k + 3][n] = v.w;
    }
}

template <bool TA, bool TB>
__global__ void __launch_bounds__(256, 2)
sgemm_128x128_kernel(int M, int N, int K, float alpha, const float *__restrict__ A, int64_t lda,
                     const float *__restrict__ B, int64_t ldb, float beta, float *__restrict__ C,
                     int64_t ldc, sg_batch bt) {
    SG_BATCH_MOVE();
    __shared__ __align__(16) float As[2][SG_BK][SG_BM + SG_PAD];
    __shared__ __align__(16) float Bs[2][SG_BK][SG_BN + SG_PAD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;    // warp sub-tile 32 x 64
    const int lm = lane >> 3, ln = lane & 7;                  // lanes 4 (M) x 8 (N)
    const int m0 = blockIdx.y * SG_BM, n0 = blockIdx.x * SG_BN;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;

    float4 ra = sg_load_a<TA>(A, lda, M, K, m0, 0, tid);
    float4 rb = sg_load_b<TB>(B, ldb, N, K, n0, 0, tid);
    sg_store_a<TA>(As[0], ra, tid);
    sg_store_b<TB>(Bs[0], rb, tid);
    __syncthreads();

    int cur = 0;
    for (int k0 = 0; k0 < K; k0 += SG_BK) {
        const bool more = k0 + SG_BK < K;
        if (more) {
            ra = sg_load_a<TA>(A, lda, M, K, m0, k0 + SG_BK, tid);
            rb = sg_load_b<TB>(B, ldb, N, K, n0, k0 + SG_BK, tid);
        }
#pragma unroll
        for (int k = 0; k < SG_BK; k++) {
            float a[8], b[8];
            *(float4 *)&a[0] = *(const float4 *)&As[cur][k][wm + lm * 4];
            *(float4 *)&a[4] = *(const float4 *)&As[cur][k][wm + lm * 4 + 16];
            *(float4 *)&b[0] = *(const float4 *)&Bs[cur][k][wn + ln * 4];
            *(float4 *)&b[4] = *(const float4 *)&Bs[cur][k][wn + ln * 4 + 32];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            sg_store_a<TA>(As[cur ^ 1], ra, tid);
            sg_store_b<TB>(Bs[cur ^ 1], rb, tid);
        }
        __syncthreads();
        cur ^= 1;
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        int m = m0 + wm + lm * 4 + (i & 3) + (i >> 2) * 16;
        if (m >= M) continue;
#pragma unroll
        for (int jh = 0; jh < 2; jh++) {
            int n = n0 + wn + ln * 4 + jh * 32;
            if (n >= N) continue;       // N % 4 == 0: the whole float4 is in range
            float4 *cp = (float4 *)(C + (int64_t)m * ldc + n);
            float4 o = make_float4(alpha * acc[i][jh * 4 + 0], alpha * acc[i][jh * 4 + 1],
                                   alpha * acc[i][jh * 4 + 2], alpha * acc[i][jh * 4 + 3]);
            if (beta != 0.f) {
                float4 c = *cp;
                o.x += beta * c.x; o.y += beta * c.y; o.z += beta * c.z; o.w += beta * c.w;
            }
            *cp = o;
        }
    }
}

/* Complete tiles (M, N % 128 == 0, K % 8 == 0), any transposes: the same
 * scheme with no bounds checks, 32-bit tile offsets and pointer-stepping
 * loaders. Kept apart from the kernel above because adding the FULL case as
 * a template flag there measured slower (H200, 4096^3 NN: 41.6 vs 46
 * TFLOP/s; register allocation differs). Loads per thread and slab: one
 * float4 of op(A), one of op(B). A row-major A (M x K) and a transposed B
 * (stored N x K) are read along K and stored transposed (4 scalar stores into
 * the padded tile); A^T (K x M) and B (K x N) are read along M / N and stored
 * as they are (one float4). NT and TN used the general kernel before (0.857 /
 * 0.875 of cuBLAS at 4096; the NN full kernel ran 0.903). */
template <bool TA, bool TB>
__global__ void __launch_bounds__(256, 2)
sgemm_full_kernel(int K, float alpha, const float *__restrict__ A, int lda,
                  const float *__restrict__ B, int ldb, float beta, float *__restrict__ C,
                  int ldc, sg_batch bt) {
    SG_BATCH_MOVE();
    __shared__ __align__(16) float As[2][SG_BK][SG_BM + SG_PAD];
    __shared__ __align__(16) float Bs[2][SG_BK][SG_BN + (TB ? SG_PAD : 0)];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;
    const int lm = lane >> 3, ln = lane & 7;
    const int m0 = blockIdx.y * SG_BM, n0 = blockIdx.x * SG_BN;
    /* along K (transposing store): row tid/2 of the tile, k (tid%2)*4;
     * along M/N (plain store): k row tid/32, col (tid%32)*4 */
    const int tr = tid >> 1, tk = (tid & 1) * 4;
    const int pr = tid >> 5, pc = (tid & 31) * 4;
    const float *Ap = TA ? A + (size_t)pr * lda + m0 + pc : A + (size_t)(m0 + tr) * lda + tk;
    const float *Bp = TB ? B + (size_t)(n0 + tr) * ldb + tk : B + (size_t)pr * ldb + n0 + pc;
    const size_t astep = TA ? (size_t)SG_BK * lda : SG_BK, bstep = TB ? SG_BK : (size_t)SG_BK * ldb;
    auto store_a = [&](int buf, float4 v) {
        if (TA) *(float4 *)&As[buf][pr][pc] = v;
        else { As[buf][tk + 0][tr] = v.x; As[buf][tk + 1][tr] = v.y; As[buf][tk + 2][tr] = v.z; As[buf][tk + 3][tr] = v.w; }
    };
    auto store_b = [&](int buf, float4 v) {
        if (!TB) *(float4 *)&Bs[buf][pr][pc] = v;
        else { Bs[buf][tk + 0][tr] = v.x; Bs[buf][tk + 1][tr] = v.y; Bs[buf][tk + 2][tr] = v.z; Bs[buf][tk + 3][tr] = v.w; }
    };
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    float4 ra = __ldg((const float4 *)Ap), rb = __ldg((const float4 *)Bp);
    store_a(0, ra);
    store_b(0, rb);
    __syncthreads();
    int cur = 0;
    for (int k0 = 0; k0 < K; k0 += SG_BK) {
        const bool more = k0 + SG_BK < K;
        if (more) {
            Ap += astep;
            Bp += bstep;
            ra = __ldg((const float4 *)Ap);
            rb = __ldg((const float4 *)Bp);
        }
#pragma unroll
        for (int k = 0; k < SG_BK; k++) {
            float a[8], b[8];
            *(float4 *)&a[0] = *(const float4 *)&As[cur][k][wm + lm * 4];
            *(float4 *)&a[4] = *(const float4 *)&As[cur][k][wm + lm * 4 + 16];
            *(float4 *)&b[0] = *(const float4 *)&Bs[cur][k][wn + ln * 4];
            *(float4 *)&b[4] = *(const float4 *)&Bs[cur][k][wn + ln * 4 + 32];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            store_a(cur ^ 1, ra);
            store_b(cur ^ 1, rb);
        }
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int m = m0 + wm + lm * 4 + (i & 3) + (i >> 2) * 16;
#pragma unroll
        for (int jh = 0; jh < 2; jh++) {
            float4 *cp = (float4 *)(C + (size_t)m * ldc + n0 + wn + ln * 4 + jh * 32);
            float4 o = make_float4(alpha * acc[i][jh * 4 + 0], alpha * acc[i][jh * 4 + 1],
                                   alpha * acc[i][jh * 4 + 2], alpha * acc[i][jh * 4 + 3]);
            if (beta != 0.f) {
                float4 c = *cp;
                o.x += beta * c.x; o.y += beta * c.y; o.z += beta * c.z; o.w += beta * c.w;
            }
            *cp = o;
        }
    }
}

/* Fallback: any shape, any alignment. 16x16 tiles through shared memory. */
__global__ void sgemm_generic_kernel(bool ta, bool tb, int M, int N, int K, float alpha,
                                     const float *__restrict__ A, int64_t lda,
                                     const float *__restrict__ B, int64_t ldb, float beta,
                                     float *__restrict__ C, int64_t ldc, sg_batch bt) {
    SG_BATCH_MOVE();
    __shared__ float As[16][17], Bs[16][17];
    int tx = threadIdx.x, ty = threadIdx.y;
    int m = blockIdx.y * 16 + ty, n = blockIdx.x * 16 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        int ka = k0 + tx, mb = blockIdx.y * 16 + ty;    // As[ty][tx] = op(A)[mb][ka]
        As[ty][tx] = (mb < M && ka < K) ? (ta ? A[(int64_t)ka * lda + mb] : A[(int64_t)mb * lda + ka]) : 0.f;
        int kb = k0 + ty, nb = blockIdx.x * 16 + tx;    // Bs[ty][tx] = op(B)[kb][nb]
        Bs[ty][tx] = (kb < K && nb < N) ? (tb ? B[(int64_t)nb * ldb + kb] : B[(int64_t)kb * ldb + nb]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 16; k++) acc = fmaf(As[ty][k], Bs[k][tx], acc);
        __syncthreads();
    }
    if (m < M && n < N) {
        float o = alpha * acc;
        if (beta != 0.f) o += beta * C[(int64_t)m * ldc + n];
        C[(int64_t)m * ldc + n] = o;
    }
}

extern "C" kn_status kn_cuda_sgemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                           float alpha, const float *A, int64_t lda, const float *B,
                                           int64_t ldb, float beta, float *C, int64_t ldc,
                                           const kn_cuda_gemm_batch *batch, void *stream) {
    KN_CUDA_REQUIRE(M >= 0 && N >= 0 && K >= 0 && M < INT32_MAX && N < INT32_MAX && K < INT32_MAX,
                    "kn_cuda_sgemm: bad shape M=%lld N=%lld K=%lld (need 0 <= dim < 2^31)",
                    (long long)M, (long long)N, (long long)K);
    KN_CUDA_REQUIRE(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
                    "kn_cuda_sgemm: leading dims too small (lda=%lld ldb=%lld ldc=%lld for "
                    "M=%lld N=%lld K=%lld, trans_a=%d trans_b=%d)",
                    (long long)lda, (long long)ldb, (long long)ldc, (long long)M, (long long)N,
                    (long long)K, (int)trans_a, (int)trans_b);
    sg_batch bt;
    memset(&bt, 0, sizeof bt);
    int64_t nbatch = 1;
    bool strides16 = true;      /* every batch entry keeps the 16-byte alignment of the base */
    if (batch) {
        KN_CUDA_REQUIRE(batch->nb >= 0 && batch->nb <= KN_CUDA_MAX_BATCH_DIMS,
                        "kn_cuda_sgemm_batched: %d batch dims (at most %d)", batch->nb, KN_CUDA_MAX_BATCH_DIMS);
        bt.nb = batch->nb;
        for (int d = 0; d < batch->nb; d++) {
            KN_CUDA_REQUIRE(batch->ne[d] >= 0, "kn_cuda_sgemm_batched: negative batch extent");
            bt.ne[d] = batch->ne[d]; bt.sa[d] = batch->sa[d]; bt.sb[d] = batch->sb[d]; bt.sc[d] = batch->sc[d];
            nbatch *= batch->ne[d];
            if (batch->ne[d] > 1 && (batch->sa[d] % 4 || batch->sb[d] % 4 || batch->sc[d] % 4)) strides16 = false;
        }
    }
    if (M == 0 || N == 0 || nbatch == 0) return KN_OK;
    KN_CUDA_REQUIRE(A && B && C, "kn_cuda_sgemm: NULL matrix pointer");
    cudaStream_t st = kn_stream(stream);
    bool fast = M % 4 == 0 && N % 4 == 0 && K % 4 == 0 && lda % 4 == 0 && ldb % 4 == 0 &&
                ldc % 4 == 0 && kn_aligned16(A) && kn_aligned16(B) && kn_aligned16(C) && K > 0 && strides16;
    const bool full = M % SG_BM == 0 && N % SG_BN == 0 && K % SG_BK == 0 &&
                      lda <= INT32_MAX && ldb <= INT32_MAX && ldc <= INT32_MAX;
    /* the grid's z holds at most 65535 batch entries: launch in chunks */
    for (int64_t z0 = 0; z0 < nbatch; z0 += 65535) {
        unsigned nz = (unsigned)(nbatch - z0 < 65535 ? nbatch - z0 : 65535);
        bt.z0 = z0;
        if (fast) {
            dim3 grid((unsigned)((N + SG_BN - 1) / SG_BN), (unsigned)((M + SG_BM - 1) / SG_BM), nz);
            KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_sgemm: M=%lld too large", (long long)M);
#define SG_LAUNCH(ta, tb)                                                                   \
    sgemm_128x128_kernel<ta, tb><<<grid, 256, 0, st>>>((int)M, (int)N, (int)K, alpha, A, lda, \
                                                       B, ldb, beta, C, ldc, bt)
#define SG_FULL(ta, tb)                                                                     \
    sgemm_full_kernel<ta, tb><<<grid, 256, 0, st>>>((int)K, alpha, A, (int)lda, B, (int)ldb, beta, \
                                                    C, (int)ldc, bt)
            if (full && !trans_a && !trans_b) SG_FULL(false, false);
            else if (full && !trans_a && trans_b) SG_FULL(false, true);
            else if (full && trans_a && !trans_b) SG_FULL(true, false);
            else if (full) SG_FULL(true, true);
            else if (!trans_a && !trans_b) SG_LAUNCH(false, false);
            else if (!trans_a && trans_b) SG_LAUNCH(false, true);
            else if (trans_a && !trans_b) SG_LAUNCH(true, false);
            else SG_LAUNCH(true, true);
#undef SG_LAUNCH
#undef SG_FULL
        } else {
            dim3 grid((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16), nz);
            KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_sgemm: M=%lld too large", (long long)M);
            sgemm_generic_kernel<<<grid, dim3(16, 16), 0, st>>>(trans_a, trans_b, (int)M, (int)N,
                                                               (int)K, alpha, A, lda, B, ldb, beta,
                                                               C, ldc, bt);
        }
        KN_CUDA_LAUNCHED();
    }
    return KN_OK;
}

extern "C" kn_status kn_cuda_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                   float alpha, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float beta, float *C, int64_t ldc, void *stream) {
    return kn_cuda_sgemm_batched(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, stream);
}
