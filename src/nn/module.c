/* module.c: the module tree (named parameters and buffers, children, train
 * / eval mode, effects), parameter initialisers and the init seed.
 * Non-goals: no hooks, no parameter sharing between trees (a tied weight is
 * registered once, in the module that owns it). */
#include "nn-impl.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- init seed ------------------------------------------------------------ */
static _Thread_local uint64_t seed_state = 0x5eed;
void kn_nn_manual_seed(uint64_t seed) { seed_state = seed; }
uint64_t kn_nn_next_seed(void) {
    /* splitmix64 step: distinct, well-mixed seeds for consecutive draws */
    uint64_t z = (seed_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- construction ------------------------------------------------------------ */
kn_module *kn_module_new(kn_ctx *ctx, const char *kind, kn_forward_fn forward, void *impl, bool free_impl) {
    if (!ctx) return NULL;
    kn_module *m = calloc(1, sizeof *m);
    if (!m) { kn__fail(ctx, KN_ERR_NOMEM, "kn_module_new: out of memory"); if (free_impl) free(impl); return NULL; }
    m->ctx = ctx;
    snprintf(m->kind, sizeof m->kind, "%s", kind ? kind : "Module");
    m->forward = forward;
    m->impl = impl;
    m->free_impl = free_impl;
    m->training = true;
    return m;
}

void kn_module_free(kn_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_children; i++) kn_module_free(m->children[i]);
    free(m->children);
    free(m->params);
    free(m->effects);
    if (m->free_impl) free(m->impl);
    free(m);
}

static bool valid_name(const char *name) {
    if (!name || !*name || strlen(name) >= 64) return false;
    for (const char *p = name; *p; p++) if (*p == '.') return false;
    return true;
}

kn_status kn_module_add_child(kn_module *parent, const char *name, kn_module *child) {
    if (!parent || !child) { kn_module_free(child); return kn_set_error(KN_ERR_INVALID, "kn_module_add_child: NULL module (an earlier constructor failed: %s)", kn_last_error()); }
    if (!valid_name(name) || kn_module_child_by_name(parent, name)) {
        kn_module_free(child);
        return kn_set_error(KN_ERR_INVALID, "kn_module_add_child: child name '%s' is empty, too long, has a '.', or is taken in %s", name ? name : "(null)", parent->kind);
    }
    if (parent->n_children == parent->cap_children) {
        int cap = parent->cap_children ? 2 * parent->cap_children : 4;
        kn_module **c = realloc(parent->children, sizeof *c * (size_t)cap);
        if (!c) { kn_module_free(child); return kn_set_error(KN_ERR_NOMEM, "kn_module_add_child: out of memory"); }
        parent->children = c; parent->cap_children = cap;
    }
    snprintf(child->name, sizeof child->name, "%s", name);
    child->parent = parent;
    if (parent->rng_step && !child->rng_step) kn_module_set_rng_step(child, parent->rng_step);
    if (parent->prec != KN_PREC_F32) kn_module_set_precision(child, parent->prec);   /* checked on the parent */
    parent->children[parent->n_children++] = child;
    return KN_OK;
}

kn_status kn_module_add_param(kn_module *m, const char *name, kn_tensor *t, bool buffer, bool no_decay) {
    if (!m || !t) return kn_set_error(KN_ERR_INVALID, "kn_module_add_param: NULL module or tensor");
    if (!valid_name(name) || kn_module_find(m, name))
        return kn_set_error(KN_ERR_INVALID, "kn_module_add_param: name '%s' is empty, too long, has a '.', or is taken in %s", name ? name : "(null)", m->kind);
    if (!kn__storage_owner(t)->buf || t->op != KN_OP_NONE)
        return kn_set_error(KN_ERR_INVALID, "kn_module_add_param: '%s' must be a materialised leaf (kn_param / kn_empty)", name);
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 4;
        kn__mparam *p = realloc(m->params, sizeof *p * (size_t)cap);
        if (!p) return kn_set_error(KN_ERR_NOMEM, "kn_module_add_param: out of memory");
        m->params = p; m->cap_params = cap;
    }
    kn__mparam *p = &m->params[m->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->t = t; p->slot = NULL; p->buffer = buffer; p->no_decay = no_decay;
    kn_set_name(t, name);
    if (buffer) kn_set_requires_grad(t, false);
    return KN_OK;
}

static kn_tensor *bind(kn_module *m, kn_tensor *t, kn_tensor **slot) {
    m->params[m->n_params - 1].slot = slot;
    if (slot) *slot = t;
    return t;
}
kn_tensor *kn__param_new(kn_module *m, const char *name, int ndim, const int64_t *shape, bool no_decay, kn_tensor **slot) {
    kn_tensor *t = kn_param(m->ctx, KN_F32, ndim, shape);
    if (!t || kn_module_add_param(m, name, t, false, no_decay)) return NULL;
    return bind(m, t, slot);
}
kn_tensor *kn__buffer_new(kn_module *m, const char *name, int ndim, const int64_t *shape, kn_tensor **slot) {
    kn_tensor *t = kn_empty(m->ctx, KN_F32, ndim, shape);
    if (!t || kn_module_add_param(m, name, t, true, true)) return NULL;
    return bind(m, t, slot);
}

void *kn_module_impl(const kn_module *m) { return m ? m->impl : NULL; }
kn_ctx *kn_module_ctx(const kn_module *m) { return m ? m->ctx : NULL; }
const char *kn_module_kind(const kn_module *m) { return m ? m->kind : ""; }
const char *kn_module_name(const kn_module *m) { return m ? m->name : ""; }
int kn_module_n_children(const kn_module *m) { return m ? m->n_children : 0; }
kn_module *kn_module_child(const kn_module *m, int i) { return (m && i >= 0 && i < m->n_children) ? m->children[i] : NULL; }
kn_module *kn_module_child_by_name(const kn_module *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_children; i++) if (!strcmp(m->children[i]->name, name)) return m->children[i];
    return NULL;
}
kn_module *kn__child(const kn_module *m, const char *name) { return kn_module_child_by_name(m, name); }

/* ---- iteration ---------------------------------------------------------------- */
static void collect(const kn_module *m, const char *prefix, int pass, kn_named_param *out, int max, int *n) {
    for (int i = 0; i < m->n_params; i++) {
        const kn__mparam *p = &m->params[i];
        if (p->buffer != (pass == 1)) continue;
        if (out && *n < max) {
            snprintf(out[*n].name, KN_NN_NAME_MAX, "%s%s", prefix, p->name);
            out[*n].t = p->t; out[*n].buffer = p->buffer; out[*n].no_decay = p->no_decay;
        }
        (*n)++;
    }
    for (int i = 0; i < m->n_children; i++) {
        char pre[KN_NN_NAME_MAX];
        snprintf(pre, sizeof pre, "%s%s.", prefix, m->children[i]->name);
        collect(m->children[i], pre, pass, out, max, n);
    }
}

int kn_module_named_params(const kn_module *m, bool buffers, kn_named_param *out, int max) {
    if (!m) return 0;
    int n = 0;
    collect(m, "", 0, out, max, &n);
    if (buffers) collect(m, "", 1, out, max, &n);
    return n;
}

kn_tensor *kn_module_find(const kn_module *m, const char *name) {
    if (!m || !name) return NULL;
    const char *dot = strchr(name, '.');
    if (!dot) {
        for (int i = 0; i < m->n_params; i++) if (!strcmp(m->params[i].name, name)) return m->params[i].t;
        return NULL;
    }
    size_t len = (size_t)(dot - name);
    for (int i = 0; i < m->n_children; i++)
        if (strlen(m->children[i]->name) == len && !strncmp(m->children[i]->name, name, len))
            return kn_module_find(m->children[i], dot + 1);
    return NULL;
}

int64_t kn_module_n_params(const kn_module *m) {
    if (!m) return 0;
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) if (!m->params[i].buffer) n += kn_numel(m->params[i].t);
    for (int i = 0; i < m->n_children; i++) n += kn_module_n_params(m->children[i]);
    return n;
}

void kn_module_train(kn_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->n_children; i++) kn_module_train(m->children[i], training);
}
bool kn_module_is_training(const kn_module *m) { return m && m->training; }

static void print_rec(const kn_module *m, FILE *f, int depth) {
    char sh[160];
    fprintf(f, "%*s%s%s%s (%lld params)\n", 2 * depth, "", m->name[0] ? m->name : "", m->name[0] ? ": " : "", m->kind,
            (long long)kn_module_n_params(m));
    for (int i = 0; i < m->n_params; i++)
        fprintf(f, "%*s.%s %s%s\n", 2 * depth + 2, "", m->params[i].name, kn__shape_str(m->params[i].t, sh, sizeof sh),
                m->params[i].buffer ? " (buffer)" : "");
    for (int i = 0; i < m->n_children; i++) print_rec(m->children[i], f, depth + 1);
}
void kn_module_print(const kn_module *m, void *FILE_ptr) {
    if (m) print_rec(m, FILE_ptr ? (FILE *)FILE_ptr : stdout, 0);
}

/* ---- forward, effects, rng ---------------------------------------------------------- */
kn_tensor *kn_module_forward(kn_module *m, kn_tensor *x) {
    if (!m || !x) return NULL;
    if (!m->forward) return kn__mod_fail(m, "this module has no one-input forward; use its own forward function (e.g. kn_gpt2_forward)");
    return m->forward(m, x);
}

kn_status kn__mod_push_effect(kn_module *m, kn_tensor *e) {
    if (!e) return KN_ERR_INVALID;
    if (m->n_effects == m->cap_effects) {
        int cap = m->cap_effects ? 2 * m->cap_effects : 4;
        kn_tensor **p = realloc(m->effects, sizeof *p * (size_t)cap);
        if (!p) return kn_set_error(KN_ERR_NOMEM, "out of memory");
        m->effects = p; m->cap_effects = cap;
    }
    m->effects[m->n_effects++] = e;
    return KN_OK;
}

static void effects_rec(kn_module *m, kn_tensor **out, int max, int *n) {
    for (int i = 0; i < m->n_effects; i++) { if (*n < max) out[*n] = m->effects[i]; (*n)++; }
    m->n_effects = 0;
    for (int i = 0; i < m->n_children; i++) effects_rec(m->children[i], out, max, n);
}
int kn_module_effects(kn_module *m, kn_tensor **out, int max) {
    if (!m) return 0;
    int n = 0;
    effects_rec(m, out, max, &n);
    if (n > max) { kn_set_error(KN_ERR_LIMIT, "kn_module_effects: %d effects but room for %d; the rest were dropped", n, max); return max; }
    return n;
}

kn_status kn_module_set_rng_step(kn_module *m, kn_tensor *step) {
    if (!m) return KN_ERR_INVALID;
    if (step && (step->ndim != 0 || step->dtype != KN_I64))
        return kn_set_error(KN_ERR_INVALID, "kn_module_set_rng_step: the step must be a 0-d i64 input, got %s with %d dims",
                            kn_dtype_name(step->dtype), step->ndim);
    m->rng_step = step;
    for (int i = 0; i < m->n_children; i++) kn_module_set_rng_step(m->children[i], step);
    return KN_OK;
}

kn_tensor *kn__mod_dropout(kn_module *m, kn_tensor *x, double p, uint64_t seed) {
    if (!x) return NULL;
    if (!m->training || p == 0) return x;
    if (!m->rng_step || p >= 1) return kn_dropout(m->ctx, x, p, true, seed);
    kn_tensor *mask = kn_rand_offset(m->ctx, kn_bernoulli(m->ctx, x->dtype, x->ndim, x->shape, 1.0 - p, seed), m->rng_step);
    return kn_mul(m->ctx, x, kn_mul_scalar(m->ctx, mask, 1.0 / (1.0 - p)));
}

/* ---- moving a tree to another context ----------------------------------------------
 * Two phases so that a failure leaves the tree as it was: first every
 * parameter and buffer is copied into dst (host staging through
 * kn_tensor_read / kn_tensor_write, so any pair of backends works), then
 * the tree is switched over: each registry entry and, where the layer
 * caches the tensor in its impl struct, that field (the slot given to
 * kn__param_new). A module built outside src/nn whose impl caches tensors
 * it registered with kn_module_add_param must look them up again
 * (kn_module_find) after a move. */
typedef struct { kn_module *m; int i; kn_tensor *y; } move_item;

static kn_status move_check(const kn_module *m, int *count) {
    if (m->n_effects)
        return kn_set_error(KN_ERR_STATE, "kn_module_to_backend: %s has %d pending effects; put kn_module_effects() into a plan "
                            "(or drop them) before moving", m->kind, m->n_effects);
    *count += m->n_params;
    for (int i = 0; i < m->n_children; i++) {
        kn_status st = move_check(m->children[i], count);
        if (st) return st;
    }
    return KN_OK;
}

static kn_tensor *move_copy(kn_ctx *dst, const kn__mparam *p) {
    kn_tensor *t = p->t;
    kn_tensor *y = p->buffer ? kn_empty(dst, t->dtype, t->ndim, t->shape) : kn_param(dst, t->dtype, t->ndim, t->shape);
    if (!y) return NULL;
    size_t bytes = kn_dtype_nbytes(t->dtype, kn_numel(t));
    void *host = malloc(bytes ? bytes : 1);
    if (!host) { kn_set_error(KN_ERR_NOMEM, "kn_module_to_backend: out of host memory staging '%s' (%zu bytes)", p->name, bytes); return NULL; }
    kn_status st = kn_tensor_read(t, host, t->dtype);
    if (!st) st = kn_tensor_write(y, host, t->dtype);
    free(host);
    if (st) return NULL;
    kn_set_name(y, p->name);
    kn_set_requires_grad(y, kn_requires_grad(t));
    return y;
}

static kn_status move_collect(kn_module *m, kn_ctx *dst, move_item *items, int *n) {
    for (int i = 0; i < m->n_params; i++) {
        kn_tensor *y = move_copy(dst, &m->params[i]);
        if (!y) return kn_ctx_status(dst) ? kn_ctx_status(dst) : KN_ERR_BACKEND;
        items[*n].m = m; items[*n].i = i; items[*n].y = y;
        (*n)++;
    }
    for (int i = 0; i < m->n_children; i++) {
        kn_status st = move_collect(m->children[i], dst, items, n);
        if (st) return st;
    }
    return KN_OK;
}

static void move_commit(kn_module *m, kn_ctx *dst, const move_item *items, int n) {
    for (int k = 0; k < n; k++)
        if (items[k].m == m) {
            kn__mparam *p = &m->params[items[k].i];
            p->t = items[k].y;
            if (p->slot) *p->slot = items[k].y;
        }
    m->ctx = dst;
    m->rng_step = NULL;                 /* a plan input of the old context */
    for (int i = 0; i < m->n_children; i++) move_commit(m->children[i], dst, items, n);
}

kn_status kn_module_to_backend(kn_module *m, kn_ctx *dst) {
    if (!m || !dst) return kn_set_error(KN_ERR_INVALID, "kn_module_to_backend: NULL module or context (an earlier call failed? %s)", kn_last_error());
    if (m->parent) return kn_set_error(KN_ERR_INVALID, "kn_module_to_backend: %s '%s' is a child; move the root of its tree", m->kind, m->name);
    if (m->ctx == dst) return KN_OK;
    int count = 0;
    kn_status st = move_check(m, &count);
    if (st) return st;
    move_item *items = malloc(sizeof *items * (size_t)(count ? count : 1));
    if (!items) return kn_set_error(KN_ERR_NOMEM, "kn_module_to_backend: out of host memory");
    int n = 0;
    st = move_collect(m, dst, items, &n);
    if (!st) move_commit(m, dst, items, n);
    free(items);
    return st;
}

/* ---- errors ------------------------------------------------------------------------- */
static void path_rec(const kn_module *m, char *buf, size_t n) {
    if (m->parent) {
        path_rec(m->parent, buf, n);
        size_t l = strlen(buf);
        if (l && l < n) snprintf(buf + l, n - l, ".");
        l = strlen(buf);
        if (l < n) snprintf(buf + l, n - l, "%s", m->name);
    }
}
const char *kn__mod_path(const kn_module *m, char *buf, size_t n) {
    char path[256] = "";
    path_rec(m, path, sizeof path);
    if (path[0]) snprintf(buf, n, "%s '%s'", m->kind, path);
    else snprintf(buf, n, "%s", m->kind);
    return buf;
}

kn_tensor *kn__mod_fail(const kn_module *m, const char *fmt, ...) {
    char msg[512], who[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kn__fail(m->ctx, KN_ERR_INVALID, "%s: %s", kn__mod_path(m, who, sizeof who), msg);
}

bool kn__mod_check(const kn_module *m, kn_tensor *x, int lo, int hi, int dim, int64_t want, const char *what) {
    char s[160];
    if (x->ndim < lo || x->ndim > hi) {
        if (lo == hi) kn__mod_fail(m, "expected a %d-d input %s, got %s", lo, what, kn__shape_str(x, s, sizeof s));
        else kn__mod_fail(m, "expected an input with %d to %d dims %s, got %s", lo, hi, what, kn__shape_str(x, s, sizeof s));
        return false;
    }
    if (want >= 0) {
        int d = dim < 0 ? x->ndim + dim : dim;
        if (x->shape[d] != want) {
            kn__mod_fail(m, "input %s has %lld in dim %d, expected %lld (%s)", kn__shape_str(x, s, sizeof s),
                         (long long)x->shape[d], dim, (long long)want, what);
            return false;
        }
    }
    return true;
}

/* ---- initialisers ------------------------------------------------------------------- */
static kn_status init_with(kn_tensor *t, kn_tensor *value) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_init: NULL tensor");
    kn_ctx *ctx = t->ctx;
    if (!value) return ctx->status ? ctx->status : KN_ERR_INVALID;
    if (value->dtype != t->dtype) value = kn_cast(ctx, value, t->dtype);
    kn_no_grad_begin(ctx);
    kn_tensor *a = kn_assign(ctx, t, value);
    kn_no_grad_end(ctx);
    if (!a) return ctx->status ? ctx->status : KN_ERR_INVALID;
    return kn_realize(a);
}

kn_status kn_init_normal(kn_tensor *t, double mean, double std) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_init_normal: NULL tensor");
    return init_with(t, kn_rand_normal(t->ctx, KN_F64, t->ndim, t->shape, mean, std, kn_nn_next_seed()));
}
kn_status kn_init_uniform(kn_tensor *t, double lo, double hi) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_init_uniform: NULL tensor");
    return init_with(t, kn_rand_uniform(t->ctx, KN_F64, t->ndim, t->shape, lo, hi, kn_nn_next_seed()));
}
kn_status kn_init_constant(kn_tensor *t, double v) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_init_constant: NULL tensor");
    return init_with(t, kn_full(t->ctx, t->dtype, t->ndim, t->shape, v));
}
kn_status kn_init_zeros(kn_tensor *t) { return kn_init_constant(t, 0); }
kn_status kn_init_ones(kn_tensor *t) { return kn_init_constant(t, 1); }

void kn_init_fans(const kn_tensor *t, int64_t *fan_in, int64_t *fan_out) {
    int64_t fi = 1, fo = 1;
    if (t && t->ndim == 1) { fi = fo = t->shape[0]; }
    else if (t && t->ndim >= 2) {
        int64_t rf = 1;
        for (int i = 2; i < t->ndim; i++) rf *= t->shape[i];
        fi = t->shape[1] * rf; fo = t->shape[0] * rf;
    }
    if (fan_in) *fan_in = fi;
    if (fan_out) *fan_out = fo;
}

double kn_init_gain(kn_nonlin nl, double param) {
    switch (nl) {
    case KN_NONLIN_RELU: return sqrt(2.0);
    case KN_NONLIN_LEAKY_RELU: return sqrt(2.0 / (1.0 + param * param));
    case KN_NONLIN_TANH: return 5.0 / 3.0;
    default: return 1.0;
    }
}

kn_status kn_init_xavier_uniform(kn_tensor *t, double gain) {
    int64_t fi, fo; kn_init_fans(t, &fi, &fo);
    double a = gain * sqrt(6.0 / (double)(fi + fo));
    return kn_init_uniform(t, -a, a);
}
kn_status kn_init_xavier_normal(kn_tensor *t, double gain) {
    int64_t fi, fo; kn_init_fans(t, &fi, &fo);
    return kn_init_normal(t, 0, gain * sqrt(2.0 / (double)(fi + fo)));
}
kn_status kn_init_kaiming_uniform(kn_tensor *t, double a, kn_nonlin nl, bool mode_fan_out) {
    int64_t fi, fo; kn_init_fans(t, &fi, &fo);
    double bound = kn_init_gain(nl, a) * sqrt(3.0 / (double)(mode_fan_out ? fo : fi));
    return kn_init_uniform(t, -bound, bound);
}
kn_status kn_init_kaiming_normal(kn_tensor *t, double a, kn_nonlin nl, bool mode_fan_out) {
    int64_t fi, fo; kn_init_fans(t, &fi, &fo);
    return kn_init_normal(t, 0, kn_init_gain(nl, a) / sqrt((double)(mode_fan_out ? fo : fi)));
}

kn_status kn_module_load_param(kn_module *m, const char *name, const void *data, kn_dtype as) {
    kn_tensor *t = kn_module_find(m, name);
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_module_load_param: %s has no parameter '%s'", m ? m->kind : "(null)", name ? name : "(null)");
    return kn_tensor_write(t, data, as);
}
