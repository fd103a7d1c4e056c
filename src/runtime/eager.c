/* eager.c: using a tensor's value now, outside a plan the caller built.
 *
 * Works on one tensor and its storage owner. kn_realize computes what the
 * tensor needs through a temporary plan (plan.c, stopping at values already
 * computed) run by exec.c, so eager code reaches the backend by the same
 * path as any plan; kn_tensor_read / kn_tensor_write / kn_item copy between
 * the storage and host memory (staged through a host copy for device
 * buffers); kn_tensor_print shows the first values.
 */
#include "runtime/runtime.h"
#include <stdlib.h>
#include <string.h>
#include <math.h>

kn_status kn_realize(kn_tensor *t) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_realize: NULL tensor (an earlier op failed: %s)", kn_last_error());
    if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_realize: tensor was freed (its context was reset or freed)");
    kn_tensor *own = kn__storage_owner(t);
    bool effect = kn_op_get(t->op)->kind == KN_KIND_EFFECT;
    /* nothing to compute: a leaf, a value already in its storage, an effect that ran */
    if (t->op == KN_OP_NONE || (!effect && t->buf && (own->op == KN_OP_NONE || own->buf)) ||
        (effect && (t->flags & KN__FLAG_COMPUTED))) {
        if (!t->buf && own->buf) { t->buf = own->buf; kn_buffer_retain(t->buf); }
        return KN_OK;
    }
    kn_plan *p = kn__plan_build(t->ctx, 1, &t, NULL, true);
    if (!p) return t->ctx->status ? t->ctx->status : KN_ERR_STATE;
    kn_status st = kn_plan_run(p);
    if (st == KN_OK)
        for (int i = 0; i < p->n; i++)
            if (kn_op_get(p->order[i]->op)->kind == KN_KIND_EFFECT) p->order[i]->flags |= KN__FLAG_COMPUTED;
    kn_plan_free(p);
    if (!t->buf && own->buf) { t->buf = own->buf; kn_buffer_retain(t->buf); }
    return st;
}

/* Strided element-by-element copy between a tensor's storage and host memory. */
static kn_status host_transfer(kn_tensor *t, void *host, kn_dtype as, bool to_host) {
    kn_tensor *own = kn__storage_owner(t);
    if (!own->buf) return kn_set_error(KN_ERR_STATE, "tensor has no storage");
    const kn_dtype_info *di = kn_dtype_get(t->dtype), *da = kn_dtype_get(as);
    if (!da) return kn_set_error(KN_ERR_INVALID, "unknown dtype %d", (int)as);
    int64_t n = kn_numel(t);
    char *base = own->buf->data;
    void *tmp = NULL;
    if (own->buf->be->device != KN_DEVICE_HOST) {       /* stage through host memory */
        tmp = malloc(own->buf->size ? own->buf->size : 1);
        if (!tmp) return kn_set_error(KN_ERR_NOMEM, "out of host memory staging %zu bytes", own->buf->size);
        own->buf->be->copy_out(own->buf->be, tmp, own->buf->data, own->buf->size);
        base = tmp;
    }
    if (di->is_quant || da->is_quant) {
        free(tmp);
        if (as == t->dtype && kn_is_contiguous(t) && to_host) {
            /* raw block copy */
            memcpy(host, base + kn_dtype_nbytes(t->dtype, t->offset), kn_dtype_nbytes(t->dtype, n));
            return KN_OK;
        }
        return kn_set_error(KN_ERR_UNSUPPORTED, "reading %s as %s: cast the tensor to a float type first", di->name, da->name);
    }
    if (as == t->dtype && kn_is_contiguous(t)) {
        char *p = base + (size_t)t->offset * di->type_size;
        if (to_host) memcpy(host, p, (size_t)n * di->type_size); else memcpy(p, host, (size_t)n * di->type_size);
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t lin = i, off = t->offset;
            for (int d = t->ndim - 1; d >= 0; d--) { off += (lin % t->shape[d]) * t->stride[d]; lin /= t->shape[d]; }
            if (to_host) kn_store(as, host, i, kn_load(t->dtype, base, off));
            else kn_store(t->dtype, base, off, kn_load(as, host, i));
        }
    }
    if (tmp) {
        if (!to_host) own->buf->be->copy_in(own->buf->be, own->buf->data, tmp, own->buf->size);
        free(tmp);
    }
    return KN_OK;
}

kn_status kn_tensor_read(kn_tensor *t, void *dst, kn_dtype as) {
    kn_status st = kn_realize(t);
    if (st) return st;
    return host_transfer(t, dst, as, true);
}

kn_status kn_tensor_write(kn_tensor *t, const void *src, kn_dtype as) {
    if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_tensor_write: tensor is NULL or freed");
    kn_tensor *own = kn__storage_owner(t);
    if (own->op != KN_OP_NONE || !own->buf)
        return kn_set_error(KN_ERR_INVALID, "kn_tensor_write: only inputs, parameters and data tensors (or views of them) can be written; this is a %s node", kn_op_name(own->op));
    if (own->buf->constant)
        return kn_set_error(KN_ERR_STATE, "kn_tensor_write: the tensor was marked constant (kn_set_constant); write a "
                            "copy of it (kn_from_data) instead");
    return host_transfer(t, (void *)src, as, false);
}

double kn_item(kn_tensor *t) {
    double v;
    if (!t || kn_numel(t) < 1) { kn_set_error(KN_ERR_INVALID, "kn_item: empty or NULL tensor"); return NAN; }
    if (kn_realize(t)) return NAN;
    kn_tensor *own = kn__storage_owner(t);
    if (own->buf->be->device != KN_DEVICE_HOST) {
        double *all = malloc(sizeof(double) * (size_t)kn_numel(t));
        if (!all || kn_tensor_read(t, all, KN_F64)) { free(all); return NAN; }
        v = all[0]; free(all); return v;
    }
    return kn_load(t->dtype, own->buf->data, t->offset);
}

void kn_tensor_print(kn_tensor *t, const char *label) {
    char s[160];
    if (!t) { fprintf(stderr, "%s: NULL (%s)\n", label ? label : "tensor", kn_last_error()); return; }
    int64_t n = kn_numel(t);
    fprintf(stderr, "%s: %s %s", label ? label : "tensor", kn_dtype_name(t->dtype), kn__shape_str(t, s, sizeof s));
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (v && !kn_dtype_get(t->dtype)->is_quant && kn_tensor_read(t, v, KN_F64) == KN_OK) {
        fprintf(stderr, " =");
        for (int64_t i = 0; i < n && i < 16; i++) fprintf(stderr, " %.6g", v[i]);
        if (n > 16) fprintf(stderr, " ...");
    }
    fprintf(stderr, "\n");
    free(v);
}
