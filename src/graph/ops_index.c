/* ops_index.c: cat/stack/split/chunk/repeat, pad, gather, scatter(_add),
 * index_select/add/copy.
 *
 * Primitive nodes: CAT (at most KN_MAX_SRC sources; longer lists become a
 * balanced tree of cats), PAD, GATHER, SCATTER, SCATTER_ADD, INDEX_SELECT,
 * INDEX_ADD and the side effect INDEX_COPY. stack, split, chunk and repeat
 * are composites of views, cat and copies. Index tensors may have any
 * integer dtype (not bool); their values are checked at run time by the
 * kernels (negative indices are rejected, unlike python's a[-1]).
 * Non-goals: symbolic extents along a concatenated or padded dim.
 */
#include "graph/graph.h"
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

static bool index_dtype_ok(kn_ctx *ctx, const char *op, const kn_tensor *index) {
    const kn_dtype_info *di = kn_dtype_get(index->dtype);
    if (di && di->is_int && index->dtype != KN_BOOL) return true;
    char s[160];
    kn__fail(ctx, KN_ERR_INVALID, "%s: index must have an integer dtype (i8/i32/i64/u8), got %s %s; cast it with kn_cast",
             op, kn_dtype_name(index->dtype), kn__shape_str(index, s, sizeof s));
    return false;
}

/* Inputs that kn__node does not see (extra sources of a view node). */
static bool live_in(kn_ctx *ctx, const char *op, const kn_tensor *t, int k) {
    if (!kn__alive(t)) {
        kn__fail(ctx, KN_ERR_STATE, "%s: input %d was freed (its context was reset or freed); build the graph again", op, k);
        return false;
    }
    if (t->ctx != ctx) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: input %d belongs to another context; tensors of one graph must share a context", op, k);
        return false;
    }
    return true;
}

/* The dim of an index op: normalised, and x must have at least one dim. */
static bool index_dim(kn_ctx *ctx, const char *op, const kn_tensor *x, int dim, int *d) {
    if (x->ndim == 0) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: x is 0-d; index ops need at least one dim (unsqueeze it first)", op);
        return false;
    }
    bool ok = true;
    *d = kn__norm_dim(ctx, op, dim, x->ndim, &ok);
    return ok;
}

/* ---- cat, stack, split, chunk, repeat ------------------------------------------ */

static kn_tensor *cat_node(kn_ctx *ctx, kn_tensor **xs, int n, int d) {
    int64_t shape[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    memcpy(shape, xs[0]->shape, sizeof shape);
    memcpy(sym, xs[0]->sym, sizeof sym);
    kn_dtype dt = xs[0]->dtype;
    shape[d] = 0;
    for (int i = 0; i < n; i++) { shape[d] += xs[i]->shape[d]; dt = kn__promote(dt, xs[i]->dtype); }
    kn_tensor *t = kn__node(ctx, KN_OP_CAT, dt, xs[0]->ndim, shape, sym, xs, n);
    if (t) t->p.axis.dim = d;
    return t;
}

/* n > KN_MAX_SRC: cat KN_MAX_SRC balanced groups, each a (recursive) cat. */
static kn_tensor *cat_tree(kn_ctx *ctx, kn_tensor **xs, int n, int d) {
    if (n <= KN_MAX_SRC) return cat_node(ctx, xs, n, d);
    kn_tensor *part[KN_MAX_SRC];
    int at = 0;
    for (int g = 0; g < KN_MAX_SRC; g++) {
        int m = n / KN_MAX_SRC + (g < n % KN_MAX_SRC);
        part[g] = m == 1 ? xs[at] : cat_tree(ctx, xs + at, m, d);
        if (!part[g]) return NULL;
        at += m;
    }
    return cat_node(ctx, part, KN_MAX_SRC, d);
}

kn_tensor *kn_cat(kn_ctx *ctx, kn_tensor **xs, int n, int dim) {
    if (n <= 0 || !xs) return kn__fail(ctx, KN_ERR_INVALID, "cat: needs at least one tensor, got %d", n);
    for (int i = 0; i < n; i++) if (!xs[i]) return NULL;
    const kn_tensor *a = xs[0];
    if (a->ndim == 0) return kn__fail(ctx, KN_ERR_INVALID, "cat: tensor 0 is 0-d; 0-d tensors cannot be concatenated (use kn_stack)");
    bool ok = true;
    int d = kn__norm_dim(ctx, "cat", dim, a->ndim, &ok);
    if (!ok) return NULL;
    for (int i = 0; i < n; i++) {
        const kn_tensor *b = xs[i];
        bool same = b->ndim == a->ndim;
        for (int k = 0; same && k < a->ndim; k++)
            if (k != d && (b->shape[k] != a->shape[k] || b->sym[k] != a->sym[k])) same = false;
        if (!same) {
            char s1[160], s2[160];
            return kn__fail(ctx, KN_ERR_INVALID, "cat: tensor %d %s does not match tensor 0 %s in every dim but dim %d",
                            i, kn__shape_str(b, s1, sizeof s1), kn__shape_str(a, s2, sizeof s2), d);
        }
        if (b->sym[d]) {
            char s1[160];
            return kn__fail(ctx, KN_ERR_UNSUPPORTED, "cat: tensor %d %s is symbolic along the cat dim %d; cat along a fixed dim or write into a buffer with kn_index_copy",
                            i, kn__shape_str(b, s1, sizeof s1), d);
        }
    }
    return cat_tree(ctx, xs, n, d);
}

kn_tensor *kn_stack(kn_ctx *ctx, kn_tensor **xs, int n, int dim) {
    if (n <= 0 || !xs) return kn__fail(ctx, KN_ERR_INVALID, "stack: needs at least one tensor, got %d", n);
    for (int i = 0; i < n; i++) if (!xs[i]) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "stack", dim, xs[0]->ndim + 1, &ok);
    if (!ok) return NULL;
    for (int i = 1; i < n; i++)
        if (!kn_same_shape(xs[i], xs[0])) {
            char s1[160], s2[160];
            return kn__fail(ctx, KN_ERR_INVALID, "stack: tensor %d %s differs from tensor 0 %s; stacked tensors must have equal shapes",
                            i, kn__shape_str(xs[i], s1, sizeof s1), kn__shape_str(xs[0], s2, sizeof s2));
        }
    kn_tensor **u = malloc(sizeof *u * (size_t)n);
    if (!u) return kn__fail(ctx, KN_ERR_NOMEM, "stack: out of memory for %d tensors", n);
    kn_tensor *t = NULL;
    int i = 0;
    for (; i < n; i++) if (!(u[i] = kn_unsqueeze(ctx, xs[i], d))) break;
    if (i == n) t = kn_cat(ctx, u, n, d);
    free(u);
    return t;
}

/* `count` narrow views of `size` along d into out[]; returns count, or -1. */
static int split_views(kn_ctx *ctx, const char *op, kn_tensor *x, int d, int64_t size, int count,
                       kn_tensor **out, int max_out) {
    if (!out) return count;
    if (count > max_out) {
        char s[160];
        kn__fail(ctx, KN_ERR_INVALID, "%s: %s along dim %d gives %d pieces but out[] holds %d; pass a larger out[]",
                 op, kn__shape_str(x, s, sizeof s), d, count, max_out);
        return -1;
    }
    int64_t n = x->shape[d];
    for (int i = 0; i < count; i++) {
        int64_t start = (int64_t)i * size, len = n - start < size ? n - start : size;
        if (len < 0) len = 0;
        if (start > n) start = n;
        out[i] = kn_narrow(ctx, x, d, start, len);
        if (!out[i]) return -1;
    }
    return count;
}

/* Returns the number of pieces, or -1 on error (x NULL included). out may be
 * NULL to only count them. */
int kn_split(kn_ctx *ctx, kn_tensor *x, int64_t size, int dim, kn_tensor **out, int max_out) {
    if (!x) return -1;
    int d;
    if (!index_dim(ctx, "split", x, dim, &d)) return -1;
    if (x->sym[d]) { kn__fail(ctx, KN_ERR_UNSUPPORTED, "split: dim %d is symbolic; split a fixed dim", d); return -1; }
    int64_t n = x->shape[d];
    if (size <= 0) { kn__fail(ctx, KN_ERR_INVALID, "split: piece size must be positive, got %lld", (long long)size); return -1; }
    int64_t count = n == 0 ? 1 : (n + size - 1) / size;
    if (count > (1 << 30)) { kn__fail(ctx, KN_ERR_LIMIT, "split: %lld pieces is too many", (long long)count); return -1; }
    return split_views(ctx, "split", x, d, size, (int)count, out, max_out);
}

/* torch.chunk: pieces of ceil(n / chunks); may give fewer than chunks. */
int kn_chunk(kn_ctx *ctx, kn_tensor *x, int chunks, int dim, kn_tensor **out, int max_out) {
    if (!x) return -1;
    int d;
    if (!index_dim(ctx, "chunk", x, dim, &d)) return -1;
    if (x->sym[d]) { kn__fail(ctx, KN_ERR_UNSUPPORTED, "chunk: dim %d is symbolic; chunk a fixed dim", d); return -1; }
    if (chunks <= 0) { kn__fail(ctx, KN_ERR_INVALID, "chunk: chunks must be positive, got %d", chunks); return -1; }
    int64_t n = x->shape[d];
    if (n == 0) return split_views(ctx, "chunk", x, d, 0, chunks, out, max_out);
    int64_t size = (n + chunks - 1) / chunks;
    return split_views(ctx, "chunk", x, d, size, (int)((n + size - 1) / size), out, max_out);
}

/* Repeat dim i of a rank-3 [P, S, Q] view r times: [P, 1, S, Q] -> expand -> [P, r*S, Q].
 * The expanded tensor is copied before the final reshape (rather than left to
 * kn_reshape): kn_reshape can take a stride-0 dim next to size-1 dims for a
 * viewable layout, so merging dims of an expanded view is not trusted. */
static kn_tensor *repeat_one(kn_ctx *ctx, kn_tensor *x, int i, int64_t r) {
    int64_t p = 1, q = 1, s = x->shape[i];
    for (int k = 0; k < i; k++) p *= x->shape[k];
    for (int k = i + 1; k < x->ndim; k++) q *= x->shape[k];
    kn_tensor *v = kn_reshape(ctx, x, 4, (int64_t[]){p, 1, s, q});
    v = kn_copy(ctx, kn_expand(ctx, v, 4, (int64_t[]){p, r, s, q}));
    int64_t shape[KN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[i] = r * s;
    return kn_reshape(ctx, v, x->ndim, shape);
}

kn_tensor *kn_repeat(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *repeats) {
    if (!x) return NULL;
    char s[160];
    if (ndim < x->ndim || ndim > KN_MAX_DIMS || (ndim && !repeats))
        return kn__fail(ctx, KN_ERR_INVALID, "repeat: %d repeat counts for %s; give one per dim (at least %d, at most %d)",
                        ndim, kn__shape_str(x, s, sizeof s), x->ndim, KN_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (repeats[i] < 0)
            return kn__fail(ctx, KN_ERR_INVALID, "repeat: repeat count %lld for dim %d is negative", (long long)repeats[i], i);
        int j = i - (ndim - x->ndim);
        if (j >= 0 && x->sym[j] && repeats[i] != 1)
            return kn__fail(ctx, KN_ERR_UNSUPPORTED, "repeat: dim %d of %s is symbolic and can only be repeated once", j, kn__shape_str(x, s, sizeof s));
    }
    kn_tensor *v = x;
    while (v && v->ndim < ndim) v = kn_unsqueeze(ctx, v, 0);
    if (!v) return NULL;
    int nrep = 0;
    for (int i = 0; i < ndim; i++) nrep += repeats[i] != 1;
    if (nrep == 0) return kn_copy(ctx, v);
    if (ndim + nrep <= KN_MAX_DIMS) {
        /* one copy: insert a broadcast dim of size r before every repeated dim */
        int64_t sh[KN_MAX_DIMS], ex[KN_MAX_DIMS], out[KN_MAX_DIMS];
        int m = 0;
        for (int i = 0; i < ndim; i++) {
            if (repeats[i] != 1) { sh[m] = 1; ex[m] = repeats[i]; m++; }
            sh[m] = v->shape[i]; ex[m] = v->shape[i]; m++;
            out[i] = repeats[i] * v->shape[i];
        }
        v = kn_reshape(ctx, v, m, sh);
        v = kn_copy(ctx, kn_expand(ctx, v, m, ex));
        return kn_reshape(ctx, v, ndim, out);
    }
    /* many dims: one dim at a time, each through a rank-4 view */
    for (int i = 0; v && i < ndim; i++)
        if (repeats[i] != 1) v = repeat_one(ctx, v, i, repeats[i]);
    return v;
}

/* ---- pad ------------------------------------------------------------------------- */

kn_tensor *kn_pad(kn_ctx *ctx, kn_tensor *x, int npairs, const int64_t *pads, kn_pad_mode mode, double value) {
    if (!x) return NULL;
    char s[160];
    if (npairs < 0 || npairs > x->ndim || (npairs && !pads))
        return kn__fail(ctx, KN_ERR_INVALID, "pad: %d (before, after) pairs for %s; give at most one pair per dim, last dim first",
                        npairs, kn__shape_str(x, s, sizeof s));
    if (mode != KN_PAD_CONSTANT && mode != KN_PAD_REFLECT && mode != KN_PAD_REPLICATE)
        return kn__fail(ctx, KN_ERR_INVALID, "pad: unknown mode %d (constant, reflect or replicate)", (int)mode);
    int64_t shape[KN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int k = 0; k < npairs; k++) {
        int d = x->ndim - 1 - k;
        int64_t lo = pads[2 * k], hi = pads[2 * k + 1], n = x->shape[d];
        if (!lo && !hi) continue;
        if (x->sym[d])
            return kn__fail(ctx, KN_ERR_UNSUPPORTED, "pad: dim %d of %s is symbolic; only fixed dims can be padded", d, kn__shape_str(x, s, sizeof s));
        if (n + lo + hi < 0)
            return kn__fail(ctx, KN_ERR_INVALID, "pad: pads (%lld, %lld) on dim %d of %s leave a negative size",
                            (long long)lo, (long long)hi, d, kn__shape_str(x, s, sizeof s));
        if (mode == KN_PAD_REFLECT && (lo >= n || hi >= n))
            return kn__fail(ctx, KN_ERR_INVALID, "pad: reflect pads (%lld, %lld) on dim %d of %s must each be less than the dim size %lld",
                            (long long)lo, (long long)hi, d, kn__shape_str(x, s, sizeof s), (long long)n);
        if (mode == KN_PAD_REPLICATE && n == 0 && (lo > 0 || hi > 0))
            return kn__fail(ctx, KN_ERR_INVALID, "pad: replicate cannot pad the empty dim %d of %s", d, kn__shape_str(x, s, sizeof s));
        shape[d] = n + lo + hi;
    }
    kn_tensor *t = kn__node(ctx, KN_OP_PAD, x->dtype, x->ndim, shape, x->sym, &x, 1);
    if (!t) return NULL;
    memset(t->p.pad.pad, 0, sizeof t->p.pad.pad);
    for (int k = 0; k < 2 * npairs; k++) t->p.pad.pad[k] = pads[k];
    t->p.pad.mode = mode;
    t->p.pad.value = value;
    return t;
}

/* ---- gather, scatter, scatter_add ---------------------------------------------- */

kn_tensor *kn_gather(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index) {
    if (!x || !index) return NULL;
    int d;
    if (!index_dim(ctx, "gather", x, dim, &d) || !index_dtype_ok(ctx, "gather", index)) return NULL;
    bool ok = index->ndim == x->ndim;
    for (int k = 0; ok && k < x->ndim; k++) if (k != d && index->shape[k] > x->shape[k]) ok = false;
    if (!ok) {
        char s1[160], s2[160];
        return kn__fail(ctx, KN_ERR_INVALID, "gather: index %s must have the dims of x %s and be no larger in every dim but dim %d",
                        kn__shape_str(index, s1, sizeof s1), kn__shape_str(x, s2, sizeof s2), d);
    }
    kn_tensor *s[2] = {x, index};
    kn_tensor *t = kn__node(ctx, KN_OP_GATHER, x->dtype, index->ndim, index->shape, index->sym, s, 2);
    if (t) t->p.axis.dim = d;
    return t;
}

static kn_tensor *scatter_impl(kn_ctx *ctx, kn_op op, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src) {
    if (!x || !index || !src) return NULL;
    const char *name = kn_op_name(op);
    int d;
    if (!index_dim(ctx, name, x, dim, &d) || !index_dtype_ok(ctx, name, index)) return NULL;
    bool ok = index->ndim == x->ndim && src->ndim == x->ndim;
    for (int k = 0; ok && k < x->ndim; k++)
        if ((k != d && index->shape[k] > x->shape[k]) || index->shape[k] > src->shape[k]) ok = false;
    if (!ok) {
        char s1[160], s2[160], s3[160];
        return kn__fail(ctx, KN_ERR_INVALID, "%s: index %s must have the dims of x %s and src %s, be no larger than src, and no larger than x in every dim but dim %d",
                        name, kn__shape_str(index, s1, sizeof s1), kn__shape_str(x, s2, sizeof s2), kn__shape_str(src, s3, sizeof s3), d);
    }
    kn_tensor *s[3] = {x, index, src};
    kn_tensor *t = kn__node(ctx, op, x->dtype, x->ndim, x->shape, x->sym, s, 3);
    if (t) t->p.axis.dim = d;
    return t;
}
kn_tensor *kn_scatter(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src) {
    return scatter_impl(ctx, KN_OP_SCATTER, x, dim, index, src);
}
kn_tensor *kn_scatter_add(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src) {
    return scatter_impl(ctx, KN_OP_SCATTER_ADD, x, dim, index, src);
}

/* ---- index_select, index_add, index_copy ---------------------------------------- */

static bool index_1d(kn_ctx *ctx, const char *op, const kn_tensor *index) {
    if (!index_dtype_ok(ctx, op, index)) return false;
    if (index->ndim == 1) return true;
    char s[160];
    kn__fail(ctx, KN_ERR_INVALID, "%s: index must be 1-d, got %s %s",
             op, kn_dtype_name(index->dtype), kn__shape_str(index, s, sizeof s));
    return false;
}

/* src must match x except along d, where it has index's length (max
 * extents; the kernels check run-time extents). */
static bool slices_match(kn_ctx *ctx, const char *op, const kn_tensor *x, int d, const kn_tensor *index, const kn_tensor *src) {
    bool ok = src->ndim == x->ndim;
    for (int i = 0; ok && i < x->ndim; i++)
        ok = (i == d) ? src->shape[i] == index->shape[0] : src->shape[i] == x->shape[i];
    if (!ok) {
        char s1[160], s2[160];
        kn__fail(ctx, KN_ERR_INVALID, "%s: src %s must match x %s except along dim %d, where it has the index length %lld",
                 op, kn__shape_str(src, s1, sizeof s1), kn__shape_str(x, s2, sizeof s2), d, (long long)index->shape[0]);
    }
    return ok;
}

kn_tensor *kn_index_select(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index) {
    if (!x || !index) return NULL;
    int d;
    if (!index_dim(ctx, "index_select", x, dim, &d) || !index_1d(ctx, "index_select", index)) return NULL;
    int64_t shape[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(sym, x->sym, sizeof sym);
    shape[d] = index->shape[0];
    sym[d] = index->sym[0];
    kn_tensor *s[2] = {x, index};
    kn_tensor *t = kn__node(ctx, KN_OP_INDEX_SELECT, x->dtype, x->ndim, shape, sym, s, 2);
    if (t) t->p.axis.dim = d;
    return t;
}

/* out = x with src's slices added at index positions along dim:
 * out[..., index[i], ...] += src[..., i, ...]. x [.., n, ..], index int [m], src [.., m, ..] */
kn_tensor *kn_index_add(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src) {
    if (!x || !index || !src) return NULL;
    int d;
    if (!index_dim(ctx, "index_add", x, dim, &d) || !index_1d(ctx, "index_add", index)) return NULL;
    if (!slices_match(ctx, "index_add", x, d, index, src)) return NULL;
    kn_tensor *s[3] = {x, index, src};
    kn_tensor *t = kn__node(ctx, KN_OP_INDEX_ADD, x->dtype, x->ndim, x->shape, x->sym, s, 3);
    if (t) t->p.axis.dim = d;
    return t;
}

/* Side effect: dst[..., index[i], ...] = src[..., i, ...] when the node runs.
 * The result is a view of dst (sources: dst, index, src); no gradient. */
kn_tensor *kn_index_copy(kn_ctx *ctx, kn_tensor *dst, int dim, kn_tensor *index, kn_tensor *src) {
    if (!dst || !index || !src) return NULL;
    if (!live_in(ctx, "index_copy", index, 1) || !live_in(ctx, "index_copy", src, 2)) return NULL;
    int d;
    if (!index_dim(ctx, "index_copy", dst, dim, &d) || !index_1d(ctx, "index_copy", index)) return NULL;
    kn_tensor *own = kn__storage_owner(dst);
    if (own->op != KN_OP_NONE)
        return kn__fail(ctx, KN_ERR_INVALID, "index_copy: the destination must be a materialised tensor (data, input or parameter) or a view of one; got a %s node",
                        kn_op_name(own->op));
    if (!slices_match(ctx, "index_copy", dst, d, index, src)) return NULL;
    kn_tensor *t = kn__view_node(ctx, KN_OP_INDEX_COPY, dst, dst->ndim, dst->shape, dst->stride, dst->offset, dst->sym);
    if (!t) return NULL;
    t->src[1] = index;
    t->src[2] = src;
    t->p.axis.dim = d;
    t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
    return t;
}
