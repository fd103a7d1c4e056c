/* ref_nn.c: softmax, norms, convolution, pooling, attention, rope. */
#include "backends/ref/ref.h"

kn_status kn_ref_nn(const kn_exec *e) {
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no kernel for %s yet", kn_op_name(e->node->op));
}
