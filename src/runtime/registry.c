/* registry.c: the backend registry (runtime layer, docs/ARCHITECTURE.md):
 * kn_backend_default picks ref, cpu or cuda from KN_BACKEND, and
 * kn_ctx_new resolves a context's NULL backend to it. Core holds the
 * context (kn__ctx_new_on) but cannot know the backends, which sit above it;
 * so the public constructor that needs the choice lives here. */
#include "core/core.h"
#include "core/env.h"
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* KN_BACKEND=ref|cpu|cuda (cuda in builds with CUDA=1; where the GPU cannot
 * be opened the CPU backend is used, with a warning on stderr). */
/* KN_BACKEND=ref|cpu|cuda. A value that cannot be honoured falls back to
 * the CPU backend with one warning per process (not one per context). */
static atomic_int g_default_warned;
static void warn_default_once(const char *fmt, const char *a) {
    if (atomic_exchange(&g_default_warned, 1)) return;
    fprintf(stderr, fmt, a);
}
kn_backend *kn_backend_default(void) {
    const char *b = kn_env_get()->backend;
    if (!b || !*b || !strcmp(b, "cpu")) return kn_backend_cpu();
    if (!strcmp(b, "ref")) return kn_backend_ref();
    if (!strcmp(b, "cuda")) {
#ifdef KN_CUDA
        kn_backend *g = kn_backend_cuda();
        if (g) return g;
        warn_default_once("kiln: KN_BACKEND=cuda: %s; using the CPU backend\n", kn_last_error());
#else
        warn_default_once("kiln: KN_BACKEND=%s: this build has no CUDA backend (build with `make CUDA=1`); using the CPU backend\n", b);
#endif
        return kn_backend_cpu();
    }
    warn_default_once("kiln: KN_BACKEND=%s is not one of cpu, ref, cuda; using the CPU backend\n", b);
    return kn_backend_cpu();
}

kn_ctx *kn_ctx_new(const kn_ctx_opts *opts) {
    return kn__ctx_new_on((opts && opts->backend) ? opts->backend : kn_backend_default());
}
