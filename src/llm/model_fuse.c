/* model_fuse.c: on the host (the CPU backends), each layer's q, k, v
 * projections stacked into one matrix [QD + 2 KD, C] (their biases into one
 * vector) and gate | up into one [2F, C], as the device upload does
 * (model.c, to_device): one matmul instead of three and one instead of two.
 * For small models a decode step is dozens of tiny matmuls, each a thread
 * pool dispatch and, at two threads, a join; stories260K decodes 1.1-1.2x
 * faster with them stacked (docs/PERF.md).
 *
 * The stacked copies are owned by the model (kn__model_alloc) and marked
 * constant like every weight; the originals stay as they are (file pages
 * that are no longer read). Only where the copies total at most
 * FUSE_MAX_BYTES: for large models a matmul's work dwarfs its dispatch, and
 * the copy would be memory for nothing. KN_LLM_FUSE=0 keeps them apart.
 */
#include "llm/model_impl.h"     /* defines: struct kn_model, kn__layer_w */
#include "graph/graph.h"        /* defines: kn__storage_owner */
#include "core/env.h"
#include <string.h>

#define FUSE_MAX_BYTES ((size_t)1 << 30)

/* contiguous, materialised, same dtype and row length: rows can be copied as bytes */
static bool stackable(kn_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++) {
        kn_tensor *t = ts[i];
        if (!t || t->dtype != ts[0]->dtype || t->ndim != ts[0]->ndim || !kn__storage_owner(t)->buf) return false;
        if (t->ndim == 2 && (t->shape[1] != ts[0]->shape[1] || t->stride[1] != 1 || t->stride[0] != t->shape[1])) return false;
        if (t->ndim == 1 && t->stride[0] != 1) return false;
        if (t->ndim != 1 && t->ndim != 2) return false;
    }
    return true;
}
static size_t bytes_of(const kn_tensor *t) { return kn_dtype_nbytes(t->dtype, kn_numel(t)); }

/* ts[0..n) stacked by rows (vectors: concatenated) into model-owned memory */
static kn_tensor *stack(kn_model *m, kn_tensor *const *ts, int n, const char *name, kn_status *st) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes_of(ts[i]);
    char *p = kn__model_alloc(m, total);
    if (!p) { *st = KN_ERR_NOMEM; return NULL; }
    size_t at = 0;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const kn_tensor *own = kn__storage_owner(ts[i]);
        memcpy(p + at, (const char *)own->buf->data + kn_dtype_nbytes(ts[i]->dtype, ts[i]->offset), bytes_of(ts[i]));
        at += bytes_of(ts[i]);
        rows += ts[i]->ndim == 2 ? ts[i]->shape[0] : 0;
    }
    kn_tensor *t = ts[0]->ndim == 2 ? kn__model_wrap(m, ts[0]->dtype, rows, ts[0]->shape[1], p, name)
                                    : kn__model_wrap(m, ts[0]->dtype, 1, (int64_t)(total / kn_dtype_nbytes(ts[0]->dtype, 1)), p, name);
    if (!t) *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM;
    return t;
}

kn_status kn__model_fuse_host(kn_model *m) {
    if (kn_env_get()->llm_nofuse) return KN_OK;
    size_t total = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        kn__layer_w *L = &m->layers[l];
        kn_tensor *qkv[3] = {L->wq, L->wk, L->wv}, *gu[2] = {L->w1, L->w3};
        if (!L->wqkv && stackable(qkv, 3)) total += bytes_of(L->wq) + bytes_of(L->wk) + bytes_of(L->wv);
        if (!L->w13 && !L->b1 && stackable(gu, 2)) total += bytes_of(L->w1) + bytes_of(L->w3);
    }
    if (total > FUSE_MAX_BYTES) return KN_OK;
    kn_status st = KN_OK;
    for (int l = 0; l < m->cfg.n_layers && !st; l++) {
        kn__layer_w *L = &m->layers[l];
        kn_tensor *qkv[3] = {L->wq, L->wk, L->wv}, *b[3] = {L->bq, L->bk, L->bv}, *gu[2] = {L->w1, L->w3};
        bool no_b = !L->bq && !L->bk && !L->bv;
        if (!L->wqkv && stackable(qkv, 3) && (no_b || stackable(b, 3))) {
            kn_tensor *w = stack(m, qkv, 3, "attn_qkv", &st), *bb = no_b ? NULL : stack(m, b, 3, "attn_qkv.bias", &st);
            if (w && (no_b || bb)) {
                L->wqkv = w; L->bqkv = bb;
                L->wq = L->wk = L->wv = L->bq = L->bk = L->bv = NULL;
            }
        }
        if (!st && !L->w13 && !L->b1 && stackable(gu, 2)) {
            kn_tensor *w = stack(m, gu, 2, "ffn_gate_up", &st);
            if (w) { L->w13 = w; L->w1 = L->w3 = NULL; }
        }
    }
    return st ? kn__model_err_prefix(st, "stacking q|k|v and gate|up") : KN_OK;
}
