/* kcache.c: the compiled-kernel cache on disk (kcache.h, docs/COMPILER.md).
 *
 * An entry is one file, <dir>/<32 hex>.<kind>: the hex is the first 128 bits
 * of SHA-256 over the key (its five fields, each preceded by its length, so
 * ("ab","c") and ("a","bc") differ). The file is a 64-byte header, then the
 * blob:
 *
 *   off  size  field (integers little-endian)
 *     0     8  magic "KNKCACH\n"
 *     8     4  format version (KC_VERSION)
 *    12     4  header size (64)
 *    16    16  key hash (the file name's 128 bits again)
 *    32     8  second key hash (MurmurHash64A of the same bytes, another algorithm)
 *    40     8  blob length
 *    48     8  blob checksum (MurmurHash64A, another seed)
 *    56     8  header checksum (of bytes 0..55)
 *
 * get() checks all of it; an entry that fails is reported once per process
 * and reason, unlinked (when the path still names the file that was read)
 * and treated as missing. put() writes a private temporary file in the same
 * directory and renames it into place, so a reader sees the old entry, the
 * new one or none, never half of one.
 *
 * Non-goals: eviction or a size limit (entries are small: a shared object or
 * cubin per distinct kernel; delete the directory to clear it), locking
 * (rename is the only synchronisation needed), a cryptographic guarantee
 * against someone who can write the directory (it is created mode 0700).
 */
#include "core/kcache.h"
#include "core/env.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KC_VERSION 1u
#define KC_HDR 64
#define KC_MAX_BLOB ((uint64_t)1 << 30)     /* anything longer is not ours */
static const unsigned char kc_magic[8] = {'K', 'N', 'K', 'C', 'A', 'C', 'H', '\n'};

/* ==== hashes ================================================================== */

/* SHA-256 (FIPS 180-4), one shot: the key is a few kilobytes at most. */
static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

/* exposed for test_kcache (the FIPS test vectors) */
void kn__sha256(const void *data, size_t n, unsigned char out[32]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = data;
    size_t left = n;
    for (; left >= 64; left -= 64, p += 64) sha_block(h, p);
    unsigned char tail[128] = {0};
    memcpy(tail, p, left);
    tail[left] = 0x80;
    size_t tl = left < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha_block(h, tail);
    if (tl == 128) sha_block(h, tail + 64);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(h[i] >> (24 - 8 * j));
}

static uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }

/* MurmurHash64A (Austin Appleby, public domain), bytes read little-endian so
 * the value does not depend on the host: the checksum of blob and header. */
static uint64_t murmur64(const void *data, size_t n, uint64_t seed) {
    const uint64_t m = 0xc6a4a7935bd1e995ull;
    const unsigned char *p = data;
    uint64_t h = seed ^ (n * m);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t k = rd64(p) * m;
        k ^= k >> 47; k *= m;
        h ^= k; h *= m;
    }
    if (n) {
        uint64_t k = 0;
        for (size_t i = 0; i < n; i++) k |= (uint64_t)p[i] << (8 * i);
        h ^= k; h *= m;
    }
    h ^= h >> 47; h *= m; h ^= h >> 47;
    return h;
}
#define SEED_KEY 0x6b696c6e2d6b6579ull    /* "kiln-key" */
#define SEED_BLOB 0x6b696c6e2d626c62ull   /* "kiln-blb" */
#define SEED_HDR 0x6b696c6e2d686472ull    /* "kiln-hdr" */

/* The key as one byte string: per field an 8-byte length, then its bytes
 * (a NULL field counts as empty). malloc'd; NULL when out of memory. */
static unsigned char *key_bytes(const kn_kcache_key *k, size_t *n) {
    const char *f[5] = {k->kind, k->device, k->toolchain, k->flags, k->source};
    size_t len[5], total = 0;
    for (int i = 0; i < 5; i++) { len[i] = f[i] ? strlen(f[i]) : 0; total += 8 + len[i]; }
    unsigned char *b = malloc(total), *p = b;
    if (!b) return NULL;
    for (int i = 0; i < 5; i++) {
        wr64(p, len[i]); p += 8;
        if (len[i]) memcpy(p, f[i], len[i]);
        p += len[i];
    }
    *n = total;
    return b;
}

typedef struct { unsigned char h128[16]; uint64_t h2; char name[64]; } key_id;

/* the key's two hashes and file name; false when out of memory */
static bool key_id_of(const kn_kcache_key *k, key_id *id) {
    size_t n;
    unsigned char *b = key_bytes(k, &n), sha[32];
    if (!b) return false;
    kn__sha256(b, n, sha);
    memcpy(id->h128, sha, 16);
    id->h2 = murmur64(b, n, SEED_KEY);
    free(b);
    char *p = id->name;
    for (int i = 0; i < 16; i++) p += sprintf(p, "%02x", id->h128[i]);
    *p++ = '.';
    /* the kind as a file-name suffix: letters, digits, '-' and '_' only */
    const char *kind = k->kind && *k->kind ? k->kind : "blob";
    for (int i = 0; kind[i] && i < 24; i++) {
        char c = kind[i];
        *p++ = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ? c : '_';
    }
    *p = 0;
    return true;
}

/* ==== reporting: once per process and reason ================================= */

typedef enum {
    R_MAGIC, R_VERSION, R_HEADER, R_TRUNCATED, R_LENGTH, R_CHECKSUM, R_FOREIGN, R_READ,
    R_DIR, R_WRITE, R_COUNT
} reason;
static atomic_bool g_said[R_COUNT];

static void say_once(reason r, const char *path, const char *what, const char *then) {
    if (atomic_exchange(&g_said[r], true)) return;
    fprintf(stderr, "kiln: kernel cache: %s: %s; %s\n", path, what, then);
}

/* ==== the directory =========================================================== */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_want[PATH_MAX];     /* the directory the environment names, last resolved */
static char g_dir[PATH_MAX];      /* g_want when usable, else "" (off) */
static bool g_resolved;
static atomic_uint g_tmp_counter;

/* mkdir -p with mode 0700 for what it creates; 0 or an errno */
static int mkdir_p(const char *dir) {
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return ENAMETOOLONG;
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0700) != 0 && errno != EEXIST) return errno;
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* The directory into out (PATH_MAX bytes); false when the cache is off.
 * Re-resolved whenever the environment names another directory (tests and
 * programs that setenv + kn_env_reload), else the first answer stands. */
static bool cache_dir(char *out) {
    const kn_env *env = kn_env_get();
    if (env->cache_off) return false;
    char want[PATH_MAX];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (env->cache_dir) w = snprintf(want, sizeof want, "%s", env->cache_dir);
    else if (xdg && *xdg == '/') w = snprintf(want, sizeof want, "%s/kiln", xdg);   /* relative XDG paths are to be ignored (XDG spec) */
    else if (home && *home) w = snprintf(want, sizeof want, "%s/.cache/kiln", home);
    else w = snprintf(want, sizeof want, "%s", "");
    if (w < 0 || (size_t)w >= sizeof want) want[0] = 0;
    pthread_mutex_lock(&g_mu);
    if (!g_resolved || strcmp(want, g_want) != 0) {
        memcpy(g_want, want, sizeof want);
        g_resolved = true;
        g_dir[0] = 0;
        int err = want[0] ? mkdir_p(want) : ENOENT;
        if (!want[0])
            say_once(R_DIR, "(no directory)", "HOME is not set", "cache off (set KN_CACHE_DIR)");
        else if (err || access(want, W_OK | X_OK) != 0) {
            char what[128];
            snprintf(what, sizeof what, "cannot use the directory (%s)", strerror(err ? err : errno));
            say_once(R_DIR, want, what, "cache off, generated kernels are compiled in every process (set KN_CACHE_DIR)");
        } else
            memcpy(g_dir, want, sizeof want);
    }
    bool on = g_dir[0] != 0;
    if (on) memcpy(out, g_dir, sizeof g_dir);
    pthread_mutex_unlock(&g_mu);
    return on;
}

const char *kn__kcache_dir(void) {
    static _Thread_local char dir[PATH_MAX];   /* per thread: another thread may resolve anew meanwhile */
    return cache_dir(dir) ? dir : NULL;
}

/* ==== get ===================================================================== */

static bool read_all(int fd, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r; n -= (size_t)r;
    }
    return true;
}

/* a bad entry: report, unlink if path still names the file fd read, NULL */
static void *bad(reason r, int fd, const char *path, const char *what) {
    struct stat a, b;
    bool same = fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    close(fd);
    if (same) unlink(path);   /* a writer may have renamed a good entry in since: leave that one */
    say_once(r, path, what, "rebuilding");
    return NULL;
}

void *kn__kcache_get(const kn_kcache_key *key, size_t *n) {
    if (n) *n = 0;
    char dir[PATH_MAX], path[PATH_MAX + 80], what[160];
    key_id id;
    if (!key || !n || !cache_dir(dir) || !key_id_of(key, &id)) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, id.name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;                         /* no entry (or unreadable: compiled again and replaced) */
    struct stat st;
    unsigned char h[KC_HDR];
    if (fstat(fd, &st) != 0) return bad(R_READ, fd, path, strerror(errno));
    if ((uint64_t)st.st_size < KC_HDR) {
        snprintf(what, sizeof what, "truncated (%lld bytes, shorter than the header)", (long long)st.st_size);
        return bad(R_TRUNCATED, fd, path, what);
    }
    if (!read_all(fd, h, KC_HDR)) return bad(R_READ, fd, path, "read error");
    if (memcmp(h, kc_magic, 8) != 0) return bad(R_MAGIC, fd, path, "not a kiln cache entry (bad magic)");
    if (rd32(h + 8) != KC_VERSION || rd32(h + 12) != KC_HDR) {
        snprintf(what, sizeof what, "format version %u, this build reads %u", rd32(h + 8), KC_VERSION);
        return bad(R_VERSION, fd, path, what);
    }
    if (murmur64(h, 56, SEED_HDR) != rd64(h + 56)) return bad(R_HEADER, fd, path, "header checksum mismatch (corrupt)");
    if (memcmp(h + 16, id.h128, 16) != 0 || rd64(h + 32) != id.h2)
        return bad(R_FOREIGN, fd, path, "entry of another key (foreign: copied from another device, toolchain or cache?)");
    uint64_t len = rd64(h + 40);
    if (len > KC_MAX_BLOB) return bad(R_LENGTH, fd, path, "blob length out of range (corrupt)");
    if ((uint64_t)st.st_size != KC_HDR + len) {
        snprintf(what, sizeof what, "%s (%lld bytes, the header says %llu)",
                 (uint64_t)st.st_size < KC_HDR + len ? "truncated" : "wrong length",
                 (long long)st.st_size, (unsigned long long)(KC_HDR + len));
        return bad((uint64_t)st.st_size < KC_HDR + len ? R_TRUNCATED : R_LENGTH, fd, path, what);
    }
    void *blob = malloc(len ? len : 1);
    if (!blob) { close(fd); return NULL; }           /* out of memory: just a miss */
    if (!read_all(fd, blob, len)) { free(blob); return bad(R_READ, fd, path, "read error"); }
    if (murmur64(blob, len, SEED_BLOB) != rd64(h + 48)) { free(blob); return bad(R_CHECKSUM, fd, path, "blob checksum mismatch (corrupt)"); }
    close(fd);
    *n = len;
    return blob;
}

/* ==== put ===================================================================== */

static int write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        p += w; n -= (size_t)w;
    }
    return 0;
}

bool kn__kcache_put(const kn_kcache_key *key, const void *blob, size_t n) {
    char dir[PATH_MAX], path[PATH_MAX + 80], tmp[PATH_MAX + 120];
    key_id id;
    if (!key || (!blob && n) || (uint64_t)n > KC_MAX_BLOB || !cache_dir(dir) || !key_id_of(key, &id)) return false;
    snprintf(path, sizeof path, "%s/%s", dir, id.name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&g_tmp_counter, 1u));
    unsigned char h[KC_HDR];
    memcpy(h, kc_magic, 8);
    wr32(h + 8, KC_VERSION);
    wr32(h + 12, KC_HDR);
    memcpy(h + 16, id.h128, 16);
    wr64(h + 32, id.h2);
    wr64(h + 40, n);
    wr64(h + 48, murmur64(blob, n, SEED_BLOB));
    wr64(h + 56, murmur64(h, 56, SEED_HDR));
    int err = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) err = errno;
    else {
        err = write_all(fd, h, KC_HDR);
        if (!err) err = write_all(fd, blob, n);
        if (close(fd) != 0 && !err) err = errno;    /* NFS and full disks report late */
        if (!err && rename(tmp, path) != 0) err = errno;
        if (err) unlink(tmp);
    }
    if (err) {
        char what[128];
        snprintf(what, sizeof what, "cannot write an entry (%s)", strerror(err));
        say_once(R_WRITE, path, what, "this kernel will be compiled again by the next process");
        return false;
    }
    return true;
}
