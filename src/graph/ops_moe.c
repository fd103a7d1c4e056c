/* ops_moe.c: the two ops a mixture-of-experts layer needs beyond the dense
 * ones: TOPK (which experts a token goes to) and MUL_MAT_ID (the experts'
 * matmuls, batched: one node per projection, not one matmul per token).
 *
 * Letters: T tokens, C model width, E experts, k experts per token, N an
 * expert's output width.
 *
 * TOPK records only the indices (i32); the values are a GATHER of x at
 * them, so the gradient to the values is gather's (a scatter-add into x at
 * the chosen places) and TOPK itself needs no rule: integers carry none.
 *
 * MUL_MAT_ID: y[t, j, :] = W[ids[t, j]] . x[t, j, :] (x [T, C] or
 * [T, 1, C] shares one row across the k slots). The backends read ids at
 * run time and group the (t, j) rows of each expert, so each expert's
 * weights are read once per call whatever T is.
 * Gradient (src/autograd/rules_nn.c): dx = mul_mat_id(dy, W^T, ids) (summed
 * over the slots where x is shared), dW[e] = sum over the rows routed to e
 * of dy_r^T x_r, built as a one-hot [T*k, E] spread of dy times x: memory
 * T*k*E*N, fine for tests and small models, not for training large MoEs
 * (which kiln does not do); ids get none. Quantized W: no gradient.
 */
#include "graph/graph.h"

static bool int_ids(kn_dtype dt) {
    const kn_dtype_info *d = kn_dtype_get(dt);
    return d->is_int && dt != KN_BOOL;
}

kn_tensor *kn_topk(kn_ctx *ctx, kn_tensor *x, int64_t k, bool largest, kn_tensor **indices) {
    if (indices) *indices = NULL;
    if (!x) return NULL;
    char a[160];
    const kn_dtype_info *xi = kn_dtype_get(x->dtype);
    if (!xi->is_float || xi->is_quant || x->ndim < 1)
        return kn__fail(ctx, KN_ERR_INVALID, "topk: x must be a float tensor with at least one dim, got %s %s",
                        kn_dtype_name(x->dtype), kn__shape_str(x, a, sizeof a));
    int last = x->ndim - 1;
    if (x->sym[last] || k < 1 || k > x->shape[last])
        return kn__fail(ctx, KN_ERR_INVALID, "topk: k = %lld must be in [1, %lld] (the last dim of x %s, which must be fixed)",
                        (long long)k, (long long)x->shape[last], kn__shape_str(x, a, sizeof a));
    int64_t shape[KN_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[last] = k;
    kn_tensor *idx = kn__node(ctx, KN_OP_TOPK, KN_I32, x->ndim, shape, x->sym, &x, 1);
    if (!idx) return NULL;
    idx->p.topk.largest = largest;
    idx->flags &= ~KN_FLAG_REQUIRES_GRAD;          /* integers: the gradient goes through the gather */
    if (indices) *indices = idx;
    return kn_gather(ctx, x, last, idx);
}

kn_tensor *kn_mul_mat_id(kn_ctx *ctx, kn_tensor *x, kn_tensor *W, kn_tensor *ids) {
    if (!x || !W || !ids) return NULL;
    char a[160], b[160], c[160];
    /* f64 (x and W both): the reference only, for gradient checks */
    if (x->dtype != KN_F32 && x->dtype != KN_F64)
        return kn__fail(ctx, KN_ERR_INVALID, "mul_mat_id: x must be f32 (or f64), got %s (cast it first)", kn_dtype_name(x->dtype));
    const kn_dtype_info *wi = kn_dtype_get(W->dtype);
    if (x->dtype == KN_F64 ? W->dtype != KN_F64
                           : !(wi->is_quant || W->dtype == KN_F32 || W->dtype == KN_F16 || W->dtype == KN_BF16))
        return kn__fail(ctx, KN_ERR_INVALID, "mul_mat_id: W must be f32, f16, bf16 or a GGUF block type (f64 with an f64 x), "
                        "got %s with a %s x", kn_dtype_name(W->dtype), kn_dtype_name(x->dtype));
    if (!int_ids(ids->dtype))
        return kn__fail(ctx, KN_ERR_INVALID, "mul_mat_id: ids must be integer expert ids (i8/i32/i64/u8), got %s",
                        kn_dtype_name(ids->dtype));
    bool ok = W->ndim == 3 && ids->ndim == 2 && (x->ndim == 2 || x->ndim == 3) && !W->sym[0] && !W->sym[1] && !W->sym[2] &&
              !ids->sym[1] && x->shape[0] == ids->shape[0] && x->sym[0] == ids->sym[0] &&
              x->shape[x->ndim - 1] == W->shape[2] && !x->sym[x->ndim - 1] &&
              (x->ndim == 2 || (!x->sym[1] && (x->shape[1] == 1 || x->shape[1] == ids->shape[1])));
    if (!ok)
        return kn__fail(ctx, KN_ERR_INVALID, "mul_mat_id: expects x [T, C] or [T, k or 1, C], W [E, N, C] and ids [T, k] "
                        "(fixed E, N, C, k); got x %s, W %s, ids %s", kn__shape_str(x, a, sizeof a),
                        kn__shape_str(W, b, sizeof b), kn__shape_str(ids, c, sizeof c));
    if (wi->is_quant && W->shape[2] % wi->block_size)
        return kn__fail(ctx, KN_ERR_INVALID, "mul_mat_id: a %s W needs C (%lld) to be a multiple of its block size %d",
                        wi->name, (long long)W->shape[2], (int)wi->block_size);
    kn_tensor *src[3] = {x, W, ids};
    int64_t shape[3] = {x->shape[0], ids->shape[1], W->shape[1]};
    int8_t sym[3] = {x->sym[0], 0, 0};
    return kn__node(ctx, KN_OP_MUL_MAT_ID, x->dtype, 3, shape, sym, src, 3);
}
