/* ref_fold.c: the reference UNFOLD (im2col) and FOLD (col2im), stated in
 * src/graph/ops_spatial.c, over any strides, in double.
 *
 * Letters: N images, C channels, H/W image extents, KH/KW the kernel,
 * OH/OW the grid of block positions, L = OH*OW. Column row r = (c*KH + kh)*KW
 * + kw, column l = oy*OW + ox holds image element (c, oy*sh - ph + kh*dh,
 * ox*sw - pw + kw*dw), zero outside the image. FOLD sums each column entry
 * into that element (entries outside the image are dropped).
 */
#include "backends/ref/ref.h"
#include <stdlib.h>

typedef struct { int64_t C, H, W, KH, KW, OH, OW; int sh, sw, ph, pw, dh, dw; } fold_geo;

/* img: the [N,C,H,W] side, col: the [N, C*KH*KW, L] side */
static fold_geo geo_of(const kn_tensor *t, const kn_tview *img) {
    fold_geo g = {img->ne[1], img->ne[2], img->ne[3], t->p.pool.kernel[0], t->p.pool.kernel[1], 0, 0,
                  t->p.pool.stride[0], t->p.pool.stride[1], t->p.pool.padding[0], t->p.pool.padding[1],
                  t->p.pool.dilation[0], t->p.pool.dilation[1]};
    g.OH = (g.H + 2 * g.ph - g.dh * (g.KH - 1) - 1) / g.sh + 1;
    g.OW = (g.W + 2 * g.pw - g.dw * (g.KW - 1) - 1) / g.sw + 1;
    return g;
}

kn_status kn_ref_fold(const kn_exec *e) {
    bool unfold = e->node->op == KN_OP_UNFOLD;
    const kn_tview *img = unfold ? &e->src[0] : &e->dst, *col = unfold ? &e->dst : &e->src[0];
    fold_geo g = geo_of(e->node, img);
    int64_t N = img->ne[0], KK = g.KH * g.KW, L = g.OH * g.OW, HW = g.H * g.W;
    double *acc = NULL;
    if (!unfold) {
        int64_t total = N * g.C * HW;
        acc = calloc((size_t)(total > 0 ? total : 1), sizeof(double));
        if (!acc) return kn_set_error(KN_ERR_NOMEM, "fold: out of memory");
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < g.C; c++)
            for (int64_t k = 0; k < KK; k++) {
                int64_t kh = k / g.KW, kw = k % g.KW, r = c * KK + k;
                for (int64_t l = 0; l < L; l++) {
                    int64_t iy = (l / g.OW) * g.sh - g.ph + kh * g.dh, ix = (l % g.OW) * g.sw - g.pw + kw * g.dw;
                    bool in = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W;
                    int64_t co = n * col->st[0] + r * col->st[1] + l * col->st[2];
                    if (unfold)
                        ST(col, co, in ? LD(img, n * img->st[0] + c * img->st[1] + iy * img->st[2] + ix * img->st[3]) : 0.0);
                    else if (in)
                        acc[(n * g.C + c) * HW + iy * g.W + ix] += LD(col, co);
                }
            }
    if (!unfold) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < g.C; c++)
                for (int64_t i = 0; i < HW; i++)
                    ST(img, n * img->st[0] + c * img->st[1] + (i / g.W) * img->st[2] + (i % g.W) * img->st[3],
                       acc[(n * g.C + c) * HW + i]);
        free(acc);
    }
    return KN_OK;
}
