/* cuda_ops_quant.cu: MATMUL whose right operand is a GGUF-quantized weight
 * kept as stored (the LLM's y = x @ W^T with KN_WEIGHTS_FILE: W [N, K] in raw
 * blocks, b the transposed view [K, N] with strides {1, K}).
 *
 *   decode (M <= 8 f32 rows, the dense x @ W^T layout, one batch entry):
 *     kn_cuda_gemv_quant reads the blocks once, the bias (and for M = 1 the
 *     residual) of a matmul epilogue in its store;
 *   prefill (M > 8, same layout): W expanded to bf16 in pooled scratch
 *     (kn_cuda_dequant), then the f32-A x bf16-W tensor-core GEMM that the
 *     bf16 weights take (so prefill matches --gpu-dtype bf16's rounding);
 *   anything else (batched, other strides): the weight's storage span
 *     expanded to f32 with the same element strides, and the f32 dispatch of
 *     kn_cu_matmul_gemv_epi on that view (exact, not fast).
 * A type the GPU does not decode (Q2_K, Q3_K, Q8_1, Q8_K) is refused before
 * it gets here (cuda_backend.cu); model.c uploads such tensors as bf16.
 */
#include "backends/cuda/cuda_ops.cuh"
#include <string.h>

/* the quantized view's storage span in elements, whole blocks; -1: a negative stride */
static int64_t q_span(const kn_tview *v, int64_t bs) {
    int64_t span = 1;
    for (int i = 0; i < v->ndim; i++) {
        if (v->ne[i] == 0) return 0;
        if (v->st[i] < 0) return -1;
        span += (v->ne[i] - 1) * v->st[i];
    }
    return (span + bs - 1) / bs * bs;
}

static kn_status q_generic(const kn_exec *e, const kn_cu_gemv_epi *ge, int *done) {
    const kn_tview *b = &e->src[1];
    int64_t span = q_span(b, kn_dtype_get(b->dtype)->block_size);
    if (span < 0) return kn_set_error(KN_ERR_UNSUPPORTED, "cuda matmul: a %s operand with a negative stride", kn_dtype_name(b->dtype));
    void *tmp = NULL;
    kn_status st = kn_cu_tmp(sizeof(float) * (size_t)(span ? span : 1), &tmp);
    if (st) return st;
    st = kn_cuda_dequant((int)b->dtype, tmp, KN_F32, b->data, span, kn_cu_stream());
    if (!st) {
        kn_exec f = *e;
        f.src[1].data = tmp;
        f.src[1].dtype = KN_F32;
        f.fixed &= ~2u;                 /* tmp is written by the kernel just before */
        st = kn_cu_matmul_gemv_epi(&f, ge, done);
    }
    kn_cu_tmp_free(tmp);
    return st;
}

kn_status kn_cu_matmul_quant(const kn_exec *e, const kn_cu_gemv_epi *ge, int *done) {
    const kn_tview *d = &e->dst, *a = &e->src[0], *b = &e->src[1];
    if (done) *done = 0;
    if (!kn_cuda_quant_supported((int)b->dtype) || kn_dtype_get(a->dtype)->is_quant)
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda matmul: %s x %s is not supported on the GPU (quantized weights: "
                            "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K as the right operand)",
                            kn_dtype_name(a->dtype), kn_dtype_name(b->dtype));
    int nb = d->ndim - 2, an = a->ndim, bn = b->ndim;
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a->ne[an - 1], batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    if (batch * M * N == 0) return KN_OK;
    /* x [M, K] rows (unit column stride) @ W^T with W [N, K] dense rows, f32 out rows */
    int64_t lda = M == 1 ? K : a->st[an - 2], ldc = M == 1 ? N : d->st[nb];
    bool dense = batch == 1 && a->dtype == KN_F32 && d->dtype == KN_F32 && K > 0 &&
                 (a->st[an - 1] == 1 || K == 1) && lda >= K && (d->st[nb + 1] == 1 || N == 1) && ldc >= N &&
                 (b->st[bn - 2] == 1 || K == 1) && (b->st[bn - 1] == K || N == 1) &&
                 K % kn_dtype_get(b->dtype)->block_size == 0 && ((uintptr_t)b->data & 1) == 0 && !kn_env_get()->cuda_no_gemv;
    bool pre = ge && ge->pre.kind != KN_GV_PRE_NONE;
    if (dense && M <= 8 && (!pre || !ge->act)) {
        const float *bias = ge ? ge->bias : NULL, *res = ge && !ge->act && M == 1 ? ge->res : NULL;
        kn_status st = kn_cuda_gemv_quant((int)b->dtype, (float *)d->data, ldc, b->data, (const float *)a->data, lda, M, N, K,
                                          bias, res, pre ? &ge->pre : NULL, kn_cu_stream());
        if (st != KN_ERR_UNSUPPORTED) {
            if (!st && done) *done = res || (ge && !ge->act && !ge->res) ? 2 : bias ? 1 : 0;
            return st;
        }
    }
    if (pre) return KN_ERR_UNSUPPORTED;   /* the caller computes the prologue's A first */
    if (dense && kn_cuda_gemm_tc_available() && !kn_env_get()->cuda_no_tc) {
        void *wb = NULL;
        kn_status st = kn_cu_tmp(sizeof(uint16_t) * (size_t)(N * K), &wb);
        if (st) return st;
        st = kn_cuda_dequant((int)b->dtype, wb, KN_BF16, b->data, N * K, kn_cu_stream());
        if (!st)
            st = kn_cuda_gemm_tc_f32a(KN_BF16, true, M, N, K, 1.0f, (const float *)a->data, lda, wb, K, d->data, KN_F32, ldc,
                                      NULL, kn_cu_stream());
        kn_cu_tmp_free(wb);
        return st;
    }
    return q_generic(e, ge, done);
}
