/* gemm_bf16_sm90.cu: bf16 GEMM for linear layers, C = epi(A @ W^T + bias).
 * A[M,K], W[N,K] row-major bf16 (both K-major, as wgmma likes them), fp32
 * accumulation, bf16 output, optional f32 bias and tanh-GELU epilogue.
 *
 * sm_90a path: block tile 128 x 256 x 64, 3 warpgroups: warpgroup 0 is the
 * producer (one thread issues TMA bulk tensor copies into a 4-stage ring,
 * completing on "full" mbarriers), warpgroups 1 and 2 are consumers, each
 * doing wgmma m64n256k16 over its 64 rows and releasing the stage on an
 * "empty" mbarrier. Shared tiles use the 128-byte swizzle (TMA writes it,
 * the wgmma descriptors read it). setmaxnreg gives the consumers 232
 * registers (128 accumulators each). Out-of-range rows/cols of partial tiles
 * are zero-filled by TMA and masked in the epilogue.
 * Other GPUs / builds (and K % 8 != 0 or misaligned inputs): a plain tiled
 * FFMA kernel (correct, slow) -- an mma.sync path for sm_80 is not written.
 */
#include "backends/cuda/common.cuh"
#include <cuda.h>          // defines: CUtensorMap and its enums (no libcuda link: entry point via cudart)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KN_SM90A_DEVICE 1
#endif

#define G_BM 128
#define G_BK 64
/* per tile width BN (only 256 is instantiated; 128 measured slower at 8192):
 * stages and shared-memory bytes */
#define G_STAGES(BN) 4
#define G_STAGE_BYTES(BN) ((G_BM + (BN)) * G_BK * 2)
#define G_SMEM_BYTES(BN) (G_STAGES(BN) * G_STAGE_BYTES(BN) + 1024 + 2 * 8 * G_STAGES(BN))

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
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int x, int y,
                                            uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)(uintptr_t)map), "r"(x), "r"(y),
                 "r"(smem_u32(bar)) : "memory");
}
/* Shared-memory matrix descriptor: K-major tile, rows of 128 bytes, 128-byte
 * swizzle, 8-row core groups 1024 bytes apart. */
__device__ __forceinline__ uint64_t wg_desc(const void *p) {
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFFull) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_mma_256(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1));
}
template <int BN> __device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db) {
    static_assert(BN == 256, "only the m64n256k16 shape is written");
    wg_mma_256(d, da, db);
}
#endif /* KN_SM90A_DEVICE */

template <int BN>
__global__ void __launch_bounds__(384, 1)
gemm_bf16_wgmma_kernel(const __grid_constant__ CUtensorMap tmA,
                       const __grid_constant__ CUtensorMap tmB, int M, int N, int K,
                       const float *__restrict__ bias, int epi, uint16_t *__restrict__ C) {
#ifdef KN_SM90A_DEVICE
    constexpr int STAGES = G_STAGES(BN), STAGE_BYTES = G_STAGE_BYTES(BN), NACC = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = base;                                   // [STAGES][BM][BK]
    uint8_t *sB = base + STAGES * G_BM * G_BK * 2;      // [STAGES][BN][BK]
    uint64_t *full = (uint64_t *)(base + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int m0 = blockIdx.y * G_BM, n0 = blockIdx.x * BN;
    const int nk = (K + G_BK - 1) / G_BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 2); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            for (int kt = 0; kt < nk; kt++) {
                int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
                mbar_expect_tx(&full[s], STAGE_BYTES);
                tma_load_2d(sA + s * G_BM * G_BK * 2, &tmA, kt * G_BK, m0, &full[s]);
                tma_load_2d(sB + s * BN * G_BK * 2, &tmB, kt * G_BK, n0, &full[s]);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1;
        float d[NACC];
#pragma unroll
        for (int i = 0; i < NACC; i++) d[i] = 0.f;
        for (int kt = 0; kt < nk; kt++) {
            int s = kt % STAGES;
            mbar_wait(&full[s], (kt / STAGES) & 1);
            const uint8_t *a = sA + s * G_BM * G_BK * 2 + cw * 64 * G_BK * 2;
            const uint8_t *b = sB + s * BN * G_BK * 2;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < G_BK / 16; kk++) wg_mma<BN>(d, wg_desc(a + kk * 32), wg_desc(b + kk * 32));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            /* keep this k-tile's wgmmas in flight; the previous ones are done,
             * so their stage can go back to the producer */
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (kt > 0 && tid == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        /* Epilogue, staged through shared memory so that global stores are
         * 16-byte and row-contiguous. Fragment j of a thread is row
         * warp*16 + lane/4 (+8), col (j/4)*8 + (lane%4)*2 (+1). The pipeline
         * buffers are reused: both consumers first finish reading them. */
        asm volatile("bar.sync 1, 256;" ::: "memory");
        constexpr int SROW = BN * 2 + 16;                 // padded staging row, bytes
        uint8_t *stg = base + cw * 64 * SROW;
        const int warp = tid / 32, lane = tid % 32;
#pragma unroll
        for (int j = 0; j < NACC; j += 2) {
            int rl = warp * 16 + lane / 4 + ((j & 2) ? 8 : 0);
            int cl = (j / 4) * 8 + (lane % 4) * 2;
            int col = n0 + cl;
            float v0 = d[j], v1 = d[j + 1];
            if (bias) { if (col < N) v0 += bias[col]; if (col + 1 < N) v1 += bias[col + 1]; }
            if (epi == KN_CUDA_EPI_GELU) { v0 = gelu_tanh(v0); v1 = gelu_tanh(v1); }
            *(uint32_t *)(stg + rl * SROW + cl * 2) = (uint32_t)kn_f2bf(v0) | ((uint32_t)kn_f2bf(v1) << 16);
        }
        asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
        const bool vec_out = (N % 8) == 0 && (((uintptr_t)C) & 15) == 0;
        for (int c = tid; c < 64 * (BN / 8); c += 128) {
            int rl = c / (BN / 8), ch = c % (BN / 8);
            int row = m0 + cw * 64 + rl, col = n0 + ch * 8;
            if (row >= M || col >= N) continue;
            uint4 v = *(const uint4 *)(stg + rl * SROW + ch * 16);
            uint16_t *cp = C + (int64_t)row * N + col;
            if (vec_out && col + 8 <= N) {
                *(uint4 *)cp = v;
            } else {
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (col + q < N) cp[q] = (uint16_t)(w[q / 2] >> (16 * (q & 1)));
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
            if (cudaFuncSetAttribute(gemm_bf16_wgmma_kernel<256>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     G_SMEM_BYTES(256)) != cudaSuccess) {
                cudaGetLastError();
                ok = 0;
            }
        }
    }
    return g_wgmma_state = ok;
}

extern "C" int kn_cuda_gemm_bf16_uses_wgmma(void) { return wgmma_available(); }

static kn_status make_map(CUtensorMap *map, const uint16_t *p, int64_t rows, int64_t K,
                          uint32_t box_rows) {
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {G_BK, box_rows};
    cuuint32_t es[2] = {1, 1};
    CUresult r = g_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box,
                          es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kn_set_error(KN_ERR_BACKEND, "kn_cuda_gemm_bf16: cuTensorMapEncodeTiled failed (%d) "
                            "for a %lld x %lld matrix", (int)r, (long long)rows, (long long)K);
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
        const int bn = 256;
        CUtensorMap ma, mb;
        kn_status s = make_map(&ma, A, M, K, G_BM);
        if (s) return s;
        if ((s = make_map(&mb, W, N, K, (uint32_t)bn))) return s;
        dim3 grid((unsigned)((N + bn - 1) / bn), (unsigned)((M + G_BM - 1) / G_BM));
        KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_gemm_bf16: M=%lld too large", (long long)M);
        gemm_bf16_wgmma_kernel<256><<<grid, 384, G_SMEM_BYTES(256), st>>>(ma, mb, (int)M, (int)N,
                                                                       (int)K, bias, (int)epi, C);
    } else {
        dim3 grid((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64));
        KN_CUDA_REQUIRE(grid.y <= 65535, "kn_cuda_gemm_bf16: M=%lld too large", (long long)M);
        gemm_bf16_simple_kernel<<<grid, 256, 0, st>>>((int)M, (int)N, (int)K, A, W, bias, (int)epi, C);
    }
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
