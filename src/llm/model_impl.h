/* model_impl.h: the kn_model struct shared by the model loaders (model.c:
 * GGUF and llama2.c; model_hf.c: llm.c GPT-2 and Hugging Face safetensors)
 * and the forward graph (model.c). Internal header (src/).
 *
 * Letters: C model width, H query heads, Hkv key/value heads, D head dim,
 * F ffn width, V vocab, P learned positions (GPT-2).
 *
 * Every weight matrix is held as W [out, in] (rows are output features), the
 * way the graph multiplies x · W^T; a loader whose file stores [in, out]
 * (HF GPT-2 Conv1D) hands over a transposed view or a transposed copy.
 * Vectors (norm gains, biases) and GPT-2 position embeddings are f32.
 *
 * On a device backend the loaders still fill a host context (hctx, the file
 * wrapped in place); model.c then uploads the weights into ctx in the chosen
 * dtype (optionally stacking wq|wk|wv and w1|w3), keeps tok_embd on the host
 * for the embedding lookup of quantized tables (an f32/f16/bf16 table also
 * gets a device copy the graph gathers from, embd_dev, unless
 * KN_LLM_DEVICE_EMBED=0), and stages
 * the graph inputs and logits through host buffers.
 */
#ifndef KN_MODEL_IMPL_H
#define KN_MODEL_IMPL_H
#include "kiln_llm.h"
#include "formats/gguf.h"        /* defines: kn_gguf */
#include "formats/llama2c.h"     /* defines: kn_llama2c */
#include "formats/llmc_gpt2.h"   /* defines: kn_llmc_gpt2 */
#include "formats/safetensors.h" /* defines: kn_safetensors */

typedef struct {
    kn_tensor *attn_norm, *attn_norm_b;   /* [C]; bias: GPT-2 LayerNorm, else NULL    */
    kn_tensor *wq, *wk, *wv;              /* [H*D, C], [Hkv*D, C] x2; NULL when fused  */
    kn_tensor *bq, *bk, *bv;              /* optional biases (Qwen2)                  */
    kn_tensor *q_norm, *k_norm;           /* [D] per-head RMS norm gains (Qwen3), NULL */
    kn_tensor *wqkv, *bqkv;               /* fused [QD + 2 KD, C] (q, k, v rows): GPT-2,
                                             Phi-3, stacked on a device or by model_fuse.c */
    kn_tensor *wo, *bo;                   /* [C, H*D], [C] or NULL                    */
    kn_tensor *ffn_norm, *ffn_norm_b;     /* [C]                                      */
    kn_tensor *w1, *b1;                   /* [F, C]: Llama gate, GPT-2 fc; bias       */
    kn_tensor *w2, *b2;                   /* [C, F]: down / proj; bias                */
    kn_tensor *w3;                        /* [F, C]: Llama up; NULL for GPT-2         */
    kn_tensor *w13;                       /* [2F, C]: w1 and w3 stacked (device, model_fuse.c) */
    kn_tensor *k_cache, *v_cache;         /* [Hkv, n_ctx, D] f32 or f16               */
    /* mixture of experts (model_moe.c; NULL in a dense layer). Letters: E experts,
     * Fe an expert's width, Fs the shared expert's. The stacked matrices are
     * 2-D here (the device upload takes them as matrices) and viewed as
     * [E, Fe, C] / [E, C, Fe] by the graph. */
    kn_tensor *gate_inp;                  /* [E, C] router                             */
    kn_tensor *gate_exps, *up_exps;       /* [E*Fe, C] each expert's gate / up rows     */
    kn_tensor *down_exps;                 /* [E*C, Fe]                                 */
    kn_tensor *gate_shexp, *up_shexp;     /* [Fs, C] shared expert (Qwen2-MoE) or NULL */
    kn_tensor *down_shexp;                /* [C, Fs]                                   */
    kn_tensor *gate_inp_shexp;            /* [C] f32: the shared expert's sigmoid gate */
    kn_tensor *attn_post_norm, *ffn_post_norm; /* [C] Gemma: norms of the attention and
                                             MLP outputs before the residual add, NULL */
} kn__layer_w;

struct kn_model {
    kn_model_config cfg;
    kn_ctx *ctx;                       /* weights, caches and the graph */
    kn_ctx *hctx;                      /* device runs: the file's weights on the host
                                          (loaders fill it); NULL on a host backend */
    bool on_device;                    /* ctx's backend is not a host backend */
    kn_dtype dev_wdt;                  /* device runs: dtype of the uploaded matrices */
    bool keep_file;                    /* device runs, KN_WEIGHTS_FILE: matrices keep the
                                          file's dtype where the device takes it
                                          (quantized blocks raw), else dev_wdt */
    bool cast_prefill;                 /* device runs (KN_LLM_PREFILL_CAST=0: off): the prompt plan
                                          casts activations to a bf16/f16 weight's dtype (wgmma GEMMs,
                                          ~4x the mixed f32 x bf16 kernel's rate: an 8B-shaped pp512
                                          2.2x), as bf16 autocast does; the one-token step plan does
                                          not (its GEMVs are faster without the casts) */
    bool cast_acts;                    /* device runs, KN_LLM_GPU_CAST=1: activations cast to
                                          dev_wdt around each matmul in the graph (to
                                          compare with the mixed-precision kernels) */
    kn_gguf *gguf;
    kn_llama2c *l2c;
    kn_llmc_gpt2 *llmc;
    kn_safetensors *st;
    kn_tokenizer *tok;
    char *chat_template;
    kn_tensor *tok_embd;               /* [V, C] any dtype, a materialised leaf
                                          (always host memory: embed() reads it) */
    kn_tensor *pos_embd;               /* [P, C] f32 (GPT-2) or NULL            */
    kn_tensor *out_norm, *out_norm_b;  /* [C], [C] or NULL                      */
    kn_tensor *wout;                   /* [V, C]                                */
    kn_tensor *rope_ff;                /* [n_rot/2] f32 frequency divisors or NULL */
    kn__layer_w *layers;
    void **owned;                      /* converted / transposed copies         */
    int n_owned, cap_owned;
    int n_ctx, n_batch;
    bool kv_f16;
    /* graph */
    int sym_T, sym_S, sym_R;
    kn_tensor *x_in, *pos_in, *rows_in, *logits;
    /* a device model with embd_dev: ids_in [n_batch] int32 replaces x_in
     * [n_batch, C] f32 as the token input, the graph gathering the rows */
    kn_tensor *embd_dev, *ids_in;
    kn_plan *plan;
    /* the one-token step (decode): the same layers over the first row of the
     * inputs with T = R = 1 fixed, so the compiler sees static shapes (the
     * attention output's transpose is a view, no copy); NULL when absent */
    kn_tensor *logits1;
    kn_plan *plan1;
    /* device runs with KN_LLM_TOP=1: a third forward of one token whose
     * outputs are the KN_MODEL_TOP_MAX best ids and their logits (TOPK on
     * the device), for kn_model_eval_top; NULL when absent */
    kn_tensor *top_ids1, *top_vals1;
    kn_plan *plan1_top;
    float *top_logits;                 /* [n_vocab] host scratch of kn_model_eval_top's host path */
    int32_t *top_scratch;              /* [n_vocab] */
    float *row_buf;                    /* one dequantized embedding row */
    float *x_stage;                    /* device runs: host copies of the inputs */
    int32_t *pos_stage, *rows_stage;   /* [n_batch, C], [n_batch], [n_batch]  */
    uint64_t n_evals;                  /* kn_model_eval calls so far (kv reuse records) */
    uint8_t *layer_swa;                /* [n_layers] 1 = sliding-window layer, or NULL */
    const float *rope_ff_short, *rope_ff_long;  /* Phi-3 LongRoPE divisors [n_rot/2]: */
    int rope_orig_ctx;                 /* the long ones when n_ctx > rope_orig_ctx   */
    double rope_mscale;                /* LongRoPE attention factor                  */
    kn_tensor *rope_mag;               /* [D] f32: the factor on the rotated dims, 1 on the
                                          others (partial rotary with LongRoPE), or NULL */
    void *kv_map;                      /* host backends: the caches' lazy mapping */
    kn_dist *tp;                       /* tensor parallel (model_tp.c): this rank's communicator, */
    int tp_world;                      /* the rank count (0 or 1: the whole model here)          */
    size_t kv_map_bytes;
};

/* model_tp.c: keep rank kn_dist_rank(d)'s share of every layer's heads and
 * FFN columns and of the output head's rows (a world of one: nothing
 * changes); sets m->tp, m->tp_world. */
kn_status kn__model_tp_split(kn_model *m, kn_dist *d);

/* ---- model.c: the forward graph, shared with the batched engine (batch*.c) ---- */
/* The inputs of a forward whose rows belong to several sequences, attending
 * through a paged KV pool instead of the single-sequence caches. */
typedef struct kn__paged {
    kn_tensor **k_pool, **v_pool;      /* per layer [Hkv, n_blocks * block_size, D], f32 or f16 (kv_f16) */
    kn_tensor *slot;                   /* [T] i32: pool row each new K/V row is written to */
    kn_tensor *row_seq;                /* [T] i32: the sequence (block table row) of each row */
    kn_tensor *block_table;            /* [n_seq, max_blocks] i32 */
    int block_size;
} kn__paged;
/* The whole forward over x [T, C] at positions pos [T]: logits [R, V] of the
 * rows [R]; pg NULL: the model's own caches (kn_model_eval's graph). */
kn_tensor *kn__model_forward(kn_model *m, kn_tensor *x, kn_tensor *pos, kn_tensor *rows, const kn__paged *pg, kn_status *st);
/* x [n, C] f32 = the embeddings of tokens (KN_ERR_INVALID for an id outside the vocabulary). */
kn_status kn__model_embed(kn_model *m, const int32_t *tokens, int n, float *x);
/* x [n, C] f32: the rows of ids [n] (int32, in the model's context) gathered
 * from the device token table m->embd_dev (set by a device load where the
 * table is f32/f16/bf16, unless KN_LLM_DEVICE_EMBED=0), widened as
 * kn__model_embed widens them */
kn_tensor *kn__model_token_rows(kn_model *m, kn_tensor *ids);
/* batch_graph.c: one layer's attention through the pool: q [H, T, D] (after
 * rope), k, v [Hkv, T, D] written at pg->slot, out [T, H, D]. */
kn_tensor *kn__paged_attend(kn_model *m, int layer, kn_tensor *q, kn_tensor *k, kn_tensor *v, kn_tensor *pos, const kn__paged *pg);
/* model_weights.c: zeroed host memory committed page by page as it is
 * written (an anonymous mapping); NULL when out of memory. */
void *kn__lazy_alloc(size_t bytes);
void kn__lazy_free(void *p, size_t bytes);     /* NULL is a no-op */

/* ---- model_weights.c: helpers every loader shares ---- */
/* Memory freed with the model (zeroed); NULL + error when out of memory. */
void *kn__model_alloc(kn_model *m, size_t bytes);
/* File data wrapped in place as a [rows, cols] tensor ([cols] when rows is 1). */
kn_tensor *kn__model_wrap(kn_model *m, kn_dtype dt, int64_t rows, int64_t cols, const void *data, const char *name);
/* model_fuse.c: on the host, q|k|v and gate|up stacked per layer (small models) */
kn_status kn__model_fuse_host(kn_model *m);
/* Element i of f32/f16/bf16 data. */
double kn__model_elem_f64(kn_dtype dt, const void *data, int64_t i);
static inline bool kn__model_half_or_f32(kn_dtype dt) { return dt == KN_F32 || dt == KN_F16 || dt == KN_BF16; }
/* safetensors: u64 little-endian header length (< 4 GB: high bytes zero), then '{' */
static inline bool kn__is_safetensors_magic(const unsigned char mg[12], size_t got) {
    return got >= 9 && !mg[4] && !mg[5] && !mg[6] && !mg[7] && mg[8] == '{';
}
/* The first 12 bytes of a regular file (zeros past its end). On failure the
 * message names `what` and the system's reason; errno is that reason. */
kn_status kn__model_file_magic(const char *path, const char *what, unsigned char mg[12], size_t *got);
/* model.c: how many kn_model_eval calls m has run (the KV cache's version). */
uint64_t kn__model_eval_count(const kn_model *m);
/* sampler.c: the k best of logits[0..V) best first, equal logits lower id
 * first (scratch: V ids) */
void kn__top_select(const float *logits, int V, int k, int32_t *scratch, int32_t *ids, float *vals);
/* Weight matrix W [out, in] from file data of dtype dt. in_out: the file
 * stores [in, out] (Conv1D). Misaligned data is copied; f16/bf16 [in, out]
 * data is copied transposed (the CPU fast paths want rows of `in`). */
kn_tensor *kn__model_mat(kn_model *m, kn_dtype dt, int64_t out, int64_t in, const void *data, bool in_out,
                         const char *name);
/* f32 vector [n] (rows = 0: gains, biases) or f32 matrix [rows, n] from
 * f32/f16/bf16 data (copied unless f32 and aligned). */
kn_tensor *kn__model_f32(kn_model *m, kn_dtype dt, int64_t rows, int64_t n, const void *data, const char *name);
/* Sets the error "prefix: <previous message>" (copied first) and returns st. */
kn_status kn__model_err_prefix(kn_status st, const char *prefix);
/* Tokenizer from a file: Hugging Face tokenizer.json (or the directory
 * holding it, with tokenizer_config.json), GGUF vocabulary, llm.c
 * gpt2_tokenizer.bin (decode only) or llama2.c tokenizer.bin; checked against
 * the model's vocabulary. kn__model_load_hf_tokenizer: the first kind alone
 * (also takes the chat template when the model has none), unchecked. */
kn_status kn__model_load_tokenizer(kn_model *m, const char *path);
kn_status kn__model_load_hf_tokenizer(kn_model *m, const char *path_or_dir);

/* model_moe.c: the mixture-of-experts FFN over h [T, C] -> [T, C] (router
 * softmax, top-k, experts through mul_mat_id, shared expert); the GGUF
 * expert tensors and keys of layer l (blk.l.ffn_gate_inp present); the
 * Hugging Face ones (prefix "model.layers.l.mlp." or ".block_sparse_moe.") */
kn_tensor *kn__moe_ffn(kn_model *m, const kn__layer_w *L, kn_tensor *h);
kn_status kn__moe_gguf_layer(kn_model *m, int l, const char *arch);
void kn__moe_print_info(const kn_gguf *g, void *FILE_ptr);
/* the data of tensor `name`, file shape [rows, cols] ([cols] when rows is 1)
 * and dtype *dt; NULL with *st set when it is missing (and required) or wrong */
typedef const void *(*kn__moe_get_fn)(void *ud, const char *name, int64_t rows, int64_t cols, bool required, kn_dtype *dt,
                                      kn_status *st);
kn_status kn__moe_hf_layer(kn_model *m, int l, const char *prefix, const char *expert_fmt, kn__moe_get_fn get, void *ud);

/* model_hf.c */
kn_status kn__load_llmc_gpt2(kn_model *m, const char *path, const char *tok_path);
kn_status kn__load_hf(kn_model *m, const char *path, const char *tok_path);
kn_status kn__print_info_llmc(const char *path, void *FILE_ptr);
kn_status kn__print_info_hf(const char *path, void *FILE_ptr);
bool kn__is_dir(const char *path);

/* model_arch.c: Mistral, Gemma 2/3, Phi-3 (what they add to the Llama blocks).
 * Config: from config.json (after hf_llama's common fields; *rope_done: it
 * set the rope itself) or GGUF metadata (after load_gguf's); then, once
 * n_ctx is known, kn__arch_finish picks LongRoPE's factors. */
struct kn_json;
kn_status kn__hf_arch_config(kn_model *m, const struct kn_json *j, const char *cfgp, bool *rope_done);
kn_status kn__gguf_arch_config(kn_model *m, const char *arch, const char *path);
kn_status kn__arch_finish(kn_model *m);
/* Gemma3ForConditionalGeneration's config.json -> a config of its language
 * model alone (text_config, with Gemma3TextConfig's defaults for what it
 * leaves out, as Google's files do), parsed into *out. */
kn_status kn__hf_gemma3_text_config(const struct kn_json *j, const char *cfgp, struct kn_json **out);
/* Gemma's RMS norms scale by (1 + w): Hugging Face stores w, GGUF 1 + w. */
kn_tensor *kn__arch_gain_plus1(kn_model *m, kn_tensor *w);
/* graph pieces (build_forward): NULL in, NULL out */
kn_tensor *kn__arch_embed(kn_model *m, kn_tensor *x);                    /* Gemma: x sqrt(C)        */
kn_tensor *kn__arch_rope(kn_model *m, int layer, kn_tensor *x, kn_tensor *pos); /* the layer's rope */
kn_tensor *kn__arch_attn(kn_model *m, int layer, kn_tensor *q, kn_tensor *k, kn_tensor *v); /* sdpa */
bool kn__arch_attn_plain(const kn_model *m, int layer);   /* no sliding window, no softcap */
int kn__arch_window(const kn_model *m, int layer);                     /* the layer's window, 0 = none */
kn_tensor *kn__arch_post_norm(kn_model *m, kn_tensor *x, kn_tensor *w);  /* Gemma; w NULL: x      */
kn_tensor *kn__arch_gate_act(kn_model *m, kn_tensor *x);                 /* silu, Gemma gelu_tanh */
kn_tensor *kn__arch_logits(kn_model *m, kn_tensor *logits);              /* final softcap          */
/* One line of what kiln runs (kiln info): architecture, shapes, rope, window, caps. */
void kn__arch_describe(const kn_model *m, char *buf, size_t n);

/* rope_scaling.c: frequency divisors ff[n_rot/2] for kn_rope_ff. Llama 3
 * (factor, low/high_freq_factor, original context); YaRN (factor, original
 * context, beta_fast/slow), returning the attention mscale (logits scale by
 * its square). */
void kn__rope_ff_llama3(float *ff, int n_rot, double theta, double factor, double low_freq_factor,
                        double high_freq_factor, double orig_ctx);
double kn__rope_ff_yarn(float *ff, int n_rot, double theta, double factor, double orig_ctx, double beta_fast,
                        double beta_slow);
/* Installs divisors ff [n_rot/2] (kept alive by the model) as m->rope_ff;
 * mscale != 1 scales the attention logits by its square (cfg.attn_scale). */
kn_status kn__model_set_rope_ff(kn_model *m, const float *ff, double mscale);
#endif
