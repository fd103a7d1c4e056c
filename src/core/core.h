/* core/core.h: the core layer's internals (docs/ARCHITECTURE.md, layer 1):
 * struct kn_ctx, struct kn_buffer, the error helper, the host allocator and
 * Philox. Everything above core may include it; core includes nothing above. */
#ifndef KN_CORE_H
#define KN_CORE_H
#include "kiln.h"
#include "kiln_backend.h"
#include <stdio.h>

/* ---- buffers: reference-counted storage on one backend ------------------- */
struct kn_buffer {
    int refcount;
    kn_backend *be;
    void *data;
    size_t size;
    bool owned;            /* false: wraps caller memory, never freed by us */
    /* The contents never change while the buffer lives (set by whoever made
     * it, e.g. a model loader for its weights): a backend may then keep a
     * copy in a layout of its own (the CPU's 16-row packed quantized weights,
     * backends/quant/qpack.h) in `derived`, freed by derived_free with the
     * buffer. Set once, with a compare-exchange (two plans may race):
     * read and set with the __atomic builtins (a plain pointer, so the CUDA
     * sources, C++, can include this header). */
    bool constant;
    void *derived;
    void (*derived_free)(void *derived);
};
kn_buffer *kn_buffer_new(kn_backend *be, size_t size);   /* NULL + error on OOM */
kn_buffer *kn_buffer_wrap(kn_backend *be, void *data, size_t size);
void kn_buffer_retain(kn_buffer *b);
void kn_buffer_release(kn_buffer *b);

/* ---- context ------------------------------------------------------------- */
typedef struct kn_arena_chunk kn_arena_chunk;
struct kn_ctx {
    kn_backend *be;
    kn_arena_chunk *chunks;               /* arena of tensor descriptors            */
    kn_tensor **all;                  /* every tensor made, by id               */
    int32_t n_all, cap_all;
    kn_status status;                 /* sticky first error                     */
    int no_grad;                      /* no-grad scope depth                    */
    int n_syms;
    int64_t sym_max[KN_MAX_SYMS + 1];
    int64_t sym_val[KN_MAX_SYMS + 1];
    char sym_name[KN_MAX_SYMS + 1][24];
};

/* internal node flag: an effect node already ran (kn_realize) */
#define KN__FLAG_COMPUTED (1u << 8)

/* ---- errors (src/core/ctx.c) ---------------------------------------------- */
/* Report a misuse: records the message, makes ctx status sticky, returns NULL. */
kn_tensor *kn__fail(kn_ctx *ctx, kn_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A zeroed descriptor from ctx's arena, registered in ctx->all (NULL on OOM). */
kn_tensor *kn__alloc_tensor(kn_ctx *ctx);
/* A context on backend be (never NULL): kn_ctx_new (src/runtime/registry.c)
 * resolves a NULL backend to the default first, so core never looks up. */
kn_ctx *kn__ctx_new_on(kn_backend *be);

/* ---- host memory (src/core/buffer.c): the allocator of host backends ------ */
void *kn__host_alloc(kn_backend *be, size_t n);
void kn__host_free(kn_backend *be, void *p);
kn_status kn__host_copy(kn_backend *be, void *dst, const void *src, size_t n);

/* 64-bit FNV-1a of n bytes: the in-memory keys of generated kernels (names,
 * build and tuning memos); not for the disk cache (kcache.c uses SHA-256). */
static inline uint64_t kn__fnv1a(const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;   /* a cast: .cu files include this as C++ */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= c[i]; h *= 1099511628211ull; }
    return h;
}

/* Philox4x32-10 (src/core/philox.c): 4 x 32 random bits of counter ctr under key. */
void kn_philox4x32(uint64_t ctr, uint64_t key, uint32_t out[4]);
double kn_rand_at(kn_rand_kind kind, double a, double b, uint64_t seed, uint64_t i);
#endif
