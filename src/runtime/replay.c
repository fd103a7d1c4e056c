/* replay.c: kn_plan_run through captured graphs (CUDA graphs).
 *
 * A device backend with the capture hooks (kn_backend version >= 2:
 * dynamic_syms, capture_begin/end, graph_launch, graph_free) can record a
 * whole plan run once and replay it with one launch, which takes the host
 * out of a decode step's ~570 kernel launches.
 *
 * Which runs share a graph: a captured launch keeps the extents it was
 * recorded with, except those its kernel reads from the backend's device
 * copy of the symbols. Before capturing, every node that uses a symbol (in
 * its own extents or its operands') is asked (dynamic_syms) which symbols
 * its launches would read on the device; a symbol is dynamic when every node
 * that uses it reads it there. The graph is then keyed by the values of the
 * other symbols. An LLM's decode step (T = R = 1) has the context length S
 * dynamic (only attention reads it), so one graph serves every step.
 *
 * When: a key is captured the second time it is run (a prefill chunk of a
 * length seen once pays nothing); later runs with a matching key replay.
 * A plan keeps KN_REPLAY_SLOTS keys (graphs or keys seen once), least
 * recently used out. A capture that fails (a node that synchronises or
 * copies through the host, a launch the backend refuses) marks its key,
 * which then always runs plainly; the failed capture is invisible except
 * under KN_DEBUG, and the run is redone plainly.
 *
 * Off: KN_CUDA_GRAPH=0, KN_PROFILE (it times nodes one by one), a backend
 * without the hooks. Non-goals: updating a graph in place when a key
 * changes (cudaGraphExecUpdate), capturing the eager plans of kn_realize
 * (run once, never matched).
 */
#include "runtime/runtime.h"
#include "core/env.h"          // defines: kn_env_get (KN_CUDA_GRAPH, KN_DEBUG)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KN_REPLAY_SLOTS 4

typedef struct {
    bool used;
    bool failed;                    /* capture failed: run this key plainly */
    uint64_t dyn;                   /* symbols read on the device: not part of the key */
    int64_t val[KN_MAX_SYMS + 1];   /* the key: the other symbols' values (dynamic ones 0) */
    void *graph;                    /* NULL until captured */
    uint64_t stamp;                 /* last use (LRU) */
} kn_replay_slot;

struct kn_replay {
    kn_replay_slot s[KN_REPLAY_SLOTS];
    uint64_t tick;
    kn_plan_stats st;
};

static bool hooks_ok(const kn_backend *be) {
    return be->version >= 2 && be->dynamic_syms && be->capture_begin && be->capture_end && be->graph_launch &&
           be->graph_free;
}

static bool key_match(const kn_replay_slot *s, const int64_t *sv, int n) {
    for (int i = 1; i <= n; i++)
        if (!(s->dyn >> i & 1) && s->val[i] != sv[i]) return false;
    return true;
}

/* ---- which symbols this run's nodes read on the device ---- */
static uint64_t syms_of(const kn_tensor *t) {
    uint64_t m = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->sym[i]) m |= (uint64_t)1 << t->sym[i];
    return m;
}
/* The dynamic symbols of this run; false when the plan's tensors are gone. */
static bool dynamic_set(kn_plan *p, uint64_t *dyn) {
    uint64_t used = 0, fixed = 0;
    for (int i = 0; i < p->n; i++) {
        kn_tensor *t = p->order[i];
        if (!kn__alive(t)) return false;
        if (!kn__computes(t)) continue;
        uint64_t m = syms_of(t);
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *s = kn__pread(p, t, k);
            if (s) m |= syms_of(s);
        }
        if (!m) continue;
        if (kn__pgroup(p, t)) { used |= m; continue; }   /* generated kernels read every extent on the device */
        kn_exec e;
        kn_epilogue epi;
        int bad;
        kn__exec_of(p, t, &e, &epi, &bad);
        used |= m;
        fixed |= m & ~p->be->dynamic_syms(p->be, &e);
    }
    *dyn = used & ~fixed;
    return true;
}

/* ---- runs ---- */
static kn_status run_plain(kn_plan *p) {
    kn_status st = kn__plan_run_steps(p);
    if (st != KN_OK) return st;
    if (p->be->synchronize) return p->be->synchronize(p->be);
    return KN_OK;
}

static kn_status launch(kn_plan *p, kn_replay_slot *s) {
    kn_status st = p->be->graph_launch(p->be, s->graph, p->ctx->sym_val, p->ctx->n_syms);
    if (st != KN_OK) return st;
    p->replay->st.replays++;
    if (p->be->synchronize) return p->be->synchronize(p->be);
    return KN_OK;
}

static void print_key(const kn_plan *p, const kn_replay_slot *s) {
    for (int i = 1; i <= p->ctx->n_syms; i++) {
        if (s->dyn >> i & 1) fprintf(stderr, " %s=dynamic", p->ctx->sym_name[i]);
        else fprintf(stderr, " %s=%lld", p->ctx->sym_name[i], (long long)s->val[i]);
    }
}

/* Records s's key, runs it once into a graph and launches that; on any
 * failure the key is marked and the run goes plainly. */
static kn_status capture(kn_plan *p, kn_replay_slot *s) {
    kn_backend *be = p->be;
    kn_status st = be->capture_begin(be, p->ctx->sym_val, p->ctx->n_syms);
    if (st == KN_OK) {
        kn_status rs = kn__plan_run_steps(p);
        void *g = NULL;
        st = be->capture_end(be, rs == KN_OK, &g);
        if (rs != KN_OK) st = rs;
        s->graph = st == KN_OK ? g : NULL;
        if (st == KN_OK && !g) st = KN_ERR_BACKEND;
    }
    if (st != KN_OK) {
        s->failed = true;
        if (kn_env_get()->debug) {
            fprintf(stderr, "replay: capture failed, key");
            print_key(p, s);
            fprintf(stderr, " runs plainly: %s\n", kn_last_error());
        }
        kn_clear_error();
        return run_plain(p);
    }
    p->replay->st.captures++;
    p->replay->st.graphs++;
    if (kn_env_get()->debug) {
        fprintf(stderr, "replay: captured %d kernels into a graph, key", p->nkern);
        print_key(p, s);
        fprintf(stderr, "\n");
    }
    return launch(p, s);
}

static void slot_clear(kn_plan *p, kn_replay_slot *s) {
    if (s->graph) { p->be->graph_free(p->be, s->graph); p->replay->st.graphs--; }
    memset(s, 0, sizeof *s);
}

kn_status kn__plan_replay(kn_plan *p) {
    if (!p->replay && !(p->replay = calloc(1, sizeof *p->replay))) return run_plain(p);
    kn_replay *r = p->replay;
    r->st.runs++;
    if (kn_env_get()->cuda_nograph || !hooks_ok(p->be) || kn__profile_mode() || kn__check_mode(p->be)) return run_plain(p);
    r->tick++;
    const int64_t *sv = p->ctx->sym_val;
    int n = p->ctx->n_syms;
    for (int i = 0; i < KN_REPLAY_SLOTS; i++) {
        kn_replay_slot *s = &r->s[i];
        if (s->used && s->graph && key_match(s, sv, n)) { s->stamp = r->tick; return launch(p, s); }
    }
    uint64_t dyn;
    if (!dynamic_set(p, &dyn)) return run_plain(p);   /* reports the freed tensors */
    kn_replay_slot *lru = &r->s[0];
    for (int i = 0; i < KN_REPLAY_SLOTS; i++) {
        kn_replay_slot *s = &r->s[i];
        if (s->used && s->dyn == dyn && key_match(s, sv, n)) {
            s->stamp = r->tick;
            if (s->failed) return run_plain(p);
            return capture(p, s);           /* seen before: the second run captures */
        }
        if (!s->used || (lru->used && s->stamp < lru->stamp)) lru = s;
    }
    slot_clear(p, lru);
    lru->used = true;
    lru->dyn = dyn;
    for (int i = 1; i <= n; i++) lru->val[i] = dyn >> i & 1 ? 0 : sv[i];
    lru->stamp = r->tick;
    return run_plain(p);
}

void kn__replay_free(kn_plan *p) {
    if (!p->replay) return;
    for (int i = 0; i < KN_REPLAY_SLOTS; i++) slot_clear(p, &p->replay->s[i]);
    free(p->replay);
    p->replay = NULL;
}

void kn_plan_get_stats(const kn_plan *p, kn_plan_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    if (p->replay) *out = p->replay->st;
    out->nodes = p->n;
    out->kernels = p->nkern;
    out->generated = p->ngroups;
    out->fused_nodes = p->nfused;
    out->epilogues = p->nepi;
    out->epilogue_nodes = p->epi_nodes;
    out->prologues = p->epi_pro;
    out->peak_bytes = p->peak;
}
