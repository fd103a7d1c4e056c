/* test_cuda_jit.c: the CUDA backend's generated-kernel entries
 * (src/backends/cuda/cuda_jit.cu).
 *
 * Without a GPU (a `make CUDA=1` build): NVRTC compiles a hand-written
 * kernel in the generated signature to a cubin (sm_90, sm_80) and to PTX,
 * and a syntax error gives NVRTC's log. With a GPU (make test-cuda): the
 * kernel is built through kernel_build, run through kernel_run with its n
 * read from the symbols (syms_upload), at sizes up to past the grid cap,
 * symbol values change between launches without a sync, errors come back as
 * statuses, and a second build (and a second process) loads the cached cubin.
 * Built without CUDA, every test SKIPs.
 *   build-cuda/tests/test_cuda_jit        (KN_TEST_VERBOSE=1: the device and NVRTC)
 */
#include "kn_test.h"
#include "kiln_backend.h"
#include "core/env.h"
#include <dirent.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef KN_CUDA
#include "kiln_cuda.h"
#include "backends/cuda/cuda_jit.h"
#endif

extern char **environ;

static char g_dir[512];

static void set_env(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
    kn_env_reload();
}

#ifndef KN_CUDA
TEST(cuda_jit) { SKIP("built without CUDA (make CUDA=1)"); }
#else
/* the kernels, as the CUDA renderer would emit them: self-contained, with
 * the kn_kargs layout of kiln_backend.h, n from the symbols, grid-stride */
#define KARGS "struct kn_kargs { char *buf[24]; const long long *syms; long long n; void *err; };\n"
static const char *k_axpy = KARGS
    "extern \"C\" __global__ void k_axpy(kn_kargs a) {\n"
    "    long long n = a.syms[1];\n"
    "    float *y = (float *)a.buf[0]; const float *b = (const float *)a.buf[1], *c = (const float *)a.buf[2];\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
    "        y[i] = b[i] * 2.0f + c[i];\n"
    "}\n";
/* out[syms[2]] = syms[1]: each launch sees the values uploaded before it */
static const char *k_sym = KARGS
    "extern \"C\" __global__ void k_sym(kn_kargs a) {\n"
    "    if (blockIdx.x == 0 && threadIdx.x == 0) ((long long *)a.buf[0])[a.syms[2]] = a.syms[1];\n"
    "}\n";

static char g_why[8192];


/* ---- NVRTC alone: no GPU needed ---- */
TEST(nvrtc_cubin_and_ptx) {
    CHECK(!strncmp(kn__cuda_jit_nvrtc_version(), "NVRTC ", 6), "%s", kn__cuda_jit_nvrtc_version());
    int archs[] = {90, 80};
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        char flags[128];
        void *c = kn__cuda_jit_compile(k_axpy, archs[i], false, &n, flags, sizeof flags, g_why, sizeof g_why);
        CHECK(c && n > 64 && !memcmp(c, "\x7f" "ELF", 4), "sm_%d cubin (%zu bytes): %s", archs[i], n, g_why);
        CHECK(strstr(flags, "--std=c++17") && strstr(flags, "--gpu-architecture=sm_") && !strstr(flags, "fast_math"), "flags %s", flags);
        free(c);
    }
    size_t n = 0;
    char *p = kn__cuda_jit_compile(k_axpy, 90, true, &n, NULL, 0, g_why, sizeof g_why);
    CHECK(p && n > 0 && p[n - 1] == 0 && strstr(p, ".entry k_axpy") && strstr(p, ".target sm_90"), "PTX: %s", p ? "no .entry k_axpy / .target sm_90" : g_why);
    /* no fast math: no flush-to-zero, no approximate division */
    CHECK(p && !strstr(p, "div.full") && !strstr(p, ".ftz"), "no fast-math instructions in the PTX");
    free(p);
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "  %s\n", kn__cuda_jit_nvrtc_version());
}

TEST(nvrtc_syntax_error) {
    size_t n = 1;
    void *c = kn__cuda_jit_compile(KARGS "extern \"C\" __global__ void k_bad(kn_kargs a) { oops }\n", 90, false, &n,
                                   NULL, 0, g_why, sizeof g_why);
    CHECK(!c && n == 0, "a syntax error builds nothing");
    CHECK(strstr(g_why, "NVRTC failed") && strstr(g_why, "error") && strstr(g_why, "oops"), "why has NVRTC's log: %s", g_why);
    char tiny[16];
    c = kn__cuda_jit_compile("int x = ;", 90, false, &n, NULL, 0, tiny, sizeof tiny);
    CHECK(!c && strlen(tiny) < sizeof tiny, "why is cut to its size");
}

/* ---- on the GPU ---- */
static kn_backend *gpu(void) {
    static int tried;
    static kn_backend *be;
    if (!tried++) be = kn_backend_cuda();
    return be;
}
#define NEED_GPU() do { if (!gpu()) SKIP("no usable GPU (%.200s)", kn_last_error()); } while (0)

TEST(gpu_backend_fields) {
    NEED_GPU();
    kn_backend *be = gpu();
    CHECK(be->kernel_lang && !strcmp(be->kernel_lang, "cuda"), "kernel_lang \"cuda\"");
    CHECK(be->kernel_build && be->kernel_run && be->kernel_free && be->syms_upload, "entries");
}

TEST(gpu_axpy) {
    NEED_GPU();
    kn_backend *be = gpu();
    void *k = be->kernel_build(be, k_axpy, "k_axpy", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    int64_t sizes[] = {1, 1000, 1 << 20, 1 << 25};   /* the last is past the grid cap: the grid-stride loop does the rest */
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        size_t bytes = sizeof(float) * (size_t)(n + 1);
        float *y = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes), *out = malloc(bytes);
        REQUIRE(y && b && c && out, "malloc");
        kn_test_fill_f32(b, n + 1, -2, 2);
        kn_test_fill_f32(c, n + 1, -2, 2);
        for (int64_t i = 0; i <= n; i++) y[i] = -777.0f;
        float *dy = be->alloc(be, bytes), *db = be->alloc(be, bytes), *dc = be->alloc(be, bytes);
        REQUIRE(dy && db && dc, "device alloc");
        be->copy_in(be, dy, y, bytes); be->copy_in(be, db, b, bytes); be->copy_in(be, dc, c, bytes);
        kn_kernel_launch l = {0};
        l.a.buf[0] = (char *)dy; l.a.buf[1] = (char *)db; l.a.buf[2] = (char *)dc;
        l.a.n = n; l.n_max = n + 1; l.block = s == 2 ? 128 : 0;
        /* first half the items: the kernel reads n from the symbols, not from the launch */
        int64_t syms[2] = {0, n / 2};
        CHECK(be->syms_upload(be, syms, 1) == KN_OK, "upload: %s", kn_last_error());
        CHECK(be->kernel_run(be, k, &l) == KN_OK, "run: %s", kn_last_error());
        CHECK(be->copy_out(be, out, dy, bytes) == KN_OK && be->synchronize(be) == KN_OK, "%s", kn_last_error());
        long bad = 0;
        for (int64_t i = 0; i <= n; i++) bad += out[i] != (i < n / 2 ? b[i] * 2.0f + c[i] : -777.0f);
        CHECK(bad == 0, "n=%lld, syms n/2: %ld wrong", (long long)n, bad);
        syms[1] = n;
        CHECK(be->syms_upload(be, syms, 1) == KN_OK && be->kernel_run(be, k, &l) == KN_OK, "%s", kn_last_error());
        CHECK(be->copy_out(be, out, dy, bytes) == KN_OK && be->synchronize(be) == KN_OK, "%s", kn_last_error());
        bad = 0;
        for (int64_t i = 0; i <= n; i++) bad += out[i] != (i < n ? b[i] * 2.0f + c[i] : -777.0f);
        CHECK(bad == 0, "n=%lld: %ld wrong", (long long)n, bad);
        be->free(be, dy); be->free(be, db); be->free(be, dc);
        free(y); free(b); free(c); free(out);
    }
    be->kernel_free(be, k);
}

/* uploads and launches queued back to back (more than the pinned mirrors):
 * every launch sees the values uploaded just before it */
TEST(gpu_syms_stream_order) {
    NEED_GPU();
    kn_backend *be = gpu();
    void *k = be->kernel_build(be, k_sym, "k_sym", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    enum { N = 40 };
    long long *d = be->alloc(be, sizeof(long long) * N), out[N];
    REQUIRE(d, "alloc");
    for (int j = 0; j < N; j++) {
        int64_t syms[3] = {0, 1000 + j, j};
        kn_kernel_launch l = {0};
        l.a.buf[0] = (char *)d; l.a.n = 1;
        CHECK(be->syms_upload(be, syms, 2) == KN_OK && be->kernel_run(be, k, &l) == KN_OK, "%s", kn_last_error());
    }
    CHECK(be->copy_out(be, out, d, sizeof out) == KN_OK && be->synchronize(be) == KN_OK, "%s", kn_last_error());
    int bad = 0;
    for (int j = 0; j < N; j++) bad += out[j] != 1000 + j;
    CHECK(bad == 0, "%d launches saw other values", bad);
    be->free(be, d);
    be->kernel_free(be, k);
}

TEST(gpu_errors) {
    NEED_GPU();
    kn_backend *be = gpu();
    void *k = be->kernel_build(be, KARGS "extern \"C\" __global__ void k_bad(kn_kargs a) { oops }\n", "k_bad", g_why, sizeof g_why);
    CHECK(!k && strstr(g_why, "NVRTC failed") && strstr(g_why, "oops"), "syntax error: %s", g_why);
    k = be->kernel_build(be, k_axpy, "no_such_kernel", g_why, sizeof g_why);
    CHECK(!k && strstr(g_why, "no_such_kernel"), "missing kernel: %s", g_why);
    k = be->kernel_build(be, k_axpy, "k_axpy", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    kn_kernel_launch l = {0};
    l.a.n = 10; l.block = 2048;
    CHECK(be->kernel_run(be, k, &l) == KN_ERR_INVALID && strstr(kn_last_error(), "2048"), "bad block: %s", kn_last_error());
    int64_t syms[KN_MAX_SYMS + 2] = {0};
    CHECK(be->syms_upload(be, syms, KN_MAX_SYMS + 1) == KN_ERR_INVALID, "too many symbols");
    CHECK(be->kernel_run(be, NULL, &l) == KN_ERR_INVALID, "NULL kernel");
    be->kernel_free(be, k);
    be->kernel_free(be, NULL);
    CHECK(be->synchronize(be) == KN_OK, "the stream is still fine: %s", kn_last_error());
}

/* a second build loads the cubin from the disk cache; so does a second
 * process (this binary again, running gpu_cache_child) */
TEST(gpu_cache) {
    NEED_GPU();
    kn_backend *be = gpu();
    kn_cuda_jit_stats s0, s1, s2;
    kn__cuda_jit_stats(&s0);
    const char *src = KARGS "// the cache test\n"
        "extern \"C\" __global__ void k_c(kn_kargs a) { if (threadIdx.x == 0) a.buf[0][0] = 1; }\n";
    void *k = be->kernel_build(be, src, "k_c", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    kn__cuda_jit_stats(&s1);
    be->kernel_free(be, k);
    k = be->kernel_build(be, src, "k_c", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    kn__cuda_jit_stats(&s2);
    be->kernel_free(be, k);
    CHECK(s1.compiles == s0.compiles + 1 && s1.cache_hits == s0.cache_hits, "first build compiles");
    CHECK(s2.compiles == s1.compiles && s2.cache_hits == s1.cache_hits + 1, "second build hits (%ld %ld)", s2.compiles - s1.compiles, s2.cache_hits - s1.cache_hits);
    setenv("KN_TEST_ONLY", "gpu_cache_child", 1);
    setenv("KN_CUDA_JIT_CHILD", "1", 1);
    char *argv[] = {"test_cuda_jit", NULL};
    pid_t pid;
    int st = -1;
    fflush(stdout);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) == 0) waitpid(pid, &st, 0);
    unsetenv("KN_TEST_ONLY");
    unsetenv("KN_CUDA_JIT_CHILD");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second process loads from the cache (its output above)");
}
TEST(gpu_cache_child) {
    if (!getenv("KN_CUDA_JIT_CHILD")) SKIP("run by gpu_cache in a second process");
    NEED_GPU();
    kn_backend *be = gpu();
    const char *src = KARGS "// the cache test\n"
        "extern \"C\" __global__ void k_c(kn_kargs a) { if (threadIdx.x == 0) a.buf[0][0] = 1; }\n";
    void *k = be->kernel_build(be, src, "k_c", g_why, sizeof g_why);
    REQUIRE(k, "build: %s", g_why);
    kn_cuda_jit_stats s;
    kn__cuda_jit_stats(&s);
    CHECK(s.compiles == 0 && s.cache_hits == 1, "second process: %ld compiles, %ld hits", s.compiles, s.cache_hits);
    be->kernel_free(be, k);
}
#endif

int main(void) {
    bool child = getenv("KN_CUDA_JIT_CHILD") != NULL;   /* gpu_cache's second process: the same directory */
    const char *t = getenv("TMPDIR");
    if (!child) {
        snprintf(g_dir, sizeof g_dir, "%s/kn_cuda_jit_XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
        set_env("KN_CACHE_DIR", g_dir);
    }
    int r = kn_test_main();
    if (!child) {
        DIR *dp = opendir(g_dir);
        struct dirent *e;
        char p[1024];
        while (dp && (e = readdir(dp)))
            if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name); unlink(p); }
        if (dp) closedir(dp);
        rmdir(g_dir);
    }
    return r;
}
