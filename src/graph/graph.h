/* graph/graph.h: the graph layer's internals (docs/ARCHITECTURE.md, layer 3):
 * the op table, node construction and the graph order. Backends, the
 * runtime and everything above may include it; core never does. */
#ifndef KN_GRAPH_H
#define KN_GRAPH_H
#include "core/core.h"

/* ---- op table (src/graph/optable.c, made from include/kiln_ops.def) -------- */
typedef enum {
    KN_KIND_LEAF, KN_KIND_CREATE, KN_KIND_VIEW, KN_KIND_COPY, KN_KIND_UNARY,
    KN_KIND_BINARY, KN_KIND_REDUCE, KN_KIND_SCAN, KN_KIND_MATMUL, KN_KIND_NN,
    KN_KIND_EFFECT
} kn_op_kind;
/* output dtype of an elementwise op */
typedef enum {
    KN_OUT_SAME,     /* the input's dtype (binary: both operands' promoted dtype) */
    KN_OUT_FLOAT,    /* as SAME, except that integers give f32 (exp(int), true division) */
    KN_OUT_BOOL
} kn_op_out;
/* where an op's gradient rule comes from (src/autograd/rules*.c) */
typedef enum {
    KN_GRAD_NA,      /* not an elementwise op: rules by op in rules*.c */
    KN_GRAD_EXPR,    /* E: built from the table's gradient expressions */
    KN_GRAD_HAND,    /* H: hand-written in rules.c */
    KN_GRAD_ZERO,    /* Z: no gradient flows (comparisons) */
    KN_GRAD_NONE     /* N: not differentiable */
} kn_op_grad;
typedef struct kn_op_info {
    const char *name;
    kn_op_kind kind;
    bool inplace_ok;      /* output may reuse src[0]'s memory when it dies here */
    int8_t arity;         /* tensor sources (src[] slots); -1: variable */
    kn_op_out out;        /* elementwise ops: output dtype */
    kn_op_grad grad_rule; /* elementwise ops: kind of gradient rule */
    const char *expr;     /* elementwise ops: forward scalar expression over x (a, b), p0, p1; NULL for others */
    const char *grad[2];  /* elementwise ops: gradient expression per operand over x (a, b), y, g, p0, p1;
                           * "" where none (Z, N); NULL for others */
} kn_op_info;
const kn_op_info *kn_op_get(kn_op op);

/* ---- node construction (src/graph/node.c) -------------------------------- */
/* Format "[2,3,4]" (with sym dims as "s1<=512") into buf. */
const char *kn__shape_str(const kn_tensor *t, char *buf, size_t n);
bool kn__alive(const kn_tensor *t);
/* New node: contiguous strides from shape; sym copied when non-NULL;
 * requires_grad propagated from the sources (unless in a no-grad scope). */
kn_tensor *kn__node(kn_ctx *ctx, kn_op op, kn_dtype dt, int ndim, const int64_t *shape,
                    const int8_t *sym, kn_tensor *const *src, int nsrc);
/* New view node of x (storage shared with x's storage owner). */
kn_tensor *kn__view_node(kn_ctx *ctx, kn_op op, kn_tensor *x, int ndim, const int64_t *shape,
                         const int64_t *stride, int64_t offset, const int8_t *sym);
void kn__contig_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Fused in-place Adam/AdamW step of p and its moments m, v (ops_optim.c). */
kn_tensor *kn__adam_update(kn_ctx *ctx, kn_tensor *p, kn_tensor *g, kn_tensor *m, kn_tensor *v, kn_tensor *c,
                           double beta1, double beta2, double eps, double l2);
/* Bytes of the by-product a node keeps for its gradient, and their offset
 * after the elements in a persistent buffer (ops_nn.c: sdpa's log-sum-exp). */
size_t kn__aux_bytes(const kn_tensor *t);
size_t kn__aux_offset(const kn_tensor *t);
/* sdpa's fused gradient (ops_nn.c): views dq, dk, dv of one SDPA_BWD node. */
kn_status kn__sdpa_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **dq, kn_tensor **dk, kn_tensor **dv);
/* layer/rms norm's fused gradient (ops_nn.c): views dx and (want_wb) dw, db of one NORM_BWD node. */
kn_status kn__norm_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, bool want_wb, kn_tensor **dx, kn_tensor **dw,
                       kn_tensor **db);
/* cross_entropy's gradient (ops_loss.c): dlogits [N,C], a view of one CROSS_ENTROPY_BWD node [N,Cp]. */
kn_tensor *kn__cross_entropy_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g);
int kn__norm_dim(kn_ctx *ctx, const char *op, int dim, int ndim, bool *ok);
/* numpy broadcast of two shapes; false (and an error) when incompatible */
bool kn__broadcast_shape(kn_ctx *ctx, const char *op, const kn_tensor *a, const kn_tensor *b,
                         int *ndim, int64_t *shape, int8_t *sym);
kn_dtype kn__promote(kn_dtype a, kn_dtype b);
bool kn__is_view_op(kn_op op);
/* Grouped-query heads as full ones: kv [B,Hkv,T,D] -> [B,Hkv*G,T,D] (a view:
 * head h reads kv head h / G); kv itself when G is 1 (ops_view.c) */
kn_tensor *kn__repeat_heads(kn_ctx *ctx, kn_tensor *kv, int64_t G);
/* The sources an effect node writes in place, bit k for src[k] (its own
 * storage, the dst, is written too): assign and index_copy write src[0],
 * adam_update p, exp_avg and exp_avg_sq (src 0, 2, 3); an effect not listed
 * here counts as writing every operand. 0 for the other kinds. */
static inline unsigned kn__effect_writes(kn_op op) {
    if (kn_op_get(op)->kind != KN_KIND_EFFECT) return 0;
    return op == KN_OP_ASSIGN || op == KN_OP_INDEX_COPY ? 1u : op == KN_OP_ADAM_UPDATE ? 0xdu : 0xffu;
}
/* extent of dim i at run time given symbol values (syms may be NULL: max) */
static inline int64_t kn__extent(const kn_tensor *t, int i, const int64_t *syms) {
    return (t->sym[i] && syms) ? syms[t->sym[i]] : t->shape[i];
}
/* storage size in elements needed by t's layout at max extents */
int64_t kn__storage_elems(const kn_tensor *t);
kn_tensor *kn__storage_owner(kn_tensor *t);

/* ---- graph (src/graph/graph.c) ------------------------------------------- */
/* Nodes reachable from outs that must be computed, in dependency order.
 * Stops at materialised tensors (buf != NULL) unless they are in outs or
 * not yet computed. Caller frees *order. */
kn_status kn__toposort(kn_ctx *ctx, int nout, kn_tensor **outs, bool stop_at_realized,
                       kn_tensor ***order, int *n);

#endif
