/* tokenizer.c: the public tokenizer calls: queries, special-token matching,
 * the kn_tokenize driver, decoding (whole and streaming), and the GGUF entry
 * point, which picks the vocabulary kind.
 *
 * The kind-specific encoders live in tok_spm.c (SentencePiece-style BPE) and
 * tok_bpe.c (GPT-2 byte-level BPE); tok_llmc.c reads llm.c's decode-only file;
 * what they all share (token storage and lookup, UTF-8 helpers, containers,
 * the GGUF vocabulary reader) is in tok_common.c, so this file and the
 * encoders it dispatches to do not call each other in a circle.
 * Non-goals: Unicode normalization; other vocabulary kinds (see the header).
 */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include "formats/gguf.h"             /* defines: kn_gguf_get_str/arr, ...           */
#include "core/utf8.h"               /* defines: kn__utf8_check, kn_utf8_valid_prefix */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ========================================================================== */
/* queries                                                                    */
/* ========================================================================== */

kn_tokenizer_kind kn_tokenizer_get_kind(const kn_tokenizer *t) { return t->kind; }
int32_t kn_tokenizer_n_vocab(const kn_tokenizer *t) { return t->n_vocab; }
int32_t kn_tokenizer_bos(const kn_tokenizer *t) { return t->bos; }
int32_t kn_tokenizer_eos(const kn_tokenizer *t) { return t->eos; }
int32_t kn_tokenizer_eot(const kn_tokenizer *t) { return t->eot; }
bool kn_tokenizer_add_bos(const kn_tokenizer *t) { return t->add_bos && t->bos >= 0; }

kn_token_type kn_tokenizer_token_type(const kn_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return KN_TOKEN_UNDEFINED;
    return (kn_token_type)t->types[id];
}

bool kn_tokenizer_is_eog(const kn_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++) if (t->eog[i] == id) return true;
    return false;
}

const char *kn_tokenizer_token_text(const kn_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return NULL; }
    return kn__tok_text(t, id, len);
}

int32_t kn_tokenizer_find(const kn_tokenizer *t, const char *text, size_t len) {
    return kn__tok_lookup(t, text, len);
}

/* ========================================================================== */
/* encoding driver: special tokens, then the kind's encoder per text run     */
/* ========================================================================== */

typedef struct frag { size_t off, len; int32_t id; } frag;   /* id -1: raw text */

typedef struct fragvec { frag *v; size_t n, cap; } fragvec;

static bool frag_push(fragvec *fv, frag f) {
    if (fv->n == fv->cap) {
        size_t nc = fv->cap ? fv->cap * 2 : 16;
        frag *nv = realloc(fv->v, nc * sizeof *nv);
        if (!nv) return false;
        fv->v = nv; fv->cap = nc;
    }
    fv->v[fv->n++] = f;
    return true;
}

/* Each special, longest first, splits every remaining raw run at each of its
 * (non-overlapping, leftmost-first) occurrences, as llama.cpp does. Control
 * and unknown tokens take part only with parse_special; user-defined always. */
static kn_status split_specials(const kn_tokenizer *t, const char *text, size_t len,
                                bool parse_special, fragvec *out) {
    fragvec cur = {0}, nxt = {0};
    if (!frag_push(&cur, (frag){0, len, -1})) goto nomem;
    for (int k = 0; k < t->n_special; k++) {
        int32_t sid = t->special[k];
        if (!parse_special && t->types[sid] != KN_TOKEN_USER_DEFINED) continue;
        size_t sl; const char *s = kn__tok_text(t, sid, &sl);
        nxt.n = 0;
        for (size_t i = 0; i < cur.n; i++) {
            frag f = cur.v[i];
            while (f.id < 0 && f.len >= sl) {
                const char *base = text + f.off;
                const char *hit = memmem(base, f.len, s, sl);
                if (!hit) break;
                size_t pre = (size_t)(hit - base);
                if (pre > 0 && !frag_push(&nxt, (frag){f.off, pre, -1})) goto nomem;
                if (!frag_push(&nxt, (frag){f.off + pre, sl, sid})) goto nomem;
                f.off += pre + sl; f.len -= pre + sl;
            }
            if ((f.id >= 0 || f.len > 0) && !frag_push(&nxt, f)) goto nomem;
        }
        fragvec tmp = cur; cur = nxt; nxt = tmp;
    }
    free(nxt.v);
    *out = cur;
    return KN_OK;
nomem:
    free(cur.v); free(nxt.v);
    return kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory while matching special tokens");
}

kn_status kn_tokenize(const kn_tokenizer *t, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t *ids, int max_ids, int *n_ids) {
    if (n_ids) *n_ids = 0;
    if (!t || !n_ids || (!text && len) || max_ids < 0 || (max_ids > 0 && !ids))
        return kn_set_error(KN_ERR_INVALID, "kn_tokenize: NULL tokenizer, text, ids or n_ids");
    if (t->kind == KN_TOKENIZER_DECODE_ONLY)
        return kn_set_error(KN_ERR_UNSUPPORTED,
                            "kn_tokenize: this tokenizer (llm.c gpt2_tokenizer.bin) has no merges and "
                            "can only decode; load a GGUF vocabulary (e.g. ggml-vocab-gpt-2.gguf) to encode");
    size_t bad = kn_utf8_valid_prefix(text, len);
    if (bad != len)
        return kn_set_error(KN_ERR_INVALID,
                            "kn_tokenize: input is not valid UTF-8 (byte 0x%02x at offset %zu); "
                            "convert the text to UTF-8 first", (unsigned char)text[bad], bad);
    kn_idvec iv = {0};
    kn_status st = KN_OK;
    if (add_bos && t->bos >= 0) st = kn__idvec_push(&iv, t->bos);
    fragvec fv = {0};
    if (st == KN_OK && len > 0) st = split_specials(t, text, len, parse_special, &fv);
    frag *f = fv.v; size_t nf = fv.n;
    bool prev_special = true;   /* SPM: dummy space before the first run and after specials */
    for (size_t i = 0; st == KN_OK && i < nf; i++) {
        if (f[i].id >= 0) { st = kn__idvec_push(&iv, f[i].id); prev_special = true; continue; }
        if (t->kind == KN_TOKENIZER_SPM)
            st = kn__spm_encode(t, text + f[i].off, f[i].len, t->add_space_prefix && prev_special, &iv);
        else if (t->kind == KN_TOKENIZER_HF)
            st = kn__hf_encode(t, text + f[i].off, f[i].len, f[i].off == 0, &iv);
        else
            st = kn__bpe_encode(t, text + f[i].off, f[i].len, &iv);
        prev_special = false;
    }
    free(f);
    if (st != KN_OK) { free(iv.v); return st; }
    if (iv.n > (size_t)INT32_MAX) { free(iv.v); return kn_set_error(KN_ERR_LIMIT, "kn_tokenize: more than 2^31 tokens"); }
    *n_ids = (int)iv.n;
    if (iv.n > (size_t)max_ids) {
        free(iv.v);
        return kn_set_error(KN_ERR_LIMIT, "kn_tokenize: %zu ids do not fit in max_ids = %d; "
                            "call again with room for *n_ids ids", iv.n, max_ids);
    }
    if (iv.n) memcpy(ids, iv.v, iv.n * sizeof *ids);
    free(iv.v);
    return KN_OK;
}

/* ========================================================================== */
/* decoding                                                                   */
/* ========================================================================== */

/* Vocabularies whose decoding drops the first leading space: SPM with a
 * dummy prefix; tokenizer.json with a Metaspace/WordPiece/Strip decoder. */
static bool strips_space(const kn_tokenizer *t) {
    return (t->kind == KN_TOKENIZER_SPM || t->kind == KN_TOKENIZER_HF) && t->add_space_prefix;
}

static bool is_hidden_type(int ty) {
    return ty == KN_TOKEN_CONTROL || ty == KN_TOKEN_UNKNOWN || ty == KN_TOKEN_UNUSED;
}

const char *kn_token_to_piece(const kn_tokenizer *t, int32_t id, bool render_special, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) { if (len) *len = 0; return NULL; }
    const char *p = t->piece + t->piece_off[id];
    *len = (!render_special && is_hidden_type(t->types[id])) ? 0 : t->piece_off[id + 1] - t->piece_off[id];
    return p;
}

/* Piece of id with the leading-space rule applied; updates *strip_next. */
static const char *piece_for(const kn_tokenizer *t, int32_t id, unsigned flags, bool *strip_next,
                             size_t *len) {
    const char *p = kn_token_to_piece(t, id, (flags & KN_DETOK_SPECIAL) != 0, len);
    if (*len > 0) {
        if (*strip_next && t->piece0) {           /* tokenizer.json Metaspace: its own first form */
            p = t->piece0 + t->piece0_off[id];
            *len = t->piece0_off[id + 1] - t->piece0_off[id];
        } else if (*strip_next && p[0] == ' ') { p++; (*len)--; }
        *strip_next = false;
    }
    if (strips_space(t) && id == t->bos) *strip_next = true;
    return p;
}

kn_status kn_detokenize(const kn_tokenizer *t, const int32_t *ids, int n_ids, unsigned flags,
                        char *buf, size_t cap, size_t *needed) {
    if (needed) *needed = 0;
    if (!t || !needed || n_ids < 0 || (n_ids > 0 && !ids) || (cap > 0 && !buf))
        return kn_set_error(KN_ERR_INVALID, "kn_detokenize: NULL tokenizer, ids, buf or needed");
    bool strip = (flags & KN_DETOK_STRIP_SPACE) && strips_space(t);
    size_t o = 0;
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return kn_set_error(KN_ERR_INVALID, "kn_detokenize: id %d at position %d is outside the "
                                "vocabulary (0..%d)", (int)ids[i], i, (int)t->n_vocab - 1);
        size_t l; const char *p = piece_for(t, ids[i], flags, &strip, &l);
        if (o + l < cap) memcpy(buf + o, p, l);
        o += l;
    }
    *needed = o;
    if (o + 1 > cap) {
        if (cap > 0) buf[0] = 0;
        return kn_set_error(KN_ERR_LIMIT, "kn_detokenize: %zu bytes (+1 for NUL) do not fit in %zu; "
                            "call again with a buffer of *needed + 1 bytes", o, cap);
    }
    buf[o] = 0;
    return KN_OK;
}

struct kn_detok_stream {
    const kn_tokenizer *tok;
    unsigned flags;
    bool strip_next;
    unsigned char pend[4];   /* held-back start of an unfinished character (<= 3 bytes) */
    int n_pend;
    char *out;               /* [cap] output of the last call                          */
    size_t cap;
};

kn_status kn_detok_stream_new(const kn_tokenizer *t, unsigned flags, kn_detok_stream **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_detok_stream_new: out is NULL");
    *out = NULL;
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_detok_stream_new: tokenizer is NULL");
    kn_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return kn_set_error(KN_ERR_NOMEM, "kn_detok_stream_new: out of memory");
    s->tok = t; s->flags = flags;
    s->strip_next = (flags & KN_DETOK_STRIP_SPACE) && strips_space(t);
    *out = s;
    return KN_OK;
}

static kn_status stream_reserve(kn_detok_stream *s, size_t n) {
    if (n <= s->cap) return KN_OK;
    size_t nc = s->cap ? s->cap : 64;
    while (nc < n) nc *= 2;
    char *p = realloc(s->out, nc);
    if (!p) return kn_set_error(KN_ERR_NOMEM, "detok stream: out of memory");
    s->out = p; s->cap = nc;
    return KN_OK;
}

/* Emit the complete characters of pend + p[0..l); keep an unfinished tail. */
static kn_status stream_emit(kn_detok_stream *s, const char *p, size_t l, bool final,
                             const char **text, size_t *len) {
    size_t n = (size_t)s->n_pend + l;
    /* worst case every byte becomes U+FFFD (3 bytes) */
    kn_status st = stream_reserve(s, 2 * n + 3 * n + 8);
    if (st != KN_OK) return st;
    unsigned char *in = (unsigned char *)s->out + 3 * n + 4;   /* staging area after the output */
    memcpy(in, s->pend, (size_t)s->n_pend);
    if (l) memcpy(in + s->n_pend, p, l);
    s->n_pend = 0;
    size_t i = 0, o = 0;
    while (i < n) {
        int k = kn__utf8_check(in + i, n - i);
        if (k > 0) { memmove(s->out + o, in + i, (size_t)k); o += (size_t)k; i += (size_t)k; continue; }
        if (k == 0 && !final) {             /* unfinished: hold back (at most 3 bytes) */
            s->n_pend = (int)(n - i);
            memcpy(s->pend, in + i, n - i);
            break;
        }
        size_t skip = k == 0 ? n - i : (size_t)(-k);
        memcpy(s->out + o, "\xEF\xBF\xBD", 3); o += 3; i += skip;
    }
    *text = s->out; *len = o;
    return KN_OK;
}

kn_status kn_detok_stream_push(kn_detok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return kn_set_error(KN_ERR_INVALID, "kn_detok_stream_push: NULL argument");
    *text = ""; *len = 0;
    const kn_tokenizer *t = s->tok;
    if (id < 0 || id >= t->n_vocab)
        return kn_set_error(KN_ERR_INVALID, "kn_detok_stream_push: id %d is outside the vocabulary (0..%d)",
                            (int)id, (int)t->n_vocab - 1);
    size_t l; const char *p = piece_for(t, id, s->flags, &s->strip_next, &l);
    return stream_emit(s, p, l, false, text, len);
}

kn_status kn_detok_stream_flush(kn_detok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return kn_set_error(KN_ERR_INVALID, "kn_detok_stream_flush: NULL argument");
    kn_status st = stream_emit(s, NULL, 0, true, text, len);
    s->strip_next = (s->flags & KN_DETOK_STRIP_SPACE) && strips_space(s->tok);
    return st;
}

void kn_detok_stream_free(kn_detok_stream *s) {
    if (!s) return;
    free(s->out);
    free(s);
}

/* ========================================================================== */
/* GGUF entry point                                                           */
/* ========================================================================== */

kn_status kn_tokenizer_from_gguf(const struct kn_gguf *g, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_from_gguf: out is NULL");
    *out = NULL;
    if (!g) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_from_gguf: gguf handle is NULL");
    kn_gguf_str model;
    if (!kn_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return kn_set_error(KN_ERR_FORMAT, "GGUF has no tokenizer.ggml.model string: the file carries no "
                            "vocabulary; pass a tokenizer file separately");
    if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) return kn__spm_from_gguf(g, out);
    if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) return kn__bpe_from_gguf(g, out);
    return kn_set_error(KN_ERR_UNSUPPORTED, "GGUF tokenizer.ggml.model = \"%.*s\" is not supported "
                        "(supported: \"llama\" SentencePiece-style BPE, \"gpt2\" byte-level BPE)",
                        (int)(model.len > 64 ? 64 : model.len), model.ptr);
}

kn_status kn_tokenizer_load_gguf(const char *path, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_gguf: out is NULL");
    *out = NULL;
    kn_gguf *g = NULL;
    kn_status s = kn_gguf_open(path, &g);
    if (s == KN_OK) s = kn_tokenizer_from_gguf(g, out);
    kn_gguf_close(g);
    return s;
}
