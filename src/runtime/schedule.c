/* schedule.c: the order a plan runs its nodes in.
 *
 * Works on the graph's nodes (kn_tensor and its src[]) and fills the plan's
 * order: the dependency order of graph/graph.c's kn__toposort (a traversal
 * autograd and the DOT dump share, so it stays in graph/), then effects that
 * nobody reads (an optimizer update of a parameter) moved last, so that they
 * follow every read of what they write.
 */
#include "runtime/runtime.h"
#include <stdlib.h>

/* Moves effects nobody reads to the end of p->order; keeps the relative order
 * otherwise. Counts the kernels (p->nkern) on the way. */
static bool order_effects_last(kn_plan *p) {
    uint8_t *used = calloc((size_t)(p->n_ids ? p->n_ids : 1), 1);
    kn_tensor **o2 = malloc(sizeof *o2 * (size_t)(p->n ? p->n : 1));
    if (!used || !o2) { free(used); free(o2); return false; }
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < KN_MAX_SRC; k++) if (p->order[i]->src[k]) used[p->order[i]->src[k]->id] = 1;
    int m = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < p->n; i++) {
            kn_tensor *t = p->order[i];
            bool late = kn_op_get(t->op)->kind == KN_KIND_EFFECT && !used[t->id];
            if (late != (pass == 1)) continue;
            o2[m++] = t;
            if (kn__computes(t)) p->nkern++;
        }
    free(p->order); p->order = o2;
    free(used);
    return true;
}

bool kn__schedule(kn_plan *p, int nout, kn_tensor **outs, bool stop_at_realized) {
    kn_status st = kn__toposort(p->ctx, nout, outs, stop_at_realized, &p->order, &p->n);
    if (st != KN_OK) { p->ctx->status = st; return false; }   /* the message is set */
    p->n_ids = p->ctx->n_all;
    if (!order_effects_last(p)) { kn__plan_nomem(p->ctx, p, "the schedule"); return false; }
    return true;
}
