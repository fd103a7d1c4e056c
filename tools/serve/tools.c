/* tools.c: tool calls for `kiln serve`: JSON values copied from a request
 * into the template's input, and the calls a model wrote read back out of
 * its text.
 *
 * The syntaxes read (what the chat templates of these families ask for):
 *   - Qwen2.5 / Qwen3 / Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
 *     one block per call (the last one may lack its closing tag when the
 *     model stopped at an end-of-turn token); the text before the first
 *     block is the message's content.
 *   - Llama 3.x: the whole reply is {"name": ..., "parameters": {...}} (or
 *     "arguments"), optionally after <|python_tag|>, or a JSON array of such
 *     objects.
 *   - Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...].
 * Anything else, including a block that is not valid JSON, is plain content:
 * the reply never fails because of what the model wrote. Text after the last
 * call is dropped (the templates render a call as the end of the turn).
 *
 * Arguments are returned as JSON text (OpenAI's form, a string holding an
 * object); a string given as arguments is kept as it is. Call ids are 9
 * letters and digits derived from the request id, so Mistral's template
 * (which insists on exactly 9) accepts them when a client sends them back.
 */
#include "serve.h"
#include "formats/hfconfig.h"   /* kn_json */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- copying JSON values ---------------------------------------------------------------- */
static bool copy_value(const kn_json *j, int64_t v, jw *w, int depth) {
    if (depth > 24) return false;                 /* jw nests 32 deep; the callers add a few */
    switch (kn_json_kind(j, v)) {
    case KN_JSON_NULL: jw_null(w); return true;
    case KN_JSON_BOOL: { bool b = false; kn_json_bool(j, v, &b); jw_bool(w, b); return true; }
    case KN_JSON_NUMBER: {
        int64_t i;
        double d = 0;
        if (kn_json_is_int_literal(j, v) && kn_json_int(j, v, &i)) { jw_int(w, i); return true; }
        kn_json_num(j, v, &d);
        char buf[40];
        snprintf(buf, sizeof buf, "%.17g", d);   /* round-trips; the template prints it shortest */
        if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");   /* stays a float (not inf/nan: kn_json has none) */
        jw_raw(w, buf);
        return true;
    }
    case KN_JSON_STRING: { size_t n; const char *s = kn_json_str(j, v, &n); jw_strn(w, s, n); return true; }
    case KN_JSON_ARRAY:
        jw_arr(w);
        for (int64_t e = kn_json_first(j, v); e >= 0; e = kn_json_next(j, e))
            if (!copy_value(j, e, w, depth + 1)) return false;
        jw_arr_end(w);
        return true;
    case KN_JSON_OBJECT:
        jw_obj(w);
        for (int64_t e = kn_json_first(j, v); e >= 0; e = kn_json_next(j, e)) {
            size_t kl;
            const char *k = kn_json_key(j, e, &kl);
            jw_keyn(w, k, kl);
            if (!copy_value(j, e, w, depth + 1)) return false;
        }
        jw_obj_end(w);
        return true;
    }
    return false;
}

bool srv_json_copy(const kn_json *j, int64_t v, jw *w) { return copy_value(j, v, w, 0); }

/* ---- reading calls back ------------------------------------------------------------------ */
void srv_tool_calls_free(srv_tool_calls *tc) {
    for (int i = 0; i < tc->n; i++) { free(tc->v[i].name); free(tc->v[i].args); }
    free(tc->v);
    memset(tc, 0, sizeof *tc);
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* one call object {"name": string, "arguments"|"parameters": object|string} -> tc */
static bool add_call(srv_tool_calls *tc, const kn_json *j, int64_t obj) {
    if (kn_json_kind(j, obj) != KN_JSON_OBJECT) return false;
    int64_t nv = kn_json_get(j, obj, "name");
    int64_t av = kn_json_get(j, obj, "arguments");
    if (av < 0) av = kn_json_get(j, obj, "parameters");
    size_t nl;
    const char *name = nv >= 0 ? kn_json_str(j, nv, &nl) : NULL;
    if (!name || !nl || memchr(name, 0, nl)) return false;
    kn_json_type ak = kn_json_kind(j, av);
    if (av >= 0 && ak != KN_JSON_OBJECT && ak != KN_JSON_STRING) return false;
    sbuf args = {0};
    if (av < 0) sb_puts(&args, "{}");
    else if (ak == KN_JSON_STRING) { size_t n; const char *s = kn_json_str(j, av, &n); sb_add(&args, s, n); sb_puts(&args, ""); }
    else {
        jw w;
        jw_init(&w, &args);
        if (!copy_value(j, av, &w, 1)) { sb_free(&args); return false; }
    }
    srv_tool_call *nvv = realloc(tc->v, sizeof *nvv * (size_t)(tc->n + 1));
    char *nm = malloc(nl + 1);
    char *a = sb_take(&args);
    if (!nvv || !nm || !a || args.oom) { free(nm); free(a); if (nvv) tc->v = nvv; return false; }
    tc->v = nvv;
    memcpy(nm, name, nl);
    nm[nl] = 0;
    tc->v[tc->n++] = (srv_tool_call){nm, a};
    return true;
}

/* text is one call object, or an array of them */
static bool parse_calls_json(srv_tool_calls *tc, const char *s, size_t n, bool array_ok) {
    kn_json *j = NULL;
    if (kn_json_parse(s, n, &j) != KN_OK) return false;
    bool ok = true;
    if (kn_json_kind(j, 0) == KN_JSON_ARRAY && array_ok) {
        if (kn_json_count(j, 0) < 1) ok = false;
        for (int64_t e = kn_json_first(j, 0); ok && e >= 0; e = kn_json_next(j, e)) ok = add_call(tc, j, e);
    } else ok = add_call(tc, j, 0);
    kn_json_free(j);
    return ok;
}

static const char *find(const char *s, size_t n, const char *what) {
    return memmem(s, n, what, strlen(what));
}

static size_t rtrim(const char *s, size_t n) {
    while (n > 0 && is_ws(s[n - 1])) n--;
    return n;
}

static const char TC_OPEN[] = "<tool_call>", TC_CLOSE[] = "</tool_call>";
static const char PY_TAG[] = "<|python_tag|>", MI_TAG[] = "[TOOL_CALLS]";

bool srv_tool_parse(const char *text, size_t n, size_t *content_len, srv_tool_calls *tc) {
    memset(tc, 0, sizeof *tc);
    *content_len = n;
    size_t lead = 0;
    while (lead < n && is_ws(text[lead])) lead++;
    const char *s = text + lead;
    size_t m = n - lead;
    bool ok = false;
    const char *open = find(text, n, TC_OPEN);
    if (open) {                                           /* Qwen / Hermes blocks */
        ok = true;
        const char *p = open, *end = text + n;
        while (ok && p) {
            const char *body = p + sizeof TC_OPEN - 1;
            const char *close = find(body, (size_t)(end - body), TC_CLOSE);
            const char *stop = close ? close : end;
            ok = parse_calls_json(tc, body, (size_t)(stop - body), false);
            if (!close) break;
            const char *after = close + sizeof TC_CLOSE - 1;
            p = find(after, (size_t)(end - after), TC_OPEN);
        }
        if (ok) *content_len = rtrim(text, (size_t)(open - text));
    } else if (m >= sizeof MI_TAG - 1 && !memcmp(s, MI_TAG, sizeof MI_TAG - 1)) {   /* Mistral */
        ok = parse_calls_json(tc, s + sizeof MI_TAG - 1, m - (sizeof MI_TAG - 1), true);
        if (ok) *content_len = 0;
    } else {                                              /* Llama 3.x: the whole reply */
        if (m >= sizeof PY_TAG - 1 && !memcmp(s, PY_TAG, sizeof PY_TAG - 1)) { s += sizeof PY_TAG - 1; m -= sizeof PY_TAG - 1; }
        if (m > 0 && (s[0] == '{' || s[0] == '[')) ok = parse_calls_json(tc, s, m, true);
        if (ok) *content_len = 0;
    }
    if (!ok || tc->n == 0) { srv_tool_calls_free(tc); *content_len = n; return false; }
    return true;
}

/* a prefix of what, that text[..n) ends with (the longest), or 0 */
static size_t partial_suffix(const char *text, size_t n, const char *what) {
    size_t w = strlen(what);
    for (size_t k = w - 1 < n ? w - 1 : n; k > 0; k--)
        if (!memcmp(text + n - k, what, k)) return k;
    return 0;
}

size_t srv_tool_stream_safe(const char *text, size_t n, size_t sent) {
    if (sent == 0) {                        /* could the reply be a call as a whole? hold it */
        size_t i = 0;
        while (i < n && is_ws(text[i])) i++;
        if (i == n) return 0;
        const char *s = text + i;
        size_t m = n - i;
        if (s[0] == '{' || s[0] == '[') return 0;
        if (!memcmp(s, PY_TAG, m < sizeof PY_TAG - 1 ? m : sizeof PY_TAG - 1)) return 0;
        if (!memcmp(s, MI_TAG, m < sizeof MI_TAG - 1 ? m : sizeof MI_TAG - 1)) return 0;
    }
    const char *open = find(text, n, TC_OPEN);
    size_t safe = open ? (size_t)(open - text) : n - partial_suffix(text, n, TC_OPEN);
    safe = rtrim(text, safe);               /* whitespace before a call is not content */
    return safe > sent ? safe : sent;
}

void srv_tool_call_id(const srv_job *j, int i, char out[10]) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull;                 /* FNV-1a of the request id and index */
    for (const char *p = j->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)i) * 1099511628211ull;
    for (int k = 0; k < 9; k++) { out[k] = al[h % 62]; h = h / 62 ^ (h << 7) ^ ((uint64_t)k * 0x9E3779B97F4A7C15ull); }
    out[9] = 0;
}

void srv_tool_calls_json(const srv_job *j, const srv_tool_calls *tc, bool stream, jw *w) {
    jw_arr(w);
    for (int i = 0; i < tc->n; i++) {
        char id[10];
        srv_tool_call_id(j, i, id);
        jw_obj(w);
        if (stream) jw_kint(w, "index", i);
        jw_kstr(w, "id", id);
        jw_kstr(w, "type", "function");
        jw_key(w, "function");
        jw_obj(w);
        jw_kstr(w, "name", tc->v[i].name);
        jw_kstr(w, "arguments", tc->v[i].args);
        jw_obj_end(w);
        jw_obj_end(w);
    }
    jw_arr_end(w);
}
