/* tok_llmc.c: llm.c's gpt2_tokenizer.bin, decode only.
 *
 * Layout: a header of 256 int32 (magic 20240328, version 1 or 2, vocab_size,
 * and for version 2 the end-of-text id), then per token one uint8 length and
 * that many raw bytes (already byte-decoded: no GPT-2 printable map). The file
 * has no merges, so kn_tokenize refuses it with KN_ERR_UNSUPPORTED.
 */
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn__* helpers */
#include <stdlib.h>
#include <string.h>

#define LLMC_MAGIC 20240328

static size_t llmc_piece(const kn_tokenizer *t, int32_t id, char *dst) {
    size_t n; const char *s = kn__tok_text(t, id, &n);
    memcpy(dst, s, n);
    return n;
}

kn_status kn_tokenizer_load_llmc_memory(const void *data, size_t size, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llmc: out is NULL");
    *out = NULL;
    if (!data && size) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llmc: data is NULL");
    const unsigned char *p = data;
    int32_t hdr[256];
    if (size < sizeof hdr)
        return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: %zu bytes is shorter than the 1024-byte header", size);
    memcpy(hdr, p, sizeof hdr);
    if (hdr[0] != LLMC_MAGIC)
        return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: bad magic %d (expected %d); is this llm.c's "
                            "gpt2_tokenizer.bin?", (int)hdr[0], LLMC_MAGIC);
    if (hdr[1] != 1 && hdr[1] != 2)
        return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: version %d is not supported (1 or 2)", (int)hdr[1]);
    int32_t n = hdr[2];
    if (n <= 0 || n > (1 << 24))
        return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: vocab_size %d is out of range", (int)n);
    int32_t eot = hdr[1] == 2 ? hdr[3] : 50256;   /* version 1 files are GPT-2's, eot 50256 */
    size_t o = sizeof hdr;
    for (int32_t i = 0; i < n; i++) {
        if (o >= size)
            return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: truncated at token %d of %d (offset %zu)",
                                (int)i, (int)n, o);
        size_t len = p[o];
        if (len == 0 || len > size - o - 1)
            return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: token %d has length %zu at offset %zu; the "
                                "file is truncated or corrupt", (int)i, len, o);
        o += 1 + len;
    }
    if (o != size)
        return kn_set_error(KN_ERR_FORMAT, "llm.c tokenizer: %zu trailing bytes after %d tokens", size - o, (int)n);

    kn_tokenizer *t;
    kn_status st = kn__tok_alloc(&t, KN_TOKENIZER_DECODE_ONLY, n);
    if (st != KN_OK) return st;
    const char **txt = malloc((size_t)n * sizeof *txt);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    if (!txt || !lens) { st = kn_set_error(KN_ERR_NOMEM, "llm.c tokenizer: out of memory"); goto fail; }
    o = sizeof hdr;
    for (int32_t i = 0; i < n; i++) {
        lens[i] = p[o]; txt[i] = (const char *)p + o + 1;
        o += 1 + lens[i];
    }
    st = kn__tok_set_texts(t, txt, lens);
    if (st != KN_OK) goto fail;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    if (eot >= 0 && eot < n) {
        t->eos = t->eot = eot;
        t->types[eot] = KN_TOKEN_CONTROL;
    }
    st = kn__tok_finish(t, llmc_piece);
    if (st != KN_OK) goto fail;
    free(txt); free(lens);
    *out = t;
    return KN_OK;
fail:
    free(txt); free(lens);
    kn_tokenizer_free(t);
    return st;
}

kn_status kn_tokenizer_load_llmc(const char *path, kn_tokenizer **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llmc: out is NULL");
    *out = NULL;
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_tokenizer_load_llmc: path is NULL");
    char *buf; size_t n;
    kn_status st = kn__read_file(path, &buf, &n);
    if (st != KN_OK) return st;
    st = kn_tokenizer_load_llmc_memory(buf, n, out);
    free(buf);
    return st == KN_OK ? st : kn__prefix_error(st, path);
}
