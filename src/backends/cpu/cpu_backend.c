/* cpu_backend.c: the fast CPU backend.
 *
 * Ops with a fast path (f32 data in the layouts below) run on the SIMD
 * kernels (vec.h, gemm.h) split over the thread pool; every other case falls
 * back to the reference kernels, so the backend always covers every op.
 * Each fast path states the layout it needs; the predicate is checked per
 * node at run time (extents can change with symbolic sizes).
 *
 * Non-goals (for now): fusing nodes, f16/bf16 arithmetic (those go through
 * the reference kernels), strided elementwise fast paths.
 */
#include "backends/backend_impl.h"
#include "core/env.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/threadpool.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_nn.h"
#include "backends/cpu/vec.h"
#include "backends/quant/quant.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { kn_rows_fn fn; void *ctx; int64_t rows; } par_job;
static void par_worker(void *p, int ith, int nth) {
    par_job *j = p;
    int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    if (r1 > r0) j->fn(j->ctx, r0, r1);
}
void kn_cpu_par_rows(kn_rows_fn fn, void *ctx, int64_t rows, int64_t work) {
    if (rows <= 0) return;
    int nt = kn_pool_nthreads();
    if (work < KN_CPU_PAR_MIN || rows < 2 || nt < 2) { fn(ctx, 0, rows); return; }
    /* a few parts per thread: parts are claimed as threads come free, so a
     * thread that is descheduled (busy machine) delays only its own part */
    int64_t parts = (int64_t)nt * 4 < rows ? (int64_t)nt * 4 : rows;
    par_job j = {fn, ctx, rows};
    kn_pool_run(par_worker, &j, (int)parts);
}
#define par_rows kn_cpu_par_rows

static bool is_f32(const kn_tview *v) { return v->dtype == KN_F32; }
static bool contig(const kn_tview *v) { return kn_tview_is_contiguous(v); }

/* ---- elementwise -------------------------------------------------------------- */
typedef struct { int kind; kn_vec_unary_op uop; kn_op bop; float *y; const float *a, *b; float s; int64_t n, blen; } ew_job;
enum { EW_UNARY, EW_BIN_SAME, EW_BIN_ROW, EW_BIN_SCALAR };

/* rows here are chunks of 4096 elements (or rows of blen for row broadcast) */
static void ew_rows(void *p, int64_t r0, int64_t r1) {
    ew_job *j = p;
    int64_t L = j->kind == EW_BIN_ROW ? j->blen : 4096;
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r * L, n = (o + L <= j->n) ? L : j->n - o;
        float *y = j->y + o;
        const float *a = j->a + o;
        const float *b = j->kind == EW_BIN_ROW ? j->b : j->b ? j->b + o : NULL;
        switch (j->kind) {
        case EW_UNARY: kn_vec_unary(j->uop, y, a, n); break;
        case EW_BIN_SCALAR:
            if (j->bop == KN_OP_ADD) kn_vec_add_scalar(y, a, j->s, n);
            else if (j->bop == KN_OP_SUB) kn_vec_add_scalar(y, a, -j->s, n);
            else kn_vec_mul_scalar(y, a, j->s, n);
            break;
        default:
            switch (j->bop) {
            case KN_OP_ADD: kn_vec_add(y, a, b, n); break;
            case KN_OP_SUB: kn_vec_sub(y, a, b, n); break;
            case KN_OP_MUL: kn_vec_mul(y, a, b, n); break;
            default: kn_vec_div(y, a, b, n); break;
            }
        }
    }
}

static bool unary_map(kn_op op, kn_vec_unary_op *u) {
    switch (op) {
    case KN_OP_EXP: *u = KN_VU_EXP; return true;
    case KN_OP_TANH: *u = KN_VU_TANH; return true;
    case KN_OP_SIGMOID: *u = KN_VU_SIGMOID; return true;
    case KN_OP_SILU: *u = KN_VU_SILU; return true;
    case KN_OP_GELU_TANH: *u = KN_VU_GELU_TANH; return true;
    case KN_OP_GELU_TANH_GRAD: *u = KN_VU_GELU_TANH_GRAD; return true;
    case KN_OP_GELU: *u = KN_VU_GELU_ERF; return true;
    case KN_OP_RELU: *u = KN_VU_RELU; return true;
    case KN_OP_NEG: *u = KN_VU_NEG; return true;
    case KN_OP_SQRT: *u = KN_VU_SQRT; return true;
    case KN_OP_RSQRT: *u = KN_VU_RSQRT; return true;
    case KN_OP_LOG: *u = KN_VU_LOG; return true;
    default: return false;
    }
}

typedef struct { float *y; const float *x; int64_t n; } sq_job;
static void sq_rows(void *p, int64_t r0, int64_t r1) {
    sq_job *j = p;
    int64_t o = r0 * 4096, m = (r1 * 4096 < j->n ? r1 * 4096 : j->n) - o;
    kn_vec_mul(j->y + o, j->x + o, j->x + o, m);
}

static bool fast_unary(const kn_exec *e) {
    kn_vec_unary_op u;
    if (e->node->op == KN_OP_SQUARE && is_f32(&e->dst) && is_f32(&e->src[0]) && contig(&e->dst) && contig(&e->src[0])) {
        sq_job j = {e->dst.data, e->src[0].data, kn_tview_numel(&e->dst)};
        par_rows(sq_rows, &j, (j.n + 4095) / 4096, j.n);
        return true;
    }
    if (!unary_map(e->node->op, &u) || !is_f32(&e->dst) || !is_f32(&e->src[0]) || !contig(&e->dst) || !contig(&e->src[0]))
        return false;
    ew_job j = {EW_UNARY, u, 0, e->dst.data, e->src[0].data, NULL, 0, kn_tview_numel(&e->dst), 0};
    par_rows(ew_rows, &j, (j.n + 4095) / 4096, j.n);
    return true;
}

/* rows of len where b holds one value per row (any strides on b's outer dims) */
typedef struct { kn_op op; float *y; const float *a; const kn_tview *b; int64_t len; } col_job;
static void col_rows(void *p, int64_t r0, int64_t r1) {
    col_job *j = p;
    kn_tview outer = *j->b;
    outer.ndim--;                       /* b's offset of row r: its outer dims, row-major */
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = 0, lin = r;
        for (int k = outer.ndim - 1; k >= 0; k--) { o += (lin % outer.ne[k]) * outer.st[k]; lin /= outer.ne[k]; }
        float s = ((const float *)j->b->data)[o];
        float *y = j->y + r * j->len;
        const float *a = j->a + r * j->len;
        switch (j->op) {
        case KN_OP_ADD: kn_vec_add_scalar(y, a, s, j->len); break;
        case KN_OP_SUB: kn_vec_add_scalar(y, a, -s, j->len); break;
        case KN_OP_MUL: kn_vec_mul_scalar(y, a, s, j->len); break;
        default: for (int64_t i = 0; i < j->len; i++) y[i] = a[i] / s; break;   /* exact division */
        }
    }
}

/* General f32 case: dst contiguous, each operand's last dim has stride 0 or
 * 1 (full rows, rows broadcast from a row vector, columns, scalars); row
 * offsets come from the outer strides. One loop per stride pair so the
 * compiler vectorizes each. */
typedef struct { kn_op op; float *y; const kn_tview *a, *b; int64_t len; } gen_job;
static int64_t row_off(const kn_tview *v, int64_t r) {
    int64_t o = 0;
    for (int k = v->ndim - 2; k >= 0; k--) { o += (r % v->ne[k]) * v->st[k]; r /= v->ne[k]; }
    return o;
}
#define GEN_LOOP(EXPR)                                                                            \
    do {                                                                                          \
        if (sa && sb) for (int64_t i = 0; i < L; i++) { float x = a[i], z = b[i]; y[i] = EXPR; }  \
        else if (sa) { float z = b[0]; for (int64_t i = 0; i < L; i++) { float x = a[i]; y[i] = EXPR; } } \
        else if (sb) { float x = a[0]; for (int64_t i = 0; i < L; i++) { float z = b[i]; y[i] = EXPR; } } \
        else { float x = a[0], z = b[0], v = EXPR; for (int64_t i = 0; i < L; i++) y[i] = v; }   \
    } while (0)
static void gen_rows(void *p, int64_t r0, int64_t r1) {
    gen_job *j = p;
    int64_t L = j->len;
    /* operands are broadcast to the output's shape: unit stride = a full row,
     * stride 0 = one value repeated along the row */
    bool sa = j->a->st[j->a->ndim - 1] == 1, sb = j->b->st[j->b->ndim - 1] == 1;
    for (int64_t r = r0; r < r1; r++) {
        float *y = j->y + r * L;
        const float *a = (const float *)j->a->data + row_off(j->a, r), *b = (const float *)j->b->data + row_off(j->b, r);
        switch (j->op) {
        case KN_OP_ADD: GEN_LOOP(x + z); break;
        case KN_OP_SUB: GEN_LOOP(x - z); break;
        case KN_OP_MUL: GEN_LOOP(x * z); break;
        default: GEN_LOOP(x / z); break;
        }
    }
}
/* 2-d with any operand strides (a transposed gradient in an optimizer
 * update): 32 x 32 tiles keep both the row-major output and a column-major
 * operand in cache. */
typedef struct { kn_op op; float *y; const float *a, *b; int64_t R, C, a0, a1, b0, b1, tiles_c; } t2_job;
static void t2_rows(void *p, int64_t t0, int64_t t1) {
    t2_job *j = p;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = (t / j->tiles_c) * 32, c0 = (t % j->tiles_c) * 32;
        int64_t r1 = r0 + 32 < j->R ? r0 + 32 : j->R, c1 = c0 + 32 < j->C ? c0 + 32 : j->C;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) {
                float x = j->a[r * j->a0 + c * j->a1], z = j->b[r * j->b0 + c * j->b1], v;
                switch (j->op) {
                case KN_OP_ADD: v = x + z; break;
                case KN_OP_SUB: v = x - z; break;
                case KN_OP_MUL: v = x * z; break;
                default: v = x / z; break;
                }
                j->y[r * j->C + c] = v;
            }
    }
}

static bool fast_binary_general(const kn_exec *e, const kn_tview *a, const kn_tview *b) {
    const kn_tview *d = &e->dst;
    if (d->ndim == 0) return false;
    int64_t L = d->ne[d->ndim - 1], n = kn_tview_numel(d);
    if (L == 0 || n == 0) return false;
    int64_t la = a->st[a->ndim - 1], lb = b->st[b->ndim - 1];
    if ((la != 0 && la != 1) || (lb != 0 && lb != 1)) {
        if (d->ndim != 2) return false;
        t2_job j = {e->node->op, d->data, a->data, b->data, d->ne[0], L, a->st[0], a->st[1], b->st[0], b->st[1], (L + 31) / 32};
        int64_t tiles = ((d->ne[0] + 31) / 32) * j.tiles_c;
        par_rows(t2_rows, &j, tiles, n);
        return true;
    }
    gen_job j = {e->node->op, d->data, a, b, L};
    par_rows(gen_rows, &j, n / L, n);
    return true;
}

/* where(c, a, b) with f32 a, b, y and a bool or f32 condition, any
 * broadcasting (the causal mask of attention backward, masked losses):
 * rows of the last dim, each operand's stride along it 0 or 1 or any. */
typedef struct { float *y; const kn_tview *c, *a, *b; int64_t len; } where_job;
static void where_rows(void *p, int64_t r0, int64_t r1) {
    where_job *j = p;
    int64_t L = j->len, sc = j->c->st[j->c->ndim - 1], sa = j->a->st[j->a->ndim - 1], sb = j->b->st[j->b->ndim - 1];
    bool cf = j->c->dtype == KN_F32;
    for (int64_t r = r0; r < r1; r++) {
        float *y = j->y + r * L;
        const float *a = (const float *)j->a->data + row_off(j->a, r), *b = (const float *)j->b->data + row_off(j->b, r);
        if (cf) {
            const float *c = (const float *)j->c->data + row_off(j->c, r);
            for (int64_t i = 0; i < L; i++) y[i] = c[i * sc] != 0 ? a[i * sa] : b[i * sb];
        } else {
            const uint8_t *c = (const uint8_t *)j->c->data + row_off(j->c, r);
            for (int64_t i = 0; i < L; i++) y[i] = c[i * sc] ? a[i * sa] : b[i * sb];
        }
    }
}
static bool fast_where(const kn_exec *e) {
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !contig(d) || d->ndim == 0 || !is_f32(&e->src[1]) || !is_f32(&e->src[2])) return false;
    if (e->src[0].dtype != KN_BOOL && e->src[0].dtype != KN_F32) return false;
    int64_t L = d->ne[d->ndim - 1], n = kn_tview_numel(d);
    if (L == 0 || n == 0) return false;
    kn_tview c = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
    kn_tview a = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    kn_tview b = kn_tview_broadcast(&e->src[2], d->ndim, d->ne);
    where_job j = {d->data, &c, &a, &b, L};
    par_rows(where_rows, &j, n / L, n);
    return true;
}

/* The fused Adam/AdamW update (graph/ops_optim.c): contiguous f32 p, m, v;
 * g contiguous, or a 2-D view with any strides (a Linear weight's gradient
 * arrives transposed: rows of p then read g down its columns, which stay in
 * L2 across the 16 rows a cache line serves). The same f32 operation
 * sequence as the composite update. Parts of 4096 elements, the last one
 * shorter. */
typedef struct {
    float *p, *m, *v; const float *g; int64_t n, C, gs0, gs1; bool gc;
    float c0, c1, c2, b1c, b2, b2c, eps, l2;
} adam_job;
static void adam_rows(void *vp, int64_t r0, int64_t r1) {
    adam_job *j = vp;
    int64_t i1 = r1 * 4096 < j->n ? r1 * 4096 : j->n;
    for (int64_t i = r0 * 4096; i < i1; i++) {
        float gi = j->gc ? j->g[i] : j->g[(i / j->C) * j->gs0 + (i % j->C) * j->gs1];
        float p = j->p[i], g = gi + j->l2 * p;
        float m = j->m[i] + (g - j->m[i]) * j->b1c;
        float v = j->v[i] * j->b2 + (g * g) * j->b2c;
        j->m[i] = m; j->v[i] = v;
        j->p[i] = p * j->c0 - (m / (sqrtf(v) / j->c2 + j->eps)) * j->c1;
    }
}
static bool fast_adam(const kn_exec *e) {
    const kn_tview *p = &e->dst, *g = &e->src[1], *m = &e->src[2], *v = &e->src[3], *c = &e->src[4];
    if (!is_f32(p) || !is_f32(g) || !is_f32(m) || !is_f32(v) || !is_f32(c)) return false;
    if (!contig(p) || !contig(m) || !contig(v) || (!contig(g) && g->ndim != 2)) return false;
    int64_t n = kn_tview_numel(p);
    const float *cf = c->data;
    const kn_op_params *q = &e->node->p;
    adam_job j = {p->data, m->data, v->data, g->data, n, g->ndim == 2 ? g->ne[1] : 1, g->ndim == 2 ? g->st[0] : 0,
                  g->ndim == 2 ? g->st[1] : 0, contig(g), cf[0], cf[c->st[0]], cf[2 * c->st[0]],
                  (float)(1 - q->adam.beta1), (float)q->adam.beta2, (float)(1 - q->adam.beta2), (float)q->adam.eps,
                  (float)q->adam.l2};
    par_rows(adam_rows, &j, (n + 4095) / 4096, n * 7);
    return true;
}

/* comparisons of f32 tensors (b the same shape, or a scalar) to bool:
 * the masks of relu/clamp gradients */
typedef struct { kn_op op; uint8_t *y; const float *a, *b; bool scalar; int64_t n; } cmp_job;
static void cmp_rows(void *p, int64_t r0, int64_t r1) {
    cmp_job *j = p;
    int64_t i0 = r0 * 4096, i1 = r1 * 4096 < j->n ? r1 * 4096 : j->n;
#define CMP_LOOP(OP) do { \
        if (j->scalar) { float z = j->b[0]; for (int64_t i = i0; i < i1; i++) j->y[i] = j->a[i] OP z; } \
        else for (int64_t i = i0; i < i1; i++) j->y[i] = j->a[i] OP j->b[i]; } while (0)
    switch (j->op) {
    case KN_OP_GT: CMP_LOOP(>); break;
    case KN_OP_GE: CMP_LOOP(>=); break;
    case KN_OP_LT: CMP_LOOP(<); break;
    case KN_OP_LE: CMP_LOOP(<=); break;
    case KN_OP_EQ: CMP_LOOP(==); break;
    default: CMP_LOOP(!=); break;
    }
#undef CMP_LOOP
}
static bool fast_compare(const kn_exec *e) {
    kn_op op = e->node->op;
    if (op != KN_OP_GT && op != KN_OP_GE && op != KN_OP_LT && op != KN_OP_LE && op != KN_OP_EQ && op != KN_OP_NE) return false;
    const kn_tview *d = &e->dst;
    if (d->dtype != KN_BOOL || !contig(d) || !is_f32(&e->src[0]) || !is_f32(&e->src[1])) return false;
    kn_tview a = kn_tview_broadcast(&e->src[0], d->ndim, d->ne), b = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    bool scalar = true;
    for (int i = 0; i < b.ndim; i++) if (b.st[i] != 0 && b.ne[i] != 1) scalar = false;
    if (!contig(&a) || (!scalar && !contig(&b))) return false;
    int64_t n = kn_tview_numel(d);
    cmp_job j = {op, d->data, a.data, b.data, scalar, n};
    par_rows(cmp_rows, &j, (n + 4095) / 4096, n);
    return true;
}

static bool fast_binary(const kn_exec *e) {
    kn_op op = e->node->op;
    if (op != KN_OP_ADD && op != KN_OP_SUB && op != KN_OP_MUL && op != KN_OP_DIV) return false;
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !is_f32(&e->src[0]) || !is_f32(&e->src[1]) || !contig(d)) return false;
    kn_tview a = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
    kn_tview b = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    int64_t n = kn_tview_numel(d);
    if (!contig(&a)) {                          /* commutative ops: put the full operand first */
        if ((op == KN_OP_ADD || op == KN_OP_MUL) && contig(&b)) { kn_tview t = a; a = b; b = t; }
        else return fast_binary_general(e, &a, &b);
    }
    ew_job j = {EW_BIN_SAME, 0, op, d->data, a.data, b.data, 0, n, 0};
    if (contig(&b)) { par_rows(ew_rows, &j, (n + 4095) / 4096, n); return true; }
    bool scalar = true;
    for (int i = 0; i < b.ndim; i++) if (b.st[i] != 0 && b.ne[i] != 1) scalar = false;
    if (scalar && op != KN_OP_DIV) {
        j.kind = EW_BIN_SCALAR; j.s = *(const float *)b.data; j.b = NULL;
        par_rows(ew_rows, &j, (n + 4095) / 4096, n);
        return true;
    }
    /* column broadcast ([N,1] against [N,M]): b constant along the last dim */
    if (b.ndim > 0 && b.st[b.ndim - 1] == 0 && d->ne[d->ndim - 1] >= 16) {
        col_job cj = {op, d->data, a.data, &b, d->ne[d->ndim - 1]};
        par_rows(col_rows, &cj, n / cj.len, n);
        return true;
    }
    /* row broadcast: b is contiguous over the trailing dims and stride 0 above */
    int k = b.ndim;
    int64_t blen = 1;
    while (k > 0 && (b.st[k - 1] == blen || b.ne[k - 1] == 1)) { blen *= b.ne[k - 1]; k--; }
    for (int i = 0; i < k; i++) if (b.st[i] != 0 && b.ne[i] != 1) return fast_binary_general(e, &a, &b);
    if (blen < 16 || n % blen) return fast_binary_general(e, &a, &b);
    j.kind = EW_BIN_ROW; j.blen = blen;
    par_rows(ew_rows, &j, n / blen, n);
    return true;
}

/* ---- matmul -------------------------------------------------------------------------
 * Each operand's last two dims must have a unit stride in one of them (row-
 * or column-major, i.e. a plain or transposed matrix); batch dims may be any
 * strides (including 0 for broadcast). C must be row-major. */
static bool mat_layout(const kn_tview *v, bool *trans, int64_t *ld) {
    int r = v->ndim - 2, c = v->ndim - 1;
    if (v->st[c] == 1 || v->ne[c] == 1) {          /* row-major: (i,k) at i*ld + k */
        *trans = false; *ld = v->ne[r] == 1 ? v->ne[c] : v->st[r];
        return *ld >= v->ne[c] || v->ne[r] == 1;
    }
    if (v->st[r] == 1 || v->ne[r] == 1) {          /* stored transposed: (i,k) at k*ld + i */
        *trans = true; *ld = v->ne[c] == 1 ? v->ne[r] : v->st[c];
        return *ld >= v->ne[r] || v->ne[c] == 1;
    }
    return false;
}

/* Quantized right operand: y[t, n] = dot(W row n, x row t). W is stored as
 * rows of K elements (the view is W^T: unit stride along K). The activation
 * rows are quantized once (to Q16, or to the weight type's 8-bit partner:
 * backends/quant/quant.h), then threads split the weight rows, so each weight row is
 * read once per call. */
typedef struct {
    kn_vec_dot_fn dot; const char *W; size_t row_bytes; int64_t K, N, T;
    const char *xq; size_t xq_bytes; float *C; int64_t ldc;
} qmm_job;
static void qmm_rows(void *p, int64_t r0, int64_t r1) {
    qmm_job *j = p;
    /* blocks of 16 weight rows stay in cache while every token visits them */
    for (int64_t n0 = r0; n0 < r1; n0 += 16) {
        int64_t n1 = n0 + 16 < r1 ? n0 + 16 : r1;
        for (int64_t t = 0; t < j->T; t++) {
            const char *x = j->xq + t * j->xq_bytes;
            float *y = j->C + t * j->ldc;
            /* no software prefetch: measured slower than the hardware prefetchers */
            for (int64_t n = n0; n < n1; n++) y[n] = j->dot(j->K, j->W + (size_t)n * j->row_bytes, x);
        }
    }
}
typedef struct { bool q16; kn_dtype at; const float *x; int64_t lda, K; char *xq; size_t xq_bytes; } qx_job;
static void qx_rows(void *p, int64_t r0, int64_t r1) {
    qx_job *j = p;
    for (int64_t t = r0; t < r1; t++) {
        char *y = j->xq + t * j->xq_bytes;
        if (j->q16) kn_quantize_q16(j->x + t * j->lda, (kn_block_q16 *)y, j->K);
        else if (j->at == KN_F32) memcpy(y, j->x + t * j->lda, (size_t)j->K * 4);
        else kn_quantize_row(j->at, j->x + t * j->lda, y, j->K);
    }
}
/* Many activation rows (prefill): dequantizing each weight row once and
 * running the packed SGEMM beats T separate integer dot products per row,
 * and keeps the activations in f32. The scratch buffer is reused across
 * calls (plans run one node at a time). */
#define QMM_GEMM_MIN_ROWS 32
static float *g_wscratch;
static size_t g_wscratch_n;
typedef struct { kn_dtype wt; const char *W; size_t row_bytes; int64_t K; float *out; } deq_job;
static void deq_rows(void *p, int64_t r0, int64_t r1) {
    deq_job *j = p;
    for (int64_t r = r0; r < r1; r++) kn_dequantize_row(j->wt, j->W + (size_t)r * j->row_bytes, j->out + r * j->K, j->K);
}
static bool matmul_dequant_sgemm(const kn_tview *d, const kn_tview *a, const kn_tview *b) {
    int64_t T = d->ne[0], N = d->ne[1], K = a->ne[1];
    size_t need = (size_t)N * (size_t)K;
    if (need > g_wscratch_n) {
        float *w = realloc(g_wscratch, need * sizeof(float));
        if (!w) return false;
        g_wscratch = w; g_wscratch_n = need;
    }
    deq_job dj = {b->dtype, b->data, kn_dtype_nbytes(b->dtype, b->st[1]), K, g_wscratch};
    par_rows(deq_rows, &dj, N, N * K);
    kn_sgemm(false, true, T, N, K, 1.0f, a->data, a->st[0], g_wscratch, K, 0.0f, d->data, d->st[0]);
    return true;
}

static bool fast_matmul_quant(const kn_exec *e) {
    const kn_tview *d = &e->dst, *a = &e->src[0], *b = &e->src[1];
    if (d->ndim != 2 || a->ndim != 2 || b->ndim != 2 || !is_f32(a) || !is_f32(d)) return false;
    int64_t T = d->ne[0], N = d->ne[1], K = a->ne[1];
    if (a->st[1] != 1 || b->st[0] != 1 || d->st[1] != 1 || K % kn_dtype_get(b->dtype)->block_size) return false;
    /* KN_QMM_ACT=f32 (or KN_QMM_EXACT=1) keeps activations in f32 at every
     * row count (slow decode; checks the pipeline against float references) */
    kn_qact mode = kn_quant_act_mode();
    if ((T >= QMM_GEMM_MIN_ROWS || mode == KN_QACT_F32) && matmul_dequant_sgemm(d, a, b)) return true;
    kn_vec_dot_fn dot = kn_quant_act_q16_dot(b->dtype);
    bool q16 = dot != NULL;
    kn_dtype at = kn_quant_vec_dot_type(b->dtype);
    if (!dot) dot = kn_quant_dot_fn(b->dtype);
    if (!dot) return false;
    size_t xq_bytes = q16 ? kn_quant_q16_nbytes(K) : kn_dtype_nbytes(at, K);
    char *xq = malloc(xq_bytes * (size_t)(T ? T : 1));
    if (!xq) return false;
    qx_job qj = {q16, at, a->data, a->st[0], K, xq, xq_bytes};
    par_rows(qx_rows, &qj, T, T * K);
    qmm_job j = {dot, b->data, kn_dtype_nbytes(b->dtype, b->st[1]), K, N, T, xq, xq_bytes, d->data, d->st[0]};
    par_rows(qmm_rows, &j, N, N * K * (T ? T : 1));
    free(xq);
    return true;
}

static bool fast_matmul(const kn_exec *e) {
    if (kn_dtype_get(e->src[1].dtype)->is_quant || e->src[1].dtype == KN_F16 || e->src[1].dtype == KN_BF16)
        return fast_matmul_quant(e);
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !is_f32(&e->src[0]) || !is_f32(&e->src[1])) return false;
    int nb = d->ndim - 2;
    kn_tview a = e->src[0], b = e->src[1];
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a.ne[a.ndim - 1];
    if (d->st[nb + 1] != 1 && N > 1) return false;
    int64_t ldc = d->st[nb] > N ? d->st[nb] : N;
    bool ta, tb; int64_t lda, ldb;
    /* a view with stride 0 in a matrix dim (expanded) is not a plain matrix */
    if (a.st[a.ndim - 1] == 0 || a.st[a.ndim - 2] == 0 || b.st[b.ndim - 1] == 0 || b.st[b.ndim - 2] == 0) return false;
    if (!mat_layout(&a, &ta, &lda) || !mat_layout(&b, &tb, &ldb)) return false;
    kn_tview ab = a, bb = b, db = *d;
    ab.ndim = a.ndim - 2; bb.ndim = b.ndim - 2; db.ndim = nb;
    ab = kn_tview_broadcast(&ab, nb, d->ne);
    bb = kn_tview_broadcast(&bb, nb, d->ne);
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    const float *A = a.data, *B = b.data;
    float *C = d->data;
    /* a shared right operand (stride 0 over every batch dim: x [B,T,K] @ W^T)
     * and a, C contiguous: one GEMM of batch * M rows, not batch small ones */
    bool shared_b = batch > 1 && !ta && contig(&a) && contig(d);
    for (int i = 0; i < nb && shared_b; i++) if (bb.st[i] != 0 && d->ne[i] != 1) shared_b = false;
    if (shared_b) {
        kn_sgemm(false, tb, batch * M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
        return true;
    }
    /* one uniform batch dim (after collapsing) goes to the batched entry point */
    if (nb == 1 || batch == 1) {
        int64_t sa = nb ? ab.st[0] : 0, sb = nb ? bb.st[0] : 0, sc = nb ? db.st[0] : 0;
        kn_sgemm_batched(batch, ta, tb, M, N, K, 1.0f, A, lda, sa, B, ldb, sb, 0.0f, C, ldc, sc);
        return true;
    }
    for (int64_t z = 0; z < batch; z++) {
        int64_t ao = 0, bo = 0, co = 0, lin = z;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t q = lin % d->ne[i]; lin /= d->ne[i];
            ao += q * ab.st[i]; bo += q * bb.st[i]; co += q * db.st[i];
        }
        kn_sgemm(ta, tb, M, N, K, 1.0f, A + ao, lda, B + bo, ldb, 0.0f, C + co, ldc);
    }
    return true;
}

/* ---- row ops: reductions over the last dim, softmax ------------------------------------ */
typedef struct { kn_op op; float *y; const float *x; int64_t len, ys; int correction; } row_job;
static void row_rows(void *p, int64_t r0, int64_t r1) {
    row_job *j = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->len;
        switch (j->op) {
        case KN_OP_SUM: j->y[r * j->ys] = kn_vec_sum(x, j->len); break;
        case KN_OP_MEAN: j->y[r * j->ys] = kn_vec_sum(x, j->len) / (float)j->len; break;
        case KN_OP_MAX: j->y[r * j->ys] = kn_vec_max(x, j->len); break;
        case KN_OP_SOFTMAX: kn_vec_softmax(j->y + r * j->len, x, j->len); break;
        case KN_OP_LOG_SOFTMAX: kn_vec_log_softmax(j->y + r * j->len, x, j->len); break;
        case KN_OP_VAR: case KN_OP_STD: {   /* two passes, as the reference: mean, then squared deviations */
            float mean = kn_vec_sum(x, j->len) / (float)j->len, ss = 0;
            for (int64_t i = 0; i < j->len; i++) ss += (x[i] - mean) * (x[i] - mean);
            double den = (double)j->len - j->correction;
            float v = den > 0 ? (float)(ss / den) : NAN;
            j->y[r * j->ys] = j->op == KN_OP_STD ? sqrtf(v) : v;
            break;
        }
        default: break;
        }
    }
}

static bool fast_reduce(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (t->op != KN_OP_SUM && t->op != KN_OP_MEAN && t->op != KN_OP_MAX && t->op != KN_OP_VAR && t->op != KN_OP_STD) return false;
    if (!is_f32(x) || !is_f32(d) || !contig(x) || !contig(d) || x->ndim == 0) return false;
    if (t->p.reduce.axes != (1u << (x->ndim - 1))) return false;   /* last dim only */
    int64_t len = x->ne[x->ndim - 1];
    if (len == 0) return false;
    row_job j = {t->op, d->data, x->data, len, 1, t->p.reduce.correction};
    int64_t rows = kn_tview_numel(x) / len;
    par_rows(row_rows, &j, rows, rows * len);
    return true;
}

static bool fast_softmax(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (!is_f32(x) || !is_f32(d) || !contig(x) || !contig(d) || x->ndim == 0) return false;
    if (t->p.axis.dim != x->ndim - 1) return false;
    int64_t len = x->ne[x->ndim - 1];
    if (len == 0) return false;
    row_job j = {t->op, d->data, x->data, len, 1};
    int64_t rows = kn_tview_numel(x) / len;
    par_rows(row_rows, &j, rows, rows * len);
    return true;
}

/* ---- copies and casts ---------------------------------------------------------------- */
typedef struct { kn_dtype from, to; void *y; const void *x; int64_t n; } cast_job;
/* chunks of 4096 elements; the last one may be shorter */
static void cast_rows(void *p, int64_t r0, int64_t r1) {
    cast_job *j = p;
    int64_t o = r0 * 4096, n = (r1 * 4096 < j->n ? r1 * 4096 : j->n) - o;
    size_t es = kn_dtype_get(j->to)->type_size, xs = kn_dtype_get(j->from)->type_size;
    void *y = (char *)j->y + o * (int64_t)es;
    const void *x = (const char *)j->x + o * (int64_t)xs;
    if (j->from == j->to) memcpy(y, x, (size_t)n * es);
    else if (j->from == KN_F32 && j->to == KN_F16) kn_vec_f32_to_f16(y, x, n);
    else if (j->from == KN_F16) kn_vec_f16_to_f32(y, x, n);
    else if (j->from == KN_F32) kn_vec_f32_to_bf16(y, x, n);
    else kn_vec_bf16_to_f32(y, x, n);
}
static bool fast_copy(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (!contig(x) || !contig(d)) return false;
    bool ok = x->dtype == d->dtype ||
              (x->dtype == KN_F32 && (d->dtype == KN_F16 || d->dtype == KN_BF16)) ||
              (d->dtype == KN_F32 && (x->dtype == KN_F16 || x->dtype == KN_BF16));
    if (!ok || kn_dtype_get(x->dtype)->is_quant) return false;
    int64_t n = kn_tview_numel(d);
    cast_job j = {x->dtype, d->dtype, d->data, x->data, n};
    par_rows(cast_rows, &j, (n + 4095) / 4096, n);
    return true;
}

/* FILL of a contiguous f32 tensor; ASSIGN of a contiguous f32 value of the
 * same shape into a contiguous destination (optimizer updates) */
typedef struct { float *y; const float *x; float v; int64_t n; } fill_job;
static void fill_rows(void *p, int64_t r0, int64_t r1) {
    fill_job *j = p;
    int64_t o = r0 * 4096, m = (r1 * 4096 < j->n ? r1 * 4096 : j->n) - o;
    if (j->x) memmove(j->y + o, j->x + o, (size_t)m * sizeof(float));
    else for (int64_t i = 0; i < m; i++) j->y[o + i] = j->v;
}
static bool fast_fill_assign(const kn_exec *e) {
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !contig(d)) return false;
    int64_t n = kn_tview_numel(d);
    fill_job j = {d->data, NULL, (float)e->node->p.scalar.a, n};
    if (e->node->op == KN_OP_ASSIGN) {
        const kn_tview *s = &e->src[1];
        if (!is_f32(s) || !contig(s) || kn_tview_numel(s) != n) return false;
        /* overlapping but different ranges would need a copy first: refuse */
        const float *x = s->data;
        if (x != (const float *)d->data && x < (const float *)d->data + n && (const float *)d->data < x + n) return false;
        j.x = x;
    }
    par_rows(fill_rows, &j, (n + 4095) / 4096, n);
    return true;
}

/* SUM/MEAN over the leading dims of a contiguous tensor ([R, C] -> [C]):
 * rows are added into the output with vector adds, threads split columns */
typedef struct { float *y; const float *x; int64_t R, C; float scale; } colsum_job;
static void colsum_rows(void *p, int64_t c0, int64_t c1) {
    colsum_job *j = p;
    int64_t w = c1 - c0;
    float *y = j->y + c0;
    memcpy(y, j->x + c0, sizeof(float) * (size_t)w);
    for (int64_t r = 1; r < j->R; r++) kn_vec_add(y, y, j->x + r * j->C + c0, w);
    if (j->scale != 1.0f) kn_vec_mul_scalar(y, y, j->scale, w);
}
typedef struct { colsum_job *j; int64_t nparts, rstep; } colsum_split;
/* part q of nparts: columns [q*C/nparts, (q+1)*C/nparts) */
static void colsum_cols(void *p, int64_t q0, int64_t q1) {
    colsum_split *s = p;
    int64_t C = s->j->C, c0 = q0 * C / s->nparts, c1 = q1 * C / s->nparts;
    if (c1 > c0) colsum_rows(s->j, c0, c1);
}
/* part q sums rows [q*rstep, (q+1)*rstep) into y + q*C */
static void colsum_part(void *p, int64_t q0, int64_t q1) {
    colsum_split *s = p;
    for (int64_t q = q0; q < q1; q++) {
        int64_t r0 = q * s->rstep, r1 = r0 + s->rstep < s->j->R ? r0 + s->rstep : s->j->R;
        if (r0 >= r1) continue;
        colsum_job sub = {s->j->y + q * s->j->C, s->j->x + r0 * s->j->C, r1 - r0, s->j->C, 1.0f};
        colsum_rows(&sub, 0, sub.C);
    }
}
static bool fast_reduce_leading(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if ((t->op != KN_OP_SUM && t->op != KN_OP_MEAN) || !is_f32(x) || !is_f32(d) || !contig(x) || !contig(d)) return false;
    uint32_t m = t->p.reduce.axes;
    int k = 0;
    while (k < x->ndim && (m >> k & 1)) k++;
    if (k == 0 || k == x->ndim || (m >> k) != 0) return false;      /* exactly dims 0..k-1 */
    int64_t R = 1, C = 1;
    for (int i = 0; i < k; i++) R *= x->ne[i];
    for (int i = k; i < x->ndim; i++) C *= x->ne[i];
    if (R == 0 || C < 16) return false;
    float scale = t->op == KN_OP_MEAN ? 1.0f / (float)R : 1.0f;
    int nt = kn_pool_nthreads();
    if (C >= 256 * (int64_t)nt || R < 64 || nt < 2 || R * C < KN_CPU_PAR_MIN) {
        /* wide rows (or little work): threads split the columns, each part
         * >= 256 floats wide; par_rows runs it on this thread when small */
        colsum_job j = {d->data, x->data, R, C, scale};
        int64_t parts = C / 256 > 1 ? C / 256 : 1;
        par_rows(colsum_cols, &(colsum_split){&j, parts, 0}, parts, R * C);
        return true;
    }
    /* narrow rows (bias gradients [B*T, C]): threads split the rows into
     * partial sums, added at the end (a column split would hand each thread
     * slivers of a few floats per row) */
    int64_t np = nt, rstep = (R + np - 1) / np;
    float *part = malloc(sizeof(float) * (size_t)(np * C));
    if (!part) return false;
    colsum_job j = {part, x->data, R, C, 1.0f};
    par_rows(colsum_part, &(colsum_split){&j, 0, rstep}, np, R * C);
    float *y = d->data;
    memcpy(y, part, sizeof(float) * (size_t)C);
    for (int64_t p = 1; p < np && p * rstep < R; p++) kn_vec_add(y, y, part + p * C, C);
    if (scale != 1.0f) kn_vec_mul_scalar(y, y, scale, C);
    free(part);
    return true;
}

static kn_status cpu_compute(kn_backend *be, const kn_exec *e) {
    bool done = false;
    switch (e->node->op) {
    case KN_OP_FILL: case KN_OP_ASSIGN: done = fast_fill_assign(e); break;
    case KN_OP_MATMUL: done = fast_matmul(e); break;
    case KN_OP_ADD: case KN_OP_SUB: case KN_OP_MUL: case KN_OP_DIV: done = fast_binary(e); break;
    case KN_OP_GT: case KN_OP_GE: case KN_OP_LT: case KN_OP_LE: case KN_OP_EQ: case KN_OP_NE: done = fast_compare(e); break;
    case KN_OP_SUM: case KN_OP_MEAN: case KN_OP_MAX: done = fast_reduce(e) || fast_reduce_leading(e); break;
    case KN_OP_VAR: case KN_OP_STD: done = fast_reduce(e); break;
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: done = fast_softmax(e) || kn_cpu_nn_fast(e); break;
    case KN_OP_COPY: case KN_OP_CAST: done = fast_copy(e) || kn_cpu_nn_fast(e); break;
    case KN_OP_WHERE: done = fast_where(e); break;
    case KN_OP_ADAM_UPDATE: done = fast_adam(e); break;
    default:
        if (kn_op_get(e->node->op)->kind == KN_KIND_UNARY && e->node->op != KN_OP_CLAMP) done = fast_unary(e);
        else done = kn_cpu_nn_fast(e);      /* norms, rope, sdpa, index ops, conv, pools (cpu_nn.c) */
        break;
    }
    return done ? KN_OK : kn__ref_compute(be, e);
}

static kn_backend g_cpu = {
    .version = KN_BACKEND_VERSION,
    .name = "cpu",
    .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc,
    .free = kn__host_free,
    .copy_in = kn__host_copy,
    .copy_out = kn__host_copy,
    .compute = cpu_compute,
};

kn_backend *kn_backend_cpu(void) { return &g_cpu; }
