/* convert_vocab.c: the vocabulary half of `kiln convert` (convert_hf.c): a
 * Hugging Face tokenizer.json, already loaded by kiln (struct kn_tokenizer +
 * struct kn_hf), as llama.cpp's tokenizer.ggml.* keys, the way its
 * convert_hf_to_gguf.py writes them.
 *
 * Two kinds of vocabulary:
 *   byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM):  model "gpt2", the
 *     pre-tokenizer's llama.cpp name, tokens, types, merges "a b";
 *   SentencePiece-style BPE (Llama 2, Mistral v0.1-v0.3, Gemma 2/3: BPE with
 *     byte_fallback, spaces as U+2581 through a Replace normalizer, optionally
 *     a Prepend("▁") normalizer or a Metaspace pre-tokenizer for the dummy
 *     prefix): model "llama", tokens (with their ▁), scores, types
 *     (normal / unknown / control / user-defined / unused / byte for
 *     <0xNN>), tokenizer.ggml.add_space_prefix = false when no dummy prefix
 *     is added (llama.cpp's default is true; its Gemma converter writes false).
 * Both: bos/eos/unk/pad ids, add_bos (add_eos from tokenizer_config.json),
 * the chat template; rows past the tokenizer's size (a padded embedding) as
 * "[PADn]" of type unused.
 *
 * Scores. llama.cpp's "llama" tokenizer does not read merges: it joins the
 * adjacent pair whose concatenation is the entry of highest score (leftmost
 * on ties). A tokenizer.json made from a SentencePiece model (transformers'
 * LlamaConverter / GemmaConverter) lists as merges every split of each piece
 * into two pieces, piece by piece in score order; so score = -(rank of the
 * piece's first merge) makes the two algorithms take the same steps.
 * llama.cpp's LlamaHfVocab (the path for tokenizer.json without
 * tokenizer.model) writes -1000 for every token, a placeholder under which
 * its tokenizer merges left to right and splits text unlike transformers; a
 * converted tokenizer.model holds SentencePiece's own scores, which fall
 * with the piece's order as these do. Before writing, the merges are checked
 * to be of that form (every two-piece split of a normal entry is a merge,
 * each entry's merges are consecutive, each character of a normal entry is an
 * entry; control, user-defined and byte entries are matched whole or never);
 * a vocabulary that is not (a BPE trained by `tokenizers` itself, say) would
 * tokenize differently in llama.cpp and is refused with what to do.
 * Non-goals: Unigram and WordPiece tokenizer.json (llama.cpp writes them only
 * for T5/BERT-family models, as tokenizer.ggml.model "t5" / "bert", which
 * kiln neither converts nor reads: refused with what to do); a Metaspace
 * "first" prepend scheme is written as add_space_prefix (llama.cpp adds the
 * space after every special token and also before text that starts with
 * one, where transformers' Metaspace does not).
 */
#include "llm/quantize_impl.h"
#include "llm/model_impl.h"        /* defines: struct kn_model (tokenizer, chat template) */
#include "llm/tok_hf.h"            /* defines: struct kn_hf, kn_tokenizer internals       */
#include "formats/hfconfig.h"      /* defines: kn_json (tokenizer_config.json)            */
#include "formats/gguf.h"          /* defines: KN_GGUF_F32                                */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char U2581[] = "\xE2\x96\x81";   /* SentencePiece's visible space, '▁' */

static int cmp_rank(const void *a, const void *b) {
    int32_t x = ((const kn_bpe_merge *)a)->rank, y = ((const kn_bpe_merge *)b)->rank;
    return (x > y) - (x < y);
}

/* The tokenizer's merges in rank order, [*n]; NULL when out of memory. */
static kn_bpe_merge *sorted_merges(const kn_tokenizer *t, size_t *n) {
    kn_bpe_merge *mg = calloc(t->merge_cap + 1, sizeof *mg);
    *n = 0;
    for (size_t i = 0; mg && i < t->merge_cap; i++)
        if (t->merges[i].rank >= 0) mg[(*n)++] = t->merges[i];
    if (mg) qsort(mg, *n, sizeof *mg, cmp_rank);
    return mg;
}

/* llama.cpp's name of a byte-level BPE pre-tokenizer, or NULL */
static const char *pre_name(const struct kn_hf *hf) {
    if (hf->n_pre == 1 && hf->pre[0].type == KN_HFP_BYTELEVEL && hf->pre[0].use_regex) return "gpt-2";
    if (hf->n_pre == 2 && hf->pre[1].type == KN_HFP_BYTELEVEL) {
        const kn_hf_pre *a = &hf->pre[0];
        if (a->type == KN_HFP_DIGITS && a->individual && hf->pre[1].use_regex) return "smollm";
        if (a->type == KN_HFP_SPLIT && !hf->pre[1].use_regex) {
            if (a->pattern == KN_PRETOK_LLAMA3) return "llama-bpe";
            if (a->pattern == KN_PRETOK_QWEN2) return "qwen2";
            if (a->pattern == KN_PRETOK_GPT2) return "gpt-2";
        }
    }
    return NULL;
}

/* ---- SentencePiece style: is it one, and with a dummy prefix? ------------------- */

static bool is_str(const char *s, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(s, lit, n); }

/* NULL when hf's normalizers and pre-tokenizers are SentencePiece's whitespace
 * handling (*prefix: a dummy "▁" goes before the text); else what is not. */
static const char *spm_shape(const struct kn_hf *hf, bool *prefix) {
    bool replaced = false;
    *prefix = false;
    for (int i = 0; i < hf->n_norm; i++) {
        const kn_hf_norm *n = &hf->norm[i];
        if (n->type == KN_HFN_PREPEND && is_str(n->a, n->na, U2581) && !replaced) *prefix = true;
        else if (n->type == KN_HFN_REPLACE && is_str(n->a, n->na, " ") && is_str(n->b, n->nb, U2581)) replaced = true;
        else return "a normalizer other than Prepend(\"\xE2\x96\x81\") and Replace(\" \", \"\xE2\x96\x81\")";
    }
    for (int i = 0; i < hf->n_pre; i++) {
        const kn_hf_pre *p = &hf->pre[i];
        if (p->type == KN_HFP_SPLITSTR && is_str(p->a, p->na, " ") && replaced) continue;   /* no spaces left */
        if (p->type != KN_HFP_METASPACE || replaced || !is_str(p->a, p->na, U2581))
            return "a pre-tokenizer other than Metaspace(\"\xE2\x96\x81\") (or Gemma's Split on \" \" after Replace)";
        if (p->split) return "a Metaspace pre-tokenizer that splits words (SentencePiece does not)";
        replaced = true;
        *prefix = p->prepend != KN_HF_PREPEND_NEVER;
    }
    if (!replaced) return "no Replace(\" \", \"\xE2\x96\x81\") normalizer or Metaspace pre-tokenizer";
    return NULL;
}

static int32_t model_id(const kn_tokenizer *t, const char *s, size_t n) {
    int32_t id = kn__tok_lookup(t, s, n);
    return id >= 0 && t->hf->in_model[id] ? id : -1;
}

static bool utf8_start(char c) { return ((unsigned char)c & 0xC0) != 0x80; }

/* score[id] = -(rank of the first merge making id), 0 for entries no merge
 * makes; KN_OK when the merges are SentencePiece's (see the header), else an
 * error naming the first entry that shows they are not. */
static kn_status spm_scores(const kn_tokenizer *t, const char *dir, float *score) {
    size_t nm;
    kn_bpe_merge *mg = sorted_merges(t, &nm);
    uint8_t *done = calloc((size_t)t->n_vocab + 1, 1);
    kn_status st = mg && done ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
    const char *fix = "Pass --no-vocab to write the model without one (kiln then runs it with -z on this "
                      "tokenizer.json)";
    for (int32_t i = 0; i < t->n_vocab; i++) score[i] = 0;
    int32_t prev = -1;
    for (size_t i = 0; i < nm && !st; i++) {          /* each entry's merges consecutive */
        int32_t id = mg[i].id;
        if (id == prev) continue;
        if (prev >= 0) done[prev] = 1;
        if (done[id]) {
            size_t n;
            const char *s = kn__tok_text(t, id, &n);
            st = kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: the merges making \"%.*s\" are not consecutive "
                              "(merge %zu), so no score per entry can order them as this BPE does and llama.cpp's "
                              "\"llama\" tokenizer would split text differently. SentencePiece-derived files (Llama 2, "
                              "Mistral, Gemma) have them in a row. %s", dir, (int)(n > 40 ? 40 : n), s, i, fix);
        }
        score[id] = -(float)mg[i].rank;
        prev = id;
    }
    for (int32_t id = 0; id < t->n_vocab && !st; id++) {   /* every two-piece split is a merge */
        if (!t->hf->in_model[id] || t->types[id] != KN_TOKEN_NORMAL) continue;   /* specials are cut out first */
        size_t n;
        const char *s = kn__tok_text(t, id, &n);
        for (size_t k = 0, c; k < n && !st; k += c) {     /* each character an entry */
            for (c = 1; k + c < n && !utf8_start(s[k + c]); c++) {}
            if (c < n && model_id(t, s + k, c) < 0)
                st = kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: the entry \"%.*s\" holds the character "
                                  "\"%.*s\", which is no entry itself: llama.cpp's \"llama\" tokenizer would join it "
                                  "where this BPE falls back to bytes. %s", dir, (int)(n > 40 ? 40 : n), s, (int)c,
                                  s + k, fix);
        }
        for (size_t k = 1; k < n && !st; k++) {
            if (!utf8_start(s[k])) continue;
            int32_t l = model_id(t, s, k), r = model_id(t, s + k, n - k);
            if (l < 0 || r < 0 || st) continue;
            const kn_bpe_merge *m = kn__merge_find(t, l, r);
            if (!m || m->id != id)
                st = kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: \"%.*s\" + \"%.*s\" make the entry \"%.*s\" "
                                  "but are no merge, so its merges are not SentencePiece's and llama.cpp's \"llama\" "
                                  "tokenizer (which joins any two pieces that make an entry) would split text "
                                  "differently. %s", dir, (int)k, s, (int)(n - k), s + k, (int)(n > 40 ? 40 : n), s, fix);
        }
    }
    free(mg); free(done);
    return st;
}

/* ---- writing ------------------------------------------------------------------------ */

/* tokens [V] (past the tokenizer: [PADn]) with GGUF types; spm: keep unknown/byte types */
static kn_status tokens(kn_gguf_writer *w, const kn_tokenizer *t, int64_t V, bool spm) {
    const char **txt = calloc((size_t)V + 1, sizeof *txt);
    size_t *len = calloc((size_t)V + 1, sizeof *len);
    int32_t *type = calloc((size_t)V + 1, sizeof *type);
    char (*pad)[24] = calloc((size_t)V + 1, sizeof *pad);
    kn_status st = txt && len && type && pad ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < V && !st; i++) {
        size_t n = 0;
        const char *s = i < t->n_vocab ? kn__tok_text(t, (int32_t)i, &n) : NULL;
        int ty = i < t->n_vocab ? t->types[i] : KN_TOKEN_UNUSED;
        if (!s || !n || ty == KN_TOKEN_UNUSED) {
            len[i] = (size_t)snprintf(pad[i], sizeof pad[i], "[PAD%lld]", (long long)i);
            txt[i] = pad[i];
            type[i] = KN_TOKEN_UNUSED;
        } else {
            txt[i] = s; len[i] = n;
            type[i] = !spm && (ty == KN_TOKEN_BYTE || ty == KN_TOKEN_UNKNOWN) ? KN_TOKEN_NORMAL : ty;
        }
    }
    if (!st) {
        kn_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)V, txt, len);
        kn_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", (uint64_t)V, type);
    }
    free(txt); free(len); free(type); free(pad);
    return st;
}

static kn_status merges(kn_gguf_writer *w, const kn_tokenizer *t) {
    size_t nm, total = 0;
    kn_bpe_merge *mg = sorted_merges(t, &nm);
    const char **ms = calloc(nm + 1, sizeof *ms);
    size_t *ml = calloc(nm + 1, sizeof *ml);
    for (size_t i = 0; mg && ms && ml && i < nm; i++) {
        size_t a, b;
        kn__tok_text(t, (int32_t)(mg[i].key >> 32), &a);
        kn__tok_text(t, (int32_t)(uint32_t)mg[i].key, &b);
        total += a + b + 1;
    }
    char *mb = mg && ms && ml ? malloc(total + 1) : NULL;
    if (!mb) { free(mg); free(ms); free(ml); return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0, o = 0; i < nm; i++) {            /* "left right" */
        size_t a, b;
        const char *sa = kn__tok_text(t, (int32_t)(mg[i].key >> 32), &a);
        const char *sb = kn__tok_text(t, (int32_t)(uint32_t)mg[i].key, &b);
        ms[i] = mb + o;
        memcpy(mb + o, sa, a); mb[o + a] = ' '; memcpy(mb + o + a + 1, sb, b);
        ml[i] = a + b + 1;
        o += a + b + 1;
    }
    kn_gguf_w_arr_str(w, "tokenizer.ggml.merges", (uint64_t)nm, ms, ml);   /* copied: freed below */
    free(mg); free(ms); free(ml); free(mb);
    return KN_OK;
}

/* special ids, add_bos / add_eos, chat template: what llama.cpp's SpecialVocab writes */
static void specials(kn_gguf_writer *w, const kn_model *m, const char *dir) {
    const kn_tokenizer *t = m->tok;
    if (t->bos >= 0) kn_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos);
    if (t->eos >= 0) kn_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos);
    if (t->unk >= 0) kn_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk);
    if (t->pad >= 0) kn_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)t->pad);
    kn_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    kn_json *j = NULL;
    bool eos;
    if (!kn_json_load(path, &j) && kn_json_get_bool(j, 0, "add_eos_token", &eos))
        kn_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", eos);
    kn_json_free(j);
    kn_clear_error();                                  /* a missing tokenizer_config.json is no error */
    if (m->chat_template) kn_gguf_w_str(w, "tokenizer.chat_template", m->chat_template);
}

kn_status kn__convert_vocab(kn_gguf_writer *w, const kn_model *m, int64_t V, const kn_quantize_params *p,
                            const char *dir) {
    const kn_tokenizer *t = m->tok;
    if (!t || p->no_vocab) return KN_OK;                /* no tokenizer.json: ids only */
    const struct kn_hf *hf = t->hf;
    const char *fix = "Pass --no-vocab to write the model without one (kiln then runs it with -z on the "
                      "tokenizer.json)";
    if (!hf) return kn_set_error(KN_ERR_UNSUPPORTED, "%s: the tokenizer is not a tokenizer.json. %s", dir, fix);
    if (hf->model == KN_HFM_UNIGRAM || hf->model == KN_HFM_WORDPIECE)
        return kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: a %s vocabulary; llama.cpp writes those only "
                            "for %s models (tokenizer.ggml.model \"%s\"), which kiln neither converts nor reads. %s",
                            dir, hf->model == KN_HFM_UNIGRAM ? "Unigram" : "WordPiece",
                            hf->model == KN_HFM_UNIGRAM ? "T5-family" : "BERT-family",
                            hf->model == KN_HFM_UNIGRAM ? "t5" : "bert", fix);
    bool bytelevel = false;
    for (int i = 0; i < hf->n_pre; i++) bytelevel |= hf->pre[i].type == KN_HFP_BYTELEVEL;
    kn_status st = KN_OK;
    if (bytelevel) {
        const char *pre = pre_name(hf);
        if (!pre)
            return kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: a byte-level BPE whose pre-tokenizer llama.cpp "
                                "has no name for (GPT-2, Llama 3, Qwen2 and SmolLM are converted). %s", dir, fix);
        kn_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
        kn_gguf_w_str(w, "tokenizer.ggml.pre", pre);
        if (!(st = tokens(w, t, V, false))) st = merges(w, t);
    } else {
        bool prefix;
        const char *why = hf->byte_fallback ? spm_shape(hf, &prefix) : "no byte_fallback";
        if (why || hf->ignore_merges)
            return kn_set_error(KN_ERR_UNSUPPORTED, "%s/tokenizer.json: neither a byte-level BPE nor a SentencePiece-"
                                "style BPE (byte_fallback, spaces as U+2581) as llama.cpp converts them: it has %s. %s",
                                dir, why ? why : "ignore_merges", fix);
        float *score = malloc(sizeof *score * (size_t)(V > t->n_vocab ? V : t->n_vocab));
        if (!score) return kn_set_error(KN_ERR_NOMEM, "out of memory");
        if (!(st = spm_scores(t, dir, score))) {
            for (int64_t i = t->n_vocab; i < V; i++) score[i] = -1000.0f;   /* [PADn], as llama.cpp pads */
            kn_gguf_w_str(w, "tokenizer.ggml.model", "llama");
            kn_gguf_w_str(w, "tokenizer.ggml.pre", "default");
            st = tokens(w, t, V, true);
            kn_gguf_w_arr(w, "tokenizer.ggml.scores", KN_GGUF_F32, (uint64_t)V, score);
            if (!prefix) kn_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", false);
        }
        free(score);
    }
    if (!st) specials(w, m, dir);
    return st;
}
