/* tok_common.c: what every vocabulary kind (tok_spm.c, tok_bpe.c,
 * tok_llmc.c) and the public calls (tokenizer.c) share: UTF-8 decoding and
 * encoding, small containers, token storage and lookup, reading a file,
 * kn_tokenizer_free, and the vocabulary read from a GGUF file. */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include "formats/gguf.h"         /* defines: kn_gguf_get_str/arr, ...           */
#include "formats/mapfile.h"      /* defines: kn_open_regular                    */
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

/* ---- BPE merges ---------------------------------------------------------- */
size_t kn__merge_probe(const kn_bpe_merge *tab, size_t cap, uint64_t key) {
    size_t mask = cap - 1, i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
    while (tab[i].rank >= 0 && tab[i].key != key) i = (i + 1) & mask;
    return i;
}

const kn_bpe_merge *kn__merge_find(const kn_tokenizer *t, int32_t l, int32_t r) {
    if (!t->merge_cap) return NULL;
    const kn_bpe_merge *m = &t->merges[kn__merge_probe(t->merges, t->merge_cap, ((uint64_t)(uint32_t)l << 32) | (uint32_t)r)];
    return m->rank >= 0 ? m : NULL;
}

static kn_status push_pair(const kn_tokenizer *t, const kn_bpe_sym *s, kn_heap *h, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return KN_OK;
    const kn_bpe_merge *m = kn__merge_find(t, s[l].id, s[r].id);
    if (!m) return KN_OK;
    return kn__heap_push(h, (kn_heap_item){(double)m->rank, l, r, s[l].id, s[r].id});
}

kn_status kn__bpe_merge_syms(const kn_tokenizer *t, kn_bpe_sym *s, size_t m, kn_heap *heap, kn_idvec *out) {
    if (m == 0) return KN_OK;
    for (size_t i = 0; i < m; i++) { s[i].prev = (int32_t)i - 1; s[i].next = (int32_t)i + 1; }
    s[m - 1].next = -1;
    heap->n = 0;
    kn_status st = KN_OK;
    for (size_t i = 0; i + 1 < m && st == KN_OK; i++) st = push_pair(t, s, heap, (int32_t)i, (int32_t)i + 1);
    while (st == KN_OK && heap->n > 0) {
        kn_heap_item it = kn__heap_pop(heap);
        int32_t l = it.pos, r = it.a;
        if (s[l].id != it.b || s[r].id != it.aux || s[l].next != r) continue;   /* stale */
        s[l].id = kn__merge_find(t, it.b, it.aux)->id;
        s[r].id = -1;
        s[l].next = s[r].next;
        if (s[r].next >= 0) s[s[r].next].prev = l;
        st = push_pair(t, s, heap, s[l].prev, l);
        if (st == KN_OK) st = push_pair(t, s, heap, l, s[l].next);
    }
    for (int32_t i = 0; i >= 0 && st == KN_OK; i = s[i].next) st = kn__idvec_push(out, s[i].id);
    return st;
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
    kn__hf_free(t->hf);
    free(t->piece0); free(t->piece0_off);
    free(t);
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
