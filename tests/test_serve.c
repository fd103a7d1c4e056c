/* test_serve.c: the request layer of `kiln serve` without network or engine
 * (tools/serve/handler.c, api.c, jw.c, metrics.c): routing, auth, limits,
 * OpenAI request parsing and validation, error shapes, reply JSON. Every
 * reply body is parsed back with kn_json. The parsing tests tokenize with
 * SmolLM2's vocabulary (models/, or KN_SMOLLM2) or GPT-2's (assets), and are
 * skipped without both. The end-to-end tests with a model are
 * tests/test_serve_e2e.sh. */
#include "kn_test.h"
#include <ctype.h>
#include "serve/serve.h"
#include "formats/hfconfig.h"

static srv_metrics g_met;
static kn_tokenizer *g_tok;
static kn_chat_tmpl g_tmpl;

static void ctx_init(srv_ctx *c, const char *key) {
    memset(c, 0, sizeof *c);
    c->model_id = "test-model";
    c->tok = g_tok;
    c->tmpl = g_tok ? &g_tmpl : NULL;
    c->n_ctx_seq = 64;
    c->max_tokens_cap = 64;
    c->max_body = 4096;
    c->api_key = key;
    c->timeout_s = 10;
    c->n_parallel = 2;
    c->metrics = &g_met;
    atomic_init(&c->n_req, 0);
}

static bool load_tok(void) {
    if (g_tok) return true;
    const char *p = getenv("KN_SMOLLM2");
    if (!p) p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (kn_tokenizer_load_gguf(p, &g_tok) != KN_OK) {
        const char *a = kn_asset("gguf/ggml-vocab-gpt-2.gguf");
        if (!a || kn_tokenizer_load_gguf(a, &g_tok) != KN_OK) { g_tok = NULL; return false; }
    }
    kn_chat_template_from_name("chatml", &g_tmpl);
    return true;
}

/* the reply's body parsed; its error message when it is an error object */
static kn_json *parse_body(const srv_resp *r) {
    kn_json *j = NULL;
    if (kn_json_parse(r->body.p ? r->body.p : "", r->body.len, &j) != KN_OK) return NULL;
    return j;
}
static const char *err_msg(kn_json *j) {
    int64_t e = kn_json_get(j, 0, "error");
    return e >= 0 ? kn_json_get_str(j, e, "message") : NULL;
}

static void call(srv_ctx *c, const char *method, const char *path, const char *auth, const char *body, srv_resp *r) {
    srv_handle(c, method, path, auth, body, body ? strlen(body) : 0, false, r);
}

/* expects an OpenAI error with this status whose message contains `want` */
static void expect_error(srv_ctx *c, const char *method, const char *path, const char *auth, const char *body,
                         int status, const char *want) {
    srv_resp r;
    call(c, method, path, auth, body, &r);
    CHECK(r.status == status, "%s %s %.60s: status %d, want %d (%s)", method, path, body ? body : "", r.status, status,
          r.body.p ? r.body.p : "");
    CHECK(!r.job, "an error must not make a job");
    kn_json *j = parse_body(&r);
    CHECK(j, "the error body is not JSON: %s", r.body.p ? r.body.p : "");
    const char *m = j ? err_msg(j) : NULL;
    CHECK(m && strstr(m, want), "message '%s' lacks '%s'", m ? m : "(none)", want);
    if (j) {
        int64_t e = kn_json_get(j, 0, "error");
        CHECK(kn_json_get_str(j, e, "type") != NULL, "error.type missing");
    }
    kn_json_free(j);
    srv_resp_free(&r);
}

TEST(serve_auth_constant_time_compare) {
    CHECK(srv_auth_ok(NULL, NULL), "no key: open");
    CHECK(srv_auth_ok("k1", "Bearer k1"), "right key");
    CHECK(!srv_auth_ok("k1", NULL), "missing header");
    CHECK(!srv_auth_ok("k1", "Bearer k2"), "wrong key");
    CHECK(!srv_auth_ok("k1", "Bearer k1x"), "longer");
    CHECK(!srv_auth_ok("k1", "Bearer k"), "shorter");
    CHECK(!srv_auth_ok("k1", "bearer k1"), "scheme is case-sensitive here");
    CHECK(!srv_auth_ok("k1", ""), "empty");
    CHECK(!srv_auth_ok("", "Bearer"), "empty key needs 'Bearer '");
}

TEST(serve_routes_auth_and_methods) {
    srv_ctx c;
    ctx_init(&c, "secret");
    srv_resp r;
    call(&c, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200 || r.status == 503, "health without key: %d", r.status);
    srv_resp_free(&r);
    call(&c, "GET", "/", NULL, NULL, &r);
    CHECK(r.status == 200 && r.body.len == srv_page_html_len && strstr(r.ctype, "text/html"), "page: %d", r.status);
    srv_resp_free(&r);
    expect_error(&c, "GET", "/v1/models", NULL, NULL, 401, "API key");
    expect_error(&c, "GET", "/v1/models", "Bearer wrong", NULL, 401, "API key");
    expect_error(&c, "GET", "/metrics", NULL, NULL, 401, "API key");
    expect_error(&c, "POST", "/v1/completions", NULL, "{}", 401, "API key");
    call(&c, "GET", "/v1/models?x=1", "Bearer secret", NULL, &r);
    REQUIRE(r.status == 200, "models: %d %s", r.status, r.body.p);
    kn_json *j = parse_body(&r);
    REQUIRE(j, "models is not JSON");
    int64_t d = kn_json_get(j, 0, "data");
    CHECK(kn_json_count(j, d) == 1 && !strcmp(kn_json_get_str(j, kn_json_at(j, d, 0), "id"), "test-model"), "model id");
    kn_json_free(j);
    srv_resp_free(&r);
    expect_error(&c, "GET", "/v1/nothing", "Bearer secret", NULL, 404, "no such endpoint");
    expect_error(&c, "POST", "/v1/models", "Bearer secret", NULL, 405, "GET");
    expect_error(&c, "GET", "/v1/chat/completions", "Bearer secret", NULL, 405, "POST");
    expect_error(&c, "DELETE", "/health", NULL, NULL, 405, "GET");
    /* a body over the limit (http.c drops it and says so) */
    srv_handle(&c, "POST", "/v1/completions", "Bearer secret", NULL, 0, true, &r);
    CHECK(r.status == 413, "too big: %d", r.status);
    srv_resp_free(&r);
    call(&c, "GET", "/metrics", "Bearer secret", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body.p, "kiln_requests_total{endpoint=\"models\",status=\"4xx\"} 3") &&
          strstr(r.body.p, "kiln_slots_total") && strstr(r.body.p, "kiln_time_to_first_token_seconds_bucket"),
          "metrics text:\n%s", r.body.p);
    srv_resp_free(&r);
}

TEST(serve_json_writer_escapes) {
    sbuf sb = {0};
    jw w;
    jw_init(&w, &sb);
    const char raw[] = "q\"b\\n\n\t\x01\x1f" "\xff" "\xc3\xa9" "\xe2\x82" "z";
    jw_obj(&w);
    jw_key(&w, "s");
    jw_strn(&w, raw, sizeof raw - 1);
    jw_kint(&w, "i", -42);
    jw_knum(&w, "x", 1.0 / 0.0);
    jw_key(&w, "a");
    jw_arr(&w);
    jw_int(&w, 1);
    jw_bool(&w, true);
    jw_null(&w);
    jw_obj(&w);
    jw_obj_end(&w);
    jw_arr_end(&w);
    jw_obj_end(&w);
    REQUIRE(!sb.oom, "oom");
    kn_json *j = NULL;
    REQUIRE(kn_json_parse(sb.p, sb.len, &j) == KN_OK, "not JSON: %s (%s)", sb.p, kn_last_error());
    size_t n;
    const char *s = kn_json_str(j, kn_json_get(j, 0, "s"), &n);
    const char want[] = "q\"b\\n\n\t\x01\x1f" "\xef\xbf\xbd" "\xc3\xa9" "\xef\xbf\xbd\xef\xbf\xbd" "z";
    CHECK(s && n == sizeof want - 1 && !memcmp(s, want, n), "round trip: %s", sb.p);
    int64_t i;
    CHECK(kn_json_get_i64(j, 0, "i", &i) && i == -42, "int");
    CHECK(kn_json_kind(j, kn_json_get(j, 0, "x")) == KN_JSON_NULL, "inf as null");
    CHECK(kn_json_count(j, kn_json_get(j, 0, "a")) == 4, "array");
    kn_json_free(j);
    sb_free(&sb);
}

TEST(serve_request_validation) {
    if (!load_tok()) SKIP("no tokenizer: SmolLM2 (models/) and gguf/ggml-vocab-gpt-2.gguf (KN_ASSETS) are missing");
    srv_ctx c;
    ctx_init(&c, NULL);
    const char *P = "/v1/completions", *C = "/v1/chat/completions";
    expect_error(&c, "POST", P, NULL, "{\"prompt\": \"hi\"", 400, "not valid JSON");
    expect_error(&c, "POST", P, NULL, "", 400, "not valid JSON");
    expect_error(&c, "POST", P, NULL, "[1]", 400, "JSON object");
    expect_error(&c, "POST", P, NULL, "{}", 400, "'prompt' is required");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"bogus\":1}", 400, "unknown field 'bogus'");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "'temperature' must be a number");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"temperature\":3}", 400, "between 0 and 2");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"top_p\":0}", 400, "above 0");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"top_k\":1.5}", 400, "integer");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "'max_tokens' must be between 1");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"max_tokens\":1000}", 400, "'max_tokens' must be between 1");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"n\":2}", 400, "'n' must be 1");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logprobs\":3}", 400, "'logprobs' is not supported");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stream\":1}", 400, "true or false");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", 400, "only allowed");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"x\":1}}", 400, "stream_options.x");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stop\":\"\"}", 400, "1 to 256 bytes");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", 400, "more than 8");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"stop\":[1]}", 400, "'stop' must be a string");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"a\\u0000b\"}", 400, "without NUL");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":[1, 99999999]}", 400, "token ids below");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":[]}", 400, "empty");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":7}", 400, "must be a string");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"seed\":1e30}", 400, "integer");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logit_bias\":{\"x1\":5}}", 400, "token ids from 0");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logit_bias\":{\"-1\":5}}", 400, "token ids from 0");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logit_bias\":{\"99999999999\":5}}", 400, "token ids from 0");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logit_bias\":{\"1\":101}}", 400, "from -100 to 100");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"logit_bias\":[1]}", 400, "object of token ids");
    /* prompt + max_tokens against the context (64 tokens here) */
    char big[2048] = "{\"prompt\":\"";
    for (int i = 0; i < 100; i++) strcat(big, "word ");
    strcat(big, "\"}");
    expect_error(&c, "POST", P, NULL, big, 400, "context holds 64 tokens");
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\",\"max_tokens\":64}", 400, "lower max_tokens");
    expect_error(&c, "POST", C, NULL, "{\"prompt\":\"hi\"}", 400, "unknown field 'prompt'");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[]}", 400, "non-empty array");
    expect_error(&c, "POST", C, NULL, "{\"messages\":{}}", 400, "non-empty array");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"content\":\"x\"}]}", 400, "no 'role'");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", 400, "not supported");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "string or an array");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400, "text only");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"extra\":1}]}", 400, "unknown message field 'extra'");
    ctx_init(&c, NULL);
    c.tmpl = NULL;
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "no chat template");
    c.tok = NULL;
    expect_error(&c, "POST", P, NULL, "{\"prompt\":\"hi\"}", 503, "no model");
}

/* the tokens of text as the handler makes them */
static int tokens_of(const char *text, int32_t *ids, int cap) {
    int n = 0;
    kn_tokenize(g_tok, text, strlen(text), kn_tokenizer_add_bos(g_tok), true, ids, cap, &n);
    return n;
}

TEST(serve_request_fields_become_a_job) {
    if (!load_tok()) SKIP("no tokenizer: SmolLM2 (models/) and gguf/ggml-vocab-gpt-2.gguf (KN_ASSETS) are missing");
    srv_ctx c;
    ctx_init(&c, NULL);
    srv_resp r;
    call(&c, "POST", "/v1/completions", NULL,
         "{\"model\":\"x\",\"prompt\":[\"Hello there\"],\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,"
         "\"min_p\":0.1,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"seed\":-1,\"stop\":[\"\\n\",\"END\"],"
         "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":1,\"logprobs\":null,\"echo\":false,"
         "\"user\":\"u\",\"logit_bias\":{\"7\":-100,\"12\":2.5}}", &r);
    REQUIRE(r.status == 200 && r.job, "status %d: %s", r.status, r.body.p ? r.body.p : "");
    srv_job *j = r.job;
    int32_t ids[64];
    int n = tokens_of("Hello there", ids, 64);
    CHECK(j->n_prompt == n && !memcmp(j->prompt, ids, sizeof(int32_t) * (size_t)n), "prompt tokens");
    CHECK(j->max_tokens == 7 && j->kind == SRV_COMPLETION && j->stream && j->include_usage, "flags");
    CHECK(j->sp.temp == 0.5f && j->sp.top_p == 0.9f && j->sp.top_k == 3 && j->sp.min_p == 0.1f, "sampling");
    CHECK(j->sp.presence_penalty == 0.5f && j->sp.freq_penalty == -0.5f && j->sp.seed == UINT64_MAX, "penalties, seed");
    CHECK(j->n_stop == 2 && !strcmp(j->stop[0], "\n") && !strcmp(j->stop[1], "END"), "stop");
    CHECK(!strncmp(j->id, "cmpl-", 5), "id %s", j->id);
    CHECK(j->n_bias == 2 && j->bias_ids[0] == 7 && j->bias_vals[0] == -100.0f && j->bias_ids[1] == 12 &&
          j->bias_vals[1] == 2.5f, "logit_bias");
    srv_resp_free(&r);

    /* no max_tokens: the rest of the context; a stop string alone */
    call(&c, "POST", "/v1/completions", NULL, "{\"prompt\":[5,6,7],\"stop\":\"x\"}", &r);
    REQUIRE(r.job, "%s", r.body.p ? r.body.p : "");
    CHECK(r.job->n_prompt == 3 && r.job->prompt[2] == 7 && r.job->max_tokens == 64 - 3, "ids prompt, max %d", r.job->max_tokens);
    CHECK(r.job->n_stop == 1 && !r.job->stream, "one stop");
    uint64_t seed1 = r.job->sp.seed;
    srv_resp_free(&r);
    call(&c, "POST", "/v1/completions", NULL, "{\"prompt\":\"a\"}", &r);
    REQUIRE(r.job, "plain");
    CHECK(r.job->sp.seed != seed1, "requests without a seed get different seeds");
    srv_resp_free(&r);

    /* chat: content parts are flattened, developer is a system message */
    call(&c, "POST", "/v1/chat/completions", NULL,
         "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
         "[{\"type\":\"text\",\"text\":\"What is \"},{\"type\":\"text\",\"text\":\"2+2?\"}]}],"
         "\"max_completion_tokens\":5}", &r);
    REQUIRE(r.job, "chat: %s", r.body.p ? r.body.p : "");
    kn_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "What is 2+2?"}};
    char text[512];
    size_t need;
    REQUIRE(kn_chat_apply(&g_tmpl, msgs, 2, true, text, sizeof text, &need) == KN_OK, "render");
    n = tokens_of(text, ids, 64);
    CHECK(r.job->n_prompt == n && !memcmp(r.job->prompt, ids, sizeof(int32_t) * (size_t)n), "chat prompt tokens");
    CHECK(r.job->max_tokens == 5 && r.job->kind == SRV_CHAT && !strncmp(r.job->id, "chatcmpl-", 9), "chat job");
    srv_resp_free(&r);
}

TEST(serve_reply_shapes) {
    srv_ctx c;
    ctx_init(&c, NULL);
    srv_job *j = srv_job_new();
    REQUIRE(j, "job");
    j->kind = SRV_CHAT;
    j->n_prompt = 11;
    j->n_gen = 4;
    j->finish = "length";
    j->include_usage = true;
    snprintf(j->id, sizeof j->id, "chatcmpl-1");
    sbuf sb = {0};
    srv_reply_full(&c, j, "Hi \"you\"", 8, &sb);
    kn_json *js = NULL;
    REQUIRE(kn_json_parse(sb.p, sb.len, &js) == KN_OK, "full reply: %s", sb.p);
    int64_t ch = kn_json_at(js, kn_json_get(js, 0, "choices"), 0);
    int64_t msg = kn_json_get(js, ch, "message");
    CHECK(!strcmp(kn_json_get_str(js, msg, "content"), "Hi \"you\"") && !strcmp(kn_json_get_str(js, msg, "role"), "assistant"), "message");
    CHECK(!strcmp(kn_json_get_str(js, ch, "finish_reason"), "length"), "finish");
    int64_t u = kn_json_get(js, 0, "usage"), v;
    CHECK(kn_json_get_i64(js, u, "total_tokens", &v) && v == 15, "usage");
    CHECK(!strcmp(kn_json_get_str(js, 0, "object"), "chat.completion"), "object");
    kn_json_free(js);
    sb_free(&sb);
    /* a stream: role delta, text, end with finish, usage chunk, [DONE] */
    srv_sse_chunk(&c, j, "", 0, true, &sb);
    srv_sse_chunk(&c, j, "tok", 3, false, &sb);
    srv_sse_end(&c, j, &sb);
    const char *p = sb.p;
    int events = 0;
    bool saw_done = false, saw_usage = false, saw_finish = false;
    while (p && (p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        REQUIRE(e, "event not ended");
        if (!strncmp(p, "[DONE]", 6)) { saw_done = true; break; }
        REQUIRE(kn_json_parse(p, (size_t)(e - p), &js) == KN_OK, "event %d not JSON: %.*s", events, (int)(e - p), p);
        CHECK(!strcmp(kn_json_get_str(js, 0, "object"), "chat.completion.chunk"), "chunk object");
        int64_t chs = kn_json_get(js, 0, "choices");
        if (kn_json_count(js, chs) == 0) {
            int64_t uu = kn_json_get(js, 0, "usage");
            saw_usage = kn_json_get_i64(js, uu, "completion_tokens", &v) && v == 4;
        } else {
            const char *f = kn_json_get_str(js, kn_json_at(js, chs, 0), "finish_reason");
            if (f) saw_finish = !strcmp(f, "length");
            if (events == 0) CHECK(kn_json_get_str(js, kn_json_get(js, kn_json_at(js, chs, 0), "delta"), "role"), "role first");
        }
        kn_json_free(js);
        events++;
        p = e;
    }
    CHECK(events == 4 && saw_done && saw_usage && saw_finish, "events %d done %d usage %d finish %d", events, saw_done,
          saw_usage, saw_finish);
    sb_free(&sb);
    srv_job_unref(j);
}

/* ---- tool calls ---------------------------------------------------------------------------- */

/* a file's text (NULL if unreadable) */
static char *slurp_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

TEST(serve_tool_request_validation) {
    if (!load_tok()) SKIP("no tokenizer: SmolLM2 (models/) and gguf/ggml-vocab-gpt-2.gguf (KN_ASSETS) are missing");
    srv_ctx c;
    ctx_init(&c, NULL);
    const char *C = "/v1/chat/completions";
#define U "{\"role\":\"user\",\"content\":\"x\"}"
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":{}}", 400, "'tools' must be an array");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":[{\"type\":\"function\"}]}", 400, "each tool must be");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]}",
                 400, "each tool must be");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tool_choice\":\"sometimes\"}", 400, "'tool_choice' must be");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
                 400, "no 'tools'");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", 400, "not in 'tools'");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400,
                 "only assistant messages");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_call_id\":\"a\"}]}", 400,
                 "only tool messages");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]}]}", 400,
                 "needs \"function\"");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                 "\"arguments\":5}}]}]}", 400, "function.arguments");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}", 400, "must be an array");
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"parallel_tool_calls\":3}", 400, "true or false");
    /* the built-in templates (chatml here) have no tools: a clear 400 */
    expect_error(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                 400, "built-in templates have no tools");
    /* tool_choice none drops the tools: fine with chatml; parallel_tool_calls is accepted */
    srv_resp r;
    call(&c, "POST", C, NULL, "{\"messages\":[" U "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":\"none\",\"parallel_tool_calls\":false}", &r);
    CHECK(r.status == 200 && r.job && !r.job->tools, "tool_choice none: %d %s", r.status, r.body.p ? r.body.p : "");
    srv_resp_free(&r);
#undef U
}

/* Requests built from the chat-template fixtures (transformers' own
 * renderings, tests/fixtures/chat_templates/cases.json) must become the
 * tokens of the text transformers rendered: the request layer hands the
 * template what apply_chat_template hands it. */
TEST(serve_tool_requests_render_as_transformers) {
    if (!load_tok()) SKIP("no tokenizer: SmolLM2 (models/) and gguf/ggml-vocab-gpt-2.gguf (KN_ASSETS) are missing");
    char *cases = slurp_file("tests/fixtures/chat_templates/cases.json");
    REQUIRE(cases, "tests/fixtures/chat_templates/cases.json is missing");
    kn_json *cj = NULL;
    REQUIRE(kn_json_parse(cases, strlen(cases), &cj) == KN_OK, "cases.json: %s", kn_last_error());
    /* ("*_string_args" rows give transformers the arguments as a string, which
     * it prints as one; a server parses OpenAI's string into the object the
     * templates expect, so those rows are sent here with the arguments of
     * tool_calls_results turned into strings, OpenAI's form, instead) */
    static const char *const names[] = {"qwen2.5/tool_calls_results", "qwen2.5/tools_system", "qwen2.5/tool_first",
                                        "qwen3/tool_calls_results", "mistral-nemo/tool_calls_results",
                                        "mistral-nemo/system_tools", "gemma3/tools_ignored", "qwen2.5/system_later"};
    int done = 0;
    for (int64_t row = kn_json_first(cj, 0); row >= 0; row = kn_json_next(cj, row))
      for (int as_string = 0; as_string < 2; as_string++) {
        const char *name = kn_json_get_str(cj, row, "name");
        bool want = false;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) want |= !strcmp(name, names[k]);
        if (!want || (as_string && !strstr(name, "tool_calls_results"))) continue;
        const char *tfile = kn_json_get_str(cj, row, "template"), *msgs = kn_json_get_str(cj, row, "messages");
        char *smsgs = NULL;
        if (as_string) {   /* {"city": "Paris"} -> "{\"city\": \"Paris\"}", OpenAI's form */
            static const char *const from[] = {"\"arguments\": {\"city\": \"Paris\"}", "\"arguments\": {\"tz\": \"Asia/Tokyo\"}",
                                               "\"arguments\": {\"city\": \"Oslo\"}"};
            static const char *const to[] = {"\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"",
                                             "\"arguments\": \"{\\\"tz\\\": \\\"Asia/Tokyo\\\"}\"",
                                             "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\""};
            smsgs = malloc(strlen(msgs) * 2 + 64);
            strcpy(smsgs, msgs);
            int swapped = 0;
            for (int k = 0; k < 3; k++) {
                char *at = strstr(smsgs, from[k]);
                if (!at) continue;
                size_t fl = strlen(from[k]), tl = strlen(to[k]);
                memmove(at + tl, at + fl, strlen(at + fl) + 1);
                memcpy(at, to[k], tl);
                swapped++;
            }
            CHECK(swapped > 0, "%s: no arguments to turn into strings", name);
            msgs = smsgs;
        }
        const char *tools = kn_json_get_str(cj, row, "tools"), *expected = kn_json_get_str(cj, row, "expected");
        const char *bos = kn_json_get_str(cj, row, "bos"), *eos = kn_json_get_str(cj, row, "eos");
        REQUIRE(tfile && msgs && expected, "%s: fields", name);
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/chat_templates/%s", tfile);
        char *jinja = slurp_file(path);
        REQUIRE(jinja, "%s missing", path);
        kn_chat_tmpl t;
        REQUIRE(kn_chat_template_from_string(jinja, &t) == KN_OK, "%s: %s", tfile, kn_last_error());
        kn_chat_template_set_tokens(&t, bos, eos);
        free(jinja);
        srv_ctx c;
        ctx_init(&c, NULL);
        c.tmpl = &t;
        c.n_ctx_seq = 8192;
        c.max_tokens_cap = 8192;
        c.max_body = 1 << 16;
        size_t bl = strlen(msgs) + (tools ? strlen(tools) : 0) + 64;
        char *body = malloc(bl);
        snprintf(body, bl, "{\"messages\":%s%s%s%s,\"max_tokens\":4}", msgs, tools ? ",\"tools\":" : "", tools ? tools : "",
                 tools ? "" : "");
        srv_resp r;
        call(&c, "POST", "/v1/chat/completions", NULL, body, &r);
        CHECK(r.status == 200 && r.job, "%s%s: %d %s", name, as_string ? " (string arguments)" : "", r.status,
              r.body.p ? r.body.p : "");
        if (r.job) {
            /* the handler drops a leading bos_token (the tokenizer adds its own) */
            const char *text = expected;
            if (bos && *bos && !strncmp(text, bos, strlen(bos))) text += strlen(bos);
            int cap = 8192, n = 0;
            int32_t *ids = malloc(sizeof *ids * (size_t)cap);
            kn_tokenize(g_tok, text, strlen(text), kn_tokenizer_add_bos(g_tok), true, ids, cap, &n);
            CHECK(r.job->n_prompt == n && !memcmp(r.job->prompt, ids, sizeof *ids * (size_t)n),
                  "%s%s: %d prompt tokens, transformers' text gives %d", name, as_string ? " (string arguments)" : "",
                  r.job->n_prompt, n);
            CHECK(r.job->tools == (tools != NULL), "%s: tools flag", name);
            free(ids);
        }
        srv_resp_free(&r);
        free(body);
        free(smsgs);
        kn_chat_tmpl_free(&t);
        done++;
      }
    CHECK(done == (int)(sizeof names / sizeof names[0]) + 3, "found %d of the cases", done);
    kn_json_free(cj);
    free(cases);
}

/* parse a reply's calls; the names and arguments joined as "name(args);" */
static bool calls_of(const char *text, char *out, size_t cap, size_t *content) {
    srv_tool_calls tc;
    bool ok = srv_tool_parse(text, strlen(text), content, &tc);
    out[0] = 0;
    for (int i = 0; i < tc.n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s(%s);", tc.v[i].name, tc.v[i].args);
    srv_tool_calls_free(&tc);
    return ok;
}

TEST(serve_tool_call_parsing) {
    char got[512];
    size_t cl;
    /* Qwen / Hermes blocks: content before, two calls, the last without its closing tag */
    CHECK(calls_of("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5]}}\n"
                   "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}", got, sizeof got, &cl),
          "qwen");
    CHECK(!strcmp(got, "get_weather({\"city\":\"Paris\",\"n\":[1,2.5]});get_time({\"tz\":\"UTC\"});"), "qwen calls: %s", got);
    CHECK(cl == strlen("Let me check."), "qwen content length %zu", cl);
    CHECK(calls_of("<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}</tool_call>", got, sizeof got, &cl) && cl == 0 &&
          !strcmp(got, "f({\"a\": 1});"), "string arguments kept: %s", got);
    CHECK(calls_of("<tool_call>{\"name\":\"f\"}</tool_call>", got, sizeof got, &cl) && !strcmp(got, "f({});"), "no arguments: %s", got);
    /* Llama 3.x: the whole reply, parameters or arguments, python_tag, an array */
    CHECK(calls_of("{\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}", got, sizeof got, &cl) && cl == 0 &&
          !strcmp(got, "get_time({\"tz\":\"CET\"});"), "llama: %s", got);
    CHECK(calls_of("  <|python_tag|>{\"name\": \"f\", \"arguments\": {}}", got, sizeof got, &cl) && !strcmp(got, "f({});"),
          "python_tag: %s", got);
    CHECK(calls_of("[{\"name\": \"a\", \"parameters\": {}}, {\"name\": \"b\", \"parameters\": {\"x\": true}}]", got, sizeof got, &cl) &&
          !strcmp(got, "a({});b({\"x\":true});"), "array: %s", got);
    /* Mistral */
    CHECK(calls_of("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]", got, sizeof got, &cl) &&
          cl == 0 && !strcmp(got, "get_weather({\"city\":\"Oslo\"});"), "mistral: %s", got);
    /* not calls: plain text, broken JSON, a JSON object that is no call, an empty name, a bad array */
    const char *plain[] = {"Hello there.", "", "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                           "{\"answer\": 42}", "{\"name\": \"\", \"arguments\": {}}", "[]", "[TOOL_CALLS]nope",
                           "<tool_call>\n{\"name\": \"f\"}\n</tool_call><tool_call>oops</tool_call>",
                           "{\"name\": \"f\", \"arguments\": 7}", "<tool_call"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        CHECK(!calls_of(plain[i], got, sizeof got, &cl) && cl == strlen(plain[i]) && !got[0], "'%s' is content", plain[i]);
    }
    /* streaming: what may go out as content */
    CHECK(srv_tool_stream_safe("Hello <tool", 11, 0) == 5, "a partial opening tag and the space before it are held");
    CHECK(srv_tool_stream_safe("Hello <b>", 9, 0) == 9, "other text goes out");
    CHECK(srv_tool_stream_safe("  {\"na", 6, 0) == 0, "a reply that may be one JSON call is held");
    CHECK(srv_tool_stream_safe("[TOOL_C", 7, 0) == 0 && srv_tool_stream_safe("<|pyth", 6, 0) == 0, "markers held");
    CHECK(srv_tool_stream_safe("ok {x} <tool_call>{", 19, 3) == 6, "content up to the call");
    CHECK(srv_tool_stream_safe("ab", 2, 2) == 2, "never less than sent");
    srv_job j = {.kind = SRV_CHAT};
    snprintf(j.id, sizeof j.id, "chatcmpl-x");
    char a[10], b[10];
    srv_tool_call_id(&j, 0, a);
    srv_tool_call_id(&j, 1, b);
    CHECK(strlen(a) == 9 && strlen(b) == 9 && strcmp(a, b), "ids %s %s", a, b);
    for (int i = 0; i < 9; i++) CHECK(isalnum((unsigned char)a[i]), "id letters and digits: %s", a);
}

/* the SSE events of out: content deltas joined, the tool calls seen, the finish reason */
static void read_events(const char *out, char *content, size_t cap, char *calls, size_t ccap, char *finish) {
    content[0] = calls[0] = finish[0] = 0;
    const char *p = out;
    while (p && (p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e || !strncmp(p, "[DONE]", 6)) break;
        kn_json *js = NULL;
        CHECK(kn_json_parse(p, (size_t)(e - p), &js) == KN_OK, "event not JSON: %.*s", (int)(e - p), p);
        int64_t ch = kn_json_at(js, kn_json_get(js, 0, "choices"), 0), d = kn_json_get(js, ch, "delta");
        const char *t = kn_json_get_str(js, d, "content"), *f = kn_json_get_str(js, ch, "finish_reason");
        if (t) snprintf(content + strlen(content), cap - strlen(content), "%s", t);
        if (f) snprintf(finish, 32, "%s", f);
        int64_t tcs = kn_json_get(js, d, "tool_calls");
        for (int64_t c = kn_json_first(js, tcs); c >= 0; c = kn_json_next(js, c)) {
            int64_t fn = kn_json_get(js, c, "function"), idx = -1;
            kn_json_get_i64(js, c, "index", &idx);
            snprintf(calls + strlen(calls), ccap - strlen(calls), "%lld:%s:%s(%s);", (long long)idx,
                     kn_json_get_str(js, c, "type"), kn_json_get_str(js, fn, "name"), kn_json_get_str(js, fn, "arguments"));
        }
        kn_json_free(js);
        p = e;
    }
}

TEST(serve_tool_call_replies) {
    srv_ctx c;
    ctx_init(&c, NULL);
    srv_job *j = srv_job_new();
    REQUIRE(j, "job");
    j->kind = SRV_CHAT;
    j->tools = true;
    j->finish = "stop";
    snprintf(j->id, sizeof j->id, "chatcmpl-7");
    const char *reply = "Checking.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";
    /* the whole reply */
    sbuf sb = {0};
    srv_reply_full(&c, j, reply, strlen(reply), &sb);
    kn_json *js = NULL;
    REQUIRE(kn_json_parse(sb.p, sb.len, &js) == KN_OK, "reply: %s", sb.p);
    int64_t ch = kn_json_at(js, kn_json_get(js, 0, "choices"), 0), msg = kn_json_get(js, ch, "message");
    int64_t tc = kn_json_at(js, kn_json_get(js, msg, "tool_calls"), 0), fn = kn_json_get(js, tc, "function");
    CHECK(!strcmp(kn_json_get_str(js, msg, "content"), "Checking."), "content");
    CHECK(!strcmp(kn_json_get_str(js, fn, "name"), "get_time") && !strcmp(kn_json_get_str(js, fn, "arguments"), "{\"tz\":\"UTC\"}"),
          "call");
    CHECK(strlen(kn_json_get_str(js, tc, "id")) == 9 && !strcmp(kn_json_get_str(js, tc, "type"), "function"), "id, type");
    CHECK(!strcmp(kn_json_get_str(js, ch, "finish_reason"), "tool_calls"), "finish_reason");
    kn_json_free(js);
    sb_free(&sb);
    /* only a call: content null */
    srv_reply_full(&c, j, "{\"name\": \"f\", \"parameters\": {}}", 31, &sb);
    REQUIRE(kn_json_parse(sb.p, sb.len, &js) == KN_OK, "reply: %s", sb.p);
    msg = kn_json_get(js, kn_json_at(js, kn_json_get(js, 0, "choices"), 0), "message");
    CHECK(kn_json_kind(js, kn_json_get(js, msg, "content")) == KN_JSON_NULL, "content null: %s", sb.p);
    kn_json_free(js);
    sb_free(&sb);
    /* an unknown syntax is content */
    srv_reply_full(&c, j, "<call>f()</call>", 16, &sb);
    REQUIRE(kn_json_parse(sb.p, sb.len, &js) == KN_OK, "reply: %s", sb.p);
    ch = kn_json_at(js, kn_json_get(js, 0, "choices"), 0);
    msg = kn_json_get(js, ch, "message");
    CHECK(!strcmp(kn_json_get_str(js, msg, "content"), "<call>f()</call>") && kn_json_get(js, msg, "tool_calls") < 0 &&
          !strcmp(kn_json_get_str(js, ch, "finish_reason"), "stop"), "plain reply: %s", sb.p);
    kn_json_free(js);
    sb_free(&sb);

    /* streamed in awkward pieces: the content, then the calls, then finish_reason tool_calls */
    const char *pieces[] = {"Check", "ing.\n<to", "ol_call>\n{\"name\": \"get_", "time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"};
    char content[256], calls[512], finish[32];
    srv_tstream ts = {0};
    for (int i = 0; i < 4; i++) srv_sse_text(&c, j, &ts, pieces[i], strlen(pieces[i]), i == 0, i == 3, &sb);
    read_events(sb.p, content, sizeof content, calls, sizeof calls, finish);
    CHECK(!strcmp(content, "Checking."), "streamed content '%s'", content);
    CHECK(!strcmp(calls, "0:function:get_time({\"tz\":\"UTC\"});"), "streamed calls '%s'", calls);
    CHECK(!strcmp(finish, "tool_calls") && j->called, "finish '%s'", finish);
    CHECK(strstr(sb.p, "data: [DONE]"), "done line");
    sb_free(&sb);
    sb_free(&ts.acc);
    /* a reply that only looked like a call at first is sent whole at the end */
    j->called = false;
    ts = (srv_tstream){0};
    const char *fake[] = {"{not", " json} and <tool", " text"};
    for (int i = 0; i < 3; i++) srv_sse_text(&c, j, &ts, fake[i], strlen(fake[i]), i == 0, i == 2, &sb);
    read_events(sb.p, content, sizeof content, calls, sizeof calls, finish);
    CHECK(!strcmp(content, "{not json} and <tool text") && !calls[0] && !strcmp(finish, "stop"), "fake: '%s' '%s' %s", content,
          calls, finish);
    sb_free(&sb);
    sb_free(&ts.acc);
    srv_job_unref(j);
}

int main(void) {
    srv_metrics_init(&g_met);
    int rc = kn_test_main();
    kn_tokenizer_free(g_tok);
    return rc;
}
