/* llama2c.h: read llama2.c model checkpoints (Karpathy's run.c / runq.c).
 *
 * Three layouts, told apart by the first 4 bytes:
 *  - legacy (export version 0): 7 int32 header {dim, hidden_dim, n_layers,
 *    n_heads, n_kv_heads, vocab_size, seq_len}; vocab_size < 0 means the
 *    classifier is NOT shared with the embedding. Then fp32 weights in run.c
 *    order: token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3,
 *    rms_final, freq_cis_real, freq_cis_imag (seq_len*head_size/2 each; skipped
 *    here), [wcls].
 *  - version 1 (magic "ak42" = 0x616b3432): 256-byte header {magic, version,
 *    the 7 ints, u8 shared_classifier}; fp32 weights: rms_att, rms_ffn,
 *    rms_final, token_embedding, wq, wk, wv, wo, w1, w2, w3, [wcls].
 *  - version 2: same header plus int32 group_size at byte 37; fp32 rms_att,
 *    rms_ffn, rms_final, then each matrix (token_embedding, wq.., w3, [wcls])
 *    per layer as int8 values followed by fp32 scales, one per group_size
 *    consecutive values (value = q * scale; runq.c's Q8_0, not ggml's).
 * The file size must match the header exactly. Weights are NOT copied: the
 * pointers point into the mapping (or the caller's memory for open_memory,
 * which must be 4-byte aligned). Shapes are row-major: rows x cols with cols
 * contiguous, as y = W x with W[out][in]. Non-goals: writing these files.
 *
 *   kn_llama2c *m;
 *   if (kn_llama2c_open("stories260K.bin", &m) != KN_OK) return fail(kn_last_error());
 *   const kn_llama2c_config *c = kn_llama2c_config_of(m);
 *   const float *wq0 = kn_llama2c_layer(m, KN_L2C_WQ, 0, NULL);   // c->dim x c->dim
 *   kn_llama2c_close(m);
 */
#ifndef KN_LLAMA2C_H
#define KN_LLAMA2C_H
#include "kiln_base.h"

#define KN_LLAMA2C_MAGIC 0x616b3432u   /* "ak42" read as a little-endian u32 */

typedef struct kn_llama2c_config {
    int dim;            /* transformer width                                  */
    int hidden_dim;     /* FFN width                                          */
    int n_layers;
    int n_heads;
    int n_kv_heads;     /* divides n_heads (grouped-query attention)          */
    int vocab_size;     /* always positive here                               */
    int seq_len;        /* max context                                        */
    int head_size;      /* dim / n_heads                                      */
    int kv_dim;         /* dim * n_kv_heads / n_heads                         */
    bool shared_classifier;  /* wcls is the token embedding                   */
    int version;        /* 0 legacy, 1 fp32, 2 int8 groups                    */
    int group_size;     /* version 2 only, else 0                             */
} kn_llama2c_config;

typedef enum kn_llama2c_wid {
    KN_L2C_TOKEN_EMBEDDING = 0, /* [vocab_size, dim]                             */
    KN_L2C_RMS_ATT,             /* per layer [dim]                               */
    KN_L2C_WQ,                  /* per layer [dim, dim]                          */
    KN_L2C_WK,                  /* per layer [kv_dim, dim]                       */
    KN_L2C_WV,                  /* per layer [kv_dim, dim]                       */
    KN_L2C_WO,                  /* per layer [dim, dim]                          */
    KN_L2C_RMS_FFN,             /* per layer [dim]                               */
    KN_L2C_W1,                  /* per layer [hidden_dim, dim]  (gate)           */
    KN_L2C_W2,                  /* per layer [dim, hidden_dim]  (down)           */
    KN_L2C_W3,                  /* per layer [hidden_dim, dim]  (up)             */
    KN_L2C_RMS_FINAL,           /* [dim]                                         */
    KN_L2C_WCLS,                /* [vocab_size, dim]; == token embedding if shared */
    KN_L2C_COUNT
} kn_llama2c_wid;

typedef struct kn_llama2c_weight {
    const char *name;       /* "token_embedding", "wq", ...                      */
    kn_dtype dtype;         /* KN_F32, or KN_I8 for version-2 matrices             */
    int n_layers;           /* copies (n_layers for per-layer weights, else 1)     */
    int64_t rows, cols;     /* per copy; vectors have rows = 1                     */
    const void *data;       /* copy 0                                              */
    const float *scales;    /* KN_I8 only: copy 0's rows*cols/group_size scales    */
    size_t layer_stride;    /* bytes from copy l to l+1, for data and scales       */
    size_t nbytes;          /* bytes of one copy's values (not the scales)         */
} kn_llama2c_weight;

typedef struct kn_llama2c kn_llama2c;

kn_status kn_llama2c_open(const char *path, kn_llama2c **out);
kn_status kn_llama2c_open_memory(const void *data, size_t size, kn_llama2c **out);
void kn_llama2c_close(kn_llama2c *m);                   /* NULL is a no-op */

const kn_llama2c_config *kn_llama2c_config_of(const kn_llama2c *m);
const kn_llama2c_weight *kn_llama2c_weight_of(const kn_llama2c *m, kn_llama2c_wid w);
/* Data of copy `layer` (0 for global weights); NULL when out of range. When
 * scales is non-NULL it receives the scales (NULL for fp32 weights). */
const void *kn_llama2c_layer(const kn_llama2c *m, kn_llama2c_wid w, int layer, const float **scales);
#endif
