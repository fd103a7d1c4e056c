/* test_ops_extra.c: sort / argsort, einsum, interpolate, unfold / fold and
 * conv3d (issue 15):
 *   - every case of tests/fixtures/ops_extra.bin (PyTorch, written by
 *     scripts/ops_extra_ref.py) on the ref and cpu backends: values in f32,
 *     sort indices exactly, gradients of sum(out * w) in f64;
 *   - the same graphs on random data, ref against cpu, plain and transposed
 *     inputs (kn_optest_backends), and gradients against finite differences;
 *   - independent formulas written here (a direct conv3d, im2col loops, the
 *     stable order of sort with NaN and -0.0), unfold/fold adjointness;
 *   - every malformed einsum spec and bad argument gives NULL and a message.
 * The CUDA backend runs the fixtures here when built with CUDA=1 on a GPU,
 * and the same builders against ref in test_cuda_ops.c.
 */
#include "kn_optest.h"
#include "kn_fixture.h"
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif

/* ---- the builders (shared by the fixture cases and the random checks) ---- */
typedef struct { const char *name; int nin; const char *in[3]; } fxcase;

static const int K23[2] = {2, 3}, D12[2] = {1, 2}, P10[2] = {1, 0}, S21[2] = {2, 1}, K33[2] = {3, 3}, ONE[2] = {1, 1},
                 ZERO[2] = {0, 0}, K22[2] = {2, 2};

/* the op of fixture case `name` on inputs in[]; *idx gets sort's indices */
static kn_tensor *build_named(kn_ctx *ctx, const char *name, kn_tensor **in, kn_tensor **idx) {
    if (idx) *idx = NULL;
    if (!strcmp(name, "sort0")) return kn_sort(ctx, in[0], 1, false, idx);
    if (!strcmp(name, "sort1")) return kn_sort(ctx, in[0], -1, true, idx);
    if (!strcmp(name, "sort2")) return kn_sort(ctx, in[0], 0, true, idx);
    static const struct { const char *n, *s; } E[] = {
        {"ein0", "bij,bjk->bik"}, {"ein1", "ii->i"}, {"ein2", "ii"}, {"ein3", "...ij,...jk->...ik"}, {"ein4", "ab,bc,cd->ad"},
        {"ein5", "i,j->ij"}, {"ein6", "bhqd,bhkd->bhqk"}, {"ein7", "ijk->kji"}, {"ein8", "ij,ij->"}, {"ein9", "Ba,ab"},
        {"ein10", "iij,jk->ik"}, {"ein11", "ij,jk->ik"}, {"ein12", "...i->i"}};
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++)
        if (!strcmp(name, E[i].n)) {
            int n = 1;
            for (const char *p = E[i].s; *p && !(p[0] == '-' && p[1] == '>'); p++) n += *p == ',';
            return kn_einsum(ctx, E[i].s, n, in);
        }
    if (!strcmp(name, "int0")) return kn_interpolate(ctx, in[0], (int64_t[]){5, 7}, NULL, KN_INTERP_NEAREST, false);
    if (!strcmp(name, "int1")) return kn_interpolate(ctx, in[0], NULL, (double[]){1.7, 0.6}, KN_INTERP_NEAREST, false);
    if (!strcmp(name, "int2")) return kn_interpolate(ctx, in[0], (int64_t[]){7, 5}, NULL, KN_INTERP_LINEAR, false);
    if (!strcmp(name, "int3")) return kn_interpolate(ctx, in[0], (int64_t[]){7, 5}, NULL, KN_INTERP_LINEAR, true);
    if (!strcmp(name, "int4")) return kn_interpolate(ctx, in[0], NULL, (double[]){2.5, 0.5}, KN_INTERP_LINEAR, false);
    if (!strcmp(name, "int5")) return kn_interpolate(ctx, in[0], (int64_t[]){3, 2}, NULL, KN_INTERP_LINEAR, false);
    if (!strcmp(name, "int6")) return kn_interpolate(ctx, in[0], (int64_t[]){9}, NULL, KN_INTERP_LINEAR, false);
    if (!strcmp(name, "int7")) return kn_interpolate(ctx, in[0], (int64_t[]){3, 4, 5}, NULL, KN_INTERP_LINEAR, true);
    if (!strcmp(name, "int8")) return kn_interpolate(ctx, in[0], (int64_t[]){3, 4, 2}, NULL, KN_INTERP_NEAREST, false);
    if (!strcmp(name, "unf0")) return kn_unfold(ctx, in[0], K23, D12, P10, S21);
    if (!strcmp(name, "unf1")) return kn_unfold(ctx, in[0], K33, ONE, ONE, ONE);
    if (!strcmp(name, "fold0")) return kn_fold(ctx, in[0], (int64_t[]){5, 7}, K23, D12, P10, S21);
    if (!strcmp(name, "fold1")) return kn_fold(ctx, in[0], (int64_t[]){4, 5}, K22, ONE, ZERO, ONE);
    if (!strcmp(name, "c3d0")) return kn_conv3d(ctx, in[0], in[1], in[2], (int[]){1, 2, 1}, (int[]){1, 0, 1}, (int[]){2, 1, 1}, 1);
    if (!strcmp(name, "c3d1")) return kn_conv3d(ctx, in[0], in[1], NULL, (int[]){2, 2, 2}, (int[]){1, 1, 1}, (int[]){1, 1, 1}, 2);
    return NULL;
}

static const char *CASES[] = {"sort0", "sort1", "sort2", "ein0", "ein1", "ein2", "ein3", "ein4", "ein5", "ein6", "ein7", "ein8",
                              "ein9", "ein10", "ein11", "ein12", "int0", "int1", "int2", "int3", "int4", "int5", "int6", "int7",
                              "int8", "unf0", "unf1", "fold0", "fold1", "c3d0", "c3d1"};
static const char *INAMES[] = {"x", "a", "b", "c", "w"};

/* inputs of a case in file order (x | a, b, c | x, w, b) */
static int case_inputs(const kn_fx *fx, const char *cs, const kn_fx_tensor **t) {
    int n = 0;
    for (int i = 0; i < fx->n && n < 4; i++) {
        size_t l = strlen(cs);
        if (!strncmp(fx->t[i].name, cs, l) && !strncmp(fx->t[i].name + l, ".in.", 4)) t[n++] = &fx->t[i];
    }
    (void)INAMES;
    return n;
}

static double rel(const double *a, const double *b, int64_t n) { return kn_rel_err(a, b, n); }

/* one fixture case on backend be: values (f32) and gradients (f64) */
static int run_fixture_case(kn_backend *be, const kn_fx *fx, const char *cs) {
    int bad = 0;
    char nm[96];
    const kn_fx_tensor *in[4];
    int nin = case_inputs(fx, cs, in);
    snprintf(nm, sizeof nm, "%s.out", cs);
    const kn_fx_tensor *out = kn_fx_get(fx, nm);
    snprintf(nm, sizeof nm, "%s.idx", cs);
    const kn_fx_tensor *idx = kn_fx_get(fx, nm);
    snprintf(nm, sizeof nm, "%s.w", cs);
    const kn_fx_tensor *w = kn_fx_get(fx, nm);
    if (!nin || !out) { fprintf(stderr, "  %s: missing from the fixture\n", cs); return 1; }
    /* forward, f32 */
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *x[4];
    for (int i = 0; i < nin; i++) x[i] = kn_fx_tensor_new(ctx, in[i], KN_F32);
    kn_tensor *ix = NULL;
    kn_tensor *y = build_named(ctx, cs, x, idx ? &ix : NULL);
    if (!y || kn_numel(y) != out->numel) {
        fprintf(stderr, "  %s on %s: build: %s\n", cs, kn_backend_name(be), y ? "wrong size" : kn_last_error());
        kn_ctx_free(ctx);
        return 1;
    }
    double *v = malloc(sizeof(double) * (size_t)out->numel);
    if (kn_tensor_read(y, v, KN_F64)) { fprintf(stderr, "  %s: run: %s\n", cs, kn_last_error()); bad++; }
    else {
        double e = rel(v, out->v, out->numel);
        if (!(e <= 2e-6)) { fprintf(stderr, "  %s on %s: values rel err %g\n", cs, kn_backend_name(be), e); bad++; }
    }
    if (idx) {
        double *iv = malloc(sizeof(double) * (size_t)idx->numel);
        if (!ix || kn_tensor_read(ix, iv, KN_F64) || memcmp(iv, idx->v, sizeof(double) * (size_t)idx->numel)) {
            fprintf(stderr, "  %s on %s: indices differ from torch's stable sort\n", cs, kn_backend_name(be));
            bad++;
        }
        free(iv);
    }
    free(v);
    kn_ctx_free(ctx);
    if (!w) return bad;
    /* gradients, f64 */
    ctx = kn_ctx_new(&(kn_ctx_opts){be});
    for (int i = 0; i < nin; i++) { x[i] = kn_fx_tensor_new(ctx, in[i], KN_F64); kn_set_requires_grad(x[i], true); }
    y = build_named(ctx, cs, x, NULL);
    kn_tensor *wt = kn_fx_tensor_new(ctx, w, KN_F64), *g[4] = {0};
    if (!y || kn_gradients(ctx, 1, &y, &wt, nin, x, g)) {
        fprintf(stderr, "  %s: backward: %s\n", cs, kn_last_error());
        kn_ctx_free(ctx);
        return bad + 1;
    }
    for (int i = 0; i < nin; i++) {
        const char *dot = strrchr(in[i]->name, '.');
        snprintf(nm, sizeof nm, "%s.grad.%s", cs, dot + 1);
        const kn_fx_tensor *gr = kn_fx_get(fx, nm);
        if (!gr) continue;
        double *gv = calloc((size_t)gr->numel, sizeof(double));
        if (g[i] && kn_tensor_read(g[i], gv, KN_F64)) { fprintf(stderr, "  %s: grad %s: %s\n", cs, nm, kn_last_error()); bad++; }
        double e = rel(gv, gr->v, gr->numel);
        if (!(e <= 1e-9)) { fprintf(stderr, "  %s on %s: %s rel err %g\n", cs, kn_backend_name(be), nm, e); bad++; }
        free(gv);
    }
    kn_ctx_free(ctx);
    return bad;
}

/* ref and cpu; with a CUDA build on a GPU machine, the CUDA backend too */
TEST(torch_fixtures_ref_cpu_cuda) {
    kn_fx fx = {0};
    REQUIRE(kn_fx_load("tests/fixtures/ops_extra.bin", &fx) == 0, "%s", kn_fx_error());
    kn_backend *bes[3] = {kn_backend_ref(), kn_backend_cpu(), NULL};
    int nb = 2;
#ifdef KN_CUDA
    if ((bes[2] = kn_backend_cuda())) nb = 3;
    else fprintf(stderr, "  (no GPU: the CUDA backend is not checked here: %s)\n", kn_last_error());
#endif
    for (int b = 0; b < nb; b++)
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
            CHECK(run_fixture_case(bes[b], &fx, CASES[i]) == 0, "case %s on %s", CASES[i], kn_backend_name(bes[b]));
    kn_fx_free(&fx);
}

/* ---- sort ---- */
TEST(sort_order_nan_zero_ties) {
    /* NaN largest, -0.0 == 0.0 (stable), ties in input order */
    double v[9] = {2, NAN, -0.0, 1, 0.0, NAN, -1, 1, -INFINITY};
    int64_t asc[9] = {8, 6, 2, 4, 3, 7, 0, 1, 5}, desc[9] = {1, 5, 0, 3, 7, 2, 4, 6, 8};
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
    kn_dtype dts[3] = {KN_F32, KN_F64, KN_F16};
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            for (int de = 0; de < 2; de++) {
                kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){bes[b]});
                kn_tensor *x = kn_empty(ctx, dts[d], 1, (int64_t[]){9});
                kn_tensor_write(x, v, KN_F64);
                kn_tensor *ix;
                kn_tensor *s = kn_sort(ctx, x, 0, de, &ix);
                int64_t got[9];
                double sv[9];
                CHECK(s && ix && ix->dtype == KN_I64 && kn_tensor_read(ix, got, KN_I64) == KN_OK && kn_tensor_read(s, sv, KN_F64) == KN_OK,
                      "%s", kn_last_error());
                CHECK(!memcmp(got, de ? desc : asc, sizeof got), "%s %s %s: order", kn_backend_name(bes[b]), kn_dtype_name(dts[d]),
                      de ? "desc" : "asc");
                for (int i = 0; i < 9; i++) {
                    double want = v[(de ? desc : asc)[i]];
                    CHECK((isnan(want) && isnan(sv[i])) || sv[i] == want, "value %d", i);
                }
                CHECK(!kn_requires_grad(kn_argsort(ctx, x, 0, false)), "argsort must not require grad");
                kn_ctx_free(ctx);
            }
}

TEST(sort_integers) {
    int64_t v[8] = {5, -2, 7, -2, 0, 5, -9, 1}, asc[8] = {6, 1, 3, 4, 7, 0, 5, 2}, desc[8] = {2, 0, 5, 7, 4, 1, 3, 6};
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
    kn_dtype dts[3] = {KN_I32, KN_I64, KN_U8};
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            for (int de = 0; de < 2; de++) {
                kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){bes[b]});
                int64_t w[8];
                for (int i = 0; i < 8; i++) w[i] = dts[d] == KN_U8 ? v[i] + 9 : v[i];
                kn_tensor *x = kn_empty(ctx, dts[d], 1, (int64_t[]){8});
                kn_tensor_write(x, w, KN_I64);
                kn_tensor *ix, *s = kn_sort(ctx, x, 0, de, &ix);
                int64_t got[8], sv[8];
                CHECK(s && s->dtype == dts[d] && kn_tensor_read(ix, got, KN_I64) == KN_OK && kn_tensor_read(s, sv, KN_I64) == KN_OK,
                      "%s", kn_last_error());
                CHECK(!memcmp(got, de ? desc : asc, sizeof got), "%s %s: order", kn_backend_name(bes[b]), kn_dtype_name(dts[d]));
                for (int i = 0; i < 8; i++) CHECK(sv[i] == w[(de ? desc : asc)[i]], "value %d", i);
                kn_ctx_free(ctx);
            }
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 3});
    CHECK(!kn_sort(ctx, x, 2, false, NULL) && strstr(kn_last_error(), "dim 2"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_argsort(ctx, kn_zeros(ctx, KN_Q8_0, 1, (int64_t[]){32}), 0, false) && strstr(kn_last_error(), "sort"), "%s", kn_last_error());
    kn_ctx_free(ctx);
}

/* symbolic extents: sort along a symbolic dim, unfold and interpolate with a
 * symbolic batch; one plan, several lengths, against fresh fixed-size graphs */
TEST(symbolic_lengths) {
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
    kn_test_seed(156);
    float in[6 * 100];
    for (int i = 0; i < 600; i++) in[i] = (float)floor(kn_test_uniform(-20, 20));
    for (int b = 0; b < 2; b++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){bes[b]});
        int T = kn_sym_new(ctx, "T", 100), B = kn_sym_new(ctx, "B", 6);
        kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){6, 100});
        kn_tensor *ix = kn_argsort(ctx, kn_slice_sym(ctx, x, 1, 0, T), 1, true);              /* [6, T] */
        kn_tensor *im = kn_reshape(ctx, kn_slice_sym(ctx, x, 0, 0, B), 4, (int64_t[]){-1, 1, 10, 10});
        kn_tensor *u = kn_unfold(ctx, im, K33, ONE, ONE, (int[]){2, 2});                        /* [B, 9, 25] */
        kn_tensor *up = kn_interpolate(ctx, im, (int64_t[]){7, 13}, NULL, KN_INTERP_LINEAR, false);
        REQUIRE(ix && u && up, "%s", kn_last_error());
        kn_plan *p = kn_plan_new(ctx, 3, (kn_tensor *[]){ix, u, up}, NULL);
        REQUIRE(p, "%s", kn_last_error());
        kn_tensor_write(x, in, KN_F32);
        for (int len = 3; len <= 100; len += 48) {
            int nb = 1 + len % 6;
            REQUIRE(kn_sym_set(ctx, T, len) == KN_OK && kn_sym_set(ctx, B, nb) == KN_OK && kn_plan_run(p) == KN_OK, "%s", kn_last_error());
            int64_t got[600];
            float gu[6 * 225], gup[6 * 91];
            REQUIRE(kn_tensor_read(ix, got, KN_I64) == KN_OK && kn_tensor_read(u, gu, KN_F32) == KN_OK &&
                    kn_tensor_read(up, gup, KN_F32) == KN_OK, "%s", kn_last_error());
            /* the same on fixed shapes */
            kn_ctx *c2 = kn_ctx_new(&(kn_ctx_opts){bes[b]});
            kn_tensor *x2 = kn_from_data(c2, KN_F32, 2, (int64_t[]){6, 100}, in);
            int64_t want[600];
            float wu[6 * 225], wup[6 * 91];
            kn_tensor *im2 = kn_reshape(c2, kn_slice(c2, x2, 0, 0, nb, 1), 4, (int64_t[]){-1, 1, 10, 10});
            REQUIRE(kn_tensor_read(kn_argsort(c2, kn_slice(c2, x2, 1, 0, len, 1), 1, true), want, KN_I64) == KN_OK &&
                    kn_tensor_read(kn_unfold(c2, im2, K33, ONE, ONE, (int[]){2, 2}), wu, KN_F32) == KN_OK &&
                    kn_tensor_read(kn_interpolate(c2, im2, (int64_t[]){7, 13}, NULL, KN_INTERP_LINEAR, false), wup, KN_F32) == KN_OK,
                    "%s", kn_last_error());
            bool same = true;   /* a read gives the [6, 100] storage: row r's first len entries */
            for (int r = 0; r < 6; r++)
                for (int i = 0; i < len; i++) same &= got[r * 100 + i] == want[r * len + i];
            CHECK(same, "%s T=%d: argsort differs", kn_backend_name(bes[b]), len);
            CHECK(!memcmp(gu, wu, sizeof(float) * 225 * (size_t)nb), "%s B=%d: unfold differs", kn_backend_name(bes[b]), nb);
            CHECK(!memcmp(gup, wup, sizeof(float) * 91 * (size_t)nb), "%s B=%d: interpolate differs", kn_backend_name(bes[b]), nb);
            kn_ctx_free(c2);
        }
        kn_plan_free(p);
        kn_ctx_free(ctx);
    }
}

/* a long line (the CPU's radix path) of NaN, +-0, +-inf and many ties: cpu == ref, exactly */
TEST(sort_long_line_specials_cpu_vs_ref) {
    kn_test_seed(150);
    enum { L = 1000 };
    double v[L];
    const double sp[6] = {NAN, -0.0, 0.0, INFINITY, -INFINITY, 1e-40};
    for (int i = 0; i < L; i++) v[i] = i % 7 == 0 ? sp[(i / 7) % 6] : floor(kn_test_uniform(-5, 5));
    for (int de = 0; de < 2; de++) {
        int64_t got[2][L];
        kn_backend *bes[2] = {kn_backend_ref(), kn_backend_cpu()};
        for (int b = 0; b < 2; b++) {
            kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){bes[b]});
            kn_tensor *x = kn_empty(ctx, KN_F32, 2, (int64_t[]){2, L / 2});
            kn_tensor_write(x, v, KN_F64);
            CHECK(kn_tensor_read(kn_argsort(ctx, x, 1, de), got[b], KN_I64) == KN_OK, "%s", kn_last_error());
            kn_ctx_free(ctx);
        }
        CHECK(!memcmp(got[0], got[1], sizeof got[0]), "desc %d: cpu order differs from ref", de);
        /* sorted and stable: each next (value, index) is after the previous */
        for (int r = 0; r < 2; r++)
            for (int i = 1; i < L / 2; i++) {
                double a = v[r * L / 2 + got[0][r * L / 2 + i - 1]], b = v[r * L / 2 + got[0][r * L / 2 + i]];
                bool eq = (isnan(a) && isnan(b)) || a == b;
                bool ord = de ? (isnan(a) || (!isnan(b) && a > b)) : (isnan(b) || (!isnan(a) && a < b));
                CHECK(ord || (eq && got[0][r * L / 2 + i - 1] < got[0][r * L / 2 + i]), "row %d pos %d not in order", r, i);
            }
    }
}

typedef struct { int dim; bool desc; bool idx; } sort_ud;
static kn_tensor *b_sort(kn_ctx *ctx, kn_tensor **in, void *ud) {
    sort_ud *u = ud;
    kn_tensor *ix;
    kn_tensor *s = kn_sort(ctx, in[0], u->dim, u->desc, &ix);
    return u->idx ? kn_cast(ctx, ix, KN_F32) : s;
}
TEST(sort_random_backends_and_grad) {
    kn_test_seed(151);
    struct { int nd; int64_t sh[3]; bool tr; bool ints; } S[] = {
        {3, {4, 5, 6}, true, true}, {2, {3, 1000}, false, false}, {2, {700, 3}, false, true}, {1, {1}, false, false},
        {2, {5, 300}, false, true}, {3, {2, 3, 4100}, false, false}};
    for (size_t c = 0; c < sizeof S / sizeof S[0]; c++)
        for (int dim = -1; dim < S[c].nd; dim++)
            for (int k = 0; k < 4; k++) {
                sort_ud u = {dim, k & 1, k >> 1};
                kn_opin in = {S[c].nd, {S[c].sh[0], S[c].sh[1], S[c].sh[2]}, -4, 4, 0, S[c].tr, S[c].ints};
                double e = kn_optest_backends(b_sort, &u, 1, &in);
                CHECK(e == 0, "sort case %zu dim %d desc %d idx %d: ref vs cpu %g", c, dim, u.desc, u.idx, e);
            }
    sort_ud u = {1, true, false};
    kn_opin in = {3, {2, 5, 3}, -1, 1, 0, true, false};
    double g = kn_gradcheck(b_sort, &u, 1, &in, (bool[]){true});
    CHECK(g < 1e-6, "sort gradient %g", g);
}

/* ---- einsum ---- */
TEST(einsum_errors) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *a = kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 3}), *b = kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 4});
    kn_tensor *ab[2] = {a, b};
    struct { const char *s; int n; const char *want; } E[] = {
        {"ij,jk->ik,", 2, "','"}, {"ij,jk->i-k", 2, "'-'"}, {"ij,jk", 1, "2 input terms"}, {"ij", 2, "1 input term"},
        {"ij,jk->iz", 2, "'z'"}, {"ij,jk->ii", 2, "repeated"}, {"i1,jk", 2, "'1'"}, {"ij,j.k", 2, "\"...\""},
        {"....,jk", 2, "position 3"}, {"...a...,jk", 2, "second"}, {"ijk,jk", 2, "has 2 dims"}, {"i,jk", 2, "has 2 dims"}, {"ij,kl", 2, NULL},
        {"ij,ik->jk", 2, "size"}, {"ij,jk->>ik", 2, "'>'"}, {"ij,jk->ik->i", 2, "second \"->\""}, {"ij,j\x01k", 2, "0x01"},
        {"ij,jk-", 2, "'-'"}, {"ij,jk>", 2, "'>'"}, {"abcdefghi,jk", 2, "more than 8"}, {"", 2, "1 input term"}};
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        kn_ctx_clear_status(ctx);
        kn_tensor *y = kn_einsum(ctx, E[i].s, E[i].n, ab);
        if (!E[i].want) { CHECK(y, "\"%s\" should build: %s", E[i].s, kn_last_error()); continue; }
        CHECK(!y && strstr(kn_last_error(), "einsum") && strstr(kn_last_error(), E[i].want), "\"%s\": %s", E[i].s, kn_last_error());
    }
    kn_ctx_clear_status(ctx);
    CHECK(!kn_einsum(ctx, NULL, 2, ab) && !kn_einsum(ctx, "ij", 0, ab), "NULL spec / no operands accepted");
    kn_ctx_clear_status(ctx);
    kn_tensor *sq = kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 3});
    CHECK(!kn_einsum(ctx, "ii->i", 1, &sq) && strstr(kn_last_error(), "diagonal"), "%s", kn_last_error());
    kn_ctx_free(ctx);
}

typedef struct { const char *spec; int n; } ein_ud;
static kn_tensor *b_ein(kn_ctx *ctx, kn_tensor **in, void *ud) {
    ein_ud *u = ud;
    return kn_einsum(ctx, u->spec, u->n, in);
}
TEST(einsum_random_backends_and_grad) {
    kn_test_seed(152);
    struct { const char *s; int n; kn_opin in[3]; } C[] = {
        {"bij,bjk->bik", 2, {{3, {2, 3, 4}, -1, 1, 0, true}, {3, {2, 4, 5}, -1, 1}}},
        {"ij,kj->ik", 2, {{2, {33, 17}, -1, 1}, {2, {20, 17}, -1, 1, 0, true}}},
        {"bhqd,bkhd->bhqk", 2, {{4, {2, 3, 4, 5}, -1, 1}, {4, {2, 6, 3, 5}, -1, 1}}},
        {"...ij,jk", 2, {{4, {2, 1, 3, 4}, -1, 1}, {2, {4, 2}, -1, 1}}},
        {"iji->j", 1, {{3, {3, 4, 3}, -1, 1}}},
        {"i,i,i->", 3, {{1, {5}, -1, 1}, {1, {5}, -1, 1}, {1, {5}, -1, 1}}},
        {"ab,cd->abcd", 2, {{2, {2, 3}, -1, 1}, {2, {4, 2}, -1, 1}}},
        {"bn,anm,bm->ba", 3, {{2, {3, 4}, -1, 1}, {3, {2, 4, 5}, -1, 1}, {2, {3, 5}, -1, 1}}},
        {"ij->", 1, {{2, {4, 6}, -1, 1, 0, true}}},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        ein_ud u = {C[i].s, C[i].n};
        double e = kn_optest_backends(b_ein, &u, C[i].n, C[i].in);
        CHECK(e < 1e-5, "%s: ref vs cpu %g", C[i].s, e);
        bool rq[3] = {true, true, true};
        double g = kn_gradcheck(b_ein, &u, C[i].n, C[i].in, rq);
        CHECK(g < 1e-6, "%s: gradient %g", C[i].s, g);
    }
}

/* ---- unfold / fold ---- */
typedef struct { int w; } pu;
static kn_tensor *b_patch(kn_ctx *ctx, kn_tensor **in, void *ud) {
    switch (((pu *)ud)->w) {
    case 0: return kn_unfold(ctx, in[0], K23, D12, P10, S21);
    case 1: return kn_fold(ctx, in[0], (int64_t[]){5, 7}, K23, D12, P10, S21);
    case 2: return kn_unfold(ctx, in[0], K33, ONE, ONE, ONE);
    case 3: return kn_fold(ctx, in[0], (int64_t[]){6, 6}, K33, (int[]){2, 1}, ONE, (int[]){1, 2});
    }
    return NULL;
}
TEST(unfold_fold_backends_grad_adjoint) {
    kn_test_seed(153);
    struct { int w; kn_opin in; } C[] = {
        {0, {4, {2, 3, 5, 7}, -1, 1, 0, true}}, {1, {3, {2, 18, 9}, -1, 1, 0, true}}, {2, {3, {3, 6, 6}, -1, 1}},
        {3, {2, {27, 12}, -1, 1}}, {0, {4, {1, 2, 5, 7}, -1, 1, KN_F64}}, {2, {4, {2, 64, 16, 16}, -1, 1}},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        pu u = {C[i].w};
        double e = kn_optest_backends(b_patch, &u, 1, &C[i].in);
        CHECK(e < 1e-6, "case %zu: ref vs cpu %g", i, e);
        if (C[i].in.shape[1] < 64) {
            double g = kn_gradcheck(b_patch, &u, 1, &C[i].in, (bool[]){true});
            CHECK(g < 1e-6, "case %zu: gradient %g", i, g);
        }
    }
    /* im2col by hand, and <unfold(x), y> == <x, fold(y)> */
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    double xv[2 * 3 * 5 * 7], yv[2 * 18 * 9], u[2 * 18 * 9], f[2 * 3 * 5 * 7];
    for (int i = 0; i < 210; i++) xv[i] = kn_test_uniform(-1, 1);
    for (int i = 0; i < 324; i++) yv[i] = kn_test_uniform(-1, 1);
    kn_tensor *x = kn_empty(ctx, KN_F64, 4, (int64_t[]){2, 3, 5, 7}), *y = kn_empty(ctx, KN_F64, 3, (int64_t[]){2, 18, 9});
    kn_tensor_write(x, xv, KN_F64); kn_tensor_write(y, yv, KN_F64);
    REQUIRE(kn_tensor_read(kn_unfold(ctx, x, K23, D12, P10, S21), u, KN_F64) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tensor_read(kn_fold(ctx, y, (int64_t[]){5, 7}, K23, D12, P10, S21), f, KN_F64) == KN_OK, "%s", kn_last_error());
    double s1 = 0, s2 = 0, err = 0;
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int kh = 0; kh < 2; kh++)
                for (int kw = 0; kw < 3; kw++)
                    for (int oy = 0; oy < 3; oy++)       /* OH = (5 + 2 - 1 - 1) / 2 + 1 = 3, OW = (7 - 4 - 1) + 1 = 3 */
                        for (int ox = 0; ox < 3; ox++) {
                            int iy = oy * 2 - 1 + kh, ix = ox + 2 * kw, r = (c * 2 + kh) * 3 + kw, l = oy * 3 + ox;
                            double want = iy >= 0 && iy < 5 ? xv[((n * 3 + c) * 5 + iy) * 7 + ix] : 0;
                            err = fmax(err, fabs(u[(n * 18 + r) * 9 + l] - want));
                        }
    CHECK(err == 0, "unfold differs from im2col by %g", err);
    for (int i = 0; i < 324; i++) s1 += u[i] * yv[i];
    for (int i = 0; i < 210; i++) s2 += xv[i] * f[i];
    CHECK(fabs(s1 - s2) < 1e-12 * (1 + fabs(s1)), "not adjoint: %.17g vs %.17g", s1, s2);
    /* bad arguments */
    CHECK(!kn_fold(ctx, y, (int64_t[]){6, 7}, K23, D12, P10, S21) && strstr(kn_last_error(), "blocks"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_fold(ctx, kn_zeros(ctx, KN_F32, 3, (int64_t[]){1, 7, 9}), (int64_t[]){5, 7}, K23, D12, P10, S21) &&
          strstr(kn_last_error(), "multiple"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_unfold(ctx, x, (int[]){9, 1}, ONE, ZERO, ONE) && strstr(kn_last_error(), "fit"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_unfold(ctx, x, (int[]){0, 1}, ONE, ZERO, ONE) && strstr(kn_last_error(), ">= 1"), "%s", kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- interpolate ---- */
typedef struct { int ns; int64_t size[3]; double scale[3]; kn_interp_mode m; bool ac; } iu;
static kn_tensor *b_interp(kn_ctx *ctx, kn_tensor **in, void *ud) {
    iu *u = ud;
    return kn_interpolate(ctx, in[0], u->size[0] ? u->size : NULL, u->size[0] ? NULL : u->scale, u->m, u->ac);
}
TEST(interpolate_backends_grad_errors) {
    kn_test_seed(154);
    struct { iu u; kn_opin in; } C[] = {
        {{2, {9, 4}, {0}, KN_INTERP_NEAREST, false}, {4, {2, 3, 5, 6}, -1, 1, 0, true}},
        {{2, {9, 4}, {0}, KN_INTERP_LINEAR, false}, {4, {2, 3, 5, 6}, -1, 1, 0, true}},
        {{2, {9, 4}, {0}, KN_INTERP_LINEAR, true}, {4, {2, 3, 5, 6}, -1, 1}},
        {{2, {0}, {1.5, 3}, KN_INTERP_LINEAR, false}, {4, {1, 2, 4, 3}, -1, 1}},
        {{1, {1}, {0}, KN_INTERP_LINEAR, true}, {3, {2, 2, 4}, -1, 1}},
        {{3, {3, 5, 2}, {0}, KN_INTERP_LINEAR, false}, {5, {1, 2, 2, 3, 4}, -1, 1}},
        {{2, {64, 64}, {0}, KN_INTERP_LINEAR, false}, {4, {2, 8, 32, 32}, -1, 1}},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        double e = kn_optest_backends(b_interp, &C[i].u, 1, &C[i].in);
        CHECK(e < 1e-6, "case %zu: ref vs cpu %g", i, e);
        if (C[i].in.shape[1] < 8) {
            double g = kn_gradcheck(b_interp, &C[i].u, 1, &C[i].in, (bool[]){true});
            CHECK(g < 1e-6, "case %zu: gradient %g", i, g);
        }
    }
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *x = kn_zeros(ctx, KN_F32, 4, (int64_t[]){1, 1, 4, 4});
    CHECK(!kn_interpolate(ctx, x, (int64_t[]){2, 2}, NULL, KN_INTERP_NEAREST, true) && strstr(kn_last_error(), "align_corners"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_interpolate(ctx, x, NULL, NULL, KN_INTERP_LINEAR, false) && strstr(kn_last_error(), "exactly one"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_interpolate(ctx, x, NULL, (double[]){0.1, 1}, KN_INTERP_LINEAR, false) && strstr(kn_last_error(), "scale"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_interpolate(ctx, x, (int64_t[]){0, 2}, NULL, KN_INTERP_LINEAR, false) && strstr(kn_last_error(), "size"), "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn_interpolate(ctx, x, (int64_t[]){2, 2}, NULL, (kn_interp_mode)7, false) && strstr(kn_last_error(), "mode"), "%s", kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- conv3d ---- */
typedef struct { int s[3], p[3], d[3], g; bool bias; } c3u;
static kn_tensor *b_c3d(kn_ctx *ctx, kn_tensor **in, void *ud) {
    c3u *u = ud;
    return kn_conv3d(ctx, in[0], in[1], u->bias ? in[2] : NULL, u->s, u->p, u->d, u->g);
}
/* direct conv3d in double: x [N,C,D,H,W], w [O,C/g,KD,KH,KW] */
static void conv3d_direct(const double *x, const int64_t *xs, const double *w, const int64_t *ws, const double *b, const c3u *u,
                          double *y, const int64_t *ys) {
    int64_t N = xs[0], C = xs[1], O = ws[0], Cg = ws[1], Og = O / u->g;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t od = 0; od < ys[2]; od++)
                for (int64_t oh = 0; oh < ys[3]; oh++)
                    for (int64_t ow = 0; ow < ys[4]; ow++) {
                        double acc = b ? b[o] : 0;
                        for (int64_t c = 0; c < Cg; c++)
                            for (int64_t a = 0; a < ws[2]; a++)
                                for (int64_t bb = 0; bb < ws[3]; bb++)
                                    for (int64_t k = 0; k < ws[4]; k++) {
                                        int64_t id = od * u->s[0] - u->p[0] + a * u->d[0], ih = oh * u->s[1] - u->p[1] + bb * u->d[1],
                                                iw = ow * u->s[2] - u->p[2] + k * u->d[2];
                                        if (id < 0 || id >= xs[2] || ih < 0 || ih >= xs[3] || iw < 0 || iw >= xs[4]) continue;
                                        int64_t ci = (o / Og) * Cg + c;
                                        acc += x[(((n * C + ci) * xs[2] + id) * xs[3] + ih) * xs[4] + iw] *
                                               w[(((o * Cg + c) * ws[2] + a) * ws[3] + bb) * ws[4] + k];
                                    }
                        y[(((n * O + o) * ys[2] + od) * ys[3] + oh) * ys[4] + ow] = acc;
                    }
}
TEST(conv3d_direct_backends_grad) {
    kn_test_seed(155);
    struct { c3u u; kn_opin in[3]; } C[] = {
        {{{1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1, true}, {{5, {2, 3, 4, 5, 4}, -1, 1}, {5, {4, 3, 2, 3, 2}, -1, 1}, {1, {4}, -1, 1}}},
        {{{2, 1, 2}, {1, 2, 0}, {1, 2, 1}, 1, false}, {{5, {1, 2, 5, 6, 5}, -1, 1}, {5, {3, 2, 3, 2, 2}, -1, 1}}},
        {{{1, 2, 1}, {2, 1, 1}, {2, 1, 1}, 3, true}, {{5, {2, 6, 5, 4, 4}, -1, 1}, {5, {3, 2, 2, 2, 3}, -1, 1}, {1, {3}, -1, 1}}},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        int nin = C[i].u.bias ? 3 : 2;
        double e = kn_optest_backends(b_c3d, &C[i].u, nin, C[i].in);
        CHECK(e < 1e-5, "case %zu: ref vs cpu %g", i, e);
        double g = kn_gradcheck(b_c3d, &C[i].u, nin, C[i].in, (bool[]){true, true, true});
        CHECK(g < 1e-6, "case %zu: gradient %g", i, g);
        /* against the direct formula, f64 on cpu */
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
        double *v[3];
        kn_tensor *t[3];
        for (int k = 0; k < nin; k++) {
            int64_t n = kn__numel(&C[i].in[k]);
            v[k] = malloc(sizeof(double) * (size_t)n);
            kn__fill_in(&C[i].in[k], v[k], n);
            t[k] = kn_empty(ctx, KN_F64, C[i].in[k].ndim, C[i].in[k].shape);
            kn_tensor_write(t[k], v[k], KN_F64);
        }
        kn_tensor *y = b_c3d(ctx, t, &C[i].u);
        REQUIRE(y, "%s", kn_last_error());
        int64_t ny = kn_numel(y);
        double *got = malloc(sizeof(double) * (size_t)ny), *want = malloc(sizeof(double) * (size_t)ny);
        REQUIRE(kn_tensor_read(y, got, KN_F64) == KN_OK, "%s", kn_last_error());
        conv3d_direct(v[0], C[i].in[0].shape, v[1], C[i].in[1].shape, nin == 3 ? v[2] : NULL, &C[i].u, want, y->shape);
        CHECK(kn_rel_err(got, want, ny) < 1e-12, "case %zu: direct conv3d rel err %g", i, kn_rel_err(got, want, ny));
        free(got); free(want);
        for (int k = 0; k < nin; k++) free(v[k]);
        kn_ctx_free(ctx);
    }
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *x = kn_zeros(ctx, KN_F32, 5, (int64_t[]){1, 4, 3, 3, 3}), *w = kn_zeros(ctx, KN_F32, 5, (int64_t[]){2, 3, 2, 2, 2});
    CHECK(!kn_conv3d(ctx, x, w, NULL, (int[]){1, 1, 1}, (int[]){0, 0, 0}, (int[]){1, 1, 1}, 1) && strstr(kn_last_error(), "channels"),
          "%s", kn_last_error());
    kn_ctx_clear_status(ctx);
    kn_tensor *w2 = kn_zeros(ctx, KN_F32, 5, (int64_t[]){2, 4, 5, 2, 2});
    CHECK(!kn_conv3d(ctx, x, w2, NULL, (int[]){1, 1, 1}, (int[]){0, 0, 0}, (int[]){1, 1, 1}, 1) && strstr(kn_last_error(), "larger"),
          "%s", kn_last_error());
    kn_ctx_free(ctx);
}

int main(void) { return kn_test_main(); }
