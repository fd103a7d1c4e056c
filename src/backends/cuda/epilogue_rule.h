/* epilogue_rule.h: which matmul epilogues and prologues the CUDA backend
 * takes (its epilogue_ok, kn_cu_epilogue_ok in cuda_ops_epilogue.cu), in
 * plain C, so that the CPU backend posing as a CUDA device (the offline
 * plan printers, dev/cuda/fake_cuda.h; the test doubles of test_cuda_llm)
 * decides as the backend does on a machine without a GPU. Internal: not
 * installed. docs/COMPILER.md, "Matmul epilogues" and "Matmul prologues". */
#pragma once
#include "kiln_backend.h"               // defines: kn_epilogue
#include "core/env.h"                   // defines: kn_env_get (KN_EPILOGUE)
#include "backends/cuda/tune.cuh"       // defines: kn_cuda_tune (plain C)
#include <math.h>
#include <stdbool.h>

static inline bool kn_cu_float_dt(kn_dtype t) { return t == KN_F32 || t == KN_F16 || t == KN_BF16 || t == KN_F64; }

/* Decode rows (a [1, N] product, the row count fixed at 1) take epilogues
 * and prologues in the GEMV kernels; KN_EPILOGUE=1 offers every product. */
static inline bool kn_cu_epilogue_rule(const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    bool row = mm->ndim == 2 && mm->shape[0] == 1 && mm->sym[0] == 0;
    if (kn_env_get()->epilogue != 1 && !row) return false;
    if (epi->pre != KN_OP_NONE &&
        (!row || epi->dt != KN_F32 || (epi->pre != KN_OP_RMS_NORM && epi->pre != KN_OP_SILU) ||
         (epi->vpre.ndim && epi->vpre.dtype != KN_F32)))
        return false;
    /* A prologue redoes its work in each of the GEMV's N blocks, and each
     * block loads a second K-vector besides the activations (SwiGLU: g and
     * u, K silu evaluations; the RMS norm: its weight w, a sum of squares
     * from the same loads of x). On a GEMV bound by its weights' bytes,
     * past N * K = 2^pro_silu or 2^pro_norm (default 22 both), the
     * prologue's own kernel is cheaper. A Llama-3-8B down product is
     * 2^25.8: taken (pro_silu=30), its decode fell from 212 to 137 tok/s on
     * an H200. With the norm prologues and residual epilogues all taken on
     * that shape, decode ran 164 tok/s against 166 with none on an H100
     * (docs/PERF.md, session 28); the norm's bound follows SwiGLU's and is
     * not yet measured by itself. SmolLM2's products are 2^19.1-2^20.8
     * (its tied LM head 2^24.8). */
    static int silu_max = -1, norm_max = -1;
    if (silu_max < 0) { silu_max = kn_cuda_tune("pro_silu", 22); norm_max = kn_cuda_tune("pro_norm", 22); }
    const kn_tensor *a = mm->src[0];
    double nk = a && a->ndim >= 1 ? (double)mm->shape[1] * (double)a->shape[a->ndim - 1] : 0.0;
    if (epi->pre == KN_OP_SILU && nk > ldexp(1.0, silu_max)) return false;
    if (epi->pre == KN_OP_RMS_NORM && nk > ldexp(1.0, norm_max)) return false;
    return kn_cu_float_dt(epi->dt) && kn_cu_float_dt(out) && (!epi->bias || kn_cu_float_dt(epi->vbias.dtype)) &&
           (!epi->res || kn_cu_float_dt(epi->vres.dtype));
}
