/* test_core.c: tensors, views, lazy graphs, plans and autograd basics. */
#include "kn_optest.h"
#include <math.h>
#include "core/env.h"
#include "kiln_backend.h"

static kn_ctx *ref_ctx(void) { kn_ctx_opts o = {kn_backend_ref()}; return kn_ctx_new(&o); }

TEST(from_data_read_roundtrip) {
    kn_ctx *ctx = ref_ctx();
    float d[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[2] = {2, 3};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, s, d);
    double out[6];
    REQUIRE(kn_tensor_read(x, out, KN_F64) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 6; i++) CHECK(out[i] == d[i], "elem %d", i);
    kn_ctx_free(ctx);
}

TEST(views_are_zero_copy_and_correct) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_arange(ctx, KN_F32, 0, 24, 1);
    int64_t s[3] = {2, 3, 4};
    kn_tensor *x = kn_reshape(ctx, a, 3, s);
    REQUIRE(kn_realize(x) == KN_OK, "%s", kn_last_error());
    int perm[3] = {2, 0, 1};
    kn_tensor *p = kn_permute(ctx, x, perm);           /* [4,2,3] */
    CHECK(p->buf == x->buf || p->view_src == x->view_src, "permute shares storage");
    float v[24];
    REQUIRE(kn_tensor_read(p, v, KN_F32) == KN_OK, "%s", kn_last_error());
    /* p[k][i][j] = x[i][j][k] = i*12 + j*4 + k */
    for (int k = 0; k < 4; k++) for (int i = 0; i < 2; i++) for (int j = 0; j < 3; j++)
        CHECK(v[k * 6 + i * 3 + j] == i * 12 + j * 4 + k, "permute [%d,%d,%d]", k, i, j);
    kn_tensor *sl = kn_slice(ctx, x, 2, 1, 4, 2);        /* [2,3,2]: k = 1, 3 */
    float w[12];
    REQUIRE(kn_tensor_read(sl, w, KN_F32) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 2; i++) for (int j = 0; j < 3; j++) for (int k = 0; k < 2; k++)
        CHECK(w[i * 6 + j * 2 + k] == i * 12 + j * 4 + 1 + 2 * k, "slice");
    /* view of a non-contiguous tensor: view fails, reshape copies */
    int64_t flat = 24;
    CHECK(kn_view(ctx, p, 1, &flat) == NULL, "view of permuted must fail");
    kn_ctx_clear_status(ctx);
    kn_tensor *r = kn_reshape(ctx, p, 1, &flat);
    REQUIRE(r != NULL, "%s", kn_last_error());
    float z[24];
    REQUIRE(kn_tensor_read(r, z, KN_F32) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 24; i++) CHECK(z[i] == v[i], "reshape copy %d", i);
    /* unsqueeze / squeeze / expand / flatten / select */
    kn_tensor *u = kn_unsqueeze(ctx, x, 1);
    CHECK(u->ndim == 4 && u->shape[1] == 1, "unsqueeze");
    CHECK(kn_squeeze(ctx, u, 1)->ndim == 3, "squeeze");
    kn_tensor *se = kn_select(ctx, x, 1, -1);            /* [2,4], j = 2 */
    float q[8];
    REQUIRE(kn_tensor_read(se, q, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(q[5] == 12 + 8 + 1, "select");
    int64_t es[3] = {2, 3, 4};
    kn_tensor *row = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 4, 1), 1, (int64_t[]){4});
    kn_tensor *ex = kn_expand(ctx, row, 3, es);
    CHECK(ex->stride[0] == 0 && ex->stride[1] == 0, "expand strides 0");
    kn_ctx_free(ctx);
}

/* reshape of an expanded tensor with size-1 dims between real ones must not
 * be taken for a view (it needs a copy) and must give the right values */
TEST(reshape_expanded_with_unit_dims) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 8, 1), 6, (int64_t[]){2, 2, 2, 1, 1, 1});
    kn_tensor *e = kn_expand(ctx, x, 6, (int64_t[]){2, 2, 2, 1, 2, 1});
    kn_tensor *r = kn_reshape(ctx, e, 4, (int64_t[]){16, 1, 1, 1});
    float v[16];
    REQUIRE(kn_tensor_read(r, v, KN_F32) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 16; i++) CHECK(v[i] == (float)(i / 2), "elem %d = %g", i, v[i]);
    kn_tensor *y = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 6, 1), 4, (int64_t[]){2, 1, 3, 1});
    kn_tensor *z = kn_view(ctx, y, 2, (int64_t[]){3, 2});     /* contiguous: a view */
    CHECK(z && z->view_src, "contiguous reshape through unit dims is a view");
    kn_ctx_free(ctx);
}

TEST(bad_shapes_give_clear_errors) {
    kn_ctx *ctx = ref_ctx();
    int64_t s1[2] = {2, 3}, s2[2] = {4, 5};
    kn_tensor *a = kn_zeros(ctx, KN_F32, 2, s1), *b = kn_zeros(ctx, KN_F32, 2, s2);
    CHECK(kn_add(ctx, a, b) == NULL, "add must fail");
    CHECK(strstr(kn_last_error(), "add") && strstr(kn_last_error(), "[2,3]") && strstr(kn_last_error(), "[4,5]"),
          "message names op and shapes: %s", kn_last_error());
    CHECK(kn_ctx_status(ctx) == KN_ERR_INVALID, "sticky status");
    CHECK(kn_matmul(ctx, a, a) == NULL && strstr(kn_last_error(), "inner dims"), "%s", kn_last_error());
    CHECK(kn_sum(ctx, a, 1, (int[]){5}, false) == NULL && strstr(kn_last_error(), "out of range"), "%s", kn_last_error());
    CHECK(kn_add(ctx, NULL, a) == NULL, "NULL propagates");
    CHECK(kn_realize(NULL) != KN_OK, "realize NULL is an error");
    /* a freed tensor */
    kn_tensor *c = kn_add(ctx, a, a);
    kn_ctx_reset(ctx);
    CHECK(kn_realize(c) == KN_ERR_STATE && strstr(kn_last_error(), "freed"), "%s", kn_last_error());
    CHECK(kn_add(ctx, c, c) == NULL && kn_ctx_status(ctx) == KN_ERR_STATE, "using a freed tensor");
    kn_ctx_free(ctx);
    kn_ctx_free(NULL);
    kn_plan_free(NULL);
}

TEST(broadcast_binary_and_scalar) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 6, 1), 2, (int64_t[]){2, 3});
    kn_tensor *b = kn_reshape(ctx, kn_arange(ctx, KN_F32, 10, 13, 1), 1, (int64_t[]){3});
    kn_tensor *c = kn_add(ctx, a, b);
    float v[6];
    REQUIRE(kn_tensor_read(c, v, KN_F32) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 6; i++) CHECK(v[i] == i + 10 + i % 3, "bcast add %d", i);
    kn_tensor *d = kn_mul_scalar(ctx, a, 0.5);
    CHECK(d->dtype == KN_F32, "scalar keeps f32");
    REQUIRE(kn_tensor_read(d, v, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(v[5] == 2.5f, "mul scalar");
    kn_tensor *m = kn_lt(ctx, a, kn_scalar(ctx, KN_F32, 2.5));
    CHECK(m->dtype == KN_BOOL, "compare gives bool");
    kn_ctx_free(ctx);
}

TEST(reductions) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 24, 1), 3, (int64_t[]){2, 3, 4});
    int ax[2] = {0, 2};
    kn_tensor *s = kn_sum(ctx, a, 2, ax, false);        /* [3] */
    double v[3];
    REQUIRE(kn_tensor_read(s, v, KN_F64) == KN_OK, "%s", kn_last_error());
    for (int j = 0; j < 3; j++) {
        double e = 0;
        for (int i = 0; i < 2; i++) for (int k = 0; k < 4; k++) e += i * 12 + j * 4 + k;
        CHECK(v[j] == e, "sum %d: %g vs %g", j, v[j], e);
    }
    kn_tensor *k = kn_mean(ctx, a, 1, (int[]){-1}, true);
    CHECK(k->ndim == 3 && k->shape[2] == 1, "keepdim");
    kn_tensor *am = kn_argmax(ctx, a, 1, false);
    CHECK(am->dtype == KN_I64, "argmax i64");
    int64_t iv[8];
    REQUIRE(kn_tensor_read(am, iv, KN_I64) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 8; i++) CHECK(iv[i] == 2, "argmax");
    kn_tensor *var = kn_var(ctx, a, 0, NULL, 1, false);
    double vv = kn_item(var);
    CHECK(fabs(vv - 50.0) < 1e-9, "var of 0..23 (unbiased) = 50, got %g", vv);
    kn_ctx_free(ctx);
}

TEST(matmul_batched_broadcast) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_rand(ctx, KN_F64, 3, (int64_t[]){2, 3, 4}, 1);
    kn_tensor *b = kn_rand(ctx, KN_F64, 2, (int64_t[]){4, 5}, 2);
    kn_tensor *c = kn_matmul(ctx, a, b);
    REQUIRE(c && c->ndim == 3 && c->shape[0] == 2 && c->shape[2] == 5, "shape");
    double A[24], B[20], C[30];
    kn_tensor_read(a, A, KN_F64); kn_tensor_read(b, B, KN_F64);
    REQUIRE(kn_tensor_read(c, C, KN_F64) == KN_OK, "%s", kn_last_error());
    for (int z = 0; z < 2; z++) for (int i = 0; i < 3; i++) for (int j = 0; j < 5; j++) {
        double e = 0;
        for (int k = 0; k < 4; k++) e += A[z * 12 + i * 4 + k] * B[k * 5 + j];
        CHECK(fabs(C[z * 15 + i * 5 + j] - e) < 1e-12, "matmul");
    }
    kn_tensor *v = kn_matmul(ctx, b, kn_ones(ctx, KN_F64, 1, (int64_t[]){5}));
    CHECK(v && v->ndim == 1 && v->shape[0] == 4, "matrix @ vector is 1-d");
    kn_ctx_free(ctx);
}

TEST(random_is_deterministic_and_sane) {
    kn_ctx *ctx = ref_ctx();
    int64_t n = 20000;
    kn_tensor *u = kn_rand(ctx, KN_F32, 1, &n, 7), *u2 = kn_rand(ctx, KN_F64, 1, &n, 7);
    kn_tensor *g = kn_randn(ctx, KN_F64, 1, &n, 7);
    float *a = malloc(sizeof(float) * n); double *b = malloc(sizeof(double) * n), *c = malloc(sizeof(double) * n);
    kn_tensor_read(u, a, KN_F32); kn_tensor_read(u2, b, KN_F64); kn_tensor_read(g, c, KN_F64);
    double mu = 0, m2 = 0;
    for (int64_t i = 0; i < n; i++) { CHECK(a[i] == (float)b[i], "f32/f64 same stream"); mu += c[i]; m2 += c[i] * c[i]; if (a[i] != (float)b[i]) break; }
    mu /= n; m2 = m2 / n - mu * mu;
    CHECK(fabs(mu) < 0.03 && fabs(m2 - 1) < 0.05, "normal moments %g %g", mu, m2);
    kn_tensor *p = kn_randperm(ctx, KN_I64, 100, 3);
    int64_t pv[100]; int seen[100] = {0};
    kn_tensor_read(p, pv, KN_I64);
    for (int i = 0; i < 100; i++) if (pv[i] >= 0 && pv[i] < 100) seen[pv[i]]++;
    for (int i = 0; i < 100; i++) CHECK(seen[i] == 1, "randperm is a permutation");
    kn_tensor *ri = kn_randint(ctx, KN_I32, 1, &n, -3, 4, 9);
    int32_t *iv = malloc(sizeof(int32_t) * n);
    kn_tensor_read(ri, iv, KN_I32);
    int hist[7] = {0};
    for (int64_t i = 0; i < n; i++) { CHECK(iv[i] >= -3 && iv[i] < 4, "randint range"); if (iv[i] >= -3 && iv[i] < 4) hist[iv[i] + 3]++; }
    for (int i = 0; i < 7; i++) CHECK(abs(hist[i] - (int)n / 7) < 400, "randint roughly uniform");
    free(a); free(b); free(c); free(iv);
    kn_ctx_free(ctx);
}

/* A plan is built once and replayed with new input data. */
TEST(plan_replay_and_memory_reuse) {
    kn_ctx *ctx = ref_ctx();
    int64_t s[2] = {64, 64};
    kn_tensor *x = kn_input(ctx, KN_F32, 2, s);
    kn_tensor *h = x;
    for (int i = 0; i < 8; i++) h = kn_tanh(ctx, kn_add(ctx, kn_mul_scalar(ctx, h, 0.9), kn_scalar(ctx, KN_F32, 0.1)));
    kn_tensor *y = kn_sum_all(ctx, h);
    kn_plan *p = kn_plan_new(ctx, 1, &y, NULL);
    REQUIRE(p, "%s", kn_last_error());
    CHECK(kn_plan_peak_bytes(p) < kn_plan_naive_bytes(p) / 4, "liveness reuse: peak %zu naive %zu",
          kn_plan_peak_bytes(p), kn_plan_naive_bytes(p));
    float *in = malloc(sizeof(float) * 4096);
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < 4096; i++) in[i] = (float)((i * (rep + 1)) % 7) / 7.0f;
        kn_tensor_write(x, in, KN_F32);
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        double expect = 0;
        for (int i = 0; i < 4096; i++) {
            double v = in[i];
            for (int k = 0; k < 8; k++) v = tanh((double)(float)((float)v * 0.9f) + 0.1);
            expect += v;
        }
        double got = kn_item(y);
        CHECK(fabs(got - expect) < 1e-3 * fabs(expect) + 1e-3, "rep %d: %g vs %g", rep, got, expect);
    }
    kn_plan_opts no = {.no_reuse = true};
    kn_plan *p2 = kn_plan_new(ctx, 1, &y, &no);
    REQUIRE(p2 && kn_plan_run(p2) == KN_OK, "%s", kn_last_error());
    kn_plan_free(p2);
    kn_plan_free(p);
    free(in);
    kn_ctx_free(ctx);
}

/* A node's by-product for its gradient (kn__aux_bytes: sdpa's log-sum-exp).
 * A backend that wraps the reference one records the kn_exec it is handed:
 * the sdpa forward gets a by-product block (e->aux) that its gradient
 * node sees as src_aux[4]; the block lies outside y's own storage; it is
 * kept only where the operands need gradients and are 16-bit; and the
 * arena grows by at most the block (once the block sat after y's elements
 * in y's arena block, and first-fit fragmented GPT-2's arena by 150 MB). */
static kn_backend aux_be;
static kn_status (*aux_inner)(kn_backend *, const kn_exec *);
static void *aux_fwd, *aux_bwd, *aux_y;
static size_t aux_ybytes;
static kn_status aux_compute(kn_backend *be, const kn_exec *e) {
    if (e->node->op == KN_OP_SDPA) {
        aux_fwd = e->aux;
        aux_y = e->dst.data;
        aux_ybytes = (size_t)kn_tview_numel(&e->dst) * 2;
    }
    if (e->node->op == KN_OP_SDPA_BWD) aux_bwd = e->nsrc > 4 ? e->src_aux[4] : NULL;
    return aux_inner(be, e);
}
static void aux_fill(kn_tensor *t, unsigned seed) {
    int64_t n = kn_numel(t);
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 2654435761u + seed * 97u) % 1000) / 500.f - 1.f;
    kn_tensor_write(t, h, KN_F32);
    free(h);
}
static void aux_peak(bool keep, bool y_out, size_t *peak) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){&aux_be});
    int64_t sh[4] = {2, 2, 16, 8};
    kn_tensor *in[3], *gr[3];
    for (int i = 0; i < 3; i++) {
        in[i] = kn_empty(ctx, KN_BF16, 4, sh);
        aux_fill(in[i], 5 + (unsigned)i);
        kn_set_requires_grad(in[i], true);
    }
    kn_tensor *y = kn_sdpa(ctx, in[0], in[1], in[2], true, 0);
    CHECK(y && y->p.sdpa.lse, "bf16 operands that need gradients: the sdpa node keeps its log-sum-exp");
    if (!keep) y->p.sdpa.lse = false;
    kn_tensor *g = kn_empty(ctx, KN_BF16, 4, sh);
    aux_fill(g, 9);
    REQUIRE(kn_gradients(ctx, 1, &y, &g, 3, in, gr) == KN_OK, "%s", kn_last_error());
    kn_tensor *outs[4] = {gr[0], gr[1], gr[2], y};
    kn_plan *p = kn_plan_new(ctx, y_out ? 4 : 3, outs, NULL);
    REQUIRE(p, "%s", kn_last_error());
    aux_fwd = aux_bwd = aux_y = NULL;
    REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    *peak = kn_plan_peak_bytes(p);
    if (keep) {
        CHECK(aux_fwd && aux_bwd == aux_fwd, "the forward's by-product %p, the gradient's %p (want one block)", aux_fwd, aux_bwd);
        CHECK((char *)aux_fwd >= (char *)aux_y + aux_ybytes || (char *)aux_fwd + 2 * 16 * 4 * 2 <= (char *)aux_y,
              "the by-product overlaps y's elements");
    } else {
        CHECK(!aux_fwd && !aux_bwd, "no by-product without the flag: %p %p", aux_fwd, aux_bwd);
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
}
TEST(sdpa_keeps_its_log_sum_exp_for_the_gradient) {
    aux_be = *kn_backend_ref();
    aux_inner = aux_be.compute;
    aux_be.compute = aux_compute;
    size_t with = 0, without = 0, out = 0;
    aux_peak(true, false, &with);
    aux_peak(false, false, &without);
    CHECK(with <= without + 256, "arena %zu bytes with the by-product, %zu without (its block is 256)", with, without);
    aux_peak(true, true, &out);                      /* y a plan output: room in its persistent buffer */
    /* not kept: f32 operands, or no gradient */
    kn_ctx *ctx = ref_ctx();
    int64_t sh[4] = {1, 2, 8, 8};
    kn_tensor *q = kn_empty(ctx, KN_F32, 4, sh);
    kn_set_requires_grad(q, true);
    kn_tensor *y = kn_sdpa(ctx, q, q, q, true, 0);
    CHECK(y && !y->p.sdpa.lse, "f32 sdpa keeps no log-sum-exp");
    kn_tensor *h = kn_empty(ctx, KN_BF16, 4, sh);
    y = kn_sdpa(ctx, h, h, h, false, 0);
    CHECK(y && !y->p.sdpa.lse, "an sdpa without gradients keeps no log-sum-exp");
    kn_ctx_free(ctx);
}

/* Symbolic sizes: one plan serves several lengths. */
TEST(plan_symbolic_length) {
    kn_ctx *ctx = ref_ctx();
    int T = kn_sym_new(ctx, "T", 16);
    kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){16, 4});
    kn_tensor *xs = kn_slice_sym(ctx, x, 0, 0, T);
    kn_tensor *y = kn_sum(ctx, kn_square(ctx, xs), 1, (int[]){0}, false);   /* [4] */
    kn_plan *p = kn_plan_new(ctx, 1, &y, NULL);
    REQUIRE(p, "%s", kn_last_error());
    float in[64];
    for (int i = 0; i < 64; i++) in[i] = (float)(i % 5);
    kn_tensor_write(x, in, KN_F32);
    for (int len = 1; len <= 16; len += 5) {
        REQUIRE(kn_sym_set(ctx, T, len) == KN_OK, "%s", kn_last_error());
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        float out[4];
        kn_tensor_read(y, out, KN_F32);
        for (int c = 0; c < 4; c++) {
            double e = 0;
            for (int t = 0; t < len; t++) e += in[t * 4 + c] * in[t * 4 + c];
            CHECK(out[c] == (float)e, "T=%d c=%d: %g vs %g", len, c, out[c], e);
        }
    }
    CHECK(kn_sym_set(ctx, T, 17) == KN_ERR_LIMIT, "beyond max is refused");
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

/* gradients through symbolic sizes: one plan for every length */
TEST(plan_symbolic_gradient) {
    kn_ctx *ctx = ref_ctx();
    int T = kn_sym_new(ctx, "T", 6);
    kn_tensor *w = kn_param(ctx, KN_F64, 1, (int64_t[]){4});
    kn_tensor *x = kn_input(ctx, KN_F64, 2, (int64_t[]){6, 4});
    kn_tensor *xs = kn_slice_sym(ctx, x, 0, 0, T);
    kn_tensor *loss = kn_sum_all(ctx, kn_square(ctx, kn_mul(ctx, xs, w)));   /* sum_t sum_c (x w)^2 */
    REQUIRE(kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
    kn_tensor *outs[2] = {loss, kn_grad(w)};
    kn_plan *p = kn_plan_new(ctx, 2, outs, NULL);
    REQUIRE(p, "%s", kn_last_error());
    double xv[24], wv[4] = {1, -2, 0.5, 3};
    for (int i = 0; i < 24; i++) xv[i] = (i % 7) - 3;
    kn_tensor_write(x, xv, KN_F64); kn_tensor_write(w, wv, KN_F64);
    for (int len = 1; len <= 6; len += 2) {
        kn_sym_set(ctx, T, len);
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        double g[4];
        kn_tensor_read(kn_grad(w), g, KN_F64);
        for (int c = 0; c < 4; c++) {
            double e = 0;
            for (int t = 0; t < len; t++) e += 2 * xv[t * 4 + c] * xv[t * 4 + c] * wv[c];
            CHECK(fabs(g[c] - e) < 1e-12, "T=%d grad[%d] %g vs %g", len, c, g[c], e);
        }
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

/* mean / var / std over a symbolic dim divide by its run-time extent in
 * the gradient too (the shape holds the maximum) */
TEST(plan_symbolic_mean_var_gradient) {
    kn_ctx *ctx = ref_ctx();
    int T = kn_sym_new(ctx, "T", 6);
    kn_tensor *w = kn_param(ctx, KN_F64, 1, (int64_t[]){3});
    kn_tensor *x = kn_input(ctx, KN_F64, 2, (int64_t[]){6, 3});
    kn_tensor *xw = kn_mul(ctx, kn_slice_sym(ctx, x, 0, 0, T), w);             /* [T,3] */
    kn_tensor *m = kn_mean(ctx, xw, 1, (int[]){0}, false);                      /* [3] */
    kn_tensor *v = kn_var(ctx, xw, 1, (int[]){0}, 1, false);
    kn_tensor *sd = kn_std(ctx, xw, 1, (int[]){0}, 0, false);
    kn_tensor *loss = kn_add(ctx, kn_sum_all(ctx, kn_mul(ctx, m, m)), kn_add(ctx, kn_sum_all(ctx, v), kn_sum_all(ctx, sd)));
    REQUIRE(kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
    kn_tensor *outs[2] = {loss, kn_grad(w)};
    kn_plan *p = kn_plan_new(ctx, 2, outs, NULL);
    REQUIRE(p, "%s", kn_last_error());
    double xv[18], wv[3] = {1.5, -0.5, 2};
    for (int i = 0; i < 18; i++) xv[i] = ((i * 5) % 7) - 2.5;
    kn_tensor_write(x, xv, KN_F64); kn_tensor_write(w, wv, KN_F64);
    for (int len = 2; len <= 6; len += 2) {
        kn_sym_set(ctx, T, len);
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        double g[3];
        kn_tensor_read(kn_grad(w), g, KN_F64);
        for (int c = 0; c < 3; c++) {   /* per column: y_t = x_t w; d/dw of mean^2 + var(ddof 1) + std(ddof 0) */
            double mx = 0, vx = 0;
            for (int t = 0; t < len; t++) mx += xv[t * 3 + c] / len;
            for (int t = 0; t < len; t++) vx += (xv[t * 3 + c] - mx) * (xv[t * 3 + c] - mx);
            double w0 = wv[c], e = 2 * mx * mx * w0 + 2 * w0 * vx / (len - 1) + (w0 > 0 ? 1 : -1) * sqrt(vx / len);
            CHECK(fabs(g[c] - e) < 1e-10, "T=%d grad[%d] %.12g vs %.12g", len, c, g[c], e);
        }
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

TEST(autograd_simple_and_accumulation) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *w = kn_from_data(ctx, KN_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    kn_set_requires_grad(w, true);
    kn_tensor *loss = kn_sum_all(ctx, kn_square(ctx, w));     /* d/dw = 2w */
    REQUIRE(kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
    double g[3];
    REQUIRE(kn_tensor_read(kn_grad(w), g, KN_F64) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 3; i++) CHECK(g[i] == 2.0 * (i + 1), "grad %d", i);
    REQUIRE(kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());   /* accumulates */
    kn_tensor_read(kn_grad(w), g, KN_F64);
    for (int i = 0; i < 3; i++) CHECK(g[i] == 4.0 * (i + 1), "accumulated grad %d", i);
    kn_zero_grad(w);
    CHECK(kn_grad(w) == NULL, "zero_grad");
    kn_no_grad_begin(ctx);
    kn_tensor *ng = kn_mul(ctx, w, w);
    kn_no_grad_end(ctx);
    CHECK(!kn_requires_grad(ng), "no-grad scope");
    CHECK(!kn_requires_grad(kn_detach(ctx, w)), "detach");
    CHECK(kn_backward(ctx, ng) != KN_OK, "backward of a no-grad tensor is an error");
    kn_ctx_free(ctx);
}

TEST(dot_dump) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *a = kn_param(ctx, KN_F32, 1, (int64_t[]){4});
    kn_tensor *y = kn_sum_all(ctx, kn_exp(ctx, a));
    REQUIRE(kn_graph_dump_dot(ctx, 1, &y, "/tmp/kn_test_graph.dot") == KN_OK, "%s", kn_last_error());
    FILE *f = fopen("/tmp/kn_test_graph.dot", "r");
    REQUIRE(f, "dot file");
    char buf[4096]; size_t n = fread(buf, 1, sizeof buf - 1, f); buf[n] = 0; fclose(f);
    CHECK(strstr(buf, "digraph") && strstr(buf, "exp") && strstr(buf, "sum"), "dot content");
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()

/* every library switch in src/core/env.c is documented in docs/ENV.md's
 * library table, and that table names no switch the library does not read */
TEST(env_table_matches_docs) {
    FILE *f = fopen("docs/ENV.md", "r");
    if (!f) SKIP("docs/ENV.md not found (run from the repository root)");
    char line[1024], doc[64][48];
    int nd = 0, in_lib = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "## ", 3)) in_lib = !strncmp(line, "## Library", 10);
        if (in_lib && !strncmp(line, "| `KN_", 6) && nd < 64) {
            char *end = strchr(line + 3, '`');
            size_t n = end ? (size_t)(end - (line + 3)) : 0;
            if (n > 0 && n < sizeof doc[0]) { memcpy(doc[nd], line + 3, n); doc[nd++][n] = 0; }
        }
    }
    fclose(f);
    const char *const *names = kn_env_names();
    int nn = 0;
    for (; names[nn]; nn++) {
        bool found = false;
        for (int i = 0; i < nd; i++) found |= !strcmp(doc[i], names[nn]);
        CHECK(found, "%s is read by the library but not in docs/ENV.md", names[nn]);
    }
    for (int i = 0; i < nd; i++) {
        bool found = false;
        for (int k = 0; names[k]; k++) found |= !strcmp(doc[i], names[k]);
        CHECK(found, "docs/ENV.md documents %s, which src/core/env.c does not read", doc[i]);
    }
    CHECK(nn == nd, "%d switches in env.c, %d in docs/ENV.md", nn, nd);
}

/* values are read once; kn_env_reload picks up a change */
TEST(env_reload_and_flags) {
    const char *old = getenv("KN_CUDA_SYNC");
    char *keep = old ? strdup(old) : NULL;
    setenv("KN_CUDA_SYNC", "0", 1);
    kn_env_reload();
    CHECK(!kn_env_get()->cuda_sync, "\"0\" turns a flag off");
    setenv("KN_CUDA_SYNC", "1", 1);
    CHECK(!kn_env_get()->cuda_sync, "read once: no change before a reload");
    kn_env_reload();
    CHECK(kn_env_get()->cuda_sync, "a reload sees the new value");
    if (keep) setenv("KN_CUDA_SYNC", keep, 1); else unsetenv("KN_CUDA_SYNC");
    free(keep);
    kn_env_reload();
}

/* the variables whose text is read in their own way */
TEST(env_special_values) {
    static const char *names[] = {"KN_LLM_FUSE", "KN_LLM_GPU_CAST", "KN_PROFILE", "KN_CUDA_POOL_MB"};
    char *keep[4];
    for (int i = 0; i < 4; i++) { const char *v = getenv(names[i]); keep[i] = v ? strdup(v) : NULL; }
    setenv("KN_LLM_FUSE", "1", 1); setenv("KN_LLM_GPU_CAST", "yes", 1);
    setenv("KN_PROFILE", "shapes", 1); setenv("KN_CUDA_POOL_MB", "5000", 1);
    kn_env_reload();
    const kn_env *e = kn_env_get();
    CHECK(!e->llm_nofuse, "KN_LLM_FUSE=1 keeps fusion on");
    CHECK(!e->llm_gpu_cast, "KN_LLM_GPU_CAST acts only on \"1\"");
    CHECK(e->profile == 2, "KN_PROFILE=shapes -> %d", e->profile);
    CHECK(e->cuda_pool_mb == 5000, "KN_CUDA_POOL_MB -> %lld", e->cuda_pool_mb);
    setenv("KN_LLM_FUSE", "0", 1); setenv("KN_LLM_GPU_CAST", "1", 1); setenv("KN_PROFILE", "1", 1);
    kn_env_reload();
    CHECK(e->llm_nofuse && e->llm_gpu_cast && e->profile == 1, "fuse off %d, cast %d, profile %d", e->llm_nofuse,
          e->llm_gpu_cast, e->profile);
    for (int i = 0; i < 4; i++) { if (keep[i]) setenv(names[i], keep[i], 1); else unsetenv(names[i]); free(keep[i]); }
    kn_env_reload();
}
