/* test_perplexity.c: kn_model_perplexity (what `kiln perplexity` prints).
 *
 *  - against a plain float64 reference written here: each window evaluated
 *    whole with every position's logits, the log-softmax of the scored rows
 *    in long double, windows and scored tokens spelled out from llama.cpp's
 *    definition (stories260K, whose tokenizer adds BOS: the BOS replacement
 *    is checked too), default and strided;
 *  - against llama.cpp itself: tests/fixtures/ppl_smollm2*.txt hold the
 *    number scripts/ppl_llamacpp.py got from llama-cpp-python for SmolLM2 on
 *    the start of tinyshakespeare; kiln must be within 1%;
 *  - the refusals: too few tokens, a context that scores nothing, a bad stride.
 */
#include "kn_test.h"
#include "kiln_llm.h"

static kn_model *load(const char *model, const char *tok, int n_ctx) {
    kn_model_opts o = {.tokenizer_path = tok, .n_ctx = n_ctx};
    kn_model *m = NULL;
    return kn_model_load(model, &o, &m) == KN_OK ? m : NULL;
}

static int32_t *tokenize(const kn_model *m, const char *text, size_t len, int *n) {
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int32_t *ids = malloc(sizeof(int32_t) * (len + 8));
    if (!ids || kn_tokenize(tok, text, len, kn_tokenizer_add_bos(tok), false, ids, (int)len + 8, n)) { free(ids); return NULL; }
    return ids;
}

static char *read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    *len = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf) buf[*len] = 0;
    return buf;
}

/* the reference: whole windows, all logits, long double */
static double reference_ppl(kn_model *m, const int32_t *toks, int n, int stride, long *count) {
    int C = kn_model_n_ctx(m), V = kn_model_get_config(m)->n_vocab;
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    float *lg = malloc(sizeof(float) * (size_t)C * (size_t)V);
    int32_t *win = malloc(sizeof(int32_t) * (size_t)C);
    long double nll = 0;
    *count = 0;
    int n_win = stride ? (n - C + stride - 1) / stride : n / C;
    for (int w = 0; w < n_win; w++) {
        int start = stride ? w * stride : w * C;
        memcpy(win, toks + start, sizeof(int32_t) * (size_t)C);
        if (!stride && kn_tokenizer_add_bos(tok)) win[0] = kn_tokenizer_bos(tok);
        if (kn_model_eval(m, win, C, 0, lg, true)) { free(lg); free(win); return NAN; }
        int from = stride ? C - stride - 1 : C / 2;     /* the row predicting the first scored token */
        for (int j = from; j <= C - 2; j++) {
            const float *l = lg + (size_t)j * V;
            long double mx = l[0], se = 0;
            for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
            for (int v = 0; v < V; v++) se += expl((long double)l[v] - mx);
            nll += logl(se) + mx - (long double)l[win[j + 1]];
            (*count)++;
        }
    }
    free(lg); free(win);
    return (double)expl(nll / *count);
}

TEST(perplexity_matches_float64_reference) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tokp = kn_asset("llama2c/tok512.bin");
    const char *textp = kn_asset("datasets/tinystories/TinyStories-train.first2MiB.txt");
    if (!model || !tokp || !textp) SKIP("llama2c/stories260K.bin, tok512.bin or datasets/tinystories missing under KN_ASSETS");
    kn_model *m = load(model, tokp, 600);   /* 299 scored rows a window: two chunks of rows (256 + 43) */
    REQUIRE(m, "%s", kn_last_error());
    REQUIRE(kn_tokenizer_add_bos(kn_model_tokenizer(m)), "this test expects a tokenizer that adds BOS");
    size_t len;
    char *text = read_file(textp, 8000, &len);
    int n = 0;
    int32_t *toks = text ? tokenize(m, text, len, &n) : NULL;
    REQUIRE(toks && n > 1300, "tokenize: %s", kn_last_error());
    /* a few windows each: the reference evaluates whole windows */
    int strides[] = {0, 16, 300, 1}, lens[] = {n, 600 + 16 * 4, n, 603};
    for (int k = 0; k < 4; k++) {
        int S = strides[k], N = lens[k];
        long rc;
        double ref = reference_ppl(m, toks, N, S, &rc);
        kn_perplexity_params p = {.stride = S};
        kn_perplexity_result r;
        REQUIRE(kn_model_perplexity(m, toks, N, &p, &r) == KN_OK, "stride %d: %s", S, kn_last_error());
        CHECK(r.count == rc, "stride %d: scored %ld, reference %ld", S, r.count, rc);
        /* the same model, evaluated in other chunks: only float rounding apart */
        CHECK(fabs(r.ppl / ref - 1) < 1e-5, "stride %d: %.9f, reference %.9f", S, r.ppl, ref);
        CHECK(isfinite(r.ppl) && r.ppl > 1 && r.ppl < 512, "stride %d: %f", S, r.ppl);
    }
    /* the default windows score C/2 - 1 tokens each: 600 tokens -> 299 */
    kn_perplexity_result r;
    REQUIRE(kn_model_perplexity(m, toks, 600 * 2 + 10, NULL, &r) == KN_OK, "%s", kn_last_error());
    CHECK(r.n_windows == 2 && r.count == 2 * 299, "windows %d, scored %ld", r.n_windows, r.count);
    free(toks); free(text);
    kn_model_free(m);
}

static bool cancel_after_two(void *ud, int done, int total) { (void)ud; (void)total; return done < 2; }

TEST(perplexity_refuses_too_little) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tokp = kn_asset("llama2c/tok512.bin");
    if (!model || !tokp) SKIP("llama2c/stories260K.bin or tok512.bin missing under KN_ASSETS");
    kn_model *m = load(model, tokp, 32);
    REQUIRE(m, "%s", kn_last_error());
    int32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = (int32_t)(3 + (i * 37) % 500);
    kn_perplexity_result r;
    kn_perplexity_params p = {0};
    CHECK(kn_model_perplexity(m, toks, 0, &p, &r) == KN_ERR_INVALID, "no tokens");
    CHECK(kn_model_perplexity(m, toks, 1, &p, &r) == KN_ERR_INVALID, "one token");
    CHECK(kn_model_perplexity(m, toks, 31, &p, &r) == KN_ERR_INVALID && strstr(kn_last_error(), "31 tokens"),
          "31 tokens: %s", kn_last_error());
    CHECK(kn_model_perplexity(m, toks, 32, &p, &r) == KN_OK && r.count == 15, "one window: %s", kn_last_error());
    p.stride = 8;
    CHECK(kn_model_perplexity(m, toks, 32, &p, &r) == KN_ERR_INVALID, "strided, one window's worth");
    CHECK(kn_model_perplexity(m, toks, 33, &p, &r) == KN_OK && r.count == 8 && r.n_windows == 1, "strided, 33 tokens");
    p.stride = 32;
    CHECK(kn_model_perplexity(m, toks, 200, &p, &r) == KN_ERR_INVALID, "stride = context");
    p.stride = -1;
    CHECK(kn_model_perplexity(m, toks, 200, &p, &r) == KN_ERR_INVALID, "stride -1");
    p = (kn_perplexity_params){.progress = cancel_after_two};
    CHECK(kn_model_perplexity(m, toks, 200, &p, &r) == KN_OK && r.cancelled && r.n_windows == 2, "cancel: %d windows", r.n_windows);
    kn_model_free(m);
    for (int C = 1; C <= 2; C++) {     /* a context of 1 or 2 scores nothing */
        kn_model *m2 = load(model, tokp, C);
        if (!m2) continue;             /* refused at load: fine too */
        CHECK(kn_model_perplexity(m2, toks, 200, NULL, &r) == KN_ERR_INVALID, "context %d", C);
        kn_model_free(m2);
    }
}

/* "key value" lines of a fixture written by scripts/ppl_llamacpp.py */
static bool fixture_get(const char *path, const char *key, char *val, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    size_t kl = strlen(key);
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ') {
            snprintf(val, cap, "%s", line + kl + 1);
            val[strcspn(val, "\n")] = 0;
            found = true;
        }
    fclose(f);
    return found;
}

static void check_llamacpp_fixture(const char *fixture) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *textp = kn_asset("datasets/tinyshakespeare/input.txt");
    FILE *probe = fopen(model, "rb");
    if (!probe) SKIP("%s missing (sh scripts/fetch_model.sh)", model);
    fclose(probe);
    if (!textp) SKIP("datasets/tinyshakespeare/input.txt missing under KN_ASSETS");
    char v[128];
    REQUIRE(fixture_get(fixture, "perplexity", v, sizeof v), "%s unreadable", fixture);
    double want = atof(v);
    REQUIRE(fixture_get(fixture, "bytes", v, sizeof v), "bytes");
    size_t bytes = (size_t)atol(v);
    REQUIRE(fixture_get(fixture, "ctx", v, sizeof v), "ctx");
    int C = atoi(v);
    REQUIRE(fixture_get(fixture, "stride", v, sizeof v), "stride");
    int S = atoi(v);
    REQUIRE(fixture_get(fixture, "tokens", v, sizeof v), "tokens");
    int want_tokens = atoi(v);
    REQUIRE(fixture_get(fixture, "scored", v, sizeof v), "scored");
    long want_scored = atol(v);
    kn_model *m = load(model, NULL, C);
    REQUIRE(m, "%s", kn_last_error());
    size_t len;
    char *text = read_file(textp, bytes, &len);
    int n = 0;
    int32_t *toks = text ? tokenize(m, text, len, &n) : NULL;
    REQUIRE(toks, "tokenize: %s", kn_last_error());
    CHECK(n == want_tokens, "%d tokens, llama.cpp %d", n, want_tokens);
    kn_perplexity_params p = {.stride = S};
    kn_perplexity_result r;
    REQUIRE(kn_model_perplexity(m, toks, n, &p, &r) == KN_OK, "%s", kn_last_error());
    CHECK(r.count == want_scored, "scored %ld, llama.cpp %ld", r.count, want_scored);
    CHECK(fabs(r.ppl / want - 1) < 0.01, "kiln %.4f, llama.cpp %.4f (%.2f%% apart)", r.ppl, want, 100 * fabs(r.ppl / want - 1));
    printf("  %s: kiln %.4f, llama.cpp %.4f (%.3f%%)\n", fixture, r.ppl, want, 100 * (r.ppl / want - 1));
    free(toks); free(text);
    kn_model_free(m);
}

TEST(perplexity_matches_llamacpp_default) { check_llamacpp_fixture("tests/fixtures/ppl_smollm2.txt"); }
TEST(perplexity_matches_llamacpp_stride) { check_llamacpp_fixture("tests/fixtures/ppl_smollm2_stride.txt"); }

KN_TEST_MAIN()
