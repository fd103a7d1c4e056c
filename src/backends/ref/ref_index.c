/* ref_index.c: cat, pad, gather/scatter, index_select/add/copy. */
#include "backends/ref/ref.h"

kn_status kn_ref_index(const kn_exec *e) {
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no kernel for %s yet", kn_op_name(e->node->op));
}
