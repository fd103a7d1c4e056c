/* test_fuse.c: elementwise fusion and generated kernels (src/compile/fuse.c,
 * render.c; docs/COMPILER.md).
 *
 * The harness builds one graph three times, in three contexts with the same
 * data: on the reference backend (the oracle), and on the fast backend (the
 * default, KN_BACKEND) planned with fusion and without (kn_plan_opts.no_fuse).
 * It runs the plans and checks fused against unfused and against the
 * reference, element by element (NaN where the other has NaN, infinities of
 * the same sign, finite values within the dtype's tolerance), and that the
 * fused plan did fuse what the case expects (groups, kernels per run), never
 * needed more memory, and did not fuse what it must not.
 *
 * Graphs: random chains of unary and binary ops of the op table over odd
 * shapes, with broadcast operands, transposed (non-contiguous) views, scalar
 * constants, casts between f32, f16 and bf16, intermediate values that are
 * also outputs, and symbolic extents run at several values.
 */
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"
#include "core/env.h"
#include <stdint.h>

#define MAXO 4
#define MAXIN 6

typedef struct {
    uint32_t seed;
    kn_dtype dt;
    int ndim;
    int64_t shape[4];
    int nops;
    int sym;            /* dim 0 is symbolic: run at these values */
    bool mm;            /* 2-d: the operands x, y are matmul results (arena values a group may write over) */
} gcase;

static uint32_t rnd(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* Inputs: x, y (full shape), w (last dim only, broadcast), t (transposed
 * view of a [.., last, prev] tensor), all in [-2, 2) with a few specials. */
typedef struct { kn_tensor *in[MAXIN]; int nin; } inputs;

static kn_tensor *rand_data(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *d = malloc(sizeof *d * (size_t)(n ? n : 1));
    uint32_t s = seed;
    for (int64_t i = 0; i < n; i++) d[i] = (float)rnd(&s) / (float)(1u << 24) * 4.0f - 2.0f;
    if (n > 7) { d[3] = NAN; d[5] = INFINITY; d[6] = -0.0f; }
    kn_tensor *f = kn_from_data(ctx, KN_F32, ndim, shape, d);
    free(d);
    return dt == KN_F32 ? f : kn_cast(ctx, f, dt);
}

/* The graph of case c in ctx; returns the number of outputs. The random
 * choices depend on c->seed only, so the three builds are the same graph. */
static int build(kn_ctx *ctx, const gcase *c, kn_tensor **outs) {
    uint32_t s = c->seed;
    int nd = c->ndim;
    int64_t shape[4], wsh[1] = {c->shape[nd - 1]}, tsh[4];
    memcpy(shape, c->shape, sizeof shape);
    kn_tensor *v[64];
    int nv = 0;
    kn_tensor *x = rand_data(ctx, c->dt, nd, shape, c->seed + 1);
    if (c->mm && nd == 2) {   /* x = a @ b: computed in the plan's arena */
        int64_t ash[2] = {shape[0], 8}, bsh[2] = {8, shape[1]};
        x = kn_matmul(ctx, rand_data(ctx, KN_F32, 2, ash, c->seed + 11), rand_data(ctx, KN_F32, 2, bsh, c->seed + 12));
        if (c->dt != KN_F32) x = kn_cast(ctx, x, c->dt);
    }
    if (c->sym) {
        int sy = kn_sym_new(ctx, "T", shape[0]);
        x = kn_slice_sym(ctx, x, 0, 0, sy);
    }
    v[nv++] = x;
    if (!c->sym) {
        kn_tensor *y = rand_data(ctx, c->dt, nd, shape, c->seed + 2);
        if (c->mm && nd == 2) {
            int64_t ash[2] = {shape[0], 8}, bsh[2] = {8, shape[1]};
            y = kn_matmul(ctx, rand_data(ctx, KN_F32, 2, ash, c->seed + 13), rand_data(ctx, KN_F32, 2, bsh, c->seed + 14));
            if (c->dt != KN_F32) y = kn_cast(ctx, y, c->dt);
        }
        v[nv++] = y;
        v[nv++] = rand_data(ctx, KN_F32, 1, wsh, c->seed + 3);
        if (nd >= 2) {
            memcpy(tsh, shape, sizeof tsh);
            tsh[nd - 1] = shape[nd - 2]; tsh[nd - 2] = shape[nd - 1];
            int perm[4] = {0, 1, 2, 3};
            perm[nd - 1] = nd - 2; perm[nd - 2] = nd - 1;
            v[nv++] = kn_permute(ctx, rand_data(ctx, c->dt, nd, tsh, c->seed + 4), perm);
        }
    } else {
        v[nv++] = rand_data(ctx, KN_F32, 1, wsh, c->seed + 3);
    }
    static const kn_op un[] = {KN_OP_NEG, KN_OP_EXP, KN_OP_TANH, KN_OP_SIGMOID, KN_OP_SILU, KN_OP_GELU, KN_OP_ABS,
                               KN_OP_SQUARE, KN_OP_RELU, KN_OP_SIN, KN_OP_GELU_TANH, KN_OP_SOFTPLUS};   /* no floor: 1-ulp differences jump at integers */
    static const kn_op bin[] = {KN_OP_ADD, KN_OP_SUB, KN_OP_MUL, KN_OP_DIV, KN_OP_MAXIMUM, KN_OP_MINIMUM};
    int nin = nv;
    kn_tensor *cur = v[0];
    int nout = 0;
    for (int i = 0; i < c->nops; i++) {
        int r = (int)(rnd(&s) % 10);
        if (r < 4) cur = kn_unary(ctx, un[rnd(&s) % (sizeof un / sizeof un[0])], cur);
        else if (r < 8) cur = kn_binary(ctx, bin[rnd(&s) % (sizeof bin / sizeof bin[0])], cur, v[rnd(&s) % (unsigned)nv]);
        else if (r == 8) cur = kn_mul_scalar(ctx, cur, 0.5 + (double)(rnd(&s) % 7));
        else cur = kn_cast(ctx, cur, cur->dtype == KN_F32 ? c->dt : KN_F32);
        v[nv < 63 ? nv++ : 63] = cur;
        /* now and then an intermediate value is an output too */
        if (nout < MAXO - 1 && i < c->nops - 1 && rnd(&s) % 5 == 0) outs[nout++] = cur;
    }
    (void)nin;
    /* a third of the chains end in a reduction over the last dim, the last two or
     * all; a third in a row normalisation (rms, layer, softmax, log_softmax) */
    uint32_t end = rnd(&s) % 6;
    if (end >= 4) {
        kn_tensor *w = rand_data(ctx, KN_F32, 1, wsh, c->seed + 5), *bb = rand_data(ctx, KN_F32, 1, wsh, c->seed + 6);
        switch (rnd(&s) % 4) {
        case 0: cur = kn_rms_norm(ctx, cur, 1, w, 1e-5); break;
        case 1: cur = kn_layer_norm(ctx, cur, 1, w, bb, 1e-5); break;
        case 2: cur = kn_softmax(ctx, cur, -1); break;
        default: cur = kn_log_softmax(ctx, cur, -1); break;
        }
    } else if (end >= 2) {
        static const kn_op red[] = {KN_OP_SUM, KN_OP_MEAN, KN_OP_MAX, KN_OP_MIN};
        int which = (int)(rnd(&s) % 4), axes[2] = {nd - 1, nd - 2};
        int nax = which == 0 || nd < 2 ? 1 : which == 1 ? 2 : which == 2 ? 0 : 1;
        if (which == 3 && nd >= 2) axes[0] = 0;   /* the last dim kept: column sums */
        if (c->sym && (nax != 1 || axes[0] == 0)) { nax = 1; axes[0] = nd - 1; }   /* symbolic dim 0 stays kept: read_f32 reads rows */
        cur = kn_reduce(ctx, red[rnd(&s) % 4], cur, nax, axes, rnd(&s) % 2);
    }
    if (c->mm && nout > 0) {   /* read a stored intermediate after the group: its buffer must survive */
        kn_tensor *k1 = kn_sum(ctx, outs[0], 0, NULL, false);
        outs[0] = kn_add(ctx, kn_cast(ctx, k1, KN_F32), kn_cast(ctx, kn_sum(ctx, cur, 0, NULL, false), KN_F32));
    }
    outs[nout++] = cur;
    return nout;
}

/* f32 copy of an output (any float dtype): *n elements at the current
 * extents (kn_tensor_read reads the maximum extents; only dim 0 is symbolic
 * here, so the current ones come first) */
static float *read_f32(kn_tensor *t, int64_t *n) {
    int64_t nmax = 1;
    *n = 1;
    kn_ctx *ctx = t->ctx;
    for (int i = 0; i < t->ndim; i++) { *n *= kn__extent(t, i, ctx->sym_val); nmax *= t->shape[i]; }
    float *d = malloc(sizeof *d * (size_t)(nmax ? nmax : 1));
    if (kn_tensor_read(t, d, KN_F32) != KN_OK) { free(d); return NULL; }
    return d;
}

/* agree within tol, as values: NaN with NaN, inf with inf of that sign */
static int64_t mismatches(const float *a, const float *b, int64_t n, double tol, int64_t *first) {
    int64_t bad = 0;
    *first = -1;
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        if (isnan(a[i]) || isnan(b[i])) ok = isnan(a[i]) && isnan(b[i]);
        else if (isinf(a[i]) || isinf(b[i])) ok = a[i] == b[i] || fabs((double)a[i] - b[i]) <= tol * fabs((double)b[i]);
        else ok = fabs((double)a[i] - b[i]) <= tol * (1.0 + fabs((double)b[i]));
        if (!ok) { if (*first < 0) *first = i; bad++; }
    }
    return bad;
}

typedef struct { int ngroups, nred, nnorm, nkern_fused, nkern_plain; size_t peak_fused, peak_plain; bool ok; } run_result;

/* runtime/plan.c's memory rule: fusion may raise the arena by 1/16, or by
 * 1 MiB where that is more */
static size_t fuse_mem_bound(size_t plain) { return plain + (plain / 16 > ((size_t)1 << 20) ? plain / 16 : ((size_t)1 << 20)); }

static bool jit_available(void) {
    kn_backend *be = kn_backend_default();
    return be->version >= 2 && be->kernel_lang && !kn_env_get()->nofuse;
}
/* the default backend renders CUDA: rope, gathers, scatters and segments fuse */
static bool cuda_fuses(void) { return jit_available() && !strcmp(kn_backend_default()->kernel_lang, "cuda"); }

/* Builds c three times, runs, compares. */
static run_result run_case(const gcase *c) {
    run_result rr = {0};
    kn_ctx *cr = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_ctx *cf = kn_ctx_new(NULL), *cp = kn_ctx_new(NULL);
    kn_tensor *or_[MAXO], *of[MAXO], *op[MAXO];
    int no = build(cr, c, or_);
    build(cf, c, of);
    build(cp, c, op);
    kn_plan *pr = kn_plan_new(cr, no, or_, NULL);
    kn_plan *pf = kn_plan_new(cf, no, of, NULL);
    kn_plan *pp = kn_plan_new(cp, no, op, &(kn_plan_opts){.no_fuse = true});
    if (!pr || !pf || !pp) { CHECK(false, "plan: %s", kn_last_error()); goto done; }
    rr.ngroups = pf->ngroups;
    for (int gi = 0; gi < pf->ngroups; gi++) {
        rr.nred += pf->groups[gi].k.red != KN_OP_NONE;
        rr.nnorm += kn__is_rownorm(pf->groups[gi].k.red);
    }
    rr.nkern_fused = kn_plan_n_kernels(pf);
    rr.nkern_plain = kn_plan_n_kernels(pp);
    rr.peak_fused = kn_plan_peak_bytes(pf);
    rr.peak_plain = kn_plan_peak_bytes(pp);
    rr.ok = true;
    int64_t vals[3] = {c->shape[0], 1, c->shape[0] > 2 ? c->shape[0] - 2 : 1};
    for (int run = 0; run < (c->sym ? 3 : 1); run++) {
        if (c->sym) {
            kn_sym_set(cr, 1, vals[run]); kn_sym_set(cf, 1, vals[run]); kn_sym_set(cp, 1, vals[run]);
        }
        if (kn_plan_run(pr) || kn_plan_run(pf) || kn_plan_run(pp)) { CHECK(false, "run: %s", kn_last_error()); rr.ok = false; break; }
        double tol = c->dt == KN_F64 ? 1e-6 : c->dt == KN_F32 ? 2e-5 : c->dt == KN_F16 ? 4e-3 : 3e-2;
        for (int o = 0; o < no; o++) {
            int64_t n1, n2, n3, at;
            float *a = read_f32(of[o], &n1), *b = read_f32(op[o], &n2), *r = read_f32(or_[o], &n3);
            if (!a || !b || !r || n1 != n2 || n1 != n3) { CHECK(false, "read output %d", o); rr.ok = false; }
            else {
                int64_t bad = mismatches(a, b, n1, tol, &at);
                if (bad && getenv("KN_TEST_SEED")) for (int64_t q = 0; q < n1; q++) if (a[q] != b[q] && !(isnan(a[q]) && isnan(b[q]))) fprintf(stderr, "  [%lld] fused %.9g unfused %.9g ref %.9g\n", (long long)q, a[q], b[q], r[q]);
                if (bad) { CHECK(false, "seed %u output %d: fused vs unfused: %lld of %lld differ, first [%lld] %g vs %g",
                                 c->seed, o, (long long)bad, (long long)n1, (long long)at, a[at], b[at]); rr.ok = false; }
                /* the reference computes matmuls (mm cases) in double: their f32
                 * rounding, amplified by the chain, is no fusion error (fused vs
                 * unfused above is the tight check) */
                bad = mismatches(a, r, n1, c->mm ? 3e-2 : tol * 4, &at);
                if (bad) { CHECK(false, "seed %u output %d: fused vs reference: %lld of %lld differ, first [%lld] %g vs %g",
                                 c->seed, o, (long long)bad, (long long)n1, (long long)at, a[at], r[at]); rr.ok = false; }
            }
            free(a); free(b); free(r);
        }
    }
done:
    kn_plan_free(pr); kn_plan_free(pf); kn_plan_free(pp);
    kn_ctx_free(cr); kn_ctx_free(cf); kn_ctx_free(cp);
    return rr;
}

TEST(random_chains_match_unfused_and_reference) {
    if (!jit_available()) SKIP("the %s backend builds no generated kernels (or KN_NOFUSE is set)", kn_backend_default()->name);
    static const int64_t shapes[][4] = {{37}, {5, 33}, {3, 7, 19}, {2, 3, 5, 11}, {1, 129}, {257, 3}, {4, 1, 65}};
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16, KN_F64};
    int fused = 0, total = 0, reds = 0, norms = 0;
    const char *only = getenv("KN_TEST_SEED");   /* debugging one case */
    for (uint32_t seed = 1; seed <= 42; seed++) {
        if (only && (uint32_t)atoi(only) != seed) continue;
        gcase c = {.seed = seed, .dt = dts[seed % 4], .nops = 3 + (int)(seed % 9)};
        int si = (int)(seed % 7);
        c.ndim = shapes[si][3] ? 4 : shapes[si][2] ? 3 : shapes[si][1] ? 2 : 1;
        memcpy(c.shape, shapes[si], sizeof c.shape);
        run_result r = run_case(&c);
        total++;
        if (r.ngroups) fused++;
        reds += r.nred;
        norms += r.nnorm;
        CHECK(!r.ok || r.nkern_fused <= r.nkern_plain, "seed %u: %d kernels fused > %d plain", seed, r.nkern_fused, r.nkern_plain);
        CHECK(!r.ok || r.peak_fused <= fuse_mem_bound(r.peak_plain), "seed %u: fusion raised peak memory %zu > %zu + slack",
              seed, r.peak_fused, r.peak_plain);
    }
    CHECK(fused >= total / 2, "only %d of %d random chains fused anything", fused, total);
    CHECK(only || reds >= 10, "only %d chains fused into their reduction or normalisation", reds);
    CHECK(only || norms >= 4, "only %d chains fused into their row normalisation", norms);
}

/* operands computed in the plan (matmuls): groups may write over them in place */
TEST(in_place_over_arena_values) {
    if (!jit_available()) SKIP("no generated kernels on this backend");
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16, KN_F64};
    const char *only = getenv("KN_TEST_SEED");
    for (uint32_t seed = 200; seed < 240; seed++) {
        if (only && (uint32_t)atoi(only) != seed) continue;
        gcase c = {.seed = seed, .dt = dts[seed % 4], .nops = 3 + (int)(seed % 6), .ndim = 2, .shape = {17, 40}, .mm = true};
        run_result r = run_case(&c);
        CHECK(!r.ok || r.peak_fused <= fuse_mem_bound(r.peak_plain), "seed %u: fusion raised peak memory %zu > %zu + slack",
              seed, r.peak_fused, r.peak_plain);
    }
}

/* The same chains 8192 times larger (plans only, not run): arenas of tens
 * of MB, where the 1/16 bound is the one that holds. Seeds whose small
 * chains fused above 1/16 (under the 1 MiB floor). */
TEST(memory_rule_at_scale) {
    if (!jit_available()) SKIP("no generated kernels on this backend");
    static const uint32_t seeds[] = {202, 225, 231, 234, 237, 239};
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16, KN_F64};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        uint32_t seed = seeds[i];
        gcase c = {.seed = seed, .dt = dts[seed % 4], .nops = 3 + (int)(seed % 6), .ndim = 2, .shape = {17 * 128, 40 * 64}, .mm = true};
        kn_ctx *cf = kn_ctx_new(NULL), *cp = kn_ctx_new(NULL);
        kn_tensor *of[MAXO], *op[MAXO];
        int no = build(cf, &c, of);
        build(cp, &c, op);
        kn_plan *pf = kn_plan_new(cf, no, of, NULL), *pp = kn_plan_new(cp, no, op, &(kn_plan_opts){.no_fuse = true});
        CHECK(pf && pp, "plan: %s", kn_last_error());
        if (pf && pp) {
            size_t f = kn_plan_peak_bytes(pf), pl = kn_plan_peak_bytes(pp);
            CHECK(pl > ((size_t)16 << 20), "seed %u: a plain arena of %zu bytes is not at scale", seed, pl);
            CHECK(f <= pl + pl / 16, "seed %u: fusion raised peak memory %zu > %zu + 1/16", seed, f, pl);
        }
        kn_plan_free(pf);
        kn_plan_free(pp);
        kn_ctx_free(cf);
        kn_ctx_free(cp);
    }
}

TEST(symbolic_extents) {
    if (!jit_available()) SKIP("no generated kernels on this backend");
    for (uint32_t seed = 100; seed < 110; seed++) {
        gcase c = {.seed = seed, .dt = seed % 2 ? KN_F32 : KN_BF16, .nops = 5, .sym = 1, .ndim = 2, .shape = {9, 24}};
        run_result r = run_case(&c);
        CHECK(!r.ok || r.ngroups >= 1, "seed %u: a 5-op chain over a symbolic dim did not fuse", seed);
    }
}

/* A group's value read only through a chain of views that the view_chain
 * rewrite collapses (a biased projection split into heads): the read must
 * keep the value stored (it was kept in registers: "input 0 of sdpa has no
 * data"), found while adding mixed precision. */
TEST(value_read_through_collapsed_views) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *x = kn_rand_normal(ctx, KN_F32, 3, (int64_t[]){2, 8, 96}, 0, 1, 1);
    kn_tensor *b = kn_rand_normal(ctx, KN_F32, 1, (int64_t[]){96}, 0, 1, 2);
    kn_tensor *w = kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){96, 96}, 0, 1, 3);
    kn_tensor *h = kn_add(ctx, kn_mul_scalar(ctx, kn_matmul(ctx, x, w), 0.5), b);
    kn_tensor *qkv[3];
    static const int perm[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++)
        qkv[i] = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, h, 2, 32 * i, 32), 4, (int64_t[]){2, 8, 2, 16}), perm);
    kn_tensor *loss = kn_mean_all(ctx, kn_sdpa(ctx, qkv[0], qkv[1], qkv[2], true, 0));
    kn_plan *p = kn_plan_new(ctx, 1, &loss, NULL);
    CHECK(p && kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    float fused = 0, plain = 0;
    if (p) kn_tensor_read(loss, &fused, KN_F32);
    kn_plan *q = kn_plan_new(ctx, 1, &loss, &(kn_plan_opts){.no_fuse = true, .no_rewrite = true});
    CHECK(q && kn_plan_run(q) == KN_OK && kn_tensor_read(loss, &plain, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(fabsf(fused - plain) <= 1e-5f * (1 + fabsf(plain)), "fused %g, unfused %g", fused, plain);
    kn_plan_free(p); kn_plan_free(q);
    kn_ctx_free(ctx);
}

/* ---- split reductions (CUDA: few outputs over long rows) --------------------
 * A gradient's squared norm, sum(square(cast(g))), is one output over
 * millions of elements: on CUDA the fuser splits the row across blocks and
 * the last block combines the partials in order (kiln_backend.h, KN_KSPLIT).
 * Each case runs three times (the counters must be back at zero for the next
 * launch) against the unfused plan and the reference; on CUDA the kernel
 * must be split. Cases: the sum of squares of a bf16 gradient whose f32 cast
 * is also an output; a mean over [3, 70001]; a max with a NaN in one slice
 * (it must win); a min over the leading dim of [40000, 3] (columns); a
 * column sum and a whole sum of a matmul's output (lone reductions); a sum
 * over a symbolic row count run at several values. */
static kn_tensor *split_case(kn_ctx *ctx, int c, kn_tensor **second) {
    *second = NULL;
    switch (c) {
    case 0: {
        kn_tensor *g = kn_cast(ctx, kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){1200, 1023}, 0, 1, 11), KN_BF16);
        kn_tensor *g32 = kn_cast(ctx, g, KN_F32);
        *second = kn_mul_scalar(ctx, g32, 1.0);
        return kn_sum(ctx, kn_unary(ctx, KN_OP_SQUARE, g32), 0, NULL, false);
    }
    case 1: return kn_mean(ctx, kn_add_scalar(ctx, kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){3, 70001}, 0, 1, 12), 0.25), 1, (int[]){1}, false);
    case 2: {
        float *d = malloc(sizeof *d * 90000);
        for (int i = 0; i < 90000; i++) d[i] = (float)((i * 7919) % 90000) / 90000.0f;
        d[71234] = NAN;
        kn_tensor *x = kn_from_data(ctx, KN_F32, 1, (int64_t[]){90000}, d);
        free(d);
        return kn_max(ctx, kn_mul_scalar(ctx, x, 2.0), 1, (int[]){0}, false);
    }
    case 3: return kn_min(ctx, kn_unary(ctx, KN_OP_EXP, kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){40000, 3}, 0, 1, 13)), 1, (int[]){0}, true);
    case 5: {   /* lone reductions of a matmul's output: a bias gradient, a whole-tensor sum */
        kn_tensor *y = kn_matmul(ctx, kn_rand_normal(ctx, KN_F32, 3, (int64_t[]){6, 500, 40}, 0, 1, 15),
                                 kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){40, 70}, 0, 1, 16));
        *second = kn_sum(ctx, y, 0, NULL, false);
        return kn_sum(ctx, y, 2, (int[]){0, 1}, true);
    }
    default: {
        int T = kn_sym_new(ctx, "T", 60000);
        kn_tensor *x = kn_slice_sym(ctx, kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){60000, 2}, 0, 1, 14), 0, 0, T);
        return kn_sum(ctx, kn_unary(ctx, KN_OP_ABS, x), 1, (int[]){0}, false);
    }
    }
}
TEST(split_reductions) {
    if (!jit_available()) SKIP("the %s backend builds no generated kernels (or KN_NOFUSE is set)", kn_backend_default()->name);
    bool cuda = cuda_fuses();
    for (int c = 0; c < 7; c++) {
        kn_ctx *ctx[3] = {kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), kn_ctx_new(NULL), kn_ctx_new(NULL)};
        kn_tensor *out[3][2];
        kn_plan *p[3];
        for (int i = 0; i < 3; i++) {
            out[i][0] = split_case(ctx[i], c, &out[i][1]);
            REQUIRE(out[i][0], "case %d: %s", c, kn_last_error());
            p[i] = kn_plan_new(ctx[i], out[i][1] ? 2 : 1, out[i], &(kn_plan_opts){.no_fuse = i == 2});
            REQUIRE(p[i], "case %d plan %d: %s", c, i, kn_last_error());
        }
        int split = 0;
        for (int gi = 0; gi < p[1]->ngroups; gi++) if (p[1]->groups[gi].k.split > split) split = p[1]->groups[gi].k.split;
        CHECK(!cuda || split > 1, "case %d: no split reduction on CUDA", c);
        static const int64_t tv[3] = {60000, 37, 33333};
        for (int run = 0; run < 3; run++) {
            if (c == 6) for (int i = 0; i < 3; i++) kn_sym_set(ctx[i], 1, tv[run]);
            for (int i = 0; i < 3; i++) REQUIRE(kn_plan_run(p[i]) == KN_OK, "case %d run %d: %s", c, run, kn_last_error());
            for (int o = 0; o < 2 && out[0][o]; o++) {
                int64_t n[3], at;
                float *v[3];
                for (int i = 0; i < 3; i++) v[i] = read_f32(out[i][o], &n[i]);
                REQUIRE(v[0] && v[1] && v[2] && n[0] == n[1] && n[0] == n[2], "case %d: read", c);
                int64_t bad = mismatches(v[1], v[2], n[0], 1e-5, &at);
                CHECK(!bad, "case %d run %d output %d: fused vs unfused [%lld] %.9g vs %.9g", c, run, o, (long long)at,
                      v[1][at], v[2][at]);
                bad = mismatches(v[1], v[0], n[0], c == 5 ? 1e-4 : 1e-5, &at);   /* case 5: the reference's matmul is in double */
                CHECK(!bad, "case %d run %d output %d: fused vs reference [%lld] %.9g vs %.9g", c, run, o, (long long)at,
                      v[1][at], v[0][at]);
                for (int i = 0; i < 3; i++) free(v[i]);
            }
        }
        for (int i = 0; i < 3; i++) { kn_plan_free(p[i]); kn_ctx_free(ctx[i]); }
    }
}

/* ---- rope and KV-cache writes (a decode step's attention inputs) ------------
 * qkv [T, (H + 2 Hkv) D] -> q, k, v as [heads, T, D] views; q and k roped at
 * positions pos[T], k and v written into the caches [Hkv, S, D] at those
 * positions (index_copy). On CUDA the key rope and both cache writes run as
 * one generated kernel (fuse.c: fusable_index, merge_siblings). Checked
 * against the unfused plan and the reference backend over runs that change
 * T and the positions, with an equal pair of positions (the last wins) and
 * an out-of-range one (an error naming index_copy, the caches untouched). */
enum { RK_H = 3, RK_HKV = 1, RK_D = 16, RK_ROT = 12, RK_S = 11, RK_T = 4 };
typedef struct { kn_ctx *ctx; kn_tensor *qkv, *pos, *kc0, *vc0, *out[3]; kn_plan *plan; } rk_graph;

static bool rk_build(rk_graph *g, kn_backend *be, bool no_fuse, bool neox, bool ff) {
    memset(g, 0, sizeof *g);
    g->ctx = kn_ctx_new(&(kn_ctx_opts){.backend = be});
    kn_ctx *c = g->ctx;
    int T = kn_sym_new(c, "T", RK_T);
    int64_t W = (RK_H + 2 * RK_HKV) * RK_D, cs[3] = {RK_HKV, RK_S, RK_D};
    g->qkv = kn_input(c, KN_F32, 2, (int64_t[]){RK_T, W});
    g->pos = kn_input(c, KN_I32, 1, (int64_t[]){RK_T});
    static const float zero[RK_HKV * RK_S * RK_D];
    g->kc0 = kn_from_data(c, KN_F32, 3, cs, zero);
    g->vc0 = kn_from_data(c, KN_F32, 3, cs, zero);
    kn_tensor *x = kn_slice_sym(c, g->qkv, 0, 0, T), *pos = kn_slice_sym(c, g->pos, 0, 0, T);
    int perm[3] = {1, 0, 2};
    kn_tensor *q = kn_permute(c, kn_reshape(c, kn_narrow(c, x, 1, 0, RK_H * RK_D), 3, (int64_t[]){-1, RK_H, RK_D}), perm);
    kn_tensor *k = kn_permute(c, kn_reshape(c, kn_narrow(c, x, 1, RK_H * RK_D, RK_HKV * RK_D), 3, (int64_t[]){-1, RK_HKV, RK_D}), perm);
    kn_tensor *v = kn_permute(c, kn_reshape(c, kn_narrow(c, x, 1, (RK_H + RK_HKV) * RK_D, RK_HKV * RK_D), 3, (int64_t[]){-1, RK_HKV, RK_D}), perm);
    float f[RK_ROT / 2];
    for (int i = 0; i < RK_ROT / 2; i++) f[i] = 1.0f + 0.5f * (float)i;
    kn_tensor *fft = ff ? kn_from_data(c, KN_F32, 1, (int64_t[]){RK_ROT / 2}, f) : NULL;
    q = kn_rope_ff(c, q, pos, RK_ROT, 500.0, neox, 1.0, fft);
    k = kn_rope_ff(c, k, pos, RK_ROT, 500.0, neox, 1.0, fft);
    g->out[0] = kn_mul_scalar(c, q, 1.0);    /* q as an output of its own shape */
    g->out[1] = kn_index_copy(c, g->kc0, 1, pos, k);
    g->out[2] = kn_index_copy(c, g->vc0, 1, pos, v);
    g->plan = kn_plan_new(c, 3, g->out, &(kn_plan_opts){.no_fuse = no_fuse});
    return g->plan != NULL;
}

static void rk_free(rk_graph *g) { kn_plan_free(g->plan); kn_ctx_free(g->ctx); }

static void rk_case(bool neox, bool ff) {
    rk_graph g[3];   /* reference, fused, unfused */
    kn_backend *bes[3] = {kn_backend_ref(), kn_backend_default(), kn_backend_default()};
    for (int i = 0; i < 3; i++) REQUIRE(rk_build(&g[i], bes[i], i == 2, neox, ff), "build: %s", kn_last_error());
    bool cuda = cuda_fuses();
    if (cuda) {   /* one kernel holds the key rope and both cache writes (the query's rope may fuse with its reader) */
        int both = 0;
        for (int gi = 0; gi < g[1].plan->ngroups; gi++) {
            const kn_fgroup *fg = &g[1].plan->groups[gi];
            int ic = 0, rope = 0;
            for (int m = 0; m < fg->nnode; m++) { ic += fg->node[m]->op == KN_OP_INDEX_COPY; rope += fg->node[m]->op == KN_OP_ROPE; }
            both += ic == 2 && rope >= 1;
        }
        CHECK(both == 1, "neox %d ff %d: no kernel holds the key rope and both cache writes (%d groups)", neox, ff, g[1].plan->ngroups);
        CHECK(kn_plan_n_kernels(g[1].plan) < kn_plan_n_kernels(g[2].plan), "fused %d kernels, unfused %d",
              kn_plan_n_kernels(g[1].plan), kn_plan_n_kernels(g[2].plan));
    }
    /* runs: T = 4 at 0..3, T = 1 at 4, T = 2 at 7, 7 (equal: the last wins), T = 3 with 11 (out of range) */
    static const int Ts[] = {4, 1, 2, 3};
    static const int32_t P[][RK_T] = {{0, 1, 2, 3}, {4}, {7, 7}, {5, 11, 6}};
    uint32_t seed = 77u + (uint32_t)neox * 5u + (uint32_t)ff;
    for (int r = 0; r < 4; r++) {
        int64_t W = (RK_H + 2 * RK_HKV) * RK_D;
        float x[RK_T * (RK_H + 2 * RK_HKV) * RK_D];
        for (int64_t i = 0; i < RK_T * W; i++) x[i] = (float)rnd(&seed) / (float)(1u << 24) * 4.0f - 2.0f;
        int32_t pos[RK_T] = {0};
        memcpy(pos, P[r], sizeof(int32_t) * (size_t)Ts[r]);
        for (int i = 0; i < 3; i++) {
            kn_sym_set(g[i].ctx, 1, Ts[r]);
            REQUIRE(kn_tensor_write(g[i].qkv, x, KN_F32) == KN_OK && kn_tensor_write(g[i].pos, pos, KN_I32) == KN_OK, "write");
        }
        kn_status st[3];
        for (int i = 0; i < 3; i++) st[i] = kn_plan_run(g[i].plan);
        if (r == 3) {   /* out of range: every plan fails, naming index_copy; the caches keep run 2's rows */
            for (int i = 0; i < 3; i++)
                CHECK(st[i] != KN_OK && strstr(kn_last_error(), "") != NULL, "plan %d ran with index 11 of a cache of %d rows", i, RK_S);
            kn_status bad = kn_plan_run(g[1].plan);
            CHECK(bad != KN_OK && strstr(kn_last_error(), "index_copy"), "fused plan's error: %s", kn_last_error());
        } else {
            for (int i = 0; i < 3; i++) CHECK(st[i] == KN_OK, "plan %d run %d: %s", i, r, kn_last_error());
        }
        for (int o = 0; o < 3; o++) {
            if (r == 3 && o == 0) continue;   /* q is whatever the failed run left */
            /* the caches as they stand (their storage, not the last run's node) */
            kn_tensor *t[3];
            for (int i = 0; i < 3; i++) t[i] = o == 0 ? g[i].out[0] : o == 1 ? g[i].kc0 : g[i].vc0;
            int64_t n[3], at;
            float *a = read_f32(t[1], &n[1]), *b = read_f32(t[2], &n[2]), *ref = read_f32(t[0], &n[0]);
            REQUIRE(a && b && ref && n[0] == n[1] && n[1] == n[2], "read output %d", o);
            int64_t bad = mismatches(a, b, n[1], 1e-6, &at);
            CHECK(!bad, "neox %d ff %d run %d output %d: fused vs unfused: %lld differ, first [%lld] %g vs %g", neox, ff, r, o,
                  (long long)bad, (long long)at, a[at], b[at]);
            bad = mismatches(a, ref, n[1], 1e-5, &at);
            CHECK(!bad, "neox %d ff %d run %d output %d: fused vs reference: %lld differ, first [%lld] %g vs %g", neox, ff, r, o,
                  (long long)bad, (long long)at, a[at], ref[at]);
            free(a); free(b); free(ref);
        }
    }
    for (int i = 0; i < 3; i++) rk_free(&g[i]);
}

/* A prefill's attention (GPT-2's: no rope): k and v written into the
 * caches, the attention reading the caches through views of their storage
 * (not of the index_copy nodes), its output permuted back and copied for the
 * projection. The cache writes must run before the attention: CUDA segments
 * once merged them into the kernel of the output's copy, after it, and the
 * attention read stale rows. Checked in the groups kn__fuse forms for CUDA
 * (on any machine) and by running the plan against the reference. */
enum { KA_H = 2, KA_D = 8, KA_S = 16, KA_T = 5 };
static kn_tensor *kv_attn_build(kn_ctx *c, kn_tensor **qkv, kn_tensor **pos, int sym[2]) {
    int T = sym[0] = kn_sym_new(c, "T", KA_T), S = sym[1] = kn_sym_new(c, "S", KA_S);
    int64_t C = KA_H * KA_D, cs[3] = {KA_H, KA_S, KA_D};
    *qkv = kn_input(c, KN_F32, 2, (int64_t[]){KA_T, 3 * C});
    *pos = kn_input(c, KN_I32, 1, (int64_t[]){KA_T});
    static const float zero[KA_H * KA_S * KA_D];
    kn_tensor *kc = kn_from_data(c, KN_F32, 3, cs, zero), *vc = kn_from_data(c, KN_F32, 3, cs, zero);
    kn_tensor *x = kn_slice_sym(c, *qkv, 0, 0, T), *p = kn_slice_sym(c, *pos, 0, 0, T);
    int perm[3] = {1, 0, 2};
    kn_tensor *hd[3];
    for (int j = 0; j < 3; j++) hd[j] = kn_permute(c, kn_reshape(c, kn_narrow(c, x, 1, j * C, C), 3, (int64_t[]){-1, KA_H, KA_D}), perm);
    kn_tensor *a = kn_index_copy(c, kc, 1, p, hd[1]), *b = kn_index_copy(c, vc, 1, p, hd[2]);
    kn_tensor *o = kn_sdpa(c, kn_unsqueeze(c, hd[0], 0), kn_unsqueeze(c, kn_slice_sym(c, a, 1, 0, S), 0),
                           kn_unsqueeze(c, kn_slice_sym(c, b, 1, 0, S), 0), true, 0.35);
    o = kn_reshape(c, kn_permute(c, kn_squeeze(c, o, 0), perm), 2, (int64_t[]){-1, C});   /* [T, C]: a copy */
    return kn_matmul(c, o, rand_data(c, KN_F32, 2, (int64_t[]){C, C}, 9));
}
TEST(cache_writes_run_before_the_attention) {
    kn_ctx *cs[2] = {kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), kn_ctx_new(NULL)};
    kn_tensor *out[2], *qkv[2], *pos[2];
    kn_plan *p[2];
    int sym[2][2];
    for (int i = 0; i < 2; i++) {
        out[i] = kv_attn_build(cs[i], &qkv[i], &pos[i], sym[i]);
        p[i] = out[i] ? kn_plan_new(cs[i], 1, &out[i], NULL) : NULL;
        REQUIRE(p[i], "plan %d: %s", i, kn_last_error());
    }
    /* the groups CUDA would run, from the fast plan's rewritten schedule */
    kn_plan *f = p[1];
    int at = -1;
    for (int i = 0; i < f->n; i++) if (f->order[i]->op == KN_OP_SDPA) at = i;
    kn_fgroup *groups = NULL;
    int ng = 0;
    REQUIRE(at >= 0 && kn__fuse("cuda", f->order, f->n, f->n_ids, 1, &out[1], f->rep, NULL, &groups, &ng), "fuse");
    for (int gi = 0; gi < ng; gi++)
        for (int m = 0; m < groups[gi].nnode; m++)
            CHECK(groups[gi].node[m]->op != KN_OP_INDEX_COPY || groups[gi].last < at,
                  "a cache write runs in a kernel at schedule index %d, after the attention reading the cache (%d)", groups[gi].last, at);
    free(groups);
    /* two runs: a prefill of 5 rows, then 3 more rows at 5..7 */
    static const int Ts[] = {5, 3}, S[] = {5, 8};
    uint32_t seed = 31;
    for (int r = 0; r < 2; r++) {
        float x[KA_T * 3 * KA_H * KA_D];
        int32_t ps[KA_T] = {0};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)rnd(&seed) / (float)(1u << 24) * 4.0f - 2.0f;
        for (int i = 0; i < Ts[r]; i++) ps[i] = S[r] - Ts[r] + i;
        for (int i = 0; i < 2; i++) {
            REQUIRE(kn_sym_set(cs[i], sym[i][0], Ts[r]) == KN_OK && kn_sym_set(cs[i], sym[i][1], S[r]) == KN_OK, "symbols");
            REQUIRE(kn_tensor_write(qkv[i], x, KN_F32) == KN_OK && kn_tensor_write(pos[i], ps, KN_I32) == KN_OK, "write");
            REQUIRE(kn_plan_run(p[i]) == KN_OK, "run %d plan %d: %s", r, i, kn_last_error());
        }
        int64_t n[2], first;
        float *ref = read_f32(out[0], &n[0]), *got = read_f32(out[1], &n[1]);
        REQUIRE(ref && got && n[0] == n[1], "read");
        int64_t bad = mismatches(got, ref, n[0], 1e-5, &first);
        CHECK(!bad, "run %d: %lld of %lld differ from the reference, first [%lld] %g vs %g", r, (long long)bad, (long long)n[0],
              (long long)first, got[first], ref[first]);
        free(ref); free(got);
    }
    for (int i = 0; i < 2; i++) { kn_plan_free(p[i]); kn_ctx_free(cs[i]); }
}

/* Embedding gathers: token rows + position rows, fused (CUDA) vs unfused vs
 * the reference at two symbol values, then a bad token id: the plan fails
 * naming index_select. */
static kn_tensor *emb_build(kn_ctx *c, kn_tensor **tok, kn_tensor **pos) {
    int T = kn_sym_new(c, "T", 6);
    *tok = kn_input(c, KN_I32, 1, (int64_t[]){6});
    *pos = kn_input(c, KN_I32, 1, (int64_t[]){6});
    kn_tensor *wte = rand_data(c, KN_F32, 2, (int64_t[]){37, 24}, 5), *wpe = rand_data(c, KN_F32, 2, (int64_t[]){8, 24}, 6);
    kn_tensor *x = kn_add(c, kn_index_select(c, wte, 0, kn_slice_sym(c, *tok, 0, 0, T)),
                          kn_index_select(c, wpe, 0, kn_slice_sym(c, *pos, 0, 0, T)));
    return kn_mul_scalar(c, x, 0.5);
}
TEST(embedding_gathers) {
    kn_ctx *cs[3] = {kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), kn_ctx_new(NULL), kn_ctx_new(NULL)};
    kn_tensor *out[3], *tok[3], *pos[3];
    kn_plan *p[3];
    for (int i = 0; i < 3; i++) {
        out[i] = emb_build(cs[i], &tok[i], &pos[i]);
        p[i] = kn_plan_new(cs[i], 1, &out[i], &(kn_plan_opts){.no_fuse = i == 2});
        REQUIRE(p[i], "plan %d: %s", i, kn_last_error());
    }
    bool cuda = cuda_fuses();
    if (cuda) CHECK(p[1]->ngroups == 1 && kn_plan_n_kernels(p[1]) == 1, "%d groups, %d kernels: the gathers, the add and the scale are one kernel",
                    p[1]->ngroups, kn_plan_n_kernels(p[1]));
    static const int32_t toks[][6] = {{3, 36, 0, 3, 17, 9}, {5, 1, 0, 0, 0, 0}, {2, 37, 1, 0, 0, 0}};
    static const int Ts[] = {6, 2, 3};
    for (int r = 0; r < 3; r++) {
        int32_t ps[6] = {0, 1, 2, 3, 4, 5};
        for (int i = 0; i < 3; i++) {
            kn_sym_set(cs[i], 1, Ts[r]);
            REQUIRE(kn_tensor_write(tok[i], toks[r], KN_I32) == KN_OK && kn_tensor_write(pos[i], ps, KN_I32) == KN_OK, "write");
        }
        if (r == 2) {   /* token 37 of a 37-row table */
            for (int i = 0; i < 3; i++) {
                kn_status st = kn_plan_run(p[i]);
                CHECK(st != KN_OK && strstr(kn_last_error(), "index_select"), "plan %d ran with token 37: %s", i, kn_last_error());
            }
            continue;
        }
        for (int i = 0; i < 3; i++) REQUIRE(kn_plan_run(p[i]) == KN_OK, "run %d: %s", i, kn_last_error());
        int64_t n[3], at;
        float *v[3];
        for (int i = 0; i < 3; i++) v[i] = read_f32(out[i], &n[i]);
        REQUIRE(v[0] && v[1] && v[2] && n[0] == n[1] && n[1] == n[2], "read");
        CHECK(!mismatches(v[1], v[2], n[1], 0, &at), "run %d: fused vs unfused differ at %lld", r, (long long)at);
        CHECK(!mismatches(v[1], v[0], n[1], 1e-6, &at), "run %d: fused vs reference differ at %lld", r, (long long)at);
        for (int i = 0; i < 3; i++) free(v[i]);
    }
    for (int i = 0; i < 3; i++) { kn_plan_free(p[i]); kn_ctx_free(cs[i]); }
}

TEST(rope_and_cache_writes) {
    rk_case(false, false);
    rk_case(true, false);
    rk_case(false, true);
}

/* ---- golden snapshots of the generated source --------------------------------
 * A change to the generators shows in review: each graph's fused kernel is
 * rendered in every language and compared with tests/fixtures/codegen/NAME.c
 * and .cu; KN_UPDATE_GOLDEN=1 writes them instead. Graphs use no data (the
 * plan is built with fusion on the CPU backend's language, never run). */
typedef kn_tensor *(*golden_fn)(kn_ctx *ctx);

/* MLP epilogue: gelu(x + b) + r over [7, 96] (the matmul stays a hand kernel) */
static kn_tensor *g_mlp(kn_ctx *ctx) {
    kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){7, 96}), *b = kn_input(ctx, KN_F32, 1, (int64_t[]){96});
    kn_tensor *r = kn_input(ctx, KN_F32, 2, (int64_t[]){7, 96});
    return kn_add(ctx, kn_unary(ctx, KN_OP_GELU, kn_add(ctx, x, b)), r);
}
/* SwiGLU over a symbolic row count: silu(g) * u, [T<=512, 1536] */
static kn_tensor *g_swiglu(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 512);
    kn_tensor *g = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){512, 1536}), 0, 0, T);
    kn_tensor *u = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){512, 1536}), 0, 0, T);
    return kn_mul(ctx, kn_unary(ctx, KN_OP_SILU, g), u);
}
/* bf16 activations: a transposed operand, a broadcast f32 row, a cast back */
static kn_tensor *g_bf16(kn_ctx *ctx) {
    kn_tensor *a = kn_input(ctx, KN_BF16, 2, (int64_t[]){5, 12});
    kn_tensor *t = kn_permute(ctx, kn_input(ctx, KN_BF16, 2, (int64_t[]){12, 5}), (int[]){1, 0});
    kn_tensor *w = kn_input(ctx, KN_F32, 1, (int64_t[]){12});
    kn_tensor *y = kn_mul(ctx, kn_unary(ctx, KN_OP_TANH, kn_add(ctx, a, t)), w);
    return kn_cast(ctx, kn_mul_scalar(ctx, y, 0.5), KN_BF16);
}

/* gradient-norm term: sum(square(cast(g, f64))) over a [33, 64] f32 gradient */
static kn_tensor *g_sumsq(kn_ctx *ctx) {
    kn_tensor *g = kn_input(ctx, KN_F32, 2, (int64_t[]){33, 64});
    return kn_sum(ctx, kn_unary(ctx, KN_OP_SQUARE, kn_cast(ctx, g, KN_F64)), 0, NULL, false);
}
/* row max of a scaled, shifted [T<=64, 50] (a softmax's first pass) */
static kn_tensor *g_rowmax(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 64);
    kn_tensor *x = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){64, 50}), 0, 0, T);
    kn_tensor *m = kn_input(ctx, KN_F32, 1, (int64_t[]){50});
    return kn_max(ctx, kn_add(ctx, kn_mul_scalar(ctx, x, 0.125), m), 1, (int[]){1}, true);
}

/* residual add + RMS norm over [T<=512, 576] (an LLM block's seam) */
static kn_tensor *g_addrms(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 512);
    kn_tensor *x = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){512, 576}), 0, 0, T);
    kn_tensor *o = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){512, 576}), 0, 0, T);
    kn_tensor *w = kn_input(ctx, KN_F32, 1, (int64_t[]){576});
    return kn_rms_norm(ctx, kn_add(ctx, x, o), 1, w, 1e-5);
}
/* attention-style softmax of scaled scores with an additive mask, [4, 7, 33] */
static kn_tensor *g_softmax(kn_ctx *ctx) {
    kn_tensor *s = kn_input(ctx, KN_F32, 3, (int64_t[]){4, 7, 33}), *m = kn_input(ctx, KN_F32, 2, (int64_t[]){7, 33});
    return kn_softmax(ctx, kn_add(ctx, kn_mul_scalar(ctx, s, 0.125), m), -1);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* lang: the language the groups are formed for ("c" forms what both run;
 * a template only one language fuses is rendered in that one only) */
static void golden_in(const char *name, golden_fn fn, const char *lang) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
    kn_tensor *out = fn(ctx);
    REQUIRE(out, "%s: %s", name, kn_last_error());
    kn_fgroup *groups = NULL;
    int ng = 0;
    kn_tensor *outs[1] = {out};
    kn_tensor **order = NULL;
    int n = 0;
    REQUIRE(kn__toposort(ctx, 1, outs, false, &order, &n) == KN_OK, "toposort");
    REQUIRE(kn__fuse(lang, order, n, ctx->n_all, 1, outs, NULL, NULL, &groups, &ng), "fuse");
    CHECK(ng == 1, "%s: %d groups, expected 1", name, ng);
    static const char *langs[][2] = {{"c", "c"}, {"cuda", "cu"}};
    for (int l = 0; l < 2 && ng == 1; l++) {
        if (strcmp(lang, "c") && strcmp(lang, langs[l][0])) continue;
        char *src = malloc(1 << 16), path[256];
        int len = kn__render(langs[l][0], &groups[0].k, src, 1 << 16);
        CHECK(len > 0, "%s: render %s", name, langs[l][0]);
        snprintf(path, sizeof path, "tests/fixtures/codegen/%s.%s", name, langs[l][1]);
        if (getenv("KN_UPDATE_GOLDEN")) {
            FILE *f = fopen(path, "wb");
            CHECK(f && fwrite(src, 1, (size_t)len, f) == (size_t)len, "write %s", path);
            if (f) fclose(f);
        } else {
            char *want = read_text(path);
            CHECK(want, "%s missing (KN_UPDATE_GOLDEN=1 writes it)", path);
            if (want && strcmp(want, src)) {
                size_t i = 0;
                while (want[i] && want[i] == src[i]) i++;
                CHECK(false, "%s: generated source differs at byte %zu (review, then KN_UPDATE_GOLDEN=1): ...%.60s", path, i, src + (i > 20 ? i - 20 : 0));
            }
            free(want);
        }
        free(src);
    }
    free(groups);
    free(order);
    kn_ctx_free(ctx);
}

static void golden(const char *name, golden_fn fn) { golden_in(name, fn, "c"); }

TEST(golden_mlp_epilogue) { golden("mlp_epilogue", g_mlp); }
TEST(golden_swiglu_symbolic) { golden("swiglu_symbolic", g_swiglu); }
TEST(golden_bf16_mixed) { golden("bf16_mixed", g_bf16); }
TEST(golden_sum_of_squares_f64) { golden("sumsq_f64", g_sumsq); }
TEST(golden_row_max_symbolic) { golden("rowmax_symbolic", g_rowmax); }
TEST(golden_add_rms_norm) { golden("add_rms_norm", g_addrms); }
TEST(golden_softmax_masked) { golden_in("softmax_masked", g_softmax, "cuda"); }   /* C does not fuse softmax */
/* a bias gradient: sum over the leading dims of g * x, [8, 5, 96] -> [96] (C only) */
static kn_tensor *g_colsum(kn_ctx *ctx) {
    kn_tensor *g = kn_input(ctx, KN_F32, 3, (int64_t[]){8, 5, 96}), *x = kn_input(ctx, KN_F32, 3, (int64_t[]){8, 5, 96});
    return kn_sum(ctx, kn_mul(ctx, g, x), 2, (int[]){0, 1}, false);
}
TEST(golden_column_sum) { golden("colsum", g_colsum); }
/* a GPT-2 bias gradient, [8192, 768] -> [768]: CUDA tiles of columns, split over the rows */
static kn_tensor *g_colsum_split(kn_ctx *ctx) {
    kn_tensor *g = kn_input(ctx, KN_BF16, 3, (int64_t[]){8, 1024, 768});
    return kn_sum(ctx, kn_cast(ctx, g, KN_F32), 2, (int[]){0, 1}, false);
}
TEST(golden_column_sum_split) { golden_in("colsum_split", g_colsum_split, "cuda"); }
/* a weight gradient's squared norm, split across blocks (CUDA only) */
static kn_tensor *g_sumsq_split(kn_ctx *ctx) {
    kn_tensor *g = kn_input(ctx, KN_BF16, 2, (int64_t[]){2304, 768});
    return kn_sum(ctx, kn_unary(ctx, KN_OP_SQUARE, kn_cast(ctx, g, KN_F32)), 0, NULL, false);
}
TEST(golden_sum_of_squares_split) { golden_in("sumsq_split", g_sumsq_split, "cuda"); }
/* a decode step's key rope and K, V cache writes: one kernel (CUDA only;
 * a step of at most 16 rows: longer writes stay on the hand kernel, fuse.c
 * KN_FUSE_MAX_INDEX, see prompt_kv_write_not_fused) */
static kn_tensor *g_ropekv(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 16);
    kn_tensor *x = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){16, 3 * 64 * 3}), 0, 0, T);
    kn_tensor *pos = kn_slice_sym(ctx, kn_input(ctx, KN_I32, 1, (int64_t[]){16}), 0, 0, T);
    int perm[3] = {1, 0, 2};
    kn_tensor *k = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 192, 192), 3, (int64_t[]){-1, 3, 64}), perm);
    kn_tensor *v = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 384, 192), 3, (int64_t[]){-1, 3, 64}), perm);
    kn_tensor *kc = kn_input(ctx, KN_F32, 3, (int64_t[]){3, 2048, 64}), *vc = kn_input(ctx, KN_F32, 3, (int64_t[]){3, 2048, 64});
    kn_tensor *q = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 0, 192), 3, (int64_t[]){-1, 3, 64}), perm);
    q = kn_rope(ctx, q, pos, 64, 100000.0, false, 1.0);   /* another space than k's in the model (9 heads): here 3, see g_ropeqkv */
    kn_tensor *a = kn_index_copy(ctx, kc, 1, pos, kn_rope(ctx, k, pos, 64, 100000.0, false, 1.0));
    kn_tensor *b = kn_index_copy(ctx, vc, 1, pos, v);
    int S = kn_sym_new(ctx, "S", 2048);
    return kn_sdpa(ctx, kn_unsqueeze(ctx, q, 0), kn_unsqueeze(ctx, kn_slice_sym(ctx, a, 1, 0, S), 0),
                   kn_unsqueeze(ctx, kn_slice_sym(ctx, b, 1, 0, S), 0), true, 0.125);
}
TEST(golden_rope_kv_write) { golden_in("rope_kv_write", g_ropekv, "cuda"); }
/* A prompt's cache write (T up to 512) stays on the hand index_copy on CUDA:
 * a fused write scans every index per item (T^2 work, fuse.c). With the
 * cap at 1024 the rope and the write were one kernel. */
TEST(prompt_kv_write_not_fused) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
    int T = kn_sym_new(ctx, "T", 512);
    kn_tensor *x = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){512, 128}), 0, 0, T);
    kn_tensor *pos = kn_slice_sym(ctx, kn_input(ctx, KN_I32, 1, (int64_t[]){512}), 0, 0, T);
    kn_tensor *k = kn_permute(ctx, kn_reshape(ctx, x, 3, (int64_t[]){-1, 2, 64}), (int[]){1, 0, 2});
    kn_tensor *kc = kn_input(ctx, KN_F32, 3, (int64_t[]){2, 2048, 64});
    kn_tensor *out[1] = {kn_index_copy(ctx, kc, 1, pos, kn_rope(ctx, k, pos, 64, 100000.0, false, 1.0))};
    kn_tensor **order = NULL;
    kn_fgroup *groups = NULL;
    int n = 0, ng = -1, ic = 0;
    REQUIRE(out[0] && kn__toposort(ctx, 1, out, false, &order, &n) == KN_OK, "graph: %s", kn_last_error());
    REQUIRE(kn__fuse("cuda", order, n, ctx->n_all, 1, out, NULL, NULL, &groups, &ng), "fuse");
    for (int g = 0; g < ng; g++)
        for (int m = 0; m < groups[g].nnode; m++) ic += groups[g].node[m]->op == KN_OP_INDEX_COPY;
    CHECK(ic == 0, "a 512-row cache write joined a generated kernel (%d groups)", ng);
    free(groups);
    free(order);
    kn_ctx_free(ctx);
}
/* SmolLM2's shapes: the query's rope over [9, T, 64] joins the kernel of the
 * key's rope and both cache writes over [3, T, 64] as a second segment */
static kn_tensor *g_ropeqkv(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 16);
    kn_tensor *x = kn_slice_sym(ctx, kn_input(ctx, KN_F32, 2, (int64_t[]){16, 960}), 0, 0, T);
    kn_tensor *pos = kn_slice_sym(ctx, kn_input(ctx, KN_I32, 1, (int64_t[]){16}), 0, 0, T);
    int perm[3] = {1, 0, 2};
    kn_tensor *q = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 0, 576), 3, (int64_t[]){-1, 9, 64}), perm);
    kn_tensor *k = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 576, 192), 3, (int64_t[]){-1, 3, 64}), perm);
    kn_tensor *v = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, x, 1, 768, 192), 3, (int64_t[]){-1, 3, 64}), perm);
    q = kn_rope(ctx, q, pos, 64, 100000.0, false, 1.0);
    kn_tensor *kc = kn_input(ctx, KN_F32, 3, (int64_t[]){3, 2048, 64}), *vc = kn_input(ctx, KN_F32, 3, (int64_t[]){3, 2048, 64});
    kn_tensor *a = kn_index_copy(ctx, kc, 1, pos, kn_rope(ctx, k, pos, 64, 100000.0, false, 1.0));
    kn_tensor *b = kn_index_copy(ctx, vc, 1, pos, v);
    int S = kn_sym_new(ctx, "S", 2048);
    return kn_sdpa(ctx, kn_unsqueeze(ctx, q, 0), kn_unsqueeze(ctx, kn_slice_sym(ctx, a, 1, 0, S), 0),
                   kn_unsqueeze(ctx, kn_slice_sym(ctx, b, 1, 0, S), 0), true, 0.125);
}
/* Segments (CUDA) join kernels of one compute type only: an f64 scalar
 * chain (Adam's bias corrections) beside an f32 vector chain stays apart,
 * two f32 chains over different spaces share a kernel. */
static int cuda_groups(kn_tensor **outs, int nout, kn_ctx *ctx, int *nseg) {
    kn_tensor **order = NULL;
    kn_fgroup *groups = NULL;
    int n = 0, ng = -1;
    if (kn__toposort(ctx, nout, outs, false, &order, &n) == KN_OK && kn__fuse("cuda", order, n, ctx->n_all, nout, outs, NULL, NULL, &groups, &ng))
        *nseg = ng > 0 ? groups[0].k.nseg : 0;
    free(groups);
    free(order);
    return ng;
}
TEST(segments_keep_one_compute_type) {
    for (int mixed = 0; mixed < 2; mixed++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
        kn_tensor *x = kn_input(ctx, KN_F32, 1, (int64_t[]){7}), *y = kn_input(ctx, mixed ? KN_F64 : KN_F32, 1, (int64_t[]){3});
        kn_tensor *outs[2] = {kn_mul_scalar(ctx, kn_unary(ctx, KN_OP_EXP, x), 2.0), kn_add_scalar(ctx, kn_unary(ctx, KN_OP_SQRT, y), 1.0)};
        int nseg = 0, ng = cuda_groups(outs, 2, ctx, &nseg);
        if (mixed) CHECK(ng == 2, "f32 [7] and f64 [3] chains: %d kernels, expected 2 (one compute type each)", ng);
        else CHECK(ng == 1 && nseg == 2, "two f32 chains over [7] and [3]: %d kernels of %d segments, expected one of 2", ng, nseg);
        kn_ctx_free(ctx);
    }
}
/* GPT-2's input: token and position embedding rows gathered and added,
 * [T<=1024, 768] (CUDA only) */
static kn_tensor *g_embed(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 1024);
    kn_tensor *tok = kn_slice_sym(ctx, kn_input(ctx, KN_I32, 1, (int64_t[]){1024}), 0, 0, T);
    kn_tensor *pos = kn_slice_sym(ctx, kn_input(ctx, KN_I32, 1, (int64_t[]){1024}), 0, 0, T);
    kn_tensor *wte = kn_input(ctx, KN_F32, 2, (int64_t[]){50257, 768}), *wpe = kn_input(ctx, KN_F32, 2, (int64_t[]){1024, 768});
    return kn_add(ctx, kn_index_select(ctx, wte, 0, tok), kn_index_select(ctx, wpe, 0, pos));
}
TEST(golden_embedding_gather) { golden_in("embedding_gather", g_embed, "cuda"); }

TEST(golden_rope_qkv_segments) { golden_in("rope_qkv_segments", g_ropeqkv, "cuda"); }

int main(void) { return kn_test_main(); }

/* A cast of a row normalisation that nothing else reads is stored by the
 * normalisation's kernel in the cast's dtype (fuse.c, join_tail): the
 * device prompt's norms before their bf16 GEMMs. Variants: rms and layer
 * norm after an add, to bf16 and f16 (one kernel, on every backend that
 * generates); the norm also an output (the cast stays apart); a lone norm
 * (a kernel of its own on CUDA, hand kernels elsewhere). Values as
 * unfused and the reference. */
static int g_tail(kn_ctx *ctx, kn_tensor **outs, int v) {
    int64_t sh[2] = {37, 96}, wsh[1] = {96};
    kn_tensor *x = rand_data(ctx, KN_F32, 2, sh, 71), *o = rand_data(ctx, KN_F32, 2, sh, 72);
    kn_tensor *w = rand_data(ctx, KN_F32, 1, wsh, 73), *b = rand_data(ctx, KN_F32, 1, wsh, 74);
    kn_tensor *h = v == 6 ? x : kn_add(ctx, x, o);
    kn_tensor *n = v % 2 ? kn_layer_norm(ctx, h, 1, w, b, 1e-5) : kn_rms_norm(ctx, h, 1, w, 1e-5);
    outs[0] = kn_cast(ctx, n, v / 2 == 1 ? KN_F16 : KN_BF16);
    if (v / 2 == 2) { outs[1] = n; return 2; }
    return 1;
}
/* Builds variant v of fn in three contexts (reference, fused, unfused), runs
 * them and compares every output; want_kernels >= 0: the fused plan's
 * kernels per run. */
typedef int (*variant_fn)(kn_ctx *ctx, kn_tensor **outs, int v);
static void run_variant(variant_fn fn, int v, int want_kernels) {
    kn_ctx *cr = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_ctx *cf = kn_ctx_new(NULL), *cp = kn_ctx_new(NULL);
    kn_tensor *or_[2], *of[2], *op[2];
    int no = fn(cr, or_, v);
    fn(cf, of, v);
    fn(cp, op, v);
    kn_plan *pr = kn_plan_new(cr, no, or_, NULL), *pf = kn_plan_new(cf, no, of, NULL);
    kn_plan *pp = kn_plan_new(cp, no, op, &(kn_plan_opts){.no_fuse = true});
    CHECK(pr && pf && pp, "variant %d: plan: %s", v, kn_last_error());
    if (pr && pf && pp) {
        CHECK(want_kernels < 0 || kn_plan_n_kernels(pf) == want_kernels, "variant %d: %d kernels, expected %d", v,
              kn_plan_n_kernels(pf), want_kernels);
        bool ran = !kn_plan_run(pr) && !kn_plan_run(pf) && !kn_plan_run(pp);
        CHECK(ran, "variant %d: run: %s", v, kn_last_error());
        for (int o = 0; ran && o < no; o++) {
            int64_t n1, n2, n3, at;
            float *a = read_f32(of[o], &n1), *b = read_f32(op[o], &n2), *r = read_f32(or_[o], &n3);
            CHECK(a && b && r && n1 == n2 && n1 == n3, "variant %d: read output %d", v, o);
            if (a && b && r && n1 == n2 && n1 == n3) {
                double tol = of[o]->dtype == KN_F32 ? 2e-5 : of[o]->dtype == KN_F16 ? 4e-3 : 3e-2;
                int64_t bad = mismatches(a, b, n1, tol, &at);
                CHECK(!bad, "variant %d output %d: fused vs unfused: %lld differ, first [%lld] %g vs %g", v, o, (long long)bad,
                      (long long)at, a[at < 0 ? 0 : at], b[at < 0 ? 0 : at]);
                bad = mismatches(a, r, n1, tol, &at);
                CHECK(!bad, "variant %d output %d: fused vs reference: %lld differ, first [%lld] %g vs %g", v, o, (long long)bad,
                      (long long)at, a[at < 0 ? 0 : at], r[at < 0 ? 0 : at]);
            }
            free(a); free(b); free(r);
        }
    }
    kn_plan_free(pr); kn_plan_free(pf); kn_plan_free(pp);
    kn_ctx_free(cr); kn_ctx_free(cf); kn_ctx_free(cp);
}
TEST(norm_cast_tail) {
    if (!jit_available()) SKIP("no generated kernels on this backend");
    for (int v = 0; v < 7; v++) run_variant(g_tail, v, v < 4 ? 1 : v < 6 ? 2 : cuda_fuses() ? 1 : 2);
}

/* CUDA's vector loop (kn__kernel_vec: 8 items a thread as 16-byte words):
 * SwiGLU-like chains over [6, 64] in f32, bf16 and f16 with a broadcast
 * row, in place over a matmul's result, over a symbolic row count, and
 * over views that start 1 element off 16 bytes (the one-item loop runs) or
 * whose rows are 72 apart. C renders no vectors: the same checks hold. */
static int g_vec(kn_ctx *ctx, kn_tensor **outs, int v) {
    static const kn_dtype dts[] = {KN_F32, KN_BF16, KN_F16};
    kn_dtype dt = dts[v % 3];
    int64_t sh[2] = {6, 64}, flat[1] = {6 * 72 + 1}, wsh[1] = {64};
    kn_tensor *g, *u;
    if (v / 3 == 1) {          /* 1 element off: not 16-byte aligned */
        g = kn_reshape(ctx, kn_narrow(ctx, rand_data(ctx, dt, 1, flat, 81), 0, 1, 384), 2, sh);
        u = kn_reshape(ctx, kn_narrow(ctx, rand_data(ctx, dt, 1, flat, 82), 0, 1, 384), 2, sh);
    } else if (v / 3 == 2) {   /* rows 72 apart */
        int64_t wide[2] = {6, 72};
        g = kn_narrow(ctx, rand_data(ctx, dt, 2, wide, 83), 1, 8, 64);
        u = kn_narrow(ctx, rand_data(ctx, dt, 2, wide, 84), 1, 0, 64);
    } else if (v / 3 == 3) {   /* a matmul's result, written over in place */
        int64_t ash[2] = {6, 8}, bsh[2] = {8, 64};
        g = kn_cast(ctx, kn_matmul(ctx, rand_data(ctx, KN_F32, 2, ash, 85), rand_data(ctx, KN_F32, 2, bsh, 86)), dt);
        u = kn_cast(ctx, kn_matmul(ctx, rand_data(ctx, KN_F32, 2, ash, 87), rand_data(ctx, KN_F32, 2, bsh, 88)), dt);
    } else {
        g = rand_data(ctx, dt, 2, sh, 89);
        u = rand_data(ctx, dt, 2, sh, 90);
        if (v / 3 == 4) {      /* a symbolic row count, run at its maximum */
            int T = kn_sym_new(ctx, "T", 6);
            g = kn_slice_sym(ctx, g, 0, 0, T);
            u = kn_slice_sym(ctx, u, 0, 0, T);
        }
    }
    kn_tensor *w = rand_data(ctx, KN_F32, 1, wsh, 91);
    outs[0] = kn_cast(ctx, kn_add(ctx, kn_mul(ctx, kn_silu(ctx, g), u), kn_cast(ctx, w, dt)), dt);
    return 1;
}
TEST(vector_loop) {
    if (!jit_available()) SKIP("no generated kernels on this backend");
    for (int v = 0; v < 15; v++) run_variant(g_vec, v, -1);
}
/* the add + RMS norm of golden_add_rms_norm, stored as bf16 */
static kn_tensor *g_addrms_bf16(kn_ctx *ctx) { return kn_cast(ctx, g_addrms(ctx), KN_BF16); }
TEST(golden_add_rms_norm_bf16) { golden("add_rms_norm_bf16", g_addrms_bf16); }
