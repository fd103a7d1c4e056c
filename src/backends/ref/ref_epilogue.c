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

/* The matmul of e (epilogue included) with matmul(e') doing the product
 * alone: dst itself when it has the matmul's dtype, else a scratch copy. */
kn_status kn_ref_matmul_epilogue(const kn_exec *e, kn_status (*matmul)(const kn_exec *)) {
    kn_exec m = *e;
    m.epi = NULL;
    void *tmp = NULL;
    if (e->dst.dtype != e->epi->dt) {
        int64_t n = kn_tview_numel(&e->dst);
        tmp = malloc(kn_dtype_nbytes(e->epi->dt, n ? n : 1));
        if (!tmp) return kn_set_error(KN_ERR_NOMEM, "matmul epilogue: out of host memory for %lld elements", (long long)n);
        m.dst.data = tmp;
        m.dst.dtype = e->epi->dt;
        int64_t s = 1;
        for (int i = m.dst.ndim - 1; i >= 0; i--) { m.dst.st[i] = s; s *= m.dst.ne[i]; }
    }
    kn_status st = matmul(&m);
    if (st == KN_OK) kn_ref_epilogue_apply(e, &m.dst);
    free(tmp);
    return st;
}
