/* epilogue.c: matmul epilogue fusion (docs/COMPILER.md, "Matmul epilogues").
 *
 * Runs after the graph rewrites and before elementwise fusion. A MATMUL node
 * mm [..., M, N] whose value only feeds a chain of elementwise nodes takes
 * the chain's longest prefix of the form
 *     y = cast?( res? + act?( mm + bias? ) )
 * into its epilogue: the matmul then runs at the place of the prefix's last
 * node and writes that node's value into that node's storage; the matmul and
 * the prefix's other nodes leave the schedule. Non-goals: chains that branch,
 * broadcasting residuals, scales or other binaries (future rows of the same
 * predicate).
 *
 * The predicate. Starting at cur = mm, the next node r joins while:
 *   1. cur is not a plan output, has no storage of its own (t->buf: the user
 *      may read it) and r is its only reader in the schedule (views and
 *      effects count as readers), so no absorbed value is needed elsewhere;
 *   2. r is not a view, is contiguous, has cur's shape (symbols included);
 *   3. r is, in this order, each step at most once:
 *        bias: add(cur, v) or add(v, cur), v float of shape [N] or
 *              [1, .., 1, N] (broadcast along rows: the last dim), r->dtype = dt;
 *        act:  relu, gelu (erf), gelu_tanh or silu of cur, r->dtype = dt;
 *        res:  add(cur, v) or add(v, cur), v float of cur's exact shape, v != cur,
 *              r->dtype = dt;
 *        cast: cast of cur to f32, bf16 or f16 (the last step);
 *      where dt is mm's dtype (f32, f16, bf16, f64): every step before the
 *      cast rounds to dt exactly as the unfused nodes store it (no promotion);
 *   4. no effect (assign, index_copy, adam_update) lies in the schedule
 *      between mm and r: the matmul and the epilogue's operands are read at
 *      r's place, later than the unfused graph reads them;
 *   5. r is in no other matmul's chain (add(a @ b, c @ d): the first matmul
 *      in schedule order takes the add, with the other product as residual);
 * then the longest prefix the backend accepts (ok) is kept. The residual is
 * never the destination's storage: the runtime plans `last` without
 * in-place reuse (memplan.c), so no backend has to handle an aliased
 * residual.
 *
 * Prologues. The matmul's left operand a may be computed as the product
 * reads it, instead of by a kernel of its own that stores it: a decode
 * step's GEMV reads a [1, K] row once per block, so the norm before the
 * projection, or SwiGLU before the down projection, costs the GEMV a few
 * loads and no launch. a is taken when:
 *   1. a is f32, contiguous, no view, not a plan output, no storage of its
 *      own, mm its only reader, and in no other record;
 *   2. a = rms_norm(x, w?) over the last dim, x f32 of a's shape, w f32
 *      [K] (prologue KN_OP_RMS_NORM); or a = mul(silu(x), u) (either
 *      order), silu f32 read only by the mul, x and u f32 of a's shape
 *      (views allowed: the two halves of gate | up; prologue KN_OP_SILU);
 *   3. no effect lies in the schedule between the prologue's first node
 *      and mm (its inputs are read later than unfused).
 * The record's a is then x and its pre w or u; the prologue's nodes leave
 * the schedule. The backend is asked with the prologue and each epilogue
 * prefix first, then without it.
 */
#include "compile/epilogue.h"
#include <stdlib.h>
#include <string.h>

static bool float_dt(kn_dtype d) { return d == KN_F32 || d == KN_F16 || d == KN_BF16 || d == KN_F64; }

static bool same_space(const kn_tensor *a, const kn_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i] || a->sym[i] != b->sym[i]) return false;
    return true;
}

/* v broadcasts as a vector [N] along the rows of cur [..., M, N]. */
static bool is_bias(const kn_tensor *v, const kn_tensor *cur) {
    if (v->ndim < 1 || v->ndim > cur->ndim) return false;
    int lv = v->ndim - 1, lc = cur->ndim - 1;
    if (v->shape[lv] != cur->shape[lc] || v->sym[lv] != cur->sym[lc]) return false;
    for (int i = 0; i < lv; i++) if (v->shape[i] != 1 || v->sym[i]) return false;
    return true;
}

static bool is_act(kn_op op) { return op == KN_OP_RELU || op == KN_OP_GELU || op == KN_OP_GELU_TANH || op == KN_OP_SILU; }

enum { ST_BIAS, ST_ACT, ST_RES, ST_CAST };
typedef struct { int kind; kn_tensor *node, *operand; } step;

typedef struct {
    kn_tensor *const *rep;
    int32_t n_ids;
    int32_t *pos;       /* by id: schedule index, -1 */
    int32_t *nread;     /* by id: readers in the schedule */
    kn_tensor **reader; /* by id: the (last seen) reader */
    uint8_t *out;       /* by id: a plan output */
    int *neff;          /* effects before schedule index i */
    uint8_t *taken;     /* by id: in a record already (its matmul or a chain node) */
} ep;

static kn_tensor *src_of(const ep *w, const kn_tensor *t, int k) { return kn__rw_src(w->rep, w->n_ids, t, k); }

/* cur may be absorbed and hands its value to exactly one reader: that reader. */
static kn_tensor *only_reader(const ep *w, const kn_tensor *cur) {
    if (cur->id >= w->n_ids || w->out[cur->id] || cur->buf || w->nread[cur->id] != 1) return NULL;
    return w->reader[cur->id];
}

/* The operand of binary r that is not cur (NULL when both are cur). */
static kn_tensor *other(const ep *w, const kn_tensor *r, const kn_tensor *cur) {
    kn_tensor *a = src_of(w, r, 0), *b = src_of(w, r, 1);
    if (a == cur && b != cur) return b;
    if (b == cur && a != cur) return a;
    return NULL;
}

/* The chain after mm (steps in order); returns how many. */
static int chain(const ep *w, kn_tensor *mm, step *s) {
    int ns = 0, have = -1;      /* have: the last step kind taken */
    kn_dtype dt = mm->dtype;
    kn_tensor *cur = mm;
    while (ns < 4) {
        kn_tensor *r = only_reader(w, cur);
        if (!r || r->id >= w->n_ids || w->pos[r->id] < 0 || w->taken[r->id]) break;
        if ((r->flags & KN_FLAG_VIEW) || kn__is_view_op(r->op) || !kn_is_contiguous(r) || !same_space(r, cur)) break;
        if (w->neff[w->pos[r->id]] != w->neff[w->pos[mm->id] + 1]) break;
        step st = {-1, r, NULL};
        if (r->op == KN_OP_ADD && r->dtype == dt) {
            kn_tensor *v = other(w, r, cur);
            if (!v || !float_dt(v->dtype)) break;
            if (have < ST_BIAS && is_bias(v, cur) && !same_space(v, cur)) st.kind = ST_BIAS;
            else if (have < ST_RES && same_space(v, cur)) st.kind = ST_RES;
            st.operand = v;
        } else if (is_act(r->op) && r->dtype == dt && src_of(w, r, 0) == cur && have < ST_ACT) {
            st.kind = ST_ACT;
        } else if (r->op == KN_OP_CAST && src_of(w, r, 0) == cur &&
                   (r->dtype == KN_F32 || r->dtype == KN_BF16 || r->dtype == KN_F16)) {
            st.kind = ST_CAST;
        }
        if (st.kind < 0) break;
        s[ns++] = st;
        have = st.kind;
        cur = r;
        if (st.kind == ST_CAST) break;
    }
    return ns;
}

/* ---- prologues ---- */
typedef struct { kn_op op; kn_tensor *x, *p, *node[2]; int nnode; float eps; } pro;

/* no effect lies in the schedule strictly between node a and mm */
static bool calm_between(const ep *w, const kn_tensor *a, const kn_tensor *mm) {
    return w->neff[w->pos[mm->id]] == w->neff[w->pos[a->id] + 1];
}

/* node t may leave the schedule for a prologue read only by `by` */
static bool absorbable(const ep *w, const kn_tensor *t, const kn_tensor *by) {
    return t && t->id < w->n_ids && w->pos[t->id] >= 0 && !w->taken[t->id] && only_reader(w, t) == by &&
           !(t->flags & KN_FLAG_VIEW) && !kn__is_view_op(t->op) && t->dtype == KN_F32 && kn_is_contiguous(t);
}

/* mm's left operand as a prologue (predicate in the header); false: none */
static bool prologue(const ep *w, kn_tensor *mm, pro *p) {
    kn_tensor *a = src_of(w, mm, 0);
    memset(p, 0, sizeof *p);
    if (!absorbable(w, a, mm) || !calm_between(w, a, mm) || src_of(w, mm, 1) == a) return false;
    if (a->op == KN_OP_RMS_NORM && a->p.norm.n_norm == 1) {
        kn_tensor *x = src_of(w, a, 0), *g = a->src[1] ? src_of(w, a, 1) : NULL;
        if (!x || x->dtype != KN_F32 || !same_space(x, a)) return false;
        if (g && (g->dtype != KN_F32 || g->ndim != 1 || g->shape[0] != a->shape[a->ndim - 1] || g->sym[0])) return false;
        *p = (pro){KN_OP_RMS_NORM, x, g, {a, NULL}, 1, (float)a->p.norm.eps};
        return true;
    }
    if (a->op != KN_OP_MUL) return false;
    for (int k = 0; k < 2; k++) {
        kn_tensor *act = src_of(w, a, k), *u = src_of(w, a, 1 - k);
        if (!act || !u || act == u || act->op != KN_OP_SILU || !absorbable(w, act, a) || !calm_between(w, act, mm)) continue;
        kn_tensor *x = src_of(w, act, 0);
        if (!x || x->dtype != KN_F32 || u->dtype != KN_F32 || !same_space(x, a) || !same_space(u, a)) continue;
        *p = (pro){KN_OP_SILU, x, u, {act, a}, 2, 0.f};
        return true;
    }
    return false;
}

static kn_epilogue describe(const kn_tensor *mm, const step *s, int ns, kn_tensor **bias, kn_tensor **res) {
    kn_epilogue d;
    memset(&d, 0, sizeof d);
    d.dt = mm->dtype;
    d.act = KN_OP_NONE;
    *bias = *res = NULL;
    for (int i = 0; i < ns; i++) {
        if (s[i].kind == ST_BIAS) { d.bias = true; d.vbias.dtype = s[i].operand->dtype; d.vbias.ndim = 1; *bias = s[i].operand; }
        if (s[i].kind == ST_ACT) d.act = s[i].node->op;
        if (s[i].kind == ST_RES) { d.res = true; d.vres.dtype = s[i].operand->dtype; d.vres.ndim = mm->ndim; *res = s[i].operand; }
    }
    return d;
}

bool kn__epilogue(kn_tensor **order, int *n, int32_t n_ids, int nout, kn_tensor *const *outs, kn_tensor *const *rep,
                  kn_epi_ok_fn ok, void *okctx, kn_epi_rec **recs, int *nrec) {
    *recs = NULL;
    *nrec = 0;
    size_t ni = (size_t)(n_ids ? n_ids : 1);
    ep w = {rep, n_ids, malloc(ni * sizeof(int32_t)), calloc(ni, sizeof(int32_t)), calloc(ni, sizeof(kn_tensor *)),
            calloc(ni, 1), malloc(((size_t)*n + 1) * sizeof(int)), calloc(ni, 1)};
    uint8_t *drop = calloc(ni, 1);
    kn_epi_rec *r = NULL;
    int nr = 0, cap = 0;
    bool okm = w.pos && w.nread && w.reader && w.out && w.neff && w.taken && drop;
    if (okm) {
        for (int32_t i = 0; i < n_ids; i++) w.pos[i] = -1;
        for (int o = 0; o < nout; o++) if (outs[o] && outs[o]->id < n_ids) w.out[outs[o]->id] = 1;
        w.neff[0] = 0;
        for (int i = 0; i < *n; i++) {
            kn_tensor *t = order[i];
            w.pos[t->id] = i;
            w.neff[i + 1] = w.neff[i] + (kn_op_get(t->op)->kind == KN_KIND_EFFECT);
            for (int k = 0; k < KN_MAX_SRC; k++) {
                kn_tensor *s = t->src[k] ? src_of(&w, t, k) : NULL;
                if (!s || s->id >= n_ids) continue;
                bool seen = false;      /* a node reading s twice (add(x, x)) is one reader */
                for (int j = 0; j < k; j++) if (t->src[j] && src_of(&w, t, j) == s) seen = true;
                if (!seen) { w.nread[s->id]++; w.reader[s->id] = t; }
            }
        }
    }
    for (int i = 0; okm && ok && i < *n; i++) {
        kn_tensor *mm = order[i];
        if (mm->op != KN_OP_MATMUL || mm->ndim < 2 || !float_dt(mm->dtype) || (mm->flags & KN_FLAG_VIEW) || w.taken[mm->id]) continue;
        step s[4];
        int ns0 = chain(&w, mm, s);
        pro pr;
        bool found = false;
        /* with the prologue: each epilogue prefix down to none; then without */
        for (int wp = prologue(&w, mm, &pr); wp >= 0 && !found && okm; wp--) {
            for (int ns = ns0; ns >= (wp ? 0 : 1); ns--) {
                kn_tensor *bias, *res;
                kn_epilogue d = describe(mm, s, ns, &bias, &res);
                if (wp) {
                    d.pre = pr.op;
                    d.pre_w = pr.op == KN_OP_RMS_NORM && pr.p;
                    d.pre_eps = pr.eps;
                    d.vpre.dtype = KN_F32;
                    d.vpre.ndim = pr.p ? pr.p->ndim : 0;
                }
                if (!ok(okctx, mm, &d, ns ? s[ns - 1].node->dtype : mm->dtype)) continue;
                if (nr == cap) {
                    int nc = cap ? cap * 2 : 8;
                    kn_epi_rec *g = realloc(r, sizeof *r * (size_t)nc);
                    if (!g) { okm = false; break; }
                    r = g; cap = nc;
                }
                kn_epi_rec *e = &r[nr++];
                memset(e, 0, sizeof *e);
                e->mm = mm;
                e->last = ns ? s[ns - 1].node : mm;
                e->a = wp ? pr.x : src_of(&w, mm, 0);
                e->b = src_of(&w, mm, 1);
                e->bias = bias;
                e->res = res;
                e->d = d;
                e->nabs = ns;
                for (int k = 0; k < ns; k++) e->chain[k] = s[k].node;
                if (wp) {
                    e->pre = pr.p;
                    e->npro = pr.nnode;
                    for (int k = 0; k < pr.nnode; k++) e->pro[k] = pr.node[k];
                }
                w.taken[mm->id] = 1;
                if (ns) drop[mm->id] = 1;
                for (int k = 0; k < ns; k++) w.taken[s[k].node->id] = 1;
                for (int k = 0; k < ns - 1; k++) drop[s[k].node->id] = 1;
                for (int k = 0; k < e->npro; k++) drop[e->pro[k]->id] = w.taken[e->pro[k]->id] = 1;
                found = true;
                break;
            }
        }
    }
    if (okm && nr) {
        int m = 0;
        for (int i = 0; i < *n; i++) if (!drop[order[i]->id]) order[m++] = order[i];
        *n = m;
        *recs = r;
        *nrec = nr;
    } else {
        free(r);
    }
    free(w.pos); free(w.nread); free(w.reader); free(w.out); free(w.neff); free(w.taken); free(drop);
    return okm;
}
