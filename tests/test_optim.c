/* test_optim.c: optimizers built as graph nodes and replayed: hand-computed
 * updates on a quadratic (SGD momentum/Nesterov, Adam), parameter groups with
 * their own lr and weight decay, lr changes between runs, global-norm
 * clipping, gradient accumulation equal to one big batch, schedules, errors.
 * (PyTorch parity of every optimizer is in test_nn_torch.c.) */
#include "kn_test.h"
#include "kn_adamtest.h"      /* kn_adam_steps */
#include "kiln.h"
#include "kiln_nn.h"
#include "graph/graph.h"          /* kn__adam_update: its argument checks */
#include <string.h>

static double item(kn_tensor *t) { return kn_item(t); }
static void readv(kn_tensor *t, double *v) { kn_tensor_read(t, v, KN_F64); }

/* loss = 0.5 * sum(a * p^2): grad = a * p */
typedef struct { kn_ctx *ctx; kn_tensor *p, *loss; kn_optim *o; kn_plan *plan; } quad;
static bool quad_new(quad *q, const kn_optim_cfg *cfg, const double *p0, const double *a, int n) {
    q->ctx = kn_ctx_new(NULL);
    int64_t s = n;
    q->p = kn_param(q->ctx, KN_F32, 1, &s);
    kn_tensor_write(q->p, p0, KN_F64);
    kn_tensor *at = kn_empty(q->ctx, KN_F32, 1, &s);
    kn_tensor_write(at, a, KN_F64);
    q->loss = kn_mul_scalar(q->ctx, kn_sum_all(q->ctx, kn_mul(q->ctx, at, kn_square(q->ctx, q->p))), 0.5);
    if (kn_backward(q->ctx, q->loss)) return false;
    q->o = kn_optim_new_empty(q->ctx, cfg);
    if (!q->o || kn_optim_add_group(q->o, 1, &q->p, cfg->lr, cfg->weight_decay) != 0) return false;
    kn_tensor *outs[8]; int k = 0;
    outs[k++] = q->loss;
    int ne = kn_optim_build(q->o, NULL, outs + 1, 7);
    if (ne <= 0) return false;
    q->plan = kn_plan_new(q->ctx, 1 + ne, outs, NULL);
    return q->plan != NULL;
}
static void quad_free(quad *q) { kn_plan_free(q->plan); kn_optim_free(q->o); kn_ctx_free(q->ctx); }
static bool quad_step(quad *q) { return !kn_optim_prepare(q->o) && !kn_plan_run(q->plan); }

TEST(sgd_momentum_nesterov_by_hand) {
    double p0[3] = {1, -2, 0.5}, a[3] = {1, 0.5, 2};
    for (int nest = 0; nest < 2; nest++) {
        kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_SGD);
        c.lr = 0.1; c.momentum = 0.9; c.nesterov = nest; c.weight_decay = 0.05;
        quad q;
        REQUIRE(quad_new(&q, &c, p0, a, 3), "%s", kn_last_error());
        double p[3], buf[3] = {0};
        memcpy(p, p0, sizeof p);
        for (int s = 0; s < 5; s++) {
            REQUIRE(quad_step(&q), "%s", kn_last_error());
            for (int i = 0; i < 3; i++) {
                double g = a[i] * p[i] + 0.05 * p[i];
                buf[i] = s == 0 ? g : 0.9 * buf[i] + g;
                double d = nest ? g + 0.9 * buf[i] : buf[i];
                p[i] -= 0.1 * d;
            }
        }
        double got[3];
        readv(q.p, got);
        for (int i = 0; i < 3; i++) CHECK(fabs(got[i] - p[i]) < 1e-6, "%s p[%d] %g vs %g", nest ? "nesterov" : "momentum", i, got[i], p[i]);
        double mb[3];
        readv(kn_optim_state(q.o, 0, "momentum_buffer"), mb);
        CHECK(fabs(mb[0] - buf[0]) < 1e-6, "momentum buffer state");
        CHECK(kn_optim_step_count(q.o) == 5, "step count");
        quad_free(&q);
    }
}

TEST(adam_by_hand_and_lr_changes) {
    double p0[2] = {1, -3}, a[2] = {2, 0.1};
    kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_ADAM);
    c.lr = 0.1;
    quad q;
    REQUIRE(quad_new(&q, &c, p0, a, 2), "%s", kn_last_error());
    double p[2] = {1, -3}, m[2] = {0}, v[2] = {0};
    double lrs[4] = {0.1, 0.1, 0.05, 0.2};
    for (int s = 0; s < 4; s++) {
        kn_optim_set_lr(q.o, -1, lrs[s]);
        REQUIRE(quad_step(&q), "%s", kn_last_error());
        for (int i = 0; i < 2; i++) {
            double g = a[i] * p[i];
            m[i] = 0.9 * m[i] + 0.1 * g; v[i] = 0.999 * v[i] + 0.001 * g * g;
            double mh = m[i] / (1 - pow(0.9, s + 1)), vh = v[i] / (1 - pow(0.999, s + 1));
            p[i] -= (double)(float)lrs[s] * mh / (sqrt(vh) + 1e-8);
        }
    }
    double got[2];
    readv(q.p, got);
    for (int i = 0; i < 2; i++) CHECK(fabs(got[i] - p[i]) < 2e-6, "adam p[%d] %.8f vs %.8f", i, got[i], p[i]);
    CHECK(fabs(kn_optim_get_lr(q.o, 0) - 0.2) < 1e-12, "get lr");
    /* first Adam step moves every coordinate by ~lr (sign of the gradient) */
    CHECK(fabs(item(q.loss)) > 0, "loss read");
    quad_free(&q);
}

TEST(param_groups_and_decay_helper) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(3);
    kn_module *lin = kn_linear_new(ctx, 3, 2, true);
    kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_SGD);
    c.lr = 0.5; c.weight_decay = 0.1;
    kn_optim *o = kn_optim_new_decay_groups(ctx, lin, &c);
    REQUIRE(o && kn_optim_n_params(o) == 2, "%s", kn_last_error());
    CHECK(kn_optim_param(o, 0) == kn_module_find(lin, "weight") && kn_optim_param(o, 1) == kn_module_find(lin, "bias"), "decay: weight, no-decay: bias");
    kn_optim_set_lr(o, 1, 0.25);                      /* bias group gets its own lr */
    /* zero gradient: only weight decay moves the weight, the bias stays */
    kn_tensor *g[2] = {kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 3}), kn_zeros(ctx, KN_F32, 1, (int64_t[]){2})};
    kn_tensor *outs[8];
    int ne = kn_optim_build(o, g, outs, 8);
    REQUIRE(ne == 2, "%d effects: %s", ne, kn_last_error());
    double w0[6], b0[2], w1[6], b1[2];
    readv(kn_module_find(lin, "weight"), w0); readv(kn_module_find(lin, "bias"), b0);
    kn_plan *pl = kn_plan_new(ctx, ne, outs, NULL);
    REQUIRE(pl && !kn_optim_prepare(o) && !kn_plan_run(pl), "%s", kn_last_error());
    readv(kn_module_find(lin, "weight"), w1); readv(kn_module_find(lin, "bias"), b1);
    for (int i = 0; i < 6; i++) CHECK(fabs(w1[i] - w0[i] * (1 - 0.5 * 0.1)) < 1e-6, "decayed weight");
    CHECK(b1[0] == b0[0] && b1[1] == b0[1], "no decay on bias");
    /* a parameter can be in one group only */
    kn_tensor *w = kn_module_find(lin, "weight");
    CHECK(kn_optim_add_group(o, 1, &w, 0.1, 0) < 0 && strstr(kn_last_error(), "already"), "%s", kn_last_error());
    kn_plan_free(pl); kn_optim_free(o); kn_module_free(lin);
    kn_ctx_free(ctx);
}

TEST(grad_clipping) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *p[2] = {kn_param(ctx, KN_F32, 1, (int64_t[]){2}), kn_param(ctx, KN_F32, 1, (int64_t[]){1})};
    float z[2] = {0, 0};
    kn_tensor_write(p[0], z, KN_F32); kn_tensor_write(p[1], z, KN_F32);
    kn_tensor *g[2] = {kn_input(ctx, KN_F32, 1, (int64_t[]){2}), kn_input(ctx, KN_F32, 1, (int64_t[]){1})};
    kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_SGD);
    c.lr = 1; c.clip_norm = 1.0;
    kn_optim *o = kn_optim_new_empty(ctx, &c);
    kn_optim_add_group(o, 2, p, 1, 0);
    kn_tensor *outs[4];
    int ne = kn_optim_build(o, g, outs, 3);
    REQUIRE(ne == 2 && kn_optim_grad_norm(o), "%s", kn_last_error());
    outs[ne++] = kn_optim_grad_norm(o);
    kn_plan *pl = kn_plan_new(ctx, ne, outs, NULL);
    REQUIRE(pl, "%s", kn_last_error());
    float g0[2] = {3, 0}, g1[1] = {4};                 /* norm 5 -> scaled by 1/5 */
    kn_tensor_write(g[0], g0, KN_F32); kn_tensor_write(g[1], g1, KN_F32);
    REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(pl), "%s", kn_last_error());
    double a[2], b[1];
    readv(p[0], a); readv(p[1], b);
    CHECK(fabs(item(outs[2]) - 5) < 1e-6, "norm %g", item(outs[2]));
    CHECK(fabs(a[0] + 0.6) < 1e-5 && fabs(b[0] + 0.8) < 1e-5, "clipped update %g %g", a[0], b[0]);
    float s0[2] = {0.3f, 0}, s1[1] = {0.4f};           /* norm 0.5: unchanged */
    kn_tensor_write(g[0], s0, KN_F32); kn_tensor_write(g[1], s1, KN_F32);
    REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(pl), "%s", kn_last_error());
    readv(p[0], a);
    CHECK(fabs(a[0] + 0.9) < 1e-5, "small grads not clipped: %g", a[0]);
    kn_plan_free(pl); kn_optim_free(o);
    kn_ctx_free(ctx);
}

/* K micro-batches accumulated with scale 1/K == one step on the whole batch */
TEST(grad_accumulation_matches_big_batch) {
    double results[2][4];
    for (int mode = 0; mode < 2; mode++) {
        kn_ctx *ctx = kn_ctx_new(NULL);
        kn_nn_manual_seed(8); kn_test_seed(8);
        kn_module *lin = kn_linear_new(ctx, 3, 1, true);
        kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_ADAMW);
        c.lr = 0.05;
        kn_optim *o = kn_optim_new(ctx, lin, &c);
        float X[12 * 3], Y[12];
        for (int i = 0; i < 36; i++) X[i] = (float)kn_test_uniform(-1, 1);
        for (int i = 0; i < 12; i++) Y[i] = X[i * 3] - 2 * X[i * 3 + 1] + 0.5f;
        int64_t nb = mode == 0 ? 12 : 4;
        kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){nb, 3}), *y = kn_input(ctx, KN_F32, 2, (int64_t[]){nb, 1});
        kn_tensor *loss = kn_mse_loss(ctx, kn_module_forward(lin, x), y, KN_REDUCE_MEAN);
        REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
        kn_tensor *outs[16];
        for (int step = 0; step < 3; step++) {
            if (mode == 0) {
                static kn_plan *pl;
                if (step == 0) {
                    int ne = kn_optim_build(o, NULL, outs, 16);
                    REQUIRE(ne > 0, "%s", kn_last_error());
                    pl = kn_plan_new(ctx, ne, outs, NULL);
                }
                kn_tensor_write(x, X, KN_F32); kn_tensor_write(y, Y, KN_F32);
                REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(pl), "%s", kn_last_error());
                if (step == 2) kn_plan_free(pl);
            } else {
                static kn_plan *micro, *stepp;
                static kn_grad_accum *acc;
                if (step == 0) {
                    acc = kn_grad_accum_new(ctx, o);
                    int n1 = kn_grad_accum_add(acc, 1.0 / 3, outs, 16);
                    REQUIRE(n1 == 2, "%s", kn_last_error());
                    micro = kn_plan_new(ctx, n1, outs, NULL);
                    int n2 = kn_optim_build(o, kn_grad_accum_buffers(acc), outs, 16);
                    int n3 = kn_grad_accum_zero(acc, outs + n2, 16 - n2);
                    REQUIRE(n2 > 0 && n3 == 2, "%s", kn_last_error());
                    stepp = kn_plan_new(ctx, n2 + n3, outs, NULL);
                    REQUIRE(micro && stepp, "%s", kn_last_error());
                }
                for (int k = 0; k < 3; k++) {
                    kn_tensor_write(x, X + k * 12, KN_F32); kn_tensor_write(y, Y + k * 4, KN_F32);
                    REQUIRE(!kn_plan_run(micro), "%s", kn_last_error());
                }
                REQUIRE(!kn_optim_prepare(o) && !kn_plan_run(stepp), "%s", kn_last_error());
                double zb[3];
                readv(kn_grad_accum_buffers(acc)[0], zb);
                CHECK(zb[0] == 0 && zb[1] == 0 && zb[2] == 0, "buffers zeroed after the step");
                if (step == 2) { kn_plan_free(micro); kn_plan_free(stepp); kn_grad_accum_free(acc); }
            }
        }
        readv(kn_module_find(lin, "weight"), results[mode]);
        readv(kn_module_find(lin, "bias"), results[mode] + 3);
        kn_optim_free(o); kn_module_free(lin);
        kn_ctx_free(ctx);
    }
    for (int i = 0; i < 4; i++) CHECK(fabs(results[0][i] - results[1][i]) < 1e-5, "param %d: big batch %g vs accumulated %g", i, results[0][i], results[1][i]);
}

TEST(schedules) {
    CHECK(kn_sched_constant(99, 0.1) == 0.1, "constant");
    CHECK(fabs(kn_sched_step(25, 1.0, 10, 0.5) - 0.25) < 1e-12, "step");
    CHECK(fabs(kn_sched_cosine(0, 1.0, 0.1, 10, 110) - 0.1) < 1e-12, "warmup start lr*(1)/10");
    CHECK(fabs(kn_sched_cosine(9, 1.0, 0.1, 10, 110) - 1.0) < 1e-12, "warmup end");
    CHECK(fabs(kn_sched_cosine(10, 1.0, 0.1, 10, 110) - 1.0) < 1e-12, "cosine start");
    CHECK(fabs(kn_sched_cosine(60, 1.0, 0.1, 10, 110) - 0.55) < 1e-12, "cosine middle");
    CHECK(fabs(kn_sched_cosine(500, 1.0, 0.1, 10, 110) - 0.1) < 1e-12, "after total");
    CHECK(fabs(kn_sched_linear(60, 1.0, 0.0, 10, 110) - 0.5) < 1e-12, "linear middle");
    /* OneCycleLR(max_lr=1, total_steps=100, pct_start=0.3, div 25, final_div 1e4) */
    CHECK(fabs(kn_sched_one_cycle(0, 1.0, 100, 0.3, 25, 1e4) - 0.04) < 1e-12, "one-cycle start");
    CHECK(fabs(kn_sched_one_cycle(29, 1.0, 100, 0.3, 25, 1e4) - 1.0) < 1e-12, "one-cycle peak");
    CHECK(fabs(kn_sched_one_cycle(99, 1.0, 100, 0.3, 25, 1e4) - 0.04 / 1e4) < 1e-12, "one-cycle end");
    double mid = kn_sched_one_cycle(64, 1.0, 100, 0.3, 25, 1e4);
    double want = 4e-6 + (1 - 4e-6) * 0.5 * (1 + cos(M_PI * 35.0 / 70.0));
    CHECK(fabs(mid - want) < 1e-12, "one-cycle descent %g vs %g", mid, want);
}

/* The fused adam_update node (one per parameter) against the composite
 * update (cfg.unfused), both on the fast CPU backend, and the fused node on
 * the reference backend: p, exp_avg and exp_avg_sq after 7 steps with an lr
 * change, Adam (coupled decay) and AdamW, a small and a threaded size. */
TEST(fused_adam_matches_composite) {
    kn_test_seed(31);
    int sizes[2] = {5, 10007};
    for (int kind = 0; kind < 2; kind++)
        for (int si = 0; si < 2; si++) {
            int n = sizes[si];
            double *p0 = malloc(sizeof(double) * n), *a = malloc(sizeof(double) * n), *r[3];
            for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * 3 * n);
            for (int i = 0; i < n; i++) { p0[i] = kn_test_uniform(-2, 2); a[i] = kn_test_uniform(0.01, 3); }
            kn_optim_cfg c = kn_optim_defaults(kind ? KN_OPTIM_ADAMW : KN_OPTIM_ADAM);
            c.lr = 0.05; c.weight_decay = kind ? 0.05 : 0.1;
            kn_optim_cfg cu = c;
            cu.unfused = true;
            REQUIRE(kn_adam_steps(kn_backend_cpu(), &cu, 0, n, false, p0, a, r[0]), "composite: %s", kn_last_error());
            REQUIRE(kn_adam_steps(kn_backend_cpu(), &c, 0, n, false, p0, a, r[1]), "fused cpu: %s", kn_last_error());
            REQUIRE(kn_adam_steps(kn_backend_ref(), &c, 0, n, false, p0, a, r[2]), "fused ref: %s", kn_last_error());
            for (int b = 1; b < 3; b++) {
                double worst = 0;
                for (int i = 0; i < 3 * n; i++) {
                    double d = fabs(r[b][i] - r[0][i]) / (fabs(r[0][i]) + 1e-3);
                    if (!(d <= worst)) worst = d;       /* NaN sticks */
                }
                /* fused cpu: the same f32 operations; ref: double throughout (the
                 * composite rounds each intermediate to f32) */
                CHECK(worst < (b == 1 ? 1e-6 : 1e-4), "%s n=%d %s vs composite: worst rel diff %.3g",
                      kind ? "AdamW" : "Adam", n, b == 1 ? "fused cpu" : "fused ref", worst);
            }
            free(p0); free(a);
            for (int i = 0; i < 3; i++) free(r[i]);
        }
}

/* The multi-tensor step: 70 parameters' Adam/AdamW updates run as batches
 * (kn_backend.compute_batch) on the cpu backend, bit for bit what they give
 * one node at a time (KN_BATCH=0), and within the double reference's 1e-4. */
TEST(batched_adam_matches_one_at_a_time) {
    int64_t len = kn_am_len();
    double *r[3];
    for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * (size_t)len);
    for (int kind = 0; kind < 2; kind++) {
        kn_optim_cfg c = kn_optim_defaults(kind ? KN_OPTIM_ADAMW : KN_OPTIM_ADAM);
        c.lr = 0.05; c.weight_decay = kind ? 0.05 : 0.1;
        int nb[3];
        REQUIRE(kn_adam_many(kn_backend_cpu(), &c, r[0], &nb[0]), "cpu batched: %s", kn_last_error());
        bool ok = kn_adam_many_unbatched(kn_backend_cpu(), &c, r[1], &nb[1]);
        REQUIRE(ok, "cpu one at a time: %s", kn_last_error());
        REQUIRE(kn_adam_many(kn_backend_ref(), &c, r[2], &nb[2]), "ref: %s", kn_last_error());
        CHECK(nb[0] == KN_AM_NP && nb[1] == 0 && nb[2] == 0, "batched nodes: cpu %d (want %d), KN_BATCH=0 %d, ref %d",
              nb[0], KN_AM_NP, nb[1], nb[2]);
        int64_t ndiff = 0;
        double wr = 0;
        for (int64_t i = 0; i < len; i++) {
            ndiff += memcmp(&r[0][i], &r[1][i], sizeof(double)) != 0;
            double d = fabs(r[0][i] - r[2][i]) / (fabs(r[2][i]) + 1e-3);
            if (!(d <= wr)) wr = d;
        }
        CHECK(ndiff == 0, "%s: %lld of %lld values differ between batched and one-at-a-time", kind ? "AdamW" : "Adam",
              (long long)ndiff, (long long)len);
        CHECK(wr < 1e-4, "%s: batched vs ref worst rel diff %.3g", kind ? "AdamW" : "Adam", wr);
    }
    for (int i = 0; i < 3; i++) free(r[i]);
}

TEST(optim_errors_and_state) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_optim_cfg c = kn_optim_defaults(KN_OPTIM_SGD);
    c.nesterov = true;
    CHECK(kn_optim_new_empty(ctx, &c) == NULL && strstr(kn_last_error(), "nesterov"), "%s", kn_last_error());
    c = kn_optim_defaults(KN_OPTIM_ADAM); c.beta1 = 1.5;
    CHECK(kn_optim_new_empty(ctx, &c) == NULL && strstr(kn_last_error(), "optimizer"), "%s", kn_last_error());
    c = kn_optim_defaults(KN_OPTIM_ADAM);
    kn_optim *o = kn_optim_new_empty(ctx, &c);
    kn_tensor *p = kn_param(ctx, KN_F32, 1, (int64_t[]){4});
    kn_tensor *notleaf = kn_add_scalar(ctx, p, 1);
    CHECK(kn_optim_add_group(o, 1, &notleaf, 0.1, 0) < 0 && strstr(kn_last_error(), "leaf"), "%s", kn_last_error());
    CHECK(kn_optim_add_group(o, 1, &p, 0.1, 0) == 0, "%s", kn_last_error());
    CHECK(kn_optim_state(o, 0, "exp_avg") && kn_optim_state(o, 0, "exp_avg_sq") && !kn_optim_state(o, 0, "momentum_buffer"), "state names");
    kn_tensor *g = kn_zeros(ctx, KN_F32, 1, (int64_t[]){4});
    kn_tensor *outs[2];
    CHECK(kn_optim_build(o, &g, outs, 0) < 0 && strstr(kn_last_error(), "room"), "too small out[]: %s", kn_last_error());
    kn_tensor *bad = kn_zeros(ctx, KN_F32, 1, (int64_t[]){3});
    kn_tensor *outs3[3];
    CHECK(kn_optim_build(o, &bad, outs3, 3) < 0 && strstr(kn_last_error(), "shape"), "%s", kn_last_error());
    CHECK(!kn_optim_set_step_count(o, 41) && !kn_optim_prepare(o) && kn_optim_step_count(o) == 42, "resume step count");
    /* the fused node refuses mismatched moments, a non-[3] coefficient tensor and a lazy parameter */
    kn_tensor *m4 = kn_zeros(ctx, KN_F32, 1, (int64_t[]){4}), *c3 = kn_zeros(ctx, KN_F32, 1, (int64_t[]){3});
    kn_ctx_clear_status(ctx);
    CHECK(!kn__adam_update(ctx, p, g, bad, m4, c3, 0.9, 0.999, 1e-8, 0) && strstr(kn_last_error(), "adam_update"),
          "moment shape: %s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn__adam_update(ctx, p, g, m4, m4, m4, 0.9, 0.999, 1e-8, 0) && strstr(kn_last_error(), "coefficients"),
          "coefficients: %s", kn_last_error());
    kn_ctx_clear_status(ctx);
    CHECK(!kn__adam_update(ctx, kn_add_scalar(ctx, p, 1), g, m4, m4, c3, 0.9, 0.999, 1e-8, 0) &&
          strstr(kn_last_error(), "materialised"), "lazy parameter: %s", kn_last_error());
    kn_optim_free(o);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
