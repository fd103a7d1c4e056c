/* kiln_nn.h: training on top of the core: modules with named parameters,
 * layers, models (GPT-2, Llama), losses, optimizers, learning-rate schedules.
 *
 * Everything here builds ordinary lazy graph nodes (include/kiln.h), so a
 * whole training step (forward, backward, gradient clipping, optimizer
 * update) is ONE plan, compiled once and replayed. The optimizer update is a
 * set of kn_assign effects into the parameter and state storage; the
 * learning rate(s) and the step count are 0-d plan inputs written by
 * kn_optim_prepare() before each run.
 *
 *   kn_ctx *ctx = kn_ctx_new(NULL);
 *   kn_nn_manual_seed(1337);                                // init is deterministic
 *   kn_module *net = kn_sequential_new(ctx, "mlp");
 *   kn_sequential_add(net, kn_linear_new(ctx, 4, 16, true));
 *   kn_sequential_add(net, kn_act_new(ctx, KN_ACT_TANH));
 *   kn_sequential_add(net, kn_linear_new(ctx, 16, 3, true));
 *   kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){8, 4});
 *   kn_tensor *y = kn_input(ctx, KN_I64, 1, (int64_t[]){8});
 *   kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, x), y, NULL);
 *   kn_backward(ctx, loss);
 *   kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW); oc.lr = 1e-3;
 *   kn_optim *opt = kn_optim_new(ctx, net, &oc);            // one group, all params
 *   kn_tensor *outs[KN_NN_MAX_OUTS]; int n = 0;
 *   outs[n++] = loss;
 *   n += kn_optim_build(opt, NULL, outs + n, KN_NN_MAX_OUTS - n);  // update effects
 *   kn_plan *plan = kn_plan_new(ctx, n, outs, NULL);
 *   for (int step = 0; step < 100; step++) {
 *       kn_tensor_write(x, xb, KN_F32); kn_tensor_write(y, yb, KN_I64);
 *       kn_optim_set_lr(opt, -1, kn_sched_cosine(step, 1e-3, 1e-4, 10, 100));
 *       kn_optim_prepare(opt);                             // writes step count and lr
 *       kn_plan_run(plan);
 *   }
 *   kn_plan_free(plan); kn_optim_free(opt); kn_module_free(net); kn_ctx_free(ctx);
 *
 * Build the training plan from a fresh graph: a node that an earlier plan
 * computed as an output, or that was read eagerly (kn_tensor_read), keeps its
 * value and is a constant to later plans. To reuse a model for a second
 * plan, call the forward again (and kn_zero_grad each parameter before a
 * second kn_backward: gradients accumulate across kn_backward calls).
 *
 * Ownership: modules and optimizers are malloc'd and freed with
 * kn_module_free (recursive: a container frees its children) and
 * kn_optim_free; the tensors they hold belong to the context. Free modules
 * and optimizers before (or after) kn_ctx_free, but never use them after it.
 *
 * Errors: constructors return NULL and set kn_last_error on bad arguments;
 * forward functions return NULL with a message naming the module (its kind
 * and dotted name) when the input shape is wrong, and NULL quietly when the
 * input is NULL, like the core ops.
 *
 * Dimension letters: B batch, T time/sequence, C channels/embedding,
 * H heads, D head dim, V vocabulary, N rows of a loss.
 */
#ifndef KILN_NN_H
#define KILN_NN_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KN_NN_NAME_MAX 128       /* longest dotted parameter name, incl. NUL        */
#define KN_NN_MAX_OUTS 4096      /* a convenient size for plan output arrays        */

/* ==== modules ================================================================ */
typedef struct kn_module kn_module;

/* Seed of the parameter initialisers (like torch.manual_seed): every
 * initialiser draws the next seed from a per-thread counter started here. */
void kn_nn_manual_seed(uint64_t seed);
uint64_t kn_nn_next_seed(void);

/* A named tensor of a module tree: a trainable parameter or a buffer
 * (e.g. BatchNorm running stats: state that is saved but not trained). */
typedef struct kn_named_param {
    char name[KN_NN_NAME_MAX];   /* dotted: "h.0.attn.c_attn.weight"                 */
    kn_tensor *t;                /* materialised storage (kn_param / kn_empty)       */
    bool buffer;                 /* true: running stat, not trained                  */
    bool no_decay;               /* suggested for a no-weight-decay group (biases, norms, 1-d) */
} kn_named_param;

/* Parameters (buffers=false) or parameters then buffers (buffers=true) of m
 * and its children, depth first in registration order. Fills up to `max`
 * entries of out (out may be NULL with max 0) and returns the total count,
 * so call once to size the array. Names are relative to m. */
int kn_module_named_params(const kn_module *m, bool buffers, kn_named_param *out, int max);
/* Parameter or buffer by dotted name; NULL if absent. */
kn_tensor *kn_module_find(const kn_module *m, const char *name);
int64_t kn_module_n_params(const kn_module *m);        /* total trainable elements */
void kn_module_train(kn_module *m, bool training);    /* recursive; modules start in training mode */
bool kn_module_is_training(const kn_module *m);
const char *kn_module_kind(const kn_module *m);       /* "Linear", "GPT2", ... */
const char *kn_module_name(const kn_module *m);       /* its own name within the parent */
int kn_module_n_children(const kn_module *m);
kn_module *kn_module_child(const kn_module *m, int i);
kn_module *kn_module_child_by_name(const kn_module *m, const char *name);
/* Move the tree rooted at m (no parent) to the context dst, usually one on
 * another backend:
 *     kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){kn_backend_cuda()});
 *     if (kn_module_to_backend(net, g)) fprintf(stderr, "%s\n", kn_last_error());
 * Every parameter and buffer is copied into a new tensor of dst with the
 * same dtype, shape, name and requires_grad; the tree (names, kinds,
 * children, training mode) stays as it was, and forwards afterwards build
 * nodes in dst. Not moved: gradients, optimizer state (build the optimizer
 * after moving) and the dropout step input (set it again with
 * kn_module_set_rng_step). The old tensors stay in their context until it
 * is freed. A tree with pending effects is refused (KN_ERR_STATE). On error
 * the tree is unchanged. Your own modules (kn_module_add_param): an impl that
 * caches its tensors must look them up again (kn_module_find) after a move. */
kn_status kn_module_to_backend(kn_module *m, kn_ctx *dst);
/* Print the tree with shapes and counts (FILE*; NULL = stdout). */
void kn_module_print(const kn_module *m, void *FILE_ptr);
void kn_module_free(kn_module *m);                     /* recursive; NULL is a no-op */
/* Generic one-input forward (Linear, norms, activations, convs, Sequential,
 * attention/blocks without positions, ...). Models with token ids use
 * kn_gpt2_forward / kn_llama_forward. */
kn_tensor *kn_module_forward(kn_module *m, kn_tensor *x);

/* Building your own module: a container with its own parameters and a
 * forward callback. `impl` is freed with free() by kn_module_free when
 * free_impl is true. */
typedef kn_tensor *(*kn_forward_fn)(kn_module *m, kn_tensor *x);
kn_module *kn_module_new(kn_ctx *ctx, const char *kind, kn_forward_fn forward, void *impl, bool free_impl);
kn_status kn_module_add_child(kn_module *parent, const char *name, kn_module *child); /* takes ownership */
kn_status kn_module_add_param(kn_module *m, const char *name, kn_tensor *t, bool buffer, bool no_decay);
void *kn_module_impl(const kn_module *m);
kn_ctx *kn_module_ctx(const kn_module *m);

/* ==== initialisers ===========================================================
 * Write values into a materialised tensor's storage now (kn_assign + realize),
 * drawn from the Philox generator with kn_nn_next_seed(). fan_in/fan_out
 * are computed like torch: dim 1 * receptive field / dim 0 * receptive field. */
typedef enum { KN_NONLIN_LINEAR, KN_NONLIN_RELU, KN_NONLIN_LEAKY_RELU, KN_NONLIN_TANH, KN_NONLIN_SIGMOID } kn_nonlin;
kn_status kn_init_normal(kn_tensor *t, double mean, double std);
kn_status kn_init_uniform(kn_tensor *t, double lo, double hi);
kn_status kn_init_constant(kn_tensor *t, double v);
kn_status kn_init_zeros(kn_tensor *t);
kn_status kn_init_ones(kn_tensor *t);
kn_status kn_init_xavier_uniform(kn_tensor *t, double gain);
kn_status kn_init_xavier_normal(kn_tensor *t, double gain);
/* a: negative slope for leaky_relu (torch's kaiming_uniform_(w, a=sqrt(5)) is
 * nn.Linear's default), mode_fan_out: use fan_out instead of fan_in */
kn_status kn_init_kaiming_uniform(kn_tensor *t, double a, kn_nonlin nl, bool mode_fan_out);
kn_status kn_init_kaiming_normal(kn_tensor *t, double a, kn_nonlin nl, bool mode_fan_out);
double kn_init_gain(kn_nonlin nl, double param);
void kn_init_fans(const kn_tensor *t, int64_t *fan_in, int64_t *fan_out);
/* Copy host values (dtype `as`, row-major) into a named parameter of m. */
kn_status kn_module_load_param(kn_module *m, const char *name, const void *data, kn_dtype as);

/* ==== layers =================================================================
 * Parameters are f32 and initialised like PyTorch's defaults. Inputs follow
 * torch layouts (Linear: [..., in]; convs: [B,C,H,W]; RNNs: batch first). */
kn_module *kn_linear_new(kn_ctx *ctx, int64_t in, int64_t out, bool bias);           /* weight [out,in], bias [out] */
kn_module *kn_embedding_new(kn_ctx *ctx, int64_t n, int64_t dim);                     /* weight [n,dim] ~ N(0,1); input: int ids */
kn_module *kn_layer_norm_new(kn_ctx *ctx, int64_t dim, double eps, bool affine, bool bias); /* over the last dim */
kn_module *kn_rms_norm_new(kn_ctx *ctx, int64_t dim, double eps);                     /* weight ones */
/* BatchNorm1d ([B,C] or [B,C,L]) and BatchNorm2d ([B,C,H,W]): training mode
 * normalises with batch statistics and updates running_mean/var (buffers,
 * unbiased variance, momentum) with kn_assign effects: include
 * kn_module_effects() in the plan outputs. Eval uses the running stats. */
kn_module *kn_batch_norm1d_new(kn_ctx *ctx, int64_t channels, double eps, double momentum, bool affine);
kn_module *kn_batch_norm2d_new(kn_ctx *ctx, int64_t channels, double eps, double momentum, bool affine);
kn_module *kn_group_norm_new(kn_ctx *ctx, int groups, int64_t channels, double eps, bool affine);
/* Dropout draws a fresh mask per run when the module tree has a step input
 * (kn_module_set_rng_step) that the caller advances; otherwise per-seed fixed. */
kn_module *kn_dropout_new(kn_ctx *ctx, double p);
kn_module *kn_conv1d_new(kn_ctx *ctx, int64_t in_ch, int64_t out_ch, int kernel, int stride, int padding, int dilation, int groups, bool bias);
kn_module *kn_conv2d_new(kn_ctx *ctx, int64_t in_ch, int64_t out_ch, const int kernel[2], const int stride[2],
                         const int padding[2], const int dilation[2], int groups, bool bias);
kn_module *kn_conv_transpose2d_new(kn_ctx *ctx, int64_t in_ch, int64_t out_ch, const int kernel[2], const int stride[2],
                                   const int padding[2], const int output_padding[2], int groups, bool bias);
kn_module *kn_max_pool2d_new(kn_ctx *ctx, const int kernel[2], const int stride[2], const int padding[2]);
kn_module *kn_avg_pool2d_new(kn_ctx *ctx, const int kernel[2], const int stride[2], const int padding[2]);
kn_module *kn_adaptive_avg_pool2d_new(kn_ctx *ctx, int64_t out_h, int64_t out_w);
kn_module *kn_flatten_new(kn_ctx *ctx, int start_dim, int end_dim);
typedef enum {
    KN_ACT_RELU, KN_ACT_GELU, KN_ACT_GELU_TANH, KN_ACT_SILU, KN_ACT_TANH, KN_ACT_SIGMOID,
    KN_ACT_LEAKY_RELU, KN_ACT_ELU, KN_ACT_SOFTPLUS, KN_ACT_MISH, KN_ACT_IDENTITY, KN_ACT_SOFTMAX
} kn_act;
kn_module *kn_act_new(kn_ctx *ctx, kn_act act);          /* leaky slope 0.01, elu alpha 1, softmax over the last dim */
kn_tensor *kn_act_apply(kn_ctx *ctx, kn_act act, kn_tensor *x);
kn_module *kn_sequential_new(kn_ctx *ctx, const char *kind_or_NULL);
kn_status kn_sequential_add(kn_module *seq, kn_module *child);   /* named "0", "1", ...; takes ownership */

/* Effects a module tree adds during forward in training mode (BatchNorm
 * running-stat updates): put them in the plan outputs. Collected since the
 * last call; returns the count written (up to max) and clears the list. */
int kn_module_effects(kn_module *m, kn_tensor **out, int max);
/* A 0-d i64 input shared by the tree's dropout layers as the random stream
 * offset; the caller writes the step number before each run. */
kn_status kn_module_set_rng_step(kn_module *m, kn_tensor *step_i64);

/* ---- attention and transformer blocks ------------------------------------ */
typedef struct kn_attn_cfg {
    int64_t dim;            /* C                                                    */
    int n_heads;            /* H                                                    */
    int n_kv_heads;         /* Hkv (grouped-query when < n_heads); 0 = n_heads       */
    bool bias;              /* biases on the projections                            */
    bool fused_qkv;         /* one c_attn [3C,C] + c_proj (GPT-2 names) vs q/k/v/o_proj */
    bool causal;
    bool rope;              /* rotate q, k by position (needs pos)                   */
    bool rope_neox;         /* rotate halves (HF Llama) instead of interleaved pairs */
    double rope_theta;
    double dropout;         /* on the attention output projection (training); a Block
                               applies it to its MLP output too (GPT-2's resid_pdrop) */
    double attn_dropout;    /* on the attention probabilities (training; GPT-2's
                               attn_pdrop). Above 0 a training forward runs the
                               attention unfused (scores, softmax, mask, P V): the
                               flash kernels keep no mask */
} kn_attn_cfg;
kn_module *kn_attention_new(kn_ctx *ctx, const kn_attn_cfg *cfg);
/* x [B,T,C]; pos: i32 [T] positions (needed with rope, else NULL) */
kn_tensor *kn_attention_forward(kn_module *m, kn_tensor *x, kn_tensor *pos);

typedef enum { KN_NORM_LAYER, KN_NORM_RMS } kn_norm_kind;
typedef enum { KN_MLP_GELU_TANH, KN_MLP_GELU, KN_MLP_SWIGLU } kn_mlp_kind;
typedef struct kn_block_cfg {
    kn_attn_cfg attn;
    kn_norm_kind norm;      /* GPT-2: ln_1/ln_2 LayerNorm; Llama: RMSNorm           */
    double norm_eps;
    kn_mlp_kind mlp;        /* GPT-2: c_fc, gelu_tanh, c_proj; Llama: gate/up/down   */
    int64_t hidden;         /* MLP width                                            */
    bool mlp_bias;
} kn_block_cfg;
/* Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(.)). Names follow the
 * style: GPT-2 "ln_1, attn, ln_2, mlp.c_fc, mlp.c_proj"; Llama
 * "input_layernorm, self_attn, post_attention_layernorm, mlp.gate_proj/up_proj/down_proj". */
kn_module *kn_block_new(kn_ctx *ctx, const kn_block_cfg *cfg);
kn_tensor *kn_block_forward(kn_module *m, kn_tensor *x, kn_tensor *pos);

/* ---- models --------------------------------------------------------------- */
typedef struct kn_gpt2_cfg {
    int64_t vocab, max_seq, dim; int n_layers, n_heads; double dropout;
    double attn_dropout;    /* on the attention probabilities (kn_attn_cfg) */
} kn_gpt2_cfg;
/* Names: wte.weight [V,C], wpe.weight [maxT,C], h.<i>.ln_1.{weight,bias},
 * h.<i>.attn.c_attn.{weight [3C,C],bias}, h.<i>.attn.c_proj.*, h.<i>.ln_2.*,
 * h.<i>.mlp.c_fc.* [4C,C], h.<i>.mlp.c_proj.* [C,4C], ln_f.*; lm_head tied
 * to wte. Linear weights are [out,in] (nn.Linear, not HF's Conv1D).
 * Init like GPT-2/nanoGPT: N(0,0.02), residual projections 0.02/sqrt(2L). */
kn_module *kn_gpt2_new(kn_ctx *ctx, const kn_gpt2_cfg *cfg);
/* ids: integer [B,T] (T <= max_seq) -> logits [B,T,V] */
kn_tensor *kn_gpt2_forward(kn_module *m, kn_tensor *ids);

typedef struct kn_llama_cfg {
    int64_t vocab, dim, hidden; int n_layers, n_heads, n_kv_heads;
    double rope_theta, norm_eps; bool tie_embeddings;
} kn_llama_cfg;
/* Names (HF): embed_tokens.weight, layers.<i>.input_layernorm.weight,
 * layers.<i>.self_attn.{q,k,v,o}_proj.weight, layers.<i>.post_attention_layernorm.weight,
 * layers.<i>.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight
 * (absent when tied). RoPE rotates halves (HF layout). */
kn_module *kn_llama_new(kn_ctx *ctx, const kn_llama_cfg *cfg);
/* ids: integer [B,T]; pos: i32 [T] positions (NULL: 0..T-1) -> logits [B,T,V] */
kn_tensor *kn_llama_forward(kn_module *m, kn_tensor *ids, kn_tensor *pos);

/* ---- recurrent ------------------------------------------------------------- */
/* Cells: x [B,in], h [B,H] (LSTM also c [B,H]); torch gate order (GRU: r,z,n;
 * LSTM: i,f,g,o); params weight_ih [G*H,in], weight_hh [G*H,H], bias_ih,
 * bias_hh; init U(-1/sqrt(H), 1/sqrt(H)). */
typedef enum { KN_RNN_TANH, KN_RNN_RELU, KN_RNN_GRU, KN_RNN_LSTM } kn_rnn_kind;
kn_module *kn_rnn_cell_new(kn_ctx *ctx, kn_rnn_kind kind, int64_t in, int64_t hidden, bool bias);
/* One step; for LSTM *c is read and replaced; returns the new h. */
kn_tensor *kn_rnn_cell_forward(kn_module *m, kn_tensor *x, kn_tensor *h, kn_tensor **c);
/* Multi-layer, batch first, unrolled over T in the graph: x [B,T,in] ->
 * [B,T,H] (last layer's h at each step). Params of layer l are named like
 * torch: weight_ih_l<l>, weight_hh_l<l>, bias_ih_l<l>, bias_hh_l<l>.
 * h0/c0 [layers,B,H] or NULL (zeros); h_n/c_n (optional) receive the finals. */
kn_module *kn_rnn_new(kn_ctx *ctx, kn_rnn_kind kind, int64_t in, int64_t hidden, int n_layers, bool bias);
kn_tensor *kn_rnn_forward(kn_module *m, kn_tensor *x, kn_tensor *h0, kn_tensor *c0, kn_tensor **h_n, kn_tensor **c_n);

/* ==== losses ==================================================================
 * Composites of core ops (gradients come from autograd; cross-entropy has
 * its own fused nodes). Reduction applies to the per-element loss. */
typedef enum { KN_REDUCE_MEAN, KN_REDUCE_SUM, KN_REDUCE_NONE } kn_reduction;
typedef struct kn_ce_opts {
    kn_reduction reduction;
    int64_t ignore_index;   /* targets equal to it add nothing (mean over the rest); default -100 */
    double label_smoothing; /* in [0,1)                                              */
} kn_ce_opts;
kn_ce_opts kn_ce_defaults(void);
/* logits [N,C] or [..., C] (class dim last), targets integer [N] / [...]; NULL opts = defaults.
 * One fused node per row and one gradient node (kn_cross_entropy_rows in
 * kiln.h): logits are read as stored (a bf16/f16 tensor cast to f32 is read
 * before the cast), the loss is f32 (f64 for f64 logits). A target outside
 * [0, C) other than ignore_index is an error when the plan runs.
 * KN_CE_COMPOSITE=1 builds the composite on log_softmax instead. */
kn_tensor *kn_cross_entropy(kn_ctx *ctx, kn_tensor *logits, kn_tensor *targets, const kn_ce_opts *o);
/* logp [..., C] log-probabilities */
kn_tensor *kn_nll_loss(kn_ctx *ctx, kn_tensor *logp, kn_tensor *targets, const kn_ce_opts *o);
kn_tensor *kn_mse_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_reduction r);
kn_tensor *kn_l1_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_reduction r);
kn_tensor *kn_huber_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, double delta, kn_reduction r);
kn_tensor *kn_smooth_l1_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, double beta, kn_reduction r);
/* p probabilities in (0,1), y targets in [0,1]; log clamped at -100 like torch */
kn_tensor *kn_bce_loss(kn_ctx *ctx, kn_tensor *p, kn_tensor *y, kn_reduction r);
/* stable: max(x,0) - x*y + log1p(exp(-|x|)); pos_weight [C] or NULL */
kn_tensor *kn_bce_with_logits_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_tensor *pos_weight, kn_reduction r);
/* torch.nn.functional.kl_div(input=logq, target): target*(log target - logq);
 * log_target: target given as log-probabilities. batchmean: sum / dim 0. */
typedef enum { KN_KL_MEAN, KN_KL_SUM, KN_KL_NONE, KN_KL_BATCHMEAN } kn_kl_reduction;
kn_tensor *kn_kl_div_loss(kn_ctx *ctx, kn_tensor *logq, kn_tensor *target, bool log_target, kn_kl_reduction r);

/* ==== optimizers ===============================================================
 * kn_optim_build() appends, for each parameter, the update as graph nodes:
 * new state and parameter values assigned with kn_assign (effects that the
 * planner runs after every read of the parameter). Put the returned effects
 * in the plan outputs together with the loss. Before each kn_plan_run call
 * kn_optim_prepare(): it advances the step count and writes the 0-d inputs
 * (step: i64, lr per group: f32). Formulas follow torch.optim (single-tensor
 * path) so that parameters match PyTorch's after N steps. */
typedef enum { KN_OPTIM_SGD, KN_OPTIM_ADAM, KN_OPTIM_ADAMW, KN_OPTIM_RMSPROP, KN_OPTIM_ADAGRAD } kn_optim_kind;
typedef struct kn_optim_cfg {
    kn_optim_kind kind;
    double lr, weight_decay;
    double momentum, dampening; bool nesterov;          /* SGD (momentum also RMSprop) */
    double beta1, beta2, eps;                           /* Adam/AdamW; eps also RMSprop/Adagrad */
    double alpha; bool centered;                        /* RMSprop                    */
    double lr_decay, initial_accumulator_value;         /* Adagrad                    */
    double clip_norm;       /* > 0: clip gradients to this global norm (graph ops)   */
    bool unfused;           /* Adam/AdamW: build the update from elementwise ops
                               instead of one fused adam_update node per parameter
                               (same f32 arithmetic; for checking, and the reference) */
} kn_optim_cfg;
/* torch defaults for the kind (AdamW weight_decay 0.01, Adam betas 0.9/0.999, eps 1e-8, ...) */
kn_optim_cfg kn_optim_defaults(kn_optim_kind kind);
typedef struct kn_optim kn_optim;
/* One group holding every trainable parameter of m (buffers excluded). */
kn_optim *kn_optim_new(kn_ctx *ctx, kn_module *m, const kn_optim_cfg *cfg);
/* Empty optimizer; add groups with kn_optim_add_group. */
kn_optim *kn_optim_new_empty(kn_ctx *ctx, const kn_optim_cfg *cfg);
/* A group with its own lr and weight decay (others from the cfg); returns its index or -1. */
int kn_optim_add_group(kn_optim *o, int n, kn_tensor *const *params, double lr, double weight_decay);
/* Two groups from m: decay (weights with >= 2 dims) and no-decay (biases, norm
 * weights, every 1-d parameter: kn_named_param.no_decay) with weight decay 0. */
kn_optim *kn_optim_new_decay_groups(kn_ctx *ctx, kn_module *m, const kn_optim_cfg *cfg);
/* Build the update. grads: one per parameter in group order (NULL = use
 * kn_grad(p) from kn_backward; e.g. accumulated buffers from kn_grad_accum).
 * Returns the number of effect tensors written to out (or -1 on error);
 * plan them all (with ZeRO-1 the first is a [1] value that orders the
 * ranks' collectives, kn_optim_set_zero1). */
int kn_optim_build(kn_optim *o, kn_tensor *const *grads, kn_tensor **out, int max);
/* Data parallel (kiln_dist.h): before kn_optim_build, make every gradient
 * its average over d's ranks (all_reduce in buckets of about bucket_bytes,
 * 0: 25 MiB, overlapping the backward pass on the CUDA backend). Clipping,
 * loss scaling and the update then see the same averaged gradients on every
 * rank, so replicas stay equal. A world of one gives the same bits as no
 * communicator. NULL d: off. */
kn_status kn_optim_set_dist(kn_optim *o, kn_dist *d, size_t bucket_bytes);
/* ZeRO stage 1 (after kn_optim_set_dist, before kn_optim_build): each
 * parameter's optimizer state lives on one rank, its owner (parameters go
 * largest first to the rank with the fewest bytes so far), which updates
 * it and broadcasts the parameter's new values; the other ranks free that
 * state, so a rank keeps about 1/world of it. The parameters come out bit
 * for bit as plain data parallelism's. kn_train_save gathers every state
 * into the one file (every rank must call it); kn_train_load gives each
 * rank its own. on = false: every rank keeps every state (the default). */
kn_status kn_optim_set_zero1(kn_optim *o, bool on);
/* The rank that keeps parameter i's state (ZeRO-1), or -1 when every rank does. */
int kn_optim_state_owner(const kn_optim *o, int i);
kn_dist *kn_optim_get_dist(const kn_optim *o);              /* kn_optim_set_dist's, or NULL */
/* The state slots this optimizer keeps per parameter ("exp_avg", ...): up
 * to max names into names, returns how many there are. States are f32 of
 * the parameter's shape. */
int kn_optim_state_names(const kn_optim *o, const char **names, int max);
/* Global gradient norm before clipping (a graph node; valid after build with clip_norm > 0, else NULL). */
kn_tensor *kn_optim_grad_norm(const kn_optim *o);
void kn_optim_set_lr(kn_optim *o, int group, double lr);    /* group -1: every group */
double kn_optim_get_lr(const kn_optim *o, int group);
kn_status kn_optim_prepare(kn_optim *o);                     /* step += 1; write step and lr inputs */
int64_t kn_optim_step_count(const kn_optim *o);
int kn_optim_n_params(const kn_optim *o);
kn_tensor *kn_optim_param(const kn_optim *o, int i);         /* group order */
/* State tensors of parameter i ("exp_avg", "exp_avg_sq", "momentum_buffer",
 * "square_avg", "grad_avg", "sum"), for checkpoints; NULL if absent (or
 * kept by another rank: kn_optim_state_owner). */
kn_tensor *kn_optim_state(const kn_optim *o, int i, const char *name);
kn_status kn_optim_set_step_count(kn_optim *o, int64_t step); /* resume from a checkpoint */
void kn_optim_free(kn_optim *o);

/* Gradient accumulation over micro-batches: persistent f32 buffers, one per
 * optimizer parameter. Two plans:
 *   micro plan:  loss + kn_grad_accum_add(acc, scale, ...) effects (buf += scale*grad)
 *   step plan:   kn_optim_build(opt, kn_grad_accum_buffers(acc), ...) effects
 *                + kn_grad_accum_zero(acc, ...) effects (buf = 0, run after the update)
 * Run the micro plan K times (scale = 1/K for a mean), then the step plan once. */
typedef struct kn_grad_accum kn_grad_accum;
kn_grad_accum *kn_grad_accum_new(kn_ctx *ctx, kn_optim *o);
int kn_grad_accum_add(kn_grad_accum *a, double scale, kn_tensor **out, int max);
kn_tensor *const *kn_grad_accum_buffers(const kn_grad_accum *a);
int kn_grad_accum_zero(kn_grad_accum *a, kn_tensor **out, int max);
void kn_grad_accum_free(kn_grad_accum *a);

/* ==== mixed precision ===========================================================
 * A precision policy like PyTorch's autocast, set on a module tree:
 *
 *   kn_status st = kn_module_set_precision(net, KN_PREC_BF16);  // checks the backend can
 *   if (st) fprintf(stderr, "%s\n", kn_last_error());           // (CPU: needs AVX512_BF16)
 *
 * Parameters (the master weights) and optimizer state stay f32. Each Linear
 * layer (and the tied LM heads of GPT-2 / Llama) casts its input and weight
 * to the compute dtype, multiplies there (the kernels accumulate in f32) and
 * casts the product back to f32 before the bias. On a GPU backend the
 * Attention module also casts q, k, v to the compute dtype for sdpa (flash
 * kernels: f32 softmax statistics and accumulators) and y back to f32.
 * Everything else (embedding lookups, norms, softmax, activations, losses,
 * reductions, the optimizer) computes in f32. The gradient of a cast is the cast back, so
 * the backward matmuls run in the compute dtype too and gradients land in f32
 * on the master weights. Set the precision before the forward that builds the
 * plan; kn_module_add_child hands a non-f32 precision down to the child.
 *
 * f16's narrow range needs dynamic loss scaling (below); bf16 does not.
 * Where each precision runs: CUDA: all three. CPU (host) backends: bf16
 * needs a CPU with AVX512_BF16, f16 one with F16C; today both widen the
 * operands to f32 for the CPU's SGEMM (the numerics of 16-bit inputs, no
 * speed-up), attention stays f32 on host backends and convolutions on
 * every backend. */
typedef enum { KN_PREC_F32, KN_PREC_BF16, KN_PREC_F16 } kn_precision;
const char *kn_precision_name(kn_precision p);              /* "f32", "bf16", "f16" */
/* "f32" | "bf16" | "f16" (also "fp32", "bfloat16", "fp16", "float16"); KN_ERR_INVALID otherwise */
kn_status kn_precision_parse(const char *s, kn_precision *out);
kn_dtype kn_precision_dtype(kn_precision p);                /* KN_F32, KN_BF16, KN_F16 */
/* KN_OK when ctx's backend can compute in p, else KN_ERR_UNSUPPORTED with
 * the reason and what to use instead. */
kn_status kn_precision_check(kn_ctx *ctx, kn_precision p);
/* Recursive, like kn_module_train. Checks p with kn_precision_check first. */
kn_status kn_module_set_precision(kn_module *m, kn_precision p);
kn_precision kn_module_precision(const kn_module *m);

/* Dynamic loss scaling (torch.cuda.amp.GradScaler): backward runs on loss *
 * scale so that small f16 gradients do not flush to zero; the optimizer
 * update divides the gradients by the scale and, when any of them is inf or
 * NaN, leaves every parameter and state tensor as it was (selected in the
 * graph: the plan is not rebuilt). After each run, kn_loss_scaler_update
 * reads that verdict (one 4-byte read) and halves the scale on an overflow
 * (and takes the optimizer's step count back, as a skipped torch step does),
 * or multiplies it by growth_factor after growth_interval finite steps.
 *
 *   kn_loss_scaler *sc = kn_loss_scaler_new(ctx, NULL);          // defaults
 *   kn_backward(ctx, kn_loss_scaler_scale(sc, loss));            // not kn_backward(loss)
 *   kn_optim *opt = kn_optim_new(ctx, net, &oc);
 *   kn_optim_set_loss_scaler(opt, sc);                           // before kn_optim_build
 *   ... plan of loss + kn_optim_build effects ...
 *   each step: kn_optim_prepare(opt); kn_plan_run(plan); kn_loss_scaler_update(sc, &skipped);
 *
 * kn_train_run does the update by itself when the optimizer has a scaler.
 * With a scaler, Adam/AdamW build the composite (unfused) update, whose
 * results can be selected; the fused adam_update node has no skip input. */
typedef struct kn_loss_scaler_cfg {
    double init_scale;          /* 65536                                           */
    double growth_factor;       /* 2                                               */
    double backoff_factor;      /* 0.5                                             */
    int64_t growth_interval;    /* 2000 finite steps before growing                */
} kn_loss_scaler_cfg;
kn_loss_scaler_cfg kn_loss_scaler_defaults(void);
typedef struct kn_loss_scaler kn_loss_scaler;
kn_loss_scaler *kn_loss_scaler_new(kn_ctx *ctx, const kn_loss_scaler_cfg *cfg);   /* NULL cfg: defaults */
/* loss * scale (the scale is a plan input): the tensor to call kn_backward on */
kn_tensor *kn_loss_scaler_scale(kn_loss_scaler *s, kn_tensor *loss);
/* Attach before kn_optim_build; one scaler per optimizer. */
kn_status kn_optim_set_loss_scaler(kn_optim *o, kn_loss_scaler *s);
kn_loss_scaler *kn_optim_loss_scaler(const kn_optim *o);
/* After each run of the step plan; *skipped (may be NULL) tells whether the
 * run's update was skipped. */
kn_status kn_loss_scaler_update(kn_loss_scaler *s, bool *skipped);
double kn_loss_scaler_get_scale(const kn_loss_scaler *s);
kn_status kn_loss_scaler_set_scale(kn_loss_scaler *s, double scale);   /* > 0 and finite; resets the growth count */
int64_t kn_loss_scaler_skipped(const kn_loss_scaler *s);              /* steps skipped so far */
/* The state a resumed run needs (kn_train_save keeps it as metadata): the
 * scale and the finite steps since it last changed. */
void kn_loss_scaler_get_state(const kn_loss_scaler *s, double *scale, int64_t *good);
kn_status kn_loss_scaler_set_state(kn_loss_scaler *s, double scale, int64_t good);
void kn_loss_scaler_free(kn_loss_scaler *s);

/* ==== learning-rate schedules (host functions of the step, 0-based) ========== */
double kn_sched_constant(int64_t step, double lr);
/* lr * gamma^(step / step_size) */
double kn_sched_step(int64_t step, double lr, int64_t step_size, double gamma);
/* linear warm-up from 0 to lr over `warmup` steps (lr*(step+1)/warmup), then
 * linear decay to min_lr at `total` */
double kn_sched_linear(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total);
/* same warm-up, then cosine decay to min_lr at `total` (min_lr after it) */
double kn_sched_cosine(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total);
/* torch OneCycleLR (cos annealing, three_phase false): from max_lr/div_factor up
 * to max_lr over pct_start*total steps, then down to max_lr/(div_factor*final_div_factor) */
double kn_sched_one_cycle(int64_t step, double max_lr, int64_t total, double pct_start,
                          double div_factor, double final_div_factor);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
