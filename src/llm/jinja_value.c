/* jinja_value.c: the interpreter's values (see jinja_impl.h): the arena they
 * live in, lists and insertion-ordered dicts, and Python's semantics for
 * truthiness, ==, ordering, str() / repr() and json.dumps (as transformers'
 * tojson calls it: ensure_ascii=False, separators ', ' and ': ').
 * Non-goals: hashing (dicts are small; lookups are linear).
 */
#include "llm/jinja_impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================== */
/* arena and buffers                                                          */
/* ========================================================================== */

struct jblock { jblock *next; size_t used, cap; _Alignas(16) unsigned char data[]; };

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (n > a->limit || a->used > a->limit - n)) return NULL;
    jblock *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head; b->used = 0; b->cap = cap;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a) {
    for (jblock *b = a->head, *nx; b; b = nx) { nx = b->next; free(b); }
    a->head = NULL; a->used = 0;
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->limit && (n > b->limit || b->n > b->limit - n)) { b->oom = true; return; }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p;
        if (b->a) { p = ja_alloc(b->a, cap); if (p && b->n) memcpy(p, b->p, b->n); }
        else p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }

/* ========================================================================== */
/* lists and dicts                                                            */
/* ========================================================================== */

jlist *jl_new(jarena *a, size_t cap) {
    jlist *l = ja_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap == 0) cap = 1;   /* never a NULL array: memcpy of 0 items from it stays defined */
    if (!(l->v = ja_alloc(a, cap * sizeof(jv)))) return NULL;
    l->cap = cap;
    return l;
}

bool jl_push(jarena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(a, cap * sizeof(jv));
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv; l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

jdict *jd_new(jarena *a, size_t cap) {
    jdict *d = ja_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap == 0) cap = 1;
    if (!(d->k = ja_alloc(a, cap * sizeof(jv))) || !(d->v = ja_alloc(a, cap * sizeof(jv)))) return NULL;
    d->cap = cap;
    return d;
}

const jv *jd_getv(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

const jv *jd_get(const jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, key, n) == 0) return &d->v[i];
    return NULL;
}

bool jd_set(jarena *a, jdict *d, jv key, jv val) {
    const jv *old = jd_getv(d, key);
    if (old) { d->v[old - d->v] = val; return true; }
    return jd_append(a, d, key, val);
}

bool jd_append(jarena *a, jdict *d, jv key, jv val) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(a, cap * sizeof(jv)), *nv = ja_alloc(a, cap * sizeof(jv));
        if (!nk || !nv) return false;
        if (d->n) { memcpy(nk, d->k, d->n * sizeof(jv)); memcpy(nv, d->v, d->n * sizeof(jv)); }
        d->k = nk; d->v = nv; d->cap = cap;
    }
    d->k[d->n] = key; d->v[d->n] = val; d->n++;
    return true;
}

/* ========================================================================== */
/* truthiness, equality, ordering                                             */
/* ========================================================================== */

bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s.n > 0;
    case JV_LIST: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0 || v.d->ns;
    case JV_FUNC: return true;
    default: return false;
    }
}

static bool is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num_f(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }
static int64_t num_i(jv v) { return v.t == JV_INT ? v.i : (int64_t)v.b; }

/* deeper than JINJA_MAX_DEPTH (lists built in a loop can be): unequal,
 * rather than recursing without bound */
static bool eq(jv a, jv b, int depth);
bool jv_equal(jv a, jv b) { return eq(a, b, 0); }

static bool eq(jv a, jv b, int depth) {
    if (depth > JINJA_MAX_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JV_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++) if (!eq(a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.d == b.d) return true;
        if (a.d->n != b.d->n || a.d->ns || b.d->ns) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            const jv *o = jd_getv(b.d, a.d->k[i]);
            if (!o || !eq(a.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_FUNC: return a.fn.id == b.fn.id && a.fn.node == b.fn.node;
    default: return false;
    }
}

static bool order(jv a, jv b, int *cmp, int depth);
bool jv_order(jv a, jv b, int *cmp) { return order(a, b, cmp, 0); }

static bool order(jv a, jv b, int *cmp, int depth) {
    if (depth > JINJA_MAX_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) { int64_t x = num_i(a), y = num_i(b); *cmp = (x > y) - (x < y); }
        else { double x = num_f(a), y = num_f(b); if (isnan(x) || isnan(y)) { *cmp = 2; return true; } *cmp = (x > y) - (x < y); }
        return true;
    }
    if (a.t == JV_STR && b.t == JV_STR) {   /* UTF-8 byte order is code point order */
        size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, m);
        *cmp = c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        return true;
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (eq(a.l->v[i], b.l->v[i], depth + 1)) continue;
            return order(a.l->v[i], b.l->v[i], cmp, depth + 1);
        }
        *cmp = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return true;
    }
    return false;
}

const char *jv_type_name(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return v.d->ns ? "Namespace" : "dict";
    default: return "function";
    }
}

/* ========================================================================== */
/* UTF-8                                                                      */
/* ========================================================================== */

size_t u8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t u8_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0, c = 0;
    while (i < n) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) { if (c == cp) return i; c++; }
        i++;
    }
    return n;
}

/* ========================================================================== */
/* str(), repr(), json.dumps                                                  */
/* ========================================================================== */

/* Python's float repr: the shortest digits that read back to the same
 * double, fixed notation for exponents -4..15, else d.ddde+XX. */
static void put_float(jbuf *o, double x, bool json) {
    if (isnan(x)) { jb_puts(o, json ? "NaN" : "nan"); return; }
    if (isinf(x)) { jb_puts(o, x > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf")); return; }
    char e[40];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    bool neg = e[0] == '-';
    char digits[24]; int nd = 0;
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++) if (*q != '.') digits[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char buf[64]; int k = 0;
    if (neg) buf[k++] = '-';
    if (ex >= -5 + 1 && ex < 16) {
        if (ex < 0) {
            buf[k++] = '0'; buf[k++] = '.';
            for (int i = 0; i < -ex - 1; i++) buf[k++] = '0';
            for (int i = 0; i < nd; i++) buf[k++] = digits[i];
        } else {
            for (int i = 0; i <= ex; i++) buf[k++] = i < nd ? digits[i] : '0';
            buf[k++] = '.';
            if (nd > ex + 1) for (int i = ex + 1; i < nd; i++) buf[k++] = digits[i];
            else buf[k++] = '0';
        }
    } else {
        buf[k++] = digits[0];
        if (nd > 1) { buf[k++] = '.'; for (int i = 1; i < nd; i++) buf[k++] = digits[i]; }
        k += snprintf(buf + k, sizeof buf - (size_t)k, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
    jb_put(o, buf, (size_t)k);
}

static void put_int(jbuf *o, int64_t i) {
    char b[32];
    int n = snprintf(b, sizeof b, "%lld", (long long)i);
    jb_put(o, b, (size_t)n);
}

/* Python repr of a str: single quotes unless it holds ' and no " */
static void put_repr_str(jbuf *o, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char qc = sq && !dq ? '"' : '\'';
    jb_putc(o, qc);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') jb_puts(o, "\\\\");
        else if (c == (unsigned char)qc) { jb_putc(o, '\\'); jb_putc(o, (char)c); }
        else if (c == '\n') jb_puts(o, "\\n");
        else if (c == '\r') jb_puts(o, "\\r");
        else if (c == '\t') jb_puts(o, "\\t");
        else if (c < 0x20 || c == 0x7f) { char b[8]; snprintf(b, sizeof b, "\\x%02x", c); jb_puts(o, b); }
        else jb_putc(o, (char)c);
    }
    jb_putc(o, qc);
}

static bool put_repr(jv v, jbuf *o, int depth) {
    if (depth > JINJA_MAX_DEPTH) return false;
    switch (v.t) {
    case JV_STR: put_repr_str(o, v.s.p, v.s.n); return true;
    case JV_LIST:
        jb_putc(o, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_puts(o, ", ");
            if (!put_repr(v.l->v[i], o, depth + 1)) return false;
        }
        if (v.l->tuple && v.l->n == 1) jb_putc(o, ',');
        jb_putc(o, v.l->tuple ? ')' : ']');
        return true;
    case JV_DICT:
        if (v.d->ns) { jb_puts(o, "<Namespace>"); return true; }
        jb_putc(o, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jb_puts(o, ", ");
            if (!put_repr(v.d->k[i], o, depth + 1)) return false;
            jb_puts(o, ": ");
            if (!put_repr(v.d->v[i], o, depth + 1)) return false;
        }
        jb_putc(o, '}');
        return true;
    case JV_UNDEF: jb_puts(o, "Undefined"); return true;   /* repr() of Jinja's Undefined */
    default:
        return jv_to_str(NULL, v, o);
    }
}

bool jv_to_str(jarena *a, jv v, jbuf *o) {
    (void)a;
    switch (v.t) {
    case JV_UNDEF: return true;
    case JV_NONE: jb_puts(o, "None"); return true;
    case JV_BOOL: jb_puts(o, v.b ? "True" : "False"); return true;
    case JV_INT: put_int(o, v.i); return true;
    case JV_FLOAT: put_float(o, v.f, false); return true;
    case JV_STR: jb_put(o, v.s.p, v.s.n); return true;
    case JV_FUNC: jb_puts(o, v.fn.id == JF_MACRO ? "<Macro>" : "<function>"); return true;
    default: return put_repr(v, o, 0);
    }
}

static void put_json_str(jbuf *o, const char *s, size_t n) {
    jb_putc(o, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL; char b[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(b, sizeof b, "\\u%04x", c); esc = b; }
        if (esc) { jb_put(o, s + run, i - run); jb_puts(o, esc); run = i + 1; }
    }
    jb_put(o, s + run, n - run);
    jb_putc(o, '"');
}

static void newline_indent(jbuf *o, int indent, int level) {
    jb_putc(o, '\n');
    for (int i = 0; i < indent * level; i++) jb_putc(o, ' ');
}

static bool to_json(jv v, int indent, bool sort, jbuf *o, int level);

static bool json_dict(jv v, int indent, bool sort, jbuf *o, int level) {
    const jdict *d = v.d;
    if (d->n == 0) { jb_puts(o, "{}"); return true; }
    size_t order[256], *ord = order;
    if (d->n > 256) return false;   /* sort_keys on huge dicts: not needed by templates */
    for (size_t i = 0; i < d->n; i++) ord[i] = i;
    if (sort) {
        for (size_t i = 1; i < d->n; i++)       /* insertion sort by key */
            for (size_t j = i; j > 0; j--) {
                int c;
                if (!jv_order(d->k[ord[j - 1]], d->k[ord[j]], &c)) return false;
                if (c <= 0) break;
                size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
            }
    }
    jb_putc(o, '{');
    for (size_t i = 0; i < d->n; i++) {
        jv k = d->k[ord[i]];
        if (i) jb_putc(o, ',');
        if (indent >= 0) newline_indent(o, indent, level + 1);
        else if (i) jb_putc(o, ' ');
        /* json.dumps turns scalar keys into strings */
        if (k.t == JV_STR) put_json_str(o, k.s.p, k.s.n);
        else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
            jb_putc(o, '"');
            if (k.t == JV_BOOL) jb_puts(o, k.b ? "true" : "false");
            else if (k.t == JV_NONE) jb_puts(o, "null");
            else if (!to_json(k, -1, false, o, 0)) return false;
            jb_putc(o, '"');
        } else return false;
        jb_puts(o, ": ");
        if (!to_json(d->v[ord[i]], indent, sort, o, level + 1)) return false;
    }
    if (indent >= 0) newline_indent(o, indent, level);
    jb_putc(o, '}');
    return true;
}

static bool to_json(jv v, int indent, bool sort, jbuf *o, int level) {
    if (level > JINJA_MAX_DEPTH) return false;
    switch (v.t) {
    case JV_NONE: jb_puts(o, "null"); return true;
    case JV_BOOL: jb_puts(o, v.b ? "true" : "false"); return true;
    case JV_INT: put_int(o, v.i); return true;
    case JV_FLOAT: put_float(o, v.f, true); return true;
    case JV_STR: put_json_str(o, v.s.p, v.s.n); return true;
    case JV_LIST:
        if (v.l->n == 0) { jb_puts(o, "[]"); return true; }
        jb_putc(o, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_putc(o, ',');
            if (indent >= 0) newline_indent(o, indent, level + 1);
            else if (i) jb_putc(o, ' ');
            if (!to_json(v.l->v[i], indent, sort, o, level + 1)) return false;
        }
        if (indent >= 0) newline_indent(o, indent, level);
        jb_putc(o, ']');
        return true;
    case JV_DICT:
        if (v.d->ns) return false;
        return json_dict(v, indent, sort, o, level);
    default: return false;   /* Undefined, functions: not JSON serializable */
    }
}

bool jv_to_json(jarena *a, jv v, int indent, bool sort_keys, jbuf *out, int depth) {
    (void)a;
    return to_json(v, indent, sort_keys, out, depth);
}
