/* cpu_conv.c: the CPU backend's CONV2D, CONV_TRANSPOSE2D, CONV2D_BWD_W
 * (im2col/col2im and kn_sgemm) and MAX_POOL2D, MAX_POOL2D_BWD (any strides).
 *
 * Letters: N images, C/O channels, g groups, H/W input and OH/OW output
 * extents, KH/KW kernel, P = OH*OW, K = Cg*KH*KW (im2col rows).
 * Non-goals: Winograd or direct convolution.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemm
#include "backends/cpu/threadpool.h"   // defines: kn_pool_run, kn_pool_nthreads
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ==== convolution ==============================================================
 * conv2d: y[n, g] [Og, P] = w_g [Og, K] @ col(x[n, g]) [K, P] (+ bias);
 * conv_transpose2d: col [Og*KH*KW, H*W] = w_g^T @ x[n, g], scattered into y
 * (col2im); conv2d_bwd_w: dw_g [Cgb, K] = sum_n b[n, g] [Cgb, P] @ col(a[n, g])^T. */
typedef struct { int64_t H, W, OH, OW, KH, KW; int sh, sw, ph, pw, dh, dw; } conv_geo;
static conv_geo geo(const kn_tensor *t, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW) {
    conv_geo g = {H, W, OH, OW, KH, KW, t->p.conv.stride[0], t->p.conv.stride[1], t->p.conv.padding[0],
                  t->p.conv.padding[1], t->p.conv.dilation[0], t->p.conv.dilation[1]};
    return g;
}
/* col [Cg*KH*KW, OH*OW] from channels c0.. of image n of x (any strides) */
static void im2col(const kn_tview *x, int64_t n, int64_t c0, int64_t Cg, const conv_geo *g, float *col) {
    const float *xb = (const float *)x->data + n * x->st[0];
    int64_t P = g->OH * g->OW, sy = x->st[2], sx = x->st[3];
    for (int64_t c = 0; c < Cg; c++) {
        const float *xc = xb + (c0 + c) * x->st[1];
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                float *row = col + ((c * g->KH + kh) * g->KW + kw) * P;
                int64_t off = kw * g->dw - g->pw;      /* ix = ox*sw + off */
                /* valid ox: 0 <= ox*sw + off < W */
                int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
                int64_t hi = g->W - off <= 0 ? 0 : (g->W - off + g->sw - 1) / g->sw;
                if (hi > g->OW) hi = g->OW;
                if (lo > hi) lo = hi;
                for (int64_t oy = 0; oy < g->OH; oy++) {
                    float *r = row + oy * g->OW;
                    int64_t iy = oy * g->sh - g->ph + kh * g->dh;
                    if (iy < 0 || iy >= g->H) { memset(r, 0, sizeof(float) * (size_t)g->OW); continue; }
                    const float *xr = xc + iy * sy;
                    for (int64_t ox = 0; ox < lo; ox++) r[ox] = 0;
                    if (sx == 1 && g->sw == 1) memcpy(r + lo, xr + lo + off, sizeof(float) * (size_t)(hi - lo));
                    else for (int64_t ox = lo; ox < hi; ox++) r[ox] = xr[(ox * g->sw + off) * sx];
                    for (int64_t ox = hi; ox < g->OW; ox++) r[ox] = 0;
                }
            }
    }
}
/* [nc, HW] channels c0.. of image n: a pointer into v when those planes are
 * consecutive, else a packed copy in buf */
static const float *planes(const kn_tview *v, int64_t n, int64_t c0, int64_t nc, float *buf) {
    int64_t H = v->ne[2], W = v->ne[3];
    const float *b = (const float *)v->data + n * v->st[0] + c0 * v->st[1];
    if ((W == 1 || v->st[3] == 1) && (H == 1 || v->st[2] == W) && (nc == 1 || v->st[1] == H * W)) return b;
    for (int64_t c = 0; c < nc; c++)
        for (int64_t i = 0; i < H; i++)
            for (int64_t k = 0; k < W; k++) buf[(c * H + i) * W + k] = b[c * v->st[1] + i * v->st[2] + k * v->st[3]];
    return buf;
}
/* y image n is [O, P] consecutive (any image stride) */
static bool out_planes_ok(const kn_tview *y) {
    return (y->ne[3] == 1 || y->st[3] == 1) && (y->ne[2] == 1 || y->st[2] == y->ne[3]) &&
           (y->ne[1] == 1 || y->st[1] == y->ne[2] * y->ne[3]);
}

typedef struct {
    const kn_tview *x, *w, *b, *y;
    int64_t G, Cg, Og, K, P;   /* conv: K = Cg*KH*KW; transpose: K = Og*KH*KW, P = input H*W */
    conv_geo g;
    size_t scratch;            /* floats of scratch per job */
    atomic_int failed;
} conv_job;

static void conv_rows(void *p, int64_t r0, int64_t r1) {
    conv_job *j = p;
    float *col = malloc(sizeof(float) * j->scratch);
    if (!col) { atomic_store(&j->failed, 1); return; }
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->G, gi = r % j->G;
        im2col(j->x, n, gi * j->Cg, j->Cg, &j->g, col);
        const float *wg = (const float *)j->w->data + gi * j->Og * j->K;
        float *yg = (float *)j->y->data + n * j->y->st[0] + gi * j->Og * j->P;
        kn_sgemm(false, false, j->Og, j->P, j->K, 1.0f, wg, j->K, col, j->P, 0.0f, yg, j->P);
        if (j->b)
            for (int64_t o = 0; o < j->Og; o++)
                kn_vec_add_scalar(yg + o * j->P, yg + o * j->P, ((const float *)j->b->data)[(gi * j->Og + o) * j->b->st[0]], j->P);
    }
    free(col);
}
/* Images (x groups) in parallel when there are at least as many as threads,
 * each running a serial GEMM (nested pool calls run inline); fewer images
 * run in turn and let each GEMM use the pool. */
static void conv_run(kn_rows_fn fn, conv_job *j, int64_t rows, int64_t work) {
    int nth = kn_pool_nthreads();
    if (nth >= 2 && rows >= nth && work >= KN_CPU_PAR_MIN) kn_cpu_par_rows(fn, j, rows, work);
    else fn(j, 0, rows);
}

/* conv2d and conv_transpose2d: f32 4-D x, w, y and bias (if any), w
 * contiguous, y's images [O, P] consecutive and apart from x */
static bool conv_operands_ok(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *w = &e->src[1], *y = &e->dst;
    if (e->node->src[2] && !is_f32(&e->src[2])) return false;
    return is_f32(x) && is_f32(w) && is_f32(y) && x->ndim == 4 && w->ndim == 4 && y->ndim == 4 &&
           kn_tview_is_contiguous(w) && out_planes_ok(y) && !kn_cpu_overlap(x, y);
}

bool kn_cpu_conv2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *y = &e->dst;
    const kn_tview *b = t->src[2] ? &e->src[2] : NULL;
    if (!conv_operands_ok(e)) return false;
    int64_t N = y->ne[0], O = y->ne[1], G = t->p.conv.groups, Cg = w->ne[1], KH = w->ne[2], KW = w->ne[3];
    conv_job j = {x, w, b, y, G, Cg, O / G, Cg * KH * KW, y->ne[2] * y->ne[3],
                  geo(t, x->ne[2], x->ne[3], y->ne[2], y->ne[3], KH, KW), 0, 0};
    if (N == 0 || j.P == 0 || O == 0 || j.K == 0) return false;
    j.scratch = (size_t)(j.K * j.P);
    conv_run(conv_rows, &j, N * G, N * O * j.P * j.K);
    return !atomic_load(&j.failed);
}

static void convt_rows(void *p, int64_t r0, int64_t r1) {
    conv_job *j = p;
    const conv_geo *g = &j->g;
    int64_t HW = g->H * g->W, OP = g->OH * g->OW;
    float *col = malloc(sizeof(float) * j->scratch);
    if (!col) { atomic_store(&j->failed, 1); return; }
    float *xbuf = col + j->K * HW;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->G, gi = r % j->G;
        const float *xg = planes(j->x, n, gi * j->Cg, j->Cg, xbuf);
        const float *wg = (const float *)j->w->data + gi * j->Cg * j->K;
        kn_sgemm(true, false, j->K, HW, j->Cg, 1.0f, wg, j->K, xg, HW, 0.0f, col, HW);
        float *yg = (float *)j->y->data + n * j->y->st[0] + gi * j->Og * OP;
        for (int64_t o = 0; o < j->Og; o++) {
            float bv = j->b ? ((const float *)j->b->data)[(gi * j->Og + o) * j->b->st[0]] : 0.0f;
            float *yo = yg + o * OP;
            for (int64_t k = 0; k < OP; k++) yo[k] = bv;
            for (int64_t kh = 0; kh < g->KH; kh++)
                for (int64_t kw = 0; kw < g->KW; kw++) {
                    const float *cr = col + ((o * g->KH + kh) * g->KW + kw) * HW;
                    for (int64_t iy = 0; iy < g->H; iy++) {
                        int64_t oy = iy * g->sh - g->ph + kh * g->dh;
                        if (oy < 0 || oy >= g->OH) continue;
                        float *yr = yo + oy * g->OW;
                        const float *c = cr + iy * g->W;
                        for (int64_t ix = 0; ix < g->W; ix++) {
                            int64_t ox = ix * g->sw - g->pw + kw * g->dw;
                            if (ox >= 0 && ox < g->OW) yr[ox] += c[ix];
                        }
                    }
                }
        }
    }
    free(col);
}
bool kn_cpu_conv_transpose2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *y = &e->dst;
    const kn_tview *b = t->src[2] ? &e->src[2] : NULL;
    if (!conv_operands_ok(e)) return false;
    int64_t N = y->ne[0], O = y->ne[1], C = x->ne[1], G = t->p.conv.groups, Og = w->ne[1], KH = w->ne[2], KW = w->ne[3];
    if (G < 1 || C % G || O != G * Og) return false;
    conv_job j = {x, w, b, y, G, C / G, Og, Og * KH * KW, x->ne[2] * x->ne[3],
                  geo(t, x->ne[2], x->ne[3], y->ne[2], y->ne[3], KH, KW), 0, 0};
    if (N == 0 || j.P == 0 || O == 0 || j.K == 0 || j.Cg == 0) return false;
    j.scratch = (size_t)(j.K * j.P + j.Cg * j.P);
    conv_run(convt_rows, &j, N * G, N * O * j.P * j.K);
    return !atomic_load(&j.failed);
}

/* conv2d_bwd_w: a = src 0 [N, Ca, H, W], b = src 1 [N, Cb, OH, OW], dw [Cb, Cga, KH, KW].
 * nparts jobs each sum their share of the images into a private dw. */
typedef struct {
    const kn_tview *a, *b; float *part; int nparts;
    int64_t N, G, Cga, Cgb, K, P; conv_geo g;
    atomic_int failed;
} bww_job;
static void bww_part(void *p, int ith, int nth) {
    bww_job *j = p;
    (void)nth;
    int64_t n0 = j->N * ith / j->nparts, n1 = j->N * (ith + 1) / j->nparts;
    float *dw = j->part + (size_t)ith * (size_t)(j->G * j->Cgb * j->K);
    float *col = malloc(sizeof(float) * (size_t)(j->K * j->P + j->Cgb * j->P));
    if (!col) { atomic_store(&j->failed, 1); return; }
    float *bbuf = col + j->K * j->P;
    for (int64_t gi = 0; gi < j->G; gi++) {
        float *dwg = dw + gi * j->Cgb * j->K;
        if (n0 == n1) memset(dwg, 0, sizeof(float) * (size_t)(j->Cgb * j->K));
        for (int64_t n = n0; n < n1; n++) {
            im2col(j->a, n, gi * j->Cga, j->Cga, &j->g, col);
            const float *bg = planes(j->b, n, gi * j->Cgb, j->Cgb, bbuf);
            kn_sgemm(false, true, j->Cgb, j->K, j->P, 1.0f, bg, j->P, col, j->P, n == n0 ? 0.0f : 1.0f, dwg, j->K);
        }
    }
    free(col);
}
bool kn_cpu_conv2d_bwd_w(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *a = &e->src[0], *b = &e->src[1], *dw = &e->dst;
    if (!is_f32(a) || !is_f32(b) || !is_f32(dw) || a->ndim != 4 || b->ndim != 4 || dw->ndim != 4) return false;
    if (!kn_tview_is_contiguous(dw) || kn_cpu_overlap(dw, a) || kn_cpu_overlap(dw, b)) return false;
    int64_t N = b->ne[0], Cb = dw->ne[0], Cga = dw->ne[1], KH = dw->ne[2], KW = dw->ne[3], G = t->p.conv.groups;
    if (G < 1 || Cb % G || a->ne[1] != G * Cga || b->ne[1] != Cb || a->ne[0] != N) return false;
    bww_job j = {a, b, NULL, 1, N, G, Cga, Cb / G, Cga * KH * KW, b->ne[2] * b->ne[3],
                 geo(t, a->ne[2], a->ne[3], b->ne[2], b->ne[3], KH, KW), 0};
    int64_t total = Cb * j.K;
    if (N == 0 || total == 0 || j.P == 0) return false;
    int64_t work = N * Cb * j.K * j.P;
    int nth = kn_pool_nthreads();
    j.nparts = (work >= KN_CPU_PAR_MIN && nth >= 2 && N >= 2) ? (int)(N < nth ? N : nth) : 1;
    if (j.nparts == 1) j.part = dw->data;
    else if (!(j.part = malloc(sizeof(float) * (size_t)(total * j.nparts)))) return false;
    if (j.nparts == 1) bww_part(&j, 0, 1);
    else kn_pool_run(bww_part, &j, j.nparts);
    if (atomic_load(&j.failed)) { if (j.nparts > 1) free(j.part); return false; }   /* the reference redoes it */
    if (j.nparts > 1) {
        float *out = dw->data;
        memcpy(out, j.part, sizeof(float) * (size_t)total);
        for (int k = 1; k < j.nparts; k++) kn_vec_add(out, out, j.part + (size_t)k * (size_t)total, total);
        free(j.part);
    }
    return true;
}

/* ==== max pooling ==============================================================
 * Leading dims are planes, the last two pooled; any strides. The first
 * maximum of a window wins and NaN propagates, like the reference. */
typedef struct { const kn_tview *x, *y, *dy; int64_t H, W, OH, OW; int k[2], s[2], p[2], d[2]; atomic_int failed; } pool_job;
static int64_t win_max(const pool_job *j, const float *x, int64_t sy, int64_t sx, int64_t oy, int64_t ox, float *val) {
    float m = -INFINITY;
    int64_t arg = -1;
    for (int kh = 0; kh < j->k[0]; kh++) {
        int64_t iy = oy * j->s[0] - j->p[0] + (int64_t)kh * j->d[0];
        if (iy < 0 || iy >= j->H) continue;
        for (int kw = 0; kw < j->k[1]; kw++) {
            int64_t ix = ox * j->s[1] - j->p[1] + (int64_t)kw * j->d[1];
            if (ix < 0 || ix >= j->W) continue;
            float v = x[iy * sy + ix * sx];
            if (arg < 0 || v > m || isnan(v)) { m = v; arg = iy * j->W + ix; }
        }
    }
    *val = m;
    return arg;
}
static void mp_rows(void *p, int64_t r0, int64_t r1) {
    pool_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int nd = x->ndim;
    for (int64_t r = r0; r < r1; r++) {
        const float *xb = (const float *)x->data + off_lead(x, nd - 2, r);
        float *yb = (float *)y->data + off_lead(y, nd - 2, r);
        for (int64_t oy = 0; oy < j->OH; oy++)
            for (int64_t ox = 0; ox < j->OW; ox++) {
                float m;
                win_max(j, xb, x->st[nd - 2], x->st[nd - 1], oy, ox, &m);
                yb[oy * y->st[nd - 2] + ox * y->st[nd - 1]] = m;
            }
    }
}
static void mpb_rows(void *p, int64_t r0, int64_t r1) {
    pool_job *j = p;
    const kn_tview *x = j->x, *dy = j->dy, *dx = j->y;
    int nd = x->ndim;
    float *acc = malloc(sizeof(float) * (size_t)(j->H * j->W));
    if (!acc) { atomic_store(&j->failed, 1); return; }
    for (int64_t r = r0; r < r1; r++) {
        const float *xb = (const float *)x->data + off_lead(x, nd - 2, r);
        const float *gb = (const float *)dy->data + off_lead(dy, nd - 2, r);
        float *db = (float *)dx->data + off_lead(dx, nd - 2, r);
        memset(acc, 0, sizeof(float) * (size_t)(j->H * j->W));
        for (int64_t oy = 0; oy < j->OH; oy++)
            for (int64_t ox = 0; ox < j->OW; ox++) {
                float m;
                int64_t arg = win_max(j, xb, x->st[nd - 2], x->st[nd - 1], oy, ox, &m);
                if (arg >= 0) acc[arg] += gb[oy * dy->st[nd - 2] + ox * dy->st[nd - 1]];
            }
        for (int64_t iy = 0; iy < j->H; iy++)
            for (int64_t ix = 0; ix < j->W; ix++) db[iy * dx->st[nd - 2] + ix * dx->st[nd - 1]] = acc[iy * j->W + ix];
    }
    free(acc);
}
bool kn_cpu_max_pool(const kn_exec *e) {
    const kn_tensor *t = e->node;
    bool bwd = t->op == KN_OP_MAX_POOL2D_BWD;
    const kn_tview *x = &e->src[0], *y = &e->dst, *out = bwd ? &e->src[1] : &e->dst;
    int nd = x->ndim;
    if (!is_f32(x) || !is_f32(y) || (bwd && !is_f32(out)) || nd < 2 || y->ndim != nd || out->ndim != nd) return false;
    if (kn_cpu_overlap(x, y) || (bwd && kn_cpu_overlap(out, y))) return false;
    pool_job j = {x, bwd ? y : out, bwd ? out : NULL, x->ne[nd - 2], x->ne[nd - 1], out->ne[nd - 2], out->ne[nd - 1],
                  {0}, {0}, {0}, {0}, 0};
    for (int i = 0; i < 2; i++) {
        j.k[i] = t->p.pool.kernel[i]; j.s[i] = t->p.pool.stride[i];
        j.p[i] = t->p.pool.padding[i]; j.d[i] = t->p.pool.dilation[i];
    }
    int64_t planes = prod(x, 0, nd - 2);
    if (planes == 0 || j.H * j.W == 0) return false;
    kn_cpu_par_rows(bwd ? mpb_rows : mp_rows, &j, planes, planes * (j.OH * j.OW * j.k[0] * j.k[1] + (bwd ? j.H * j.W : 0)));
    return !atomic_load(&j.failed);
}


/* ==== unfold (im2col) and fold (col2im) ==========================================
 * UNFOLD: x [N,C,H,W] any strides -> y [N, C*KH*KW, L] with each image's
 * [C*KH*KW, L] block consecutive: one im2col per (image, channel).
 * FOLD: col [N, C*KH*KW, L] with consecutive blocks -> y [N,C,H,W] with
 * consecutive [C, H*W] planes: each (image, channel) plane zeroed, then
 * every column row added in (the loop of convt_rows). f32 only. */
typedef struct { const kn_tview *img, *col; conv_geo g; int64_t C; } fold_job;
static conv_geo patch_geo(const kn_tensor *t, int64_t H, int64_t W) {
    conv_geo g = {H, W, 0, 0, t->p.pool.kernel[0], t->p.pool.kernel[1], t->p.pool.stride[0], t->p.pool.stride[1],
                  t->p.pool.padding[0], t->p.pool.padding[1], t->p.pool.dilation[0], t->p.pool.dilation[1]};
    g.OH = (H + 2 * g.ph - g.dh * (g.KH - 1) - 1) / g.sh + 1;
    g.OW = (W + 2 * g.pw - g.dw * (g.KW - 1) - 1) / g.sw + 1;
    return g;
}
static void unfold_rows(void *p, int64_t r0, int64_t r1) {
    fold_job *j = p;
    int64_t KK = j->g.KH * j->g.KW, L = j->g.OH * j->g.OW;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->C, c = r % j->C;
        im2col(j->img, n, c, 1, &j->g, (float *)j->col->data + n * j->col->st[0] + c * KK * L);
    }
}
static void fold_rows(void *p, int64_t r0, int64_t r1) {
    fold_job *j = p;
    const conv_geo *g = &j->g;
    int64_t KK = g->KH * g->KW, L = g->OH * g->OW, HW = g->H * g->W;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->C, c = r % j->C;
        const float *cb = (const float *)j->col->data + n * j->col->st[0] + c * KK * L;
        float *yb = (float *)j->img->data + n * j->img->st[0] + c * HW;
        memset(yb, 0, sizeof(float) * (size_t)HW);
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const float *cr = cb + (kh * g->KW + kw) * L;
                int64_t off = kw * g->dw - g->pw;
                for (int64_t oy = 0; oy < g->OH; oy++) {
                    int64_t iy = oy * g->sh - g->ph + kh * g->dh;
                    if (iy < 0 || iy >= g->H) continue;
                    float *yr = yb + iy * g->W;
                    const float *c0 = cr + oy * g->OW;
                    for (int64_t ox = 0; ox < g->OW; ox++) {
                        int64_t ix = ox * g->sw + off;
                        if (ix >= 0 && ix < g->W) yr[ix] += c0[ox];
                    }
                }
            }
    }
}
bool kn_cpu_fold(const kn_exec *e) {
    bool unfold = e->node->op == KN_OP_UNFOLD;
    const kn_tview *img = unfold ? &e->src[0] : &e->dst, *col = unfold ? &e->dst : &e->src[0];
    if (!is_f32(img) || !is_f32(col) || img->ndim != 4 || col->ndim != 3 || kn_cpu_overlap(img, col)) return false;
    int64_t N = img->ne[0], C = img->ne[1];
    fold_job j = {img, col, patch_geo(e->node, img->ne[2], img->ne[3]), C};
    int64_t KK = j.g.KH * j.g.KW, L = j.g.OH * j.g.OW;
    /* the column side: each image's [C*KK, L] consecutive */
    if (col->ne[1] != C * KK || col->ne[2] != L || (L > 1 && col->st[2] != 1) || (C * KK > 1 && col->st[1] != L)) return false;
    if (!unfold && !out_planes_ok(img)) return false;
    if (N * C == 0 || L == 0) return false;
    kn_cpu_par_rows(unfold ? unfold_rows : fold_rows, &j, N * C, N * C * KK * L);
    return true;
}
