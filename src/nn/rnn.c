/* rnn.c: RNN (tanh/relu), GRU and LSTM cells and multi-layer layers,
 * unrolled over time in the graph (T steps = T copies of the cell's ops).
 * Gate order and parameter names follow torch.nn: GRU r,z,n; LSTM i,f,g,o.
 * x [B,T,in] (batch first), h [B,H]. */
#include "nn-impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { kn_rnn_kind kind; int64_t in, hidden; int layers; bool bias; } rnn_t;

static int gates(kn_rnn_kind k) { return k == KN_RNN_GRU ? 3 : k == KN_RNN_LSTM ? 4 : 1; }
static const char *kind_name(kn_rnn_kind k, bool cell) {
    static const char *n[2][4] = {{"RNN", "RNN", "GRU", "LSTM"}, {"RNNCell", "RNNCell", "GRUCell", "LSTMCell"}};
    return n[cell][k];
}

/* one step: x [B,in], h [B,H]; LSTM: *c [B,H] replaced */
static kn_tensor *cell_step(kn_ctx *ctx, kn_rnn_kind kind, int64_t H, kn_tensor *x, kn_tensor *h, kn_tensor **c,
                            kn_tensor *wih, kn_tensor *whh, kn_tensor *bih, kn_tensor *bhh) {
    kn_tensor *gi = kn_linear(ctx, x, wih, bih), *gh = kn_linear(ctx, h, whh, bhh);   /* [B,G*H] */
    switch (kind) {
    case KN_RNN_TANH: return kn_tanh(ctx, kn_add(ctx, gi, gh));
    case KN_RNN_RELU: return kn_relu(ctx, kn_add(ctx, gi, gh));
    case KN_RNN_GRU: {
        kn_tensor *r = kn_sigmoid(ctx, kn_add(ctx, kn_narrow(ctx, gi, 1, 0, H), kn_narrow(ctx, gh, 1, 0, H)));
        kn_tensor *z = kn_sigmoid(ctx, kn_add(ctx, kn_narrow(ctx, gi, 1, H, H), kn_narrow(ctx, gh, 1, H, H)));
        kn_tensor *n = kn_tanh(ctx, kn_add(ctx, kn_narrow(ctx, gi, 1, 2 * H, H), kn_mul(ctx, r, kn_narrow(ctx, gh, 1, 2 * H, H))));
        /* (1-z)*n + z*h = n + z*(h-n) */
        return kn_add(ctx, n, kn_mul(ctx, z, kn_sub(ctx, h, n)));
    }
    case KN_RNN_LSTM: {
        kn_tensor *s = kn_add(ctx, gi, gh);
        kn_tensor *i = kn_sigmoid(ctx, kn_narrow(ctx, s, 1, 0, H));
        kn_tensor *f = kn_sigmoid(ctx, kn_narrow(ctx, s, 1, H, H));
        kn_tensor *g = kn_tanh(ctx, kn_narrow(ctx, s, 1, 2 * H, H));
        kn_tensor *o = kn_sigmoid(ctx, kn_narrow(ctx, s, 1, 3 * H, H));
        kn_tensor *cn = kn_add(ctx, kn_mul(ctx, f, *c), kn_mul(ctx, i, g));
        *c = cn;
        return kn_mul(ctx, o, kn_tanh(ctx, cn));
    }
    }
    return NULL;
}

static kn_status add_weights(kn_module *m, const char *suffix, kn_rnn_kind kind, int64_t in, int64_t H, bool bias) {
    char nm[64];
    int64_t G = gates(kind) * H;
    double k = 1.0 / sqrt((double)H);
    const char *base[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int j = 0; j < (bias ? 4 : 2); j++) {
        snprintf(nm, sizeof nm, "%s%s", base[j], suffix);
        int64_t shape[2] = {G, j == 0 ? in : H};
        kn_tensor *t = kn__param_new(m, nm, j < 2 ? 2 : 1, shape, j >= 2, NULL);   /* looked up by name in forward */
        if (!t || kn_init_uniform(t, -k, k)) return KN_ERR_INVALID;
    }
    return KN_OK;
}

static kn_module *rnn_new(kn_ctx *ctx, bool cell, kn_rnn_kind kind, int64_t in, int64_t hidden, int layers, bool bias) {
    if ((int)kind < 0 || kind > KN_RNN_LSTM || in <= 0 || hidden <= 0 || layers <= 0) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: kind %d, input size %lld, hidden size %lld and layers %d must be valid and positive",
                 cell ? "RNNCell" : "RNN", (int)kind, (long long)in, (long long)hidden, layers);
        return NULL;
    }
    rnn_t *r = calloc(1, sizeof *r);
    kn_module *m = kn_module_new(ctx, kind_name(kind, cell), NULL, r, true);
    if (!m) return NULL;
    r->kind = kind; r->in = in; r->hidden = hidden; r->layers = layers; r->bias = bias;
    for (int l = 0; l < layers; l++) {
        char suf[16] = "";
        if (!cell) snprintf(suf, sizeof suf, "_l%d", l);
        if (add_weights(m, suf, kind, l == 0 ? in : hidden, hidden, bias)) { kn_module_free(m); return NULL; }
    }
    return m;
}
kn_module *kn_rnn_cell_new(kn_ctx *ctx, kn_rnn_kind kind, int64_t in, int64_t hidden, bool bias) {
    return rnn_new(ctx, true, kind, in, hidden, 1, bias);
}
kn_module *kn_rnn_new(kn_ctx *ctx, kn_rnn_kind kind, int64_t in, int64_t hidden, int n_layers, bool bias) {
    return rnn_new(ctx, false, kind, in, hidden, n_layers, bias);
}

static bool is_rnn(const kn_module *m, bool cell) {
    const char *k = m->kind;
    bool rnn = !strncmp(k, "RNN", 3) || !strncmp(k, "GRU", 3) || !strncmp(k, "LSTM", 4);
    return m->impl && rnn && cell == (strstr(k, "Cell") != NULL);
}

static kn_tensor *layer_param(kn_module *m, int j, int l, bool cell) {
    static const char *base[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    char nm[64];
    if (cell) snprintf(nm, sizeof nm, "%s", base[j]);
    else snprintf(nm, sizeof nm, "%s_l%d", base[j], l);
    return kn_module_find(m, nm);
}

kn_tensor *kn_rnn_cell_forward(kn_module *m, kn_tensor *x, kn_tensor *h, kn_tensor **c) {
    if (!m || !x || !h) return NULL;
    if (!is_rnn(m, true)) return kn__mod_fail(m, "kn_rnn_cell_forward needs an RNN/GRU/LSTM cell");
    rnn_t *r = m->impl;
    if (!kn__mod_check(m, x, 2, 2, 1, r->in, "x [B,in]") || !kn__mod_check(m, h, 2, 2, 1, r->hidden, "h [B,H]")) return NULL;
    if (x->shape[0] != h->shape[0]) return kn__mod_fail(m, "x and h batch sizes differ (%lld vs %lld)", (long long)x->shape[0], (long long)h->shape[0]);
    if (r->kind == KN_RNN_LSTM && (!c || !*c)) return kn__mod_fail(m, "LSTM needs the cell state c [B,H]");
    if (r->kind == KN_RNN_LSTM && !kn_same_shape(*c, h)) return kn__mod_fail(m, "c must have h's shape [B,H]");
    return cell_step(m->ctx, r->kind, r->hidden, x, h, c, layer_param(m, 0, 0, true), layer_param(m, 1, 0, true),
                     layer_param(m, 2, 0, true), layer_param(m, 3, 0, true));
}

kn_tensor *kn_rnn_forward(kn_module *m, kn_tensor *x, kn_tensor *h0, kn_tensor *c0, kn_tensor **h_n, kn_tensor **c_n) {
    if (!m || !x) return NULL;
    if (!is_rnn(m, false)) return kn__mod_fail(m, "kn_rnn_forward needs an RNN/GRU/LSTM module (not a cell)");
    rnn_t *r = m->impl;
    kn_ctx *ctx = m->ctx;
    if (!kn__mod_check(m, x, 3, 3, 2, r->in, "x [B,T,in]")) return NULL;
    int64_t B = x->shape[0], T = x->shape[1], H = r->hidden, L = r->layers;
    int64_t hs[3] = {L, B, H};
    char s[160];
    if (h0 && (h0->ndim != 3 || memcmp(h0->shape, hs, sizeof hs)))
        return kn__mod_fail(m, "h0 must be [layers,B,H] = [%lld,%lld,%lld], got %s", (long long)L, (long long)B, (long long)H, kn__shape_str(h0, s, sizeof s));
    if (c0 && (c0->ndim != 3 || memcmp(c0->shape, hs, sizeof hs)))
        return kn__mod_fail(m, "c0 must be [layers,B,H], got %s", kn__shape_str(c0, s, sizeof s));
    if (T <= 0) return kn__mod_fail(m, "sequence length must be >= 1");
    kn_tensor **steps = malloc(sizeof *steps * (size_t)T);
    kn_tensor *hl[KN_MAX_DIMS * 8], *cl[KN_MAX_DIMS * 8];
    if (!steps || L > KN_MAX_DIMS * 8) { free(steps); return kn__mod_fail(m, "too many layers or out of memory"); }
    kn_tensor *out = x;
    for (int l = 0; l < L; l++) {
        kn_tensor *h = h0 ? kn_select(ctx, h0, 0, l) : kn_zeros(ctx, x->dtype, 2, (int64_t[]){B, H});
        kn_tensor *c = c0 ? kn_select(ctx, c0, 0, l) : kn_zeros(ctx, x->dtype, 2, (int64_t[]){B, H});
        kn_tensor *w[4];
        for (int j = 0; j < 4; j++) w[j] = layer_param(m, j, l, false);
        for (int64_t t = 0; t < T; t++) {
            h = cell_step(ctx, r->kind, H, kn_select(ctx, out, 1, t), h, &c, w[0], w[1], w[2], w[3]);
            steps[t] = h;
        }
        hl[l] = h; cl[l] = c;
        out = kn_stack(ctx, steps, (int)T, 1);                                   /* [B,T,H] */
    }
    free(steps);
    if (h_n) *h_n = kn_stack(ctx, hl, (int)L, 0);
    if (c_n) *c_n = r->kind == KN_RNN_LSTM ? kn_stack(ctx, cl, (int)L, 0) : NULL;
    return out;
}
