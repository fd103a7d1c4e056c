/* ops_nn.c: nn op constructors: softmax, norms, dropout, embedding, conv,
 * pooling, attention, rope. */
#include "kn-impl.h"
