/* cmd_perplexity.c: kiln perplexity, the perplexity of a text file under a model. */
#include "cli.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int cmd_perplexity(const cli_args *a) {
    if (!a->file) { fprintf(stderr, "kiln perplexity: no text file (-f FILE)\n"); return 2; }
    size_t got;
    char *text = cli_read_file("-f", a->file, &got);
    if (!text) return 1;
    kn_model *m = cli_load(a);
    if (!m) { free(text); return 1; }
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int cap = (int)got + 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    kn_status st = kn_tokenize(tok, text, got, true, false, ids, cap, &n);
    int rc = 0;
    if (st) { fprintf(stderr, "kiln: %s\n", kn_last_error()); rc = 1; }
    int V = kn_model_get_config(m)->n_vocab, chunk = kn_model_n_ctx(m);
    float *logits = malloc(sizeof(float) * (size_t)chunk * V);
    double nll = 0; long count = 0;
    for (int s = 0; !rc && s + 1 < n; s += chunk) {
        int len = n - s < chunk ? n - s : chunk;
        if (kn_model_eval(m, ids + s, len, 0, logits, true)) { fprintf(stderr, "kiln: %s\n", kn_last_error()); rc = 1; break; }
        for (int i = 0; i + 1 < len; i++) {
            const float *l = logits + (size_t)i * V;
            float mx = l[0];
            for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
            double se = 0;
            for (int v = 0; v < V; v++) se += exp((double)l[v] - mx);
            nll += -((double)l[ids[s + i + 1]] - mx - log(se));
            count++;
        }
        fprintf(stderr, "\r%ld tokens, perplexity so far %.4f", count, exp(nll / (double)(count ? count : 1)));
    }
    if (!rc) printf("\nperplexity: %.4f over %ld tokens (%.4f nats/token)\n", exp(nll / count), count, nll / count);
    free(logits); free(ids); free(text);
    kn_model_free(m);
    return rc;
}
