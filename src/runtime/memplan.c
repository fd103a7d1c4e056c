/* memplan.c: where a plan keeps each node's value.
 *
 * Works on the schedule (p->order) and fills p->off (arena offset by tensor
 * id), p->peak and p->naive, and the outputs' own buffers:
 * - outputs (or the storage they view) get persistent buffers, kept after a run;
 * - every other computed node gets a block in one arena, placed first-fit in
 *   schedule order and free again after the last node that reads it (directly
 *   or through a view);
 * - elementwise nodes take over the block of an input that dies at them
 *   (in place);
 * - views and leaves need no memory of their own;
 * - a node that keeps a by-product for its gradient (kn__aux_bytes) gets a
 *   second block of the arena with the same lifetime (p->off[n_ids + id]),
 *   or room after its elements in its persistent buffer. (Room after the
 *   elements in the arena block made the sdpa outputs' blocks misfit the
 *   holes of same-shaped tensors: first-fit then grew GPT-2's arena by
 *   150 MB and the fuser dropped 102 groups to stay under the unfused one.)
 * All of it happens once, when the plan is built; a run only adds offsets.
 */
#include "runtime/runtime.h"
#include <stdlib.h>

#define ALIGN 64
static size_t align_up(size_t x) { return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1); }
static size_t storage_bytes(const kn_tensor *t) {
    int64_t n = kn__storage_elems(t);
    const kn_dtype_info *d = kn_dtype_get(t->dtype);
    /* quantized tensors: whole blocks */
    if (d->is_quant) n = (n + d->block_size - 1) / d->block_size * d->block_size;
    size_t b = kn_dtype_nbytes(t->dtype, n);
    return b ? b : 1;
}

/* ---- a first-fit allocator over offsets ---- */
typedef struct { size_t off, size; } blk;
typedef struct { blk *free; int nfree, cap; size_t top; } offalloc;

static size_t oa_alloc(offalloc *a, size_t size) {
    int best = -1;
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best >= 0) {
        size_t off = a->free[best].off;
        a->free[best].off += size; a->free[best].size -= size;
        if (!a->free[best].size) a->free[best] = a->free[--a->nfree];
        return off;
    }
    /* grow; merge with a free block ending at top */
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].off + a->free[i].size == a->top) {
            size_t off = a->free[i].off;
            a->top = off + size;
            a->free[i] = a->free[--a->nfree];
            return off;
        }
    size_t off = a->top;
    a->top += size;
    return off;
}
/* false when the free list cannot grow (out of host memory); the list is then
 * unchanged, so the caller only has to release it. */
static bool oa_free(offalloc *a, size_t off, size_t size) {
    /* coalesce with neighbours */
    for (int i = 0; i < a->nfree; i++) {
        if (a->free[i].off + a->free[i].size == off) { off = a->free[i].off; size += a->free[i].size; a->free[i--] = a->free[--a->nfree]; continue; }
        if (off + size == a->free[i].off) { size += a->free[i].size; a->free[i--] = a->free[--a->nfree]; continue; }
    }
    if (a->nfree == a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        blk *grown = realloc(a->free, sizeof *a->free * (size_t)cap);
        if (!grown) return false;     /* a->free still valid: freed by the caller */
        a->free = grown; a->cap = cap;
    }
    a->free[a->nfree++] = (blk){off, size};
    return true;
}

static bool owns_storage(const kn_tensor *t) { return !(t->flags & KN_FLAG_VIEW) && t->view_src == NULL; }

/* Where node t's value is computed: its own place, or its group's (fusion). */
static int exec_at(const kn_plan *p, const kn_tensor *t, int i) {
    kn_fgroup *g = kn__pgroup(p, t);
    return g ? g->last : i;
}

/* Does t read source s from memory? Not when s lives in t's group's registers. */
static bool reads_memory(const kn_plan *p, const kn_tensor *t, const kn_tensor *s) {
    kn_fgroup *g = kn__pgroup(p, t);
    return !g || kn__pgroup(p, s) != g || kn__pstored(g, s);
}

static bool memplan(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool dry);

bool kn__memplan_peak(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool groups, size_t *peak) {
    kn_plan q = *p;            /* the same schedule, planned but not allocated */
    if (!groups) { q.gid = NULL; q.groups = NULL; q.ngroups = 0; }
    q.off = NULL; q.arena = NULL; q.peak = q.naive = 0;
    bool ok = memplan(&q, nout, outs, opts, true);
    *peak = q.peak;
    free(q.off);
    return ok;
}

bool kn__memplan(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts) { return memplan(p, nout, outs, opts, false); }

/* dry: compute offsets and the peak only (no buffers: outputs without one are
 * counted as persistent and skipped) */
static bool memplan(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool dry) {
    kn_ctx *ctx = p->ctx;
    size_t nid = (size_t)(p->n_ids ? p->n_ids : 1);
    p->off = malloc(sizeof *p->off * 2 * nid);       /* [nid] the node's block, [nid] its by-product's */
    int32_t *last = malloc(sizeof *last * nid);     /* by storage owner: where its last reader runs */
    int32_t *die_next = malloc(sizeof *die_next * nid);
    int32_t *die_head = malloc(sizeof *die_head * (size_t)(p->n + 1));
    uint8_t *persist = calloc(nid, 1);
    if (!p->off || !last || !persist || !die_next || !die_head) {
        free(last); free(persist); free(die_next); free(die_head);
        kn__plan_nomem(ctx, p, "the memory plan");
        return false;
    }
    for (int32_t i = 0; i < p->n_ids; i++) { p->off[i] = p->off[nid + (size_t)i] = -1; last[i] = -1; }
    /* outputs (or the storage they view) are persistent */
    for (int o = 0; o < nout; o++) persist[kn__storage_owner(outs[o])->id] = 1;
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        int at = exec_at(p, t, i);
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = kn__pread(p, t, k);   /* a node that runs a matmul with its epilogue: a, b, bias, res, pre */
            if (!s || !reads_memory(p, t, s)) continue;
            int32_t *l = &last[kn__storage_owner(s)->id];
            if (*l < at) *l = at;
        }
        if ((t->flags & KN_FLAG_VIEW) && last[kn__storage_owner(t)->id] < i) last[kn__storage_owner(t)->id] = i;
    }
    /* die_head[i]: the storage owners whose last reader runs at i */
    for (int i = 0; i <= p->n; i++) die_head[i] = -1;
    for (int32_t id = 0; id < p->n_ids; id++)
        if (last[id] >= 0 && last[id] < p->n) { die_next[id] = die_head[last[id]]; die_head[last[id]] = id; }
    offalloc oa = {0};
    bool reuse = !(opts && opts->no_reuse), inplace = reuse && !(opts && opts->no_inplace);
    bool ok = true;
    uint8_t *handed = calloc(nid, 1);               /* blocks taken over in place: not freed */
    kn_tensor **byid = malloc(sizeof *byid * nid);  /* the scheduled node of each id (arena blocks belong to them) */
    if (!handed || !byid) ok = false;
    for (int i = 0; i < p->n && ok; i++) byid[p->order[i]->id] = p->order[i];
    for (int i = 0; i < p->n && ok; i++) {
        kn_tensor *t = p->order[i];
        kn_fgroup *g = kn__pgroup(p, t);
        if (owns_storage(t) && !t->buf && !(g && !kn__pstored(g, t))) {
            size_t bytes = align_up(storage_bytes(t));
            if (persist[t->id]) {
                if (dry) goto frees;
                if (kn__aux_bytes(t)) bytes = align_up(kn__aux_offset(t) + kn__aux_bytes(t));   /* by-product after the elements */
                t->buf = kn_buffer_new(p->be, bytes);    /* sets the message on failure */
                if (!t->buf) { free(last); free(persist); free(die_next); free(die_head); free(handed); free(byid); free(oa.free); ctx->status = KN_ERR_NOMEM; return false; }
                goto frees;
            }
            p->naive += bytes;
            int64_t off = -1;
            /* in place: over an input that dies here (in a group: dies at the
             * group, read at the item index alone, not read again after t is
             * written: kn__fuse_inplace_ok) */
            /* never for a node that runs a matmul with its epilogue: the residual
             * must not be the destination (src/compile/epilogue.c) */
            if (inplace && kn_op_get(t->op)->inplace_ok && !kn__pepi(p, t)) {
                int at = exec_at(p, t, i);
                /* candidates: t's operands; in a group, any operand of the group */
                int nc = g ? g->k.nbuf : 2;
                for (int k = 0; k < nc && off < 0; k++) {
                    kn_tensor *s = g ? (g->k.buf[k].out ? NULL : g->bt[k]) : t->src[k] ? kn__psrc(p, t, k) : NULL;
                    if (s && owns_storage(s) && p->off[s->id] >= 0 && last[s->id] == at && !handed[s->id] &&
                        align_up(storage_bytes(s)) == bytes && kn_dtype_get(s->dtype)->type_size == kn_dtype_get(t->dtype)->type_size &&
                        kn_is_contiguous(s) && kn_is_contiguous(t) && kn_same_shape(s, t) &&
                        (!g || kn__fuse_inplace_ok(g, t, s, p->rep, p->n_ids))) {
                        off = p->off[s->id];
                        handed[s->id] = 1;
                    }
                }
            }
            if (off < 0) off = (int64_t)oa_alloc(&oa, bytes);
            p->off[t->id] = off;
            size_t ab = align_up(kn__aux_bytes(t));
            if (ab) { p->off[nid + (size_t)t->id] = (int64_t)oa_alloc(&oa, ab); p->naive += ab; }
            /* a node nobody reads (dead end) frees right away */
            if (reuse && last[t->id] < 0) {
                ok = oa_free(&oa, (size_t)off, bytes);
                if (ok && p->off[nid + (size_t)t->id] >= 0) ok = oa_free(&oa, (size_t)p->off[nid + (size_t)t->id], ab);
            }
        }
    frees:
        /* blocks whose last reader runs here */
        if (!reuse) continue;
        for (int32_t id = die_head[i]; id >= 0 && ok; id = die_next[id]) {
            int64_t aoff = p->off[nid + (size_t)id];     /* the by-product dies with its node, handed on or not */
            if (aoff >= 0 && !persist[id]) ok = oa_free(&oa, (size_t)aoff, align_up(kn__aux_bytes(byid[id])));
            if (!ok) break;
            if (p->off[id] < 0 || persist[id] || handed[id]) continue;
            ok = oa_free(&oa, (size_t)p->off[id], align_up(storage_bytes(byid[id])));
        }
    }
    free(oa.free);
    free(last); free(persist); free(die_next); free(die_head); free(handed); free(byid);
    if (!ok) { kn__plan_nomem(ctx, p, "the arena's free list"); return false; }
    p->peak = oa.top;
    if (p->peak && !dry) {
        p->arena = kn_buffer_new(p->be, p->peak);    /* sets the message on failure */
        if (!p->arena) { ctx->status = KN_ERR_NOMEM; return false; }
    }
    return true;
}
