/* tview.c: element load/store by dtype and view helpers used by backends. */
#include "core/core.h"
#include "core/fp16.h"
#include <math.h>
#include <string.h>

int64_t kn_tview_numel(const kn_tview *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->ne[i];
    return n;
}

bool kn_tview_is_contiguous(const kn_tview *v) {
    int64_t s = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->ne[i] != 1 && v->st[i] != s) return false;
        s *= v->ne[i];
    }
    return true;
}

void kn_tview_dense(kn_tview *v, void *data, kn_dtype dt) {
    v->data = data;
    v->dtype = dt;
    v->buf = NULL;
    int64_t s = 1;
    for (int i = v->ndim - 1; i >= 0; i--) { v->st[i] = s; s *= v->ne[i]; }
}

kn_tview kn_tview_broadcast(const kn_tview *v, int ndim, const int64_t *ne) {
    kn_tview r = *v;
    r.ndim = ndim;
    int off = ndim - v->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - off;
        if (j < 0 || v->ne[j] == 1) { r.ne[i] = ne[i]; r.st[i] = 0; }
        else { r.ne[i] = v->ne[j]; r.st[i] = v->st[j]; }
    }
    return r;
}

double kn_load(kn_dtype t, const void *base, int64_t i) {
    switch (t) {
    case KN_F32: return ((const float *)base)[i];
    case KN_F64: return ((const double *)base)[i];
    case KN_F16: return kn_fp16_to_fp32(((const uint16_t *)base)[i]);
    case KN_BF16: return kn_bf16_to_fp32(((const uint16_t *)base)[i]);
    case KN_I8: return ((const int8_t *)base)[i];
    case KN_I32: return ((const int32_t *)base)[i];
    case KN_I64: return (double)((const int64_t *)base)[i];
    case KN_U8: return ((const uint8_t *)base)[i];
    case KN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return NAN;
    }
}

/* Float -> int conversions truncate toward zero like C/PyTorch casts and
 * saturate at the type's range (NaN becomes 0) instead of being UB. */
static int64_t sat(double v, double lo, double hi) {
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

void kn_store(kn_dtype t, void *base, int64_t i, double v) {
    switch (t) {
    case KN_F32: ((float *)base)[i] = (float)v; break;
    case KN_F64: ((double *)base)[i] = v; break;
    case KN_F16: ((uint16_t *)base)[i] = kn_fp32_to_fp16((float)v); break;
    case KN_BF16: ((uint16_t *)base)[i] = kn_fp32_to_bf16((float)v); break;
    case KN_I8: ((int8_t *)base)[i] = (int8_t)sat(v, -128, 127); break;
    case KN_I32: ((int32_t *)base)[i] = (int32_t)sat(v, -2147483648.0, 2147483647.0); break;
    case KN_I64: ((int64_t *)base)[i] = sat(v, -9.2233720368547758e18, 9.2233720368547748e18); break;
    case KN_U8: ((uint8_t *)base)[i] = (uint8_t)sat(v, 0, 255); break;
    case KN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: break;
    }
}
