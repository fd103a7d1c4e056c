/* quantize.h: weight quantizers with the semantics of ggml's reference
 * quantizers (quantize_row_*_ref in ggml-quants.c), for `kiln quantize` and
 * `kiln convert`.
 *
 * kn_quantize_row (quant.h) is the activation quantizer: plain
 * round-to-nearest, tuned for speed and for the 8-bit partners of the dots.
 * Weights are quantized once and read many times, so here every type follows
 * the algorithm llama.cpp's `llama-quantize` uses without an importance
 * matrix: Q4_0/Q5_0 scale the block's extremum to -8/-16 and truncate
 * x/d + 8.5 (16.5); Q4_1/Q5_1 map [min, max] onto 0..15 (31); Q8_0 rounds
 * half away from zero; Q4_K/Q5_K search 20/15 candidate scales per 32-element
 * sub-block for the least weighted squared error (weights |x| + rms of the
 * sub-block) with a min; Q6_K searches 19 scales per 16-element sub-block
 * weighted by x^2. The 32-element types give the same block bytes as the
 * `gguf` Python package's numpy quantizers (tests/test_quantize.c checks it);
 * the K types follow ggml's float arithmetic step by step (same operation
 * order, -ffp-contract=off as -std=c11 builds), so they match ggml built the
 * same way.
 *
 *   size_t nb = kn_dtype_nbytes(KN_Q4_K, n);          // n a multiple of 256
 *   void *q = malloc(nb);
 *   if (kn_quantize_weights(KN_Q4_K, x, q, n) != KN_OK) ... kn_last_error()
 *
 * Non-goals: importance matrices (imatrix), the IQ / Q2_K / Q3_K types.
 * Internal header (src/).
 */
#ifndef KN_QUANTIZE_H
#define KN_QUANTIZE_H
#include "kiln_base.h"

/* Quantize n floats (a multiple of t's block size, all finite) to t: F32,
 * F16, BF16 (round to nearest even), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 * Q5_K, Q6_K. KN_ERR_INVALID on a bad n, NULL or a non-finite value,
 * KN_ERR_UNSUPPORTED for another type. Thread-safe (no state). */
kn_status kn_quantize_weights(kn_dtype t, const float *src, void *dst, int64_t n);
/* True when kn_quantize_weights can write t. */
bool kn_quantize_weights_supported(kn_dtype t);
#endif
