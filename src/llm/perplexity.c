/* perplexity.c: the perplexity of a token sequence under a model, with the
 * windows and scored tokens of llama.cpp's perplexity tool (kiln_llm.h says
 * which). Memory stays small whatever the text's length: a window is
 * evaluated in chunks, the unscored head without logits, the scored rows a
 * few at a time, and each row's log-softmax is summed as it comes. */
#include "kiln.h"
#include "kiln_llm.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scored rows per evaluation: their logits are 256 x 49152 floats = 50 MB
 * for SmolLM2, whatever the text and context; fewer rows per call cost time
 * (64 rows: about 40% slower on SmolLM2, each call has a fixed cost). */
#define PPL_ROWS 256

/* -log softmax(logits)[target], in double */
static double row_nll(const float *logits, int V, int32_t target) {
    float mx = logits[0];
    for (int v = 1; v < V; v++) if (logits[v] > mx) mx = logits[v];
    double se = 0;
    for (int v = 0; v < V; v++) se += exp((double)logits[v] - (double)mx);
    return log(se) - ((double)logits[target] - (double)mx);
}

/* One window: tokens win[0..C) at positions 0..C-1 from an empty cache;
 * adds the nll of win[j+1] for j in [first, C-1). */
static kn_status score_window(kn_model *m, const int32_t *win, int C, int first, float *buf,
                              double *nll, long *count) {
    int V = kn_model_get_config(m)->n_vocab;
    kn_status st;
    if (first > 0 && (st = kn_model_eval(m, win, first, 0, buf, false))) return st;
    /* the window's last token predicts nothing scored: it is not evaluated */
    for (int j = first; j < C - 1; j += PPL_ROWS) {
        int R = C - 1 - j < PPL_ROWS ? C - 1 - j : PPL_ROWS;
        if ((st = kn_model_eval(m, win + j, R, j, buf, true))) return st;
        for (int r = 0; r < R; r++) {
            int32_t target = win[j + r + 1];
            if (target < 0 || target >= V)
                return kn_set_error(KN_ERR_INVALID, "perplexity: token id %d is outside the vocabulary (%d)", target, V);
            *nll += row_nll(buf + (size_t)r * V, V, target);
        }
        *count += R;
    }
    return KN_OK;
}

kn_status kn_model_perplexity(kn_model *m, const int32_t *tokens, int n, const kn_perplexity_params *pp,
                              kn_perplexity_result *out) {
    if (!m || !tokens || !out) return kn_set_error(KN_ERR_INVALID, "kn_model_perplexity: NULL model, tokens or result");
    kn_perplexity_params p = pp ? *pp : (kn_perplexity_params){0};
    memset(out, 0, sizeof *out);
    int C = kn_model_n_ctx(m), S = p.stride;
    int n_win, first;
    if (S < 0 || (S > 0 && S >= C))
        return kn_set_error(KN_ERR_INVALID, "perplexity: the stride must be between 1 and the context length - 1 (%d), got %d",
                            C - 1, S);
    if (S == 0) {
        first = C / 2;
        if (C - 1 - first < 1)
            return kn_set_error(KN_ERR_INVALID, "perplexity: a context of %d scores nothing (each window scores its "
                                "second half); use --ctx 3 or more", C);
        if (n < C)
            return kn_set_error(KN_ERR_INVALID, "perplexity: the text has %d token%s, too few to score with a context of %d "
                                "(one window of %d tokens is needed); use a longer text or a smaller --ctx", n, n == 1 ? "" : "s", C, C);
        n_win = n / C;
    } else {
        first = C - S - 1;
        if (n <= C)
            return kn_set_error(KN_ERR_INVALID, "perplexity: the text has %d token%s, too few to score with a context of %d "
                                "and a stride (at least %d are needed); use a longer text or a smaller --ctx", n, n == 1 ? "" : "s", C, C + 1);
        n_win = (int)(((long)n - C + S - 1) / S);
    }
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int32_t bos = tok && kn_tokenizer_add_bos(tok) ? kn_tokenizer_bos(tok) : -1;
    int V = kn_model_get_config(m)->n_vocab;
    float *buf = malloc(sizeof(float) * (size_t)PPL_ROWS * (size_t)V);
    int32_t *win = malloc(sizeof(int32_t) * (size_t)C);
    if (!buf || !win) { free(buf); free(win); return kn_set_error(KN_ERR_NOMEM, "perplexity: out of memory"); }
    kn_status st = KN_OK;
    if (p.progress && !p.progress(p.progress_ud, 0, n_win)) out->cancelled = true;
    for (int i = 0; i < n_win && !st && !out->cancelled; i++) {
        long start = S == 0 ? (long)i * C : (long)i * S;
        memcpy(win, tokens + start, sizeof(int32_t) * (size_t)C);
        /* llama.cpp's default windows each begin with BOS, as the text does;
         * its strided windows restore the token before they are evaluated */
        if (S == 0 && bos >= 0) win[0] = bos;
        st = score_window(m, win, C, first, buf, &out->nll, &out->count);
        if (!st) out->n_windows++;
        if (!st && p.progress && !p.progress(p.progress_ud, i + 1, n_win)) out->cancelled = true;
    }
    free(buf); free(win);
    if (st) return st;
    out->ppl = out->count ? exp(out->nll / (double)out->count) : NAN;
    return KN_OK;
}
