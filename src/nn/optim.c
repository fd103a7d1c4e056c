/* optim.c: optimizers as graph nodes. kn_optim_build() turns each
 * parameter's gradient into new parameter and state values and assigns them
 * (kn_assign effects: the planner runs them after every read), so forward,
 * backward and update are one plan. Host scalars that change per step are
 * 0-d inputs: the step count (i64) and each group's learning rate (f32);
 * kn_optim_prepare() writes them. Derived scalars (bias corrections, step
 * sizes) are computed in f64 inside the graph and cast to the parameter
 * dtype. The update formulas and their operation order follow torch.optim's
 * single-tensor (foreach=False) implementations so results match PyTorch.
 * Also: global-norm gradient clipping (graph ops), gradient accumulation
 * (persistent buffers; see kiln_nn.h), and with a loss scaler the unscaling
 * of the gradients and the skip of an update whose gradients overflowed. */
#include "kiln_dist.h"
#include "core/env.h"
#include "nn-impl.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double lr, wd; kn_tensor *lr_in; } optim_group;
typedef struct {
    kn_tensor *p;
    int group;
    kn_tensor *s[3];             /* state tensors, see state_names               */
} optim_param;

struct kn_optim {
    kn_ctx *ctx;
    kn_optim_cfg cfg;
    optim_group *groups; int n_groups, cap_groups;
    optim_param *ps; int n, cap;
    kn_tensor *step_in;          /* 0-d i64: step count of the run (1-based)     */
    int64_t step;                /* steps prepared so far                        */
    kn_tensor *grad_norm;
    kn_loss_scaler *scaler;      /* dynamic loss scaling (precision.c), or NULL  */
    kn_dist *dist;               /* data parallel: gradients averaged over its ranks (kn_optim_set_dist) */
    size_t bucket_bytes;
    int *owner;                  /* ZeRO-1: by parameter, the rank keeping its state; NULL: every rank */
    bool built;                  /* kn_optim_build ran */
};

/* state slot names per kind */
static const char *state_name(kn_optim_kind k, int slot) {
    switch (k) {
    case KN_OPTIM_SGD: return slot == 0 ? "momentum_buffer" : NULL;
    case KN_OPTIM_ADAM: case KN_OPTIM_ADAMW: return slot == 0 ? "exp_avg" : slot == 1 ? "exp_avg_sq" : NULL;
    case KN_OPTIM_RMSPROP: return slot == 0 ? "square_avg" : slot == 1 ? "momentum_buffer" : slot == 2 ? "grad_avg" : NULL;
    case KN_OPTIM_ADAGRAD: return slot == 0 ? "sum" : NULL;
    }
    return NULL;
}
static bool state_used(const kn_optim_cfg *c, int slot) {
    switch (c->kind) {
    case KN_OPTIM_SGD: return slot == 0 && c->momentum != 0;
    case KN_OPTIM_ADAM: case KN_OPTIM_ADAMW: return slot < 2;
    case KN_OPTIM_RMSPROP: return slot == 0 || (slot == 1 && c->momentum > 0) || (slot == 2 && c->centered);
    case KN_OPTIM_ADAGRAD: return slot == 0;
    }
    return false;
}

kn_optim_cfg kn_optim_defaults(kn_optim_kind kind) {
    kn_optim_cfg c = {.kind = kind, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .alpha = 0.99};
    switch (kind) {
    case KN_OPTIM_SGD: c.lr = 1e-3; break;
    case KN_OPTIM_ADAMW: c.weight_decay = 0.01; break;
    case KN_OPTIM_RMSPROP: c.lr = 1e-2; break;
    case KN_OPTIM_ADAGRAD: c.lr = 1e-2; c.eps = 1e-10; break;
    default: break;
    }
    return c;
}

static bool cfg_ok(kn_ctx *ctx, const kn_optim_cfg *c) {
    const char *why = NULL;
    if ((int)c->kind < 0 || c->kind > KN_OPTIM_ADAGRAD) why = "unknown optimizer kind";
    else if (!(c->lr >= 0)) why = "lr must be >= 0";
    else if (!(c->weight_decay >= 0)) why = "weight_decay must be >= 0";
    else if (!(c->momentum >= 0)) why = "momentum must be >= 0";
    else if (c->nesterov && (c->momentum <= 0 || c->dampening != 0)) why = "nesterov needs momentum > 0 and dampening 0";
    else if ((c->kind == KN_OPTIM_ADAM || c->kind == KN_OPTIM_ADAMW) && !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
        why = "betas must be in [0, 1)";
    else if (!(c->eps >= 0)) why = "eps must be >= 0";
    else if (c->kind == KN_OPTIM_RMSPROP && !(c->alpha >= 0)) why = "alpha must be >= 0";
    else if (!(c->clip_norm >= 0)) why = "clip_norm must be >= 0 (0 = off)";
    if (why) { kn__fail(ctx, KN_ERR_INVALID, "optimizer: %s", why); return false; }
    return true;
}

kn_optim *kn_optim_new_empty(kn_ctx *ctx, const kn_optim_cfg *cfg) {
    if (!ctx) return NULL;
    if (!cfg) { kn__fail(ctx, KN_ERR_INVALID, "optimizer: NULL config (use kn_optim_defaults)"); return NULL; }
    if (!cfg_ok(ctx, cfg)) return NULL;
    kn_optim *o = calloc(1, sizeof *o);
    if (!o) { kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return NULL; }
    o->ctx = ctx;
    o->cfg = *cfg;
    o->step_in = kn_input(ctx, KN_I64, 0, NULL);
    if (!o->step_in) { free(o); return NULL; }
    kn_set_name(o->step_in, "optim.step");
    return o;
}

void kn_optim_free(kn_optim *o) {
    if (!o) return;
    if (o->scaler && o->scaler->opt == o) o->scaler->opt = NULL;
    free(o->groups);
    free(o->ps);
    free(o->owner);
    free(o);
}

int kn_optim_add_group(kn_optim *o, int n, kn_tensor *const *params, double lr, double wd) {
    if (!o) return -1;
    kn_ctx *ctx = o->ctx;
    if (n < 0 || (n > 0 && !params) || !(lr >= 0) || !(wd >= 0)) { kn__fail(ctx, KN_ERR_INVALID, "optimizer group: bad count %d, lr %g or weight decay %g", n, lr, wd); return -1; }
    for (int i = 0; i < n; i++) {
        kn_tensor *p = params[i];
        if (!p || p->op != KN_OP_NONE || !p->buf || !kn_dtype_get(p->dtype)->is_float || kn_dtype_get(p->dtype)->is_quant) {
            kn__fail(ctx, KN_ERR_INVALID, "optimizer group: parameter %d must be a materialised float leaf (kn_param)", i);
            return -1;
        }
        for (int j = 0; j < o->n; j++)
            if (o->ps[j].p == p) { kn__fail(ctx, KN_ERR_INVALID, "optimizer group: parameter '%s' is already in group %d", p->name, o->ps[j].group); return -1; }
        for (int j = 0; j < i; j++)
            if (params[j] == p) { kn__fail(ctx, KN_ERR_INVALID, "optimizer group: parameter '%s' is listed twice", p->name); return -1; }
    }
    if (o->n_groups == o->cap_groups) {
        int cap = o->cap_groups ? 2 * o->cap_groups : 4;
        optim_group *g = realloc(o->groups, sizeof *g * (size_t)cap);
        if (!g) { kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return -1; }
        o->groups = g; o->cap_groups = cap;
    }
    if (o->n + n > o->cap) {
        int cap = o->cap ? o->cap : 16;
        while (cap < o->n + n) cap *= 2;
        optim_param *ps = realloc(o->ps, sizeof *ps * (size_t)cap);
        if (!ps) { kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return -1; }
        o->ps = ps; o->cap = cap;
    }
    int gi = o->n_groups;
    optim_group *g = &o->groups[gi];
    g->lr = lr; g->wd = wd;
    g->lr_in = kn_input(ctx, KN_F32, 0, NULL);
    if (!g->lr_in) return -1;
    kn_set_name(g->lr_in, "optim.lr");
    for (int i = 0; i < n; i++) {
        optim_param *q = &o->ps[o->n];
        memset(q, 0, sizeof *q);
        q->p = params[i]; q->group = gi;
        for (int s = 0; s < 3; s++) {
            if (!state_used(&o->cfg, s)) continue;
            q->s[s] = kn_empty(ctx, KN_F32, q->p->ndim, q->p->shape);
            double init = (o->cfg.kind == KN_OPTIM_ADAGRAD) ? o->cfg.initial_accumulator_value : 0.0;
            if (!q->s[s] || kn_init_constant(q->s[s], init)) return -1;
            kn_set_name(q->s[s], state_name(o->cfg.kind, s));
        }
        o->n++;
    }
    o->n_groups++;
    return gi;
}

kn_optim *kn_optim_new(kn_ctx *ctx, kn_module *m, const kn_optim_cfg *cfg) {
    kn_optim *o = kn_optim_new_empty(ctx, cfg);
    if (!o) return NULL;
    int n = kn_module_named_params(m, false, NULL, 0);
    kn_named_param *ps = malloc(sizeof *ps * (size_t)(n ? n : 1));
    kn_tensor **ts = malloc(sizeof *ts * (size_t)(n ? n : 1));
    int gi = -1;
    if (ps && ts) {
        kn_module_named_params(m, false, ps, n);
        for (int i = 0; i < n; i++) ts[i] = ps[i].t;
        gi = kn_optim_add_group(o, n, ts, cfg->lr, cfg->weight_decay);
    }
    free(ps); free(ts);
    if (gi < 0) { kn_optim_free(o); return NULL; }
    return o;
}

kn_optim *kn_optim_new_decay_groups(kn_ctx *ctx, kn_module *m, const kn_optim_cfg *cfg) {
    kn_optim *o = kn_optim_new_empty(ctx, cfg);
    if (!o) return NULL;
    int n = kn_module_named_params(m, false, NULL, 0);
    kn_named_param *ps = malloc(sizeof *ps * (size_t)(n ? n : 1));
    kn_tensor **dec = malloc(sizeof *dec * (size_t)(n ? n : 1)), **nod = malloc(sizeof *nod * (size_t)(n ? n : 1));
    int nd = 0, nn = 0, g1 = -1, g2 = -1;
    if (ps && dec && nod) {
        kn_module_named_params(m, false, ps, n);
        for (int i = 0; i < n; i++) {
            if (ps[i].no_decay || ps[i].t->ndim < 2) nod[nn++] = ps[i].t;
            else dec[nd++] = ps[i].t;
        }
        g1 = kn_optim_add_group(o, nd, dec, cfg->lr, cfg->weight_decay);
        if (g1 >= 0) g2 = kn_optim_add_group(o, nn, nod, cfg->lr, 0.0);
    }
    free(ps); free(dec); free(nod);
    if (g1 < 0 || g2 < 0) { kn_optim_free(o); return NULL; }
    return o;
}

/* ---- the update as graph nodes ------------------------------------------------------ */
typedef struct { kn_tensor **out; int max, n; bool ok; kn_tensor *skip; } effects;
static void emit(effects *e, kn_tensor *t) {
    if (!t) { e->ok = false; return; }
    if (e->n < e->max) e->out[e->n] = t;
    else e->ok = false;
    e->n++;
}
/* dst's next value: v, or with a loss scaler skip ? dst : v: an overflowed
 * step leaves parameters and state as they were (v may hold inf/nan then;
 * where does not propagate the branch it does not pick). */
static kn_tensor *next_value(kn_ctx *ctx, const effects *e, kn_tensor *dst, kn_tensor *v) {
    return e->skip ? kn_where(ctx, e->skip, dst, v) : v;
}
static kn_tensor *update(kn_ctx *ctx, const effects *e, kn_tensor *dst, kn_tensor *v) {
    return kn_assign(ctx, dst, next_value(ctx, e, dst, v));
}

/* With a loss scaler: g[i] *= 1/scale (f32, exact: scales are powers of 2
 * unless the caller sets another), and the overflow verdict: true when some
 * unscaled gradient element is inf or nan. One reduction per gradient, the
 * f32 sum of |g| (an inf or nan element makes it inf or nan), added up and
 * tested once: !(total < inf). It also trips when finite gradients sum past
 * 3.4e38, a step that should not be taken either. The verdict is written to
 * the scaler's found_inf (one effect) for the host to read after the run.
 * Returns the 0-d bool verdict. */
static kn_tensor *unscale(kn_optim *o, kn_tensor **g, effects *e) {
    kn_ctx *ctx = o->ctx;
    kn_loss_scaler *s = o->scaler;
    kn_tensor *inv = kn_reciprocal(ctx, s->scale_in), *total = kn_scalar(ctx, KN_F32, 0);
    for (int i = 0; i < o->n; i++) {
        if (!g[i]) continue;
        g[i] = kn_mul(ctx, g[i], kn_cast(ctx, inv, g[i]->dtype));
        total = kn_add(ctx, total, kn_cast(ctx, kn_sum_all(ctx, kn_abs(ctx, g[i])), KN_F32));
    }
    kn_tensor *bad = kn_logical_not(ctx, kn_lt(ctx, total, kn_scalar(ctx, KN_F32, INFINITY)));
    emit(e, kn_assign(ctx, s->found_inf, kn_cast(ctx, bad, KN_F32)));
    return bad;
}

/* f64 scalar -> a 0-d tensor of dtype dt */
static kn_tensor *as(kn_ctx *ctx, kn_tensor *s, kn_dtype dt) { return kn_cast(ctx, s, dt); }
static kn_tensor *c64(kn_ctx *ctx, double v) { return kn_scalar(ctx, KN_F64, v); }

/* The fused Adam update's coefficients for a group, in dtype dt: [decay
 * multiplier (1 - lr wd for AdamW, else 1), lr / (1 - b1^t), sqrt(1 - b2^t)],
 * each computed in f64 and cast, exactly as the composite update's scalars.
 * Cached per (group, dtype) in cache[group * KN_DTYPE_COUNT + dt] while one
 * update is built. */
static kn_tensor *adam_coefs(kn_optim *o, kn_tensor **cache, int group, kn_dtype dt, kn_tensor *lr64, kn_tensor *t) {
    kn_ctx *ctx = o->ctx;
    const kn_optim_cfg *c = &o->cfg;
    kn_tensor **slot = &cache[(size_t)group * KN_DTYPE_COUNT + dt];
    if (*slot) return *slot;
    const optim_group *gr = &o->groups[group];
    kn_tensor *one = c64(ctx, 1);
    kn_tensor *dec = (c->kind == KN_OPTIM_ADAMW && gr->wd != 0) ? kn_sub(ctx, one, kn_mul_scalar(ctx, lr64, gr->wd)) : one;
    kn_tensor *bc1 = kn_sub(ctx, one, kn_pow(ctx, c64(ctx, c->beta1), t));
    kn_tensor *bc2 = kn_sub(ctx, one, kn_pow(ctx, c64(ctx, c->beta2), t));
    int64_t one_d[1] = {1};
    kn_tensor *parts[3] = {kn_reshape(ctx, dec, 1, one_d), kn_reshape(ctx, kn_div(ctx, lr64, bc1), 1, one_d),
                           kn_reshape(ctx, kn_sqrt(ctx, bc2), 1, one_d)};
    return *slot = kn_cast(ctx, kn_cat(ctx, parts, 3, 0), dt);
}

/* Data parallel (kn_optim_set_dist): every gradient becomes its average over
 * the ranks, as PyTorch's DDP does. Gradients go into buckets of about
 * bucket_bytes, last parameters first, each bucket one all_reduce over its
 * flattened gradients concatenated (a gradient alone in its bucket is
 * reduced where it lies). Where the all_reduces land: the schedule is
 * graph.c's depth-first order from the updates, in parameter order, so the
 * backward pass's activation gradients come first and then the weight
 * gradients bucket by bucket (first layers first), each bucket's all_reduce
 * right after its own; on the CUDA backend it runs on its own stream beside
 * the weight gradients still to come (cuda_dist.cu). Emitting the updates in
 * bucket order instead was tried: it reorders the whole backward pass, and
 * on the GPU fusion then found far fewer groups (a GPT-2 step 40% slower). */
static bool dist_average(kn_optim *o, kn_tensor **g) {
    kn_ctx *ctx = o->ctx;
    size_t cap = o->bucket_bytes ? o->bucket_bytes : (size_t)25 << 20;
    const char *env = kn_env_get()->ddp_bucket_kb;     /* 0: one all_reduce per gradient */
    if (env) cap = (size_t)strtoull(env, NULL, 10) << 10;
    int *mem = malloc(sizeof *mem * (size_t)(o->n ? o->n : 1));
    kn_tensor **parts = malloc(sizeof *parts * (size_t)(o->n ? o->n : 1));
    if (!mem || !parts) { free(mem); free(parts); kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return false; }
    bool ok = true;
    for (int i = o->n - 1; i >= 0 && ok;) {
        if (!g[i]) { i--; continue; }
        kn_dtype dt = g[i]->dtype;
        int nm = 0;
        size_t bytes = 0;
        for (; i >= 0; i--) {
            if (!g[i]) continue;
            size_t b = kn_dtype_nbytes(g[i]->dtype, kn_numel(g[i]));
            if (g[i]->dtype != dt || (nm > 0 && bytes + b > cap)) break;
            mem[nm++] = i;
            bytes += b;
        }
        for (int k = 0; k < nm; k++) {
            kn_tensor *x = g[mem[k]];
            int64_t n = kn_numel(x);
            parts[k] = kn_reshape(ctx, kn_is_contiguous(x) ? x : kn_contiguous(ctx, x), 1, &n);
        }
        if (nm == 1) {       /* alone in its bucket: reduced where it lies, in its own shape */
            kn_tensor *x = g[mem[0]];
            g[mem[0]] = kn_all_reduce(ctx, kn_is_contiguous(x) ? x : kn_contiguous(ctx, x), o->dist, KN_DIST_AVG);
            if (!g[mem[0]]) ok = false;
            continue;
        }
        kn_tensor *bucket = kn_cat(ctx, parts, nm, 0);
        kn_tensor *avg = kn_all_reduce(ctx, bucket, o->dist, KN_DIST_AVG);
        if (!avg) { ok = false; break; }
        int64_t off = 0;
        for (int k = 0; k < nm; k++) {
            kn_tensor *x = g[mem[k]];
            int64_t n = kn_numel(x);
            g[mem[k]] = kn_reshape(ctx, kn_slice(ctx, avg, 0, off, off + n, 1), x->ndim, x->shape);
            if (!g[mem[k]]) ok = false;
            off += n;
        }
    }
    free(mem); free(parts);
    return ok;
}

kn_status kn_optim_set_dist(kn_optim *o, kn_dist *d, size_t bucket_bytes) {
    if (!o) return kn_set_error(KN_ERR_INVALID, "kn_optim_set_dist: optimizer is NULL");
    o->dist = d;
    o->bucket_bytes = bucket_bytes;
    return KN_OK;
}

/* ZeRO-1: owners by size, largest parameter first to the least loaded rank
 * (ties: the lower index, the lower rank), the same on every rank; the
 * states of the others' parameters are freed here. */
kn_status kn_optim_set_zero1(kn_optim *o, bool on) {
    if (!o) return kn_set_error(KN_ERR_INVALID, "kn_optim_set_zero1: optimizer is NULL");
    if (o->built) return kn_set_error(KN_ERR_STATE, "kn_optim_set_zero1: call it before kn_optim_build");
    if (!on) {
        if (o->owner) return kn_set_error(KN_ERR_STATE, "kn_optim_set_zero1: the states are already sharded; make a new optimizer");
        return KN_OK;
    }
    if (!o->dist) return kn_set_error(KN_ERR_STATE, "kn_optim_set_zero1: no communicator; call kn_optim_set_dist first");
    if (o->owner) return KN_OK;
    int W = kn_dist_world(o->dist), me = kn_dist_rank(o->dist);
    int *own = malloc(sizeof *own * (size_t)(o->n ? o->n : 1)), *order = malloc(sizeof *order * (size_t)(o->n ? o->n : 1));
    int64_t *load = calloc((size_t)W, sizeof *load);
    if (!own || !order || !load) { free(own); free(order); free(load); return kn_set_error(KN_ERR_NOMEM, "kn_optim_set_zero1: out of memory"); }
    for (int i = 0; i < o->n; i++) order[i] = i;
    for (int i = 1; i < o->n; i++) {            /* by numel, descending; stable */
        int v = order[i], j = i;
        for (; j > 0 && kn_numel(o->ps[order[j - 1]].p) < kn_numel(o->ps[v].p); j--) order[j] = order[j - 1];
        order[j] = v;
    }
    for (int k = 0; k < o->n; k++) {
        int r = 0;
        for (int q = 1; q < W; q++) if (load[q] < load[r]) r = q;
        own[order[k]] = r;
        load[r] += kn_numel(o->ps[order[k]].p);
    }
    free(order); free(load);
    for (int i = 0; i < o->n; i++) {
        if (own[i] == me) continue;
        for (int s = 0; s < 3; s++) {
            kn_tensor *t = o->ps[i].s[s];
            if (!t) continue;
            kn_buffer_release(t->buf);          /* the header stays in the context, without storage */
            t->buf = NULL;
            o->ps[i].s[s] = NULL;
        }
    }
    o->owner = own;
    return KN_OK;
}
kn_dist *kn_optim_get_dist(const kn_optim *o) { return o ? o->dist : NULL; }
int kn_optim_state_owner(const kn_optim *o, int i) { return o && o->owner && i >= 0 && i < o->n ? o->owner[i] : -1; }
int kn_optim_state_names(const kn_optim *o, const char **names, int max) {
    int n = 0;
    for (int s = 0; o && s < 3; s++) {
        if (!state_used(&o->cfg, s)) continue;
        if (names && n < max) names[n] = state_name(o->cfg.kind, s);
        n++;
    }
    return n;
}

int kn_optim_build(kn_optim *o, kn_tensor *const *grads, kn_tensor **out, int max) {
    if (!o) return -1;
    kn_ctx *ctx = o->ctx;
    const kn_optim_cfg *c = &o->cfg;
    effects e = {out, max, 0, true};
    kn_no_grad_begin(ctx);
    /* gradients, optionally clipped by the global norm */
    kn_tensor **g = calloc((size_t)(o->n ? o->n : 1), sizeof *g);
    if (!g) { kn_no_grad_end(ctx); kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return -1; }
    for (int i = 0; i < o->n; i++) {
        g[i] = grads ? grads[i] : kn_grad(o->ps[i].p);
        if (g[i] && !kn_same_shape(g[i], o->ps[i].p)) {
            kn_no_grad_end(ctx); free(g);
            kn__fail(ctx, KN_ERR_INVALID, "optimizer: gradient %d does not have its parameter's shape", i);
            return -1;
        }
        if (g[i]) g[i] = kn_detach(ctx, g[i]);
    }
    o->grad_norm = NULL;
    if (o->dist && !dist_average(o, g)) {
        kn_no_grad_end(ctx); free(g);
        return -1;
    }
    /* ZeRO-1: past this point the ranks' graphs differ (an owner's update,
     * the others' receive), yet every rank must issue its collectives in
     * the same order. A [1] output that reads one element of every averaged
     * gradient, emitted first, puts all the gradients' all_reduces ahead of
     * the first broadcast, in parameter order, on every rank (the schedule
     * is the depth-first order from the outputs, schedule.c). */
    if (o->owner) {
        kn_tensor *anchor = NULL;
        for (int i = 0; i < o->n; i++) {
            if (!g[i]) continue;
            int64_t n = kn_numel(g[i]);
            kn_tensor *one = kn_cast(ctx, kn_narrow(ctx, kn_reshape(ctx, g[i], 1, &n), 0, 0, 1), KN_F32);
            anchor = anchor ? kn_add(ctx, anchor, one) : one;
        }
        if (anchor) emit(&e, anchor);
    }
    if (o->scaler) e.skip = unscale(o, g, &e);
    if (c->clip_norm > 0) {
        kn_tensor *ss = NULL;
        for (int i = 0; i < o->n; i++) {
            if (!g[i]) continue;
            kn_tensor *s = kn_sum_all(ctx, kn_square(ctx, kn_cast(ctx, g[i], KN_F64)));
            ss = ss ? kn_add(ctx, ss, s) : s;
        }
        if (ss) {
            o->grad_norm = kn_sqrt(ctx, ss);                                   /* f64 0-d */
            kn_tensor *coef = kn_minimum(ctx, kn_div(ctx, c64(ctx, c->clip_norm), kn_add_scalar(ctx, o->grad_norm, 1e-6)), c64(ctx, 1.0));
            for (int i = 0; i < o->n; i++) if (g[i]) g[i] = kn_mul(ctx, g[i], as(ctx, coef, g[i]->dtype));
        }
    }
    kn_tensor *t = kn_cast(ctx, o->step_in, KN_F64);                             /* step (1-based) */
    kn_tensor **coefs = calloc((size_t)(o->n_groups ? o->n_groups : 1) * KN_DTYPE_COUNT, sizeof *coefs);
    if (!coefs) { kn_no_grad_end(ctx); free(g); kn__fail(ctx, KN_ERR_NOMEM, "optimizer: out of memory"); return -1; }
    for (int i = 0; i < o->n; i++) {
        optim_param *q = &o->ps[i];
        const optim_group *gr = &o->groups[q->group];
        kn_tensor *p = q->p, *gi = g[i];
        if (!gi) continue;                                      /* unused parameter: no update, like torch */
        /* ZeRO-1: the owner updates p and sends its new values; the other
         * ranks take them (p itself is what they hand the broadcast) */
        int own = o->owner ? o->owner[i] : -1;
        if (own >= 0 && own != kn_dist_rank(o->dist)) {
            emit(&e, kn_assign(ctx, p, kn_broadcast(ctx, p, o->dist, own)));
            continue;
        }
        kn_dtype dt = p->dtype;
        if (gi->dtype != dt) gi = kn_cast(ctx, gi, dt);
        kn_tensor *lr64 = kn_cast(ctx, gr->lr_in, KN_F64);
        kn_tensor *pn = NULL;
        switch (c->kind) {
        case KN_OPTIM_SGD: {
            if (gr->wd != 0) gi = kn_add(ctx, gi, kn_mul_scalar(ctx, p, gr->wd));
            if (c->momentum != 0) {
                /* first step: buf = g; then buf = momentum*buf + (1-dampening)*g */
                kn_tensor *first = kn_eq(ctx, t, c64(ctx, 1));
                kn_tensor *a = as(ctx, kn_where(ctx, first, c64(ctx, 0), c64(ctx, c->momentum)), dt);
                kn_tensor *b = as(ctx, kn_where(ctx, first, c64(ctx, 1), c64(ctx, 1 - c->dampening)), dt);
                kn_tensor *buf = kn_add(ctx, kn_mul(ctx, q->s[0], a), kn_mul(ctx, gi, b));
                emit(&e, update(ctx, &e, q->s[0], buf));
                gi = c->nesterov ? kn_add(ctx, gi, kn_mul_scalar(ctx, buf, c->momentum)) : buf;
            }
            pn = kn_sub(ctx, p, kn_mul(ctx, gi, as(ctx, lr64, dt)));
            break;
        }
        case KN_OPTIM_ADAM: case KN_OPTIM_ADAMW: {
            if (!c->unfused && !e.skip) {
                /* one fused node: coefficients [decay, lr / bc1, sqrt(bc2)] once per group and dtype */
                kn_tensor *cf = adam_coefs(o, coefs, q->group, dt, lr64, t);
                double l2 = c->kind == KN_OPTIM_ADAM ? gr->wd : 0;
                kn_tensor *up = kn__adam_update(ctx, p, gi, q->s[0], q->s[1], cf, c->beta1, c->beta2, c->eps, l2);
                emit(&e, own >= 0 ? kn_assign(ctx, p, kn_broadcast(ctx, up, o->dist, own)) : up);   /* up: p updated */
                continue;
            }
            kn_tensor *pp = p;
            if (gr->wd != 0) {
                if (c->kind == KN_OPTIM_ADAMW)
                    pp = kn_mul(ctx, p, as(ctx, kn_sub(ctx, c64(ctx, 1), kn_mul_scalar(ctx, lr64, gr->wd)), dt));
                else gi = kn_add(ctx, gi, kn_mul_scalar(ctx, p, gr->wd));
            }
            /* exp_avg.lerp_(g, 1-b1) (torch's form for weight < 0.5); exp_avg_sq*b2 + (1-b2) g^2 */
            kn_tensor *m = kn_add(ctx, q->s[0], kn_mul_scalar(ctx, kn_sub(ctx, gi, q->s[0]), 1 - c->beta1));
            kn_tensor *v = kn_add(ctx, kn_mul_scalar(ctx, q->s[1], c->beta2), kn_mul_scalar(ctx, kn_mul(ctx, gi, gi), 1 - c->beta2));
            emit(&e, update(ctx, &e, q->s[0], m));
            emit(&e, update(ctx, &e, q->s[1], v));
            kn_tensor *bc1 = kn_sub(ctx, c64(ctx, 1), kn_pow(ctx, c64(ctx, c->beta1), t));
            kn_tensor *bc2 = kn_sub(ctx, c64(ctx, 1), kn_pow(ctx, c64(ctx, c->beta2), t));
            kn_tensor *step_size = as(ctx, kn_div(ctx, lr64, bc1), dt);
            kn_tensor *denom = kn_add_scalar(ctx, kn_div(ctx, kn_sqrt(ctx, v), as(ctx, kn_sqrt(ctx, bc2), dt)), c->eps);
            pn = kn_sub(ctx, pp, kn_mul(ctx, kn_div(ctx, m, denom), step_size));
            break;
        }
        case KN_OPTIM_RMSPROP: {
            if (gr->wd != 0) gi = kn_add(ctx, gi, kn_mul_scalar(ctx, p, gr->wd));
            kn_tensor *sq = kn_add(ctx, kn_mul_scalar(ctx, q->s[0], c->alpha), kn_mul_scalar(ctx, kn_mul(ctx, gi, gi), 1 - c->alpha));
            emit(&e, update(ctx, &e, q->s[0], sq));
            kn_tensor *avg;
            if (c->centered) {
                kn_tensor *ga = kn_add(ctx, q->s[2], kn_mul_scalar(ctx, kn_sub(ctx, gi, q->s[2]), 1 - c->alpha));
                emit(&e, update(ctx, &e, q->s[2], ga));
                avg = kn_sqrt(ctx, kn_sub(ctx, sq, kn_mul(ctx, ga, ga)));
            } else avg = kn_sqrt(ctx, sq);
            avg = kn_add_scalar(ctx, avg, c->eps);
            kn_tensor *lr = as(ctx, lr64, dt);
            if (c->momentum > 0) {
                kn_tensor *buf = kn_add(ctx, kn_mul_scalar(ctx, q->s[1], c->momentum), kn_div(ctx, gi, avg));
                emit(&e, update(ctx, &e, q->s[1], buf));
                pn = kn_sub(ctx, p, kn_mul(ctx, buf, lr));
            } else pn = kn_sub(ctx, p, kn_mul(ctx, kn_div(ctx, gi, avg), lr));
            break;
        }
        case KN_OPTIM_ADAGRAD: {
            if (gr->wd != 0) gi = kn_add(ctx, gi, kn_mul_scalar(ctx, p, gr->wd));
            kn_tensor *clr = kn_div(ctx, lr64, kn_add_scalar(ctx, kn_mul_scalar(ctx, kn_add_scalar(ctx, t, -1), c->lr_decay), 1));
            kn_tensor *sum = kn_add(ctx, q->s[0], kn_mul(ctx, gi, gi));
            emit(&e, update(ctx, &e, q->s[0], sum));
            kn_tensor *std = kn_add_scalar(ctx, kn_sqrt(ctx, sum), c->eps);
            pn = kn_sub(ctx, p, kn_mul(ctx, kn_div(ctx, gi, std), as(ctx, clr, dt)));
            break;
        }
        }
        if (own >= 0) emit(&e, kn_assign(ctx, p, kn_broadcast(ctx, next_value(ctx, &e, p, pn), o->dist, own)));
        else emit(&e, update(ctx, &e, p, pn));
    }
    o->built = true;
    kn_no_grad_end(ctx);
    free(g);
    free(coefs);
    if (!e.ok) {
        if (e.n > max) kn__fail(ctx, KN_ERR_LIMIT, "kn_optim_build: %d update effects but room for %d in out[]", e.n, max);
        else if (!ctx->status) kn__fail(ctx, KN_ERR_INVALID, "kn_optim_build: building the update failed: %s", kn_last_error());
        return -1;
    }
    return e.n;
}

kn_tensor *kn_optim_grad_norm(const kn_optim *o) { return o ? o->grad_norm : NULL; }

kn_status kn_optim_set_loss_scaler(kn_optim *o, kn_loss_scaler *s) {
    if (!o || !s) return kn_set_error(KN_ERR_INVALID, "kn_optim_set_loss_scaler: NULL optimizer or scaler");
    if (s->ctx != o->ctx) return kn_set_error(KN_ERR_INVALID, "kn_optim_set_loss_scaler: the scaler and the optimizer are in different contexts");
    if (s->opt && s->opt != o) return kn_set_error(KN_ERR_STATE, "kn_optim_set_loss_scaler: the scaler already belongs to another optimizer");
    o->scaler = s;
    s->opt = o;
    return KN_OK;
}
kn_loss_scaler *kn_optim_loss_scaler(const kn_optim *o) { return o ? o->scaler : NULL; }

void kn_optim_set_lr(kn_optim *o, int group, double lr) {
    if (!o) return;
    for (int i = 0; i < o->n_groups; i++) if (group < 0 || group == i) o->groups[i].lr = lr;
}
double kn_optim_get_lr(const kn_optim *o, int group) {
    return (o && group >= 0 && group < o->n_groups) ? o->groups[group].lr : NAN;
}

kn_status kn_optim_prepare(kn_optim *o) {
    if (!o) return kn_set_error(KN_ERR_INVALID, "kn_optim_prepare: NULL optimizer");
    int64_t s = o->step + 1;
    kn_status st = kn_tensor_write(o->step_in, &s, KN_I64);
    for (int i = 0; i < o->n_groups && !st; i++) {
        float lr = (float)o->groups[i].lr;
        st = kn_tensor_write(o->groups[i].lr_in, &lr, KN_F32);
    }
    if (!st && o->scaler) st = kn__loss_scaler_write(o->scaler);
    if (!st) o->step = s;
    return st;
}

int64_t kn_optim_step_count(const kn_optim *o) { return o ? o->step : 0; }
kn_status kn_optim_set_step_count(kn_optim *o, int64_t step) {
    if (!o || step < 0) return kn_set_error(KN_ERR_INVALID, "kn_optim_set_step_count: NULL optimizer or negative step");
    o->step = step;
    return KN_OK;
}
int kn_optim_n_params(const kn_optim *o) { return o ? o->n : 0; }
kn_tensor *kn_optim_param(const kn_optim *o, int i) { return (o && i >= 0 && i < o->n) ? o->ps[i].p : NULL; }
kn_tensor *kn_optim_state(const kn_optim *o, int i, const char *name) {
    if (!o || i < 0 || i >= o->n || !name) return NULL;
    for (int s = 0; s < 3; s++) {
        const char *nm = state_name(o->cfg.kind, s);
        if (nm && !strcmp(nm, name)) return o->ps[i].s[s];
    }
    return NULL;
}

/* ---- gradient accumulation ------------------------------------------------------------ */
struct kn_grad_accum { kn_ctx *ctx; kn_optim *o; kn_tensor **buf; int n; };

kn_grad_accum *kn_grad_accum_new(kn_ctx *ctx, kn_optim *o) {
    if (!ctx || !o) return NULL;
    kn_grad_accum *a = calloc(1, sizeof *a);
    if (a) a->buf = calloc((size_t)(o->n ? o->n : 1), sizeof *a->buf);
    if (!a || !a->buf) { free(a); kn__fail(ctx, KN_ERR_NOMEM, "grad_accum: out of memory"); return NULL; }
    a->ctx = ctx; a->o = o; a->n = o->n;
    for (int i = 0; i < o->n; i++) {
        kn_tensor *p = o->ps[i].p;
        a->buf[i] = kn_empty(ctx, p->dtype, p->ndim, p->shape);
        if (!a->buf[i] || kn_init_zeros(a->buf[i])) { kn_grad_accum_free(a); return NULL; }
        kn_set_name(a->buf[i], "grad_accum");
    }
    return a;
}

int kn_grad_accum_add(kn_grad_accum *a, double scale, kn_tensor **out, int max) {
    if (!a) return -1;
    effects e = {out, max, 0, true};
    kn_no_grad_begin(a->ctx);
    for (int i = 0; i < a->n; i++) {
        kn_tensor *g = kn_grad(a->o->ps[i].p);
        if (!g) continue;
        emit(&e, kn_assign(a->ctx, a->buf[i], kn_add(a->ctx, a->buf[i], kn_mul_scalar(a->ctx, kn_detach(a->ctx, g), scale))));
    }
    kn_no_grad_end(a->ctx);
    if (!e.ok) { kn__fail(a->ctx, KN_ERR_LIMIT, "kn_grad_accum_add: %d effects, room for %d (or an op failed: %s)", e.n, max, kn_last_error()); return -1; }
    return e.n;
}
kn_tensor *const *kn_grad_accum_buffers(const kn_grad_accum *a) { return a ? a->buf : NULL; }
int kn_grad_accum_zero(kn_grad_accum *a, kn_tensor **out, int max) {
    if (!a) return -1;
    effects e = {out, max, 0, true};
    for (int i = 0; i < a->n; i++) emit(&e, kn_assign(a->ctx, a->buf[i], kn_zeros_like(a->ctx, a->buf[i])));
    if (!e.ok) { kn__fail(a->ctx, KN_ERR_LIMIT, "kn_grad_accum_zero: %d effects, room for %d", e.n, max); return -1; }
    return e.n;
}
void kn_grad_accum_free(kn_grad_accum *a) {
    if (!a) return;
    free(a->buf);
    free(a);
}
