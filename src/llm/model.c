/* model.c: loading a decoder-only transformer and evaluating it as a kiln plan.
 *
 * Loading maps the file and wraps every weight as a kiln tensor in place
 * (kn_from_ptr: no copy, quantized blocks stay quantized). The forward graph
 * is built once: inputs are the token embeddings x [T, C], positions
 * pos [T] and the index of the rows whose logits are wanted; T (tokens in
 * this call) and S (context length after it) are plan symbols, so the same
 * plan runs prefill chunks and single-token decode steps.
 *
 * Letters: T tokens this step, S context length (n_past + T), C model width,
 * H query heads, Hkv key/value heads, D head dim, F ffn width, V vocab.
 *
 * Per layer (Llama): x += Wo · attn(rope(Wq·n(x)), cache_k, cache_v);
 * x += W2 · (silu(W1·n(x)) * W3·n(x)); the new K, V rows are written into
 * the caches [Hkv, n_ctx, D] with index_copy at their positions.
 * Qwen2 adds biases to Wq, Wk, Wv; Qwen3 RMS-normalises each head's q and k
 * ([T, H, D] over D, gains q_norm / k_norm [D]) before rope. Mistral, Gemma
 * 2/3 and Phi-3 enter through model_arch.c's pieces (kn__arch_*: embedding
 * scale, rope per layer type, windowed and soft-capped attention, post-norms,
 * the gate activation, final soft-cap), which are the plain ops for the
 * other architectures.
 * Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) replace the FFN
 * of their MoE layers by model_moe.c's (router, top-k, batched experts);
 * OLMoE RMS-normalises the whole q [T, H*D] and k [T, Hkv*D] instead.
 * GPT-2: x starts as wte[token] + wpe[pos]; n is LayerNorm with bias, q/k/v
 * come from one fused matrix with bias (no rope), the MLP is
 * W2 · gelu_tanh(W1·n(x) + b1) + b2, every projection has a bias.
 * With kn_model_opts.kv_f16 the caches are f16: K, V are cast before the
 * index_copy and attention reads the f16 rows.
 *
 * On a device backend (kn_model_opts.backend->device != KN_DEVICE_HOST, e.g.
 * CUDA) the loaders still wrap the file in a host context; every weight the
 * graph reads is then uploaded (matrices in kn_model_opts.weight_dtype, bf16
 * by default, quantized blocks dequantized on the host a block of rows at a
 * time; vectors in f32), wq|wk|wv and w1|w3 stacked into one matrix each
 * (fewer, larger matmuls: decode is launch-bound). Token embeddings are still
 * looked up on the host; inputs and logits go through host staging buffers.
 *
 * This file: the GGUF and llama2.c loaders, device upload, the graph and
 * the public entry points; model_arch.c the Mistral / Gemma / Phi-3
 * additions; model_weights.c has the weight and tokenizer
 * helpers every loader shares; model_hf.c loads llm.c GPT-2 and Hugging Face
 * safetensors models, model_ckpt.c kiln's own checkpoints (struct in
 * model_impl.h).
 */
#include "graph/graph.h"
#include "core/env.h"
#include "llm/model_impl.h"     /* defines: struct kn_model, kn__layer_w, loader entry points */
#include "kiln_dist.h"           /* defines: kn_all_reduce (tensor parallel) */
#include "llm/model_ckpt.h"     /* defines: kn__is_kiln_gpt_ckpt, kn__load_kiln_ckpt */
#include "backends/quant/quant.h"        /* defines: kn_dequantize_row */
#include "core/fp16.h"        /* defines: kn_fp32_to_fp16, kn_fp32_to_bf16 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static kn_tensor *gguf_w(kn_model *m, const char *name, int64_t rows, int64_t cols, bool required, kn_status *st) {
    const kn_gguf_tensor *gt = kn_gguf_find_tensor(m->gguf, name);
    if (!gt) {
        if (required) *st = kn_set_error(KN_ERR_FORMAT, "model file has no tensor '%s'; is it a llama-architecture GGUF?", name);
        return NULL;
    }
    int64_t r = gt->n_dims == 1 ? 1 : gt->ne[1], c = gt->ne[0];
    for (int i = 2; i < gt->n_dims; i++) r *= gt->ne[i];
    if (r != rows || c != cols) {
        *st = kn_set_error(KN_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] from the model's hyperparameters",
                           name, (long long)r, (long long)c, (long long)rows, (long long)cols);
        return NULL;
    }
    kn_tensor *t = kn__model_wrap(m, gt->type, rows, cols, gt->data, name);
    if (!t) *st = kn_ctx_status(m->ctx);
    return t;
}

/* rows [r0, r0 + rows) of the GGUF matrix `name` [total, cols] (a fused
 * projection split in place: the rows of a quantized matrix are whole blocks) */
static kn_tensor *gguf_rows(kn_model *m, const char *name, int64_t total, int64_t cols, int64_t r0, int64_t rows,
                            kn_status *st) {
    if (*st) return NULL;
    const kn_gguf_tensor *gt = kn_gguf_find_tensor(m->gguf, name);
    if (!gt || gt->n_dims != 2 || gt->ne[0] != cols || gt->ne[1] != total) {
        *st = kn_set_error(KN_ERR_FORMAT, "tensor '%s' %s, expected a [%lld, %lld] matrix from the model's hyperparameters",
                           name, gt ? "has another shape" : "is missing", (long long)total, (long long)cols);
        return NULL;
    }
    kn_tensor *t = kn__model_wrap(m, gt->type, rows, cols, (const char *)gt->data + kn_dtype_nbytes(gt->type, cols) * (size_t)r0,
                                  name);
    if (!t) *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_FORMAT;
    return t;
}

static int64_t gguf_int(const kn_gguf *g, const char *arch, const char *key, int64_t def) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v;
    return kn_gguf_get_i64(g, k, &v) ? v : def;
}
static double gguf_f64(const kn_gguf *g, const char *arch, const char *key, double def) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    double v;
    return kn_gguf_get_f64(g, k, &v) ? v : def;
}

/* RoPE scaling from the metadata: linear (a frequency scale), yarn (divisors
 * and an attention scale), and Llama 3's divisors, which GGUF files carry as
 * the tensor rope_freqs.weight [n_rot/2] (rope_scaling.c explains both). */
static kn_status gguf_rope_scaling(kn_model *m, const char *arch, const char *path) {
    kn_model_config *c = &m->cfg;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    kn_gguf_str s = {0};
    char type[16] = "none";
    if (kn_gguf_get_str(m->gguf, key, &s)) snprintf(type, sizeof type, "%.*s", (int)s.len, s.ptr);
    double factor = gguf_f64(m->gguf, arch, "rope.scaling.factor", 1.0);
    int half = c->n_rot / 2;
    const kn_gguf_tensor *rf = kn_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!strcmp(type, "linear")) {
        if (!(factor > 0) || isinf(factor))
            return kn_set_error(KN_ERR_FORMAT, "%s: linear rope scaling needs a positive factor, got %g", path, factor);
        c->rope_freq_scale = 1.0 / factor;
        strcpy(c->rope_scaling, "linear");
    } else if (!strcmp(type, "yarn")) {
        double orig = gguf_f64(m->gguf, arch, "rope.scaling.original_context_length", (double)c->n_ctx_train);
        double bf = gguf_f64(m->gguf, arch, "rope.scaling.yarn_beta_fast", 32), bs = gguf_f64(m->gguf, arch, "rope.scaling.yarn_beta_slow", 1);
        double af = gguf_f64(m->gguf, arch, "rope.scaling.attn_factor", 1.0);
        if (!(factor >= 1) || isinf(factor) || !(orig >= 1) || !(bf > 0) || !(bs > 0) || !(af > 0))
            return kn_set_error(KN_ERR_FORMAT, "%s: yarn rope scaling needs factor >= 1, original_context_length >= 1 and "
                                "positive beta_fast/beta_slow/attn_factor (got %g, %g, %g, %g, %g)", path, factor, orig, bf, bs, af);
        float *ff = kn__model_alloc(m, sizeof(float) * (size_t)half);
        if (!ff) return KN_ERR_NOMEM;
        kn_status st = kn__model_set_rope_ff(m, ff, af * kn__rope_ff_yarn(ff, c->n_rot, c->rope_theta, factor, orig, bf, bs));
        if (st) return st;
        strcpy(c->rope_scaling, "yarn");
    } else if (strcmp(type, "none")) {
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: rope scaling type '%s' is not supported (kiln runs none, linear, yarn, "
                            "and Llama 3 frequency factors)", path, type);
    }
    if (rf) {           /* Llama 3 (and others): per-pair divisors computed by the converter */
        if (rf->type != KN_F32 || rf->n_dims != 1 || rf->ne[0] != half || m->rope_ff)
            return kn_set_error(KN_ERR_FORMAT, "%s: rope_freqs.weight must be f32 [n_rot/2 = %d]%s", path, half,
                                m->rope_ff ? " and not combined with yarn" : "");
        const float *d = rf->data;
        for (int i = 0; i < half; i++)
            if (!(d[i] > 0) || isinf(d[i]))
                return kn_set_error(KN_ERR_FORMAT, "%s: rope_freqs.weight[%d] = %g is not a positive number", path, i, (double)d[i]);
        kn_status st = kn__model_set_rope_ff(m, d, 1.0);
        if (st) return st;
        strcpy(c->rope_scaling, "llama3");
    }
    return KN_OK;
}

/* A GGUF 1-d tensor (norm, bias) or a position table as f32: F32/F16/BF16
 * files (llama.cpp keeps them F32); n elements per row, rows 0 = a vector. */
static kn_tensor *gguf_f32(kn_model *m, const char *name, int64_t rows, int64_t n, kn_status *st) {
    if (*st) return NULL;
    const kn_gguf_tensor *gt = kn_gguf_find_tensor(m->gguf, name);
    int64_t numel = 1;
    for (int i = 0; gt && i < gt->n_dims; i++) numel *= gt->ne[i];
    if (!gt || numel != (rows ? rows : 1) * n) {
        *st = gt ? kn_set_error(KN_ERR_FORMAT, "tensor '%s' has %lld elements, expected %lld from the model's hyperparameters",
                                name, (long long)numel, (long long)((rows ? rows : 1) * n))
                 : kn_set_error(KN_ERR_FORMAT, "model file has no tensor '%s'; is the GGUF complete and of the architecture it names?", name);
        return NULL;
    }
    kn_tensor *t = kn__model_f32(m, gt->type, rows, n, gt->data, name);
    if (!t) *st = kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_FORMAT;
    return t;
}

/* What every GGUF architecture shares: the vocabulary size from
 * token_embd [V, C], the embedding, the output head (output.weight, or tied
 * to the embedding when absent) and the per-layer weight slots. */
static kn_status gguf_embd_head(kn_model *m, const char *path) {
    kn_model_config *c = &m->cfg;
    const kn_gguf_tensor *te = kn_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te || te->n_dims != 2) return kn_set_error(KN_ERR_FORMAT, "%s: no 2-d token_embd.weight tensor", path);
    c->n_vocab = (int)te->ne[1];
    kn_status st = KN_OK;
    m->tok_embd = gguf_w(m, "token_embd.weight", c->n_vocab, c->dim, true, &st);
    if (!st) m->wout = gguf_w(m, "output.weight", c->n_vocab, c->dim, false, &st);
    if (st) return st;
    c->tied_output = m->wout == NULL;
    if (!m->wout) m->wout = m->tok_embd;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    return m->layers ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
}

/* GPT-2 as llama.cpp converts it: token_embd + position_embd, LayerNorms
 * with biases, one fused attn_qkv [3C, C] with bias, attn_output, ffn_up
 * [F, C] / ffn_down [C, F] with biases, output_norm; output.weight when the
 * head is not tied. The tokenizer (tokenizer.ggml.model "gpt2": byte-level
 * BPE with merges) is optional, as for llm.c checkpoints. */
static kn_status load_gguf_gpt2(kn_model *m, const char *path) {
    const char *arch = "gpt2";
    kn_model_config *c = &m->cfg;
    kn_gguf_str s;
    if (kn_gguf_get_str(m->gguf, "general.name", &s)) snprintf(c->name, sizeof c->name, "%.*s", (int)s.len, s.ptr);
    c->arch = KN_ARCH_GPT2;
    c->dim = (int)gguf_int(m->gguf, arch, "embedding_length", 0);
    c->n_layers = (int)gguf_int(m->gguf, arch, "block_count", 0);
    c->ffn_dim = (int)gguf_int(m->gguf, arch, "feed_forward_length", 4 * (int64_t)c->dim);
    c->n_heads = c->n_kv_heads = (int)gguf_int(m->gguf, arch, "attention.head_count", 0);
    c->n_ctx_train = (int)gguf_int(m->gguf, arch, "context_length", 0);
    c->norm_eps = gguf_f64(m->gguf, arch, "attention.layer_norm_epsilon", 1e-5);
    c->n_rot = 0; c->rope_theta = 0; c->rope_freq_scale = 1; c->rope_neox = false;
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->ffn_dim <= 0 || c->n_ctx_train <= 0 ||
        c->dim % c->n_heads || c->n_layers > 1024 || c->dim > (1 << 20))
        return kn_set_error(KN_ERR_FORMAT, "%s: inconsistent gpt2 hyperparameters (dim %d, layers %d, heads %d, ffn %d, context %d)",
                            path, c->dim, c->n_layers, c->n_heads, c->ffn_dim, c->n_ctx_train);
    c->head_dim = c->dim / c->n_heads;
    kn_status st = gguf_embd_head(m, path);
    if (st) return st;
    int64_t C = c->dim, F = c->ffn_dim;
    m->pos_embd = gguf_f32(m, "position_embd.weight", c->n_ctx_train, C, &st);
    m->out_norm = gguf_f32(m, "output_norm.weight", 0, C, &st);
    m->out_norm_b = gguf_f32(m, "output_norm.bias", 0, C, &st);
    for (int l = 0; l < c->n_layers && !st; l++) {
        kn__layer_w *L = &m->layers[l];
        char n[96];
#define W(field, nm, r, cc) snprintf(n, sizeof n, "blk.%d." nm ".weight", l); L->field = gguf_w(m, n, r, cc, true, &st); if (st) break;
#define B(field, nm, len) snprintf(n, sizeof n, "blk.%d." nm, l); L->field = gguf_f32(m, n, 0, len, &st); if (st) break;
        B(attn_norm, "attn_norm.weight", C) B(attn_norm_b, "attn_norm.bias", C)
        W(wqkv, "attn_qkv", 3 * C, C) B(bqkv, "attn_qkv.bias", 3 * C)
        W(wo, "attn_output", C, C) B(bo, "attn_output.bias", C)
        B(ffn_norm, "ffn_norm.weight", C) B(ffn_norm_b, "ffn_norm.bias", C)
        W(w1, "ffn_up", F, C) B(b1, "ffn_up.bias", F)
        W(w2, "ffn_down", C, F) B(b2, "ffn_down.bias", C)
#undef W
#undef B
    }
    if (st) return st;
    c->weight_type = m->layers[0].wqkv->dtype;
    if (kn_gguf_get_str(m->gguf, "tokenizer.ggml.model", &s) && (st = kn_tokenizer_from_gguf(m->gguf, &m->tok)))
        return st;
    return KN_OK;
}

/* Llama and the Llama-shaped architectures llama.cpp writes the same way:
 *   llama: q/k rows permuted by the converter for paired (interleaved) rope;
 *   qwen2: rows as in HF (rotate halves: llama.cpp's NEOX rope type), biases
 *          attn_{q,k,v}.bias [H*D], [Hkv*D] x2 (none on attn_output);
 *   qwen3: rows as in HF, no biases, attn_q_norm / attn_k_norm [D] (an RMS
 *          norm over each head's q and k before rope), and a head dim
 *          attention.key_length that need not be embedding_length / H;
 *   gemma2/gemma3: rows as in HF, post_attention_norm / post_ffw_norm and
 *          (gemma3) attn_q_norm / attn_k_norm, gains stored as 1 + w;
 *   phi3:  attn_qkv and ffn_up [2F, C] (gate | up) split by rows in place.
 * Windows, caps and LongRoPE: model_arch.c (kn__gguf_arch_config).
 * Biases are read wherever present (some llama files carry them too). */
static kn_status load_gguf(kn_model *m, const char *path) {
    kn_status st = kn_gguf_open(path, &m->gguf);
    if (st) return st;
    kn_gguf_str s;
    char arch[64] = "llama";
    if (kn_gguf_get_str(m->gguf, "general.architecture", &s)) snprintf(arch, sizeof arch, "%.*s", (int)s.len, s.ptr);
    if (!strcmp(arch, "gpt2")) return load_gguf_gpt2(m, path);
    bool qwen2moe = !strcmp(arch, "qwen2moe"), qwen3moe = !strcmp(arch, "qwen3moe"), olmoe = !strcmp(arch, "olmoe");
    bool qwen2 = !strcmp(arch, "qwen2") || qwen2moe, qwen3 = !strcmp(arch, "qwen3") || qwen3moe;   /* their attention */
    bool gemma2 = !strcmp(arch, "gemma2"), gemma3 = !strcmp(arch, "gemma3"), phi3 = !strcmp(arch, "phi3");
    if (strcmp(arch, "llama") && !qwen2 && !qwen3 && !olmoe && !gemma2 && !gemma3 && !phi3)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported yet (kiln runs 'llama', 'qwen2', "
                            "'qwen3', 'qwen2moe', 'qwen3moe', 'olmoe', 'gemma2', 'gemma3', 'phi3' and 'gpt2' GGUF models: "
                            "Llama 2/3, Mistral, Mixtral, SmolLM, TinyLlama, Qwen2/2.5, Qwen3, Qwen2-MoE, Qwen3-MoE, OLMoE, "
                            "Gemma 2/3, Phi-3, GPT-2)", path, arch);
    if (kn_gguf_get_str(m->gguf, "general.name", &s)) snprintf(m->cfg.name, sizeof m->cfg.name, "%.*s", (int)s.len, s.ptr);
    kn_model_config *c = &m->cfg;
    c->arch = qwen2moe ? KN_ARCH_QWEN2MOE : qwen3moe ? KN_ARCH_QWEN3MOE : olmoe ? KN_ARCH_OLMOE : qwen2 ? KN_ARCH_QWEN2
            : qwen3 ? KN_ARCH_QWEN3 : gemma2 ? KN_ARCH_GEMMA2 : gemma3 ? KN_ARCH_GEMMA3 : phi3 ? KN_ARCH_PHI3 : KN_ARCH_LLAMA;
    c->dim = (int)gguf_int(m->gguf, arch, "embedding_length", 0);
    c->n_layers = (int)gguf_int(m->gguf, arch, "block_count", 0);
    c->ffn_dim = (int)gguf_int(m->gguf, arch, "feed_forward_length", 0);
    c->n_heads = (int)gguf_int(m->gguf, arch, "attention.head_count", 0);
    c->n_kv_heads = (int)gguf_int(m->gguf, arch, "attention.head_count_kv", c->n_heads);
    c->n_ctx_train = (int)gguf_int(m->gguf, arch, "context_length", 2048);
    c->rope_theta = gguf_f64(m->gguf, arch, "rope.freq_base", 10000.0);
    c->norm_eps = gguf_f64(m->gguf, arch, "attention.layer_norm_rms_epsilon", 1e-5);
    c->rope_freq_scale = 1.0;
    c->rope_neox = !strcmp(arch, "llama") ? false : true;   /* GGUF llama Q/K rows are permuted for paired
                                                              rotation; the others' are not (NEOX rope) */
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->ffn_dim <= 0 ||
        c->n_heads % c->n_kv_heads || c->n_layers > 1024 || c->dim > (1 << 20) || c->n_heads > (1 << 16))
        return kn_set_error(KN_ERR_FORMAT, "%s: inconsistent hyperparameters (dim %d, layers %d, heads %d/%d, ffn %d)",
                            path, c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim);
    int64_t hd = gguf_int(m->gguf, arch, "attention.key_length", c->dim % c->n_heads ? 0 : c->dim / c->n_heads);
    int64_t vd = gguf_int(m->gguf, arch, "attention.value_length", hd);
    if (hd <= 0 || hd > (1 << 16) || vd != hd)
        return kn_set_error(KN_ERR_FORMAT, "%s: head dim %lld (attention.key_length, else embedding_length %d / %d heads) "
                            "must be a positive integer equal to attention.value_length (%lld)", path, (long long)hd,
                            c->dim, c->n_heads, (long long)vd);
    c->head_dim = (int)hd;
    c->n_rot = (int)gguf_int(m->gguf, arch, "rope.dimension_count", c->head_dim);
    if (c->n_rot < 2 || c->n_rot > c->head_dim || c->n_rot % 2)
        return kn_set_error(KN_ERR_FORMAT, "%s: rope.dimension_count %d must be even and in [2, head_dim %d]",
                            path, c->n_rot, c->head_dim);
    if ((st = kn__gguf_arch_config(m, arch, path))) return st;     /* window, caps, LongRoPE (model_arch.c) */
    if (!m->rope_ff_short && (st = gguf_rope_scaling(m, arch, path))) return st;
    if ((st = gguf_embd_head(m, path))) return st;
    int64_t C = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn_dim;
    int64_t D = c->head_dim;
    m->out_norm = gguf_w(m, "output_norm.weight", 1, C, true, &st);
    for (int l = 0; l < c->n_layers && !st; l++) {
        kn__layer_w *L = &m->layers[l];
        char n[96];
#define W(field, nm, r, cc) snprintf(n, sizeof n, "blk.%d." nm ".weight", l); L->field = gguf_w(m, n, r, cc, true, &st); if (st) break;
        W(attn_norm, "attn_norm", 1, C) W(wo, "attn_output", C, qd) W(ffn_norm, "ffn_norm", 1, C)
        /* Phi-3: q|k|v in one attn_qkv, gate|up in one ffn_up [2F, C]; split by rows */
        snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", l);
        if (phi3 && kn_gguf_find_tensor(m->gguf, n)) {
            L->wq = gguf_rows(m, n, qd + 2 * kv, C, 0, qd, &st);
            L->wk = gguf_rows(m, n, qd + 2 * kv, C, qd, kv, &st);
            L->wv = gguf_rows(m, n, qd + 2 * kv, C, qd + kv, kv, &st);
            if (st) break;
        } else { W(wq, "attn_q", qd, C) W(wk, "attn_k", kv, C) W(wv, "attn_v", kv, C) }
        snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", l);
        if (kn_gguf_find_tensor(m->gguf, n)) {      /* mixture of experts (Mixtral is a llama file with them) */
            if ((st = kn__moe_gguf_layer(m, l, arch))) break;
            if (!strcmp(arch, "llama")) c->arch = KN_ARCH_MIXTRAL;
        } else if (phi3) {
            W(w2, "ffn_down", C, F)
            snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
            L->w1 = gguf_rows(m, n, 2 * F, C, 0, F, &st);
            L->w3 = gguf_rows(m, n, 2 * F, C, F, F, &st);
            if (st) break;
        } else { W(w1, "ffn_gate", F, C) W(w2, "ffn_down", C, F) W(w3, "ffn_up", F, C) }
#undef W
        /* vectors: required ones per architecture, else read when present */
#define V(field, nm, len, req) snprintf(n, sizeof n, "blk.%d." nm, l); \
        if ((req) || kn_gguf_find_tensor(m->gguf, n)) { L->field = gguf_f32(m, n, 0, len, &st); if (st) break; }
        V(bq, "attn_q.bias", qd, qwen2) V(bk, "attn_k.bias", kv, qwen2) V(bv, "attn_v.bias", kv, qwen2)
        V(q_norm, "attn_q_norm.weight", olmoe ? qd : D, qwen3 || olmoe || gemma3) V(k_norm, "attn_k_norm.weight", olmoe ? kv : D, qwen3 || olmoe || gemma3)
        V(attn_post_norm, "post_attention_norm.weight", C, gemma2 || gemma3)       /* Gemma: gains 1 + w as stored */
        V(ffn_post_norm, "post_ffw_norm.weight", C, gemma2 || gemma3)
#undef V
    }
    if (st) return kn__model_err_prefix(st, path);
    c->weight_type = m->layers[0].wq->dtype;
    /* the vocabulary, when the file carries one. Without it the model
     * evaluates token ids (kiln bench; `kiln quantize` of a Hugging Face
     * directory without tokenizer.json writes such a file), and generate,
     * chat, serve and perplexity ask for a tokenizer file (-z), as for a
     * directory without tokenizer.json */
    if (kn_gguf_get_str(m->gguf, "tokenizer.ggml.model", &s) && (st = kn_tokenizer_from_gguf(m->gguf, &m->tok)))
        return st;
    if (kn_gguf_get_str(m->gguf, "tokenizer.chat_template", &s)) {
        m->chat_template = malloc(s.len + 1);
        if (m->chat_template) { memcpy(m->chat_template, s.ptr, s.len); m->chat_template[s.len] = 0; }
    }
    return KN_OK;
}

static kn_status load_llama2c(kn_model *m, const char *path, const char *tok_path) {
    kn_status st = kn_llama2c_open(path, &m->l2c);
    if (st) return st;
    const kn_llama2c_config *lc = kn_llama2c_config_of(m->l2c);
    if (lc->version == 2)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: llama2.c int8 (version 2) checkpoints are not supported yet; export with --version 1 (fp32)", path);
    kn_model_config *c = &m->cfg;
    c->arch = KN_ARCH_LLAMA;
    c->dim = lc->dim; c->ffn_dim = lc->hidden_dim; c->n_layers = lc->n_layers;
    c->n_heads = lc->n_heads; c->n_kv_heads = lc->n_kv_heads; c->n_vocab = lc->vocab_size;
    c->n_ctx_train = lc->seq_len; c->head_dim = lc->head_size; c->n_rot = lc->head_size;
    c->rope_theta = 10000.0; c->rope_freq_scale = 1.0; c->norm_eps = 1e-5; c->rope_neox = false;
    c->tied_output = lc->shared_classifier; c->weight_type = KN_F32;
    const char *base = strrchr(path, '/');
    snprintf(c->name, sizeof c->name, "%s", base ? base + 1 : path);
    int64_t C = c->dim, kv = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn_dim, V = c->n_vocab;
    const float *sc;
    m->tok_embd = kn__model_wrap(m, KN_F32, V, C, kn_llama2c_layer(m->l2c, KN_L2C_TOKEN_EMBEDDING, 0, &sc), "token_embedding");
    m->out_norm = kn__model_wrap(m, KN_F32, 1, C, kn_llama2c_layer(m->l2c, KN_L2C_RMS_FINAL, 0, &sc), "rms_final");
    m->wout = kn__model_wrap(m, KN_F32, V, C, kn_llama2c_layer(m->l2c, KN_L2C_WCLS, 0, &sc), "wcls");
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        kn__layer_w *L = &m->layers[l];
#define W(field, id, r, cc) L->field = kn__model_wrap(m, KN_F32, r, cc, kn_llama2c_layer(m->l2c, id, l, &sc), #field);
        W(attn_norm, KN_L2C_RMS_ATT, 1, C) W(wq, KN_L2C_WQ, C, C) W(wk, KN_L2C_WK, kv, C) W(wv, KN_L2C_WV, kv, C)
        W(wo, KN_L2C_WO, C, C) W(ffn_norm, KN_L2C_RMS_FFN, 1, C) W(w1, KN_L2C_W1, F, C) W(w2, KN_L2C_W2, C, F)
        W(w3, KN_L2C_W3, F, C)
#undef W
    }
    if (kn_ctx_status(m->ctx)) return kn_ctx_status(m->ctx);
    if (!tok_path)
        return kn_set_error(KN_ERR_INVALID, "%s is a llama2.c checkpoint, which carries no tokenizer: pass one with -z tokenizer.bin", path);
    return kn__model_load_tokenizer(m, tok_path);
}

/* ---- device weights -------------------------------------------------------------------
 * A device backend cannot wrap the memory map, so what the graph reads is
 * copied over. Each host tensor goes one block of rows at a time: rows are
 * dequantized / widened to f32 (row), converted to the device dtype into blk
 * (at most UP_BLOCK bytes) and handed to the backend's copy_in, which queues
 * the transfer through its pinned staging buffers and returns; so host memory
 * stays at a few MB for any model size. */
#define UP_BLOCK ((size_t)4 << 20)

typedef struct {
    kn_model *m;
    kn_backend *be;
    float *row;          /* [row_cap] one row in f32           */
    char *blk;           /* [blk_cap] converted rows            */
    int64_t row_cap;
    size_t blk_cap;
    kn_status st;        /* first failure (sticky)              */
} kn__uploader;

/* rows x cols of a 1-d ([n]: one row) or 2-d tensor */
static void mat_dims(const kn_tensor *h, int64_t *rows, int64_t *cols) {
    *rows = h->ndim == 2 ? h->shape[0] : 1;
    *cols = h->ndim ? h->shape[h->ndim - 1] : 1;
}

static bool up_reserve(kn__uploader *u, int64_t cols, size_t row_bytes) {
    if (cols > u->row_cap) {
        float *r = realloc(u->row, sizeof(float) * (size_t)cols);
        if (!r) return false;
        u->row = r; u->row_cap = cols;
    }
    size_t want = row_bytes > UP_BLOCK ? row_bytes : UP_BLOCK;
    if (want > u->blk_cap) {
        char *b = realloc(u->blk, want);
        if (!b) return false;
        u->blk = b; u->blk_cap = want;
    }
    return true;
}

/* Host tensor h (f32/f16/bf16 with any strides, e.g. the transposed view of a
 * Conv1D weight, or contiguous quantized rows) converted to d's dtype into
 * rows [r0, r0 + rows(h)) of the device matrix d (copied as they are where
 * they are dense and already in that dtype). */
static void upload_rows(kn__uploader *u, kn_tensor *d, int64_t r0, kn_tensor *h) {
    if (u->st) return;
    int64_t rows, cols;
    mat_dims(h, &rows, &cols);
    const kn_dtype_info *hi = kn_dtype_get(h->dtype);
    kn_tensor *own = kn__storage_owner(h);
    const char *base = own->buf->data;
    size_t out_row = kn_dtype_get(d->dtype)->type_size * (size_t)cols;
    if (hi->is_quant ? !(kn_is_contiguous(h) && h->offset == 0) : !kn__model_half_or_f32(h->dtype)) {
        u->st = kn_set_error(KN_ERR_UNSUPPORTED, "tensor '%s': cannot upload a %s %s tensor (quantized weights must be "
                             "dense rows; other weights f32/f16/bf16)", h->name, kn_is_contiguous(h) ? "dense" : "strided",
                             hi->name);
        return;
    }
    /* the rows as stored: KN_WEIGHTS_FILE's blocks, or dense f32/f16/bf16 rows
     * already in d's dtype (the loop below would round-trip each element
     * through f32 to the same value) */
    if (d->dtype == h->dtype && kn_is_contiguous(h)) {
        size_t rb = kn_dtype_nbytes(h->dtype, cols);
        u->st = u->be->copy_in(u->be, (char *)d->buf->data + rb * (size_t)r0, base + kn_dtype_nbytes(h->dtype, h->offset),
                               rb * (size_t)rows);
        if (u->st) kn__model_err_prefix(u->st, h->name);
        return;
    }
    if (!up_reserve(u, cols, out_row)) { u->st = kn_set_error(KN_ERR_NOMEM, "out of host memory converting '%s'", h->name); return; }
    int64_t per = (int64_t)(u->blk_cap / out_row);
    size_t qrow = hi->is_quant ? kn_dtype_nbytes(h->dtype, cols) : 0;
    int64_t srow = h->ndim == 2 ? h->stride[0] : 0, scol = h->ndim ? h->stride[h->ndim - 1] : 1;
    for (int64_t r = 0; r < rows && !u->st; r += per) {
        int64_t n = rows - r < per ? rows - r : per;
        for (int64_t i = 0; i < n && !u->st; i++) {
            float *row = u->row;
            if (hi->is_quant) u->st = kn_dequantize_row(h->dtype, base + qrow * (size_t)(r + i), row, cols);
            else
                for (int64_t k = 0; k < cols; k++) row[k] = (float)kn__model_elem_f64(h->dtype, base, h->offset + (r + i) * srow + k * scol);
            char *dst = u->blk + out_row * (size_t)i;
            if (d->dtype == KN_F32) memcpy(dst, row, out_row);
            else {
                uint16_t *o = (uint16_t *)dst;
                if (d->dtype == KN_BF16) for (int64_t k = 0; k < cols; k++) o[k] = kn_fp32_to_bf16(row[k]);
                else for (int64_t k = 0; k < cols; k++) o[k] = kn_fp32_to_fp16(row[k]);
            }
        }
        if (!u->st) u->st = u->be->copy_in(u->be, (char *)d->buf->data + out_row * (size_t)(r0 + r), u->blk, out_row * (size_t)n);
    }
    if (u->st) kn__model_err_prefix(u->st, h->name);
}

/* Block types the CUDA backend multiplies by as stored (its
 * kn_cuda_quant_supported; this layer does not call the backend). */
static bool gpu_decodes(kn_dtype t) {
    return t == KN_Q4_0 || t == KN_Q4_1 || t == KN_Q5_0 || t == KN_Q5_1 || t == KN_Q8_0 || t == KN_Q4_K || t == KN_Q5_K ||
           t == KN_Q6_K;
}
/* The device dtype of a weight matrix stored as dt: dev_wdt, or with
 * KN_WEIGHTS_FILE (keep_file) dt itself where the device takes it. */
static kn_dtype mat_dtype(const kn_model *m, kn_dtype dt) {
    return m->keep_file && (gpu_decodes(dt) || kn__model_half_or_f32(dt)) ? dt : m->dev_wdt;
}

/* Device copy of host tensors hs[0..n) stacked by rows (n = 1: a plain copy)
 * in dtype dt. NULL (u->st set) on failure, NULL without error when hs[0]
 * is NULL. */
static kn_tensor *upload_stack_as(kn__uploader *u, kn_tensor *const *hs, int n, kn_dtype dt) {
    if (u->st || !hs[0]) return NULL;
    int64_t rows = 0, r, cols;
    for (int i = 0; i < n; i++) { mat_dims(hs[i], &r, &cols); rows += r; }
    int64_t shape[2] = {rows, cols};
    kn_tensor *d = n == 1 ? kn_empty(u->m->ctx, dt, hs[0]->ndim, hs[0]->shape) : kn_empty(u->m->ctx, dt, 2, shape);
    if (!d) {
        char pre[96];
        snprintf(pre, sizeof pre, "uploading '%s' to the %s backend", hs[0]->name, u->be->name);
        u->st = kn__model_err_prefix(kn_ctx_status(u->m->ctx) ? kn_ctx_status(u->m->ctx) : KN_ERR_NOMEM, pre);
        return NULL;
    }
    kn_set_name(d, hs[0]->name);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        upload_rows(u, d, at, hs[i]);
        mat_dims(hs[i], &r, &cols);
        at += r;
    }
    return u->st ? NULL : d;
}
/* ... a matrix in its device dtype (mat_dtype; stacked matrices share it),
 * else f32 */
static kn_tensor *upload_stack(kn__uploader *u, kn_tensor *const *hs, int n, bool matrix) {
    return hs[0] ? upload_stack_as(u, hs, n, matrix || n > 1 ? mat_dtype(u->m, hs[0]->dtype) : KN_F32) : NULL;
}
static kn_tensor *upload(kn__uploader *u, kn_tensor *h, bool matrix) { return upload_stack(u, &h, 1, matrix); }

/* Host f32 vector a|b|c (the q, k, v biases, stacked like their matrices),
 * in the host context; NULL when out of memory. */
static kn_tensor *host_cat3(kn_model *m, kn_tensor *a, kn_tensor *b, kn_tensor *c) {
    kn_tensor *v[3] = {a, b, c};
    int64_t n = 0;
    for (int i = 0; i < 3; i++) n += kn_numel(v[i]);
    float *p = kn__model_alloc(m, sizeof(float) * (size_t)n);
    if (!p) return NULL;
    int64_t at = 0;
    for (int i = 0; i < 3; i++) {        /* loaders made them contiguous f32 (kn__model_f32) */
        memcpy(p + at, (const char *)kn__storage_owner(v[i])->buf->data + sizeof(float) * (size_t)v[i]->offset,
               sizeof(float) * (size_t)kn_numel(v[i]));
        at += kn_numel(v[i]);
    }
    kn_tensor *t = kn_from_ptr(m->hctx, KN_F32, 1, &n, p);
    if (t) kn_set_name(t, "bqkv");
    return t;
}

/* Replaces the model's host weights by device copies in a new context on be
 * (the host context stays as m->hctx: tok_embd, used by embed(), lives there).
 * KN_LLM_FUSE=0 keeps wq, wk, wv and w1, w3 as separate matrices.
 *
 * A token table of f32/f16/bf16 gets a device copy in its own dtype
 * (embd_dev), so the graph gathers the rows embed() would make, exactly,
 * and only the ids cross the bus, where a 512-token prompt of an 8B model
 * otherwise waits for the host lookup and 8 MB of f32 rows (2x on a 4-layer
 * 8B-shaped prompt, H100, docs/PERF.md). A tied output matrix kept in that
 * dtype is the same table; an untied one is uploaded after every weight and
 * dropped when the device has no room for it. Quantized tables (the GPU has
 * no gather of blocks) and KN_LLM_DEVICE_EMBED=0 keep the host lookup. */
static kn_status to_device(kn_model *m, kn_backend *be) {
    m->hctx = m->ctx;
    m->ctx = kn_ctx_new(&(kn_ctx_opts){be});
    if (!m->ctx) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    bool fuse = !kn_env_get()->llm_nofuse;
    kn__uploader u = {m, be, NULL, NULL, 0, 0, KN_OK};
    kn_tensor *te = m->tok_embd;
    bool dev_embd = kn__model_half_or_f32(te->dtype) && !kn_env_get()->llm_host_embed, tied = m->wout == te;
    m->pos_embd = upload(&u, m->pos_embd, false);
    m->out_norm = upload(&u, m->out_norm, false);
    m->out_norm_b = upload(&u, m->out_norm_b, false);
    m->rope_ff = upload(&u, m->rope_ff, false);
    m->rope_mag = upload(&u, m->rope_mag, false);
    m->wout = upload(&u, m->wout, true);          /* tied: a device copy of tok_embd */
    if (dev_embd && tied && m->wout && m->wout->dtype == te->dtype) m->embd_dev = m->wout;
    for (int l = 0; l < m->cfg.n_layers && !u.st; l++) {
        kn__layer_w *L = &m->layers[l];
        bool same_qkv = L->wq && mat_dtype(m, L->wq->dtype) == mat_dtype(m, L->wk->dtype) &&
                        mat_dtype(m, L->wq->dtype) == mat_dtype(m, L->wv->dtype);      /* stacked rows share one dtype */
        bool all_b = L->bq && L->bk && L->bv, no_b = !L->bq && !L->bk && !L->bv;
        if (fuse && same_qkv && all_b && !(L->bqkv = host_cat3(m, L->bq, L->bk, L->bv))) u.st = KN_ERR_NOMEM;
        if (L->bqkv && L->wq) L->bq = L->bk = L->bv = NULL;                     /* Qwen2: bq|bk|bv [QD + 2 KD] */
        kn_tensor **vec[] = {&L->attn_norm, &L->attn_norm_b, &L->bq, &L->bk, &L->bv, &L->bqkv, &L->bo,
                             &L->q_norm, &L->k_norm, &L->ffn_norm, &L->ffn_norm_b, &L->b1, &L->b2,
                             &L->attn_post_norm, &L->ffn_post_norm};
        for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) *vec[i] = upload(&u, *vec[i], false);
        if (fuse && same_qkv && (no_b || all_b)) {
            kn_tensor *qkv[3] = {L->wq, L->wk, L->wv};
            L->wqkv = upload_stack(&u, qkv, 3, true);
            L->wq = L->wk = L->wv = NULL;
        } else {
            L->wq = upload(&u, L->wq, true); L->wk = upload(&u, L->wk, true); L->wv = upload(&u, L->wv, true);
            L->wqkv = upload(&u, L->wqkv, true);
        }
        L->wo = upload(&u, L->wo, true);
        if (fuse && L->w3 && !L->b1 && mat_dtype(m, L->w1->dtype) == mat_dtype(m, L->w3->dtype)) {
            kn_tensor *gu[2] = {L->w1, L->w3};
            L->w13 = upload_stack(&u, gu, 2, true);
            L->w1 = L->w3 = NULL;
        } else {
            L->w1 = upload(&u, L->w1, true); L->w3 = upload(&u, L->w3, true);
        }
        L->w2 = upload(&u, L->w2, true);
        kn_tensor **moe[] = {&L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_shexp, &L->up_shexp, &L->down_shexp};
        for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) *moe[i] = upload(&u, *moe[i], true);
        L->gate_inp = upload(&u, L->gate_inp, false);            /* the router stays f32: it picks the experts */
        L->gate_inp_shexp = upload(&u, L->gate_inp_shexp, false);
    }
    /* An untied table's copy goes last, and only where there is room for it:
     * it saves the host lookup, but a model that fits without it must load. */
    if (dev_embd && !m->embd_dev && !u.st) {
        m->embd_dev = upload_stack_as(&u, &te, 1, te->dtype);
        if (!m->embd_dev && u.st == KN_ERR_NOMEM) {
            u.st = KN_OK;
            kn_ctx_clear_status(m->ctx);
            if (kn_env_get()->debug) fprintf(stderr, "model: no device memory for a copy of the token table; the host looks the rows up\n");
        }
    }
    free(u.row);
    free(u.blk);
    return u.st;
}

/* zero a materialised tensor's storage (host memset, or zeros copied in) */
static kn_status zero_fill(kn_model *m, kn_tensor *t) {
    if (!m->on_device) { memset(t->buf->data, 0, t->buf->size); return KN_OK; }
    kn_backend *be = kn_ctx_backend(m->ctx);
    size_t n = t->buf->size, chunk = n < UP_BLOCK ? n : UP_BLOCK;
    void *z = calloc(1, chunk ? chunk : 1);
    if (!z) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_status st = KN_OK;
    for (size_t off = 0; off < n && !st; off += chunk)
        st = be->copy_in(be, (char *)t->buf->data + off, z, n - off < chunk ? n - off : chunk);
    free(z);
    return st;
}

/* ---- the forward graph --------------------------------------------------------------- */
static kn_tensor *widen(kn_model *m, kn_tensor *x) { return x && x->dtype != KN_F32 ? kn_cast(m->ctx, x, KN_F32) : x; }

/* x [T, in] @ W^T -> [T, out]. Weights in bf16/f16 meet f32 activations in
 * the backend's mixed-precision matmul; where activations are cast (the
 * device's prompt plan, KN_LLM_GPU_CAST=1) x goes to the weight dtype and
 * the product stays in it: lin_raw returns it so, lin widens it to f32. A
 * product split into q|k|v or gate|up is cut first and widened piece by
 * piece, so the widening fuses into the pieces' readers instead of writing
 * an f32 copy of the whole product. */
static kn_tensor *lin_raw(kn_model *m, kn_tensor *x, kn_tensor *w) {
    kn_ctx *ctx = m->ctx;
    kn_tensor *wt = kn_transpose(ctx, w, 0, 1);
    if (m->cast_acts && w && (w->dtype == KN_BF16 || w->dtype == KN_F16))
        return kn_matmul(ctx, kn_cast(ctx, x, w->dtype), wt);
    return kn_matmul(ctx, widen(m, x), wt);   /* a 16-bit attention output meets f32 or quantized weights */
}

static kn_tensor *lin(kn_model *m, kn_tensor *x, kn_tensor *w) { return widen(m, lin_raw(m, x, w)); }

static kn_tensor *lin_b(kn_model *m, kn_tensor *x, kn_tensor *w, kn_tensor *b) {
    kn_tensor *y = lin(m, x, w);
    return b ? kn_add(m->ctx, y, b) : y;
}

/* Tensor parallel: every rank's logits of its head rows [R, Vl] gathered
 * into [R, V] on every rank (rank r's columns at r * Vl; the rows past V,
 * zero weights, cut off). The gather runs along dim 0, so the columns go
 * there first: [Vl, R] -> [W * Vl, R]. */
static kn_tensor *gather_vocab(kn_model *m, kn_tensor *lg) {
    kn_ctx *ctx = m->ctx;
    kn_tensor *g = kn_all_gather(ctx, kn_contiguous(ctx, kn_transpose(ctx, lg, 0, 1)), m->tp);
    g = kn_narrow(ctx, g, 0, 0, m->cfg.n_vocab);
    return kn_copy(ctx, kn_transpose(ctx, g, 0, 1));   /* storage of its own: eval reads the logits' buffer */
}

/* The projections back to the residual stream (wo, w2): under tensor
 * parallelism each rank's product is a partial sum over its heads or FFN
 * columns, all-reduced before the bias (model_tp.c). */
static kn_tensor *lin_sum(kn_model *m, kn_tensor *x, kn_tensor *w, kn_tensor *b) {
    kn_tensor *y = lin(m, x, w);
    if (m->tp_world > 1) y = kn_all_reduce(m->ctx, y, m->tp, KN_DIST_SUM);
    return b ? kn_add(m->ctx, y, b) : y;
}

static kn_tensor *norm(kn_ctx *ctx, const kn_model_config *c, kn_tensor *x, kn_tensor *w, kn_tensor *b) {
    return c->arch == KN_ARCH_GPT2 ? kn_layer_norm(ctx, x, 1, w, b, c->norm_eps) : kn_rms_norm(ctx, x, 1, w, c->norm_eps);
}

/* The single-sequence caches [Hkv, n_ctx, D] of every layer, zeroed. On a
 * host backend they live in one anonymous mapping (kn__lazy_alloc), so their
 * pages cost memory only once written: a model used only through a kn_batch
 * (its own paged pool) does not pay for them. */
static kn_status make_caches(kn_model *m) {
    const kn_model_config *c = &m->cfg;
    kn_dtype kv_dt = m->kv_f16 ? KN_F16 : KN_F32;
    int64_t shape[3] = {c->n_kv_heads / (m->tp_world > 1 ? m->tp_world : 1), m->n_ctx, c->head_dim};   /* this rank's heads */
    size_t one = kn_dtype_nbytes(kv_dt, shape[0] * shape[1] * shape[2]);
    if (!m->on_device && !(m->kv_map = kn__lazy_alloc(one * 2 * (size_t)c->n_layers)))
        return kn_set_error(KN_ERR_NOMEM, "out of memory for the KV cache (%zu bytes); load with a smaller --ctx",
                            one * 2 * (size_t)c->n_layers);
    if (m->kv_map) m->kv_map_bytes = one * 2 * (size_t)c->n_layers;
    for (int l = 0; l < c->n_layers; l++) {
        kn__layer_w *L = &m->layers[l];
        if (m->kv_map) {
            L->k_cache = kn_from_ptr(m->ctx, kv_dt, 3, shape, (char *)m->kv_map + one * (size_t)(2 * l));
            L->v_cache = kn_from_ptr(m->ctx, kv_dt, 3, shape, (char *)m->kv_map + one * (size_t)(2 * l + 1));
        } else {
            L->k_cache = kn_empty(m->ctx, kv_dt, 3, shape);
            L->v_cache = kn_empty(m->ctx, kv_dt, 3, shape);
        }
        if (!L->k_cache || !L->v_cache) return kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM;
        kn_status st;
        if (!m->kv_map && ((st = zero_fill(m, L->k_cache)) || (st = zero_fill(m, L->v_cache)))) return st;
    }
    return KN_OK;
}

/* The dtype a prompt's attention runs in: where activations are cast for
 * 16-bit weights (the device's prompt plan), q and the cache rows are cast
 * to 16 bits (the f16 cache's own dtype, else the weights') so that the
 * flash kernels take the product, as bf16 autocast does; one-token steps,
 * weights kept as the file stores them (--gpu-dtype file: the CPU's
 * arithmetic on quantized blocks) and the others stay f32 (the decode
 * kernel reads f32 q against any cache).
 * The flash kernels take head dims 64 and 128 without window or softcap. */
static kn_dtype attn_half(const kn_model *m, int l, int64_t D) {
    if (!m->cast_acts || !m->on_device || m->keep_file || (m->dev_wdt != KN_BF16 && m->dev_wdt != KN_F16)) return KN_F32;
    if ((D != 64 && D != 128) || !kn__arch_attn_plain(m, l)) return KN_F32;
    return m->kv_f16 ? KN_F16 : m->dev_wdt;
}

/* Attention of one layer over the single-sequence caches: q [H, T, D],
 * k, v [Hkv, T, D] at positions pos are written into the caches, then the
 * rows see cache rows 0 .. S-1 causally. Out: [T, H, D] (a view). */
static kn_tensor *cache_attend(kn_model *m, int l, kn_tensor *q, kn_tensor *k, kn_tensor *v, kn_tensor *pos) {
    kn_ctx *ctx = m->ctx;
    kn__layer_w *L = &m->layers[l];
    int perm[3] = {1, 0, 2};
    if (m->kv_f16) { k = kn_cast(ctx, k, KN_F16); v = kn_cast(ctx, v, KN_F16); }
    kn_tensor *kc = kn_index_copy(ctx, L->k_cache, 1, pos, k);
    kn_tensor *vc = kn_index_copy(ctx, L->v_cache, 1, pos, v);
    kn_tensor *K = kn_slice_sym(ctx, kc, 1, 0, m->sym_S);                 /* [Hkv, S, D] */
    kn_tensor *Vv = kn_slice_sym(ctx, vc, 1, 0, m->sym_S);
    kn_dtype hd = q ? attn_half(m, l, q->shape[2]) : KN_F32;
    if (hd != KN_F32) { q = kn_cast(ctx, q, hd); K = kn_cast(ctx, K, hd); Vv = kn_cast(ctx, Vv, hd); }
    /* window and softcap per layer (model_arch.c; plain sdpa for the others) */
    kn_tensor *a = kn__arch_attn(m, l, kn_unsqueeze(ctx, q, 0), kn_unsqueeze(ctx, K, 0), kn_unsqueeze(ctx, Vv, 0));
    return kn_permute(ctx, kn_squeeze(ctx, a, 0), perm);                   /* [T, H, D] */
}

/* The forward graph over x [T, C] at positions pos [T] (the caches hold
 * the earlier rows), logits of the rows [R] of the last layer's output.
 * pg NULL: the model's single-sequence caches (built the first time); else
 * the rows belong to several sequences and attend through a paged KV pool
 * (batch_graph.c, kn__paged_attend). */
static kn_tensor *build_forward(kn_model *m, kn_tensor *x, kn_tensor *pos, kn_tensor *rows, const kn__paged *pg,
                                kn_status *zst) {
    kn_ctx *ctx = m->ctx;
    const kn_model_config *c = &m->cfg;
    bool gpt2 = c->arch == KN_ARCH_GPT2;
    int tpw = m->tp_world > 1 ? m->tp_world : 1;                          /* tensor parallel: this rank's heads */
    int64_t H = c->n_heads / tpw, Hkv = c->n_kv_heads / tpw, D = c->head_dim, F = c->ffn_dim / tpw;
    int64_t QD = H * D, KD = Hkv * D;
    *zst = KN_OK;
    if (!pg && !m->layers[0].k_cache && (*zst = make_caches(m))) return NULL;
    if (m->pos_embd) x = kn_add(ctx, x, kn_index_select(ctx, m->pos_embd, 0, pos));   /* + wpe[pos] */
    x = kn__arch_embed(m, x);                                              /* Gemma: * sqrt(C) */
    for (int l = 0; l < c->n_layers; l++) {
        kn__layer_w *L = &m->layers[l];
        kn_tensor *h = norm(ctx, c, x, L->attn_norm, L->attn_norm_b);
        kn_tensor *q, *k, *v;
        if (L->wqkv) {                                                      /* [T, QD + 2 KD] */
            kn_tensor *qkv = L->bqkv ? lin_b(m, h, L->wqkv, L->bqkv) : lin_raw(m, h, L->wqkv);
            /* a 16-bit attention (attn_half) of q in the product's own dtype:
             * rope rotates q's 16-bit rows, rounded once, where widening them
             * and narrowing the result cost a copy of q each way */
            bool q16 = !pg && !gpt2 && !L->q_norm && !L->k_norm && !m->rope_mag && c->arch != KN_ARCH_OLMOE &&
                       qkv->dtype != KN_F32 && attn_half(m, l, D) == qkv->dtype;
            q = kn_narrow(ctx, qkv, 1, 0, QD);
            if (!q16) q = widen(m, q);
            k = widen(m, kn_narrow(ctx, qkv, 1, QD, KD));
            v = widen(m, kn_narrow(ctx, qkv, 1, QD + KD, KD));
        } else {
            q = lin_b(m, h, L->wq, L->bq);
            k = lin_b(m, h, L->wk, L->bk);
            v = lin_b(m, h, L->wv, L->bv);
        }
        int perm[3] = {1, 0, 2};
        if (c->arch == KN_ARCH_OLMOE) {                                        /* OLMoE: over all of q [QD], k [KD] */
            q = kn_rms_norm(ctx, q, 1, L->q_norm, c->norm_eps);
            k = kn_rms_norm(ctx, k, 1, L->k_norm, c->norm_eps);
        }
        q = kn_reshape(ctx, q, 3, (int64_t[]){-1, H, D});                      /* [T, H, D] */
        k = kn_reshape(ctx, k, 3, (int64_t[]){-1, Hkv, D});                    /* [T, Hkv, D] */
        if (L->q_norm && c->arch != KN_ARCH_OLMOE) q = kn_rms_norm(ctx, q, 1, L->q_norm, c->norm_eps);  /* Qwen3: each head's D */
        if (L->k_norm && c->arch != KN_ARCH_OLMOE) k = kn_rms_norm(ctx, k, 1, L->k_norm, c->norm_eps);
        q = kn_permute(ctx, q, perm);                                          /* [H, T, D] */
        k = kn_permute(ctx, k, perm);                                          /* [Hkv, T, D] */
        v = kn_permute(ctx, kn_reshape(ctx, v, 3, (int64_t[]){-1, Hkv, D}), perm);
        if (!gpt2) {
            q = kn__arch_rope(m, l, q, pos);                                   /* model_arch.c: per layer type */
            k = kn__arch_rope(m, l, k, pos);
        }
        kn_tensor *a = pg ? kn__paged_attend(m, l, q, k, v, pos, pg) : cache_attend(m, l, q, k, v, pos);   /* [T, H, D] */
        a = kn_reshape(ctx, a, 2, (int64_t[]){-1, QD});                        /* a view when T = 1 */
        x = kn_add(ctx, x, kn__arch_post_norm(m, lin_sum(m, a, L->wo, L->bo), L->attn_post_norm));
        h = norm(ctx, c, x, L->ffn_norm, L->ffn_norm_b);
        kn_tensor *f;
        if (gpt2) f = kn_gelu_tanh(ctx, lin_b(m, h, L->w1, L->b1));
        else if (L->gate_inp) f = kn__moe_ffn(m, L, h);                   /* model_moe.c: experts, [T, C] */
        else if (L->w13) {                                                  /* [T, 2F]: gate | up */
            kn_tensor *gu = lin_raw(m, h, L->w13);
            f = kn_mul(ctx, kn__arch_gate_act(m, widen(m, kn_narrow(ctx, gu, 1, 0, F))), widen(m, kn_narrow(ctx, gu, 1, F, F)));
        } else f = kn_mul(ctx, kn__arch_gate_act(m, lin(m, h, L->w1)), lin(m, h, L->w3));
        x = kn_add(ctx, x, kn__arch_post_norm(m, L->gate_inp ? f : lin_sum(m, f, L->w2, L->b2), L->ffn_post_norm));
        if (!x) { *zst = kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE; return NULL; }
    }
    kn_tensor *xl = kn_index_select(ctx, x, 0, rows);                      /* [R, C] */
    xl = norm(ctx, c, xl, m->out_norm, m->out_norm_b);
    kn_tensor *logits = kn__arch_logits(m, lin(m, xl, m->wout));          /* [R, V] (tensor parallel: [R, Vl]) */
    if (m->tp_world > 1) logits = gather_vocab(m, logits);                 /* model_tp.c split the head */
    if (!logits) *zst = kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
    return logits;
}

kn_tensor *kn__model_forward(kn_model *m, kn_tensor *x, kn_tensor *pos, kn_tensor *rows, const kn__paged *pg, kn_status *st) {
    return build_forward(m, x, pos, rows, pg, st);
}

/* the gathered rows of ids (model_impl.h) */
kn_tensor *kn__model_token_rows(kn_model *m, kn_tensor *ids) {
    kn_tensor *x = kn_index_select(m->ctx, m->embd_dev, 0, ids);
    return x && x->dtype != KN_F32 ? kn_cast(m->ctx, x, KN_F32) : x;
}
/* The token rows x [T, C] f32 of a forward over the first T inputs (one:
 * T = 1 fixed, else the symbol): the host-filled x_in, or on a device with
 * embd_dev the gather of the ids' rows, widened as embed() widens them. */
static kn_tensor *token_rows(kn_model *m, bool one) {
    kn_ctx *ctx = m->ctx;
    kn_tensor *in = m->ids_in ? m->ids_in : m->x_in;
    in = one ? kn_narrow(ctx, in, 0, 0, 1) : kn_slice_sym(ctx, in, 0, 0, m->sym_T);
    return m->ids_in ? kn__model_token_rows(m, in) : in;
}

/* Two plans over the same weights and caches: any T <= n_batch (symbolic T,
 * S, R: prompts, and decode when the step plan is off), and the one-token
 * step (T = R = 1 fixed). KN_LLM_STEP_PLAN=0 builds only the first. */
static kn_status build_graph(kn_model *m) {
    kn_ctx *ctx = m->ctx;
    int64_t C = m->cfg.dim, NB = m->n_batch;
    m->sym_T = kn_sym_new(ctx, "T", NB);
    m->sym_S = kn_sym_new(ctx, "S", m->n_ctx);
    m->sym_R = kn_sym_new(ctx, "R", NB);
    if (m->embd_dev) m->ids_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    else m->x_in = kn_input(ctx, KN_F32, 2, (int64_t[]){NB, C});
    m->pos_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    m->rows_in = kn_input(ctx, KN_I32, 1, (int64_t[]){NB});
    if (!(m->x_in || m->ids_in) || !m->pos_in || !m->rows_in) return kn_ctx_status(ctx);
    kn_status zst;
    if ((zst = zero_fill(m, m->pos_in)) || (zst = zero_fill(m, m->rows_in)) ||   /* every index valid from the start */
        (m->ids_in && (zst = zero_fill(m, m->ids_in))))
        return zst;
    /* the prompt plan casts activations for its GEMMs when a step plan takes
     * the decode (cast_prefill); the step plan, and the batch engine's graphs
     * built later, keep cast_acts */
    bool step_plan = NB > 1 && !kn_env_get()->llm_no_step_plan, dec_cast = m->cast_acts;
    if (step_plan) m->cast_acts = m->cast_prefill;
    m->logits = build_forward(m, token_rows(m, false), kn_slice_sym(ctx, m->pos_in, 0, 0, m->sym_T),
                              kn_slice_sym(ctx, m->rows_in, 0, 0, m->sym_R), NULL, &zst);
    m->cast_acts = dec_cast;
    if (!m->logits) return zst;
    m->plan = kn_plan_new(ctx, 1, &m->logits, NULL);
    if (!m->plan) return kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
    if (step_plan) {
        m->logits1 = build_forward(m, token_rows(m, true), kn_narrow(ctx, m->pos_in, 0, 0, 1),
                                   kn_narrow(ctx, m->rows_in, 0, 0, 1), NULL, &zst);
        if (!m->logits1) return zst;
        m->plan1 = kn_plan_new(ctx, 1, &m->logits1, NULL);
        if (!m->plan1) return kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
        /* on a device, the step again with the sampling candidates as its
         * only outputs (the logits stay in the arena) */
        int64_t kt = m->cfg.n_vocab < KN_MODEL_TOP_MAX ? m->cfg.n_vocab : KN_MODEL_TOP_MAX;
        if (m->on_device && kn_env_get()->llm_top) {
            kn_tensor *lt = build_forward(m, token_rows(m, true), kn_narrow(ctx, m->pos_in, 0, 0, 1),
                                          kn_narrow(ctx, m->rows_in, 0, 0, 1), NULL, &zst);
            if (!lt) return zst;
            m->top_vals1 = kn_cast(ctx, kn_topk(ctx, lt, kt, true, &m->top_ids1), KN_F32);
            kn_tensor *outs[2] = {m->top_ids1, m->top_vals1};
            m->plan1_top = m->top_vals1 ? kn_plan_new(ctx, 2, outs, NULL) : NULL;
            if (!m->plan1_top) return kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE;
        }
    }
    return KN_OK;
}

/* ---- public ----------------------------------------------------------------------------- */
static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

kn_status kn_model_load(const char *path, const kn_model_opts *opts, kn_model **out) {
    *out = NULL;
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_model_load: no path");
    static const char *const wd_names[] = {"auto", "bf16", "f16", "f32", "file"};
    kn_weight_dtype wd = opts ? opts->weight_dtype : KN_WEIGHTS_AUTO;
    if ((unsigned)wd > (unsigned)KN_WEIGHTS_FILE)
        return kn_set_error(KN_ERR_INVALID, "kn_model_load: weight_dtype %d is not one of KN_WEIGHTS_AUTO, KN_WEIGHTS_BF16, "
                            "KN_WEIGHTS_F16, KN_WEIGHTS_F32, KN_WEIGHTS_FILE", (int)wd);
    kn_backend *be = opts && opts->backend ? opts->backend : kn_backend_default();
    bool dev = be->device != KN_DEVICE_HOST;
    if (!dev && wd != KN_WEIGHTS_AUTO && wd != KN_WEIGHTS_FILE)     /* a host backend always uses the file's weights */
        return kn_set_error(KN_ERR_INVALID, "kn_model_load: weight_dtype %s applies to device backends; the %s backend "
                            "reads the file's weights in place (leave weight_dtype at KN_WEIGHTS_AUTO, or load onto a "
                            "device backend such as kn_backend_cuda())", wd_names[wd], be->name);
    kn_model *m = calloc(1, sizeof *m);
    if (!m) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    /* loaders wrap the file in place, which needs a host context */
    kn_ctx_opts co = {dev ? kn_backend_cpu() : be};
    m->ctx = kn_ctx_new(&co);
    kn_status st = m->ctx ? KN_OK : KN_ERR_NOMEM;
    /* a directory, or by magic: "GGUF", llm.c GPT-2 (int32 20240326),
     * safetensors (u64 header length, then '{'); other .bin files are llama2.c */
    unsigned char mg[12];
    size_t got = 0;
    bool dir = kn__is_dir(path);
    if (!dir && kn__model_file_magic(path, "model file", mg, &got)) {
        bool missing = errno == ENOENT;
        char msg[900];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        kn_model_free(m);
        return kn_set_error(KN_ERR_IO, "%s%s", msg, missing ? " (`make run` downloads the default model into models/)" : "");
    }
    const char *tok_path = opts ? opts->tokenizer_path : NULL;
    int32_t magic = 0;
    if (!dir) memcpy(&magic, mg, 4);
    m->kv_f16 = opts && opts->kv_f16;
    if (!st) {
        if (!dir && kn__is_safetensors_magic(mg, got) && kn__is_kiln_gpt_ckpt(path)) st = kn__load_kiln_ckpt(m, path, tok_path);
        else if (dir || kn__is_safetensors_magic(mg, got) || ends_with(path, ".safetensors")) st = kn__load_hf(m, path, tok_path);
        else if (got >= 4 && !memcmp(mg, "GGUF", 4)) {
            st = load_gguf(m, path);
            if (!st && tok_path) {                  /* an explicit tokenizer replaces the file's */
                kn_tokenizer_free(m->tok);
                m->tok = NULL;
                st = kn__model_load_tokenizer(m, tok_path);
            }
        } else if (got >= 4 && magic == KN_LLMC_GPT2_MAGIC) st = kn__load_llmc_gpt2(m, path, tok_path);
        else if (ends_with(path, ".bin") || tok_path) st = load_llama2c(m, path, tok_path);
        else st = kn_set_error(KN_ERR_FORMAT, "%s: not a GGUF, llm.c GPT-2, safetensors or llama2.c (.bin) model file (magic %02x %02x %02x %02x)",
                               path, mg[0], mg[1], mg[2], mg[3]);
    }
    if (!st) {
        kn_model_config *c = &m->cfg;
        int want = opts && opts->n_ctx > 0 ? opts->n_ctx : (c->n_ctx_train < 4096 ? c->n_ctx_train : 4096);
        if (want > c->n_ctx_train && !(opts && opts->n_ctx > 0)) want = c->n_ctx_train;
        m->n_ctx = want > 0 ? want : 512;
        if (m->pos_embd && m->n_ctx > c->n_ctx_train)
            st = kn_set_error(KN_ERR_INVALID, "context length %d exceeds the %d learned positions of this GPT-2 model; use --ctx %d or less",
                              m->n_ctx, c->n_ctx_train, c->n_ctx_train);
        if (!st) st = kn__arch_finish(m);          /* LongRoPE: factors for this context */
        m->n_batch = opts && opts->n_batch > 0 ? opts->n_batch : 512;
        if (m->n_batch > m->n_ctx) m->n_batch = m->n_ctx;
        /* every weight leaf once (a tied output matrix is the embedding itself);
         * the graph's inputs and caches are made later */
        int64_t np = 0;
        for (int32_t i = 0; i < m->ctx->n_all; i++) {
            kn_tensor *t = m->ctx->all[i];
            if (t->op != KN_OP_NONE) continue;
            bool seen = false;                  /* a second wrap of the same memory (llama2.c's shared classifier) */
            for (int32_t j = 0; j < i && !seen && t->buf; j++)
                seen = m->ctx->all[j]->op == KN_OP_NONE && m->ctx->all[j]->buf && m->ctx->all[j]->buf->data == t->buf->data;
            if (!seen) np += kn_numel(t);
        }
        c->n_params = np;
        c->run_weight_type = c->weight_type;
        if (!st && opts && opts->dist) st = kn__model_tp_split(m, opts->dist);   /* after the count: the whole model's */
        if (!st && !dev) st = kn__model_fuse_host(m);                         /* model_fuse.c: q|k|v, gate|up */
        if (!st && dev) {
            m->on_device = true;
            m->dev_wdt = wd == KN_WEIGHTS_F32 ? KN_F32 : wd == KN_WEIGHTS_F16 ? KN_F16 : KN_BF16;
            m->keep_file = wd == KN_WEIGHTS_FILE;
            m->cast_acts = kn_env_get()->llm_gpu_cast;
            m->cast_prefill = m->cast_acts || !kn_env_get()->llm_no_prefill_cast;
            c->run_weight_type = mat_dtype(m, c->weight_type);
            m->pos_stage = malloc(sizeof(int32_t) * (size_t)m->n_batch);
            m->rows_stage = malloc(sizeof(int32_t) * (size_t)m->n_batch);
            st = m->pos_stage && m->rows_stage ? to_device(m, be) : kn_set_error(KN_ERR_NOMEM, "out of memory");
            if (!st && !m->embd_dev && !(m->x_stage = malloc(sizeof(float) * (size_t)m->n_batch * (size_t)c->dim)))
                st = kn_set_error(KN_ERR_NOMEM, "out of memory");
        }
        m->row_buf = malloc(sizeof(float) * (size_t)c->dim);
        if (!st) st = m->row_buf ? build_graph(m) : KN_ERR_NOMEM;
    }
    if (st) { kn_model_free(m); return st; }
    *out = m;
    return KN_OK;
}

void kn_model_free(kn_model *m) {
    if (!m) return;
    kn_plan_free(m->plan);
    kn_plan_free(m->plan1);
    kn_plan_free(m->plan1_top);
    free(m->top_logits); free(m->top_scratch);
    kn_ctx_free(m->ctx);
    kn_ctx_free(m->hctx);
    kn_tokenizer_free(m->tok);
    kn_gguf_close(m->gguf);
    kn_llama2c_close(m->l2c);
    kn_llmc_gpt2_close(m->llmc);
    kn_safetensors_close(m->st);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->chat_template);
    free(m->row_buf);
    free(m->x_stage); free(m->pos_stage); free(m->rows_stage);
    kn__lazy_free(m->kv_map, m->kv_map_bytes);
    free(m);
}

const kn_model_config *kn_model_get_config(const kn_model *m) { return &m->cfg; }
const kn_tokenizer *kn_model_tokenizer(const kn_model *m) { return m->tok; }
int kn_model_n_ctx(const kn_model *m) { return m->n_ctx; }
kn_backend *kn_model_backend(const kn_model *m) { return kn_ctx_backend(m->ctx); }
const char *kn_model_chat_template(const kn_model *m) { return m->chat_template; }

/* every id inside the vocabulary (the host lookup's check, also made before
 * a device gathers the rows) */
static kn_status check_ids(const kn_model *m, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.n_vocab)
            return kn_set_error(KN_ERR_INVALID, "token id %d is outside the vocabulary [0, %d)", tokens[i], m->cfg.n_vocab);
    return KN_OK;
}
/* x rows = token embeddings, dequantized on the host straight into the input
 * (a host backend) or into the staging copy x (a device) */
static kn_status embed(kn_model *m, const int32_t *tokens, int n, float *x) {
    const kn_tensor *te = m->tok_embd;
    int64_t C = m->cfg.dim;
    size_t row_bytes = kn_dtype_nbytes(te->dtype, C);
    kn_status st = check_ids(m, tokens, n);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        const char *row = (const char *)te->buf->data + row_bytes * (size_t)tokens[i];
        if ((st = kn_dequantize_row(te->dtype, row, x + (int64_t)i * C, C))) return st;
    }
    return KN_OK;
}

kn_status kn__model_embed(kn_model *m, const int32_t *tokens, int n, float *x) { return embed(m, tokens, n, x); }
uint64_t kn__model_eval_count(const kn_model *m) { return m->n_evals; }
void kn_model_plan_stats(const kn_model *m, kn_plan_stats *out) {
    /* run counts of both plans; the shape (kernels, memory) of the one a
     * decode step runs */
    kn_plan_get_stats(m ? (m->plan1 ? m->plan1 : m->plan) : NULL, out);
    if (m && m->plan1) {
        kn_plan_stats p;
        kn_plan_get_stats(m->plan, &p);
        out->runs += p.runs; out->replays += p.replays; out->captures += p.captures; out->graphs += p.graphs;
    }
}

/* kn_model_eval, or with top (one token, a step plan with candidates) the
 * candidate plan, whose outputs the caller reads */
static kn_status eval(kn_model *m, const int32_t *tokens, int n, int n_past, float *logits, bool all_logits, bool top) {
    if (n <= 0) return kn_set_error(KN_ERR_INVALID, "kn_model_eval: no tokens");
    m->n_evals++;                      /* even a failed call may have written cache rows */
    if (n_past < 0 || n_past + n > m->n_ctx)
        return kn_set_error(KN_ERR_LIMIT, "context full: %d cached + %d new tokens exceed the context length %d; "
                            "start a new conversation or load with a larger --ctx", n_past, n, m->n_ctx);
    int V = m->cfg.n_vocab;
    kn_backend *be = kn_ctx_backend(m->ctx);
    float *x = m->on_device ? m->x_stage : m->x_in->buf->data;     /* NULL where the device gathers (ids_in) */
    int32_t *pos = m->on_device ? m->pos_stage : m->pos_in->buf->data;
    int32_t *rows = m->on_device ? m->rows_stage : m->rows_in->buf->data;
    for (int done = 0; done < n;) {
        int T = n - done < m->n_batch ? n - done : m->n_batch;
        kn_status st = m->ids_in ? check_ids(m, tokens + done, T) : embed(m, tokens + done, T, x);
        if (st) return st;
        for (int i = 0; i < T; i++) pos[i] = n_past + done + i;
        bool last_chunk = done + T == n;
        int R = all_logits ? T : 1;
        for (int i = 0; i < R; i++) rows[i] = all_logits ? i : T - 1;
        if ((st = kn_sym_set(m->ctx, m->sym_T, T)) || (st = kn_sym_set(m->ctx, m->sym_S, n_past + done + T)) ||
            (st = kn_sym_set(m->ctx, m->sym_R, R)))
            return st;
        if (m->on_device &&   /* only the rows this call uses cross the bus */
            ((st = m->ids_in ? be->copy_in(be, m->ids_in->buf->data, tokens + done, sizeof(int32_t) * (size_t)T)
                             : be->copy_in(be, m->x_in->buf->data, x, sizeof(float) * (size_t)T * (size_t)m->cfg.dim)) ||
             (st = be->copy_in(be, m->pos_in->buf->data, pos, sizeof(int32_t) * (size_t)T)) ||
             (st = be->copy_in(be, m->rows_in->buf->data, rows, sizeof(int32_t) * (size_t)R))))
            return st;
        bool step = T == 1 && R == 1 && m->plan1;   /* the one-token plan */
        if (top) return kn_plan_run(m->plan1_top);
        if ((st = kn_plan_run(step ? m->plan1 : m->plan))) return st;
        const float *lg = (step ? m->logits1 : m->logits)->buf->data;
        float *dst = all_logits ? logits + (size_t)done * V : last_chunk ? logits : NULL;
        size_t nb = sizeof(float) * (size_t)(all_logits ? T : 1) * (size_t)V;
        if (dst && m->on_device) { if ((st = be->copy_out(be, dst, lg, nb))) return st; }
        else if (dst) memcpy(dst, lg, nb);
        done += T;
    }
    return KN_OK;
}

kn_status kn_model_eval(kn_model *m, const int32_t *tokens, int n, int n_past, float *logits, bool all_logits) {
    return eval(m, tokens, n, n_past, logits, all_logits, false);
}

bool kn_model_top_on_device(const kn_model *m) { return m && m->plan1_top; }

kn_status kn_model_eval_top(kn_model *m, const int32_t *tokens, int n, int n_past, int k, int32_t *ids, float *vals) {
    int V = m->cfg.n_vocab;
    if (k < 1 || k > KN_MODEL_TOP_MAX || k > V || !ids || !vals)
        return kn_set_error(KN_ERR_INVALID, "kn_model_eval_top: k = %d must be in [1, %d] (and at most the vocabulary, %d), "
                            "with room for k ids and logits", k, KN_MODEL_TOP_MAX, V);
    if (n == 1 && m->plan1_top) {
        kn_backend *be = kn_ctx_backend(m->ctx);
        kn_status st = eval(m, tokens, 1, n_past, NULL, false, true);
        if (!st) st = be->copy_out(be, ids, m->top_ids1->buf->data, sizeof(int32_t) * (size_t)k);
        if (!st) st = be->copy_out(be, vals, m->top_vals1->buf->data, sizeof(float) * (size_t)k);
        return st;
    }
    if (!m->top_logits) m->top_logits = malloc(sizeof(float) * (size_t)V);
    if (!m->top_scratch) m->top_scratch = malloc(sizeof(int32_t) * (size_t)V);
    if (!m->top_logits || !m->top_scratch) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_status st = eval(m, tokens, n, n_past, m->top_logits, false, false);
    if (!st) kn__top_select(m->top_logits, V, k, m->top_scratch, ids, vals);
    return st;
}

/* kiln info's last line: what kiln makes of the file, by loading it with a
 * 16-token context on the CPU (weights stay in the file's mapping), or why
 * it cannot run it */
static void print_summary(const char *path, FILE *f) {
    kn_model_opts o = {.n_ctx = 16, .n_batch = 1, .backend = kn_backend_cpu()};
    kn_model *m = NULL;
    if (kn_model_load(path, &o, &m) != KN_OK) { fprintf(f, "kiln cannot run it: %s\n", kn_last_error()); return; }
    char d[640];
    kn__arch_describe(m, d, sizeof d);
    fprintf(f, "kiln runs it as: %s\n", d);
    kn_model_free(m);
}

static kn_status print_info_hf(const char *path, FILE *f) {
    kn_status st = kn__print_info_hf(path, f);
    if (!st) print_summary(path, f);
    return st;
}

kn_status kn_model_print_info(const char *path, void *fp) {
    FILE *f = fp ? fp : stdout;
    if (kn__is_dir(path)) return print_info_hf(path, f);
    unsigned char mg[12];
    size_t got;
    kn_status fst = kn__model_file_magic(path, "model file", mg, &got);
    if (fst) return fst;
    int32_t magic;
    memcpy(&magic, mg, 4);
    if (kn__is_safetensors_magic(mg, got) && kn__is_kiln_gpt_ckpt(path)) return kn__print_info_kiln_ckpt(path, f);
    if (kn__is_safetensors_magic(mg, got) || ends_with(path, ".safetensors")) return print_info_hf(path, f);
    if (got >= 4 && magic == KN_LLMC_GPT2_MAGIC) return kn__print_info_llmc(path, f);
    if (got >= 4 && !memcmp(mg, "GGUF", 4)) {
        kn_gguf *g;
        kn_status st = kn_gguf_open(path, &g);
        if (st) return st;
        kn_gguf_print(g, f);
        kn__moe_print_info(g, f);              /* model_moe.c: experts, when the file has them */
        kn_tokenizer *tok = NULL;
        if (kn_tokenizer_from_gguf(g, &tok) == KN_OK) {
            fprintf(f, "tokenizer: %d tokens, bos %d, eos %d\n", kn_tokenizer_n_vocab(tok), kn_tokenizer_bos(tok), kn_tokenizer_eos(tok));
            kn_tokenizer_free(tok);
        } else fprintf(f, "tokenizer: none usable (%s)\n", kn_last_error());
        kn_gguf_str s;
        if (kn_gguf_get_str(g, "tokenizer.chat_template", &s)) fprintf(f, "chat template:\n%.*s\n", (int)s.len, s.ptr);
        kn_gguf_close(g);
        print_summary(path, f);
        return KN_OK;
    }
    kn_llama2c *l;
    kn_status st = kn_llama2c_open(path, &l);
    if (st) return st;
    const kn_llama2c_config *c = kn_llama2c_config_of(l);
    fprintf(f, "llama2.c checkpoint (version %d)\n  dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, seq_len %d, %s classifier\n",
            c->version, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
            c->shared_classifier ? "shared" : "separate");
    for (int w = 0; w < KN_L2C_COUNT; w++) {
        const kn_llama2c_weight *wt = kn_llama2c_weight_of(l, (kn_llama2c_wid)w);
        if (wt) fprintf(f, "  %-16s %s x%d [%lld, %lld]\n", wt->name, kn_dtype_name(wt->dtype), wt->n_layers, (long long)wt->rows, (long long)wt->cols);
    }
    kn_llama2c_close(l);
    return KN_OK;
}
