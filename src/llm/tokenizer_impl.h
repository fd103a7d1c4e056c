/* tokenizer_impl.h: internals shared by tokenizer.c (vocabulary storage,
 * lookup, decoding), tok_spm.c, tok_bpe.c and tok_llmc.c. Not a public API.
 *
 * Every vocabulary keeps two strings per token:
 *   text  - the entry as stored, used for lookups while encoding (SPM: '▁'
 *           already turned into ' '; GPT-2: the byte-mapped form);
 *   piece - the bytes it decodes to (<0x41> -> "A", GPT-2 map undone).
 */
#ifndef KN_TOKENIZER_IMPL_H
#define KN_TOKENIZER_IMPL_H
#include "kiln_tokenizer.h"

typedef enum kn_pretok {             /* GPT-2 style pre-tokenizer variants    */
    KN_PRETOK_GPT2 = 0,              /* 's|'t|...| ?\p{L}+| ?\p{N}+|...      */
    KN_PRETOK_DIGITS_GPT2 = 1,       /* \p{N} isolated first, then GPT-2      */
    KN_PRETOK_LLAMA3 = 2,            /* Llama 3 tiktoken-style pattern         */
    KN_PRETOK_QWEN2 = 3,             /* Llama 3's with \p{N} (one digit)       */
} kn_pretok;

typedef struct kn_bpe_merge { uint64_t key; int32_t rank; int32_t id; } kn_bpe_merge;

struct kn_tokenizer {
    kn_tokenizer_kind kind;
    int32_t n_vocab;
    char *text;          /* [sum of text lengths] all entries back to back        */
    size_t *text_off;    /* [n_vocab + 1] entry i is text[text_off[i]..text_off[i+1]) */
    char *piece;         /* [sum of piece lengths] decoded bytes                  */
    size_t *piece_off;   /* [n_vocab + 1]                                         */
    float *scores;       /* [n_vocab] SPM merge scores (0 when absent)            */
    uint8_t *types;      /* [n_vocab] kn_token_type                               */
    int32_t *hash;       /* [hash_cap] open addressing over ids, -1 = empty       */
    size_t hash_cap;     /* power of two, >= 2 * n_vocab                          */
    int32_t byte_id[256];/* SPM: <0xXX> token; BPE: token of the mapped byte; -1  */
    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_space_prefix;
    int32_t *special;    /* [n_special] ids matched in text, longest text first   */
    int n_special;
    int32_t *eog;        /* [n_eog] end-of-generation ids                         */
    int n_eog;
    /* BPE only */
    kn_pretok pretok;
    kn_bpe_merge *merges;/* [merge_cap] open addressing on key = left<<32|right   */
    size_t merge_cap;    /* power of two, 0 when no merges                       */
    /* Hugging Face tokenizer.json only (tok_hf.h) */
    struct kn_hf *hf;
    char *piece0;        /* [..] pieces as the first token of an output (Metaspace
                            decoders drop every U+2581 there), or NULL            */
    size_t *piece0_off;  /* [n_vocab + 1]                                         */
};

/* ---- tokenizer.c ---- */
/* Allocate the per-token arrays for n tokens (texts appended afterwards with
 * kn__tok_set_text; pieces derived in kn__tok_finish). */
kn_status kn__tok_alloc(kn_tokenizer **out, kn_tokenizer_kind kind, int32_t n);
/* Store token texts: all n texts in order, lengths in lens, bytes in buf. */
kn_status kn__tok_set_texts(kn_tokenizer *t, const char *const *txt, const size_t *lens);
/* Build hash, pieces, byte table, specials, EOG set. piece_of decodes one
 * token's text into dst (capacity >= 4 * text length) and returns its length. */
kn_status kn__tok_finish(kn_tokenizer *t,
                         size_t (*piece_of)(const kn_tokenizer *t, int32_t id, char *dst));
/* Whole file into a malloc'd buffer (caller frees). */
kn_status kn__read_file(const char *path, char **data, size_t *size);
/* Re-set the current error message as "path: message"; returns st. */
kn_status kn__prefix_error(kn_status st, const char *path);
int32_t kn__tok_lookup(const kn_tokenizer *t, const char *s, size_t n);
static inline const char *kn__tok_text(const kn_tokenizer *t, int32_t id, size_t *n) {
    *n = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}
/* One UTF-8 character at s (n bytes left, input already validated): its
 * length in bytes (1..4); *cp gets the code point. */
int kn__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
int kn__utf8_encode(uint32_t cp, char *out);

/* Growable id list used while encoding. */
typedef struct kn_idvec { int32_t *v; size_t n, cap; } kn_idvec;
kn_status kn__idvec_push(kn_idvec *iv, int32_t id);

/* Min-heap of candidate merges: smallest key first, then smallest pos. */
typedef struct kn_heap_item { double key; int32_t pos, a, b, aux; } kn_heap_item;
typedef struct kn_heap { kn_heap_item *v; size_t n, cap; } kn_heap;
kn_status kn__heap_push(kn_heap *h, kn_heap_item it);
kn_heap_item kn__heap_pop(kn_heap *h);

/* BPE merges (GGUF and tokenizer.json vocabularies share the table above):
 * kn__merge_probe gives the slot of tab[cap] that holds key (left << 32 |
 * right), or the empty one (rank < 0) where it goes; kn__merge_find the
 * merge of the pair (l, r), or NULL. kn__bpe_merge_syms runs the merges
 * (lowest rank first, leftmost among equals) over the m symbols s[] whose
 * ids are set (prev/next are set here) and appends the resulting ids to
 * out; heap is scratch (kept for reuse by the caller). */
typedef struct kn_bpe_sym { int32_t id, prev, next; } kn_bpe_sym;   /* id -1: merged away */
size_t kn__merge_probe(const kn_bpe_merge *tab, size_t cap, uint64_t key);
const kn_bpe_merge *kn__merge_find(const kn_tokenizer *t, int32_t l, int32_t r);
kn_status kn__bpe_merge_syms(const kn_tokenizer *t, kn_bpe_sym *s, size_t m, kn_heap *heap, kn_idvec *out);

/* ---- tok_bpe.c: Unicode classes, GPT-2 byte map, regex-free pre-tokenizers ---- */
enum { KN_CF_LETTER = 1, KN_CF_NUMBER = 2, KN_CF_SPACE = 4, KN_CF_OTHER = 8 };
unsigned kn__cp_class(uint32_t c);          /* one KN_CF_* flag (\s, \p{L}, \p{N}, else) */
uint32_t kn__byte_to_cp(unsigned b);        /* GPT-2 printable stand-in of a byte       */
int kn__cp_to_byte(uint32_t cp);            /* inverse, or -1                            */
/* Split text[0..len) (valid UTF-8) with the pattern kind, calling emit for
 * each piece (byte offset and length, in order, covering the whole text). */
typedef kn_status (*kn__span_fn)(void *ctx, size_t off, size_t len);
kn_status kn__pretok_split(kn_pretok kind, const char *text, size_t len, kn__span_fn emit, void *ctx);

/* ---- tok_hfjson.c ---- */
void kn__hf_free(struct kn_hf *hf);   /* NULL is a no-op */

/* ---- per kind ---- */
kn_status kn__spm_encode(const kn_tokenizer *t, const char *text, size_t len, bool prefix_space,
                         kn_idvec *out);
kn_status kn__bpe_encode(const kn_tokenizer *t, const char *text, size_t len, kn_idvec *out);
/* tok_hf.c; at_start: the run begins the text (Metaspace prepend_scheme "first") */
kn_status kn__hf_encode(const kn_tokenizer *t, const char *text, size_t len, bool at_start, kn_idvec *out);
size_t kn__spm_piece(const kn_tokenizer *t, int32_t id, char *dst);
size_t kn__bpe_piece(const kn_tokenizer *t, int32_t id, char *dst);
/* Tokens (SPM: U+2581 stored as ' '), scores, types, special ids, add_bos
 * and add_space_prefix from a GGUF; the caller adds kind specifics and
 * calls kn__tok_finish. */
kn_status kn__tok_from_gguf_common(const struct kn_gguf *g, kn_tokenizer_kind kind, kn_tokenizer **out);
kn_status kn__spm_from_gguf(const struct kn_gguf *g, kn_tokenizer **out);
kn_status kn__bpe_from_gguf(const struct kn_gguf *g, kn_tokenizer **out);
#endif
