/* cuda_graph.cu: the CUDA backend's capture and replay hooks (kn_backend's
 * dynamic_syms, capture_begin/end, graph_launch, graph_free): a whole plan
 * run recorded into one CUDA graph on the backend's stream, then replayed
 * with one cudaGraphLaunch. src/runtime/replay.c decides when.
 *
 * Symbols on the device: g_dsyms [KN_MAX_SYMS + 1] int64 holds the symbol
 * values a captured kernel reads (today: the decode attention's key count,
 * cuda_ops_nn.cu). The graph's first node copies them from a pinned host
 * mirror (g_hsyms), which graph_launch fills just before the launch: a
 * host memcpy of 136 bytes, no extra API call. The same array is what
 * generated kernels read (cuda_jit.cu: kn_cu_dev_syms); outside a capture,
 * syms_upload refreshes it before each plain run.
 *
 * Scratch: kernels take pool blocks (kn_cu_tmp) and give them back right
 * after their launches, which is safe because the next user is queued
 * behind them. A replayed graph reuses the addresses it captured, so a
 * block a capture took must not go back to the pool while the graph
 * lives: the graph owns every block taken during its capture. Blocks given
 * back during the capture go on the graph's own free list and are handed
 * out again to later nodes of the same capture (a captured stream is one
 * chain, so that is the same stream-ordered reuse as without a graph);
 * they return to the pool when the graph is freed.
 *
 * What must not be captured fails the capture instead of being recorded
 * wrong: host <-> device copies through the staging buffers (their host
 * side would not replay) return an error while capturing, and the capture
 * runs in thread-local mode, so a synchronisation or a plain cudaMalloc in
 * some kernel's set-up invalidates it. The runtime then runs the plan
 * plainly. Non-goals: several threads capturing at once (the backend has
 * one stream), graph updates in place (cudaGraphExecUpdate).
 */
#include "backends/cuda/cuda_ops.cuh"
#include <stdlib.h>
#include <string.h>

#define NSYMS (KN_MAX_SYMS + 1)

typedef struct { void *p; size_t n; bool busy; } own_blk;
typedef struct cu_graph {
    cudaGraphExec_t exec;
    own_blk *own;               /* scratch blocks this graph's kernels use */
    int nown, cap;
    size_t nodes;
} cu_graph;

static int64_t *g_dsyms;        /* device [NSYMS] */
static int64_t *g_hsyms;        /* pinned host mirror [NSYMS] */
static cudaEvent_t g_sym_ev;    /* after the last launch that read g_hsyms */
static bool g_sym_pending;
static cu_graph *g_cur;         /* the graph being captured, NULL otherwise */

const int64_t *kn_cu_capture_syms(void) { return g_cur ? g_dsyms : NULL; }
bool kn_cu_capturing(void) { return g_cur != NULL; }

static kn_status graph_init(void) {
    if (g_dsyms) return KN_OK;
    KN_CUDA_TRY(cudaMalloc((void **)&g_dsyms, sizeof(int64_t) * NSYMS));
    KN_CUDA_TRY(cudaHostAlloc((void **)&g_hsyms, sizeof(int64_t) * NSYMS, cudaHostAllocDefault));
    KN_CUDA_TRY(cudaEventCreateWithFlags(&g_sym_ev, cudaEventDisableTiming));
    memset(g_hsyms, 0, sizeof(int64_t) * NSYMS);
    return KN_OK;
}

/* ---- scratch while capturing (kn_cu_tmp / kn_cu_tmp_free route here) ---- */
kn_status kn_cu_graph_tmp(size_t bytes, void **p) {
    cu_graph *g = g_cur;
    int best = -1;
    for (int i = 0; i < g->nown; i++)       /* the smallest free block that fits */
        if (!g->own[i].busy && g->own[i].n >= bytes && (best < 0 || g->own[i].n < g->own[best].n)) best = i;
    if (best >= 0) { g->own[best].busy = true; *p = g->own[best].p; return KN_OK; }
    if (g->nown == g->cap) {
        int nc = g->cap ? 2 * g->cap : 16;
        own_blk *o = (own_blk *)realloc(g->own, sizeof *o * (size_t)nc);
        if (!o) return kn_set_error(KN_ERR_NOMEM, "cuda graph capture: out of host memory");
        g->own = o; g->cap = nc;
    }
    /* a new block: the pool may cudaMalloc, which thread-local capture
     * forbids; the graph keeps the block, so relax the mode for the call */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    kn_status st = kn_cu_pool_take(bytes, p);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (st) return st;
    g->own[g->nown++] = (own_blk){*p, bytes, true};
    return KN_OK;
}
bool kn_cu_graph_tmp_free(void *p) {
    cu_graph *g = g_cur;
    for (int i = 0; i < g->nown; i++)
        if (g->own[i].p == p) { g->own[i].busy = false; return true; }
    return false;                           /* taken before the capture: the caller releases it */
}

static void graph_destroy(cu_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    for (int i = 0; i < g->nown; i++) kn_cu_pool_give(g->own[i].p);
    free(g->own);
    free(g);
}

int64_t *kn_cu_dev_syms(void) { return graph_init() == KN_OK ? g_dsyms : NULL; }

/* ---- the hooks ---- */
uint64_t kn_cu_dynamic_syms(kn_backend *be, const kn_exec *e) {
    (void)be;
    if (e->node->op == KN_OP_SDPA) return kn_cu_sdpa_dynamic_syms(e);
    return 0;
}

kn_status kn_cu_capture_begin(kn_backend *be, const int64_t *syms, int n) {
    (void)be; (void)syms; (void)n;
    const kn_env *env = kn_env_get();
    if (env->cuda_trace || env->cuda_sync)   /* they wait after every node */
        return kn_set_error(KN_ERR_UNSUPPORTED, "cuda graph: not with KN_CUDA_TRACE or KN_CUDA_SYNC");
    if (g_cur) return kn_set_error(KN_ERR_STATE, "cuda graph: a capture is already running");
    kn_cu_bind();
    kn_status st = graph_init();
    if (st) return st;
    cu_graph *g = (cu_graph *)calloc(1, sizeof *g);
    if (!g) return kn_set_error(KN_ERR_NOMEM, "cuda graph: out of host memory");
    KN_CUDA_TRY(cudaStreamBeginCapture(kn_cu_stream(), cudaStreamCaptureModeThreadLocal));
    cudaError_t ce = cudaMemcpyAsync(g_dsyms, g_hsyms, sizeof(int64_t) * NSYMS, cudaMemcpyHostToDevice, kn_cu_stream());
    if (ce != cudaSuccess) {
        cudaGraph_t gr = NULL;
        cudaStreamEndCapture(kn_cu_stream(), &gr);
        if (gr) cudaGraphDestroy(gr);
        cudaGetLastError();
        free(g);
        return kn_set_error(KN_ERR_BACKEND, "cuda graph: symbol upload not capturable: %s", cudaGetErrorString(ce));
    }
    g_cur = g;
    return KN_OK;
}

kn_status kn_cu_capture_end(kn_backend *be, bool keep, void **graph) {
    (void)be;
    *graph = NULL;
    cu_graph *g = g_cur;
    if (!g) return kn_set_error(KN_ERR_STATE, "cuda graph: no capture running");
    g_cur = NULL;
    kn_cu_comm_join();                          /* collectives forked from the stream join it before the end */
    cudaGraph_t gr = NULL;
    cudaError_t ce = cudaStreamEndCapture(kn_cu_stream(), &gr);
    if (ce == cudaSuccess && gr && keep) {
        ce = cudaGraphInstantiate(&g->exec, gr, 0);
        if (ce == cudaSuccess) cudaGraphGetNodes(gr, NULL, &g->nodes);
    }
    if (gr) cudaGraphDestroy(gr);
    if (ce != cudaSuccess || !keep || !g->exec) {
        /* nothing was queued for real: the blocks go straight back */
        cudaGetLastError();                 /* the stream is usable again; clear the error */
        g->exec = NULL;
        graph_destroy(g);
        if (!keep) return KN_OK;
        return kn_set_error(KN_ERR_BACKEND, "cuda graph: capture failed: %s", cudaGetErrorString(ce));
    }
    if (kn_env_get()->debug)
        fprintf(stderr, "cuda graph: %zu nodes, %d scratch blocks\n", g->nodes, g->nown);
    *graph = g;
    return KN_OK;
}

kn_status kn_cu_graph_launch(kn_backend *be, void *graph, const int64_t *syms, int n) {
    (void)be;
    cu_graph *g = (cu_graph *)graph;
    if (!g || !g->exec) return kn_set_error(KN_ERR_INVALID, "cuda graph: launch of a NULL graph");
    kn_cu_bind();
    if (g_sym_pending) {                    /* the last launch's upload read the mirror (done: every run ends in a wait) */
        g_sym_pending = false;
        KN_CUDA_TRY(cudaEventSynchronize(g_sym_ev));
    }
    if (n > KN_MAX_SYMS) n = KN_MAX_SYMS;
    memcpy(g_hsyms, syms, sizeof(int64_t) * (size_t)(n + 1));
    KN_CUDA_TRY(cudaGraphLaunch(g->exec, kn_cu_stream()));
    KN_CUDA_TRY(cudaEventRecord(g_sym_ev, kn_cu_stream()));
    g_sym_pending = true;
    kn_cu_err_arm();                        /* the graph's index kernels may have set a slot */
    return KN_OK;
}

void kn_cu_graph_free(kn_backend *be, void *graph) {
    (void)be;
    if (!graph) return;
    cudaStreamSynchronize(kn_cu_stream());  /* not while a replay runs */
    graph_destroy((cu_graph *)graph);
}
