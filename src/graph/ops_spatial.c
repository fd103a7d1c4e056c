/* ops_spatial.c: patches and resampling over the spatial dims of [N, C, ...]
 * images: unfold / fold (nodes UNFOLD, FOLD), interpolate and conv3d
 * (compositions of existing ops).
 *
 * Letters: N images, C channels, D/H/W spatial extents, KD/KH/KW kernel,
 * OD/OH/OW output extents, L = OH*OW block positions, g groups, Cg = C/g.
 *
 * UNFOLD (im2col) and FOLD (col2im) are each other's adjoint, so each one's
 * gradient is the other (src/autograd/rules_nn.c). Both keep kernel, stride,
 * padding and dilation in p.pool; the grid OH x OW follows from the image
 * side (x for unfold, the output for fold) as in torch.
 *
 * interpolate is separable: it resamples one spatial dim at a time, last
 * first (torch's evaluation order for bilinear: along W within each row,
 * then along H). Nearest is an index_select with host-computed indices;
 * linear is two index_selects and a lerp with host-computed weights
 * (y = x[i0] * l0 + x[i1] * l1), so the gradient is index_add's and the
 * indices and weights are computed once, in torch's arithmetic (float for
 * f32/f16/bf16 data, double for f64). A dim whose map is the identity is
 * left alone.
 *
 * conv3d is one conv2d: x is moved to [N, D, C, H, W] (plus a zero plane
 * that padded rows read), the KD depth taps of output plane od, rows
 * d = od*sd + kd*dd - pd, are taken by one index_select as channels [g][kd][Cg] of a [N*OD, g*KD*Cg, H, W] batch
 * (a permute between the group and the tap when g > 1), and the
 * weight [O, Cg, KD, KH, KW] is reordered to [O, KD*Cg, KH, KW] to match.
 * The conv2d does the same multiply-adds as a direct conv3d through the
 * backends' conv2d kernels (the CPU's im2col + SGEMM; CUDA's), at the cost
 * of a KD-times copy of the input; gradients come from the conv2d,
 * index_select (one index_add), cat and permute rules. The result is made
 * contiguous [N, O, OD, OH, OW], as torch's.
 */
#include "graph/graph.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- unfold / fold ---------------------------------------------------------- */
static bool patch_args(kn_ctx *ctx, const char *op, const int k[2], const int d[2], const int p[2], const int s[2]) {
    if (!k || !d || !p || !s) { kn__fail(ctx, KN_ERR_INVALID, "%s: kernel, dilation, padding and stride must be given (2 ints each)", op); return false; }
    for (int i = 0; i < 2; i++)
        if (k[i] < 1 || d[i] < 1 || s[i] < 1 || p[i] < 0) {
            kn__fail(ctx, KN_ERR_INVALID, "%s: kernel (%d,%d), dilation (%d,%d) and stride (%d,%d) must be >= 1 and padding (%d,%d) >= 0",
                     op, k[0], k[1], d[0], d[1], s[0], s[1], p[0], p[1]);
            return false;
        }
    return true;
}
/* blocks along one dim of extent n; < 1 when the dilated kernel does not fit */
static int64_t blocks(int64_t n, int k, int d, int p, int s) {
    int64_t span = n + 2 * (int64_t)p - (int64_t)d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
}
static void set_patch(kn_tensor *t, const int k[2], const int d[2], const int p[2], const int s[2]) {
    memset(&t->p.pool, 0, sizeof t->p.pool);
    for (int i = 0; i < 2; i++) {
        t->p.pool.kernel[i] = k[i]; t->p.pool.dilation[i] = d[i];
        t->p.pool.padding[i] = p[i]; t->p.pool.stride[i] = s[i];
    }
}
static bool fixed_from(kn_ctx *ctx, const char *op, const kn_tensor *x, int from) {
    char a[160];
    for (int i = from; i < x->ndim; i++)
        if (x->sym[i]) { kn__fail(ctx, KN_ERR_INVALID, "%s: dim %d of %s is symbolic; only the batch dim may be", op, i, kn__shape_str(x, a, sizeof a)); return false; }
    return true;
}

kn_tensor *kn_unfold(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int dilation[2], const int padding[2],
                     const int stride[2]) {
    if (!x) return NULL;
    char a[160];
    if (x->ndim != 3 && x->ndim != 4)
        return kn__fail(ctx, KN_ERR_INVALID, "unfold: input must be [N,C,H,W] or [C,H,W], got %s", kn__shape_str(x, a, sizeof a));
    if (!patch_args(ctx, "unfold", kernel, dilation, padding, stride)) return NULL;
    const kn_dtype_info *xi = kn_dtype_get(x->dtype);
    if (xi->is_quant || x->dtype == KN_BOOL)
        return kn__fail(ctx, KN_ERR_INVALID, "unfold: x must be a float or integer tensor, got %s", kn_dtype_name(x->dtype));
    bool batched = x->ndim == 4;
    kn_tensor *x4 = batched ? x : kn_unsqueeze(ctx, x, 0);
    if (!x4 || !fixed_from(ctx, "unfold", x4, 1)) return NULL;
    int64_t C = x4->shape[1], OH = blocks(x4->shape[2], kernel[0], dilation[0], padding[0], stride[0]),
            OW = blocks(x4->shape[3], kernel[1], dilation[1], padding[1], stride[1]);
    if (OH < 1 || OW < 1)
        return kn__fail(ctx, KN_ERR_INVALID, "unfold: the dilated kernel (%d,%d) (dilation %d,%d) does not fit the padded input %s (padding %d,%d)",
                        kernel[0], kernel[1], dilation[0], dilation[1], kn__shape_str(x, a, sizeof a), padding[0], padding[1]);
    int64_t shape[3] = {x4->shape[0], C * kernel[0] * kernel[1], OH * OW};
    int8_t sym[3] = {x4->sym[0], 0, 0};
    kn_tensor *t = kn__node(ctx, KN_OP_UNFOLD, x->dtype, 3, shape, sym, &x4, 1);
    if (!t) return NULL;
    set_patch(t, kernel, dilation, padding, stride);
    return batched ? t : kn_squeeze(ctx, t, 0);
}

kn_tensor *kn_fold(kn_ctx *ctx, kn_tensor *x, const int64_t out_size[2], const int kernel[2], const int dilation[2],
                   const int padding[2], const int stride[2]) {
    if (!x) return NULL;
    char a[160];
    if (x->ndim != 2 && x->ndim != 3)
        return kn__fail(ctx, KN_ERR_INVALID, "fold: input must be [N, C*KH*KW, L] or [C*KH*KW, L], got %s", kn__shape_str(x, a, sizeof a));
    if (!patch_args(ctx, "fold", kernel, dilation, padding, stride)) return NULL;
    if (!out_size || out_size[0] < 1 || out_size[1] < 1)
        return kn__fail(ctx, KN_ERR_INVALID, "fold: output_size must be two extents >= 1");
    const kn_dtype_info *xi = kn_dtype_get(x->dtype);
    if (xi->is_quant || x->dtype == KN_BOOL)
        return kn__fail(ctx, KN_ERR_INVALID, "fold: x must be a float or integer tensor, got %s", kn_dtype_name(x->dtype));
    bool batched = x->ndim == 3;
    kn_tensor *x3 = batched ? x : kn_unsqueeze(ctx, x, 0);
    if (!x3 || !fixed_from(ctx, "fold", x3, 1)) return NULL;
    int64_t KK = (int64_t)kernel[0] * kernel[1], OH = blocks(out_size[0], kernel[0], dilation[0], padding[0], stride[0]),
            OW = blocks(out_size[1], kernel[1], dilation[1], padding[1], stride[1]);
    if (x3->shape[1] % KK)
        return kn__fail(ctx, KN_ERR_INVALID, "fold: dim 1 of %s must be a multiple of the kernel's %d x %d = %lld taps (C*KH*KW)",
                        kn__shape_str(x, a, sizeof a), kernel[0], kernel[1], (long long)KK);
    if (OH < 1 || OW < 1 || x3->shape[2] != OH * OW)
        return kn__fail(ctx, KN_ERR_INVALID, "fold: %s has %lld blocks but output_size (%lld,%lld) with kernel (%d,%d), dilation (%d,%d), "
                        "padding (%d,%d), stride (%d,%d) gives %lld x %lld = %lld",
                        kn__shape_str(x, a, sizeof a), (long long)x3->shape[2], (long long)out_size[0], (long long)out_size[1],
                        kernel[0], kernel[1], dilation[0], dilation[1], padding[0], padding[1], stride[0], stride[1],
                        (long long)OH, (long long)OW, (long long)(OH * OW));
    int64_t shape[4] = {x3->shape[0], x3->shape[1] / KK, out_size[0], out_size[1]};
    int8_t sym[4] = {x3->sym[0], 0, 0, 0};
    kn_tensor *t = kn__node(ctx, KN_OP_FOLD, x->dtype, 4, shape, sym, &x3, 1);
    if (!t) return NULL;
    set_patch(t, kernel, dilation, padding, stride);
    return batched ? t : kn_squeeze(ctx, t, 0);
}

/* ---- interpolate ------------------------------------------------------------ */
/* x resampled along dim from n to m: nearest (idx1, w NULL) or linear */
static kn_tensor *resample_dim(kn_ctx *ctx, kn_tensor *x, int dim, int64_t m, double scale, kn_interp_mode mode,
                               bool align) {
    int64_t n = x->shape[dim];
    bool dbl = x->dtype == KN_F64;
    int64_t *i0 = malloc(sizeof(int64_t) * (size_t)m * 2);
    double *l = malloc(sizeof(double) * (size_t)m * 2);
    if (!i0 || !l) { free(i0); free(l); return kn__fail(ctx, KN_ERR_NOMEM, "interpolate: out of memory"); }
    int64_t *i1 = i0 + m;
    double *l1 = l + m;
    bool ident = n == m;
    if (mode == KN_INTERP_NEAREST) {
        /* torch's nearest_idx: float scale, floorf, clamped */
        float s = scale > 0 ? (float)(1.0 / scale) : (float)n / (float)m;
        for (int64_t j = 0; j < m; j++) {
            int64_t v = n == m ? j : m == 2 * n ? j >> 1 : (int64_t)floorf((float)j * s);
            i0[j] = v < n - 1 ? v : n - 1;
            ident &= i0[j] == j;
        }
    } else {
        /* area_pixel_compute_scale / _source_index and guard_index_and_lambda, in
         * the data's opmath type (float, or double for f64) */
        for (int64_t j = 0; j < m; j++) {
            double real, lam;
            int64_t v;
            if (dbl) {
                double s = align ? (m > 1 ? (double)(n - 1) / (double)(m - 1) : 0.0) : scale > 0 ? 1.0 / scale : (double)n / (double)m;
                double r = align ? s * (double)j : s * ((double)j + 0.5) - 0.5;
                real = !align && r < 0 ? 0.0 : r;
                v = (int64_t)floor(real);
                if (v > n - 1) v = n - 1;
                lam = real - (double)v;
            } else {
                float s = align ? (m > 1 ? (float)(n - 1) / (float)(m - 1) : 0.0f) : scale > 0 ? (float)(1.0 / scale) : (float)n / (float)m;
                float r = align ? s * (float)j : s * ((float)j + 0.5f) - 0.5f;
                float rf = !align && r < 0 ? 0.0f : r;
                v = (int64_t)floorf(rf);
                if (v > n - 1) v = n - 1;
                lam = (double)(rf - (float)v);
                real = rf;
            }
            (void)real;
            if (lam < 0) lam = 0;
            if (lam > 1) lam = 1;
            i0[j] = v;
            i1[j] = v + (v < n - 1 ? 1 : 0);
            l1[j] = lam;
            l[j] = dbl ? 1.0 - lam : (double)(1.0f - (float)lam);
            ident &= v == j && lam == 0;
        }
    }
    kn_tensor *y = x;
    if (!ident) {
        kn_tensor *a = kn_index_select(ctx, x, dim, kn_from_data(ctx, KN_I64, 1, &m, i0));
        if (mode == KN_INTERP_NEAREST) y = a;
        else {
            kn_tensor *b = kn_index_select(ctx, x, dim, kn_from_data(ctx, KN_I64, 1, &m, i1));
            int64_t ws[KN_MAX_DIMS];
            int wn = x->ndim - dim;
            ws[0] = m;
            for (int k = 1; k < wn; k++) ws[k] = 1;
            kn_tensor *w0, *w1;
            if (dbl) { w0 = kn_from_data(ctx, KN_F64, wn, ws, l); w1 = kn_from_data(ctx, KN_F64, wn, ws, l1); }
            else {
                float *f = malloc(sizeof(float) * (size_t)m * 2);
                if (!f) { free(i0); free(l); return kn__fail(ctx, KN_ERR_NOMEM, "interpolate: out of memory"); }
                for (int64_t j = 0; j < 2 * m; j++) f[j] = (float)l[j];
                w0 = kn_cast(ctx, kn_from_data(ctx, KN_F32, wn, ws, f), x->dtype);
                w1 = kn_cast(ctx, kn_from_data(ctx, KN_F32, wn, ws, f + m), x->dtype);
                free(f);
            }
            y = kn_add(ctx, kn_mul(ctx, a, w0), kn_mul(ctx, b, w1));
        }
    }
    free(i0); free(l);
    return y;
}

kn_tensor *kn_interpolate(kn_ctx *ctx, kn_tensor *x, const int64_t *size, const double *scale, kn_interp_mode mode,
                          bool align_corners) {
    if (!x) return NULL;
    char a[160];
    if (x->ndim < 3 || x->ndim > 5)
        return kn__fail(ctx, KN_ERR_INVALID, "interpolate: x must be [N,C,W], [N,C,H,W] or [N,C,D,H,W], got %s", kn__shape_str(x, a, sizeof a));
    if (mode != KN_INTERP_NEAREST && mode != KN_INTERP_LINEAR)
        return kn__fail(ctx, KN_ERR_INVALID, "interpolate: unknown mode %d (KN_INTERP_NEAREST or KN_INTERP_LINEAR)", (int)mode);
    if (mode == KN_INTERP_NEAREST && align_corners)
        return kn__fail(ctx, KN_ERR_INVALID, "interpolate: align_corners applies to linear modes only (torch refuses it for nearest too)");
    if ((size == NULL) == (scale == NULL))
        return kn__fail(ctx, KN_ERR_INVALID, "interpolate: give exactly one of size and scale factors");
    const kn_dtype_info *xi = kn_dtype_get(x->dtype);
    if (!xi->is_float || xi->is_quant)
        return kn__fail(ctx, KN_ERR_INVALID, "interpolate: x must be a float tensor, got %s", kn_dtype_name(x->dtype));
    if (!fixed_from(ctx, "interpolate", x, 2)) return NULL;
    int ns = x->ndim - 2;
    int64_t out[3];
    for (int i = 0; i < ns; i++) {
        int64_t n = x->shape[2 + i];
        if (size) {
            if (size[i] < 1) return kn__fail(ctx, KN_ERR_INVALID, "interpolate: size[%d] = %lld must be >= 1", i, (long long)size[i]);
            out[i] = size[i];
        } else {
            if (!(scale[i] > 0) || !isfinite(scale[i]))
                return kn__fail(ctx, KN_ERR_INVALID, "interpolate: scale factor %d = %g must be a finite number > 0", i, scale[i]);
            double o = floor((double)n * scale[i]);
            if (o < 1 || o > 1e12)
                return kn__fail(ctx, KN_ERR_INVALID, "interpolate: scale factor %g turns extent %lld of %s into %g; the output needs 1.. elements",
                                scale[i], (long long)n, kn__shape_str(x, a, sizeof a), o);
            out[i] = (int64_t)o;
        }
    }
    kn_tensor *y = x;
    for (int i = ns - 1; i >= 0 && y; i--)
        y = resample_dim(ctx, y, 2 + i, out[i], scale ? scale[i] : 0, mode, align_corners);
    return y;
}

/* ---- conv3d ------------------------------------------------------------------ */
kn_tensor *kn_conv3d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[3], const int padding[3],
                     const int dilation[3], int groups) {
    if (!x || !w) return NULL;
    char s1[160], s2[160];
    if (x->ndim != 5 || w->ndim != 5)
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d: input must be [N,C,D,H,W] and weight [O,C/g,KD,KH,KW], got %s and %s",
                        kn__shape_str(x, s1, sizeof s1), kn__shape_str(w, s2, sizeof s2));
    if (!stride || !padding || !dilation)
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d: stride, padding and dilation must be given (3 ints each)");
    for (int i = 0; i < 3; i++)
        if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0)
            return kn__fail(ctx, KN_ERR_INVALID, "conv3d: stride (%d,%d,%d) and dilation (%d,%d,%d) must be >= 1 and padding (%d,%d,%d) >= 0",
                            stride[0], stride[1], stride[2], dilation[0], dilation[1], dilation[2], padding[0], padding[1], padding[2]);
    if (groups < 1) return kn__fail(ctx, KN_ERR_INVALID, "conv3d: groups = %d must be >= 1", groups);
    if (!fixed_from(ctx, "conv3d", x, 1) || !fixed_from(ctx, "conv3d", w, 0)) return NULL;
    int64_t N = x->shape[0], C = x->shape[1], D = x->shape[2], H = x->shape[3], W = x->shape[4];
    int64_t O = w->shape[0], Cg = w->shape[1], KD = w->shape[2];
    if (C % groups || O % groups || Cg * groups != C)
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d: input %s has %lld channels, weight %s expects %lld x %d groups (groups must divide %lld output channels)",
                        kn__shape_str(x, s1, sizeof s1), (long long)C, kn__shape_str(w, s2, sizeof s2), (long long)Cg, groups, (long long)O);
    int64_t OD = blocks(D, (int)KD, dilation[0], padding[0], stride[0]);
    if (KD < 1 || OD < 1)
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d: the (dilated) kernel %s is larger than the padded input %s in depth (padding %d, dilation %d)",
                        kn__shape_str(w, s2, sizeof s2), kn__shape_str(x, s1, sizeof s1), padding[0], dilation[0]);
    if (x->sym[0])
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d: the batch dim of %s is symbolic; conv3d needs fixed extents (it reshapes N*OD)",
                        kn__shape_str(x, s1, sizeof s1));
    /* [N, D, C, H, W] in one copy; with depth padding a zero plane D is
     * appended (a cat, whose gradient is a view) and padded rows read it */
    kn_tensor *xt = kn_permute(ctx, x, (const int[]){0, 2, 1, 3, 4});
    if (padding[0]) {
        kn_tensor *parts[2] = {xt, kn_zeros(ctx, x->dtype, 5, (const int64_t[]){N, 1, C, H, W})};
        xt = kn_cat(ctx, parts, 2, 1);
    } else xt = kn_contiguous(ctx, xt);
    if (!xt) return NULL;
    /* the taps: rows od*sd + kd*dd of D for (od, kd), one index_select (its
     * gradient is one index_add) -> [N, OD, KD, C, H, W] */
    int64_t G = groups, nt = OD * KD;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)nt);
    if (!rows) return kn__fail(ctx, KN_ERR_NOMEM, "conv3d: out of memory");
    for (int64_t od = 0; od < OD; od++)
        for (int64_t kd = 0; kd < KD; kd++) {
            int64_t d = od * stride[0] + kd * dilation[0] - padding[0];
            rows[od * KD + kd] = d >= 0 && d < D ? d : D;           /* D: the zero plane */
        }
    kn_tensor *taps = kn_index_select(ctx, xt, 1, kn_from_data(ctx, KN_I64, 1, &nt, rows));
    free(rows);
    kn_tensor *x2;
    if (G == 1) x2 = kn_reshape(ctx, taps, 4, (const int64_t[]){N * OD, KD * C, H, W});
    else {
        /* channels [g][kd][Cg]: the group outside the tap */
        kn_tensor *t7 = kn_reshape(ctx, taps, 7, (const int64_t[]){N, OD, KD, G, Cg, H, W});
        x2 = kn_reshape(ctx, kn_permute(ctx, t7, (const int[]){0, 1, 3, 2, 4, 5, 6}), 4, (const int64_t[]){N * OD, G * KD * Cg, H, W});
    }
    kn_tensor *w2 = kn_reshape(ctx, kn_contiguous(ctx, kn_permute(ctx, w, (const int[]){0, 2, 1, 3, 4})), 4,
                               (const int64_t[]){O, KD * Cg, w->shape[3], w->shape[4]});
    int st2[2] = {stride[1], stride[2]}, pd2[2] = {padding[1], padding[2]}, dl2[2] = {dilation[1], dilation[2]};
    kn_tensor *y2 = kn_conv2d(ctx, x2, w2, b, st2, pd2, dl2, groups);
    if (!y2) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn__fail(ctx, KN_ERR_INVALID, "conv3d (as conv2d over depth taps): %s", msg);
    }
    kn_tensor *y = kn_reshape(ctx, y2, 5, (const int64_t[]){N, OD, O, y2->shape[2], y2->shape[3]});
    return kn_contiguous(ctx, kn_permute(ctx, y, (const int[]){0, 2, 1, 3, 4}));   /* torch's layout: reductions and the next layer read it fast */
}
