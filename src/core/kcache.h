/* kcache.h: the compiled-kernel cache on disk (docs/COMPILER.md, "The cache").
 *
 * Backends keep what they compile at run time here (the CPU backend: shared
 * objects built by the system C compiler; CUDA: cubins built by NVRTC), so a
 * second process skips the compiler. An entry is found by a hash of its whole
 * key (kind, device, toolchain, flags, source); the file repeats the key's
 * hash and carries the blob's length and checksum, so a corrupt, truncated or
 * foreign entry (another device, another toolchain, a hash collision) is
 * detected, reported once (stderr, `kiln: kernel cache: ...`), removed and
 * rebuilt by the caller. Writes go to a private temporary file renamed into
 * place, so processes sharing the directory never see half an entry.
 *
 * The directory: $KN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln; KN_CACHE=0 turns the cache off (every kernel compiled
 * in each process). An unwritable directory is reported once and the cache is
 * off for the process: a cache is never a reason to fail.
 */
#ifndef KN_KCACHE_H
#define KN_KCACHE_H
#include <stdbool.h>
#include <stddef.h>

typedef struct kn_kcache_key {
    const char *kind;        /* "cpu-so", "cuda-cubin" */
    const char *device;      /* "x86-64 avx2 avx512f ...", "sm_90 NVIDIA H100 80GB HBM3" */
    const char *toolchain;   /* compiler identity: `cc --version` first line, NVRTC version */
    const char *flags;       /* compile flags */
    const char *source;      /* the kernel source */
} kn_kcache_key;

/* The cached blob for key (malloc'd, *n bytes; the caller frees), or NULL when
 * there is none, it is unusable (reported once, removed) or the cache is off. */
void *kn__kcache_get(const kn_kcache_key *key, size_t *n);
/* Stores blob under key; false when it could not (reported once). */
bool kn__kcache_put(const kn_kcache_key *key, const void *blob, size_t n);
/* The directory in use, or NULL when the cache is off. */
const char *kn__kcache_dir(void);
#endif
