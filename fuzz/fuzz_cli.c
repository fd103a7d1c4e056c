/* fuzz_cli.c: libFuzzer harness for the kiln program's option parser
 * (tools/cli_args.c, with the number parsers of tools/cli_num.c).
 *
 * The input is split at newlines into argv words (so a word may hold spaces,
 * as a quoted shell word does) and parsed as the options of every
 * subcommand; each help text is written too. Accepted options must lie in
 * their documented ranges; the parser allocates nothing, so any leak or
 * out-of-bounds access is a bug.
 *
 * The parser's one-line messages go to stderr; while it runs, the harness
 * points glibc's `stderr` (an assignable variable there) at /dev/null, so a
 * long run does not fill the log. libFuzzer and the sanitizers keep writing
 * to the real file descriptor 2.
 */
#include "../tools/cli_args.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_WORDS = 256 };

static FILE *g_null;

static void check(bool ok) {
    if (!ok) abort();
}

/* what any accepted command line must satisfy (the ranges of the table) */
static void check_ranges(cli_sub sub, const cli_args *a) {
    check(a->n >= 0 && a->n <= 1 << 20);
    check(a->ctx >= 0 && a->ctx <= (sub == CLI_SERVE ? 1 << 24 : 1 << 20));   /* serve's KV pool may be larger */
    check(a->batch >= 0 && a->batch <= 1 << 20);
    check(a->threads >= 0 && a->threads <= 4096);
    check(a->n_stop >= 0 && a->n_stop <= CLI_MAX_STOP);
    for (int i = 0; i < a->n_stop; i++) check(a->stop[i] != NULL);
    check(a->model != NULL);                                  /* required everywhere */
    if (sub == CLI_GENERATE || sub == CLI_CHAT) {
        const kn_sampler_params *p = &a->sp;
        check(isfinite(p->temp) && p->temp >= 0 && p->temp <= 100);
        check(p->top_p > 0 && p->top_p <= 1);
        check(p->min_p >= 0 && p->min_p <= 1);
        check(p->top_k >= 0);
        check(p->repeat_penalty > 0 && isfinite(p->repeat_penalty));
        check(fabsf(p->freq_penalty) <= 2 && fabsf(p->presence_penalty) <= 2);
    }
    if (sub == CLI_GENERATE || sub == CLI_TOKENIZE) check(a->prompt != NULL);
    if (sub == CLI_BENCH) check(a->n >= 1 && a->reps >= 1 && a->n_prompt_bench >= 1);
    if (sub == CLI_PERPLEXITY) check(a->file != NULL);
    if (a->backend) check(!strcmp(a->backend, "cpu") || !strcmp(a->backend, "cuda"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_null) g_null = fopen("/dev/null", "w");
    if (!g_null) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *words[MAX_WORDS];
    int n = 0;
    for (char *w = buf; n < MAX_WORDS;) {
        words[n++] = w;
        char *nl = strchr(w, '\n');
        if (!nl) break;
        *nl = 0;
        w = nl + 1;
    }
    FILE *saved = stderr;
    stderr = g_null;
    for (int s = 0; s < CLI_N_SUBS; s++) {
        cli_args a;
        cli_parse_result r = cli_parse((cli_sub)s, n, words, &a);
        if (r == CLI_PARSE_OK) check_ranges((cli_sub)s, &a);
        else if (r == CLI_PARSE_HELP) cli_help((cli_sub)s, g_null);
    }
    if (size && data[0] == 'h') cli_wrapped(words[0], (int)(size % 128), g_null);   /* the wrapper on any text */
    stderr = saved;
    free(buf);
    return 0;
}
