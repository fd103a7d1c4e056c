/* cuda_ops_nn.cu: softmax, norms, convolution, pooling, attention and rope
 * on the GPU. Same formulas as src/backends/ref/ref_nn.c (double
 * arithmetic); row ops run one block per row, the rest one thread per
 * output element (direct loops). Fast paths: kn_cuda_softmax_f32/_bf16,
 * the f32 layer/RMS norm kernels (forward and NORM_BWD) and the bf16 RMS
 * norm (f32 weight) when the layouts are dense rows, and f32 attention through batched SGEMMs
 * (sdpa_f32).
 * Letters: N batch, C/O channels, H/W spatial, KH/KW kernel, g groups,
 * T positions, D head dim. */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune (KN_CUDA_TUNE=sdpa_cl=0)
#include <cooperative_groups.h>      // defines: cluster_group (the decode attention's split)
#include <stdlib.h>
#include <string.h>

#define KN_NAN __longlong_as_double(0x7ff8000000000000ll)
#define HAS(k) (e->node->src[k] != NULL)
#define OFF4(v, a, b, c, d) ((a) * (v).st[0] + (b) * (v).st[1] + (c) * (v).st[2] + (d) * (v).st[3])

/* offset of lin over every dim of v except skip */
__device__ __forceinline__ int64_t off_skip(const kn_dview &v, int skip, int64_t lin) {
    int64_t o = 0;
    for (int d = v.ndim - 1; d >= 0; d--) {
        if (d == skip) continue;
        o += (lin % v.ne[d]) * v.st[d];
        lin /= v.ne[d];
    }
    return o;
}
__device__ __forceinline__ int64_t off_lead(const kn_dview &v, int n, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % v.ne[d]) * v.st[d]; lin /= v.ne[d]; }
    return o;
}
static int64_t prod_ne(const kn_tview *v, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= v->ne[d];
    return n;
}
static unsigned row_blocks(int64_t rows) { return rows > 65536 ? 65536u : (unsigned)(rows > 0 ? rows : 1); }
#define LAUNCHED_OK() KN_CUDA_LAUNCHED(); return KN_OK

/* ---- softmax / log_softmax ---- */
__global__ void __launch_bounds__(KN_THREADS) k_softmax(kn_dview x, kn_dview y, int d, int64_t rows, int64_t n, int logsm) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t xo = off_skip(x, d, r), yo = off_skip(y, d, r);
        double m = -INFINITY, s = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) { double v = kn_dget(x, xo + j * x.st[d]); if (v > m) m = v; }
        m = kn_dblock_max(m, sh);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += exp(kn_dget(x, xo + j * x.st[d]) - m);
        s = kn_dblock_sum(s, sh);
        double ls = log(s);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            double v = kn_dget(x, xo + j * x.st[d]) - m;
            kn_dput(y, yo + j * y.st[d], logsm ? v - ls : exp(v) / s);
        }
        __syncthreads();
    }
}
static kn_status cu_softmax(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.axis.dim;
    int64_t n = x->ne[d], rows = n ? kn_tview_numel(x) / n : 0;
    bool logsm = e->node->op == KN_OP_LOG_SOFTMAX;
    if (rows == 0) return KN_OK;
    if (!logsm && x->dtype == KN_F32 && y->dtype == KN_F32 && d == x->ndim - 1 && kn_tview_is_contiguous(x) &&
        kn_tview_is_contiguous(y) && !kn_env_get()->cuda_generic)
        return kn_cuda_softmax_f32((float *)y->data, (const float *)x->data, rows, n, kn_cu_stream());
    /* bf16 rows: the kernel reads bf16, computes in f32 and rounds once on store */
    if (!logsm && x->dtype == KN_BF16 && y->dtype == KN_BF16 && d == x->ndim - 1 && kn_tview_is_contiguous(x) &&
        kn_tview_is_contiguous(y) && rows <= INT32_MAX && !kn_env_get()->cuda_generic)
        return kn_cuda_softmax_bf16((uint16_t *)y->data, (const uint16_t *)x->data, rows, n, kn_cu_stream());
    k_softmax<<<row_blocks(rows), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(y), d, rows, n, logsm);
    LAUNCHED_OK();
}

/* ---- layer / rms norm over the trailing n_norm dims ---- */
/* mean (0 for rms) and rstd of row r (M elements) of x, in two passes; the
 * whole block calls it, every thread gets both */
__device__ void row_stats(const kn_dview &x, int64_t r, int64_t M, bool rms, double eps, double *sh, double *mean,
                          double *rstd) {
    double m = 0, ss = 0;
    if (!rms) {
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) m += kn_dget(x, kn_doff(x, r * M + j));
        m = kn_dblock_sum(m, sh) / (double)M;
    }
    for (int64_t j = threadIdx.x; j < M; j += blockDim.x) { double v = kn_dget(x, kn_doff(x, r * M + j)) - m; ss += v * v; }
    *mean = m;
    *rstd = 1.0 / sqrt(kn_dblock_sum(ss, sh) / (double)M + eps);
}
__global__ void __launch_bounds__(KN_THREADS) k_lrnorm(kn_dview x, kn_dview y, kn_dview w, kn_dview b, int hw, int hb,
                                                       int layer, int64_t rows, int64_t M, double eps) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double mean, rstd;
        row_stats(x, r, M, !layer, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            double v = (kn_dget(x, kn_doff(x, r * M + j)) - mean) * rstd;
            if (hw) v *= kn_dget(w, kn_doff(w, j));
            if (hb) v += kn_dget(b, kn_doff(b, j));
            kn_dput(y, kn_doff(y, r * M + j), v);
        }
        __syncthreads();
    }
}
static bool dense_f32(const kn_tview *v) { return v->dtype == KN_F32 && kn_tview_is_contiguous(v); }

static kn_status cu_layer_rms_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    bool layer = t->op == KN_OP_LAYER_NORM;
    bool hw = HAS(1), hb = layer && HAS(2);
    int nn = (int)t->p.norm.n_norm;
    int64_t M = prod_ne(x, x->ndim - nn, x->ndim), rows = M ? kn_tview_numel(x) / M : 0;
    if (rows == 0) return KN_OK;
    if (hw && dense_f32(x) && dense_f32(y) && dense_f32(&e->src[1]) && (!hb || dense_f32(&e->src[2])) &&
        M <= INT32_MAX && !kn_env_get()->cuda_generic) {
        if (layer)
            return kn_cuda_layernorm_fwd((float *)y->data, NULL, NULL, (const float *)x->data, (const float *)e->src[1].data,
                                         hb ? (const float *)e->src[2].data : NULL, rows, M, (float)t->p.norm.eps, kn_cu_stream());
        return kn_cuda_rmsnorm_fwd((float *)y->data, NULL, (const float *)x->data, (const float *)e->src[1].data, rows, M,
                                   (float)t->p.norm.eps, kn_cu_stream());
    }
    /* RMS norm of bf16 rows with an f32 weight (bf16 activations, f32 master weights) */
    if (!layer && hw && x->dtype == KN_BF16 && y->dtype == KN_BF16 && kn_tview_is_contiguous(x) && kn_tview_is_contiguous(y) &&
        dense_f32(&e->src[1]) && M <= INT32_MAX && rows <= INT32_MAX && !kn_env_get()->cuda_generic)
        return kn_cuda_rmsnorm_fwd_bf16((uint16_t *)y->data, NULL, (const uint16_t *)x->data, (const float *)e->src[1].data,
                                        rows, M, (float)t->p.norm.eps, kn_cu_stream());
    kn_dview w = hw ? kn_dv(&e->src[1]) : kn_dv(x), b = hb ? kn_dv(&e->src[2]) : kn_dv(x);
    k_lrnorm<<<row_blocks(rows), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(y), w, b, hw, hb, layer, rows, M, t->p.norm.eps);
    LAUNCHED_OK();
}

/* ---- NORM_BWD: layer/rms norm's gradient, [dx | dw | db] packed (ops_nn.c) ----
 * Generic path (any dtype, strides): one block a row writes dx and keeps the
 * row's mean and rstd in scratch; then one thread a column adds g * xhat and
 * g over the rows in order. The f32 dense rows take kn_cuda_norm_bwd_fused
 * (norms.cu). */
__global__ void __launch_bounds__(KN_THREADS) k_norm_bwd_rows(kn_dview x, kn_dview w, kn_dview g, kn_dview d, int hw,
                                                              int rms, int64_t rows, int64_t M, double eps, double *stat) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double mean, rstd, s1 = 0, s2 = 0;
        row_stats(x, r, M, rms, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            double xh = (kn_dget(x, kn_doff(x, r * M + j)) - mean) * rstd, gv = kn_dget(g, kn_doff(g, r * M + j));
            double dxh = hw ? gv * kn_dget(w, kn_doff(w, j)) : gv;
            s1 += dxh; s2 += dxh * xh;
        }
        s1 = rms ? 0 : kn_dblock_sum(s1, sh) / (double)M;
        s2 = kn_dblock_sum(s2, sh) / (double)M;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            double xh = (kn_dget(x, kn_doff(x, r * M + j)) - mean) * rstd, gv = kn_dget(g, kn_doff(g, r * M + j));
            double dxh = hw ? gv * kn_dget(w, kn_doff(w, j)) : gv;
            kn_dput(d, kn_doff(d, r * M + j), rstd * (dxh - s1 - xh * s2));
        }
        if (stat && threadIdx.x == 0) { stat[2 * r] = mean; stat[2 * r + 1] = rstd; }
        __syncthreads();
    }
}
__global__ void __launch_bounds__(KN_THREADS) k_norm_bwd_cols(kn_dview x, kn_dview g, kn_dview d, int parts, int64_t rows,
                                                              int64_t M, const double *stat) {
    int64_t nx = rows * M;
    KN_GRID_LOOP(j, M) {
        double sw = 0, sb = 0;
        for (int64_t r = 0; r < rows; r++) {
            double gv = kn_dget(g, kn_doff(g, r * M + j));
            sw += gv * (kn_dget(x, kn_doff(x, r * M + j)) - stat[2 * r]) * stat[2 * r + 1];
            sb += gv;
        }
        kn_dput(d, kn_doff(d, nx + j), sw);
        if (parts > 1) kn_dput(d, kn_doff(d, nx + M + j), sb);
    }
}
static kn_status cu_norm_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *g = &e->src[2], *d = &e->dst;
    bool hw = HAS(1), rms = t->p.norm.rms;
    int nn = (int)t->p.norm.n_norm;
    int64_t M = prod_ne(x, x->ndim - nn, x->ndim), nx = kn_tview_numel(x), rows = M ? nx / M : 0;
    int parts = M ? (int)((kn_tview_numel(d) - nx) / M) : 0;
    if (M == 0) return KN_OK;
    kn_status st = KN_OK;
    if (dense_f32(x) && dense_f32(g) && dense_f32(d) && (!hw || dense_f32(&e->src[1])) && !kn_env_get()->cuda_generic &&
        kn_cuda_norm_bwd_fused_ok(M, d->data, g->data, x->data, hw ? e->src[1].data : NULL, parts ? (float *)d->data + nx : NULL)) {
        int64_t np = 0;
        float *part = NULL;
        st = kn_cuda_norm_bwd_part_floats(rows, M, rms, parts, &np);
        if (!st && np) st = kn_cu_tmp(sizeof(float) * (size_t)np, (void **)&part);
        if (!st)
            st = kn_cuda_norm_bwd_fused((float *)d->data, (float *)d->data + nx, parts, (const float *)g->data,
                                        (const float *)x->data, hw ? (const float *)e->src[1].data : NULL,
                                        (float)t->p.norm.eps, rms, rows, M, part, kn_cu_stream());
        kn_cu_tmp_free(part);
        return st;
    }
    double *stat = NULL;
    if (parts && rows && (st = kn_cu_tmp(sizeof(double) * (size_t)(2 * rows), (void **)&stat))) return st;
    kn_dview wv = hw ? kn_dv(&e->src[1]) : kn_dv(x);
    if (rows)
        k_norm_bwd_rows<<<row_blocks(rows), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), wv, kn_dv(g), kn_dv(d), hw, rms, rows,
                                                                              M, t->p.norm.eps, stat);
    if (parts)
        k_norm_bwd_cols<<<kn_blocks(M), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(g), kn_dv(d), parts, rows, M, stat);
    cudaError_t ce = cudaGetLastError();
    kn_cu_tmp_free(stat);
    return ce == cudaSuccess ? KN_OK : kn_set_error(KN_ERR_BACKEND, "norm_bwd: launch failed: %s", cudaGetErrorString(ce));
}

/* ---- group / batch norm: x [N,C,S...] ---- */
__global__ void __launch_bounds__(KN_THREADS) k_gbnorm(kn_dview x, kn_dview y, kn_dview w, kn_dview b, int hw, int hb, int bn,
                                                       int64_t nsets, int64_t M, int64_t C, int64_t S, double eps) {
    __shared__ double sh[32];
    for (int64_t k = blockIdx.x; k < nsets; k += gridDim.x) {
#define LIN(j) (bn ? (((j) / S) * C + k) * S + (j) % S : k * M + (j))
        double mean = 0, ss = 0;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) mean += kn_dget(x, kn_doff(x, LIN(j)));
        mean = kn_dblock_sum(mean, sh);
        mean = M ? mean / (double)M : 0;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) { double v = kn_dget(x, kn_doff(x, LIN(j))) - mean; ss += v * v; }
        ss = kn_dblock_sum(ss, sh);
        double rstd = 1.0 / sqrt((M ? ss / (double)M : 0) + eps);
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            int64_t lin = LIN(j), c = (lin / S) % C;
            double v = (kn_dget(x, kn_doff(x, lin)) - mean) * rstd;
            if (hw) v *= kn_dget(w, c * w.st[0]);
            if (hb) v += kn_dget(b, c * b.st[0]);
            kn_dput(y, kn_doff(y, lin), v);
        }
#undef LIN
        __syncthreads();
    }
}
static kn_status cu_group_batch_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int64_t N = x->ne[0], C = x->ne[1], S = prod_ne(x, 2, x->ndim);
    bool bn = t->op == KN_OP_BATCH_NORM;
    int64_t G = bn ? C : t->p.norm.groups, Cg = G ? C / G : 0;
    int64_t nsets = bn ? C : N * G, M = bn ? N * S : Cg * S;
    if (nsets == 0 || S == 0) return KN_OK;
    bool hw = HAS(1), hb = HAS(2);
    kn_dview w = hw ? kn_dv(&e->src[1]) : kn_dv(x), b = hb ? kn_dv(&e->src[2]) : kn_dv(x);
    k_gbnorm<<<row_blocks(nsets), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(y), w, b, hw, hb, bn, nsets, M, C, S, t->p.norm.eps);
    LAUNCHED_OK();
}

/* ---- convolution ---- */
struct conv_p { int sh, sw, ph, pw, dh, dw; int64_t G; };
static conv_p conv_of(const kn_tensor *t) {
    conv_p c = {t->p.conv.stride[0], t->p.conv.stride[1], t->p.conv.padding[0], t->p.conv.padding[1],
                t->p.conv.dilation[0], t->p.conv.dilation[1], t->p.conv.groups};
    return c;
}
/* y [N,O,OH,OW] = x [N,C,H,W] (*) w [O,C/g,KH,KW] + b [O] */
__global__ void k_conv2d(kn_dview x, kn_dview w, kn_dview b, int hb, kn_dview y, conv_p p, int64_t n) {
    int64_t O = y.ne[1], OH = y.ne[2], OW = y.ne[3], H = x.ne[2], W = x.ne[3];
    int64_t Cg = w.ne[1], Og = O / p.G, KH = w.ne[2], KW = w.ne[3];
    KN_GRID_LOOP(idx, n) {
        int64_t ox = idx % OW, oy = (idx / OW) % OH, oc = (idx / (OW * OH)) % O, nn = idx / (OW * OH * O);
        int64_t grp = oc / Og;
        double acc = hb ? kn_dget(b, oc * b.st[0]) : 0;
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < KH; kh++) {
                int64_t iy = oy * p.sh - p.ph + kh * p.dh;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kw = 0; kw < KW; kw++) {
                    int64_t ix = ox * p.sw - p.pw + kw * p.dw;
                    if (ix < 0 || ix >= W) continue;
                    acc += kn_dget(x, OFF4(x, nn, grp * Cg + c, iy, ix)) * kn_dget(w, OFF4(w, oc, c, kh, kw));
                }
            }
        kn_dput(y, OFF4(y, nn, oc, oy, ox), acc);
    }
}
/* y [N,O,OH,OW] = x [N,C,H,W] (*)^T w [C,O/g,KH,KW] + b [O] */
__global__ void k_conv_t2d(kn_dview x, kn_dview w, kn_dview b, int hb, kn_dview y, conv_p p, int64_t n) {
    int64_t O = y.ne[1], OH = y.ne[2], OW = y.ne[3], C = x.ne[1], H = x.ne[2], W = x.ne[3];
    int64_t Cg = C / p.G, Og = w.ne[1], KH = w.ne[2], KW = w.ne[3];
    KN_GRID_LOOP(idx, n) {
        int64_t ox = idx % OW, oy = (idx / OW) % OH, oc = (idx / (OW * OH)) % O, nn = idx / (OW * OH * O);
        int64_t grp = oc / Og, o = oc % Og;
        double acc = hb ? kn_dget(b, oc * b.st[0]) : 0;
        for (int64_t c = grp * Cg; c < (grp + 1) * Cg; c++)
            for (int64_t kh = 0; kh < KH; kh++) {
                int64_t ty = oy + p.ph - kh * p.dh;
                if (ty < 0 || ty % p.sh) continue;
                int64_t iy = ty / p.sh;
                if (iy >= H) continue;
                for (int64_t kw = 0; kw < KW; kw++) {
                    int64_t tx = ox + p.pw - kw * p.dw;
                    if (tx < 0 || tx % p.sw) continue;
                    int64_t ix = tx / p.sw;
                    if (ix >= W) continue;
                    acc += kn_dget(x, OFF4(x, nn, c, iy, ix)) * kn_dget(w, OFF4(w, c, o, kh, kw));
                }
            }
        kn_dput(y, OFF4(y, nn, oc, oy, ox), acc);
    }
}
/* dw [Cb, Ca/g, KH, KW] = sum_{n,oy,ox} b[n,o,oy,ox] * a[n, grp*Ca/g + c, oy*s-p+kh*d, ox*s-p+kw*d] */
__global__ void k_conv2d_bwd_w(kn_dview a, kn_dview b, kn_dview dw, conv_p p, int64_t n) {
    int64_t N = b.ne[0], Cb = dw.ne[0], Cga = dw.ne[1], KH = dw.ne[2], KW = dw.ne[3];
    int64_t OH = b.ne[2], OW = b.ne[3], H = a.ne[2], W = a.ne[3], Cgb = Cb / p.G;
    KN_GRID_LOOP(idx, n) {
        int64_t kw = idx % KW, kh = (idx / KW) % KH, c = (idx / (KW * KH)) % Cga, o = idx / (KW * KH * Cga);
        int64_t grp = o / Cgb;
        double acc = 0;
        for (int64_t nn = 0; nn < N; nn++)
            for (int64_t oy = 0; oy < OH; oy++) {
                int64_t iy = oy * p.sh - p.ph + kh * p.dh;
                if (iy < 0 || iy >= H) continue;
                for (int64_t ox = 0; ox < OW; ox++) {
                    int64_t ix = ox * p.sw - p.pw + kw * p.dw;
                    if (ix < 0 || ix >= W) continue;
                    acc += kn_dget(b, OFF4(b, nn, o, oy, ox)) * kn_dget(a, OFF4(a, nn, grp * Cga + c, iy, ix));
                }
            }
        kn_dput(dw, OFF4(dw, o, c, kh, kw), acc);
    }
}
static kn_status cu_conv(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *y = &e->dst;
    int64_t n = kn_tview_numel(y);
    conv_p p = conv_of(t);
    if (t->op == KN_OP_CONV2D_BWD_W) {
        k_conv2d_bwd_w<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->src[0]), kn_dv(&e->src[1]), kn_dv(y), p, n);
        LAUNCHED_OK();
    }
    bool hb = HAS(2);
    kn_dview b = hb ? kn_dv(&e->src[2]) : kn_dv(y);
    if (t->op == KN_OP_CONV2D)
        k_conv2d<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->src[0]), kn_dv(&e->src[1]), b, hb, kn_dv(y), p, n);
    else
        k_conv_t2d<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->src[0]), kn_dv(&e->src[1]), b, hb, kn_dv(y), p, n);
    LAUNCHED_OK();
}

/* ---- unfold (im2col) and fold (col2im), src/graph/ops_spatial.c ----
 * One thread per output element; fold gathers the column entries that land
 * on its pixel (no atomics: deterministic, in double). p.pool holds kernel,
 * stride, padding and dilation; the grid OH x OW follows from the image. */
struct patch_p { int64_t C, H, W, KH, KW, OH, OW; int sh, sw, ph, pw, dh, dw; };
static patch_p patch_of(const kn_tensor *t, const kn_tview *img) {
    patch_p g = {img->ne[1], img->ne[2], img->ne[3], t->p.pool.kernel[0], t->p.pool.kernel[1], 0, 0,
                 t->p.pool.stride[0], t->p.pool.stride[1], t->p.pool.padding[0], t->p.pool.padding[1],
                 t->p.pool.dilation[0], t->p.pool.dilation[1]};
    g.OH = (g.H + 2 * g.ph - g.dh * (g.KH - 1) - 1) / g.sh + 1;
    g.OW = (g.W + 2 * g.pw - g.dw * (g.KW - 1) - 1) / g.sw + 1;
    return g;
}
/* col [N, C*KH*KW, L] from img [N, C, H, W] */
__global__ void k_unfold(kn_dview img, kn_dview col, patch_p g, int64_t n) {
    int64_t KK = g.KH * g.KW, L = g.OH * g.OW;
    KN_GRID_LOOP(idx, n) {
        int64_t l = idx % L, r = (idx / L) % (g.C * KK), nn = idx / (L * g.C * KK);
        int64_t c = r / KK, kh = (r % KK) / g.KW, kw = r % g.KW;
        int64_t iy = (l / g.OW) * g.sh - g.ph + kh * g.dh, ix = (l % g.OW) * g.sw - g.pw + kw * g.dw;
        double v = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W ? kn_dget(img, OFF4(img, nn, c, iy, ix)) : 0.0;
        kn_dput(col, nn * col.st[0] + r * col.st[1] + l * col.st[2], v);
    }
}
/* img [N, C, H, W] = the sum of the col entries of each pixel */
__global__ void k_fold(kn_dview col, kn_dview img, patch_p g, int64_t n) {
    int64_t KK = g.KH * g.KW;
    KN_GRID_LOOP(idx, n) {
        int64_t ix = idx % g.W, iy = (idx / g.W) % g.H, c = (idx / (g.W * g.H)) % g.C, nn = idx / (g.W * g.H * g.C);
        double acc = 0;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            int64_t ty = iy + g.ph - kh * g.dh;
            if (ty < 0 || ty % g.sh) continue;
            int64_t oy = ty / g.sh;
            if (oy >= g.OH) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t tx = ix + g.pw - kw * g.dw;
                if (tx < 0 || tx % g.sw) continue;
                int64_t ox = tx / g.sw;
                if (ox >= g.OW) continue;
                acc += kn_dget(col, nn * col.st[0] + (c * KK + kh * g.KW + kw) * col.st[1] + (oy * g.OW + ox) * col.st[2]);
            }
        }
        kn_dput(img, OFF4(img, nn, c, iy, ix), acc);
    }
}
static kn_status cu_fold(const kn_exec *e) {
    bool unfold = e->node->op == KN_OP_UNFOLD;
    const kn_tview *img = unfold ? &e->src[0] : &e->dst, *col = unfold ? &e->dst : &e->src[0];
    patch_p g = patch_of(e->node, img);
    int64_t n = kn_tview_numel(&e->dst);
    if (!n) return KN_OK;
    if (unfold) k_unfold<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(img), kn_dv(col), g, n);
    else k_fold<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(col), kn_dv(img), g, n);
    LAUNCHED_OK();
}

/* ---- pooling: leading dims are planes; the last two are pooled ---- */
struct pool_geo { int64_t planes, H, W, OH, OW; int k[2], s[2], p[2], d[2]; int inc; };
static pool_geo geo_of(const kn_tensor *t, const kn_tview *in, const kn_tview *out) {
    pool_geo g;
    int n = in->ndim;
    g.planes = prod_ne(in, 0, n - 2);
    g.H = in->ne[n - 2]; g.W = in->ne[n - 1]; g.OH = out->ne[n - 2]; g.OW = out->ne[n - 1];
    for (int i = 0; i < 2; i++) {
        g.k[i] = t->p.pool.kernel[i]; g.s[i] = t->p.pool.stride[i];
        g.p[i] = t->p.pool.padding[i]; g.d[i] = t->p.pool.dilation[i];
    }
    g.inc = t->p.pool.count_include_pad;
    return g;
}
#define OFF2(v, base, i, j) ((base) + (i) * (v).st[(v).ndim - 2] + (j) * (v).st[(v).ndim - 1])

__device__ int64_t max_window(const kn_dview &x, int64_t base, const pool_geo &g, int64_t oy, int64_t ox, double *val) {
    double m = -INFINITY;
    int64_t arg = -1;
    for (int kh = 0; kh < g.k[0]; kh++) {
        int64_t iy = oy * g.s[0] - g.p[0] + (int64_t)kh * g.d[0];
        if (iy < 0 || iy >= g.H) continue;
        for (int kw = 0; kw < g.k[1]; kw++) {
            int64_t ix = ox * g.s[1] - g.p[1] + (int64_t)kw * g.d[1];
            if (ix < 0 || ix >= g.W) continue;
            double v = kn_dget(x, OFF2(x, base, iy, ix));
            if (arg < 0 || v > m || isnan(v)) { m = v; arg = iy * g.W + ix; }
        }
    }
    *val = m;
    return arg;
}
/* torch's avg-pool window clipped to the input, and its divisor */
__device__ double avg_window(const pool_geo &g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1) {
    int64_t hs = oy * g.s[0] - g.p[0], ws = ox * g.s[1] - g.p[1];
    int64_t he = hs + g.k[0], we = ws + g.k[1];
    if (he > g.H + g.p[0]) he = g.H + g.p[0];
    if (we > g.W + g.p[1]) we = g.W + g.p[1];
    int64_t pool = (he - hs) * (we - ws);
    if (hs < 0) hs = 0;
    if (ws < 0) ws = 0;
    if (he > g.H) he = g.H;
    if (we > g.W) we = g.W;
    *y0 = hs; *y1 = he; *x0 = ws; *x1 = we;
    return g.inc ? (double)pool : (double)((he - hs) * (we - ws));
}
__device__ __forceinline__ void adaptive_window(const pool_geo &g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1) {
    *y0 = oy * g.H / g.OH; *y1 = ((oy + 1) * g.H + g.OH - 1) / g.OH;
    *x0 = ox * g.W / g.OW; *x1 = ((ox + 1) * g.W + g.OW - 1) / g.OW;
}

/* kind: 0 max, 1 avg, 2 adaptive. Forward: one thread per output; backward
 * (acc != NULL): out is dy, in is x (max) and every window adds into acc. */
__global__ void k_pool(kn_dview in, kn_dview out, pool_geo g, int kind, double *acc) {
    int64_t n = g.planes * g.OH * g.OW;
    KN_GRID_LOOP(idx, n) {
        int64_t ox = idx % g.OW, oy = (idx / g.OW) % g.OH, pl = idx / (g.OW * g.OH);
        int64_t ib = off_lead(in, in.ndim - 2, pl), ob = off_lead(out, out.ndim - 2, pl);
        if (kind == 0) {
            double m;
            int64_t arg = max_window(in, ib, g, oy, ox, &m);
            if (!acc) kn_dput(out, OFF2(out, ob, oy, ox), m);
            else if (arg >= 0) atomicAdd(&acc[pl * g.H * g.W + arg], kn_dget(out, OFF2(out, ob, oy, ox)));
            continue;
        }
        int64_t y0, y1, x0, x1;
        double div;
        if (kind == 1) div = avg_window(g, oy, ox, &y0, &y1, &x0, &x1);
        else { adaptive_window(g, oy, ox, &y0, &y1, &x0, &x1); div = (double)((y1 - y0) * (x1 - x0)); }
        if (acc) {
            double v = kn_dget(out, OFF2(out, ob, oy, ox)) / div;
            for (int64_t iy = y0; iy < y1; iy++)
                for (int64_t ix = x0; ix < x1; ix++) atomicAdd(&acc[(pl * g.H + iy) * g.W + ix], v);
        } else {
            double s = 0;
            for (int64_t iy = y0; iy < y1; iy++)
                for (int64_t ix = x0; ix < x1; ix++) s += kn_dget(in, OFF2(in, ib, iy, ix));
            kn_dput(out, OFF2(out, ob, oy, ox), s / div);
        }
    }
}
static kn_status cu_pool(const kn_exec *e) {
    const kn_tensor *t = e->node;
    int kind;
    bool bwd;
    switch (t->op) {
    case KN_OP_MAX_POOL2D: kind = 0; bwd = false; break;
    case KN_OP_MAX_POOL2D_BWD: kind = 0; bwd = true; break;
    case KN_OP_AVG_POOL2D: kind = 1; bwd = false; break;
    case KN_OP_AVG_POOL2D_BWD: kind = 1; bwd = true; break;
    case KN_OP_ADAPTIVE_AVG_POOL2D: kind = 2; bwd = false; break;
    default: kind = 2; bwd = true; break;
    }
    /* forward: x (src 0) -> y; max backward: x (src 0), dy (src 1) -> dx;
     * avg/adaptive backward: dy (src 0) -> dx (dst, x's shape) */
    const kn_tview *in, *out;
    if (!bwd) { in = &e->src[0]; out = &e->dst; }
    else if (kind == 0) { in = &e->src[0]; out = &e->src[1]; }
    else { in = &e->dst; out = &e->src[0]; }
    pool_geo g = geo_of(t, in, out);
    int64_t n = g.planes * g.OH * g.OW;
    if (!bwd) {
        if (n == 0) return KN_OK;
        k_pool<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(in), kn_dv(out), g, kind, NULL);
        LAUNCHED_OK();
    }
    int64_t nin = g.planes * g.H * g.W;
    double *acc = NULL;
    kn_status st = kn_cu_tmp(sizeof(double) * (size_t)(nin ? nin : 1), (void **)&acc);
    if (st) return st;
    if (cudaMemsetAsync(acc, 0, sizeof(double) * (size_t)nin, kn_cu_stream()) != cudaSuccess)
        st = kn_set_error(KN_ERR_BACKEND, "%s: cudaMemsetAsync failed", kn_op_name(t->op));
    if (!st && n > 0) {
        k_pool<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(in), kn_dv(out), g, kind, acc);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "%s: kernel launch failed", kn_op_name(t->op));
    }
    if (!st) st = kn_cu_store_all(&e->dst, acc, nin);
    kn_cu_tmp_free(acc);
    return st;
}

/* ---- attention: one block per (b, h, i) query row; scores in scratch s ---- */
/* keys lo <= j < hi of query row i (graph/ops_nn.c: kn_sdpa_ex): causal stops
 * at its position p = i + (Tk - Tq), a window W > 0 starts at p - W + 1 */
__device__ __forceinline__ void sdpa_range(int causal, int64_t window, int64_t i, int64_t Tq, int64_t Tk, int64_t *lo,
                                           int64_t *hi) {
    int64_t p = i + (Tk - Tq);
    *hi = causal && p + 1 < Tk ? p + 1 : Tk;
    *lo = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
}
__global__ void __launch_bounds__(KN_THREADS) k_sdpa(kn_dview q, kn_dview k, kn_dview v, kn_dview y, int causal, double scale,
                                                     int64_t window, double cap, double *s_all, int64_t nrows) {
    __shared__ double sh[32];
    int64_t Hq = q.ne[1], Tq = q.ne[2], D = q.ne[3], Hkv = k.ne[1], Tk = k.ne[2], Dv = v.ne[3];
    int64_t G = Hq / Hkv;
    for (int64_t row = blockIdx.x; row < nrows; row += gridDim.x) {
        int64_t i = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq), hk = h / G;
        double *s = s_all + (int64_t)blockIdx.x * Tk;
        double m = -INFINITY;
        int64_t lo, hi;
        sdpa_range(causal, window, i, Tq, Tk, &lo, &hi);
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
            double sc;
            if (j < lo || j >= hi) sc = -INFINITY;
            else {
                double dot = 0;
                for (int64_t d = 0; d < D; d++) dot += kn_dget(q, OFF4(q, b, h, i, d)) * kn_dget(k, OFF4(k, b, hk, j, d));
                sc = cap > 0 ? cap * tanh(dot * scale / cap) : dot * scale;
            }
            s[j] = sc;
            if (sc > m) m = sc;
        }
        m = kn_dblock_max(m, sh);
        double sum = 0;
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) { double p = exp(s[j] - m); s[j] = p; sum += p; }
        sum = kn_dblock_sum(sum, sh);   /* its __syncthreads also publish s[] */
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
            double acc = 0;
            for (int64_t j = 0; j < Tk; j++) acc += s[j] * kn_dget(v, OFF4(v, b, hk, j, d));
            kn_dput(y, OFF4(y, b, h, i, d), acc / sum);
        }
        __syncthreads();
    }
}

/* Fast f32 attention: S = scale * Q K^T and Y = P V are batched SGEMMs over
 * (b, kv head, group member); between them one warp per score row applies the
 * causal mask and the softmax in place. Scores live in pooled scratch, a
 * chunk of sequences at a time. k_sdpa above (a block per query row, double)
 * stays for other dtypes and layouts. */
__global__ void k_softmax_rows_f32(float *s, int64_t rows, int64_t Tq, int64_t Tk, int causal, int64_t window, float cap) {
    int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *row = s + r * Tk;
    int64_t lo, lim;                         /* keys lo <= j < lim are visible */
    sdpa_range(causal, window, r % Tq, Tq, Tk, &lo, &lim);
    float m = -INFINITY;
    for (int64_t j = lo + lane; j < lim; j += 32) {
        if (cap > 0.f) row[j] = cap * tanhf(row[j] / cap);
        m = fmaxf(m, row[j]);
    }
    m = kn_warp_max(m);
    float sum = 0.f;
    for (int64_t j = lo + lane; j < lim; j += 32) { float p = expf(row[j] - m); row[j] = p; sum += p; }
    float inv = 1.f / kn_warp_sum(sum);
    for (int64_t j = lane; j < Tk; j += 32) row[j] = j >= lo && j < lim ? row[j] * inv : 0.f;
}

static bool rows_f32(const kn_tview *v) { return v->dtype == KN_F32 && v->ndim == 4 && (v->st[3] == 1 || v->ne[3] == 1); }

/* KN_ERR_UNSUPPORTED (without a message) when the layout does not fit; the
 * caller then takes the generic kernel. */
static kn_status sdpa_f32(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    bool causal = e->node->p.sdpa.causal;
    if (!rows_f32(q) || !rows_f32(k) || !rows_f32(v) || !rows_f32(y) || kn_env_get()->cuda_generic || Tk == 0 ||
        (causal && Tq > Tk) || Hq % Hkv)
        return KN_ERR_UNSUPPORTED;
    /* row strides as GEMM leading dims (a single row may carry any stride) */
    int64_t ldq = Tq > 1 ? q->st[2] : D, ldk = Tk > 1 ? k->st[2] : D, ldv = Tk > 1 ? v->st[2] : Dv;
    int64_t ldy = Tq > 1 ? y->st[2] : Dv;
    if (ldq < D || ldk < D || ldv < Dv || ldy < Dv) return KN_ERR_UNSUPPORTED;
    int64_t G = Hq / Hkv, per_seq = Hq * Tq * Tk;
    /* at most ~256 MiB of scores at a time (at least one sequence) */
    int64_t chunk = ((int64_t)1 << 26) / (per_seq ? per_seq : 1);
    if (chunk < 1) chunk = 1;
    if (chunk > B) chunk = B;
    float *s = NULL;
    kn_status st = kn_cu_tmp(sizeof(float) * (size_t)(chunk * per_seq), (void **)&s);
    if (st) return st;
    float scale = (float)e->node->p.sdpa.scale;
    /* batch (b, kv head, member g): query head hk*G + g */
    kn_cuda_gemm_batch qk = {3, {0, Hkv, G}, {q->st[0], G * q->st[1], q->st[1]}, {k->st[0], k->st[1], 0},
                             {per_seq, G * Tq * Tk, Tq * Tk}};
    kn_cuda_gemm_batch pv = {3, {0, Hkv, G}, {per_seq, G * Tq * Tk, Tq * Tk}, {v->st[0], v->st[1], 0},
                             {y->st[0], G * y->st[1], y->st[1]}};
    for (int64_t b0 = 0; b0 < B && !st; b0 += chunk) {
        int64_t nb = B - b0 < chunk ? B - b0 : chunk, rows = nb * Hq * Tq;
        qk.ne[0] = pv.ne[0] = nb;
        const float *qp = (const float *)q->data + b0 * q->st[0], *kp = (const float *)k->data + b0 * k->st[0];
        const float *vp = (const float *)v->data + b0 * v->st[0];
        float *yp = (float *)y->data + b0 * y->st[0];
        st = kn_cuda_sgemm_batched(false, true, Tq, Tk, D, scale, qp, ldq, kp, ldk, 0.f, s, Tk, &qk, kn_cu_stream());
        if (!st) {
            int64_t blocks = (rows + 7) / 8;            /* 8 warps a block, a warp a row */
            k_softmax_rows_f32<<<(unsigned)blocks, 256, 0, kn_cu_stream()>>>(s, rows, Tq, Tk, causal, e->node->p.sdpa.window,
                                                                             (float)e->node->p.sdpa.softcap);
            if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa: softmax launch failed");
        }
        if (!st) st = kn_cuda_sgemm_batched(false, false, Tq, Dv, Tk, 1.f, s, Tk, vp, ldv, 0.f, yp, ldy, &pv, kn_cu_stream());
    }
    kn_cu_tmp_free(s);
    return st;
}

/* Half-precision K/V with f32 queries (an LLM's f16 KV cache): K and V
 * [B, Hkv, Tk, D] are widened into contiguous f32 scratch (one pass over
 * what attention reads anyway) and the f32 path runs on the copies; the
 * generic kernel recomputed every score in double, a block per query row. */
__global__ void k_widen_f32(float *dst, kn_dview x, int64_t n) {
    KN_GRID_LOOP(i, n) dst[i] = (float)kn_dget(x, kn_doff(x, i));
}
static kn_status sdpa_half_kv(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *y = &e->dst;
    if (q->dtype != KN_F32 || y->dtype != KN_F32 || kn_env_get()->cuda_generic) return KN_ERR_UNSUPPORTED;
    kn_exec e2 = *e;
    float *buf[2] = {NULL, NULL};
    kn_status st = KN_OK;
    for (int s = 1; s <= 2 && !st; s++) {
        const kn_tview *v = &e->src[s];
        if ((v->dtype != KN_F16 && v->dtype != KN_BF16) || v->ndim != 4) { st = KN_ERR_UNSUPPORTED; break; }
        int64_t n = kn_tview_numel(v);
        if ((st = kn_cu_tmp(sizeof(float) * (size_t)(n ? n : 1), (void **)&buf[s - 1]))) break;
        if (n > 0) {
            k_widen_f32<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(buf[s - 1], kn_dv(v), n);
            if (cudaGetLastError() != cudaSuccess) { st = kn_set_error(KN_ERR_BACKEND, "sdpa: widen launch failed"); break; }
        }
        kn_tview w = *v;                    /* the contiguous f32 copy */
        w.data = buf[s - 1];
        w.dtype = KN_F32;
        int64_t str = 1;
        for (int d = 3; d >= 0; d--) { w.st[d] = str; str *= w.ne[d]; }
        e2.src[s] = w;
    }
    if (!st) st = sdpa_f32(&e2);
    kn_cu_tmp_free(buf[0]);
    kn_cu_tmp_free(buf[1]);
    return st;
}

/* Decode (a few query rows): one launch instead of the GEMM path's three.
 * A block per query row (b, h, i): q in shared memory, a thread per key for
 * the scores (kept in shared memory), block max and sum, then a thread per
 * output column for P V. K and V are f32, f16 or bf16 (a half KV cache is
 * read as it is), rows with unit stride along D. */
template <typename KV>
__device__ __forceinline__ float kv_ld(const KV *p, int64_t i);
template <> __device__ __forceinline__ float kv_ld<float>(const float *p, int64_t i) { return p[i]; }
struct kv_f16 { uint16_t b; };
struct kv_bf16 { uint16_t b; };
template <> __device__ __forceinline__ float kv_ld<kv_f16>(const kv_f16 *p, int64_t i) { return kn_dev_h2f(p[i].b); }
template <> __device__ __forceinline__ float kv_ld<kv_bf16>(const kv_bf16 *p, int64_t i) { return kn_bf2f(p[i].b); }
/* Elements 0..3 of p in one load (the vectorised kernels: p aligned to 4 elements) */
template <typename KV>
__device__ __forceinline__ float4 kv_ld4(const KV *p);
template <> __device__ __forceinline__ float4 kv_ld4<float>(const float *p) { return *(const float4 *)p; }
template <> __device__ __forceinline__ float4 kv_ld4<kv_f16>(const kv_f16 *p) {
    uint2 u = *(const uint2 *)p;
    return make_float4(kn_dev_h2f(u.x & 0xffff), kn_dev_h2f(u.x >> 16), kn_dev_h2f(u.y & 0xffff), kn_dev_h2f(u.y >> 16));
}
template <> __device__ __forceinline__ float4 kv_ld4<kv_bf16>(const kv_bf16 *p) {
    uint2 u = *(const uint2 *)p;
    return make_float4(kn_bf2f(u.x & 0xffff), kn_bf2f(u.x >> 16), kn_bf2f(u.y & 0xffff), kn_bf2f(u.y >> 16));
}

/* One block's share of a decode row: the scores of keys [j0, j1) into
 * sc[j - j0], then p = exp(s - m) in place; every thread gets (m, l): the
 * max and the sum of the p (their barriers also publish sc[]). V4: K rows
 * read 4 elements a load (aligned, D % 4 == 0), added in the same order. */
template <typename KV, bool V4>
__device__ __forceinline__ float2 sdpa_dec_probs(const float *qs, const KV *kb, int64_t kst, int64_t j0, int64_t j1, int64_t D,
                                                 float scale, float cap, float *sc, float *red) {
    float m = -INFINITY;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const KV *kr = kb + j * kst;
        float a = 0.f;
        if (V4) {
#pragma unroll 4
            for (int64_t d = 0; d < D; d += 4) {   /* the loads of a row in flight together, not one a step */
                float4 k4 = kv_ld4<KV>(kr + d);
                a += qs[d] * k4.x;
                a += qs[d + 1] * k4.y;
                a += qs[d + 2] * k4.z;
                a += qs[d + 3] * k4.w;
            }
        } else {
            for (int64_t d = 0; d < D; d++) a += qs[d] * kv_ld<KV>(kr, d);
        }
        a *= scale;
        if (cap > 0.f) a = cap * tanhf(a / cap);
        sc[j - j0] = a;
        m = fmaxf(m, a);
    }
    m = kn_block_max(m, red);
    float sum = 0.f;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) { float p = __expf(sc[j - j0] - m); sc[j - j0] = p; sum += p; }
    return make_float2(m, kn_block_sum(sum, red));
}
/* sum_j p_j v[j][d] over the block's keys [j0, j1) */
template <typename KV>
__device__ __forceinline__ float sdpa_dec_pv(const float *sc, const KV *vb, int64_t vst, int64_t j0, int64_t j1, int64_t d) {
    float acc = 0.f;
    for (int64_t j = j0; j < j1; j++) acc += sc[j - j0] * kv_ld<KV>(vb + j * vst, d);
    return acc;
}
/* The same, vectorised (Dv % 4 == 0, Dv <= 4 * blockDim, V rows aligned):
 * thread (c, g) adds columns 4c .. 4c+3 of keys j0 + g, j0 + g + NG, ...,
 * NG = blockDim / (Dv / 4) groups, 4-wide loads, several in flight (a thread
 * a column walked every key one load after another: at a 600-key cache,
 * hundreds of dependent round trips). part [NG][Dv] (shared) gets the
 * groups' sums; after the barrier sdpa_dec_pv_sum adds them in g order. */
#define SDPA_PART 512   /* floats of part: NG * Dv <= 4 * blockDim (128) */
template <typename KV>
__device__ __forceinline__ void sdpa_dec_pv4(const float *sc, const KV *vb, int64_t vst, int64_t j0, int64_t j1, int64_t Dv,
                                             float *part) {
    const int C = (int)(Dv / 4), NG = (int)blockDim.x / C, c = (int)threadIdx.x % C, g = (int)threadIdx.x / C;
    if (g < NG) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int64_t j = j0 + g; j < j1; j += NG) {
            const float p = sc[j - j0];
            const float4 v = kv_ld4<KV>(vb + j * vst + 4 * c);
            acc.x += p * v.x;
            acc.y += p * v.y;
            acc.z += p * v.z;
            acc.w += p * v.w;
        }
        *(float4 *)(part + (int64_t)g * Dv + 4 * c) = acc;
    }
    __syncthreads();
}
__device__ __forceinline__ float sdpa_dec_pv_sum(const float *part, int64_t Dv, int64_t d) {
    const int NG = (int)blockDim.x / (int)(Dv / 4);
    float acc = 0.f;
    for (int g = 0; g < NG; g++) acc += part[(int64_t)g * Dv + d];
    return acc;
}

template <typename KV, bool V4>
__global__ void k_sdpa_decode(const float *q, kn_dview qv, const KV *k, kn_dview kv, const KV *v, kn_dview vv, float *y,
                              kn_dview yv, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, int64_t G, int causal,
                              float scale, int64_t window, float cap, const int64_t *dsyms, int tk_sym) {
    extern __shared__ float sm[];                     /* q [D], scores [Tk] */
    __shared__ __align__(16) float part[V4 ? SDPA_PART : 1];
    kn_pdl_enter();                                   /* launched with kn_launch_pdl */
    if (dsyms) Tk = dsyms[tk_sym];                    /* a captured launch: the key count of this replay */
    __shared__ float red[32];
    float *qs = sm, *sc = sm + D;
    int64_t row = blockIdx.x, i = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq), hk = h / G;
    const float *qr = q + b * qv.st[0] + h * qv.st[1] + i * qv.st[2];
    const KV *kb = k + b * kv.st[0] + hk * kv.st[1];
    const KV *vb = v + b * vv.st[0] + hk * vv.st[1];
    float *yr = y + b * yv.st[0] + h * yv.st[1] + i * yv.st[2];
    int64_t lo, lim;                                  /* keys lo <= j < lim */
    sdpa_range(causal, window, i, Tq, Tk, &lo, &lim);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    const float2 ml = sdpa_dec_probs<KV, V4>(qs, kb, kv.st[2], lo, lim, D, scale, cap, sc, red);
    float inv = lim > lo ? 1.f / ml.y : NAN;           /* no key: NaN, like the reference */
    if (V4) {
        sdpa_dec_pv4<KV>(sc, vb, vv.st[2], lo, lim, Dv, part);
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) yr[d] = sdpa_dec_pv_sum(part, Dv, d) * inv;
    } else {
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) yr[d] = sdpa_dec_pv<KV>(sc, vb, vv.st[2], lo, lim, d) * inv;
    }
}
/* The same row on a cluster of SDPA_CL blocks (sm_90): a decode step has a
 * row per query head (9 for SmolLM2-135M), so one block a row leaves most
 * SMs idle while each block walks the whole cache. Here block r of the
 * row's cluster takes the r-th contiguous slice of the visible keys: its
 * scores, their max m_r and sum l_r of exp(s - m_r), and the unnormalised
 * o_r = sum exp(s - m_r) v, kept in its shared memory. After a cluster
 * barrier block 0 reads the others' (m, l, o) through distributed shared
 * memory and writes y = sum_r w_r o_r / sum_r w_r l_r, w_r = exp(m_r - M),
 * M = max m_r; a second barrier keeps the others' shared memory alive until
 * then. A slice with no key gives m = -inf, l = 0 (w = 0); no key at all
 * gives a NaN row, like the single-block kernel. */
#define SDPA_CL 8
template <typename KV, bool V4>
__global__ void __launch_bounds__(128) k_sdpa_decode_cl(const float *q, kn_dview qv, const KV *k, kn_dview kv, const KV *v,
                              kn_dview vv, float *y, kn_dview yv, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, int64_t G, int causal,
                              float scale, int64_t window, float cap, const int64_t *dsyms, int tk_sym) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float sm[];                     /* q [D], o_r [Dv], (m_r, l_r), scores [slice] */
    __shared__ float red[32];
    __shared__ __align__(16) float part[V4 ? SDPA_PART : 1];
    kn_pdl_enter();                                   /* launched with PDL as well */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    if (dsyms) Tk = dsyms[tk_sym];
    float *qs = sm, *po = sm + D, *pml = po + Dv, *sc = pml + 2;
    int64_t row = blockIdx.x / SDPA_CL, i = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq), hk = h / G;
    const float *qr = q + b * qv.st[0] + h * qv.st[1] + i * qv.st[2];
    const KV *kb = k + b * kv.st[0] + hk * kv.st[1];
    const KV *vb = v + b * vv.st[0] + hk * vv.st[1];
    int64_t lo, lim;                                  /* keys lo <= j < lim */
    sdpa_range(causal, window, i, Tq, Tk, &lo, &lim);
    const int64_t nk = lim > lo ? lim - lo : 0, per = (nk + SDPA_CL - 1) / SDPA_CL;
    const int64_t j0 = lo + rank * per, j1 = j0 + per < lim ? j0 + per : lim;   /* this block's slice (may be empty) */
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    const float2 ml = sdpa_dec_probs<KV, V4>(qs, kb, kv.st[2], j0, j1, D, scale, cap, sc, red);
    if (V4) {
        sdpa_dec_pv4<KV>(sc, vb, vv.st[2], j0, j1, Dv, part);
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) po[d] = sdpa_dec_pv_sum(part, Dv, d);
    } else {
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) po[d] = sdpa_dec_pv<KV>(sc, vb, vv.st[2], j0, j1, d);
    }
    if (threadIdx.x == 0) { pml[0] = ml.x; pml[1] = ml.y; }
    cl.sync();
    if (rank == 0) {
        float M = -INFINITY, w[SDPA_CL], L = 0.f;
        const float *pr[SDPA_CL];
#pragma unroll
        for (int r = 0; r < SDPA_CL; r++) {
            pr[r] = cl.map_shared_rank(po, r);
            M = fmaxf(M, pr[r][Dv]);
        }
#pragma unroll
        for (int r = 0; r < SDPA_CL; r++) {
            float mr = pr[r][Dv];
            w[r] = mr == -INFINITY ? 0.f : __expf(mr - M);
            L += w[r] * pr[r][Dv + 1];
        }
        float inv = nk > 0 ? 1.f / L : NAN;           /* no key: NaN, like the reference */
        float *yr = y + b * yv.st[0] + h * yv.st[1] + i * yv.st[2];
        for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
            float acc = 0.f;
#pragma unroll
            for (int r = 0; r < SDPA_CL; r++) acc += w[r] * pr[r][d];
            yr[d] = acc * inv;
        }
    }
    cl.sync();                                        /* block 0 has read every block's o, m, l */
#endif
}
static bool unit_rows(const kn_tview *v) { return v->ndim == 4 && (v->st[3] == 1 || v->ne[3] == 1); }
/* Shared memory a block may have without opting in (48 KB, static and
 * dynamic together), less the decode kernels' static arrays (red, part) */
#define SDPA_SMEM_MAX (48 * 1024 - sizeof(float) * (32 + SDPA_PART))
/* The decode kernel takes e when its scores fit smem_keys keys. */
static bool sdpa_decode_fits(const kn_exec *e, int64_t smem_keys) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    size_t smem = sizeof(float) * (size_t)(q->ne[3] + smem_keys);
    return q->ne[2] <= 4 && k->dtype == v->dtype && q->dtype == KN_F32 && y->dtype == KN_F32 && smem <= SDPA_SMEM_MAX &&
           (k->dtype == KN_F32 || k->dtype == KN_F16 || k->dtype == KN_BF16) && unit_rows(q) && unit_rows(k) &&
           unit_rows(v) && unit_rows(y) && k->ne[1] >= 1 && q->ne[1] % k->ne[1] == 0 && !kn_env_get()->cuda_generic;
}
/* The symbol of the key count (dim 2 of K and V), 0 when it is fixed.
 * The node's own sources carry the symbols; a source the plan redirects
 * (graph rewrites) has the same shape, symbols included, so src[k]->sym is
 * right for the operand exec resolved. (A kn_exec field naming each
 * operand's tensor would say it without that argument.) */
static int sdpa_key_sym(const kn_exec *e) {
    const kn_tensor *k = e->node->src[1], *v = e->node->src[2];
    if (!k || !v || k->ndim != 4 || v->ndim != 4 || k->sym[2] != v->sym[2]) return 0;
    return k->sym[2];
}
/* Captured, the decode kernel reads the key count from the device (its
 * shared memory sized for the maximum), so one graph serves every step. */
uint64_t kn_cu_sdpa_dynamic_syms(const kn_exec *e) {
    int s = sdpa_key_sym(e);
    if (!s || e->nsrc < 3 || !sdpa_decode_fits(e, e->node->src[1]->shape[2])) return 0;
    return (uint64_t)1 << s;
}
/* The cluster kernel: sm_90, and a cache long enough that the split pays
 * (KN_CUDA_TUNE sdpa_cl=0 keeps one block a row; sdpa_cl=N sets the least
 * key count, default 128). */
static bool sdpa_cl_ok(int64_t tk_max) {
    static const int least = kn_cuda_tune("sdpa_cl", 128);
    return least > 0 && kn_cu_cc_major() >= 9 && tk_max >= least;
}
template <typename... P, typename... A>
static kn_status sdpa_cl_launch(void (*kern)(P...), unsigned rows, size_t smem, A... args) {
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = SDPA_CL;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(rows * SDPA_CL);
    c.blockDim = dim3(128);
    c.dynamicSmemBytes = smem;
    c.stream = kn_cu_stream();
    c.attrs = at;
    c.numAttrs = 1 + kn_pdl_attr(&at[1]);
    if (cudaLaunchKernelEx(&c, kern, args...) != cudaSuccess) {   /* not launchable here: the single-block kernel */
        cudaGetLastError();
        return KN_ERR_UNSUPPORTED;
    }
    return KN_OK;
}
/* K and V rows readable 4 elements a load: D and Dv multiples of 4 (Dv at
 * most 4 x 128 threads), every stride a multiple of 4, bases aligned */
static bool sdpa_dec_v4(const kn_tview *k, const kn_tview *v, int64_t D, int64_t Dv) {
    if (D % 4 || Dv % 4 || Dv > SDPA_PART) return false;
    const kn_tview *kv[2] = {k, v};
    for (int s = 0; s < 2; s++) {
        size_t es = kn_dtype_get(kv[s]->dtype)->type_size;
        if ((uintptr_t)kv[s]->data % (4 * es)) return false;
        for (int d = 0; d < 3; d++)
            if (kv[s]->st[d] % 4) return false;
    }
    return true;
}
/* One decode attention launch of KV type T: the cluster kernel where it
 * pays and launches, else a block a row; V4 as sdpa_dec_v4 says. */
template <typename T, bool V4>
static kn_status sdpa_decode_go(const kn_exec *e, bool cl, size_t smem, size_t csmem, unsigned rows, const int64_t *ds, int tk_sym) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    int64_t Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    float scale = (float)e->node->p.sdpa.scale, cap = (float)e->node->p.sdpa.softcap;
    int causal = e->node->p.sdpa.causal;
    int64_t W = e->node->p.sdpa.window;
    if (cl) {
        kn_status cst = sdpa_cl_launch(k_sdpa_decode_cl<T, V4>, rows, csmem, (const float *)q->data, kn_dv(q), (const T *)k->data,
                                       kn_dv(k), (const T *)v->data, kn_dv(v), (float *)y->data, kn_dv(y), Hq, Tq, Tk, D, Dv,
                                       Hq / Hkv, causal, scale, W, cap, ds, tk_sym);
        if (cst != KN_ERR_UNSUPPORTED) return cst;
    }
    KN_CUDA_TRY(kn_launch_pdl(k_sdpa_decode<T, V4>, dim3(rows), dim3(128), smem, kn_cu_stream(), (const float *)q->data, kn_dv(q),
                              (const T *)k->data, kn_dv(k), (const T *)v->data, kn_dv(v), (float *)y->data, kn_dv(y), Hq, Tq, Tk, D,
                              Dv, Hq / Hkv, causal, scale, W, cap, ds, tk_sym));
    LAUNCHED_OK();
}
template <typename T>
static kn_status sdpa_decode_kv(const kn_exec *e, bool v4, bool cl, size_t smem, size_t csmem, unsigned rows, const int64_t *ds, int tk_sym) {
    return v4 ? sdpa_decode_go<T, true>(e, cl, smem, csmem, rows, ds, tk_sym)
              : sdpa_decode_go<T, false>(e, cl, smem, csmem, rows, ds, tk_sym);
}
static kn_status sdpa_decode(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2];
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Tk = k->ne[2], Dv = v->ne[3];
    if (!sdpa_decode_fits(e, Tk)) return KN_ERR_UNSUPPORTED;
    const int64_t *ds = kn_cu_capture_syms();
    int tk_sym = ds ? (int)(kn_cu_sdpa_dynamic_syms(e) ? sdpa_key_sym(e) : 0) : 0;
    if (!tk_sym) ds = NULL;
    size_t smem = sizeof(float) * (size_t)(D + (ds ? e->node->src[1]->shape[2] : Tk));
    unsigned rows = (unsigned)(B * Hq * Tq);
    const int64_t tk_max = ds ? e->node->src[1]->shape[2] : Tk;
    bool cl = sdpa_cl_ok(tk_max);
    size_t csmem = sizeof(float) * (size_t)(D + Dv + 2 + (tk_max + SDPA_CL - 1) / SDPA_CL);
    /* sdpa_v4 (default 1): K and V read 4 elements a load, P V split over
     * key groups, so a thread has several loads in flight. SmolLM2 Q4_1
     * decode on an H100: 1315 -> 1411 tok/s alone (docs/PERF.md, session 28) */
    static const int v4_on = kn_cuda_tune("sdpa_v4", 1);
    bool v4 = v4_on && sdpa_dec_v4(k, v, D, Dv);
    if (k->dtype == KN_F32) return sdpa_decode_kv<float>(e, v4, cl, smem, csmem, rows, ds, tk_sym);
    if (k->dtype == KN_F16) return sdpa_decode_kv<kv_f16>(e, v4, cl, smem, csmem, rows, ds, tk_sym);
    return sdpa_decode_kv<kv_bf16>(e, v4, cl, smem, csmem, rows, ds, tk_sym);
}

static kn_status cu_sdpa(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1];
    int64_t nrows = q->ne[0] * q->ne[1] * q->ne[2], Tk = k->ne[2];
    if (nrows == 0) return KN_OK;
    if (k->ne[1] == 0) return kn_set_error(KN_ERR_INVALID, "sdpa: key/value have 0 heads");
    kn_status fst = sdpa_decode(e);
    if (fst == KN_ERR_UNSUPPORTED) fst = kn_cu_flash_fwd(e);    /* bf16/f16, D 64 or 128, no window/softcap (flash_attn.cu) */
    if (fst == KN_ERR_UNSUPPORTED) fst = sdpa_f32(e);
    if (fst == KN_ERR_UNSUPPORTED) fst = sdpa_half_kv(e);
    if (fst != KN_ERR_UNSUPPORTED) return fst;
    unsigned blocks = row_blocks(nrows);
    if (blocks > 4096) blocks = 4096;      /* bounds the score scratch */
    double *s = NULL;
    kn_status st = kn_cu_tmp(sizeof(double) * (size_t)blocks * (size_t)(Tk ? Tk : 1), (void **)&s);
    if (st) return st;
    k_sdpa<<<blocks, KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(q), kn_dv(k), kn_dv(&e->src[2]), kn_dv(&e->dst), e->node->p.sdpa.causal,
                                    e->node->p.sdpa.scale, e->node->p.sdpa.window, e->node->p.sdpa.softcap, s, nrows);
    if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa: kernel launch failed");
    kn_cu_tmp_free(s);
    return st;
}

/* ---- rope: pair (a, b) -> (a cos - b sin, a sin + b cos) ----
 * The angle of pair i at position p is formed in double as the reference
 * forms it, theta^(-2i/n_rot) as exp2(i * l2) with l2 = -2 log2(theta) / n_rot
 * from the host. Then it is reduced to [-pi, pi] in double (whole turns
 * off) and its cosine and sine are taken in float (sincospif), as the CPU
 * backend rounds them (f64 data keeps
 * double trig): double pow, cos and sin per pair cost an 8B-shaped prompt's
 * key rope 12 us a layer. The generated rope (render.c, put_rope) does the same. */
__device__ __forceinline__ void rope_cs(double p, int i, double l2, const kn_dview &ff, int has_ff, bool f64, double *c,
                                        double *s) {
    double ang = p * exp2((double)i * l2);
    if (has_ff) ang /= kn_dget(ff, i * ff.st[0]);
    if (f64) { sincos(ang, s, c); return; }
    double t = ang * 0.15915494309189535;   /* turns (1 / (2 pi)); less whole turns, a fraction of pi in [-1, 1] */
    float fs, fc;
    sincospif((float)(2.0 * (t - rint(t))), &fs, &fc);
    *c = fc; *s = fs;
}

__global__ void k_rope(kn_dview x, kn_dview pos, kn_dview ff, int has_ff, kn_dview y, int64_t rows, int64_t T, int64_t D,
                       int n_rot, int neox, double l2, double fscale) {
    int half = n_rot / 2;
    int64_t per = (int64_t)half + (D - n_rot);        /* pairs, then the untouched tail */
    bool f64 = x.dtype == KN_F64 || y.dtype == KN_F64;
    KN_GRID_LOOP(idx, rows * T * per) {
        int64_t q = idx % per, rt = idx / per, ti = rt % T;
        int64_t base = rt * D;
        if (q >= half) {
            int64_t j = n_rot + (q - half);
            kn_dput(y, kn_doff(y, base + j), kn_dget(x, kn_doff(x, base + j)));
            continue;
        }
        int i = (int)q;
        double c, s;
        rope_cs(kn_dget(pos, ti * pos.st[0]) * fscale, i, l2, ff, has_ff, f64, &c, &s);
        int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        double a = kn_dget(x, kn_doff(x, base + ia)), bb = kn_dget(x, kn_doff(x, base + ib));
        kn_dput(y, kn_doff(y, base + ia), a * c - bb * s);
        kn_dput(y, kn_doff(y, base + ib), a * s + bb * c);
    }
}
/* f32 rows with unit stride along D (q and k of every layer): float loads
 * and stores. One thread per (row, position, pair); the untouched tail is
 * copied when y is not x. */
__global__ void k_rope_f32(kn_dview x, kn_dview pos, kn_dview ff, int has_ff, kn_dview y, int64_t rows, int64_t T,
                           int64_t D, int n_rot, int neox, double l2, double fscale) {
    int half = n_rot / 2;
    int64_t per = (int64_t)half + (x.data != y.data ? D - n_rot : 0);
    const float *xd = (const float *)x.data;
    float *yd = (float *)y.data;
    int64_t total = rows * T * per;
    KN_GRID_LOOP(idx, total) {
        int64_t q, rt, ti;
        if (total <= INT32_MAX) {   /* 32-bit divisions (a 64-bit one is a long emulated sequence) */
            uint32_t u = (uint32_t)idx, r = u / (uint32_t)per;
            q = u - r * (uint32_t)per; rt = r; ti = r % (uint32_t)T;
        } else {
            q = idx % per; rt = idx / per; ti = rt % T;
        }
        int64_t ox = kn_doff(x, rt * D), oy = kn_doff(y, rt * D);   /* element 0 of the row; D has stride 1 */
        if (q >= half) {
            int64_t j = n_rot + (q - half);
            yd[oy + j] = xd[ox + j];
            continue;
        }
        int i = (int)q;
        double c, sn;
        rope_cs(kn_dget(pos, ti * pos.st[0]) * fscale, i, l2, ff, has_ff, false, &c, &sn);
        int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        double a = xd[ox + ia], b = xd[ox + ib];
        yd[oy + ia] = (float)(a * c - b * sn);
        yd[oy + ib] = (float)(a * sn + b * c);
    }
}
static kn_status cu_rope(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0];
    int nd = x->ndim;
    int64_t T = x->ne[nd - 2], D = x->ne[nd - 1], rows = (T * D) != 0 ? kn_tview_numel(x) / (T * D) : 0;
    int n_rot = t->p.rope.n_rot;
    int64_t n = rows * T * (n_rot / 2 + (D - n_rot));
    if (n == 0) return KN_OK;
    bool has_ff = e->nsrc > 2;
    double l2 = -2.0 * log2(t->p.rope.theta) / n_rot;   /* theta^(-2i/n_rot) = exp2(i l2) */
    const kn_tview *y = &e->dst;
    bool same = x->data == y->data;
    for (int i = 0; same && i < nd; i++) same = x->ne[i] == y->ne[i] && (x->ne[i] == 1 || x->st[i] == y->st[i]);
    if (x->dtype == KN_F32 && y->dtype == KN_F32 && (D == 1 || (x->st[nd - 1] == 1 && y->st[nd - 1] == 1)) &&
        (same || x->data != y->data) && !kn_env_get()->cuda_generic) {
        k_rope_f32<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(&e->src[1]), kn_dv(has_ff ? &e->src[2] : &e->src[1]),
                                                                 has_ff, kn_dv(y), rows, T, D, n_rot, t->p.rope.neox,
                                                                 l2, t->p.rope.freq_scale);
        LAUNCHED_OK();
    }
    k_rope<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(&e->src[1]), kn_dv(has_ff ? &e->src[2] : &e->src[1]), has_ff,
                                          kn_dv(&e->dst), rows, T, D, n_rot, t->p.rope.neox, l2,
                                          t->p.rope.freq_scale);
    LAUNCHED_OK();
}

kn_status kn_cu_nn(const kn_exec *e) {
    switch (e->node->op) {
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: return cu_softmax(e);
    case KN_OP_LAYER_NORM: case KN_OP_RMS_NORM: return cu_layer_rms_norm(e);
    case KN_OP_GROUP_NORM: case KN_OP_BATCH_NORM: return cu_group_batch_norm(e);
    case KN_OP_CONV2D: case KN_OP_CONV_TRANSPOSE2D: case KN_OP_CONV2D_BWD_W: return cu_conv(e);
    case KN_OP_MAX_POOL2D: case KN_OP_MAX_POOL2D_BWD: case KN_OP_AVG_POOL2D: case KN_OP_AVG_POOL2D_BWD:
    case KN_OP_ADAPTIVE_AVG_POOL2D: case KN_OP_ADAPTIVE_AVG_POOL2D_BWD: return cu_pool(e);
    case KN_OP_SDPA: return cu_sdpa(e);
    case KN_OP_SDPA_BWD: return kn_cu_sdpa_bwd(e);   /* cuda_ops_attn.cu */
    case KN_OP_NORM_BWD: return cu_norm_bwd(e);
    case KN_OP_PAGED_ATTN: return kn_cu_paged_attn(e);   /* cuda_paged_attn.cu */
    case KN_OP_CROSS_ENTROPY: case KN_OP_CROSS_ENTROPY_BWD: return kn_cu_cross_entropy(e);   /* cuda_ops_loss.cu */
    case KN_OP_ROPE: return cu_rope(e);
    case KN_OP_TOPK: case KN_OP_MUL_MAT_ID: return kn_cu_moe(e);   /* cuda_ops_moe.cu */
    case KN_OP_UNFOLD: case KN_OP_FOLD: return cu_fold(e);
    case KN_OP_SORT: return kn_cu_sort(e);   /* cuda_ops_sort.cu */
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no nn kernel for %s", kn_op_name(e->node->op));
}
