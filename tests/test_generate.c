/* test_generate.c: the generation loop's parameters (kn_generate_params):
 * stop strings that are empty or missing are refused, and the prefill
 * progress callback reports every chunk, changes nothing in the result, and
 * cancels. Uses llama2.c's stories260K (tiny, fast) from KN_ASSETS. */
#include "kn_test.h"
#include "kiln_llm.h"

static kn_model *load_stories(int n_batch) {
    const char *model = kn_asset("llama2c/stories260K.bin"), *tok = kn_asset("llama2c/tok512.bin");
    if (!model || !tok) return NULL;
    kn_model_opts o = {.tokenizer_path = tok, .n_batch = n_batch};
    kn_model *m = NULL;
    if (kn_model_load(model, &o, &m) != KN_OK) return NULL;
    return m;
}

static bool collect(void *ud, int32_t t, const char *s, size_t l) {
    char *out = ud;
    size_t n = strlen(out);
    if (n + l < 4000) { memcpy(out + n, s, l); out[n + l] = 0; }
    return true;
}

static int g_calls;
static bool count_calls(void *ud, int32_t t, const char *s, size_t l) { g_calls++; return true; }

TEST(generate_rejects_empty_stop_string) {
    kn_model *m = load_stories(0);
    if (!m) SKIP("llama2c/stories260K.bin or tok512.bin missing under KN_ASSETS (or it did not load)");
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 8;
    gp.sampling.temp = 0;
    const char *stops[2] = {"Lily", ""};
    gp.stop = stops; gp.n_stop = 2;
    g_calls = 0;
    /* before the fix: an unsigned underflow read far past the text (SIGSEGV) */
    CHECK(kn_generate(m, "Once upon a time", &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "empty stop string accepted");
    CHECK(strstr(kn_last_error(), "empty") != NULL, "message: %s", kn_last_error());
    CHECK(g_calls == 0, "the callback ran %d times", g_calls);
    int32_t ids[2] = {1, 403};
    CHECK(kn_generate_tokens(m, ids, 2, &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "tokens: empty stop string accepted");
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;
    CHECK(kn_generate(m, "Once upon a time", &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "reuse: empty stop string accepted");
    gp.reuse = NULL;
    const char *null_stop[1] = {NULL};
    gp.stop = null_stop; gp.n_stop = 1;
    CHECK(kn_generate(m, "Once upon a time", &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "NULL stop string accepted");
    gp.stop = NULL; gp.n_stop = 1;
    CHECK(kn_generate(m, "Once upon a time", &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "NULL stop array accepted");
    gp.n_stop = -1;
    CHECK(kn_generate(m, "Once upon a time", &gp, count_calls, NULL, NULL) == KN_ERR_INVALID, "n_stop -1 accepted");
    /* a one-character stop string still works (the hold-back scan at length 1) */
    const char *dot[1] = {"."};
    gp.stop = dot; gp.n_stop = 1; gp.max_tokens = 60;
    char out[4096] = "";
    CHECK(kn_generate(m, "Once upon a time", &gp, collect, out, NULL) == KN_OK, "%s", kn_last_error());
    CHECK(out[0] && !strchr(out, '.'), "one-character stop: '%s'", out);
    CHECK(g_calls == 0, "the callback ran %d times", g_calls);
    kn_kv_tokens_free(&kv);
    kn_model_free(m);
}

typedef struct { int calls, last_done, total, cancel_after; bool monotonic; } progress_log;
static bool on_progress(void *ud, int done, int total) {
    progress_log *p = ud;
    if (p->calls == 0 && done != 0) p->monotonic = false;
    if (done < p->last_done || done > total) p->monotonic = false;
    p->last_done = done; p->total = total;
    p->calls++;
    return p->cancel_after <= 0 || p->calls < p->cancel_after;
}

TEST(generate_prefill_progress_and_cancel) {
    kn_model *m = load_stories(4);       /* 4-token chunks: a 22-token prompt takes 6 */
    if (!m) SKIP("llama2c/stories260K.bin or tok512.bin missing under KN_ASSETS (or it did not load)");
    const char *prompt = "Once upon a time there was a little dog who liked to run in the park";
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 30;
    gp.sampling.temp = 0;
    char plain[4096] = "", reported[4096] = "";
    kn_generate_stats s0, s1;
    REQUIRE(kn_generate(m, prompt, &gp, collect, plain, &s0) == KN_OK, "%s", kn_last_error());
    progress_log log = {.monotonic = true};
    gp.progress = on_progress; gp.progress_ud = &log;
    REQUIRE(kn_generate(m, prompt, &gp, collect, reported, &s1) == KN_OK, "%s", kn_last_error());
    int n = s0.n_prompt, chunks = (n + 3) / 4;
    CHECK(n > 8, "prompt of %d tokens", n);
    CHECK(log.calls == chunks + 1, "%d calls for %d chunks (+1 at the start)", log.calls, chunks);
    CHECK(log.monotonic && log.last_done == n && log.total == n, "done %d of %d", log.last_done, log.total);
    CHECK(!strcmp(plain, reported), "chunked prefill changed the text:\n'%s'\n'%s'", plain, reported);
    CHECK(!s1.cancelled && s1.n_generated == 30, "cancelled %d, generated %d", s1.cancelled, s1.n_generated);

    /* cancel after the second chunk: nothing generated, KN_OK, the cache
     * holds the evaluated chunks */
    progress_log c = {.monotonic = true, .cancel_after = 3};
    gp.progress_ud = &c;
    g_calls = 0;
    kn_generate_stats s2;
    CHECK(kn_generate(m, prompt, &gp, count_calls, NULL, &s2) == KN_OK, "%s", kn_last_error());
    CHECK(s2.cancelled && s2.n_generated == 0 && g_calls == 0, "cancelled %d, generated %d, callbacks %d",
          s2.cancelled, s2.n_generated, g_calls);
    CHECK(s2.n_prompt == 8 && s2.n_past_end == 8, "evaluated %d, cache %d", s2.n_prompt, s2.n_past_end);
    /* cancelled before anything is evaluated */
    progress_log c0 = {.monotonic = true, .cancel_after = 1};
    gp.progress_ud = &c0;
    CHECK(kn_generate(m, prompt, &gp, count_calls, NULL, &s2) == KN_OK && s2.cancelled && s2.n_prompt == 0,
          "cancel at 0: %s", kn_last_error());

    /* with KV reuse, a cancelled turn leaves a record of what was evaluated,
     * and the next turn evaluates only the rest */
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;
    progress_log c1 = {.monotonic = true, .cancel_after = 3};
    gp.progress_ud = &c1;
    CHECK(kn_generate(m, prompt, &gp, count_calls, NULL, &s2) == KN_OK && s2.cancelled, "%s", kn_last_error());
    CHECK(kv.n == 8, "kv record %d after a cancelled turn", kv.n);
    progress_log c2 = {.monotonic = true};
    gp.progress_ud = &c2;
    char again[4096] = "";
    CHECK(kn_generate(m, prompt, &gp, collect, again, &s2) == KN_OK, "%s", kn_last_error());
    CHECK(s2.n_prompt == n - 8 && c2.total == n - 8, "evaluated %d (expected %d)", s2.n_prompt, n - 8);
    CHECK(!strcmp(plain, again), "resumed prefill changed the text:\n'%s'\n'%s'", plain, again);
    kn_kv_tokens_free(&kv);
    kn_model_free(m);
}

KN_TEST_MAIN()
