/* cpu_index.c: the CPU backend's copies and index ops: COPY and CAST,
 * CAT, GATHER, INDEX_SELECT, INDEX_COPY, INDEX_ADD, SCATTER_ADD and constant PAD.
 *
 * Layouts: contiguous COPY/CAST of any plain dtype (f32 <-> f16/bf16
 * casts); strided COPY and CAT of 4-byte elements (a blocked transpose);
 * the index ops need the dims after `dim` contiguous (INDEX_SELECT also
 * reads quantized rows: dim 0 of a matrix, copied or dequantized; with
 * slices of at most 16 bytes it walks outer rows, the last dims' gather);
 * GATHER of 4- or 8-byte elements with i32/i64 indices, any strides. An
 * out-of-range index sends the node to the reference, which reports it.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/vec.h"          // defines: kn_vec_f16_to_f32 and the other casts
#include "backends/quant/quant.h"                 // defines: kn_dequantize_row
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ==== contiguous copy and cast (any plain dtype) ============================= */
typedef struct { kn_dtype from, to; void *y; const void *x; int64_t n; } cast_job;
static void cast_rows(void *p, int64_t r0, int64_t r1) {
    cast_job *j = p;
    int64_t o = r0 * KN_CPU_CHUNK, n = kn_cpu_chunk_end(r1, j->n) - o;
    size_t es = kn_dtype_get(j->to)->type_size, xs = kn_dtype_get(j->from)->type_size;
    void *y = (char *)j->y + o * (int64_t)es;
    const void *x = (const char *)j->x + o * (int64_t)xs;
    if (j->from == j->to) memcpy(y, x, (size_t)n * es);
    else if (j->from == KN_F32 && j->to == KN_F16) kn_vec_f32_to_f16(y, x, n);
    else if (j->from == KN_F16) kn_vec_f16_to_f32(y, x, n);
    else if (j->from == KN_F32) kn_vec_f32_to_bf16(y, x, n);
    else kn_vec_bf16_to_f32(y, x, n);
}
bool kn_cpu_copy_contig(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (!contig(x) || !contig(d)) return false;
    bool ok = x->dtype == d->dtype ||
              (x->dtype == KN_F32 && (d->dtype == KN_F16 || d->dtype == KN_BF16)) ||
              (d->dtype == KN_F32 && (x->dtype == KN_F16 || x->dtype == KN_BF16));
    if (!ok || kn_dtype_get(x->dtype)->is_quant) return false;
    int64_t n = kn_tview_numel(d);
    cast_job j = {x->dtype, d->dtype, d->data, x->data, n};
    kn_cpu_par_rows(cast_rows, &j, kn_cpu_chunks(n), n);
    return true;
}

/* ==== strided copy (4-byte elements) ==========================================
 * Dims are merged where both layouts allow and unit dims dropped. With q the
 * destination's fastest dim and p the source's: if they are the same dim,
 * rows along it are copied; otherwise (p, q) tiles of TILE x TILE go
 * through the cache together (a blocked transpose). */
#define CP_MAXD KN_MAX_DIMS
#define TILE 32
typedef struct {
    int nd; int64_t ne[CP_MAXD], sx[CP_MAXD], sy[CP_MAXD];
    int p, q;                      /* source-fast and destination-fast dims */
    int nod; int od[CP_MAXD];      /* the other dims (outer odometer)       */
    int64_t ptiles;
    const uint32_t *x; uint32_t *y;
} cp_job;
static void cp_outer(const cp_job *j, int64_t lin, int64_t *ox, int64_t *oy) {
    int64_t a = 0, b = 0;
    for (int k = j->nod - 1; k >= 0; k--) {
        int d = j->od[k];
        int64_t c = lin % j->ne[d]; lin /= j->ne[d];
        a += c * j->sx[d]; b += c * j->sy[d];
    }
    *ox = a; *oy = b;
}
static void cp_rows(void *p, int64_t r0, int64_t r1) {
    cp_job *j = p;
    int q = j->q, pp = j->p;
    int64_t nq = j->ne[q], sxq = j->sx[q], syq = j->sy[q];
    for (int64_t r = r0; r < r1; r++) {
        int64_t ox, oy;
        if (pp == q) {                              /* rows along q */
            cp_outer(j, r, &ox, &oy);
            const uint32_t *x = j->x + ox;
            uint32_t *y = j->y + oy;
            if (sxq == 1 && syq == 1) memcpy(y, x, sizeof(uint32_t) * (size_t)nq);
            else for (int64_t k = 0; k < nq; k++) y[k * syq] = x[k * sxq];
            continue;
        }
        cp_outer(j, r / j->ptiles, &ox, &oy);
        int64_t a0 = (r % j->ptiles) * TILE, a1 = a0 + TILE < j->ne[pp] ? a0 + TILE : j->ne[pp];
        int64_t sxp = j->sx[pp], syp = j->sy[pp];
        for (int64_t b0 = 0; b0 < nq; b0 += TILE) {
            int64_t b1 = b0 + TILE < nq ? b0 + TILE : nq;
            for (int64_t a = a0; a < a1; a++) {
                const uint32_t *x = j->x + ox + a * sxp;
                uint32_t *y = j->y + oy + a * syp;
                for (int64_t b = b0; b < b1; b++) y[b * syq] = x[b * sxq];
            }
        }
    }
}
static int64_t iabs64(int64_t v) { return v < 0 ? -v : v; }
static bool copy_views(const kn_tview *x, const kn_tview *y) {
    if (x->dtype != y->dtype || kn_dtype_get(x->dtype)->type_size != 4 || kn_dtype_get(x->dtype)->is_quant) return false;
    if (x->ndim != y->ndim) return false;
    cp_job j;
    memset(&j, 0, sizeof j);
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (x->ne[d] != y->ne[d]) return false;
        n *= x->ne[d];
        if (x->ne[d] == 1) continue;
        if (j.nd > 0 && j.sx[j.nd - 1] == x->st[d] * x->ne[d] && j.sy[j.nd - 1] == y->st[d] * y->ne[d]) {
            j.ne[j.nd - 1] *= x->ne[d];              /* merge into the previous dim */
            j.sx[j.nd - 1] = x->st[d]; j.sy[j.nd - 1] = y->st[d];
            continue;
        }
        j.ne[j.nd] = x->ne[d]; j.sx[j.nd] = x->st[d]; j.sy[j.nd] = y->st[d]; j.nd++;
    }
    if (n == 0 || kn_cpu_overlap(x, y)) return false;
    if (j.nd == 0) { j.ne[0] = 1; j.sx[0] = j.sy[0] = 1; j.nd = 1; }
    /* a stride-0 destination dim (several elements to one place) is left to the reference */
    for (int d = 0; d < j.nd; d++) if (j.sy[d] == 0) return false;
    j.p = j.q = 0;
    for (int d = 1; d < j.nd; d++) {
        if (iabs64(j.sy[d]) < iabs64(j.sy[j.q])) j.q = d;
        if (iabs64(j.sx[d]) < iabs64(j.sx[j.p])) j.p = d;
    }
    if (iabs64(j.sx[j.q]) <= 1) j.p = j.q;              /* q is fast in both */
    for (int d = 0; d < j.nd; d++) if (d != j.p && d != j.q) j.od[j.nod++] = d;
    j.x = x->data; j.y = y->data;
    int64_t outer = 1;
    for (int k = 0; k < j.nod; k++) outer *= j.ne[j.od[k]];
    if (j.p == j.q) kn_cpu_par_rows(cp_rows, &j, outer, n);
    else { j.ptiles = (j.ne[j.p] + TILE - 1) / TILE; kn_cpu_par_rows(cp_rows, &j, outer * j.ptiles, n); }
    return true;
}
bool kn_cpu_copy_strided(const kn_exec *e) { return copy_views(&e->src[0], &e->dst); }

/* cat: each part is a strided copy into its slab of the output. Checked
 * before anything is written: the same 4-byte dtype everywhere, no overlap. */
bool kn_cpu_cat(const kn_exec *e) {
    const kn_tview *y = &e->dst;
    int d = e->node->p.axis.dim;
    size_t es = kn_dtype_get(y->dtype)->type_size;
    for (int k = 0; k < e->nsrc; k++)
        if (e->src[k].dtype != y->dtype || es != 4 || kn_dtype_get(y->dtype)->is_quant || kn_cpu_overlap(&e->src[k], y)) return false;
    int64_t at = 0;
    for (int k = 0; k < e->nsrc; k++) {
        const kn_tview *x = &e->src[k];
        kn_tview slab = *y;
        slab.ne[d] = x->ne[d];
        slab.data = (char *)y->data + at * y->st[d] * (int64_t)es;
        at += x->ne[d];
        if (kn_tview_numel(x) == 0) continue;
        if (!copy_views(x, &slab)) return false;   /* the reference then redoes the whole cat */
    }
    return true;
}

/* Read the m entries of 1-d integer view iv into idx (malloc'd), checking each
 * is in [0, n). NULL (no error set) when one is not or memory is short. */
static int64_t *load_indices(const kn_tview *iv, int64_t m, int64_t n) {
    const kn_dtype_info *di = kn_dtype_get(iv->dtype);
    if (di->is_float || di->is_quant || iv->ndim != 1 || iv->ne[0] < m) return NULL;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
    if (!idx) return NULL;
    for (int64_t i = 0; i < m; i++) {
        double v = kn_load(iv->dtype, iv->data, i * iv->st[0]);
        if (!(v >= 0 && v < (double)n)) { free(idx); return NULL; }
        idx[i] = (int64_t)v;
    }
    return idx;
}

/* ==== gather =====================================================================
 * y[c] = x[c with c[d] = index[c]] (sort's and topk's values): 4- or 8-byte
 * elements, i32/i64 indices, any strides; rows over all dims but the last.
 * An index out of range stops the job; the reference then reports it. */
typedef struct { const kn_tview *x, *iv, *y; int d; size_t es; atomic_int bad; } gather_job;
static void gather_rows(void *p, int64_t r0, int64_t r1) {
    gather_job *j = p;
    const kn_tview *x = j->x, *iv = j->iv, *y = j->y;
    int nd = y->ndim, last = nd - 1, d = j->d;
    int64_t L = y->ne[last], n = x->ne[d];
    bool i64 = iv->dtype == KN_I64;
    for (int64_t r = r0; r < r1; r++) {
        int64_t xo = 0, yo = 0, io = 0, lin = r;
        for (int k = last - 1; k >= 0; k--) {
            int64_t q = lin % y->ne[k];
            lin /= y->ne[k];
            yo += q * y->st[k]; io += q * iv->st[k];
            if (k != d) xo += q * x->st[k];
        }
        int64_t xl = d == last ? 0 : x->st[last];
        for (int64_t i = 0; i < L; i++) {
            int64_t v = i64 ? ((const int64_t *)iv->data)[io + i * iv->st[last]] : ((const int32_t *)iv->data)[io + i * iv->st[last]];
            if (v < 0 || v >= n) { atomic_store(&j->bad, 1); return; }
            int64_t xi = xo + v * x->st[d] + i * xl;
            if (j->es == 4) ((uint32_t *)y->data)[yo + i * y->st[last]] = ((const uint32_t *)x->data)[xi];
            else ((uint64_t *)y->data)[yo + i * y->st[last]] = ((const uint64_t *)x->data)[xi];
        }
    }
}
bool kn_cpu_gather(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *y = &e->dst;
    size_t es = kn_dtype_get(x->dtype)->type_size;
    if (x->dtype != y->dtype || kn_dtype_get(x->dtype)->is_quant || (es != 4 && es != 8)) return false;
    if ((iv->dtype != KN_I64 && iv->dtype != KN_I32) || iv->ndim != y->ndim || x->ndim != y->ndim || y->ndim < 1) return false;
    int d = e->node->p.axis.dim;
    for (int k = 0; k < y->ndim; k++) if (iv->ne[k] != y->ne[k] || (k != d && x->ne[k] < y->ne[k])) return false;
    int64_t n = kn_tview_numel(y);
    if (n == 0 || kn_cpu_overlap(x, y) || kn_cpu_overlap(iv, y)) return false;
    gather_job j = {x, iv, y, d, es, 0};
    kn_cpu_par_rows(gather_rows, &j, n / y->ne[y->ndim - 1], n);
    return !atomic_load(&j.bad);
}

/* ==== index_select / index_copy / index_add ==================================
 * Operands viewed as [O, n, I] around dim d: O outer positions (any strides),
 * the indexed dim (any stride), I consecutive inner elements. */
typedef struct {
    const kn_tview *x, *y, *s;   /* source, destination, added/copied slices */
    int d; int64_t m, I, nch; size_t es; const int64_t *idx;
} idx_job;

/* index_select: rows (o, i) */
static void isel_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->m, i = r % j->m;
        const char *src = (const char *)x->data + (off_lead(x, j->d, o) + j->idx[i] * x->st[j->d]) * (int64_t)j->es;
        char *dst = (char *)y->data + (off_lead(y, j->d, o) + i * y->st[j->d]) * (int64_t)j->es;
        memcpy(dst, src, (size_t)j->I * j->es);
    }
}
/* index_select with short slices (I * es <= 16 bytes: a gather along the
 * last dims, as interpolate's): rows are outer positions o, so the offsets
 * are found once per o, not once per element */
static void isel_rows_short(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int64_t xs = x->st[j->d] * (int64_t)j->es, ys = y->st[j->d] * (int64_t)j->es;
    size_t nb = (size_t)j->I * j->es;
    for (int64_t o = r0; o < r1; o++) {
        const char *src = (const char *)x->data + off_lead(x, j->d, o) * (int64_t)j->es;
        char *dst = (char *)y->data + off_lead(y, j->d, o) * (int64_t)j->es;
        if (nb == 4)
            for (int64_t i = 0; i < j->m; i++) memcpy(dst + i * ys, src + j->idx[i] * xs, 4);
        else
            for (int64_t i = 0; i < j->m; i++) memcpy(dst + i * ys, src + j->idx[i] * xs, nb);
    }
}
/* quantized x [V, C] (dim 0): rows dequantized to f32 or copied as blocks */
typedef struct { const kn_tview *x, *y; const int64_t *idx; int64_t C; size_t row_bytes; bool deq; } qsel_job;
static void qsel_rows(void *p, int64_t r0, int64_t r1) {
    qsel_job *j = p;
    kn_dtype qt = j->x->dtype;
    for (int64_t r = r0; r < r1; r++) {
        const char *src = (const char *)j->x->data + kn_dtype_nbytes(qt, j->idx[r] * j->x->st[0]);
        if (j->deq) kn_dequantize_row(qt, src, (float *)j->y->data + r * j->y->st[0], j->C);
        else memcpy((char *)j->y->data + kn_dtype_nbytes(qt, r * j->y->st[0]), src, j->row_bytes);
    }
}
static bool index_select_quant(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *y = &e->dst;
    const kn_dtype_info *qi = kn_dtype_get(x->dtype);
    int64_t bs = qi->block_size, C = x->ne[1], m = y->ne[0];
    if (e->node->p.axis.dim != 0 || x->ndim != 2 || y->ndim != 2 || y->ne[1] != C || C % bs) return false;
    if ((x->ne[0] > 1 && x->st[0] % bs) || (C > 1 && x->st[1] != 1) || (C > 1 && y->st[1] != 1)) return false;
    bool deq = is_f32(y);
    if (!deq && (y->dtype != x->dtype || (m > 1 && y->st[0] % bs))) return false;
    if (kn_cpu_overlap(x, y)) return false;
    int64_t *idx = load_indices(iv, m, x->ne[0]);
    if (!idx) return false;
    /* a dtype kn_dequantize_row does not know: leave it to the reference */
    if (deq && m > 0 && kn_dequantize_row(x->dtype, (const char *)x->data + kn_dtype_nbytes(x->dtype, idx[0] * x->st[0]),
                                          y->data, C) != KN_OK) { free(idx); return false; }
    qsel_job j = {x, y, idx, C, kn_dtype_nbytes(x->dtype, C), deq};
    kn_cpu_par_rows(qsel_rows, &j, m, m * C * (deq ? 4 : 1));
    free(idx);
    return true;
}
bool kn_cpu_index_select(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *y = &e->dst;
    if (kn_dtype_get(x->dtype)->is_quant) return index_select_quant(e);
    int d = e->node->p.axis.dim;
    if (x->dtype != y->dtype || d < 0 || d >= x->ndim || x->ndim != y->ndim) return false;
    if (!tail_contig(x, d + 1) || !tail_contig(y, d + 1)) return false;
    int64_t m = y->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (m == 0 || I == 0 || O == 0 || kn_cpu_overlap(x, y)) return false;
    int64_t *idx = load_indices(iv, m, x->ne[d]);
    if (!idx) return false;
    idx_job j = {x, y, NULL, d, m, I, 1, kn_dtype_get(x->dtype)->type_size, idx};
    if ((size_t)I * j.es <= 16) kn_cpu_par_rows(isel_rows_short, &j, O, O * m * I);
    else kn_cpu_par_rows(isel_rows, &j, O * m, O * m * I);
    free(idx);
    return true;
}

/* index_copy: job rows are outer positions o, each copying its slices in index
 * order (a repeated index keeps the last slice, like the reference). */
static void icopy_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *y = j->y, *s = j->s;
    for (int64_t o = r0; o < r1; o++)
        for (int64_t i = 0; i < j->m; i++) {
            const char *src = (const char *)s->data + (off_lead(s, j->d, o) + i * s->st[j->d]) * (int64_t)j->es;
            char *dst = (char *)y->data + (off_lead(y, j->d, o) + j->idx[i] * y->st[j->d]) * (int64_t)j->es;
            memcpy(dst, src, (size_t)j->I * j->es);
        }
}
/* src must match y except along d, where it has at most the index's length */
static bool slices_ok(const kn_tview *s, const kn_tview *y, const kn_tview *iv, int d) {
    if (s->ndim != y->ndim || iv->ndim != 1) return false;
    for (int k = 0; k < y->ndim; k++)
        if (k == d ? s->ne[k] > iv->ne[0] : s->ne[k] != y->ne[k]) return false;
    return true;
}
bool kn_cpu_index_copy(const kn_exec *e) {
    const kn_tview *y = &e->dst, *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    if (s->dtype != y->dtype || kn_dtype_get(y->dtype)->is_quant || d < 0 || d >= y->ndim) return false;
    if (!slices_ok(s, y, iv, d) || !tail_contig(y, d + 1) || !tail_contig(s, d + 1)) return false;
    int64_t m = s->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (I == 0 || O == 0 || kn_cpu_overlap(s, y)) return false;
    /* the reference checks every index of the index tensor, not only the first m */
    int64_t *idx = load_indices(iv, iv->ne[0], y->ne[d]);
    if (!idx) return false;
    idx_job j = {NULL, y, s, d, m, I, 1, kn_dtype_get(y->dtype)->type_size, idx};
    kn_cpu_par_rows(icopy_rows, &j, O, O * m * I);
    free(idx);
    return true;
}

/* index_add (f32): job rows are (outer position, column chunk); each copies
 * its part of x into y, then adds every slice in index order. */
#define IADD_COLS 1024
static void iadd_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *x = j->x, *y = j->y, *s = j->s;
    int d = j->d;
    int64_t n = y->ne[d];
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->nch, c0 = (r % j->nch) * IADD_COLS;
        int64_t L = j->I - c0 < IADD_COLS ? j->I - c0 : IADD_COLS;
        const float *xb = (const float *)x->data + off_lead(x, d, o) + c0;
        const float *sb = (const float *)s->data + off_lead(s, d, o) + c0;
        float *yb = (float *)y->data + off_lead(y, d, o) + c0;
        if (L < 16) {       /* short slices (index_add along the last dim: L = 1): plain loops, no calls */
            if (x->data != y->data)
                for (int64_t k = 0; k < n; k++)
                    for (int64_t c = 0; c < L; c++) yb[k * y->st[d] + c] = xb[k * x->st[d] + c];
            for (int64_t i = 0; i < j->m; i++) {
                float *yr = yb + j->idx[i] * y->st[d];
                const float *sr = sb + i * s->st[d];
                for (int64_t c = 0; c < L; c++) yr[c] += sr[c];
            }
            continue;
        }
        if (x->data != y->data)
            for (int64_t k = 0; k < n; k++) memcpy(yb + k * y->st[d], xb + k * x->st[d], sizeof(float) * (size_t)L);
        for (int64_t i = 0; i < j->m; i++) {
            float *yr = yb + j->idx[i] * y->st[d];
            kn_vec_add(yr, yr, sb + i * s->st[d], L);
        }
    }
}
bool kn_cpu_index_add(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2], *y = &e->dst;
    int d = e->node->p.axis.dim;
    if (!is_f32(x) || !is_f32(y) || !is_f32(s) || d < 0 || d >= y->ndim || x->ndim != y->ndim) return false;
    if (!slices_ok(s, y, iv, d) || !tail_contig(y, d + 1) || !tail_contig(s, d + 1) || !tail_contig(x, d + 1)) return false;
    for (int k = 0; k < y->ndim; k++) if (x->ne[k] != y->ne[k]) return false;
    if (!kn_cpu_same_or_disjoint(x, y) || kn_cpu_overlap(s, y)) return false;
    int64_t m = s->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (I == 0 || O == 0 || y->ne[d] == 0) return false;
    int64_t *idx = load_indices(iv, m, y->ne[d]);
    if (!idx) return false;
    idx_job j = {x, y, s, d, m, I, (I + IADD_COLS - 1) / IADD_COLS, 4, idx};
    kn_cpu_par_rows(iadd_rows, &j, O * j.nch, O * (m + y->ne[d]) * I);
    free(idx);
    return true;
}

/* constant pad (4-byte elements) into a contiguous y: fill, then copy x's
 * rows (unit stride along the last dim) into the interior. The gradient of
 * a slice (the qkv split). */
typedef struct { const kn_tview *x, *y; int64_t n, lo[KN_MAX_DIMS]; uint32_t v; } pad_job;
static void pad_fill_rows(void *p, int64_t r0, int64_t r1) {
    pad_job *j = p;
    uint32_t *y = j->y->data;
    int64_t e = kn_cpu_chunk_end(r1, j->n);
    for (int64_t i = r0 * KN_CPU_CHUNK; i < e; i++) y[i] = j->v;
}
static void pad_copy_rows(void *p, int64_t r0, int64_t r1) {
    pad_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int nd = x->ndim;
    int64_t L = x->ne[nd - 1];
    for (int64_t r = r0; r < r1; r++) {
        int64_t xo = 0, yo = 0, ys = y->ne[nd - 1], q = r;
        yo += j->lo[nd - 1];
        for (int k = nd - 2; k >= 0; k--) {
            int64_t c = q % x->ne[k]; q /= x->ne[k];
            xo += c * x->st[k];
            yo += (c + j->lo[k]) * ys;
            ys *= y->ne[k];
        }
        memcpy((uint32_t *)y->data + yo, (const uint32_t *)x->data + xo, sizeof(uint32_t) * (size_t)L);
    }
}
bool kn_cpu_pad(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    const kn_tensor *t = e->node;
    int nd = y->ndim;
    if (t->p.pad.mode != KN_PAD_CONSTANT || x->dtype != y->dtype || kn_dtype_get(y->dtype)->type_size != 4 ||
        kn_dtype_get(y->dtype)->is_quant || nd == 0 || x->ndim != nd || !kn_tview_is_contiguous(y) || kn_cpu_overlap(x, y))
        return false;
    if (x->ne[nd - 1] > 1 && x->st[nd - 1] != 1) return false;
    pad_job j = {x, y, kn_tview_numel(y), {0}, 0};
    for (int d = 0; d < nd; d++) {
        j.lo[d] = t->p.pad.pad[2 * (nd - 1 - d)];
        if (j.lo[d] < 0 || y->ne[d] < x->ne[d] + j.lo[d]) return false;   /* negative pads (crops): reference */
    }
    float fv = (float)t->p.pad.value;
    if (y->dtype == KN_F32) memcpy(&j.v, &fv, 4);
    else if (y->dtype == KN_I32) { int32_t iv = (int32_t)t->p.pad.value; memcpy(&j.v, &iv, 4); }
    else return false;
    int64_t n = j.n, nx = kn_tview_numel(x);
    if (n == 0) return true;
    kn_cpu_par_rows(pad_fill_rows, &j, kn_cpu_chunks(n), n);
    if (nx) kn_cpu_par_rows(pad_copy_rows, &j, nx / x->ne[nd - 1], nx);
    return true;
}

/* scatter_add (f32) into a contiguous y: the gradient of gather (the
 * cross-entropy's pick of the target log-probability). x is copied (or, a
 * broadcast zero, filled), then each index element adds its src value; one
 * thread: there are as many adds as index elements, few next to y's size. */
/* The index element at coordinate c (an int32 or int64 view); the next
 * coordinate in row-major order over ne (false, and c back at 0, after the
 * last). */
static int64_t index_at(const kn_tview *iv, const int64_t *c) {
    int64_t o = 0;
    for (int k = 0; k < iv->ndim; k++) o += c[k] * iv->st[k];
    return iv->dtype == KN_I32 ? ((const int32_t *)iv->data)[o] : ((const int64_t *)iv->data)[o];
}
static bool next_coord(int64_t *c, const int64_t *ne, int nd) {
    for (int k = nd - 1; k >= 0; k--) {
        if (++c[k] < ne[k]) return true;
        c[k] = 0;
    }
    return false;
}
bool kn_cpu_scatter_add(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim, nd = y->ndim;
    if (!is_f32(x) || !is_f32(y) || !is_f32(s) || !kn_tview_is_contiguous(y) || d < 0 || d >= nd) return false;
    if ((iv->dtype != KN_I32 && iv->dtype != KN_I64) || x->ndim != nd || iv->ndim != nd || s->ndim != nd) return false;
    for (int k = 0; k < nd; k++)
        if (x->ne[k] != y->ne[k] || iv->ne[k] > s->ne[k] || (k != d && iv->ne[k] > y->ne[k])) return false;
    bool xzero = true;
    for (int k = 0; k < nd; k++) if (x->st[k] != 0 && x->ne[k] > 1) xzero = false;
    if (kn_cpu_overlap(s, y) || (!xzero && !kn_cpu_same_or_disjoint(x, y)) || (!xzero && x->data != y->data && !kn_tview_is_contiguous(x)))
        return false;
    int64_t m = kn_tview_numel(iv), n = kn_tview_numel(y), c[KN_MAX_DIMS] = {0};
    /* indices first: an out-of-range one goes to the reference, which reports it */
    for (bool more = m > 0; more; more = next_coord(c, iv->ne, nd)) {
        int64_t j = index_at(iv, c);
        if (j < 0 || j >= y->ne[d]) return false;
    }
    float *yd = y->data;
    if (xzero) { float v = n ? *(const float *)x->data : 0; for (int64_t i = 0; i < n; i++) yd[i] = v; }
    else if (x->data != y->data) memcpy(yd, x->data, sizeof(float) * (size_t)n);
    for (bool more = m > 0; more; more = next_coord(c, iv->ne, nd)) {
        int64_t so = 0, yo = 0, ys = 1;
        for (int k = nd - 1; k >= 0; k--) {
            so += c[k] * s->st[k];
            yo += (k == d ? index_at(iv, c) : c[k]) * ys;
            ys *= y->ne[k];
        }
        yd[yo] += ((const float *)s->data)[so];
    }
    return true;
}
