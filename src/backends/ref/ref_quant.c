/* ref_quant.c: quantized operands for the reference kernels. A quantized
 * view is dequantized into a temporary f32 copy of its whole storage span
 * (same strides), so any kernel can then read it with kn_load. */
#include "backends/ref/ref.h"
#include "backends/quant/quant.h"
#include <stdlib.h>

kn_status kn_ref_dequant_view(const kn_tview *v, kn_tview *out, float **tmp) {
    *out = *v;
    *tmp = NULL;
    const kn_dtype_info *di = kn_dtype_get(v->dtype);
    if (!di->is_quant) return KN_OK;
    int64_t span = 1;
    for (int i = 0; i < v->ndim; i++) {
        if (v->ne[i] == 0) { span = 0; break; }
        if (v->st[i] < 0) return kn_set_error(KN_ERR_UNSUPPORTED, "%s view with a negative stride", di->name);
        span += (v->ne[i] - 1) * v->st[i];
    }
    span = (span + di->block_size - 1) / di->block_size * di->block_size;
    *tmp = malloc(sizeof(float) * (size_t)(span ? span : 1));
    if (!*tmp) return kn_set_error(KN_ERR_NOMEM, "out of memory dequantizing %lld %s elements", (long long)span, di->name);
    kn_status st = kn_dequantize_row(v->dtype, v->data, *tmp, span);
    if (st) { free(*tmp); *tmp = NULL; return st; }
    out->data = *tmp;
    out->dtype = KN_F32;
    return KN_OK;
}
