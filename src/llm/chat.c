/* chat.c: chat templates (see kiln_chat.h): a model's Jinja template runs
 * through the interpreter (src/llm/jinja_*.c); the built-in families
 * (chatml, smollm, llama2, llama3, plain) are rendered in C. This file turns
 * messages (kn_chat_msg, or OpenAI-style JSON) into the template's
 * variables as transformers does and copies the result out.
 * Non-goals: continue_final_message, assistant masks, documents.
 */
#include "kiln_chat.h"
#include "formats/gguf.h"       /* defines: kn_gguf_get_str, kn_gguf_arr_str */
#include "formats/hfconfig.h"   /* defines: kn_json_parse */
#include "llm/jinja_impl.h"     /* defines: jinja_compile, jinja_render, values */
#include "llm/jinja_json.h"     /* defines: jinja_from_json */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SMOLLM_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
static const char HINT[] = "pass --chat-template chatml|llama2|llama3|smollm|plain to use a built-in one";

/* ========================================================================== */
/* making templates                                                           */
/* ========================================================================== */

kn_status kn_chat_template_from_string(const char *jinja, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_string: out is NULL");
    memset(out, 0, sizeof *out);
    if (!jinja) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_string: template is NULL");
    jprog *p;
    kn_status st = jinja_compile(jinja, strlen(jinja), &p);
    if (st != KN_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn_set_error(st == KN_ERR_LIMIT ? KN_ERR_INVALID : st, "%s; %s", msg, HINT);
    }
    out->format = KN_CHAT_JINJA;
    out->prog = p;
    return KN_OK;
}

static void token_text(const struct kn_gguf *g, const char *key, char *dst, size_t cap) {
    int64_t id; kn_gguf_type et; uint64_t n; const void *data;
    dst[0] = 0;
    if (!kn_gguf_get_i64(g, key, &id) || id < 0) return;
    if (!kn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) || (uint64_t)id >= n) return;
    kn_gguf_str s = kn_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)id);
    if (s.ptr && s.len < cap) { memcpy(dst, s.ptr, s.len); dst[s.len] = 0; }
}

kn_status kn_chat_template_from_gguf(const struct kn_gguf *g, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_gguf: out is NULL");
    memset(out, 0, sizeof *out);
    kn_gguf_str s;
    if (!g || !kn_gguf_get_str(g, "tokenizer.chat_template", &s))
        return kn_set_error(KN_ERR_UNSUPPORTED, "the model file has no tokenizer.chat_template; %s", HINT);
    char *j = malloc(s.len + 1);
    if (!j) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    memcpy(j, s.ptr, s.len);
    j[s.len] = 0;
    /* an embedded NUL would hide the rest of the template: treat as the end */
    kn_status st = kn_chat_template_from_string(j, out);
    free(j);
    if (st != KN_OK) return st;
    token_text(g, "tokenizer.ggml.bos_token_id", out->bos_token, sizeof out->bos_token);
    token_text(g, "tokenizer.ggml.eos_token_id", out->eos_token, sizeof out->eos_token);
    return KN_OK;
}

kn_status kn_chat_template_family_of(const char *jinja, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_family_of: out is NULL");
    memset(out, 0, sizeof *out);
    if (jinja && strstr(jinja, "<|im_start|>")) out->format = KN_CHAT_CHATML;
    else if (jinja && strstr(jinja, "<|start_header_id|>")) out->format = KN_CHAT_LLAMA3;
    else if (jinja && strstr(jinja, "[INST]")) out->format = KN_CHAT_LLAMA2;
    else return kn_set_error(KN_ERR_UNSUPPORTED, "the chat template is none of the built-in families; %s", HINT);
    return KN_OK;
}

kn_status kn_chat_template_set_tokens(kn_chat_tmpl *t, const char *bos, const char *eos) {
    if (!t) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_set_tokens: template is NULL");
    if ((bos && strlen(bos) >= sizeof t->bos_token) || (eos && strlen(eos) >= sizeof t->eos_token))
        return kn_set_error(KN_ERR_LIMIT, "kn_chat_template_set_tokens: a token longer than %zu bytes", sizeof t->bos_token - 1);
    snprintf(t->bos_token, sizeof t->bos_token, "%s", bos ? bos : "");
    snprintf(t->eos_token, sizeof t->eos_token, "%s", eos ? eos : "");
    return KN_OK;
}

kn_status kn_chat_template_from_name(const char *name, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_name: out is NULL");
    memset(out, 0, sizeof *out);
    if (name && strcmp(name, "chatml") == 0) { out->format = KN_CHAT_CHATML; return KN_OK; }
    if (name && strcmp(name, "smollm") == 0) {
        out->format = KN_CHAT_CHATML;
        memcpy(out->default_system, SMOLLM_SYSTEM, sizeof SMOLLM_SYSTEM);
        return KN_OK;
    }
    if (name && strcmp(name, "llama2") == 0) { out->format = KN_CHAT_LLAMA2; return KN_OK; }
    if (name && strcmp(name, "llama3") == 0) { out->format = KN_CHAT_LLAMA3; return KN_OK; }
    if (name && strcmp(name, "plain") == 0) { out->format = KN_CHAT_PLAIN; return KN_OK; }
    return kn_set_error(KN_ERR_UNSUPPORTED, "unknown chat template name '%s'; use chatml, llama2, llama3, "
                        "smollm or plain", name ? name : "(null)");
}

void kn_chat_tmpl_free(kn_chat_tmpl *tmpl) {
    if (!tmpl) return;
    jinja_free(tmpl->prog);
    tmpl->prog = NULL;
    if (tmpl->format == KN_CHAT_JINJA) tmpl->format = 0;
}

/* ========================================================================== */
/* rendering                                                                  */
/* ========================================================================== */

typedef struct sbuf { char *p; size_t cap, n; } sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->n + n < b->cap) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* content with surrounding whitespace removed (Jinja trim / Python strip) */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && is_ws(s[i])) i++;
    while (n > i && is_ws(s[n - 1])) n--;
    put(b, s + i, n - i);
}

static kn_status render_chatml(const kn_chat_tmpl *t, const kn_chat_msg *m, size_t n, bool gen, sbuf *b) {
    if (n > 0 && t->default_system[0] && strcmp(m[0].role, "system") != 0) {
        puts_(b, "<|im_start|>system\n"); puts_(b, t->default_system); puts_(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>"); puts_(b, m[i].role); puts_(b, "\n");
        puts_(b, m[i].content); puts_(b, "<|im_end|>\n");
    }
    if (gen) puts_(b, "<|im_start|>assistant\n");
    return KN_OK;
}

static kn_status render_llama3(const kn_chat_msg *m, size_t n, bool gen, sbuf *b) {
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|start_header_id|>"); puts_(b, m[i].role); puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content); puts_(b, "<|eot_id|>");
    }
    if (gen) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KN_OK;
}

static kn_status render_llama2(const kn_chat_msg *m, size_t n, sbuf *b) {
    const char *sys = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) { sys = m[0].content; m++; n--; }
    for (size_t i = 0; i < n; i++) {
        bool user = strcmp(m[i].role, "user") == 0, asst = strcmp(m[i].role, "assistant") == 0;
        if ((i % 2 == 0 && !user) || (i % 2 == 1 && !asst))
            return kn_set_error(KN_ERR_INVALID, "llama2 chat template: message %zu has role '%s'; after an "
                                "optional first system message, roles must alternate user/assistant",
                                i + (sys != NULL), m[i].role);
        if (user) {
            puts_(b, i == 0 ? "[INST] " : "<s>[INST] ");
            if (i == 0 && sys) {
                /* strip() applies to the whole "<<SYS>>...user" string */
                puts_(b, "<<SYS>>\n"); puts_(b, sys); puts_(b, "\n<</SYS>>\n\n");
                const char *c = m[i].content; size_t cn = strlen(c);
                while (cn > 0 && is_ws(c[cn - 1])) cn--;
                put(b, c, cn);
            } else {
                put_trimmed(b, m[i].content);
            }
            puts_(b, " [/INST]");
        } else {
            puts_(b, " "); put_trimmed(b, m[i].content); puts_(b, " </s>");
        }
    }
    return KN_OK;
}

/* "User: hello\nAssistant: hi\nUser: ...\nAssistant:": the role with its first
 * letter upper-cased (ASCII), content trimmed; nothing a small vocabulary
 * cannot encode. */
static kn_status render_plain(const kn_chat_msg *m, size_t n, bool gen, sbuf *b) {
    for (size_t i = 0; i < n; i++) {
        const char *r = m[i].role;
        char first = r[0] >= 'a' && r[0] <= 'z' ? (char)(r[0] - 'a' + 'A') : r[0];
        if (first) { put(b, &first, 1); puts_(b, r + 1); }
        puts_(b, ": ");
        put_trimmed(b, m[i].content);
        puts_(b, "\n");
    }
    if (gen) puts_(b, "Assistant:");
    return KN_OK;
}


static kn_status render_family(const kn_chat_tmpl *t, const kn_chat_msg *m, size_t n, bool gen, sbuf *b) {
    switch (t->format) {
    case KN_CHAT_CHATML: return render_chatml(t, m, n, gen, b);
    case KN_CHAT_LLAMA3: return render_llama3(m, n, gen, b);
    case KN_CHAT_LLAMA2: return render_llama2(m, n, b);
    case KN_CHAT_PLAIN: return render_plain(m, n, gen, b);
    default:
        return kn_set_error(KN_ERR_INVALID, "kn_chat_apply: template format %d is not set; initialise it "
                            "with kn_chat_template_from_*", (int)t->format);
    }
}

/* the NUL and the KN_ERR_LIMIT contract shared by both entry points */
static kn_status finish(sbuf *b, char *buf, size_t cap, size_t *needed) {
    *needed = b->n;
    if (b->n + 1 > cap) {
        if (cap > 0) buf[0] = 0;
        return kn_set_error(KN_ERR_LIMIT, "kn_chat_apply: %zu bytes (+1 for NUL) do not fit in %zu; call "
                            "again with a buffer of *needed + 1 bytes", b->n, cap);
    }
    buf[b->n] = 0;
    return KN_OK;
}

/* ========================================================================== */
/* the interpreter's variables                                                */
/* ========================================================================== */

#define OOM_T() kn_set_error(KN_ERR_INVALID, "chat request: the conversation needs more than the template memory limit")

static bool set_str(jarena *a, jdict *d, const char *k, const char *v) {
    return jd_set(a, d, jv_str(k, strlen(k)), jv_str(v, strlen(v)));
}

/* render ctx (messages etc. already in it) and append to b */
static kn_status render_prog(const kn_chat_tmpl *t, jarena *a, jdict *ctx, bool gen, bool keep_bos, sbuf *b) {
    jv g = jv_bool(gen), none = jv_none();
    if (!jd_set(a, ctx, jv_str("add_generation_prompt", 21), g)) return OOM_T();
    if (!jd_get(ctx, "tools", 5) && !jd_set(a, ctx, jv_str("tools", 5), none)) return OOM_T();
    if (!jd_get(ctx, "documents", 9) && !jd_set(a, ctx, jv_str("documents", 9), none)) return OOM_T();
    if (t->bos_token[0] && !jd_get(ctx, "bos_token", 9) && !set_str(a, ctx, "bos_token", t->bos_token)) return OOM_T();
    if (t->eos_token[0] && !jd_get(ctx, "eos_token", 9) && !set_str(a, ctx, "eos_token", t->eos_token)) return OOM_T();
    jbuf out = {.a = a};
    kn_status st = jinja_render(t->prog, a, ctx, &out);
    if (st == KN_ERR_LIMIT) {
        /* KN_ERR_LIMIT from kn_chat_apply means "buffer too small": a template
         * that exceeds the interpreter's limits is an invalid template */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn_set_error(KN_ERR_INVALID, "%s", msg);
    }
    if (st != KN_OK) return st;
    const char *p = out.p ? out.p : "";
    size_t n = out.n;
    /* only a BOS the template wrote: SmolLM2's bos_token is <|im_start|>, which its
     * template writes as a literal at the start of every turn */
    const jv *bos = ((const jprog *)t->prog)->uses_bos ? jd_get(ctx, "bos_token", 9) : NULL;
    if (!keep_bos && bos && bos->t == JV_STR && bos->s.n && n >= bos->s.n && memcmp(p, bos->s.p, bos->s.n) == 0) {
        p += bos->s.n; n -= bos->s.n;
    }
    put(b, p, n);
    return KN_OK;
}

static kn_status apply_prog_msgs(const kn_chat_tmpl *t, const kn_chat_msg *m, size_t n, bool gen, sbuf *b) {
    jarena a = {.limit = JINJA_MAX_MEMORY};
    kn_status st = KN_OK;
    jdict *ctx = jd_new(&a, 8);
    jlist *l = jl_new(&a, n);
    if (!ctx || !l) { st = OOM_T(); goto done; }
    for (size_t i = 0; i < n; i++) {
        jdict *d = jd_new(&a, 2);
        if (!d || !set_str(&a, d, "role", m[i].role) || !set_str(&a, d, "content", m[i].content)) { st = OOM_T(); goto done; }
        l->v[l->n].t = JV_DICT; l->v[l->n].d = d; l->n++;
    }
    jv msgs = {0}; msgs.t = JV_LIST; msgs.l = l;
    if (!jd_set(&a, ctx, jv_str("messages", 8), msgs)) { st = OOM_T(); goto done; }
    st = render_prog(t, &a, ctx, gen, false, b);
done:
    ja_free(&a);
    return st;
}

kn_status kn_chat_apply(const kn_chat_tmpl *tmpl, const kn_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, char *buf, size_t cap, size_t *needed) {
    if (needed) *needed = 0;
    if (!tmpl || !needed || (n > 0 && !msgs) || (cap > 0 && !buf))
        return kn_set_error(KN_ERR_INVALID, "kn_chat_apply: NULL template, messages, buf or needed");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return kn_set_error(KN_ERR_INVALID, "kn_chat_apply: message %zu has a NULL role or content", i);
    sbuf b = {buf, cap, 0};
    kn_status st;
    if (tmpl->format == KN_CHAT_JINJA && tmpl->prog) st = apply_prog_msgs(tmpl, msgs, n, add_generation_prompt, &b);
    else st = render_family(tmpl, msgs, n, add_generation_prompt, &b);
    if (st != KN_OK) { if (cap > 0) buf[0] = 0; return st; }
    return finish(&b, buf, cap, needed);
}

/* ========================================================================== */
/* JSON requests                                                              */
/* ========================================================================== */

static kn_status parse_json(const char *what, const char *text, kn_json **j) {
    kn_status st = kn_json_parse(text, strlen(text), j);
    if (st != KN_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn_set_error(st, "chat request: %s is not valid JSON: %s", what, msg);
    }
    return KN_OK;
}

/* OpenAI's arguments string -> object, when it parses as one */
static kn_status parse_arguments(jarena *a, jdict *msg) {
    const jv *tc = jd_get(msg, "tool_calls", 10);
    if (!tc || tc->t != JV_LIST) return KN_OK;
    for (size_t i = 0; i < tc->l->n; i++) {
        jv call = tc->l->v[i];
        if (call.t != JV_DICT) continue;
        const jv *fn = jd_get(call.d, "function", 8);
        jdict *holder = fn && fn->t == JV_DICT ? fn->d : call.d;
        const jv *args = jd_get(holder, "arguments", 9);
        if (!args || args->t != JV_STR) continue;
        kn_json *j;
        char *z = ja_alloc(a, args->s.n + 1);
        if (!z) return OOM_T();
        memcpy(z, args->s.p, args->s.n);
        if (kn_json_parse(z, args->s.n, &j) != KN_OK) continue;   /* not JSON: left as the string */
        jv v;
        kn_status st = jinja_from_json(a, j, 0, &v, 0);
        kn_json_free(j);
        if (st != KN_OK) return st;
        if (v.t == JV_DICT && !jd_set(a, holder, jv_str("arguments", 9), v)) return OOM_T();
    }
    return KN_OK;
}

/* transformers' normalisation: drop null members, alias reasoning fields */
static kn_status normalise_msg(jarena *a, jv in, size_t i, bool parse_args, jv *out) {
    if (in.t != JV_DICT) return kn_set_error(KN_ERR_INVALID, "chat request: message %zu is not an object", i);
    jdict *d = jd_new(a, in.d->n + 2);
    if (!d) return OOM_T();
    for (size_t k = 0; k < in.d->n; k++)
        if (in.d->v[k].t != JV_NONE && !jd_set(a, d, in.d->k[k], in.d->v[k])) return OOM_T();
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    const jv *r = NULL;
    for (int f = 0; f < 3 && !r; f++) r = jd_get(d, fields[f], strlen(fields[f]));
    if (r) {
        jv rv = *r;
        jdict *e = jd_new(a, d->n + 2);
        if (!e || !jd_set(a, e, jv_str("thinking", 8), rv)) return OOM_T();
        for (size_t k = 0; k < d->n; k++) if (!jd_set(a, e, d->k[k], d->v[k])) return OOM_T();
        if (!jd_set(a, e, jv_str("reasoning_content", 17), rv)) return OOM_T();
        d = e;
    }
    if (parse_args) { kn_status st = parse_arguments(a, d); if (st != KN_OK) return st; }
    out->t = JV_DICT; out->d = d;
    return KN_OK;
}

static kn_status load_json(jarena *a, const char *what, const char *text, kn_json_type want, jv *out) {
    kn_json *j;
    kn_status st = parse_json(what, text, &j);
    if (st != KN_OK) return st;
    if (kn_json_kind(j, 0) != want) {
        kn_json_free(j);
        return kn_set_error(KN_ERR_INVALID, "chat request: %s must be a JSON %s", what, want == KN_JSON_ARRAY ? "array" : "object");
    }
    st = jinja_from_json(a, j, 0, out, 0);
    kn_json_free(j);
    return st;
}

/* built-in families: text-only messages */
static kn_status apply_family_json(const kn_chat_tmpl *t, jv msgs, const kn_chat_request *req, sbuf *b) {
    if (req->tools_json) return kn_set_error(KN_ERR_UNSUPPORTED, "chat request: the built-in templates have no tools; "
                                             "use the model's own chat template");
    size_t n = msgs.l->n;
    kn_chat_msg *m = calloc(n ? n : 1, sizeof *m);
    if (!m) return kn_set_error(KN_ERR_NOMEM, "chat request: out of memory");
    kn_status st = KN_OK;
    char **owned = calloc(n ? n * 2 : 1, sizeof *owned);
    if (!owned) { free(m); return kn_set_error(KN_ERR_NOMEM, "chat request: out of memory"); }
    for (size_t i = 0; i < n && st == KN_OK; i++) {
        jv d = msgs.l->v[i];
        const jv *role = d.t == JV_DICT ? jd_get(d.d, "role", 4) : NULL, *content = d.t == JV_DICT ? jd_get(d.d, "content", 7) : NULL;
        if (!role || role->t != JV_STR) { st = kn_set_error(KN_ERR_INVALID, "chat request: message %zu has no string \"role\"", i); break; }
        if (content && content->t != JV_STR && content->t != JV_NONE) {
            st = kn_set_error(KN_ERR_UNSUPPORTED, "chat request: message %zu: the built-in templates take text content only; "
                              "use the model's own chat template", i);
            break;
        }
        if (jd_get(d.d, "tool_calls", 10)) {
            st = kn_set_error(KN_ERR_UNSUPPORTED, "chat request: message %zu has tool_calls, which the built-in templates "
                              "cannot render; use the model's own chat template", i);
            break;
        }
        /* the JSON strings may hold NUL (\u0000); the C renderers stop there, as for kn_chat_apply */
        owned[2 * i] = strndup(role->s.p, role->s.n);
        owned[2 * i + 1] = content && content->t == JV_STR ? strndup(content->s.p, content->s.n) : strdup("");
        if (!owned[2 * i] || !owned[2 * i + 1]) { st = kn_set_error(KN_ERR_NOMEM, "chat request: out of memory"); break; }
        m[i].role = owned[2 * i]; m[i].content = owned[2 * i + 1];
    }
    if (st == KN_OK) st = render_family(t, m, n, req->add_generation_prompt, b);
    for (size_t i = 0; i < 2 * n; i++) free(owned[i]);
    free(owned); free(m);
    return st;
}

kn_status kn_chat_apply_json(const kn_chat_tmpl *tmpl, const kn_chat_request *req, char *buf, size_t cap, size_t *needed) {
    if (needed) *needed = 0;
    if (!tmpl || !req || !req->messages_json || !needed || (cap > 0 && !buf))
        return kn_set_error(KN_ERR_INVALID, "kn_chat_apply_json: NULL template, request, messages_json, buf or needed");
    jarena a = {.limit = JINJA_MAX_MEMORY};
    sbuf b = {buf, cap, 0};
    jv msgs, tools = jv_none(), extra = jv_none();
    kn_status st = load_json(&a, "messages", req->messages_json, KN_JSON_ARRAY, &msgs);
    if (st == KN_OK && req->tools_json) st = load_json(&a, "tools", req->tools_json, KN_JSON_ARRAY, &tools);
    if (st == KN_OK && req->extra_json) st = load_json(&a, "extra", req->extra_json, KN_JSON_OBJECT, &extra);
    if (st == KN_ERR_LIMIT) st = KN_ERR_INVALID;   /* KN_ERR_LIMIT is kept for "buffer too small" */
    if (st != KN_OK) goto done;
    if (tmpl->format != KN_CHAT_JINJA || !tmpl->prog) { st = apply_family_json(tmpl, msgs, req, &b); goto done; }
    for (size_t i = 0; i < msgs.l->n && st == KN_OK; i++)
        st = normalise_msg(&a, msgs.l->v[i], i, req->parse_arguments, &msgs.l->v[i]);
    if (st != KN_OK) goto done;
    jdict *ctx = jd_new(&a, 8);
    if (!ctx) { st = OOM_T(); goto done; }
    if (extra.t == JV_DICT) {
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};
        for (size_t k = 0; k < extra.d->n; k++) {
            for (int r = 0; r < 4; r++)
                if (extra.d->k[k].s.n == strlen(reserved[r]) && memcmp(extra.d->k[k].s.p, reserved[r], extra.d->k[k].s.n) == 0) {
                    st = kn_set_error(KN_ERR_INVALID, "chat request: extra may not set '%s'", reserved[r]);
                    goto done;
                }
            if (!jd_set(&a, ctx, extra.d->k[k], extra.d->v[k])) { st = OOM_T(); goto done; }
        }
    }
    if (!jd_set(&a, ctx, jv_str("messages", 8), msgs) || !jd_set(&a, ctx, jv_str("tools", 5), tools)) { st = OOM_T(); goto done; }
    st = render_prog(tmpl, &a, ctx, req->add_generation_prompt, req->keep_bos, &b);
done:
    ja_free(&a);
    if (st != KN_OK) { if (cap > 0) buf[0] = 0; return st; }
    return finish(&b, buf, cap, needed);
}
