/* batch.c: the batched engine's API (include/kiln_batch.h): sequences,
 * the prefix reuse, and kn_batch_step, which validates a whole step before
 * it changes anything (all-or-nothing), takes the blocks the step needs,
 * writes the plan's inputs, runs it and registers the blocks it filled in
 * the prefix cache. batch_blocks.c keeps the blocks, batch_graph.c the plan.
 *
 * A step's rows, in item order: item i's tokens at positions len_i ..
 * len_i + n_i - 1 of sequence seq_i, each row's K/V slot the pool row
 * table[seq][p / bs] * bs + p % bs.
 */
#include "llm/batch_impl.h"
#include <stdlib.h>
#include <string.h>

kn_batch_opts kn_batch_defaults(void) {
    return (kn_batch_opts){.n_seq_max = 4, .n_ctx = 0, .block_size = 16, .n_batch = 512, .prefix_cache = true};
}

kn_status kn_batch_new(kn_model *m, const kn_batch_opts *opts, kn_batch **out) {
    *out = NULL;
    if (!m) return kn_set_error(KN_ERR_INVALID, "kn_batch_new: no model");
    if (m->tp_world > 1)
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_batch_new: a tensor-parallel model (kn_model_opts.dist) cannot serve "
                            "batches yet; load it without the communicator");
    kn_batch_opts o = opts ? *opts : kn_batch_defaults();
    if (o.n_seq_max == 0) o.n_seq_max = 4;
    if (o.n_ctx == 0) o.n_ctx = kn_model_n_ctx(m);
    if (o.block_size == 0) o.block_size = 16;
    if (o.n_batch == 0) o.n_batch = 512;
    if (o.n_seq_max < 1 || o.n_seq_max > 4096 || o.n_ctx < 1 || o.block_size < 1 || o.block_size > 4096 || o.n_batch < 1 ||
        o.n_batch > (1 << 20))
        return kn_set_error(KN_ERR_INVALID, "kn_batch_new: n_seq_max %d (1..4096), n_ctx %d (>= 1), block_size %d (1..4096) "
                            "and n_batch %d (1..1048576) out of range (0 picks the default)", o.n_seq_max, o.n_ctx,
                            o.block_size, o.n_batch);
    if (kn_model_get_config(m)->attn_softcap != 0)   /* paged_attn has a window, not a cap (Gemma 2) */
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_batch_new: %s soft-caps its attention scores, which batched "
                            "decoding does not do yet; use kn_generate (one sequence) for this model",
                            kn_model_get_config(m)->name[0] ? kn_model_get_config(m)->name : "this model");
    kn_batch *b = calloc(1, sizeof *b);
    if (!b) return kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory");
    b->m = m;
    b->o = o;
    b->max_len = kn_model_n_ctx(m);
    b->max_blocks = (b->max_len + o.block_size - 1) / o.block_size;
    b->n_blocks = (o.n_ctx + o.block_size - 1) / o.block_size;
    b->seq = calloc((size_t)o.n_seq_max, sizeof *b->seq);
    kn_status st = b->seq ? KN_OK : kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory");
    for (int s = 0; s < o.n_seq_max && !st; s++)
        if (!(b->seq[s].blocks = malloc(sizeof(int) * (size_t)b->max_blocks))) st = kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory");
    if (!st) st = kn__blocks_init(b);
    if (!st) st = kn__batch_build(b);
    if (st) { kn_batch_free(b); return st; }
    b->st.blocks_total = b->n_blocks;
    b->st.block_size = o.block_size;
    b->st.kv_bytes = b->pool_bytes;
    *out = b;
    return KN_OK;
}

void kn_batch_free(kn_batch *b) {
    if (!b) return;
    kn__batch_graph_free(b);
    kn__blocks_free(b);
    for (int s = 0; b->seq && s < b->o.n_seq_max; s++) free(b->seq[s].blocks);
    free(b->seq);
    free(b);
}

static bool seq_ok(const kn_batch *b, int s) { return s >= 0 && s < b->o.n_seq_max && b->seq[s].open; }

int kn_batch_seq_new(kn_batch *b) {
    for (int s = 0; s < b->o.n_seq_max; s++)
        if (!b->seq[s].open) {
            b->seq[s] = (kn__seq){.open = true, .blocks = b->seq[s].blocks, .chain = -1};
            b->st.n_seq++;
            return s;
        }
    kn_set_error(KN_ERR_LIMIT, "kn_batch_seq_new: all %d sequence slots are taken; end one with kn_batch_seq_free", b->o.n_seq_max);
    return -1;
}

/* gives the sequence's blocks back, last first, so that its first blocks
 * (the most shareable prefix) are the most recently used in the cache */
static void drop_blocks(kn_batch *b, kn__seq *q, int keep) {
    while (q->n_blocks > keep) kn__block_release(b, q->blocks[--q->n_blocks]);
}

void kn_batch_seq_free(kn_batch *b, int seq) {
    if (!b || !seq_ok(b, seq)) return;
    kn__seq *q = &b->seq[seq];
    drop_blocks(b, q, 0);
    q->open = false;
    q->len = 0;
    b->st.n_seq--;
}

int kn_batch_seq_len(const kn_batch *b, int seq) { return b && seq_ok(b, seq) ? b->seq[seq].len : -1; }

int kn_batch_seq_reuse_prefix(kn_batch *b, int seq, const int32_t *tokens, int n) {
    if (!b || !seq_ok(b, seq)) {
        kn_set_error(KN_ERR_INVALID, "kn_batch_seq_reuse_prefix: %d is not an open sequence", seq);
        return -1;
    }
    kn__seq *q = &b->seq[seq];
    int bs = b->o.block_size;
    if (q->len > 0 || !b->o.prefix_cache || !tokens || n <= 1) return q->len;
    int parent = -1;
    uint64_t h = 0;
    for (int i = 0; (i + 1) * bs <= n - 1 && i < b->max_blocks; i++) {
        uint64_t hi = kn__prefix_hash(h, tokens + (size_t)i * bs, bs);
        int id = kn__block_lookup(b, hi, tokens + (size_t)i * bs, parent);
        if (id < 0) break;
        kn__blk *k = &b->blk[id];
        if (k->ref++ == 0) b->n_cached_idle--;
        k->last_use = ++b->clock;
        q->blocks[q->n_blocks++] = id;
        q->len += bs;
        h = hi;
        parent = id;
    }
    q->hash = h;
    q->chain = parent;
    q->chain_gen = parent >= 0 ? b->blk[parent].gen : 0;
    b->st.prefix_tokens_reused += q->len;
    return q->len;
}

int kn_batch_free_tokens(const kn_batch *b) { return kn__blocks_available(b) * b->o.block_size; }

void kn_batch_get_stats(const kn_batch *b, kn_batch_stats *out) {
    *out = b->st;
    int used = 0, cached = 0;
    for (int i = 0; i < b->n_blocks; i++) {
        if (b->blk[i].ref > 0) used++;
        else if (b->blk[i].cached) cached++;
    }
    out->blocks_used = used;
    out->blocks_cached = cached;
}

/* ---- the step ------------------------------------------------------------ */
static kn_status check_step(kn_batch *b, const kn_batch_item *items, int n_items, const float *logits, const int32_t *top_ids,
                            const float *top_vals) {
    int bs = b->o.block_size, V = b->m->cfg.n_vocab;
    if (n_items < 1 || !items) return kn_set_error(KN_ERR_INVALID, "kn_batch_step: no items");
    int64_t total = 0, need = 0;
    for (int i = 0; i < n_items; i++) {
        const kn_batch_item *it = &items[i];
        if (!seq_ok(b, it->seq)) return kn_set_error(KN_ERR_INVALID, "kn_batch_step: item %d: %d is not an open sequence", i, it->seq);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq)
                return kn_set_error(KN_ERR_INVALID, "kn_batch_step: sequence %d appears in items %d and %d; put its tokens in one item", it->seq, j, i);
        if (it->n < 1 || !it->tokens) return kn_set_error(KN_ERR_INVALID, "kn_batch_step: item %d (sequence %d) has no tokens", i, it->seq);
        if (it->logits && !it->top && !logits) return kn_set_error(KN_ERR_INVALID, "kn_batch_step: item %d wants logits but the logits pointer is NULL", i);
        if (it->logits && it->top && (!top_ids || !top_vals))
            return kn_set_error(KN_ERR_INVALID, "kn_batch_step: item %d wants candidates (.top) but no arrays for them were given "
                                "(kn_batch_step_top takes them)", i);
        for (int t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= V)
                return kn_set_error(KN_ERR_INVALID, "kn_batch_step: item %d (sequence %d): token id %d is outside the vocabulary [0, %d)",
                                    i, it->seq, it->tokens[t], V);
        const kn__seq *q = &b->seq[it->seq];
        if ((int64_t)q->len + it->n > b->max_len)
            return kn_set_error(KN_ERR_LIMIT, "kn_batch_step: sequence %d would hold %lld tokens, more than the context length %d",
                                it->seq, (long long)q->len + it->n, b->max_len);
        total += it->n;
        need += ((int64_t)q->len + it->n + bs - 1) / bs - q->n_blocks;
    }
    if (total > b->o.n_batch)
        return kn_set_error(KN_ERR_LIMIT, "kn_batch_step: %lld tokens in one step, more than n_batch = %d; split the prompt into chunks",
                            (long long)total, b->o.n_batch);
    if (need > kn__blocks_available(b))
        return kn_set_error(KN_ERR_LIMIT, "kn_batch_step: the step needs %lld more KV blocks of %d tokens, the pool has %d free; "
                            "end or pause a sequence and try again", (long long)need, bs, kn__blocks_available(b));
    return KN_OK;
}

/* writes the staged inputs into the plan's input tensors */
static kn_status upload(kn_batch *b, int T, int R) {
    kn_backend *be = kn_ctx_backend(b->m->ctx);
    size_t C = (size_t)b->m->cfg.dim, tb = sizeof(int32_t) * (size_t)b->o.n_seq_max * (size_t)b->max_blocks;
    struct { kn_tensor *t; const void *src; size_t n; } w[] = {
        {b->ids_in ? b->ids_in : b->x_in, b->ids_in ? (const void *)b->ids : b->x, b->ids_in ? sizeof(int32_t) * (size_t)T : sizeof(float) * (size_t)T * C},
        {b->pos_in, b->pos, sizeof(int32_t) * (size_t)T},
        {b->slot_in, b->slot, sizeof(int32_t) * (size_t)T}, {b->seq_in, b->rseq, sizeof(int32_t) * (size_t)T},
        {b->rows_in, b->rows, sizeof(int32_t) * (size_t)R}, {b->table_in, b->table, tb}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        kn_status st = be->device == KN_DEVICE_HOST ? (memcpy(w[i].t->buf->data, w[i].src, w[i].n), KN_OK)
                                                    : be->copy_in(be, w[i].t->buf->data, w[i].src, w[i].n);
        if (st) return st;
    }
    return KN_OK;
}

/* the blocks item it filled (positions len0 .. len0 + n - 1 now written) go
 * into the prefix cache, chained on the sequence's prefix hash */
static void register_full(kn_batch *b, kn__seq *q, int len0, const kn_batch_item *it) {
    int bs = b->o.block_size;
    for (int blk = len0 / bs; (blk + 1) * bs <= q->len; blk++) {
        int id = q->blocks[blk];
        int32_t *tok = b->blk_tokens + (size_t)id * bs;
        /* the block's tokens: from this item, and (first block) from earlier steps, already in tok */
        for (int p = blk * bs; p < (blk + 1) * bs; p++)
            if (p >= len0) tok[p - blk * bs] = it->tokens[p - len0];
        q->hash = kn__prefix_hash(q->hash, tok, bs);
        /* the parent may be a cached twin this sequence does not hold: if it
         * was evicted since (maybe reused for other tokens), chaining to it
         * would be wrong, so this sequence registers no more blocks */
        if (q->chain >= 0 && (!b->blk[q->chain].cached || b->blk[q->chain].gen != q->chain_gen)) q->chain = -2;
        if (b->o.prefix_cache && q->chain != -2) {
            q->chain = kn__block_register(b, id, q->hash, q->chain);
            q->chain_gen = b->blk[q->chain].gen;
        }
    }
    /* a partly filled last block keeps its tokens so far for later */
    int last = q->len / bs;
    if (q->len % bs && last >= len0 / bs) {
        int32_t *tok = b->blk_tokens + (size_t)q->blocks[last] * bs;
        for (int p = last * bs > len0 ? last * bs : len0; p < q->len; p++) tok[p - last * bs] = it->tokens[p - len0];
    }
}

/* The logits rows of a step to the caller: whole rows, or an item's
 * candidates (copied from the device's TOPK, or selected on the host). */
static kn_status give_rows(kn_batch *b, const kn_batch_item *items, int n_items, int R, float *logits, int32_t *top_ids,
                           float *top_vals) {
    kn_backend *be = kn_ctx_backend(b->m->ctx);
    int V = b->m->cfg.n_vocab, K = V < KN_MODEL_TOP_MAX ? V : KN_MODEL_TOP_MAX;
    const float *lg = b->logits->buf->data;
    size_t nb = sizeof(float) * (size_t)R * (size_t)V;
    bool any_top = false;
    for (int i = 0; i < n_items; i++) any_top = any_top || (items[i].logits && items[i].top);
    if (!any_top) {
        if (be->device == KN_DEVICE_HOST) { memcpy(logits, lg, nb); return KN_OK; }
        return be->copy_out(be, logits, lg, nb);
    }
    /* rows the host can read: the plan's own on a host backend; on a device
     * without TOPK outputs (KN_LLM_TOP unset) all rows come back at once */
    const float *rows = be->device == KN_DEVICE_HOST ? lg : NULL;
    if (!rows && !b->top_ids) {
        if (!b->top_rows && !(b->top_rows = malloc(sizeof(float) * (size_t)b->o.n_seq_max * (size_t)V)))
            return kn_set_error(KN_ERR_NOMEM, "out of memory");
        kn_status st = be->copy_out(be, b->top_rows, lg, nb);
        if (st) return st;
        rows = b->top_rows;
    }
    if (rows && !b->top_scratch && !(b->top_scratch = malloc(sizeof(int32_t) * (size_t)V)))
        return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_status st = KN_OK;
    for (int i = 0, r = 0; i < n_items && !st; i++) {
        if (!items[i].logits) continue;
        size_t ro = (size_t)r * (size_t)V, to = (size_t)r * KN_MODEL_TOP_MAX;
        if (!items[i].top) {
            if (rows) memcpy(logits + ro, rows + ro, sizeof(float) * (size_t)V);
            else st = be->copy_out(be, logits + ro, lg + ro, sizeof(float) * (size_t)V);
        } else if (rows) {
            kn__top_select(rows + ro, V, K, b->top_scratch, top_ids + to, top_vals + to);
        } else {
            st = be->copy_out(be, top_ids + to, (const int32_t *)b->top_ids->buf->data + (size_t)r * K, sizeof(int32_t) * (size_t)K);
            if (!st) st = be->copy_out(be, top_vals + to, (const float *)b->top_vals->buf->data + (size_t)r * K, sizeof(float) * (size_t)K);
        }
        r++;
    }
    return st;
}

kn_status kn_batch_step(kn_batch *b, const kn_batch_item *items, int n_items, float *logits) {
    return kn_batch_step_top(b, items, n_items, logits, NULL, NULL);
}

kn_status kn_batch_step_top(kn_batch *b, const kn_batch_item *items, int n_items, float *logits, int32_t *top_ids, float *top_vals) {
    if (!b) return kn_set_error(KN_ERR_INVALID, "kn_batch_step: no batch");
    kn_status st = check_step(b, items, n_items, logits, top_ids, top_vals);
    if (st) return st;
    kn_model *m = b->m;
    int bs = b->o.block_size, C = m->cfg.dim, MB = b->max_blocks;
    int T = 0, R = 0;
    for (int i = 0; i < n_items; i++) {
        const kn_batch_item *it = &items[i];
        kn__seq *q = &b->seq[it->seq];
        int want = (q->len + it->n + bs - 1) / bs;
        while (q->n_blocks < want) q->blocks[q->n_blocks++] = kn__block_take(b);   /* checked: cannot fail */
        for (int k = 0; k < q->n_blocks; k++) b->table[(size_t)it->seq * MB + k] = q->blocks[k];
        if (b->ids_in) memcpy(b->ids + T, it->tokens, sizeof(int32_t) * (size_t)it->n);   /* ids checked by check_step */
        else if ((st = kn__model_embed(m, it->tokens, it->n, b->x + (size_t)T * C))) break;
        for (int t = 0; t < it->n; t++) {
            int p = q->len + t;
            b->pos[T + t] = p;
            b->slot[T + t] = q->blocks[p / bs] * bs + p % bs;
            b->rseq[T + t] = it->seq;
        }
        T += it->n;
        if (it->logits) b->rows[R++] = T - 1;
    }
    int Rrun = R ? R : 1;
    if (!R) b->rows[0] = 0;
    if (!st && !(st = kn_sym_set(m->ctx, b->sym_T, T)) && !(st = kn_sym_set(m->ctx, b->sym_R, Rrun)) && !(st = upload(b, T, Rrun)))
        st = kn_plan_run(b->plan);
    if (!st && R) st = give_rows(b, items, n_items, R, logits, top_ids, top_vals);
    if (st) {                            /* evaluation failed: give back the blocks this step took */
        for (int i = 0; i < n_items; i++) {
            kn__seq *q = &b->seq[items[i].seq];
            drop_blocks(b, q, (q->len + bs - 1) / bs);     /* a sequence holds ceil(len / bs) blocks between steps */
        }
        return st;
    }
    for (int i = 0; i < n_items; i++) {
        kn__seq *q = &b->seq[items[i].seq];
        int len0 = q->len;
        q->len += items[i].n;
        register_full(b, q, len0, &items[i]);
    }
    b->st.steps++;
    b->st.tokens_evaluated += T;
    return KN_OK;
}
