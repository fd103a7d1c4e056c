/* dtype.c: the dtype table (see kiln_base.h). Quantized block sizes and
 * byte sizes follow the GGUF/ggml block layouts (src/backends/quant/quant.h). */
#include "kiln_base.h"

static const kn_dtype_info g_dtypes[KN_DTYPE_COUNT] = {
    [KN_F32]  = {"f32",  1,  4, true,  false, false},
    [KN_F16]  = {"f16",  1,  2, true,  false, false},
    [KN_BF16] = {"bf16", 1,  2, true,  false, false},
    [KN_F64]  = {"f64",  1,  8, true,  false, false},
    [KN_I8]   = {"i8",   1,  1, false, true,  false},
    [KN_I32]  = {"i32",  1,  4, false, true,  false},
    [KN_I64]  = {"i64",  1,  8, false, true,  false},
    [KN_U8]   = {"u8",   1,  1, false, true,  false},
    [KN_BOOL] = {"bool", 1,  1, false, true,  false},
    /* block: d (f16 scale) + packed quants [+ min / high bits]                       */
    [KN_Q4_0] = {"q4_0", 32, 2 + 16,          false, false, true},
    [KN_Q4_1] = {"q4_1", 32, 2 + 2 + 16,      false, false, true},
    [KN_Q5_0] = {"q5_0", 32, 2 + 4 + 16,      false, false, true},
    [KN_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16,  false, false, true},
    [KN_Q8_0] = {"q8_0", 32, 2 + 32,          false, false, true},
    [KN_Q8_1] = {"q8_1", 32, 2 + 2 + 32,      false, false, true},
    /* K-quants: super-blocks of 256                                                   */
    [KN_Q4_K] = {"q4_K", 256, 2 + 2 + 12 + 128,          false, false, true},
    [KN_Q5_K] = {"q5_K", 256, 2 + 2 + 12 + 32 + 128,     false, false, true},
    [KN_Q6_K] = {"q6_K", 256, 128 + 64 + 16 + 2,         false, false, true},
    [KN_Q8_K] = {"q8_K", 256, 4 + 256 + 16 * 2,          false, false, true},
};

const kn_dtype_info *kn_dtype_get(kn_dtype t) {
    return ((unsigned)t < KN_DTYPE_COUNT) ? &g_dtypes[t] : NULL;
}
const char *kn_dtype_name(kn_dtype t) {
    const kn_dtype_info *d = kn_dtype_get(t);
    return d ? d->name : "?";
}
size_t kn_dtype_nbytes(kn_dtype t, int64_t n) {
    const kn_dtype_info *d = kn_dtype_get(t);
    if (!d || n < 0) return 0;
    return (size_t)(n / d->block_size) * d->type_size;
}
