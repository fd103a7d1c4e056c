/* kn_adamtest.h: seven Adam/AdamW steps of one parameter on a given
 * backend, for the tests that compare optimizer paths (test_optim.c: fused
 * vs composite on the CPU and the reference; test_cuda_ops.c: the GPU's
 * float4 kernel). loss = 0.5 * sum(a * p^2), the lr halved before step 5;
 * out gets p, exp_avg and exp_avg_sq (3 * R * C doubles, or 3 * C when
 * R == 0: a 1-d [C] parameter). With tr, p [R, C] meets a [C, R] weight
 * through a transposed view, so its gradient arrives strided. */
#ifndef KN_ADAMTEST_H
#define KN_ADAMTEST_H
#include "kiln.h"
#include "kiln_nn.h"
#include "core/env.h"            /* kn_env_reload (KN_BATCH) */
#include "runtime/runtime.h"     /* kn__plan_batched */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static inline bool kn_adam_steps(kn_backend *be, const kn_optim_cfg *cfg, int R, int C, bool tr, const double *p0,
                                 const double *a, double *out) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    int64_t n = (int64_t)(R ? R : 1) * C, s2[2] = {R, C}, t2[2] = {C, R}, s1 = C;
    kn_tensor *p = R ? kn_param(ctx, KN_F32, 2, s2) : kn_param(ctx, KN_F32, 1, &s1);
    kn_tensor *at = R ? kn_empty(ctx, KN_F32, 2, tr ? t2 : s2) : kn_empty(ctx, KN_F32, 1, &s1);
    kn_tensor_write(p, p0, KN_F64);
    kn_tensor_write(at, a, KN_F64);
    kn_tensor *pv = R && tr ? kn_transpose(ctx, p, 0, 1) : p;
    kn_tensor *loss = kn_mul_scalar(ctx, kn_sum_all(ctx, kn_mul(ctx, at, kn_square(ctx, pv))), 0.5);
    bool ok = kn_backward(ctx, loss) == KN_OK;
    kn_optim *o = kn_optim_new_empty(ctx, cfg);
    ok = ok && o && kn_optim_add_group(o, 1, &p, cfg->lr, cfg->weight_decay) == 0;
    kn_tensor *outs[8];
    int ne = ok ? kn_optim_build(o, NULL, outs, 8) : -1;
    kn_plan *pl = ne > 0 ? kn_plan_new(ctx, ne, outs, NULL) : NULL;
    for (int k = 0; pl && ok && k < 7; k++) {
        if (k == 4) kn_optim_set_lr(o, 0, cfg->lr * 0.5);
        ok = !kn_optim_prepare(o) && !kn_plan_run(pl);
    }
    ok = ok && pl && !kn_tensor_read(p, out, KN_F64) && !kn_tensor_read(kn_optim_state(o, 0, "exp_avg"), out + n, KN_F64) &&
         !kn_tensor_read(kn_optim_state(o, 0, "exp_avg_sq"), out + 2 * n, KN_F64);
    kn_plan_free(pl); kn_optim_free(o); kn_ctx_free(ctx);
    return ok;
}

/* Many parameters in one optimizer (the multi-tensor step: the runtime
 * hands runs of updates to kn_backend.compute_batch): KN_AM_NP parameters
 * of assorted shapes, [n] with n from 1 to 3001 (float4 bodies and tails)
 * and, every third, [R, C] met through a transposed view (a strided
 * gradient), alternating between two groups with their own lr and decay;
 * loss = sum over them of 0.5 * sum(a * p^2); 5 steps, the lr of group 1
 * halved before step 4. Values from a fixed generator, the same on every
 * backend. out (kn_am_len() doubles): each parameter (in the optimizer's
 * order: group 0's, then group 1's), then its exp_avg and exp_avg_sq. *batched: nodes the last run batched (exec.c). */
#define KN_AM_NP 70
static inline int64_t kn_am_shape(int i, int64_t *R, int64_t *C) {
    if (i % 3 == 2) { *R = 3 + i % 7; *C = 5 + (i * 13) % 41; return *R * *C; }
    *R = 0; *C = 1 + (int64_t)(i * 37) % 3001;
    return *C;
}
static inline int64_t kn_am_len(void) {
    int64_t n = 0, R, C;
    for (int i = 0; i < KN_AM_NP; i++) n += 3 * kn_am_shape(i, &R, &C);
    return n;
}
static inline bool kn_adam_many(kn_backend *be, const kn_optim_cfg *cfg, double *out, int *batched) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *ps[KN_AM_NP], *g[2][KN_AM_NP], *loss = NULL;
    int ng[2] = {0, 0};
    uint64_t s = 88172645463325252ull;       /* xorshift64: the same values on every backend */
    for (int i = 0; i < KN_AM_NP; i++) {
        int64_t R, C, n = kn_am_shape(i, &R, &C), s2[2] = {R, C}, t2[2] = {C, R};
        double *v = malloc(sizeof(double) * 2 * (size_t)n);
        for (int64_t k = 0; k < 2 * n; k++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            double u = (double)(s >> 11) / 9007199254740992.0;
            v[k] = k < n ? 4 * u - 2 : 0.01 + 3 * u;
        }
        ps[i] = R ? kn_param(ctx, KN_F32, 2, s2) : kn_param(ctx, KN_F32, 1, &C);
        kn_tensor *a = R ? kn_empty(ctx, KN_F32, 2, t2) : kn_empty(ctx, KN_F32, 1, &C);
        kn_tensor_write(ps[i], v, KN_F64);
        kn_tensor_write(a, v + n, KN_F64);
        free(v);
        kn_tensor *pv = R ? kn_transpose(ctx, ps[i], 0, 1) : ps[i];
        kn_tensor *l = kn_mul_scalar(ctx, kn_sum_all(ctx, kn_mul(ctx, a, kn_square(ctx, pv))), 0.5);
        loss = loss ? kn_add(ctx, loss, l) : l;
        g[i % 2][ng[i % 2]++] = ps[i];
    }
    bool ok = kn_backward(ctx, loss) == KN_OK;
    kn_optim *o = kn_optim_new_empty(ctx, cfg);
    ok = ok && o && kn_optim_add_group(o, ng[0], g[0], cfg->lr, cfg->weight_decay) == 0 &&
         kn_optim_add_group(o, ng[1], g[1], cfg->lr * 2, cfg->weight_decay * 0.5) == 1;
    kn_tensor *outs[4 * KN_AM_NP];
    int ne = ok ? kn_optim_build(o, NULL, outs, 4 * KN_AM_NP) : -1;
    kn_plan *pl = ne > 0 ? kn_plan_new(ctx, ne, outs, NULL) : NULL;
    for (int k = 0; pl && ok && k < 5; k++) {
        if (k == 3) kn_optim_set_lr(o, 1, cfg->lr);
        ok = !kn_optim_prepare(o) && !kn_plan_run(pl);
    }
    if (batched) *batched = pl ? kn__plan_batched(pl) : -1;
    for (int j = 0; ok && pl && j < KN_AM_NP; j++) {     /* the optimizer's order: group 0, then group 1 */
        kn_tensor *pj = kn_optim_param(o, j);
        int64_t n = pj ? kn_numel(pj) : 0;
        ok = pj && !kn_tensor_read(pj, out, KN_F64) && !kn_tensor_read(kn_optim_state(o, j, "exp_avg"), out + n, KN_F64) &&
             !kn_tensor_read(kn_optim_state(o, j, "exp_avg_sq"), out + 2 * n, KN_F64);
        out += 3 * n;
    }
    ok = ok && pl;
    kn_plan_free(pl); kn_optim_free(o); kn_ctx_free(ctx);
    return ok;
}
/* kn_adam_many with KN_BATCH=0: every update one node at a time */
static inline bool kn_adam_many_unbatched(kn_backend *be, const kn_optim_cfg *cfg, double *out, int *batched) {
    setenv("KN_BATCH", "0", 1);
    kn_env_reload();
    bool ok = kn_adam_many(be, cfg, out, batched);
    unsetenv("KN_BATCH");
    kn_env_reload();
    return ok;
}
#endif
