/* cpu_jit.c: build and run the C kernels the compiler generates (the CPU
 * backend's kernel_lang "c"; docs/COMPILER.md, "Building generated kernels").
 *
 * Build: the source goes to a private temporary directory and through the
 * system C compiler ($KN_CC, default cc; no shell) into a shared object,
 * whose bytes are kept in the disk cache (core/kcache.h) under the key
 * (cpu-so, the CPU's identity, the compiler's `--version` line, the flags,
 * the source). A later process with the same key skips the compiler. The
 * bytes are loaded with dlopen from a uniquely named temporary file, removed
 * at once (the mapping stays), or from a memfd where TMPDIR is noexec.
 *
 * Run: the kernel runs items [begin, end); kernel_run splits [0, n) into
 * contiguous ranges over the thread pool, one range per thread and no range
 * shorter than the launch's grain, and calls the kernel directly (no pool)
 * when one range is all there is: decode runs many tiny kernels.
 *
 * With no compiler, kernel_build says so and returns NULL (the runtime runs
 * the hand kernels instead); that is remembered for the compiler's name, so
 * the next kernel does not try again. A compile error returns NULL with the
 * compiler's messages in why.
 *
 * Non-goals: compiling several kernels in one compiler run, unloading cached
 * objects from memory other than through kernel_free, Windows.
 */
#include "backends/cpu/cpu_jit.h"
#include "backends/cpu/threadpool.h"   // defines: kn_pool_run, kn_pool_nthreads
#include "core/cpu.h"                  // defines: kn_cpu, kn_cpu_id
#include "core/env.h"                  // defines: kn_env_get (KN_CC)
#include "core/kcache.h"               // defines: kn__kcache_get/put
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>                  // memfd_create
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The flags of every compile (part of the cache key). No -ffast-math: the
 * generated code must keep NaN, inf and signed zeros as the hand kernels do;
 * -fno-math-errno only lets sqrt & co. be inlined. -ffp-contract=off: no
 * fused multiply-adds the source did not ask for, so results round like the
 * library's own C (built -std=c11, where gcc does not contract either). */
#define JIT_FLAGS_BASE "-O3 -fPIC -shared -fno-math-errno -ffp-contract=off -std=gnu11"

typedef void (*kn_cpu_kfn)(const kn_kargs *a, int64_t begin, int64_t end);
typedef struct cpu_kernel {
    void *dl;          /* dlopen handle */
    kn_cpu_kfn fn;
    int memfd;         /* the memfd dl was loaded from, closed after dlclose; -1: none */
} cpu_kernel;

/* ==== shared state (kernel_build may run on any thread) ======================= */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_cc[256];            /* the compiler command the two fields below are about */
static bool g_cc_missing;         /* it could not be started: generated kernels off */
static char g_cc_version[256];    /* its `--version` first line, "" until known */
static atomic_long g_builds, g_compiles, g_hits, g_failures, g_spawns;
static atomic_uint g_load_counter;

void kn__cpu_jit_stats(kn_cpu_jit_stats *s) {
    s->builds = atomic_load(&g_builds);
    s->compiles = atomic_load(&g_compiles);
    s->cache_hits = atomic_load(&g_hits);
    s->failures = atomic_load(&g_failures);
    s->spawns = atomic_load(&g_spawns);
}

static const char *tmp_root(void) {
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

/* ==== running the compiler ==================================================== */

/* the words of cmd (split on spaces: "ccache cc") into argv; their count */
#define MAX_CC_WORDS 16
static int split_words(char *cmd, char **argv, int max) {
    int n = 0;
    char *save = NULL;
    for (char *s = strtok_r(cmd, " \t", &save); s && n < max; s = strtok_r(NULL, " \t", &save)) argv[n++] = s;
    return n;
}

/* Runs argv (searched in PATH) with stdin /dev/null and stdout + stderr into
 * the file out. Returns its exit status (a signal: 128 + its number), or -1
 * with *err = errno when it could not be started (ENOENT: no such program). */
static int run_tool(char *const *argv, const char *out, int *err) {
    posix_spawn_file_actions_t fa;
    *err = 0;
    if ((*err = posix_spawn_file_actions_init(&fa)) != 0) return -1;
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int e = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    atomic_fetch_add(&g_spawns, 1);
    if (e != 0) { *err = e; return -1; }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno == EINTR) continue;
        *err = errno;   /* ECHILD: the program set SIGCHLD to SIG_IGN; judge by the output file */
        return 0;
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    struct stat st;
    /* 127 and not a word: the exec failed in the child (posix_spawn reports
     * that itself in glibc, but not everywhere: valgrind's, a fork-based libc) */
    if (rc == 127 && stat(out, &st) == 0 && st.st_size == 0) { *err = ENOENT; return -1; }
    return rc;
}

/* a file's bytes (malloc'd) or NULL */
static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *b = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1))) {
            if (fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
            else { ((char *)b)[len] = 0; *n = (size_t)len; }
        }
    }
    fclose(f);
    return b;
}

static bool write_file_fd(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w; n -= (size_t)w;
    }
    return true;
}

static bool write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    bool ok = write_file_fd(fd, data, n);
    return close(fd) == 0 && ok;
}

/* the compiler's messages into why: the first nwhy - 1 bytes, prefixed */
static void why_from(char *why, size_t nwhy, const char *prefix, const char *msg) {
    if (!why || !nwhy) return;
    snprintf(why, nwhy, "%s%s", prefix, msg && *msg ? msg : "(no output)");
    size_t n = strlen(why);
    while (n && (why[n - 1] == '\n' || why[n - 1] == ' ')) why[--n] = 0;
}

/* The compiler command for this build (KN_CC or "cc"), and whether it is
 * known to be missing. Under g_mu. */
static const char *cc_cmd(void) {
    const char *cc = kn_env_get()->cc;
    if (!cc) cc = "cc";
    if (strcmp(cc, g_cc) != 0) {   /* a new compiler (KN_CC changed): nothing known yet */
        snprintf(g_cc, sizeof g_cc, "%s", cc);
        g_cc_missing = false;
        g_cc_version[0] = 0;
    }
    return g_cc;
}

static void say_no_cc(char *why, size_t nwhy, const char *cc, int err) {
    if (why && nwhy)
        snprintf(why, nwhy, "no C compiler (%s) found (%s); generated kernels off, hand kernels run "
                 "(install cc or set KN_CC)", cc, strerror(err ? err : ENOENT));
}

/* The toolchain part of the key: the first line of `CC --version`, run once
 * per compiler. False (why set) when the compiler is missing. Under g_mu. */
static bool cc_version(const char *cc, char *why, size_t nwhy) {
    if (g_cc_missing) { say_no_cc(why, nwhy, cc, ENOENT); return false; }
    if (g_cc_version[0]) return true;
    char dir[PATH_MAX], out[PATH_MAX + 16], cmd[256], *argv[MAX_CC_WORDS + 2];
    snprintf(dir, sizeof dir, "%s/kiln-cc-XXXXXX", tmp_root());
    if (!mkdtemp(dir)) { if (why) snprintf(why, nwhy, "cannot make a temporary directory in %s: %s (set TMPDIR)", tmp_root(), strerror(errno)); return false; }
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(cmd, sizeof cmd, "%s", cc);
    int n = split_words(cmd, argv, MAX_CC_WORDS);
    if (n == 0) { g_cc_missing = true; rmdir(dir); say_no_cc(why, nwhy, cc, ENOENT); return false; }
    argv[n] = "--version";
    argv[n + 1] = NULL;
    int err, rc = run_tool(argv, out, &err);
    size_t len = 0;
    char *text = read_file(out, &len);
    unlink(out);
    rmdir(dir);
    if (rc < 0) {   /* could not start it: no compiler, remembered */
        g_cc_missing = true;
        free(text);
        say_no_cc(why, nwhy, cc, err);
        return false;
    }
    if (rc != 0 || !text || !*text) {
        why_from(why, nwhy, "the C compiler does not answer --version: ", text);
        free(text);
        return false;
    }
    text[strcspn(text, "\n")] = 0;
    snprintf(g_cc_version, sizeof g_cc_version, "%s", text);
    free(text);
    return true;
}

/* The flags of every compile: JIT_FLAGS_BASE and the instruction set of the
 * level the library itself runs at (kn_cpu()->isa): -march=native at
 * AVX-512, else the x86-64-v3 (AVX2) or x86-64 baseline tuned for this CPU.
 * Not -march=native below AVX-512: the level may be capped (KN_CPU, an
 * AVX2ONLY build) or the process may run under valgrind, whose emulated CPU
 * has no AVX-512 while the compiler, a separate process, sees the real one. */
static void jit_flags(char *out, size_t n) {
#if defined(__x86_64__) && !defined(KN_NO_X86)
    kn_isa isa = kn_cpu()->isa;
    const char *march = isa == KN_ISA_AVX512 ? "-march=native"
                      : isa == KN_ISA_AVX2 ? "-march=x86-64-v3 -mtune=native" : "-march=x86-64 -mtune=native";
#else
    const char *march = "-mcpu=native";   /* what gcc and clang take on arm64 and power */
#endif
    snprintf(out, n, "%s %s", JIT_FLAGS_BASE, march);
}

/* Compiles src into a shared object; its bytes (malloc'd) or NULL with why.
 * Not under g_mu: compiles of different kernels may run side by side. */
static void *compile(const char *cc, const char *flags, const char *src, size_t *nso, char *why, size_t nwhy, int *spawn_err) {
    char dir[PATH_MAX], cfile[PATH_MAX + 8], sofile[PATH_MAX + 8], out[PATH_MAX + 8];
    char cmd[256], fl[512], *argv[MAX_CC_WORDS + 32];
    *spawn_err = 0;
    snprintf(dir, sizeof dir, "%s/kiln-cc-XXXXXX", tmp_root());
    if (!mkdtemp(dir)) { if (why) snprintf(why, nwhy, "cannot make a temporary directory in %s: %s (set TMPDIR)", tmp_root(), strerror(errno)); return NULL; }
    snprintf(cfile, sizeof cfile, "%s/k.c", dir);
    snprintf(sofile, sizeof sofile, "%s/k.so", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    void *so = NULL;
    if (!write_file(cfile, src, strlen(src))) {
        if (why) snprintf(why, nwhy, "cannot write %s: %s", cfile, strerror(errno));
    } else {
        snprintf(cmd, sizeof cmd, "%s", cc);
        snprintf(fl, sizeof fl, "%s", flags);
        int n = split_words(cmd, argv, MAX_CC_WORDS);
        n += split_words(fl, argv + n, 24);
        argv[n++] = "-o"; argv[n++] = sofile; argv[n++] = cfile; argv[n++] = "-lm"; argv[n] = NULL;
        int err, rc = run_tool(argv, out, &err);
        size_t len = 0;
        char *text = read_file(out, &len);
        if (rc < 0) { *spawn_err = err; say_no_cc(why, nwhy, cc, err); }
        else if (rc != 0 || !(so = read_file(sofile, nso))) why_from(why, nwhy, "C compiler failed: ", text);
        free(text);
    }
    unlink(cfile); unlink(sofile); unlink(out);
    rmdir(dir);
    return so;
}

/* ==== loading ================================================================= */

/* dlopen of a shared object held in memory. The bytes go to a temporary file
 * whose name is new to this process (pid and a counter: dlopen hands back an
 * already loaded object of the same name), which is removed at once. Where
 * that cannot be mapped executable (a noexec TMPDIR), to a memfd loaded as
 * /proc/self/fd/N; that fd stays open (*memfd) until the object is closed,
 * so no later kernel can come with the same name. */
static void *load(const void *so, size_t n, int *memfd, char *why, size_t nwhy) {
    char path[PATH_MAX];
    *memfd = -1;
    snprintf(path, sizeof path, "%s/kiln-kernel-%ld-%u-XXXXXX", tmp_root(), (long)getpid(), atomic_fetch_add(&g_load_counter, 1u));
    int fd = mkstemp(path);
    void *h = NULL;
    const char *e = NULL;
    if (fd >= 0) {
        close(fd);
        unlink(path);   /* write_file creates it anew with O_EXCL */
        if (write_file(path, so, n) && !(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) e = dlerror();
        unlink(path);
        if (h) return h;
    }
#ifdef MFD_CLOEXEC
    fd = memfd_create("kiln-kernel", MFD_CLOEXEC);
    if (fd >= 0) {
        if (write_file_fd(fd, so, n)) {
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) { *memfd = fd; return h; }
            e = dlerror();
        }
        close(fd);
    }
#endif
    if (why) snprintf(why, nwhy, "cannot load a generated kernel: %s (TMPDIR=%s; a noexec directory? set TMPDIR)",
                      e ? e : strerror(errno), tmp_root());
    return NULL;
}

/* ==== the backend entries ===================================================== */

void *kn__cpu_kernel_build(kn_backend *be, const char *src, const char *name, char *why, size_t nwhy) {
    (void)be;
    if (why && nwhy) why[0] = 0;
    if (!src || !name || !*name) {
        if (why) snprintf(why, nwhy, "kernel_build: no source or no kernel name");
        atomic_fetch_add(&g_failures, 1);
        return NULL;
    }
    char cc[256], version[256], flags[256];
    pthread_mutex_lock(&g_mu);
    snprintf(cc, sizeof cc, "%s", cc_cmd());
    bool ok = cc_version(cc, why, nwhy);
    snprintf(version, sizeof version, "%s", g_cc_version);
    pthread_mutex_unlock(&g_mu);
    if (!ok) { atomic_fetch_add(&g_failures, 1); return NULL; }
    jit_flags(flags, sizeof flags);
    kn_kcache_key key = {"cpu-so", kn_cpu_id(), version, flags, src};

    size_t n = 0;
    void *so = kn__kcache_get(&key, &n), *dl = NULL;
    int memfd = -1;
    if (so && !(dl = load(so, n, &memfd, NULL, 0))) {   /* an entry that does not load: compile it again, replace it */
        free(so);
        so = NULL;
    }
    if (!so) {
        int spawn_err;
        so = compile(cc, flags, src, &n, why, nwhy, &spawn_err);
        if (spawn_err) {   /* the compiler went away since --version: remember */
            pthread_mutex_lock(&g_mu);
            if (!strcmp(cc, g_cc)) g_cc_missing = true;
            pthread_mutex_unlock(&g_mu);
        }
        if (!so) { atomic_fetch_add(&g_failures, 1); return NULL; }
        atomic_fetch_add(&g_compiles, 1);
        kn__kcache_put(&key, so, n);   /* false: reported once by the cache; the kernel still runs */
        dl = load(so, n, &memfd, why, nwhy);
    } else
        atomic_fetch_add(&g_hits, 1);
    free(so);
    if (!dl) { atomic_fetch_add(&g_failures, 1); return NULL; }

    cpu_kernel *k = malloc(sizeof *k);
    void *sym = dlsym(dl, name);
    if (!k || !sym) {
        if (why) {
            if (!k) snprintf(why, nwhy, "out of memory");
            else snprintf(why, nwhy, "the generated source defines no function %s (dlsym: %s)", name, dlerror());
        }
        free(k);
        dlclose(dl);
        if (memfd >= 0) close(memfd);
        atomic_fetch_add(&g_failures, 1);
        return NULL;
    }
    k->dl = dl;
    k->memfd = memfd;
    memcpy(&k->fn, &sym, sizeof sym);   /* object pointer to function pointer, as POSIX allows */
    atomic_fetch_add(&g_builds, 1);
    return k;
}

typedef struct { kn_cpu_kfn fn; const kn_kargs *a; int64_t n; } run_job;

/* part i of nth: contiguous, sizes differing by at most one */
static void run_part(void *ctx, int i, int nth) {
    const run_job *j = ctx;
    int64_t q = j->n / nth, r = j->n % nth;
    int64_t b = q * i + (i < r ? i : r), e = b + q + (i < r);
    if (b < e) j->fn(j->a, b, e);
}

kn_status kn__cpu_kernel_run(kn_backend *be, void *kernel, const kn_kernel_launch *l) {
    (void)be;
    if (!kernel || !l) return kn_set_error(KN_ERR_INVALID, "kernel_run: NULL kernel or launch");
    const cpu_kernel *k = kernel;
    if (l->err_op != KN_OP_NONE)   /* the C renderer makes no index-checking kernels (src/compile/render.c) */
        return kn_set_error(KN_ERR_UNSUPPORTED, "kernel_run: the cpu backend runs no generated kernel that checks indices");
    int64_t n = l->a.n, grain = l->grain > 1 ? l->grain : 1;
    if (n <= 0) return KN_OK;
    int64_t parts = n / grain, nth = kn_pool_nthreads();
    if (parts > nth) parts = nth;
    if (parts <= 1) { k->fn(&l->a, 0, n); return KN_OK; }   /* small: no pool round trip */
    run_job j = {k->fn, &l->a, n};
    kn_pool_run(run_part, &j, (int)parts);
    return KN_OK;
}

void kn__cpu_kernel_free(kn_backend *be, void *kernel) {
    (void)be;
    cpu_kernel *k = kernel;
    if (!k) return;
    dlclose(k->dl);
    if (k->memfd >= 0) close(k->memfd);
    free(k);
}
