/* jinja_builtins.c: the filters, tests, methods and global functions chat
 * templates use, with Jinja's and Python's semantics:
 *   filters: trim length count tojson items selectattr rejectattr select
 *            reject map join upper lower capitalize title default (d) first
 *            last list string int float abs round reverse unique replace safe
 *            dictsort sort
 *   tests:   defined undefined none string number integer float boolean true
 *            false mapping iterable sequence callable odd even divisibleby
 *            eq equalto ne lt le gt ge in sameas lower upper
 *   methods: str.strip lstrip rstrip startswith endswith split rsplit lower
 *            upper title capitalize replace find count join splitlines;
 *            dict.get items keys values; list.count index
 *   globals: raise_exception strftime_now namespace range dict
 * Anything else is an error that names it. Case mapping covers ASCII, Latin-1,
 * Latin Extended-A, Greek and Cyrillic; strip and split use Python's
 * Unicode whitespace.
 */
#include "llm/jinja_impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(x) do { kn_status st_ = (x); if (st_ != KN_OK) return st_; } while (0)

static bool name_is(const char *p, size_t n, const char *s) { return strlen(s) == n && memcmp(p, s, n) == 0; }

/* ========================================================================== */
/* strings                                                                    */
/* ========================================================================== */

/* code point at s[i] (i < n) and its byte length */
static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + k > n) k = 1;
    uint32_t v = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
    for (size_t j = 1; j < k; j++) v = v << 6 | ((unsigned char)s[i + j] & 0x3F);
    *len = k;
    return v;
}

/* Python's str.isspace() */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(uint32_t c, const jv *chars) {
    if (!chars) return py_space(c);
    for (size_t i = 0; i < chars->s.n;) {
        size_t l;
        if (cp_at(chars->s.p, chars->s.n, i, &l) == c) return true;
        i += l;
    }
    return false;
}

/* last code point's start before byte e */
static size_t cp_back(const char *s, size_t e) {
    size_t i = e - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

static jv strip(jv s, const jv *chars, bool left, bool right) {
    size_t b = 0, e = s.s.n, l;
    if (left) while (b < e && in_chars(cp_at(s.s.p, e, b, &l), chars)) b += l;
    if (right) while (e > b) { size_t i = cp_back(s.s.p, e); if (!in_chars(cp_at(s.s.p, e, i, &l), chars)) break; e = i; }
    return jv_str(s.s.p + b, e - b);
}

static kn_status to_str(jctx *c, const jnode *n, jv v, jv *out) {
    if (v.t == JV_STR) { *out = v; return KN_OK; }
    jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
    if (!jv_to_str(c->a, v, &o)) return jinja_error(n, KN_ERR_INVALID, "a value nested more than %d deep cannot be printed", JINJA_MAX_DEPTH);
    if (o.oom) return jinja_oom(n);
    *out = jv_str(o.p ? o.p : "", o.n);
    return KN_OK;
}

/* Simple case mappings: ASCII, Latin-1, Latin Extended-A, Greek and
 * Cyrillic (what Python's str.lower/upper do there, one code point to one;
 * ß, ŉ and other expanding mappings are left as they are). */
static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c >= 0x100 && c <= 0x137 && !(c & 1) && c != 0x130) return c + 1;   /* İ lowers to two code points */
    if (c >= 0x139 && c <= 0x148 && (c & 1)) return c + 1;
    if (c >= 0x14A && c <= 0x177 && !(c & 1)) return c + 1;
    if (c == 0x178) return 0xFF;
    if (c >= 0x179 && c <= 0x17E && (c & 1)) return c + 1;
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}
static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c == 0x131) return 'I';
    if (c >= 0x101 && c <= 0x137 && (c & 1)) return c - 1;
    if (c >= 0x13A && c <= 0x148 && !(c & 1)) return c - 1;
    if (c >= 0x14B && c <= 0x177 && (c & 1)) return c - 1;
    if (c >= 0x17A && c <= 0x17E && !(c & 1)) return c - 1;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x3B1 && c <= 0x3CB) return c - 32;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}
static bool cp_cased(uint32_t c) { return cp_lower(c) != c || cp_upper(c) != c; }
static size_t put_u8(char *d, uint32_t cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | cp >> 6); d[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) { d[0] = (char)(0xE0 | cp >> 12); d[1] = (char)(0x80 | (cp >> 6 & 63)); d[2] = (char)(0x80 | (cp & 63)); return 3; }
    d[0] = (char)(0xF0 | cp >> 18); d[1] = (char)(0x80 | (cp >> 12 & 63)); d[2] = (char)(0x80 | (cp >> 6 & 63)); d[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* CASE_TITLE is Python's str.title (a cased letter after an uncased
 * character starts a word); CASE_JTITLE is Jinja's title filter (words start
 * after whitespace, '-', '(', '{', '[' or '<'; the first character of each
 * is upper-cased, the rest lower-cased); CASE_CAP is str.capitalize. */
enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAP, CASE_JTITLE };
static bool jtitle_sep(uint32_t c) { return c == ' ' || (c >= 9 && c <= 13) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; }

static kn_status change_case(jctx *c, const jnode *n, jv s, int mode, jv *out) {
    char *p = ja_alloc(c->a, s.s.n + 1);
    if (!p) return jinja_oom(n);
    size_t o = 0, len;
    bool prev_cased = false, prev_sep = true;
    for (size_t i = 0; i < s.s.n; i += len) {
        uint32_t ch = cp_at(s.s.p, s.s.n, i, &len), r;
        bool start;
        if (len == 1 && ch >= 0x80) { p[o++] = s.s.p[i]; prev_cased = false; prev_sep = false; continue; }   /* malformed: kept */
        switch (mode) {
        case CASE_LOWER: r = cp_lower(ch); break;
        case CASE_UPPER: r = cp_upper(ch); break;
        case CASE_CAP: r = i == 0 ? cp_upper(ch) : cp_lower(ch); break;
        case CASE_TITLE: r = prev_cased ? cp_lower(ch) : cp_upper(ch); break;
        default:
            start = prev_sep && !jtitle_sep(ch);
            r = start ? cp_upper(ch) : cp_lower(ch);
            break;
        }
        prev_cased = cp_cased(ch);
        prev_sep = jtitle_sep(ch);
        /* one byte maps to one (ASCII), longer sequences to at most two bytes: never grows */
        if (r == ch) { memcpy(p + o, s.s.p + i, len); o += len; }
        else o += put_u8(p + o, r);
    }
    p[o] = 0;
    *out = jv_str(p, o);
    return KN_OK;
}

static kn_status replace(jctx *c, const jnode *n, jv s, jv old, jv new_, int64_t count, jv *out) {
    jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
    size_t i = 0; int64_t done = 0;
    if (old.s.n == 0) {   /* Python inserts new_ between every character */
        size_t l;
        for (; i < s.s.n; i += l) {
            cp_at(s.s.p, s.s.n, i, &l);
            if (count < 0 || done < count) { jb_put(&o, new_.s.p, new_.s.n); done++; }
            jb_put(&o, s.s.p + i, l);
        }
        if (count < 0 || done < count) jb_put(&o, new_.s.p, new_.s.n);
    } else {
        while (i < s.s.n) {
            const char *hit = count < 0 || done < count ? jfind(s.s.p + i, s.s.n - i, old.s.p, old.s.n) : NULL;
            if (!hit) { jb_put(&o, s.s.p + i, s.s.n - i); break; }
            jb_put(&o, s.s.p + i, (size_t)(hit - (s.s.p + i)));
            jb_put(&o, new_.s.p, new_.s.n);
            i = (size_t)(hit - s.s.p) + old.s.n; done++;
        }
    }
    if (o.oom) return jinja_oom(n);
    *out = jv_str(o.p ? o.p : "", o.n);
    return KN_OK;
}

static kn_status split(jctx *c, const jnode *n, jv s, const jv *sep, int64_t maxsplit, bool from_right, jv *out) {
    jlist *l = jl_new(c->a, 0);
    if (!l) return jinja_oom(n);
    out->t = JV_LIST; out->l = l;
    const char *p = s.s.p; size_t len = s.s.n, ln;
    if (sep && sep->s.n == 0) return jinja_error(n, KN_ERR_INVALID, "split(): empty separator");
    if (from_right && maxsplit >= 0) {
        if (sep) TRY(jinja_work(c, n, len * sep->s.n));   /* the backward scan compares up to |sep| bytes per position */
        /* rsplit with a limit: collect from the end, then reverse */
        jlist *r = jl_new(c->a, 0);
        if (!r) return jinja_oom(n);
        size_t e = len; int64_t done = 0;
        if (!sep) {
            while (e > 0 && py_space(cp_at(p, len, cp_back(p, e), &ln))) e = cp_back(p, e);
            while (e > 0) {
                size_t b = e;
                if (done == maxsplit) { b = 0; while (b < e && py_space(cp_at(p, len, b, &ln))) b += ln; }
                else while (b > 0 && !py_space(cp_at(p, len, cp_back(p, b), &ln))) b = cp_back(p, b);
                if (!jl_push(c->a, r, jv_str(p + b, e - b))) return jinja_oom(n);
                done++;
                e = b;
                while (e > 0 && py_space(cp_at(p, len, cp_back(p, e), &ln))) e = cp_back(p, e);
                if (done > maxsplit) break;
            }
        } else {
            for (;;) {
                size_t b = e; bool found = false;
                if (done < maxsplit)
                    while (b >= sep->s.n) { if (memcmp(p + b - sep->s.n, sep->s.p, sep->s.n) == 0) { found = true; break; } b--; }
                if (!found) { if (!jl_push(c->a, r, jv_str(p, e))) return jinja_oom(n); break; }
                if (!jl_push(c->a, r, jv_str(p + b, e - b))) return jinja_oom(n);
                e = b - sep->s.n; done++;
            }
        }
        for (size_t i = r->n; i-- > 0;) if (!jl_push(c->a, l, r->v[i])) return jinja_oom(n);
        return KN_OK;
    }
    if (!sep) {
        size_t i = 0; int64_t done = 0;
        for (;;) {
            while (i < len && py_space(cp_at(p, len, i, &ln))) i += ln;
            if (i >= len) break;
            size_t b = i;
            if (maxsplit >= 0 && done == maxsplit) {
                size_t e = len;
                while (e > b && py_space(cp_at(p, len, cp_back(p, e), &ln))) e = cp_back(p, e);
                if (!jl_push(c->a, l, jv_str(p + b, e - b))) return jinja_oom(n);
                break;
            }
            while (i < len && !py_space(cp_at(p, len, i, &ln))) i += ln;
            if (!jl_push(c->a, l, jv_str(p + b, i - b))) return jinja_oom(n);
            done++;
        }
        return KN_OK;
    }
    size_t b = 0; int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
        const char *hit = jfind(p + b, len - b, sep->s.p, sep->s.n);
        if (!hit) break;
        size_t i = (size_t)(hit - p);
        if (!jl_push(c->a, l, jv_str(p + b, i - b))) return jinja_oom(n);
        b = i + sep->s.n; done++;
    }
    if (!jl_push(c->a, l, jv_str(p + b, len - b))) return jinja_oom(n);
    return KN_OK;
}

static bool prefix_match(jv s, jv pre, bool end) {
    if (pre.s.n > s.s.n) return false;
    return memcmp(s.s.p + (end ? s.s.n - pre.s.n : 0), pre.s.p, pre.s.n) == 0;
}

/* ========================================================================== */
/* methods                                                                    */
/* ========================================================================== */

static kn_status want_str(const jnode *n, const char *fn, const jv *a, int i) {
    if (a[i].t != JV_STR)
        return jinja_error(n, KN_ERR_INVALID, "%s(): argument %d must be a string, not '%s'", fn, i + 1, jv_type_name(a[i]));
    return KN_OK;
}

static kn_status want_int(const jnode *n, const char *fn, jv v, int64_t *out) {
    if (v.t == JV_INT || v.t == JV_BOOL) { *out = v.t == JV_INT ? v.i : v.b; return KN_OK; }
    return jinja_error(n, KN_ERR_INVALID, "%s(): expected an integer, not '%s'", fn, jv_type_name(v));
}

static kn_status nargs_ok(const jnode *n, const char *fn, int nargs, int lo, int hi) {
    if (nargs < lo || nargs > hi)
        return jinja_error(n, KN_ERR_INVALID, "%s() takes %d to %d arguments (%d given)", fn, lo, hi, nargs);
    return KN_OK;
}

static kn_status items_of(jctx *c, const jnode *n, jdict *d, jv *out) {
    jlist *l = jl_new(c->a, d->n);
    if (!l) return jinja_oom(n);
    for (size_t i = 0; i < d->n; i++) {
        jlist *pr = jl_new(c->a, 2);
        if (!pr) return jinja_oom(n);
        pr->v[0] = d->k[i]; pr->v[1] = d->v[i]; pr->n = 2; pr->tuple = true;
        l->v[l->n].t = JV_LIST; l->v[l->n].l = pr; l->n++;
    }
    out->t = JV_LIST; out->l = l;
    return KN_OK;
}

static kn_status str_method(jctx *c, const jnode *n, jv s, const char *m, size_t mn, const jv *a, int na, jv *out, bool *found) {
    *found = true;
    TRY(jinja_work(c, n, s.s.n));
    char fn[32];
    snprintf(fn, sizeof fn, "%.*s", (int)(mn < 31 ? mn : 31), m);
    if (name_is(m, mn, "strip") || name_is(m, mn, "lstrip") || name_is(m, mn, "rstrip")) {
        TRY(nargs_ok(n, fn, na, 0, 1));
        const jv *chars = NULL;
        if (na == 1 && a[0].t != JV_NONE) { TRY(want_str(n, fn, a, 0)); chars = &a[0]; }
        *out = strip(s, chars, m[0] != 'r', m[0] != 'l');
        return KN_OK;
    }
    if (name_is(m, mn, "startswith") || name_is(m, mn, "endswith")) {
        TRY(nargs_ok(n, fn, na, 1, 1));
        bool end = m[0] == 'e', r = false;
        if (a[0].t == JV_LIST) {
            for (size_t i = 0; i < a[0].l->n; i++) {
                if (a[0].l->v[i].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "%s(): tuple items must be strings", fn);
                r = r || prefix_match(s, a[0].l->v[i], end);
            }
        } else { TRY(want_str(n, fn, a, 0)); r = prefix_match(s, a[0], end); }
        *out = jv_bool(r);
        return KN_OK;
    }
    if (name_is(m, mn, "split") || name_is(m, mn, "rsplit")) {
        TRY(nargs_ok(n, fn, na, 0, 2));
        const jv *sep = NULL; int64_t maxs = -1;
        if (na >= 1 && a[0].t != JV_NONE) { TRY(want_str(n, fn, a, 0)); sep = &a[0]; }
        if (na == 2) TRY(want_int(n, fn, a[1], &maxs));
        return split(c, n, s, sep, maxs, m[0] == 'r', out);
    }
    if (name_is(m, mn, "lower")) { TRY(nargs_ok(n, fn, na, 0, 0)); return change_case(c, n, s, CASE_LOWER, out); }
    if (name_is(m, mn, "upper")) { TRY(nargs_ok(n, fn, na, 0, 0)); return change_case(c, n, s, CASE_UPPER, out); }
    if (name_is(m, mn, "title")) { TRY(nargs_ok(n, fn, na, 0, 0)); return change_case(c, n, s, CASE_TITLE, out); }
    if (name_is(m, mn, "capitalize")) { TRY(nargs_ok(n, fn, na, 0, 0)); return change_case(c, n, s, CASE_CAP, out); }
    if (name_is(m, mn, "replace")) {
        TRY(nargs_ok(n, fn, na, 2, 3));
        TRY(want_str(n, fn, a, 0)); TRY(want_str(n, fn, a, 1));
        int64_t cnt = -1;
        if (na == 3) TRY(want_int(n, fn, a[2], &cnt));
        return replace(c, n, s, a[0], a[1], cnt, out);
    }
    if (name_is(m, mn, "find") || name_is(m, mn, "count")) {
        TRY(nargs_ok(n, fn, na, 1, 1));
        TRY(want_str(n, fn, a, 0));
        int64_t cnt = 0, at = -1;
        if (a[0].s.n == 0) { cnt = (int64_t)u8_len(s.s.p, s.s.n) + 1; at = 0; }
        else for (size_t i = 0; i < s.s.n;) {
            const char *hit = jfind(s.s.p + i, s.s.n - i, a[0].s.p, a[0].s.n);
            if (!hit) break;
            if (at < 0) at = (int64_t)u8_len(s.s.p, (size_t)(hit - s.s.p));
            cnt++;
            i = (size_t)(hit - s.s.p) + a[0].s.n;
        }
        *out = jv_int(m[0] == 'f' ? at : cnt);
        return KN_OK;
    }
    if (name_is(m, mn, "join")) {
        TRY(nargs_ok(n, fn, na, 1, 1));
        if (a[0].t != JV_LIST) return jinja_error(n, KN_ERR_INVALID, "join(): expected a list, not '%s'", jv_type_name(a[0]));
        jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
        for (size_t i = 0; i < a[0].l->n; i++) {
            if (a[0].l->v[i].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "join(): item %zu is '%s', not a string", i, jv_type_name(a[0].l->v[i]));
            if (i) jb_put(&o, s.s.p, s.s.n);
            jb_put(&o, a[0].l->v[i].s.p, a[0].l->v[i].s.n);
        }
        if (o.oom) return jinja_oom(n);
        *out = jv_str(o.p ? o.p : "", o.n);
        return KN_OK;
    }
    if (name_is(m, mn, "splitlines")) {
        TRY(nargs_ok(n, fn, na, 0, 0));
        jlist *l = jl_new(c->a, 0);
        if (!l) return jinja_oom(n);
        size_t b = 0;
        for (size_t i = 0; i < s.s.n; i++)
            if (s.s.p[i] == '\n' || s.s.p[i] == '\r') {
                if (!jl_push(c->a, l, jv_str(s.s.p + b, i - b))) return jinja_oom(n);
                if (s.s.p[i] == '\r' && i + 1 < s.s.n && s.s.p[i + 1] == '\n') i++;
                b = i + 1;
            }
        if (b < s.s.n && !jl_push(c->a, l, jv_str(s.s.p + b, s.s.n - b))) return jinja_oom(n);
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    *found = false;
    return KN_OK;
}

kn_status jinja_method(jctx *c, const jnode *n, jv obj, const char *m, size_t mn, const jv *a, int na, jv *out, bool *found) {
    if (obj.t == JV_STR) return str_method(c, n, obj, m, mn, a, na, out, found);
    *found = false;
    if (obj.t == JV_LIST && (name_is(m, mn, "count") || name_is(m, mn, "index"))) {
        *found = true;
        TRY(nargs_ok(n, m[0] == 'c' ? "count" : "index", na, 1, 1));
        int64_t cnt = 0, at = -1;
        for (size_t i = 0; i < obj.l->n; i++)
            if (jv_equal(obj.l->v[i], a[0])) { if (at < 0) at = (int64_t)i; cnt++; }
        if (m[0] == 'i' && at < 0) return jinja_error(n, KN_ERR_INVALID, "index(): the value is not in the list");
        *out = jv_int(m[0] == 'c' ? cnt : at);
        return KN_OK;
    }
    if (obj.t != JV_DICT || obj.d->ns) return KN_OK;
    *found = true;
    if (name_is(m, mn, "get")) {
        TRY(nargs_ok(n, "get", na, 1, 2));
        const jv *v = jd_getv(obj.d, a[0]);
        *out = v ? *v : na == 2 ? a[1] : jv_none();
        return KN_OK;
    }
    if (name_is(m, mn, "items")) { TRY(nargs_ok(n, "items", na, 0, 0)); return items_of(c, n, obj.d, out); }
    if (name_is(m, mn, "keys") || name_is(m, mn, "values")) {
        TRY(nargs_ok(n, "keys", na, 0, 0));
        jlist *l = jl_new(c->a, obj.d->n);
        if (!l) return jinja_oom(n);
        memcpy(l->v, m[0] == 'k' ? obj.d->k : obj.d->v, obj.d->n * sizeof(jv));
        l->n = obj.d->n;
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    *found = false;
    return KN_OK;
}

/* ========================================================================== */
/* tests                                                                      */
/* ========================================================================== */

kn_status jinja_test(jctx *c, const jnode *n, jv v, const jv *a, int na, bool *out) {
    const char *t = n->name; size_t tn = n->name_n;
    bool num = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (name_is(t, tn, "defined")) *out = v.t != JV_UNDEF;
    else if (name_is(t, tn, "undefined")) *out = v.t == JV_UNDEF;
    else if (name_is(t, tn, "none")) *out = v.t == JV_NONE;
    else if (name_is(t, tn, "string")) *out = v.t == JV_STR;
    else if (name_is(t, tn, "number")) *out = num;
    else if (name_is(t, tn, "integer")) *out = v.t == JV_INT;
    else if (name_is(t, tn, "float")) *out = v.t == JV_FLOAT;
    else if (name_is(t, tn, "boolean")) *out = v.t == JV_BOOL;
    else if (name_is(t, tn, "true")) *out = v.t == JV_BOOL && v.b;
    else if (name_is(t, tn, "false")) *out = v.t == JV_BOOL && !v.b;
    else if (name_is(t, tn, "mapping")) *out = v.t == JV_DICT && !v.d->ns;
    /* Jinja's Undefined iterates as empty and has __getitem__, so it passes both */
    else if (name_is(t, tn, "iterable") || name_is(t, tn, "sequence"))
        *out = v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.d->ns) || v.t == JV_UNDEF;
    else if (name_is(t, tn, "callable")) *out = v.t == JV_FUNC;
    else if (name_is(t, tn, "odd") || name_is(t, tn, "even") || name_is(t, tn, "divisibleby")) {
        /* Python's value % d == 1 (odd) or == 0, on ints or floats */
        if (!num) return jinja_error(n, KN_ERR_INVALID, "test '%.*s' needs a number, not '%s'", (int)tn, t, jv_type_name(v));
        jv d = jv_int(2);
        if (t[0] == 'd') {
            if (na != 1) return jinja_error(n, KN_ERR_INVALID, "divisibleby takes one argument");
            d = a[0];
            if (d.t != JV_INT && d.t != JV_FLOAT && d.t != JV_BOOL) return jinja_error(n, KN_ERR_INVALID, "divisibleby: needs a number");
        }
        double m;
        if (v.t == JV_FLOAT || d.t == JV_FLOAT) {
            double x = v.t == JV_FLOAT ? v.f : (double)(v.t == JV_INT ? v.i : v.b), y = d.t == JV_FLOAT ? d.f : (double)(d.t == JV_INT ? d.i : d.b);
            if (y == 0) return jinja_error(n, KN_ERR_INVALID, "modulo by zero in test '%.*s'", (int)tn, t);
            m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
        } else {
            int64_t xi = v.t == JV_INT ? v.i : v.b, yi = d.t == JV_INT ? d.i : d.b;
            if (yi == 0) return jinja_error(n, KN_ERR_INVALID, "modulo by zero in test '%.*s'", (int)tn, t);
            int64_t mi = yi == -1 ? 0 : xi % yi;
            if (mi != 0 && ((mi < 0) != (yi < 0))) mi += yi;
            m = (double)mi;
        }
        *out = t[0] == 'o' ? m == 1 : m == 0;
    } else if (name_is(t, tn, "eq") || name_is(t, tn, "equalto") || name_is(t, tn, "==") || name_is(t, tn, "sameas") ||
               name_is(t, tn, "ne") || name_is(t, tn, "!=")) {
        if (na != 1) return jinja_error(n, KN_ERR_INVALID, "test '%.*s' takes one argument", (int)tn, t);
        bool e = jv_equal(v, a[0]);
        if (name_is(t, tn, "sameas")) e = e && v.t == a[0].t;   /* `is` on singletons */
        *out = (t[0] == 'n' || t[0] == '!') ? !e : e;
    } else if (name_is(t, tn, "lt") || name_is(t, tn, "le") || name_is(t, tn, "gt") || name_is(t, tn, "ge")) {
        int cmp;
        if (na != 1) return jinja_error(n, KN_ERR_INVALID, "test '%.*s' takes one argument", (int)tn, t);
        if (!jv_order(v, a[0], &cmp) || cmp == 2) return jinja_error(n, KN_ERR_INVALID, "cannot order '%s' and '%s'", jv_type_name(v), jv_type_name(a[0]));
        *out = t[0] == 'l' ? (t[1] == 't' ? cmp < 0 : cmp <= 0) : (t[1] == 't' ? cmp > 0 : cmp >= 0);
    } else if (name_is(t, tn, "in")) {
        if (na != 1) return jinja_error(n, KN_ERR_INVALID, "test 'in' takes one argument");
        jv seq = a[0];
        *out = false;
        if (seq.t == JV_STR && v.t == JV_STR) {
            TRY(jinja_work(c, n, seq.s.n));
            *out = jfind(seq.s.p, seq.s.n, v.s.p, v.s.n) != NULL;
        } else if (seq.t == JV_LIST) {
            for (size_t i = 0; i < seq.l->n; i++) if (jv_equal(seq.l->v[i], v)) { *out = true; break; }
        } else if (seq.t == JV_DICT) *out = jd_getv(seq.d, v) != NULL;
        else return jinja_error(n, KN_ERR_INVALID, "test 'in': '%s' is not a container", jv_type_name(seq));
    } else if (name_is(t, tn, "lower") || name_is(t, tn, "upper")) {
        if (v.t != JV_STR) TRY(to_str(c, n, v, &v));   /* Jinja: str(value).islower() */
        bool any = false, ok = true;
        for (size_t i = 0; i < v.s.n; i++) {
            char ch = v.s.p[i];
            if (ch >= 'a' && ch <= 'z') { any = true; if (t[0] == 'u') ok = false; }
            if (ch >= 'A' && ch <= 'Z') { any = true; if (t[0] == 'l') ok = false; }
        }
        *out = any && ok;
    } else
        return jinja_error(n, KN_ERR_UNSUPPORTED, "test '%.*s' is not supported by kiln's template interpreter", (int)tn, t);
    return KN_OK;
}

/* ========================================================================== */
/* filters                                                                    */
/* ========================================================================== */

static const char *const FILTERS[] = {
    "trim", "strip", "length", "count", "tojson", "items", "selectattr", "rejectattr", "select", "reject", "map", "join",
    "upper", "lower", "capitalize", "title", "default", "d", "first", "last", "list", "string", "safe", "int", "float",
    "abs", "round", "reverse", "unique", "sort", "dictsort", "replace", NULL,
};
static const char *const TESTS[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false", "mapping",
    "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "ne", "lt", "le", "gt", "ge",
    "in", "sameas", "lower", "upper", NULL,
};
static bool in_list(const char *const *l, const char *p, size_t n) {
    for (; *l; l++) if (name_is(p, n, *l)) return true;
    return false;
}
bool jinja_known_filter(const char *name, size_t n) { return in_list(FILTERS, name, n); }
bool jinja_known_test(const char *name, size_t n) { return in_list(TESTS, name, n); }

/* named or positional argument i of a filter; NULL when absent */
static const jv *farg(const jv *a, const char *const *kw, const size_t *kw_n, int na, int pos, const char *name) {
    int p = 0;
    for (int i = 0; i < na; i++) {
        if (kw && kw[i]) { if (name && name_is(kw[i], kw_n[i], name)) return &a[i]; }
        else if (p++ == pos) return &a[i];
    }
    return NULL;
}

static kn_status check_kw(const jnode *n, const char *const *kw, const size_t *kw_n, int na, const char *const *allowed) {
    for (int i = 0; i < na; i++) {
        if (!kw || !kw[i]) continue;
        bool ok = false;
        for (const char *const *s = allowed; *s; s++) if (name_is(kw[i], kw_n[i], *s)) ok = true;
        if (!ok) return jinja_error(n, KN_ERR_UNSUPPORTED, "filter '%.*s' has no argument '%.*s' that kiln supports",
                                    (int)n->name_n, n->name, (int)kw_n[i], kw[i]);
    }
    return KN_OK;
}

/* item.attr.sub (dots) as Jinja's attrgetter: dict key, or list index */
static jv attr_get(jv v, const char *path, size_t n) {
    size_t b = 0;
    while (b <= n) {
        size_t e = b;
        while (e < n && path[e] != '.') e++;
        if (v.t == JV_DICT) { const jv *x = jd_get(v.d, path + b, e - b); v = x ? *x : jv_undef(path + b, e - b); }
        else if (v.t == JV_LIST && e > b && path[b] >= '0' && path[b] <= '9') {
            size_t ix = (size_t)strtoull(path + b, NULL, 10);
            v = ix < v.l->n ? v.l->v[ix] : jv_undef(NULL, 0);
        } else v = jv_undef(path + b, e - b);
        b = e + 1;
    }
    return v;
}

static kn_status as_list(jctx *c, const jnode *n, jv v, jlist **out) {
    if (v.t == JV_LIST) { *out = v.l; return KN_OK; }
    if (v.t == JV_UNDEF) { *out = jl_new(c->a, 0); return *out ? KN_OK : jinja_oom(n); }
    if (v.t == JV_DICT && !v.d->ns) {
        jlist *l = jl_new(c->a, v.d->n);
        if (!l) return jinja_oom(n);
        memcpy(l->v, v.d->k, v.d->n * sizeof(jv)); l->n = v.d->n;
        *out = l; return KN_OK;
    }
    if (v.t == JV_STR) {
        jlist *l = jl_new(c->a, 0);
        if (!l) return jinja_oom(n);
        for (size_t i = 0, k; i < v.s.n; i += k) { cp_at(v.s.p, v.s.n, i, &k); if (!jl_push(c->a, l, jv_str(v.s.p + i, k))) return jinja_oom(n); }
        *out = l; return KN_OK;
    }
    return jinja_error(n, KN_ERR_INVALID, "filter '%.*s': '%s' object is not iterable", (int)n->name_n, n->name, jv_type_name(v));
}

static kn_status select_items(jctx *c, const jnode *n, jv in, const jv *a, int na, bool by_attr, bool keep_if, jv *out) {
    jlist *src, *l = jl_new(c->a, 0);
    if (!l) return jinja_oom(n);
    if (!jv_truthy(in)) { out->t = JV_LIST; out->l = l; return KN_OK; }   /* Jinja: `if value:` first */
    TRY(as_list(c, n, in, &src));
    int first_test = by_attr ? 1 : 0;
    if (by_attr && (na < 1 || a[0].t != JV_STR)) return jinja_error(n, KN_ERR_INVALID, "filter '%.*s' needs an attribute name", (int)n->name_n, n->name);
    jnode tn = *n;
    if (na > first_test) {
        if (a[first_test].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "filter '%.*s': the test name must be a string", (int)n->name_n, n->name);
        tn.name = a[first_test].s.p; tn.name_n = a[first_test].s.n;
    }
    for (size_t i = 0; i < src->n; i++) {
        TRY(jinja_step(c, n));
        jv v = by_attr ? attr_get(src->v[i], a[0].s.p, a[0].s.n) : src->v[i];
        bool r;
        if (na > first_test) TRY(jinja_test(c, &tn, v, a + first_test + 1, na - first_test - 1, &r));
        else r = jv_truthy(v);
        if (r == keep_if && !jl_push(c->a, l, src->v[i])) return jinja_oom(n);
    }
    out->t = JV_LIST; out->l = l;
    return KN_OK;
}

/* Jinja's sort, unique and dictsort ignore case unless case_sensitive: strings
 * compare lower-cased (ASCII here) */
static kn_status fold(jctx *c, const jnode *n, jv v, bool cs, jv *out) {
    if (cs || v.t != JV_STR) { *out = v; return KN_OK; }
    return change_case(c, n, v, CASE_LOWER, out);
}

static kn_status sort_list(jctx *c, const jnode *n, jlist *l, bool rev, const jv *attr, bool cs) {
    /* insertion sort (stable), comparing with Python ordering */
    for (size_t i = 1; i < l->n; i++) {
        TRY(jinja_step(c, n));
        TRY(jinja_work(c, n, i * sizeof(jv)));
        for (size_t j = i; j > 0; j--) {
            jv x = l->v[j - 1], y = l->v[j];
            if (attr) { x = attr_get(x, attr->s.p, attr->s.n); y = attr_get(y, attr->s.p, attr->s.n); }
            TRY(fold(c, n, x, cs, &x));
            TRY(fold(c, n, y, cs, &y));
            int cmp;
            if (!jv_order(x, y, &cmp)) return jinja_error(n, KN_ERR_INVALID, "sort: cannot order '%s' and '%s'", jv_type_name(x), jv_type_name(y));
            if (rev ? cmp >= 0 : cmp <= 0) break;
            jv t = l->v[j]; l->v[j] = l->v[j - 1]; l->v[j - 1] = t;
        }
    }
    return KN_OK;
}

kn_status jinja_filter(jctx *c, const jnode *n, jv in, const jv *a, const char *const *kw, const size_t *kw_n, int na, jv *out) {
    const char *f = n->name; size_t fn = n->name_n;
    TRY(jinja_work(c, n, in.t == JV_STR ? in.s.n : in.t == JV_LIST ? in.l->n * sizeof(jv) : in.t == JV_DICT ? in.d->n * sizeof(jv) : 0));
    static const char *const none_kw[] = {NULL};
    if (name_is(f, fn, "trim") || name_is(f, fn, "strip")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"chars", NULL}));
        jv s; TRY(to_str(c, n, in, &s));
        const jv *ch = farg(a, kw, kw_n, na, 0, "chars");
        if (ch && ch->t != JV_NONE && ch->t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "trim: chars must be a string");
        *out = strip(s, ch && ch->t == JV_STR ? ch : NULL, true, true);
        return KN_OK;
    }
    if (name_is(f, fn, "length") || name_is(f, fn, "count")) {
        switch (in.t) {
        case JV_STR: *out = jv_int((int64_t)u8_len(in.s.p, in.s.n)); return KN_OK;
        case JV_LIST: *out = jv_int((int64_t)in.l->n); return KN_OK;
        case JV_DICT: *out = jv_int((int64_t)in.d->n); return KN_OK;
        case JV_UNDEF: *out = jv_int(0); return KN_OK;
        default: return jinja_error(n, KN_ERR_INVALID, "object of type '%s' has no len()", jv_type_name(in));
        }
    }
    if (name_is(f, fn, "tojson")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"indent", "ensure_ascii", "separators", "sort_keys", NULL}));
        const jv *ind = farg(a, kw, kw_n, na, 0, "indent"), *sk = farg(a, kw, kw_n, na, 3, "sort_keys");
        const jv *ea = farg(a, kw, kw_n, na, 1, "ensure_ascii"), *sep = farg(a, kw, kw_n, na, 2, "separators");
        if (ea && jv_truthy(*ea)) return jinja_error(n, KN_ERR_UNSUPPORTED, "tojson(ensure_ascii=true) is not supported");
        if (sep && sep->t != JV_NONE) return jinja_error(n, KN_ERR_UNSUPPORTED, "tojson(separators=...) is not supported");
        int64_t indent = -1;
        if (ind && ind->t != JV_NONE) {
            TRY(want_int(n, "tojson", *ind, &indent));
            if (indent < 0 || indent > 64) return jinja_error(n, KN_ERR_INVALID, "tojson: indent %lld is outside 0..64", (long long)indent);
        }
        jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
        if (!jv_to_json(c->a, in, (int)indent, sk && jv_truthy(*sk), &o, 0)) {
            if (o.oom) return jinja_oom(n);
            return jinja_error(n, KN_ERR_INVALID, "tojson: the value (or something in it: undefined, a namespace, "
                               "an unsortable or non-scalar key, too deep) is not JSON serializable");
        }
        if (o.oom) return jinja_oom(n);
        *out = jv_str(o.p ? o.p : "", o.n);
        return KN_OK;
    }
    if (name_is(f, fn, "items")) {
        if (in.t == JV_UNDEF) { jlist *l = jl_new(c->a, 0); if (!l) return jinja_oom(n); out->t = JV_LIST; out->l = l; return KN_OK; }
        if (in.t != JV_DICT || in.d->ns) return jinja_error(n, KN_ERR_INVALID, "items: expected a dict, not '%s'", jv_type_name(in));
        return items_of(c, n, in.d, out);
    }
    if (name_is(f, fn, "selectattr") || name_is(f, fn, "rejectattr") || name_is(f, fn, "select") || name_is(f, fn, "reject")) {
        TRY(check_kw(n, kw, kw_n, na, none_kw));
        return select_items(c, n, in, a, na, fn > 6, f[0] == 's', out);
    }
    if (name_is(f, fn, "map")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"attribute", "default", NULL}));
        jlist *src, *l;
        if (!jv_truthy(in)) { if (!(l = jl_new(c->a, 0))) return jinja_oom(n); out->t = JV_LIST; out->l = l; return KN_OK; }
        TRY(as_list(c, n, in, &src));
        if (!(l = jl_new(c->a, src->n))) return jinja_oom(n);
        const jv *attr = farg(a, kw, kw_n, na, 99, "attribute"), *def = farg(a, kw, kw_n, na, 99, "default");
        if (attr) {
            if (attr->t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "map: attribute must be a string");
            for (size_t i = 0; i < src->n; i++) {
                jv v = attr_get(src->v[i], attr->s.p, attr->s.n);
                l->v[l->n++] = v.t == JV_UNDEF && def ? *def : v;
            }
        } else {
            if (na < 1 || a[0].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "map: needs a filter name or attribute=");
            jnode fnode = *n;
            fnode.name = a[0].s.p; fnode.name_n = a[0].s.n;
            for (size_t i = 0; i < src->n; i++) {
                TRY(jinja_step(c, n));
                TRY(jinja_filter(c, &fnode, src->v[i], a + 1, kw ? kw + 1 : NULL, kw_n ? kw_n + 1 : NULL, na - 1, &l->v[l->n]));
                l->n++;
            }
        }
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    if (name_is(f, fn, "join")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"d", "attribute", NULL}));
        jlist *src;
        TRY(as_list(c, n, in, &src));
        const jv *sep = farg(a, kw, kw_n, na, 0, "d"), *attr = farg(a, kw, kw_n, na, 1, "attribute");
        jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
        for (size_t i = 0; i < src->n; i++) {
            if (i && sep) { jv s; TRY(to_str(c, n, *sep, &s)); jb_put(&o, s.s.p, s.s.n); }
            jv v = attr && attr->t == JV_STR ? attr_get(src->v[i], attr->s.p, attr->s.n) : src->v[i];
            jv_to_str(c->a, v, &o);
        }
        if (o.oom) return jinja_oom(n);
        *out = jv_str(o.p ? o.p : "", o.n);
        return KN_OK;
    }
    if (name_is(f, fn, "upper") || name_is(f, fn, "lower") || name_is(f, fn, "capitalize") || name_is(f, fn, "title")) {
        jv s; TRY(to_str(c, n, in, &s));
        int mode = f[0] == 'u' ? CASE_UPPER : f[0] == 'l' ? CASE_LOWER : f[0] == 'c' ? CASE_CAP : CASE_JTITLE;
        return change_case(c, n, s, mode, out);
    }
    if (name_is(f, fn, "default") || name_is(f, fn, "d")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"default_value", "boolean", NULL}));
        const jv *dv = farg(a, kw, kw_n, na, 0, "default_value"), *bo = farg(a, kw, kw_n, na, 1, "boolean");
        bool use = in.t == JV_UNDEF || (bo && jv_truthy(*bo) && !jv_truthy(in));
        *out = use ? (dv ? *dv : jv_str("", 0)) : in;
        return KN_OK;
    }
    if (name_is(f, fn, "first") || name_is(f, fn, "last")) {
        jlist *l;
        TRY(as_list(c, n, in, &l));
        *out = l->n ? l->v[f[0] == 'f' ? 0 : l->n - 1] : jv_undef(NULL, 0);
        return KN_OK;
    }
    if (name_is(f, fn, "list")) {
        jlist *l, *cp;
        TRY(as_list(c, n, in, &l));
        if (!(cp = jl_new(c->a, l->n))) return jinja_oom(n);
        memcpy(cp->v, l->v, l->n * sizeof(jv)); cp->n = l->n;
        out->t = JV_LIST; out->l = cp;
        return KN_OK;
    }
    if (name_is(f, fn, "string")) return to_str(c, n, in, out);
    if (name_is(f, fn, "safe")) { *out = in; return KN_OK; }
    if (name_is(f, fn, "int") || name_is(f, fn, "float")) {
        const jv *dv = farg(a, kw, kw_n, na, 0, "default");
        bool want_int_ = f[0] == 'i';
        if (in.t == JV_UNDEF) return jinja_error(n, KN_ERR_INVALID, "'%.*s' is undefined", (int)in.s.n, in.s.p ? in.s.p : "");
        double d = 0; bool ok = true;
        if (in.t == JV_INT || in.t == JV_BOOL) d = (double)(in.t == JV_INT ? in.i : in.b);
        else if (in.t == JV_FLOAT) d = in.f;
        else if (in.t == JV_STR) {
            char buf[64];
            jv s = strip(in, NULL, true, true);
            if (s.s.n == 0 || s.s.n >= sizeof buf) ok = false;
            else {
                memcpy(buf, s.s.p, s.s.n); buf[s.s.n] = 0;
                char *e;
                if (want_int_) { long long v = strtoll(buf, &e, 10); if (*e) { d = strtod(buf, &e); ok = !*e; if (ok) d = trunc(d); } else { *out = jv_int(v); return KN_OK; } }
                else { d = strtod(buf, &e); ok = !*e; }
            }
        } else ok = false;
        if (!ok) { *out = dv ? *dv : want_int_ ? jv_int(0) : jv_float(0.0); return KN_OK; }
        if (want_int_) {
            if (!(d > -9.2e18 && d < 9.2e18)) { *out = dv ? *dv : jv_int(0); return KN_OK; }
            *out = jv_int(in.t == JV_INT ? in.i : (int64_t)d);
        } else *out = jv_float(d);
        return KN_OK;
    }
    if (name_is(f, fn, "abs")) {
        if (in.t == JV_INT) { if (in.i == INT64_MIN) return jinja_error(n, KN_ERR_LIMIT, "abs: integer overflow"); *out = jv_int(in.i < 0 ? -in.i : in.i); }
        else if (in.t == JV_BOOL) *out = jv_int(in.b);
        else if (in.t == JV_FLOAT) *out = jv_float(fabs(in.f));
        else return jinja_error(n, KN_ERR_INVALID, "bad operand type for abs(): '%s'", jv_type_name(in));
        return KN_OK;
    }
    if (name_is(f, fn, "round")) {
        const jv *pr = farg(a, kw, kw_n, na, 0, "precision"), *me = farg(a, kw, kw_n, na, 1, "method");
        int64_t p = 0;
        if (pr) TRY(want_int(n, "round", *pr, &p));
        if (in.t != JV_INT && in.t != JV_FLOAT && in.t != JV_BOOL) return jinja_error(n, KN_ERR_INVALID, "round: expected a number");
        double x = in.t == JV_FLOAT ? in.f : (double)(in.t == JV_INT ? in.i : in.b), s = pow(10.0, (double)p);
        const char *m = me && me->t == JV_STR ? me->s.p : "common";
        if (m[0] == 'c' && m[1] == 'o' && in.t != JV_FLOAT && p >= 0) { *out = jv_int(in.t == JV_INT ? in.i : in.b); return KN_OK; }
        double r = m[0] == 'c' && m[1] == 'e' ? ceil(x * s) / s : m[0] == 'f' ? floor(x * s) / s : round(x * s) / s;
        *out = jv_float(r);
        return KN_OK;
    }
    if (name_is(f, fn, "reverse")) {
        if (in.t == JV_STR) {
            char *p = ja_alloc(c->a, in.s.n + 1);
            if (!p) return jinja_oom(n);
            size_t o = in.s.n;
            for (size_t i = 0, k; i < in.s.n; i += k) { cp_at(in.s.p, in.s.n, i, &k); o -= k; memcpy(p + o, in.s.p + i, k); }
            *out = jv_str(p, in.s.n);
            return KN_OK;
        }
        jlist *l, *r;
        TRY(as_list(c, n, in, &l));
        if (!(r = jl_new(c->a, l->n))) return jinja_oom(n);
        for (size_t i = l->n; i-- > 0;) r->v[r->n++] = l->v[i];
        out->t = JV_LIST; out->l = r;
        return KN_OK;
    }
    if (name_is(f, fn, "unique")) {
        jlist *l, *r;
        TRY(as_list(c, n, in, &l));
        if (!(r = jl_new(c->a, l->n))) return jinja_oom(n);
        const jv *cs = farg(a, kw, kw_n, na, 0, "case_sensitive");
        for (size_t i = 0; i < l->n; i++) {
            TRY(jinja_step(c, n));
            bool seen = false;
            jv x;
            TRY(fold(c, n, l->v[i], cs && jv_truthy(*cs), &x));
            TRY(jinja_work(c, n, r->n * sizeof(jv)));
            for (size_t j = 0; j < r->n && !seen; j++) {
                jv y;
                TRY(fold(c, n, r->v[j], cs && jv_truthy(*cs), &y));
                seen = jv_equal(y, x);
            }
            if (!seen) r->v[r->n++] = l->v[i];
        }
        out->t = JV_LIST; out->l = r;
        return KN_OK;
    }
    if (name_is(f, fn, "sort") || name_is(f, fn, "dictsort")) {
        TRY(check_kw(n, kw, kw_n, na, (const char *const[]){"reverse", "case_sensitive", "attribute", "by", NULL}));
        const jv *rev = farg(a, kw, kw_n, na, 0, "reverse"), *attr = farg(a, kw, kw_n, na, 2, "attribute");
        const jv *cs = farg(a, kw, kw_n, na, 1, "case_sensitive");
        jlist *l, *cp;
        jv tmp;
        if (f[0] == 'd') {
            if (in.t != JV_DICT) return jinja_error(n, KN_ERR_INVALID, "dictsort: expected a dict");
            TRY(items_of(c, n, in.d, &tmp));
            l = tmp.l;
            cs = farg(a, kw, kw_n, na, 0, "case_sensitive");
            rev = farg(a, kw, kw_n, na, 2, "reverse");
            attr = NULL;
            static const jv zero_path = {.t = JV_STR, .s = {"0", 1}};
            attr = &zero_path;
        } else TRY(as_list(c, n, in, &l));
        if (!(cp = jl_new(c->a, l->n))) return jinja_oom(n);
        memcpy(cp->v, l->v, l->n * sizeof(jv)); cp->n = l->n;
        TRY(sort_list(c, n, cp, rev && jv_truthy(*rev), attr && attr->t == JV_STR ? attr : NULL, cs && jv_truthy(*cs)));
        out->t = JV_LIST; out->l = cp;
        return KN_OK;
    }
    if (name_is(f, fn, "replace")) {
        jv s; TRY(to_str(c, n, in, &s));
        if (na < 2 || a[0].t != JV_STR || a[1].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "replace: needs two strings");
        int64_t cnt = -1;
        if (na >= 3 && a[2].t != JV_NONE) TRY(want_int(n, "replace", a[2], &cnt));
        return replace(c, n, s, a[0], a[1], cnt, out);
    }
    return jinja_error(n, KN_ERR_UNSUPPORTED, "filter '%.*s' is not supported by kiln's template interpreter", (int)fn, f);
}

/* ========================================================================== */
/* global functions                                                           */
/* ========================================================================== */

kn_status jinja_call_func(jctx *c, const jnode *n, int fn, const jv *a, const char *const *kw, const size_t *kw_n, int na, jv *out) {
    switch (fn) {
    case JF_RAISE: {
        jv m = na > 0 ? a[0] : jv_str("", 0);
        jv s;
        TRY(to_str(c, n, m, &s));
        return kn_set_error(KN_ERR_INVALID, "%.*s (raised by the chat template at line %d column %d)",
                            (int)(s.s.n > 1000 ? 1000 : s.s.n), s.s.p, n->line, n->col);
    }
    case JF_STRFTIME: {
        if (na != 1 || a[0].t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "strftime_now(format) takes one string");
        char fmt[256], buf[512];
        if (a[0].s.n >= sizeof fmt) return jinja_error(n, KN_ERR_LIMIT, "strftime_now: format longer than 255 bytes");
        memcpy(fmt, a[0].s.p, a[0].s.n); fmt[a[0].s.n] = 0;
        time_t t = time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        size_t k = strftime(buf, sizeof buf, fmt, &tm);
        char *p = ja_alloc(c->a, k + 1);
        if (!p) return jinja_oom(n);
        memcpy(p, buf, k);
        *out = jv_str(p, k);
        return KN_OK;
    }
    case JF_NAMESPACE: case JF_DICT: {
        jdict *d = jd_new(c->a, 0);
        if (!d) return jinja_oom(n);
        d->ns = fn == JF_NAMESPACE;
        for (int i = 0; i < na; i++) {
            if (kw && kw[i]) { if (!jd_set(c->a, d, jv_str(kw[i], kw_n[i]), a[i])) return jinja_oom(n); }
            else if (a[i].t == JV_DICT) {
                for (size_t k = 0; k < a[i].d->n; k++) if (!jd_set(c->a, d, a[i].d->k[k], a[i].d->v[k])) return jinja_oom(n);
            } else return jinja_error(n, KN_ERR_INVALID, "%s(): positional arguments must be dicts", fn == JF_DICT ? "dict" : "namespace");
        }
        out->t = JV_DICT; out->d = d;
        return KN_OK;
    }
    case JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (na < 1 || na > 3) return jinja_error(n, KN_ERR_INVALID, "range() takes 1 to 3 arguments");
        for (int i = 0; i < na; i++) TRY(want_int(n, "range", a[i], &v[i]));
        int64_t start = na == 1 ? 0 : v[0], stop = na == 1 ? v[0] : v[1], step = na == 3 ? v[2] : 1;
        if (step == 0) return jinja_error(n, KN_ERR_INVALID, "range() step must not be zero");
        jlist *l = jl_new(c->a, 0);
        if (!l) return jinja_oom(n);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            TRY(jinja_step(c, n));
            if (!jl_push(c->a, l, jv_int(i))) return jinja_oom(n);
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    default:
        return jinja_error(n, KN_ERR_STATE, "internal: unknown function %d", fn);
    }
}
