/* cuda_backend.cu: the CUDA backend's table, memory, transfers and the
 * dispatch switch (one node per compute call, operands as kn_tview).
 *
 * Memory: every buffer and scratch block comes from one kn_cuda_pool.
 * Work: every kernel, memset and copy goes to one backend-owned
 * non-blocking stream (kn_cu_stream()), so they run in issue order and
 * nothing waits on the legacy default stream; cu_sync is a stream sync.
 * Pool blocks released right after the launches that use them are safe to
 * hand out again: their next user is queued behind them on the same stream.
 * Transfers: host memory is never given to cudaMemcpy directly (pageable
 * copies are slow and synchronous). copy_in/copy_out go through two pinned
 * staging buffers of KN_STAGE_BYTES, chunk by chunk, double-buffered with
 * events: copy_in returns once the last chunk is queued (the caller's
 * memory is free again), copy_out overlaps the host-side memcpy of one
 * chunk with the device copy of the next.
 * Kernels live in cuda_ops_*.cu, one file per op family.
 */
#include "backends/cuda/cuda_ops.cuh"
#include "kiln_cuda.h"
#include "backends/cuda/cuda_jit.h"    // defines: the kernel_* and syms_upload entries (generated kernels)
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

static kn_cuda_pool *g_pool;
static kn_cu_err *g_err;
static cudaStream_t g_stream;

cudaStream_t kn_cu_stream(void) { return g_stream; }

kn_status kn_cu_pool_take(size_t bytes, void **p) {
    *p = NULL;
    if (!g_pool) return kn_set_error(KN_ERR_STATE, "cuda backend: not initialised; call kn_backend_cuda() first");
    return kn_cuda_pool_alloc(g_pool, bytes ? bytes : 8, p);
}
void kn_cu_pool_give(void *p) {
    if (p && g_pool) kn_cuda_pool_release(g_pool, p);
}
/* while a graph is captured, its scratch is its own (cuda_graph.cu) */
kn_status kn_cu_tmp(size_t bytes, void **p) {
    if (kn_cu_capture_syms()) { *p = NULL; return kn_cu_graph_tmp(bytes ? bytes : 8, p); }
    return kn_cu_pool_take(bytes, p);
}
void kn_cu_tmp_free(void *p) {
    if (p && kn_cu_capture_syms() && kn_cu_graph_tmp_free(p)) return;
    kn_cu_pool_give(p);
}

/* ---- pinned staging for host <-> device copies ---- */
#define KN_STAGE_BYTES ((size_t)8 << 20)
static struct {
    pthread_mutex_t mu;
    char *buf[2];                /* pinned host memory, KN_STAGE_BYTES each          */
    cudaEvent_t ev[2];           /* recorded after the copy that uses buf[i]         */
    bool pending[2];             /* ev[i] recorded and not yet waited for            */
    size_t fill[2];              /* small copies: bytes of buf[i] used since its last wait */
    int cur;                     /* small copies: the buffer being filled            */
} g_stage = {PTHREAD_MUTEX_INITIALIZER};

static kn_status stage_wait(int i) {
    if (g_stage.pending[i]) {
        g_stage.pending[i] = false;
        KN_CUDA_TRY(cudaEventSynchronize(g_stage.ev[i]));
    }
    return KN_OK;
}
/* A small upload (a decode step's token, positions, rows) packs into the
 * current staging buffer after the ones before it, with no wait: a buffer
 * is waited for only when the packing moves on to it again, long after its
 * copies ran. */
#define KN_STAGE_SMALL ((size_t)64 << 10)
static kn_status h2d_small_locked(char *dst, const char *host, size_t n) {
    int i = g_stage.cur;
    if (g_stage.fill[i] + n > KN_STAGE_BYTES) {
        i = g_stage.cur ^= 1;
        kn_status st = stage_wait(i);
        if (st) return st;
        g_stage.fill[i] = 0;
    }
    char *b = g_stage.buf[i] + g_stage.fill[i];
    memcpy(b, host, n);
    KN_CUDA_TRY(cudaMemcpyAsync(dst, b, n, cudaMemcpyHostToDevice, g_stream));
    KN_CUDA_TRY(cudaEventRecord(g_stage.ev[i], g_stream));
    g_stage.pending[i] = true;
    g_stage.fill[i] += (n + 255) & ~(size_t)255;
    return KN_OK;
}
static kn_status h2d_locked(char *dst, const char *host, size_t n) {
    if (n <= KN_STAGE_SMALL) return h2d_small_locked(dst, host, n);
    g_stage.fill[0] = g_stage.fill[1] = KN_STAGE_BYTES;   /* the chunks below start at offset 0: small copies move on first */
    int i = 0;
    for (size_t off = 0; off < n; off += KN_STAGE_BYTES, i ^= 1) {
        size_t c = n - off < KN_STAGE_BYTES ? n - off : KN_STAGE_BYTES;
        kn_status st = stage_wait(i);          /* the chunk before last used this buffer */
        if (st) return st;
        memcpy(g_stage.buf[i], host + off, c);
        KN_CUDA_TRY(cudaMemcpyAsync(dst + off, g_stage.buf[i], c, cudaMemcpyHostToDevice, g_stream));
        KN_CUDA_TRY(cudaEventRecord(g_stage.ev[i], g_stream));
        g_stage.pending[i] = true;
    }
    return KN_OK;
}
static kn_status d2h_locked(char *host, const char *src, size_t n) {
    kn_status st;
    if ((st = stage_wait(0)) || (st = stage_wait(1))) return st;
    g_stage.fill[0] = g_stage.fill[1] = KN_STAGE_BYTES;
    size_t nch = (n + KN_STAGE_BYTES - 1) / KN_STAGE_BYTES;
    for (size_t k = 0; k <= nch; k++) {
        if (k < nch) {                         /* queue chunk k ... */
            size_t off = k * KN_STAGE_BYTES, c = n - off < KN_STAGE_BYTES ? n - off : KN_STAGE_BYTES;
            int i = (int)(k & 1);
            KN_CUDA_TRY(cudaMemcpyAsync(g_stage.buf[i], src + off, c, cudaMemcpyDeviceToHost, g_stream));
            KN_CUDA_TRY(cudaEventRecord(g_stage.ev[i], g_stream));
            g_stage.pending[i] = true;
        }
        if (k > 0) {                           /* ... while chunk k-1 is unpacked */
            size_t off = (k - 1) * KN_STAGE_BYTES, c = n - off < KN_STAGE_BYTES ? n - off : KN_STAGE_BYTES;
            int i = (int)((k - 1) & 1);
            if ((st = stage_wait(i))) return st;
            memcpy(host + off, g_stage.buf[i], c);
        }
    }
    return KN_OK;
}
/* A capture would record the device side of a staged copy but not the
 * host side: refuse, so the capture fails and the run goes plainly. */
static kn_status no_capture(const char *what) {
    return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: %s while a graph is captured", what);
}
kn_status kn_cu_h2d(void *dst, const void *host, size_t n) {
    if (!n) return KN_OK;
    if (kn_cu_capture_syms()) return no_capture("host-to-device copy");
    pthread_mutex_lock(&g_stage.mu);
    kn_status st = h2d_locked((char *)dst, (const char *)host, n);
    pthread_mutex_unlock(&g_stage.mu);
    return st;
}
kn_status kn_cu_d2h(void *host, const void *src, size_t n) {
    if (!n) return KN_OK;
    if (kn_cu_capture_syms()) return no_capture("device-to-host copy");
    pthread_mutex_lock(&g_stage.mu);
    kn_status st = d2h_locked((char *)host, (const char *)src, n);
    pthread_mutex_unlock(&g_stage.mu);
    return st;
}

/* One error slot per op kind, so a problem found on the device names its
 * op without the host waiting after every index node (a decode step has
 * one index_copy per layer and cache: one sync each cost ~30 % of decode
 * speed). Slots are read at the next synchronize, which ends every plan run. */
static bool g_err_pending;
kn_cu_err *kn_cu_err_dev(kn_op op) {
    g_err_pending = true;
    return g_err + ((unsigned)op < KN_OP_COUNT ? (int)op : 0);
}
void kn_cu_err_arm(void) { g_err_pending = true; }

kn_status kn_cu_err_collect(void) {
    if (!g_err_pending) return KN_OK;
    g_err_pending = false;
    static kn_cu_err h[KN_OP_COUNT];
    kn_status st = kn_cu_d2h(h, g_err, sizeof h);
    if (st) return st;
    for (int op = 0; op < KN_OP_COUNT; op++) {
        if (!h[op].code) continue;
        KN_CUDA_TRY(cudaMemsetAsync(g_err, 0, sizeof h, g_stream));
        const char *name = kn_op_name((kn_op)op);
        if (h[op].code == 2) return kn_set_error(KN_ERR_INVALID, "%s: integer division by zero", name);
        if (h[op].code == 3) return kn__target_error(name, h[op].value, h[op].size, h[op].dim);   /* dim: the ignore_index */
        return kn__index_error(name, h[op].value, h[op].dim, h[op].size);
    }
    return KN_OK;
}

/* ---- row-major <-> view helpers ---- */
__global__ void k_store_all(kn_dview y, const double *acc, int64_t n) {
    KN_GRID_LOOP(i, n) kn_dput(y, kn_doff(y, i), acc[i]);
}
__global__ void k_load_all(kn_dview x, double *acc, int64_t n) {
    KN_GRID_LOOP(i, n) acc[i] = kn_dget(x, kn_doff(x, i));
}
kn_status kn_cu_store_all(const kn_tview *y, const double *acc, int64_t n) {
    if (n <= 0) return KN_OK;
    k_store_all<<<kn_blocks(n), KN_THREADS, 0, g_stream>>>(kn_dv(y), acc, n);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
kn_status kn_cu_load_all(const kn_tview *x, double *acc, int64_t n) {
    if (n <= 0) return KN_OK;
    k_load_all<<<kn_blocks(n), KN_THREADS, 0, g_stream>>>(kn_dv(x), acc, n);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* ---- the table ---- */
/* The GPU this process uses (cu_init) is per host thread in CUDA: a thread
 * that enters the backend for the first time selects it. */
static int g_device;
static __thread bool t_bound;
extern "C" void kn_cu_bind(void) {
    if (t_bound) return;
    t_bound = true;
    if (g_device) cudaSetDevice(g_device);
}

static void *cu_alloc(kn_backend *be, size_t size) {
    kn_cu_bind();
    void *p = NULL;
    if (kn_cuda_pool_alloc(g_pool, size ? size : 1, &p) != KN_OK) return NULL;
    return p;
}
static void cu_free(kn_backend *be, void *ptr) {
    if (ptr) kn_cuda_pool_release(g_pool, ptr);
}
static kn_status cu_copy_in(kn_backend *be, void *dst, const void *host, size_t n) { kn_cu_bind(); return kn_cu_h2d(dst, host, n); }
static kn_status cu_copy_out(kn_backend *be, void *host, const void *src, size_t n) {
    kn_status st = kn_cu_comm_join();
    return st ? st : kn_cu_d2h(host, src, n);
}
static kn_status cu_sync(kn_backend *be) {
    kn_status st = kn_cu_comm_sync();          /* joins pending collectives; a hung one times out (cuda_dist.cu) */
    return st ? st : kn_cu_err_collect();
}

/* A quantized operand the GPU cannot take: anything but a matmul whose right
 * (or mul_mat_id's) operand (a weight kept as stored, cuda_ops_quant.cu) is of a type the GPU
 * decodes and whose left operand and output are not quantized. */
static bool has_quant(const kn_exec *e) {
    if ((e->node->op == KN_OP_MATMUL || e->node->op == KN_OP_MUL_MAT_ID) && kn_cuda_quant_supported((int)e->src[1].dtype) &&
        !kn_dtype_get(e->dst.dtype)->is_quant && !kn_dtype_get(e->src[0].dtype)->is_quant)
        return false;
    if (kn_dtype_get(e->dst.dtype)->is_quant) return true;
    for (int k = 0; k < e->nsrc; k++)
        if (e->node->src[k] && kn_dtype_get(e->src[k].dtype)->is_quant) return true;
    return false;
}

/* KN_CUDA_TRACE=1 (a development aid): every node runs alone (the stream
 * is drained first) between two events, and one line on stderr gives its
 * op, device time (event to event, so the host's launch gaps inside a node
 * of several launches count) and operand dtypes, extents and strides, to
 * find which node of an op kind is slow. */
static void trace_view(const kn_tview *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "%s[", kn_dtype_name(v->dtype));
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->ne[i]);
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "]/");
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->st[i]);
}
static void trace_node(const kn_exec *e, double us) {
    char d[160], s[4][160];
    trace_view(&e->dst, d, sizeof d);
    int ns = e->nsrc < 4 ? e->nsrc : 4;
    for (int k = 0; k < 4; k++) { s[k][0] = 0; if (k < ns && e->node->src[k]) trace_view(&e->src[k], s[k], sizeof s[k]); }
    fprintf(stderr, "cuda-trace %-14s %9.1f us  %s <- %s %s %s %s\n", kn_op_name(e->node->op), us, d, s[0], s[1], s[2], s[3]);
}

/* The trace's two events, shared by the nodes here and the generated
 * kernels (cuda_jit.cu): on when KN_CUDA_TRACE is set and they exist */
static cudaEvent_t g_tr0, g_tr1;
bool kn_cu_trace_on(void) {
    static int on = -1;
    if (on < 0) {
        on = kn_env_get()->cuda_trace;
        if (on && (cudaEventCreate(&g_tr0) != cudaSuccess || cudaEventCreate(&g_tr1) != cudaSuccess)) { cudaGetLastError(); on = 0; }
    }
    return on != 0;
}
kn_status kn_cu_trace_begin(void) {
    KN_CUDA_TRY(cudaStreamSynchronize(g_stream));
    KN_CUDA_TRY(cudaEventRecord(g_tr0, g_stream));
    return KN_OK;
}
kn_status kn_cu_trace_end(double *us) {
    float ms = 0;
    KN_CUDA_TRY(cudaEventRecord(g_tr1, g_stream));
    KN_CUDA_TRY(cudaEventSynchronize(g_tr1));
    KN_CUDA_TRY(cudaEventElapsedTime(&ms, g_tr0, g_tr1));
    *us = 1e3 * (double)ms;
    return KN_OK;
}

static kn_status cu_compute_node(kn_backend *be, const kn_exec *e);
static kn_status cu_compute(kn_backend *be, const kn_exec *e) {
    kn_cu_bind();
    if (!kn_cu_trace_on()) return cu_compute_node(be, e);
    kn_op_kind kind = kn_op_get(e->node->op)->kind;
    if (kind == KN_KIND_VIEW || kind == KN_KIND_LEAF) return KN_OK;
    kn_status st = kn_cu_trace_begin();
    if (st) return st;
    st = cu_compute_node(be, e);
    double us = 0;
    kn_status tst = kn_cu_trace_end(&us);
    if (tst) return tst;
    if (st == KN_OK) trace_node(e, us);
    return st;
}

static const kn_families g_families = {
    "cuda", kn_cu_create, kn_cu_unary, kn_cu_binary, kn_cu_reduce, kn_cu_scan,
    kn_cu_matmul, kn_cu_copy, kn_cu_optim, kn_cu_index, kn_cu_nn, kn_cu_comm,
};

/* KN_CUDA_SYNC (debugging): wait after each node, so that a fault is
 * reported at the op (what) that caused it */
static kn_status cu_sync_debug(const char *what) {
    if (!kn_env_get()->cuda_sync) return KN_OK;
    cudaError_t ce = cudaStreamSynchronize(g_stream);
    if (ce != cudaSuccess) return kn_set_error(KN_ERR_BACKEND, "cuda backend: %s failed: %s", what, cudaGetErrorString(ce));
    return KN_OK;
}

static kn_status cu_compute_node(kn_backend *be, const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_op_kind kind = kn_op_get(t->op)->kind;
    if (kind == KN_KIND_VIEW || kind == KN_KIND_LEAF) return KN_OK;
    if (has_quant(e)) {
        const char *q = kn_dtype_name(e->dst.dtype);
        for (int k = 0; k < e->nsrc; k++)
            if (e->node->src[k] && kn_dtype_get(e->src[k].dtype)->is_quant) q = kn_dtype_name(e->src[k].dtype);
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: %s with a quantized (%s) operand is not supported on the GPU "
                            "(it takes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K weights as a matmul's right operand); "
                            "dequantize on the host (cast to f32/f16 on the cpu backend) before moving the tensor", kn_op_name(t->op), q);
    }
    if (kn_tview_numel(&e->dst) == 0 && t->op != KN_OP_INDEX_COPY && t->op != KN_OP_ASSIGN) return KN_OK;
    kn_status st = kn_cu_comm_before(e);       /* a pending collective's output (cuda_dist.cu) */
    if (st == KN_OK) st = kn__dispatch(&g_families, e);
    return st == KN_OK ? cu_sync_debug(kn_op_name(t->op)) : st;
}

/* the multi-tensor optimizer step (cuda_ops_optim.cu); KN_CUDA_TRACE times
 * nodes one by one, so it leaves them to cu_compute */
static kn_status cu_compute_batch(kn_backend *be, const kn_exec *es, int n) {
    kn_cu_bind();
    if (kn_cu_trace_on()) return KN_ERR_UNSUPPORTED;
    kn_status st = kn_cu_compute_batch(be, es, n);
    if (st != KN_OK) return st;
    char what[64];
    snprintf(what, sizeof what, "%d batched %s nodes", n, kn_op_name(es[0].node->op));
    return cu_sync_debug(what);
}

static kn_backend g_cuda = {
    KN_BACKEND_VERSION, "cuda", KN_DEVICE_CUDA, cu_alloc, cu_free, cu_copy_in, cu_copy_out,
    cu_compute, cu_sync, NULL, NULL,
    "cuda", kn__cuda_kernel_build, kn__cuda_kernel_run, kn__cuda_kernel_free, kn__cuda_syms_upload,
    kn_cu_dynamic_syms, kn_cu_capture_begin, kn_cu_capture_end, kn_cu_graph_launch, kn_cu_graph_free,  /* cuda_graph.cu */
    kn_cu_epilogue_ok,                                                                                  /* cuda_ops_epilogue.cu */
    kn_cu_batch_ok, cu_compute_batch,                                                                   /* cuda_ops_optim.cu */
};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static kn_status g_init_st;
static char g_init_msg[256];

static void cu_init(void) {
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: no usable GPU (%s); use kn_backend_cpu()",
                 ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        cudaGetLastError();
        g_init_st = KN_ERR_UNSUPPORTED;
        return;
    }
    /* several ranks on one machine (kiln_dist.h): rank r takes GPU LOCAL_RANK
     * (KN_CUDA_DEVICE wins), so that NCCL sees each rank's own device */
    const char *dev = kn_env_get()->cuda_device;
    if (!dev || !*dev) dev = getenv("LOCAL_RANK");
    if (dev && *dev) {
        int want = atoi(dev);
        if (want < 0 || want >= n) {
            snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: GPU %d was asked for (KN_CUDA_DEVICE or LOCAL_RANK) but "
                     "this machine has %d; start at most %d ranks a machine", want, n, n);
            g_init_st = KN_ERR_UNSUPPORTED;
            return;
        }
        if ((ce = cudaSetDevice(want)) != cudaSuccess) {
            snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: cannot use GPU %d: %s", want, cudaGetErrorString(ce));
            g_init_st = KN_ERR_BACKEND;
            return;
        }
        g_device = want;
    }
    /* probe the GEMM paths now, while no work is queued (the wgmma probe
     * runs a kernel on the legacy stream) */
    kn_cuda_gemm_bf16_uses_wgmma();
    kn_cuda_gemm_tc_available();
    if ((ce = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: cannot create a stream: %s", cudaGetErrorString(ce));
        g_init_st = KN_ERR_BACKEND;
        return;
    }
    for (int i = 0; i < 2; i++) {
        if ((ce = cudaHostAlloc((void **)&g_stage.buf[i], KN_STAGE_BYTES, cudaHostAllocDefault)) != cudaSuccess ||
            (ce = cudaEventCreateWithFlags(&g_stage.ev[i], cudaEventDisableTiming)) != cudaSuccess) {
            cudaGetLastError();
            snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: cannot set up pinned staging buffers (%zu bytes): %s",
                     KN_STAGE_BYTES, cudaGetErrorString(ce));
            g_init_st = KN_ERR_BACKEND;
            return;
        }
    }
    size_t limit = (size_t)kn_env_get()->cuda_pool_mb << 20;
    if (kn_cuda_pool_new(&g_pool, limit) != KN_OK) {
        snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: %s", kn_last_error());
        g_init_st = KN_ERR_BACKEND;
        return;
    }
    void *p = NULL;
    if (kn_cuda_pool_alloc(g_pool, sizeof(kn_cu_err) * KN_OP_COUNT, &p) != KN_OK ||
        cudaMemsetAsync(p, 0, sizeof(kn_cu_err) * KN_OP_COUNT, g_stream) != cudaSuccess ||
        cudaStreamSynchronize(g_stream) != cudaSuccess) {
        snprintf(g_init_msg, sizeof g_init_msg, "kn_backend_cuda: cannot set up device memory: %s", kn_last_error());
        g_init_st = KN_ERR_BACKEND;
        return;
    }
    g_err = (kn_cu_err *)p;
    g_init_st = KN_OK;
}

extern "C" kn_backend *kn_backend_cuda(void) {
    pthread_once(&g_once, cu_init);
    if (g_init_st != KN_OK) { kn_set_error(g_init_st, "%s", g_init_msg); return NULL; }
    return &g_cuda;
}

extern "C" void kn_cuda_backend_stats(size_t *in_use, size_t *peak, size_t *cached) {
    kn_cuda_pool_stats s;
    memset(&s, 0, sizeof s);
    if (g_pool) kn_cuda_pool_get_stats(g_pool, &s);
    if (in_use) *in_use = s.current_bytes;
    if (peak) *peak = s.peak_bytes;
    if (cached) *cached = s.cached_bytes;
}

extern "C" kn_status kn_to_backend(kn_ctx *dst_ctx, kn_tensor *t, kn_tensor **out) {
    if (out) *out = NULL;
    if (!dst_ctx || !t || !out) return kn_set_error(KN_ERR_INVALID, "kn_to_backend: NULL argument (an earlier op failed? %s)", kn_last_error());
    size_t bytes = kn_dtype_nbytes(t->dtype, kn_numel(t));
    void *host = malloc(bytes ? bytes : 1);
    if (!host) return kn_set_error(KN_ERR_NOMEM, "kn_to_backend: out of host memory staging %zu bytes", bytes);
    kn_tensor *src = t;
    if (kn_dtype_get(t->dtype)->is_quant && !kn_is_contiguous(t))
        src = kn_contiguous(t->ctx, t);
    kn_status st = kn_tensor_read(src, host, t->dtype);
    if (st) { free(host); return st; }
    kn_tensor *y = kn_from_data(dst_ctx, t->dtype, t->ndim, t->shape, host);
    free(host);
    if (!y) return kn_ctx_status(dst_ctx) ? kn_ctx_status(dst_ctx) : KN_ERR_NOMEM;
    *out = y;
    return KN_OK;
}
