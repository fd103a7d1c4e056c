/* kiln_batch.h: many sequences through one model at once (continuous
 * batching, as `kiln serve` runs it). A batch owns a paged KV cache shared
 * by all its sequences (fixed-size blocks taken from one pool on demand and
 * given back when a sequence ends) and a forward plan that evaluates the
 * tokens of several sequences in one pass: one matmul over all rows, each
 * row attending to its own sequence's blocks. Prompt chunks (prefill) and
 * single sampled tokens (decode) of different sequences mix in one step.
 *
 *   kn_batch *b;
 *   kn_batch_opts o = kn_batch_defaults();
 *   o.n_seq_max = 8;
 *   if (kn_batch_new(model, &o, &b)) { puts(kn_last_error()); ... }
 *   int s = kn_batch_seq_new(b);                           // -1 when all slots are taken
 *   int have = kn_batch_seq_reuse_prefix(b, s, prompt, n); // tokens found in the prefix cache
 *   kn_batch_item it = {.seq = s, .tokens = prompt + have, .n = n - have, .logits = true};
 *   kn_batch_step(b, &it, 1, logits);                      // logits: [1, n_vocab]
 *   // then, each step: one item per running sequence with its sampled token
 *   kn_batch_seq_free(b, s);
 *
 * Not thread-safe: one thread (the server's engine thread) owns a batch.
 * The model must outlive it; the model's own kn_model_eval / kn_generate may
 * still be used between steps (they keep their own single-sequence cache).
 *
 * Memory: on a host backend the pool is reserved, not committed (an
 * anonymous mapping: pages appear as blocks are first written), and so are
 * the model's own single-sequence caches, so an idle batch costs little more
 * than the model (bench/bench_batch prints both). On a device backend the
 * pool is allocated whole.
 * The batch's graph lives in the model's context: kn_batch_free returns the
 * plan's buffers and a host pool at once, but the graph nodes (a few KB, the
 * step inputs, and a device pool) only with kn_model_free; each batch also
 * takes two of the model context's 16 plan symbols (the model uses 3), so
 * at most six batches can be made over one model.
 * Results: each sequence's logits equal kn_model_eval's on the same tokens up
 * to float rounding (other row blocking and an online softmax: ~1e-6
 * relative with f32 KV; with kv_f16 a K/V value computed under another
 * chunking may round to the neighbouring f16, ~1e-3).
 */
#ifndef KILN_BATCH_H
#define KILN_BATCH_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_llm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_batch kn_batch;

typedef struct kn_batch_opts {
    int n_seq_max;          /* sequences held at once (kiln serve --parallel); 0 = 4           */
    int n_ctx;              /* KV tokens in the shared pool, all sequences together
                               (kiln serve --ctx); 0 = the model's context length              */
    int block_size;         /* tokens per KV block; 0 = 16                                     */
    int n_batch;            /* most tokens one step evaluates; 0 = 512                         */
    bool prefix_cache;      /* keep the full blocks of ended sequences, keyed by their tokens,
                               for kn_batch_seq_reuse_prefix (evicted least recently used
                               when the pool runs short); default true                         */
} kn_batch_opts;
kn_batch_opts kn_batch_defaults(void);

/* Builds the batched plan over the model's weights (on the model's backend).
 * KN_ERR_NOMEM with the sizes when the pool does not fit. */
kn_status kn_batch_new(kn_model *m, const kn_batch_opts *o, kn_batch **out);
void kn_batch_free(kn_batch *b);                     /* NULL is a no-op */

/* A new, empty sequence: its id (0 .. n_seq_max-1), or -1 with kn_last_error
 * set when all slots are taken. */
int kn_batch_seq_new(kn_batch *b);
/* Ends a sequence: its blocks go back to the pool (full blocks to the prefix
 * cache when that is on). An id that is not open is ignored. */
void kn_batch_seq_free(kn_batch *b, int seq);
/* For a new (empty) sequence: attaches the cached blocks that hold the
 * longest prefix of tokens[0..n) in whole blocks, at most n - 1 tokens (so
 * at least one token is left to evaluate for logits). Returns how many
 * tokens the sequence now holds (0 when nothing matched or the cache is off;
 * a sequence that already holds tokens is left as it is and its length
 * returned; -1 with kn_last_error for an id that is not an open sequence).
 * A hit is verified token for token, not trusted to the hash. Blocks may be
 * shared by several live sequences: a shared block is full and never
 * written again (the sequence's next token goes into a block of its own). */
int kn_batch_seq_reuse_prefix(kn_batch *b, int seq, const int32_t *tokens, int n);
int kn_batch_seq_len(const kn_batch *b, int seq);    /* tokens the sequence holds; -1: not an open sequence */

/* Tokens of one sequence for a step, appended at its end. */
typedef struct kn_batch_item {
    int seq;
    const int32_t *tokens;
    int n;                   /* >= 1 */
    bool logits;             /* return the logits of this item's last token */
    bool top;                /* with logits: return instead its KN_MODEL_TOP_MAX best next tokens
                                (kn_batch_step_top; on a GPU selected there, as kn_model_eval_top) */
} kn_batch_item;

/* Evaluates all items in one forward. logits receives n_vocab floats per
 * item with .logits set, in item order. An item may appear at most once per
 * step. All-or-nothing: KN_ERR_LIMIT (nothing evaluated, nothing changed)
 * when the items hold more than n_batch tokens, a sequence would exceed the
 * model's context length, or the pool has too few free blocks (see
 * kn_batch_free_tokens: the scheduler ends or pauses a sequence and tries
 * again); KN_ERR_INVALID for an unknown sequence or a bad token id, a
 * sequence twice, an item without tokens, or logits NULL when an item
 * wants them (NULL is fine when none does). Full blocks a step completes
 * enter the prefix cache at once (a live sequence's prompt can be shared).
 * Another error (the plan failed to run) also leaves every sequence as it
 * was (the blocks the step took are given back). */
kn_status kn_batch_step(kn_batch *b, const kn_batch_item *items, int n_items, float *logits);
/* kn_batch_step where items may set .top: the r-th item that wants logits
 * (in item order) gets n_vocab floats at logits + r * n_vocab, or, with
 * .top, its KN_MODEL_TOP_MAX best ids and their logits at top_ids + r *
 * KN_MODEL_TOP_MAX and top_logits + r * KN_MODEL_TOP_MAX, best first, equal
 * logits lower id first (for kn_sampler_sample_top). logits may be NULL when
 * every such item sets .top; top_ids and top_logits when none does. */
kn_status kn_batch_step_top(kn_batch *b, const kn_batch_item *items, int n_items, float *logits, int32_t *top_ids,
                            float *top_logits);

/* How many more tokens the pool can take now (free blocks, plus cached ones
 * that could be evicted, times block_size; partly filled blocks not counted). */
int kn_batch_free_tokens(const kn_batch *b);

typedef struct kn_batch_stats {
    int n_seq;               /* sequences open                                  */
    int blocks_total, blocks_used, blocks_cached;  /* used: held by sequences;
                                cached: prefix-cache blocks no sequence holds */
    int block_size;
    size_t kv_bytes;         /* bytes of the whole pool                           */
    int64_t steps, tokens_evaluated, prefix_tokens_reused;
} kn_batch_stats;
void kn_batch_get_stats(const kn_batch *b, kn_batch_stats *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
