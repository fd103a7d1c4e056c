/* jw.h: a growable byte buffer and a small JSON writer over it, for the
 * replies of `kiln serve`.
 *
 * Why our own writer: the replies are a handful of fixed shapes (a
 * completion, a stream chunk, an error, a model list, the metrics page), so
 * a writer is ~100 lines: objects and arrays nest through explicit calls,
 * and every string goes through one escaping function (quotes, backslash,
 * control characters as \uXXXX, invalid UTF-8 replaced by U+FFFD), so no
 * reply can be malformed JSON whatever the model or the client wrote. The
 * reading side is the project's fuzzed kn_json reader (src/formats/hfconfig.h).
 *
 * Memory: a failed allocation sets sb->oom and later writes do nothing; the
 * caller checks sb->oom once at the end (a reply is then a 500). */
#ifndef KN_SERVE_JW_H
#define KN_SERVE_JW_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sbuf {
    char *p;        /* NUL-terminated when len > 0 or after sb_reserve */
    size_t len, cap;
    bool oom;
} sbuf;

void sb_free(sbuf *sb);
void sb_add(sbuf *sb, const char *s, size_t n);
void sb_puts(sbuf *sb, const char *s);
void sb_printf(sbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* drop the first n bytes (a consumer that has sent them) */
void sb_consume(sbuf *sb, size_t n);
/* hands the bytes over (malloc'd, NUL-terminated; "" for an empty buffer);
 * NULL after an allocation failure. The buffer is empty afterwards. */
char *sb_take(sbuf *sb);

/* JSON: a writer tracks whether a comma is due at each nesting level. */
typedef struct jw {
    sbuf *sb;
    int depth;
    bool need_comma[32];
} jw;

void jw_init(jw *w, sbuf *sb);
void jw_obj(jw *w);                  /* {  */
void jw_obj_end(jw *w);              /* }  */
void jw_arr(jw *w);                  /* [  */
void jw_arr_end(jw *w);              /* ]  */
void jw_key(jw *w, const char *k);   /* "k": (the next value follows) */
void jw_keyn(jw *w, const char *k, size_t n);
void jw_raw(jw *w, const char *text);   /* a value written as it is (a number's text) */
void jw_str(jw *w, const char *s);   /* NULL writes null */
void jw_strn(jw *w, const char *s, size_t n);
void jw_int(jw *w, int64_t v);
void jw_num(jw *w, double v);        /* non-finite numbers as null */
void jw_bool(jw *w, bool v);
void jw_null(jw *w);
/* key + value shortcuts */
void jw_kstr(jw *w, const char *k, const char *s);
void jw_kint(jw *w, const char *k, int64_t v);
void jw_knum(jw *w, const char *k, double v);
void jw_kbool(jw *w, const char *k, bool v);
void jw_knull(jw *w, const char *k);
/* escaped string body (no quotes) appended to sb */
void jw_escape(sbuf *sb, const char *s, size_t n);
#endif
