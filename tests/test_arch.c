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
#include "kn_llmref.h"   /* reference fixtures, check_model, the fake device, copy_file */
#include "kiln.h"
#include "kiln_backend.h"
#include "kiln_llm.h"
#include "llm/model_impl.h"     /* defines: struct kn_model (layer flags and weights) */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/arch/"


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

/* ---- a device backend's upload path (g_fake, kn_llmref.h) ------------------------------- */

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
