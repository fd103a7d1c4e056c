/* cuda_ops_reduce.cu: reductions over an axis set, scans and matmul on the
 * GPU. Reductions run one block per output element (threads stride over the
 * reduced index space, double accumulation, block-wide combine) with the
 * NaN rules of src/backends/ref/ref_reduce.c. Matmul takes kn_cuda_sgemm
 * for f32 plain/transposed matrices, a generic kernel otherwise. */
#include "backends/cuda/cuda_ops.cuh"
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
    unsigned blocks = nout > 65536 ? 65536u : (unsigned)nout;
    k_reduce<<<blocks, KN_THREADS>>>(kn_dv(x), kn_dv(d), g, nout, nred, (int)t->op, t->p.reduce.correction, t->p.reduce.p);
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
    k_scan<<<kn_blocks(lines), 128>>>(kn_dv(x), kn_dv(d), n, g, lines, x->ne[dim], x->st[dim], d->st[dim], t->op == KN_OP_CUMPROD);
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

kn_status kn_cu_matmul(const kn_exec *e) {
    const kn_tview *d = &e->dst;
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
    bool fast = d->dtype == KN_F32 && a.dtype == KN_F32 && b.dtype == KN_F32 && K > 0 &&
                (d->st[nb + 1] == 1 || N == 1) && (d->st[nb] >= N || M == 1) &&
                a.st[a.ndim - 1] != 0 && a.st[a.ndim - 2] != 0 && b.st[b.ndim - 1] != 0 && b.st[b.ndim - 2] != 0 &&
                mat_layout(&a, &ta, &lda) && mat_layout(&b, &tb, &ldb) && !getenv("KN_CUDA_NO_SGEMM");
    if (fast) {
        int64_t ldc = d->st[nb] > N ? d->st[nb] : N;
        for (int64_t z = 0; z < batch; z++) {
            int64_t ao = 0, bo = 0, co = 0, lin = z;
            for (int i = nb - 1; i >= 0; i--) {
                int64_t q = lin % d->ne[i];
                lin /= d->ne[i];
                ao += q * ab.st[i]; bo += q * bb.st[i]; co += q * db.st[i];
            }
            kn_status st = kn_cuda_sgemm(ta, tb, M, N, K, 1.0f, (const float *)a.data + ao, lda,
                                         (const float *)b.data + bo, ldb, 0.0f, (float *)d->data + co, ldc, NULL);
            if (st) return st;
        }
        return KN_OK;
    }
    int64_t n = batch * M * N;
    if (n == 0) return KN_OK;
    k_matmul<<<kn_blocks(n), KN_THREADS>>>(kn_dv(&a), kn_dv(&b), kn_dv(d), kn_dv(&ab), kn_dv(&bb), kn_dv(&db), batch, M, N, K);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
