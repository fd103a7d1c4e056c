/* tune.c: the kernel search's device side (docs/COMPILER.md, "Kernel search").
 *
 * src/compile/search.c walks a generated kernel's tunables (kn_ktune: CUDA
 * threads per block, unroll, grid waves; C grain and unroll) but cannot run
 * anything: the compiler layer sees no backend buffers. This file gives it
 * its timing function (each variant rendered, built through kernels.c and
 * run on the plan's backend over zeroed scratch buffers sized for the
 * kernel's extents at the symbols' maxima), and keeps the results:
 *
 *   memo   per process: (backend, untuned source) -> choice (or "none")
 *   disk   core/kcache.h, kind "beam", device = where the kernel runs (CPU id
 *          and thread count; CUDA "sm_XY name"), source = the untuned source,
 *          blob = kn__ktune_str's text ("block=256 unroll=4 waves=8 grain=16384")
 *
 * Default runs (KN_BEAM unset or 0) read memo and disk and otherwise take the
 * heuristic: they never time anything. KN_BEAM=N searches (beam width N) the
 * kernels with no stored choice while a plan is built, prints one line per
 * kernel on stderr and stores the result. A variant that fails to build or
 * run is skipped; a search that cannot run at all leaves the heuristic.
 *
 * Non-goals: the hand kernels' variants (KN_CUDA_TUNE), searching while a
 * plan runs or is captured, timing with the plan's real data (zeros cost the
 * same for these memory-bound loops, NaN/denormal paths aside).
 */
#include "runtime/runtime.h"
#include "core/env.h"      // defines: kn_env_get (KN_BEAM)
#include "core/kcache.h"   // defines: kn__kcache_get, kn__kcache_put
#include "core/cpu.h"      // defines: kn_cpu_id
#include "backends/cpu/threadpool.h"   // defines: kn_pool_nthreads
#ifdef KN_CUDA
#include "backends/cuda/cuda_jit.h"    // defines: kn__cuda_jit_device
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- launches --------------------------------------------------------------- */
void kn__kernel_launch_fill(const kn_backend *be, const kn_kernel *k, const int64_t *syms, kn_kernel_launch *l) {
    kn_ktune t = kn__ktune_resolve(k, &k->tune);
    l->a.syms = syms;
    kn__kernel_items(k, syms, &l->a.n, &l->n_max);
    l->grain = t.grain;
    l->err_op = k->err_op;   /* index checks: the backend points a.err at its per-op error slots */
    if (be->kernel_lang && !strcmp(be->kernel_lang, "cuda")) {
        l->block = t.block;
        l->waves = t.waves;
        /* a reduction runs a block per item: n sizes the grid in threads */
        if (k->red != KN_OP_NONE) { l->a.n *= t.block; l->n_max *= t.block; }
        /* vectors of 8 items: a thread each */
        int v = kn__kernel_vec(k);
        if (v > 1) { l->a.n = (l->a.n + v - 1) / v; l->n_max = (l->n_max + v - 1) / v; }
    }
}

/* ---- the memo and the disk cache ---------------------------------------------- */
typedef struct memo {
    struct memo *next;
    const kn_backend *be;
    uint64_t hash;
    char *src;
    bool found;        /* a stored or searched choice; false: looked up, none (the heuristic) */
    bool failed;       /* a search could not time it: not tried again in this process */
    kn_ktune t;
} memo;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static memo *g_memo[256];
static kn_tune_stats g_stats;

static memo *memo_find(const kn_backend *be, const char *src, uint64_t h) {
    for (memo *m = g_memo[h & 255]; m; m = m->next)
        if (m->be == be && m->hash == h && !strcmp(m->src, src)) return m;
    return NULL;
}

/* remembers (found, t) for src; out of memory: not remembered (asked again) */
static void memo_set(const kn_backend *be, const char *src, bool found, const kn_ktune *t) {
    uint64_t h = kn__fnv1a(src, strlen(src));
    memo *m = memo_find(be, src, h);
    if (!m) {
        m = calloc(1, sizeof *m);
        char *copy = m ? malloc(strlen(src) + 1) : NULL;
        if (!copy) { free(m); return; }
        strcpy(copy, src);
        *m = (memo){g_memo[h & 255], be, h, copy, false, false, {0}};
        g_memo[h & 255] = m;
    }
    m->found = found;
    m->t = found ? *t : (kn_ktune){0};
}

void kn__tune_forget(void) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < 256; i++)
        while (g_memo[i]) { memo *m = g_memo[i]; g_memo[i] = m->next; free(m->src); free(m); }
    pthread_mutex_unlock(&g_lock);
}

void kn__tune_stats(kn_tune_stats *s) {
    pthread_mutex_lock(&g_lock);
    *s = g_stats;
    pthread_mutex_unlock(&g_lock);
}

/* Where the kernel runs, for the cache key: the best launch depends on the
 * chip and, on the CPU, on how many threads share the work. */
static void device_id(const kn_backend *be, char *out, size_t cap) {
#ifdef KN_CUDA
    if (be->kernel_lang && !strcmp(be->kernel_lang, "cuda")) {
        const char *d = kn__cuda_jit_device();
        snprintf(out, cap, "%s %s", be->name, d ? d : "(no GPU)");
        return;
    }
#endif
    if (be->device == KN_DEVICE_HOST) snprintf(out, cap, "%s %s threads=%d", be->name, kn_cpu_id(), kn_pool_nthreads());
    else snprintf(out, cap, "%s", be->name);
}

static kn_kcache_key cache_key(const kn_backend *be, const char *src, char *dev, size_t cap) {
    device_id(be, dev, cap);
    return (kn_kcache_key){"beam", dev, be->kernel_lang ? be->kernel_lang : "", "", src};
}

/* disk only; the caller holds g_lock */
static bool disk_get(const kn_backend *be, const char *src, kn_ktune *t) {
    char dev[512];
    kn_kcache_key key = cache_key(be, src, dev, sizeof dev);
    size_t n = 0;
    char *blob = kn__kcache_get(&key, &n);
    if (!blob) return false;
    char text[128];
    size_t m = n < sizeof text - 1 ? n : sizeof text - 1;
    memcpy(text, blob, m);
    text[m] = 0;
    free(blob);
    return kn__ktune_parse(text, t);
}

bool kn__tune_lookup(kn_backend *be, const char *src, kn_ktune *t) {
    pthread_mutex_lock(&g_lock);
    memo *m = memo_find(be, src, kn__fnv1a(src, strlen(src)));
    bool found = m && m->found;
    if (found) *t = m->t;
    else if (!m) {
        found = disk_get(be, src, t);
        memo_set(be, src, found, t);
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

bool kn__tune_store(kn_backend *be, const char *src, const kn_ktune *t) {
    char text[128], dev[512];
    if (kn__ktune_str(t, text, sizeof text) < 0) return false;
    pthread_mutex_lock(&g_lock);
    memo_set(be, src, true, t);
    kn_kcache_key key = cache_key(be, src, dev, sizeof dev);
    bool ok = kn__kcache_put(&key, text, strlen(text));
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* ---- timing ------------------------------------------------------------------- */
typedef struct timer {
    kn_backend *be;
    char *buf[KN_KERNEL_MAXBUF];     /* element 0 of each scratch operand */
    void *mem[KN_KERNEL_MAXBUF];     /* what be->alloc returned */
    int64_t syms[KN_MAX_SYMS + 1];   /* every symbol at its maximum */
    char *src;
    size_t cap;
} timer;

static kn_status sync_be(kn_backend *be) { return be->synchronize ? be->synchronize(be) : KN_OK; }

static void timer_free(timer *tm) {
    sync_be(tm->be);   /* a failed variant may have left launches queued on the scratch */
    for (int i = 0; i < KN_KERNEL_MAXBUF; i++) if (tm->mem[i]) tm->be->free(tm->be, tm->mem[i]);
    free(tm->src);
}

/* Scratch for each of k's buffers over the extents at the symbols' maxima
 * (a negative stride walks below element 0: the block is placed so that it
 * stays inside), zero-filled. */
static bool timer_init(timer *tm, kn_backend *be, const kn_kernel *k) {
    memset(tm, 0, sizeof *tm);
    tm->be = be;
    for (int d = 0; d < k->ndim; d++)
        if (k->sym[d] > 0 && k->sym[d] <= KN_MAX_SYMS) tm->syms[k->sym[d]] = k->mul[d] ? k->ext[d] / k->mul[d] : k->ext[d];
    tm->cap = 1 << 16;
    tm->src = malloc(tm->cap);
    if (!tm->src) return false;
    void *zero = NULL;
    size_t zcap = 0;
    bool ok = true;
    for (int i = 0; i < k->nbuf && ok; i++) {
        int64_t lo = 0, hi = 0;
        for (int d = 0; d < k->ndim; d++) {
            int64_t s = (k->ext[d] - 1) * k->buf[i].st[d];
            if (s < 0) lo += s; else hi += s;
        }
        size_t es = kn_dtype_get(k->buf[i].dt)->type_size, bytes = (size_t)(hi - lo + 1) * es;
        if (bytes > zcap) { free(zero); zcap = bytes; zero = calloc(1, zcap); }
        tm->mem[i] = zero ? be->alloc(be, bytes) : NULL;
        ok = tm->mem[i] && be->copy_in(be, tm->mem[i], zero, bytes) == KN_OK;
        if (ok) tm->buf[i] = (char *)tm->mem[i] + (size_t)(-lo) * es;
    }
    free(zero);
    return ok;
}

static kn_status run_once(timer *tm, const kn_kernel *k, void *h) {
    kn_kernel_launch l;
    memset(&l, 0, sizeof l);
    memcpy(l.a.buf, tm->buf, sizeof l.a.buf);
    kn__kernel_launch_fill(tm->be, k, tm->syms, &l);
    if (l.a.n <= 0) return KN_OK;
    return tm->be->kernel_run(tm->be, h, &l);
}

/* search.c's kn_ktime_fn: the fastest of 5 measurements, each the mean of
 * enough launches to last about a millisecond (at most 64), after a launch
 * that loads the code and one that sizes the measurements. */
static double time_variant(void *ctx, const kn_kernel *k, const kn_ktune *t) {
    timer *tm = ctx;
    kn_backend *be = tm->be;
    kn_kernel kk = *k;
    kk.tune = *t;
    if (kn__render(be->kernel_lang, &kk, tm->src, tm->cap) <= 0) return -1;
    void *h = kn__kernel_get(be, tm->src, kk.name, true);   /* a variant that does not build is dropped by the search */
    if (!h) return -1;
    pthread_mutex_lock(&g_lock);
    g_stats.timed++;
    pthread_mutex_unlock(&g_lock);
    if (be->version >= 2 && be->syms_upload && be->syms_upload(be, tm->syms, KN_MAX_SYMS) != KN_OK) return -1;
    if (run_once(tm, &kk, h) != KN_OK || sync_be(be) != KN_OK) return -1;   /* first touch of new code */
    double t0 = kn__profile_now();
    if (run_once(tm, &kk, h) != KN_OK || sync_be(be) != KN_OK) return -1;
    double one = kn__profile_now() - t0;
    int reps = one > 0 ? (int)(1e-3 / one) : 64;
    reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
    double best = INFINITY;
    for (int trial = 0; trial < 5; trial++) {
        t0 = kn__profile_now();
        for (int r = 0; r < reps; r++)
            if (run_once(tm, &kk, h) != KN_OK) return -1;
        if (sync_be(be) != KN_OK) return -1;
        double dt = (kn__profile_now() - t0) / reps;
        if (dt < best) best = dt;
    }
    if (kn_env_get()->debug) {
        char text[128];
        kn__ktune_str(t, text, sizeof text);
        fprintf(stderr, "kiln: beam:   %s %s: %.4f ms (%d launches x 5)\n", kk.name, text, best * 1e3, reps);
    }
    return best;
}

/* ---- the choice for a plan's kernel --------------------------------------------- */
static bool search(kn_backend *be, kn_kernel *k, const char *src, int width) {
    timer tm;
    kn_beam_result r;
    /* a search costs builds and timings once per kernel and device: a few
     * rounds, a bounded number of variants; a gain under 3% is noise */
    if (width > 16) width = 16;   /* search.c's cap too */
    kn_beam_opts o = {.width = width, .max_rounds = 4, .max_timed = 24 + 8 * width, .min_gain = 0.03};
    kn_kernel k0 = *k;
    k0.tune = (kn_ktune){0};
    char name[sizeof k->name];
    memcpy(name, k->name, sizeof name);   /* the untuned kernel's (kn__render named it) */
    bool ok = timer_init(&tm, be, &k0) && kn__beam_search(&k0, be->kernel_lang, &o, time_variant, &tm, &r);
    timer_free(&tm);
    pthread_mutex_lock(&g_lock);
    g_stats.searches++;
    pthread_mutex_unlock(&g_lock);
    if (!ok) {
        fprintf(stderr, "kiln: beam: %s: could not time the kernel on %s (%s); the heuristic stays\n",
                name, be->name, kn_last_error());
        pthread_mutex_lock(&g_lock);
        memo_set(be, src, false, NULL);
        memo *m = memo_find(be, src, kn__fnv1a(src, strlen(src)));
        if (m) m->failed = true;   /* not retried in this process */
        pthread_mutex_unlock(&g_lock);
        return false;
    }
    char text[128];
    kn__ktune_str(&r.best, text, sizeof text);
    fprintf(stderr, "kiln: beam: %s %.4f ms -> %.4f ms (%s; %d variants timed, %d rounds)\n",
            name, r.t_default * 1e3, r.t_best * 1e3, text, r.ntimed, r.rounds);
    kn__tune_store(be, src, &r.best);
    k->tune = r.best;
    return true;
}

bool kn__tune_pick(kn_backend *be, kn_kernel *k, const char *src) {
    pthread_mutex_lock(&g_lock);
    g_stats.picks++;
    pthread_mutex_unlock(&g_lock);
    k->tune = (kn_ktune){0};
    if (k->nseg > 1) return false;   /* several item spaces: the timer sizes buffers by one space; the heuristic */
    int width = kn_env_get()->beam;
    kn_ktune t;
    if (kn__tune_lookup(be, src, &t)) {
        pthread_mutex_lock(&g_lock);
        g_stats.hits++;
        pthread_mutex_unlock(&g_lock);
        k->tune = kn__ktune_resolve(k, &t);   /* a reduction's stored unroll means nothing */
    } else if (width > 0) {
        pthread_mutex_lock(&g_lock);
        memo *m = memo_find(be, src, kn__fnv1a(src, strlen(src)));
        bool failed = m && m->failed;
        pthread_mutex_unlock(&g_lock);
        if (!failed) search(be, k, src, width);
    }
    /* a choice was applied: render again. unroll changes any kernel's
     * source, and a CUDA row normalisation's block is in it too (the stride
     * of its register row): a launch with the chosen block over the
     * default's source computed wrong rows */
    return k->tune.block || k->tune.unroll || k->tune.waves || k->tune.grain;
}
