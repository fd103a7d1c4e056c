/* attention.c: multi-head attention (fused or separate q/k/v projections,
 * causal, grouped-query, optional RoPE), the MLPs (GELU or SwiGLU) and the
 * pre-norm transformer block. Layout: x [B,T,C]; heads [B,H,T,D], C = H*D. */
#include "nn-impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { kn_attn_cfg cfg; uint64_t drop_seed; } attn_t;

static kn_tensor *attn_fwd1(kn_module *m, kn_tensor *x) { return kn_attention_forward(m, x, NULL); }

static kn_module *linear_child(kn_module *m, const char *name, int64_t in, int64_t out, bool bias) {
    kn_module *l = kn_linear_new(m->ctx, in, out, bias);
    if (!l || kn_module_add_child(m, name, l)) return NULL;
    return l;
}

kn_module *kn_attention_new(kn_ctx *ctx, const kn_attn_cfg *cfg) {
    if (!cfg) { kn__fail(ctx, KN_ERR_INVALID, "Attention: NULL config"); return NULL; }
    kn_attn_cfg c = *cfg;
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.dim <= 0 || c.n_heads <= 0 || c.dim % c.n_heads || c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads ||
        (c.fused_qkv && c.n_kv_heads != c.n_heads) || ((c.dim / c.n_heads) % 2 && c.rope)) {
        kn__fail(ctx, KN_ERR_INVALID, "Attention: dim %lld must be a multiple of n_heads %d, n_heads of n_kv_heads %d "
                 "(fused qkv needs n_kv_heads == n_heads; rope needs an even head dim)", (long long)c.dim, c.n_heads, c.n_kv_heads);
        return NULL;
    }
    if (!(c.attn_dropout >= 0 && c.attn_dropout < 1)) {
        kn__fail(ctx, KN_ERR_INVALID, "Attention: attn_dropout %g is outside [0, 1)", c.attn_dropout);
        return NULL;
    }
    if (c.rope && c.rope_theta <= 0) c.rope_theta = 10000;
    attn_t *a = calloc(1, sizeof *a);
    kn_module *m = kn_module_new(ctx, "Attention", attn_fwd1, a, true);
    if (!m) return NULL;
    a->cfg = c;
    a->drop_seed = kn_nn_next_seed();
    int64_t C = c.dim, D = C / c.n_heads, kvC = D * c.n_kv_heads;
    bool ok;
    if (c.fused_qkv)
        ok = linear_child(m, "c_attn", C, 3 * C, c.bias) && linear_child(m, "c_proj", C, C, c.bias);
    else
        ok = linear_child(m, "q_proj", C, C, c.bias) && linear_child(m, "k_proj", C, kvC, c.bias) &&
             linear_child(m, "v_proj", C, kvC, c.bias) && linear_child(m, "o_proj", C, C, c.bias);
    if (!ok) { kn_module_free(m); return NULL; }
    return m;
}

/* [B,T,H*D] -> [B,H,T,D] */
static kn_tensor *heads(kn_ctx *ctx, kn_tensor *x, int64_t B, int64_t T, int64_t H, int64_t D) {
    static const int perm[4] = {0, 2, 1, 3};
    return kn_permute(ctx, kn_reshape(ctx, x, 4, (int64_t[]){B, T, H, D}), perm);
}

/* Attention with dropout on its probabilities, unfused (a training forward
 * with attn_dropout > 0): s = q k^T / sqrt(D) [B,H,T,Tk] in f32, keys past a
 * query's position masked when causal (query i sees keys j <= i + Tk - T,
 * as kn_sdpa), p = dropout(softmax(s)), y = p v [B,H,T,D] in v's dtype
 * (s in f32 for 16-bit q and k).
 * Grouped kv heads are repeated to H first. The mask's seed is the module's
 * own (seed), moved each step by the tree's rng step like every dropout. */
static kn_tensor *attn_dropped(kn_module *m, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double p, uint64_t seed) {
    kn_ctx *ctx = m->ctx;
    if (!q || !k || !v) return NULL;
    int64_t H = q->shape[1], T = q->shape[2], D = q->shape[3], G = H / k->shape[1], Tk = k->shape[2];
    k = kn__repeat_heads(ctx, k, G);
    v = kn__repeat_heads(ctx, v, G);
    kn_tensor *s = kn_matmul(ctx, q, kn_transpose(ctx, k, 2, 3));
    if (s && (s->dtype == KN_BF16 || s->dtype == KN_F16)) s = kn_cast(ctx, s, KN_F32);   /* the softmax in f32 */
    s = kn_mul_scalar(ctx, s, 1.0 / sqrt((double)D));
    if (causal && s) {   /* -inf above diagonal Tk - T (the keys after each query), 0 elsewhere */
        kn_tensor *minf = kn_full(ctx, s->dtype, 2, (int64_t[]){T, Tk}, -INFINITY);
        s = kn_add(ctx, s, kn_triu(ctx, minf, Tk - T + 1));
    }
    kn_tensor *pr = kn__mod_dropout(m, kn_softmax(ctx, s, 3), p, seed);
    if (pr && v && pr->dtype != v->dtype) pr = kn_cast(ctx, pr, v->dtype);
    return kn_matmul(ctx, pr, v);
}
/* the attention-probability mask's seed: apart from the output dropout's */
#define ATTN_PROB_SEED 0x9e3779b97f4a7c15ull

kn_tensor *kn_attention_forward(kn_module *m, kn_tensor *x, kn_tensor *pos) {
    if (!m || !x) return NULL;
    if (strcmp(m->kind, "Attention")) return kn__mod_fail(m, "kn_attention_forward needs an Attention module");
    attn_t *a = m->impl;
    const kn_attn_cfg *c = &a->cfg;
    kn_ctx *ctx = m->ctx;
    if (!kn__mod_check(m, x, 3, 3, 2, c->dim, "[B,T,C] with C = dim")) return NULL;
    if (c->rope && !pos) return kn__mod_fail(m, "rope is on: pass positions pos (i32 [T])");
    int64_t B = x->shape[0], T = x->shape[1], C = c->dim, H = c->n_heads, Hkv = c->n_kv_heads, D = C / H;
    kn_tensor *q, *k, *v;
    kn_dtype hd = KN_F32;
    if (c->fused_qkv) {
        kn_tensor *qkv = kn_module_forward(kn__child(m, "c_attn"), x);           /* [B,T,3C] */
        /* 16-bit attention (a GPU under a bf16/f16 policy): one cast of the
         * whole projection before the split when nothing else (rope) needs
         * f32 q, k: the heads are strided views the flash kernels read as
         * they are, and in the backward the three head gradients meet in
         * one 16-bit [B,T,3C] that the projection's own cast back cancels
         * (the cast round trip rewrite) */
        hd = kn__mod_attn_dtype(m, qkv);
        if (qkv && hd != qkv->dtype && !c->rope) qkv = kn_cast(ctx, qkv, hd);
        q = kn_narrow(ctx, qkv, 2, 0, C);
        k = kn_narrow(ctx, qkv, 2, C, C);
        v = kn_narrow(ctx, qkv, 2, 2 * C, C);
    } else {
        q = kn_module_forward(kn__child(m, "q_proj"), x);
        k = kn_module_forward(kn__child(m, "k_proj"), x);
        v = kn_module_forward(kn__child(m, "v_proj"), x);
        hd = kn__mod_attn_dtype(m, q);
    }
    q = heads(ctx, q, B, T, H, D);
    k = heads(ctx, k, B, T, Hkv, D);
    v = heads(ctx, v, B, T, Hkv, D);
    if (c->rope) {
        q = kn_rope(ctx, q, pos, (int)D, c->rope_theta, c->rope_neox, 1.0);
        k = kn_rope(ctx, k, pos, (int)D, c->rope_theta, c->rope_neox, 1.0);
    }
    kn_dtype out = x->dtype;
    if (q && hd != q->dtype) { q = kn_cast(ctx, q, hd); k = kn_cast(ctx, k, hd); v = kn_cast(ctx, v, hd); }
    kn_tensor *y = m->training && c->attn_dropout > 0
                       ? attn_dropped(m, q, k, v, c->causal, c->attn_dropout, a->drop_seed ^ ATTN_PROB_SEED)
                       : kn_sdpa(ctx, q, k, v, c->causal, 0);                     /* [B,H,T,D] */
    static const int perm[4] = {0, 2, 1, 3};
    y = kn_reshape(ctx, kn_permute(ctx, y, perm), 3, (int64_t[]){B, T, C});    /* [B,T,C] */
    /* back to the graph's dtype after the layout copy (half the bytes in
     * 16 bits); the projection's cast to its compute dtype then cancels */
    if (y && y->dtype != out) y = kn_cast(ctx, y, out);
    y = kn_module_forward(kn__child(m, c->fused_qkv ? "c_proj" : "o_proj"), y);
    return kn__mod_dropout(m, y, c->dropout, a->drop_seed);
}

/* ---- MLP ------------------------------------------------------------------------ */
typedef struct { kn_mlp_kind kind; } mlp_t;
static kn_tensor *mlp_fwd(kn_module *m, kn_tensor *x) {
    mlp_t *p = m->impl;
    kn_ctx *ctx = m->ctx;
    if (p->kind == KN_MLP_SWIGLU) {
        kn_tensor *g = kn_silu(ctx, kn_module_forward(kn__child(m, "gate_proj"), x));
        kn_tensor *u = kn_module_forward(kn__child(m, "up_proj"), x);
        return kn_module_forward(kn__child(m, "down_proj"), kn_mul(ctx, g, u));
    }
    kn_tensor *h = kn_module_forward(kn__child(m, "c_fc"), x);
    h = p->kind == KN_MLP_GELU ? kn_gelu(ctx, h) : kn_gelu_tanh(ctx, h);
    return kn_module_forward(kn__child(m, "c_proj"), h);
}
static kn_module *mlp_new(kn_ctx *ctx, kn_mlp_kind kind, int64_t C, int64_t hidden, bool bias) {
    mlp_t *p = calloc(1, sizeof *p);
    kn_module *m = kn_module_new(ctx, "MLP", mlp_fwd, p, true);
    if (!m) return NULL;
    p->kind = kind;
    bool ok = kind == KN_MLP_SWIGLU
        ? linear_child(m, "gate_proj", C, hidden, bias) && linear_child(m, "up_proj", C, hidden, bias) &&
          linear_child(m, "down_proj", hidden, C, bias)
        : linear_child(m, "c_fc", C, hidden, bias) && linear_child(m, "c_proj", hidden, C, bias);
    if (!ok) { kn_module_free(m); return NULL; }
    return m;
}

/* ---- pre-norm block --------------------------------------------------------------- */
typedef struct { kn_block_cfg cfg; uint64_t drop_seed; } block_t;
static kn_tensor *block_fwd1(kn_module *m, kn_tensor *x) { return kn_block_forward(m, x, NULL); }

kn_module *kn_block_new(kn_ctx *ctx, const kn_block_cfg *cfg) {
    if (!cfg) { kn__fail(ctx, KN_ERR_INVALID, "Block: NULL config"); return NULL; }
    if (cfg->hidden <= 0) { kn__fail(ctx, KN_ERR_INVALID, "Block: MLP hidden size %lld must be positive", (long long)cfg->hidden); return NULL; }
    block_t *b = calloc(1, sizeof *b);
    kn_module *m = kn_module_new(ctx, "Block", block_fwd1, b, true);
    if (!m) return NULL;
    b->cfg = *cfg;
    b->drop_seed = kn_nn_next_seed();
    int64_t C = cfg->attn.dim;
    bool rms = cfg->norm == KN_NORM_RMS;
    double eps = cfg->norm_eps > 0 ? cfg->norm_eps : (rms ? 1e-6 : 1e-5);
    kn_module *n1 = rms ? kn_rms_norm_new(ctx, C, eps) : kn_layer_norm_new(ctx, C, eps, true, true);
    kn_module *n2 = rms ? kn_rms_norm_new(ctx, C, eps) : kn_layer_norm_new(ctx, C, eps, true, true);
    kn_module *at = kn_attention_new(ctx, &cfg->attn);
    kn_module *mlp = mlp_new(ctx, cfg->mlp, C, cfg->hidden, cfg->mlp_bias);
    kn_status st = kn_module_add_child(m, rms ? "input_layernorm" : "ln_1", n1);
    st = st ? (kn_module_free(at), st) : kn_module_add_child(m, rms ? "self_attn" : "attn", at);
    st = st ? (kn_module_free(n2), st) : kn_module_add_child(m, rms ? "post_attention_layernorm" : "ln_2", n2);
    st = st ? (kn_module_free(mlp), st) : kn_module_add_child(m, "mlp", mlp);
    if (st) { kn_module_free(m); return NULL; }
    return m;
}

kn_tensor *kn_block_forward(kn_module *m, kn_tensor *x, kn_tensor *pos) {
    if (!m || !x) return NULL;
    if (strcmp(m->kind, "Block")) return kn__mod_fail(m, "kn_block_forward needs a Block module");
    block_t *b = m->impl;
    bool rms = b->cfg.norm == KN_NORM_RMS;
    kn_ctx *ctx = m->ctx;
    kn_tensor *h = kn_module_forward(kn__child(m, rms ? "input_layernorm" : "ln_1"), x);
    h = kn_attention_forward(kn__child(m, rms ? "self_attn" : "attn"), h, pos);
    x = kn_add(ctx, x, h);
    h = kn_module_forward(kn__child(m, rms ? "post_attention_layernorm" : "ln_2"), x);
    h = kn_module_forward(kn__child(m, "mlp"), h);
    /* residual dropout after the MLP too (GPT-2's resid_pdrop: the same rate
     * as after the attention projection) */
    h = kn__mod_dropout(m, h, b->cfg.attn.dropout, b->drop_seed);
    return kn_add(ctx, x, h);
}
