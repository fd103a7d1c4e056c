/* test_llm.c: end-to-end LLM inference against an independent PyTorch
 * reference (scripts/llm_ref.py writes the fixtures in tests/fixtures/):
 * logits of the prompt's last positions within tolerance and greedy tokens
 * identical; plus loader errors, sampler behaviour and the plan's reuse. */
#include "kn_test.h"
#include "kiln_llm.h"
#include <math.h>

typedef struct { int n_prompt, n_gen, rows; int32_t *prompt, *gen; float *logits; } ref_case;
typedef struct { int n, V; ref_case c[16]; } ref_file;

static bool read_ref(const char *path, ref_file *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4]; uint32_t h[3];
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "KNLR", 4) && fread(h, 4, 3, f) == 3 && h[0] == 1 && h[1] <= 16;
    if (ok) { r->n = (int)h[1]; r->V = (int)h[2]; }
    for (int i = 0; ok && i < r->n; i++) {
        uint32_t k[3];
        ref_case *c = &r->c[i];
        ok = fread(k, 4, 3, f) == 3;
        if (!ok) break;
        c->n_prompt = (int)k[0]; c->n_gen = (int)k[1]; c->rows = (int)k[2];
        c->prompt = malloc(4 * (size_t)c->n_prompt); c->gen = malloc(4 * (size_t)c->n_gen + 4);
        c->logits = malloc(4 * (size_t)c->rows * (size_t)r->V);
        ok = fread(c->prompt, 4, (size_t)c->n_prompt, f) == (size_t)c->n_prompt &&
             fread(c->gen, 4, (size_t)c->n_gen, f) == (size_t)c->n_gen &&
             fread(c->logits, 4, (size_t)c->rows * (size_t)r->V, f) == (size_t)c->rows * (size_t)r->V;
    }
    fclose(f);
    return ok;
}
static void free_ref(ref_file *r) {
    for (int i = 0; i < r->n; i++) { free(r->c[i].prompt); free(r->c[i].gen); free(r->c[i].logits); }
}

/* logits of the last rows of each prompt within tol (relative L2 per row), greedy identical */
static void check_model(kn_model *m, const ref_file *r, double tol, int min_greedy) {
    int V = r->V;
    REQUIRE(kn_model_get_config(m)->n_vocab == V, "vocab %d vs %d", kn_model_get_config(m)->n_vocab, V);
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *lg = malloc(sizeof(float) * (size_t)c->n_prompt * V);
        REQUIRE(kn_model_eval(m, c->prompt, c->n_prompt, 0, lg, true) == KN_OK, "%s", kn_last_error());
        for (int k = 0; k < c->rows; k++) {
            const float *a = lg + (size_t)(c->n_prompt - c->rows + k) * V, *b = c->logits + (size_t)k * V;
            double num = 0, den = 0;
            for (int v = 0; v < V; v++) { num += (a[v] - b[v]) * (a[v] - b[v]); den += b[v] * b[v]; }
            double e = sqrt(num / den);
            CHECK(e < tol, "case %d row %d: logits rel err %.3g (tol %.3g)", i, k, e, tol);
        }
        free(lg);
        kn_generate_params gp = kn_generate_defaults();
        gp.sampling.temp = 0;
        gp.max_tokens = c->n_gen;
        int32_t got[64]; int n = 0;
        float *l1 = malloc(sizeof(float) * (size_t)V);
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)(c->n_prompt + c->n_gen));
        memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
        int np = c->n_prompt;
        REQUIRE(kn_model_eval(m, seq, np, 0, l1, false) == KN_OK, "%s", kn_last_error());
        for (int g = 0; g < c->n_gen; g++) {
            int best = 0;
            for (int v = 1; v < V; v++) if (l1[v] > l1[best]) best = v;
            got[n++] = best;
            seq[np] = best;
            REQUIRE(kn_model_eval(m, &seq[np], 1, np, l1, false) == KN_OK, "%s", kn_last_error());
            np++;
        }
        int same = 0;
        while (same < n && got[same] == c->gen[same]) same++;
        CHECK(same >= (min_greedy < c->n_gen ? min_greedy : c->n_gen), "case %d: greedy agrees for %d of %d tokens (first diff: %d vs %d)",
              i, same, c->n_gen, same < n ? got[same] : -1, same < n ? c->gen[same] : -1);
        free(l1); free(seq);
    }
}

TEST(stories260k_matches_pytorch) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tok = kn_asset("llama2c/tok512.bin");
    if (!model || !tok) SKIP("stories260K.bin or tok512.bin missing under KN_ASSETS");
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/stories260K.ref", &r), "tests/fixtures/stories260K.ref unreadable");
    kn_model_opts o = {.tokenizer_path = tok};
    kn_model *m;
    REQUIRE(kn_model_load(model, &o, &m) == KN_OK, "%s", kn_last_error());
    check_model(m, &r, 1e-4, 1000);
    kn_model_free(m);
    free_ref(&r);
}

TEST(smollm2_q4_1_matches_pytorch) {
    const char *model = getenv("KN_SMOLLM2");
    if (!model) model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(model, "rb");
    if (!f) SKIP("%s missing (run `make run` to fetch it)", model);
    fclose(f);
    ref_file r = {0};
    REQUIRE(read_ref("tests/fixtures/smollm2.ref", &r), "tests/fixtures/smollm2.ref unreadable");
    kn_model *m;
    REQUIRE(kn_model_load(model, NULL, &m) == KN_OK, "%s", kn_last_error());
    /* activations are quantized to 8 bits for the Q4_1 dot products, the
     * reference computes in float64 from dequantized weights */
    check_model(m, &r, 2e-2, 32);
    kn_model_free(m);
    free_ref(&r);
}

KN_TEST_MAIN()
