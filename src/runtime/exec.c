/* exec.c: running a plan.
 *
 * Works on a built plan (order, arena offsets) and the context's symbol
 * values: for each node that computes, it resolves the node and its operands
 * to kn_tview (address, run-time extents, strides) and calls the backend's
 * compute. This loop is the one place the runtime hands nodes to a backend;
 * eager kn_realize runs a temporary plan through it too.
 */
#include "runtime/runtime.h"
#include "core/env.h"          // defines: kn_env_get (KN_BATCH)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Byte address of t's element 0 in this plan. */
static char *addr_of(const kn_plan *p, kn_tensor *t) {
    kn_tensor *own = kn__storage_owner(t);
    char *base;
    if (own->buf) base = own->buf->data;
    else if (own->id < p->n_ids && p->off[own->id] >= 0) base = (char *)p->arena->data + p->off[own->id];
    else return NULL;
    const kn_dtype_info *d = kn_dtype_get(t->dtype);
    return base + (size_t)(t->offset / d->block_size) * d->type_size;
}

/* t's extents at the current symbol values (kn_sym_set), so one plan serves
 * every sequence length. */
bool kn__tview_of(const kn_plan *p, kn_tensor *t, kn_tview *v) {
    v->data = addr_of(p, t);
    v->buf = kn__storage_owner(t)->buf;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) { v->ne[i] = kn__extent(t, i, p->ctx->sym_val); v->st[i] = t->stride[i]; }
    /* a dim of extent 1 is never stepped over, so its stride is free: give
     * it the row-major one (a [1, K] view of a transposed [H, 1, D] has row
     * stride D, and a kernel that takes it as a row pitch (an lda) must
     * not see one below K) */
    for (int i = t->ndim - 2; i >= 0; i--)
        if (v->ne[i] == 1 && v->st[i + 1] >= 0) v->st[i] = v->st[i + 1] * (v->ne[i + 1] > 0 ? v->ne[i + 1] : 1);
    return v->data != NULL;
}

/* Every step of the plan, in order, on the backend's queue; no final wait
 * (a device backend returns with the work queued). */
/* A fused group's kernel (src/compile/fuse.c), at the place of its last node. */
static kn_status run_group(kn_plan *p, const kn_fgroup *g, void *kernel) {
    kn_kernel_launch l;
    memset(&l, 0, sizeof l);
    for (int b = 0; b < g->k.nbuf; b++) {
        l.a.buf[b] = addr_of(p, g->bt[b]);
        if (!l.a.buf[b]) return kn_set_error(KN_ERR_STATE, "kn_plan_run: no storage for operand %d of fused kernel %s", b, g->k.name);
    }
    kn__kernel_launch_fill(p->be, &g->k, p->ctx->sym_val, &l);   /* tune.c: the kernel's tunables */
    if (l.a.n <= 0) return KN_OK;
    return p->be->kernel_run(p->be, kernel, &l);
}

/* Where node s keeps its by-product (kn__aux_bytes), or NULL: its own
 * block of the arena, or after its elements in its own buffer (memplan.c). */
static void *aux_of(const kn_plan *p, kn_tensor *s) {
    if (!s || s != kn__storage_owner(s) || !kn__aux_bytes(s)) return NULL;
    if (s->buf) {
        size_t end = kn__aux_offset(s) + kn__aux_bytes(s);
        return s->buf->size >= end ? (char *)s->buf->data + kn__aux_offset(s) : NULL;
    }
    int64_t o = s->id < p->n_ids ? p->off[p->n_ids + s->id] : -1;
    return o >= 0 && p->arena ? (char *)p->arena->data + o : NULL;
}

/* s is a leaf's storage that no node of the plan writes (kn_exec.fixed) */
static bool fixed_src(const kn_plan *p, kn_tensor *s) {
    kn_tensor *o = kn__storage_owner(s);
    return p->written && o->op == KN_OP_NONE && o->id < p->n_ids && !p->written[o->id];
}

bool kn__exec_of(const kn_plan *p, kn_tensor *t, kn_exec *e, kn_epilogue *epi, int *bad) {
    memset(e, 0, sizeof *e);
    const kn_epi_rec *r = kn__pepi(p, t);
    e->node = r ? r->mm : t;            /* a matmul with its epilogue writes t's storage */
    e->syms = p->ctx->sym_val;
    *bad = -1;
    if (!kn__tview_of(p, t, &e->dst)) return false;
    for (int k = 0; k < (r ? 2 : KN_MAX_SRC); k++) {
        kn_tensor *s = kn__pread(p, t, k);
        if (!s) continue;
        *bad = k;
        if (!kn__tview_of(p, s, &e->src[k])) return false;
        e->src_aux[k] = r ? NULL : aux_of(p, s);
        if (fixed_src(p, s)) e->fixed |= 1u << k;
        e->nsrc = k + 1;
    }
    if (!r) {
        e->aux = aux_of(p, t);
        return true;
    }
    *epi = r->d;
    if (r->bias) {
        /* [1, .., 1, N] as the vector [N] */
        kn_tview v;
        *bad = 2;
        if (!kn__tview_of(p, r->bias, &v)) return false;
        epi->vbias = v;
        epi->vbias.ndim = 1;
        epi->vbias.ne[0] = v.ne[v.ndim - 1];
        epi->vbias.st[0] = v.st[v.ndim - 1];
    }
    *bad = 3;
    if (r->res && !kn__tview_of(p, r->res, &epi->vres)) return false;
    *bad = 4;
    if (r->pre && !kn__tview_of(p, r->pre, &epi->vpre)) return false;
    e->epi = epi;
    return true;
}

static double prof_mark(kn_plan *p);

/* ---- batches: runs of independent nodes one backend call takes together ----
 * (kn_backend.batch_ok / compute_batch: the multi-tensor optimizer step).
 * The effects that nobody reads stand last in the schedule (schedule.c), so
 * a model's parameter updates follow one another there. */

/* The bytes [lo, hi) view v can touch (a block type's partial blocks counted whole). */
typedef struct { const char *lo, *hi; } span;
static span span_of(const kn_tview *v) {
    const kn_dtype_info *d = kn_dtype_get(v->dtype);
    int64_t a = 0, b = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->ne[i] <= 0) return (span){v->data, v->data};
        int64_t s = (v->ne[i] - 1) * v->st[i];
        if (s < 0) a += s; else b += s;
    }
    const char *base = v->data;
    return (span){base - (-a + d->block_size - 1) / d->block_size * d->type_size,
                  base + (b / d->block_size + 1) * d->type_size};
}
static bool spans_meet(span x, span y) { return x.lo < y.hi && y.lo < x.hi; }

/* Does x write memory that y reads or writes (or the other way round)? */
static bool execs_conflict(const kn_exec *x, const kn_exec *y) {
    for (int pass = 0; pass < 2; pass++) {
        const kn_exec *w = pass ? y : x, *r = pass ? x : y;
        unsigned wm = kn__effect_writes(w->node->op);
        for (int a = -1; a < w->nsrc; a++) {
            if (a >= 0 && !(wm >> a & 1)) continue;
            const kn_tview *wv = a < 0 ? &w->dst : &w->src[a];
            if (a >= 0 && !w->node->src[a]) continue;
            span ws = span_of(wv);
            if (spans_meet(ws, span_of(&r->dst))) return true;
            for (int b = 0; b < r->nsrc; b++)
                if (r->node->src[b] && spans_meet(ws, span_of(&r->src[b]))) return true;
        }
    }
    return false;
}

/* Node order[i], resolved as *first, starts a batch if the backend takes
 * it and at least one of the computing nodes right after it: returns how
 * many schedule entries the batch covers (views between its nodes compute
 * nothing), 0 for no batch; *st: the backend's status. */
static int run_batch(kn_plan *p, int i, const kn_exec *first, int prof, kn_status *st) {
    kn_backend *be = p->be;
    kn_tensor *t = p->order[i];
    if (be->version < 5 || !be->batch_ok || !be->compute_batch || kn_env_get()->batch_off ||
        kn_op_get(t->op)->kind != KN_KIND_EFFECT || !be->batch_ok(be, first))
        return 0;
    if (!p->batch && !(p->batch = malloc(sizeof *p->batch * KN_BATCH_MAX))) return 0;
    kn_exec *es = p->batch;
    kn_epilogue epi;
    int bad, n = 1, last = i;
    es[0] = *first;
    for (int j = i + 1; j < p->n && n < KN_BATCH_MAX; j++) {
        kn_tensor *u = p->order[j];
        if (kn__pgroup(p, u) || kn__pepi(p, u)) break;
        if (!kn__computes(u)) continue;
        if (u->op != t->op || !kn__exec_of(p, u, &es[n], &epi, &bad) || !be->batch_ok(be, &es[n])) break;
        bool clash = false;
        for (int m = 0; m < n && !clash; m++) clash = execs_conflict(&es[m], &es[n]);
        if (clash) break;
        n++;
        last = j;
    }
    if (n < 2) return 0;
    double t0 = prof ? prof_mark(p) : 0;
    *st = be->compute_batch(be, es, n);
    if (*st == KN_ERR_UNSUPPORTED) { *st = KN_OK; return 0; }
    p->nbatched += n;
    if (prof) {
        char name[64];
        snprintf(name, sizeof name, "%s x%d (batched)", kn_op_name(t->op), n);
        kn__profile_kernel(name, prof_mark(p) - t0);
    }
    return last - i + 1;
}

/* KN_PROFILE's clock: on an asynchronous (device) backend it first waits
 * for the work queued so far, so each timed call is charged its own kernels
 * (launch latency included), not its predecessors'. Profiling turns CUDA
 * graphs off (replay.c), so this never runs inside a capture. */
static double prof_mark(kn_plan *p) {
    if (p->be->synchronize) p->be->synchronize(p->be);
    return kn__profile_now();
}

kn_status kn__plan_run_steps(kn_plan *p) {
    int prof = kn__profile_mode();
    bool chk = kn__check_mode(p->be);
    if (p->be->version >= 2 && p->be->syms_upload) {
        kn_status st = p->be->syms_upload(p->be, p->ctx->sym_val, KN_MAX_SYMS);
        if (st != KN_OK) return st;
    }
    p->nbatched = 0;
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_plan_run: the plan's tensors were freed (context reset); build a new plan");
        kn_fgroup *g = kn__pgroup(p, t);
        if (g) {
            if (i != g->last) continue;
            double t0 = prof ? prof_mark(p) : 0;
            kn_status st = run_group(p, g, p->kernel[p->gid[t->id]]);
            if (prof) kn__profile_kernel(g->k.name, prof_mark(p) - t0);
            if (st != KN_OK) return st;
            continue;
        }
        if (!kn__computes(t)) continue;
        kn_exec e;
        kn_epilogue epi;
        int bad;
        if (!kn__exec_of(p, t, &e, &epi, &bad)) {
            if (bad < 0) return kn_set_error(KN_ERR_STATE, "kn_plan_run: no storage for %s node", kn_op_name(t->op));
            return kn_set_error(KN_ERR_STATE, "kn_plan_run: input %d of %s has no data (an input tensor without storage?)", bad, kn_op_name(e.node->op));
        }
        if (!chk) {
            kn_status st = KN_OK;
            int nb = run_batch(p, i, &e, prof, &st);
            if (st != KN_OK) return st;
            if (nb > 0) { i += nb - 1; continue; }
        }
        double t0 = prof ? prof_mark(p) : 0;
        kn_check *ck = chk ? kn__check_before(p->be, &e) : NULL;
        kn_status st = p->be->compute(p->be, &e);
        if (st == KN_OK) kn__check_after(p->be, &e, ck, i);
        else kn__check_free(ck);
        if (prof) kn__profile_node(prof, &e, prof_mark(p) - t0);
        if (st != KN_OK) return st;
    }
    return KN_OK;
}

int kn__plan_batched(const kn_plan *p) { return p ? p->nbatched : 0; }

kn_status kn_plan_run(kn_plan *p) {
    if (!p) return kn_set_error(KN_ERR_INVALID, "kn_plan_run: NULL plan (did kn_plan_new fail? %s)", kn_last_error());
    return kn__plan_replay(p);          /* kn__plan_run_steps and a wait, or a graph (replay.c) */
}
