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
    float *prob;
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
    free(s->idx); free(s->prob); free(s);
}

static const float *g_sort_logits;
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

int32_t kn_sampler_sample(kn_sampler *s, float *logits, int V, const int32_t *hist, int nh) {
    const kn_sampler_params *p = &s->p;
    apply_penalties(p, logits, V, hist, nh);
    s->step++;
    if (p->temp <= 0) {                       /* greedy: first maximum */
        int32_t best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    if (s->cap < V) {
        free(s->idx); free(s->prob);
        s->idx = malloc(sizeof(int32_t) * (size_t)V);
        s->prob = malloc(sizeof(float) * (size_t)V);
        if (!s->idx || !s->prob) { s->cap = 0; return 0; }
        s->cap = V;
    }
    int n = V;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    g_sort_logits = logits;
    if (p->top_k > 0 && p->top_k < V) {
        /* partial selection: keep the k largest, then sort those */
        int k = p->top_k;
        int32_t *ix = s->idx;
        int lo = 0, hi = V - 1;
        while (lo < hi) {                     /* quickselect on logits, descending */
            float piv = logits[ix[(lo + hi) / 2]];
            int i = lo, j = hi;
            while (i <= j) {
                while (logits[ix[i]] > piv) i++;
                while (logits[ix[j]] < piv) j--;
                if (i <= j) { int32_t t = ix[i]; ix[i] = ix[j]; ix[j] = t; i++; j--; }
            }
            if (k - 1 <= j) hi = j; else if (k - 1 >= i) lo = i; else break;
        }
        n = k;
    }
    qsort(s->idx, (size_t)n, sizeof(int32_t), by_logit_desc);
    /* softmax with temperature over the candidates */
    float mx = logits[s->idx[0]];
    double sum = 0;
    for (int i = 0; i < n; i++) { s->prob[i] = expf((logits[s->idx[i]] - mx) / p->temp); sum += s->prob[i]; }
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
    for (int i = 0; i < n; i++) { c += s->prob[i]; if (u < c) return s->idx[i]; }
    return s->idx[n - 1];
}
