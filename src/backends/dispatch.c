/* dispatch.c: the one map from an op to its kernel family, and the one
 * out-of-range index message, shared by every backend.
 *
 * Each backend fills a kn_families table with its family entry points
 * (create, unary, binary, reduce, scan, matmul, copy, optim, index, nn) and
 * calls kn__dispatch; which family an op belongs to is decided here, from
 * the op table's kind, so the reference and CUDA backends no longer carry
 * two copies of the same switch. (The CPU backend first tries its fast
 * paths per op, then falls back to the reference through this.)
 */
#include "backends/backend_impl.h"

kn_status kn__dispatch(const kn_families *f, const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_family_fn fn = NULL;
    switch (kn_op_get(t->op)->kind) {
    case KN_KIND_VIEW: case KN_KIND_LEAF: return KN_OK;     /* no work: storage is shared */
    case KN_KIND_CREATE: fn = f->create; break;
    case KN_KIND_UNARY: fn = f->unary; break;
    case KN_KIND_BINARY: fn = f->binary; break;
    case KN_KIND_REDUCE: fn = f->reduce; break;
    case KN_KIND_SCAN: fn = f->scan; break;
    case KN_KIND_MATMUL: fn = f->matmul; break;
    case KN_KIND_NN: fn = f->nn; break;
    case KN_KIND_COPY: case KN_KIND_EFFECT:
        switch (t->op) {
        /* elementwise copies of one layout into another */
        case KN_OP_COPY: case KN_OP_CAST: case KN_OP_ASSIGN: case KN_OP_TRI: case KN_OP_WHERE: fn = f->copy; break;
        case KN_OP_ADAM_UPDATE: fn = f->optim; break;
        case KN_OP_ALL_REDUCE: case KN_OP_ALL_GATHER: case KN_OP_REDUCE_SCATTER: case KN_OP_BROADCAST: fn = f->comm; break;
        default: fn = f->index; break;                        /* gather, scatter, cat, pad, index_* */
        }
        break;
    }
    if (!fn) return kn_set_error(KN_ERR_UNSUPPORTED, "%s backend: no kernel for %s", f->name, kn_op_name(t->op));
    return fn(e);
}

kn_status kn__index_error(const char *op, double value, int dim, int64_t size) {
    return kn_set_error(KN_ERR_INVALID, "%s: index %.0f out of range for dim %d of size %lld (valid: 0..%lld; negative indices are not accepted)",
                        op, value, dim, (long long)size, (long long)size - 1);
}

kn_status kn__target_error(const char *op, double value, int64_t classes, int64_t ignore_index) {
    return kn_set_error(KN_ERR_INVALID, "%s: target %.0f out of range for %lld classes (valid: 0..%lld, or the ignore_index %lld); "
                        "check the labels against the classifier's width", op, value, (long long)classes, (long long)classes - 1,
                        (long long)ignore_index);
}
