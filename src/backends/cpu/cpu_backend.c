/* cpu_backend.c: the fast CPU backend: its kn_backend (host memory), the one
 * dispatch from op to the fast path of its family (the helpers the family
 * files share are in cpu_util.c).
 *
 * Ops with a fast path (f32 data in the layouts each family file lists) run
 * on the SIMD kernels (vec.h, gemm.h) split over the thread pool; every
 * other case falls back to the reference kernels, so the backend always
 * covers every op. The layout predicate is checked per node at run time
 * (extents can change with symbolic sizes).
 *
 * Non-goals (for now): fusing nodes, f16/bf16 arithmetic (those go through
 * the reference kernels), strided elementwise fast paths.
 */
#include "backends/backend_impl.h"
#include "core/env.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_jit.h"      // defines: the kernel_* entries (generated kernels)
#include <stdio.h>
#include <string.h>

/* ==== dispatch =============================================================== */
bool kn_cpu_fast(const kn_exec *e) {
    switch (e->node->op) {
    /* cpu_elementwise.c */
    case KN_OP_FILL: case KN_OP_ASSIGN: return kn_cpu_fill_assign(e);
    case KN_OP_ADD: case KN_OP_SUB: case KN_OP_MUL: case KN_OP_DIV: return kn_cpu_binary(e);
    case KN_OP_GT: case KN_OP_GE: case KN_OP_LT: case KN_OP_LE: case KN_OP_EQ: case KN_OP_NE: return kn_cpu_compare(e);
    case KN_OP_WHERE: return kn_cpu_where(e);
    case KN_OP_ADAM_UPDATE: return kn_cpu_adam(e);
    /* cpu_reduce.c */
    case KN_OP_SUM: case KN_OP_MEAN: case KN_OP_MAX: return kn_cpu_reduce_last(e) || kn_cpu_reduce_leading(e);
    case KN_OP_VAR: case KN_OP_STD: return kn_cpu_reduce_last(e);
    /* cpu_matmul.c */
    case KN_OP_MATMUL: return kn_cpu_matmul(e);
    /* cpu_norm_softmax.c */
    case KN_OP_RMS_NORM: case KN_OP_LAYER_NORM: return kn_cpu_norm(e);
    case KN_OP_NORM_BWD: return kn_cpu_norm_bwd(e);
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: return kn_cpu_softmax(e);
    /* cpu_attention.c */
    case KN_OP_ROPE: return kn_cpu_rope(e);
    case KN_OP_SDPA: return kn_cpu_sdpa(e);
    case KN_OP_SDPA_BWD: return kn_cpu_sdpa_bwd(e);
    case KN_OP_PAGED_ATTN: return kn_cpu_paged_attn(e);   /* cpu_paged.c */
    /* cpu_loss.c */
    case KN_OP_CROSS_ENTROPY: case KN_OP_CROSS_ENTROPY_BWD: return kn_cpu_cross_entropy(e);
    /* cpu_moe.c */
    case KN_OP_MUL_MAT_ID: return kn_cpu_mul_mat_id(e);
    /* cpu_index.c */
    case KN_OP_COPY: return kn_cpu_copy_contig(e) || kn_cpu_copy_strided(e);
    case KN_OP_CAST: return kn_cpu_copy_contig(e);
    case KN_OP_CAT: return kn_cpu_cat(e);
    case KN_OP_GATHER: return kn_cpu_gather(e);
    case KN_OP_INDEX_SELECT: return kn_cpu_index_select(e);
    case KN_OP_INDEX_COPY: return kn_cpu_index_copy(e);
    case KN_OP_INDEX_ADD: return kn_cpu_index_add(e);
    case KN_OP_SCATTER_ADD: return kn_cpu_scatter_add(e);
    case KN_OP_PAD: return kn_cpu_pad(e);
    /* cpu_conv.c */
    case KN_OP_CONV2D: return kn_cpu_conv2d(e);
    case KN_OP_CONV_TRANSPOSE2D: return kn_cpu_conv_transpose2d(e);
    case KN_OP_CONV2D_BWD_W: return kn_cpu_conv2d_bwd_w(e);
    case KN_OP_MAX_POOL2D: case KN_OP_MAX_POOL2D_BWD: return kn_cpu_max_pool(e);
    case KN_OP_UNFOLD: case KN_OP_FOLD: return kn_cpu_fold(e);
    case KN_OP_SORT: return kn_cpu_sort(e);   /* cpu_sort.c */
    default:    /* the unary maps (cpu_elementwise.c); CLAMP takes parameters the vector kernels lack */
        return kn_op_get(e->node->op)->kind == KN_KIND_UNARY && e->node->op != KN_OP_CLAMP && kn_cpu_unary(e);
    }
}

static kn_status cpu_compute(kn_backend *be, const kn_exec *e) {
    if (e->epi) return kn_cpu_matmul_epilogue(e);    /* a matmul with its epilogue (cpu_epilogue.c) */
    return kn_cpu_fast(e) ? KN_OK : kn__ref_compute(be, e);
}

static bool cpu_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be;
    return kn_cpu_epilogue_ok(mm, epi, out);
}

/* the multi-tensor optimizer step (cpu_elementwise.c) */
static bool cpu_batch_ok(kn_backend *be, const kn_exec *e) {
    (void)be;
    return kn_cpu_adam_batch_ok(e);
}
static kn_status cpu_compute_batch(kn_backend *be, const kn_exec *es, int n) {
    (void)be;
    return kn_cpu_adam_batch(es, n) ? KN_OK : KN_ERR_UNSUPPORTED;
}

static kn_backend g_cpu = {
    .version = KN_BACKEND_VERSION,
    .name = "cpu",
    .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc,
    .free = kn__host_free,
    .copy_in = kn__host_copy,
    .copy_out = kn__host_copy,
    .compute = cpu_compute,
    .epilogue_ok = cpu_epilogue_ok,
    .kernel_lang = "c",
    .kernel_build = kn__cpu_kernel_build,
    .kernel_run = kn__cpu_kernel_run,
    .kernel_free = kn__cpu_kernel_free,
    .batch_ok = cpu_batch_ok,
    .compute_batch = cpu_compute_batch,
};

kn_backend *kn_backend_cpu(void) { return &g_cpu; }
