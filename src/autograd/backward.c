/* backward.c: reverse-mode autodiff that appends gradient nodes to the graph.
 *
 * The backward pass is itself a lazy graph, planned and replayed like any
 * other. Walk the nodes feeding the outputs in reverse dependency order; for
 * each node with an incoming gradient call its rule (rules.c, one table keyed
 * by op) and add the results into its sources' gradients. Gradient nodes are
 * built in a no-grad scope (no higher-order gradients yet).
 */
#include "kn-impl.h"
#include <stdlib.h>
#include <string.h>

static kn_tensor *accumulate(kn_ctx *ctx, kn_tensor *have, kn_tensor *g, const kn_tensor *src) {
    if (g->dtype != src->dtype && kn_dtype_get(src->dtype)->is_float) g = kn_cast(ctx, g, src->dtype);
    return have ? kn_add(ctx, have, g) : g;
}

kn_status kn_gradients(kn_ctx *ctx, int nout, kn_tensor **outs, kn_tensor **gouts,
                       int nin, kn_tensor **ins, kn_tensor **grads) {
    kn_tensor **order; int n;
    for (int i = 0; i < nout; i++)
        if (!outs[i]) return kn_set_error(KN_ERR_INVALID, "kn_gradients: output %d is NULL (an earlier op failed: %s)", i, kn_last_error());
    kn_status st = kn__toposort(ctx, nout, outs, false, &order, &n);
    if (st) return st;
    int32_t N = ctx->n_all;
    kn_tensor **gmap = calloc((size_t)N, sizeof *gmap);
    if (!gmap) { free(order); return kn_set_error(KN_ERR_NOMEM, "out of memory in backward"); }
    kn_no_grad_begin(ctx);
    for (int i = 0; i < nout; i++) {
        kn_tensor *seed = gouts && gouts[i] ? gouts[i] : kn_ones_like(ctx, outs[i]);
        if (seed && !kn_same_shape(seed, outs[i])) {
            char a[160], b[160];
            st = kn_set_error(KN_ERR_INVALID, "backward: seed gradient %s does not match output %s",
                              kn__shape_str(seed, a, sizeof a), kn__shape_str(outs[i], b, sizeof b));
            goto done;
        }
        gmap[outs[i]->id] = accumulate(ctx, gmap[outs[i]->id], seed, outs[i]);
    }
    for (int i = n - 1; i >= 0; i--) {
        kn_tensor *t = order[i];
        kn_tensor *g = gmap[t->id];
        if (!g || !(t->flags & KN_FLAG_REQUIRES_GRAD)) continue;
        bool needs = false;
        for (int k = 0; k < KN_MAX_SRC; k++) if (t->src[k] && (t->src[k]->flags & KN_FLAG_REQUIRES_GRAD)) needs = true;
        if (!needs) continue;
        kn_grad_rule rule = kn__grad_rule(t->op);
        if (!rule) { st = kn_set_error(KN_ERR_UNSUPPORTED, "backward: %s is not differentiable", kn_op_name(t->op)); goto done; }
        kn_tensor *gin[KN_MAX_SRC] = {0};
        rule(ctx, t, g, gin);
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = t->src[k];
            if (!s || !(s->flags & KN_FLAG_REQUIRES_GRAD) || !gin[k]) continue;
            if (!kn_same_shape(gin[k], s)) {
                char a[160], b[160];
                st = kn_set_error(KN_ERR_STATE, "backward: the rule of %s gave input %d a gradient of shape %s for a %s input (a kiln bug)",
                                  kn_op_name(t->op), k, kn__shape_str(gin[k], a, sizeof a), kn__shape_str(s, b, sizeof b));
                goto done;
            }
            gmap[s->id] = accumulate(ctx, gmap[s->id], gin[k], s);
        }
        if (ctx->status != KN_OK) { st = ctx->status; goto done; }
    }
    for (int j = 0; j < nin; j++) grads[j] = (ins[j] && ins[j]->id < N) ? gmap[ins[j]->id] : NULL;
done:
    kn_no_grad_end(ctx);
    free(gmap); free(order);
    return st;
}

kn_status kn_backward_seed(kn_ctx *ctx, kn_tensor *out, kn_tensor *seed) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_backward: NULL output (an earlier op failed: %s)", kn_last_error());
    if (!(out->flags & KN_FLAG_REQUIRES_GRAD))
        return kn_set_error(KN_ERR_INVALID, "kn_backward: the output does not require grad (no input has requires_grad set, or it was built in a no-grad scope)");
    /* the leaves that want a .grad */
    kn_tensor **order; int n;
    kn_status st = kn__toposort(ctx, 1, &out, false, &order, &n);
    if (st) return st;
    int32_t N = ctx->n_all;
    uint8_t *seen = calloc((size_t)N, 1);
    kn_tensor **leaves = malloc(sizeof *leaves * (size_t)(N ? N : 1));
    int nl = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = order[i]->src[k];
            if (s && s->op == KN_OP_NONE && (s->flags & KN_FLAG_REQUIRES_GRAD) && !seen[s->id]) { seen[s->id] = 1; leaves[nl++] = s; }
        }
    free(order); free(seen);
    kn_tensor **grads = calloc((size_t)(nl ? nl : 1), sizeof *grads);
    st = kn_gradients(ctx, 1, &out, seed ? &seed : NULL, nl, leaves, grads);
    if (st == KN_OK) {
        kn_no_grad_begin(ctx);
        for (int i = 0; i < nl; i++)
            if (grads[i]) leaves[i]->grad = leaves[i]->grad ? kn_add(ctx, leaves[i]->grad, grads[i]) : grads[i];
        kn_no_grad_end(ctx);
    }
    free(grads); free(leaves);
    return st;
}

kn_status kn_backward(kn_ctx *ctx, kn_tensor *loss) { return kn_backward_seed(ctx, loss, NULL); }

kn_tensor *kn_detach(kn_ctx *ctx, kn_tensor *x) {
    if (!x) return NULL;
    kn_no_grad_begin(ctx);
    kn_tensor *t = kn__view_node(ctx, KN_OP_RESHAPE, x, x->ndim, x->shape, x->stride, x->offset, x->sym);
    kn_no_grad_end(ctx);
    if (t) t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
    return t;
}
