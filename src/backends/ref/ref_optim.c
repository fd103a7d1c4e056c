/* ref_optim.c: the fused Adam/AdamW update (graph/ops_optim.c states the
 * arithmetic), element by element in double. The dst view is p's storage;
 * m (src 2) and v (src 3) are updated in place as well. */
#include "backends/ref/ref.h"
#include <math.h>

kn_status kn_ref_optim(const kn_exec *e) {
    const kn_tensor *t = e->node;
    if (t->op != KN_OP_ADAM_UPDATE)
        return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no kernel for %s", kn_op_name(t->op));
    const kn_tview *p = &e->dst, *g = &e->src[1], *m = &e->src[2], *v = &e->src[3], *c = &e->src[4];
    double c0 = LD(c, 0), c1 = LD(c, c->st[0]), c2 = LD(c, 2 * c->st[0]);
    double b1 = t->p.adam.beta1, b2 = t->p.adam.beta2, eps = t->p.adam.eps, l2 = t->p.adam.l2;
    int64_t n = kn_tview_numel(p);
    for (int64_t i = 0; i < n; i++) {
        int64_t op = kn_ref_off(p, i), og = kn_ref_off(g, i), om = kn_ref_off(m, i), ov = kn_ref_off(v, i);
        double pv = LD(p, op), gv = LD(g, og) + l2 * pv;
        double mv = LD(m, om), vv = LD(v, ov);
        mv = mv + (gv - mv) * (1 - b1);
        vv = vv * b2 + gv * gv * (1 - b2);
        ST(m, om, mv);
        ST(v, ov, vv);
        ST(p, op, pv * c0 - mv / (sqrt(vv) / c2 + eps) * c1);
    }
    return KN_OK;
}
