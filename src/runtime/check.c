/* check.c: KN_CHECK=1, a differential check of a device backend.
 *
 * Each node a device backend computes is computed again on the reference
 * backend from the same inputs, and the nodes whose outputs differ are
 * printed on stderr (op, shapes, dtypes, relative L2 and the largest
 * difference). Use it to find which kernel of a device backend is wrong:
 * the first node printed is the first wrong one (later ones may only
 * inherit its error; they run from the device's own inputs, so an error
 * does not propagate through the reference side).
 *
 * Per node: wait for the queue, copy the byte span of every source view
 * (and the epilogue's bias and residual) and of the destination view to the
 * host (the destination's old contents matter for in-place ops), run the
 * device's kernel, wait, copy the destination back, run kn_backend_ref() on
 * the host copies and compare element by element over the destination
 * view. Fused groups of the compiler are not checked (their members have no
 * storage of their own): set KN_NOFUSE=1 as well to check every node. CUDA
 * graphs are off while checking (replay.c). Random ops (dropout) differ by
 * design. Slow: two copies and a wait per node; a debugging aid only.
 */
#include "runtime/runtime.h"
#include "core/env.h"      // defines: kn_env_get
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kn__check_mode(kn_backend *be) { return be->device != KN_DEVICE_HOST && kn_env_get()->check; }

/* Element offsets of the lowest and highest element a view touches. */
static void span_el(const kn_tview *v, int64_t *lo, int64_t *hi) {
    *lo = *hi = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->ne[i] <= 0) { *lo = *hi = 0; return; }
        int64_t d = (v->ne[i] - 1) * v->st[i];
        if (d < 0) *lo += d; else *hi += d;
    }
}

/* A host copy of the bytes a view spans; *hv is v re-pointed at it. */
static void *host_copy(kn_backend *be, const kn_tview *v, kn_tview *hv, bool *ok) {
    *hv = *v;
    hv->buf = NULL;
    if (!v->data) return NULL;
    const kn_dtype_info *d = kn_dtype_get(v->dtype);
    int64_t lo, hi;
    span_el(v, &lo, &hi);
    int64_t blo = lo / d->block_size * (int64_t)d->type_size, bhi = (hi / d->block_size + 1) * (int64_t)d->type_size;
    char *h = malloc((size_t)(bhi - blo));
    if (!h || be->copy_out(be, h, (const char *)v->data + blo, (size_t)(bhi - blo)) != KN_OK) {
        free(h);
        *ok = false;
        return NULL;
    }
    hv->data = h - blo;
    return h;
}

struct kn_check {
    void *src[KN_MAX_SRC], *bias, *res, *dst0;
    kn_exec he;             /* e on the host copies */
    kn_epilogue hepi;
    bool ok;
};

static int g_reported, g_checked, g_differ;
static kn_op g_first = KN_OP_NONE;

void kn__check_counts(int *checked, int *differ, kn_op *first) {
    *checked = g_checked; *differ = g_differ; *first = g_first;
    g_checked = g_differ = g_reported = 0;
    g_first = KN_OP_NONE;
}

kn_check *kn__check_before(kn_backend *be, const kn_exec *e) {
    kn_check *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ok = true;
    if (be->synchronize) be->synchronize(be);
    c->he = *e;
    c->he.aux = NULL;                                   /* device by-products: the host run neither writes nor reads them */
    memset(c->he.src_aux, 0, sizeof c->he.src_aux);
    for (int k = 0; k < e->nsrc; k++) c->src[k] = host_copy(be, &e->src[k], &c->he.src[k], &c->ok);
    c->dst0 = host_copy(be, &e->dst, &c->he.dst, &c->ok);
    if (e->epi) {
        c->hepi = *e->epi;
        if (e->epi->bias) c->bias = host_copy(be, &e->epi->vbias, &c->hepi.vbias, &c->ok);
        if (e->epi->res) c->res = host_copy(be, &e->epi->vres, &c->hepi.vres, &c->ok);
        c->he.epi = &c->hepi;
    }
    return c;
}

static void shape_str(const kn_tview *v, char *s, size_t n) {
    int w = snprintf(s, n, "%s[", kn_dtype_name(v->dtype));
    for (int i = 0; i < v->ndim && w < (int)n; i++) w += snprintf(s + w, n - w, i ? ",%lld" : "%lld", (long long)v->ne[i]);
    if (w < (int)n) snprintf(s + w, n - w, "]");
}

void kn__check_free(kn_check *c) {
    if (!c) return;
    for (int k = 0; k < KN_MAX_SRC; k++) free(c->src[k]);
    free(c->bias); free(c->res); free(c->dst0);
    free(c);
}

/* Compares the device's result with the reference's; prints a line when
 * they differ beyond the destination dtype's rounding. */
void kn__check_after(kn_backend *be, const kn_exec *e, kn_check *c, int index) {
    if (!c) return;
    kn_tview dv;
    void *dev = NULL;
    bool ok = c->ok;
    if (be->synchronize) be->synchronize(be);
    if (ok) dev = host_copy(be, &e->dst, &dv, &ok);
    kn_backend *ref = kn_backend_ref();
    kn_status st = ok ? ref->compute(ref, &c->he) : KN_ERR_BACKEND;
    const kn_dtype_info *di = kn_dtype_get(e->dst.dtype);
    g_checked++;
    if (ok && st == KN_OK && !di->is_quant) {
        double num = 0, den = 0, mx = 0;
        int64_t nan_diff = 0, n = kn_tview_numel(&e->dst), idx[KN_MAX_DIMS] = {0};
        for (int64_t q = 0; q < n; q++) {
            int64_t off = 0;
            for (int i = 0; i < e->dst.ndim; i++) off += idx[i] * e->dst.st[i];
            double a = kn_load(dv.dtype, dv.data, off), b = kn_load(c->he.dst.dtype, c->he.dst.data, off);
            if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) {
                if (!(isnan(a) && isnan(b)) && a != b) nan_diff++;
            } else {
                double d = a - b;
                num += d * d; den += b * b;
                if (fabs(d) > mx) mx = fabs(d);
            }
            for (int i = e->dst.ndim - 1; i >= 0; i--) { if (++idx[i] < e->dst.ne[i]) break; idx[i] = 0; }
        }
        double rel = sqrt(num) / (den > 0 ? sqrt(den) : 1);
        /* beyond the output's own rounding (and f32 summation order) */
        double tol = e->dst.dtype == KN_BF16 ? 2e-2 : e->dst.dtype == KN_F16 ? 4e-3 : di->is_int ? 0 : 1e-4;
        bool differs = rel > tol || nan_diff;
        if (differs && !g_differ++) g_first = e->node->op;
        if (differs && g_reported < 200) {
            char sh[96];
            shape_str(&e->dst, sh, sizeof sh);
            fprintf(stderr, "kiln check: node %d %s%s -> %s: rel L2 %.3g, max|d| %.3g, %lld NaN/inf mismatches; sources",
                    index, kn_op_name(e->node->op), e->epi ? "+epilogue" : "", sh, rel, mx, (long long)nan_diff);
            for (int k = 0; k < e->nsrc; k++) {
                shape_str(&e->src[k], sh, sizeof sh);
                fprintf(stderr, " %s (strides", sh);
                for (int i = 0; i < e->src[k].ndim; i++) fprintf(stderr, " %lld", (long long)e->src[k].st[i]);
                fprintf(stderr, ")");
            }
            fprintf(stderr, "\n");
            g_reported++;
        }
    } else if (g_reported < 200 && !di->is_quant) {
        fprintf(stderr, "kiln check: node %d %s: not checked (%s)\n", index, kn_op_name(e->node->op),
                !ok ? "copy to the host failed" : kn_last_error());
        g_reported++;
        kn_clear_error();
    }
    free(dev);
    kn__check_free(c);
}
