/* ref_backend.c: the reference backend's table and its dispatch switch. */
#include "backends/ref/ref.h"

kn_status kn__ref_compute(kn_backend *be, const kn_exec *e) {
    (void)be;
    const kn_tensor *t = e->node;
    switch (kn_op_get(t->op)->kind) {
    case KN_KIND_CREATE: return kn_ref_create(e);
    case KN_KIND_UNARY: return kn_ref_unary(e);
    case KN_KIND_BINARY: return kn_ref_binary(e);
    case KN_KIND_REDUCE: return kn_ref_reduce(e);
    case KN_KIND_SCAN: return kn_ref_scan(e);
    case KN_KIND_MATMUL: return kn_ref_matmul(e);
    case KN_KIND_VIEW: case KN_KIND_LEAF: return KN_OK;
    case KN_KIND_COPY: case KN_KIND_EFFECT:
        switch (t->op) {
        case KN_OP_COPY: case KN_OP_CAST: case KN_OP_ASSIGN: case KN_OP_TRI: case KN_OP_WHERE:
            return kn_ref_copy(e);
        case KN_OP_ADAM_UPDATE: return kn_ref_optim(e);
        default: return kn_ref_index(e);
        }
    case KN_KIND_NN: return kn_ref_nn(e);
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference backend: no kernel for %s", kn_op_name(t->op));
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
};

kn_backend *kn_backend_ref(void) { return &g_ref; }
const char *kn_backend_name(const kn_backend *be) { return be ? be->name : "(none)"; }
