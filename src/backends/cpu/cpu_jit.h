/* cpu_jit.h: the CPU backend's compiler-generated kernels (cpu_jit.c):
 * the kernel_build / kernel_run / kernel_free entries of its kn_backend
 * (kernel_lang "c"; the kernel signature is in kiln_backend.h, above
 * kn_kargs), and counters for tests. */
#ifndef KN_CPU_JIT_H
#define KN_CPU_JIT_H
#include "kiln_backend.h"

void *kn__cpu_kernel_build(kn_backend *be, const char *src, const char *name, char *why, size_t nwhy);
kn_status kn__cpu_kernel_run(kn_backend *be, void *kernel, const kn_kernel_launch *l);
void kn__cpu_kernel_free(kn_backend *be, void *kernel);

/* since the process started */
typedef struct kn_cpu_jit_stats {
    long builds;       /* kernel_build calls that returned a kernel */
    long compiles;     /* of those, compiled now (the cache had no usable entry) */
    long cache_hits;   /* of those, loaded from the disk cache */
    long failures;     /* kernel_build calls that returned NULL */
    long spawns;       /* compiler processes started (compiles and `cc --version`) */
} kn_cpu_jit_stats;
void kn__cpu_jit_stats(kn_cpu_jit_stats *s);
#endif
