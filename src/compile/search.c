/* search.c: BEAM search over a generated kernel's tunables (kernel.h,
 * kn_ktune; docs/COMPILER.md, "Kernel search"), as tinygrad's BEAM does it.
 *
 * The search knows kernels and tunables, not devices: the caller gives it a
 * timing function (the runtime renders, builds and runs each variant on the
 * plan's backend: src/runtime/tune.c), so this file stays in the compiler
 * layer, below the runtime, and tests can give it a synthetic cost.
 *
 * An action sets one field to one value of its list (below); a variant is
 * the heuristic default with some actions applied. Each round applies every
 * action to each variant of the beam, times the variants never timed
 * before, and keeps the `width` fastest of beam and new variants; the
 * search stops when a round's best does not beat the best so far by
 * min_gain, after max_rounds rounds, or when max_timed timings were spent.
 * Then the default and the winner are timed once more, back to back (the
 * default's first timing may have paid for a cold cache or a busy
 * machine), and the winner is kept only if it still wins by min_gain.
 *
 * Non-goals: tiling, split-K and vector types (the generated kernels are
 * memory-bound elementwise loops, row reductions and normalisations; their
 * tunables are the launch shape and the unroll), and the hand kernels'
 * variants.
 */
#include "compile/kernel.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAIN_DEFAULT 16384   /* C: items worth a thread (exec.c used it before the search) */

static int64_t reduced_extent(const kn_kernel *k) {
    int64_t rn = 1;
    for (int d = 0; d < k->ndim; d++) if (k->redd[d]) rn *= k->ext[d];
    return rn;
}

kn_ktune kn__ktune_resolve(const kn_kernel *k, const kn_ktune *t) {
    kn_ktune r = t ? *t : (kn_ktune){0};
    bool red = k->red != KN_OP_NONE;
    if (r.block <= 0) r.block = red && k->block > 0 ? k->block : 256;
    if (r.unroll <= 0 || red || kn__kernel_indexed(k) || k->nseg > 1) r.unroll = 1;   /* reductions, rope, scatter, segments: once */
    if (r.waves <= 0) r.waves = 8;
    if (r.grain <= 0) {
        /* a reduction's item is a whole reduced row: fewer of them per thread */
        int64_t rn = red ? reduced_extent(k) : 1;
        r.grain = GRAIN_DEFAULT / rn > 1 ? GRAIN_DEFAULT / rn : 1;
    }
    return r;
}

int kn__ktune_str(const kn_ktune *t, char *buf, size_t cap) {
    int w = snprintf(buf, cap, "block=%d unroll=%d waves=%d grain=%lld", t->block, t->unroll, t->waves, (long long)t->grain);
    return w < 0 || (size_t)w >= cap ? -1 : w;
}

bool kn__ktune_parse(const char *s, kn_ktune *t) {
    kn_ktune r = {0};
    int got = 0;
    while (s && *s) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == ',') s++;
        if (!*s) break;
        const char *eq = strchr(s, '=');
        if (!eq) return false;
        char *end;
        long long v = strtoll(eq + 1, &end, 10);
        if (end == eq + 1 || v <= 0 || v > ((long long)1 << 40)) return false;
        size_t n = (size_t)(eq - s);
        if (n == 5 && !strncmp(s, "block", 5) && v <= 1024) r.block = (int)v, got++;
        else if (n == 6 && !strncmp(s, "unroll", 6) && v <= 64) r.unroll = (int)v, got++;
        else if (n == 5 && !strncmp(s, "waves", 5) && v <= 1024) r.waves = (int)v, got++;
        else if (n == 5 && !strncmp(s, "grain", 5)) r.grain = v, got++;
        else if ((n == 5 && (!strncmp(s, "block", 5) || !strncmp(s, "waves", 5))) || (n == 6 && !strncmp(s, "unroll", 6)))
            return false;   /* a known field out of range */
        s = end;
    }
    if (!got) return false;
    *t = r;
    return true;
}

/* ---- actions ------------------------------------------------------------------ */
typedef enum { F_BLOCK, F_UNROLL, F_WAVES, F_GRAIN } field;
typedef struct { field f; int64_t v; } action;
#define MAX_ACTIONS 32

/* The actions for k in lang. CUDA: threads per block (whole warps: the
 * reduction combines warps with shuffles), the unroll of elementwise
 * kernels, the grid cap in waves. C: the grain around its default (the
 * number of threads a launch uses) and the inner loop's unroll. */
static int actions(const kn_kernel *k, const char *lang, action *a) {
    bool red = k->red != KN_OP_NONE, cuda = !strcmp(lang, "cuda");
    int n = 0;
    if (cuda) {
        static const int blocks[] = {32, 64, 128, 256, 512, 1024}, waves[] = {1, 2, 4, 8, 16, 32};
        for (size_t i = red ? 0 : 1; i < sizeof blocks / sizeof blocks[0]; i++) a[n++] = (action){F_BLOCK, blocks[i]};
        for (size_t i = 0; i < sizeof waves / sizeof waves[0]; i++) a[n++] = (action){F_WAVES, waves[i]};
    } else {
        int64_t g0 = kn__ktune_resolve(k, NULL).grain;
        static const int shifts[] = {-3, -2, -1, 1, 2, 3};
        for (size_t i = 0; i < sizeof shifts / sizeof shifts[0]; i++) {
            int64_t g = shifts[i] < 0 ? g0 >> -shifts[i] : g0 << shifts[i];
            if (g >= 1 && (n == 0 || a[n - 1].v != g)) a[n++] = (action){F_GRAIN, g};
        }
    }
    if (!red && !kn__kernel_indexed(k) && k->nseg <= 1) {
        static const int unrolls[] = {1, 2, 4, 8};
        for (size_t i = 0; i < sizeof unrolls / sizeof unrolls[0]; i++) a[n++] = (action){F_UNROLL, unrolls[i]};
    }
    return n;
}

/* t with action a applied; false when that changes nothing */
static bool apply(const kn_ktune *t, action a, kn_ktune *out) {
    *out = *t;
    switch (a.f) {
    case F_BLOCK: if (t->block == a.v) return false; out->block = (int)a.v; break;
    case F_UNROLL: if (t->unroll == a.v) return false; out->unroll = (int)a.v; break;
    case F_WAVES: if (t->waves == a.v) return false; out->waves = (int)a.v; break;
    case F_GRAIN: if (t->grain == a.v) return false; out->grain = a.v; break;
    }
    return true;
}

static bool same(const kn_ktune *a, const kn_ktune *b) {
    return a->block == b->block && a->unroll == b->unroll && a->waves == b->waves && a->grain == b->grain;
}

/* ---- the search --------------------------------------------------------------- */
typedef struct { kn_ktune t; double c; } timed;   /* c: seconds, INFINITY when it did not run */

static int by_cost(const void *x, const void *y) {
    double a = ((const timed *)x)->c, b = ((const timed *)y)->c;
    return a < b ? -1 : a > b ? 1 : 0;
}

bool kn__beam_search(const kn_kernel *k, const char *lang, const kn_beam_opts *o, kn_ktime_fn time_fn,
                     void *ctx, kn_beam_result *r) {
    memset(r, 0, sizeof *r);
    r->t_default = r->t_best = INFINITY;
    if (!k || !lang || !time_fn) return false;
    kn_ktune def = kn__ktune_resolve(k, NULL);
    r->best = def;
    int width = o && o->width > 0 ? o->width : 1;
    int max_rounds = o && o->max_rounds > 0 ? o->max_rounds : 8;
    int max_timed = o && o->max_timed > 0 ? o->max_timed : 64;
    double min_gain = o && o->min_gain > 0 ? o->min_gain : 0;
    if (width > 16) width = 16;
    action act[MAX_ACTIONS];
    int nact = actions(k, lang, act);
    /* every variant timed (a variant reached twice is not timed again), and
     * this round's pool: the beam and its new children */
    timed *seen = malloc(sizeof *seen * (size_t)max_timed);
    timed *pool = malloc(sizeof *pool * (size_t)(width + width * nact));
    if (!seen || !pool) { free(seen); free(pool); return false; }
    int nseen = 0;
    double c0 = time_fn(ctx, k, &def);
    r->ntimed = 1;
    if (!(c0 >= 0) || !isfinite(c0)) { free(seen); free(pool); return false; }
    seen[nseen++] = (timed){def, c0};
    r->t_default = r->t_best = c0;
    timed beam[16] = {{def, c0}};
    int nbeam = 1;
    for (int round = 0; round < max_rounds && r->ntimed < max_timed; round++) {
        int np = 0;
        for (int bi = 0; bi < nbeam; bi++) pool[np++] = beam[bi];
        int nnew = 0;
        for (int bi = 0; bi < nbeam; bi++)
            for (int ai = 0; ai < nact && r->ntimed < max_timed; ai++) {
                kn_ktune v;
                if (!apply(&beam[bi].t, act[ai], &v)) continue;
                bool old = false;
                for (int s = 0; s < nseen && !old; s++) old = same(&seen[s].t, &v);
                if (old) continue;
                double c = time_fn(ctx, k, &v);
                r->ntimed++;
                if (!(c >= 0) || !isfinite(c)) c = INFINITY;
                seen[nseen++] = (timed){v, c};
                if (isfinite(c)) { pool[np++] = (timed){v, c}; nnew++; }
            }
        if (!nnew) break;
        qsort(pool, (size_t)np, sizeof *pool, by_cost);
        if (!(pool[0].c < r->t_best * (1 - min_gain))) break;   /* no gain this round: the beam stays */
        nbeam = np < width ? np : width;
        memcpy(beam, pool, sizeof *beam * (size_t)nbeam);
        r->best = beam[0].t;
        r->t_best = beam[0].c;
        r->rounds = round + 1;
    }
    /* the default was timed first and the winner maybe long ago: time both
     * again, one after the other, and keep the winner only if it still wins */
    if (!same(&r->best, &def) && r->ntimed + 2 <= max_timed) {
        double cd = time_fn(ctx, k, &def), cb = time_fn(ctx, k, &r->best);
        r->ntimed += 2;
        if (cd >= 0 && isfinite(cd)) {
            r->t_default = cd;
            if (cb >= 0 && isfinite(cb) && cb < cd * (1 - min_gain)) r->t_best = cb;
            else { r->best = def; r->t_best = cd; }
        }
    }
    free(seen);
    free(pool);
    return true;
}
