/* test_epilogue.c: matmul epilogue fusion (src/compile/epilogue.c; the
 * backends' kn_epilogue paths: ref_epilogue.c, cpu_epilogue.c; docs/COMPILER.md
 * "Matmul epilogues").
 *
 * Each case builds y = cast?(res? + act?(a @ b + bias?)) (and the variants the
 * predicate must refuse) three times with the same data: on the reference
 * backend planned with and without fusion, and on the fast backend (the
 * default, KN_BACKEND) with and without fusion (kn_plan_opts.no_fuse). It
 * checks how many nodes went into epilogues, that the fused plans give the
 * unfused plans' bits where nothing else is fused (every backend rounds each
 * step to the node's dtype as the unfused nodes do), and the reference within
 * a dtype tolerance. Shapes are odd (M, K, N not multiples of any tile);
 * operands transposed (non-contiguous), batched, and a 2-d weight shared by
 * a batch (broadcast batch dims);
 * a training graph's gradients through a fused forward.
 *   build/tests/test_epilogue     (KN_TEST_VERBOSE=1: each case's plan)
 */
#include "kn_epitest.h"   // defines: the cases, build, run_case
#include "core/env.h"     // defines: kn_env_reload

TEST(epilogue_forms) {
    kn_backend *be = kn_backend_default();
    /* ref and cpu take every epilogue and match their unfused kernels' bits;
     * another default (KN_BACKEND=cuda) is checked by tests/test_cuda_epilogue.c */
    bool host = be == kn_backend_cpu() || be == kn_backend_ref();
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
        if (host || !quant_weight(&g_cases[i])) run_case(&g_cases[i], be, host, host);
}

/* Matmul prologues (an rms_norm or silu(g) * u computed as the product reads
 * its left operand): the host backends take every one under KN_EPILOGUE=1 */
TEST(prologue_forms) {
    kn_backend *be = kn_backend_default();
    bool host = be == kn_backend_cpu() || be == kn_backend_ref();
    for (size_t i = 0; i < sizeof g_pcases / sizeof g_pcases[0]; i++)
        if (host || g_pcases[i].wk < 3) run_pcase(&g_pcases[i], be, host);
}

/* A training step's graph: loss = mean(gelu(x @ w + b)^2); gradients of w, b
 * with the forward's bias add in the matmul's epilogue (gelu's gradient reads
 * the add, so the chain stops there) equal the unfused plan's. */
static int grad_graph(kn_ctx *ctx, kn_tensor **outs) {
    int64_t xs[2] = {13, 21}, ws[2] = {21, 17}, bs[1] = {17};
    kn_tensor *x = rand_t(ctx, KN_F32, 2, xs, 1), *w = rand_t(ctx, KN_F32, 2, ws, 2), *b = rand_t(ctx, KN_F32, 1, bs, 3);
    kn_set_requires_grad(w, true);
    kn_set_requires_grad(b, true);
    kn_tensor *h = kn_unary(ctx, KN_OP_GELU, kn_add(ctx, kn_matmul(ctx, x, w), b));
    kn_tensor *loss = kn_mean_all(ctx, kn_mul(ctx, h, h));
    if (kn_backward(ctx, loss) != KN_OK) return 0;
    outs[0] = loss; outs[1] = kn_grad(w); outs[2] = kn_grad(b);
    return 3;
}

TEST(gradients_through_fused_forward) {
    kn_backend *bes[2] = {kn_backend_ref(), kn_backend_default()};
    for (int k = 0; k < 2; k++) {
        kn_ctx *cf = kn_ctx_new(&(kn_ctx_opts){.backend = bes[k]}), *cp = kn_ctx_new(&(kn_ctx_opts){.backend = bes[k]});
        kn_tensor *of[3], *op[3];
        REQUIRE(grad_graph(cf, of) == 3 && grad_graph(cp, op) == 3, "graph: %s", kn_last_error());
        kn_plan *pf = kn_plan_new(cf, 3, of, NULL), *pp = kn_plan_new(cp, 3, op, &(kn_plan_opts){.no_fuse = true});
        REQUIRE(pf && pp && !kn_plan_run(pf) && !kn_plan_run(pp), "run: %s", kn_last_error());
        kn_plan_stats st;
        kn_plan_get_stats(pf, &st);
        CHECK(st.epilogues >= 1, "%s: no epilogue in the training graph", bes[k]->name);
        for (int o = 0; o < 3; o++) {
            int64_t n, n2, at;
            float *a = read_f32(of[o], &n), *b = read_f32(op[o], &n2);
            REQUIRE(a && b && n == n2, "read");
            int64_t bad = differ(a, b, n, bes[k] == kn_backend_ref() ? -1 : 1e-5, &at);
            CHECK(!bad, "%s output %d: %lld of %lld differ, first [%lld] %.9g vs %.9g", bes[k]->name, o, (long long)bad,
                  (long long)n, (long long)at, bad ? a[at] : 0, bad ? b[at] : 0);
            free(a); free(b);
        }
        kn_plan_free(pf); kn_plan_free(pp);
        kn_ctx_free(cf); kn_ctx_free(cp);
    }
}

/* The no-fusion switch (KN_NOFUSE is read once: kn_plan_opts here) and eager
 * reads take no epilogue; symbolic rows (a decode/prefill plan) do. */
TEST(symbolic_rows_and_eager) {
    kn_ctx *ctx = kn_ctx_new(NULL), *cr = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()});
    kn_tensor *outs[2];
    kn_ctx *cs[2] = {ctx, cr};
    for (int k = 0; k < 2; k++) {
        int64_t xs[2] = {29, 40}, ws[2] = {40, 35}, bs[1] = {35};
        kn_tensor *x = rand_t(cs[k], KN_F32, 2, xs, 5);
        int T = kn_sym_new(cs[k], "T", 29);
        x = kn_slice_sym(cs[k], x, 0, 0, T);
        kn_tensor *h = kn_add(cs[k], kn_matmul(cs[k], x, rand_t(cs[k], KN_F32, 2, ws, 6)), rand_t(cs[k], KN_F32, 1, bs, 7));
        outs[k] = kn_unary(cs[k], KN_OP_SILU, h);
    }
    kn_plan *p = kn_plan_new(ctx, 1, &outs[0], NULL), *pr = kn_plan_new(cr, 1, &outs[1], &(kn_plan_opts){.no_fuse = true});
    REQUIRE(p && pr, "plan: %s", kn_last_error());
    kn_plan_stats st;
    kn_plan_get_stats(p, &st);
    CHECK(!strcmp(kn_backend_default()->name, "cpu") ? st.epilogues == 1 && st.epilogue_nodes == 2 : 1, "epilogues %d nodes %d", st.epilogues, st.epilogue_nodes);
    int64_t vals[3] = {29, 1, 7};
    for (int r = 0; r < 3; r++) {
        kn_sym_set(ctx, 1, vals[r]); kn_sym_set(cr, 1, vals[r]);
        REQUIRE(!kn_plan_run(p) && !kn_plan_run(pr), "run: %s", kn_last_error());
        float *a = malloc(29 * 35 * 4), *b = malloc(29 * 35 * 4);
        int64_t at;
        REQUIRE(!kn_tensor_read(outs[0], a, KN_F32) && !kn_tensor_read(outs[1], b, KN_F32), "read");
        int64_t bad = differ(a, b, vals[r] * 35, 4e-5, &at);
        CHECK(!bad, "T=%lld: %lld differ at %lld: %g vs %g", (long long)vals[r], (long long)bad, (long long)at, bad ? a[at] : 0, bad ? b[at] : 0);
        free(a); free(b);
    }
    kn_plan_free(p); kn_plan_free(pr);
    kn_ctx_free(ctx); kn_ctx_free(cr);
}

/* add(a @ b, c @ d): both products' only reader is the add; the first
 * matmul takes it (the other product is its residual; gelu after a residual
 * is not of the form), the second runs
 * plainly. Caught in train_llama_one_plan, where both once claimed it. */
TEST(two_matmuls_one_add) {
    kn_tensor *outs[3];
    kn_ctx *cs[3] = {kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()}), kn_ctx_new(NULL), kn_ctx_new(NULL)};
    kn_plan *ps[3];
    for (int k = 0; k < 3; k++) {
        int64_t as[2] = {19, 23}, bs[2] = {23, 31}, cs_[2] = {19, 9}, ds[2] = {9, 31};
        kn_tensor *p = kn_matmul(cs[k], rand_t(cs[k], KN_F32, 2, as, 1), rand_t(cs[k], KN_F32, 2, bs, 2));
        kn_tensor *q = kn_matmul(cs[k], rand_t(cs[k], KN_F32, 2, cs_, 3), rand_t(cs[k], KN_F32, 2, ds, 4));
        outs[k] = kn_unary(cs[k], KN_OP_GELU, kn_add(cs[k], p, q));
        ps[k] = kn_plan_new(cs[k], 1, &outs[k], &(kn_plan_opts){.no_fuse = k == 2});
        REQUIRE(ps[k] && !kn_plan_run(ps[k]), "plan/run %d: %s", k, kn_last_error());
    }
    kn_plan_stats st;
    kn_plan_get_stats(ps[0], &st);
    CHECK(st.epilogues == 1 && st.epilogue_nodes == 1, "ref: %d epilogues, %d nodes", st.epilogues, st.epilogue_nodes);
    float *v[3];
    int64_t n, at;
    for (int k = 0; k < 3; k++) v[k] = read_f32(outs[k], &n);
    int64_t bad = differ(v[1], v[2], n, -1, &at);
    CHECK(!bad, "fused vs unfused: %lld differ", (long long)bad);
    bad = differ(v[1], v[0], n, 4e-5, &at);
    CHECK(!bad, "fused vs ref: %lld differ", (long long)bad);
    for (int k = 0; k < 3; k++) { free(v[k]); kn_plan_free(ps[k]); kn_ctx_free(cs[k]); }
}

/* The residual comes from an elementwise chain fusion would group: fusion
 * does not see the epilogue's read, so a group that would keep it in
 * registers, or compute it after the matmul runs, must go back to the hand
 * kernels (plan.c, epi_conflict). */
TEST(operand_from_fusable_chain) {
    kn_ctx *cs[3] = {kn_ctx_new(NULL), kn_ctx_new(NULL), kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()})};
    kn_tensor *o[3][2];
    kn_plan *ps[3];
    for (int j = 0; j < 3; j++) {
        int64_t as[2] = {21, 30}, bs[2] = {30, 26}, rs[2] = {21, 26};
        kn_tensor *x = rand_t(cs[j], KN_F32, 2, rs, 5);
        kn_tensor *r = kn_mul(cs[j], kn_unary(cs[j], KN_OP_EXP, x), x);        /* r = exp(x) * x */
        kn_tensor *mm = kn_matmul(cs[j], rand_t(cs[j], KN_F32, 2, as, 6), rand_t(cs[j], KN_F32, 2, bs, 7));
        o[j][0] = kn_add(cs[j], kn_unary(cs[j], KN_OP_RELU, mm), r);
        o[j][1] = kn_unary(cs[j], KN_OP_TANH, kn_mul(cs[j], r, x));            /* r also feeds a chain after it */
        ps[j] = kn_plan_new(cs[j], 2, o[j], &(kn_plan_opts){.no_fuse = j == 1});
        REQUIRE(ps[j] && !kn_plan_run(ps[j]), "plan/run %d: %s", j, kn_last_error());
        if (getenv("KN_TEST_VERBOSE")) kn_plan_print(ps[j], stderr);
    }
    kn_plan_stats st;
    kn_plan_get_stats(ps[0], &st);
    if (kn_backend_default() == kn_backend_cpu()) CHECK(st.epilogues == 1 && st.epilogue_nodes == 2, "%d epilogues, %d nodes", st.epilogues, st.epilogue_nodes);
    for (int k = 0; k < 2; k++) {
        int64_t n, at;
        float *v[3];
        for (int j = 0; j < 3; j++) v[j] = read_f32(o[j][k], &n);
        CHECK(!differ(v[0], v[1], n, 1e-6, &at), "output %d: fused vs unfused differ at %lld: %g vs %g", k, (long long)at, v[0][at], v[1][at]);
        CHECK(!differ(v[0], v[2], n, 1e-5, &at), "output %d: fused vs ref differ at %lld", k, (long long)at);
        for (int j = 0; j < 3; j++) free(v[j]);
    }
    for (int j = 0; j < 3; j++) { kn_plan_free(ps[j]); kn_ctx_free(cs[j]); }
}

/* runtime/plan.c's memory rule for the compiler's passes: the arena of the
 * plain plan plus 1/16 of it, or 1 MiB where that is more */
static size_t arena_bound(size_t plain) { return plain + (plain / 16 > ((size_t)1 << 20) ? plain / 16 : ((size_t)1 << 20)); }

/* Operands computed in the plan (casts): an epilogue keeps them alive to the
 * chain's end; the planner leaves out epilogues that would raise the arena,
 * and never puts the result over the dying residual (in place). */
TEST(never_raises_arena) {
    for (int k = 0; k < 6; k++) {
        kn_ctx *cf = kn_ctx_new(NULL), *cp = kn_ctx_new(NULL);
        kn_tensor *o[2];
        kn_ctx *cs[2] = {cf, cp};
        for (int j = 0; j < 2; j++) {
            int64_t as[2] = {37 + k, 29}, bs[2] = {29, 43}, vs[1] = {43}, rs[2] = {37 + k, 43};
            kn_dtype dt = k % 2 ? KN_BF16 : KN_F64;
            kn_tensor *mm = kn_matmul(cs[j], kn_cast(cs[j], rand_t(cs[j], KN_F32, 2, as, 1), dt), kn_cast(cs[j], rand_t(cs[j], KN_F32, 2, bs, 2), dt));
            kn_tensor *h = kn_unary(cs[j], KN_OP_GELU, kn_add(cs[j], mm, kn_cast(cs[j], rand_t(cs[j], KN_F32, 1, vs, 3), dt)));
            o[j] = kn_add(cs[j], h, kn_cast(cs[j], rand_t(cs[j], KN_F32, 2, rs, 4), dt));
            o[j] = k >= 4 ? kn_cast(cs[j], o[j], KN_F32) : kn_unary(cs[j], KN_OP_EXP, o[j]);   /* the chain's end: an output, or an arena value */
        }
        kn_plan *pf = kn_plan_new(cf, 1, &o[0], NULL), *pp = kn_plan_new(cp, 1, &o[1], &(kn_plan_opts){.no_fuse = true});
        REQUIRE(pf && pp && !kn_plan_run(pf) && !kn_plan_run(pp), "run: %s", kn_last_error());
        CHECK(kn_plan_peak_bytes(pf) <= arena_bound(kn_plan_peak_bytes(pp)), "case %d: arena %zu with epilogues > %zu without", k,
              kn_plan_peak_bytes(pf), kn_plan_peak_bytes(pp));
        /* the residual (a cast dying at the chain's end) is never the destination's block */
        for (int r = 0; r < pf->nepi; r++) {
            const kn_epi_rec *e = &pf->epi[r];
            kn_tensor *ro = e->res ? kn__storage_owner(e->res) : NULL;
            if (ro && pf->off[ro->id] >= 0 && pf->off[e->last->id] >= 0)
                CHECK(pf->off[ro->id] != pf->off[e->last->id], "case %d: the residual shares the destination's block", k);
        }
        int64_t n, n2, at;
        float *a = read_f32(o[0], &n), *b = read_f32(o[1], &n2);
        REQUIRE(a && b && n == n2, "read");
        /* within tolerance: without its epilogue the chain may run as a generated kernel (float math) */
        CHECK(!differ(a, b, n, k % 2 ? 3e-2 : 1e-6, &at), "case %d: fused vs unfused differ at %lld", k, (long long)at);
        free(a); free(b);
        kn_plan_free(pf); kn_plan_free(pp);
        kn_ctx_free(cf); kn_ctx_free(cp);
    }
}

/* The arena rule leaves out the record that raises the peak and keeps the
 * others. o1 = A @ B + sum(X @ Y): with its epilogue the product runs at the
 * add, so A and B (casts, 4 MiB each) stay alive while X @ Y (2 MiB, and Y's
 * cast 2 MiB) is computed, which the plain plan places where A and B were:
 * 12 MiB against 8, past the slack. o2 = C @ D + bias, after it, costs
 * nothing. The rule that dropped the last record while the plan needed more
 * than the plain one took both. */
TEST(arena_rule_keeps_the_harmless) {
    kn_ctx *cs[2] = {kn_ctx_new(NULL), kn_ctx_new(NULL)};
    kn_tensor *o[2][2];
    kn_plan *ps[2];
    for (int j = 0; j < 2; j++) {
        kn_ctx *c = cs[j];
        int64_t as[2] = {8, 65536}, bs[2] = {65536, 8}, xs[2] = {64, 64}, ys[2] = {64, 4096}, rs[2] = {8, 8};
        int64_t cs_[2] = {5, 7}, ds[2] = {7, 6}, vs[1] = {6};
        kn_tensor *mm1 = kn_matmul(c, kn_cast(c, rand_t(c, KN_F32, 2, as, 21), KN_F64), kn_cast(c, rand_t(c, KN_F32, 2, bs, 22), KN_F64));
        kn_tensor *big = kn_matmul(c, kn_cast(c, rand_t(c, KN_F32, 2, xs, 23), KN_F64), kn_cast(c, rand_t(c, KN_F32, 2, ys, 24), KN_F64));
        int ax = 1;
        kn_tensor *res = kn_reshape(c, kn_sum(c, big, 1, &ax, false), 2, rs);            /* [64] -> [8, 8] */
        o[j][0] = kn_add(c, mm1, res);
        kn_tensor *mm2 = kn_matmul(c, rand_t(c, KN_F64, 2, cs_, 25), rand_t(c, KN_F64, 2, ds, 26));
        o[j][1] = kn_add(c, mm2, rand_t(c, KN_F64, 1, vs, 27));
        ps[j] = kn_plan_new(c, 2, o[j], &(kn_plan_opts){.no_fuse = j == 1});
        REQUIRE(ps[j] && !kn_plan_run(ps[j]), "plan/run %d: %s", j, kn_last_error());
    }
    kn_backend *be = kn_backend_default();
    if (be->version >= 3 && be->epilogue_ok) {
        CHECK(ps[0]->nepi == 1, "%d epilogues kept (want the bias add of C @ D alone)", ps[0]->nepi);
        CHECK(ps[0]->nepi < 1 || ps[0]->epi[0].mm->shape[0] == 5, "the record kept is not C @ D's");
    }
    CHECK(kn_plan_peak_bytes(ps[0]) <= arena_bound(kn_plan_peak_bytes(ps[1])), "arena %zu with epilogues, %zu without",
          kn_plan_peak_bytes(ps[0]), kn_plan_peak_bytes(ps[1]));
    for (int k = 0; k < 2; k++) {
        int64_t n, n2, at;
        float *a = read_f32(o[0][k], &n), *b = read_f32(o[1][k], &n2);
        REQUIRE(a && b && n == n2, "read");
        CHECK(!differ(a, b, n, 1e-9, &at), "output %d: fused vs unfused differ at %lld", k, (long long)at);
        free(a); free(b);
    }
    for (int j = 0; j < 2; j++) { kn_plan_free(ps[j]); kn_ctx_free(cs[j]); }
}

/* A residual computed in the plan that dies at the chain's end, the result an
 * arena value: the add would take the residual's block in place unfused; with
 * the epilogue it must not (backends never see an aliased residual). */
TEST(residual_never_in_place) {
    kn_ctx *cs[3] = {kn_ctx_new(NULL), kn_ctx_new(NULL), kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_ref()})};
    kn_tensor *o[3];
    kn_plan *ps[3];
    for (int j = 0; j < 3; j++) {
        int64_t as[2] = {23, 31}, bs[2] = {31, 27}, rs[2] = {23, 27};
        kn_tensor *res = kn_unary(cs[j], KN_OP_EXP, rand_t(cs[j], KN_F32, 2, rs, 9));
        kn_tensor *y = kn_add(cs[j], kn_unary(cs[j], KN_OP_SILU, kn_matmul(cs[j], rand_t(cs[j], KN_F32, 2, as, 7), rand_t(cs[j], KN_F32, 2, bs, 8))), res);
        o[j] = kn_unary(cs[j], KN_OP_TANH, y);
        ps[j] = kn_plan_new(cs[j], 1, &o[j], &(kn_plan_opts){.no_fuse = j == 1});
        REQUIRE(ps[j] && !kn_plan_run(ps[j]), "plan/run %d: %s", j, kn_last_error());
    }
    int seen = 0;
    for (int j = 0; j < 3; j += 2)
        for (int r = 0; r < ps[j]->nepi; r++) {
            const kn_epi_rec *e = &ps[j]->epi[r];
            REQUIRE(e->res && ps[j]->off[e->res->id] >= 0 && ps[j]->off[e->last->id] >= 0, "plan %d: residual or result not in the arena", j);
            CHECK(ps[j]->off[e->res->id] != ps[j]->off[e->last->id], "plan %d: the residual shares the destination's block", j);
            seen++;
        }
    kn_backend *be = kn_backend_default();
    CHECK(seen == (be->version >= 3 && be->epilogue_ok ? 2 : 1), "%d epilogues", seen);
    int64_t n, at;
    float *v[3];
    for (int j = 0; j < 3; j++) v[j] = read_f32(o[j], &n);
    CHECK(!differ(v[0], v[1], n, 1e-6, &at), "fused vs unfused differ at %lld", (long long)at);
    CHECK(!differ(v[0], v[2], n, 1e-5, &at), "fused vs ref differ at %lld", (long long)at);
    for (int j = 0; j < 3; j++) { free(v[j]); kn_plan_free(ps[j]); kn_ctx_free(cs[j]); }
}

int main(void) {
    setenv("KN_EPILOGUE", "1", 1);   /* epilogues are opt-in (docs/COMPILER.md, "Matmul epilogues") */
    unsetenv("KN_NOFUSE");           /* a test of the compiler itself: it compares fused and no_fuse plans even in a KN_NOFUSE=1 suite run */
    kn_env_reload();
    return kn_test_main();
}
