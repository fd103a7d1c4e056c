/* test_cli.c: the table-driven test of the kiln program.
 *
 * Runs $BUILD/kiln (BUILD from tests/run.sh, default "build") once per case
 * in tests/cli/ (every .cases file) and checks its exit status, output and files; the
 * case format is in tests/cli/README.md. Every case also fails when the
 * program hangs, dies from a signal it was not sent, or prints a sanitizer
 * report, so bad input shows up as a failure here rather than as a user's
 * crash. KN_TEST_ONLY=SUBSTRING runs only the cases whose name contains it.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORDS 128
#define MAX_CHECKS 32
#define MAX_SIGS 4

typedef struct { char *buf; size_t len, cap; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        char *p = realloc(b->buf, c);
        if (!p) { fprintf(stderr, "test_cli: out of memory\n"); exit(1); }
        b->buf = p; b->cap = c;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}
static void sb_addf(sbuf *b, const char *fmt, ...) {
    char tmp[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
static const char *sb_str(const sbuf *b) { return b->buf ? b->buf : ""; }

/* one check on the finished run: kind is the directive, arg its text
 * (for file-has: path, then the text after the first space) */
typedef struct { char kind[16]; char *arg; } check;

typedef struct {
    char name[128], where[256];
    char *needs[16]; int n_needs;
    bool needs_model, stdin_open, sig_from_out;   /* sig_from_out: sigint times count from the first stdout byte */
    char *pre[8]; int n_pre;
    char *run;
    sbuf in; char *in_file;
    char *env[8]; int n_env;
    double sigs[MAX_SIGS]; int n_sigs;
    double timeout;
    int exit_code; bool exit_nonzero, exit_sigint, exit_set;
    check checks[MAX_CHECKS]; int n_checks;
} cli_case;

static const char *g_kiln, *g_assets, *g_root;
static char g_kiln_abs[2048];          /* the program's absolute path ({kiln}) */
static char g_tmp[256];

/* ---- text helpers --------------------------------------------------------- */

static char *dupstr(const char *s) {
    char *p = strdup(s);
    if (!p) { fprintf(stderr, "test_cli: out of memory\n"); exit(1); }
    return p;
}

/* {assets} {tmp} {model} {root} {kiln} -> their values (a new string) */
static char *expand(const char *s) {
    sbuf b = {0};
    static const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    while (*s) {
        const char *v = NULL; size_t k = 0;
        if (!strncmp(s, "{assets}", 8)) { v = g_assets; k = 8; }
        else if (!strncmp(s, "{tmp}", 5)) { v = g_tmp; k = 5; }
        else if (!strncmp(s, "{model}", 7)) { v = model; k = 7; }
        else if (!strncmp(s, "{root}", 6)) { v = g_root; k = 6; }
        else if (!strncmp(s, "{kiln}", 6)) { v = g_kiln_abs; k = 6; }   /* for pre commands */
        if (v) { sb_add(&b, v, strlen(v)); s += k; }
        else { sb_add(&b, s, 1); s++; }
    }
    if (!b.buf) sb_add(&b, "", 0);
    return b.buf;
}

/* C escapes \n \t \r \\ \xHH into bytes */
static void unescape(const char *s, sbuf *out) {
    for (; *s; s++) {
        char c = *s;
        if (c == '\\' && s[1]) {
            s++;
            if (*s == 'n') c = '\n';
            else if (*s == 't') c = '\t';
            else if (*s == 'r') c = '\r';
            else if (*s == 'x' && s[1] && s[2]) {
                char hex[3] = {s[1], s[2], 0};
                c = (char)strtol(hex, NULL, 16);
                s += 2;
            } else c = *s;
        }
        sb_add(out, &c, 1);
    }
}

/* splits like a shell: quotes group, "" is an empty word, \ escapes;
 * returns the word count or -1 on an unterminated quote */
static int split_words(const char *s, char **w, int max) {
    int n = 0;
    while (*s) {
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) break;
        sbuf b = {0};
        sb_add(&b, "", 0);
        while (*s && *s != ' ' && *s != '\t') {
            if (*s == '"' || *s == '\'') {
                char q = *s++;
                while (*s && *s != q) {
                    if (q == '"' && *s == '\\' && s[1]) s++;
                    sb_add(&b, s++, 1);
                }
                if (!*s) { free(b.buf); return -1; }
                s++;
            } else {
                if (*s == '\\' && s[1]) s++;
                sb_add(&b, s++, 1);
            }
        }
        if (n == max) { free(b.buf); return -1; }
        w[n++] = b.buf;
    }
    return n;
}

/* ---- case files ------------------------------------------------------------ */

static void case_free(cli_case *c) {
    for (int i = 0; i < c->n_needs; i++) free(c->needs[i]);
    for (int i = 0; i < c->n_pre; i++) free(c->pre[i]);
    for (int i = 0; i < c->n_env; i++) free(c->env[i]);
    for (int i = 0; i < c->n_checks; i++) free(c->checks[i].arg);
    free(c->run); free(c->in.buf); free(c->in_file);
    memset(c, 0, sizeof *c);
}

/* applies one directive line to c; false (with *why) on a malformed line */
static bool directive(cli_case *c, char *line, const char **why) {
    char *sp = strchr(line, ' ');
    const char *arg = sp ? sp + 1 : "";
    if (sp) *sp = 0;
    const char *k = line;
    if (!strcmp(k, "needs")) {
        char *w[16];
        int n = split_words(arg, w, 16);
        if (n < 0 || c->n_needs + n > 16) { *why = "bad needs line"; return false; }
        for (int i = 0; i < n; i++) c->needs[c->n_needs++] = w[i];
    } else if (!strcmp(k, "needs-model")) c->needs_model = true;
    else if (!strcmp(k, "pre")) { if (c->n_pre == 8) { *why = "too many pre lines"; return false; } c->pre[c->n_pre++] = dupstr(arg); }
    else if (!strcmp(k, "run")) { free(c->run); c->run = dupstr(arg); }
    else if (!strcmp(k, "stdin")) unescape(arg, &c->in);
    else if (!strcmp(k, "stdin-file")) { free(c->in_file); c->in_file = dupstr(arg); }
    else if (!strcmp(k, "stdin-open")) c->stdin_open = true;
    else if (!strcmp(k, "env")) { if (c->n_env == 8 || !strchr(arg, '=')) { *why = "bad env line"; return false; } c->env[c->n_env++] = dupstr(arg); }
    else if (!strcmp(k, "sigint-from-output")) c->sig_from_out = true;
    else if (!strcmp(k, "sigint")) { if (c->n_sigs == MAX_SIGS) { *why = "too many sigint lines"; return false; } c->sigs[c->n_sigs++] = atof(arg); }
    else if (!strcmp(k, "timeout")) c->timeout = atof(arg);
    else if (!strcmp(k, "exit")) {
        c->exit_set = true;
        if (!strcmp(arg, "nonzero")) c->exit_nonzero = true;
        else if (!strcmp(arg, "sigint")) c->exit_sigint = true;
        else { char *e; c->exit_code = (int)strtol(arg, &e, 10); if (*e || !*arg) { *why = "bad exit line"; return false; } }
    } else if (!strcmp(k, "stdout-has") || !strcmp(k, "stdout-lacks") || !strcmp(k, "stderr-has") ||
               !strcmp(k, "stderr-lacks") || !strcmp(k, "stderr-lines") || !strcmp(k, "file-has") ||
               !strcmp(k, "file-lacks")) {
        if (c->n_checks == MAX_CHECKS) { *why = "too many checks"; return false; }
        check *ch = &c->checks[c->n_checks++];
        snprintf(ch->kind, sizeof ch->kind, "%s", k);
        sbuf b = {0};
        unescape(arg, &b);
        if (!b.buf) sb_add(&b, "", 0);
        ch->arg = b.buf;
    } else { *why = "unknown directive"; return false; }
    return true;
}

/* ---- running one case ------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct { sbuf out, err; int status; bool hung; double secs; } run_result;

static void drain(int *fd, sbuf *b) {
    char tmp[65536];
    ssize_t n = read(*fd, tmp, sizeof tmp);
    if (n > 0) sb_add(b, tmp, (size_t)n);
    else if (n == 0 || (errno != EAGAIN && errno != EINTR)) { close(*fd); *fd = -1; }
}

/* runs kiln with words w[0..n) and the case's stdin, env and signals */
static bool spawn_and_wait(const cli_case *c, char **w, int n, const sbuf *in, run_result *r) {
    int pin[2], pout[2], perr[2];
    if (pipe(pin) || pipe(pout) || pipe(perr)) return false;
    char *argv[MAX_WORDS + 2];
    argv[0] = (char *)g_kiln;
    for (int i = 0; i < n; i++) argv[i + 1] = w[i];
    argv[n + 1] = NULL;
    fflush(stdout); fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        dup2(pin[0], 0); dup2(pout[1], 1); dup2(perr[1], 2);
        close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]); close(perr[0]); close(perr[1]);
        signal(SIGPIPE, SIG_DFL);
        for (int i = 0; i < c->n_env; i++) putenv(c->env[i]);
        execv(g_kiln, argv);
        fprintf(stderr, "test_cli: cannot run %s: %s\n", g_kiln, strerror(errno));
        _exit(127);
    }
    close(pin[0]); close(pout[1]); close(perr[1]);
    int fin = pin[1], fout = pout[0], ferr = perr[0];
    fcntl(fin, F_SETFL, O_NONBLOCK);
    fcntl(fout, F_SETFL, O_NONBLOCK);
    fcntl(ferr, F_SETFL, O_NONBLOCK);
    size_t in_off = 0;
    if (in->len == 0 && !c->stdin_open) { close(fin); fin = -1; }
    double t0 = now_s(), limit = c->timeout > 0 ? c->timeout : 60, t_out = -1;
    int sent = 0, status = 0;
    bool exited = false;
    while (!exited || fout >= 0 || ferr >= 0) {
        struct pollfd p[3]; int np = 0;
        if (fout >= 0) p[np++] = (struct pollfd){.fd = fout, .events = POLLIN};
        if (ferr >= 0) p[np++] = (struct pollfd){.fd = ferr, .events = POLLIN};
        if (fin >= 0 && in_off < in->len) p[np++] = (struct pollfd){.fd = fin, .events = POLLOUT};
        poll(p, (nfds_t)np, 50);
        for (int i = 0; i < np; i++) {
            if (!p[i].revents) continue;
            if (p[i].fd == fout) drain(&fout, &r->out);
            else if (p[i].fd == ferr) drain(&ferr, &r->err);
            else {
                ssize_t k = write(fin, in->buf + in_off, in->len - in_off);
                if (k > 0) in_off += (size_t)k;
                else if (k < 0 && errno != EAGAIN && errno != EINTR) { close(fin); fin = -1; }
            }
        }
        if (fin >= 0 && in_off == in->len && !c->stdin_open) { close(fin); fin = -1; }
        double t = now_s() - t0;
        if (t_out < 0 && r->out.len > 0) t_out = t;
        /* a reply's length in seconds depends on the machine: timed from its
         * first byte, a signal lands inside it on fast and slow machines alike */
        double base = c->sig_from_out ? t_out : 0;
        if (!exited && sent < c->n_sigs && base >= 0 && t - base >= c->sigs[sent]) { kill(pid, SIGINT); sent++; }
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
        if (!exited && t > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            exited = true;
            r->hung = true;
        }
        if (exited && t > limit + 5) break;    /* a grandchild holds the pipes open */
    }
    if (fin >= 0) close(fin);
    if (fout >= 0) close(fout);
    if (ferr >= 0) close(ferr);
    r->status = status;
    r->secs = now_s() - t0;
    return true;
}

static int count_lines(const char *s) {
    int n = 0;
    for (const char *p = s; *p; p++) if (*p == '\n') n++;
    size_t L = strlen(s);
    if (L && s[L - 1] != '\n') n++;
    return n;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    sbuf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) sb_add(&b, tmp, n);
    fclose(f);
    if (!b.buf) sb_add(&b, "", 0);
    return b.buf;
}

/* 0 passed, 1 failed, 2 skipped (why holds the reason or the failures) */
static int run_case(cli_case *c, sbuf *why) {
    if (!c->run) { sb_addf(why, "no run line"); return 1; }
    for (int i = 0; i < c->n_needs; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", g_assets, c->needs[i]);
        struct stat st;
        if (stat(p, &st)) { sb_addf(why, "asset %s missing under KN_ASSETS (%s)", c->needs[i], g_assets); return 2; }
    }
    struct stat st;
    if (c->needs_model && stat("models/SmolLM2-135M-Instruct.Q4_1.gguf", &st)) {
        sb_addf(why, "default model missing (sh scripts/fetch_model.sh fetches it)");
        return 2;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kn-cli-XXXXXX");
    if (!mkdtemp(g_tmp)) { sb_addf(why, "mkdtemp: %s", strerror(errno)); return 1; }
    int verdict = 0;
    char *words[MAX_WORDS];
    int n = -1;
    run_result r = {0};
    sbuf in = {0};
    for (int i = 0; i < c->n_pre; i++) {
        char *cmd = expand(c->pre[i]);
        sbuf sh = {0};
        sb_addf(&sh, "cd '%s' && %s", g_tmp, cmd);
        int rc = system(sh.buf);
        free(sh.buf);
        if (rc != 0) { sb_addf(why, "pre command failed (%d): %s", rc, cmd); free(cmd); verdict = 1; goto done; }
        free(cmd);
    }
    char *line = expand(c->run);
    n = split_words(line, words, MAX_WORDS);
    free(line);
    if (n < 0) { sb_addf(why, "cannot split the run line (unterminated quote?)"); verdict = 1; goto done; }
    if (c->in_file) {
        char *p = expand(c->in_file), *data = read_file(p);
        if (!data) { sb_addf(why, "stdin-file %s: %s", p, strerror(errno)); free(p); verdict = 1; goto done; }
        struct stat fs;
        size_t len = stat(p, &fs) == 0 ? (size_t)fs.st_size : strlen(data);
        sb_add(&in, data, len);
        free(p); free(data);
    }
    if (c->in.len) sb_add(&in, c->in.buf, c->in.len);
    if (!spawn_and_wait(c, words, n, &in, &r)) { sb_addf(why, "cannot start %s: %s", g_kiln, strerror(errno)); verdict = 1; goto done; }

    const char *out = sb_str(&r.out), *err = sb_str(&r.err);
    if (r.hung) { sb_addf(why, "\n    still running after %.0f s (a hang)", c->timeout > 0 ? c->timeout : 60.0); verdict = 1; }
    else if (WIFSIGNALED(r.status)) {
        int sig = WTERMSIG(r.status);
        if (!(c->exit_sigint && sig == SIGINT)) { sb_addf(why, "\n    killed by signal %d (%s)", sig, strsignal(sig)); verdict = 1; }
    } else {
        int code = WEXITSTATUS(r.status);
        bool ok = !c->exit_set ? code == 0 : c->exit_nonzero ? code != 0 : c->exit_sigint ? false : code == c->exit_code;
        if (!ok) { sb_addf(why, "\n    exit status %d, expected %s", code, !c->exit_set ? "0" : c->exit_nonzero ? "nonzero" : c->exit_sigint ? "death by SIGINT" : ""), verdict = 1;
                   if (c->exit_set && !c->exit_nonzero && !c->exit_sigint) sb_addf(why, "%d", c->exit_code); }
    }
    if (strstr(err, "Sanitizer") || strstr(err, "runtime error:")) { sb_addf(why, "\n    sanitizer report on stderr"); verdict = 1; }
    for (int i = 0; i < c->n_checks; i++) {
        const check *ch = &c->checks[i];
        const char *k = ch->kind;
        char *a = expand(ch->arg);
        if (!strcmp(k, "stdout-has") && !strstr(out, a)) { sb_addf(why, "\n    stdout lacks '%s'", a); verdict = 1; }
        if (!strcmp(k, "stdout-lacks") && strstr(out, a)) { sb_addf(why, "\n    stdout has '%s'", a); verdict = 1; }
        if (!strcmp(k, "stderr-has") && !strstr(err, a)) { sb_addf(why, "\n    stderr lacks '%s'", a); verdict = 1; }
        if (!strcmp(k, "stderr-lacks") && strstr(err, a)) { sb_addf(why, "\n    stderr has '%s'", a); verdict = 1; }
        if (!strcmp(k, "stderr-lines") && count_lines(err) != atoi(a)) { sb_addf(why, "\n    stderr has %d lines, expected %s", count_lines(err), a); verdict = 1; }
        if (!strcmp(k, "file-has") || !strcmp(k, "file-lacks")) {
            char *sp = strchr(a, ' ');
            const char *text = sp ? sp + 1 : "";
            if (sp) *sp = 0;
            char *data = read_file(a);
            bool has = data && strstr(data, text);
            if (!strcmp(k, "file-has") && !has) { sb_addf(why, "\n    %s %s '%s'", a, data ? "lacks" : "is missing, expected", text); verdict = 1; }
            if (!strcmp(k, "file-lacks") && has) { sb_addf(why, "\n    %s has '%s'", a, text); verdict = 1; }
            free(data);
        }
        free(a);
    }
    if (verdict) {
        /* show what the program said: the end of stderr and of stdout */
        size_t el = strlen(err), ol = strlen(out);
        sb_addf(why, "\n    after %.1f s; stderr (last 1500 bytes):\n%s", r.secs, err + (el > 1500 ? el - 1500 : 0));
        sb_addf(why, "\n    stdout (last 300 bytes):\n%s", out + (ol > 300 ? ol - 300 : 0));
    }
done:
    for (int i = 0; i < n; i++) free(words[i]);
    free(r.out.buf); free(r.err.buf); free(in.buf);
    sbuf rm = {0};
    sb_addf(&rm, "rm -rf '%s'", g_tmp);
    if (system(rm.buf) != 0) fprintf(stderr, "test_cli: could not remove %s\n", g_tmp);
    free(rm.buf);
    return verdict;
}

/* ---- driver ---------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int tally[3];

static void finish_case(cli_case *c, const char *only) {
    if (!c->name[0]) return;
    if (!only || strstr(c->name, only)) {
        sbuf why = {0};
        int v = run_case(c, &why);
        tally[v]++;
        if (v == 0) printf("ok   %s\n", c->name);
        else if (v == 2) printf("skip %s: %s\n", c->name, sb_str(&why));
        else { printf("FAIL %s\n", c->name); fprintf(stderr, "  FAIL %s (%s):%s\n", c->name, c->where, sb_str(&why)); }
        fflush(stdout); fflush(stderr);
        free(why.buf);
    }
    case_free(c);
}

static void run_file(const char *path, const char *only) {
    FILE *f = fopen(path, "r");
    if (!f) { printf("FAIL %s: cannot open: %s\n", path, strerror(errno)); tally[1]++; return; }
    cli_case c = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t L;
    int lineno = 0;
    while ((L = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#') continue;
        if (!*s) { finish_case(&c, only); continue; }
        if (!strncmp(s, "case ", 5)) {
            finish_case(&c, only);
            snprintf(c.name, sizeof c.name, "%s", s + 5);
            snprintf(c.where, sizeof c.where, "%s:%d", path, lineno);
            continue;
        }
        const char *why = NULL;
        if (!c.name[0]) why = "directive outside a case";
        else directive(&c, s, &why);
        if (why) {
            printf("FAIL %s:%d: %s: %s\n", path, lineno, why, s);
            tally[1]++;
            case_free(&c);
        }
    }
    finish_case(&c, only);
    free(line);
    fclose(f);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *build = getenv("BUILD");
    static char kiln[1024], root[1024];
    snprintf(kiln, sizeof kiln, "%s/kiln", build && *build ? build : "build");
    g_kiln = kiln;
    g_assets = getenv("KN_ASSETS");
    if (!g_assets || !*g_assets) g_assets = "../shared/assets";
    /* absolute, so {assets} means the same in pre commands (run in {tmp}) */
    static char assets_abs[PATH_MAX];
    if (realpath(g_assets, assets_abs)) g_assets = assets_abs;
    if (!getcwd(root, sizeof root)) snprintf(root, sizeof root, ".");
    g_root = root;
    snprintf(g_kiln_abs, sizeof g_kiln_abs, "%s%s%s", kiln[0] == '/' ? "" : root, kiln[0] == '/' ? "" : "/", kiln);
    const char *only = getenv("KN_TEST_ONLY");
    if (only && !*only) only = NULL;
    if (access(g_kiln, X_OK)) {
        printf("FAIL cli: %s is not built (make builds it): %s\n", g_kiln, strerror(errno));
        printf("# totals: 0 1 0\n");
        return 1;
    }
    DIR *d = opendir("tests/cli");
    if (!d) {
        printf("FAIL cli: tests/cli not found (run from the repository root): %s\n", strerror(errno));
        printf("# totals: 0 1 0\n");
        return 1;
    }
    char *files[256];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nf < 256) {
        size_t L = strlen(e->d_name);
        if (L > 6 && !strcmp(e->d_name + L - 6, ".cases")) {
            char p[1024];
            snprintf(p, sizeof p, "tests/cli/%s", e->d_name);
            files[nf++] = dupstr(p);
        }
    }
    closedir(d);
    qsort(files, (size_t)nf, sizeof *files, cmp_str);
    for (int i = 0; i < nf; i++) { run_file(files[i], only); free(files[i]); }
    printf("# totals: %d %d %d\n", tally[0], tally[1], tally[2]);
    return tally[1] ? 1 : 0;
}
