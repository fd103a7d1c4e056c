/* ref_sort.c: the reference SORT (src/graph/ops_sort.c states it): per line
 * along the sorted dim, a merge sort of (value, index) in double over any
 * strides. The order is total: by value (NaN largest, -0.0 == 0.0), then by
 * index, descending reversing the values only; so the result is the stable
 * sort and equal on every backend. Integers beyond 2^53 compare as their
 * nearest doubles (the reference reads every dtype as double).
 */
#include "backends/ref/ref.h"
#include <math.h>
#include <stdlib.h>

typedef struct { double v; int64_t i; } item;

/* a strictly before b in ascending order (NaN largest, NaNs equal) */
static inline bool less(double a, double b) {
    if (isnan(a)) return false;
    return isnan(b) || a < b;
}
static inline bool before(const item *a, const item *b, bool desc) {
    if (desc ? less(b->v, a->v) : less(a->v, b->v)) return true;
    if (desc ? less(a->v, b->v) : less(b->v, a->v)) return false;
    return a->i < b->i;
}

/* bottom-up merge sort of a[0..n) with tmp[n] */
static void merge_sort(item *a, item *tmp, int64_t n, bool desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = before(&a[j], &a[i], desc) ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        for (int64_t k = 0; k < n; k++) a[k] = tmp[k];
    }
}

kn_status kn_ref_sort(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.sort.dim;
    bool desc = e->node->p.sort.descending;
    int64_t n = x->ne[d], lines = 1;
    for (int k = 0; k < x->ndim; k++) if (k != d) lines *= x->ne[k];
    if (!n || !lines) return KN_OK;
    item *a = malloc(sizeof(item) * 2 * (size_t)n);
    if (!a) return kn_set_error(KN_ERR_NOMEM, "sort: out of memory for a line of %lld", (long long)n);
    for (int64_t r = 0; r < lines; r++) {
        /* line r's first element: r over the other dims, row-major */
        int64_t xo = 0, yo = 0, lin = r;
        for (int k = x->ndim - 1; k >= 0; k--) {
            if (k == d) continue;
            int64_t q = lin % x->ne[k];
            lin /= x->ne[k];
            xo += q * x->st[k]; yo += q * y->st[k];
        }
        for (int64_t i = 0; i < n; i++) { a[i].v = LD(x, xo + i * x->st[d]); a[i].i = i; }
        merge_sort(a, a + n, n, desc);
        for (int64_t i = 0; i < n; i++) ST(y, yo + i * y->st[d], (double)a[i].i);
    }
    free(a);
    return KN_OK;
}
