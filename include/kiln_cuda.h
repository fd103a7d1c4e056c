/* kiln_cuda.h: the CUDA backend (build with `make CUDA=1`).
 *
 *   kn_backend *gpu = kn_backend_cuda();          // NULL + kn_last_error() without a GPU
 *   kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){gpu});  // tensors of g live in device memory
 *   kn_tensor *w; kn_to_backend(g, host_w, &w);   // copy a host tensor's data over
 *
 * Every op kind runs on the GPU: generic strided kernels over any layout
 * and dtype (arithmetic in double, stored with the reference's rounding
 * rules), plus the hand-tuned kernels of src/backends/cuda/kn_cuda.h where
 * the layout allows (f32 GEMM, bf16/f16 GEMM on the tensor cores, also
 * with f32 activations times bf16/f16 weights, GEMV for decode rows,
 * softmax, layer/RMS norm, the fused Adam update, sdpa and its gradient).
 * Quantized (GGUF block) operands are not supported on the GPU: such nodes
 * fail with KN_ERR_UNSUPPORTED naming the op and dtype (kn_model_load
 * dequantizes weights for a GPU context, see kiln_llm.h weight_dtype).
 * Bad index values (gather, index_select/add/copy, scatter) and integer
 * division by zero are found on the device and reported by the kn_plan_run
 * (or kn_tensor_read) that ran them, at its end, naming the op; an
 * index_copy with a bad index writes nothing.
 *
 * Memory comes from a caching pool (cudaMalloc on a miss); running out of
 * device memory gives KN_ERR_NOMEM with the sizes. All work is issued on
 * one non-blocking stream owned by the backend; host copies go through
 * pinned staging buffers (kn_tensor_write returns once its data is queued,
 * kn_tensor_read once it has arrived); kn_plan_run synchronizes the stream
 * at its end. To move a whole module: kn_module_to_backend (kiln_nn.h).
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend on device 0 (initialised on first call; the same pointer
 * afterwards). NULL with a message (kn_last_error) when there is no usable
 * GPU or driver. Env KN_CUDA_POOL_MB caps the pool's cached+used bytes. */
kn_backend *kn_backend_cuda(void);

/* Copy t's elements (t is realized first) into a new materialised tensor
 * of dst_ctx with t's dtype and shape, contiguous; works between any two
 * backends (staged through host memory). *out is owned by dst_ctx. */
kn_status kn_to_backend(kn_ctx *dst_ctx, kn_tensor *t, kn_tensor **out);

/* Pool statistics of the CUDA backend (zeros when it is not initialised). */
void kn_cuda_backend_stats(size_t *in_use_bytes, size_t *peak_bytes, size_t *cached_bytes);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
