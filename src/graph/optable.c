/* optable.c: name, kind and in-place eligibility of every op. */
#include "kn-impl.h"

#define L KN_KIND_LEAF
#define CR KN_KIND_CREATE
#define V KN_KIND_VIEW
#define CP KN_KIND_COPY
#define U KN_KIND_UNARY
#define B KN_KIND_BINARY
#define R KN_KIND_REDUCE
#define S KN_KIND_SCAN
#define M KN_KIND_MATMUL
#define N KN_KIND_NN
#define E KN_KIND_EFFECT

static const kn_op_info g_ops[KN_OP_COUNT] = {
    [KN_OP_NONE] = {"leaf", L, 0},
    [KN_OP_FILL] = {"fill", CR, 0}, [KN_OP_ARANGE] = {"arange", CR, 0}, [KN_OP_EYE] = {"eye", CR, 0},
    [KN_OP_RAND] = {"rand", CR, 0}, [KN_OP_RANDPERM] = {"randperm", CR, 0},
    [KN_OP_RESHAPE] = {"reshape", V, 0}, [KN_OP_PERMUTE] = {"permute", V, 0}, [KN_OP_EXPAND] = {"expand", V, 0},
    [KN_OP_SLICE] = {"slice", V, 0}, [KN_OP_AS_STRIDED] = {"as_strided", V, 0},
    [KN_OP_COPY] = {"copy", CP, 1}, [KN_OP_CAST] = {"cast", CP, 0}, [KN_OP_CAT] = {"cat", CP, 0},
    [KN_OP_PAD] = {"pad", CP, 0}, [KN_OP_GATHER] = {"gather", CP, 0}, [KN_OP_SCATTER] = {"scatter", CP, 0},
    [KN_OP_SCATTER_ADD] = {"scatter_add", CP, 0}, [KN_OP_INDEX_SELECT] = {"index_select", CP, 0},
    [KN_OP_INDEX_ADD] = {"index_add", CP, 0}, [KN_OP_WHERE] = {"where", CP, 0}, [KN_OP_TRI] = {"tri", CP, 1},
    [KN_OP_ASSIGN] = {"assign", E, 0}, [KN_OP_INDEX_COPY] = {"index_copy", E, 0},
    [KN_OP_ADAM_UPDATE] = {"adam_update", E, 0},
    [KN_OP_NEG] = {"neg", U, 1}, [KN_OP_ABS] = {"abs", U, 1}, [KN_OP_SIGN] = {"sign", U, 1},
    [KN_OP_EXP] = {"exp", U, 1}, [KN_OP_EXP2] = {"exp2", U, 1}, [KN_OP_LOG] = {"log", U, 1},
    [KN_OP_LOG2] = {"log2", U, 1}, [KN_OP_LOG1P] = {"log1p", U, 1}, [KN_OP_EXPM1] = {"expm1", U, 1},
    [KN_OP_SQRT] = {"sqrt", U, 1}, [KN_OP_RSQRT] = {"rsqrt", U, 1}, [KN_OP_RECIPROCAL] = {"reciprocal", U, 1},
    [KN_OP_SQUARE] = {"square", U, 1}, [KN_OP_SIN] = {"sin", U, 1}, [KN_OP_COS] = {"cos", U, 1},
    [KN_OP_TAN] = {"tan", U, 1}, [KN_OP_ASIN] = {"asin", U, 1}, [KN_OP_ACOS] = {"acos", U, 1},
    [KN_OP_ATAN] = {"atan", U, 1}, [KN_OP_SINH] = {"sinh", U, 1}, [KN_OP_COSH] = {"cosh", U, 1},
    [KN_OP_TANH] = {"tanh", U, 1}, [KN_OP_ASINH] = {"asinh", U, 1}, [KN_OP_ACOSH] = {"acosh", U, 1},
    [KN_OP_ATANH] = {"atanh", U, 1}, [KN_OP_ERF] = {"erf", U, 1}, [KN_OP_FLOOR] = {"floor", U, 1},
    [KN_OP_CEIL] = {"ceil", U, 1}, [KN_OP_ROUND] = {"round", U, 1}, [KN_OP_TRUNC] = {"trunc", U, 1},
    [KN_OP_CLAMP] = {"clamp", U, 1}, [KN_OP_NOT] = {"logical_not", U, 0},
    [KN_OP_RELU] = {"relu", U, 1}, [KN_OP_LEAKY_RELU] = {"leaky_relu", U, 1}, [KN_OP_ELU] = {"elu", U, 1},
    [KN_OP_SELU] = {"selu", U, 1}, [KN_OP_GELU] = {"gelu", U, 1}, [KN_OP_GELU_TANH] = {"gelu_tanh", U, 1},
    [KN_OP_SILU] = {"silu", U, 1}, [KN_OP_SIGMOID] = {"sigmoid", U, 1}, [KN_OP_SOFTPLUS] = {"softplus", U, 1},
    [KN_OP_MISH] = {"mish", U, 1}, [KN_OP_HARDTANH] = {"hardtanh", U, 1}, [KN_OP_HARDSIGMOID] = {"hardsigmoid", U, 1},
    [KN_OP_GELU_TANH_GRAD] = {"gelu_tanh_grad", U, 1},
    [KN_OP_ADD] = {"add", B, 1}, [KN_OP_SUB] = {"sub", B, 1}, [KN_OP_MUL] = {"mul", B, 1}, [KN_OP_DIV] = {"div", B, 1},
    [KN_OP_POW] = {"pow", B, 1}, [KN_OP_MAXIMUM] = {"maximum", B, 1}, [KN_OP_MINIMUM] = {"minimum", B, 1},
    [KN_OP_FMOD] = {"fmod", B, 1}, [KN_OP_ATAN2] = {"atan2", B, 1},
    [KN_OP_EQ] = {"eq", B, 0}, [KN_OP_NE] = {"ne", B, 0}, [KN_OP_LT] = {"lt", B, 0}, [KN_OP_LE] = {"le", B, 0},
    [KN_OP_GT] = {"gt", B, 0}, [KN_OP_GE] = {"ge", B, 0}, [KN_OP_AND] = {"logical_and", B, 0}, [KN_OP_OR] = {"logical_or", B, 0},
    [KN_OP_SUM] = {"sum", R, 0}, [KN_OP_MEAN] = {"mean", R, 0}, [KN_OP_PROD] = {"prod", R, 0},
    [KN_OP_MAX] = {"max", R, 0}, [KN_OP_MIN] = {"min", R, 0}, [KN_OP_ARGMAX] = {"argmax", R, 0},
    [KN_OP_ARGMIN] = {"argmin", R, 0}, [KN_OP_VAR] = {"var", R, 0}, [KN_OP_STD] = {"std", R, 0},
    [KN_OP_LOGSUMEXP] = {"logsumexp", R, 0}, [KN_OP_NORM] = {"norm", R, 0}, [KN_OP_ALL] = {"all", R, 0},
    [KN_OP_ANY] = {"any", R, 0}, [KN_OP_CUMSUM] = {"cumsum", S, 0}, [KN_OP_CUMPROD] = {"cumprod", S, 0},
    [KN_OP_MATMUL] = {"matmul", M, 0},
    [KN_OP_SOFTMAX] = {"softmax", N, 1}, [KN_OP_LOG_SOFTMAX] = {"log_softmax", N, 1},
    [KN_OP_LAYER_NORM] = {"layer_norm", N, 0}, [KN_OP_RMS_NORM] = {"rms_norm", N, 0},
    [KN_OP_BATCH_NORM] = {"batch_norm", N, 0}, [KN_OP_GROUP_NORM] = {"group_norm", N, 0},
    [KN_OP_CONV2D] = {"conv2d", N, 0}, [KN_OP_CONV2D_BWD_W] = {"conv2d_bwd_w", N, 0},
    [KN_OP_CONV_TRANSPOSE2D] = {"conv_transpose2d", N, 0}, [KN_OP_MAX_POOL2D] = {"max_pool2d", N, 0},
    [KN_OP_MAX_POOL2D_BWD] = {"max_pool2d_bwd", N, 0}, [KN_OP_AVG_POOL2D] = {"avg_pool2d", N, 0},
    [KN_OP_AVG_POOL2D_BWD] = {"avg_pool2d_bwd", N, 0}, [KN_OP_ADAPTIVE_AVG_POOL2D] = {"adaptive_avg_pool2d", N, 0},
    [KN_OP_ADAPTIVE_AVG_POOL2D_BWD] = {"adaptive_avg_pool2d_bwd", N, 0}, [KN_OP_SDPA] = {"sdpa", N, 0},
    [KN_OP_ROPE] = {"rope", N, 0}, [KN_OP_SDPA_BWD] = {"sdpa_bwd", N, 0},
};

const kn_op_info *kn_op_get(kn_op op) {
    static const kn_op_info bad = {"?", KN_KIND_LEAF, 0};
    return ((unsigned)op < KN_OP_COUNT && g_ops[op].name) ? &g_ops[op] : &bad;
}
const char *kn_op_name(kn_op op) { return kn_op_get(op)->name; }
bool kn__is_view_op(kn_op op) { return kn_op_get(op)->kind == KN_KIND_VIEW; }
