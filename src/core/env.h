/* env.h: every KN_* environment switch of the library, read once.
 *
 * The library reads its environment in one place (env.c) the first time
 * any switch is asked for, and keeps the values in one struct; hot paths
 * (a CUDA node dispatch, a matmul) read a field, never getenv. docs/ENV.md
 * lists each variable; test_core checks that the list and the table in
 * env.c agree.
 *
 * A flag is on when the variable is set to anything but "" or "0".
 * Programs and tests that change a variable at run time (setenv) call
 * kn_env_reload() afterwards; it must not race with running plans.
 */
#ifndef KN_CORE_ENV_H
#define KN_CORE_ENV_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_env {
    /* core and CPU */
    int threads;             /* KN_THREADS: worker count incl. the caller; 0 = one per core */
    const char *backend;     /* KN_BACKEND: ref | cpu | cuda; NULL = cpu */
    const char *cpu;         /* KN_CPU: scalar | avx2 caps the SIMD level; NULL = detected */
    bool debug;              /* KN_DEBUG: print plans and op errors on stderr */
    bool nofuse;             /* KN_NOFUSE: plans skip the graph rewrites (src/compile/) */
    bool batch_off;          /* KN_BATCH=0: no batched node runs (the multi-tensor optimizer step; runtime/exec.c) */
    int profile;             /* KN_PROFILE: 0 off, 1 time per op at exit, 2 (=shapes) also per shape */
    /* generated kernels (docs/COMPILER.md, "The cache") */
    const char *dump_kernels;/* KN_DUMP_KERNELS: directory to write each generated kernel's source into */
    const char *cache_dir;   /* KN_CACHE_DIR: compiled-kernel cache directory; NULL = $XDG_CACHE_HOME/kiln or ~/.cache/kiln */
    bool cache_off;          /* KN_CACHE=0: no compiled-kernel cache on disk */
    const char *cc;          /* KN_CC: the C compiler for generated CPU kernels; NULL = "cc" */
    int beam;                /* KN_BEAM=N: search the tunables of generated kernels not in the cache, beam width N; 0 = never search */
    int gemm_chunks;         /* KN_GEMM_CHUNKS: 1..4, 0 = tuned default */
    const char *gemm_block;  /* KN_GEMM_BLOCK: "kc,mc,nc" blocking override */
    /* LLM engine */
    const char *qmm_act;     /* KN_QMM_ACT: auto | q16 | q8 | f32 */
    bool qmm_exact;          /* KN_QMM_EXACT: same as KN_QMM_ACT=f32 */
    bool llm_nofuse;         /* KN_LLM_FUSE=0: keep wq/wk/wv and w1/w3 as separate matmuls */
    bool qpack_off;          /* KN_QPACK=0: no 16-row packed copies of constant quantized weights */
    /* matmul epilogues and prologues (docs/COMPILER.md): unset, each backend
     * takes those that pay (CUDA: decode's GEMV rows; the CPU none);
     * KN_EPILOGUE=1 every one a backend can run; KN_EPILOGUE=0 none */
    int epilogue;            /* 1: KN_EPILOGUE=1, -1: KN_EPILOGUE=0, 0: unset (or another value) */
    bool ce_composite;       /* KN_CE_COMPOSITE: kn_cross_entropy builds the composite (log_softmax, gather, masks), not the fused node */
    bool norm_composite;     /* KN_NORM_COMPOSITE: layer/rms norm gradients as lazy ops (statistics, means, column sums), not one NORM_BWD node */
    bool llm_no_step_plan;   /* KN_LLM_STEP_PLAN=0: no separate one-token plan (decode runs the prompt plan) */
    bool llm_host_embed;     /* KN_LLM_DEVICE_EMBED=0: a device model looks token rows up on the host (default: it gathers them from a device copy of the table) */
    bool llm_top;            /* KN_LLM_TOP=1: sampling-candidates plans on a device (TOPK there; opt-in: slower on an H100) */
    bool llm_gpu_cast;       /* KN_LLM_GPU_CAST=1: cast activations to the weight dtype on the GPU (every plan) */
    bool llm_no_prefill_cast; /* KN_LLM_PREFILL_CAST=0: the GPU prompt plan keeps f32 activations (default: cast to the weight dtype) */
    /* CUDA backend (development switches) */
    bool cuda_generic;       /* KN_CUDA_GENERIC: only the generic kernels, no tuned paths */
    bool cuda_no_tc, cuda_no_wgmma, cuda_no_sgemm, cuda_no_gemv, cuda_no_splitk;
    bool cuda_sync;          /* KN_CUDA_SYNC: synchronize after every node (find a faulting op) */
    bool cuda_trace;         /* KN_CUDA_TRACE: time every node with events */
    bool check;              /* KN_CHECK: on a device backend, rerun every node on the reference backend and report those that differ (runtime/check.c) */
    bool cuda_nograph;       /* KN_CUDA_GRAPH=0: plan runs never captured into CUDA graphs */
    bool cuda_no_pdl;        /* KN_CUDA_PDL=0: no programmatic dependent launches (read by common.cuh itself, as KN_CUDA_TUNE) */
    long long cuda_pool_mb;  /* KN_CUDA_POOL_MB: device pool limit in MiB, 0 = none */
    const char *cuda_tune;   /* KN_CUDA_TUNE: kernel variant overrides "key=v,key=v" */
    const char *fuse_max;    /* KN_FUSE_MAX: a plan keeps only its first n fused groups (bisecting) */
    const char *cuda_device; /* KN_CUDA_DEVICE: the GPU this process uses (else LOCAL_RANK, else 0) */
    /* several processes (kiln_dist.h) */
    const char *dist_timeout;/* KN_DIST_TIMEOUT: seconds any collective or rendezvous may wait (600) */
    const char *nccl_lib;    /* KN_NCCL_LIB: path of libnccl.so.2 */
    const char *ddp_bucket_kb; /* KN_DDP_BUCKET_KB: data-parallel bucket size, KiB (0: one all_reduce a gradient) */
} kn_env;

/* the values, read on the first call (thread safe) */
const kn_env *kn_env_get(void);
/* read the environment again (after setenv in a bench or test) */
void kn_env_reload(void);
/* the names of every variable in the table, NULL-terminated (for the docs check) */
const char *const *kn_env_names(void);

#ifdef __cplusplus
}
#endif
#endif
