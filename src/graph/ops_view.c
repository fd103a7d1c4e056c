/* ops_view.c: zero-copy views. A view shares its source's storage; only
 * shape, strides and offset change. Reshape of a non-viewable layout falls
 * back to a copy (kn_view refuses instead). */
#include "graph/graph.h"
#include <string.h>

/* Try to express `shape` as a view of x's layout (numpy's attempt_nocopy_reshape).
 * Walks groups of old dims that multiply to groups of new dims; each old group
 * must be contiguous within itself. */
static bool view_strides(const kn_tensor *x, int ndim, const int64_t *shape, int64_t *stride) {
    int oi = 0, ni = 0;
    int on = x->ndim;
    const int64_t *os = x->shape, *ost = x->stride;
    if (kn_numel(x) == 0) { kn__contig_strides(ndim, shape, stride); return true; }
    while (oi < on && ni < ndim) {
        int64_t np = shape[ni], op = os[oi];
        int oj = oi + 1, nj = ni + 1;
        while (np != op) {
            if (np < op) { if (nj >= ndim) return false; np *= shape[nj++]; }
            else { if (oj >= on) return false; op *= os[oj++]; }
        }
        /* old dims [oi, oj) merge or split into new dims [ni, nj): each pair
         * of consecutive non-1 old dims must be laid out contiguously (size-1
         * dims carry no layout, whatever their stride) */
        int last = -1;
        for (int k = oi; k < oj; k++) {
            if (os[k] == 1) continue;
            if (last >= 0 && ost[last] != os[k] * ost[k]) return false;
            last = k;
        }
        int64_t s = last >= 0 ? ost[last] : 1;
        for (int k = nj - 1; k >= ni; k--) { stride[k] = s; s *= shape[k]; }
        oi = oj; ni = nj;
    }
    /* trailing size-1 dims */
    for (; ni < ndim; ni++) { if (shape[ni] != 1) return false; stride[ni] = 1; }
    for (; oi < on; oi++) if (os[oi] != 1) return false;
    return true;
}

static bool resolve_shape(kn_ctx *ctx, const char *op, const kn_tensor *x, int ndim, const int64_t *in, int64_t *out) {
    if (ndim < 0 || ndim > KN_MAX_DIMS) { kn__fail(ctx, KN_ERR_LIMIT, "%s: %d dims (max %d)", op, ndim, KN_MAX_DIMS); return false; }
    int neg = -1; int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (in[i] == -1) {
            if (neg >= 0) { kn__fail(ctx, KN_ERR_INVALID, "%s: only one dim may be -1", op); return false; }
            neg = i;
        } else if (in[i] < 0) { kn__fail(ctx, KN_ERR_INVALID, "%s: invalid size %lld", op, (long long)in[i]); return false; }
        else known *= in[i];
        out[i] = in[i];
    }
    int64_t n = kn_numel(x);
    if (neg >= 0) {
        if (known == 0 || n % known) {
            char s[160];
            kn__fail(ctx, KN_ERR_INVALID, "%s: cannot infer -1 for %lld elements of %s", op, (long long)n, kn__shape_str(x, s, sizeof s));
            return false;
        }
        out[neg] = n / known; known *= out[neg];
    }
    if (known != n) {
        char s[160];
        kn__fail(ctx, KN_ERR_INVALID, "%s: shape with %lld elements requested from %s with %lld elements",
                 op, (long long)known, kn__shape_str(x, s, sizeof s), (long long)n);
        return false;
    }
    return true;
}

/* Symbolic dims may only pass through a reshape unchanged: each sym dim of x
 * must appear as a dim of the same max size, in the same order. */
static bool map_syms(const kn_tensor *x, int ndim, const int64_t *shape, int8_t *sym) {
    memset(sym, 0, (size_t)ndim);
    int j = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (!x->sym[i]) continue;
        /* prefix products must line up so the sym dim is its own dim */
        int64_t pre_x = 1; for (int k = 0; k < i; k++) pre_x *= x->shape[k];
        int64_t pre = 1; bool found = false;
        for (; j < ndim; j++) {
            if (pre == pre_x && shape[j] == x->shape[i]) { sym[j] = x->sym[i]; found = true; j++; break; }
            pre *= shape[j];
        }
        if (!found) return false;
    }
    return true;
}

static kn_tensor *reshape_impl(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape_in, bool allow_copy) {
    if (!x) return NULL;
    const char *op = allow_copy ? "reshape" : "view";
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    if (!resolve_shape(ctx, op, x, ndim, shape_in, shape)) return NULL;
    int8_t sym[KN_MAX_DIMS];
    if (!map_syms(x, ndim, shape, sym)) {
        char s[160];
        return kn__fail(ctx, KN_ERR_UNSUPPORTED, "%s: a symbolic dim of %s must stay a dim of its own", op, kn__shape_str(x, s, sizeof s));
    }
    if (view_strides(x, ndim, shape, stride))
        return kn__view_node(ctx, KN_OP_RESHAPE, x, ndim, shape, stride, x->offset, sym);
    if (!allow_copy) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "view: the layout of %s cannot be viewed with the new shape; use kn_reshape (copies) or kn_contiguous first",
                        kn__shape_str(x, s, sizeof s));
    }
    kn_tensor *c = kn_copy(ctx, x);
    if (!c) return NULL;
    kn__contig_strides(ndim, shape, stride);
    return kn__view_node(ctx, KN_OP_RESHAPE, c, ndim, shape, stride, 0, sym);
}

kn_tensor *kn_reshape(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape) { return reshape_impl(ctx, x, ndim, shape, true); }
kn_tensor *kn_view(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape) { return reshape_impl(ctx, x, ndim, shape, false); }

kn_tensor *kn_permute(kn_ctx *ctx, kn_tensor *x, const int *perm) {
    if (!x) return NULL;
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    bool seen[KN_MAX_DIMS] = {0};
    kn_op_params p;
    memset(&p, 0, sizeof p);   /* the rewrites' CSE hashes and compares all of it */
    for (int i = 0; i < x->ndim; i++) {
        int d = perm[i] < 0 ? perm[i] + x->ndim : perm[i];
        if (d < 0 || d >= x->ndim || seen[d])
            return kn__fail(ctx, KN_ERR_INVALID, "permute: entry %d (%d) is not a permutation of 0..%d", i, perm[i], x->ndim - 1);
        seen[d] = true;
        shape[i] = x->shape[d]; stride[i] = x->stride[d]; sym[i] = x->sym[d];
        p.permute.perm[i] = d;
    }
    kn_tensor *t = kn__view_node(ctx, KN_OP_PERMUTE, x, x->ndim, shape, stride, x->offset, sym);
    if (t) t->p = p;
    return t;
}

kn_tensor *kn_transpose(kn_ctx *ctx, kn_tensor *x, int d0, int d1) {
    if (!x) return NULL;
    bool ok = true;
    d0 = kn__norm_dim(ctx, "transpose", d0, x->ndim, &ok);
    d1 = kn__norm_dim(ctx, "transpose", d1, x->ndim, &ok);
    if (!ok) return NULL;
    int perm[KN_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[d0] = d1; perm[d1] = d0;
    return kn_permute(ctx, x, perm);
}

kn_tensor *kn_expand(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape_in) {
    if (!x) return NULL;
    if (ndim < x->ndim || ndim > KN_MAX_DIMS) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "expand: cannot expand %s to %d dims", kn__shape_str(x, s, sizeof s), ndim);
    }
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    int off = ndim - x->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - off;
        int64_t want = shape_in[i];
        if (j < 0) {
            if (want < 0) return kn__fail(ctx, KN_ERR_INVALID, "expand: -1 is not allowed for a new leading dim %d", i);
            shape[i] = want; stride[i] = 0; sym[i] = 0;
        } else if (want == -1 || want == x->shape[j]) {
            shape[i] = x->shape[j]; stride[i] = x->stride[j]; sym[i] = x->sym[j];
        } else if (x->shape[j] == 1 && !x->sym[j]) {
            shape[i] = want; stride[i] = 0; sym[i] = 0;
        } else {
            char s[160];
            return kn__fail(ctx, KN_ERR_INVALID, "expand: dim %d of %s has size %lld, which cannot expand to %lld (only size-1 dims expand)",
                            j, kn__shape_str(x, s, sizeof s), (long long)x->shape[j], (long long)want);
        }
    }
    return kn__view_node(ctx, KN_OP_EXPAND, x, ndim, shape, stride, x->offset, sym);
}
kn_tensor *kn__repeat_heads(kn_ctx *ctx, kn_tensor *kv, int64_t G) {
    if (!kv || G == 1) return kv;
    int64_t B = kv->shape[0], H = kv->shape[1], T = kv->shape[2], D = kv->shape[3];
    int64_t s5[5] = {B, H, 1, T, D}, e5[5] = {B, H, G, T, D}, s4[4] = {B, H * G, T, D};
    return kn_reshape(ctx, kn_expand(ctx, kn_reshape(ctx, kv, 5, s5), 5, e5), 4, s4);
}
kn_tensor *kn_broadcast_to(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape) { return kn_expand(ctx, x, ndim, shape); }

kn_tensor *kn_slice(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int64_t end, int64_t step) {
    if (!x) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "slice", dim, x->ndim, &ok);
    if (!ok) return NULL;
    if (step <= 0) return kn__fail(ctx, KN_ERR_INVALID, "slice: step must be positive, got %lld", (long long)step);
    if (x->sym[d]) return kn__fail(ctx, KN_ERR_UNSUPPORTED, "slice: dim %d is symbolic; slice it with kn_slice_sym", d);
    int64_t n = x->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (start > n) start = n;
    if (end > n) end = n;
    if (end < start) end = start;
    int64_t len = (end - start + step - 1) / step;
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape); memcpy(stride, x->stride, sizeof stride);
    shape[d] = len; stride[d] = x->stride[d] * step;
    kn_tensor *t = kn__view_node(ctx, KN_OP_SLICE, x, x->ndim, shape, stride, x->offset + start * x->stride[d], x->sym);
    if (t) { t->p.slice.dim = d; t->p.slice.start = start; t->p.slice.step = step; }
    return t;
}

kn_tensor *kn_slice_sym(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int sym) {
    if (!x) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "slice_sym", dim, x->ndim, &ok);
    if (!ok) return NULL;
    if (sym < 1 || sym > ctx->n_syms) return kn__fail(ctx, KN_ERR_INVALID, "slice_sym: unknown symbol %d", sym);
    int64_t max = ctx->sym_max[sym];
    if (start < 0 || start + max > x->shape[d] || x->sym[d])
        return kn__fail(ctx, KN_ERR_INVALID, "slice_sym: [%lld, %lld + %s (max %lld)) does not fit in dim %d of size %lld",
                        (long long)start, (long long)start, ctx->sym_name[sym], (long long)max, d, (long long)x->shape[d]);
    int64_t shape[KN_MAX_DIMS];
    int8_t s[KN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape); memcpy(s, x->sym, sizeof s);
    shape[d] = max; s[d] = (int8_t)sym;
    kn_tensor *t = kn__view_node(ctx, KN_OP_SLICE, x, x->ndim, shape, x->stride, x->offset + start * x->stride[d], s);
    if (t) { t->p.slice.dim = d; t->p.slice.start = start; t->p.slice.step = 1; }
    return t;
}

kn_tensor *kn_narrow(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int64_t len) {
    if (!x) return NULL;
    if (len < 0) return kn__fail(ctx, KN_ERR_INVALID, "narrow: negative length %lld", (long long)len);
    return kn_slice(ctx, x, dim, start, start + len, 1);
}

kn_tensor *kn_squeeze(kn_ctx *ctx, kn_tensor *x, int dim) {
    if (!x) return NULL;
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    int d = -1, n = 0;
    if (dim != -99) {
        bool ok = true;
        d = kn__norm_dim(ctx, "squeeze", dim, x->ndim, &ok);
        if (!ok) return NULL;
    }
    for (int i = 0; i < x->ndim; i++) {
        bool drop = (d < 0) ? (x->shape[i] == 1 && !x->sym[i]) : (i == d && x->shape[i] == 1 && !x->sym[i]);
        if (drop) continue;
        shape[n] = x->shape[i]; stride[n] = x->stride[i]; sym[n] = x->sym[i]; n++;
    }
    return kn__view_node(ctx, KN_OP_RESHAPE, x, n, shape, stride, x->offset, sym);
}

kn_tensor *kn_select(kn_ctx *ctx, kn_tensor *x, int dim, int64_t index) {
    if (!x) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "select", dim, x->ndim, &ok);
    if (!ok) return NULL;
    int64_t n = x->shape[d];
    if (index < -n || index >= n)
        return kn__fail(ctx, KN_ERR_INVALID, "select: index %lld out of range for dim %d of size %lld", (long long)index, d, (long long)n);
    kn_tensor *s = kn_slice(ctx, x, d, index < 0 ? index + n : index, (index < 0 ? index + n : index) + 1, 1);
    return kn_squeeze(ctx, s, d);
}

kn_tensor *kn_unsqueeze(kn_ctx *ctx, kn_tensor *x, int dim) {
    if (!x) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "unsqueeze", dim, x->ndim + 1, &ok);
    if (!ok) return NULL;
    if (x->ndim >= KN_MAX_DIMS) return kn__fail(ctx, KN_ERR_LIMIT, "unsqueeze: already %d dims", KN_MAX_DIMS);
    int64_t shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    for (int i = 0, j = 0; i <= x->ndim; i++) {
        if (i == d) {
            shape[i] = 1; sym[i] = 0;
            stride[i] = j < x->ndim ? x->stride[j] * x->shape[j] : 1;
            continue;
        }
        shape[i] = x->shape[j]; stride[i] = x->stride[j]; sym[i] = x->sym[j]; j++;
    }
    return kn__view_node(ctx, KN_OP_RESHAPE, x, x->ndim + 1, shape, stride, x->offset, sym);
}

kn_tensor *kn_flatten(kn_ctx *ctx, kn_tensor *x, int start_dim, int end_dim) {
    if (!x) return NULL;
    if (x->ndim == 0) { int64_t one = 1; return kn_reshape(ctx, x, 1, &one); }
    bool ok = true;
    int s = kn__norm_dim(ctx, "flatten", start_dim, x->ndim, &ok);
    int e = kn__norm_dim(ctx, "flatten", end_dim, x->ndim, &ok);
    if (!ok) return NULL;
    if (e < s) return kn__fail(ctx, KN_ERR_INVALID, "flatten: end_dim %d is before start_dim %d", e, s);
    int64_t shape[KN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++) shape[n++] = x->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= x->shape[i];
    shape[n++] = m;
    for (int i = e + 1; i < x->ndim; i++) shape[n++] = x->shape[i];
    return kn_reshape(ctx, x, n, shape);
}

kn_tensor *kn_as_strided(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset) {
    if (!x) return NULL;
    if (ndim < 0 || ndim > KN_MAX_DIMS) return kn__fail(ctx, KN_ERR_LIMIT, "as_strided: %d dims (max %d)", ndim, KN_MAX_DIMS);
    kn_tensor *own = kn__storage_owner(x);
    int64_t cap = kn__storage_elems(own);
    int64_t lo = offset, hi = offset;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return kn__fail(ctx, KN_ERR_INVALID, "as_strided: negative size");
        if (shape[i] == 0) { lo = hi = offset; break; }
        int64_t span = (shape[i] - 1) * stride[i];
        if (span < 0) lo += span; else hi += span;
    }
    if (lo < 0 || hi >= cap)
        return kn__fail(ctx, KN_ERR_INVALID, "as_strided: the view reaches elements [%lld, %lld] outside its storage of %lld elements",
                        (long long)lo, (long long)hi, (long long)cap);
    return kn__view_node(ctx, KN_OP_AS_STRIDED, x, ndim, shape, stride, offset, NULL);
}
