/* model_moe.c: the mixture-of-experts FFN (Mixtral, Qwen2-MoE, Qwen3-MoE,
 * OLMoE) and the loading of its weights from GGUF and Hugging Face files.
 *
 * Letters: T tokens, C model width, E experts, k experts a token uses
 * (n_expert_used), Fe an expert's hidden width, Fs the shared expert's.
 *
 * Per MoE layer, with h = ffn_norm(x) [T, C]:
 *   p   = softmax(h Wr^T)                 [T, E]  router probabilities (f32)
 *   w,i = topk(p, k)                      [T, k]  weights and expert ids
 *   w  /= sum(w)                                  (expert_norm: Mixtral, Qwen3-MoE)
 *   a   = silu(Wg[i] h) * (Wu[i] h)       [T, k, Fe]  MUL_MAT_ID: the rows of each
 *   d   = Wd[i] a                         [T, k, C]   expert in one product
 *   y   = sum_j w[:, j] d[:, j]           [T, C]
 *   y  += sigmoid(h gs) * Wds(silu(Wgs h) * (Wus h))  (Qwen2-MoE's shared expert)
 * as transformers computes it (softmax in f32, top-k of the probabilities).
 *
 * Files: GGUF (llama.cpp's layout) stores the experts stacked, ffn_gate_exps /
 * ffn_up_exps [E, Fe, C] and ffn_down_exps [E, C, Fe] (ne = {C, Fe, E} ...),
 * the router ffn_gate_inp [E, C], the shared expert ffn_{gate,up,down}_shexp
 * and its gate ffn_gate_inp_shexp [C]; keys ARCH.expert_count and
 * ARCH.expert_used_count. Mixtral is GGUF "llama" with these tensors.
 * Hugging Face checkpoints store one matrix per expert
 * (mlp.experts.N.{gate,up,down}_proj, Mixtral block_sparse_moe.experts.N.w1/w3/w2);
 * the loader copies them into one stacked matrix per projection, in the file's
 * dtype. Weights stay 2-D ([E*Fe, C], [E*C, Fe]) in kn__layer_w and are viewed
 * as 3-D here, so the device upload treats them as ordinary matrices.
 *
 * Non-goals: training (MUL_MAT_ID has no gradient), expert parallelism, the
 * router's jitter noise (training only), DeepSeek-style grouped routing.
 */
#include "graph/graph.h"
#include "llm/model_impl.h"     /* defines: struct kn_model, kn__layer_w, kn__model_wrap */
#include <stdio.h>
#include <string.h>

/* ---- the forward ------------------------------------------------------------------------ */
static kn_tensor *mm(kn_ctx *ctx, kn_tensor *x, kn_tensor *w) { return kn_matmul(ctx, x, kn_transpose(ctx, w, 0, 1)); }

/* 2-D [rows, cols] stacked matrix as [E, rows / E, cols] */
static kn_tensor *experts3(kn_ctx *ctx, kn_tensor *w, int64_t E) {
    return kn_reshape(ctx, w, 3, (int64_t[]){E, w->shape[0] / E, w->shape[1]});
}

kn_tensor *kn__moe_ffn(kn_model *m, const kn__layer_w *L, kn_tensor *h) {
    kn_ctx *ctx = m->ctx;
    const kn_model_config *c = &m->cfg;
    int64_t E = c->n_expert, K = c->n_expert_used;
    kn_tensor *p = kn_softmax(ctx, mm(ctx, h, L->gate_inp), 1);                     /* [T, E] */
    kn_tensor *ids, *w = kn_topk(ctx, p, K, true, &ids);                            /* [T, k] */
    if (c->expert_norm) w = kn_div(ctx, w, kn_sum(ctx, w, 1, (int[]){1}, true));
    kn_tensor *g = kn_mul_mat_id(ctx, h, experts3(ctx, L->gate_exps, E), ids);      /* [T, k, Fe] */
    kn_tensor *u = kn_mul_mat_id(ctx, h, experts3(ctx, L->up_exps, E), ids);
    kn_tensor *d = kn_mul_mat_id(ctx, kn_mul(ctx, kn_silu(ctx, g), u), experts3(ctx, L->down_exps, E), ids); /* [T, k, C] */
    kn_tensor *y = kn_sum(ctx, kn_mul(ctx, d, kn_unsqueeze(ctx, w, 2)), 1, (int[]){1}, false);            /* [T, C] */
    if (L->gate_shexp) {
        kn_tensor *s = mm(ctx, kn_mul(ctx, kn_silu(ctx, mm(ctx, h, L->gate_shexp)), mm(ctx, h, L->up_shexp)), L->down_shexp);
        if (L->gate_inp_shexp)                                                       /* [T, 1] gate */
            s = kn_mul(ctx, s, kn_sigmoid(ctx, kn_matmul(ctx, h, kn_unsqueeze(ctx, L->gate_inp_shexp, 1))));
        y = kn_add(ctx, y, s);
    }
    return y;
}

/* ---- GGUF -------------------------------------------------------------------------------- */
/* tensor `name` of layer l whose ne are {cols, rows...} with the product of
 * ne[1..] equal to rows; NULL (*st set unless optional and absent) otherwise */
static kn_tensor *gg(kn_model *m, int l, const char *nm, int64_t rows, int64_t cols, bool required, kn_status *st) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, nm);
    if (*st) return NULL;
    const kn_gguf_tensor *t = kn_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (required) *st = kn_set_error(KN_ERR_FORMAT, "model file has no tensor '%s' (a mixture-of-experts layer needs "
                                         "ffn_gate_inp, ffn_gate_exps, ffn_up_exps and ffn_down_exps)", name);
        return NULL;
    }
    int64_t r = 1;
    for (int i = 1; i < t->n_dims; i++) r *= t->ne[i];
    if (t->ne[0] != cols || r != rows) {
        *st = kn_set_error(KN_ERR_FORMAT, "tensor '%s' has %lld x %lld elements, expected %lld x %lld from the model's "
                           "hyperparameters (expert_count %d)", name, (long long)r, (long long)t->ne[0], (long long)rows,
                           (long long)cols, m->cfg.n_expert);
        return NULL;
    }
    kn_tensor *w = rows == 1 ? kn__model_f32(m, t->type, 0, cols, t->data, name)
                             : kn__model_wrap(m, t->type, rows, cols, t->data, name);
    if (!w) *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM;
    return w;
}

kn_status kn__moe_gguf_layer(kn_model *m, int l, const char *arch) {
    kn_model_config *c = &m->cfg;
    kn__layer_w *L = &m->layers[l];
    char key[96];
    if (!c->n_expert) {                         /* first MoE layer: the hyperparameters */
        int64_t v;
        snprintf(key, sizeof key, "%s.expert_count", arch);
        c->n_expert = kn_gguf_get_i64(m->gguf, key, &v) ? (int)v : 0;
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        c->n_expert_used = kn_gguf_get_i64(m->gguf, key, &v) ? (int)v : 0;
        if (c->n_expert < 1 || c->n_expert > 4096 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert)
            return kn_set_error(KN_ERR_FORMAT, "%s.expert_count %d and expert_used_count %d must satisfy 1 <= used <= count <= 4096",
                                arch, c->n_expert, c->n_expert_used);
        snprintf(key, sizeof key, "blk.%d.ffn_gate_exps.weight", l);
        const kn_gguf_tensor *t = kn_gguf_find_tensor(m->gguf, key);
        if (!t || t->n_dims != 3)
            return kn_set_error(KN_ERR_FORMAT, "'%s' must be a 3-d tensor {n_embd, expert_ffn, expert_count}", key);
        if (t->ne[1] < 1 || t->ne[1] > (1 << 24))
            return kn_set_error(KN_ERR_FORMAT, "'%s': expert FFN width %lld is out of range", key, (long long)t->ne[1]);
        c->expert_ffn_dim = (int)t->ne[1];
        snprintf(key, sizeof key, "blk.%d.ffn_gate_shexp.weight", l);
        t = kn_gguf_find_tensor(m->gguf, key);
        if (t && (t->n_dims != 2 || t->ne[1] < 1 || t->ne[1] > (1 << 24)))
            return kn_set_error(KN_ERR_FORMAT, "'%s' must be a 2-d tensor {n_embd, shared_expert_ffn}", key);
        c->shared_ffn_dim = t ? (int)t->ne[1] : 0;
        /* llama.cpp renormalises the chosen weights for Mixtral and Qwen3-MoE,
         * not for Qwen2-MoE and OLMoE (their configs' norm_topk_prob) */
        bool norm = !strcmp(arch, "llama") || !strcmp(arch, "qwen3moe");
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        kn_gguf_get_bool(m->gguf, key, &norm);
        c->expert_norm = norm;
    }
    int64_t C = c->dim, E = c->n_expert, Fe = c->expert_ffn_dim, Fs = c->shared_ffn_dim;
    kn_status st = KN_OK;
    L->gate_inp = gg(m, l, "ffn_gate_inp", E, C, true, &st);
    L->gate_exps = gg(m, l, "ffn_gate_exps", E * Fe, C, true, &st);
    L->up_exps = gg(m, l, "ffn_up_exps", E * Fe, C, true, &st);
    L->down_exps = gg(m, l, "ffn_down_exps", E * C, Fe, true, &st);
    if (Fs) {
        L->gate_shexp = gg(m, l, "ffn_gate_shexp", Fs, C, true, &st);
        L->up_shexp = gg(m, l, "ffn_up_shexp", Fs, C, true, &st);
        L->down_shexp = gg(m, l, "ffn_down_shexp", C, Fs, true, &st);
        L->gate_inp_shexp = gg(m, l, "ffn_gate_inp_shexp", 1, C, false, &st);
    }
    return st;
}

/* kiln info: one line naming a GGUF's mixture of experts (nothing for a dense model) */
void kn__moe_print_info(const kn_gguf *g, void *fp) {
    kn_gguf_str s;
    char arch[64] = "llama", key[128];
    if (kn_gguf_get_str(g, "general.architecture", &s)) snprintf(arch, sizeof arch, "%.*s", (int)s.len, s.ptr);
    int64_t E = 0, K = 0, Fe = 0, Fs = 0;
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if (!kn_gguf_get_i64(g, key, &E) || E <= 0) return;
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    kn_gguf_get_i64(g, key, &K);
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
    if (!kn_gguf_get_i64(g, key, &Fe)) {
        snprintf(key, sizeof key, "%s.feed_forward_length", arch);
        kn_gguf_get_i64(g, key, &Fe);
    }
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
    kn_gguf_get_i64(g, key, &Fs);
    fprintf(fp, "mixture of experts (%s): %lld experts, %lld per token, expert FFN %lld", !strcmp(arch, "llama") ? "Mixtral" : arch,
            (long long)E, (long long)K, (long long)Fe);
    if (Fs > 0) fprintf(fp, ", shared expert FFN %lld", (long long)Fs);
    fprintf(fp, "\n");
}

/* ---- Hugging Face ------------------------------------------------------------------------ */
/* E per-expert matrices [rows, cols] (fmt: "%s%d.w1.weight" with prefix and
 * expert) copied into one [E*rows, cols] matrix of their dtype */
static kn_tensor *stack(kn_model *m, const char *prefix, const char *fmt, int64_t E, int64_t rows, int64_t cols,
                        kn__moe_get_fn get, void *ud, kn_status *st) {
    if (*st) return NULL;
    char name[200];
    char *buf = NULL;
    kn_dtype dt0 = KN_F32;
    size_t bytes = 0;
    for (int64_t e = 0; e < E; e++) {
        snprintf(name, sizeof name, fmt, prefix, (int)e);
        kn_dtype dt;
        const void *d = get(ud, name, rows, cols, true, &dt, st);
        if (!d) return NULL;
        if (!buf) {
            dt0 = dt;
            bytes = kn_dtype_nbytes(dt, rows * cols);
            if (!(buf = kn__model_alloc(m, bytes * (size_t)E))) { *st = KN_ERR_NOMEM; return NULL; }
        } else if (dt != dt0) {
            *st = kn_set_error(KN_ERR_FORMAT, "'%s' is %s but expert 0's is %s; kiln stacks experts of one dtype", name,
                               kn_dtype_name(dt), kn_dtype_name(dt0));
            return NULL;
        }
        memcpy(buf + bytes * (size_t)e, d, bytes);
    }
    snprintf(name, sizeof name, fmt, prefix, 0);
    kn_tensor *w = kn__model_wrap(m, dt0, E * rows, cols, buf, name);
    if (!w) *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM;
    return w;
}

kn_status kn__moe_hf_layer(kn_model *m, int l, const char *prefix, const char *expert_fmt, kn__moe_get_fn get, void *ud) {
    const kn_model_config *c = &m->cfg;
    kn__layer_w *L = &m->layers[l];
    int64_t C = c->dim, E = c->n_expert, Fe = c->expert_ffn_dim, Fs = c->shared_ffn_dim;
    bool mixtral = c->arch == KN_ARCH_MIXTRAL;
    char name[200], fmt[96];
    kn_status st = KN_OK;
    kn_dtype dt;
    snprintf(name, sizeof name, "%sgate.weight", prefix);
    const void *d = get(ud, name, E, C, true, &dt, &st);
    if (!d) return st;
    if (!(L->gate_inp = kn__model_wrap(m, dt, E, C, d, name))) return kn_ctx_status(m->ctx);
    const char *pj[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
    snprintf(fmt, sizeof fmt, "%%s%s.%%d.%s.weight", expert_fmt, pj[0]);
    L->gate_exps = stack(m, prefix, fmt, E, Fe, C, get, ud, &st);
    snprintf(fmt, sizeof fmt, "%%s%s.%%d.%s.weight", expert_fmt, pj[1]);
    L->up_exps = stack(m, prefix, fmt, E, Fe, C, get, ud, &st);
    snprintf(fmt, sizeof fmt, "%%s%s.%%d.%s.weight", expert_fmt, pj[2]);
    L->down_exps = stack(m, prefix, fmt, E, C, Fe, get, ud, &st);
    if (st || !Fs) return st;
    const char *sh[3] = {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight"};
    kn_tensor **dst[3] = {&L->gate_shexp, &L->up_shexp, &L->down_shexp};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, sh[i]);
        if (!(d = get(ud, name, i == 2 ? C : Fs, i == 2 ? Fs : C, true, &dt, &st))) return st;
        if (!(*dst[i] = kn__model_mat(m, dt, i == 2 ? C : Fs, i == 2 ? Fs : C, d, false, name))) return KN_ERR_NOMEM;
    }
    snprintf(name, sizeof name, "%sshared_expert_gate.weight", prefix);
    if ((d = get(ud, name, 1, C, false, &dt, &st)) && !(L->gate_inp_shexp = kn__model_f32(m, dt, 0, C, d, name)))
        return KN_ERR_NOMEM;
    return st;
}
