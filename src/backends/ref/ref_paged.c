/* ref_paged.c: the reference kernel of paged attention (KN_OP_PAGED_ATTN;
 * graph/ops_paged.c and include/kiln.h state the contract): plain loops in
 * double over any strides, two passes (scores, then softmax and values).
 * Letters: T query rows, H query heads, Hkv key/value heads, G = H / Hkv,
 * D/Dv head dims, P pool rows, bs block size, S sequences, MB blocks per
 * sequence. */
#include "backends/ref/ref.h"
#include <math.h>
#include <stdlib.h>

kn_status kn_ref_paged_attn(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *bt = &e->src[3], *rs = &e->src[4], *rp = &e->src[5];
    const kn_tview *y = &e->dst;
    int64_t T = q->ne[0], H = q->ne[1], D = q->ne[2], Hkv = k->ne[0], P = k->ne[1], Dv = v->ne[2];
    int64_t S = bt->ne[0], MB = bt->ne[1], bs = t->p.paged.block_size, win = t->p.paged.window, G = H / Hkv;
    double scale = t->p.paged.scale;
    double *s = malloc(sizeof(double) * (size_t)(MB * bs + 1));
    int64_t *slot = malloc(sizeof(int64_t) * (size_t)(MB * bs + 1));
    if (!s || !slot) { free(s); free(slot); return kn_set_error(KN_ERR_NOMEM, "paged_attn: out of memory"); }
    kn_status st = KN_OK;
    for (int64_t i = 0; i < T && !st; i++) {
        int64_t seq = (int64_t)LD(rs, i * rs->st[0]), pos = (int64_t)LD(rp, i * rp->st[0]);
        if (seq < 0 || seq >= S || pos < 0 || pos >= MB * bs) {
            st = kn_set_error(KN_ERR_INVALID, "paged_attn: row %lld has sequence %lld and position %lld; the block table "
                              "holds %lld sequences of %lld positions", (long long)i, (long long)seq, (long long)pos,
                              (long long)S, (long long)(MB * bs));
            break;
        }
        int64_t j0 = win > 0 && pos + 1 > win ? pos + 1 - win : 0;
        for (int64_t j = j0; j <= pos && !st; j++) {      /* pool row of each visible position */
            int64_t b = (int64_t)LD(bt, seq * bt->st[0] + (j / bs) * bt->st[1]);
            if (b < 0 || b * bs >= P)
                st = kn_set_error(KN_ERR_INVALID, "paged_attn: sequence %lld's block %lld is pool block %lld, outside [0, %lld)",
                                  (long long)seq, (long long)(j / bs), (long long)b, (long long)(P / bs));
            slot[j] = b * bs + j % bs;
        }
        for (int64_t h = 0; h < H && !st; h++) {
            int64_t hk = h / G;
            double m = -INFINITY, sum = 0;
            for (int64_t j = j0; j <= pos; j++) {
                double dot = 0;
                for (int64_t d = 0; d < D; d++)
                    dot += LD(q, i * q->st[0] + h * q->st[1] + d * q->st[2]) * LD(k, hk * k->st[0] + slot[j] * k->st[1] + d * k->st[2]);
                s[j] = dot * scale;
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = j0; j <= pos; j++) { s[j] = exp(s[j] - m); sum += s[j]; }
            for (int64_t d = 0; d < Dv; d++) {
                double acc = 0;
                for (int64_t j = j0; j <= pos; j++) acc += s[j] * LD(v, hk * v->st[0] + slot[j] * v->st[1] + d * v->st[2]);
                ST(y, i * y->st[0] + h * y->st[1] + d * y->st[2], acc / sum);
            }
        }
    }
    free(s);
    free(slot);
    return st;
}
