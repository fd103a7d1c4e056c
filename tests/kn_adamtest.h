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
#include <stdbool.h>

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
#endif
