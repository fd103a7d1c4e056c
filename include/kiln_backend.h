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

#define KN_BACKEND_VERSION 6   /* 2: the kernel_*, syms_upload and capture/replay fields (the runtime reads them only from version >= 2); 3: epilogue_ok, kn_kargs.err and kn_kernel_launch.err_op; 4: kn_kargs.scratch; 5: batch_ok, compute_batch; 6: kn_epilogue's prologue (pre) */

typedef enum { KN_DEVICE_HOST = 0, KN_DEVICE_CUDA = 1 } kn_device;

/* A resolved operand: element (i0,..,in) is at data + sum(i_k * st[k]) elements. */
typedef struct kn_tview {
    void *data;
    kn_dtype dtype;
    int ndim;
    int64_t ne[KN_MAX_DIMS];   /* run-time extents                 */
    int64_t st[KN_MAX_DIMS];   /* strides in elements              */
    /* the buffer the storage lives in, where it has one of its own (weights,
     * leaves; NULL for a plan's arena or a backend's scratch): a constant
     * buffer may carry a backend's derived copy (core/core.h) */
    struct kn_buffer *buf;
} kn_tview;

/* A matmul's epilogue (docs/COMPILER.md, "Matmul epilogues"): the elementwise
 * consumers of a MATMUL node that the compiler folded into it. With
 * mm = a @ b, every element of dst [..., M, N] is
 *     dst = cast( res + act( mm + bias ) )
 * each step optional, each rounded to dt (the matmul's dtype) as the unfused
 * graph stores it, and the cast (to dst.dtype, when it differs from dt) last.
 * Arithmetic is the op table's (add, relu, gelu, gelu_tanh, silu), so a
 * backend is right when it matches its own unfused kernels. */
typedef struct kn_epilogue {
    kn_dtype dt;               /* the matmul's dtype: mm and each step before the cast round to it */
    bool bias;                 /* vbias is read: a vector [N] along dst's last dim */
    kn_op act;                 /* KN_OP_NONE, KN_OP_RELU, KN_OP_GELU (erf), KN_OP_GELU_TANH, KN_OP_SILU */
    bool res;                  /* vres is read: dst's shape (never dst's storage) */
    kn_tview vbias;            /* ndim 1, ne[0] = N, any stride; planning time: dtype only */
    kn_tview vres;             /* dst's extents, any strides; planning time: dtype only */
    /* The prologue (version >= 6; docs/COMPILER.md "Matmul prologues"): the
     * matmul's left operand A [..., M, K] is not in memory; the product
     * computes it from the rows of x (kn_exec.src[0], what the planner
     * passes as A) as it reads them, in f32:
     *   KN_OP_RMS_NORM  A = rms_norm(x) * w over the last dim, eps pre_eps
     *                   (w = vpre, [K]; pre_w false: no weight)
     *   KN_OP_SILU      A = silu(x) * u (u = vpre, x's extents: a gated unit)
     * KN_OP_NONE: A is src[0] as it is. The sum of squares may be taken in
     * another order than the unfused norm's kernel: results agree within
     * f32 rounding, not bit for bit. Offered to backends of version >= 6
     * only; a backend that does not know it refuses any epi with pre set. */
    kn_op pre;
    bool pre_w;
    float pre_eps;
    kn_tview vpre;             /* planning time: dtype only */
} kn_epilogue;

typedef struct kn_exec {
    const kn_tensor *node;     /* op, params, max shapes           */
    kn_tview dst;
    kn_tview src[KN_MAX_SRC];
    int nsrc;
    const int64_t *syms;       /* symbol values, index 1..KN_MAX_SYMS */
    /* MATMUL only, NULL otherwise: the epilogue to apply before dst is stored
     * (dst is then the last folded node's storage, dtype epi's final one).
     * Only a backend whose epilogue_ok accepted it at planning time gets one. */
    const kn_epilogue *epi;
    /* The by-product a node keeps for its gradient (kn__aux_bytes: sdpa's
     * log-sum-exp, f32 [B, Hq, Tq]) where the plan gave it room, else NULL:
     * aux is this node's (a forward may write it), src_aux[k] source k's
     * (a gradient may read it). */
    void *aux;
    void *src_aux[KN_MAX_SRC];
    /* Bit k: src[k] is fixed for the plan's run, the storage of a leaf that
     * no node of the plan writes (an effect's target is not fixed). A device
     * backend may read it before the work queued ahead of this node has
     * finished (CUDA: the GEMV loads its weights before the wait of a
     * programmatic dependent launch). Runs start with a stream-ordered copy
     * (syms_upload), so a previous run's writes are always complete. */
    unsigned fixed;
} kn_exec;

/* The one argument of every generated kernel, passed by value (CUDA) or by
 * address (C). A kernel's work is the items [0, n); symbolic extents are read
 * from syms (device memory on a device backend), so a launch recorded once
 * (a CUDA graph) stays right when the symbols change.
 *   C:    void NAME(const kn_kargs *a, int64_t begin, int64_t end)
 *         runs items [begin, end); kernel_run splits [0, n) over threads.
 *   CUDA: extern "C" __global__ void NAME(kn_kargs a)
 *         a grid-stride loop over items [0, n) (n computed in the kernel from
 *         syms: the launch's n only sizes the grid). */
#define KN_KERNEL_MAXBUF 24
typedef struct kn_kargs {
    char *buf[KN_KERNEL_MAXBUF];   /* operand and output base addresses (element 0 of each view) */
    const int64_t *syms;           /* symbol values, index 1..KN_MAX_SYMS */
    int64_t n;                     /* items this launch runs */
    void *err;                     /* kernels that check indices: the backend's kn_kerr slots, one per kn_op (set by kernel_run), else NULL */
    void *scratch;                 /* CUDA: KN_KSPLIT_BYTES of device memory, zero between launches (set by kernel_run): split reductions' partials and counters */
} kn_kargs;

/* A CUDA reduction with few outputs and long rows runs split (kn_kernel.split
 * slices per output, at most KN_KSPLIT_MAX slices in all): each block writes
 * its slice's partial to scratch[o * split + s] (8-byte slots), the last of an
 * output's blocks to finish (a counter per output at byte KN_KSPLIT_CNT,
 * reset to 0 by that block) combines them in slice order, so the result does
 * not depend on which block ran first. */
#define KN_KSPLIT_MAX 65536
#define KN_KSPLIT_CNT ((size_t)KN_KSPLIT_MAX * 8)
#define KN_KSPLIT_BYTES (KN_KSPLIT_CNT + (size_t)KN_KSPLIT_MAX * 4)

/* Where a kernel that checks indices records the first bad one (code 1:
 * index `value` out of range for dim `dim` of extent `size`), in the
 * backend's memory; the backend turns it into the op's error message. */
typedef struct kn_kerr {
    int code;
    int dim;
    double value;
    int64_t size;
} kn_kerr;

typedef struct kn_kernel_launch {
    kn_kargs a;                    /* a.syms: host values; a device backend passes its own copy */
    int64_t n_max;                 /* items at the symbols' maximum values (grid size for a replayed launch) */
    int64_t grain;                 /* C: fewest items worth a thread; CUDA: unused */
    int block;                     /* CUDA: threads per block (0: 256); C: unused */
    int waves;                     /* CUDA: grid capped at waves x SMs x (2048 / block) blocks (0: 8); C: unused */
    kn_op err_op;                  /* KN_OP_NONE, or an op whose indices the kernel checks: a.err must point at the slots */
} kn_kernel_launch;

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
    /* ---- (optional) kernels generated by the compiler (src/compile/, docs/COMPILER.md).
     * kernel_lang names the renderer whose source kernel_build takes ("c",
     * "cuda"); NULL: this backend runs no generated code and every node goes
     * through compute. kernel_build compiles (or takes from the disk cache)
     * the source and returns a handle for kernel_run, or NULL with the reason
     * in why (no C compiler, NVRTC error, ...): the runtime then falls back to
     * compute for those nodes, so a generated kernel is never required. */
    const char *kernel_lang;
    void *(*kernel_build)(kn_backend *be, const char *src, const char *name, char *why, size_t nwhy);
    kn_status (*kernel_run)(kn_backend *be, void *kernel, const kn_kernel_launch *l);
    void (*kernel_free)(kn_backend *be, void *kernel);
    /* (optional) the symbol values of the run about to start (index 1..n):
     * a device backend copies them where its kernels read them. Called once
     * per plan run, before the first kernel, stream-ordered. */
    kn_status (*syms_upload)(kn_backend *be, const int64_t *syms, int n);
    /* ---- (optional) capture of a whole plan run and its replay (a CUDA
     * graph; src/runtime/replay.c, docs/ARCHITECTURE.md section 3). All five
     * or none. A captured run is recorded, not executed: the runtime then
     * launches it. Symbols: a kernel may read a symbolic extent from the
     * backend's device copy of the symbol values instead of taking it as a
     * host argument; such a symbol may change between replays (the graph's
     * first step copies the values given to graph_launch to the device).
     *   dynamic_syms: bit s set when the launches compute() would queue for
     *     e while capturing read symbol s's value on the device, so they stay
     *     right for every value of s up to its maximum (the other extents
     *     as in e). 0 = every extent of e is baked into the capture.
     *   capture_begin: from here until capture_end, compute() records on the
     *     backend's queue instead of running; syms (index 1..n) are the run's
     *     values (the first recorded step uploads the launch's values).
     *   capture_end: ends the capture; keep = false (a compute failed)
     *     discards it. On success *graph is a launchable handle (NULL and an
     *     error otherwise); either way the queue works normally afterwards.
     *   graph_launch: queues one replay with these symbol values; no wait.
     *   graph_free: frees a graph (NULL: nothing). */
    uint64_t (*dynamic_syms)(kn_backend *be, const kn_exec *e);
    kn_status (*capture_begin)(kn_backend *be, const int64_t *syms, int n);
    kn_status (*capture_end)(kn_backend *be, bool keep, void **graph);
    kn_status (*graph_launch)(kn_backend *be, void *graph, const int64_t *syms, int n);
    void (*graph_free)(kn_backend *be, void *graph);
    /* ---- (optional, version >= 3) matmul epilogues (kn_epilogue above):
     * may compute() run MATMUL node mm with epilogue epi (its operand views
     * carry dtypes only; dst will have dtype out)? NULL: never, and the
     * compiler leaves the consumers as nodes of their own. */
    bool (*epilogue_ok)(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out);
    /* ---- (optional, version >= 5) several nodes in one launch (the
     * multi-tensor optimizer step: a model's hundreds of parameter updates,
     * most of them small, as a few kernels). batch_ok: may the node of e
     * join a batch? compute_batch: run es[0 .. n), 2 <= n <= KN_BATCH_MAX,
     * nodes of one op that batch_ok accepted, none of which reads or writes
     * memory another one writes (the runtime checks), with the same result
     * as n compute() calls; KN_ERR_UNSUPPORTED (no message) hands them back
     * to compute() one at a time. Both or neither. */
    bool (*batch_ok)(kn_backend *be, const kn_exec *e);
    kn_status (*compute_batch)(kn_backend *be, const kn_exec *es, int n);
};
#define KN_BATCH_MAX 64

/* Helpers shared by backends (src/core/tview.c) */
int64_t kn_tview_numel(const kn_tview *v);
bool kn_tview_is_contiguous(const kn_tview *v);
/* v made a contiguous (row-major) tensor of its extents at data, of dtype
 * dt, in no buffer: a backend's scratch copy of an operand or result */
void kn_tview_dense(kn_tview *v, void *data, kn_dtype dt);
/* Align v to an output of ndim dims (right-aligned; size-1 dims get stride 0). */
kn_tview kn_tview_broadcast(const kn_tview *v, int ndim, const int64_t *ne);
double kn_load(kn_dtype t, const void *base, int64_t i);   /* element i as double */
void kn_store(kn_dtype t, void *base, int64_t i, double v);/* rounds (RNE) / saturates ints */

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
