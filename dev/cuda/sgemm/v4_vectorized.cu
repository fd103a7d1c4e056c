/* v4_vectorized.cu: v3 plus 16-byte global loads (one float4 of A and of B
 * per thread per slab), A stored transposed in shared memory, and 16-byte
 * shared fragment reads. The 8x8 micro-tile is still contiguous (rows
 * ty*8..ty*8+7), which makes the B fragment reads 2-way bank conflicted;
 * v5 fixes that and adds double buffering. Needs M, N % 128, K % 8 == 0. */
__global__ void __launch_bounds__(256)
sgemm_v4_kernel(int M, int N, int K, const float *A, const float *B, float *C) {
    __shared__ __align__(16) float As[8][128], Bs[8][128];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += 8) {
        float4 a4 = *(const float4 *)(A + (size_t)(m0 + tid / 2) * K + k0 + (tid % 2) * 4);
        As[(tid % 2) * 4 + 0][tid / 2] = a4.x; As[(tid % 2) * 4 + 1][tid / 2] = a4.y;
        As[(tid % 2) * 4 + 2][tid / 2] = a4.z; As[(tid % 2) * 4 + 3][tid / 2] = a4.w;
        *(float4 *)&Bs[tid / 32][(tid % 32) * 4] =
            *(const float4 *)(B + (size_t)(k0 + tid / 32) * N + n0 + (tid % 32) * 4);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float a[8], b[8];
            *(float4 *)&a[0] = *(const float4 *)&As[k][ty * 8];
            *(float4 *)&a[4] = *(const float4 *)&As[k][ty * 8 + 4];
            *(float4 *)&b[0] = *(const float4 *)&Bs[k][tx * 8];
            *(float4 *)&b[4] = *(const float4 *)&Bs[k][tx * 8 + 4];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 8; i++) {
        float *c = C + (size_t)(m0 + ty * 8 + i) * N + n0 + tx * 8;
        *(float4 *)c = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *(float4 *)(c + 4) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
}
static void sgemm_v4(int M, int N, int K, const float *A, const float *B, float *C) {
    sgemm_v4_kernel<<<dim3(N / 128, M / 128), 256>>>(M, N, K, A, B, C);
}
