/* test_rewrite.c: the graph rewrites of src/compile/rewrite.c (docs/COMPILER.md).
 *
 * Each case builds the same graph twice (two contexts, same data), plans one
 * with rewrites off (kn_plan_opts.no_rewrite) and one with them on, runs both
 * and checks: the outputs are bit-identical (inputs hold random values and
 * -0.0, NaN, inf), the rule fired as often as expected (or not at all: the
 * must-not-fire cases), the plan shrank by the expected number of nodes (the
 * rules' counts less the nodes they made), and the user's graph (every
 * node's sources) is unchanged by planning. */
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"
#include "core/env.h"
#include <stdint.h>

#define MAXO 4
/* KN_NOFUSE=1 turns every plan's rewrites off: nothing to test then */
#define NEED_RW() do { if (kn_env_get()->nofuse) SKIP("KN_NOFUSE is set"); } while (0)
typedef int (*builder)(kn_ctx *ctx, kn_tensor **outs);

/* deterministic test data with special values */
static void fill_data(float *d, int n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        d[i] = ((float)(s >> 8) / (float)(1u << 24)) * 8.0f - 4.0f;
    }
    if (n > 4) { d[0] = -0.0f; d[1] = 0.0f; d[2] = NAN; d[3] = INFINITY; d[4] = -INFINITY; }
}
static kn_tensor *data(kn_ctx *ctx, int ndim, const int64_t *shape, uint32_t seed) {
    int n = 1;
    for (int i = 0; i < ndim; i++) n *= (int)shape[i];
    float *d = malloc(sizeof *d * (size_t)n);
    fill_data(d, n, seed);
    kn_tensor *t = kn_from_data(ctx, KN_F32, ndim, shape, d);
    free(d);
    return t;
}

typedef struct { int n_plain, n_rw, added; int removed[KN_RW_NRULES]; bool same; } result;

/* Every NaN in an output made canonical: a folded x*1 hands x's NaN on
 * as it is, while a GPU's multiply returns its canonical NaN (the H100 does),
 * so NaN payloads and signs are not part of what rewrites keep; every other
 * bit is. */
static void canon_nans(unsigned char *b, int64_t n, kn_dtype t) {
    for (int64_t i = 0; i < n; i++) {
        if (t == KN_F32) {
            uint32_t u; memcpy(&u, b + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) { u = 0x7fc00000u; memcpy(b + 4 * i, &u, 4); }
        } else if (t == KN_F64) {
            uint64_t u; memcpy(&u, b + 8 * i, 8);
            if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (u & 0xfffffffffffffull)) { u = 0x7ff8000000000000ull; memcpy(b + 8 * i, &u, 8); }
        } else if (t == KN_F16 || t == KN_BF16) {
            uint16_t u; memcpy(&u, b + 2 * i, 2);
            uint16_t e = t == KN_F16 ? 0x7c00 : 0x7f80, m = t == KN_F16 ? 0x03ff : 0x007f;
            if ((u & e) == e && (u & m)) { u = t == KN_F16 ? 0x7e00 : 0x7fc0; memcpy(b + 2 * i, &u, 2); }
        }
    }
}

/* outputs' bytes of one plan (NaNs canonical) */
static int run_one(builder b, bool rw, unsigned char **bytes, size_t *nb, int *nnodes, int *removed, int *added) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *outs[MAXO];
    int nout = b(ctx, outs);
    /* snapshot the graph's edges */
    int32_t nall = ctx->n_all;
    kn_tensor **snap = malloc(sizeof *snap * (size_t)nall * KN_MAX_SRC);
    for (int32_t i = 0; i < nall; i++) memcpy(snap + (size_t)i * KN_MAX_SRC, ctx->all[i]->src, sizeof(kn_tensor *) * KN_MAX_SRC);
    kn_plan_opts o = {0};
    o.no_rewrite = !rw;
    o.no_fuse = true;   /* the rewrites alone: fused kernels compute in their own order (test_fuse) */
    kn_plan *p = kn_plan_new(ctx, nout, outs, &o);
    if (!p) { fprintf(stderr, "plan: %s\n", kn_last_error()); free(snap); kn_ctx_free(ctx); return -1; }
    *nnodes = p->n;
    if (removed) memcpy(removed, p->rw_removed, sizeof p->rw_removed);
    if (added) *added = p->rw_added;
    int bad = kn_plan_run(p) != KN_OK;
    size_t tot = 0;
    for (int o2 = 0; o2 < nout; o2++) tot += (size_t)kn_numel(outs[o2]) * kn_dtype_get(outs[o2]->dtype)->type_size;
    *bytes = malloc(tot ? tot : 1); *nb = tot;
    size_t at = 0;
    for (int o2 = 0; o2 < nout && !bad; o2++) {
        bad |= kn_tensor_read(outs[o2], *bytes + at, outs[o2]->dtype) != KN_OK;
        canon_nans(*bytes + at, kn_numel(outs[o2]), outs[o2]->dtype);
        at += (size_t)kn_numel(outs[o2]) * kn_dtype_get(outs[o2]->dtype)->type_size;
    }
    for (int32_t i = 0; i < nall; i++)
        if (memcmp(snap + (size_t)i * KN_MAX_SRC, ctx->all[i]->src, sizeof(kn_tensor *) * KN_MAX_SRC)) bad = 1;
    free(snap);
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return bad ? -1 : 0;
}

static result compare(builder b) {
    result r; memset(&r, 0, sizeof r);
    unsigned char *a = NULL, *c = NULL; size_t na = 0, nc = 0;
    int e1 = run_one(b, false, &a, &na, &r.n_plain, NULL, NULL);
    int e2 = run_one(b, true, &c, &nc, &r.n_rw, r.removed, &r.added);
    r.same = e1 == 0 && e2 == 0 && na == nc && memcmp(a, c, na) == 0;
    free(a); free(c);
    return r;
}
static int total(const result *r) { int s = 0; for (int i = 0; i < KN_RW_NRULES; i++) s += r->removed[i]; return s; }

#define EXPECT(r, rule, cnt, drop) do {                                                          \
    CHECK((r).same, "results differ (or a run failed / the graph was changed)");                 \
    CHECK((r).removed[rule] == (cnt), "%s removed %d, expected %d", kn__rw_rule_name(rule), (r).removed[rule], (cnt)); \
    CHECK((r).n_plain - (r).n_rw == (drop), "plan %d -> %d nodes, expected %d fewer", (r).n_plain, (r).n_rw, (drop)); \
    CHECK(total(&(r)) - (r).added == (drop), "rule counts sum to %d, %d made, nodes dropped %d", total(&(r)), (r).added, (drop)); } while (0)

static const int64_t S2[2] = {6, 8}, S3[3] = {2, 3, 4};

/* ---- view chains ---- */
static int b_view_chain(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 1);
    int64_t a[1] = {48}, b[2] = {8, 6}, c[3] = {4, 2, 6};
    o[0] = kn_exp(ctx, kn_reshape(ctx, kn_reshape(ctx, kn_reshape(ctx, x, 1, a), 2, b), 3, c));
    return 1;
}
TEST(view_chain_folds) { NEED_RW(); result r = compare(b_view_chain); EXPECT(r, KN_RW_VIEW_CHAIN, 2, 2); }

/* an inner view also read by a kernel stays */
static int b_view_chain_used(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 2);
    int64_t a[1] = {48}, b[2] = {8, 6};
    kn_tensor *v = kn_reshape(ctx, x, 1, a);
    o[0] = kn_exp(ctx, kn_reshape(ctx, v, 2, b));
    o[1] = kn_neg(ctx, v);
    return 2;
}
TEST(view_chain_not_when_read_by_kernel) { NEED_RW(); result r = compare(b_view_chain_used); EXPECT(r, KN_RW_VIEW_CHAIN, 0, 0); }

/* an output view is never dropped */
static int b_view_out(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_exp(ctx, data(ctx, 2, S2, 3));
    int64_t a[1] = {48}, b[2] = {8, 6};
    o[0] = kn_reshape(ctx, x, 1, a);
    o[1] = kn_sin(ctx, kn_reshape(ctx, o[0], 2, b));
    return 2;
}
TEST(view_chain_not_outputs) { NEED_RW(); result r = compare(b_view_out); EXPECT(r, KN_RW_VIEW_CHAIN, 0, 0); }

/* ---- permute and its inverse ---- */
static int b_perm_inv(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_sin(ctx, data(ctx, 3, S3, 4));
    int p[3] = {2, 0, 1}, q[3] = {1, 2, 0};     /* q = p^-1 */
    o[0] = kn_exp(ctx, kn_permute(ctx, kn_permute(ctx, x, p), q));
    return 1;
}
/* the outer permute reads x in place; the inner one is then dead */
TEST(permute_inverse_removed) {
    NEED_RW(); result r = compare(b_perm_inv);
    EXPECT(r, KN_RW_PERMUTE_INVERSE, 1, 2);
    CHECK(r.removed[KN_RW_DEAD] == 1, "dead %d", r.removed[KN_RW_DEAD]);
}
static int b_perm_not_inv(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_sin(ctx, data(ctx, 3, S3, 5));
    int p[3] = {2, 0, 1};                       /* p twice is not the identity */
    o[0] = kn_exp(ctx, kn_permute(ctx, kn_permute(ctx, x, p), p));
    return 1;
}
TEST(permute_not_inverse_kept) {
    NEED_RW(); result r = compare(b_perm_not_inv);
    EXPECT(r, KN_RW_PERMUTE_INVERSE, 0, 1);     /* only the inner view folds into the outer */
    CHECK(r.removed[KN_RW_VIEW_CHAIN] == 1, "view_chain %d", r.removed[KN_RW_VIEW_CHAIN]);
}
/* a transpose of a transpose (two permutes, same swap) */
static int b_transpose2(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_sin(ctx, data(ctx, 2, S2, 6));
    o[0] = kn_matmul(ctx, kn_transpose(ctx, kn_transpose(ctx, x, 0, 1), 0, 1), kn_transpose(ctx, x, 0, 1));
    return 1;
}
TEST(transpose_twice_removed) { NEED_RW(); result r = compare(b_transpose2); EXPECT(r, KN_RW_PERMUTE_INVERSE, 1, 2); }

/* ---- arithmetic identities ---- */
static kn_tensor *cf(kn_ctx *ctx, double v) { return kn_scalar(ctx, KN_F32, v); }
static int b_arith(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 7);
    kn_tensor *y = kn_mul(ctx, x, cf(ctx, 1));          /* x*1 */
    y = kn_mul(ctx, cf(ctx, 1), y);                     /* 1*x */
    y = kn_div(ctx, y, cf(ctx, 1));                     /* x/1 */
    y = kn_add(ctx, y, cf(ctx, -0.0));                  /* x+(-0) */
    y = kn_add(ctx, cf(ctx, -0.0), y);                  /* (-0)+x */
    y = kn_sub(ctx, y, cf(ctx, 0.0));                   /* x-(+0) */
    o[0] = kn_neg(ctx, y);
    return 1;
}
TEST(arith_identities_fold) {
    NEED_RW(); result r = compare(b_arith);
    /* 6 identities; cse merges the repeated constants (1 three times, -0.0 twice: 3),
     * the 3 distinct ones are then dead: only neg is left (leaves are not scheduled) */
    EXPECT(r, KN_RW_ARITH_IDENTITY, 6, 6 + 3 + 3);
    CHECK(r.removed[KN_RW_DEAD] == 3 && r.removed[KN_RW_CSE] == 3, "dead %d cse %d", r.removed[KN_RW_DEAD], r.removed[KN_RW_CSE]);
    CHECK(r.n_rw == 1, "%d nodes left", r.n_rw);
}
static int b_arith_not(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 8);
    int64_t row[1] = {8};
    kn_tensor *ones = kn_full(ctx, KN_F32, 2, (int64_t[2]){6, 8}, 1.0);
    o[0] = kn_add(ctx, kn_add(ctx, x, cf(ctx, 0.0)),   /* x + (+0): -0 + 0 = +0, not x */
                  kn_mul(ctx, x, cf(ctx, 0.0)));        /* x * 0: NaN, inf */
    o[1] = kn_mul(ctx, data(ctx, 1, row, 9), ones);     /* broadcast: shape changes */
    o[2] = kn_add(ctx, x, kn_scalar(ctx, KN_I32, -0.0));/* an integer -0.0 is +0 */
    o[3] = kn_sub(ctx, x, cf(ctx, -0.0));               /* x - (-0) = x + 0 */
    return 4;
}
TEST(arith_not_fold) {
    NEED_RW(); result r = compare(b_arith_not);
    EXPECT(r, KN_RW_ARITH_IDENTITY, 0, 1);
    CHECK(r.removed[KN_RW_CSE] == 1, "cse %d (the two +0.0 constants)", r.removed[KN_RW_CSE]);
}
static int b_arith_int(kn_ctx *ctx, kn_tensor **o) {
    int32_t d[6] = {-3, 0, 7, INT32_MIN, INT32_MAX, 5};
    int64_t s[1] = {6};
    kn_tensor *x = kn_from_data(ctx, KN_I32, 1, s, d);
    kn_tensor *y = kn_add(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_I32, 1)), kn_scalar(ctx, KN_I32, 0));
    o[0] = kn_mul(ctx, y, kn_scalar(ctx, KN_I32, 3));
    o[1] = kn_div(ctx, x, kn_scalar(ctx, KN_I32, 1));   /* true division gives f32: not x */
    return 2;
}
TEST(arith_int) { NEED_RW(); result r = compare(b_arith_int); EXPECT(r, KN_RW_ARITH_IDENTITY, 2, 4); }

/* an identity whose result is an output stays (the output is the user's tensor) */
static int b_arith_out(kn_ctx *ctx, kn_tensor **o) { o[0] = kn_mul(ctx, data(ctx, 2, S2, 10), cf(ctx, 1)); return 1; }
TEST(arith_output_kept) { NEED_RW(); result r = compare(b_arith_out); EXPECT(r, KN_RW_ARITH_IDENTITY, 0, 0); }

/* x*1 of a transposed (strided) x: readers were built for a contiguous operand */
static int b_arith_strided(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_exp(ctx, data(ctx, 2, S2, 21));
    o[0] = kn_sin(ctx, kn_mul(ctx, kn_transpose(ctx, x, 0, 1), cf(ctx, 1)));
    return 1;
}
TEST(arith_strided_kept) { NEED_RW(); result r = compare(b_arith_strided); EXPECT(r, KN_RW_ARITH_IDENTITY, 0, 0); }

/* ---- casts and negations ---- */
static int b_cast(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_exp(ctx, data(ctx, 2, S2, 11)), *src[1] = {x};
    kn_tensor *c = kn__node(ctx, KN_OP_CAST, KN_F32, 2, S2, NULL, src, 1);  /* kn_cast would return x */
    kn_tensor *h = kn_cast(ctx, x, KN_F16);
    o[0] = kn_add(ctx, kn_sin(ctx, c), kn_cast(ctx, h, KN_F32));
    return 1;
}
TEST(cast_same_dtype) { NEED_RW(); result r = compare(b_cast); EXPECT(r, KN_RW_CAST_SAME, 1, 1); }

static int b_negneg(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 12);
    o[0] = kn_exp(ctx, kn_neg(ctx, kn_neg(ctx, x)));
    int32_t d[4] = {INT32_MIN, -1, 0, 9};
    int64_t s[1] = {4};
    kn_tensor *i = kn_from_data(ctx, KN_I32, 1, s, d);
    o[1] = kn_abs(ctx, kn_neg(ctx, kn_neg(ctx, i)));     /* integers: not folded */
    o[2] = kn_neg(ctx, kn_abs(ctx, kn_neg(ctx, x)));     /* not neg(neg) */
    return 3;
}
/* the inner neg(x) stays: o[2]'s neg(x) is the same node (cse) */
TEST(neg_neg) { NEED_RW(); result r = compare(b_negneg); EXPECT(r, KN_RW_NEG_NEG, 1, 2); CHECK(r.removed[KN_RW_CSE] == 1, "cse %d", r.removed[KN_RW_CSE]); }

/* ---- common subexpressions ---- */
static int b_cse(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 13);
    kn_tensor *a = kn_tanh(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_F32, 2)));
    kn_tensor *b = kn_tanh(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_F32, 2)));
    kn_tensor *c = kn_tanh(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_F32, 3)));   /* other constant */
    o[0] = kn_add(ctx, kn_add(ctx, a, b), c);
    o[1] = kn_add(ctx, kn_rand(ctx, KN_F32, 2, S2, 5), kn_rand(ctx, KN_F32, 2, S2, 5));  /* random: never merged */
    return 2;
}
TEST(cse_merges) { NEED_RW(); result r = compare(b_cse); EXPECT(r, KN_RW_CSE, 3, 3); }

/* ---- effects ---- */
static int b_effect(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *cache = data(ctx, 2, S2, 14), *v = data(ctx, 2, S2, 15);
    kn_tensor *e1 = kn_exp(ctx, cache), *e2 = kn_exp(ctx, cache);     /* reads storage assign writes */
    kn_tensor *id = kn_mul(ctx, cache, cf(ctx, 1));                    /* would read it at another time */
    o[0] = kn_add(ctx, kn_add(ctx, e1, e2), id);
    o[1] = kn_assign(ctx, cache, kn_sin(ctx, v));
    o[2] = kn_add(ctx, kn_sin(ctx, v), kn_neg(ctx, kn_neg(ctx, v)));  /* v is not written: both fire */
    return 3;
}
TEST(effects_block_rewrites) {
    NEED_RW(); result r = compare(b_effect);
    CHECK(r.same, "results differ");
    CHECK(r.removed[KN_RW_ARITH_IDENTITY] == 0, "identity fired across an effect");
    CHECK(r.removed[KN_RW_CSE] == 1, "cse %d (only the second sin(v))", r.removed[KN_RW_CSE]);
    CHECK(r.removed[KN_RW_NEG_NEG] == 1, "neg_neg %d", r.removed[KN_RW_NEG_NEG]);
}

/* a KV-cache update: index_copy writes the cache, attention-like reads follow */
static int b_index_copy(kn_ctx *ctx, kn_tensor **o) {
    int64_t sc[2] = {4, 8}, sr[2] = {1, 8}, si[1] = {1};
    kn_tensor *cache = data(ctx, 2, sc, 18), *rows = kn_exp(ctx, data(ctx, 2, sr, 19));
    int32_t pos = 2;
    kn_tensor *idx = kn_from_data(ctx, KN_I32, 1, si, &pos);
    kn_tensor *before = kn_mul(ctx, cache, cf(ctx, 1));                /* not cache itself: */
    kn_tensor *e = kn_index_copy(ctx, cache, 0, idx, rows);
    int64_t flat[1] = {32}, back[2] = {4, 8};
    kn_tensor *after = kn_reshape(ctx, kn_reshape(ctx, e, 1, flat), 2, back);   /* reads e */
    o[0] = kn_add(ctx, kn_tanh(ctx, after), kn_tanh(ctx, before));
    o[1] = kn_add(ctx, kn_tanh(ctx, cache), kn_tanh(ctx, cache));      /* cache is written: no cse */
    return 2;
}
TEST(index_copy_blocks_rewrites) {
    NEED_RW(); result r = compare(b_index_copy);
    CHECK(r.same, "results differ");
    CHECK(r.removed[KN_RW_ARITH_IDENTITY] == 0, "identity fired on written storage");
    CHECK(r.removed[KN_RW_CSE] == 0, "cse merged reads of written storage");
}

/* a node another node views keeps its storage: no identity */
static int b_aliased(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = kn_exp(ctx, data(ctx, 2, S2, 20));
    kn_tensor *n = kn_mul(ctx, kn_transpose(ctx, x, 0, 1), cf(ctx, 1));   /* x*1 of a strided x */
    int64_t flat[1] = {48};
    o[0] = kn_sin(ctx, kn_reshape(ctx, n, 1, flat));                       /* a view of n */
    return 1;
}
TEST(aliased_kept) { NEED_RW(); result r = compare(b_aliased); EXPECT(r, KN_RW_ARITH_IDENTITY, 0, 0); }

/* ---- integer identities that need a zero fill (int_zero) ---- */
static kn_tensor *ivec(kn_ctx *ctx) {
    int32_t d[6] = {-3, 0, 7, INT32_MIN, INT32_MAX, 5};
    int64_t s[1] = {6};
    return kn_from_data(ctx, KN_I32, 1, s, d);
}
static int b_int_zero(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = ivec(ctx);
    o[0] = kn_maximum(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_I32, 0)), x);    /* x*0 */
    o[1] = kn_maximum(ctx, kn_mul(ctx, kn_scalar(ctx, KN_I32, 0), x), x);    /* 0*x (the constant: cse) */
    o[2] = kn_maximum(ctx, kn_sub(ctx, x, x), x);                            /* x-x */
    return 3;
}
/* the three read one zero fill (made once); the constant is then dead */
TEST(int_zero_fires) {
    NEED_RW(); result r = compare(b_int_zero);
    EXPECT(r, KN_RW_INT_ZERO, 3, 4);
    CHECK(r.added == 1 && r.removed[KN_RW_CSE] == 1 && r.removed[KN_RW_DEAD] == 1, "made %d cse %d dead %d", r.added, r.removed[KN_RW_CSE], r.removed[KN_RW_DEAD]);
}
static int b_int_zero_more(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = ivec(ctx);
    int64_t s[1] = {6}, s2[2] = {2, 6};
    uint8_t bd[6] = {0, 1, 2, 255, 1, 0};                                      /* any byte: x*false is false */
    kn_tensor *bx = kn_from_data(ctx, KN_BOOL, 1, s, bd);
    kn_tensor *zrow = kn_expand(ctx, kn_scalar(ctx, KN_I64, 0.25), 1, s);    /* a broadcast 0 (0.25 stores 0) */
    o[0] = kn_logical_not(ctx, kn_mul(ctx, bx, kn_scalar(ctx, KN_BOOL, 0)));  /* bool */
    o[1] = kn_maximum(ctx, kn_mul(ctx, x, zrow), kn_cast(ctx, x, KN_I64));    /* i32 * i64 -> i64 zeros */
    o[2] = kn_sum(ctx, kn_sub(ctx, kn_expand(ctx, x, 2, s2), kn_expand(ctx, x, 2, s2)), 0, NULL, false);  /* cse, then x-x */
    return 3;
}
TEST(int_zero_bool_broadcast) {
    NEED_RW(); result r = compare(b_int_zero_more);
    CHECK(r.same, "results differ");
    CHECK(r.removed[KN_RW_INT_ZERO] == 3, "int_zero %d", r.removed[KN_RW_INT_ZERO]);
}
/* a symbolic extent: the zero fill has the result's symbolic shape (run at 4 of 6) */
static int b_int_zero_sym(kn_ctx *ctx, kn_tensor **o) {
    int s = kn_sym_new(ctx, "n", 6);
    kn_sym_set(ctx, s, 4);
    kn_tensor *y = kn_slice_sym(ctx, ivec(ctx), 0, 0, s);
    o[0] = kn_sum_all(ctx, kn_maximum(ctx, kn_mul(ctx, y, kn_scalar(ctx, KN_I32, 0)), kn_neg(ctx, y)));
    return 1;
}
TEST(int_zero_symbolic) { NEED_RW(); result r = compare(b_int_zero_sym); EXPECT(r, KN_RW_INT_ZERO, 1, 1); }
static int b_int_zero_not(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 30), *i = ivec(ctx);
    o[0] = kn_exp(ctx, kn_sub(ctx, x, x));                                    /* floats: inf-inf, NaN-NaN */
    o[1] = kn_exp(ctx, kn_mul(ctx, x, kn_scalar(ctx, KN_F32, 0)));            /* floats: NaN*0 */
    o[2] = kn_abs(ctx, kn_mul(ctx, i, kn_scalar(ctx, KN_F32, 0)));            /* promoted to f32: x*0.0 stays */
    o[3] = kn_sub(ctx, i, kn_neg(ctx, kn_neg(ctx, i)));                       /* an output: computed into its buffer */
    return 4;
}
/* only the two f32 zeros merge (cse) */
TEST(int_zero_not) { NEED_RW(); result r = compare(b_int_zero_not); EXPECT(r, KN_RW_INT_ZERO, 0, 1); CHECK(r.removed[KN_RW_CSE] == 1, "cse %d", r.removed[KN_RW_CSE]); }

/* ---- idempotent ops ---- */
static int b_idem(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *i = ivec(ctx), *x = data(ctx, 2, S2, 31), *y = data(ctx, 2, S2, 32);
    o[0] = kn_add(ctx, kn_maximum(ctx, i, i), kn_minimum(ctx, i, i));
    kn_tensor *c = kn_gt(ctx, x, y);
    o[1] = kn_logical_not(ctx, kn_logical_and(ctx, c, c));
    o[2] = kn_logical_not(ctx, kn_logical_or(ctx, c, c));
    return 3;
}
TEST(idempotent_fires) { NEED_RW(); result r = compare(b_idem); EXPECT(r, KN_RW_IDEMPOTENT, 4, 4); }
static int b_idem_not(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 33);
    int64_t s[1] = {6};
    uint8_t bd[6] = {0, 1, 2, 255, 1, 0};       /* and(b, b) makes 2 and 255 into 1 */
    kn_tensor *b = kn_from_data(ctx, KN_BOOL, 1, s, bd);
    kn_tensor *nx = kn_div(ctx, kn_sub(ctx, x, x), kn_scalar(ctx, KN_F32, 0));   /* NaNs of either sign */
    o[0] = kn_exp(ctx, kn_maximum(ctx, nx, nx));                                  /* floats: the NaN changes */
    o[1] = kn_exp(ctx, kn_minimum(ctx, x, x));
    o[2] = kn_logical_not(ctx, kn_logical_and(ctx, b, b));
    o[3] = kn_logical_not(ctx, kn_logical_or(ctx, b, b));
    return 4;
}
TEST(idempotent_not) { NEED_RW(); result r = compare(b_idem_not); EXPECT(r, KN_RW_IDEMPOTENT, 0, 0); }

/* ---- constant folding ---- */
static kn_tensor *c32(kn_ctx *ctx, double v) { return kn_scalar(ctx, KN_F32, v); }
/* Adam-like step size: lr / (1 - b1*b1), folded to one fill */
static int b_fold_opt(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = data(ctx, 2, S2, 34);
    kn_tensor *b1 = c32(ctx, 0.9);
    kn_tensor *lr_t = kn_div(ctx, c32(ctx, 0.001), kn_sub(ctx, c32(ctx, 1), kn_mul(ctx, b1, b1)));
    o[0] = kn_mul(ctx, x, lr_t);
    return 1;
}
/* mul, sub, div fold (3 made); the 3 constants and 2 intermediate made fills are dead */
TEST(const_fold_optimizer) {
    NEED_RW(); result r = compare(b_fold_opt);
    EXPECT(r, KN_RW_CONST_FOLD, 3, 5);
    CHECK(r.added == 3 && r.removed[KN_RW_DEAD] == 5 && r.n_rw == 2, "made %d dead %d left %d", r.added, r.removed[KN_RW_DEAD], r.n_rw);
}
/* inexact values, specials, f16, f64, integers, broadcast constants, casts */
static int b_fold_many(kn_ctx *ctx, kn_tensor **o) {
    int64_t s[1] = {6};
    kn_tensor *x = data(ctx, 1, s, 35);
    kn_tensor *t[12];
    int n = 0;
    t[n++] = kn_add(ctx, c32(ctx, 0.1), c32(ctx, 0.2));
    t[n++] = kn_div(ctx, c32(ctx, 1), c32(ctx, 3));
    t[n++] = kn_div(ctx, c32(ctx, 0), c32(ctx, 0));                            /* NaN */
    t[n++] = kn_div(ctx, c32(ctx, -1), c32(ctx, 0));                           /* -inf */
    t[n++] = kn_add(ctx, c32(ctx, -0.0), kn_neg(ctx, c32(ctx, 0.0)));         /* -0.0 */
    t[n++] = kn_mul(ctx, c32(ctx, 3.4e38), c32(ctx, 10));                      /* overflow to inf */
    t[n++] = kn_maximum(ctx, c32(ctx, -0.0), c32(ctx, 0.0));
    t[n++] = kn_minimum(ctx, kn_square(ctx, c32(ctx, 1.1)), kn_abs(ctx, c32(ctx, -1.3)));
    t[n++] = kn_add(ctx, kn_expand(ctx, c32(ctx, 0.7), 1, s), kn_full(ctx, KN_F32, 1, s, 1e-8));
    t[n++] = kn_cast(ctx, kn_div(ctx, kn_scalar(ctx, KN_F64, 1), kn_scalar(ctx, KN_F64, 3)), KN_F32);   /* f64 1/3 -> cast inexact: only the div folds */
    t[n++] = kn_cast(ctx, kn_add(ctx, kn_scalar(ctx, KN_F16, 0.1), kn_scalar(ctx, KN_F16, 0.2)), KN_F32);
    t[n++] = kn_cast(ctx, kn_mul(ctx, kn_scalar(ctx, KN_I32, -7), kn_add(ctx, kn_scalar(ctx, KN_I32, 3), kn_scalar(ctx, KN_I32, 2.9))), KN_F32);
    kn_tensor *acc = x;
    for (int i = 0; i < n; i++) acc = kn_add(ctx, kn_mul(ctx, acc, kn_scalar(ctx, KN_F32, 0.5)), t[i]);
    o[0] = acc;
    return 1;
}
TEST(const_fold_exact) {
    NEED_RW(); result r = compare(b_fold_many);
    CHECK(r.same, "results differ");
    /* 18 op nodes of constants, less one: (-0.0) + neg(0.0) is an arith_identity
     * first (and acc + the folded -0.0 another); the f64 -> f32 cast of 1/3
     * is inexact: it stays */
    CHECK(r.removed[KN_RW_CONST_FOLD] == 17, "const_fold %d", r.removed[KN_RW_CONST_FOLD]);
    CHECK(r.removed[KN_RW_ARITH_IDENTITY] == 2, "arith_identity %d", r.removed[KN_RW_ARITH_IDENTITY]);
}
static int b_fold_not(kn_ctx *ctx, kn_tensor **o) {
    int64_t s[1] = {6};
    kn_tensor *x = data(ctx, 1, s, 36);
    kn_tensor *a = kn_exp(ctx, c32(ctx, 0.3));                                      /* other algorithms in float kernels */
    kn_tensor *b = kn_sqrt(ctx, c32(ctx, 2));
    kn_tensor *c = kn_mul(ctx, kn_full(ctx, KN_F16, 1, s, 0.5), c32(ctx, 0.1));      /* f16 result, 0.1f not an f16 */
    kn_tensor *d = kn_add(ctx, kn_scalar(ctx, KN_I32, 2147483647), kn_scalar(ctx, KN_I32, 1));   /* saturates */
    kn_tensor *e = kn_cast(ctx, kn_scalar(ctx, KN_F64, 0.1), KN_F16);               /* inexact conversion */
    kn_tensor *f = kn_add(ctx, kn_rand(ctx, KN_F32, 1, s, 7), c32(ctx, 1));         /* random */
    kn_tensor *g = kn_gt(ctx, c32(ctx, 1), c32(ctx, 2));                             /* bool result */
    o[0] = kn_add(ctx, kn_add(ctx, kn_add(ctx, x, a), kn_add(ctx, b, kn_cast(ctx, c, KN_F32))), kn_cast(ctx, e, KN_F32));
    o[1] = kn_add(ctx, kn_cast(ctx, d, KN_F32), f);
    o[2] = kn_logical_not(ctx, g);
    o[3] = kn_add(ctx, c32(ctx, 1), c32(ctx, 2));                                     /* an output */
    return 4;
}
TEST(const_fold_not) { NEED_RW(); result r = compare(b_fold_not); CHECK(r.same, "results differ"); CHECK(r.removed[KN_RW_CONST_FOLD] == 0 && r.added == 0, "const_fold %d made %d", r.removed[KN_RW_CONST_FOLD], r.added); }

/* a node another node views keeps its storage: none of the rules that make nodes fires */
static int b_fold_alias(kn_ctx *ctx, kn_tensor **o) {
    int64_t s23[2] = {2, 3}, s6[1] = {6}, e[2] = {6, 4};
    int ax1[1] = {1};
    kn_tensor *i = ivec(ctx);
    o[0] = kn_neg(ctx, kn_reshape(ctx, kn_mul(ctx, i, kn_scalar(ctx, KN_I32, 0)), 2, s23));       /* int_zero */
    o[1] = kn_neg(ctx, kn_reshape(ctx, kn_maximum(ctx, i, i), 2, s23));                            /* idempotent */
    o[2] = kn_exp(ctx, kn_reshape(ctx, kn_add(ctx, kn_full(ctx, KN_F32, 1, s6, 0.1), c32(ctx, 0.2)), 2, s23));  /* const_fold */
    kn_tensor *col = kn_reshape(ctx, i, 2, (int64_t[2]){6, 1});
    kn_tensor *sm = kn_sum(ctx, kn_expand(ctx, col, 2, e), 1, ax1, false);
    o[3] = kn_neg(ctx, kn_reshape(ctx, sm, 2, s23));                                                /* sum_expand */
    return 4;
}
TEST(fold_rules_not_on_viewed_nodes) {
    NEED_RW(); result r = compare(b_fold_alias);
    CHECK(r.same, "results differ");
    CHECK(r.added == 0, "made %d", r.added);
    for (int k = KN_RW_INT_ZERO; k <= KN_RW_SUM_EXPAND; k++) CHECK(r.removed[k] == 0, "%s fired", kn__rw_rule_name((kn_rw_rule)k));
}

/* ---- sum of a broadcast ---- */
static int b_sum_expand(kn_ctx *ctx, kn_tensor **o) {
    kn_tensor *x = ivec(ctx);
    int64_t col[2] = {6, 1}, e1[2] = {6, 5}, e0[2] = {4, 6}, e3[3] = {3, 6, 2};
    int ax1[1] = {1}, ax0[1] = {0}, ax02[2] = {0, 2};
    kn_tensor *xc = kn_reshape(ctx, x, 2, col);
    o[0] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, xc, 2, e1), 1, ax1, true));     /* [6,5] -> [6,1] */
    o[1] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, x, 2, e0), 1, ax0, false));     /* [4,6] -> [6] */
    kn_tensor *x3 = kn_reshape(ctx, x, 3, (int64_t[3]){1, 6, 1});
    o[2] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, x3, 3, e3), 2, ax02, false));   /* two axes, n = 6 */
    o[3] = kn_neg(ctx, kn_add(ctx, kn_sum_all(ctx, kn_expand(ctx, kn_scalar(ctx, KN_I32, -3), 2, e1)),   /* a constant: -90 */
                              kn_sum(ctx, kn_full(ctx, KN_U8, 2, e1, 7), 1, ax1, false)));                  /* a fill: 35 each */
    return 4;
}
TEST(sum_expand_fires) {
    NEED_RW(); result r = compare(b_sum_expand);
    CHECK(r.same, "results differ");
    CHECK(r.removed[KN_RW_SUM_EXPAND] == 5, "sum_expand %d", r.removed[KN_RW_SUM_EXPAND]);
    /* a view, n and x*n for each of the three; the two constant sums, and
     * their sum (const_fold) */
    CHECK(r.added == 3 * 3 + 2 + 1 && r.removed[KN_RW_CONST_FOLD] == 1, "made %d const_fold %d", r.added, r.removed[KN_RW_CONST_FOLD]);
}
static int b_sum_expand_not(kn_ctx *ctx, kn_tensor **o) {
    int64_t col[2] = {6, 1}, e1[2] = {6, 5}, s[1] = {6};
    int ax1[1] = {1}, ax0[1] = {0};
    kn_tensor *f = kn_reshape(ctx, data(ctx, 1, s, 37), 2, col);
    o[0] = kn_sum(ctx, kn_expand(ctx, f, 2, e1), 1, ax1, true);                  /* floats (an output too) */
    o[1] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, f, 2, e1), 1, ax1, false));    /* floats */
    kn_tensor *i = kn_reshape(ctx, ivec(ctx), 2, col);
    o[2] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, i, 2, e1), 1, ax0, false));    /* the axis that is not repeated */
    int64_t ld[1] = {6};
    int64_t dl[6] = {1, -2, (int64_t)1 << 40, 0, 5, 9};
    kn_tensor *l = kn_reshape(ctx, kn_from_data(ctx, KN_I64, 1, ld, dl), 2, col);
    o[3] = kn_neg(ctx, kn_sum(ctx, kn_expand(ctx, l, 2, e1), 1, ax1, false));    /* int64: not exact in double */
    return 4;
}
TEST(sum_expand_not) { NEED_RW(); result r = compare(b_sum_expand_not); CHECK(r.same, "results differ"); CHECK(r.removed[KN_RW_SUM_EXPAND] == 0, "sum_expand %d", r.removed[KN_RW_SUM_EXPAND]); }

/* ---- a whole MLP training step: forward, backward, Adam ---- */
static int b_train(kn_ctx *ctx, kn_tensor **o) {
    int64_t sx[2] = {4, 6}, sw[2] = {6, 5};
    kn_tensor *x = data(ctx, 2, sx, 16);
    kn_tensor *w = kn_randn(ctx, KN_F32, 2, sw, 3);
    (void)w;
    kn_tensor *h = kn_tanh(ctx, kn_matmul(ctx, kn_sin(ctx, x), kn_reshape(ctx, kn_transpose(ctx, kn_transpose(ctx, kn_cos(ctx, data(ctx, 2, sw, 17)), 0, 1), 0, 1), 2, sw)));
    o[0] = kn_sum_all(ctx, kn_mul(ctx, h, kn_scalar(ctx, KN_F32, 1)));
    o[1] = kn_mean_all(ctx, kn_mul(ctx, h, kn_scalar(ctx, KN_F32, 1)));
    return 2;
}
TEST(mixed_graph_identical) { NEED_RW(); result r = compare(b_train); CHECK(r.same, "results differ"); CHECK(r.n_rw < r.n_plain, "%d -> %d", r.n_plain, r.n_rw); }

/* Plans built one after another over one context: each makes its own nodes,
 * an earlier plan keeps running right after later ones grew the context,
 * and a plan without rewrites still computes the same. */
TEST(made_nodes_and_several_plans) {
    NEED_RW();
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *o[MAXO];
    int n = b_fold_opt(ctx, o);
    n += b_int_zero(ctx, o + n);           /* 1 + 3 outputs */
    kn_plan_opts op = {0};
    op.no_fuse = true;
    kn_plan *p[3];
    int32_t before = ctx->n_all;
    p[0] = kn_plan_new(ctx, n, o, &op);
    int32_t after1 = ctx->n_all;
    p[1] = kn_plan_new(ctx, n, o, &op);
    op.no_rewrite = true;
    p[2] = kn_plan_new(ctx, n, o, &op);
    REQUIRE(p[0] && p[1] && p[2], "plan: %s", kn_last_error());
    CHECK(after1 - before == p[0]->rw_added && ctx->n_all - after1 == p[1]->rw_added && p[2]->rw_added == 0,
          "made %d then %d; context grew %d then %d", p[0]->rw_added, p[1]->rw_added, (int)(after1 - before), (int)(ctx->n_all - after1));
    CHECK(p[0]->n == p[1]->n && p[0]->n < p[2]->n, "plans of %d, %d, %d nodes", p[0]->n, p[1]->n, p[2]->n);
    unsigned char got[3][64 * 8];
    for (int k = 2; k >= 0; k--) {          /* the first plan runs last */
        size_t at = 0;
        CHECK(kn_plan_run(p[k]) == KN_OK, "run %d", k);
        for (int j = 0; j < n; j++) {
            size_t nb = (size_t)kn_numel(o[j]) * kn_dtype_get(o[j]->dtype)->type_size;
            CHECK(kn_tensor_read(o[j], got[k] + at, o[j]->dtype) == KN_OK, "read");
            canon_nans(got[k] + at, kn_numel(o[j]), o[j]->dtype);
            at += nb;
        }
        if (k < 2) CHECK(memcmp(got[k], got[2], at) == 0, "plan %d differs from the plan without rewrites", k);
    }
    for (int k = 0; k < 3; k++) kn_plan_free(p[k]);
    kn_ctx_free(ctx);
}

/* kn_plan_opts.no_rewrite leaves the plan as scheduled */
TEST(no_rewrite_opt) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *o[MAXO];
    b_view_chain(ctx, o);
    kn_plan_opts op = {0};
    op.no_rewrite = true;
    kn_plan *p = kn_plan_new(ctx, 1, o, &op);
    REQUIRE(p, "plan");
    CHECK(p->rep == NULL && total(&(result){.removed = {0}}) == 0, "rewrites ran");
    for (int i = 0; i < KN_RW_NRULES; i++) CHECK(p->rw_removed[i] == 0, "rule %d fired", i);
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
