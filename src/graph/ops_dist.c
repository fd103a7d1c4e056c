/* ops_dist.c: the collectives of kiln_dist.h as graph nodes. A node keeps
 * its communicator (p.dist.comm); the backend's comm family runs it (the
 * reference backend over the host control channel, CUDA through NCCL).
 * all_reduce and broadcast may run in place (the op table's inplace flag):
 * the CUDA backend then lets the collective run beside later kernels. */
#include "graph/graph.h"
#include "core/dist.h"

static kn_tensor *coll(kn_ctx *ctx, kn_op op, kn_tensor *x, kn_dist *d, int rop, int root, int64_t dim0) {
    const char *name = kn_op_name(op);
    if (!x) return NULL;
    if (!d) return kn__fail(ctx, KN_ERR_INVALID, "%s: the communicator is NULL (kn_dist_init_env first)", name);
    kn_dtype dt = x->dtype;
    if (!(dt == KN_F32 || dt == KN_F64 || dt == KN_F16 || dt == KN_BF16 || dt == KN_I32 || dt == KN_I64))
        return kn__fail(ctx, KN_ERR_UNSUPPORTED, "%s: dtype %s is not supported (f32, f64, f16, bf16, i32, i64)", name,
                        kn_dtype_name(dt));
    if ((unsigned)rop > KN_DIST_MIN) return kn__fail(ctx, KN_ERR_INVALID, "%s: unknown reduce op %d", name, rop);
    int64_t shape[KN_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    if (dim0 >= 0) {         /* all_gather, reduce_scatter: dim 0 changes size */
        if (x->ndim < 1) return kn__fail(ctx, KN_ERR_INVALID, "%s: needs at least one dim", name);
        if (x->sym[0]) return kn__fail(ctx, KN_ERR_UNSUPPORTED, "%s: dim 0 is symbolic (a run-time extent)", name);
        shape[0] = dim0;
    }
    /* run-time extents (a prompt of T rows) are fine: every rank runs the same T */
    kn_tensor *t = kn__node(ctx, op, dt, x->ndim, shape, x->sym, &x, 1);
    if (t) {
        t->p.dist.comm = d;
        t->p.dist.op = rop;
        t->p.dist.root = root;
        t->flags &= ~KN_FLAG_REQUIRES_GRAD;     /* no gradient flows through a collective */
    }
    return t;
}

kn_tensor *kn_all_reduce(kn_ctx *ctx, kn_tensor *x, kn_dist *d, kn_dist_op op) {
    return coll(ctx, KN_OP_ALL_REDUCE, x, d, (int)op, 0, -1);
}

kn_tensor *kn_all_gather(kn_ctx *ctx, kn_tensor *x, kn_dist *d) {
    if (!x) return NULL;
    if (x->ndim < 1) return kn__fail(ctx, KN_ERR_INVALID, "all_gather: needs at least one dim");
    return coll(ctx, KN_OP_ALL_GATHER, x, d, KN_DIST_SUM, 0, x->shape[0] * kn_dist_world(d));
}

kn_tensor *kn_reduce_scatter(kn_ctx *ctx, kn_tensor *x, kn_dist *d, kn_dist_op op) {
    if (!x) return NULL;
    int w = kn_dist_world(d);
    if (x->ndim < 1 || x->shape[0] % w)
        return kn__fail(ctx, KN_ERR_INVALID, "reduce_scatter: dim 0 (%lld) must be a multiple of the world size %d",
                        x->ndim ? (long long)x->shape[0] : 0LL, w);
    return coll(ctx, KN_OP_REDUCE_SCATTER, x, d, (int)op, 0, x->shape[0] / w);
}

kn_tensor *kn_broadcast(kn_ctx *ctx, kn_tensor *x, kn_dist *d, int root) {
    if (d && (root < 0 || root >= kn_dist_world(d)))
        return kn__fail(ctx, KN_ERR_INVALID, "broadcast: root %d outside 0..%d", root, kn_dist_world(d) - 1);
    return coll(ctx, KN_OP_BROADCAST, x, d, KN_DIST_SUM, root, -1);
}
