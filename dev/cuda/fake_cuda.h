/* fake_cuda.h: the CPU backend posing as the CUDA one, for printing plans as
 * the CUDA backend fuses them on a machine without a GPU (kernel_lang
 * "cuda"; kernel_build names each generated kernel and, with DUMP=DIR,
 * writes its source there; kernel_run does nothing; hand ops run on the
 * CPU). DEVICE=1 also makes it say it is a CUDA device, so that code which
 * builds device plans (the LLM's prompt and step plans) takes that path.
 * Used by plan_decode_nogpu.c and ce/plan_cuda_nogpu.c. */
#ifndef KN_DEV_FAKE_CUDA_H
#define KN_DEV_FAKE_CUDA_H
#include "kiln_backend.h"
#include "backends/cuda/epilogue_rule.h"   // defines: kn_cu_epilogue_rule
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *fake_kernel_build(kn_backend *be, const char *src, const char *name, char *why, size_t n) {
    (void)be; (void)why; (void)n;
    static int k = 0;
    if (getenv("DUMP")) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s.cu", getenv("DUMP"), name);
        FILE *f = fopen(p, "w");
        if (f) { fputs(src, f); fclose(f); }
    }
    return (void *)(intptr_t)(++k);
}
static kn_status fake_kernel_run(kn_backend *be, void *k, const kn_kernel_launch *l) { (void)be; (void)k; (void)l; return KN_OK; }
static void fake_kernel_free(kn_backend *be, void *k) { (void)be; (void)k; }

/* the CUDA backend's rule (backends/cuda/epilogue_rule.h); the CPU backend
 * runs what it takes, the f32 products */
static bool fake_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be;
    return kn_cu_epilogue_rule(mm, epi, out) && epi->dt == KN_F32 && (out == KN_F32 || out == KN_BF16 || out == KN_F16);
}

static kn_backend *fake_cuda_backend(void) {
    static kn_backend fake;
    fake = *kn_backend_cpu();
    fake.name = "fakecuda";
    if (getenv("DEVICE")) fake.device = KN_DEVICE_CUDA;
    fake.kernel_lang = "cuda";
    fake.kernel_build = fake_kernel_build;
    fake.kernel_run = fake_kernel_run;
    fake.kernel_free = fake_kernel_free;
    fake.epilogue_ok = fake_epilogue_ok;
    return &fake;
}
#endif
