/* quantize_rules.c: which type each tensor of a `kiln quantize` / `kiln
 * convert` output gets: llama.cpp's llama_tensor_get_type (llama-quant.cpp)
 * for the targets kiln writes, without an importance matrix.
 *
 *   eligible     2+ dims, a ".weight", not a norm, router, position or
 *                token-type table, not marked no_quant; others keep their type.
 *   output       output.weight, or token_embd.weight when there is none (tied):
 *                Q6_K for every quantized target but Q8_0 (pure: the target).
 *   per layer    for the K targets (llama.cpp's *_S and *_M files):
 *                  attn_v (and attn_qkv, attn_kv_b, which llama.cpp counts
 *                  with it): Q4_K_S -> Q5_K for the first 4 of them;
 *                  Q4_K_M, Q5_K_M -> Q6_K where use_more_bits(i, n);
 *                  ffn_down: Q4_K_S -> Q5_K for i < n/8; Q4_K_M, Q5_K_M ->
 *                  Q6_K where use_more_bits(i, n);
 *                  8 experts: attn_output Q5_K (Q4_K_S, Q4_K_M);
 *                for every quantized target, 8 experts: attn_v, attn_k Q8_0.
 *                use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2:
 *                the first and last eighth of the layers and every third between.
 *                i counts the quantized attn_v-like tensors (n: all of them) in
 *                llama.cpp's order (layer number, then name), or the quantized
 *                ffn_down tensors (not the biases) in that order with n the
 *                layer count; with experts (n_expert > 1), ffn_down's i is the
 *                layer in its name.
 *   fallback     rows that are not whole blocks of the chosen type: Q4_K ->
 *                Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else (or still not whole)
 *                F16 (llama.cpp stops with an error where kiln takes F16).
 * Non-goals: the Q2/Q3/IQ mixes (no quantizers), llama.cpp's 70B attn_v
 * bump (a Llama of 80 layers with grouped heads: kiln does not see the
 * architecture here), Falcon's rules, user overrides (--tensor-type).
 */
#include "llm/quantize_impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { C_OTHER, C_OUTPUT, C_EMBD, C_ATTN_V, C_ATTN_K, C_ATTN_OUT, C_FFN_DOWN } cat;

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static bool is_float(kn_dtype t) { return t == KN_F32 || t == KN_F16 || t == KN_BF16; }

/* Is this a matrix llama.cpp quantizes? */
static bool eligible(const kn__qt *t) {
    return !t->no_quant && t->n_dims >= 2 && ends_with(t->name, ".weight") && !strstr(t->name, "_norm.weight") &&
           !strstr(t->name, "ffn_gate_inp") && strcmp(t->name, "position_embd.weight") &&
           strcmp(t->name, "token_types.weight") && !strstr(t->name, "rope_factors");
}

/* llama.cpp's tensor categories, tested in its order (attn_qkv before attn_v, ...) */
static cat category(const char *nm) {
    if (!strcmp(nm, "output.weight")) return C_OUTPUT;
    if (!strcmp(nm, "token_embd.weight")) return C_EMBD;
    if (strstr(nm, "attn_qkv.weight") || strstr(nm, "attn_kv_b.weight") || strstr(nm, "attn_v.weight")) return C_ATTN_V;
    if (strstr(nm, "attn_k.weight")) return C_ATTN_K;
    if (strstr(nm, "attn_q.weight")) return C_OTHER;
    if (strstr(nm, "attn_output.weight")) return C_ATTN_OUT;
    if (strstr(nm, "ffn_up") || strstr(nm, "ffn_gate")) return C_OTHER;
    if (strstr(nm, "ffn_down")) return C_FFN_DOWN;
    return C_OTHER;
}

static int layer_of(const char *name) {
    int l = -1;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama.cpp's order of tensors: layer number (none first), then name */
typedef struct { int layer; const char *name; int64_t i; } ord;
static int cmp_order(const void *a, const void *b) {
    const ord *x = a, *y = b;
    return x->layer != y->layer ? (x->layer > y->layer) - (x->layer < y->layer) : strcmp(x->name, y->name);
}

static kn_dtype fallback(kn_dtype want, int64_t ne0) {
    if (ne0 % kn_dtype_get(want)->block_size == 0) return want;
    want = want == KN_Q4_K ? KN_Q5_0 : want == KN_Q5_K ? KN_Q5_1 : want == KN_Q6_K ? KN_Q8_0 : KN_F16;
    return ne0 % kn_dtype_get(want)->block_size ? KN_F16 : want;
}

kn_status kn__qpick_types(const kn__qt *ts, int64_t n, const kn_quantize_params *p, kn_dtype *type) {
    bool has_output = false;
    int n_layer = 0, n_expert = 0, n_wv = 0;
    for (int64_t i = 0; i < n; i++) {
        has_output |= !strcmp(ts[i].name, "output.weight");
        if (layer_of(ts[i].name) + 1 > n_layer) n_layer = layer_of(ts[i].name) + 1;
        if (strstr(ts[i].name, "_exps.weight") && ts[i].n_dims == 3) n_expert = (int)ts[i].ne[2];
        n_wv += category(ts[i].name) == C_ATTN_V;
    }
    ord *order = malloc(sizeof *order * (size_t)(n + 1));
    int *idx = malloc(sizeof *idx * (size_t)(n + 1));           /* [n] i of attn_v / ffn_down tensors */
    if (!order || !idx) { free(order); free(idx); return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < n; i++) order[i] = (ord){layer_of(ts[i].name), ts[i].name, i};
    qsort(order, (size_t)n, sizeof *order, cmp_order);
    for (int64_t k = 0, iv = 0, id = 0; k < n; k++) {
        int64_t i = order[k].i;
        cat c = eligible(&ts[i]) ? category(ts[i].name) : C_OTHER;          /* llama.cpp counts what */
        idx[i] = c == C_ATTN_V ? (int)iv++ : c == C_FFN_DOWN ? (int)id++ : -1;   /* it quantizes */
    }
    kn_dtype t = p->type;
    bool k4 = t == KN_Q4_K, kq = k4 || t == KN_Q5_K, m = kq && p->mix == KN_QUANT_MIX_M;
    for (int64_t i = 0; i < n; i++) {
        const kn__qt *q = &ts[i];
        if (!eligible(q)) { type[i] = q->keep_type; continue; }
        kn_dtype want = t;
        cat c = category(q->name);
        if (c == C_EMBD && !has_output) c = C_OUTPUT;          /* tied: the output matrix */
        if (!p->pure && !is_float(t)) {
            if (c == C_OUTPUT) {
                if (q->ne[0] % kn_dtype_get(t)->block_size) want = KN_Q8_0;
                else if (t != KN_Q8_0) want = KN_Q6_K;
            } else if (c == C_ATTN_V) {
                if (m && use_more_bits(idx[i], n_wv)) want = KN_Q6_K;
                else if (k4 && !m && idx[i] < 4) want = KN_Q5_K;
                if (n_expert == 8) want = KN_Q8_0;
            } else if (c == C_ATTN_K) {
                if (n_expert == 8) want = KN_Q8_0;
            } else if (c == C_FFN_DOWN && kq) {
                int l = n_expert > 1 ? layer_of(q->name) : idx[i];
                if (m && use_more_bits(l, n_layer)) want = KN_Q6_K;
                else if (k4 && !m && l < n_layer / 8) want = KN_Q5_K;
            } else if (c == C_ATTN_OUT && k4 && n_expert == 8) {
                want = KN_Q5_K;
            }
        }
        type[i] = fallback(want, q->ne[0]);
    }
    free(order); free(idx);
    return KN_OK;
}
