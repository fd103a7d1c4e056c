/* hfconfig.c: strict iterative JSON parser (see hfconfig.h).
 *
 * Grammar is RFC 8259: one value, whitespace around it; strings must be
 * valid UTF-8 with no raw control characters; numbers follow the JSON
 * grammar exactly. Memory: nodes grow by doubling (at most one node per input
 * byte), decoded strings share one buffer of len+1 bytes, which is always
 * enough because decoding never lengthens a string and every string brings
 * at least two quote bytes for its NUL. */
#include "formats/hfconfig.h"
#include "formats/mapfile.h"   /* defines: kn_mapfile_open, kn_mapfile_close */
#include <stdlib.h>
#include <string.h>

typedef struct jnode {
    kn_json_type type;
    bool b, is_int;
    int64_t first, last, next;   /* children (arrays/objects) and sibling links      */
    int64_t n;                   /* children count, or string length                 */
    size_t key, key_len;         /* member name: offset into sbuf (key_len+1 if set) */
    size_t str;                  /* string value: offset into sbuf                   */
    double num;
    int64_t inum;
} jnode;

struct kn_json {
    jnode *nodes;
    int64_t n_nodes, cap;
    char *sbuf;
    size_t sbuf_used;
};

void kn_json_free(kn_json *j) {
    if (!j) return;
    free(j->nodes);
    free(j->sbuf);
    free(j);
}

/* ---- parsing ---------------------------------------------------------------- */

typedef struct jp {
    const unsigned char *s;
    size_t len, pos;
    kn_json *j;
} jp;

static void skip_ws(jp *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int64_t new_node(jp *p, kn_json_type t) {
    kn_json *j = p->j;
    if (j->n_nodes == j->cap) {
        int64_t nc = j->cap ? j->cap * 2 : 16;
        jnode *nn = realloc(j->nodes, (size_t)nc * sizeof *nn);
        if (!nn) return -1;
        j->nodes = nn; j->cap = nc;
    }
    jnode *n = &j->nodes[j->n_nodes];
    memset(n, 0, sizeof *n);
    n->type = t; n->first = n->last = n->next = -1;
    return j->n_nodes++;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
static bool read_hex4(jp *p, size_t at, uint32_t *v) {
    if (p->len - at < 4) return false;
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[at + (size_t)i]);
        if (h < 0) return false;
        x = x << 4 | (uint32_t)h;
    }
    *v = x;
    return true;
}
static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode the string starting at the opening quote; sets off and n to its place in sbuf. */
static kn_status parse_string(jp *p, size_t *off, size_t *n) {
    size_t start = p->pos;
    p->pos++;   /* opening quote */
    char *o = p->j->sbuf + p->j->sbuf_used;
    size_t w = 0;
    for (;;) {
        if (p->pos >= p->len)
            return kn_set_error(KN_ERR_FORMAT, "JSON: unterminated string starting at byte %zu", start);
        unsigned char c = p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20)
            return kn_set_error(KN_ERR_FORMAT, "JSON: raw control character 0x%02x in string at byte %zu "
                                "(must be escaped)", c, p->pos);
        if (c == '\\') {
            if (p->pos + 1 >= p->len)
                return kn_set_error(KN_ERR_FORMAT, "JSON: unterminated escape at byte %zu", p->pos);
            unsigned char e = p->s[p->pos + 1];
            size_t at = p->pos;
            p->pos += 2;
            switch (e) {
            case '"': o[w++] = '"'; break;
            case '\\': o[w++] = '\\'; break;
            case '/': o[w++] = '/'; break;
            case 'b': o[w++] = '\b'; break;
            case 'f': o[w++] = '\f'; break;
            case 'n': o[w++] = '\n'; break;
            case 'r': o[w++] = '\r'; break;
            case 't': o[w++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!read_hex4(p, p->pos, &cp))
                    return kn_set_error(KN_ERR_FORMAT, "JSON: bad \\u escape at byte %zu (need 4 hex digits)", at);
                p->pos += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return kn_set_error(KN_ERR_FORMAT, "JSON: lone low surrogate \\u%04X at byte %zu", cp, at);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                        !read_hex4(p, p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return kn_set_error(KN_ERR_FORMAT, "JSON: high surrogate \\u%04X at byte %zu is not "
                                            "followed by a low surrogate", cp, at);
                    p->pos += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                w += put_utf8(o + w, cp);
                break;
            }
            default:
                return kn_set_error(KN_ERR_FORMAT, "JSON: invalid escape '\\%c' at byte %zu",
                                    (e >= 0x20 && e < 0x7f) ? e : '?', at);
            }
            continue;
        }
        if (c < 0x80) { o[w++] = (char)c; p->pos++; continue; }
        /* multi-byte UTF-8: validate strictly and copy */
        int len; uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return kn_set_error(KN_ERR_FORMAT, "JSON: invalid UTF-8 byte 0x%02x at byte %zu", c, p->pos);
        if (p->len - p->pos < (size_t)len)
            return kn_set_error(KN_ERR_FORMAT, "JSON: truncated UTF-8 sequence at byte %zu", p->pos);
        for (int k = 1; k < len; k++) {
            unsigned char cc = p->s[p->pos + (size_t)k];
            if ((cc & 0xC0) != 0x80)
                return kn_set_error(KN_ERR_FORMAT, "JSON: invalid UTF-8 sequence at byte %zu", p->pos);
            cp = cp << 6 | (cc & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return kn_set_error(KN_ERR_FORMAT, "JSON: invalid UTF-8 (overlong or surrogate) at byte %zu", p->pos);
        memcpy(o + w, p->s + p->pos, (size_t)len);
        w += (size_t)len;
        p->pos += (size_t)len;
    }
    o[w] = 0;
    *off = p->j->sbuf_used;
    *n = w;
    p->j->sbuf_used += w + 1;
    return KN_OK;
}

static kn_status parse_number(jp *p, jnode *n) {
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    bool integral = true;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len) goto bad;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9') while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    else goto bad;
    if (i < p->len && s[i] == '.') {
        integral = false; i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') goto bad;
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = false; i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') goto bad;
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t len = i - start;
    char buf[512];
    if (len >= sizeof buf)
        return kn_set_error(KN_ERR_FORMAT, "JSON: number at byte %zu is %zu characters long (limit %zu)",
                            start, len, sizeof buf - 1);
    memcpy(buf, s + start, len);
    buf[len] = 0;
    n->num = strtod(buf, NULL);
    if (integral) {
        /* exact int64, with overflow detection */
        bool neg = buf[0] == '-';
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        bool ok = true;
        for (const char *c = buf + neg; *c; c++) {
            uint64_t d = (uint64_t)(*c - '0');
            if (v > (lim - d) / 10) { ok = false; break; }
            v = v * 10 + d;
        }
        if (ok) {
            n->is_int = true;
            n->inum = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
        }
    }
    p->pos = i;
    return KN_OK;
bad:
    return kn_set_error(KN_ERR_FORMAT, "JSON: malformed number at byte %zu", start);
}

static bool match_lit(jp *p, const char *lit) {
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0) return false;
    p->pos += n;
    return true;
}

kn_status kn_json_parse(const char *text, size_t len, kn_json **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_json_parse: out is NULL");
    *out = NULL;
    if (!text && len) return kn_set_error(KN_ERR_INVALID, "kn_json_parse: text is NULL");
    if (len > SIZE_MAX / 2) return kn_set_error(KN_ERR_LIMIT, "JSON text too large");
    kn_json *j = calloc(1, sizeof *j);
    if (!j) return kn_set_error(KN_ERR_NOMEM, "out of memory parsing JSON");
    j->sbuf = malloc(len + 1);
    if (!j->sbuf) { kn_json_free(j); return kn_set_error(KN_ERR_NOMEM, "out of memory parsing %zu bytes of JSON", len); }
    jp p = {(const unsigned char *)(text ? text : ""), len, 0, j};
    int64_t stack[KN_JSON_MAX_DEPTH];
    int depth = 0;
    kn_status st = KN_OK;
    size_t key_off = 0, key_len = 0;
    bool have_key = false;

    for (;;) {
        /* ---- expect a value (preceded by "key": inside an object) ---- */
        skip_ws(&p);
        if (depth > 0 && j->nodes[stack[depth - 1]].type == KN_JSON_OBJECT) {
            if (p.pos >= p.len || p.s[p.pos] != '"') {
                st = kn_set_error(KN_ERR_FORMAT, "JSON: expected a string key at byte %zu", p.pos);
                goto fail;
            }
            if ((st = parse_string(&p, &key_off, &key_len)) != KN_OK) goto fail;
            have_key = true;
            skip_ws(&p);
            if (p.pos >= p.len || p.s[p.pos] != ':') {
                st = kn_set_error(KN_ERR_FORMAT, "JSON: expected ':' after key at byte %zu", p.pos);
                goto fail;
            }
            p.pos++;
            skip_ws(&p);
        }
        if (p.pos >= p.len) {
            st = kn_set_error(KN_ERR_FORMAT, "JSON: unexpected end of input at byte %zu (expected a value)", p.pos);
            goto fail;
        }
        unsigned char c = p.s[p.pos];
        kn_json_type t;
        switch (c) {
        case '{': t = KN_JSON_OBJECT; break;
        case '[': t = KN_JSON_ARRAY; break;
        case '"': t = KN_JSON_STRING; break;
        case 't': case 'f': t = KN_JSON_BOOL; break;
        case 'n': t = KN_JSON_NULL; break;
        default:
            if (c == '-' || (c >= '0' && c <= '9')) { t = KN_JSON_NUMBER; break; }
            st = kn_set_error(KN_ERR_FORMAT, "JSON: unexpected character '%c' at byte %zu (expected a value)",
                              (c >= 0x20 && c < 0x7f) ? c : '?', p.pos);
            goto fail;
        }
        int64_t id = new_node(&p, t);
        if (id < 0) { st = kn_set_error(KN_ERR_NOMEM, "out of memory parsing JSON"); goto fail; }
        jnode *n = &j->nodes[id];
        if (depth > 0) {
            jnode *par = &j->nodes[stack[depth - 1]];
            if (par->last >= 0) j->nodes[par->last].next = id; else par->first = id;
            par->last = id;
            par->n++;
            if (have_key) { n->key = key_off; n->key_len = key_len + 1; have_key = false; }
        }
        size_t at = p.pos;
        bool opened = false;
        switch (t) {
        case KN_JSON_OBJECT: case KN_JSON_ARRAY:
            if (depth >= KN_JSON_MAX_DEPTH) {
                st = kn_set_error(KN_ERR_LIMIT, "JSON: nesting deeper than %d levels at byte %zu",
                                  KN_JSON_MAX_DEPTH, at);
                goto fail;
            }
            stack[depth++] = id;
            p.pos++;
            skip_ws(&p);
            if (p.pos < p.len && p.s[p.pos] == (t == KN_JSON_OBJECT ? '}' : ']')) { p.pos++; depth--; }
            else opened = true;
            break;
        case KN_JSON_STRING: {
            size_t off, len2;
            if ((st = parse_string(&p, &off, &len2)) != KN_OK) goto fail;
            n = &j->nodes[id];
            n->str = off; n->n = (int64_t)len2;
            break;
        }
        case KN_JSON_BOOL:
            if (match_lit(&p, "true")) n->b = true;
            else if (match_lit(&p, "false")) n->b = false;
            else { st = kn_set_error(KN_ERR_FORMAT, "JSON: invalid literal at byte %zu", at); goto fail; }
            break;
        case KN_JSON_NULL:
            if (!match_lit(&p, "null")) { st = kn_set_error(KN_ERR_FORMAT, "JSON: invalid literal at byte %zu", at); goto fail; }
            break;
        case KN_JSON_NUMBER:
            if ((st = parse_number(&p, n)) != KN_OK) goto fail;
            break;
        }
        if (opened) continue;
        /* ---- after a value: ',' or closers ---- */
        for (;;) {
            skip_ws(&p);
            if (depth == 0) {
                if (p.pos != p.len) {
                    st = kn_set_error(KN_ERR_FORMAT, "JSON: unexpected data after the value at byte %zu", p.pos);
                    goto fail;
                }
                *out = j;
                return KN_OK;
            }
            kn_json_type top = j->nodes[stack[depth - 1]].type;
            char close = top == KN_JSON_OBJECT ? '}' : ']';
            if (p.pos < p.len && p.s[p.pos] == ',') { p.pos++; break; }
            if (p.pos < p.len && p.s[p.pos] == close) { p.pos++; depth--; continue; }
            st = kn_set_error(KN_ERR_FORMAT, "JSON: expected ',' or '%c' at byte %zu", close, p.pos);
            goto fail;
        }
    }
fail:
    kn_json_free(j);
    return st;
}

kn_status kn_json_load(const char *path, kn_json **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_json_load: out is NULL");
    *out = NULL;
    kn_mapfile *m;
    kn_status s = kn_mapfile_open(path, &m);
    if (s != KN_OK) return s;
    s = kn_json_parse(m->data, m->size, out);
    kn_mapfile_close(m);
    if (s != KN_OK) {
        char msg[900];
        strncpy(msg, kn_last_error(), sizeof msg - 1);
        msg[sizeof msg - 1] = 0;
        return kn_set_error(s, "%s: %s", path, msg);
    }
    return KN_OK;
}

/* ---- accessors ---------------------------------------------------------------- */

static const jnode *node(const kn_json *j, int64_t v) {
    return (j && v >= 0 && v < j->n_nodes) ? &j->nodes[v] : NULL;
}
int64_t kn_json_n_nodes(const kn_json *j) { return j ? j->n_nodes : 0; }
kn_json_type kn_json_kind(const kn_json *j, int64_t v) {
    const jnode *n = node(j, v);
    return n ? n->type : KN_JSON_NULL;
}
int64_t kn_json_count(const kn_json *j, int64_t v) {
    const jnode *n = node(j, v);
    return (n && (n->type == KN_JSON_ARRAY || n->type == KN_JSON_OBJECT)) ? n->n : 0;
}
int64_t kn_json_first(const kn_json *j, int64_t v) {
    const jnode *n = node(j, v);
    return (n && (n->type == KN_JSON_ARRAY || n->type == KN_JSON_OBJECT)) ? n->first : -1;
}
int64_t kn_json_next(const kn_json *j, int64_t v) {
    const jnode *n = node(j, v);
    return n ? n->next : -1;
}
const char *kn_json_key(const kn_json *j, int64_t v, size_t *len) {
    const jnode *n = node(j, v);
    if (!n || !n->key_len) return NULL;
    if (len) *len = n->key_len - 1;
    return j->sbuf + n->key;
}
int64_t kn_json_get(const kn_json *j, int64_t obj, const char *key) {
    const jnode *o = node(j, obj);
    if (!o || o->type != KN_JSON_OBJECT || !key) return -1;
    size_t kl = strlen(key);
    for (int64_t c = o->first; c >= 0; c = j->nodes[c].next) {
        const jnode *m = &j->nodes[c];
        if (m->key_len - 1 == kl && memcmp(j->sbuf + m->key, key, kl) == 0) return c;
    }
    return -1;
}
int64_t kn_json_at(const kn_json *j, int64_t arr, int64_t i) {
    const jnode *a = node(j, arr);
    if (!a || (a->type != KN_JSON_ARRAY && a->type != KN_JSON_OBJECT) || i < 0 || i >= a->n) return -1;
    int64_t c = a->first;
    while (i-- > 0) c = j->nodes[c].next;
    return c;
}
const char *kn_json_str(const kn_json *j, int64_t v, size_t *len) {
    const jnode *n = node(j, v);
    if (!n || n->type != KN_JSON_STRING) return NULL;
    if (len) *len = (size_t)n->n;
    return j->sbuf + n->str;
}
bool kn_json_num(const kn_json *j, int64_t v, double *out) {
    const jnode *n = node(j, v);
    if (!n || n->type != KN_JSON_NUMBER) return false;
    *out = n->num;
    return true;
}
bool kn_json_is_int_literal(const kn_json *j, int64_t v) {
    const jnode *n = node(j, v);
    return n && n->type == KN_JSON_NUMBER && n->is_int;
}
bool kn_json_int(const kn_json *j, int64_t v, int64_t *out) {
    const jnode *n = node(j, v);
    if (!n || n->type != KN_JSON_NUMBER) return false;
    if (n->is_int) { *out = n->inum; return true; }
    /* 1.0e3 style: accept when the double is an exact integer in range */
    if (n->num >= -9223372036854775808.0 && n->num < 9223372036854775808.0 &&
        (double)(int64_t)n->num == n->num) {
        *out = (int64_t)n->num;
        return true;
    }
    return false;
}
bool kn_json_bool(const kn_json *j, int64_t v, bool *out) {
    const jnode *n = node(j, v);
    if (!n || n->type != KN_JSON_BOOL) return false;
    *out = n->b;
    return true;
}
bool kn_json_get_i64(const kn_json *j, int64_t obj, const char *key, int64_t *out) {
    return kn_json_int(j, kn_json_get(j, obj, key), out);
}
bool kn_json_get_f64(const kn_json *j, int64_t obj, const char *key, double *out) {
    return kn_json_num(j, kn_json_get(j, obj, key), out);
}
bool kn_json_get_bool(const kn_json *j, int64_t obj, const char *key, bool *out) {
    return kn_json_bool(j, kn_json_get(j, obj, key), out);
}
const char *kn_json_get_str(const kn_json *j, int64_t obj, const char *key) {
    return kn_json_str(j, kn_json_get(j, obj, key), NULL);
}
