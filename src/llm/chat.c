/* chat.c: chat template detection and rendering (see kiln_chat.h).
 *
 * Detection looks for each family's marker tokens in the Jinja text; the
 * rendering of each family is written out in C, matching what the reference
 * Hugging Face templates produce (minus the leading BOS token). Non-goals: a
 * Jinja interpreter, tool calls, templates outside the three families.
 */
#include "kiln_chat.h"
#include "formats/gguf.h"   /* defines: kn_gguf_get_str */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SMOLLM_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/* ========================================================================== */
/* detection                                                                  */
/* ========================================================================== */

/* A ChatML template may hard-code a default system prompt, written as a
 * string literal '<|im_start|>system\n...<|im_end|>' (newline literal or the
 * escape \n). Take the first such literal whose text has no Jinja in it. */
static void chatml_default_system(const char *j, char *dst, size_t cap) {
    static const char mark[] = "<|im_start|>system";
    dst[0] = 0;
    for (const char *p = strstr(j, mark); p; p = strstr(p + 1, mark)) {
        const char *q = p + sizeof mark - 1;
        if (q[0] == '\n') q += 1;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *e = strstr(q, "<|im_end|>");
        if (!e || e == q) continue;
        size_t o = 0; bool ok = true;
        for (const char *c = q; c < e && ok; c++) {
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '+') ok = false;
            else if (c[0] == '\\' && c + 1 < e && c[1] == 'n') { if (o + 1 < cap) dst[o++] = '\n'; c++; }
            else if (o + 1 < cap) dst[o++] = *c;
            else ok = false;   /* longer than the buffer: do not truncate silently */
        }
        if (ok) { dst[o] = 0; return; }
        dst[0] = 0;
    }
}

kn_status kn_chat_template_from_string(const char *jinja, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_string: out is NULL");
    memset(out, 0, sizeof *out);
    if (!jinja) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_string: template is NULL");
    if (strstr(jinja, "<|im_start|>")) {
        out->format = KN_CHAT_CHATML;
        chatml_default_system(jinja, out->default_system, sizeof out->default_system);
        return KN_OK;
    }
    if (strstr(jinja, "<|start_header_id|>")) { out->format = KN_CHAT_LLAMA3; return KN_OK; }
    if (strstr(jinja, "[INST]")) { out->format = KN_CHAT_LLAMA2; return KN_OK; }
    return kn_set_error(KN_ERR_UNSUPPORTED, "chat template not recognised (kiln knows ChatML, Llama 2 and "
                        "Llama 3 templates, it does not run arbitrary Jinja); pass --chat-template "
                        "chatml|llama2|llama3 to choose one");
}

kn_status kn_chat_template_from_gguf(const struct kn_gguf *g, kn_chat_tmpl *out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_chat_template_from_gguf: out is NULL");
    memset(out, 0, sizeof *out);
    kn_gguf_str s;
    if (!g || !kn_gguf_get_str(g, "tokenizer.chat_template", &s))
        return kn_set_error(KN_ERR_UNSUPPORTED, "the model file has no tokenizer.chat_template; pass "
                            "--chat-template chatml|llama2|llama3 to choose one");
    char stackbuf[4096];
    char *j = s.len < sizeof stackbuf ? stackbuf : malloc(s.len + 1);
    if (!j) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    memcpy(j, s.ptr, s.len);
    j[s.len] = 0;
    /* an embedded NUL would hide the rest of the template: treat as the end */
    kn_status st = kn_chat_template_from_string(j, out);
    if (j != stackbuf) free(j);
    return st;
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
    switch (tmpl->format) {
    case KN_CHAT_CHATML: st = render_chatml(tmpl, msgs, n, add_generation_prompt, &b); break;
    case KN_CHAT_LLAMA3: st = render_llama3(msgs, n, add_generation_prompt, &b); break;
    case KN_CHAT_LLAMA2: st = render_llama2(msgs, n, &b); break;
    case KN_CHAT_PLAIN: st = render_plain(msgs, n, add_generation_prompt, &b); break;
    default:
        return kn_set_error(KN_ERR_INVALID, "kn_chat_apply: template format %d is not set; initialise it "
                            "with kn_chat_template_from_*", (int)tmpl->format);
    }
    if (st != KN_OK) return st;
    *needed = b.n;
    if (b.n + 1 > cap) {
        if (cap > 0) buf[0] = 0;
        return kn_set_error(KN_ERR_LIMIT, "kn_chat_apply: %zu bytes (+1 for NUL) do not fit in %zu; call "
                            "again with a buffer of *needed + 1 bytes", b.n, cap);
    }
    buf[b.n] = 0;
    return KN_OK;
}

void kn_chat_tmpl_free(kn_chat_tmpl *tmpl) {
    (void)tmpl;   /* the built-in families own no memory */
}
