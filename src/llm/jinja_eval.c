/* jinja_eval.c: render a jprog: walk the AST with a scope stack of variables
 * over the caller's context dict, Python semantics for the operators, and
 * Jinja's for-loop (loop.index, index0, revindex, revindex0, first, last,
 * length, previtem, nextitem; `if` filters; else; break/continue) and set
 * (a for-loop body is its own scope, so only namespace() attributes carry
 * values out of a loop, as in Jinja).
 * Limits: output bytes, arena bytes and steps (jinja_impl.h); recursion is
 * bounded by the parser's nesting limit.
 */
#include "llm/jinja_impl.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kn_status jinja_error(const jnode *n, kn_status st, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kn_set_error(st, "chat template line %d column %d: %s", n->line, n->col, msg);
}

kn_status jinja_oom(const jnode *n) {
    return jinja_error(n, KN_ERR_LIMIT, "the template needs more than %u MiB of values to render (limit)",
                       (unsigned)(JINJA_MAX_MEMORY >> 20));
}

kn_status jinja_work(jctx *c, const jnode *n, size_t bytes) {
    c->steps += (int64_t)(bytes >> 8);
    if (c->steps > JINJA_MAX_STEPS)
        return jinja_error(n, KN_ERR_LIMIT, "rendering took more than %d steps of work (loop iterations, calls, 256-byte blocks of "
                           "text processed; limit)", JINJA_MAX_STEPS);
    return KN_OK;
}

kn_status jinja_step(jctx *c, const jnode *n) {
    if (++c->steps > JINJA_MAX_STEPS)
        return jinja_error(n, KN_ERR_LIMIT, "rendering took more than %d loop iterations and calls (limit)", JINJA_MAX_STEPS);
    return KN_OK;
}

#define TRY(x) do { kn_status st_ = (x); if (st_ != KN_OK) return st_; } while (0)

/* ========================================================================== */
/* variables                                                                  */
/* ========================================================================== */

static bool lookup(const jctx *c, const char *nm, size_t n, jv *out) {
    for (size_t i = c->n_vars; i-- > 0;)
        if (c->vars[i].n == n && memcmp(c->vars[i].name, nm, n) == 0) { *out = c->vars[i].v; return true; }
    const jv *v = c->ctx ? jd_get(c->ctx, nm, n) : NULL;
    if (v) { *out = *v; return true; }
    static const struct { const char *name; int fn; } G[] = {
        {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}, {"namespace", JF_NAMESPACE},
        {"range", JF_RANGE}, {"dict", JF_DICT},
    };
    for (size_t i = 0; i < sizeof G / sizeof *G; i++)
        if (strlen(G[i].name) == n && memcmp(G[i].name, nm, n) == 0) { jv f = {0}; f.t = JV_FUNC; f.fn.id = G[i].fn; *out = f; return true; }
    return false;
}

static kn_status set_var(jctx *c, const jnode *at, const char *nm, size_t n, jv v) {
    for (size_t i = c->n_vars; i-- > c->frame;)
        if (c->vars[i].n == n && memcmp(c->vars[i].name, nm, n) == 0) { c->vars[i].v = v; return KN_OK; }
    if (c->n_vars == c->cap_vars) {
        size_t cap = c->cap_vars ? c->cap_vars * 2 : 32;
        void *nv = ja_alloc(c->a, cap * sizeof *c->vars);
        if (!nv) return jinja_oom(at);
        if (c->n_vars) memcpy(nv, c->vars, c->n_vars * sizeof *c->vars);
        c->vars = nv; c->cap_vars = cap;
    }
    c->vars[c->n_vars].name = nm; c->vars[c->n_vars].n = n; c->vars[c->n_vars].v = v;
    c->n_vars++;
    return KN_OK;
}

/* ========================================================================== */
/* expressions                                                                */
/* ========================================================================== */

static kn_status eval(jctx *c, const jnode *n, jv *out);

static kn_status undefined_error(const jnode *n, jv v) {
    if (v.s.n) return jinja_error(n, KN_ERR_INVALID, "'%.*s' is undefined", (int)(v.s.n > 200 ? 200 : v.s.n), v.s.p);
    return jinja_error(n, KN_ERR_INVALID, "an undefined value was used");
}

static kn_status type_error(const jnode *n, const char *op, jv a, jv b) {
    return jinja_error(n, KN_ERR_INVALID, "unsupported operand types for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static bool is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double fnum(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }
static int64_t inum(jv v) { return v.t == JV_INT ? v.i : (int64_t)v.b; }

static kn_status concat_str(jctx *c, const jnode *n, jv a, jv b, jv *out) {
    TRY(jinja_work(c, n, (a.t == JV_STR ? a.s.n : 0) + (b.t == JV_STR ? b.s.n : 0)));
    jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
    jv_to_str(c->a, a, &o);
    jv_to_str(c->a, b, &o);
    if (o.oom) return jinja_oom(n);
    *out = jv_str(o.p ? o.p : "", o.n);
    return KN_OK;
}

static kn_status repeat(jctx *c, const jnode *n, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    /* an empty sequence repeated any number of times is empty: no loop over `times` (found by fuzz_jinja) */
    if ((seq.t == JV_STR && seq.s.n == 0) || (seq.t == JV_LIST && seq.l->n == 0)) times = 0;
    if (seq.t == JV_STR) {
        if (seq.s.n && (uint64_t)times > JINJA_MAX_OUTPUT / seq.s.n) return jinja_oom(n);
        size_t total = seq.s.n * (size_t)times;
        char *p = ja_alloc(c->a, total + 1);
        if (!p) return jinja_oom(n);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
        *out = jv_str(p, total);
        return KN_OK;
    }
    if (seq.l->n && (uint64_t)times > (JINJA_MAX_MEMORY / sizeof(jv)) / seq.l->n) return jinja_oom(n);
    jlist *l = jl_new(c->a, seq.l->n * (size_t)times);
    if (!l) return jinja_oom(n);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++) l->v[l->n++] = seq.l->v[k];
    out->t = JV_LIST; out->l = l;
    return KN_OK;
}

static kn_status arith(jctx *c, const jnode *n, int op, jv a, jv b, jv *out) {
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == JOP_CONCAT) {
        return concat_str(c, n, a, b, out);
    }
    if (a.t == JV_UNDEF) return undefined_error(n, a);
    if (b.t == JV_UNDEF) return undefined_error(n, b);
    if (op == JOP_ADD) {
        if (a.t == JV_STR && b.t == JV_STR) return concat_str(c, n, a, b, out);
        if (a.t == JV_LIST && b.t == JV_LIST) {
            jlist *l = jl_new(c->a, a.l->n + b.l->n);
            if (!l) return jinja_oom(n);
            memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
            memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
            l->n = a.l->n + b.l->n;
            out->t = JV_LIST; out->l = l;
            return KN_OK;
        }
    }
    if (op == JOP_MUL) {
        if ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, n, a, inum(b), out);
        if ((b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, n, b, inum(a), out);
    }
    if (!is_num(a) || !is_num(b)) return type_error(n, names[op], a, b);
    bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    if (ints) {
        int64_t x = inum(a), y = inum(b), r;
        switch (op) {
        case JOP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return KN_OK;
        case JOP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return KN_OK;
        case JOP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return KN_OK;
        case JOP_FLOORDIV: case JOP_MOD:
            if (y == 0) return jinja_error(n, KN_ERR_INVALID, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto ovf;
            {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                *out = jv_int(op == JOP_MOD ? m : q);
            }
            return KN_OK;
        case JOP_POW:
            if (y >= 0) {
                int64_t acc = 1;
                if (x == 0) acc = y == 0 ? 1 : 0;
                else if (x == 1) acc = 1;
                else if (x == -1) acc = y % 2 ? -1 : 1;
                else for (int64_t i = 0; i < y; i++) if (__builtin_mul_overflow(acc, x, &acc)) goto ovf;   /* |x| >= 2: at most 63 rounds */
                *out = jv_int(acc);
                return KN_OK;
            }
            break;   /* negative exponent: float */
        default: break;
        }
    }
    double x = fnum(a), y = fnum(b);
    switch (op) {
    case JOP_ADD: *out = jv_float(x + y); return KN_OK;
    case JOP_SUB: *out = jv_float(x - y); return KN_OK;
    case JOP_MUL: *out = jv_float(x * y); return KN_OK;
    case JOP_DIV:
        if (y == 0) return jinja_error(n, KN_ERR_INVALID, "division by zero");
        *out = jv_float(x / y); return KN_OK;
    case JOP_FLOORDIV: case JOP_MOD:
        if (y == 0) return jinja_error(n, KN_ERR_INVALID, "float division or modulo by zero");
        {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            *out = jv_float(op == JOP_MOD ? m : floor(x / y));
        }
        return KN_OK;
    case JOP_POW:
        if (x == 0 && y < 0) return jinja_error(n, KN_ERR_INVALID, "0.0 cannot be raised to a negative power");
        *out = jv_float(pow(x, y)); return KN_OK;
    default: break;
    }
    return type_error(n, names[op], a, b);
ovf:
    return jinja_error(n, KN_ERR_LIMIT, "integer overflow in '%s' (kiln's integers are 64-bit)", names[op]);
}

static kn_status contains(jctx *c, const jnode *n, jv item, jv seq, bool *out) {
    switch (seq.t) {
    case JV_STR:
        if (item.t != JV_STR) return jinja_error(n, KN_ERR_INVALID, "'in <string>' requires a string as the left operand, not '%s'", jv_type_name(item));
        TRY(jinja_work(c, n, seq.s.n));
        *out = jfind(seq.s.p, seq.s.n, item.s.p, item.s.n) != NULL;
        return KN_OK;
    case JV_LIST:
        TRY(jinja_work(c, n, seq.l->n * sizeof(jv)));
        *out = false;
        for (size_t i = 0; i < seq.l->n; i++) if (jv_equal(seq.l->v[i], item)) { *out = true; break; }
        return KN_OK;
    case JV_DICT: *out = jd_getv(seq.d, item) != NULL; return KN_OK;
    case JV_UNDEF: *out = false; return KN_OK;   /* Jinja's Undefined iterates as empty */
    default:
        return jinja_error(n, KN_ERR_INVALID, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
}

static kn_status compare(jctx *c, const jnode *n, int op, jv a, jv b, jv *out) {
    if (a.t == JV_STR && b.t == JV_STR) TRY(jinja_work(c, n, a.s.n < b.s.n ? a.s.n : b.s.n));
    if (a.t == JV_LIST && b.t == JV_LIST) TRY(jinja_work(c, n, (a.l->n < b.l->n ? a.l->n : b.l->n) * sizeof(jv)));
    if (a.t == JV_DICT && b.t == JV_DICT) TRY(jinja_work(c, n, a.d->n * b.d->n * sizeof(jv)));
    if (op == JOP_EQ || op == JOP_NE) { bool e = jv_equal(a, b); *out = jv_bool(op == JOP_EQ ? e : !e); return KN_OK; }
    if (op == JOP_IN || op == JOP_NOTIN) {
        bool in = false;
        TRY(contains(c, n, a, b, &in));
        *out = jv_bool(op == JOP_IN ? in : !in);
        return KN_OK;
    }
    int cmp;
    static const char *const names[] = {"==", "!=", "<", "<=", ">", ">="};
    if (a.t == JV_UNDEF) return undefined_error(n, a);
    if (b.t == JV_UNDEF) return undefined_error(n, b);
    if (!jv_order(a, b, &cmp))
        return jinja_error(n, KN_ERR_INVALID, "'%s' not supported between instances of '%s' and '%s'",
                           names[op - JOP_EQ], jv_type_name(a), jv_type_name(b));
    if (cmp == 2) { *out = jv_bool(false); return KN_OK; }   /* NaN */
    bool r = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
    *out = jv_bool(r);
    return KN_OK;
}

/* Python's slice index normalisation */
static int64_t slice_ix(int64_t i, int64_t len, bool neg_step, bool is_start) {
    if (i < 0) { i += len; if (i < 0) i = neg_step ? -1 : 0; }
    else if (i >= len) i = neg_step ? len - 1 : len;
    (void)is_start;
    return i;
}

static kn_status get_int(jctx *c, const jnode *n, const char *what, int64_t *out, bool *present) {
    *present = false;
    if (!n) return KN_OK;
    jv v;
    TRY(eval(c, n, &v));
    if (v.t == JV_NONE) return KN_OK;
    if (v.t != JV_INT && v.t != JV_BOOL) return jinja_error(n, KN_ERR_INVALID, "slice %s must be an integer or None, not '%s'", what, jv_type_name(v));
    *out = inum(v); *present = true;
    return KN_OK;
}

static kn_status eval_slice(jctx *c, const jnode *n, jv *out) {
    jv obj;
    TRY(eval(c, n->a, &obj));
    if (obj.t == JV_UNDEF) return undefined_error(n, obj);
    /* Jinja emits a Python slice here: other types are a TypeError */
    if (obj.t != JV_STR && obj.t != JV_LIST) return jinja_error(n, KN_ERR_INVALID, "'%s' object is not subscriptable with a slice", jv_type_name(obj));
    int64_t start = 0, stop = 0, step = 1; bool hs, he, hp;
    TRY(get_int(c, n->b, "start", &start, &hs));
    TRY(get_int(c, n->c, "stop", &stop, &he));
    TRY(get_int(c, n->d, "step", &step, &hp));
    if (!hp) step = 1;
    if (step == 0) return jinja_error(n, KN_ERR_INVALID, "slice step cannot be zero");
    if (obj.t == JV_STR) TRY(jinja_work(c, n, obj.s.n));
    int64_t len = obj.t == JV_STR ? (int64_t)u8_len(obj.s.p, obj.s.n) : (int64_t)obj.l->n;
    bool neg = step < 0;
    start = hs ? slice_ix(start, len, neg, true) : (neg ? len - 1 : 0);
    stop = he ? slice_ix(stop, len, neg, false) : (neg ? -1 : len);
    if (obj.t == JV_LIST) {
        jlist *l = jl_new(c->a, 0);
        if (!l) return jinja_oom(n);
        for (int64_t i = start; neg ? i > stop : i < stop; i += step)
            if (!jl_push(c->a, l, obj.l->v[i])) return jinja_oom(n);
        l->tuple = obj.l->tuple;
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    if (step == 1) {
        size_t b = u8_offset(obj.s.p, obj.s.n, (size_t)start), e = stop > start ? u8_offset(obj.s.p, obj.s.n, (size_t)stop) : b;
        *out = jv_str(obj.s.p + b, e - b);
        return KN_OK;
    }
    /* general step over code points: index them first */
    size_t *offs = ja_alloc(c->a, ((size_t)len + 1) * sizeof *offs);
    if (!offs) return jinja_oom(n);
    for (size_t i = 0, k = 0; i < obj.s.n; i++) if (((unsigned char)obj.s.p[i] & 0xC0) != 0x80) offs[k++] = i;
    offs[len] = obj.s.n;
    jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
    for (int64_t i = start; neg ? i > stop : i < stop; i += step) jb_put(&o, obj.s.p + offs[i], offs[i + 1] - offs[i]);
    if (o.oom) return jinja_oom(n);
    *out = jv_str(o.p ? o.p : "", o.n);
    return KN_OK;
}

static kn_status get_item(jctx *c, const jnode *n, jv obj, jv key, jv *out) {
    switch (obj.t) {
    case JV_DICT: {
        TRY(jinja_work(c, n, obj.d->n * sizeof(jv)));   /* lookups are linear */
        const jv *v = jd_getv(obj.d, key);
        *out = v ? *v : (key.t == JV_STR ? jv_undef(key.s.p, key.s.n) : jv_undef(NULL, 0));
        return KN_OK;
    }
    case JV_LIST: case JV_STR: {
        if (key.t != JV_INT && key.t != JV_BOOL) { *out = jv_undef(NULL, 0); return KN_OK; }
        if (obj.t == JV_STR) TRY(jinja_work(c, n, obj.s.n));
        int64_t len = obj.t == JV_LIST ? (int64_t)obj.l->n : (int64_t)u8_len(obj.s.p, obj.s.n);
        int64_t i = inum(key);
        if (i < 0) i += len;
        if (i < 0 || i >= len) { *out = jv_undef(NULL, 0); return KN_OK; }
        if (obj.t == JV_LIST) { *out = obj.l->v[i]; return KN_OK; }
        size_t b = u8_offset(obj.s.p, obj.s.n, (size_t)i), e = u8_offset(obj.s.p, obj.s.n, (size_t)i + 1);
        *out = jv_str(obj.s.p + b, e - b);
        return KN_OK;
    }
    case JV_UNDEF: return undefined_error(n, obj);
    default: *out = jv_undef(NULL, 0); return KN_OK;
    }
}

static kn_status eval_args(jctx *c, const jnode *n, jv **args) {
    *args = NULL;
    if (n->args.n == 0) return KN_OK;
    jv *a = ja_alloc(c->a, (size_t)n->args.n * sizeof *a);
    if (!a) return jinja_oom(n);
    for (int i = 0; i < n->args.n; i++) TRY(eval(c, n->args.v[i], &a[i]));
    *args = a;
    return KN_OK;
}

static kn_status exec_list(jctx *c, const jnlist *l);

/* a macro call: parameters bound in a new scope (positional, then by name,
 * then defaults, else undefined), the body rendered into a string */
static kn_status call_macro(jctx *c, const jnode *call, const jnode *m, const jv *args, int nargs, jv *out) {
    int npos = 0;
    for (int i = 0; i < nargs; i++) {
        if (call->kw && call->kw[i]) {
            bool known = false;
            for (int k = 0; k < m->n_targets; k++)
                if (m->target_n[k] == call->kw_n[i] && !memcmp(m->targets[k], call->kw[i], call->kw_n[i])) known = true;
            if (!known) return jinja_error(call, KN_ERR_INVALID, "macro '%.*s' has no argument '%.*s'", (int)m->name_n, m->name,
                                           (int)call->kw_n[i], call->kw[i]);
        } else npos++;
    }
    if (npos > m->n_targets)
        return jinja_error(call, KN_ERR_INVALID, "macro '%.*s' takes not more than %d argument(s)", (int)m->name_n, m->name, m->n_targets);
    size_t saved_frame = c->frame, saved_n = c->n_vars;
    jbuf *saved_out = c->out;
    jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
    c->frame = c->n_vars;
    kn_status st = KN_OK;
    for (int k = 0; k < m->n_targets && st == KN_OK; k++) {
        jv v = jv_undef(m->targets[k], m->target_n[k]);
        bool set = false;
        for (int i = 0, seen = 0; i < nargs && !set; i++) {
            bool is_kw = call->kw && call->kw[i];
            if (!is_kw && seen++ == k) { v = args[i]; set = true; }
            else if (is_kw && call->kw_n[i] == m->target_n[k] && !memcmp(call->kw[i], m->targets[k], m->target_n[k])) { v = args[i]; set = true; }
        }
        if (!set && m->args.v[k]) st = eval(c, m->args.v[k], &v);   /* defaults see the earlier parameters */
        if (st == KN_OK) st = set_var(c, m, m->targets[k], m->target_n[k], v);
    }
    if (st == KN_OK) { c->out = &o; st = exec_list(c, &m->body); c->out = saved_out; }
    c->brk = 0;
    c->n_vars = saved_n; c->frame = saved_frame;
    if (st != KN_OK) return st;
    *out = jv_str(o.p ? o.p : "", o.n);
    return KN_OK;
}

static kn_status eval_call(jctx *c, const jnode *n, jv *out) {
    jv *args;
    const jnode *f = n->a;
    if (f->k == E_ATTR) {
        jv obj;
        TRY(eval(c, f->a, &obj));
        if (obj.t == JV_UNDEF) return undefined_error(f, obj);
        TRY(eval_args(c, n, &args));
        for (int i = 0; i < n->args.n; i++)
            if (n->kw && n->kw[i]) return jinja_error(n, KN_ERR_UNSUPPORTED, "keyword arguments to methods are not supported ('%.*s=')", (int)n->kw_n[i], n->kw[i]);
        bool found;
        TRY(jinja_step(c, n));
        TRY(jinja_method(c, n, obj, f->name, f->name_n, args, n->args.n, out, &found));
        if (found) return KN_OK;
        if (obj.t == JV_DICT) {
            const jv *v = jd_get(obj.d, f->name, f->name_n);
            if (v && v->t == JV_FUNC && v->fn.id != JF_MACRO) return jinja_call_func(c, n, v->fn.id, args, n->kw, n->kw_n, n->args.n, out);
        }
        return jinja_error(n, KN_ERR_UNSUPPORTED, "'%s' object has no method '%.*s' that kiln's template interpreter knows",
                           jv_type_name(obj), (int)f->name_n, f->name);
    }
    jv fn;
    TRY(eval(c, f, &fn));
    if (fn.t == JV_UNDEF) {
        if (f->k == E_NAME) return jinja_error(n, KN_ERR_UNSUPPORTED, "'%.*s' is undefined: kiln's template interpreter has no such function",
                                              (int)f->name_n, f->name);
        return undefined_error(n, fn);
    }
    if (fn.t != JV_FUNC) return jinja_error(n, KN_ERR_INVALID, "'%s' object is not callable", jv_type_name(fn));
    TRY(eval_args(c, n, &args));
    TRY(jinja_step(c, n));
    if (fn.fn.id == JF_MACRO) return call_macro(c, n, fn.fn.node, args, n->args.n, out);
    return jinja_call_func(c, n, fn.fn.id, args, n->kw, n->kw_n, n->args.n, out);
}

static kn_status eval_node(jctx *c, const jnode *n, jv *out);

/* Every evaluation and statement list counts against one depth budget: the
 * parser bounds nesting, but left-associative chains (a + a + a ..., x|f|f
 * ...) and macro recursion build deep evaluations from shallow parses. */
static kn_status eval(jctx *c, const jnode *n, jv *out) {
    if (c->depth >= JINJA_MAX_EVAL_DEPTH)
        return jinja_error(n, KN_ERR_LIMIT, "expressions, statements and macro calls nested more than %d deep (limit)",
                           JINJA_MAX_EVAL_DEPTH);
    c->depth++;
    kn_status st = eval_node(c, n, out);
    c->depth--;
    return st;
}

static kn_status eval_node(jctx *c, const jnode *n, jv *out) {
    jv a, b;
    switch (n->k) {
    case E_LIT: *out = n->lit; return KN_OK;
    case E_NAME:
        if (!lookup(c, n->name, n->name_n, out)) *out = jv_undef(n->name, n->name_n);
        return KN_OK;
    case E_LIST: {
        jlist *l = jl_new(c->a, (size_t)n->args.n);
        if (!l) return jinja_oom(n);
        for (int i = 0; i < n->args.n; i++) TRY(eval(c, n->args.v[i], &l->v[l->n++]));
        l->tuple = n->op == 1;
        out->t = JV_LIST; out->l = l;
        return KN_OK;
    }
    case E_DICT: {
        jdict *d = jd_new(c->a, (size_t)n->args.n / 2);
        if (!d) return jinja_oom(n);
        for (int i = 0; i + 1 < n->args.n; i += 2) {
            TRY(eval(c, n->args.v[i], &a));
            TRY(eval(c, n->args.v[i + 1], &b));
            if (a.t == JV_LIST || a.t == JV_DICT) return jinja_error(n, KN_ERR_INVALID, "unhashable dict key of type '%s'", jv_type_name(a));
            if (!jd_set(c->a, d, a, b)) return jinja_oom(n);
        }
        out->t = JV_DICT; out->d = d;
        return KN_OK;
    }
    case E_ATTR:
        TRY(eval(c, n->a, &a));
        if (a.t == JV_UNDEF) return undefined_error(n, a);
        if (a.t == JV_DICT) {
            TRY(jinja_work(c, n, a.d->n * sizeof(jv)));   /* lookups are linear */
            const jv *v = jd_get(a.d, n->name, n->name_n);
            *out = v ? *v : jv_undef(n->name, n->name_n);
            return KN_OK;
        }
        *out = jv_undef(n->name, n->name_n);
        return KN_OK;
    case E_ITEM:
        TRY(eval(c, n->a, &a));
        TRY(eval(c, n->b, &b));
        return get_item(c, n, a, b, out);
    case E_SLICE: return eval_slice(c, n, out);
    case E_CALL: return eval_call(c, n, out);
    case E_FILTER: {
        jv *args;
        TRY(eval(c, n->a, &a));
        TRY(eval_args(c, n, &args));
        TRY(jinja_step(c, n));
        return jinja_filter(c, n, a, args, n->kw, n->kw_n, n->args.n, out);
    }
    case E_TEST: {
        jv *args; bool r;
        TRY(eval(c, n->a, &a));
        TRY(eval_args(c, n, &args));
        TRY(jinja_test(c, n, a, args, n->args.n, &r));
        *out = jv_bool(n->op ? !r : r);
        return KN_OK;
    }
    case E_NEG: case E_POS:
        TRY(eval(c, n->a, &a));
        if (a.t == JV_UNDEF) return undefined_error(n, a);
        if (n->k == E_POS && is_num(a)) { *out = a.t == JV_BOOL ? jv_int(a.b) : a; return KN_OK; }
        if (a.t == JV_FLOAT) { *out = jv_float(-a.f); return KN_OK; }
        if (a.t == JV_INT || a.t == JV_BOOL) {
            if (inum(a) == INT64_MIN) return jinja_error(n, KN_ERR_LIMIT, "integer overflow in unary '-'");
            *out = jv_int(-inum(a));
            return KN_OK;
        }
        return jinja_error(n, KN_ERR_INVALID, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', jv_type_name(a));
    case E_NOT:
        TRY(eval(c, n->a, &a));
        *out = jv_bool(!jv_truthy(a));
        return KN_OK;
    case E_AND:
        TRY(eval(c, n->a, &a));
        if (!jv_truthy(a)) { *out = a; return KN_OK; }
        return eval(c, n->b, out);
    case E_OR:
        TRY(eval(c, n->a, &a));
        if (jv_truthy(a)) { *out = a; return KN_OK; }
        return eval(c, n->b, out);
    case E_BIN:
        TRY(eval(c, n->a, &a));
        TRY(eval(c, n->b, &b));
        return arith(c, n, n->op, a, b, out);
    case E_CMP:
        TRY(eval(c, n->a, &a));
        TRY(eval(c, n->b, &b));
        return compare(c, n, n->op, a, b, out);
    case E_COND:
        TRY(eval(c, n->a, &a));
        if (jv_truthy(a)) return eval(c, n->b, out);
        if (n->c) return eval(c, n->c, out);
        *out = jv_undef(NULL, 0);
        return KN_OK;
    default:
        return jinja_error(n, KN_ERR_STATE, "internal: node kind %d is not an expression", (int)n->k);
    }
}

/* ========================================================================== */
/* statements                                                                 */
/* ========================================================================== */

static kn_status emit(jctx *c, const jnode *n, const char *p, size_t len) {
    jb_put(c->out, p, len);
    if (c->out->oom)
        return jinja_error(n, KN_ERR_LIMIT, "the rendered text would exceed %u MiB (limit)", (unsigned)(JINJA_MAX_OUTPUT >> 20));
    return KN_OK;
}

static kn_status bind_targets(jctx *c, const jnode *n, jv item) {
    if (n->n_targets == 1) return set_var(c, n, n->targets[0], n->target_n[0], item);
    if (item.t != JV_LIST || item.l->n != (size_t)n->n_targets)
        return jinja_error(n, KN_ERR_INVALID, "cannot unpack a '%s' into %d loop variables", jv_type_name(item), n->n_targets);
    for (int i = 0; i < n->n_targets; i++) TRY(set_var(c, n, n->targets[i], n->target_n[i], item.l->v[i]));
    return KN_OK;
}

/* the values a for loop walks: list items, dict keys, string characters */
static kn_status iter_items(jctx *c, const jnode *n, jv seq, jlist **out) {
    switch (seq.t) {
    case JV_LIST: *out = seq.l; return KN_OK;
    case JV_UNDEF: *out = jl_new(c->a, 0); return *out ? KN_OK : jinja_oom(n);
    case JV_DICT: {
        if (seq.d->ns) return jinja_error(n, KN_ERR_INVALID, "'Namespace' object is not iterable");
        jlist *l = jl_new(c->a, seq.d->n);
        if (!l) return jinja_oom(n);
        memcpy(l->v, seq.d->k, seq.d->n * sizeof(jv)); l->n = seq.d->n;
        *out = l;
        return KN_OK;
    }
    case JV_STR: {
        TRY(jinja_work(c, n, seq.s.n));
        jlist *l = jl_new(c->a, u8_len(seq.s.p, seq.s.n));
        if (!l) return jinja_oom(n);
        for (size_t i = 0; i < seq.s.n;) {
            size_t j = i + 1;
            while (j < seq.s.n && ((unsigned char)seq.s.p[j] & 0xC0) == 0x80) j++;
            l->v[l->n++] = jv_str(seq.s.p + i, j - i);
            i = j;
        }
        *out = l;
        return KN_OK;
    }
    default:
        return jinja_error(n, KN_ERR_INVALID, "'%s' object is not iterable", jv_type_name(seq));
    }
}

static kn_status exec_for(jctx *c, const jnode *n) {
    jv seq;
    TRY(eval(c, n->a, &seq));
    jlist *items;
    TRY(iter_items(c, n, seq, &items));
    size_t saved_frame = c->frame, saved_n = c->n_vars;
    if (n->b) {   /* {% for x in xs if cond %}: filter first, so loop.length counts what is kept */
        jlist *kept = jl_new(c->a, 0);
        if (!kept) return jinja_oom(n);
        for (size_t i = 0; i < items->n; i++) {
            TRY(jinja_step(c, n));
            c->frame = c->n_vars;
            kn_status st = bind_targets(c, n, items->v[i]);
            jv keep = jv_bool(false);
            if (st == KN_OK) st = eval(c, n->b, &keep);
            c->n_vars = saved_n; c->frame = saved_frame;
            if (st != KN_OK) return st;
            if (jv_truthy(keep) && !jl_push(c->a, kept, items->v[i])) return jinja_oom(n);
        }
        items = kept;
    }
    if (items->n == 0) return exec_list(c, &n->else_body);
    /* one loop object, updated in place each iteration */
    jdict *loop = jd_new(c->a, 9);
    if (!loop) return jinja_oom(n);
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"};
    for (int k = 0; k < 9; k++) { loop->k[k] = jv_str(keys[k], strlen(keys[k])); }
    loop->n = 9;
    jv loopv = {0}; loopv.t = JV_DICT; loopv.d = loop;
    int64_t len = (int64_t)items->n;
    kn_status st = KN_OK;
    for (int64_t i = 0; i < len; i++) {
        if ((st = jinja_step(c, n)) != KN_OK) break;
        loop->v[0] = jv_int(i + 1); loop->v[1] = jv_int(i);
        loop->v[2] = jv_int(len - i); loop->v[3] = jv_int(len - i - 1);
        loop->v[4] = jv_bool(i == 0); loop->v[5] = jv_bool(i == len - 1);
        loop->v[6] = jv_int(len);
        loop->v[7] = i > 0 ? items->v[i - 1] : jv_undef("previtem", 8);
        loop->v[8] = i + 1 < len ? items->v[i + 1] : jv_undef("nextitem", 8);
        c->frame = c->n_vars;
        if ((st = set_var(c, n, "loop", 4, loopv)) == KN_OK && (st = bind_targets(c, n, items->v[i])) == KN_OK)
            st = exec_list(c, &n->body);
        c->n_vars = saved_n; c->frame = saved_frame;
        if (st != KN_OK) break;
        if (c->brk == 1) { c->brk = 0; break; }
        c->brk = 0;
    }
    return st;
}

static kn_status exec_set(jctx *c, const jnode *n) {
    jv v;
    TRY(eval(c, n->a, &v));
    if (n->name) {   /* ns.attr = v */
        jv obj;
        if (!lookup(c, n->targets[0], n->target_n[0], &obj) || obj.t != JV_DICT || !obj.d->ns)
            return jinja_error(n, KN_ERR_INVALID, "cannot assign attribute '%.*s' on '%.*s': it is not a namespace() object",
                               (int)n->name_n, n->name, (int)n->target_n[0], n->targets[0]);
        if (!jd_set(c->a, obj.d, jv_str(n->name, n->name_n), v)) return jinja_oom(n);
        return KN_OK;
    }
    if (n->n_targets == 1) return set_var(c, n, n->targets[0], n->target_n[0], v);
    return bind_targets(c, n, v);
}

static kn_status exec_nodes(jctx *c, const jnlist *l);

static kn_status exec_list(jctx *c, const jnlist *l) {
    if (c->depth >= JINJA_MAX_EVAL_DEPTH)
        return l->n ? jinja_error(l->v[0], KN_ERR_LIMIT, "statements and macro calls nested more than %d deep (limit)",
                                  JINJA_MAX_EVAL_DEPTH)
                    : KN_OK;
    c->depth++;
    kn_status st = exec_nodes(c, l);
    c->depth--;
    return st;
}

static kn_status exec_nodes(jctx *c, const jnlist *l) {
    for (int i = 0; i < l->n && !c->brk; i++) {
        const jnode *n = l->v[i];
        jv v;
        switch (n->k) {
        case N_TEXT: TRY(emit(c, n, n->lit.s.p, n->lit.s.n)); break;
        case N_OUTPUT: {
            TRY(eval(c, n->a, &v));
            if (v.t == JV_STR) { TRY(emit(c, n, v.s.p, v.s.n)); break; }
            jbuf o = {.a = c->a, .limit = JINJA_MAX_OUTPUT};
            if (!jv_to_str(c->a, v, &o)) return jinja_error(n, KN_ERR_INVALID, "a value nested more than %d deep cannot be printed", JINJA_MAX_DEPTH);
            if (o.oom) return jinja_oom(n);
            TRY(emit(c, n, o.p ? o.p : "", o.n));
            break;
        }
        case N_IF:
            TRY(eval(c, n->a, &v));
            TRY(exec_list(c, jv_truthy(v) ? &n->body : &n->else_body));
            break;
        case N_FOR: TRY(exec_for(c, n)); break;
        case N_SET: TRY(exec_set(c, n)); break;
        case N_MACRO: {
            jv f = {0};
            f.t = JV_FUNC; f.fn.id = JF_MACRO; f.fn.node = n;
            TRY(set_var(c, n, n->name, n->name_n, f));
            break;
        }
        case N_BREAK: c->brk = 1; break;
        case N_CONTINUE: c->brk = 2; break;
        default: return jinja_error(n, KN_ERR_STATE, "internal: node kind %d is not a statement", (int)n->k);
        }
    }
    return KN_OK;
}

kn_status jinja_render(const jprog *p, jarena *a, jdict *ctx, jbuf *out) {
    jctx c = {.a = a, .out = out, .ctx = ctx};
    out->limit = JINJA_MAX_OUTPUT;
    kn_status st = exec_list(&c, &p->body);
    if (st == KN_OK && c.brk) st = kn_set_error(KN_ERR_FORMAT, "chat template: break or continue outside a for loop");
    return st;
}
