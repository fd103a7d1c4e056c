/* plan.c: the kn_plan object: build (schedule.c, the graph rewrites of
 * src/compile/, then memplan.c), free, the
 * KN_DEBUG printout and the sizes. Running it is exec.c's job.
 */
#include "runtime/runtime.h"
#include "core/env.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>      // defines: mkdir (KN_DUMP_KERNELS)

/* p->nkern: launches of one run (a fused group is one, at its last node; views none). */
static void count_kernels(kn_plan *p) {
    p->nkern = 0;
    for (int i = 0; i < p->n; i++) {
        kn_fgroup *g = kn__pgroup(p, p->order[i]);
        if (g ? i == g->last : kn__computes(p->order[i])) p->nkern++;
    }
}

/* Graph rewrites (src/compile/rewrite.c) on the scheduled list: they drop
 * nodes and fill p->rep, never touching a kn_tensor, so the order of what
 * survives is the schedule's. Only kn_plan_new's plans (eager kn_realize reuses
 * values computed earlier: stop_at_realized); off with KN_NOFUSE=1 or
 * opts->no_rewrite. */
static bool rewrite(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized) {
    if (stop_at_realized || (opts && opts->no_rewrite) || kn_env_get()->nofuse || p->n == 0) return true;
    int *removed = p->rw_removed, n0 = p->n;
    double t0 = kn_env_get()->debug ? kn__profile_now() : 0;
    p->rep = calloc((size_t)(p->n_ids ? p->n_ids : 1), sizeof *p->rep);
    if (!p->rep || !kn__rewrite(p->ctx, &p->order, &p->n, &p->n_ids, nout, outs, &p->rep, removed, &p->rw_added)) {
        kn__plan_nomem(p->ctx, p, "the graph rewrites");
        return false;
    }
    if (p->n == n0 && !p->rw_added) { free(p->rep); p->rep = NULL; }
    count_kernels(p);
    if (kn_env_get()->debug) {
        fprintf(stderr, "rewrite: %d -> %d nodes in %.3f ms", n0, p->n, (kn__profile_now() - t0) * 1e3);
        for (int r = 0; r < KN_RW_NRULES; r++) if (removed[r]) fprintf(stderr, ", %s -%d", kn__rw_rule_name((kn_rw_rule)r), removed[r]);
        if (p->rw_added) fprintf(stderr, ", made +%d", p->rw_added);
        fprintf(stderr, "\n");
    }
    return true;
}

/* What the compiler's passes may add to the arena of the plain plan: 1/16
 * of it or 1 MiB, whichever is more. First-fit placement moves the peak by
 * a few percent either way: GPT-2's bf16 step at B=16 needed 1.6 % more
 * with its 192 fused groups (10.74 against 10.57 GB), no single group was
 * the cause, and without slack all 192 went back (930 kernels a step, 0.59x
 * compiled PyTorch on an H100). The floor is for small plans: a decode
 * step's arena is a few KB to a few hundred KB, and 1/16 of it sent every
 * group back (a Llama-3-8B-shaped step ran 16 kernels a layer instead of
 * 10). Used by the matmul epilogues and by fusion (fit_memory). */
static size_t arena_slack(size_t plain) {
    const size_t floor = (size_t)1 << 20;
    return plain / 16 > floor ? plain / 16 : floor;
}

/* Matmul epilogues (src/compile/epilogue.c): a matmul's elementwise consumers
 * folded into it, on a backend that says it can run them (epilogue_ok). Only
 * kn_plan_new's plans; off with KN_NOFUSE=1 or opts->no_fuse. */
static bool epi_ok(void *be_, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    kn_backend *be = be_;
    if (epi->pre != KN_OP_NONE && be->version < 6) return false;   /* prologues came with version 6 */
    return be->epilogue_ok(be, mm, epi, out);
}
/* p->order = orig without the nodes records 0..p->nepi-1 took out; p->epi_of */
static void epi_apply(kn_plan *p, kn_tensor **orig, int n0, uint8_t *drop) {
    memset(drop, 0, (size_t)p->n_ids);
    for (int32_t i = 0; i < p->n_ids; i++) p->epi_of[i] = -1;
    p->epi_nodes = p->epi_pro = 0;
    for (int r = 0; r < p->nepi; r++) {
        const kn_epi_rec *e = &p->epi[r];
        if (e->nabs) drop[e->mm->id] = 1;   /* a prologue alone: the matmul runs at its own place */
        for (int k = 0; k < e->nabs - 1; k++) drop[e->chain[k]->id] = 1;
        for (int k = 0; k < e->npro; k++) drop[e->pro[k]->id] = 1;
        p->epi_of[e->last->id] = r;
        p->epi_nodes += e->nabs + e->npro;
        p->epi_pro += e->npro > 0;
    }
    p->n = 0;
    for (int i = 0; i < n0; i++) if (!drop[orig[i]->id]) p->order[p->n++] = orig[i];
}

static bool epilogues(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized) {
    kn_backend *be = p->be;
    if (stop_at_realized || (opts && opts->no_fuse) || kn_env_get()->nofuse || kn_env_get()->epilogue < 0 || p->n == 0) return true;
    if (be->version < 3 || !be->epilogue_ok) return true;
    int n0 = p->n;
    kn_tensor **orig = malloc(sizeof *orig * (size_t)n0);
    if (!orig) { kn__plan_nomem(p->ctx, p, "the matmul epilogues"); return false; }
    memcpy(orig, p->order, sizeof *orig * (size_t)n0);
    if (!kn__epilogue(p->order, &p->n, p->n_ids, nout, outs, p->rep, epi_ok, be, &p->epi, &p->nepi)) {
        free(orig);
        kn__plan_nomem(p->ctx, p, "the matmul epilogues");
        return false;
    }
    if (!p->nepi) { free(orig); return true; }
    p->epi_of = malloc(sizeof *p->epi_of * (size_t)p->n_ids);
    uint8_t *drop = malloc((size_t)p->n_ids);
    if (!p->epi_of || !drop) { free(orig); free(drop); kn__plan_nomem(p->ctx, p, "the matmul epilogues"); return false; }
    epi_apply(p, orig, n0, drop);
    /* Epilogues raise the arena by at most the slack fusion has (fit_memory
     * below): they keep a matmul's operands alive up to the chain's end and
     * plan its last node without in-place reuse, which can cost more than
     * the values they save, and first-fit placement moves the peak by a few
     * KB either way. Past that bound the records are tried one at a time in
     * schedule order and each one that takes the peak past it is left out;
     * the others stay. (Dropping the last record while the plan needed more
     * than the plain one let one early record take out all those after it.) */
    kn_plan q = *p;
    q.order = orig; q.n = n0; q.nepi = 0; q.epi_of = NULL;
    size_t plain = 0, with = 0;
    bool okm = kn__memplan_peak(&q, nout, outs, opts, false, &plain) &&
               kn__memplan_peak(p, nout, outs, opts, false, &with);
    size_t bound = plain + arena_slack(plain);
    int dropped = 0;
    if (okm && with > bound) {
        int all = p->nepi;
        p->nepi = 0;
        for (int r = 0; r < all && okm; r++) {
            p->epi[p->nepi++] = p->epi[r];          /* records 0 .. nepi-2 kept, r tried */
            epi_apply(p, orig, n0, drop);
            okm = kn__memplan_peak(p, nout, outs, opts, false, &with);
            if (okm && with > bound) { p->nepi--; dropped++; }
        }
        epi_apply(p, orig, n0, drop);
    }
    free(orig); free(drop);
    if (!okm) return false;   /* out of host memory: recorded */
    if (!p->nepi) { free(p->epi); p->epi = NULL; free(p->epi_of); p->epi_of = NULL; p->epi_nodes = p->epi_pro = 0; }
    count_kernels(p);
    if (kn_env_get()->debug) {
        fprintf(stderr, "epilogue: %d matmuls took %d nodes into their epilogues and prologues (%d prologues)", p->nepi,
                p->epi_nodes, p->epi_pro);
        if (dropped) fprintf(stderr, " (%d left out to keep the arena at most %zu bytes)", dropped, bound);
        fprintf(stderr, "\n");
    }
    return true;
}

/* A group that computes an operand of a matmul's epilogue or prologue must
 * store it and run before the node that runs the matmul. Fusion sees those
 * reads (fuse_opaque below), so this only guards against a rule it missed:
 * such a group goes back to the hand kernels. need[id]: the earliest
 * schedule index at which an epilogue reads node id (or storage it owns), -1. */
static bool epi_conflict(const kn_fgroup *g, const int32_t *need) {
    for (int m = 0; m < g->nnode; m++) {
        int32_t at = need[g->node[m]->id];
        if (at >= 0 && (!g->stored[m] || g->last > at)) return true;
    }
    return false;
}
/* need (n_ids entries) for epi_conflict; NULL: out of host memory */
static int32_t *epi_need(const kn_plan *p) {
    int32_t *need = malloc(sizeof *need * (size_t)p->n_ids);
    if (!need) return NULL;
    for (int32_t i = 0; i < p->n_ids; i++) need[i] = -1;
    for (int i = 0; i < p->n; i++) {
        const kn_epi_rec *e = kn__pepi(p, p->order[i]);
        if (!e) continue;
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = kn__pread(p, p->order[i], k);
            if (!s) continue;
            kn_tensor *ids[2] = {s, kn__storage_owner(s)};
            for (int j = 0; j < 2; j++)
                if (ids[j]->id < p->n_ids && (need[ids[j]->id] < 0 || need[ids[j]->id] > i)) need[ids[j]->id] = i;
        }
    }
    return need;
}

static bool fuse_is_opaque(const void *ctx, const kn_tensor *t) { return kn__pepi(ctx, t) != NULL; }
static kn_tensor *fuse_read(const void *ctx, const kn_tensor *t, int k) { return kn__pread(ctx, t, k); }

/* KN_DUMP_KERNELS=DIR: each generated kernel's source as DIR/NAME.c or .cu
 * (DIR is made when missing; its parent must exist) */
static void dump_source(const char *lang, const char *name, const char *src) {
    const char *dir = kn_env_get()->dump_kernels;
    if (!dir || !*dir) return;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln: KN_DUMP_KERNELS: cannot make %s: %s\n", dir, strerror(errno));
        return;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, strcmp(lang, "cuda") ? lang : "cu");
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "kiln: KN_DUMP_KERNELS: cannot write %s\n", path); return; }
    fputs(src, f);
    fclose(f);
}

/* Fusion (src/compile/fuse.c): groups of elementwise nodes, each rendered in
 * the backend's language and built by it (kernels.c). A group whose kernel
 * cannot be built is dropped: its nodes run the hand kernels. Only for
 * kn_plan_new's plans on backends that build kernels; off with KN_NOFUSE=1 or
 * opts->no_fuse. */
static bool fuse(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized) {
    kn_backend *be = p->be;
    if (stop_at_realized || (opts && opts->no_fuse) || kn_env_get()->nofuse || p->n == 0) return true;
    if (be->version < 2 || !be->kernel_lang || !be->kernel_build || !be->kernel_run) return true;
    double t0 = kn_env_get()->debug ? kn__profile_now() : 0;
    /* a node that runs a matmul with its epilogue or prologue is opaque to
     * fusion: never fused, reading the record's operands (kn__pread), so the
     * groups around it form as they would around a plain matmul */
    kn_fuse_opaque opq = {fuse_is_opaque, fuse_read, p};
    bool fused_ok = kn__fuse(be->kernel_lang, p->order, p->n, p->n_ids, nout, outs, p->rep, p->nepi ? &opq : NULL,
                             &p->groups, &p->ngroups);
    if (!fused_ok) {
        kn__plan_nomem(p->ctx, p, "fusion");
        return false;
    }
    if (p->nepi && p->ngroups) {
        int32_t *need = epi_need(p);
        if (!need) { kn__plan_nomem(p->ctx, p, "fusion"); return false; }
        int kept = 0;
        for (int gi = 0; gi < p->ngroups; gi++) if (!epi_conflict(&p->groups[gi], need)) p->groups[kept++] = p->groups[gi];
        p->ngroups = kept;
        free(need);
    }
    if (!p->ngroups) return true;
    p->gid = malloc(sizeof *p->gid * (size_t)p->n_ids);
    p->kernel = calloc((size_t)p->ngroups, sizeof *p->kernel);
    size_t cap = 1 << 16;
    char *src = malloc(cap);
    if (!p->gid || !p->kernel || !src) { free(src); kn__plan_nomem(p->ctx, p, "fusion"); return false; }
    for (int32_t i = 0; i < p->n_ids; i++) p->gid[i] = -1;
    int keep = 0, nsrc = 0;
    for (int gi = 0; gi < p->ngroups; gi++) {
        kn_fgroup *g = &p->groups[gi];
        void *h = NULL;
        int len = kn__render(be->kernel_lang, &g->k, src, cap);   /* untuned: the tunables' key */
        bool tuned = len > 0 && kn__tune_pick(be, &g->k, src);   /* tune.c: the choice changes the source */
        if (tuned) len = kn__render(be->kernel_lang, &g->k, src, cap);
        if (len > 0) {
            dump_source(be->kernel_lang, g->k.name, src);
            h = kn__kernel_get(be, src, g->k.name, tuned);   /* a tuned variant has the fallback below */
            nsrc++;
        }
        if (!h && tuned) {   /* a stored choice that no longer builds (another NVRTC?): the heuristic's source */
            g->k.tune = (kn_ktune){0};
            if (kn__render(be->kernel_lang, &g->k, src, cap) > 0) h = kn__kernel_get(be, src, g->k.name, false);
        }
        if (!h) continue;
        if (keep != gi) p->groups[keep] = *g;
        p->kernel[keep] = h;
        for (int m = 0; m < g->nnode; m++) p->gid[g->node[m]->id] = keep;
        keep++;
    }
    free(src);
    p->ngroups = keep;
    p->nfused = 0;
    for (int gi = 0; gi < keep; gi++) p->nfused += p->groups[gi].nnode;
    count_kernels(p);
    if (kn_env_get()->debug)
        fprintf(stderr, "fuse: %d groups of %d nodes in %.3f ms (%s kernels), %d kernels per run\n",
                keep, p->nfused, (kn__profile_now() - t0) * 1e3, be->kernel_lang, p->nkern);
    return true;
}

/* Group gi runs its nodes on the hand kernels again. */
static void drop_group(kn_plan *p, int gi) {
    kn_fgroup *g = &p->groups[gi];
    for (int m = 0; m < g->nnode; m++) p->gid[g->node[m]->id] = -1;
    p->nfused -= g->nnode;
    for (int j = gi + 1; j < p->ngroups; j++) {
        p->groups[j - 1] = p->groups[j];
        p->kernel[j - 1] = p->kernel[j];
        for (int m = 0; m < p->groups[j - 1].nnode; m++) p->gid[p->groups[j - 1].node[m]->id] = j - 1;
    }
    p->ngroups--;
}

/* Fusion raises the arena by at most arena_slack (above) over the unfused
 * plan: a group keeps its operands and its stored values alive together for
 * the length of one kernel, where the hand kernels could free some and
 * reuse them in place one by one. While the fused plan needs more than
 * that, the group with the most bytes in memory (operands and stored
 * values) goes back to the hand kernels. */
static bool fit_memory(kn_plan *p, int nout, kn_tensor **outs, const kn_plan_opts *opts) {
    if (!p->ngroups) return true;
    size_t plain = 0, fused = 0;
    if (!kn__memplan_peak(p, nout, outs, opts, false, &plain)) return false;   /* out of host memory: recorded */
    size_t slack = arena_slack(plain);
    int dropped = 0;
    while (p->ngroups) {
        if (!kn__memplan_peak(p, nout, outs, opts, true, &fused)) return false;
        if (fused <= plain + slack) break;
        int worst = 0;
        size_t worst_b = 0;
        for (int gi = 0; gi < p->ngroups; gi++) {
            size_t bytes = 0;
            for (int b = 0; b < p->groups[gi].k.nbuf; b++)
                bytes += kn_dtype_nbytes(p->groups[gi].bt[b]->dtype, kn__storage_elems(p->groups[gi].bt[b]));
            if (bytes > worst_b) { worst_b = bytes; worst = gi; }
        }
        drop_group(p, worst);
        dropped++;
    }
    if (dropped) {
        count_kernels(p);
        if (kn_env_get()->debug)
            fprintf(stderr, "fuse: %d groups left to the hand kernels to keep the arena at most %zu bytes\n", dropped,
                    plain + slack);
    }
    return true;
}

/* p->written: the storages the plan's effects write in place (their own
 * and the sources kn__effect_writes names), so that kn__exec_of can say
 * which leaves stay fixed for a run. */
static bool mark_written(kn_plan *p) {
    p->written = calloc(p->n_ids > 0 ? (size_t)p->n_ids : 1, 1);
    if (!p->written) { kn__plan_nomem(p->ctx, p, "the table of written storages"); return false; }
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        unsigned mask = kn__effect_writes(t->op);
        if (!mask) continue;
        kn_tensor *w[1 + 2 * KN_MAX_SRC];
        int nw = 0;
        w[nw++] = t;
        for (int k = 0; k < KN_MAX_SRC; k++)
            if (mask >> k & 1) { w[nw++] = t->src[k]; w[nw++] = kn__psrc(p, t, k); }
        for (int j = 0; j < nw; j++) {
            kn_tensor *o = w[j] ? kn__storage_owner(w[j]) : NULL;
            if (o && o->id < p->n_ids) p->written[o->id] = 1;
        }
    }
    return true;
}

kn_plan *kn__plan_build(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts, bool stop_at_realized) {
    if (!ctx) return NULL;
    double t0 = kn_env_get()->debug ? kn__profile_now() : 0;
    kn_plan *p = calloc(1, sizeof *p);
    if (!p) { kn__plan_nomem(ctx, NULL, "the plan header"); return NULL; }
    p->ctx = ctx;
    p->be = (opts && opts->backend) ? opts->backend : ctx->be;
    for (int i = 0; i < nout; i++)
        if (!outs[i]) { free(p); kn__fail(ctx, KN_ERR_INVALID, "kn_plan_new: output %d is NULL (an earlier op failed: %s)", i, kn_last_error()); return NULL; }
    if (!kn__schedule(p, nout, outs, stop_at_realized) || !rewrite(p, nout, outs, opts, stop_at_realized) ||
        !epilogues(p, nout, outs, opts, stop_at_realized) || !fuse(p, nout, outs, opts, stop_at_realized) || !fit_memory(p, nout, outs, opts) || !kn__memplan(p, nout, outs, opts) || !mark_written(p)) {
        kn_plan_free(p);
        return NULL;
    }
    if (kn_env_get()->debug) {
        fprintf(stderr, "plan built in %.3f ms\n", (kn__profile_now() - t0) * 1e3);
        if (p->ngroups)
        {
            size_t plain = 0;
            kn__memplan_peak(p, nout, outs, opts, false, &plain);
            fprintf(stderr, "fuse: arena %zu bytes with fusion, %zu without\n", p->peak, plain);
        }
        kn_plan_print(p, stderr);
    }
    return p;
}

kn_plan *kn_plan_new(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts) {
    return kn__plan_build(ctx, nout, outs, opts, false);
}

void kn_plan_free(kn_plan *p) {
    if (!p) return;
    kn__replay_free(p);                 /* before the arena: its graphs read it */
    kn_buffer_release(p->arena);
    free(p->order);
    free(p->off);
    free(p->rep);
    free(p->groups);
    free(p->gid);
    free(p->kernel);
    free(p->epi);
    free(p->epi_of);
    free(p->written);
    free(p->batch);
    free(p);
}

size_t kn_plan_peak_bytes(const kn_plan *p) { return p ? p->peak : 0; }
size_t kn_plan_naive_bytes(const kn_plan *p) { return p ? p->naive : 0; }
int kn_plan_n_kernels(const kn_plan *p) { return p ? p->nkern : 0; }

void kn_plan_print(const kn_plan *p, void *fp) {
    FILE *f = fp ? fp : stderr;
    fprintf(f, "plan: %d nodes, %d kernels (%d generated, fusing %d nodes; %d matmul epilogues taking %d nodes), backend %s, arena %zu bytes (no reuse: %zu)\n",
            p->n, p->nkern, p->ngroups, p->nfused, p->nepi, p->epi_nodes, p->be->name, p->peak, p->naive);
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        char s[160];
        fprintf(f, "  %3d %-14s %-5s %-22s", i, kn_op_name(t->op), kn_dtype_name(t->dtype), kn__shape_str(t, s, sizeof s));
        kn_fgroup *g = kn__pgroup(p, t);
        if (g) {
            const kn_ktune *kt = &g->k.tune;   /* a stored or searched choice (tune.c); zeros: the heuristic */
            char tt[128] = "";
            if (g->node[g->nnode - 1] == t && (kt->block || kt->unroll || kt->waves || kt->grain)) {
                tt[0] = ' ';
                kn__ktune_str(kt, tt + 1, sizeof tt - 1);
            }
            fprintf(f, " [%s%s%s]", g->node[g->nnode - 1] == t ? "runs " : "in ", g->k.name, tt);
        }
        if (g && !kn__pstored(g, t)) fprintf(f, " -> registers");
        else if (!kn__computes(t)) fprintf(f, " view of #%d", kn__storage_owner(t)->id);
        else if (t->buf) fprintf(f, " -> persistent");
        else if (t->id < p->n_ids && p->off[t->id] >= 0) fprintf(f, " -> arena+%lld", (long long)p->off[t->id]);
        else if (t->view_src) fprintf(f, " -> writes #%d", t->view_src->id);
        fprintf(f, "  <-");
        const kn_epi_rec *er = kn__pepi(p, t);
        if (er) fprintf(f, " [%s%smatmul #%d%s%s%s%s%s]", er->d.pre == KN_OP_RMS_NORM ? "rms_norm " : "",
                        er->d.pre == KN_OP_SILU ? "silu*u " : "", er->mm->id, er->d.bias ? " +bias" : "", er->d.act ? " " : "",
                        er->d.act ? kn_op_name(er->d.act) : "", er->d.res ? " +res" : "", t->dtype != er->d.dt ? " cast" : "");
        for (int k = 0; k < KN_MAX_SRC; k++) if (kn__pread(p, t, k)) fprintf(f, " #%d", kn__pread(p, t, k)->id);
        fprintf(f, "  (#%d%s%s)\n", t->id, t->name[0] ? " " : "", t->name);
    }
}
