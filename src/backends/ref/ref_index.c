/* ref_index.c: cat, pad, gather/scatter, index_select/add/copy.
 *
 * Every kernel walks coordinates (row-major over the run-time extents) and
 * maps them between operands through their strides, so any layout works.
 * Index values are read as doubles and must be integers in [0, n): each
 * kernel checks them before use and fails with a message naming the op.
 * Scatters and index_add accumulate into a double copy of the output, so a
 * repeated index adds without intermediate rounding; with repeated indices,
 * scatter and index_copy keep the last value in row-major order of index.
 */
#include "backends/ref/ref.h"
#include <stdlib.h>
#include <string.h>

/* ---- coordinates ---------------------------------------------------------- */
static void unravel(const int64_t *ne, int ndim, int64_t lin, int64_t *c) {
    for (int d = ndim - 1; d >= 0; d--) { c[d] = ne[d] ? lin % ne[d] : 0; lin = ne[d] ? lin / ne[d] : 0; }
}
static int64_t off_of(const kn_tview *v, const int64_t *c) {
    int64_t o = 0;
    for (int d = 0; d < v->ndim; d++) o += c[d] * v->st[d];
    return o;
}
static int64_t ravel(const int64_t *ne, int ndim, const int64_t *c) {
    int64_t lin = 0;
    for (int d = 0; d < ndim; d++) lin = lin * ne[d] + c[d];
    return lin;
}

/* Index value at element offset off of iv, checked against [0, n). */
static kn_status load_index(const char *op, const kn_tview *iv, int64_t off, int dim, int64_t n, int64_t *out) {
    double v = LD(iv, off);
    *out = 0;                          /* (never used on error; keeps callers' j initialised) */
    if (!(v >= 0 && v < (double)n)) return kn__index_error(op, v, dim, n);
    *out = (int64_t)v;
    return KN_OK;
}

/* index (same rank as x) must be no larger than x in every dim but d. */
static kn_status check_extents(const char *op, const kn_tview *iv, const kn_tview *x, int d, const char *xname) {
    for (int k = 0; k < x->ndim; k++)
        if (k != d && iv->ne[k] > x->ne[k])
            return kn_set_error(KN_ERR_INVALID, "%s: at run time the index has %lld entries in dim %d but %s has only %lld",
                                op, (long long)iv->ne[k], k, xname, (long long)x->ne[k]);
    return KN_OK;
}

/* src of index_add/index_copy: x's extents but index's length along d. */
static kn_status check_slices(const char *op, const kn_tview *s, const kn_tview *y, const kn_tview *iv, int d) {
    for (int k = 0; k < y->ndim; k++)
        if (k == d ? s->ne[k] > iv->ne[0] : s->ne[k] != y->ne[k])
            return kn_set_error(KN_ERR_INVALID, "%s: at run time src has %lld entries in dim %d where %s has %lld",
                                op, (long long)s->ne[k], k, k == d ? "index" : "x", (long long)(k == d ? iv->ne[0] : y->ne[k]));
    return KN_OK;
}

/* ---- cat: each source lands at a running offset along d ------------------- */
static kn_status ref_cat(const kn_exec *e) {
    const kn_tview *y = &e->dst;
    int d = e->node->p.axis.dim;
    int64_t base = 0, c[KN_MAX_DIMS];
    for (int k = 0; k < e->nsrc; k++) {
        const kn_tview *s = &e->src[k];
        int64_t n = kn_tview_numel(s);
        for (int64_t i = 0; i < n; i++) {
            unravel(s->ne, s->ndim, i, c);
            double v = LD(s, off_of(s, c));
            c[d] += base;
            ST(y, off_of(y, c), v);
        }
        base += s->ne[d];
    }
    return KN_OK;
}

/* ---- pad: map each output coordinate back to a source coordinate ---------- */
static kn_status ref_pad(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0];
    const kn_tensor *t = e->node;
    int64_t n = kn_tview_numel(y), c[KN_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        unravel(y->ne, y->ndim, i, c);
        bool inside = true;
        for (int d = 0; d < y->ndim; d++) {
            int k = y->ndim - 1 - d;                 /* pairs are stored last dim first */
            int64_t lo = t->p.pad.pad[2 * k], m = x->ne[d], j = c[d] - lo;
            if (j >= 0 && j < m) { c[d] = j; continue; }
            switch (t->p.pad.mode) {
            case KN_PAD_CONSTANT: inside = false; break;
            case KN_PAD_REFLECT: c[d] = j < 0 ? -j : 2 * (m - 1) - j; break;
            case KN_PAD_REPLICATE: c[d] = j < 0 ? 0 : m - 1; break;
            }
            if (!inside) break;
        }
        ST(y, kn_ref_off(y, i), inside ? LD(x, off_of(x, c)) : t->p.pad.value);
    }
    return KN_OK;
}

/* ---- gather: y[c] = x[c with c[d] = index[c]] ------------------------------ */
static kn_status ref_gather(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1];
    int d = e->node->p.axis.dim;
    kn_status st = check_extents("gather", iv, x, d, "x");
    if (st) return st;
    int64_t n = kn_tview_numel(y), c[KN_MAX_DIMS], j;
    for (int64_t i = 0; i < n; i++) {
        unravel(y->ne, y->ndim, i, c);
        if ((st = load_index("gather", iv, off_of(iv, c), d, x->ne[d], &j))) return st;
        c[d] = j;
        ST(y, kn_ref_off(y, i), LD(x, off_of(x, c)));
    }
    return KN_OK;
}

/* Load the output's initial values (x) into a row-major double buffer. */
static double *load_all(const char *op, const kn_tview *x, int64_t n) {
    double *acc = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!acc) { kn_set_error(KN_ERR_NOMEM, "%s: out of memory for %lld elements", op, (long long)n); return NULL; }
    for (int64_t i = 0; i < n; i++) acc[i] = LD(x, kn_ref_off(x, i));
    return acc;
}
static void store_all(const kn_tview *y, const double *acc, int64_t n) {
    for (int64_t i = 0; i < n; i++) ST(y, kn_ref_off(y, i), acc[i]);
}

/* ---- scatter / scatter_add: y = x; y[c with c[d] = index[c]] (+)= src[c] --- */
static kn_status ref_scatter(const kn_exec *e, bool add) {
    const char *op = add ? "scatter_add" : "scatter";
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    kn_status st = check_extents(op, iv, y, d, "x");
    if (!st) st = check_extents(op, iv, s, -1, "src");
    if (st) return st;
    int64_t n = kn_tview_numel(y), m = kn_tview_numel(iv), c[KN_MAX_DIMS], j;
    double *acc = load_all(op, x, n);
    if (!acc) return KN_ERR_NOMEM;
    for (int64_t i = 0; i < m; i++) {
        unravel(iv->ne, iv->ndim, i, c);
        if ((st = load_index(op, iv, off_of(iv, c), d, y->ne[d], &j))) { free(acc); return st; }
        double v = LD(s, off_of(s, c));
        c[d] = j;
        int64_t at = ravel(y->ne, y->ndim, c);
        acc[at] = add ? acc[at] + v : v;
    }
    store_all(y, acc, n);
    free(acc);
    return KN_OK;
}

/* ---- index_select: y[c] = x[c with c[d] = index[c[d]]] --------------------- */
static kn_status ref_index_select(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1];
    int d = e->node->p.axis.dim;
    int64_t n = kn_tview_numel(y), c[KN_MAX_DIMS], j;
    kn_status st;
    for (int64_t i = 0; i < n; i++) {
        unravel(y->ne, y->ndim, i, c);
        if ((st = load_index("index_select", iv, c[d] * iv->st[0], d, x->ne[d], &j))) return st;
        c[d] = j;
        ST(y, kn_ref_off(y, i), LD(x, off_of(x, c)));
    }
    return KN_OK;
}

/* ---- index_add: y = x; y[c with c[d] = index[c[d]]] += src[c] ------------- */
static kn_status ref_index_add(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    int64_t n = kn_tview_numel(y), m = kn_tview_numel(s), c[KN_MAX_DIMS], j;
    kn_status st = check_slices("index_add", s, y, iv, d);
    if (st) return st;
    double *acc = load_all("index_add", x, n);
    if (!acc) return KN_ERR_NOMEM;
    for (int64_t i = 0; i < m; i++) {
        unravel(s->ne, s->ndim, i, c);
        if ((st = load_index("index_add", iv, c[d] * iv->st[0], d, y->ne[d], &j))) { free(acc); return st; }
        double v = LD(s, off_of(s, c));
        c[d] = j;
        acc[ravel(y->ne, y->ndim, c)] += v;
    }
    store_all(y, acc, n);
    free(acc);
    return KN_OK;
}

/* ---- index_copy (effect): dst[c with c[d] = index[c[d]]] = src[c] ----------
 * Every index is checked and src is read before the first write, so a bad
 * index leaves dst untouched and src may alias dst. */
static kn_status ref_index_copy(const kn_exec *e) {
    const kn_tview *y = &e->dst, *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    int64_t m = kn_tview_numel(s), k = iv->ne[0], c[KN_MAX_DIMS];
    kn_status st = check_slices("index_copy", s, y, iv, d);
    if (st) return st;
    double *val = malloc(sizeof(double) * (size_t)(m ? m : 1));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(k ? k : 1));
    if (!val || !pos) { free(val); free(pos); return kn_set_error(KN_ERR_NOMEM, "index_copy: out of memory for %lld elements", (long long)m); }
    for (int64_t i = 0; i < k && !st; i++) st = load_index("index_copy", iv, i * iv->st[0], d, y->ne[d], &pos[i]);
    if (!st) {
        for (int64_t i = 0; i < m; i++) val[i] = LD(s, kn_ref_off(s, i));
        for (int64_t i = 0; i < m; i++) {
            unravel(s->ne, s->ndim, i, c);
            c[d] = pos[c[d]];
            ST(y, off_of(y, c), val[i]);
        }
    }
    free(val); free(pos);
    return st;
}

kn_status kn_ref_index(const kn_exec *e) {
    switch (e->node->op) {
    case KN_OP_CAT: return ref_cat(e);
    case KN_OP_PAD: return ref_pad(e);
    case KN_OP_GATHER: return ref_gather(e);
    case KN_OP_SCATTER: return ref_scatter(e, false);
    case KN_OP_SCATTER_ADD: return ref_scatter(e, true);
    case KN_OP_INDEX_SELECT: return ref_index_select(e);
    case KN_OP_INDEX_ADD: return ref_index_add(e);
    case KN_OP_INDEX_COPY: return ref_index_copy(e);
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no kernel for %s in the index family", kn_op_name(e->node->op));
}
