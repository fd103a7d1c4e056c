/* jinja_json.c: JSON (parsed by the project's kn_json reader) -> interpreter
 * values, as Python's json.loads gives them to a template: integers written
 * without fraction or exponent become int, other numbers float, objects keep
 * their member order (duplicate keys: the last value wins, in the first
 * one's place; objects of more than 64 members keep duplicates). Strings are copied into the arena, so the kn_json may be
 * freed at once.
 */
#include "llm/jinja_impl.h"
#include "llm/jinja_json.h"
#include <string.h>

kn_status jinja_from_json(jarena *a, const kn_json *j, int64_t v, jv *out, int depth) {
    if (depth > KN_JSON_MAX_DEPTH) return kn_set_error(KN_ERR_LIMIT, "chat request: JSON nested too deeply");
    switch (kn_json_kind(j, v)) {
    case KN_JSON_NULL: *out = jv_none(); return KN_OK;
    case KN_JSON_BOOL: { bool b = false; kn_json_bool(j, v, &b); *out = jv_bool(b); return KN_OK; }
    case KN_JSON_NUMBER: {
        int64_t i; double d = 0;
        if (kn_json_is_int_literal(j, v) && kn_json_int(j, v, &i)) *out = jv_int(i);
        else { kn_json_num(j, v, &d); *out = jv_float(d); }
        return KN_OK;
    }
    case KN_JSON_STRING: {
        size_t n;
        const char *s = kn_json_str(j, v, &n);
        char *p = ja_alloc(a, n + 1);
        if (!p) return kn_set_error(KN_ERR_LIMIT, "chat request: out of template memory");
        memcpy(p, s, n);
        *out = jv_str(p, n);
        return KN_OK;
    }
    case KN_JSON_ARRAY: {
        jlist *l = jl_new(a, (size_t)kn_json_count(j, v));
        if (!l) return kn_set_error(KN_ERR_LIMIT, "chat request: out of template memory");
        for (int64_t c = kn_json_first(j, v); c >= 0; c = kn_json_next(j, c)) {
            kn_status st = jinja_from_json(a, j, c, &l->v[l->n], depth + 1);
            if (st != KN_OK) return st;
            l->n++;
        }
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    case KN_JSON_OBJECT: {
        jdict *d = jd_new(a, (size_t)kn_json_count(j, v));
        if (!d) return kn_set_error(KN_ERR_LIMIT, "chat request: out of template memory");
        for (int64_t c = kn_json_first(j, v); c >= 0; c = kn_json_next(j, c)) {
            size_t kn;
            const char *k = kn_json_key(j, c, &kn);
            char *kp = ja_alloc(a, kn + 1);
            jv val;
            if (!kp) return kn_set_error(KN_ERR_LIMIT, "chat request: out of template memory");
            memcpy(kp, k, kn);
            kn_status st = jinja_from_json(a, j, c, &val, depth + 1);
            if (st != KN_OK) return st;
            /* small objects: Python's duplicate-key rule (last value, first place);
             * large ones are appended as they come, so that a hostile request
             * cannot make the conversion quadratic (lookups then see the first) */
            bool ok = kn_json_count(j, v) <= 64 ? jd_set(a, d, jv_str(kp, kn), val) : jd_append(a, d, jv_str(kp, kn), val);
            if (!ok) return kn_set_error(KN_ERR_LIMIT, "chat request: out of template memory");
        }
        out->t = JV_DICT; out->d = d;
        return KN_OK;
    }
    }
    return kn_set_error(KN_ERR_FORMAT, "chat request: unknown JSON node");
}
