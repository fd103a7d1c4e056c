/* generate.c: the generation loop: tokenize, prefill through the plan in
 * batches, then decode one token per plan run, sampling, streaming complete
 * UTF-8 text to a callback, stopping at end-of-generation tokens, stop
 * strings, max tokens or the context limit. */
#include "kiln_llm.h"
#include "llm/model_impl.h"   /* defines: kn__model_eval_count */
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

kn_generate_params kn_generate_defaults(void) {
    kn_generate_params p = {0};
    p.sampling = kn_sampler_defaults();
    p.add_bos = true;
    p.parse_special = true;
    return p;
}

/* Text is held back while it could still be the start of a stop string. */
typedef struct { char *buf; size_t len, cap; } sbuf;
static bool sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t c = (b->cap ? b->cap * 2 : 256);
        while (c < b->len + n + 1) c *= 2;
        char *p = realloc(b->buf, c);
        if (!p) return false;
        b->buf = p; b->cap = c;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
    return true;
}

/* Stop strings must be real strings: an empty one would match everywhere
 * (and the hold-back scan below relies on a length of at least 1). */
static kn_status check_stops(const kn_generate_params *p) {
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return kn_set_error(KN_ERR_INVALID, "generate: n_stop is %d but stop is %s; pass n_stop stop strings or none",
                            p->n_stop, p->stop ? "set" : "NULL");
    for (int k = 0; k < p->n_stop; k++)
        if (!p->stop[k] || !p->stop[k][0])
            return kn_set_error(KN_ERR_INVALID, "generate: stop string %d is %s; give a non-empty text (--stop TEXT)",
                                k + 1, p->stop[k] ? "empty" : "NULL");
    return KN_OK;
}

/* Evaluates the prompt, leaving the last token's logits. With a progress
 * callback the prompt goes in chunks of the model's batch size, so that a
 * long prefill can be reported and cancelled between chunks; *done counts
 * the tokens evaluated (all of them unless *cancelled). */
static kn_status prefill(kn_model *m, const int32_t *prompt, int n, int n_past, float *logits,
                         const kn_generate_params *p, int *done, bool *cancelled) {
    *done = 0;
    *cancelled = false;
    if (!p->progress) {
        kn_status st = kn_model_eval(m, prompt, n, n_past, logits, false);
        if (!st) *done = n;
        return st;
    }
    int chunk = m->n_batch > 0 ? m->n_batch : n;
    if (!p->progress(p->progress_ud, 0, n)) { *cancelled = true; return KN_OK; }
    while (*done < n) {
        int T = n - *done < chunk ? n - *done : chunk;
        kn_status st = kn_model_eval(m, prompt + *done, T, n_past + *done, logits, false);
        if (st) return st;
        *done += T;
        if (!p->progress(p->progress_ud, *done, n)) { *cancelled = true; return KN_OK; }
    }
    return KN_OK;
}

static kn_status generate_reuse(kn_model *m, const int32_t *prompt, int n_prompt, const kn_generate_params *gp,
                                kn_token_cb cb, void *ud, kn_generate_stats *stats);

kn_status kn_generate_tokens(kn_model *m, const int32_t *prompt, int n_prompt, const kn_generate_params *gp,
                             kn_token_cb cb, void *ud, kn_generate_stats *stats) {
    kn_generate_params p = gp ? *gp : kn_generate_defaults();
    kn_generate_stats st0 = {0};
    kn_generate_stats *S = stats ? stats : &st0;
    memset(S, 0, sizeof *S);
    kn_status bad = check_stops(&p);
    if (bad) return bad;
    if (p.reuse) return generate_reuse(m, prompt, n_prompt, &p, cb, ud, S);
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int V = kn_model_get_config(m)->n_vocab, n_ctx = kn_model_n_ctx(m);
    if (n_prompt <= 0) return kn_set_error(KN_ERR_INVALID, "generate: empty prompt");
    if (p.n_past + n_prompt >= n_ctx)
        return kn_set_error(KN_ERR_LIMIT, "the prompt (%d tokens%s) does not fit the context length %d; shorten it or raise --ctx",
                            n_prompt, p.n_past ? " plus the conversation so far" : "", n_ctx);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n_ctx + 1));
    kn_sampler *smp = kn_sampler_new(&p.sampling);
    kn_detok_stream *ds = NULL;
    sbuf pend = {0};
    int nh = n_prompt, n_past = p.n_past;
    kn_status st = (!logits || !hist || !smp) ? kn_set_error(KN_ERR_NOMEM, "out of memory") : KN_OK;
    if (!st && tok) st = kn_detok_stream_new(tok, 0, &ds);
    if (st) goto out;
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    double t0 = now_s();
    int done;
    st = prefill(m, prompt, n_prompt, n_past, logits, &p, &done, &S->cancelled);
    S->prefill_s = now_s() - t0;
    S->n_prompt = done;
    n_past += done;
    if (st || S->cancelled) goto out;
    double t1 = now_s();
    bool stop = false;
    /* after the prompt's full logits, decode steps return only the sampler's
     * candidates where that chooses the same token (on a GPU: k ids and
     * logits cross the bus instead of the vocabulary's logits) */
    const int top_k = kn_sampler_top_ok(smp, V < KN_MODEL_TOP_MAX ? V : KN_MODEL_TOP_MAX) ? kn_sampler_top_k(smp) : 0;
    int32_t top_ids[KN_MODEL_TOP_MAX];
    float top_lg[KN_MODEL_TOP_MAX];
    for (int i = 0; !stop && (p.max_tokens <= 0 || i < p.max_tokens); i++) {
        int32_t t = i > 0 && top_k ? kn_sampler_sample_top(smp, top_ids, top_lg, top_k) : kn_sampler_sample(smp, logits, V, hist, nh);
        if (tok && kn_tokenizer_is_eog(tok, t)) break;
        hist[nh++] = t;
        S->n_generated++;
        const char *txt = ""; size_t len = 0;
        if (ds && (st = kn_detok_stream_push(ds, t, &txt, &len))) goto out;
        /* stop strings: emit only what can no longer begin a stop string */
        if (!sb_add(&pend, txt, len)) { st = kn_set_error(KN_ERR_NOMEM, "out of memory"); goto out; }
        size_t emit = pend.len;
        for (int k = 0; k < p.n_stop; k++) {
            const char *hit = p.stop[k][0] ? strstr(pend.buf, p.stop[k]) : NULL;
            if (hit) { emit = (size_t)(hit - pend.buf); stop = true; break; }
        }
        if (!stop)
            for (int k = 0; k < p.n_stop; k++) {
                size_t sl = strlen(p.stop[k]);
                for (size_t l = sl > pend.len ? pend.len : sl - 1; l > 0; l--)
                    if (!memcmp(pend.buf + pend.len - l, p.stop[k], l)) { if (pend.len - l < emit) emit = pend.len - l; break; }
            }
        if (cb && !cb(ud, t, pend.buf, emit)) stop = true;
        memmove(pend.buf, pend.buf + emit, pend.len - emit);
        pend.len -= emit;
        if (pend.buf) pend.buf[pend.len] = 0;
        if (stop) break;
        if (n_past + 1 > n_ctx - 0 || n_past >= n_ctx) { S->hit_context_limit = true; break; }
        st = top_k ? kn_model_eval_top(m, &t, 1, n_past, top_k, top_ids, top_lg) : kn_model_eval(m, &t, 1, n_past, logits, false);
        if (st) goto out;
        n_past++;
    }
    if (!stop && ds) {                            /* flush held-back bytes */
        const char *txt; size_t len;
        if (kn_detok_stream_flush(ds, &txt, &len) == KN_OK && len) sb_add(&pend, txt, len);
        if (cb && pend.len) cb(ud, -1, pend.buf, pend.len);
    }
    S->decode_s = now_s() - t1;
out:
    S->n_past_end = n_past;
    kn_detok_stream_free(ds);
    kn_sampler_free(smp);
    free(pend.buf); free(logits); free(hist);
    return st;
}

/* ---- KV cache reuse ---- */
typedef struct { kn_token_cb cb; void *ud; int32_t *out; int n, cap; } capture_cb;
static bool capture(void *ud, int32_t t, const char *text, size_t len) {
    capture_cb *c = ud;
    if (t >= 0 && c->n < c->cap) c->out[c->n++] = t;
    return c->cb ? c->cb(c->ud, t, text, len) : true;
}

void kn_kv_tokens_free(kn_kv_tokens *kv) {
    if (!kv) return;
    free(kv->ids);
    memset(kv, 0, sizeof *kv);
}

static kn_status generate_reuse(kn_model *m, const int32_t *prompt, int n_prompt, const kn_generate_params *gp,
                                kn_token_cb cb, void *ud, kn_generate_stats *stats) {
    kn_kv_tokens *kv = gp->reuse;
    kn_generate_params p = *gp;
    p.reuse = NULL;
    int n_ctx = kn_model_n_ctx(m), L = 0;
    if (kv->model != m || kv->stamp != kn__model_eval_count(m)) kv->n = 0;   /* the cache changed since */
    while (L < kv->n && L < n_prompt && kv->ids[L] == prompt[L]) L++;
    if (L >= n_prompt) L = n_prompt - 1;             /* the last prompt token gives the logits */
    if (L < 0) L = 0;
    if (kv->cap < n_ctx + 1) {
        int32_t *b = realloc(kv->ids, sizeof(int32_t) * (size_t)(n_ctx + 1));
        if (!b) return kn_set_error(KN_ERR_NOMEM, "out of memory");
        kv->ids = b; kv->cap = n_ctx + 1;
    }
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(n_ctx + 1));
    if (!gen) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    capture_cb cc = {cb, ud, gen, 0, n_ctx + 1};
    kn_generate_stats s0, *S = stats ? stats : &s0;
    p.n_past = L;
    kn_status st = kn_generate_tokens(m, prompt + L, n_prompt - L, &p, capture, &cc, S);
    if (st) kv->n = 0;
    else {
        /* the cache now holds the prompt and the generated tokens fed back */
        int n = S->n_past_end < n_ctx ? S->n_past_end : n_ctx;
        memcpy(kv->ids, prompt, sizeof(int32_t) * (size_t)(n < n_prompt ? n : n_prompt));
        for (int i = n_prompt; i < n; i++) kv->ids[i] = i - n_prompt < cc.n ? gen[i - n_prompt] : -1;
        kv->n = n;
        kv->model = m;
        kv->stamp = kn__model_eval_count(m);
    }
    free(gen);
    return st;
}

kn_status kn_generate(kn_model *m, const char *prompt, const kn_generate_params *gp,
                      kn_token_cb cb, void *ud, kn_generate_stats *stats) {
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    if (!tok) return kn_set_error(KN_ERR_STATE, "generate: the model has no tokenizer; load it with a tokenizer file "
                                  "(kn_model_opts.tokenizer_path, `kiln -z FILE`: tokenizer.json, a GGUF vocabulary or llama2.c tokenizer.bin)");
    kn_generate_params p = gp ? *gp : kn_generate_defaults();
    kn_status bad = check_stops(&p);
    if (bad) return bad;
    int cap = (int)strlen(prompt) + 8, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) return kn_set_error(KN_ERR_NOMEM, "out of memory");
    bool bos = p.add_bos && kn_tokenizer_add_bos(tok) && (p.n_past == 0 || p.reuse);
    kn_status st = kn_tokenize(tok, prompt, strlen(prompt), bos, p.parse_special, ids, cap, &n);
    if (st == KN_ERR_LIMIT) {
        int32_t *b = realloc(ids, sizeof(int32_t) * (size_t)n);
        if (!b) { free(ids); return kn_set_error(KN_ERR_NOMEM, "out of memory"); }
        ids = b; cap = n;
        st = kn_tokenize(tok, prompt, strlen(prompt), bos, p.parse_special, ids, cap, &n);
    }
    if (!st) st = kn_generate_tokens(m, ids, n, &p, cb, ud, stats);
    free(ids);
    return st;
}
