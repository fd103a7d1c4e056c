/* cuda_ops_optim.cu: the fused Adam/AdamW update node (graph/ops_optim.c
 * states the arithmetic) on the GPU. p (dst), m (src 2) and v (src 3) are
 * written in place; c (src 4) = [decay multiplier, lr / (1 - beta1^t),
 * sqrt(1 - beta2^t)] lives on the device.
 *
 * f32, p/m/v contiguous (g contiguous or a strided 2-d view, e.g. the
 * transposed gradient of a linear weight): k_adam_f32, float4 loads and
 * stores, the f32 operation sequence of ops_optim.c and of the cpu
 * backend's fast_adam, with every product and sum rounded on its own
 * (__fmul_rn/__fadd_rn: no FMA contraction), so it matches the cpu backend
 * bit for bit and the double reference to f32 rounding. With
 * KN_CUDA_TUNE=adam_batch=1 the runtime hands a run of such updates (an
 * optimizer step's, up to KN_BATCH_MAX) to kn_cu_compute_batch, which
 * launches them 32 a kernel (k_adam_f32_batch, each update on blocks of its
 * own): a GPT-2 step's 148 updates as 5 launches instead of 148.
 * Anything else: k_adam, one thread per element, any float dtype and
 * strides, computed in double like the reference.
 * (adamw.cu's kn_cuda_adamw is a different recipe -- lr and the bias
 * corrections as host floats, decoupled decay inside -- so the node does
 * not call it.) */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune (KN_CUDA_TUNE=adam_batch=1)
#include <string.h>

/* one element: the f32 recipe of ops_optim.c */
__device__ __forceinline__ float adam_one(float p, float g, float &m, float &v, float c0, float c1, float c2, float b1c,
                                          float b2, float b2c, float eps, float l2) {
    g = __fadd_rn(g, __fmul_rn(l2, p));
    m = __fadd_rn(m, __fmul_rn(__fsub_rn(g, m), b1c));
    v = __fadd_rn(__fmul_rn(v, b2), __fmul_rn(__fmul_rn(g, g), b2c));
    return __fsub_rn(__fmul_rn(p, c0), __fmul_rn(__fdiv_rn(m, __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c2), eps)), c1));
}
/* One parameter's update: p, m, v [n] f32 contiguous and 16-byte aligned;
 * g contiguous and aligned (gc) or g[i] at (i / C) * gs0 + (i % C) * gs1;
 * c: the 3 coefficients (stride cst). */
struct adam_ent {
    float *p, *m, *v;
    const float *g, *c;
    int64_t n, C, gs0, gs1, cst;
    float b1c, b2, b2c, eps, l2;
    int gc;
};
/* Blocks blk of nblk that an update has: a grid-stride loop over its float4
 * groups; block 0 also takes the n % 4 tail, one element a thread. */
template <bool GC> __device__ __forceinline__ void adam_part(const adam_ent &E, int64_t blk, int64_t nblk) {
    const float c0 = E.c[0], c1 = E.c[E.cst], c2 = E.c[2 * E.cst];
    const int64_t n4 = E.n / 4;
    float *p = E.p, *m = E.m, *v = E.v;
    const float *g = E.g;
    for (int64_t i = blk * blockDim.x + threadIdx.x; i < n4; i += nblk * blockDim.x) {
        float4 pp = ((const float4 *)p)[i], mm = ((const float4 *)m)[i], vv = ((const float4 *)v)[i], gg;
        if (GC) gg = __ldg((const float4 *)g + i);
        else {
            int64_t j = 4 * i;
            gg.x = g[(j / E.C) * E.gs0 + (j % E.C) * E.gs1]; j++;
            gg.y = g[(j / E.C) * E.gs0 + (j % E.C) * E.gs1]; j++;
            gg.z = g[(j / E.C) * E.gs0 + (j % E.C) * E.gs1]; j++;
            gg.w = g[(j / E.C) * E.gs0 + (j % E.C) * E.gs1];
        }
        pp.x = adam_one(pp.x, gg.x, mm.x, vv.x, c0, c1, c2, E.b1c, E.b2, E.b2c, E.eps, E.l2);
        pp.y = adam_one(pp.y, gg.y, mm.y, vv.y, c0, c1, c2, E.b1c, E.b2, E.b2c, E.eps, E.l2);
        pp.z = adam_one(pp.z, gg.z, mm.z, vv.z, c0, c1, c2, E.b1c, E.b2, E.b2c, E.eps, E.l2);
        pp.w = adam_one(pp.w, gg.w, mm.w, vv.w, c0, c1, c2, E.b1c, E.b2, E.b2c, E.eps, E.l2);
        ((float4 *)p)[i] = pp; ((float4 *)m)[i] = mm; ((float4 *)v)[i] = vv;
    }
    const int64_t j = 4 * n4 + threadIdx.x;
    if (blk == 0 && j < E.n) {
        float gj = GC ? g[j] : g[(j / E.C) * E.gs0 + (j % E.C) * E.gs1];
        p[j] = adam_one(p[j], gj, m[j], v[j], c0, c1, c2, E.b1c, E.b2, E.b2c, E.eps, E.l2);
    }
}
template <bool GC> __global__ void k_adam_f32(const adam_ent E) { adam_part<GC>(E, blockIdx.x, gridDim.x); }

/* Several updates in one launch (compute_batch: the multi-tensor step).
 * Update k has blocks [blk0[k], blk0[k+1]); 32 of them keep the table
 * (3.5 KB) under the 4 KB of kernel parameters every CUDA version takes. */
enum { ADAM_TAB = 32 };
struct adam_tab {
    adam_ent e[ADAM_TAB];
    int blk0[ADAM_TAB + 1];
    int n;
};
__global__ void k_adam_f32_batch(const __grid_constant__ adam_tab t) {
    int k = 0;
    while (k + 1 < t.n && (int)blockIdx.x >= t.blk0[k + 1]) k++;
    const adam_ent E = t.e[k];           /* into registers: the loop reads no parameter memory */
    const int64_t blk = (int64_t)blockIdx.x - t.blk0[k], nblk = t.blk0[k + 1] - t.blk0[k];
    if (E.gc) adam_part<true>(E, blk, nblk);
    else adam_part<false>(E, blk, nblk);
}

/* blocks of KN_THREADS for an update: a float4 group a thread (kn_blocks' cap) */
static unsigned adam_blocks(const adam_ent &E) { return kn_blocks(E.n / 4 > 0 ? E.n / 4 : 1); }

static bool dense32(const kn_tview *v) { return v->dtype == KN_F32 && kn_tview_is_contiguous(v) && kn_aligned16(v->data); }

/* e as an f32 float4 update; false where it is not one (k_adam takes it) */
static bool adam_ent_of(const kn_exec *e, adam_ent *E) {
    const kn_tview *p = &e->dst, *g = &e->src[1], *m = &e->src[2], *v = &e->src[3], *c = &e->src[4];
    if (e->node->op != KN_OP_ADAM_UPDATE || !dense32(p) || !dense32(m) || !dense32(v) || g->dtype != KN_F32 ||
        c->dtype != KN_F32 || kn_env_get()->cuda_generic)
        return false;
    const bool gc = kn_tview_is_contiguous(g) && kn_aligned16(g->data);
    if (!gc && g->ndim != 2) return false;
    const kn_op_params *q = &e->node->p;
    E->p = (float *)p->data; E->m = (float *)m->data; E->v = (float *)v->data;
    E->g = (const float *)g->data; E->c = (const float *)c->data;
    E->n = kn_tview_numel(p);
    E->C = g->ndim == 2 ? g->ne[1] : 1;
    E->gs0 = g->ndim == 2 ? g->st[0] : 0;
    E->gs1 = g->ndim == 2 ? g->st[1] : 0;
    E->cst = c->ndim ? c->st[0] : 1;
    E->b1c = (float)(1 - q->adam.beta1); E->b2 = (float)q->adam.beta2; E->b2c = (float)(1 - q->adam.beta2);
    E->eps = (float)q->adam.eps; E->l2 = (float)q->adam.l2;
    E->gc = gc;
    return true;
}

static kn_status adam_fast(const kn_exec *e) {
    adam_ent E;
    if (!adam_ent_of(e, &E)) return KN_ERR_UNSUPPORTED;
    const unsigned blocks = adam_blocks(E);
    if (E.gc) k_adam_f32<true><<<blocks, KN_THREADS, 0, kn_cu_stream()>>>(E);
    else k_adam_f32<false><<<blocks, KN_THREADS, 0, kn_cu_stream()>>>(E);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* The multi-tensor step (kn_backend.batch_ok / compute_batch): a model's
 * f32 updates, ADAM_TAB a launch. Each update keeps its own blocks, so the
 * bits are the one-at-a-time kernel's. Off unless KN_CUDA_TUNE=adam_batch=1:
 * on an H100 (session 21) it gained nothing on GPT-2 and ran the char GPT
 * 2-5 % slower (PERF.md); tests turn it on with kn_cu_adam_batch_mode(1).
 * kn_cu_adam_batches counts the launches, for tests. */
static int g_adam_batch = -1;
static uint64_t g_adam_batches;
extern "C" void kn_cu_adam_batch_mode(int on) { g_adam_batch = on != 0; }
extern "C" uint64_t kn_cu_adam_batches(void) { return g_adam_batches; }

bool kn_cu_batch_ok(kn_backend *be, const kn_exec *e) {
    (void)be;
    if (g_adam_batch < 0) g_adam_batch = kn_cuda_tune("adam_batch", 0) != 0;
    adam_ent E;
    return g_adam_batch && adam_ent_of(e, &E) && E.n > 0;
}

kn_status kn_cu_compute_batch(kn_backend *be, const kn_exec *es, int n) {
    (void)be;
    for (int i = 0; i < n; i++) {
        kn_status st = kn_cu_comm_before(&es[i]);    /* a gradient still being all-reduced (cuda_dist.cu) */
        if (st != KN_OK) return st;
    }
    for (int i0 = 0; i0 < n; i0 += ADAM_TAB) {
        adam_tab t;
        memset(&t, 0, sizeof t);
        int64_t blocks = 0;
        for (t.n = 0; t.n < ADAM_TAB && i0 + t.n < n; t.n++) {
            if (!adam_ent_of(&es[i0 + t.n], &t.e[t.n])) return KN_ERR_UNSUPPORTED;   /* batch_ok said yes: not reached */
            t.blk0[t.n] = (int)blocks;
            blocks += adam_blocks(t.e[t.n]);
        }
        t.blk0[t.n] = (int)blocks;
        k_adam_f32_batch<<<(unsigned)blocks, KN_THREADS, 0, kn_cu_stream()>>>(t);
        KN_CUDA_LAUNCHED();
        g_adam_batches++;
    }
    return KN_OK;
}

__global__ void k_adam(kn_dview p, kn_dview g, kn_dview m, kn_dview v, kn_dview c, int64_t n, double b1, double b2,
                       double eps, double l2) {
    double c0 = kn_dget(c, 0), c1 = kn_dget(c, c.st[0]), c2 = kn_dget(c, 2 * c.st[0]);
    KN_GRID_LOOP(i, n) {
        int64_t op = kn_doff(p, i), og = kn_doff(g, i), om = kn_doff(m, i), ov = kn_doff(v, i);
        double pv = kn_dget(p, op), gv = kn_dget(g, og) + l2 * pv;
        double mv = kn_dget(m, om), vv = kn_dget(v, ov);
        mv = mv + (gv - mv) * (1 - b1);
        vv = vv * b2 + gv * gv * (1 - b2);
        kn_dput(m, om, mv);
        kn_dput(v, ov, vv);
        kn_dput(p, op, pv * c0 - mv / (sqrt(vv) / c2 + eps) * c1);
    }
}

kn_status kn_cu_optim(const kn_exec *e) {
    const kn_tensor *t = e->node;
    if (t->op != KN_OP_ADAM_UPDATE) return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: no kernel for %s", kn_op_name(t->op));
    int64_t n = kn_tview_numel(&e->dst);
    if (n == 0) return KN_OK;
    kn_status st = adam_fast(e);
    if (st != KN_ERR_UNSUPPORTED) return st;
    k_adam<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), kn_dv(&e->src[1]), kn_dv(&e->src[2]), kn_dv(&e->src[3]),
                                         kn_dv(&e->src[4]), n, t->p.adam.beta1, t->p.adam.beta2, t->p.adam.eps,
                                         t->p.adam.l2);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
