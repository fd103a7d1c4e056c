/* nn-impl.h: internals shared by the files of src/nn (the module struct, helpers).
 * defines: struct kn_module, kn__mod_fail, kn__mod_path, kn__param_new. */
#ifndef KN_NN_IMPL_H
#define KN_NN_IMPL_H
#include "kiln_nn.h"
#include "graph/graph.h"

typedef struct kn__mparam {
    char name[64];
    kn_tensor *t;
    kn_tensor **slot;              /* the layer struct's cached copy of t, or NULL */
    bool buffer, no_decay;
} kn__mparam;

struct kn_module {
    kn_ctx *ctx;
    char kind[32];
    char name[64];                 /* name within the parent ("" for a root)    */
    kn_module *parent;
    kn_forward_fn forward;         /* generic one-input forward, or NULL        */
    void *impl;                    /* layer-specific struct                     */
    bool free_impl;
    bool training;
    kn_module **children; int n_children, cap_children;
    kn__mparam *params; int n_params, cap_params;
    kn_tensor **effects; int n_effects, cap_effects;   /* pending training effects */
    kn_tensor *rng_step;           /* 0-d i64 stream offset for dropout, or NULL */
    kn_precision prec;             /* compute dtype of its matmuls (precision.c) */
};

/* The dynamic loss scaler (precision.c). The scale lives on the host and
 * reaches the plan as the 0-d f32 input scale_in (written by
 * kn_optim_prepare); the plan writes the overflow verdict of each run into
 * found_inf (0-d f32, 1 = some gradient was inf/nan), which
 * kn_loss_scaler_update reads: one 4-byte read per step. */
struct kn_loss_scaler {
    kn_ctx *ctx;
    kn_loss_scaler_cfg cfg;
    double scale;
    int64_t good, skipped;         /* finite steps since the last change; skipped steps */
    kn_tensor *scale_in, *found_inf;
    kn_optim *opt;                 /* set by kn_optim_set_loss_scaler */
};
kn_status kn__loss_scaler_write(kn_loss_scaler *s);

/* x @ w^T + b under m's precision: x and w cast to the compute dtype for
 * the matmul (f32 accumulation in the kernels), the product cast back to
 * x's dtype before the bias, so everything after it (bias, norms, softmax,
 * losses) stays f32. With KN_PREC_F32 it is kn_linear. */
kn_tensor *kn__mod_linear(const kn_module *m, kn_tensor *x, kn_tensor *w, kn_tensor *b);
/* precision.c: the dtype sdpa runs in under m's policy (16-bit on device
 * backends, q's dtype otherwise) */
kn_dtype kn__mod_attn_dtype(const kn_module *m, const kn_tensor *q);

/* "Linear 'h.0.attn.c_proj'" into buf (kind and dotted path from the root). */
const char *kn__mod_path(const kn_module *m, char *buf, size_t n);
/* Record "<kind> '<path>': <message>" as an invalid-argument error; returns NULL. */
kn_tensor *kn__mod_fail(const kn_module *m, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* New f32 parameter (buffer) registered in m, uninitialised storage, stored
 * into *slot too when slot is not NULL: a layer caching its tensors in its
 * impl struct passes the field, so kn_module_to_backend can update it. */
kn_tensor *kn__param_new(kn_module *m, const char *name, int ndim, const int64_t *shape, bool no_decay, kn_tensor **slot);
kn_tensor *kn__buffer_new(kn_module *m, const char *name, int ndim, const int64_t *shape, kn_tensor **slot);
kn_status kn__mod_push_effect(kn_module *m, kn_tensor *e);
/* child that must be of a given kind: NULL with an error otherwise */
kn_module *kn__child(const kn_module *m, const char *name);
/* checks x has ndim in [lo,hi] and (when want >= 0) dim `dim` == want */
bool kn__mod_check(const kn_module *m, kn_tensor *x, int lo, int hi, int dim, int64_t want, const char *what);
/* dropout honouring the tree's rng step input */
kn_tensor *kn__mod_dropout(kn_module *m, kn_tensor *x, double p, uint64_t seed);
#endif
