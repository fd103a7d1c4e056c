/* compile/epilogue.h: matmul epilogue fusion (epilogue.c; docs/COMPILER.md,
 * "Matmul epilogues"). A pass of the compiler layer: it sees the graph and
 * the public kn_epilogue description (include/kiln_backend.h), never a
 * backend; whether a backend can run an epilogue is asked through a callback
 * the runtime gives it.
 */
#ifndef KN_COMPILE_EPILOGUE_H
#define KN_COMPILE_EPILOGUE_H
#include "compile/compile.h"
#include "kiln_backend.h"

/* One matmul whose elementwise consumers run in its epilogue. The matmul and
 * the chain's nodes before `last` leave the schedule; `last` stays at its place
 * and runs the matmul (operands a, b) with the epilogue, writing its own
 * storage (dtype last->dtype: the cast's, else d.dt). */
typedef struct kn_epi_rec {
    kn_tensor *mm;          /* the MATMUL node, [..., M, N] */
    kn_tensor *last;        /* the chain's last node, mm's shape */
    kn_tensor *a, *b;       /* mm's operands as the plan reads them (through rep); with a
                             * prologue, a is the prologue's input x instead */
    kn_tensor *pre;         /* the prologue's second operand (norm weight w, gate's u) or NULL */
    kn_tensor *pro[2];      /* the prologue's nodes (rms_norm; or silu, mul), npro of them; they left the schedule */
    int npro;
    kn_tensor *bias;        /* [N] (or [1, .., 1, N]) or NULL */
    kn_tensor *res;         /* mm's shape, or NULL */
    kn_epilogue d;          /* bias, act, res, dt; the views are the runtime's to fill */
    int nabs;               /* chain nodes taken (last included); as many left the schedule: the matmul and the chain
                             * before last. 0: a prologue alone, last = mm runs in its place */
    kn_tensor *chain[4];    /* the chain in order, chain[nabs - 1] = last */
} kn_epi_rec;

/* May the backend run matmul mm with epilogue epi into a dst of dtype out? */
typedef bool (*kn_epi_ok_fn)(void *ctx, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out);

/* Finds the matmuls of a rewritten schedule whose output feeds a chain
 * `cast?(res? + act?(mm + bias?))` and whose left operand is an rms_norm or
 * a gated unit silu(x) * u (predicates in epilogue.c), keeps for each the
 * longest prefix with and then without the prologue that ok accepts, and
 * removes the absorbed nodes from *order
 * (the rest keep their order). *recs: malloc'd, *nrec entries (NULL when none).
 * false: out of host memory (nothing changed). */
bool kn__epilogue(kn_tensor **order, int *n, int32_t n_ids, int nout, kn_tensor *const *outs, kn_tensor *const *rep,
                  kn_epi_ok_fn ok, void *okctx, kn_epi_rec **recs, int *nrec);
#endif
