/* jw.c: byte buffer and JSON writer (jw.h). */
#include "jw.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_free(sbuf *sb) { free(sb->p); *sb = (sbuf){0}; }

static bool sb_reserve(sbuf *sb, size_t extra) {
    if (sb->oom) return false;
    if (extra > SIZE_MAX / 2 - sb->len) { sb->oom = true; return false; }
    size_t need = sb->len + extra + 1;
    if (need <= sb->cap) return true;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(sb->p, cap);
    if (!p) { sb->oom = true; return false; }
    sb->p = p; sb->cap = cap;
    return true;
}

void sb_add(sbuf *sb, const char *s, size_t n) {
    if (!sb_reserve(sb, n)) return;
    if (n) memcpy(sb->p + sb->len, s, n);
    sb->len += n;
    sb->p[sb->len] = 0;
}

void sb_puts(sbuf *sb, const char *s) { sb_add(sb, s, strlen(s)); }

void sb_printf(sbuf *sb, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) { sb->oom = true; return; }
    if ((size_t)n < sizeof small) { sb_add(sb, small, (size_t)n); return; }
    if (!sb_reserve(sb, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(sb->p + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void sb_consume(sbuf *sb, size_t n) {
    if (n >= sb->len) { sb->len = 0; if (sb->p) sb->p[0] = 0; return; }
    memmove(sb->p, sb->p + n, sb->len - n);
    sb->len -= n;
    sb->p[sb->len] = 0;
}

char *sb_take(sbuf *sb) {
    if (sb->oom) { sb_free(sb); return NULL; }
    if (!sb->p && !sb_reserve(sb, 0)) return NULL;
    if (!sb->len) sb->p[0] = 0;
    char *p = sb->p;
    *sb = (sbuf){0};
    return p;
}

/* length of the valid UTF-8 character at s (n bytes left), 0 if invalid */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len; unsigned min;
    if (c < 0x80) return 1;
    else if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; c &= 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; c &= 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; c &= 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    return len;
}

void jw_escape(sbuf *sb, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;      /* run: bytes since i that need no escape */
    while (i + run < n) {
        unsigned char c = u[i + run];
        size_t clen = c < 0x80 ? 1 : utf8_char(u + i + run, n - i - run);
        if (c >= 0x20 && c != '"' && c != '\\' && clen) { run += clen; continue; }
        sb_add(sb, s + i, run);
        i += run; run = 0;
        switch (c) {
        case '"': sb_add(sb, "\\\"", 2); break;
        case '\\': sb_add(sb, "\\\\", 2); break;
        case '\n': sb_add(sb, "\\n", 2); break;
        case '\r': sb_add(sb, "\\r", 2); break;
        case '\t': sb_add(sb, "\\t", 2); break;
        default:
            if (c < 0x20) sb_printf(sb, "\\u%04x", c);
            else sb_add(sb, "\xEF\xBF\xBD", 3);   /* invalid UTF-8 byte: U+FFFD */
        }
        i++;
    }
    sb_add(sb, s + i, run);
}

void jw_init(jw *w, sbuf *sb) { *w = (jw){.sb = sb}; }

/* a value starts: the comma before it, unless it follows a key */
static void pre(jw *w) {
    if (w->need_comma[w->depth]) sb_add(w->sb, ",", 1);
    w->need_comma[w->depth] = true;
}
static void open(jw *w, char c) {
    pre(w);
    sb_add(w->sb, &c, 1);
    if (w->depth < 31) w->depth++;
    w->need_comma[w->depth] = false;
}
static void close_(jw *w, char c) {
    sb_add(w->sb, &c, 1);
    if (w->depth > 0) w->depth--;
}
void jw_obj(jw *w) { open(w, '{'); }
void jw_obj_end(jw *w) { close_(w, '}'); }
void jw_arr(jw *w) { open(w, '['); }
void jw_arr_end(jw *w) { close_(w, ']'); }

void jw_key(jw *w, const char *k) { jw_keyn(w, k, strlen(k)); }
void jw_keyn(jw *w, const char *k, size_t n) {
    pre(w);
    sb_add(w->sb, "\"", 1);
    jw_escape(w->sb, k, n);
    sb_add(w->sb, "\":", 2);
    w->need_comma[w->depth] = false;   /* the value follows without a comma */
    /* ... and the value's pre() sets it again */
}
void jw_strn(jw *w, const char *s, size_t n) {
    pre(w);
    sb_add(w->sb, "\"", 1);
    jw_escape(w->sb, s, n);
    sb_add(w->sb, "\"", 1);
}
void jw_str(jw *w, const char *s) { if (s) jw_strn(w, s, strlen(s)); else jw_null(w); }
void jw_raw(jw *w, const char *text) { pre(w); sb_puts(w->sb, text); }
void jw_int(jw *w, int64_t v) { pre(w); sb_printf(w->sb, "%lld", (long long)v); }
void jw_num(jw *w, double v) {
    if (!isfinite(v)) { jw_null(w); return; }
    pre(w); sb_printf(w->sb, "%.10g", v);
}
void jw_bool(jw *w, bool v) { pre(w); sb_puts(w->sb, v ? "true" : "false"); }
void jw_null(jw *w) { pre(w); sb_puts(w->sb, "null"); }
void jw_kstr(jw *w, const char *k, const char *s) { jw_key(w, k); jw_str(w, s); }
void jw_kint(jw *w, const char *k, int64_t v) { jw_key(w, k); jw_int(w, v); }
void jw_knum(jw *w, const char *k, double v) { jw_key(w, k); jw_num(w, v); }
void jw_kbool(jw *w, const char *k, bool v) { jw_key(w, k); jw_bool(w, v); }
void jw_knull(jw *w, const char *k) { jw_key(w, k); jw_null(w); }
