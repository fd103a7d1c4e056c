/* test_exec.c: what the runtime tells a backend about a node besides its
 * views (kn_exec, src/runtime/exec.c).
 *
 * kn_exec.fixed says which sources no node of the plan writes: the CUDA
 * backend then loads them before the kernel ahead of the node has finished
 * (gemv.cu, gemv_quant.cu). A source marked fixed that the plan writes
 * would be read early and stale, so every way a plan writes a leaf is
 * checked here: an effect's own storage, the sources it writes in place,
 * and a view of either. */
#include "kn_test.h"
#include "kiln.h"
#include "runtime/runtime.h"

static kn_tensor *leaf(kn_ctx *ctx, int64_t r, int64_t c) {
    int64_t s[2] = {r, c};
    float d[64];
    for (int i = 0; i < r * c && i < 64; i++) d[i] = (float)(i % 7) - 3.f;
    return r * c <= 64 ? kn_from_data(ctx, KN_F32, 2, s, d) : NULL;
}

/* the fixed bits of the exec of each matmul of p, in schedule order */
static int matmul_bits(kn_plan *p, unsigned *bits, int max) {
    int n = 0;
    for (int i = 0; i < p->n && n < max; i++) {
        kn_tensor *t = p->order[i];
        if (t->op != KN_OP_MATMUL) continue;
        kn_exec e;
        kn_epilogue epi;
        int bad;
        if (!kn__exec_of(p, t, &e, &epi, &bad)) return -1;
        bits[n++] = e.fixed;
    }
    return n;
}

TEST(fixed_sources) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    REQUIRE(ctx, "context");
    kn_tensor *x = leaf(ctx, 1, 8), *w = leaf(ctx, 4, 8), *cache = leaf(ctx, 3, 8), *st = leaf(ctx, 4, 8);
    REQUIRE(x && w && cache && st, "leaves: %s", kn_last_error());
    int32_t pos = 1;
    int64_t one[1] = {1};
    kn_tensor *idx = kn_from_data(ctx, KN_I32, 1, one, &pos);
    kn_tensor *wt = kn_transpose(ctx, w, 0, 1);
    kn_tensor *o[5];
    o[0] = kn_matmul(ctx, x, wt);                                  /* leaf x, a view of leaf w: both fixed */
    o[1] = kn_index_copy(ctx, cache, 0, idx, x);                   /* writes cache */
    o[2] = kn_matmul(ctx, x, kn_transpose(ctx, cache, 0, 1));       /* cache is written: not fixed */
    o[3] = kn_matmul(ctx, x, kn_transpose(ctx, kn_relu(ctx, w), 0, 1));   /* a computed operand: not fixed */
    kn_tensor *a = kn_assign(ctx, st, kn_mul(ctx, w, kn_scalar(ctx, KN_F32, 2)));   /* st written by an effect */
    o[4] = kn_add(ctx, kn_matmul(ctx, x, kn_transpose(ctx, st, 0, 1)), kn_sum(ctx, a, 0, NULL, false));
    for (int i = 0; i < 5; i++) REQUIRE(o[i], "graph %d: %s", i, kn_last_error());
    kn_plan_opts op = {0};
    op.no_rewrite = true;                                          /* keep every matmul as built */
    kn_plan *p = kn_plan_new(ctx, 5, o, &op);
    REQUIRE(p, "plan: %s", kn_last_error());
    unsigned b[8];
    int n = matmul_bits(p, b, 8);
    REQUIRE(n == 4, "%d matmuls", n);
    /* the schedule may order the independent matmuls any way: find each by its bits */
    int both = 0, first = 0, none = 0;
    for (int i = 0; i < n; i++) {
        if (b[i] == 3u) both++;
        else if (b[i] == 1u) first++;
        else if (b[i] == 0u) none++;
    }
    CHECK(both == 1, "x @ w^T: %d with both fixed (bits %u %u %u %u)", both, b[0], b[1], b[2], b[3]);
    CHECK(first == 3, "%d with only x fixed (cache, relu(w), st are not)", first);
    CHECK(none == 0, "x is never written: %d", none);
    kn_plan_free(p);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
