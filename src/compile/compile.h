/* compile/compile.h: the compiler layer's internals (docs/ARCHITECTURE.md,
 * layer 5, between the graph and the runtime; docs/COMPILER.md). The runtime's
 * plan building calls it; nothing below the runtime includes it.
 *
 * First piece: graph rewrites (rewrite.c). They never change a user's
 * tensor: a plan keeps its own redirection table `rep` (by tensor id: the node
 * whose value stands in for this one, NULL for itself) and drops nodes from
 * its own schedule. See rewrite.c for the rules and what they must never do.
 */
#ifndef KN_COMPILE_H
#define KN_COMPILE_H
#include "graph/graph.h"

typedef enum {
    KN_RW_VIEW_IDENTITY,   /* a view whose layout equals its base's (reshape to the same shape, ...) */
    KN_RW_PERMUTE_INVERSE, /* permute(permute(x, p), p^-1) */
    KN_RW_VIEW_CHAIN,      /* a view read only by views: the last view already says where the data is */
    KN_RW_ARITH_IDENTITY,  /* x*1, 1*x, x/1, x+(-0.0), (-0.0)+x, x-(+0.0); integers: x+0, 0+x, x-0 */
    KN_RW_CAST_SAME,       /* cast to the dtype it already has */
    KN_RW_NEG_NEG,         /* neg(neg(x)), floats */
    KN_RW_CSE,             /* common subexpressions */
    KN_RW_DEAD,            /* nodes nothing live reads any more */
    KN_RW_NRULES
} kn_rw_rule;
const char *kn__rw_rule_name(kn_rw_rule r);

/* Rewrites a scheduled node list in place.
 *   order, *n  the schedule (dependency order, effects nobody reads last);
 *              on return the nodes removed are gone, the rest keep their order
 *   n_ids      ctx->n_all when the schedule was made (every node's id < n_ids)
 *   outs       the plan's outputs: never removed or redirected
 *   rep        n_ids entries, zeroed by the caller; on return rep[id] is the
 *              node read in place of node id (fully resolved), or NULL
 *   removed    KN_RW_NRULES counters (nodes removed by each rule), may be NULL
 * Returns false when out of host memory (nothing changed). */
bool kn__rewrite(kn_tensor **order, int *n, int32_t n_ids, int nout, kn_tensor **outs,
                 kn_tensor **rep, int *removed);

/* The source k of t as a plan with redirection table rep reads it. */
static inline kn_tensor *kn__rw_src(kn_tensor *const *rep, int32_t n_ids, const kn_tensor *t, int k) {
    kn_tensor *s = t->src[k];
    return (s && rep && s->id < n_ids && rep[s->id]) ? rep[s->id] : s;
}
#endif
