/* sched.c: the engine thread of `kiln serve`: continuous batching over one
 * kn_batch (include/kiln_batch.h).
 *
 * Each iteration:
 *   1. ends the running jobs whose client went away or whose time is up
 *      (their sequence and KV blocks are freed at once);
 *   2. admits waiting jobs, oldest first, while a slot is free and the pool
 *      has room for the part of the prompt the prefix cache does not hold;
 *   3. builds one step: a decode item (the last sampled token) for every
 *      sequence past its prompt, then prompt chunks of the sequences still
 *      reading theirs, oldest first, within n_batch tokens, so a long
 *      prompt is read over several steps while the others keep decoding;
 *   4. runs kn_batch_step once; KN_ERR_LIMIT (the pool is out of blocks)
 *      ends the youngest sequence with a clear error and the step is built
 *      again;
 *   5. samples each sequence's token on the host (its own kn_sampler),
 *      decodes it to text (a streaming detokenizer: whole UTF-8 characters
 *      only), checks end of generation, stop strings (text that could be the
 *      start of one is held back until it is not), max_tokens, and pushes
 *      the text to the job's queue, which the HTTP thread drains.
 * With nothing to do the thread sleeps on a condition variable.
 */
#include "serve.h"
#include "kiln_batch.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct srv_run {
    int seq;
    int pos;                 /* prompt tokens in the sequence so far            */
    int32_t *toks;           /* [n_prompt + max_tokens]: prompt, then sampled   */
    int n_toks, n_gen;
    int64_t order;           /* admission order: the youngest has the largest   */
    kn_sampler *smp;
    kn_detok_stream *ds;
    sbuf gen;                /* generated text (kept while stop strings apply)  */
    size_t sent;             /* bytes of gen pushed to the job                  */
} srv_run;

struct srv_sched {
    kn_model *m;
    const kn_tokenizer *tok;
    kn_batch *b;
    srv_sched_opts o;
    srv_metrics *met;
    int n_vocab, n_ctx_seq, pool_tokens;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;      /* guards waiting, n_wait, stopping               */
    pthread_cond_t cv;
    bool stopping;
    srv_job **waiting;       /* [max_queue] FIFO                               */
    int n_wait;
    srv_job **running;       /* [n_parallel] by sequence id                    */
    int n_run;
    int64_t n_admitted;
    kn_batch_item *items;    /* [n_parallel]                                   */
    float *logits;           /* [n_parallel, n_vocab]                          */
    int32_t *top_ids;        /* [n_parallel, KN_MODEL_TOP_MAX]: sampling candidates */
    float *top_vals;         /* their logits                                   */
};

/* ---- ending a job ----------------------------------------------------------------------- */
static void run_free(srv_run *r) {
    if (!r) return;
    free(r->toks);
    kn_sampler_free(r->smp);
    kn_detok_stream_free(r->ds);
    sb_free(&r->gen);
    free(r);
}

/* ends running job j (sequence seq): the text so far is flushed unless it
 * ended with an error, the slot and its KV blocks are freed */
static void finish(srv_sched *s, srv_job *j, const char *reason, int status, const char *err) {
    srv_run *r = j->run;
    if (r) {
        kn_batch_seq_free(s->b, r->seq);
        s->running[r->seq] = NULL;
        s->n_run--;
        run_free(r);
        j->run = NULL;
        pthread_mutex_lock(&s->met->mu);
        s->met->slots_used = s->n_run;     /* at once: a client may ask /metrics as soon as it has its reply */
        pthread_mutex_unlock(&s->met->mu);
    }
    srv_job_end(j, reason, status, err);
    srv_metrics_done(s->met, j);
    srv_job_unref(j);
}

/* ---- text and stop strings -------------------------------------------------------------- */
/* Pushes the generated text that can no longer turn into a stop string;
 * true when a stop string was found (the text before it is pushed). With
 * final, everything left is pushed. */
static bool publish(srv_job *j, srv_run *r, bool final) {
    const char *g = r->gen.p ? r->gen.p : "";
    size_t len = r->gen.len, upto = len, hit = len;
    bool stopped = false;
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        size_t from = r->sent > sl ? r->sent - sl + 1 : 0;   /* a match may straddle what was held back */
        if (len >= sl && from <= len - sl) {
            const char *f = memmem(g + from, len - from, j->stop[i], sl);
            if (f && (size_t)(f - g) < hit) { hit = (size_t)(f - g); stopped = true; }
        }
    }
    if (stopped) upto = hit;
    else if (!final) {
        for (int i = 0; i < j->n_stop; i++) {   /* hold back a tail that begins a stop string */
            size_t sl = strlen(j->stop[i]);
            for (size_t k = sl - 1; k >= 1; k--) {
                if (k <= len - r->sent && !memcmp(g + len - k, j->stop[i], k)) {
                    if (len - k < upto) upto = len - k;
                    break;
                }
            }
        }
    }
    if (upto < r->sent) upto = r->sent;
    srv_job_push(j, g + r->sent, upto - r->sent, r->n_gen);
    r->sent = upto;
    return stopped;
}

/* one sampled token of job j: true when the job has ended */
static bool take_token(srv_sched *s, srv_job *j, int32_t t) {
    srv_run *r = j->run;
    if (kn_tokenizer_is_eog(s->tok, t)) {
        const char *txt; size_t n;
        if (kn_detok_stream_flush(r->ds, &txt, &n) == KN_OK && n) sb_add(&r->gen, txt, n);
        bool hit = publish(j, r, true);
        (void)hit;
        finish(s, j, "stop", 0, NULL);
        return true;
    }
    r->toks[r->n_toks++] = t;
    r->n_gen++;
    const char *txt = NULL; size_t n = 0;
    if (kn_detok_stream_push(r->ds, t, &txt, &n) != KN_OK) n = 0;
    bool last = r->n_gen >= j->max_tokens;
    if (last) {
        if (n) sb_add(&r->gen, txt, n);
        if (kn_detok_stream_flush(r->ds, &txt, &n) != KN_OK) n = 0;
    }
    if (n) sb_add(&r->gen, txt, n);
    if (r->gen.oom) { finish(s, j, NULL, 500, "out of memory"); return true; }
    if (publish(j, r, last)) { finish(s, j, "stop", 0, NULL); return true; }
    if (last) { finish(s, j, "length", 0, NULL); return true; }
    if (!j->n_stop) { r->gen.len = 0; r->sent = 0; }   /* nothing to search: keep no text */
    return false;
}

/* ---- admission ---------------------------------------------------------------------------- */
static srv_job *pop_waiting(srv_sched *s) {
    srv_job *j = s->waiting[0];
    memmove(s->waiting, s->waiting + 1, sizeof *s->waiting * (size_t)(s->n_wait - 1));
    s->n_wait--;
    return j;
}

/* true when j should end before (or instead of) its next step */
static bool gone(srv_sched *s, srv_job *j, double now) {
    if (atomic_load(&j->cancel)) {
        pthread_mutex_lock(&s->met->mu);
        s->met->disconnects++;
        pthread_mutex_unlock(&s->met->mu);
        finish(s, j, NULL, 499, "the client closed the connection");
        return true;
    }
    if (now > j->deadline) {
        pthread_mutex_lock(&s->met->mu);
        s->met->timeouts++;
        pthread_mutex_unlock(&s->met->mu);
        finish(s, j, NULL, 504, "the request ran past the server's time limit (kiln serve --timeout)");
        return true;
    }
    return false;
}

static void reap(srv_sched *s) {
    double now = srv_now();
    for (int q = 0; q < s->o.n_parallel; q++)
        if (s->running[q]) gone(s, s->running[q], now);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_wait;) {
        srv_job *j = s->waiting[i];
        if (atomic_load(&j->cancel) || now > j->deadline) {
            memmove(s->waiting + i, s->waiting + i + 1, sizeof *s->waiting * (size_t)(s->n_wait - i - 1));
            s->n_wait--;
            pthread_mutex_unlock(&s->mu);
            gone(s, j, now);
            pthread_mutex_lock(&s->mu);
        } else i++;
    }
    pthread_mutex_unlock(&s->mu);
}

static void admit(srv_sched *s) {
    while (s->n_run < s->o.n_parallel) {
        pthread_mutex_lock(&s->mu);
        srv_job *j = s->n_wait ? s->waiting[0] : NULL;
        pthread_mutex_unlock(&s->mu);
        if (!j) return;
        int seq = kn_batch_seq_new(s->b);
        if (seq < 0) return;
        int have = kn_batch_seq_reuse_prefix(s->b, seq, j->prompt, j->n_prompt);
        /* room for the rest of the prompt and the first generated token;
         * with nothing running all of the pool is free, so it always fits */
        if (s->n_run > 0 && kn_batch_free_tokens(s->b) < j->n_prompt - have + 1) {
            kn_batch_seq_free(s->b, seq);
            return;
        }
        pthread_mutex_lock(&s->mu);
        pop_waiting(s);
        pthread_mutex_unlock(&s->mu);
        srv_run *r = calloc(1, sizeof *r);
        if (r) {
            r->seq = seq;
            r->pos = have;
            r->order = s->n_admitted++;
            r->toks = malloc(sizeof(int32_t) * ((size_t)j->n_prompt + (size_t)j->max_tokens));
            r->smp = kn_sampler_new(&j->sp);
            if (r->toks) memcpy(r->toks, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
            r->n_toks = j->n_prompt;
        }
        if (!r || !r->toks || !r->smp || kn_detok_stream_new(s->tok, 0, &r->ds) != KN_OK) {
            run_free(r);
            kn_batch_seq_free(s->b, seq);
            finish(s, j, NULL, 500, "out of memory");
            continue;
        }
        j->run = r;
        s->running[seq] = j;
        s->n_run++;
        pthread_mutex_lock(&s->met->mu);
        s->met->prefix_reused += have;
        pthread_mutex_unlock(&s->met->mu);
    }
}

/* ---- one step ----------------------------------------------------------------------------- */
static srv_job *youngest(srv_sched *s) {
    srv_job *y = NULL;
    for (int q = 0; q < s->o.n_parallel; q++)
        if (s->running[q] && (!y || s->running[q]->run->order > y->run->order)) y = s->running[q];
    return y;
}

/* The job's sampler chooses from the best candidates (as many as the
 * engine returns) exactly as from all logits (no penalties, no logit
 * bias): on a GPU only they come back. */
static bool wants_top(const srv_sched *s, const srv_job *j) {
    return !j->n_bias && kn_sampler_top_ok(j->run->smp, s->n_vocab < KN_MODEL_TOP_MAX ? s->n_vocab : KN_MODEL_TOP_MAX);
}

static void step(srv_sched *s) {
    int n = 0, budget = s->o.n_batch;
    srv_job *owner[s->o.n_parallel > 0 ? s->o.n_parallel : 1];
    for (int q = 0; q < s->o.n_parallel; q++) {      /* decodes */
        srv_job *j = s->running[q];
        if (!j || j->run->pos < j->n_prompt) continue;
        srv_run *r = j->run;
        s->items[n] = (kn_batch_item){.seq = r->seq, .tokens = &r->toks[r->n_toks - 1], .n = 1, .logits = true, .top = wants_top(s, j)};
        owner[n++] = j;
        budget--;
    }
    for (;;) {                                       /* prompt chunks, oldest first */
        srv_job *next = NULL;
        for (int q = 0; q < s->o.n_parallel; q++) {
            srv_job *j = s->running[q];
            if (!j || j->run->pos >= j->n_prompt) continue;
            bool listed = false;
            for (int i = 0; i < n; i++) listed |= owner[i] == j;
            if (!listed && (!next || j->run->order < next->run->order)) next = j;
        }
        if (!next || budget <= 0) break;
        srv_run *r = next->run;
        int chunk = next->n_prompt - r->pos < budget ? next->n_prompt - r->pos : budget;
        s->items[n] = (kn_batch_item){.seq = r->seq, .tokens = next->prompt + r->pos, .n = chunk,
                                      .logits = r->pos + chunk == next->n_prompt, .top = wants_top(s, next)};
        owner[n++] = next;
        budget -= chunk;
    }
    if (!n) return;
    kn_status st = kn_batch_step_top(s->b, s->items, n, s->logits, s->top_ids, s->top_vals);
    if (st == KN_ERR_LIMIT) {
        srv_job *y = youngest(s);
        pthread_mutex_lock(&s->met->mu);
        s->met->preempted++;
        pthread_mutex_unlock(&s->met->mu);
        char msg[256];
        snprintf(msg, sizeof msg, "the KV cache is full (%d tokens shared by all requests): retry later, or start "
                 "kiln serve with a larger --ctx or a smaller --parallel", s->pool_tokens);
        finish(s, y, NULL, 503, msg);
        return;
    }
    if (st != KN_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "the engine failed: %s", kn_last_error());
        for (int i = 0; i < n; i++) finish(s, owner[i], NULL, 500, msg);
        return;
    }
    int tokens = 0, row = 0;
    for (int i = 0; i < n; i++) {
        tokens += s->items[i].n;
        srv_job *j = owner[i];
        srv_run *r = j->run;
        if (r->pos < j->n_prompt) r->pos += s->items[i].n;
        if (!s->items[i].logits) continue;
        int32_t t;
        if (s->items[i].top) {
            size_t o = (size_t)row++ * KN_MODEL_TOP_MAX;
            t = kn_sampler_sample_top(r->smp, s->top_ids + o, s->top_vals + o, kn_sampler_top_k(r->smp));
        } else {
            float *lg = s->logits + (size_t)row++ * (size_t)s->n_vocab;
            for (int b = 0; b < j->n_bias; b++)
                if (j->bias_ids[b] < s->n_vocab) lg[j->bias_ids[b]] += j->bias_vals[b];
            int hist = r->n_toks < j->sp.penalty_last_n ? r->n_toks : j->sp.penalty_last_n;
            t = kn_sampler_sample(r->smp, lg, s->n_vocab, r->toks + r->n_toks - hist, hist);
        }
        take_token(s, j, t);
    }
    pthread_mutex_lock(&s->met->mu);
    s->met->steps++;
    s->met->step_tokens += tokens;
    pthread_mutex_unlock(&s->met->mu);
}

static void gauges(srv_sched *s) {
    kn_batch_stats bs;
    kn_batch_get_stats(s->b, &bs);
    pthread_mutex_lock(&s->mu);
    int waiting = s->n_wait;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->met->mu);
    s->met->queue_len = waiting;
    s->met->slots_used = s->n_run;
    s->met->slots_total = s->o.n_parallel;
    s->met->kv_blocks_used = bs.blocks_used;
    s->met->kv_blocks_cached = bs.blocks_cached;
    s->met->kv_blocks_total = bs.blocks_total;
    s->met->kv_bytes = (int64_t)bs.kv_bytes;
    pthread_mutex_unlock(&s->met->mu);
}

static void *engine(void *arg) {
    srv_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && !s->n_wait && !s->n_run) pthread_cond_wait(&s->cv, &s->mu);
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        reap(s);
        admit(s);
        step(s);
        gauges(s);
    }
    for (int q = 0; q < s->o.n_parallel; q++)
        if (s->running[q]) finish(s, s->running[q], NULL, 503, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->n_wait) {
        srv_job *j = pop_waiting(s);
        pthread_mutex_unlock(&s->mu);
        finish(s, j, NULL, 503, "the server is shutting down");
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    gauges(s);
    return NULL;
}

/* ---- public --------------------------------------------------------------------------------- */
kn_status srv_sched_new(kn_model *m, const srv_sched_opts *o, srv_metrics *met, srv_sched **out) {
    *out = NULL;
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return kn_set_error(KN_ERR_NOMEM, "kiln serve: out of memory");
    s->m = m;
    s->tok = kn_model_tokenizer(m);
    s->o = *o;
    if (s->o.n_batch < s->o.n_parallel) s->o.n_batch = s->o.n_parallel;   /* every decode fits one step */
    s->met = met;
    s->n_vocab = kn_model_get_config(m)->n_vocab;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    kn_batch_opts bo = kn_batch_defaults();
    bo.n_seq_max = o->n_parallel;
    bo.n_ctx = o->n_ctx;
    bo.n_batch = o->n_batch;
    kn_status st = kn_batch_new(m, &bo, &s->b);
    if (st) { srv_sched_free(s); return st; }
    kn_batch_stats bs;
    kn_batch_get_stats(s->b, &bs);
    s->pool_tokens = bs.blocks_total * bs.block_size;
    s->n_ctx_seq = kn_model_n_ctx(m) < s->pool_tokens ? kn_model_n_ctx(m) : s->pool_tokens;
    s->waiting = calloc((size_t)o->max_queue + 1, sizeof *s->waiting);
    s->running = calloc((size_t)o->n_parallel, sizeof *s->running);
    s->items = calloc((size_t)o->n_parallel, sizeof *s->items);
    s->logits = malloc(sizeof(float) * (size_t)o->n_parallel * (size_t)s->n_vocab);
    s->top_ids = malloc(sizeof(int32_t) * (size_t)o->n_parallel * KN_MODEL_TOP_MAX);
    s->top_vals = malloc(sizeof(float) * (size_t)o->n_parallel * KN_MODEL_TOP_MAX);
    if (!s->waiting || !s->running || !s->items || !s->logits || !s->top_ids || !s->top_vals) {
        srv_sched_free(s);
        return kn_set_error(KN_ERR_NOMEM, "kiln serve: out of memory for %d slots", o->n_parallel);
    }
    gauges(s);
    if (pthread_create(&s->thread, NULL, engine, s)) {
        srv_sched_free(s);
        return kn_set_error(KN_ERR_NOMEM, "kiln serve: cannot start the engine thread");
    }
    s->started = true;
    *out = s;
    return KN_OK;
}

int srv_sched_pool_tokens(const srv_sched *s) { return s->n_ctx_seq; }

int srv_sched_submit(srv_sched *s, srv_job *j, char *msg, size_t cap) {
    int status = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        status = 503;
        snprintf(msg, cap, "the server is shutting down");
    } else if (s->n_wait >= s->o.max_queue) {
        status = 429;
        snprintf(msg, cap, "the server is busy: %d requests are waiting for one of the %d slots (kiln serve --queue "
                 "and --parallel); retry later", s->n_wait, s->o.n_parallel);
    } else {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        j->t_submit = srv_now();
        s->waiting[s->n_wait++] = j;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return status;
}

void srv_sched_stop(srv_sched *s) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = false;
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    srv_sched_stop(s);
    kn_batch_free(s->b);
    free(s->waiting);
    free(s->running);
    free(s->items);
    free(s->logits);
    free(s->top_ids); free(s->top_vals);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
