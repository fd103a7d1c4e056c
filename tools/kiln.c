/* kiln.c: the command-line program.
 *
 *   kiln generate -m MODEL -p PROMPT [-n N] [--temp T --top-k K --top-p P --min-p M --seed S] [--chat]
 *   kiln chat -m MODEL [--system TEXT] [--chat-template chatml|llama2|llama3]
 *   kiln info MODEL
 *   kiln bench -m MODEL [-p 512] [-n 128] [-r 3]
 *   kiln perplexity -m MODEL -f TEXT [--ctx N]
 *   kiln tokenize -m MODEL -p TEXT
 *   kiln train mnist|char|gpt2 ...    (tools/train.c parses its own options)
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
#include "backends/cpu/threadpool.h"
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static void short_usage(void) {
    fprintf(stderr, "usage: kiln COMMAND [options]  (COMMAND: generate, chat, info, bench, perplexity, tokenize, train)\n"
                    "kiln --help lists the commands; kiln COMMAND --help lists its options\n");
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
    kn_pool_set_threads(a->threads);
}

static int cmd_info(const cli_args *a) {
    if (kn_model_print_info(a->model, stdout) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
    return 0;
}

static int help(int argc, char **argv) {
    if (argc == 2) { cli_help_all(stdout); return 0; }
    if (argc > 3) { fprintf(stderr, "kiln: help takes one command name, e.g. kiln help generate\n"); return 2; }
    if (!strcmp(argv[2], "train")) {
        char *targs[] = {argv[0], "train", "--help", NULL};
        return kn_cli_train(3, targs);
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
    if (!strcmp(cmd, "train")) return kn_cli_train(argc, argv);
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
    switch (sub) {
    case CLI_GENERATE: return cmd_generate(&a);
    case CLI_CHAT: return cmd_chat(&a);
    case CLI_INFO: return cmd_info(&a);
    case CLI_BENCH: return cmd_bench(&a);
    case CLI_PERPLEXITY: return cmd_perplexity(&a);
    case CLI_TOKENIZE: return cmd_tokenize(&a);
    case CLI_N_SUBS: break;
    }
    return 2;
}
