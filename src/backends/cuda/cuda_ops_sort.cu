/* cuda_ops_sort.cu: SORT on the GPU (src/graph/ops_sort.c states it; the
 * reference is src/backends/ref/ref_sort.c).
 *
 * One block per line along the sorted dim (blocks loop over lines): the
 * line's (value as double, index) pairs, padded to P = the next power of
 * two with entries that order last, go through a bitonic sort whose compare
 * is the sort's total order (value with NaN largest and -0.0 == 0.0, then
 * index; descending reverses the values only). A total order makes any
 * sorting network give the stable result, equal to the reference's.
 * Lines up to 4096 sort in shared memory (P * 12 bytes); longer ones in a
 * global scratch slice per block (fewer blocks, so the scratch stays under
 * 256 MiB; O(P log^2 P) per line: fine for the lengths kiln sorts, not a
 * segmented radix sort). Any dtype through kn_dview (read as double), any
 * strides, i64 indices out.
 * Compile-checked in the CPU-only session that wrote it; test_cuda_ops.c
 * (sort_unfold_fold_family) compares it with the reference on a GPU.
 */
#include "backends/cuda/cuda_ops.cuh"

__device__ __forceinline__ bool srt_before(double a, int ia, double b, int ib, bool desc) {
    if (ia < 0) return false;                /* padding: after everything */
    if (ib < 0) return true;
    bool an = isnan(a), bn = isnan(b);
    bool lt = !an && (bn || a < b), gt = !bn && (an || a > b);
    if (lt || gt) return desc ? gt : lt;
    return ia < ib;
}

__global__ void k_sort(kn_dview x, kn_dview y, int d, bool desc, int64_t n, int64_t P, int64_t lines, double *gkey,
                       int *gid) {
    extern __shared__ double skey[];
    double *key = gkey ? gkey + (int64_t)blockIdx.x * P : skey;
    int *id = gkey ? gid + (int64_t)blockIdx.x * P : (int *)(skey + P);
    for (int64_t r = blockIdx.x; r < lines; r += gridDim.x) {
        int64_t xo = 0, yo = 0, lin = r;
        for (int k = x.ndim - 1; k >= 0; k--) {
            if (k == d) continue;
            int64_t q = lin % x.ne[k];
            lin /= x.ne[k];
            xo += q * x.st[k]; yo += q * y.st[k];
        }
        for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
            key[i] = i < n ? kn_dget(x, xo + i * x.st[d]) : 0.0;
            id[i] = i < n ? (int)i : -1;
        }
        __syncthreads();
        for (int64_t k = 2; k <= P; k <<= 1)
            for (int64_t j = k >> 1; j > 0; j >>= 1) {
                for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
                    int64_t l = i ^ j;
                    if (l <= i) continue;
                    bool up = (i & k) == 0;
                    bool sw = up ? srt_before(key[l], id[l], key[i], id[i], desc) : srt_before(key[i], id[i], key[l], id[l], desc);
                    if (sw) {
                        double tk = key[i]; key[i] = key[l]; key[l] = tk;
                        int ti = id[i]; id[i] = id[l]; id[l] = ti;
                    }
                }
                __syncthreads();
            }
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) kn_dput(y, yo + i * y.st[d], (double)id[i]);
        __syncthreads();
    }
}

kn_status kn_cu_sort(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.sort.dim;
    int64_t n = x->ne[d], lines = 1;
    for (int k = 0; k < x->ndim; k++) if (k != d) lines *= x->ne[k];
    if (!n || !lines) return KN_OK;
    if (n > INT32_MAX / 2)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: sort: a line of %lld elements (at most %d)", (long long)n, INT32_MAX / 2);
    int64_t P = 1;
    while (P < n) P <<= 1;
    int threads = P / 2 < 32 ? 32 : P / 2 > 1024 ? 1024 : (int)(P / 2);
    size_t per = (size_t)P * (sizeof(double) + sizeof(int));
    double *gkey = NULL;
    int *gid = NULL;
    int64_t blocks = lines < 65535 ? lines : 65535;
    void *scratch = NULL;
    size_t smem = 0;
    if (per <= 48 * 1024) smem = per;
    else {
        int64_t cap = (int64_t)((256u << 20) / per);
        if (cap < 1) cap = 1;
        if (blocks > cap) blocks = cap;
        kn_status st = kn_cu_tmp(per * (size_t)blocks, &scratch);
        if (st) return st;
        gkey = (double *)scratch;
        gid = (int *)(gkey + P * blocks);
    }
    k_sort<<<(unsigned)blocks, threads, smem, kn_cu_stream()>>>(kn_dv(x), kn_dv(y), d, e->node->p.sort.descending, n, P, lines,
                                                                gkey, gid);
    if (scratch) kn_cu_tmp_free(scratch);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
