/* pool.cu: caching device allocator.
 * Requests are rounded up to a size class: below 512 bytes -> 512; above, 4
 * classes per power of two (so at most 25% waste: 512, 640, 768, 896, 1024,
 * 1280, ...). Freed blocks go on their class's free list (host-side nodes) and
 * are reused with no cudaMalloc; a pointer -> block hash map finds the class
 * on release. When cudaMalloc fails, all cached blocks are freed and the call
 * retried once; then KN_ERR_NOMEM with the sizes involved.
 * Non-goals: no splitting/merging of blocks, no stream-ordered reuse (a block
 * released while a kernel still uses it must be synchronized by the caller). */
#include "backends/cuda/common.cuh"
#include <mutex>
#include <new>
#include <stdlib.h>
#include <string.h>

#define KN_POOL_NCLASS 256

struct kn_pool_block {
    void *ptr;
    size_t cls_bytes, req_bytes;
    int cls;
    kn_pool_block *next;       // free list or hash chain
};

struct kn_cuda_pool {
    std::mutex mu;
    size_t limit;
    kn_pool_block *free_list[KN_POOL_NCLASS];
    kn_pool_block **live;      // hash of handed-out blocks by pointer
    size_t live_cap;           // power of two
    size_t n_live;
    kn_cuda_pool_stats st;
};

/* Class index and its byte size for a request of n bytes (n >= 1). */
static int pool_class(size_t n, size_t *cls_bytes) {
    if (n <= 512) { *cls_bytes = 512; return 0; }
    int e = 63 - __builtin_clzll((unsigned long long)(n - 1));   // 2^e < n <= 2^(e+1)
    size_t base = (size_t)1 << e, quarter = base / 4;
    size_t k = (n - base + quarter - 1) / quarter;                // 1..4
    *cls_bytes = base + k * quarter;
    return (e - 9) * 4 + (int)k;                                  // e >= 9 here
}

static size_t pool_hash(void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p >> 8;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20) & (cap - 1);
}

extern "C" kn_status kn_cuda_pool_new(kn_cuda_pool **out, size_t limit_bytes) {
    KN_CUDA_REQUIRE(out, "kn_cuda_pool_new: out is NULL");
    *out = NULL;
    kn_cuda_pool *p = new (std::nothrow) kn_cuda_pool();
    if (!p) return kn_set_error(KN_ERR_NOMEM, "kn_cuda_pool_new: host allocation failed");
    p->limit = limit_bytes;
    memset(p->free_list, 0, sizeof p->free_list);
    memset(&p->st, 0, sizeof p->st);
    p->live_cap = 1024;
    p->n_live = 0;
    p->live = (kn_pool_block **)calloc(p->live_cap, sizeof *p->live);
    if (!p->live) { delete p; return kn_set_error(KN_ERR_NOMEM, "kn_cuda_pool_new: host allocation failed"); }
    *out = p;
    return KN_OK;
}

static void pool_trim_locked(kn_cuda_pool *p) {
    for (int c = 0; c < KN_POOL_NCLASS; c++) {
        kn_pool_block *b = p->free_list[c];
        while (b) {
            kn_pool_block *n = b->next;
            cudaFree(b->ptr);
            p->st.cached_bytes -= b->cls_bytes;
            free(b);
            b = n;
        }
        p->free_list[c] = NULL;
    }
}

extern "C" void kn_cuda_pool_free(kn_cuda_pool *p) {
    if (!p) return;
    pool_trim_locked(p);
    for (size_t i = 0; i < p->live_cap; i++) {
        kn_pool_block *b = p->live[i];
        while (b) { kn_pool_block *n = b->next; cudaFree(b->ptr); free(b); b = n; }
    }
    free(p->live);
    delete p;
}

extern "C" kn_status kn_cuda_pool_trim(kn_cuda_pool *p) {
    KN_CUDA_REQUIRE(p, "kn_cuda_pool_trim: pool is NULL");
    std::lock_guard<std::mutex> g(p->mu);
    pool_trim_locked(p);
    return KN_OK;
}

/* Insert into the live hash; doubles the table when chains average > 2. */
static void pool_live_insert(kn_cuda_pool *p, kn_pool_block *b) {
    if (p->n_live + 1 > 2 * p->live_cap) {
        size_t nc = p->live_cap * 2;
        kn_pool_block **nt = (kn_pool_block **)calloc(nc, sizeof *nt);
        if (nt) {                      // on failure keep the old table: longer chains, still right
            for (size_t i = 0; i < p->live_cap; i++) {
                kn_pool_block *q = p->live[i];
                while (q) {
                    kn_pool_block *n = q->next;
                    size_t h = pool_hash(q->ptr, nc);
                    q->next = nt[h]; nt[h] = q;
                    q = n;
                }
            }
            free(p->live);
            p->live = nt; p->live_cap = nc;
        }
    }
    size_t h = pool_hash(b->ptr, p->live_cap);
    b->next = p->live[h];
    p->live[h] = b;
    p->n_live++;
}

extern "C" kn_status kn_cuda_pool_alloc(kn_cuda_pool *p, size_t nbytes, void **d_ptr) {
    KN_CUDA_REQUIRE(p && d_ptr, "kn_cuda_pool_alloc: NULL pool or out pointer");
    *d_ptr = NULL;
    KN_CUDA_REQUIRE(nbytes > 0, "kn_cuda_pool_alloc: nbytes is 0");
    KN_CUDA_REQUIRE(nbytes <= ((size_t)1 << 60), "kn_cuda_pool_alloc: nbytes=%zu is absurd", nbytes);
    size_t cb = 0;
    int c = pool_class(nbytes, &cb);
    if (c >= KN_POOL_NCLASS) return kn_set_error(KN_ERR_NOMEM, "kn_cuda_pool_alloc: %zu bytes is beyond the largest size class", nbytes);
    std::lock_guard<std::mutex> g(p->mu);
    p->st.n_allocs++;
    kn_pool_block *b = p->free_list[c];
    if (b) {
        p->free_list[c] = b->next;
        p->st.cached_bytes -= cb;
    } else {
        if (p->limit && p->st.current_bytes + p->st.cached_bytes + cb > p->limit) pool_trim_locked(p);
        if (p->limit && p->st.current_bytes + cb > p->limit)
            return kn_set_error(KN_ERR_NOMEM,
                                "kn_cuda_pool_alloc: %zu bytes (class %zu) would pass the pool "
                                "limit of %zu bytes (%zu in use); free tensors or raise the limit",
                                nbytes, cb, p->limit, p->st.current_bytes);
        void *ptr = NULL;
        cudaError_t e = cudaMalloc(&ptr, cb);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();                 // clear the sticky-free error state
            pool_trim_locked(p);
            e = cudaMalloc(&ptr, cb);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            return kn_set_error(e == cudaErrorMemoryAllocation ? KN_ERR_NOMEM : KN_ERR_BACKEND,
                                "kn_cuda_pool_alloc: cudaMalloc of %zu bytes (asked %zu) failed: "
                                "%s; pool has %zu bytes in use (peak %zu), device has %zu of %zu "
                                "bytes free; use a smaller batch or model",
                                cb, nbytes, cudaGetErrorString(e), p->st.current_bytes,
                                p->st.peak_bytes, fr, tot);
        }
        p->st.n_device_allocs++;
        b = (kn_pool_block *)malloc(sizeof *b);
        if (!b) { cudaFree(ptr); return kn_set_error(KN_ERR_NOMEM, "kn_cuda_pool_alloc: host allocation failed"); }
        b->ptr = ptr; b->cls_bytes = cb; b->cls = c;
    }
    b->req_bytes = nbytes;
    pool_live_insert(p, b);
    p->st.current_bytes += cb;
    p->st.requested_bytes += nbytes;
    if (p->st.current_bytes > p->st.peak_bytes) p->st.peak_bytes = p->st.current_bytes;
    *d_ptr = b->ptr;
    return KN_OK;
}

extern "C" kn_status kn_cuda_pool_release(kn_cuda_pool *p, void *d_ptr) {
    if (!d_ptr) return KN_OK;
    KN_CUDA_REQUIRE(p, "kn_cuda_pool_release: pool is NULL");
    std::lock_guard<std::mutex> g(p->mu);
    size_t h = pool_hash(d_ptr, p->live_cap);
    kn_pool_block **pp = &p->live[h];
    while (*pp && (*pp)->ptr != d_ptr) pp = &(*pp)->next;
    if (!*pp)
        return kn_set_error(KN_ERR_INVALID, "kn_cuda_pool_release: %p was not allocated by this "
                            "pool (or was released twice)", d_ptr);
    kn_pool_block *b = *pp;
    *pp = b->next;
    p->n_live--;
    p->st.current_bytes -= b->cls_bytes;
    p->st.requested_bytes -= b->req_bytes;
    b->next = p->free_list[b->cls];
    p->free_list[b->cls] = b;
    p->st.cached_bytes += b->cls_bytes;
    return KN_OK;
}

extern "C" void kn_cuda_pool_get_stats(kn_cuda_pool *p, kn_cuda_pool_stats *s) {
    if (!s) return;
    if (!p) { memset(s, 0, sizeof *s); return; }
    std::lock_guard<std::mutex> g(p->mu);
    *s = p->st;
}
