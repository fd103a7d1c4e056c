/* compile/kernel.h: fused kernels, from groups of graph nodes to source code
 * (docs/COMPILER.md, "Fusion" and "Code generation").
 *
 * fuse.c    finds groups of elementwise nodes in a plan's schedule that can run
 *           as one kernel, under one predicate (kn__fuse), and lowers each to
 *           a kn_kernel: a loop over the group's shape and, per item, a short
 *           straight-line program (loads, ops, stores).
 * render.c  turns a kn_kernel into source for a backend's language ("c",
 *           "cuda"): one emitter for the program, a dialect per language for
 *           what differs (prelude, kernel head, loop, loads and stores), so a
 *           GLSL dialect can sit beside them.
 * search.c  BEAM search over a kernel's tunables (kn_ktune: launch shape,
 *           unroll) with a timing function the runtime gives it (tune.c).
 *
 * The runtime decides what to do with the source (the backend compiles it:
 * kn_backend.kernel_build) and where the group's values live; a group whose
 * kernel cannot be built is dissolved and its nodes run the hand kernels.
 */
#ifndef KN_COMPILE_KERNEL_H
#define KN_COMPILE_KERNEL_H
#include "compile/compile.h"
#include "kiln_backend.h"

#define KN_KMAX_INST 96     /* instructions of one kernel (the register budget) */
#define KN_KMAX_NODES 32    /* nodes of one group */
#define KN_KMAX_SEG 4       /* item spaces of one kernel (horizontal fusion) */

typedef enum {
    KN_KI_LOAD,             /* v = buf[b] at this item                          */
    KN_KI_CONST,            /* v = p0 (a fill node, already rounded to its dtype) */
    KN_KI_UNARY,            /* v = op(v[a])            (expression: op table)    */
    KN_KI_BINARY,           /* v = op(v[a], v[b])                                */
    KN_KI_CAST,             /* v = (dt) v[a]: rounds to dt and back to the compute type */
    KN_KI_STORE,            /* buf[b] = v[a] at this item                       */
    KN_KI_ROPE,             /* v = rope of buf at this item (and its pair partner
                             * along the last dim), position v[b] (an index load) */
    KN_KI_SCATTER,          /* buf at this item, dim `dim`'s coordinate replaced
                             * by v[b] (index_copy), = v[a]; every index checked */
    KN_KI_GATHER,           /* v = buf at this item, dim `dim`'s coordinate replaced
                             * by v[b] (index_select); a bad index reads 0 and is reported */
} kn_kinst_kind;

typedef struct kn_kinst {
    uint8_t kind;           /* kn_kinst_kind */
    kn_op op;               /* UNARY, BINARY */
    kn_dtype dt;            /* dtype of the value (LOAD: the buffer's; STORE: the buffer's) */
    int a, b;               /* operand instructions (earlier indices); STORE: a = value */
    int buf;                /* LOAD, STORE, ROPE, SCATTER: buffer index */
    double p0, p1;          /* the op's scalar parameters (clamp bounds, slopes; ROPE: theta, freq_scale) */
    /* ROPE: rot = n_rot, neox, aux = buffer of the frequency divisors (-1:
     * none), ast = its stride. SCATTER: dim = the kernel dim whose
     * coordinate the index replaces, odim = that dim in the op (messages),
     * aux = the index buffer (scanned: all indices checked, the last of
     * equal ones wins), ast = its stride, bound = the destination's extent
     * along dim. GATHER: dim, odim, bound (the source's extent along dim).
     * An integer LOAD (dt I32, I64) is only read by these three. */
    int rot, aux, dim, odim;
    bool neox;
    int64_t ast, bound;
} kn_kinst;

typedef struct kn_kbuf {
    kn_dtype dt;
    bool out;                       /* written by the kernel (a stored node) */
    uint8_t seg;                    /* the segment whose dims st is over (kn_kernel.nseg) */
    int64_t st[KN_MAX_DIMS];        /* element strides over the kernel's dims (0: broadcast) */
} kn_kbuf;

/* What a kernel search may change (search.c, docs/COMPILER.md "Kernel
 * search"). A field of 0 means today's heuristic (kn__ktune_resolve), so a
 * zeroed kn_ktune renders and launches exactly as before the search existed.
 * unroll changes the source (and so the kernel's name); block, waves and
 * grain only change the launch (kn_kernel_launch). */
typedef struct kn_ktune {
    int block;          /* CUDA threads per block: 256 elementwise; reductions, normalisations: kn_kernel.block (threads per item) */
    int unroll;         /* CUDA elementwise: items per thread per grid-stride step; C elementwise: `#pragma GCC unroll` of the inner loop; 1 */
    int waves;          /* CUDA: the grid is capped at waves x SMs x (2048 / block) blocks; 8 */
    int64_t grain;      /* C: fewest items worth a thread: 16384 elementwise, 16384 / reduced extent for reductions */
} kn_ktune;

/* One fused kernel: items are the elements of a [ext[0], ..., ext[ndim-1]]
 * space (row-major, after merging dims that every buffer walks contiguously);
 * a dim's run-time extent is syms[sym[d]] * mul[d] when sym[d] != 0, else
 * ext[d]. Values are computed in float (f32, f16, bf16 groups) or double (a
 * group with an f64 value), and rounded to each node's dtype after its op, as
 * the unfused graph would store it. */
typedef struct kn_kernel {
    char name[40];                  /* kn_k<hash of the source> (set by the renderer) */
    bool f64;                       /* computes in double (an f64 value in the group), else float */
    int ndim;
    int64_t ext[KN_MAX_DIMS];       /* extents at the symbols' maximum values */
    int8_t sym[KN_MAX_DIMS];
    int64_t mul[KN_MAX_DIMS];
    int nbuf;
    kn_kbuf buf[KN_KERNEL_MAXBUF];
    int ninst;
    kn_kinst inst[KN_KMAX_INST];
    /* A group that ends in a reduction (sum, mean, max, min) or a row
     * normalisation (rms_norm, layer_norm, softmax, log_softmax over trailing
     * dims): the dims with redd[d] are reduced. An item is one output element
     * (reductions) or one row (normalisations); per item the program runs over
     * the reduced dims, once per pass, and inst[red_val] (the final op's input)
     * is combined; the result goes to buf[red_buf] (strides 0 over reduced dims
     * for a reduction, the row's for a normalisation). Stored values of the
     * group are written in the first pass only.
     * C: one item after another; CUDA: a block of `block` threads per item. */
    kn_op red;                      /* the final op; KN_OP_NONE: elementwise */
    bool redd[KN_MAX_DIMS];
    int red_val, red_buf;
    kn_dtype red_dt;
    int block;
    int split;                      /* CUDA sum/mean/max/min: slices per output (KN_KSPLIT_MAX in kiln_backend.h); 0: a block per output */
    bool cols;                      /* CUDA, the last dim kept: an item is a tile of 32 columns (and a slice, with split) */
    int norm_w, norm_b;             /* normalisations: weight and bias buffers, -1 when absent */
    double eps;
    kn_ktune tune;                  /* launch and unroll choices (search.c); zeros: the heuristic */
    uint32_t keep;                  /* bit d: dim d is never merged or dropped (ROPE's last dim, SCATTER's dim) */
    /* Segments (horizontal fusion across item spaces, CUDA elementwise
     * kernels only): items [0, n0) run instructions [0, seg[1].i0) over the
     * space above; items from there on run segment 1 (instructions
     * [seg[1].i0, seg[2].i0 or ninst)) over its own space, and so on. A
     * buffer's strides are over its segment's dims (kn_kbuf.seg). */
    int nseg;                       /* 0 or 1: one space */
    struct kn_kseg {
        int ndim, i0;
        int64_t ext[KN_MAX_DIMS], mul[KN_MAX_DIMS];
        int8_t sym[KN_MAX_DIMS];
    } seg[KN_KMAX_SEG];
    kn_op err_op;                   /* KN_OP_NONE, or an op whose indices the kernel checks: kn_kargs.err is then
                                     * the backend's kn_kerr slots, one per op (index_copy, index_select) */
} kn_kernel;

/* ld[i] = the buffer instruction i's value is stored to, -1 when none (the
 * later passes of a normalisation read such values back instead of
 * recomputing them, so what only feeds them is not read again). */
void kn__kernel_stored_values(const kn_kernel *k, int *ld);

/* Is op a row normalisation the fuser ends groups with? */
static inline bool kn__is_rownorm(kn_op op) {
    return op == KN_OP_RMS_NORM || op == KN_OP_LAYER_NORM || op == KN_OP_SOFTMAX || op == KN_OP_LOG_SOFTMAX;
}
/* Segment s of k as a kernel of its own space (s = 0: k's top-level dims);
 * its instructions are [*i0, *i1) of k's. */
static inline void kn__kernel_seg(const kn_kernel *k, int s, int *i0, int *i1, int *ndim, const int64_t **ext,
                                  const int8_t **sym, const int64_t **mul) {
    int ns = k->nseg > 1 ? k->nseg : 1;
    *i0 = s == 0 ? 0 : k->seg[s].i0;
    *i1 = s + 1 < ns ? k->seg[s + 1].i0 : k->ninst;
    if (s == 0) { *ndim = k->ndim; *ext = k->ext; *sym = k->sym; *mul = k->mul; }
    else { *ndim = k->seg[s].ndim; *ext = k->seg[s].ext; *sym = k->seg[s].sym; *mul = k->seg[s].mul; }
}
/* Does k rope, scatter or gather (CUDA templates only, never unrolled)? */
static inline bool kn__kernel_indexed(const kn_kernel *k) {
    for (int i = 0; i < k->ninst; i++)
        if (k->inst[i].kind == KN_KI_ROPE || k->inst[i].kind == KN_KI_SCATTER || k->inst[i].kind == KN_KI_GATHER) return true;
    return false;
}
/* Items a thread of a CUDA elementwise kernel takes as one vector: 8
 * consecutive items along the last dim, each buffer read or written as 16
 * bytes (8 bf16, f16) or 32 (8 f32). Only when the last dim's extent is a
 * multiple of 8 (static, or a symbol times a multiple of 8), every buffer
 * walks it contiguously (or broadcasts it) with its other strides multiples
 * of 8, and the kernel has one space, no index op, f32 compute and no
 * searched unroll; else 1, an item a thread. The kernel also checks the
 * buffers' 16-byte alignment at run time and falls back to an item a
 * thread. Scalar 2-byte loads ran an 8B-shaped prompt's SwiGLU at 1.4 TB/s. */
static inline int kn__kernel_vec(const kn_kernel *k) {
    if (k->red != KN_OP_NONE || k->nseg > 1 || k->tune.unroll > 1 || k->f64 || k->ndim == 0 || kn__kernel_indexed(k)) return 1;
    int L = k->ndim - 1, nvec = 0;
    if ((k->sym[L] ? k->mul[L] : k->ext[L]) % 8) return 1;   /* a symbolic extent is syms[sym] * mul */
    for (int b = 0; b < k->nbuf; b++) {
        int64_t s = k->buf[b].st[L];
        size_t es = kn_dtype_get(k->buf[b].dt)->type_size;
        if (s == 0 && !k->buf[b].out) continue;   /* broadcast along the vector: one scalar load */
        if (s != 1 || (es != 2 && es != 4)) return 1;
        for (int d = 0; d < L; d++) if (k->buf[b].st[d] % 8) return 1;
        nvec++;
    }
    return nvec ? 8 : 1;
}
/* Items of a launch at the current symbol values (syms) and at their maxima. */
void kn__kernel_items(const kn_kernel *k, const int64_t *syms, int64_t *n, int64_t *n_max);

/* A group of the schedule that runs as one kernel. Its nodes run at the place
 * of its last node (order[last]); a node is stored when something outside the
 * group reads it (or it is an output, or has its own buffer); the others live
 * only in registers. */
typedef struct kn_fgroup {
    int nnode;
    kn_tensor *node[KN_KMAX_NODES]; /* in schedule order */
    uint8_t stored[KN_KMAX_NODES];
    int last;                       /* schedule index of node[nnode-1] */
    bool closed;                    /* ends in a reduction: nothing joins after it */
    bool tail;                      /* closed, and node[nnode-1] is a cast of the normalisation
                                     * node[nnode-2] that nothing else reads: the kernel stores the
                                     * normalised rows in the cast's dtype (fuse.c, join_tail) */
    kn_tensor *bt[KN_KERNEL_MAXBUF];/* the tensor (view) each kernel buffer is */
    kn_kernel k;
} kn_fgroup;

/* Finds the fusable groups of a rewritten schedule (order, n; sources read
 * through rep) and lowers each to a kernel for language lang ("c", "cuda":
 * a few templates exist in one only). Groups have 2 or more nodes.
 * *groups (malloc'd, *ngroups entries; NULL when none). false: out of host memory. */
/* Nodes fusion leaves alone whose reads are not their sources: a node that
 * runs a matmul with its epilogue or prologue (runtime/plan.c). is: is t
 * one? read: its k-th read (k < KN_MAX_SRC; NULL where none). */
typedef struct kn_fuse_opaque {
    bool (*is)(const void *ctx, const kn_tensor *t);
    kn_tensor *(*read)(const void *ctx, const kn_tensor *t, int k);
    const void *ctx;
} kn_fuse_opaque;
bool kn__fuse(const char *lang, kn_tensor *const *order, int n, int32_t n_ids, int nout, kn_tensor *const *outs,
              kn_tensor *const *rep, const kn_fuse_opaque *opq, kn_fgroup **groups, int *ngroups);

/* True when every read that group g makes of the storage of s is a read of s
 * itself at the kernel's item index (same shape, contiguous), so the group's
 * last node may write its result over s (in place). */
bool kn__fuse_aligned_reads(const kn_fgroup *g, const kn_tensor *s, kn_tensor *const *rep, int32_t n_ids);

/* May node m of group g (its last node or a stored one) write its result over
 * s, an operand of the group whose storage dies at the group? Every read of s's
 * storage in the group is at the item index, and no pass after the one that
 * writes m reads s. */
bool kn__fuse_inplace_ok(const kn_fgroup *g, const kn_tensor *m, const kn_tensor *s, kn_tensor *const *rep, int32_t n_ids);

/* The source of k in language lang ("c", "cuda"); names the kernel (k->name)
 * from a hash of the source. Returns the length written (excluding the NUL),
 * or -1 for an unknown language or when cap is too small. */
int kn__render(const char *lang, kn_kernel *k, char *buf, size_t cap);

/* ---- kernel search (search.c) ----------------------------------------------
 * t (NULL: all zero) with every 0 field replaced by k's heuristic value;
 * a reduction's unroll is always 1 (its loop is not unrolled). */
kn_ktune kn__ktune_resolve(const kn_kernel *k, const kn_ktune *t);
/* "block=256 unroll=1 waves=8 grain=16384" (the cache's text); length or -1. */
int kn__ktune_str(const kn_ktune *t, char *buf, size_t cap);
/* Parses kn__ktune_str's text (fields in any order, unknown ones ignored);
 * false when a value is not a positive number or nothing was read. */
bool kn__ktune_parse(const char *s, kn_ktune *t);

/* The cost of kernel k run with tunables t (resolved: no zero fields), in
 * seconds, measured by the caller (the runtime times it on the device:
 * src/runtime/tune.c); < 0 or not finite when this variant cannot run (it
 * failed to build), which drops it from the search. */
typedef double (*kn_ktime_fn)(void *ctx, const kn_kernel *k, const kn_ktune *t);

typedef struct kn_beam_opts {
    int width;          /* beam width: the N fastest variants kept each round (>= 1) */
    int max_rounds;     /* rounds of expansion (0: 8) */
    int max_timed;      /* timing calls in all, the default's included (0: 64) */
    double min_gain;    /* a round must beat the best so far by this fraction to go on (timing noise); 0: any gain */
} kn_beam_opts;

typedef struct kn_beam_result {
    kn_ktune best;      /* resolved; the default when nothing beat it */
    double t_default;   /* cost of the default (resolved heuristic) */
    double t_best;
    int ntimed;         /* calls of the timing function */
    int rounds;
} kn_beam_result;

/* BEAM search over k's tunables in language lang: start from the heuristic,
 * apply every single change (an action: one field set to one of its values)
 * to each of the `width` best so far, time the variants not seen before,
 * keep the `width` fastest of all, repeat until a round gains less than
 * min_gain (or the caps); then default and winner are timed again and the
 * winner must still win by min_gain. false when even the default could not
 * be timed (r->best is then the default). */
bool kn__beam_search(const kn_kernel *k, const char *lang, const kn_beam_opts *o, kn_ktime_fn time_fn,
                     void *ctx, kn_beam_result *r);
#endif
