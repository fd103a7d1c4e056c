/* ref_epilogue.c: matmul epilogues on the reference backend (kn_epilogue,
 * include/kiln_backend.h; docs/COMPILER.md "Matmul epilogues").
 *
 * The oracle's way: the matmul first (into dst when it has the matmul's
 * dtype, else into a scratch copy of that dtype), then one pass over the
 * elements doing what the unfused nodes would: each step in double through
 * the op table's scalar functions, rounded to the matmul's dtype the way
 * kn_store stores it, the cast last. So a fused plan on ref gives the unfused
 * plan's bits. The CPU backend falls back to this too.
 */
#include "backends/ref/ref.h"
#include "graph/scalar_ops.h"   // defines: kn_scalar_unary, kn_scalar_binary
#include "core/env.h"            // defines: kn_env_get (KN_EPILOGUE)
#include <math.h>
#include <stdlib.h>

/* v as a value of dtype dt holds it (RNE), back in double */
static double round_to(kn_dtype dt, double v) {
    if (dt == KN_F64) return v;
    double slot;                /* 8 bytes: room for any float dtype's element */
    kn_store(dt, &slot, 0, v);
    return kn_load(dt, &slot, 0);
}

bool kn_ref_epilogue_ok(const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)mm;
    /* the host backends gain nothing measurable from epilogues (docs/COMPILER.md):
     * only when asked for (KN_EPILOGUE=1), for the tests and comparisons */
    if (kn_env_get()->epilogue != 1) return false;
    if (epi->pre != KN_OP_NONE && (epi->pre != KN_OP_RMS_NORM && epi->pre != KN_OP_SILU)) return false;
    bool fl = epi->dt == KN_F32 || epi->dt == KN_F64 || epi->dt == KN_F16 || epi->dt == KN_BF16;
    bool ofl = out == KN_F32 || out == KN_F64 || out == KN_F16 || out == KN_BF16;
    return fl && ofl && (!epi->bias || !kn_dtype_get(epi->vbias.dtype)->is_quant) &&
           (!epi->res || !kn_dtype_get(epi->vres.dtype)->is_quant);
}

/* dst = the epilogue of mm (dst's extents, dtype epi->dt; may be dst itself) */
void kn_ref_epilogue_apply(const kn_exec *e, const kn_tview *mm) {
    const kn_epilogue *p = e->epi;
    const kn_tview *d = &e->dst;
    int64_t n = kn_tview_numel(d), N = d->ndim ? d->ne[d->ndim - 1] : 1;
    for (int64_t i = 0; i < n; i++) {
        double v = LD(mm, kn_ref_off(mm, i));
        if (p->bias) v = round_to(p->dt, kn_scalar_binary(KN_OP_ADD, v, LD(&p->vbias, (i % N) * p->vbias.st[0])));
        if (p->act != KN_OP_NONE) v = round_to(p->dt, kn_scalar_unary(p->act, v, 0, 0));
        if (p->res) v = round_to(p->dt, kn_scalar_binary(KN_OP_ADD, LD(&p->vres, kn_ref_off(&p->vres, i)), v));
        ST(d, kn_ref_off(d, i), v);         /* the cast, when dst's dtype differs */
    }
}

kn_status kn_ref_prologue(const kn_exec *e, kn_exec *m, kn_epilogue *epi, void **tmp) {
    *m = *e;
    *tmp = NULL;
    const kn_epilogue *p = e->epi;
    if (!p || p->pre == KN_OP_NONE) return KN_OK;
    const kn_tview *x = &e->src[0], *w = &p->vpre;
    int64_t n = kn_tview_numel(x), K = x->ndim ? x->ne[x->ndim - 1] : 1, rows = K ? n / K : 0;
    float *a = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!a) return kn_set_error(KN_ERR_NOMEM, "matmul prologue: out of host memory for %lld elements", (long long)n);
    for (int64_t r = 0; r < rows; r++) {
        double rstd = 1.0;
        if (p->pre == KN_OP_RMS_NORM) {     /* as the unfused rms_norm (ref_nn.c): double statistics */
            double ss = 0;
            for (int64_t j = 0; j < K; j++) { double v = LD(x, kn_ref_off(x, r * K + j)); ss += v * v; }
            rstd = 1.0 / sqrt(ss / (double)K + (double)p->pre_eps);
        }
        for (int64_t j = 0; j < K; j++) {
            double v = LD(x, kn_ref_off(x, r * K + j));
            if (p->pre == KN_OP_RMS_NORM) {
                v *= rstd;
                if (p->pre_w) v *= LD(w, j * w->st[0]);
            } else {                        /* silu(x) * u, each rounded to f32 as the unfused nodes store it */
                v = round_to(KN_F32, kn_scalar_unary(KN_OP_SILU, v, 0, 0));
                v = kn_scalar_binary(KN_OP_MUL, v, LD(w, kn_ref_off(w, r * K + j)));
            }
            a[r * K + j] = (float)v;
        }
    }
    kn_tview_dense(&m->src[0], a, KN_F32);
    *epi = *p;
    epi->pre = KN_OP_NONE;
    bool rest = epi->bias || epi->act != KN_OP_NONE || epi->res || e->dst.dtype != epi->dt;
    m->epi = rest ? epi : NULL;
    *tmp = a;
    return KN_OK;
}

/* The matmul of e (epilogue included) with matmul(e') doing the product
 * alone: dst itself when it has the matmul's dtype, else a scratch copy. */
kn_status kn_ref_matmul_epilogue(const kn_exec *e, kn_status (*matmul)(const kn_exec *)) {
    if (e->epi->pre != KN_OP_NONE) {    /* A computed first, then the rest */
        kn_exec pm;
        kn_epilogue pe;
        void *pa;
        kn_status st = kn_ref_prologue(e, &pm, &pe, &pa);
        if (!st) st = pm.epi ? kn_ref_matmul_epilogue(&pm, matmul) : matmul(&pm);
        free(pa);
        return st;
    }
    kn_exec m = *e;
    m.epi = NULL;
    void *tmp = NULL;
    if (e->dst.dtype != e->epi->dt) {
        int64_t n = kn_tview_numel(&e->dst);
        tmp = malloc(kn_dtype_nbytes(e->epi->dt, n ? n : 1));
        if (!tmp) return kn_set_error(KN_ERR_NOMEM, "matmul epilogue: out of host memory for %lld elements", (long long)n);
        kn_tview_dense(&m.dst, tmp, e->epi->dt);
    }
    kn_status st = matmul(&m);
    if (st == KN_OK) kn_ref_epilogue_apply(e, &m.dst);
    free(tmp);
    return st;
}
