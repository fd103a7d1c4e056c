/* cli.h: what the subcommands of the kiln program share: the parsed
 * options, model loading, the token printer and chat-template rendering.
 * Each subcommand lives in its own tools/cmd_*.c file; tools/kiln.c parses
 * the command line (with the option table of tools/cli_args.c) and dispatches.
 *
 * Exit status of every subcommand: 0 ok, 1 error, 2 usage.
 */
#ifndef KN_TOOLS_CLI_H
#define KN_TOOLS_CLI_H

#include "kiln.h"
#include "kiln_chat.h"
#include "kiln_llm.h"
#include "kiln_backend.h"
#include "cli_args.h"
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* cli_args (the parsed options) and the option table: cli_args.h */

/* --backend cpu|cuda (else KN_BACKEND); NULL after a message when the
 * choice cannot be honoured */
kn_backend *cli_pick_backend(const cli_args *a);
/* loads -m with the options' tokenizer, context, backend; NULL after a message */
kn_model *cli_load(const cli_args *a);
/* kn_generate callback: writes the piece to stdout and flushes */
bool cli_print_token(void *ud, int32_t tok, const char *text, size_t len);
/* --chat-template NAME, else the model's own; false after a message */
bool cli_get_template(kn_model *m, const cli_args *a, kn_chat_tmpl *t);
/* the rendered conversation with the assistant prompt open; NULL on failure */
char *cli_render(const kn_chat_tmpl *t, const kn_chat_msg *msgs, size_t n);
double cli_now_s(void);
/* Prompt-processing progress on stderr, as kn_generate_params.progress with
 * a cli_progress as progress_ud: on a terminal, once the prefill has run for
 * a second, a line rewritten in place ("prompt: 1536/7425 tokens (20%)") and
 * erased when it ends; nothing when stderr is not a terminal, so piped
 * output stays clean. Returns false (cancel) once *cancel is set. */
typedef struct cli_progress {
    double t0;                      /* set by the call with done == 0 */
    bool shown;
    volatile sig_atomic_t *cancel;  /* NULL: never cancel (Ctrl-C then ends the program) */
} cli_progress;
bool cli_show_progress(void *ud, int done, int total);

int cmd_generate(const cli_args *a);
int cmd_tokenize(const cli_args *a);
int cmd_bench(const cli_args *a);
int cmd_chat(const cli_args *a);
int cmd_perplexity(const cli_args *a);
int cmd_serve(const cli_args *a);          /* tools/cmd_serve.c */
int kn_cli_train(int argc, char **argv);   /* tools/train.c */
int kn_cli_export(int argc, char **argv);  /* tools/cmd_export.c */
int kn_cli_run(int argc, char **argv);     /* tools/cmd_run.c */
/* Starts nproc ranks of argv (argv[0] a program on PATH or a path) with the
 * rendezvous variables set, waits for them, stops the rest when one fails;
 * port <= 0: a free one. Returns the exit status (tools/cmd_run.c). */
int kn_cli_launch(int nproc, const char *addr, int port, char *const *argv);
/* The same for this kiln binary with the arguments argv[1..argc) (argv[0] is
 * replaced by the binary's path): a command that starts its own ranks. */
int kn_cli_launch_self(int nproc, const char *addr, int port, int argc, char *const *argv);
int kn_cli_quantize(int argc, char **argv);  /* tools/cmd_quantize.c */
int kn_cli_convert(int argc, char **argv);   /* tools/cmd_quantize.c */

#endif
