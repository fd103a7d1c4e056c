/* cpu_moe.c: the CPU backend's MUL_MAT_ID (src/graph/ops_moe.c): the rows of
 * y [T, k, N] are grouped by expert (a counting sort of ids [T, k]), each
 * expert's rows of x are gathered into one f32 block [n_e, C], and that
 * block goes through the backend's own MATMUL against W[e]^T, so f32 W takes
 * the packed SGEMM, f16/bf16/quantized W the GEMV/quantized dot kernels (few
 * rows) or the dequantize-once SGEMM (many rows), each threaded over N.
 * So each expert's weights are read once per call, and an expert with no
 * row costs nothing.
 *
 * Layouts: x f32 with any strides, W f32 with a unit stride in one of its
 * last two dims (W^T, as the gradient uses it, takes the SGEMM's transposed
 * path), f16/bf16 with a unit stride along C, block types as whole rows of C
 * elements one after another (else the reference runs), ids any integer
 * view, dst f32 contiguous (as kn__node makes it). An id out of range sends
 * the node to the reference, which reports it.
 *
 * Letters: T tokens, k slots, C input width, E experts, N output width.
 */
#include "backends/cpu/cpu_impl.h"
#include <stdlib.h>
#include <string.h>

bool kn_cpu_mul_mat_id(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *w = &e->src[1], *ids = &e->src[2], *y = &e->dst;
    if (!is_f32(x) || !is_f32(y) || !contig(y)) return false;
    int64_t T = y->ne[0], K = y->ne[1], N = y->ne[2], E = w->ne[0], C = w->ne[2], R = T * K;
    const kn_dtype_info *wi = kn_dtype_get(w->dtype);
    if (wi->is_quant && (w->st[2] != 1 || w->st[1] != C || w->st[0] != N * C)) return false;
    if (R == 0) return true;
    bool x3 = x->ndim == 3, bcast = x3 && x->ne[1] == 1;
    int64_t xc = x->st[x->ndim - 1];
    /* one allocation: counts/offsets [E + 1], row order [R], gathered x [R, C], products [R, N] */
    size_t n_idx = (size_t)(E + 1) + (size_t)R, bytes = n_idx * sizeof(int64_t) + sizeof(float) * (size_t)R * (size_t)(C + N);
    int64_t *start = malloc(bytes);
    if (!start) return false;
    int64_t *order = start + E + 1;
    float *xg = (float *)(order + R), *yg = xg + R * C;
    memset(start, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t r = 0; r < R; r++) {
        int64_t id = kn__load_id(ids, (r / K) * ids->st[0] + (r % K) * ids->st[1]);
        if (id < 0 || id >= E) { free(start); return false; }   /* the reference reports it */
        start[id + 1]++;
    }
    for (int64_t i = 0; i < E; i++) start[i + 1] += start[i];
    {   /* rows of each expert in (t, j) order; start[i] restored afterwards */
        int64_t *fill = malloc(sizeof(int64_t) * (size_t)E);
        if (!fill) { free(start); return false; }
        memcpy(fill, start, sizeof(int64_t) * (size_t)E);
        for (int64_t r = 0; r < R; r++) {
            int64_t id = kn__load_id(ids, (r / K) * ids->st[0] + (r % K) * ids->st[1]);
            order[fill[id]++] = r;
        }
        free(fill);
    }
    const float *X = x->data;
    for (int64_t i = 0; i < R; i++) {
        int64_t r = order[i], t = r / K, j = r % K;
        const float *src = X + t * x->st[0] + (x3 && !bcast ? j * x->st[1] : 0);
        float *dst = xg + i * C;
        if (xc == 1) memcpy(dst, src, sizeof(float) * (size_t)C);
        else for (int64_t c = 0; c < C; c++) dst[c] = src[c * xc];
    }
    /* decode: every expert's rows in one job through the packed copy */
    bool ok = true, done = wi->is_quant && kn_cpu_qpacked_experts(w, start, xg, yg);
    for (int64_t ex = 0; ex < E && ok && !done; ex++) {
        int64_t n = start[ex + 1] - start[ex];
        if (!n) continue;
        /* MATMUL [n, C] @ W[ex]^T [C, N] -> [n, N] */
        kn_exec f = {0};
        f.node = e->node;
        f.nsrc = 2;
        f.syms = e->syms;
        f.src[0] = (kn_tview){xg + start[ex] * C, KN_F32, 2, {n, C}, {C, 1}};
        const char *wb = (const char *)w->data + kn_dtype_nbytes(w->dtype, ex * w->st[0]);
        f.src[1] = (kn_tview){(void *)wb, w->dtype, 2, {C, N}, {w->st[2], w->st[1]}, w->buf};   /* W[ex]^T, any layout MATMUL takes;
                                                                                         the buffer: a packed copy serves every expert */
        f.dst = (kn_tview){yg + start[ex] * N, KN_F32, 2, {n, N}, {N, 1}};
        ok = kn_cpu_matmul(&f);
    }
    if (ok) {
        float *Y = y->data;
        for (int64_t i = 0; i < R; i++) memcpy(Y + order[i] * N, yg + i * N, sizeof(float) * (size_t)N);
    }
    free(start);
    return ok;
}
