/* norms.cu: layer norm and RMS norm, forward and backward, row-wise over C.
 * Forward: one block per row; the row is read once into registers (16-byte
 * vectors) when C is a multiple of the vector and C <= 8192 f32 / 16384 bf16,
 * otherwise re-read from L1/L2.
 * Backward: a grid of a few blocks per SM, each walking a strided set of rows;
 * each thread owns fixed columns, so dw/db partials need no atomics until the
 * end (one atomicAdd per column per block). For C % 4 == 0 and C <= 8192 the
 * row and the partials live in registers (x, dy read once); otherwise the
 * partials sit in shared memory and the row is read twice. */
#include "backends/cuda/common.cuh"

#define KN_NM_THREADS 256
#define KN_NM_VPT 8
#define KN_NM_REG_MAX (KN_NM_THREADS * 4 * KN_NM_VPT)

/* ---- forward ------------------------------------------------------------------------
 * Register variant: 16-byte vectors of E elements (4 f32 or 8 bf16), C % E == 0,
 * C <= 256 * E * VPT; all loads issued before the first reduction. */
template <bool RMS, bool BF16, int VPT>
__global__ void __launch_bounds__(KN_NM_THREADS)
norm_fwd_reg_kernel(void *yv, float *mean_out, float *rstd_out, const void *xv, const float *w,
                    const float *b, int C, float eps) {
    constexpr int E = BF16 ? 8 : 4;
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    float r[VPT][E];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * E;
        if (i < C) {
            if (BF16) {
                uint4 t = __ldcs((const uint4 *)((const uint16_t *)xv + row * C + i));
                uint32_t u[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
                for (int q = 0; q < 4; q++) { r[j][2 * q] = kn_bf2f(u[q] & 0xffff); r[j][2 * q + 1] = kn_bf2f(u[q] >> 16); }
            } else {
                float4 t = __ldcs((const float4 *)((const float *)xv + row * C + i));
                r[j][0] = t.x; r[j][1] = t.y; r[j][2] = t.z; r[j][3] = t.w;
            }
        }
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * E;
        if (i < C)
#pragma unroll
            for (int q = 0; q < E; q++) sum += RMS ? r[j][q] * r[j][q] : r[j][q];
    }
    sum = kn_block_sum(sum, sh);
    float mu = 0.f, rs;
    if (RMS) {
        rs = rsqrtf(sum / C + eps);
    } else {
        mu = sum / C;
        float v = 0.f;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * KN_NM_THREADS) * E;
            if (i < C)
#pragma unroll
                for (int q = 0; q < E; q++) { float d = r[j][q] - mu; v += d * d; }
        }
        v = kn_block_sum(v, sh);
        rs = rsqrtf(v / C + eps);
    }
    if (threadIdx.x == 0) {
        if (mean_out) mean_out[row] = mu;
        if (rstd_out) rstd_out[row] = rs;
    }
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * E;
        if (i < C) {
            float o[E];
#pragma unroll
            for (int h = 0; h < E / 4; h++) {
                float4 wv = __ldg((const float4 *)(w + i + 4 * h));
                float4 bv = (!RMS && b) ? __ldg((const float4 *)(b + i + 4 * h)) : make_float4(0.f, 0.f, 0.f, 0.f);
                o[4 * h + 0] = (r[j][4 * h + 0] - mu) * rs * wv.x + bv.x;
                o[4 * h + 1] = (r[j][4 * h + 1] - mu) * rs * wv.y + bv.y;
                o[4 * h + 2] = (r[j][4 * h + 2] - mu) * rs * wv.z + bv.z;
                o[4 * h + 3] = (r[j][4 * h + 3] - mu) * rs * wv.w + bv.w;
            }
            if (BF16) {
                uint4 t;
                t.x = kn_f2bf(o[0]) | ((uint32_t)kn_f2bf(o[1]) << 16);
                t.y = kn_f2bf(o[2]) | ((uint32_t)kn_f2bf(o[3]) << 16);
                t.z = kn_f2bf(o[4 % E]) | ((uint32_t)kn_f2bf(o[5 % E]) << 16);
                t.w = kn_f2bf(o[6 % E]) | ((uint32_t)kn_f2bf(o[7 % E]) << 16);
                __stcs((uint4 *)((uint16_t *)yv + row * C + i), t);
            } else {
                __stcs((float4 *)((float *)yv + row * C + i), make_float4(o[0], o[1], o[2], o[3]));
            }
        }
    }
}

/* Any C (scalar, re-reads the row). */
template <bool RMS, bool BF16>
__global__ void __launch_bounds__(KN_NM_THREADS)
norm_fwd_any_kernel(void *yv, float *mean_out, float *rstd_out, const void *xv, const float *w,
                    const float *b, int64_t C, float eps) {
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    auto X = [&](int64_t i) -> float {
        return BF16 ? kn_bf2f(((const uint16_t *)xv)[row * C + i]) : ((const float *)xv)[row * C + i];
    };
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < C; i += KN_NM_THREADS) { float t = X(i); sum += RMS ? t * t : t; }
    sum = kn_block_sum(sum, sh);
    float mu = 0.f, rs;
    if (RMS) {
        rs = rsqrtf(sum / C + eps);
    } else {
        mu = sum / C;
        float v = 0.f;
        for (int64_t i = threadIdx.x; i < C; i += KN_NM_THREADS) { float d = X(i) - mu; v += d * d; }
        v = kn_block_sum(v, sh);
        rs = rsqrtf(v / C + eps);
    }
    if (threadIdx.x == 0) {
        if (mean_out) mean_out[row] = mu;
        if (rstd_out) rstd_out[row] = rs;
    }
    for (int64_t i = threadIdx.x; i < C; i += KN_NM_THREADS) {
        float o = (X(i) - mu) * rs * w[i] + ((!RMS && b) ? b[i] : 0.f);
        if (BF16) ((uint16_t *)yv)[row * C + i] = kn_f2bf(o);
        else ((float *)yv)[row * C + i] = o;
    }
}

template <bool RMS, bool BF16>
static kn_status norm_fwd(const char *name, void *y, float *mean, float *rstd, const void *x,
                          const float *w, const float *b, int64_t rows, int64_t C, float eps,
                          void *stream) {
    KN_CUDA_REQUIRE(rows >= 0 && rows <= INT32_MAX && C > 0 && C <= INT32_MAX,
                    "%s: bad shape rows=%lld C=%lld", name, (long long)rows, (long long)C);
    if (rows == 0) return KN_OK;
    KN_CUDA_REQUIRE(y && x && w, "%s: NULL pointer (y, x and w are required)", name);
    const int E = BF16 ? 8 : 4;
    bool vec = C % E == 0 && C <= KN_NM_THREADS * E * 8 && kn_aligned16(x) && kn_aligned16(y) &&
               kn_aligned16(w) && (!b || kn_aligned16(b));
    if (vec) {
        int64_t per = (C / E + KN_NM_THREADS - 1) / KN_NM_THREADS;
        cudaStream_t st = kn_stream(stream);
#define NF_LAUNCH(V) norm_fwd_reg_kernel<RMS, BF16, V><<<(unsigned)rows, KN_NM_THREADS, 0, st>>>( \
            y, mean, rstd, x, w, b, (int)C, eps)
        if (per <= 1) NF_LAUNCH(1); else if (per <= 2) NF_LAUNCH(2); else if (per <= 4) NF_LAUNCH(4); else NF_LAUNCH(8);
#undef NF_LAUNCH
    } else
        norm_fwd_any_kernel<RMS, BF16><<<(unsigned)rows, KN_NM_THREADS, 0, kn_stream(stream)>>>(
            y, mean, rstd, x, w, b, C, eps);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

extern "C" kn_status kn_cuda_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                           const float *w, const float *b, int64_t rows,
                                           int64_t C, float eps, void *stream) {
    return norm_fwd<false, false>("kn_cuda_layernorm_fwd", y, mean, rstd, x, w, b, rows, C, eps, stream);
}
extern "C" kn_status kn_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w,
                                         int64_t rows, int64_t C, float eps, void *stream) {
    return norm_fwd<true, false>("kn_cuda_rmsnorm_fwd", y, NULL, rstd, x, w, NULL, rows, C, eps, stream);
}
extern "C" kn_status kn_cuda_rmsnorm_fwd_bf16(uint16_t *y, float *rstd, const uint16_t *x,
                                              const float *w, int64_t rows, int64_t C, float eps,
                                              void *stream) {
    return norm_fwd<true, true>("kn_cuda_rmsnorm_fwd_bf16", y, NULL, rstd, x, w, NULL, rows, C, eps, stream);
}

/* ---- backward ----------------------------------------------------------------------
 * Layer norm: xh = (x-mu)*rstd, g = dy*w,
 *   dx = rstd * (g - mean(g) - xh * mean(g*xh)),  dw += dy*xh,  db += dy.
 * RMS norm:   xh = x*rstd, g = dy*w,
 *   dx = rstd * (g - xh * mean(g*xh)),            dw += dy*xh.
 * Shared memory: dw partial [C] (+ db partial [C]). */
template <bool RMS>
__global__ void __launch_bounds__(KN_NM_THREADS)
norm_bwd_kernel(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                const float *mean, const float *rstd, int64_t rows, int C, bool vec) {
    extern __shared__ float part[];      // [C] dw, then [C] db (layer norm)
    __shared__ float sh[32];
    float *pdw = part, *pdb = part + C;
    for (int i = threadIdx.x; i < C; i += KN_NM_THREADS) { pdw[i] = 0.f; if (!RMS) pdb[i] = 0.f; }
    __syncthreads();
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float *xr = x + row * C, *dyr = dy + row * C;
        const float mu = RMS ? 0.f : mean[row], rs = rstd[row];
        float sg = 0.f, sgx = 0.f;
        if (vec) {
            for (int i = threadIdx.x * 4; i < C; i += KN_NM_THREADS * 4) {
                float4 xv = __ldg((const float4 *)(xr + i)), dv = __ldg((const float4 *)(dyr + i));
                float4 wv = __ldg((const float4 *)(w + i));
                float xa[4] = {xv.x, xv.y, xv.z, xv.w}, da[4] = {dv.x, dv.y, dv.z, dv.w};
                float wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float xh = (xa[q] - mu) * rs, g = da[q] * wa[q];
                    sg += g; sgx += g * xh;
                }
            }
        } else {
            for (int i = threadIdx.x; i < C; i += KN_NM_THREADS) {
                float xh = (xr[i] - mu) * rs, g = dyr[i] * w[i];
                sg += g; sgx += g * xh;
            }
        }
        sg = kn_block_sum(sg, sh) / C;
        sgx = kn_block_sum(sgx, sh) / C;
        float *dxr = dx + row * C;
        if (vec) {
            for (int i = threadIdx.x * 4; i < C; i += KN_NM_THREADS * 4) {
                float4 xv = __ldg((const float4 *)(xr + i)), dv = __ldg((const float4 *)(dyr + i));
                float4 wv = __ldg((const float4 *)(w + i));
                float xa[4] = {xv.x, xv.y, xv.z, xv.w}, da[4] = {dv.x, dv.y, dv.z, dv.w};
                float wa[4] = {wv.x, wv.y, wv.z, wv.w}, o[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float xh = (xa[q] - mu) * rs, g = da[q] * wa[q];
                    o[q] = rs * (g - (RMS ? 0.f : sg) - xh * sgx);
                    pdw[i + q] += da[q] * xh;
                    if (!RMS) pdb[i + q] += da[q];
                }
                *(float4 *)(dxr + i) = make_float4(o[0], o[1], o[2], o[3]);
            }
        } else {
            for (int i = threadIdx.x; i < C; i += KN_NM_THREADS) {
                float xh = (xr[i] - mu) * rs, g = dyr[i] * w[i];
                dxr[i] = rs * (g - (RMS ? 0.f : sg) - xh * sgx);
                pdw[i] += dyr[i] * xh;
                if (!RMS) pdb[i] += dyr[i];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += KN_NM_THREADS) {
        atomicAdd(dw + i, pdw[i]);
        if (!RMS) atomicAdd(db + i, pdb[i]);
    }
}

/* Block-wide sum of two values; every thread gets both. `sh` needs 64 floats. */
__device__ __forceinline__ float2 nm_block_sum2(float a, float b, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = kn_warp_sum(a);
    b = kn_warp_sum(b);
    __syncthreads();                 // sh may still be read from the previous row
    if (lane == 0) { sh[w] = a; sh[32 + w] = b; }
    __syncthreads();
    a = lane < nw ? sh[lane] : 0.f;
    b = lane < nw ? sh[32 + lane] : 0.f;
    return make_float2(kn_warp_sum(a), kn_warp_sum(b));
}

/* A thread's columns of row r of x and dy, as float4 (zeros past the row's
 * end or past the last row): the backward kernels' row load. */
template <int VPT>
__device__ __forceinline__ void nm_load_row(int64_t r, int64_t rows, int C, const float *x, const float *dy, float4 *xv,
                                            float4 *dv) {
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
        xv[j] = dv[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows && i < C) {
            xv[j] = __ldcs((const float4 *)(x + r * C + i));
            dv[j] = __ldcs((const float4 *)(dy + r * C + i));
        }
    }
}

/* Register variant (v2 of dev/cuda/norms/): C % 4 == 0, C <= 256*4*VPT.
 * Each thread owns fixed columns: the dw/db partials of all its rows stay in
 * registers, x and dy are read once, and the next row's x, dy, mean and rstd
 * are loaded before the current row's reductions, so their latency hides
 * behind the current row's arithmetic and stores (v1 waited for each row).
 * One reduction of two sums per row; float4 atomics for dw/db at the end
 * (sm_90; vatom), 4x fewer than scalar ones. With VPT = 8 (C > 4096) the
 * second row would not fit in registers (it spilled): no prefetch there. */
template <bool RMS, int VPT>
__global__ void __launch_bounds__(KN_NM_THREADS, VPT <= 4 ? 2 : 1)
norm_bwd_reg_kernel(float *dx, float *dw, float *db, const float *dy, const float *x,
                    const float *w, const float *mean, const float *rstd, int64_t rows, int C,
                    bool vatom) {
    __shared__ float sh[64];
    float pw[VPT][4] = {}, pb[VPT][4] = {};
    constexpr bool PIPE = VPT <= 4;
    float4 xc[VPT], dc[VPT], xn[PIPE ? VPT : 1], dn[PIPE ? VPT : 1];
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    auto load = [&](int64_t r, float4 *xv, float4 *dv) { nm_load_row<VPT>(r, rows, C, x, dy, xv, dv); };
    int64_t row = blockIdx.x;
    float mu = 0.f, rs = 0.f;
    if (PIPE) {
        load(row, xc, dc);
        if (row < rows) { mu = RMS ? 0.f : mean[row]; rs = rstd[row]; }
    }
    for (; row < rows; row += gridDim.x) {
        const int64_t nrow = row + gridDim.x;
        float mun = 0.f, rsn = 0.f;
        if constexpr (PIPE) {
            load(nrow, xn, dn);                                // next row, in flight
            if (nrow < rows) { mun = RMS ? 0.f : mean[nrow]; rsn = rstd[nrow]; }
        } else {
            load(row, xc, dc);
            mu = RMS ? 0.f : mean[row]; rs = rstd[row];
        }
        float sg = 0.f, sgx = 0.f;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
            float4 wv = i < C ? __ldg((const float4 *)(w + i)) : z4;
            float xa[4] = {xc[j].x, xc[j].y, xc[j].z, xc[j].w}, da[4] = {dc[j].x, dc[j].y, dc[j].z, dc[j].w};
            float wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float xh = (xa[q] - mu) * rs, g = da[q] * wa[q];
                sg += g; sgx += g * xh;
            }
        }
        float2 t = nm_block_sum2(sg, sgx, sh);
        sg = t.x / C;
        sgx = t.y / C;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
            if (i < C) {
                float4 wv = __ldg((const float4 *)(w + i));
                float xa[4] = {xc[j].x, xc[j].y, xc[j].z, xc[j].w}, da[4] = {dc[j].x, dc[j].y, dc[j].z, dc[j].w};
                float wa[4] = {wv.x, wv.y, wv.z, wv.w}, o[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float xh = (xa[q] - mu) * rs, g = da[q] * wa[q];
                    o[q] = rs * (g - (RMS ? 0.f : sg) - xh * sgx);
                    pw[j][q] += da[q] * xh;
                    if (!RMS) pb[j][q] += da[q];
                }
                __stcs((float4 *)(dx + row * C + i), make_float4(o[0], o[1], o[2], o[3]));
            }
        }
        if constexpr (PIPE) {
#pragma unroll
            for (int j = 0; j < VPT; j++) { xc[j] = xn[j]; dc[j] = dn[j]; }
            mu = mun; rs = rsn;
        }
    }
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
        if (i >= C) continue;
#if __CUDA_ARCH__ >= 900
        if (vatom) {
            atomicAdd((float4 *)(dw + i), make_float4(pw[j][0], pw[j][1], pw[j][2], pw[j][3]));
            if (!RMS) atomicAdd((float4 *)(db + i), make_float4(pb[j][0], pb[j][1], pb[j][2], pb[j][3]));
            continue;
        }
#endif
#pragma unroll
        for (int q = 0; q < 4; q++) {
            atomicAdd(dw + i + q, pw[j][q]);
            if (!RMS) atomicAdd(db + i + q, pb[j][q]);
        }
    }
}

template <bool RMS>
static kn_status norm_bwd(const char *name, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, const float *mean, const float *rstd,
                          int64_t rows, int64_t C, void *stream) {
    KN_CUDA_REQUIRE(rows >= 0 && C > 0 && C <= INT32_MAX, "%s: bad shape rows=%lld C=%lld", name,
                    (long long)rows, (long long)C);
    if (rows == 0) return KN_OK;
    KN_CUDA_REQUIRE(dx && dw && dy && x && w && rstd && (RMS || (db && mean)),
                    "%s: NULL pointer", name);
    int dev = 0, nsm = 0, maxsm = 0;
    KN_CUDA_TRY(cudaGetDevice(&dev));
    KN_CUDA_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    bool vec = C % 4 == 0 && kn_aligned16(dx) && kn_aligned16(dy) && kn_aligned16(x) && kn_aligned16(w);
    if (vec && C <= KN_NM_REG_MAX) {
        const bool vatom = kn_aligned16(dw) && (RMS || kn_aligned16(db));
        int vpt = C <= 1024 ? 1 : C <= 2048 ? 2 : C <= 4096 ? 4 : 8;
#define NB_LAUNCH(V)                                                                        \
    do {                                                                                    \
        int per_sm = 1;                                                                     \
        KN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(                          \
            &per_sm, norm_bwd_reg_kernel<RMS, V>, KN_NM_THREADS, 0));                       \
        int64_t grid = (int64_t)nsm * (per_sm < 1 ? 1 : per_sm);                            \
        if (grid > rows) grid = rows;                                                       \
        norm_bwd_reg_kernel<RMS, V><<<(unsigned)grid, KN_NM_THREADS, 0, kn_stream(stream)>>>( \
            dx, dw, db, dy, x, w, mean, rstd, rows, (int)C, vatom);                         \
    } while (0)
        if (vpt == 1) NB_LAUNCH(1); else if (vpt == 2) NB_LAUNCH(2); else if (vpt == 4) NB_LAUNCH(4); else NB_LAUNCH(8);
#undef NB_LAUNCH
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    size_t smem = (size_t)C * sizeof(float) * (RMS ? 1 : 2);
    KN_CUDA_TRY(cudaDeviceGetAttribute(&maxsm, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem + 32 * sizeof(float) > (size_t)maxsm)
        return kn_set_error(KN_ERR_UNSUPPORTED,
                            "%s: C=%lld needs %zu bytes of shared memory, the device has %d per "
                            "block; split the row or use a smaller C",
                            name, (long long)C, smem, maxsm);
    /* the static reduction buffer counts too, so set the limit every time */
    KN_CUDA_TRY(cudaFuncSetAttribute(norm_bwd_kernel<RMS>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    KN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, norm_bwd_kernel<RMS>,
                                                              KN_NM_THREADS, smem));
    if (per_sm < 1) per_sm = 1;
    int64_t grid = (int64_t)nsm * per_sm;
    if (grid > rows) grid = rows;
    norm_bwd_kernel<RMS><<<(unsigned)grid, KN_NM_THREADS, smem, kn_stream(stream)>>>(
        dx, dw, db, dy, x, w, mean, rstd, rows, (int)C, vec);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

extern "C" kn_status kn_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dy,
                                           const float *x, const float *w, const float *mean,
                                           const float *rstd, int64_t rows, int64_t C,
                                           void *stream) {
    return norm_bwd<false>("kn_cuda_layernorm_bwd", dx, dw, db, dy, x, w, mean, rstd, rows, C, stream);
}
extern "C" kn_status kn_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x,
                                         const float *w, const float *rstd, int64_t rows,
                                         int64_t C, void *stream) {
    return norm_bwd<true>("kn_cuda_rmsnorm_bwd", dx, dw, NULL, dy, x, w, NULL, rstd, rows, C, stream);
}

/* ---- fused backward for the NORM_BWD node ------------------------------------------
 * The same arithmetic as norm_bwd_reg_kernel, but the statistics are
 * recomputed from the row held in registers (the graph keeps no mean/rstd:
 * two block reductions a layer-norm row, one an RMS row, both two-pass
 * accurate since the row is in registers), w may be absent (dxhat = dy), and
 * dw/db are deterministic: each block writes its partial sums to `part`
 * ([grid][parts*C]) and nbf_colsum_kernel adds them up in block order.
 * C % 4 == 0, C <= KN_NM_REG_MAX. */
template <int N>
__device__ __forceinline__ void nm_block_sumn(float (&v)[N], float *sh) {   /* sh: 32*N floats */
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = kn_warp_sum(v[k]);
    __syncthreads();                 // sh may still be read from the previous reduction
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < N; k++) sh[32 * k + wp] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = kn_warp_sum(lane < nw ? sh[32 * k + lane] : 0.f);
}

template <bool RMS, int VPT>
__global__ void __launch_bounds__(KN_NM_THREADS, VPT <= 4 ? 2 : 1)
norm_bwd_fused_kernel(float *dx, float *part, int parts, const float *dy, const float *x, const float *w,
                      int64_t rows, int C, float eps) {
    __shared__ float sh[96];
    float pw[VPT][4] = {}, pb[VPT][4] = {};
    constexpr bool PIPE = VPT <= 4;
    float4 xc[VPT], dc[VPT], xn[PIPE ? VPT : 1], dn[PIPE ? VPT : 1];
    auto load = [&](int64_t r, float4 *xv, float4 *dv) { nm_load_row<VPT>(r, rows, C, x, dy, xv, dv); };
    int64_t row = blockIdx.x;
    if (PIPE) load(row, xc, dc);
    for (; row < rows; row += gridDim.x) {
        if constexpr (PIPE) load(row + gridDim.x, xn, dn);   // next row, in flight
        else load(row, xc, dc);
        float mu = 0.f;
        if (!RMS) {
            float s[1] = {0.f};
#pragma unroll
            for (int j = 0; j < VPT; j++) s[0] += (xc[j].x + xc[j].y) + (xc[j].z + xc[j].w);
            nm_block_sumn<1>(s, sh);
            mu = s[0] / C;
        }
        /* sums of (x-mu)^2, g, g*(x-mu) with g = dy*w; the padding lanes hold
         * zeros, so (0 - mu) must not count: mask by column */
        float s3[3] = {0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
            if (i >= C) continue;
            float4 wv = w ? __ldg((const float4 *)(w + i)) : make_float4(1.f, 1.f, 1.f, 1.f);
            float xa[4] = {xc[j].x, xc[j].y, xc[j].z, xc[j].w}, da[4] = {dc[j].x, dc[j].y, dc[j].z, dc[j].w};
            float wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float xm = xa[q] - mu, g = da[q] * wa[q];
                s3[0] += xm * xm; s3[1] += g; s3[2] += g * xm;
            }
        }
        nm_block_sumn<3>(s3, sh);
        const float rs = rsqrtf(s3[0] / C + eps);
        const float sg = RMS ? 0.f : s3[1] / C, sgx = s3[2] * rs / C;   // mean(g), mean(g * xhat)
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
            if (i >= C) continue;
            float4 wv = w ? __ldg((const float4 *)(w + i)) : make_float4(1.f, 1.f, 1.f, 1.f);
            float xa[4] = {xc[j].x, xc[j].y, xc[j].z, xc[j].w}, da[4] = {dc[j].x, dc[j].y, dc[j].z, dc[j].w};
            float wa[4] = {wv.x, wv.y, wv.z, wv.w}, o[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float xh = (xa[q] - mu) * rs, g = da[q] * wa[q];
                o[q] = rs * (g - sg - xh * sgx);
                pw[j][q] += da[q] * xh;
                pb[j][q] += da[q];
            }
            __stcs((float4 *)(dx + row * C + i), make_float4(o[0], o[1], o[2], o[3]));
        }
        if constexpr (PIPE) {
#pragma unroll
            for (int j = 0; j < VPT; j++) { xc[j] = xn[j]; dc[j] = dn[j]; }
        }
    }
    if (parts == 0) return;
    float *pr = part + (int64_t)blockIdx.x * parts * C;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        int i = (threadIdx.x + j * KN_NM_THREADS) * 4;
        if (i >= C) continue;
        *(float4 *)(pr + i) = make_float4(pw[j][0], pw[j][1], pw[j][2], pw[j][3]);
        if (parts > 1) *(float4 *)(pr + C + i) = make_float4(pb[j][0], pb[j][1], pb[j][2], pb[j][3]);
    }
}

/* out[c] = sum over g < G of part[g][c], c < n, in order of g: 32 columns a
 * block, 8 row lanes each adding every 8th block's partial, then the lanes'
 * sums added in lane order (fixed: the result depends only on G). */
__global__ void __launch_bounds__(256) nbf_colsum_kernel(float *out, const float *part, int G, int64_t n) {
    __shared__ float sh[8][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < n)
        for (int g = threadIdx.y; g < G; g += 8) s += part[(int64_t)g * n + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        float t = sh[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < 8; k++) t += sh[k][threadIdx.x];
        out[c] = t;
    }
}

/* Blocks for `rows` rows: as many as the SMs hold at once (asked once an
 * instantiation: kn_cuda_norm_bwd_part_floats and the launch both need it) */
template <bool RMS, int V>
static kn_status nbf_grid(int64_t rows, int *grid) {
    static int64_t full = 0;
    if (full == 0) {
        int dev = 0, nsm = 0, per_sm = 1;
        KN_CUDA_TRY(cudaGetDevice(&dev));
        KN_CUDA_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
        KN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, norm_bwd_fused_kernel<RMS, V>, KN_NM_THREADS, 0));
        full = (int64_t)nsm * (per_sm < 1 ? 1 : per_sm);
    }
    *grid = (int)(full < rows ? full : rows);
    return KN_OK;
}
static int nbf_vpt(int64_t C) { return C <= 1024 ? 1 : C <= 2048 ? 2 : C <= 4096 ? 4 : 8; }

template <bool RMS>
static kn_status nbf_grid_any(int64_t rows, int64_t C, int *grid) {
    switch (nbf_vpt(C)) {
    case 1: return nbf_grid<RMS, 1>(rows, grid);
    case 2: return nbf_grid<RMS, 2>(rows, grid);
    case 4: return nbf_grid<RMS, 4>(rows, grid);
    default: return nbf_grid<RMS, 8>(rows, grid);
    }
}

extern "C" bool kn_cuda_norm_bwd_fused_ok(int64_t C, const void *dx, const void *dy, const void *x, const void *w,
                                          const void *dwb) {
    return C > 0 && C % 4 == 0 && C <= KN_NM_REG_MAX && kn_aligned16(dx) && kn_aligned16(dy) && kn_aligned16(x) &&
           (!w || kn_aligned16(w)) && (!dwb || kn_aligned16(dwb));
}

extern "C" kn_status kn_cuda_norm_bwd_part_floats(int64_t rows, int64_t C, bool rms, int parts, int64_t *n) {
    *n = 0;
    if (parts == 0 || rows == 0) return KN_OK;
    int grid = 0;
    kn_status st = rms ? nbf_grid_any<true>(rows, C, &grid) : nbf_grid_any<false>(rows, C, &grid);
    *n = (int64_t)grid * parts * C;
    return st;
}

extern "C" kn_status kn_cuda_norm_bwd_fused(float *dx, float *dwb, int parts, const float *dy, const float *x,
                                            const float *w, float eps, bool rms, int64_t rows, int64_t C,
                                            float *part, void *stream) {
    KN_CUDA_REQUIRE(rows >= 0 && kn_cuda_norm_bwd_fused_ok(C, dx, dy, x, w, parts ? dwb : NULL) && parts >= 0 &&
                        parts <= (rms ? 1 : 2) && (parts == 0 || (dwb && part)),
                    "kn_cuda_norm_bwd_fused: bad arguments (rows=%lld C=%lld parts=%d)", (long long)rows,
                    (long long)C, parts);
    cudaStream_t st = kn_stream(stream);
    if (rows == 0) {
        if (parts) KN_CUDA_TRY(cudaMemsetAsync(dwb, 0, sizeof(float) * (size_t)(parts * C), st));
        return KN_OK;
    }
    int grid = 0;
    kn_status s = rms ? nbf_grid_any<true>(rows, C, &grid) : nbf_grid_any<false>(rows, C, &grid);
    if (s) return s;
#define NBF(R, V) norm_bwd_fused_kernel<R, V><<<(unsigned)grid, KN_NM_THREADS, 0, st>>>(dx, part, parts, dy, x, w, rows, (int)C, eps)
#define NBF_V(R)                                                                                   \
    switch (nbf_vpt(C)) {                                                                          \
    case 1: NBF(R, 1); break;                                                                      \
    case 2: NBF(R, 2); break;                                                                      \
    case 4: NBF(R, 4); break;                                                                      \
    default: NBF(R, 8); break;                                                                     \
    }
    if (rms) { NBF_V(true) } else { NBF_V(false) }
#undef NBF_V
#undef NBF
    KN_CUDA_LAUNCHED();
    if (parts) {
        int64_t n = (int64_t)parts * C;
        nbf_colsum_kernel<<<(unsigned)((n + 31) / 32), dim3(32, 8), 0, st>>>(dwb, part, grid, n);
        KN_CUDA_LAUNCHED();
    }
    return KN_OK;
}
