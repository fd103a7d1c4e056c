/* cuda_ops_reduce.cu: reductions over an axis set, scans and matmul on the
 * GPU. Reductions run one block per output element (threads stride over the
 * reduced index space, double accumulation, block-wide combine) with the
 * NaN rules of src/backends/ref/ref_reduce.c. Matmul takes kn_cuda_sgemm_batched
 * for f32 plain/transposed matrices (all batch entries in one launch), the
 * tensor-core kernels for bf16 x bf16 and f16 x f16 (matmul_tc) and for f32
 * activations times a bf16/f16 weight (an LLM's x @ W^T: A rounded to the
 * weight dtype as it is loaded, f32 out), the GEMV kernels for one f32 row
 * times a dense f32, bf16 or f16 weight used transposed (decode), a generic
 * double kernel otherwise (f64, integers, other mixed operand dtypes, zero
 * strides). A GGUF-quantized right operand (a weight kept as stored) takes
 * cuda_ops_quant.cu. */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/tune.cuh"      // defines: kn_cuda_tune (gemv_early)
#include <stdlib.h>
#include <string.h>

#define KN_NAN __longlong_as_double(0x7ff8000000000000ll)

struct red_geo {
    int nk, nr;
    int64_t kne[KN_MAX_DIMS], kst[KN_MAX_DIMS], rne[KN_MAX_DIMS], rst[KN_MAX_DIMS];
};
__device__ __forceinline__ int64_t sub_off(int n, const int64_t *ne, const int64_t *st, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % ne[d]) * st[d]; lin /= ne[d]; }
    return o;
}

/* (value, index) of a max/min scan: the lowest-index NaN wins, else the
 * lowest-index extreme (ties keep the first). */
__device__ __forceinline__ void arg_merge(double &v, int64_t &i, double v2, int64_t i2, bool mx) {
    if (i2 < 0) return;
    if (i < 0) { v = v2; i = i2; return; }
    double fv = i < i2 ? v : v2, sv = i < i2 ? v2 : v;
    int64_t fi = i < i2 ? i : i2, si = i < i2 ? i2 : i;
    if (isnan(fv)) { v = fv; i = fi; return; }
    if (isnan(sv) || (mx ? sv > fv : sv < fv)) { v = sv; i = si; return; }
    v = fv; i = fi;
}

__global__ void __launch_bounds__(KN_THREADS) k_reduce(kn_dview x, kn_dview d, red_geo g, int64_t nout, int64_t nred, int op, int corr, double p) {
    __shared__ double sh[32];
    __shared__ double shv[KN_THREADS];
    __shared__ int64_t shi[KN_THREADS];
    const int tid = threadIdx.x, T = blockDim.x;
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t xo = sub_off(g.nk, g.kne, g.kst, o);
#define XV(j) kn_dget(x, xo + sub_off(g.nr, g.rne, g.rst, (j)))
        double r = 0;
        switch (op) {
        case KN_OP_SUM: case KN_OP_MEAN: {
            double acc = 0;
            for (int64_t j = tid; j < nred; j += T) acc += XV(j);
            acc = kn_dblock_sum(acc, sh);
            r = op == KN_OP_MEAN ? acc / (double)nred : acc;
            break;
        }
        case KN_OP_PROD: {
            double acc = 1;
            for (int64_t j = tid; j < nred; j += T) acc *= XV(j);
            __syncthreads();
            shv[tid] = acc;
            __syncthreads();
            if (tid == 0) { for (int k = 1; k < T; k++) acc *= shv[k]; }
            r = acc;
            break;
        }
        case KN_OP_MAX: case KN_OP_MIN: case KN_OP_ARGMAX: case KN_OP_ARGMIN: {
            bool mx = op == KN_OP_MAX || op == KN_OP_ARGMAX;
            double m = 0;
            int64_t arg = -1;
            for (int64_t j = tid; j < nred; j += T) arg_merge(m, arg, XV(j), j, mx);
            __syncthreads();
            shv[tid] = m; shi[tid] = arg;
            __syncthreads();
            if (tid == 0) {
                for (int k = 1; k < T; k++) arg_merge(m, arg, shv[k], shi[k], mx);
                if (arg < 0) { m = KN_NAN; arg = 0; }
            }
            r = (op == KN_OP_ARGMAX || op == KN_OP_ARGMIN) ? (double)arg : m;
            break;
        }
        case KN_OP_VAR: case KN_OP_STD: {
            double acc = 0;
            for (int64_t j = tid; j < nred; j += T) acc += XV(j);
            double mean = kn_dblock_sum(acc, sh) / (double)nred, ss = 0;
            for (int64_t j = tid; j < nred; j += T) { double v = XV(j) - mean; ss += v * v; }
            ss = kn_dblock_sum(ss, sh);
            double den = (double)nred - corr;
            r = den > 0 ? ss / den : KN_NAN;
            if (op == KN_OP_STD) r = sqrt(r);
            break;
        }
        case KN_OP_LOGSUMEXP: {
            double m = -INFINITY;
            for (int64_t j = tid; j < nred; j += T) { double v = XV(j); if (v > m) m = v; }
            m = kn_dblock_max(m, sh);
            if (isinf(m)) { r = m; break; }
            double acc = 0;
            for (int64_t j = tid; j < nred; j += T) acc += exp(XV(j) - m);
            r = m + log(kn_dblock_sum(acc, sh));
            break;
        }
        case KN_OP_NORM: {
            if (isinf(p)) {
                double m = 0, nan = 0;
                for (int64_t j = tid; j < nred; j += T) { double v = fabs(XV(j)); if (isnan(v)) nan = 1; else if (v > m) m = v; }
                m = kn_dblock_max(m, sh);
                nan = kn_dblock_sum(nan, sh);
                r = nan > 0 ? KN_NAN : m;
            } else {
                double acc = 0;
                for (int64_t j = tid; j < nred; j += T) acc += pow(fabs(XV(j)), p);
                r = pow(kn_dblock_sum(acc, sh), 1.0 / p);
            }
            break;
        }
        case KN_OP_ALL: case KN_OP_ANY: {
            double cnt = 0;
            for (int64_t j = tid; j < nred; j += T) cnt += (op == KN_OP_ALL) ? (XV(j) == 0) : (XV(j) != 0);
            cnt = kn_dblock_sum(cnt, sh);
            r = op == KN_OP_ALL ? (cnt == 0) : (cnt != 0);
            break;
        }
        default: r = KN_NAN;
        }
#undef XV
        if (tid == 0) kn_dput(d, kn_doff(d, o), r);
        __syncthreads();
    }
}

/* ---- sum / mean with the work spread over the whole GPU ----
 * k_reduce gives each output one block, which leaves the GPU idle when there
 * are few outputs (a gradient norm: one sum over a whole parameter; a bias
 * gradient: 384 sums over 16384 rows) and reads with a stride when the kept
 * elements are the adjacent ones. Two kernels cover those cases; both can cut
 * the reduced index space into S slices (grid y), each writing a double
 * partial, and k_sum_finish adds the S partials of each output. */
#define RC_W 32
#define RC_H 8
#define RED_TARGET_BLOCKS 1024      /* enough blocks to fill 132 SMs several times */

/* kept elements adjacent: a warp takes 32 neighbouring outputs, RC_H rows of
 * threads split its slice of the reduced index space */
__global__ void __launch_bounds__(RC_W * RC_H) k_sum_cols(kn_dview x, kn_dview d, red_geo g, int64_t nout,
                                                         int64_t nred, int64_t slice, int mean, double *part) {
    __shared__ double sh[RC_H][RC_W + 1];
    int64_t o = (int64_t)blockIdx.x * RC_W + threadIdx.x;
    int64_t j0 = (int64_t)blockIdx.y * slice, j1 = j0 + slice < nred ? j0 + slice : nred;
    double acc = 0;
    if (o < nout) {
        int64_t xo = sub_off(g.nk, g.kne, g.kst, o);
        for (int64_t j = j0 + threadIdx.y; j < j1; j += RC_H) acc += kn_dget(x, xo + sub_off(g.nr, g.rne, g.rst, j));
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < nout) {
        for (int k = 1; k < RC_H; k++) acc += sh[k][threadIdx.x];
        if (part) part[(int64_t)blockIdx.y * nout + o] = acc;
        else kn_dput(d, kn_doff(d, o), mean ? acc / (double)nred : acc);
    }
}
/* few outputs, long reductions: block (o, slice) sums its slice of output o */
__global__ void __launch_bounds__(KN_THREADS) k_sum_rows_part(kn_dview x, red_geo g, int64_t nred, int64_t slice,
                                                             int64_t nout, double *part) {
    __shared__ double sh[32];
    int64_t o = blockIdx.x;
    int64_t xo = sub_off(g.nk, g.kne, g.kst, o);
    int64_t j0 = (int64_t)blockIdx.y * slice, j1 = j0 + slice < nred ? j0 + slice : nred;
    double acc = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) acc += kn_dget(x, xo + sub_off(g.nr, g.rne, g.rst, j));
    acc = kn_dblock_sum(acc, sh);
    if (threadIdx.x == 0) part[(int64_t)blockIdx.y * nout + o] = acc;
}
__global__ void k_sum_finish(const double *part, int S, int64_t nout, kn_dview d, int mean, int64_t nred) {
    KN_GRID_LOOP(o, nout) {
        double acc = 0;
        for (int k = 0; k < S; k++) acc += part[(int64_t)k * nout + o];
        kn_dput(d, kn_doff(d, o), mean ? acc / (double)nred : acc);
    }
}

/* many outputs, each a sum over one unit-stride dim of f32 (a row mean of
 * [B,T,C] over C, a softmax-gradient row sum): a warp per output, f32 loads,
 * double accumulation like the reference. k_reduce gave each such row a
 * whole 256-thread block and 64-bit index math per element. */
__global__ void k_sum_rows_warp(const float *x, red_geo g, int64_t nout, int64_t nred, kn_dview d, int mean) {
    int64_t o = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (o >= nout) return;
    const float *row = x + sub_off(g.nk, g.kne, g.kst, o);
    double acc = 0;
    for (int64_t j = lane; j < nred; j += 32) acc += row[j];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) kn_dput(d, kn_doff(d, o), mean ? acc / (double)nred : acc);
}

/* KN_ERR_UNSUPPORTED: not one of the two cases; k_reduce runs instead */
static kn_status sum_spread(const kn_exec *e, const red_geo *g, int64_t nout, int64_t nred) {
    const kn_tview *x = &e->src[0], *d = &e->dst;
    int mean = e->node->op == KN_OP_MEAN;
    bool cols = g->nk > 0 && g->kst[g->nk - 1] == 1 && nout >= RC_W;
    int64_t bx = cols ? (nout + RC_W - 1) / RC_W : nout;
    if (nred <= 0 || bx > INT32_MAX || (!cols && nout >= RED_TARGET_BLOCKS)) return KN_ERR_UNSUPPORTED;
    /* slices: enough blocks in all, but at least ~16 elements per thread */
    int64_t per_slice_min = cols ? RC_H * 16 : KN_THREADS * 16;
    int64_t S = (RED_TARGET_BLOCKS + bx - 1) / bx, smax = (nred + per_slice_min - 1) / per_slice_min;
    if (S > smax) S = smax;
    if (S > 1024) S = 1024;
    if (S < 1) S = 1;
    if (!cols && S == 1) return KN_ERR_UNSUPPORTED;       /* short rows: one block per output is fine */
    int64_t slice = (nred + S - 1) / S;
    S = (nred + slice - 1) / slice;
    double *part = NULL;
    if (S > 1) {
        kn_status st = kn_cu_tmp(sizeof(double) * (size_t)(S * nout), (void **)&part);
        if (st) return st;
    }
    dim3 grid((unsigned)bx, (unsigned)S);
    if (cols) k_sum_cols<<<grid, dim3(RC_W, RC_H), 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(d), *g, nout, nred, slice, mean, part);
    else k_sum_rows_part<<<grid, KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), *g, nred, slice, nout, part);
    kn_status st = KN_OK;
    if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "%s: kernel launch failed", kn_op_name(e->node->op));
    if (!st && part) {
        k_sum_finish<<<kn_blocks(nout), KN_THREADS, 0, kn_cu_stream()>>>(part, (int)S, nout, kn_dv(d), mean, nred);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "%s: kernel launch failed", kn_op_name(e->node->op));
    }
    kn_cu_tmp_free(part);
    return st;
}

kn_status kn_cu_reduce(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    switch (t->op) {
    case KN_OP_SUM: case KN_OP_MEAN: case KN_OP_PROD: case KN_OP_MAX: case KN_OP_MIN: case KN_OP_ARGMAX:
    case KN_OP_ARGMIN: case KN_OP_VAR: case KN_OP_STD: case KN_OP_LOGSUMEXP: case KN_OP_NORM: case KN_OP_ALL:
    case KN_OP_ANY: break;
    default: return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no reduction kernel for %s", kn_op_name(t->op));
    }
    uint32_t mask = t->p.reduce.axes;
    red_geo g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < x->ndim; i++) {
        if (mask >> i & 1) { g.rne[g.nr] = x->ne[i]; g.rst[g.nr++] = x->st[i]; }
        else { g.kne[g.nk] = x->ne[i]; g.kst[g.nk++] = x->st[i]; }
    }
    int64_t nout = 1, nred = 1;
    for (int i = 0; i < g.nk; i++) nout *= g.kne[i];
    for (int i = 0; i < g.nr; i++) nred *= g.rne[i];
    if (nout == 0) return KN_OK;
    if ((t->op == KN_OP_SUM || t->op == KN_OP_MEAN) && x->dtype == KN_F32 && g.nr == 1 && g.rst[0] == 1 &&
        nout >= RED_TARGET_BLOCKS && nout / 8 < INT32_MAX && nred <= 8192 && !kn_env_get()->cuda_generic) {
        k_sum_rows_warp<<<(unsigned)((nout + 7) / 8), 256, 0, kn_cu_stream()>>>((const float *)x->data, g, nout, nred, kn_dv(d),
                                                                               t->op == KN_OP_MEAN);
        KN_CUDA_LAUNCHED();
        return KN_OK;
    }
    if (t->op == KN_OP_SUM || t->op == KN_OP_MEAN) {
        kn_status st = sum_spread(e, &g, nout, nred);
        if (st != KN_ERR_UNSUPPORTED) return st;
    }
    unsigned blocks = nout > 65536 ? 65536u : (unsigned)nout;
    k_reduce<<<blocks, KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(d), g, nout, nred, (int)t->op, t->p.reduce.correction, t->p.reduce.p);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- scans: one thread per line ---- */
__global__ void k_scan(kn_dview x, kn_dview d, int n, red_geo g, int64_t lines, int64_t len, int64_t xs, int64_t ds, int prod) {
    KN_GRID_LOOP(l, lines) {
        int64_t xo = sub_off(n, g.kne, g.kst, l), dof = sub_off(n, g.kne, g.rst, l);
        double acc = prod ? 1 : 0;
        for (int64_t j = 0; j < len; j++) {
            double v = kn_dget(x, xo + j * xs);
            acc = prod ? acc * v : acc + v;
            kn_dput(d, dof + j * ds, acc);
        }
    }
}

kn_status kn_cu_scan(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (t->op != KN_OP_CUMSUM && t->op != KN_OP_CUMPROD)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no scan kernel for %s", kn_op_name(t->op));
    int dim = t->p.scan.dim, n = 0;
    red_geo g;            /* kne: line extents, kst: x strides, rst: dst strides */
    memset(&g, 0, sizeof g);
    int64_t lines = 1;
    for (int i = 0; i < x->ndim; i++)
        if (i != dim) { g.kne[n] = x->ne[i]; g.kst[n] = x->st[i]; g.rst[n] = d->st[i]; lines *= x->ne[i]; n++; }
    if (lines == 0) return KN_OK;
    k_scan<<<kn_blocks(lines), 128, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(d), n, g, lines, x->ne[dim], x->st[dim], d->st[dim], t->op == KN_OP_CUMPROD);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- matmul ---- */
/* dst [..., M, N] = a [..., M, K] @ b [..., K, N]; ab/bb/db: batch views (ndim nb) */
__global__ void k_matmul(kn_dview a, kn_dview b, kn_dview d, kn_dview ab, kn_dview bb, kn_dview db,
                         int64_t batch, int64_t M, int64_t N, int64_t K) {
    int an = a.ndim, bn = b.ndim, dn = d.ndim;
    int64_t sam = a.st[an - 2], sak = a.st[an - 1], sbk = b.st[bn - 2], sbn = b.st[bn - 1];
    int64_t sdm = d.st[dn - 2], sdn = d.st[dn - 1];
    KN_GRID_LOOP(idx, batch * M * N) {
        int64_t j = idx % N, i = (idx / N) % M, z = idx / (M * N);
        int64_t ao = kn_doff(ab, z) + i * sam, bo = kn_doff(bb, z) + j * sbn;
        double acc = 0;
        for (int64_t k = 0; k < K; k++) acc += kn_dget(a, ao + k * sak) * kn_dget(b, bo + k * sbk);
        kn_dput(d, kn_doff(db, z) + i * sdm + j * sdn, acc);
    }
}

/* Each operand's last two dims: row-major (unit stride along columns) or
 * stored transposed, with a leading dimension that the GEMM accepts. */
static bool mat_layout(const kn_tview *v, bool *trans, int64_t *ld) {
    int r = v->ndim - 2, c = v->ndim - 1;
    if (v->st[c] == 1 || v->ne[c] == 1) {
        *trans = false; *ld = v->ne[r] == 1 ? v->ne[c] : v->st[r];
        return *ld >= v->ne[c] || v->ne[r] == 1;
    }
    if (v->st[r] == 1 || v->ne[r] == 1) {
        *trans = true; *ld = v->ne[c] == 1 ? v->ne[r] : v->st[c];
        return *ld >= v->ne[r] || v->ne[c] == 1;
    }
    return false;
}

/* Split-K for a single product with few output tiles and a long K (a weight
 * gradient: [384,1152] summed over 16384 token rows is 27 tiles of 128x128,
 * a fifth of the SMs, each running the whole K). The K range is cut into S
 * slices, run as one batched GEMM into scratch partials [S,M,N] (the batch
 * dim steps A and B along K; for bf16/f16 on an sm_90a device the wgmma
 * kernel's split-K, which picks its own slices), then k_split_k_sum_cast
 * adds the slices in order. */
#define SPLITK_TILES 66             /* below half the SMs of an H100/H200 */
/* The slices' f32 partials [S, M, N] summed in slice order into C (f32, bf16
 * or f16), rounded once */
__global__ void k_split_k_sum_cast(const float *part, int S, int64_t M, int64_t N, void *c, int cdt, int64_t ldc) {
    KN_GRID_LOOP(i, M * N) {
        float acc = 0.f;
        for (int s = 0; s < S; s++) acc += part[(int64_t)s * M * N + i];
        int64_t o = (i / N) * ldc + i % N;
        if (cdt == KN_F32) ((float *)c)[o] = acc;
        else if (cdt == KN_BF16) ((uint16_t *)c)[o] = kn_f2bf(acc);
        else ((uint16_t *)c)[o] = kn_dev_f2h(acc);
    }
}
/* Slices for a product of few output tiles (fewer than SPLITK_TILES of
 * 128 x 128) and a long K: about 4 blocks per SM in all, slices of at least
 * 512 that divide K and are a multiple of mult; 0: do not split */
static int64_t split_k_slices(int64_t M, int64_t N, int64_t K, int64_t mult) {
    int64_t tiles = ((M + 127) / 128) * ((N + 127) / 128);
    if (tiles >= SPLITK_TILES || K < 2048 || kn_env_get()->cuda_no_splitk) return 0;
    int64_t S = (4 * 2 * SPLITK_TILES + tiles - 1) / tiles;
    if (S > K / 512) S = K / 512;
    while (S > 1 && (K % S || (K / S) % mult)) S--;
    return S >= 2 ? S : 0;
}
/* f32 operands (SGEMM; M and N multiples of 4, slices a multiple of 8), or
 * bf16/f16 on the tensor cores (a weight gradient dW [768, 768] = dY^T X over
 * 8192 token rows: 36 output tiles ran at 49 TFLOP/s on an H200; slices a
 * multiple of 64, so every slice keeps the 16-byte alignment of the whole),
 * into C of dtype cdt (f32; for 16-bit operands also their dtype): the
 * slices' products in f32 scratch, then summed in order and rounded once,
 * like the unsplit kernel's f32 accumulator. */
static kn_status matmul_split_k(bool ta, bool tb, int64_t M, int64_t N, int64_t K, kn_dtype ab, const void *A, int64_t lda,
                                const void *B, int64_t ldb, void *C, kn_dtype cdt, int64_t ldc) {
    bool f32 = ab == KN_F32;
    if (cdt != KN_F32 && (f32 || cdt != ab)) return KN_ERR_UNSUPPORTED;
    /* 16-bit operands on an sm_90a device: the wgmma kernel's own split-K
     * (slices of any length, one launch, f32 partials) */
    int64_t kc = 0;
    int64_t S = f32 || kn_env_get()->cuda_no_splitk || kn_env_get()->cuda_no_wgmma ? 0 :
                kn_cuda_gemm_wgmma_split(ab, ta, tb, M, N, K, A, lda, B, ldb, &kc);
    const bool wg = S > 0;
    if (!wg) {
        S = f32 && (M % 4 || N % 4) ? 0 : split_k_slices(M, N, K, f32 ? 8 : 64);
        if (!S) return KN_ERR_UNSUPPORTED;
        kc = K / S;
    }
    float *part = NULL;
    kn_status st = kn_cu_tmp(sizeof(float) * (size_t)(S * M * N), (void **)&part);
    if (st) return st;
    /* slice s reads columns [s*kc, (s+1)*kc) of op(A) and rows of op(B) */
    kn_cuda_gemm_batch bt = {1, {S}, {ta ? kc * lda : kc}, {tb ? kc : kc * ldb}, {M * N}};
    if (wg)
        st = kn_cuda_gemm_wgmma_splitk(ab, ta, tb, M, N, K, A, lda, B, ldb, part, kn_cu_stream());
    else if (f32)
        st = kn_cuda_sgemm_batched(ta, tb, M, N, kc, 1.0f, (const float *)A, lda, (const float *)B, ldb, 0.0f, part, N, &bt,
                                   kn_cu_stream());
    else
        st = kn_cuda_gemm_tc(ab, ta, tb, M, N, kc, 1.0f, A, lda, B, ldb, part, KN_F32, N, &bt, kn_cu_stream());
    if (!st) {
        k_split_k_sum_cast<<<kn_blocks(M * N), KN_THREADS, 0, kn_cu_stream()>>>(part, (int)S, M, N, C, (int)cdt, ldc);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "matmul: split-K sum launch failed");
    }
    kn_cu_tmp_free(part);
    return st;
}

/* Fold the batch into M when B is shared by every entry and the rows of A
 * and C continue from one entry to the next with the same stride (x @ W^T
 * for x [B,T,C] contiguous): one GEMM of batch*M rows instead of a batch. */
static bool fold_batch(const kn_cuda_gemm_batch *bt, bool ta, int64_t M, int64_t lda, int64_t ldc, int64_t *Mf) {
    if (ta) return bt->nb == 0 ? (*Mf = M, true) : false;
    int64_t ra = M * lda, rc = M * ldc, rows = M;
    for (int i = bt->nb - 1; i >= 0; i--) {
        if (bt->sb[i] != 0 || bt->sa[i] != ra || bt->sc[i] != rc) return false;
        ra *= bt->ne[i]; rc *= bt->ne[i]; rows *= bt->ne[i];
    }
    *Mf = rows;
    return true;
}

/* bf16/f16 operands of one dtype on the tensor cores. On an sm_90a build
 * and device, products that kn_cuda_gemm_wgmma_fits accepts (any of the
 * four layouts, bf16 or f16, C in the operand dtype, 16-byte aligned
 * operands with lda, ldb % 8 == 0, a batch of one stride per operand,
 * enough tiles) take the wgmma kernel of gemm_bf16_sm90.cu when K > 64; a
 * batch foldable into M (x [B,T,C] @ W^T) is folded first. K <= 64 (one k
 * tile, nothing for the TMA pipeline to overlap: attention scores q @ k^T
 * with a head dim of 64) stays on mma.sync, which measured faster there
 * (H200, Z=96 1024x1024x64: 197.7 us vs 210.9 us). The rest take the mma.sync kernel of
 * gemm_tc.cu (any layout the mat_layout test accepts, any batch strides).
 * WG_LAYOUTS masks the wgmma path per layout (bit (ta ? 2 : 0) | (tb ? 0 :
 * 1)): each layout is on only where it measured faster than mma.sync on an
 * H200 (docs/PERF-cuda-backend.md). KN_CUDA_NO_WGMMA=1 keeps everything on
 * mma.sync (to compare the two). */
#define WG_LAYOUTS 0xF
static kn_status matmul_tc(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const kn_tview *a, int64_t lda,
                           const kn_tview *b, int64_t ldb, const kn_tview *d, int64_t ldc, const kn_cuda_gemm_batch *bt) {
    int64_t Mf = 0;
    if (bt->nb == 0) {
        kn_status st = matmul_split_k(ta, tb, M, N, K, a->dtype, a->data, lda, b->data, ldb, d->data, d->dtype, ldc);
        if (st != KN_ERR_UNSUPPORTED) return st;
    }
    if (K > 64 && ((WG_LAYOUTS >> ((ta ? 2 : 0) | (tb ? 0 : 1))) & 1) && !kn_env_get()->cuda_no_wgmma) {
        kn_cuda_gemm_batch none;
        memset(&none, 0, sizeof none);
        if (bt->nb > 0 && fold_batch(bt, ta, M, lda, ldc, &Mf) &&
            kn_cuda_gemm_wgmma_fits(a->dtype, ta, tb, Mf, N, K, a->data, lda, b->data, ldb, d->data, d->dtype, ldc, &none))
            return kn_cuda_gemm_wgmma(a->dtype, ta, tb, Mf, N, K, a->data, lda, b->data, ldb, d->data, d->dtype, ldc, &none,
                                      kn_cu_stream());
        if (kn_cuda_gemm_wgmma_fits(a->dtype, ta, tb, M, N, K, a->data, lda, b->data, ldb, d->data, d->dtype, ldc, bt))
            return kn_cuda_gemm_wgmma(a->dtype, ta, tb, M, N, K, a->data, lda, b->data, ldb, d->data, d->dtype, ldc, bt,
                                      kn_cu_stream());
    }
    return kn_cuda_gemm_tc(a->dtype, ta, tb, M, N, K, 1.0f, a->data, lda, b->data, ldb, d->data, d->dtype, ldc, bt,
                           kn_cu_stream());
}

kn_status kn_cu_matmul(const kn_exec *e) {
    if (e->epi) return kn_cu_matmul_epilogue(e);    /* cuda_ops_epilogue.cu */
    return kn_cu_matmul_gemv_epi(e, NULL, NULL);
}

kn_status kn_cu_matmul_gemv_epi(const kn_exec *e, const kn_cu_gemv_epi *ge, int *done) {
    const kn_tview *d = &e->dst;
    if (done) *done = 0;
    if (kn_dtype_get(e->src[1].dtype)->is_quant) return kn_cu_matmul_quant(e, ge, done);   /* cuda_ops_quant.cu */
    int nb = d->ndim - 2;
    kn_tview a = e->src[0], b = e->src[1];
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a.ne[a.ndim - 1];
    kn_tview ab = a, bb = b, db = *d;
    ab.ndim = a.ndim - 2; bb.ndim = b.ndim - 2; db.ndim = nb;
    ab = kn_tview_broadcast(&ab, nb, d->ne);
    bb = kn_tview_broadcast(&bb, nb, d->ne);
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    bool ta, tb;
    int64_t lda, ldb;
    /* a dense GEMM layout: every matrix stride nonzero, C rows unit-strided */
    bool gemm_layout = K > 0 && (d->st[nb + 1] == 1 || N == 1) && (d->st[nb] >= N || M == 1) &&
                       a.st[a.ndim - 1] != 0 && a.st[a.ndim - 2] != 0 && b.st[b.ndim - 1] != 0 && b.st[b.ndim - 2] != 0 &&
                       mat_layout(&a, &ta, &lda) && mat_layout(&b, &tb, &ldb) && nb <= KN_CUDA_MAX_BATCH_DIMS;
    bool f32 = d->dtype == KN_F32 && a.dtype == KN_F32 && b.dtype == KN_F32 && !kn_env_get()->cuda_no_sgemm;
    /* bf16 x bf16 or f16 x f16 (mixed operand dtypes stay on the generic kernel) */
    bool tc = (a.dtype == KN_BF16 || a.dtype == KN_F16) && b.dtype == a.dtype &&
              (d->dtype == a.dtype || d->dtype == KN_F32) && kn_cuda_gemm_tc_available() && !kn_env_get()->cuda_no_tc;
    /* f32 activations times a bf16/f16 weight, f32 out (A stored M x K) */
    bool mixed = a.dtype == KN_F32 && (b.dtype == KN_BF16 || b.dtype == KN_F16) && d->dtype == KN_F32 && gemm_layout &&
                 !ta && kn_cuda_gemm_tc_available() && !kn_env_get()->cuda_no_tc;
    /* decode: one f32 row times a dense weight W [N,K] used transposed (f32,
     * bf16 or f16 W, f32 out: the GEMV kernels, which read W once at full width) */
    bool gemv = gemm_layout && M == 1 && batch == 1 && !ta && tb && ldb == K && a.dtype == KN_F32 && d->dtype == KN_F32 &&
                (b.dtype == KN_F32 ? K % 4 == 0 : (b.dtype == KN_BF16 || b.dtype == KN_F16) && K % 8 == 0) &&
                kn_aligned16(a.data) && kn_aligned16(b.data) && (N == 1 || d->st[nb + 1] == 1) && N <= INT32_MAX &&
                K <= INT32_MAX && !kn_env_get()->cuda_no_gemv;
    bool pre = ge && ge->pre.kind != KN_GV_PRE_NONE;
    if (pre && !gemv) return KN_ERR_UNSUPPORTED;   /* the caller computes the prologue's A first */
    if (gemv) {
        /* a matmul epilogue in the GEMV's store (gemv.cu: every step rounded
         * as the unfused f32 nodes round it) and its prologue; else at least
         * the bias, which every GEMV kernel adds: y = dot + bias[n] */
        const float *bias = ge ? ge->bias : NULL;
        /* no kernel of the plan writes W: its first step is loaded before
         * the PDL wait (KN_CUDA_TUNE=gemv_early=0 turns that off) */
        static const int early = kn_cuda_tune("gemv_early", 1);
        const int wfix = early && (e->fixed >> 1 & 1u);
        if ((ge && (ge->act || ge->res || pre)) || wfix) {
            kn_status st = kn_cuda_gemv_epi((int)b.dtype, (float *)d->data, b.data, (const float *)a.data, bias, ge ? ge->act : 0,
                                            ge ? ge->res : NULL, N, K, ge ? &ge->pre : NULL, wfix, kn_cu_stream());
            if (st != KN_ERR_UNSUPPORTED) {
                if (done) *done = 2;
                return st;
            }
            if (pre) return st;
        }
        if (done && bias) *done = 1;
        if (b.dtype == KN_F32)
            return kn_cuda_gemv_f32((float *)d->data, (const float *)b.data, (const float *)a.data, bias, N, K, kn_cu_stream());
        if (b.dtype == KN_F16)
            return kn_cuda_gemv_f16((float *)d->data, (const uint16_t *)b.data, (const float *)a.data, bias, N, K, kn_cu_stream());
        return kn_cuda_gemv_bf16((float *)d->data, (const uint16_t *)b.data, (const float *)a.data, bias, N, K, kn_cu_stream());
    }
    if (gemm_layout && (f32 || tc || mixed)) {
        /* one batched launch: a loop of per-matrix launches left most of the
         * GPU idle for attention heads and per-sequence products */
        int64_t ldc = d->st[nb] > N ? d->st[nb] : N;
        kn_cuda_gemm_batch bt;
        memset(&bt, 0, sizeof bt);
        for (int i = 0; i < nb; i++) {
            if (d->ne[i] == 1) continue;           /* size-1 dims move nothing */
            bt.ne[bt.nb] = d->ne[i]; bt.sa[bt.nb] = ab.st[i]; bt.sb[bt.nb] = bb.st[i]; bt.sc[bt.nb] = db.st[i];
            bt.nb++;
        }
        if (tc) return matmul_tc(ta, tb, M, N, K, &a, lda, &b, ldb, d, ldc, &bt);
        if (mixed)
            return kn_cuda_gemm_tc_f32a(b.dtype, tb, M, N, K, 1.0f, (const float *)a.data, lda, b.data, ldb, d->data, KN_F32,
                                        ldc, &bt, kn_cu_stream());
        if (bt.nb == 0) {
            kn_status st = matmul_split_k(ta, tb, M, N, K, KN_F32, a.data, lda, b.data, ldb, d->data, KN_F32, ldc);
            if (st != KN_ERR_UNSUPPORTED) return st;
        }
        return kn_cuda_sgemm_batched(ta, tb, M, N, K, 1.0f, (const float *)a.data, lda, (const float *)b.data, ldb,
                                     0.0f, (float *)d->data, ldc, &bt, kn_cu_stream());
    }
    int64_t n = batch * M * N;
    if (n == 0) return KN_OK;
    k_matmul<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&a), kn_dv(&b), kn_dv(d), kn_dv(&ab), kn_dv(&bb), kn_dv(&db), batch, M, N, K);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
