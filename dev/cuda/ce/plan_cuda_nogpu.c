/* plan_cuda_nogpu.c: the bf16 GPT-2 training step's plan as the CUDA backend
 * would fuse it (kernel language "cuda": generated kernels, their names),
 * printed on a machine without a GPU: the CPU backend with kernel_lang set to
 * "cuda" and kernel_build/run stubs (nothing runs). Used on 2026-11-28 to
 * check that the fused cross-entropy changes no fusion group outside the loss
 * block (the CUDA kernel names of both plans match the H200 run's profile).
 *
 *   cc -std=c11 -O1 -Iinclude -Isrc dev/cuda/ce/plan_cuda_nogpu.c build/libkiln.a -lm -lpthread -ldl -o /tmp/plan_nogpu
 *   KN_DEBUG=1 KN_CACHE=0 DUMP=/tmp/k /tmp/plan_nogpu 12 2> fused.txt      (DUMP: write each kernel's source there)
 *   KN_CE_COMPOSITE=1 KN_DEBUG=1 KN_CACHE=0 /tmp/plan_nogpu 12 2> composite.txt
 * CLIP=0 builds the optimizer without gradient clipping (default 1, as kiln train);
 * B=16 sets the batch (default 8); DEVICE=1 makes the fake backend a CUDA
 * device, so the bf16 policy casts attention to 16 bits as on a GPU.
 */
#include "kiln.h"
#include "kiln_nn.h"
#include "../fake_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    int L = argc > 1 ? atoi(argv[1]) : 1;
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){fake_cuda_backend()});
    kn_gpt2_cfg gc = {.vocab = 50257, .max_seq = 1024, .dim = 768, .n_layers = L, .n_heads = 12, .dropout = 0};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    if (!m || kn_module_set_precision(m, KN_PREC_BF16)) { fprintf(stderr, "model: %s\n", kn_last_error()); return 1; }
    int64_t B = getenv("B") ? atoll(getenv("B")) : 8;               /* batch rows (B=16: issue 12's second size) */
    kn_tensor *x = kn_input(ctx, KN_I32, 2, (int64_t[]){B, 1024}), *y = kn_input(ctx, KN_I64, 2, (int64_t[]){B, 1024});
    kn_tensor *loss = kn_cross_entropy(ctx, kn_gpt2_forward(m, x), y, NULL);
    if (!loss || kn_backward(ctx, loss)) { fprintf(stderr, "graph: %s\n", kn_last_error()); return 1; }
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.clip_norm = getenv("CLIP") ? atof(getenv("CLIP")) : 1.0;   /* as `kiln train` (--clip 1): the norm's reductions are in the plan */
    kn_optim *opt = kn_optim_new_decay_groups(ctx, m, &oc);
    static kn_tensor *outs[KN_NN_MAX_OUTS];
    int n = 0;
    outs[n++] = loss;
    int ne = kn_optim_build(opt, NULL, outs + n, KN_NN_MAX_OUTS - n);
    if (ne < 0) { fprintf(stderr, "optim: %s\n", kn_last_error()); return 1; }
    n += ne;
    fprintf(stderr, "=== STEP PLAN\n");
    kn_plan *p = kn_plan_new(ctx, n, outs, NULL);
    if (!p) { fprintf(stderr, "plan: %s\n", kn_last_error()); return 1; }
    fprintf(stderr, "kernels %d\n", kn_plan_n_kernels(p));
    return 0;
}
