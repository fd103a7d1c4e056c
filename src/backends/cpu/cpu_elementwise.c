/* cpu_elementwise.c: the CPU backend's elementwise fast paths: unary maps,
 * the four arithmetic binaries with broadcasting, comparisons, where, fill
 * and assign, and the fused Adam update.
 *
 * Layouts: f32 (compare: f32 in, bool out) with a contiguous destination;
 * operands contiguous, broadcast as a scalar, a row or a column, or any
 * strides in the general case (a 2-D transposed operand goes by tiles).
 * Contiguous work is split in chunks of KN_CPU_CHUNK (4096) elements over
 * the pool.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include <math.h>
#include <string.h>

/* ==== unary maps and contiguous binaries: vec.h kernels over chunks ========= */
typedef struct { int kind; kn_vec_unary_op uop; kn_op bop; float *y; const float *a, *b; float s; int64_t n, blen; } ew_job;
enum { EW_UNARY, EW_BIN_SAME, EW_BIN_ROW, EW_BIN_SCALAR };

/* rows here are chunks of KN_CPU_CHUNK elements (or rows of blen for row broadcast) */
static void ew_rows(void *p, int64_t r0, int64_t r1) {
    ew_job *j = p;
    int64_t L = j->kind == EW_BIN_ROW ? j->blen : KN_CPU_CHUNK;
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
    int64_t o = r0 * KN_CPU_CHUNK, m = kn_cpu_chunk_end(r1, j->n) - o;
    kn_vec_mul(j->y + o, j->x + o, j->x + o, m);
}

bool kn_cpu_unary(const kn_exec *e) {
    kn_vec_unary_op u;
    if (e->node->op == KN_OP_SQUARE && is_f32(&e->dst) && is_f32(&e->src[0]) && contig(&e->dst) && contig(&e->src[0])) {
        sq_job j = {e->dst.data, e->src[0].data, kn_tview_numel(&e->dst)};
        kn_cpu_par_rows(sq_rows, &j, kn_cpu_chunks(j.n), j.n);
        return true;
    }
    if (!unary_map(e->node->op, &u) || !is_f32(&e->dst) || !is_f32(&e->src[0]) || !contig(&e->dst) || !contig(&e->src[0]))
        return false;
    ew_job j = {EW_UNARY, u, 0, e->dst.data, e->src[0].data, NULL, 0, kn_tview_numel(&e->dst), 0};
    kn_cpu_par_rows(ew_rows, &j, kn_cpu_chunks(j.n), j.n);
    return true;
}

/* offset of row r (of the last dim) in v: its outer dims, row-major */
static int64_t row_off(const kn_tview *v, int64_t r) { return off_lead(v, v->ndim - 1, r); }

/* rows of len where b holds one value per row (any strides on b's outer dims) */
typedef struct { kn_op op; float *y; const float *a; const kn_tview *b; int64_t len; } col_job;
static void col_rows(void *p, int64_t r0, int64_t r1) {
    col_job *j = p;
    for (int64_t r = r0; r < r1; r++) {
        float s = ((const float *)j->b->data)[row_off(j->b, r)];
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

static bool binary_general(const kn_exec *e, const kn_tview *a, const kn_tview *b) {
    const kn_tview *d = &e->dst;
    if (d->ndim == 0) return false;
    int64_t L = d->ne[d->ndim - 1], n = kn_tview_numel(d);
    if (L == 0 || n == 0) return false;
    int64_t la = a->st[a->ndim - 1], lb = b->st[b->ndim - 1];
    if ((la != 0 && la != 1) || (lb != 0 && lb != 1)) {
        if (d->ndim != 2) return false;
        t2_job j = {e->node->op, d->data, a->data, b->data, d->ne[0], L, a->st[0], a->st[1], b->st[0], b->st[1], (L + 31) / 32};
        int64_t tiles = ((d->ne[0] + 31) / 32) * j.tiles_c;
        kn_cpu_par_rows(t2_rows, &j, tiles, n);
        return true;
    }
    gen_job j = {e->node->op, d->data, a, b, L};
    kn_cpu_par_rows(gen_rows, &j, n / L, n);
    return true;
}

/* where(c, a, b) with f32 a, b, y and a bool or f32 condition, any
 * broadcasting (the causal mask of attention backward, masked losses):
 * rows of the last dim, each operand's stride along it 0 or 1 or any. */
typedef struct { float *y; const kn_tview *c, *a, *b; int64_t len; } where_job;
/* y[i] = c[i] ? a[i] : b[i * sb] as a bit mask over the words (memcpy: no
 * aliasing; it compiles to moves): a branch per element mispredicts half
 * the time on a relu's signs (measured 2x slower), and gcc keeps a branch
 * for a float ?: */
static void where_u8(float *y, const uint8_t *c, const float *a, const float *b, int64_t sb, int64_t L) {
    for (int64_t i = 0; i < L; i++) {
        uint32_t u, v, m = 0u - (uint32_t)(c[i] != 0);
        memcpy(&u, a + i, 4); memcpy(&v, b + i * sb, 4);
        u = (u & m) | (v & ~m);
        memcpy(y + i, &u, 4);
    }
}
static void where_rows(void *p, int64_t r0, int64_t r1) {
    where_job *j = p;
    int64_t L = j->len, sc = j->c->st[j->c->ndim - 1], sa = j->a->st[j->a->ndim - 1], sb = j->b->st[j->b->ndim - 1];
    bool cf = j->c->dtype == KN_F32;
    for (int64_t r = r0; r < r1; r++) {
        float *y = j->y + r * L;
        const float *a = (const float *)j->a->data + row_off(j->a, r), *b = (const float *)j->b->data + row_off(j->b, r);
        if (!cf && sc == 1 && sa == 1 && (sb == 0 || sb == 1)) {  /* relu backward: no branch to mispredict */
            where_u8(y, (const uint8_t *)j->c->data + row_off(j->c, r), a, b, sb, L);
        } else if (cf) {
            const float *c = (const float *)j->c->data + row_off(j->c, r);
            for (int64_t i = 0; i < L; i++) y[i] = c[i * sc] != 0 ? a[i * sa] : b[i * sb];
        } else {
            const uint8_t *c = (const uint8_t *)j->c->data + row_off(j->c, r);
            for (int64_t i = 0; i < L; i++) y[i] = c[i * sc] ? a[i * sa] : b[i * sb];
        }
    }
}
bool kn_cpu_where(const kn_exec *e) {
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !contig(d) || d->ndim == 0 || !is_f32(&e->src[1]) || !is_f32(&e->src[2])) return false;
    if (e->src[0].dtype != KN_BOOL && e->src[0].dtype != KN_F32) return false;
    int64_t L = d->ne[d->ndim - 1], n = kn_tview_numel(d);
    if (L == 0 || n == 0) return false;
    kn_tview c = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
    kn_tview a = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    kn_tview b = kn_tview_broadcast(&e->src[2], d->ndim, d->ne);
    where_job j = {d->data, &c, &a, &b, L};
    kn_cpu_par_rows(where_rows, &j, n / L, n);
    return true;
}

/* The fused Adam/AdamW update (graph/ops_optim.c): contiguous f32 p, m, v;
 * g contiguous, or a 2-D view with any strides (a Linear weight's gradient
 * arrives transposed: rows of p then read g down its columns, which stay in
 * L2 across the 16 rows a cache line serves). The same f32 operation
 * sequence as the composite update. Chunks of KN_CPU_CHUNK elements, the
 * last one shorter. */
typedef struct {
    float *p, *m, *v; const float *g; int64_t n, C, gs0, gs1; bool gc;
    float c0, c1, c2, b1c, b2, b2c, eps, l2;
} adam_job;
static void adam_rows(void *vp, int64_t r0, int64_t r1) {
    adam_job *j = vp;
    int64_t i0 = r0 * KN_CPU_CHUNK, i1 = kn_cpu_chunk_end(r1, j->n);
    if (j->gc) {                     /* contiguous g: the SIMD row kernel (vec.h), the same bits */
        kn_vec_adam_k k = {j->c0, j->c1, j->c2, j->b1c, j->b2, j->b2c, j->eps, j->l2};
        kn_vec_adam(j->p + i0, j->m + i0, j->v + i0, j->g + i0, i1 - i0, &k);
        return;
    }
    /* a strided g (a Linear weight's transposed gradient): the row and
     * column advance with i, no division per element */
    int64_t r = i0 / j->C, c = i0 % j->C;
    for (int64_t i = i0; i < i1; i++) {
        float gi = j->g[r * j->gs0 + c * j->gs1];
        if (++c == j->C) { c = 0; r++; }
        float p = j->p[i], g = gi + j->l2 * p;
        float m = j->m[i] + (g - j->m[i]) * j->b1c;
        float v = j->v[i] * j->b2 + (g * g) * j->b2c;
        j->m[i] = m; j->v[i] = v;
        j->p[i] = p * j->c0 - (m / (sqrtf(v) / j->c2 + j->eps)) * j->c1;
    }
}
static bool adam_job_of(const kn_exec *e, adam_job *j) {
    const kn_tview *p = &e->dst, *g = &e->src[1], *m = &e->src[2], *v = &e->src[3], *c = &e->src[4];
    if (e->node->op != KN_OP_ADAM_UPDATE || !is_f32(p) || !is_f32(g) || !is_f32(m) || !is_f32(v) || !is_f32(c)) return false;
    if (!contig(p) || !contig(m) || !contig(v) || (!contig(g) && g->ndim != 2)) return false;
    const float *cf = c->data;
    const kn_op_params *q = &e->node->p;
    *j = (adam_job){p->data, m->data, v->data, g->data, kn_tview_numel(p), g->ndim == 2 ? g->ne[1] : 1,
                    g->ndim == 2 ? g->st[0] : 0, g->ndim == 2 ? g->st[1] : 0, contig(g), cf[0], cf[c->st[0]],
                    cf[2 * c->st[0]], (float)(1 - q->adam.beta1), (float)q->adam.beta2, (float)(1 - q->adam.beta2),
                    (float)q->adam.eps, (float)q->adam.l2};
    return true;
}
bool kn_cpu_adam(const kn_exec *e) {
    adam_job j;
    if (!adam_job_of(e, &j)) return false;
    kn_cpu_par_rows(adam_rows, &j, kn_cpu_chunks(j.n), j.n * 7);
    return true;
}

/* An optimizer step's updates at once (kn_backend.compute_batch): one
 * parallel region over the chunks of all of them instead of a wake-up of
 * the pool per parameter; each element computed as kn_cpu_adam does. */
typedef struct {
    adam_job j[KN_BATCH_MAX];
    int64_t chunk0[KN_BATCH_MAX + 1];     /* update k has the chunks [chunk0[k], chunk0[k+1]) */
    int n;
} adam_batch;
static void adam_batch_rows(void *vp, int64_t r0, int64_t r1) {
    adam_batch *b = vp;
    int lo = 0, hi = b->n - 1;           /* the last k with chunk0[k] <= r0 */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->chunk0[mid] <= r0) lo = mid; else hi = mid - 1;
    }
    for (int k = lo; r0 < r1 && k < b->n; k++) {
        int64_t e = b->chunk0[k + 1] < r1 ? b->chunk0[k + 1] : r1;
        if (e > r0) adam_rows(&b->j[k], r0 - b->chunk0[k], e - b->chunk0[k]);
        r0 = e;
    }
}
bool kn_cpu_adam_batch_ok(const kn_exec *e) {
    adam_job j;
    return adam_job_of(e, &j) && j.n > 0;
}
bool kn_cpu_adam_batch(const kn_exec *es, int n) {
    adam_batch b;                        /* ~7 KB: on the stack, no allocation a step */
    if (n > KN_BATCH_MAX) return false;
    int64_t work = 0;
    b.n = n;
    b.chunk0[0] = 0;
    for (int k = 0; k < n; k++) {
        if (!adam_job_of(&es[k], &b.j[k])) return false;
        b.chunk0[k + 1] = b.chunk0[k] + kn_cpu_chunks(b.j[k].n);
        work += b.j[k].n * 7;
    }
    kn_cpu_par_rows(adam_batch_rows, &b, b.chunk0[n], work);
    return true;
}

/* comparisons of f32 tensors (b the same shape, or a scalar) to bool:
 * the masks of relu/clamp gradients */
typedef struct { kn_op op; uint8_t *y; const float *a, *b; bool scalar; int64_t n; } cmp_job;
static void cmp_rows(void *p, int64_t r0, int64_t r1) {
    cmp_job *j = p;
    int64_t i0 = r0 * KN_CPU_CHUNK, i1 = kn_cpu_chunk_end(r1, j->n);
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
bool kn_cpu_compare(const kn_exec *e) {
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
    kn_cpu_par_rows(cmp_rows, &j, kn_cpu_chunks(n), n);
    return true;
}

bool kn_cpu_binary(const kn_exec *e) {
    kn_op op = e->node->op;
    if (op != KN_OP_ADD && op != KN_OP_SUB && op != KN_OP_MUL && op != KN_OP_DIV) return false;
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !is_f32(&e->src[0]) || !is_f32(&e->src[1]) || !contig(d)) return false;
    kn_tview a = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
    kn_tview b = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    int64_t n = kn_tview_numel(d);
    if (!contig(&a)) {                          /* commutative ops: put the full operand first */
        if ((op == KN_OP_ADD || op == KN_OP_MUL) && contig(&b)) { kn_tview t = a; a = b; b = t; }
        else return binary_general(e, &a, &b);
    }
    ew_job j = {EW_BIN_SAME, 0, op, d->data, a.data, b.data, 0, n, 0};
    if (contig(&b)) { kn_cpu_par_rows(ew_rows, &j, kn_cpu_chunks(n), n); return true; }
    bool scalar = true;
    for (int i = 0; i < b.ndim; i++) if (b.st[i] != 0 && b.ne[i] != 1) scalar = false;
    if (scalar && op != KN_OP_DIV) {
        j.kind = EW_BIN_SCALAR; j.s = *(const float *)b.data; j.b = NULL;
        kn_cpu_par_rows(ew_rows, &j, kn_cpu_chunks(n), n);
        return true;
    }
    /* column broadcast ([N,1] against [N,M]): b constant along the last dim */
    if (b.ndim > 0 && b.st[b.ndim - 1] == 0 && d->ne[d->ndim - 1] >= 16) {
        col_job cj = {op, d->data, a.data, &b, d->ne[d->ndim - 1]};
        kn_cpu_par_rows(col_rows, &cj, n / cj.len, n);
        return true;
    }
    /* row broadcast: b is contiguous over the trailing dims and stride 0 above */
    int k = b.ndim;
    int64_t blen = 1;
    while (k > 0 && (b.st[k - 1] == blen || b.ne[k - 1] == 1)) { blen *= b.ne[k - 1]; k--; }
    for (int i = 0; i < k; i++) if (b.st[i] != 0 && b.ne[i] != 1) return binary_general(e, &a, &b);
    if (blen < 16 || n % blen) return binary_general(e, &a, &b);
    j.kind = EW_BIN_ROW; j.blen = blen;
    kn_cpu_par_rows(ew_rows, &j, n / blen, n);
    return true;
}

/* FILL of a contiguous f32 tensor; ASSIGN of a contiguous f32 value of the
 * same shape into a contiguous destination (optimizer updates) */
typedef struct { float *y; const float *x; float v; int64_t n; } fill_job;
static void fill_rows(void *p, int64_t r0, int64_t r1) {
    fill_job *j = p;
    int64_t o = r0 * KN_CPU_CHUNK, m = kn_cpu_chunk_end(r1, j->n) - o;
    if (j->x) memmove(j->y + o, j->x + o, (size_t)m * sizeof(float));
    else for (int64_t i = 0; i < m; i++) j->y[o + i] = j->v;
}
bool kn_cpu_fill_assign(const kn_exec *e) {
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
    kn_cpu_par_rows(fill_rows, &j, kn_cpu_chunks(n), n);
    return true;
}
