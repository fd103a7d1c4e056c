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
    KN_RW_INT_ZERO,        /* integers and bool: x*0, 0*x, x-x read a zero fill (a made node) */
    KN_RW_IDEMPOTENT,      /* integers: max(x,x), min(x,x); comparison results: and(x,x), or(x,x) */
    KN_RW_CONST_FOLD,      /* an exact elementwise op of constants (fills and views of fills) is a made fill */
    KN_RW_SUM_EXPAND,      /* integers: sum over axes a view repeats (stride 0) is a made x*n */
    KN_RW_NRULES
} kn_rw_rule;
const char *kn__rw_rule_name(kn_rw_rule r);

/* Rewrites a scheduled node list.
 *   ctx        the graph's context: the rules that need a node no graph has
 *              (a zero fill, a folded constant, x*n) make it there with the
 *              graph layer's constructors. The user's graph only gains nodes
 *              nothing of it references (no existing node's sources, flags or
 *              values change; outputs are never replaced).
 *   *order, *n the schedule (dependency order, effects nobody reads last);
 *              on return the nodes removed are gone, the made nodes that are
 *              live are in, each right before the node it replaced, and the
 *              rest keep their order (*order may be reallocated)
 *   *n_ids     ctx->n_all when the schedule was made (every node's id < n_ids);
 *              on return ctx->n_all again (made nodes included)
 *   outs       the plan's outputs: never removed or redirected
 *   *rep       *n_ids entries, zeroed by the caller; on return (*n_ids
 *              entries, maybe reallocated) rep[id] is the node read in place
 *              of node id (fully resolved), or NULL
 *   removed    KN_RW_NRULES counters (nodes removed by each rule), may be NULL
 *   added      nodes the rules made (live or not), may be NULL; the plan
 *              shrinks by sum(removed) - added
 * Returns false when out of host memory (the plan is unusable: free it; *rep
 * and *order are still the caller's to free). */
bool kn__rewrite(kn_ctx *ctx, kn_tensor ***order, int *n, int32_t *n_ids, int nout, kn_tensor **outs,
                 kn_tensor ***rep, int *removed, int *added);

/* The source k of t as a plan with redirection table rep reads it. */
static inline kn_tensor *kn__rw_src(kn_tensor *const *rep, int32_t n_ids, const kn_tensor *t, int k) {
    kn_tensor *s = t->src[k];
    return (s && rep && s->id < n_ids && rep[s->id]) ? rep[s->id] : s;
}
#endif
