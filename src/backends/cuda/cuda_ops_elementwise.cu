/* cuda_ops_elementwise.cu: creation (fill, arange, eye, rand, randperm),
 * copy/cast, assign, tri, where, unary and binary math on the GPU.
 * Same formulas as src/backends/ref/ref_elementwise.c, in double; the unary
 * and binary math is the op table's, compiled from graph/scalar_ops.h. */
#include "backends/cuda/cuda_ops.cuh"
#include "graph/scalar_ops.h"   // defines: kn_scalar_unary, kn_scalar_binary (from kiln_ops.def)
#include <stdlib.h>
#include <string.h>

/* Drop size-1 dims and merge dims that are contiguous in every view (all
 * views share the extents ne). Cuts the per-element index arithmetic. */
static void collapse(kn_tview **v, int nv) {
    int nd = v[0]->ndim, o = 0;
    for (int d = 0; d < nd; d++) {
        if (v[0]->ne[d] == 1) continue;
        for (int k = 0; k < nv; k++) { v[k]->ne[o] = v[k]->ne[d]; v[k]->st[o] = v[k]->st[d]; }
        o++;
    }
    for (int k = 0; k < nv; k++) v[k]->ndim = o;
    nd = o;
    o = 0;
    for (int d = 1; d < nd; d++) {
        bool merge = true;
        for (int k = 0; k < nv; k++) if (v[k]->st[o] != v[k]->st[d] * v[k]->ne[d]) merge = false;
        for (int k = 0; k < nv; k++) {
            if (merge) { v[k]->ne[o] *= v[k]->ne[d]; v[k]->st[o] = v[k]->st[d]; }
            else { v[k]->ne[o + 1] = v[k]->ne[d]; v[k]->st[o + 1] = v[k]->st[d]; }
        }
        if (!merge) o++;
    }
    for (int k = 0; k < nv; k++) v[k]->ndim = nd ? o + 1 : 0;
}

/* ---- Philox4x32-10 and kn_rand_at, as src/core/philox.c ---- */
__device__ void kn_dphilox(uint64_t ctr, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0x2545F491u, c3 = 0x9E3779B9u;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
__device__ double kn_drand_at(int kind, double a, double b, uint64_t seed, uint64_t i) {
    uint32_t r[4];
    kn_dphilox(i, seed, r);
    double u0 = (double)(r[0] >> 8) * (1.0 / 16777216.0);
    switch (kind) {
    case KN_RAND_UNIFORM: return a + (b - a) * u0;
    case KN_RAND_BERNOULLI: return u0 < a ? 1.0 : 0.0;
    case KN_RAND_NORMAL: {
        double u1 = ((double)(r[1] >> 8) + 1.0) * (1.0 / 16777216.0);
        return a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u0);
    }
    case KN_RAND_INT: {
        uint64_t range = (uint64_t)(b - a);
        uint64_t x = ((uint64_t)r[2] << 32) | r[3];
        return a + (double)__umul64hi(x, range);
    }
    }
    return 0;
}

__global__ void k_create(kn_dview d, int64_t n, int op, double a, double b) {
    KN_GRID_LOOP(i, n) {
        double v;
        if (op == KN_OP_FILL) v = a;
        else if (op == KN_OP_ARANGE) v = a + (double)i * b;
        else v = (i / d.ne[1]) == (i % d.ne[1]) ? 1.0 : 0.0;
        kn_dput(d, kn_doff(d, i), v);
    }
}
__global__ void k_rand(kn_dview d, int64_t n, int kind, double a, double b, uint64_t seed, kn_dview off, int has_off) {
    if (has_off) seed += (uint64_t)kn_dget(off, 0) * 0x9E3779B97F4A7C15ull;
    KN_GRID_LOOP(i, n) kn_dput(d, kn_doff(d, i), kn_drand_at(kind, a, b, seed, (uint64_t)i));
}

typedef struct { uint64_t key; int64_t i; } rp_kv;
static int cmp_key(const void *x, const void *y) {
    const rp_kv *a = (const rp_kv *)x, *b = (const rp_kv *)y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->i < b->i ? -1 : 1;
}

/* randperm sorts (key, index) pairs: done on the host, then stored on the device */
static kn_status randperm(const kn_exec *e, int64_t n) {
    const kn_tensor *t = e->node;
    uint64_t seed = t->p.rand.seed;
    if (e->nsrc > 0) {
        double o;
        kn_tview s = e->src[0];
        size_t ts = kn_dtype_get(s.dtype)->type_size;
        char buf[8];
        kn_status cs = kn_cu_d2h(buf, s.data, ts);
        if (cs) return cs;
        o = kn_load(s.dtype, buf, 0);
        seed += (uint64_t)o * 0x9E3779B97F4A7C15ull;
    }
    rp_kv *a = (rp_kv *)malloc(sizeof *a * (size_t)n);
    double *h = (double *)malloc(sizeof(double) * (size_t)n);
    if (!a || !h) { free(a); free(h); return kn_set_error(KN_ERR_NOMEM, "randperm: out of host memory for %lld elements", (long long)n); }
    for (int64_t i = 0; i < n; i++) {
        uint32_t r[4];
        kn_philox4x32((uint64_t)i, seed, r);
        a[i].key = ((uint64_t)r[0] << 32) | r[1]; a[i].i = i;
    }
    qsort(a, (size_t)n, sizeof *a, cmp_key);
    for (int64_t i = 0; i < n; i++) h[i] = (double)a[i].i;
    free(a);
    double *dv = NULL;
    kn_status st = kn_cu_tmp(sizeof(double) * (size_t)n, (void **)&dv);
    if (!st) st = kn_cu_h2d(dv, h, sizeof(double) * (size_t)n);
    free(h);
    if (!st) st = kn_cu_store_all(&e->dst, dv, n);
    kn_cu_tmp_free(dv);
    return st;
}

kn_status kn_cu_create(const kn_exec *e) {
    const kn_tensor *t = e->node;
    int64_t n = kn_tview_numel(&e->dst);
    switch (t->op) {
    case KN_OP_FILL: case KN_OP_ARANGE: case KN_OP_EYE:
        /* zeros (+0.0 is all zero bits in every dtype) of a contiguous tensor:
         * a memset (gradient buffers: [50257, 768] f32 took 0.2 ms in the
         * double kernel below on an H200) */
        if (t->op == KN_OP_FILL && t->p.scalar.a == 0 && !signbit(t->p.scalar.a) && kn_tview_is_contiguous(&e->dst) &&
            !kn_dtype_get(e->dst.dtype)->is_quant && !kn_env_get()->cuda_generic) {
            if (n > 0 && cudaMemsetAsync(e->dst.data, 0, kn_dtype_nbytes(e->dst.dtype, n), kn_cu_stream()) != cudaSuccess)
                return kn_set_error(KN_ERR_BACKEND, "fill: cudaMemsetAsync failed");
            return KN_OK;
        }
        k_create<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), n, (int)t->op, t->p.scalar.a, t->p.scalar.b);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    case KN_OP_RAND: {
        kn_dview off = e->nsrc > 0 ? kn_dv(&e->src[0]) : kn_dv(&e->dst);
        k_rand<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), n, (int)t->p.rand.kind, t->p.rand.a, t->p.rand.b,
                                             t->p.rand.seed, off, e->nsrc > 0);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    case KN_OP_RANDPERM: return randperm(e, n);
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no creation kernel for %s", kn_op_name(t->op));
}

/* ---- copy, cast, assign, tri, where ---- */
__global__ void k_copy(kn_dview d, kn_dview s, int64_t n) {
    KN_GRID_LOOP(i, n) kn_dput(d, kn_doff(d, i), kn_dget(s, kn_doff(s, i)));
}
__global__ void k_copy_f32(float *d, const float *s, int64_t n) {
    KN_GRID_LOOP(i, n) d[i] = s[i];
}
__global__ void k_tri(kn_dview d, kn_dview s, int64_t n, int64_t R, int64_t C, int64_t k, int upper) {
    KN_GRID_LOOP(i, n) {
        int64_t c = i % C, r = (i / C) % R;
        bool keep = upper ? (c - r >= k) : (c - r <= k);
        kn_dput(d, kn_doff(d, i), keep ? kn_dget(s, kn_doff(s, i)) : 0.0);
    }
}
__global__ void k_where(kn_dview d, kn_dview c, kn_dview a, kn_dview b, int64_t n) {
    KN_GRID_LOOP(i, n)
        kn_dput(d, kn_doff(d, i), kn_dget(c, kn_doff(c, i)) != 0 ? kn_dget(a, kn_doff(a, i)) : kn_dget(b, kn_doff(b, i)));
}

/* kn_cu_gather_bits (cuda_ops.cuh): one thread per dst element, 32-bit
 * division over at most KN_MAX_DIMS extents (the generic kernel's 64-bit
 * divisions and double round trip made a [B,T,H,D] permute copy compute
 * bound at ~0.5 TB/s) */
struct gather_geo {
    int nd;
    uint32_t ne[KN_MAX_DIMS], sne[KN_MAX_DIMS];
    int32_t lo[KN_MAX_DIMS];
    int64_t st[KN_MAX_DIMS];
};
template <typename T, bool BOUNDS>
__global__ void k_gather_bits(T *__restrict__ d, const T *__restrict__ s, gather_geo g, uint32_t n, T fill) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t r = i;
        int64_t off = 0;
        bool in = true;
#pragma unroll
        for (int k = KN_MAX_DIMS - 1; k >= 0; k--) {
            if (k >= g.nd) continue;
            uint32_t c = r % g.ne[k];
            r /= g.ne[k];
            if (BOUNDS) {
                int32_t j = (int32_t)c - g.lo[k];
                in = in && j >= 0 && (uint32_t)j < g.sne[k];
                off += (int64_t)j * g.st[k];
            } else {
                off += (int64_t)c * g.st[k];
            }
        }
        d[i] = in ? s[off] : fill;
    }
}
kn_status kn_cu_gather_bits(void *dst, const void *src, int esize, int nd, const int64_t *ne, const int64_t *st,
                            const int64_t *lo, const int64_t *sne, uint32_t fill, int64_t n) {
    if ((esize != 2 && esize != 4) || n <= 0 || n > INT32_MAX || nd > KN_MAX_DIMS || kn_env_get()->cuda_generic) return KN_ERR_UNSUPPORTED;
    kn_tview sv = {}, dv = {};
    if (!lo && !sne && nd >= 1) {   /* 16-byte words when the last dim's runs allow (a permute copy's [.., D] rows) */
        sv.data = (void *)src; sv.ndim = nd; dv.data = dst; dv.ndim = nd;
        for (int k = nd - 1, c = 1; k >= 0; c *= (int)ne[k], k--) { sv.ne[k] = dv.ne[k] = ne[k]; sv.st[k] = st[k]; dv.st[k] = c; }
        kn_tview *vv[2] = {&sv, &dv};
        if (kn_cu_words16(vv, 2, esize)) { ne = sv.ne; st = sv.st; n /= 16 / esize; esize = 16; }
    }
    gather_geo g;
    memset(&g, 0, sizeof g);
    g.nd = nd;
    for (int k = 0; k < nd; k++) {
        if (ne[k] <= 0 || ne[k] > INT32_MAX || (lo && (lo[k] > INT32_MAX || lo[k] < -INT32_MAX)) || (sne && sne[k] > INT32_MAX))
            return KN_ERR_UNSUPPORTED;
        g.ne[k] = (uint32_t)ne[k]; g.st[k] = st[k];
        g.lo[k] = lo ? (int32_t)lo[k] : 0; g.sne[k] = sne ? (uint32_t)sne[k] : (uint32_t)ne[k];
    }
    bool bounds = lo || sne;
    unsigned blocks = kn_blocks(n);
    cudaStream_t s = kn_cu_stream();
    if (esize == 16) {                 /* words: no bounds (lo, sne NULL) */
        k_gather_bits<uint4, false><<<blocks, KN_THREADS, 0, s>>>((uint4 *)dst, (const uint4 *)src, g, (uint32_t)n, make_uint4(0, 0, 0, 0));
    } else if (esize == 4) {
        if (bounds) k_gather_bits<uint32_t, true><<<blocks, KN_THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, g, (uint32_t)n, fill);
        else k_gather_bits<uint32_t, false><<<blocks, KN_THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, g, (uint32_t)n, fill);
    } else {
        if (bounds) k_gather_bits<uint16_t, true><<<blocks, KN_THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, g, (uint32_t)n, (uint16_t)fill);
        else k_gather_bits<uint16_t, false><<<blocks, KN_THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, g, (uint32_t)n, (uint16_t)fill);
    }
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* Contiguous casts among f32, bf16 and f16 (a mixed-precision step casts
 * every matmul operand and gradient): typed loads and stores through float,
 * which is exact for these three, so the bits equal k_copy's (through
 * double); k_copy's per-element dtype switch and index arithmetic ran a
 * [8192, 3072] f32 -> bf16 cast at ~0.7 TB/s. */
struct cv_f32 { typedef float raw; static __device__ __forceinline__ float get(float v) { return v; }
                static __device__ __forceinline__ float put(float f) { return f; } };
struct cv_bf16 { typedef uint16_t raw; static __device__ __forceinline__ float get(uint16_t v) { return kn_bf2f(v); }
                 static __device__ __forceinline__ uint16_t put(float f) { return kn_f2bf(f); } };
struct cv_f16 { typedef uint16_t raw; static __device__ __forceinline__ float get(uint16_t v) { return kn_dev_h2f(v); }
                static __device__ __forceinline__ uint16_t put(float f) { return kn_dev_f2h(f); } };
template <class I, class O>
__global__ void k_cast(typename O::raw *__restrict__ d, const typename I::raw *__restrict__ s, int64_t n) {
    KN_GRID_LOOP(i, n) d[i] = O::put(I::get(s[i]));
}
template <class I>
static void cast_from(kn_dtype od, void *d, const void *s, int64_t n) {
    const typename I::raw *si = (const typename I::raw *)s;
    if (od == KN_F32) k_cast<I, cv_f32><<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>((float *)d, si, n);
    else if (od == KN_BF16) k_cast<I, cv_bf16><<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>((uint16_t *)d, si, n);
    else k_cast<I, cv_f16><<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>((uint16_t *)d, si, n);
}
static bool cast_dt(kn_dtype t) { return t == KN_F32 || t == KN_BF16 || t == KN_F16; }

/* A cast between views whose rows are unit-stride runs (a column block of
 * a fused q|k|v product, a prefix of a KV cache into a buffer laid out for
 * the longest prefix): [R0, R1, C] (R0 = 1 for two dims) with row strides
 * (st0, st1) in the source and (dt0, dt1) in dst. k_copy's per-element double
 * path ran a [512, 4096] block of a [512, 6144] bf16 product at 25 us; index
 * math in 32 bits when n allows (NARROW). */
template <class I, class O, bool NARROW>
__global__ void k_cast_rows(typename O::raw *__restrict__ d, const typename I::raw *__restrict__ s, int64_t n, int64_t C,
                            int64_t R1, int64_t st0, int64_t st1, int64_t dt0, int64_t dt1) {
    KN_GRID_LOOP(i, n) {
        int64_t r, c, r0, r1;
        if (NARROW) {
            uint32_t u = (uint32_t)i, ru = u / (uint32_t)C;
            r = ru; c = u - ru * (uint32_t)C; r0 = ru / (uint32_t)R1; r1 = ru - (uint32_t)r0 * (uint32_t)R1;
        } else {
            r = i / C; c = i - r * C; r0 = r / R1; r1 = r % R1;
        }
        d[r0 * dt0 + r1 * dt1 + c] = O::put(I::get(s[r0 * st0 + r1 * st1 + c]));
    }
}
template <class I, class O>
static void cast_rows_to(void *d, const kn_tview *dv, const kn_tview *v, int64_t n) {
    const typename I::raw *si = (const typename I::raw *)v->data;
    typename O::raw *di = (typename O::raw *)d;
    int nd = v->ndim;
    int64_t C = v->ne[nd - 1], R1 = nd >= 2 ? v->ne[nd - 2] : 1, st1 = nd >= 2 ? v->st[nd - 2] : 0, st0 = nd == 3 ? v->st[0] : 0;
    int64_t dt1 = nd >= 2 ? dv->st[nd - 2] : 0, dt0 = nd == 3 ? dv->st[0] : 0;
    unsigned bl = kn_blocks(n);
    cudaStream_t cs = kn_cu_stream();
    if (n <= INT32_MAX) k_cast_rows<I, O, true><<<bl, KN_THREADS, 0, cs>>>(di, si, n, C, R1, st0, st1, dt0, dt1);
    else k_cast_rows<I, O, false><<<bl, KN_THREADS, 0, cs>>>(di, si, n, C, R1, st0, st1, dt0, dt1);
}
template <class I>
static void cast_rows_from(kn_dtype od, void *d, const kn_tview *dv, const kn_tview *v, int64_t n) {
    if (od == KN_F32) cast_rows_to<I, cv_f32>(d, dv, v, n);
    else if (od == KN_BF16) cast_rows_to<I, cv_bf16>(d, dv, v, n);
    else cast_rows_to<I, cv_f16>(d, dv, v, n);
}

/* dst = src converted; same-dtype contiguous copies are a cudaMemcpy, other
 * same-dtype copies of 2/4-byte elements into a contiguous dst a gather,
 * contiguous casts among f32/bf16/f16 k_cast */
static kn_status copy_view(const kn_tview *dst, const kn_tview *src) {
    kn_tview d = *dst, s = *src;
    int64_t n = kn_tview_numel(&d);
    if (n == 0) return KN_OK;
    bool same = d.ndim == s.ndim;
    for (int i = 0; same && i < d.ndim; i++) same = d.ne[i] == s.ne[i];
    kn_tview *vv[2] = {&d, &s};
    if (same) collapse(vv, 2);
    else { collapse(vv, 1); collapse(vv + 1, 1); }   /* a reshaping copy: each view keeps its row-major order */
    if (d.dtype == s.dtype && kn_tview_is_contiguous(&d) && kn_tview_is_contiguous(&s)) {
        KN_CUDA_TRY(cudaMemcpyAsync(d.data, s.data, kn_dtype_nbytes(d.dtype, n), cudaMemcpyDeviceToDevice, kn_cu_stream()));
        return KN_OK;
    }
    if (d.dtype == s.dtype && kn_tview_is_contiguous(&d)) {
        kn_status st = kn_cu_gather_bits(d.data, s.data, (int)kn_dtype_get(d.dtype)->type_size, s.ndim, s.ne, s.st, NULL, NULL, 0, n);
        if (st != KN_ERR_UNSUPPORTED) return st;
    }
    if (d.dtype != s.dtype && cast_dt(d.dtype) && cast_dt(s.dtype) && kn_tview_is_contiguous(&d) && kn_tview_is_contiguous(&s) &&
        !kn_env_get()->cuda_generic) {
        if (s.dtype == KN_F32) cast_from<cv_f32>(d.dtype, d.data, s.data, n);
        else if (s.dtype == KN_BF16) cast_from<cv_bf16>(d.dtype, d.data, s.data, n);
        else cast_from<cv_f16>(d.dtype, d.data, s.data, n);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    if (cast_dt(d.dtype) && cast_dt(s.dtype) && same && d.ndim == s.ndim && s.ndim >= 1 && s.ndim <= 3 &&
        s.st[s.ndim - 1] == 1 && d.st[d.ndim - 1] == 1 && !kn_env_get()->cuda_generic) {
        if (s.dtype == KN_F32) cast_rows_from<cv_f32>(d.dtype, d.data, &d, &s, n);
        else if (s.dtype == KN_BF16) cast_rows_from<cv_bf16>(d.dtype, d.data, &d, &s, n);
        else cast_rows_from<cv_f16>(d.dtype, d.data, &d, &s, n);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    k_copy<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&d), kn_dv(&s), n);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

kn_status kn_cu_copy(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst;
    int64_t n = kn_tview_numel(d);
    switch (t->op) {
    case KN_OP_COPY: case KN_OP_CAST: return copy_view(d, &e->src[0]);
    case KN_OP_ASSIGN: {
        if (n == 0) return KN_OK;
        kn_tview s = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
        /* read everything first: src may overlap dst (x = x.T) */
        double *tmp = NULL;
        kn_status st = kn_cu_tmp(sizeof(double) * (size_t)n, (void **)&tmp);
        if (st) return st;
        st = kn_cu_load_all(&s, tmp, n);
        if (!st) st = kn_cu_store_all(d, tmp, n);
        kn_cu_tmp_free(tmp);
        return st;
    }
    case KN_OP_TRI: {
        int64_t R = d->ne[d->ndim - 2], C = d->ne[d->ndim - 1];
        k_tri<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(d), kn_dv(&e->src[0]), n, R, C, t->p.tri.k, t->p.tri.upper);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    case KN_OP_WHERE: {
        kn_tview dd = *d;
        kn_tview c = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
        kn_tview a = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
        kn_tview b = kn_tview_broadcast(&e->src[2], d->ndim, d->ne);
        kn_tview *vv[4] = {&dd, &c, &a, &b};
        collapse(vv, 4);
        k_where<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&dd), kn_dv(&c), kn_dv(&a), kn_dv(&b), n);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no kernel for %s", kn_op_name(t->op));
}

/* ---- unary ----
 * kn_scalar_unary / kn_scalar_binary: the op table's scalar functions
 * (graph/scalar_ops.h), the same source as the reference backend's. */
__global__ void k_unary(kn_dview d, kn_dview s, int64_t n, int op, double a, double b) {
    KN_GRID_LOOP(i, n) kn_dput(d, kn_doff(d, i), kn_scalar_unary(op, kn_dget(s, kn_doff(s, i)), a, b));
}
/* f32 contiguous: float math is enough for the common activations */
__global__ void k_unary_f32(float *y, const float *x, int64_t n, int op, double a, double b) {
    KN_GRID_LOOP(i, n) y[i] = (float)kn_scalar_unary(op, (double)x[i], a, b);
}

kn_status kn_cu_unary(const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_tview d = e->dst, s = e->src[0];
    int64_t n = kn_tview_numel(&d);
    kn_tview *vv[2] = {&d, &s};
    collapse(vv, 2);
    if (d.dtype == KN_F32 && s.dtype == KN_F32 && kn_tview_is_contiguous(&d) && kn_tview_is_contiguous(&s))
        k_unary_f32<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>((float *)d.data, (const float *)s.data, n, (int)t->op, t->p.scalar.a, t->p.scalar.b);
    else
        k_unary<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&d), kn_dv(&s), n, (int)t->op, t->p.scalar.a, t->p.scalar.b);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- binary ---- */
__global__ void k_binary(kn_dview d, kn_dview a, kn_dview b, int64_t n, int op, int intdiv, kn_cu_err *err) {
    KN_GRID_LOOP(i, n) {
        double x = kn_dget(a, kn_doff(a, i)), y = kn_dget(b, kn_doff(b, i));
        if (intdiv && y == 0) { kn_cu_err_set(err, 2, 0, 0, 0); continue; }
        kn_dput(d, kn_doff(d, i), kn_scalar_binary(op, x, y));
    }
}

/* f32 operands of up to 4 dims (after collapse) with 32-bit extents and
 * strides: the index arithmetic in 32 bits (instead of the generic kernel's
 * 64-bit divisions per element) and the common arithmetic in float (for
 * + - * / of two floats the reference's double result rounds to the same
 * float, but for rare double-rounding cases of + and -); other ops go
 * through kn_scalar_binary in double as usual. */
__device__ __forceinline__ float bin_f32(int op, float x, float y) {
    switch (op) {
    case KN_OP_ADD: return x + y;
    case KN_OP_SUB: return x - y;
    case KN_OP_MUL: return x * y;
    case KN_OP_DIV: return x / y;
    default: return (float)kn_scalar_binary(op, x, y);
    }
}
struct bin32 {
    int nd;
    int ne[4], sd[4], sa[4], sb[4];
};
/* offsets of element lin (row-major over g.ne) in d, a and b */
__device__ __forceinline__ void bin32_offsets(const bin32 &g, int lin, int &od, int &oa, int &ob) {
    od = oa = ob = 0;
    for (int k = g.nd - 1; k >= 0; k--) {
        int q = lin % g.ne[k];
        lin /= g.ne[k];
        od += q * g.sd[k]; oa += q * g.sa[k]; ob += q * g.sb[k];
    }
}
__global__ void k_binary_f32(float *d, const float *a, const float *b, bin32 g, int n, int op) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int od, oa, ob;
        bin32_offsets(g, i, od, oa, ob);
        d[od] = bin_f32(op, a[oa], b[ob]);
    }
}
/* The same in float4s along a contiguous innermost dim (extent % 4 == 0):
 * with one float per thread too few bytes were in flight (about 1 TB/s on
 * an H200 for [64,256,1536] products); 16-byte accesses reach much closer to
 * the memory's rate. a_vec/b_vec: 1 when that operand's innermost stride is
 * 1, 0 when it is broadcast along it (one value for the four). */
__device__ __forceinline__ float4 ld4(const float *p, int vec) {
    if (vec) return *(const float4 *)p;
    float v = *p;
    return make_float4(v, v, v, v);
}
__global__ void k_binary_f32x4(float *d, const float *a, const float *b, bin32 g, int ngroups, int op, int a_vec,
                               int b_vec) {
    for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < ngroups; q += gridDim.x * blockDim.x) {
        int od, oa, ob;
        bin32_offsets(g, q * 4, od, oa, ob);
        float4 x = ld4(a + oa, a_vec), y = ld4(b + ob, b_vec), z;
        z.x = bin_f32(op, x.x, y.x); z.y = bin_f32(op, x.y, y.y);
        z.z = bin_f32(op, x.z, y.z); z.w = bin_f32(op, x.w, y.w);
        *(float4 *)(d + od) = z;
    }
}
/* innermost stride 1 or 0, every other stride and the base 16-byte aligned */
static bool vec4_ok(const kn_tview *v, bool is_dst) {
    int last = v->ndim - 1;
    if (v->st[last] != 1 && (is_dst || v->st[last] != 0)) return false;
    if (v->st[last] == 0) return true;                /* scalar loads: any alignment */
    for (int k = 0; k < last; k++) if (v->st[k] % 4) return false;
    return ((uintptr_t)v->data & 15u) == 0;
}
static bool fits_bin32(const kn_tview *v, int64_t n) {
    for (int k = 0; k < v->ndim; k++)
        if (v->ne[k] > INT32_MAX || v->st[k] < 0 || v->st[k] * (v->ne[k] - 1) >= INT32_MAX) return false;
    return n <= INT32_MAX / 2;       /* the grid-stride step must not overflow */
}

kn_status kn_cu_binary(const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_tview d = e->dst;
    kn_tview a = kn_tview_broadcast(&e->src[0], d.ndim, d.ne);
    kn_tview b = kn_tview_broadcast(&e->src[1], d.ndim, d.ne);
    int64_t n = kn_tview_numel(&d);
    bool intdiv = t->op == KN_OP_FMOD && kn_dtype_get(d.dtype)->is_int;
    kn_tview *vv[3] = {&d, &a, &b};
    collapse(vv, 3);
    if (d.dtype == KN_F32 && a.dtype == KN_F32 && b.dtype == KN_F32 && d.ndim <= 4 && fits_bin32(&d, n) &&
        fits_bin32(&a, n) && fits_bin32(&b, n)) {
        bin32 g;
        g.nd = d.ndim;
        for (int k = 0; k < 4; k++) {
            bool in = k < d.ndim;
            g.ne[k] = in ? (int)d.ne[k] : 1;
            g.sd[k] = in ? (int)d.st[k] : 0; g.sa[k] = in ? (int)a.st[k] : 0; g.sb[k] = in ? (int)b.st[k] : 0;
        }
        if (d.ndim >= 1 && d.ne[d.ndim - 1] % 4 == 0 && vec4_ok(&d, true) && vec4_ok(&a, false) && vec4_ok(&b, false)) {
            int ng = (int)(n / 4);
            k_binary_f32x4<<<kn_blocks(ng), KN_THREADS, 0, kn_cu_stream()>>>((float *)d.data, (const float *)a.data, (const float *)b.data, g,
                                                          ng, (int)t->op, a.st[d.ndim - 1] == 1, b.st[d.ndim - 1] == 1);
            KN_CUDA_LAUNCHED();
            return KN_OK;
        }
        k_binary_f32<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>((float *)d.data, (const float *)a.data, (const float *)b.data, g,
                                                   (int)n, (int)t->op);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    k_binary<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&d), kn_dv(&a), kn_dv(&b), n, (int)t->op, intdiv, kn_cu_err_dev(KN_OP_FMOD));
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
