/* ref_moe.c: the reference TOPK and MUL_MAT_ID (src/graph/ops_moe.c states
 * them), plain loops in double over any strides: the oracle.
 *
 * Letters: T tokens, k slots per token, C input width, E experts, N output
 * width. Every expert id is checked before anything is written.
 */
#include "backends/ref/ref.h"
#include "backends/quant/quant.h"      /* defines: kn_dequantize_row */
#include <math.h>
#include <stdlib.h>

/* a comes before b in the order topk returns (ties: lower index first, via
 * the caller's strict comparison); NaN is the largest value */
static bool before(double a, double b, bool largest) {
    if (isnan(a) || isnan(b)) return largest ? isnan(a) && !isnan(b) : isnan(b) && !isnan(a);
    return largest ? a > b : a < b;
}

static kn_status topk(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int last = x->ndim - 1;
    int64_t n = x->ne[last], k = y->ne[last], rows = 1;
    for (int d = 0; d < last; d++) rows *= x->ne[d];
    bool largest = e->node->p.topk.largest;
    bool *taken = malloc((size_t)(n ? n : 1));
    if (!taken) return kn_set_error(KN_ERR_NOMEM, "topk: out of memory");
    for (int64_t r = 0; r < rows; r++) {
        /* row r's first element in x and y: r over the leading dims */
        int64_t xo = 0, yo = 0, lin = r;
        for (int d = last - 1; d >= 0; d--) {
            int64_t q = lin % x->ne[d];
            lin /= x->ne[d];
            xo += q * x->st[d]; yo += q * y->st[d];
        }
        for (int64_t i = 0; i < n; i++) taken[i] = false;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            double bv = 0;
            for (int64_t i = 0; i < n; i++) {
                if (taken[i]) continue;
                double v = LD(x, xo + i * x->st[last]);
                if (best < 0 || before(v, bv, largest)) { best = i; bv = v; }
            }
            taken[best] = true;
            ST(y, yo + j * y->st[last], (double)best);
        }
    }
    free(taken);
    return KN_OK;
}

static kn_status mul_mat_id(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *w = &e->src[1], *ids = &e->src[2], *y = &e->dst;
    int64_t T = y->ne[0], K = y->ne[1], N = y->ne[2], E = w->ne[0], C = w->ne[2];
    bool x3 = x->ndim == 3, bcast = x3 && x->ne[1] == 1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++) {
            int64_t id = kn__load_id(ids, t * ids->st[0] + j * ids->st[1]);
            if (id < 0 || id >= E) return kn__index_error("mul_mat_id", (double)id, 0, E);
        }
    const kn_dtype_info *wi = kn_dtype_get(w->dtype);
    if (wi->is_quant && w->st[2] != 1)
        return kn_set_error(KN_ERR_UNSUPPORTED, "mul_mat_id: a quantized W must have whole rows (unit stride along C)");
    float *row = malloc(sizeof(float) * (size_t)(C ? C : 1));
    if (!row) return kn_set_error(KN_ERR_NOMEM, "mul_mat_id: out of memory");
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++) {
            int64_t id = kn__load_id(ids, t * ids->st[0] + j * ids->st[1]);
            int64_t xo = t * x->st[0] + (x3 && !bcast ? j * x->st[1] : 0);
            int64_t cs = x->st[x->ndim - 1];
            for (int64_t nn = 0; nn < N; nn++) {
                int64_t wo = id * w->st[0] + nn * w->st[1];
                double s = 0;
                if (wi->is_quant) {
                    /* element offset wo is a whole number of blocks (rows of C) */
                    kn_status st = kn_dequantize_row(w->dtype, (const char *)w->data + kn_dtype_nbytes(w->dtype, wo), row, C);
                    if (st) { free(row); return st; }
                    for (int64_t c = 0; c < C; c++) s += (double)row[c] * LD(x, xo + c * cs);
                } else {
                    for (int64_t c = 0; c < C; c++) s += LD(w, wo + c * w->st[2]) * LD(x, xo + c * cs);
                }
                ST(y, t * y->st[0] + j * y->st[1] + nn * y->st[2], s);
            }
        }
    free(row);
    return KN_OK;
}

kn_status kn_ref_moe(const kn_exec *e) {
    return e->node->op == KN_OP_TOPK ? topk(e) : mul_mat_id(e);
}
