/* cuda_ops_optim.cu: the fused Adam/AdamW update node (graph/ops_optim.c
 * states the arithmetic) on the GPU: one thread per element, any float
 * dtype and strides, computed in double like the reference. p (dst), m
 * (src 2) and v (src 3) are written in place. The tuned f32 kernel in
 * adamw.cu (float4, fused bias correction) is the standalone benchmark. */
#include "backends/cuda/cuda_ops.cuh"

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
    k_adam<<<kn_blocks(n), KN_THREADS>>>(kn_dv(&e->dst), kn_dv(&e->src[1]), kn_dv(&e->src[2]), kn_dv(&e->src[3]),
                                         kn_dv(&e->src[4]), n, t->p.adam.beta1, t->p.adam.beta2, t->p.adam.eps,
                                         t->p.adam.l2);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
