/* cuda_jit.h: the CUDA backend's compiler-generated kernels (cuda_jit.cu):
 * the kernel_build / kernel_run / kernel_free / syms_upload entries of its
 * kn_backend (kernel_lang "cuda"; the kernel signature is in
 * kiln_backend.h, above kn_kargs), NVRTC alone for tests on machines without
 * a GPU, and counters. Includable from C. */
#ifndef KN_CUDA_JIT_H
#define KN_CUDA_JIT_H
#include "kiln_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void *kn__cuda_kernel_build(kn_backend *be, const char *src, const char *name, char *why, size_t nwhy);
kn_status kn__cuda_kernel_run(kn_backend *be, void *kernel, const kn_kernel_launch *l);
void kn__cuda_kernel_free(kn_backend *be, void *kernel);
kn_status kn__cuda_syms_upload(kn_backend *be, const int64_t *syms, int n);

/* NVRTC only (no GPU needed): src compiled for sm_<arch> (90: sm_90) into a
 * cubin, or with ptx into PTX for compute_<arch> (NUL-terminated). The code
 * (malloc'd, *n bytes; the caller frees) or NULL with NVRTC's log in why.
 * flags (may be NULL) gets the options used, as in the cache key. */
void *kn__cuda_jit_compile(const char *src, int arch, bool ptx, size_t *n, char *flags, size_t nflags,
                           char *why, size_t nwhy);
/* "sm_90 NVIDIA H100 80GB HBM3": the device generated kernels run on (the
 * kernel search's cache key, src/runtime/tune.c); NULL without a usable GPU */
const char *kn__cuda_jit_device(void);
/* "NVRTC 13.0" */
const char *kn__cuda_jit_nvrtc_version(void);

typedef struct kn_cuda_jit_stats {
    long builds;       /* kernel_build calls that returned a kernel */
    long compiles;     /* of those, compiled by NVRTC now */
    long cache_hits;   /* of those, loaded from the disk cache */
    long failures;     /* kernel_build calls that returned NULL */
} kn_cuda_jit_stats;
void kn__cuda_jit_stats(kn_cuda_jit_stats *s);

#ifdef __cplusplus
}
#endif
#endif
