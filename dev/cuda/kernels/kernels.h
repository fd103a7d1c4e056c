/* kernels.h: tuned CUDA kernels that no backend node calls yet.
 *
 * They live here, outside src/, until a node uses them (issue "GPU at the
 * limit" wires in cross-entropy, top-k/top-p sampling, embedding and RoPE;
 * adamw.cu is a different recipe from the backend's fused Adam in
 * src/backends/cuda/cuda_ops_optim.cu). dev/cuda/bench.cu tests each against
 * a CPU float64 reference and times it; scripts/cuda_run.sh builds them.
 * Moving one back: git mv it to src/backends/cuda/, its declaration to
 * kn_cuda.h, and call it from a node with a test in tests/test_cuda_ops.c.
 */
#ifndef KN_DEV_CUDA_KERNELS_H
#define KN_DEV_CUDA_KERNELS_H
#include "backends/cuda/kn_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fused softmax cross-entropy (forward + backward in one pass) -------------
 * logits[B,V]; targets[B] in [0,V) or -1 (ignored: loss 0, grad 0).
 * losses[B] = logsumexp(logits[b]) - logits[b, t];
 * dlogits[b,:] = dloss * (softmax(logits[b]) - onehot(t)) (NULL to skip);
 * dlogits may equal logits (in place). */
kn_status kn_cuda_crossentropy_fwd_bwd(float *losses, float *dlogits, const float *logits,
                                       const int32_t *targets, int64_t B, int64_t V,
                                       float dloss, void *stream);

/* ---- AdamW (fused, in place) ---------------------------------------------------
 * step t >= 1 (bias correction); decoupled weight decay:
 * p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). */
kn_status kn_cuda_adamw(float *params, float *m, float *v, const float *grads, int64_t n,
                        float lr, float beta1, float beta2, float eps, float weight_decay,
                        int t, void *stream);

/* ---- RoPE ------------------------------------------------------------------------
 * x, y: [n_tok, n_head, head_dim]; pos[n_tok] (int32 positions).
 * Pair i of a head rotates by angle pos * theta^(-2i/head_dim); pairs are
 * (2i, 2i+1) (llama/"normal") or, with neox, (i, i + head_dim/2).
 * inverse rotates by -angle (the backward pass). y may equal x. */
kn_status kn_cuda_rope_f32(float *y, const float *x, const int32_t *pos, int64_t n_tok,
                           int n_head, int head_dim, float theta, bool neox, bool inverse,
                           void *stream);

/* ---- embedding -------------------------------------------------------------------
 * out[i,:] = table[ids[i], :]  (ids outside [0,V) give a zero row).
 * backward: dtable[ids[i], :] += dout[i, :] (atomic; ids outside [0,V) skipped). */
kn_status kn_cuda_embedding_fwd(float *out, const float *table, const int32_t *ids,
                                int64_t n, int64_t V, int64_t C, void *stream);
kn_status kn_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
                                int64_t n, int64_t V, int64_t C, void *stream);

/* ---- top-k / top-p over a vocabulary row ----------------------------------------
 * For each of `rows` rows of x[rows, V]: the k largest values and their indices,
 * sorted descending (ties: any order), 1 <= k <= 1024. Radix select on the
 * float bits; NaN inputs are not supported. */
kn_status kn_cuda_topk_f32(float *vals, int32_t *idx, const float *x, int64_t rows, int64_t V,
                           int k, void *stream);
/* Nucleus: for logits x[rows,V] and temperature 1, n_keep[r] = size of the
 * smallest set of largest-probability tokens whose mass reaches p (0<p<=1), and
 * thresh[r] = the smallest logit kept (tokens with logit >= thresh are kept;
 * ties at the threshold are all kept). */
kn_status kn_cuda_topp_f32(int32_t *n_keep, float *thresh, const float *x, int64_t rows,
                           int64_t V, float p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
