/* env.c: the library's KN_* switches, read once (env.h). */
#include "core/env.h"
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* how a variable's text becomes its field:
 * FLAG     bool, on unless "" or "0";  IS0 / IS1  bool, on only for "0" / "1"
 * TRI      int: 1 for "1", -1 for "0", 0 otherwise (unset: a default chosen elsewhere)
 * INT      int >= 0 (capped at 2^20);  LONG       long long >= 0
 * STR      the text (NULL when empty); PROFILE    "shapes" 2, another flag value 1 */
typedef enum { FLAG, IS0, IS1, TRI, INT, LONG, STR, PROFILE } kind;
typedef struct { const char *name; kind k; size_t off; } var;

#define F(field) offsetof(kn_env, field)
static const var g_vars[] = {
    {"KN_THREADS", INT, F(threads)},          {"KN_BACKEND", STR, F(backend)},
    {"KN_CPU", STR, F(cpu)},                  {"KN_DEBUG", FLAG, F(debug)},
    {"KN_PROFILE", PROFILE, F(profile)},          {"KN_GEMM_CHUNKS", INT, F(gemm_chunks)},
    {"KN_GEMM_BLOCK", STR, F(gemm_block)},    {"KN_QMM_ACT", STR, F(qmm_act)},
    {"KN_QMM_EXACT", FLAG, F(qmm_exact)},     {"KN_LLM_FUSE", IS0, F(llm_nofuse)},
    {"KN_LLM_GPU_CAST", IS1, F(llm_gpu_cast)}, {"KN_CUDA_GENERIC", FLAG, F(cuda_generic)},
    {"KN_CUDA_NO_TC", FLAG, F(cuda_no_tc)},   {"KN_CUDA_NO_WGMMA", FLAG, F(cuda_no_wgmma)},
    {"KN_CUDA_NO_SGEMM", FLAG, F(cuda_no_sgemm)}, {"KN_CUDA_NO_GEMV", FLAG, F(cuda_no_gemv)},
    {"KN_CUDA_NO_SPLITK", FLAG, F(cuda_no_splitk)}, {"KN_CUDA_SYNC", FLAG, F(cuda_sync)},
    {"KN_CUDA_TRACE", FLAG, F(cuda_trace)},   {"KN_CUDA_POOL_MB", LONG, F(cuda_pool_mb)},
    {"KN_CUDA_TUNE", STR, F(cuda_tune)},        {"KN_NOFUSE", FLAG, F(nofuse)},
    {"KN_CACHE_DIR", STR, F(cache_dir)},      {"KN_CACHE", IS0, F(cache_off)},
    {"KN_DUMP_KERNELS", STR, F(dump_kernels)}, {"KN_LLM_STEP_PLAN", IS0, F(llm_no_step_plan)},
    {"KN_EPILOGUE", TRI, F(epilogue)},        {"KN_FUSE_MAX", STR, F(fuse_max)},
    {"KN_CC", STR, F(cc)},                    {"KN_BEAM", INT, F(beam)},
    {"KN_CUDA_GRAPH", IS0, F(cuda_nograph)},  {"KN_CUDA_PDL", IS0, F(cuda_no_pdl)},
    {"KN_CE_COMPOSITE", FLAG, F(ce_composite)}, {"KN_NORM_COMPOSITE", FLAG, F(norm_composite)},
    {"KN_CUDA_DEVICE", STR, F(cuda_device)},  {"KN_DIST_TIMEOUT", STR, F(dist_timeout)},
    {"KN_NCCL_LIB", STR, F(nccl_lib)},        {"KN_DDP_BUCKET_KB", STR, F(ddp_bucket_kb)}, {"KN_LLM_PREFILL_CAST", IS0, F(llm_no_prefill_cast)},
    {"KN_QPACK", IS0, F(qpack_off)},         {"KN_CHECK", FLAG, F(check)},
    {"KN_LLM_TOP", IS1, F(llm_top)},          {"KN_BATCH", IS0, F(batch_off)},
    {"KN_LLM_DEVICE_EMBED", IS0, F(llm_host_embed)},
};
#undef F
#define N_VARS (sizeof g_vars / sizeof g_vars[0])

static kn_env g_env;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool flag_on(const char *s) { return s && *s && strcmp(s, "0") != 0; }

/* a whole number, or warn once and keep 0 (the variable's default) */
static long long int_of(const char *name, const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < 0) {
        fprintf(stderr, "kiln: %s=%s is not a whole number >= 0; ignored\n", name, s);
        return 0;
    }
    return v;
}

static void read_all(void) {
    kn_env e;
    memset(&e, 0, sizeof e);
    for (size_t i = 0; i < N_VARS; i++) {
        const var *v = &g_vars[i];
        const char *s = getenv(v->name);
        char *p = (char *)&e + v->off;
        if (!s) continue;
        switch (v->k) {
        case STR: if (*s) *(const char **)p = s; break;
        case FLAG: *(bool *)p = flag_on(s); break;
        case IS0: *(bool *)p = !strcmp(s, "0"); break;     /* KN_LLM_FUSE, KN_CACHE: on by default, "0" turns it off */
        case IS1: *(bool *)p = !strcmp(s, "1"); break;     /* KN_LLM_GPU_CAST: only "1", as documented */
        case TRI: *(int *)p = !strcmp(s, "1") ? 1 : !strcmp(s, "0") ? -1 : 0; break;   /* KN_EPILOGUE: on, off, or each backend's choice */
        case PROFILE: *(int *)p = !strcmp(s, "shapes") ? 2 : flag_on(s) ? 1 : 0; break;
        case INT: if (*s) { long long x = int_of(v->name, s); *(int *)p = x > 1 << 20 ? 1 << 20 : (int)x; } break;
        case LONG: if (*s) *(long long *)p = int_of(v->name, s); break;
        }
    }
    g_env = e;
}

const kn_env *kn_env_get(void) {
    pthread_once(&g_once, read_all);
    return &g_env;
}

void kn_env_reload(void) {
    pthread_once(&g_once, read_all);
    read_all();
}

const char *const *kn_env_names(void) {
    static const char *names[N_VARS + 1];
    for (size_t i = 0; i < N_VARS; i++) names[i] = g_vars[i].name;
    names[N_VARS] = NULL;
    return names;
}
