/* gemm_tc.cu: batched bf16/f16 GEMM on the tensor cores with mma.sync
 * (sm_80 and later), fp32 accumulation, for the backend's matmul node.
 *
 *   C[z][M,N] = alpha * op(A[z]) @ op(B[z])     (z: the batch, kn_cuda_gemm_batch)
 *
 * op(A) is M x K: A stored M x K (K contiguous) or, with trans_a, K x M (M
 * contiguous); op(B) is K x N: B stored K x N (N contiguous) or, with
 * trans_b, N x K (K contiguous). Any M, N, K >= 1 (partial tiles are
 * zero-filled on load and masked on store), any leading dimensions, and C
 * written as f32, f16 or bf16 (round to nearest even).
 *
 * Kernel: block tile 128 x 128 x 64, 8 warps as 2 x 4, each warp 64 x 32
 * (4 x 4 mma.m16n8k16 tiles, 64 f32 accumulators per thread). Tiles are
 * copied to shared memory in the operand's own layout (cp.async, 16 bytes,
 * 3 stages) and ldmatrix reads the fragments, with .trans where the stored
 * layout is the transpose of what mma wants (A stored K x M, B stored K x N).
 * Rows are padded by 16 bytes so that ldmatrix's 8 row addresses fall in
 * different banks. When an operand is not 16-byte aligned (odd leading
 * dimension or base), or a 16-byte chunk straddles the matrix edge, that
 * chunk is loaded element by element (same result, slower).
 *
 * Mixed precision (kn_cuda_gemm_tc_f32a): A stored as f32 M x K (an LLM's
 * activations) against a bf16/f16 B (its weights). A's tile is loaded with
 * plain 16-byte loads (all of a thread's loads issued before the first is
 * used), rounded to B's dtype (RNE) and stored to shared memory in the same
 * layout the half-precision path gets from cp.async; the rest of the kernel
 * is unchanged, so C is the f32-accumulated product of the rounded A. One
 * launch instead of a cast kernel, an extra M x K bf16 buffer and a second
 * launch (measured against graph-level casts in docs/PERF-cuda-llm.md).
 *
 * Non-goals: no split-K, no epilogue fusion, no wgmma (gemm_bf16_sm90.cu is
 * the Hopper kernel for dense linear-layer shapes; the backend picks it
 * where it fits). Letters: M,N,K GEMM dims; z batch entry.
 */
#include "backends/cuda/common.cuh"
#include <cuda_fp16.h>   // defines: __float2half_rn
#include <string.h>

#define TC_BM 128
#define TC_BN 128
#ifndef TC_BK
#define TC_BK 64                                  /* 32 measured slower: twice the barriers per k */
#endif
#define TC_PAD 8                                  /* elements of padding per smem row */
#define TC_STAGES 3
#define TC_THREADS 256
/* elements of one operand tile in smem: [128][32+8] or [32][128+8] */
#define TC_TILE_K_INNER (TC_BM * (TC_BK + TC_PAD))
#define TC_TILE_MN_INNER (TC_BK * (TC_BM + TC_PAD))
#define TC_TILE_MAX (TC_TILE_K_INNER > TC_TILE_MN_INNER ? TC_TILE_K_INNER : TC_TILE_MN_INNER)
#define TC_SMEM_BYTES (TC_STAGES * 2 * TC_TILE_MAX * 2)   /* 110.6 KB at BK 64: two blocks per SM */

struct tc_args {
    int64_t M, N, K, lda, ldb, ldc;
    const uint16_t *A, *B;
    const float *Af;      /* A as f32 (the AF32 kernels) */
    void *C;
    int c_dtype;          /* KN_F32, KN_F16 or KN_BF16 */
    float alpha;
    int vec_a, vec_b;     /* 16-byte cp.async allowed for this operand */
    int pair_ok;          /* C base aligned for a 2-element store and ldc even */
    int64_t nbatch;
    kn_cuda_gemm_batch bt;
};

__device__ __forceinline__ uint32_t tc_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void tc_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(tc_smem(dst)), "l"(src) : "memory");
}

/* Copy a ROWS x COLS tile (COLS contiguous in global and in smem, row
 * stride sld in smem) from g (row stride ld); rows >= rlim or cols >= clim
 * read as zero. */
template <int ROWS, int COLS>
__device__ __forceinline__ void tc_load_tile(uint16_t *s, int sld, const uint16_t *g, int64_t ld, int64_t rlim,
                                             int64_t clim, bool vec) {
    constexpr int CH = COLS / 8;
#pragma unroll
    for (int ch = threadIdx.x; ch < ROWS * CH; ch += TC_THREADS) {
        int r = ch / CH, c = (ch % CH) * 8;
        uint16_t *dst = s + r * sld + c;
        if (vec && r < rlim && c + 8 <= clim) {
            tc_cp16(dst, g + (int64_t)r * ld + c);
        } else {
            uint16_t v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = (r < rlim && c + j < clim) ? g[(int64_t)r * ld + c + j] : (uint16_t)0;
            uint4 u;
            u.x = v[0] | ((uint32_t)v[1] << 16); u.y = v[2] | ((uint32_t)v[3] << 16);
            u.z = v[4] | ((uint32_t)v[5] << 16); u.w = v[6] | ((uint32_t)v[7] << 16);
            *(uint4 *)dst = u;
        }
    }
}

/* The f32 twin of tc_load_tile for A stored M x K (K contiguous): a ROWS x
 * COLS tile rounded to bf16 (F16 = 0) or f16. Each thread has NIT chunks of
 * 8 floats; it loads G of them (two 16-byte loads each when vec and inside
 * the matrix), then converts and stores them: 2 * G loads in flight. These
 * kernels take 188 registers (ptxas, sm_90a; 126 for half A), so one block
 * per SM instead of two: the compiler hoists the plain loads of the next
 * stage over the MMA loop. G = 2 or 1 did not lower that (196-212), and
 * capping at 128 (launch bounds, 2 blocks) spilled 68-128 bytes. The LLM
 * shapes this serves launch fewer blocks than SMs, so occupancy is moot. */
#ifndef TC_F32A_GROUP
#define TC_F32A_GROUP 4
#endif
__device__ __forceinline__ uint32_t tc_pack2(float a, float b, int f16) {
    uint16_t x = f16 ? __half_as_ushort(__float2half_rn(a)) : kn_f2bf(a);
    uint16_t y = f16 ? __half_as_ushort(__float2half_rn(b)) : kn_f2bf(b);
    return (uint32_t)x | ((uint32_t)y << 16);
}
template <int ROWS, int COLS, int F16>
__device__ __forceinline__ void tc_load_tile_f32(uint16_t *s, int sld, const float *g, int64_t ld, int64_t rlim,
                                                 int64_t clim, bool vec) {
    constexpr int CH = COLS / 8, NIT = ROWS * CH / TC_THREADS, G = TC_F32A_GROUP;
    static_assert(ROWS * CH % TC_THREADS == 0 && NIT % G == 0, "tile chunks must split evenly over the threads");
#pragma unroll
    for (int it0 = 0; it0 < NIT; it0 += G) {
    float4 v[G][2];
#pragma unroll
    for (int it = 0; it < G; it++) {
        int ch = threadIdx.x + (it0 + it) * TC_THREADS, r = ch / CH, c = (ch % CH) * 8;
        const float *p = g + (int64_t)r * ld + c;
        if (vec && r < rlim && c + 8 <= clim) {
            v[it][0] = __ldg((const float4 *)p);
            v[it][1] = __ldg((const float4 *)p + 1);
        } else {
            float t[8];
#pragma unroll
            for (int j = 0; j < 8; j++) t[j] = (r < rlim && c + j < clim) ? p[j] : 0.f;
            v[it][0] = make_float4(t[0], t[1], t[2], t[3]);
            v[it][1] = make_float4(t[4], t[5], t[6], t[7]);
        }
    }
#pragma unroll
    for (int it = 0; it < G; it++) {
        int ch = threadIdx.x + (it0 + it) * TC_THREADS, r = ch / CH, c = (ch % CH) * 8;
        uint4 u;
        u.x = tc_pack2(v[it][0].x, v[it][0].y, F16); u.y = tc_pack2(v[it][0].z, v[it][0].w, F16);
        u.z = tc_pack2(v[it][1].x, v[it][1].y, F16); u.w = tc_pack2(v[it][1].z, v[it][1].w, F16);
        *(uint4 *)(s + r * sld + c) = u;
    }
    }
}

__device__ __forceinline__ void tc_ldm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem(p)));
}
__device__ __forceinline__ void tc_ldm_x4_t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem(p)));
}
template <int F16>
__device__ __forceinline__ void tc_mma(float *c, const uint32_t *a, const uint32_t *b) {
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint16_t tc_f2h16(int dt, float v) {
    return dt == KN_BF16 ? kn_f2bf(v) : __half_as_ushort(__float2half_rn(v));
}
/* C[off] = v0 and, when has1, C[off + 1] = v1: one 4-byte (8 for f32)
 * store when pair-aligned, else two */
__device__ __forceinline__ void tc_store2(void *C, int dt, int64_t off, float v0, float v1, bool has1, bool pair) {
    if (dt == KN_F32) {
        float *c = (float *)C + off;
        if (has1 && pair) *(float2 *)c = make_float2(v0, v1);
        else { c[0] = v0; if (has1) c[1] = v1; }
    } else {
        uint16_t *c = (uint16_t *)C + off, h0 = tc_f2h16(dt, v0);
        if (has1 && pair) *(uint32_t *)c = (uint32_t)h0 | ((uint32_t)tc_f2h16(dt, v1) << 16);
        else { c[0] = h0; if (has1) c[1] = tc_f2h16(dt, v1); }
    }
}

/* TA: A stored K x M; TB: B stored N x K; F16: operands f16 (else bf16);
 * AF32: A is f32 (p.Af, stored M x K), rounded to the operand dtype on load */
template <int TA, int TB, int F16, int AF32>
__global__ void __launch_bounds__(TC_THREADS) k_gemm_tc(tc_args p) {
    static_assert(!(TA && AF32), "f32 A is supported stored M x K only");
    extern __shared__ __align__(16) uint16_t tc_sh[];
    uint16_t *sA = tc_sh, *sB = tc_sh + TC_STAGES * TC_TILE_MAX;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    const int64_t m0 = (int64_t)blockIdx.y * TC_BM, n0 = (int64_t)blockIdx.x * TC_BN;
    const int lda_s = TA ? TC_BM + TC_PAD : TC_BK + TC_PAD;    /* smem row strides */
    const int ldb_s = TB ? TC_BK + TC_PAD : TC_BN + TC_PAD;
    const int64_t ktiles = (p.K + TC_BK - 1) / TC_BK;

    for (int64_t z = blockIdx.z; z < p.nbatch; z += gridDim.z) {
        /* batch offsets: z is row-major over bt.ne */
        int64_t oa = 0, ob = 0, oc = 0, rem = z;
        for (int d = p.bt.nb - 1; d >= 0; d--) {
            int64_t i = rem % p.bt.ne[d];
            rem /= p.bt.ne[d];
            oa += i * p.bt.sa[d]; ob += i * p.bt.sb[d]; oc += i * p.bt.sc[d];
        }
        const uint16_t *A = p.A + oa, *B = p.B + ob;
        const float *Af = AF32 ? p.Af + oa : nullptr;

        auto load_stage = [&](int stage, int64_t kt) {
            int64_t k0 = kt * TC_BK;
            uint16_t *a = sA + stage * TC_TILE_MAX, *b = sB + stage * TC_TILE_MAX;
            if (AF32) tc_load_tile_f32<TC_BM, TC_BK, F16>(a, lda_s, Af + m0 * p.lda + k0, p.lda, p.M - m0, p.K - k0, p.vec_a);
            else if (TA) tc_load_tile<TC_BK, TC_BM>(a, lda_s, A + k0 * p.lda + m0, p.lda, p.K - k0, p.M - m0, p.vec_a);
            else tc_load_tile<TC_BM, TC_BK>(a, lda_s, A + m0 * p.lda + k0, p.lda, p.M - m0, p.K - k0, p.vec_a);
            if (TB) tc_load_tile<TC_BN, TC_BK>(b, ldb_s, B + n0 * p.ldb + k0, p.ldb, p.N - n0, p.K - k0, p.vec_b);
            else tc_load_tile<TC_BK, TC_BN>(b, ldb_s, B + k0 * p.ldb + n0, p.ldb, p.K - k0, p.N - n0, p.vec_b);
        };

        float acc[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;

#pragma unroll
        for (int s = 0; s < TC_STAGES - 1; s++) {
            if (s < ktiles) load_stage(s, s);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        for (int64_t kt = 0; kt < ktiles; kt++) {
            asm volatile("cp.async.wait_group %0;" ::"n"(TC_STAGES - 2) : "memory");
            __syncthreads();     /* stage kt is in; every warp is done with stage kt-1 */
            int64_t nk = kt + TC_STAGES - 1;
            if (nk < ktiles) load_stage((int)(nk % TC_STAGES), nk);
            asm volatile("cp.async.commit_group;" ::: "memory");

            const uint16_t *a = sA + (kt % TC_STAGES) * TC_TILE_MAX, *b = sB + (kt % TC_STAGES) * TC_TILE_MAX;
#pragma unroll
            for (int kk = 0; kk < TC_BK; kk += 16) {
                uint32_t fa[4][4], fb[4][2];
                const int i8 = lane >> 3, r8 = lane & 7;
#pragma unroll
                for (int mt = 0; mt < 4; mt++) {
                    int mb = wm * 64 + mt * 16;
                    if (TA) tc_ldm_x4_t(fa[mt], a + (kk + r8 + (i8 >> 1) * 8) * lda_s + mb + (i8 & 1) * 8);
                    else tc_ldm_x4(fa[mt], a + (mb + (lane & 15)) * lda_s + kk + (lane >> 4) * 8);
                }
#pragma unroll
                for (int pr = 0; pr < 2; pr++) {
                    int nb = wn * 32 + pr * 16;
                    uint32_t r[4];
                    if (TB) tc_ldm_x4(r, b + (nb + r8 + (i8 >> 1) * 8) * ldb_s + kk + (i8 & 1) * 8);
                    else tc_ldm_x4_t(r, b + (kk + r8 + (i8 & 1) * 8) * ldb_s + nb + (i8 >> 1) * 8);
                    fb[2 * pr][0] = r[0]; fb[2 * pr][1] = r[1];
                    fb[2 * pr + 1][0] = r[2]; fb[2 * pr + 1][1] = r[3];
                }
#pragma unroll
                for (int mt = 0; mt < 4; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) tc_mma<F16>(acc[mt][nt], fa[mt], fb[nt]);
            }
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();         /* smem is reused by the next batch entry */

        /* accumulator (mt, nt, q): row g (+8 for q >= 2), columns 2t, 2t+1;
         * the column pair goes out in one store when C allows it (even ldc
         * and batch offset, aligned base) */
        const int g = lane >> 2, t = lane & 3;
        const bool pair = p.pair_ok && (oc & 1) == 0;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int64_t m = m0 + wm * 64 + mt * 16 + g + h * 8, n = n0 + wn * 32 + nt * 8 + 2 * t;
                    if (m < p.M && n < p.N)
                        tc_store2(p.C, p.c_dtype, oc + m * p.ldc + n, p.alpha * acc[mt][nt][2 * h], p.alpha * acc[mt][nt][2 * h + 1],
                                  n + 1 < p.N, pair);
                }
    }
}

static int tc_device_ok(void) {
    static int ok = -1;
    if (ok >= 0) return ok;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return ok = 0;
    }
    return ok = major >= 8;
}

template <int TA, int TB, int F16, int AF32 = 0>
static kn_status tc_launch(const tc_args &p, dim3 grid, cudaStream_t st) {
    static bool attr = false;          /* > 48 KB of dynamic shared memory needs an opt-in, once per kernel */
    if (!attr) {
        KN_CUDA_TRY(cudaFuncSetAttribute(k_gemm_tc<TA, TB, F16, AF32>, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM_BYTES));
        attr = true;
    }
    k_gemm_tc<TA, TB, F16, AF32><<<grid, TC_THREADS, TC_SMEM_BYTES, st>>>(p);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

extern "C" int kn_cuda_gemm_tc_available(void) { return tc_device_ok(); }

/* Shared by both entry points; a_f32: A is f32 (stored M x K, trans_a false). */
static kn_status gemm_tc_run(kn_dtype ab, bool a_f32, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                             kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream) {
    const char *fn = a_f32 ? "kn_cuda_gemm_tc_f32a" : "kn_cuda_gemm_tc";
    KN_CUDA_REQUIRE(ab == KN_BF16 || ab == KN_F16, "%s: operands must be bf16 or f16 (dtype %d given)", fn, (int)ab);
    KN_CUDA_REQUIRE(c_dtype == KN_F32 || c_dtype == KN_F16 || c_dtype == KN_BF16,
                    "%s: C must be f32, f16 or bf16 (dtype %d given)", fn, (int)c_dtype);
    KN_CUDA_REQUIRE(M >= 0 && N >= 0 && K >= 1, "%s: bad shape M=%lld N=%lld K=%lld", fn, (long long)M,
                    (long long)N, (long long)K);
    KN_CUDA_REQUIRE(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
                    "%s: leading dimensions lda=%lld ldb=%lld ldc=%lld too small for M=%lld N=%lld K=%lld", fn,
                    (long long)lda, (long long)ldb, (long long)ldc, (long long)M, (long long)N, (long long)K);
    KN_CUDA_REQUIRE(!batch || (batch->nb >= 0 && batch->nb <= KN_CUDA_MAX_BATCH_DIMS), "%s: bad batch", fn);
    if (!tc_device_ok())
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: needs a GPU of compute capability 8.0 or newer", fn);
    tc_args p;
    memset(&p, 0, sizeof p);
    p.M = M; p.N = N; p.K = K; p.lda = lda; p.ldb = ldb; p.ldc = ldc;
    if (a_f32) p.Af = (const float *)A; else p.A = (const uint16_t *)A;
    p.B = (const uint16_t *)B; p.C = C;
    p.c_dtype = (int)c_dtype; p.alpha = alpha;
    p.nbatch = 1;
    if (batch) {
        p.bt = *batch;
        for (int d = 0; d < batch->nb; d++) p.nbatch *= batch->ne[d];
    }
    if (M == 0 || N == 0 || p.nbatch == 0) return KN_OK;
    KN_CUDA_REQUIRE(A && B && C, "%s: NULL pointer", fn);
    /* 16-byte loads: 8 half elements, or 4 floats for an f32 A */
    int avec = a_f32 ? 4 : 8;
    bool va = kn_aligned16(A) && lda % avec == 0, vb = kn_aligned16(B) && ldb % 8 == 0;
    for (int d = 0; d < p.bt.nb; d++) { va = va && p.bt.sa[d] % avec == 0; vb = vb && p.bt.sb[d] % 8 == 0; }
    p.vec_a = va; p.vec_b = vb;
    bool pc = ((uintptr_t)C % (c_dtype == KN_F32 ? 8 : 4)) == 0 && ldc % 2 == 0;
    for (int d = 0; d < p.bt.nb; d++) pc = pc && p.bt.sc[d] % 2 == 0;
    p.pair_ok = pc;
    int64_t gx = (N + TC_BN - 1) / TC_BN, gy = (M + TC_BM - 1) / TC_BM;
    KN_CUDA_REQUIRE(gy <= 65535 && gx <= INT32_MAX, "%s: M=%lld N=%lld too large for one launch", fn, (long long)M,
                    (long long)N);
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)(p.nbatch < 65535 ? p.nbatch : 65535));
    cudaStream_t st = kn_stream(stream);
    if (a_f32) {
        switch ((trans_b ? 2 : 0) | (ab == KN_F16 ? 1 : 0)) {
        case 0: return tc_launch<0, 0, 0, 1>(p, grid, st);
        case 1: return tc_launch<0, 0, 1, 1>(p, grid, st);
        case 2: return tc_launch<0, 1, 0, 1>(p, grid, st);
        default: return tc_launch<0, 1, 1, 1>(p, grid, st);
        }
    }
    int key = (trans_a ? 4 : 0) | (trans_b ? 2 : 0) | (ab == KN_F16 ? 1 : 0);
    switch (key) {
    case 0: return tc_launch<0, 0, 0>(p, grid, st);
    case 1: return tc_launch<0, 0, 1>(p, grid, st);
    case 2: return tc_launch<0, 1, 0>(p, grid, st);
    case 3: return tc_launch<0, 1, 1>(p, grid, st);
    case 4: return tc_launch<1, 0, 0>(p, grid, st);
    case 5: return tc_launch<1, 0, 1>(p, grid, st);
    case 6: return tc_launch<1, 1, 0>(p, grid, st);
    default: return tc_launch<1, 1, 1>(p, grid, st);
    }
}

extern "C" kn_status kn_cuda_gemm_tc(kn_dtype ab, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                     float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                                     kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream) {
    return gemm_tc_run(ab, false, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, C, c_dtype, ldc, batch, stream);
}

extern "C" kn_status kn_cuda_gemm_tc_f32a(kn_dtype b_dtype, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                          const float *A, int64_t lda, const void *B, int64_t ldb, void *C,
                                          kn_dtype c_dtype, int64_t ldc, const kn_cuda_gemm_batch *batch, void *stream) {
    return gemm_tc_run(b_dtype, true, false, trans_b, M, N, K, alpha, A, lda, B, ldb, C, c_dtype, ldc, batch, stream);
}
