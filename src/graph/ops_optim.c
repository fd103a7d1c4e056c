/* ops_optim.c: the fused Adam/AdamW update node (kn__adam_update).
 *
 * One effect node (like assign: its output is a view of p's storage) that
 * updates p, and its moment buffers m and v, in place in one pass over the
 * four tensors, instead of the ~17 elementwise passes the same update takes
 * as separate graph ops. The arithmetic is the same sequence of f32
 * operations as the composite update in src/nn/optim.c (which stays the
 * definition, and is what the tests compare this against):
 *
 *   g' = g + l2 * p                   (Adam's coupled weight decay, l2 = 0 for AdamW)
 *   m  = m + (g' - m) * (1 - beta1)
 *   v  = v * beta2 + (g' * g') * (1 - beta2)
 *   p  = p * c[0] - (m / (sqrt(v) / c[2] + eps)) * c[1]
 *
 * c = [decay multiplier (1 - lr * wd for AdamW, else 1), lr / (1 - beta1^t),
 * sqrt(1 - beta2^t)], a [3] tensor of p's dtype computed once per parameter
 * group per step from the lr and step inputs. All of p, g, m, v: the same
 * shape and dtype (f32, f16, bf16 or f64); m and v materialised (optimizer
 * state), not written by anything else in the plan.
 */
#include "graph/graph.h"
#include <string.h>

kn_tensor *kn__adam_update(kn_ctx *ctx, kn_tensor *p, kn_tensor *g, kn_tensor *m, kn_tensor *v, kn_tensor *c,
                           double beta1, double beta2, double eps, double l2) {
    if (!p || !g || !m || !v || !c) return NULL;
    char a[160], b[160];
    const kn_tensor *st[3] = {g, m, v};
    for (int i = 0; i < 3; i++)
        if (!kn_same_shape(st[i], p) || st[i]->dtype != p->dtype)
            return kn__fail(ctx, KN_ERR_INVALID, "adam_update: gradient and moments must match the parameter %s %s, got %s %s",
                            kn_dtype_name(p->dtype), kn__shape_str(p, a, sizeof a), kn_dtype_name(st[i]->dtype),
                            kn__shape_str(st[i], b, sizeof b));
    if (!kn_dtype_get(p->dtype)->is_float || c->ndim != 1 || c->shape[0] != 3 || c->dtype != p->dtype)
        return kn__fail(ctx, KN_ERR_INVALID, "adam_update: needs a float parameter and coefficients [3] of its dtype");
    kn_tensor *own[3] = {kn__storage_owner(p), kn__storage_owner(m), kn__storage_owner(v)};
    for (int i = 0; i < 3; i++)
        if (own[i]->op != KN_OP_NONE)
            return kn__fail(ctx, KN_ERR_INVALID, "adam_update: parameter and moments must be materialised tensors, got a %s node",
                            kn_op_name(own[i]->op));
    kn_tensor *t = kn__view_node(ctx, KN_OP_ADAM_UPDATE, p, p->ndim, p->shape, p->stride, p->offset, p->sym);
    if (!t) return NULL;
    t->src[1] = g; t->src[2] = m; t->src[3] = v; t->src[4] = c;
    t->p.adam.beta1 = beta1; t->p.adam.beta2 = beta2; t->p.adam.eps = eps; t->p.adam.l2 = l2;
    t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
    return t;
}
