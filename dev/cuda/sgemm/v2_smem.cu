/* v2_smem.cu: 32x32 tiles of A and B staged through shared memory; each
 * element of A and B is read from global memory K/32 times fewer. Still one
 * output per thread, so the inner loop is 2 shared loads per FMA. */
__global__ void sgemm_v2_kernel(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ float As[32][33], Bs[32][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int m = blockIdx.y * 32 + ty, n = blockIdx.x * 32 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 32) {
        As[ty][tx] = (m < M && k0 + tx < K) ? A[(size_t)m * K + k0 + tx] : 0.f;
        Bs[ty][tx] = (k0 + ty < K && n < N) ? B[(size_t)(k0 + ty) * N + n] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 32; k++) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (m < M && n < N) C[(size_t)m * N + n] = acc;
}
static void sgemm_v2(int M, int N, int K, const float *A, const float *B, float *C) {
    dim3 blk(32, 32), grid((N + 31) / 32, (M + 31) / 32);
    sgemm_v2_kernel<<<grid, blk>>>(M, N, K, A, B, C);
}
