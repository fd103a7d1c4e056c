/* runtime.h: what the planner's files (src/runtime/) share; never included by users.
 *
 * kn_plan_new compiles a graph into a plan in three steps, kn_plan_run runs it:
 *   schedule.c  the node order: dependency order, effects nobody reads last
 *   (compile/)  graph rewrites on that list (plan.c calls kn__rewrite): nodes
 *               dropped, sources redirected through p->rep, read with kn__psrc
 *   memplan.c   where each node's value lives: persistent output buffers, one
 *               arena for the rest (liveness, in-place reuse)
 *   plan.c      the kn_plan object: build (schedule, then memory plan), free,
 *               print, sizes
 *   exec.c      running a plan: each node's operands as kn_tview, one call to
 *               the backend's compute per node (the only dispatch path)
 *   replay.c    kn_plan_run on a backend that captures: a whole run recorded
 *               once (a CUDA graph) and replayed with one launch
 *   profile.c   KN_PROFILE: time per op (and per shape) of those calls
 *   tune.c      generated kernels' tunables: stored choice, heuristic, or a
 *               KN_BEAM search timed on the backend (src/compile/search.c)
 *   eager.c     kn_realize, kn_tensor_read/write, kn_item: a temporary plan for
 *               what a tensor needs, and host transfers
 */
#ifndef KN_RUNTIME_H
#define KN_RUNTIME_H
#include "compile/kernel.h"
#include "compile/epilogue.h"   // defines: kn_epi_rec, kn__epilogue

struct kn_plan {
    kn_ctx *ctx;
    kn_backend *be;
    kn_tensor **order;     /* schedule, views included */
    int n;
    int32_t n_ids;         /* ctx->n_all at compile time */
    int64_t *off;          /* by tensor id: arena byte offset of a storage owner, -1 if none;
                            * off[n_ids + id]: of the by-product it keeps (kn__aux_bytes), -1 if none */
    kn_buffer *arena;
    size_t peak, naive;
    int nkern;
    int rw_removed[KN_RW_NRULES];  /* nodes each rewrite rule removed (tests, KN_DEBUG) */
    int rw_added;          /* nodes the rewrite rules made (zero fills, folded constants, x*n) */
    kn_tensor **rep;       /* by tensor id: the node read in its place (graph rewrites), NULL = itself; NULL when none */
    /* fusion (src/compile/fuse.c): groups of nodes that run as one generated kernel */
    kn_fgroup *groups;
    int ngroups;
    int32_t *gid;          /* by tensor id: the node's group, -1; NULL when no groups */
    void **kernel;         /* by group: the backend's handle (kernels.c) */
    int nfused;            /* nodes that run inside a group */
    /* matmul epilogues (src/compile/epilogue.c): a record's `last` node runs its matmul */
    kn_epi_rec *epi;
    int nepi;
    int32_t *epi_of;       /* by tensor id: the record whose `last` the node is, -1; NULL when none */
    int epi_nodes;         /* consumer nodes run in epilogues (as many left the schedule: the matmuls, and the chains but their last) and prologue nodes */
    int epi_pro;           /* records with a prologue */
    uint8_t *written;      /* by tensor id: 1 for a storage an effect of the plan writes (kn_exec.fixed); NULL: none is fixed */
    struct kn_replay *replay;  /* captured graphs and run counts (replay.c); NULL until the first run */
    kn_exec *batch;        /* KN_BATCH_MAX records for a backend's compute_batch (exec.c); NULL until needed */
    int nbatched;          /* nodes the last stepped run (not a replay) handed to compute_batch (tests) */
};

/* Nodes the plan's last stepped run handed to compute_batch (exec.c; tests). */
int kn__plan_batched(const kn_plan *p);

/* The group node t belongs to, or NULL. */
static inline kn_fgroup *kn__pgroup(const kn_plan *p, const kn_tensor *t) {
    return (p->gid && t->id < p->n_ids && p->gid[t->id] >= 0) ? &p->groups[p->gid[t->id]] : NULL;
}
/* Does node t of group g keep its value in memory? */
static inline bool kn__pstored(const kn_fgroup *g, const kn_tensor *t) {
    for (int m = 0; m < g->nnode; m++) if (g->node[m] == t) return g->stored[m];
    return true;
}

/* The epilogue record whose chain ends at t (t runs the matmul), or NULL. */
static inline const kn_epi_rec *kn__pepi(const kn_plan *p, const kn_tensor *t) {
    return (p->epi_of && t->id < p->n_ids && p->epi_of[t->id] >= 0) ? &p->epi[p->epi_of[t->id]] : NULL;
}

/* A node that runs a kernel; a view only describes its source's storage. */
static inline bool kn__computes(const kn_tensor *t) { return !kn__is_view_op(t->op); }

/* Source k of t as this plan reads it (after graph rewrites, src/compile/). */
static inline kn_tensor *kn__psrc(const kn_plan *p, const kn_tensor *t, int k) { return kn__rw_src(p->rep, p->n_ids, t, k); }
/* Operand k of what t runs: kn__psrc, except for a node that runs a matmul
 * with its epilogue or prologue: a (the prologue's x), b, bias, res, the
 * prologue's second operand (NULL where absent). Memory planning and fusion
 * keep these alive up to t. */
static inline kn_tensor *kn__pread(const kn_plan *p, const kn_tensor *t, int k) {
    const kn_epi_rec *r = kn__pepi(p, t);
    if (!r) return kn__psrc(p, t, k);
    return k == 0 ? r->a : k == 1 ? r->b : k == 2 ? r->bias : k == 3 ? r->res : k == 4 ? r->pre : NULL;
}

/* ---- plan.c ----------------------------------------------------------------- */
/* kn_plan_new, and kn_realize's temporary plan. stop_at_realized: eager
 * kn_realize reuses values computed earlier; a plan (kn_plan_new) recomputes
 * every op node on each run, so only leaves (data, inputs, parameters) are
 * read as they are. */
kn_plan *kn__plan_build(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized);
/* Out of host memory while compiling: records why (message, ctx status).
 * p may be NULL (the plan header itself); the caller frees the plan. */
static inline void kn__plan_nomem(kn_ctx *ctx, const kn_plan *p, const char *what) {
    kn__fail(ctx, KN_ERR_NOMEM, "kn_plan_new: out of host memory for %s of a %d-node graph; "
             "free unused contexts or build a smaller graph", what, p ? p->n : 0);
}

/* ---- exec.c ----------------------------------------------------------------- */
/* t as operand of this plan: address (NULL when it has no storage), extents
 * at the current symbol values, strides. */
bool kn__tview_of(const kn_plan *p, kn_tensor *t, kn_tview *v);
/* The kn_exec of node t (epi: storage for the epilogue of a node that runs a
 * matmul); false when an operand has no storage (*bad: which, -1 = dst). */
bool kn__exec_of(const kn_plan *p, kn_tensor *t, kn_exec *e, kn_epilogue *epi, int *bad);
/* Runs every step of p once, in order (kn_plan_run is this and a final wait). */
kn_status kn__plan_run_steps(kn_plan *p);

/* ---- kernels.c -------------------------------------------------------------- */
/* The backend's handle for a generated kernel's source, built once per process
 * (NULL when it could not be built: reported once, or each time with KN_DEBUG;
 * quiet: not reported, the caller has a fallback or reports itself). */
void *kn__kernel_get(kn_backend *be, const char *src, const char *name, bool quiet);
/* ---- tune.c ------------------------------------------------------------------ */
/* The kernel search (src/compile/search.c) on the plan's backend. */
/* Fills l's items, symbols and launch shape (block, waves, grain) for k at
 * symbol values syms, from k->tune (0 fields: the heuristic); l->a.buf is
 * the caller's. */
void kn__kernel_launch_fill(const kn_backend *be, const kn_kernel *k, const int64_t *syms, kn_kernel_launch *l);
/* Sets k->tune for the plan being built: the process memo, else the disk
 * cache (kind "beam", per device), else with KN_BEAM=N a search timed on be
 * (stored in both), else zeros (the heuristic). src is k's source rendered
 * with a zero k->tune (the key). Returns true when a choice was applied
 * (render again: it may change the source); never fails: any problem
 * leaves the heuristic. */
bool kn__tune_pick(kn_backend *be, kn_kernel *k, const char *src);
/* The cached choice for the untuned source src on be, or false (memo, then disk). */
bool kn__tune_lookup(kn_backend *be, const char *src, kn_ktune *t);
/* Stores a choice for src on be (memo and disk); false when the disk write failed. */
bool kn__tune_store(kn_backend *be, const char *src, const kn_ktune *t);
/* Forgets the process memo (tests: a "new process" that reads the disk). */
void kn__tune_forget(void);
typedef struct kn_tune_stats {
    long picks;        /* kn__tune_pick calls */
    long hits;         /* of those, a choice found (memo or disk) */
    long searches;     /* searches run (KN_BEAM) */
    long timed;        /* timing runs of kernel variants */
} kn_tune_stats;
void kn__tune_stats(kn_tune_stats *s);

/* ---- replay.c ----------------------------------------------------------------- */
typedef struct kn_replay kn_replay;
/* One run of p with its final wait: a replay of a captured graph when one
 * matches the symbols, a capture when this key ran before, else plainly. */
kn_status kn__plan_replay(kn_plan *p);
void kn__replay_free(kn_plan *p);   /* frees p's graphs (kn_plan_free) */

/* ---- schedule.c ------------------------------------------------------------- */
/* Fills p->order, p->n, p->n_ids and p->nkern for the nodes feeding outs.
 * false on failure, with the error recorded; the caller frees p. */
bool kn__schedule(kn_plan *p, int nout, kn_tensor **outs, bool stop_at_realized);

/* ---- memplan.c -------------------------------------------------------------- */
/* Gives outs persistent buffers, places every other computed node in the
 * arena (p->off, p->peak, p->naive) and allocates it. false when out of
 * memory, with the error recorded; the caller frees p. */
bool kn__memplan(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts);
/* The arena p would need with or without its fused groups (planned, not
 * allocated), in *peak; false when out of host memory. */
bool kn__memplan_peak(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool groups, size_t *peak);

/* ---- check.c ---------------------------------------------------------------- */
/* KN_CHECK on a device backend: every node also on the reference backend,
 * differences printed on stderr. */
typedef struct kn_check kn_check;
bool kn__check_mode(kn_backend *be);
/* Before the device computes e: host copies of its operands (NULL: no memory). */
kn_check *kn__check_before(kn_backend *be, const kn_exec *e);
/* After: the reference on the copies, compared; frees c. */
void kn__check_after(kn_backend *be, const kn_exec *e, kn_check *c, int index);
/* Frees c unused (the device's compute failed: nothing to compare). */
void kn__check_free(kn_check *c);
/* Nodes checked and found different since the last call, the first one's op; resets them (tests). */
void kn__check_counts(int *checked, int *differ, kn_op *first);

/* ---- profile.c -------------------------------------------------------------- */
/* 0 off, 1 time per op, 2 also per (op, operand layout). The first call reads
 * KN_PROFILE and, when on, prints the tables at exit. */
int kn__profile_mode(void);
double kn__profile_now(void);    /* seconds, monotonic */
/* Adds sec to e's op (mode 2: also to its layout). */
void kn__profile_node(int mode, const kn_exec *e, double sec);
/* Adds sec to the fused kernels' row. */
void kn__profile_kernel(const char *name, double sec);
#endif
