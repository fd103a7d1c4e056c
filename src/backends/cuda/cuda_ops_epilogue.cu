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
 */
#include "backends/cuda/cuda_ops.cuh"
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

static bool float_dt(kn_dtype t) { return t == KN_F32 || t == KN_F16 || t == KN_BF16 || t == KN_F64; }

bool kn_cu_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be; (void)mm;
    return float_dt(epi->dt) && float_dt(out) && (!epi->bias || float_dt(epi->vbias.dtype)) &&
           (!epi->res || float_dt(epi->vres.dtype));
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
        m.dst.data = tmp;
        m.dst.dtype = p->dt;
        int64_t s = 1;
        for (int i = m.dst.ndim - 1; i >= 0; i--) { m.dst.st[i] = s; s *= m.dst.ne[i]; }
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
    int done = 0;
    kn_status st = kn_cu_matmul_gemv_epi(&m, &ge, &done);
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
    return st;
}
