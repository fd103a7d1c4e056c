/* test_ops_nn.c: forward values of the nn ops (softmax, norms, dropout,
 * embedding, conv, pooling, sdpa, rope) against hand-computed values,
 * closed formulas and identities built from other ops; reference vs fast CPU
 * backend; bad arguments. Gradients are in test_ops_nn_grad.c. */
#include "kn_optest.h"
#include <math.h>

static kn_ctx *ref_ctx(void) { kn_ctx_opts o = {kn_backend_ref()}; return kn_ctx_new(&o); }

/* read t as doubles (malloc'd, n elements in *n) */
static double *rd(kn_tensor *t, int64_t *n) {
    if (!t) return NULL;
    int64_t k = kn_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(k ? k : 1));
    if (kn_tensor_read(t, v, KN_F64) != KN_OK) { fprintf(stderr, "  read: %s\n", kn_last_error()); free(v); return NULL; }
    if (n) *n = k;
    return v;
}
/* relative error between two tensors (inf if either fails or sizes differ) */
static double cmp(kn_tensor *a, kn_tensor *b) {
    if (!a || !b) { fprintf(stderr, "  cmp: NULL tensor (%s)\n", kn_last_error()); return INFINITY; }
    int64_t na = 0, nb = 0;
    double *x = rd(a, &na), *y = rd(b, &nb);
    double e = (x && y && na == nb && kn_same_shape(a, b)) ? kn_rel_err(x, y, na) : INFINITY;
    free(x); free(y);
    return e;
}
/* relative error of t against expected values */
static double cmpv(kn_tensor *t, const double *want, int64_t n) {
    int64_t k = 0;
    double *v = rd(t, &k);
    double e = (v && k == n) ? kn_rel_err(v, want, n) : INFINITY;
    free(v);
    return e;
}
static kn_tensor *rnd(kn_ctx *ctx, kn_dtype dt, int nd, const int64_t *s, double lo, double hi) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = kn_test_uniform(lo, hi);
    kn_tensor *t = kn_empty(ctx, dt, nd, s);
    kn_tensor_write(t, v, KN_F64);
    free(v);
    return t;
}
static kn_tensor *fromd(kn_ctx *ctx, kn_dtype dt, int nd, const int64_t *s, const double *v) {
    kn_tensor *t = kn_empty(ctx, dt, nd, s);
    kn_tensor_write(t, v, KN_F64);
    return t;
}

/* ---- softmax ---------------------------------------------------------------------- */
TEST(softmax_values) {
    kn_ctx *ctx = ref_ctx();
    double xv[6] = {1, 2, 3, 1000, 1001, 1002};     /* second row: stability */
    kn_tensor *x = fromd(ctx, KN_F64, 2, (int64_t[]){2, 3}, xv);
    double s = exp(1) + exp(2) + exp(3), want[6];
    for (int i = 0; i < 6; i++) want[i] = exp(xv[i % 3]) / s;
    CHECK(cmpv(kn_softmax(ctx, x, -1), want, 6) < 1e-14, "softmax rows");
    for (int i = 0; i < 6; i++) want[i] = xv[i % 3] - log(s);
    CHECK(cmpv(kn_log_softmax(ctx, x, 1), want, 6) < 1e-14, "log_softmax rows");
    /* along dim 0 of a transposed view: columns of x^T are rows of x */
    kn_tensor *xt = kn_transpose(ctx, x, 0, 1);
    CHECK(cmp(kn_softmax(ctx, xt, 0), kn_transpose(ctx, kn_softmax(ctx, x, 1), 0, 1)) < 1e-14, "softmax of a transposed view");
    /* a row of -inf is NaN (torch); a single -inf entry gets 0 */
    double iv[4] = {-INFINITY, -INFINITY, 0, -INFINITY};
    double out[4];
    kn_tensor *xi = fromd(ctx, KN_F32, 2, (int64_t[]){2, 2}, iv);
    REQUIRE(kn_tensor_read(kn_softmax(ctx, xi, 1), out, KN_F64) == KN_OK, "%s", kn_last_error());
    CHECK(isnan(out[0]) && isnan(out[1]) && out[2] == 1 && out[3] == 0, "inf rows: %g %g %g %g", out[0], out[1], out[2], out[3]);
    REQUIRE(kn_tensor_read(kn_log_softmax(ctx, xi, 1), out, KN_F64) == KN_OK, "%s", kn_last_error());
    CHECK(isnan(out[0]) && out[2] == 0 && out[3] == -INFINITY, "log_softmax inf rows");
    /* f32 matches f64 */
    kn_tensor *x32 = rnd(ctx, KN_F32, 3, (int64_t[]){2, 5, 7}, -4, 4);
    CHECK(cmp(kn_softmax(ctx, x32, 1), kn_softmax(ctx, kn_cast(ctx, x32, KN_F64), 1)) < 1e-6, "f32 vs f64");
    /* empty and size-1 dims */
    kn_tensor *e = kn_zeros(ctx, KN_F32, 2, (int64_t[]){0, 3});
    REQUIRE(kn_realize(kn_softmax(ctx, e, 1)) == KN_OK, "empty: %s", kn_last_error());
    kn_tensor *one = rnd(ctx, KN_F32, 2, (int64_t[]){3, 1}, -1, 1);
    double ones[3] = {1, 1, 1};
    CHECK(cmpv(kn_softmax(ctx, one, 1), ones, 3) == 0, "softmax over a size-1 dim is 1");
    kn_ctx_free(ctx);
}

/* ---- norms ------------------------------------------------------------------------ */
TEST(layer_and_rms_norm_values) {
    kn_ctx *ctx = ref_ctx();
    int64_t s[3] = {2, 3, 4}, ws[2] = {3, 4};
    kn_tensor *x = rnd(ctx, KN_F64, 3, s, -2, 3), *w = rnd(ctx, KN_F64, 2, ws, 0.5, 1.5), *b = rnd(ctx, KN_F64, 2, ws, -1, 1);
    double *xv = rd(x, NULL), *wv = rd(w, NULL), *bv = rd(b, NULL), want[24], want_rms[24], want_ln1[24];
    double eps = 1e-5;
    for (int r = 0; r < 2; r++) {        /* n_norm 2: rows of 12 */
        double m = 0, v = 0, q = 0;
        for (int j = 0; j < 12; j++) m += xv[r * 12 + j];
        m /= 12;
        for (int j = 0; j < 12; j++) { v += (xv[r * 12 + j] - m) * (xv[r * 12 + j] - m); q += xv[r * 12 + j] * xv[r * 12 + j]; }
        for (int j = 0; j < 12; j++) {
            want[r * 12 + j] = (xv[r * 12 + j] - m) / sqrt(v / 12 + eps) * wv[j] + bv[j];
            want_rms[r * 12 + j] = xv[r * 12 + j] / sqrt(q / 12 + eps) * wv[j];
        }
    }
    for (int r = 0; r < 6; r++) {        /* n_norm 1, no affine: rows of 4 */
        double m = 0, v = 0;
        for (int j = 0; j < 4; j++) m += xv[r * 4 + j];
        m /= 4;
        for (int j = 0; j < 4; j++) v += (xv[r * 4 + j] - m) * (xv[r * 4 + j] - m);
        for (int j = 0; j < 4; j++) want_ln1[r * 4 + j] = (xv[r * 4 + j] - m) / sqrt(v / 4 + eps);
    }
    CHECK(cmpv(kn_layer_norm(ctx, x, 2, w, b, eps), want, 24) < 1e-13, "layer_norm n_norm 2 affine");
    CHECK(cmpv(kn_layer_norm(ctx, x, 1, NULL, NULL, eps), want_ln1, 24) < 1e-13, "layer_norm n_norm 1");
    CHECK(cmpv(kn_rms_norm(ctx, x, 2, w, eps), want_rms, 24) < 1e-13, "rms_norm");
    /* non-contiguous input: normalise a transposed view */
    kn_tensor *xt = kn_transpose(ctx, kn_contiguous(ctx, kn_transpose(ctx, x, 1, 2)), 1, 2);
    CHECK(cmp(kn_layer_norm(ctx, xt, 2, w, b, eps), kn_layer_norm(ctx, x, 2, w, b, eps)) < 1e-14, "strided input");
    kn_tensor *x32 = kn_cast(ctx, x, KN_F32);
    CHECK(cmpv(kn_rms_norm(ctx, x32, 2, kn_cast(ctx, w, KN_F32), eps), want_rms, 24) < 1e-6, "rms f32");
    free(xv); free(wv); free(bv);
    kn_ctx_free(ctx);
}

TEST(group_and_batch_norm_values) {
    kn_ctx *ctx = ref_ctx();
    int64_t s[4] = {2, 4, 3, 2};     /* N C H W */
    kn_tensor *x = rnd(ctx, KN_F64, 4, s, -2, 2), *w = rnd(ctx, KN_F64, 1, (int64_t[]){4}, 0.5, 2), *b = rnd(ctx, KN_F64, 1, (int64_t[]){4}, -1, 1);
    double *xv = rd(x, NULL), *wv = rd(w, NULL), *bv = rd(b, NULL), gn[48], bn[48], ev[48];
    double eps = 1e-5;
    for (int n = 0; n < 2; n++)
        for (int gi = 0; gi < 2; gi++) {     /* 2 groups of 2 channels x 6 */
            double m = 0, v = 0;
            int base = n * 24 + gi * 12;
            for (int j = 0; j < 12; j++) m += xv[base + j];
            m /= 12;
            for (int j = 0; j < 12; j++) v += (xv[base + j] - m) * (xv[base + j] - m);
            for (int j = 0; j < 12; j++) {
                int c = gi * 2 + j / 6;
                gn[base + j] = (xv[base + j] - m) / sqrt(v / 12 + eps) * wv[c] + bv[c];
            }
        }
    double rm[4] = {0.1, -0.2, 0.3, 0}, rv[4] = {1, 2, 0.5, 4};
    for (int c = 0; c < 4; c++) {
        double m = 0, v = 0;
        for (int n = 0; n < 2; n++) for (int j = 0; j < 6; j++) m += xv[n * 24 + c * 6 + j];
        m /= 12;
        for (int n = 0; n < 2; n++) for (int j = 0; j < 6; j++) v += pow(xv[n * 24 + c * 6 + j] - m, 2);
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 6; j++) {
                int i = n * 24 + c * 6 + j;
                bn[i] = (xv[i] - m) / sqrt(v / 12 + eps) * wv[c] + bv[c];
                ev[i] = (xv[i] - rm[c]) / sqrt(rv[c] + eps) * wv[c] + bv[c];
            }
    }
    CHECK(cmpv(kn_group_norm(ctx, x, 2, w, b, eps), gn, 48) < 1e-13, "group_norm");
    CHECK(cmpv(kn_batch_norm(ctx, x, NULL, NULL, w, b, true, eps), bn, 48) < 1e-13, "batch_norm training");
    kn_tensor *trm = fromd(ctx, KN_F64, 1, (int64_t[]){4}, rm), *trv = fromd(ctx, KN_F64, 1, (int64_t[]){4}, rv);
    CHECK(cmpv(kn_batch_norm(ctx, x, trm, trv, w, b, false, eps), ev, 48) < 1e-13, "batch_norm eval");
    /* group norm with 1 group == layer norm over C,H,W without affine; C groups == instance norm */
    CHECK(cmp(kn_group_norm(ctx, x, 1, NULL, NULL, eps), kn_layer_norm(ctx, x, 3, NULL, NULL, eps)) < 1e-13, "groups=1");
    int64_t s5[3] = {8, 3, 2};
    CHECK(cmp(kn_reshape(ctx, kn_group_norm(ctx, x, 4, NULL, NULL, eps), 3, s5),
              kn_layer_norm(ctx, kn_reshape(ctx, x, 3, s5), 2, NULL, NULL, eps)) < 1e-13, "groups=C");
    /* 2-d batch norm [N,C] */
    kn_tensor *x2 = rnd(ctx, KN_F32, 2, (int64_t[]){5, 3}, -1, 1);
    CHECK(cmp(kn_batch_norm(ctx, x2, NULL, NULL, NULL, NULL, true, eps),
              kn_transpose(ctx, kn_layer_norm(ctx, kn_transpose(ctx, x2, 0, 1), 1, NULL, NULL, eps), 0, 1)) < 1e-6, "batch_norm [N,C]");
    free(xv); free(wv); free(bv);
    kn_ctx_free(ctx);
}

/* ---- dropout, embedding --------------------------------------------------------------- */
TEST(dropout_and_embedding) {
    kn_ctx *ctx = ref_ctx();
    int64_t s[1] = {20000};
    kn_tensor *x = kn_full(ctx, KN_F32, 1, s, 3.0);
    CHECK(kn_dropout(ctx, x, 0.0, true, 1) == x && kn_dropout(ctx, x, 0.7, false, 1) == x, "p=0 / eval are identity");
    double *z = rd(kn_dropout(ctx, x, 1.0, true, 1), NULL);
    REQUIRE(z, "p=1");
    bool allz = true;
    for (int i = 0; i < 20000; i++) allz &= z[i] == 0;
    CHECK(allz, "p=1 gives zeros");
    free(z);
    double *d = rd(kn_dropout(ctx, x, 0.25, true, 7), NULL);
    REQUIRE(d, "dropout");
    int kept = 0; bool vals = true;
    for (int i = 0; i < 20000; i++) { if (d[i] != 0) kept++; vals &= d[i] == 0 || fabs(d[i] - 4.0) < 1e-6; }
    CHECK(vals, "kept values scaled by 1/(1-p)");
    CHECK(fabs(kept / 20000.0 - 0.75) < 0.02, "keep rate %g", kept / 20000.0);
    double *d2 = rd(kn_dropout(ctx, x, 0.25, true, 7), NULL);
    CHECK(d2 && memcmp(d, d2, sizeof(double) * 20000) == 0, "same seed, same mask");
    free(d); free(d2);
    CHECK(kn_dropout(ctx, x, 1.5, true, 1) == NULL && strstr(kn_last_error(), "dropout"), "%s", kn_last_error());
    /* embedding */
    kn_tensor *wt = kn_reshape(ctx, kn_arange(ctx, KN_F32, 0, 15, 1), 2, (int64_t[]){5, 3});
    int32_t ids[4] = {4, 0, 2, 4};
    kn_tensor *it = kn_from_data(ctx, KN_I32, 2, (int64_t[]){2, 2}, ids);
    kn_tensor *em = kn_embedding(ctx, wt, it);
    REQUIRE(em && em->ndim == 3 && em->shape[0] == 2 && em->shape[1] == 2 && em->shape[2] == 3, "embedding shape");
    double want[12];
    for (int i = 0; i < 4; i++) for (int c = 0; c < 3; c++) want[i * 3 + c] = ids[i] * 3 + c;
    CHECK(cmpv(em, want, 12) == 0, "embedding rows");
    kn_tensor *f = kn_from_data(ctx, KN_F32, 1, (int64_t[]){1}, (float[]){1});
    CHECK(kn_embedding(ctx, wt, f) == NULL && strstr(kn_last_error(), "embedding"), "%s", kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- convolution ------------------------------------------------------------------ */
static const int I1[2] = {1, 1}, I0[2] = {0, 0};

TEST(conv2d_hand_values) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 9, 1), 4, (int64_t[]){1, 1, 3, 3});
    kn_tensor *w = kn_ones(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2});
    kn_tensor *b = kn_full(ctx, KN_F64, 1, (int64_t[]){1}, 1.0);
    double want[4] = {9, 13, 21, 25};
    CHECK(cmpv(kn_conv2d(ctx, x, w, b, I1, I0, I1, 1), want, 4) == 0, "2x2 ones + bias");
    /* padding 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1) */
    double want2[4] = {0, 1 + 2, 3 + 6, 4 + 5 + 7 + 8};
    CHECK(cmpv(kn_conv2d(ctx, x, w, NULL, (int[]){2, 2}, I1, I1, 1), want2, 4) == 0, "pad 1 stride 2");
    /* dilation 2 with a 2x2 kernel touches the corners: 0+2+6+8 */
    double want3[1] = {16};
    CHECK(cmpv(kn_conv2d(ctx, x, w, NULL, I1, I0, (int[]){2, 2}, 1), want3, 1) == 0, "dilation 2");
    /* conv1d: [0..4] * [1,0,-1], padding 1 -> x[i-1] - x[i+1] */
    kn_tensor *x1 = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 5, 1), 3, (int64_t[]){1, 1, 5});
    kn_tensor *w1 = kn_from_data(ctx, KN_F64, 3, (int64_t[]){1, 1, 3}, (double[]){1, 0, -1});
    double want4[5] = {-1, -2, -2, -2, 3};
    kn_tensor *y1 = kn_conv1d(ctx, x1, w1, NULL, 1, 1, 1, 1);
    REQUIRE(y1 && y1->ndim == 3 && y1->shape[2] == 5, "conv1d shape");
    CHECK(cmpv(y1, want4, 5) == 0, "conv1d");
    double want5[2] = {-2, -2};
    CHECK(cmpv(kn_conv1d(ctx, x1, w1, NULL, 2, 0, 1, 1), want5, 2) == 0, "conv1d stride 2");
    /* conv_transpose2d stride 2 with a 2x2 ones kernel replicates each pixel */
    kn_tensor *xs = kn_from_data(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, (double[]){1, 2, 3, 4});
    double want6[16] = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
    kn_tensor *yt = kn_conv_transpose2d(ctx, xs, w, NULL, (int[]){2, 2}, I0, I0, I1, 1);
    REQUIRE(yt && yt->shape[2] == 4 && yt->shape[3] == 4, "conv_transpose2d shape");
    CHECK(cmpv(yt, want6, 16) == 0, "conv_transpose2d replicate");
    kn_ctx_free(ctx);
}

TEST(conv2d_identities) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(11);
    /* 1x1 conv == matmul over channels */
    kn_tensor *x = rnd(ctx, KN_F64, 4, (int64_t[]){2, 3, 4, 5}, -1, 1);
    kn_tensor *w = rnd(ctx, KN_F64, 4, (int64_t[]){6, 3, 1, 1}, -1, 1);
    kn_tensor *mm = kn_matmul(ctx, kn_reshape(ctx, w, 2, (int64_t[]){6, 3}), kn_reshape(ctx, x, 3, (int64_t[]){2, 3, 20}));
    CHECK(cmp(kn_conv2d(ctx, x, w, NULL, I1, I0, I1, 1), kn_reshape(ctx, mm, 4, (int64_t[]){2, 6, 4, 5})) < 1e-14, "1x1 == matmul");
    /* stride s == stride 1 subsampled; padding == explicit zero pad */
    kn_tensor *w3 = rnd(ctx, KN_F64, 4, (int64_t[]){4, 3, 3, 2}, -1, 1);
    kn_tensor *full = kn_conv2d(ctx, x, w3, NULL, I1, (int[]){1, 2}, I1, 1);
    kn_tensor *sub = kn_slice(ctx, kn_slice(ctx, full, 2, 0, full->shape[2], 2), 3, 0, full->shape[3], 3);
    CHECK(cmp(kn_conv2d(ctx, x, w3, NULL, (int[]){2, 3}, (int[]){1, 2}, I1, 1), sub) < 1e-14, "stride == subsample");
    kn_tensor *xp = kn_pad(ctx, x, 2, (int64_t[]){2, 2, 1, 1}, KN_PAD_CONSTANT, 0);
    CHECK(cmp(kn_conv2d(ctx, xp, w3, NULL, I1, I0, I1, 1), full) < 1e-14, "padding == zero pad");
    /* dilation == a kernel with zeros inserted */
    double *wv = rd(w3, NULL), wd[4 * 3 * 5 * 3];
    memset(wd, 0, sizeof wd);
    for (int o = 0; o < 4; o++) for (int c = 0; c < 3; c++) for (int i = 0; i < 3; i++) for (int j = 0; j < 2; j++)
        wd[((o * 3 + c) * 5 + 2 * i) * 3 + 2 * j] = wv[((o * 3 + c) * 3 + i) * 2 + j];
    free(wv);
    kn_tensor *wdt = fromd(ctx, KN_F64, 4, (int64_t[]){4, 3, 5, 3}, wd);
    CHECK(cmp(kn_conv2d(ctx, x, w3, NULL, I1, I1, (int[]){2, 2}, 1), kn_conv2d(ctx, x, wdt, NULL, I1, I1, I1, 1)) < 1e-14, "dilation");
    /* groups == separate convs on channel slices */
    kn_tensor *xg = rnd(ctx, KN_F64, 4, (int64_t[]){2, 4, 5, 5}, -1, 1), *wg = rnd(ctx, KN_F64, 4, (int64_t[]){6, 2, 3, 3}, -1, 1);
    kn_tensor *bg = rnd(ctx, KN_F64, 1, (int64_t[]){6}, -1, 1);
    kn_tensor *yg = kn_conv2d(ctx, xg, wg, bg, (int[]){2, 1}, I1, I1, 2);
    for (int gi = 0; gi < 2; gi++) {
        kn_tensor *part = kn_conv2d(ctx, kn_narrow(ctx, xg, 1, 2 * gi, 2), kn_narrow(ctx, wg, 0, 3 * gi, 3), kn_narrow(ctx, bg, 0, 3 * gi, 3),
                                    (int[]){2, 1}, I1, I1, 1);
        CHECK(cmp(kn_narrow(ctx, yg, 1, 3 * gi, 3), part) < 1e-14, "groups: group %d", gi);
    }
    /* f32 and a transposed (non-contiguous) input agree with f64 */
    kn_tensor *xt = kn_transpose(ctx, kn_contiguous(ctx, kn_transpose(ctx, xg, 2, 3)), 2, 3);
    CHECK(cmp(kn_conv2d(ctx, kn_cast(ctx, xt, KN_F32), kn_cast(ctx, wg, KN_F32), NULL, (int[]){2, 1}, I1, I1, 2),
              kn_conv2d(ctx, xg, wg, NULL, (int[]){2, 1}, I1, I1, 2)) < 1e-6, "f32 strided");
    kn_ctx_free(ctx);
}

/* <conv2d(x, w), y> == <x, conv_transpose2d(y, w)> for matching parameters */
TEST(conv_transpose2d_is_the_adjoint) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(12);
    struct { int64_t H, W, C, O, KH, KW; int s[2], p[2], d[2], g; } cs[] = {
        {5, 6, 2, 3, 2, 3, {1, 1}, {0, 0}, {1, 1}, 1},
        {7, 6, 4, 6, 3, 3, {2, 2}, {1, 1}, {1, 1}, 2},
        {8, 7, 3, 3, 2, 3, {2, 3}, {1, 0}, {2, 1}, 3},
        {6, 6, 2, 4, 3, 2, {3, 2}, {1, 1}, {1, 2}, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kn_tensor *x = rnd(ctx, KN_F64, 4, (int64_t[]){2, cs[i].C, cs[i].H, cs[i].W}, -1, 1);
        kn_tensor *w = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].O, cs[i].C / cs[i].g, cs[i].KH, cs[i].KW}, -1, 1);
        kn_tensor *y = kn_conv2d(ctx, x, w, NULL, cs[i].s, cs[i].p, cs[i].d, cs[i].g);
        REQUIRE(y, "conv2d case %zu: %s", i, kn_last_error());
        int op[2];
        for (int k = 0; k < 2; k++)
            op[k] = (int)(x->shape[2 + k] + 2 * cs[i].p[k] - cs[i].d[k] * (w->shape[2 + k] - 1) - 1 - (y->shape[2 + k] - 1) * cs[i].s[k]);
        kn_tensor *r = rnd(ctx, KN_F64, 4, y->shape, -1, 1);
        kn_tensor *xt = kn_conv_transpose2d(ctx, r, w, NULL, cs[i].s, cs[i].p, op, cs[i].d, cs[i].g);
        REQUIRE(xt && kn_same_shape(xt, x), "conv_transpose2d case %zu restores the input shape: %s", i, kn_last_error());
        double a = kn_item(kn_sum_all(ctx, kn_mul(ctx, y, r))), b = kn_item(kn_sum_all(ctx, kn_mul(ctx, x, xt)));
        CHECK(fabs(a - b) < 1e-12 * (1 + fabs(a)), "case %zu: <conv x, y> %.15g vs <x, convT y> %.15g", i, a, b);
    }
    /* bias is added per output channel */
    kn_tensor *x = rnd(ctx, KN_F64, 4, (int64_t[]){1, 2, 3, 3}, -1, 1), *w = rnd(ctx, KN_F64, 4, (int64_t[]){2, 3, 2, 2}, -1, 1);
    kn_tensor *b = kn_from_data(ctx, KN_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    kn_tensor *d = kn_sub(ctx, kn_conv_transpose2d(ctx, x, w, b, (int[]){2, 2}, I0, (int[]){1, 1}, I1, 1),
                          kn_conv_transpose2d(ctx, x, w, NULL, (int[]){2, 2}, I0, (int[]){1, 1}, I1, 1));
    REQUIRE(d && d->shape[1] == 3 && d->shape[2] == 7, "convT shape with output_padding: %s", kn_last_error());
    double *dv = rd(d, NULL);
    bool ok = dv != NULL;
    for (int c = 0; ok && c < 3; c++) for (int i = 0; i < 49; i++) ok &= fabs(dv[c * 49 + i] - (c + 1)) < 1e-12;
    CHECK(ok, "bias");
    free(dv);
    kn_ctx_free(ctx);
}

/* ---- pooling ------------------------------------------------------------------------ */
TEST(pool_values) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 16, 1), 4, (int64_t[]){1, 1, 4, 4});
    double w1[4] = {5, 7, 13, 15};
    CHECK(cmpv(kn_max_pool2d(ctx, x, (int[]){2, 2}, NULL, I0, I1, false), w1, 4) == 0, "max 2x2");
    /* kernel 3, stride 2, padding 1: windows rows {-1..1},{1..3} */
    double w2[4] = {5, 7, 13, 15};
    CHECK(cmpv(kn_max_pool2d(ctx, x, (int[]){3, 3}, (int[]){2, 2}, I1, I1, false), w2, 4) == 0, "max pad 1");
    /* dilation 2, kernel 2, stride 1: max of (i,j),(i+2,j),(i,j+2),(i+2,j+2) = x[i+2][j+2] */
    double w3[4] = {10, 11, 14, 15};
    CHECK(cmpv(kn_max_pool2d(ctx, x, (int[]){2, 2}, I1, I0, (int[]){2, 2}, false), w3, 4) == 0, "max dilation");
    /* ceil_mode on 5x5: 3x3 output, last window partial */
    kn_tensor *x5 = kn_reshape(ctx, kn_arange(ctx, KN_F64, 0, 25, 1), 4, (int64_t[]){1, 1, 5, 5});
    kn_tensor *mc = kn_max_pool2d(ctx, x5, (int[]){2, 2}, NULL, I0, I1, true);
    double w4[9] = {6, 8, 9, 16, 18, 19, 21, 23, 24};
    REQUIRE(mc && mc->shape[2] == 3, "ceil shape");
    CHECK(cmpv(mc, w4, 9) == 0, "max ceil_mode");
    kn_tensor *mf = kn_max_pool2d(ctx, x5, (int[]){2, 2}, NULL, I0, I1, false);
    CHECK(mf && mf->shape[2] == 2, "floor mode shape");
    /* NaN propagates */
    kn_tensor *xn = kn_from_data(ctx, KN_F64, 3, (int64_t[]){1, 2, 2}, (double[]){1, NAN, 3, 2});
    CHECK(isnan(kn_item(kn_max_pool2d(ctx, xn, (int[]){2, 2}, NULL, I0, I1, false))), "NaN wins");
    /* avg: 3x3 ones, kernel 3, padding 1 */
    kn_tensor *o = kn_ones(ctx, KN_F64, 4, (int64_t[]){1, 1, 3, 3});
    double inc[9] = {4 / 9., 6 / 9., 4 / 9., 6 / 9., 1, 6 / 9., 4 / 9., 6 / 9., 4 / 9.}, exc[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(cmpv(kn_avg_pool2d(ctx, o, (int[]){3, 3}, I1, I1, false, true), inc, 9) < 1e-15, "avg count_include_pad");
    CHECK(cmpv(kn_avg_pool2d(ctx, o, (int[]){3, 3}, I1, I1, false, false), exc, 9) < 1e-15, "avg exclude pad");
    /* avg ceil_mode 5x5 kernel 2: the last partial windows divide by their in-bounds size */
    double w5[9] = {3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24};
    CHECK(cmpv(kn_avg_pool2d(ctx, x5, (int[]){2, 2}, NULL, I0, true, true), w5, 9) < 1e-15, "avg ceil_mode");
    /* ceil_mode + padding + count_include_pad: the divisor counts padding but not past it */
    kn_tensor *o4 = kn_ones(ctx, KN_F64, 4, (int64_t[]){1, 1, 4, 4});
    kn_tensor *ac = kn_avg_pool2d(ctx, o4, (int[]){3, 3}, (int[]){2, 2}, I1, true, true);
    /* rows: windows [-1,2) [1,4) [3,5) hold 2, 3, 1 input rows out of 3, 3, 2 */
    double w6[9] = {4 / 9., 6 / 9., 2 / 6., 6 / 9., 1, 3 / 6., 2 / 6., 3 / 6., 1 / 4.};
    REQUIRE(ac && ac->shape[2] == 3 && ac->shape[3] == 3, "avg ceil pad shape %lld", ac ? (long long)ac->shape[2] : -1LL);
    CHECK(cmpv(ac, w6, 9) < 1e-15, "avg ceil + pad divisor");
    /* adaptive: 5 -> 3 uses [0,2), [1,4), [3,5) */
    kn_tensor *ad = kn_adaptive_avg_pool2d(ctx, x5, 3, 3);
    double rows[3][2] = {{0, 2}, {1, 4}, {3, 5}}, w7[9];
    for (int i = 0; i < 3; i++) for (int j = 0; j < 3; j++) {
        double s = 0; int n = 0;
        for (int r = (int)rows[i][0]; r < rows[i][1]; r++) for (int c = (int)rows[j][0]; c < rows[j][1]; c++) { s += r * 5 + c; n++; }
        w7[i * 3 + j] = s / n;
    }
    CHECK(cmpv(ad, w7, 9) < 1e-15, "adaptive 5->3");
    kn_tensor *g1 = kn_adaptive_avg_pool2d(ctx, x5, 1, 1);
    CHECK(fabs(kn_item(g1) - 12) < 1e-15, "global average");
    double big[16];
    for (int i = 0; i < 16; i++) big[i] = (double)i;
    CHECK(cmpv(kn_adaptive_avg_pool2d(ctx, x, 4, 4), big, 16) == 0, "adaptive identity");
    kn_ctx_free(ctx);
}

/* ---- attention ------------------------------------------------------------------------ */
/* softmax(q k^T * scale + mask) v with k/v heads repeated, from lazy ops */
/* window W > 0 also masks keys j <= i + (Tk - Tq) - W; softcap c: c tanh(s / c) */
static kn_tensor *sdpa_composite_ex(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale,
                                    int64_t window, double softcap);
static kn_tensor *sdpa_composite(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale) {
    return sdpa_composite_ex(ctx, q, k, v, causal, scale, 0, 0);
}
static kn_tensor *sdpa_composite_ex(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale,
                                    int64_t window, double softcap) {
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], Hkv = k->shape[1], Tk = k->shape[2], G = Hq / Hkv;
    kn_tensor *kv[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        int64_t D = kv[i]->shape[3];
        kn_tensor *e = kn_expand(ctx, kn_reshape(ctx, kv[i], 5, (int64_t[]){B, Hkv, 1, Tk, D}), 5, (int64_t[]){B, Hkv, G, Tk, D});
        kv[i] = kn_reshape(ctx, e, 4, (int64_t[]){B, Hq, Tk, D});
    }
    kn_tensor *s = kn_mul_scalar(ctx, kn_matmul(ctx, q, kn_transpose(ctx, kv[0], -1, -2)), scale);
    if (softcap > 0) s = kn_mul_scalar(ctx, kn_tanh(ctx, kn_mul_scalar(ctx, s, 1 / softcap)), softcap);
    if (causal) {
        double *m = malloc(sizeof(double) * (size_t)(Tq * Tk));
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t j = 0; j < Tk; j++) m[i * Tk + j] = j > i + (Tk - Tq) || (window > 0 && j <= i + (Tk - Tq) - window);
        s = kn_masked_fill(ctx, s, kn_cast(ctx, fromd(ctx, KN_F64, 2, (int64_t[]){Tq, Tk}, m), KN_BOOL), -INFINITY);
        free(m);
    }
    return kn_matmul(ctx, kn_softmax(ctx, s, -1), kv[1]);
}

TEST(sdpa_values) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(13);
    /* one query, two keys: hand value */
    kn_tensor *q = kn_from_data(ctx, KN_F64, 4, (int64_t[]){1, 1, 1, 2}, (double[]){1, 0});
    kn_tensor *k = kn_from_data(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, (double[]){2, 0, 0, 0});
    kn_tensor *v = kn_from_data(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 1}, (double[]){1, 3});
    double p0 = 1 / (1 + exp(-1.0));                    /* scores 1, 0 with scale 0.5 */
    double want = p0 * 1 + (1 - p0) * 3;
    CHECK(fabs(kn_item(kn_sdpa(ctx, q, k, v, false, 0.5)) - want) < 1e-15, "hand value");
    double p1 = 1 / (1 + exp(-2 / sqrt(2.0)));          /* default scale 1/sqrt(2) */
    CHECK(fabs(kn_item(kn_sdpa(ctx, q, k, v, false, 0)) - (p1 + 3 * (1 - p1))) < 1e-15, "default scale");
    struct { int64_t B, Hq, Hkv, Tq, Tk, D, Dv; bool causal; } cs[] = {
        {2, 2, 2, 3, 3, 4, 4, false}, {1, 4, 2, 5, 5, 3, 3, true}, {2, 6, 2, 2, 5, 4, 3, true},
        {1, 3, 1, 4, 4, 2, 2, true}, {1, 2, 1, 1, 6, 8, 8, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kn_tensor *qq = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, -1, 1);
        kn_tensor *kk = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D}, -1, 1);
        kn_tensor *vv = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv}, -1, 1);
        double sc = 1 / sqrt((double)cs[i].D);
        CHECK(cmp(kn_sdpa(ctx, qq, kk, vv, cs[i].causal, 0), sdpa_composite(ctx, qq, kk, vv, cs[i].causal, sc)) < 1e-13,
              "case %zu (GQA %lld/%lld, causal %d)", i, (long long)cs[i].Hq, (long long)cs[i].Hkv, cs[i].causal);
        /* f32 with a transposed k */
        kn_tensor *kt = kn_transpose(ctx, kn_contiguous(ctx, kn_transpose(ctx, kk, 2, 3)), 2, 3);
        CHECK(cmp(kn_sdpa(ctx, kn_cast(ctx, qq, KN_F32), kn_cast(ctx, kt, KN_F32), kn_cast(ctx, vv, KN_F32), cs[i].causal, 0),
                  sdpa_composite(ctx, qq, kk, vv, cs[i].causal, sc)) < 1e-6, "case %zu f32", i);
    }
    /* causal with Tq > Tk: query rows with no visible key are NaN */
    kn_tensor *qa = rnd(ctx, KN_F64, 4, (int64_t[]){1, 1, 3, 2}, -1, 1), *ka = rnd(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, -1, 1);
    double *o = rd(kn_sdpa(ctx, qa, ka, ka, true, 0), NULL);
    REQUIRE(o, "Tq > Tk");
    CHECK(isnan(o[0]) && !isnan(o[2]) && !isnan(o[4]), "fully masked row is NaN");
    free(o);
    kn_ctx_free(ctx);
}

/* the fused SDPA_BWD node against the chain rule through the composite (f64) */
TEST(sdpa_backward_vs_composite) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(31);
    struct { int64_t B, Hq, Hkv, Tq, Tk, D, Dv; bool causal; } cs[] = {
        {2, 2, 2, 3, 3, 4, 4, false}, {1, 4, 2, 5, 5, 3, 3, true}, {2, 6, 2, 2, 5, 4, 3, true}, {1, 3, 1, 6, 4, 2, 5, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kn_tensor *in[3] = {rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, -1, 1),
                            rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D}, -1, 1),
                            rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv}, -1, 1)};
        for (int j = 0; j < 3; j++) kn_set_requires_grad(in[j], true);
        kn_tensor *dy = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].Dv}, -1, 1);
        kn_tensor *y1 = kn_sdpa(ctx, in[0], in[1], in[2], cs[i].causal, 0);
        kn_tensor *y2 = sdpa_composite(ctx, in[0], in[1], in[2], cs[i].causal, 1 / sqrt((double)cs[i].D));
        kn_tensor *g1[3] = {0}, *g2[3] = {0};
        REQUIRE(kn_gradients(ctx, 1, &y1, &dy, 3, in, g1) == KN_OK && kn_gradients(ctx, 1, &y2, &dy, 3, in, g2) == KN_OK,
                "%s", kn_last_error());
        CHECK(g1[0] && g1[0]->view_src && g1[0]->view_src->op == KN_OP_SDPA_BWD, "case %zu: one SDPA_BWD node", i);
        for (int j = 0; j < 3; j++) CHECK(cmp(g1[j], g2[j]) < 1e-13, "case %zu grad %d", i, j);
    }
    kn_ctx_free(ctx);
}

/* sliding window and soft-capping (kn_sdpa_ex) against the composite, values
 * and gradients (f64), plus the argument checks */
TEST(sdpa_window_softcap) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(32);
    struct { int64_t B, Hq, Hkv, Tq, Tk, D, Dv, W; double cap; } cs[] = {
        {1, 2, 1, 7, 7, 4, 4, 3, 0},     /* prefill, window 3 */
        {2, 4, 2, 3, 9, 5, 3, 4, 0},     /* rows after a cache (offset 6), GQA */
        {1, 2, 2, 5, 5, 4, 4, 0, 0.7},   /* softcap only (scores reach the cap) */
        {1, 3, 1, 6, 8, 3, 5, 2, 1.5},   /* both, multi-query, Dv != D */
        {1, 1, 1, 4, 4, 2, 2, 1, 0},     /* window 1: each row sees itself */
        {1, 2, 1, 4, 4, 3, 3, 50, 0},    /* window longer than the keys: plain causal */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kn_tensor *in[3] = {rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].D}, -2, 2),
                            rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].D}, -2, 2),
                            rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hkv, cs[i].Tk, cs[i].Dv}, -1, 1)};
        for (int j = 0; j < 3; j++) kn_set_requires_grad(in[j], true);
        kn_tensor *dy = rnd(ctx, KN_F64, 4, (int64_t[]){cs[i].B, cs[i].Hq, cs[i].Tq, cs[i].Dv}, -1, 1);
        kn_tensor *y1 = kn_sdpa_ex(ctx, in[0], in[1], in[2], true, 0, cs[i].W, cs[i].cap);
        kn_tensor *y2 = sdpa_composite_ex(ctx, in[0], in[1], in[2], true, 1 / sqrt((double)cs[i].D), cs[i].W, cs[i].cap);
        CHECK(cmp(y1, y2) < 1e-13, "case %zu values", i);
        if (cs[i].W) CHECK(cmp(y1, sdpa_composite(ctx, in[0], in[1], in[2], true, 1 / sqrt((double)cs[i].D))) > (cs[i].W < cs[i].Tk ? 1e-3 : -1),
                           "case %zu: the window changes the result (when shorter than the keys)", i);
        kn_tensor *g1[3] = {0}, *g2[3] = {0};
        REQUIRE(kn_gradients(ctx, 1, &y1, &dy, 3, in, g1) == KN_OK && kn_gradients(ctx, 1, &y2, &dy, 3, in, g2) == KN_OK,
                "%s", kn_last_error());
        for (int j = 0; j < 3; j++) CHECK(cmp(g1[j], g2[j]) < 1e-12, "case %zu grad %d", i, j);
    }
    kn_tensor *q = rnd(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, -1, 1);
    CHECK(!kn_sdpa_ex(ctx, q, q, q, false, 0, 2, 0) && strstr(kn_last_error(), "causal"), "a window needs causal");
    kn_ctx_free(ctx);
    ctx = ref_ctx();
    q = rnd(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, -1, 1);
    CHECK(!kn_sdpa_ex(ctx, q, q, q, true, 0, -1, 0) && strstr(kn_last_error(), "window"), "negative window");
    kn_ctx_free(ctx);
    ctx = ref_ctx();
    q = rnd(ctx, KN_F64, 4, (int64_t[]){1, 1, 2, 2}, -1, 1);
    CHECK(!kn_sdpa_ex(ctx, q, q, q, true, 0, 0, -3) && strstr(kn_last_error(), "softcap"), "negative softcap");
    kn_ctx_free(ctx);
}

/* ---- rope ------------------------------------------------------------------------------ */
TEST(rope_values) {
    kn_ctx *ctx = ref_ctx();
    kn_test_seed(14);
    int64_t T = 3, D = 6;
    int32_t pos[3] = {0, 5, 17};
    kn_tensor *x = rnd(ctx, KN_F64, 3, (int64_t[]){2, T, D}, -1, 1);
    kn_tensor *p = kn_from_data(ctx, KN_I32, 1, &T, pos);
    double *xv = rd(x, NULL);
    for (int neox = 0; neox < 2; neox++)
        for (int n_rot = 2; n_rot <= 6; n_rot += 4) {
            double want[36], theta = 10000, fs = 0.5;
            for (int r = 0; r < 2; r++) for (int t = 0; t < T; t++) {
                const double *a = xv + (r * T + t) * D;
                double *o = want + (r * T + t) * D;
                for (int j = 0; j < D; j++) o[j] = a[j];
                for (int i = 0; i < n_rot / 2; i++) {
                    double ang = pos[t] * fs / pow(theta, 2.0 * i / n_rot);
                    int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
                    o[i0] = a[i0] * cos(ang) - a[i1] * sin(ang);
                    o[i1] = a[i0] * sin(ang) + a[i1] * cos(ang);
                }
            }
            kn_tensor *y = kn_rope(ctx, x, p, n_rot, theta, neox, fs);
            CHECK(cmpv(y, want, 36) < 1e-14, "rope neox %d n_rot %d", neox, n_rot);
            CHECK(cmp(kn_rope(ctx, y, p, n_rot, theta, neox, -fs), x) < 1e-14, "negated freq_scale inverts");
        }
    /* llama2.c: pairs (i, i+1), freq = 1 / 10000^(i % hs / hs), hs = 4, two heads */
    kn_tensor *x8 = rnd(ctx, KN_F32, 3, (int64_t[]){2, 1, 4}, -1, 1);     /* [heads, T=1, hs] */
    int32_t p7 = 7;
    kn_tensor *y8 = kn_rope(ctx, x8, kn_from_data(ctx, KN_I32, 1, (int64_t[]){1}, &p7), 4, 10000, false, 1);
    float xf[8], yf[8];
    REQUIRE(kn_tensor_read(x8, xf, KN_F32) == KN_OK && kn_tensor_read(y8, yf, KN_F32) == KN_OK, "%s", kn_last_error());
    double err = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i += 2) {
            float freq = 1.0f / powf(10000.0f, (float)i / 4.0f), val = 7 * freq, c = cosf(val), s = sinf(val);
            float v0 = xf[h * 4 + i], v1 = xf[h * 4 + i + 1];
            err = fmax(err, fabs(yf[h * 4 + i] - (v0 * c - v1 * s)));
            err = fmax(err, fabs(yf[h * 4 + i + 1] - (v0 * s + v1 * c)));
        }
    CHECK(err < 1e-5, "llama2.c rotation, max err %g", err);
    /* i64 positions and a strided x */
    int64_t pos64[3] = {0, 5, 17};
    kn_tensor *xt = kn_transpose(ctx, kn_contiguous(ctx, kn_transpose(ctx, x, 1, 2)), 1, 2);
    CHECK(cmp(kn_rope(ctx, xt, kn_from_data(ctx, KN_I64, 1, &T, pos64), 4, 500, true, 1), kn_rope(ctx, x, p, 4, 500, true, 1)) < 1e-15, "i64 pos, strided x");
    free(xv);
    kn_ctx_free(ctx);
}

/* ---- reference vs fast CPU backend ------------------------------------------------------ */
typedef struct { int kind; } bk;
static kn_tensor *b_nn(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int k = ((bk *)ud)->kind;
    switch (k) {
    case 0: return kn_softmax(ctx, in[0], 1);
    case 1: return kn_log_softmax(ctx, in[0], -1);
    case 2: return kn_layer_norm(ctx, in[0], 1, in[1], in[2], 1e-5);
    case 3: return kn_rms_norm(ctx, in[0], 1, in[1], 1e-6);
    case 4: return kn_group_norm(ctx, in[0], 2, NULL, NULL, 1e-5);
    case 5: return kn_batch_norm(ctx, in[0], NULL, NULL, NULL, NULL, true, 1e-5);
    case 6: return kn_conv2d(ctx, in[0], in[1], NULL, (int[]){2, 1}, (int[]){1, 1}, (int[]){1, 2}, 2);
    case 7: return kn_conv_transpose2d(ctx, in[0], in[1], NULL, (int[]){2, 2}, (int[]){1, 0}, (int[]){1, 0}, (int[]){1, 1}, 2);
    case 8: return kn_max_pool2d(ctx, in[0], (int[]){3, 2}, (int[]){2, 2}, (int[]){1, 1}, (int[]){1, 1}, true);
    case 9: return kn_avg_pool2d(ctx, in[0], (int[]){3, 3}, (int[]){2, 2}, (int[]){1, 1}, true, false);
    case 10: return kn_adaptive_avg_pool2d(ctx, in[0], 3, 2);
    case 11: return kn_sdpa(ctx, in[0], in[1], in[2], true, 0);
    default: return kn_rope(ctx, in[0], kn_cast(ctx, in[1], KN_I32), 4, 10000, k == 13, 1);
    }
}

TEST(reference_vs_cpu_backend) {
    kn_test_seed(15);
    struct { int nin; kn_opin in[3]; } cs[] = {
        {1, {{3, {2, 5, 3}, -3, 3, 0, false, false}}},
        {1, {{2, {4, 7}, -3, 3, KN_F64, true, false}}},
        {3, {{3, {2, 3, 6}, -2, 2, 0, false, false}, {1, {6}, 0.5, 1.5, 0, false, false}, {1, {6}, -1, 1, 0, false, false}}},
        {2, {{2, {5, 8}, -2, 2, 0, true, false}, {1, {8}, 0.5, 1.5, 0, false, false}}},
        {1, {{4, {2, 4, 3, 3}, -2, 2, 0, true, false}}},
        {1, {{4, {3, 2, 2, 3}, -2, 2, KN_F64, false, false}}},
        {2, {{4, {1, 4, 6, 7}, -1, 1, 0, true, false}, {4, {2, 2, 3, 2}, -1, 1, 0, false, false}}},
        {2, {{4, {1, 4, 3, 4}, -1, 1, 0, false, false}, {4, {4, 3, 2, 3}, -1, 1, 0, true, false}}},
        {1, {{4, {2, 2, 7, 6}, -5, 5, 0, true, false}}},
        {1, {{3, {3, 7, 8}, -5, 5, 0, false, false}}},
        {1, {{4, {1, 2, 7, 5}, -5, 5, 0, true, false}}},
        {3, {{4, {1, 4, 3, 4}, -1, 1, 0, false, false}, {4, {1, 2, 5, 4}, -1, 1, 0, true, false}, {4, {1, 2, 5, 4}, -1, 1, 0, false, false}}},
        {2, {{3, {2, 3, 6}, -1, 1, 0, false, false}, {1, {3}, 0, 50, 0, false, true}}},
        {2, {{3, {2, 6, 4}, -1, 1, KN_F64, true, false}, {1, {6}, 0, 50, KN_I64, false, true}}},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        bk u = {i};
        double e = kn_optest_backends(b_nn, &u, cs[i].nin, cs[i].in);
        CHECK(e < 1e-6, "case %d: ref vs cpu rel err %g", i, e);
    }
}

/* ---- bad arguments ------------------------------------------------------------------------- */
#define BAD(expr, name) do { kn_ctx_clear_status(ctx); CHECK((expr) == NULL, "%s should fail", name); \
    CHECK(strstr(kn_last_error(), name) != NULL, "message names %s: %s", name, kn_last_error()); } while (0)

TEST(bad_arguments) {
    kn_ctx *ctx = ref_ctx();
    kn_tensor *x4 = kn_zeros(ctx, KN_F32, 4, (int64_t[]){1, 4, 5, 5}), *w = kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 3, 3, 3});
    kn_tensor *wi = kn_zeros(ctx, KN_I32, 2, (int64_t[]){2, 2});
    BAD(kn_softmax(ctx, x4, 4), "softmax");
    BAD(kn_log_softmax(ctx, wi, 0), "log_softmax");
    BAD(kn_layer_norm(ctx, x4, 5, NULL, NULL, 1e-5), "layer_norm");
    BAD(kn_layer_norm(ctx, x4, 2, kn_zeros(ctx, KN_F32, 1, (int64_t[]){5}), NULL, 1e-5), "layer_norm");
    BAD(kn_rms_norm(ctx, x4, 1, kn_zeros(ctx, KN_F32, 1, (int64_t[]){4}), 1e-5), "rms_norm");
    BAD(kn_group_norm(ctx, x4, 3, NULL, NULL, 1e-5), "group_norm");
    BAD(kn_batch_norm(ctx, x4, NULL, NULL, NULL, NULL, false, 1e-5), "batch_norm");
    BAD(kn_batch_norm(ctx, x4, NULL, NULL, kn_zeros(ctx, KN_F32, 1, (int64_t[]){3}), NULL, true, 1e-5), "batch_norm");
    BAD(kn_conv2d(ctx, x4, w, NULL, I1, I0, I1, 1), "conv2d");                         /* 4 channels vs 3 */
    BAD(kn_conv2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 2, 3, 3}), NULL, I1, I0, I1, 3), "conv2d"); /* groups */
    BAD(kn_conv2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 4, 6, 6}), NULL, I1, I0, I1, 1), "conv2d"); /* kernel > input */
    BAD(kn_conv2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 4, 3, 3}), NULL, I1, I0, (int[]){3, 3}, 1), "conv2d"); /* dilated */
    BAD(kn_conv2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 4, 3, 3}), kn_zeros(ctx, KN_F32, 1, (int64_t[]){5}), I1, I0, I1, 1), "conv2d");
    BAD(kn_conv2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){6, 4, 3, 3}), NULL, I0, I0, I1, 1), "conv2d");  /* stride 0 */
    BAD(kn_conv1d(ctx, kn_zeros(ctx, KN_F32, 3, (int64_t[]){1, 4, 5}), kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 3, 3}), NULL, 1, 0, 1, 1), "conv1d");
    BAD(kn_conv_transpose2d(ctx, x4, w, NULL, I1, I0, I0, I1, 1), "conv_transpose2d");
    BAD(kn_conv_transpose2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){4, 2, 3, 3}), NULL, I1, I0, I1, I1, 1), "conv_transpose2d"); /* output_padding */
    BAD(kn_conv_transpose2d(ctx, x4, kn_zeros(ctx, KN_F32, 4, (int64_t[]){4, 2, 3, 3}), NULL, I1, I0, I0, I1, 3), "conv_transpose2d");
    BAD(kn_max_pool2d(ctx, x4, (int[]){2, 2}, NULL, (int[]){2, 2}, I1, false), "max_pool2d");   /* padding > k/2 */
    BAD(kn_max_pool2d(ctx, x4, (int[]){6, 6}, NULL, I0, I1, false), "max_pool2d");            /* kernel > input */
    BAD(kn_max_pool2d(ctx, kn_zeros(ctx, KN_F32, 2, (int64_t[]){5, 5}), (int[]){2, 2}, NULL, I0, I1, false), "max_pool2d");
    BAD(kn_avg_pool2d(ctx, x4, (int[]){0, 2}, NULL, I0, false, true), "avg_pool2d");
    BAD(kn_adaptive_avg_pool2d(ctx, x4, 0, 2), "adaptive_avg_pool2d");
    kn_tensor *q = kn_zeros(ctx, KN_F32, 4, (int64_t[]){1, 3, 2, 4}), *k = kn_zeros(ctx, KN_F32, 4, (int64_t[]){1, 2, 2, 4});
    BAD(kn_sdpa(ctx, q, k, k, false, 0), "sdpa");                                          /* 3 % 2 heads */
    BAD(kn_sdpa(ctx, q, kn_zeros(ctx, KN_F32, 4, (int64_t[]){1, 1, 2, 5}), k, false, 0), "sdpa");
    BAD(kn_sdpa(ctx, q, kn_zeros(ctx, KN_F32, 3, (int64_t[]){1, 2, 4}), k, false, 0), "sdpa");
    kn_tensor *xr = kn_zeros(ctx, KN_F32, 3, (int64_t[]){1, 2, 5}), *pr = kn_zeros(ctx, KN_I32, 1, (int64_t[]){2});
    BAD(kn_rope(ctx, xr, pr, 5, 10000, false, 1), "rope");                                  /* D odd, n_rot odd */
    BAD(kn_rope(ctx, xr, pr, 6, 10000, false, 1), "rope");                                  /* n_rot > D */
    BAD(kn_rope(ctx, xr, kn_zeros(ctx, KN_F32, 1, (int64_t[]){2}), 4, 10000, false, 1), "rope");
    BAD(kn_rope(ctx, xr, kn_zeros(ctx, KN_I32, 1, (int64_t[]){3}), 4, 10000, false, 1), "rope");
    BAD(kn_rope_ff(ctx, xr, pr, 4, 10000, false, 1, kn_zeros(ctx, KN_F32, 1, (int64_t[]){3})), "freq factors");  /* not [n_rot/2] */
    BAD(kn_rope_ff(ctx, xr, pr, 4, 10000, false, 1, kn_zeros(ctx, KN_I32, 1, (int64_t[]){2})), "freq factors");  /* not float */
    BAD(kn_embedding(ctx, kn_zeros(ctx, KN_F32, 1, (int64_t[]){4}), pr), "embedding");
    /* NULL inputs propagate quietly */
    kn_ctx_clear_status(ctx);
    CHECK(kn_softmax(ctx, NULL, 0) == NULL && kn_conv2d(ctx, NULL, w, NULL, I1, I0, I1, 1) == NULL &&
          kn_sdpa(ctx, q, NULL, k, false, 0) == NULL && kn_rope(ctx, NULL, pr, 2, 1, false, 1) == NULL &&
          kn_embedding(ctx, NULL, pr) == NULL && kn_dropout(ctx, NULL, 0.5, true, 1) == NULL, "NULL in, NULL out");
    CHECK(kn_ctx_status(ctx) == KN_OK, "NULL inputs are not errors");
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
