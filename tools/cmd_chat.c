/* cmd_chat.c: kiln chat, an interactive conversation on the terminal or a pipe. */
#include "cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* prints each piece and keeps the whole reply for the conversation history */
typedef struct { char *buf; size_t len, cap; } reply_buf;
static bool chat_cb(void *ud, int32_t tok, const char *text, size_t len) {
    reply_buf *r = ud;
    cli_print_token(NULL, tok, text, len);
    if (r->len + len + 1 > r->cap) {
        size_t c = r->cap ? r->cap * 2 : 1024;
        while (c < r->len + len + 1) c *= 2;
        char *b = realloc(r->buf, c);
        if (!b) return false;
        r->buf = b; r->cap = c;
    }
    memcpy(r->buf + r->len, text, len);
    r->len += len;
    r->buf[r->len] = 0;
    return true;
}

int cmd_chat(const cli_args *a) {
    kn_model *m = cli_load(a);
    if (!m) return 1;
    kn_chat_tmpl t;
    if (!cli_get_template(m, a, &t)) { kn_model_free(m); return 1; }
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = a->n;
    gp.sampling = a->sp;
    if (!a->have_temp) gp.sampling.temp = 0.7f;
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;                 /* each turn evaluates only what the cache lacks */
    size_t cap = 64, n = 0;
    kn_chat_msg *msgs = malloc(sizeof *msgs * cap);
    char **owned = malloc(sizeof *owned * cap);
    if (!msgs || !owned) { kn_model_free(m); return 1; }
    if (a->system) { msgs[n] = (kn_chat_msg){"system", a->system}; owned[n++] = NULL; }
    size_t n_sys = n;
    char line[8192];
    bool tty = isatty(0);
    int rc = 0;
    for (;;) {
        if (tty) { fprintf(stderr, "> "); fflush(stderr); }
        if (!fgets(line, sizeof line, stdin)) break;            /* Ctrl-D or end of piped input */
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/reset")) {
            for (size_t i = n_sys; i < n; i++) free(owned[i]);
            n = n_sys;
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (n + 2 > cap) {
            cap *= 2;
            kn_chat_msg *m2 = realloc(msgs, sizeof *msgs * cap);
            char **o2 = realloc(owned, sizeof *owned * cap);
            if (!m2 || !o2) { rc = 1; break; }
            msgs = m2; owned = o2;
        }
        owned[n] = strdup(line);
        msgs[n] = (kn_chat_msg){"user", owned[n]};
        n++;
        /* The whole conversation is rendered each turn (right for any
         * template); gp.reuse skips the tokens the KV cache already holds. */
        char *prompt = cli_render(&t, msgs, n);
        if (!prompt) { fprintf(stderr, "kiln: cannot render the chat template\n"); rc = 1; break; }
        reply_buf r = {0};
        kn_generate_stats s;
        kn_status st = kn_generate(m, prompt, &gp, chat_cb, &r, &s);
        free(prompt);
        printf("\n");
        fflush(stdout);
        if (st) {
            fprintf(stderr, "kiln: %s\n", kn_last_error());
            free(r.buf);
            n--; free(owned[n]);
            if (st == KN_ERR_LIMIT) { fprintf(stderr, "(the conversation no longer fits the context: /reset starts over)\n"); continue; }
            rc = 1; break;
        }
        owned[n] = r.buf ? r.buf : strdup("");
        msgs[n] = (kn_chat_msg){"assistant", owned[n]};
        n++;
    }
    for (size_t i = 0; i < n; i++) free(owned[i]);
    free(msgs); free(owned);
    kn_kv_tokens_free(&kv);
    kn_model_free(m);
    return rc;
}
