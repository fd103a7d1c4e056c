/* buffer.c: reference-counted storage on a backend, and the host allocator
 * shared by the CPU backends (64-byte aligned so SIMD loads never split lines). */
#include "core/core.h"
#include <stdlib.h>
#include <string.h>

void *kn__host_alloc(kn_backend *be, size_t n) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0) return NULL;
    return p;
}
void kn__host_free(kn_backend *be, void *p) { (void)be; free(p); }
kn_status kn__host_copy(kn_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n) memcpy(dst, src, n);
    return KN_OK;
}

kn_buffer *kn_buffer_new(kn_backend *be, size_t size) {
    kn_buffer *b = calloc(1, sizeof *b);
    if (!b) { kn_set_error(KN_ERR_NOMEM, "out of host memory allocating a buffer header"); return NULL; }
    b->data = be->alloc(be, size);
    if (!b->data) {
        free(b);
        kn_set_error(KN_ERR_NOMEM, "%s backend: out of memory allocating %zu bytes; "
                     "use smaller batches or free unused contexts", be->name, size);
        return NULL;
    }
    b->refcount = 1; b->be = be; b->size = size; b->owned = true;
    return b;
}

kn_buffer *kn_buffer_wrap(kn_backend *be, void *data, size_t size) {
    kn_buffer *b = calloc(1, sizeof *b);
    if (!b) { kn_set_error(KN_ERR_NOMEM, "out of host memory allocating a buffer header"); return NULL; }
    b->refcount = 1; b->be = be; b->data = data; b->size = size; b->owned = false;
    return b;
}

void kn_buffer_retain(kn_buffer *b) { if (b) b->refcount++; }
void kn_buffer_release(kn_buffer *b) {
    if (!b || --b->refcount > 0) return;
    void *derived = __atomic_load_n(&b->derived, __ATOMIC_ACQUIRE);
    if (derived && b->derived_free) b->derived_free(derived);
    if (b->owned) b->be->free(b->be, b->data);
    free(b);
}
