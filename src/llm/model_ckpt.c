/* model_ckpt.c: kiln training checkpoints of GPT models as LLMs: the loader
 * behind kn_model_load and the GGUF exporter kn_model_export_gguf (see
 * model_ckpt.h for what the checkpoint holds and how the vocabulary is
 * mapped).
 *
 * Both go through the same description (kn__kgpt) and the same tokenizer:
 * the loader builds its tokenizer from the tokenizer.* keys the exporter
 * writes (a GGUF made in memory), so kiln and llama.cpp see one vocabulary.
 * The GGUF layout is llama.cpp's "gpt2" architecture (as src/llm/model.c's
 * load_gguf_gpt2 reads it), f32, with the output head tied to token_embd.
 *
 * Letters: V vocabulary, C width, L layers, T learned positions.
 * Non-goals: Llama-architecture checkpoints, quantizing on export.
 */
#include "llm/model_ckpt.h"
#include "kiln_ckpt.h"           /* defines: kn_gpt2_param_name, KN_GPT2_* kinds */
#include "formats/gguf.h"            /* defines: kn_gguf_open, kn_gguf_arr_str */
#include "llm/model_impl.h"      /* defines: struct kn_model, kn__model_mat, kn__model_f32 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GPT2_VOCAB = 50257 };

/* ---- metadata ------------------------------------------------------------------ */

static const char *meta(const kn__kgpt *k, const char *key) { return kn_safetensors_metadata(k->st, key); }

static kn_status meta_int(const kn__kgpt *k, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const char *v = meta(k, key);
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi)
        return kn_set_error(KN_ERR_FORMAT, "%s: metadata '%s' is %s%s%s, expected an integer in [%lld, %lld]", path, key,
                            v ? "\"" : "missing", v ? v : "", v ? "\"" : "", (long long)lo, (long long)hi);
    *out = x;
    return KN_OK;
}

/* A comma-separated list of exactly n integers in [0, hi) into out. */
static kn_status meta_list(const char *path, const char *key, const char *v, int64_t n, int64_t hi, int64_t *out) {
    const char *p = v;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x >= hi || (*end != ',' && *end != 0) || (*end == 0) != (i == n - 1))
            return kn_set_error(KN_ERR_FORMAT, "%s: metadata '%s' must list %lld integers in [0, %lld) separated by "
                                "commas (entry %lld is bad)", path, key, (long long)n, (long long)hi, (long long)i);
        out[i] = x;
        p = end + (*end == ',');
    }
    return KN_OK;
}

static kn_status old_ckpt(const char *path, const char *key) {
    return kn_set_error(KN_ERR_FORMAT, "%s: this checkpoint has no '%s' metadata (it was written by an older kiln "
                        "train), so its vocabulary cannot be rebuilt; train it again with this version of kiln",
                        path, key);
}

bool kn__is_kiln_gpt_ckpt(const char *path) {
    kn_safetensors *st;
    if (kn_safetensors_open(path, &st)) return false;
    const char *model = kn_safetensors_metadata(st, "model");
    bool yes = model && kn_safetensors_metadata(st, "step") && (!strcmp(model, "gpt2") || !strcmp(model, "char-gpt"));
    kn_safetensors_close(st);
    return yes;
}

void kn__kgpt_close(kn__kgpt *k) {
    kn_safetensors_close(k->st);
    free(k->chars);
    free(k->orig);
    memset(k, 0, sizeof *k);
}

static kn_status read_vocab(kn__kgpt *k, const char *path) {
    int64_t *tmp = malloc(sizeof *tmp * (size_t)k->V);
    if (!tmp) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    kn_status st = KN_OK;
    if (k->is_char) {
        const char *v = meta(k, "char_codepoints");
        if (!v) { st = old_ckpt(path, "char_codepoints"); goto done; }
        if ((st = meta_list(path, "char_codepoints", v, k->V, 0x110000, tmp))) goto done;
        if (!(k->chars = malloc(sizeof *k->chars * (size_t)k->V))) { st = kn_set_error(KN_ERR_NOMEM, "out of memory"); goto done; }
        for (int64_t i = 0; i < k->V; i++) k->chars[i] = (uint32_t)tmp[i];
        k->n_vocab = k->V;
    } else {
        const char *v = meta(k, "gpt2_ids");
        const char *tp = meta(k, "tokenizer");
        if (tp) snprintf(k->tok_path, sizeof k->tok_path, "%s", tp);
        k->n_vocab = GPT2_VOCAB;
        if (!v) {
            if (k->V != GPT2_VOCAB) { st = old_ckpt(path, "gpt2_ids"); goto done; }
            goto done;                                           /* --full-vocab: ids are GPT-2's */
        }
        if (k->V < 2) { st = kn_set_error(KN_ERR_FORMAT, "%s: compact vocabulary of %lld ids", path, (long long)k->V); goto done; }
        if ((st = meta_list(path, "gpt2_ids", v, k->V - 1, GPT2_VOCAB, tmp))) goto done;
        if (!(k->orig = malloc(sizeof *k->orig * (size_t)k->V))) { st = kn_set_error(KN_ERR_NOMEM, "out of memory"); goto done; }
        for (int64_t i = 0; i < k->V - 1; i++) {
            if (i && tmp[i] <= tmp[i - 1]) {
                st = kn_set_error(KN_ERR_FORMAT, "%s: metadata 'gpt2_ids' must be increasing", path);
                goto done;
            }
            k->orig[i] = (int32_t)tmp[i];
        }
    }
done:
    free(tmp);
    return st;
}

kn_status kn__kgpt_open(const char *path, kn__kgpt *k) {
    memset(k, 0, sizeof *k);
    kn_status st = kn_safetensors_open(path, &k->st);
    if (st) return st;
    const char *model = meta(k, "model");
    if (!model || !meta(k, "step") || (strcmp(model, "gpt2") && strcmp(model, "char-gpt"))) {
        st = kn_set_error(KN_ERR_FORMAT, "%s: not a checkpoint of `kiln train char` or `kiln train gpt2` (metadata model "
                          "is %s%s%s)", path, model ? "\"" : "missing", model ? model : "", model ? "\"" : "");
        goto fail;
    }
    k->is_char = !strcmp(model, "char-gpt");
    if ((st = meta_int(k, path, "vocab", 1, 1 << 24, &k->V)) || (st = meta_int(k, path, "layers", 1, 1024, &k->L)) ||
        (st = meta_int(k, path, "dim", 1, 1 << 20, &k->C)) || (st = meta_int(k, path, "heads", 1, 1 << 20, &k->H)) ||
        (st = meta_int(k, path, "ctx", 1, 1 << 24, &k->T)))
        goto fail;
    if (k->C % k->H) {
        st = kn_set_error(KN_ERR_FORMAT, "%s: dim %lld is not a multiple of heads %lld", path, (long long)k->C, (long long)k->H);
        goto fail;
    }
    if ((st = read_vocab(k, path))) goto fail;
    return KN_OK;
fail:
    kn__kgpt_close(k);
    return st;
}

const float *kn__kgpt_param(const kn__kgpt *k, const char *name, int64_t d0, int64_t d1) {
    const kn_st_tensor *t = kn_safetensors_find(k->st, name);
    int nd = d1 ? 2 : 1;
    if (!t || t->dtype != KN_F32 || t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        kn_set_error(KN_ERR_FORMAT, "checkpoint tensor '%s' is %s; expected f32 [%lld%s%.0lld] from its metadata "
                     "(layers %lld, dim %lld, vocab %lld, ctx %lld)", name, t ? "of another shape or dtype" : "missing",
                     (long long)d0, nd == 2 ? ", " : "", (long long)d1, (long long)k->L, (long long)k->C,
                     (long long)k->V, (long long)k->T);
        return NULL;
    }
    return t->data;
}

kn_status kn__kgpt_wte(const kn__kgpt *k, float **out) {
    *out = NULL;
    const float *w = kn__kgpt_param(k, "wte.weight", k->V, k->C);
    if (!w) return KN_ERR_FORMAT;
    size_t row = sizeof(float) * (size_t)k->C;
    float *e = malloc(row * (size_t)k->n_vocab);
    if (!e) return kn_set_error(KN_ERR_NOMEM, "out of memory for the %lld x %lld embedding", (long long)k->n_vocab,
                                (long long)k->C);
    if (!k->orig) {
        memcpy(e, w, row * (size_t)k->n_vocab);              /* may be unaligned in the file */
    } else {
        for (int64_t g = 0; g < k->n_vocab; g++)             /* every id: the unseen-ids row ... */
            memcpy((char *)e + row * (size_t)g, (const char *)w + row * (size_t)(k->V - 1), row);
        for (int64_t i = 0; i < k->V - 1; i++)               /* ... then the trained rows */
            memcpy((char *)e + row * (size_t)k->orig[i], (const char *)w + row * (size_t)i, row);
    }
    *out = e;
    return KN_OK;
}

/* The output head [n_vocab, C] of a compact model (NULL with KN_OK for the
 * others: their head is the embedding). The model's distribution is kept:
 * every seen id keeps its logit, and the n unseen ids share the probability
 * of the unseen-ids token u, each getting logit(u) - log(n).
 *
 * That constant needs a vector d with h . d = -log(n) for every final
 * LayerNorm output h = g * z + b: z has zero mean over the C channels, so
 * d_i = a / g_i gives h . d = a * sum_i(z_i) + a * sum_i(b_i / g_i)
 * = a * S, and a = -log(n) / S. Rounding grows with a, so S must not be
 * near zero: a trained ln_f bias makes it so, a fresh one (zero) does not,
 * and then the model is refused with a message. The head is exact in f32;
 * rounded to bf16 (a GPU's default) or quantized, the unseen ids' logits
 * move by about |a| * sqrt(C) * 2e-3. Measured on a 64-wide model after
 * 150 steps (|a| = 63): the unseen ids' total probability, at most 2.1e-5
 * in f32, became 3.6e-5 with the head rounded to bf16, 2.2e-5 to 8-bit
 * blocks of 32 (Q8_0-like). */
kn_status kn__kgpt_wout(const kn__kgpt *k, float **out) {
    *out = NULL;
    if (!k->orig) return KN_OK;
    const float *g = kn__kgpt_param(k, "ln_f.weight", k->C, 0), *b = kn__kgpt_param(k, "ln_f.bias", k->C, 0);
    if (!g || !b) return KN_ERR_FORMAT;
    int64_t C = k->C, n_unseen = k->n_vocab - (k->V - 1);
    double S = 0, gmin = INFINITY;
    for (int64_t i = 0; i < C; i++) {
        float gi, bi;
        memcpy(&gi, g + i, 4); memcpy(&bi, b + i, 4);           /* the mapping may be unaligned */
        gmin = fmin(gmin, fabs((double)gi));
        if (gi != 0) S += (double)bi / gi;
    }
    double a = n_unseen > 0 ? -log((double)n_unseen) / S : 0;
    /* f32 rounding of the C products h_i * d_i (each about |a|) that cancel
     * down to -log(n): at most about |a| * C * 6e-8 logits; keep it under
     * 0.05 (the unseen ids then have their share of the probability to 5%) */
    double worst = fabs(a) * (double)C * 6e-8;
    if (n_unseen > 0 && (!(gmin >= 1e-3) || !(worst <= 0.05)))
        return kn_set_error(KN_ERR_UNSUPPORTED, "this gpt2 model's compact vocabulary cannot be widened to GPT-2's "
                            "50257 ids faithfully (its final LayerNorm bias is still near zero: train longer, or train "
                            "with --full-vocab 1)");
    kn_status st = kn__kgpt_wte(k, out);
    if (st || n_unseen <= 0) return st;
    float *d = malloc(sizeof *d * (size_t)C);
    if (!d) { free(*out); *out = NULL; return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < C; i++) { float gi; memcpy(&gi, g + i, 4); d[i] = (float)(a / gi); }
    char *seen = calloc((size_t)k->n_vocab, 1);
    if (!seen) { free(d); free(*out); *out = NULL; return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < k->V - 1; i++) seen[k->orig[i]] = 1;
    for (int64_t v = 0; v < k->n_vocab; v++)                     /* unseen rows: the u row (from wte) + d */
        if (!seen[v]) for (int64_t i = 0; i < C; i++) (*out)[v * C + i] += d[i];
    free(seen); free(d);
    return KN_OK;
}

/* ---- tokenizer ----------------------------------------------------------------- */

/* GPT-2's printable stand-in for a byte (its bytes_to_unicode table). */
static uint32_t byte_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

static size_t utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* char: token i is the byte-level spelling of character i; no merges. The
 * sample start of training ('\n') is BOS; there is no end token. */
static kn_status char_tokenizer(const kn__kgpt *k, kn_gguf_writer *w) {
    int64_t V = k->V;
    for (int64_t i = 0; i < V; i++)
        if (k->chars[i] >= 0x80)
            return kn_set_error(KN_ERR_UNSUPPORTED, "this char model's vocabulary has the non-ASCII character U+%04X; "
                                "kiln runs and exports char models of ASCII text only (a byte-level vocabulary has no "
                                "token for each byte of it)", (unsigned)k->chars[i]);
    char *text = malloc(4 * (size_t)V);
    const char **strs = malloc(sizeof *strs * (size_t)V);
    size_t *lens = malloc(sizeof *lens * (size_t)V);
    int32_t *types = malloc(sizeof *types * (size_t)V);
    if (!text || !strs || !lens || !types) {
        free(text); free(strs); free(lens); free(types);
        return kn_set_error(KN_ERR_NOMEM, "out of memory");
    }
    int32_t bos = -1;
    for (int64_t i = 0; i < V; i++) {
        strs[i] = text + 4 * i;
        lens[i] = utf8_put(byte_cp(k->chars[i]), text + 4 * i);
        types[i] = 1;                                        /* normal */
        if (k->chars[i] == '\n') bos = (int32_t)i;
    }
    kn_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    kn_gguf_w_str(w, "tokenizer.ggml.pre", "gpt-2");   /* llama.cpp spells it so */
    kn_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)V, strs, lens);
    kn_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", (uint64_t)V, types);
    kn_gguf_w_arr_str(w, "tokenizer.ggml.merges", 0, NULL, NULL);
    if (bos >= 0) kn_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    kn_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    free(text); free(strs); free(lens); free(types);
    return kn_gguf_writer_status(w);
}

/* Copies string array key of g into w. */
static kn_status copy_str_arr(const kn_gguf *g, const char *key, kn_gguf_writer *w, const char *src) {
    kn_gguf_type et;
    uint64_t n;
    const void *data;
    if (!kn_gguf_get_arr(g, key, &et, &n, &data) || et != KN_GGUF_STRING)
        return kn_set_error(KN_ERR_FORMAT, "%s: no %s string array; pass the GPT-2 vocabulary ggml-vocab-gpt-2.gguf",
                            src, key);
    const char **strs = malloc(sizeof *strs * (size_t)(n ? n : 1));
    size_t *lens = malloc(sizeof *lens * (size_t)(n ? n : 1));
    if (!strs || !lens) { free(strs); free(lens); return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    for (uint64_t i = 0; i < n; i++) {
        kn_gguf_str s = kn_gguf_arr_str(g, key, i);
        strs[i] = s.ptr; lens[i] = s.len;
    }
    kn_gguf_w_arr_str(w, key, n, strs, lens);
    free(strs); free(lens);
    return kn_gguf_writer_status(w);
}

/* gpt2: the tokens, token types and merges of the GPT-2 vocabulary file.
 * Training documents are separated by <|endoftext|>, so it starts a prompt
 * (add_bos) and ends a generation. */
static kn_status gpt2_tokenizer(const kn__kgpt *k, const char *tok_path, kn_gguf_writer *w) {
    const char *p = tok_path ? tok_path : k->tok_path;
    if (!*p)
        return kn_set_error(KN_ERR_INVALID, "this gpt2 checkpoint records no tokenizer; pass the GPT-2 vocabulary with "
                            "-z ggml-vocab-gpt-2.gguf");
    kn_gguf *g;
    kn_status st = kn_gguf_open(p, &g);
    if (st) {
        char m[600];
        snprintf(m, sizeof m, "%s", kn_last_error());
        return kn_set_error(st, "GPT-2 vocabulary %s: %s; pass it with -z ggml-vocab-gpt-2.gguf", p, m);
    }
    kn_gguf_str model;
    uint64_t n = 0;
    kn_gguf_type et;
    const void *data;
    if (!kn_gguf_get_str(g, "tokenizer.ggml.model", &model) || model.len != 4 || memcmp(model.ptr, "gpt2", 4) ||
        !kn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) || n != GPT2_VOCAB) {
        kn_gguf_close(g);
        return kn_set_error(KN_ERR_FORMAT, "%s is not the GPT-2 vocabulary (a \"gpt2\" tokenizer of %d tokens); pass "
                            "ggml-vocab-gpt-2.gguf with -z", p, GPT2_VOCAB);
    }
    kn_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    kn_gguf_w_str(w, "tokenizer.ggml.pre", "gpt-2");   /* llama.cpp spells it so */
    st = copy_str_arr(g, "tokenizer.ggml.tokens", w, p);
    if (!st) st = copy_str_arr(g, "tokenizer.ggml.merges", w, p);
    if (!st && kn_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data) && n == GPT2_VOCAB) {
        int32_t *types = malloc(sizeof *types * GPT2_VOCAB);
        if (!types) st = kn_set_error(KN_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; !st && i < n; i++) {
            int64_t v = 1;
            if (et == KN_GGUF_I32 || et == KN_GGUF_U32) { int32_t x; memcpy(&x, (const char *)data + 4 * i, 4); v = x; }
            types[i] = (int32_t)v;
        }
        if (!st) kn_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", n, types);
        free(types);
    }
    kn_gguf_close(g);
    if (st) return st;
    kn_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", GPT2_VOCAB - 1);
    kn_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", GPT2_VOCAB - 1);
    kn_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    return kn_gguf_writer_status(w);
}

kn_status kn__kgpt_add_tokenizer(const kn__kgpt *k, const char *tok_path, kn_gguf_writer *w) {
    return k->is_char ? char_tokenizer(k, w) : gpt2_tokenizer(k, tok_path, w);
}

/* ---- the engine's loader -------------------------------------------------------- */

static kn_status load_tokenizer(kn_model *m, const kn__kgpt *k, const char *tok_path) {
    if (k->is_char && tok_path) return kn__model_load_tokenizer(m, tok_path);   /* an explicit one replaces ours */
    kn_gguf_writer *w;
    kn_status st = kn_gguf_writer_new(&w);
    if (st) return st;
    void *buf = NULL;
    size_t size = 0;
    kn_gguf *g = NULL;
    if (!(st = kn__kgpt_add_tokenizer(k, tok_path, w)) && !(st = kn_gguf_write_memory(w, &buf, &size)) &&
        !(st = kn_gguf_open_memory(buf, size, &g)))
        st = kn_tokenizer_from_gguf(g, &m->tok);
    kn_gguf_close(g);
    free(buf);
    kn_gguf_writer_free(w);
    return st;
}

static const float *param(const kn__kgpt *k, int kind, int layer, int64_t d0, int64_t d1, kn_status *st) {
    if (*st) return NULL;
    char name[128];
    if ((*st = kn_gpt2_param_name(NULL, kind, layer, name, sizeof name))) return NULL;
    const float *p = kn__kgpt_param(k, name, d0, d1);
    if (!p) *st = KN_ERR_FORMAT;
    return p;
}

/* f32 vector / table and [out, in] matrix of checkpoint data; NULL when p is */
static kn_tensor *vec(kn_model *m, int64_t rows, int64_t n, const float *p, const char *name) {
    return p ? kn__model_f32(m, KN_F32, rows, n, p, name) : NULL;
}
static kn_tensor *mat(kn_model *m, int64_t out, int64_t in, const float *p, const char *name) {
    return p ? kn__model_mat(m, KN_F32, out, in, p, false, name) : NULL;
}

kn_status kn__load_kiln_ckpt(kn_model *m, const char *path, const char *tok_path) {
    kn__kgpt k;
    kn_status st = kn__kgpt_open(path, &k);
    if (st) return st;
    kn_model_config *c = &m->cfg;
    c->arch = KN_ARCH_GPT2;
    c->dim = (int)k.C; c->n_layers = (int)k.L; c->n_heads = c->n_kv_heads = (int)k.H;
    c->head_dim = (int)(k.C / k.H); c->ffn_dim = 4 * (int)k.C; c->n_vocab = (int)k.n_vocab;
    c->n_ctx_train = (int)k.T; c->n_rot = 0; c->rope_theta = 0; c->rope_freq_scale = 1; c->rope_neox = false;
    c->norm_eps = 1e-5; c->tied_output = true; c->weight_type = KN_F32;
    const char *base = strrchr(path, '/');
    snprintf(c->name, sizeof c->name, "kiln %s (%s)", k.is_char ? "char-gpt" : "gpt2", base ? base + 1 : path);
    int64_t C = k.C, F = 4 * k.C;
    float *wte = NULL, *wout = NULL;
    if ((st = kn__kgpt_wte(&k, &wte))) goto done;
    float *owned = kn__model_alloc(m, sizeof(float) * (size_t)(k.n_vocab * C));
    if (!owned) { st = KN_ERR_NOMEM; goto done; }
    memcpy(owned, wte, sizeof(float) * (size_t)(k.n_vocab * C));
    m->tok_embd = m->wout = kn__model_mat(m, KN_F32, k.n_vocab, C, owned, false, "wte");
    if ((st = kn__kgpt_wout(&k, &wout))) goto done;
    if (wout) {                                  /* a compact model's widened head */
        float *ow = kn__model_alloc(m, sizeof(float) * (size_t)(k.n_vocab * C));
        if (!ow) { st = KN_ERR_NOMEM; goto done; }
        memcpy(ow, wout, sizeof(float) * (size_t)(k.n_vocab * C));
        m->wout = kn__model_mat(m, KN_F32, k.n_vocab, C, ow, false, "output");
        c->tied_output = false;
    }
    m->pos_embd = vec(m, k.T, C, param(&k, KN_GPT2_WPE, 0, k.T, C, &st), "wpe");
    m->out_norm = vec(m, 0, C, param(&k, KN_GPT2_LNFW, 0, C, 0, &st), "ln_f.weight");
    m->out_norm_b = vec(m, 0, C, param(&k, KN_GPT2_LNFB, 0, C, 0, &st), "ln_f.bias");
    if (st) goto done;
    if (!m->tok_embd || !m->pos_embd || !m->out_norm || !m->out_norm_b) { st = KN_ERR_NOMEM; goto done; }
    if (!(m->layers = calloc((size_t)k.L, sizeof *m->layers))) { st = kn_set_error(KN_ERR_NOMEM, "out of memory"); goto done; }
    for (int l = 0; l < (int)k.L && !st; l++) {
        kn__layer_w *L = &m->layers[l];
#define VEC(kind, n) vec(m, 0, n, param(&k, kind, l, n, 0, &st), #kind)
#define MAT(kind, r, cc) mat(m, r, cc, param(&k, kind, l, r, cc, &st), #kind)
        L->attn_norm = VEC(KN_GPT2_LN1W, C);
        L->attn_norm_b = VEC(KN_GPT2_LN1B, C);
        L->wqkv = MAT(KN_GPT2_QKVW, 3 * C, C);
        L->bqkv = VEC(KN_GPT2_QKVB, 3 * C);
        L->wo = MAT(KN_GPT2_ATTPROJW, C, C);
        L->bo = VEC(KN_GPT2_ATTPROJB, C);
        L->ffn_norm = VEC(KN_GPT2_LN2W, C);
        L->ffn_norm_b = VEC(KN_GPT2_LN2B, C);
        L->w1 = MAT(KN_GPT2_FCW, F, C);
        L->b1 = VEC(KN_GPT2_FCB, F);
        L->w2 = MAT(KN_GPT2_FCPROJW, C, F);
        L->b2 = VEC(KN_GPT2_FCPROJB, C);
#undef VEC
#undef MAT
        if (!st && (!L->attn_norm || !L->attn_norm_b || !L->wqkv || !L->bqkv || !L->wo || !L->bo || !L->ffn_norm ||
                    !L->ffn_norm_b || !L->w1 || !L->b1 || !L->w2 || !L->b2))
            st = KN_ERR_NOMEM;
    }
    if (!st) st = load_tokenizer(m, &k, tok_path);
done:
    free(wte); free(wout);
    if (!st) { m->st = k.st; k.st = NULL; }        /* the model keeps the mapping its weights point into */
    kn__kgpt_close(&k);
    return st ? kn__model_err_prefix(st, path) : KN_OK;
}

kn_status kn__print_info_kiln_ckpt(const char *path, void *fp) {
    FILE *f = fp;
    kn__kgpt k;
    kn_status st = kn__kgpt_open(path, &k);
    if (st) return st;
    const char *step = meta(&k, "step");
    fprintf(f, "kiln training checkpoint: %s, step %s\n  GPT-2 architecture: %lld layers, dim %lld, %lld heads, "
            "context %lld, vocabulary %lld", k.is_char ? "char-gpt" : "gpt2", step ? step : "?", (long long)k.L,
            (long long)k.C, (long long)k.H, (long long)k.T, (long long)k.V);
    if (k.is_char) fprintf(f, " characters\n");
    else if (k.orig) fprintf(f, " (compact: %lld GPT-2 ids + 1 for unseen ids; runs as 50257)\n", (long long)(k.V - 1));
    else fprintf(f, " (GPT-2)\n");
    if (!k.is_char) fprintf(f, "tokenizer: %s\n", k.tok_path[0] ? k.tok_path : "none recorded (pass -z ggml-vocab-gpt-2.gguf)");
    fprintf(f, "run it: kiln generate -m %s -p TEXT; as GGUF: kiln export -m %s -o OUT.gguf\n", path, path);
    kn__kgpt_close(&k);
    return KN_OK;
}

/* ---- GGUF export ----------------------------------------------------------------- */

kn_status kn_model_export_gguf(const char *ckpt_path, const char *tok_path, const char *out_path) {
    if (!ckpt_path || !out_path) return kn_set_error(KN_ERR_INVALID, "kn_model_export_gguf: NULL path");
    kn__kgpt k;
    kn_status st = kn__kgpt_open(ckpt_path, &k);
    if (st) return st;
    kn_gguf_writer *w = NULL;
    float *wte = NULL, *wout = NULL;
    if ((st = kn_gguf_writer_new(&w)) || (st = kn__kgpt_wte(&k, &wte)) || (st = kn__kgpt_wout(&k, &wout))) goto done;
    int64_t C = k.C, F = 4 * k.C, V = k.n_vocab, T = k.T;
    char name[160];
    snprintf(name, sizeof name, "kiln %s", k.is_char ? "char-gpt" : "gpt2");
    kn_gguf_w_str(w, "general.architecture", "gpt2");
    kn_gguf_w_str(w, "general.name", name);
    kn_gguf_w_u32(w, "general.file_type", 0);                  /* all f32 */
    kn_gguf_w_u32(w, "gpt2.context_length", (uint32_t)T);
    kn_gguf_w_u32(w, "gpt2.embedding_length", (uint32_t)C);
    kn_gguf_w_u32(w, "gpt2.feed_forward_length", (uint32_t)F);
    kn_gguf_w_u32(w, "gpt2.block_count", (uint32_t)k.L);
    kn_gguf_w_u32(w, "gpt2.attention.head_count", (uint32_t)k.H);
    kn_gguf_w_f32(w, "gpt2.attention.layer_norm_epsilon", 1e-5f);
    if ((st = kn__kgpt_add_tokenizer(&k, tok_path, w))) goto done;
    /* GGML sizes: ne[0] is the row length (inputs), ne[1] the rows (outputs) */
#define T1(nm, n, data) do { const float *d_ = (data); if (!st) kn_gguf_w_tensor_f32(w, nm, 1, (int64_t[]){n}, d_); } while (0)
#define T2(nm, rows, cols, data) \
    do { const float *d_ = (data); if (!st) kn_gguf_w_tensor_f32(w, nm, 2, (int64_t[]){cols, rows}, d_); } while (0)
    T2("token_embd.weight", V, C, wte);
    if (wout) T2("output.weight", V, C, wout);               /* a compact model's widened head */
    T2("position_embd.weight", T, C, param(&k, KN_GPT2_WPE, 0, T, C, &st));
    T1("output_norm.weight", C, param(&k, KN_GPT2_LNFW, 0, C, 0, &st));
    T1("output_norm.bias", C, param(&k, KN_GPT2_LNFB, 0, C, 0, &st));
    for (int l = 0; l < (int)k.L && !st; l++) {
        char n[96];
#define BLK(suffix) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), n)
        T1(BLK("attn_norm.weight"), C, param(&k, KN_GPT2_LN1W, l, C, 0, &st));
        T1(BLK("attn_norm.bias"), C, param(&k, KN_GPT2_LN1B, l, C, 0, &st));
        T2(BLK("attn_qkv.weight"), 3 * C, C, param(&k, KN_GPT2_QKVW, l, 3 * C, C, &st));
        T1(BLK("attn_qkv.bias"), 3 * C, param(&k, KN_GPT2_QKVB, l, 3 * C, 0, &st));
        T2(BLK("attn_output.weight"), C, C, param(&k, KN_GPT2_ATTPROJW, l, C, C, &st));
        T1(BLK("attn_output.bias"), C, param(&k, KN_GPT2_ATTPROJB, l, C, 0, &st));
        T1(BLK("ffn_norm.weight"), C, param(&k, KN_GPT2_LN2W, l, C, 0, &st));
        T1(BLK("ffn_norm.bias"), C, param(&k, KN_GPT2_LN2B, l, C, 0, &st));
        T2(BLK("ffn_up.weight"), F, C, param(&k, KN_GPT2_FCW, l, F, C, &st));
        T1(BLK("ffn_up.bias"), F, param(&k, KN_GPT2_FCB, l, F, 0, &st));
        T2(BLK("ffn_down.weight"), C, F, param(&k, KN_GPT2_FCPROJW, l, C, F, &st));
        T1(BLK("ffn_down.bias"), C, param(&k, KN_GPT2_FCPROJB, l, C, 0, &st));
#undef BLK
    }
#undef T1
#undef T2
    if (!st) st = kn_gguf_write_file(w, out_path);
done:
    free(wte); free(wout);
    kn_gguf_writer_free(w);
    kn__kgpt_close(&k);
    return st;
}
