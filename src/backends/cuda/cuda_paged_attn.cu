/* cuda_paged_attn.cu: paged attention (KN_OP_PAGED_ATTN; include/kiln.h and
 * graph/ops_paged.c state the contract) on the GPU.
 *
 * One thread block per (query row i, query head h), PA_THREADS threads. The
 * row's visible positions are taken PA_THREADS at a time: each thread maps
 * its position to a pool row through the block table and forms one score
 * (q . k, q pre-scaled in shared memory); the tile's maximum and sum update
 * the running softmax (online: the accumulator is rescaled by
 * exp(m_old - m_new)); then each thread owns up to PA_DV_PER output
 * elements d and adds sum_t p_t V[row_t, d] over the tile. f32 math, K/V
 * pools f32 or f16 (read through kn_dld). An out-of-range sequence,
 * position or block id cannot be reported from the kernel: the row is NaN
 * (the engine never passes one; the CPU and reference backends report it).
 * Launch extents are host values (T from the run's symbols), so a captured
 * graph bakes T in: kn_cu_dynamic_syms reports nothing for this op.
 */
#include "backends/cuda/cuda_ops.cuh"

#define PA_THREADS 128
#define PA_DV_PER 4            /* Dv <= PA_THREADS * PA_DV_PER = 512 */

__global__ void k_paged_attn(kn_dview q, kn_dview k, kn_dview v, kn_dview bt, kn_dview rs, kn_dview rp, kn_dview y,
                             int64_t H, int64_t G, int64_t D, int64_t Dv, int64_t P, int64_t S, int64_t MB, int64_t bs,
                             int64_t win, float scale) {
    extern __shared__ float sh[];
    float *qs = sh, *ps = qs + D;                                   /* q [D], p [PA_THREADS] */
    __shared__ int64_t rows[PA_THREADS];
    __shared__ double red[32];
    __shared__ int bad;
    int64_t i = blockIdx.x / H, h = blockIdx.x % H, hk = h / G;
    int tid = threadIdx.x;
    int64_t seq = (int64_t)kn_dget(rs, i * rs.st[0]), pos = (int64_t)kn_dget(rp, i * rp.st[0]);
    if (tid == 0) bad = seq < 0 || seq >= S || pos < 0 || pos >= MB * bs;
    for (int64_t d = tid; d < D; d += PA_THREADS) qs[d] = (float)kn_dget(q, i * q.st[0] + h * q.st[1] + d * q.st[2]) * scale;
    __syncthreads();
    float acc[PA_DV_PER];
    for (int c = 0; c < PA_DV_PER; c++) acc[c] = 0;
    float m = -INFINITY, l = 0;
    int64_t j0 = win > 0 && pos + 1 > win ? pos + 1 - win : 0;
    for (int64_t base = j0; !bad && base <= pos; base += PA_THREADS) {
        int64_t j = base + tid;
        float s = -INFINITY;
        if (j <= pos) {
            int64_t blk = (int64_t)kn_dget(bt, seq * bt.st[0] + (j / bs) * bt.st[1]);
            if (blk < 0 || (blk + 1) * bs > P) { bad = 1; rows[tid] = 0; }
            else {
                int64_t r = blk * bs + j % bs;
                rows[tid] = r;
                float dot = 0;
                for (int64_t d = 0; d < D; d++) dot += qs[d] * (float)kn_dget(k, hk * k.st[0] + r * k.st[1] + d * k.st[2]);
                s = dot;
            }
        }
        float mt = (float)kn_dblock_max(s, red);
        float mnew = fmaxf(m, mt), alpha = __expf(m - mnew);        /* first tile: exp(-inf) = 0 */
        float p = j <= pos ? __expf(s - mnew) : 0.0f;
        ps[tid] = p;
        float sum = (float)kn_dblock_sum(p, red);
        __syncthreads();
        l = l * alpha + sum;
        int64_t n = pos - base + 1 < PA_THREADS ? pos - base + 1 : PA_THREADS;
        for (int c = 0; c < PA_DV_PER; c++) {
            int64_t d = tid + (int64_t)c * PA_THREADS;
            if (d >= Dv) break;
            float a = 0;
            for (int64_t t = 0; t < n; t++) a += ps[t] * (float)kn_dget(v, hk * v.st[0] + rows[t] * v.st[1] + d * v.st[2]);
            acc[c] = acc[c] * alpha + a;
        }
        m = mnew;
        __syncthreads();
    }
    float inv = bad ? __int_as_float(0x7fc00000) : 1.0f / l;
    for (int c = 0; c < PA_DV_PER; c++) {
        int64_t d = tid + (int64_t)c * PA_THREADS;
        if (d >= Dv) break;
        kn_dput(y, i * y.st[0] + h * y.st[1] + d * y.st[2], acc[c] * inv);
    }
}

kn_status kn_cu_paged_attn(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *bt = &e->src[3], *y = &e->dst;
    int64_t T = q->ne[0], H = q->ne[1], D = q->ne[2], Hkv = k->ne[0], Dv = v->ne[2];
    if (T == 0 || H == 0) return KN_OK;
    KN_CUDA_REQUIRE(Hkv > 0 && H % Hkv == 0, "paged_attn: %lld query heads over %lld key/value heads", (long long)H, (long long)Hkv);
    if (Dv > PA_THREADS * PA_DV_PER || D > 4096)
        return kn_set_error(KN_ERR_UNSUPPORTED, "paged_attn: the cuda kernel takes head dims up to %d (got D %lld, Dv %lld)",
                            PA_THREADS * PA_DV_PER, (long long)D, (long long)Dv);
    if (T * H > 0x7fffffffLL) return kn_set_error(KN_ERR_UNSUPPORTED, "paged_attn: %lld rows x heads is too many for one launch", (long long)(T * H));
    size_t smem = sizeof(float) * (size_t)(D + PA_THREADS);
    k_paged_attn<<<(unsigned)(T * H), PA_THREADS, smem, kn_cu_stream()>>>(
        kn_dv(q), kn_dv(k), kn_dv(v), kn_dv(bt), kn_dv(&e->src[4]), kn_dv(&e->src[5]), kn_dv(y), H, H / Hkv, D, Dv, k->ne[1],
        bt->ne[0], bt->ne[1], t->p.paged.block_size, t->p.paged.window, (float)t->p.paged.scale);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
