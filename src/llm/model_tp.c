/* model_tp.c: tensor parallelism (kn_model_opts.dist, kiln_dist.h), as
 * Megatron-LM splits a transformer: rank r of W keeps
 *   wq, wk, wv (and their biases): the rows of its H/W query heads and
 *     Hkv/W key/value heads, so attention runs on its heads alone
 *     (its KV caches hold only those heads);
 *   wo: the matching H*D/W columns, so x . wo^T is a partial sum;
 *   w1, w3: F/W rows (gate, up); w2: the matching F/W columns.
 *   the output head: ceil(V/W) vocabulary rows (the last rank's rows past
 *     V are zero), so each rank computes the logits of its rows.
 * The graph (model.c) all-reduces the two partial sums of each block (after
 * wo and after w2, before their biases), so every rank ends each block with
 * the whole residual stream: norms and embeddings stay whole on every rank.
 * It all-gathers the head's logits, so every rank has the same [R, V] logits
 * and the same sampler seed gives every rank the same tokens. (A Llama-3-8B
 * head is 1 GB in bf16 of the 15 GB a token reads: kept whole, two ranks
 * decoded only 1.23x one, docs/PERF.md "Several GPUs".)
 *
 * The split happens on the host, on the loaded file's tensors, before a
 * device upload: each kept slice becomes a new leaf over a copy of its bytes
 * (quantized rows are cut at block boundaries, so the column slices must be
 * a whole number of blocks). Mixtures of experts and GPT-2 (fused q|k|v of a
 * transposed Conv1D) are refused by name.
 */
#include "graph/graph.h"       /* defines: kn__storage_owner */
#include "core/core.h"        /* defines: struct kn_buffer */
#include "llm/model_impl.h"
#include "kiln_dist.h"
#include <string.h>

/* Byte address of element (row, col) of a 2-d (or 1-d) host leaf view with dense rows. */
static const char *at(const kn_tensor *t, int64_t row, int64_t col) {
    const kn_tensor *own = kn__storage_owner((kn_tensor *)t);
    int64_t rs = t->ndim == 2 ? t->stride[0] : 0;
    return (const char *)own->buf->data + kn_dtype_nbytes(t->dtype, t->offset + row * rs + col);
}

/* rows [r0, r0 + n) x columns [c0, c0 + nc) of t (1-d: elements [c0, c0 + nc)) as a
 * new leaf; rows past t's last are zero bytes (0 in every type: a block's scales too) */
static kn_tensor *cut(kn_model *m, kn_tensor *t, int64_t r0, int64_t n, int64_t c0, int64_t nc, kn_status *st) {
    if (*st || !t) return t;
    const kn_dtype_info *di = kn_dtype_get(t->dtype);
    int64_t cols = t->shape[t->ndim - 1];
    if ((t->ndim == 2 && t->stride[1] != 1) || (t->ndim == 1 && t->stride[0] != 1) || t->ndim > 2) {
        *st = kn_set_error(KN_ERR_UNSUPPORTED, "tensor parallel: '%s' is not stored as dense rows", t->name);
        return NULL;
    }
    if (c0 % di->block_size || nc % di->block_size || c0 + nc > cols) {
        *st = kn_set_error(KN_ERR_UNSUPPORTED, "tensor parallel: '%s' (%s, blocks of %lld) cannot be cut at column %lld; use "
                           "fewer ranks or a file with another type", t->name, di->name, (long long)di->block_size, (long long)c0);
        return NULL;
    }
    size_t row_bytes = kn_dtype_nbytes(t->dtype, nc);
    int64_t rows = t->ndim == 2 ? n : 1;
    char *p = kn__model_alloc(m, row_bytes * (size_t)rows + 1);
    if (!p) { *st = kn_set_error(KN_ERR_NOMEM, "tensor parallel: out of memory cutting '%s'", t->name); return NULL; }
    for (int64_t r = 0; r < rows; r++) {
        if (t->ndim == 2 && r0 + r >= t->shape[0]) memset(p + row_bytes * (size_t)r, 0, row_bytes);
        else memcpy(p + row_bytes * (size_t)r, at(t, t->ndim == 2 ? r0 + r : 0, c0), row_bytes);
    }
    int64_t shape[2] = {rows, nc};
    kn_tensor *y = t->ndim == 2 ? kn_from_ptr(m->ctx, t->dtype, 2, shape, p) : kn_from_ptr(m->ctx, t->dtype, 1, &shape[1], p);
    if (!y) { *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM; return NULL; }
    kn_set_name(y, t->name);
    return y;
}
static kn_tensor *rows_of(kn_model *m, kn_tensor *t, int64_t r0, int64_t n, kn_status *st) {
    if (!t) return NULL;
    if (t->ndim == 1) return cut(m, t, 0, 1, r0, n, st);                 /* a bias: its elements */
    return cut(m, t, r0, n, 0, t->shape[1], st);
}
static kn_tensor *cols_of(kn_model *m, kn_tensor *t, int64_t c0, int64_t n, kn_status *st) {
    return t ? cut(m, t, 0, t->shape[0], c0, n, st) : NULL;
}

kn_status kn__model_tp_split(kn_model *m, kn_dist *d) {
    int W = kn_dist_world(d), r = kn_dist_rank(d);
    if (W <= 1) return KN_OK;
    const kn_model_config *c = &m->cfg;
    static const char *const names[] = {"llama", "gpt2", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3",
                                        "mixtral", "qwen2moe", "qwen3moe", "olmoe"};
    const char *an = (unsigned)c->arch < sizeof names / sizeof names[0] ? names[c->arch] : "?";
    if (c->arch == KN_ARCH_GPT2 || c->n_expert > 0)
        return kn_set_error(KN_ERR_UNSUPPORTED, "tensor parallel: %s models are not supported yet (dense Llama, Mistral, "
                            "Qwen2/3, Gemma 2/3 and Phi-3 are); run it on one GPU", an);
    if (c->n_heads % W || c->n_kv_heads % W || c->ffn_dim % W)
        return kn_set_error(KN_ERR_UNSUPPORTED, "tensor parallel: %d ranks do not divide this model's %d query heads, %d "
                            "key/value heads and FFN width %d; use a rank count that divides all three",
                            W, c->n_heads, c->n_kv_heads, c->ffn_dim);
    /* every rank must build the same graph (NCCL does not check sizes: a
     * mismatch would hang or mix garbage), so compare what shapes it first */
    char what[320];
    snprintf(what, sizeof what, "%s dim %d layers %d heads %d/%d ffn %d vocab %d ctx %d batch %d weights %s kv_f16 %d", an,
             c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->n_vocab, m->n_ctx, m->n_batch,
             kn_dtype_name(c->weight_type), (int)m->kv_f16);
    kn_status st = kn_dist_check_same(d, "the model", what);
    if (st) return st;
    int64_t D = c->head_dim, Hl = c->n_heads / W, Hkvl = c->n_kv_heads / W, Fl = c->ffn_dim / W;
    for (int l = 0; l < c->n_layers && !st; l++) {
        kn__layer_w *L = &m->layers[l];
        if (!L->wq || !L->wk || !L->wv || !L->w1 || !L->w3 || !L->w2 || !L->wo)
            return kn_set_error(KN_ERR_UNSUPPORTED, "tensor parallel: layer %d of this %s model lacks separate q/k/v or "
                                "gate/up matrices", l, an);
        L->wq = rows_of(m, L->wq, r * Hl * D, Hl * D, &st);
        L->wk = rows_of(m, L->wk, r * Hkvl * D, Hkvl * D, &st);
        L->wv = rows_of(m, L->wv, r * Hkvl * D, Hkvl * D, &st);
        L->bq = rows_of(m, L->bq, r * Hl * D, Hl * D, &st);
        L->bk = rows_of(m, L->bk, r * Hkvl * D, Hkvl * D, &st);
        L->bv = rows_of(m, L->bv, r * Hkvl * D, Hkvl * D, &st);
        L->wo = cols_of(m, L->wo, r * Hl * D, Hl * D, &st);
        L->w1 = rows_of(m, L->w1, r * Fl, Fl, &st);
        L->w3 = rows_of(m, L->w3, r * Fl, Fl, &st);
        L->w2 = cols_of(m, L->w2, r * Fl, Fl, &st);
    }
    /* the head: a copy of this rank's rows even when tied (the embedding
     * stays whole: every rank looks up every token) */
    int64_t Vl = (c->n_vocab + W - 1) / W;
    m->wout = rows_of(m, m->wout, r * Vl, Vl, &st);
    if (st) return st;
    m->tp = d;
    m->tp_world = W;
    return KN_OK;
}
