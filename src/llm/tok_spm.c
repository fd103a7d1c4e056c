/* tok_spm.c: SentencePiece-style BPE, as llama2.c's run.c and llama.cpp's
 * "llama" vocabulary encode: split the text into UTF-8 characters, then keep
 * merging the adjacent pair whose concatenation is the vocabulary entry with
 * the highest score (leftmost pair on ties) until no pair is an entry.
 * Characters that are not entries become <0xXX> byte tokens.
 *
 * Loaders: llama2.c tokenizer.bin and GGUF tokenizer.ggml.model = "llama".
 * Spaces are stored as ' ' (llama2.c files already do; GGUF '▁' is converted
 * at load), so the text is looked up as is, after its own '▁' become ' '.
 *
 * The merge loop uses a binary heap of candidate pairs with lazy deletion:
 * O(n log n) for n characters instead of run.c's O(n^2) rescans.
 * Non-goals: SentencePiece's unigram model and its normalizer (NFKC).
 */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include "formats/gguf.h"             /* defines: kn_gguf (for kn__spm_from_gguf)    */
#include <stdlib.h>
#include <string.h>

/* ========================================================================== */
/* pieces                                                                     */
/* ========================================================================== */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> XX, else -1 */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

size_t kn__spm_piece(const kn_tokenizer *t, int32_t id, char *dst) {
    size_t n; const char *s = kn__tok_text(t, id, &n);
    if (t->types[id] == KN_TOKEN_BYTE) {
        int b = byte_token_value(s, n);
        if (b >= 0) { dst[0] = (char)b; return 1; }
    }
    memcpy(dst, s, n);
    return n;
}

static void fill_byte_ids(kn_tokenizer *t) {
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->types[id] != KN_TOKEN_BYTE) continue;
        size_t n; const char *s = kn__tok_text(t, id, &n);
        int b = byte_token_value(s, n);
        if (b >= 0 && t->byte_id[b] < 0) t->byte_id[b] = id;
    }
}

/* ========================================================================== */
/* encoding                                                                   */
/* ========================================================================== */

typedef struct spm_sym { int32_t off, len, prev, next; } spm_sym;  /* len 0: merged away */

static kn_status try_pair(const kn_tokenizer *t, const char *buf, const spm_sym *sym,
                          int32_t l, int32_t r, kn_heap *h) {
    if (l < 0 || r < 0) return KN_OK;
    int32_t n = sym[l].len + sym[r].len;
    int32_t id = kn__tok_lookup(t, buf + sym[l].off, (size_t)n);
    if (id < 0) return KN_OK;
    return kn__heap_push(h, (kn_heap_item){-(double)t->scores[id], l, l, r, n});
}

kn_status kn__spm_encode(const kn_tokenizer *t, const char *text, size_t len, bool prefix_space,
                         kn_idvec *out) {
    if (len == 0) return KN_OK;
    if (len > (size_t)INT32_MAX - 1)
        return kn_set_error(KN_ERR_LIMIT, "tokenize: text of %zu bytes is too long (limit 2 GiB)", len);
    size_t blen = len + (prefix_space ? 1 : 0);
    char *buf = malloc(blen);
    spm_sym *sym = malloc(blen * sizeof *sym);
    kn_heap h = {0};
    kn_status st = KN_OK;
    if (!buf || !sym) { st = kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory for %zu bytes", len); goto done; }
    if (prefix_space) buf[0] = ' ';
    /* the text's own U+2581 is a space too: llama.cpp turns every ' ' into
     * U+2581 and matches entries written with it; kiln stores entries with
     * ' ' (see the header), so it turns U+2581 into ' ' */
    size_t bl = prefix_space ? 1 : 0;
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && (unsigned char)text[i] == 0xE2 && (unsigned char)text[i + 1] == 0x96 &&
            (unsigned char)text[i + 2] == 0x81) { buf[bl++] = ' '; i += 2; }
        else buf[bl++] = text[i];
    }
    blen = bl;

    int32_t n = 0;
    for (size_t i = 0; i < blen;) {
        uint32_t cp;
        int k = kn__utf8_decode((const unsigned char *)buf + i, blen - i, &cp);
        sym[n] = (spm_sym){(int32_t)i, k, n - 1, n + 1};
        n++; i += (size_t)k;
    }
    sym[n - 1].next = -1;
    for (int32_t i = 0; i + 1 < n && st == KN_OK; i++) st = try_pair(t, buf, sym, i, i + 1, &h);

    while (st == KN_OK && h.n > 0) {
        kn_heap_item it = kn__heap_pop(&h);
        int32_t l = it.a, r = it.b;
        /* stale if either side changed since the pair was queued */
        if (sym[l].len == 0 || sym[r].len == 0 || sym[l].len + sym[r].len != it.aux) continue;
        sym[l].len += sym[r].len;
        sym[r].len = 0;
        sym[l].next = sym[r].next;
        if (sym[r].next >= 0) sym[sym[r].next].prev = l;
        st = try_pair(t, buf, sym, sym[l].prev, l, &h);
        if (st == KN_OK) st = try_pair(t, buf, sym, l, sym[l].next, &h);
    }

    for (int32_t i = 0; i >= 0 && st == KN_OK; i = sym[i].next) {
        int32_t id = kn__tok_lookup(t, buf + sym[i].off, (size_t)sym[i].len);
        if (id >= 0) { st = kn__idvec_push(out, id); continue; }
        for (int32_t j = 0; j < sym[i].len && st == KN_OK; j++) {     /* byte fallback */
            unsigned char b = (unsigned char)buf[sym[i].off + j];
            int32_t bid = t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk;
            if (bid < 0) {
                st = kn_set_error(KN_ERR_UNSUPPORTED, "tokenize: byte 0x%02x has no <0x%02X> token and the "
                                  "vocabulary has no <unk>; this text cannot be encoded", b, b);
                break;
            }
            st = kn__idvec_push(out, bid);
        }
    }
done:
    free(buf); free(sym); free(h.v);
    return st;
}

/* ========================================================================== */
/* llama2.c tokenizer.bin                                                     */
/* ========================================================================== */

kn_status kn_tokenizer_load_llama2c_memory(const void *data, size_t size, int32_t vocab_size,
                                           kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llama2c: out is NULL");
    *out = NULL;
    if (!data && size) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llama2c: data is NULL");
    if (vocab_size < 0) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llama2c: vocab_size %d < 0", (int)vocab_size);
    const unsigned char *p = data;
    int32_t max_len;
    if (size < 4) return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: file of %zu bytes is too short "
                                      "for the header (4 bytes)", size);
    memcpy(&max_len, p, 4);
    if (max_len <= 0 || max_len > (1 << 20))
        return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: max_token_length %d is not plausible; "
                            "is this a llama2.c tokenizer.bin?", (int)max_len);
    /* pass 1: count and validate */
    size_t o = 4; int32_t n = 0;
    while (o < size && (vocab_size == 0 || n < vocab_size)) {
        int32_t len;
        if (size - o < 8)
            return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: truncated at token %d (offset %zu)", (int)n, o);
        memcpy(&len, p + o + 4, 4);
        if (len < 0 || (size_t)len > size - o - 8)
            return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: token %d has length %d but only %zu bytes "
                                "remain (offset %zu); the file is truncated or corrupt", (int)n, (int)len,
                                size - o - 8, o);
        if (len > max_len)
            return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: token %d is %d bytes, longer than "
                                "max_token_length %d", (int)n, (int)len, (int)max_len);
        o += 8 + (size_t)len; n++;
        if (n > (1 << 24)) return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: more than 2^24 tokens");
    }
    if (vocab_size > 0 && n < vocab_size)
        return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: file holds %d tokens but the model's "
                            "vocab_size is %d; use the tokenizer that belongs to the model", (int)n, (int)vocab_size);
    if (o != size)
        return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: %zu bytes left after %d tokens; the model's "
                            "vocab_size does not match this tokenizer file", size - o, (int)n);
    if (n == 0) return kn_set_error(KN_ERR_FORMAT, "llama2.c tokenizer: file holds no tokens");

    kn_tokenizer *t;
    kn_status st = kn__tok_alloc(&t, KN_TOKENIZER_SPM, n);
    if (st != KN_OK) return st;
    const char **txt = malloc((size_t)n * sizeof *txt);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    if (!txt || !lens) { st = kn_set_error(KN_ERR_NOMEM, "llama2.c tokenizer: out of memory"); goto fail; }
    o = 4;
    for (int32_t i = 0; i < n; i++) {
        int32_t len;
        memcpy(&t->scores[i], p + o, 4);
        memcpy(&len, p + o + 4, 4);
        txt[i] = (const char *)p + o + 8; lens[i] = (size_t)len;
        o += 8 + (size_t)len;
        if (byte_token_value(txt[i], lens[i]) >= 0) t->types[i] = KN_TOKEN_BYTE;
    }
    st = kn__tok_set_texts(t, txt, lens);
    if (st != KN_OK) goto fail;
    /* llama2.c's fixed ids: 0 <unk>, 1 BOS ("\n<s>\n"), 2 EOS ("\n</s>\n") */
    t->unk = 0; t->types[0] = KN_TOKEN_UNKNOWN;
    if (n > 1) { t->bos = 1; t->types[1] = KN_TOKEN_CONTROL; }
    if (n > 2) { t->eos = 2; t->types[2] = KN_TOKEN_CONTROL; }
    t->add_bos = true; t->add_space_prefix = true;
    fill_byte_ids(t);
    st = kn__tok_finish(t, kn__spm_piece);
    if (st != KN_OK) goto fail;
    free(txt); free(lens);
    *out = t;
    return KN_OK;
fail:
    free(txt); free(lens);
    kn_tokenizer_free(t);
    return st;
}

kn_status kn_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llama2c: out is NULL");
    *out = NULL;
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llama2c: path is NULL");
    char *buf; size_t n;
    kn_status st = kn__read_file(path, &buf, &n);
    if (st != KN_OK) return st;
    st = kn_tokenizer_load_llama2c_memory(buf, n, vocab_size, out);
    free(buf);
    return st == KN_OK ? st : kn__prefix_error(st, path);
}

/* ========================================================================== */
/* GGUF "llama" vocabulary                                                    */
/* ========================================================================== */

kn_status kn__spm_from_gguf(const kn_gguf *g, kn_tokenizer **out) {
    kn_tokenizer *t;
    kn_status st = kn__tok_from_gguf_common(g, KN_TOKENIZER_SPM, &t);
    if (st != KN_OK) return st;
    /* files without token_type: recognise byte tokens by their text */
    if (kn_gguf_find_key(g, "tokenizer.ggml.token_type") < 0)
        for (int32_t id = 0; id < t->n_vocab; id++) {
            size_t n; const char *s = kn__tok_text(t, id, &n);
            if (byte_token_value(s, n) >= 0) t->types[id] = KN_TOKEN_BYTE;
        }
    fill_byte_ids(t);
    st = kn__tok_finish(t, kn__spm_piece);
    if (st != KN_OK) { kn_tokenizer_free(t); return st; }
    *out = t;
    return KN_OK;
}
