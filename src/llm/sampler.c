/* sampler.c: picking the next token from logits.
 * Order (as llama.cpp applies them): penalties -> temperature 0 (greedy) or
 * top-k -> softmax with temperature -> top-p -> min-p -> draw. The draw uses
 * the counter-based generator (seed, step) so a seed reproduces a run. */
#include "core/core.h"
#include "kiln_llm.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kn_sampler {
    kn_sampler_params p;
    uint64_t step;
    int cap;
    int32_t *idx;     /* candidate ids, sorted by logit */
    float *prob, *lg; /* their probabilities and logits */
};

kn_sampler_params kn_sampler_defaults(void) {
    kn_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                           .freq_penalty = 0, .presence_penalty = 0, .penalty_last_n = 64, .seed = 42};
    return p;
}

kn_sampler *kn_sampler_new(const kn_sampler_params *p) {
    kn_sampler *s = calloc(1, sizeof *s);
    if (!s) { kn_set_error(KN_ERR_NOMEM, "out of memory"); return NULL; }
    s->p = p ? *p : kn_sampler_defaults();
    return s;
}
void kn_sampler_free(kn_sampler *s) {
    if (!s) return;
    free(s->idx); free(s->prob); free(s->lg); free(s);
}

static _Thread_local const float *g_sort_logits;   /* qsort's comparison reads it: one per thread */
static int by_logit_desc(const void *a, const void *b) {
    float x = g_sort_logits[*(const int32_t *)a], y = g_sort_logits[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;   /* ties: lower id first (stable) */
}

static void apply_penalties(const kn_sampler_params *p, float *logits, int V, const int32_t *hist, int nh) {
    if (p->repeat_penalty == 1.0f && p->freq_penalty == 0 && p->presence_penalty == 0) return;
    int start = (p->penalty_last_n > 0 && nh > p->penalty_last_n) ? nh - p->penalty_last_n : 0;
    for (int i = start; i < nh; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= V) continue;
        int count = 0;
        bool first = true;
        for (int j = start; j < nh; j++) {
            if (hist[j] == t) { count++; if (j < i) first = false; }
        }
        if (!first) continue;               /* each distinct token once */
        float l = logits[t];
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)count * p->freq_penalty + p->presence_penalty;
        logits[t] = l;
    }
}

/* The k best ids of logits[0..V) into idx, best first: by logit, equal
 * logits by the lower id (the order of the TOPK op, so that candidates a
 * device selected are the ones chosen here). idx holds V ids on entry
 * (scratch); returns k. */
static int select_sorted(const float *logits, int V, int k, int32_t *idx) {
    for (int i = 0; i < V; i++) idx[i] = i;
    if (k < V) {
        /* quickselect for the k-th largest value, then the ids above it and
         * the lowest ids equal to it, in id order */
        int32_t *ix = idx;
        int lo = 0, hi = V - 1;
        while (lo < hi) {
            float piv = logits[ix[(lo + hi) / 2]];
            int i = lo, j = hi;
            while (i <= j) {
                while (logits[ix[i]] > piv) i++;
                while (logits[ix[j]] < piv) j--;
                if (i <= j) { int32_t t = ix[i]; ix[i] = ix[j]; ix[j] = t; i++; j--; }
            }
            if (k - 1 <= j) hi = j; else if (k - 1 >= i) lo = i; else break;
        }
        float thr = logits[ix[k - 1]];
        int n = 0;
        for (int i = 0; i < V; i++) if (logits[i] > thr) idx[n++] = i;
        for (int i = 0; i < V && n < k; i++) if (logits[i] == thr) idx[n++] = i;
        V = k;
    }
    g_sort_logits = logits;
    qsort(idx, (size_t)V, sizeof(int32_t), by_logit_desc);
    return V;
}

/* The draw from n candidates, best first (ids[i] with logit lg[i]):
 * softmax with temperature, top-p, min-p. */
static int32_t draw(kn_sampler *s, const int32_t *ids, const float *lg, int n) {
    const kn_sampler_params *p = &s->p;
    float mx = lg[0];
    double sum = 0;
    for (int i = 0; i < n; i++) { s->prob[i] = expf((lg[i] - mx) / p->temp); sum += s->prob[i]; }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p < 1.0f) {
        double c = 0;
        int keep = n;
        for (int i = 0; i < n; i++) { c += s->prob[i]; if (c >= p->top_p) { keep = i + 1; break; } }
        n = keep;
    }
    if (p->min_p > 0) {
        float thr = p->min_p * s->prob[0];
        int keep = 1;
        while (keep < n && s->prob[keep] >= thr) keep++;
        n = keep;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += s->prob[i];
    double u = kn_rand_at(KN_RAND_UNIFORM, 0, 1, p->seed, s->step) * tot, c = 0;
    for (int i = 0; i < n; i++) { c += s->prob[i]; if (u < c) return ids[i]; }
    return ids[n - 1];
}

static bool reserve(kn_sampler *s, int n) {
    if (s->cap >= n) return true;
    free(s->idx); free(s->prob); free(s->lg);
    s->idx = malloc(sizeof(int32_t) * (size_t)n);
    s->prob = malloc(sizeof(float) * (size_t)n);
    s->lg = malloc(sizeof(float) * (size_t)n);
    s->cap = s->idx && s->prob && s->lg ? n : 0;
    return s->cap > 0;
}

int32_t kn_sampler_sample(kn_sampler *s, float *logits, int V, const int32_t *hist, int nh) {
    const kn_sampler_params *p = &s->p;
    apply_penalties(p, logits, V, hist, nh);
    s->step++;
    if (p->temp <= 0) {                       /* greedy: first maximum */
        int32_t best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    if (!reserve(s, V)) return 0;
    int n = select_sorted(logits, V, p->top_k > 0 && p->top_k < V ? p->top_k : V, s->idx);
    for (int i = 0; i < n; i++) s->lg[i] = logits[s->idx[i]];
    return draw(s, s->idx, s->lg, n);
}

bool kn_sampler_top_ok(const kn_sampler *s, int k_max) {
    const kn_sampler_params *p = &s->p;
    if (p->repeat_penalty != 1.0f || p->freq_penalty != 0 || p->presence_penalty != 0) return false;
    return p->temp <= 0 || (p->top_k >= 1 && p->top_k <= k_max);
}

int kn_sampler_top_k(const kn_sampler *s) { return s->p.temp <= 0 ? 1 : s->p.top_k; }

int32_t kn_sampler_sample_top(kn_sampler *s, const int32_t *ids, const float *logits, int k) {
    const kn_sampler_params *p = &s->p;
    s->step++;
    if (k < 1) return 0;
    if (p->temp <= 0) return ids[0];
    int n = p->top_k < k ? p->top_k : k;
    if (!reserve(s, n)) return 0;
    return draw(s, ids, logits, n);
}

void kn__top_select(const float *logits, int V, int k, int32_t *scratch, int32_t *ids, float *vals) {
    int n = select_sorted(logits, V, k, scratch);
    for (int i = 0; i < n; i++) { ids[i] = scratch[i]; vals[i] = logits[scratch[i]]; }
}
