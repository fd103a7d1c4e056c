/* test_ops_index.c: cat/stack/split/chunk/repeat, pad, gather, scatter(_add),
 * index_select/add/copy: hand-computed forward cases, reference vs CPU
 * backend on many layouts, finite-difference gradients, and bad arguments
 * (at build time and, for index values, at run time). */
#include "kn_optest.h"
#include <math.h>

static kn_ctx *ref_ctx(void) { kn_ctx_opts o = {kn_backend_ref()}; return kn_ctx_new(&o); }

static kn_tensor *from_f64(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, const double *v) {
    kn_tensor *t = kn_empty(ctx, dt, ndim, shape);
    if (t && kn_tensor_write(t, v, KN_F64) != KN_OK) return NULL;
    return t;
}
static kn_tensor *idx1(kn_ctx *ctx, kn_dtype dt, int64_t n, const double *v) { return from_f64(ctx, dt, 1, &n, v); }

/* read t as f64 and compare with want[0..n) exactly */
static bool read_eq(kn_tensor *t, const double *want, int64_t n, const char *what) {
    if (!t) { fprintf(stderr, "  %s: NULL (%s)\n", what, kn_last_error()); return false; }
    if (kn_numel(t) != n) { fprintf(stderr, "  %s: %lld elements, want %lld\n", what, (long long)kn_numel(t), (long long)n); return false; }
    double *got = malloc(sizeof(double) * (size_t)(n ? n : 1));
    bool ok = kn_tensor_read(t, got, KN_F64) == KN_OK;
    if (!ok) fprintf(stderr, "  %s: read failed: %s\n", what, kn_last_error());
    for (int64_t i = 0; ok && i < n; i++)
        if (got[i] != want[i]) { fprintf(stderr, "  %s[%lld] = %g, want %g\n", what, (long long)i, got[i], want[i]); ok = false; }
    free(got);
    return ok;
}
#define EXPECT(t, what, ...) do { const double w_[] = {__VA_ARGS__}; \
    CHECK(read_eq((t), w_, (int64_t)(sizeof w_ / sizeof w_[0]), what), "%s", what); } while (0)

/* ======================================================================
 * forward, by hand
 * ====================================================================== */

TEST(cat_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 6, 1), 2, (int64_t[]){2, 3});
    kn_tensor *b = kn_reshape(ctx, kn_arange(ctx, KN_F32, 10, 12, 1), 2, (int64_t[]){2, 1});
    kn_tensor *c = kn_cat(ctx, (kn_tensor *[]){a, b}, 2, -1);
    REQUIRE(c && c->shape[0] == 2 && c->shape[1] == 4, "shape");
    EXPECT(c, "cat dim -1", 0, 1, 2, 10, 3, 4, 5, 11);
    kn_tensor *r = kn_reshape(ctx, kn_arange(ctx, KN_I32, 7, 10, 1), 2, (int64_t[]){1, 3});
    kn_tensor *d = kn_cat(ctx, (kn_tensor *[]){r, a, r}, 3, 0);
    CHECK(d && d->dtype == KN_F32, "i32 + f32 promotes to f32");
    EXPECT(d, "cat dim 0 mixed dtypes", 7, 8, 9, 0, 1, 2, 3, 4, 5, 7, 8, 9);
    /* transposed (non-contiguous) source and an empty piece */
    kn_tensor *at = kn_transpose(ctx, a, 0, 1);                  /* [3,2] */
    kn_tensor *e0 = kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 0});
    EXPECT(kn_cat(ctx, (kn_tensor *[]){e0, at, e0}, 3, 1), "cat transposed + empty", 0, 3, 1, 4, 2, 5);
    /* more than KN_MAX_SRC sources: a balanced tree of cats */
    kn_tensor *xs[11];
    double want[11];
    for (int i = 0; i < 11; i++) { xs[i] = kn_full(ctx, KN_F64, 1, (int64_t[]){1}, 100 + i); want[i] = 100 + i; }
    kn_tensor *big = kn_cat(ctx, xs, 11, 0);
    CHECK(read_eq(big, want, 11, "cat of 11"), "tree cat");
    CHECK(big && big->op == KN_OP_CAT, "root is a cat");
    for (int k = 0; big && k < KN_MAX_SRC; k++) CHECK(big->src[k] != NULL, "root has %d sources", KN_MAX_SRC);
    EXPECT(kn_cat(ctx, &a, 1, 1), "cat of one", 0, 1, 2, 3, 4, 5);
    kn_ctx_free(ctx);
}

TEST(stack_split_chunk_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_arange(ctx, KN_F64, 0, 3, 1), *b = kn_arange(ctx, KN_F64, 10, 13, 1);
    kn_tensor *s0 = kn_stack(ctx, (kn_tensor *[]){a, b}, 2, 0);
    REQUIRE(s0 && s0->ndim == 2 && s0->shape[0] == 2 && s0->shape[1] == 3, "stack dim 0 shape");
    EXPECT(s0, "stack 0", 0, 1, 2, 10, 11, 12);
    kn_tensor *s1 = kn_stack(ctx, (kn_tensor *[]){a, b}, 2, -1);
    REQUIRE(s1 && s1->shape[0] == 3 && s1->shape[1] == 2, "stack dim -1 shape");
    EXPECT(s1, "stack -1", 0, 10, 1, 11, 2, 12);

    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 14, 1), 2, (int64_t[]){2, 7});
    kn_tensor *p[8];
    CHECK(kn_split(ctx, x, 3, 1, NULL, 0) == 3, "split counts pieces with out = NULL");
    int n = kn_split(ctx, x, 3, -1, p, 8);
    REQUIRE(n == 3, "split 7 by 3 gives 3, got %d (%s)", n, kn_last_error());
    CHECK(p[0]->shape[1] == 3 && p[1]->shape[1] == 3 && p[2]->shape[1] == 1, "split sizes");
    CHECK(p[1]->flags & KN_FLAG_VIEW, "split gives views");
    EXPECT(p[1], "split piece 1", 3, 4, 5, 10, 11, 12);
    EXPECT(p[2], "split piece 2", 6, 13);
    n = kn_chunk(ctx, x, 3, 1, p, 8);        /* ceil(7/3) = 3: 3, 3, 1 */
    CHECK(n == 3 && p[2]->shape[1] == 1, "chunk 7 into 3");
    n = kn_chunk(ctx, x, 4, 1, p, 8);        /* ceil(7/4) = 2: 2, 2, 2, 1 */
    CHECK(n == 4 && p[0]->shape[1] == 2 && p[3]->shape[1] == 1, "chunk 7 into 4");
    n = kn_chunk(ctx, x, 6, 1, p, 8);        /* ceil(7/6) = 2: 4 pieces only, like torch */
    CHECK(n == 4, "chunk 7 into 6 gives 4 pieces, got %d", n);
    EXPECT(p[3], "chunk last", 6, 13);
    kn_tensor *e = kn_zeros(ctx, KN_F32, 2, (int64_t[]){0, 3});
    CHECK(kn_split(ctx, e, 2, 0, p, 8) == 1 && p[0]->shape[0] == 0, "split of an empty dim: one empty piece");
    CHECK(kn_chunk(ctx, e, 3, 0, p, 8) == 3 && p[2]->shape[0] == 0, "chunk of an empty dim: empty pieces");
    kn_ctx_free(ctx);
}

TEST(repeat_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 1, 4, 1), 2, (int64_t[]){1, 3});
    kn_tensor *r = kn_repeat(ctx, x, 2, (int64_t[]){2, 2});
    REQUIRE(r && r->shape[0] == 2 && r->shape[1] == 6, "repeat shape");
    EXPECT(r, "repeat [2,2]", 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3);
    kn_tensor *r3 = kn_repeat(ctx, kn_arange(ctx, KN_F64, 0, 2, 1), 3, (int64_t[]){2, 1, 2});
    REQUIRE(r3 && r3->ndim == 3 && r3->shape[0] == 2 && r3->shape[1] == 1 && r3->shape[2] == 4, "repeat adds leading dims");
    EXPECT(r3, "repeat [2,1,2] of 1-d", 0, 1, 0, 1, 0, 1, 0, 1);
    kn_tensor *xt = kn_transpose(ctx, kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 4, 1), 2, (int64_t[]){2, 2}), 0, 1);
    EXPECT(kn_repeat(ctx, xt, 2, (int64_t[]){1, 2}), "repeat transposed", 0, 2, 0, 2, 1, 3, 1, 3);
    kn_tensor *z = kn_repeat(ctx, x, 2, (int64_t[]){0, 2});
    CHECK(z && z->shape[0] == 0 && z->shape[1] == 6 && kn_realize(z) == KN_OK, "repeat by 0 is empty");
    /* 6 dims, 4 of them repeated: more than KN_MAX_DIMS in one expand, done one dim at a time */
    kn_tensor *h = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 2, 1), 6, (int64_t[]){1, 2, 1, 1, 1, 1});
    kn_tensor *hr = kn_repeat(ctx, h, 6, (int64_t[]){2, 1, 2, 1, 2, 2});
    REQUIRE(hr && hr->ndim == 6 && kn_numel(hr) == 32, "repeat 6-d: %s", kn_last_error());
    double v[32];
    REQUIRE(kn_tensor_read(hr, v, KN_F64) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 32; i++) CHECK(v[i] == (double)((i / 8) % 2), "repeat 6-d elem %d = %g", i, v[i]);
    kn_ctx_free(ctx);
}

TEST(pad_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_arange(ctx, KN_F32, 1, 5, 1);   /* [1,2,3,4] */
    EXPECT(kn_pad(ctx, x, 1, (int64_t[]){2, 1}, KN_PAD_REFLECT, 0), "reflect", 3, 2, 1, 2, 3, 4, 3);
    EXPECT(kn_pad(ctx, x, 1, (int64_t[]){3, 3}, KN_PAD_REFLECT, 0), "reflect max", 4, 3, 2, 1, 2, 3, 4, 3, 2, 1);
    EXPECT(kn_pad(ctx, x, 1, (int64_t[]){2, 1}, KN_PAD_REPLICATE, 0), "replicate", 1, 1, 1, 2, 3, 4, 4);
    EXPECT(kn_pad(ctx, x, 1, (int64_t[]){1, -2}, KN_PAD_CONSTANT, 9), "constant with a crop", 9, 1, 2);
    EXPECT(kn_pad(ctx, x, 1, (int64_t[]){-1, 2}, KN_PAD_REFLECT, 0), "reflect with a crop", 2, 3, 4, 3, 2);
    kn_tensor *m = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 6, 1), 2, (int64_t[]){2, 3});
    /* last dim (1, 0), first dim (0, 1), constant -1 */
    kn_tensor *pm = kn_pad(ctx, m, 2, (int64_t[]){1, 0, 0, 1}, KN_PAD_CONSTANT, -1);
    REQUIRE(pm && pm->shape[0] == 3 && pm->shape[1] == 4, "pad 2-d shape");
    EXPECT(pm, "pad 2-d constant", -1, 0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1);
    EXPECT(kn_pad(ctx, m, 2, (int64_t[]){0, 0, 1, 1}, KN_PAD_REPLICATE, 0), "replicate dim 0 only", 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5);
    kn_tensor *mt = kn_transpose(ctx, m, 0, 1);      /* [3,2]: 0 3 / 1 4 / 2 5 */
    EXPECT(kn_pad(ctx, mt, 2, (int64_t[]){1, 1, 1, 0}, KN_PAD_REFLECT, 0), "reflect transposed 2-d",
           4, 1, 4, 1, 3, 0, 3, 0, 4, 1, 4, 1, 5, 2, 5, 2);
    kn_tensor *e = kn_zeros(ctx, KN_F32, 2, (int64_t[]){0, 2});
    kn_tensor *pe = kn_pad(ctx, e, 1, (int64_t[]){1, 1}, KN_PAD_CONSTANT, 3);
    CHECK(pe && pe->shape[0] == 0 && pe->shape[1] == 4 && kn_realize(pe) == KN_OK, "pad an empty tensor");
    EXPECT(kn_pad(ctx, e, 2, (int64_t[]){0, 0, 1, 0}, KN_PAD_CONSTANT, 3), "constant pad of an empty dim", 3, 3);
    kn_ctx_free(ctx);
}

TEST(gather_scatter_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 6, 1), 2, (int64_t[]){2, 3});   /* 0 1 2 / 3 4 5 */
    kn_tensor *i1 = from_f64(ctx, KN_I64, 2, (int64_t[]){2, 2}, (double[]){2, 0, 1, 1});
    EXPECT(kn_gather(ctx, x, 1, i1), "gather dim 1", 2, 0, 4, 4);
    kn_tensor *i0 = from_f64(ctx, KN_I32, 2, (int64_t[]){1, 3}, (double[]){1, 0, 1});
    EXPECT(kn_gather(ctx, x, -2, i0), "gather dim -2 i32 index", 3, 1, 5);
    kn_tensor *iu = from_f64(ctx, KN_U8, 2, (int64_t[]){1, 2}, (double[]){2, 0});
    EXPECT(kn_gather(ctx, kn_transpose(ctx, x, 0, 1), 0, iu), "gather of a transposed x, u8 index", 2, 3);
    kn_tensor *ie = kn_zeros(ctx, KN_I64, 2, (int64_t[]){2, 0});
    kn_tensor *ge = kn_gather(ctx, x, 1, ie);
    CHECK(ge && kn_numel(ge) == 0 && kn_realize(ge) == KN_OK, "gather with an empty index");

    kn_tensor *z = kn_zeros(ctx, KN_F64, 2, (int64_t[]){2, 4});
    kn_tensor *src = kn_reshape(ctx, kn_arange(ctx, KN_F64, 1, 7, 1), 2, (int64_t[]){2, 3});   /* 1 2 3 / 4 5 6 */
    kn_tensor *is = from_f64(ctx, KN_I64, 2, (int64_t[]){2, 2}, (double[]){3, 0, 1, 1});
    /* index smaller than src: only src[:, :2] is used; repeated index: last wins */
    EXPECT(kn_scatter(ctx, z, 1, is, src), "scatter", 2, 0, 0, 1, 0, 5, 0, 0);
    EXPECT(kn_scatter_add(ctx, z, 1, is, src), "scatter_add", 2, 0, 0, 1, 0, 9, 0, 0);
    kn_tensor *ones = kn_ones(ctx, KN_F64, 2, (int64_t[]){2, 4});
    EXPECT(kn_scatter_add(ctx, ones, 1, is, src), "scatter_add onto ones", 3, 1, 1, 2, 1, 10, 1, 1);
    kn_tensor *is0 = from_f64(ctx, KN_I64, 2, (int64_t[]){1, 3}, (double[]){1, 1, 0});
    EXPECT(kn_scatter(ctx, kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 3}), 0, is0, src), "scatter dim 0", 0, 0, 3, 1, 2, 0);
    kn_ctx_free(ctx);
}

TEST(index_select_add_copy_forward) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 6, 1), 2, (int64_t[]){3, 2});   /* 0 1 / 2 3 / 4 5 */
    kn_tensor *ix = idx1(ctx, KN_I64, 4, (double[]){2, 0, 2, 1});
    EXPECT(kn_index_select(ctx, x, 0, ix), "index_select dim 0", 4, 5, 0, 1, 4, 5, 2, 3);
    EXPECT(kn_index_select(ctx, x, -1, idx1(ctx, KN_I8, 3, (double[]){1, 1, 0})), "index_select dim -1 i8", 1, 1, 0, 3, 3, 2, 5, 5, 4);
    kn_tensor *es = kn_index_select(ctx, x, 0, kn_zeros(ctx, KN_I32, 1, (int64_t[]){0}));
    CHECK(es && es->shape[0] == 0 && es->shape[1] == 2 && kn_realize(es) == KN_OK, "index_select with an empty index");

    kn_tensor *src = kn_reshape(ctx, kn_arange(ctx, KN_F64, 10, 18, 1), 2, (int64_t[]){4, 2});   /* 10 11 / 12 13 / 14 15 / 16 17 */
    EXPECT(kn_index_add(ctx, x, 0, ix, src), "index_add (repeated index adds twice)", 12, 14, 18, 20, 28, 31);
    kn_tensor *st = kn_transpose(ctx, src, 0, 1);   /* [2,4] */
    EXPECT(kn_index_add(ctx, kn_transpose(ctx, x, 0, 1), 1, ix, st), "index_add transposed",
           12, 18, 28, 14, 20, 31);

    /* index_copy: a side effect on a materialised tensor */
    kn_tensor *dst = from_f64(ctx, KN_F32, 2, (int64_t[]){4, 3}, (double[12]){0});
    kn_tensor *cs = kn_reshape(ctx, kn_arange(ctx, KN_F32, 1, 7, 1), 2, (int64_t[]){2, 3});
    kn_tensor *ic = kn_index_copy(ctx, dst, 0, idx1(ctx, KN_I64, 2, (double[]){3, 1}), cs);
    REQUIRE(ic, "%s", kn_last_error());
    CHECK(!kn_requires_grad(ic), "effects carry no gradient");
    REQUIRE(kn_realize(ic) == KN_OK, "%s", kn_last_error());
    EXPECT(dst, "index_copy rows", 0, 0, 0, 4, 5, 6, 0, 0, 0, 1, 2, 3);
    /* along dim 1 into a column view, src aliasing dst (read before write) */
    kn_tensor *row = kn_narrow(ctx, dst, 0, 1, 1);                       /* [1,3] = 4 5 6 */
    kn_tensor *ic2 = kn_index_copy(ctx, row, 1, idx1(ctx, KN_I32, 3, (double[]){2, 1, 0}), row);
    REQUIRE(ic2 && kn_realize(ic2) == KN_OK, "%s", kn_last_error());
    EXPECT(dst, "index_copy reversed row in place", 0, 0, 0, 6, 5, 4, 0, 0, 0, 1, 2, 3);
    /* in a plan: replays write again */
    kn_tensor *in = kn_input(ctx, KN_F32, 2, (int64_t[]){1, 3});
    kn_tensor *pos = kn_input(ctx, KN_I64, 1, (int64_t[]){1});
    kn_tensor *w = kn_index_copy(ctx, dst, 0, pos, in);
    kn_plan *p = kn_plan_new(ctx, 1, &w, NULL);
    REQUIRE(p, "%s", kn_last_error());
    for (int64_t r = 0; r < 4; r++) {
        float v[3] = {(float)r, (float)r, (float)r};
        kn_tensor_write(in, v, KN_F32); kn_tensor_write(pos, &r, KN_I64);
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    }
    EXPECT(dst, "index_copy replayed", 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3);
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

/* ======================================================================
 * reference vs CPU backend, and gradients, through one builder
 * ====================================================================== */

enum { OP_STACK = 1000, OP_SPLIT, OP_CHUNK, OP_REPEAT, OP_SLICE, OP_PIECES };
typedef struct spec {
    int op, dim, n;                 /* n: number of tensor inputs (cat/stack), pieces (chunk), dims (repeat) */
    int64_t a[2 * KN_MAX_DIMS];     /* pads / repeats / slice (start, end, step) / split size */
    int npairs;
    kn_pad_mode mode;
    double value;
    int indim;                      /* 0: no index */
    int64_t ishape[KN_MAX_DIMS];
    double idata[256];
    kn_dtype idt;
    bool itrans;                    /* index as a transposed view (2-d) */
} spec;

static kn_tensor *make_index(kn_ctx *ctx, const spec *s) {
    kn_dtype dt = s->idt ? s->idt : KN_I64;
    if (s->itrans && s->indim == 2) {
        int64_t r = s->ishape[0], c = s->ishape[1];
        double tv[256];
        for (int64_t i = 0; i < r; i++) for (int64_t j = 0; j < c; j++) tv[j * r + i] = s->idata[i * c + j];
        return kn_transpose(ctx, from_f64(ctx, dt, 2, (int64_t[]){c, r}, tv), 0, 1);
    }
    return from_f64(ctx, dt, s->indim, s->ishape, s->idata);
}

static kn_tensor *build(kn_ctx *ctx, kn_tensor **in, void *ud) {
    spec *s = ud;
    kn_tensor *idx = s->indim ? make_index(ctx, s) : NULL;
    switch (s->op) {
    case KN_OP_CAT: return kn_cat(ctx, in, s->n, s->dim);
    case OP_STACK: return kn_stack(ctx, in, s->n, s->dim);
    case OP_SPLIT: case OP_CHUNK: {       /* pieces, concatenated in reverse order */
        kn_tensor *p[16], *r[16];
        int n = s->op == OP_SPLIT ? kn_split(ctx, in[0], s->a[0], s->dim, p, 16) : kn_chunk(ctx, in[0], s->n, s->dim, p, 16);
        if (n <= 0) return NULL;
        for (int i = 0; i < n; i++) r[i] = kn_mul_scalar(ctx, p[n - 1 - i], 1.0 + i);
        return kn_cat(ctx, r, n, s->dim);
    }
    case OP_REPEAT: return kn_repeat(ctx, in[0], s->n, s->a);
    case OP_SLICE: return kn_slice(ctx, in[0], s->dim, s->a[0], s->a[1], s->a[2]);
    case OP_PIECES: {                     /* n unit-step slices (start a[2i], length a[2i+1]), each scaled */
        kn_tensor *r[8];
        for (int i = 0; i < s->n; i++) r[i] = kn_mul_scalar(ctx, kn_narrow(ctx, in[0], s->dim, s->a[2 * i], s->a[2 * i + 1]), 1.0 + i);
        return kn_cat(ctx, r, s->n, s->dim);
    }
    case KN_OP_PAD: return kn_pad(ctx, in[0], s->npairs, s->a, s->mode, s->value);
    case KN_OP_GATHER: return kn_gather(ctx, in[0], s->dim, idx);
    case KN_OP_SCATTER: return kn_scatter(ctx, in[0], s->dim, idx, in[1]);
    case KN_OP_SCATTER_ADD: return kn_scatter_add(ctx, in[0], s->dim, idx, in[1]);
    case KN_OP_INDEX_SELECT: return kn_index_select(ctx, in[0], s->dim, idx);
    case KN_OP_INDEX_ADD: return kn_index_add(ctx, in[0], s->dim, idx, in[1]);
    }
    return NULL;
}

static kn_opin IN(int ndim, const int64_t *shape, bool tr, kn_dtype dt) {
    kn_opin o = {.ndim = ndim, .lo = -2, .hi = 2, .dtype = dt, .transposed = tr};
    for (int i = 0; i < ndim; i++) o.shape[i] = shape[i];
    return o;
}
#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* random index values in [0, n) for an index of the given shape */
static void rand_index(spec *s, int ndim, const int64_t *shape, int64_t n) {
    s->indim = ndim;
    int64_t m = 1;
    for (int i = 0; i < ndim; i++) { s->ishape[i] = shape[i]; m *= shape[i]; }
    for (int64_t i = 0; i < m; i++) s->idata[i] = n ? (double)(kn_test_u64() % (uint64_t)n) : 0;
}
/* index rows (last dim, length m <= n) of distinct values in [0, n): for scatter gradients */
static void distinct_index(spec *s, int64_t rows, int64_t m, int64_t n) {
    s->indim = 2; s->ishape[0] = rows; s->ishape[1] = m;
    for (int64_t r = 0; r < rows; r++) {
        double perm[64];
        for (int64_t i = 0; i < n; i++) perm[i] = (double)i;
        for (int64_t i = n - 1; i > 0; i--) { int64_t j = (int64_t)(kn_test_u64() % (uint64_t)(i + 1)); double t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        for (int64_t i = 0; i < m; i++) s->idata[r * m + i] = perm[i];
    }
}

#define BACKENDS(sp, nin, ...) do { kn_opin in_[] = {__VA_ARGS__}; \
    double e_ = kn_optest_backends(build, &(sp), (nin), in_); \
    CHECK(e_ <= 1e-6, "%s: ref vs cpu rel err %g (%s)", #sp, e_, kn_last_error()); } while (0)
#define GRAD(sp, nin, req, ...) do { kn_opin in_[] = {__VA_ARGS__}; const bool *r_ = (req); \
    double e_ = kn_gradcheck(build, &(sp), (nin), in_, r_); \
    CHECK(e_ <= 1e-6, "%s: gradcheck rel err %g", #sp, e_); } while (0)
#define R2 ((const bool[]){true, true})
#define R1 ((const bool[]){true})

TEST(backends_cat_stack_split_repeat) {
    kn_test_seed(1);
    spec c = {.op = KN_OP_CAT, .dim = -1, .n = 3};
    BACKENDS(c, 3, IN(2, SH(3, 2), false, 0), IN(2, SH(3, 4), true, 0), IN(2, SH(3, 0), false, 0));
    spec c0 = {.op = KN_OP_CAT, .dim = 0, .n = 2};
    BACKENDS(c0, 2, IN(3, SH(1, 2, 5), true, KN_F64), IN(3, SH(4, 2, 5), false, KN_F64));
    spec c6 = {.op = KN_OP_CAT, .dim = 1, .n = 6};
    BACKENDS(c6, 6, IN(2, SH(2, 1), 0, 0), IN(2, SH(2, 3), 1, 0), IN(2, SH(2, 2), 0, 0),
             IN(2, SH(2, 5), 1, KN_F64), IN(2, SH(2, 1), 0, 0), IN(2, SH(2, 7), 0, 0));
    spec st = {.op = OP_STACK, .dim = 1, .n = 3};
    BACKENDS(st, 3, IN(2, SH(3, 4), true, 0), IN(2, SH(3, 4), false, 0), IN(2, SH(3, 4), true, 0));
    spec sp = {.op = OP_SPLIT, .dim = -2, .a = {2}};
    BACKENDS(sp, 1, IN(3, SH(2, 5, 3), true, 0));
    spec ch = {.op = OP_CHUNK, .dim = 2, .n = 3};
    BACKENDS(ch, 1, IN(3, SH(2, 3, 7), true, 0));
    spec rp = {.op = OP_REPEAT, .n = 3, .a = {2, 1, 3}};
    BACKENDS(rp, 1, IN(2, SH(3, 2), true, 0));
    spec rp2 = {.op = OP_REPEAT, .n = 5, .a = {2, 2, 1, 2, 3}};
    BACKENDS(rp2, 1, IN(4, SH(1, 2, 3, 2), true, KN_F64));
    spec sl = {.op = OP_SLICE, .dim = 1, .a = {1, 7, 2}};
    BACKENDS(sl, 1, IN(2, SH(3, 8), true, 0));
}

TEST(backends_pad) {
    kn_test_seed(2);
    kn_pad_mode modes[3] = {KN_PAD_CONSTANT, KN_PAD_REFLECT, KN_PAD_REPLICATE};
    for (int m = 0; m < 3; m++) {
        spec p1 = {.op = KN_OP_PAD, .npairs = 2, .a = {2, 1, 0, 3}, .mode = modes[m], .value = 0.5};
        BACKENDS(p1, 1, IN(3, SH(2, 4, 5), true, 0));
        spec p2 = {.op = KN_OP_PAD, .npairs = 3, .a = {-1, 2, 1, -2, 1, 1}, .mode = modes[m], .value = -3};
        BACKENDS(p2, 1, IN(3, SH(2, 4, 5), false, KN_F64));
        spec p3 = {.op = KN_OP_PAD, .npairs = 1, .a = {0, 0}, .mode = modes[m]};
        BACKENDS(p3, 1, IN(2, SH(3, 4), true, 0));
    }
    spec pe = {.op = KN_OP_PAD, .npairs = 2, .a = {1, 1, 0, 0}, .mode = KN_PAD_CONSTANT};
    BACKENDS(pe, 1, IN(2, SH(0, 3), false, 0));
}

TEST(backends_gather_scatter_index) {
    kn_test_seed(3);
    spec g = {.op = KN_OP_GATHER, .dim = 1};
    rand_index(&g, 3, SH(2, 6, 3), 5);
    BACKENDS(g, 1, IN(3, SH(2, 5, 4), true, 0));
    spec g0 = {.op = KN_OP_GATHER, .dim = -2, .itrans = true, .idt = KN_I32};
    rand_index(&g0, 2, SH(3, 2), 4);
    BACKENDS(g0, 1, IN(2, SH(4, 3), true, KN_F64));
    spec ge = {.op = KN_OP_GATHER, .dim = 0};
    rand_index(&ge, 2, SH(0, 3), 4);
    BACKENDS(ge, 1, IN(2, SH(4, 3), false, 0));

    for (int add = 0; add < 2; add++) {
        spec s = {.op = add ? KN_OP_SCATTER_ADD : KN_OP_SCATTER, .dim = 1, .itrans = true};
        rand_index(&s, 2, SH(3, 4), 6);
        BACKENDS(s, 2, IN(2, SH(3, 6), true, 0), IN(2, SH(4, 5), true, 0));
        spec s0 = {.op = add ? KN_OP_SCATTER_ADD : KN_OP_SCATTER, .dim = -3, .idt = KN_I8};
        rand_index(&s0, 3, SH(2, 2, 3), 3);
        BACKENDS(s0, 2, IN(3, SH(3, 2, 3), false, KN_F64), IN(3, SH(2, 3, 3), true, 0));
    }
    spec is = {.op = KN_OP_INDEX_SELECT, .dim = -1};
    rand_index(&is, 1, SH(7), 4);
    BACKENDS(is, 1, IN(3, SH(2, 3, 4), true, 0));
    spec is0 = {.op = KN_OP_INDEX_SELECT, .dim = 0, .idt = KN_U8};
    rand_index(&is0, 1, SH(0), 3);
    BACKENDS(is0, 1, IN(2, SH(3, 2), false, 0));
    spec ia = {.op = KN_OP_INDEX_ADD, .dim = 1};
    rand_index(&ia, 1, SH(5), 3);
    BACKENDS(ia, 2, IN(3, SH(2, 3, 4), true, 0), IN(3, SH(2, 5, 4), true, KN_F64));
}

TEST(gradients) {
    kn_test_seed(4);
    spec c = {.op = KN_OP_CAT, .dim = -1, .n = 3};
    GRAD(c, 3, ((bool[]){true, false, true}), IN(2, SH(3, 2), false, 0), IN(2, SH(3, 4), true, 0), IN(2, SH(3, 3), true, 0));
    spec c6 = {.op = KN_OP_CAT, .dim = 0, .n = 6};
    GRAD(c6, 6, ((bool[]){1, 1, 1, 1, 1, 1}), IN(2, SH(1, 2), 0, 0), IN(2, SH(2, 2), 1, 0), IN(2, SH(1, 2), 0, 0),
         IN(2, SH(3, 2), 0, 0), IN(2, SH(1, 2), 0, 0), IN(2, SH(2, 2), 0, 0));
    spec st = {.op = OP_STACK, .dim = 0, .n = 2};
    GRAD(st, 2, R2, IN(2, SH(2, 3), true, 0), IN(2, SH(2, 3), false, 0));
    spec sp = {.op = OP_SPLIT, .dim = 1, .a = {2}};
    GRAD(sp, 1, R1, IN(2, SH(3, 5), true, 0));
    spec rp = {.op = OP_REPEAT, .n = 3, .a = {2, 1, 3}};
    GRAD(rp, 1, R1, IN(2, SH(3, 2), true, 0));
    spec rp6 = {.op = OP_REPEAT, .n = 6, .a = {2, 1, 2, 1, 2, 2}};
    GRAD(rp6, 1, R1, IN(6, SH(1, 2, 1, 1, 2, 1), false, 0));
    kn_pad_mode modes[3] = {KN_PAD_CONSTANT, KN_PAD_REFLECT, KN_PAD_REPLICATE};
    for (int m = 0; m < 3; m++) {
        spec p = {.op = KN_OP_PAD, .npairs = 2, .a = {2, 1, -1, 3}, .mode = modes[m], .value = 0.5};
        GRAD(p, 1, R1, IN(2, SH(4, 5), true, 0));
        spec p3 = {.op = KN_OP_PAD, .npairs = 3, .a = {3, 0, 1, 2, 1, 1}, .mode = modes[m], .value = 0.5};
        GRAD(p3, 1, R1, IN(3, SH(2, 3, 4), false, 0));
    }
    spec g = {.op = KN_OP_GATHER, .dim = 1};
    rand_index(&g, 2, SH(3, 6), 4);                 /* repeated indices: gradients add up */
    GRAD(g, 1, R1, IN(2, SH(4, 4), true, 0));
    spec s = {.op = KN_OP_SCATTER, .dim = 1};
    distinct_index(&s, 3, 3, 5);                    /* distinct targets per row: scatter is differentiable */
    GRAD(s, 2, R2, IN(2, SH(4, 5), true, 0), IN(2, SH(3, 4), false, 0));
    spec sa = {.op = KN_OP_SCATTER_ADD, .dim = 0, .itrans = true};
    rand_index(&sa, 2, SH(3, 2), 2);
    GRAD(sa, 2, R2, IN(2, SH(2, 3), true, 0), IN(2, SH(4, 2), false, 0));
    spec is = {.op = KN_OP_INDEX_SELECT, .dim = -2};
    rand_index(&is, 1, SH(6), 3);
    GRAD(is, 1, R1, IN(3, SH(2, 3, 2), true, 0));
    spec ia = {.op = KN_OP_INDEX_ADD, .dim = 1};
    rand_index(&ia, 1, SH(4), 3);
    GRAD(ia, 2, R2, IN(2, SH(2, 3), true, 0), IN(2, SH(2, 4), true, 0));
    /* slice with a step: its rule in rules.c is an index_add into zeros */
    spec sl = {.op = OP_SLICE, .dim = -1, .a = {1, 8, 3}};
    GRAD(sl, 1, R1, IN(2, SH(3, 8), true, 0));
    spec sl0 = {.op = OP_SLICE, .dim = 0, .a = {-4, 100, 2}};
    GRAD(sl0, 1, R1, IN(3, SH(5, 2, 3), false, 0));
}

/* The gradients of unit-step slices of one tensor: disjoint ranges become one
 * cat with zeros in the gaps (autograd/backward.c), overlapping ones add. */
TEST(gradients_of_slices_combine) {
    kn_test_seed(5);
    spec gap = {.op = OP_PIECES, .dim = 1, .n = 3, .a = {7, 3, 0, 3, 4, 2}};      /* [0,3) [4,6) [7,10), gaps 3 and 6 */
    GRAD(gap, 1, R1, IN(2, SH(3, 10), true, 0));
    spec full = {.op = OP_PIECES, .dim = 0, .n = 3, .a = {2, 3, 0, 1, 1, 1}};     /* covers [0,5) exactly */
    GRAD(full, 1, R1, IN(3, SH(5, 2, 3), false, 0));
    spec ovl = {.op = OP_PIECES, .dim = 1, .n = 3, .a = {0, 4, 2, 4, 8, 2}};      /* [0,4) and [2,6) overlap */
    GRAD(ovl, 1, R1, IN(2, SH(3, 10), false, 0));
    /* the structure: one cat node, no pads */
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 10});
    kn_set_requires_grad(x, true);
    kn_tensor *y = build(ctx, &x, &gap), *g = NULL;
    REQUIRE(y && kn_gradients(ctx, 1, &y, NULL, 1, &x, &g) == KN_OK && g, "%s", kn_last_error());
    CHECK(g->op == KN_OP_CAT && g->src[4] && !g->src[5], "gradient is %s with 5 parts", kn_op_name(g->op));
    kn_ctx_free(ctx);
}

/* Symbolic lengths: a gather/index_select over a slice_sym view inside one
 * plan, with its gradient (slice_sym's rule is an index_add into zeros). */
TEST(symbolic_lengths_in_a_plan) {
    kn_ctx *ctx = ref_ctx();
    int T = kn_sym_new(ctx, "T", 6);
    kn_tensor *x = kn_param(ctx, KN_F64, 2, SH(6, 3));
    double xv[18];
    for (int i = 0; i < 18; i++) xv[i] = i;
    REQUIRE(kn_tensor_write(x, xv, KN_F64) == KN_OK, "%s", kn_last_error());
    kn_tensor *xs = kn_slice_sym(ctx, x, 0, 0, T);                          /* [T,3] */
    kn_tensor *y = kn_index_select(ctx, xs, 1, idx1(ctx, KN_I64, 3, (double[]){2, 0, 2}));   /* [T,3] */
    kn_tensor *z = kn_pad(ctx, y, 1, SH(1, 0), KN_PAD_CONSTANT, 0);         /* [T,4] */
    REQUIRE(y && z && y->sym[0] == T && z->sym[0] == T, "symbolic dim carried: %s", kn_last_error());
    /* seeded with ones_like(z) (symbolic) rather than through kn_sum_all,
     * whose rule does not keep symbolic dims */
    kn_tensor *seed = kn_ones_like(ctx, z), *gx = NULL;
    REQUIRE(kn_gradients(ctx, 1, &z, &seed, 1, &x, &gx) == KN_OK && gx, "%s", kn_last_error());
    kn_tensor *outs[2] = {z, gx};
    kn_plan *p = kn_plan_new(ctx, 2, outs, NULL);
    REQUIRE(p, "%s", kn_last_error());
    for (int len = 1; len <= 6; len += 2) {
        REQUIRE(kn_sym_set(ctx, T, len) == KN_OK && kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        double zv[24], g[18];
        REQUIRE(kn_tensor_read(z, zv, KN_F64) == KN_OK, "%s", kn_last_error());
        for (int t = 0; t < len; t++)
            for (int j = 0; j < 4; j++) {
                double w = j == 0 ? 0 : xv[t * 3 + (j == 2 ? 0 : 2)];
                CHECK(zv[t * 4 + j] == w, "T=%d: z[%d][%d] = %g want %g", len, t, j, zv[t * 4 + j], w);
            }
        REQUIRE(kn_tensor_read(gx, g, KN_F64) == KN_OK, "%s", kn_last_error());
        for (int t = 0; t < 6; t++)
            for (int j = 0; j < 3; j++) {
                double w = t < len ? (j == 2 ? 2 : j == 0 ? 1 : 0) : 0;
                CHECK(g[t * 3 + j] == w, "T=%d grad[%d][%d] = %g want %g", len, t, j, g[t * 3 + j], w);
            }
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

/* ======================================================================
 * bad arguments
 * ====================================================================== */

static bool err_names(const char *op) {
    const char *m = kn_last_error();
    bool ok = m && strstr(m, op);
    if (!ok) fprintf(stderr, "  message does not name %s: %s\n", op, m ? m : "(null)");
    return ok;
}
#define BAD(expr, op) do { CHECK((expr) == NULL, "%s must fail", #expr); CHECK(err_names(op), "%s", #expr); \
    kn_ctx_clear_status(ctx); } while (0)

TEST(bad_arguments_at_build_time) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, SH(3, 4));
    kn_tensor *y = kn_zeros(ctx, KN_F32, 2, SH(2, 5));
    kn_tensor *fi = kn_zeros(ctx, KN_F32, 2, SH(3, 4));
    kn_tensor *bi = kn_zeros(ctx, KN_BOOL, 2, SH(3, 4));
    kn_tensor *i2 = kn_zeros(ctx, KN_I64, 2, SH(3, 4));
    kn_tensor *i1 = kn_zeros(ctx, KN_I64, 1, SH(2));
    kn_tensor *s0 = kn_scalar(ctx, KN_F32, 1);
    BAD(kn_cat(ctx, (kn_tensor *[]){x, y}, 2, 0), "cat");
    BAD(kn_cat(ctx, (kn_tensor *[]){x, x}, 2, 2), "cat");
    BAD(kn_cat(ctx, NULL, 0, 0), "cat");
    BAD(kn_cat(ctx, (kn_tensor *[]){s0, s0}, 2, 0), "cat");
    BAD(kn_stack(ctx, (kn_tensor *[]){x, y}, 2, 0), "stack");
    BAD(kn_stack(ctx, (kn_tensor *[]){x, x}, 2, 3), "stack");
    kn_tensor *p[2];
    CHECK(kn_split(ctx, x, 1, 0, p, 2) == -1 && err_names("split"), "split into too small out[]");
    CHECK(kn_split(ctx, x, 0, 0, p, 2) == -1 && err_names("split"), "split size 0");
    CHECK(kn_chunk(ctx, x, 0, 0, p, 2) == -1 && err_names("chunk"), "chunk 0");
    CHECK(kn_split(ctx, NULL, 1, 0, p, 2) == -1, "split of NULL");
    kn_ctx_clear_status(ctx);
    BAD(kn_repeat(ctx, x, 1, SH(2)), "repeat");
    BAD(kn_repeat(ctx, x, 2, SH(2, -1)), "repeat");
    BAD(kn_pad(ctx, x, 3, SH(1, 1, 1, 1, 1, 1), KN_PAD_CONSTANT, 0), "pad");
    BAD(kn_pad(ctx, x, 1, SH(4, 0), KN_PAD_REFLECT, 0), "pad");
    BAD(kn_pad(ctx, x, 1, SH(-3, -2), KN_PAD_CONSTANT, 0), "pad");
    BAD(kn_pad(ctx, kn_zeros(ctx, KN_F32, 1, SH(0)), 1, SH(1, 0), KN_PAD_REPLICATE, 0), "pad");
    BAD(kn_gather(ctx, x, 1, fi), "gather");
    BAD(kn_gather(ctx, x, 1, bi), "gather");
    BAD(kn_gather(ctx, x, 1, i1), "gather");
    BAD(kn_gather(ctx, x, 1, kn_zeros(ctx, KN_I64, 2, SH(4, 2))), "gather");
    BAD(kn_gather(ctx, x, 2, i2), "gather");
    BAD(kn_gather(ctx, s0, 0, i1), "gather");
    BAD(kn_scatter(ctx, x, 1, i2, y), "scatter");
    BAD(kn_scatter(ctx, x, 1, fi, x), "scatter");
    BAD(kn_scatter_add(ctx, x, 0, kn_zeros(ctx, KN_I64, 2, SH(3, 5)), kn_zeros(ctx, KN_F32, 2, SH(3, 5))), "scatter_add");
    BAD(kn_index_select(ctx, x, 0, i2), "index_select");
    BAD(kn_index_select(ctx, x, 0, kn_zeros(ctx, KN_F64, 1, SH(2))), "index_select");
    BAD(kn_index_select(ctx, x, -3, i1), "index_select");
    BAD(kn_index_add(ctx, x, 0, i1, x), "index_add");
    BAD(kn_index_add(ctx, x, 0, kn_zeros(ctx, KN_F32, 1, SH(2)), kn_zeros(ctx, KN_F32, 2, SH(2, 4))), "index_add");
    kn_tensor *dst = kn_empty(ctx, KN_F32, 2, SH(3, 4));
    BAD(kn_index_copy(ctx, dst, 0, i1, x), "index_copy");
    BAD(kn_index_copy(ctx, kn_add(ctx, dst, dst), 0, i1, kn_zeros(ctx, KN_F32, 2, SH(2, 4))), "index_copy");
    BAD(kn_index_copy(ctx, dst, 0, fi, x), "index_copy");
    CHECK(kn_gather(ctx, NULL, 0, i1) == NULL && kn_ctx_status(ctx) == KN_OK, "NULL input propagates quietly");
    kn_ctx_free(ctx);
}

/* Index values are data: checked when the kernel runs, with the op named. */
TEST(bad_index_values_at_run_time) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 10, 1), 2, SH(2, 5));
    kn_tensor *g = kn_gather(ctx, x, 1, from_f64(ctx, KN_I64, 2, SH(2, 2), (double[]){0, 7, 1, 2}));
    REQUIRE(g, "%s", kn_last_error());
    double v[4];
    CHECK(kn_tensor_read(g, v, KN_F64) == KN_ERR_INVALID, "gather with index 7 must fail");
    CHECK(err_names("gather") && strstr(kn_last_error(), "index 7") && strstr(kn_last_error(), "size 5"), "%s", kn_last_error());
    kn_tensor *gn = kn_gather(ctx, x, 1, from_f64(ctx, KN_I32, 2, SH(1, 1), (double[]){-1}));
    CHECK(kn_realize(gn) == KN_ERR_INVALID && err_names("gather") && strstr(kn_last_error(), "-1"), "negative gather index: %s", kn_last_error());
    kn_tensor *is = kn_index_select(ctx, x, 0, idx1(ctx, KN_I64, 2, (double[]){1, 2}));
    CHECK(kn_realize(is) == KN_ERR_INVALID && err_names("index_select"), "index_select out of range");
    kn_tensor *isn = kn_index_select(ctx, x, 1, idx1(ctx, KN_I8, 1, (double[]){-2}));
    CHECK(kn_realize(isn) == KN_ERR_INVALID && err_names("index_select"), "index_select negative");
    kn_tensor *sc = kn_scatter(ctx, x, 0, from_f64(ctx, KN_I64, 2, SH(1, 1), (double[]){2}), x);
    CHECK(kn_realize(sc) == KN_ERR_INVALID && err_names("scatter"), "scatter out of range");
    kn_tensor *sa = kn_scatter_add(ctx, x, 1, from_f64(ctx, KN_I64, 2, SH(1, 1), (double[]){5}), x);
    CHECK(kn_realize(sa) == KN_ERR_INVALID && err_names("scatter_add"), "scatter_add out of range");
    kn_tensor *ia = kn_index_add(ctx, x, 0, idx1(ctx, KN_I64, 1, (double[]){-1}), kn_ones(ctx, KN_F32, 2, SH(1, 5)));
    CHECK(kn_realize(ia) == KN_ERR_INVALID && err_names("index_add"), "index_add negative");
    /* index_copy checks every index before writing: dst stays untouched */
    kn_tensor *dst = from_f64(ctx, KN_F32, 2, SH(3, 2), (double[6]){0});
    kn_tensor *ic = kn_index_copy(ctx, dst, 0, idx1(ctx, KN_I64, 2, (double[]){0, 3}), kn_ones(ctx, KN_F32, 2, SH(2, 2)));
    CHECK(kn_realize(ic) == KN_ERR_INVALID && err_names("index_copy"), "index_copy out of range");
    EXPECT(dst, "dst untouched after a failed index_copy", 0, 0, 0, 0, 0, 0);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
