/* cuda_ops_epilogue.cu: the CUDA backend's matmul epilogues (kn_epilogue,
 * include/kiln_backend.h; docs/COMPILER.md "Matmul epilogues").
 *
 * The product runs on the kernel kn_cu_matmul would pick (into dst, or into
 * a pool scratch of the matmul's dtype when the epilogue ends in a cast).
 * In-kernel: the GEMV kernels (decode: one f32 row, f32/bf16/f16 W) do
 * bias, activation and residual in their store (gemv.cu, kn_cuda_gemv_epi;
 * f32 bias and residual with unit stride; the v1 kernels: the bias only).
 * Every other step (and the cast) runs in k_epilogue, one
 * elementwise pass over dst after the product, with the arithmetic of the
 * unfused nodes' kernels (the op table's scalar functions in double, each
 * step rounded to the matmul's dtype, the cast last), so a fused plan gives
 * the unfused plan's bits. Not in-kernel (yet): the SGEMM store, the wgmma
 * kernel's f32-bias + tanh-GELU epilogue (it does not round between steps,
 * so it would not match the unfused graph).
 *
 * Prologues (kn_epilogue.pre: the left operand is an RMS norm or a gated
 * unit of x): the GEMV kernels compute the row as they read it
 * (gemv_pre.cuh); any other product gets A from k_prologue first, into a
 * pool scratch. Taken only on one fixed activation row (a decode step),
 * where it saves the launch of the norm's or SwiGLU's kernel.
 *
 * Which ones are offered (KN_EPILOGUE unset): only those of decode rows
 * (a [1, N] product, M fixed at 1), where the GEMV does them in its kernel;
 * elsewhere the fused elementwise kernels do as well or better
 * (docs/COMPILER.md). KN_EPILOGUE=1: every one.
 */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/gemv_pre.cuh"   // defines: gx_silu1, gx_norm_scale
#include "backends/cuda/epilogue_rule.h"   // defines: kn_cu_epilogue_rule
#include "graph/scalar_ops.h"   // defines: kn_scalar_unary, kn_scalar_binary
#include <string.h>

/* v as dtype dt holds it (RNE), back in double */
__device__ __forceinline__ double ep_round(int dt, double v) {
    if (dt == KN_F64) return v;
    double slot;
    kn_dst(dt, (char *)&slot, 0, v);
    return kn_dld(dt, (const char *)&slot, 0);
}

/* d[i] = cast(res[i] + act(mm[i] + bias[i % N])): d, mm, res over d's extents */
__global__ void k_epilogue(kn_dview d, kn_dview mm, kn_dview bias, kn_dview res, int64_t n, int64_t N, int dt,
                           int has_bias, int act, int has_res) {
    KN_GRID_LOOP(i, n) {
        double v = kn_dget(mm, kn_doff(mm, i));
        if (has_bias) v = ep_round(dt, kn_scalar_binary(KN_OP_ADD, v, kn_dget(bias, (i % N) * bias.st[0])));
        if (act) v = ep_round(dt, kn_scalar_unary(act, v, 0, 0));
        if (has_res) v = ep_round(dt, kn_scalar_binary(KN_OP_ADD, kn_dget(res, kn_doff(res, i)), v));
        kn_dput(d, kn_doff(d, i), v);
    }
}

/* a[r, :] = the prologue's A of row r (one block a row): rms_norm(x) * w or
 * silu(x) * u, with the GEMV loaders' float arithmetic */
__global__ void k_prologue(float *a, kn_dview x, kn_dview p, int64_t rows, int64_t K, int pre, int has_w, float eps) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float s = 1.f;
        if (pre == KN_OP_RMS_NORM) {
            float ss = 0.f;
            for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
                float v = (float)kn_dget(x, kn_doff(x, r * K + j));
                ss += v * v;
            }
            s = gx_norm_scale(kn_block_sum(ss, sh), (int)K, eps);
        }
        for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
            float v = (float)kn_dget(x, kn_doff(x, r * K + j));
            if (pre == KN_OP_RMS_NORM) {
                v *= s;
                if (has_w) v *= (float)kn_dget(p, j * p.st[0]);
            } else {
                v = gx_silu1(v) * (float)kn_dget(p, kn_doff(p, r * K + j));
            }
            a[r * K + j] = v;
        }
    }
}

bool kn_cu_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be;
    return kn_cu_epilogue_rule(mm, epi, out);
}

/* e's prologue computed into a pool scratch *tmp: m->src[0] the f32 rows of A */
static kn_status prologue_first(const kn_exec *e, kn_exec *m, void **tmp) {
    const kn_epilogue *p = e->epi;
    const kn_tview *x = &e->src[0];
    int64_t n = kn_tview_numel(x), K = x->ndim ? x->ne[x->ndim - 1] : 1, rows = K ? n / K : 0;
    kn_status st = kn_cu_tmp(sizeof(float) * (size_t)(n ? n : 1), tmp);
    if (st) return st;
    if (rows > 0) {
        unsigned grid = (unsigned)(rows < 65535 ? rows : 65535);
        k_prologue<<<grid, 256, 0, kn_cu_stream()>>>((float *)*tmp, kn_dv(x), kn_dv(&p->vpre), rows, K, (int)p->pre,
                                                     p->pre_w, p->pre_eps);
        if (cudaGetLastError() != cudaSuccess) return kn_set_error(KN_ERR_BACKEND, "matmul prologue: launch failed");
    }
    kn_tview_dense(&m->src[0], *tmp, KN_F32);
    m->fixed &= ~1u;                    /* A is now the scratch k_prologue writes */
    return KN_OK;
}

kn_status kn_cu_matmul_epilogue(const kn_exec *e) {
    const kn_epilogue *p = e->epi;
    kn_exec m = *e;
    m.epi = NULL;
    int64_t n = kn_tview_numel(&e->dst);
    void *tmp = NULL;
    if (e->dst.dtype != p->dt) {        /* the cast: the product in the matmul's dtype first */
        kn_status st = kn_cu_tmp(kn_dtype_nbytes(p->dt, n ? n : 1), &tmp);
        if (st) return st;
        kn_tview_dense(&m.dst, tmp, p->dt);
    }
    /* what the GEMV (decode rows) can do in its store: f32 steps with an f32
     * contiguous bias and residual */
    bool f32v = p->dt == KN_F32;
    bool bias_ok = p->bias && f32v && p->vbias.dtype == KN_F32 && (p->vbias.st[0] == 1 || p->vbias.ne[0] == 1);
    int rl = p->vres.ndim - 1;
    bool res_ok = p->res && f32v && p->vres.dtype == KN_F32 && rl >= 0 && (p->vres.st[rl] == 1 || p->vres.ne[rl] == 1);
    kn_cu_gemv_epi ge = {bias_ok ? (const float *)p->vbias.data : NULL, 0, NULL};
    if (f32v && (!p->bias || bias_ok) && (!p->res || res_ok)) {    /* all of it, or the bias alone */
        ge.act = p->act == KN_OP_NONE ? 0 : (int)p->act;
        ge.res = p->res ? (const float *)p->vres.data : NULL;
    }
    if (p->pre != KN_OP_NONE) {
        ge.pre.kind = p->pre == KN_OP_RMS_NORM ? KN_GV_PRE_NORM : KN_GV_PRE_SILU;
        ge.pre.p = p->pre == KN_OP_SILU || p->pre_w ? (const float *)p->vpre.data : NULL;
        ge.pre.eps = p->pre_eps;
        /* the GEMV loaders read the vector as [K] contiguous */
        int pl = p->vpre.ndim - 1;
        if (ge.pre.p && pl >= 0 && p->vpre.st[pl] != 1 && p->vpre.ne[pl] != 1) ge.pre.kind = KN_GV_PRE_NONE;
        if (e->src[0].ndim && e->src[0].st[e->src[0].ndim - 1] != 1) ge.pre.kind = KN_GV_PRE_NONE;
    }
    int done = 0;
    kn_status st = p->pre != KN_OP_NONE && ge.pre.kind == KN_GV_PRE_NONE ? KN_ERR_UNSUPPORTED : kn_cu_matmul_gemv_epi(&m, &ge, &done);
    void *ptmp = NULL;
    if (st == KN_ERR_UNSUPPORTED && p->pre != KN_OP_NONE) {   /* A first, then the product as without a prologue */
        ge.pre.kind = KN_GV_PRE_NONE;
        st = prologue_first(e, &m, &ptmp);
        if (!st) st = kn_cu_matmul_gemv_epi(&m, &ge, &done);
    }
    bool bias_left = p->bias && done == 0, act_left = p->act != KN_OP_NONE && done < 2, res_left = p->res && done < 2;
    if (st == KN_OK && (bias_left || act_left || res_left || tmp) && n > 0) {
        kn_tview none;
        memset(&none, 0, sizeof none);
        int64_t N = e->dst.ndim ? e->dst.ne[e->dst.ndim - 1] : 1;
        k_epilogue<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(
            kn_dv(&e->dst), kn_dv(&m.dst), kn_dv(p->bias ? &p->vbias : &none), kn_dv(p->res ? &p->vres : &none), n, N,
            (int)p->dt, bias_left, act_left ? (int)p->act : 0, res_left);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "matmul epilogue: launch failed");
    }
    if (tmp) kn_cu_tmp_free(tmp);
    if (ptmp) kn_cu_tmp_free(ptmp);
    return st;
}
