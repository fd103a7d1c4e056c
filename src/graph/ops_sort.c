/* ops_sort.c: stable sort along any dim (SORT), argsort.
 *
 * SORT records only the i64 indices (torch's dtype), like TOPK: the values
 * are a GATHER of x at them, so the gradient of the values is gather's (a
 * scatter-add of g into x at the indices) and SORT itself needs no rule.
 * The order is a total one, so every backend gives the same indices: by
 * value (NaN largest, -0.0 == 0.0), ties by index (stable), descending
 * reversing the values only.
 */
#include "graph/graph.h"

kn_tensor *kn_argsort(kn_ctx *ctx, kn_tensor *x, int dim, bool descending) {
    if (!x) return NULL;
    char a[160];
    const kn_dtype_info *xi = kn_dtype_get(x->dtype);
    if (xi->is_quant || x->ndim < 1)
        return kn__fail(ctx, KN_ERR_INVALID, "sort: x must be a float or integer tensor with at least one dim, got %s %s "
                        "(dequantize it first; a 0-d x is already sorted)", kn_dtype_name(x->dtype), kn__shape_str(x, a, sizeof a));
    bool ok = true;
    int d = kn__norm_dim(ctx, "sort", dim, x->ndim, &ok);
    if (!ok) return NULL;
    kn_tensor *idx = kn__node(ctx, KN_OP_SORT, KN_I64, x->ndim, x->shape, x->sym, &x, 1);
    if (!idx) return NULL;
    idx->p.sort.dim = d;
    idx->p.sort.descending = descending;
    idx->flags &= ~KN_FLAG_REQUIRES_GRAD;          /* integers: the gradient goes through the gather */
    return idx;
}

kn_tensor *kn_sort(kn_ctx *ctx, kn_tensor *x, int dim, bool descending, kn_tensor **indices) {
    if (indices) *indices = NULL;
    kn_tensor *idx = kn_argsort(ctx, x, dim, descending);
    if (!idx) return NULL;
    if (indices) *indices = idx;
    return kn_gather(ctx, x, idx->p.sort.dim, idx);
}
