/* test_qwen.c: Qwen2 / Qwen2.5 and Qwen3 against Hugging Face transformers.
 *
 * scripts/qwen_ref.py builds three tiny random models with transformers
 * itself (Qwen2 with a tied head, Qwen2 with a separate head, Qwen3 with
 * head_dim 32 != hidden 64 / 4 heads), saves each as safetensors +
 * config.json and as a llama.cpp-layout GGUF, and records transformers'
 * logits and greedy continuations (tests/fixtures/qwen/). Here:
 *   - each model loads both ways with the expected config, and the logits of
 *     the prompts' last rows are within 1e-4 relative L2 of transformers';
 *     greedy decoding through the KV cache gives the reference's 32 tokens
 *     (up to a step where the reference's top two logits are a near tie);
 *   - the same with prefill in chunks of 3 (n_batch), with an f16 KV cache
 *     (to 1e-3), and on a fake device (host memory posing as a GPU: model.c's
 *     upload path with q|k|v and their biases stacked, q/k norms uploaded);
 *   - in a CUDA build on a GPU, the CUDA backend with f32 weights (1e-4) and
 *     bf16 weights (3e-2); SKIP otherwise;
 *   - the fixtures can fail: their biases and q/k norm gains are far from
 *     trivial, and zeroing the biases or resetting the norms to 1 in a loaded
 *     model moves the logits by orders of magnitude more than the tolerance;
 *   - a config asking for sliding-window attention is refused with a message;
 *     ones that leave it off (transformers 4 style: rope_theta at the top
 *     level) load and match;
 *   - the GGUF vocabulary (tokenizer.ggml.pre = "qwen2") splits numbers into
 *     single digits, so its "1 2" merge never applies inside "123";
 *   - a BPE vocabulary trained by Hugging Face `tokenizers` (merges across
 *     the boundaries Qwen2's split draws: digits, spaces before digits,
 *     words) encodes 18 strings to the ids `tokenizers` gives with Qwen2's
 *     pre-tokenizer (tests/fixtures/qwen/qwen2_vocab.*).
 */
#include "kn_llmref.h"   /* reference fixtures, check_model, the fake device, copy_file */
#include "kiln.h"
#include "kiln_backend.h"
#include "kiln_llm.h"
#include "llm/model_impl.h"     /* defines: struct kn_model (the ablation reaches its biases and norms) */
#include "graph/graph.h"        /* defines: kn__storage_owner, struct kn_buffer */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/qwen/"


/* ---- the models ------------------------------------------------------------------------ */
typedef struct {
    const char *name;
    kn_arch arch;
    int head_dim;
    bool tied;
    double theta, eps;
} qwen_case;
static const qwen_case g_cases[] = {
    {"qwen2_tied", KN_ARCH_QWEN2, 16, true, 1e6, 1e-6},
    {"qwen2_untied", KN_ARCH_QWEN2, 16, false, 20000, 1e-5},
    {"qwen3", KN_ARCH_QWEN3, 32, false, 1e6, 1e-6},
};
enum { N_CASES = sizeof g_cases / sizeof g_cases[0] };

static void check_config(const char *what, const kn_model *m, const qwen_case *q) {
    const kn_model_config *c = kn_model_get_config(m);
    CHECK(c->arch == q->arch && c->head_dim == q->head_dim && c->n_heads == 4 && c->n_kv_heads == 2 && c->dim == 64 &&
          c->n_layers == 2 && c->n_rot == q->head_dim && c->rope_neox && c->tied_output == q->tied &&
          fabs(c->rope_theta - q->theta) < 1e-6 * q->theta && fabs(c->norm_eps - q->eps) < 1e-3 * q->eps,
          "%s: config arch %d head_dim %d heads %d/%d dim %d rot %d neox %d tied %d theta %g eps %g", what, (int)c->arch,
          c->head_dim, c->n_heads, c->n_kv_heads, c->dim, c->n_rot, c->rope_neox, c->tied_output, c->rope_theta, c->norm_eps);
    for (int l = 0; l < c->n_layers; l++) {
        const kn__layer_w *L = &m->layers[l];
        bool q2 = q->arch == KN_ARCH_QWEN2;
        /* the host stacks q|k|v (model_fuse.c): the biases are then one vector */
        bool biases = (L->bq && L->bk && L->bv) || (L->wqkv && L->bqkv), none = !L->bq && !L->bk && !L->bv && !L->bqkv;
        CHECK(!L->bo && (q2 ? biases && !L->q_norm && !L->k_norm : none && L->q_norm && L->k_norm),
              "%s layer %d: qwen2 has q/k/v biases and no q/k norms, qwen3 the reverse", what, l);
    }
}

static kn_model *load(const char *path, int n_batch, kn_backend *be, kn_weight_dtype wd) {
    kn_model_opts o = {.n_ctx = 128, .n_batch = n_batch, .backend = be, .weight_dtype = wd};
    kn_model *m = NULL;
    if (kn_model_load(path, &o, &m) != KN_OK) return NULL;
    return m;
}

TEST(qwen_matches_transformers) {
    for (int i = 0; i < N_CASES; i++) {
        const qwen_case *q = &g_cases[i];
        char ref[256], dir[256], gguf[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(dir, sizeof dir, FIX "%s", q->name);
        snprintf(gguf, sizeof gguf, FIX "%s.gguf", q->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable (scripts/qwen_ref.py writes it)", ref);
        const char *paths[2] = {dir, gguf}, *kinds[2] = {"safetensors", "gguf"};
        for (int k = 0; k < 2; k++) {
            kn_model *m = load(paths[k], 0, NULL, KN_WEIGHTS_AUTO);
            CHECK(m, "%s: %s", paths[k], kn_last_error());
            if (!m) continue;
            snprintf(what, sizeof what, "%s %s", q->name, kinds[k]);
            check_config(what, m, q);
            CHECK(kn_model_get_config(m)->weight_type == KN_BF16, "%s: weights are bf16 in the file", what);
            check_model(what, m, &r);
            kn_model_free(m);
        }
        /* prefill in chunks of 3 (T < n_batch and several chunks per prompt) */
        kn_model *m = load(gguf, 3, NULL, KN_WEIGHTS_AUTO);
        CHECK(m, "%s n_batch 3: %s", gguf, kn_last_error());
        if (m) {
            snprintf(what, sizeof what, "%s gguf n_batch 3", q->name);
            check_model(what, m, &r);
            kn_model_free(m);
        }
        /* f16 KV cache: only the cached K, V are rounded */
        kn_model_opts o16 = {.n_ctx = 128, .kv_f16 = true};
        m = NULL;
        CHECK(kn_model_load(dir, &o16, &m) == KN_OK, "%s f16 KV: %s", dir, kn_last_error());
        if (m) {
            snprintf(what, sizeof what, "%s st f16 KV", q->name);
            check_model_tol(what, m, &r, 1e-3, 0.05);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- the fixtures can fail ------------------------------------------------------------- */
static void fill_f32_n(kn_tensor *t, int64_t n, float v) {
    float *p = (float *)kn__storage_owner(t)->buf->data + t->offset;
    for (int64_t i = 0; i < n; i++) p[i] = v;
}
static void fill_f32(kn_tensor *t, float v) { fill_f32_n(t, kn_numel(t), v); }
static float max_abs_dev(const kn_tensor *t, float from) {
    const float *p = (const float *)kn__storage_owner((kn_tensor *)t)->buf->data + t->offset;
    float d = 0;
    for (int64_t i = 0; i < kn_numel(t); i++) d = fmaxf(d, fabsf(p[i] - from));
    return d;
}

/* Loaded from safetensors, the bf16 vectors are f32 copies the model owns,
 * so they can be overwritten after the graph is built. */
TEST(qwen_biases_and_qk_norms_matter) {
    for (int i = 0; i < N_CASES; i++) {
        const qwen_case *q = &g_cases[i];
        char ref[256], dir[256];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(dir, sizeof dir, FIX "%s", q->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        kn_model *m = load(dir, 0, NULL, KN_WEIGHTS_AUTO);
        REQUIRE(m, "%s: %s", dir, kn_last_error());
        double base = logits_err(m, &r);
        for (int l = 0; l < m->cfg.n_layers; l++) {
            kn__layer_w *L = &m->layers[l];
            if (q->arch == KN_ARCH_QWEN2 && L->bqkv) {    /* stacked on the host (model_fuse.c): bq | bk | bv */
                int64_t qd = m->cfg.n_heads * m->cfg.head_dim, kd = m->cfg.n_kv_heads * m->cfg.head_dim;
                CHECK(kn_numel(L->bqkv) == qd + 2 * kd && max_abs_dev(L->bqkv, 0) > 0.5f,
                      "%s layer %d: the fixture's stacked biases are near zero", q->name, l);
                fill_f32_n(L->bqkv, qd + kd, 0);
            } else if (q->arch == KN_ARCH_QWEN2) {
                CHECK(max_abs_dev(L->bq, 0) > 0.5f && max_abs_dev(L->bk, 0) > 0.5f && max_abs_dev(L->bv, 0) > 0.5f,
                      "%s layer %d: the fixture's biases are near zero", q->name, l);
                fill_f32(L->bq, 0); fill_f32(L->bk, 0);
            } else {
                CHECK(max_abs_dev(L->q_norm, 1) > 0.4f && max_abs_dev(L->k_norm, 1) > 0.4f,
                      "%s layer %d: the fixture's q/k norm gains are near 1", q->name, l);
                fill_f32(L->q_norm, 1); fill_f32(L->k_norm, 1);
            }
        }
        double ablated = logits_err(m, &r);
        if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-14s rel L2 %.3g; without %s %.3g\n", q->name, base,
                                          q->arch == KN_ARCH_QWEN2 ? "q/k biases" : "q/k norm gains", ablated);
        CHECK(base < 1e-4 && ablated > 1e-2, "%s: rel L2 %.3g with, %.3g without the %s (want < 1e-4 and > 1e-2)",
              q->name, base, ablated, q->arch == KN_ARCH_QWEN2 ? "q/k biases" : "q/k norm gains");
        kn_model_free(m);
        free_ref(&r);
    }
}

/* ---- a device backend's upload path ------------------------------------------------------
 * On g_fake (kn_llmref.h: host memory posing as a device) kn_model_load
 * uploads every weight, stacks wq|wk|wv with bq|bk|bv, uploads q_norm and
 * k_norm, and stages inputs and logits. */

TEST(qwen_device_upload_path) {
    for (int i = 0; i < N_CASES; i++) {
        const qwen_case *q = &g_cases[i];
        char ref[256], path[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(path, sizeof path, FIX "%s%s", q->name, i == 1 ? "" : ".gguf");
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        kn_model *m = load(path, 5, &g_fake, KN_WEIGHTS_F32);
        CHECK(m, "%s on the fake device: %s", path, kn_last_error());
        if (m) {
            for (int l = 0; l < m->cfg.n_layers; l++)
                CHECK(m->layers[l].wqkv && !m->layers[l].wq && (q->arch == KN_ARCH_QWEN2) == (m->layers[l].bqkv != NULL) &&
                      !m->layers[l].bq && (q->arch == KN_ARCH_QWEN3) == (m->layers[l].q_norm != NULL),
                      "%s layer %d: q|k|v (and their biases) stacked on the device", q->name, l);
            snprintf(what, sizeof what, "%s fake device", q->name);
            check_model(what, m, &r);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- the CUDA backend (a GPU build on a GPU machine) ----------------------------------
 * f32 weights: to 1e-4 as on the CPU. bf16 (the files' own values; the
 * tensor-core GEMM rounds the activations to bf16 as its tiles load): to
 * 3e-2, greedy identical up to a reference margin of 0.1. */
#ifdef KN_CUDA
#include "kiln_cuda.h"
TEST(qwen_cuda_matches_transformers) {
    kn_backend *g = kn_backend_cuda();
    if (!g) SKIP("no GPU: %s", kn_last_error());
    for (int i = 0; i < N_CASES; i++) {
        const qwen_case *q = &g_cases[i];
        char ref[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        for (int k = 0; k < 4; k++) {
            char path[256];
            snprintf(path, sizeof path, FIX "%s%s", q->name, k & 1 ? ".gguf" : "");
            bool f32 = k < 2;
            kn_model *m = load(path, 0, g, f32 ? KN_WEIGHTS_F32 : KN_WEIGHTS_BF16);
            CHECK(m, "%s on CUDA: %s", path, kn_last_error());
            if (!m) continue;
            snprintf(what, sizeof what, "%s %s cuda %s", q->name, k & 1 ? "gguf" : "st", f32 ? "f32" : "bf16");
            check_model_tol(what, m, &r, f32 ? 1e-4 : 3e-2, f32 ? TIE_MARGIN : 0.1);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}
#else
TEST(qwen_cuda_matches_transformers) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

/* ---- refusals and the tokenizer --------------------------------------------------------- */

TEST(qwen_sliding_window_refused) {
    char dir[] = "/tmp/kn_qwen_XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    char st[300], cfg[300];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    REQUIRE(copy_file(FIX "qwen2_untied/model.safetensors", st), "copy the fixture");
    ref_file r = {0};
    REQUIRE(read_ref(FIX "qwen2_untied.ref", &r), FIX "qwen2_untied.ref unreadable");
    static const char *fmt =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 64,\n"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96,\n"
        " \"vocab_size\": 300, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, \"rope_theta\": 20000.0,\n"
        " \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, %s}\n";
    static const struct { const char *extra; bool ok; } cases[] = {
        {"\"use_sliding_window\": false, \"sliding_window\": 4, \"max_window_layers\": 0", true},    /* off */
        {"\"use_sliding_window\": true, \"sliding_window\": 4, \"max_window_layers\": 2", true},     /* no layer past 2 */
        {"\"use_sliding_window\": true, \"sliding_window\": 4, \"max_window_layers\": 1", false},
        {"\"layer_types\": [\"full_attention\", \"sliding_attention\"], \"sliding_window\": 4", false},
        {"\"layer_types\": [\"full_attention\", \"full_attention\"], \"use_sliding_window\": false", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(cfg, "w");
        REQUIRE(f, "cannot write %s", cfg);
        fprintf(f, fmt, cases[i].extra);
        fclose(f);
        kn_model *m = NULL;
        kn_status s = kn_model_load(dir, NULL, &m);
        /* written the transformers 4 way (rope_theta at the top level, no
         * rope_parameters): the same model as the fixture's config */
        if (cases[i].ok) CHECK(s == KN_OK && m && logits_err(m, &r) < 1e-4, "config %zu: %s", i, kn_last_error());
        else CHECK(s == KN_ERR_UNSUPPORTED && !m && strstr(kn_last_error(), "sliding-window") && strstr(kn_last_error(), "layer 1"),
                   "config %zu must be refused naming the sliding window: %s", i, kn_last_error());
        kn_model_free(m);
    }
    unlink(st); unlink(cfg); rmdir(dir);
    free_ref(&r);
}

TEST(qwen_gguf_tokenizer_splits_digits) {
    kn_model *m = load(FIX "qwen2_tied.gguf", 0, NULL, KN_WEIGHTS_AUTO);
    REQUIRE(m, "%s", kn_last_error());
    const kn_tokenizer *t = kn_model_tokenizer(m);
    REQUIRE(t, "the GGUF's qwen2 vocabulary was not loaded");
    int32_t ids[16];
    int n = 0;
    /* bytes are ids 0..255 in byte order; "12" is the first merge (256) */
    CHECK(kn_tokenize(t, "x123", 4, false, false, ids, 16, &n) == KN_OK && n == 4 && ids[0] == 'x' && ids[1] == '1' &&
          ids[2] == '2' && ids[3] == '3', "\"x123\": %d ids (want 4 single bytes: qwen2 isolates each digit)", n);
    CHECK(kn_tokenize(t, "a the", 5, false, false, ids, 16, &n) == KN_OK && n == 2 && ids[0] == 'a' && ids[1] == 259,
          "\"a the\": %d ids, second %d (want 2: 'a' and the merged \" the\" 259)", n, n > 1 ? ids[1] : -1);
    CHECK(kn_tokenize(t, "<|im_end|>", 10, false, true, ids, 16, &n) == KN_OK && n == 1 && ids[0] == 299,
          "control token: %d ids", n);
    kn_model_free(m);
}

/* "KNTK", u32 n; per string u32 n_bytes, bytes, u32 n_ids, i32 ids (scripts/qwen_ref.py) */
TEST(qwen2_pretokenizer_matches_hf_tokenizers) {
    kn_tokenizer *t = NULL;
    REQUIRE(kn_tokenizer_load_gguf(FIX "qwen2_vocab.gguf", &t) == KN_OK, "%s", kn_last_error());
    FILE *f = fopen(FIX "qwen2_vocab.tok", "rb");
    char magic[4];
    uint32_t n = 0;
    bool ok = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "KNTK", 4) && fread(&n, 4, 1, f) == 1 && n > 0 && n < 100;
    CHECK(ok, FIX "qwen2_vocab.tok unreadable");
    for (uint32_t i = 0; ok && i < n; i++) {
        char text[256];
        int32_t want[256], got[256];
        uint32_t nb = 0, nw = 0;
        ok = fread(&nb, 4, 1, f) == 1 && nb < sizeof text && fread(text, 1, nb, f) == nb && fread(&nw, 4, 1, f) == 1 &&
             nw <= 256 && fread(want, 4, nw, f) == nw;
        if (!ok) { CHECK(0, "string %u: truncated fixture", i); break; }
        text[nb] = 0;
        int ng = 0;
        kn_status st = kn_tokenize(t, text, nb, false, false, got, 256, &ng);
        bool same = st == KN_OK && ng == (int)nw && !memcmp(got, want, 4 * (size_t)nw);
        if (!same) {
            fprintf(stderr, "  %-30s want", text);
            for (uint32_t k = 0; k < nw; k++) fprintf(stderr, " %d", want[k]);
            fprintf(stderr, "\n  %-30s got ", "");
            for (int k = 0; k < ng && k < 256; k++) fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n");
        }
        CHECK(same, "string %u (%u bytes): %d ids vs %u from tokenizers: %s", i, nb, ng, nw, st ? kn_last_error() : "");
    }
    if (f) fclose(f);
    kn_tokenizer_free(t);
}

KN_TEST_MAIN()
