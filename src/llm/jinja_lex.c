/* jinja_lex.c: template text -> tokens, with the whitespace rules of the
 * environment transformers renders chat templates in:
 *   - line breaks (\r\n, \r, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029) are
 *     normalised to \n and one trailing line break is dropped (Python's
 *     splitlines + join, keep_trailing_newline=False);
 *   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`,
 *     `-#}` all whitespace after it;
 *   - lstrip_blocks: spaces and tabs between the start of a line and a `{%`
 *     or `{#` are dropped (not before `{{`; `{%+` keeps them);
 *   - trim_blocks: the first \n after `%}` or `#}` is dropped (`+%}` keeps it).
 * Inside tags: names, numbers, quoted strings (Python escapes decoded) and
 * operators. Non-goals: custom delimiters, line statements, `{% raw %}`.
 */
#include "llm/jinja_impl.h"
#include <stdlib.h>
#include <string.h>

typedef struct lx {
    jarena *a;
    const char *s; size_t n, pos;
    jtok *t; size_t nt, cap;
} lx;

static void line_col(const char *s, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) { if (s[i] == '\n') { l++; c = 1; } else if (((unsigned char)s[i] & 0xC0) != 0x80) c++; }
    *line = l; *col = c;
}

static kn_status lex_err(lx *x, size_t pos, const char *what) {
    int l, c;
    line_col(x->s, pos, &l, &c);
    return kn_set_error(KN_ERR_FORMAT, "chat template line %d column %d: %s", l, c, what);
}

static bool push(lx *x, jtk k, const char *p, size_t n, size_t pos) {
    if (x->nt == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 256;
        jtok *t = ja_alloc(x->a, cap * sizeof *t);
        if (!t) return false;
        if (x->nt) memcpy(t, x->t, x->nt * sizeof *t);
        x->t = t; x->cap = cap;
    }
    jtok *t = &x->t[x->nt++];
    memset(t, 0, sizeof *t);
    t->k = k; t->p = p; t->n = n;
    t->line = (int)pos;   /* a byte offset for now; turned into line:col at the end */
    return true;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* ---- normalise line breaks ---- */
static char *normalise(jarena *a, const char *s, size_t n, size_t *out_n) {
    char *d = ja_alloc(a, n + 1);
    if (!d) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\r') { if (i + 1 < n && s[i + 1] == '\n') i++; d[o++] = '\n'; }
        else if (c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) d[o++] = '\n';
        else if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) { i++; d[o++] = '\n'; }
        else if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
                 ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9)) { i += 2; d[o++] = '\n'; }
        else d[o++] = (char)c;
    }
    if (o > 0 && d[o - 1] == '\n') o--;
    d[o] = 0;
    *out_n = o;
    return d;
}

/* ---- string literals: Python escapes ---- */
static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t put_u8(char *d, uint32_t cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | cp >> 6); d[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) { d[0] = (char)(0xE0 | cp >> 12); d[1] = (char)(0x80 | (cp >> 6 & 63)); d[2] = (char)(0x80 | (cp & 63)); return 3; }
    d[0] = (char)(0xF0 | cp >> 18); d[1] = (char)(0x80 | (cp >> 12 & 63));
    d[2] = (char)(0x80 | (cp >> 6 & 63)); d[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static kn_status lex_string(lx *x) {
    size_t start = x->pos;
    char q = x->s[x->pos++];
    size_t i = x->pos;
    while (i < x->n && x->s[i] != q) { if (x->s[i] == '\\' && i + 1 < x->n) i++; i++; }
    if (i >= x->n) return lex_err(x, start, "unterminated string literal");
    size_t rn = i - x->pos;
    char *d = ja_alloc(x->a, rn * 2 + 1);   /* \xhh (4 bytes) -> at most 2 UTF-8 bytes */
    if (!d) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    size_t o = 0;
    for (size_t k = x->pos; k < i; k++) {
        char c = x->s[k];
        if (c != '\\' || k + 1 >= i) { d[o++] = c; continue; }
        char e = x->s[++k];
        int nh = 0;
        switch (e) {
        case 'n': d[o++] = '\n'; break;
        case 't': d[o++] = '\t'; break;
        case 'r': d[o++] = '\r'; break;
        case '\\': d[o++] = '\\'; break;
        case '\'': d[o++] = '\''; break;
        case '"': d[o++] = '"'; break;
        case 'a': d[o++] = '\a'; break;
        case 'b': d[o++] = '\b'; break;
        case 'f': d[o++] = '\f'; break;
        case 'v': d[o++] = '\v'; break;
        case '\n': break;                               /* line continuation */
        case 'x': nh = 2; break;
        case 'u': nh = 4; break;
        case 'U': nh = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int m = 0; m < 2 && k + 1 < i && x->s[k + 1] >= '0' && x->s[k + 1] <= '7'; m++)
                    v = v * 8 + (uint32_t)(x->s[++k] - '0');
                o += put_u8(d + o, v);
            } else { d[o++] = '\\'; d[o++] = e; }        /* unknown escapes stay as written */
        }
        if (nh) {
            uint32_t v = 0;
            for (int m = 0; m < nh; m++) {
                int h = k + 1 < i ? hexv(x->s[k + 1]) : -1;
                if (h < 0) return lex_err(x, k, "truncated \\x, \\u or \\U escape in a string literal");
                v = v * 16 + (uint32_t)h; k++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return lex_err(x, k, "escape outside Unicode (or a lone surrogate) in a string literal");
            o += put_u8(d + o, v);
        }
    }
    d[o] = 0;
    if (!push(x, TK_STR, d, o, start)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    x->pos = i + 1;
    return KN_OK;
}

static const char *const OPS[] = {
    "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", ".", ",", ":",
    "|", "(", ")", "[", "]", "{", "}",
};

/* tokens of one {{ }} or {% %} tag; x->pos is just past the opening (and its
 * '-' or '+'); leaves x->pos just past the closing and sets *strip_after */
static kn_status lex_tag(lx *x, bool block, size_t open, int *after) {
    int depth = 0;
    const char *close = block ? "%}" : "}}";
    for (;;) {
        while (x->pos < x->n && is_space(x->s[x->pos])) x->pos++;
        if (x->pos >= x->n) return lex_err(x, open, block ? "'{%' is never closed with '%}'" : "'{{' is never closed with '}}'");
        const char *p = x->s + x->pos;
        size_t left = x->n - x->pos;
        if (depth == 0) {
            int mod = 0; size_t skip = 0;
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && memcmp(p + 1, close, 2) == 0) { mod = p[0]; skip = 3; }
            else if (left >= 2 && memcmp(p, close, 2) == 0) skip = 2;
            if (skip) {
                if (!push(x, block ? TK_BLOCK_END : TK_VAR_END, p, skip, x->pos)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
                x->pos += skip;
                *after = mod == '-' ? 2 : mod == '+' ? 0 : block ? 1 : 0;   /* 2 strip all, 1 trim one \n */
                return KN_OK;
            }
        }
        char c = *p;
        kn_status st;
        if (c == '\'' || c == '"') { if ((st = lex_string(x)) != KN_OK) return st; continue; }
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t i = 1;
            while (i < left && (p[i] == '_' || (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9'))) i++;
            if (!push(x, TK_NAME, p, i, x->pos)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
            x->pos += i;
            continue;
        }
        if (c >= '0' && c <= '9') {
            bool after_dot = x->nt > 0 && x->t[x->nt - 1].k == TK_OP && x->t[x->nt - 1].n == 1 && x->t[x->nt - 1].p[0] == '.';
            size_t i = 0; bool fl = false;
            char buf[64]; size_t bn = 0;
            while (i < left && ((p[i] >= '0' && p[i] <= '9') || p[i] == '_')) { if (p[i] != '_' && bn < 63) buf[bn++] = p[i]; i++; }
            if (!after_dot && i + 1 < left && p[i] == '.' && p[i + 1] >= '0' && p[i + 1] <= '9') {
                fl = true; buf[bn++] = p[i++];
                while (i < left && ((p[i] >= '0' && p[i] <= '9') || p[i] == '_')) { if (p[i] != '_' && bn < 63) buf[bn++] = p[i]; i++; }
            }
            if (!after_dot && i < left && (p[i] == 'e' || p[i] == 'E')) {
                size_t j = i + 1;
                if (j < left && (p[j] == '+' || p[j] == '-')) j++;
                if (j < left && p[j] >= '0' && p[j] <= '9') {
                    fl = true;
                    while (i < j && bn < 63) buf[bn++] = p[i++];
                    while (i < left && p[i] >= '0' && p[i] <= '9') { if (bn < 63) buf[bn++] = p[i]; i++; }
                }
            }
            if (bn >= 63) return lex_err(x, x->pos, "number literal too long");
            buf[bn] = 0;
            if (!push(x, fl ? TK_FLOAT : TK_INT, p, i, x->pos)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
            jtok *t = &x->t[x->nt - 1];
            if (fl) t->f = strtod(buf, NULL);
            else {
                char *e;
                unsigned long long v = strtoull(buf, &e, 10);
                if (bn > 18 && (v > (unsigned long long)INT64_MAX || bn > 19)) return lex_err(x, x->pos, "integer literal does not fit in 64 bits");
                t->i = (int64_t)v;
            }
            x->pos += i;
            continue;
        }
        size_t k = 0;
        for (; k < sizeof OPS / sizeof *OPS; k++) {
            size_t on = strlen(OPS[k]);
            if (left >= on && memcmp(p, OPS[k], on) == 0) break;
        }
        if (k == sizeof OPS / sizeof *OPS) return lex_err(x, x->pos, "unexpected character in a tag");
        size_t on = strlen(OPS[k]);
        if (c == '(' || c == '[' || c == '{') depth++;
        else if (c == ')' || c == ']' || c == '}') { if (depth == 0) return lex_err(x, x->pos, "unbalanced bracket"); depth--; }
        if (!push(x, TK_OP, p, on, x->pos)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
        x->pos += on;
    }
}

kn_status jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *n_toks) {
    lx x = {.a = a};
    size_t nn;
    char *s = normalise(a, src, n, &nn);
    if (!s) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    x.s = s; x.n = nn;
    int after = 0;   /* what the previous tag asked of the text after it */
    kn_status st;
    while (x.pos <= x.n) {
        size_t start = x.pos;
        if (after == 2) while (start < x.n && is_space(s[start])) start++;
        else if (after == 1 && start < x.n && s[start] == '\n') start++;
        after = 0;
        /* next tag opening */
        size_t t = start;
        while (t + 1 < x.n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= x.n) t = x.n;
        size_t end = t;   /* text is s[start, end) */
        char kind = t < x.n ? s[t + 1] : 0;
        char mod = t + 2 < x.n ? s[t + 2] : 0;
        if (kind && mod == '-') {
            while (end > start && is_space(s[end - 1])) end--;
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            size_t l = end;
            while (l > start && (s[l - 1] == ' ' || s[l - 1] == '\t')) l--;
            bool at_line_start = l > start ? s[l - 1] == '\n' : (l == 0 || s[l - 1] == '\n');
            if (at_line_start) end = l;
        }
        if (end > start && !push(&x, TK_TEXT, s + start, end - start, start)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
        if (!kind) break;
        size_t open = t;
        x.pos = t + 2 + (mod == '-' || mod == '+');
        if (kind == '#') {
            size_t e = x.pos;
            while (e + 1 < x.n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= x.n) return lex_err(&x, open, "'{#' comment is never closed with '#}'");
            char m = e > x.pos ? s[e - 1] : 0;
            after = m == '-' ? 2 : m == '+' ? 0 : 1;
            x.pos = e + 2;
            continue;
        }
        bool block = kind == '%';
        if (!push(&x, block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, s + t, 2, t)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
        if ((st = lex_tag(&x, block, open, &after)) != KN_OK) return st;
        /* `{% raw %}` would need the lexer to stop tokenising: refuse it here */
        if (block && x.nt >= 3 && x.t[x.nt - 2].k == TK_NAME && x.t[x.nt - 3].k == TK_BLOCK_BEGIN &&
            x.t[x.nt - 2].n == 3 && memcmp(x.t[x.nt - 2].p, "raw", 3) == 0)
            return lex_err(&x, open, "'{% raw %}' is not supported by kiln's template interpreter");
    }
    if (!push(&x, TK_EOF, s + x.n, 0, x.n)) return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory");
    /* byte offsets -> line:column, in one pass */
    int line = 1, col = 1; size_t at = 0;
    for (size_t i = 0; i < x.nt; i++) {
        size_t off = (size_t)x.t[i].line;
        for (; at < off && at < x.n; at++) {
            if (s[at] == '\n') { line++; col = 1; }
            else if (((unsigned char)s[at] & 0xC0) != 0x80) col++;
        }
        x.t[i].line = line; x.t[i].col = col;
    }
    *toks = x.t; *n_toks = x.nt;
    return KN_OK;
}
