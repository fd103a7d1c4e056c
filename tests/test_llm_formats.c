/* test_llm_formats.c: model formats and architectures of the LLM engine
 * against independent PyTorch references (scripts/gpt2_ref.py writes
 * tests/fixtures/gpt2_*.ref).
 *
 * The tiny random models are written here, from the counter-based generator
 * that scripts/gpt2_ref.py documents and implements the same way: GPT-2 as
 * llm.c checkpoints (fp32, bf16) and Hugging Face safetensors (Conv1D
 * layout, f32/f16), Llama as Hugging Face safetensors (f32, bf16). Every
 * generated value is exact in bf16/f16, so all files share one reference.
 * Also: the f16 KV cache, tokenizer files, `kiln info`, and load errors.
 */
#include "kn_test.h"
#include "kn_bytes.h"
#include "kiln_llm.h"
#include "core/fp16.h"
#include "formats/llmc_gpt2.h"
#include "formats/safetensors.h"
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the generator (see scripts/gpt2_ref.py) ---------------------------------------- */
static int gen_k(uint64_t tid, int64_t i) {
    uint64_t z = ((tid << 32) + (uint64_t)i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (int)(z >> 56);
}
static float *gen(uint64_t tid, int64_t n, float scale) {   /* scale 0: gain */
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int k = gen_k(tid, i);
        p[i] = scale == 0 ? (float)(128 + k / 2) / 256.0f : (float)(k - 128) / 128.0f * scale;
    }
    return p;
}

/* ---- scratch files -------------------------------------------------------------------- */
static char g_dir[64];
static const char *tmp_path(const char *name) {
    static char buf[8][256];
    static int k;
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/kn_llmfmt_XXXXXX");
        if (!mkdtemp(g_dir)) return NULL;
    }
    char *b = buf[k++ % 8];
    snprintf(b, 256, "%s/%s", g_dir, name);
    return b;
}
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* ---- GPT-2 ------------------------------------------------------------------------------ */
enum { G_L = 2, G_C = 32, G_NH = 4, G_V = 64, G_VP = 80, G_T = 16 };
static const float g_scale[KN_GPT2_NPARAMS] = {0.25f, 0.5f, 0, 0.125f, 0.25f, 0.125f, 0.25f, 0.125f,
                                               0, 0.125f, 0.25f, 0.125f, 0.125f, 0.125f, 0, 0.125f};
typedef struct { kn_llmc_gpt2_config cfg; float *p[KN_GPT2_NPARAMS]; kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS]; } gpt2_w;

static void gpt2_make(gpt2_w *w, int V, int Vp, int L) {
    w->cfg = (kn_llmc_gpt2_config){G_T, V, Vp, L, G_NH, G_C};
    kn_llmc_gpt2_shapes(&w->cfg, w->sh, NULL);
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) w->p[p] = gen(1000 + (uint64_t)p, w->sh[p].numel, g_scale[p]);
}
static void gpt2_free(gpt2_w *w) { for (int p = 0; p < KN_GPT2_NPARAMS; p++) free(w->p[p]); }

static uint16_t *to_half(const float *x, int64_t n, kn_dtype dt) {
    uint16_t *h = malloc(2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) h[i] = dt == KN_BF16 ? kn_fp32_to_bf16(x[i]) : kn_fp32_to_fp16(x[i]);
    return h;
}

static bool write_llmc(const gpt2_w *w, const char *path, kn_dtype dt) {
    const void *pp[KN_GPT2_NPARAMS];
    uint16_t *h[KN_GPT2_NPARAMS] = {0};
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) {
        if (dt == KN_BF16) h[p] = to_half(w->p[p], w->sh[p].numel, KN_BF16);
        pp[p] = dt == KN_BF16 ? (const void *)h[p] : (const void *)w->p[p];
    }
    bool ok = kn_llmc_gpt2_write(path, &w->cfg, dt, pp) == KN_OK;
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) free(h[p]);
    return ok;
}

/* A set of safetensors tensors built from f32 arrays, converted on write. */
typedef struct {
    int n;
    char names[160][96];
    int ndims[160];
    int64_t shapes[160][KN_ST_MAX_DIMS];
    float *data[160];          /* owned */
} st_set;
static void st_add(st_set *s, const char *name, int ndim, int64_t d0, int64_t d1, float *data) {
    snprintf(s->names[s->n], 96, "%s", name);
    s->ndims[s->n] = ndim; s->shapes[s->n][0] = d0; s->shapes[s->n][1] = d1;
    s->data[s->n++] = data;
}
static float *copy_f(const float *x, int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    memcpy(p, x, sizeof(float) * (size_t)n);
    return p;
}
static float *transposed(const float *x, int64_t r, int64_t c) {   /* [r, c] -> [c, r] */
    float *p = malloc(sizeof(float) * (size_t)(r * c));
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) p[j * r + i] = x[i * c + j];
    return p;
}
static bool st_write(st_set *s, const char *path, kn_dtype dt) {
    const char *names[160]; kn_dtype dts[160]; const void *datas[160]; void *conv[160] = {0};
    for (int i = 0; i < s->n; i++) {
        int64_t n = 1;
        for (int d = 0; d < s->ndims[i]; d++) n *= s->shapes[i][d];
        names[i] = s->names[i]; dts[i] = dt;
        if (dt != KN_F32) conv[i] = to_half(s->data[i], n, dt);
        datas[i] = dt == KN_F32 ? (const void *)s->data[i] : conv[i];
    }
    bool ok = kn_safetensors_write(path, s->n, names, dts, s->ndims, (const int64_t(*)[KN_ST_MAX_DIMS])s->shapes, datas, 0, NULL) == KN_OK;
    for (int i = 0; i < s->n; i++) free(conv[i]);
    return ok;
}
static void st_free(st_set *s) { for (int i = 0; i < s->n; i++) free(s->data[i]); s->n = 0; }

/* HF GPT2LMHeadModel tensors: Conv1D weights [in, out] = transposed llm.c */
static void gpt2_hf_set(const gpt2_w *w, st_set *s, const char *prefix) {
    int64_t C = G_C, L = w->cfg.n_layers, V = w->cfg.vocab_size;
    char n[96];
    snprintf(n, sizeof n, "%swte.weight", prefix); st_add(s, n, 2, V, C, copy_f(w->p[KN_GPT2_WTE], V * C));
    snprintf(n, sizeof n, "%swpe.weight", prefix); st_add(s, n, 2, G_T, C, copy_f(w->p[KN_GPT2_WPE], G_T * C));
    for (int64_t l = 0; l < L; l++) {
#define V1(nm, id, len) snprintf(n, sizeof n, "%sh.%d." nm, prefix, (int)l); st_add(s, n, 1, len, 0, copy_f(w->p[id] + l * (len), len));
#define M2(nm, id, out, in) snprintf(n, sizeof n, "%sh.%d." nm, prefix, (int)l); st_add(s, n, 2, in, out, transposed(w->p[id] + l * (out) * (in), out, in));
        V1("ln_1.weight", KN_GPT2_LN1W, C) V1("ln_1.bias", KN_GPT2_LN1B, C)
        M2("attn.c_attn.weight", KN_GPT2_QKVW, 3 * C, C) V1("attn.c_attn.bias", KN_GPT2_QKVB, 3 * C)
        M2("attn.c_proj.weight", KN_GPT2_ATTPROJW, C, C) V1("attn.c_proj.bias", KN_GPT2_ATTPROJB, C)
        V1("ln_2.weight", KN_GPT2_LN2W, C) V1("ln_2.bias", KN_GPT2_LN2B, C)
        M2("mlp.c_fc.weight", KN_GPT2_FCW, 4 * C, C) V1("mlp.c_fc.bias", KN_GPT2_FCB, 4 * C)
        M2("mlp.c_proj.weight", KN_GPT2_FCPROJW, C, 4 * C) V1("mlp.c_proj.bias", KN_GPT2_FCPROJB, C)
#undef V1
#undef M2
    }
    snprintf(n, sizeof n, "%sln_f.weight", prefix); st_add(s, n, 1, C, 0, copy_f(w->p[KN_GPT2_LNFW], C));
    snprintf(n, sizeof n, "%sln_f.bias", prefix); st_add(s, n, 1, C, 0, copy_f(w->p[KN_GPT2_LNFB], C));
}
static const char *gpt2_config =
    "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 4,\n"
    " \"n_positions\": 16, \"n_ctx\": 16, \"vocab_size\": 64, \"layer_norm_epsilon\": 1e-05, \"n_inner\": null,\n"
    " \"activation_function\": \"gelu_new\", \"torch_dtype\": \"float32\"}\n";

/* ---- Llama (HF) --------------------------------------------------------------------------- */
enum { LL_L = 2, LL_C = 32, LL_H = 4, LL_HKV = 2, LL_D = 8, LL_F = 64, LL_V = 64 };
static void llama_hf_set(st_set *s) {
    st_add(s, "model.embed_tokens.weight", 2, LL_V, LL_C, gen(2000, LL_V * LL_C, 1.0f));
    st_add(s, "lm_head.weight", 2, LL_V, LL_C, gen(2001, LL_V * LL_C, 0.25f));
    st_add(s, "model.norm.weight", 1, LL_C, 0, gen(2002, LL_C, 0));
    for (int l = 0; l < LL_L; l++) {
        uint64_t b = 2100 + 20 * (uint64_t)l;
        char n[96];
#define T2(nm, id, r, c, sc) snprintf(n, sizeof n, "model.layers.%d." nm, l); st_add(s, n, c ? 2 : 1, r, c, gen(b + id, (int64_t)(r) * ((c) ? (c) : 1), sc));
        T2("input_layernorm.weight", 0, LL_C, 0, 0) T2("self_attn.q_proj.weight", 1, LL_H * LL_D, LL_C, 0.25f)
        T2("self_attn.k_proj.weight", 2, LL_HKV * LL_D, LL_C, 0.25f) T2("self_attn.v_proj.weight", 3, LL_HKV * LL_D, LL_C, 0.25f)
        T2("self_attn.o_proj.weight", 4, LL_C, LL_H * LL_D, 0.25f) T2("post_attention_layernorm.weight", 5, LL_C, 0, 0)
        T2("mlp.gate_proj.weight", 6, LL_F, LL_C, 0.25f) T2("mlp.up_proj.weight", 7, LL_F, LL_C, 0.25f)
        T2("mlp.down_proj.weight", 8, LL_C, LL_F, 0.125f)
#undef T2
    }
}
static const char *llama_config_fmt =
    "{\"architectures\": [\"%s\"], \"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 2,\n"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": %d, \"vocab_size\": 64,\n"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\",\n"
    " \"rope_scaling\": %s, \"tie_word_embeddings\": false}\n";
static const char *rope_linear = "{\"type\": \"linear\", \"factor\": 2.0}";
static void write_llama_config_rope(const char *dir, const char *arch, int ffn, const char *rope) {
    char text[1024], path[300];
    snprintf(text, sizeof text, llama_config_fmt, arch, ffn, rope);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, text);
}
static void write_llama_config(const char *dir, const char *arch, int ffn) {
    char text[1024], path[300];
    snprintf(text, sizeof text, llama_config_fmt, arch, ffn, rope_linear);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, text);
}

/* ---- reference fixtures (KNLR v2, as scripts/llm_ref.py) ----------------------------------- */
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
        if (!(ok = fread(k, 4, 3, f) == 3)) break;
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

/* Logits of every prompt row within tol (max abs error relative to the row's
 * max abs logit) and greedy decoding through the KV cache identical, except
 * after a step whose reference top-2 margin is below tie_margin. */
static void check_model(const char *what, kn_model *m, const ref_file *r, double tol, double tie_margin) {
    int V = r->V;
    REQUIRE(kn_model_get_config(m)->n_vocab == V, "%s: vocab %d vs %d", what, kn_model_get_config(m)->n_vocab, V);
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *lg = malloc(sizeof(float) * (size_t)c->n_prompt * V);
        REQUIRE(kn_model_eval(m, c->prompt, c->n_prompt, 0, lg, true) == KN_OK, "%s: %s", what, kn_last_error());
        double worst = 0;
        for (int k = 0; k < c->rows; k++) {
            const float *a = lg + (size_t)(c->n_prompt - c->rows + k) * V, *b = c->logits + (size_t)k * V;
            double mx = 0, err = 0;
            for (int v = 0; v < V; v++) { mx = fmax(mx, fabs(b[v])); err = fmax(err, fabs(a[v] - b[v])); }
            worst = fmax(worst, err / mx);
        }
        if (getenv("KN_VERBOSE")) fprintf(stderr, "  %s case %d: logits rel err %.3g\n", what, i, worst);
        CHECK(worst < tol, "%s case %d: logits rel err %.3g (tol %.3g)", what, i, worst, tol);
        free(lg);
        float *l1 = malloc(sizeof(float) * (size_t)V);
        int32_t seq[64];
        memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
        REQUIRE(c->n_prompt + c->n_gen <= 64, "case too long");
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
        while (clear < c->n_gen && c->margin[clear] >= tie_margin) clear++;
        CHECK(same >= clear, "%s case %d: greedy agrees for %d of %d tokens (%d required)", what, i, same, c->n_gen, clear);
        free(l1);
    }
}

static kn_model *load(const char *path, const kn_model_opts *o) {
    kn_model *m = NULL;
    if (kn_model_load(path, o, &m) != KN_OK) return NULL;
    return m;
}

/* ---- tests -------------------------------------------------------------------------------- */
TEST(gpt2_llmc_fp32_bf16_match_pytorch) {
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/gpt2_tiny.ref", &r), "tests/fixtures/gpt2_tiny.ref unreadable (scripts/gpt2_ref.py)");
    gpt2_w w;
    gpt2_make(&w, G_V, G_VP, G_L);
    const char *p32 = tmp_path("gpt2_f32.bin"), *p16 = tmp_path("gpt2_bf16.bin");
    REQUIRE(write_llmc(&w, p32, KN_F32) && write_llmc(&w, p16, KN_BF16), "%s", kn_last_error());
    kn_model *m = load(p32, NULL);
    REQUIRE(m, "%s", kn_last_error());
    const kn_model_config *c = kn_model_get_config(m);
    CHECK(c->arch == KN_ARCH_GPT2 && c->n_layers == 2 && c->dim == 32 && c->n_vocab == 64 && c->n_ctx_train == 16 &&
          c->tied_output && c->weight_type == KN_F32, "config");
    CHECK(kn_model_tokenizer(m) == NULL, "llm.c checkpoints carry no tokenizer");
    check_model("llm.c f32", m, &r, 1e-5, 0);
    kn_model_free(m);
    /* prefill in chunks of 3 through the KV cache gives the same logits */
    kn_model_opts o = {.n_batch = 3};
    REQUIRE((m = load(p32, &o)), "%s", kn_last_error());
    check_model("llm.c f32 n_batch 3", m, &r, 1e-5, 0);
    kn_model_free(m);
    REQUIRE((m = load(p16, NULL)), "%s", kn_last_error());
    CHECK(kn_model_get_config(m)->weight_type == KN_BF16, "bf16 weights");
    check_model("llm.c bf16", m, &r, 1e-5, 0);
    kn_model_free(m);
    o = (kn_model_opts){.kv_f16 = true, .n_batch = 4};
    REQUIRE((m = load(p16, &o)), "%s", kn_last_error());
    check_model("llm.c bf16, f16 KV, n_batch 4", m, &r, 1e-3, 0.05);
    kn_model_free(m);
    /* learned positions: no context beyond maxT */
    o = (kn_model_opts){.n_ctx = 32};
    CHECK(!load(p32, &o) && strstr(kn_last_error(), "16 learned positions"), "n_ctx > maxT: %s", kn_last_error());
    gpt2_free(&w);
    free_ref(&r);
    unlink(p32); unlink(p16);
}

TEST(gpt2_hf_safetensors_match_pytorch) {
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/gpt2_tiny.ref", &r), "tests/fixtures/gpt2_tiny.ref unreadable");
    gpt2_w w;
    gpt2_make(&w, G_V, G_VP, G_L);
    const char *dir = tmp_path("gpt2_hf");
    mkdir(dir, 0755);
    char st[300], cfg[300];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_text(cfg, gpt2_config);
    static const kn_dtype dts[3] = {KN_F32, KN_F16, KN_BF16};
    for (int k = 0; k < 3; k++) {
        st_set s = {0};
        gpt2_hf_set(&w, &s, k == 1 ? "" : "transformer.");    /* both name styles */
        REQUIRE(st_write(&s, st, dts[k]), "%s", kn_last_error());
        st_free(&s);
        kn_model *m = load(k == 0 ? dir : st, NULL);           /* a directory or the .safetensors file */
        REQUIRE(m, "%s: %s", kn_dtype_name(dts[k]), kn_last_error());
        CHECK(kn_model_get_config(m)->arch == KN_ARCH_GPT2 && kn_model_get_config(m)->weight_type == dts[k], "config");
        char what[64];
        snprintf(what, sizeof what, "HF GPT-2 %s", kn_dtype_name(dts[k]));
        check_model(what, m, &r, 1e-5, 0);
        kn_model_free(m);
    }
    /* tokenizer.json beside config.json is the model's tokenizer (issue 15) */
    char tj[300];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    write_text(tj, "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"vocab\":{\"[UNK]\":0,"
                   "\"hello\":1,\"world\":2,\"##s\":3}},\"normalizer\":{\"type\":\"Lowercase\"},"
                   "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"decoder\":{\"type\":\"WordPiece\"}}");
    kn_model *mt = load(dir, NULL);
    const kn_tokenizer *tk = mt ? kn_model_tokenizer(mt) : NULL;
    int32_t tid[8]; int ntid = 0;
    CHECK(tk && kn_tokenize(tk, "Hello worlds", 12, false, false, tid, 8, &ntid) == KN_OK && ntid == 3 &&
          tid[0] == 1 && tid[1] == 2 && tid[2] == 3, "tokenizer.json in the model directory: %s", kn_last_error());
    kn_model_free(mt);
    write_text(tj, "{\"model\":{\"type\":\"WordLevel\"}}");   /* unusable: a clear error, not ids-only */
    CHECK(!load(dir, NULL) && strstr(kn_last_error(), "WordLevel") && strstr(kn_last_error(), "-z"), "%s", kn_last_error());
    unlink(tj);
    /* recognised by its header, whatever the file is called */
    char other[300];
    snprintf(other, sizeof other, "%s/weights.bin", dir);
    REQUIRE(rename(st, other) == 0, "rename");
    kn_model *m = load(other, NULL);
    CHECK(m && kn_model_get_config(m)->arch == KN_ARCH_GPT2, "safetensors by magic: %s", m ? "" : kn_last_error());
    kn_model_free(m);
    unlink(other); unlink(cfg); rmdir(dir);
    gpt2_free(&w);
    free_ref(&r);
}

TEST(llama_hf_safetensors_match_pytorch) {
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/gpt2_hfllama.ref", &r), "tests/fixtures/gpt2_hfllama.ref unreadable");
    const char *dir = tmp_path("llama_hf");
    mkdir(dir, 0755);
    char st[300], cfg[300];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_llama_config(dir, "LlamaForCausalLM", LL_F);
    static const kn_dtype dts[2] = {KN_F32, KN_BF16};
    for (int k = 0; k < 2; k++) {
        st_set s = {0};
        llama_hf_set(&s);
        REQUIRE(st_write(&s, st, dts[k]), "%s", kn_last_error());
        st_free(&s);
        kn_model *m = load(dir, NULL);
        REQUIRE(m, "%s", kn_last_error());
        const kn_model_config *c = kn_model_get_config(m);
        CHECK(c->arch == KN_ARCH_LLAMA && c->rope_neox && !c->tied_output && c->n_kv_heads == 2 &&
              fabs(c->rope_freq_scale - 0.5) < 1e-12 && c->weight_type == dts[k], "config");
        char what[64];
        snprintf(what, sizeof what, "HF Llama %s", kn_dtype_name(dts[k]));
        check_model(what, m, &r, 1e-5, 0);
        kn_model_free(m);
        /* f16 KV cache: rounding of cached K, V only */
        kn_model_opts o = {.kv_f16 = true};
        REQUIRE((m = load(dir, &o)), "%s", kn_last_error());
        snprintf(what, sizeof what, "HF Llama %s, f16 KV", kn_dtype_name(dts[k]));
        check_model(what, m, &r, 1e-3, 0.05);
        kn_model_free(m);
    }
    unlink(st); unlink(cfg); rmdir(dir);
    free_ref(&r);
}

/* RoPE context scaling, Llama 3 and YaRN: the reference takes its
 * frequencies and attention factor from transformers' rope functions */
TEST(llama_hf_rope_scaling_llama3_yarn_match_pytorch) {
    static const struct { const char *ref, *rope, *name; } C[] = {
        {"tests/fixtures/gpt2_hfllama_llama3.ref", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}", "llama3"},
        {"tests/fixtures/gpt2_hfllama_yarn.ref", "{\"rope_type\": \"yarn\", \"factor\": 4.0, "
         "\"original_max_position_embeddings\": 64}", "yarn"}};
    const char *dir = tmp_path("llama_hf_rope");
    mkdir(dir, 0755);
    char st[300], cfg[300];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    st_set s = {0};
    llama_hf_set(&s);
    REQUIRE(st_write(&s, st, KN_F32), "%s", kn_last_error());
    st_free(&s);
    for (int i = 0; i < 2; i++) {
        ref_file r = {0};
        REQUIRE(read_ref(C[i].ref, &r), "%s unreadable (scripts/gpt2_ref.py)", C[i].ref);
        write_llama_config_rope(dir, "LlamaForCausalLM", LL_F, C[i].rope);
        kn_model *m = load(dir, NULL);
        REQUIRE(m, "%s", kn_last_error());
        CHECK(!strcmp(kn_model_get_config(m)->rope_scaling, C[i].name), "rope_scaling '%s'", kn_model_get_config(m)->rope_scaling);
        char what[64];
        snprintf(what, sizeof what, "HF Llama rope %s", C[i].name);
        check_model(what, m, &r, 1e-5, 0);
        kn_model_free(m);
        free_ref(&r);
    }
    /* unsupported types and bad parameters are refused with the reason */
    write_llama_config_rope(dir, "LlamaForCausalLM", LL_F, "{\"rope_type\": \"dynamic\", \"factor\": 2.0}");
    CHECK(!load(dir, NULL) && strstr(kn_last_error(), "dynamic"), "dynamic refused: %s", kn_last_error());
    write_llama_config_rope(dir, "LlamaForCausalLM", LL_F, "{\"rope_type\": \"llama3\", \"factor\": 8.0, "
                            "\"low_freq_factor\": 4.0, \"high_freq_factor\": 1.0}");
    CHECK(!load(dir, NULL) && strstr(kn_last_error(), "high_freq_factor"), "bad llama3 refused: %s", kn_last_error());
    unlink(st); unlink(cfg); rmdir(dir);
}

/* ---- the HF tiny Llama as a GGUF file (llama.cpp's conversion) --------------------------
 * Q and K rows are permuted per head for interleaved-pair rotation (new row
 * 2j + s of a head = HF row s * D/2 + j); a 64-token SentencePiece-style
 * vocabulary. rope: "llama3" adds rope_freqs.weight (the divisors computed
 * from the same parameters as the HF config: factor 8, low/high 1/4,
 * original context 64, as llama.cpp's converter stores them), "yarn" sets
 * the yarn metadata keys. */
static void gkv_u32(bb *b, const char *k, uint32_t v) { bb_str(b, k); bb_u32(b, 4); bb_u32(b, v); }
static void gkv_f32(bb *b, const char *k, float v) { bb_str(b, k); bb_u32(b, 6); bb_f32(b, v); }
static void gkv_str(bb *b, const char *k, const char *v) { bb_str(b, k); bb_u32(b, 8); bb_str(b, v); }
/* An f32 tensor of a GGUF image: ne0 innermost; ne1 0 for a vector. */
typedef struct { char name[64]; int64_t ne0, ne1; const float *data; } gguf_t;
/* b holds the magic, counts and key/values: append the tensor infos and the
 * 32-byte aligned data of T[0..nt), write the image to path, free b. */
static bool gguf_finish(bb *b, const gguf_t *T, int nt, const char *path) {
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        bb_str(b, T[i].name);
        bb_u32(b, T[i].ne1 ? 2 : 1); bb_u64(b, (uint64_t)T[i].ne0); if (T[i].ne1) bb_u64(b, (uint64_t)T[i].ne1);
        bb_u32(b, 0); bb_u64(b, off);
        off += ((uint64_t)T[i].ne0 * (T[i].ne1 ? T[i].ne1 : 1) * 4 + 31) / 32 * 32;
    }
    bb_pad(b, 32);
    for (int i = 0; i < nt; i++) {
        bb_put(b, T[i].data, (size_t)T[i].ne0 * (T[i].ne1 ? T[i].ne1 : 1) * 4);
        bb_pad(b, 32);
    }
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b->p, 1, b->n, f) == b->n;
    if (f) fclose(f);
    free(b->p);
    return ok;
}
static float *permute_qk(const float *w, int heads, int D, int in) {
    float *o = malloc(sizeof(float) * (size_t)heads * D * in);
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < D / 2; j++)
            for (int s = 0; s < 2; s++)
                memcpy(o + ((size_t)h * D + 2 * j + s) * in, w + ((size_t)h * D + s * D / 2 + j) * in, sizeof(float) * in);
    return o;
}
static bool write_llama_gguf(const char *path, const char *rope, bool vocab) {
    st_set s = {0};
    llama_hf_set(&s);
    gguf_t T[40];
    float *own_list[40];                  /* permuted copies to free */
    int nt = 0, nown = 0;
    for (int i = 0; i < s.n; i++) {
        const char *n = s.names[i];
        char gn[64] = "";
        int l = -1;
        float *d = s.data[i];
        bool own = false;
        if (!strcmp(n, "model.embed_tokens.weight")) strcpy(gn, "token_embd.weight");
        else if (!strcmp(n, "lm_head.weight")) strcpy(gn, "output.weight");
        else if (!strcmp(n, "model.norm.weight")) strcpy(gn, "output_norm.weight");
        else if (sscanf(n, "model.layers.%d.", &l) == 1) {
            const char *f = strchr(n + strlen("model.layers."), '.') + 1;
            static const char *map[][2] = {{"input_layernorm.weight", "attn_norm"}, {"self_attn.q_proj.weight", "attn_q"},
                {"self_attn.k_proj.weight", "attn_k"}, {"self_attn.v_proj.weight", "attn_v"}, {"self_attn.o_proj.weight", "attn_output"},
                {"post_attention_layernorm.weight", "ffn_norm"}, {"mlp.gate_proj.weight", "ffn_gate"},
                {"mlp.up_proj.weight", "ffn_up"}, {"mlp.down_proj.weight", "ffn_down"}};
            for (int k = 0; k < 9; k++) if (!strcmp(f, map[k][0])) snprintf(gn, sizeof gn, "blk.%d.%s.weight", l, map[k][1]);
            if (strstr(f, "q_proj")) { d = permute_qk(d, LL_H, LL_D, LL_C); own = true; }
            if (strstr(f, "k_proj")) { d = permute_qk(d, LL_HKV, LL_D, LL_C); own = true; }
        }
        if (!gn[0]) continue;
        snprintf(T[nt].name, 64, "%s", gn);
        T[nt].ne0 = s.ndims[i] == 2 ? s.shapes[i][1] : s.shapes[i][0];   /* innermost first */
        T[nt].ne1 = s.ndims[i] == 2 ? s.shapes[i][0] : 0;
        T[nt].data = d; nt++;
        if (own) own_list[nown++] = d;
    }
    float ff[LL_D / 2];
    if (!strcmp(rope, "llama3")) {
        for (int i = 0; i < LL_D / 2; i++) {      /* llama.cpp's converter: 1, a blend, or the factor */
            double f = pow(10000.0, -2.0 * i / LL_D), wl = 2 * M_PI / f, lo = 64.0 / 1, hi = 64.0 / 4;
            ff[i] = wl < hi ? 1.0f : wl > lo ? 8.0f : (float)(1 / ((1 - (64 / wl - 1) / 3) / 8 + (64 / wl - 1) / 3));
        }
        snprintf(T[nt].name, 64, "rope_freqs.weight");
        T[nt].ne0 = LL_D / 2; T[nt].ne1 = 0; T[nt].data = ff; nt++;
    }
    bb b = {0};
    bb_put(&b, "GGUF", 4); bb_u32(&b, 3); bb_u64(&b, (uint64_t)nt);
    int nkv = 9 + (vocab ? 3 : 0) + (!strcmp(rope, "yarn") ? 3 : 0);
    bb_u64(&b, (uint64_t)nkv);
    gkv_str(&b, "general.architecture", "llama");
    gkv_u32(&b, "llama.block_count", LL_L); gkv_u32(&b, "llama.context_length", 64);
    gkv_u32(&b, "llama.embedding_length", LL_C); gkv_u32(&b, "llama.feed_forward_length", LL_F);
    gkv_u32(&b, "llama.attention.head_count", LL_H); gkv_u32(&b, "llama.attention.head_count_kv", LL_HKV);
    gkv_f32(&b, "llama.rope.freq_base", 10000.0f); gkv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (vocab) {
        gkv_str(&b, "tokenizer.ggml.model", "llama");
        bb_str(&b, "tokenizer.ggml.tokens"); bb_u32(&b, 9); bb_u32(&b, 8); bb_u64(&b, LL_V);
        for (int i = 0; i < LL_V; i++) { char t[16]; snprintf(t, sizeof t, i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "t%d", i); bb_str(&b, t); }
        bb_str(&b, "tokenizer.ggml.scores"); bb_u32(&b, 9); bb_u32(&b, 6); bb_u64(&b, LL_V);
        for (int i = 0; i < LL_V; i++) bb_f32(&b, (float)-i);
    }
    if (!strcmp(rope, "yarn")) {
        gkv_str(&b, "llama.rope.scaling.type", "yarn"); gkv_f32(&b, "llama.rope.scaling.factor", 4.0f);
        gkv_u32(&b, "llama.rope.scaling.original_context_length", 64);
    }
    bool ok = gguf_finish(&b, T, nt, path);
    for (int i = 0; i < nown; i++) free(own_list[i]);
    st_free(&s);
    return ok;
}

/* ---- the tiny GPT-2 as a GGUF file (llama.cpp's gpt2 layout) -------------------------
 * The llm.c weights as they are ([out, in] rows): token_embd (the first V of
 * the padded Vp rows), position_embd, per layer attn_norm, attn_qkv,
 * attn_output, ffn_norm, ffn_up, ffn_down with their biases, output_norm;
 * no output.weight (tied) and no tokenizer. ln_eps sets the epsilon key (0:
 * leave it out). */
static bool write_gpt2_gguf(const gpt2_w *w, const char *path, float ln_eps) {
    const int C = G_C, L = G_L, F = 4 * G_C;
    gguf_t T[8 + 12 * G_L];
    int nt = 0;
#define T1(nm, d, n) do { snprintf(T[nt].name, 64, "%s", nm); T[nt].ne0 = (n); T[nt].ne1 = 0; T[nt].data = (d); nt++; } while (0)
#define T2(nm, d, in, out) do { snprintf(T[nt].name, 64, "%s", nm); T[nt].ne0 = (in); T[nt].ne1 = (out); T[nt].data = (d); nt++; } while (0)
    T2("token_embd.weight", w->p[KN_GPT2_WTE], C, G_V);
    T2("position_embd.weight", w->p[KN_GPT2_WPE], C, G_T);
    T1("output_norm.weight", w->p[KN_GPT2_LNFW], C);
    T1("output_norm.bias", w->p[KN_GPT2_LNFB], C);
    char n[64];
    for (int l = 0; l < L; l++) {
        snprintf(n, sizeof n, "blk.%d.attn_norm.weight", l); T1(n, w->p[KN_GPT2_LN1W] + l * C, C);
        snprintf(n, sizeof n, "blk.%d.attn_norm.bias", l); T1(n, w->p[KN_GPT2_LN1B] + l * C, C);
        snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", l); T2(n, w->p[KN_GPT2_QKVW] + (size_t)l * 3 * C * C, C, 3 * C);
        snprintf(n, sizeof n, "blk.%d.attn_qkv.bias", l); T1(n, w->p[KN_GPT2_QKVB] + l * 3 * C, 3 * C);
        snprintf(n, sizeof n, "blk.%d.attn_output.weight", l); T2(n, w->p[KN_GPT2_ATTPROJW] + (size_t)l * C * C, C, C);
        snprintf(n, sizeof n, "blk.%d.attn_output.bias", l); T1(n, w->p[KN_GPT2_ATTPROJB] + l * C, C);
        snprintf(n, sizeof n, "blk.%d.ffn_norm.weight", l); T1(n, w->p[KN_GPT2_LN2W] + l * C, C);
        snprintf(n, sizeof n, "blk.%d.ffn_norm.bias", l); T1(n, w->p[KN_GPT2_LN2B] + l * C, C);
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l); T2(n, w->p[KN_GPT2_FCW] + (size_t)l * F * C, C, F);
        snprintf(n, sizeof n, "blk.%d.ffn_up.bias", l); T1(n, w->p[KN_GPT2_FCB] + l * F, F);
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l); T2(n, w->p[KN_GPT2_FCPROJW] + (size_t)l * C * F, F, C);
        snprintf(n, sizeof n, "blk.%d.ffn_down.bias", l); T1(n, w->p[KN_GPT2_FCPROJB] + l * C, C);
    }
#undef T1
#undef T2
    bb b = {0};
    bb_put(&b, "GGUF", 4); bb_u32(&b, 3); bb_u64(&b, (uint64_t)nt);
    bb_u64(&b, ln_eps > 0 ? 7 : 6);
    gkv_str(&b, "general.architecture", "gpt2");
    gkv_u32(&b, "gpt2.block_count", L); gkv_u32(&b, "gpt2.context_length", G_T);
    gkv_u32(&b, "gpt2.embedding_length", C); gkv_u32(&b, "gpt2.feed_forward_length", F);
    gkv_u32(&b, "gpt2.attention.head_count", G_NH);
    if (ln_eps > 0) gkv_f32(&b, "gpt2.attention.layer_norm_epsilon", ln_eps);
    return gguf_finish(&b, T, nt, path);
}
/* GGUF gpt2 against the same PyTorch reference as the llm.c checkpoint */
TEST(gpt2_gguf_matches_pytorch) {
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/gpt2_tiny.ref", &r), "tests/fixtures/gpt2_tiny.ref unreadable (scripts/gpt2_ref.py)");
    gpt2_w w;
    gpt2_make(&w, G_V, G_VP, G_L);
    const char *p = tmp_path("gpt2.gguf");
    REQUIRE(write_gpt2_gguf(&w, p, 1e-5f), "cannot write %s", p);
    kn_model *m = load(p, NULL);
    REQUIRE(m, "%s", kn_last_error());
    const kn_model_config *c = kn_model_get_config(m);
    CHECK(c->arch == KN_ARCH_GPT2 && c->n_layers == 2 && c->dim == 32 && c->n_vocab == 64 && c->n_ctx_train == 16 &&
          c->ffn_dim == 128 && c->tied_output, "config");
    CHECK(kn_model_tokenizer(m) == NULL, "no tokenizer in this file");
    check_model("gguf gpt2 f32", m, &r, 1e-5, 0);
    kn_model_free(m);
    kn_model_opts o = {.n_batch = 3};                 /* prefill in chunks through the KV cache */
    REQUIRE((m = load(p, &o)), "%s", kn_last_error());
    check_model("gguf gpt2 f32 n_batch 3", m, &r, 1e-5, 0);
    kn_model_free(m);
    /* a missing tensor is named */
    FILE *f = fopen(p, "r+b");
    REQUIRE(f, "reopen");
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, f);
    char *at = memmem(buf, got, "blk.1.ffn_up.bias", 17);
    REQUIRE(at, "tensor name in the header");
    memcpy(at, "blk.1.ffn_up.bixs", 17);
    fseek(f, 0, SEEK_SET); fwrite(buf, 1, got, f); fclose(f);
    CHECK(!load(p, NULL) && strstr(kn_last_error(), "blk.1.ffn_up.bias"), "missing tensor: %s", kn_last_error());
    gpt2_free(&w);
    free_ref(&r);
    unlink(p);
}

/* The Llama 3 and YaRN references through GGUF files: rope_freqs.weight and
 * the yarn metadata keys, Q/K permuted for interleaved rotation. */
TEST(llama_gguf_rope_scaling_match_pytorch) {
    static const struct { const char *ref, *rope; } C[] = {
        {"tests/fixtures/gpt2_hfllama_llama3.ref", "llama3"}, {"tests/fixtures/gpt2_hfllama_yarn.ref", "yarn"}};
    const char *path = tmp_path("tiny_llama.gguf");
    for (int i = 0; i < 2; i++) {
        ref_file r = {0};
        REQUIRE(read_ref(C[i].ref, &r), "%s unreadable", C[i].ref);
        REQUIRE(write_llama_gguf(path, C[i].rope, true), "cannot write %s", path);
        kn_model *m = load(path, NULL);
        REQUIRE(m, "%s", kn_last_error());
        CHECK(!strcmp(kn_model_get_config(m)->rope_scaling, C[i].rope) && !kn_model_get_config(m)->rope_neox,
              "config: rope_scaling '%s'", kn_model_get_config(m)->rope_scaling);
        char what[64];
        snprintf(what, sizeof what, "GGUF Llama rope %s", C[i].rope);
        check_model(what, m, &r, 1e-5, 0);
        kn_model_free(m);
        free_ref(&r);
    }
    unlink(path);
}

/* A Llama GGUF without a vocabulary (what `kiln quantize` writes from a
 * Hugging Face directory without tokenizer.json) loads and evaluates ids
 * as the same file with one does; generating text asks for a tokenizer */
TEST(llama_gguf_without_vocabulary_evaluates_ids) {
    const char *with = tmp_path("tiny_llama_vocab.gguf");
    char without[256];
    snprintf(without, sizeof without, "%s", tmp_path("tiny_llama_novocab.gguf"));
    REQUIRE(write_llama_gguf(with, "llama3", true) && write_llama_gguf(without, "llama3", false), "cannot write the files");
    kn_model *m[2] = {load(with, NULL), load(without, NULL)};
    REQUIRE(m[0] && m[1], "loads: %s", kn_last_error());
    CHECK(kn_model_tokenizer(m[0]) && !kn_model_tokenizer(m[1]), "the vocabulary-less file has no tokenizer");
    int V = kn_model_get_config(m[0])->n_vocab;
    int32_t ids[5] = {1, 7, 3, 9, 4};
    float *lg[2] = {malloc(sizeof(float) * (size_t)V), malloc(sizeof(float) * (size_t)V)};
    for (int h = 0; h < 2; h++) CHECK(lg[h] && kn_model_eval(m[h], ids, 5, 0, lg[h], false) == KN_OK, "eval: %s", kn_last_error());
    CHECK(lg[0] && lg[1] && !memcmp(lg[0], lg[1], sizeof(float) * (size_t)V), "logits differ with and without the vocabulary");
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 4;
    CHECK(kn_generate(m[1], "hello", &gp, NULL, NULL, NULL) == KN_ERR_STATE && strstr(kn_last_error(), "tokenizer"),
          "generate without a tokenizer: %s", kn_last_error());
    free(lg[0]); free(lg[1]);
    kn_model_free(m[0]); kn_model_free(m[1]);
    unlink(with); unlink(without);
}

/* the shared classifier is the embedding: counted once (dim 64, hidden 172,
 * 5 layers, 4 of 8 heads for k/v, vocabulary 512: 260,032 weights) */
TEST(llama2c_shared_classifier_counted_once) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tok = kn_asset("llama2c/tok512.bin");
    if (!model || !tok) SKIP("stories260K.bin or tok512.bin missing under KN_ASSETS");
    kn_model *m = load(model, &(kn_model_opts){.tokenizer_path = tok});
    REQUIRE(m, "%s", kn_last_error());
    int64_t per_layer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 172 * 64, want = 512 * 64 + 5 * per_layer + 64;
    CHECK(kn_model_get_config(m)->n_params == want, "%lld parameters, want %lld", (long long)kn_model_get_config(m)->n_params,
          (long long)want);
    kn_model_free(m);
}

TEST(f16_kv_cache_same_greedy_stories260k) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tok = kn_asset("llama2c/tok512.bin");
    if (!model || !tok) SKIP("stories260K.bin or tok512.bin missing under KN_ASSETS");
    int32_t out[2][48];
    double maxdiff = 0;
    float first[2][512];
    for (int k = 0; k < 2; k++) {
        kn_model_opts o = {.tokenizer_path = tok, .kv_f16 = k == 1};
        kn_model *m = load(model, &o);
        REQUIRE(m, "%s", kn_last_error());
        int32_t seq[64] = {1, 403, 407, 261, 378};    /* BOS "Once upon a time" */
        int n;
        REQUIRE(kn_tokenize(kn_model_tokenizer(m), "Once upon a time", 16, true, false, seq, 64, &n) == KN_OK, "%s", kn_last_error());
        float lg[512];
        REQUIRE(kn_model_eval(m, seq, n, 0, lg, false) == KN_OK, "%s", kn_last_error());
        for (int g = 0; g < 40; g++) {
            int best = 0;
            for (int v = 1; v < 512; v++) if (lg[v] > lg[best]) best = v;
            out[k][g] = best;
            if (g == 20) memcpy(first[k], lg, sizeof lg);
            seq[n] = best;
            REQUIRE(kn_model_eval(m, &seq[n], 1, n, lg, false) == KN_OK, "%s", kn_last_error());
            n++;
        }
        kn_model_free(m);
    }
    int same = 0;
    while (same < 40 && out[0][same] == out[1][same]) same++;
    for (int v = 0; v < 512; v++) maxdiff = fmax(maxdiff, fabs(first[0][v] - first[1][v]));
    CHECK(same == 40, "f16 KV cache: greedy agrees for %d of 40 tokens", same);
    /* the f16 cache must really be in use: logits differ a little, not at all or a lot */
    CHECK(maxdiff > 0 && maxdiff < 0.05, "f16 vs f32 cache logits max diff %.3g", maxdiff);
}

TEST(tokenizer_files) {
    const char *vocab = kn_asset("gguf/ggml-vocab-gpt-2.gguf"), *llmc_tok = kn_asset("gpt2/gpt2_tokenizer.bin");
    if (!vocab || !llmc_tok) SKIP("ggml-vocab-gpt-2.gguf or gpt2_tokenizer.bin missing under KN_ASSETS");
    /* a GPT-2 sized vocabulary (V 50257), one layer */
    gpt2_w w;
    gpt2_make(&w, 50257, 50304, 1);
    const char *p = tmp_path("gpt2_big.bin");
    REQUIRE(write_llmc(&w, p, KN_F32), "%s", kn_last_error());
    gpt2_free(&w);
    kn_model_opts o = {.tokenizer_path = vocab};
    kn_model *m = load(p, &o);
    REQUIRE(m, "%s", kn_last_error());
    REQUIRE(kn_model_tokenizer(m) != NULL, "tokenizer loaded");
    int32_t ids[8]; int n;
    REQUIRE(kn_tokenize(kn_model_tokenizer(m), "Hello world", 11, false, false, ids, 8, &n) == KN_OK, "%s", kn_last_error());
    CHECK(n == 2 && ids[0] == 15496 && ids[1] == 995, "GPT-2 ids of 'Hello world': n %d, %d %d", n, ids[0], ids[1]);
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 4; gp.sampling.temp = 0;
    kn_generate_stats gs;
    CHECK(kn_generate(m, "Hello world", &gp, NULL, NULL, &gs) == KN_OK && gs.n_prompt == 2 && gs.n_generated >= 1,
          "generate: %s (prompt %d, generated %d)", kn_last_error(), gs.n_prompt, gs.n_generated);
    kn_model_free(m);
    /* llm.c's tokenizer decodes but cannot encode: a clear error */
    o.tokenizer_path = llmc_tok;
    REQUIRE((m = load(p, &o)), "%s", kn_last_error());
    CHECK(kn_tokenizer_get_kind(kn_model_tokenizer(m)) == KN_TOKENIZER_DECODE_ONLY, "decode-only kind");
    size_t len;
    const char *piece = kn_token_to_piece(kn_model_tokenizer(m), 15496, false, &len);
    CHECK(piece && len == 5 && !memcmp(piece, "Hello", 5), "decode 15496");
    CHECK(kn_generate(m, "Hello", &gp, NULL, NULL, NULL) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "decode") &&
          strstr(kn_last_error(), "gguf"), "encode with gpt2_tokenizer.bin: %s", kn_last_error());
    kn_model_free(m);
    unlink(p);
    /* a tokenizer larger than the model's vocabulary is refused */
    gpt2_make(&w, G_V, G_VP, G_L);
    p = tmp_path("gpt2_small.bin");
    REQUIRE(write_llmc(&w, p, KN_F32), "%s", kn_last_error());
    gpt2_free(&w);
    o.tokenizer_path = vocab;
    CHECK(!load(p, &o) && strstr(kn_last_error(), "50257") && strstr(kn_last_error(), vocab), "vocab mismatch: %s", kn_last_error());
    unlink(p);
}

static char *info_of(const char *path, kn_status *st) {
    FILE *f = tmpfile();
    *st = kn_model_print_info(path, f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)n + 1);
    rewind(f);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

TEST(info_and_load_errors) {
    gpt2_w w;
    gpt2_make(&w, G_V, G_VP, G_L);
    const char *p = tmp_path("gpt2_info.bin");
    REQUIRE(write_llmc(&w, p, KN_BF16), "%s", kn_last_error());
    kn_status st;
    char *s = info_of(p, &st);
    CHECK(st == KN_OK && strstr(s, "llm.c GPT-2") && strstr(s, "bf16") && strstr(s, "qkvw") && strstr(s, "padded 80"),
          "llm.c info: %s", s);
    free(s);
    /* a truncated llm.c file: the error names the file */
    FILE *f = fopen(p, "r+b");
    REQUIRE(f && ftruncate(fileno(f), 4096) == 0, "truncate");
    fclose(f);
    kn_model *m;
    CHECK(kn_model_load(p, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), p), "truncated llm.c: %s", kn_last_error());
    unlink(p);

    const char *dir = tmp_path("hf_err");
    mkdir(dir, 0755);
    char stp[300], cfg[300];
    snprintf(stp, sizeof stp, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    st_set ss = {0};
    gpt2_hf_set(&w, &ss, "transformer.");
    REQUIRE(st_write(&ss, stp, KN_F32), "%s", kn_last_error());
    st_free(&ss);
    /* missing config.json */
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_IO && strstr(kn_last_error(), cfg) && strstr(kn_last_error(), "config.json"),
          "missing config: %s", kn_last_error());
    CHECK(kn_model_load(stp, NULL, &m) == KN_ERR_IO && strstr(kn_last_error(), cfg), "missing config (file path): %s", kn_last_error());
    write_text(cfg, gpt2_config);
    s = info_of(dir, &st);
    CHECK(st == KN_OK && strstr(s, "GPT2LMHeadModel") && strstr(s, "transformer.h.1.attn.c_attn.weight") && strstr(s, "n_embd"),
          "HF info: %s", s);
    free(s);
    /* config and tensors disagree: names the file and the tensor */
    write_text(cfg, "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 4, "
                    "\"n_positions\": 16, \"vocab_size\": 64, \"n_inner\": 96}");
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), stp) &&
          strstr(kn_last_error(), "transformer.h.0.mlp.c_fc.weight") && strstr(kn_last_error(), "[32, 128]") &&
          strstr(kn_last_error(), "[32, 96]"), "shape mismatch: %s", kn_last_error());
    /* more layers than tensors */
    write_text(cfg, "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 32, \"n_layer\": 3, \"n_head\": 4, "
                    "\"n_positions\": 16, \"vocab_size\": 64}");
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "transformer.h.2.ln_1.weight"),
          "missing tensor: %s", kn_last_error());
    /* unknown architecture */
    write_text(cfg, "{\"architectures\": [\"MambaForCausalLM\"], \"hidden_size\": 32}");
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "MambaForCausalLM") &&
          strstr(kn_last_error(), cfg), "unknown arch: %s", kn_last_error());
    /* Llama config over GPT-2 tensors */
    write_llama_config(dir, "LlamaForCausalLM", LL_F);
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "model.embed_tokens.weight"),
          "wrong architecture's tensors: %s", kn_last_error());
    /* a Llama config/tensor mismatch */
    llama_hf_set(&ss);
    REQUIRE(st_write(&ss, stp, KN_F32), "%s", kn_last_error());
    st_free(&ss);
    write_llama_config(dir, "LlamaForCausalLM", 48);
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "model.layers.0.mlp.gate_proj.weight") &&
          strstr(kn_last_error(), "[64, 32]") && strstr(kn_last_error(), "[48, 32]"), "llama mismatch: %s", kn_last_error());
    /* unsupported rope scaling */
    write_text(cfg, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 64, "
                    "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 8.0}}");
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "longrope"), "rope scaling: %s", kn_last_error());
    /* a config that is not JSON */
    write_text(cfg, "{\"architectures\": [\"LlamaForCausalLM\"");
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), cfg), "bad json: %s", kn_last_error());
    /* a directory without weights */
    unlink(stp);
    CHECK(kn_model_load(dir, NULL, &m) == KN_ERR_IO && strstr(kn_last_error(), "model.safetensors"), "no weights: %s", kn_last_error());
    unlink(cfg); rmdir(dir);
    gpt2_free(&w);
    rmdir(g_dir);
}

KN_TEST_MAIN()
