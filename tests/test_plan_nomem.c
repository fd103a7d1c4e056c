/* test_plan_nomem.c: kn_plan_new when host memory runs out.
 *
 * The Makefile links this test with -Wl,--wrap=malloc,--wrap=calloc,
 * --wrap=realloc, so every allocation the library makes goes through the
 * wrappers below. Armed, they fail the N-th allocation; the test fails each
 * allocation of compiling a plan in turn and checks that kn_plan_new returns
 * NULL with KN_ERR_NOMEM and a message, never crashes, and (under ASan's leak
 * checker, `make sanitize`) leaks nothing. */
#include "kn_test.h"
#include "kiln.h"
#include <stdbool.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static long fail_at = -1;    /* index of the allocation to fail; -1: none */
static long n_allocs;        /* allocations seen since armed */

static bool fail_now(void) { return fail_at >= 0 && n_allocs++ == fail_at; }
void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return fail_now() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }

/* A small training-like graph: matmul, elementwise chain (in-place
 * candidates), a reduction, a dead-end node, an extra output, and nodes
 * that rewrite rules replace by nodes they make (a folded constant, an
 * integer x*0 and a sum over a broadcast: src/compile/rewrite_fold.c). */
static kn_tensor *build(kn_ctx *ctx, kn_tensor **extra) {
    int64_t sx[2] = {4, 3}, sw[2] = {3, 5};
    float xd[12], wd[15];
    for (int i = 0; i < 12; i++) xd[i] = (float)i / 12;
    for (int i = 0; i < 15; i++) wd[i] = (float)(i - 7) / 15;
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, sx, xd);
    kn_tensor *w = kn_from_data(ctx, KN_F32, 2, sw, wd);
    kn_tensor *y = kn_matmul(ctx, x, w);
    for (int i = 0; i < 6; i++) y = kn_tanh(ctx, kn_mul(ctx, y, kn_exp(ctx, y)));
    y = kn_mul(ctx, y, kn_add(ctx, kn_scalar(ctx, KN_F32, 0.5), kn_scalar(ctx, KN_F32, 0.25)));
    int32_t id[3] = {1, -2, 3};
    kn_tensor *iv = kn_reshape(ctx, kn_from_data(ctx, KN_I32, 1, (int64_t[1]){3}, id), 2, (int64_t[2]){3, 1});
    kn_tensor *is = kn_sum(ctx, kn_expand(ctx, iv, 2, (int64_t[2]){3, 4}), 1, (int[1]){1}, false);
    kn_tensor *iz = kn_mul(ctx, iv, kn_scalar(ctx, KN_I32, 0));
    y = kn_add(ctx, y, kn_cast(ctx, kn_add(ctx, kn_sum_all(ctx, is), kn_sum_all(ctx, iz)), KN_F32));
    kn_exp(ctx, y);                               /* nobody reads it */
    *extra = kn_square(ctx, y);
    return kn_mean_all(ctx, kn_add(ctx, y, *extra));
}

static double run_plain(void) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *extra, *loss = build(ctx, &extra);
    kn_tensor *outs[2] = {loss, extra};
    kn_plan *p = kn_plan_new(ctx, 2, outs, NULL);
    double v = NAN;
    if (p && kn_plan_run(p) == KN_OK) kn_tensor_read(loss, &v, KN_F64);
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return v;
}

TEST(plan_new_reports_each_failed_allocation) {
    double want = run_plain();
    REQUIRE(isfinite(want), "the graph runs without injection: %s", kn_last_error());
    int failures = 0;
    for (long k = 0; k < 1000; k++) {
        kn_ctx *ctx = kn_ctx_new(NULL);
        REQUIRE(ctx, "kn_ctx_new");
        kn_tensor *extra, *loss = build(ctx, &extra);
        REQUIRE(loss, "%s", kn_last_error());
        kn_tensor *outs[2] = {loss, extra};
        kn_set_error(KN_OK, "none");
        fail_at = k; n_allocs = 0;
        kn_plan *p = kn_plan_new(ctx, 2, outs, NULL);
        fail_at = -1;
        if (p) {                                  /* every allocation after the k-th: done */
            CHECK(n_allocs <= k, "plan built although allocation %ld failed", k);
            double v = NAN;
            CHECK(kn_plan_run(p) == KN_OK && kn_tensor_read(loss, &v, KN_F64) == KN_OK && v == want,
                  "plan after the injection window computes %g, want %g", v, want);
            kn_plan_free(p);
            kn_ctx_free(ctx);
            break;
        }
        failures++;
        CHECK(kn_ctx_status(ctx) == KN_ERR_NOMEM, "allocation %ld: status %d, want KN_ERR_NOMEM", k, (int)kn_ctx_status(ctx));
        CHECK(strstr(kn_last_error(), "out of") != NULL, "allocation %ld: message '%s'", k, kn_last_error());
        kn_ctx_free(ctx);
    }
    CHECK(failures >= 5, "only %d allocations in kn_plan_new were tried", failures);
    printf("  %d allocations of kn_plan_new failed in turn, each reported as KN_ERR_NOMEM\n", failures);
}

KN_TEST_MAIN()
