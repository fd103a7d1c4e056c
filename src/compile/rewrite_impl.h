/* compile/rewrite_impl.h: what rewrite.c (the engine and the redirecting
 * rules) and rewrite_fold.c (the rules that make new nodes) share. Internal
 * to src/compile/; docs/COMPILER.md "Graph rewrites" describes the rules. */
#ifndef KN_REWRITE_IMPL_H
#define KN_REWRITE_IMPL_H
#include "compile/compile.h"

enum { F_OUT = 1, F_WRITTEN = 2, F_ALIASED = 4, F_LIVE = 8, F_DROP = 16 };

/* The state of one kn__rewrite call. rep and fl are by tensor id and cover
 * ids [0, n_ids); a rule that makes a node (rewrite_fold.c) grows both to
 * ctx->n_all. Made nodes are not in the schedule while the passes run: each
 * remembers the schedule position it must come right before (at), and
 * kn__rewrite inserts them there once the passes are done. */
typedef struct {
    kn_ctx *ctx;
    kn_tensor ***rep;       /* the caller's table (reallocated when it grows) */
    int32_t n_ids;
    uint8_t *fl;            /* F_* by id */
    kn_tensor **made;       /* nodes made by rules, in the order made */
    int *made_at;           /* schedule position each goes before */
    int nmade, capmade;
} rw;

static inline kn_tensor *kn__rw_R(const rw *w, kn_tensor *t) {
    while (t && t->id < w->n_ids && (*w->rep)[t->id]) t = (*w->rep)[t->id];
    return t;
}
static inline kn_tensor *kn__rw_srcof(const rw *w, const kn_tensor *t, int k) { return kn__rw_R(w, t->src[k]); }
static inline kn_op_kind kn__rw_kind(const kn_tensor *t) { return kn_op_get(t->op)->kind; }
/* an effect of the plan writes t's storage */
static inline bool kn__rw_written(const rw *w, kn_tensor *t) {
    kn_tensor *o = kn__storage_owner(t);
    return o->id < w->n_ids && (w->fl[o->id] & F_WRITTEN) != 0;
}
static inline bool kn__rw_same_shape(const kn_tensor *a, const kn_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->sym[i] != b->sym[i]) return false;
    return true;
}
/* May readers of t be sent elsewhere and t dropped? */
bool kn__rw_removable(const rw *w, const kn_tensor *t);
/* x may stand in for t (same dtype, shape, strides; not an effect; storage not written) */
bool kn__rw_can_replace(const rw *w, const kn_tensor *t, kn_tensor *x);

/* rewrite_fold.c: the rules that may make a node. Each returns the node
 * readers of t (at schedule position pos) take instead, and its rule; NULL
 * when none fires. *oom is set when a node could not be made (out of host
 * memory): the caller gives up. */
kn_tensor *kn__rw_fold(rw *w, kn_tensor *t, int pos, kn_rw_rule *rule, bool *oom);
#endif
