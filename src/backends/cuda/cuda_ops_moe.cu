/* cuda_ops_moe.cu: TOPK and MUL_MAT_ID on the GPU (src/graph/ops_moe.c
 * states them; the reference is src/backends/ref/ref_moe.c).
 *
 * MUL_MAT_ID groups rows per expert on the device, so the host never reads
 * ids (no wait, and the launch sequence is the same every call, as CUDA
 * graph replay needs):
 *   1. k_mmid_group (one block): counts rows per expert, prefix sums into
 *      start[E + 1] and writes each expert's (t, j) rows into order[R];
 *      an id out of range is recorded in the op's error slot and its row
 *      skipped (y keeps what it held; the plan's synchronize reports it).
 *   2. k_mmid (grid: N / 8 x E): a block takes 8 weight rows of one expert,
 *      one warp a row, and dots it with every row of that expert's list, so
 *      each weight row comes from memory once per call (later rows hit the
 *      cache); an expert with no row returns at once. W f32, f16, bf16 or a
 *      GGUF block type the GPU decodes (quant_blocks.cuh: a lane decodes
 *      runs of 8 weights), f32 sums.
 * TOPK: ties to the lower index, NaN largest. Short rows (router logits,
 * n < 1024): one thread per row, k selection passes. Long rows (a
 * vocabulary: the LLM's sampling candidates, k <= 256) in two kernels, each
 * a block-wide radix select over unique 64-bit keys (the value's order bits
 * above, ~index below, so the k-th key is exact and ties fall to the lower
 * index): k_topk_chunks keeps each 4096-element chunk's k best keys,
 * k_topk_merge selects the row's k among them and writes them best first.
 * Letters: T tokens, K slots, C input width, E experts, N output width, R = T K.
 * Compile-checked here; tests/test_moe_ops.c runs it on a GPU (scripts/cuda_test.sh).
 */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/quant_blocks.cuh"   // defines: kq_run, kn_qt, KN_QUANT_GPU_TYPES
#include "backends/cuda/kn_cuda.h"         // defines: kn_cuda_quant_supported

/* ---- topk ---- */
__device__ __forceinline__ bool tk_before(double a, double b, bool largest) {
    if (isnan(a) || isnan(b)) return largest ? isnan(a) && !isnan(b) : isnan(b) && !isnan(a);
    return largest ? a > b : a < b;
}
__global__ void k_topk(kn_dview x, kn_dview y, int64_t rows, int64_t n, int64_t k, bool largest) {
    int last = x.ndim - 1;
    KN_GRID_LOOP(r, rows) {
        int64_t xo = 0, yo = 0, lin = r;
        for (int d = last - 1; d >= 0; d--) {
            int64_t q = lin % x.ne[d];
            lin /= x.ne[d];
            xo += q * x.st[d]; yo += q * y.st[d];
        }
        /* pass j takes the best element strictly after pass j-1's in the order
         * (value, then index), so no "taken" marks are needed */
        double pv = 0;
        int64_t pi = -1;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            double bv = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = kn_dget(x, xo + i * x.st[last]);
                bool after = pi < 0 || tk_before(pv, v, largest) || (!tk_before(v, pv, largest) && i > pi);
                if (after && (best < 0 || tk_before(v, bv, largest))) { best = i; bv = v; }
            }
            kn_dput(y, yo + j * y.st[last], (double)best);
            pv = bv; pi = best;
        }
    }
}

/* Long rows. A key orders elements as topk does, larger key first: the
 * float's bits made monotone (NaN above everything; -0 as +0; for the
 * smallest, the value order reversed and NaN last), and below them ~index,
 * so keys are unique and equal values rank the lower index first. */
__device__ __forceinline__ uint64_t tk_key(double v, int64_t i, bool largest) {
    uint32_t o;
    float f = (float)v + 0.f;
    if (isnan(f)) o = largest ? 0xFFFFFFFFu : 0u;
    else {
        uint32_t b = __float_as_uint(f);
        o = (b & 0x80000000u) ? ~b : b | 0x80000000u;
        if (!largest) o = ~o;      /* +inf: 0x007FFFFF, so 0 stays NaN's */
    }
    return (uint64_t)o << 32 | (uint32_t)~(uint32_t)i;
}
#define TK_CHUNK 4096
#define TK_THREADS 512
#define TK_KMAX 256
/* The k largest of the cnt keys in smem key[] (unique keys, k <= cnt; keys
 * of 0 are padding, not counted: no real key is 0), by 8-bit radix digits
 * from the top: afterwards an element is one of them iff key != 0 and
 * (key & *mask) >= *prefix. Every thread of the block calls it. */
__device__ void tk_select(const uint64_t *key, int cnt, int k, uint64_t *prefix, uint64_t *mask) {
    __shared__ int hist[256];
    __shared__ uint64_t s_pre, s_mask;
    __shared__ int s_need, s_done;
    if (threadIdx.x == 0) { s_pre = 0; s_mask = 0; s_need = k; s_done = 0; }
    __syncthreads();
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint64_t pre = s_pre, msk = s_mask;
        for (int i = threadIdx.x; i < cnt; i += blockDim.x)
            if (key[i] && (key[i] & msk) == pre) atomicAdd(&hist[(key[i] >> shift) & 255], 1);
        __syncthreads();
        if (threadIdx.x == 0) {
            int need = s_need, d = 255;
            for (; d > 0 && hist[d] < need; d--) need -= hist[d];
            s_pre = pre | (uint64_t)d << shift;
            s_mask = msk | (uint64_t)255 << shift;
            s_need = need;
            s_done = hist[d] == need;    /* the whole bucket is taken: no need to split it */
        }
        __syncthreads();
        if (s_done) break;
    }
    *prefix = s_pre;
    *mask = s_mask;
}
/* grid (chunks, rows): each chunk's k best keys into part[row][chunk][k]
 * (a chunk shorter than k pads with key 0, which no real key is: its ~index
 * part is 0 only for index 2^32 - 1; tk_select skips it) */
__global__ void __launch_bounds__(TK_THREADS) k_topk_chunks(kn_dview x, int64_t n, int k, bool largest, uint64_t *part) {
    __shared__ uint64_t key[TK_CHUNK];
    __shared__ int taken;
    const int64_t r = blockIdx.y, c0 = (int64_t)blockIdx.x * TK_CHUNK;
    const int cnt = (int)(n - c0 < TK_CHUNK ? n - c0 : TK_CHUNK);
    int last = x.ndim - 1;
    int64_t xo = 0, lin = r;
    for (int d = last - 1; d >= 0; d--) { xo += (lin % x.ne[d]) * x.st[d]; lin /= x.ne[d]; }
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) key[i] = tk_key(kn_dget(x, xo + (c0 + i) * x.st[last]), c0 + i, largest);
    if (threadIdx.x == 0) taken = 0;
    __syncthreads();
    uint64_t *out = part + ((int64_t)r * gridDim.x + blockIdx.x) * k;
    if (cnt <= k) {
        for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = i < cnt ? key[i] : 0;
        return;
    }
    uint64_t pre, msk;
    tk_select(key, cnt, k, &pre, &msk);
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
        if (key[i] && (key[i] & msk) >= pre) out[atomicAdd(&taken, 1)] = key[i];
}
/* one block a row: the k best of the chunks' candidates, best first, as
 * indices into y */
__global__ void __launch_bounds__(TK_THREADS) k_topk_merge(const uint64_t *part, int cand, int k, kn_dview y, int64_t n) {
    extern __shared__ uint64_t tk_sm[];
    uint64_t *key = tk_sm, *sel = tk_sm + cand;
    __shared__ int taken;
    const int64_t r = blockIdx.x;
    for (int i = threadIdx.x; i < cand; i += blockDim.x) key[i] = part[r * cand + i];
    if (threadIdx.x == 0) taken = 0;
    __syncthreads();
    uint64_t pre, msk;
    tk_select(key, cand, k, &pre, &msk);
    for (int i = threadIdx.x; i < cand; i += blockDim.x)
        if (key[i] && (key[i] & msk) >= pre) sel[atomicAdd(&taken, 1)] = key[i];
    __syncthreads();
    int last = y.ndim - 1;
    int64_t yo = 0, lin = r;
    for (int d = last - 1; d >= 0; d--) { yo += (lin % y.ne[d]) * y.st[d]; lin /= y.ne[d]; }
    /* rank = how many selected keys are larger (keys are unique) */
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        int rank = 0;
        for (int j = 0; j < k; j++) rank += sel[j] > sel[i];
        kn_dput(y, yo + rank * y.st[last], (double)(uint32_t)~(uint32_t)sel[i]);
    }
}

static kn_status cu_topk(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int last = x->ndim - 1;
    int64_t n = x->ne[last], k = y->ne[last], rows = n ? kn_tview_numel(x) / n : 0;
    if (!rows || !k) return KN_OK;
    if (n >= 1024 && k <= TK_KMAX && n < INT32_MAX && rows <= 65535) {
        const int64_t chunks = (n + TK_CHUNK - 1) / TK_CHUNK, cand = chunks * k;
        if ((cand + k) * 8 <= 96 * 1024) {
            uint64_t *part;
            kn_status st = kn_cu_tmp(sizeof(uint64_t) * (size_t)(rows * cand), (void **)&part);
            if (st) return st;
            k_topk_chunks<<<dim3((unsigned)chunks, (unsigned)rows), TK_THREADS, 0, kn_cu_stream()>>>(
                kn_dv(x), n, (int)k, e->node->p.topk.largest, part);
            size_t smem = sizeof(uint64_t) * (size_t)(cand + k);
            static bool attr;
            if (!attr && smem > 48 * 1024) {
                KN_CUDA_TRY(cudaFuncSetAttribute(k_topk_merge, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
                attr = true;
            }
            k_topk_merge<<<(unsigned)rows, TK_THREADS, smem, kn_cu_stream()>>>(part, (int)cand, (int)k, kn_dv(y), n);
            KN_CUDA_LAUNCHED();
            kn_cu_tmp_free(part);
            return KN_OK;
        }
    }
    k_topk<<<kn_blocks(rows), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), kn_dv(y), rows, n, k, e->node->p.topk.largest);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- mul_mat_id ---- */
__global__ void k_mmid_group(kn_dview ids, int64_t T, int64_t K, int64_t E, int *start, int *order, kn_cu_err *err) {
    extern __shared__ int cnt[];                  /* [E + 1] */
    int64_t R = T * K;
    for (int64_t i = threadIdx.x; i <= E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
        double v = kn_dget(ids, (r / K) * ids.st[0] + (r % K) * ids.st[1]);
        if (v >= 0 && v < (double)E) atomicAdd(&cnt[(int64_t)v + 1], 1);
        else kn_cu_err_set(err, 1, 0, v, E);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int64_t i = 0; i < E; i++) cnt[i + 1] += cnt[i];
        for (int64_t i = 0; i <= E; i++) start[i] = cnt[i];
    }
    __syncthreads();
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
        double v = kn_dget(ids, (r / K) * ids.st[0] + (r % K) * ids.st[1]);
        if (v >= 0 && v < (double)E) order[atomicAdd(&cnt[(int64_t)v], 1)] = (int)r;
    }
}

/* one row n of expert e dotted with x row xr (f32, unit stride along C) by a warp */
template <int WT> struct mmid_dot {
    static __device__ __forceinline__ float go(const char *w, const float *xr, int64_t C) {
        float s = 0;
        for (int64_t c = threadIdx.x & 31; c < C; c += 32) {
            float wv = WT == KN_F32 ? ((const float *)w)[c]
                     : WT == KN_BF16 ? kn_bf2f(((const uint16_t *)w)[c]) : kn_dev_h2f(((const uint16_t *)w)[c]);
            s += wv * xr[c];
        }
        return kn_warp_sum(s);
    }
};
template <int QT> struct mmid_qdot {
    static __device__ __forceinline__ float go(const char *w, const float *xr, int64_t C) {
        typedef kn_qt<QT> Q;
        constexpr int RPB = Q::QK / 8;
        float s = 0;
        for (int64_t r = threadIdx.x & 31; r < C / 8; r += 32) {
            float wv[8];
            kq_run<QT>((const uint8_t *)w + (r / RPB) * Q::BPB, (int)(r % RPB), wv);
            const float *xv = xr + 8 * r;
#pragma unroll
            for (int i = 0; i < 8; i++) s += wv[i] * xv[i];
        }
        return kn_warp_sum(s);
    }
};

/* x f32 [T, K|1, C] (strides xs0, xs1; unit along C), y f32 [T, K, N] contiguous */
template <typename DOT>
__global__ void __launch_bounds__(256) k_mmid(const float *x, int64_t xs0, int64_t xs1, const char *W, size_t w_row,
                                              int64_t N, int64_t C, int64_t K, const int *start, const int *order, float *y) {
    int64_t e = blockIdx.y, n = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    int r0 = start[e], r1 = start[e + 1];
    if (r0 == r1 || n >= N) return;
    const char *w = W + (size_t)(e * N + n) * w_row;
    for (int i = r0; i < r1; i++) {
        int64_t r = order[i], t = r / K, j = r % K;
        float s = DOT::go(w, x + t * xs0 + j * xs1, C);
        if ((threadIdx.x & 31) == 0) y[r * N + n] = s;
    }
}

/* x [T, K|1, C] of any strides -> contiguous f32 */
__global__ void k_mmid_xcopy(kn_dview x, float *xc, int64_t n) {
    KN_GRID_LOOP(i, n) xc[i] = (float)kn_dget(x, kn_doff(x, i));
}

static kn_status cu_mul_mat_id(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *w = &e->src[1], *ids = &e->src[2], *y = &e->dst;
    int64_t T = y->ne[0], K = y->ne[1], N = y->ne[2], E = w->ne[0], C = w->ne[2], R = T * K;
    if (!R || !N) return KN_OK;
    bool x3 = x->ndim == 3;
    int64_t xs0 = x->st[0], xs1 = x3 && x->ne[1] != 1 ? x->st[1] : 0;
    const kn_dtype_info *wi = kn_dtype_get(w->dtype);
    if (x->dtype != KN_F32 || y->dtype != KN_F32)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: mul_mat_id takes f32 x (f64 runs on the reference backend)");
    if (!kn_tview_is_contiguous(y) || w->st[2] != 1 || w->st[1] != C || w->st[0] != N * C)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: mul_mat_id takes a contiguous W [E, N, C] and y "
                            "(make them contiguous first)");
    const float *X = (const float *)x->data;
    float *xc = NULL;                      /* x strided along C (a transposed view): a contiguous copy first */
    if (x->st[x->ndim - 1] != 1 && C > 1) {
        int64_t nx = kn_tview_numel(x);
        kn_status st = kn_cu_tmp(sizeof(float) * (size_t)nx, (void **)&xc);
        if (st) return st;
        k_mmid_xcopy<<<kn_blocks(nx), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(x), xc, nx);
        X = xc;
        xs0 = x3 ? x->ne[1] * C : C;
        xs1 = x3 && x->ne[1] != 1 ? C : 0;
    }
    if (wi->is_quant && !kn_cuda_quant_supported((int)w->dtype))
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: mul_mat_id: %s blocks are not decoded on the GPU", wi->name);
    if (R > INT32_MAX || E > 1 << 20)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: mul_mat_id: %lld rows or %lld experts are too many",
                            (long long)R, (long long)E);
    int *scratch;
    kn_status st = kn_cu_tmp(sizeof(int) * (size_t)(E + 1 + R), (void **)&scratch);
    if (st) { kn_cu_tmp_free(xc); return st; }
    int *start = scratch, *order = scratch + E + 1;
    cudaStream_t s = kn_cu_stream();
    k_mmid_group<<<1, 1024, sizeof(int) * (size_t)(E + 1), s>>>(kn_dv(ids), T, K, E, start, order, kn_cu_err_dev(e->node->op));
    dim3 grid((unsigned)((N + 7) / 8), (unsigned)E);
    float *Y = (float *)y->data;
    const char *W = (const char *)w->data;
    size_t wr = kn_dtype_nbytes(w->dtype, C);
    switch (w->dtype) {
    case KN_F32: k_mmid<mmid_dot<KN_F32>><<<grid, 256, 0, s>>>(X, xs0, xs1, W, wr, N, C, K, start, order, Y); break;
    case KN_F16: k_mmid<mmid_dot<KN_F16>><<<grid, 256, 0, s>>>(X, xs0, xs1, W, wr, N, C, K, start, order, Y); break;
    case KN_BF16: k_mmid<mmid_dot<KN_BF16>><<<grid, 256, 0, s>>>(X, xs0, xs1, W, wr, N, C, K, start, order, Y); break;
#define QCASE(QT) case QT: k_mmid<mmid_qdot<QT>><<<grid, 256, 0, s>>>(X, xs0, xs1, W, wr, N, C, K, start, order, Y); break;
    KN_QUANT_GPU_TYPES(QCASE)
#undef QCASE
    default:
        kn_cu_tmp_free(scratch);
        kn_cu_tmp_free(xc);
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: mul_mat_id: W of dtype %s", wi->name);
    }
    kn_cu_tmp_free(scratch);
    kn_cu_tmp_free(xc);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

kn_status kn_cu_moe(const kn_exec *e) {
    return e->node->op == KN_OP_TOPK ? cu_topk(e) : cu_mul_mat_id(e);
}
