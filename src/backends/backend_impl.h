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
} kn_families;
kn_status kn__dispatch(const kn_families *f, const kn_exec *e);
/* KN_ERR_INVALID: "OP: index V out of range for dim D of size N (valid: ...)" */
kn_status kn__index_error(const char *op, double value, int dim, int64_t size);
#endif
