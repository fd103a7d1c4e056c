/* test_chat.c: chat templates through kiln's Jinja interpreter, byte for byte
 * against transformers' apply_chat_template.
 *
 * tests/fixtures/chat_templates/cases.json (made by scripts/chat_template_ref.py
 * from the real templates in that folder, sources in SOURCES.md): each case
 * renders with kn_chat_apply_json (keep_bos) and must equal transformers'
 * text exactly, or fail as the template failed there (raise_exception: the
 * template's own message); cases of plain text messages also go through
 * kn_chat_apply (leading BOS dropped). All cases render again from 4 threads
 * at once on the same templates. Then: errors that name an unsupported
 * feature, syntax errors with line:column, the limits that stop hostile
 * templates, and the JSON request's normalisation (nulls dropped, OpenAI
 * string arguments parsed).
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_chat.h"
#include "kiln_llm.h"
#include "formats/hfconfig.h"
#include "formats/gguf.h"
#include <pthread.h>
#include <unistd.h>

#define DIR "tests/fixtures/chat_templates/"
#define MAX_T 16

typedef struct fixture {
    kn_json *j;
    int64_t n;
    struct { char name[64]; kn_chat_tmpl t; bool uses_bos; } tm[MAX_T];
    int n_tm;
} fixture;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    if (p) p[n] = 0;
    fclose(f);
    return p;
}

/* the case's template, compiled once per fixture (by file name, or the inline text's index) */
static kn_chat_tmpl *case_tmpl(fixture *fx, int64_t c) {
    const char *file = kn_json_get_str(fx->j, c, "template");
    const char *text = kn_json_get_str(fx->j, c, "template_text");
    char key[64];
    snprintf(key, sizeof key, "%s", file ? file : kn_json_get_str(fx->j, c, "name"));
    for (int i = 0; i < fx->n_tm; i++) if (!strcmp(fx->tm[i].name, key)) return &fx->tm[i].t;
    if (fx->n_tm == MAX_T) {   /* inline snippets: reuse the last slot */
        kn_chat_tmpl_free(&fx->tm[MAX_T - 1].t);
        fx->n_tm--;
    }
    char path[256], *owned = NULL;
    if (file) { snprintf(path, sizeof path, DIR "%s", file); text = owned = slurp(path); }
    if (!text) return NULL;
    kn_chat_tmpl *t = &fx->tm[fx->n_tm].t;
    fx->tm[fx->n_tm].uses_bos = strstr(text, "bos_token") != NULL;
    kn_status st = kn_chat_template_from_string(text, t);
    free(owned);
    if (st != KN_OK) { fprintf(stderr, "  compile %s: %s\n", key, kn_last_error()); return NULL; }
    const char *bos = kn_json_get_str(fx->j, c, "bos"), *eos = kn_json_get_str(fx->j, c, "eos");
    kn_chat_template_set_tokens(t, bos, eos);
    snprintf(fx->tm[fx->n_tm].name, sizeof fx->tm[fx->n_tm].name, "%s", key);
    fx->n_tm++;
    return t;
}

static void show_diff(const char *name, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t b = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: differs at byte %zu\n    got:  '%.*s'\n    want: '%.*s'\n", name, i,
            (int)(strlen(got + b) < 100 ? strlen(got + b) : 100), got + b,
            (int)(strlen(want + b) < 100 ? strlen(want + b) : 100), want + b);
}

/* render case c; returns malloc'd text or NULL (status in *st) */
static char *render_case(const kn_chat_tmpl *t, const kn_json *j, int64_t c, kn_status *st) {
    bool gen = false;
    kn_json_get_bool(j, c, "gen", &gen);
    kn_chat_request rq = {
        .messages_json = kn_json_get_str(j, c, "messages"),
        .tools_json = kn_json_get_str(j, c, "tools"),
        .extra_json = kn_json_get_str(j, c, "extra"),
        .add_generation_prompt = gen, .keep_bos = true,
    };
    size_t need;
    *st = kn_chat_apply_json(t, &rq, NULL, 0, &need);
    if (*st != KN_ERR_LIMIT) return NULL;
    char *buf = malloc(need + 1);
    if (!buf) return NULL;
    size_t need2;
    *st = kn_chat_apply_json(t, &rq, buf, need + 1, &need2);
    if (*st != KN_OK || need2 != need) { free(buf); return NULL; }
    return buf;
}

static fixture *load_fixture(void) {
    static fixture fx;
    if (fx.j) return &fx;
    if (kn_json_load(DIR "cases.json", &fx.j) != KN_OK) return NULL;
    fx.n = kn_json_count(fx.j, 0);
    return &fx;
}

TEST(chat_fixture_cases) {
    fixture *fx = load_fixture();
    REQUIRE(fx, "cannot read " DIR "cases.json: %s", kn_last_error());
    REQUIRE(fx->n >= 100, "only %lld cases", (long long)fx->n);
    int n_ok = 0, n_err = 0, n_simple = 0;
    for (int64_t c = kn_json_first(fx->j, 0); c >= 0; c = kn_json_next(fx->j, c)) {
        const char *name = kn_json_get_str(fx->j, c, "name");
        kn_chat_tmpl *t = case_tmpl(fx, c);
        CHECK(t, "%s: template does not compile", name);
        if (!t) continue;
        kn_status st;
        char *got = render_case(t, fx->j, c, &st);
        const char *want = kn_json_get_str(fx->j, c, "expected"), *err = kn_json_get_str(fx->j, c, "error");
        if (want) {
            CHECK(got, "%s: %s", name, kn_last_error());
            if (got && strcmp(got, want) != 0) { show_diff(name, got, want); CHECK(0, "%s: output differs", name); }
            else if (got) n_ok++;
            /* plain-text conversations also through kn_chat_apply (BOS dropped) */
            const kn_json *j = fx->j;
            kn_json *m = NULL;
            if (got && !kn_json_get_str(j, c, "tools") && !kn_json_get_str(j, c, "extra") &&
                kn_json_parse(kn_json_get_str(j, c, "messages"), strlen(kn_json_get_str(j, c, "messages")), &m) == KN_OK) {
                kn_chat_msg msgs[16]; size_t n = 0; bool simple = true;
                for (int64_t e = kn_json_first(m, 0); e >= 0 && n < 16; e = kn_json_next(m, e)) {
                    const char *r = kn_json_get_str(m, e, "role"), *ct = kn_json_get_str(m, e, "content");
                    if (!r || !ct || kn_json_count(m, e) != 2) simple = false;
                    msgs[n++] = (kn_chat_msg){r, ct};
                }
                if (simple && n > 0) {
                    bool gen = false;
                    kn_json_get_bool(j, c, "gen", &gen);
                    size_t need;
                    static char buf[1 << 16];
                    kn_status s2 = kn_chat_apply(t, msgs, n, gen, buf, sizeof buf, &need);
                    /* a BOS the template wrote is dropped (SmolLM2's <|im_start|> literal is not) */
                    const char *bos = kn_json_get_str(j, c, "bos");
                    bool uses_bos = false;
                    for (int i = 0; i < fx->n_tm; i++) if (&fx->tm[i].t == t) uses_bos = fx->tm[i].uses_bos;
                    size_t skip = uses_bos && bos && strncmp(want, bos, strlen(bos)) == 0 ? strlen(bos) : 0;
                    CHECK(s2 == KN_OK && strcmp(buf, want + skip) == 0, "%s: kn_chat_apply: %s", name,
                          s2 == KN_OK ? buf : kn_last_error());
                    n_simple++;
                }
                kn_json_free(m);
            }
        } else {
            bool raised = false;
            kn_json_get_bool(fx->j, c, "raised", &raised);
            CHECK(!got && st != KN_OK, "%s: rendered although transformers failed (%s)", name, err);
            if (raised) CHECK(st == KN_ERR_INVALID && strstr(kn_last_error(), err) == kn_last_error(),
                              "%s: status %d message '%s', want '%s'", name, (int)st, kn_last_error(), err);
            n_err++;
        }
        free(got);
    }
    fprintf(stderr, "  %d cases equal to transformers (%d also via kn_chat_apply), %d refused as transformers refuses\n",
            n_ok, n_simple, n_err);
}

/* ---- the same renders from 4 threads at once --------------------------------------- */

typedef struct worker { fixture *fx; int bad; } worker;

static void *run_all(void *arg) {
    worker *w = arg;
    for (int rep = 0; rep < 3; rep++)
        for (int64_t c = kn_json_first(w->fx->j, 0); c >= 0; c = kn_json_next(w->fx->j, c)) {
            const char *file = kn_json_get_str(w->fx->j, c, "template");
            if (!file) continue;
            const kn_chat_tmpl *t = NULL;
            for (int i = 0; i < w->fx->n_tm; i++) if (!strcmp(w->fx->tm[i].name, file)) t = &w->fx->tm[i].t;
            if (!t) continue;
            kn_status st;
            char *got = render_case(t, w->fx->j, c, &st);
            const char *want = kn_json_get_str(w->fx->j, c, "expected");
            if (want ? (!got || strcmp(got, want) != 0) : got != NULL) w->bad++;
            free(got);
        }
    return NULL;
}

TEST(chat_threads) {
    fixture *fx = load_fixture();
    REQUIRE(fx, "no fixture");
    for (int64_t c = kn_json_first(fx->j, 0); c >= 0; c = kn_json_next(fx->j, c))
        if (kn_json_get_str(fx->j, c, "template")) case_tmpl(fx, c);   /* compile all first */
    worker w[4] = {{fx, 0}, {fx, 0}, {fx, 0}, {fx, 0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, run_all, &w[i]) == 0, "thread");
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK(w[i].bad == 0, "thread %d: %d renders differ", i, w[i].bad);
}

/* ---- errors (a template past a limit is KN_ERR_INVALID: KN_ERR_LIMIT means "buffer too small") ------------------------------------------------------------------------ */

static kn_status render_text(const char *tmpl, char *buf, size_t cap) {
    kn_chat_tmpl t;
    kn_status st = kn_chat_template_from_string(tmpl, &t);
    if (st != KN_OK) return st;
    kn_chat_msg m[] = {{"user", "hi"}};
    size_t need;
    st = kn_chat_apply(&t, m, 1, true, buf, cap, &need);
    kn_chat_tmpl_free(&t);
    return st;
}

static bool msg_has(const char *a, const char *b) {
    const char *e = kn_last_error();
    return strstr(e, a) && (!b || strstr(e, b));
}

TEST(chat_errors) {
    static char buf[1 << 16];
    kn_chat_tmpl t;
    /* unsupported features are refused when compiled, by name and position */
    CHECK(kn_chat_template_from_string("ok\n  {% call m() %}x{% endcall %}", &t) == KN_ERR_UNSUPPORTED &&
          msg_has("line 2 column 6", "call"), "%s", kn_last_error());
    CHECK(msg_has("--chat-template", NULL), "hint: %s", kn_last_error());
    CHECK(kn_chat_template_from_string("{% include 'x.j2' %}", &t) != KN_OK && msg_has("include", "not supported"), "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{% raw %}{{ x }}{% endraw %}", &t) != KN_OK && msg_has("raw", NULL), "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{{ x | frobnicate }}", &t) == KN_ERR_UNSUPPORTED && msg_has("frobnicate", "line 1 column"),
          "unknown filter: %s", kn_last_error());
    CHECK(kn_chat_template_from_string("{% if x is frob %}{% endif %}", &t) == KN_ERR_UNSUPPORTED && msg_has("frob", NULL),
          "unknown test: %s", kn_last_error());
    CHECK(kn_chat_template_from_string("{% set x %}a{% endset %}", &t) != KN_OK && msg_has("block assignments", NULL), "%s", kn_last_error());
    CHECK(render_text("{{ messages[0].content.zfill(3) }}", buf, sizeof buf) == KN_ERR_UNSUPPORTED && msg_has("zfill", NULL),
          "unknown method: %s", kn_last_error());
    CHECK(render_text("{{ undefined_fn(1) }}", buf, sizeof buf) == KN_ERR_UNSUPPORTED && msg_has("undefined_fn", NULL),
          "unknown function: %s", kn_last_error());
    /* syntax errors */
    CHECK(kn_chat_template_from_string("a\n{% if x %}b", &t) == KN_ERR_FORMAT && msg_has("line 2 column 1", "never closed"),
          "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{{ 'abc }}", &t) == KN_ERR_FORMAT && msg_has("unterminated", NULL), "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{{ (1 + }}", &t) == KN_ERR_FORMAT, "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{% endfor %}", &t) == KN_ERR_FORMAT && msg_has("endfor", NULL), "%s", kn_last_error());
    CHECK(kn_chat_template_from_string("{{ x }", &t) == KN_ERR_FORMAT, "%s", kn_last_error());
    /* runtime errors: the template's own message, Python's type errors */
    CHECK(render_text("{{ raise_exception('Roles must alternate: ' ~ messages[0].role) }}", buf, sizeof buf) == KN_ERR_INVALID &&
          strncmp(kn_last_error(), "Roles must alternate: user", 26) == 0 && msg_has("line 1 column", NULL), "%s", kn_last_error());
    CHECK(render_text("{{ 'a' + 1 }}", buf, sizeof buf) == KN_ERR_INVALID && msg_has("'str' and 'int'", NULL), "%s", kn_last_error());
    CHECK(render_text("{{ nope.x }}", buf, sizeof buf) == KN_ERR_INVALID && msg_has("'nope' is undefined", NULL), "%s", kn_last_error());
    CHECK(render_text("{{ 1 // 0 }}", buf, sizeof buf) == KN_ERR_INVALID, "%s", kn_last_error());
    CHECK(render_text("{{ 9223372036854775807 + 1 }}", buf, sizeof buf) == KN_ERR_INVALID && msg_has("overflow", NULL),
          "%s", kn_last_error());
    CHECK(render_text("{% break %}", buf, sizeof buf) != KN_OK, "break outside a loop");
    /* the family fallback for templates the interpreter refuses */
    CHECK(kn_chat_template_family_of("{% call x() %}<|im_start|>{% endcall %}", &t) == KN_OK && t.format == KN_CHAT_CHATML, "chatml");
    CHECK(kn_chat_template_family_of("<|start_header_id|>", &t) == KN_OK && t.format == KN_CHAT_LLAMA3, "llama3");
    CHECK(kn_chat_template_family_of("[INST]", &t) == KN_OK && t.format == KN_CHAT_LLAMA2, "llama2");
    CHECK(kn_chat_template_family_of("<start_of_turn>", &t) == KN_ERR_UNSUPPORTED && msg_has("--chat-template", NULL), "none");
    CHECK(render_text("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", buf, sizeof buf) == KN_ERR_INVALID &&
          msg_has("not more than 1", NULL), "%s", kn_last_error());
    CHECK(render_text("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}", buf, sizeof buf) == KN_ERR_INVALID &&
          msg_has("no argument 'b'", NULL), "%s", kn_last_error());
}

TEST(chat_limits) {
    static char buf[1 << 16];
    /* steps: a loop that would run 10^10 times stops at once */
    CHECK(render_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", buf, sizeof buf)
          == KN_ERR_INVALID && msg_has("limit", NULL), "steps: %s", kn_last_error());
    /* deep evaluations from shallow parses: long operator and filter chains */
    size_t nchain = 200000;
    char *chain = malloc(nchain * 8 + 32);
    REQUIRE(chain, "oom");
    char *q = chain + sprintf(chain, "{{ 1");
    for (size_t i = 0; i < nchain; i++) q += sprintf(q, " + 1");
    sprintf(q, " }}");
    CHECK(render_text(chain, buf, sizeof buf) == KN_ERR_INVALID && msg_has("deep", NULL), "+ chain: %s", kn_last_error());
    q = chain + sprintf(chain, "{{ 'x'");
    for (size_t i = 0; i < nchain; i++) q += sprintf(q, "|trim");
    sprintf(q, " }}");
    CHECK(render_text(chain, buf, sizeof buf) == KN_ERR_INVALID && msg_has("deep", NULL), "filter chain: %s", kn_last_error());
    free(chain);
    /* values nested deeply by a loop: ==, tojson and printing stay bounded */
    CHECK(render_text("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                      "{{ ns.x == ns.x }}", buf, sizeof buf) == KN_OK && !strcmp(buf, "False"), "deep ==: %s", buf);
    CHECK(render_text("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                      "{{ ns.x|tojson }}", buf, sizeof buf) == KN_ERR_INVALID, "deep tojson: %s", kn_last_error());
    CHECK(render_text("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                      "{{ ns.x }}", buf, sizeof buf) == KN_ERR_INVALID && msg_has("nested", NULL), "deep print: %s", kn_last_error());
    /* macro recursion */
    CHECK(render_text("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", buf, sizeof buf) == KN_ERR_INVALID &&
          msg_has("nested", NULL), "macro recursion: %s", kn_last_error());
    /* work on long strings counts: a loop over a cheap-looking expression on 10 MB stops */
    CHECK(render_text("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% if s|length %}{% endif %}{% endfor %}",
                      buf, sizeof buf) == KN_ERR_INVALID && msg_has("limit", NULL), "string work: %s", kn_last_error());
    CHECK(render_text("{% set s = 'a' * 4000000 %}{% set t = 'a' * 2000000 ~ 'b' %}{{ t in s }}{{ s.find(t) }}{{ s.split(t)|length }}",
                      buf, sizeof buf) == KN_OK && !strcmp(buf, "False-11"), "memmem: %s", buf);
    /* output size */
    CHECK(render_text("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", buf, sizeof buf) == KN_ERR_INVALID,
          "output: %s", kn_last_error());
    /* memory: values growing without output */
    CHECK(render_text("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                      buf, sizeof buf) == KN_ERR_INVALID, "memory: %s", kn_last_error());
    CHECK(render_text("{{ 'x' * 9000000000000000000 }}", buf, sizeof buf) == KN_ERR_INVALID, "repeat: %s", kn_last_error());
    CHECK(render_text("{{ 5555555555553 * []|list }}{{ '' * 9000000000000000000 }}", buf, sizeof buf) == KN_OK && !strcmp(buf, "[]"),
          "empty repeats: %s", buf);
    /* nesting depth: parser recursion is bounded */
    size_t depth = 100000;
    char *deep = malloc(depth * 2 + 16);
    REQUIRE(deep, "oom");
    char *p = deep;
    p += sprintf(p, "{{ ");
    for (size_t i = 0; i < depth; i++) *p++ = '(';
    *p++ = '1';
    for (size_t i = 0; i < depth; i++) *p++ = ')';
    sprintf(p, " }}");
    kn_chat_tmpl t;
    CHECK(kn_chat_template_from_string(deep, &t) == KN_ERR_FORMAT && msg_has("nested", NULL), "depth: %s", kn_last_error());
    p = deep;
    for (size_t i = 0; i < 5000; i++) p += sprintf(p, "{%% if 1 %%}");
    *p = 0;
    CHECK(kn_chat_template_from_string(deep, &t) == KN_ERR_FORMAT, "statement depth: %s", kn_last_error());
    free(deep);
    /* a template larger than the source limit */
    size_t big = (5u << 20);
    char *huge = malloc(big + 1);
    REQUIRE(huge, "oom");
    memset(huge, 'a', big); huge[big] = 0;
    CHECK(kn_chat_template_from_string(huge, &t) == KN_ERR_INVALID, "source size: %s", kn_last_error());
    free(huge);
}

TEST(chat_json_requests) {
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_string("{% for m in messages %}{{ m|tojson }};{% endfor %}{{ tools }}|{{ flag }}", &t) == KN_OK,
            "%s", kn_last_error());
    char buf[1024]; size_t need;
    /* null members are dropped; reasoning is aliased; string arguments parsed on request */
    kn_chat_request rq = {
        .messages_json = "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":"
                         "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1.0, \\\"b\\\": [2]}\"}}]},"
                         "{\"role\":\"assistant\",\"content\":\"x\",\"reasoning\":\"r\"}]",
        .extra_json = "{\"flag\": 2.0}", .parse_arguments = true,
    };
    REQUIRE(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    const char *want = "{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                       "\"arguments\": {\"a\": 1.0, \"b\": [2]}}}]};"
                       "{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"x\", \"reasoning\": \"r\", "
                       "\"reasoning_content\": \"r\"};None|2.0";
    CHECK(strcmp(buf, want) == 0, "got\n%s\nwant\n%s", buf, want);
    rq.parse_arguments = false;
    REQUIRE(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    CHECK(strstr(buf, "\"arguments\": \"{\\\"a\\\": 1.0, \\\"b\\\": [2]}\"") != NULL, "kept as a string: %s", buf);
    /* malformed requests */
    rq.messages_json = "[{\"role\": ";
    CHECK(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_ERR_FORMAT, "bad JSON");
    rq.messages_json = "{}";
    CHECK(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_ERR_INVALID, "not an array");
    rq.messages_json = "[1]";
    CHECK(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_ERR_INVALID, "not an object");
    rq.messages_json = "[]"; rq.extra_json = "{\"messages\": 1}";
    CHECK(kn_chat_apply_json(&t, &rq, buf, sizeof buf, &need) == KN_ERR_INVALID, "extra overriding messages");
    kn_chat_tmpl_free(&t);
    kn_chat_tmpl_free(&t);   /* freeing twice is safe */
    /* built-in families: text only */
    REQUIRE(kn_chat_template_from_name("chatml", &t) == KN_OK, "name");
    kn_chat_request ok = {.messages_json = "[{\"role\":\"user\",\"content\":\"hi\"}]", .add_generation_prompt = true};
    REQUIRE(kn_chat_apply_json(&t, &ok, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    CHECK(!strcmp(buf, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "%s", buf);
    ok.tools_json = "[]";
    CHECK(kn_chat_apply_json(&t, &ok, buf, sizeof buf, &need) == KN_ERR_UNSUPPORTED, "tools on a built-in template");
    /* measuring */
    ok.tools_json = NULL;
    CHECK(kn_chat_apply_json(&t, &ok, NULL, 0, &need) == KN_ERR_LIMIT &&
          need == strlen("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "measure: %zu", need);
}

TEST(chat_smollm2_gguf) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(path, "rb");
    if (!f) SKIP("%s missing (sh scripts/fetch_model.sh)", path);
    fclose(f);
    kn_gguf *g;
    REQUIRE(kn_gguf_open(path, &g) == KN_OK, "%s", kn_last_error());
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_gguf(g, &t) == KN_OK, "%s", kn_last_error());
    CHECK(t.format == KN_CHAT_JINJA && !strcmp(t.bos_token, "<|im_start|>") && !strcmp(t.eos_token, "<|im_end|>"),
          "format %d bos '%s' eos '%s'", (int)t.format, t.bos_token, t.eos_token);
    kn_chat_msg m[] = {{"user", "What is the capital of France?"}};
    char out[1024]; size_t need;
    REQUIRE(kn_chat_apply(&t, m, 1, true, out, sizeof out, &need) == KN_OK, "%s", kn_last_error());
    CHECK(!strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                       "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"), "%s", out);
    kn_chat_tmpl_free(&t);
    kn_gguf_close(g);
}

/* a Hugging Face model directory: chat_template.jinja beside config.json wins
 * over tokenizer_config.json's chat_template (newer downloads ship it so) */
static bool write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(text, 1, strlen(text), f) == strlen(text);
    return fclose(f) == 0 && ok;
}

TEST(chat_template_jinja_file) {
    char dir[] = "/tmp/kn_chat_XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    char p[256], *cfg = slurp("tests/fixtures/qwen/qwen3/config.json");
    REQUIRE(cfg, "qwen3 fixture missing");
    snprintf(p, sizeof p, "%s/config.json", dir); REQUIRE(write_file(p, cfg), "write");
    free(cfg);
    char *abs = realpath("tests/fixtures/qwen/qwen3/model.safetensors", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    REQUIRE(abs && symlink(abs, p) == 0, "symlink");
    free(abs);
    /* a three-token BPE vocabulary: enough to load */
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    REQUIRE(write_file(p, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"<s>\": 2}, \"merges\": []},"
                          " \"added_tokens\": [{\"id\": 2, \"content\": \"<s>\", \"special\": true}]}"), "write");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    REQUIRE(write_file(p, "{\"bos_token\": \"<s>\", \"chat_template\": \"from the config\"}"), "write");
    kn_model_opts o = {.n_ctx = 32};
    kn_model *m = NULL;
    if (kn_model_load(dir, &o, &m) != KN_OK) { CHECK(0, "load: %s", kn_last_error()); }
    else {
        CHECK(kn_model_chat_template(m) && !strcmp(kn_model_chat_template(m), "from the config"), "tokenizer_config: '%s'",
              kn_model_chat_template(m) ? kn_model_chat_template(m) : "(null)");
        kn_model_free(m);
    }
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    REQUIRE(write_file(p, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\n"), "write");
    m = NULL;
    if (kn_model_load(dir, &o, &m) != KN_OK) { CHECK(0, "load: %s", kn_last_error()); }
    else {
        const char *ct = kn_model_chat_template(m);
        CHECK(ct && !strcmp(ct, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\n"), "chat_template.jinja: '%s'",
              ct ? ct : "(null)");
        kn_model_free(m);
    }
    const char *names[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 5; i++) { snprintf(p, sizeof p, "%s/%s", dir, names[i]); unlink(p); }
    rmdir(dir);
}

KN_TEST_MAIN()
