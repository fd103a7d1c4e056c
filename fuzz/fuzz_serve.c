/* fuzz_serve.c: libFuzzer harness for the request handler of `kiln serve`
 * (tools/serve/handler.c, api.c, jw.c, metrics.c): routing, auth, limits,
 * OpenAI JSON bodies, chat rendering and tokenization, reply writing.
 *
 * Input: "METHOD\nPATH\nAUTHORIZATION\nBODY" (missing lines are empty; an
 * AUTHORIZATION line "-" means no header). libmicrohttpd parses the HTTP
 * itself; this covers everything the server does with what it parsed. The
 * tokenizer is SmolLM2's (models/, or $KN_FUZZ_MODEL) when present, else
 * the small byte-level BPE fixture tests/fixtures/hftok/gpt2.json (always
 * in the repository), so the prompt paths are always exercised. The chat
 * template is SmolLM2's built-in one, or (inputs of size 2 or 3 mod 4)
 * Qwen2.5's Jinja template (tests/fixtures/chat_templates/qwen2.5.jinja),
 * which renders tools, tool calls and tool results. Every reply must be
 * valid JSON (or the page, or the metrics text). Jobs are built and freed
 * here, never run: the engine has its own tests. The body is also read as a
 * model's reply with tool calls (srv_tool_parse), whole and streamed in three
 * pieces, and every event written for it must be JSON. */
#include "../tools/serve/serve.h"
#include "formats/hfconfig.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char srv_page_html[] = "<!doctype html><title>fuzz</title>";
const size_t srv_page_html_len = sizeof srv_page_html - 1;

static kn_tokenizer *g_tok;
static kn_chat_tmpl g_tmpl, g_qwen;
static srv_metrics g_met;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *m = getenv("KN_FUZZ_MODEL");
    if (!m) m = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (kn_tokenizer_load_gguf(m, &g_tok) != KN_OK &&
        kn_tokenizer_load_hf("tests/fixtures/hftok/gpt2.json", &g_tok) != KN_OK)
        g_tok = NULL;
    fprintf(stderr, "fuzz_serve: %s\n", g_tok ? "with a tokenizer" : "no tokenizer (routing, auth, limits only)");
    kn_chat_template_from_name("smollm", &g_tmpl);
    FILE *f = fopen("tests/fixtures/chat_templates/qwen2.5.jinja", "rb");
    char q[8192];
    size_t qn = f ? fread(q, 1, sizeof q - 1, f) : 0;
    if (f) fclose(f);
    q[qn] = 0;
    if (!qn || kn_chat_template_from_string(q, &g_qwen) != KN_OK) g_qwen = g_tmpl;   /* shares; never freed */
    srv_metrics_init(&g_met);
    return 0;
}

/* the next line of [*p, end) as a NUL-terminated copy */
static char *line(const uint8_t **p, const uint8_t *end) {
    const uint8_t *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
    char *out = malloc(n + 1);
    if (!out) abort();
    memcpy(out, s, n);
    out[n] = 0;
    *p = nl ? nl + 1 : end;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p = data, *end = data + size;
    char *method = line(&p, end), *path = line(&p, end), *auth = line(&p, end);
    size_t body_len = (size_t)(end - p);
    srv_ctx ctx = {
        .model_id = "fuzz", .tok = g_tok, .tmpl = (size & 2) ? &g_qwen : &g_tmpl, .n_ctx_seq = 4096, .max_tokens_cap = 256,
        .max_body = 1 << 16, .api_key = (size & 1) ? "key" : NULL, .timeout_s = 1, .n_parallel = 2,
        .metrics = &g_met,
    };
    atomic_init(&ctx.n_req, 0);
    srv_resp r;
    srv_handle(&ctx, method, path, strcmp(auth, "-") ? auth : NULL, (const char *)p, body_len,
               body_len > ctx.max_body, &r);
    if (r.status < 200 || r.status > 599) abort();
    if (r.job) {
        srv_job *j = r.job;
        if (j->n_prompt < 1 || j->n_prompt + j->max_tokens > ctx.n_ctx_seq || j->max_tokens < 1) abort();
        /* write each reply shape for it */
        sbuf sb = {0};
        j->n_gen = 3;
        j->finish = "stop";
        srv_reply_full(&ctx, j, path, strlen(path), &sb);
        kn_json *js = NULL;
        if (kn_json_parse(sb.p, sb.len, &js) != KN_OK) abort();
        kn_json_free(js);
        sb_free(&sb);
        srv_sse_chunk(&ctx, j, method, strlen(method), true, &sb);
        srv_sse_end(&ctx, j, &sb);
        sb_free(&sb);
    }
    /* the body as a model's reply that may hold tool calls */
    {
        srv_job *j = srv_job_new();
        if (!j) abort();
        j->kind = SRV_CHAT;
        j->tools = true;
        snprintf(j->id, sizeof j->id, "chatcmpl-fuzz");
        const char *text = (const char *)p;
        sbuf sb = {0};
        srv_reply_full(&ctx, j, text, body_len, &sb);
        kn_json *js = NULL;
        if (kn_json_parse(sb.p, sb.len, &js) != KN_OK) abort();
        kn_json_free(js);
        sb_free(&sb);
        srv_tstream ts = {0};
        size_t a = body_len / 3, b = 2 * body_len / 3;
        srv_sse_text(&ctx, j, &ts, text, a, true, false, &sb);
        srv_sse_text(&ctx, j, &ts, text + a, b - a, false, false, &sb);
        srv_sse_text(&ctx, j, &ts, text + b, body_len - b, false, true, &sb);
        for (const char *e = sb.p; e && (e = strstr(e, "data: ")); ) {   /* every event is JSON */
            e += 6;
            const char *end = strstr(e, "\n\n");
            if (!end) abort();
            if (strncmp(e, "[DONE]", 6)) {
                if (kn_json_parse(e, (size_t)(end - e), &js) != KN_OK) abort();
                kn_json_free(js);
            }
            e = end;
        }
        sb_free(&sb);
        sb_free(&ts.acc);
        srv_job_unref(j);
    }
    if (!r.job && r.ctype && !strcmp(r.ctype, "application/json")) {
        kn_json *js = NULL;
        if (kn_json_parse(r.body.p, r.body.len, &js) != KN_OK) abort();   /* every JSON reply parses */
        kn_json_free(js);
    }
    srv_resp_free(&r);
    free(method); free(path); free(auth);
    return 0;
}
