/* optable.c: the op table as data (kn_op_info), one entry per row of
 * include/kiln_ops.def: name, kind, arity, in-place eligibility and, for
 * elementwise ops, output dtype rule, gradient rule kind and the forward and
 * gradient expressions as text (for the compiler's code generators). */
#include "graph/graph.h"

#define KN_OP(ID, name, KIND, arity, inplace) {name, KN_KIND_##KIND, inplace, arity, KN_OUT_SAME, KN_GRAD_NA, NULL, {NULL, NULL}},
/* the expressions are stringified here, as written in the table (unexpanded) */
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad) \
    {name, KN_KIND_UNARY, inplace, 1, KN_OUT_##OUT, KN__GRAD_##GRAD, #fwd, {#grad, NULL}},
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b) \
    {name, KN_KIND_BINARY, inplace, 2, KN_OUT_##OUT, KN__GRAD_##GRAD, #fwd, {#grad_a, #grad_b}},
#define KN__GRAD_E KN_GRAD_EXPR
#define KN__GRAD_H KN_GRAD_HAND
#define KN__GRAD_Z KN_GRAD_ZERO
#define KN__GRAD_N KN_GRAD_NONE

/* positional: row i of the table is op i, as in the enum made from the same file */
static const kn_op_info g_ops[] = {
#include "kiln_ops.def"
};
_Static_assert(sizeof g_ops / sizeof g_ops[0] == KN_OP_COUNT, "kiln_ops.def and the kn_op enum disagree");

const kn_op_info *kn_op_get(kn_op op) {
    static const kn_op_info bad = {"?", KN_KIND_LEAF, 0, 0, KN_OUT_SAME, KN_GRAD_NA, NULL, {NULL, NULL}};
    return (unsigned)op < KN_OP_COUNT ? &g_ops[op] : &bad;
}
const char *kn_op_name(kn_op op) { return kn_op_get(op)->name; }
bool kn__is_view_op(kn_op op) { return kn_op_get(op)->kind == KN_KIND_VIEW; }
