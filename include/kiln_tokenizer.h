/* kiln_tokenizer.h: text <-> token ids for the LLM engine.
 *
 * Vocabularies:
 *   - SentencePiece-style BPE ("SPM"): llama2.c tokenizer.bin files and GGUF
 *     files with tokenizer.ggml.model = "llama" (Llama 1/2, TinyLlama, ...).
 *     Encoding prepends a dummy space, looks up each UTF-8 character (falling
 *     back to <0xXX> byte tokens), then merges the adjacent pair whose merged
 *     text has the highest score until no pair is in the vocabulary.
 *   - GPT-2 byte-level BPE: GGUF files with tokenizer.ggml.model = "gpt2"
 *     (GPT-2, SmolLM/SmolLM2, Llama 3, ...). Text is split by a pre-tokenizer
 *     named by tokenizer.ggml.pre: "gpt-2"/"gpt2"/"default" (GPT-2 pattern;
 *     note llama.cpp's "default" differs slightly), the digit-splitting
 *     "smollm"/"starcoder"/"refact"/"command-r"/"codeshell" family, or
 *     "llama-bpe"/"llama3" (Llama 3). Bytes are mapped to printable
 *     characters, then merged by rank.
 *   - llm.c gpt2_tokenizer.bin: decode only (the file has no merges).
 *
 *   - Hugging Face tokenizer.json (kn_tokenizer_load_hf): BPE, WordPiece and
 *     Unigram models run through the file's normalizer, pre-tokenizer and
 *     decoder steps (src/llm/tok_hf*.c).
 *
 * Non-goals: WordPiece/Unigram vocabularies in GGUF, full Unicode
 * normalization (NFC/NFKC only where they change nothing), other
 * pre-tokenizer regexes (DeepSeek, ...); loading such a file returns
 * KN_ERR_UNSUPPORTED with a message naming the missing piece.
 *
 * Encoding input must be valid UTF-8 (KN_ERR_INVALID otherwise). Decoding
 * gives raw bytes; the streaming decoder gives only complete, valid UTF-8.
 *
 * Usage:
 *
 *   kn_tokenizer *tok;
 *   if (kn_tokenizer_load_llama2c("tokenizer.bin", 32000, &tok) != KN_OK)
 *       fprintf(stderr, "%s\n", kn_last_error());
 *   int32_t ids[256]; int n;
 *   kn_status st = kn_tokenize(tok, "Hello world", 11, true, false, ids, 256, &n);
 *   if (st == KN_ERR_LIMIT) { ...n is the count needed; grow ids and retry... }
 *
 *   kn_detok_stream *ds;
 *   kn_detok_stream_new(tok, 0, &ds);
 *   for (each generated id) {
 *       const char *s; size_t len;
 *       kn_detok_stream_push(ds, id, &s, &len);   // never half a character
 *       fwrite(s, 1, len, stdout);
 *       if (kn_tokenizer_is_eog(tok, id)) break;
 *   }
 *   kn_detok_stream_flush(ds, &s, &len); fwrite(s, 1, len, stdout);
 *   kn_detok_stream_free(ds);
 *   kn_tokenizer_free(tok);
 *
 * A tokenizer is read-only after loading: any number of threads may encode
 * and decode with it at once. A kn_detok_stream belongs to one thread.
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_tokenizer kn_tokenizer;
typedef struct kn_detok_stream kn_detok_stream;
struct kn_gguf;                       /* src/formats/gguf.h */

/* Token types: the GGUF tokenizer.ggml.token_type values. */
typedef enum kn_token_type {
    KN_TOKEN_UNDEFINED = 0,
    KN_TOKEN_NORMAL = 1,
    KN_TOKEN_UNKNOWN = 2,             /* <unk>                                   */
    KN_TOKEN_CONTROL = 3,             /* <s>, </s>, <|im_start|>, <|endoftext|>  */
    KN_TOKEN_USER_DEFINED = 4,        /* always matched as a whole in the text   */
    KN_TOKEN_UNUSED = 5,
    KN_TOKEN_BYTE = 6,                /* <0x0A>: one raw byte                    */
} kn_token_type;

typedef enum kn_tokenizer_kind {
    KN_TOKENIZER_SPM = 1,             /* SentencePiece-style, scores             */
    KN_TOKENIZER_BPE = 2,             /* GPT-2 byte-level, merge ranks           */
    KN_TOKENIZER_DECODE_ONLY = 3,     /* llm.c gpt2_tokenizer.bin                */
    KN_TOKENIZER_HF = 4,              /* Hugging Face tokenizer.json pipeline    */
} kn_tokenizer_kind;

/* ---- loading ---------------------------------------------------------------
 * All loaders validate the whole file and return KN_ERR_IO / KN_ERR_FORMAT /
 * KN_ERR_NOMEM with a message on failure (*out = NULL). Free with
 * kn_tokenizer_free (NULL is a no-op). */

/* llama2.c tokenizer.bin: int32 max_token_length, then per token {float score,
 * int32 len, len bytes}. vocab_size is the model's (Config.vocab_size); pass
 * 0 to read tokens until the end of the file. Ids 0/1/2 are <unk>/BOS/EOS. */
kn_status kn_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kn_tokenizer **out);
/* Same from memory (copied; for tests and fuzzing). */
kn_status kn_tokenizer_load_llama2c_memory(const void *data, size_t size, int32_t vocab_size,
                                           kn_tokenizer **out);
/* From an open GGUF (the tokenizer copies what it needs; g may be closed after). */
kn_status kn_tokenizer_from_gguf(const struct kn_gguf *g, kn_tokenizer **out);
/* The tokenizer of a GGUF file (a model or a vocabulary-only file such as
 * llama.cpp's ggml-vocab-gpt-2.gguf); the file is closed before returning. */
kn_status kn_tokenizer_load_gguf(const char *path, kn_tokenizer **out);
/* llm.c gpt2_tokenizer.bin (magic 20240328, version 1 or 2): decode only. */
kn_status kn_tokenizer_load_llmc(const char *path, kn_tokenizer **out);
kn_status kn_tokenizer_load_llmc_memory(const void *data, size_t size, kn_tokenizer **out);
/* Hugging Face tokenizer.json: path_or_dir is the file or the directory
 * holding it; tokenizer_config.json beside it (optional) gives bos_token,
 * eos_token, add_bos_token and chat_template. Models BPE (byte-level or with
 * byte_fallback), WordPiece and Unigram with the common normalizers,
 * pre-tokenizers and decoders (list in src/llm/tok_hfjson.c); anything else
 * that would change the ids is refused with KN_ERR_UNSUPPORTED naming it.
 * Added tokens are matched as kn_tokenize's special tokens (special ones
 * only with parse_special). Decode with KN_DETOK_STRIP_SPACE to drop the
 * leading space that Metaspace/WordPiece/Llama 2-style decoders drop. */
kn_status kn_tokenizer_load_hf(const char *path_or_dir, kn_tokenizer **out);
/* Same from memory (config may be NULL; both copied as needed). */
kn_status kn_tokenizer_load_hf_memory(const char *json, size_t len, const char *config, size_t config_len,
                                      kn_tokenizer **out);
/* tokenizer_config.json's chat_template (a Jinja string, for kn_chat), or NULL. */
const char *kn_tokenizer_chat_template(const kn_tokenizer *tok);
void kn_tokenizer_free(kn_tokenizer *tok);

/* ---- queries ---------------------------------------------------------------- */
kn_tokenizer_kind kn_tokenizer_get_kind(const kn_tokenizer *tok);
int32_t kn_tokenizer_n_vocab(const kn_tokenizer *tok);
int32_t kn_tokenizer_bos(const kn_tokenizer *tok);       /* -1 when none       */
int32_t kn_tokenizer_eos(const kn_tokenizer *tok);       /* -1 when none       */
int32_t kn_tokenizer_eot(const kn_tokenizer *tok);       /* end of turn, or -1 */
/* Whether the vocabulary asks for a BOS at the start (GGUF add_bos_token;
 * true for llama2.c files). Pass it as kn_tokenize's add_bos. */
bool kn_tokenizer_add_bos(const kn_tokenizer *tok);
kn_token_type kn_tokenizer_token_type(const kn_tokenizer *tok, int32_t id); /* UNDEFINED if out of range */
/* End of generation: EOS, EOT, EOM, or a control token such as <|im_end|>,
 * <|eot_id|>, <|endoftext|>, <end_of_turn>, <|end|>. */
bool kn_tokenizer_is_eog(const kn_tokenizer *tok, int32_t id);
/* Vocabulary entry as stored (SPM spaces shown as ' ', GPT-2 entries in their
 * byte-mapped form); NULL if out of range. Not NUL-terminated. */
const char *kn_tokenizer_token_text(const kn_tokenizer *tok, int32_t id, size_t *len);
/* Id of an exact vocabulary entry (as kn_tokenizer_token_text gives it), or -1. */
int32_t kn_tokenizer_find(const kn_tokenizer *tok, const char *text, size_t len);

/* ---- encoding ----------------------------------------------------------------
 * Tokenize len bytes of UTF-8 text. add_bos prepends BOS (if the vocabulary
 * has one). parse_special matches control tokens written in the text (e.g.
 * "<|im_start|>", "<s>") as single ids; user-defined tokens always match.
 * Writes at most max_ids ids; *n_ids gets the total count. Returns
 * KN_ERR_LIMIT (ids untouched) when max_ids < *n_ids, KN_ERR_INVALID for
 * invalid UTF-8 (the message gives the byte offset), KN_ERR_UNSUPPORTED for a
 * decode-only tokenizer. ids may be NULL when max_ids is 0 (count only). */
kn_status kn_tokenize(const kn_tokenizer *tok, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t *ids, int max_ids, int *n_ids);

/* ---- decoding ----------------------------------------------------------------*/
enum {
    KN_DETOK_SPECIAL = 1,     /* render control/unknown tokens as their text      */
    KN_DETOK_STRIP_SPACE = 2, /* SPM vocabularies that add a dummy prefix: drop one
                                 leading space of the first piece of the output.
                                 (One leading space after BOS is always dropped,
                                 as llama2.c does.)                               */
};
/* Bytes of one token as it appears in text: <0x0A> -> "\n", SPM '▁' -> ' ',
 * GPT-2 byte map undone. Control/unknown/unused tokens give "" unless
 * render_special. Points into the tokenizer (valid until kn_tokenizer_free),
 * not NUL-terminated; NULL (and *len = 0) for an out-of-range id. A piece may
 * be part of a UTF-8 character (byte tokens). */
const char *kn_token_to_piece(const kn_tokenizer *tok, int32_t id, bool render_special, size_t *len);
/* Concatenated pieces of ids[0..n) (flags: KN_DETOK_*), NUL-terminated when
 * it fits. *needed gets the byte count without the NUL; returns KN_ERR_LIMIT
 * if cap < *needed + 1, KN_ERR_INVALID for an out-of-range id. */
kn_status kn_detokenize(const kn_tokenizer *tok, const int32_t *ids, int n_ids, unsigned flags,
                        char *buf, size_t cap, size_t *needed);

/* Streaming decoder: each push returns only complete UTF-8 characters and
 * holds back the bytes of a character that is not finished yet (e.g. an emoji
 * spread over four <0xXX> byte tokens). Bytes that can never form a valid
 * character are replaced by U+FFFD, so the output is always valid UTF-8.
 * *text stays valid until the next call on the stream. */
kn_status kn_detok_stream_new(const kn_tokenizer *tok, unsigned flags, kn_detok_stream **out);
kn_status kn_detok_stream_push(kn_detok_stream *s, int32_t id, const char **text, size_t *len);
/* End of stream: emits held-back bytes (an unfinished character as U+FFFD)
 * and resets the stream for reuse. */
kn_status kn_detok_stream_flush(kn_detok_stream *s, const char **text, size_t *len);
void kn_detok_stream_free(kn_detok_stream *s);

/* UTF-8 helper: offset of the first invalid byte in s[0..n), or n if valid.
 * Rejects overlong forms, surrogates and code points above U+10FFFF. */
size_t kn_utf8_valid_prefix(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
