/* graph.c: dependency order of the nodes feeding a set of outputs, and the
 * Graphviz dump. */
#include "graph/graph.h"
#include <stdlib.h>
#include <string.h>

/* A node is "materialised" when its storage already holds its value: a leaf,
 * or an op node realized earlier (buf set and not a view of a pending node). */
static bool materialised(const kn_tensor *t) {
    if (t->op == KN_OP_NONE) return true;
    /* a view shares its storage owner's buffer but holds its value only when
     * the node it views does (a view of a pending effect is pending) */
    if (kn__is_view_op(t->op)) return t->src[0] && materialised(t->src[0]);
    if (kn_op_get(t->op)->kind == KN_KIND_EFFECT) return (t->flags & KN__FLAG_COMPUTED) != 0;
    return t->buf != NULL;
}

kn_status kn__toposort(kn_ctx *ctx, int nout, kn_tensor **outs, bool stop_at_realized,
                       kn_tensor ***order_out, int *n_out) {
    int32_t N = ctx->n_all;
    uint8_t *state = calloc((size_t)N, 1);          /* 0 new, 1 on stack, 2 done */
    kn_tensor **order = malloc(sizeof *order * (size_t)(N ? N : 1));
    kn_tensor **stack = malloc(sizeof *stack * (size_t)(N ? N : 1));
    int *next = malloc(sizeof *next * (size_t)(N ? N : 1));
    if (!state || !order || !stack || !next) {
        free(state); free(order); free(stack); free(next);
        return kn_set_error(KN_ERR_NOMEM, "out of memory sorting a graph of %d nodes", (int)N);
    }
    int n = 0;
    kn_status st = KN_OK;
    for (int o = 0; o < nout && st == KN_OK; o++) {
        kn_tensor *root = outs[o];
        if (!kn__alive(root)) { st = kn_set_error(KN_ERR_STATE, "plan: output %d was freed or is NULL", o); break; }
        if (state[root->id]) continue;
        int sp = 0;
        stack[sp] = root; next[sp] = 0; sp++; state[root->id] = 1;
        while (sp) {
            kn_tensor *t = stack[sp - 1];
            bool leaf = t->op == KN_OP_NONE || (stop_at_realized && materialised(t) && t != root);
            if (!leaf && next[sp - 1] < KN_MAX_SRC) {
                kn_tensor *s = t->src[next[sp - 1]++];
                if (!s) continue;
                if (!kn__alive(s)) { st = kn_set_error(KN_ERR_STATE, "%s node uses a freed tensor", kn_op_name(t->op)); break; }
                if (state[s->id] == 1) { st = kn_set_error(KN_ERR_STATE, "graph has a cycle at %s", kn_op_name(s->op)); break; }
                if (state[s->id] == 0) { state[s->id] = 1; stack[sp] = s; next[sp] = 0; sp++; }
                continue;
            }
            state[t->id] = 2;
            sp--;
            if (!leaf) order[n++] = t;
        }
    }
    free(state); free(stack); free(next);
    if (st != KN_OK) { free(order); return st; }
    *order_out = order; *n_out = n;
    return KN_OK;
}

kn_status kn_graph_dump_dot(kn_ctx *ctx, int nout, kn_tensor **outs, const char *path) {
    kn_tensor **order; int n;
    kn_status st = kn__toposort(ctx, nout, outs, false, &order, &n);
    if (st) return st;
    FILE *f = fopen(path, "w");
    if (!f) { free(order); return kn_set_error(KN_ERR_IO, "cannot write %s", path); }
    fprintf(f, "digraph kiln {\n  rankdir=TB; node [shape=box, fontname=monospace, fontsize=10];\n");
    uint8_t *seen = calloc((size_t)ctx->n_all, 1);
    for (int i = 0; i < n; i++) {
        kn_tensor *t = order[i];
        char s[160];
        const char *color = kn__is_view_op(t->op) ? "lightgrey" : (t->flags & KN_FLAG_REQUIRES_GRAD) ? "lightyellow" : "white";
        fprintf(f, "  n%d [label=\"%s%s%s\\n%s %s\", style=filled, fillcolor=%s];\n", t->id, kn_op_name(t->op),
                t->name[0] ? " " : "", t->name, kn_dtype_name(t->dtype), kn__shape_str(t, s, sizeof s), color);
        for (int k = 0; k < KN_MAX_SRC; k++) {
            kn_tensor *x = t->src[k];
            if (!x) continue;
            if (x->op == KN_OP_NONE && seen && !seen[x->id]) {
                seen[x->id] = 1;
                fprintf(f, "  n%d [label=\"%s\\n%s %s\", shape=ellipse];\n", x->id,
                        x->name[0] ? x->name : (x->flags & KN_FLAG_PARAM) ? "param" : (x->flags & KN_FLAG_INPUT) ? "input" : "data",
                        kn_dtype_name(x->dtype), kn__shape_str(x, s, sizeof s));
            }
            fprintf(f, "  n%d -> n%d;\n", x->id, t->id);
        }
    }
    fprintf(f, "}\n");
    free(seen);
    free(order);
    return fclose(f) == 0 ? KN_OK : kn_set_error(KN_ERR_IO, "error writing %s", path);
}
