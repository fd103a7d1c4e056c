/* test_search.c: the kernel search (src/compile/search.c, src/runtime/tune.c;
 * docs/COMPILER.md, "Kernel search").
 *
 * The search alone, with synthetic costs (no device): it finds a known
 * optimum, a wider beam finds what a narrow one misses, the number of timings
 * is capped and no variant is timed twice, reductions are never unrolled.
 * Through the runtime on the CPU backend: without KN_BEAM nothing is timed
 * and a stored choice is applied; the cache's round trip through the disk;
 * KN_BEAM=2 searches a small fused graph and the plan still computes what
 * the unfused plan computes. KN_CACHE_DIR is a temporary directory.
 * In a CUDA=1 build: NVRTC compiles the unrolled CUDA variants (no GPU
 * needed), and on a GPU (scripts/cuda_test.sh) KN_BEAM=2 searches an
 * elementwise kernel, a reduction and a row normalisation on the device,
 * results checked against the unfused plan.
 */
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"
#include "core/env.h"
#include <dirent.h>
#include <unistd.h>
#ifdef KN_CUDA
#include "kiln_cuda.h"
#include "backends/cuda/cuda_jit.h"
#endif

static char g_dir[512];

static void set_env(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
    kn_env_reload();
}

/* An elementwise kernel over n f32 items: out = in (the search never looks
 * at the program; the runtime tests build real ones). */
static kn_kernel elementwise(int64_t n) {
    kn_kernel k;
    memset(&k, 0, sizeof k);
    k.ndim = 1; k.ext[0] = n; k.mul[0] = 1;
    k.nbuf = 2;
    k.buf[0] = (kn_kbuf){.dt = KN_F32, .out = true, .st = {1}};
    k.buf[1] = (kn_kbuf){.dt = KN_F32, .out = false, .st = {1}};
    k.ninst = 2;
    k.inst[0] = (kn_kinst){.kind = KN_KI_LOAD, .dt = KN_F32, .buf = 1};
    k.inst[1] = (kn_kinst){.kind = KN_KI_STORE, .dt = KN_F32, .a = 0, .buf = 0};
    k.red = KN_OP_NONE;
    return k;
}

/* ---- synthetic costs ------------------------------------------------------------- */
typedef struct {
    int calls;
    kn_ktune seen[512];
    double (*cost)(const kn_ktune *t);
} probe;

static double timed_cost(void *ctx, const kn_kernel *k, const kn_ktune *t) {
    (void)k;
    probe *p = ctx;
    if (p->calls < 512) p->seen[p->calls] = *t;
    p->calls++;
    return p->cost(t);
}

static bool same_tune(const kn_ktune *a, const kn_ktune *b) {
    return a->block == b->block && a->unroll == b->unroll && a->waves == b->waves && a->grain == b->grain;
}

static int ilog2(int64_t v) { int l = 0; while (v > 1) { v >>= 1; l++; } return l; }

/* separable, one minimum: block 128, unroll 4, waves 2 (grain: C only) */
static double bowl(const kn_ktune *t) {
    return 1.0 + 0.1 * abs(ilog2(t->block) - 7) + 0.1 * abs(ilog2(t->unroll) - 2) + 0.1 * abs(ilog2(t->waves) - 1)
           + 0.1 * abs(ilog2(t->grain) - 12);
}

TEST(finds_the_optimum_cuda_elementwise) {
    kn_kernel k = elementwise(1 << 20);
    probe p = {.cost = bowl};
    kn_beam_result r;
    REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 2}, timed_cost, &p, &r), "search");
    CHECK(r.best.block == 128 && r.best.unroll == 4 && r.best.waves == 2,
          "best block=%d unroll=%d waves=%d", r.best.block, r.best.unroll, r.best.waves);
    CHECK(r.best.grain == 16384, "CUDA leaves the grain alone: %lld", (long long)r.best.grain);
    CHECK(r.ntimed == p.calls, "ntimed %d, calls %d", r.ntimed, p.calls);
    CHECK(p.seen[0].block == 256 && p.seen[0].unroll == 1 && p.seen[0].waves == 8, "the default is timed first");
    CHECK(fabs(r.t_default - bowl(&p.seen[0])) < 1e-12 && r.t_best < r.t_default, "costs %g -> %g", r.t_default, r.t_best);
    for (int i = 0; i < p.calls && i < 512; i++)
        for (int j = 0; j < i; j++)
            CHECK(!same_tune(&p.seen[i], &p.seen[j]) || (i >= p.calls - 2), "variant %d timed twice (as %d)", i, j);
}

TEST(finds_the_optimum_c_elementwise) {
    kn_kernel k = elementwise(1 << 20);
    probe p = {.cost = bowl};
    kn_beam_result r;
    REQUIRE(kn__beam_search(&k, "c", &(kn_beam_opts){.width = 1}, timed_cost, &p, &r), "search");
    CHECK(r.best.grain == 4096 && r.best.unroll == 4, "best grain=%lld unroll=%d", (long long)r.best.grain, r.best.unroll);
    for (int i = 0; i < p.calls; i++)
        CHECK(p.seen[i].block == 256 && p.seen[i].waves == 8, "C varies grain and unroll only");
}

/* A trap: the best first step (block 512) leads nowhere; the second best
 * (unroll 2) leads to the optimum (unroll 2, waves 16). */
static double trap(const kn_ktune *t) {
    if (t->block == 256 && t->unroll == 1 && t->waves == 8) return 10;
    if (t->block == 512 && t->unroll == 1 && t->waves == 8) return 5;
    if (t->block == 256 && t->unroll == 2 && t->waves == 8) return 7;
    if (t->block == 256 && t->unroll == 2 && t->waves == 16) return 1;
    return 20;
}

TEST(beam_width_is_honoured) {
    kn_kernel k = elementwise(1 << 20);
    probe p1 = {.cost = trap}, p2 = {.cost = trap};
    kn_beam_result r1, r2;
    REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 1}, timed_cost, &p1, &r1), "search 1");
    REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 2}, timed_cost, &p2, &r2), "search 2");
    CHECK(r1.best.block == 512 && r1.t_best == 5, "width 1 keeps only the best step: block=%d cost %g", r1.best.block, r1.t_best);
    CHECK(r2.best.unroll == 2 && r2.best.waves == 16 && r2.t_best == 1, "width 2 keeps the second: unroll=%d waves=%d cost %g",
          r2.best.unroll, r2.best.waves, r2.t_best);
    /* width 1: round 1 times the 12 single changes of the default, round 2
     * those of (512, 1, 8) not seen before (its other block sizes were
     * timed in round 1): 8; then it stops (no gain) and times the default
     * and the winner once more */
    CHECK(p1.calls == 1 + 12 + 8 + 2, "width 1 timed %d variants", p1.calls);
    CHECK(p2.calls > p1.calls, "width 2 timed %d", p2.calls);
}

TEST(timing_calls_are_capped) {
    kn_kernel k = elementwise(1 << 20);
    for (int cap = 1; cap <= 20; cap += 7) {
        probe p = {.cost = bowl};
        kn_beam_result r;
        REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 4, .max_timed = cap}, timed_cost, &p, &r), "search");
        CHECK(p.calls <= cap && r.ntimed == p.calls, "cap %d: %d calls", cap, p.calls);
    }
    probe p = {.cost = bowl};
    kn_beam_result r;
    REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 4, .max_rounds = 1}, timed_cost, &p, &r), "search");
    CHECK(r.rounds <= 1 && p.calls == 1 + 12 + 2, "one round: %d rounds, %d calls", r.rounds, p.calls);
}

static double fails(const kn_ktune *t) { return t->unroll > 1 ? -1 : bowl(t); }
static double never(const kn_ktune *t) { (void)t; return -1; }

TEST(variants_that_fail_are_dropped) {
    kn_kernel k = elementwise(1 << 20);
    probe p = {.cost = fails};
    kn_beam_result r;
    REQUIRE(kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 2}, timed_cost, &p, &r), "search");
    CHECK(r.best.unroll == 1 && r.best.block == 128 && r.best.waves == 2, "best block=%d unroll=%d waves=%d", r.best.block, r.best.unroll, r.best.waves);
    probe q = {.cost = never};
    CHECK(!kn__beam_search(&k, "cuda", &(kn_beam_opts){.width = 2}, timed_cost, &q, &r), "an untimeable default fails");
    CHECK(q.calls == 1 && r.best.block == 256, "only the default tried, and it stays: %d calls", q.calls);
}

TEST(reductions_are_not_unrolled) {
    kn_kernel k = elementwise(1 << 10);
    k.ndim = 2; k.ext[0] = 64; k.ext[1] = 1000; k.mul[1] = 1;
    k.redd[1] = true; k.red = KN_OP_SUM; k.red_buf = 0; k.red_val = 0; k.red_dt = KN_F32; k.block = 256;
    k.buf[0].st[0] = 1; k.buf[0].st[1] = 0; k.buf[1].st[0] = 1000; k.buf[1].st[1] = 1;
    kn_ktune d = kn__ktune_resolve(&k, NULL);
    CHECK(d.block == 256 && d.unroll == 1 && d.waves == 8 && d.grain == 16, "default %d %d %d %lld", d.block, d.unroll, d.waves, (long long)d.grain);
    for (int l = 0; l < 2; l++) {
        probe p = {.cost = bowl};
        kn_beam_result r;
        REQUIRE(kn__beam_search(&k, l ? "c" : "cuda", &(kn_beam_opts){.width = 2}, timed_cost, &p, &r), "search");
        for (int i = 0; i < p.calls; i++) {
            CHECK(p.seen[i].unroll == 1, "unroll %d", p.seen[i].unroll);
            CHECK(p.seen[i].block % 32 == 0, "block %d: whole warps", p.seen[i].block);
        }
        if (!l) CHECK(r.best.block == 128 && r.best.waves == 2, "cuda best block=%d waves=%d", r.best.block, r.best.waves);
        else CHECK(r.best.grain == 128, "c best grain=%lld (16 << 3)", (long long)r.best.grain);
    }
}

TEST(tune_text_round_trip) {
    kn_ktune t = {128, 4, 2, 4096}, u;
    char s[128];
    REQUIRE(kn__ktune_str(&t, s, sizeof s) > 0, "str");
    CHECK(!strcmp(s, "block=128 unroll=4 waves=2 grain=4096"), "%s", s);
    CHECK(kn__ktune_parse(s, &u) && same_tune(&t, &u), "parse back");
    CHECK(kn__ktune_parse("unroll=2", &u) && u.unroll == 2 && u.block == 0, "one field, the rest heuristic");
    CHECK(kn__ktune_parse("grain=7 future=3", &u) && u.grain == 7, "unknown fields ignored");
    CHECK(!kn__ktune_parse("", &u) && !kn__ktune_parse("block=0", &u) && !kn__ktune_parse("block=2048", &u) &&
          !kn__ktune_parse("block", &u) && !kn__ktune_parse("unroll=x", &u), "bad text rejected");
    CHECK(kn__ktune_str(&t, s, 8) < 0, "short buffer");
}

TEST(default_render_is_unchanged_and_unroll_renames) {
    kn_kernel k = elementwise(1000);
    char *a = malloc(1 << 16), *b = malloc(1 << 16);
    for (int l = 0; l < 2; l++) {
        const char *lang = l ? "cuda" : "c";
        kn_kernel k1 = k, k2 = k;
        k2.tune = (kn_ktune){.block = 64, .waves = 2, .grain = 99, .unroll = 1};   /* launch-only values */
        REQUIRE(kn__render(lang, &k1, a, 1 << 16) > 0 && kn__render(lang, &k2, b, 1 << 16) > 0, "render");
        CHECK(!strcmp(a, b) && !strcmp(k1.name, k2.name), "%s: launch-only tunables keep the source", lang);
        k2.tune.unroll = 4;
        REQUIRE(kn__render(lang, &k2, b, 1 << 16) > 0, "render unrolled");
        CHECK(strcmp(k1.name, k2.name), "%s: unroll renames", lang);
        CHECK(strstr(b, l ? "v0_3" : "#pragma GCC unroll 4"), "%s: unroll in the source (CUDA: 4 copies)", lang);
    }
    free(a); free(b);
}

/* ---- through the runtime, CPU backend ------------------------------------------------ */
typedef struct { kn_ctx *ctx; kn_tensor *y; } graph;

/* y = exp(x * 0.5) + x over [rows, cols]: one fused group */
static graph make_graph(int64_t rows, int64_t cols) {
    graph g;
    g.ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
    int64_t n = rows * cols, shape[2] = {rows, cols};
    float *d = malloc(sizeof *d * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
    kn_tensor *x = kn_from_data(g.ctx, KN_F32, 2, shape, d);
    free(d);
    g.y = kn_add(g.ctx, kn_unary(g.ctx, KN_OP_EXP, kn_mul_scalar(g.ctx, x, 0.5)), x);
    return g;
}

static float *run_read(kn_plan *p, kn_tensor *y, int64_t n) {
    float *o = malloc(sizeof *o * (size_t)n);
    if (kn_plan_run(p) != KN_OK || kn_tensor_read(y, o, KN_F32) != KN_OK) { free(o); return NULL; }
    return o;
}

/* the plan's fused outputs against the unfused plan's (within float
 * rounding: the fused exp is not the hand kernel's); *out (malloc'd) gets
 * the fused values */
static void check_against_unfused(int64_t rows, int64_t cols, kn_plan **keep, graph *gk, float **out) {
    graph g = make_graph(rows, cols), h = make_graph(rows, cols);
    kn_plan *pf = kn_plan_new(g.ctx, 1, &g.y, NULL), *pp = kn_plan_new(h.ctx, 1, &h.y, &(kn_plan_opts){.no_fuse = true});
    CHECK(pf && pp, "plans: %s", kn_last_error());
    float *a = pf ? run_read(pf, g.y, rows * cols) : NULL, *b = pp ? run_read(pp, h.y, rows * cols) : NULL;
    CHECK(a && b, "run: %s", kn_last_error());
    double worst = 0;
    for (int64_t i = 0; a && b && i < rows * cols; i++) {
        double e = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) > 1 ? fabs((double)b[i]) : 1);
        if (!(e <= worst)) worst = e;
    }
    CHECK(worst <= 1e-6, "fused (tuned) differs from unfused: relative %g", worst);
    if (out) *out = a; else free(a);
    free(b);
    kn_plan_free(pp);
    kn_ctx_free(h.ctx);
    *keep = pf;
    *gk = g;
}

static bool untuned_src(const kn_kernel *k, char *src, size_t cap) {
    kn_kernel kk = *k;
    kk.tune = (kn_ktune){0};
    return kn__render("c", &kk, src, cap) > 0;
}

TEST(default_runs_never_time_and_apply_the_cache) {
    set_env("KN_BEAM", NULL);
    kn_tune_stats s0, s1;
    kn__tune_stats(&s0);
    kn_plan *p;
    graph g;
    float *y0 = NULL, *y1 = NULL;
    check_against_unfused(33, 300, &p, &g, &y0);
    if (!p || !p->ngroups) { kn_plan_free(p); kn_ctx_free(g.ctx); free(y0); SKIP("no fused group (no C compiler?)"); }
    kn_ktune z = {0};
    CHECK(same_tune(&p->groups[0].k.tune, &z), "nothing stored: the heuristic (zeros)");
    char *src = malloc(1 << 16), name0[40];
    memcpy(name0, p->groups[0].k.name, sizeof name0);
    REQUIRE(untuned_src(&p->groups[0].k, src, 1 << 16), "render");
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    /* a stored choice (as a search in another process would leave it) */
    kn_ktune want = {.block = 256, .unroll = 2, .waves = 8, .grain = 1000};
    CHECK(kn__tune_store(kn_backend_cpu(), src, &want), "store");
    kn__tune_forget();
    check_against_unfused(33, 300, &p, &g, &y1);
    REQUIRE(p && p->ngroups == 1, "plan");
    CHECK(y0 && y1 && !memcmp(y0, y1, sizeof *y0 * 33 * 300), "tuned and untuned kernels agree bit for bit");
    free(y0); free(y1);
    CHECK(same_tune(&p->groups[0].k.tune, &want), "the stored choice is applied: unroll %d grain %lld",
          p->groups[0].k.tune.unroll, (long long)p->groups[0].k.tune.grain);
    CHECK(strcmp(p->groups[0].k.name, name0), "the unrolled kernel has its own name");
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    kn__tune_stats(&s1);
    CHECK(s1.timed == s0.timed && s1.searches == s0.searches, "KN_BEAM unset: %ld timings, %ld searches",
          s1.timed - s0.timed, s1.searches - s0.searches);
    CHECK(s1.picks >= s0.picks + 2 && s1.hits >= s0.hits + 1, "picks %ld hits %ld", s1.picks - s0.picks, s1.hits - s0.hits);
    free(src);
}

static int count_beam_files(void) {
    DIR *dp = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    if (!dp) return -1;
    while ((e = readdir(dp))) { size_t l = strlen(e->d_name); n += l > 5 && !strcmp(e->d_name + l - 5, ".beam"); }
    closedir(dp);
    return n;
}

TEST(cache_round_trip) {
    const char *src = "/* not a kernel: only a key */ int kn_tune_test;";
    kn_ktune t = {.block = 512, .unroll = 8, .waves = 4, .grain = 123}, u = {0};
    int n0 = count_beam_files();
    CHECK(kn__tune_store(kn_backend_cpu(), src, &t), "store");
    CHECK(count_beam_files() == n0 + 1, "one .beam file in KN_CACHE_DIR (%d -> %d)", n0, count_beam_files());
    kn__tune_forget();
    CHECK(kn__tune_lookup(kn_backend_cpu(), src, &u) && same_tune(&t, &u), "read back from disk: block %d", u.block);
    CHECK(!kn__tune_lookup(kn_backend_cpu(), "int other;", &u), "another source has none");
    set_env("KN_CACHE", "0");
    kn__tune_forget();
    CHECK(!kn__tune_lookup(kn_backend_cpu(), src, &u), "KN_CACHE=0: no disk");
    set_env("KN_CACHE", NULL);
}

TEST(beam_search_on_cpu_keeps_results) {
    set_env("KN_BEAM", "2");
    kn_tune_stats s0, s1, s2;
    kn__tune_stats(&s0);
    kn_plan *p;
    graph g;
    check_against_unfused(257, 1000, &p, &g, NULL);
    kn__tune_stats(&s1);
    if (!p || !p->ngroups) { kn_plan_free(p); kn_ctx_free(g.ctx); set_env("KN_BEAM", NULL); SKIP("no fused group (no C compiler?)"); }
    CHECK(s1.searches == s0.searches + 1, "one kernel searched: %ld", s1.searches - s0.searches);
    CHECK(s1.timed - s0.timed >= 2 && s1.timed - s0.timed <= 24 + 8 * 2, "%ld variants timed", s1.timed - s0.timed);
    kn_ktune chosen = p->groups[0].k.tune;
    CHECK(chosen.block > 0 && chosen.unroll > 0 && chosen.grain > 0, "a resolved choice is applied");
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    /* the same kernel again: the memo, no second search; and then a new
     * process (memo forgotten) reads the disk */
    check_against_unfused(257, 1000, &p, &g, NULL);
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    kn__tune_forget();
    check_against_unfused(257, 1000, &p, &g, NULL);
    kn__tune_stats(&s2);
    CHECK(s2.searches == s1.searches && s2.timed == s1.timed, "no search for a stored kernel");
    if (p && p->ngroups) CHECK(same_tune(&p->groups[0].k.tune, &chosen), "the stored choice comes back");
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    set_env("KN_BEAM", NULL);
}

/* ---- forced choices on varied kernels ------------------------------------------------
 * Graphs like the codegen goldens' (test_fuse.c): bf16 with a transposed
 * operand and a cast, an f64 reduction, a symbolic row count, row
 * normalisations. Each is
 * planned with the heuristic, then every kernel gets a stored choice far
 * from it (unroll 8, a tiny grain: many threads, short ranges), and the
 * plan built again must give the same bits. */
static kn_tensor *data(kn_ctx *ctx, kn_dtype dt, int nd, const int64_t *shape, int seed) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *d = malloc(sizeof *d * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = (float)(((i + seed) * 37) % 101) / 25.0f - 2.0f;
    kn_tensor *t = kn_from_data(ctx, KN_F32, nd, shape, d);
    free(d);
    return dt == KN_F32 ? t : kn_cast(ctx, t, dt);
}
static kn_tensor *v_bf16(kn_ctx *ctx) {
    kn_tensor *a = data(ctx, KN_BF16, 2, (int64_t[]){50, 120}, 1);
    kn_tensor *t = kn_permute(ctx, data(ctx, KN_BF16, 2, (int64_t[]){120, 50}, 2), (int[]){1, 0});
    kn_tensor *w = data(ctx, KN_F32, 1, (int64_t[]){120}, 3);
    kn_tensor *y = kn_mul(ctx, kn_unary(ctx, KN_OP_TANH, kn_add(ctx, a, t)), w);
    return kn_cast(ctx, kn_mul_scalar(ctx, y, 0.5), KN_BF16);
}
static kn_tensor *v_sumsq(kn_ctx *ctx) {
    kn_tensor *g = data(ctx, KN_F32, 2, (int64_t[]){333, 64}, 4);
    return kn_sum(ctx, kn_unary(ctx, KN_OP_SQUARE, kn_cast(ctx, g, KN_F64)), 1, (int[]){1}, false);
}
static kn_tensor *v_swiglu(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 96);
    kn_tensor *g = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){96, 150}, 5), 0, 0, T);
    kn_tensor *u = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){96, 150}, 6), 0, 0, T);
    return kn_mul(ctx, kn_unary(ctx, KN_OP_SILU, g), u);
}
/* row normalisations (fuse.c's closed groups): rms_norm of a residual add
 * over a symbolic row count, a masked softmax */
static kn_tensor *v_addrms(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 96);
    kn_tensor *x = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){96, 200}, 7), 0, 0, T);
    kn_tensor *o = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){96, 200}, 8), 0, 0, T);
    return kn_rms_norm(ctx, kn_add(ctx, x, o), 1, data(ctx, KN_F32, 1, (int64_t[]){200}, 9), 1e-5);
}
static kn_tensor *v_softmax(kn_ctx *ctx) {
    kn_tensor *s = data(ctx, KN_F32, 3, (int64_t[]){4, 70, 33}, 10), *m = data(ctx, KN_F32, 2, (int64_t[]){70, 33}, 11);
    return kn_softmax(ctx, kn_add(ctx, kn_mul_scalar(ctx, s, 0.125), m), -1);
}
typedef kn_tensor *(*vgraph)(kn_ctx *ctx);
static const vgraph g_variants[] = {v_bf16, v_sumsq, v_swiglu, v_addrms, v_softmax};

/* runs g (symbolic T at 96, then 7) and returns the values read as f32 */
static float *run_variant(vgraph fn, int *ngroups, kn_kernel *k0, int64_t *n, bool *sym) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
    kn_tensor *y = fn(ctx);
    kn_plan *p = y ? kn_plan_new(ctx, 1, &y, NULL) : NULL;
    float *out = NULL;
    *ngroups = p ? p->ngroups : 0;
    if (p && p->ngroups) *k0 = p->groups[0].k;
    *n = y ? kn_numel(y) : 0;
    if (p && (out = malloc(sizeof *out * (size_t)(2 * *n)))) {
        *sym = y->ndim && y->sym[0];
        if (*sym) kn_sym_set(ctx, y->sym[0], 96);
        bool ok = kn_plan_run(p) == KN_OK && kn_tensor_read(y, out, KN_F32) == KN_OK;
        if (*sym) ok = ok && kn_sym_set(ctx, y->sym[0], 7) == KN_OK && kn_plan_run(p) == KN_OK &&
                      kn_tensor_read(y, out + *n, KN_F32) == KN_OK;
        if (!ok) { free(out); out = NULL; }
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return out;
}

TEST(forced_choices_keep_the_bits) {
    set_env("KN_BEAM", NULL);
    char *src = malloc(1 << 16);
    for (size_t v = 0; v < sizeof g_variants / sizeof g_variants[0]; v++) {
        int ng0, ng1;
        kn_kernel k0, k1;
        int64_t n0, n1;
        bool sym = false;
        float *a = run_variant(g_variants[v], &ng0, &k0, &n0, &sym);
        if (!a && !ng0) { free(src); SKIP("no fused group (no C compiler?)"); }
        REQUIRE(a && ng0 >= 1, "graph %zu: %s", v, kn_last_error());
        REQUIRE(untuned_src(&k0, src, 1 << 16), "render");
        kn_ktune t = {.block = 512, .unroll = 8, .waves = 1, .grain = 3};
        CHECK(kn__tune_store(kn_backend_cpu(), src, &t), "store");
        kn__tune_forget();
        float *b = run_variant(g_variants[v], &ng1, &k1, &n1, &sym);
        REQUIRE(b && ng1 == ng0 && n1 == n0, "graph %zu again: %s", v, kn_last_error());
        kn_ktune want = kn__ktune_resolve(&k1, &t);
        CHECK(k1.tune.grain == 3 && k1.tune.unroll == want.unroll, "graph %zu: the choice applied (grain %lld unroll %d)",
              v, (long long)k1.tune.grain, k1.tune.unroll);
        CHECK(!memcmp(a, b, sizeof *a * (size_t)((sym ? 2 : 1) * n0)), "graph %zu: the forced choice changed the values", v);
        free(a); free(b);
    }
    free(src);
}

/* A stored choice whose source no longer builds (here: a C compiler that
 * rejects any source with an unroll pragma) falls back to the heuristic's
 * source; the group stays fused. */
TEST(a_stored_choice_that_fails_to_build_falls_back) {
    set_env("KN_BEAM", NULL);
    char cc[600];
    snprintf(cc, sizeof cc, "%s/cc_no_unroll.sh", g_dir);
    FILE *f = fopen(cc, "w");
    REQUIRE(f, "write %s", cc);
    fprintf(f, "#!/bin/sh\nfor a; do case \"$a\" in *.c) grep -q 'GCC unroll' \"$a\" && exit 1;; esac; done\nexec %s \"$@\"\n",
            getenv("KN_CC") && *getenv("KN_CC") ? getenv("KN_CC") : "cc");
    fclose(f);
    chmod(cc, 0700);
    const char *old = getenv("KN_CC");
    char *keep = old ? strdup(old) : NULL;
    set_env("KN_CC", cc);
    char *src = malloc(1 << 16);
    kn_plan *p;
    graph g;
    check_against_unfused(41, 77, &p, &g, NULL);   /* a shape of its own: sources not built before */
    if (!p || !p->ngroups) {
        kn_plan_free(p); kn_ctx_free(g.ctx); free(src); set_env("KN_CC", keep); free(keep);
        SKIP("no fused group (no C compiler?)");
    }
    REQUIRE(untuned_src(&p->groups[0].k, src, 1 << 16), "render");
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    kn_ktune t = {.unroll = 4, .grain = 500};
    CHECK(kn__tune_store(kn_backend_cpu(), src, &t), "store");
    check_against_unfused(41, 77, &p, &g, NULL);
    CHECK(p && p->ngroups == 1, "still fused: %d groups", p ? p->ngroups : -1);
    if (p && p->ngroups) CHECK(p->groups[0].k.tune.unroll == 0, "the heuristic's source: unroll %d", p->groups[0].k.tune.unroll);
    kn_plan_free(p);
    kn_ctx_free(g.ctx);
    set_env("KN_CC", keep);
    free(keep);
    free(src);
    unlink(cc);
}

#ifdef KN_CUDA
/* ---- CUDA ------------------------------------------------------------------------ */
TEST(nvrtc_compiles_unrolled_variants) {
    char why[4096];
    char *src = malloc(1 << 16);
    kn_kernel ks[3] = {elementwise(1000), elementwise((int64_t)3 << 30), elementwise(64)};
    /* [64, 33] with a broadcast row: the index decomposition in the loop */
    ks[2].ndim = 2; ks[2].ext[0] = 64; ks[2].ext[1] = 33; ks[2].sym[0] = 1; ks[2].mul[1] = 1;
    ks[2].buf[0].st[0] = 33; ks[2].buf[0].st[1] = 1; ks[2].buf[1].st[0] = 0; ks[2].buf[1].st[1] = 1;
    for (int i = 0; i < 3; i++)
        for (int u = 1; u <= 8; u *= 2) {
            kn_kernel k = ks[i];
            k.tune.unroll = u;
            REQUIRE(kn__render("cuda", &k, src, 1 << 16) > 0, "render");
            size_t n = 0;
            void *c = kn__cuda_jit_compile(src, 90, false, &n, NULL, 0, why, sizeof why);
            CHECK(c && n > 0, "kernel %d unroll %d: %.2000s\n%s", i, u, why, src);
            free(c);
            if (i == 1 && u > 1) CHECK(strstr(src, "long long base"), "2^31 items or more: 64-bit indices");
        }
    /* the varied graphs' kernels (bf16, f64 reduction, symbolic, normalisations), fused as a plan would */
    for (size_t v = 0; v < sizeof g_variants / sizeof g_variants[0]; v++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
        kn_tensor *out = g_variants[v](ctx), **order = NULL;
        kn_fgroup *groups = NULL;
        int n = 0, ng = 0;
        CHECK(out && kn__toposort(ctx, 1, &out, false, &order, &n) == KN_OK &&
              kn__fuse("cuda", order, n, ctx->n_all, 1, &out, NULL, NULL, &groups, &ng) && ng >= 1, "fuse graph %zu", v);
        for (int u = 1; u <= 8 && ng >= 1; u *= 4) {
            kn_kernel k = groups[0].k;
            k.tune.unroll = u;
            k.tune.block = 128;
            REQUIRE(kn__render("cuda", &k, src, 1 << 16) > 0, "render");
            size_t nb = 0;
            void *c = kn__cuda_jit_compile(src, 90, false, &nb, NULL, 0, why, sizeof why);
            CHECK(c && nb > 0, "graph %zu unroll %d: %.2000s\n%s", v, u, why, src);
            free(c);
        }
        free(groups);
        free(order);
        kn_ctx_free(ctx);
    }
    free(src);
}

/* The graphs on the GPU, fused and tuned (KN_BEAM=2) against unfused:
 * elementwise, a row sum, an rms_norm. */
static kn_tensor *gpu_graph(kn_ctx *ctx, int which) {
    int64_t shape[2] = {300, 1000};
    float *d = malloc(sizeof *d * 300 * 1000);
    for (int64_t i = 0; i < 300 * 1000; i++) d[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, shape, d);
    free(d);
    kn_tensor *y = kn_add(ctx, kn_unary(ctx, KN_OP_EXP, kn_mul_scalar(ctx, x, 0.5)), x);
    if (which == 2) return kn_rms_norm(ctx, y, 1, data(ctx, KN_F32, 1, (int64_t[]){1000}, 3), 1e-5);
    return which ? kn_sum(ctx, kn_unary(ctx, KN_OP_SQUARE, y), 1, (int[]){1}, false) : y;
}

TEST(gpu_beam_search) {
    kn_backend *be = kn_backend_cuda();
    if (!be) SKIP("no usable GPU (%.200s)", kn_last_error());
    set_env("KN_BEAM", "2");
    for (int which = 0; which < 3; which++) {
        kn_tune_stats s0, s1;
        kn__tune_stats(&s0);
        kn_ctx *cf = kn_ctx_new(&(kn_ctx_opts){.backend = be}), *cp = kn_ctx_new(&(kn_ctx_opts){.backend = be});
        kn_tensor *yf = gpu_graph(cf, which), *yp = gpu_graph(cp, which);
        kn_plan *pf = kn_plan_new(cf, 1, &yf, NULL), *pp = kn_plan_new(cp, 1, &yp, &(kn_plan_opts){.no_fuse = true});
        kn__tune_stats(&s1);
        CHECK(pf && pp && pf->ngroups >= 1, "plans: %s", kn_last_error());
        CHECK(s1.searches > s0.searches && s1.timed > s0.timed, "searched on the GPU");
        int64_t n = which == 1 ? 300 : 300 * 1000;
        float *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n);
        CHECK(pf && pp && kn_plan_run(pf) == KN_OK && kn_plan_run(pp) == KN_OK &&
              kn_tensor_read(yf, a, KN_F32) == KN_OK && kn_tensor_read(yp, b, KN_F32) == KN_OK, "run: %s", kn_last_error());
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) > 1 ? fabs((double)b[i]) : 1);
            if (!(e <= worst)) worst = e;
        }
        CHECK(worst <= (which ? 1e-4 : 1e-6), "graph %d: tuned fused vs unfused: relative %g", which, worst);
        free(a); free(b);
        kn_plan_free(pf); kn_plan_free(pp);
        kn_ctx_free(cf); kn_ctx_free(cp);
    }
    set_env("KN_BEAM", NULL);
}
#endif

static void empty_dir(const char *d) {
    DIR *dp = opendir(d);
    struct dirent *e;
    char p[1024];
    if (!dp) return;
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", d, e->d_name); unlink(p); }
    closedir(dp);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kn_search_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    set_env("KN_CACHE_DIR", g_dir);
    set_env("KN_NOFUSE", NULL);
    int r = kn_test_main();
    empty_dir(g_dir);
    rmdir(g_dir);
    return r;
}
