/* ops_index.c: cat/stack/split/chunk/repeat, pad, gather, scatter(_add),
 * index_select/add/copy. */
#include "kn-impl.h"

/* out = x with src's slices added at index positions along dim:
 * out[..., index[i], ...] += src[..., i, ...]. x [.., n, ..], index int [m], src [.., m, ..] */
kn_tensor *kn_index_add(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src) {
    if (!x || !index || !src) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, "index_add", dim, x->ndim, &ok);
    if (!ok) return NULL;
    char s1[160], s2[160];
    if (index->ndim != 1 || kn_dtype_get(index->dtype)->is_float)
        return kn__fail(ctx, KN_ERR_INVALID, "index_add: index must be a 1-d integer tensor, got %s %s",
                        kn_dtype_name(index->dtype), kn__shape_str(index, s1, sizeof s1));
    bool shape_ok = src->ndim == x->ndim;
    for (int i = 0; shape_ok && i < x->ndim; i++)
        shape_ok = (i == d) ? src->shape[i] == index->shape[0] : src->shape[i] == x->shape[i];
    if (!shape_ok)
        return kn__fail(ctx, KN_ERR_INVALID, "index_add: src %s must match x %s except along dim %d, where it has the index length %lld",
                        kn__shape_str(src, s1, sizeof s1), kn__shape_str(x, s2, sizeof s2), d, (long long)index->shape[0]);
    kn_tensor *s[3] = {x, index, src};
    kn_tensor *t = kn__node(ctx, KN_OP_INDEX_ADD, x->dtype, x->ndim, x->shape, x->sym, s, 3);
    if (t) t->p.axis.dim = d;
    return t;
}
