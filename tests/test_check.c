/* test_check.c: KN_CHECK (src/runtime/check.c), the differential check of a
 * device backend against the reference, on a fake device: host memory, the
 * device field KN_DEVICE_CUDA, compute by the cpu backend, except that it
 * can be told to get one op kind wrong (element 0 of its output + 1).
 *
 * Checked: a correct device reports nothing and every computing node is
 * checked; a wrong MUL is reported as the first and only differing node
 * (later nodes read the device's own inputs, so the error is not charged to
 * them); bf16 outputs do not trip the check on rounding alone; non-contiguous
 * sources (a transposed view) are copied by their span; KN_CHECK unset
 * checks nothing.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_backend.h"
#include "core/env.h"            /* defines: kn_env_reload */
#include "runtime/runtime.h"     /* defines: kn__check_counts */
#include <stdlib.h>

static kn_op g_wrong = KN_OP_NONE;
static kn_backend *cpu(void) { return kn_backend_cpu(); }
static void *fd_alloc(kn_backend *be, size_t n) { (void)be; return cpu()->alloc(cpu(), n); }
static void fd_free(kn_backend *be, void *p) { (void)be; cpu()->free(cpu(), p); }
static kn_status fd_copy(kn_backend *be, void *d, const void *s, size_t n) { (void)be; memcpy(d, s, n); return KN_OK; }
static kn_status fd_compute(kn_backend *be, const kn_exec *e) {
    (void)be;
    kn_status st = cpu()->compute(cpu(), e);
    if (st == KN_OK && e->node->op == g_wrong && e->dst.dtype == KN_F32) ((float *)e->dst.data)[0] += 1.f;
    return st;
}
static kn_backend g_fake = {.version = KN_BACKEND_VERSION, .name = "fake-device", .device = KN_DEVICE_CUDA,
                            .alloc = fd_alloc, .free = fd_free, .copy_in = fd_copy, .copy_out = fd_copy,
                            .compute = fd_compute};

/* z = (x * x + w^T) as bf16, then its sum in f32: x [5, 7], w [7, 5] */
static int run_graph(int *checked, int *differ, kn_op *first) {
    kn_ctx *c = kn_ctx_new(&(kn_ctx_opts){.backend = &g_fake});
    kn_tensor *x = kn_input(c, KN_F32, 2, (int64_t[]){5, 7}), *w = kn_input(c, KN_F32, 2, (int64_t[]){7, 5});
    kn_tensor *y = kn_add(c, kn_mul(c, x, x), kn_transpose(c, w, 0, 1));
    kn_tensor *z = kn_cast(c, y, KN_BF16);
    kn_tensor *s = kn_sum(c, kn_cast(c, z, KN_F32), 0, NULL, false);
    kn_plan_opts o = {.no_rewrite = true, .no_fuse = true};
    kn_plan *p = s ? kn_plan_new(c, 1, &s, &o) : NULL;
    float xv[35], wv[35];
    for (int i = 0; i < 35; i++) { xv[i] = (float)((i * 37) % 11) / 3.f - 1.f; wv[i] = (float)((i * 13) % 7) / 5.f; }
    int rc = !p || kn_tensor_write(x, xv, KN_F32) || kn_tensor_write(w, wv, KN_F32) || kn_plan_run(p);
    if (rc) fprintf(stderr, "  %s\n", kn_last_error());
    kn__check_counts(checked, differ, first);
    kn_plan_free(p);
    kn_ctx_free(c);
    return rc;
}

static void set_check(const char *v) {
    if (v) setenv("KN_CHECK", v, 1); else unsetenv("KN_CHECK");
    kn_env_reload();
}

TEST(check_quiet_on_a_correct_device) {
    int checked, differ;
    kn_op first;
    set_check("1");
    g_wrong = KN_OP_NONE;
    CHECK(run_graph(&checked, &differ, &first) == 0, "run");
    CHECK(checked >= 5 && differ == 0, "checked %d nodes, %d differ (want >= 5, 0)", checked, differ);
    set_check(NULL);
}

TEST(check_names_the_wrong_kernel) {
    int checked, differ;
    kn_op first;
    set_check("1");
    g_wrong = KN_OP_MUL;
    CHECK(run_graph(&checked, &differ, &first) == 0, "run");
    CHECK(differ == 1 && first == KN_OP_MUL, "%d nodes differ, the first %s (want 1, mul)", differ, kn_op_name(first));
    g_wrong = KN_OP_ADD;          /* reads a transposed view */
    CHECK(run_graph(&checked, &differ, &first) == 0, "run");
    CHECK(differ == 1 && first == KN_OP_ADD, "%d nodes differ, the first %s (want 1, add)", differ, kn_op_name(first));
    g_wrong = KN_OP_NONE;
    set_check(NULL);
}

TEST(check_off_by_default) {
    int checked, differ;
    kn_op first;
    set_check(NULL);
    g_wrong = KN_OP_MUL;
    CHECK(run_graph(&checked, &differ, &first) == 0, "run");
    CHECK(checked == 0 && differ == 0, "KN_CHECK unset: %d checked", checked);
    g_wrong = KN_OP_NONE;
}

KN_TEST_MAIN()
