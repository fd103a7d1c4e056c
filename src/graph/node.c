/* node.c: making nodes: shape checks, broadcasting, dtype promotion, views.
 * Every op constructor in src/graph/ops_*.c goes through kn__node or
 * kn__view_node, so these are the only places that fill a descriptor. */
#include "graph/graph.h"
#include <stdlib.h>
#include <string.h>

const char *kn__shape_str(const kn_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++) {
        if (t->sym[i])
            k += (size_t)snprintf(buf + k, n - k, "%s%s<=%lld", i ? "," : "", t->ctx->sym_name[t->sym[i]], (long long)t->shape[i]);
        else
            k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    }
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

bool kn__alive(const kn_tensor *t) { return t && t->magic == KN_TENSOR_MAGIC; }

void kn__contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) { stride[i] = s; s *= shape[i] > 0 ? shape[i] : 1; }
}

int kn__norm_dim(kn_ctx *ctx, const char *op, int dim, int ndim, bool *ok) {
    int d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= (ndim ? ndim : 1)) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: dim %d is out of range for a %d-d tensor (valid: %d..%d)",
                 op, dim, ndim, -(ndim ? ndim : 1), (ndim ? ndim : 1) - 1);
        *ok = false;
        return 0;
    }
    return d;
}

static bool check_sources(kn_ctx *ctx, kn_op op, kn_tensor *const *src, int nsrc) {
    for (int i = 0; i < nsrc; i++) {
        if (!src[i]) continue;
        if (!kn__alive(src[i])) {
            kn__fail(ctx, KN_ERR_STATE, "%s: input %d was freed (its context was reset or freed); "
                     "build the graph again from live tensors", kn_op_name(op), i);
            return false;
        }
        if (src[i]->ctx != ctx) {
            kn__fail(ctx, KN_ERR_INVALID, "%s: input %d belongs to another context; "
                     "tensors of one graph must share a context", kn_op_name(op), i);
            return false;
        }
    }
    return true;
}

kn_tensor *kn__node(kn_ctx *ctx, kn_op op, kn_dtype dt, int ndim, const int64_t *shape,
                    const int8_t *sym, kn_tensor *const *src, int nsrc) {
    if (!check_sources(ctx, op, src, nsrc)) return NULL;
    if (ndim < 0 || ndim > KN_MAX_DIMS)
        return kn__fail(ctx, KN_ERR_LIMIT, "%s: %d dims requested, kiln supports at most %d", kn_op_name(op), ndim, KN_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return kn__fail(ctx, KN_ERR_INVALID, "%s: negative size %lld in dim %d", kn_op_name(op), (long long)shape[i], i);
    const kn_dtype_info *di = kn_dtype_get(dt);
    if (!di) return kn__fail(ctx, KN_ERR_INVALID, "%s: unknown dtype %d", kn_op_name(op), (int)dt);
    /* quantized storage is whole blocks along the last dim (views may differ) */
    if (di->is_quant && op == KN_OP_NONE && ndim > 0 && shape[ndim - 1] % di->block_size)
        return kn__fail(ctx, KN_ERR_INVALID, "%s: last dim %lld of a %s tensor must be a multiple of its block size %lld",
                        kn_op_name(op), (long long)shape[ndim - 1], di->name, (long long)di->block_size);
    kn_tensor *t = kn__alloc_tensor(ctx);
    if (!t) return kn__fail(ctx, KN_ERR_NOMEM, "%s: out of memory for a tensor descriptor", kn_op_name(op));
    t->op = op;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) { t->shape[i] = shape[i]; t->sym[i] = sym ? sym[i] : 0; }
    kn__contig_strides(ndim, shape, t->stride);
    bool rg = false;
    for (int i = 0; i < nsrc; i++) {
        t->src[i] = src[i];
        if (src[i] && (src[i]->flags & KN_FLAG_REQUIRES_GRAD)) rg = true;
    }
    if (rg && !ctx->no_grad) t->flags |= KN_FLAG_REQUIRES_GRAD;
    return t;
}

kn_tensor *kn__storage_owner(kn_tensor *t) { return t->view_src ? t->view_src : t; }

kn_tensor *kn__view_node(kn_ctx *ctx, kn_op op, kn_tensor *x, int ndim, const int64_t *shape,
                         const int64_t *stride, int64_t offset, const int8_t *sym) {
    kn_tensor *t = kn__node(ctx, op, x->dtype, ndim, shape, sym, &x, 1);
    if (!t) return NULL;
    memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
    t->offset = offset;
    t->flags |= KN_FLAG_VIEW;
    t->view_src = kn__storage_owner(x);
    if (t->view_src->buf) { t->buf = t->view_src->buf; kn_buffer_retain(t->buf); }
    return t;
}

int64_t kn__storage_elems(const kn_tensor *t) {
    int64_t last = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return t->offset;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return last + 1;
}

bool kn__broadcast_shape(kn_ctx *ctx, const char *op, const kn_tensor *a, const kn_tensor *b,
                         int *ndim, int64_t *shape, int8_t *sym) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        int8_t sa = ia >= 0 ? a->sym[ia] : 0, sb = ib >= 0 ? b->sym[ib] : 0;
        if (da == db && sa == sb) { shape[i] = da; sym[i] = sa; }
        else if (da == 1 && !sa) { shape[i] = db; sym[i] = sb; }
        else if (db == 1 && !sb) { shape[i] = da; sym[i] = sa; }
        else {
            char s1[128], s2[128];
            kn__fail(ctx, KN_ERR_INVALID, "%s: shapes %s and %s cannot be broadcast together (dim %d: %lld vs %lld)",
                     op, kn__shape_str(a, s1, sizeof s1), kn__shape_str(b, s2, sizeof s2), i, (long long)da, (long long)db);
            return false;
        }
    }
    *ndim = n;
    return true;
}

/* Promotion: the wider float wins; float beats int; bool is the narrowest. */
kn_dtype kn__promote(kn_dtype a, kn_dtype b) {
    if (a == b) return a;
    static const int rank[KN_DTYPE_COUNT] = {
        [KN_BOOL] = 0, [KN_U8] = 1, [KN_I8] = 1, [KN_I32] = 2, [KN_I64] = 3,
        [KN_BF16] = 4, [KN_F16] = 4, [KN_F32] = 6, [KN_F64] = 7,
    };
    if ((a == KN_F16 && b == KN_BF16) || (a == KN_BF16 && b == KN_F16)) return KN_F32;
    if (a == KN_U8 && b == KN_I8) return KN_I32;
    if (a == KN_I8 && b == KN_U8) return KN_I32;
    return rank[a] >= rank[b] ? a : b;
}

int64_t kn_numel(const kn_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

bool kn_is_contiguous(const kn_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool kn_same_shape(const kn_tensor *a, const kn_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->sym[i] != b->sym[i]) return false;
    return true;
}

void kn_set_name(kn_tensor *t, const char *name) {
    if (t) snprintf(t->name, sizeof t->name, "%s", name ? name : "");
}
kn_status kn_set_constant(kn_tensor *t) {
    kn_tensor *own = t ? kn__storage_owner(t) : NULL;
    if (!own || !own->buf)
        return kn_set_error(KN_ERR_INVALID, "kn_set_constant: needs a materialised tensor (kn_from_ptr, kn_from_data, a "
                            "param or a realized one)");
    own->buf->constant = true;
    return KN_OK;
}
void kn_set_requires_grad(kn_tensor *t, bool on) {
    if (!t) return;
    if (on) t->flags |= KN_FLAG_REQUIRES_GRAD; else t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
}
bool kn_requires_grad(const kn_tensor *t) { return t && (t->flags & KN_FLAG_REQUIRES_GRAD); }
kn_tensor *kn_grad(const kn_tensor *t) { return t ? t->grad : NULL; }
void kn_zero_grad(kn_tensor *t) { if (t) t->grad = NULL; }
