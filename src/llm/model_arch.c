/* model_arch.c: what Mistral, Gemma 2, Gemma 3 and Phi-3 add to the Llama
 * blocks of model.c: their configuration (config.json or GGUF metadata) and
 * the pieces of the forward graph that differ (build_forward calls them for
 * every architecture; for Llama, Qwen and GPT-2 they are the plain op).
 *
 *   Mistral  every layer attends through a sliding window: the query at
 *            position i sees the keys i - W < j <= i (W = sliding_window;
 *            transformers' rule, kn_sdpa_ex's window). GGUF: llama.cpp writes
 *            Mistral as "llama"; llama.attention.sliding_window is read when
 *            present (llama.cpp's own files leave it out and run unwindowed).
 *   Gemma 2  x0 = embedding * sqrt(C); per layer
 *              x += post_attn_norm(attn(attn_norm(x)))
 *              x += post_ffn_norm(W2 (gelu_tanh(W1 h) * W3 h)), h = ffn_norm(x)
 *            RMS norms scale by (1 + w) (Hugging Face stores w, GGUF 1 + w:
 *            the loaders make both 1 + w); attention scores capped
 *            c tanh(s / c) (attn_logit_softcapping), the logits too
 *            (final_logit_softcapping); scale query_pre_attn_scalar^-1/2;
 *            layers 0, 2, 4, ... windowed ("sliding_attention"), the others
 *            global. Head tied to the embedding.
 *   Gemma 3  Gemma 2 with q_norm / k_norm ((1 + w), per head, before rope),
 *            no caps unless configured, five windowed layers a global one
 *            (layer_types / sliding_window_pattern), and a rope base per
 *            layer type: windowed layers rope_local_base_freq (10000) with no
 *            context scaling, global ones rope_theta with rope_scaling
 *            (linear).
 *   Phi-3    fused q|k|v and gate|up matrices (the loaders split their rows
 *            in place), partial rotary (partial_rotary_factor), an optional
 *            window on every layer, and LongRoPE ("longrope", older "su"):
 *            per-pair divisors short_factor / long_factor [n_rot/2] and
 *            cos/sin scaled by attention_factor (default
 *            sqrt(1 + ln(factor) / ln(original_max_position_embeddings)),
 *            factor = max_position_embeddings / original). The long factors
 *            are used when the loaded context exceeds the original one
 *            (llama.cpp's rule; transformers switches per sequence length, so
 *            the two agree whenever the sequence and the context are on the
 *            same side of it).
 *
 * GGUF (llama.cpp's names): gemma2 / gemma3 / phi3 with
 *   {arch}.attention.sliding_window, {arch}.attn_logit_softcapping,
 *   {arch}.final_logit_softcapping, {arch}.attention.sliding_window_pattern
 *   (a period or one bool per layer; default 2 for gemma2 and 6 for gemma3,
 *   as llama.cpp sets them), {arch}.rope.freq_base_swa (default 10000 for
 *   gemma3), {arch}.attention.scale (llama.cpp's Gemma files carry none: the
 *   scale is then 1/sqrt(head_dim), or 1/sqrt(C / H) for the 27B shapes, as
 *   llama.cpp computes it); tensors blk.N.post_attention_norm,
 *   blk.N.post_ffw_norm (ffn_norm is the pre-MLP norm), attn_q_norm /
 *   attn_k_norm (gemma3); phi3: blk.N.attn_qkv, blk.N.ffn_up [2F, C]
 *   (gate | up), rope_factors_short / rope_factors_long.weight,
 *   rope.scaling.original_context_length, rope.scaling.attn_factor.
 *
 * Gemma3ForConditionalGeneration (Gemma 3 4B and up on Hugging Face): its
 * language model, from text_config with Gemma3TextConfig's defaults filled
 * in (kn__hf_gemma3_text_config) and the tensors language_model.model.*;
 * the vision tower and projector are not read (text in, text out).
 *
 * Non-goals: a KV cache that keeps only the window (windowed layers cache
 * every position and the mask skips the old ones), images, Gemma 2/3
 * "bidirectional" attention.
 */
#include "llm/model_impl.h"     /* defines: struct kn_model, kn__model_alloc, kn__model_set_rope_ff */
#include "formats/hfconfig.h"   /* defines: kn_json */
#include "graph/graph.h"        /* defines: kn__storage_owner, struct kn_buffer */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_gemma(const kn_model *m) { return m->cfg.arch == KN_ARCH_GEMMA2 || m->cfg.arch == KN_ARCH_GEMMA3; }
static bool windowed(const kn_model *m, int l) { return m->layer_swa && m->layer_swa[l] && m->cfg.sliding_window > 0; }

/* ---- graph pieces ------------------------------------------------------------------------ */
kn_tensor *kn__arch_embed(kn_model *m, kn_tensor *x) {
    double s = m->cfg.embd_scale;
    return s > 0 && s != 1 ? kn_mul_scalar(m->ctx, x, s) : x;
}

kn_tensor *kn__arch_rope(kn_model *m, int l, kn_tensor *x, kn_tensor *pos) {
    const kn_model_config *c = &m->cfg;
    if (windowed(m, l) && c->rope_theta_local > 0)      /* Gemma 3 local layers: own base, no context scaling */
        return kn_rope_ff(m->ctx, x, pos, c->n_rot, c->rope_theta_local, c->rope_neox, 1.0, NULL);
    x = kn_rope_ff(m->ctx, x, pos, c->n_rot, c->rope_theta, c->rope_neox, c->rope_freq_scale, m->rope_ff);
    return m->rope_mag ? kn_mul(m->ctx, x, m->rope_mag) : x;         /* LongRoPE factor, partial rotary */
}

/* q [1, H, T, D], k, v [1, Hkv, S, D]: causal, the layer's window, the cap */
int kn__arch_window(const kn_model *m, int l) { return windowed(m, l) ? m->cfg.sliding_window : 0; }

kn_tensor *kn__arch_attn(kn_model *m, int l, kn_tensor *q, kn_tensor *k, kn_tensor *v) {
    const kn_model_config *c = &m->cfg;
    return kn_sdpa_ex(m->ctx, q, k, v, true, c->attn_scale, windowed(m, l) ? c->sliding_window : 0, c->attn_softcap);
}

bool kn__arch_attn_plain(const kn_model *m, int l) { return !windowed(m, l) && !(m->cfg.attn_softcap > 0); }

kn_tensor *kn__arch_post_norm(kn_model *m, kn_tensor *x, kn_tensor *w) {
    return w ? kn_rms_norm(m->ctx, x, 1, w, m->cfg.norm_eps) : x;
}

kn_tensor *kn__arch_gate_act(kn_model *m, kn_tensor *x) {
    return is_gemma(m) ? kn_gelu_tanh(m->ctx, x) : kn_silu(m->ctx, x);
}

kn_tensor *kn__arch_logits(kn_model *m, kn_tensor *lg) {
    double cap = m->cfg.final_softcap;
    if (!(cap > 0)) return lg;
    return kn_mul_scalar(m->ctx, kn_tanh(m->ctx, kn_mul_scalar(m->ctx, lg, 1 / cap)), cap);
}

/* ---- loading helpers -------------------------------------------------------------------- */
kn_tensor *kn__arch_gain_plus1(kn_model *m, kn_tensor *w) {
    int64_t n = kn_numel(w);
    float *p = kn__model_alloc(m, sizeof(float) * (size_t)n);
    if (!p) return NULL;
    const float *src = (const float *)kn__storage_owner(w)->buf->data + w->offset;   /* loaders made it f32, dense */
    for (int64_t i = 0; i < n; i++) p[i] = 1.0f + src[i];
    return kn__model_wrap(m, KN_F32, 1, n, p, w->name);
}

static kn_status alloc_swa(kn_model *m) {
    if (!m->layer_swa) m->layer_swa = kn__model_alloc(m, (size_t)m->cfg.n_layers);
    return m->layer_swa ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
}
/* layer l windowed iff (l + 1) % period != 0 (Gemma 2: period 2, Gemma 3: 6;
 * period 1: every layer, Mistral / Phi-3) */
static kn_status swa_period(kn_model *m, int64_t period) {
    kn_status st = alloc_swa(m);
    if (st) return st;
    for (int l = 0; l < m->cfg.n_layers; l++) m->layer_swa[l] = period == 1 || (l + 1) % period != 0;
    return KN_OK;
}

/* llama.cpp's Gemma attention scale when the file states none: 1/sqrt(D),
 * except the 27B shapes (46 layers: Gemma 2, 62: Gemma 3): 1/sqrt(C / H) */
static double gemma_default_scale(const kn_model_config *c) {
    bool big = (c->arch == KN_ARCH_GEMMA2 && c->n_layers == 46) || (c->arch == KN_ARCH_GEMMA3 && c->n_layers == 62);
    return 1.0 / sqrt(big ? (double)c->dim / c->n_heads : (double)c->head_dim);
}

/* LongRoPE: both factor tables kept, kn__arch_finish picks one */
static kn_status longrope_set(kn_model *m, const float *shortf, const float *longf, int orig, double mscale,
                              const char *where) {
    int half = m->cfg.n_rot / 2;
    for (int i = 0; i < half; i++)
        if (!(shortf[i] > 0) || !(longf[i] > 0) || isinf(shortf[i]) || isinf(longf[i]))
            return kn_set_error(KN_ERR_FORMAT, "%s: LongRoPE factor %d (short %g, long %g) is not a positive number", where, i,
                                (double)shortf[i], (double)longf[i]);
    if (orig < 1 || !(mscale > 0) || isinf(mscale))
        return kn_set_error(KN_ERR_FORMAT, "%s: LongRoPE needs original_max_position_embeddings >= 1 and a positive "
                            "attention factor (got %d, %g)", where, orig, mscale);
    m->rope_ff_short = shortf; m->rope_ff_long = longf;
    m->rope_orig_ctx = orig; m->rope_mscale = mscale;
    snprintf(m->cfg.rope_scaling, sizeof m->cfg.rope_scaling, "longrope");
    return KN_OK;
}

/* The attention factor multiplies cos and sin, so the rotated dims of q and
 * k: with every dim rotated that is a logit scale of its square
 * (kn__model_set_rope_ff); with partial rotary a gain vector [D] after rope. */
kn_status kn__arch_finish(kn_model *m) {
    if (!m->rope_ff_short) return KN_OK;
    const float *ff = m->n_ctx > m->rope_orig_ctx ? m->rope_ff_long : m->rope_ff_short;
    const kn_model_config *c = &m->cfg;
    if (c->n_rot == c->head_dim || m->rope_mscale == 1.0) return kn__model_set_rope_ff(m, ff, m->rope_mscale);
    float *g = kn__model_alloc(m, sizeof(float) * (size_t)c->head_dim);
    if (!g) return KN_ERR_NOMEM;
    for (int i = 0; i < c->head_dim; i++) g[i] = i < c->n_rot ? (float)m->rope_mscale : 1.0f;
    m->rope_mag = kn__model_wrap(m, KN_F32, 1, c->head_dim, g, "rope_attn_factor");
    return m->rope_mag ? kn__model_set_rope_ff(m, ff, 1.0) : kn_ctx_status(m->ctx);
}

/* ---- config.json ------------------------------------------------------------------------- */
static bool json_pos_int(const kn_json *j, int64_t obj, const char *key, int64_t *out) {
    int64_t v = obj >= 0 ? kn_json_get(j, obj, key) : -1;
    return v >= 0 && kn_json_kind(j, v) != KN_JSON_NULL && kn_json_int(j, v, out) && *out > 0;
}
/* a positive number, or absent / null (0: off) */
static kn_status json_cap(const kn_json *j, const char *key, const char *cfgp, double *out) {
    int64_t v = kn_json_get(j, 0, key);
    *out = 0;
    if (v < 0 || kn_json_kind(j, v) == KN_JSON_NULL) return KN_OK;
    if (!kn_json_num(j, v, out) || !(*out > 0) || isinf(*out))
        return kn_set_error(KN_ERR_FORMAT, "%s: \"%s\" must be a positive number or null", cfgp, key);
    return KN_OK;
}
/* [n] floats of the array obj.key into model memory */
static float *json_floats(kn_model *m, const kn_json *j, int64_t obj, const char *key, int n) {
    int64_t a = kn_json_get(j, obj, key);
    if (kn_json_kind(j, a) != KN_JSON_ARRAY || kn_json_count(j, a) != n) return NULL;
    float *f = kn__model_alloc(m, sizeof(float) * (size_t)n);
    for (int i = 0; f && i < n; i++) {
        double d;
        if (!kn_json_num(j, kn_json_at(j, a, i), &d)) return NULL;
        f[i] = (float)d;
    }
    return f;
}

/* layer_types (transformers 5) or the period of the architecture */
static kn_status hf_layer_types(kn_model *m, const kn_json *j, const char *cfgp, int64_t period) {
    int64_t lt = kn_json_get(j, 0, "layer_types");
    if (kn_json_kind(j, lt) != KN_JSON_ARRAY) return swa_period(m, period);
    if (kn_json_count(j, lt) != m->cfg.n_layers)
        return kn_set_error(KN_ERR_FORMAT, "%s: layer_types has %lld entries for %d layers", cfgp,
                            (long long)kn_json_count(j, lt), m->cfg.n_layers);
    kn_status st = alloc_swa(m);
    for (int l = 0; !st && l < m->cfg.n_layers; l++) {
        const char *t = kn_json_str(j, kn_json_at(j, lt, l), NULL);
        if (t && !strcmp(t, "sliding_attention")) m->layer_swa[l] = 1;
        else if (!t || strcmp(t, "full_attention"))
            st = kn_set_error(KN_ERR_UNSUPPORTED, "%s: layer_types[%d] = \"%s\"; kiln runs \"full_attention\" and "
                              "\"sliding_attention\" layers", cfgp, l, t ? t : "?");
    }
    return st;
}

/* Gemma 3's global rope: rope_parameters.full_attention (transformers 5) or
 * rope_theta + rope_scaling (4); the local base from
 * rope_parameters.sliding_attention or rope_local_base_freq. Linear scaling only. */
static kn_status hf_gemma3_rope(kn_model *m, const kn_json *j, const char *cfgp) {
    kn_model_config *c = &m->cfg;
    int64_t rp = kn_json_get(j, 0, "rope_parameters"), full = -1, local = -1;
    if (kn_json_kind(j, rp) == KN_JSON_OBJECT) {
        full = kn_json_get(j, rp, "full_attention");
        local = kn_json_get(j, rp, "sliding_attention");
        if (kn_json_kind(j, full) != KN_JSON_OBJECT) full = rp;       /* one set for both kinds */
        if (kn_json_kind(j, local) != KN_JSON_OBJECT) local = -1;
    }
    double theta = 1e6, ltheta = 10000.0;
    if (!kn_json_get_f64(j, 0, "rope_theta", &theta) && full >= 0) kn_json_get_f64(j, full, "rope_theta", &theta);
    if (!kn_json_get_f64(j, 0, "rope_local_base_freq", &ltheta) && local >= 0) kn_json_get_f64(j, local, "rope_theta", &ltheta);
    if (!(theta > 0) || !(ltheta > 0) || isinf(theta) || isinf(ltheta))
        return kn_set_error(KN_ERR_FORMAT, "%s: rope bases %g (global) and %g (local) must be positive", cfgp, theta, ltheta);
    c->rope_theta = theta; c->rope_theta_local = ltheta;
    int64_t rs = kn_json_get(j, 0, "rope_scaling");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT) rs = full;
    const char *type = rs >= 0 ? kn_json_get_str(j, rs, "rope_type") : NULL;
    if (rs >= 0 && !type) type = kn_json_get_str(j, rs, "type");
    if (!type || !strcmp(type, "default")) return KN_OK;
    double factor = 0;
    if (strcmp(type, "linear") || !kn_json_get_f64(j, rs, "factor", &factor) || !(factor > 0) || isinf(factor))
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: Gemma 3 rope scaling \"%s\" is not supported (kiln runs \"linear\" "
                            "with a positive factor)", cfgp, type);
    c->rope_freq_scale = 1.0 / factor;
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "linear");
    return KN_OK;
}

/* Phi-3's LongRoPE from rope_scaling (transformers 4) or rope_parameters (5);
 * *done false when the config asks for plain rope (or another type, which
 * the common code then reads or refuses). */
static kn_status hf_longrope(kn_model *m, const kn_json *j, const char *cfgp, bool *done) {
    kn_model_config *c = &m->cfg;
    int64_t rs = kn_json_get(j, 0, "rope_scaling");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT) rs = kn_json_get(j, 0, "rope_parameters");
    if (kn_json_kind(j, rs) != KN_JSON_OBJECT) return KN_OK;
    const char *type = kn_json_get_str(j, rs, "rope_type");
    if (!type) type = kn_json_get_str(j, rs, "type");
    if (!type || (strcmp(type, "longrope") && strcmp(type, "su"))) return KN_OK;
    int half = c->n_rot / 2;
    float *sf = json_floats(m, j, rs, "short_factor", half), *lf = json_floats(m, j, rs, "long_factor", half);
    if (!sf || !lf)
        return kn_set_error(KN_ERR_FORMAT, "%s: LongRoPE needs short_factor and long_factor arrays of %d numbers "
                            "(rotary dims / 2)", cfgp, half);
    int64_t orig = 0;
    if (!json_pos_int(j, rs, "original_max_position_embeddings", &orig) &&
        !json_pos_int(j, 0, "original_max_position_embeddings", &orig))
        orig = c->n_ctx_train;
    double factor = 0, af = 0;
    if (!kn_json_get_f64(j, rs, "factor", &factor) || !(factor > 0)) factor = (double)c->n_ctx_train / (double)orig;
    if (!kn_json_get_f64(j, rs, "attention_factor", &af) || !(af > 0))
        af = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
    *done = true;
    return longrope_set(m, sf, lf, (int)orig, af, cfgp);
}

kn_status kn__hf_arch_config(kn_model *m, const kn_json *j, const char *cfgp, bool *rope_done) {
    kn_model_config *c = &m->cfg;
    *rope_done = false;
    bool gemma = is_gemma(m);
    int64_t w = 0, wv = kn_json_get(j, 0, "sliding_window");      /* absent, null or 0: no window */
    if (wv >= 0 && kn_json_kind(j, wv) != KN_JSON_NULL && (!kn_json_int(j, wv, &w) || w < 0 || w > (1 << 30)))
        return kn_set_error(KN_ERR_FORMAT, "%s: sliding_window must be a window length (an integer >= 0) or null", cfgp);
    c->sliding_window = (int)w;
    kn_status st = KN_OK;
    if (c->arch == KN_ARCH_MISTRAL || c->arch == KN_ARCH_PHI3) st = swa_period(m, 1);
    if (!st && c->arch == KN_ARCH_PHI3) {
        double prf = 1.0;
        int64_t rp = kn_json_get(j, 0, "rope_parameters");
        if (!kn_json_get_f64(j, 0, "partial_rotary_factor", &prf) && kn_json_kind(j, rp) == KN_JSON_OBJECT)
            kn_json_get_f64(j, rp, "partial_rotary_factor", &prf);
        int n_rot = (int)(c->head_dim * prf);
        if (!(prf > 0 && prf <= 1) || n_rot < 2 || n_rot % 2)
            return kn_set_error(KN_ERR_FORMAT, "%s: partial_rotary_factor %g gives %d rotated dims of %d; they must be "
                                "even and at least 2", cfgp, prf, n_rot, c->head_dim);
        c->n_rot = n_rot;
        st = hf_longrope(m, j, cfgp, rope_done);
    }
    if (st || !gemma) return st;
    const char *act = kn_json_get_str(j, 0, "hidden_activation");
    if (!act) act = kn_json_get_str(j, 0, "hidden_act");
    if (act && strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_tanh"))
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: hidden_activation \"%s\" is not supported (Gemma uses "
                            "gelu_pytorch_tanh)", cfgp, act);
    bool bidir = false;
    if (kn_json_get_bool(j, 0, "use_bidirectional_attention", &bidir) && bidir)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s: use_bidirectional_attention (an encoder-style Gemma) is not "
                            "supported; kiln runs causal decoders", cfgp);
    double qpas = 256;
    kn_json_get_f64(j, 0, "query_pre_attn_scalar", &qpas);
    if (!(qpas > 0) || isinf(qpas)) return kn_set_error(KN_ERR_FORMAT, "%s: query_pre_attn_scalar must be positive", cfgp);
    c->attn_scale = 1.0 / sqrt(qpas);
    c->embd_scale = sqrt((double)c->dim);
    if ((st = json_cap(j, "attn_logit_softcapping", cfgp, &c->attn_softcap)) ||
        (st = json_cap(j, "final_logit_softcapping", cfgp, &c->final_softcap)))
        return st;
    int64_t period = c->arch == KN_ARCH_GEMMA2 ? 2 : 6, pv;
    if (json_pos_int(j, 0, "sliding_window_pattern", &pv) || json_pos_int(j, 0, "_sliding_window_pattern", &pv)) period = pv;
    if ((st = hf_layer_types(m, j, cfgp, period))) return st;
    if (c->arch == KN_ARCH_GEMMA3) {
        if ((st = hf_gemma3_rope(m, j, cfgp))) return st;
        *rope_done = true;
    }
    return KN_OK;
}

/* ---- GGUF metadata ----------------------------------------------------------------------- */
static bool gg_f64(const kn_gguf *g, const char *arch, const char *key, double *v) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return kn_gguf_get_f64(g, k, v);
}

/* {arch}.attention.sliding_window_pattern: a period (u32) or one bool per layer */
static kn_status gguf_pattern(kn_model *m, const char *arch, const char *path, int64_t def_period) {
    char k[160];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
    kn_gguf_type et;
    uint64_t n = 0;
    const void *data = NULL;
    if (kn_gguf_get_arr(m->gguf, k, &et, &n, &data)) {
        if (et != KN_GGUF_BOOL || n != (uint64_t)m->cfg.n_layers || !data)
            return kn_set_error(KN_ERR_FORMAT, "%s: %s must be a period or %d booleans (one per layer)", path, k,
                                m->cfg.n_layers);
        kn_status st = alloc_swa(m);
        for (int l = 0; !st && l < m->cfg.n_layers; l++) m->layer_swa[l] = ((const uint8_t *)data)[l] != 0;
        return st;
    }
    int64_t p = def_period;
    if (kn_gguf_get_i64(m->gguf, k, &p) && (p < 1 || p > (1 << 20)))
        return kn_set_error(KN_ERR_FORMAT, "%s: %s = %lld must be at least 1", path, k, (long long)p);
    return swa_period(m, p);
}

/* Phi-3 rope_factors_{short,long}.weight (f32 [n_rot/2]) */
static kn_status gguf_longrope(kn_model *m, const char *arch, const char *path) {
    const kn_gguf_tensor *s = kn_gguf_find_tensor(m->gguf, "rope_factors_short.weight");
    const kn_gguf_tensor *l = kn_gguf_find_tensor(m->gguf, "rope_factors_long.weight");
    if (!s && !l) return KN_OK;
    int half = m->cfg.n_rot / 2;
    if (!s || !l || s->type != KN_F32 || l->type != KN_F32 || s->n_dims != 1 || l->n_dims != 1 || s->ne[0] != half ||
        l->ne[0] != half || ((uintptr_t)s->data | (uintptr_t)l->data) % 4)
        return kn_set_error(KN_ERR_FORMAT, "%s: rope_factors_short.weight and rope_factors_long.weight must both be "
                            "f32 [n_rot/2 = %d]", path, half);
    double orig = m->cfg.n_ctx_train, af = 0;
    gg_f64(m->gguf, arch, "rope.scaling.original_context_length", &orig);
    if (!gg_f64(m->gguf, arch, "rope.scaling.attn_factor", &af) || !(af > 0)) {
        double factor = orig >= 1 ? m->cfg.n_ctx_train / orig : 1;
        af = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log(orig));
    }
    if (!(orig >= 1) || orig > (double)(1 << 30))
        return kn_set_error(KN_ERR_FORMAT, "%s: rope.scaling.original_context_length %g is out of range", path, orig);
    return longrope_set(m, s->data, l->data, (int)orig, af, path);
}

kn_status kn__gguf_arch_config(kn_model *m, const char *arch, const char *path) {
    kn_model_config *c = &m->cfg;
    double w = 0;
    if (gg_f64(m->gguf, arch, "attention.sliding_window", &w)) {
        if (!(w >= 0) || w > (double)(1 << 30) || w != floor(w))
            return kn_set_error(KN_ERR_FORMAT, "%s: %s.attention.sliding_window %g is not a window length", path, arch, w);
        c->sliding_window = (int)w;
    }
    kn_status st = KN_OK;
    bool gemma = is_gemma(m);
    if (c->arch == KN_ARCH_LLAMA || c->arch == KN_ARCH_PHI3) {
        if (c->sliding_window > 0 && (st = swa_period(m, 1))) return st;
        if (c->arch == KN_ARCH_PHI3) st = gguf_longrope(m, arch, path);
        return st;
    }
    if (!gemma) return KN_OK;
    double cap = 0, sc = 0;
    if (gg_f64(m->gguf, arch, "attn_logit_softcapping", &cap) && cap > 0 && !isinf(cap)) c->attn_softcap = cap;
    cap = 0;
    if (gg_f64(m->gguf, arch, "final_logit_softcapping", &cap) && cap > 0 && !isinf(cap)) c->final_softcap = cap;
    c->attn_scale = gg_f64(m->gguf, arch, "attention.scale", &sc) && sc > 0 && !isinf(sc) ? sc : gemma_default_scale(c);
    c->embd_scale = sqrt((double)c->dim);
    if (c->arch == KN_ARCH_GEMMA3) {
        double lt = 10000.0;
        gg_f64(m->gguf, arch, "rope.freq_base_swa", &lt);
        if (!(lt > 0) || isinf(lt)) return kn_set_error(KN_ERR_FORMAT, "%s: rope.freq_base_swa %g must be positive", path, lt);
        c->rope_theta_local = lt;
    }
    if (c->arch == KN_ARCH_GEMMA2 && c->sliding_window <= 0) c->sliding_window = 4096;   /* llama.cpp's default */
    return gguf_pattern(m, arch, path, c->arch == KN_ARCH_GEMMA2 ? 2 : 6);
}

/* ---- kiln info ----------------------------------------------------------------------------- */
static const char *arch_name(kn_arch a) {
    static const char *const names[] = {"llama", "gpt2", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"};
    return (unsigned)a < sizeof names / sizeof names[0] ? names[a] : "?";
}

void kn__arch_describe(const kn_model *m, char *buf, size_t n) {
    const kn_model_config *c = &m->cfg;
    size_t o = 0;
#define PUT(...) do { if (o < n) o += (size_t)snprintf(buf + o, n - o, __VA_ARGS__); } while (0)
    PUT("%s, %d layers, dim %d, heads %d/%d x %d, ffn %d, vocab %d, %s head", arch_name(c->arch), c->n_layers, c->dim,
        c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->n_vocab, c->tied_output ? "tied" : "separate");
    if (c->n_rot)
        PUT("; rope base %g on %d of %d dims (%s)%s%s", c->rope_theta, c->n_rot, c->head_dim,
            c->rope_neox ? "halves" : "pairs", c->rope_scaling[0] ? ", scaling " : "", c->rope_scaling);
    if (c->attn_scale > 0) PUT("; attention scale %.6g", c->attn_scale);
    if (c->sliding_window > 0 && m->layer_swa) {
        int k = 0;
        for (int l = 0; l < c->n_layers; l++) k += m->layer_swa[l];
        PUT("; sliding window %d on %d of %d layers", c->sliding_window, k, c->n_layers);
        if (c->rope_theta_local > 0) PUT(" (rope base %g there)", c->rope_theta_local);
    }
    if (c->attn_softcap > 0) PUT("; attention softcap %g", c->attn_softcap);
    if (c->final_softcap > 0) PUT("; final logit softcap %g", c->final_softcap);
    if (c->embd_scale > 0) PUT("; embeddings x %.6g", c->embd_scale);
#undef PUT
}

/* ---- Gemma 3 with vision: its language model's config ---------------------------------- */
typedef struct { char *p; size_t n, cap; bool oom; } jbuf;
static void jput(jbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 4096;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = true; return; }
        b->p = q; b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void jputs(jbuf *b, const char *s) { jput(b, s, strlen(s)); }
static void jstr(jbuf *b, const char *s, size_t n) {
    jputs(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '"' || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; jput(b, e, 2); }
        else if (ch < 0x20) { snprintf(e, sizeof e, "\\u%04x", ch); jputs(b, e); }
        else jput(b, (const char *)&ch, 1);
    }
    jputs(b, "\"");
}
/* the JSON text of node v (numbers as exact integers or %.17g) */
static void jval(jbuf *b, const kn_json *j, int64_t v) {
    size_t len;
    double d;
    int64_t iv;
    bool bo;
    const char *s;
    switch (kn_json_kind(j, v)) {
    case KN_JSON_NULL: jputs(b, "null"); break;
    case KN_JSON_BOOL: kn_json_bool(j, v, &bo); jputs(b, bo ? "true" : "false"); break;
    case KN_JSON_NUMBER: {
        char t[40];
        if (kn_json_int(j, v, &iv)) snprintf(t, sizeof t, "%lld", (long long)iv);
        else { kn_json_num(j, v, &d); snprintf(t, sizeof t, "%.17g", d); }
        jputs(b, t);
        break;
    }
    case KN_JSON_STRING: s = kn_json_str(j, v, &len); jstr(b, s, len); break;
    case KN_JSON_ARRAY: case KN_JSON_OBJECT: {
        bool obj = kn_json_kind(j, v) == KN_JSON_OBJECT;
        jputs(b, obj ? "{" : "[");
        for (int64_t c = kn_json_first(j, v); c >= 0; c = kn_json_next(j, c)) {
            if (c != kn_json_first(j, v)) jputs(b, ", ");
            if (obj) { s = kn_json_key(j, c, &len); jstr(b, s, len); jputs(b, ": "); }
            jval(b, j, c);
        }
        jputs(b, obj ? "}" : "]");
        break;
    }
    }
}

kn_status kn__hf_gemma3_text_config(const kn_json *j, const char *cfgp, kn_json **out) {
    *out = NULL;
    int64_t tc = kn_json_get(j, 0, "text_config");
    if (kn_json_kind(j, tc) != KN_JSON_OBJECT)
        return kn_set_error(KN_ERR_FORMAT, "%s: a Gemma3ForConditionalGeneration config needs a \"text_config\" object", cfgp);
    /* Gemma3TextConfig's defaults for the keys kiln needs and has no default for */
    static const struct { const char *key, *val; } defs[] = {
        {"vocab_size", "262208"}, {"hidden_size", "2304"}, {"intermediate_size", "9216"}, {"num_hidden_layers", "26"},
        {"num_attention_heads", "8"}, {"num_key_value_heads", "4"}, {"head_dim", "256"},
        {"max_position_embeddings", "131072"}, {"sliding_window", "4096"}, {"rms_norm_eps", "1e-06"}};
    jbuf b = {0};
    jputs(&b, "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\"");
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (kn_json_get(j, tc, defs[i].key) < 0) { jputs(&b, ", \""); jputs(&b, defs[i].key); jputs(&b, "\": "); jputs(&b, defs[i].val); }
    int64_t tie = kn_json_get(j, 0, "tie_word_embeddings");       /* a top-level setting the text part inherits */
    if (tie >= 0 && kn_json_get(j, tc, "tie_word_embeddings") < 0) { jputs(&b, ", \"tie_word_embeddings\": "); jval(&b, j, tie); }
    for (int64_t c = kn_json_first(j, tc); c >= 0; c = kn_json_next(j, c)) {
        size_t len;
        const char *k = kn_json_key(j, c, &len);
        if ((len == 13 && !memcmp(k, "architectures", 13)) || (len == 10 && !memcmp(k, "model_type", 10))) continue;
        jputs(&b, ", ");
        jstr(&b, k, len);
        jputs(&b, ": ");
        jval(&b, j, c);
    }
    jputs(&b, "}");
    if (b.oom) { free(b.p); return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    kn_status st = kn_json_parse(b.p, b.n, out);
    free(b.p);
    return st ? kn__model_err_prefix(st, cfgp) : KN_OK;
}
