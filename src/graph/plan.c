/* plan.c: compiling a graph into a plan and running it.
 *
 * Compile: order the nodes (graph.c), give every output persistent storage,
 * and place every other computed node in one arena by liveness: a block is
 * free again after the last node that reads it (directly or through a view).
 * Elementwise nodes take over the block of an input that dies at them
 * (in-place). Views and leaves need no memory of their own.
 * Run: resolve each node's operands to kn_tview (address, run-time extents
 * from the context's symbols, strides) and call the backend's compute.
 */
#include "graph/graph.h"
#include "core/env.h"
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

struct kn_plan {
    kn_ctx *ctx;
    kn_backend *be;
    kn_tensor **order;     /* schedule, views included */
    int n;
    int32_t n_ids;         /* ctx->n_all at compile time */
    int64_t *off;          /* by tensor id: arena byte offset of a storage owner, -1 if none */
    kn_buffer *arena;
    size_t peak, naive;
    int nkern;
};

#define ALIGN 64
static size_t align_up(size_t x) { return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1); }
static size_t storage_bytes(const kn_tensor *t) {
    int64_t n = kn__storage_elems(t);
    const kn_dtype_info *d = kn_dtype_get(t->dtype);
    /* quantized tensors: whole blocks */
    if (d->is_quant) n = (n + d->block_size - 1) / d->block_size * d->block_size;
    size_t b = kn_dtype_nbytes(t->dtype, n);
    return b ? b : 1;
}

/* ---- a first-fit allocator over offsets (compile time only) ---- */
typedef struct { size_t off, size; } blk;
typedef struct { blk *free; int nfree, cap; size_t top; } offalloc;

static size_t oa_alloc(offalloc *a, size_t size) {
    int best = -1;
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best >= 0) {
        size_t off = a->free[best].off;
        a->free[best].off += size; a->free[best].size -= size;
        if (!a->free[best].size) a->free[best] = a->free[--a->nfree];
        return off;
    }
    /* grow; merge with a free block ending at top */
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].off + a->free[i].size == a->top) {
            size_t off = a->free[i].off;
            a->top = off + size;
            a->free[i] = a->free[--a->nfree];
            return off;
        }
    size_t off = a->top;
    a->top += size;
    return off;
}
/* false when the free list cannot grow (out of host memory); the list is then
 * unchanged, so the caller only has to release it. */
static bool oa_free(offalloc *a, size_t off, size_t size) {
    /* coalesce with neighbours */
    for (int i = 0; i < a->nfree; i++) {
        if (a->free[i].off + a->free[i].size == off) { off = a->free[i].off; size += a->free[i].size; a->free[i--] = a->free[--a->nfree]; continue; }
        if (off + size == a->free[i].off) { size += a->free[i].size; a->free[i--] = a->free[--a->nfree]; continue; }
    }
    if (a->nfree == a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        blk *grown = realloc(a->free, sizeof *a->free * (size_t)cap);
        if (!grown) return false;     /* a->free still valid: freed by the caller */
        a->free = grown; a->cap = cap;
    }
    a->free[a->nfree++] = (blk){off, size};
    return true;
}

static bool computes(const kn_tensor *t) { return !kn__is_view_op(t->op); }
static bool owns_storage(const kn_tensor *t) { return !(t->flags & KN_FLAG_VIEW) && t->view_src == NULL; }

/* Out of host memory while compiling: records why and frees the partial plan.
 * Returns NULL for plan_new to return. */
static kn_plan *plan_nomem(kn_ctx *ctx, kn_plan *p, const char *what) {
    kn__fail(ctx, KN_ERR_NOMEM, "kn_plan_new: out of host memory for %s of a %d-node graph; "
             "free unused contexts or build a smaller graph", what, p ? p->n : 0);
    kn_plan_free(p);
    return NULL;
}

/* Moves effects nobody reads to the end of p->order (an optimizer update of a
 * parameter must follow every read of it); keeps the relative order otherwise. */
static bool order_effects_last(kn_plan *p) {
    uint8_t *used = calloc((size_t)(p->n_ids ? p->n_ids : 1), 1);
    kn_tensor **o2 = malloc(sizeof *o2 * (size_t)(p->n ? p->n : 1));
    if (!used || !o2) { free(used); free(o2); return false; }
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < KN_MAX_SRC; k++) if (p->order[i]->src[k]) used[p->order[i]->src[k]->id] = 1;
    int m = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < p->n; i++) {
            kn_tensor *t = p->order[i];
            bool late = kn_op_get(t->op)->kind == KN_KIND_EFFECT && !used[t->id];
            if (late == (pass == 1)) o2[m++] = t;
        }
    free(p->order); p->order = o2;
    free(used);
    return true;
}

/* stop_at_realized: eager kn_realize reuses values computed earlier; a plan
 * (kn_plan_new) recomputes every op node on each run, so only leaves
 * (data, inputs, parameters) are read as they are. */
static kn_plan *plan_new(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized) {
    if (!ctx) return NULL;
    kn_plan *p = calloc(1, sizeof *p);
    if (!p) return plan_nomem(ctx, NULL, "the plan header");
    p->ctx = ctx;
    p->be = (opts && opts->backend) ? opts->backend : ctx->be;
    for (int i = 0; i < nout; i++)
        if (!outs[i]) { free(p); kn__fail(ctx, KN_ERR_INVALID, "kn_plan_new: output %d is NULL (an earlier op failed: %s)", i, kn_last_error()); return NULL; }
    kn_status st = kn__toposort(ctx, nout, outs, stop_at_realized, &p->order, &p->n);
    if (st != KN_OK) { free(p); ctx->status = st; return NULL; }   /* the message is set */
    p->n_ids = ctx->n_all;
    if (!order_effects_last(p)) return plan_nomem(ctx, p, "the schedule");

    size_t nid = (size_t)(p->n_ids ? p->n_ids : 1);
    p->off = malloc(sizeof *p->off * nid);
    int32_t *last = malloc(sizeof *last * nid);
    uint8_t *persist = calloc(nid, 1);
    if (!p->off || !last || !persist) { free(last); free(persist); return plan_nomem(ctx, p, "the memory plan"); }
    for (int32_t i = 0; i < p->n_ids; i++) { p->off[i] = -1; last[i] = -1; }
    /* outputs (or the storage they view) are persistent */
    for (int o = 0; o < nout; o++) persist[kn__storage_owner(outs[o])->id] = 1;
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        for (int k = 0; k < KN_MAX_SRC; k++)
            if (t->src[k]) last[kn__storage_owner(t->src[k])->id] = i;
        if (t->flags & KN_FLAG_VIEW) last[kn__storage_owner(t)->id] = i;
    }
    offalloc oa = {0};
    bool reuse = !(opts && opts->no_reuse), inplace = reuse && !(opts && opts->no_inplace);
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        if (computes(t)) p->nkern++;
        if (!owns_storage(t) || t->buf) continue;
        size_t bytes = align_up(storage_bytes(t));
        if (persist[t->id]) {
            t->buf = kn_buffer_new(p->be, bytes);    /* sets the message on failure */
            if (!t->buf) { free(last); free(persist); free(oa.free); kn_plan_free(p); ctx->status = KN_ERR_NOMEM; return NULL; }
            continue;
        }
        p->naive += bytes;
        int64_t off = -1;
        if (inplace && kn_op_get(t->op)->inplace_ok) {
            for (int k = 0; k < 2 && off < 0; k++) {
                kn_tensor *s = t->src[k];
                if (s && owns_storage(s) && p->off[s->id] >= 0 && last[s->id] == i &&
                    align_up(storage_bytes(s)) == bytes && kn_dtype_get(s->dtype)->type_size == kn_dtype_get(t->dtype)->type_size &&
                    kn_is_contiguous(s) && kn_is_contiguous(t) && kn_same_shape(s, t)) {
                    off = p->off[s->id];
                    last[s->id] = -2;   /* handed over: not freed below */
                }
            }
        }
        if (off < 0) off = (int64_t)oa_alloc(&oa, bytes);
        p->off[t->id] = off;
        if (!reuse) continue;
        /* free blocks whose last reader is this node */
        bool ok = true;
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = t->src[k] ? kn__storage_owner(t->src[k]) : NULL;
            if (s && p->off[s->id] >= 0 && last[s->id] == i && !persist[s->id]) {
                ok = ok && oa_free(&oa, (size_t)p->off[s->id], align_up(storage_bytes(s)));
                last[s->id] = -2;
            }
        }
        /* a node nobody reads (dead end) frees right away */
        if (ok && last[t->id] < 0 && last[t->id] != -2) ok = oa_free(&oa, (size_t)off, bytes);
        if (!ok) { free(last); free(persist); free(oa.free); return plan_nomem(ctx, p, "the arena's free list"); }
    }
    /* views and effects whose storage dies at them also free */
    free(oa.free);
    free(last); free(persist);
    p->peak = oa.top;
    if (p->peak) {
        p->arena = kn_buffer_new(p->be, p->peak);    /* sets the message on failure */
        if (!p->arena) { kn_plan_free(p); ctx->status = KN_ERR_NOMEM; return NULL; }
    }
    if (kn_env_get()->debug) kn_plan_print(p, stderr);
    return p;
}

kn_plan *kn_plan_new(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts) {
    return plan_new(ctx, nout, outs, opts, false);
}

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

static bool tview_of(const kn_plan *p, kn_tensor *t, kn_tview *v) {
    v->data = addr_of(p, t);
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) { v->ne[i] = kn__extent(t, i, p->ctx->sym_val); v->st[i] = t->stride[i]; }
    return v->data != NULL;
}

/* KN_PROFILE=1: time per op, printed at exit (a development aid).
 * KN_PROFILE=shapes also times each distinct (op, operand extents/strides)
 * and prints the 30 costliest, with GFLOP/s for matmuls. */
static double g_prof_s[KN_OP_COUNT];
static long g_prof_n[KN_OP_COUNT];
static int g_prof = -1;
enum { PROF_KEYS = 512 };
static struct { char key[200]; double s, flop; long n; } g_pk[PROF_KEYS];
static int g_npk;
static void prof_view(const kn_tview *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->ne[i]);
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "]/");
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->st[i]);
}
static void prof_shape(const kn_exec *e, double sec) {
    char key[200], d[64], a[64] = "", b[64] = "";
    prof_view(&e->dst, d, sizeof d);
    if (e->nsrc > 0 && e->node->src[0]) prof_view(&e->src[0], a, sizeof a);
    if (e->nsrc > 1 && e->node->src[1]) prof_view(&e->src[1], b, sizeof b);
    snprintf(key, sizeof key, "%s %s <- %s %s", kn_op_name(e->node->op), d, a, b);
    int i = 0;
    while (i < g_npk && strcmp(g_pk[i].key, key)) i++;
    if (i == g_npk) { if (g_npk == PROF_KEYS) return; snprintf(g_pk[g_npk++].key, sizeof g_pk[0].key, "%s", key); }
    g_pk[i].s += sec;
    g_pk[i].n++;
    if (e->node->op == KN_OP_MATMUL && e->src[0].ndim >= 1)
        g_pk[i].flop += 2.0 * (double)kn_tview_numel(&e->dst) * (double)e->src[0].ne[e->src[0].ndim - 1];
}
static void prof_dump_shapes(void) {
    for (int k = 0; k < 30 && k < g_npk; k++) {
        int best = k;
        for (int i = k + 1; i < g_npk; i++) if (g_pk[i].s > g_pk[best].s) best = i;
        if (best != k) { __typeof__(g_pk[0]) t = g_pk[k]; g_pk[k] = g_pk[best]; g_pk[best] = t; }
        fprintf(stderr, "  %7ld x %8.3f ms  %6.1f GFLOP/s  %s\n", g_pk[k].n, 1e3 * g_pk[k].s / (double)g_pk[k].n,
                g_pk[k].flop > 0 ? g_pk[k].flop / g_pk[k].s * 1e-9 : 0.0, g_pk[k].key);
    }
}
static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void prof_dump(void) {
    double tot = 0;
    for (int i = 0; i < KN_OP_COUNT; i++) tot += g_prof_s[i];
    fprintf(stderr, "kiln profile (%.3f s in kernels):\n", tot);
    for (int k = 0; k < KN_OP_COUNT; k++) {
        int best = -1;
        for (int i = 0; i < KN_OP_COUNT; i++)
            if (g_prof_n[i] && (best < 0 || g_prof_s[i] > g_prof_s[best])) best = i;
        if (best < 0) break;
        fprintf(stderr, "  %-20s %8ld calls %9.3f s %5.1f%%\n", kn_op_name((kn_op)best), g_prof_n[best], g_prof_s[best],
                100 * g_prof_s[best] / (tot > 0 ? tot : 1));
        g_prof_n[best] = 0;
    }
    if (g_npk) prof_dump_shapes();
}

kn_status kn_plan_run(kn_plan *p) {
    if (g_prof < 0) {
        g_prof = kn_env_get()->profile;
        if (g_prof) atexit(prof_dump);
    }
    if (!p) return kn_set_error(KN_ERR_INVALID, "kn_plan_run: NULL plan (did kn_plan_new fail? %s)", kn_last_error());
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_plan_run: the plan's tensors were freed (context reset); build a new plan");
        if (!computes(t)) continue;
        kn_exec e;
        memset(&e, 0, sizeof e);
        e.node = t;
        e.syms = p->ctx->sym_val;
        if (!tview_of(p, t, &e.dst))
            return kn_set_error(KN_ERR_STATE, "kn_plan_run: no storage for %s node", kn_op_name(t->op));
        for (int k = 0; k < KN_MAX_SRC; k++) {
            if (!t->src[k]) continue;
            if (!tview_of(p, t->src[k], &e.src[k]))
                return kn_set_error(KN_ERR_STATE, "kn_plan_run: input %d of %s has no data (an input tensor without storage?)", k, kn_op_name(t->op));
            e.nsrc = k + 1;
        }
        double t0 = g_prof ? prof_now() : 0;
        kn_status st = p->be->compute(p->be, &e);
        if (g_prof) {
            double dt = prof_now() - t0;
            g_prof_s[t->op] += dt;
            g_prof_n[t->op]++;
            if (g_prof == 2) prof_shape(&e, dt);
        }
        if (st != KN_OK) return st;
    }
    if (p->be->synchronize) return p->be->synchronize(p->be);
    return KN_OK;
}

void kn_plan_free(kn_plan *p) {
    if (!p) return;
    kn_buffer_release(p->arena);
    free(p->order);
    free(p->off);
    free(p);
}

size_t kn_plan_peak_bytes(const kn_plan *p) { return p ? p->peak : 0; }
size_t kn_plan_naive_bytes(const kn_plan *p) { return p ? p->naive : 0; }
int kn_plan_n_kernels(const kn_plan *p) { return p ? p->nkern : 0; }

void kn_plan_print(const kn_plan *p, void *fp) {
    FILE *f = fp ? fp : stderr;
    fprintf(f, "plan: %d nodes, %d kernels, backend %s, arena %zu bytes (no reuse: %zu)\n",
            p->n, p->nkern, p->be->name, p->peak, p->naive);
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        char s[160];
        fprintf(f, "  %3d %-14s %-5s %-22s", i, kn_op_name(t->op), kn_dtype_name(t->dtype), kn__shape_str(t, s, sizeof s));
        if (!computes(t)) fprintf(f, " view of #%d", kn__storage_owner(t)->id);
        else if (t->buf) fprintf(f, " -> persistent");
        else if (t->id < p->n_ids && p->off[t->id] >= 0) fprintf(f, " -> arena+%lld", (long long)p->off[t->id]);
        else if (t->view_src) fprintf(f, " -> writes #%d", t->view_src->id);
        fprintf(f, "  <-");
        for (int k = 0; k < KN_MAX_SRC; k++) if (t->src[k]) fprintf(f, " #%d", t->src[k]->id);
        fprintf(f, "  (#%d%s%s)\n", t->id, t->name[0] ? " " : "", t->name);
    }
}

/* ---- eager access: realize, read, write ---------------------------------------- */
kn_status kn_realize(kn_tensor *t) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_realize: NULL tensor (an earlier op failed: %s)", kn_last_error());
    if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_realize: tensor was freed (its context was reset or freed)");
    kn_tensor *own = kn__storage_owner(t);
    bool effect = kn_op_get(t->op)->kind == KN_KIND_EFFECT;
    if (t->op == KN_OP_NONE || (!effect && t->buf && (own->op == KN_OP_NONE || own->buf)) ||
        (effect && (t->flags & KN__FLAG_COMPUTED))) {
        if (!t->buf && own->buf) { t->buf = own->buf; kn_buffer_retain(t->buf); }
        return KN_OK;
    }
    kn_plan *p = plan_new(t->ctx, 1, &t, NULL, true);
    if (!p) return t->ctx->status ? t->ctx->status : KN_ERR_STATE;
    kn_status st = kn_plan_run(p);
    if (st == KN_OK)
        for (int i = 0; i < p->n; i++)
            if (kn_op_get(p->order[i]->op)->kind == KN_KIND_EFFECT) p->order[i]->flags |= KN__FLAG_COMPUTED;
    kn_plan_free(p);
    if (!t->buf && own->buf) { t->buf = own->buf; kn_buffer_retain(t->buf); }
    return st;
}

/* Strided element-by-element copy between a tensor's storage and host memory. */
static kn_status host_transfer(kn_tensor *t, void *host, kn_dtype as, bool to_host) {
    kn_tensor *own = kn__storage_owner(t);
    if (!own->buf) return kn_set_error(KN_ERR_STATE, "tensor has no storage");
    const kn_dtype_info *di = kn_dtype_get(t->dtype), *da = kn_dtype_get(as);
    if (!da) return kn_set_error(KN_ERR_INVALID, "unknown dtype %d", (int)as);
    int64_t n = kn_numel(t);
    char *base = own->buf->data;
    void *tmp = NULL;
    if (own->buf->be->device != KN_DEVICE_HOST) {       /* stage through host memory */
        tmp = malloc(own->buf->size ? own->buf->size : 1);
        if (!tmp) return kn_set_error(KN_ERR_NOMEM, "out of host memory staging %zu bytes", own->buf->size);
        own->buf->be->copy_out(own->buf->be, tmp, own->buf->data, own->buf->size);
        base = tmp;
    }
    if (di->is_quant || da->is_quant) {
        free(tmp);
        if (as == t->dtype && kn_is_contiguous(t) && to_host) {
            /* raw block copy */
            memcpy(host, base + kn_dtype_nbytes(t->dtype, t->offset), kn_dtype_nbytes(t->dtype, n));
            return KN_OK;
        }
        return kn_set_error(KN_ERR_UNSUPPORTED, "reading %s as %s: cast the tensor to a float type first", di->name, da->name);
    }
    if (as == t->dtype && kn_is_contiguous(t)) {
        char *p = base + (size_t)t->offset * di->type_size;
        if (to_host) memcpy(host, p, (size_t)n * di->type_size); else memcpy(p, host, (size_t)n * di->type_size);
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t lin = i, off = t->offset;
            for (int d = t->ndim - 1; d >= 0; d--) { off += (lin % t->shape[d]) * t->stride[d]; lin /= t->shape[d]; }
            if (to_host) kn_store(as, host, i, kn_load(t->dtype, base, off));
            else kn_store(t->dtype, base, off, kn_load(as, host, i));
        }
    }
    if (tmp) {
        if (!to_host) own->buf->be->copy_in(own->buf->be, own->buf->data, tmp, own->buf->size);
        free(tmp);
    }
    return KN_OK;
}

kn_status kn_tensor_read(kn_tensor *t, void *dst, kn_dtype as) {
    kn_status st = kn_realize(t);
    if (st) return st;
    return host_transfer(t, dst, as, true);
}

kn_status kn_tensor_write(kn_tensor *t, const void *src, kn_dtype as) {
    if (!kn__alive(t)) return kn_set_error(KN_ERR_STATE, "kn_tensor_write: tensor is NULL or freed");
    kn_tensor *own = kn__storage_owner(t);
    if (own->op != KN_OP_NONE || !own->buf)
        return kn_set_error(KN_ERR_INVALID, "kn_tensor_write: only inputs, parameters and data tensors (or views of them) can be written; this is a %s node", kn_op_name(own->op));
    return host_transfer(t, (void *)src, as, false);
}

double kn_item(kn_tensor *t) {
    double v;
    if (!t || kn_numel(t) < 1) { kn_set_error(KN_ERR_INVALID, "kn_item: empty or NULL tensor"); return NAN; }
    if (kn_realize(t)) return NAN;
    kn_tensor *own = kn__storage_owner(t);
    if (own->buf->be->device != KN_DEVICE_HOST) {
        double *all = malloc(sizeof(double) * (size_t)kn_numel(t));
        if (!all || kn_tensor_read(t, all, KN_F64)) { free(all); return NAN; }
        v = all[0]; free(all); return v;
    }
    return kn_load(t->dtype, own->buf->data, t->offset);
}

void kn_tensor_print(kn_tensor *t, const char *label) {
    char s[160];
    if (!t) { fprintf(stderr, "%s: NULL (%s)\n", label ? label : "tensor", kn_last_error()); return; }
    int64_t n = kn_numel(t);
    fprintf(stderr, "%s: %s %s", label ? label : "tensor", kn_dtype_name(t->dtype), kn__shape_str(t, s, sizeof s));
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (v && !kn_dtype_get(t->dtype)->is_quant && kn_tensor_read(t, v, KN_F64) == KN_OK) {
        fprintf(stderr, " =");
        for (int64_t i = 0; i < n && i < 16; i++) fprintf(stderr, " %.6g", v[i]);
        if (n > 16) fprintf(stderr, " ...");
    }
    fprintf(stderr, "\n");
    free(v);
}
