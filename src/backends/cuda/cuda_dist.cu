/* cuda_dist.cu: the collectives (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER,
 * BROADCAST) on the GPU through NCCL, and the ordering that lets them run
 * beside the compute stream.
 *
 * NCCL is loaded with dlopen when the first collective of a world larger
 * than one runs (KN_NCCL_LIB, else libnccl.so.2 from the loader's path, the
 * CUDA toolkit's lib directory, or the nvidia-nccl wheel), so building kiln
 * needs no NCCL and a single GPU never touches it. The few entry points used
 * are declared here (NCCL's C ABI, stable since 2.x; ncclAvg needs 2.10).
 * Rank 0 makes the unique id and sends it over the communicator's control
 * channel (core/dist.c); every rank then joins with ncclCommInitRank.
 *
 * Overlap: a collective waits (an event) for the compute stream's work so
 * far, runs on the communicator's own stream, and records a done event. In
 * place (the planner gave the output the input's memory), the compute stream
 * goes on at once: the output's byte range is kept in a pending list, and
 * every later node (compute) or generated kernel (kernel_run) whose operands
 * touch a pending range first makes the compute stream wait for that done
 * event. Everything still pending is joined before a synchronize, a copy to
 * the host and the end of a graph capture (the capture then holds the fork
 * and the join). Out of place, the compute stream waits at once (the input's
 * memory may be reused by the next node).
 *
 * Hangs: with a communicator on the device, synchronize polls the stream
 * and NCCL's asynchronous error; past the communicator's timeout it aborts
 * the NCCL communicator and returns an error naming the wait, instead of
 * blocking forever on a rank that died.
 */
#include "backends/cuda/cuda_ops.cuh"
extern "C" {
#include "core/dist.h"
}
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the NCCL entry points ---------------------------------------------------------- */
typedef struct { char internal[128]; } nccl_id;
typedef void *nccl_comm;
typedef int nccl_res;                       /* 0: success; 7: in progress */
enum { NC_I32 = 2, NC_I64 = 4, NC_F16 = 6, NC_F32 = 7, NC_F64 = 8, NC_BF16 = 9 };
enum { NC_SUM = 0, NC_MAX = 2, NC_MIN = 3, NC_AVG = 4 };

static struct {
    nccl_res (*get_unique_id)(nccl_id *);
    nccl_res (*comm_init_rank)(nccl_comm *, int, nccl_id, int);
    nccl_res (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm, cudaStream_t);
    nccl_res (*all_gather)(const void *, void *, size_t, int, nccl_comm, cudaStream_t);
    nccl_res (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm, cudaStream_t);
    nccl_res (*broadcast)(const void *, void *, size_t, int, int, nccl_comm, cudaStream_t);
    nccl_res (*comm_abort)(nccl_comm);
    nccl_res (*comm_destroy)(nccl_comm);
    nccl_res (*async_error)(nccl_comm, nccl_res *);
    const char *(*error_string)(nccl_res);
    nccl_res (*get_version)(int *);
} nc;
static pthread_once_t g_nc_once = PTHREAD_ONCE_INIT;
static char g_nc_err[512];

static void *nc_open(void) {
    const char *env = kn_env_get()->nccl_lib;
    if (env && *env) return dlopen(env, RTLD_NOW | RTLD_GLOBAL);
    const char *tries[] = {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                           "/usr/lib/x86_64-linux-gnu/libnccl.so.2"};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        void *h = dlopen(tries[i], RTLD_NOW | RTLD_GLOBAL);
        if (h) return h;
    }
    /* the nvidia-nccl wheel next to PyTorch: python3 -c "import nvidia.nccl" tells where */
    FILE *p = popen("python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", "
                    "\"libnccl.so.2\"))' 2>/dev/null", "r");
    if (!p) return NULL;
    char path[1024] = "";
    if (!fgets(path, sizeof path, p)) path[0] = 0;
    pclose(p);
    path[strcspn(path, "\n")] = 0;
    return path[0] ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
}

static void nc_load(void) {
    void *h = nc_open();
    if (!h) {
        snprintf(g_nc_err, sizeof g_nc_err, "cuda backend: NCCL (libnccl.so.2) was not found; install it (Debian/NVIDIA's libnccl2, "
                 "or pip install nvidia-nccl-cu12) or set KN_NCCL_LIB to the library's path");
        return;
    }
#define NC_SYM(field, name)                                                                                  \
    if (!(*(void **)&nc.field = dlsym(h, name))) {                                                          \
        snprintf(g_nc_err, sizeof g_nc_err, "cuda backend: the NCCL library lacks %s (too old? NCCL 2.10 or newer)", name); \
        return;                                                                                              \
    }
    NC_SYM(get_unique_id, "ncclGetUniqueId");
    NC_SYM(comm_init_rank, "ncclCommInitRank");
    NC_SYM(all_reduce, "ncclAllReduce");
    NC_SYM(all_gather, "ncclAllGather");
    NC_SYM(reduce_scatter, "ncclReduceScatter");
    NC_SYM(broadcast, "ncclBroadcast");
    NC_SYM(comm_abort, "ncclCommAbort");
    NC_SYM(comm_destroy, "ncclCommDestroy");
    NC_SYM(async_error, "ncclCommGetAsyncError");
    NC_SYM(error_string, "ncclGetErrorString");
    NC_SYM(get_version, "ncclGetVersion");
#undef NC_SYM
    int v = 0;
    nc.get_version(&v);
    if (v < 21000) snprintf(g_nc_err, sizeof g_nc_err, "cuda backend: NCCL %d is too old (2.10 or newer is needed)", v);
}

/* ---- one communicator's device state ---------------------------------------------- */
typedef struct cu_comm {
    nccl_comm comm;
    cudaStream_t stream;
    cudaEvent_t fork;           /* compute -> comm: recorded, then waited at once, so one serves all */
    cudaEvent_t done_now;       /* comm -> compute for a collective waited at once */
    int world, rank;
    double timeout;
    bool broken;
} cu_comm;

static cu_comm *g_active;       /* the communicator whose work may be pending (one at a time) */

static void comm_free(void *p) {
    cu_comm *c = (cu_comm *)p;
    if (!c) return;
    if (c->comm) (c->broken ? nc.comm_abort : nc.comm_destroy)(c->comm);
    if (c->fork) cudaEventDestroy(c->fork);
    if (c->done_now) cudaEventDestroy(c->done_now);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (g_active == c) g_active = NULL;
    free(c);
}

static kn_status nc_fail(const char *what, nccl_res r) {
    return kn_set_error(KN_ERR_BACKEND, "cuda backend: NCCL %s failed: %s", what, nc.error_string ? nc.error_string(r) : "?");
}

static kn_status comm_get(kn_dist *d, cu_comm **out) {
    cu_comm *c = (cu_comm *)kn__dist_dev(d);
    if (c) { *out = c; return c->broken ? kn_set_error(KN_ERR_BACKEND, "cuda backend: the NCCL communicator was aborted after an "
                                                       "earlier failure; restart the job") : KN_OK; }
    pthread_once(&g_nc_once, nc_load);
    if (g_nc_err[0]) return kn_set_error(KN_ERR_UNSUPPORTED, "%s", g_nc_err);
    nccl_id id;
    memset(&id, 0, sizeof id);
    nccl_res r;
    if (kn_dist_rank(d) == 0 && (r = nc.get_unique_id(&id))) return nc_fail("ncclGetUniqueId", r);
    kn_status st = kn_dist_broadcast_host(d, &id, sizeof id, 0);
    if (st) return st;
    c = (cu_comm *)calloc(1, sizeof *c);
    if (!c) return kn_set_error(KN_ERR_NOMEM, "cuda backend: out of host memory");
    c->world = kn_dist_world(d);
    c->rank = kn_dist_rank(d);
    c->timeout = kn__dist_timeout(d);
    cudaError_t ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&c->done_now, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        comm_free(c);
        return kn_set_error(KN_ERR_BACKEND, "cuda backend: cannot set up the collective stream: %s", cudaGetErrorString(ce));
    }
    if ((r = nc.comm_init_rank(&c->comm, c->world, id, c->rank))) {
        c->comm = NULL;
        comm_free(c);
        return nc_fail("ncclCommInitRank (all ranks must reach their first collective; see the other ranks' output)", r);
    }
    kn__dist_set_dev(d, c, comm_free);
    *out = c;
    return KN_OK;
}

/* ---- pending in-place collectives ---------------------------------------------------- */
/* Each pending collective holds a done event until the compute stream has
 * waited for it; then the event goes back to the free list. With none free
 * (N_PEND collectives in flight: a large model's many buckets), everything
 * pending is joined first. */
enum { N_PEND = 128 };
static struct pend { const char *lo, *hi; cudaEvent_t done; } g_pend[N_PEND];
static int g_npend;
static cudaEvent_t g_free[N_PEND];
static int g_nfree = -1;           /* -1: the events are not made yet */

static kn_status pend_events(void) {
    if (g_nfree >= 0) return KN_OK;
    for (int i = 0; i < N_PEND; i++) KN_CUDA_TRY(cudaEventCreateWithFlags(&g_free[i], cudaEventDisableTiming));
    g_nfree = N_PEND;
    return KN_OK;
}

static void view_span(const kn_tview *v, const char **lo, const char **hi) {
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->ne[i] <= 0) { *lo = *hi = (const char *)v->data; return; }
        if (v->st[i] >= 0) mx += (v->ne[i] - 1) * v->st[i];
        else mn += (v->ne[i] - 1) * v->st[i];
    }
    const kn_dtype_info *di = kn_dtype_get(v->dtype);
    *lo = (const char *)v->data + mn / di->block_size * (int64_t)di->type_size;
    *hi = (const char *)v->data + (mx / di->block_size + 1) * (int64_t)di->type_size;
}

/* The compute stream waits for every pending collective whose output meets [lo, hi). */
static kn_status wait_range(const char *lo, const char *hi) {
    for (int i = 0; i < g_npend;) {
        if (g_pend[i].lo < hi && lo < g_pend[i].hi) {
            KN_CUDA_TRY(cudaStreamWaitEvent(kn_cu_stream(), g_pend[i].done, 0));
            g_free[g_nfree++] = g_pend[i].done;
            g_pend[i] = g_pend[--g_npend];
        } else {
            i++;
        }
    }
    return KN_OK;
}

extern "C" kn_status kn_cu_comm_before(const kn_exec *e) {
    if (!g_npend) return KN_OK;
    const char *lo, *hi;
    view_span(&e->dst, &lo, &hi);
    kn_status st = wait_range(lo, hi);
    for (int k = 0; k < e->nsrc && !st; k++) {
        if (!e->node->src[k] || !e->src[k].data) continue;
        view_span(&e->src[k], &lo, &hi);
        st = wait_range(lo, hi);
    }
    return st;
}

extern "C" kn_status kn_cu_comm_before_kernel(char *const *bufs, int n) {
    for (int k = 0; k < n && g_npend; k++)
        if (bufs[k]) {
            kn_status st = wait_range(bufs[k], bufs[k] + 1);
            if (st) return st;
        }
    return KN_OK;
}

extern "C" kn_status kn_cu_comm_join(void) {
    for (int i = 0; i < g_npend; i++) {
        KN_CUDA_TRY(cudaStreamWaitEvent(kn_cu_stream(), g_pend[i].done, 0));
        g_free[g_nfree++] = g_pend[i].done;
    }
    g_npend = 0;
    return KN_OK;
}

/* Waits for the compute stream; with a device communicator, polls it so that
 * a collective that never completes (a rank died) ends in an error. */
extern "C" kn_status kn_cu_comm_sync(void) {
    kn_status st = kn_cu_comm_join();
    if (st) return st;
    cu_comm *c = g_active;
    if (!c) { KN_CUDA_TRY(cudaStreamSynchronize(kn_cu_stream())); return KN_OK; }
    struct timespec t0, now, nap = {0, 20 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long spins = 0;; spins++) {
        cudaError_t ce = cudaStreamQuery(kn_cu_stream());
        if (ce == cudaSuccess) return KN_OK;
        if (ce != cudaErrorNotReady) return kn_set_error(KN_ERR_BACKEND, "cuda backend: %s", cudaGetErrorString(ce));
        if (spins % 1024 == 1023) {
            nccl_res ae = 0;
            if (nc.async_error(c->comm, &ae) == 0 && ae != 0 && ae != 7) {
                c->broken = true;
                nc.comm_abort(c->comm);
                c->comm = NULL;
                return kn_set_error(KN_ERR_BACKEND, "cuda backend: rank %d: NCCL reported %s; another rank probably failed "
                                    "(see its output)", c->rank, nc.error_string(ae));
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
            if (waited > c->timeout) {
                c->broken = true;
                nc.comm_abort(c->comm);
                c->comm = NULL;
                return kn_set_error(KN_ERR_BACKEND, "cuda backend: rank %d waited %.0f s for the GPU with collectives queued: "
                                    "another rank stopped taking part (crashed, or slower than KN_DIST_TIMEOUT)",
                                    c->rank, waited);
            }
        }
        if (spins > 64) nanosleep(&nap, NULL);
    }
}

/* ---- the family entry ------------------------------------------------------------------ */
static int nc_dtype(kn_dtype t) {
    switch (t) {
    case KN_F32: return NC_F32;
    case KN_F64: return NC_F64;
    case KN_F16: return NC_F16;
    case KN_BF16: return NC_BF16;
    case KN_I32: return NC_I32;
    case KN_I64: return NC_I64;
    default: return -1;
    }
}
static int nc_op(int op) { return op == KN_DIST_AVG ? NC_AVG : op == KN_DIST_MAX ? NC_MAX : op == KN_DIST_MIN ? NC_MIN : NC_SUM; }

extern "C" kn_status kn_cu_comm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    kn_dist *d = t->p.dist.comm;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    if (!kn_tview_is_contiguous(x) || !kn_tview_is_contiguous(y))
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: %s needs contiguous tensors (kn_contiguous first)", kn_op_name(t->op));
    size_t es = kn_dtype_get(x->dtype)->type_size;
    int64_t nx = kn_tview_numel(x), ny = kn_tview_numel(y);
    if (kn_dist_world(d) == 1) {        /* every collective of one rank is a copy */
        if (y->data != x->data && ny > 0)
            KN_CUDA_TRY(cudaMemcpyAsync(y->data, x->data, (size_t)ny * es, cudaMemcpyDeviceToDevice, kn_cu_stream()));
        return KN_OK;
    }
    int dt = nc_dtype(x->dtype);
    if (dt < 0) return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: %s of %s", kn_op_name(t->op), kn_dtype_name(x->dtype));
    cu_comm *c;
    kn_status st = comm_get(d, &c);
    if (st) return st;
    if (g_active && g_active != c) { if ((st = kn_cu_comm_join())) return st; }
    g_active = c;
    bool in_place = y->data == x->data && (t->op == KN_OP_ALL_REDUCE || t->op == KN_OP_BROADCAST) && !kn_env_get()->cuda_sync;
    if ((st = pend_events())) return st;
    if (in_place && !g_nfree && (st = kn_cu_comm_join())) return st;
    cudaEvent_t done = in_place ? g_free[--g_nfree] : c->done_now;
    KN_CUDA_TRY(cudaEventRecord(c->fork, kn_cu_stream()));
    KN_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->fork, 0));
    nccl_res r = 0;
    switch (t->op) {
    case KN_OP_ALL_REDUCE: r = nc.all_reduce(x->data, y->data, (size_t)nx, dt, nc_op(t->p.dist.op), c->comm, c->stream); break;
    case KN_OP_ALL_GATHER: r = nc.all_gather(x->data, y->data, (size_t)nx, dt, c->comm, c->stream); break;
    case KN_OP_REDUCE_SCATTER: r = nc.reduce_scatter(x->data, y->data, (size_t)ny, dt, nc_op(t->p.dist.op), c->comm, c->stream); break;
    case KN_OP_BROADCAST: r = nc.broadcast(x->data, y->data, (size_t)nx, dt, t->p.dist.root, c->comm, c->stream); break;
    default: return kn_set_error(KN_ERR_UNSUPPORTED, "cuda backend: %s is not a collective", kn_op_name(t->op));
    }
    if (r) {
        if (in_place) g_free[g_nfree++] = done;
        return nc_fail(kn_op_name(t->op), r);
    }
    KN_CUDA_TRY(cudaEventRecord(done, c->stream));
    if (!in_place) {                   /* the input's memory may be reused by the next node: wait now */
        KN_CUDA_TRY(cudaStreamWaitEvent(kn_cu_stream(), done, 0));
        return KN_OK;
    }
    view_span(y, &g_pend[g_npend].lo, &g_pend[g_npend].hi);
    g_pend[g_npend++].done = done;
    return KN_OK;
}
