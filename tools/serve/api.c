/* api.c: the OpenAI request bodies of /v1/completions and
 * /v1/chat/completions (read with kn_json, strictly: unknown fields and wrong
 * types are 400s that name the field) and the reply JSON (jw.h).
 *
 * Sampling defaults are the library's (kn_sampler_defaults: temperature 0.8,
 * top_k 40, top_p 0.95, min_p 0.05), as llama.cpp's server does, not
 * OpenAI's (temperature 1, no truncation), which suits small local models
 * poorly; every one can be set per request. A request without a seed gets a
 * fresh one. */
#include "serve.h"
#include "formats/hfconfig.h"   /* kn_json: the project's fuzzed JSON reader (allowed for tools/serve/, see check_layers.py) */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- field checks ------------------------------------------------------------------- */
typedef struct parse {
    srv_ctx *ctx;
    srv_resp *r;
    const kn_json *j;
    bool failed;
} parse;

static void bad(parse *p, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void bad(parse *p, const char *param, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_error(p->r, 400, param, "%s", msg);
}

/* a number field in [lo, hi]; absent or null leaves *out */
static void get_num(parse *p, int64_t v, const char *name, double lo, double hi, float *out) {
    if (v < 0 || kn_json_kind(p->j, v) == KN_JSON_NULL) return;
    double d;
    if (!kn_json_num(p->j, v, &d)) { bad(p, name, "'%s' must be a number", name); return; }
    if (!(d >= lo && d <= hi)) {
        char fmt[160];
        snprintf(fmt, sizeof fmt, "'%%s' must be between %g and %g, got %%g", lo, hi);
        bad(p, name, fmt, name, d);
        return;
    }
    *out = (float)d;
}

static void get_int(parse *p, int64_t v, const char *name, int64_t lo, int64_t hi, int64_t *out, bool *given) {
    if (v < 0 || kn_json_kind(p->j, v) == KN_JSON_NULL) return;
    int64_t i;
    if (!kn_json_int(p->j, v, &i)) { bad(p, name, "'%s' must be an integer", name); return; }
    if (i < lo || i > hi) {
        char fmt[160];
        snprintf(fmt, sizeof fmt, "'%%s' must be between %lld and %lld, got %%.0f", (long long)lo, (long long)hi);
        bad(p, name, fmt, name, (double)i);
        return;
    }
    *out = i;
    if (given) *given = true;
}

static bool get_bool(parse *p, int64_t v, const char *name, bool *out) {
    if (v < 0 || kn_json_kind(p->j, v) == KN_JSON_NULL) return false;
    if (!kn_json_bool(p->j, v, out)) { bad(p, name, "'%s' must be true or false", name); return false; }
    return true;
}

/* Text must be valid UTF-8 without NUL (kn_json decodes \u0000 and lone
 * surrogates would not survive the tokenizer). */
static const char *get_text(parse *p, int64_t v, const char *name, size_t *len) {
    size_t n;
    const char *s = kn_json_str(p->j, v, &n);
    if (!s) { bad(p, name, "'%s' must be a string", name); return NULL; }
    if (memchr(s, 0, n) || kn_utf8_valid_prefix(s, n) != n) {
        bad(p, name, "'%s' must be valid UTF-8 text without NUL characters", name);
        return NULL;
    }
    if (len) *len = n;
    return s;
}

/* ---- prompt building ------------------------------------------------------------------ */
static bool tokenize(parse *p, const char *text, size_t len, srv_job *job) {
    const kn_tokenizer *tok = p->ctx->tok;
    int n = 0;
    kn_status st = kn_tokenize(tok, text, len, kn_tokenizer_add_bos(tok), true, NULL, 0, &n);
    if (st != KN_OK && st != KN_ERR_LIMIT) { bad(p, NULL, "the prompt cannot be tokenized: %s", kn_last_error()); return false; }
    job->prompt = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!job->prompt) { bad(p, NULL, "out of memory"); return false; }
    if (kn_tokenize(tok, text, len, kn_tokenizer_add_bos(tok), true, job->prompt, n, &n) != KN_OK) {
        bad(p, NULL, "the prompt cannot be tokenized: %s", kn_last_error());
        return false;
    }
    job->n_prompt = n;
    return true;
}

/* prompt: a string, an array of one string, or an array of token ids */
static bool completion_prompt(parse *p, int64_t v, srv_job *job) {
    const kn_json *j = p->j;
    if (v < 0) { bad(p, "prompt", "'%s' is required", "prompt"); return false; }
    if (kn_json_kind(j, v) == KN_JSON_ARRAY) {
        int64_t n = kn_json_count(j, v), first = kn_json_first(j, v);
        if (n == 1 && kn_json_kind(j, first) == KN_JSON_STRING) v = first;
        else {
            if (n < 1) { bad(p, "prompt", "'%s' is empty", "prompt"); return false; }
            if (n > p->ctx->n_ctx_seq) { bad(p, "prompt", "'%s' has more tokens than the context holds", "prompt"); return false; }
            job->prompt = malloc(sizeof(int32_t) * (size_t)n);
            if (!job->prompt) { bad(p, NULL, "out of memory"); return false; }
            int32_t n_vocab = kn_tokenizer_n_vocab(p->ctx->tok);
            int k = 0;
            for (int64_t e = first; e >= 0; e = kn_json_next(j, e)) {
                int64_t id;
                if (!kn_json_int(j, e, &id) || id < 0 || id >= n_vocab) {
                    bad(p, "prompt", "'%s' must be a string, an array of one string, or an array of token ids below %.0f",
                        "prompt", (double)n_vocab);
                    return false;
                }
                job->prompt[k++] = (int32_t)id;
            }
            job->n_prompt = k;
            return true;
        }
    }
    size_t len;
    const char *s = get_text(p, v, "prompt", &len);
    if (!s) return false;
    return tokenize(p, s, len, job);
}

/* a string field that must be valid text, written as it is */
static bool put_text(parse *p, int64_t v, const char *name, jw *w) {
    size_t len;
    const char *s = get_text(p, v, name, &len);
    if (!s) return false;
    jw_strn(w, s, len);
    return true;
}

/* an assistant message's tool_calls: [{"id", "type": "function",
 * "function": {"name", "arguments" (a JSON string, as OpenAI sends it, or an
 * object)}}], copied after checking */
static bool put_tool_calls(parse *p, int64_t v, jw *w) {
    const kn_json *j = p->j;
    if (kn_json_kind(j, v) != KN_JSON_ARRAY) { bad(p, "messages", "'tool_calls' must be an array"); return false; }
    jw_arr(w);
    for (int64_t c = kn_json_first(j, v); c >= 0; c = kn_json_next(j, c)) {
        if (kn_json_kind(j, c) != KN_JSON_OBJECT) { bad(p, "messages", "each tool call must be an object"); return false; }
        int64_t fn = kn_json_get(j, c, "function");
        if (kn_json_kind(j, fn) != KN_JSON_OBJECT || kn_json_kind(j, kn_json_get(j, fn, "name")) != KN_JSON_STRING) {
            bad(p, "messages", "a tool call needs \"function\": {\"name\": ..., \"arguments\": ...}");
            return false;
        }
        jw_obj(w);
        for (int64_t f = kn_json_first(j, c); f >= 0; f = kn_json_next(j, f)) {
            const char *key = kn_json_key(j, f, NULL);
            if (!strcmp(key, "id")) { jw_key(w, key); if (!put_text(p, f, "messages.tool_calls.id", w)) return false; }
            else if (!strcmp(key, "type")) {
                const char *t = kn_json_str(j, f, NULL);
                if (!t || strcmp(t, "function")) { bad(p, "messages", "a tool call's 'type' must be \"function\""); return false; }
                jw_kstr(w, "type", "function");
            } else if (!strcmp(key, "function")) {
                jw_key(w, "function");
                jw_obj(w);
                for (int64_t g = kn_json_first(j, f); g >= 0; g = kn_json_next(j, g)) {
                    const char *k2 = kn_json_key(j, g, NULL);
                    kn_json_type t = kn_json_kind(j, g);
                    if (!strcmp(k2, "name")) { jw_key(w, k2); if (!put_text(p, g, "messages.tool_calls.function.name", w)) return false; }
                    else if (!strcmp(k2, "arguments") && t == KN_JSON_STRING) {
                        jw_key(w, k2);
                        if (!put_text(p, g, "messages.tool_calls.function.arguments", w)) return false;
                    } else if (!strcmp(k2, "arguments") && t == KN_JSON_OBJECT) {
                        jw_key(w, k2);
                        if (!srv_json_copy(j, g, w)) { bad(p, "messages", "tool call arguments nest too deeply"); return false; }
                    } else {
                        bad(p, "messages", "unknown or malformed tool call field 'function.%s' (name: a string, "
                            "arguments: a JSON string or an object)", k2);
                        return false;
                    }
                }
                jw_obj_end(w);
            } else { bad(p, "messages", "unknown tool call field '%s'", key); return false; }
        }
        jw_obj_end(w);
    }
    jw_arr_end(w);
    return true;
}

/* message content: a string, null, or text parts (flattened: their texts
 * concatenated) */
static bool put_content(parse *p, int64_t content, jw *w) {
    const kn_json *j = p->j;
    kn_json_type ck = kn_json_kind(j, content);
    if (ck == KN_JSON_STRING) return put_text(p, content, "messages.content", w);
    if (ck != KN_JSON_ARRAY) { bad(p, "messages", "message content must be a string or an array of text parts"); return false; }
    sbuf t = {0};
    for (int64_t part = kn_json_first(j, content); part >= 0; part = kn_json_next(j, part)) {
        const char *type = kn_json_get_str(j, part, "type");
        int64_t tv = kn_json_get(j, part, "text");
        if (!type || strcmp(type, "text") || tv < 0 || kn_json_count(j, part) != 2) {
            bad(p, "messages", "content parts must be {\"type\": \"text\", \"text\": ...} (this server reads text only)");
            sb_free(&t);
            return false;
        }
        size_t len;
        const char *s = get_text(p, tv, "messages.content.text", &len);
        if (!s) { sb_free(&t); return false; }
        sb_add(&t, s, len);
    }
    jw_strn(w, t.p ? t.p : "", t.len);
    sb_free(&t);
    return true;
}

/* messages: [{role, content, tool_calls, tool_call_id, name}] -> the JSON
 * the template reads (roles checked, developer -> system, content parts
 * flattened, a missing or null content "" except beside tool_calls) */
static bool put_messages(parse *p, int64_t v, jw *w) {
    const kn_json *j = p->j;
    jw_arr(w);
    for (int64_t m = kn_json_first(j, v); m >= 0; m = kn_json_next(j, m)) {
        if (kn_json_kind(j, m) != KN_JSON_OBJECT) { bad(p, "messages", "each message must be an object"); return false; }
        const char *role = NULL;
        int64_t content = -1, calls = -1, call_id = -1, name = -1;
        for (int64_t f = kn_json_first(j, m); f >= 0; f = kn_json_next(j, f)) {
            const char *key = kn_json_key(j, f, NULL);
            bool null = kn_json_kind(j, f) == KN_JSON_NULL;
            if (!strcmp(key, "role")) { if (!(role = get_text(p, f, "messages.role", NULL))) return false; }
            else if (!strcmp(key, "content")) content = null ? -1 : f;
            else if (!strcmp(key, "tool_calls")) calls = null ? -1 : f;
            else if (!strcmp(key, "tool_call_id")) call_id = null ? -1 : f;
            else if (!strcmp(key, "name")) name = null ? -1 : f;
            else { bad(p, "messages", "unknown message field '%s'", key); return false; }
        }
        if (!role) { bad(p, "messages", "a message has no 'role'"); return false; }
        bool assistant = !strcmp(role, "assistant"), tool = !strcmp(role, "tool");
        if (strcmp(role, "system") && strcmp(role, "user") && !assistant && !tool && strcmp(role, "developer")) {
            bad(p, "messages", "message role '%s' is not supported (system, developer, user, assistant, tool)", role);
            return false;
        }
        if (calls >= 0 && !assistant) { bad(p, "messages", "only assistant messages have 'tool_calls'"); return false; }
        if (call_id >= 0 && !tool) { bad(p, "messages", "only tool messages have 'tool_call_id'"); return false; }
        jw_obj(w);
        jw_kstr(w, "role", !strcmp(role, "developer") ? "system" : role);
        if (content >= 0) { jw_key(w, "content"); if (!put_content(p, content, w)) return false; }
        else if (calls < 0) jw_kstr(w, "content", "");
        if (calls >= 0) { jw_key(w, "tool_calls"); if (!put_tool_calls(p, calls, w)) return false; }
        if (call_id >= 0) { jw_key(w, "tool_call_id"); if (!put_text(p, call_id, "messages.tool_call_id", w)) return false; }
        if (name >= 0) { jw_key(w, "name"); if (!put_text(p, name, "messages.name", w)) return false; }
        jw_obj_end(w);
    }
    jw_arr_end(w);
    return true;
}

/* tools: [{"type": "function", "function": {"name", "description",
 * "parameters"}}] (copied as given, for the template); tool_choice "auto",
 * "required" (the tools go to the template; nothing forces a call), "none"
 * (no tools) or {"type": "function", "function": {"name"}} (that tool
 * alone). *any: some tool goes to the template. */
static bool put_tools(parse *p, int64_t tools, int64_t choice, jw *w, bool *any) {
    const kn_json *j = p->j;
    *any = false;
    const char *only = NULL;
    kn_json_type ck = kn_json_kind(j, choice);
    if (ck == KN_JSON_STRING) {
        const char *c = kn_json_str(j, choice, NULL);
        if (!strcmp(c, "none")) tools = -1;
        else if (strcmp(c, "auto") && strcmp(c, "required")) {
            bad(p, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                "\"function\": {\"name\": ...}}");
            return false;
        }
    } else if (ck == KN_JSON_OBJECT) {
        int64_t fn = kn_json_get(j, choice, "function");
        only = kn_json_get_str(j, fn, "name");
        if (!only) { bad(p, "tool_choice", "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}"); return false; }
    } else if (ck != KN_JSON_NULL) { bad(p, "tool_choice", "'tool_choice' must be a string or an object"); return false; }
    if (tools < 0 || kn_json_kind(j, tools) == KN_JSON_NULL) {
        if (only) { bad(p, "tool_choice", "'tool_choice' names a function but there are no 'tools'"); return false; }
        return true;
    }
    if (kn_json_kind(j, tools) != KN_JSON_ARRAY) { bad(p, "tools", "'tools' must be an array"); return false; }
    if (kn_json_count(j, tools) > 256) { bad(p, "tools", "'tools' has more than 256 entries"); return false; }
    jw_arr(w);
    for (int64_t t = kn_json_first(j, tools); t >= 0; t = kn_json_next(j, t)) {
        const char *type = kn_json_get_str(j, t, "type");
        int64_t fn = kn_json_get(j, t, "function");
        size_t nl;
        const char *name = kn_json_kind(j, fn) == KN_JSON_OBJECT ? kn_json_str(j, kn_json_get(j, fn, "name"), &nl) : NULL;
        if (!type || strcmp(type, "function") || !name || !nl) {
            bad(p, "tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"description\": ..., "
                "\"parameters\": {...}}}");
            return false;
        }
        if (only && strcmp(only, name)) continue;
        if (!srv_json_copy(j, t, w)) { bad(p, "tools", "a tool definition nests too deeply"); return false; }
        *any = true;
    }
    jw_arr_end(w);
    if (only && !*any) { bad(p, "tool_choice", "'tool_choice' names '%.80s', which is not in 'tools'", only); return false; }
    return true;
}

/* messages and tools -> the model's chat template (as transformers'
 * apply_chat_template(messages, tools=...)) -> prompt tokens */
static bool chat_prompt(parse *p, int64_t v, int64_t tools, int64_t choice, srv_job *job) {
    const kn_json *j = p->j;
    if (v < 0) { bad(p, "messages", "'%s' is required", "messages"); return false; }
    if (!p->ctx->tmpl) {
        bad(p, "messages", "this model has no chat template: use /v1/completions, or start the server with --chat-template NAME");
        return false;
    }
    int64_t n = kn_json_count(j, v);
    if (kn_json_kind(j, v) != KN_JSON_ARRAY || n < 1) {
        bad(p, "messages", "'%s' must be a non-empty array of {\"role\", \"content\"} objects", "messages");
        return false;
    }
    if (n > 4096) { bad(p, "messages", "'%s' has more than 4096 entries", "messages"); return false; }
    sbuf mj = {0}, tj = {0};
    jw w;
    jw_init(&w, &mj);
    bool ok = put_messages(p, v, &w), any = false;
    jw_init(&w, &tj);
    ok = ok && put_tools(p, tools, choice, &w, &any);
    if (ok && (mj.oom || tj.oom)) { bad(p, NULL, "out of memory"); ok = false; }
    if (ok) {
        job->tools = any;
        kn_chat_request req = {.messages_json = mj.p, .tools_json = any ? tj.p : NULL, .add_generation_prompt = true,
                               .parse_arguments = true};
        size_t need = 0;
        kn_status st = kn_chat_apply_json(p->ctx->tmpl, &req, NULL, 0, &need);
        char *prompt = (st == KN_OK || st == KN_ERR_LIMIT) ? malloc(need + 1) : NULL;
        if (!prompt || kn_chat_apply_json(p->ctx->tmpl, &req, prompt, need + 1, &need) != KN_OK) {
            bad(p, "messages", "the messages cannot be rendered with the chat template: %s", kn_last_error());
            ok = false;
        } else ok = tokenize(p, prompt, need, job);
        free(prompt);
    }
    sb_free(&mj);
    sb_free(&tj);
    return ok;
}

static void get_stop(parse *p, int64_t v, srv_job *job) {
    const kn_json *j = p->j;
    if (v < 0 || kn_json_kind(j, v) == KN_JSON_NULL) return;
    int64_t first = v, n = 1;
    if (kn_json_kind(j, v) == KN_JSON_ARRAY) { first = kn_json_first(j, v); n = kn_json_count(j, v); }
    if (n > SRV_MAX_STOP) { bad(p, "stop", "'%s' has more than 8 strings", "stop"); return; }
    for (int64_t e = first; e >= 0 && n > 0; e = kn_json_next(j, e), n--) {
        size_t len;
        const char *s = get_text(p, e, "stop", &len);
        if (!s) return;
        if (len == 0 || len > SRV_MAX_STOP_LEN) { bad(p, "stop", "stop strings must be 1 to 256 bytes"); return; }
        job->stop[job->n_stop] = strdup(s);
        if (!job->stop[job->n_stop]) { bad(p, NULL, "out of memory"); return; }
        job->n_stop++;
        if (e == v) break;    /* a single string */
    }
}

/* logit_bias: {"token id": bias in [-100, 100]}, as OpenAI (-100 bans a
 * token, 100 all but forces it) */
static void get_bias(parse *p, int64_t v, srv_job *job) {
    const kn_json *j = p->j;
    if (v < 0 || kn_json_kind(j, v) == KN_JSON_NULL) return;
    int64_t n = kn_json_count(j, v);
    if (kn_json_kind(j, v) != KN_JSON_OBJECT) { bad(p, "logit_bias", "'logit_bias' must be an object of token ids"); return; }
    if (n > SRV_MAX_BIAS) { bad(p, "logit_bias", "'logit_bias' has more than %d entries", SRV_MAX_BIAS); return; }
    if (!n) return;
    job->bias_ids = malloc(sizeof(int32_t) * (size_t)n);
    job->bias_vals = malloc(sizeof(float) * (size_t)n);
    if (!job->bias_ids || !job->bias_vals) { bad(p, NULL, "out of memory"); return; }
    int32_t n_vocab = kn_tokenizer_n_vocab(p->ctx->tok);
    for (int64_t e = kn_json_first(j, v); e >= 0; e = kn_json_next(j, e)) {
        size_t klen;
        const char *key = kn_json_key(j, e, &klen);
        char *end = NULL;
        long id = strtol(key, &end, 10);
        double b;
        if (!*key || end != key + klen || key[0] == '-' || key[0] == '+' || key[0] == ' ' || id < 0 || id >= n_vocab) {
            bad(p, "logit_bias", "logit_bias keys must be token ids from 0 to %d, got '%.40s'", n_vocab - 1, key);
            return;
        }
        if (!kn_json_num(j, e, &b) || !(b >= -100 && b <= 100)) {
            bad(p, "logit_bias", "logit_bias values must be numbers from -100 to 100 (token %ld)", id);
            return;
        }
        job->bias_ids[job->n_bias] = (int32_t)id;
        job->bias_vals[job->n_bias++] = (float)b;
    }
}

/* fields accepted only at their neutral value (clients send them by default) */
static void neutral(parse *p, int64_t f, const char *key) {
    const kn_json *j = p->j;
    kn_json_type k = kn_json_kind(j, f);
    if (k == KN_JSON_NULL) return;
    int64_t i; bool b;
    if (!strcmp(key, "n") || !strcmp(key, "best_of")) {
        if (kn_json_int(j, f, &i) && i == 1) return;
        bad(p, key, "'%s' must be 1 (one choice per request)", key);
    } else if (!strcmp(key, "logprobs") || !strcmp(key, "echo")) {
        if (kn_json_bool(j, f, &b) && !b) return;
        if (!strcmp(key, "logprobs") && kn_json_int(j, f, &i) && i == 0) return;
        bad(p, key, "'%s' is not supported", key);
    } else if (!strcmp(key, "response_format")) {
        const char *t = kn_json_get_str(j, f, "type");
        if (t && !strcmp(t, "text")) return;
        bad(p, key, "'%s' must be {\"type\": \"text\"}", key);
    } else if (!strcmp(key, "suffix")) {
        bad(p, key, "'%s' is not supported", key);
    }
}

bool srv_parse_request(srv_ctx *ctx, srv_kind kind, const char *body, size_t len, srv_resp *r) {
    if (!ctx->tok) { srv_error(r, 503, NULL, "no model is loaded"); return false; }
    kn_json *j = NULL;
    if (!body || kn_json_parse(body, len, &j) != KN_OK) {
        srv_error(r, 400, NULL, "the body is not valid JSON: %s",
                  body ? kn_last_error() : "it is empty");
        return false;
    }
    parse p = {ctx, r, j, false};
    srv_job *job = srv_job_new();
    if (!job) { kn_json_free(j); srv_error(r, 500, NULL, "out of memory"); return false; }
    job->kind = kind;
    job->sp = kn_sampler_defaults();
    uint64_t nreq = atomic_fetch_add(&ctx->n_req, 1);
    job->sp.seed = ctx->seed_base ^ (nreq * 0x9E3779B97F4A7C15ull);
    if (kind == SRV_CHAT) snprintf(job->id, sizeof job->id, "chatcmpl-%llx%06llx", (unsigned long long)(ctx->seed_base & 0xffffffu), (unsigned long long)nreq);
    else snprintf(job->id, sizeof job->id, "cmpl-%llx%06llx", (unsigned long long)(ctx->seed_base & 0xffffffu), (unsigned long long)nreq);
    job->created = (int64_t)time(NULL);

    if (kn_json_kind(j, 0) != KN_JSON_OBJECT) bad(&p, NULL, "the body must be a JSON object");
    int64_t prompt = -1, max_tokens = -1, stream_opts = -1, tools = -1, tool_choice = -1;
    int64_t mt = 0; bool have_mt = false;
    for (int64_t f = kn_json_first(j, 0); !p.failed && f >= 0; f = kn_json_next(j, f)) {
        const char *key = kn_json_key(j, f, NULL);
        if (!strcmp(key, kind == SRV_CHAT ? "messages" : "prompt")) prompt = f;
        else if (!strcmp(key, "model")) { if (kn_json_kind(j, f) != KN_JSON_NULL) get_text(&p, f, "model", NULL); }
        else if (!strcmp(key, "max_tokens") || (kind == SRV_CHAT && !strcmp(key, "max_completion_tokens"))) max_tokens = f;
        else if (!strcmp(key, "temperature")) get_num(&p, f, key, 0, 2, &job->sp.temp);
        else if (!strcmp(key, "top_p")) {
            float tp = job->sp.top_p;
            get_num(&p, f, key, 0, 1, &tp);
            if (!p.failed && tp <= 0) bad(&p, key, "'%s' must be above 0", key);
            job->sp.top_p = tp;
        }
        else if (!strcmp(key, "min_p")) get_num(&p, f, key, 0, 1, &job->sp.min_p);
        else if (!strcmp(key, "top_k")) { int64_t k = job->sp.top_k; get_int(&p, f, key, 0, 1 << 20, &k, NULL); job->sp.top_k = (int)k; }
        else if (!strcmp(key, "presence_penalty")) get_num(&p, f, key, -2, 2, &job->sp.presence_penalty);
        else if (!strcmp(key, "frequency_penalty")) get_num(&p, f, key, -2, 2, &job->sp.freq_penalty);
        else if (!strcmp(key, "repeat_penalty")) get_num(&p, f, key, 0.01, 100, &job->sp.repeat_penalty);
        else if (!strcmp(key, "seed")) {
            int64_t s = 0; bool given = false;
            get_int(&p, f, key, INT64_MIN, INT64_MAX, &s, &given);
            if (given) job->sp.seed = (uint64_t)s;
        }
        else if (!strcmp(key, "stop")) get_stop(&p, f, job);
        else if (!strcmp(key, "logit_bias")) get_bias(&p, f, job);
        else if (!strcmp(key, "stream")) get_bool(&p, f, key, &job->stream);
        else if (!strcmp(key, "stream_options")) stream_opts = f;
        else if (!strcmp(key, "user")) { if (kn_json_kind(j, f) != KN_JSON_NULL) get_text(&p, f, "user", NULL); }
        else if (kind == SRV_CHAT && !strcmp(key, "tools")) tools = f;
        else if (kind == SRV_CHAT && !strcmp(key, "tool_choice")) tool_choice = f;
        else if (kind == SRV_CHAT && !strcmp(key, "parallel_tool_calls")) {
            bool b;   /* the templates let a model write several calls; nothing here stops it */
            get_bool(&p, f, key, &b);
        }
        else if (!strcmp(key, "n") || !strcmp(key, "best_of") || !strcmp(key, "logprobs") || !strcmp(key, "echo") ||
                 !strcmp(key, "suffix") || !strcmp(key, "response_format"))
            neutral(&p, f, key);
        else bad(&p, key, "unknown field '%s' (this server reads the OpenAI fields model, prompt or messages, "
                 "max_tokens, temperature, top_p, top_k, min_p, stop, seed, presence_penalty, frequency_penalty, "
                 "repeat_penalty, logit_bias, stream, stream_options, tools, tool_choice, parallel_tool_calls)", key);
    }
    if (!p.failed && stream_opts >= 0 && kn_json_kind(j, stream_opts) != KN_JSON_NULL) {
        if (kn_json_kind(j, stream_opts) != KN_JSON_OBJECT) bad(&p, "stream_options", "'%s' must be an object", "stream_options");
        else if (!job->stream) bad(&p, "stream_options", "'%s' is only allowed with \"stream\": true", "stream_options");
        for (int64_t f = kn_json_first(j, stream_opts); !p.failed && f >= 0; f = kn_json_next(j, f)) {
            const char *key = kn_json_key(j, f, NULL);
            if (!strcmp(key, "include_usage")) get_bool(&p, f, "stream_options.include_usage", &job->include_usage);
            else bad(&p, "stream_options", "unknown field 'stream_options.%s'", key);
        }
    }
    if (!p.failed) get_int(&p, max_tokens, "max_tokens", 1, ctx->max_tokens_cap, &mt, &have_mt);
    if (!p.failed) {
        if (kind == SRV_CHAT) chat_prompt(&p, prompt, tools, tool_choice, job);
        else completion_prompt(&p, prompt, job);
    }
    if (!p.failed) {
        int room = ctx->n_ctx_seq - job->n_prompt;
        if (job->n_prompt < 1) bad(&p, "prompt", "the prompt is empty");
        else if (room < 1 || (have_mt && mt > room)) {
            char msg[300];
            snprintf(msg, sizeof msg, "this model's context holds %d tokens; the prompt has %d%s%s", ctx->n_ctx_seq,
                     job->n_prompt, have_mt ? " and max_tokens asks for more than the rest" : "",
                     ": shorten the prompt or lower max_tokens");
            srv_error(r, 400, kind == SRV_CHAT ? "messages" : "prompt", "%s", msg);
            p.failed = true;
        } else job->max_tokens = have_mt ? (int)mt : room;
    }
    kn_json_free(j);
    if (p.failed) { srv_job_unref(job); return false; }
    r->job = job;
    return true;
}

/* ---- replies ---------------------------------------------------------------------------- */
static void head(const srv_ctx *ctx, const srv_job *j, jw *w, bool chunk) {
    jw_obj(w);
    jw_kstr(w, "id", j->id);
    jw_kstr(w, "object", j->kind == SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    jw_kint(w, "created", j->created);
    jw_kstr(w, "model", ctx->model_id);
    jw_kstr(w, "system_fingerprint", "kiln");
}

static void usage(const srv_job *j, jw *w) {
    jw_key(w, "usage");
    jw_obj(w);
    jw_kint(w, "prompt_tokens", j->n_prompt);
    jw_kint(w, "completion_tokens", j->n_gen);
    jw_kint(w, "total_tokens", (int64_t)j->n_prompt + j->n_gen);
    jw_obj_end(w);
}

void srv_reply_full(const srv_ctx *ctx, const srv_job *j, const char *text, size_t n, sbuf *out) {
    jw w;
    jw_init(&w, out);
    head(ctx, j, &w, false);
    jw_key(&w, "choices");
    jw_arr(&w);
    jw_obj(&w);
    jw_kint(&w, "index", 0);
    srv_tool_calls tc = {0};
    size_t content = n;
    bool called = j->kind == SRV_CHAT && j->tools && srv_tool_parse(text, n, &content, &tc);
    if (j->kind == SRV_CHAT) {
        jw_key(&w, "message");
        jw_obj(&w);
        jw_kstr(&w, "role", "assistant");
        jw_key(&w, "content");
        if (called && content == 0) jw_null(&w);
        else jw_strn(&w, text, content);
        if (called) { jw_key(&w, "tool_calls"); srv_tool_calls_json(j, &tc, false, &w); }
        jw_obj_end(&w);
    } else {
        jw_key(&w, "text");
        jw_strn(&w, text, n);
    }
    srv_tool_calls_free(&tc);
    jw_knull(&w, "logprobs");
    jw_kstr(&w, "finish_reason", called ? "tool_calls" : j->finish ? j->finish : "stop");
    jw_obj_end(&w);
    jw_arr_end(&w);
    usage(j, &w);
    jw_obj_end(&w);
}

static void sse_open(sbuf *out) { sb_puts(out, "data: "); }
static void sse_close(sbuf *out) { sb_puts(out, "\n\n"); }

void srv_sse_chunk(const srv_ctx *ctx, const srv_job *j, const char *text, size_t n, bool first, sbuf *out) {
    jw w;
    jw_init(&w, out);
    sse_open(out);
    head(ctx, j, &w, true);
    jw_key(&w, "choices");
    jw_arr(&w);
    jw_obj(&w);
    jw_kint(&w, "index", 0);
    if (j->kind == SRV_CHAT) {
        jw_key(&w, "delta");
        jw_obj(&w);
        if (first) jw_kstr(&w, "role", "assistant");
        jw_key(&w, "content");
        jw_strn(&w, text, n);
        jw_obj_end(&w);
    } else {
        jw_key(&w, "text");
        jw_strn(&w, text, n);
    }
    jw_knull(&w, "logprobs");
    jw_knull(&w, "finish_reason");
    jw_obj_end(&w);
    jw_arr_end(&w);
    if (j->include_usage) jw_knull(&w, "usage");
    jw_obj_end(&w);
    sse_close(out);
}

void srv_sse_end(const srv_ctx *ctx, const srv_job *j, sbuf *out) {
    jw w;
    jw_init(&w, out);
    sse_open(out);
    head(ctx, j, &w, true);
    jw_key(&w, "choices");
    jw_arr(&w);
    jw_obj(&w);
    jw_kint(&w, "index", 0);
    if (j->kind == SRV_CHAT) { jw_key(&w, "delta"); jw_obj(&w); jw_obj_end(&w); }
    else jw_kstr(&w, "text", "");
    jw_knull(&w, "logprobs");
    jw_kstr(&w, "finish_reason", j->called ? "tool_calls" : j->finish ? j->finish : "stop");
    jw_obj_end(&w);
    jw_arr_end(&w);
    if (j->include_usage) jw_knull(&w, "usage");
    jw_obj_end(&w);
    sse_close(out);
    if (j->include_usage) {    /* OpenAI: a last chunk with no choices and the usage */
        jw_init(&w, out);
        sse_open(out);
        head(ctx, j, &w, true);
        jw_key(&w, "choices");
        jw_arr(&w);
        jw_arr_end(&w);
        usage(j, &w);
        jw_obj_end(&w);
        sse_close(out);
    }
    sb_puts(out, "data: [DONE]\n\n");
}

void srv_sse_tool_calls(const srv_ctx *ctx, const srv_job *j, const srv_tool_calls *tc, sbuf *out) {
    jw w;
    jw_init(&w, out);
    sse_open(out);
    head(ctx, j, &w, true);
    jw_key(&w, "choices");
    jw_arr(&w);
    jw_obj(&w);
    jw_kint(&w, "index", 0);
    jw_key(&w, "delta");
    jw_obj(&w);
    jw_key(&w, "tool_calls");
    srv_tool_calls_json(j, tc, true, &w);
    jw_obj_end(&w);
    jw_knull(&w, "logprobs");
    jw_knull(&w, "finish_reason");
    jw_obj_end(&w);
    jw_arr_end(&w);
    if (j->include_usage) jw_knull(&w, "usage");
    jw_obj_end(&w);
    sse_close(out);
}

void srv_sse_text(const srv_ctx *ctx, srv_job *j, srv_tstream *ts, const char *text, size_t n, bool first, bool done,
                  sbuf *out) {
    if (!j->tools || j->kind != SRV_CHAT) {
        if (n || first) srv_sse_chunk(ctx, j, text, n, first, out);
        if (done) srv_sse_end(ctx, j, out);
        return;
    }
    sb_add(&ts->acc, text, n);
    const char *a = ts->acc.p ? ts->acc.p : "";
    size_t len = ts->acc.len, upto;
    srv_tool_calls tc = {0};
    bool called = false;
    if (done) {
        called = srv_tool_parse(a, len, &upto, &tc);
        if (upto < ts->sent) upto = ts->sent;
    } else upto = srv_tool_stream_safe(a, len, ts->sent);
    if (upto > ts->sent || first) srv_sse_chunk(ctx, j, a + ts->sent, upto - ts->sent, first, out);
    ts->sent = upto;
    if (called) { srv_sse_tool_calls(ctx, j, &tc, out); j->called = true; }
    srv_tool_calls_free(&tc);
    if (done) srv_sse_end(ctx, j, out);
}

void srv_sse_error(const srv_job *j, sbuf *out) {
    sse_open(out);
    srv_error_json(out, j->err_status, j->err, NULL);
    sse_close(out);
    sb_puts(out, "data: [DONE]\n\n");
}
