/* ref_nn.c: reference kernels of the nn family: softmax, norms, convolution,
 * pooling, attention, rope.
 *
 * Direct loops in double over kn_tview operands with any strides (the
 * oracle; no speed goals). Letters: N batch, C/O channels, H/W spatial,
 * KH/KW kernel, g groups, T positions, D head dim. A source slot the node
 * left NULL (optional weight/bias) is tested on e->node->src[k].
 */
#include "backends/ref/ref.h"
#include <math.h>
#include <stdlib.h>

/* offset of linear index lin over every dim of v except `skip` */
static int64_t off_skip(const kn_tview *v, int skip, int64_t lin) {
    int64_t o = 0;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (d == skip) continue;
        o += (lin % v->ne[d]) * v->st[d];
        lin /= v->ne[d];
    }
    return o;
}
/* offset of linear index lin over the first n dims of v */
static int64_t off_lead(const kn_tview *v, int n, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % v->ne[d]) * v->st[d]; lin /= v->ne[d]; }
    return o;
}
static int64_t prod_ne(const kn_tview *v, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= v->ne[d];
    return n;
}
#define OFF4(v, a, b, c, d) ((a) * (v)->st[0] + (b) * (v)->st[1] + (c) * (v)->st[2] + (d) * (v)->st[3])
#define HAS(k) (e->node->src[k] != NULL)

/* ---- softmax / log_softmax along p.axis.dim (dst may alias x) ---------------- */
static kn_status softmax(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.axis.dim;
    int64_t n = x->ne[d], rows = n ? kn_tview_numel(x) / n : 0;
    bool logsm = e->node->op == KN_OP_LOG_SOFTMAX;
    for (int64_t r = 0; r < rows; r++) {
        int64_t xo = off_skip(x, d, r), yo = off_skip(y, d, r);
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < n; j++) { double v = LD(x, xo + j * x->st[d]); if (v > m) m = v; }
        /* a row of -inf gives m = -inf and NaN below, like torch */
        for (int64_t j = 0; j < n; j++) s += exp(LD(x, xo + j * x->st[d]) - m);
        double ls = log(s);
        for (int64_t j = 0; j < n; j++) {
            double v = LD(x, xo + j * x->st[d]) - m;
            ST(y, yo + j * y->st[d], logsm ? v - ls : exp(v) / s);
        }
    }
    return KN_OK;
}

/* ---- norms --------------------------------------------------------------------- */
/* mean (0 for rms) and rstd of row r (M elements) of x, in two passes */
static void row_stats(const kn_tview *x, int64_t r, int64_t M, bool rms, double eps, double *mean, double *rstd) {
    double m = 0, ss = 0;
    if (!rms) {
        for (int64_t j = 0; j < M; j++) m += LD(x, kn_ref_off(x, r * M + j));
        m /= (double)M;
    }
    for (int64_t j = 0; j < M; j++) { double v = LD(x, kn_ref_off(x, r * M + j)) - m; ss += v * v; }
    *mean = m;
    *rstd = 1.0 / sqrt(ss / (double)M + eps);
}

/* layer norm and rms norm over the trailing n_norm dims */
static kn_status layer_rms_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    const kn_tview *w = HAS(1) ? &e->src[1] : NULL, *b = (t->op == KN_OP_LAYER_NORM && HAS(2)) ? &e->src[2] : NULL;
    int nn = (int)t->p.norm.n_norm;
    int64_t M = prod_ne(x, x->ndim - nn, x->ndim), rows = M ? kn_tview_numel(x) / M : 0;
    double eps = t->p.norm.eps;
    for (int64_t r = 0; r < rows; r++) {
        double mean, rstd;
        row_stats(x, r, M, t->op != KN_OP_LAYER_NORM, eps, &mean, &rstd);
        for (int64_t j = 0; j < M; j++) {
            double v = (LD(x, kn_ref_off(x, r * M + j)) - mean) * rstd;
            if (w) v *= LD(w, kn_ref_off(w, j));
            if (b) v += LD(b, kn_ref_off(b, j));
            ST(y, kn_ref_off(y, r * M + j), v);
        }
    }
    return KN_OK;
}

/* NORM_BWD (ops_nn.c): x, weight (optional), g -> [dx | dw | db] packed flat;
 * the statistics recomputed as layer_rms_norm takes them, the parameter sums
 * accumulated over rows in order */
static kn_status norm_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *g = &e->src[2], *d = &e->dst;
    const kn_tview *w = HAS(1) ? &e->src[1] : NULL;
    bool rms = t->p.norm.rms;
    int nn = (int)t->p.norm.n_norm;
    int64_t M = prod_ne(x, x->ndim - nn, x->ndim), nx = kn_tview_numel(x), rows = M ? nx / M : 0;
    int64_t parts = M ? (kn_tview_numel(d) - nx) / M : 0;
    double eps = t->p.norm.eps, *acc = NULL;
    if (parts > 0 && !(acc = calloc((size_t)(2 * M), sizeof *acc)))
        return kn_set_error(KN_ERR_NOMEM, "norm_bwd: out of memory for %lld sums", (long long)(2 * M));
    for (int64_t r = 0; r < rows; r++) {
        double mean, rstd, s1 = 0, s2 = 0;
        row_stats(x, r, M, rms, eps, &mean, &rstd);
        for (int64_t j = 0; j < M; j++) {
            double xh = (LD(x, kn_ref_off(x, r * M + j)) - mean) * rstd, gv = LD(g, kn_ref_off(g, r * M + j));
            double dxh = w ? gv * LD(w, kn_ref_off(w, j)) : gv;
            s1 += dxh; s2 += dxh * xh;
            if (acc) { acc[j] += gv * xh; acc[M + j] += gv; }
        }
        s1 = rms ? 0 : s1 / (double)M; s2 /= (double)M;
        for (int64_t j = 0; j < M; j++) {
            double xh = (LD(x, kn_ref_off(x, r * M + j)) - mean) * rstd, gv = LD(g, kn_ref_off(g, r * M + j));
            double dxh = w ? gv * LD(w, kn_ref_off(w, j)) : gv;
            ST(d, kn_ref_off(d, r * M + j), rstd * (dxh - s1 - xh * s2));
        }
    }
    for (int64_t k = 0; k < parts * M; k++) ST(d, kn_ref_off(d, nx + k), acc[k]);
    free(acc);
    return KN_OK;
}

/* x [N,C,S...]: normalise each set of linear indices {base + j*stride_j} ...
 * group norm: (n, group) blocks of Cg*S consecutive elements;
 * batch norm: per channel c, the N*S elements (n*C + c)*S + s. */
static kn_status group_batch_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    const kn_tview *w = HAS(1) ? &e->src[1] : NULL, *b = HAS(2) ? &e->src[2] : NULL;
    int64_t N = x->ne[0], C = x->ne[1], S = prod_ne(x, 2, x->ndim);
    bool bn = t->op == KN_OP_BATCH_NORM;
    int64_t G = bn ? C : t->p.norm.groups, Cg = C / G;
    int64_t nsets = bn ? C : N * G, M = bn ? N * S : Cg * S;
    double eps = t->p.norm.eps;
    for (int64_t k = 0; k < nsets; k++) {
        /* linear index of element j of set k */
#define LIN(j) (bn ? (((j) / S) * C + k) * S + (j) % S : k * M + (j))
        double mean = 0, ss = 0;
        for (int64_t j = 0; j < M; j++) mean += LD(x, kn_ref_off(x, LIN(j)));
        mean = M ? mean / (double)M : 0;
        for (int64_t j = 0; j < M; j++) { double v = LD(x, kn_ref_off(x, LIN(j))) - mean; ss += v * v; }
        double rstd = 1.0 / sqrt((M ? ss / (double)M : 0) + eps);
        for (int64_t j = 0; j < M; j++) {
            int64_t lin = LIN(j), c = (lin / S) % C;
            double v = (LD(x, kn_ref_off(x, lin)) - mean) * rstd;
            if (w) v *= LD(w, c * w->st[0]);
            if (b) v += LD(b, c * b->st[0]);
            ST(y, kn_ref_off(y, lin), v);
        }
#undef LIN
    }
    return KN_OK;
}

/* ---- convolution --------------------------------------------------------------- */
/* y [N,O,OH,OW] = x [N,C,H,W] (*) w [O,C/g,KH,KW] + b [O] */
static kn_status conv2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *b = HAS(2) ? &e->src[2] : NULL, *y = &e->dst;
    int64_t N = y->ne[0], O = y->ne[1], OH = y->ne[2], OW = y->ne[3], H = x->ne[2], W = x->ne[3];
    int64_t G = t->p.conv.groups, Cg = w->ne[1], Og = O / G, KH = w->ne[2], KW = w->ne[3];
    int sh = t->p.conv.stride[0], sw = t->p.conv.stride[1], ph = t->p.conv.padding[0], pw = t->p.conv.padding[1];
    int dh = t->p.conv.dilation[0], dw = t->p.conv.dilation[1];
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++) {
            int64_t grp = oc / Og;
            for (int64_t oy = 0; oy < OH; oy++)
                for (int64_t ox = 0; ox < OW; ox++) {
                    double acc = b ? LD(b, oc * b->st[0]) : 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < KH; kh++) {
                            int64_t iy = oy * sh - ph + kh * dh;
                            if (iy < 0 || iy >= H) continue;
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ix = ox * sw - pw + kw * dw;
                                if (ix < 0 || ix >= W) continue;
                                acc += LD(x, OFF4(x, n, grp * Cg + c, iy, ix)) * LD(w, OFF4(w, oc, c, kh, kw));
                            }
                        }
                    ST(y, OFF4(y, n, oc, oy, ox), acc);
                }
        }
    return KN_OK;
}

/* y [N,O,OH,OW] = x [N,C,H,W] (*)^T w [C,O/g,KH,KW] + b [O]: input pixel
 * (iy, ix) of channel c adds x * w[c, o] to output (iy*s - p + kh*d, ...). */
static kn_status conv_transpose2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *b = HAS(2) ? &e->src[2] : NULL, *y = &e->dst;
    int64_t N = y->ne[0], O = y->ne[1], OH = y->ne[2], OW = y->ne[3], C = x->ne[1], H = x->ne[2], W = x->ne[3];
    int64_t G = t->p.conv.groups, Cg = C / G, Og = w->ne[1], KH = w->ne[2], KW = w->ne[3];
    int sh = t->p.conv.stride[0], sw = t->p.conv.stride[1], ph = t->p.conv.padding[0], pw = t->p.conv.padding[1];
    int dh = t->p.conv.dilation[0], dw = t->p.conv.dilation[1];
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++) {
            int64_t grp = oc / Og, o = oc % Og;
            for (int64_t oy = 0; oy < OH; oy++)
                for (int64_t ox = 0; ox < OW; ox++) {
                    double acc = b ? LD(b, oc * b->st[0]) : 0;
                    for (int64_t c = grp * Cg; c < (grp + 1) * Cg; c++)
                        for (int64_t kh = 0; kh < KH; kh++) {
                            int64_t ty = oy + ph - kh * dh;
                            if (ty < 0 || ty % sh) continue;
                            int64_t iy = ty / sh;
                            if (iy >= H) continue;
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t tx = ox + pw - kw * dw;
                                if (tx < 0 || tx % sw) continue;
                                int64_t ix = tx / sw;
                                if (ix >= W) continue;
                                acc += LD(x, OFF4(x, n, c, iy, ix)) * LD(w, OFF4(w, c, o, kh, kw));
                            }
                        }
                    ST(y, OFF4(y, n, oc, oy, ox), acc);
                }
        }
    return KN_OK;
}

/* dw [Cb, Ca/g, KH, KW] = sum over n, oy, ox of b[n, o, oy, ox] * a[n, grp*Ca/g + c,
 * oy*s - p + kh*d, ox*s - p + kw*d], grp = o / (Cb/g). With a = x, b = dy it is
 * conv2d's weight gradient; with a = dy, b = x conv_transpose2d's. */
static kn_status conv2d_bwd_w(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *a = &e->src[0], *b = &e->src[1], *dw = &e->dst;
    int64_t N = b->ne[0], Cb = dw->ne[0], Cga = dw->ne[1], KH = dw->ne[2], KW = dw->ne[3];
    int64_t OH = b->ne[2], OW = b->ne[3], H = a->ne[2], W = a->ne[3];
    int64_t G = t->p.conv.groups, Cgb = Cb / G;
    int sh = t->p.conv.stride[0], sw = t->p.conv.stride[1], ph = t->p.conv.padding[0], pw = t->p.conv.padding[1];
    int dh = t->p.conv.dilation[0], ddw = t->p.conv.dilation[1];
    for (int64_t o = 0; o < Cb; o++) {
        int64_t grp = o / Cgb;
        for (int64_t c = 0; c < Cga; c++)
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++) {
                    double acc = 0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t oy = 0; oy < OH; oy++) {
                            int64_t iy = oy * sh - ph + kh * dh;
                            if (iy < 0 || iy >= H) continue;
                            for (int64_t ox = 0; ox < OW; ox++) {
                                int64_t ix = ox * sw - pw + kw * ddw;
                                if (ix < 0 || ix >= W) continue;
                                acc += LD(b, OFF4(b, n, o, oy, ox)) * LD(a, OFF4(a, n, grp * Cga + c, iy, ix));
                            }
                        }
                    ST(dw, OFF4(dw, o, c, kh, kw), acc);
                }
    }
    return KN_OK;
}

/* ---- pooling ---------------------------------------------------------------------
 * Leading dims are planes; the last two are pooled. */
typedef struct { int64_t planes, H, W, OH, OW; int k[2], s[2], p[2], d[2]; } pool_geo;

static pool_geo geo_of(const kn_tensor *t, const kn_tview *in, const kn_tview *out) {
    pool_geo g;
    int n = in->ndim;
    g.planes = prod_ne(in, 0, n - 2);
    g.H = in->ne[n - 2]; g.W = in->ne[n - 1]; g.OH = out->ne[n - 2]; g.OW = out->ne[n - 1];
    for (int i = 0; i < 2; i++) {
        g.k[i] = t->p.pool.kernel[i]; g.s[i] = t->p.pool.stride[i];
        g.p[i] = t->p.pool.padding[i]; g.d[i] = t->p.pool.dilation[i];
    }
    return g;
}
#define OFF2(v, base, i, j) ((base) + (i) * (v)->st[(v)->ndim - 2] + (j) * (v)->st[(v)->ndim - 1])

/* position (iy*W + ix) of the max of window (oy, ox), -1 if the window holds no
 * input element; the first max wins and NaN propagates (as torch). */
static int64_t max_window(const kn_tview *x, int64_t base, const pool_geo *g, int64_t oy, int64_t ox, double *val) {
    double m = -INFINITY;
    int64_t arg = -1;
    for (int kh = 0; kh < g->k[0]; kh++) {
        int64_t iy = oy * g->s[0] - g->p[0] + (int64_t)kh * g->d[0];
        if (iy < 0 || iy >= g->H) continue;
        for (int kw = 0; kw < g->k[1]; kw++) {
            int64_t ix = ox * g->s[1] - g->p[1] + (int64_t)kw * g->d[1];
            if (ix < 0 || ix >= g->W) continue;
            double v = LD(x, OFF2(x, base, iy, ix));
            if (arg < 0 || v > m || isnan(v)) { m = v; arg = iy * g->W + ix; }
        }
    }
    *val = m;
    return arg;
}

static kn_status max_pool2d(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    pool_geo g = geo_of(e->node, x, y);
    for (int64_t pl = 0; pl < g.planes; pl++) {
        int64_t xb = off_lead(x, x->ndim - 2, pl), yb = off_lead(y, y->ndim - 2, pl);
        for (int64_t oy = 0; oy < g.OH; oy++)
            for (int64_t ox = 0; ox < g.OW; ox++) {
                double m;
                max_window(x, xb, &g, oy, ox, &m);
                ST(y, OFF2(y, yb, oy, ox), m);
            }
    }
    return KN_OK;
}

/* dx [.., H, W] from x (src 0) and dy (src 1): each dy goes to its window's argmax */
static kn_status max_pool2d_bwd(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *dy = &e->src[1], *dx = &e->dst;
    pool_geo g = geo_of(e->node, x, dy);
    double *acc = malloc(sizeof(double) * (size_t)(g.H * g.W > 0 ? g.H * g.W : 1));
    if (!acc) return kn_set_error(KN_ERR_NOMEM, "max_pool2d_bwd: out of memory");
    for (int64_t pl = 0; pl < g.planes; pl++) {
        int64_t xb = off_lead(x, x->ndim - 2, pl), gb = off_lead(dy, dy->ndim - 2, pl), db = off_lead(dx, dx->ndim - 2, pl);
        for (int64_t i = 0; i < g.H * g.W; i++) acc[i] = 0;
        for (int64_t oy = 0; oy < g.OH; oy++)
            for (int64_t ox = 0; ox < g.OW; ox++) {
                double m;
                int64_t arg = max_window(x, xb, &g, oy, ox, &m);
                if (arg >= 0) acc[arg] += LD(dy, OFF2(dy, gb, oy, ox));
            }
        for (int64_t iy = 0; iy < g.H; iy++)
            for (int64_t ix = 0; ix < g.W; ix++) ST(dx, OFF2(dx, db, iy, ix), acc[iy * g.W + ix]);
    }
    free(acc);
    return KN_OK;
}

/* torch's avg-pool window: [y0,y1) x [x0,x1) clipped to the input, and the divisor */
static double avg_window(const pool_geo *g, bool include_pad, int64_t oy, int64_t ox,
                         int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1) {
    int64_t hs = oy * g->s[0] - g->p[0], ws = ox * g->s[1] - g->p[1];
    int64_t he = hs + g->k[0], we = ws + g->k[1];
    if (he > g->H + g->p[0]) he = g->H + g->p[0];
    if (we > g->W + g->p[1]) we = g->W + g->p[1];
    int64_t pool = (he - hs) * (we - ws);
    if (hs < 0) hs = 0;
    if (ws < 0) ws = 0;
    if (he > g->H) he = g->H;
    if (we > g->W) we = g->W;
    *y0 = hs; *y1 = he; *x0 = ws; *x1 = we;
    return include_pad ? (double)pool : (double)((he - hs) * (we - ws));
}

static kn_status avg_pool2d(const kn_exec *e, bool bwd) {
    const kn_tensor *t = e->node;
    /* forward: x -> y; backward: dy (src 0) -> dx (dst, x's shape) */
    const kn_tview *in = bwd ? &e->dst : &e->src[0], *out = bwd ? &e->src[0] : &e->dst;
    pool_geo g = geo_of(t, in, out);
    bool inc = t->p.pool.count_include_pad;
    double *acc = NULL;
    if (bwd && !(acc = malloc(sizeof(double) * (size_t)(g.H * g.W > 0 ? g.H * g.W : 1))))
        return kn_set_error(KN_ERR_NOMEM, "avg_pool2d_bwd: out of memory");
    for (int64_t pl = 0; pl < g.planes; pl++) {
        int64_t ib = off_lead(in, in->ndim - 2, pl), ob = off_lead(out, out->ndim - 2, pl);
        if (bwd) for (int64_t i = 0; i < g.H * g.W; i++) acc[i] = 0;
        for (int64_t oy = 0; oy < g.OH; oy++)
            for (int64_t ox = 0; ox < g.OW; ox++) {
                int64_t y0, y1, x0, x1;
                double div = avg_window(&g, inc, oy, ox, &y0, &y1, &x0, &x1);
                if (bwd) {
                    double v = LD(out, OFF2(out, ob, oy, ox)) / div;
                    for (int64_t iy = y0; iy < y1; iy++)
                        for (int64_t ix = x0; ix < x1; ix++) acc[iy * g.W + ix] += v;
                } else {
                    double s = 0;
                    for (int64_t iy = y0; iy < y1; iy++)
                        for (int64_t ix = x0; ix < x1; ix++) s += LD(in, OFF2(in, ib, iy, ix));
                    ST(out, OFF2(out, ob, oy, ox), s / div);
                }
            }
        if (bwd)
            for (int64_t iy = 0; iy < g.H; iy++)
                for (int64_t ix = 0; ix < g.W; ix++) ST(in, OFF2(in, ib, iy, ix), acc[iy * g.W + ix]);
    }
    free(acc);
    return KN_OK;
}

/* adaptive: output cell i covers [floor(i*H/OH), ceil((i+1)*H/OH)) */
static kn_status adaptive_avg_pool2d(const kn_exec *e, bool bwd) {
    const kn_tview *in = bwd ? &e->dst : &e->src[0], *out = bwd ? &e->src[0] : &e->dst;
    int n = in->ndim;
    int64_t planes = prod_ne(in, 0, n - 2), H = in->ne[n - 2], W = in->ne[n - 1], OH = out->ne[n - 2], OW = out->ne[n - 1];
    double *acc = NULL;
    if (bwd && !(acc = malloc(sizeof(double) * (size_t)(H * W > 0 ? H * W : 1))))
        return kn_set_error(KN_ERR_NOMEM, "adaptive_avg_pool2d_bwd: out of memory");
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t ib = off_lead(in, n - 2, pl), ob = off_lead(out, n - 2, pl);
        if (bwd) for (int64_t i = 0; i < H * W; i++) acc[i] = 0;
        for (int64_t oy = 0; oy < OH; oy++) {
            int64_t y0 = oy * H / OH, y1 = ((oy + 1) * H + OH - 1) / OH;
            for (int64_t ox = 0; ox < OW; ox++) {
                int64_t x0 = ox * W / OW, x1 = ((ox + 1) * W + OW - 1) / OW;
                double cnt = (double)((y1 - y0) * (x1 - x0));
                if (bwd) {
                    double v = LD(out, OFF2(out, ob, oy, ox)) / cnt;
                    for (int64_t iy = y0; iy < y1; iy++)
                        for (int64_t ix = x0; ix < x1; ix++) acc[iy * W + ix] += v;
                } else {
                    double s = 0;
                    for (int64_t iy = y0; iy < y1; iy++)
                        for (int64_t ix = x0; ix < x1; ix++) s += LD(in, OFF2(in, ib, iy, ix));
                    ST(out, OFF2(out, ob, oy, ox), s / cnt);
                }
            }
        }
        if (bwd)
            for (int64_t iy = 0; iy < H; iy++)
                for (int64_t ix = 0; ix < W; ix++) ST(in, OFF2(in, ib, iy, ix), acc[iy * W + ix]);
    }
    free(acc);
    return KN_OK;
}

/* ---- attention --------------------------------------------------------------------
 * y[b,h,i] = sum_j softmax_j(scale * q[b,h,i] . k[b,h/G,j]) v[b,h/G,j], G = Hq/Hkv;
 * causal drops keys j > i + (Tk - Tq) (a row with no key left is NaN); a
 * window W also drops keys j <= i + (Tk - Tq) - W; a softcap c maps each
 * score s to c tanh(s / c). */
static void sdpa_keys(const kn_tensor *t, int64_t i, int64_t Tq, int64_t Tk, int64_t *lo, int64_t *hi) {
    *lo = 0; *hi = Tk;
    if (t->p.sdpa.causal && i + (Tk - Tq) + 1 < *hi) *hi = i + (Tk - Tq) + 1;
    if (t->p.sdpa.window > 0 && i + (Tk - Tq) + 1 - t->p.sdpa.window > 0) *lo = i + (Tk - Tq) + 1 - t->p.sdpa.window;
}
static kn_status sdpa(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    int64_t G = Hq / Hkv;
    double scale = t->p.sdpa.scale;
    double *s = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    if (!s) return kn_set_error(KN_ERR_NOMEM, "sdpa: out of memory");
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / G;
            for (int64_t i = 0; i < Tq; i++) {
                double m = -INFINITY, sum = 0, cap = t->p.sdpa.softcap;
                int64_t lo, hi;
                sdpa_keys(t, i, Tq, Tk, &lo, &hi);
                for (int64_t j = 0; j < Tk; j++) {
                    if (j < lo || j >= hi) { s[j] = -INFINITY; continue; }
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += LD(q, OFF4(q, b, h, i, d)) * LD(k, OFF4(k, b, hk, j, d));
                    s[j] = cap > 0 ? cap * tanh(dot * scale / cap) : dot * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = 0; j < Tk; j++) { s[j] = exp(s[j] - m); sum += s[j]; }
                for (int64_t d = 0; d < Dv; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < Tk; j++) acc += s[j] * LD(v, OFF4(v, b, hk, j, d));
                    ST(y, OFF4(y, b, h, i, d), acc / sum);
                }
            }
        }
    free(s);
    return KN_OK;
}

/* sdpa's gradient (graph/ops_nn.c states it): dst packs dq [B,Hq,Tq,D],
 * dk [B,Hkv,Tk,D], dv [B,Hkv,Tk,Dv] flat; src: q, k, v, g = dL/dy. Key and
 * value gradients accumulate in double and are stored once at the end. */
static kn_status sdpa_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *g = &e->src[3], *y = &e->dst;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    int64_t G = Hq / Hkv, nq = B * Hq * Tq * D, nk = B * Hkv * Tk * D, nv = B * Hkv * Tk * Dv;
    double scale = t->p.sdpa.scale;
    double *s = malloc(sizeof(double) * (size_t)(3 * Tk + 1)), *dkv = calloc((size_t)(nk + nv) + 1, sizeof(double));
    if (!s || !dkv) { free(s); free(dkv); return kn_set_error(KN_ERR_NOMEM, "sdpa backward: out of memory"); }
    double *dp = s + Tk, *dcap = dp + Tk, *dk = dkv, *dv = dkv + nk, cap = t->p.sdpa.softcap;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / G;
            for (int64_t i = 0; i < Tq; i++) {
                int64_t lo, n, qo = ((b * Hq + h) * Tq + i) * D;
                sdpa_keys(t, i, Tq, Tk, &lo, &n);     /* keys lo <= j < n */
                if (n <= lo) {                   /* no key: the output row is NaN */
                    for (int64_t d = 0; d < D; d++) ST(y, (qo + d) * y->st[0], NAN);
                    continue;
                }
                double m = -INFINITY, sum = 0, di = 0;
                for (int64_t j = lo; j < n; j++) {
                    double dot = 0, dg = 0;
                    for (int64_t d = 0; d < D; d++) dot += LD(q, OFF4(q, b, h, i, d)) * LD(k, OFF4(k, b, hk, j, d));
                    for (int64_t d = 0; d < Dv; d++) dg += LD(g, OFF4(g, b, h, i, d)) * LD(v, OFF4(v, b, hk, j, d));
                    double th = cap > 0 ? tanh(dot * scale / cap) : 0;
                    s[j] = cap > 0 ? cap * th : dot * scale;
                    dcap[j] = cap > 0 ? 1 - th * th : 1;      /* d(capped score) / d(score) */
                    dp[j] = dg;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = lo; j < n; j++) { s[j] = exp(s[j] - m); sum += s[j]; }
                for (int64_t j = lo; j < n; j++) { s[j] /= sum; di += s[j] * dp[j]; }
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = lo; j < n; j++) acc += scale * s[j] * (dp[j] - di) * dcap[j] * LD(k, OFF4(k, b, hk, j, d));
                    ST(y, (qo + d) * y->st[0], acc);
                }
                for (int64_t j = lo; j < n; j++) {
                    double ds = scale * s[j] * (dp[j] - di) * dcap[j];
                    int64_t ko = ((b * Hkv + hk) * Tk + j) * D, vo = ((b * Hkv + hk) * Tk + j) * Dv;
                    for (int64_t d = 0; d < D; d++) dk[ko + d] += ds * LD(q, OFF4(q, b, h, i, d));
                    for (int64_t d = 0; d < Dv; d++) dv[vo + d] += s[j] * LD(g, OFF4(g, b, h, i, d));
                }
            }
        }
    for (int64_t i = 0; i < nk + nv; i++) ST(y, (nq + i) * y->st[0], dkv[i]);
    free(s);
    free(dkv);
    return KN_OK;
}

/* ---- rope --------------------------------------------------------------------------
 * pair (a, b) -> (a cos - b sin, a sin + b cos), angle = pos[t] * freq_scale *
 * theta^(-2i/n_rot); pairs are (2i, 2i+1) (interleaved) or (i, i + n_rot/2) (neox). */
static kn_status rope(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *pos = &e->src[1], *y = &e->dst;
    int nd = x->ndim;
    int64_t T = x->ne[nd - 2], D = x->ne[nd - 1], rows = (T * D) != 0 ? kn_tview_numel(x) / (T * D) : 0;
    int n_rot = t->p.rope.n_rot, half = n_rot / 2;
    bool neox = t->p.rope.neox;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t ti = 0; ti < T; ti++) {
            int64_t base = (r * T + ti) * D;
            double p = LD(pos, ti * pos->st[0]) * t->p.rope.freq_scale;
            for (int i = 0; i < half; i++) {
                double ang = p * pow(t->p.rope.theta, -2.0 * i / n_rot), c, s;
                if (e->nsrc > 2) ang /= LD(&e->src[2], i * e->src[2].st[0]);
                c = cos(ang); s = sin(ang);
                int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
                double a = LD(x, kn_ref_off(x, base + ia)), bb = LD(x, kn_ref_off(x, base + ib));
                ST(y, kn_ref_off(y, base + ia), a * c - bb * s);
                ST(y, kn_ref_off(y, base + ib), a * s + bb * c);
            }
            for (int64_t j = n_rot; j < D; j++) ST(y, kn_ref_off(y, base + j), LD(x, kn_ref_off(x, base + j)));
        }
    return KN_OK;
}

kn_status kn_ref_nn(const kn_exec *e) {
    switch (e->node->op) {
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: return softmax(e);
    case KN_OP_LAYER_NORM: case KN_OP_RMS_NORM: return layer_rms_norm(e);
    case KN_OP_GROUP_NORM: case KN_OP_BATCH_NORM: return group_batch_norm(e);
    case KN_OP_CONV2D: return conv2d(e);
    case KN_OP_CONV_TRANSPOSE2D: return conv_transpose2d(e);
    case KN_OP_CONV2D_BWD_W: return conv2d_bwd_w(e);
    case KN_OP_MAX_POOL2D: return max_pool2d(e);
    case KN_OP_MAX_POOL2D_BWD: return max_pool2d_bwd(e);
    case KN_OP_AVG_POOL2D: return avg_pool2d(e, false);
    case KN_OP_AVG_POOL2D_BWD: return avg_pool2d(e, true);
    case KN_OP_ADAPTIVE_AVG_POOL2D: return adaptive_avg_pool2d(e, false);
    case KN_OP_ADAPTIVE_AVG_POOL2D_BWD: return adaptive_avg_pool2d(e, true);
    case KN_OP_SDPA: return sdpa(e);
    case KN_OP_ROPE: return rope(e);
    case KN_OP_SDPA_BWD: return sdpa_bwd(e);
    case KN_OP_NORM_BWD: return norm_bwd(e);
    case KN_OP_CROSS_ENTROPY: case KN_OP_CROSS_ENTROPY_BWD: return kn_ref_cross_entropy(e);   /* ref_loss.c */
    case KN_OP_TOPK: case KN_OP_MUL_MAT_ID: return kn_ref_moe(e);                             /* ref_moe.c */
    case KN_OP_PAGED_ATTN: return kn_ref_paged_attn(e);     /* ref_paged.c */
    case KN_OP_SORT: return kn_ref_sort(e);                 /* ref_sort.c */
    case KN_OP_UNFOLD: case KN_OP_FOLD: return kn_ref_fold(e);   /* ref_fold.c */
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no nn kernel for %s", kn_op_name(e->node->op));
}
