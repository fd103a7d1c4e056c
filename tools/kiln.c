/* kiln.c: the command-line program.
 *
 *   kiln generate -m MODEL -p PROMPT [-n N] [--temp T --top-k K --top-p P --min-p M --seed S] [--chat]
 *   kiln chat -m MODEL [--system TEXT] [--chat-template chatml|llama2|llama3]
 *   kiln info MODEL
 *   kiln bench -m MODEL [-p 512] [-n 128] [-r 3]
 *   kiln perplexity -m MODEL -f TEXT|- [--ctx N] [--stride N]
 *   kiln tokenize -m MODEL -p TEXT
 *   kiln serve -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N] [--api-key KEY]
 *   kiln train mnist|char|gpt2 ...    (tools/train.c parses its own options)
 *   kiln export -m CKPT -o OUT.gguf   (tools/cmd_export.c, likewise)
 *   kiln quantize IN OUT TYPE, kiln convert HFDIR OUT.gguf   (tools/cmd_quantize.c, likewise)
 *   kiln help [COMMAND], kiln COMMAND --help, kiln --version
 *
 * The options of every command are in one table (tools/cli_args.c), which
 * also writes the help. Generated text and help go to stdout; statistics and
 * messages go to stderr. Exit status: 0 ok, 1 error, 2 usage.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE      /* sched_getaffinity, CPU_COUNT (the Makefile defines it too) */
#endif
#include "cli.h"
#include "kiln_dist.h"
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static void short_usage(void) {
    fprintf(stderr, "usage: kiln COMMAND [options]\nkiln --help lists the commands; kiln COMMAND --help lists its options\n");
}

/* A seed nobody chose: the kernel's random bytes, else the clock and the pid. */
static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) == (ssize_t)sizeof s) return s;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t got = read(fd, &s, sizeof s);
        close(fd);
        if (got == (ssize_t)sizeof s) return s;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
}

/* the CPUs this process may run on */
static int n_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* -t: more threads than cores only slows the matmuls down (they wait for
 * each other), so a larger count is lowered, with a note */
static void set_threads(cli_args *a) {
    if (a->threads <= 0) return;
    int cores = n_cores();
    if (a->threads > cores) {
        fprintf(stderr, "kiln: -t %d is more than the %d cores this process may use; using %d\n", a->threads, cores, cores);
        a->threads = cores;
    }
    kn_set_threads(a->threads);
}

static int cmd_info(const cli_args *a) {
    if (kn_model_print_info(a->model, stdout) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
    return 0;
}

/* --gpus N (tensor parallel). Outside a launcher: start N copies of this very
 * command through kiln run's launcher and return its status. Inside one (RANK
 * and WORLD_SIZE set): join the communicator, take rank 0's seed so that
 * every rank samples the same tokens, and leave stdout to rank 0. Returns -1
 * when the command should go on as this rank. */
static int tp_setup(cli_args *a, int argc, char **argv) {
    if (!getenv("WORLD_SIZE")) return kn_cli_launch_self(a->gpus, "127.0.0.1", 0, argc, argv);
    kn_dist *d;
    if (kn_dist_init_env(&d)) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
    if (kn_dist_world(d) != a->gpus) {
        fprintf(stderr, "kiln: --gpus %d but WORLD_SIZE is %d; give the launcher's rank count\n", a->gpus, kn_dist_world(d));
        kn_dist_free(d);
        return 2;
    }
    if (kn_dist_broadcast_host(d, &a->sp.seed, sizeof a->sp.seed, 0)) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
    if (kn_dist_rank(d) != 0 && !freopen("/dev/null", "w", stdout)) { fprintf(stderr, "kiln: cannot silence rank %d\n", kn_dist_rank(d)); return 1; }
    a->dist = d;           /* freed by main after the command (the model's graph holds it) */
    return -1;
}

/* Commands that parse their own options (the table of tools/cli_args.c
 * describes the others): main hands them argc/argv as they are, with
 * argv[1] the command's name. */
typedef struct own_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} own_command;

static const own_command OWN[] = {
    {"train", kn_cli_train, "Trains a model: mnist, char or gpt2 (kiln train --help)."},
    {"export", kn_cli_export, "Writes a checkpoint of kiln train char|gpt2 as a GGUF file (kiln export --help)."},
    {"run", kn_cli_run, "Starts N ranks of one job, one process per GPU (kiln run --nproc N COMMAND ...)."},
    {"quantize", kn_cli_quantize, "Quantizes a GGUF or Hugging Face model to a GGUF file (kiln quantize --help)."},
    {"convert", kn_cli_convert, "Converts a Hugging Face model directory to GGUF (kiln convert --help)."},
};
#define N_OWN (sizeof OWN / sizeof OWN[0])

static const own_command *find_own(const char *name) {
    for (size_t i = 0; i < N_OWN; i++)
        if (!strcmp(name, OWN[i].name)) return &OWN[i];
    return NULL;
}

/* kiln --help */
static void help_all(FILE *f) {
    fprintf(f, "usage: kiln COMMAND [options]\n\ncommands:\n");
    for (int s = 0; s < CLI_N_SUBS; s++) {
        fprintf(f, "  %-11s ", cli_sub_name((cli_sub)s));
        cli_wrapped(cli_sub_what((cli_sub)s), 14, f);
    }
    for (size_t i = 0; i < N_OWN; i++) {
        fprintf(f, "  %-11s ", OWN[i].name);
        cli_wrapped(OWN[i].what, 14, f);
    }
    fprintf(f, "  %-11s %s\n", "help", "kiln help COMMAND: the options of COMMAND.");
    fprintf(f, "  %-11s %s\n", "version", "Prints the version (also kiln --version).");
    fprintf(f, "\nkiln COMMAND --help lists the options of each command, with their defaults.\n"
               "Text goes to stdout; statistics and messages to stderr. Exit status: 0 ok, 1 error, 2 usage.\n");
}

static int help(int argc, char **argv) {
    if (argc == 2) { help_all(stdout); return 0; }
    if (argc > 3) { fprintf(stderr, "kiln: help takes one command name, e.g. kiln help generate\n"); return 2; }
    const own_command *own = find_own(argv[2]);
    if (own) {
        char *args[] = {argv[0], argv[2], "--help", NULL};
        return own->run(3, args);
    }
    cli_sub sub;
    if (!cli_sub_find(argv[2], &sub)) {
        fprintf(stderr, "kiln: unknown command '%s' (kiln --help lists the commands)\n", argv[2]);
        return 2;
    }
    cli_help(sub, stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { short_usage(); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) return help(argc, argv);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        if (argc > 2) { fprintf(stderr, "kiln: %s takes no arguments\n", cmd); return 2; }
        printf("kiln %s\n", kn_version());
        return 0;
    }
    const own_command *own = find_own(cmd);
    if (own) return own->run(argc, argv);
    cli_sub sub;
    if (!cli_sub_find(cmd, &sub)) {
        if (cmd[0] == '-') fprintf(stderr, "kiln: unknown option %s before the command (kiln --help lists the commands)\n", cmd);
        else fprintf(stderr, "kiln: unknown command '%s' (kiln --help lists the commands)\n", cmd);
        return 2;
    }
    cli_args a;
    switch (cli_parse(sub, argc - 2, argv + 2, &a)) {
    case CLI_PARSE_HELP: cli_help(sub, stdout); return 0;
    case CLI_PARSE_USAGE: return 2;
    case CLI_PARSE_OK: break;
    }
    a.sp.penalty_last_n = kn_sampler_defaults().penalty_last_n;
    if (sub == CLI_GENERATE || sub == CLI_CHAT) {
        if (!a.have_seed) a.sp.seed = random_seed();
        if (a.verbose) fprintf(stderr, "kiln: seed %llu (--seed %llu repeats this run)\n",
                               (unsigned long long)a.sp.seed, (unsigned long long)a.sp.seed);
    }
    set_threads(&a);
    if (a.gpus > 1) {          /* tensor parallel: become the launcher, or be one of its ranks */
        int rc = tp_setup(&a, argc, argv);
        if (rc >= 0) return rc;
    }
    int rc = 2;
    switch (sub) {
    case CLI_GENERATE: rc = cmd_generate(&a); break;
    case CLI_CHAT: rc = cmd_chat(&a); break;
    case CLI_INFO: rc = cmd_info(&a); break;
    case CLI_BENCH: rc = cmd_bench(&a); break;
    case CLI_PERPLEXITY: rc = cmd_perplexity(&a); break;
    case CLI_TOKENIZE: rc = cmd_tokenize(&a); break;
    case CLI_SERVE: rc = cmd_serve(&a); break;
    case CLI_N_SUBS: break;
    }
    kn_dist_free(a.dist);           /* --gpus: after the model that used it is gone */
    return rc;
}
