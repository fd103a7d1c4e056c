/* llmc_gpt2.h: read and write llm.c GPT-2 checkpoints (gpt2_124M.bin style).
 *
 * Layout: 256 int32 header {20240326, version, maxT, V, L, NH, C, Vp, 0...}
 * (version 3 = fp32 params, version 5 = bf16), then the 16 parameter tensors,
 * contiguous, in llm.c's order (dims: T = max sequence length maxT, V = vocab,
 * Vp = vocab padded (e.g. to a multiple of 128), L = layers, NH = heads,
 * C = channels):
 *   wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C)
 *   attprojw (L,C,C) attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C)
 *   fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C) lnfw (C) lnfb (C)
 * The file size must match exactly. Reading maps the file; the parameter
 * pointers point into it. Writing takes 16 pointers or one flat buffer.
 *
 *   kn_llmc_gpt2 *m;
 *   if (kn_llmc_gpt2_open("gpt2_124M.bin", &m) != KN_OK) return fail(kn_last_error());
 *   const kn_llmc_gpt2_config *c = kn_llmc_gpt2_config_of(m);
 *   const float *wte = kn_llmc_gpt2_param(m, KN_GPT2_WTE)->data;   // fp32 when c->dtype == KN_F32
 *   kn_llmc_gpt2_close(m);
 */
#ifndef KN_LLMC_GPT2_H
#define KN_LLMC_GPT2_H
#include "kiln_base.h"

#define KN_LLMC_GPT2_MAGIC 20240326
#define KN_LLMC_GPT2_HEADER_INTS 256

typedef struct kn_llmc_gpt2_config {
    int max_seq_len;     /* maxT                                   */
    int vocab_size;      /* V                                      */
    int padded_vocab_size; /* Vp >= V                              */
    int n_layers;        /* L                                      */
    int n_heads;         /* NH, divides C                          */
    int channels;        /* C                                      */
} kn_llmc_gpt2_config;

typedef enum kn_gpt2_param {
    KN_GPT2_WTE = 0, KN_GPT2_WPE, KN_GPT2_LN1W, KN_GPT2_LN1B, KN_GPT2_QKVW, KN_GPT2_QKVB,
    KN_GPT2_ATTPROJW, KN_GPT2_ATTPROJB, KN_GPT2_LN2W, KN_GPT2_LN2B, KN_GPT2_FCW, KN_GPT2_FCB,
    KN_GPT2_FCPROJW, KN_GPT2_FCPROJB, KN_GPT2_LNFW, KN_GPT2_LNFB, KN_GPT2_NPARAMS
} kn_gpt2_param;

typedef struct kn_llmc_gpt2_tensor {
    const char *name;       /* "wte", "qkvw", ...                               */
    int ndim;               /* 1..3                                             */
    int64_t shape[3];       /* row-major                                        */
    int64_t numel;
    const void *data;       /* into the mapping; dtype of the file              */
    size_t nbytes;
} kn_llmc_gpt2_tensor;

typedef struct kn_llmc_gpt2 kn_llmc_gpt2;

/* Shapes and element counts implied by a config (validated: all positive,
 * NH divides C, Vp >= V, no overflow). numel may be NULL. */
kn_status kn_llmc_gpt2_shapes(const kn_llmc_gpt2_config *c, kn_llmc_gpt2_tensor out[KN_GPT2_NPARAMS],
                              int64_t *numel);

kn_status kn_llmc_gpt2_open(const char *path, kn_llmc_gpt2 **out);
/* Same over caller memory (not copied; 4-byte aligned; must outlive the handle). */
kn_status kn_llmc_gpt2_open_memory(const void *data, size_t size, kn_llmc_gpt2 **out);
void kn_llmc_gpt2_close(kn_llmc_gpt2 *m);                     /* NULL is a no-op */
const kn_llmc_gpt2_config *kn_llmc_gpt2_config_of(const kn_llmc_gpt2 *m);
kn_dtype kn_llmc_gpt2_dtype(const kn_llmc_gpt2 *m);           /* KN_F32 or KN_BF16 */
const kn_llmc_gpt2_tensor *kn_llmc_gpt2_param(const kn_llmc_gpt2 *m, kn_gpt2_param p);
int64_t kn_llmc_gpt2_numel(const kn_llmc_gpt2 *m);            /* all params */

/* Write a checkpoint (atomically via path.tmp). dtype KN_F32 (version 3) or
 * KN_BF16 (version 5); params[p] holds the row-major values of parameter p in
 * that dtype (bf16 as raw uint16). The _flat form takes all parameters
 * back to back, as llm.c keeps them. */
kn_status kn_llmc_gpt2_write(const char *path, const kn_llmc_gpt2_config *c, kn_dtype dtype,
                             const void *const params[KN_GPT2_NPARAMS]);
kn_status kn_llmc_gpt2_write_flat(const char *path, const kn_llmc_gpt2_config *c, kn_dtype dtype,
                                  const void *params);
#endif
