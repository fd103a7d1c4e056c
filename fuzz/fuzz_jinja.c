/* fuzz_jinja.c: libFuzzer harness for the chat-template interpreter
 * (src/llm/jinja_*.c through src/llm/chat.c).
 *
 * Input layout (any bytes are fine; missing parts are empty):
 *   byte 0          flags: bit 0 add_generation_prompt, bit 1 the rest is a
 *                   JSON request (else message records), bit 2 keep_bos,
 *                   bit 3 parse_arguments
 *   template text   up to the first 0x01 byte: kn_chat_template_from_string
 *   then either     records "role 0x02 content" separated by 0x01 (at most
 *                   16) for kn_chat_apply,
 *   or              JSON text: messages, then optionally 0x01 tools JSON,
 *                   then 0x01 extra JSON, for kn_chat_apply_json.
 * Invariants (abort()): compiling gives OK or a FORMAT / UNSUPPORTED /
 * INVALID error with a message; rendering gives OK-with-measure
 * (KN_ERR_LIMIT at cap 0) or an error that does not depend on the buffer;
 * measuring and rendering agree on the length, the text has that length,
 * rendering twice gives the same bytes (unless the template reads the
 * clock), a buffer one byte short is KN_ERR_LIMIT with an empty string and
 * never written past (ASan). Time and memory are bounded by the
 * interpreter's limits (libFuzzer's -timeout and -rss_limit_mb catch a miss).
 *
 * Build and run (from the repository root; fuzz/run.sh does this):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
 *     fuzz/fuzz_jinja.c src/llm/chat.c src/llm/jinja_*.c src/formats/gguf.c src/formats/hfconfig.c \
 *     src/formats/mapfile.c src/core/status.c src/core/dtype.c src/core/utf8.c -lm -o /tmp/fuzz_jinja
 *   /tmp/fuzz_jinja fuzz/corpus/jinja
 */
#include "kiln_chat.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MSGS 16

static void check(int cond, const char *what) {
    if (!cond) { fprintf(stderr, "invariant failed: %s (%s)\n", what, kn_last_error()); abort(); }
}

static char *dup_range(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, p, n);
    s[n] = 0;       /* an embedded NUL simply ends the string early */
    return s;
}

typedef struct req {
    bool json, gen;
    const kn_chat_msg *m; size_t n;
    kn_chat_request rq;
} req;

static kn_status apply(const kn_chat_tmpl *t, const req *r, char *buf, size_t cap, size_t *need) {
    if (r->json) return kn_chat_apply_json(t, &r->rq, buf, cap, need);
    return kn_chat_apply(t, r->m, r->n, r->gen, buf, cap, need);
}

static void render_checks(const kn_chat_tmpl *t, const req *r, bool clock) {
    size_t need = 12345;
    kn_status st = apply(t, r, NULL, 0, &need);
    if (st != KN_ERR_LIMIT) {
        check(st != KN_OK, "rendered into a zero-byte buffer");
        check(kn_last_error()[0] != 0, "an error without a message");
        char small[8];
        size_t n2;
        check(apply(t, r, small, sizeof small, &n2) == st, "the error depends on the buffer");
        return;
    }
    char *buf = malloc(need + 1), *again = malloc(need + 1);
    if (!buf || !again) abort();
    size_t need2 = 0;
    check(apply(t, r, buf, need + 1, &need2) == KN_OK, "render into need + 1 bytes failed");
    check(need2 == need, "rendered length differs from the measured one");
    if (!clock) {
        check(apply(t, r, again, need + 1, &need2) == KN_OK && memcmp(buf, again, need + 1) == 0, "two renders differ");
    }
    free(buf); free(again);
    if (need > 0) {   /* exact-size allocation: ASan sees a write past the end */
        char *b = malloc(need);
        if (!b) abort();
        st = apply(t, r, b, need, &need2);
        check(st == KN_ERR_LIMIT && need2 == need && b[0] == 0, "a buffer one byte short");
        free(b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    data++; size--;
    const uint8_t *sep = memchr(data, 0x01, size);
    size_t tlen = sep ? (size_t)(sep - data) : size;
    char *jinja = dup_range(data, tlen);
    const uint8_t *p = sep ? sep + 1 : data + size, *end = data + size;

    req r = {.json = flags & 2, .gen = flags & 1};
    kn_chat_msg msgs[MAX_MSGS];
    char *owned[2 * MAX_MSGS + 3];
    size_t n_owned = 0;
    if (r.json) {
        const char *parts[3] = {NULL, NULL, NULL};
        for (int k = 0; k < 3 && p <= end; k++) {
            const uint8_t *e = memchr(p, 0x01, (size_t)(end - p));
            if (!e) e = end;
            parts[k] = owned[n_owned++] = dup_range(p, (size_t)(e - p));
            p = e + 1;
        }
        r.rq = (kn_chat_request){.messages_json = parts[0] ? parts[0] : "[]", .tools_json = parts[1], .extra_json = parts[2],
                                 .add_generation_prompt = r.gen, .keep_bos = flags & 4, .parse_arguments = flags & 8};
    } else {
        size_t n = 0;
        while (p < end && n < MAX_MSGS) {
            const uint8_t *rec_end = memchr(p, 0x01, (size_t)(end - p));
            if (!rec_end) rec_end = end;
            const uint8_t *mid = memchr(p, 0x02, (size_t)(rec_end - p));
            char *role = mid ? dup_range(p, (size_t)(mid - p)) : dup_range((const uint8_t *)"user", 4);
            char *content = dup_range(mid ? mid + 1 : p, (size_t)(rec_end - (mid ? mid + 1 : p)));
            owned[n_owned++] = role; owned[n_owned++] = content;
            msgs[n++] = (kn_chat_msg){role, content};
            p = rec_end + 1;
        }
        r.m = msgs; r.n = n;
    }

    kn_chat_tmpl t;
    kn_status st = kn_chat_template_from_string(jinja, &t);
    if (st == KN_OK) {
        check(t.format == KN_CHAT_JINJA && t.prog, "compiled without a program");
        kn_chat_template_set_tokens(&t, "<s>", "</s>");
        render_checks(&t, &r, strstr(jinja, "strftime_now") != NULL);
        kn_chat_tmpl_free(&t);
        check(t.prog == NULL, "free left the program");
    } else {
        check(st == KN_ERR_FORMAT || st == KN_ERR_UNSUPPORTED || st == KN_ERR_INVALID || st == KN_ERR_NOMEM,
              "unexpected compile status");
        check(kn_last_error()[0] != 0, "a compile error without a message");
    }
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(jinja);
    return 0;
}
