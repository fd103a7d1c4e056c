/* model_hf.c: loading GPT-2 and Hugging Face models into a kn_model (the
 * struct and the forward graph are in model_impl.h / model.c).
 *
 *   - llm.c GPT-2 checkpoints (gpt2_124M.bin, version 3 fp32 / 5 bf16):
 *     weights used in place from the memory map; norms, biases and the
 *     position table converted to f32. The checkpoint has no tokenizer: pass
 *     tokenizer_path (a GGUF GPT-2 vocabulary encodes and decodes; llm.c's
 *     gpt2_tokenizer.bin only decodes).
 *   - Hugging Face safetensors + config.json (a model directory, or a
 *     .safetensors path with config.json beside it): "LlamaForCausalLM"
 *     (q/k rows in HF order, so RoPE rotates halves: rope_neox),
 *     "Qwen2ForCausalLM" (Llama with q/k/v biases), "Qwen3ForCausalLM"
 *     (Llama with per-head q/k RMS norms, head_dim from the config),
 *     "MistralForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM" (and the
 *     language model of "Gemma3ForConditionalGeneration": text_config, tensors
 *     language_model.model.*; the vision tower is ignored),
 *     "Phi3ForCausalLM" (what they add is read by model_arch.c; here the
 *     tensor names: Gemma's four norms per layer with (1 + w) gains, Phi-3's
 *     fused qkv_proj / gate_up_proj split by rows in place) and
 *     "GPT2LMHeadModel" (Conv1D weights stored [in, out]). Dtypes F32, F16,
 *     BF16. Rope settings are read from the top level (rope_theta,
 *     rope_scaling: transformers 4) or from rope_parameters (transformers 5).
 *
 * The tokenizer is tokenizer.json beside config.json when there is one
 * (kn_tokenizer_load_hf), unless tokenizer_path names another.
 * Non-goals: sharded checkpoints (model.safetensors.index.json),
 * RoPE scaling other than "linear", "llama3", "yarn" and Phi-3's "longrope"
 * (dynamic), Qwen2's use_sliding_window (refused), other architectures.
 *
 * Letters: C width, H heads, Hkv kv heads, D head dim, F ffn width, V vocab,
 * P positions, L layers.
 */
#include "llm/model_impl.h"   /* defines: struct kn_model, kn__model_mat, kn__model_f32 */
#include "formats/hfconfig.h"     /* defines: kn_json */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

bool kn__is_dir(const char *path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b && b[1] ? b + 1 : path;
}

/* ---- llm.c GPT-2 -------------------------------------------------------------- */
kn_status kn__load_llmc_gpt2(kn_model *m, const char *path, const char *tok_path) {
    kn_status st = kn_llmc_gpt2_open(path, &m->llmc);
    if (st) return kn__model_err_prefix(st, path);
    const kn_llmc_gpt2_config *g = kn_llmc_gpt2_config_of(m->llmc);
    kn_dtype dt = kn_llmc_gpt2_dtype(m->llmc);
    size_t es = kn_dtype_get(dt)->type_size;
    kn_model_config *c = &m->cfg;
    c->arch = KN_ARCH_GPT2;
    c->dim = g->channels; c->n_layers = g->n_layers; c->n_heads = c->n_kv_heads = g->n_heads;
    c->head_dim = g->channels / g->n_heads; c->ffn_dim = 4 * g->channels; c->n_vocab = g->vocab_size;
    c->n_ctx_train = g->max_seq_len; c->n_rot = 0; c->rope_theta = 0; c->rope_freq_scale = 1; c->rope_neox = false;
    c->norm_eps = 1e-5; c->tied_output = true; c->weight_type = dt;
    snprintf(c->name, sizeof c->name, "%s", base_name(path));
    int64_t C = c->dim, F = c->ffn_dim, V = c->n_vocab;
#define P(id) ((const char *)kn_llmc_gpt2_param(m->llmc, id)->data)
    m->tok_embd = kn__model_mat(m, dt, V, C, P(KN_GPT2_WTE), false, "wte");   /* first V of Vp rows */
    m->pos_embd = kn__model_f32(m, dt, g->max_seq_len, C, P(KN_GPT2_WPE), "wpe");
    m->out_norm = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LNFW), "lnfw");
    m->out_norm_b = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LNFB), "lnfb");
    m->wout = m->tok_embd;
    if (!m->tok_embd || !m->pos_embd || !m->out_norm || !m->out_norm_b)
        return kn__model_err_prefix(kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM, path);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; l < c->n_layers; l++) {
        kn__layer_w *L = &m->layers[l];
        L->attn_norm = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LN1W) + es * (size_t)(l * C), "ln1w");
        L->attn_norm_b = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LN1B) + es * (size_t)(l * C), "ln1b");
        L->wqkv = kn__model_mat(m, dt, 3 * C, C, P(KN_GPT2_QKVW) + es * (size_t)(l * 3 * C * C), false, "qkvw");
        L->bqkv = kn__model_f32(m, dt, 0, 3 * C, P(KN_GPT2_QKVB) + es * (size_t)(l * 3 * C), "qkvb");
        L->wo = kn__model_mat(m, dt, C, C, P(KN_GPT2_ATTPROJW) + es * (size_t)(l * C * C), false, "attprojw");
        L->bo = kn__model_f32(m, dt, 0, C, P(KN_GPT2_ATTPROJB) + es * (size_t)(l * C), "attprojb");
        L->ffn_norm = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LN2W) + es * (size_t)(l * C), "ln2w");
        L->ffn_norm_b = kn__model_f32(m, dt, 0, C, P(KN_GPT2_LN2B) + es * (size_t)(l * C), "ln2b");
        L->w1 = kn__model_mat(m, dt, F, C, P(KN_GPT2_FCW) + es * (size_t)(l * F * C), false, "fcw");
        L->b1 = kn__model_f32(m, dt, 0, F, P(KN_GPT2_FCB) + es * (size_t)(l * F), "fcb");
        L->w2 = kn__model_mat(m, dt, C, F, P(KN_GPT2_FCPROJW) + es * (size_t)(l * C * F), false, "fcprojw");
        L->b2 = kn__model_f32(m, dt, 0, C, P(KN_GPT2_FCPROJB) + es * (size_t)(l * C), "fcprojb");
        if (!L->attn_norm || !L->attn_norm_b || !L->wqkv || !L->bqkv || !L->wo || !L->bo || !L->ffn_norm ||
            !L->ffn_norm_b || !L->w1 || !L->b1 || !L->w2 || !L->b2)
            return kn__model_err_prefix(kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM, path);
    }
#undef P
    /* no tokenizer in the file: the model still evaluates token ids */
    return tok_path ? kn__model_load_tokenizer(m, tok_path) : KN_OK;
}

kn_status kn__print_info_llmc(const char *path, void *fp) {
    FILE *f = fp;
    kn_llmc_gpt2 *g;
    kn_status st = kn_llmc_gpt2_open(path, &g);
    if (st) return kn__model_err_prefix(st, path);
    const kn_llmc_gpt2_config *c = kn_llmc_gpt2_config_of(g);
    fprintf(f, "llm.c GPT-2 checkpoint (%s)\n  layers %d, heads %d, channels %d, vocab %d (padded %d), max_seq_len %d, %lld parameters\n",
            kn_dtype_name(kn_llmc_gpt2_dtype(g)), c->n_layers, c->n_heads, c->channels, c->vocab_size,
            c->padded_vocab_size, c->max_seq_len, (long long)kn_llmc_gpt2_numel(g));
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) {
        const kn_llmc_gpt2_tensor *t = kn_llmc_gpt2_param(g, (kn_gpt2_param)p);
        fprintf(f, "  %-10s [", t->name);
        for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        fprintf(f, "]\n");
    }
    fprintf(f, "tokenizer: none in the file (pass -z ggml-vocab-gpt-2.gguf to encode; llm.c's gpt2_tokenizer.bin only decodes)\n");
    kn_llmc_gpt2_close(g);
    return KN_OK;
}

/* ---- Hugging Face: paths and config -------------------------------------------------- */
typedef struct {
    char weights[4096], config[4096];
} hf_paths;

static kn_status hf_resolve(const char *path, hf_paths *p) {
    if (kn__is_dir(path)) {
        snprintf(p->weights, sizeof p->weights, "%s/model.safetensors", path);
        snprintf(p->config, sizeof p->config, "%s/config.json", path);
        if (!exists(p->weights)) {
            char idx[4200];
            snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
            if (exists(idx))
                return kn_set_error(KN_ERR_UNSUPPORTED, "%s: sharded safetensors checkpoints are not supported; "
                                    "merge the shards into one model.safetensors", idx);
            return kn_set_error(KN_ERR_IO, "%s: no model.safetensors in this directory", path);
        }
    } else {
        snprintf(p->weights, sizeof p->weights, "%s", path);
        const char *slash = strrchr(path, '/');
        if (slash) snprintf(p->config, sizeof p->config, "%.*s/config.json", (int)(slash - path), path);
        else snprintf(p->config, sizeof p->config, "config.json");
    }
    if (!exists(p->config))
        return kn_set_error(KN_ERR_IO, "%s: missing; a safetensors model needs its Hugging Face config.json beside "
                            "the weights (%s)", p->config, p->weights);
    return KN_OK;
}

/* architectures[0], else model_type, else NULL */
static const char *hf_arch(const kn_json *j) {
    int64_t a = kn_json_get(j, 0, "architectures");
    if (kn_json_kind(j, a) == KN_JSON_ARRAY && kn_json_count(j, a) > 0) {
        const char *s = kn_json_str(j, kn_json_at(j, a, 0), NULL);
        if (s) return s;
    }
    const char *mt = kn_json_get_str(j, 0, "model_type");
    if (mt && !strcmp(mt, "llama")) return "LlamaForCausalLM";
    if (mt && !strcmp(mt, "gpt2")) return "GPT2LMHeadModel";
    if (mt && !strcmp(mt, "qwen2")) return "Qwen2ForCausalLM";
    if (mt && !strcmp(mt, "qwen3")) return "Qwen3ForCausalLM";
    if (mt && !strcmp(mt, "mixtral")) return "MixtralForCausalLM";
    if (mt && !strcmp(mt, "qwen2_moe")) return "Qwen2MoeForCausalLM";
    if (mt && !strcmp(mt, "qwen3_moe")) return "Qwen3MoeForCausalLM";
    if (mt && !strcmp(mt, "olmoe")) return "OlmoeForCausalLM";
    if (mt && !strcmp(mt, "mistral")) return "MistralForCausalLM";
    if (mt && !strcmp(mt, "gemma2")) return "Gemma2ForCausalLM";
    if (mt && !strcmp(mt, "gemma3_text")) return "Gemma3ForCausalLM";
    if (mt && !strcmp(mt, "phi3")) return "Phi3ForCausalLM";
    return mt;
}

/* ---- Hugging Face: tensors ------------------------------------------------------------- */
typedef struct {
    kn_model *m;
    const char *file;        /* the .safetensors path, for messages */
    const char *config;
    const char *prefix;      /* GPT-2: "transformer." or ""; others "model." (Gemma 3 with vision: its language model's) */
    kn_status st;
} hf_loader;

/* The tensor `name` with file shape [d0] (d1 = 0) or [d0, d1]; NULL with h->st
 * set when it is missing (and required) or its shape or dtype is wrong. */
static const kn_st_tensor *hf_get(hf_loader *h, const char *name, int64_t d0, int64_t d1, bool required) {
    if (h->st) return NULL;
    const kn_st_tensor *t = kn_safetensors_find(h->m->st, name);
    if (!t) {
        if (required)
            h->st = kn_set_error(KN_ERR_FORMAT, "%s: no tensor '%s' (required by %s); is the checkpoint complete and of the "
                                 "architecture config.json names?", h->file, name, h->config);
        return NULL;
    }
    int nd = d1 ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        char got[128] = "", want[64];
        size_t o = 0;
        for (int i = 0; i < t->ndim && o < sizeof got - 24; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (nd == 2) snprintf(want, sizeof want, "%lld, %lld", (long long)d0, (long long)d1);
        else snprintf(want, sizeof want, "%lld", (long long)d0);
        h->st = kn_set_error(KN_ERR_FORMAT, "%s: tensor '%s' has shape [%s] but %s implies [%s]; the config and the weights "
                             "do not belong together", h->file, name, got, h->config, want);
        return NULL;
    }
    if (t->dtype != KN_F32 && t->dtype != KN_F16 && t->dtype != KN_BF16) {
        h->st = kn_set_error(KN_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; kiln loads F32, F16 and BF16 safetensors",
                             h->file, name, kn_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

static kn_tensor *hf_mat(hf_loader *h, const char *name, int64_t out, int64_t in, bool in_out, bool required) {
    const kn_st_tensor *t = hf_get(h, name, in_out ? in : out, in_out ? out : in, required);
    if (!t) return NULL;
    kn_tensor *w = kn__model_mat(h->m, t->dtype, out, in, t->data, in_out, name);
    if (!w) h->st = kn__model_err_prefix(KN_ERR_NOMEM, h->file);
    return w;
}

static kn_tensor *hf_vec(hf_loader *h, const char *name, int64_t rows, int64_t n, bool required) {
    const kn_st_tensor *t = hf_get(h, name, rows ? rows : n, rows ? n : 0, required);
    if (!t) return NULL;
    kn_tensor *v = kn__model_f32(h->m, t->dtype, rows, n, t->data, name);
    if (!v) h->st = kn__model_err_prefix(KN_ERR_NOMEM, h->file);
    return v;
}

/* kn__moe_get_fn over hf_get (model_moe.c stacks the experts' matrices) */
static const void *hf_moe_get(void *ud, const char *name, int64_t rows, int64_t cols, bool required, kn_dtype *dt,
                              kn_status *st) {
    hf_loader *h = ud;
    const kn_st_tensor *t = hf_get(h, name, rows, cols, required);
    *st = h->st;
    if (t) *dt = t->dtype;
    return t ? t->data : NULL;
}

/* rows [r0, r0 + rows) of the matrix `name` [total, in] (Phi-3's fused
 * projections), wrapped in place like hf_mat */
static kn_tensor *hf_mat_rows(hf_loader *h, const char *name, int64_t total, int64_t in, int64_t r0, int64_t rows) {
    const kn_st_tensor *t = hf_get(h, name, total, in, true);
    if (!t) return NULL;
    size_t es = kn_dtype_get(t->dtype)->type_size;
    kn_tensor *w = kn__model_mat(h->m, t->dtype, rows, in, (const char *)t->data + es * (size_t)(r0 * in), false, name);
    if (!w) h->st = kn__model_err_prefix(KN_ERR_NOMEM, h->file);
    return w;
}

/* an RMS norm gain [n]; plus1: Gemma's (1 + w), made an f32 copy */
static kn_tensor *hf_gain(hf_loader *h, const char *name, int64_t n, bool plus1) {
    kn_tensor *v = hf_vec(h, name, 0, n, true);
    if (v && plus1 && !(v = kn__arch_gain_plus1(h->m, v))) h->st = kn__model_err_prefix(KN_ERR_NOMEM, h->file);
    return v;
}

static bool cfg_int(const kn_json *j, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v = def;
    int64_t n = kn_json_get(j, 0, key);
    if (n >= 0 && kn_json_kind(j, n) != KN_JSON_NULL && !kn_json_int(j, n, &v)) return false;
    *out = v;
    return v >= lo && v <= hi;
}

#define CFG_INT(key, def, lo, hi, dst)                                                                         \
    do {                                                                                                       \
        int64_t v_;                                                                                            \
        if (!cfg_int(j, key, def, lo, hi, &v_))                                                                \
            return kn_set_error(KN_ERR_FORMAT, "%s: \"%s\" is missing or out of range (%lld..%lld)", cfgp, key, \
                                (long long)(lo), (long long)(hi));                                             \
        dst = (int)v_;                                                                                         \
    } while (0)

/* Qwen2 marks the layers that use a sliding window in layer_types (transformers
 * 5), or implies them: use_sliding_window with a sliding_window, from layer
 * max_window_layers on. kiln attends to the whole context, so such a config
 * is refused rather than run differently from the model it describes. */
static kn_status hf_no_sliding_window(const kn_json *j, const char *cfgp, int n_layers) {
    int64_t lt = kn_json_get(j, 0, "layer_types");
    int first = -1;
    if (kn_json_kind(j, lt) == KN_JSON_ARRAY) {
        for (int64_t i = 0; i < kn_json_count(j, lt) && first < 0; i++) {
            const char *t = kn_json_str(j, kn_json_at(j, lt, i), NULL);
            if (t && strcmp(t, "full_attention")) first = (int)i;
        }
    } else {
        bool on = false;
        int64_t sw = kn_json_get(j, 0, "sliding_window"), mwl = n_layers;
        kn_json_get_bool(j, 0, "use_sliding_window", &on);
        int64_t n = kn_json_get(j, 0, "max_window_layers");
        if (n >= 0 && !kn_json_int(j, n, &mwl)) mwl = 0;
        if (on && sw >= 0 && kn_json_kind(j, sw) != KN_JSON_NULL && mwl < n_layers) first = mwl < 0 ? 0 : (int)mwl;
    }
    if (first >= 0)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: layer %d uses sliding-window attention (use_sliding_window / "
                            "layer_types), which kiln does not implement; only full attention is supported (set "
                            "\"use_sliding_window\": false if the model was trained without it)", cfgp, first);
    return KN_OK;
}

/* l is in the integer array `key` of the config */
static bool hf_in_list(const kn_json *j, const char *key, int l) {
    int64_t a = kn_json_get(j, 0, key), v;
    if (kn_json_kind(j, a) != KN_JSON_ARRAY) return false;
    for (int64_t i = 0; i < kn_json_count(j, a); i++)
        if (kn_json_int(j, kn_json_at(j, a, i), &v) && v == l) return true;
    return false;
}

/* Mixture-of-experts hyperparameters (none for the dense architectures):
 * Mixtral num_local_experts and intermediate_size (the experts' width), the
 * weights always renormalised; Qwen2-MoE / Qwen3-MoE num_experts,
 * moe_intermediate_size, norm_topk_prob, decoder_sparse_step and
 * mlp_only_layers (dense layers of intermediate_size), Qwen2-MoE's
 * shared_expert_intermediate_size; OLMoE num_experts, intermediate_size,
 * norm_topk_prob. */
static kn_status hf_moe_config(kn_model *m, const kn_json *j, const char *cfgp, int *sparse_step) {
    kn_model_config *c = &m->cfg;
    kn_arch a = c->arch;
    if (a != KN_ARCH_MIXTRAL && a != KN_ARCH_QWEN2MOE && a != KN_ARCH_QWEN3MOE && a != KN_ARCH_OLMOE) return KN_OK;
    bool qmoe = a == KN_ARCH_QWEN2MOE || a == KN_ARCH_QWEN3MOE;
    /* Mixtral and transformers 5's Qwen3-MoE write num_local_experts, the Hub's Qwen/OLMoE configs num_experts */
    const char *ne = kn_json_get(j, 0, "num_experts") >= 0 ? "num_experts" : "num_local_experts";
    CFG_INT(ne, -1, 1, 4096, c->n_expert);
    CFG_INT("num_experts_per_tok", -1, 1, c->n_expert, c->n_expert_used);
    CFG_INT(qmoe ? "moe_intermediate_size" : "intermediate_size", -1, 1, 1 << 24, c->expert_ffn_dim);
    if (a == KN_ARCH_QWEN2MOE) CFG_INT("shared_expert_intermediate_size", 0, 0, 1 << 24, c->shared_ffn_dim);
    if (qmoe) CFG_INT("decoder_sparse_step", 1, 1, 1024, *sparse_step);
    bool norm = a == KN_ARCH_MIXTRAL;
    if (a != KN_ARCH_MIXTRAL) kn_json_get_bool(j, 0, "norm_topk_prob", &norm);
    c->expert_norm = norm;
    int64_t sw = kn_json_get(j, 0, "sliding_window"), cq = kn_json_get(j, 0, "clip_qkv");
    if (a == KN_ARCH_MIXTRAL && sw >= 0 && kn_json_kind(j, sw) != KN_JSON_NULL)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: sliding_window is set; kiln attends to the whole context and does "
                            "not implement Mixtral's sliding-window attention (set it to null if the model does not use it)", cfgp);
    if (a == KN_ARCH_OLMOE && cq >= 0 && kn_json_kind(j, cq) != KN_JSON_NULL)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: clip_qkv is not supported (OLMoE without it only)", cfgp);
    return KN_OK;
}

/* Llama, Qwen2 and Qwen3 (arch says which): the same blocks; Qwen2 adds
 * q/k/v biases (always), Qwen3 q_norm / k_norm [D] and attention_bias. */
static kn_status hf_llama(kn_model *m, const kn_json *j, hf_loader *h, kn_arch arch) {
    kn_model_config *c = &m->cfg;
    const char *cfgp = h->config;
    c->arch = arch;
    CFG_INT("hidden_size", -1, 1, 1 << 20, c->dim);
    CFG_INT("num_hidden_layers", -1, 1, 1024, c->n_layers);
    CFG_INT("num_attention_heads", -1, 1, 1 << 16, c->n_heads);
    CFG_INT("num_key_value_heads", c->n_heads, 1, c->n_heads, c->n_kv_heads);
    CFG_INT("intermediate_size", -1, 1, 1 << 24, c->ffn_dim);
    CFG_INT("vocab_size", -1, 1, 1 << 24, c->n_vocab);
    CFG_INT("max_position_embeddings", 2048, 1, 1 << 24, c->n_ctx_train);
    CFG_INT("head_dim", c->dim / c->n_heads, 1, 1 << 16, c->head_dim);
    if (c->n_heads % c->n_kv_heads || c->head_dim % 2)
        return kn_set_error(KN_ERR_FORMAT, "%s: %d heads are not a multiple of %d key/value heads, or head_dim %d is odd",
                            cfgp, c->n_heads, c->n_kv_heads, c->head_dim);
    double eps = 1e-6, theta = 10000.0;
    kn_json_get_f64(j, 0, "rms_norm_eps", &eps);
    /* transformers 5 writes rope_parameters {rope_theta, rope_type, factor, ...}
     * where 4 wrote rope_theta and rope_scaling at the top level */
    int64_t rp = kn_json_get(j, 0, "rope_parameters");
    if (kn_json_kind(j, rp) != KN_JSON_OBJECT) rp = -1;
    if (!kn_json_get_f64(j, 0, "rope_theta", &theta) && rp >= 0) kn_json_get_f64(j, rp, "rope_theta", &theta);
    if (!(theta > 0) || isinf(theta)) return kn_set_error(KN_ERR_FORMAT, "%s: rope_theta %g must be positive", cfgp, theta);
    if (arch == KN_ARCH_QWEN2 || arch == KN_ARCH_QWEN3) {
        kn_status sw = hf_no_sliding_window(j, cfgp, c->n_layers);
        if (sw) return sw;
    }
    c->norm_eps = eps; c->rope_theta = theta; c->rope_freq_scale = 1.0;
    c->n_rot = c->head_dim;
    c->rope_neox = true;                 /* HF q/k rows are not permuted: rotate halves */
    bool gemma = arch == KN_ARCH_GEMMA2 || arch == KN_ARCH_GEMMA3, phi3 = arch == KN_ARCH_PHI3, rope_done = false;
    if (arch >= KN_ARCH_MISTRAL) {       /* window, caps, scales, rope per layer type (model_arch.c) */
        kn_status ac = kn__hf_arch_config(m, j, cfgp, &rope_done);
        if (ac) return ac;
    }
    const char *act = kn_json_get_str(j, 0, "hidden_act");
    if (act && strcmp(act, "silu") && !gemma)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (Llama uses silu)", cfgp, act);
    int64_t rs = rope_done ? -1 : kn_json_get(j, 0, "rope_scaling");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT && !rope_done) rs = rp;
    const char *rtype = rs >= 0 ? kn_json_get_str(j, rs, "rope_type") : NULL;
    if (rs >= 0 && !rtype) rtype = kn_json_get_str(j, rs, "type");
    if (rs >= 0 && rtype && !strcmp(rtype, "default")) rs = -1;      /* plain rope */
    if (kn_json_kind(j, rs) == KN_JSON_OBJECT) {
        const char *type = rtype;
        double factor = 0;
        bool known = type && (!strcmp(type, "linear") || !strcmp(type, "llama3") || !strcmp(type, "yarn"));
        if (!known || !kn_json_get_f64(j, rs, "factor", &factor) || !(factor > 0) || isinf(factor))
            return kn_set_error(KN_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported; kiln implements "
                                "\"linear\", \"llama3\" and \"yarn\" with a positive factor (and Phi-3's \"longrope\")", cfgp, type ? type : "?");
        snprintf(c->rope_scaling, sizeof c->rope_scaling, "%s", type);
        if (!strcmp(type, "linear")) c->rope_freq_scale = 1.0 / factor;
        else {
            int half = c->n_rot / 2;
            double orig = c->n_ctx_train;
            kn_json_get_f64(j, rs, "original_max_position_embeddings", &orig);
            float *ff = kn__model_alloc(m, sizeof(float) * (size_t)half);
            if (!ff) return KN_ERR_NOMEM;
            double ms = 1.0;
            if (!strcmp(type, "llama3")) {
                double lo = 1, hi = 4;
                kn_json_get_f64(j, rs, "low_freq_factor", &lo);
                kn_json_get_f64(j, rs, "high_freq_factor", &hi);
                if (!(hi > lo) || !(lo > 0) || !(orig >= 1))
                    return kn_set_error(KN_ERR_FORMAT, "%s: llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0 "
                                        "and original_max_position_embeddings >= 1 (got %g, %g, %g)", cfgp, hi, lo, orig);
                kn__rope_ff_llama3(ff, c->n_rot, c->rope_theta, factor, lo, hi, orig);
            } else {
                double bf = 32, bs = 1, af = 0;
                kn_json_get_f64(j, rs, "beta_fast", &bf);
                kn_json_get_f64(j, rs, "beta_slow", &bs);
                if (!(bf > 0) || !(bs > 0) || !(orig >= 1) || factor < 1)
                    return kn_set_error(KN_ERR_FORMAT, "%s: yarn rope_scaling needs factor >= 1, positive beta_fast/beta_slow "
                                        "and original_max_position_embeddings >= 1", cfgp);
                ms = kn__rope_ff_yarn(ff, c->n_rot, c->rope_theta, factor, orig, bf, bs);
                double msc = 0, msa = 0;     /* DeepSeek style: ratio of two mscales */
                if (kn_json_get_f64(j, rs, "mscale", &msc) && kn_json_get_f64(j, rs, "mscale_all_dim", &msa) && msc && msa)
                    ms = (0.1 * msc * log(factor) + 1) / (0.1 * msa * log(factor) + 1);
                if (kn_json_get_f64(j, rs, "attention_factor", &af) && af > 0) ms = af;
                bool trunc = true;
                if (kn_json_get_bool(j, rs, "truncate", &trunc) && !trunc)
                    return kn_set_error(KN_ERR_UNSUPPORTED, "%s: yarn rope_scaling with \"truncate\": false is not supported", cfgp);
            }
            kn_status st = kn__model_set_rope_ff(m, ff, ms);
            if (st) return st;
        }
    }
    bool q2 = arch == KN_ARCH_QWEN2 || arch == KN_ARCH_QWEN2MOE, olmoe = arch == KN_ARCH_OLMOE;
    bool tied = gemma, bias = q2, qk_norm = arch == KN_ARCH_QWEN3 || arch == KN_ARCH_QWEN3MOE || olmoe || arch == KN_ARCH_GEMMA3;
    kn_json_get_bool(j, 0, "tie_word_embeddings", &tied);
    if (!q2) kn_json_get_bool(j, 0, "attention_bias", &bias);   /* Qwen2: always biased */
    int sparse_step = 1;
    kn_status mst = hf_moe_config(m, j, cfgp, &sparse_step);
    if (mst) return mst;
    int64_t C = c->dim, QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t F = c->ffn_dim, V = c->n_vocab;
    char n[200];                         /* tensor names: h->prefix is "model." (Gemma 3 with vision: its text part's) */
#define NMP(s) (snprintf(n, sizeof n, "%s" s, h->prefix), n)
    m->tok_embd = hf_mat(h, NMP("embed_tokens.weight"), V, C, false, true);
    m->out_norm = hf_gain(h, NMP("norm.weight"), C, gemma);
#undef NMP
    m->wout = hf_mat(h, "lm_head.weight", V, C, false, !tied);
    if (h->st) return h->st;
    c->tied_output = m->wout == NULL;
    if (!m->wout) m->wout = m->tok_embd;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers && !h->st; l++) {
        kn__layer_w *L = &m->layers[l];
#define NM(s) (snprintf(n, sizeof n, "%slayers.%d." s, h->prefix, l), n)
        L->attn_norm = hf_gain(h, NM("input_layernorm.weight"), C, gemma);
        if (phi3) {                      /* q|k|v rows in one matrix, split in place */
            L->wq = hf_mat_rows(h, NM("self_attn.qkv_proj.weight"), QD + 2 * KD, C, 0, QD);
            L->wk = hf_mat_rows(h, n, QD + 2 * KD, C, QD, KD);
            L->wv = hf_mat_rows(h, n, QD + 2 * KD, C, QD + KD, KD);
        } else {
            L->wq = hf_mat(h, NM("self_attn.q_proj.weight"), QD, C, false, true);
            L->wk = hf_mat(h, NM("self_attn.k_proj.weight"), KD, C, false, true);
            L->wv = hf_mat(h, NM("self_attn.v_proj.weight"), KD, C, false, true);
        }
        L->bq = hf_vec(h, NM("self_attn.q_proj.bias"), 0, QD, bias);
        L->bk = hf_vec(h, NM("self_attn.k_proj.bias"), 0, KD, bias);
        L->bv = hf_vec(h, NM("self_attn.v_proj.bias"), 0, KD, bias);
        if (qk_norm) {       /* OLMoE: over the whole projection */
            L->q_norm = hf_gain(h, NM("self_attn.q_norm.weight"), olmoe ? QD : c->head_dim, gemma);
            L->k_norm = hf_gain(h, NM("self_attn.k_norm.weight"), olmoe ? KD : c->head_dim, gemma);
        }
        L->wo = hf_mat(h, NM("self_attn.o_proj.weight"), C, QD, false, true);
        if (gemma) {                     /* norms around both blocks */
            L->attn_post_norm = hf_gain(h, NM("post_attention_layernorm.weight"), C, true);
            L->ffn_norm = hf_gain(h, NM("pre_feedforward_layernorm.weight"), C, true);
            L->ffn_post_norm = hf_gain(h, NM("post_feedforward_layernorm.weight"), C, true);
        } else L->ffn_norm = hf_vec(h, NM("post_attention_layernorm.weight"), 0, C, true);
        if (c->n_expert && (l + 1) % sparse_step == 0 && !hf_in_list(j, "mlp_only_layers", l)) {   /* model_moe.c */
            if (!h->st) h->st = kn__moe_hf_layer(m, l, arch == KN_ARCH_MIXTRAL ? NM("block_sparse_moe.") : NM("mlp."),
                                                 "experts", hf_moe_get, h);
            continue;
        }
        if (phi3) {                      /* gate|up rows in one matrix */
            L->w1 = hf_mat_rows(h, NM("mlp.gate_up_proj.weight"), 2 * F, C, 0, F);
            L->w3 = hf_mat_rows(h, n, 2 * F, C, F, F);
        } else {
            L->w1 = hf_mat(h, NM("mlp.gate_proj.weight"), F, C, false, true);
            L->w3 = hf_mat(h, NM("mlp.up_proj.weight"), F, C, false, true);
        }
        L->w2 = hf_mat(h, NM("mlp.down_proj.weight"), C, F, false, true);
#undef NM
    }
    if (h->st) return h->st;
    c->weight_type = m->layers[0].wq->dtype;
    return KN_OK;
}

static kn_status hf_gpt2(kn_model *m, const kn_json *j, hf_loader *h) {
    kn_model_config *c = &m->cfg;
    const char *cfgp = h->config;
    c->arch = KN_ARCH_GPT2;
    CFG_INT("n_embd", -1, 1, 1 << 20, c->dim);
    CFG_INT("n_layer", -1, 1, 1024, c->n_layers);
    CFG_INT("n_head", -1, 1, 1 << 16, c->n_heads);
    CFG_INT("vocab_size", -1, 1, 1 << 24, c->n_vocab);
    int ctx_def;
    CFG_INT("n_ctx", 1024, 1, 1 << 24, ctx_def);
    CFG_INT("n_positions", ctx_def, 1, 1 << 24, c->n_ctx_train);
    CFG_INT("n_inner", 4 * (int64_t)c->dim, 1, 1 << 24, c->ffn_dim);
    if (c->dim % c->n_heads)
        return kn_set_error(KN_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d", cfgp, c->n_heads, c->dim);
    c->n_kv_heads = c->n_heads; c->head_dim = c->dim / c->n_heads; c->n_rot = 0;
    c->rope_theta = 0; c->rope_freq_scale = 1; c->rope_neox = false;
    double eps = 1e-5;
    kn_json_get_f64(j, 0, "layer_norm_epsilon", &eps);
    c->norm_eps = eps;
    const char *act = kn_json_get_str(j, 0, "activation_function");
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: activation_function \"%s\" is not supported (GPT-2 uses gelu_new, the tanh form)",
                            cfgp, act);
    bool tied = true;
    kn_json_get_bool(j, 0, "tie_word_embeddings", &tied);
    /* GPT2LMHeadModel saves "transformer.h.0...", the bare GPT2Model "h.0..." */
    h->prefix = kn_safetensors_find(m->st, "transformer.wte.weight") ? "transformer." : "";
    int64_t C = c->dim, F = c->ffn_dim, V = c->n_vocab;
    char n[200];
#define NM(s) (snprintf(n, sizeof n, "%s" s, h->prefix), n)
    m->tok_embd = hf_mat(h, NM("wte.weight"), V, C, false, true);
    m->pos_embd = hf_vec(h, NM("wpe.weight"), c->n_ctx_train, C, true);
    m->out_norm = hf_vec(h, NM("ln_f.weight"), 0, C, true);
    m->out_norm_b = hf_vec(h, NM("ln_f.bias"), 0, C, true);
#undef NM
    m->wout = hf_mat(h, "lm_head.weight", V, C, false, !tied);
    if (h->st) return h->st;
    c->tied_output = m->wout == NULL;
    if (!m->wout) m->wout = m->tok_embd;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers && !h->st; l++) {
        kn__layer_w *L = &m->layers[l];
#define NM(s) (snprintf(n, sizeof n, "%sh.%d." s, h->prefix, l), n)
        /* Conv1D: weights stored [in, out] */
        L->attn_norm = hf_vec(h, NM("ln_1.weight"), 0, C, true);
        L->attn_norm_b = hf_vec(h, NM("ln_1.bias"), 0, C, true);
        L->wqkv = hf_mat(h, NM("attn.c_attn.weight"), 3 * C, C, true, true);
        L->bqkv = hf_vec(h, NM("attn.c_attn.bias"), 0, 3 * C, true);
        L->wo = hf_mat(h, NM("attn.c_proj.weight"), C, C, true, true);
        L->bo = hf_vec(h, NM("attn.c_proj.bias"), 0, C, true);
        L->ffn_norm = hf_vec(h, NM("ln_2.weight"), 0, C, true);
        L->ffn_norm_b = hf_vec(h, NM("ln_2.bias"), 0, C, true);
        L->w1 = hf_mat(h, NM("mlp.c_fc.weight"), F, C, true, true);
        L->b1 = hf_vec(h, NM("mlp.c_fc.bias"), 0, F, true);
        L->w2 = hf_mat(h, NM("mlp.c_proj.weight"), C, F, true, true);
        L->b2 = hf_vec(h, NM("mlp.c_proj.bias"), 0, C, true);
#undef NM
    }
    if (h->st) return h->st;
    c->weight_type = m->tok_embd->dtype;
    return KN_OK;
}

/* tokenizer.json beside config.json, as Hugging Face downloads ship it
 * (absent: the model works on ids). An explicit tok_path takes precedence. */
static kn_status hf_tokenizer_json(kn_model *m, const char *config) {
    char tj[4200];
    const char *slash = strrchr(config, '/');
    snprintf(tj, sizeof tj, "%.*stokenizer.json", slash ? (int)(slash - config + 1) : 0, config);
    if (!exists(tj)) return KN_OK;
    kn_status st = kn__model_load_hf_tokenizer(m, tj);
    if (st) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn_set_error(st, "%s (pass -z with another tokenizer to skip tokenizer.json)", msg);
    }
    if (kn_tokenizer_n_vocab(m->tok) > m->cfg.n_vocab) {
        st = kn_set_error(KN_ERR_FORMAT, "%s has %d tokens but the model's vocabulary has only %d; pass the "
                          "tokenizer that belongs to this model with -z", tj, kn_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
        kn_tokenizer_free(m->tok);
        m->tok = NULL;
    }
    return st;
}

kn_status kn__load_hf(kn_model *m, const char *path, const char *tok_path) {
    hf_paths p;
    kn_status st = hf_resolve(path, &p);
    if (st) return st;
    kn_json *j;
    if ((st = kn_json_load(p.config, &j))) return kn__model_err_prefix(st, p.config);
    if (kn_json_kind(j, 0) != KN_JSON_OBJECT) {
        kn_json_free(j);
        return kn_set_error(KN_ERR_FORMAT, "%s: expected a JSON object", p.config);
    }
    const char *arch = hf_arch(j);
    bool gpt2 = arch && (!strcmp(arch, "GPT2LMHeadModel") || !strcmp(arch, "GPT2Model"));
    static const struct { const char *name; kn_arch arch; } archs[] = {
        {"LlamaForCausalLM", KN_ARCH_LLAMA}, {"Qwen2ForCausalLM", KN_ARCH_QWEN2}, {"Qwen3ForCausalLM", KN_ARCH_QWEN3},
        {"MistralForCausalLM", KN_ARCH_MISTRAL}, {"Gemma2ForCausalLM", KN_ARCH_GEMMA2},
        {"Gemma3ForCausalLM", KN_ARCH_GEMMA3}, {"Phi3ForCausalLM", KN_ARCH_PHI3},
        {"MixtralForCausalLM", KN_ARCH_MIXTRAL}, {"Qwen2MoeForCausalLM", KN_ARCH_QWEN2MOE},
        {"Qwen3MoeForCausalLM", KN_ARCH_QWEN3MOE}, {"OlmoeForCausalLM", KN_ARCH_OLMOE}};
    int ai = -1;
    bool gemma3_vl = arch && !strcmp(arch, "Gemma3ForConditionalGeneration");
    if (gemma3_vl) {                     /* its language model: text_config with Gemma 3's defaults filled in */
        kn_json *t = NULL;
        st = kn__hf_gemma3_text_config(j, p.config, &t);
        kn_json_free(j);
        if (st) return st;
        j = t;
        arch = "Gemma3ForCausalLM";
    }
    for (int i = 0; arch && i < (int)(sizeof archs / sizeof archs[0]); i++)
        if (!strcmp(arch, archs[i].name)) ai = i;
    if (ai < 0 && !gpt2) {
        st = kn_set_error(KN_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported; kiln loads LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                          "Gemma3ForConditionalGeneration (its text part), Phi3ForCausalLM, MixtralForCausalLM, "
                          "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM and GPT2LMHeadModel safetensors "
                          "models (or convert the model to GGUF)", p.config, arch ? arch : "(none given)");
        kn_json_free(j);
        return st;
    }
    if ((st = kn_safetensors_open(p.weights, &m->st))) {
        kn_json_free(j);
        return kn__model_err_prefix(st, p.weights);
    }
    const char *nm = kn_json_get_str(j, 0, "_name_or_path");
    snprintf(m->cfg.name, sizeof m->cfg.name, "%.127s", nm && *nm ? nm : base_name(path));
    hf_loader h = {m, p.weights, p.config, gpt2 ? "" : "model.", KN_OK};
    if (gemma3_vl) h.prefix = kn_safetensors_find(m->st, "model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                                                  : "language_model.model.";
    st = gpt2 ? hf_gpt2(m, j, &h) : hf_llama(m, j, &h, archs[ai].arch);
    kn_json_free(j);
    if (st) return st;
    if (tok_path) return kn__model_load_tokenizer(m, tok_path);
    return hf_tokenizer_json(m, p.config);
}

kn_status kn__print_info_hf(const char *path, void *fp) {
    FILE *f = fp;
    hf_paths p;
    kn_status st = hf_resolve(path, &p);
    if (st) return st;
    kn_json *j;
    if ((st = kn_json_load(p.config, &j))) return kn__model_err_prefix(st, p.config);
    const char *arch = hf_arch(j);
    fprintf(f, "Hugging Face model: %s\n  architecture %s\n  config (%s):\n", p.weights, arch ? arch : "(none)", p.config);
    for (int64_t v = kn_json_first(j, 0); v >= 0; v = kn_json_next(j, v)) {
        const char *k = kn_json_key(j, v, NULL);
        double d; bool b; const char *s;
        if (kn_json_num(j, v, &d)) fprintf(f, "    %-28s %.10g\n", k, d);
        else if (kn_json_bool(j, v, &b)) fprintf(f, "    %-28s %s\n", k, b ? "true" : "false");
        else if ((s = kn_json_str(j, v, NULL))) fprintf(f, "    %-28s \"%.80s\"\n", k, s);
    }
    kn_json_free(j);
    kn_safetensors *s;
    if ((st = kn_safetensors_open(p.weights, &s))) return kn__model_err_prefix(st, p.weights);
    int64_t n = kn_safetensors_n_tensors(s), total = 0;
    fprintf(f, "  %lld tensors:\n", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const kn_st_tensor *t = kn_safetensors_tensor_at(s, i);
        int64_t ne = 1;
        fprintf(f, "    %-48s %-5s [", t->name, kn_safetensors_dtype_str(t->dtype));
        for (int d = 0; d < t->ndim; d++) { fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]); ne *= t->shape[d]; }
        fprintf(f, "]\n");
        total += ne;
    }
    fprintf(f, "  %lld parameters\ntokenizer: tokenizer.json beside config.json when present "
            "(or pass -z with a GGUF vocabulary or a llama2.c tokenizer.bin)\n", (long long)total);
    kn_safetensors_close(s);
    return KN_OK;
}
