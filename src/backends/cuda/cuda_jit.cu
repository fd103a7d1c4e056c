/* cuda_jit.cu: build and run the CUDA kernels the compiler generates (the
 * CUDA backend's kernel_lang "cuda"; docs/COMPILER.md, "Building generated
 * kernels").
 *
 * Build: NVRTC compiles the source for the current GPU (a cubin for sm_XY;
 * PTX for the newest architecture NVRTC knows when the GPU is newer than
 * that, which the driver then compiles), through the disk cache
 * (core/kcache.h, key: cuda-cubin or cuda-ptx, "sm_XY <device name>", the
 * NVRTC version, the options, the source). The code is loaded with the
 * runtime's library API (cudaLibraryLoadData + cudaLibraryGetKernel, CUDA
 * 12+), so libkiln needs no libcuda link. Options: --std=c++17 and the
 * architecture; no --use_fast_math (NaN and inf must behave as in the hand
 * kernels), no -lineinfo.
 *
 * Run: the kernel is a grid-stride loop over [0, n) with n computed from
 * the symbols, so the grid only needs to cover the launch's n, capped at
 * the launch's waves (default 8) of full occupancy; a.syms is replaced by the backend's device copy
 * of the symbol values (cuda_graph.cu's array), which syms_upload refreshes
 * (stream-ordered) before each plain plan run, and a captured graph's first
 * node before each replay. A launch recorded in a CUDA graph therefore stays
 * right when the symbols change; syms_upload does nothing while capturing
 * (it waits on an event before reusing a pinned mirror).
 *
 * Non-goals: several GPUs (the backend uses the current device), linking
 * device libraries (the generated source is self-contained), launch bounds
 * or occupancy tuning per kernel.
 */
#include "backends/cuda/cuda_ops.cuh"   // defines: KN_CUDA_TRY, kn_cu_stream, backend_impl.h
#include "backends/cuda/cuda_jit.h"
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "core/kcache.h"                // defines: kn__kcache_get/put
}

typedef struct cuda_kernel {
    cudaLibrary_t lib;
    cudaKernel_t fn;
    bool pdl;                           /* the source calls KN_PDL_ENTER (render.c): launch it with PDL */
    char name[64];                      /* for messages */
} cuda_kernel;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_builds, g_compiles, g_hits, g_failures;   /* under g_mu */

extern "C" void kn__cuda_jit_stats(kn_cuda_jit_stats *s) {
    pthread_mutex_lock(&g_mu);
    s->builds = g_builds; s->compiles = g_compiles; s->cache_hits = g_hits; s->failures = g_failures;
    pthread_mutex_unlock(&g_mu);
}
static void count(long *c) { pthread_mutex_lock(&g_mu); (*c)++; pthread_mutex_unlock(&g_mu); }

/* ==== NVRTC =================================================================== */

extern "C" const char *kn__cuda_jit_nvrtc_version(void) {
    static char v[32];
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        int major = 0, minor = 0;
        nvrtcVersion(&major, &minor);
        snprintf(v, sizeof v, "NVRTC %d.%d", major, minor);
    });
    return v;
}

extern "C" void *kn__cuda_jit_compile(const char *src, int arch, bool ptx, size_t *n, char *flags, size_t nflags,
                                      char *why, size_t nwhy) {
    char archopt[48];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s_%d", ptx ? "compute" : "sm", arch);
    const char *opts[] = {"--std=c++17", archopt};
    if (flags && nflags) snprintf(flags, nflags, "%s %s", opts[0], opts[1]);
    *n = 0;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, "kiln_generated.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        if (why) snprintf(why, nwhy, "NVRTC: cannot create a program: %s", nvrtcGetErrorString(r));
        return NULL;
    }
    r = nvrtcCompileProgram(prog, 2, opts);
    void *code = NULL;
    if (r != NVRTC_SUCCESS) {
        size_t nlog = 0;
        nvrtcGetProgramLogSize(prog, &nlog);
        char *log = (char *)malloc(nlog + 1);
        if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) log[nlog] = 0;
        else if (log) log[0] = 0;
        if (why) {
            snprintf(why, nwhy, "NVRTC failed (%s, %s): %s", nvrtcGetErrorString(r), archopt, log && *log ? log : "(no log)");
            size_t k = strlen(why);
            while (k && (why[k - 1] == '\n' || why[k - 1] == ' ')) why[--k] = 0;
        }
        free(log);
    } else {
        size_t sz = 0;
        r = ptx ? nvrtcGetPTXSize(prog, &sz) : nvrtcGetCUBINSize(prog, &sz);
        if (r == NVRTC_SUCCESS && sz > 0 && (code = malloc(sz)))
            r = ptx ? nvrtcGetPTX(prog, (char *)code) : nvrtcGetCUBIN(prog, (char *)code);
        if (r != NVRTC_SUCCESS || !code) {
            if (why) snprintf(why, nwhy, "NVRTC: cannot get the %s: %s", ptx ? "PTX" : "cubin",
                              r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "out of memory");
            free(code);
            code = NULL;
        } else
            *n = sz;
    }
    nvrtcDestroyProgram(&prog);
    return code;
}

/* ==== the device ============================================================== */

typedef struct dev_info {
    bool ok;
    int arch;            /* 90 for sm_90 */
    int target;          /* what NVRTC builds for: arch, or its newest below (then PTX) */
    bool ptx;
    int sms;
    char desc[320];      /* "sm_90 NVIDIA H100 80GB HBM3" */
    char err[256];
    void *scratch;       /* KN_KSPLIT_BYTES for split reductions (kiln_backend.h) */
} dev_info;
static dev_info g_dev;
static pthread_once_t g_dev_once = PTHREAD_ONCE_INIT;

static void dev_probe(void) {
    dev_info *d = &g_dev;
    int dev = 0;
    cudaDeviceProp p;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce == cudaSuccess) ce = cudaGetDeviceProperties(&p, dev);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(d->err, sizeof d->err, "no usable GPU (%s)", cudaGetErrorString(ce));
        return;
    }
    d->arch = p.major * 10 + p.minor;
    d->sms = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
    snprintf(d->desc, sizeof d->desc, "sm_%d %s", d->arch, p.name);
    int na = 0;
    if (nvrtcGetNumSupportedArchs(&na) != NVRTC_SUCCESS || na <= 0) {
        snprintf(d->err, sizeof d->err, "NVRTC lists no supported architecture");
        return;
    }
    int *archs = (int *)malloc(sizeof(int) * (size_t)na);
    if (!archs || nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS) { free(archs); snprintf(d->err, sizeof d->err, "NVRTC: cannot list architectures"); return; }
    int best = 0;
    bool exact = false;
    for (int i = 0; i < na; i++) {
        if (archs[i] == d->arch) exact = true;
        if (archs[i] <= d->arch && archs[i] > best) best = archs[i];
    }
    free(archs);
    if (!best) {
        snprintf(d->err, sizeof d->err, "the GPU (%s) is older than any architecture %s builds for", d->desc, kn__cuda_jit_nvrtc_version());
        return;
    }
    d->target = exact ? d->arch : best;
    d->ptx = !exact;     /* a GPU newer than NVRTC: PTX for the newest it knows, compiled by the driver */
    /* split reductions' partials and counters (kiln_backend.h, KN_KSPLIT_*):
     * zeroed once here, kept zero by the kernels; allocated before any
     * capture (cudaMalloc is not allowed inside one) */
    if ((ce = cudaMalloc(&d->scratch, KN_KSPLIT_BYTES)) == cudaSuccess) ce = cudaMemset(d->scratch, 0, KN_KSPLIT_BYTES);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(d->err, sizeof d->err, "cannot allocate the generated kernels' %zu bytes of scratch (%s)", (size_t)KN_KSPLIT_BYTES,
                 cudaGetErrorString(ce));
        return;
    }
    d->ok = true;
}

/* ==== symbols on the device =================================================== */

/* The device copy (KN_MAX_SYMS + 1 values) and a ring of pinned host mirrors:
 * a copy from pinned memory reads it when the stream gets there, so a mirror
 * is reused only after the event recorded behind its copy (almost always
 * long done: the host would have to run SYM_RING plan runs ahead). */
#define SYM_RING 4
static int64_t *g_dsyms;
static int64_t *g_hsyms[SYM_RING];
static cudaEvent_t g_sym_ev[SYM_RING];
static int g_sym_next;
static pthread_mutex_t g_sym_mu = PTHREAD_MUTEX_INITIALIZER;

static kn_status syms_ready(void) {   /* under g_sym_mu */
    if (g_dsyms) return KN_OK;
    const size_t bytes = sizeof(int64_t) * (KN_MAX_SYMS + 1);
    int64_t *d = kn_cu_dev_syms();    /* the array captured graphs upload into too (cuda_graph.cu) */
    if (!d) return kn_set_error(KN_ERR_BACKEND, "cuda backend: cannot allocate the device copy of the symbols");
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < SYM_RING && ce == cudaSuccess; i++) {
        if (!g_hsyms[i]) ce = cudaHostAlloc((void **)&g_hsyms[i], bytes, cudaHostAllocDefault);
        if (ce == cudaSuccess && !g_sym_ev[i]) ce = cudaEventCreateWithFlags(&g_sym_ev[i], cudaEventDisableTiming);
    }
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return kn_set_error(KN_ERR_BACKEND, "cuda backend: cannot set up the symbol values for generated kernels: %s", cudaGetErrorString(ce));
    }
    g_dsyms = d;
    return KN_OK;
}

extern "C" kn_status kn__cuda_syms_upload(kn_backend *be, const int64_t *syms, int n) {
    (void)be;
    if (n < 0 || n > KN_MAX_SYMS || (n > 0 && !syms))
        return kn_set_error(KN_ERR_INVALID, "syms_upload: %d symbols (at most %d, and values given)", n, KN_MAX_SYMS);
    /* in a capture the graph's first node uploads them (from the mirror
     * graph_launch fills): a copy recorded here would replay stale values */
    if (kn_cu_capturing()) return KN_OK;
    pthread_mutex_lock(&g_sym_mu);
    kn_status st = syms_ready();
    if (st == KN_OK) {
        int i = g_sym_next;
        g_sym_next = (i + 1) % SYM_RING;
        int64_t *h = g_hsyms[i];
        cudaError_t ce = cudaEventSynchronize(g_sym_ev[i]);   /* that mirror's last copy has run */
        if (ce == cudaSuccess) {
            h[0] = 0;
            for (int k = 1; k <= n; k++) h[k] = syms[k];
            ce = cudaMemcpyAsync(g_dsyms, h, sizeof(int64_t) * (size_t)(n + 1), cudaMemcpyHostToDevice, kn_cu_stream());
        }
        if (ce == cudaSuccess) ce = cudaEventRecord(g_sym_ev[i], kn_cu_stream());
        if (ce != cudaSuccess) {
            cudaGetLastError();
            st = kn_set_error(KN_ERR_BACKEND, "syms_upload: %s", cudaGetErrorString(ce));
        }
    }
    pthread_mutex_unlock(&g_sym_mu);
    return st;
}

/* ==== the backend entries ===================================================== */

static cuda_kernel *load(const void *code, const char *name, char *why, size_t nwhy) {
    cudaLibrary_t lib;
    cudaError_t ce = cudaLibraryLoadData(&lib, code, NULL, NULL, 0, NULL, NULL, 0);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        if (why) snprintf(why, nwhy, "cudaLibraryLoadData: %s", cudaGetErrorString(ce));
        return NULL;
    }
    cudaKernel_t fn;
    if ((ce = cudaLibraryGetKernel(&fn, lib, name)) != cudaSuccess) {
        cudaGetLastError();
        if (why) snprintf(why, nwhy, "the generated source defines no kernel %s (extern \"C\" __global__?): %s", name, cudaGetErrorString(ce));
        cudaLibraryUnload(lib);
        return NULL;
    }
    cuda_kernel *k = (cuda_kernel *)malloc(sizeof *k);
    if (!k) { cudaLibraryUnload(lib); if (why) snprintf(why, nwhy, "out of memory"); return NULL; }
    k->lib = lib;
    k->fn = fn;
    k->pdl = false;
    snprintf(k->name, sizeof k->name, "%s", name);
    return k;
}

extern "C" void *kn__cuda_kernel_build(kn_backend *be, const char *src, const char *name, char *why, size_t nwhy) {
    (void)be;
    if (why && nwhy) why[0] = 0;
    pthread_once(&g_dev_once, dev_probe);
    if (!src || !name || !*name || !g_dev.ok) {
        if (why) snprintf(why, nwhy, "%s", !g_dev.ok ? g_dev.err : "kernel_build: no source or no kernel name");
        count(&g_failures);
        return NULL;
    }
    char flags[128];
    snprintf(flags, sizeof flags, "--std=c++17 --gpu-architecture=%s_%d", g_dev.ptx ? "compute" : "sm", g_dev.target);
    kn_kcache_key key = {g_dev.ptx ? "cuda-ptx" : "cuda-cubin", g_dev.desc, kn__cuda_jit_nvrtc_version(), flags, src};
    size_t n = 0;
    void *code = kn__kcache_get(&key, &n);
    cuda_kernel *k = NULL;
    if (code && (!g_dev.ptx || (n > 0 && ((char *)code)[n - 1] == 0)))   /* PTX must end in its NUL */
        k = load(code, name, NULL, 0);
    if (k) count(&g_hits);
    else {   /* no entry, or one that does not load: compile and replace it */
        free(code);
        code = kn__cuda_jit_compile(src, g_dev.target, g_dev.ptx, &n, NULL, 0, why, nwhy);
        if (code) {
            count(&g_compiles);
            kn__kcache_put(&key, code, n);   /* false: reported once by the cache; the kernel still runs */
            k = load(code, name, why, nwhy);
        }
    }
    free(code);
    count(k ? &g_builds : &g_failures);
    if (k) k->pdl = strstr(src, "KN_PDL_ENTER();") != NULL;
    return k;
}

extern "C" const char *kn__cuda_jit_device(void) {
    pthread_once(&g_dev_once, dev_probe);
    return g_dev.ok ? g_dev.desc : NULL;
}

extern "C" kn_status kn__cuda_kernel_run(kn_backend *be, void *kernel, const kn_kernel_launch *l) {
    (void)be;
    if (!kernel || !l) return kn_set_error(KN_ERR_INVALID, "kernel_run: NULL kernel or launch");
    kn_cu_bind();
    cuda_kernel *k = (cuda_kernel *)kernel;
    int64_t n = l->a.n > 0 ? l->a.n : l->n_max;
    if (n <= 0) return KN_OK;
    kn_status cst = kn_cu_comm_before_kernel(l->a.buf, KN_KERNEL_MAXBUF);   /* pending collectives' outputs */
    if (cst) return cst;
    int block = l->block > 0 ? l->block : 256;
    if (block > 1024)
        return kn_set_error(KN_ERR_INVALID, "kernel_run %s: block of %d threads (at most 1024)", k->name, block);
    pthread_once(&g_dev_once, dev_probe);
    int64_t waves = l->waves > 0 ? l->waves : 8;   /* the kernel search may pick another cap (src/compile/search.c) */
    int64_t grid = (n + block - 1) / block, cap = waves * (g_dev.ok ? g_dev.sms : 1) * (2048 / block);
    if (grid > cap) grid = cap;   /* the kernel loops over the rest (grid stride) */
    kn_kargs a = l->a;
    /* index checks report into their op's slot (the kernel indexes the
     * slots by kn_op), read at the next synchronize like the hand kernels'
     * (cuda_ops.cuh: kn_cu_err has kn_kerr's layout) */
    a.err = l->err_op != KN_OP_NONE ? (void *)kn_cu_err_dev(KN_OP_NONE) : NULL;
    a.scratch = g_dev.scratch;
    pthread_mutex_lock(&g_sym_mu);
    kn_status st = syms_ready();
    a.syms = g_dsyms;
    pthread_mutex_unlock(&g_sym_mu);
    if (st) return st;
    void *args[] = {&a};
    /* KN_CUDA_TRACE: timed alone like the hand nodes */
    const bool trace = kn_cu_trace_on() && kn_cu_trace_begin() == KN_OK;
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3((unsigned)block);
    cfg.stream = kn_cu_stream();
    cfg.attrs = &at;
    cfg.numAttrs = k->pdl ? kn_pdl_attr(&at) : 0;
    cudaError_t ce = cudaLaunchKernelExC(&cfg, (const void *)k->fn, args);
    double us = 0;
    if (trace && ce == cudaSuccess && kn_cu_trace_end(&us) == KN_OK)
        fprintf(stderr, "cuda-trace %-14s %9.1f us  %lld items, %lld x %d\n", k->name, us, (long long)n, (long long)grid, block);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return kn_set_error(KN_ERR_BACKEND, "kernel_run %s: launch of %lld blocks x %d threads failed: %s (%s)",
                            k->name, (long long)grid, block, cudaGetErrorName(ce), cudaGetErrorString(ce));
    }
    if (kn_env_get()->cuda_sync) {   /* KN_CUDA_SYNC: a fault names its kernel */
        if ((ce = cudaStreamSynchronize(kn_cu_stream())) != cudaSuccess)
            return kn_set_error(KN_ERR_BACKEND, "kernel_run %s failed: %s", k->name, cudaGetErrorString(ce));
    }
    return KN_OK;
}

extern "C" void kn__cuda_kernel_free(kn_backend *be, void *kernel) {
    (void)be;
    cuda_kernel *k = (cuda_kernel *)kernel;
    if (!k) return;
    /* launches of it may still be queued: let them run before the code goes
     * (kernel_free comes with a plan's end, not on a hot path) */
    cudaStreamSynchronize(kn_cu_stream());
    cudaGetLastError();
    cudaLibraryUnload(k->lib);
    free(k);
}
