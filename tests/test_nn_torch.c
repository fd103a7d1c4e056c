/* test_nn_torch.c: PyTorch parity (fixtures from scripts/nn_ref.py).
 *  - every optimizer config: same initial params, same gradient sequence
 *    (fed as plan inputs) -> params after N steps within 1e-6 relative;
 *  - a tiny GPT-2 (2 layers, C 32, V 64, T 8, B 4) with the script's
 *    weights: logits, loss, every gradient, then 10 AdamW steps (decay and
 *    no-decay groups) in one replayed plan: the loss at each step and all
 *    params after them. Tolerances are stated at each CHECK. */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_nn.h"
#include <stdint.h>
#include <string.h>

/* ---- fixture reader: "KNNN", u32 version, u32 count, records ---------------------- */
typedef struct { char name[128]; int ndim; int64_t shape[8]; int64_t n; float *data; } rec;
typedef struct { rec *r; int n; } fixture;

static void fx_free(fixture *f) { for (int i = 0; i < f->n; i++) free(f->r[i].data); free(f->r); f->r = NULL; f->n = 0; }
static bool fx_load(const char *path, fixture *f) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    char magic[4]; uint32_t ver, cnt;
    bool ok = fread(magic, 1, 4, fp) == 4 && !memcmp(magic, "KNNN", 4) && fread(&ver, 4, 1, fp) == 1 && ver == 1 &&
              fread(&cnt, 4, 1, fp) == 1 && cnt < 100000;
    if (ok) f->r = calloc(cnt, sizeof *f->r);
    for (uint32_t i = 0; ok && i < cnt; i++) {
        rec *r = &f->r[i];
        uint32_t len, nd;
        ok = fread(&len, 4, 1, fp) == 1 && len < sizeof r->name && fread(r->name, 1, len, fp) == len &&
             fread(&nd, 4, 1, fp) == 1 && nd <= 8 && fread(r->shape, 8, nd, fp) == nd;
        if (!ok) break;
        r->ndim = (int)nd; r->n = 1;
        for (uint32_t k = 0; k < nd; k++) r->n *= r->shape[k];
        r->data = malloc(sizeof(float) * (size_t)(r->n ? r->n : 1));
        ok = r->data && fread(r->data, 4, (size_t)r->n, fp) == (size_t)r->n;
        f->n++;
    }
    fclose(fp);
    if (!ok) fx_free(f);
    return ok;
}
static const rec *fx_get(const fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++) if (!strcmp(f->r[i].name, name)) return &f->r[i];
    fprintf(stderr, "  fixture record '%s' missing\n", name);
    return NULL;
}
static bool fx_open(const char *rel, fixture *f) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s", rel);
    return fx_load(path, f);
}

/* relative error (norm-wise) of a tensor's values vs a record */
static double rel_vs(kn_tensor *t, const rec *r) {
    if (!t || !r || kn_numel(t) != r->n) return INFINITY;
    double *a = malloc(sizeof(double) * (size_t)r->n), *b = malloc(sizeof(double) * (size_t)r->n);
    double e = INFINITY;
    if (kn_tensor_read(t, a, KN_F64) == KN_OK) {
        for (int64_t i = 0; i < r->n; i++) b[i] = r->data[i];
        e = kn_rel_err(a, b, r->n);
    }
    free(a); free(b);
    return e;
}

/* ---- optimizers -------------------------------------------------------------------------- */
static const char *OPT_NAMES[] = {"sgd", "sgd_momentum_wd", "sgd_nesterov", "adam", "adam_wd", "adamw", "rmsprop",
                                  "rmsprop_centered_momentum", "adagrad"};

TEST(optim_torch_parity) {
    fixture f;
    REQUIRE(fx_open("nn_optim.bin", &f), "tests/fixtures/nn_optim.bin unreadable or malformed (run from the repo root; regenerate with scripts/nn_ref.py)");
    const rec *cnt = fx_get(&f, "optim.count"), *st = fx_get(&f, "optim.steps");
    REQUIRE(cnt && st && (int)cnt->data[0] == 9, "fixture has %d configs, test knows 9", cnt ? (int)cnt->data[0] : -1);
    int N = (int)st->data[0];
    for (int k = 0; k < 9; k++) {
        char nm[128];
        const rec *r[7];
        const char *parts[7] = {"cfg", "p0", "p1", "g0", "g1", "out0", "out1"};
        bool have = true;
        for (int j = 0; j < 7; j++) { snprintf(nm, sizeof nm, "optim.%s.%s", OPT_NAMES[k], parts[j]); r[j] = fx_get(&f, nm); have = have && r[j]; }
        REQUIRE(have, "records of %s", OPT_NAMES[k]);
        const float *c = r[0]->data;
        kn_optim_cfg oc = kn_optim_defaults((kn_optim_kind)(int)c[0]);
        oc.lr = c[1]; oc.weight_decay = c[2]; oc.momentum = c[3]; oc.dampening = c[4]; oc.nesterov = c[5] != 0;
        oc.beta1 = c[6]; oc.beta2 = c[7]; oc.eps = c[8]; oc.alpha = c[9]; oc.centered = c[10] != 0;
        oc.lr_decay = c[11]; oc.initial_accumulator_value = c[12];
        kn_ctx *ctx = kn_ctx_new(NULL);
        kn_tensor *p[2], *g[2];
        for (int j = 0; j < 2; j++) {
            p[j] = kn_param(ctx, KN_F32, r[1 + j]->ndim, r[1 + j]->shape);
            kn_tensor_write(p[j], r[1 + j]->data, KN_F32);
            g[j] = kn_input(ctx, KN_F32, r[1 + j]->ndim, r[1 + j]->shape);
        }
        kn_optim *o = kn_optim_new_empty(ctx, &oc);
        REQUIRE(o && kn_optim_add_group(o, 2, p, oc.lr, oc.weight_decay) == 0, "%s: %s", OPT_NAMES[k], kn_last_error());
        kn_tensor *outs[16];
        int ne = kn_optim_build(o, g, outs, 16);
        REQUIRE(ne > 0, "%s build: %s", OPT_NAMES[k], kn_last_error());
        kn_plan *pl = kn_plan_new(ctx, ne, outs, NULL);
        REQUIRE(pl, "%s plan: %s", OPT_NAMES[k], kn_last_error());
        for (int s = 0; s < N; s++) {
            kn_tensor_write(g[0], r[3]->data + (size_t)s * 12, KN_F32);
            kn_tensor_write(g[1], r[4]->data + (size_t)s * 5, KN_F32);
            kn_optim_prepare(o);
            REQUIRE(!kn_plan_run(pl), "run: %s", kn_last_error());
        }
        double e0 = rel_vs(p[0], r[5]), e1 = rel_vs(p[1], r[6]);
        CHECK(e0 < 1e-6 && e1 < 1e-6, "%s: params after %d steps rel err %.3g %.3g (tolerance 1e-6)", OPT_NAMES[k], N, e0, e1);
        kn_plan_free(pl);
        kn_optim_free(o);
        kn_ctx_free(ctx);
    }
    fx_free(&f);
}

/* ---- tiny GPT-2 ------------------------------------------------------------------------------ */
TEST(gpt2_torch_parity) {
    fixture f;
    REQUIRE(fx_open("nn_gpt2.bin", &f), "tests/fixtures/nn_gpt2.bin unreadable or malformed (run from the repo root; regenerate with scripts/nn_ref.py)");
    const rec *cfg = fx_get(&f, "gpt2.cfg");
    REQUIRE(cfg, "cfg");
    int64_t B = (int64_t)cfg->data[0], T = (int64_t)cfg->data[1], V = (int64_t)cfg->data[2], C = (int64_t)cfg->data[3];
    int L = (int)cfg->data[4], H = (int)cfg->data[5];
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {.vocab = V, .max_seq = T, .dim = C, .n_layers = L, .n_heads = H};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    REQUIRE(m, "%s", kn_last_error());
    /* load the script's weights into every parameter, by name */
    kn_named_param ps[128];
    int np = kn_module_named_params(m, false, ps, 128);
    REQUIRE(np > 0 && np <= 128, "params %d", np);
    for (int i = 0; i < np; i++) {
        char nm[KN_NN_NAME_MAX + 16];
        snprintf(nm, sizeof nm, "gpt2.param.%.127s", ps[i].name);
        const rec *r = fx_get(&f, nm);
        REQUIRE(r && r->n == kn_numel(ps[i].t), "weights for %s", ps[i].name);
        CHECK(!kn_module_load_param(m, ps[i].name, r->data, KN_F32), "load %s", ps[i].name);
    }
    const rec *ri = fx_get(&f, "gpt2.ids"), *rt = fx_get(&f, "gpt2.targets");
    REQUIRE(ri && rt, "ids/targets");
    kn_tensor *ids = kn_input(ctx, KN_I32, 2, (int64_t[]){B, T}), *tg = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T});
    kn_tensor_write(ids, ri->data, KN_F32);
    kn_tensor_write(tg, rt->data, KN_F32);
    kn_tensor *logits = kn_gpt2_forward(m, ids);
    kn_tensor *loss = kn_cross_entropy(ctx, logits, tg, NULL);
    REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());

    /* 1. logits, loss, gradients (one plan, no update) */
    kn_tensor *outs[KN_NN_MAX_OUTS]; int n = 0;
    outs[n++] = logits; outs[n++] = loss;
    for (int i = 0; i < np; i++) outs[n++] = kn_grad(ps[i].t);
    kn_plan *p0 = kn_plan_new(ctx, n, outs, NULL);
    REQUIRE(p0 && !kn_plan_run(p0), "%s", kn_last_error());
    double el = rel_vs(logits, fx_get(&f, "gpt2.logits"));
    CHECK(el < 1e-5, "logits rel err %.3g (tolerance 1e-5)", el);
    const rec *rl = fx_get(&f, "gpt2.loss");
    double lv = kn_item(loss);
    CHECK(rl && fabs(lv - rl->data[0]) < 1e-5 * fabs(rl->data[0]), "loss %.7f vs torch %.7f (tolerance 1e-5 rel)", lv, rl ? rl->data[0] : NAN);
    double worst = 0; const char *wn = "";
    for (int i = 0; i < np; i++) {
        char nm[KN_NN_NAME_MAX + 16];
        snprintf(nm, sizeof nm, "gpt2.grad.%.127s", ps[i].name);
        double e = rel_vs(kn_grad(ps[i].t), fx_get(&f, nm));
        if (e > worst) { worst = e; wn = ps[i].name; }
        CHECK(e < 1e-4, "grad %s rel err %.3g (tolerance 1e-4)", ps[i].name, e);
    }
    printf("  gpt2: logits rel err %.2g, loss %.6f (torch %.6f), worst grad rel err %.2g (%s)\n", el, lv, rl ? rl->data[0] : NAN, worst, wn);
    kn_plan_free(p0);

    /* 2. 10 AdamW steps in one replayed plan (decay / no-decay groups, like the
     * script). Nodes computed by plan 1 (logits, grads) are constants to later
     * plans, so the training step is built from a fresh forward/backward. */
    for (int i = 0; i < np; i++) kn_zero_grad(ps[i].t);
    loss = kn_cross_entropy(ctx, kn_gpt2_forward(m, ids), tg, NULL);
    REQUIRE(loss && !kn_backward(ctx, loss), "%s", kn_last_error());
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 1e-3; oc.beta1 = 0.9; oc.beta2 = 0.95; oc.eps = 1e-8; oc.weight_decay = 0.1;
    kn_optim *opt = kn_optim_new_decay_groups(ctx, m, &oc);
    REQUIRE(opt, "%s", kn_last_error());
    n = 0;
    outs[n++] = loss;
    int ne = kn_optim_build(opt, NULL, outs + n, KN_NN_MAX_OUTS - 1);
    REQUIRE(ne > 0, "%s", kn_last_error());
    n += ne;
    kn_plan *p1 = kn_plan_new(ctx, n, outs, NULL);
    REQUIRE(p1, "%s", kn_last_error());
    const rec *rls = fx_get(&f, "gpt2.losses");
    REQUIRE(rls && rls->n == 10, "losses");
    for (int s = 0; s < 10; s++) {
        kn_optim_prepare(opt);
        REQUIRE(!kn_plan_run(p1), "%s", kn_last_error());
        double l = kn_item(loss);
        CHECK(fabs(l - rls->data[s]) < 2e-5 * fabs(rls->data[s]), "step %d loss %.7f vs torch %.7f (tolerance 2e-5 rel)", s, l, rls->data[s]);
    }
    CHECK(rls->data[9] < rls->data[0], "torch loss falls too");
    worst = 0;
    for (int i = 0; i < np; i++) {
        char nm[KN_NN_NAME_MAX + 16];
        snprintf(nm, sizeof nm, "gpt2.after.%.127s", ps[i].name);
        double e = rel_vs(ps[i].t, fx_get(&f, nm));
        if (e > worst) { worst = e; wn = ps[i].name; }
        CHECK(e < 1e-4, "param %s after 10 AdamW steps rel err %.3g (tolerance 1e-4)", ps[i].name, e);
    }
    printf("  gpt2: 10 AdamW steps, loss %.6f -> %.6f, worst param rel err %.2g (%s)\n", rls->data[0], kn_item(loss), worst, wn);
    kn_plan_free(p1);
    kn_optim_free(opt);
    kn_module_free(m);
    kn_ctx_free(ctx);
    fx_free(&f);
}

KN_TEST_MAIN()
