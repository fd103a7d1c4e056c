/* quantize.c: weight quantizers with ggml's reference semantics (see
 * quantize.h for what each type does and why this is not kn_quantize_row).
 *
 * Every function takes one block (32 or 256 floats) and writes one block
 * struct of quant.h. Float expressions keep ggml's order of operations so
 * that the rounding is the same. Letters: x the block's floats, L the
 * integer levels, d the scale, m / dmin the min terms.
 */
#include "backends/quant/quantize.h"   /* defines: kn_quantize_weights          */
#include "backends/quant/quant.h"      /* defines: block structs, kn_q45k_sc_m   */
#include "core/fp16.h"                 /* defines: kn_fp32_to_fp16, bf16        */
#include <float.h>
#include <math.h>
#include <string.h>

#define F16(x) kn_fp16_to_fp32(x)
#define GROUP_MAX_EPS 1e-15f     /* below this a group counts as all zeros (ggml) */

/* round half to even, as ggml's nearest_int (exact for |x| < 2^22) */
static inline int nearest(float x) { return (int)lrintf(x); }
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* ---- 32-element blocks ---------------------------------------------------- */

/* the element of largest magnitude, first one on ties */
static float extremum(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

static void q4_0(const float *x, kn_block_q4_0 *y) {
    float d = extremum(x, 32) / -8, id = d ? 1.0f / d : 0.0f;
    y->d = kn_fp32_to_fp16(d);
    for (int j = 0; j < 16; j++) {
        int a = imin(15, (int8_t)(x[j] * id + 8.5f)), b = imin(15, (int8_t)(x[16 + j] * id + 8.5f));
        y->qs[j] = (uint8_t)(a | b << 4);
    }
}

static void minmax(const float *x, int n, float *lo, float *hi) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < n; j++) { if (x[j] < mn) mn = x[j]; if (x[j] > mx) mx = x[j]; }
    *lo = mn; *hi = mx;
}

static void q4_1(const float *x, kn_block_q4_1 *y) {
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
    y->d = kn_fp32_to_fp16(d);
    y->m = kn_fp32_to_fp16(mn);
    for (int j = 0; j < 16; j++) {
        int a = imin(15, (int8_t)((x[j] - mn) * id + 0.5f)), b = imin(15, (int8_t)((x[16 + j] - mn) * id + 0.5f));
        y->qs[j] = (uint8_t)(a | b << 4);
    }
}

/* the 5th bits of q[0..32) as the little-endian uint32 qh */
static void put_qh(const int q[32], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void q5_0(const float *x, kn_block_q5_0 *y) {
    float d = extremum(x, 32) / -16, id = d ? 1.0f / d : 0.0f;
    y->d = kn_fp32_to_fp16(d);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = imin(31, (int8_t)(x[j] * id + 16.5f));
    for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)((q[j] & 15) | (q[16 + j] & 15) << 4);
    put_qh(q, y->qh);
}

static void q5_1(const float *x, kn_block_q5_1 *y) {
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    float d = (mx - mn) / 31, id = d ? 1.0f / d : 0.0f;
    y->d = kn_fp32_to_fp16(d);
    y->m = kn_fp32_to_fp16(mn);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = imin(31, (uint8_t)((x[j] - mn) * id + 0.5f));
    for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)((q[j] & 15) | (q[16 + j] & 15) << 4);
    put_qh(q, y->qh);
}

static void q8_0(const float *x, kn_block_q8_0 *y) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    y->d = kn_fp32_to_fp16(d);
    for (int j = 0; j < 32; j++) y->qs[j] = (int8_t)roundf(x[j] * id);
}

/* ---- K types: scale searches ---------------------------------------------- */

/* Levels L[i] in 0..nmax and (scale, min <= 0) with x ~ scale * L + min that
 * (locally) minimise sum w (scale L + min - x)^2: the plain min/max fit,
 * then nstep + 1 candidate inverse scales (rmin + rdelta * is + nmax) /
 * (max - min), each refit by weighted least squares. Returns the scale;
 * *neg_min = -min. (ggml: make_qkx2_quants with use_mad false.) */
static float search_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, nearest(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur += w[i] * (diff * diff);
            }
            if (cur < best) {
                memcpy(L, Laux, (size_t)n);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* Symmetric levels L[i] = nmax + l, l in -nmax..nmax-1, with x ~ scale * l:
 * 19 candidate scales around -nmax / extremum, the best by the x^2-weighted
 * least-squares criterion. Returns the scale (ggml: make_qx_quants, rmse_type 1). */
static float search_scale_sym(int n, int nmax, const float *x, uint8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nearest(iscale * x[i])));
        L[i] = (uint8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(-nmax, imin(nmax - 1, nearest(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (uint8_t)(nmax + imax(-nmax, imin(nmax - 1, nearest(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q4_K / Q5_K common part: levels L[256] (0..nmax), d, dmin and the packed
 * 6-bit scales/mins of one super-block. */
static void k_scales(const float *x, int nmax, float rmin, int nstep, uint16_t *d16, uint16_t *dmin16,
                     uint8_t scales[12], uint8_t L[256]) {
    float w[32], mins[8], sc[8], max_scale = 0, max_min = 0;
    uint8_t Laux[32];
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xj[l]);
        sc[j] = search_scale_min(32, nmax, xj, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = imin(63, nearest(inv_scale * sc[j])), lm = imin(63, nearest(inv_min * mins[j]));
        if (j < 4) {
            scales[j] = (uint8_t)ls;
            scales[j + 4] = (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d16 = kn_fp32_to_fp16(max_scale / 63.f);
    *dmin16 = kn_fp32_to_fp16(max_min / 63.f);
    /* the levels again against the rounded scales (a zero scale keeps the search's) */
    for (int j = 0; j < 8; j++) {
        int s, m;
        kn_q45k_sc_m(scales, j, &s, &m);
        float d = F16(*d16) * s;
        if (!d) continue;
        float dm = F16(*dmin16) * m;
        for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)imax(0, imin(nmax, nearest((x[32 * j + i] + dm) / d)));
    }
}

static void q4_K(const float *x, kn_block_q4_K *y) {
    uint8_t L[256];
    k_scales(x, 15, -1.f, 20, &y->d, &y->dmin, y->scales, L);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) y->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
}

static void q5_K(const float *x, kn_block_q5_K *y) {
    uint8_t L[256];
    k_scales(x, 31, -0.5f, 15, &y->d, &y->dmin, y->scales, L);
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int a = L[64 * c + l], b = L[64 * c + 32 + l];
            y->qs[32 * c + l] = (uint8_t)((a & 15) | (b & 15) << 4);
            y->qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
        }
}

static void q6_K(const float *x, kn_block_q6_K *y) {
    uint8_t L[256];
    float sc[16], max_scale = 0, max_abs = 0;
    for (int b = 0; b < 16; b++) {
        sc[b] = search_scale_sym(16, 32, x + 16 * b, L + 16 * b);
        if (fabsf(sc[b]) > max_abs) { max_abs = fabsf(sc[b]); max_scale = sc[b]; }
    }
    if (max_abs < GROUP_MAX_EPS) {          /* all (near) zero: an all-zero block */
        memset(y, 0, sizeof *y);
        return;
    }
    float iscale = -128.f / max_scale;
    y->d = kn_fp32_to_fp16(1 / iscale);
    for (int b = 0; b < 16; b++) y->scales[b] = (int8_t)imin(127, nearest(iscale * sc[b]));
    for (int b = 0; b < 16; b++) {
        float d = F16(y->d) * y->scales[b];
        if (!d) continue;
        for (int i = 0; i < 16; i++) L[16 * b + i] = (uint8_t)(imax(-32, imin(31, nearest(x[16 * b + i] / d))) + 32);
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *q = L + 128 * h;
        uint8_t *ql = y->ql + 64 * h, *qh = y->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((q[l] & 15) | (q[l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((q[l + 32] & 15) | (q[l + 96] & 15) << 4);
            qh[l] = (uint8_t)((q[l] >> 4) | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 | (q[l + 96] >> 4) << 6);
        }
    }
}

/* ---- entry ----------------------------------------------------------------- */

bool kn_quantize_weights_supported(kn_dtype t) {
    switch (t) {
    case KN_F32: case KN_F16: case KN_BF16: case KN_Q4_0: case KN_Q4_1: case KN_Q5_0: case KN_Q5_1:
    case KN_Q8_0: case KN_Q4_K: case KN_Q5_K: case KN_Q6_K:
        return true;
    default:
        return false;
    }
}

kn_status kn_quantize_weights(kn_dtype t, const float *src, void *dst, int64_t n) {
    if (!kn_quantize_weights_supported(t))
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_quantize_weights: cannot write %s; the targets are f32, f16, bf16, "
                            "q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K and q6_K", kn_dtype_name(t));
    int64_t bs = kn_dtype_get(t)->block_size;
    if (!src || !dst || n < 0 || n % bs)
        return kn_set_error(KN_ERR_INVALID, "kn_quantize_weights(%s): n = %lld must be a multiple of %lld (and the "
                            "pointers non-NULL)", kn_dtype_name(t), (long long)n, (long long)bs);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(src[i]))
            return kn_set_error(KN_ERR_INVALID, "kn_quantize_weights(%s): element %lld is %g; only finite weights "
                                "can be quantized", kn_dtype_name(t), (long long)i, (double)src[i]);
    int64_t nb = n / bs;
    switch (t) {
    case KN_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case KN_F16: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = kn_fp32_to_fp16(src[i]); break;
    case KN_BF16: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = kn_fp32_to_bf16(src[i]); break;
    case KN_Q4_0: for (int64_t i = 0; i < nb; i++) q4_0(src + 32 * i, (kn_block_q4_0 *)dst + i); break;
    case KN_Q4_1: for (int64_t i = 0; i < nb; i++) q4_1(src + 32 * i, (kn_block_q4_1 *)dst + i); break;
    case KN_Q5_0: for (int64_t i = 0; i < nb; i++) q5_0(src + 32 * i, (kn_block_q5_0 *)dst + i); break;
    case KN_Q5_1: for (int64_t i = 0; i < nb; i++) q5_1(src + 32 * i, (kn_block_q5_1 *)dst + i); break;
    case KN_Q8_0: for (int64_t i = 0; i < nb; i++) q8_0(src + 32 * i, (kn_block_q8_0 *)dst + i); break;
    case KN_Q4_K: for (int64_t i = 0; i < nb; i++) q4_K(src + 256 * i, (kn_block_q4_K *)dst + i); break;
    case KN_Q5_K: for (int64_t i = 0; i < nb; i++) q5_K(src + 256 * i, (kn_block_q5_K *)dst + i); break;
    case KN_Q6_K: for (int64_t i = 0; i < nb; i++) q6_K(src + 256 * i, (kn_block_q6_K *)dst + i); break;
    default: break;
    }
    return KN_OK;
}
