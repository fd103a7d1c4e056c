/* batch_impl.h: the batched engine's internals (include/kiln_batch.h is the
 * API). Internal header (src/).
 *
 * batch_blocks.c: the block manager. The pool has n_blocks blocks of bs
 * token rows (in every layer's K and V pool alike, so one block id names
 * the same rows everywhere). A block is
 *   free    on the free list;
 *   used    held by ref >= 1 live sequences (ref > 1 only for a full block
 *           shared through the prefix cache: never written again);
 *   cached  a full block in the prefix cache that no sequence holds (ref 0),
 *           evicted least recently used when the free list runs dry.
 * Prefix cache: a full block is registered under the hash of the whole
 * token prefix up to its end (chained: h_i = mix(h_{i-1}, tokens of block
 * i)). A hit is verified, not trusted: the block's own tokens must match and
 * its parent (the block holding the previous bs tokens) must be the block
 * the walk found one step earlier, with the same generation (a block that
 * was evicted and reused gets a new generation, so its old children no
 * longer chain to it). By induction the whole prefix matches token for token.
 *
 * batch.c: the API (sequences, kn_batch_step), batch_graph.c: the forward
 * plan (kn__model_forward with paged attention).
 */
#ifndef KN_BATCH_IMPL_H
#define KN_BATCH_IMPL_H
#include "kiln_batch.h"
#include "graph/graph.h"        /* defines: kn_tensor internals, kn_backend */
#include "llm/model_impl.h"

typedef struct {
    int ref;                 /* live sequences holding it */
    bool cached;             /* registered in the prefix cache (full, hash valid) */
    uint32_t gen;            /* bumped when a registration ends (eviction) */
    uint64_t hash;           /* prefix hash up to this block's end (cached only) */
    int parent;              /* block before it in its prefix, -1 for the first */
    uint32_t parent_gen;
    int next;                /* hash chain (cached) */
    uint64_t last_use;       /* LRU stamp */
} kn__blk;

typedef struct {
    bool open;
    int len;                 /* tokens held */
    int n_blocks, *blocks;   /* block table row [max_blocks] */
    uint64_t hash;           /* prefix hash of its full blocks */
    int chain;               /* the cached block standing for its last full block (-1: none
                                yet; -2: that block was evicted, register no more) */
    uint32_t chain_gen;      /* its generation then */
} kn__seq;

struct kn_batch {
    kn_model *m;
    kn_batch_opts o;
    int max_blocks;          /* per sequence: ceil(max_len / bs) */
    int max_len;             /* tokens one sequence may hold: the model's context length */
    /* blocks */
    int n_blocks;
    kn__blk *blk;
    int32_t *blk_tokens;     /* [n_blocks, bs]: the tokens each block holds (for the prefix cache) */
    int *free_list, n_free;
    int n_cached_idle;       /* cached with ref 0 */
    int *bucket;             /* hash table heads [n_bucket], -1 empty */
    int n_bucket;
    uint64_t clock;
    /* sequences */
    kn__seq *seq;
    /* graph (batch_graph.c) */
    int sym_T, sym_R;
    kn_tensor *x_in, *pos_in, *slot_in, *seq_in, *rows_in, *table_in, *logits;
    kn_tensor *ids_in;                 /* a device model with its token table there: [n_batch] ids, in x_in's place (NULL) */
    kn_tensor *top_ids, *top_vals;     /* device: [R, KN_MODEL_TOP_MAX] candidates of the logits rows (TOPK), else NULL */
    int32_t *top_scratch;              /* [n_vocab] ids for a host selection */
    float *top_rows;                   /* [n_seq_max, n_vocab] a device step's rows copied for host selection (no TOPK outputs) */
    kn_tensor **k_pool, **v_pool;
    void *pool_map;          /* host backends: the pools' lazy mapping */
    size_t pool_bytes;
    kn_plan *plan;
    /* host staging of the inputs */
    float *x; int32_t *ids, *pos, *slot, *rseq, *rows, *table;   /* x or ids: the one the graph reads */
    kn_batch_stats st;
};

/* batch_blocks.c */
kn_status kn__blocks_init(kn_batch *b);
void kn__blocks_free(kn_batch *b);
int kn__block_take(kn_batch *b);                     /* a free (or evicted) block with ref 1; -1 if none */
void kn__block_release(kn_batch *b, int id);         /* ref--; at 0: cached stays, else freed */
int kn__blocks_available(const kn_batch *b);         /* free + idle cached */
uint64_t kn__prefix_hash(uint64_t h, const int32_t *tokens, int n);
/* registers full block id (its tokens written to blk_tokens) under hash h
 * with parent block parent (-1: first); returns id, or the block already
 * cached for the same prefix (then id stays private: the caller chains the
 * next block to the one returned, so the cached chain stays reachable) */
int kn__block_register(kn_batch *b, int id, uint64_t h, int parent);
/* the cached block for prefix hash h whose tokens are tok[0..bs) and whose
 * parent is `parent` (checked with its generation); -1 if none */
int kn__block_lookup(kn_batch *b, uint64_t h, const int32_t *tok, int parent);

/* batch_graph.c */
kn_status kn__batch_build(kn_batch *b);
void kn__batch_graph_free(kn_batch *b);
#endif
