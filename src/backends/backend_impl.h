/* backends/backend_impl.h: what every backend shares (docs/ARCHITECTURE.md,
 * layer 4): the op table and nodes (graph/graph.h) and the reference
 * kernels, which any host backend may fall back to. */
#ifndef KN_BACKEND_IMPL_H
#define KN_BACKEND_IMPL_H
#include "graph/graph.h"

kn_status kn__ref_compute(kn_backend *be, const kn_exec *e);   /* the oracle, usable by any host backend */

/* A backend's kernel families (src/backends/dispatch.c decides which family
 * an op belongs to, from the op table). A NULL entry: "no kernel for OP". */
typedef kn_status (*kn_family_fn)(const kn_exec *e);
typedef struct kn_families {
    const char *name;           /* for the message: "cuda backend: no kernel for ..." */
    kn_family_fn create, unary, binary, reduce, scan, matmul, copy, optim, index, nn;
    kn_family_fn comm;          /* collectives (kiln_dist.h) */
} kn_families;
kn_status kn__dispatch(const kn_families *f, const kn_exec *e);
/* KN_ERR_INVALID: "OP: index V out of range for dim D of size N (valid: ...)" */
kn_status kn__index_error(const char *op, double value, int dim, int64_t size);
/* KN_ERR_INVALID: "OP: target V out of range for C classes (valid: ...)" (cross_entropy) */
kn_status kn__target_error(const char *op, double value, int64_t classes, int64_t ignore_index);
/* A class id of an integer view (i8, i32, i64, u8; exact for i64) at element offset off. */
static inline int64_t kn__load_id(const kn_tview *v, int64_t off) {
    switch (v->dtype) {
    case KN_I64: return ((const int64_t *)v->data)[off];
    case KN_I32: return ((const int32_t *)v->data)[off];
    case KN_I8: return ((const int8_t *)v->data)[off];
    case KN_U8: return ((const uint8_t *)v->data)[off];
    default: return (int64_t)kn_load(v->dtype, v->data, off);
    }
}
#endif
