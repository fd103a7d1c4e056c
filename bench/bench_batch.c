/* bench_batch.c: the batched engine (include/kiln_batch.h) on SmolLM2-135M
 * Q4_1, CPU: aggregate decode tokens/s with 1, 4 and 16 sequences stepped
 * together (each step one token per sequence, after a 32-token prompt each),
 * next to the single-sequence kn_model_eval decode rate; and the resident
 * memory of the model alone, of an idle batch (--parallel 16, the model's
 * context as the shared pool), and after the decode run. CPU ms/token: the
 * process's CPU time (both threads) per token, steadier than tok/s when
 * other work shares the machine.
 * Usage: bench_batch [decode_steps=32] [model path]
 * (KN_SMOLLM2 or models/SmolLM2-135M-Instruct.Q4_1.gguf; skipped when absent)
 */
#include "kiln_batch.h"
#include "kn_bench.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* process CPU seconds (all threads): less disturbed than wall time on a shared machine */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}

enum { PROMPT = 32 };

/* n sequences: prompts in one step, then `steps` decode steps of n tokens */
static double batch_rate(kn_model *m, int n, int steps, double *rss_after, double *cpu_ms_tok) {
    int V = kn_model_get_config(m)->n_vocab;
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = n;
    kn_batch *b;
    if (kn_batch_new(m, &o, &b)) { fprintf(stderr, "bench_batch: %s\n", kn_last_error()); return 0; }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n * PROMPT), *next = malloc(sizeof(int32_t) * (size_t)n);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    kn_batch_item *it = malloc(sizeof *it * (size_t)n);
    for (int i = 0; i < n * PROMPT; i++) tok[i] = 1 + (i * 7919) % (V - 1);
    for (int s = 0; s < n; s++) it[s] = (kn_batch_item){kn_batch_seq_new(b), tok + s * PROMPT, PROMPT, true};
    kn_status st = kn_batch_step(b, it, n, lg);
    double t0 = kn_bench_now(), c0 = cpu_s();
    for (int k = 0; k < steps && !st; k++) {
        for (int s = 0; s < n; s++) {
            const float *l = lg + (size_t)s * V;
            int a = 0;
            for (int j = 1; j < V; j++) if (l[j] > l[a]) a = j;
            next[s] = a;
            it[s] = (kn_batch_item){it[s].seq, &next[s], 1, true};
        }
        st = kn_batch_step(b, it, n, lg);
    }
    double dt = kn_bench_now() - t0;
    *cpu_ms_tok = (cpu_s() - c0) * 1e3 / ((double)n * steps);
    if (st) fprintf(stderr, "bench_batch: %s\n", kn_last_error());
    *rss_after = rss_mb();
    kn_batch_free(b);
    free(tok); free(next); free(lg); free(it);
    return st ? 0 : (double)n * steps / dt;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 32;
    const char *path = argc > 2 ? argv[2] : getenv("KN_SMOLLM2") ? getenv("KN_SMOLLM2") : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(path, "rb");
    if (!f) { printf("bench_batch: %s missing (make run fetches it): skipped\n", path); return 0; }
    fclose(f);
    double rss0 = rss_mb();
    kn_model *m;
    if (kn_model_load(path, NULL, &m)) { fprintf(stderr, "bench_batch: %s\n", kn_last_error()); return 1; }
    double rss_load = rss_mb();
    int V = kn_model_get_config(m)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t p[PROMPT];
    for (int i = 0; i < PROMPT; i++) p[i] = 1 + (i * 7919) % (V - 1);
    kn_model_eval(m, p, PROMPT, 0, lg, false);        /* the weights are mapped: touch them all once */
    double rss_model = rss_mb();
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = 16;
    kn_batch *b;
    if (kn_batch_new(m, &o, &b)) { fprintf(stderr, "bench_batch: %s\n", kn_last_error()); return 1; }
    kn_batch_stats bs;
    kn_batch_get_stats(b, &bs);
    double rss_idle = rss_mb();
    printf("batch memory (RSS): %.1f MB before load, %.1f MB loaded, %.1f MB after one 32-token kn_model_eval (model "
           "only), %.1f MB with an idle batch (--parallel 16, pool of %d tokens: %.1f MB of KV reserved)\n",
           rss0, rss_load, rss_model, rss_idle, bs.blocks_total * bs.block_size, (double)bs.kv_bytes / 1048576);
    kn_batch_free(b);
    /* single sequence through kn_model_eval */
    kn_model_eval(m, p, PROMPT, 0, lg, false);
    double t0 = kn_bench_now(), c0 = cpu_s();
    for (int k = 0; k < steps; k++) {
        int a = 0;
        for (int j = 1; j < V; j++) if (lg[j] > lg[a]) a = j;
        if (kn_model_eval(m, &a, 1, PROMPT + k, lg, false)) { fprintf(stderr, "bench_batch: %s\n", kn_last_error()); return 1; }
    }
    double single = steps / (kn_bench_now() - t0), single_cpu = (cpu_s() - c0) * 1e3 / steps;
    printf("batch decode kn_model_eval  1 seq : %7.1f tok/s, %5.1f CPU ms/token\n", single, single_cpu);
    int ns[3] = {1, 4, 16};
    for (int i = 0; i < 3; i++) {
        double r_after = 0, cms = 0, r = batch_rate(m, ns[i], steps, &r_after, &cms);
        printf("batch decode kn_batch_step %2d seqs: %7.1f tok/s aggregate (%.2fx single), %5.1f CPU ms/token; RSS %.1f MB\n", ns[i], r,
               r / single, cms, r_after);
    }
    free(lg);
    kn_model_free(m);
    return 0;
}
