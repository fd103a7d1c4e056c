/* cli_args.h: the options of the kiln program's subcommands, and their parser.
 *
 * One table (tools/cli_args.c) names every option: its value kind, the
 * subcommands that take it, its default, its range and its help text. The
 * same table drives parsing, validation and `kiln SUB --help`, so the help
 * can never disagree with what is accepted.
 *
 * The parser has no side effects beyond the cli_args it fills and one-line
 * messages on stderr: it allocates nothing, reads no files and starts no
 * threads (so fuzz/fuzz_cli.c can run it on any input). Strings in cli_args
 * point into argv.
 *
 *   cli_args a;
 *   switch (cli_parse(CLI_GENERATE, argc - 2, argv + 2, &a)) {
 *   case CLI_PARSE_HELP: cli_help(CLI_GENERATE, stdout); return 0;
 *   case CLI_PARSE_USAGE: return 2;           // the message is already on stderr
 *   case CLI_PARSE_OK: break;
 *   }
 */
#ifndef KN_TOOLS_CLI_ARGS_H
#define KN_TOOLS_CLI_ARGS_H

#include "kiln_llm.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* the subcommands whose options the table describes (train has its own
 * parser in tools/train.c) */
typedef enum cli_sub {
    CLI_GENERATE, CLI_CHAT, CLI_INFO, CLI_BENCH, CLI_PERPLEXITY, CLI_TOKENIZE, CLI_SERVE, CLI_N_SUBS
} cli_sub;

enum { CLI_MAX_STOP = 8 };

typedef struct cli_args {
    const char *model, *prompt, *tokenizer, *file, *system, *tmpl, *backend, *gpu_dtype;
    /* n: tokens to generate (0 = until the end of text or of the context);
     * bench: decode tokens. ctx, batch, threads: 0 = the default. */
    int n, ctx, batch, reps, n_prompt_bench, threads;
    int gpus;                      /* tensor-parallel ranks (1: one process) */
    struct kn_dist *dist;          /* set by main when gpus > 1: this rank's communicator */
    int stride;                    /* perplexity --stride (0 = llama.cpp's default windows) */
    bool chat, kv_f16, verbose;
    bool have_temp, have_seed;     /* --temp / --seed given (else the default) */
    kn_sampler_params sp;          /* penalty_last_n: the library's default    */
    const char *stop[CLI_MAX_STOP];
    int n_stop;
    /* serve: --host, --api-key, --port, --parallel, --queue, --timeout (s), --max-body (bytes) */
    const char *host, *api_key;
    int port, parallel, queue, timeout, max_body;
} cli_args;

typedef enum cli_parse_result { CLI_PARSE_OK, CLI_PARSE_HELP, CLI_PARSE_USAGE } cli_parse_result;

/* "generate", ...; false for a name that is not one of the table's */
bool cli_sub_find(const char *name, cli_sub *out);
const char *cli_sub_name(cli_sub sub);

/* Parses the words after the subcommand: *a is set to the defaults, then to
 * the options given. CLI_PARSE_HELP: -h/--help was given (nothing else is
 * checked after it). CLI_PARSE_USAGE: a one-line message is on stderr; exit 2. */
cli_parse_result cli_parse(cli_sub sub, int argc, char *const *argv, cli_args *a);

/* `kiln SUB --help`: usage, what it does, every option with its default */
void cli_help(cli_sub sub, FILE *f);
/* one sentence on what sub does (for `kiln --help`) */
const char *cli_sub_what(cli_sub sub);
/* text from column indent, wrapped before column 100, then a newline */
void cli_wrapped(const char *text, int indent, FILE *f);

#endif
