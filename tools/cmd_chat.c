/* cmd_chat.c: kiln chat, an interactive conversation on the terminal or a pipe.
 *
 * One line of input is one user turn, of any length. A line that is not
 * valid UTF-8, or that the template or tokenizer refuses, is reported and
 * left out of the conversation; the session goes on. /reset starts over.
 *
 * Ctrl-C while a reply is being produced (prompt processing included) stops
 * that reply; what was printed stays in the conversation, so the model sees
 * what the user saw. A Ctrl-C at the prompt, or a second one within two
 * seconds, ends the session with status 130 (interrupted); Ctrl-D or the end
 * of piped input ends it with status 0.
 *
 * With KN_HAVE_EDITLINE (libedit, found by the Makefile) and a terminal on
 * stdin, lines are read with line editing and history.
 */
#include "cli.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef KN_HAVE_EDITLINE
#include <editline/readline.h>
#endif

/* ---- Ctrl-C ---- */
static volatile sig_atomic_t g_interrupted;   /* a Ctrl-C not yet acted upon */
static double g_last_sigint = -1e9;            /* touched only by the handler */

static void on_sigint(int sig) {
    (void)sig;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);       /* async-signal-safe */
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (g_interrupted || t - g_last_sigint < 2.0) {
        /* the second Ctrl-C: quit now, even in the middle of a prompt chunk */
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
    }
    g_last_sigint = t;
    g_interrupted = 1;
}

/* No SA_RESTART: a Ctrl-C at the prompt makes the blocking read return. */
static void catch_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* ---- reading a line ---- */
typedef enum { LINE_OK, LINE_EOF, LINE_INTERRUPT, LINE_ERROR } line_status;

typedef struct {
    bool tty, editline;
    char *buf;        /* getline's buffer, reused */
    size_t cap;
} line_reader;

/* *line: the line without its end-of-line, NUL-terminated; *len may exceed
 * strlen(*line) when the line holds a NUL byte. Valid until the next call. */
static line_status read_line(line_reader *r, char **line, size_t *len) {
    if (g_interrupted) return LINE_INTERRUPT;    /* Ctrl-C between the reply and the prompt */
#ifdef KN_HAVE_EDITLINE
    if (r->editline) {
        free(r->buf);
        r->buf = readline("> ");
        r->cap = 0;
        if (!r->buf) return g_interrupted ? LINE_INTERRUPT : LINE_EOF;
        if (r->buf[0]) add_history(r->buf);
        *line = r->buf;
        *len = strlen(r->buf);
        return LINE_OK;
    }
#endif
    if (r->tty) { fprintf(stderr, "> "); fflush(stderr); }
    errno = 0;
    ssize_t n = getline(&r->buf, &r->cap, stdin);
    if (n < 0) {
        if (g_interrupted || errno == EINTR) return LINE_INTERRUPT;
        if (ferror(stdin)) return LINE_ERROR;
        return LINE_EOF;
    }
    while (n > 0 && (r->buf[n - 1] == '\n' || r->buf[n - 1] == '\r')) r->buf[--n] = 0;
    *line = r->buf;
    *len = (size_t)n;
    return LINE_OK;
}

/* Why the line cannot be a message, or NULL when it can. */
static const char *line_problem(const char *line, size_t len, char *why, size_t cap) {
    if (strlen(line) != len) return "it contains a NUL byte";
    size_t ok = kn_utf8_valid_prefix(line, len);
    if (ok < len) {
        snprintf(why, cap, "it is not valid UTF-8 (byte %zu of %zu); check the terminal's encoding", ok + 1, len);
        return why;
    }
    return NULL;
}

/* ---- one reply ---- */
/* prints each piece and keeps the whole reply for the conversation history */
typedef struct { char *buf; size_t len, cap; bool nomem; } reply_buf;
static bool chat_cb(void *ud, int32_t tok, const char *text, size_t len) {
    reply_buf *r = ud;
    if (g_interrupted) return false;             /* Ctrl-C: stop this reply */
    cli_print_token(NULL, tok, text, len);
    if (r->len + len + 1 > r->cap) {
        size_t c = r->cap ? r->cap * 2 : 1024;
        while (c < r->len + len + 1) c *= 2;
        char *b = realloc(r->buf, c);
        if (!b) { r->nomem = true; return false; }
        r->buf = b; r->cap = c;
    }
    memcpy(r->buf + r->len, text, len);
    r->len += len;
    r->buf[r->len] = 0;
    return true;
}

/* The conversation: messages, and the strings it owns. */
typedef struct {
    kn_chat_msg *msgs;
    char **owned;
    size_t n, cap, n_sys;
} convo;

static bool convo_push(convo *c, const char *role, char *owned_text) {
    if (c->n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        kn_chat_msg *m2 = realloc(c->msgs, sizeof *m2 * cap);
        if (m2) c->msgs = m2;
        char **o2 = m2 ? realloc(c->owned, sizeof *o2 * cap) : NULL;
        if (!o2) return false;
        c->owned = o2; c->cap = cap;
    }
    c->msgs[c->n] = (kn_chat_msg){role, owned_text};
    c->owned[c->n] = owned_text;
    c->n++;
    return true;
}
static void convo_pop(convo *c) { c->n--; free(c->owned[c->n]); }
static void convo_free(convo *c) {
    for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    free(c->msgs); free(c->owned);
}

typedef enum { TURN_OK, TURN_REJECTED, TURN_FATAL } turn_status;

/* Renders the conversation with the new user line, generates the reply and
 * adds both to it; a line the template or tokenizer refuses is taken out
 * again with a message. */
static turn_status chat_turn(kn_model *m, const kn_chat_tmpl *t, convo *c, kn_generate_params *gp,
                             const char *line) {
    char *copy = strdup(line);
    if (!copy || !convo_push(c, "user", copy)) { free(copy); fprintf(stderr, "kiln chat: out of memory\n"); return TURN_FATAL; }
    /* The whole conversation is rendered each turn (right for any
     * template); gp->reuse skips the tokens the KV cache already holds. */
    char *prompt = cli_render(t, c->msgs, c->n);
    if (!prompt) {
        fprintf(stderr, "kiln chat: line not sent: %s\n", kn_last_error());
        convo_pop(c);
        return TURN_REJECTED;
    }
    reply_buf r = {0};
    kn_generate_stats s;
    kn_status st = kn_generate(m, prompt, gp, chat_cb, &r, &s);
    free(prompt);
    if (r.len || !st) printf("\n");
    fflush(stdout);
    if (st || r.nomem) {
        free(r.buf);
        convo_pop(c);
        if (r.nomem) { fprintf(stderr, "kiln chat: out of memory\n"); return TURN_FATAL; }
        if (st == KN_ERR_LIMIT) {
            fprintf(stderr, "kiln chat: %s\n", kn_last_error());
            if (c->n > c->n_sys)    /* not this line alone: the conversation before it */
                fprintf(stderr, "(the conversation no longer fits the context: /reset starts over)\n");
            return TURN_REJECTED;
        }
        if (st == KN_ERR_INVALID) {   /* the tokenizer refused the text */
            fprintf(stderr, "kiln chat: line not sent: %s\n", kn_last_error());
            return TURN_REJECTED;
        }
        fprintf(stderr, "kiln chat: %s\n", kn_last_error());
        return TURN_FATAL;
    }
    if (g_interrupted) {
        g_interrupted = 0;
        if (s.cancelled) {            /* stopped in the prompt: no reply, the line goes too */
            free(r.buf);
            convo_pop(c);
            fprintf(stderr, "(stopped; the line was not answered. Ctrl-C again or Ctrl-D to quit)\n");
            return TURN_OK;
        }
        fprintf(stderr, "(reply stopped. Ctrl-C again or Ctrl-D to quit)\n");
    }
    if (s.hit_context_limit) fprintf(stderr, "(the reply reached the context limit of %d tokens: /reset starts over)\n", kn_model_n_ctx(m));
    char *reply = r.buf ? r.buf : strdup("");
    if (!reply || !convo_push(c, "assistant", reply)) { free(reply); fprintf(stderr, "kiln chat: out of memory\n"); return TURN_FATAL; }
    return TURN_OK;
}

int cmd_chat(const cli_args *a) {
    for (int i = 0; i < a->n_stop; i++)
        if (!a->stop[i][0]) { fprintf(stderr, "kiln chat: --stop needs a non-empty text\n"); return 2; }
    kn_model *m = cli_load(a);
    if (!m) return 1;
    kn_chat_tmpl t;
    if (!cli_get_template(m, a, &t)) { kn_model_free(m); return 1; }
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = a->n;
    gp.sampling = a->sp;
    if (!a->have_temp) gp.sampling.temp = 0.7f;
    gp.stop = a->stop; gp.n_stop = a->n_stop;
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;                 /* each turn evaluates only what the cache lacks */
    cli_progress prog = {.cancel = &g_interrupted};
    gp.progress = cli_show_progress; gp.progress_ud = &prog;
    convo c = {0};
    if (a->system) {
        char *sys = strdup(a->system);
        if (!sys || !convo_push(&c, "system", sys)) { free(sys); kn_chat_tmpl_free(&t); kn_model_free(m); return 1; }
    }
    c.n_sys = c.n;
    line_reader lr = {.tty = isatty(0)};
#ifdef KN_HAVE_EDITLINE
    lr.editline = lr.tty;
    if (lr.editline) rl_outstream = stderr;    /* the prompt on stderr: stdout holds only replies */
#endif
    catch_sigint();
    int rc = 0;
    for (;;) {
        char *line; size_t len;
        line_status ls = read_line(&lr, &line, &len);
        if (ls == LINE_EOF) { if (lr.tty) fprintf(stderr, "\n"); break; }
        if (ls == LINE_INTERRUPT) { if (lr.tty) fprintf(stderr, "\n"); rc = 130; break; }
        if (ls == LINE_ERROR) { fprintf(stderr, "kiln chat: cannot read standard input: %s\n", strerror(errno)); rc = 1; break; }
        if (!len) continue;
        char why[128];
        const char *bad = line_problem(line, len, why, sizeof why);
        if (bad) { fprintf(stderr, "kiln chat: line not sent: %s\n", bad); continue; }
        if (!strcmp(line, "/reset")) {
            while (c.n > c.n_sys) convo_pop(&c);
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (chat_turn(m, &t, &c, &gp, line) == TURN_FATAL) { rc = 1; break; }
    }
    signal(SIGINT, SIG_DFL);
    free(lr.buf);
    convo_free(&c);
    kn_kv_tokens_free(&kv);
    kn_chat_tmpl_free(&t);
    kn_model_free(m);
    return rc;
}
