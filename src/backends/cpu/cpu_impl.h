/* cpu_impl.h: internals shared by the fast CPU backend's files.
 *
 * The backend (cpu_backend.c) sends each node through one switch,
 * kn_cpu_fast(), to the fast path of its op family:
 *   cpu_elementwise.c    unary maps, ADD/SUB/MUL/DIV, comparisons, WHERE,
 *                        FILL/ASSIGN, ADAM_UPDATE
 *   cpu_reduce.c         SUM/MEAN/MAX/VAR/STD over the last dim, SUM/MEAN
 *                        over the leading dims
 *   cpu_matmul.c         MATMUL (f32, and quantized/f16/bf16 weights)
 *   cpu_norm_softmax.c   RMS_NORM, LAYER_NORM, NORM_BWD, SOFTMAX, LOG_SOFTMAX
 *   cpu_attention.c      ROPE, SDPA, SDPA_BWD
 *   cpu_paged.c          PAGED_ATTN
 *   cpu_loss.c           CROSS_ENTROPY, CROSS_ENTROPY_BWD
 *   cpu_moe.c            MUL_MAT_ID (per-expert groups through cpu_matmul.c)
 *   cpu_index.c          COPY, CAST, CAT, GATHER, INDEX_SELECT/COPY/ADD,
 *                        SCATTER_ADD, PAD
 *   cpu_conv.c           CONV2D, CONV_TRANSPOSE2D, CONV2D_BWD_W, MAX_POOL2D(_BWD),
 *                        UNFOLD, FOLD
 *   cpu_sort.c           SORT
 * Each kn_cpu_<op> function computes the node and returns true when its
 * operands are in a layout it handles (the file's top comment lists them);
 * otherwise it returns false without an error, having written nothing, and
 * the caller runs the reference kernel, which also writes the message for
 * bad run-time input (out-of-range indices). Work is split over rows,
 * heads or images with the thread pool above KN_CPU_PAR_MIN elements.
 *
 * defines: kn_cpu_fast, kn_cpu_par_rows, the view predicates below, the
 * kn_cpu_<op> fast paths, kn_cpu_attention_force_isa.
 */
#ifndef KN_CPU_IMPL_H
#define KN_CPU_IMPL_H
#include "backends/backend_impl.h"     // defines: kn_exec, kn_tview, kn_tensor internals, kn_op_get, kn__ref_compute
#include <stdbool.h>
#include <stdint.h>

/* The backend's one dispatch: true when a fast path computed the node. */
bool kn_cpu_fast(const kn_exec *e);

/* ---- threading ---------------------------------------------------------- */
/* Below this many elements of work a job runs on the calling thread: waking
 * the pool costs more than the work. */
#define KN_CPU_PAR_MIN 32768

typedef void (*kn_rows_fn)(void *ctx, int64_t r0, int64_t r1);
/* Run fn over rows [0, rows) split across the pool when `work` (elements
 * touched) is at least KN_CPU_PAR_MIN, else on the calling thread. */
void kn_cpu_par_rows(kn_rows_fn fn, void *ctx, int64_t rows, int64_t work);
/* Contiguous elementwise work goes in chunks of KN_CPU_CHUNK elements: a
 * job row is a chunk, the last one may be shorter. */
#define KN_CPU_CHUNK 4096
static inline int64_t kn_cpu_chunks(int64_t n) { return (n + KN_CPU_CHUNK - 1) / KN_CPU_CHUNK; }
/* the last element (exclusive) of chunks [.., r1) of n elements */
static inline int64_t kn_cpu_chunk_end(int64_t r1, int64_t n) { return r1 * KN_CPU_CHUNK < n ? r1 * KN_CPU_CHUNK : n; }

/* ---- view predicates (static inline: every file uses a few) -------------- */
static inline bool is_f32(const kn_tview *v) { return v->dtype == KN_F32; }
static inline bool contig(const kn_tview *v) { return kn_tview_is_contiguous(v); }
/* product of the extents of dims [from, to) */
static inline int64_t prod(const kn_tview *v, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= v->ne[d];
    return n;
}
/* dims [from, ndim) form one block of consecutive elements (unit dims ignored) */
static inline bool tail_contig(const kn_tview *v, int from) {
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= from; d--) {
        if (v->ne[d] == 1) continue;
        if (v->st[d] != want) return false;
        want *= v->ne[d];
    }
    return true;
}
/* offset of linear index lin over the first n dims of v (n = ndim - 1: the
 * start of row lin of the last dim) */
static inline int64_t off_lead(const kn_tview *v, int n, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % v->ne[d]) * v->st[d]; lin /= v->ne[d]; }
    return o;
}
/* x and y share memory */
bool kn_cpu_overlap(const kn_tview *x, const kn_tview *y);
/* x and y are disjoint, or the very same elements (in place) */
bool kn_cpu_same_or_disjoint(const kn_tview *x, const kn_tview *y);

/* ---- the fast paths, by file ---------------------------------------------- */
/* cpu_elementwise.c */
bool kn_cpu_unary(const kn_exec *e);
bool kn_cpu_binary(const kn_exec *e);
bool kn_cpu_compare(const kn_exec *e);
bool kn_cpu_where(const kn_exec *e);
bool kn_cpu_fill_assign(const kn_exec *e);
bool kn_cpu_adam(const kn_exec *e);
bool kn_cpu_adam_batch_ok(const kn_exec *e);            /* kn_backend.batch_ok */
bool kn_cpu_adam_batch(const kn_exec *es, int n);       /* kn_backend.compute_batch: the updates of one step */
/* cpu_reduce.c */
bool kn_cpu_reduce_last(const kn_exec *e);
bool kn_cpu_reduce_leading(const kn_exec *e);
/* cpu_matmul.c */
bool kn_cpu_matmul(const kn_exec *e);
/* kn_cpu_matmul, and post (gemm.h: struct kn_sgemm_post) on every piece of
 * dst (contiguous, f32) once final; false: no fast path took it (nothing done) */
struct kn_sgemm_post;
bool kn_cpu_matmul_ep(const kn_exec *e, const struct kn_sgemm_post *post);
/* MUL_MAT_ID's experts through the packed copy of W [E, N, C] in one pool
 * job (cpu_matmul.c): x rows gathered by expert (rows [start[ex],
 * start[ex + 1])) into xg [R, C], products into yg [R, N]; false where W
 * has no packed copy or an expert has prefill-many rows (the caller then
 * runs an expert at a time). */
bool kn_cpu_qpacked_experts(const kn_tview *w, const int64_t *start, const float *xg, float *yg);
/* cpu_epilogue.c: matmuls with an epilogue (e->epi) */
bool kn_cpu_epilogue_ok(const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out);
kn_status kn_cpu_matmul_epilogue(const kn_exec *e);
/* post on all of C [rows, N] (contiguous), rows split over the pool */
void kn_cpu_post_whole(const struct kn_sgemm_post *post, float *C, int64_t rows, int64_t N);
/* cpu_norm_softmax.c */
bool kn_cpu_norm(const kn_exec *e);
bool kn_cpu_norm_bwd(const kn_exec *e);
bool kn_cpu_softmax(const kn_exec *e);
/* cpu_attention.c */
bool kn_cpu_rope(const kn_exec *e);
bool kn_cpu_sdpa(const kn_exec *e);
bool kn_cpu_sdpa_bwd(const kn_exec *e);
/* cpu_paged.c */
bool kn_cpu_paged_attn(const kn_exec *e);
/* cpu_loss.c */
bool kn_cpu_cross_entropy(const kn_exec *e);
bool kn_cpu_mul_mat_id(const kn_exec *e);       /* cpu_moe.c */
/* Tests and benches: force the SIMD path of the attention kernels
 * (KN_ISA_* from core/cpu.h, capped at what the CPU allows); -1 = automatic. */
void kn_cpu_attention_force_isa(int isa);
/* cpu_index.c */
bool kn_cpu_copy_contig(const kn_exec *e);
bool kn_cpu_copy_strided(const kn_exec *e);
bool kn_cpu_cat(const kn_exec *e);
bool kn_cpu_gather(const kn_exec *e);
bool kn_cpu_index_select(const kn_exec *e);
bool kn_cpu_index_copy(const kn_exec *e);
bool kn_cpu_index_add(const kn_exec *e);
bool kn_cpu_scatter_add(const kn_exec *e);
bool kn_cpu_pad(const kn_exec *e);
/* cpu_conv.c */
bool kn_cpu_conv2d(const kn_exec *e);
bool kn_cpu_conv_transpose2d(const kn_exec *e);
bool kn_cpu_conv2d_bwd_w(const kn_exec *e);
bool kn_cpu_max_pool(const kn_exec *e);
bool kn_cpu_fold(const kn_exec *e);        /* UNFOLD, FOLD */
bool kn_cpu_sort(const kn_exec *e);        /* cpu_sort.c */
#endif
