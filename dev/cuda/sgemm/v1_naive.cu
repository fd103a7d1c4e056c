/* v1_naive.cu: one thread per C element, K loop straight from global memory.
 * Row-major C[M,N] = A[M,K] @ B[K,N]. threadIdx.x runs along N so that the
 * B reads and C writes of a warp are coalesced (A reads are broadcasts). */
__global__ void sgemm_v1_kernel(int M, int N, int K, const float *A, const float *B, float *C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; k++) acc += A[(size_t)m * K + k] * B[(size_t)k * N + n];
    C[(size_t)m * N + n] = acc;
}
static void sgemm_v1(int M, int N, int K, const float *A, const float *B, float *C) {
    dim3 blk(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    sgemm_v1_kernel<<<grid, blk>>>(M, N, K, A, B, C);
}
