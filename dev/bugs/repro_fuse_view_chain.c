/* repro_fuse_view_chain.c: a compiler bug (src/compile/fuse.c with the view_chain
 * rewrite), found while adding mixed precision; f32 only, no nn code.
 * A fused elementwise group (mul + add) whose value is read only through a
 * chain of views (narrow, reshape, permute) that the view_chain rewrite
 * collapses: the collapsed view keeps src[0] = a removed view, so the
 * readers list of the group's last node misses the read, mark_stored keeps
 * it in registers, and the run fails with "input 0 of sdpa has no data".
 * KN_NOFUSE=1 (or no_rewrite / no_fuse) runs it.
 *   cc -std=c11 -Iinclude dev/bugs/repro_fuse_view_chain.c build/libkiln.a -lm -lpthread -ldl && ./a.out */
#include "kiln.h"
#include <stdio.h>
/* f32 only: an elementwise chain of two nodes read through narrow/reshape/permute by sdpa */
int main(void) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *x = kn_rand_normal(ctx, KN_F32, 3, (int64_t[]){2, 8, 96}, 0, 1, 1);
    kn_tensor *b = kn_rand_normal(ctx, KN_F32, 1, (int64_t[]){96}, 0, 1, 2);
    kn_tensor *h = kn_add(ctx, kn_mul_scalar(ctx, kn_matmul(ctx, x, kn_rand_normal(ctx, KN_F32, 2, (int64_t[]){96, 96}, 0, 1, 3)), 0.5), b);
    kn_tensor *qkv[3];
    static const int perm[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++)
        qkv[i] = kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, h, 2, 32 * i, 32), 4, (int64_t[]){2, 8, 2, 16}), perm);
    kn_tensor *y = kn_sdpa(ctx, qkv[0], qkv[1], qkv[2], true, 0);
    kn_tensor *loss = kn_mean_all(ctx, y);
    kn_plan *p = kn_plan_new(ctx, 1, &loss, NULL);
    if (!p || kn_plan_run(p)) { printf("f32 repro: %s\n", kn_last_error()); return 1; }
    printf("ok %g\n", kn_item(loss));
    return 0;
}
