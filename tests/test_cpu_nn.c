/* test_cpu_nn.c: the fast CPU nn/index kernels (src/backends/cpu/cpu_*.c)
 * against the reference backend on random data.
 *
 * A small backend of its own runs kn_cpu_fast() first and the reference
 * otherwise, and counts how often the fast path took the op under test, so
 * a case that silently fell back is reported instead of comparing the
 * reference with itself. Every case runs on each SIMD path this machine
 * has (scalar and AVX2 here), with inputs plain and as strided views.
 */
#include "kn_optest.h"
#include "backends/backend_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/vec.h"
#include "core/cpu.h"
#include "backends/quant/quant.h"

/* ---- the test backend: fast path, else reference; hits of one op counted ---- */
static kn_op g_want;
static int g_hits;
static kn_status nn_compute(kn_backend *be, const kn_exec *e) {
    if (kn_cpu_fast(e)) { if (e->node->op == g_want) g_hits++; return KN_OK; }
    return kn__ref_compute(be, e);
}
static kn_backend g_nn = {
    .version = KN_BACKEND_VERSION, .name = "cpu_nn", .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc, .free = kn__host_free, .copy_in = kn__host_copy, .copy_out = kn__host_copy,
    .compute = nn_compute,
};

/* Run build on both backends with the same random inputs; relative error of
 * the fast one (inf on failure), *hits = how often the fast path ran `op`. */
static double both(kn_build_fn build, void *ud, int nin, const kn_opin *ins, kn_op op, int *hits) {
    double *vals[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = kn__numel(&ins[i]);
        vals[i] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kn__fill_in(&ins[i], vals[i], n);
    }
    double *r = NULL, *c = NULL;
    int64_t nr = 0, nc = 0;
    kn_status s1 = kn__run_on(kn_backend_ref(), build, ud, nin, ins, vals, &r, &nr);
    g_want = op; g_hits = 0;
    kn_status s2 = kn__run_on(&g_nn, build, ud, nin, ins, vals, &c, &nc);
    *hits = g_hits;
    double err = INFINITY;
    if (s1 == KN_OK && s2 == KN_OK && nr == nc) err = kn_rel_err(c, r, nr);
    else fprintf(stderr, "  backends: ref %d fast %d (%s)\n", s1, s2, kn_last_error());
    for (int i = 0; i < nin; i++) free(vals[i]);
    free(r); free(c);
    return err;
}

/* Each case on every SIMD path the CPU has. */
static const int k_isas[] = {KN_ISA_SCALAR, KN_ISA_AVX2, KN_ISA_AVX512};
static int n_isas(void) { return (int)kn_cpu()->isa + 1; }
static void force_isa(int isa) { kn_vec_force_isa(isa); kn_cpu_attention_force_isa(isa); kn_sgemm_force_isa(isa); }

#define TOL 2e-5
/* CHECK that the case ran on the fast path (fast = true) and matched */
#define BOTH(fast, build, ud, nin, ins, op) do {                                              \
    for (int ii_ = 0; ii_ < n_isas(); ii_++) {                                                \
        force_isa(k_isas[ii_]);                                                               \
        int h_ = 0;                                                                           \
        double e_ = both(build, ud, nin, ins, op, &h_);                                       \
        CHECK(e_ < TOL, "%s (isa %d): rel err %.3g", #build, k_isas[ii_], e_);                \
        if (fast) CHECK(h_ > 0, "%s (isa %d): the fast path did not run", #build, k_isas[ii_]); \
        else CHECK(h_ == 0, "%s (isa %d): the fast path ran on a layout it should refuse", #build, k_isas[ii_]); \
    }                                                                                         \
    force_isa(-1);                                                                            \
} while (0)

static kn_opin IN(int nd, const int64_t *s, double lo, double hi) {
    kn_opin o; memset(&o, 0, sizeof o);
    o.ndim = nd; o.lo = lo; o.hi = hi;
    for (int i = 0; i < nd; i++) o.shape[i] = s[i];
    return o;
}
static kn_opin IDX(int64_t n, int64_t hi, kn_dtype dt) {
    kn_opin o = IN(1, &n, 0, (double)hi);
    o.dtype = dt; o.integer = true;
    return o;
}
static kn_opin TR(kn_opin o) { o.transposed = true; return o; }

/* ---- norms ------------------------------------------------------------------ */
typedef struct { int kind, n_norm, perm; bool w, b; } norm_ud;   /* kind 0 rms, 1 layer */
static kn_tensor *b_norm(kn_ctx *ctx, kn_tensor **in, void *ud) {
    norm_ud *u = ud;
    kn_tensor *x = in[0];
    if (u->perm) { int p[3] = {1, 0, 2}; x = kn_permute(ctx, x, p); }
    kn_tensor *w = u->w ? in[1] : NULL, *b = u->b ? in[2] : NULL;
    return u->kind ? kn_layer_norm(ctx, x, u->n_norm, w, b, 1e-5) : kn_rms_norm(ctx, x, u->n_norm, w, 1e-6);
}
TEST(norms) {
    int64_t s1[2] = {4, 37}, w1[1] = {37}, s2[3] = {3, 5, 7}, w2[2] = {5, 7}, s3[3] = {5, 8, 64}, w3[1] = {64};
    int64_t s4[2] = {300, 256}, w4[1] = {256};
    for (int kind = 0; kind < 2; kind++) {
        norm_ud u = {kind, 1, 0, true, true};
        kn_opin a[3] = {IN(2, s1, -2, 3), IN(1, w1, 0.5, 1.5), IN(1, w1, -1, 1)};
        BOTH(true, b_norm, &u, 3, a, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        u.w = false; u.b = false;
        BOTH(true, b_norm, &u, 3, a, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        u.w = false; u.b = true;
        BOTH(true, b_norm, &u, 3, a, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        norm_ud u2 = {kind, 2, 0, true, true};
        kn_opin c[3] = {IN(3, s2, -2, 3), IN(2, w2, 0.5, 1.5), IN(2, w2, -1, 1)};
        BOTH(true, b_norm, &u2, 3, c, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        norm_ud u3 = {kind, 1, 1, true, true};                  /* permuted outer dims */
        kn_opin d[3] = {IN(3, s3, -2, 3), IN(1, w3, 0.5, 1.5), IN(1, w3, -1, 1)};
        BOTH(true, b_norm, &u3, 3, d, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        norm_ud u4 = {kind, 1, 0, true, true};                  /* threaded */
        kn_opin f[3] = {IN(2, s4, -2, 3), IN(1, w4, 0.5, 1.5), IN(1, w4, -1, 1)};
        BOTH(true, b_norm, &u4, 3, f, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
        kn_opin g[3] = {TR(IN(2, s1, -2, 3)), IN(1, w1, 0.5, 1.5), IN(1, w1, -1, 1)};   /* strided rows: reference */
        BOTH(false, b_norm, &u, 3, g, kind ? KN_OP_LAYER_NORM : KN_OP_RMS_NORM);
    }
}

/* ---- softmax ------------------------------------------------------------------ */
typedef struct { int dim; bool logsm; } sm_ud;
static kn_tensor *b_sm(kn_ctx *ctx, kn_tensor **in, void *ud) {
    sm_ud *u = ud;
    return u->logsm ? kn_log_softmax(ctx, in[0], u->dim) : kn_softmax(ctx, in[0], u->dim);
}
TEST(softmax_any_dim) {
    int64_t a[2] = {7, 33}, b[2] = {5, 300}, c[4] = {3, 4, 5, 6}, d[2] = {64, 1024}, f[2] = {512, 80}, g[1] = {1};
    struct { int nd; int64_t *s; int dim; bool tr; } cs[] = {
        {2, a, 1, false}, {2, a, 0, false}, {2, b, 0, false}, {4, c, 1, false}, {4, c, 3, false},
        {4, c, 0, false}, {2, d, 1, false}, {2, f, 0, false}, {1, g, 0, false}, {2, a, 0, true}};
    for (int lg = 0; lg < 2; lg++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            sm_ud u = {cs[i].dim, lg == 1};
            kn_opin x = IN(cs[i].nd, cs[i].s, -20, 20);
            x.transposed = cs[i].tr;     /* transposed [33,7] seen as [7,33]: dim 0 has unit stride, inner strided */
            BOTH(!cs[i].tr, b_sm, &u, 1, &x, lg ? KN_OP_LOG_SOFTMAX : KN_OP_SOFTMAX);
        }
}

/* ---- rope ------------------------------------------------------------------------- */
typedef struct { int n_rot; bool neox; double fs; bool perm; bool ff; } rope_ud;
static kn_tensor *b_rope(kn_ctx *ctx, kn_tensor **in, void *ud) {
    rope_ud *u = ud;
    kn_tensor *x = in[0];
    if (u->perm) { int p[4] = {0, 2, 1, 3}; x = kn_permute(ctx, x, p); }   /* [B,T,H,D] -> [B,H,T,D] */
    return kn_rope_ff(ctx, x, in[1], u->n_rot, 10000.0, u->neox, u->fs, u->ff ? in[2] : NULL);
}
TEST(rope_modes) {
    int64_t s1[4] = {2, 3, 5, 16}, s2[4] = {2, 5, 3, 16}, s3[4] = {1, 8, 64, 128}, s4[3] = {4, 1, 64};
    for (int neox = 0; neox < 2; neox++) {
        rope_ud u = {16, neox == 1, 1.0, false};
        kn_opin a[2] = {IN(4, s1, -1, 1), IDX(5, 100, KN_I32)};
        BOTH(true, b_rope, &u, 2, a, KN_OP_ROPE);
        rope_ud u2 = {8, neox == 1, -0.5, false};                          /* partial, inverse */
        BOTH(true, b_rope, &u2, 2, a, KN_OP_ROPE);
        rope_ud u3 = {16, neox == 1, 1.0, true};                           /* strided outer dims */
        kn_opin b[2] = {IN(4, s2, -1, 1), IDX(5, 4000, KN_I64)};
        BOTH(true, b_rope, &u3, 2, b, KN_OP_ROPE);
        rope_ud u4 = {128, neox == 1, 1.0, false};                         /* threaded */
        kn_opin c[2] = {IN(4, s3, -1, 1), IDX(64, 4096, KN_I32)};
        BOTH(true, b_rope, &u4, 2, c, KN_OP_ROPE);
        rope_ud u5 = {64, neox == 1, 1.0, false};                          /* decode: T = 1 */
        kn_opin d[2] = {IN(3, s4, -1, 1), IDX(1, 4096, KN_I32)};
        BOTH(true, b_rope, &u5, 2, d, KN_OP_ROPE);
        kn_opin f[2] = {TR(IN(4, s1, -1, 1)), IDX(5, 100, KN_I32)};       /* D strided: reference */
        BOTH(false, b_rope, &u, 2, f, KN_OP_ROPE);
        rope_ud u6 = {16, neox == 1, 0.5, false, true};                    /* freq factors (Llama 3 / YaRN) */
        int64_t h8[1] = {8};
        kn_opin g[3] = {IN(4, s1, -1, 1), IDX(5, 4000, KN_I32), IN(1, h8, 1, 32)};
        BOTH(true, b_rope, &u6, 3, g, KN_OP_ROPE);
    }
}

/* ---- sdpa ------------------------------------------------------------------------- */
typedef struct { bool causal; double scale; bool perm, f16kv; int64_t window; double softcap; } sdpa_ud;
static kn_tensor *b_sdpa(kn_ctx *ctx, kn_tensor **in, void *ud) {
    sdpa_ud *u = ud;
    kn_tensor *q = in[0], *k = in[1], *v = in[2];
    if (u->perm) {   /* inputs stored [B,T,H,D] */
        int p[4] = {0, 2, 1, 3};
        q = kn_permute(ctx, q, p); k = kn_permute(ctx, k, p); v = kn_permute(ctx, v, p);
    }
    if (u->f16kv) { k = kn_cast(ctx, k, KN_F16); v = kn_cast(ctx, v, KN_F16); }   /* an f16 KV cache */
    return kn_sdpa_ex(ctx, q, k, v, u->causal, u->scale, u->window, u->softcap);
}
TEST(sdpa_gqa_causal) {
    struct { int64_t B, Hq, Tq, D, Hkv, Tk, Dv; bool causal, perm; double scale; } cs[] = {
        {1, 4, 1, 16, 2, 9, 16, false, false, 0},       /* decode, GQA */
        {2, 6, 5, 8, 3, 7, 8, true, false, 0},          /* causal with offset 2 */
        {1, 2, 6, 8, 1, 4, 8, true, false, 0},          /* Tq > Tk: first rows have no key (NaN) */
        {1, 3, 4, 5, 3, 6, 12, true, false, 0.3},       /* odd D, Dv != D, custom scale */
        {2, 4, 7, 16, 2, 7, 16, true, true, 0},         /* strided (permuted) operands */
        {1, 9, 1, 64, 3, 600, 64, true, false, 0},      /* decode, threaded */
        {1, 4, 48, 32, 2, 48, 32, true, false, 0},      /* prefill */
        /* blocks of query rows (cpu_attention.c: sdpa_blocks) */
        {2, 6, 150, 16, 3, 150, 24, true, true, 0},     /* many blocks, the last short, permuted */
        {1, 2, 20, 8, 1, 12, 8, true, false, 0},        /* Tq > Tk: a block's first rows see no key */
        {1, 2, 40, 8, 2, 30, 8, false, false, 0},       /* not causal, Tq != Tk */
        {1, 3, 9, 16, 1, 3000, 16, true, false, 0},     /* long keys: fewer rows a block */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        sdpa_ud u = {cs[i].causal, cs[i].scale, cs[i].perm};
        int64_t q[4] = {cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, k[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D};
        int64_t v[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv};
        if (cs[i].perm) {
            int64_t t;
            t = q[1]; q[1] = q[2]; q[2] = t; t = k[1]; k[1] = k[2]; k[2] = t; t = v[1]; v[1] = v[2]; v[2] = t;
        }
        kn_opin a[3] = {IN(4, q, -1, 1), IN(4, k, -1, 1), IN(4, v, -1, 1)};
        BOTH(true, b_sdpa, &u, 3, a, KN_OP_SDPA);
        u.f16kv = true;                                 /* the same with f16 K and V */
        BOTH(true, b_sdpa, &u, 3, a, KN_OP_SDPA);
    }
    sdpa_ud u = {false, 0, false};
    int64_t q[4] = {1, 2, 3, 4}, k[4] = {1, 1, 5, 4};
    kn_opin a[3] = {TR(IN(4, q, -1, 1)), IN(4, k, -1, 1), IN(4, k, -1, 1)};   /* D strided: reference */
    BOTH(false, b_sdpa, &u, 3, a, KN_OP_SDPA);
}
static kn_tensor *b_sdpa_grad(kn_ctx *ctx, kn_tensor **in, void *ud);
/* sliding window and soft-capping (kn_sdpa_ex), forward and gradient */
TEST(sdpa_window_softcap) {
    struct { int64_t B, Hq, Tq, D, Hkv, Tk, Dv, W; double cap; bool perm; } cs[] = {
        {1, 4, 1, 16, 2, 90, 16, 17, 0, false},        /* decode past the window */
        {2, 6, 5, 8, 3, 12, 8, 4, 0, false},           /* rows after a cache, GQA */
        {1, 4, 48, 32, 2, 48, 32, 16, 50, false},      /* prefill, window and softcap */
        {1, 3, 7, 5, 3, 7, 12, 3, 0.9, true},          /* odd D, Dv != D, permuted, small cap */
        {1, 2, 6, 8, 1, 6, 8, 1, 0, false},            /* window 1 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        sdpa_ud u = {true, 0, cs[i].perm, false, cs[i].W, cs[i].cap};
        int64_t q[4] = {cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, k[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D};
        int64_t v[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv}, y[4] = {cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].Dv};
        if (cs[i].perm) {
            int64_t t;
            t = q[1]; q[1] = q[2]; q[2] = t; t = k[1]; k[1] = k[2]; k[2] = t; t = v[1]; v[1] = v[2]; v[2] = t;
            t = y[1]; y[1] = y[2]; y[2] = t;
        }
        kn_opin a[4] = {IN(4, q, -2, 2), IN(4, k, -2, 2), IN(4, v, -1, 1), IN(4, y, -1, 1)};
        BOTH(true, b_sdpa, &u, 3, a, KN_OP_SDPA);
        if (!cs[i].perm) BOTH(true, b_sdpa_grad, &u, 4, a, KN_OP_SDPA_BWD);
        u.f16kv = true;
        BOTH(true, b_sdpa, &u, 3, a, KN_OP_SDPA);
    }
}

/* gradients of sum(sdpa(q, k, v) * dy) w.r.t. q, k, v: one SDPA_BWD node */
static kn_tensor *b_sdpa_grad(kn_ctx *ctx, kn_tensor **in, void *ud) {
    sdpa_ud *u = ud;
    kn_tensor *leaf[3];
    for (int i = 0; i < 3; i++) { leaf[i] = in[i]; kn_set_requires_grad(leaf[i], true); }
    kn_tensor *q = in[0], *k = in[1], *v = in[2];
    if (u->perm) {
        int p[4] = {0, 2, 1, 3};
        q = kn_permute(ctx, q, p); k = kn_permute(ctx, k, p); v = kn_permute(ctx, v, p);
    }
    kn_tensor *y = kn_sdpa_ex(ctx, q, k, v, u->causal, u->scale, u->window, u->softcap), *gr[3] = {0};
    if (!y || kn_gradients(ctx, 1, &y, &in[3], 3, leaf, gr) != KN_OK || !gr[0] || !gr[1] || !gr[2]) return NULL;
    kn_tensor *parts[3];
    for (int i = 0; i < 3; i++) { int64_t n = kn_numel(gr[i]); parts[i] = kn_reshape(ctx, gr[i], 1, &n); }
    return kn_cat(ctx, parts, 3, 0);
}
TEST(sdpa_backward) {
    struct { int64_t B, Hq, Tq, D, Hkv, Tk, Dv; bool causal, perm; double scale; } cs[] = {
        {2, 6, 5, 8, 3, 7, 8, true, false, 0},          /* GQA, causal with offset 2 */
        {1, 3, 4, 5, 3, 6, 12, true, false, 0.3},       /* odd D, Dv != D, custom scale */
        {2, 4, 7, 16, 2, 7, 16, true, true, 0},         /* strided (permuted) operands */
        {1, 2, 9, 8, 2, 5, 8, false, false, 0},         /* not causal, Tq > Tk */
        {2, 4, 64, 32, 4, 64, 32, true, false, 0},      /* training shape, threaded */
        {1, 8, 33, 24, 1, 33, 24, true, true, 0},       /* multi-query, permuted */
        {1, 4, 150, 16, 2, 150, 12, true, false, 0},    /* many blocks, Dv != D */
        {1, 2, 20, 8, 1, 12, 8, true, false, 0},        /* Tq > Tk: rows without a key */
        {1, 2, 40, 8, 2, 30, 8, false, true, 0},        /* not causal, Tq != Tk, permuted */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        sdpa_ud u = {cs[i].causal, cs[i].scale, cs[i].perm};
        int64_t q[4] = {cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, k[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D};
        int64_t v[4] = {cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv}, y[4] = {cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].Dv};
        if (cs[i].perm) {
            int64_t t;
            t = q[1]; q[1] = q[2]; q[2] = t; t = k[1]; k[1] = k[2]; k[2] = t; t = v[1]; v[1] = v[2]; v[2] = t;
        }
        kn_opin a[4] = {IN(4, q, -1, 1), IN(4, k, -1, 1), IN(4, v, -1, 1), IN(4, y, -1, 1)};
        BOTH(true, b_sdpa_grad, &u, 4, a, KN_OP_SDPA_BWD);
    }
    sdpa_ud u = {true, 0, false};
    int64_t q[4] = {1, 2, 3, 4}, k[4] = {1, 1, 5, 4}, y[4] = {1, 2, 3, 4};
    kn_opin a[4] = {TR(IN(4, q, -1, 1)), IN(4, k, -1, 1), IN(4, k, -1, 1), IN(4, y, -1, 1)};   /* D strided: reference */
    BOTH(false, b_sdpa_grad, &u, 4, a, KN_OP_SDPA_BWD);
}

/* ---- cat: strided parts copied into their slabs ------------------------------------ */
typedef struct { int dim; bool perm; } cat_ud;
static kn_tensor *b_cat(kn_ctx *ctx, kn_tensor **in, void *ud) {
    cat_ud *u = ud;
    kn_tensor *p[3] = {in[0], in[1], in[2]};
    if (u->perm) { int pm[3] = {0, 2, 1}; for (int i = 0; i < 3; i++) p[i] = kn_permute(ctx, p[i], pm); }
    return kn_cat(ctx, p, 3, u->dim);
}
TEST(cat_strided) {
    int64_t a[3] = {4, 5, 6}, b[3] = {4, 5, 2}, c[3] = {4, 5, 9}, t[3] = {8, 64, 128};
    cat_ud u0 = {2, false}, u1 = {1, true}, u2 = {2, false};
    kn_opin x[3] = {IN(3, a, -1, 1), IN(3, b, -1, 1), TR(IN(3, c, -1, 1))};
    BOTH(true, b_cat, &u0, 3, x, KN_OP_CAT);
    BOTH(true, b_cat, &u1, 3, x, KN_OP_CAT);          /* permuted parts along their middle dim */
    kn_opin y[3] = {IN(3, t, -1, 1), TR(IN(3, t, -1, 1)), IN(3, t, -1, 1)};   /* threaded */
    BOTH(true, b_cat, &u2, 3, y, KN_OP_CAT);
}

/* ---- constant pad (a slice's gradient) ------------------------------------------------ */
typedef struct { int np; int64_t pads[6]; double v; } pad_ud;
static kn_tensor *b_pad(kn_ctx *ctx, kn_tensor **in, void *ud) {
    pad_ud *u = ud;
    return kn_pad(ctx, in[0], u->np, u->pads, KN_PAD_CONSTANT, u->v);
}
TEST(pad_constant) {
    int64_t s1[3] = {3, 5, 7}, s2[2] = {512, 128};
    pad_ud a = {1, {2, 1}, 0}, b = {2, {0, 0, 1, 3}, -1.5}, c = {3, {1, 0, 0, 2, 2, 1}, 0.25}, d = {1, {128, 128}, 0};
    kn_opin x1[1] = {IN(3, s1, -1, 1)}, x2[1] = {IN(2, s2, -1, 1)};
    BOTH(true, b_pad, &a, 1, x1, KN_OP_PAD);
    BOTH(true, b_pad, &b, 1, x1, KN_OP_PAD);
    BOTH(true, b_pad, &c, 1, x1, KN_OP_PAD);
    BOTH(true, b_pad, &d, 1, x2, KN_OP_PAD);          /* the qkv split's gradient, threaded */
    kn_opin x3[1] = {TR(IN(3, s1, -1, 1))};          /* last dim strided: reference */
    BOTH(false, b_pad, &a, 1, x3, KN_OP_PAD);
}

/* ---- index ops ---------------------------------------------------------------------- */
typedef struct { int dim; } dim_ud;
static kn_tensor *b_isel(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_index_select(ctx, in[0], ((dim_ud *)ud)->dim, in[1]); }
static kn_tensor *b_iadd(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_index_add(ctx, in[0], ((dim_ud *)ud)->dim, in[1], in[2]); }
static kn_tensor *b_icopy(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_index_copy(ctx, in[0], ((dim_ud *)ud)->dim, in[1], in[2]); }
/* scatter_add of src into x (dim 0 or 1 of 2-d), or into zeros (gather's gradient: x a broadcast 0) */
typedef struct { int dim; bool zeros; } sc_ud;
static kn_tensor *b_scadd(kn_ctx *ctx, kn_tensor **in, void *ud) {
    sc_ud *u = ud;
    kn_tensor *x = u->zeros ? kn_zeros_like(ctx, in[0]) : in[0];
    return kn_scatter_add(ctx, x, u->dim, kn_cast(ctx, in[1], KN_I64), in[2]);
}
TEST(index_select_add_copy) {
    int64_t x1[2] = {10, 7}, x2[3] = {4, 9, 5}, x3[2] = {200, 256}, x4[3] = {3, 40, 8};
    dim_ud d0 = {0}, d1 = {1}, d2 = {2};
    kn_opin a[2] = {IN(2, x1, -1, 1), IDX(6, 10, KN_I32)};
    BOTH(true, b_isel, &d0, 2, a, KN_OP_INDEX_SELECT);
    kn_opin b[2] = {IN(3, x2, -1, 1), IDX(11, 9, KN_I64)};
    BOTH(true, b_isel, &d1, 2, b, KN_OP_INDEX_SELECT);
    kn_opin c[2] = {IN(2, x3, -1, 1), IDX(300, 200, KN_I32)};
    BOTH(true, b_isel, &d0, 2, c, KN_OP_INDEX_SELECT);
    kn_opin c2[2] = {IN(3, x2, -1, 1), IDX(3, 5, KN_I32)};              /* last dim: inner size 1 */
    BOTH(true, b_isel, &d2, 2, c2, KN_OP_INDEX_SELECT);
    kn_opin c3[2] = {TR(IN(2, x1, -1, 1)), IDX(4, 10, KN_I32)};         /* strided rows: reference */
    BOTH(false, b_isel, &d0, 2, c3, KN_OP_INDEX_SELECT);

    int64_t s1[2] = {15, 7}, s2[3] = {4, 20, 5}, s3[2] = {2000, 256};
    kn_opin f[3] = {IN(2, x1, -1, 1), IDX(15, 10, KN_I32), IN(2, s1, -1, 1)};   /* repeated indices */
    BOTH(true, b_iadd, &d0, 3, f, KN_OP_INDEX_ADD);
    kn_opin g[3] = {IN(3, x2, -1, 1), IDX(20, 9, KN_I64), IN(3, s2, -1, 1)};
    BOTH(true, b_iadd, &d1, 3, g, KN_OP_INDEX_ADD);
    kn_opin h[3] = {IN(2, x3, -1, 1), IDX(2000, 200, KN_I32), IN(2, s3, -1, 1)};  /* threaded (embedding grad) */
    BOTH(true, b_iadd, &d0, 3, h, KN_OP_INDEX_ADD);
    int64_t s4[3] = {4, 9, 12}, x5[2] = {512, 384}, s5[2] = {512, 128};
    kn_opin g2[3] = {IN(3, x2, -1, 1), IDX(12, 5, KN_I32), IN(3, s4, -1, 1)};   /* last dim (inner 1), repeats */
    BOTH(true, b_iadd, &d2, 3, g2, KN_OP_INDEX_ADD);
    kn_opin g3[3] = {IN(2, x5, -1, 1), IDX(128, 384, KN_I64), IN(2, s5, -1, 1)}; /* narrow backward, threaded */
    BOTH(true, b_iadd, &d1, 3, g3, KN_OP_INDEX_ADD);

    /* scatter_add: index [R, k] into x [R, C] along dim 1 (cross-entropy backward), and along dim 0 */
    int64_t sx[2] = {64, 37}, ss[2] = {64, 5}, sj[2] = {20, 37};
    sc_ud su1 = {1, true}, su2 = {1, false}, su3 = {0, false};
    kn_opin sa[3] = {IN(2, sx, -1, 1), {2, {64, 3}, 0, 37, 0, false, true}, IN(2, ss, -1, 1)};
    BOTH(true, b_scadd, &su1, 3, sa, KN_OP_SCATTER_ADD);
    BOTH(true, b_scadd, &su2, 3, sa, KN_OP_SCATTER_ADD);
    kn_opin sb[3] = {IN(2, sx, -1, 1), {2, {20, 37}, 0, 64, 0, false, true}, IN(2, sj, -1, 1)};
    BOTH(true, b_scadd, &su3, 3, sb, KN_OP_SCATTER_ADD);

    int64_t k1[3] = {3, 2, 8}, k2[3] = {2, 40, 8};
    kn_opin m[3] = {IN(3, x4, -1, 1), IDX(2, 40, KN_I32), IN(3, k1, -1, 1)};     /* KV cache rows */
    BOTH(true, b_icopy, &d1, 3, m, KN_OP_INDEX_COPY);
    kn_opin n[3] = {IN(3, x4, -1, 1), IDX(2, 3, KN_I64), IN(3, k2, -1, 1)};
    BOTH(true, b_icopy, &d0, 3, n, KN_OP_INDEX_COPY);
    int64_t k3[3] = {3, 7, 8};
    kn_opin o[3] = {IN(3, x4, -1, 1), IDX(7, 4, KN_I32), IN(3, k3, -1, 1)};      /* repeated: last wins */
    BOTH(true, b_icopy, &d1, 3, o, KN_OP_INDEX_COPY);
}

/* an out-of-range index: the fast path declines and the reference reports it */
TEST(index_out_of_range) {
    kn_ctx_opts op = {&g_nn};
    kn_ctx *ctx = kn_ctx_new(&op);
    int64_t sx[2] = {4, 3}, si = 2;
    float xv[12] = {0};
    int32_t iv[2] = {1, 4};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, sx, xv), *ix = kn_from_data(ctx, KN_I32, 1, &si, iv);
    float out[6];
    kn_status st = kn_tensor_read(kn_index_select(ctx, x, 0, ix), out, KN_F32);
    CHECK(st != KN_OK && strstr(kn_last_error(), "index_select"), "status %d, message: %s", st, kn_last_error());
    kn_ctx_free(ctx);
}

/* quantized embedding rows: dequantized on the way (checked against kn_dequantize_row) */
TEST(index_select_quantized) {
    enum { V = 6, C = 64 };
    float w[V * C], deq[V * C], out[3 * C];
    for (int i = 0; i < V * C; i++) w[i] = (float)kn_test_uniform(-1, 1);
    kn_dtype qts[2] = {KN_Q8_0, KN_Q4_0};
    for (int q = 0; q < 2; q++) {
        size_t rb = kn_dtype_nbytes(qts[q], C);
        char *qw = malloc(rb * V);
        REQUIRE(qw, "out of memory");
        for (int r = 0; r < V; r++) {
            REQUIRE(kn_quantize_row(qts[q], w + r * C, qw + r * rb, C) == KN_OK, "quantize: %s", kn_last_error());
            REQUIRE(kn_dequantize_row(qts[q], qw + r * rb, deq + r * C, C) == KN_OK, "dequantize: %s", kn_last_error());
        }
        int64_t ids[3] = {5, 0, 5};
        kn_tensor node; memset(&node, 0, sizeof node);
        node.op = KN_OP_INDEX_SELECT; node.p.axis.dim = 0;
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = 2;
        e.src[0] = (kn_tview){qw, qts[q], 2, {V, C}, {C, 1}};
        e.src[1] = (kn_tview){ids, KN_I64, 1, {3}, {1}};
        e.dst = (kn_tview){out, KN_F32, 2, {3, C}, {C, 1}};
        CHECK(kn_cpu_fast(&e), "quantized index_select not taken");
        double err = 0;
        for (int r = 0; r < 3; r++)
            for (int k = 0; k < C; k++) err = fmax(err, fabs(out[r * C + k] - deq[ids[r] * C + k]));
        CHECK(err == 0, "dequantized rows differ by %g", err);
        free(qw);
    }
}

/* ---- strided copy ------------------------------------------------------------------ */
typedef struct { int kind; } cp_ud;
static kn_tensor *b_copy(kn_ctx *ctx, kn_tensor **in, void *ud) {
    cp_ud *u = ud;
    kn_tensor *x = in[0];
    if (u->kind == 1) { int p[3] = {2, 0, 1}; x = kn_permute(ctx, x, p); }
    if (u->kind == 2) x = kn_slice(ctx, kn_slice(ctx, x, 1, 1, 40, 3), 0, 0, 9, 2);
    if (u->kind == 3) { int p[4] = {0, 2, 1, 3}; x = kn_permute(ctx, x, p); }
    return kn_copy(ctx, x);
}
TEST(copy_strided) {
    int64_t a[2] = {37, 53}, b[3] = {4, 5, 6}, c[2] = {9, 40}, d[2] = {300, 300}, f[4] = {2, 7, 6, 16};
    cp_ud u0 = {0}, u1 = {1}, u2 = {2}, u3 = {3};
    kn_opin x = TR(IN(2, a, -1, 1));
    BOTH(true, b_copy, &u0, 1, &x, KN_OP_COPY);
    kn_opin y = IN(3, b, -1, 1);
    BOTH(true, b_copy, &u1, 1, &y, KN_OP_COPY);
    kn_opin z = IN(2, c, -1, 1);
    BOTH(true, b_copy, &u2, 1, &z, KN_OP_COPY);
    kn_opin w = TR(IN(2, d, -1, 1));                  /* threaded transpose */
    BOTH(true, b_copy, &u0, 1, &w, KN_OP_COPY);
    kn_opin v = IN(4, f, -1, 1);                      /* heads <-> positions */
    BOTH(true, b_copy, &u3, 1, &v, KN_OP_COPY);
    kn_opin iv = TR(IN(2, a, -1000, 1000)); iv.dtype = KN_I32; iv.integer = true;
    BOTH(true, b_copy, &u0, 1, &iv, KN_OP_COPY);
}

/* ---- convolution -------------------------------------------------------------------- */
typedef struct { int s[2], p[2], d[2], g; bool bias, trans; int op[2]; } conv_ud;
static kn_tensor *b_conv(kn_ctx *ctx, kn_tensor **in, void *ud) {
    conv_ud *u = ud;
    if (u->trans) return kn_conv_transpose2d(ctx, in[0], in[1], u->bias ? in[2] : NULL, u->s, u->p, u->op, u->d, u->g);
    return kn_conv2d(ctx, in[0], in[1], u->bias ? in[2] : NULL, u->s, u->p, u->d, u->g);
}
/* in[i] tracking gradients (a transposed input view is rebuilt over its leaf) */
static kn_tensor *track(kn_ctx *ctx, kn_tensor *t) {
    kn_tensor *leaf = t->view_src ? t->view_src : t;
    kn_set_requires_grad(leaf, true);
    return t->view_src ? kn_transpose(ctx, leaf, -1, -2) : leaf;
}
/* gradients of sum(conv(x, w) * dy) w.r.t. x and w (CONV2D_BWD_W and a transposed conv) */
static kn_tensor *b_conv_grad(kn_ctx *ctx, kn_tensor **in, void *ud) {
    conv_ud *u = ud;
    in[0] = track(ctx, in[0]); in[1] = track(ctx, in[1]);
    kn_tensor *y = kn_conv2d(ctx, in[0], in[1], NULL, u->s, u->p, u->d, u->g);
    kn_tensor *gr[2] = {0};
    if (!y || kn_gradients(ctx, 1, &y, &in[2], 2, in, gr) != KN_OK || !gr[0] || !gr[1]) return NULL;
    int64_t n0 = kn_numel(gr[0]), n1 = kn_numel(gr[1]);
    kn_tensor *parts[2] = {kn_reshape(ctx, gr[0], 1, &n0), kn_reshape(ctx, gr[1], 1, &n1)};
    return kn_cat(ctx, parts, 2, 0);
}
TEST(conv2d_forward_backward) {
    struct { int64_t x[4], w[4]; conv_ud u; bool tr; } cs[] = {
        {{2, 3, 9, 9}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1, true, false, {0, 0}}, false},
        {{2, 4, 8, 7}, {6, 2, 3, 3}, {{1, 1}, {0, 1}, {1, 1}, 2, true, false, {0, 0}}, false},
        {{1, 2, 11, 10}, {3, 2, 3, 2}, {{1, 2}, {2, 1}, {2, 3}, 1, false, false, {0, 0}}, false},
        {{8, 1, 28, 28}, {16, 1, 5, 5}, {{1, 1}, {2, 2}, {1, 1}, 1, true, false, {0, 0}}, false},
        {{2, 3, 9, 9}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1, true, false, {0, 0}}, true},   /* strided x */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int64_t bs[1] = {cs[i].w[0]};
        kn_opin a[3] = {IN(4, cs[i].x, -1, 1), IN(4, cs[i].w, -1, 1), IN(1, bs, -1, 1)};
        a[0].transposed = cs[i].tr;
        BOTH(true, b_conv, &cs[i].u, 3, a, KN_OP_CONV2D);
        if (cs[i].tr) continue;
        /* backward: dy has the output's shape */
        kn_ctx *ctx = kn_ctx_new(NULL);
        kn_tensor *xx = kn_empty(ctx, KN_F32, 4, cs[i].x), *ww = kn_empty(ctx, KN_F32, 4, cs[i].w);
        kn_tensor *yy = kn_conv2d(ctx, xx, ww, NULL, cs[i].u.s, cs[i].u.p, cs[i].u.d, cs[i].u.g);
        REQUIRE(yy, "conv2d: %s", kn_last_error());
        kn_opin g[3] = {a[0], a[1], IN(4, yy->shape, -1, 1)};
        kn_ctx_free(ctx);
        BOTH(true, b_conv_grad, &cs[i].u, 3, g, KN_OP_CONV2D_BWD_W);
        BOTH(true, b_conv_grad, &cs[i].u, 3, g, KN_OP_CONV_TRANSPOSE2D);
    }
}
TEST(conv_transpose2d) {
    struct { int64_t x[4], w[4]; conv_ud u; } cs[] = {
        {{2, 4, 5, 5}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1, true, true, {1, 1}}},
        {{1, 4, 6, 5}, {4, 2, 2, 3}, {{1, 2}, {0, 1}, {2, 1}, 2, true, true, {0, 1}}},
        {{3, 2, 7, 7}, {2, 5, 4, 4}, {{2, 2}, {1, 1}, {1, 1}, 1, false, true, {0, 0}}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int64_t bs[1] = {cs[i].w[1] * cs[i].u.g};
        kn_opin a[3] = {IN(4, cs[i].x, -1, 1), IN(4, cs[i].w, -1, 1), IN(1, bs, -1, 1)};
        BOTH(true, b_conv, &cs[i].u, 3, a, KN_OP_CONV_TRANSPOSE2D);
        a[0].transposed = true;                       /* strided x: packed */
        BOTH(true, b_conv, &cs[i].u, 3, a, KN_OP_CONV_TRANSPOSE2D);
    }
}

/* ---- max pooling ---------------------------------------------------------------------- */
typedef struct { int k[2], s[2], p[2], d[2]; bool ceil, grad; } pool_ud;
static kn_tensor *b_pool(kn_ctx *ctx, kn_tensor **in, void *ud) {
    pool_ud *u = ud;
    if (u->grad) in[0] = track(ctx, in[0]);
    kn_tensor *y = kn_max_pool2d(ctx, in[0], u->k, u->s, u->p, u->d, u->ceil);
    if (!u->grad || !y) return y;
    kn_tensor *gx = NULL;
    kn_tensor *dy = kn_mul_scalar(ctx, kn_add_scalar(ctx, y, 3.0), 0.5);   /* a varied upstream gradient */
    if (kn_gradients(ctx, 1, &y, &dy, 1, in, &gx) != KN_OK) return NULL;
    return gx;
}
TEST(max_pool2d_forward_backward) {
    int64_t a[4] = {2, 3, 9, 9}, b[3] = {5, 12, 11}, c[4] = {8, 16, 24, 24};
    pool_ud cs[] = {
        {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false},
        {{2, 3}, {2, 1}, {1, 0}, {2, 1}, true, false},
        {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int g = 0; g < 2; g++) {
            cs[i].grad = g == 1;
            kn_op op = g ? KN_OP_MAX_POOL2D_BWD : KN_OP_MAX_POOL2D;
            kn_opin x = IN(4, a, -1, 1);
            BOTH(true, b_pool, &cs[i], 1, &x, op);
            x.transposed = true;
            BOTH(true, b_pool, &cs[i], 1, &x, op);
            kn_opin y = IN(3, b, -1, 1);
            BOTH(true, b_pool, &cs[i], 1, &y, op);
            kn_opin z = IN(4, c, -1, 1);                  /* threaded */
            BOTH(true, b_pool, &cs[i], 1, &z, op);
        }
}

KN_TEST_MAIN()
