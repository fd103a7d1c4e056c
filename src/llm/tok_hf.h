/* tok_hf.h: the Hugging Face tokenizer.json pipeline, shared by tok_hfjson.c
 * (reads the JSON into struct kn_hf) and tok_hf.c (runs it). Not a public API.
 *
 * A tokenizer.json describes encoding as stages, each a list of steps:
 *   normalizers  -> one string to another (Lowercase, Replace, Prepend, ...);
 *   pre-tokenizers -> splits the string into pieces (ByteLevel, Split, ...);
 *   model        -> ids for each piece (BPE, WordPiece, Unigram);
 * and added tokens are cut out of the text before all of them (tokenizer.c's
 * special-token matcher does that, longest first). The vocabulary itself
 * (texts, types, the merge table) lives in struct kn_tokenizer as for the
 * other kinds; struct kn_hf holds the rest.
 */
#ifndef KN_TOK_HF_H
#define KN_TOK_HF_H
#include "llm/tokenizer_impl.h"   /* defines: struct kn_tokenizer, kn_idvec, kn_pretok */

typedef enum kn_hf_norm_type {
    KN_HFN_LOWERCASE, KN_HFN_STRIP, KN_HFN_REPLACE, KN_HFN_PREPEND, KN_HFN_NFC, KN_HFN_NFKC, KN_HFN_BERT,
} kn_hf_norm_type;

typedef struct kn_hf_norm {
    kn_hf_norm_type type;
    bool left, right;                    /* Strip                               */
    bool clean, chinese, lower, strip;   /* BertNormalizer                      */
    char *a, *b; size_t na, nb;          /* Replace: a -> b; Prepend: a         */
} kn_hf_norm;

typedef enum kn_hf_pre_type {
    KN_HFP_BYTELEVEL, KN_HFP_SPLIT, KN_HFP_METASPACE, KN_HFP_WHITESPACE, KN_HFP_WSSPLIT,
    KN_HFP_BERT, KN_HFP_DIGITS, KN_HFP_PUNCT,
    KN_HFP_SPLITSTR,                     /* Split on a literal string (Gemma: " ") */
} kn_hf_pre_type;

/* Split's behavior: where the matched delimiter goes (the library's
 * SplitDelimiterBehavior) */
enum { KN_HF_SPLIT_REMOVED, KN_HF_SPLIT_ISOLATED, KN_HF_SPLIT_PREV, KN_HF_SPLIT_NEXT, KN_HF_SPLIT_CONTIGUOUS };

enum { KN_HF_PREPEND_NEVER = 0, KN_HF_PREPEND_FIRST = 1, KN_HF_PREPEND_ALWAYS = 2 };

typedef struct kn_hf_pre {
    kn_hf_pre_type type;
    bool add_prefix_space, use_regex;    /* ByteLevel                           */
    kn_pretok pattern;                   /* Split (a known regex)               */
    bool split; int prepend;             /* Metaspace                           */
    bool individual;                     /* Digits                              */
    int behavior;                        /* Split on a string: KN_HF_SPLIT_*    */
    char *a; size_t na;                  /* Metaspace replacement; Split string */
} kn_hf_pre;

typedef enum kn_hf_dec_type {
    KN_HFD_BYTELEVEL, KN_HFD_REPLACE, KN_HFD_BYTEFALLBACK, KN_HFD_WORDPIECE,
    KN_HFD_JOIN,                         /* no decoder: tokens joined by spaces */
} kn_hf_dec_type;

typedef struct kn_hf_dec {              /* decoders that act on each token alone */
    kn_hf_dec_type type;
    char *a, *b; size_t na, nb;          /* Replace a -> b (nb <= na); WordPiece prefix a */
    bool cleanup;                        /* WordPiece: " ." -> "." and the like */
    bool meta;                           /* Replace from a Metaspace decoder    */
} kn_hf_dec;

typedef enum kn_hf_model { KN_HFM_BPE, KN_HFM_WORDPIECE, KN_HFM_UNIGRAM } kn_hf_model;

struct kn_hf {
    kn_hf_model model;
    kn_hf_norm *norm; int n_norm;        /* [n_norm] in order                   */
    kn_hf_pre *pre; int n_pre;           /* [n_pre] in order                    */
    kn_hf_dec *dec; int n_dec;           /* [n_dec] token -> text, in order     */
    uint8_t *in_model;                   /* [n_vocab] 1: in the model's vocabulary */
    int32_t unk;                         /* model's unknown token, or -1        */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_tok[256];               /* <0xNN> ids for byte_fallback, or -1 */
    char *prefix; size_t nprefix;        /* WordPiece continuing prefix ("##")  */
    int64_t max_chars;                   /* WordPiece max_input_chars_per_word  */
    double *score;                       /* [n_vocab] Unigram log-probabilities */
    double unk_score;                    /* Unigram: min score - 10             */
    size_t max_piece;                    /* longest model entry in bytes        */
    char *chat_template;                 /* tokenizer_config.json's, or NULL    */
};

/* tok_hf.c */
kn_status kn__hf_encode(const kn_tokenizer *t, const char *text, size_t len, bool at_start, kn_idvec *out);

/* tok_hfuni.c */
bool kn__hf_is_punct(uint32_t c);
bool kn__hf_is_other(uint32_t c);
bool kn__hf_is_mark(uint32_t c);
bool kn__hf_nf_unsafe(uint32_t c, bool nfkc);   /* may NFC/NFKC change or compose c?   */
bool kn__hf_is_ccc(uint32_t c);                  /* canonical combining class != 0      */
bool kn__hf_is_chinese(uint32_t c);
int kn__hf_lower(uint32_t c, uint32_t out[3]);   /* count of code points written */
/* NFD of c without non-spacing marks (BertNormalizer strip_accents): count */
int kn__hf_strip_accents(uint32_t c, uint32_t out[3]);
#endif
