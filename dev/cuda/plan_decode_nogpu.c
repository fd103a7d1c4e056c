/* plan_decode_nogpu.c: an LLM's prompt and decode-step plans as the CUDA
 * backend would fuse them, printed on a machine without a GPU: the CPU
 * backend posing as a CUDA device (kernel_lang "cuda", kernel_build/run
 * stubs: generated kernels are named and optionally written out, nothing
 * runs on them; hand ops run on the CPU). For counting a decode token's
 * kernels and seeing which nodes stay on hand kernels, offline.
 * (dev/cuda/ce/plan_cuda_nogpu.c does the same for GPT-2's training step.)
 *
 *   make && cc -std=c11 -O1 -Iinclude -Isrc dev/cuda/plan_decode_nogpu.c build/libkiln.a -lm -lpthread -ldl -lopenblas -o /tmp/plan_decode
 *   DEVICE=1 KN_DEBUG=1 KN_CACHE=0 /tmp/plan_decode models/SmolLM2-135M-Instruct.Q4_1.gguf 2> plans.txt
 *   (DEVICE=1: the fake backend says it is a CUDA device, so the model builds its
 *   device plans: a prompt plan and a one-token step plan; DUMP=DIR writes each
 *   generated kernel's source there)
 *
 * 2026-12-06, SmolLM2-135M Q4_1: the step plan is 847 nodes, 274 kernels a
 * token (119 generated): per layer the qkv, o, gate|up and down GEMVs, one
 * kernel for rope + the two cache writes, sdpa, SwiGLU, and the residual add
 * with the next RMS norm. A Llama-3-8B-shaped model's step had no generated
 * kernel at all until the fuser's memory rule got its 1 MiB floor (1/16 of
 * a few-KB arena sent every group back): now 292 kernels a token, 127 of
 * them generated (the same count `kiln bench` printed on an H100). */
#include "kiln.h"
#include "kiln_llm.h"
#include "fake_cuda.h"
int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]); return 2; }
    kn_model_opts o = {.backend = fake_cuda_backend()};
    kn_model *m;
    if (kn_model_load(argv[1], &o, &m)) { fprintf(stderr, "load: %s\n", kn_last_error()); return 1; }
    static float logits[1 << 20];
    int32_t toks[4] = {1, 2, 3, 4};
    fprintf(stderr, "=== a 4-token prompt, then two decode steps\n");
    if (kn_model_eval(m, toks, 4, 0, logits, false) || kn_model_eval(m, toks, 1, 4, logits, false) ||
        kn_model_eval(m, toks + 1, 1, 5, logits, false)) {
        fprintf(stderr, "eval: %s\n", kn_last_error());
        return 1;
    }
    kn_model_free(m);
    return 0;
}
