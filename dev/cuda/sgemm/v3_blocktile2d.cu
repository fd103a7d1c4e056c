/* v3_blocktile2d.cu: 128x128 block tile, BK = 8, 256 threads, each thread an
 * 8x8 micro-tile held in registers: 16 shared loads feed 64 FMAs. Scalar
 * global and shared accesses. Needs M, N % 128 == 0 and K % 8 == 0. */
__global__ void __launch_bounds__(256)
sgemm_v3_kernel(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ float As[8][128], Bs[8][128];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += 8) {
        for (int e = tid; e < 1024; e += 256) {
            int r = e / 8, c = e % 8;               // A tile 128 x 8
            As[c][r] = A[(size_t)(m0 + r) * K + k0 + c];
            int rb = e / 128, cb = e % 128;         // B tile 8 x 128
            Bs[rb][cb] = B[(size_t)(k0 + rb) * N + n0 + cb];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) { a[i] = As[k][ty * 8 + i]; b[i] = Bs[k][tx * 8 + i]; }
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) C[(size_t)(m0 + ty * 8 + i) * N + n0 + tx * 8 + j] = acc[i][j];
}
static void sgemm_v3(int M, int N, int K, const float *A, const float *B, float *C) {
    sgemm_v3_kernel<<<dim3(N / 128, M / 128), 256>>>(M, N, K, A, B, C);
}
