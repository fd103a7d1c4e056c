/* ref_dist.c: the collectives (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER,
 * BROADCAST) on host tensors, over the communicator's control channel
 * (core/dist.c). Operands of any layout: gathered into a contiguous buffer
 * of their dtype, exchanged, written back. The CPU backend runs these too. */
#include "backends/ref/ref.h"
#include "core/dist.h"
#include <stdlib.h>
#include <string.h>

static void pack(const kn_tview *v, char *buf, int64_t n) {
    size_t es = kn_dtype_get(v->dtype)->type_size;
    for (int64_t i = 0; i < n; i++) memcpy(buf + (size_t)i * es, (const char *)v->data + (size_t)kn_ref_off(v, i) * es, es);
}
static void unpack(const kn_tview *v, const char *buf, int64_t n) {
    size_t es = kn_dtype_get(v->dtype)->type_size;
    for (int64_t i = 0; i < n; i++) memcpy((char *)v->data + (size_t)kn_ref_off(v, i) * es, buf + (size_t)i * es, es);
}

kn_status kn_ref_comm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_dist *d = t->p.dist.comm;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int64_t nx = kn_tview_numel(x), ny = kn_tview_numel(y);
    size_t es = kn_dtype_get(x->dtype)->type_size;
    char *buf = malloc((size_t)(nx > ny ? nx : ny) * es + 1);
    char *all = NULL;
    if (!buf) return kn_set_error(KN_ERR_NOMEM, "%s: out of memory (%lld elements)", kn_op_name(t->op), (long long)nx);
    pack(x, buf, nx);
    kn_status st = KN_OK;
    switch (t->op) {
    case KN_OP_ALL_REDUCE:
        st = kn_dist_all_reduce_host(d, x->dtype, buf, nx, (kn_dist_op)t->p.dist.op);
        if (!st) unpack(y, buf, ny);
        break;
    case KN_OP_BROADCAST:
        st = kn_dist_broadcast_host(d, buf, (size_t)nx * es, t->p.dist.root);
        if (!st) unpack(y, buf, ny);
        break;
    case KN_OP_ALL_GATHER:
        if (!(all = malloc((size_t)ny * es + 1))) { st = kn_set_error(KN_ERR_NOMEM, "all_gather: out of memory"); break; }
        st = kn_dist_all_gather_host(d, buf, (size_t)nx * es, all);
        if (!st) unpack(y, all, ny);
        break;
    case KN_OP_REDUCE_SCATTER:
        /* the whole sum on every rank, then this rank's rows */
        st = kn_dist_all_reduce_host(d, x->dtype, buf, nx, (kn_dist_op)t->p.dist.op);
        if (!st) unpack(y, buf + (size_t)kn_dist_rank(d) * (size_t)ny * es, ny);
        break;
    default:
        st = kn_set_error(KN_ERR_UNSUPPORTED, "reference backend: %s is not a collective", kn_op_name(t->op));
    }
    free(buf); free(all);
    return st;
}
