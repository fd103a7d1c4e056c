/* ops_einsum.c: kn_einsum, Einstein summation built from existing ops (no
 * node of its own), as torch.einsum does it without opt_einsum:
 *
 *   1. parse: each operand's subscripts become label ids ('A'-'Z' 0..25,
 *      'a'-'z' 26..51: the implicit output is sorted in that order, as
 *      torch), "..." becomes ids 52.. aligned on the right across operands;
 *   2. per operand: a label repeated inside it takes the diagonal (x times
 *      an eye mask, summed over the second copy: differentiable, O(n^2) in
 *      that label's size), then labels no other operand and not the output
 *      need are summed out;
 *   3. operands are contracted left to right: labels in both that are needed
 *      later are batch dims, labels in both that are not are contracted, the
 *      rest are left / right dims; [batch, L, K] @ [batch, K, R] through
 *      kn_matmul (which broadcasts batch dims of size 1), or a broadcast
 *      multiply when nothing is contracted;
 *   4. the result is permuted into the output's order.
 * A size-1 dim broadcasts against the other operands' size of its label (a
 * contracted label of size 1 on one side is first summed out on the other).
 *
 * Every malformed spec is an error naming the position or the operand.
 */
#include "graph/graph.h"
#include <stdio.h>
#include <string.h>

#define NLAB (52 + KN_MAX_DIMS)     /* letters, then ellipsis dims */
#define MAXOPS 64

typedef struct {
    kn_tensor *t;
    int n;                          /* dims */
    int lab[KN_MAX_DIMS];           /* label id of each dim */
} eterm;

static int label_id(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return 26 + c - 'a';
    return -1;
}
static char label_char(int id) { return id < 26 ? (char)('A' + id) : id < 52 ? (char)('a' + id - 26) : '.'; }

/* One term: labels (ellipsis as -1) into lab[], count into *n, *ell = has "...".
 * s[pos..end) is the term; errors name the absolute position. */
static bool parse_term(kn_ctx *ctx, const char *spec, int pos, int end, int *lab, int *n, bool *ell, const char *what) {
    *n = 0;
    *ell = false;
    for (int i = pos; i < end; i++) {
        char c = spec[i];
        if (c == ' ') continue;
        if (c == '.') {
            if (i + 2 >= end || spec[i + 1] != '.' || spec[i + 2] != '.') {
                kn__fail(ctx, KN_ERR_INVALID, "einsum: a '.' at position %d of \"%s\" that is not part of \"...\" (%s)", i, spec, what);
                return false;
            }
            if (*ell) {
                kn__fail(ctx, KN_ERR_INVALID, "einsum: a second \"...\" at position %d of \"%s\" (%s); one per term", i, spec, what);
                return false;
            }
            *ell = true;
            if (*n >= KN_MAX_DIMS) goto too_many;
            lab[(*n)++] = -1;
            i += 2;
            continue;
        }
        int id = label_id(c);
        if (id < 0) {
            if ((unsigned char)c >= 32 && (unsigned char)c < 127)
                kn__fail(ctx, KN_ERR_INVALID, "einsum: unexpected '%c' at position %d of \"%s\" (%s); subscripts are letters a-z, A-Z and \"...\"",
                         c, i, spec, what);
            else
                kn__fail(ctx, KN_ERR_INVALID, "einsum: unexpected byte 0x%02x at position %d of the spec (%s); subscripts are letters a-z, A-Z and \"...\"",
                         (unsigned char)c, i, what);
            return false;
        }
        if (*n >= KN_MAX_DIMS) goto too_many;
        lab[(*n)++] = id;
    }
    return true;
too_many:
    kn__fail(ctx, KN_ERR_LIMIT, "einsum: %s of \"%s\" has more than %d subscripts (kiln tensors have at most %d dims)", what, spec,
             KN_MAX_DIMS, KN_MAX_DIMS);
    return false;
}

/* sizes of every label over the terms; false on a mismatch */
static bool label_sizes(kn_ctx *ctx, const char *spec, eterm *T, int n, int64_t *size) {
    for (int l = 0; l < NLAB; l++) size[l] = -1;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < T[i].n; d++) {
            int l = T[i].lab[d];
            int64_t s = T[i].t->shape[d];
            if (size[l] < 0 || size[l] == 1) size[l] = s;
            else if (s != 1 && s != size[l]) {
                char a[160];
                if (l < 52)
                    kn__fail(ctx, KN_ERR_INVALID, "einsum: subscript '%c' has size %lld in operand %d %s but %lld elsewhere in \"%s\" "
                             "(sizes must match or be 1)", label_char(l), (long long)s, i, kn__shape_str(T[i].t, a, sizeof a),
                             (long long)size[l], spec);
                else
                    kn__fail(ctx, KN_ERR_INVALID, "einsum: the dims under \"...\" do not broadcast: operand %d %s has %lld where "
                             "another operand has %lld (\"%s\")", i, kn__shape_str(T[i].t, a, sizeof a), (long long)s,
                             (long long)size[l], spec);
                return false;
            }
        }
    return true;
}

static int find(const int *lab, int n, int l) {
    for (int i = 0; i < n; i++) if (lab[i] == l) return i;
    return -1;
}

/* sum out dim d of e */
static bool sum_dim(kn_ctx *ctx, eterm *e, int d) {
    e->t = kn_sum(ctx, e->t, 1, &d, false);
    for (int k = d; k < e->n - 1; k++) e->lab[k] = e->lab[k + 1];
    e->n--;
    return e->t != NULL;
}

/* the diagonal of dims p < q (same label, same size) at p; q dropped */
static bool diagonal(kn_ctx *ctx, eterm *e, int p, int q) {
    int64_t m = e->t->shape[p];
    int64_t shape[KN_MAX_DIMS];
    for (int k = 0; k < e->n; k++) shape[k] = k == p || k == q ? m : 1;
    kn_tensor *eye = kn_reshape(ctx, kn_eye(ctx, e->t->dtype, m, m), e->n, shape);
    e->t = kn_mul(ctx, e->t, eye);
    return e->t && sum_dim(ctx, e, q);
}

/* move e's dims into the label order lab[0..n) (every label of e once) */
static kn_tensor *to_order(kn_ctx *ctx, eterm *e, const int *lab, int n) {
    int perm[KN_MAX_DIMS];
    bool id = true;
    for (int k = 0; k < n; k++) { perm[k] = find(e->lab, e->n, lab[k]); id &= perm[k] == k; }
    return id ? e->t : kn_permute(ctx, e->t, perm);
}

/* A (.) B keeping the labels in keep[] (plus nothing else) */
static bool contract(kn_ctx *ctx, eterm *A, eterm *B, const bool *keep, eterm *out) {
    /* labels only on one side and not kept: summed out first */
    for (int d = A->n - 1; d >= 0; d--)
        if (!keep[A->lab[d]] && find(B->lab, B->n, A->lab[d]) < 0 && !sum_dim(ctx, A, d)) return false;
    for (int d = B->n - 1; d >= 0; d--)
        if (!keep[B->lab[d]] && find(A->lab, A->n, B->lab[d]) < 0 && !sum_dim(ctx, B, d)) return false;
    int bl[KN_MAX_DIMS], ll[KN_MAX_DIMS], rl[KN_MAX_DIMS], kl[KN_MAX_DIMS], nb = 0, nl = 0, nr = 0, nk = 0;
    for (int d = 0; d < A->n; d++) {
        int l = A->lab[d], j = find(B->lab, B->n, l);
        if (j < 0) ll[nl++] = l;
        else if (keep[l]) bl[nb++] = l;
        else {
            /* contracted: a size-1 side is summed on the other first */
            int64_t sa = A->t->shape[d], sb = B->t->shape[j];
            if (sa != sb && sa == 1 && !sum_dim(ctx, B, j)) return false;
            if (sa != sb && sb == 1 && !sum_dim(ctx, A, d)) return false;
            if (sa != sb) { d = -1; nb = nl = nk = 0; continue; }   /* now one-sided: classify again from the start */
            kl[nk++] = l;
        }
    }
    for (int d = 0; d < B->n; d++)
        if (find(A->lab, A->n, B->lab[d]) < 0) rl[nr++] = B->lab[d];
    int64_t L = 1, R = 1, K = 1;
    int64_t bsz[KN_MAX_DIMS];
    for (int k = 0; k < nb; k++) {
        int64_t sa = A->t->shape[find(A->lab, A->n, bl[k])], sb = B->t->shape[find(B->lab, B->n, bl[k])];
        bsz[k] = sa > sb ? sa : sb;
    }
    for (int k = 0; k < nl; k++) L *= A->t->shape[find(A->lab, A->n, ll[k])];
    for (int k = 0; k < nr; k++) R *= B->t->shape[find(B->lab, B->n, rl[k])];
    for (int k = 0; k < nk; k++) K *= A->t->shape[find(A->lab, A->n, kl[k])];
    if (nb + nl + nr > KN_MAX_DIMS) {
        kn__fail(ctx, KN_ERR_LIMIT, "einsum: an intermediate result would have %d dims (at most %d)", nb + nl + nr, KN_MAX_DIMS);
        return false;
    }
    int oa[KN_MAX_DIMS], ob[KN_MAX_DIMS];
    int64_t sh[KN_MAX_DIMS];
    kn_tensor *y;
    if (nk == 0) {
        /* nothing contracted: broadcast multiply [batch, left, 1..] * [batch, 1.., right] */
        for (int k = 0; k < nb; k++) oa[k] = bl[k];
        for (int k = 0; k < nl; k++) oa[nb + k] = ll[k];
        for (int k = 0; k < nb; k++) ob[k] = bl[k];
        for (int k = 0; k < nr; k++) ob[nb + k] = rl[k];
        kn_tensor *a = to_order(ctx, A, oa, nb + nl), *b = to_order(ctx, B, ob, nb + nr);
        int64_t sa[KN_MAX_DIMS], sb[KN_MAX_DIMS];
        for (int k = 0; k < nb + nl; k++) sa[k] = a ? a->shape[k] : 1;
        for (int k = 0; k < nr; k++) sa[nb + nl + k] = 1;
        for (int k = 0; k < nb; k++) sb[k] = b ? b->shape[k] : 1;
        for (int k = 0; k < nl; k++) sb[nb + k] = 1;
        for (int k = 0; k < nr; k++) sb[nb + nl + k] = b ? b->shape[nb + k] : 1;
        int nd = nb + nl + nr;
        y = nd ? kn_mul(ctx, kn_reshape(ctx, a, nd, sa), kn_reshape(ctx, b, nd, sb)) : kn_mul(ctx, a, b);
    } else {
        for (int k = 0; k < nb; k++) oa[k] = ob[k] = bl[k];
        for (int k = 0; k < nl; k++) oa[nb + k] = ll[k];
        for (int k = 0; k < nk; k++) { oa[nb + nl + k] = kl[k]; ob[nb + k] = kl[k]; }
        for (int k = 0; k < nr; k++) ob[nb + nk + k] = rl[k];
        kn_tensor *a = to_order(ctx, A, oa, nb + nl + nk), *b = to_order(ctx, B, ob, nb + nk + nr);
        if (!a || !b) return false;
        int64_t sa[KN_MAX_DIMS], sb[KN_MAX_DIMS];
        for (int k = 0; k < nb; k++) { sa[k] = a->shape[k]; sb[k] = b->shape[k]; }
        sa[nb] = L; sa[nb + 1] = K;
        sb[nb] = K; sb[nb + 1] = R;
        y = kn_matmul(ctx, kn_reshape(ctx, a, nb + 2, sa), kn_reshape(ctx, b, nb + 2, sb));   /* [batch, L, R] */
        for (int k = 0; k < nb; k++) sh[k] = bsz[k];
        for (int k = 0; k < nl; k++) sh[nb + k] = A->t->shape[find(A->lab, A->n, ll[k])];
        for (int k = 0; k < nr; k++) sh[nb + nl + k] = B->t->shape[find(B->lab, B->n, rl[k])];
        int nd = nb + nl + nr;
        if (y) y = kn_reshape(ctx, y, nd, sh);
    }
    if (!y) return false;
    out->t = y;
    out->n = 0;
    for (int k = 0; k < nb; k++) out->lab[out->n++] = bl[k];
    for (int k = 0; k < nl; k++) out->lab[out->n++] = ll[k];
    for (int k = 0; k < nr; k++) out->lab[out->n++] = rl[k];
    return true;
}

kn_tensor *kn_einsum(kn_ctx *ctx, const char *spec, int n, kn_tensor **operands) {
    if (!ctx) return NULL;
    if (!spec) return kn__fail(ctx, KN_ERR_INVALID, "einsum: the spec is NULL");
    if (n < 1 || n > MAXOPS || !operands)
        return kn__fail(ctx, KN_ERR_INVALID, "einsum: %d operands; give 1 to %d", n, MAXOPS);
    for (int i = 0; i < n; i++) if (!operands[i]) return NULL;
    size_t slen = strlen(spec);
    if (slen > 4096) return kn__fail(ctx, KN_ERR_INVALID, "einsum: the spec is %zu bytes long (at most 4096)", slen);
    int len = (int)slen;
    const char *arrow = strstr(spec, "->");
    int lhs_end = arrow ? (int)(arrow - spec) : len;
    if (arrow && strstr(arrow + 2, "->"))
        return kn__fail(ctx, KN_ERR_INVALID, "einsum: a second \"->\" at position %d of \"%s\"", (int)(strstr(arrow + 2, "->") - spec), spec);
    for (int i = 0; i < len; i++)
        if (spec[i] == '-' && !(arrow && i == lhs_end)) return kn__fail(ctx, KN_ERR_INVALID, "einsum: a '-' at position %d of \"%s\" that is not part of \"->\"", i, spec);
        else if (spec[i] == '>' && !(arrow && i == lhs_end + 1)) return kn__fail(ctx, KN_ERR_INVALID, "einsum: a '>' at position %d of \"%s\" that is not part of \"->\"", i, spec);
        else if (spec[i] == ',' && i > lhs_end) return kn__fail(ctx, KN_ERR_INVALID, "einsum: a ',' at position %d of \"%s\" in the output; it has one term", i, spec);
    /* terms */
    int nterm = 1;
    for (int i = 0; i < lhs_end; i++) nterm += spec[i] == ',';
    if (nterm != n)
        return kn__fail(ctx, KN_ERR_INVALID, "einsum: \"%s\" has %d input term%s but %d operand%s given", spec, nterm, nterm == 1 ? "" : "s",
                        n, n == 1 ? " was" : "s were");
    eterm T[MAXOPS];
    int raw[MAXOPS][KN_MAX_DIMS], nraw[MAXOPS];
    bool ell[MAXOPS];
    int emax = 0;
    for (int i = 0, pos = 0; i < n; i++) {
        int end = pos;
        while (end < lhs_end && spec[end] != ',') end++;
        char what[32];
        snprintf(what, sizeof what, "operand %d", i);
        if (!parse_term(ctx, spec, pos, end, raw[i], &nraw[i], &ell[i], what)) return NULL;
        kn_tensor *x = operands[i];
        int nl = nraw[i] - ell[i];
        char a[160];
        if (x->ndim < nl || (!ell[i] && x->ndim != nl))
            return kn__fail(ctx, KN_ERR_INVALID, "einsum: operand %d %s has %d dims but its term (positions %d..%d of \"%s\") names %d%s",
                            i, kn__shape_str(x, a, sizeof a), x->ndim, pos, end - 1, spec, nl, ell[i] ? " plus \"...\"" : "");
        for (int d = 0; d < x->ndim; d++)
            if (x->sym[d]) return kn__fail(ctx, KN_ERR_INVALID, "einsum: operand %d %s has a symbolic dim; einsum needs fixed extents", i, kn__shape_str(x, a, sizeof a));
        if (ell[i] && x->ndim - nl > emax) emax = x->ndim - nl;
        pos = end + 1;
    }
    /* label ids per dim; ellipsis dims right-aligned to 52 + (emax - ne + k) */
    int count[NLAB] = {0};
    for (int i = 0; i < n; i++) {
        kn_tensor *x = operands[i];
        int ne = x->ndim - (nraw[i] - ell[i]);
        T[i].t = x;
        T[i].n = 0;
        for (int k = 0; k < nraw[i]; k++) {
            if (raw[i][k] >= 0) { T[i].lab[T[i].n++] = raw[i][k]; count[raw[i][k]]++; continue; }
            for (int j = 0; j < ne; j++) { T[i].lab[T[i].n++] = 52 + emax - ne + j; count[52 + emax - ne + j]++; }
        }
    }
    /* output labels */
    int olab[KN_MAX_DIMS + 1], no = 0;
    bool in_out[NLAB] = {false};
    if (arrow) {
        int r[KN_MAX_DIMS], nr;
        bool oell;
        if (!parse_term(ctx, spec, lhs_end + 2, len, r, &nr, &oell, "the output")) return NULL;
        for (int k = 0; k < nr; k++) {
            if (r[k] < 0) {
                if (no + emax > KN_MAX_DIMS) return kn__fail(ctx, KN_ERR_LIMIT, "einsum: the output of \"%s\" has more than %d dims", spec, KN_MAX_DIMS);
                for (int j = 0; j < emax; j++) { olab[no++] = 52 + j; in_out[52 + j] = true; }
                continue;
            }
            if (!count[r[k]])
                return kn__fail(ctx, KN_ERR_INVALID, "einsum: output subscript '%c' of \"%s\" appears in no input term", label_char(r[k]), spec);
            if (in_out[r[k]])
                return kn__fail(ctx, KN_ERR_INVALID, "einsum: output subscript '%c' of \"%s\" is repeated; each may appear once", label_char(r[k]), spec);
            olab[no++] = r[k];
            in_out[r[k]] = true;
        }
    } else {
        for (int j = 0; j < emax; j++) { olab[no++] = 52 + j; in_out[52 + j] = true; }
        for (int l = 0; l < 52; l++)
            if (count[l] == 1) {
                if (no >= KN_MAX_DIMS) return kn__fail(ctx, KN_ERR_LIMIT, "einsum: the output of \"%s\" has more than %d dims", spec, KN_MAX_DIMS);
                olab[no++] = l; in_out[l] = true;
            }
    }
    int64_t size[NLAB];
    /* repeated labels inside an operand: sizes must agree exactly (a diagonal) */
    for (int i = 0; i < n; i++)
        for (int p = 0; p < T[i].n; p++)
            for (int q = p + 1; q < T[i].n; q++)
                if (T[i].lab[p] == T[i].lab[q] && T[i].t->shape[p] != T[i].t->shape[q]) {
                    char a[160];
                    return kn__fail(ctx, KN_ERR_INVALID, "einsum: subscript '%c' is repeated in operand %d %s (a diagonal) but its dims "
                                    "have sizes %lld and %lld", label_char(T[i].lab[p]), i, kn__shape_str(T[i].t, a, sizeof a),
                                    (long long)T[i].t->shape[p], (long long)T[i].t->shape[q]);
                }
    if (!label_sizes(ctx, spec, T, n, size)) return NULL;
    /* 2. diagonals, then labels only this operand has (and the output lacks) */
    for (int i = 0; i < n; i++) {
        for (int p = 0; p < T[i].n; p++)
            for (int q = T[i].n - 1; q > p; q--)
                if (T[i].lab[p] == T[i].lab[q] && !diagonal(ctx, &T[i], p, q)) return NULL;
        for (int d = T[i].n - 1; d >= 0; d--) {
            int l = T[i].lab[d];
            bool other = in_out[l];
            for (int j = 0; j < n && !other; j++) other = j != i && find(T[j].lab, T[j].n, l) >= 0;
            if (!other && !sum_dim(ctx, &T[i], d)) return NULL;
        }
    }
    /* 3. left to right */
    eterm acc = T[0];
    for (int i = 1; i < n; i++) {
        bool keep[NLAB];
        for (int l = 0; l < NLAB; l++) {
            keep[l] = in_out[l];
            for (int j = i + 1; j < n && !keep[l]; j++) keep[l] = find(T[j].lab, T[j].n, l) >= 0;
        }
        eterm r;
        if (!contract(ctx, &acc, &T[i], keep, &r)) return NULL;
        acc = r;
    }
    /* 4. what is left but not in the output (one operand: nothing else did it), then the order */
    for (int d = acc.n - 1; d >= 0; d--)
        if (!in_out[acc.lab[d]] && !sum_dim(ctx, &acc, d)) return NULL;
    /* an output label of size 1 here but larger elsewhere cannot happen: sizes broadcast in the products */
    return no ? to_order(ctx, &acc, olab, no) : acc.t;
}
