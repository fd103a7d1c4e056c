/* tok_hfjson.c: reads a Hugging Face tokenizer.json (and tokenizer_config.json
 * beside it) into a kn_tokenizer of kind KN_TOKENIZER_HF: the vocabulary and
 * added tokens into the shared token table, merges into the BPE merge table,
 * the normalizer / pre-tokenizer / decoder steps into struct kn_hf (tok_hf.h),
 * which tok_hf.c runs.
 *
 * What is read (anything else that changes the ids is refused with
 * KN_ERR_UNSUPPORTED naming it, never ignored):
 *   model          BPE (merges as "a b" strings or [a, b] pairs, byte_fallback,
 *                  fuse_unk, ignore_merges), WordPiece, Unigram;
 *   normalizer     Lowercase, Strip, Replace (string patterns), Prepend, NFC and
 *                  NFKC (only text they leave unchanged; see tok_hf.c),
 *                  BertNormalizer, Sequence;
 *   pre_tokenizer  ByteLevel, Split with the GPT-2, Llama 3 or Qwen2 regex
 *                  (tok_bpe.c's hand-written splits; other regexes refused)
 *                  or on a literal string (any behavior, not inverted),
 *                  Metaspace, Whitespace, WhitespaceSplit, BertPreTokenizer,
 *                  Digits, Punctuation (Isolated), Sequence;
 *   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip (one leading
 *                  space), Metaspace, WordPiece, Sequence; none: tokens
 *                  joined by spaces, as the library does;
 *   added_tokens   special -> KN_TOKEN_CONTROL, others -> USER_DEFINED; both
 *                  are cut out of the text before the pipeline, longest first.
 *                  Their lstrip/rstrip/single_word/normalized flags are not
 *                  applied (tokens are matched exactly as written).
 *   tokenizer_config.json: bos_token, eos_token, add_bos_token, chat_template;
 *                  without it, a TemplateProcessing post-processor that starts
 *                  with a special token gives BOS (and add_bos).
 * Limits: ids below 2^24, JSON nesting as kn_json allows.
 */
#include "llm/tok_hf.h"          /* defines: struct kn_hf and its steps          */
#include "formats/hfconfig.h"     /* defines: kn_json_*                           */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID (1 << 24)

void kn__hf_free(struct kn_hf *hf) {
    if (!hf) return;
    for (int i = 0; i < hf->n_norm; i++) { free(hf->norm[i].a); free(hf->norm[i].b); }
    for (int i = 0; i < hf->n_pre; i++) free(hf->pre[i].a);
    for (int i = 0; i < hf->n_dec; i++) { free(hf->dec[i].a); free(hf->dec[i].b); }
    free(hf->norm); free(hf->pre); free(hf->dec); free(hf->in_model);
    free(hf->prefix); free(hf->score); free(hf->chat_template);
    free(hf);
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { if (n) memcpy(p, s, n); p[n] = 0; }
    return p;
}

static kn_status bad(const char *what) {
    return kn_set_error(KN_ERR_FORMAT, "tokenizer.json: %s; is this a Hugging Face tokenizer.json "
                        "(as saved by the tokenizers library)?", what);
}

static kn_status unsupported(const char *stage, const char *type) {
    return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: %s \"%.80s\" is not supported by kiln (see "
                        "src/llm/tok_hfjson.c for the list); convert the model with a GGUF tokenizer instead",
                        stage, type);
}

/* Optional bool member: default when absent or null; false on a wrong type. */
static bool opt_bool(const kn_json *j, int64_t o, const char *key, bool dflt, bool *out) {
    int64_t v = kn_json_get(j, o, key);
    *out = dflt;
    if (v < 0 || kn_json_kind(j, v) == KN_JSON_NULL) return true;
    return kn_json_bool(j, v, out);
}

/* String member, or NULL (absent, null or not a string). */
static const char *opt_str(const kn_json *j, int64_t o, const char *key, size_t *len) {
    int64_t v = kn_json_get(j, o, key);
    *len = 0;
    return v >= 0 && kn_json_kind(j, v) == KN_JSON_STRING ? kn_json_str(j, v, len) : NULL;
}

/* ========================================================================== */
/* steps                                                                      */
/* ========================================================================== */

typedef struct steps { void *v; int n, cap; size_t elem; } steps;

static void *step_new(steps *s) {
    if (s->n >= 64) return NULL;                 /* deeper pipelines are not real tokenizers */
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 4;
        void *nv = realloc(s->v, (size_t)nc * s->elem);
        if (!nv) return NULL;
        s->v = nv; s->cap = nc;
    }
    void *e = (char *)s->v + (size_t)s->n++ * s->elem;
    memset(e, 0, s->elem);
    return e;
}

static kn_status step_fail(void) {
    return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory, or more than 64 steps in one stage");
}

/* The string of a {"String": s} pattern; NULL for {"Regex": ...}. */
static const char *pattern_str(const kn_json *j, int64_t o, size_t *n, const char **regex) {
    int64_t p = kn_json_get(j, o, "pattern");
    *regex = NULL;
    if (kn_json_kind(j, p) != KN_JSON_OBJECT) return NULL;
    size_t rn;
    *regex = opt_str(j, p, "Regex", &rn);
    return opt_str(j, p, "String", n);
}

static kn_status read_norm(const kn_json *j, int64_t o, steps *out, int depth) {
    if (o < 0 || kn_json_kind(j, o) == KN_JSON_NULL) return KN_OK;
    if (kn_json_kind(j, o) != KN_JSON_OBJECT || depth > 8) return bad("a normalizer is not an object");
    const char *ty = kn_json_get_str(j, o, "type");
    if (!ty) return bad("a normalizer has no \"type\"");
    if (!strcmp(ty, "Sequence")) {
        int64_t a = kn_json_get(j, o, "normalizers");
        if (kn_json_kind(j, a) != KN_JSON_ARRAY) return bad("Sequence normalizer without a \"normalizers\" array");
        for (int64_t v = kn_json_first(j, a); v >= 0; v = kn_json_next(j, v)) {
            kn_status st = read_norm(j, v, out, depth + 1);
            if (st != KN_OK) return st;
        }
        return KN_OK;
    }
    kn_hf_norm *n = step_new(out);
    if (!n) return step_fail();
    size_t l1 = 0, l2 = 0;
    if (!strcmp(ty, "Lowercase")) n->type = KN_HFN_LOWERCASE;
    else if (!strcmp(ty, "NFC")) n->type = KN_HFN_NFC;
    else if (!strcmp(ty, "NFKC")) n->type = KN_HFN_NFKC;
    else if (!strcmp(ty, "Strip")) {
        n->type = KN_HFN_STRIP;
        if (!opt_bool(j, o, "strip_left", true, &n->left) || !opt_bool(j, o, "strip_right", true, &n->right))
            return bad("Strip normalizer: strip_left/strip_right must be true or false");
    } else if (!strcmp(ty, "Replace")) {
        const char *rx, *a = pattern_str(j, o, &l1, &rx);
        const char *b = opt_str(j, o, "content", &l2);
        if (rx) return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Replace normalizer with the regex "
                                    "\"%.80s\" is not supported (only string patterns)", rx);
        if (!a || !b) return bad("Replace normalizer needs pattern.String and content");
        n->type = KN_HFN_REPLACE;
        n->a = dup_n(a, l1); n->b = dup_n(b, l2); n->na = l1; n->nb = l2;
        if (!n->a || !n->b) return step_fail();
    } else if (!strcmp(ty, "Prepend")) {
        const char *a = opt_str(j, o, "prepend", &l1);
        if (!a) return bad("Prepend normalizer needs a \"prepend\" string");
        n->type = KN_HFN_PREPEND;
        n->a = dup_n(a, l1); n->na = l1;
        if (!n->a) return step_fail();
    } else if (!strcmp(ty, "BertNormalizer")) {
        n->type = KN_HFN_BERT;
        if (!opt_bool(j, o, "clean_text", true, &n->clean) || !opt_bool(j, o, "handle_chinese_chars", true, &n->chinese) ||
            !opt_bool(j, o, "lowercase", true, &n->lower))
            return bad("BertNormalizer: clean_text/handle_chinese_chars/lowercase must be booleans");
        int64_t sa = kn_json_get(j, o, "strip_accents");
        bool strip = n->lower;                    /* null: follows lowercase */
        if (sa >= 0 && kn_json_kind(j, sa) == KN_JSON_BOOL) kn_json_bool(j, sa, &strip);
        n->strip = strip;
    } else {
        out->n--;
        return unsupported("normalizer", ty);
    }
    return KN_OK;
}

static const char *const RE_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char *const RE_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const RE_QWEN2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static kn_status read_pre(const kn_json *j, int64_t o, steps *out, int depth) {
    if (o < 0 || kn_json_kind(j, o) == KN_JSON_NULL) return KN_OK;
    if (kn_json_kind(j, o) != KN_JSON_OBJECT || depth > 8) return bad("a pre_tokenizer is not an object");
    const char *ty = kn_json_get_str(j, o, "type");
    if (!ty) return bad("a pre_tokenizer has no \"type\"");
    if (!strcmp(ty, "Sequence")) {
        int64_t a = kn_json_get(j, o, "pretokenizers");
        if (kn_json_kind(j, a) != KN_JSON_ARRAY) return bad("Sequence pre_tokenizer without a \"pretokenizers\" array");
        for (int64_t v = kn_json_first(j, a); v >= 0; v = kn_json_next(j, v)) {
            kn_status st = read_pre(j, v, out, depth + 1);
            if (st != KN_OK) return st;
        }
        return KN_OK;
    }
    kn_hf_pre *p = step_new(out);
    if (!p) return step_fail();
    size_t l1;
    if (!strcmp(ty, "ByteLevel")) {
        p->type = KN_HFP_BYTELEVEL;
        if (!opt_bool(j, o, "add_prefix_space", true, &p->add_prefix_space) ||
            !opt_bool(j, o, "use_regex", true, &p->use_regex))
            return bad("ByteLevel: add_prefix_space/use_regex must be booleans");
    } else if (!strcmp(ty, "Split")) {
        const char *rx, *s = pattern_str(j, o, &l1, &rx);
        const char *beh = kn_json_get_str(j, o, "behavior");
        bool invert;
        if (!opt_bool(j, o, "invert", false, &invert)) return bad("Split: invert must be a boolean");
        if (!rx) {                          /* a literal string (Gemma's " "), any behavior */
            static const char *const B[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
            p->type = KN_HFP_SPLITSTR;
            p->behavior = -1;
            for (int b = 0; b < 5; b++) if (beh && !strcmp(beh, B[b])) p->behavior = b;
            if (!s || !l1 || p->behavior < 0 || invert)
                return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Split pre_tokenizer on \"%.80s\" with "
                                    "behavior \"%s\"%s is not supported (a non-empty string, not inverted)",
                                    s ? s : "?", beh ? beh : "?", invert ? " and invert" : "");
            p->a = dup_n(s, l1); p->na = l1;
            return p->a ? KN_OK : step_fail();
        }
        p->type = KN_HFP_SPLIT;
        if (!strcmp(rx, RE_GPT2)) p->pattern = KN_PRETOK_GPT2;
        else if (!strcmp(rx, RE_LLAMA3)) p->pattern = KN_PRETOK_LLAMA3;
        else if (!strcmp(rx, RE_QWEN2)) p->pattern = KN_PRETOK_QWEN2;
        else return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Split pre_tokenizer regex \"%.300s\" is "
                                 "not supported; kiln implements the GPT-2, Llama 3 and Qwen2 patterns by hand "
                                 "(src/llm/tok_bpe.c)", rx);
        if (!beh || strcmp(beh, "Isolated") || invert)
            return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Split pre_tokenizer with behavior \"%s\"%s "
                                "is not supported (only Isolated, not inverted)", beh ? beh : "?",
                                invert ? " and invert" : "");
    } else if (!strcmp(ty, "Metaspace")) {
        const char *r = opt_str(j, o, "replacement", &l1);
        if (!r || l1 == 0) return bad("Metaspace needs a non-empty \"replacement\"");
        p->type = KN_HFP_METASPACE;
        p->a = dup_n(r, l1); p->na = l1;
        if (!p->a) return step_fail();
        if (!opt_bool(j, o, "split", true, &p->split)) return bad("Metaspace: split must be a boolean");
        const char *ps = kn_json_get_str(j, o, "prepend_scheme");
        bool aps;
        if (!opt_bool(j, o, "add_prefix_space", true, &aps)) return bad("Metaspace: add_prefix_space must be a boolean");
        if (!ps) p->prepend = aps ? KN_HF_PREPEND_ALWAYS : KN_HF_PREPEND_NEVER;   /* older files */
        else if (!strcmp(ps, "always")) p->prepend = KN_HF_PREPEND_ALWAYS;
        else if (!strcmp(ps, "first")) p->prepend = KN_HF_PREPEND_FIRST;
        else if (!strcmp(ps, "never")) p->prepend = KN_HF_PREPEND_NEVER;
        else return bad("Metaspace: prepend_scheme is not always/first/never");
    } else if (!strcmp(ty, "Whitespace")) p->type = KN_HFP_WHITESPACE;
    else if (!strcmp(ty, "WhitespaceSplit")) p->type = KN_HFP_WSSPLIT;
    else if (!strcmp(ty, "BertPreTokenizer")) p->type = KN_HFP_BERT;
    else if (!strcmp(ty, "Digits")) {
        p->type = KN_HFP_DIGITS;
        if (!opt_bool(j, o, "individual_digits", false, &p->individual)) return bad("Digits: individual_digits must be a boolean");
    } else if (!strcmp(ty, "Punctuation")) {
        const char *beh = kn_json_get_str(j, o, "behavior");
        if (beh && strcmp(beh, "Isolated"))
            return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Punctuation pre_tokenizer with behavior "
                                "\"%.40s\" is not supported (only Isolated)", beh);
        p->type = KN_HFP_PUNCT;
    } else {
        out->n--;
        return unsupported("pre_tokenizer", ty);
    }
    return KN_OK;
}

/* Decoders; *strip_first: the output's first leading space is dropped. */
static kn_status read_dec(const kn_json *j, int64_t o, steps *out, bool *strip_first, int depth) {
    if (o < 0 || kn_json_kind(j, o) == KN_JSON_NULL) return KN_OK;
    if (kn_json_kind(j, o) != KN_JSON_OBJECT || depth > 8) return bad("a decoder is not an object");
    const char *ty = kn_json_get_str(j, o, "type");
    if (!ty) return bad("a decoder has no \"type\"");
    size_t l1 = 0, l2 = 0;
    if (!strcmp(ty, "Sequence")) {
        int64_t a = kn_json_get(j, o, "decoders");
        if (kn_json_kind(j, a) != KN_JSON_ARRAY) return bad("Sequence decoder without a \"decoders\" array");
        for (int64_t v = kn_json_first(j, a); v >= 0; v = kn_json_next(j, v)) {
            kn_status st = read_dec(j, v, out, strip_first, depth + 1);
            if (st != KN_OK) return st;
        }
        return KN_OK;
    }
    if (!strcmp(ty, "Fuse")) return KN_OK;                /* pieces are concatenated anyway */
    if (!strcmp(ty, "Strip")) {
        const char *c = opt_str(j, o, "content", &l1);
        int64_t start = 0, stop = 0;
        kn_json_get_i64(j, o, "start", &start); kn_json_get_i64(j, o, "stop", &stop);
        if (!c || l1 != 1 || c[0] != ' ' || start != 1 || stop != 0)
            return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Strip decoder other than (\" \", start 1, "
                                "stop 0) is not supported");
        *strip_first = true;
        return KN_OK;
    }
    kn_hf_dec *d = step_new(out);
    if (!d) return step_fail();
    if (!strcmp(ty, "ByteLevel")) d->type = KN_HFD_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d->type = KN_HFD_BYTEFALLBACK;
    else if (!strcmp(ty, "Replace") || !strcmp(ty, "Metaspace")) {
        const char *rx, *a, *b;
        if (ty[0] == 'R') { a = pattern_str(j, o, &l1, &rx); b = opt_str(j, o, "content", &l2); }
        else {
            rx = NULL; a = opt_str(j, o, "replacement", &l1); b = " "; l2 = 1;
            const char *ps = kn_json_get_str(j, o, "prepend_scheme");
            bool aps;
            if (!opt_bool(j, o, "add_prefix_space", true, &aps)) return bad("Metaspace: add_prefix_space must be a boolean");
            if (ps ? strcmp(ps, "never") != 0 : aps) { *strip_first = true; d->meta = true; }
        }
        if (rx) return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Replace decoder with a regex is not supported");
        if (!a || !b || l1 == 0) return bad("Replace/Metaspace decoder needs a non-empty pattern and content");
        if (l2 > l1) return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: Replace decoder that lengthens the "
                                         "text (\"%.20s\" -> \"%.20s\") is not supported", a, b);
        d->type = KN_HFD_REPLACE;
        d->a = dup_n(a, l1); d->b = dup_n(b, l2); d->na = l1; d->nb = l2;
        if (!d->a || !d->b) return step_fail();
    } else if (!strcmp(ty, "WordPiece")) {
        for (int k = 0; k < out->n - 1; k++)     /* each adds a byte: pieces must stay within text + 1 */
            if (((kn_hf_dec *)out->v)[k].type == KN_HFD_WORDPIECE) {
                out->n--;
                return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: more than one WordPiece decoder is not supported");
            }
        const char *a = opt_str(j, o, "prefix", &l1);
        d->type = KN_HFD_WORDPIECE;
        d->a = a ? dup_n(a, l1) : dup_n("##", 2); d->na = a ? l1 : 2;
        if (!d->a) return step_fail();
        if (!opt_bool(j, o, "cleanup", true, &d->cleanup)) return bad("WordPiece decoder: cleanup must be a boolean");
        *strip_first = true;
    } else {
        out->n--;
        return unsupported("decoder", ty);
    }
    return KN_OK;
}

/* ========================================================================== */
/* token -> text (kn__tok_finish's piece_of)                                  */
/* ========================================================================== */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Each decoder step rewrites the token in place; only WordPiece (at most one,
 * read_dec checks) or the no-decoder join lengthen it, by one byte, so dst's
 * 4 x length + 4 capacity holds. */
static size_t hf_piece_as(const kn_tokenizer *t, int32_t id, char *dst, bool first) {
    const struct kn_hf *hf = t->hf;
    size_t n; const char *s = kn__tok_text(t, id, &n);
    memcpy(dst, s, n);
    static const char *const clean[][2] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
        {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    for (int k = 0; k < hf->n_dec; k++) {
        const kn_hf_dec *d = &hf->dec[k];
        size_t o = 0;
        switch (d->type) {
        case KN_HFD_BYTELEVEL:
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                if (kn_utf8_valid_prefix(dst + i, n - i) == 0) { dst[o++] = dst[i++]; continue; }
                int kk = kn__utf8_decode((const unsigned char *)dst + i, n - i, &cp);
                int b = kn__cp_to_byte(cp);
                if (b >= 0) dst[o++] = (char)b;
                else { memmove(dst + o, dst + i, (size_t)kk); o += (size_t)kk; }
                i += (size_t)kk;
            }
            n = o;
            break;
        case KN_HFD_BYTEFALLBACK:
            if (n == 6 && !memcmp(dst, "<0x", 3) && dst[5] == '>' && hexval(dst[3]) >= 0 && hexval(dst[4]) >= 0) {
                dst[0] = (char)(hexval(dst[3]) * 16 + hexval(dst[4]));
                n = 1;
            }
            break;
        case KN_HFD_REPLACE:
            for (size_t i = 0; i < n;) {
                if (i + d->na <= n && !memcmp(dst + i, d->a, d->na)) {
                    size_t nb = first && d->meta ? 0 : d->nb;   /* first token: the library drops them */
                    memcpy(dst + o, d->b, nb); o += nb; i += d->na;
                }
                else dst[o++] = dst[i++];
            }
            n = o;
            break;
        case KN_HFD_JOIN:
            memmove(dst + 1, dst, n); dst[0] = ' '; n++;
            break;
        case KN_HFD_WORDPIECE:
            if (n >= d->na && !memcmp(dst, d->a, d->na)) { memmove(dst, dst + d->na, n - d->na); n -= d->na; }
            else { memmove(dst + 1, dst, n); dst[0] = ' '; n++; }
            for (size_t c = 0; d->cleanup && c < sizeof clean / sizeof clean[0]; c++) {
                size_t la = strlen(clean[c][0]), lb = strlen(clean[c][1]);
                o = 0;
                for (size_t i = 0; i < n;) {
                    if (i + la <= n && !memcmp(dst + i, clean[c][0], la)) { memcpy(dst + o, clean[c][1], lb); o += lb; i += la; }
                    else dst[o++] = dst[i++];
                }
                n = o;
            }
            break;
        }
    }
    return n;
}

static size_t hf_piece(const kn_tokenizer *t, int32_t id, char *dst) { return hf_piece_as(t, id, dst, false); }

/* The pieces as the first token of an output: only Metaspace decoders differ
 * (every replacement character of the first token is dropped, not just one
 * leading space). */
static kn_status first_pieces(kn_tokenizer *t) {
    bool meta = false;
    for (int k = 0; k < t->hf->n_dec; k++) meta = meta || t->hf->dec[k].meta;
    if (!meta) return KN_OK;
    size_t maxlen = 0, total = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t l = t->text_off[id + 1] - t->text_off[id];
        total += l; if (l > maxlen) maxlen = l;
    }
    char *tmp = malloc(4 * maxlen + 4);
    t->piece0 = malloc(total + (size_t)t->n_vocab + 4);   /* a piece is at most its text + 1 byte */
    t->piece0_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece0_off);
    if (!tmp || !t->piece0 || !t->piece0_off) { free(tmp); return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory"); }
    size_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t l = hf_piece_as(t, id, tmp, true);
        t->piece0_off[id] = o;
        memcpy(t->piece0 + o, tmp, l);
        o += l;
    }
    t->piece0_off[t->n_vocab] = o;
    free(tmp);
    return KN_OK;
}

/* ========================================================================== */
/* model                                                                      */
/* ========================================================================== */

typedef struct vocab_ctx {
    const char **txt; size_t *len;     /* [n_vocab] texts (pointing into the JSON) */
    uint8_t *type;                     /* [n_vocab] kn_token_type, 0 = no token yet */
    double *score;                     /* [n_vocab] Unigram                         */
    int32_t n;
    int64_t id_limit;                  /* ids are dense: below 2 x entries + 1024   */
} vocab_ctx;

static kn_status grow_vocab(vocab_ctx *v, int64_t id) {
    if (id < 0 || id >= MAX_ID || id >= v->id_limit)
        return kn_set_error(KN_ERR_FORMAT, "tokenizer.json: token id %lld is out of range (0..%lld: ids are "
                            "dense and below 2^24)", (long long)id, (long long)(v->id_limit < MAX_ID ? v->id_limit : MAX_ID) - 1);
    if (id < v->n) return KN_OK;
    int32_t nn = v->n ? v->n : 256;
    while (nn <= id) nn *= 2;
    const char **t = realloc(v->txt, (size_t)nn * sizeof *t);
    if (t) v->txt = t;
    size_t *l = realloc(v->len, (size_t)nn * sizeof *l);
    if (l) v->len = l;
    uint8_t *ty = realloc(v->type, (size_t)nn);
    if (ty) v->type = ty;
    double *sc = realloc(v->score, (size_t)nn * sizeof *sc);
    if (sc) v->score = sc;
    if (!t || !l || !ty || !sc) return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory for %lld tokens", (long long)id);
    for (int32_t i = v->n; i < nn; i++) { v->txt[i] = ""; v->len[i] = 0; v->type[i] = 0; v->score[i] = 0; }
    v->n = nn;
    return KN_OK;
}

static kn_status put_token(vocab_ctx *v, int64_t id, const char *s, size_t n, int type, int32_t *max_id) {
    kn_status st = grow_vocab(v, id);
    if (st != KN_OK) return st;
    if (v->type[id] && (v->len[id] != n || memcmp(v->txt[id], s, n)))
        return kn_set_error(KN_ERR_FORMAT, "tokenizer.json: id %lld is given to two different tokens (\"%.40s\" "
                            "and \"%.40s\")", (long long)id, v->txt[id], s);
    v->txt[id] = s; v->len[id] = n;
    if (!v->type[id] || type != KN_TOKEN_NORMAL) v->type[id] = (uint8_t)type;
    if (id > *max_id) *max_id = (int32_t)id;
    return KN_OK;
}

typedef struct model_info {
    kn_hf_model kind;
    int64_t merges;      /* node of the merges array (BPE)  */
    const char *unk; size_t unk_len;
    int64_t unk_id;
} model_info;

static kn_status read_model(const kn_json *j, int64_t m, struct kn_hf *hf, vocab_ctx *v, uint8_t **in_model,
                            int32_t *max_id, model_info *mi) {
    if (kn_json_kind(j, m) != KN_JSON_OBJECT) return bad("no \"model\" object");
    int64_t voc = kn_json_get(j, m, "vocab");
    const char *ty = kn_json_get_str(j, m, "type");
    if (!ty)   /* files from before "type" was written: tell by the fields */
        ty = kn_json_get(j, m, "merges") >= 0 ? "BPE" : kn_json_kind(j, voc) == KN_JSON_ARRAY ? "Unigram"
           : kn_json_get(j, m, "max_input_chars_per_word") >= 0 ? "WordPiece" : "?";
    mi->merges = -1; mi->unk = NULL; mi->unk_len = 0; mi->unk_id = -1;
    kn_status st;
    if (!strcmp(ty, "BPE") || !strcmp(ty, "WordPiece")) {
        mi->kind = ty[0] == 'B' ? KN_HFM_BPE : KN_HFM_WORDPIECE;
        if (kn_json_kind(j, voc) != KN_JSON_OBJECT) return bad("model.vocab is not an object of token: id");
        for (int64_t e = kn_json_first(j, voc); e >= 0; e = kn_json_next(j, e)) {
            size_t n; const char *s = kn_json_key(j, e, &n);
            int64_t id;
            if (!kn_json_int(j, e, &id)) return bad("a model.vocab id is not an integer");
            if ((st = put_token(v, id, s, n, KN_TOKEN_NORMAL, max_id)) != KN_OK) return st;
        }
        mi->unk = opt_str(j, m, "unk_token", &mi->unk_len);
        if (mi->kind == KN_HFM_BPE) {
            double dropout = 0;
            int64_t dv = kn_json_get(j, m, "dropout");
            if (dv >= 0 && kn_json_kind(j, dv) != KN_JSON_NULL && (!kn_json_num(j, dv, &dropout) || dropout != 0))
                return kn_set_error(KN_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported (it makes "
                                    "encoding random); set \"dropout\": null for inference");
            size_t l;
            const char *csp = opt_str(j, m, "continuing_subword_prefix", &l);
            if (csp && l) return unsupported("BPE continuing_subword_prefix", csp);
            const char *eow = opt_str(j, m, "end_of_word_suffix", &l);
            if (eow && l) return unsupported("BPE end_of_word_suffix", eow);
            if (!opt_bool(j, m, "fuse_unk", false, &hf->fuse_unk) ||
                !opt_bool(j, m, "byte_fallback", false, &hf->byte_fallback) ||
                !opt_bool(j, m, "ignore_merges", false, &hf->ignore_merges))
                return bad("BPE: fuse_unk/byte_fallback/ignore_merges must be booleans");
            mi->merges = kn_json_get(j, m, "merges");
            if (kn_json_kind(j, mi->merges) != KN_JSON_ARRAY) return bad("BPE model without a \"merges\" array");
        } else {
            size_t l;
            const char *p = opt_str(j, m, "continuing_subword_prefix", &l);
            hf->prefix = p ? dup_n(p, l) : dup_n("##", 2); hf->nprefix = p ? l : 2;
            if (!hf->prefix) return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory");
            hf->max_chars = 100;
            int64_t mc = kn_json_get(j, m, "max_input_chars_per_word");
            if (mc >= 0 && (!kn_json_int(j, mc, &hf->max_chars) || hf->max_chars < 0))
                return bad("WordPiece max_input_chars_per_word is not a non-negative integer");
            if (!mi->unk) return bad("WordPiece model without an \"unk_token\"");
        }
    } else if (!strcmp(ty, "Unigram")) {
        mi->kind = KN_HFM_UNIGRAM;
        if (kn_json_kind(j, voc) != KN_JSON_ARRAY) return bad("Unigram model.vocab is not an array of [piece, score]");
        int64_t id = 0;
        for (int64_t e = kn_json_first(j, voc); e >= 0; e = kn_json_next(j, e), id++) {
            int64_t p = kn_json_at(j, e, 0), sc = kn_json_at(j, e, 1);
            size_t n; const char *s = kn_json_kind(j, e) == KN_JSON_ARRAY && kn_json_count(j, e) == 2
                                      ? kn_json_str(j, p, &n) : NULL;
            double score;
            if (!s || !kn_json_num(j, sc, &score)) return bad("a Unigram vocab entry is not [piece, score]");
            if ((st = put_token(v, id, s, n, KN_TOKEN_NORMAL, max_id)) != KN_OK) return st;
            v->score[id] = score;
        }
        if (id == 0) return bad("Unigram model with an empty vocab");
        int64_t u = kn_json_get(j, m, "unk_id");
        if (u >= 0 && kn_json_kind(j, u) != KN_JSON_NULL) {
            if (!kn_json_int(j, u, &mi->unk_id) || mi->unk_id < 0 || mi->unk_id >= id)
                return bad("Unigram unk_id is not an id of the vocab");
        }
        if (!opt_bool(j, m, "byte_fallback", false, &hf->byte_fallback)) return bad("Unigram byte_fallback must be a boolean");
        hf->fuse_unk = true;
    } else return unsupported("model type", ty);
    hf->model = mi->kind;
    /* which ids the model owns (added tokens may add more later) */
    *in_model = calloc((size_t)v->n, 1);
    if (!*in_model) return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory");
    for (int32_t i = 0; i < v->n; i++) (*in_model)[i] = v->type[i] != 0;
    return KN_OK;
}

static kn_status read_merges(const kn_json *j, int64_t arr, kn_tokenizer *t) {
    int64_t n = kn_json_count(j, arr);
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory for %lld merges", (long long)n);
    t->merge_cap = cap;
    for (size_t i = 0; i < cap; i++) t->merges[i] = (kn_bpe_merge){0, -1, -1};
    char *cat = NULL; size_t cat_cap = 0;
    int32_t rank = 0;
    kn_status st = KN_OK;
    for (int64_t e = kn_json_first(j, arr); e >= 0 && st == KN_OK; e = kn_json_next(j, e), rank++) {
        const char *a, *b; size_t la, lb;
        if (kn_json_kind(j, e) == KN_JSON_STRING) {           /* "a b" */
            size_t n2; const char *s = kn_json_str(j, e, &n2);
            const char *sp = n2 > 1 ? memchr(s + 1, ' ', n2 - 1) : NULL;
            if (!sp) { st = kn_set_error(KN_ERR_FORMAT, "tokenizer.json: merge %d (\"%.40s\") is not \"left right\"", (int)rank, s); break; }
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = n2 - la - 1;
        } else if (kn_json_kind(j, e) == KN_JSON_ARRAY && kn_json_count(j, e) == 2 &&
                   (a = kn_json_str(j, kn_json_at(j, e, 0), &la)) && (b = kn_json_str(j, kn_json_at(j, e, 1), &lb))) {
        } else { st = kn_set_error(KN_ERR_FORMAT, "tokenizer.json: merge %d is neither \"a b\" nor [\"a\", \"b\"]", (int)rank); break; }
        if (la + lb > cat_cap) {
            char *nc = realloc(cat, la + lb);
            if (!nc) { st = kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory"); break; }
            cat = nc; cat_cap = la + lb;
        }
        memcpy(cat, a, la); memcpy(cat + la, b, lb);
        int32_t l = kn__tok_lookup(t, a, la), r = kn__tok_lookup(t, b, lb), m = kn__tok_lookup(t, cat, la + lb);
        if (l < 0 || r < 0 || m < 0) {
            st = kn_set_error(KN_ERR_FORMAT, "tokenizer.json: merge %d (\"%.*s\" + \"%.*s\") uses a token that is not "
                              "in the vocabulary", (int)rank, (int)(la > 40 ? 40 : la), a, (int)(lb > 40 ? 40 : lb), b);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
        size_t jx = kn__merge_probe(t->merges, cap, key);
        t->merges[jx] = (kn_bpe_merge){key, rank, m};        /* a repeated pair: the later rank wins, as in HF */
    }
    free(cat);
    return st;
}

/* ========================================================================== */
/* tokenizer_config.json and the post-processor                               */
/* ========================================================================== */

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static int32_t config_token(const kn_json *j, const kn_tokenizer *t, const char *key) {
    int64_t v = kn_json_get(j, 0, key);
    if (kn_json_kind(j, v) == KN_JSON_OBJECT) v = kn_json_get(j, v, "content");
    size_t n; const char *s = kn_json_kind(j, v) == KN_JSON_STRING ? kn_json_str(j, v, &n) : NULL;
    return s ? kn__tok_lookup(t, s, n) : -1;
}

static kn_status read_config(const char *cfg, size_t cfg_len, kn_tokenizer *t) {
    kn_json *j = NULL;
    kn_status st = kn_json_parse(cfg, cfg_len, &j);
    if (st != KN_OK) return kn__prefix_error(st, "tokenizer_config.json");
    if (kn_json_kind(j, 0) != KN_JSON_OBJECT) { kn_json_free(j); return kn_set_error(KN_ERR_FORMAT, "tokenizer_config.json is not a JSON object"); }
    int32_t id;
    if ((id = config_token(j, t, "bos_token")) >= 0) t->bos = id;
    if ((id = config_token(j, t, "eos_token")) >= 0) t->eos = id;
    if ((id = config_token(j, t, "pad_token")) >= 0) t->pad = id;
    bool ab;
    if (kn_json_get_bool(j, 0, "add_bos_token", &ab)) t->add_bos = ab;
    int64_t ct = kn_json_get(j, 0, "chat_template");
    size_t n = 0; const char *s = NULL;
    if (kn_json_kind(j, ct) == KN_JSON_STRING) s = kn_json_str(j, ct, &n);
    else if (kn_json_kind(j, ct) == KN_JSON_ARRAY)        /* [{"name": "default", "template": ...}, ...] */
        for (int64_t e = kn_json_first(j, ct); e >= 0; e = kn_json_next(j, e)) {
            const char *nm = kn_json_get_str(j, e, "name");
            if (!s || (nm && !strcmp(nm, "default"))) s = opt_str(j, e, "template", &n);
        }
    if (s && !(t->hf->chat_template = dup_n(s, n))) st = kn_set_error(KN_ERR_NOMEM, "tokenizer_config.json: out of memory");
    kn_json_free(j);
    return st;
}

/* TemplateProcessing whose "single" starts with a special token: that is BOS. */
static void read_post(const kn_json *j, int64_t pp, kn_tokenizer *t) {
    const char *ty = kn_json_kind(j, pp) == KN_JSON_OBJECT ? kn_json_get_str(j, pp, "type") : NULL;
    if (!ty || strcmp(ty, "TemplateProcessing")) return;
    int64_t first = kn_json_at(j, kn_json_get(j, pp, "single"), 0);
    int64_t sp = kn_json_get(j, first, "SpecialToken");
    const char *name = sp >= 0 ? kn_json_get_str(j, sp, "id") : NULL;
    if (!name) return;
    int32_t id = kn__tok_lookup(t, name, strlen(name));
    if (id >= 0) { t->bos = id; t->add_bos = true; }
}

/* ========================================================================== */
/* entry points                                                               */
/* ========================================================================== */

static kn_status build(const kn_json *j, const char *cfg, size_t cfg_len, kn_tokenizer **out) {
    if (kn_json_kind(j, 0) != KN_JSON_OBJECT) return bad("the top level is not an object");
    struct kn_hf *hf = calloc(1, sizeof *hf);
    if (!hf) return kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory");
    hf->unk = -1;
    vocab_ctx v = {0};
    uint8_t *in_model = NULL;
    int32_t max_id = -1;
    kn_tokenizer *t = NULL;
    model_info mi;
    steps ns = {NULL, 0, 0, sizeof(kn_hf_norm)}, ps = {NULL, 0, 0, sizeof(kn_hf_pre)},
          ds = {NULL, 0, 0, sizeof(kn_hf_dec)};
    bool strip_first = false;
    int64_t model = kn_json_get(j, 0, "model"), at = kn_json_get(j, 0, "added_tokens");
    int64_t voc = kn_json_kind(j, model) == KN_JSON_OBJECT ? kn_json_get(j, model, "vocab") : -1;
    v.id_limit = 2 * ((voc >= 0 ? kn_json_count(j, voc) : 0) + (at >= 0 ? kn_json_count(j, at) : 0)) + 1024;
    kn_status st = read_model(j, model, hf, &v, &in_model, &max_id, &mi);
    if (st == KN_OK) st = read_norm(j, kn_json_get(j, 0, "normalizer"), &ns, 0);
    if (st == KN_OK) st = read_pre(j, kn_json_get(j, 0, "pre_tokenizer"), &ps, 0);
    if (st == KN_OK) st = read_dec(j, kn_json_get(j, 0, "decoder"), &ds, &strip_first, 0);
    int64_t dnode = kn_json_get(j, 0, "decoder");
    if (st == KN_OK && (dnode < 0 || kn_json_kind(j, dnode) == KN_JSON_NULL)) {   /* none: joined with " " */
        kn_hf_dec *d = step_new(&ds);
        if (!d) st = step_fail();
        else { d->type = KN_HFD_JOIN; strip_first = true; }
    }
    /* the steps go into hf even after an error, so kn__hf_free releases them */
    hf->norm = ns.v; hf->n_norm = ns.n; hf->pre = ps.v; hf->n_pre = ps.n; hf->dec = ds.v; hf->n_dec = ds.n;
    /* added tokens */
    if (st == KN_OK && at >= 0 && kn_json_kind(j, at) != KN_JSON_ARRAY && kn_json_kind(j, at) != KN_JSON_NULL)
        st = bad("added_tokens is not an array");
    for (int64_t e = at >= 0 ? kn_json_first(j, at) : -1; st == KN_OK && e >= 0; e = kn_json_next(j, e)) {
        int64_t id; size_t n; bool special = false;
        const char *s = opt_str(j, e, "content", &n);
        if (!s || !kn_json_get_i64(j, e, "id", &id) || !opt_bool(j, e, "special", false, &special)) {
            st = bad("an added_tokens entry lacks an integer \"id\" or a \"content\" string");
            break;
        }
        if (n == 0) { st = bad("an added token has empty content"); break; }
        st = put_token(&v, id, s, n, special ? KN_TOKEN_CONTROL : KN_TOKEN_USER_DEFINED, &max_id);
    }
    if (st == KN_OK && max_id < 0) st = bad("the vocabulary is empty");
    if (st == KN_OK) st = kn__tok_alloc(&t, KN_TOKENIZER_HF, max_id + 1);
    if (st != KN_OK) goto fail;
    t->hf = hf;
    hf->in_model = calloc((size_t)t->n_vocab, 1);
    if (!hf->in_model) { st = kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory"); goto fail; }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        hf->in_model[i] = in_model && i < v.n && in_model[i];
        t->types[i] = v.type[i] ? v.type[i] : KN_TOKEN_UNUSED;
        t->scores[i] = (float)v.score[i];
    }
    if ((st = kn__tok_set_texts(t, v.txt, v.len)) != KN_OK) goto fail;
    /* the unknown token and the byte tokens, then lookups need the hash: */
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (hf->in_model[i] && v.len[i] > hf->max_piece) hf->max_piece = v.len[i];
    if (mi.kind == KN_HFM_UNIGRAM) {
        hf->unk = (int32_t)mi.unk_id;
        hf->score = malloc((size_t)t->n_vocab * sizeof *hf->score);
        if (!hf->score) { st = kn_set_error(KN_ERR_NOMEM, "tokenizer.json: out of memory"); goto fail; }
        double mn = 0; bool any = false;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            hf->score[i] = v.score[i];
            if (!hf->in_model[i]) continue;
            if (!any || v.score[i] < mn) mn = v.score[i];
            any = true;
        }
        hf->unk_score = mn - 10.0;
    }
    for (int b = 0; b < 256; b++) hf->byte_tok[b] = -1;
    if ((st = kn__tok_finish(t, hf_piece)) != KN_OK) goto fail;
    if (mi.unk && (hf->unk = kn__tok_lookup(t, mi.unk, mi.unk_len)) < 0) {
        st = kn_set_error(KN_ERR_FORMAT, "tokenizer.json: the model's unk_token \"%.40s\" is not in the vocabulary", mi.unk);
        goto fail;
    }
    if (hf->unk >= 0) { t->unk = hf->unk; if (t->types[hf->unk] == KN_TOKEN_NORMAL || t->types[hf->unk] == KN_TOKEN_CONTROL) t->types[hf->unk] = KN_TOKEN_UNKNOWN; }
    if (hf->byte_fallback)
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int32_t id = kn__tok_lookup(t, name, 6);
            if (id >= 0 && hf->in_model[id]) { hf->byte_tok[b] = id; t->byte_id[b] = id; t->types[id] = KN_TOKEN_BYTE; }
        }
    if (mi.kind == KN_HFM_BPE && (st = read_merges(j, mi.merges, t)) != KN_OK) goto fail;
    t->add_space_prefix = strip_first;
    if ((st = first_pieces(t)) != KN_OK) goto fail;
    read_post(j, kn_json_get(j, 0, "post_processor"), t);
    if (cfg && (st = read_config(cfg, cfg_len, t)) != KN_OK) goto fail;
    free(v.txt); free(v.len); free(v.type); free(v.score); free(in_model);
    *out = t;
    return KN_OK;
fail:
    free(v.txt); free(v.len); free(v.type); free(v.score); free(in_model);
    if (t) kn_tokenizer_free(t);        /* frees hf too */
    else kn__hf_free(hf);
    return st;
}

kn_status kn_tokenizer_load_hf_memory(const char *json, size_t len, const char *config, size_t config_len,
                                      kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_hf_memory: out is NULL");
    *out = NULL;
    if (!json) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_hf_memory: json is NULL");
    kn_json *j = NULL;
    kn_status st = kn_json_parse(json, len, &j);
    if (st != KN_OK) return kn__prefix_error(st, "tokenizer.json");
    st = build(j, config, config_len, out);
    kn_json_free(j);
    return st;
}

kn_status kn_tokenizer_load_hf(const char *path_or_dir, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_hf: out is NULL");
    *out = NULL;
    if (!path_or_dir) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_hf: path is NULL");
    size_t pl = strlen(path_or_dir);
    char *tj = malloc(pl + 32), *cj = malloc(pl + 32);
    if (!tj || !cj) { free(tj); free(cj); return kn_set_error(KN_ERR_NOMEM, "kn_tokenizer_load_hf: out of memory"); }
    struct stat sb;
    if (stat(path_or_dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(tj, pl + 32, "%s/tokenizer.json", path_or_dir);
        snprintf(cj, pl + 32, "%s/tokenizer_config.json", path_or_dir);
    } else {                                 /* a file: tokenizer_config.json beside it */
        memcpy(tj, path_or_dir, pl + 1);
        const char *sl = strrchr(path_or_dir, '/');
        size_t dl = sl ? (size_t)(sl - path_or_dir) + 1 : 0;
        memcpy(cj, path_or_dir, dl);
        memcpy(cj + dl, "tokenizer_config.json", 22);
    }
    char *data = NULL, *cfg = NULL; size_t n = 0, cn = 0;
    kn_status st = kn__read_file(tj, &data, &n);
    if (st == KN_OK && stat(cj, &sb) == 0 && (st = kn__read_file(cj, &cfg, &cn)) != KN_OK) st = kn__prefix_error(st, cj);
    if (st == KN_OK) {
        st = kn_tokenizer_load_hf_memory(data, n, cfg, cn, out);
        if (st != KN_OK) st = kn__prefix_error(st, tj);
    }
    free(data); free(cfg); free(tj); free(cj);
    return st;
}

const char *kn_tokenizer_chat_template(const kn_tokenizer *t) {
    return t && t->hf ? t->hf->chat_template : NULL;
}
