/* jinja_parse.c: tokens -> AST (a jprog), by recursive descent with Jinja's
 * precedence (lowest first):
 *   x if c else y;  or;  and;  not;  == != < <= > >= in, not in;  + -;  ~;
 *   * / // %;  **;  unary - +;  then postfix .attr [i] [a:b:c] (args),
 *   and last |filter(args) and `is [not] test(args)` on the unary result.
 * Statements: if/elif/else, for (targets, `if` filter, else), set (name or
 * ns.attr), break, continue, macro (parameters with defaults; no caller,
 * varargs or kwargs), and transformers' {% generation %} marker (rendered
 * as its body). Anything else (call, block, include, raw, filter blocks,
 * set blocks) is refused with its name and position.
 * Children by kind: E_ATTR a; E_ITEM a[b]; E_SLICE a[b:c:d]; E_CALL a(args);
 * E_FILTER/E_TEST a|name(args); E_COND b if a else c; E_BIN/E_CMP/E_AND/E_OR
 * a op b; E_NEG/E_POS/E_NOT a; N_OUTPUT a; N_IF a body else_body;
 * N_FOR targets in a [if b] body else_body; N_SET targets[0][.name] = a.
 */
#include "llm/jinja_impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ps {
    jarena *a;
    jtok *t; size_t n, i;
    int depth;
} ps;

static kn_status perr(const jtok *t, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    return kn_set_error(KN_ERR_FORMAT, "chat template line %d column %d: %s", t->line, t->col, msg);
}
static kn_status oom(void) { return kn_set_error(KN_ERR_NOMEM, "chat template: out of memory"); }

static jtok *cur(ps *p) { return &p->t[p->i]; }
static bool is_op(const jtok *t, const char *op) { return t->k == TK_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0; }
static bool is_name(const jtok *t, const char *nm) { return t->k == TK_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0; }
static bool accept_op(ps *p, const char *op) { if (is_op(cur(p), op)) { p->i++; return true; } return false; }
static bool accept_name(ps *p, const char *nm) { if (is_name(cur(p), nm)) { p->i++; return true; } return false; }

static kn_status expect_op(ps *p, const char *op) {
    if (accept_op(p, op)) return KN_OK;
    char m[64];
    snprintf(m, sizeof m, "expected '%s' here", op);
    return perr(cur(p), "%s", m);
}

static jnode *mk(ps *p, jnk k, const jtok *at) {
    jnode *n = ja_alloc(p->a, sizeof *n);
    if (!n) return NULL;
    n->k = k; n->line = at->line; n->col = at->col;
    return n;
}

static bool nl_push(jarena *a, jnlist *l, jnode *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        jnode **v = ja_alloc(a, (size_t)cap * sizeof *v);
        if (!v) return false;
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v; l->cap = cap;
    }
    l->v[l->n++] = n;
    return true;
}

/* args with optional keyword names (kw grows alongside args) */
static bool arg_push(ps *p, jnode *call, jnode *arg, const char *kw, size_t kw_n) {
    int old_cap = call->args.cap;
    if (!nl_push(p->a, &call->args, arg)) return false;
    if (call->args.cap != old_cap || !call->kw) {
        const char **k = ja_alloc(p->a, (size_t)call->args.cap * sizeof *k);
        size_t *kn = ja_alloc(p->a, (size_t)call->args.cap * sizeof *kn);
        if (!k || !kn) return false;
        if (call->kw) { memcpy(k, call->kw, (size_t)(call->args.n - 1) * sizeof *k); memcpy(kn, call->kw_n, (size_t)(call->args.n - 1) * sizeof *kn); }
        call->kw = k; call->kw_n = kn;
    }
    call->kw[call->args.n - 1] = kw; call->kw_n[call->args.n - 1] = kw_n;
    return true;
}

static kn_status parse_expr(ps *p, jnode **out);
static kn_status parse_or(ps *p, jnode **out);
static kn_status parse_unary(ps *p, bool with_filter, jnode **out);

#define TRY(x) do { kn_status st_ = (x); if (st_ != KN_OK) return st_; } while (0)
#define NEW(var, kind, at) do { if (!((var) = mk(p, (kind), (at)))) return oom(); } while (0)

static kn_status enter(ps *p) {
    if (++p->depth > JINJA_MAX_DEPTH) return perr(cur(p), "expression nested more than %s levels deep", "200");
    return KN_OK;
}

/* ---- (args) ---- */
static kn_status parse_call_args(ps *p, jnode *call) {
    TRY(expect_op(p, "("));
    while (!accept_op(p, ")")) {
        if (call->args.n > 0) TRY(expect_op(p, ","));
        if (accept_op(p, ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) return perr(cur(p), "*args and **kwargs in calls are not supported%s", "");
        const char *kw = NULL; size_t kw_n = 0;
        if (cur(p)->k == TK_NAME && is_op(&p->t[p->i + 1], "=")) { kw = cur(p)->p; kw_n = cur(p)->n; p->i += 2; }
        jnode *arg;
        TRY(parse_expr(p, &arg));
        if (!arg_push(p, call, arg, kw, kw_n)) return oom();
    }
    return KN_OK;
}

/* ---- primary: literals, names, (expr), [list], {dict} ---- */
static kn_status parse_primary(ps *p, jnode **out) {
    jtok *t = cur(p);
    jnode *n;
    switch (t->k) {
    case TK_NAME:
        p->i++;
        if (is_name(t, "true") || is_name(t, "True")) { NEW(n, E_LIT, t); n->lit = jv_bool(true); }
        else if (is_name(t, "false") || is_name(t, "False")) { NEW(n, E_LIT, t); n->lit = jv_bool(false); }
        else if (is_name(t, "none") || is_name(t, "None")) { NEW(n, E_LIT, t); n->lit = jv_none(); }
        else { NEW(n, E_NAME, t); n->name = t->p; n->name_n = t->n; }
        *out = n;
        return KN_OK;
    case TK_STR: {
        /* adjacent literals concatenate: "a" "b" */
        size_t total = 0, j = p->i;
        while (p->t[j].k == TK_STR) total += p->t[j++].n;
        NEW(n, E_LIT, t);
        if (j == p->i + 1) n->lit = jv_str(t->p, t->n);
        else {
            char *s = ja_alloc(p->a, total + 1);
            if (!s) return oom();
            size_t o = 0;
            for (; p->i < j; p->i++) { memcpy(s + o, p->t[p->i].p, p->t[p->i].n); o += p->t[p->i].n; }
            n->lit = jv_str(s, total);
            *out = n;
            return KN_OK;
        }
        p->i++;
        *out = n;
        return KN_OK;
    }
    case TK_INT: p->i++; NEW(n, E_LIT, t); n->lit = jv_int(t->i); *out = n; return KN_OK;
    case TK_FLOAT: p->i++; NEW(n, E_LIT, t); n->lit = jv_float(t->f); *out = n; return KN_OK;
    case TK_OP:
        if (accept_op(p, "(")) {
            /* (), (e), (e,), (e, f, ...): tuples become lists */
            if (accept_op(p, ")")) { NEW(n, E_LIST, t); n->op = 1; *out = n; return KN_OK; }
            jnode *e;
            TRY(parse_expr(p, &e));
            if (accept_op(p, ")")) { *out = e; return KN_OK; }
            NEW(n, E_LIST, t);
            n->op = 1;   /* a tuple */
            if (!nl_push(p->a, &n->args, e)) return oom();
            while (accept_op(p, ",")) {
                if (is_op(cur(p), ")")) break;
                TRY(parse_expr(p, &e));
                if (!nl_push(p->a, &n->args, e)) return oom();
            }
            TRY(expect_op(p, ")"));
            *out = n;
            return KN_OK;
        }
        if (accept_op(p, "[")) {
            NEW(n, E_LIST, t);
            while (!accept_op(p, "]")) {
                if (n->args.n > 0) { TRY(expect_op(p, ",")); if (accept_op(p, "]")) break; }
                jnode *e;
                TRY(parse_expr(p, &e));
                if (!nl_push(p->a, &n->args, e)) return oom();
            }
            *out = n;
            return KN_OK;
        }
        if (accept_op(p, "{")) {
            NEW(n, E_DICT, t);
            while (!accept_op(p, "}")) {
                if (n->args.n > 0) { TRY(expect_op(p, ",")); if (accept_op(p, "}")) break; }
                jnode *k, *v;
                TRY(parse_expr(p, &k));
                TRY(expect_op(p, ":"));
                TRY(parse_expr(p, &v));
                if (!nl_push(p->a, &n->args, k) || !nl_push(p->a, &n->args, v)) return oom();
            }
            *out = n;
            return KN_OK;
        }
        {
            char op[8] = {0};
            memcpy(op, t->p, t->n < 7 ? t->n : 7);
            return perr(t, "unexpected '%s' in an expression", op);
        }
    default:
        return perr(t, "expected an expression here%s", "");
    }
}

/* ---- postfix: .name  [index]  [a:b:c]  (args) ---- */
static kn_status parse_postfix(ps *p, jnode *n, jnode **out) {
    for (;;) {
        jtok *t = cur(p);
        if (accept_op(p, ".")) {
            jtok *nm = cur(p);
            jnode *x;
            if (nm->k == TK_NAME) {
                NEW(x, E_ATTR, t); x->a = n; x->name = nm->p; x->name_n = nm->n; p->i++;
            } else if (nm->k == TK_INT) {   /* foo.0 is foo[0] */
                jnode *ix; NEW(ix, E_LIT, nm); ix->lit = jv_int(nm->i); p->i++;
                NEW(x, E_ITEM, t); x->a = n; x->b = ix;
            } else return perr(nm, "expected an attribute name after '.'%s", "");
            n = x;
        } else if (accept_op(p, "[")) {
            jnode *parts[3] = {0};
            int np = 0; bool slice = false;
            for (;;) {
                if (is_op(cur(p), ":")) { slice = true; p->i++; np++; if (np > 2) return perr(cur(p), "too many ':' in a slice%s", ""); continue; }
                if (is_op(cur(p), "]")) break;
                if (parts[np]) return perr(cur(p), "expected ']' or ':' here%s", "");
                TRY(parse_expr(p, &parts[np]));
            }
            TRY(expect_op(p, "]"));
            jnode *x;
            if (!slice) {
                if (!parts[0]) return perr(t, "empty subscript []%s", "");
                NEW(x, E_ITEM, t); x->a = n; x->b = parts[0];
            } else { NEW(x, E_SLICE, t); x->a = n; x->b = parts[0]; x->c = parts[1]; x->d = parts[2]; }
            n = x;
        } else if (is_op(t, "(")) {
            jnode *x; NEW(x, E_CALL, t); x->a = n;
            TRY(parse_call_args(p, x));
            n = x;
        } else break;
    }
    *out = n;
    return KN_OK;
}

/* ---- |filter(args), is [not] test(args) ---- */
static kn_status parse_filter_expr(ps *p, jnode *n, jnode **out) {
    for (;;) {
        jtok *t = cur(p);
        if (accept_op(p, "|")) {
            jtok *nm = cur(p);
            if (nm->k != TK_NAME) return perr(nm, "expected a filter name after '|'%s", "");
            p->i++;
            jnode *x; NEW(x, E_FILTER, nm); x->a = n; x->name = nm->p; x->name_n = nm->n;
            if (!jinja_known_filter(nm->p, nm->n)) {
                char f[64]; snprintf(f, sizeof f, "%.*s", (int)(nm->n < 60 ? nm->n : 60), nm->p);
                return kn_set_error(KN_ERR_UNSUPPORTED, "chat template line %d column %d: filter '%s' is not supported by "
                                    "kiln's template interpreter", nm->line, nm->col, f);
            }
            while (accept_op(p, ".")) {   /* dotted filter names do not exist here */
                return perr(nm, "dotted filter names are not supported%s", "");
            }
            if (is_op(cur(p), "(")) TRY(parse_call_args(p, x));
            n = x;
        } else if (accept_name(p, "is")) {
            bool neg = accept_name(p, "not");
            jtok *nm = cur(p);
            if (nm->k != TK_NAME) return perr(nm, "expected a test name after 'is'%s", "");
            p->i++;
            jnode *x; NEW(x, E_TEST, nm); x->a = n; x->name = nm->p; x->name_n = nm->n; x->op = neg;
            if (!jinja_known_test(nm->p, nm->n)) {
                char f[64]; snprintf(f, sizeof f, "%.*s", (int)(nm->n < 60 ? nm->n : 60), nm->p);
                return kn_set_error(KN_ERR_UNSUPPORTED, "chat template line %d column %d: test '%s' is not supported by "
                                    "kiln's template interpreter", nm->line, nm->col, f);
            }
            jtok *c = cur(p);
            if (is_op(c, "(")) TRY(parse_call_args(p, x));
            else if ((c->k == TK_NAME || c->k == TK_STR || c->k == TK_INT || c->k == TK_FLOAT ||
                      is_op(c, "[") || is_op(c, "{")) &&
                     !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is")) return perr(c, "'is' cannot follow a test name%s", "");
                jnode *arg;
                TRY(parse_primary(p, &arg));
                TRY(parse_postfix(p, arg, &arg));
                if (!arg_push(p, x, arg, NULL, 0)) return oom();
            }
            n = x;
        } else if (is_op(t, "(")) {
            jnode *x; NEW(x, E_CALL, t); x->a = n;
            TRY(parse_call_args(p, x));
            n = x;
        } else break;
    }
    *out = n;
    return KN_OK;
}

static kn_status parse_unary(ps *p, bool with_filter, jnode **out) {
    TRY(enter(p));
    jtok *t = cur(p);
    jnode *n;
    if (accept_op(p, "-") || accept_op(p, "+")) {
        jnode *x;
        TRY(parse_unary(p, false, &x));
        NEW(n, is_op(t, "-") ? E_NEG : E_POS, t); n->a = x;
    } else {
        TRY(parse_primary(p, &n));
    }
    TRY(parse_postfix(p, n, &n));
    if (with_filter) TRY(parse_filter_expr(p, n, &n));
    p->depth--;
    *out = n;
    return KN_OK;
}

static kn_status bin(ps *p, jtok *t, int op, jnode *a, jnode *b, jnode **out) {
    jnode *n; NEW(n, op >= JOP_EQ ? E_CMP : E_BIN, t);
    n->op = op; n->a = a; n->b = b;
    *out = n;
    return KN_OK;
}

static kn_status parse_pow(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_unary(p, true, &l));
    while (is_op(cur(p), "**")) {
        jtok *t = cur(p); p->i++;
        jnode *r;
        TRY(parse_unary(p, true, &r));
        TRY(bin(p, t, JOP_POW, l, r, &l));
    }
    *out = l;
    return KN_OK;
}

static kn_status parse_math2(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_pow(p, &l));
    for (;;) {
        jtok *t = cur(p);
        int op = is_op(t, "*") ? JOP_MUL : is_op(t, "/") ? JOP_DIV : is_op(t, "//") ? JOP_FLOORDIV : is_op(t, "%") ? JOP_MOD : 0;
        if (!op) break;
        p->i++;
        jnode *r;
        TRY(parse_pow(p, &r));
        TRY(bin(p, t, op, l, r, &l));
    }
    *out = l;
    return KN_OK;
}

static kn_status parse_concat(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_math2(p, &l));
    while (is_op(cur(p), "~")) {
        jtok *t = cur(p); p->i++;
        jnode *r;
        TRY(parse_math2(p, &r));
        TRY(bin(p, t, JOP_CONCAT, l, r, &l));
    }
    *out = l;
    return KN_OK;
}

static kn_status parse_math1(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_concat(p, &l));
    for (;;) {
        jtok *t = cur(p);
        int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
        if (!op) break;
        p->i++;
        jnode *r;
        TRY(parse_concat(p, &r));
        TRY(bin(p, t, op, l, r, &l));
    }
    *out = l;
    return KN_OK;
}

/* a < b < c is (a < b) and (b < c) */
static kn_status parse_compare(ps *p, jnode **out) {
    jnode *l, *res = NULL;
    TRY(parse_math1(p, &l));
    for (;;) {
        jtok *t = cur(p);
        int op = is_op(t, "==") ? JOP_EQ : is_op(t, "!=") ? JOP_NE : is_op(t, "<") ? JOP_LT : is_op(t, "<=") ? JOP_LE :
                 is_op(t, ">") ? JOP_GT : is_op(t, ">=") ? JOP_GE : is_name(t, "in") ? JOP_IN : 0;
        if (!op && is_name(t, "not") && is_name(&p->t[p->i + 1], "in")) { op = JOP_NOTIN; p->i++; }
        if (!op) break;
        p->i++;
        jnode *r, *c = NULL;
        TRY(parse_math1(p, &r));
        TRY(bin(p, t, op, l, r, &c));
        if (res) { jnode *a; NEW(a, E_AND, t); a->a = res; a->b = c; res = a; }
        else res = c;
        l = r;
    }
    *out = res ? res : l;
    return KN_OK;
}

static kn_status parse_not(ps *p, jnode **out) {
    jtok *t = cur(p);
    if (is_name(t, "not")) {
        p->i++;
        TRY(enter(p));
        jnode *x, *n;
        TRY(parse_not(p, &x));
        p->depth--;
        NEW(n, E_NOT, t); n->a = x;
        *out = n;
        return KN_OK;
    }
    return parse_compare(p, out);
}

static kn_status parse_and(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_not(p, &l));
    while (is_name(cur(p), "and")) {
        jtok *t = cur(p); p->i++;
        jnode *r, *n;
        TRY(parse_not(p, &r));
        NEW(n, E_AND, t); n->a = l; n->b = r; l = n;
    }
    *out = l;
    return KN_OK;
}

static kn_status parse_or(ps *p, jnode **out) {
    jnode *l;
    TRY(parse_and(p, &l));
    while (is_name(cur(p), "or")) {
        jtok *t = cur(p); p->i++;
        jnode *r, *n;
        TRY(parse_and(p, &r));
        NEW(n, E_OR, t); n->a = l; n->b = r; l = n;
    }
    *out = l;
    return KN_OK;
}

static kn_status parse_expr(ps *p, jnode **out) {
    TRY(enter(p));
    jnode *e;
    TRY(parse_or(p, &e));
    while (is_name(cur(p), "if")) {
        jtok *t = cur(p); p->i++;
        jnode *c, *n;
        TRY(parse_or(p, &c));
        NEW(n, E_COND, t); n->a = c; n->b = e;
        if (accept_name(p, "else")) TRY(parse_expr(p, &n->c));
        e = n;
    }
    p->depth--;
    *out = e;
    return KN_OK;
}

/* ========================================================================== */
/* statements                                                                 */
/* ========================================================================== */

static kn_status parse_body(ps *p, jnlist *out, const char *const *ends, int n_ends, const char *opener, const jtok *open_at);

static kn_status end_tag(ps *p) {
    if (cur(p)->k != TK_BLOCK_END) return perr(cur(p), "expected '%%}' here%s", "");
    p->i++;
    return KN_OK;
}

static kn_status parse_if(ps *p, jnode *n) {
    static const char *const ends[] = {"elif", "else", "endif"};
    TRY(parse_expr(p, &n->a));
    TRY(end_tag(p));
    TRY(parse_body(p, &n->body, ends, 3, "if", &p->t[p->i - 1]));
    /* at BLOCK_BEGIN elif|else|endif */
    p->i++;
    jtok *kw = cur(p); p->i++;
    if (is_name(kw, "elif")) {
        jnode *e; NEW(e, N_IF, kw);
        if (!nl_push(p->a, &n->else_body, e)) return oom();
        TRY(enter(p));
        TRY(parse_if(p, e));
        p->depth--;
        return KN_OK;
    }
    if (is_name(kw, "else")) {
        static const char *const endif[] = {"endif"};
        TRY(end_tag(p));
        TRY(parse_body(p, &n->else_body, endif, 1, "if", kw));
        p->i += 2;
    }
    return end_tag(p);
}

static kn_status parse_targets(ps *p, jnode *n) {
    const char *nm[8]; size_t nn[8]; int k = 0;
    do {
        if (cur(p)->k != TK_NAME) return perr(cur(p), "expected a variable name here%s", "");
        if (k == 8) return perr(cur(p), "more than 8 loop targets%s", "");
        nm[k] = cur(p)->p; nn[k] = cur(p)->n; k++; p->i++;
    } while (accept_op(p, ","));
    n->targets = ja_alloc(p->a, (size_t)k * sizeof *n->targets);
    n->target_n = ja_alloc(p->a, (size_t)k * sizeof *n->target_n);
    if (!n->targets || !n->target_n) return oom();
    memcpy(n->targets, nm, (size_t)k * sizeof *nm);
    memcpy(n->target_n, nn, (size_t)k * sizeof *nn);
    n->n_targets = k;
    return KN_OK;
}

static kn_status parse_for(ps *p, jnode *n, const jtok *kw) {
    static const char *const ends[] = {"else", "endfor"};
    bool paren = accept_op(p, "(");
    TRY(parse_targets(p, n));
    if (paren) TRY(expect_op(p, ")"));
    if (!accept_name(p, "in")) return perr(cur(p), "expected 'in' in a for loop%s", "");
    TRY(parse_or(p, &n->a));
    if (accept_name(p, "if")) TRY(parse_expr(p, &n->b));
    if (is_name(cur(p), "recursive")) return perr(cur(p), "recursive for loops are not supported%s", "");
    TRY(end_tag(p));
    TRY(parse_body(p, &n->body, ends, 2, "for", kw));
    p->i++;
    jtok *e = cur(p); p->i++;
    if (is_name(e, "else")) {
        static const char *const endfor[] = {"endfor"};
        TRY(end_tag(p));
        TRY(parse_body(p, &n->else_body, endfor, 1, "for", kw));
        p->i += 2;
    }
    return end_tag(p);
}

static kn_status parse_set(ps *p, jnode *n) {
    TRY(parse_targets(p, n));
    if (n->n_targets == 1 && accept_op(p, ".")) {
        if (cur(p)->k != TK_NAME) return perr(cur(p), "expected an attribute name after '.'%s", "");
        n->name = cur(p)->p; n->name_n = cur(p)->n; p->i++;
    }
    if (!is_op(cur(p), "=")) {
        if (cur(p)->k == TK_BLOCK_END) return perr(cur(p), "block assignments ({%% set x %%}...{%% endset %%}) are not supported%s", "");
        return perr(cur(p), "expected '=' in a set statement%s", "");
    }
    p->i++;
    jnode *v;
    TRY(parse_expr(p, &v));
    if (is_op(cur(p), ",")) {   /* set a = x, y: a tuple value */
        jnode *l; NEW(l, E_LIST, cur(p));
        if (!nl_push(p->a, &l->args, v)) return oom();
        while (accept_op(p, ",")) { if (cur(p)->k == TK_BLOCK_END) break; TRY(parse_expr(p, &v)); if (!nl_push(p->a, &l->args, v)) return oom(); }
        v = l;
    }
    n->a = v;
    return end_tag(p);
}

/* one statement after `{%`; p->i at its keyword */
static kn_status parse_stmt(ps *p, jnlist *out) {
    jtok *kw = cur(p);
    if (kw->k != TK_NAME) return perr(kw, "expected a statement name after '{%%'%s", "");
    p->i++;
    jnode *n;
    TRY(enter(p));
    if (is_name(kw, "if")) { NEW(n, N_IF, kw); TRY(parse_if(p, n)); }
    else if (is_name(kw, "for")) { NEW(n, N_FOR, kw); TRY(parse_for(p, n, kw)); }
    else if (is_name(kw, "set")) { NEW(n, N_SET, kw); TRY(parse_set(p, n)); }
    else if (is_name(kw, "break") || is_name(kw, "continue")) {
        NEW(n, is_name(kw, "break") ? N_BREAK : N_CONTINUE, kw);
        TRY(end_tag(p));
    } else if (is_name(kw, "macro")) {
        /* {% macro name(a, b=default) %}body{% endmacro %}: targets are the
         * parameters, args their defaults (NULL: none) */
        static const char *const ends[] = {"endmacro"};
        NEW(n, N_MACRO, kw);
        if (cur(p)->k != TK_NAME) return perr(cur(p), "expected the macro's name%s", "");
        n->name = cur(p)->p; n->name_n = cur(p)->n; p->i++;
        TRY(expect_op(p, "("));
        const char *nm[32]; size_t nn[32]; int k = 0;
        while (!accept_op(p, ")")) {
            if (k > 0) TRY(expect_op(p, ","));
            if (cur(p)->k != TK_NAME) return perr(cur(p), "expected a parameter name%s", "");
            if (k == 32) return perr(cur(p), "more than 32 macro parameters%s", "");
            nm[k] = cur(p)->p; nn[k] = cur(p)->n; k++; p->i++;
            jnode *def = NULL;
            if (accept_op(p, "=")) TRY(parse_expr(p, &def));
            if (!nl_push(p->a, &n->args, def)) return oom();
        }
        n->targets = ja_alloc(p->a, (size_t)(k ? k : 1) * sizeof *n->targets);
        n->target_n = ja_alloc(p->a, (size_t)(k ? k : 1) * sizeof *n->target_n);
        if (!n->targets || !n->target_n) return oom();
        if (k) { memcpy(n->targets, nm, (size_t)k * sizeof *nm); memcpy(n->target_n, nn, (size_t)k * sizeof *nn); }
        n->n_targets = k;
        TRY(end_tag(p));
        TRY(parse_body(p, &n->body, ends, 1, "macro", kw));
        p->i += 2;
        TRY(end_tag(p));
    } else if (is_name(kw, "generation")) {
        /* transformers' assistant-mask marker: renders as its body */
        static const char *const ends[] = {"endgeneration"};
        NEW(n, N_IF, kw);
        NEW(n->a, E_LIT, kw); n->a->lit = jv_bool(true);
        TRY(end_tag(p));
        TRY(parse_body(p, &n->body, ends, 1, "generation", kw));
        p->i += 2;
        TRY(end_tag(p));
    } else {
        char name[48];
        size_t k = kw->n < sizeof name - 1 ? kw->n : sizeof name - 1;
        memcpy(name, kw->p, k); name[k] = 0;
        static const char *const known[] = {"call", "filter", "block", "extends", "include", "import", "from",
                                            "with", "autoescape", "do", "endcall", "endfilter", "endblock"};
        for (size_t i = 0; i < sizeof known / sizeof *known; i++)
            if (strcmp(name, known[i]) == 0) {
                perr(kw, "'{%% %s %%}' is not supported by kiln's template interpreter (it runs chat templates: "
                     "if, for, set, break, continue, expressions, filters and tests)", name);
                return KN_ERR_UNSUPPORTED;
            }
        return perr(kw, "unknown or misplaced statement '%s'", name);
    }
    p->depth--;
    return nl_push(p->a, out, n) ? KN_OK : oom();
}

/* statements until `{% <one of ends> ...` (left unconsumed: p->i at its
 * BLOCK_BEGIN) or, with no ends, until EOF */
static kn_status parse_body(ps *p, jnlist *out, const char *const *ends, int n_ends, const char *opener, const jtok *open_at) {
    for (;;) {
        jtok *t = cur(p);
        switch (t->k) {
        case TK_EOF:
            if (n_ends == 0) return KN_OK;
            {
                char m[160];
                snprintf(m, sizeof m, "'{%% %s %%}' opened at line %d column %d is never closed with '{%% %s %%}'",
                         opener, open_at->line, open_at->col, ends[n_ends - 1]);
                return perr(t, "%s", m);
            }
        case TK_TEXT: {
            jnode *n; NEW(n, N_TEXT, t);
            n->lit = jv_str(t->p, t->n);
            if (!nl_push(p->a, out, n)) return oom();
            p->i++;
            break;
        }
        case TK_VAR_BEGIN: {
            p->i++;
            jnode *n; NEW(n, N_OUTPUT, t);
            TRY(parse_expr(p, &n->a));
            if (cur(p)->k != TK_VAR_END) return perr(cur(p), "expected '}}' here%s", "");
            p->i++;
            if (!nl_push(p->a, out, n)) return oom();
            break;
        }
        case TK_BLOCK_BEGIN: {
            jtok *kw = &p->t[p->i + 1];
            for (int e = 0; e < n_ends; e++)
                if (is_name(kw, ends[e])) return KN_OK;
            if (kw->k == TK_NAME && kw->n >= 3 && (memcmp(kw->p, "end", 3) == 0 || is_name(kw, "elif") || is_name(kw, "else"))) {
                char name[48];
                size_t k = kw->n < sizeof name - 1 ? kw->n : sizeof name - 1;
                memcpy(name, kw->p, k); name[k] = 0;
                return perr(kw, "unexpected '{%% %s %%}' (nothing open that it closes)", name);
            }
            p->i++;
            TRY(parse_stmt(p, out));
            break;
        }
        default:
            return perr(t, "unexpected token%s", "");
        }
    }
}

kn_status jinja_compile(const char *src, size_t n, jprog **out) {
    *out = NULL;
    if (n > JINJA_MAX_SOURCE)
        return kn_set_error(KN_ERR_LIMIT, "chat template is %zu bytes; the limit is %u", n, (unsigned)JINJA_MAX_SOURCE);
    jprog *pr = calloc(1, sizeof *pr);
    if (!pr) return oom();
    jtok *toks; size_t nt;
    kn_status st = jinja_lex(&pr->arena, src, n, &toks, &nt);
    if (st == KN_OK) {
        ps p = {.a = &pr->arena, .t = toks, .n = nt};
        st = parse_body(&p, &pr->body, NULL, 0, NULL, NULL);
    }
    pr->uses_bos = strstr(src, "bos_token") != NULL;
    if (st != KN_OK) { jinja_free(pr); return st; }
    *out = pr;
    return KN_OK;
}

void jinja_free(jprog *p) {
    if (!p) return;
    ja_free(&p->arena);
    free(p);
}
