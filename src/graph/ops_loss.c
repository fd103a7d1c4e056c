/* ops_loss.c: the fused classifier loss, CROSS_ENTROPY, and its gradient
 * node CROSS_ENTROPY_BWD (made by the rule in src/autograd/rules_nn.c).
 *
 * Letters: N rows (tokens), C classes (vocabulary), Cp = C rounded up to a
 * multiple of 8 elements.
 *
 * Why one node each: as a composite (cast to f32, log_softmax, gather,
 * masks) a GPT-2 step wrote and read [N, C] f32 probabilities several times
 * over (8192 x 50257: 1.6 GB each). The forward node reads the logits once
 * as stored (bf16 stays bf16) and keeps only the row's max and sum; the
 * gradient node recomputes them (one online pass) and writes dlogits once.
 *
 * Why Cp: dlogits feeds the two gradient matmuls of the classifier, and the
 * GPU's tensor-core GEMMs want 16-byte aligned rows (ld % 8 == 0 for 2-byte
 * elements); with C = 50257 they fell back to a kernel 4-5x slower. The
 * gradient node's storage is [N, Cp] (the pad columns written as 0) and the
 * gradient is the narrowed view [N, C] of it, so each row starts aligned.
 *
 * Non-goals: class dim other than the last (kn_cross_entropy moves nothing:
 * it reshapes [..., C] to [N, C]); per-class weights; a second derivative.
 */
#include "graph/graph.h"

static bool int_ids(kn_dtype dt) {
    const kn_dtype_info *d = kn_dtype_get(dt);
    return !d->is_float && !d->is_quant && dt != KN_BOOL;
}

kn_tensor *kn_cross_entropy_rows(kn_ctx *ctx, kn_tensor *logits, kn_tensor *targets, int64_t ignore_index,
                                 double label_smoothing) {
    if (!logits || !targets) return NULL;
    char a[160], b[160];
    const kn_dtype_info *li = kn_dtype_get(logits->dtype);
    if (!li->is_float || li->is_quant)
        return kn__fail(ctx, KN_ERR_INVALID, "cross_entropy: logits must be f32, f16, bf16 or f64, got %s (cast them first)",
                        kn_dtype_name(logits->dtype));
    if (!int_ids(targets->dtype))
        return kn__fail(ctx, KN_ERR_INVALID, "cross_entropy: targets must be integer class ids, got %s", kn_dtype_name(targets->dtype));
    if (logits->ndim != 2 || targets->ndim != 1 || logits->shape[0] != targets->shape[0] || logits->sym[0] != targets->sym[0] ||
        logits->sym[1] || logits->shape[1] < 1)
        return kn__fail(ctx, KN_ERR_INVALID,
                        "cross_entropy: expects logits [N,C] (C >= 1, fixed) and targets [N]; got logits %s, targets %s "
                        "(kn_cross_entropy takes [..., C] and reshapes)",
                        kn__shape_str(logits, a, sizeof a), kn__shape_str(targets, b, sizeof b));
    if (!(label_smoothing >= 0 && label_smoothing < 1))
        return kn__fail(ctx, KN_ERR_INVALID, "cross_entropy: label_smoothing %g must be in [0, 1)", label_smoothing);
    kn_tensor *src[2] = {logits, targets};
    kn_dtype dt = logits->dtype == KN_F64 ? KN_F64 : KN_F32;
    kn_tensor *t = kn__node(ctx, KN_OP_CROSS_ENTROPY, dt, 1, logits->shape, logits->sym, src, 2);
    if (t) { t->p.ce.ignore_index = ignore_index; t->p.ce.smoothing = label_smoothing; }
    return t;
}

/* The gradient of sum_i g[i] * loss[i] w.r.t. the logits of the forward node t,
 * with p = softmax(logits[i]) and ls the label smoothing:
 *   dlogits[i, j] = g[i] * (p_j - (1 - ls) [j == t_i] - ls / C),  0 for ignored rows,
 * in the logits' dtype. Returns the view [N, C] of the node's [N, Cp] storage. */
kn_tensor *kn__cross_entropy_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g) {
    if (!t || !g) return NULL;
    kn_tensor *logits = t->src[0], *targets = t->src[1];
    char a[160], b[160];
    if (g->ndim != 1 || g->shape[0] != logits->shape[0] || !kn_dtype_get(g->dtype)->is_float)
        return kn__fail(ctx, KN_ERR_INVALID, "cross_entropy_bwd: the output gradient must be float [N] for logits %s, got %s %s",
                        kn__shape_str(logits, a, sizeof a), kn_dtype_name(g->dtype), kn__shape_str(g, b, sizeof b));
    int64_t N = logits->shape[0], C = logits->shape[1], Cp = (C + 7) / 8 * 8;
    kn_tensor *src[3] = {logits, targets, g};
    kn_tensor *d = kn__node(ctx, KN_OP_CROSS_ENTROPY_BWD, logits->dtype, 2, (int64_t[]){N, Cp}, logits->sym, src, 3);
    if (!d) return NULL;
    d->p.ce = t->p.ce;
    return Cp == C ? d : kn_narrow(ctx, d, 1, 0, C);
}
