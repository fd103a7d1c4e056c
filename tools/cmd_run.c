/* cmd_run.c: `kiln run --nproc N [--port P] [--addr A] COMMAND...`: starts N
 * ranks of one job on this machine, one process per GPU (or per CPU rank),
 * each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set,
 * as torchrun does for PyTorch (kiln_dist.h reads them). COMMAND is a kiln
 * command (`kiln run --nproc 2 train gpt2 ...` runs this kiln binary) or,
 * after `--`, any program (a C program built on libkiln).
 *
 * It waits for every rank. When one fails (non-zero exit or a signal)
 * while others still run, it says which and stops the others (SIGTERM, then
 * SIGKILL after 10 s), so a crashed rank never leaves the job hanging; its
 * exit status is the first failing rank's (1 for a signal). Ctrl-C reaches
 * every rank (they share the terminal's process group); the launcher itself
 * only waits for them to finish their checkpoints.
 *
 * Several machines: `kiln run` starts ranks on this machine only; start them
 * with any launcher that sets the five variables (mpirun, a cluster
 * scheduler; docs/ARCHITECTURE.md, "Several processes").
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: kiln run --nproc N [--port P] [--addr A] KILN-COMMAND [options]\n"
            "       kiln run --nproc N [--port P] [--addr A] -- PROGRAM [args]\n"
            "  Starts N ranks of one job (one process per GPU: rank r uses GPU r), each with RANK,\n"
            "  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; waits for all of them and\n"
            "  stops the others when one fails.\n"
            "  --nproc N   ranks to start (1..256)\n"
            "  --port P    the rendezvous port of rank 0 [default: a free port]\n"
            "  --addr A    rank 0's address [default: 127.0.0.1]\n"
            "example: kiln run --nproc 2 train gpt2 --data TEXT   (kiln train --gpus 2 does the same)\n");
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 29500;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 29500;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static volatile sig_atomic_t g_interrupts;
static void on_int(int sig) { (void)sig; g_interrupts++; }

static void describe(int status, char *buf, size_t cap) {
    if (WIFEXITED(status)) snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(buf, cap, "stopped (status %d)", status);
}

int kn_cli_launch(int nproc, const char *addr, int port, char *const *argv) {
    if (port <= 0) port = free_port();
    pid_t *pid = calloc((size_t)nproc, sizeof *pid);
    if (!pid) { fprintf(stderr, "kiln run: out of memory\n"); return 1; }
    struct sigaction a, old;
    memset(&a, 0, sizeof a);
    a.sa_handler = on_int;
    sigemptyset(&a.sa_mask);
    sigaction(SIGINT, &a, &old);
    char ws[16], ps[16];
    snprintf(ws, sizeof ws, "%d", nproc);
    snprintf(ps, sizeof ps, "%d", port);
    int started = 0;
    for (int r = 0; r < nproc; r++) {
        fflush(NULL);
        pid_t p = fork();
        if (p < 0) { fprintf(stderr, "kiln run: cannot start rank %d: %s\n", r, strerror(errno)); break; }
        if (p == 0) {
            sigaction(SIGINT, &old, NULL);
            char rs[16];
            snprintf(rs, sizeof rs, "%d", r);
            setenv("RANK", rs, 1);
            setenv("LOCAL_RANK", rs, 1);
            setenv("WORLD_SIZE", ws, 1);
            setenv("MASTER_ADDR", addr, 1);
            setenv("MASTER_PORT", ps, 1);
            execvp(argv[0], argv);
            fprintf(stderr, "kiln run: rank %d: cannot run %s: %s\n", r, argv[0], strerror(errno));
            _exit(127);
        }
        pid[started++] = p;
    }
    int rc = started == nproc ? 0 : 1, running = started;
    bool stopping = started != nproc;
    double kill_at = 0;
    if (stopping)
        for (int r = 0; r < started; r++) kill(pid[r], SIGTERM);
    while (running > 0) {
        int status;
        pid_t p = waitpid(-1, &status, stopping ? WNOHANG : 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        if (p == 0) {        /* stopping: the others get 10 s to leave, then SIGKILL */
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            double t = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
            if (kill_at == 0) kill_at = t + 10;
            else if (t > kill_at) {
                for (int r = 0; r < started; r++) if (pid[r] > 0) kill(pid[r], SIGKILL);
                kill_at = t + 1e9;
            }
            continue;
        }
        int r = 0;
        while (r < started && pid[r] != p) r++;
        if (r == started) continue;
        pid[r] = -1;
        running--;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
            char why[96];
            describe(status, why, sizeof why);
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
            if (running > 0) {
                fprintf(stderr, "kiln run: rank %d of %d %s; stopping the other %d rank%s\n", r, nproc, why, running,
                        running == 1 ? "" : "s");
                for (int k = 0; k < started; k++) if (pid[k] > 0) kill(pid[k], SIGTERM);
            } else {
                fprintf(stderr, "kiln run: rank %d of %d %s\n", r, nproc, why);
            }
            stopping = true;
        }
    }
    sigaction(SIGINT, &old, NULL);
    free(pid);
    return rc;
}

int kn_cli_run(int argc, char **argv) {
    int nproc = 0, port = 0;
    const char *addr = "127.0.0.1";
    int i = 2;
    for (; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { run_usage(stdout); return 0; }
        if (!strcmp(o, "--")) { i++; break; }
        if (o[0] != '-') break;
        if (i + 1 >= argc) { fprintf(stderr, "kiln run: %s needs a value (kiln run --help)\n", o); return 2; }
        const char *v = argv[++i];
        char *end;
        long n = strtol(v, &end, 10);
        if (!strcmp(o, "--nproc")) {
            if (*end || n < 1 || n > 256) { fprintf(stderr, "kiln run: --nproc '%s': give a number of ranks in 1..256\n", v); return 2; }
            nproc = (int)n;
        } else if (!strcmp(o, "--port")) {
            if (*end || n < 1 || n > 65535) { fprintf(stderr, "kiln run: --port '%s': give a TCP port in 1..65535\n", v); return 2; }
            port = (int)n;
        } else if (!strcmp(o, "--addr")) {
            addr = v;
        } else {
            fprintf(stderr, "kiln run: unknown option '%s' (kiln run --help lists them)\n", o);
            return 2;
        }
    }
    if (!nproc) { fprintf(stderr, "kiln run: --nproc N is required (kiln run --help)\n"); return 2; }
    if (i >= argc) { fprintf(stderr, "kiln run: name the command to run, e.g. kiln run --nproc 2 train gpt2 ...\n"); return 2; }
    if (!strcmp(argv[i - 1], "--")) return kn_cli_launch(nproc, addr, port, argv + i);   /* any program */
    return kn_cli_launch_self(nproc, addr, port, argc - i + 1, argv + i - 1);          /* a kiln command */
}

int kn_cli_launch_self(int nproc, const char *addr, int port, int argc, char *const *argv) {
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        fprintf(stderr, "kiln: cannot find the kiln binary (/proc/self/exe) to start the ranks; run them with a launcher "
                "that sets RANK and WORLD_SIZE\n");
        return 1;
    }
    self[k] = 0;
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) { fprintf(stderr, "kiln: out of memory\n"); return 1; }
    args[0] = self;
    for (int j = 1; j < argc; j++) args[j] = argv[j];
    int rc = kn_cli_launch(nproc, addr, port, args);
    free(args);
    return rc;
}
