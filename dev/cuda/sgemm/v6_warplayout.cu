/* v6_warplayout.cu: v5 with a warp-tiled thread layout and a BK template.
 * Each warp owns a 32 x 64 sub-tile of the 128 x 128 block tile (warps 4 x 2);
 * its lanes are 4 (M) x 8 (N) and each lane an 8x8 micro-tile split into
 * 2x2 sub-tiles of 4x4 (rows lm*4 + {0,16}, cols ln*4 + {0,32}). Per k a warp
 * then reads 4 distinct A float4s and 8 distinct B float4s, one shared-memory
 * wavefront per load (v5: 6 wavefronts per k). NN only; needs M, N % 128,
 * K % BK == 0. Prefetch to registers + double-buffered shared memory as v5. */
template <int BK>
__global__ void __launch_bounds__(256, 2)
sgemm_v6_kernel(int M, int N, int K, const float *__restrict__ A, const float *__restrict__ B,
                float *__restrict__ C) {
    constexpr int LA = BK / 8;                     // float4 loads of A (and B) per thread per slab
    __shared__ __align__(16) float As[2][BK][128 + 4];
    __shared__ __align__(16) float Bs[2][BK][128];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;
    const int lm = lane >> 3, ln = lane & 7;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    float4 ra[LA], rb[LA];
    auto gload = [&](int k0) {
#pragma unroll
        for (int l = 0; l < LA; l++) {
            int e = tid + l * 256;                       // A: 128 rows x BK/4 float4
            int r = e / (BK / 4), c = (e % (BK / 4)) * 4;
            ra[l] = __ldg((const float4 *)(A + (size_t)(m0 + r) * K + k0 + c));
            int rb_ = e / 32, cb = (e % 32) * 4;         // B: BK rows x 32 float4
            rb[l] = __ldg((const float4 *)(B + (size_t)(k0 + rb_) * N + n0 + cb));
        }
    };
    auto sstore = [&](int buf) {
#pragma unroll
        for (int l = 0; l < LA; l++) {
            int e = tid + l * 256;
            int r = e / (BK / 4), c = (e % (BK / 4)) * 4;
            As[buf][c + 0][r] = ra[l].x; As[buf][c + 1][r] = ra[l].y;
            As[buf][c + 2][r] = ra[l].z; As[buf][c + 3][r] = ra[l].w;
            int rb_ = e / 32, cb = (e % 32) * 4;
            *(float4 *)&Bs[buf][rb_][cb] = rb[l];
        }
    };
    gload(0);
    sstore(0);
    __syncthreads();
    int cur = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) gload(k0 + BK);
#pragma unroll
        for (int k = 0; k < BK; k++) {
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
        if (more) sstore(cur ^ 1);
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int m = m0 + wm + lm * 4 + (i & 3) + (i >> 2) * 16;
#pragma unroll
        for (int jh = 0; jh < 2; jh++) {
            int n = n0 + wn + ln * 4 + jh * 32;
            *(float4 *)(C + (size_t)m * N + n) =
                make_float4(acc[i][jh * 4 + 0], acc[i][jh * 4 + 1], acc[i][jh * 4 + 2], acc[i][jh * 4 + 3]);
        }
    }
}
static void sgemm_v6_bk8(int M, int N, int K, const float *A, const float *B, float *C) {
    sgemm_v6_kernel<8><<<dim3(N / 128, M / 128), 256>>>(M, N, K, A, B, C);
}
static void sgemm_v6_bk16(int M, int N, int K, const float *A, const float *B, float *C) {
    sgemm_v6_kernel<16><<<dim3(N / 128, M / 128), 256>>>(M, N, K, A, B, C);
}
