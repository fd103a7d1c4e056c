/* batch_graph.c: the batched engine's forward plan. model.c's layers
 * (kn__model_forward) over T rows that belong to different sequences; only
 * the attention differs (kn__paged_attend below): each row's new K, V go
 * into its KV slot of the layer's pool with index_copy, then paged_attn
 * (graph/ops_paged.c) lets each row see its own sequence's blocks.
 *
 * Inputs (written by batch.c before each run; T and R are plan symbols):
 *   x [T, C] f32 embeddings, pos [T] positions, slot [T] pool rows,
 *   seq [T] block-table rows, rows [R] the rows whose logits are wanted,
 *   table [n_seq_max, max_blocks] the block tables.
 * Pools: per layer K and V [Hkv, n_blocks * bs, D] (f32, f16 with kv_f16),
 * on a host backend in one anonymous mapping, so an idle batch commits no
 * pool memory (pages appear as blocks are first written).
 */
#include "llm/batch_impl.h"
#include "core/env.h"          /* defines: kn_env_get (KN_LLM_TOP) */
#include <stdlib.h>
#include <string.h>

kn_tensor *kn__paged_attend(kn_model *m, int layer, kn_tensor *q, kn_tensor *k, kn_tensor *v, kn_tensor *pos, const kn__paged *pg) {
    kn_ctx *ctx = m->ctx;
    if (m->kv_f16) { k = kn_cast(ctx, k, KN_F16); v = kn_cast(ctx, v, KN_F16); }
    kn_tensor *kc = kn_index_copy(ctx, pg->k_pool[layer], 1, pg->slot, k);   /* [Hkv, P, D] */
    kn_tensor *vc = kn_index_copy(ctx, pg->v_pool[layer], 1, pg->slot, v);
    kn_tensor *qt = kn_permute(ctx, q, (int[]){1, 0, 2});                      /* [T, H, D] */
    return kn_paged_attn(ctx, qt, kc, vc, pg->block_table, pg->row_seq, pos, pg->block_size, kn__arch_window(m, layer),
                         m->cfg.attn_scale);
}

/* zeroed device memory (host pools come zeroed from the mapping) */
static kn_status zero_dev(kn_backend *be, kn_tensor *t) {
    size_t n = t->buf->size, chunk = n < (4u << 20) ? n : (4u << 20);
    void *z = calloc(1, chunk ? chunk : 1);
    if (!z) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_status st = KN_OK;
    for (size_t off = 0; off < n && !st; off += chunk) st = be->copy_in(be, (char *)t->buf->data + off, z, n - off < chunk ? n - off : chunk);
    free(z);
    return st;
}

kn_status kn__batch_build(kn_batch *b) {
    kn_model *m = b->m;
    kn_ctx *ctx = m->ctx;
    kn_backend *be = kn_ctx_backend(ctx);
    const kn_model_config *c = &m->cfg;
    int NB = b->o.n_batch, NS = b->o.n_seq_max, L = c->n_layers;
    int64_t C = c->dim, P = (int64_t)b->n_blocks * b->o.block_size;
    kn_dtype kv_dt = m->kv_f16 ? KN_F16 : KN_F32;
    int64_t pshape[3] = {c->n_kv_heads, P, c->head_dim};
    size_t one = kn_dtype_nbytes(kv_dt, pshape[0] * pshape[1] * pshape[2]);
    b->k_pool = calloc((size_t)L, sizeof *b->k_pool);
    b->v_pool = calloc((size_t)L, sizeof *b->v_pool);
    bool ids = m->embd_dev != NULL;          /* token rows gathered on the device (model.c to_device) */
    if (!ids) b->x = malloc(sizeof(float) * (size_t)NB * (size_t)C);
    b->pos = malloc(sizeof(int32_t) * (size_t)NB * (ids ? 4 : 3));   /* pos | slot | rseq [| ids] */
    b->rows = calloc((size_t)NS, sizeof(int32_t));
    b->table = calloc((size_t)NS * (size_t)b->max_blocks, sizeof(int32_t));
    if (!b->k_pool || !b->v_pool || !(ids || b->x) || !b->pos || !b->rows || !b->table) return kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory");
    b->slot = b->pos + NB; b->rseq = b->slot + NB;
    if (ids) b->ids = b->rseq + NB;
    memset(b->pos, 0, sizeof(int32_t) * (size_t)NB * 3);
    b->pool_bytes = one * 2 * (size_t)L;
    if (be->device == KN_DEVICE_HOST && !(b->pool_map = kn__lazy_alloc(b->pool_bytes)))
        return kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory for the KV pool (%d layers x 2 x %zu bytes: %d blocks of %d "
                            "tokens); use a smaller n_ctx", L, one, b->n_blocks, b->o.block_size);
    for (int l = 0; l < L; l++) {
        if (b->pool_map) {
            b->k_pool[l] = kn_from_ptr(ctx, kv_dt, 3, pshape, (char *)b->pool_map + one * (size_t)(2 * l));
            b->v_pool[l] = kn_from_ptr(ctx, kv_dt, 3, pshape, (char *)b->pool_map + one * (size_t)(2 * l + 1));
        } else {
            b->k_pool[l] = kn_empty(ctx, kv_dt, 3, pshape);
            b->v_pool[l] = kn_empty(ctx, kv_dt, 3, pshape);
        }
        if (!b->k_pool[l] || !b->v_pool[l]) {
            kn_status st = kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_NOMEM;
            return kn__model_err_prefix(st, "kn_batch_new: allocating the KV pool");
        }
        kn_status st;
        if (!b->pool_map && ((st = zero_dev(be, b->k_pool[l])) || (st = zero_dev(be, b->v_pool[l])))) return st;
    }
    b->sym_T = kn_sym_new(ctx, "batch_T", NB);
    b->sym_R = kn_sym_new(ctx, "batch_R", NS);
    if (!b->sym_T || !b->sym_R) return kn__model_err_prefix(kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_LIMIT, "kn_batch_new");
    if (ids) b->ids_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    else b->x_in = kn_input(ctx, KN_F32, 2, (int64_t[]){NB, C});
    b->pos_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    b->slot_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    b->seq_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    b->rows_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NS});
    b->table_in = kn_input(ctx, KN_I32, 2, (int64_t[]){NS, b->max_blocks});
    if (!(b->x_in || b->ids_in) || !b->pos_in || !b->slot_in || !b->seq_in || !b->rows_in || !b->table_in) return kn_ctx_status(ctx);
    kn_tensor *in[] = {b->pos_in, b->slot_in, b->seq_in, b->rows_in, b->table_in, b->ids_in};   /* every index valid from the start */
    for (size_t i = 0; i < sizeof in / sizeof in[0] && in[i]; i++) {
        kn_status st = be->device == KN_DEVICE_HOST ? (memset(in[i]->buf->data, 0, in[i]->buf->size), KN_OK) : zero_dev(be, in[i]);
        if (st) return st;
    }
    kn__paged pg = {b->k_pool, b->v_pool, kn_slice_sym(ctx, b->slot_in, 0, 0, b->sym_T), kn_slice_sym(ctx, b->seq_in, 0, 0, b->sym_T),
                    b->table_in, b->o.block_size};
    kn_status st = KN_OK;
    kn_tensor *x = ids ? kn__model_token_rows(m, kn_slice_sym(ctx, b->ids_in, 0, 0, b->sym_T)) : kn_slice_sym(ctx, b->x_in, 0, 0, b->sym_T);
    b->logits = kn__model_forward(m, x, kn_slice_sym(ctx, b->pos_in, 0, 0, b->sym_T),
                                  kn_slice_sym(ctx, b->rows_in, 0, 0, b->sym_R), &pg, &st);
    if (!b->logits) return st ? st : KN_ERR_STATE;
    kn_tensor *outs[3] = {b->logits};
    int nout = 1;
    if (be->device != KN_DEVICE_HOST && kn_env_get()->llm_top) {  /* the sampling candidates of every row, selected on the device */
        int64_t kt = m->cfg.n_vocab < KN_MODEL_TOP_MAX ? m->cfg.n_vocab : KN_MODEL_TOP_MAX;
        b->top_vals = kn_cast(ctx, kn_topk(ctx, b->logits, kt, true, &b->top_ids), KN_F32);
        if (!b->top_vals) return kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
        outs[nout++] = b->top_ids;
        outs[nout++] = b->top_vals;
    }
    b->plan = kn_plan_new(ctx, nout, outs, NULL);
    if (!b->plan) return kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
    return KN_OK;
}

void kn__batch_graph_free(kn_batch *b) {
    /* the graph's nodes and inputs stay in the model's context until the
     * model is freed (a context frees its tensors all at once); the plan's
     * buffers and the pools' mapping go now */
    kn_plan_free(b->plan);
    kn__lazy_free(b->pool_map, b->pool_bytes);
    free(b->k_pool); free(b->v_pool);
    free(b->x); free(b->pos); free(b->rows); free(b->table); free(b->top_scratch); free(b->top_rows);
}
