/* ref.h: the reference backend's internal pieces (one file per op family).
 * Every kernel here is plain C over kn_tview operands, reading and writing
 * through kn_load/kn_store and accumulating in double: slow, readable, and
 * the oracle every other backend is tested against. */
#ifndef KN_REF_H
#define KN_REF_H
#include "backends/backend_impl.h"

/* Offset (elements) of linear index lin (row-major over v->ne) in v. */
static inline int64_t kn_ref_off(const kn_tview *v, int64_t lin) {
    int64_t o = 0;
    for (int d = v->ndim - 1; d >= 0; d--) {
        int64_t n = v->ne[d];
        o += (lin % n) * v->st[d];
        lin /= n;
    }
    return o;
}
#define LD(v, off) kn_load((v)->dtype, (v)->data, (off))
#define ST(v, off, x) kn_store((v)->dtype, (v)->data, (off), (x))

/* A quantized view as f32: *out reads a temporary copy (*tmp, free it) with
 * the same strides; non-quantized views pass through with *tmp = NULL. */
kn_status kn_ref_dequant_view(const kn_tview *v, kn_tview *out, float **tmp);

kn_status kn_ref_create(const kn_exec *e);
kn_status kn_ref_copy(const kn_exec *e);       /* COPY, CAST, ASSIGN, TRI, WHERE */
kn_status kn_ref_optim(const kn_exec *e);      /* ADAM_UPDATE */
kn_status kn_ref_unary(const kn_exec *e);
kn_status kn_ref_binary(const kn_exec *e);
kn_status kn_ref_reduce(const kn_exec *e);
kn_status kn_ref_scan(const kn_exec *e);
kn_status kn_ref_matmul(const kn_exec *e);
kn_status kn_ref_index(const kn_exec *e);      /* CAT PAD GATHER SCATTER(_ADD) INDEX_SELECT/ADD/COPY */
kn_status kn_ref_nn(const kn_exec *e);         /* softmax, norms, conv, pool, sdpa, rope */
kn_status kn_ref_cross_entropy(const kn_exec *e); /* CROSS_ENTROPY(_BWD): ref_loss.c, through kn_ref_nn */
kn_status kn_ref_moe(const kn_exec *e);        /* TOPK, MUL_MAT_ID: ref_moe.c, through kn_ref_nn */
kn_status kn_ref_comm(const kn_exec *e);        /* ALL_REDUCE ALL_GATHER REDUCE_SCATTER BROADCAST: ref_dist.c */
kn_status kn_ref_paged_attn(const kn_exec *e);    /* PAGED_ATTN: ref_paged.c, through kn_ref_nn */
kn_status kn_ref_sort(const kn_exec *e);       /* SORT: ref_sort.c, through kn_ref_nn */
kn_status kn_ref_fold(const kn_exec *e);       /* UNFOLD, FOLD: ref_fold.c, through kn_ref_nn */

/* ref_epilogue.c: matmul epilogues (kn_epilogue), also the CPU backend's fallback */
bool kn_ref_epilogue_ok(const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out);
/* dst = e->epi applied to mm (dst's extents, dtype epi->dt; may be dst itself) */
void kn_ref_epilogue_apply(const kn_exec *e, const kn_tview *mm);
/* e's prologue (e->epi->pre, kn_epilogue) computed on the host: *m = e
 * with src[0] the computed A (f32, contiguous, malloc'd into *tmp: free it
 * after) and m->epi the rest of the epilogue (*epi) or NULL when nothing is
 * left; *m = *e and *tmp = NULL when e has none. The CUDA backend's
 * fallback does the same on the device. */
kn_status kn_ref_prologue(const kn_exec *e, kn_exec *m, kn_epilogue *epi, void **tmp);
/* matmul (which ignores e->epi) into dst or a scratch of the matmul's dtype, then the epilogue */
kn_status kn_ref_matmul_epilogue(const kn_exec *e, kn_status (*matmul)(const kn_exec *));
#endif
