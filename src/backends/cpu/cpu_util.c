/* cpu_util.c: what the CPU backend's family files share (cpu_impl.h): rows
 * split over the thread pool, and the byte spans of views (overlap checks
 * that decide whether a fast path may write in place). Kept apart from the
 * dispatch in cpu_backend.c so the family files depend on this file only,
 * not on the dispatch that calls them. */
#include "backends/cpu/threadpool.h"
#include "backends/cpu/cpu_impl.h"

/* ==== threading: rows split over the pool ==================================== */
typedef struct { kn_rows_fn fn; void *ctx; int64_t rows; } par_job;
static void par_worker(void *p, int ith, int nth) {
    par_job *j = p;
    int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    if (r1 > r0) j->fn(j->ctx, r0, r1);
}
void kn_cpu_par_rows(kn_rows_fn fn, void *ctx, int64_t rows, int64_t work) {
    if (rows <= 0) return;
    int nt = kn_pool_nthreads();
    if (work < KN_CPU_PAR_MIN || rows < 2 || nt < 2) { fn(ctx, 0, rows); return; }
    /* a few parts per thread: parts are claimed as threads come free, so a
     * thread that is descheduled (busy machine) delays only its own part */
    int64_t parts = (int64_t)nt * 4 < rows ? (int64_t)nt * 4 : rows;
    par_job j = {fn, ctx, rows};
    kn_pool_run(par_worker, &j, (int)parts);
}

/* ==== views ================================================================== */
/* Byte span [lo, hi) that view v touches (hi == lo when empty). */
static void span_of(const kn_tview *v, const char **lo, const char **hi) {
    size_t es = kn_dtype_get(v->dtype)->type_size;
    int64_t a = 0, b = 0;
    for (int d = 0; d < v->ndim; d++) {
        if (v->ne[d] == 0) { *lo = *hi = v->data; return; }
        int64_t ext = (v->ne[d] - 1) * v->st[d];
        if (ext < 0) a += ext; else b += ext;
    }
    *lo = (const char *)v->data + a * (int64_t)es;
    *hi = (const char *)v->data + (b + 1) * (int64_t)es;
}
bool kn_cpu_overlap(const kn_tview *x, const kn_tview *y) {
    const char *a0, *a1, *b0, *b1;
    span_of(x, &a0, &a1); span_of(y, &b0, &b1);
    return a0 < b1 && b0 < a1;
}
/* x and y are disjoint, or the very same elements (in place) */
bool kn_cpu_same_or_disjoint(const kn_tview *x, const kn_tview *y) {
    if (!kn_cpu_overlap(x, y)) return true;
    if (x->data != y->data || x->ndim != y->ndim) return false;
    for (int d = 0; d < x->ndim; d++) if (x->ne[d] != y->ne[d] || (x->ne[d] > 1 && x->st[d] != y->st[d])) return false;
    return true;
}

