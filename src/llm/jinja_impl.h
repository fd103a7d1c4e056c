/* jinja_impl.h: the Jinja-subset interpreter that renders chat templates
 * (internal; the public face is kiln_chat.h).
 *
 * Pipeline: jinja_lex.c turns the template text into tokens, applying the
 * whitespace rules transformers configures (trim_blocks, lstrip_blocks,
 * `{%-` / `-%}`, one trailing newline dropped); jinja_parse.c builds an AST
 * (a jprog, immutable once built, so one program renders from many threads
 * at once); jinja_eval.c walks it with a per-render arena of values
 * (jinja_value.c) and the filters, tests, methods and global functions of
 * jinja_builtins.c. Every error names the template line:column.
 *
 * Values follow Jinja on Python: none, bool, int, float, str (UTF-8, indexed
 * by code point), list, dict (insertion ordered) and undefined (what a
 * missing variable, key or attribute gives: falsy, renders as "", an error
 * when used in arithmetic or asked for an attribute).
 *
 * Non-goals: call blocks, template inheritance/includes, `{% raw %}`,
 * autoescape, block set. Each is refused by name.
 */
#ifndef KN_JINJA_IMPL_H
#define KN_JINJA_IMPL_H
#include "kiln_base.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>   /* memmem (_GNU_SOURCE) */

/* Resource limits: a hostile template can neither hang nor exhaust memory. */
#define JINJA_MAX_DEPTH      200          /* parser nesting; value nesting in repr/json/== */
#define JINJA_MAX_EVAL_DEPTH 1000         /* evaluator recursion (chains, macro calls): ~0.5 MiB of stack */
#define JINJA_MAX_OUTPUT     (16u << 20)  /* bytes of rendered text                  */
#define JINJA_MAX_MEMORY     (128u << 20) /* bytes of values one render may allocate */
#define JINJA_MAX_STEPS      2000000      /* loop iterations, calls, 256-byte blocks of text */
#define JINJA_MAX_SOURCE     (4u << 20)   /* template text                           */

/* ---- arena: everything a render (or a program) allocates, freed at once ---- */
typedef struct jblock jblock;
typedef struct jarena {
    jblock *head;
    size_t used, limit;     /* bytes handed out so far, and the cap (0 = none) */
} jarena;
void *ja_alloc(jarena *a, size_t n);           /* zeroed; NULL past the limit or OOM */
void  ja_free(jarena *a);

/* ---- values ---- */
typedef enum jv_type {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC,
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;   /* JV_STR; JV_UNDEF: the missing name */
        jlist *l;
        jdict *d;
        struct { int id; const struct jnode *node; } fn;   /* JV_FUNC: a jfunc id; JF_MACRO: its node */
    };
} jv;
struct jlist { jv *v; size_t n, cap; bool tuple; };   /* tuple: printed as (a, b) */
struct jdict { jv *k, *v; size_t n, cap; bool ns; };   /* ns: a namespace() object */

enum jfunc { JF_RAISE = 1, JF_STRFTIME, JF_NAMESPACE, JF_RANGE, JF_DICT, JF_MACRO };

static inline jv jv_undef(const char *name, size_t n) { jv v = {0}; v.t = JV_UNDEF; v.s.p = name; v.s.n = n; return v; }
static inline jv jv_none(void) { jv v = {0}; v.t = JV_NONE; return v; }
static inline jv jv_bool(bool b) { jv v = {0}; v.t = JV_BOOL; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {0}; v.t = JV_INT; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {0}; v.t = JV_FLOAT; v.f = f; return v; }
static inline jv jv_str(const char *p, size_t n) { jv v = {0}; v.t = JV_STR; v.s.p = p; v.s.n = n; return v; }

/* growable byte buffer in an arena (or malloc'd when a == NULL) */
typedef struct jbuf { char *p; size_t n, cap, limit; jarena *a; bool oom; } jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);

jlist *jl_new(jarena *a, size_t cap);
bool   jl_push(jarena *a, jlist *l, jv v);
jdict *jd_new(jarena *a, size_t cap);
bool   jd_set(jarena *a, jdict *d, jv key, jv val);          /* insert or replace: O(n) */
bool   jd_append(jarena *a, jdict *d, jv key, jv val);       /* no duplicate check  */
const jv *jd_get(const jdict *d, const char *key, size_t n);  /* string key lookup */
const jv *jd_getv(const jdict *d, jv key);

bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* <0, 0, >0; false when the two cannot be ordered (Python TypeError) */
bool jv_order(jv a, jv b, int *cmp);
const char *jv_type_name(jv v);                    /* Python's: 'str', 'int', 'dict', ... */
/* str(v) as Jinja prints it ({{ v }}): None -> "None", lists/dicts as Python repr */
bool jv_to_str(jarena *a, jv v, jbuf *out);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys) */
bool jv_to_json(jarena *a, jv v, int indent, bool sort_keys, jbuf *out, int depth);
/* UTF-8 helpers: code points in s, and the byte offset of code point i */
size_t u8_len(const char *s, size_t n);
size_t u8_offset(const char *s, size_t n, size_t cp);

/* ---- tokens and AST ---- */
typedef enum jtk {
    TK_EOF = 0, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STR, TK_INT, TK_FLOAT, TK_OP,
} jtk;
typedef struct jtok {
    jtk k;
    const char *p; size_t n;     /* text, name, operator, or the decoded string */
    int64_t i; double f;
    int line, col;
} jtok;

typedef enum jnk {
    /* statements */
    N_TEXT = 1, N_OUTPUT, N_IF, N_FOR, N_SET, N_BREAK, N_CONTINUE, N_MACRO,
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND,
} jnk;

typedef struct jnode jnode;
typedef struct jnlist { jnode **v; int n, cap; } jnlist;
struct jnode {
    jnk k;
    int line, col;
    int op;                      /* E_BIN / E_CMP operator (JOP_*); E_TEST: negated   */
    jv lit;                      /* E_LIT                                             */
    const char *name; size_t name_n;   /* E_NAME, E_ATTR, E_FILTER, E_TEST; N_SET attr */
    jnode *a, *b, *c, *d;        /* children (meaning by kind, see jinja_parse.c)     */
    jnlist args;                 /* E_CALL/E_FILTER/E_TEST args, E_LIST items, E_DICT k,v pairs */
    const char **kw; size_t *kw_n;     /* per arg: keyword name or NULL              */
    jnlist body, else_body;      /* N_IF, N_FOR                                       */
    const char **targets; size_t *target_n; int n_targets;   /* N_FOR, N_SET names   */
};
enum { JOP_ADD = 1, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
       JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN };

/* a compiled template: immutable after jinja_compile */
typedef struct jprog {
    jarena arena;                /* nodes, token texts, decoded strings */
    jnlist body;
    bool uses_bos;               /* the text mentions bos_token (see kn_chat_apply) */
} jprog;

/* jinja_lex.c: tokens of src[0..n) (normalised first: line breaks to \n, one
 * trailing newline dropped), allocated in a. */
kn_status jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *n_toks);
/* jinja_parse.c */
kn_status jinja_compile(const char *src, size_t n, jprog **out);
void jinja_free(jprog *p);
/* jinja_eval.c: render with the variables of ctx (a dict) into out. */
kn_status jinja_render(const jprog *p, jarena *a, jdict *ctx, jbuf *out);

/* ---- evaluator state shared with the builtins ---- */
typedef struct jctx {
    jarena *a;
    jbuf *out;
    struct { const char *name; size_t n; jv v; } *vars;   /* scope stack */
    size_t n_vars, cap_vars;
    size_t frame;                /* first var of the innermost scope (a for-loop body) */
    jdict *ctx;                  /* the caller's variables                            */
    int depth;
    int64_t steps;
    int brk;                     /* 1 break, 2 continue (loop control in flight) */
} jctx;
/* every builtin returns KN_OK or an error already set (kn_set_error) naming n's line:col */
kn_status jinja_error(const jnode *n, kn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
kn_status jinja_oom(const jnode *n);
kn_status jinja_step(jctx *c, const jnode *n);        /* count work; error past the limit */
/* count work on `bytes` bytes of data (1 step per 256 bytes): long strings cannot
 * multiply a loop's cost without bound */
kn_status jinja_work(jctx *c, const jnode *n, size_t bytes);
/* first occurrence of needle in hay (linear: memmem), or NULL */
static inline const char *jfind(const char *hay, size_t hn, const char *nd, size_t nn) {
    return nn == 0 ? hay : (const char *)memmem(hay, hn, nd, nn);
}
kn_status jinja_filter(jctx *c, const jnode *n, jv in, const jv *args, const char *const *kw,
                       const size_t *kw_n, int nargs, jv *out);
kn_status jinja_test(jctx *c, const jnode *n, jv in, const jv *args, int nargs, bool *out);
/* obj.name(args): *found = false when obj has no such method */
kn_status jinja_method(jctx *c, const jnode *n, jv obj, const char *name, size_t name_n,
                       const jv *args, int nargs, jv *out, bool *found);
/* names the interpreter knows, checked when a template is compiled */
bool jinja_known_filter(const char *name, size_t n);
bool jinja_known_test(const char *name, size_t n);
kn_status jinja_call_func(jctx *c, const jnode *n, int fn, const jv *args, const char *const *kw,
                          const size_t *kw_n, int nargs, jv *out);
#endif
