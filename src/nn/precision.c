/* precision.c: mixed-precision training (kiln_nn.h, "mixed precision"):
 * the precision policy of a module tree, the cast placement of its Linear
 * layers, and the dynamic loss scaler's host side (the graph side, unscaling
 * and the skip, is in optim.c where the update is built).
 *
 * Cast placement, for y = x @ w^T + b with compute dtype h (bf16 or f16):
 *   y = cast(cast(x, h) @ cast(w, h)^T, f32) + b
 * x [..., in] and w [out, in] are f32; the matmul node has 16-bit operands
 * and a 16-bit result (the kernels accumulate in f32). The casts' gradient
 * rule is the cast back (autograd/rules.c g_cast), so backward gives
 * dy (f32) -> cast to h -> two h matmuls -> dx, dw cast to f32: the master
 * weight's gradient is f32, as its optimizer state is.
 * Attention on a device backend (kn__mod_attn_dtype): q, k, v are cast to h
 * before sdpa and y back to f32 after, so the GPU runs its 16-bit flash
 * kernels (backends/cuda/flash_attn.cu; f32 softmax statistics and
 * accumulators inside); the gradient flows back through the same casts.
 * On host backends attention stays f32: the CPU's fast attention is f32
 * only (16-bit operands would run the reference).
 * Non-goals: no per-op allow/deny lists (only Linear layers, tied LM heads
 * and device attention change), no 16-bit convolutions (their fast kernels
 * are f32 only; 16-bit inputs would run the reference). */
#include "nn-impl.h"
#include "core/cpu.h"                   // defines: kn_cpu (the CPU's bf16 / f16c feature bits)
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- names ---------------------------------------------------------------------- */
const char *kn_precision_name(kn_precision p) {
    switch (p) {
    case KN_PREC_F32: return "f32";
    case KN_PREC_BF16: return "bf16";
    case KN_PREC_F16: return "f16";
    }
    return "?";
}

kn_status kn_precision_parse(const char *s, kn_precision *out) {
    static const struct { const char *name; kn_precision p; } k[] = {
        {"f32", KN_PREC_F32}, {"fp32", KN_PREC_F32}, {"float32", KN_PREC_F32},
        {"bf16", KN_PREC_BF16}, {"bfloat16", KN_PREC_BF16},
        {"f16", KN_PREC_F16}, {"fp16", KN_PREC_F16}, {"float16", KN_PREC_F16}};
    for (size_t i = 0; s && i < sizeof k / sizeof k[0]; i++)
        if (!strcasecmp(s, k[i].name)) { if (out) *out = k[i].p; return KN_OK; }
    return kn_set_error(KN_ERR_INVALID, "precision '%s' is not one of f32, bf16, f16", s ? s : "(null)");
}

kn_dtype kn_precision_dtype(kn_precision p) {
    return p == KN_PREC_BF16 ? KN_BF16 : p == KN_PREC_F16 ? KN_F16 : KN_F32;
}

/* ---- what a backend can run ---------------------------------------------------- */
kn_status kn_precision_check(kn_ctx *ctx, kn_precision p) {
    if ((int)p < 0 || p > KN_PREC_F16) return kn_set_error(KN_ERR_INVALID, "unknown precision %d (use KN_PREC_F32, _BF16 or _F16)", (int)p);
    if (!ctx) return kn_set_error(KN_ERR_INVALID, "kn_precision_check: NULL context");
    kn_backend *be = kn_ctx_backend(ctx);
    if (p == KN_PREC_F32 || (be && be->device != KN_DEVICE_HOST)) return KN_OK;
    /* Host backends widen 16-bit matmul operands to f32 (cpu_matmul.c), so
     * any x86 CPU could compute it; the policy asks for the CPU's own 16-bit
     * support so that `bf16` means hardware that is built for it, and so
     * that a kernel on those instructions can replace the widening without
     * changing who may use it. */
    const kn_cpu_info *ci = kn_cpu();
    if (p == KN_PREC_BF16 && !ci->avx512bf16)
        return kn_set_error(KN_ERR_UNSUPPORTED, "bf16 compute on the %s backend needs a CPU with AVX512_BF16 (this one lacks "
                            "it); train with f32, or bf16 on a CUDA GPU", be ? kn_backend_name(be) : "host");
    if (p == KN_PREC_F16 && !ci->f16c)
        return kn_set_error(KN_ERR_UNSUPPORTED, "f16 compute on the %s backend needs a CPU with F16C (this one lacks it); "
                            "train with f32", be ? kn_backend_name(be) : "host");
    return KN_OK;
}

/* ---- the module tree's policy ------------------------------------------------------ */
static void set_rec(kn_module *m, kn_precision p) {
    m->prec = p;
    for (int i = 0; i < m->n_children; i++) set_rec(m->children[i], p);
}
kn_status kn_module_set_precision(kn_module *m, kn_precision p) {
    if (!m) return kn_set_error(KN_ERR_INVALID, "kn_module_set_precision: NULL module (an earlier constructor failed? %s)", kn_last_error());
    kn_status st = kn_precision_check(m->ctx, p);
    if (st) return st;
    set_rec(m, p);
    return KN_OK;
}
kn_precision kn_module_precision(const kn_module *m) { return m ? m->prec : KN_PREC_F32; }

kn_tensor *kn__mod_linear(const kn_module *m, kn_tensor *x, kn_tensor *w, kn_tensor *b) {
    kn_ctx *ctx = m->ctx;
    if (!x || !w) return NULL;
    kn_dtype h = kn_precision_dtype(m->prec), out = x->dtype;
    /* only f32 operands are lowered: an f64 model or a quantized weight keeps its own path */
    if (h == KN_F32 || x->dtype != KN_F32 || w->dtype != KN_F32) return kn_linear(ctx, x, w, b);
    kn_tensor *y = kn_linear(ctx, kn_cast(ctx, x, h), kn_cast(ctx, w, h), NULL);   /* [..., out] in h */
    y = kn_cast(ctx, y, out);
    return b ? kn_add(ctx, y, b) : y;
}

/* The dtype attention runs in under m's policy: h for f32 q on a device
 * backend, else q's own dtype (the CPU keeps f32, see the header). */
kn_dtype kn__mod_attn_dtype(const kn_module *m, const kn_tensor *q) {
    kn_dtype h = kn_precision_dtype(m->prec);
    kn_backend *be = kn_ctx_backend(m->ctx);
    if (!q || h == KN_F32 || q->dtype != KN_F32 || !be || be->device == KN_DEVICE_HOST) return q ? q->dtype : KN_F32;
    return h;
}

/* ---- the loss scaler (host side) ---------------------------------------------------- */
kn_loss_scaler_cfg kn_loss_scaler_defaults(void) {
    return (kn_loss_scaler_cfg){.init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2000};
}

kn_loss_scaler *kn_loss_scaler_new(kn_ctx *ctx, const kn_loss_scaler_cfg *cfg) {
    if (!ctx) return NULL;
    kn_loss_scaler_cfg c = cfg ? *cfg : kn_loss_scaler_defaults();
    if (!(c.init_scale > 0) || !isfinite((float)c.init_scale) || !(c.growth_factor >= 1) || !isfinite(c.growth_factor) ||
        !(c.backoff_factor > 0 && c.backoff_factor < 1) || c.growth_interval < 1) {
        kn__fail(ctx, KN_ERR_INVALID, "loss scaler: init_scale %g must be > 0 and finite in f32, growth_factor %g >= 1, "
                 "backoff_factor %g in (0, 1), growth_interval %lld >= 1 (kn_loss_scaler_defaults has torch's values)",
                 c.init_scale, c.growth_factor, c.backoff_factor, (long long)c.growth_interval);
        return NULL;
    }
    kn_loss_scaler *s = calloc(1, sizeof *s);
    if (!s) { kn__fail(ctx, KN_ERR_NOMEM, "loss scaler: out of memory"); return NULL; }
    s->ctx = ctx; s->cfg = c; s->scale = c.init_scale;
    s->scale_in = kn_input(ctx, KN_F32, 0, NULL);
    s->found_inf = kn_empty(ctx, KN_F32, 0, NULL);
    if (!s->scale_in || !s->found_inf || kn_init_zeros(s->found_inf) || kn__loss_scaler_write(s)) { free(s); return NULL; }
    kn_set_name(s->scale_in, "amp.scale");
    kn_set_name(s->found_inf, "amp.found_inf");
    return s;
}

void kn_loss_scaler_free(kn_loss_scaler *s) { free(s); }

kn_tensor *kn_loss_scaler_scale(kn_loss_scaler *s, kn_tensor *loss) {
    if (!s || !loss) return NULL;
    return kn_mul(s->ctx, loss, kn_cast(s->ctx, s->scale_in, loss->dtype));
}

kn_status kn__loss_scaler_write(kn_loss_scaler *s) {
    float v = (float)s->scale;
    return kn_tensor_write(s->scale_in, &v, KN_F32);
}

kn_status kn_loss_scaler_update(kn_loss_scaler *s, bool *skipped) {
    if (skipped) *skipped = false;
    if (!s) return kn_set_error(KN_ERR_INVALID, "kn_loss_scaler_update: NULL scaler");
    float f = 0;
    kn_status st = kn_tensor_read(s->found_inf, &f, KN_F32);
    if (st) return st;
    if (f != 0) {
        s->skipped++;
        s->good = 0;
        s->scale *= s->cfg.backoff_factor;
        if (s->opt) {                  /* a skipped step does not count (Adam's bias correction) */
            int64_t n = kn_optim_step_count(s->opt);
            if (n > 0 && (st = kn_optim_set_step_count(s->opt, n - 1))) return st;
        }
        if (skipped) *skipped = true;
    } else if (++s->good >= s->cfg.growth_interval) {
        s->good = 0;
        if (isfinite((float)(s->scale * s->cfg.growth_factor))) s->scale *= s->cfg.growth_factor;
    }
    return KN_OK;
}

double kn_loss_scaler_get_scale(const kn_loss_scaler *s) { return s ? s->scale : NAN; }
int64_t kn_loss_scaler_skipped(const kn_loss_scaler *s) { return s ? s->skipped : 0; }
void kn_loss_scaler_get_state(const kn_loss_scaler *s, double *scale, int64_t *good) {
    if (scale) *scale = s ? s->scale : NAN;
    if (good) *good = s ? s->good : 0;
}
kn_status kn_loss_scaler_set_state(kn_loss_scaler *s, double scale, int64_t good) {
    if (good < 0) return kn_set_error(KN_ERR_INVALID, "kn_loss_scaler_set_state: negative growth count %lld", (long long)good);
    kn_status st = kn_loss_scaler_set_scale(s, scale);
    if (!st) s->good = good;
    return st;
}
kn_status kn_loss_scaler_set_scale(kn_loss_scaler *s, double scale) {
    if (!s || !(scale > 0) || !isfinite((float)scale))
        return kn_set_error(KN_ERR_INVALID, "kn_loss_scaler_set_scale: scale %g must be > 0 and finite in f32", scale);
    s->scale = scale;
    s->good = 0;
    return kn__loss_scaler_write(s);
}
