/* rules_nn.c: gradient rules of the nn ops (softmax, norms, conv, pool, sdpa, rope). */
#include "kn-impl.h"

kn_grad_rule kn__grad_rule_nn(kn_op op) { (void)op; return NULL; }
