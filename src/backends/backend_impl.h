/* backends/backend_impl.h: what every backend shares (docs/ARCHITECTURE.md,
 * layer 4): the op table and nodes (graph/graph.h) and the reference
 * kernels, which any host backend may fall back to. */
#ifndef KN_BACKEND_IMPL_H
#define KN_BACKEND_IMPL_H
#include "graph/graph.h"

kn_status kn__ref_compute(kn_backend *be, const kn_exec *e);   /* the oracle, usable by any host backend */
#endif
