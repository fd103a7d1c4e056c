/* kiln_backend.h: the interface a backend implements.
 *
 * A backend is a table of function pointers. A new device needs alloc, free,
 * copy_in, copy_out and compute; the rest is optional. The planner hands
 * compute() one node at a time with every operand resolved to a kn_tview:
 * a data pointer already advanced by the tensor's offset, the run-time
 * extents (symbolic dims resolved) and element strides.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KN_BACKEND_VERSION 1

typedef enum { KN_DEVICE_HOST = 0, KN_DEVICE_CUDA = 1 } kn_device;

/* A resolved operand: element (i0,..,in) is at data + sum(i_k * st[k]) elements. */
typedef struct kn_tview {
    void *data;
    kn_dtype dtype;
    int ndim;
    int64_t ne[KN_MAX_DIMS];   /* run-time extents                 */
    int64_t st[KN_MAX_DIMS];   /* strides in elements              */
} kn_tview;

typedef struct kn_exec {
    const kn_tensor *node;     /* op, params, max shapes           */
    kn_tview dst;
    kn_tview src[KN_MAX_SRC];
    int nsrc;
    const int64_t *syms;       /* symbol values, index 1..KN_MAX_SYMS */
} kn_exec;

struct kn_backend {
    int version;               /* KN_BACKEND_VERSION */
    const char *name;
    kn_device device;
    void *(*alloc)(kn_backend *be, size_t size);           /* NULL when out of memory */
    void (*free)(kn_backend *be, void *ptr);
    kn_status (*copy_in)(kn_backend *be, void *dst, const void *host, size_t n);
    kn_status (*copy_out)(kn_backend *be, void *host, const void *src, size_t n);
    kn_status (*compute)(kn_backend *be, const kn_exec *e);
    kn_status (*synchronize)(kn_backend *be);               /* (optional) */
    bool (*supports)(kn_backend *be, const kn_tensor *node); /* (optional) NULL = all */
    void *impl;
};

/* Helpers shared by backends (src/core/tview.c) */
int64_t kn_tview_numel(const kn_tview *v);
bool kn_tview_is_contiguous(const kn_tview *v);
/* Align v to an output of ndim dims (right-aligned; size-1 dims get stride 0). */
kn_tview kn_tview_broadcast(const kn_tview *v, int ndim, const int64_t *ne);
double kn_load(kn_dtype t, const void *base, int64_t i);   /* element i as double */
void kn_store(kn_dtype t, void *base, int64_t i, double v);/* rounds (RNE) / saturates ints */

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
