/* model_ckpt.h: the GPT checkpoints that `kiln train char|gpt2` writes
 * (kn_train_save: a .safetensors file with the GPT-2 module's parameters,
 * optimizer state and metadata), read as language models: by the model
 * loader (kn_model_load) and by the GGUF exporter (kn_model_export_gguf).
 * Internal header (src/).
 *
 * Metadata read: model ("char-gpt" or "gpt2"), vocab, layers, dim, heads,
 * ctx; char models also char_codepoints (the vocabulary: comma-separated
 * code points, id order); gpt2 models trained on a compact vocabulary
 * gpt2_ids (the GPT-2 id of each compact id but the last, which stands for
 * every id unseen in training) and tokenizer (the GGUF GPT-2 vocabulary used
 * in training). Checkpoints written before these keys existed are refused
 * with a message.
 *
 * The model's vocabulary as the engine and GGUF see it: a char model's
 * characters; a gpt2 model always has the 50257 GPT-2 ids. A compact model
 * is widened: each seen id keeps its trained embedding row, every unseen id
 * takes the row of the token that stood for all of them in training, and an
 * untied output head gives the unseen ids an equal share of that token's
 * probability (kn__kgpt_wout), so the model's distribution is unchanged.
 */
#ifndef KN_MODEL_CKPT_H
#define KN_MODEL_CKPT_H
#include "kiln_llm.h"
#include "formats/gguf_write.h"    /* defines: kn_gguf_writer */
#include "formats/safetensors.h"   /* defines: kn_safetensors */

typedef struct kn__kgpt {
    kn_safetensors *st;
    bool is_char;
    int64_t V, L, C, H, T;     /* the checkpoint's vocabulary, layers, width, heads, context */
    int64_t n_vocab;           /* as the engine and GGUF see it (see above)                   */
    uint32_t *chars;           /* char: V code points                                         */
    int32_t *orig;             /* gpt2 compact: V - 1 GPT-2 ids; NULL: the full vocabulary    */
    char tok_path[4096];       /* gpt2: the vocabulary recorded at training ("" none)         */
} kn__kgpt;

/* Whether path is a safetensors file whose metadata says it is a kiln
 * training checkpoint of a GPT (char-gpt or gpt2). */
bool kn__is_kiln_gpt_ckpt(const char *path);
kn_status kn__kgpt_open(const char *path, kn__kgpt *k);
void kn__kgpt_close(kn__kgpt *k);
/* The f32 data of parameter name, checked to be [d0] (d1 = 0) or [d0, d1]. */
const float *kn__kgpt_param(const kn__kgpt *k, const char *name, int64_t d0, int64_t d1);
/* The embedding [n_vocab, C] (expanded for a compact model), malloc'd. */
kn_status kn__kgpt_wte(const kn__kgpt *k, float **out);
/* The output head [n_vocab, C] of a compact gpt2 model, malloc'd (*out NULL
 * for the others, whose head is the embedding): see model_ckpt.c. */
kn_status kn__kgpt_wout(const kn__kgpt *k, float **out);
/* Adds the tokenizer.* keys of the model's vocabulary to w: a "gpt2"-type
 * (byte-level BPE) vocabulary. char: one token per character, no merges
 * (ASCII vocabularies only); gpt2: the GPT-2 tokens and merges from the
 * GGUF vocabulary tok_path (NULL: the one recorded in the checkpoint). */
kn_status kn__kgpt_add_tokenizer(const kn__kgpt *k, const char *tok_path, kn_gguf_writer *w);

/* `kiln info` of such a checkpoint: kind, step, shape, vocabulary. */
kn_status kn__print_info_kiln_ckpt(const char *path, void *FILE_ptr);

/* kn_model_load's loader (model_impl.h's struct). */
struct kn_model;
kn_status kn__load_kiln_ckpt(struct kn_model *m, const char *path, const char *tok_path);
#endif
