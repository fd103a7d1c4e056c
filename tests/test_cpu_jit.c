/* test_cpu_jit.c: the CPU backend's generated-kernel entries (cpu_jit.c):
 * hand-written kernels in the generated C signature built through
 * kernel_build, run through kernel_run (one item, a thousand, a million over
 * the pool, ranges checked), compiler errors, no compiler, and the disk
 * cache (a second process loads instead of compiling).
 * KN_CACHE_DIR points at a temporary directory for the whole run. The C
 * compiler is KN_CC's (make test passes the build's) or cc; none installed:
 * the tests that need one SKIP.
 */
#include "kn_test.h"
#include "kiln_backend.h"
#include "core/env.h"
#include "backends/cpu/cpu_jit.h"
#include "backends/cpu/threadpool.h"
#include "core/cpu.h"
#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

/* the kernels, as the C renderer would emit them: self-contained C with the
 * kn_kargs layout of kiln_backend.h */
#define KARGS "#include <stdint.h>\n" \
    "typedef struct { char *buf[24]; const int64_t *syms; int64_t n; } kn_kargs;\n"
static const char *k_axpy = KARGS
    "void k_axpy(const kn_kargs *a, int64_t begin, int64_t end) {\n"
    "    float *y = (float *)a->buf[0]; const float *b = (const float *)a->buf[1], *c = (const float *)a->buf[2];\n"
    "    for (int64_t i = begin; i < end; i++) y[i] = b[i] * 2.0f + c[i];\n"
    "}\n";
/* records each item's range start, and reads a symbol */
static const char *k_ranges = KARGS
    "void k_ranges(const kn_kargs *a, int64_t begin, int64_t end) {\n"
    "    int64_t *r = (int64_t *)a->buf[0];\n"
    "    for (int64_t i = begin; i < end; i++) r[i] = begin * 1000 + a->syms[1];\n"
    "}\n";
/* IEEE semantics kept (no -ffast-math): inf * 0 is NaN, NaN != NaN, -0.0 kept */
static const char *k_ieee = KARGS
    "#include <math.h>\n"
    "void k_ieee(const kn_kargs *a, int64_t begin, int64_t end) {\n"
    "    float *y = (float *)a->buf[0]; const float *x = (const float *)a->buf[1];\n"
    "    for (int64_t i = begin; i < end; i++) { float z = x[i] * 0.0f; y[i] = z != z ? 1.0f : sqrtf(x[i]) + z; }\n"
    "}\n";

static kn_backend *be(void) { return kn_backend_cpu(); }
static char g_dir[512];
static char g_why[4096];

static void set_env(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
    kn_env_reload();
}
static int n_files(const char *d) {
    DIR *dp = opendir(d);
    int n = 0;
    struct dirent *e;
    if (!dp) return -1;
    while ((e = readdir(dp))) n += e->d_name[0] != '.';
    closedir(dp);
    return n;
}
static void empty_dir(const char *d) {
    DIR *dp = opendir(d);
    struct dirent *e;
    char p[1024];
    if (!dp) return;
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", d, e->d_name); unlink(p); }
    closedir(dp);
}
static kn_cpu_jit_stats stats(void) { kn_cpu_jit_stats s; kn__cpu_jit_stats(&s); return s; }

/* builds src or SKIPs the calling test when there is no compiler */
#define BUILD_OR_SKIP(var, src, name)                                                        \
    void *var = be()->kernel_build(be(), src, name, g_why, sizeof g_why);                    \
    if (!var && strstr(g_why, "no C compiler")) SKIP("%.400s", g_why);                      \
    REQUIRE(var, "build %s: %s", name, g_why)

TEST(backend_fields) {
    CHECK(be()->version >= 2 && be()->kernel_lang && !strcmp(be()->kernel_lang, "c"), "kernel_lang \"c\"");
    CHECK(be()->kernel_build && be()->kernel_run && be()->kernel_free && !be()->syms_upload, "entries");
    CHECK(!kn_backend_ref()->kernel_lang && !kn_backend_ref()->kernel_build, "ref runs no generated code");
    CHECK(kn_cpu_id()[0] && strlen(kn_cpu_id()) < 500, "the CPU's id for the cache key: %s", kn_cpu_id());
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "  cpu id: %s\n", kn_cpu_id());
}

TEST(axpy_sizes) {
    BUILD_OR_SKIP(k, k_axpy, "k_axpy");
    int64_t sizes[] = {1, 1000, 1 << 20};
    for (int s = 0; s < 3; s++) {
        int64_t n = sizes[s];
        float *y = malloc(sizeof(float) * (size_t)(n + 1)), *b = malloc(sizeof(float) * (size_t)n), *c = malloc(sizeof(float) * (size_t)n);
        REQUIRE(y && b && c, "malloc");
        kn_test_fill_f32(b, n, -2, 2);
        kn_test_fill_f32(c, n, -2, 2);
        y[n] = 12345.0f;                                        /* past the end: untouched */
        kn_kernel_launch l = {0};
        l.a.buf[0] = (char *)y; l.a.buf[1] = (char *)b; l.a.buf[2] = (char *)c;
        l.a.n = n;
        l.n_max = n;
        l.grain = 4096;
        CHECK(be()->kernel_run(be(), k, &l) == KN_OK, "run n=%lld", (long long)n);
        long bad = 0;
        for (int64_t i = 0; i < n; i++) bad += y[i] != b[i] * 2.0f + c[i];
        CHECK(bad == 0 && y[n] == 12345.0f, "n=%lld: %ld wrong", (long long)n, bad);
        free(y); free(b); free(c);
    }
    be()->kernel_free(be(), k);
    be()->kernel_free(be(), NULL);
}

/* contiguous ranges, one per thread at most, none shorter than the grain;
 * small launches run in one range on the calling thread */
TEST(thread_split) {
    BUILD_OR_SKIP(k, k_ranges, "k_ranges");
    int nth = kn_pool_nthreads();
    int64_t syms[2] = {0, 7};
    struct { int64_t n, grain; } cases[] = {{1 << 20, 1000}, {5000, 1000}, {999, 1000}, {1, 0}, {100, 1}, {0, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n;
        int64_t *r = malloc(sizeof(int64_t) * (size_t)(n + 1));
        kn_kernel_launch l = {0};
        l.a.buf[0] = (char *)r; l.a.syms = syms; l.a.n = n; l.grain = cases[c].grain;
        CHECK(be()->kernel_run(be(), k, &l) == KN_OK, "run");
        int64_t g = cases[c].grain > 1 ? cases[c].grain : 1, want = n / g < nth ? n / g : nth;
        if (want < 1) want = 1;
        int parts = 0;
        int64_t start = 0;
        bool ok = true;
        for (int64_t i = 0; i < n; i++) {
            if (r[i] % 1000 != 7) ok = false;
            if (i == 0 || r[i] != r[i - 1]) {        /* a new range starts at i */
                if (r[i] / 1000 != i) ok = false;
                if (i > 0 && i - start < g && n >= g) ok = false;
                start = i;
                parts++;
            }
        }
        CHECK(ok && (n == 0 || parts == want), "n=%lld grain=%lld: %d ranges (want %lld, pool %d)%s",
              (long long)n, (long long)cases[c].grain, parts, (long long)want, nth, ok ? "" : ", bad ranges");
        free(r);
    }
    be()->kernel_free(be(), k);
}

TEST(ieee_kept) {
    BUILD_OR_SKIP(k, k_ieee, "k_ieee");
    float x[4] = {INFINITY, NAN, 4.0f, -0.0f}, y[4];
    kn_kernel_launch l = {0};
    l.a.buf[0] = (char *)y; l.a.buf[1] = (char *)x; l.a.n = 4;
    CHECK(be()->kernel_run(be(), k, &l) == KN_OK, "run");
    CHECK(y[0] == 1.0f && y[1] == 1.0f, "inf*0 and NaN*0 are NaN (no -ffast-math): %g %g", y[0], y[1]);
    CHECK(y[2] == 2.0f && y[3] == 0.0f && signbit(y[3]), "sqrt(4) = 2, sqrt(-0) + (-0) = -0: %g %g", y[2], y[3]);
    be()->kernel_free(be(), k);
}

TEST(syntax_error) {
    BUILD_OR_SKIP(k0, k_axpy, "k_axpy");   /* only to SKIP without a compiler */
    be()->kernel_free(be(), k0);
    kn_cpu_jit_stats s0 = stats();
    void *k = be()->kernel_build(be(), KARGS "void k_bad(const kn_kargs *a, int64_t b, int64_t e) { oops }\n", "k_bad", g_why, sizeof g_why);
    CHECK(!k, "a syntax error builds nothing");
    CHECK(strstr(g_why, "C compiler failed") && strstr(g_why, "oops"), "why has the compiler's message: %s", g_why);
    CHECK(stats().failures == s0.failures + 1, "counted");
    k = be()->kernel_build(be(), k_axpy, "no_such_fn", g_why, sizeof g_why);
    CHECK(!k && strstr(g_why, "no_such_fn"), "a missing function: %s", g_why);
    char tiny[8];
    k = be()->kernel_build(be(), "int x = ;", "x", tiny, sizeof tiny);
    CHECK(!k && strlen(tiny) < sizeof tiny, "why is cut to its size");
}

TEST(no_compiler) {
    const char *keep = getenv("KN_CC");
    char *kept = keep ? strdup(keep) : NULL;
    set_env("KN_CC", "/nonexistent/cc");
    kn_cpu_jit_stats s0 = stats();
    void *k = be()->kernel_build(be(), k_axpy, "k_axpy", g_why, sizeof g_why);
    CHECK(!k && strstr(g_why, "no C compiler (/nonexistent/cc) found") && strstr(g_why, "hand kernels run"), "why: %s", g_why);
    kn_cpu_jit_stats s1 = stats();
    g_why[0] = 0;
    k = be()->kernel_build(be(), k_ranges, "k_ranges", g_why, sizeof g_why);
    kn_cpu_jit_stats s2 = stats();
    CHECK(!k && strstr(g_why, "no C compiler"), "second build: %s", g_why);
    CHECK(s1.spawns == s0.spawns + 1 && s2.spawns == s1.spawns, "tried once (spawns %ld %ld %ld)", s0.spawns, s1.spawns, s2.spawns);
    set_env("KN_CC", kept);   /* another compiler: tried afresh */
    free(kept);
}

/* a second process loads the cached object instead of compiling */
static int build_in_child(const char *src, const char *name, long *compiles, long *hits, bool quiet) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout); fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (quiet) freopen("/dev/null", "w", stderr);   /* the cache's report of a corrupt entry, provoked below */
        kn_cpu_jit_stats s0 = stats();
        char why[1024];
        void *k = be()->kernel_build(be(), src, name, why, sizeof why);
        float y[3], b[3] = {1, 2, 3}, c[3] = {10, 20, 30};
        kn_kernel_launch l = {0};
        l.a.buf[0] = (char *)y; l.a.buf[1] = (char *)b; l.a.buf[2] = (char *)c; l.a.n = 3;
        int ok = k && be()->kernel_run(be(), k, &l) == KN_OK && y[0] == 12 && y[1] == 24 && y[2] == 36;
        if (!k) fprintf(stderr, "  child build: %s\n", why);
        be()->kernel_free(be(), k);
        kn_cpu_jit_stats s1 = stats();
        long out[2] = {s1.compiles - s0.compiles, s1.cache_hits - s0.cache_hits};
        if (write(fds[1], out, sizeof out) != (ssize_t)sizeof out) ok = 0;
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    long in[2] = {-1, -1};
    if (read(fds[0], in, sizeof in) != (ssize_t)sizeof in) in[0] = in[1] = -1;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    *compiles = in[0]; *hits = in[1];
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}
TEST(cache_hit_in_new_process) {
    BUILD_OR_SKIP(k0, "int kn_probe;", "kn_probe");
    be()->kernel_free(be(), k0);
    empty_dir(g_dir);
    long comp, hits;
    /* a source no other test builds, so the first child compiles */
    const char *src = KARGS "/* cache test */\n"
        "void k_axpy(const kn_kargs *a, int64_t begin, int64_t end) {\n"
        "    float *y = (float *)a->buf[0]; const float *b = (const float *)a->buf[1], *c = (const float *)a->buf[2];\n"
        "    for (int64_t i = begin; i < end; i++) y[i] = b[i] * 2.0f + c[i];\n"
        "}\n";
    CHECK(build_in_child(src, "k_axpy", &comp, &hits, false) == 0, "first process runs the kernel");
    CHECK(comp == 1 && hits == 0, "first process compiles (%ld compiles, %ld hits)", comp, hits);
    CHECK(n_files(g_dir) == 1, "one entry in the cache dir (%d files)", n_files(g_dir));
    CHECK(build_in_child(src, "k_axpy", &comp, &hits, false) == 0, "second process runs the kernel");
    CHECK(comp == 0 && hits == 1, "second process loads from the cache (%ld compiles, %ld hits)", comp, hits);
    set_env("KN_CACHE", "0");
    CHECK(build_in_child(src, "k_axpy", &comp, &hits, false) == 0 && comp == 1 && hits == 0, "KN_CACHE=0 compiles (%ld, %ld)", comp, hits);
    set_env("KN_CACHE", NULL);
    /* a corrupt entry is rebuilt (the cache reports it on stderr) */
    DIR *dp = opendir(g_dir);
    struct dirent *e;
    char p[1024] = "";
    while (dp && (e = readdir(dp))) if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
    if (dp) closedir(dp);
    FILE *f = fopen(p, "r+b");
    if (f) { fseek(f, 200, SEEK_SET); fputc(0x5a, f); fclose(f); }
    CHECK(build_in_child(src, "k_axpy", &comp, &hits, true) == 0 && comp == 1 && hits == 0, "a corrupt entry is compiled again (%ld, %ld)", comp, hits);
    CHECK(build_in_child(src, "k_axpy", &comp, &hits, false) == 0 && comp == 0 && hits == 1, "and cached again (%ld, %ld)", comp, hits);
}

/* kernel_build from several threads at once */
static void *build_thread(void *arg) {
    int i = (int)(intptr_t)arg;
    char src[1024], name[32], why[1024];
    snprintf(name, sizeof name, "k_t%d", i);
    snprintf(src, sizeof src, KARGS "void %s(const kn_kargs *a, int64_t begin, int64_t end) {\n"
             "    int *y = (int *)a->buf[0]; for (int64_t j = begin; j < end; j++) y[j] = (int)j + %d;\n}\n", name, i);
    void *k = be()->kernel_build(be(), src, name, why, sizeof why);
    if (!k) return (void *)1;
    int y[100];
    kn_kernel_launch l = {0};
    l.a.buf[0] = (char *)y; l.a.n = 100;
    intptr_t bad = be()->kernel_run(be(), k, &l) != KN_OK;
    for (int j = 0; j < 100; j++) bad += y[j] != j + i;
    be()->kernel_free(be(), k);
    return (void *)bad;
}
TEST(threads_build) {
    BUILD_OR_SKIP(k0, "int kn_probe;", "kn_probe");
    be()->kernel_free(be(), k0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, build_thread, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK(r == NULL, "thread %d", i);
    }
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kn_cpu_jit_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    set_env("KN_CACHE_DIR", g_dir);
    int r = kn_test_main();
    empty_dir(g_dir);
    rmdir(g_dir);
    return r;
}
