/* test_arch.c: Mistral, Gemma 2, Gemma 3 and Phi-3 against Hugging Face
 * transformers.
 *
 * scripts/arch_ref.py builds five tiny random models with transformers
 * itself, saves each as safetensors + config.json and as a llama.cpp-layout
 * GGUF written by the gguf package, and records transformers' logits and
 * greedy continuations (tests/fixtures/arch/; its header says what each
 * fixture exercises; gemma3_vl is a Gemma3ForConditionalGeneration whose
 * language model kiln runs, from safetensors only). Here:
 *   - each model loads both ways with the expected config; the logits of the
 *     prompts' last rows are within 1e-4 relative L2 of transformers'; greedy
 *     decoding through the KV cache gives the reference's 32 tokens (up to a
 *     step where the reference's top two logits are a near tie). Prompts of
 *     23 tokens and 32 generated against windows of 8 (16 for Phi-3): keys
 *     leave the window in prefill and in decode;
 *   - the same with prefill in chunks of 3 (the window spans chunks), with an
 *     f16 KV cache (to 2e-3), and on a fake device (model.c's upload path:
 *     post-norms uploaded, Phi-3's split q/k/v and gate/up stacked again);
 *   - Phi-3's LongRoPE: the short factors at a context of 64 (= the original
 *     context), the long ones at 128 on a 70-token prompt (transformers
 *     switches by sequence length, kiln by context: both long there);
 *   - each feature matters: the same weights with the window, the attention
 *     cap, the final cap, Gemma 3's local rope base or Phi-3's short factors
 *     taken out of config.json move the logits by > 1e-2;
 *   - in a CUDA build on a GPU, the CUDA backend with f32 weights (1e-4) and
 *     bf16 weights (3e-2); SKIP otherwise;
 *   - configs kiln cannot run are refused with a message, and so are GGUF
 *     files with a tensor or a value of these architectures wrong; kiln info ends
 *     with what kiln runs (architecture, window layers, caps, rope) or why
 *     it cannot.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_backend.h"
#include "kiln_llm.h"
#include "llm/model_impl.h"     /* defines: struct kn_model (layer flags and weights) */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/arch/"

/* ---- reference fixtures (KNLR v2, scripts/llm_ref.py's format) ------------------------ */
typedef struct { int n_prompt, n_gen, rows; int32_t *prompt, *gen; float *margin, *logits; } ref_case;
typedef struct { int n, V; ref_case c[8]; } ref_file;

static bool read_ref(const char *path, ref_file *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4]; uint32_t h[3];
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "KNLR", 4) && fread(h, 4, 3, f) == 3 && h[0] == 2 && h[1] <= 8;
    if (ok) { r->n = (int)h[1]; r->V = (int)h[2]; }
    for (int i = 0; ok && i < r->n; i++) {
        uint32_t k[3];
        ref_case *c = &r->c[i];
        if (!(ok = fread(k, 4, 3, f) == 3 && k[0] <= 128 && k[1] <= 64 && k[2] <= k[0])) break;
        c->n_prompt = (int)k[0]; c->n_gen = (int)k[1]; c->rows = (int)k[2];
        c->prompt = malloc(4 * (size_t)c->n_prompt); c->gen = malloc(4 * (size_t)c->n_gen + 4);
        c->margin = malloc(4 * (size_t)c->n_gen + 4); c->logits = malloc(4 * (size_t)c->rows * (size_t)r->V);
        ok = fread(c->prompt, 4, (size_t)c->n_prompt, f) == (size_t)c->n_prompt &&
             fread(c->gen, 4, (size_t)c->n_gen, f) == (size_t)c->n_gen &&
             fread(c->margin, 4, (size_t)c->n_gen, f) == (size_t)c->n_gen &&
             fread(c->logits, 4, (size_t)c->rows * (size_t)r->V, f) == (size_t)c->rows * (size_t)r->V;
    }
    fclose(f);
    return ok;
}
static void free_ref(ref_file *r) {
    for (int i = 0; i < r->n; i++) { free(r->c[i].prompt); free(r->c[i].gen); free(r->c[i].margin); free(r->c[i].logits); }
    r->n = 0;
}

/* The worst relative L2 error over the reference rows of every prompt. */
static double logits_err(kn_model *m, const ref_file *r) {
    int V = r->V;
    double worst = 0;
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *lg = malloc(sizeof(float) * (size_t)c->n_prompt * V);
        if (kn_model_eval(m, c->prompt, c->n_prompt, 0, lg, true) != KN_OK) { free(lg); return INFINITY; }
        for (int k = 0; k < c->rows; k++) {
            const float *a = lg + (size_t)(c->n_prompt - c->rows + k) * V, *b = c->logits + (size_t)k * V;
            double num = 0, den = 0;
            for (int v = 0; v < V; v++) { num += ((double)a[v] - b[v]) * ((double)a[v] - b[v]); den += (double)b[v] * b[v]; }
            worst = fmax(worst, isnan(num) ? INFINITY : sqrt(num / den));
        }
        free(lg);
    }
    return worst;
}

/* A reference step whose top-2 margin is below this is a near tie (f32
 * against float64 may pick either token; past it the continuations may
 * legitimately differ). */
#define TIE_MARGIN 1e-3

static void check_model_tol(const char *what, kn_model *m, const ref_file *r, double tol, double tie) {
    int V = r->V;
    REQUIRE(kn_model_get_config(m)->n_vocab == V, "%s: vocab %d vs %d", what, kn_model_get_config(m)->n_vocab, V);
    double e = logits_err(m, r);
    if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-30s logits rel L2 %.3g\n", what, e);
    CHECK(e < tol, "%s: logits rel L2 %.3g vs transformers (tol %.0e): %s", what, e, tol, kn_last_error());
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *l1 = malloc(sizeof(float) * (size_t)V);
        int32_t seq[256];
        memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
        int np = c->n_prompt, same = 0;
        REQUIRE(kn_model_eval(m, seq, np, 0, l1, false) == KN_OK, "%s", kn_last_error());
        for (int g = 0; g < c->n_gen; g++) {
            int best = 0;
            for (int v = 1; v < V; v++) if (l1[v] > l1[best]) best = v;
            if (best != c->gen[g]) break;
            same++;
            seq[np] = best;
            if (g + 1 < c->n_gen) REQUIRE(kn_model_eval(m, &seq[np], 1, np, l1, false) == KN_OK, "%s", kn_last_error());
            np++;
        }
        int clear = 0;
        while (clear < c->n_gen && c->margin[clear] >= tie) clear++;
        if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-30s case %d: greedy agrees %d of %d (%d before a near tie)\n", what, i, same, c->n_gen, clear);
        CHECK(same >= clear, "%s case %d: greedy agrees for %d of %d tokens (%d required)", what, i, same, c->n_gen, clear);
        free(l1);
    }
}
static void check_model(const char *what, kn_model *m, const ref_file *r) { check_model_tol(what, m, r, 1e-4, TIE_MARGIN); }

/* ---- the models ------------------------------------------------------------------------ */
typedef struct {
    const char *name, *ref;
    kn_arch arch;           /* from safetensors; GGUF: mistral is "llama"    */
    int layers, window, n_rot, n_ctx;
    const char *swa;        /* which layers are windowed                     */
    double attn_cap, final_cap, scale, theta_local;   /* scale 0: the default 1/sqrt(D) */
    bool tied;
    bool st_only;           /* no GGUF of it (Gemma 3 with vision: llama.cpp writes its text part as gemma3) */
} arch_case;
static const arch_case g_cases[] = {
    {"mistral", "mistral", KN_ARCH_MISTRAL, 2, 8, 16, 128, "11", 0, 0, 0, 0, false},
    {"gemma2", "gemma2", KN_ARCH_GEMMA2, 2, 8, 16, 128, "10", 2.5, 4, 0.20412414523193154, 0, true},
    {"gemma3", "gemma3", KN_ARCH_GEMMA3, 3, 8, 16, 128, "110", 0, 0, 0.25, 10000, true},
    {"gemma3_vl", "gemma3_vl", KN_ARCH_GEMMA3, 3, 8, 16, 128, "110", 0, 0, 0.25, 10000, true, true},
    {"phi3", "phi3", KN_ARCH_PHI3, 2, 16, 8, 64, "11", 0, 0, 0, 0, false},
    {"phi3", "phi3_long", KN_ARCH_PHI3, 2, 16, 8, 128, "11", 0, 0, 0, 0, false},
};
enum { N_CASES = sizeof g_cases / sizeof g_cases[0] };

static void check_config(const char *what, const kn_model *m, const arch_case *a, bool gguf) {
    const kn_model_config *c = kn_model_get_config(m);
    kn_arch want = gguf && a->arch == KN_ARCH_MISTRAL ? KN_ARCH_LLAMA : a->arch;
    bool gemma = a->arch == KN_ARCH_GEMMA2 || a->arch == KN_ARCH_GEMMA3;
    CHECK(c->arch == want && c->n_layers == a->layers && c->head_dim == 16 && c->n_heads == 4 && c->n_kv_heads == 2 &&
          c->dim == 64 && c->n_rot == a->n_rot && c->sliding_window == a->window && c->tied_output == a->tied &&
          c->rope_neox == !(gguf && a->arch == KN_ARCH_MISTRAL) && fabs(c->attn_softcap - a->attn_cap) < 1e-6 &&
          fabs(c->final_softcap - a->final_cap) < 1e-6 && fabs(c->rope_theta_local - a->theta_local) < 1e-6 &&
          (gemma ? fabs(c->embd_scale - 8) < 1e-12 : c->embd_scale == 0),
          "%s: config arch %d layers %d rot %d window %d tied %d neox %d caps %g/%g local theta %g embd scale %g", what,
          (int)c->arch, c->n_layers, c->n_rot, c->sliding_window, c->tied_output, c->rope_neox, c->attn_softcap,
          c->final_softcap, c->rope_theta_local, c->embd_scale);
    if (a->scale > 0) CHECK(fabs(c->attn_scale - a->scale) < 1e-7, "%s: attention scale %.9g, want %.9g", what, c->attn_scale, a->scale);
    if (a->arch == KN_ARCH_PHI3)
        CHECK(!strcmp(c->rope_scaling, "longrope") && m->rope_ff, "%s: LongRoPE (%s)", what, c->rope_scaling);
    for (int l = 0; l < c->n_layers && l < (int)strlen(a->swa); l++) {
        const kn__layer_w *L = &m->layers[l];
        CHECK(m->layer_swa && m->layer_swa[l] == (a->swa[l] == '1'), "%s layer %d: windowed %d", what, l,
              m->layer_swa ? m->layer_swa[l] : -1);
        CHECK(gemma == (L->attn_post_norm && L->ffn_post_norm) && (a->arch == KN_ARCH_GEMMA3) == (L->q_norm != NULL),
              "%s layer %d: post-norms only for Gemma, q/k norms only for Gemma 3", what, l);
    }
}

static kn_model *load_ctx(const char *path, int n_batch, kn_backend *be, kn_weight_dtype wd, int n_ctx, bool kv16) {
    kn_model_opts o = {.n_ctx = n_ctx, .n_batch = n_batch, .backend = be, .weight_dtype = wd, .kv_f16 = kv16};
    kn_model *m = NULL;
    if (kn_model_load(path, &o, &m) != KN_OK) return NULL;
    return m;
}

TEST(arch_matches_transformers) {
    for (int i = 0; i < N_CASES; i++) {
        const arch_case *a = &g_cases[i];
        char ref[256], dir[256], gguf[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", a->ref);
        snprintf(dir, sizeof dir, FIX "%s", a->name);
        snprintf(gguf, sizeof gguf, FIX "%s.gguf", a->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable (scripts/arch_ref.py writes it)", ref);
        const char *paths[2] = {dir, gguf}, *kinds[2] = {"safetensors", "gguf"};
        for (int k = 0; k < (a->st_only ? 1 : 2); k++) {
            kn_model *m = load_ctx(paths[k], 0, NULL, KN_WEIGHTS_AUTO, a->n_ctx, false);
            CHECK(m, "%s: %s", paths[k], kn_last_error());
            if (!m) continue;
            snprintf(what, sizeof what, "%s %s", a->ref, kinds[k]);
            check_config(what, m, a, k == 1);
            CHECK(kn_model_get_config(m)->weight_type == KN_BF16, "%s: weights are bf16 in the file", what);
            check_model(what, m, &r);
            kn_model_free(m);
        }
        /* prefill in chunks of 3: windows reach back across chunks */
        kn_model *m = load_ctx(a->st_only ? dir : gguf, 3, NULL, KN_WEIGHTS_AUTO, a->n_ctx, false);
        CHECK(m, "%s n_batch 3: %s", gguf, kn_last_error());
        if (m) {
            snprintf(what, sizeof what, "%s %s n_batch 3", a->ref, a->st_only ? "st" : "gguf");
            check_model(what, m, &r);
            kn_model_free(m);
        }
        m = load_ctx(dir, 0, NULL, KN_WEIGHTS_AUTO, a->n_ctx, true);
        CHECK(m, "%s f16 KV: %s", dir, kn_last_error());
        if (m) {
            snprintf(what, sizeof what, "%s st f16 KV", a->ref);
            check_model_tol(what, m, &r, 2e-3, 0.05);      /* gemma3's final gain (6-11) amplifies the rounding */
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- a device backend's upload path (host memory posing as a device) ------------------- */
static void *fd_alloc(kn_backend *be, size_t n) { (void)be; return kn_backend_cpu()->alloc(kn_backend_cpu(), n); }
static void fd_free(kn_backend *be, void *p) { (void)be; kn_backend_cpu()->free(kn_backend_cpu(), p); }
static kn_status fd_copy(kn_backend *be, void *d, const void *s, size_t n) { (void)be; memcpy(d, s, n); return KN_OK; }
static kn_status fd_compute(kn_backend *be, const kn_exec *e) { (void)be; return kn_backend_cpu()->compute(kn_backend_cpu(), e); }
static kn_backend g_fake = {KN_BACKEND_VERSION, "fake-device", KN_DEVICE_CUDA, fd_alloc, fd_free, fd_copy, fd_copy,
                            fd_compute, NULL, NULL, NULL};

TEST(arch_device_upload_path) {
    for (int i = 0; i < N_CASES; i++) {
        const arch_case *a = &g_cases[i];
        char ref[256], path[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", a->ref);
        snprintf(path, sizeof path, FIX "%s%s", a->name, i % 2 || a->st_only ? "" : ".gguf");
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        kn_model *m = load_ctx(path, 5, &g_fake, KN_WEIGHTS_F32, a->n_ctx, false);
        CHECK(m, "%s on the fake device: %s", path, kn_last_error());
        if (m) {
            bool gemma = a->arch == KN_ARCH_GEMMA2 || a->arch == KN_ARCH_GEMMA3;
            for (int l = 0; l < m->cfg.n_layers; l++)
                CHECK(m->layers[l].wqkv && m->layers[l].w13 && gemma == (m->layers[l].ffn_post_norm != NULL),
                      "%s layer %d: q|k|v and gate|up stacked on the device, post-norms uploaded", a->ref, l);
            snprintf(what, sizeof what, "%s fake device", a->ref);
            check_model(what, m, &r);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- each feature matters ---------------------------------------------------------------
 * The fixture's weights with one setting changed in config.json: the logits
 * must move far past the tolerance (so the matches above are not luck). */
static bool copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    bool ok = a && b;
    char buf[1 << 14];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = false;
    return ok;
}
/* dir/config.json = the fixture's with the first `from` replaced by `to`; dir/model.safetensors copied */
static bool edited_model(const char *name, const char *from, const char *to, char dir[64]) {
    snprintf(dir, 64, "/tmp/kn_arch_XXXXXX");
    if (!mkdtemp(dir)) return false;
    char src[256], dst[300];
    snprintf(src, sizeof src, FIX "%s/model.safetensors", name);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    if (!copy_file(src, dst)) return false;
    snprintf(src, sizeof src, FIX "%s/config.json", name);
    FILE *f = fopen(src, "rb");
    if (!f) return false;
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    if (!at) return false;
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    f = fopen(dst, "wb");
    if (!f) return false;
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return fclose(f) == 0;
}
static void remove_model(const char *dir) {
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir); unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir); unlink(p);
    rmdir(dir);
}

TEST(arch_features_matter) {
    static const struct { const char *name, *ref, *from, *to, *what; int n_ctx; } cs[] = {
        {"mistral", "mistral", "\"sliding_window\": 8", "\"sliding_window\": null", "the sliding window", 128},
        {"gemma2", "gemma2", "\"sliding_window\": 8", "\"sliding_window\": 100", "the sliding window", 128},
        {"gemma2", "gemma2", "\"attn_logit_softcapping\": 2.5", "\"attn_logit_softcapping\": null", "the attention cap", 128},
        {"gemma2", "gemma2", "\"final_logit_softcapping\": 4.0", "\"final_logit_softcapping\": null", "the final cap", 128},
        {"gemma2", "gemma2", "\"query_pre_attn_scalar\": 24", "\"query_pre_attn_scalar\": 16", "query_pre_attn_scalar", 128},
        {"gemma3", "gemma3", "\"rope_theta\": 10000.0", "\"rope_theta\": 1000000.0", "the local rope base", 128},
        {"gemma3", "gemma3", "\"factor\": 2.0", "\"factor\": 1.0", "the global rope scaling", 128},
        {"phi3", "phi3", "\"sliding_window\": 16", "\"sliding_window\": null", "the sliding window", 64},
        {"phi3", "phi3", "\"rope_type\": \"longrope\"", "\"rope_type\": \"default\"", "LongRoPE", 64},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char dir[64], ref[256];
        snprintf(ref, sizeof ref, FIX "%s.ref", cs[i].ref);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        REQUIRE(edited_model(cs[i].name, cs[i].from, cs[i].to, dir), "%s: cannot make the edited copy (%s)", cs[i].name, cs[i].from);
        kn_model *m = load_ctx(dir, 0, NULL, KN_WEIGHTS_AUTO, cs[i].n_ctx, false);
        CHECK(m, "%s without %s: %s", cs[i].name, cs[i].what, kn_last_error());
        if (m) {
            double e = logits_err(m, &r);
            if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-8s without %-24s rel L2 %.3g\n", cs[i].name, cs[i].what, e);
            CHECK(e > 1e-2, "%s: without %s the logits still match (rel L2 %.3g): the fixture does not exercise it",
                  cs[i].name, cs[i].what, e);
            kn_model_free(m);
        }
        remove_model(dir);
        free_ref(&r);
    }
    /* Gemma 3 with vision: a text_config key left out takes Gemma3TextConfig's
     * default (as in Google's files), here rms_norm_eps = 1e-6 */
    {
        char dir[64];
        ref_file r3 = {0};
        REQUIRE(read_ref(FIX "gemma3_vl.ref", &r3), "gemma3_vl.ref unreadable");
        REQUIRE(edited_model("gemma3_vl", "\"rms_norm_eps\": 1e-06,", "", dir), "gemma3_vl: cannot edit");
        kn_model *m3 = load_ctx(dir, 0, NULL, KN_WEIGHTS_AUTO, 128, false);
        CHECK(m3 && logits_err(m3, &r3) < 1e-4, "gemma3_vl without rms_norm_eps: %s", m3 ? "logits differ" : kn_last_error());
        kn_model_free(m3);
        remove_model(dir);
        free_ref(&r3);
    }
    /* Phi-3 at a context beyond the original 64 takes the long factors:
     * wrong for the short prompts, whose reference used the short ones */
    ref_file r = {0};
    REQUIRE(read_ref(FIX "phi3.ref", &r), "phi3.ref unreadable");
    kn_model *m = load_ctx(FIX "phi3", 0, NULL, KN_WEIGHTS_AUTO, 128, false);
    REQUIRE(m, "%s", kn_last_error());
    double e = logits_err(m, &r);
    CHECK(e > 1e-2, "phi3 at context 128 (long factors) on the short prompts: rel L2 %.3g", e);
    kn_model_free(m);
    free_ref(&r);
}

/* ---- refusals ---------------------------------------------------------------------------- */
TEST(arch_refusals) {
    static const struct { const char *name, *from, *to, *needle; } cs[] = {
        {"gemma3", "\"Gemma3ForCausalLM\"", "\"Gemma3ForConditionalGeneration\"", "text_config"},
        {"gemma3", "\"full_attention\"\n", "\"chunked_attention\"\n", "layer_types[2]"},
        {"gemma2", "\"gelu_pytorch_tanh\"", "\"relu\"", "hidden_activation"},
        {"gemma2", "\"use_bidirectional_attention\": null", "\"use_bidirectional_attention\": true", "bidirectional"},
        {"phi3", "\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.1", "partial_rotary_factor"},
        {"phi3", "\"rope_type\": \"longrope\"", "\"rope_type\": \"dynamic\"", "not supported"},
        {"mistral", "\"sliding_window\": 8", "\"sliding_window\": -3", "sliding_window"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char dir[64];
        REQUIRE(edited_model(cs[i].name, cs[i].from, cs[i].to, dir), "%s: cannot edit (%s)", cs[i].name, cs[i].from);
        kn_model *m = NULL;
        kn_status s = kn_model_load(dir, NULL, &m);
        CHECK(s != KN_OK && !m && strstr(kn_last_error(), cs[i].needle), "%s with %s: status %d, message: %s", cs[i].name,
              cs[i].to, (int)s, kn_last_error());
        kn_model_free(m);
        remove_model(dir);
    }
}

/* GGUF files of these architectures with one thing wrong: a clear error
 * naming it. The fixture's bytes with a name or a value patched in place. */
static bool patched_gguf(const char *name, const char *find, size_t nfind, const char *repl, char out[64]) {
    char src[256];
    snprintf(src, sizeof src, FIX "%s.gguf", name);
    FILE *f = fopen(src, "rb");
    if (!f) return false;
    static char buf[1 << 19];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char *at = NULL;
    for (size_t i = 0; i + nfind <= n && !at; i++)
        if (!memcmp(buf + i, find, nfind)) at = buf + i;
    if (!at || n == sizeof buf) return false;
    memcpy(at, repl, nfind);
    snprintf(out, 64, "/tmp/kn_arch_%d_%s.gguf", (int)getpid(), name);
    f = fopen(out, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f)) ok = false;
    return ok;
}
TEST(arch_gguf_errors) {
    /* the u32 after the key's name and its type (4 = u32) */
    static const char pat[] = "gemma3.attention.sliding_window_pattern\x04\x00\x00\x00\x03\x00\x00\x00";
    static const struct { const char *name, *find; size_t n; const char *repl, *needle; } cs[] = {
        {"gemma3", pat, sizeof pat - 1, "gemma3.attention.sliding_window_pattern\x04\x00\x00\x00\x00\x00\x00\x00",
         "sliding_window_pattern"},
        {"gemma2", "blk.1.post_ffw_norm", 19, "blk.1.post_ffw_nora", "blk.1.post_ffw_norm.weight"},
        {"gemma3", "blk.0.attn_k_norm", 17, "blk.0.attn_k_nora", "blk.0.attn_k_norm.weight"},
        {"phi3", "rope_factors_long", 17, "rope_factors_lonX", "rope_factors_long.weight"},
        {"phi3", "blk.1.attn_qkv", 14, "blk.1.attn_qkX", "blk.1.attn_q.weight"},
        {"gemma2", "gemma2", 6, "gemma9", "'gemma9' is not supported"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char path[64];
        REQUIRE(patched_gguf(cs[i].name, cs[i].find, cs[i].n, cs[i].repl, path), "%s: cannot patch %s", cs[i].name, cs[i].repl);
        kn_model *m = NULL;
        kn_status s = kn_model_load(path, NULL, &m);
        CHECK(s != KN_OK && !m && strstr(kn_last_error(), cs[i].needle), "%s with %s: status %d, message: %s", cs[i].name,
              cs[i].repl, (int)s, kn_last_error());
        kn_model_free(m);
        unlink(path);
    }
}

/* kiln info's last line: what kiln runs (or why it cannot) */
static char *info_of(const char *path) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    kn_status st = kn_model_print_info(path, f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    rewind(f);
    if (st || !s || fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    fclose(f);
    return s;
}
TEST(arch_info_summary) {
    static const struct { const char *path, *want[3]; } cs[] = {
        {FIX "gemma2", {"kiln runs it as: gemma2", "sliding window 8 on 1 of 2 layers", "final logit softcap 4"}},
        {FIX "gemma3.gguf", {"kiln runs it as: gemma3", "sliding window 8 on 2 of 3 layers (rope base 10000 there)", "linear"}},
        {FIX "phi3.gguf", {"kiln runs it as: phi3", "on 8 of 16 dims", "scaling longrope"}},
        {FIX "mistral", {"kiln runs it as: mistral", "sliding window 8 on 2 of 2 layers", "separate head"}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char *s = info_of(cs[i].path);
        REQUIRE(s, "%s: %s", cs[i].path, kn_last_error());
        for (int k = 0; k < 3; k++) CHECK(strstr(s, cs[i].want[k]), "%s: info lacks \"%s\":\n%s", cs[i].path, cs[i].want[k], s);
        free(s);
    }
    char dir[64];
    REQUIRE(edited_model("gemma2", "\"gelu_pytorch_tanh\"", "\"relu\"", dir), "edit");
    char *s = info_of(dir);
    CHECK(s && strstr(s, "kiln cannot run it:") && strstr(s, "hidden_activation"), "info of an unsupported config: %s", s ? s : "");
    free(s);
    remove_model(dir);
}

/* ---- the CUDA backend (a GPU build on a GPU machine) ---------------------------------- */
#ifdef KN_CUDA
#include "kiln_cuda.h"
TEST(arch_cuda_matches_transformers) {
    kn_backend *g = kn_backend_cuda();
    if (!g) SKIP("no GPU: %s", kn_last_error());
    for (int i = 0; i < N_CASES; i++) {
        const arch_case *a = &g_cases[i];
        char ref[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", a->ref);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        for (int k = 0; k < 4; k++) {
            if (a->st_only && (k & 1)) continue;
            char path[256];
            snprintf(path, sizeof path, FIX "%s%s", a->name, k & 1 ? ".gguf" : "");
            bool f32 = k < 2;
            kn_model *m = load_ctx(path, 0, g, f32 ? KN_WEIGHTS_F32 : KN_WEIGHTS_BF16, a->n_ctx, false);
            CHECK(m, "%s on CUDA: %s", path, kn_last_error());
            if (!m) continue;
            snprintf(what, sizeof what, "%s %s cuda %s", a->ref, k & 1 ? "gguf" : "st", f32 ? "f32" : "bf16");
            check_model_tol(what, m, &r, f32 ? 1e-4 : 3e-2, f32 ? TIE_MARGIN : 0.1);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}
#else
TEST(arch_cuda_matches_transformers) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

KN_TEST_MAIN()
