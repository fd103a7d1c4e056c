/* cuda_ops_loss.cu: CROSS_ENTROPY and CROSS_ENTROPY_BWD on the GPU (the
 * formulas of src/graph/ops_loss.c).
 *
 * Letters: N rows, C classes, Cp the gradient's row width (C rounded up to
 * 8; pad columns written 0). One block per row.
 *
 * Fast path (f32, bf16, f16 logits with unit class stride, any row stride;
 * i32/i64 targets; f32 loss; a gradient row start 16-byte aligned): the
 * row is read as stored in 16-byte vectors (8 bf16/f16 or 4 f32; a
 * misaligned row start, as with C = 50257, takes a few scalar loads first)
 * and each thread keeps an online (max, sum of exp) pair in f32, merged
 * over the block (kn_ms_merge). The forward writes lse - x_t (with label
 * smoothing, also - ls/C sum x). The gradient makes that pass again, then
 * one pass writing g (exp(x - lse) - ls/C) - g (1 - ls) [j == t] in 16-byte
 * stores of aligned output (its second read of the row mostly hits L2).
 * Everything else (f64 logits, other layouts or id dtypes) runs the generic
 * kernel, in double through kn_dview like the reference.
 *
 * Bad targets: a first small kernel checks every target and sets the op's
 * error slot (code 3, read at the next synchronize); the row kernels write
 * nothing once the slot is set.
 */
#include "backends/cuda/cuda_ops.cuh"
#include <cuda_fp16.h>     // defines: __half2float, __float2half_rn

#define CE_THREADS 512

/* ---- targets ---- */
__device__ __forceinline__ int64_t ce_id(const kn_dview &v, int64_t i) {
    int64_t o = i * v.st[0];
    switch (v.dtype) {
    case KN_I64: return ((const int64_t *)v.data)[o];
    case KN_I32: return ((const int32_t *)v.data)[o];
    case KN_I8: return ((const int8_t *)v.data)[o];
    case KN_U8: return ((const uint8_t *)v.data)[o];
    default: return (int64_t)kn_dget(v, o);
    }
}
__global__ void k_ce_check(kn_dview tg, int64_t N, int64_t C, int64_t ign, kn_cu_err *err) {
    KN_GRID_LOOP(i, N) {
        int64_t t = ce_id(tg, i);
        if (t != ign && (t < 0 || t >= C))
            kn_cu_err_set(err, 3, ign < INT32_MIN ? INT32_MIN : ign > INT32_MAX ? INT32_MAX : (int)ign, (double)t, C);
    }
}

/* ---- element access of the fast path: DT 0 f32, 1 bf16, 2 f16 ---- */
template <int DT> struct ce_t { static const int VEC = 8, ESZ = 2; };
template <> struct ce_t<0> { static const int VEC = 4, ESZ = 4; };

template <int DT> __device__ __forceinline__ float ce_ld1(const char *row, int64_t j) {
    if (DT == 0) return __ldg((const float *)row + j);
    uint16_t h = __ldg((const unsigned short *)row + j);
    return DT == 1 ? kn_bf2f(h) : __half2float(__ushort_as_half(h));
}
/* VEC elements from a 16-byte aligned address */
template <int DT> __device__ __forceinline__ void ce_ldv(const char *p, float *v) {
    uint4 u = __ldg((const uint4 *)p);
    if (DT == 0) { v[0] = __uint_as_float(u.x); v[1] = __uint_as_float(u.y); v[2] = __uint_as_float(u.z); v[3] = __uint_as_float(u.w); return; }
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint16_t lo = (uint16_t)(w[k] & 0xffff), hi = (uint16_t)(w[k] >> 16);
        v[2 * k] = DT == 1 ? kn_bf2f(lo) : __half2float(__ushort_as_half(lo));
        v[2 * k + 1] = DT == 1 ? kn_bf2f(hi) : __half2float(__ushort_as_half(hi));
    }
}
template <int DT> __device__ __forceinline__ uint32_t ce_pack2(float a, float b) {
    uint16_t lo = DT == 1 ? kn_f2bf(a) : __half_as_ushort(__float2half_rn(a));
    uint16_t hi = DT == 1 ? kn_f2bf(b) : __half_as_ushort(__float2half_rn(b));
    return (uint32_t)lo | ((uint32_t)hi << 16);
}
template <int DT> __device__ __forceinline__ void ce_stv(char *p, const float *v) {
    uint4 u;
    if (DT == 0) u = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    else u = make_uint4(ce_pack2<DT>(v[0], v[1]), ce_pack2<DT>(v[2], v[3]), ce_pack2<DT>(v[4], v[5]), ce_pack2<DT>(v[6], v[7]));
    *(uint4 *)p = u;
}

/* One pass over row[0, C): the block's (m, s = sum exp(x - m)) and sum x
 * (only when want_sx). Every thread gets the results. */
template <int DT> __device__ void ce_row_stats(const char *row, int64_t C, bool want_sx, float &m_out, float &s_out, float &sx_out) {
    const int VEC = ce_t<DT>::VEC, ESZ = ce_t<DT>::ESZ;
    __shared__ float sh_m[32], sh_s[32], sh_x[32];
    float m = -INFINITY, s = 0.f, sx = 0.f;
    /* elements before the first 16-byte boundary, then whole vectors, then the tail */
    int64_t head = (int64_t)(((16 - ((uintptr_t)row & 15)) & 15) / ESZ);
    if (head > C) head = C;
    int64_t nv = (C - head) / VEC, tail0 = head + nv * VEC;
    for (int64_t j = threadIdx.x; j < head; j += blockDim.x) { float v = ce_ld1<DT>(row, j); kn_ms_merge(m, s, v, 1.f); sx += v; }
    const char *body = row + head * ESZ;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
        float v[VEC];
        ce_ldv<DT>(body + k * 16, v);
        float mv = v[0];
#pragma unroll
        for (int q = 1; q < VEC; q++) mv = fmaxf(mv, v[q]);
        float sv = 0.f;
#pragma unroll
        for (int q = 0; q < VEC; q++) { sv += mv != -INFINITY ? __expf(v[q] - mv) : 0.f; sx += v[q]; }
        if (mv != mv || sv != sv) mv = sv = __int_as_float(0x7fc00000);   /* a NaN: kn_ms_merge spreads it */
        kn_ms_merge(m, s, mv, sv);
    }
    for (int64_t j = tail0 + threadIdx.x; j < C; j += blockDim.x) { float v = ce_ld1<DT>(row, j); kn_ms_merge(m, s, v, 1.f); sx += v; }
    /* merge over the warp, then over the warps */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
        if (want_sx) sx += __shfl_xor_sync(0xffffffffu, sx, o);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();                       /* the previous row's readers are done */
    if (lane == 0) { sh_m[w] = m; sh_s[w] = s; sh_x[w] = sx; }
    __syncthreads();
    m = lane < nw ? sh_m[lane] : -INFINITY;
    s = lane < nw ? sh_s[lane] : 0.f;
    sx = lane < nw ? sh_x[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kn_ms_merge(m, s, m2, s2);
        if (want_sx) sx += __shfl_xor_sync(0xffffffffu, sx, o);
    }
    m_out = m; s_out = s; sx_out = sx;
}

template <int DT>
__global__ void __launch_bounds__(CE_THREADS) k_ce_fwd(const char *x, int64_t ldx, kn_dview tg, float *y, int64_t ldy, int64_t N,
                                                       int64_t C, int64_t ign, float ls, const kn_cu_err *err) {
    if (*(volatile const int *)&err->code) return;      /* a bad target: write nothing */
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        int64_t t = ce_id(tg, r);
        if (t == ign) { if (threadIdx.x == 0) y[r * ldy] = 0.f; continue; }
        const char *row = x + r * ldx * ce_t<DT>::ESZ;
        float m, s, sx;
        ce_row_stats<DT>(row, C, ls > 0.f, m, s, sx);
        if (threadIdx.x == 0) {
            float xt = ce_ld1<DT>(row, t);
            y[r * ldy] = (m + logf(s)) - (1.f - ls) * xt - (ls > 0.f ? ls / (float)C * sx : 0.f);
        }
    }
}

/* dst rows of Cp (% VEC == 0) elements, 16-byte aligned */
template <int DT>
__global__ void __launch_bounds__(CE_THREADS) k_ce_bwd(char *d, int64_t ldd, int64_t Cp, const char *x, int64_t ldx, kn_dview tg,
                                                       kn_dview g, int64_t N, int64_t C, int64_t ign, float ls, const kn_cu_err *err) {
    const int VEC = ce_t<DT>::VEC, ESZ = ce_t<DT>::ESZ;
    if (*(volatile const int *)&err->code) return;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        int64_t t = ce_id(tg, r);
        char *out = d + r * ldd * ESZ;
        if (t == ign) {
            for (int64_t k = threadIdx.x; k < Cp / VEC; k += blockDim.x) *(uint4 *)(out + k * 16) = make_uint4(0, 0, 0, 0);
            continue;
        }
        const char *row = x + r * ldx * ESZ;
        float m, s, sx;
        ce_row_stats<DT>(row, C, false, m, s, sx);
        float gi = (float)kn_dget(g, r * g.st[0]);
        float lse = m + logf(s), off = gi * ls / (float)C, gt = gi * (1.f - ls);
        bool aligned = ((uintptr_t)row & 15) == 0;
        for (int64_t k = threadIdx.x; k < Cp / VEC; k += blockDim.x) {
            int64_t j0 = k * VEC;
            float v[VEC];
            if (aligned && j0 + VEC <= C) ce_ldv<DT>(row + j0 * ESZ, v);
            else {
#pragma unroll
                for (int q = 0; q < VEC; q++) v[q] = j0 + q < C ? ce_ld1<DT>(row, j0 + q) : 0.f;
            }
#pragma unroll
            for (int q = 0; q < VEC; q++) {
                int64_t j = j0 + q;
                v[q] = j < C ? gi * __expf(v[q] - lse) - off - (j == t ? gt : 0.f) : 0.f;
            }
            ce_stv<DT>(out + j0 * ESZ, v);
        }
    }
}

/* ---- generic: any layout and dtype, double arithmetic ---- */
__global__ void __launch_bounds__(KN_THREADS) k_ce_generic(kn_dview x, kn_dview tg, kn_dview g, kn_dview d, int bwd, int64_t N,
                                                           int64_t C, int64_t ign, double ls, const kn_cu_err *err) {
    __shared__ double sh[32];
    if (*(volatile const int *)&err->code) return;
    int64_t Cp = bwd ? d.ne[1] : 0;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        int64_t t = ce_id(tg, r);
        if (t == ign) {
            if (!bwd) { if (threadIdx.x == 0) kn_dput(d, r * d.st[0], 0.0); }
            else for (int64_t j = threadIdx.x; j < Cp; j += blockDim.x) kn_dput(d, r * d.st[0] + j * d.st[1], 0.0);
            continue;
        }
        int64_t xo = r * x.st[0];
        double m = -INFINITY, s = 0, sx = 0;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) { double v = kn_dget(x, xo + j * x.st[1]); if (v > m) m = v; sx += v; }
        m = kn_dblock_max(m, sh);
        if (ls > 0) sx = kn_dblock_sum(sx, sh);
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += exp(kn_dget(x, xo + j * x.st[1]) - m);
        s = kn_dblock_sum(s, sh);
        if (!bwd) {
            if (threadIdx.x == 0)
                kn_dput(d, r * d.st[0], m + log(s) - (1 - ls) * kn_dget(x, xo + t * x.st[1]) - (ls > 0 ? ls / (double)C * sx : 0));
        } else {
            double gi = kn_dget(g, r * g.st[0]);
            for (int64_t j = threadIdx.x; j < Cp; j += blockDim.x) {
                double v = 0;
                if (j < C) v = gi * (exp(kn_dget(x, xo + j * x.st[1]) - m) / s - (j == t ? 1 - ls : 0) - ls / (double)C);
                kn_dput(d, r * d.st[0] + j * d.st[1], v);
            }
        }
        __syncthreads();
    }
}

static unsigned ce_blocks(int64_t rows) { return rows > 1048576 ? 1048576u : (unsigned)(rows > 0 ? rows : 1); }

kn_status kn_cu_cross_entropy(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *tg = &e->src[1], *d = &e->dst;
    bool bwd = t->op == KN_OP_CROSS_ENTROPY_BWD;
    int64_t N = x->ne[0], C = x->ne[1], ign = t->p.ce.ignore_index;
    double ls = t->p.ce.smoothing;
    if (N == 0) return KN_OK;
    kn_cu_err *err = kn_cu_err_dev(t->op);
    k_ce_check<<<kn_blocks(N), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(tg), N, C, ign, err);
    KN_CUDA_LAUNCHED();
    const kn_tview *g = bwd ? &e->src[2] : tg;
    int dt = x->dtype == KN_F32 ? 0 : x->dtype == KN_BF16 ? 1 : x->dtype == KN_F16 ? 2 : -1;
    bool fast = dt >= 0 && (x->st[1] == 1 || C == 1) && (tg->dtype == KN_I64 || tg->dtype == KN_I32) && !kn_env_get()->cuda_generic;
    if (fast && !bwd) fast = d->dtype == KN_F32;
    if (fast && bwd) {
        int vec = dt == 0 ? 4 : 8;
        fast = d->dtype == x->dtype && (d->st[1] == 1 || d->ne[1] == 1) && d->ne[1] % vec == 0 && d->st[0] % vec == 0 &&
               kn_aligned16(d->data) && (dt == 0 ? (uintptr_t)x->data % 4 == 0 : (uintptr_t)x->data % 2 == 0);
    }
    unsigned nb = ce_blocks(N);
    if (fast && !bwd) {
        cudaStream_t s = kn_cu_stream();
        const char *xp = (const char *)x->data;
        float *y = (float *)d->data;
        if (dt == 0) k_ce_fwd<0><<<nb, CE_THREADS, 0, s>>>(xp, x->st[0], kn_dv(tg), y, d->st[0], N, C, ign, (float)ls, err);
        else if (dt == 1) k_ce_fwd<1><<<nb, CE_THREADS, 0, s>>>(xp, x->st[0], kn_dv(tg), y, d->st[0], N, C, ign, (float)ls, err);
        else k_ce_fwd<2><<<nb, CE_THREADS, 0, s>>>(xp, x->st[0], kn_dv(tg), y, d->st[0], N, C, ign, (float)ls, err);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    if (fast && bwd) {
        cudaStream_t s = kn_cu_stream();
        const char *xp = (const char *)x->data;
        char *dp = (char *)d->data;
        int64_t Cp = d->ne[1];
        if (dt == 0) k_ce_bwd<0><<<nb, CE_THREADS, 0, s>>>(dp, d->st[0], Cp, xp, x->st[0], kn_dv(tg), kn_dv(g), N, C, ign, (float)ls, err);
        else if (dt == 1) k_ce_bwd<1><<<nb, CE_THREADS, 0, s>>>(dp, d->st[0], Cp, xp, x->st[0], kn_dv(tg), kn_dv(g), N, C, ign, (float)ls, err);
        else k_ce_bwd<2><<<nb, CE_THREADS, 0, s>>>(dp, d->st[0], Cp, xp, x->st[0], kn_dv(tg), kn_dv(g), N, C, ign, (float)ls, err);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    k_ce_generic<<<ce_blocks(N), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(tg), kn_dv(g), kn_dv(d), bwd, N, C, ign, ls, err);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
