/* kiln.h: the core API: contexts, lazy tensors, ops, plans and autograd.
 *
 * Ops are lazy constructors: kn_add(ctx, a, b) records a node and computes
 * nothing. Data is computed when it is read (kn_tensor_read), realized
 * (kn_realize), or when a compiled plan runs (kn_plan_new / kn_plan_run: the
 * way training and decode steps replay one graph many times).
 *
 *   kn_ctx *ctx = kn_ctx_new(NULL);
 *   int64_t sx[2] = {4, 3}, sw[2] = {3, 2};
 *   kn_tensor *x = kn_from_data(ctx, KN_F32, 2, sx, xdata);
 *   kn_tensor *w = kn_randn(ctx, KN_F32, 2, sw, 42);
 *   kn_set_requires_grad(w, true);
 *   kn_tensor *loss = kn_mean_all(ctx, kn_square(ctx, kn_matmul(ctx, x, w)));
 *   kn_backward(ctx, loss);                          // appends gradient nodes
 *   float g[6]; kn_tensor_read(kn_grad(w), g, KN_F32); // realizes loss and grad
 *   kn_ctx_free(ctx);                                // frees every tensor of ctx
 *
 * Ownership: tensors belong to their context and die with kn_ctx_free (or
 * kn_ctx_reset); never free them one by one. Data lives in reference-counted
 * buffers (a view shares its source's buffer). Plans are freed with
 * kn_plan_free. Every kn_*_free accepts NULL.
 *
 * Errors: a constructor given bad arguments (shapes, axes, dtypes) returns
 * NULL, records a message naming the op and the shapes (kn_last_error) and
 * makes the context's status sticky (kn_ctx_status); constructors given a
 * NULL input return NULL quietly, so a chain of ops can be checked once at
 * the end. Nothing aborts on user input.
 *
 * Shapes are int64_t, up to KN_MAX_DIMS dims, row-major; strides count
 * ELEMENTS (not bytes). Broadcasting follows numpy.
 */
#ifndef KILN_H
#define KILN_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KN_MAX_DIMS 8
#define KN_MAX_SRC  6
#define KN_MAX_SYMS 16

typedef struct kn_ctx kn_ctx;
typedef struct kn_buffer kn_buffer;
typedef struct kn_backend kn_backend;
typedef struct kn_plan kn_plan;
typedef struct kn_tensor kn_tensor;
typedef struct kn_dist kn_dist;       /* a communicator over ranks (kiln_dist.h) */

/* ---- ops ----------------------------------------------------------------
 * Every node carries one of these: KN_OP_NONE (a leaf: data, input or
 * parameter), then creation, views, copies, effects, unary math and
 * activations, binary (broadcasting) math and comparisons, reductions, scans,
 * matmul and nn ops. The list, with each op's name, kind and (elementwise
 * ops) formula, is the op table kiln_ops.def; this enum is made from it.
 * Append only. */
typedef enum kn_op {
#define KN_OP(ID, name, KIND, arity, inplace) KN_OP_##ID,
#include "kiln_ops.def"
    KN_OP_COUNT
} kn_op;

const char *kn_op_name(kn_op op);

/* ---- typed op parameters --------------------------------------------------- */
typedef enum { KN_RAND_UNIFORM, KN_RAND_NORMAL, KN_RAND_BERNOULLI, KN_RAND_INT } kn_rand_kind;
typedef enum { KN_PAD_CONSTANT, KN_PAD_REFLECT, KN_PAD_REPLICATE } kn_pad_mode;

typedef union kn_op_params {
    struct { double a, b; } scalar;          /* fill value; clamp lo/hi; leaky slope; elu alpha; arange start/step */
    struct { kn_rand_kind kind; double a, b; uint64_t seed; } rand; /* uniform [a,b), normal(a,b), bernoulli(p=a), int [a,b) */
    struct { int perm[KN_MAX_DIMS]; } permute;
    struct { int dim; int64_t start, step; } slice;  /* per-dim slice; its end is the node's shape */
    struct { uint32_t axes; bool keepdim; int correction; double p; } reduce; /* axes: bit mask; var/std correction; norm p */
    struct { int dim; bool exclusive; } scan;
    struct { int dim; } axis;                /* cat, gather, scatter, index_select/add/copy, softmax */
    struct { int64_t pad[2 * KN_MAX_DIMS]; kn_pad_mode mode; double value; } pad; /* (before, after) per dim, last dim first like torch */
    struct { int64_t k; bool upper; } tri;
    struct { double eps; int64_t n_norm; int groups; bool rms; } norm; /* n_norm: trailing dims normalised (layer norm); rms: NORM_BWD of rms_norm */
    struct { int stride[2], padding[2], dilation[2], output_padding[2], groups; } conv;
    struct { int kernel[2], stride[2], padding[2], dilation[2]; bool ceil_mode, count_include_pad; } pool;
    /* window, softcap: 0 = off (kn_sdpa_ex); lse: the node keeps each query row's
     * log-sum-exp for the gradient in a block of its own (set by kn_sdpa_ex, see kn__aux_bytes) */
    struct { bool causal, lse; double scale; int64_t window; double softcap; } sdpa;
    struct { double scale; int block_size, window; } paged;  /* paged_attn: window 0 = none */
    struct { double theta; int n_rot; bool neox; double freq_scale; } rope;
    struct { int64_t ignore_index; double smoothing; } ce;  /* cross_entropy(_bwd): rows with this target give 0; label smoothing */
    struct { double beta1, beta2, eps, l2; } adam;   /* l2: Adam's coupled weight decay (added to g) */
    struct { bool largest; } topk;           /* TOPK: the k largest (true) or smallest */
    struct { int dim; bool descending; } sort; /* SORT: the dim sorted along, the order (stable either way) */
    struct { kn_dist *comm; int op; int root; } dist; /* collectives: kn_dist_op, broadcast's root (kiln_dist.h) */
} kn_op_params;

/* Node flags */
enum {
    KN_FLAG_REQUIRES_GRAD = 1u << 0,
    KN_FLAG_INPUT   = 1u << 1,   /* leaf whose data the user writes before each run */
    KN_FLAG_PARAM   = 1u << 2,   /* trainable parameter (persistent storage)        */
    KN_FLAG_VIEW    = 1u << 3,   /* aliases view_src's storage                       */
    KN_FLAG_OUTPUT  = 1u << 4,   /* kept after a plan runs                            */
};

/* A tensor descriptor. Plain struct: read the fields, change them only
 * through the API. shape[] holds each dim's maximum extent; a dim with
 * sym[i] != 0 is symbolic: its extent at run time is the value of plan
 * symbol sym[i] (<= shape[i]). Storage is laid out for the maximum. */
struct kn_tensor {
    kn_dtype dtype;
    int ndim;
    int64_t shape[KN_MAX_DIMS];
    int64_t stride[KN_MAX_DIMS];   /* elements                                     */
    int64_t offset;                /* elements, into the storage                   */
    int8_t  sym[KN_MAX_DIMS];      /* 0 = fixed, else symbol id 1..KN_MAX_SYMS     */
    kn_op op;
    kn_tensor *src[KN_MAX_SRC];
    kn_op_params p;
    kn_tensor *view_src;           /* storage owner for views (never itself a view) */
    kn_buffer *buf;                /* storage once materialised (shared by views)   */
    uint32_t flags;
    kn_tensor *grad;               /* accumulated gradient (a node), NULL if none   */
    kn_ctx *ctx;
    int32_t id;                    /* index within its context                      */
    uint32_t magic;                /* KN_TENSOR_MAGIC while alive                   */
    char name[48];
};
#define KN_TENSOR_MAGIC 0x6b6e7431u

/* ---- contexts ---------------------------------------------------------------- */
typedef struct kn_ctx_opts {
    kn_backend *backend;     /* where data lives and ops run; NULL = kn_backend_default() */
} kn_ctx_opts;
kn_ctx *kn_ctx_new(const kn_ctx_opts *opts);  /* NULL on out of memory */
void kn_ctx_free(kn_ctx *ctx);                 /* frees every tensor; NULL is a no-op */
/* Marks every tensor dead (using one afterwards is a reported error) and
 * drops their buffers, keeping the arena memory for reuse. */
void kn_ctx_reset(kn_ctx *ctx);
kn_status kn_ctx_status(const kn_ctx *ctx);   /* first error recorded, or KN_OK      */
void kn_ctx_clear_status(kn_ctx *ctx);
kn_backend *kn_ctx_backend(const kn_ctx *ctx);
size_t kn_ctx_n_tensors(const kn_ctx *ctx);
/* No-grad scopes nest: nodes made inside do not require grad. */
void kn_no_grad_begin(kn_ctx *ctx);
void kn_no_grad_end(kn_ctx *ctx);

/* ---- symbols (dynamic sizes with a declared maximum) --------------------- */
/* Returns a symbol id (1..KN_MAX_SYMS) or 0 on error. Its value defaults to max. */
int kn_sym_new(kn_ctx *ctx, const char *name, int64_t max);
kn_status kn_sym_set(kn_ctx *ctx, int sym, int64_t value);   /* 1 <= value <= max */
int64_t kn_sym_value(const kn_ctx *ctx, int sym);

/* ---- creation ------------------------------------------------------------- */
kn_tensor *kn_empty(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape);   /* materialised, uninitialised */
kn_tensor *kn_from_data(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, const void *data); /* copies */
/* Wrap caller memory without copying (e.g. a memory-mapped weight); the
 * memory must outlive the context. Read-only use is the caller's promise. */
kn_tensor *kn_from_ptr(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, void *data);
/* Promise that t's storage (a materialised tensor: kn_from_ptr, kn_from_data,
 * a param) never changes again while it lives, e.g. a model's weights.
 * Backends may then keep a copy in a faster layout of their own: the CPU
 * packs Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K weights 16 rows at a time for decode (same size
 * again in memory). kn_tensor_write to it fails from then on. The LLM
 * loaders mark every weight they wrap. */
kn_status kn_set_constant(kn_tensor *t);
kn_tensor *kn_input(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape);  /* placeholder: write it before each run */
kn_tensor *kn_param(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape);  /* materialised, requires grad */
kn_tensor *kn_scalar(kn_ctx *ctx, kn_dtype t, double v);                          /* 0-d constant (lazy fill) */
kn_tensor *kn_full(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, double v);
kn_tensor *kn_zeros(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape);
kn_tensor *kn_ones(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape);
kn_tensor *kn_zeros_like(kn_ctx *ctx, const kn_tensor *x);
kn_tensor *kn_ones_like(kn_ctx *ctx, const kn_tensor *x);
kn_tensor *kn_arange(kn_ctx *ctx, kn_dtype t, double start, double stop, double step);
kn_tensor *kn_linspace(kn_ctx *ctx, kn_dtype t, double start, double stop, int64_t n);
kn_tensor *kn_eye(kn_ctx *ctx, kn_dtype t, int64_t n, int64_t m);
/* Random numbers from a counter-based generator (Philox4x32-10): element i
 * of a tensor drawn with seed s is the same on every backend and thread
 * count. A plan can vary the stream per step with kn_rand_offset. */
kn_tensor *kn_rand(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, uint64_t seed);      /* U[0,1) */
kn_tensor *kn_randn(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, uint64_t seed);     /* N(0,1) */
kn_tensor *kn_rand_uniform(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, double lo, double hi, uint64_t seed);
kn_tensor *kn_rand_normal(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, double mean, double std, uint64_t seed);
kn_tensor *kn_bernoulli(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, double p, uint64_t seed);
kn_tensor *kn_randint(kn_ctx *ctx, kn_dtype t, int ndim, const int64_t *shape, int64_t lo, int64_t hi, uint64_t seed);
kn_tensor *kn_randperm(kn_ctx *ctx, kn_dtype t, int64_t n, uint64_t seed);
/* Random op with a run-time stream offset: `offset` is a 0-d i64 tensor
 * (e.g. a plan input holding the step number). */
kn_tensor *kn_rand_offset(kn_ctx *ctx, kn_tensor *random_node, kn_tensor *offset);

/* ---- data access ------------------------------------------------------------ */
kn_status kn_realize(kn_tensor *t);                    /* compute t (and what it needs) now */
/* Copy t's elements (row-major, any strides) into dst converted to dtype
 * `as`; realizes t first. dst holds kn_numel(t) elements: the declared
 * shape. A symbolic dim is read at its maximum extent; the rows past the
 * symbol's current value are whatever the storage holds (read the leading
 * rows you asked for, or kn_slice first). */
kn_status kn_tensor_read(kn_tensor *t, void *dst, kn_dtype as);
/* Write host data (dtype `as`, row-major) into a materialised tensor (input,
 * param, or data leaf). */
kn_status kn_tensor_write(kn_tensor *t, const void *src, kn_dtype as);
double kn_item(kn_tensor *t);                          /* first element as double, NaN on error */
int64_t kn_numel(const kn_tensor *t);
bool kn_is_contiguous(const kn_tensor *t);
bool kn_same_shape(const kn_tensor *a, const kn_tensor *b);
void kn_set_name(kn_tensor *t, const char *name);
/* Debug print: shape, dtype and the first values. */
void kn_tensor_print(kn_tensor *t, const char *label);

/* ---- views (zero copy) -------------------------------------------------------- */
kn_tensor *kn_reshape(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape); /* one -1 allowed; copies only if the layout requires */
kn_tensor *kn_view(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape);    /* like reshape, but errors if a copy would be needed */
kn_tensor *kn_permute(kn_ctx *ctx, kn_tensor *x, const int *perm);
kn_tensor *kn_transpose(kn_ctx *ctx, kn_tensor *x, int d0, int d1);
kn_tensor *kn_expand(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape);  /* -1 keeps a dim */
kn_tensor *kn_broadcast_to(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape);
kn_tensor *kn_slice(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int64_t end, int64_t step); /* python semantics, negative ok */
/* Slice whose length along dim is symbol `sym` (at run time: [start, start+value)). */
kn_tensor *kn_slice_sym(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int sym);
kn_tensor *kn_narrow(kn_ctx *ctx, kn_tensor *x, int dim, int64_t start, int64_t len);
kn_tensor *kn_select(kn_ctx *ctx, kn_tensor *x, int dim, int64_t index);          /* drops dim */
kn_tensor *kn_squeeze(kn_ctx *ctx, kn_tensor *x, int dim);                        /* dim = -99: all size-1 dims */
kn_tensor *kn_unsqueeze(kn_ctx *ctx, kn_tensor *x, int dim);
kn_tensor *kn_flatten(kn_ctx *ctx, kn_tensor *x, int start_dim, int end_dim);
/* Raw strided view inside x's storage; checked to stay within it. */
kn_tensor *kn_as_strided(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset);

/* ---- copies ------------------------------------------------------------------- */
kn_tensor *kn_contiguous(kn_ctx *ctx, kn_tensor *x);   /* x itself if already contiguous */
kn_tensor *kn_copy(kn_ctx *ctx, kn_tensor *x);         /* always a new contiguous tensor */
kn_tensor *kn_cast(kn_ctx *ctx, kn_tensor *x, kn_dtype t);  /* floats round to nearest even; x itself when t is its dtype, y when x = kn_cast(y, w) widened y exactly and t is y's dtype (bf16/f16 -> f32/f64 -> back) */
kn_tensor *kn_cat(kn_ctx *ctx, kn_tensor **xs, int n, int dim);
kn_tensor *kn_stack(kn_ctx *ctx, kn_tensor **xs, int n, int dim);
/* split into pieces of `size` along dim (last may be smaller); returns count, fills out[] (views) */
int kn_split(kn_ctx *ctx, kn_tensor *x, int64_t size, int dim, kn_tensor **out, int max_out);
int kn_chunk(kn_ctx *ctx, kn_tensor *x, int chunks, int dim, kn_tensor **out, int max_out);
kn_tensor *kn_repeat(kn_ctx *ctx, kn_tensor *x, int ndim, const int64_t *repeats); /* torch.repeat / np.tile */
/* pads: (before, after) pairs starting from the LAST dim, like torch.nn.functional.pad */
kn_tensor *kn_pad(kn_ctx *ctx, kn_tensor *x, int npairs, const int64_t *pads, kn_pad_mode mode, double value);
kn_tensor *kn_gather(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index);
kn_tensor *kn_scatter(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src);
kn_tensor *kn_scatter_add(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src);
kn_tensor *kn_index_select(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index);
kn_tensor *kn_index_add(kn_ctx *ctx, kn_tensor *x, int dim, kn_tensor *index, kn_tensor *src);
kn_tensor *kn_where(kn_ctx *ctx, kn_tensor *cond, kn_tensor *a, kn_tensor *b);
kn_tensor *kn_masked_fill(kn_ctx *ctx, kn_tensor *x, kn_tensor *mask, double value);
kn_tensor *kn_triu(kn_ctx *ctx, kn_tensor *x, int64_t k);
kn_tensor *kn_tril(kn_ctx *ctx, kn_tensor *x, int64_t k);
/* Side effects (run when the node runs; the result aliases dst's storage):
 * assign writes src into dst (a materialised tensor or a view of one);
 * index_copy writes src's slices into dst at index positions along dim. */
kn_tensor *kn_assign(kn_ctx *ctx, kn_tensor *dst, kn_tensor *src);
kn_tensor *kn_index_copy(kn_ctx *ctx, kn_tensor *dst, int dim, kn_tensor *index, kn_tensor *src);

/* ---- elementwise ---------------------------------------------------------------- */
kn_tensor *kn_unary(kn_ctx *ctx, kn_op op, kn_tensor *x);     /* any unary/activation op without params */
kn_tensor *kn_binary(kn_ctx *ctx, kn_op op, kn_tensor *a, kn_tensor *b);
#define KN_UNARY_DECL(fn) kn_tensor *kn_##fn(kn_ctx *ctx, kn_tensor *x);
KN_UNARY_DECL(neg) KN_UNARY_DECL(abs) KN_UNARY_DECL(sign) KN_UNARY_DECL(exp) KN_UNARY_DECL(exp2)
KN_UNARY_DECL(log) KN_UNARY_DECL(log2) KN_UNARY_DECL(log1p) KN_UNARY_DECL(expm1) KN_UNARY_DECL(sqrt)
KN_UNARY_DECL(rsqrt) KN_UNARY_DECL(reciprocal) KN_UNARY_DECL(square) KN_UNARY_DECL(sin)
KN_UNARY_DECL(cos) KN_UNARY_DECL(tan) KN_UNARY_DECL(asin) KN_UNARY_DECL(acos) KN_UNARY_DECL(atan)
KN_UNARY_DECL(sinh) KN_UNARY_DECL(cosh) KN_UNARY_DECL(tanh) KN_UNARY_DECL(asinh) KN_UNARY_DECL(acosh)
KN_UNARY_DECL(atanh) KN_UNARY_DECL(erf) KN_UNARY_DECL(floor) KN_UNARY_DECL(ceil) KN_UNARY_DECL(round)
KN_UNARY_DECL(trunc) KN_UNARY_DECL(logical_not) KN_UNARY_DECL(relu) KN_UNARY_DECL(selu)
KN_UNARY_DECL(gelu) KN_UNARY_DECL(gelu_tanh) KN_UNARY_DECL(silu) KN_UNARY_DECL(sigmoid)
KN_UNARY_DECL(softplus) KN_UNARY_DECL(mish) KN_UNARY_DECL(hardsigmoid)
#undef KN_UNARY_DECL
kn_tensor *kn_clamp(kn_ctx *ctx, kn_tensor *x, double lo, double hi);   /* -INFINITY/INFINITY for one side */
kn_tensor *kn_leaky_relu(kn_ctx *ctx, kn_tensor *x, double slope);
kn_tensor *kn_elu(kn_ctx *ctx, kn_tensor *x, double alpha);
kn_tensor *kn_hardtanh(kn_ctx *ctx, kn_tensor *x, double lo, double hi);
#define KN_BINARY_DECL(fn) kn_tensor *kn_##fn(kn_ctx *ctx, kn_tensor *a, kn_tensor *b);
KN_BINARY_DECL(add) KN_BINARY_DECL(sub) KN_BINARY_DECL(mul) KN_BINARY_DECL(div) KN_BINARY_DECL(pow)
KN_BINARY_DECL(maximum) KN_BINARY_DECL(minimum) KN_BINARY_DECL(fmod) KN_BINARY_DECL(atan2)
KN_BINARY_DECL(eq) KN_BINARY_DECL(ne) KN_BINARY_DECL(lt) KN_BINARY_DECL(le) KN_BINARY_DECL(gt)
KN_BINARY_DECL(ge) KN_BINARY_DECL(logical_and) KN_BINARY_DECL(logical_or)
#undef KN_BINARY_DECL
/* scalar forms: x op s */
kn_tensor *kn_add_scalar(kn_ctx *ctx, kn_tensor *x, double s);
kn_tensor *kn_mul_scalar(kn_ctx *ctx, kn_tensor *x, double s);
kn_tensor *kn_pow_scalar(kn_ctx *ctx, kn_tensor *x, double s);
kn_tensor *kn_binary_scalar(kn_ctx *ctx, kn_op op, kn_tensor *x, double s);

/* ---- reductions (axes: list of dims; naxes = 0 means all) ----------------------- */
kn_tensor *kn_reduce(kn_ctx *ctx, kn_op op, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_sum(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_mean(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_prod(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_max(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_min(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_argmax(kn_ctx *ctx, kn_tensor *x, int dim, bool keepdim);   /* i64 result */
kn_tensor *kn_argmin(kn_ctx *ctx, kn_tensor *x, int dim, bool keepdim);
kn_tensor *kn_var(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, int correction, bool keepdim);
kn_tensor *kn_std(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, int correction, bool keepdim);
kn_tensor *kn_logsumexp(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_norm(kn_ctx *ctx, kn_tensor *x, double p, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_all(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_any(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim);
kn_tensor *kn_sum_all(kn_ctx *ctx, kn_tensor *x);
kn_tensor *kn_mean_all(kn_ctx *ctx, kn_tensor *x);
kn_tensor *kn_cumsum(kn_ctx *ctx, kn_tensor *x, int dim);
kn_tensor *kn_cumprod(kn_ctx *ctx, kn_tensor *x, int dim);

/* ---- linear algebra ------------------------------------------------------------- */
kn_tensor *kn_matmul(kn_ctx *ctx, kn_tensor *a, kn_tensor *b);   /* numpy matmul incl. 1-d and batch broadcasting */
kn_tensor *kn_bmm(kn_ctx *ctx, kn_tensor *a, kn_tensor *b);      /* [B,M,K] @ [B,K,N] */
kn_tensor *kn_outer(kn_ctx *ctx, kn_tensor *a, kn_tensor *b);
kn_tensor *kn_linear(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b); /* x @ w^T + b; b may be NULL */

/* ---- neural-network ops -------------------------------------------------------------- */
kn_tensor *kn_softmax(kn_ctx *ctx, kn_tensor *x, int dim);
kn_tensor *kn_log_softmax(kn_ctx *ctx, kn_tensor *x, int dim);
/* normalises the trailing n_norm dims; w, b of that shape or NULL */
kn_tensor *kn_layer_norm(kn_ctx *ctx, kn_tensor *x, int n_norm, kn_tensor *w, kn_tensor *b, double eps);
kn_tensor *kn_rms_norm(kn_ctx *ctx, kn_tensor *x, int n_norm, kn_tensor *w, double eps);
/* x [N,C,...]; training: batch statistics; eval: running mean/var. w, b [C] or NULL. */
kn_tensor *kn_batch_norm(kn_ctx *ctx, kn_tensor *x, kn_tensor *running_mean, kn_tensor *running_var,
                         kn_tensor *w, kn_tensor *b, bool training, double eps);
kn_tensor *kn_group_norm(kn_ctx *ctx, kn_tensor *x, int groups, kn_tensor *w, kn_tensor *b, double eps);
/* dropout: training multiplies by a Bernoulli(1-p) mask / (1-p); eval is identity */
kn_tensor *kn_dropout(kn_ctx *ctx, kn_tensor *x, double p, bool training, uint64_t seed);
kn_tensor *kn_embedding(kn_ctx *ctx, kn_tensor *weight, kn_tensor *ids);  /* weight [V,C], ids int -> [..., C] */
/* x [N,C,L], w [O,C/g,K] */
kn_tensor *kn_conv1d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, int stride, int padding, int dilation, int groups);
/* x [N,C,H,W], w [O,C/g,KH,KW] */
kn_tensor *kn_conv2d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[2], const int padding[2], const int dilation[2], int groups);
/* x [N,C,H,W], w [C,O/g,KH,KW] */
kn_tensor *kn_conv_transpose2d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[2], const int padding[2], const int output_padding[2], const int dilation[2], int groups);
kn_tensor *kn_max_pool2d(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int stride[2], const int padding[2], const int dilation[2], bool ceil_mode);
kn_tensor *kn_avg_pool2d(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int stride[2], const int padding[2], bool ceil_mode, bool count_include_pad);
kn_tensor *kn_adaptive_avg_pool2d(kn_ctx *ctx, kn_tensor *x, int64_t out_h, int64_t out_w);
/* q [B,Hq,Tq,D], k,v [B,Hkv,Tk,D] with Hq % Hkv == 0 (grouped-query);
 * causal masks key j > query i + (Tk - Tq); scale 0 means 1/sqrt(D). */
kn_tensor *kn_sdpa(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale);
/* kn_sdpa with a sliding window and logit soft-capping (each 0 = off):
 *   window W > 0 (needs causal): query row i, at key position p = i + (Tk - Tq),
 *     sees keys j with p - W < j <= p (the W most recent keys, itself included:
 *     transformers' sliding_window, Mistral / Gemma local layers);
 *   softcap c > 0: each score s = scale * q.k becomes c * tanh(s / c) before the
 *     mask and softmax (Gemma 2's attn_logit_softcapping).
 * Differentiable like kn_sdpa. */
kn_tensor *kn_sdpa_ex(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale, int64_t window,
                      double softcap);

/* Paged attention (inference: no gradient). Query rows of several sequences
 * attend to K/V rows kept in fixed-size blocks of a shared pool:
 *   q [T, H, D] float; k_pool, v_pool [Hkv, P, D] (f32 or f16, P a multiple
 *   of block_size); block_table [S, MB] i32: block b of sequence s is pool
 *   rows block_table[s][b] * block_size ..+block_size; row_seq, row_pos [T]
 *   i32 (same T as q, may be symbolic). Row t attends, causally, to its
 *   sequence's positions 0 .. row_pos[t] (window > 0: only the last `window`
 *   of them), position p held at pool row block_table[s][p / bs] * bs + p % bs.
 *   H % Hkv == 0 (grouped-query); scale 0 means 1/sqrt(D). Out: [T, H, D] f32.
 * A sequence id, position or block id out of range is an error when the plan runs. */
kn_tensor *kn_paged_attn(kn_ctx *ctx, kn_tensor *q, kn_tensor *k_pool, kn_tensor *v_pool, kn_tensor *block_table,
                         kn_tensor *row_seq, kn_tensor *row_pos, int block_size, int window, double scale);
/* x [..., T, D]: rotates the first n_rot dims of D by position pos[t] (i32 [T]);
 * neox=false rotates interleaved pairs (llama2.c/GGUF llama), true rotates halves. */
kn_tensor *kn_rope(kn_ctx *ctx, kn_tensor *x, kn_tensor *pos, int n_rot, double theta, bool neox, double freq_scale);
/* kn_rope with per-pair frequency divisors ff [n_rot/2] (float, not
 * differentiated): angle(t, i) = pos[t] * freq_scale * theta^(-2i/n_rot) / ff[i].
 * This is how Llama 3 and YaRN context scaling enter (GGUF rope_freqs.weight,
 * or factors computed from a Hugging Face rope_scaling); ff = NULL is kn_rope. */
kn_tensor *kn_rope_ff(kn_ctx *ctx, kn_tensor *x, kn_tensor *pos, int n_rot, double theta, bool neox, double freq_scale,
                      kn_tensor *ff);
/* Per-row classifier loss in one node (no probabilities in memory):
 *   loss[i] = logsumexp(logits[i,:]) - (1-ls) logits[i,t_i] - ls/C sum_j logits[i,j]
 * logits [N,C] f32/f16/bf16/f64 (read as stored), targets [N] integer class
 * ids, ls = label_smoothing in [0, 1). Rows whose target is ignore_index give
 * 0; any other target outside [0, C) is an error when the plan runs. Result
 * [N] f32 (f64 for f64 logits). Its gradient is one CROSS_ENTROPY_BWD node.
 * kn_cross_entropy (kiln_nn.h) adds the reductions and the [..., C] shapes. */
kn_tensor *kn_cross_entropy_rows(kn_ctx *ctx, kn_tensor *logits, kn_tensor *targets, int64_t ignore_index,
                                 double label_smoothing);

/* Top-k along the last dim of x [..., n] (float; 1 <= k <= n): returns the
 * values [..., k] in x's dtype, sorted (largest first, or smallest first with
 * largest = false; ties: the lower index first; NaN counts as largest), and
 * when indices is non-NULL the i32 indices [..., k] into it. The values are
 * gather(x, -1, indices), so the gradient flows to x at the chosen places. */
kn_tensor *kn_topk(kn_ctx *ctx, kn_tensor *x, int64_t k, bool largest, kn_tensor **indices);
/* Indexed matmul (mixture of experts; ggml's mul_mat_id): with x [T, C] or
 * [T, k or 1, C] (f32), stacked expert weights W [E, N, C] (f32, f16, bf16 or
 * a GGUF block type with C a whole number of blocks) and ids [T, k] (integer
 * expert ids in [0, E)), y [T, k, N] f32 with
 *     y[t, j, :] = W[ids[t, j]] . x[t, j or 0, :]
 * Backends group the rows by expert, so each expert's weights are read once
 * per call. f64 x and W run on the reference backend (gradient checks).
 * Differentiable in x and W (not through a quantized W); the W gradient is
 * built through a one-hot [T*k, E, N] spread, fine for small models only. */
kn_tensor *kn_mul_mat_id(kn_ctx *ctx, kn_tensor *x, kn_tensor *W, kn_tensor *ids);

/* ---- sorting, einsum, resampling, patches, 3-d convolution --------------------
 * Stable sort of x (float or integer, any shape) along dim: returns the sorted
 * values (x's dtype and shape) and, when indices is non-NULL, the i64 indices
 * into x (torch.sort(x, dim, descending, stable=True)). Ties keep their order
 * in x; NaN counts as the largest value (last ascending, first descending);
 * -0.0 and 0.0 are equal. The values are gather(x, dim, indices), so the
 * gradient scatters back to x through the indices. */
kn_tensor *kn_sort(kn_ctx *ctx, kn_tensor *x, int dim, bool descending, kn_tensor **indices);
/* The i64 indices of kn_sort alone (no gradient: integers). */
kn_tensor *kn_argsort(kn_ctx *ctx, kn_tensor *x, int dim, bool descending);
/* Einstein summation over n operands (torch.einsum): spec is "ab,bc->ac"
 * style, letters a-z and A-Z name dims, "..." broadcasts the remaining dims
 * (numpy rules, aligned on the right), a size-1 dim broadcasts against its
 * label's size elsewhere; without "->" the output is "..." then the labels
 * seen once, in alphabetical order. A label repeated in one operand takes
 * the diagonal ("ii->i", trace "ii->"). Built from permute, reshape, sum, mul
 * and batched matmul (contracting left to right, as torch does without
 * opt_einsum), so it is differentiable and runs on every backend. Any
 * malformed spec or shape mismatch is an error naming the position. */
kn_tensor *kn_einsum(kn_ctx *ctx, const char *spec, int n, kn_tensor **operands);
/* Resize the spatial dims of x [N,C,W], [N,C,H,W] or [N,C,D,H,W] (float),
 * torch.nn.functional.interpolate: give the output sizes (size[i] >= 1) or,
 * with size NULL, scale factors (scale[i] > 0: the output is floor(in *
 * scale) and, as torch with recompute_scale_factor unset, the source
 * coordinate uses 1 / scale). Modes: KN_INTERP_NEAREST (torch "nearest": src
 * = floor(dst * in / out); align_corners must be false), KN_INTERP_LINEAR
 * (torch "linear", "bilinear", "trilinear" by rank) with align_corners as
 * torch. Out [N, C, size...]. Differentiable in x. */
typedef enum { KN_INTERP_NEAREST, KN_INTERP_LINEAR } kn_interp_mode;
kn_tensor *kn_interpolate(kn_ctx *ctx, kn_tensor *x, const int64_t *size, const double *scale, kn_interp_mode mode,
                          bool align_corners);
/* torch.nn.functional.unfold (im2col): x [N,C,H,W] or [C,H,W] -> [N, C*KH*KW, L]
 * (or [C*KH*KW, L]), L = OH*OW sliding blocks, row c*KH*KW + kh*KW + kw. */
kn_tensor *kn_unfold(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int dilation[2], const int padding[2],
                     const int stride[2]);
/* torch.nn.functional.fold (col2im, unfold's adjoint): x [N, C*KH*KW, L] or
 * [C*KH*KW, L] -> [N, C, out_h, out_w] (or [C, out_h, out_w]), overlapping
 * blocks summed; L must equal the number of blocks out_size gives. */
kn_tensor *kn_fold(kn_ctx *ctx, kn_tensor *x, const int64_t out_size[2], const int kernel[2], const int dilation[2],
                   const int padding[2], const int stride[2]);
/* x [N,C,D,H,W], w [O,C/g,KD,KH,KW], b [O] or NULL -> [N,O,OD,OH,OW]
 * (torch.nn.functional.conv3d). Built on conv2d: the KD depth taps of each
 * output plane are stacked as channels and one conv2d runs over N*OD planes. */
kn_tensor *kn_conv3d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[3], const int padding[3],
                     const int dilation[3], int groups);

/* ---- autograd ----------------------------------------------------------------- */
void kn_set_requires_grad(kn_tensor *t, bool on);
bool kn_requires_grad(const kn_tensor *t);
kn_tensor *kn_grad(const kn_tensor *t);                    /* NULL if none yet */
/* Append the gradient graph of `loss` (a scalar, or any tensor with seed
 * gradient `seed`, NULL = ones) and accumulate into .grad of every leaf that
 * requires grad. Calling it again adds to existing gradients. */
kn_status kn_backward(kn_ctx *ctx, kn_tensor *loss);
kn_status kn_backward_seed(kn_ctx *ctx, kn_tensor *out, kn_tensor *seed);
/* Gradients of outs (seeded with gouts; NULL = ones) with respect to ins,
 * written to grads[] (NULL where no path); does not touch .grad. */
kn_status kn_gradients(kn_ctx *ctx, int nout, kn_tensor **outs, kn_tensor **gouts,
                       int nin, kn_tensor **ins, kn_tensor **grads);
kn_tensor *kn_detach(kn_ctx *ctx, kn_tensor *x);          /* same storage/value, no grad history */
void kn_zero_grad(kn_tensor *t);                          /* forget t's gradient */

/* ---- plans ------------------------------------------------------------------------
 * A plan is the compiled form of a graph: a schedule of kernels and a
 * memory plan (intermediates share one arena by liveness). Build once, run
 * many times; every op node feeding the outputs is recomputed on each run
 * (leaves: data, inputs and parameters are read as they are then), outputs
 * keep their storage. Effects (kn_assign) nobody reads run last. */
typedef struct kn_plan_opts {
    kn_backend *backend;     /* NULL: the context's backend                    */
    bool no_inplace;         /* disable in-place reuse of dying inputs         */
    bool no_reuse;           /* disable memory reuse entirely (debugging)      */
    bool no_rewrite;         /* skip the graph rewrites (docs/COMPILER.md); KN_NOFUSE=1 too */
    bool no_fuse;            /* run every node on its own kernel: no fused, generated kernels; KN_NOFUSE=1 too */
} kn_plan_opts;
kn_plan *kn_plan_new(kn_ctx *ctx, int nout, kn_tensor **outs, const kn_plan_opts *opts);
kn_status kn_plan_run(kn_plan *p);
void kn_plan_free(kn_plan *p);
size_t kn_plan_peak_bytes(const kn_plan *p);   /* arena size for intermediates */
size_t kn_plan_naive_bytes(const kn_plan *p);  /* what it would take with no reuse */
int kn_plan_n_kernels(const kn_plan *p);      /* kernel launches per plain run (a fused group is one) */
/* What a plan runs (docs/COMPILER.md) and its run counts. On a backend that
 * captures (CUDA), a run whose symbol values were run before is recorded
 * once into a graph and replayed with one launch (KN_CUDA_GRAPH=0: never). */
typedef struct kn_plan_stats {
    int nodes;              /* in the schedule, views included                 */
    int kernels;            /* kernel launches of one plain run: hand + generated */
    int generated;          /* generated kernels (fused groups) among them     */
    int fused_nodes;        /* nodes that run inside those                     */
    size_t peak_bytes;      /* the arena                                       */
    uint64_t runs;          /* kn_plan_run calls                               */
    uint64_t replays;       /* of them, replays of a captured graph            */
    uint64_t captures;      /* graphs captured                                 */
    int graphs;             /* graphs held now                                 */
    int epilogues;          /* matmuls that run elementwise consumers in their epilogue */
    int epilogue_nodes;     /* consumer nodes those took in (not counting the matmuls), prologue nodes included */
    int prologues;          /* matmuls that compute their left operand (an rms_norm, a gated unit) as they read it */
} kn_plan_stats;
void kn_plan_get_stats(const kn_plan *p, kn_plan_stats *out);   /* zeros for NULL */
void kn_plan_print(const kn_plan *p, void *FILE_ptr);  /* the schedule (KN_DEBUG=1 prints it at build) */
/* Graphviz DOT of the graph feeding outs. */
kn_status kn_graph_dump_dot(kn_ctx *ctx, int nout, kn_tensor **outs, const char *path);

/* ---- backends ------------------------------------------------------------------ */
kn_backend *kn_backend_ref(void);      /* plain-C reference: every op, the oracle */
kn_backend *kn_backend_cpu(void);      /* fast CPU: SIMD + threads, reference fallback */
kn_backend *kn_backend_default(void);  /* KN_BACKEND=ref|cpu, default cpu */
/* Worker threads of the CPU backend, the calling thread included. The
 * default is KN_THREADS, else one per online core; n <= 0 restores it. */
void kn_set_threads(int n);
int kn_threads(void);
const char *kn_backend_name(const kn_backend *be);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
