/* rewrite.c: graph rewrites, the first pass of the compiler (docs/COMPILER.md).
 *
 * Design: the plan, not the graph, is rewritten. kn_plan_new schedules the
 * user's nodes (kn__toposort, effects nobody reads last) and hands that list
 * here. A rule never edits a kn_tensor: it records in the plan's own table
 * rep[id] which node's value a reader of node id takes instead, and the node
 * is dropped from the plan's list once nothing live reads it. The runtime
 * reads every source through that table (kn__rw_src). So the user's graph,
 * its outputs (the same kn_tensor objects, same values) and any other plan
 * over the same nodes are untouched, and KN_NOFUSE=1 gives the plain plan.
 * Survivors keep their scheduled order, so what an effect (assign,
 * index_copy, adam_update) reads or writes, and when, does not move.
 *
 * Rules, applied in one pass over the schedule (dependency order, so each
 * node sees its sources already rewritten), repeated to a fixed point:
 *   view identity     a view (reshape, permute, expand, slice, as_strided)
 *                     whose dtype, shape, strides, offset and storage equal
 *                     its (rewritten) base's is its base;
 *   permute inverse   the case permute(permute(x, p), p^-1) of the above,
 *                     counted apart;
 *   cast same         cast to the dtype the input already has;
 *   neg neg           neg(neg(x)) for float dtypes (bit-exact, NaN included);
 *   arith identity    x*1, 1*x, x/1, x+(-0.0), (-0.0)+x, x-(+0.0) on floats
 *                     (x+(+0.0) is not folded: -0.0 + +0.0 = +0.0); x*1, 1*x,
 *                     x+0, 0+x, x-0 on integers. The constant must be a fill
 *                     node and the result must have x's dtype and shape (no
 *                     promotion, no broadcast). x*0 is never folded (NaN, inf);
 *   cse               two nodes with the same op, dtype, layout, parameters
 *                     and (rewritten) sources: the later reads the earlier;
 *   int zero, idempotent, const fold, sum expand
 *                     (rewrite_fold.c: the rules that may make a node, such
 *                     as a zero fill or a folded constant, in the graph's
 *                     context; made nodes join the schedule right before the
 *                     node they replace, once the passes are done);
 * then
 *   dead              nodes no output, effect or materialised node needs;
 *   view chain        a view read only by views: the last view of a chain
 *                     already holds the whole layout over the storage owner
 *                     (views never run a kernel), so the inner ones go.
 * What a rule must never do (each is a condition below):
 *   - remove or redirect an output, the storage owner of an output, a node
 *     that owns materialised storage (t->buf: the user may read it), an
 *     effect, a leaf, or a node another node views (its storage is shared);
 *   - redirect a reader to storage an effect of the plan writes (the value
 *     would be read at another time) unless the layout is identical
 *     (view identity); merge nodes reading such storage (cse), or random ops.
 */
#include "compile/rewrite_impl.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *g_names[KN_RW_NRULES] = {
    "view_identity", "permute_inverse", "view_chain", "arith_identity",
    "cast_same", "neg_neg", "cse", "dead", "int_zero", "idempotent",
    "const_fold", "sum_expand",
};
const char *kn__rw_rule_name(kn_rw_rule r) { return (unsigned)r < KN_RW_NRULES ? g_names[r] : "?"; }

#define R kn__rw_R
#define src_of kn__rw_srcof
#define written kn__rw_written
#define kind_of kn__rw_kind
#define same_shape kn__rw_same_shape
#define removable kn__rw_removable
#define can_replace_value kn__rw_can_replace

bool kn__rw_removable(const rw *w, const kn_tensor *t) {
    kn_op_kind k = kind_of(t);
    if (w->fl[t->id] & (F_OUT | F_ALIASED)) return false;
    if (k == KN_KIND_EFFECT || k == KN_KIND_LEAF) return false;
    if (k != KN_KIND_VIEW && t->buf) return false;
    return true;
}

static bool same_layout(const kn_tensor *a, const kn_tensor *b) {
    if (a->dtype != b->dtype || !same_shape(a, b) || a->offset != b->offset) return false;
    for (int i = 0; i < a->ndim; i++) if (a->stride[i] != b->stride[i]) return false;
    return true;
}

/* c is a fill node whose value, stored in its dtype, is v (sign of zero included
 * when the fill is a float). */
static bool is_const(const kn_tensor *c, double v) {
    if (c->op != KN_OP_FILL) return false;
    const kn_dtype_info *d = kn_dtype_get(c->dtype);
    if (d->is_quant || c->dtype == KN_BOOL) return false;
    double a = c->p.scalar.a;
    if (a != v) return false;
    if (v == 0 && d->is_float) return signbit(a) == signbit(v);
    return true;
}

/* x may stand in for t: same dtype, shape and strides (readers see the layout
 * they were built for: an op that needed a contiguous operand got one), not
 * an effect, storage not written by an effect of the plan. */
bool kn__rw_can_replace(const rw *w, const kn_tensor *t, kn_tensor *x) {
    if (!x || x->dtype != t->dtype || !same_shape(x, t) || kind_of(x) == KN_KIND_EFFECT || written(w, x)) return false;
    for (int i = 0; i < t->ndim; i++) if (x->stride[i] != t->stride[i]) return false;
    return true;
}

/* arith identity: the operand t equals, or NULL */
static kn_tensor *arith_identity(const rw *w, const kn_tensor *t) {
    if (t->op != KN_OP_ADD && t->op != KN_OP_SUB && t->op != KN_OP_MUL && t->op != KN_OP_DIV) return NULL;
    const kn_dtype_info *d = kn_dtype_get(t->dtype);
    bool fl = d->is_float, in = d->is_int;
    if (!fl && !in) return NULL;
    kn_tensor *a = src_of(w, t, 0), *b = src_of(w, t, 1), *x = NULL;
    if (!a || !b) return NULL;
    switch (t->op) {
    case KN_OP_MUL:
        if (is_const(b, 1)) x = a; else if (is_const(a, 1)) x = b;
        break;
    case KN_OP_DIV:
        if (fl && is_const(b, 1)) x = a;
        break;
    case KN_OP_ADD:     /* floats: only -0.0 is the identity of + */
        if (fl) {   /* a float fill: an integer -0.0 is +0 */
            if (kn_dtype_get(b->dtype)->is_float && is_const(b, -0.0)) x = a;
            else if (kn_dtype_get(a->dtype)->is_float && is_const(a, -0.0)) x = b;
        }
        else if (b->op == KN_OP_FILL && !kn_dtype_get(b->dtype)->is_float && is_const(b, 0)) x = a;
        else if (a->op == KN_OP_FILL && !kn_dtype_get(a->dtype)->is_float && is_const(a, 0)) x = b;
        break;
    case KN_OP_SUB:     /* x - (+0.0) == x + (-0.0) */
        if (fl ? is_const(b, 0.0) : (!kn_dtype_get(b->dtype)->is_float && is_const(b, 0))) x = a;
        break;
    default: break;
    }
    return (x && can_replace_value(w, t, x)) ? x : NULL;
}

/* ---- cse ---- */
static bool cse_ok(const rw *w, const kn_tensor *t) {
    kn_op_kind k = kind_of(t);
    if (k == KN_KIND_EFFECT || k == KN_KIND_LEAF || t->op == KN_OP_RAND || t->op == KN_OP_RANDPERM) return false;
    if (written(w, (kn_tensor *)t)) return false;
    for (int i = 0; i < KN_MAX_SRC; i++) {
        kn_tensor *s = src_of(w, t, i);
        if (s && written(w, s)) return false;
    }
    return true;
}
static uint64_t mix(uint64_t h, uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); return h; }
static uint64_t cse_hash(const rw *w, const kn_tensor *t) {
    uint64_t h = mix((uint64_t)t->op, (uint64_t)t->dtype);
    h = mix(h, (uint64_t)t->ndim);
    for (int i = 0; i < t->ndim; i++) h = mix(h, (uint64_t)t->shape[i]);
    for (int k = 0; k < KN_MAX_SRC; k++) { kn_tensor *s = src_of(w, t, k); h = mix(h, s ? (uint64_t)s->id + 1 : 0); }
    const unsigned char *p = (const unsigned char *)&t->p;
    for (size_t i = 0; i < sizeof t->p; i += 8) { uint64_t v = 0; memcpy(&v, p + i, sizeof t->p - i < 8 ? sizeof t->p - i : 8); h = mix(h, v); }
    return h;
}
static bool cse_equal(const rw *w, const kn_tensor *a, const kn_tensor *b) {
    if (a->op != b->op || a->dtype != b->dtype || !same_layout(a, b) || a->view_src != b->view_src) return false;
    if ((a->flags & KN_FLAG_VIEW) != (b->flags & KN_FLAG_VIEW)) return false;
    for (int k = 0; k < KN_MAX_SRC; k++) if (src_of(w, a, k) != src_of(w, b, k)) return false;
    return memcmp(&a->p, &b->p, sizeof a->p) == 0;
}

/* One pass; returns the number of nodes redirected, -1 when out of memory. */
static int pass(rw *w, kn_tensor **order, int n, kn_tensor **tab, size_t cap, int *removed) {
    int changed = 0;
    memset(tab, 0, sizeof *tab * cap);
    for (int i = 0; i < n; i++) {
        kn_tensor *t = order[i];
        if ((*w->rep)[t->id]) continue;
        bool rm = removable(w, t), oom = false;
        kn_tensor *to = NULL;
        kn_rw_rule rule = KN_RW_CSE;
        if (rm) {
            kn_op_kind k = kind_of(t);
            if (k == KN_KIND_VIEW) {
                /* t against each base down its view chain: permute(permute(x)) is x */
                for (kn_tensor *b = src_of(w, t, 0); b; b = kind_of(b) == KN_KIND_VIEW ? src_of(w, b, 0) : NULL) {
                    if (kind_of(b) == KN_KIND_EFFECT) break;
                    if (kn__storage_owner(b) == kn__storage_owner(t) && same_layout(t, b)) {
                        to = b;
                        rule = (t->op == KN_OP_PERMUTE && t->src[0]->op == KN_OP_PERMUTE) ? KN_RW_PERMUTE_INVERSE : KN_RW_VIEW_IDENTITY;
                        break;
                    }
                }
            } else if (t->op == KN_OP_CAST) {
                kn_tensor *x = src_of(w, t, 0);
                if (x && !kn_dtype_get(x->dtype)->is_quant && can_replace_value(w, t, x)) { to = x; rule = KN_RW_CAST_SAME; }
            } else if (t->op == KN_OP_NEG && kn_dtype_get(t->dtype)->is_float) {
                kn_tensor *x = src_of(w, t, 0);
                if (x && x->op == KN_OP_NEG && x->dtype == t->dtype) {
                    kn_tensor *y = src_of(w, x, 0);
                    if (can_replace_value(w, t, y)) { to = y; rule = KN_RW_NEG_NEG; }
                }
            } else if ((to = arith_identity(w, t))) {
                rule = KN_RW_ARITH_IDENTITY;
            }
            /* the rules that may make a node (rewrite_fold.c) */
            if (!to) to = kn__rw_fold(w, t, i, &rule, &oom);
            if (oom) return -1;
        }
        if (!to && cse_ok(w, t)) {
            size_t j = (size_t)cse_hash(w, t) & (cap - 1);
            for (; tab[j]; j = (j + 1) & (cap - 1))
                if (cse_equal(w, tab[j], t)) break;
            if (tab[j] && rm) { to = tab[j]; rule = KN_RW_CSE; }
            else if (!tab[j]) tab[j] = t;
        }
        if (to) {
            (*w->rep)[t->id] = to;
            if (removed) removed[rule]++;
            changed++;
        }
    }
    return changed;
}

/* The schedule with the nodes the rules made, each right before the node
 * whose position it was made at (so before every reader of that node).
 * false when out of memory. */
static bool insert_made(rw *w, kn_tensor ***order, int *n) {
    if (!w->nmade) return true;
    kn_tensor **o2 = malloc(sizeof *o2 * (size_t)(*n + w->nmade));
    if (!o2) return false;
    /* by position, stably: a later pass may make a node at an earlier place,
     * and nodes made at one place keep the order they were made in (a made
     * node reads only nodes made before it) */
    for (int a = 1; a < w->nmade; a++) {
        kn_tensor *t = w->made[a];
        int at = w->made_at[a], b = a;
        for (; b > 0 && w->made_at[b - 1] > at; b--) { w->made[b] = w->made[b - 1]; w->made_at[b] = w->made_at[b - 1]; }
        w->made[b] = t; w->made_at[b] = at;
    }
    int m = 0, k = 0;
    for (int i = 0; i < *n; i++) {
        for (; k < w->nmade && w->made_at[k] == i; k++) o2[m++] = w->made[k];
        o2[m++] = (*order)[i];
    }
    free(*order);
    *order = o2;
    *n = m;
    return true;
}

static void rw_free(rw *w) { free(w->fl); free(w->made); free(w->made_at); }

bool kn__rewrite(kn_ctx *ctx, kn_tensor ***order_io, int *n_io, int32_t *n_ids_io, int nout, kn_tensor **outs,
                 kn_tensor ***rep_io, int *removed, int *added) {
    int n = *n_io;
    int32_t n_ids = *n_ids_io;
    kn_tensor **order = *order_io;
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    rw w = { ctx, rep_io, n_ids, calloc((size_t)(n_ids ? n_ids : 1), 1), NULL, NULL, 0, 0 };
    kn_tensor **tab = malloc(sizeof *tab * cap);
    if (!w.fl || !tab) { rw_free(&w); free(tab); return false; }
    for (int o = 0; o < nout; o++) { w.fl[outs[o]->id] |= F_OUT; w.fl[kn__storage_owner(outs[o])->id] |= F_OUT; }
    for (int i = 0; i < n; i++) {
        kn_tensor *t = order[i];
        if (t->view_src) w.fl[t->view_src->id] |= F_ALIASED;
        if (kind_of(t) == KN_KIND_EFFECT) {
            unsigned mask = kn__effect_writes(t->op);    /* the sources it writes in place */
            for (int k = 0; k < KN_MAX_SRC; k++)
                if (t->src[k] && (mask >> k & 1)) w.fl[kn__storage_owner(t->src[k])->id] |= F_WRITTEN;
            w.fl[kn__storage_owner(t)->id] |= F_WRITTEN;
        }
    }
    int ch = 1;
    for (int it = 0; it < 16 && ch > 0; it++) ch = pass(&w, order, n, tab, cap, removed);
    free(tab);
    /* the made nodes join the schedule; from here on ids reach w.n_ids */
    *n_ids_io = w.n_ids;
    if (added) *added = w.nmade;
    if (ch < 0 || !insert_made(&w, order_io, &n)) { rw_free(&w); return false; }
    order = *order_io;
    kn_tensor **rep = *rep_io;
    n_ids = w.n_ids;
    uint32_t *nread = calloc((size_t)(n_ids ? n_ids : 1), sizeof *nread);      /* live readers */
    uint32_t *nread_k = calloc((size_t)(n_ids ? n_ids : 1), sizeof *nread_k);  /* live readers that are not views */
    if (!nread || !nread_k) { rw_free(&w); free(nread); free(nread_k); return false; }
    /* liveness, from outputs, effects and materialised computed nodes, backwards */
    for (int i = n - 1; i >= 0; i--) {
        kn_tensor *t = order[i];
        if (rep[t->id]) continue;
        kn_op_kind k = kind_of(t);
        if ((w.fl[t->id] & F_OUT) || k == KN_KIND_EFFECT || (t->buf && k != KN_KIND_VIEW && k != KN_KIND_LEAF))
            w.fl[t->id] |= F_LIVE;
        if (!(w.fl[t->id] & F_LIVE)) continue;
        for (int j = 0; j < KN_MAX_SRC; j++) {
            kn_tensor *s = src_of(&w, t, j);
            if (!s) continue;
            w.fl[s->id] |= F_LIVE;
            nread[s->id]++;
            if (kind_of(t) != KN_KIND_VIEW) nread_k[s->id]++;
        }
        if (t->view_src) w.fl[t->view_src->id] |= F_LIVE;
    }
    /* view chains: a live view read only by views */
    for (int i = 0; i < n; i++) {
        kn_tensor *t = order[i];
        if (rep[t->id] || !(w.fl[t->id] & F_LIVE) || kind_of(t) != KN_KIND_VIEW) continue;
        if ((w.fl[t->id] & (F_OUT | F_ALIASED)) || nread[t->id] == 0 || nread_k[t->id] != 0) continue;
        w.fl[t->id] |= F_DROP;
        if (removed) removed[KN_RW_VIEW_CHAIN]++;
    }
    /* resolve rep fully (targets come earlier in the order), then compact */
    for (int i = 0; i < n; i++) { kn_tensor *t = order[i]; if (rep[t->id]) rep[t->id] = R(&w, rep[t->id]); }
    int m = 0;
    for (int i = 0; i < n; i++) {
        kn_tensor *t = order[i];
        if (rep[t->id] || (w.fl[t->id] & F_DROP)) continue;
        if (!(w.fl[t->id] & F_LIVE)) { if (removed) removed[KN_RW_DEAD]++; continue; }
        order[m++] = t;
    }
    *n_io = m;
    rw_free(&w); free(nread); free(nread_k);
    return true;
}
