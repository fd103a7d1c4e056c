/* kiln_llm.h: LLM inference: load a model file, tokenize, evaluate, sample,
 * generate with a per-token callback.
 *
 *   kn_model *m;
 *   if (kn_model_load("SmolLM2-135M-Instruct.Q4_1.gguf", NULL, &m)) { puts(kn_last_error()); return 1; }
 *   kn_generate_params gp = kn_generate_defaults();
 *   gp.max_tokens = 64; gp.sampling.temp = 0;          // greedy
 *   kn_generate(m, "Once upon a time", &gp, print_piece, NULL, NULL);
 *   kn_model_free(m);
 *
 * Formats: GGUF v2/v3 (architectures llama (Llama 2/3, SmolLM, TinyLlama,
 * Mistral, Mixtral), qwen2, qwen3, qwen2moe, qwen3moe, olmoe, gemma2,
 * gemma3, phi3, gpt2; tensor types F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
 * Q4_K/Q5_K/Q6_K, used in place from the memory map), llama2.c checkpoints
 * (with a tokenizer file), llm.c GPT-2 checkpoints (fp32/bf16) and Hugging
 * Face safetensors with config.json (a model directory or a .safetensors
 * path; the same families as kn_arch below, F32/F16/BF16; tokenizer.json
 * and the chat template are read from the directory), and the checkpoints
 * `kiln train char` and `kiln train gpt2` write (a kiln .safetensors
 * checkpoint; the tokenizer is rebuilt from its metadata: a char model's
 * characters, or the GPT-2 vocabulary file recorded at training, replaced
 * by tokenizer_path when given). llm.c files and Hugging Face directories
 * without tokenizer.json carry no
 * usable tokenizer: pass tokenizer_path (a GGUF vocabulary such as
 * ggml-vocab-gpt-2.gguf, or a llama2.c tokenizer.bin); without one the model
 * evaluates token ids but cannot encode text.
 * The forward pass is one kiln plan built at load (symbolic token count and
 * context length) and replayed for every prefill and decode step.
 *
 * On a GPU (a build with `make CUDA=1`):
 *   kn_model_opts o = {.backend = kn_backend_cuda(), .weight_dtype = KN_WEIGHTS_BF16};
 *   kn_model_load("SmolLM2-135M-Instruct.Q4_1.gguf", &o, &m);
 * uploads every weight matrix in weight_dtype (quantized blocks dequantized
 * on the host, a block of rows at a time; KN_WEIGHTS_FILE keeps them as
 * stored); the graph runs on the device and
 * only token ids (the rows gathered on the device from a copy of an
 * f32/f16/bf16 table; a quantized table, or KN_LLM_DEVICE_EMBED=0, looks the
 * rows up on the host and copies them in), positions and the wanted logits
 * cross the bus.
 */
#ifndef KILN_LLM_H
#define KILN_LLM_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln.h"
#include "kiln_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_model kn_model;

/* QWEN2: Llama with q/k/v biases; QWEN3: Llama with an RMS norm over each
 * head's q and k (q_norm, k_norm [head_dim]) before rope. Both rotate halves.
 * MISTRAL: Llama with a sliding window on every layer; GEMMA2: embeddings
 * times sqrt(dim), RMS norms before and after attention and MLP, GeGLU
 * (gelu_tanh gate), attention and final logit soft-capping, sliding-window
 * and global layers alternating; GEMMA3: Gemma 2 with q/k norms, no caps by
 * default, five local layers a global one, a rope base per layer type;
 * PHI3: Llama with fused qkv and gate|up matrices, LongRoPE, partial rotary
 * (model_arch.c).
 * Mixtures of experts (n_expert > 0; the FFN routes each token to
 * n_expert_used of n_expert SwiGLU experts): MIXTRAL (Llama attention),
 * QWEN2MOE (Qwen2 attention, plus a shared expert behind a sigmoid gate),
 * QWEN3MOE (Qwen3 attention), OLMOE (RMS norms over the whole q and k
 * projections, [H*D] and [Hkv*D]). */
typedef enum {
    KN_ARCH_LLAMA = 0, KN_ARCH_GPT2 = 1, KN_ARCH_QWEN2 = 2, KN_ARCH_QWEN3 = 3,
    KN_ARCH_MISTRAL = 4, KN_ARCH_GEMMA2 = 5, KN_ARCH_GEMMA3 = 6, KN_ARCH_PHI3 = 7,
    KN_ARCH_MIXTRAL = 8, KN_ARCH_QWEN2MOE = 9, KN_ARCH_QWEN3MOE = 10, KN_ARCH_OLMOE = 11
} kn_arch;

typedef struct kn_model_config {
    kn_arch arch;
    int n_vocab, n_ctx_train, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim;
    int n_rot;              /* rotated dims per head                     */
    double rope_theta, rope_freq_scale, norm_eps;
    bool rope_neox;         /* rotate halves (true) or interleaved pairs */
    char rope_scaling[16];  /* "", "linear", "llama3", "yarn", "longrope"  */
    double attn_scale;      /* sdpa logit scale; 0 = 1/sqrt(head_dim)    */
                            /* GPT-2: no rope (n_rot 0), learned positions, LayerNorm */
    bool tied_output;       /* output matrix is the token embedding      */
    kn_dtype weight_type;   /* dtype of most matrices in the file        */
    int64_t n_params;
    char name[128];
    /* Mistral, Gemma 2/3, Phi-3 (0 = off each) */
    int sliding_window;     /* a windowed layer's query at position i sees keys
                               i - sliding_window < j <= i (transformers' rule)  */
    double attn_softcap;    /* attention scores s -> c tanh(s / c)             */
    double final_softcap;   /* output logits, the same                         */
    double embd_scale;      /* token embeddings times this (Gemma: sqrt(dim))  */
    double rope_theta_local;/* rope base of the windowed layers (Gemma 3)      */
    kn_dtype run_weight_type; /* what the matmuls read: weight_type on a host
                                 backend, the weight_dtype chosen on a device
                                 (KN_WEIGHTS_FILE: weight_type, or bf16 where
                                 the GPU does not decode that type) */
    /* mixture of experts (0 experts: a dense FFN of ffn_dim) */
    int n_expert, n_expert_used;   /* experts per MoE layer, experts a token uses  */
    int expert_ffn_dim;            /* each expert's hidden width                    */
    int shared_ffn_dim;            /* the shared expert's (Qwen2-MoE), 0 = none     */
    bool expert_norm;              /* the chosen experts' weights renormalised to 1 */
} kn_model_config;

/* Weight matrices on a device backend. AUTO: bf16 on a device; on a host
 * backend the file's weights are used in place (the only choice there).
 * FILE: each matrix as the file stores it: quantized blocks the GPU decodes
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) uploaded raw and
 * multiplied by kernels that dequantize in registers (a decode step reads
 * ~4.5-8.5 bits a weight instead of 16), f32/f16/bf16 matrices as they are,
 * other quantized types (Q2_K, Q3_K, ...) as bf16. Prefill (more than 8 rows)
 * expands each quantized matrix to bf16 scratch per matmul, so it rounds as
 * BF16 does and is slower than BF16 (docs/PERF.md). */
typedef enum kn_weight_dtype {
    KN_WEIGHTS_AUTO = 0, KN_WEIGHTS_BF16, KN_WEIGHTS_F16, KN_WEIGHTS_F32, KN_WEIGHTS_FILE
} kn_weight_dtype;

typedef struct kn_model_opts {
    /* tokenizer file (like llama2.c's -z): a GGUF vocabulary (*.gguf), a
     * llama2.c tokenizer.bin, or llm.c's gpt2_tokenizer.bin (decode only:
     * encoding fails with a message). Needed by llama2.c, llm.c and Hugging
     * Face models; for a GGUF model it replaces the file's vocabulary. */
    const char *tokenizer_path;
    int n_ctx;                   /* context length; 0 = min(training context, 4096) */
    int n_batch;                 /* max tokens per forward (prefill chunk); 0 = 512 */
    kn_backend *backend;         /* NULL = default (KN_BACKEND=cuda picks the GPU) */
    bool kv_f16;                 /* K/V caches in f16 (half the memory; rounding of cached K, V) */
    /* Device backends only (backend->device != KN_DEVICE_HOST): the dtype of
     * the uploaded weight matrices (norms, biases and position tables stay
     * f32). bf16 and f16 halve the bytes each decode step reads; with them
     * the matmuls round their f32 activations to that dtype too (f16: range
     * +-65504), accumulating in f32. f32 reproduces the CPU's exact path.
     * FILE keeps the file's dtypes (see kn_weight_dtype). */
    kn_weight_dtype weight_dtype;
    /* Tensor parallel (kiln_dist.h): this process is one rank of the
     * communicator and keeps its share of every layer's attention heads and
     * FFN columns (weights, KV caches), with one all_reduce after each of the
     * two projections back to the residual stream; every rank computes the
     * same logits. Every rank loads the same file with the same options and
     * makes the same calls. Dense models (not GPT-2 or mixtures of experts)
     * whose head counts and FFN width the rank count divides. NULL or a
     * world of one: the whole model. */
    kn_dist *dist;
} kn_model_opts;

kn_status kn_model_load(const char *path, const kn_model_opts *opts, kn_model **out);
void kn_model_free(kn_model *m);                         /* NULL is a no-op */
const kn_model_config *kn_model_get_config(const kn_model *m);
const kn_tokenizer *kn_model_tokenizer(const kn_model *m);  /* NULL if none was loaded */
int kn_model_n_ctx(const kn_model *m);
kn_backend *kn_model_backend(const kn_model *m);        /* where the graph runs */
/* Run counts of the model's forward plan (kn_plan_get_stats): evaluations,
 * graph replays on a device (CUDA graphs), kernels of one plain run. */
void kn_model_plan_stats(const kn_model *m, kn_plan_stats *out);
/* Chat template from the model file (GGUF tokenizer.chat_template), or NULL. */
const char *kn_model_chat_template(const kn_model *m);
/* Print architecture, hyperparameters, tensors, tokenizer (for `kiln info`). */
kn_status kn_model_print_info(const char *path, void *FILE_ptr);

/* Write the GPT checkpoint of `kiln train char|gpt2` at ckpt_path as a GGUF
 * file (llama.cpp's "gpt2" architecture, f32, with its tokenizer) at
 * out_path, through out_path.tmp renamed at the end (a failed write, e.g. a
 * full disk, leaves no file and names the system's reason). tokenizer_path:
 * the GPT-2 vocabulary GGUF for gpt2 models (NULL: the one the checkpoint
 * records); ignored for char models, which must have an ASCII vocabulary.
 * A gpt2 model trained on a compact vocabulary is written with all 50257
 * GPT-2 ids and the same distribution: the ids unseen in training share the
 * probability of the token that stood for them (an untied output.weight). */
kn_status kn_model_export_gguf(const char *ckpt_path, const char *tokenizer_path, const char *out_path);

/* Evaluate tokens at positions n_past .. n_past+n-1 (the KV cache keeps
 * earlier positions). logits receives n_vocab floats for the last token, or
 * n * n_vocab when all_logits. Long inputs are split into n_batch chunks. */
kn_status kn_model_eval(kn_model *m, const int32_t *tokens, int n, int n_past, float *logits, bool all_logits);
/* As kn_model_eval, but only the k most likely next tokens (1 <= k <=
 * KN_MODEL_TOP_MAX, k <= n_vocab): ids and their logits, best first, equal
 * logits lower id first. On a GPU a one-token step selects them on the
 * device (the TOPK op in the step plan), so k ids and k floats come back
 * instead of n_vocab logits; elsewhere they are selected from the logits on
 * the host. */
#define KN_MODEL_TOP_MAX 64
kn_status kn_model_eval_top(kn_model *m, const int32_t *tokens, int n, int n_past, int k, int32_t *ids, float *logits);
/* Does kn_model_eval_top select a one-token step's candidates on the device
 * (a device model loaded with KN_LLM_TOP=1)? false: it selects from the
 * whole logits on the host. */
bool kn_model_top_on_device(const kn_model *m);

/* ---- sampling ---------------------------------------------------------------- */
typedef struct kn_sampler_params {
    float temp;              /* 0 = greedy                                          */
    int top_k;               /* 0 = off                                             */
    float top_p;             /* 1 = off                                             */
    float min_p;             /* 0 = off: drop tokens with p < min_p * p_max          */
    float repeat_penalty;    /* 1 = off (llama.cpp style: divide positive logits)   */
    float freq_penalty, presence_penalty;  /* 0 = off (OpenAI style)               */
    int penalty_last_n;      /* how many recent tokens the penalties see            */
    uint64_t seed;           /* the draws are a function of (seed, step): the same
                                seed, logits and parameters repeat a run        */
} kn_sampler_params;
/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off (repeat 1,
 * frequency and presence 0) over the last 64 tokens, seed 42: a fixed seed,
 * so a program that sets none repeats its runs (the kiln program draws a
 * random one unless --seed is given). */
kn_sampler_params kn_sampler_defaults(void);
typedef struct kn_sampler kn_sampler;
kn_sampler *kn_sampler_new(const kn_sampler_params *p);
void kn_sampler_free(kn_sampler *s);
/* Picks a token; logits (n_vocab) are modified in place. history: recent tokens. */
int32_t kn_sampler_sample(kn_sampler *s, float *logits, int n_vocab, const int32_t *history, int n_history);
/* Sampling from the best candidates alone (kn_model_eval_top: on a GPU only
 * they cross the bus). kn_sampler_top_ok: s needs no more than k_max (the
 * candidates there are: KN_MODEL_TOP_MAX, or n_vocab when smaller)
 * candidates to choose exactly as kn_sampler_sample would from all logits
 * (greedy, or top_k in 1..k_max, and no penalties, which read every logit);
 * kn_sampler_top_k: how many it needs (1 when greedy). kn_sampler_sample_top
 * takes k candidates best first (ids, logits; equal logits lower id first). */
bool kn_sampler_top_ok(const kn_sampler *s, int k_max);
int kn_sampler_top_k(const kn_sampler *s);
int32_t kn_sampler_sample_top(kn_sampler *s, const int32_t *ids, const float *logits, int k);

/* ---- generation ------------------------------------------------------------------- */
/* Called with each new token and its text (UTF-8 complete pieces only; may be
 * empty while a character is incomplete). Return false to stop. */
typedef bool (*kn_token_cb)(void *ud, int32_t token, const char *text, size_t len);
/* The tokens the model's KV cache holds (see kn_generate_params.reuse).
 * Start zeroed. It remembers which model and which evaluation it describes:
 * after any other evaluation of the model (kn_model_eval, a generation
 * without this record) or with another model it counts as empty. */
typedef struct kn_kv_tokens {
    int32_t *ids; int n, cap;
    const kn_model *model;       /* set by generation: the model it describes */
    uint64_t stamp;              /* that model's evaluation count at the time   */
} kn_kv_tokens;

/* Prefill progress (kn_generate_params.progress): called with done = 0
 * before the prompt is evaluated, then after each chunk of at most n_batch
 * tokens (kn_model_opts.n_batch) with the tokens evaluated so far, up to
 * done == total. Return false to cancel: the generation then returns KN_OK
 * at once with stats.cancelled set, nothing generated and the token callback
 * never called (the KV cache keeps the chunks already evaluated:
 * stats.n_past_end). */
typedef bool (*kn_progress_cb)(void *ud, int done, int total);

typedef struct kn_generate_params {
    int max_tokens;          /* new tokens; 0 = until end of generation or context */
    kn_sampler_params sampling;
    const char *const *stop; /* stop strings (not printed); each non-NULL and
                                non-empty, else KN_ERR_INVALID                      */
    int n_stop;
    bool add_bos;            /* default true (follows the tokenizer's rule)         */
    bool parse_special;      /* recognise <|im_start|> etc. in the prompt            */
    int n_past;              /* continue after this many cached tokens (chat)        */
    kn_kv_tokens *reuse;     /* non-NULL: the prompt repeats earlier context (a chat
                                turn rendered from the whole conversation); the
                                longest prefix matching reuse->ids is not evaluated
                                again (n_past is then ignored), and *reuse is
                                updated to the cache's contents (emptied on error);
                                stats.n_prompt counts the tokens evaluated */
    kn_progress_cb progress; /* NULL = none; see kn_progress_cb                      */
    void *progress_ud;
} kn_generate_params;
typedef struct kn_generate_stats {
    int n_prompt, n_generated, n_past_end;
    double prefill_s, decode_s;    /* wall-clock seconds                         */
    bool hit_context_limit;
    bool cancelled;                /* the progress callback returned false       */
} kn_generate_stats;
kn_generate_params kn_generate_defaults(void);
kn_status kn_generate(kn_model *m, const char *prompt, const kn_generate_params *p,
                      kn_token_cb cb, void *ud, kn_generate_stats *stats);
/* Same with a prompt given as tokens. */
kn_status kn_generate_tokens(kn_model *m, const int32_t *prompt, int n_prompt, const kn_generate_params *p,
                             kn_token_cb cb, void *ud, kn_generate_stats *stats);

/* kn_kv_tokens_free: frees what kn_generate_params.reuse accumulated. */
void kn_kv_tokens_free(kn_kv_tokens *kv);

/* ---- perplexity ------------------------------------------------------------------- */
/* The windows and scored tokens are those of llama.cpp's perplexity tool, so
 * the numbers compare. Tokenize the whole text first (add_bos =
 * kn_tokenizer_add_bos(tok), parse_special = false); C = kn_model_n_ctx(m).
 *   stride 0 (llama.cpp's default): windows of C tokens side by side
 *     (tokens [iC, iC+C) for i < n/C; a remainder is left out); each window
 *     is evaluated from an empty cache, its first token replaced by BOS when
 *     the tokenizer adds BOS, and the tokens at positions C/2+1 .. C-1 are
 *     scored (the second half, each predicted with at least C/2 before it).
 *     Needs n >= C and C >= 3.
 *   stride S (llama.cpp's --ppl-stride S, 0 < S < C): windows of C tokens
 *     starting every S tokens (ceil((n-C)/S) of them), the last S tokens of
 *     each scored, no BOS replaced. Needs n > C.
 * Each window is evaluated in chunks and only the scored rows' logits are
 * kept (at most 256 rows at a time), their log-softmax summed in double. Too few tokens gives
 * KN_ERR_INVALID with a message saying how many are needed.
 * progress (optional): windows done / total, as kn_progress_cb (false cancels:
 * KN_OK with result->cancelled, the result over the windows done). */
typedef struct kn_perplexity_params {
    int stride;                  /* 0 = llama.cpp's default windows (above) */
    kn_progress_cb progress;
    void *progress_ud;
} kn_perplexity_params;
typedef struct kn_perplexity_result {
    double nll;                  /* sum of -log p(token) over the scored tokens */
    long count;                  /* tokens scored                              */
    double ppl;                  /* exp(nll / count)                           */
    int n_windows;               /* windows evaluated                          */
    bool cancelled;
} kn_perplexity_result;
kn_status kn_model_perplexity(kn_model *m, const int32_t *tokens, int n, const kn_perplexity_params *p,
                              kn_perplexity_result *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
