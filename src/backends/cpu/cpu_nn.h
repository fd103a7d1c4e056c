/* cpu_nn.h: fast CPU kernels of the nn and index ops.
 *
 * kn_cpu_nn_fast() computes one node when its operands are f32 in a layout
 * that a fast path handles and returns true; otherwise (other dtypes, layouts,
 * out-of-range indices, aliasing it cannot prove safe) it returns false
 * without an error and the caller runs the reference kernel, which also
 * produces the error message for bad run-time input.
 *
 * Ops and the layouts they need (every fast path is threaded over rows,
 * heads or images with the CPU pool above ~32K elements of work):
 *   RMS_NORM, LAYER_NORM   trailing n_norm dims contiguous in x and y (any
 *                          strides outside), weight/bias f32 contiguous
 *   SOFTMAX, LOG_SOFTMAX   the dims after `dim` contiguous in x and y
 *   ROPE                   unit stride along D in x and y; outer dims any
 *   SDPA                   unit stride along D in q, k, v, y; GQA, causal
 *   INDEX_SELECT           dims after `dim` contiguous; also Q* sources
 *                          (dim 0 of a matrix: rows copied or dequantized)
 *   INDEX_COPY             dims after `dim` contiguous, src not overlapping dst
 *   INDEX_ADD              dims after `dim` contiguous
 *   COPY                   f32/i32 same dtype, any strides (blocked transpose)
 *   CONV2D, CONV_TRANSPOSE2D, CONV2D_BWD_W   im2col/col2im + kn_sgemm
 *   MAX_POOL2D, MAX_POOL2D_BWD               any strides
 *
 *   // in a backend's compute:
 *   if (kn_cpu_nn_fast(e)) return KN_OK;
 *   return kn__ref_compute(be, e);
 */
#ifndef KN_CPU_NN_H
#define KN_CPU_NN_H
#include <stdbool.h>
#include "kiln_backend.h"

bool kn_cpu_nn_fast(const kn_exec *e);

/* Tests and benches: force the SIMD path of the attention kernels
 * (KN_ISA_* from core/cpu.h, capped at what the CPU allows); -1 = automatic. */
void kn_cpu_nn_force_isa(int isa);
#endif
