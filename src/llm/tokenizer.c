/* tokenizer.c: what every vocabulary kind shares: token storage and lookup,
 * special-token matching, the kn_tokenize driver, decoding (whole and
 * streaming), UTF-8 helpers, and the GGUF entry point.
 *
 * The kind-specific encoders live in tok_spm.c (SentencePiece-style BPE) and
 * tok_bpe.c (GPT-2 byte-level BPE); tok_llmc.c reads llm.c's decode-only file.
 * Non-goals: Unicode normalization; other vocabulary kinds (see the header).
 */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include "formats/gguf.h"             /* defines: kn_gguf_get_str/arr, ...           */
#include "core/utf8.h"               /* defines: kn__utf8_check, kn_utf8_valid_prefix */
#include "formats/mapfile.h"          /* defines: kn_open_regular                    */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ========================================================================== */
/* UTF-8                                                                      */
/* ========================================================================== */

int kn__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80 || n < 2) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); return 2; }
    if (c < 0xF0 || n < 4) {
        if (n < 3) { *cp = c; return 1; }
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}

int kn__utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ========================================================================== */
/* small containers                                                           */
/* ========================================================================== */

kn_status kn__idvec_push(kn_idvec *iv, int32_t id) {
    if (iv->n == iv->cap) {
        size_t nc = iv->cap ? iv->cap * 2 : 64;
        int32_t *nv = realloc(iv->v, nc * sizeof *nv);
        if (!nv) return kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory for %zu ids", nc);
        iv->v = nv; iv->cap = nc;
    }
    iv->v[iv->n++] = id;
    return KN_OK;
}

static bool heap_less(const kn_heap_item *a, const kn_heap_item *b) {
    return a->key < b->key || (a->key == b->key && a->pos < b->pos);
}

kn_status kn__heap_push(kn_heap *h, kn_heap_item it) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        kn_heap_item *nv = realloc(h->v, nc * sizeof *nv);
        if (!nv) return kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory for the merge queue");
        h->v = nv; h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h->v[p])) break;
        h->v[i] = h->v[p]; i = p;
    }
    h->v[i] = it;
    return KN_OK;
}

kn_heap_item kn__heap_pop(kn_heap *h) {
    kn_heap_item top = h->v[0], last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&h->v[c + 1], &h->v[c])) c++;
        if (!heap_less(&h->v[c], &last)) break;
        h->v[i] = h->v[c]; i = c;
    }
    if (n) h->v[i] = last;
    return top;
}

/* ========================================================================== */
/* vocabulary storage and lookup                                              */
/* ========================================================================== */

static uint64_t hash_bytes(const char *s, size_t n) {      /* FNV-1a, 64-bit */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 0x100000001b3ull; }
    return h;
}

kn_status kn__tok_alloc(kn_tokenizer **out, kn_tokenizer_kind kind, int32_t n) {
    *out = NULL;
    if (n <= 0 || n > (1 << 24))
        return kn_set_error(KN_ERR_FORMAT, "tokenizer: vocabulary size %d is out of range (1..%d)",
                            (int)n, 1 << 24);
    kn_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind; t->n_vocab = n;
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    t->text_off = calloc((size_t)n + 1, sizeof *t->text_off);
    t->piece_off = calloc((size_t)n + 1, sizeof *t->piece_off);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->types = calloc((size_t)n, 1);
    if (!t->text_off || !t->piece_off || !t->scores || !t->types) {
        kn_tokenizer_free(t);
        return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for %d tokens", (int)n);
    }
    for (int32_t i = 0; i < n; i++) t->types[i] = KN_TOKEN_NORMAL;
    *out = t;
    return KN_OK;
}

kn_status kn__tok_set_texts(kn_tokenizer *t, const char *const *txt, const size_t *lens) {
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += lens[i];
    t->text = malloc(total ? total : 1);
    if (!t->text) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", total);
    size_t o = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->text_off[i] = o;
        if (lens[i]) memcpy(t->text + o, txt[i], lens[i]);
        o += lens[i];
    }
    t->text_off[t->n_vocab] = o;
    return KN_OK;
}

int32_t kn__tok_lookup(const kn_tokenizer *t, const char *s, size_t n) {
    if (!t->hash) return -1;
    size_t mask = t->hash_cap - 1, i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        size_t len; const char *x = kn__tok_text(t, id, &len);
        if (len == n && memcmp(x, s, n) == 0) return id;
        i = (i + 1) & mask;
    }
}

static int cmp_special(const void *pa, const void *pb, const kn_tokenizer *t) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    size_t la = t->text_off[a + 1] - t->text_off[a], lb = t->text_off[b + 1] - t->text_off[b];
    if (la != lb) return la > lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* insertion sort (specials are few: tens to a few hundred) */
static void sort_specials(kn_tokenizer *t) {
    for (int i = 1; i < t->n_special; i++) {
        int32_t x = t->special[i]; int j = i - 1;
        while (j >= 0 && cmp_special(&t->special[j], &x, t) > 0) { t->special[j + 1] = t->special[j]; j--; }
        t->special[j + 1] = x;
    }
}

static void add_eog(kn_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_eog; i++) if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

kn_status kn__tok_finish(kn_tokenizer *t,
                         size_t (*piece_of)(const kn_tokenizer *t, int32_t id, char *dst)) {
    int32_t n = t->n_vocab;
    /* hash: later duplicates win, as in llama.cpp's token_to_id map */
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    t->hash = malloc(cap * sizeof *t->hash);
    if (!t->hash) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for the hash table");
    t->hash_cap = cap;
    for (size_t i = 0; i < cap; i++) t->hash[i] = -1;
    for (int32_t id = 0; id < n; id++) {
        size_t len; const char *s = kn__tok_text(t, id, &len);
        size_t i = (size_t)hash_bytes(s, len) & (cap - 1);
        for (;;) {
            int32_t o = t->hash[i];
            if (o < 0) { t->hash[i] = id; break; }
            size_t ol; const char *os = kn__tok_text(t, o, &ol);
            if (ol == len && memcmp(os, s, len) == 0) { t->hash[i] = id; break; }
            i = (i + 1) & (cap - 1);
        }
    }
    /* pieces: decoded bytes are never longer than 4x the text (<0xXX> is 6 -> 1) */
    size_t total = 0, maxlen = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len = t->text_off[id + 1] - t->text_off[id];
        total += len; if (len > maxlen) maxlen = len;
    }
    char *tmp = malloc(4 * maxlen + 4);
    t->piece = malloc(total + 1);
    if (!tmp || !t->piece) { free(tmp); return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for pieces"); }
    size_t o = 0, pcap = total + 1;
    for (int32_t id = 0; id < n; id++) {
        size_t pl = piece_of(t, id, tmp);
        if (o + pl > pcap) {
            size_t nc = (o + pl) * 2;
            char *np = realloc(t->piece, nc);
            if (!np) { free(tmp); return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory for pieces"); }
            t->piece = np; pcap = nc;
        }
        t->piece_off[id] = o;
        memcpy(t->piece + o, tmp, pl);
        o += pl;
    }
    t->piece_off[n] = o;
    free(tmp);
    /* specials: control, user-defined and unknown tokens with non-empty text */
    int ns = 0;
    for (int32_t id = 0; id < n; id++) {
        int ty = t->types[id];
        if ((ty == KN_TOKEN_CONTROL || ty == KN_TOKEN_USER_DEFINED || ty == KN_TOKEN_UNKNOWN) &&
            t->text_off[id + 1] > t->text_off[id]) ns++;
    }
    if (ns) {
        t->special = malloc((size_t)ns * sizeof *t->special);
        if (!t->special) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory");
        for (int32_t id = 0; id < n; id++) {
            int ty = t->types[id];
            if ((ty == KN_TOKEN_CONTROL || ty == KN_TOKEN_USER_DEFINED || ty == KN_TOKEN_UNKNOWN) &&
                t->text_off[id + 1] > t->text_off[id]) t->special[t->n_special++] = id;
        }
        sort_specials(t);
    }
    /* end-of-generation set */
    static const char *const eog_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<|return|>",
    };
    int n_names = (int)(sizeof eog_names / sizeof eog_names[0]);
    t->eog = malloc((size_t)(n_names + 4) * sizeof *t->eog);
    if (!t->eog) return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory");
    add_eog(t, t->eos); add_eog(t, t->eot); add_eog(t, t->eom);
    for (int k = 0; k < n_names; k++) {
        int32_t id = kn__tok_lookup(t, eog_names[k], strlen(eog_names[k]));
        if (id >= 0 && (t->types[id] == KN_TOKEN_CONTROL || t->types[id] == KN_TOKEN_USER_DEFINED))
            add_eog(t, id);
    }
    return KN_OK;
}

kn_status kn__read_file(const char *path, char **data, size_t *size) {
    *data = NULL; *size = 0;
    int fd;
    uint64_t fsize;
    kn_status st = kn_open_regular(path, "tokenizer file", &fd, &fsize);
    if (st) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); return kn_set_error(KN_ERR_NOMEM, "reading '%s': out of memory", path); }
    char *buf = NULL; size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 1 << 16;
            char *nb = realloc(buf, nc);
            if (!nb) { free(buf); fclose(f); return kn_set_error(KN_ERR_NOMEM, "reading '%s': out of memory", path); }
            buf = nb; cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    bool err = ferror(f) != 0;
    fclose(f);
    if (err) { free(buf); return kn_set_error(KN_ERR_IO, "read error on tokenizer file '%s'", path); }
    *data = buf; *size = n;
    return KN_OK;
}

kn_status kn__prefix_error(kn_status st, const char *path) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", kn_last_error());
    return kn_set_error(st, "%s: %s", path, msg);
}

void kn_tokenizer_free(kn_tokenizer *t) {
    if (!t) return;
    free(t->text); free(t->text_off); free(t->piece); free(t->piece_off);
    free(t->scores); free(t->types); free(t->hash); free(t->special); free(t->eog);
    free(t->merges);
    free(t);
}

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
        if (*strip_next && p[0] == ' ') { p++; (*len)--; }
        *strip_next = false;
    }
    if (t->kind == KN_TOKENIZER_SPM && t->add_space_prefix && id == t->bos) *strip_next = true;
    return p;
}

kn_status kn_detokenize(const kn_tokenizer *t, const int32_t *ids, int n_ids, unsigned flags,
                        char *buf, size_t cap, size_t *needed) {
    if (needed) *needed = 0;
    if (!t || !needed || n_ids < 0 || (n_ids > 0 && !ids) || (cap > 0 && !buf))
        return kn_set_error(KN_ERR_INVALID, "kn_detokenize: NULL tokenizer, ids, buf or needed");
    bool strip = (flags & KN_DETOK_STRIP_SPACE) && t->kind == KN_TOKENIZER_SPM && t->add_space_prefix;
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
    s->strip_next = (flags & KN_DETOK_STRIP_SPACE) && t->kind == KN_TOKENIZER_SPM && t->add_space_prefix;
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
    s->strip_next = (s->flags & KN_DETOK_STRIP_SPACE) && s->tok->kind == KN_TOKENIZER_SPM &&
                    s->tok->add_space_prefix;
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

/* Read a GGUF integer array element (any integer element type) as int64. */
static bool arr_int_at(kn_gguf_type et, const void *data, uint64_t i, int64_t *v) {
    const unsigned char *p = data;
    switch (et) {
    case KN_GGUF_I8:  { int8_t x;   memcpy(&x, p + i, 1);     *v = x; return true; }
    case KN_GGUF_U8:  { uint8_t x;  memcpy(&x, p + i, 1);     *v = x; return true; }
    case KN_GGUF_I16: { int16_t x;  memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case KN_GGUF_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case KN_GGUF_I32: { int32_t x;  memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case KN_GGUF_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case KN_GGUF_I64: { int64_t x;  memcpy(&x, p + 8 * i, 8); *v = x; return true; }
    case KN_GGUF_U64: { uint64_t x; memcpy(&x, p + 8 * i, 8); *v = (int64_t)x; return true; }
    default: return false;
    }
}

static int32_t gguf_id(const kn_gguf *g, const char *key, int32_t dflt, int32_t n) {
    int64_t v;
    if (!kn_gguf_get_i64(g, key, &v)) return dflt < n ? dflt : -1;
    return (v >= 0 && v < n) ? (int32_t)v : -1;
}

kn_status kn__tok_from_gguf_common(const kn_gguf *g, kn_tokenizer_kind kind, kn_tokenizer **out) {
    const char *K = "tokenizer.ggml.tokens";
    kn_gguf_type et; uint64_t n; const void *data;
    *out = NULL;
    if (!kn_gguf_get_arr(g, K, &et, &n, &data) || et != KN_GGUF_STRING)
        return kn_set_error(KN_ERR_FORMAT, "GGUF: %s is missing or not a string array", K);
    if (n == 0 || n > (1u << 24))
        return kn_set_error(KN_ERR_FORMAT, "GGUF: %s has %llu entries (expected 1..%u)", K,
                            (unsigned long long)n, 1u << 24);
    kn_tokenizer *t;
    kn_status st = kn__tok_alloc(&t, kind, (int32_t)n);
    if (st != KN_OK) return st;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += kn_gguf_arr_str(g, K, i).len;
    t->text = malloc(total ? total : 1);
    if (!t->text) { kn_tokenizer_free(t); return kn_set_error(KN_ERR_NOMEM, "tokenizer: out of memory"); }
    size_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        kn_gguf_str s = kn_gguf_arr_str(g, K, i);
        t->text_off[i] = o;
        for (uint64_t j = 0; j < s.len; j++) {
            /* SPM vocabularies write spaces as U+2581 (E2 96 81); store ' ' */
            if (kind == KN_TOKENIZER_SPM && j + 2 < s.len && (unsigned char)s.ptr[j] == 0xE2 &&
                (unsigned char)s.ptr[j + 1] == 0x96 && (unsigned char)s.ptr[j + 2] == 0x81) {
                t->text[o++] = ' '; j += 2;
            } else t->text[o++] = s.ptr[j];
        }
    }
    t->text_off[n] = o;

    K = "tokenizer.ggml.scores";
    if (kn_gguf_get_arr(g, K, &et, &n, &data)) {
        if ((et != KN_GGUF_F32 && et != KN_GGUF_F64) || n != (uint64_t)t->n_vocab) {
            kn_tokenizer_free(t);
            return kn_set_error(KN_ERR_FORMAT, "GGUF: %s must be a float array of %d entries", K, (int)t->n_vocab);
        }
        for (uint64_t i = 0; i < n; i++) {
            if (et == KN_GGUF_F32) memcpy(&t->scores[i], (const char *)data + 4 * i, 4);
            else { double d; memcpy(&d, (const char *)data + 8 * i, 8); t->scores[i] = (float)d; }
        }
    } else if (kind == KN_TOKENIZER_SPM) {
        kn_tokenizer_free(t);
        return kn_set_error(KN_ERR_FORMAT, "GGUF: a \"llama\" vocabulary needs %s (merge scores)", K);
    }
    K = "tokenizer.ggml.token_type";
    if (kn_gguf_get_arr(g, K, &et, &n, &data)) {
        int64_t v;
        if (n != (uint64_t)t->n_vocab || !arr_int_at(et, data, 0, &v)) {
            kn_tokenizer_free(t);
            return kn_set_error(KN_ERR_FORMAT, "GGUF: %s must be an integer array of %d entries", K, (int)t->n_vocab);
        }
        for (uint64_t i = 0; i < n; i++) {
            arr_int_at(et, data, i, &v);
            t->types[i] = (v >= KN_TOKEN_NORMAL && v <= KN_TOKEN_BYTE) ? (uint8_t)v : KN_TOKEN_NORMAL;
        }
    }
    bool spm = kind == KN_TOKENIZER_SPM;
    t->bos = gguf_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, t->n_vocab);
    t->eos = gguf_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, t->n_vocab);
    t->unk = gguf_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab);
    t->pad = gguf_id(g, "tokenizer.ggml.padding_token_id", -1, t->n_vocab);
    t->eot = gguf_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab);
    t->eom = gguf_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab);
    bool b;
    t->add_bos = kn_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) ? b : spm;
    t->add_space_prefix = kn_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) ? b : spm;
    *out = t;
    return KN_OK;
}
