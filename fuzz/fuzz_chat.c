/* fuzz_chat.c: libFuzzer harness for the chat template renderer (src/llm/chat.c).
 *
 * (the built-in families; templates from text run through the interpreter,
 * whose harness is fuzz_jinja.c)
 *
 * Input layout (any bytes are fine; missing parts are empty):
 *   byte 0            flags: bit 0 add_generation_prompt, bits 1-2 which
 *                     built-in template renders the messages
 *   template text     up to the first 0x01 byte: ignored (kept so that the
 *                     seed corpus stays valid)
 *   messages          then records "role 0x02 content" separated by 0x01
 *                     (at most 16)
 * The messages are rendered with a named template. Invariants checked with abort(): measuring
 * (buf NULL, cap 0) and rendering agree on the length; the rendered text
 * has exactly that length; a buffer one byte short gives KN_ERR_LIMIT and an
 * empty string; any smaller buffer is never written past (ASan); every
 * message's content (ChatML: verbatim) appears in the output.
 *
 * Build and run (from the repository root; fuzz/run.sh does this):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
 *     fuzz/fuzz_chat.c src/llm/chat.c src/llm/jinja_*.c src/formats/gguf.c src/formats/hfconfig.c \
 *     src/formats/mapfile.c src/core/status.c src/core/dtype.c src/core/utf8.c -lm -o /tmp/fuzz_chat
 *   /tmp/fuzz_chat fuzz/corpus/chat
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

static void render_checks(const kn_chat_tmpl *t, const kn_chat_msg *m, size_t n, bool gen, size_t shrink) {
    size_t need = 12345;
    kn_status st = kn_chat_apply(t, m, n, gen, NULL, 0, &need);
    if (st == KN_ERR_INVALID) {              /* e.g. Llama 2 roles that do not alternate */
        check(need == 0, "needed set on a refusal");
        char small[8];
        check(kn_chat_apply(t, m, n, gen, small, sizeof small, &need) == KN_ERR_INVALID, "refusal depends on the buffer");
        return;
    }
    check(st == KN_ERR_LIMIT, "measuring with cap 0 is not KN_ERR_LIMIT");
    char *buf = malloc(need + 1);
    if (!buf) abort();
    size_t need2 = 0;
    check(kn_chat_apply(t, m, n, gen, buf, need + 1, &need2) == KN_OK, "render into need + 1 bytes failed");
    check(need2 == need && strlen(buf) == need, "rendered length differs from the measured one");
    if (t->format == KN_CHAT_CHATML)
        for (size_t i = 0; i < n; i++) check(strstr(buf, m[i].content) != NULL, "a message's content is missing");
    if (gen && t->format != KN_CHAT_LLAMA2) check(need > 0, "empty generation prompt");
    free(buf);
    /* a buffer one byte short, and an arbitrary shorter one: exact size
     * allocations so that ASan sees a write past the end */
    size_t caps[2] = {need, shrink % (need + 1)};
    for (int k = 0; k < 2; k++) {
        size_t cap = caps[k];
        char *b = malloc(cap ? cap : 1);
        if (!b) abort();
        st = kn_chat_apply(t, m, n, gen, cap ? b : NULL, cap, &need2);
        check(st == KN_ERR_LIMIT && need2 == need, "a short buffer is not KN_ERR_LIMIT with the needed size");
        if (cap) check(b[0] == 0, "a short buffer is not left as an empty string");
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
    /* the messages */
    kn_chat_msg msgs[MAX_MSGS];
    char *owned[2 * MAX_MSGS];
    size_t n = 0, n_owned = 0;
    const uint8_t *p = sep ? sep + 1 : data + size, *end = data + size;
    while (p < end && n < MAX_MSGS) {
        const uint8_t *rec_end = memchr(p, 0x01, (size_t)(end - p));
        if (!rec_end) rec_end = end;
        const uint8_t *mid = memchr(p, 0x02, (size_t)(rec_end - p));
        const uint8_t *role_end = mid ? mid : p;          /* no 0x02: empty role? use "user" */
        char *role = mid ? dup_range(p, (size_t)(role_end - p)) : dup_range((const uint8_t *)"user", 4);
        char *content = dup_range(mid ? mid + 1 : p, (size_t)(rec_end - (mid ? mid + 1 : p)));
        owned[n_owned++] = role; owned[n_owned++] = content;
        msgs[n++] = (kn_chat_msg){role, content};
        p = rec_end + 1;
    }
    bool gen = flags & 1;
    size_t shrink = (size_t)flags * 2654435761u;

    /* the template text itself goes through the interpreter: fuzz_jinja.c checks that */
    (void)jinja;
    static const char *names[5] = {"chatml", "llama2", "llama3", "smollm", "plain"};
    kn_chat_tmpl named;
    check(kn_chat_template_from_name(names[((flags >> 1) & 7) % 5], &named) == KN_OK, "a built-in name is refused");
    render_checks(&named, msgs, n, gen, shrink);
    /* a template the caller never initialised is refused, not rendered */
    kn_chat_tmpl zero;
    memset(&zero, 0, sizeof zero);
    size_t need;
    check(kn_chat_apply(&zero, msgs, n, gen, NULL, 0, &need) == KN_ERR_INVALID, "an unset template renders");

    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(jinja);
    return 0;
}
