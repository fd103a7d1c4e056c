/* fuse.c: elementwise fusion, the compiler's second pass (docs/COMPILER.md).
 *
 * Input: a plan's schedule after the graph rewrites (dependency order, sources
 * read through rep). Output: groups of nodes that run as one generated kernel
 * (kernel.h), each lowered to a kn_kernel. Nothing in the graph changes; the
 * runtime runs a group at the place of its last node and keeps only the
 * values something outside the group reads.
 *
 * The fusion predicate. A node t joins the groups its sources belong to (all
 * of them, merged) when:
 *   1. t is fusable: a unary or binary op of the op table with a float result,
 *      a cast between float dtypes or a copy, over f32 / f16 / bf16 operands;
 *   2. t and every node of the merged group have the same shape (symbols
 *      included): one item of the kernel is one element of each, so a value
 *      is computed once and read at the same index (no recomputation under
 *      broadcast, no reads across items);
 *   3. no member reads another member through a view (it would read another
 *      item, which another thread may not have written yet);
 *   4. no cycle and no read moved across a write: every reader outside the
 *      group of a member runs after t (views count at their first reader),
 *      and no effect (assign, index_copy, adam_update) lies between the
 *      group's first node and t;
 *   5. the budget: at most KN_KMAX_NODES nodes, KN_KMAX_INST instructions,
 *      KN_KERNEL_MAXBUF buffers.
 * Otherwise t starts a group of its own. Groups of one node are dropped (the
 * hand kernel runs). Fill nodes read by a group become constants of its
 * kernel, and members of it when nothing else reads them.
 */
#include "compile/kernel.h"
#include "core/env.h"                    // defines: kn_env_get (KN_FUSE_MAX)
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static bool float_dt(kn_dtype d) { return d == KN_F32 || d == KN_F16 || d == KN_BF16 || d == KN_F64; }

typedef struct {
    const char *lang;    /* the renderer the kernels are for: some templates exist in one language only */
    kn_tensor *const *order;
    int n;
    int32_t n_ids;
    kn_tensor *const *rep;
    int32_t *pos;        /* by id: schedule index, -1 when not scheduled */
    int32_t *rhead;      /* by id: readers list (CSR over rnext) */
    int32_t *rnode, *rnext;
    int nread;
    int32_t *first_read; /* by id: where the value is first read (views: at their readers) */
    int32_t *view_read;  /* by storage owner id: where any scheduled view of it is first read */
    int32_t *gid;        /* by id: group, -1 */
    uint8_t *out;        /* by id: an output of the plan */
    int *neff;           /* effects before schedule index i */
    const kn_fuse_opaque *opq;  /* nodes never fused that read other values than their sources, NULL */
    kn_fgroup *g;
    int ng, cap;
} fz;

static kn_tensor *src_of(const fz *f, const kn_tensor *t, int k) { return kn__rw_src(f->rep, f->n_ids, t, k); }
/* a node that runs a matmul with its epilogue or prologue: never fused */
static bool opaque(const fz *f, const kn_tensor *t) { return f->opq && f->opq->is(f->opq->ctx, t); }
/* the k-th value t reads (NULL where none): a source, or an opaque node's read */
static kn_tensor *read_of(const fz *f, const kn_tensor *t, int k) {
    if (opaque(f, t)) return f->opq->read(f->opq->ctx, t, k);
    return t->src[k] ? src_of(f, t, k) : NULL;
}

static bool int_dt(kn_dtype d) { return d == KN_I32 || d == KN_I64; }
/* the ops that read or write other items than their own: rope (the pair
 * partner), index_select (a gather), index_copy (a scatter) */
static bool is_index_op(kn_op op) { return op == KN_OP_ROPE || op == KN_OP_INDEX_COPY || op == KN_OP_INDEX_SELECT; }
static bool is_cuda(const fz *f) { return f->lang && !strcmp(f->lang, "cuda"); }

/* Most indices a fused index_copy scans per item (each item checks every
 * index and looks for a later equal one, so the kernel keeps the hand
 * kernel's all-or-nothing check and last-wins order without a second pass).
 * The scan makes a T-row write cost T^2 * row loads: a decode step's T = 1
 * (or a few sequences) gains a launch, a prompt's T <= 512 lost 0.4 ms a
 * layer on an H100 (Llama-3-8B's K and V, 20x the hand kernel). A symbolic
 * extent counts at its largest value. */
#define KN_FUSE_MAX_INDEX 64

/* rope, index_copy and index_select (a gather) join groups on CUDA only: a fused rope computes its
 * angle per element (the hand kernels once per pair and position), cheap on
 * a GPU and not on two CPU cores, and a fused index_copy scans every index
 * per item, which a prefill of 512 rows on a CPU would feel. On the GPU they
 * are what a decode step's rope and KV-cache writes become: one kernel. */
static bool fusable_index(const fz *f, const kn_tensor *t) {
    if (!is_cuda(f)) return false;
    if (t->op == KN_OP_ROPE) {
        kn_tensor *x = src_of(f, t, 0), *pos = src_of(f, t, 1), *ff = t->src[2] ? src_of(f, t, 2) : NULL;
        return x && pos && float_dt(t->dtype) && float_dt(x->dtype) && int_dt(pos->dtype) && pos->ndim == 1 &&
               (!ff || (float_dt(ff->dtype) && ff->ndim == 1)) && kn_is_contiguous(t) && t->ndim >= 2;
    }
    if (t->op == KN_OP_INDEX_SELECT) {   /* a gather: embedding rows, position rows */
        kn_tensor *x = src_of(f, t, 0), *iv = src_of(f, t, 1);
        return x && iv && float_dt(t->dtype) && x->dtype == t->dtype && int_dt(iv->dtype) && iv->ndim == 1 &&
               kn_is_contiguous(t) && x->ndim == t->ndim && !x->sym[t->p.axis.dim];
    }
    if (t->op == KN_OP_INDEX_COPY) {
        kn_tensor *dst = src_of(f, t, 0), *iv = src_of(f, t, 1), *rows = src_of(f, t, 2);
        int d = t->p.axis.dim;
        if (!dst || !iv || !rows || !float_dt(t->dtype) || !float_dt(rows->dtype) || !int_dt(iv->dtype) || iv->ndim != 1)
            return false;
        if (rows->ndim != t->ndim || d < 0 || d >= t->ndim || iv->shape[0] > KN_FUSE_MAX_INDEX) return false;
        if (rows->shape[d] != iv->shape[0] || rows->sym[d] != iv->sym[0] || t->sym[d]) return false;
        for (int k = 0; k < t->ndim; k++)
            if (k != d && (rows->shape[k] != t->shape[k] || rows->sym[k] != t->sym[k])) return false;
        return true;
    }
    return false;
}

/* The item space a member spans: its own shape, or for an index_copy (a
 * view of the whole destination) the rows it writes. */
static const kn_tensor *node_space(const fz *f, const kn_tensor *t) {
    return t->op == KN_OP_INDEX_COPY ? src_of(f, t, 2) : t;
}

static bool fusable(const fz *f, const kn_tensor *t) {
    const kn_op_info *oi = kn_op_get(t->op);
    if (is_index_op(t->op)) return fusable_index(f, t);
    if (!float_dt(t->dtype) || (t->flags & KN_FLAG_VIEW) || !kn_is_contiguous(t)) return false;
    if (oi->kind == KN_KIND_UNARY || oi->kind == KN_KIND_BINARY) {
        if (!oi->expr) return false;
    } else if (t->op != KN_OP_CAST && t->op != KN_OP_COPY) {
        return false;
    }
    int na = oi->kind == KN_KIND_BINARY ? 2 : 1;
    for (int k = 0; k < na; k++) {
        kn_tensor *s = src_of(f, t, k);
        if (!s || !float_dt(s->dtype) || s->ndim > t->ndim) return false;
    }
    for (int k = na; k < KN_MAX_SRC; k++) if (t->src[k]) return false;
    return true;
}

/* A reduction a group may end in: sum, mean, max or min of a float tensor
 * over a set of axes that includes its last dim (so a C kernel walks rows
 * contiguously and a CUDA block reads a row coalesced). */
static bool fusable_reduce(const fz *f, const kn_tensor *t) {
    if (t->op != KN_OP_SUM && t->op != KN_OP_MEAN && t->op != KN_OP_MAX && t->op != KN_OP_MIN) return false;
    kn_tensor *x = src_of(f, t, 0);
    if (!x || x->ndim == 0 || !float_dt(t->dtype) || x->dtype != t->dtype || !kn_is_contiguous(t)) return false;
    if ((t->p.reduce.axes >> (x->ndim - 1)) & 1) return true;
    /* the last dim kept (column sums: bias and norm-weight gradients): C
     * walks tiles of columns, one vector step per row; CUDA gives a block a
     * tile of 32 columns and a slice of the rows (render.c) */
    return f->lang && (t->p.reduce.axes & ((1u << x->ndim) - 1)) != 0;
}

/* A row normalisation a group may end in: rms_norm and layer_norm over their
 * trailing dims, softmax and log_softmax over the last dim, of floats. */
static bool fusable_rownorm(const fz *f, const kn_tensor *t) {
    if (!kn__is_rownorm(t->op)) return false;
    kn_tensor *x = src_of(f, t, 0);
    if (!x || x->ndim == 0 || !float_dt(t->dtype) || !float_dt(x->dtype) || !kn_is_contiguous(t)) return false;
    if (t->op == KN_OP_SOFTMAX || t->op == KN_OP_LOG_SOFTMAX) {
        int d = t->p.axis.dim < 0 ? t->p.axis.dim + x->ndim : t->p.axis.dim;
        if (d != x->ndim - 1) return false;
        /* C: the generated softmax (three passes, exp in every element) measured
         * slower than the add and the CPU backend's hand softmax (bench_fuse:
         * 5.6 against 3.8 ms on 6944 x 576 with 2 threads): not fused there */
        if (f->lang && !strcmp(f->lang, "c")) return false;
    }
    for (int k = 1; k < KN_MAX_SRC; k++) {
        kn_tensor *s = t->src[k] ? src_of(f, t, k) : NULL;
        if (s && (!float_dt(s->dtype) || s->ndim > x->ndim)) return false;
    }
    return true;
}

static bool same_space(const kn_tensor *a, const kn_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i] || a->sym[i] != b->sym[i]) return false;
    return true;
}

static bool is_fill(const kn_tensor *s) { return s->op == KN_OP_FILL && !(s->flags & KN_FLAG_VIEW) && float_dt(s->dtype); }

/* Where a reader r of a value reads it: its own place, or a view's first reader. */
static int32_t read_at(const fz *f, const kn_tensor *r) {
    return (r->flags & KN_FLAG_VIEW) ? f->first_read[r->id] : f->pos[r->id];
}

/* U[0..n) (and stored flags st alongside, NULL: none) in schedule order:
 * the members of merged groups interleave */
static void sort_by_pos(const fz *f, kn_tensor **U, uint8_t *st, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && f->pos[U[b]->id] < f->pos[U[b - 1]->id]; b--) {
            kn_tensor *x = U[b]; U[b] = U[b - 1]; U[b - 1] = x;
            if (st) { uint8_t y = st[b]; st[b] = st[b - 1]; st[b - 1] = y; }
        }
}

static bool in_set(kn_tensor *const *set, int n, const kn_tensor *t) {
    for (int i = 0; i < n; i++) if (set[i] == t) return true;
    return false;
}

/* Whether a node outside U scheduled in (lo, hi], views aside, reads
 * owner's storage (directly or through a view of it) */
static bool storage_read_between(const fz *f, kn_tensor *const *U, int nu, const kn_tensor *owner, int lo, int hi) {
    for (int j = lo + 1; j <= hi && j < f->n; j++) {
        kn_tensor *r = f->order[j];
        if (in_set(U, nu, r) || (r->flags & KN_FLAG_VIEW)) continue;   /* a view reads nothing; its reader does */
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = read_of(f, r, k);
            if (s && kn__storage_owner(s) == owner) return true;
        }
    }
    return false;
}

/* The predicate's point 4 for a node set U run at schedule index i (its
 * last node's, or for merged groups the later one's): no reader outside U
 * of a member runs before i (views at their first reader, a view the
 * rewrites folded away included: view_read), and no effect but the
 * members' own lies between U's first node and i. */
static bool order_ok(const fz *f, kn_tensor *const *U, int nu, int i) {
    int first = i, own_effects = 0;
    for (int m = 0; m < nu; m++) {
        kn_tensor *x = U[m];
        int p = f->pos[x->id];
        if (p < first) first = p;
        if (p < i && kn_op_get(x->op)->kind == KN_KIND_EFFECT) own_effects++;
        if (p == i) continue;
        if (f->view_read[x->id] <= i) return false;
        /* an index_copy writes its destination's storage, which readers
         * reach through views of the destination (a KV cache read by the
         * attention), not of the index_copy: run at i, the write would come
         * after them (CUDA segments once merged GPT-2's cache writes into
         * the kernel of the attention output's copy) */
        if (x->op == KN_OP_INDEX_COPY) {
            kn_tensor *dst = src_of(f, x, 0);
            if (dst && storage_read_between(f, U, nu, kn__storage_owner(dst), p, i)) return false;
        }
        for (int32_t e = f->rhead[x->id]; e >= 0; e = f->rnext[e]) {
            kn_tensor *r = f->order[f->rnode[e]];
            if (!in_set(U, nu, r) && read_at(f, r) <= i) return false;
        }
    }
    return f->neff[i] - f->neff[first] - own_effects == 0;
}

/* The predicate's conditions 2-4 for the node set U (t last, at schedule
 * index i); every node but a final reduction has the shape of space. */
static bool group_ok(const fz *f, kn_tensor *const *U, int nu, int i, const kn_tensor *space) {
    kn_tensor *t = U[nu - 1];
    for (int m = 0; m < nu; m++) {
        kn_tensor *x = U[m];
        if (!(x == t && space != t) && !same_space(node_space(f, x), space)) return false;
        /* rope reads its input's pair partner and a gather another row:
         * other items, so from memory only */
        if ((x->op == KN_OP_ROPE || x->op == KN_OP_INDEX_SELECT) && in_set(U, nu, src_of(f, x, 0))) return false;
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = x->src[k] ? src_of(f, x, k) : NULL;
            if (s && (s->flags & KN_FLAG_VIEW) && in_set(U, nu, kn__storage_owner(s))) return false;
            /* an index_copy's destination is written, not read, by the kernel */
            if (s && x->op != KN_OP_INDEX_COPY && in_set(U, nu, s) && s->op == KN_OP_INDEX_COPY) return false;
        }
    }
    return order_ok(f, U, nu, i);
}

/* An upper bound on the instructions U lowers to (op, a load per operand, a
 * rounding cast for a narrow dtype): the budget is checked before lowering. */
static int instr_estimate(kn_tensor *const *U, int nu) {
    int c = 0;
    for (int m = 0; m < nu; m++) c += 2 + (int)(U[m]->dtype != KN_F32) + (int)(kn_op_get(U[m]->op)->kind == KN_KIND_BINARY);
    return c;
}

static bool add_group(fz *f) {
    if (f->ng == f->cap) {
        int cap = f->cap ? f->cap * 2 : 16;
        kn_fgroup *g = realloc(f->g, sizeof *g * (size_t)cap);
        if (!g) return false;
        f->g = g; f->cap = cap;
    }
    memset(&f->g[f->ng], 0, sizeof f->g[0]);
    f->ng++;
    return true;
}

/* t (at schedule index i) and the groups gs merged into gs[0], if the
 * predicate admits the union. U: scratch of KN_KMAX_NODES + 1. */
static bool try_join(fz *f, kn_tensor *t, int i, const int *gs, int ngs, kn_tensor **U) {
    int nu = 0;
    for (int j = 0; j < ngs; j++) {
        kn_fgroup *g = &f->g[gs[j]];
        if (nu + g->nnode + 1 > KN_KMAX_NODES) return false;
        for (int m = 0; m < g->nnode; m++) U[nu++] = g->node[m];
    }
    sort_by_pos(f, U, NULL, nu);
    U[nu++] = t;
    if (instr_estimate(U, nu) > KN_KMAX_INST - 8 || !group_ok(f, U, nu, i, t)) return false;
    kn_fgroup *g0 = &f->g[gs[0]];
    for (int j = 1; j < ngs; j++) f->g[gs[j]].nnode = 0;   /* emptied, merged into g0 */
    memcpy(g0->node, U, sizeof *U * (size_t)nu);
    g0->nnode = nu;
    for (int m = 0; m < nu; m++) f->gid[U[m]->id] = gs[0];
    g0->last = i;
    return true;
}

/* t (a reduction or row normalisation at position i) ends the group of its
 * input when that group is open, has room and admits it */
static bool join_reduce(fz *f, kn_tensor *t, int i, kn_tensor **U) {
    kn_tensor *x = src_of(f, t, 0);
    if (x->id >= f->n_ids || f->gid[x->id] < 0 || f->g[f->gid[x->id]].closed) return false;
    kn_fgroup *g = &f->g[f->gid[x->id]];
    if (g->nnode + 1 > KN_KMAX_NODES) return false;
    bool indexed = false;   /* the reduction templates know no rope or scatter */
    for (int m = 0; m < g->nnode; m++) indexed |= is_index_op(g->node[m]->op);
    if (indexed) return false;
    int nu = 0;
    for (int m = 0; m < g->nnode; m++) U[nu++] = g->node[m];
    U[nu++] = t;
    if (instr_estimate(U, nu) > KN_KMAX_INST - 8 || !group_ok(f, U, nu, i, x)) return false;
    g->node[g->nnode++] = t;
    g->last = i;
    g->closed = true;
    f->gid[t->id] = (int)(g - f->g);
    return true;
}

/* A closed group of the one reduction t (position i); false: out of memory */
static bool lone_reduce(fz *f, kn_tensor *t, int i) {
    if (!add_group(f)) return false;
    kn_fgroup *g = &f->g[f->ng - 1];
    g->node[0] = t; g->nnode = 1; g->last = i; g->closed = true;
    f->gid[t->id] = f->ng - 1;
    return true;
}

/* Does a node of U[0..n), or one of their sources, hold f64 (the kernel then
 * computes in double)? */
static bool any_f64(const fz *f, kn_tensor *const *U, int n) {
    for (int m = 0; m < n; m++) {
        if (U[m]->dtype == KN_F64) return true;
        for (int a = 0; a < KN_MAX_SRC; a++) {
            kn_tensor *s = U[m]->src[a] ? src_of(f, U[m], a) : NULL;
            if (s && s->dtype == KN_F64) return true;
        }
    }
    return false;
}

/* The node of a closed group that reduces or normalises: its last, or the
 * one before a cast tail */
static kn_tensor *red_node(const kn_fgroup *g) { return g->node[g->nnode - 1 - (g->tail ? 1 : 0)]; }

/* t, a cast of a row normalisation s that nothing else reads, ends s's
 * group, or makes one with a lone s on CUDA: the kernel stores the
 * normalised rows in t's dtype. A separate cast read and wrote [T, C] again:
 * 10 us for each of a layer's two norms of an 8B-shaped prompt, whose GEMMs
 * take bf16. The same values: the kernel computes in float, which s's f32
 * store would have kept (no tail where a value is f64: a double rounded
 * twice may differ from one rounding). */
static bool join_tail(fz *f, kn_tensor *t, int i, kn_tensor **U) {
    kn_tensor *s = src_of(f, t, 0);
    if (t->op != KN_OP_CAST || !s || s->id >= f->n_ids || (s->op != KN_OP_RMS_NORM && s->op != KN_OP_LAYER_NORM)) return false;
    if (s->dtype == KN_F64 || t->dtype == KN_F64 || !same_space(s, t)) return false;
    if (f->out[s->id] || s->buf || f->view_read[s->id] != INT_MAX) return false;
    int readers = 0;
    for (int32_t e = f->rhead[s->id]; e >= 0; e = f->rnext[e]) readers++;
    if (readers != 1) return false;
    int gi = f->gid[s->id], nu = 0;
    if (gi >= 0) {
        kn_fgroup *g = &f->g[gi];
        if (!g->closed || g->tail || g->node[g->nnode - 1] != s || g->nnode + 1 > KN_KMAX_NODES) return false;
        for (int m = 0; m < g->nnode; m++) U[nu++] = g->node[m];
    } else {
        if (!is_cuda(f) || !fusable_rownorm(f, s)) return false;
        U[nu++] = s;
    }
    if (any_f64(f, U, nu)) return false;
    U[nu++] = t;
    if (!group_ok(f, U, nu, i, src_of(f, s, 0))) return false;
    if (gi < 0) {
        if (!add_group(f)) return false;
        gi = f->ng - 1;
        f->g[gi].closed = true;
    }
    kn_fgroup *g = &f->g[gi];
    memcpy(g->node, U, sizeof *U * (size_t)nu);
    g->nnode = nu;
    g->tail = true;
    g->last = i;
    for (int m = 0; m < nu; m++) f->gid[U[m]->id] = gi;
    return true;
}

/* Groups by the predicate; members in schedule order. */
static bool form_groups(fz *f) {
    kn_tensor *U[KN_KMAX_NODES + 1];
    for (int i = 0; i < f->n; i++) {
        kn_tensor *t = f->order[i];
        if (opaque(f, t)) continue;
        if (fusable_reduce(f, t) || fusable_rownorm(f, t)) {
            /* ends the group of its input, if that is open and has its shape;
             * else, on CUDA, a reduction of its own (kept at the end only
             * when it runs over columns or split: a bias gradient's column
             * sum, a norm over one whole tensor) */
            if (!join_reduce(f, t, i, U) && is_cuda(f) && fusable_reduce(f, t) && !lone_reduce(f, t, i)) return false;
            continue;
        }
        if (!fusable(f, t)) continue;
        if (join_tail(f, t, i, U)) continue;
        int gs[KN_MAX_SRC], ngs = 0;
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = t->src[k] ? src_of(f, t, k) : NULL;
            if (!s || s->id >= f->n_ids || f->gid[s->id] < 0 || f->g[f->gid[s->id]].closed) continue;
            int g = f->gid[s->id];
            bool seen = false;
            for (int j = 0; j < ngs; j++) seen |= gs[j] == g;
            if (!seen) gs[ngs++] = g;
        }
        /* all of its sources' groups, else the one that admits it (the latest first) */
        bool joined = ngs && try_join(f, t, i, gs, ngs, U);
        for (int j = ngs - 1; j >= 0 && !joined && ngs > 1; j--) joined = try_join(f, t, i, &gs[j], 1, U);
        if (!joined) {
            if (!add_group(f)) return false;
            kn_fgroup *g = &f->g[f->ng - 1];
            g->node[0] = t; g->nnode = 1; g->last = i;
            f->gid[t->id] = f->ng - 1;
        }
    }
    return true;
}

/* Horizontal fusion: a group B that starts at most KN_FUSE_WINDOW nodes after
 * group A's last node and spans the same item space joins A when the
 * predicate admits the union (run at B's last node: nothing outside may
 * read A's values before that, no effect lies between them, and B must not
 * read A through a view). Independent work side by side in one launch: a
 * decode step's key rope and its K and V cache writes. */
#define KN_FUSE_WINDOW 16
static void merge_siblings(fz *f) {
    kn_tensor *U[KN_KMAX_NODES + 1];
    for (int a = 0; a < f->ng; a++) {
        for (int b = a + 1; b < f->ng; b++) {
            kn_fgroup *A = &f->g[a], *B = &f->g[b];
            if (!A->nnode || A->closed) break;
            if (!B->nnode || B->closed || A->nnode + B->nnode > KN_KMAX_NODES) continue;
            int a_last = f->pos[A->node[A->nnode - 1]->id], b_first = f->pos[B->node[0]->id];
            if (b_first <= a_last || b_first - a_last > KN_FUSE_WINDOW) continue;
            const kn_tensor *space = node_space(f, B->node[B->nnode - 1]);
            if (!same_space(node_space(f, A->node[A->nnode - 1]), space)) continue;
            int nu = 0;
            for (int m = 0; m < A->nnode; m++) U[nu++] = A->node[m];
            for (int m = 0; m < B->nnode; m++) U[nu++] = B->node[m];
            sort_by_pos(f, U, NULL, nu);
            int i = f->pos[U[nu - 1]->id];
            if (instr_estimate(U, nu) > KN_KMAX_INST - 8 || !group_ok(f, U, nu, i, space)) continue;
            memcpy(A->node, U, sizeof *U * (size_t)nu);
            A->nnode = nu;
            A->last = i;
            for (int m = 0; m < nu; m++) f->gid[U[m]->id] = a;
            B->nnode = 0;
        }
    }
}

/* ---- lowering ------------------------------------------------------------ */

static int emit(kn_kernel *k, kn_kinst in) {
    if (k->ninst >= KN_KMAX_INST) return -1;
    k->inst[k->ninst] = in;
    return k->ninst++;
}

/* Strides of s read over the kernel's space (ndim, shape of t): right-aligned,
 * a dim of extent 1 against a larger one is broadcast (stride 0). */
static void bcast_strides(const kn_tensor *s, const kn_tensor *t, int64_t *st) {
    int off = t->ndim - s->ndim;
    for (int d = 0; d < t->ndim; d++) {
        int ds = d - off;
        if (ds < 0) { st[d] = 0; continue; }
        bool b = s->shape[ds] == 1 && s->sym[ds] == 0 && !(t->shape[d] == 1 && t->sym[d] == 0);
        st[d] = b ? 0 : s->stride[ds];
    }
}

/* A buffer read or written with explicit strides st over the kernel's space
 * (an index vector along one dim, a scatter's destination); shared with an
 * earlier use only when the strides agree. */
static int buffer_st(kn_fgroup *g, kn_tensor *s, bool out, const int64_t *st, int nd) {
    kn_kernel *k = &g->k;
    for (int b = 0; b < k->nbuf; b++)
        if (g->bt[b] == s && k->buf[b].out == out && !memcmp(k->buf[b].st, st, sizeof *st * (size_t)nd)) return b;
    if (k->nbuf >= KN_KERNEL_MAXBUF) return -1;
    int b = k->nbuf++;
    g->bt[b] = s;
    k->buf[b].dt = s->dtype;
    k->buf[b].out = out;
    memcpy(k->buf[b].st, st, sizeof *st * (size_t)nd);
    return b;
}

/* The integer index vector iv ([n], one entry per coordinate of dim d of
 * the space), loaded at this item: stride iv's along d, 0 elsewhere. */
static int index_load(kn_fgroup *g, kn_tensor *iv, const kn_tensor *space, int d, int *bi, int *loads) {
    int64_t st[KN_MAX_DIMS] = {0};
    st[d] = iv->stride[0];
    if ((*bi = buffer_st(g, iv, false, st, space->ndim)) < 0) return -1;
    if (loads[*bi] < 0) loads[*bi] = emit(&g->k, (kn_kinst){.kind = KN_KI_LOAD, .dt = iv->dtype, .buf = *bi});
    return loads[*bi];
}

static int buffer_of(kn_fgroup *g, kn_tensor *s, bool out, const kn_tensor *space) {
    kn_kernel *k = &g->k;
    for (int b = 0; b < k->nbuf; b++) if (g->bt[b] == s && k->buf[b].out == out) return b;
    if (k->nbuf >= KN_KERNEL_MAXBUF) return -1;
    int b = k->nbuf++;
    g->bt[b] = s;
    k->buf[b].dt = s->dtype;
    k->buf[b].out = out;
    bcast_strides(s, space, k->buf[b].st);
    return b;
}

/* The value of x's dtype: rounds the compute type (float or double) to a
 * narrower dtype like a store would. */
static int rounded(kn_kernel *k, int v, kn_dtype dt) {
    if (v < 0 || dt == KN_F64 || (dt == KN_F32 && !k->f64)) return v;
    return emit(k, (kn_kinst){.kind = KN_KI_CAST, .dt = dt, .a = v});
}

static double fill_value(const kn_tensor *s) {
    /* the value the fill node holds: its parameter rounded to its dtype */
    unsigned char tmp[16];
    kn_store(s->dtype, tmp, 0, s->p.scalar.a);
    return kn_load(s->dtype, tmp, 0);
}

/* Merges adjacent dims every buffer walks contiguously (both reduced or
 * both kept); drops static 1s. */
static void simplify_dims(kn_kernel *k) {
    int nd = 0, map[KN_MAX_DIMS];
    uint32_t keep = 0;
    for (int d = 0; d < k->ndim; d++) {
        bool kd = (k->keep >> d) & 1;
        map[d] = nd;
        if (k->ext[d] == 1 && k->sym[d] == 0 && !kd) continue;
        /* a kept dim neither absorbs the next nor is absorbed */
        bool prev_kept = nd > 0 && ((keep >> (nd - 1)) & 1);
        if (nd > 0 && !kd && !prev_kept && k->sym[d] == 0 && k->redd[nd - 1] == k->redd[d]) {
            bool merge = true;
            for (int b = 0; b < k->nbuf && merge; b++) merge = k->buf[b].st[nd - 1] == k->buf[b].st[d] * k->ext[d];
            if (merge) {
                k->ext[nd - 1] *= k->ext[d];
                k->mul[nd - 1] *= k->ext[d];
                for (int b = 0; b < k->nbuf; b++) k->buf[b].st[nd - 1] = k->buf[b].st[d];
                continue;
            }
        }
        k->ext[nd] = k->ext[d]; k->sym[nd] = k->sym[d]; k->mul[nd] = k->mul[d]; k->redd[nd] = k->redd[d];
        for (int b = 0; b < k->nbuf; b++) k->buf[b].st[nd] = k->buf[b].st[d];
        if (kd) keep |= 1u << nd;
        nd++;
    }
    for (int i = 0; i < k->ninst; i++)
        if (k->inst[i].kind == KN_KI_SCATTER || k->inst[i].kind == KN_KI_GATHER) k->inst[i].dim = map[k->inst[i].dim];
    k->ndim = nd;
    k->keep = keep;
}

/* The output buffer of reduction r over the space of its input: r's strides on
 * kept dims, 0 on reduced ones. */
static int reduce_buffer(kn_fgroup *g, kn_tensor *r, const kn_tensor *space) {
    kn_kernel *k = &g->k;
    if (k->nbuf >= KN_KERNEL_MAXBUF) return -1;
    int b = k->nbuf++, j = 0;
    g->bt[b] = r;
    k->buf[b].dt = r->dtype;
    k->buf[b].out = true;
    for (int d = 0; d < space->ndim; d++) {
        bool red = (r->p.reduce.axes >> d) & 1;
        if (red) { k->buf[b].st[d] = 0; if (r->p.reduce.keepdim) j++; }
        else k->buf[b].st[d] = r->stride[j++];
    }
    return b;
}

/* The value of member m's source a: a member's register, a constant, or a
 * load (one per buffer). -1 on overflow. */
static int operand(fz *f, kn_fgroup *g, int m, int a, const int *val, int *loads, const kn_tensor *space) {
    kn_tensor *s = src_of(f, g->node[m], a);
    for (int j = 0; j < m; j++) if (g->node[j] == s) return val[j];
    if (is_fill(s)) return emit(&g->k, (kn_kinst){.kind = KN_KI_CONST, .dt = s->dtype, .p0 = fill_value(s)});
    int b = buffer_of(g, s, false, space);
    if (b < 0) return -1;
    if (loads[b] < 0) loads[b] = emit(&g->k, (kn_kinst){.kind = KN_KI_LOAD, .dt = s->dtype, .buf = b});
    return loads[b];
}

/* rope (its input from memory: the pair partner is another item) and
 * index_copy (a scatter of this item's value to the row its index names). */
static bool lower_index(fz *f, kn_fgroup *g, int m, int *val, int *loads, const kn_tensor *space) {
    kn_kernel *k = &g->k;
    kn_tensor *x = g->node[m];
    int nd = space->ndim, bi;
    val[m] = -1;
    if (x->op == KN_OP_ROPE) {
        kn_tensor *xs = src_of(f, x, 0), *pos = src_of(f, x, 1), *ff = x->src[2] ? src_of(f, x, 2) : NULL;
        int bx = buffer_of(g, xs, false, space), lp = index_load(g, pos, space, nd - 2, &bi, loads), bf = -1;
        if (ff) {
            int64_t z[KN_MAX_DIMS] = {0};   /* read by pair index, not by item */
            bf = buffer_st(g, ff, false, z, nd);
        }
        if (bx < 0 || lp < 0 || (ff && bf < 0)) return false;
        int v = emit(k, (kn_kinst){.kind = KN_KI_ROPE, .dt = x->dtype, .buf = bx, .b = lp, .p0 = x->p.rope.theta,
                                   .p1 = x->p.rope.freq_scale, .rot = x->p.rope.n_rot, .neox = x->p.rope.neox,
                                   .aux = bf, .ast = ff ? ff->stride[0] : 0});
        k->keep |= 1u << (nd - 1);
        return (val[m] = rounded(k, v, x->dtype)) >= 0;
    }
    int d = x->p.axis.dim;
    if (x->op == KN_OP_INDEX_SELECT) {
        kn_tensor *xs = src_of(f, x, 0);
        int li = index_load(g, src_of(f, x, 1), space, d, &bi, loads);
        int bx = buffer_st(g, xs, false, xs->stride, nd);   /* the source's strides; dim d re-indexed */
        if (li < 0 || bx < 0) return false;
        int v = emit(k, (kn_kinst){.kind = KN_KI_GATHER, .dt = xs->dtype, .b = li, .buf = bx, .dim = d, .odim = d,
                                   .bound = xs->shape[d]});
        k->keep |= 1u << d;
        if (k->err_op == KN_OP_NONE) k->err_op = KN_OP_INDEX_SELECT;
        return (val[m] = v) >= 0;
    }
    int v = operand(f, g, m, 2, val, loads, space);
    int li = index_load(g, src_of(f, x, 1), space, d, &bi, loads);
    int bd = buffer_st(g, x, true, x->stride, nd);   /* the destination's own strides; dim d re-indexed */
    if (v < 0 || li < 0 || bd < 0) return false;
    if (emit(k, (kn_kinst){.kind = KN_KI_SCATTER, .dt = x->dtype, .a = v, .b = li, .buf = bd, .dim = d, .odim = d,
                           .aux = bi, .ast = src_of(f, x, 1)->stride[0], .bound = x->shape[d]}) < 0)
        return false;
    k->keep |= 1u << d;
    if (k->err_op == KN_OP_NONE) k->err_op = KN_OP_INDEX_COPY;
    return true;
}

static bool lower(fz *f, kn_fgroup *g) {
    kn_kernel *k = &g->k;
    bool red = g->closed;
    kn_tensor *last = red ? red_node(g) : g->node[g->nnode - 1], *tail = g->tail ? g->node[g->nnode - 1] : NULL;
    kn_tensor *space = red ? src_of(f, last, 0) : (kn_tensor *)node_space(f, last);
    memset(k, 0, sizeof *k);
    k->red = KN_OP_NONE;
    k->f64 = any_f64(f, g->node, g->nnode);
    k->ndim = space->ndim;
    for (int d = 0; d < space->ndim; d++) {
        k->ext[d] = space->shape[d]; k->sym[d] = space->sym[d]; k->mul[d] = 1;
        if (red && kn__is_rownorm(last->op)) {
            int nred = (last->op == KN_OP_SOFTMAX || last->op == KN_OP_LOG_SOFTMAX) ? 1 : (int)last->p.norm.n_norm;
            k->redd[d] = d >= space->ndim - nred;
        } else {
            k->redd[d] = red && ((last->p.reduce.axes >> d) & 1);
        }
    }
    k->norm_w = k->norm_b = -1;
    int val[KN_KMAX_NODES];
    int loads[KN_KERNEL_MAXBUF];
    for (int b = 0; b < KN_KERNEL_MAXBUF; b++) loads[b] = -1;
    for (int m = 0; m < g->nnode; m++) {
        kn_tensor *x = g->node[m];
        val[m] = -1;
        if (x == tail) continue;     /* the normalisation's output dtype (red_dt) */
        if (x->op == KN_OP_FILL) {   /* an absorbed constant */
            val[m] = emit(k, (kn_kinst){.kind = KN_KI_CONST, .dt = x->dtype, .p0 = fill_value(x)});
            if (val[m] < 0) return false;
            continue;
        }
        if (red && x == last) {   /* the reduction: combined by the renderer's loop */
            kn_tensor *in = src_of(f, x, 0);
            k->red_val = -1;
            for (int j = 0; j < m; j++) if (g->node[j] == in) k->red_val = val[j];
            if (k->red_val < 0) {                 /* a lone reduction (form_groups): its input from memory */
                int b = buffer_of(g, in, false, space);
                if (b < 0) return false;
                if (loads[b] < 0) loads[b] = emit(k, (kn_kinst){.kind = KN_KI_LOAD, .dt = in->dtype, .buf = b});
                if ((k->red_val = loads[b]) < 0) return false;
            }
            k->red = x->op;
            k->red_dt = tail ? tail->dtype : x->dtype;
            if (kn__is_rownorm(x->op)) {
                k->red_buf = buffer_of(g, tail ? tail : x, true, space);
                if (x->op == KN_OP_RMS_NORM || x->op == KN_OP_LAYER_NORM) {
                    kn_tensor *w = x->src[1] ? src_of(f, x, 1) : NULL;
                    kn_tensor *b = x->op == KN_OP_LAYER_NORM && x->src[2] ? src_of(f, x, 2) : NULL;
                    if (w && (k->norm_w = buffer_of(g, w, false, space)) < 0) return false;
                    if (b && (k->norm_b = buffer_of(g, b, false, space)) < 0) return false;
                    k->eps = x->p.norm.eps;
                }
            } else {
                k->red_buf = reduce_buffer(g, x, space);
            }
            if (k->red_buf < 0) return false;
            continue;
        }
        if (is_index_op(x->op)) {
            if (!lower_index(f, g, m, val, loads, space)) return false;
            continue;
        }
        const kn_op_info *oi = kn_op_get(x->op);
        int na = oi->kind == KN_KIND_BINARY ? 2 : 1, v[2] = {-1, -1};
        for (int a = 0; a < na; a++) {
            kn_tensor *s = src_of(f, x, a);
            int mi = -1;
            for (int j = 0; j < m; j++) if (g->node[j] == s) mi = j;
            if (mi >= 0) { v[a] = val[mi]; continue; }
            if (is_fill(s)) { v[a] = emit(k, (kn_kinst){.kind = KN_KI_CONST, .dt = s->dtype, .p0 = fill_value(s)}); continue; }
            int b = buffer_of(g, s, false, space);
            if (b < 0) return false;
            if (loads[b] < 0) loads[b] = emit(k, (kn_kinst){.kind = KN_KI_LOAD, .dt = s->dtype, .buf = b});
            v[a] = loads[b];
        }
        if (v[0] < 0 || (na == 2 && v[1] < 0)) return false;
        if (x->op == KN_OP_COPY) val[m] = rounded(k, v[0], x->dtype);
        else if (x->op == KN_OP_CAST) val[m] = rounded(k, v[0], x->dtype);
        else if (na == 1)
            val[m] = rounded(k, emit(k, (kn_kinst){.kind = KN_KI_UNARY, .op = x->op, .dt = x->dtype, .a = v[0],
                                                    .p0 = x->p.scalar.a, .p1 = x->p.scalar.b}), x->dtype);
        else
            val[m] = rounded(k, emit(k, (kn_kinst){.kind = KN_KI_BINARY, .op = x->op, .dt = x->dtype, .a = v[0], .b = v[1]}), x->dtype);
        if (val[m] < 0) return false;
    }
    for (int m = 0; m < g->nnode; m++) {
        if (!g->stored[m] || (red && g->node[m] == last) || g->node[m] == tail || g->node[m]->op == KN_OP_INDEX_COPY) continue;
        int b = buffer_of(g, g->node[m], true, space);
        if (b < 0 || emit(k, (kn_kinst){.kind = KN_KI_STORE, .dt = g->node[m]->dtype, .a = val[m], .buf = b}) < 0) return false;
    }
    simplify_dims(k);
    if (red) {   /* CUDA threads per item: enough for the reduced extent, at most 256 */
        int64_t rn = 1;
        for (int d = 0; d < k->ndim; d++) if (k->redd[d]) rn *= k->ext[d];
        k->block = rn <= 32 ? 32 : rn <= 64 ? 64 : rn <= 128 ? 128 : 256;
        /* CUDA: a block per output leaves most of the GPU idle when there are
         * few outputs over long rows (a gradient's squared norm: one output
         * over 2.4M elements; a bias gradient: 24 tiles of columns over 8192
         * rows). Such rows are split into slices (kn_kernel.split) so that
         * about 528 blocks run (4 per SM of an H100). */
        int64_t nout = 1;
        for (int d = 0; d < k->ndim; d++) if (!k->redd[d]) nout *= k->ext[d];
        if (is_cuda(f) && k->ndim > 0 && !k->redd[k->ndim - 1]) {
            if (k->sym[k->ndim - 1]) return false;      /* tiles of a symbolic run: not generated */
            k->cols = true;
            /* columns: a block per tile of 32 columns and slice of rows, slices
             * of at least 64 rows */
            int64_t tiles = nout / k->ext[k->ndim - 1] * ((k->ext[k->ndim - 1] + 31) / 32), s = (528 + tiles - 1) / tiles;
            if (s > rn / 64) s = rn / 64;
            if (s > 1024) s = 1024;
            if (s * nout > KN_KSPLIT_MAX) s = KN_KSPLIT_MAX / nout;
            k->split = s >= 2 && tiles <= KN_KSPLIT_MAX ? (int)s : 0;
            k->block = 256;
        } else if (is_cuda(f) && !kn__is_rownorm(k->red) && rn >= 16384 && nout < 264) {
            int64_t s = 528 / nout;                     /* slices of at least 4096 elements */
            if (s > rn / 4096) s = rn / 4096;
            if (s > 1024) s = 1024;
            if (s * nout > KN_KSPLIT_MAX) s = KN_KSPLIT_MAX / nout;
            k->split = s >= 2 ? (int)s : 0;
        }
    }
    return true;
}

void kn__kernel_items(const kn_kernel *k, const int64_t *syms, int64_t *n, int64_t *n_max) {
    *n = *n_max = 1;
    for (int d = 0; d < k->ndim; d++) {
        if (k->red != KN_OP_NONE && k->redd[d]) continue;
        *n *= k->sym[d] ? syms[k->sym[d]] * k->mul[d] : k->ext[d];
        *n_max *= k->ext[d];
    }
    if (k->red != KN_OP_NONE && !kn__is_rownorm(k->red) && k->ndim > 0 && !k->redd[k->ndim - 1] && k->cols) {
        /* CUDA columns: an item is a tile of 32 columns of one run of the last dim */
        int64_t e = k->ext[k->ndim - 1], t = (e + 31) / 32;
        *n = *n / e * t; *n_max = *n_max / e * t;
    }
    if (k->red != KN_OP_NONE && k->split > 1) { *n *= k->split; *n_max *= k->split; }   /* an item per slice */
    for (int s = 1; s < k->nseg; s++) {   /* more item spaces after the first */
        int64_t a = 1, b = 1;
        for (int d = 0; d < k->seg[s].ndim; d++) {
            a *= k->seg[s].sym[d] ? syms[k->seg[s].sym[d]] * k->seg[s].mul[d] : k->seg[s].ext[d];
            b *= k->seg[s].ext[d];
        }
        *n += a; *n_max += b;
    }
}

/* Fill nodes read only by elementwise members of g become members (constants,
 * not stored); a final reduction or normalisation reads its operands from memory. */
static void absorb_fills(fz *f, kn_fgroup *g, int gi) {
    for (int m = 0; m < g->nnode && g->nnode < KN_KMAX_NODES; m++) {
        if (g->closed && g->node[m] == red_node(g)) break;
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = g->node[m]->src[k] ? src_of(f, g->node[m], k) : NULL;
            if (!s || !is_fill(s) || s->id >= f->n_ids || f->pos[s->id] < 0 || f->gid[s->id] >= 0) continue;
            if (f->out[s->id] || s->buf) continue;
            bool read_by_last = false;   /* the final op reads it from memory */
            for (int j = 0; g->closed && j < KN_MAX_SRC; j++)
                read_by_last |= red_node(g)->src[j] && src_of(f, red_node(g), j) == s;
            if (read_by_last) continue;
            bool only = true;
            for (int32_t e = f->rhead[s->id]; e >= 0 && only; e = f->rnext[e]) only = f->gid[f->order[f->rnode[e]]->id] == gi;
            if (!only || g->nnode >= KN_KMAX_NODES) continue;
            /* keep schedule order: the fill goes first (it reads nothing) */
            memmove(g->node + 1, g->node, sizeof g->node[0] * (size_t)g->nnode);
            g->node[0] = s;
            g->nnode++;
            f->gid[s->id] = gi;
            m++;
        }
    }
}

static void mark_stored(fz *f, kn_fgroup *g, int gi) {
    for (int m = 0; m < g->nnode; m++) {
        kn_tensor *x = g->node[m];
        bool st = f->out[x->id] || x->buf != NULL || f->view_read[x->id] != INT_MAX;   /* views are never members */
        for (int32_t e = f->rhead[x->id]; e >= 0 && !st; e = f->rnext[e]) st = f->gid[f->order[f->rnode[e]]->id] != gi;
        g->stored[m] = x->op != KN_OP_FILL && st;   /* an absorbed fill has no reader outside */
    }
}

void kn__kernel_stored_values(const kn_kernel *k, int *ld) {
    for (int i = 0; i < k->ninst; i++) ld[i] = -1;
    for (int i = 0; i < k->ninst; i++)
        if (k->inst[i].kind == KN_KI_STORE && k->inst[i].a >= 0 && ld[k->inst[i].a] < 0) ld[k->inst[i].a] = k->inst[i].buf;
}

/* Is buffer bi loaded by what a later pass recomputes: the cone of inst v, cut
 * at stored values (read back instead)? */
static bool cone_loads(const kn_kernel *k, const int *ld, int v, int bi, uint8_t *seen) {
    if (v < 0 || seen[v]) return false;
    seen[v] = 1;
    const kn_kinst *in = &k->inst[v];
    if (ld[v] >= 0) return false;
    if (in->kind == KN_KI_LOAD) return in->buf == bi;
    if (in->kind == KN_KI_CONST) return false;
    return cone_loads(k, ld, in->a, bi, seen) || (in->kind == KN_KI_BINARY && cone_loads(k, ld, in->b, bi, seen));
}

bool kn__fuse_inplace_ok(const kn_fgroup *g, const kn_tensor *m, const kn_tensor *s, kn_tensor *const *rep, int32_t n_ids) {
    bool member = false, stored = false;
    for (int j = 0; j < g->nnode; j++) {
        if (g->node[j] == s) return false;   /* a member: written by this kernel too */
        if (g->node[j] == m) { member = true; stored = g->stored[j]; }
    }
    if (!member || (m != g->node[g->nnode - 1] && !stored)) return false;
    if (!kn__fuse_aligned_reads(g, s, rep, n_ids)) return false;
    if (!kn__is_rownorm(g->k.red) || m == g->node[g->nnode - 1]) return true;
    /* a normalisation's first pass writes m: the later passes must not read s */
    int ld[KN_KMAX_INST];
    kn__kernel_stored_values(&g->k, ld);
    for (int bi = 0; bi < g->k.nbuf; bi++) {
        if (g->bt[bi] != s || g->k.buf[bi].out) continue;
        uint8_t seen[KN_KMAX_INST] = {0};
        if (cone_loads(&g->k, ld, g->k.red_val, bi, seen)) return false;
        if (bi == g->k.norm_w || bi == g->k.norm_b) return false;
    }
    return true;
}

bool kn__fuse_aligned_reads(const kn_fgroup *g, const kn_tensor *s, kn_tensor *const *rep, int32_t n_ids) {
    if (g->k.nseg > 1) return false;   /* several item spaces: never in place */
    const kn_tensor *last = g->closed ? red_node(g) : g->node[g->nnode - 1];
    /* the item space: a closed group's is its final op's input */
    const kn_tensor *space = g->closed ? kn__rw_src(rep, n_ids, last, 0)
                           : last->op == KN_OP_INDEX_COPY ? kn__rw_src(rep, n_ids, last, 2) : last;
    for (int m = 0; m < g->nnode; m++)
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *x = g->node[m]->src[k] ? kn__rw_src(rep, n_ids, g->node[m], k) : NULL;
            if (!x || kn__storage_owner(x) != s) continue;
            if (g->node[m]->op == KN_OP_ROPE || g->node[m]->op == KN_OP_INDEX_SELECT) return false;   /* reads other items */
            if (x != s || !kn_same_shape(x, space) || !kn_is_contiguous(x)) return false;
            if (g->closed && g->node[m] == last && k > 0) return false;   /* a norm's weight or bias: read across rows */
        }
    return true;
}

/* Horizontal fusion across item spaces (CUDA): two lowered elementwise
 * kernels, B starting at most KN_FUSE_WINDOW nodes after A's last node,
 * become one kernel of two segments (A's items, then B's) run at B's
 * place, when neither reads the other (another space: any read would be of
 * another item) and the predicate's order conditions hold for the union.
 * A decode step's query rope joins the kernel of its key rope and cache
 * writes. */
static bool independent(const fz *f, const kn_fgroup *A, const kn_fgroup *B) {
    for (int x = 0; x < 2; x++) {
        const kn_fgroup *R = x ? B : A, *W = x ? A : B;
        for (int m = 0; m < R->nnode; m++)
            for (int k = 0; k < KN_MAX_SRC; k++) {
                kn_tensor *s = R->node[m]->src[k] ? src_of(f, R->node[m], k) : NULL;
                if (!s) continue;
                for (int j = 0; j < W->nnode; j++)
                    if (W->node[j] == s || W->node[j] == kn__storage_owner(s) || kn__storage_owner(W->node[j]) == kn__storage_owner(s))
                        return false;
            }
    }
    return true;
}

static bool append_segment(kn_fgroup *A, const kn_fgroup *B) {
    kn_kernel *a = &A->k;
    const kn_kernel *b = &B->k;
    int na = a->nseg > 1 ? a->nseg : 1, nb = b->nseg > 1 ? b->nseg : 1;
    /* one compute type per kernel: a float segment beside a double one
     * would round the double one's values to float (or the other way) */
    if (a->f64 != b->f64 || na + nb > KN_KMAX_SEG || a->nbuf + b->nbuf > KN_KERNEL_MAXBUF || a->ninst + b->ninst > KN_KMAX_INST ||
        A->nnode + B->nnode > KN_KMAX_NODES)
        return false;
    int bo = a->nbuf, io = a->ninst;
    if (na == 1) a->seg[0].i0 = 0;
    for (int s = 0; s < nb; s++) {
        struct kn_kseg *d = &a->seg[na + s];
        int i0, i1, nd;
        const int64_t *ext, *mul;
        const int8_t *sym;
        kn__kernel_seg(b, s, &i0, &i1, &nd, &ext, &sym, &mul);
        d->ndim = nd;
        d->i0 = io + i0;
        memcpy(d->ext, ext, sizeof d->ext); memcpy(d->sym, sym, sizeof d->sym); memcpy(d->mul, mul, sizeof d->mul);
    }
    for (int i = 0; i < b->nbuf; i++) {
        a->buf[bo + i] = b->buf[i];
        a->buf[bo + i].seg = (uint8_t)(na + b->buf[i].seg);
        A->bt[bo + i] = B->bt[i];
    }
    for (int i = 0; i < b->ninst; i++) {
        kn_kinst in = b->inst[i];
        switch ((kn_kinst_kind)in.kind) {
        case KN_KI_LOAD: in.buf += bo; break;
        case KN_KI_CONST: break;
        case KN_KI_UNARY: case KN_KI_CAST: in.a += io; break;
        case KN_KI_BINARY: in.a += io; in.b += io; break;
        case KN_KI_STORE: in.a += io; in.buf += bo; break;
        case KN_KI_ROPE: in.b += io; in.buf += bo; if (in.aux >= 0) in.aux += bo; break;
        case KN_KI_SCATTER: in.a += io; in.b += io; in.buf += bo; in.aux += bo; break;
        case KN_KI_GATHER: in.b += io; in.buf += bo; break;
        }
        a->inst[io + i] = in;
    }
    a->nbuf += b->nbuf;
    a->ninst += b->ninst;
    a->nseg = na + nb;
    if (a->err_op == KN_OP_NONE) a->err_op = b->err_op;
    /* B's members after A's (the caller sorts them into schedule order) */
    for (int y = 0; y < B->nnode; y++) { A->node[A->nnode] = B->node[y]; A->stored[A->nnode++] = B->stored[y]; }
    if (B->last > A->last) A->last = B->last;
    return true;
}

static void merge_segments(fz *f) {
    if (!is_cuda(f)) return;
    for (int a = 0; a < f->ng; a++) {
        for (int b = a + 1; b < f->ng; b++) {
            kn_fgroup *A = &f->g[a], *B = &f->g[b];
            if (!A->nnode || A->k.red != KN_OP_NONE) break;
            if (!B->nnode || B->k.red != KN_OP_NONE || A->nnode + B->nnode > KN_KMAX_NODES) continue;
            int a_last = f->pos[A->node[A->nnode - 1]->id], b_first = f->pos[B->node[0]->id];
            if (b_first <= a_last || b_first - a_last > KN_FUSE_WINDOW || !independent(f, A, B)) continue;
            kn_tensor *U[2 * KN_KMAX_NODES];
            int nu = 0;
            for (int m = 0; m < A->nnode; m++) U[nu++] = A->node[m];
            for (int m = 0; m < B->nnode; m++) U[nu++] = B->node[m];
            int i = f->pos[B->node[B->nnode - 1]->id];
            if (!order_ok(f, U, nu, i)) continue;
            if (!append_segment(A, B)) continue;
            B->nnode = 0;   /* dropped with the groups of one node after this */
            sort_by_pos(f, A->node, A->stored, A->nnode);
        }
    }
}

bool kn__fuse(const char *lang, kn_tensor *const *order, int n, int32_t n_ids, int nout, kn_tensor *const *outs,
              kn_tensor *const *rep, const kn_fuse_opaque *opq, kn_fgroup **groups, int *ngroups) {
    *groups = NULL; *ngroups = 0;
    fz f = {.lang = lang, .order = order, .n = n, .n_ids = n_ids, .rep = rep, .opq = opq};
    size_t ni = (size_t)(n_ids ? n_ids : 1), nn = (size_t)n + 1;
    f.pos = malloc(sizeof *f.pos * ni);
    f.rhead = malloc(sizeof *f.rhead * ni);
    f.first_read = malloc(sizeof *f.first_read * ni);
    f.view_read = malloc(sizeof *f.view_read * ni);
    f.gid = malloc(sizeof *f.gid * ni);
    f.out = calloc(ni, 1);
    f.neff = malloc(sizeof *f.neff * nn);
    f.rnode = malloc(sizeof *f.rnode * nn * KN_MAX_SRC);
    f.rnext = malloc(sizeof *f.rnext * nn * KN_MAX_SRC);
    bool ok = f.pos && f.rhead && f.first_read && f.view_read && f.gid && f.out && f.neff && f.rnode && f.rnext;
    if (ok) {
        for (size_t i = 0; i < ni; i++) { f.pos[i] = -1; f.rhead[i] = -1; f.first_read[i] = INT_MAX; f.view_read[i] = INT_MAX; f.gid[i] = -1; }
        for (int o = 0; o < nout; o++) if (outs[o] && outs[o]->id < n_ids) f.out[outs[o]->id] = 1;
        f.neff[0] = 0;
        for (int i = 0; i < n; i++) {
            kn_tensor *t = order[i];
            f.pos[t->id] = i;
            f.neff[i + 1] = f.neff[i] + (kn_op_get(t->op)->kind == KN_KIND_EFFECT);
            for (int k = 0; k < KN_MAX_SRC; k++) {
                kn_tensor *s = read_of(&f, t, k);
                if (!s || s->id >= n_ids) continue;
                f.rnode[f.nread] = i; f.rnext[f.nread] = f.rhead[s->id]; f.rhead[s->id] = f.nread++;
            }
        }
        /* neff[i]: effects strictly before index i; group_ok compares neff[i] - neff[first] */
        for (int i = n - 1; i >= 0; i--) {
            kn_tensor *t = order[i];
            int32_t fr = f.out[t->id] ? INT_MAX - 1 : INT_MAX;
            for (int32_t e = f.rhead[t->id]; e >= 0; e = f.rnext[e]) {
                kn_tensor *r = order[f.rnode[e]];
                int32_t at = (r->flags & KN_FLAG_VIEW) ? f.first_read[r->id] : f.rnode[e];
                if (at < fr) fr = at;
            }
            f.first_read[t->id] = fr;
        }
        for (int i = 0; i < n; i++) {
            kn_tensor *t = order[i];
            if (!(t->flags & KN_FLAG_VIEW)) continue;
            kn_tensor *own = kn__storage_owner(t);
            if (own->id < n_ids && f.first_read[t->id] < f.view_read[own->id]) f.view_read[own->id] = f.first_read[t->id];
        }
        ok = form_groups(&f);
        if (ok) merge_siblings(&f);
    }
    if (ok) {
        int keep = 0;
        for (int gi = 0; gi < f.ng; gi++) {
            kn_fgroup *g = &f.g[gi];
            /* one node: kept while a kernel of several spaces may take it
             * in (merge_segments, CUDA), dropped at the end when not */
            if (g->nnode < (is_cuda(&f) ? 1 : 2)) {
                for (int m = 0; m < g->nnode; m++) f.gid[g->node[m]->id] = -1;
                continue;
            }
            /* renumber: gid must point at the kept slot */
            for (int m = 0; m < g->nnode; m++) f.gid[g->node[m]->id] = keep;
            if (keep != gi) f.g[keep] = *g;
            keep++;
        }
        f.ng = keep;
        for (int gi = 0; gi < f.ng; gi++) {
            kn_fgroup *g = &f.g[gi];
            absorb_fills(&f, g, gi);
            mark_stored(&f, g, gi);
        }
        int keep2 = 0;
        for (int gi = 0; gi < f.ng; gi++) {
            kn_fgroup *g = &f.g[gi];
            if (!lower(&f, g)) continue;   /* over the budget: its nodes run the hand kernels */
            if (keep2 != gi) f.g[keep2] = *g;
            keep2++;
        }
        f.ng = keep2;
        merge_segments(&f);
        /* groups of one node (fills aside) left, and those merge_segments
         * emptied: the hand kernel runs -- except a lone CUDA reduction over
         * columns or split across blocks (a bias gradient's column sum), which
         * the generated kernel runs in one launch at copy speed */
        int keep3 = 0;
        for (int gi = 0; gi < f.ng; gi++) {
            int real = 0;
            for (int m = 0; m < f.g[gi].nnode; m++) real += f.g[gi].node[m]->op != KN_OP_FILL;
            if (real < 2 && !(real == 1 && (f.g[gi].k.cols || f.g[gi].k.split > 1))) continue;
            if (keep3 != gi) f.g[keep3] = f.g[gi];
            keep3++;
        }
        f.ng = keep3;
        /* KN_FUSE_MAX=n: only the first n groups (the rest run hand kernels),
         * to find which generated kernel of a plan gives a wrong answer */
        const char *fm = kn_env_get()->fuse_max;
        if (fm && *fm) {
            long nmax = strtol(fm, NULL, 10);
            if (nmax >= 0 && nmax < f.ng) f.ng = (int)nmax;
        }
    }
    free(f.pos); free(f.rhead); free(f.first_read); free(f.view_read); free(f.gid); free(f.out); free(f.neff); free(f.rnode); free(f.rnext);
    if (!ok) { free(f.g); return false; }
    if (!f.ng) { free(f.g); f.g = NULL; }
    *groups = f.g; *ngroups = f.ng;
    return true;
}
