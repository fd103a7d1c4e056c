/* sum_to.c: kn__sum_to, undoing broadcasting, which every family of
 * gradient rules needs (rules.c, rules_nn.c). It has its own file so that
 * rules.c (which dispatches to the families) and the families do not call
 * each other in a circle. */
#include "autograd/autograd.h"

/* Undo broadcasting: sum g over the dims that t was broadcast along. */
kn_tensor *kn__sum_to(kn_ctx *ctx, kn_tensor *g, const kn_tensor *t) {
    if (!g) return NULL;
    if (kn_same_shape(g, t)) return g;
    int axes[KN_MAX_DIMS], na = 0, off = g->ndim - t->ndim;
    for (int i = 0; i < g->ndim; i++) {
        int j = i - off;
        if (j < 0 || (t->shape[j] == 1 && g->shape[i] != 1)) axes[na++] = i;
    }
    kn_tensor *s = na ? kn_sum(ctx, g, na, axes, true) : g;
    return kn_reshape(ctx, s, t->ndim, t->shape);
}
