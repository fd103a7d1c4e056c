/* backward.c: reverse-mode autodiff that appends gradient nodes to the graph.
 *
 * The backward pass is itself a lazy graph, planned and replayed like any
 * other. Walk the nodes feeding the outputs in reverse dependency order; for
 * each node with an incoming gradient call its rule (rules.c, one table keyed
 * by op) and add the results into its sources' gradients. Gradient nodes are
 * built in a no-grad scope (no higher-order gradients yet).
 */
#include "autograd/autograd.h"
#include <stdlib.h>
#include <string.h>

/* a contribution in src's float dtype (a rule may produce a wider one) */
static kn_tensor *in_dtype_of(kn_ctx *ctx, kn_tensor *g, const kn_tensor *src) {
    if (g->dtype != src->dtype && kn_dtype_get(src->dtype)->is_float) g = kn_cast(ctx, g, src->dtype);
    return g;
}

/* ---- contributions -------------------------------------------------------------
 * A tensor's gradient is the sum of what its consumers send back. They are
 * collected per tensor and combined when the tensor is reached (all its
 * consumers come later in dependency order). Most sums are a chain of adds;
 * one pattern gets a cheaper form: zero pads of disjoint ranges along one dim
 * (the gradients of q, k, v sliced out of one fused projection) are one cat,
 * with zeros for the uncovered gaps, instead of full-size pads and adds. */
typedef struct { kn_tensor *g; int next; } contrib;
typedef struct { contrib *c; int n, cap; int *head, *tail; } contribs;

static bool add_contrib(contribs *cs, int32_t id, kn_tensor *g) {
    if (cs->n == cs->cap) {
        int cap = cs->cap ? 2 * cs->cap : 256;
        contrib *c = realloc(cs->c, sizeof *c * (size_t)cap);
        if (!c) return false;
        cs->c = c; cs->cap = cap;
    }
    cs->c[cs->n] = (contrib){g, -1};
    if (cs->head[id] < 0) cs->head[id] = cs->n; else cs->c[cs->tail[id]].next = cs->n;
    cs->tail[id] = cs->n++;
    return true;
}

/* g = zero pad of x along exactly one dim: that dim and the range x covers */
static bool zero_pad_piece(const kn_tensor *g, int *dim, int64_t *lo, int64_t *len) {
    if (g->op != KN_OP_PAD || g->p.pad.mode != KN_PAD_CONSTANT || g->p.pad.value != 0) return false;
    int d = -1;
    for (int i = 0; i < g->ndim; i++) {
        const int64_t *pp = &g->p.pad.pad[2 * (g->ndim - 1 - i)];
        if (pp[0] == 0 && pp[1] == 0) continue;
        if (d >= 0 || pp[0] < 0 || pp[1] < 0 || g->sym[i]) return false;
        d = i; *lo = pp[0]; *len = g->shape[i] - pp[0] - pp[1];
    }
    *dim = d;
    return d >= 0;
}

static int cmp_lo(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* disjoint zero pads along one dim -> one cat; NULL when the pattern does not hold */
static kn_tensor *cat_of_pads(kn_ctx *ctx, const contribs *cs, int32_t id, int cnt) {
    enum { MAXP = 16 };
    if (cnt < 2 || cnt > MAXP) return NULL;
    int64_t pc[MAXP][3];                          /* lo, len, contribution index */
    int dim = -1, k = 0;
    const kn_tensor *first = NULL;
    for (int i = cs->head[id]; i >= 0; i = cs->c[i].next, k++) {
        const kn_tensor *g = cs->c[i].g;
        int d;
        if (!zero_pad_piece(g, &d, &pc[k][0], &pc[k][1])) return NULL;
        if (first && (d != dim || g->dtype != first->dtype || !kn_same_shape(g, first))) return NULL;
        first = g; dim = d; pc[k][2] = i;
    }
    qsort(pc, (size_t)cnt, sizeof pc[0], cmp_lo);
    kn_tensor *parts[2 * MAXP + 1];
    int np = 0;
    int64_t at = 0, shape[KN_MAX_DIMS];
    for (int i = 0; i < first->ndim; i++) shape[i] = first->shape[i];
    for (int i = 0; i < cnt; i++) {
        if (pc[i][0] < at) return NULL;             /* overlapping ranges: they must add */
        if (pc[i][0] > at) { shape[dim] = pc[i][0] - at; parts[np++] = kn_zeros(ctx, first->dtype, first->ndim, shape); }
        if (pc[i][1] > 0) parts[np++] = cs->c[pc[i][2]].g->src[0];
        at = pc[i][0] + pc[i][1];
    }
    if (at < first->shape[dim]) { shape[dim] = first->shape[dim] - at; parts[np++] = kn_zeros(ctx, first->dtype, first->ndim, shape); }
    return np == 1 ? parts[0] : kn_cat(ctx, parts, np, dim);
}

/* the gradient of tensor id: its contributions combined (NULL: none) */
static kn_tensor *combine(kn_ctx *ctx, const contribs *cs, int32_t id) {
    int cnt = 0;
    for (int i = cs->head[id]; i >= 0; i = cs->c[i].next) cnt++;
    if (cnt == 0) return NULL;
    kn_tensor *sum = cat_of_pads(ctx, cs, id, cnt);
    if (sum) return sum;
    for (int i = cs->head[id]; i >= 0; i = cs->c[i].next) sum = sum ? kn_add(ctx, sum, cs->c[i].g) : cs->c[i].g;
    return sum;
}

/* the combined gradient of t, built once */
static kn_tensor *grad_of(kn_ctx *ctx, contribs *cs, kn_tensor **gmap, uint8_t *done, int32_t id) {
    if (!done[id]) { gmap[id] = combine(ctx, cs, id); done[id] = 1; }
    return gmap[id];
}

kn_status kn_gradients(kn_ctx *ctx, int nout, kn_tensor **outs, kn_tensor **gouts,
                       int nin, kn_tensor **ins, kn_tensor **grads) {
    kn_tensor **order; int n;
    for (int i = 0; i < nout; i++)
        if (!outs[i]) return kn_set_error(KN_ERR_INVALID, "kn_gradients: output %d is NULL (an earlier op failed: %s)", i, kn_last_error());
    kn_status st = kn__toposort(ctx, nout, outs, false, &order, &n);
    if (st) return st;
    int32_t N = ctx->n_all;
    kn_tensor **gmap = calloc((size_t)N + 1, sizeof *gmap);
    uint8_t *done = calloc((size_t)N + 1, 1);
    contribs cs = {NULL, 0, 0, malloc(sizeof(int) * ((size_t)N + 1)), malloc(sizeof(int) * ((size_t)N + 1))};
    if (!gmap || !done || !cs.head || !cs.tail) {
        free(gmap); free(done); free(cs.head); free(cs.tail); free(order);
        return kn_set_error(KN_ERR_NOMEM, "out of memory in backward");
    }
    for (int32_t i = 0; i < N; i++) cs.head[i] = -1;
    kn_no_grad_begin(ctx);
    for (int i = 0; i < nout; i++) {
        kn_tensor *seed = gouts && gouts[i] ? gouts[i] : kn_ones_like(ctx, outs[i]);
        if (seed && !kn_same_shape(seed, outs[i])) {
            char a[160], b[160];
            st = kn_set_error(KN_ERR_INVALID, "backward: seed gradient %s does not match output %s",
                              kn__shape_str(seed, a, sizeof a), kn__shape_str(outs[i], b, sizeof b));
            goto done;
        }
        if (seed && !add_contrib(&cs, outs[i]->id, in_dtype_of(ctx, seed, outs[i]))) goto nomem;
    }
    for (int i = n - 1; i >= 0; i--) {
        kn_tensor *t = order[i];
        if (!(t->flags & KN_FLAG_REQUIRES_GRAD)) continue;
        bool needs = false;
        for (int k = 0; k < KN_MAX_SRC; k++) if (t->src[k] && (t->src[k]->flags & KN_FLAG_REQUIRES_GRAD)) needs = true;
        if (!needs) continue;
        kn_tensor *g = grad_of(ctx, &cs, gmap, done, t->id);
        if (!g) continue;
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
            kn_tensor *c = in_dtype_of(ctx, gin[k], s);
            if (!c) break;
            if (!add_contrib(&cs, s->id, c)) goto nomem;
        }
        if (ctx->status != KN_OK) { st = ctx->status; goto done; }
    }
    for (int j = 0; j < nin; j++) grads[j] = (ins[j] && ins[j]->id < N) ? grad_of(ctx, &cs, gmap, done, ins[j]->id) : NULL;
    if (ctx->status != KN_OK) st = ctx->status;
    goto done;
nomem:
    st = kn_set_error(KN_ERR_NOMEM, "out of memory in backward");
done:
    kn_no_grad_end(ctx);
    free(gmap); free(done); free(order); free(cs.c); free(cs.head); free(cs.tail);
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
