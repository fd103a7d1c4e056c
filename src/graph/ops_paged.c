/* ops_paged.c: paged attention (KN_OP_PAGED_ATTN), the attention of the
 * batched LLM engine (src/llm/batch*.c): T query rows of several sequences,
 * each attending to its own sequence's K/V rows, which live in fixed-size
 * blocks of one shared pool per layer (include/kiln.h states the contract).
 *
 * Sources: q [T, H, D], k_pool [Hkv, P, D], v_pool [Hkv, P, Dv],
 * block_table [S, MB] i32, row_seq [T] i32, row_pos [T] i32. The indices
 * are data: out-of-range values are found by the kernels when the plan runs.
 * Inference only: autograd has no rule for it (kn_backward refuses the op).
 */
#include "graph/graph.h"
#include <math.h>

static bool is_i32_vec(const kn_tensor *t, const kn_tensor *q) {
    return t->dtype == KN_I32 && t->ndim == 1 && t->shape[0] == q->shape[0] && t->sym[0] == q->sym[0];
}

kn_tensor *kn_paged_attn(kn_ctx *ctx, kn_tensor *q, kn_tensor *k_pool, kn_tensor *v_pool, kn_tensor *block_table,
                         kn_tensor *row_seq, kn_tensor *row_pos, int block_size, int window, double scale) {
    if (!q || !k_pool || !v_pool || !block_table || !row_seq || !row_pos) return NULL;
    char s1[160], s2[160], s3[160];
    const kn_tensor *kp = k_pool, *vp = v_pool;
    bool fq = kn_dtype_get(q->dtype)->is_float && !kn_dtype_get(q->dtype)->is_quant;
    bool fkv = (kp->dtype == KN_F32 || kp->dtype == KN_F16) && vp->dtype == kp->dtype;
    if (!fq || !fkv)
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: q must be float and the K/V pools both f32 or both f16; got q %s, "
                        "k_pool %s, v_pool %s", kn_dtype_name(q->dtype), kn_dtype_name(kp->dtype), kn_dtype_name(vp->dtype));
    bool ok = q->ndim == 3 && kp->ndim == 3 && vp->ndim == 3 && kp->shape[0] == vp->shape[0] && kp->shape[1] == vp->shape[1] &&
              q->shape[2] == kp->shape[2] && !q->sym[1] && !q->sym[2] && !kp->sym[0] && !kp->sym[1] && !kp->sym[2] &&
              !vp->sym[0] && !vp->sym[1] && !vp->sym[2];
    if (!ok)
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: expects q [T,H,D], k_pool [Hkv,P,D], v_pool [Hkv,P,Dv] (only T may be "
                        "symbolic); got q %s, k_pool %s, v_pool %s", kn__shape_str(q, s1, sizeof s1),
                        kn__shape_str(kp, s2, sizeof s2), kn__shape_str(vp, s3, sizeof s3));
    if (kp->shape[0] < 1 || q->shape[1] % kp->shape[0])
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: the %lld query heads must be a multiple of the %lld key/value heads",
                        (long long)q->shape[1], (long long)kp->shape[0]);
    if (block_size < 1 || kp->shape[1] % block_size)
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: block_size = %d must be >= 1 and divide the pool's %lld rows",
                        block_size, (long long)kp->shape[1]);
    if (block_table->dtype != KN_I32 || block_table->ndim != 2 || block_table->sym[0] || block_table->sym[1])
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: block_table must be a fixed-size i32 [S, MB] tensor, got %s %s",
                        kn_dtype_name(block_table->dtype), kn__shape_str(block_table, s1, sizeof s1));
    if (!is_i32_vec(row_seq, q) || !is_i32_vec(row_pos, q))
        return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: row_seq and row_pos must be i32 [T] with q's T (q %s); got %s %s, %s %s",
                        kn__shape_str(q, s1, sizeof s1), kn_dtype_name(row_seq->dtype), kn__shape_str(row_seq, s2, sizeof s2),
                        kn_dtype_name(row_pos->dtype), kn__shape_str(row_pos, s3, sizeof s3));
    if (window < 0) return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: window = %d must be >= 0 (0: no sliding window)", window);
    if (!(scale >= 0) || isinf(scale)) return kn__fail(ctx, KN_ERR_INVALID, "paged_attn: scale = %g must be finite and >= 0 (0 means 1/sqrt(D))", scale);
    if (scale == 0) scale = q->shape[2] > 0 ? 1.0 / sqrt((double)q->shape[2]) : 1.0;
    int64_t shape[3] = {q->shape[0], q->shape[1], vp->shape[2]};
    int8_t sym[3] = {q->sym[0], 0, 0};
    kn_tensor *src[6] = {q, k_pool, v_pool, block_table, row_seq, row_pos};
    kn_tensor *t = kn__node(ctx, KN_OP_PAGED_ATTN, KN_F32, 3, shape, sym, src, 6);
    if (t) { t->p.paged.scale = scale; t->p.paged.block_size = block_size; t->p.paged.window = window; }
    return t;
}
