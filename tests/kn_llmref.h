/* kn_llmref.h: transformers reference fixtures for the LLM tests
 * (tests/test_qwen.c, test_arch.c, test_moe.c; the KNLR v2 files of
 * scripts/qwen_ref.py, arch_ref.py and moe_ref.py): reading them, the
 * logits' relative L2 error of a loaded model, greedy decoding through the
 * KV cache against the reference's continuation (up to a near tie), a host
 * backend posing as a device (the upload path), and a file copy. */
#ifndef KN_LLMREF_H
#define KN_LLMREF_H
#include "kn_test.h"
#include "kiln_llm.h"
#include "kiln_backend.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reference fixtures (KNLR v2, scripts/llm_ref.py's format) ------------------------ */
typedef struct { int n_prompt, n_gen, rows; int32_t *prompt, *gen; float *margin, *logits; } ref_case;
typedef struct { int n, V; ref_case c[8]; } ref_file;

static bool read_ref(const char *path, ref_file *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4]; uint32_t h[3];
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "KNLR", 4) && fread(h, 4, 3, f) == 3 && h[0] == 2 && h[1] <= 8;
    if (ok) { r->n = (int)h[1]; r->V = (int)h[2]; }
    for (int i = 0; ok && i < r->n; i++) {
        uint32_t k[3];
        ref_case *c = &r->c[i];
        if (!(ok = fread(k, 4, 3, f) == 3 && k[0] <= 128 && k[1] <= 64 && k[2] <= k[0])) break;
        c->n_prompt = (int)k[0]; c->n_gen = (int)k[1]; c->rows = (int)k[2];
        c->prompt = malloc(4 * (size_t)c->n_prompt); c->gen = malloc(4 * (size_t)c->n_gen + 4);
        c->margin = malloc(4 * (size_t)c->n_gen + 4); c->logits = malloc(4 * (size_t)c->rows * (size_t)r->V);
        ok = fread(c->prompt, 4, (size_t)c->n_prompt, f) == (size_t)c->n_prompt &&
             fread(c->gen, 4, (size_t)c->n_gen, f) == (size_t)c->n_gen &&
             fread(c->margin, 4, (size_t)c->n_gen, f) == (size_t)c->n_gen &&
             fread(c->logits, 4, (size_t)c->rows * (size_t)r->V, f) == (size_t)c->rows * (size_t)r->V;
    }
    fclose(f);
    return ok;
}
static void free_ref(ref_file *r) {
    for (int i = 0; i < r->n; i++) { free(r->c[i].prompt); free(r->c[i].gen); free(r->c[i].margin); free(r->c[i].logits); }
    r->n = 0;
}

/* The worst relative L2 error over the reference rows of every prompt. */
static double logits_err(kn_model *m, const ref_file *r) {
    int V = r->V;
    double worst = 0;
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *lg = malloc(sizeof(float) * (size_t)c->n_prompt * V);
        if (kn_model_eval(m, c->prompt, c->n_prompt, 0, lg, true) != KN_OK) { free(lg); return INFINITY; }
        for (int k = 0; k < c->rows; k++) {
            const float *a = lg + (size_t)(c->n_prompt - c->rows + k) * V, *b = c->logits + (size_t)k * V;
            double num = 0, den = 0;
            for (int v = 0; v < V; v++) { num += ((double)a[v] - b[v]) * ((double)a[v] - b[v]); den += (double)b[v] * b[v]; }
            worst = fmax(worst, isnan(num) ? INFINITY : sqrt(num / den));
        }
        free(lg);
    }
    return worst;
}

/* A reference step whose top-2 margin is below this is a near tie: f32
 * rounding (kiln) against float64 (the reference) may pick either token, and
 * past it the two continuations may legitimately differ. The logits agree to
 * ~1e-6 of their size (a few 1e-6 absolute), far below it. */
#define TIE_MARGIN 1e-3

/* logits within tol (rel L2), greedy identical up to the first reference
 * step whose margin is below tie */
static void check_model_tol(const char *what, kn_model *m, const ref_file *r, double tol, double tie) {
    int V = r->V;
    REQUIRE(kn_model_get_config(m)->n_vocab == V, "%s: vocab %d vs %d", what, kn_model_get_config(m)->n_vocab, V);
    double e = logits_err(m, r);
    if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-30s logits rel L2 %.3g\n", what, e);
    CHECK(e < tol, "%s: logits rel L2 %.3g vs transformers (tol %.0e): %s", what, e, tol, kn_last_error());
    for (int i = 0; i < r->n; i++) {
        const ref_case *c = &r->c[i];
        float *l1 = malloc(sizeof(float) * (size_t)V);
        int32_t seq[256];     /* prompt <= 128 + continuation <= 64 */
        memcpy(seq, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
        int np = c->n_prompt, same = 0;
        REQUIRE(kn_model_eval(m, seq, np, 0, l1, false) == KN_OK, "%s", kn_last_error());
        for (int g = 0; g < c->n_gen; g++) {
            int best = 0;
            for (int v = 1; v < V; v++) if (l1[v] > l1[best]) best = v;
            if (best != c->gen[g]) break;
            same++;
            seq[np] = best;
            if (g + 1 < c->n_gen) REQUIRE(kn_model_eval(m, &seq[np], 1, np, l1, false) == KN_OK, "%s", kn_last_error());
            np++;
        }
        int clear = 0;
        while (clear < c->n_gen && c->margin[clear] >= tie) clear++;
        if (getenv("KN_VERBOSE")) fprintf(stderr, "  %-30s case %d: greedy agrees %d of %d (%d before a near tie)\n", what, i, same, c->n_gen, clear);
        CHECK(same >= clear, "%s case %d: greedy agrees for %d of %d tokens (%d required)", what, i, same, c->n_gen, clear);
        free(l1);
    }
}
/* the tests' tolerance: 1e-4 relative, greedy equal up to a near tie */
static inline void check_model(const char *what, kn_model *m, const ref_file *r) { check_model_tol(what, m, r, 1e-4, TIE_MARGIN); }

/* ---- a device backend's upload path ------------------------------------------------------
 * Host memory posing as a device (as tests/test_cuda_llm.c): kn_model_load
 * then uploads every weight and stages inputs and logits; compute is the cpu
 * backend's. */
static inline void *fd_alloc(kn_backend *be, size_t n) { (void)be; return kn_backend_cpu()->alloc(kn_backend_cpu(), n); }
static inline void fd_free(kn_backend *be, void *p) { (void)be; kn_backend_cpu()->free(kn_backend_cpu(), p); }
static inline kn_status fd_copy(kn_backend *be, void *d, const void *s, size_t n) { (void)be; memcpy(d, s, n); return KN_OK; }
static inline kn_status fd_compute(kn_backend *be, const kn_exec *e) { (void)be; return kn_backend_cpu()->compute(kn_backend_cpu(), e); }
static kn_backend g_fake = {KN_BACKEND_VERSION, "fake-device", KN_DEVICE_CUDA, fd_alloc, fd_free, fd_copy, fd_copy,
                            fd_compute, NULL, NULL, NULL};

static inline bool copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    bool ok = a && b;
    char buf[1 << 14];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = false;
    return ok;
}
#endif
