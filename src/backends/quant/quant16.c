/* quant16.c: 16-bit activations ("Q16") for the quantized dot products: the
 * quantizer, the scalar dots (the oracle of quant16_avx2.c) and the choice of
 * activation precision for the CPU matmuls. Why Q16 is the default: quant.h.
 *
 * The scalar dot dequantizes the weights block by block (with quant.c's
 * dequantizers, the definition of every type) and multiplies by the integer
 * activation quants, one f32 sum per 32-element activation block, scaled by d.
 */
#include "backends/quant/quant.h"      /* defines: kn_block_q16, kn_dequantize_row, ... */
#include "core/env.h"
#include "core/cpu.h"       /* defines: KN_ISA_*                             */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* ---- mode ------------------------------------------------------------------ */

static int g_mode = -1, g_forced = -1;

kn_qact kn_quant_act_mode_parse(const char *act, const char *exact) {
    if (act && !strcmp(act, "q8")) return KN_QACT_Q8;
    if (act && !strcmp(act, "q16")) return KN_QACT_Q16;
    if ((act && !strcmp(act, "f32")) || (exact && *exact && strcmp(exact, "0"))) return KN_QACT_F32;
    return KN_QACT_AUTO;
}

kn_qact kn_quant_act_mode(void) {
    if (g_forced >= 0) return (kn_qact)g_forced;
    /* first call; benign race: every thread computes the same */
    if (g_mode < 0) {
        const char *act = kn_env_get()->qmm_act;
        if (act && *act && strcmp(act, "auto") && strcmp(act, "q8") && strcmp(act, "q16") && strcmp(act, "f32"))
            fprintf(stderr, "kiln: KN_QMM_ACT=%s is not one of auto, q8, q16, f32; using auto\n", act);
        g_mode = (int)kn_quant_act_mode_parse(act, kn_env_get()->qmm_exact ? "1" : NULL);
    }
    return (kn_qact)g_mode;
}
void kn_quant_force_act_mode(int mode) { g_forced = mode; }

kn_vec_dot_fn kn_quant_act_q16_dot(kn_dtype t) {
    kn_qact m = kn_quant_act_mode();
    bool k_type = kn_dtype_get(t) && kn_dtype_get(t)->block_size == 256;
    if (m == KN_QACT_Q16 || (m == KN_QACT_AUTO && !k_type)) return kn_quant_q16_dot(t);
    return NULL;
}

/* ---- quantization ----------------------------------------------------------- */

size_t kn_quant_q16_nbytes(int64_t n) { return (size_t)(n / KN_QK) * sizeof(kn_block_q16); }

kn_status kn_quantize_q16(const float *x, kn_block_q16 *y, int64_t n) {
    if (!x || !y || n < 0 || n % KN_QK)
        return kn_set_error(KN_ERR_INVALID, "kn_quantize_q16: need non-NULL rows and n (%lld) a "
                            "non-negative multiple of %d", (long long)n, KN_QK);
#ifdef KN_QUANT_X86
    if (kn_quant_isa() >= KN_ISA_AVX2 && kn_quant_q16_avx2(x, y, n / KN_QK)) return KN_OK;
#endif
    for (int64_t i = 0; i < n; i += KN_QK, y++) {
        float amax = 0;
        for (int j = 0; j < KN_QK; j++) {
            if (!isfinite(x[i + j]))
                return kn_set_error(KN_ERR_INVALID, "kn_quantize_q16: x[%lld] = %g is not finite",
                                    (long long)(i + j), (double)x[i + j]);
            float a = fabsf(x[i + j]);
            if (a > amax) amax = a;
        }
        float d = amax / 32767, id = d != 0 ? 1 / d : 0;
        int sum = 0;
        for (int j = 0; j < KN_QK; j++) {
            long q = lrintf(x[i + j] * id);
            q = q < -32767 ? -32767 : q > 32767 ? 32767 : q;
            y->qs[j] = (int16_t)q;
            sum += (int)q;
        }
        y->d = d;
        y->s = d * (float)sum;
    }
    return KN_OK;
}

/* ---- scalar dots ------------------------------------------------------------ */

/* dot = sum over activation blocks b of d_b * sum_j w[32b + j] * q_b[j], with
 * the weights dequantized one weight block at a time (at most 256 values). */
static float dot_generic(kn_dtype t, int64_t n, const void *vw, const void *va) {
    const kn_block_q16 *a = va;
    const char *w = vw;
    int64_t bs = kn_dtype_get(t)->block_size;
    size_t bb = kn_dtype_nbytes(t, bs);
    float wf[256];
    double acc = 0;
    for (int64_t i = 0; i < n; i += bs, w += bb) {
        kn_dequantize_row(t, w, wf, bs);
        for (int64_t k = 0; k < bs; k += KN_QK, a++) {
            float s = 0;
            for (int j = 0; j < KN_QK; j++) s += wf[k + j] * (float)a->qs[j];
            acc += (double)(a->d * s);
        }
    }
    return (float)acc;
}
#define DOT(T, name) static float name(int64_t n, const void *w, const void *a) { return dot_generic(T, n, w, a); }
DOT(KN_Q4_0, dot_q4_0) DOT(KN_Q4_1, dot_q4_1) DOT(KN_Q5_0, dot_q5_0) DOT(KN_Q5_1, dot_q5_1)
DOT(KN_Q8_0, dot_q8_0) DOT(KN_Q4_K, dot_q4_K) DOT(KN_Q5_K, dot_q5_K) DOT(KN_Q6_K, dot_q6_K)
#undef DOT

kn_vec_dot_fn kn_quant_q16_dot_scalar(kn_dtype t) {
    switch (t) {
    case KN_Q4_0: return dot_q4_0;
    case KN_Q4_1: return dot_q4_1;
    case KN_Q5_0: return dot_q5_0;
    case KN_Q5_1: return dot_q5_1;
    case KN_Q8_0: return dot_q8_0;
    case KN_Q4_K: return dot_q4_K;
    case KN_Q5_K: return dot_q5_K;
    case KN_Q6_K: return dot_q6_K;
    default: return NULL;
    }
}

kn_vec_dot_fn kn_quant_q16_dot(kn_dtype t) {
    int isa = kn_quant_isa();
    if (isa == KN_ISA_SCALAR) return kn_quant_q16_dot_scalar(t);
#ifdef KN_QUANT_X86
    return kn_quant_q16_avx2_dot(t);
#else
    return NULL;
#endif
}

kn_vec_dot4_fn kn_quant_q16_dot4(kn_dtype t) {
#ifdef KN_QUANT_X86
    if (kn_quant_isa() >= KN_ISA_AVX2) return kn_quant_q16_avx2_dot4(t);
#endif
    (void)t;
    return NULL;
}
