/* batch_blocks.c: the block manager of the batched engine: free list,
 * reference counts, and the prefix cache (hash table of full blocks keyed
 * by their whole token prefix, verified on lookup, LRU eviction).
 * batch_impl.h describes the states and the verification. */
#include "llm/batch_impl.h"
#include <stdlib.h>
#include <string.h>

static int bucket_of(const kn_batch *b, uint64_t h) { return (int)(h & (uint64_t)(b->n_bucket - 1)); }

kn_status kn__blocks_init(kn_batch *b) {
    int n = b->n_blocks, bs = b->o.block_size;
    if (n < 1 || n > (1 << 26)) return kn_set_error(KN_ERR_INVALID, "kn_batch_new: %d KV blocks is out of range", n);
    b->n_bucket = 1;
    while (b->n_bucket < 2 * n) b->n_bucket *= 2;
    b->blk = calloc((size_t)n, sizeof *b->blk);
    b->blk_tokens = malloc(sizeof(int32_t) * (size_t)n * (size_t)bs);
    b->free_list = malloc(sizeof(int) * (size_t)n);
    b->bucket = malloc(sizeof(int) * (size_t)b->n_bucket);
    if (!b->blk || !b->blk_tokens || !b->free_list || !b->bucket) return kn_set_error(KN_ERR_NOMEM, "kn_batch_new: out of memory");
    for (int i = 0; i < b->n_bucket; i++) b->bucket[i] = -1;
    for (int i = 0; i < n; i++) {
        b->blk[i].parent = b->blk[i].next = -1;
        b->free_list[i] = n - 1 - i;        /* low ids first */
    }
    b->n_free = n;
    return KN_OK;
}

void kn__blocks_free(kn_batch *b) {
    free(b->blk); free(b->blk_tokens); free(b->free_list); free(b->bucket);
}

int kn__blocks_available(const kn_batch *b) { return b->n_free + b->n_cached_idle; }

/* removes cached block id from the hash table; its generation moves on */
static void unregister(kn_batch *b, int id) {
    kn__blk *k = &b->blk[id];
    int *p = &b->bucket[bucket_of(b, k->hash)];
    while (*p != id) p = &b->blk[*p].next;
    *p = k->next;
    k->next = k->parent = -1;
    k->cached = false;
    k->gen++;
    if (k->ref == 0) b->n_cached_idle--;
}

int kn__block_take(kn_batch *b) {
    int id = -1;
    if (b->n_free) id = b->free_list[--b->n_free];
    else if (b->n_cached_idle) {        /* evict the least recently used idle cached block */
        uint64_t best = UINT64_MAX;
        for (int i = 0; i < b->n_blocks; i++)
            if (b->blk[i].cached && b->blk[i].ref == 0 && b->blk[i].last_use < best) { best = b->blk[i].last_use; id = i; }
        unregister(b, id);
    }
    if (id >= 0) b->blk[id].ref = 1;
    return id;
}

void kn__block_release(kn_batch *b, int id) {
    kn__blk *k = &b->blk[id];
    if (--k->ref > 0) return;
    if (k->cached) { b->n_cached_idle++; k->last_use = ++b->clock; }
    else b->free_list[b->n_free++] = id;
}

/* FNV-1a over the token bytes, chained from h, then a final mix (splitmix64) */
uint64_t kn__prefix_hash(uint64_t h, const int32_t *tokens, int n) {
    h ^= 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++) { h ^= (t >> (8 * k)) & 0xff; h *= 0x100000001b3ull; }
    }
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static bool parent_ok(const kn_batch *b, const kn__blk *k, int parent) {
    return k->parent == parent && (parent < 0 || b->blk[parent].gen == k->parent_gen);
}

int kn__block_lookup(kn_batch *b, uint64_t h, const int32_t *tok, int parent) {
    int bs = b->o.block_size;
    for (int id = b->bucket[bucket_of(b, h)]; id >= 0; id = b->blk[id].next) {
        const kn__blk *k = &b->blk[id];
        if (k->hash == h && parent_ok(b, k, parent) && !memcmp(b->blk_tokens + (size_t)id * bs, tok, sizeof(int32_t) * (size_t)bs))
            return id;
    }
    return -1;
}

int kn__block_register(kn_batch *b, int id, uint64_t h, int parent) {
    int bs = b->o.block_size;
    for (int o = b->bucket[bucket_of(b, h)]; o >= 0;) {
        kn__blk *k = &b->blk[o];
        int next = k->next;
        if (k->hash == h) {
            if (parent_ok(b, k, parent) && !memcmp(b->blk_tokens + (size_t)o * bs, b->blk_tokens + (size_t)id * bs, sizeof(int32_t) * (size_t)bs))
                return o;                /* the same prefix is cached already: id stays private */
            if (!parent_ok(b, k, parent) && k->parent >= 0 && b->blk[k->parent].gen != k->parent_gen && k->ref == 0) {
                unregister(b, o);        /* an orphan (its parent was evicted): unreachable, give it back */
                b->free_list[b->n_free++] = o;
            }
        }
        o = next;
    }
    kn__blk *k = &b->blk[id];
    k->cached = true;
    k->hash = h;
    k->parent = parent;
    k->parent_gen = parent >= 0 ? b->blk[parent].gen : 0;
    k->last_use = ++b->clock;
    int *head = &b->bucket[bucket_of(b, h)];
    k->next = *head;
    *head = id;
    if (k->ref == 0) b->n_cached_idle++;
    return id;
}
