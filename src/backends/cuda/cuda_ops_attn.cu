/* cuda_ops_attn.cu: sdpa's fused gradient (KN_OP_SDPA_BWD) on the GPU.
 *
 * The node (graph/ops_nn.c states the arithmetic) packs dq [B,Hq,Tq,D],
 * dk [B,Hkv,Tk,D] and dv [B,Hkv,Tk,Dv] one after the other in its output;
 * its sources are q, k, v, g = dL/dy [B,Hq,Tq,Dv] and y (the forward's
 * output, read by the flash kernels only).
 *
 * f32 with unit-stride rows: five batched SGEMMs over (b, kv head, group
 * member) and one warp-per-row kernel, a chunk of sequences at a time so the
 * two score-sized scratch buffers stay under ~512 MiB:
 *   S = scale Q K^T, dP = G V^T                  (GEMMs)
 *   P = softmax(S masked), dS = scale P (dP - rowsum(P dP))   (k_ds_rows_f32)
 *   dQ = dS K, dK = sum_g dS_g^T Q_g, dV = sum_g P_g^T G_g     (GEMMs)
 * 16-bit operands with head dim 64 or 128 take the flash kernels first
 * (flash_attn.cu). Anything else (other dtypes, strided head dims, a query
 * row with no key, a softcap) takes the generic pair of kernels, in double
 * like the reference. A sliding window narrows the keys of every path.
 */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/kn_cuda.h"

#define AOFF(v, a, b, c, d) ((a) * (v).st[0] + (b) * (v).st[1] + (c) * (v).st[2] + (d) * (v).st[3])

/* ---- generic: a block per query row, then a thread per dk/dv element ---- */
/* P and DS rows (double, [rows, Tk]) for the chunk's query rows r0.. */
__global__ void __launch_bounds__(KN_THREADS) k_sdpa_bwd_rows(kn_dview q, kn_dview k, kn_dview v, kn_dview g, kn_dview y,
                                                            int causal, double scale, int64_t window, double cap,
                                                            double *P, double *DS, int64_t r0, int64_t nrows) {
    __shared__ double sh[32];
    int64_t Hq = q.ne[1], Tq = q.ne[2], D = q.ne[3], Hkv = k.ne[1], Tk = k.ne[2], Dv = v.ne[3], G = Hq / Hkv;
    for (int64_t rr = blockIdx.x; rr < nrows; rr += gridDim.x) {
        int64_t row = r0 + rr, i = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq), hk = h / G;
        double *p = P + rr * Tk, *ds = DS + rr * Tk;
        int64_t n = Tk, lo = 0, pi = i + (Tk - Tq);   /* keys lo <= j < n (kn_sdpa_ex) */
        if (causal && pi + 1 < n) n = pi + 1;
        if (window > 0 && pi + 1 - window > 0) lo = pi + 1 - window;
        if (n <= lo) {                       /* no key: NaN dq, nothing to dk/dv */
            for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) p[j] = ds[j] = 0;
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) kn_dput(y, (row * D + d) * y.st[0], NAN);
            __syncthreads();
            continue;
        }
        double m = -INFINITY;
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
            double s = -INFINITY, dp = 0;
            if (j >= lo && j < n) {
                double a = 0, c = 0;
                for (int64_t d = 0; d < D; d++) a += kn_dget(q, AOFF(q, b, h, i, d)) * kn_dget(k, AOFF(k, b, hk, j, d));
                for (int64_t d = 0; d < Dv; d++) c += kn_dget(g, AOFF(g, b, h, i, d)) * kn_dget(v, AOFF(v, b, hk, j, d));
                s = cap > 0 ? cap * tanh(a * scale / cap) : a * scale; dp = c;
                if (s > m) m = s;
            }
            p[j] = s; ds[j] = dp;
        }
        m = kn_dblock_max(m, sh);
        double sum = 0;
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) { double e = j >= lo && j < n ? exp(p[j] - m) : 0; p[j] = e; sum += e; }
        sum = kn_dblock_sum(sum, sh);
        double di = 0;
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) { p[j] /= sum; di += p[j] * ds[j]; }
        di = kn_dblock_sum(di, sh);
        if (cap > 0)   /* ds gets the cap's derivative 1 - tanh^2; the capped score is log(p sum) + m */
            for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
                double t = p[j] > 0 ? (log(p[j] * sum) + m) / cap : 0;
                ds[j] = (ds[j] - di) * (1 - t * t) + di;
            }
        for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) ds[j] = scale * p[j] * (ds[j] - di);
        __syncthreads();
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            double acc = 0;
            for (int64_t j = lo; j < n; j++) acc += ds[j] * kn_dget(k, AOFF(k, b, hk, j, d));
            kn_dput(y, (row * D + d) * y.st[0], acc);
        }
        __syncthreads();
    }
}
/* dk, dv of the chunk's sequences b0 .. b0+nb from its P and DS rows */
__global__ void k_sdpa_bwd_kv(kn_dview q, kn_dview k, kn_dview v, kn_dview g, kn_dview y, const double *P,
                              const double *DS, int64_t b0, int64_t nb) {
    int64_t B = q.ne[0], Hq = q.ne[1], Tq = q.ne[2], D = q.ne[3], Hkv = k.ne[1], Tk = k.ne[2], Dv = v.ne[3];
    int64_t G = Hq / Hkv, W = D + Dv, nq = B * Hq * Tq * D, nk = B * Hkv * Tk * D;
    KN_GRID_LOOP(idx, nb * Hkv * Tk * W) {
        int64_t c = idx % W, j = (idx / W) % Tk, hk = (idx / (W * Tk)) % Hkv, bl = idx / (W * Tk * Hkv), b = b0 + bl;
        bool isk = c < D;
        int64_t d = isk ? c : c - D;
        const double *M = isk ? DS : P;
        double acc = 0;
        for (int64_t gi = 0; gi < G; gi++) {
            int64_t h = hk * G + gi;
            for (int64_t i = 0; i < Tq; i++) {
                double w = M[((bl * Hq + h) * Tq + i) * Tk + j];
                if (w != 0) acc += w * (isk ? kn_dget(q, AOFF(q, b, h, i, d)) : kn_dget(g, AOFF(g, b, h, i, d)));
            }
        }
        int64_t o = isk ? nq + ((b * Hkv + hk) * Tk + j) * D + d : nq + nk + ((b * Hkv + hk) * Tk + j) * Dv + d;
        kn_dput(y, o * y.st[0], acc);
    }
}

static kn_status sdpa_bwd_generic(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1];
    int64_t B = q->ne[0], per_seq_rows = q->ne[1] * q->ne[2], Tk = k->ne[2] ? k->ne[2] : 1;
    int64_t chunk = ((int64_t)1 << 24) / (per_seq_rows * Tk ? per_seq_rows * Tk : 1);   /* 2 x 128 MiB of doubles */
    if (chunk < 1) chunk = 1;
    if (chunk > B) chunk = B;
    double *P = NULL, *DS = NULL;
    kn_status st = kn_cu_tmp(sizeof(double) * (size_t)(chunk * per_seq_rows * Tk), (void **)&P);
    if (!st) st = kn_cu_tmp(sizeof(double) * (size_t)(chunk * per_seq_rows * Tk), (void **)&DS);
    kn_dview dq = kn_dv(q), dk = kn_dv(k), dvv = kn_dv(&e->src[2]), dg = kn_dv(&e->src[3]), dy = kn_dv(&e->dst);
    for (int64_t b0 = 0; b0 < B && !st; b0 += chunk) {
        int64_t nb = B - b0 < chunk ? B - b0 : chunk, rows = nb * per_seq_rows;
        unsigned blocks = rows > 65536 ? 65536u : (unsigned)rows;
        k_sdpa_bwd_rows<<<blocks, KN_THREADS, 0, kn_cu_stream()>>>(dq, dk, dvv, dg, dy, e->node->p.sdpa.causal, e->node->p.sdpa.scale,
                                                e->node->p.sdpa.window, e->node->p.sdpa.softcap, P, DS,
                                                b0 * per_seq_rows, rows);
        if (cudaGetLastError() != cudaSuccess) { st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: kernel launch failed"); break; }
        int64_t n = nb * k->ne[1] * k->ne[2] * (q->ne[3] + e->src[2].ne[3]);
        if (n > 0) k_sdpa_bwd_kv<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(dq, dk, dvv, dg, dy, P, DS, b0, nb);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: kernel launch failed");
    }
    kn_cu_tmp_free(P);
    kn_cu_tmp_free(DS);
    return st;
}

/* ---- f32: batched SGEMMs around one row kernel ---- */
/* s holds scale*QK^T rows, dp holds G V^T rows; afterwards s = P and dp = dS
 * (both zero past the visible keys). A warp per row. */
__global__ void k_ds_rows_f32(float *s, float *dp, int64_t rows, int64_t Tq, int64_t Tk, int causal, int64_t window,
                              float scale) {
    int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *sr = s + r * Tk, *dr = dp + r * Tk;
    int64_t lo = 0, lim = Tk, pi = r % Tq + (Tk - Tq);   /* keys lo <= j < lim (kn_sdpa_ex) */
    if (causal && pi + 1 < lim) lim = pi + 1;
    if (window > 0 && pi + 1 - window > 0) lo = pi + 1 - window;
    float m = -INFINITY;
    for (int64_t j = lo + lane; j < lim; j += 32) m = fmaxf(m, sr[j]);
    m = kn_warp_max(m);
    float sum = 0.f;
    for (int64_t j = lo + lane; j < lim; j += 32) { float p = expf(sr[j] - m); sr[j] = p; sum += p; }
    float inv = 1.f / kn_warp_sum(sum), di = 0.f;
    for (int64_t j = lo + lane; j < lim; j += 32) { float p = sr[j] * inv; sr[j] = p; di += p * dr[j]; }
    di = kn_warp_sum(di);
    for (int64_t j = lane; j < Tk; j += 32) {
        if (j >= lo && j < lim) dr[j] = scale * sr[j] * (dr[j] - di);
        else { sr[j] = 0.f; dr[j] = 0.f; }
    }
}

static bool rows_f32(const kn_tview *v) { return v->dtype == KN_F32 && v->ndim == 4 && (v->st[3] == 1 || v->ne[3] == 1); }

static kn_status sdpa_bwd_f32(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *g = &e->src[3], *y = &e->dst;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    bool causal = e->node->p.sdpa.causal;
    if (!rows_f32(q) || !rows_f32(k) || !rows_f32(v) || !rows_f32(g) || y->dtype != KN_F32 || y->st[0] != 1 ||
        kn_env_get()->cuda_generic || Tk == 0 || Tq == 0 || (causal && Tq > Tk) || Hq % Hkv || e->node->p.sdpa.softcap > 0)
        return KN_ERR_UNSUPPORTED;              /* a softcap: the generic kernels */
    int64_t ldq = Tq > 1 ? q->st[2] : D, ldg = Tq > 1 ? g->st[2] : Dv, ldk = Tk > 1 ? k->st[2] : D, ldv = Tk > 1 ? v->st[2] : Dv;
    if (ldq < D || ldk < D || ldv < Dv || ldg < Dv) return KN_ERR_UNSUPPORTED;
    int64_t G = Hq / Hkv, per_seq = Hq * Tq * Tk;
    int64_t chunk = ((int64_t)1 << 26) / (per_seq ? per_seq : 1);      /* 2 x 256 MiB of scores */
    if (chunk < 1) chunk = 1;
    if (chunk > B) chunk = B;
    float *s = NULL, *dp = NULL;
    kn_status st = kn_cu_tmp(sizeof(float) * (size_t)(chunk * per_seq), (void **)&s);
    if (!st) st = kn_cu_tmp(sizeof(float) * (size_t)(chunk * per_seq), (void **)&dp);
    float scale = (float)e->node->p.sdpa.scale;
    float *dq = (float *)y->data, *dk = dq + B * Hq * Tq * D, *dv = dk + B * Hkv * Tk * D;
    /* batches over (b, kv head, member g); query head hk*G + g */
    kn_cuda_gemm_batch qk = {3, {0, Hkv, G}, {q->st[0], G * q->st[1], q->st[1]}, {k->st[0], k->st[1], 0},
                             {per_seq, G * Tq * Tk, Tq * Tk}};
    kn_cuda_gemm_batch gv = {3, {0, Hkv, G}, {g->st[0], G * g->st[1], g->st[1]}, {v->st[0], v->st[1], 0},
                             {per_seq, G * Tq * Tk, Tq * Tk}};
    kn_cuda_gemm_batch dsk = {3, {0, Hkv, G}, {per_seq, G * Tq * Tk, Tq * Tk}, {k->st[0], k->st[1], 0},
                              {Hq * Tq * D, G * Tq * D, Tq * D}};
    /* over (b, kv head) for one member g: the group's terms accumulate (beta 1) */
    kn_cuda_gemm_batch dkq = {2, {0, Hkv}, {per_seq, G * Tq * Tk}, {q->st[0], G * q->st[1]}, {Hkv * Tk * D, Tk * D}};
    kn_cuda_gemm_batch dvg = {2, {0, Hkv}, {per_seq, G * Tq * Tk}, {g->st[0], G * g->st[1]}, {Hkv * Tk * Dv, Tk * Dv}};
    for (int64_t b0 = 0; b0 < B && !st; b0 += chunk) {
        int64_t nb = B - b0 < chunk ? B - b0 : chunk, rows = nb * Hq * Tq;
        qk.ne[0] = gv.ne[0] = dsk.ne[0] = dkq.ne[0] = dvg.ne[0] = nb;
        const float *qp = (const float *)q->data + b0 * q->st[0], *kp = (const float *)k->data + b0 * k->st[0];
        const float *vp = (const float *)v->data + b0 * v->st[0], *gp = (const float *)g->data + b0 * g->st[0];
        float *dqp = dq + b0 * Hq * Tq * D, *dkp = dk + b0 * Hkv * Tk * D, *dvp = dv + b0 * Hkv * Tk * Dv;
        st = kn_cuda_sgemm_batched(false, true, Tq, Tk, D, scale, qp, ldq, kp, ldk, 0.f, s, Tk, &qk, kn_cu_stream());
        if (!st) st = kn_cuda_sgemm_batched(false, true, Tq, Tk, Dv, 1.f, gp, ldg, vp, ldv, 0.f, dp, Tk, &gv, kn_cu_stream());
        if (!st) {
            k_ds_rows_f32<<<(unsigned)((rows + 7) / 8), 256, 0, kn_cu_stream()>>>(s, dp, rows, Tq, Tk, causal, e->node->p.sdpa.window, scale);
            if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: row kernel launch failed");
        }
        if (!st) st = kn_cuda_sgemm_batched(false, false, Tq, D, Tk, 1.f, dp, Tk, kp, ldk, 0.f, dqp, D, &dsk, kn_cu_stream());
        for (int64_t gi = 0; gi < G && !st; gi++) {
            float beta = gi ? 1.f : 0.f;
            st = kn_cuda_sgemm_batched(true, false, Tk, D, Tq, 1.f, dp + gi * Tq * Tk, Tk, qp + gi * q->st[1], ldq, beta,
                                       dkp, D, &dkq, kn_cu_stream());
            if (!st) st = kn_cuda_sgemm_batched(true, false, Tk, Dv, Tq, 1.f, s + gi * Tq * Tk, Tk, gp + gi * g->st[1], ldg,
                                                beta, dvp, Dv, &dvg, kn_cu_stream());
        }
    }
    kn_cu_tmp_free(s);
    kn_cu_tmp_free(dp);
    return st;
}

kn_status kn_cu_sdpa_bwd(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1];
    if (kn_tview_numel(&e->dst) == 0) return KN_OK;
    if (k->ne[1] == 0) return kn_set_error(KN_ERR_INVALID, "sdpa backward: key/value have 0 heads");
    if (q->ne[2] == 0 || k->ne[2] == 0) {        /* no query rows or no keys: every gradient is 0 (dq empty or NaN-free) */
        KN_CUDA_TRY(cudaMemsetAsync(e->dst.data, 0, (size_t)kn_tview_numel(&e->dst) * kn_dtype_get(e->dst.dtype)->type_size,
                                    kn_cu_stream()));
        if (q->ne[2] == 0 || k->ne[2] != 0) return KN_OK;
    }
    kn_status st = kn_cu_flash_bwd(e);             /* bf16/f16, D 64 or 128 (flash_attn.cu) */
    if (st == KN_ERR_UNSUPPORTED) st = sdpa_bwd_f32(e);
    if (st != KN_ERR_UNSUPPORTED) return st;
    return sdpa_bwd_generic(e);
}
