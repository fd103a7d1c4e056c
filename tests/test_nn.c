/* test_nn.c: modules and layers: parameter naming/iteration/counts, init
 * statistics, each layer's forward against a formula or a composition of
 * core ops, gradients through modules (finite differences), losses against
 * hand-computed values, module errors naming the module, and tiny models
 * (MLP, GPT-2, Llama) trained in one replayed plan with the loss falling. */
#include "kn_optest.h"
#include "kiln_nn.h"
#include <math.h>
#include <string.h>

static kn_ctx *new_ctx(void) { kn_ctx_opts o = {kn_backend_ref()}; return kn_ctx_new(&o); }

static double read1(kn_tensor *t) { double v = NAN; if (kn_tensor_read(t, &v, KN_F64)) return NAN; return v; }
static double *readall(kn_tensor *t) {
    int64_t n = kn_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (kn_tensor_read(t, v, KN_F64)) { free(v); return NULL; }
    return v;
}
static kn_tensor *from(kn_ctx *ctx, int nd, const int64_t *shape, double lo, double hi) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = kn_test_uniform(lo, hi);
    kn_tensor *t = kn_empty(ctx, KN_F32, nd, shape);
    kn_tensor_write(t, v, KN_F64);
    free(v);
    return t;
}
/* relative error of two tensors' values */
static double terr(kn_tensor *a, kn_tensor *b) {
    if (!a || !b || kn_numel(a) != kn_numel(b)) return INFINITY;
    double *x = readall(a), *y = readall(b);
    double e = (x && y) ? kn_rel_err(x, y, kn_numel(a)) : INFINITY;
    free(x); free(y);
    return e;
}

/* ---- module system ------------------------------------------------------------ */
TEST(module_names_and_counts) {
    kn_ctx *ctx = new_ctx();
    kn_nn_manual_seed(1);
    kn_module *net = kn_sequential_new(ctx, NULL);
    REQUIRE(net, "%s", kn_last_error());
    CHECK(!kn_sequential_add(net, kn_linear_new(ctx, 4, 8, true)), "%s", kn_last_error());
    CHECK(!kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU)), "add");
    CHECK(!kn_sequential_add(net, kn_batch_norm1d_new(ctx, 8, 1e-5, 0.1, true)), "add");
    CHECK(!kn_sequential_add(net, kn_linear_new(ctx, 8, 3, false)), "add");
    int n = kn_module_named_params(net, false, NULL, 0);
    CHECK(n == 5, "5 params, got %d", n);
    kn_named_param ps[16];
    int nb = kn_module_named_params(net, true, ps, 16);
    CHECK(nb == 7, "5 params + 2 buffers, got %d", nb);
    const char *want[7] = {"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "2.running_mean", "2.running_var"};
    for (int i = 0; i < 7 && i < nb; i++) CHECK(!strcmp(ps[i].name, want[i]), "name %d: %s vs %s", i, ps[i].name, want[i]);
    CHECK(ps[5].buffer && !ps[0].buffer && ps[1].no_decay && !ps[0].no_decay, "flags");
    CHECK(kn_module_n_params(net) == 4 * 8 + 8 + 8 + 8 + 8 * 3, "count %lld", (long long)kn_module_n_params(net));
    CHECK(kn_module_find(net, "2.running_var") == ps[6].t, "find buffer");
    CHECK(kn_module_find(net, "0.nope") == NULL && kn_module_find(net, "9.weight") == NULL, "find missing");
    kn_module_train(net, false);
    CHECK(!kn_module_is_training(kn_module_child(net, 2)), "eval propagates");
    CHECK(!strcmp(kn_module_kind(kn_module_child(net, 1)), "ReLU"), "kind");
    /* duplicate names are refused */
    kn_module *lin = kn_module_child(net, 0);
    CHECK(kn_module_add_param(lin, "weight", kn_param(ctx, KN_F32, 1, (int64_t[]){2}), false, false) != KN_OK, "dup name");
    CHECK(kn_module_add_param(lin, "a.b", kn_param(ctx, KN_F32, 1, (int64_t[]){2}), false, false) != KN_OK, "dotted name");
    kn_module_free(net);
    kn_ctx_free(ctx);
}

TEST(gpt2_param_names) {
    kn_ctx *ctx = new_ctx();
    kn_gpt2_cfg c = {.vocab = 64, .max_seq = 8, .dim = 32, .n_layers = 2, .n_heads = 4};
    kn_module *g = kn_gpt2_new(ctx, &c);
    REQUIRE(g, "%s", kn_last_error());
    kn_named_param ps[64];
    int n = kn_module_named_params(g, false, ps, 64);
    CHECK(n == 2 + 2 * 12 + 2, "param count %d", n);
    CHECK(!strcmp(ps[0].name, "wte.weight") && !strcmp(ps[2].name, "h.0.ln_1.weight"), "%s %s", ps[0].name, ps[2].name);
    CHECK(kn_module_find(g, "h.1.attn.c_attn.weight") && kn_module_find(g, "h.1.mlp.c_proj.bias") && kn_module_find(g, "ln_f.bias"), "find");
    kn_tensor *w = kn_module_find(g, "h.0.attn.c_attn.weight");
    CHECK(w && w->shape[0] == 96 && w->shape[1] == 32, "c_attn shape");
    int64_t C = 32, V = 64, T = 8;
    int64_t expect = V * C + T * C + 2 * (4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)) + 2 * C;
    CHECK(kn_module_n_params(g) == expect, "n_params %lld vs %lld", (long long)kn_module_n_params(g), (long long)expect);
    kn_module_free(g);
    kn_llama_cfg lc = {.vocab = 32, .dim = 16, .hidden = 24, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2};
    kn_module *l = kn_llama_new(ctx, &lc);
    REQUIRE(l, "%s", kn_last_error());
    kn_tensor *k = kn_module_find(l, "layers.0.self_attn.k_proj.weight");
    CHECK(k && k->shape[0] == 8 && k->shape[1] == 16, "GQA k_proj [Hkv*D, C]");
    CHECK(kn_module_find(l, "lm_head.weight") && kn_module_find(l, "layers.0.mlp.gate_proj.weight"), "llama names");
    kn_module_free(l);
    kn_ctx_free(ctx);
}

TEST(init_statistics) {
    kn_ctx *ctx = new_ctx();
    kn_nn_manual_seed(42);
    kn_module *lin = kn_linear_new(ctx, 256, 64, true);
    REQUIRE(lin, "%s", kn_last_error());
    double *w = readall(kn_module_find(lin, "weight"));
    double mx = 0, s2 = 0;
    for (int i = 0; i < 256 * 64; i++) { if (fabs(w[i]) > mx) mx = fabs(w[i]); s2 += w[i] * w[i]; }
    double bound = 1 / 16.0;  /* 1/sqrt(256) */
    CHECK(mx <= bound && mx > 0.95 * bound, "U(-1/sqrt(fan_in), ..): max %g bound %g", mx, bound);
    CHECK(fabs(sqrt(s2 / (256 * 64)) - bound / sqrt(3)) < 0.02 * bound, "uniform std");
    free(w);
    /* same seed, same weights; another seed differs */
    kn_nn_manual_seed(42);
    kn_module *lin2 = kn_linear_new(ctx, 256, 64, true);
    CHECK(terr(kn_module_find(lin, "weight"), kn_module_find(lin2, "weight")) == 0, "deterministic");
    kn_tensor *t = kn_param(ctx, KN_F32, 2, (int64_t[]){200, 300});
    CHECK(!kn_init_kaiming_normal(t, 0, KN_NONLIN_RELU, false), "%s", kn_last_error());
    double *v = readall(t), m = 0, q = 0;
    for (int i = 0; i < 60000; i++) { m += v[i]; q += v[i] * v[i]; }
    m /= 60000; q = sqrt(q / 60000 - m * m);
    CHECK(fabs(m) < 0.005 && fabs(q - sqrt(2.0 / 300)) < 0.01 * sqrt(2.0 / 300) * 3, "kaiming normal mean %g std %g", m, q);
    free(v);
    CHECK(!kn_init_xavier_uniform(t, 1.0), "xavier");
    v = readall(t); mx = 0;
    for (int i = 0; i < 60000; i++) if (fabs(v[i]) > mx) mx = fabs(v[i]);
    CHECK(mx <= sqrt(6.0 / 500) && mx > 0.99 * sqrt(6.0 / 500), "xavier bound %g", mx);
    free(v);
    int64_t fi, fo;
    kn_init_fans(kn_param(ctx, KN_F32, 4, (int64_t[]){8, 3, 5, 5}), &fi, &fo);
    CHECK(fi == 75 && fo == 200, "conv fans %lld %lld", (long long)fi, (long long)fo);
    kn_module *e = kn_embedding_new(ctx, 100, 100);
    v = readall(kn_module_find(e, "weight")); m = q = 0;
    for (int i = 0; i < 10000; i++) { m += v[i]; q += v[i] * v[i]; }
    CHECK(fabs(m / 1e4) < 0.05 && fabs(sqrt(q / 1e4) - 1) < 0.05, "embedding N(0,1)");
    free(v);
    kn_module_free(lin); kn_module_free(lin2); kn_module_free(e);
    kn_ctx_free(ctx);
}

/* ---- layer forwards ---------------------------------------------------------------- */
TEST(layer_forward_values) {
    kn_ctx *ctx = new_ctx();
    kn_test_seed(3); kn_nn_manual_seed(3);
    /* Linear = x W^T + b by matmul */
    kn_module *lin = kn_linear_new(ctx, 5, 3, true);
    kn_tensor *x = from(ctx, 3, (int64_t[]){2, 4, 5}, -1, 1);
    kn_tensor *W = kn_module_find(lin, "weight"), *b = kn_module_find(lin, "bias");
    CHECK(terr(kn_module_forward(lin, x), kn_add(ctx, kn_matmul(ctx, x, kn_transpose(ctx, W, 0, 1)), b)) < 1e-6, "linear");
    /* LayerNorm vs (x-mean)/sqrt(var+eps) */
    kn_module *ln = kn_layer_norm_new(ctx, 5, 1e-5, true, true);
    int ax = -1;
    kn_tensor *mu = kn_mean(ctx, x, 1, &ax, true), *var = kn_var(ctx, x, 1, &ax, 0, true);
    kn_tensor *ref = kn_div(ctx, kn_sub(ctx, x, mu), kn_sqrt(ctx, kn_add_scalar(ctx, var, 1e-5)));
    CHECK(terr(kn_module_forward(ln, x), ref) < 1e-5, "layernorm");
    kn_module *rms = kn_rms_norm_new(ctx, 5, 1e-6);
    kn_tensor *ms = kn_mean(ctx, kn_square(ctx, x), 1, &ax, true);
    CHECK(terr(kn_module_forward(rms, x), kn_mul(ctx, x, kn_rsqrt(ctx, kn_add_scalar(ctx, ms, 1e-6)))) < 1e-5, "rmsnorm");
    /* Embedding gathers rows */
    kn_module *emb = kn_embedding_new(ctx, 10, 4);
    int32_t idv[3] = {7, 0, 7};
    kn_tensor *ids = kn_from_data(ctx, KN_I32, 1, (int64_t[]){3}, idv);
    double *ev = readall(kn_module_forward(emb, ids)), *wv = readall(kn_module_find(emb, "weight"));
    CHECK(ev && wv && ev[0] == wv[28] && ev[4] == wv[0] && ev[11] == wv[31], "embedding rows");
    free(ev); free(wv);
    /* Conv2d vs kn_conv2d; Flatten; pools; activations */
    kn_module *cv = kn_conv2d_new(ctx, 2, 4, (int[]){3, 3}, (int[]){1, 1}, (int[]){1, 1}, NULL, 1, true);
    kn_tensor *img = from(ctx, 4, (int64_t[]){2, 2, 6, 6}, -1, 1);
    kn_tensor *y = kn_module_forward(cv, img);
    CHECK(y && y->shape[1] == 4 && y->shape[2] == 6, "conv shape");
    CHECK(terr(y, kn_conv2d(ctx, img, kn_module_find(cv, "weight"), kn_module_find(cv, "bias"), (int[]){1, 1}, (int[]){1, 1}, (int[]){1, 1}, 1)) == 0, "conv2d");
    kn_module *mp = kn_max_pool2d_new(ctx, (int[]){2, 2}, NULL, NULL);
    kn_tensor *p = kn_module_forward(mp, img);
    CHECK(p && p->shape[2] == 3 && p->shape[3] == 3, "maxpool default stride = kernel");
    kn_module *ap = kn_adaptive_avg_pool2d_new(ctx, 1, 1);
    int axes[2] = {2, 3};
    CHECK(terr(kn_module_forward(ap, img), kn_mean(ctx, img, 2, axes, true)) < 1e-6, "adaptive avg = mean");
    kn_module *fl = kn_flatten_new(ctx, 1, -1);
    kn_tensor *f = kn_module_forward(fl, img);
    CHECK(f && f->ndim == 2 && f->shape[1] == 72, "flatten");
    kn_module *ct = kn_conv_transpose2d_new(ctx, 2, 3, (int[]){2, 2}, (int[]){2, 2}, NULL, NULL, 1, true);
    kn_tensor *u = kn_module_forward(ct, img);
    CHECK(u && u->shape[1] == 3 && u->shape[2] == 12, "conv transpose upsamples");
    CHECK(kn_module_find(ct, "weight")->shape[0] == 2 && kn_module_find(ct, "weight")->shape[1] == 3, "convT weight [in,out,k,k]");
    kn_module *c1 = kn_conv1d_new(ctx, 3, 5, 3, 1, 0, 1, 1, false);
    kn_tensor *sig = from(ctx, 3, (int64_t[]){2, 3, 9}, -1, 1);
    kn_tensor *o1 = kn_module_forward(c1, sig);
    CHECK(o1 && o1->shape[1] == 5 && o1->shape[2] == 7, "conv1d shape");
    kn_module *gn = kn_group_norm_new(ctx, 2, 4, 1e-5, true);
    CHECK(terr(kn_module_forward(gn, y), kn_group_norm(ctx, y, 2, NULL, NULL, 1e-5)) < 1e-6, "groupnorm");
    kn_module *act = kn_act_new(ctx, KN_ACT_GELU_TANH);
    CHECK(terr(kn_module_forward(act, x), kn_gelu_tanh(ctx, x)) == 0, "activation module");
    kn_module *mods[] = {lin, ln, rms, emb, cv, mp, ap, fl, ct, c1, gn, act};
    for (size_t i = 0; i < sizeof mods / sizeof *mods; i++) kn_module_free(mods[i]);
    kn_ctx_free(ctx);
}

TEST(batchnorm_running_stats) {
    kn_ctx *ctx = new_ctx();
    kn_test_seed(5);
    kn_module *bn = kn_batch_norm2d_new(ctx, 3, 1e-5, 0.1, true);
    kn_tensor *x = from(ctx, 4, (int64_t[]){4, 3, 2, 2}, -2, 3);
    double *xv = readall(x);
    kn_tensor *y = kn_module_forward(bn, x);
    kn_tensor *eff[4];
    int ne = kn_module_effects(bn, eff, 4);
    CHECK(ne == 2, "two effects, got %d", ne);
    kn_tensor *outs[3] = {y, eff[0], eff[1]};
    kn_plan *pl = kn_plan_new(ctx, 3, outs, NULL);
    REQUIRE(pl, "%s", kn_last_error());
    for (int step = 0; step < 2; step++) CHECK(!kn_plan_run(pl), "run");
    double *rm = readall(kn_module_find(bn, "running_mean")), *rv = readall(kn_module_find(bn, "running_var"));
    for (int c = 0; c < 3; c++) {
        double s = 0, q = 0;
        for (int n = 0; n < 4; n++) for (int k = 0; k < 4; k++) s += xv[n * 12 + c * 4 + k];
        double mean = s / 16;
        for (int n = 0; n < 4; n++) for (int k = 0; k < 4; k++) q += pow(xv[n * 12 + c * 4 + k] - mean, 2);
        double var = q / 15;   /* unbiased */
        double em = 0, ev = 1;
        for (int step = 0; step < 2; step++) { em = 0.9 * em + 0.1 * mean; ev = 0.9 * ev + 0.1 * var; }
        CHECK(fabs(rm[c] - em) < 1e-6 && fabs(rv[c] - ev) < 1e-5, "channel %d: rm %g vs %g, rv %g vs %g", c, rm[c], em, rv[c], ev);
    }
    /* training output is normalised with batch stats: per channel mean 0 */
    double *yv = readall(y);
    double s = 0;
    for (int n = 0; n < 4; n++) for (int k = 0; k < 4; k++) s += yv[n * 12 + 4 + k];
    CHECK(fabs(s / 16) < 1e-5, "normalised mean %g", s / 16);
    /* eval uses running stats and adds no effects */
    kn_module_train(bn, false);
    kn_tensor *ye = kn_module_forward(bn, x);
    CHECK(kn_module_effects(bn, eff, 4) == 0, "no effects in eval");
    double *yev = readall(ye);
    CHECK(yev && fabs(yev[0] - (xv[0] - rm[0]) / sqrt(rv[0] + 1e-5)) < 1e-5, "eval formula");
    free(xv); free(rm); free(rv); free(yv); free(yev);
    kn_plan_free(pl);
    kn_module_free(bn);
    kn_ctx_free(ctx);
}

/* y of a plan run at rng steps 0 (*a) and 1 (*b) */
static bool two_steps(kn_ctx *ctx, kn_tensor *step, kn_tensor *y, double **a, double **b) {
    kn_plan *pl = kn_plan_new(ctx, 1, &y, NULL);
    if (!pl) return false;
    bool ok = true;
    for (int64_t s = 0; s < 2 && ok; s++) {
        ok = kn_tensor_write(step, &s, KN_I64) == KN_OK && kn_plan_run(pl) == KN_OK;
        if (ok) *(s == 0 ? a : b) = readall(y);
    }
    kn_plan_free(pl);
    return ok;
}

TEST(dropout_module) {
    kn_ctx *ctx = new_ctx();
    kn_module *d = kn_dropout_new(ctx, 0.5);
    kn_tensor *x = kn_ones(ctx, KN_F32, 1, (int64_t[]){1000});
    kn_tensor *step = kn_input(ctx, KN_I64, 0, NULL);
    CHECK(!kn_module_set_rng_step(d, step), "set step");
    kn_tensor *y = kn_module_forward(d, x);
    double *a = NULL, *b = NULL;
    REQUIRE(two_steps(ctx, step, y, &a, &b), "%s", kn_last_error());
    int diff = 0, zeros = 0;
    double sum = 0;
    for (int i = 0; i < 1000; i++) { diff += a[i] != b[i]; zeros += a[i] == 0; sum += a[i]; CHECK(a[i] == 0 || a[i] == 2, "values 0 or 2"); if (a[i] != 0 && a[i] != 2) break; }
    CHECK(diff > 300, "a new mask per step (%d differ)", diff);
    CHECK(zeros > 420 && zeros < 580, "p=0.5: %d zeros", zeros);
    CHECK(fabs(sum / 1000 - 1) < 0.16, "mean kept by the 1/(1-p) scale: %g", sum / 1000);
    free(a); free(b);
    kn_module_train(d, false);
    CHECK(kn_module_forward(d, x) == x, "eval is identity");
    kn_module_free(d);
    kn_ctx_free(ctx);
}

/* ---- attention against an explicit composition ------------------------------------------ */
TEST(attention_matches_composition) {
    kn_ctx *ctx = new_ctx();
    kn_test_seed(9); kn_nn_manual_seed(9);
    for (int gqa = 0; gqa < 2; gqa++) {
        kn_attn_cfg c = {.dim = 16, .n_heads = 4, .n_kv_heads = gqa ? 2 : 4, .bias = !gqa, .fused_qkv = !gqa, .causal = true, .rope = gqa, .rope_neox = true, .rope_theta = 10000};
        kn_module *m = kn_attention_new(ctx, &c);
        REQUIRE(m, "%s", kn_last_error());
        int64_t B = 2, T = 5, C = 16, H = 4, Hk = c.n_kv_heads, D = 4;
        kn_tensor *x = from(ctx, 3, (int64_t[]){B, T, C}, -1, 1);
        kn_tensor *pos = kn_arange(ctx, KN_I32, 0, (double)T, 1);
        kn_tensor *y = kn_attention_forward(m, x, gqa ? pos : NULL);
        REQUIRE(y, "%s", kn_last_error());
        /* by hand: explicit softmax(q k^T / sqrt(D) + mask) v with repeated kv heads */
        kn_tensor *q, *k, *v;
        if (!gqa) {
            kn_tensor *qkv = kn_linear(ctx, x, kn_module_find(m, "c_attn.weight"), kn_module_find(m, "c_attn.bias"));
            q = kn_narrow(ctx, qkv, 2, 0, C); k = kn_narrow(ctx, qkv, 2, C, C); v = kn_narrow(ctx, qkv, 2, 2 * C, C);
        } else {
            q = kn_linear(ctx, x, kn_module_find(m, "q_proj.weight"), NULL);
            k = kn_linear(ctx, x, kn_module_find(m, "k_proj.weight"), NULL);
            v = kn_linear(ctx, x, kn_module_find(m, "v_proj.weight"), NULL);
        }
        int perm[4] = {0, 2, 1, 3};
        q = kn_permute(ctx, kn_reshape(ctx, q, 4, (int64_t[]){B, T, H, D}), perm);
        k = kn_permute(ctx, kn_reshape(ctx, k, 4, (int64_t[]){B, T, Hk, D}), perm);
        v = kn_permute(ctx, kn_reshape(ctx, v, 4, (int64_t[]){B, T, Hk, D}), perm);
        if (gqa) {
            q = kn_rope(ctx, q, pos, (int)D, 10000, true, 1.0); k = kn_rope(ctx, k, pos, (int)D, 10000, true, 1.0);
            /* repeat each kv head H/Hk times: [B,Hk,T,D] -> [B,Hk,2,T,D] -> [B,H,T,D] */
            k = kn_reshape(ctx, kn_expand(ctx, kn_unsqueeze(ctx, k, 2), 5, (int64_t[]){B, Hk, H / Hk, T, D}), 4, (int64_t[]){B, H, T, D});
            v = kn_reshape(ctx, kn_expand(ctx, kn_unsqueeze(ctx, v, 2), 5, (int64_t[]){B, Hk, H / Hk, T, D}), 4, (int64_t[]){B, H, T, D});
        }
        kn_tensor *s = kn_mul_scalar(ctx, kn_matmul(ctx, q, kn_transpose(ctx, k, 2, 3)), 1 / sqrt((double)D));
        kn_tensor *mask = kn_triu(ctx, kn_ones(ctx, KN_BOOL, 2, (int64_t[]){T, T}), 1);
        kn_tensor *att = kn_softmax(ctx, kn_masked_fill(ctx, s, mask, -INFINITY), -1);
        kn_tensor *o = kn_reshape(ctx, kn_permute(ctx, kn_matmul(ctx, att, v), perm), 3, (int64_t[]){B, T, C});
        const char *pn = gqa ? "o_proj" : "c_proj";
        char wn[32], bn[32];
        snprintf(wn, sizeof wn, "%s.weight", pn); snprintf(bn, sizeof bn, "%s.bias", pn);
        o = kn_linear(ctx, o, kn_module_find(m, wn), kn_module_find(m, bn));
        CHECK(terr(y, o) < 1e-5, "attention %s: err %g", gqa ? "gqa+rope" : "fused", terr(y, o));
        kn_module_free(m);
    }
    kn_ctx_free(ctx);
}

/* attn_dropout: eval is the fused attention itself; training with a tiny p
 * is the unfused path with (almost) no mask, which must be the same
 * attention (GQA heads repeated, the causal mask, the scale); at p = 0.5
 * about half the probabilities are dropped and the rest scaled by 2, so the
 * output moves, and a new step draws a new mask */
TEST(attention_prob_dropout) {
    kn_ctx *ctx = new_ctx();
    kn_test_seed(12);
    int64_t B = 2, T = 6, C = 16;
    kn_tensor *x = from(ctx, 3, (int64_t[]){B, T, C}, -1, 1);
    kn_tensor *y[3];
    for (int i = 0; i < 3; i++) {
        kn_nn_manual_seed(5);                       /* the same weights each time */
        kn_attn_cfg c = {.dim = C, .n_heads = 4, .n_kv_heads = 2, .causal = true, .attn_dropout = i == 0 ? 0.5 : i == 1 ? 1e-12 : 0.5};
        kn_module *m = kn_attention_new(ctx, &c);
        REQUIRE(m, "%s", kn_last_error());
        if (i == 0) kn_module_train(m, false);
        y[i] = kn_attention_forward(m, x, NULL);
        REQUIRE(y[i], "%s", kn_last_error());
        kn_module_free(m);
    }
    CHECK(terr(y[1], y[0]) < 1e-5, "training, p ~ 0 (unfused) against eval (fused): err %g", terr(y[1], y[0]));
    CHECK(terr(y[2], y[0]) > 1e-2, "p = 0.5 changed nothing: err %g", terr(y[2], y[0]));
    kn_attn_cfg bad = {.dim = C, .n_heads = 4, .attn_dropout = 1};
    CHECK(!kn_attention_new(ctx, &bad) && strstr(kn_last_error(), "attn_dropout"), "attn_dropout 1 refused: %s", kn_last_error());
    /* a new mask each step through the tree's rng step */
    kn_nn_manual_seed(5);
    kn_attn_cfg c = {.dim = C, .n_heads = 4, .causal = true, .attn_dropout = 0.5};
    kn_module *m = kn_attention_new(ctx, &c);
    kn_tensor *step = kn_input(ctx, KN_I64, 0, NULL);
    REQUIRE(m && !kn_module_set_rng_step(m, step), "%s", kn_last_error());
    kn_tensor *o = kn_attention_forward(m, x, NULL);
    double *a = NULL, *b = NULL;
    REQUIRE(two_steps(ctx, step, o, &a, &b), "%s", kn_last_error());
    int diff = 0;
    for (int i = 0; i < B * T * C; i++) diff += a[i] != b[i];
    CHECK(diff > B * T * C / 2, "a new mask per step: %d of %d outputs differ", diff, (int)(B * T * C));
    free(a); free(b);
    kn_module_free(m);
    kn_ctx_free(ctx);
}

/* ---- recurrent: cells against the torch formulas -------------------------------------------- */
TEST(rnn_cells_formulas) {
    kn_ctx *ctx = new_ctx();
    kn_test_seed(12); kn_nn_manual_seed(12);
    kn_module *gru = kn_rnn_cell_new(ctx, KN_RNN_GRU, 3, 4, true);
    kn_module *lstm = kn_rnn_cell_new(ctx, KN_RNN_LSTM, 3, 4, true);
    REQUIRE(gru && lstm, "%s", kn_last_error());
    kn_tensor *x = from(ctx, 2, (int64_t[]){2, 3}, -1, 1), *h = from(ctx, 2, (int64_t[]){2, 4}, -1, 1), *c = from(ctx, 2, (int64_t[]){2, 4}, -1, 1);
    double *xv = readall(x), *hv = readall(h), *cv = readall(c);
    double *wi = readall(kn_module_find(gru, "weight_ih")), *wh = readall(kn_module_find(gru, "weight_hh"));
    double *bi = readall(kn_module_find(gru, "bias_ih")), *bh = readall(kn_module_find(gru, "bias_hh"));
    double *yg = readall(kn_rnn_cell_forward(gru, x, h, NULL));
    REQUIRE(yg, "%s", kn_last_error());
    double worst = 0;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 4; j++) {
            double gi[3], gh[3];
            for (int g = 0; g < 3; g++) {
                int row = g * 4 + j;
                gi[g] = bi[row]; gh[g] = bh[row];
                for (int k = 0; k < 3; k++) gi[g] += wi[row * 3 + k] * xv[b * 3 + k];
                for (int k = 0; k < 4; k++) gh[g] += wh[row * 4 + k] * hv[b * 4 + k];
            }
            double r = 1 / (1 + exp(-(gi[0] + gh[0]))), z = 1 / (1 + exp(-(gi[1] + gh[1])));
            double n = tanh(gi[2] + r * gh[2]);
            double want = (1 - z) * n + z * hv[b * 4 + j];
            worst = fmax(worst, fabs(yg[b * 4 + j] - want));
        }
    CHECK(worst < 1e-5, "GRU cell max err %g", worst);
    free(wi); free(wh); free(bi); free(bh);
    wi = readall(kn_module_find(lstm, "weight_ih")); wh = readall(kn_module_find(lstm, "weight_hh"));
    bi = readall(kn_module_find(lstm, "bias_ih")); bh = readall(kn_module_find(lstm, "bias_hh"));
    kn_tensor *cn = c;
    double *yl = readall(kn_rnn_cell_forward(lstm, x, h, &cn)), *cl = readall(cn);
    REQUIRE(yl && cl, "%s", kn_last_error());
    worst = 0;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 4; j++) {
            double s[4];
            for (int g = 0; g < 4; g++) {
                int row = g * 4 + j;
                s[g] = bi[row] + bh[row];
                for (int k = 0; k < 3; k++) s[g] += wi[row * 3 + k] * xv[b * 3 + k];
                for (int k = 0; k < 4; k++) s[g] += wh[row * 4 + k] * hv[b * 4 + k];
            }
            double i = 1 / (1 + exp(-s[0])), f = 1 / (1 + exp(-s[1])), g = tanh(s[2]), o = 1 / (1 + exp(-s[3]));
            double cc = f * cv[b * 4 + j] + i * g;
            worst = fmax(worst, fabs(cl[b * 4 + j] - cc) + fabs(yl[b * 4 + j] - o * tanh(cc)));
        }
    CHECK(worst < 1e-5, "LSTM cell max err %g", worst);
    free(xv); free(hv); free(cv); free(wi); free(wh); free(bi); free(bh); free(yg); free(yl); free(cl);
    /* layer: 2 layers over T=3 equals chaining cells by hand (RNN tanh) */
    kn_module *rnn = kn_rnn_new(ctx, KN_RNN_TANH, 3, 4, 2, true);
    kn_tensor *xs = from(ctx, 3, (int64_t[]){2, 3, 3}, -1, 1), *hn = NULL;
    kn_tensor *out = kn_rnn_forward(rnn, xs, NULL, NULL, &hn, NULL);
    REQUIRE(out && out->shape[1] == 3 && out->shape[2] == 4 && hn && hn->shape[0] == 2, "%s", kn_last_error());
    kn_tensor *h0 = kn_zeros(ctx, KN_F32, 2, (int64_t[]){2, 4}), *h1 = h0;
    for (int t = 0; t < 3; t++) {
        kn_tensor *xt = kn_select(ctx, xs, 1, t);
        h0 = kn_tanh(ctx, kn_add(ctx, kn_linear(ctx, xt, kn_module_find(rnn, "weight_ih_l0"), kn_module_find(rnn, "bias_ih_l0")),
                                 kn_linear(ctx, h0, kn_module_find(rnn, "weight_hh_l0"), kn_module_find(rnn, "bias_hh_l0"))));
        h1 = kn_tanh(ctx, kn_add(ctx, kn_linear(ctx, h0, kn_module_find(rnn, "weight_ih_l1"), kn_module_find(rnn, "bias_ih_l1")),
                                 kn_linear(ctx, h1, kn_module_find(rnn, "weight_hh_l1"), kn_module_find(rnn, "bias_hh_l1"))));
    }
    CHECK(terr(kn_select(ctx, out, 1, 2), h1) < 1e-6 && terr(kn_select(ctx, hn, 0, 0), h0) < 1e-6, "2-layer RNN unrolled");
    kn_module_free(gru); kn_module_free(lstm); kn_module_free(rnn);
    kn_ctx_free(ctx);
}

/* ---- gradients through modules (finite differences on the input, f64) ------------------------ */
typedef struct { int which; } mcase;
static kn_tensor *build_mod(kn_ctx *ctx, kn_tensor **in, void *ud) {
    mcase *c = ud;
    kn_nn_manual_seed(77);            /* same weights in every build */
    kn_module *m = NULL;
    kn_tensor *y = NULL;
    switch (c->which) {
    case 0: m = kn_linear_new(ctx, 3, 2, true); y = kn_module_forward(m, in[0]); break;
    case 1: m = kn_layer_norm_new(ctx, 3, 1e-5, true, true); y = kn_module_forward(m, in[0]); break;
    case 2: {
        kn_attn_cfg a = {.dim = 8, .n_heads = 4, .n_kv_heads = 2, .causal = true, .rope = true, .rope_neox = true, .rope_theta = 100};
        m = kn_attention_new(ctx, &a);
        y = kn_attention_forward(m, in[0], kn_arange(ctx, KN_I32, 0, 3, 1));
        break;
    }
    case 3: m = kn_rnn_new(ctx, KN_RNN_GRU, 3, 2, 1, true); y = kn_rnn_forward(m, in[0], NULL, NULL, NULL, NULL); break;
    case 4: m = kn_rnn_new(ctx, KN_RNN_LSTM, 3, 2, 2, true); y = kn_rnn_forward(m, in[0], NULL, NULL, NULL, NULL); break;
    case 5: {
        kn_block_cfg b = {.attn = {.dim = 8, .n_heads = 2, .bias = true, .fused_qkv = true, .causal = true},
                          .norm = KN_NORM_LAYER, .mlp = KN_MLP_GELU_TANH, .hidden = 12, .mlp_bias = true};
        m = kn_block_new(ctx, &b);
        y = kn_block_forward(m, in[0], NULL);
        break;
    }
    case 6: m = kn_batch_norm1d_new(ctx, 3, 1e-5, 0.1, true); y = kn_module_forward(m, in[0]); break;
    case 7: {   /* dropout on the probabilities: the mask is a function of the seed, the same in every build */
        kn_attn_cfg a = {.dim = 8, .n_heads = 4, .n_kv_heads = 2, .causal = true, .attn_dropout = 0.5};
        m = kn_attention_new(ctx, &a);
        y = kn_attention_forward(m, in[0], NULL);
        break;
    }
    }
    kn_module_free(m);
    return y;
}
TEST(module_gradcheck) {
    kn_test_seed(31);
    bool req[1] = {true};
    struct { int which; kn_opin in; const char *name; } cs[] = {
        {0, {3, {2, 2, 3}, -1, 1}, "Linear"},
        {1, {2, {3, 3}, -1, 1}, "LayerNorm"},
        {2, {3, {1, 3, 8}, -1, 1}, "Attention GQA+RoPE"},
        {3, {3, {2, 3, 3}, -1, 1}, "GRU"},
        {4, {3, {1, 2, 3}, -1, 1}, "LSTM 2 layers"},
        {5, {3, {1, 3, 8}, -1, 1}, "Block"},
        {6, {2, {4, 3}, -1, 1}, "BatchNorm1d"},
        {7, {3, {2, 4, 8}, -1, 1}, "Attention with attn_dropout"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        mcase c = {cs[i].which};
        double e = kn_gradcheck(build_mod, &c, 1, &cs[i].in, req);
        CHECK(e < 1e-5, "%s: gradcheck err %g", cs[i].name, e);
    }
}

/* ---- losses ------------------------------------------------------------------------------ */
TEST(losses_values) {
    kn_ctx *ctx = new_ctx();
    float lg[6] = {1, 2, 0.5f, -1, 0, 3};
    int64_t tg[2] = {1, 2};
    kn_tensor *logits = kn_from_data(ctx, KN_F32, 2, (int64_t[]){2, 3}, lg);
    kn_tensor *tgt = kn_from_data(ctx, KN_I64, 1, (int64_t[]){2}, tg);
    double l0 = log(exp(1) + exp(2) + exp(0.5)) - 2, l1 = log(exp(-1) + exp(0) + exp(3)) - 3;
    CHECK(fabs(read1(kn_cross_entropy(ctx, logits, tgt, NULL)) - (l0 + l1) / 2) < 1e-6, "ce mean");
    kn_ce_opts o = kn_ce_defaults(); o.reduction = KN_REDUCE_SUM;
    CHECK(fabs(read1(kn_cross_entropy(ctx, logits, tgt, &o)) - (l0 + l1)) < 1e-6, "ce sum");
    o = kn_ce_defaults(); o.ignore_index = 2;
    CHECK(fabs(read1(kn_cross_entropy(ctx, logits, tgt, &o)) - l0) < 1e-6, "ignore_index: mean over the rest");
    o = kn_ce_defaults(); o.reduction = KN_REDUCE_NONE;
    double *per = readall(kn_cross_entropy(ctx, logits, tgt, &o));
    CHECK(per && fabs(per[0] - l0) < 1e-6 && fabs(per[1] - l1) < 1e-6, "ce none");
    free(per);
    /* label smoothing 0.1: (1-e) nll + e * mean_c(-logp) */
    o = kn_ce_defaults(); o.label_smoothing = 0.1;
    double lse0 = log(exp(1) + exp(2) + exp(0.5)), lse1 = log(exp(-1) + exp(0) + exp(3));
    double s0 = lse0 - (1 + 2 + 0.5) / 3, s1 = lse1 - (-1 + 0 + 3) / 3.0;
    double want = (0.9 * l0 + 0.1 * s0 + 0.9 * l1 + 0.1 * s1) / 2;
    CHECK(fabs(read1(kn_cross_entropy(ctx, logits, tgt, &o)) - want) < 1e-6, "label smoothing");
    /* stable for huge logits */
    float big[3] = {1000, 0, -1000};
    kn_tensor *bl = kn_from_data(ctx, KN_F32, 2, (int64_t[]){1, 3}, big);
    double v = read1(kn_cross_entropy(ctx, bl, kn_from_data(ctx, KN_I64, 1, (int64_t[]){1}, (int64_t[]){1}), NULL));
    CHECK(fabs(v - 1000) < 1e-3, "stable ce %g", v);
    /* nll of log_softmax = ce */
    CHECK(fabs(read1(kn_nll_loss(ctx, kn_log_softmax(ctx, logits, -1), tgt, NULL)) - (l0 + l1) / 2) < 1e-6, "nll");
    /* regression losses */
    float xa[4] = {0, 1, 3, -2}, ya[4] = {0.5f, 1, 0, 0};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, xa), *y = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, ya);
    CHECK(fabs(read1(kn_mse_loss(ctx, x, y, KN_REDUCE_MEAN)) - (0.25 + 0 + 9 + 4) / 4) < 1e-6, "mse");
    CHECK(fabs(read1(kn_l1_loss(ctx, x, y, KN_REDUCE_SUM)) - 5.5) < 1e-6, "l1");
    CHECK(fabs(read1(kn_huber_loss(ctx, x, y, 1.0, KN_REDUCE_SUM)) - (0.125 + 0 + 2.5 + 1.5)) < 1e-6, "huber");
    CHECK(fabs(read1(kn_smooth_l1_loss(ctx, x, y, 2.0, KN_REDUCE_SUM)) - (0.0625 + 0 + 2 + 1)) < 1e-6, "smooth l1 beta 2");
    CHECK(fabs(read1(kn_huber_loss(ctx, x, y, 2.0, KN_REDUCE_SUM)) - (0.125 + 0 + 4 + 2)) < 1e-6, "huber delta 2 = 2*smooth_l1");
    /* BCE and with logits */
    float pz[3] = {0.2f, 0.9f, 0.5f}, yz[3] = {0, 1, 1}, xz[3] = {-30, 2, 0};
    kn_tensor *p = kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, pz), *yb = kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, yz);
    double wb = -(log(0.8) + log(0.9f) + log(0.5)) / 3;
    CHECK(fabs(read1(kn_bce_loss(ctx, p, yb, KN_REDUCE_MEAN)) - wb) < 1e-6, "bce");
    kn_tensor *xl = kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, xz);
    double wl = (log1p(exp(-30)) + log1p(exp(-2)) + log(2)) / 3;
    CHECK(fabs(read1(kn_bce_with_logits_loss(ctx, xl, yb, NULL, KN_REDUCE_MEAN)) - wl) < 1e-6, "bce with logits");
    float pw[3] = {2, 3, 4};
    double wlp = (log1p(exp(-30)) + 3 * log1p(exp(-2)) + 4 * log(2)) / 3;
    CHECK(fabs(read1(kn_bce_with_logits_loss(ctx, xl, yb, kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, pw), KN_REDUCE_MEAN)) - wlp) < 1e-6, "pos_weight");
    /* KL: p log(p/q), 0 log 0 = 0 */
    float tq[3] = {0.5f, 0.5f, 0}, lq[3] = {(float)log(0.25), (float)log(0.25), (float)log(0.5)};
    kn_tensor *tt = kn_from_data(ctx, KN_F32, 2, (int64_t[]){1, 3}, tq), *lqt = kn_from_data(ctx, KN_F32, 2, (int64_t[]){1, 3}, lq);
    CHECK(fabs(read1(kn_kl_div_loss(ctx, lqt, tt, false, KN_KL_BATCHMEAN)) - log(2)) < 1e-6, "kl batchmean");
    CHECK(fabs(read1(kn_kl_div_loss(ctx, lqt, kn_log(ctx, kn_add_scalar(ctx, tt, 1e-30)), true, KN_KL_SUM)) - log(2)) < 1e-5, "kl log_target");
    kn_ctx_free(ctx);
}

typedef struct { int which; } lcase;
static kn_tensor *build_loss(kn_ctx *ctx, kn_tensor **in, void *ud) {
    lcase *c = ud;
    kn_ce_opts o = kn_ce_defaults();
    switch (c->which) {
    case 0: o.label_smoothing = 0.2; o.ignore_index = 1; return kn_cross_entropy(ctx, in[0], kn_cast(ctx, in[1], KN_I64), &o);
    case 1: return kn_huber_loss(ctx, in[0], in[2], 0.7, KN_REDUCE_MEAN);
    case 2: return kn_bce_with_logits_loss(ctx, in[0], kn_sigmoid(ctx, in[2]), NULL, KN_REDUCE_SUM);
    case 3: return kn_kl_div_loss(ctx, kn_log_softmax(ctx, in[0], -1), kn_softmax(ctx, in[2], -1), false, KN_KL_BATCHMEAN);
    case 4: return kn_bce_loss(ctx, kn_sigmoid(ctx, in[0]), kn_sigmoid(ctx, in[2]), KN_REDUCE_MEAN);
    }
    return NULL;
}
TEST(loss_gradcheck) {
    kn_test_seed(41);
    kn_opin in[3] = {{2, {4, 3}, -2, 2}, {1, {4}, 0, 3, 0, false, true}, {2, {4, 3}, -2, 2}};
    bool req[3] = {true, false, true};
    const char *names[] = {"ce smoothing+ignore", "huber", "bce logits", "kl", "bce"};
    for (int i = 0; i < 5; i++) {
        lcase c = {i};
        double e = kn_gradcheck(build_loss, &c, 3, in, req);
        CHECK(e < 1e-5, "%s: gradcheck err %g", names[i], e);
    }
}

/* ---- errors name the module ------------------------------------------------------------- */
TEST(module_errors) {
    kn_ctx *ctx = new_ctx();
    kn_gpt2_cfg c = {.vocab = 16, .max_seq = 4, .dim = 8, .n_layers = 1, .n_heads = 2};
    kn_module *g = kn_gpt2_new(ctx, &c);
    REQUIRE(g, "%s", kn_last_error());
    kn_module *proj = kn_module_child_by_name(kn_module_child_by_name(kn_module_child_by_name(kn_module_child_by_name(g, "h"), "0"), "attn"), "c_proj");
    REQUIRE(proj, "child lookup");
    kn_tensor *bad = kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 5});
    CHECK(kn_module_forward(proj, bad) == NULL, "wrong shape fails");
    CHECK(strstr(kn_last_error(), "Linear 'h.0.attn.c_proj'"), "names the module: %s", kn_last_error());
    kn_tensor *ids = kn_zeros(ctx, KN_I32, 2, (int64_t[]){1, 9});
    CHECK(kn_gpt2_forward(g, ids) == NULL && strstr(kn_last_error(), "GPT2") && strstr(kn_last_error(), "max_seq"), "%s", kn_last_error());
    CHECK(kn_gpt2_forward(g, kn_zeros(ctx, KN_I32, 1, (int64_t[]){4})) == NULL && strstr(kn_last_error(), "GPT2"), "%s", kn_last_error());
    kn_module *bn = kn_batch_norm2d_new(ctx, 3, 1e-5, 0.1, true);
    CHECK(kn_module_forward(bn, kn_zeros(ctx, KN_F32, 4, (int64_t[]){2, 4, 2, 2})) == NULL && strstr(kn_last_error(), "BatchNorm2d"), "%s", kn_last_error());
    kn_module *cv = kn_conv2d_new(ctx, 3, 4, (int[]){3, 3}, NULL, NULL, NULL, 1, true);
    CHECK(kn_module_forward(cv, kn_zeros(ctx, KN_F32, 3, (int64_t[]){3, 8, 8})) == NULL && strstr(kn_last_error(), "Conv2d"), "%s", kn_last_error());
    kn_module *emb = kn_embedding_new(ctx, 4, 2);
    CHECK(kn_module_forward(emb, kn_zeros(ctx, KN_F32, 1, (int64_t[]){2})) == NULL && strstr(kn_last_error(), "Embedding"), "%s", kn_last_error());
    kn_module *lstm = kn_rnn_new(ctx, KN_RNN_LSTM, 3, 4, 1, true);
    CHECK(kn_rnn_forward(lstm, kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 5, 4}), NULL, NULL, NULL, NULL) == NULL && strstr(kn_last_error(), "LSTM"), "%s", kn_last_error());
    CHECK(kn_linear_new(ctx, 0, 3, true) == NULL && strstr(kn_last_error(), "Linear"), "ctor error");
    kn_attn_cfg ac = {.dim = 10, .n_heads = 3};
    CHECK(kn_attention_new(ctx, &ac) == NULL && strstr(kn_last_error(), "Attention"), "attn ctor");
    CHECK(kn_cross_entropy(ctx, kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 4}), kn_zeros(ctx, KN_I64, 1, (int64_t[]){2}), NULL) == NULL &&
          strstr(kn_last_error(), "cross_entropy"), "%s", kn_last_error());
    CHECK(kn_mse_loss(ctx, kn_zeros(ctx, KN_F32, 1, (int64_t[]){3}), kn_zeros(ctx, KN_F32, 1, (int64_t[]){4}), KN_REDUCE_MEAN) == NULL &&
          strstr(kn_last_error(), "mse_loss"), "%s", kn_last_error());
    kn_module_free(g); kn_module_free(bn); kn_module_free(cv); kn_module_free(emb); kn_module_free(lstm);
    kn_ctx_free(ctx);
}

/* ---- training in one replayed plan ------------------------------------------------------ */
TEST(train_mlp_one_plan) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(5); kn_test_seed(5);
    kn_module *net = kn_sequential_new(ctx, "MLP");
    kn_sequential_add(net, kn_linear_new(ctx, 4, 32, true));
    kn_sequential_add(net, kn_act_new(ctx, KN_ACT_TANH));
    kn_sequential_add(net, kn_linear_new(ctx, 32, 3, true));
    int64_t N = 32;
    kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){N, 4}), *y = kn_input(ctx, KN_I64, 1, &N);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_module_forward(net, x), y, NULL);
    REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 0.02;
    kn_optim *opt = kn_optim_new_decay_groups(ctx, net, &oc);
    REQUIRE(opt, "%s", kn_last_error());
    kn_tensor *outs[64]; int n = 0;
    outs[n++] = loss;
    int ne = kn_optim_build(opt, NULL, outs + n, 63);
    REQUIRE(ne == 4, "effects %d (one fused adam_update per parameter): %s", ne, kn_last_error());
    n += ne;
    kn_plan *pl = kn_plan_new(ctx, n, outs, NULL);
    REQUIRE(pl, "%s", kn_last_error());
    float xb[32 * 4]; int64_t yb[32];
    for (int i = 0; i < N; i++) {   /* class = argmax of the first three features */
        for (int k = 0; k < 4; k++) xb[i * 4 + k] = (float)kn_test_uniform(-1, 1);
        yb[i] = xb[i * 4] > xb[i * 4 + 1] ? (xb[i * 4] > xb[i * 4 + 2] ? 0 : 2) : (xb[i * 4 + 1] > xb[i * 4 + 2] ? 1 : 2);
    }
    kn_tensor_write(x, xb, KN_F32); kn_tensor_write(y, yb, KN_I64);
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        kn_optim_set_lr(opt, -1, kn_sched_cosine(step, 0.02, 0.002, 5, 60));
        CHECK(!kn_optim_prepare(opt), "prepare");
        REQUIRE(!kn_plan_run(pl), "run: %s", kn_last_error());
        double l = read1(loss);
        if (step == 0) first = l;
        last = l;
    }
    CHECK(first > 0.9 && last < 0.35 * first, "loss %g -> %g", first, last);
    kn_plan_free(pl);
    kn_optim_free(opt);
    kn_module_free(net);
    kn_ctx_free(ctx);
}

static void train_lm(bool llama) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(11); kn_test_seed(11);
    int64_t B = 4, T = 8, V = 64;
    kn_module *m;
    if (llama) {
        kn_llama_cfg c = {.vocab = V, .dim = 32, .hidden = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2};
        m = kn_llama_new(ctx, &c);
    } else {
        kn_gpt2_cfg c = {.vocab = V, .max_seq = T, .dim = 32, .n_layers = 2, .n_heads = 4};
        m = kn_gpt2_new(ctx, &c);
    }
    REQUIRE(m, "%s", kn_last_error());
    kn_tensor *ids = kn_input(ctx, KN_I32, 2, (int64_t[]){B, T}), *tg = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T});
    kn_tensor *logits = llama ? kn_llama_forward(m, ids, NULL) : kn_gpt2_forward(m, ids);
    kn_tensor *loss = kn_cross_entropy(ctx, logits, tg, NULL);
    REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 3e-3; oc.clip_norm = 1.0;
    kn_optim *opt = kn_optim_new_decay_groups(ctx, m, &oc);
    kn_tensor *outs[KN_NN_MAX_OUTS]; int n = 0;
    outs[n++] = loss;
    int ne = kn_optim_build(opt, NULL, outs + n, KN_NN_MAX_OUTS - 2);
    REQUIRE(ne > 0, "%s", kn_last_error());
    n += ne;
    outs[n++] = kn_optim_grad_norm(opt);
    kn_plan *pl = kn_plan_new(ctx, n, outs, NULL);
    REQUIRE(pl, "%s", kn_last_error());
    int32_t idb[32]; int64_t tb[32];
    for (int i = 0; i < B * T; i++) idb[i] = (int32_t)(kn_test_u64() % V);
    for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) tb[b * T + t] = (idb[b * T + t] * 7 + 3) % V;   /* learnable map */
    kn_tensor_write(ids, idb, KN_I32); kn_tensor_write(tg, tb, KN_I64);
    double first = 0, last = 0;
    for (int step = 0; step < 25; step++) {
        kn_optim_prepare(opt);
        REQUIRE(!kn_plan_run(pl), "run: %s", kn_last_error());
        double l = read1(loss);
        if (step == 0) { first = l; CHECK(fabs(l - log((double)V)) < 0.3, "initial loss %g near log V", l); CHECK(read1(outs[n - 1]) > 0, "grad norm"); }
        last = l;
    }
    CHECK(last < 0.6 * first, "%s loss %g -> %g", llama ? "llama" : "gpt2", first, last);
    kn_plan_free(pl); kn_optim_free(opt); kn_module_free(m);
    kn_ctx_free(ctx);
}
TEST(train_gpt2_one_plan) { train_lm(false); }
TEST(train_llama_one_plan) { train_lm(true); }

KN_TEST_MAIN()
