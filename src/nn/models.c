/* models.c: GPT-2 and Llama model definitions built from the blocks of
 * attention.c, with configurable sizes. Both map integer ids [B,T] to
 * logits [B,T,V]. Non-goals: no KV cache here (inference lives in src/llm). */
#include "nn-impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { kn_gpt2_cfg cfg; uint64_t drop_seed; } gpt2_t;
typedef struct { kn_llama_cfg cfg; } llama_t;

static kn_status add_blocks(kn_module *m, const char *name, int n, const kn_block_cfg *bc, bool gpt2_init) {
    kn_module *list = kn_module_new(m->ctx, "ModuleList", NULL, NULL, false);
    kn_status st = kn_module_add_child(m, name, list);
    for (int i = 0; i < n && !st; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "%d", i);
        st = kn_module_add_child(list, nm, kn_block_new(m->ctx, bc));
    }
    if (st) return st;
    /* GPT-2 / Llama style init: N(0, 0.02) weights, zero biases; GPT-2 scales
     * the residual projections by 1/sqrt(2L). Norms keep ones/zeros. */
    int np = kn_module_named_params(list, false, NULL, 0);
    kn_named_param *ps = malloc(sizeof *ps * (size_t)np);
    if (!ps) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_module_named_params(list, false, ps, np);
    for (int i = 0; i < np && !st; i++) {
        const char *nm = ps[i].name;
        size_t l = strlen(nm);
        bool is_norm = strstr(nm, "ln_") || strstr(nm, "layernorm");
        if (is_norm) continue;
        if (l > 5 && !strcmp(nm + l - 5, ".bias")) { st = kn_init_zeros(ps[i].t); continue; }
        double std = 0.02;
        if (gpt2_init && (strstr(nm, "c_proj.weight"))) std = 0.02 / sqrt(2.0 * n);
        st = kn_init_normal(ps[i].t, 0, std);
    }
    free(ps);
    return st;
}

/* ---- GPT-2 -------------------------------------------------------------------- */
kn_module *kn_gpt2_new(kn_ctx *ctx, const kn_gpt2_cfg *cfg) {
    if (!cfg || cfg->vocab <= 0 || cfg->max_seq <= 0 || cfg->dim <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 ||
        cfg->dim % cfg->n_heads) {
        kn__fail(ctx, KN_ERR_INVALID, "GPT2: vocab, max_seq, dim, n_layers, n_heads must be positive and dim a multiple of n_heads");
        return NULL;
    }
    gpt2_t *g = calloc(1, sizeof *g);
    kn_module *m = kn_module_new(ctx, "GPT2", NULL, g, true);
    if (!m) return NULL;
    g->cfg = *cfg;
    g->drop_seed = kn_nn_next_seed();
    kn_block_cfg bc = {
        .attn = {.dim = cfg->dim, .n_heads = cfg->n_heads, .bias = true, .fused_qkv = true, .causal = true, .dropout = cfg->dropout,
                 .attn_dropout = cfg->attn_dropout},
        .norm = KN_NORM_LAYER, .norm_eps = 1e-5, .mlp = KN_MLP_GELU_TANH, .hidden = 4 * cfg->dim, .mlp_bias = true};
    kn_status st = kn_module_add_child(m, "wte", kn_embedding_new(ctx, cfg->vocab, cfg->dim));
    if (!st) st = kn_module_add_child(m, "wpe", kn_embedding_new(ctx, cfg->max_seq, cfg->dim));
    if (!st) st = add_blocks(m, "h", cfg->n_layers, &bc, true);
    if (!st) st = kn_module_add_child(m, "ln_f", kn_layer_norm_new(ctx, cfg->dim, 1e-5, true, true));
    if (!st) st = kn_init_normal(kn_module_find(m, "wte.weight"), 0, 0.02);
    if (!st) st = kn_init_normal(kn_module_find(m, "wpe.weight"), 0, 0.02);
    if (st) { kn_module_free(m); return NULL; }
    return m;
}

kn_tensor *kn_gpt2_forward(kn_module *m, kn_tensor *ids) {
    if (!m || !ids) return NULL;
    if (strcmp(m->kind, "GPT2")) return kn__mod_fail(m, "kn_gpt2_forward needs a GPT2 module");
    gpt2_t *g = m->impl;
    kn_ctx *ctx = m->ctx;
    if (!kn__mod_check(m, ids, 2, 2, -1, -1, "ids [B,T]")) return NULL;
    int64_t T = ids->shape[1];
    if (T > g->cfg.max_seq) return kn__mod_fail(m, "sequence length %lld exceeds max_seq %lld", (long long)T, (long long)g->cfg.max_seq);
    kn_tensor *wpe = kn_module_find(m, "wpe.weight");
    kn_tensor *x = kn_module_forward(kn__child(m, "wte"), ids);                  /* [B,T,C] */
    x = kn_add(ctx, x, kn_slice(ctx, wpe, 0, 0, T, 1));                          /* + [T,C] */
    x = kn__mod_dropout(m, x, g->cfg.dropout, g->drop_seed);
    kn_module *h = kn__child(m, "h");
    for (int i = 0; i < h->n_children; i++) x = kn_block_forward(h->children[i], x, NULL);
    x = kn_module_forward(kn__child(m, "ln_f"), x);
    return kn__mod_linear(m, x, kn_module_find(m, "wte.weight"), NULL);          /* tied lm_head: [B,T,V] */
}

/* ---- Llama ----------------------------------------------------------------------- */
kn_module *kn_llama_new(kn_ctx *ctx, const kn_llama_cfg *cfg) {
    if (!cfg || cfg->vocab <= 0 || cfg->dim <= 0 || cfg->hidden <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0) {
        kn__fail(ctx, KN_ERR_INVALID, "Llama: vocab, dim, hidden, n_layers, n_heads must be positive");
        return NULL;
    }
    llama_t *l = calloc(1, sizeof *l);
    kn_module *m = kn_module_new(ctx, "Llama", NULL, l, true);
    if (!m) return NULL;
    l->cfg = *cfg;
    if (l->cfg.rope_theta <= 0) l->cfg.rope_theta = 10000;
    if (l->cfg.norm_eps <= 0) l->cfg.norm_eps = 1e-5;
    kn_block_cfg bc = {
        .attn = {.dim = cfg->dim, .n_heads = cfg->n_heads, .n_kv_heads = cfg->n_kv_heads, .causal = true, .rope = true,
                 .rope_neox = true, .rope_theta = l->cfg.rope_theta},
        .norm = KN_NORM_RMS, .norm_eps = l->cfg.norm_eps, .mlp = KN_MLP_SWIGLU, .hidden = cfg->hidden};
    kn_status st = kn_module_add_child(m, "embed_tokens", kn_embedding_new(ctx, cfg->vocab, cfg->dim));
    if (!st) st = add_blocks(m, "layers", cfg->n_layers, &bc, false);
    if (!st) st = kn_module_add_child(m, "norm", kn_rms_norm_new(ctx, cfg->dim, l->cfg.norm_eps));
    if (!st && !cfg->tie_embeddings) {
        st = kn_module_add_child(m, "lm_head", kn_linear_new(ctx, cfg->dim, cfg->vocab, false));
        if (!st) st = kn_init_normal(kn_module_find(m, "lm_head.weight"), 0, 0.02);
    }
    if (!st) st = kn_init_normal(kn_module_find(m, "embed_tokens.weight"), 0, 0.02);
    if (st) { kn_module_free(m); return NULL; }
    return m;
}

kn_tensor *kn_llama_forward(kn_module *m, kn_tensor *ids, kn_tensor *pos) {
    if (!m || !ids) return NULL;
    if (strcmp(m->kind, "Llama")) return kn__mod_fail(m, "kn_llama_forward needs a Llama module");
    llama_t *l = m->impl;
    kn_ctx *ctx = m->ctx;
    if (!kn__mod_check(m, ids, 2, 2, -1, -1, "ids [B,T]")) return NULL;
    int64_t T = ids->shape[1];
    if (!pos) pos = kn_arange(ctx, KN_I32, 0, (double)T, 1);
    kn_tensor *x = kn_module_forward(kn__child(m, "embed_tokens"), ids);
    kn_module *layers = kn__child(m, "layers");
    for (int i = 0; i < layers->n_children; i++) x = kn_block_forward(layers->children[i], x, pos);
    x = kn_module_forward(kn__child(m, "norm"), x);
    if (l->cfg.tie_embeddings) return kn__mod_linear(m, x, kn_module_find(m, "embed_tokens.weight"), NULL);
    return kn_module_forward(kn__child(m, "lm_head"), x);
}
