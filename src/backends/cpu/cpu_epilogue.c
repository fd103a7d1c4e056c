/* cpu_epilogue.c: the CPU backend's matmul epilogues (kn_epilogue,
 * include/kiln_backend.h; docs/COMPILER.md "Matmul epilogues").
 *
 * f32 matmuls: the SGEMM (and the quantized/f16/bf16-weight paths of
 * cpu_matmul.c) call epi_piece on each finished piece of C while it is in
 * cache (kn_sgemm_ep); a piece is rows [m0,m1) x columns [n0,n1) of C
 * [rows, N] (rows: dst's leading dims flattened). Per row segment, with the
 * same vector kernels the unfused nodes run, so the bits are the unfused
 * plan's: y += bias (kn_vec_add), act (kn_vec_unary: every element through
 * the same polynomial, whatever the segment), y = res + y, then the cast
 * (kn_vec_f32_to_bf16 / _f16) into dst when C is a scratch.
 * Other dtypes (bf16, f16, f64 matmuls run on the reference kernels anyway):
 * the reference epilogue (ref_epilogue.c), which matches them too.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemm_post
#include "backends/cpu/vec.h"          // defines: kn_vec_add, kn_vec_unary, kn_vec_f32_to_*
#include "backends/ref/ref.h"          // defines: kn_ref_matmul_epilogue, kn_ref_matmul
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kn_epilogue *epi;
    int64_t N;
    const float *bias;          /* [N] f32 (a converted copy when bias is not plain f32), NULL */
    bool act; kn_vec_unary_op uop;
    const kn_tview *res;        /* dst's extents, f32 rows with unit stride, or gathered (resf) */
    bool res_fast;
    void *out; kn_dtype odt;    /* the cast's destination [rows, N] contiguous, NULL: C is dst */
} epi_job;

static void epi_piece(void *ctx, float *C, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const epi_job *j = ctx;
    int64_t len = n1 - n0;
    float tmp[256];
    for (int64_t i = m0; i < m1; i++) {
        float *y = C + i * ldc + n0;
        if (j->bias) kn_vec_add(y, y, j->bias + n0, len);
        if (j->act) kn_vec_unary(j->uop, y, y, len);
        if (j->res) {
            int64_t ro = off_lead(j->res, j->res->ndim - 1, i);
            if (j->res_fast) {
                kn_vec_add(y, (const float *)j->res->data + ro + n0, y, len);
            } else {        /* any float dtype and stride: widened exactly, a float add as the unfused node rounds it */
                int64_t sc = j->res->st[j->res->ndim - 1];
                for (int64_t c = 0; c < len; c += 256) {
                    int64_t k = len - c < 256 ? len - c : 256;
                    for (int64_t q = 0; q < k; q++) tmp[q] = (float)kn_load(j->res->dtype, j->res->data, ro + (n0 + c + q) * sc);
                    kn_vec_add(y + c, tmp, y + c, k);
                }
            }
        }
        if (j->out) {
            uint16_t *o = (uint16_t *)j->out + i * j->N + n0;
            if (j->odt == KN_BF16) kn_vec_f32_to_bf16(o, y, len);
            else kn_vec_f32_to_f16(o, y, len);
        }
    }
}

static bool act_map(kn_op op, kn_vec_unary_op *u) {
    switch (op) {
    case KN_OP_RELU: *u = KN_VU_RELU; return true;
    case KN_OP_GELU: *u = KN_VU_GELU_ERF; return true;
    case KN_OP_GELU_TANH: *u = KN_VU_GELU_TANH; return true;
    case KN_OP_SILU: *u = KN_VU_SILU; return true;
    default: return false;
    }
}

bool kn_cpu_epilogue_ok(const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) { return kn_ref_epilogue_ok(mm, epi, out); }

/* the product alone, by the fast path or the reference */
static kn_status mm_plain(const kn_exec *e) { return kn_cpu_matmul(e) ? KN_OK : kn_ref_matmul(e); }

typedef struct { const kn_sgemm_post *post; float *C; int64_t N; } whole_job;
static void whole_rows(void *p, int64_t r0, int64_t r1) {
    whole_job *w = p;
    w->post->fn(w->post->ctx, w->C, w->N, r0, r1, 0, w->N);
}
void kn_cpu_post_whole(const kn_sgemm_post *post, float *C, int64_t rows, int64_t N) {
    whole_job w = {post, C, N};
    kn_cpu_par_rows(whole_rows, &w, rows, rows * N);
}

kn_status kn_cpu_matmul_epilogue(const kn_exec *e) {
    if (e->epi->pre != KN_OP_NONE) {    /* A computed first (the reference's arithmetic), then the rest */
        kn_exec pm;
        kn_epilogue pe;
        void *pa;
        kn_status st = kn_ref_prologue(e, &pm, &pe, &pa);
        if (!st) st = pm.epi ? kn_cpu_matmul_epilogue(&pm) : mm_plain(&pm);
        free(pa);
        return st;
    }
    const kn_epilogue *p = e->epi;
    const kn_tview *d = &e->dst;
    kn_vec_unary_op uop = KN_VU_RELU;
    bool cast = d->dtype != p->dt;
    if (p->dt != KN_F32 || !contig(d) || (cast && d->dtype != KN_BF16 && d->dtype != KN_F16) ||
        (p->act != KN_OP_NONE && !act_map(p->act, &uop)) || d->ndim < 1)
        return kn_ref_matmul_epilogue(e, mm_plain);
    int64_t n = kn_tview_numel(d), N = d->ne[d->ndim - 1], rows = N ? n / N : 0;
    float *scratch = cast ? malloc(sizeof(float) * (size_t)(n ? n : 1)) : NULL;
    float *bias = NULL;
    if (p->bias && (p->vbias.dtype != KN_F32 || p->vbias.st[0] != 1)) bias = malloc(sizeof(float) * (size_t)(N ? N : 1));
    if ((cast && !scratch) || (p->bias && (p->vbias.dtype != KN_F32 || p->vbias.st[0] != 1) && !bias)) {
        free(scratch); free(bias);
        return kn_set_error(KN_ERR_NOMEM, "matmul epilogue: out of host memory for %lld elements", (long long)n);
    }
    if (bias) for (int64_t c = 0; c < N; c++) bias[c] = (float)kn_load(p->vbias.dtype, p->vbias.data, c * p->vbias.st[0]);
    epi_job j = {p, N, p->bias ? (bias ? bias : p->vbias.data) : NULL, p->act != KN_OP_NONE, uop,
                 p->res ? &p->vres : NULL, false, cast ? d->data : NULL, d->dtype};
    j.res_fast = p->res && p->vres.dtype == KN_F32 && (p->vres.st[p->vres.ndim - 1] == 1 || N == 1);
    kn_sgemm_post post = {epi_piece, &j};
    kn_exec m = *e;
    m.epi = NULL;
    if (cast) {
        kn_tview_dense(&m.dst, scratch, KN_F32);
    }
    kn_status st = KN_OK;
    if (!kn_cpu_matmul_ep(&m, &post)) {     /* a layout the fast paths do not take: reference, then the pieces */
        st = kn_ref_matmul(&m);
        if (st == KN_OK) kn_cpu_post_whole(&post, m.dst.data, rows, N);
    }
    free(scratch); free(bias);
    return st;
}
