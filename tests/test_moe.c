/* test_moe.c: the mixture-of-experts architectures (Mixtral, Qwen2-MoE,
 * Qwen3-MoE, OLMoE) against Hugging Face transformers.
 *
 * scripts/moe_ref.py builds four tiny random models with transformers itself
 * (Mixtral: 5 experts top-2 renormalised, tied head; Qwen2-MoE: 6 experts
 * top-2, a shared expert behind its sigmoid gate, q/k/v biases, one dense
 * layer (mlp_only_layers); Qwen3-MoE: 10 experts top-3, per-head q/k norms,
 * head_dim 16 != 48 / 4; OLMoE: 7 experts top-1, q/k norms over the whole
 * projections), saves each as safetensors + config.json (one matrix per
 * expert) and as a llama.cpp-layout GGUF (experts stacked; Mixtral as a
 * "llama" file with permuted q/k rows), checks that the random routers send
 * tokens to (almost) every expert, and records transformers' logits and
 * greedy continuations (tests/fixtures/moe/). Here:
 *   - each model loads both ways with the expected config, the logits of
 *     the prompts' last rows are within 1e-4 relative L2 of transformers',
 *     and greedy decoding through the KV cache gives the reference's 32
 *     tokens (up to a near tie), also with prefill in chunks of 3;
 *   - the fake device (host memory posing as a GPU) runs model.c's upload
 *     of the expert, router and shared-expert tensors;
 *   - the fixtures can fail: routing every token to the same experts (a
 *     zero router), or dropping Qwen2-MoE's shared expert, moves the logits
 *     far past the tolerance;
 *   - a config with more experts per token than experts is refused by name,
 *     and so are GGUF files with bad expert counts or a missing expert tensor;
 *   - in a CUDA build on a GPU, the CUDA backend (f32 weights to 1e-4, bf16
 *     to 3e-2); SKIP otherwise.
 */
#include "kn_llmref.h"
#include "kiln.h"
#include "kiln_backend.h"
#include "llm/model_impl.h"     /* defines: struct kn_model (the ablations reach the router) */
#include "graph/graph.h"        /* defines: kn__storage_owner, struct kn_buffer */
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/moe/"

typedef struct {
    const char *name;
    kn_arch arch;
    int layers, n_expert, n_used, expert_ffn, shared_ffn, head_dim;
    bool norm, tied;
} moe_case;
static const moe_case g_cases[] = {
    {"mixtral", KN_ARCH_MIXTRAL, 2, 5, 2, 32, 0, 12, true, true},
    {"qwen2moe", KN_ARCH_QWEN2MOE, 3, 6, 2, 24, 40, 12, false, false},
    {"qwen3moe", KN_ARCH_QWEN3MOE, 2, 10, 3, 24, 0, 16, true, false},
    {"olmoe", KN_ARCH_OLMOE, 2, 7, 1, 32, 0, 12, false, false},
};
enum { N_CASES = sizeof g_cases / sizeof g_cases[0] };

static void check_config(const char *what, const kn_model *m, const moe_case *q) {
    const kn_model_config *c = kn_model_get_config(m);
    CHECK(c->arch == q->arch && c->n_layers == q->layers && c->n_expert == q->n_expert && c->n_expert_used == q->n_used &&
          c->expert_ffn_dim == q->expert_ffn && c->shared_ffn_dim == q->shared_ffn && c->expert_norm == q->norm &&
          c->head_dim == q->head_dim && c->dim == 48 && c->tied_output == q->tied,
          "%s: arch %d layers %d experts %d/%d ffn %d shared %d norm %d head_dim %d tied %d", what, (int)c->arch, c->n_layers,
          c->n_expert_used, c->n_expert, c->expert_ffn_dim, c->shared_ffn_dim, c->expert_norm, c->head_dim, c->tied_output);
    for (int l = 0; l < c->n_layers; l++) {
        const kn__layer_w *L = &m->layers[l];
        bool dense = q->arch == KN_ARCH_QWEN2MOE && l == 1;          /* mlp_only_layers [1] */
        CHECK(dense ? !L->gate_inp && ((L->w1 && L->w3) || L->w13) && L->w2     /* gate|up stacked on the host */
                    : L->gate_inp && L->gate_exps && L->up_exps && L->down_exps && !L->w1 && !L->w13 &&
                          (q->shared_ffn > 0) == (L->gate_shexp && L->gate_inp_shexp),
              "%s layer %d: %s FFN tensors", what, l, dense ? "dense" : "expert");
        if (q->arch == KN_ARCH_OLMOE)
            CHECK(L->q_norm && kn_numel(L->q_norm) == 48 && kn_numel(L->k_norm) == 24, "%s: OLMoE q/k norms over q [48], k [24]", what);
    }
}

static kn_model *load(const char *path, int n_batch, kn_backend *be, kn_weight_dtype wd) {
    kn_model_opts o = {.n_ctx = 128, .n_batch = n_batch, .backend = be, .weight_dtype = wd};
    kn_model *m = NULL;
    if (kn_model_load(path, &o, &m) != KN_OK) return NULL;
    return m;
}

TEST(moe_matches_transformers) {
    for (int i = 0; i < N_CASES; i++) {
        const moe_case *q = &g_cases[i];
        char ref[256], dir[256], gguf[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(dir, sizeof dir, FIX "%s", q->name);
        snprintf(gguf, sizeof gguf, FIX "%s.gguf", q->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable (scripts/moe_ref.py writes it)", ref);
        const char *paths[2] = {dir, gguf}, *kinds[2] = {"safetensors", "gguf"};
        for (int k = 0; k < 2; k++) {
            kn_model *m = load(paths[k], 0, NULL, KN_WEIGHTS_AUTO);
            CHECK(m, "%s: %s", paths[k], kn_last_error());
            if (!m) continue;
            snprintf(what, sizeof what, "%s %s", q->name, kinds[k]);
            check_config(what, m, q);
            check_model_tol(what, m, &r, 1e-4, TIE_MARGIN);
            kn_model_free(m);
        }
        kn_model *m = load(gguf, 3, NULL, KN_WEIGHTS_AUTO);      /* prefill in chunks of 3 */
        CHECK(m, "%s n_batch 3: %s", gguf, kn_last_error());
        if (m) {
            snprintf(what, sizeof what, "%s gguf n_batch 3", q->name);
            check_model_tol(what, m, &r, 1e-4, TIE_MARGIN);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- a device backend's upload path (g_fake, kn_llmref.h) ------------------------------- */

TEST(moe_device_upload_path) {
    for (int i = 0; i < N_CASES; i++) {
        const moe_case *q = &g_cases[i];
        char ref[256], path[256], what[96];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(path, sizeof path, FIX "%s%s", q->name, i % 2 ? "" : ".gguf");
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        kn_model *m = load(path, 5, &g_fake, KN_WEIGHTS_F32);
        CHECK(m, "%s on the fake device: %s", path, kn_last_error());
        if (m) {
            const kn__layer_w *L = &m->layers[0];
            CHECK(L->gate_exps && L->gate_exps->dtype == KN_F32 && L->gate_inp->dtype == KN_F32, "%s: experts uploaded as f32", q->name);
            snprintf(what, sizeof what, "%s fake device", q->name);
            check_model_tol(what, m, &r, 1e-4, TIE_MARGIN);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- the fixtures can fail ------------------------------------------------------------- */
/* On the host the weights are the read-only file mapping; on the fake
 * device they are f32 copies the model owns, so the ablations run there:
 * a zero router (every probability 1/E: top-k takes experts 0..k-1) and a
 * zero shared-expert gate (sigmoid 0.5 instead of the learned gate). */
TEST(moe_routing_and_shared_expert_matter) {
    for (int i = 0; i < N_CASES; i++) {
        const moe_case *q = &g_cases[i];
        char ref[256], dir[256];
        snprintf(ref, sizeof ref, FIX "%s.ref", q->name);
        snprintf(dir, sizeof dir, FIX "%s", q->name);
        ref_file r = {0};
        REQUIRE(read_ref(ref, &r), "%s unreadable", ref);
        kn_model *m = load(dir, 0, &g_fake, KN_WEIGHTS_F32);
        REQUIRE(m, "%s: %s", dir, kn_last_error());
        double base = logits_err(m, &r);
        for (int l = 0; l < m->cfg.n_layers; l++) {
            kn__layer_w *L = &m->layers[l];
            if (!L->gate_inp) continue;
            REQUIRE(L->gate_inp->dtype == KN_F32, "the uploaded router is f32");
            memset((float *)kn__storage_owner(L->gate_inp)->buf->data + L->gate_inp->offset, 0, 4 * (size_t)kn_numel(L->gate_inp));
        }
        double flat = logits_err(m, &r);
        kn_model_free(m);
        CHECK(base < 1e-4 && flat > 1e-2, "%s: rel L2 %.3g routed, %.3g with a zero router (want < 1e-4 and > 1e-2)",
              q->name, base, flat);
        if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-10s rel L2 %.3g; zero router %.3g\n", q->name, base, flat);
        if (q->shared_ffn) {    /* the shared expert's sigmoid gate at -inf: no shared expert */
            m = load(dir, 0, &g_fake, KN_WEIGHTS_F32);
            REQUIRE(m, "%s: %s", dir, kn_last_error());
            for (int l = 0; l < m->cfg.n_layers; l++) {
                kn_tensor *g = m->layers[l].gate_inp_shexp;
                if (!g) continue;
                float *p = (float *)kn__storage_owner(g)->buf->data + g->offset;
                for (int64_t k = 0; k < kn_numel(g); k++) p[k] = 0;
            }
            double half = logits_err(m, &r);     /* gate 0: sigmoid 0.5 instead of the learned gate */
            CHECK(half > 1e-2, "%s: the shared expert's gate moves the logits by only %.3g", q->name, half);
            kn_model_free(m);
        }
        free_ref(&r);
    }
}

/* ---- refusals ---------------------------------------------------------------------------- */

TEST(moe_bad_configs_refused) {
    char dir[] = "/tmp/kn_moe_XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    char st[300], cfg[300];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    REQUIRE(copy_file(FIX "mixtral/model.safetensors", st), "copy the fixture");
    static const char *fmt =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 48, \"num_hidden_layers\": 2,\n"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 32, \"vocab_size\": 300,\n"
        " \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1e6, \"hidden_act\": \"silu\",\n"
        " \"tie_word_embeddings\": true, %s}\n";
    static const struct { const char *extra, *msg; } cases[] = {
        {"\"num_local_experts\": 5, \"num_experts_per_tok\": 2", NULL},
        {"\"num_local_experts\": 5, \"num_experts_per_tok\": 6", "num_experts_per_tok"},
        {"\"num_local_experts\": 6, \"num_experts_per_tok\": 2", "implies [6, 48]"},
        {"\"num_local_experts\": 5, \"num_experts_per_tok\": 2, \"sliding_window\": 64", "sliding_window"},
        {"\"num_experts_per_tok\": 2", "num_local_experts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(cfg, "w");
        REQUIRE(f, "cannot write %s", cfg);
        fprintf(f, fmt, cases[i].extra);
        fclose(f);
        kn_model *m = NULL;
        kn_status s = kn_model_load(dir, NULL, &m);
        if (!cases[i].msg) CHECK(s == KN_OK && m, "config %zu: %s", i, kn_last_error());
        else CHECK(s != KN_OK && !m && strstr(kn_last_error(), cases[i].msg), "config %zu must be refused naming %s: %s", i,
                   cases[i].msg, kn_last_error());
        kn_model_free(m);
    }
    unlink(st); unlink(cfg); rmdir(dir);
}

/* The Mixtral GGUF fixture patched in a temporary copy: a key's u32 value
 * (after its name: u32 type 4, then the value) or a tensor's name. */
static bool patch_gguf(const char *to, const char *find, const char *repl, int32_t u32_value) {
    FILE *f = fopen(FIX "mixtral.gguf", "rb");
    if (!f) return false;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t fl = strlen(find);
    char *at = NULL;
    for (size_t i = 0; i + fl <= n && !at; i++) if (!memcmp(buf + i, find, fl)) at = buf + i;
    if (!at) return false;
    if (repl) memcpy(at, repl, strlen(repl));
    else memcpy(at + fl + 4, &u32_value, 4);
    f = fopen(to, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f)) ok = false;
    return ok;
}

TEST(moe_bad_gguf_refused) {
    char path[] = "/tmp/kn_moe_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    static const struct { const char *find, *repl; int32_t v; const char *msg; } cases[] = {
        {"llama.expert_used_count", NULL, 6, "expert_used_count 6"},
        {"llama.expert_count", NULL, 0, "expert_count 0"},
        {"llama.expert_count", NULL, 4, "expert_count 4"},          /* tensors of 5 experts */
        {"blk.1.ffn_down_exps", "blk.1.ffn_down_expz", 0, "blk.1.ffn_down_exps"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        REQUIRE(patch_gguf(path, cases[i].find, cases[i].repl, cases[i].v), "patch the fixture (%s)", cases[i].find);
        kn_model *m = NULL;
        kn_status st = kn_model_load(path, NULL, &m);
        CHECK(st != KN_OK && !m && strstr(kn_last_error(), cases[i].msg), "case %zu must be refused naming '%s': %s", i,
              cases[i].msg, kn_last_error());
        kn_model_free(m);
    }
    unlink(path);
}

/* ---- the CUDA backend (a GPU build on a GPU machine) --------------------------------------- */
#ifdef KN_CUDA
#include "kiln_cuda.h"
TEST(moe_cuda_matches_transformers) {
    kn_backend *g = kn_backend_cuda();
    if (!g) SKIP("no GPU: %s", kn_last_error());
    for (int i = 0; i < N_CASES; i++) {
        const moe_case *q = &g_cases[i];
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
TEST(moe_cuda_matches_transformers) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

KN_TEST_MAIN()
