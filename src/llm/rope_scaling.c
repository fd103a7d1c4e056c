/* rope_scaling.c: RoPE context-length scaling as per-pair frequency divisors
 * (kn_rope_ff): angle_i = pos * theta^(-2i/n_rot) / ff[i], i < n_rot/2.
 *
 * Llama 3 ("llama3" in a Hugging Face rope_scaling; GGUF files carry the
 * result as the tensor rope_freqs.weight): pairs whose wavelength 2*pi/f_i is
 * shorter than orig_ctx / high_freq_factor keep their frequency (ff = 1),
 * longer than orig_ctx / low_freq_factor are slowed by `factor`, and the band
 * in between blends the two by how many turns fit in the original context.
 *
 * YaRN ("yarn"): pairs that turn more than beta_fast times over the original
 * context keep their frequency, fewer than beta_slow times are interpolated
 * (slowed by `factor`), with a linear ramp over the pair index in between;
 * attention logits are also scaled by mscale^2 (mscale = 0.1 ln(factor) + 1,
 * times a model's attention factor), which the model applies through the
 * sdpa scale.
 */
#include "llm/model_impl.h"
#include <math.h>

kn_status kn__model_set_rope_ff(kn_model *m, const float *ff, double mscale) {
    kn_model_config *c = &m->cfg;
    m->rope_ff = kn_from_ptr(m->ctx, KN_F32, 1, (int64_t[]){c->n_rot / 2}, (void *)ff);
    if (!m->rope_ff) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    if (mscale != 1.0) c->attn_scale = mscale * mscale / sqrt((double)c->head_dim);
    return KN_OK;
}

void kn__rope_ff_llama3(float *ff, int n_rot, double theta, double factor, double low_freq_factor,
                        double high_freq_factor, double orig_ctx) {
    double lo_wl = orig_ctx / low_freq_factor, hi_wl = orig_ctx / high_freq_factor;
    for (int i = 0; i < n_rot / 2; i++) {
        double f = pow(theta, -2.0 * i / n_rot), wl = 2 * M_PI / f;
        if (wl < hi_wl) ff[i] = 1.0f;
        else if (wl > lo_wl) ff[i] = (float)factor;
        else {
            double smooth = (orig_ctx / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
            ff[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* pair index (fractional) whose frequency turns `rot` times over ctx positions */
static double yarn_dim(double rot, int n_rot, double theta, double ctx) {
    return n_rot * log(ctx / (rot * 2 * M_PI)) / (2 * log(theta));
}

double kn__rope_ff_yarn(float *ff, int n_rot, double theta, double factor, double orig_ctx, double beta_fast,
                        double beta_slow) {
    double lo = floor(yarn_dim(beta_fast, n_rot, theta, orig_ctx));
    double hi = ceil(yarn_dim(beta_slow, n_rot, theta, orig_ctx));
    if (lo < 0) lo = 0;
    if (hi > n_rot - 1) hi = n_rot - 1;
    if (hi == lo) hi += 0.001;
    for (int i = 0; i < n_rot / 2; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;     /* 0: keep (extrapolate), 1: interpolate */
        double keep = 1 - ramp;
        ff[i] = (float)(1.0 / ((1 - keep) / factor + keep));
    }
    return factor > 1 ? 0.1 * log(factor) + 1 : 1.0;
}
