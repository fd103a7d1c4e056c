/* ref_backend.c: the reference backend: its kn_backend and its kernel families (dispatch.c). */
#include "backends/ref/ref.h"

static const kn_families g_families = {
    .name = "reference", .create = kn_ref_create, .unary = kn_ref_unary, .binary = kn_ref_binary,
    .reduce = kn_ref_reduce, .scan = kn_ref_scan, .matmul = kn_ref_matmul, .copy = kn_ref_copy,
    .optim = kn_ref_optim, .index = kn_ref_index, .nn = kn_ref_nn,
    .comm = kn_ref_comm,
};

kn_status kn__ref_compute(kn_backend *be, const kn_exec *e) {
    (void)be;
    return kn__dispatch(&g_families, e);
}

static bool ref_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be;
    return kn_ref_epilogue_ok(mm, epi, out);
}

static kn_backend g_ref = {
    .version = KN_BACKEND_VERSION,
    .name = "ref",
    .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc,
    .free = kn__host_free,
    .copy_in = kn__host_copy,
    .copy_out = kn__host_copy,
    .compute = kn__ref_compute,
    .epilogue_ok = ref_epilogue_ok,
};

kn_backend *kn_backend_ref(void) { return &g_ref; }
const char *kn_backend_name(const kn_backend *be) { return be ? be->name : "(none)"; }
