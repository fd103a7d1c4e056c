/* autograd/autograd.h: gradient rules (src/autograd/rules*.c) and the
 * helper they share; part of the graph layer (docs/ARCHITECTURE.md). */
#ifndef KN_AUTOGRAD_H
#define KN_AUTOGRAD_H
#include "graph/graph.h"

typedef void (*kn_grad_rule)(kn_ctx *ctx, kn_tensor *node, kn_tensor *gout, kn_tensor **gin);
kn_grad_rule kn__grad_rule(kn_op op);          /* rules.c: any op */
kn_grad_rule kn__grad_rule_index(kn_op op);    /* rules_index.c: copy/index ops */
kn_grad_rule kn__grad_rule_nn(kn_op op);       /* rules_nn.c: nn ops */
/* Sum g down to t's shape (undo broadcasting; sum_to.c). */
kn_tensor *kn__sum_to(kn_ctx *ctx, kn_tensor *g, const kn_tensor *t);
#endif
