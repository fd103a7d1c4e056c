/* fuzz_kcache.c: libFuzzer harness for the compiled-kernel cache's reader
 * (src/core/kcache.c). A cache directory is shared by processes and may hold
 * anything (a truncated write, another version, a file copied from another
 * machine): each input is written as the entry file of a fixed key, and
 * kn__kcache_get must return either NULL or exactly the blob that was put
 * for that key, never crash or read out of bounds. */
#include "core/kcache.h"
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const kn_kcache_key g_key = {"cpu-so", "fuzz-device", "fuzz-cc 1.0", "-O2", "void k(void) {}"};
static const char g_blob[] = "the blob that was put";
static char g_path[4096];

/* A fresh cache directory with one good entry; g_path is its file. */
static int setup(void) {
    char dir[] = "/tmp/kn_fuzz_kcache_XXXXXX";
    if (!mkdtemp(dir)) return -1;
    setenv("KN_CACHE_DIR", dir, 1);
    if (!kn__kcache_put(&g_key, g_blob, sizeof g_blob)) return -1;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(g_path, sizeof g_path, "%s/%s", dir, e->d_name);
    if (d) closedir(d);
    return g_path[0] ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready = 0;
    if (!ready) { if (setup() != 0) abort(); ready = 1; }
    FILE *f = fopen(g_path, "wb");
    if (!f) return 0;
    if (size && fwrite(data, 1, size, f) != size) { fclose(f); return 0; }
    fclose(f);
    size_t n = 0;
    void *b = kn__kcache_get(&g_key, &n);
    /* a blob that comes back must be whole: the checksum covers it */
    if (b && (n > (size_t)1 << 30)) abort();
    free(b);
    return 0;
}
