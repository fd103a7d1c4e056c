/* rope.cu: rotary position embedding over x[n_tok, n_head, head_dim] (f32).
 * The angle pos * theta^(-2i/head_dim) is formed
 * in f32 (as the usual f32 tables do: its rounding error grows like pos * 6e-8
 * radians) and sincosf is the accurate one, not the fast intrinsic. */
#include "kernels/kernels.h"   /* their declarations (extern "C") */
#include "backends/cuda/common.cuh"

/* One thread per (token, pair index): the angle and its sincos are formed
 * once and applied to that pair in every head. */
template <typename I>   /* I: int32_t when every index fits, else int64_t */
__global__ void rope_kernel(float *y, const float *x, const int32_t *pos, I n_tp, int n_head,
                            int half, float log2_theta, bool neox, float sign) {
    I stride = (I)gridDim.x * blockDim.x;
    for (I p = (I)blockIdx.x * blockDim.x + threadIdx.x; p < n_tp; p += stride) {
        int i = (int)(p % half);
        I tok = p / half;
        float inv_freq = exp2f(-(float)(2 * i) / (float)(2 * half) * log2_theta);
        float ang = (float)pos[tok] * inv_freq, s, c;
        sincosf(ang, &s, &c);
        s *= sign;
#pragma unroll 4
        for (int h = 0; h < n_head; h++) {
            const I base = (tok * n_head + h) * 2 * half;
            if (!neox) {
                float2 v = *(const float2 *)(x + base + 2 * i);
                *(float2 *)(y + base + 2 * i) = make_float2(v.x * c - v.y * s, v.x * s + v.y * c);
            } else {
                float a = x[base + i], b = x[base + i + half];
                y[base + i] = a * c - b * s;
                y[base + i + half] = a * s + b * c;
            }
        }
    }
}

extern "C" kn_status kn_cuda_rope_f32(float *y, const float *x, const int32_t *pos, int64_t n_tok,
                                      int n_head, int head_dim, float theta, bool neox,
                                      bool inverse, void *stream) {
    KN_CUDA_REQUIRE(n_tok >= 0 && n_head > 0 && head_dim > 0 && head_dim % 2 == 0,
                    "kn_cuda_rope_f32: bad shape n_tok=%lld n_head=%d head_dim=%d (head_dim must "
                    "be even)", (long long)n_tok, n_head, head_dim);
    KN_CUDA_REQUIRE(theta > 1.f, "kn_cuda_rope_f32: theta=%g must be > 1", theta);
    if (n_tok == 0) return KN_OK;
    KN_CUDA_REQUIRE(y && x && pos, "kn_cuda_rope_f32: NULL pointer");
    KN_CUDA_REQUIRE(((uintptr_t)x % 8) == 0 && ((uintptr_t)y % 8) == 0,
                    "kn_cuda_rope_f32: x and y must be 8-byte aligned");
    int64_t n_tp = n_tok * (head_dim / 2);
    int64_t grid = (n_tp + 255) / 256;
    if (grid > 65536) grid = 65536;
    if (n_tok * n_head * (int64_t)head_dim < INT32_MAX)
        rope_kernel<int32_t><<<(unsigned)grid, 256, 0, kn_stream(stream)>>>(
            y, x, pos, (int32_t)n_tp, n_head, head_dim / 2, log2f(theta), neox, inverse ? -1.f : 1.f);
    else
        rope_kernel<int64_t><<<(unsigned)grid, 256, 0, kn_stream(stream)>>>(
            y, x, pos, n_tp, n_head, head_dim / 2, log2f(theta), neox, inverse ? -1.f : 1.f);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
