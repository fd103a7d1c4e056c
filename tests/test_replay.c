/* test_replay.c: src/runtime/replay.c (capture and replay of plan runs) on
 * a fake backend that "captures" by recording each node's kn_exec and
 * "replays" by running the records through the cpu backend; every build,
 * no GPU (tests/test_cuda_graph.c runs the real CUDA graphs).
 *
 * Checked: a key (the symbol values; this fake reads no symbol on the
 * device, unless told to for one op) is captured the second time it runs
 * and replayed after; outputs equal plain runs'; a plan keeps at most 4
 * graphs and frees the ones it drops and, at kn_plan_free, the rest; a
 * failed capture runs plainly with the right result and is not tried again
 * for that key; KN_CUDA_GRAPH=0 turns it off; a dynamic symbol shares one
 * graph across its values.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_backend.h"
#include "core/env.h"   /* defines: kn_env_reload */

/* ---- the fake backend ---- */
typedef struct { kn_exec *e; int n, cap; } fk_graph;
static fk_graph *g_cur;                 /* capturing into */
static int g_begins, g_frees, g_fail_after = -1;
static bool g_dyn;                      /* every node reads its symbols "on the device" */

static kn_backend *cpu(void) { return kn_backend_cpu(); }
static void *fk_alloc(kn_backend *be, size_t n) { (void)be; return cpu()->alloc(cpu(), n); }
static void fk_free(kn_backend *be, void *p) { (void)be; cpu()->free(cpu(), p); }
static kn_status fk_in(kn_backend *be, void *d, const void *s, size_t n) { (void)be; return cpu()->copy_in(cpu(), d, s, n); }
static kn_status fk_out(kn_backend *be, void *d, const void *s, size_t n) { (void)be; return cpu()->copy_out(cpu(), d, s, n); }
static kn_status fk_compute(kn_backend *be, const kn_exec *e) {
    (void)be;
    if (!g_cur) return cpu()->compute(cpu(), e);
    if (g_fail_after >= 0 && g_cur->n >= g_fail_after) return kn_set_error(KN_ERR_UNSUPPORTED, "fake: node not capturable");
    if (g_cur->n == g_cur->cap) {
        g_cur->cap = g_cur->cap ? 2 * g_cur->cap : 16;
        g_cur->e = realloc(g_cur->e, sizeof *g_cur->e * (size_t)g_cur->cap);
    }
    g_cur->e[g_cur->n++] = *e;          /* recorded with this run's extents */
    return KN_OK;
}
static uint64_t fk_dyn(kn_backend *be, const kn_exec *e) {
    (void)be;
    if (!g_dyn) return 0;
    uint64_t m = 0;                     /* every symbol of the node and its operands */
    for (int i = 0; i < e->node->ndim; i++) if (e->node->sym[i]) m |= (uint64_t)1 << e->node->sym[i];
    for (int k = 0; k < e->nsrc; k++)
        for (int i = 0; e->node->src[k] && i < e->node->src[k]->ndim; i++)
            if (e->node->src[k]->sym[i]) m |= (uint64_t)1 << e->node->src[k]->sym[i];
    return m;
}
static kn_status fk_begin(kn_backend *be, const int64_t *s, int n) {
    (void)be; (void)s; (void)n;
    g_begins++;
    g_cur = calloc(1, sizeof *g_cur);
    return KN_OK;
}
static kn_status fk_end(kn_backend *be, bool keep, void **graph) {
    (void)be;
    fk_graph *g = g_cur;
    g_cur = NULL;
    *graph = NULL;
    if (!keep) { free(g->e); free(g); return KN_OK; }
    *graph = g;
    return KN_OK;
}
static int64_t g_sv[KN_MAX_SYMS + 1];   /* the values of the last launch (a "device" copy) */
static kn_status fk_launch(kn_backend *be, void *graph, const int64_t *s, int n) {
    (void)be;
    fk_graph *g = graph;
    memcpy(g_sv, s, sizeof(int64_t) * (size_t)(n + 1));
    for (int i = 0; i < g->n; i++) {
        kn_exec e = g->e[i];
        if (g_dyn)                      /* a dynamic node re-reads its symbolic extents */
            for (int k = -1; k < e.nsrc; k++) {
                kn_tview *v = k < 0 ? &e.dst : &e.src[k];
                const kn_tensor *t = k < 0 ? e.node : e.node->src[k];
                for (int d = 0; d < v->ndim; d++) if (t->sym[d]) v->ne[d] = g_sv[t->sym[d]];
            }
        kn_status st = cpu()->compute(cpu(), &e);
        if (st) return st;
    }
    return KN_OK;
}
static void fk_gfree(kn_backend *be, void *graph) {
    (void)be;
    fk_graph *g = graph;
    if (!g) return;
    g_frees++;
    free(g->e);
    free(g);
}
static kn_backend g_fake = {
    .version = KN_BACKEND_VERSION, .name = "fake-capture", .device = KN_DEVICE_HOST, .alloc = fk_alloc, .free = fk_free,
    .copy_in = fk_in, .copy_out = fk_out, .compute = fk_compute, .dynamic_syms = fk_dyn, .capture_begin = fk_begin,
    .capture_end = fk_end, .graph_launch = fk_launch, .graph_free = fk_gfree,
};

/* ---- the plan: y = relu(x) * 3 + 1 over x [T <= 8, 4], and the row sums ---- */
typedef struct { kn_ctx *ctx; int T; kn_tensor *x, *y, *s; kn_plan *p; } fx;
static bool fx_new(fx *f) {
    f->ctx = kn_ctx_new(&(kn_ctx_opts){.backend = &g_fake});
    f->T = kn_sym_new(f->ctx, "T", 8);
    f->x = kn_input(f->ctx, KN_F32, 2, (int64_t[]){8, 4});
    kn_tensor *xs = kn_slice_sym(f->ctx, f->x, 0, 0, f->T);
    f->y = kn_add_scalar(f->ctx, kn_mul_scalar(f->ctx, kn_relu(f->ctx, xs), 3.0), 1.0);
    f->s = kn_sum(f->ctx, f->y, 1, (int[]){1}, false);
    kn_tensor *outs[2] = {f->y, f->s};
    f->p = f->y && f->s ? kn_plan_new(f->ctx, 2, outs, NULL) : NULL;
    return f->p != NULL;
}
static void fx_free(fx *f) { kn_plan_free(f->p); kn_ctx_free(f->ctx); }
/* runs with T = t on input values of seed r; checks y's and s's first t rows */
static int fx_run(fx *f, int t, int r) {
    float x[32], y[32], s[8];
    for (int i = 0; i < 32; i++) x[i] = (float)((i * 37 + r * 11) % 17) - 8.f;
    if (kn_tensor_write(f->x, x, KN_F32) || kn_sym_set(f->ctx, f->T, t) || kn_plan_run(f->p) ||
        kn_tensor_read(f->y, y, KN_F32) || kn_tensor_read(f->s, s, KN_F32)) {
        fprintf(stderr, "  run T=%d: %s\n", t, kn_last_error());
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < t; i++) {
        float sum = 0;
        for (int j = 0; j < 4; j++) {
            float want = (x[i * 4 + j] > 0 ? x[i * 4 + j] : 0) * 3 + 1;
            bad += y[i * 4 + j] != want;
            sum += want;
        }
        bad += s[i] != sum;
    }
    return bad;
}
static kn_plan_stats fx_stats(fx *f) { kn_plan_stats s; kn_plan_get_stats(f->p, &s); return s; }
static void reset(void) { g_begins = g_frees = 0; g_fail_after = -1; g_dyn = false; unsetenv("KN_CUDA_GRAPH"); kn_env_reload(); }

TEST(replay_second_run_captures_then_replays) {
    reset();
    fx f;
    REQUIRE(fx_new(&f), "plan: %s", kn_last_error());
    int bad = 0;
    int seq[] = {3, 3, 3, 5, 3, 5, 5, 8, 1, 8};
    for (int i = 0; i < 10; i++) bad += fx_run(&f, seq[i], i);
    kn_plan_stats s = fx_stats(&f);
    CHECK(bad == 0, "%d wrong values", bad);
    /* T=3: seen, captured (and launched), replayed x2; T=5: seen, captured, replayed; T=8: seen, captured; T=1: seen */
    CHECK(s.runs == 10 && s.captures == 3 && s.replays == 6 && s.graphs == 3, "runs %llu captures %llu replays %llu graphs %d",
          (unsigned long long)s.runs, (unsigned long long)s.captures, (unsigned long long)s.replays, s.graphs);
    fx_free(&f);
    CHECK(g_frees == 3, "kn_plan_free freed %d of 3 graphs", g_frees);
}

TEST(replay_keeps_four_keys) {
    reset();
    fx f;
    REQUIRE(fx_new(&f), "plan: %s", kn_last_error());
    int bad = 0;
    for (int t = 1; t <= 6; t++) { bad += fx_run(&f, t, t); bad += fx_run(&f, t, t + 10); }
    kn_plan_stats s = fx_stats(&f);
    CHECK(bad == 0, "%d wrong values", bad);
    CHECK(s.captures == 6 && s.graphs == 4 && g_frees == 2, "captures %llu, graphs held %d, freed %d",
          (unsigned long long)s.captures, s.graphs, g_frees);
    bad += fx_run(&f, 6, 99);           /* the newest key is still held */
    CHECK(fx_stats(&f).replays == s.replays + 1, "T=6 not replayed");
    fx_free(&f);
}

TEST(replay_failed_capture_runs_plainly_once_tried) {
    reset();
    g_fail_after = 2;                   /* the third node refuses */
    fx f;
    REQUIRE(fx_new(&f), "plan: %s", kn_last_error());
    int bad = 0;
    for (int i = 0; i < 6; i++) bad += fx_run(&f, 4, i);
    kn_plan_stats s = fx_stats(&f);
    CHECK(bad == 0, "%d wrong values after a failed capture", bad);
    CHECK(g_begins == 1 && s.captures == 0 && s.replays == 0 && s.runs == 6, "begins %d captures %llu replays %llu", g_begins,
          (unsigned long long)s.captures, (unsigned long long)s.replays);
    CHECK(kn_last_error()[0] == 0 || !strstr(kn_last_error(), "fake"), "the failed capture's message is left: %s", kn_last_error());
    fx_free(&f);
}

TEST(replay_off_with_env) {
    reset();
    setenv("KN_CUDA_GRAPH", "0", 1);
    kn_env_reload();
    fx f;
    REQUIRE(fx_new(&f), "plan: %s", kn_last_error());
    int bad = 0;
    for (int i = 0; i < 4; i++) bad += fx_run(&f, 2, i);
    kn_plan_stats s = fx_stats(&f);
    CHECK(bad == 0 && g_begins == 0 && s.replays == 0 && s.runs == 4, "begins %d replays %llu", g_begins, (unsigned long long)s.replays);
    fx_free(&f);
    reset();
}

TEST(replay_dynamic_symbol_one_graph) {
    /* every node says it reads T on the device (the fake re-resolves the
     * recorded extents at launch): one graph serves every T */
    reset();
    g_dyn = true;
    fx f;
    REQUIRE(fx_new(&f), "plan: %s", kn_last_error());
    int bad = 0;
    for (int t = 1; t <= 8; t++) bad += fx_run(&f, t, t);
    kn_plan_stats s = fx_stats(&f);
    CHECK(bad == 0, "%d wrong values", bad);
    CHECK(s.captures == 1 && s.replays == 7 && s.graphs == 1, "captures %llu replays %llu graphs %d",
          (unsigned long long)s.captures, (unsigned long long)s.replays, s.graphs);
    fx_free(&f);
    reset();
}

KN_TEST_MAIN()
