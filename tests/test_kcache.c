/* test_kcache.c: the compiled-kernel disk cache (src/core/kcache.c).
 *
 * Every test points KN_CACHE_DIR at a fresh temporary directory. The cases
 * that look at what is reported on stderr run in a forked child with stderr
 * sent to a file, because each kind of bad entry is reported once per
 * process: a child starts with nothing said yet.
 */
#include "kn_test.h"
#include "core/env.h"
#include "core/kcache.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

void kn__sha256(const void *data, size_t n, unsigned char out[32]);   /* kcache.c */

/* ---- helpers ---- */
static char g_tmp[512];

static void set_env(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
    kn_env_reload();
}

/* a fresh empty directory, made the cache directory */
static const char *fresh_dir(void) {
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/kn_kcache_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_tmp)) { perror("mkdtemp"); exit(1); }
    set_env("KN_CACHE", NULL);
    set_env("KN_CACHE_DIR", g_tmp);
    return g_tmp;
}
/* removes a flat directory (the cache has no subdirectories) */
static void rm_dir(const char *d) {
    DIR *dp = opendir(d);
    if (dp) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(dp)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { snprintf(p, sizeof p, "%s/%s", d, e->d_name); unlink(p); }
        closedir(dp);
    }
    rmdir(d);
}
/* number of files in d; the last one's path in path (if any); tmp: those named *.tmp.* */
static int list_dir(const char *d, char *path, size_t np, int *tmp) {
    DIR *dp = opendir(d);
    int n = 0;
    if (tmp) *tmp = 0;
    if (!dp) return -1;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (tmp && strstr(e->d_name, ".tmp.")) (*tmp)++;
        if (path) snprintf(path, np, "%s/%s", d, e->d_name);
    }
    closedir(dp);
    return n;
}
static kn_kcache_key key_of(const char *src) {
    return (kn_kcache_key){"cpu-so", "test-cpu avx2", "cc (test) 1.0", "-O3", src};
}
static bool get_is(const kn_kcache_key *k, const void *want, size_t nwant) {
    size_t n = 0;
    void *b = kn__kcache_get(k, &n);
    bool ok = b && n == nwant && memcmp(b, want, n) == 0;
    free(b);
    return ok;
}
static long file_size(const char *p) { struct stat st; return stat(p, &st) == 0 ? (long)st.st_size : -1; }

/* Runs fn in a child with stderr going to a file; returns the child's exit
 * code (its failed checks) and the stderr text in err. */
static int in_child(int (*fn)(const char *dir), const char *dir, char *err, size_t nerr) {
    char ep[600];
    snprintf(ep, sizeof ep, "%s.stderr", dir);
    fflush(stdout); fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) { dup2(fd, 2); close(fd); }
        int r = fn(dir);
        fflush(stderr);
        _exit(r > 100 ? 100 : r);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    err[0] = 0;
    FILE *f = fopen(ep, "r");
    if (f) { size_t n = fread(err, 1, nerr - 1, f); err[n] = 0; fclose(f); }
    unlink(ep);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}
static int count_of(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}
#define CCHECK(cond) do { if (!(cond)) { fprintf(stderr, "  child FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); bad++; } } while (0)

/* ---- tests ---- */

TEST(sha256_vectors) {
    static const struct { const char *in, *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        unsigned char h[32];
        char hex[65];
        kn__sha256(v[i].in, strlen(v[i].in), h);
        for (int j = 0; j < 32; j++) sprintf(hex + 2 * j, "%02x", h[j]);
        CHECK(!strcmp(hex, v[i].hex), "sha256(\"%s\") = %s", v[i].in, hex);
    }
}

TEST(round_trip_and_missing) {
    const char *d = fresh_dir();
    kn_kcache_key k = key_of("void f(void) {}"), other = key_of("void g(void) {}");
    const char blob[] = "shared object bytes\0with a zero";
    CHECK(kn__kcache_dir() && !strcmp(kn__kcache_dir(), d), "dir %s", kn__kcache_dir() ? kn__kcache_dir() : "(null)");
    size_t n = 123;
    CHECK(!kn__kcache_get(&k, &n) && n == 0, "missing entry: NULL");
    CHECK(kn__kcache_put(&k, blob, sizeof blob), "put");
    CHECK(get_is(&k, blob, sizeof blob), "get returns the blob");
    CHECK(!kn__kcache_get(&other, &n), "another source misses");
    char path[1024];
    int ntmp;
    CHECK(list_dir(d, path, sizeof path, &ntmp) == 1 && ntmp == 0, "one file, no temporaries");
    CHECK(strstr(path, ".cpu-so") && file_size(path) == 64 + (long)sizeof blob, "%s: %ld bytes", path, file_size(path));
    CHECK(kn__kcache_put(&k, "x", 1) && get_is(&k, "x", 1), "put replaces");
    CHECK(kn__kcache_put(&other, "", 0) && get_is(&k, "x", 1), "an empty blob");
    size_t n0 = 1;
    void *b0 = kn__kcache_get(&other, &n0);
    CHECK(b0 && n0 == 0, "the empty blob comes back");
    free(b0);
    rm_dir(d);
}

/* every field is part of the key, and field boundaries matter */
TEST(key_fields) {
    const char *d = fresh_dir();
    kn_kcache_key k = {"cpu-so", "ab", "c", "-O3", "src"};
    CHECK(kn__kcache_put(&k, "1", 1), "put");
    kn_kcache_key v[] = {
        {"cpu-so", "a", "bc", "-O3", "src"},   {"cuda-cubin", "ab", "c", "-O3", "src"},
        {"cpu-so", "ab", "c", "-O2", "src"},   {"cpu-so", "ab", "c", "-O3", "src "},
        {"cpu-so", "ab", "c2", "-O3", "src"},  {"cpu-so", "ab", "c", "-O3", NULL},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t n;
        void *b = kn__kcache_get(&v[i], &n);
        CHECK(!b, "variant %zu hits", i);
        free(b);
    }
    CHECK(get_is(&k, "1", 1), "the key itself hits");
    rm_dir(d);
}

/* corrupt entries: each is reported once (with the file's path and
 * "rebuilding"), removed, and a rebuild (put) works again */
typedef enum { C_BLOB, C_TRUNC, C_MAGIC, C_FOREIGN, C_HEADER, C_VERSION } corruption;
static corruption g_corrupt;

static int corrupt_child(const char *d) {
    int bad = 0;
    const char blob[] = "0123456789abcdef0123456789abcdef";
    for (int round = 0; round < 2; round++) {       /* twice: the second is not reported again */
        char src[64];
        snprintf(src, sizeof src, "kernel %d", round);
        kn_kcache_key k = key_of(src), k2 = key_of("another kernel");
        char path[1024], path2[1024];
        CCHECK(kn__kcache_put(&k, blob, sizeof blob));
        CCHECK(list_dir(d, path, sizeof path, NULL) == 1);
        int fd = open(path, O_RDWR);
        CCHECK(fd >= 0);
        unsigned char c;
        switch (g_corrupt) {
        case C_BLOB:    /* one bit of the blob's last byte */
            pread(fd, &c, 1, 64 + sizeof blob - 1); c ^= 4; pwrite(fd, &c, 1, 64 + sizeof blob - 1); break;
        case C_TRUNC: CCHECK(ftruncate(fd, 64 + 10) == 0); break;
        case C_MAGIC: pwrite(fd, "ELF!", 4, 0); break;
        case C_HEADER:  /* the blob length field: caught by the header checksum */
            pread(fd, &c, 1, 40); c ^= 1; pwrite(fd, &c, 1, 40); break;
        case C_VERSION: c = 9; pwrite(fd, &c, 1, 8); break;
        case C_FOREIGN: /* k's entry renamed to k2's file name, as a copy from another machine would be */
            CCHECK(kn__kcache_put(&k2, "zz", 2));
            CCHECK(list_dir(d, NULL, 0, NULL) == 2);
            {   /* find k2's name: the file that is not path */
                DIR *dp = opendir(d); struct dirent *e; path2[0] = 0;
                while ((e = readdir(dp)))
                    if (e->d_name[0] != '.' && !strstr(path, e->d_name)) snprintf(path2, sizeof path2, "%s/%s", d, e->d_name);
                closedir(dp);
            }
            CCHECK(rename(path, path2) == 0);
            memcpy(path, path2, sizeof path);
            k = k2;
            break;
        }
        close(fd);
        size_t n = 0;
        void *b = kn__kcache_get(&k, &n);
        CCHECK(!b);
        free(b);
        CCHECK(access(path, F_OK) != 0);             /* removed */
        CCHECK(kn__kcache_put(&k, blob, sizeof blob));   /* rebuilt */
        CCHECK(get_is(&k, blob, sizeof blob));
        rm_dir(d); mkdir(d, 0700);
    }
    return bad;
}

static void corrupt_case(corruption c, const char *what) {
    const char *d = fresh_dir();
    char err[4096];
    g_corrupt = c;
    int r = in_child(corrupt_child, d, err, sizeof err);
    CHECK(r == 0, "%d checks failed in the child; its stderr:\n%s", r, err);
    CHECK(count_of(err, "kiln: kernel cache: ") == 1, "reported once, got:\n%s", err);
    CHECK(strstr(err, what) && strstr(err, d) && strstr(err, "; rebuilding\n"), "message names %s, the path, rebuilding:\n%s", what, err);
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "%s", err);
    rm_dir(d);
}
TEST(corrupt_blob_byte) { corrupt_case(C_BLOB, "checksum mismatch"); }
TEST(truncated_file)    { corrupt_case(C_TRUNC, "truncated"); }
TEST(bad_magic)         { corrupt_case(C_MAGIC, "bad magic"); }
TEST(corrupt_header)    { corrupt_case(C_HEADER, "header checksum"); }
TEST(other_version)     { corrupt_case(C_VERSION, "format version 9"); }
TEST(foreign_entry)     { corrupt_case(C_FOREIGN, "foreign"); }

TEST(cache_off) {
    const char *d = fresh_dir();
    set_env("KN_CACHE", "0");
    kn_kcache_key k = key_of("off");
    size_t n;
    CHECK(!kn__kcache_dir(), "no directory when off");
    CHECK(!kn__kcache_put(&k, "a", 1), "put refuses");
    CHECK(!kn__kcache_get(&k, &n), "get misses");
    CHECK(list_dir(d, NULL, 0, NULL) == 0, "nothing written");
    set_env("KN_CACHE", "1");
    CHECK(kn__kcache_put(&k, "a", 1) && get_is(&k, "a", 1), "KN_CACHE=1 is on");
    set_env("KN_CACHE", NULL);
    rm_dir(d);
}

/* the default directory: $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln, made mode 0700 */
TEST(default_dir) {
    const char *d = fresh_dir();
    char base[600], want[700];
    snprintf(base, sizeof base, "%s", d);
    char *xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    set_env("KN_CACHE_DIR", NULL);
    setenv("XDG_CACHE_HOME", base, 1);
    snprintf(want, sizeof want, "%s/kiln", base);
    const char *got = kn__kcache_dir();
    CHECK(got && !strcmp(got, want), "XDG: %s", got ? got : "(null)");
    struct stat st;
    CHECK(stat(want, &st) == 0 && (st.st_mode & 0777) == 0700, "created 0700 (mode %o)", (unsigned)(st.st_mode & 0777));
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", base, 1);
    snprintf(want, sizeof want, "%s/.cache/kiln", base);
    got = kn__kcache_dir();
    CHECK(got && !strcmp(got, want), "HOME: %s", got ? got : "(null)");
    CHECK(stat(want, &st) == 0 && S_ISDIR(st.st_mode), "mkdir -p");
    kn_kcache_key k = key_of("home");
    CHECK(kn__kcache_put(&k, "h", 1) && get_is(&k, "h", 1), "usable");
    if (xdg) setenv("XDG_CACHE_HOME", xdg, 1);
    if (home) setenv("HOME", home, 1); else unsetenv("HOME");
    free(xdg); free(home);
    char p[800];
    snprintf(p, sizeof p, "%s/.cache/kiln", base); rm_dir(p);
    snprintf(p, sizeof p, "%s/.cache", base); rmdir(p);
    snprintf(p, sizeof p, "%s/kiln", base); rm_dir(p);
    rm_dir(base);
    set_env("KN_CACHE_DIR", NULL);
}

static int unwritable_child(const char *d) {
    int bad = 0;
    /* root writes into a mode 0500 directory anyway: the child drops to
     * nobody (65534), which owns the directory (chown by the parent) */
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 50;
    kn_kcache_key k = key_of("ro");
    size_t n;
    for (int i = 0; i < 3; i++) CCHECK(!kn__kcache_put(&k, "a", 1));
    CCHECK(!kn__kcache_get(&k, &n));
    int ntmp = 0;
    CCHECK(list_dir(d, NULL, 0, &ntmp) == 0 && ntmp == 0);
    return bad;
}
TEST(unwritable_dir) {
    const char *d = fresh_dir();
    if (geteuid() == 0 && chown(d, 65534, 65534) != 0) { rm_dir(d); SKIP("running as root and cannot chown to nobody (65534)"); }
    chmod(d, 0500);
    char err[4096];
    int r = in_child(unwritable_child, d, err, sizeof err);
    chmod(d, 0700);
    CHECK(r != 50, "as root: cannot drop to nobody");
    CHECK(r == 0, "%d checks failed in the child; its stderr:\n%s", r, err);
    CHECK(count_of(err, "kiln: kernel cache: ") == 1 && strstr(err, d), "reported once with the path:\n%s", err);
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "%s", err);
    rm_dir(d);
}

/* a directory that cannot be made (a file is in the way): off, no crash */
TEST(dir_is_a_file) {
    const char *d = fresh_dir();
    char f[700];
    snprintf(f, sizeof f, "%s/file", d);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    char sub[800];
    snprintf(sub, sizeof sub, "%s/sub", f);
    set_env("KN_CACHE_DIR", sub);
    kn_kcache_key k = key_of("x");
    fflush(stderr);
    int keep = dup(2), null = open("/dev/null", O_WRONLY);   /* the once-only report would leak into the log */
    dup2(null, 2);
    CHECK(!kn__kcache_dir() && !kn__kcache_put(&k, "a", 1), "off");
    dup2(keep, 2); close(keep); close(null);
    unlink(f);
    rm_dir(d);
}

/* a write that fails part way (a full disk, here a file size limit: EFBIG)
 * or a directory removed meanwhile: put says false once, leaves no file */
#include <signal.h>
#include <sys/resource.h>
static int write_fail_child(const char *d) {
    int bad = 0;
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1000, 1000};
    CCHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    static unsigned char big[100000];
    kn_kcache_key k = key_of("big"), k2 = key_of("big2");
    size_t n;
    CCHECK(!kn__kcache_put(&k, big, sizeof big));
    CCHECK(!kn__kcache_put(&k2, big, sizeof big));
    CCHECK(!kn__kcache_get(&k, &n));
    int ntmp = 0;
    CCHECK(list_dir(d, NULL, 0, &ntmp) == 0 && ntmp == 0);
    CCHECK(kn__kcache_put(&k, big, 100) && get_is(&k, big, 100));   /* small ones still fit */
    rm_dir(d);
    CCHECK(!kn__kcache_put(&k2, big, 10));                          /* directory gone */
    return bad;
}
TEST(write_fails) {
    const char *d = fresh_dir();
    char err[4096];
    int r = in_child(write_fail_child, d, err, sizeof err);
    CHECK(r == 0, "%d checks failed in the child; its stderr:\n%s", r, err);
    CHECK(count_of(err, "kiln: kernel cache: ") == 1 && strstr(err, "cannot write"), "reported once:\n%s", err);
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "%s", err);
    rm_dir(d);
}

/* 8 processes share one directory, each putting and getting a common key
 * and its own keys 200 times: no get may return a wrong or partial blob, and
 * afterwards every entry verifies and no temporary file is left */
#define NPROC 8
#define NITER 200
static void blob_for(int who, int i, unsigned char *b, size_t *n) {
    *n = 200 + (size_t)((who * 131 + i * 17) % 3000);
    for (size_t j = 0; j < *n; j++) b[j] = (unsigned char)(who * 7 + j * 13);
}
TEST(concurrent_writers) {
    const char *d = fresh_dir();
    fflush(stdout); fflush(stderr);
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            int bad = 0;
            unsigned char b[4096], shared[4096];
            size_t nb, nshared;
            blob_for(99, 0, shared, &nshared);
            kn_kcache_key ks = key_of("shared");
            for (int i = 0; i < NITER; i++) {
                char src[64];
                snprintf(src, sizeof src, "proc %d key %d", p, i % 20);
                kn_kcache_key k = key_of(src);
                blob_for(p, i % 20, b, &nb);
                if (!kn__kcache_put(&ks, shared, nshared)) bad++;
                if (!kn__kcache_put(&k, b, nb)) bad++;
                size_t n;
                void *g = kn__kcache_get(&ks, &n);     /* may miss only if never there: it always is */
                if (!g || n != nshared || memcmp(g, shared, n)) bad++;
                free(g);
                if (!get_is(&k, b, nb)) bad++;
            }
            _exit(bad > 100 ? 100 : bad);
        }
    }
    for (int p = 0; p < NPROC; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d: %d bad operations", p, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    int ntmp = 0, n = list_dir(d, NULL, 0, &ntmp);
    CHECK(n == 1 + NPROC * 20 && ntmp == 0, "%d entries (want %d), %d temporaries", n, 1 + NPROC * 20, ntmp);
    for (int p = 0; p < NPROC; p++)
        for (int i = 0; i < 20; i++) {
            char src[64];
            unsigned char b[4096];
            size_t nb;
            snprintf(src, sizeof src, "proc %d key %d", p, i);
            kn_kcache_key k = key_of(src);
            blob_for(p, i, b, &nb);
            CHECK(get_is(&k, b, nb), "entry %d/%d", p, i);
        }
    rm_dir(d);
}

int main(void) {
    int r = kn_test_main();
    set_env("KN_CACHE_DIR", NULL);
    return r;
}
