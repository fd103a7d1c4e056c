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
 * bit for bit and the double reference to f32 rounding.
 * Anything else: k_adam, one thread per element, any float dtype and
 * strides, computed in double like the reference.
 * (adamw.cu's kn_cuda_adamw is a different recipe -- lr and the bias
 * corrections as host floats, decoupled decay inside -- so the node does
 * not call it.) */
#include "backends/cuda/cuda_ops.cuh"

/* one element: the f32 recipe of ops_optim.c */
__device__ __forceinline__ float adam_one(float p, float g, float &m, float &v, float c0, float c1, float c2, float b1c,
                                          float b2, float b2c, float eps, float l2) {
    g = __fadd_rn(g, __fmul_rn(l2, p));
    m = __fadd_rn(m, __fmul_rn(__fsub_rn(g, m), b1c));
    v = __fadd_rn(__fmul_rn(v, b2), __fmul_rn(__fmul_rn(g, g), b2c));
    return __fsub_rn(__fmul_rn(p, c0), __fmul_rn(__fdiv_rn(m, __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c2), eps)), c1));
}
/* p, m, v: [n] contiguous, 16-byte aligned; g contiguous (GC) or g[i] at
 * (i / C) * gs0 + (i % C) * gs1; c: the 3 coefficients (stride cst) */
template <bool GC>
__global__ void k_adam_f32(float *p, float *m, float *v, const float *g, int64_t n, int64_t C, int64_t gs0, int64_t gs1,
                           const float *c, int64_t cst, float b1c, float b2, float b2c, float eps, float l2) {
    const float c0 = c[0], c1 = c[cst], c2 = c[2 * cst];
    const int64_t n4 = n / 4;
    KN_GRID_LOOP(i, n4) {
        float4 pp = ((const float4 *)p)[i], mm = ((const float4 *)m)[i], vv = ((const float4 *)v)[i], gg;
        if (GC) gg = __ldg((const float4 *)g + i);
        else {
            int64_t j = 4 * i;
            gg.x = g[(j / C) * gs0 + (j % C) * gs1]; j++;
            gg.y = g[(j / C) * gs0 + (j % C) * gs1]; j++;
            gg.z = g[(j / C) * gs0 + (j % C) * gs1]; j++;
            gg.w = g[(j / C) * gs0 + (j % C) * gs1];
        }
        pp.x = adam_one(pp.x, gg.x, mm.x, vv.x, c0, c1, c2, b1c, b2, b2c, eps, l2);
        pp.y = adam_one(pp.y, gg.y, mm.y, vv.y, c0, c1, c2, b1c, b2, b2c, eps, l2);
        pp.z = adam_one(pp.z, gg.z, mm.z, vv.z, c0, c1, c2, b1c, b2, b2c, eps, l2);
        pp.w = adam_one(pp.w, gg.w, mm.w, vv.w, c0, c1, c2, b1c, b2, b2c, eps, l2);
        ((float4 *)p)[i] = pp; ((float4 *)m)[i] = mm; ((float4 *)v)[i] = vv;
    }
    /* the n % 4 tail, one element per thread of the first block */
    int64_t j = 4 * n4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        float gj = GC ? g[j] : g[(j / C) * gs0 + (j % C) * gs1];
        p[j] = adam_one(p[j], gj, m[j], v[j], c0, c1, c2, b1c, b2, b2c, eps, l2);
    }
}
static bool dense32(const kn_tview *v) { return v->dtype == KN_F32 && kn_tview_is_contiguous(v) && kn_aligned16(v->data); }

static kn_status adam_fast(const kn_exec *e, int64_t n) {
    const kn_tview *p = &e->dst, *g = &e->src[1], *m = &e->src[2], *v = &e->src[3], *c = &e->src[4];
    if (!dense32(p) || !dense32(m) || !dense32(v) || g->dtype != KN_F32 || c->dtype != KN_F32 || kn_env_get()->cuda_generic)
        return KN_ERR_UNSUPPORTED;
    bool gc = kn_tview_is_contiguous(g) && kn_aligned16(g->data);
    if (!gc && g->ndim != 2) return KN_ERR_UNSUPPORTED;
    const kn_op_params *q = &e->node->p;
    int64_t C = g->ndim == 2 ? g->ne[1] : 1, gs0 = g->ndim == 2 ? g->st[0] : 0, gs1 = g->ndim == 2 ? g->st[1] : 0;
    int64_t cst = c->ndim ? c->st[0] : 1;
    float b1c = (float)(1 - q->adam.beta1), b2 = (float)q->adam.beta2, b2c = (float)(1 - q->adam.beta2);
    float eps = (float)q->adam.eps, l2 = (float)q->adam.l2;
    unsigned blocks = kn_blocks(n / 4 > 0 ? n / 4 : 1);
    if (gc)
        k_adam_f32<true><<<blocks, KN_THREADS, 0, kn_cu_stream()>>>((float *)p->data, (float *)m->data, (float *)v->data,
            (const float *)g->data, n, C, gs0, gs1, (const float *)c->data, cst, b1c, b2, b2c, eps, l2);
    else
        k_adam_f32<false><<<blocks, KN_THREADS, 0, kn_cu_stream()>>>((float *)p->data, (float *)m->data, (float *)v->data,
            (const float *)g->data, n, C, gs0, gs1, (const float *)c->data, cst, b1c, b2, b2c, eps, l2);
    KN_CUDA_LAUNCHED();
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
    kn_status st = adam_fast(e, n);
    if (st != KN_ERR_UNSUPPORTED) return st;
    k_adam<<<kn_blocks(n), KN_THREADS, 0, kn_cu_stream()>>>(kn_dv(&e->dst), kn_dv(&e->src[1]), kn_dv(&e->src[2]), kn_dv(&e->src[3]),
                                         kn_dv(&e->src[4]), n, t->p.adam.beta1, t->p.adam.beta2, t->p.adam.eps,
                                         t->p.adam.l2);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
