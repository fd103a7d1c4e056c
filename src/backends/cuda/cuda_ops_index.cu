/* cuda_ops_index.cu: cat, pad, gather, scatter(_add), index_select,
 * index_add and index_copy on the GPU, with the semantics of
 * src/backends/ref/ref_index.c: indices are checked (first bad one is
 * reported, naming the op); scatter_add/index_add accumulate in a double
 * copy of the output with atomics; with repeated indices scatter and
 * index_copy keep the last value in row-major order of the index (a winner
 * pass picks it, so the result does not depend on thread timing). */
#include "backends/cuda/cuda_ops.cuh"
#include <stdlib.h>
#include <string.h>

/* below 2^31 in 32-bit divisions, as kn_doff */
__device__ __forceinline__ void unravel(const int64_t *ne, int ndim, int64_t lin, int64_t *c) {
    if (lin <= INT32_MAX) {
        uint32_t l = (uint32_t)lin;
        for (int d = ndim - 1; d >= 0; d--) {
            if (ne[d] <= 0) { c[d] = 0; l = 0; continue; }   /* as below: an empty extent takes nothing */
            if (ne[d] > (int64_t)l) { c[d] = l; l = 0; continue; }
            c[d] = l % (uint32_t)ne[d];
            l /= (uint32_t)ne[d];
        }
        return;
    }
    for (int d = ndim - 1; d >= 0; d--) { c[d] = ne[d] ? lin % ne[d] : 0; lin = ne[d] ? lin / ne[d] : 0; }
}
__device__ __forceinline__ int64_t off_of(const kn_dview &v, const int64_t *c) {
    int64_t o = 0;
    for (int d = 0; d < v.ndim; d++) o += c[d] * v.st[d];
    return o;
}
__device__ __forceinline__ int64_t ravel(const int64_t *ne, int ndim, const int64_t *c) {
    int64_t lin = 0;
    for (int d = 0; d < ndim; d++) lin = lin * ne[d] + c[d];
    return lin;
}
/* index value at off of iv checked against [0, n); -1 (and the error recorded) if bad */
__device__ __forceinline__ int64_t load_index(const kn_dview &iv, int64_t off, int dim, int64_t n, kn_cu_err *err) {
    double v = kn_dget(iv, off);
    if (!(v >= 0 && v < (double)n)) { kn_cu_err_set(err, 1, dim, v, n); return -1; }
    return (int64_t)v;
}

static kn_status check_extents(const char *op, const kn_tview *iv, const kn_tview *x, int d, const char *xname) {
    for (int k = 0; k < x->ndim; k++)
        if (k != d && iv->ne[k] > x->ne[k])
            return kn_set_error(KN_ERR_INVALID, "%s: at run time the index has %lld entries in dim %d but %s has only %lld",
                                op, (long long)iv->ne[k], k, xname, (long long)x->ne[k]);
    return KN_OK;
}
static kn_status check_slices(const char *op, const kn_tview *s, const kn_tview *y, const kn_tview *iv, int d) {
    for (int k = 0; k < y->ndim; k++)
        if (k == d ? s->ne[k] > iv->ne[0] : s->ne[k] != y->ne[k])
            return kn_set_error(KN_ERR_INVALID, "%s: at run time src has %lld entries in dim %d where %s has %lld",
                                op, (long long)s->ne[k], k, k == d ? "index" : "x", (long long)(k == d ? iv->ne[0] : y->ne[k]));
    return KN_OK;
}

/* ---- cat ---- */
__global__ void k_cat(kn_dview y, kn_dview s, int d, int64_t base, int64_t n) {
    KN_GRID_LOOP(i, n) {
        int64_t c[KN_MAX_DIMS];
        unravel(s.ne, s.ndim, i, c);
        double v = kn_dget(s, off_of(s, c));
        c[d] += base;
        kn_dput(y, off_of(y, c), v);
    }
}
/* A source of the dst's dtype, both row-major: the source is `rows` runs of
 * w elements landing every W elements of dst (rows = the extents before dim
 * d, w and W = from dim d on) -- a 2-d copy at copy speed (the gradient of a
 * fused q|k|v projection: three [8192, 768] blocks into [8192, 2304], which
 * k_cat's per-element unravel and double round trip ran at ~0.5 TB/s). */
static bool cat_2d(const kn_tview *y, const kn_tview *s, int d, int64_t base) {
    if (s->dtype != y->dtype || !kn_tview_is_contiguous(s) || !kn_tview_is_contiguous(y) || kn_env_get()->cuda_generic) return false;
    size_t es = kn_dtype_get(y->dtype)->type_size;
    if (es == 0 || kn_dtype_get(y->dtype)->is_quant) return false;
    int64_t rows = 1, inner = 1;
    for (int k = 0; k < d; k++) rows *= y->ne[k];
    for (int k = d + 1; k < y->ndim; k++) inner *= y->ne[k];
    size_t w = (size_t)(s->ne[d] * inner) * es, W = (size_t)(y->ne[d] * inner) * es;
    char *dst = (char *)y->data + (size_t)(base * inner) * es;
    return cudaMemcpy2DAsync(dst, W, s->data, w, w, (size_t)rows, cudaMemcpyDeviceToDevice, kn_cu_stream()) == cudaSuccess;
}

static kn_status cu_cat(const kn_exec *e) {
    int d = e->node->p.axis.dim;
    int64_t base = 0;
    for (int k = 0; k < e->nsrc; k++) {
        const kn_tview *s = &e->src[k];
        int64_t n = kn_tview_numel(s);
        if (n && !cat_2d(&e->dst, s, d, base)) {
            cudaGetLastError();            /* a refused 2-d copy: the kernel instead */
            k_cat<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), kn_dv(s), d, base, n);
            KN_CUDA_LAUNCHED();
        }
        base += s->ne[d];
    }
    return KN_OK;
}

/* ---- pad ---- */
struct pad_p { int64_t pad[2 * KN_MAX_DIMS]; int mode; double value; };
__global__ void k_pad(kn_dview y, kn_dview x, pad_p p, int64_t n) {
    KN_GRID_LOOP(i, n) {
        int64_t c[KN_MAX_DIMS];
        unravel(y.ne, y.ndim, i, c);
        bool inside = true;
        for (int d = 0; d < y.ndim; d++) {
            int k = y.ndim - 1 - d;
            int64_t lo = p.pad[2 * k], m = x.ne[d], j = c[d] - lo;
            if (j >= 0 && j < m) { c[d] = j; continue; }
            if (p.mode == KN_PAD_CONSTANT) { inside = false; break; }
            if (p.mode == KN_PAD_REFLECT) c[d] = j < 0 ? -j : 2 * (m - 1) - j;
            else c[d] = j < 0 ? 0 : m - 1;
        }
        kn_dput(y, kn_doff(y, i), inside ? kn_dget(x, off_of(x, c)) : p.value);
    }
}
static kn_status cu_pad(const kn_exec *e) {
    const kn_tensor *t = e->node;
    pad_p p;
    for (int i = 0; i < 2 * KN_MAX_DIMS; i++) p.pad[i] = t->p.pad.pad[i];
    p.mode = (int)t->p.pad.mode;
    p.value = t->p.pad.value;
    int64_t n = kn_tview_numel(&e->dst);
    const kn_tview *y = &e->dst, *x = &e->src[0];
    /* constant pad of f32 into a contiguous dst (the gradient of a slice):
     * a bounded gather, 32-bit index math, no double round trip */
    if (p.mode == KN_PAD_CONSTANT && y->dtype == KN_F32 && x->dtype == KN_F32 && kn_tview_is_contiguous(y) && y->ndim == x->ndim) {
        int64_t lo[KN_MAX_DIMS];
        for (int d = 0; d < y->ndim; d++) lo[d] = p.pad[2 * (y->ndim - 1 - d)];
        float v = (float)p.value;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        kn_status st = kn_cu_gather_bits(y->data, x->data, 4, y->ndim, y->ne, x->st, lo, x->ne, bits, n);
        if (st != KN_ERR_UNSUPPORTED) return st;
    }
    k_pad<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), kn_dv(&e->src[0]), p, n);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- gather ---- */
__global__ void k_gather(kn_dview y, kn_dview x, kn_dview iv, int d, int64_t n, kn_cu_err *err) {
    KN_GRID_LOOP(i, n) {
        int64_t c[KN_MAX_DIMS];
        unravel(y.ne, y.ndim, i, c);
        int64_t j = load_index(iv, off_of(iv, c), d, x.ne[d], err);
        if (j < 0) continue;
        c[d] = j;
        kn_dput(y, kn_doff(y, i), kn_dget(x, off_of(x, c)));
    }
}
static kn_status cu_gather(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1];
    int d = e->node->p.axis.dim;
    kn_status st = check_extents("gather", iv, x, d, "x");
    if (st) return st;
    int64_t n = kn_tview_numel(y);
    k_gather<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(y), kn_dv(x), kn_dv(iv), d, n, kn_cu_err_dev(KN_OP_GATHER));
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- scatter / scatter_add ---- */
/* pass 0: scatter_add (atomic add); pass 1: scatter, claim the last i per target; pass 2: scatter, winners write */
__global__ void k_scatter(kn_dview y, kn_dview iv, kn_dview s, int d, int64_t m, int pass, double *acc,
                          long long *win, kn_cu_err *err) {
    KN_GRID_LOOP(i, m) {
        int64_t c[KN_MAX_DIMS];
        unravel(iv.ne, iv.ndim, i, c);
        int64_t j = load_index(iv, off_of(iv, c), d, y.ne[d], err);
        if (j < 0) continue;
        double v = kn_dget(s, off_of(s, c));
        c[d] = j;
        int64_t at = ravel(y.ne, y.ndim, c);
        if (pass == 0) atomicAdd(&acc[at], v);
        else if (pass == 1) atomicMax(&win[at], (long long)i);
        else if (win[at] == i) acc[at] = v;
    }
}
static kn_status cu_scatter(const kn_exec *e, bool add) {
    const char *op = add ? "scatter_add" : "scatter";
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    kn_status st = check_extents(op, iv, y, d, "x");
    if (!st) st = check_extents(op, iv, s, -1, "src");
    if (st) return st;
    int64_t n = kn_tview_numel(y), m = kn_tview_numel(iv);
    double *acc = NULL;
    long long *win = NULL;
    if ((st = kn_cu_tmp(sizeof(double) * (size_t)n, (void **)&acc))) return st;
    if (!add && (st = kn_cu_tmp(sizeof(long long) * (size_t)n, (void **)&win))) { kn_cu_tmp_free(acc); return st; }
    st = kn_cu_load_all(x, acc, n);
    if (!st && m > 0) {
        if (win && cudaMemsetAsync(win, 0xff, sizeof(long long) * (size_t)n, kn_cu_stream()) != cudaSuccess)
            st = kn_set_error(KN_ERR_BACKEND, "%s: cudaMemsetAsync failed", op);
        for (int pass = add ? 0 : 1; !st && pass <= (add ? 0 : 2); pass++) {
            k_scatter<<<kn_blocks(m), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(y), kn_dv(iv), kn_dv(s), d, m, pass, acc, win, kn_cu_err_dev(e->node->op));
            if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "%s: kernel launch failed", op);
        }
    }
    if (!st) st = kn_cu_store_all(y, acc, n);
    kn_cu_tmp_free(acc);
    kn_cu_tmp_free(win);
    return st;
}

/* ---- index_select ---- */
__global__ void k_index_select(kn_dview y, kn_dview x, kn_dview iv, int d, int64_t n, kn_cu_err *err) {
    KN_GRID_LOOP(i, n) {
        int64_t c[KN_MAX_DIMS];
        unravel(y.ne, y.ndim, i, c);
        int64_t j = load_index(iv, c[d] * iv.st[0], d, x.ne[d], err);
        if (j < 0) continue;
        c[d] = j;
        kn_dput(y, kn_doff(y, i), kn_dget(x, off_of(x, c)));
    }
}
/* Whole rows (dim 0 of contiguous x and y of one dtype: embedding lookups):
 * a block per output row, copies of V (16, 4 or 2 bytes) where the row
 * bytes and the bases allow. The generic kernel below took 0.65 ms for a
 * [8192, 768] f32 gather of GPT-2 training on an H200 (10 us here). */
template <typename V>
__global__ void k_index_rows(char *y, const char *x, kn_dview iv, int64_t nrows, int64_t nsrc, int64_t rb, kn_cu_err *err) {
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t j = load_index(iv, r * iv.st[0], 0, nsrc, err);
        if (j < 0) continue;
        const V *s = (const V *)(x + j * rb);
        V *d = (V *)(y + r * rb);
        for (int64_t k = threadIdx.x; k < rb / (int64_t)sizeof(V); k += blockDim.x) d[k] = s[k];
    }
}
static bool index_rows(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1];
    if (e->node->p.axis.dim != 0 || x->dtype != y->dtype || kn_dtype_get(x->dtype)->is_quant || !kn_tview_is_contiguous(x) ||
        !kn_tview_is_contiguous(y) || x->ndim < 1 || y->ndim != x->ndim || kn_env_get()->cuda_generic)
        return false;
    int64_t nrows = y->ne[0], nsrc = x->ne[0];
    if (nrows == 0) return true;
    int64_t rb = (int64_t)kn_dtype_nbytes(x->dtype, kn_tview_numel(y) / nrows);
    uintptr_t al = (uintptr_t)x->data | (uintptr_t)y->data | (uintptr_t)rb;
    unsigned nb = nrows > 65535 ? 65535u : (unsigned)nrows;
    char *yp = (char *)y->data;
    const char *xp = (const char *)x->data;
    kn_cu_err *err = kn_cu_err_dev(KN_OP_INDEX_SELECT);
    if (al % 16 == 0) k_index_rows<uint4><<<nb, 128, 0, kn_cu_stream()>>>(yp, xp, kn_dv(iv), nrows, nsrc, rb, err);
    else if (al % 4 == 0) k_index_rows<uint32_t><<<nb, 128, 0, kn_cu_stream()>>>(yp, xp, kn_dv(iv), nrows, nsrc, rb, err);
    else if (al % 2 == 0) k_index_rows<uint16_t><<<nb, 128, 0, kn_cu_stream()>>>(yp, xp, kn_dv(iv), nrows, nsrc, rb, err);
    else k_index_rows<uint8_t><<<nb, 128, 0, kn_cu_stream()>>>(yp, xp, kn_dv(iv), nrows, nsrc, rb, err);
    return true;
}
static kn_status cu_index_select(const kn_exec *e) {
    if (index_rows(e)) { KN_CUDA_LAUNCHED(); return KN_OK; }
    int64_t n = kn_tview_numel(&e->dst);
    k_index_select<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), kn_dv(&e->src[0]), kn_dv(&e->src[1]),
                                                  e->node->p.axis.dim, n, kn_cu_err_dev(KN_OP_INDEX_SELECT));
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- index_add ---- */
__global__ void k_index_add(kn_dview y, kn_dview iv, kn_dview s, int d, int64_t m, double *acc, kn_cu_err *err) {
    KN_GRID_LOOP(i, m) {
        int64_t c[KN_MAX_DIMS];
        unravel(s.ne, s.ndim, i, c);
        int64_t j = load_index(iv, c[d] * iv.st[0], d, y.ne[d], err);
        if (j < 0) continue;
        double v = kn_dget(s, off_of(s, c));
        c[d] = j;
        atomicAdd(&acc[ravel(y.ne, y.ndim, c)], v);
    }
}
static kn_status cu_index_add(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    kn_status st = check_slices("index_add", s, y, iv, d);
    if (st) return st;
    int64_t n = kn_tview_numel(y), m = kn_tview_numel(s);
    double *acc = NULL;
    if ((st = kn_cu_tmp(sizeof(double) * (size_t)n, (void **)&acc))) return st;
    st = kn_cu_load_all(x, acc, n);
    if (!st && m > 0) {
        k_index_add<<<kn_blocks(m), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(y), kn_dv(iv), kn_dv(s), d, m, acc, kn_cu_err_dev(KN_OP_INDEX_ADD));
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "index_add: kernel launch failed");
    }
    if (!st) st = kn_cu_store_all(y, acc, n);
    kn_cu_tmp_free(acc);
    return st;
}

/* ---- index_copy (effect): every index checked and src read before the first write ---- */
__global__ void k_ic_pos(kn_dview iv, int64_t k, int d, int64_t n, long long *pos, kn_cu_err *err) {
    KN_GRID_LOOP(i, k) pos[i] = load_index(iv, i * iv.st[0], d, n, err);
}
/* dup[i]: a later index position writes the same slice (so i's values lose) */
__global__ void k_ic_dup(const long long *pos, int64_t k, int *dup) {
    KN_GRID_LOOP(i, k) {
        int v = 0;
        for (int64_t j = i + 1; j < k && !v; j++) v = pos[j] == pos[i];
        dup[i] = v;
    }
}
__global__ void k_ic_write(kn_dview y, kn_dview s, int d, int64_t m, const double *val, const long long *pos, const int *dup,
                           const kn_cu_err *err) {
    if (err->code) return;                 /* a bad index: write nothing (the plan reports it at its end) */
    KN_GRID_LOOP(i, m) {
        int64_t c[KN_MAX_DIMS];
        unravel(s.ne, s.ndim, i, c);
        if (dup[c[d]]) continue;
        c[d] = pos[c[d]];
        kn_dput(y, off_of(y, c), val[i]);
    }
}
/* Same-dtype 2- or 4-byte elements and at most 4096 indices (the KV cache
 * writes of every decode step and prompt): one launch. Every block reads all
 * k index values into shared memory and checks them (a bad one: no block
 * writes anything, and the op's slot says which); block i then copies the
 * source's slice i (its elements with coordinate i in dim d) to index i's
 * position, unless a later index equals it (the later one wins), which its
 * threads test over the later values. A prompt's K or V write of 512 rows
 * had taken two launches, one marking the overwritten indices (3.8 us) and
 * one copying (5.2 us); before those, one thread per index scanning the
 * later ones in turn took 68 us. */
template <typename T>
__global__ void k_ic_rows(kn_dview y, kn_dview s, kn_dview iv, int d, int64_t k, int64_t n, kn_cu_err *err) {
    extern __shared__ long long ic_at[];   /* [k] */
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        int64_t p = load_index(iv, j * iv.st[0], d, n, err);
        if (p < 0) bad = 1;
        ic_at[j] = p;
    }
    __syncthreads();
    if (bad) return;
    int64_t sl[KN_MAX_DIMS], per = 1;       /* one slice: s's extents with dim d's 1 */
    for (int q = 0; q < s.ndim; q++) { sl[q] = q == d ? 1 : s.ne[q]; per *= sl[q]; }
    T *yd = (T *)y.data;
    const T *sd = (const T *)s.data;
    for (int64_t i = blockIdx.x; i < s.ne[d]; i += gridDim.x) {
        int u = 0;
        for (int64_t j = i + 1 + threadIdx.x; j < k && !u; j += blockDim.x) u = ic_at[j] == ic_at[i];
        if (__syncthreads_or(u)) continue;
        for (int64_t e = threadIdx.x; e < per; e += blockDim.x) {
            int64_t c[KN_MAX_DIMS];
            unravel(sl, s.ndim, e, c);
            c[d] = i;
            int64_t so = off_of(s, c);
            c[d] = ic_at[i];
            yd[off_of(y, c)] = sd[so];
        }
    }
}
/* byte range [lo, hi) view v can touch; false when a stride is negative */
static bool span(const kn_tview *v, size_t es, const char **lo, const char **hi) {
    int64_t ext = 0;
    for (int d = 0; d < v->ndim; d++) {
        if (v->st[d] < 0) return false;
        if (v->ne[d] > 0) ext += (v->ne[d] - 1) * v->st[d];
    }
    *lo = (const char *)v->data;
    *hi = *lo + (ext + 1) * (int64_t)es;
    return true;
}
static kn_status cu_index_copy(const kn_exec *e) {
    const kn_tview *y = &e->dst, *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    int64_t m = kn_tview_numel(s), k = iv->ne[0];
    kn_status st = check_slices("index_copy", s, y, iv, d);
    if (st) return st;
    if (k == 0) return KN_OK;
    size_t es = kn_dtype_get(y->dtype)->type_size;
    const char *y0, *y1, *s0, *s1;
    bool apart = span(y, es, &y0, &y1) && span(s, es, &s0, &s1) && (s1 <= y0 || y1 <= s0);   /* src read as it is written */
    /* k <= 4096: every block holds the k index values in shared memory (at
     * most 32 KB); the generic path widens every value to double in scratch
     * (a Llama-3-8B prompt's K or V write took ~0.1 ms there) */
    if (apart && k <= 4096 && y->dtype == s->dtype && !kn_dtype_get(y->dtype)->is_quant && (es == 2 || es == 4) &&
        !kn_env_get()->cuda_generic) {
        kn_cu_err *err = kn_cu_err_dev(KN_OP_INDEX_COPY);
        kn_tview yw = *y, sw = *s;
        kn_tview *vv[2] = {&yw, &sw};
        unsigned nb = s->ne[d] < 1 ? 1u : s->ne[d] < 65535 ? (unsigned)s->ne[d] : 65535u;   /* no slices: still every index checked */
        size_t sh = sizeof(long long) * (size_t)k;
        cudaStream_t cs = kn_cu_stream();
        if (d < y->ndim - 1 && kn_cu_words16(vv, 2, (int)es))   /* rows of 16-byte words: a cache row of D */
            k_ic_rows<uint4><<<nb, 128, sh, cs>>>(kn_dv(&yw), kn_dv(&sw), kn_dv(iv), d, k, y->ne[d], err);
        else if (es == 4)
            k_ic_rows<uint32_t><<<nb, 128, sh, cs>>>(kn_dv(y), kn_dv(s), kn_dv(iv), d, k, y->ne[d], err);
        else
            k_ic_rows<uint16_t><<<nb, 128, sh, cs>>>(kn_dv(y), kn_dv(s), kn_dv(iv), d, k, y->ne[d], err);
        return cudaGetLastError() == cudaSuccess ? KN_OK : kn_set_error(KN_ERR_BACKEND, "index_copy: kernel launch failed");
    }
    double *val = NULL;
    long long *pos = NULL;
    int *dup = NULL;
    st = kn_cu_tmp(sizeof(double) * (size_t)(m ? m : 1), (void **)&val);
    if (!st) st = kn_cu_tmp(sizeof(long long) * (size_t)k, (void **)&pos);
    if (!st) st = kn_cu_tmp(sizeof(int) * (size_t)k, (void **)&dup);
    if (!st) {
        k_ic_pos<<<kn_blocks(k), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(iv), k, d, y->ne[d], pos, kn_cu_err_dev(KN_OP_INDEX_COPY));
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "index_copy: kernel launch failed");
    }
    if (!st && m > 0) {
        st = kn_cu_load_all(s, val, m);
        k_ic_dup<<<kn_blocks(k), KN_THREADS, 0, kn_cu_stream()>>>(pos, k, dup);
        k_ic_write<<<kn_blocks(m), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(y), kn_dv(s), d, m, val, pos, dup,
                                                                     kn_cu_err_dev(KN_OP_INDEX_COPY));
        if (!st && cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "index_copy: kernel launch failed");
    }
    kn_cu_tmp_free(val);
    kn_cu_tmp_free(pos);
    kn_cu_tmp_free(dup);
    return st;
}

kn_status kn_cu_index(const kn_exec *e) {
    switch (e->node->op) {
    case KN_OP_CAT: return cu_cat(e);
    case KN_OP_PAD: return cu_pad(e);
    case KN_OP_GATHER: return cu_gather(e);
    case KN_OP_SCATTER: return cu_scatter(e, false);
    case KN_OP_SCATTER_ADD: return cu_scatter(e, true);
    case KN_OP_INDEX_SELECT: return cu_index_select(e);
    case KN_OP_INDEX_ADD: return cu_index_add(e);
    case KN_OP_INDEX_COPY: return cu_index_copy(e);
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no kernel for %s in the index family", kn_op_name(e->node->op));
}
