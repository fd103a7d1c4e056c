/* convert_hf.c: `kiln convert`: a Hugging Face model (config.json +
 * model.safetensors [+ tokenizer.json, tokenizer_config.json]) as a GGUF file
 * with llama.cpp's names, layouts and metadata (what its
 * convert_hf_to_gguf.py writes for the same model).
 *
 * The model is first loaded by kiln (kn_model_load): that validates
 * config.json and the tensor shapes, and gives the parsed hyperparameters and
 * the tokenizer. Then every safetensors tensor is mapped to its GGUF name and
 * a fill function that produces its values in llama.cpp's layout:
 *   - llama-arch models (Llama, Mistral, Mixtral): q/k rows permuted per head
 *     from HF's rotate-halves order to llama.cpp's paired order
 *     (row h*D + 2i + j <- h*D + j*D/2 + i);
 *   - Gemma 2/3: every RMS norm gain stored as 1 + w;
 *   - GPT-2: Conv1D weights [in, out] transposed to [out, in];
 *   - MoE experts (one tensor per expert in HF) stacked into [E, out, in];
 *   - Qwen2-MoE's shared-expert gate [1, C] stored as [C];
 *   - everything else as is (Phi-3's fused qkv_proj / gate_up_proj included).
 * GGML sizes reverse the row-major shape: ne[0] is the row length.
 * The vocabulary (byte-level or SentencePiece-style BPE) is convert_vocab.c's.
 * Non-goals: sharded checkpoints, Unigram/WordPiece vocabularies (refused,
 * see convert_vocab.c), vision towers (skipped).
 */
#include "llm/quantize_impl.h"
#include "llm/model_impl.h"        /* defines: struct kn_model (config, tokenizer)       */
#include "formats/hfconfig.h"      /* defines: kn_json                                   */
#include "formats/safetensors.h"   /* defines: kn_safetensors                            */
#include "core/fp16.h"             /* defines: kn_bf16_to_fp32, kn_fp16_to_fp32          */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { F_PLUS1 = 1, F_TRANSPOSE = 2, F_PERMUTE = 4, F_STACK = 8 };

/* ---- fills ------------------------------------------------------------------ */

/* n values of a safetensors tensor (F32/F16/BF16, maybe unaligned) from element off */
static void st_f32(const kn_st_tensor *t, int64_t off, int64_t n, float *dst) {
    const unsigned char *p = (const unsigned char *)t->data;
    if (t->dtype == KN_F32) { memcpy(dst, p + 4 * off, (size_t)n * 4); return; }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * (off + i), 2);
        dst[i] = t->dtype == KN_BF16 ? kn_bf16_to_fp32(h) : kn_fp16_to_fp32(h);
    }
}

/* One HF matrix/vector src (row-major [rows, cols] or [n]) into dst with the flags. */
static void fill_one(const kn_st_tensor *src, int flags, int64_t n_head, float *dst) {
    int64_t n = 1;
    for (int d = 0; d < src->ndim; d++) n *= src->shape[d];
    int64_t rows = src->ndim >= 2 ? src->shape[0] : 1, cols = n / rows;
    if (flags & F_TRANSPOSE) {                      /* [rows, cols] -> [cols, rows] */
        float *row = malloc(sizeof *row * (size_t)cols);
        if (!row) return;
        for (int64_t r = 0; r < rows; r++) {
            st_f32(src, r * cols, cols, row);
            for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = row[c];
        }
        free(row);
    } else if (flags & F_PERMUTE) {                 /* rows of each head: halves -> pairs */
        int64_t D = rows / n_head, half = D / 2;
        for (int64_t h = 0; h < n_head; h++)
            for (int64_t i = 0; i < half; i++)
                for (int64_t j = 0; j < 2; j++)
                    st_f32(src, (h * D + j * half + i) * cols, cols, dst + (h * D + 2 * i + j) * cols);
    } else {
        st_f32(src, 0, n, dst);
    }
    if (flags & F_PLUS1)
        for (int64_t i = 0; i < n; i++) dst[i] += 1.0f;
}

typedef struct conv conv;
static const kn_st_tensor *conv_find(conv *cv, const char *name);

static kn_status fill_hf(const kn__qt *t, float *dst) {
    int flags = (int)t->arg[0];
    if (!(flags & F_STACK)) {
        fill_one(t->a, flags, t->arg[1], dst);
        return KN_OK;
    }
    /* experts: t->b is the name format with one %d, t->arg[2] experts of ne[0] * ne[1] */
    int64_t per = t->ne[0] * t->ne[1];
    for (int64_t e = 0; e < t->arg[2]; e++) {
        char nm[256];
        snprintf(nm, sizeof nm, (const char *)t->b, (int)e);
        const kn_st_tensor *s = conv_find(t->ud, nm);
        if (!s || s->ndim != 2 || s->shape[0] * s->shape[1] != per)
            return kn_set_error(KN_ERR_FORMAT, "expert tensor '%s' is missing or not [%lld, %lld]", nm,
                                (long long)t->ne[1], (long long)t->ne[0]);
        fill_one(s, flags & ~F_STACK, 0, dst + e * per);
    }
    return KN_OK;
}

/* f32 vectors the converter computes itself (rope factors): t->a holds them */
static kn_status fill_vec(const kn__qt *t, float *dst) {
    memcpy(dst, t->a, sizeof(float) * (size_t)t->ne[0]);
    return KN_OK;
}

/* ---- the conversion state ------------------------------------------------------ */

struct conv {
    kn_model *m;
    const kn_model_config *c;
    kn_safetensors *st;
    kn_json *j;
    const char *cfgp;
    const char *garch;         /* llama.cpp's architecture name          */
    char prefix[64];           /* "model.", "language_model.model.", "transformer.", "" */
    char head[64];             /* "lm_head." or "language_model.lm_head." */
    kn__qt *ts;
    int64_t n, cap;
    char (*fmts)[160];         /* expert name formats, [cap]              */
    float *vecs[4];            /* rope factor tables owned here           */
    kn_gguf_writer *w;
    const kn_quantize_params *p;
    kn_status err;
};

static const kn_st_tensor *conv_find(conv *cv, const char *name) { return kn_safetensors_find(cv->st, name); }

static kn__qt *add(conv *cv, const char *gname) {
    if (cv->err) return NULL;
    if (cv->n == cv->cap) {
        int64_t nc = cv->cap ? 2 * cv->cap : 64;
        kn__qt *nt = realloc(cv->ts, sizeof *nt * (size_t)nc);
        char(*nf)[160] = nt ? realloc(cv->fmts, sizeof *nf * (size_t)nc) : NULL;
        if (nt) cv->ts = nt;
        if (!nf) { cv->err = kn_set_error(KN_ERR_NOMEM, "out of memory"); return NULL; }
        cv->fmts = nf;
        cv->cap = nc;
    }
    kn__qt *t = &cv->ts[cv->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", gname);
    t->keep_type = KN_F32;
    t->fill = fill_hf;
    t->ud = cv;
    return t;
}

/* HF tensor src as GGUF gname: ne reversed from the shape (transposed when asked) */
static void map(conv *cv, const kn_st_tensor *src, const char *gname, int flags, int64_t n_head) {
    kn__qt *t = add(cv, gname);
    if (!t) return;
    t->a = src;
    t->src_type = src->dtype;
    t->arg[0] = flags;
    t->arg[1] = n_head;
    int nd = src->ndim;
    if (nd < 1 || nd > 2) { cv->err = kn_set_error(KN_ERR_FORMAT, "%s: tensor '%s' has %d dims", cv->cfgp, src->name, nd); return; }
    if (nd == 2 && src->shape[0] == 1 && strstr(gname, "ffn_gate_inp_shexp")) nd = 1;   /* [1, C] -> [C] */
    t->n_dims = nd;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    if (nd == 1) t->ne[0] = src->ndim == 2 ? src->shape[1] : src->shape[0];
    else if (flags & F_TRANSPOSE) { t->ne[0] = src->shape[0]; t->ne[1] = src->shape[1]; }
    else { t->ne[0] = src->shape[1]; t->ne[1] = src->shape[0]; }
    if (flags & F_PLUS1 || nd == 1) t->no_quant = true;
    if (strstr(gname, "ffn_gate_inp")) t->no_quant = true;
}

/* ---- tensor names ---------------------------------------------------------------- */

typedef struct { const char *hf, *gg; } name_pair;

static const name_pair LAYER[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"}, {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"}, {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"}, {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"}, {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},        /* Gemma: post_attention_norm */
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"}, {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"}, {"mlp.gate_up_proj.weight", "ffn_up.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"}, {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};
/* experts: HF name after "experts.E." -> GGUF stacked name */
static const name_pair EXPERT[] = {
    {"gate_proj.weight", "ffn_gate_exps.weight"}, {"up_proj.weight", "ffn_up_exps.weight"},
    {"down_proj.weight", "ffn_down_exps.weight"}, {"w1.weight", "ffn_gate_exps.weight"},
    {"w3.weight", "ffn_up_exps.weight"}, {"w2.weight", "ffn_down_exps.weight"},
};
static const name_pair GPT2_LAYER[] = {
    {"ln_1.weight", "attn_norm.weight"}, {"ln_1.bias", "attn_norm.bias"},
    {"attn.c_attn.weight", "attn_qkv.weight"}, {"attn.c_attn.bias", "attn_qkv.bias"},
    {"attn.c_proj.weight", "attn_output.weight"}, {"attn.c_proj.bias", "attn_output.bias"},
    {"ln_2.weight", "ffn_norm.weight"}, {"ln_2.bias", "ffn_norm.bias"},
    {"mlp.c_fc.weight", "ffn_up.weight"}, {"mlp.c_fc.bias", "ffn_up.bias"},
    {"mlp.c_proj.weight", "ffn_down.weight"}, {"mlp.c_proj.bias", "ffn_down.bias"},
};

static bool starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static bool is_gemma(const conv *cv) { return cv->c->arch == KN_ARCH_GEMMA2 || cv->c->arch == KN_ARCH_GEMMA3; }

/* One safetensors tensor: mapped, skipped (vision tower, buffers) or an error. */
static void map_tensor(conv *cv, const kn_st_tensor *t) {
    const char *nm = t->name, *pre = cv->prefix;
    bool gpt2 = cv->c->arch == KN_ARCH_GPT2, gemma = is_gemma(cv);
    bool llama = !strcmp(cv->garch, "llama");
    char g[160];
    if (!starts(nm, pre) && !starts(nm, cv->head)) {
        if (starts(nm, "vision_tower.") || starts(nm, "multi_modal_projector.") || starts(nm, "model.vision_tower.") ||
            starts(nm, "model.multi_modal_projector.")) return;                  /* Gemma 3's vision part */
        cv->err = kn_set_error(KN_ERR_UNSUPPORTED, "%s: cannot map tensor '%s' to a llama.cpp name", cv->cfgp, nm);
        return;
    }
    if (starts(nm, cv->head)) {
        if (!strcmp(nm + strlen(cv->head), "weight") && !cv->c->tied_output) map(cv, t, "output.weight", 0, 0);
        return;                                                          /* a tied head is token_embd */
    }
    const char *s = nm + strlen(pre);
    if (gpt2) {
        if (!strcmp(s, "wte.weight")) map(cv, t, "token_embd.weight", 0, 0);
        else if (!strcmp(s, "wpe.weight")) map(cv, t, "position_embd.weight", 0, 0);
        else if (!strcmp(s, "ln_f.weight")) map(cv, t, "output_norm.weight", 0, 0);
        else if (!strcmp(s, "ln_f.bias")) map(cv, t, "output_norm.bias", 0, 0);
        else if (starts(s, "h.")) {
            int l, o = 0;
            if (sscanf(s, "h.%d.%n", &l, &o) != 1 || !o) goto unknown;
            if (!strcmp(s + o, "attn.bias") || !strcmp(s + o, "attn.masked_bias")) return;   /* causal-mask buffers */
            for (size_t i = 0; i < sizeof GPT2_LAYER / sizeof *GPT2_LAYER; i++)
                if (!strcmp(s + o, GPT2_LAYER[i].hf)) {
                    snprintf(g, sizeof g, "blk.%d.%s", l, GPT2_LAYER[i].gg);
                    map(cv, t, g, t->ndim == 2 ? F_TRANSPOSE : 0, 0);
                    return;
                }
            goto unknown;
        } else goto unknown;
        return;
    }
    if (!strcmp(s, "embed_tokens.weight")) { map(cv, t, "token_embd.weight", 0, 0); return; }
    if (!strcmp(s, "norm.weight")) { map(cv, t, "output_norm.weight", gemma ? F_PLUS1 : 0, 0); return; }
    int l, o = 0;
    if (sscanf(s, "layers.%d.%n", &l, &o) != 1 || !o) goto unknown;
    s += o;
    const char *ex = strstr(s, "experts.");
    if (ex && (starts(s, "mlp.experts.") || starts(s, "block_sparse_moe.experts."))) {
        int e, eo = 0;
        if (sscanf(ex, "experts.%d.%n", &e, &eo) != 1 || !eo) goto unknown;
        for (size_t i = 0; i < sizeof EXPERT / sizeof *EXPERT; i++)
            if (!strcmp(ex + eo, EXPERT[i].hf)) {
                if (e != 0) return;                      /* stacked when expert 0 is met */
                if (t->ndim != 2) goto unknown;
                snprintf(g, sizeof g, "blk.%d.%s", l, EXPERT[i].gg);
                kn__qt *q = add(cv, g);
                if (!q) return;
                int64_t E = cv->c->n_expert;
                snprintf(cv->fmts[cv->n - 1], sizeof cv->fmts[0], "%.*sexperts.%%d.%s", (int)(ex - nm), nm, EXPERT[i].hf);
                q->b = cv->fmts[cv->n - 1];            /* fmts may move: fixed up before the write */
                q->src_type = t->dtype;
                q->arg[0] = F_STACK;
                q->arg[2] = E;
                q->n_dims = 3;
                q->ne[0] = t->shape[1]; q->ne[1] = t->shape[0]; q->ne[2] = E; q->ne[3] = 1;
                return;
            }
        goto unknown;
    }
    for (size_t i = 0; i < sizeof LAYER / sizeof *LAYER; i++) {
        if (strcmp(s, LAYER[i].hf)) continue;
        const char *gg = LAYER[i].gg;
        if (gemma && !strcmp(LAYER[i].hf, "post_attention_layernorm.weight")) gg = "post_attention_norm.weight";
        int flags = gemma && strstr(gg, "norm") ? F_PLUS1 : 0;
        int64_t nh = 0;
        if (llama && (!strcmp(gg, "attn_q.weight") || !strcmp(gg, "attn_q.bias"))) { flags |= F_PERMUTE; nh = cv->c->n_heads; }
        if (llama && (!strcmp(gg, "attn_k.weight") || !strcmp(gg, "attn_k.bias"))) { flags |= F_PERMUTE; nh = cv->c->n_kv_heads; }
        snprintf(g, sizeof g, "blk.%d.%s", l, gg);
        map(cv, t, g, flags, nh);
        return;
    }
unknown:
    cv->err = kn_set_error(KN_ERR_UNSUPPORTED, "%s: cannot map tensor '%s' to a llama.cpp name (architecture %s)",
                           cv->cfgp, nm, cv->garch);
}

/* ---- metadata ---------------------------------------------------------------------- */

static void kv_u32(conv *cv, const char *key, int64_t v) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", cv->garch, key);
    kn_gguf_w_u32(cv->w, k, (uint32_t)v);
}
static void kv_f32(conv *cv, const char *key, double v) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", cv->garch, key);
    kn_gguf_w_f32(cv->w, k, (float)v);
}
static void kv_str(conv *cv, const char *key, const char *v) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", cv->garch, key);
    kn_gguf_w_str(cv->w, k, v);
}

/* rope scaling object of the config (rope_scaling, or transformers 5's rope_parameters) and its type */
static int64_t rope_obj(const kn_json *j, const char **type) {
    int64_t rs = kn_json_get(j, 0, "rope_scaling");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT) rs = kn_json_get(j, 0, "rope_parameters");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT) { *type = NULL; return -1; }
    *type = kn_json_get_str(j, rs, "rope_type");
    if (!*type) *type = kn_json_get_str(j, rs, "type");
    return rs;
}

/* a float array member of length n, copied (NULL if absent or of another length) */
static float *json_floats(const kn_json *j, int64_t obj, const char *key, int n) {
    int64_t a = kn_json_get(j, obj, key);
    if (kn_json_kind(j, a) != KN_JSON_ARRAY || kn_json_count(j, a) != n) return NULL;
    float *f = malloc(sizeof *f * (size_t)(n ? n : 1));
    for (int i = 0; f && i < n; i++) {
        double v = 0;
        kn_json_num(j, kn_json_at(j, a, i), &v);
        f[i] = (float)v;
    }
    return f;
}

static void add_vec(conv *cv, const char *name, float *v, int n) {
    for (int i = 0; i < 4; i++)
        if (!cv->vecs[i]) { cv->vecs[i] = v; break; }
    kn__qt *t = add(cv, name);
    if (!t) return;
    t->a = v;
    t->fill = fill_vec;
    t->src_type = KN_F32;
    t->n_dims = 1;
    t->ne[0] = n; t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->no_quant = true;
}

static void rope_meta(conv *cv) {
    const kn_model_config *c = cv->c;
    const kn_json *j = cv->j;
    if (c->arch == KN_ARCH_GEMMA3) {           /* per layer type: the config's own layout */
        if (c->rope_freq_scale != 1.0) {
            kv_str(cv, "rope.scaling.type", "linear");
            kv_f32(cv, "rope.scaling.factor", 1.0 / c->rope_freq_scale);
        }
        if (c->rope_theta_local > 0 && c->rope_theta_local != 10000.0) kv_f32(cv, "rope.freq_base_swa", c->rope_theta_local);
        return;
    }
    const char *type;
    int64_t rs = rope_obj(j, &type);
    if (!type || !strcmp(type, "default")) return;
    double factor = 1;
    kn_json_get_f64(j, rs, "factor", &factor);
    double orig = c->n_ctx_train;
    kn_json_get_f64(j, rs, "original_max_position_embeddings", &orig);
    int half = c->n_rot / 2;
    if (!strcmp(type, "linear")) {
        kv_str(cv, "rope.scaling.type", "linear");
        kv_f32(cv, "rope.scaling.factor", factor);
    } else if (!strcmp(type, "yarn")) {
        kv_str(cv, "rope.scaling.type", "yarn");
        kv_f32(cv, "rope.scaling.factor", factor);
        kv_u32(cv, "rope.scaling.original_context_length", (int64_t)orig);
        double bf = 32, bs = 1, af = 0;
        if (kn_json_get_f64(j, rs, "beta_fast", &bf)) kv_f32(cv, "rope.scaling.yarn_beta_fast", bf);
        if (kn_json_get_f64(j, rs, "beta_slow", &bs)) kv_f32(cv, "rope.scaling.yarn_beta_slow", bs);
        if (kn_json_get_f64(j, rs, "attention_factor", &af) && af > 0) {
            float *tmp = malloc(sizeof *tmp * (size_t)(half ? half : 1));
            double ms = tmp ? kn__rope_ff_yarn(tmp, c->n_rot, c->rope_theta, factor, orig, bf, bs) : 1;
            free(tmp);
            kv_f32(cv, "rope.scaling.attn_factor", af / ms);     /* kiln and llama.cpp multiply by yarn's own */
        }
    } else if (!strcmp(type, "llama3")) {      /* llama.cpp: the divisors as the tensor rope_freqs.weight */
        double lo = 1, hi = 4;
        kn_json_get_f64(j, rs, "low_freq_factor", &lo);
        kn_json_get_f64(j, rs, "high_freq_factor", &hi);
        float *ff = malloc(sizeof *ff * (size_t)(half ? half : 1));
        if (!ff) { cv->err = kn_set_error(KN_ERR_NOMEM, "out of memory"); return; }
        kn__rope_ff_llama3(ff, c->n_rot, c->rope_theta, factor, lo, hi, orig);
        add_vec(cv, "rope_freqs.weight", ff, half);
    } else if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        float *sf = json_floats(j, rs, "short_factor", half), *lf = json_floats(j, rs, "long_factor", half);
        if (!sf || !lf) {
            free(sf); free(lf);
            cv->err = kn_set_error(KN_ERR_FORMAT, "%s: LongRoPE needs short_factor and long_factor of %d numbers", cv->cfgp, half);
            return;
        }
        add_vec(cv, "rope_factors_long.weight", lf, half);
        add_vec(cv, "rope_factors_short.weight", sf, half);
        int64_t o = 0;
        if (kn_json_get_i64(j, rs, "original_max_position_embeddings", &o) || kn_json_get_i64(j, 0, "original_max_position_embeddings", &o))
            kv_u32(cv, "rope.scaling.original_context_length", o);
        else o = c->n_ctx_train;
        double af = 0;
        if (!kn_json_get_f64(j, rs, "attention_factor", &af) || !(af > 0)) {
            double f = (double)c->n_ctx_train / (double)o;
            af = f <= 1 ? 1.0 : sqrt(1 + log(f) / log((double)o));
        }
        kv_f32(cv, "rope.scaling.attn_factor", af);
    } else {
        cv->err = kn_set_error(KN_ERR_UNSUPPORTED, "%s: rope scaling \"%s\" is not converted (linear, yarn, llama3, "
                               "longrope are)", cv->cfgp, type);
    }
}

static void hparams(conv *cv) {
    const kn_model_config *c = cv->c;
    const kn_json *j = cv->j;
    kv_u32(cv, "context_length", c->n_ctx_train);
    kv_u32(cv, "embedding_length", c->dim);
    kv_u32(cv, "block_count", c->n_layers);
    int64_t ffn = c->ffn_dim;
    if (c->n_expert) kn_json_get_i64(j, 0, "intermediate_size", &ffn);
    kv_u32(cv, "feed_forward_length", ffn);
    kv_u32(cv, "attention.head_count", c->n_heads);
    if (c->arch == KN_ARCH_GPT2) {
        kv_f32(cv, "attention.layer_norm_epsilon", c->norm_eps);
        return;
    }
    kv_u32(cv, "attention.head_count_kv", c->n_kv_heads);
    kv_f32(cv, "rope.freq_base", c->rope_theta);
    kv_f32(cv, "attention.layer_norm_rms_epsilon", c->norm_eps);
    if (c->head_dim != c->dim / c->n_heads || is_gemma(cv) || c->arch == KN_ARCH_PHI3) {
        kv_u32(cv, "attention.key_length", c->head_dim);
        kv_u32(cv, "attention.value_length", c->head_dim);
    }
    if (c->n_rot != c->head_dim) kv_u32(cv, "rope.dimension_count", c->n_rot);
    if (c->sliding_window > 0) kv_u32(cv, "attention.sliding_window", c->sliding_window);
    if (c->n_expert) {
        kv_u32(cv, "expert_count", c->n_expert);
        kv_u32(cv, "expert_used_count", c->n_expert_used);
        if (c->arch != KN_ARCH_MIXTRAL && c->arch != KN_ARCH_OLMOE) kv_u32(cv, "expert_feed_forward_length", c->expert_ffn_dim);
        if (c->shared_ffn_dim) kv_u32(cv, "expert_shared_feed_forward_length", c->shared_ffn_dim);
        /* the file states what kiln and llama.cpp would otherwise assume per architecture */
        char k[160];
        snprintf(k, sizeof k, "%s.expert_weights_norm", cv->garch);
        kn_gguf_w_bool(cv->w, k, c->expert_norm);
    }
    if (is_gemma(cv)) {
        if (c->attn_softcap > 0) kv_f32(cv, "attn_logit_softcapping", c->attn_softcap);
        if (c->final_softcap > 0) kv_f32(cv, "final_logit_softcapping", c->final_softcap);
        if (c->attn_scale > 0) kv_f32(cv, "attention.scale", c->attn_scale);
        if (c->arch == KN_ARCH_GEMMA3 && cv->m->layer_swa) {   /* a period when the layers follow one */
            int L = c->n_layers, p = 0;
            while (p < L && cv->m->layer_swa[p]) p++;
            bool periodic = p < L;
            for (int l = 0; periodic && l < L; l++) periodic = cv->m->layer_swa[l] == ((l + 1) % (p + 1) != 0);
            if (periodic) kv_u32(cv, "attention.sliding_window_pattern", p + 1);
            else {
                char k[160];
                snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", cv->garch);
                kn_gguf_w_arr(cv->w, k, 7 /* bool */, (uint64_t)L, cv->m->layer_swa);
            }
        }
    }
    rope_meta(cv);
}

/* ---- entry ----------------------------------------------------------------------------- */

static const char *garch_of(kn_arch a) {
    switch (a) {
    case KN_ARCH_LLAMA: case KN_ARCH_MISTRAL: case KN_ARCH_MIXTRAL: return "llama";
    case KN_ARCH_GPT2: return "gpt2";
    case KN_ARCH_QWEN2: return "qwen2";
    case KN_ARCH_QWEN3: return "qwen3";
    case KN_ARCH_GEMMA2: return "gemma2";
    case KN_ARCH_GEMMA3: return "gemma3";
    case KN_ARCH_PHI3: return "phi3";
    case KN_ARCH_QWEN2MOE: return "qwen2moe";
    case KN_ARCH_QWEN3MOE: return "qwen3moe";
    case KN_ARCH_OLMOE: return "olmoe";
    default: return NULL;
    }
}

kn_status kn_model_convert_hf(const char *hf_path, const char *out, const kn_quantize_params *p) {
    if (!hf_path || !out || !p) return kn_set_error(KN_ERR_INVALID, "kn_model_convert_hf: NULL argument");
    struct stat sb;
    if (stat(hf_path, &sb) != 0) return kn_set_error(KN_ERR_IO, "%s: no such file or directory", hf_path);
    char dir[4096], weights[4200], cfgp[4200];
    if (S_ISDIR(sb.st_mode)) snprintf(dir, sizeof dir, "%s", hf_path);
    else {
        const char *sl = strrchr(hf_path, '/');
        snprintf(dir, sizeof dir, "%.*s", sl ? (int)(sl - hf_path) : 1, sl ? hf_path : ".");
    }
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    if (S_ISDIR(sb.st_mode)) snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    else snprintf(weights, sizeof weights, "%s", hf_path);
    if (stat(cfgp, &sb) != 0)
        return kn_set_error(KN_ERR_IO, "%s: missing; kiln convert reads a Hugging Face model directory (config.json, "
                            "model.safetensors, tokenizer.json)", cfgp);
    conv cv = {.p = p, .cfgp = cfgp};
    kn_json *j = NULL;
    kn_status st = kn_json_load(cfgp, &j);
    if (st) return st;
    cv.j = j;
    /* the architecture by name first, so an unsupported one is named plainly */
    int64_t an = kn_json_get(j, 0, "architectures");
    const char *aname = kn_json_kind(j, an) == KN_JSON_ARRAY ? kn_json_str(j, kn_json_at(j, an, 0), NULL) : NULL;
    if (!aname) aname = kn_json_get_str(j, 0, "model_type");
    static const char *const known[] = {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
        "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM", "Gemma2ForCausalLM",
        "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM", "GPT2LMHeadModel", "llama", "mistral",
        "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "olmoe", "gemma2", "gemma3_text", "phi3", "gpt2"};
    bool ok = false;
    for (size_t i = 0; aname && i < sizeof known / sizeof *known; i++) ok |= !strcmp(aname, known[i]);
    if (!ok) {
        st = kn_set_error(KN_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported by kiln convert; it converts "
                          "Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, OLMoE, Gemma 2, Gemma 3, Phi-3 "
                          "and GPT-2", cfgp, aname ? aname : "(none named)");
        kn_json_free(j);
        return st;
    }
    kn_model *m = NULL;
    if ((st = kn_model_load(hf_path, &(kn_model_opts){.n_ctx = 8, .n_batch = 1}, &m))) { kn_json_free(j); return st; }
    cv.m = m;
    cv.c = kn_model_get_config(m);
    cv.garch = garch_of(cv.c->arch);
    if (!cv.garch) st = kn_set_error(KN_ERR_UNSUPPORTED, "%s: no llama.cpp architecture for this model", cfgp);
    if (!st) st = kn_safetensors_open(weights, &cv.st);
    if (!st) st = kn_gguf_writer_new(&cv.w);
    if (!st) {
        const char *gp = "";
        if (cv.c->arch == KN_ARCH_GPT2) gp = kn_safetensors_find(cv.st, "transformer.wte.weight") ? "transformer." : "";
        else if (kn_safetensors_find(cv.st, "language_model.model.embed_tokens.weight")) gp = "language_model.model.";
        else if (kn_safetensors_find(cv.st, "model.language_model.embed_tokens.weight")) gp = "model.language_model.";
        else gp = "model.";
        snprintf(cv.prefix, sizeof cv.prefix, "%s", gp);
        snprintf(cv.head, sizeof cv.head, "%slm_head.", !strcmp(gp, "language_model.model.") ? "language_model." : "");
        kn_gguf_w_str(cv.w, "general.architecture", cv.garch);
        const char *base = strrchr(dir, '/');
        kn_gguf_w_str(cv.w, "general.name", base && base[1] ? base + 1 : dir);
        hparams(&cv);
        if (!cv.err) cv.err = kn__convert_vocab(cv.w, m, cv.c->n_vocab, p, dir);
        for (int64_t i = 0; i < kn_safetensors_n_tensors(cv.st) && !cv.err; i++)
            map_tensor(&cv, kn_safetensors_tensor_at(cv.st, i));
        for (int64_t i = 0; i < cv.n; i++)          /* expert formats live in fmts, which grew */
            if (cv.ts[i].arg[0] & F_STACK) cv.ts[i].b = cv.fmts[i];
        st = cv.err ? cv.err : kn_gguf_writer_status(cv.w);
    }
    if (!st) st = kn__qwrite(cv.w, cv.ts, cv.n, p, out);
    kn_gguf_writer_free(cv.w);
    for (int i = 0; i < 4; i++) free(cv.vecs[i]);
    free(cv.ts); free(cv.fmts);
    kn_safetensors_close(cv.st);
    kn_model_free(m);
    kn_json_free(j);
    return st;
}
