/* test_batch.c: the batched engine (include/kiln_batch.h) against the
 * single-sequence path it must reproduce.
 *
 * Every sequence's tokens are fixed up front; its reference logits are
 * kn_model_eval over the whole sequence (all rows). The batch then runs the
 * sequences together under a seeded random schedule: prompts split in
 * chunks, decode-sized items interleaved, sequences ending and new ones
 * joining mid-way, prefixes reused from ended and from live sequences (the
 * token lists share prefixes on purpose), and steps refused for want of
 * blocks. Each item's logits must match the reference row of its last token.
 *
 * Tolerance: the batch multiplies T rows of several sequences at once where
 * the reference multiplied one sequence's rows (other blocking of the same
 * sums), and its attention walks the keys block by block with an online
 * softmax where sdpa takes two passes: the same math in another order, so
 * float rounding differs. The check is max |a - b| <= tol * (1 + max |b|),
 * tol 1e-4 for f32 KV (observed ~1e-6) and 2e-3 for f16 KV rounding with
 * quantized weights. Greedy continuations must be identical.
 *
 * Models: the committed Qwen2 (tied, untied) and Qwen3 fixtures, a random
 * GPT-2 written here (llm.c format), and when present under KN_ASSETS
 * stories260K (llama2.c, GQA) and the tiny random Llama GGUF; SmolLM2
 * (models/ or KN_SMOLLM2) for greedy continuations.
 */
#include "core/env.h"        /* defines: kn_env_reload (KN_LLM_TOP) */
#include "kn_test.h"
#include "kiln_batch.h"
#include "formats/llmc_gpt2.h"
#include "llm/batch_impl.h"     /* white-box: the prefix cache's verification */
#include <stdint.h>
#include <unistd.h>

static uint64_t g_rng;
static uint64_t rnd(void) { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng; }
static int rint_(int n) { return (int)(rnd() % (uint64_t)n); }

/* ---- models ------------------------------------------------------------- */
static const char *gpt2_path(void) {
    static char path[64];
    if (path[0]) return path;
    snprintf(path, sizeof path, "/tmp/kn_batch_gpt2_%d.bin", (int)getpid());
    kn_llmc_gpt2_config c = {96, 50, 64, 2, 4, 32};
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    kn_llmc_gpt2_shapes(&c, sh, NULL);
    float *p[KN_GPT2_NPARAMS];
    uint64_t save = g_rng;
    g_rng = 12345;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
        p[i] = malloc(sizeof(float) * (size_t)sh[i].numel);
        for (int64_t j = 0; j < sh[i].numel; j++) p[i][j] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5) * 0.5f;
    }
    g_rng = save;
    kn_status st = kn_llmc_gpt2_write(path, &c, KN_F32, (const void *const *)p);
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) free(p[i]);
    if (st) path[0] = 0;
    return path[0] ? path : NULL;
}

typedef struct { const char *name, *path, *tok; bool kv_f16; double tol; kn_backend *be; } model_case;

static kn_model *load(const model_case *mc, int n_ctx) {
    kn_model_opts o = {.n_ctx = n_ctx, .kv_f16 = mc->kv_f16, .tokenizer_path = mc->tok, .backend = mc->be,
                       .weight_dtype = mc->be ? KN_WEIGHTS_F32 : KN_WEIGHTS_AUTO};
    kn_model *m = NULL;
    if (kn_model_load(mc->path, &o, &m) != KN_OK) { fprintf(stderr, "  %s: %s\n", mc->name, kn_last_error()); return NULL; }
    return m;
}

/* the models this machine has: committed fixtures always, assets when present */
static int model_cases(model_case *out) {
    int n = 0;
    out[n++] = (model_case){"qwen2_tied", "tests/fixtures/qwen/qwen2_tied.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"qwen2_untied", "tests/fixtures/qwen/qwen2_untied.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"qwen3", "tests/fixtures/qwen/qwen3.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"qwen3 f16 kv", "tests/fixtures/qwen/qwen3.gguf", NULL, true, 2e-3};
    /* a sliding window of 8 on every layer (Mistral), windowed and global
     * layers with q/k norms (Gemma 3), fused projections with partial rotary
     * (Phi-3), and mixtures of experts (Mixtral, OLMoE) */
    out[n++] = (model_case){"mistral (window 8)", "tests/fixtures/arch/mistral.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"gemma3 (local + global)", "tests/fixtures/arch/gemma3.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"phi3", "tests/fixtures/arch/phi3.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"mixtral", "tests/fixtures/moe/mixtral.gguf", NULL, false, 1e-4};
    out[n++] = (model_case){"olmoe", "tests/fixtures/moe/olmoe.gguf", NULL, false, 1e-4};
    const char *g = gpt2_path();
    if (g) out[n++] = (model_case){"gpt2", g, NULL, false, 1e-4};
    const char *s = kn_asset("llama2c/stories260K.bin"), *t = kn_asset("llama2c/tok512.bin");
    if (s && t) {
        out[n++] = (model_case){"stories260K", s, t, false, 1e-4};
        out[n++] = (model_case){"stories260K f16 kv", s, t, true, 2e-3};
    }
    const char *l = kn_asset("gguf/llama-2-tiny-random.gguf");
    if (l) out[n++] = (model_case){"llama-2-tiny-random", l, NULL, false, 1e-4};
    return n;
}

/* SmolLM2 (Q4_1) when present: a chunk of 32 or more rows multiplies
 * dequantized f32 weights, fewer rows go through 16-bit activation quants
 * (cpu_matmul.c), so a row's path depends on how its sequence was chunked:
 * the activation rounding (~1e-3 relative) is the tolerance */
static const char *smollm2(void) {
    const char *sm = getenv("KN_SMOLLM2") ? getenv("KN_SMOLLM2") : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(sm, "rb");
    if (f) fclose(f);
    return f ? sm : NULL;
}

/* ---- the reference ---------------------------------------------------------- */
typedef struct {
    int n;
    int32_t *tok;
    float *ref;              /* [n, V] kn_model_eval logits of every position */
} job;

static double row_err(const float *a, const float *b, int V) {
    double d = 0, mx = 0;
    for (int i = 0; i < V; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;                 /* NaN stays */
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return d / (1 + mx);
}

/* candidates (kn_batch_step_top) against the reference row: K distinct
 * ids best first, each logit within err of the reference's, none worse than
 * its K-th best by more than err (near ties may swap); the error in
 * row_err's units */
static double top_err(const int32_t *ids, const float *vals, const float *ref, int V, int K) {
    double mx = 0, worst = 0;
    for (int i = 0; i < V; i++) if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
    float *srt = malloc(sizeof(float) * (size_t)V);
    memcpy(srt, ref, sizeof(float) * (size_t)V);
    for (int i = 0; i < K; i++)
        for (int j = i + 1; j < V; j++) if (srt[j] > srt[i]) { float t = srt[i]; srt[i] = srt[j]; srt[j] = t; }
    for (int i = 0; i < K; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup = dup || ids[j] == ids[i];
        if (ids[i] < 0 || ids[i] >= V || dup || (i && vals[i] > vals[i - 1])) { worst = INFINITY; break; }
        double e = fabs((double)vals[i] - ref[ids[i]]), below = (double)srt[K - 1] - vals[i];
        if (e > worst) worst = e;
        if (below > worst) worst = below;
    }
    free(srt);
    return worst / (1 + mx);
}

/* jobs with shared prefixes: job k copies a random earlier job's first
 * tokens (often a whole number of blocks and more) before its own */
static void make_jobs(kn_model *m, job *jobs, int n_jobs, int max_len) {
    int V = kn_model_get_config(m)->n_vocab;
    for (int k = 0; k < n_jobs; k++) {
        job *j = &jobs[k];
        j->n = 2 + rint_(max_len - 1);
        j->tok = malloc(sizeof(int32_t) * (size_t)j->n);
        int shared = 0;
        if (k && rint_(2)) {
            const job *o = &jobs[rint_(k)];
            shared = 1 + rint_(o->n);
            if (shared > j->n) shared = j->n;
            memcpy(j->tok, o->tok, sizeof(int32_t) * (size_t)shared);
        }
        for (int i = shared; i < j->n; i++) j->tok[i] = rint_(V);
        j->ref = malloc(sizeof(float) * (size_t)j->n * (size_t)V);
        kn_status st = kn_model_eval(m, j->tok, j->n, 0, j->ref, true);
        if (st) fprintf(stderr, "  reference eval: %s\n", kn_last_error());
    }
}
static void free_jobs(job *jobs, int n) { for (int k = 0; k < n; k++) { free(jobs[k].tok); free(jobs[k].ref); } }

/* ---- the randomized schedule ---------------------------------------------- */
typedef struct { int job, seq, done; } running;

static void schedule(const model_case *mc, uint64_t seed, int n_seq_max, int block_size, int pool_tokens, int n_batch) {
    kn_model *m = load(mc, 96);
    REQUIRE(m, "%s: load", mc->name);
    int V = kn_model_get_config(m)->n_vocab;
    g_rng = seed;
    enum { NJ = 24 };
    job jobs[NJ];
    make_jobs(m, jobs, NJ, 80);
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = n_seq_max; o.block_size = block_size; o.n_ctx = pool_tokens; o.n_batch = n_batch;
    kn_batch *b = NULL;
    kn_status st = kn_batch_new(m, &o, &b);
    if (st) { CHECK(0, "%s: kn_batch_new: %s", mc->name, kn_last_error()); free_jobs(jobs, NJ); kn_model_free(m); return; }
    running run[64];
    int n_run = 0, next_job = 0, finished = 0, n_items_checked = 0, n_limit = 0;
    int64_t reused = 0, evaluated = 0, steps = 0;
    double worst = 0;
    kn_batch_item items[64];
    int item_run[64];
    float *lg = malloc(sizeof(float) * (size_t)V * 64), *top_vals = malloc(sizeof(float) * KN_MODEL_TOP_MAX * 64);
    int32_t *top_ids = malloc(sizeof(int32_t) * KN_MODEL_TOP_MAX * 64);
    const int K = V < KN_MODEL_TOP_MAX ? V : KN_MODEL_TOP_MAX;
    int n_top = 0;
    for (int iter = 0; iter < 400 && finished < NJ; iter++) {
        /* join: new sequences while slots last */
        while (next_job < NJ && n_run < n_seq_max && rint_(3)) {
            int s = kn_batch_seq_new(b);
            REQUIRE(s >= 0, "%s: a slot was free: %s", mc->name, kn_last_error());
            job *j = &jobs[next_job];
            int have = kn_batch_seq_reuse_prefix(b, s, j->tok, j->n);
            CHECK(have >= 0 && have % block_size == 0 && have <= j->n - 1 && kn_batch_seq_len(b, s) == have,
                  "%s: reuse_prefix gave %d of %d", mc->name, have, j->n);
            reused += have;
            run[n_run++] = (running){next_job++, s, have};
        }
        if (!n_run) continue;
        /* one item per running sequence (some skip a step), chunk sizes random */
        int n_items = 0, budget = n_batch;
        for (int r = 0; r < n_run && budget > 0; r++) {
            if (n_run > 1 && rint_(5) == 0) continue;
            job *j = &jobs[run[r].job];
            int left = j->n - run[r].done, n = rint_(2) ? 1 : 1 + rint_(left);
            if (n > left) n = left;
            if (n > budget) n = budget;
            items[n_items] = (kn_batch_item){run[r].seq, j->tok + run[r].done, n, rint_(4) != 0, rint_(2) != 0};
            item_run[n_items++] = r;
            budget -= n;
        }
        if (!n_items) continue;
        kn_batch_stats before, after;
        kn_batch_get_stats(b, &before);
        int lens[64];
        for (int r = 0; r < n_run; r++) lens[r] = kn_batch_seq_len(b, run[r].seq);
        st = kn_batch_step_top(b, items, n_items, lg, top_ids, top_vals);
        if (st == KN_ERR_LIMIT) {            /* out of blocks: nothing may have changed; end a sequence */
            n_limit++;
            kn_batch_get_stats(b, &after);
            CHECK(!memcmp(&before, &after, sizeof before), "%s: a refused step changed the stats", mc->name);
            for (int r = 0; r < n_run; r++) CHECK(kn_batch_seq_len(b, run[r].seq) == lens[r], "%s: a refused step changed a length", mc->name);
            int r = rint_(n_run);
            kn_batch_seq_free(b, run[r].seq);
            run[r] = run[--n_run];
            finished++;                      /* dropped unfinished: counts as done */
            continue;
        }
        REQUIRE(st == KN_OK, "%s: step: %s", mc->name, kn_last_error());
        steps++;
        int k = 0;
        for (int i = 0; i < n_items; i++) {
            running *rr = &run[item_run[i]];
            job *j = &jobs[rr->job];
            rr->done += items[i].n;
            evaluated += items[i].n;
            CHECK(kn_batch_seq_len(b, rr->seq) == rr->done, "%s: length", mc->name);
            if (!items[i].logits) continue;
            const float *ref = j->ref + (size_t)(rr->done - 1) * V;
            double e = items[i].top ? top_err(top_ids + (size_t)k * KN_MODEL_TOP_MAX, top_vals + (size_t)k * KN_MODEL_TOP_MAX, ref, V, K)
                                    : row_err(lg + (size_t)k * V, ref, V);
            k++;
            n_top += items[i].top;
            if (!(e <= worst)) worst = e;
            n_items_checked++;
        }
        for (int r = 0; r < n_run;)          /* end the finished ones */
            if (run[r].done == jobs[run[r].job].n) {
                kn_batch_seq_free(b, run[r].seq);
                run[r] = run[--n_run];
                finished++;
            } else r++;
    }
    CHECK(worst <= mc->tol, "%s (seed %llu, bs %d): worst logit error %.3g > %.3g", mc->name, (unsigned long long)seed, block_size, worst, mc->tol);
    CHECK(n_items_checked > 20 && n_top > 5, "%s: only %d items checked, %d of them candidates", mc->name, n_items_checked, n_top);
    kn_batch_stats s;
    kn_batch_get_stats(b, &s);
    CHECK(s.steps == steps && s.tokens_evaluated == evaluated && s.prefix_tokens_reused == reused && s.n_seq == n_run,
          "%s: stats steps %lld/%lld tokens %lld/%lld reused %lld/%lld seqs %d/%d", mc->name, (long long)s.steps, (long long)steps,
          (long long)s.tokens_evaluated, (long long)evaluated, (long long)s.prefix_tokens_reused, (long long)reused, s.n_seq, n_run);
    for (int r = 0; r < n_run; r++) kn_batch_seq_free(b, run[r].seq);
    kn_batch_get_stats(b, &s);
    CHECK(s.n_seq == 0 && s.blocks_used == 0 && kn_batch_free_tokens(b) == s.blocks_total * block_size,
          "%s: everything back: used %d cached %d free tokens %d", mc->name, s.blocks_used, s.blocks_cached, kn_batch_free_tokens(b));
    fprintf(stderr, "  %-20s bs %2d: %d items, %lld steps, %lld tokens, %lld reused, %d refused, worst %.2g\n", mc->name, block_size,
            n_items_checked, (long long)steps, (long long)evaluated, (long long)reused, n_limit, worst);
    free(lg); free(top_ids); free(top_vals);
    kn_batch_free(b);
    free_jobs(jobs, NJ);
    kn_model_free(m);
}

TEST(batch_schedule_matches_single_sequence) {
    model_case mc[16];
    int n = model_cases(mc);
    for (int i = 0; i < n; i++) {
        schedule(&mc[i], 1000 + (uint64_t)i, 4, 16, 96 * 4, 64);   /* roomy pool */
        schedule(&mc[i], 2000 + (uint64_t)i, 6, 4, 160, 48);       /* small blocks, a pool that runs short */
    }
}

/* Gemma 2 soft-caps its attention scores, which paged_attn does not: refused
 * by name at kn_batch_new, nothing built */
TEST(batch_refuses_softcapped_attention) {
    model_case mc = {"gemma2", "tests/fixtures/arch/gemma2.gguf", NULL, false, 1e-4};
    kn_model *m = load(&mc, 64);
    REQUIRE(m, "gemma2 fixture: %s", kn_last_error());
    kn_batch *b = NULL;
    kn_batch_opts o = kn_batch_defaults();
    CHECK(kn_batch_new(m, &o, &b) == KN_ERR_UNSUPPORTED && !b, "a soft-capped model was accepted");
    CHECK(strstr(kn_last_error(), "soft-cap"), "message: %s", kn_last_error());
    kn_model_free(m);
}

TEST(batch_schedule_smollm2) {
    const char *sm = smollm2();
    if (!sm) SKIP("SmolLM2 Q4_1 missing (models/ or KN_SMOLLM2; `make run` fetches it)");
    model_case mc = {"SmolLM2 Q4_1", sm, NULL, false, 1e-2};
    schedule(&mc, 555, 4, 16, 96 * 4, 64);
}

/* an idle batch reserves its pool without committing it: the resident size
 * grows by far less than the pool (SmolLM2: 180 MB of KV for 4096 tokens) */
static double rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}
TEST(batch_idle_memory) {
    const char *sm = smollm2();
    if (!sm) SKIP("SmolLM2 Q4_1 missing (models/ or KN_SMOLLM2; `make run` fetches it)");
    kn_model *m;
    REQUIRE(kn_model_load(sm, NULL, &m) == KN_OK, "%s", kn_last_error());
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg = malloc(sizeof(float) * (size_t)kn_model_get_config(m)->n_vocab);
    REQUIRE(kn_model_eval(m, t, 8, 0, lg, false) == KN_OK, "%s", kn_last_error());   /* weights paged in */
    double before = rss_mb();
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = 16;
    kn_batch *b;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    kn_batch_stats s;
    kn_batch_get_stats(b, &s);
    double idle = rss_mb();
    if (before < 0) SKIP("no /proc/self/status");
    CHECK(idle - before < 16 && s.kv_bytes > (size_t)100 << 20, "an idle batch added %.1f MB (pool %.1f MB)", idle - before,
          (double)s.kv_bytes / 1048576);
    fprintf(stderr, "  RSS model only %.1f MB, with an idle --parallel 16 batch %.1f MB (pool %.1f MB reserved)\n", before, idle,
            (double)s.kv_bytes / 1048576);
    kn_batch_free(b);
    free(lg);
    kn_model_free(m);
}

TEST(batch_block_size_1_and_32) {
    model_case mc[16];
    model_cases(mc);
    schedule(&mc[0], 77, 3, 1, 200, 40);
    schedule(&mc[2], 78, 5, 32, 96 * 5, 96);
}

/* ---- API edges -------------------------------------------------------------- */
static kn_model *fixture(void) {
    model_case mc = {"qwen3", "tests/fixtures/qwen/qwen3.gguf", NULL, false, 1e-4};
    return load(&mc, 96);
}

TEST(batch_bad_input_changes_nothing) {
    kn_model *m = fixture();
    REQUIRE(m, "load");
    int V = kn_model_get_config(m)->n_vocab;
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = 3; o.n_ctx = 48; o.block_size = 8; o.n_batch = 48;
    kn_batch *b;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    kn_batch_stats s0, s1;
    kn_batch_get_stats(b, &s0);
    CHECK(s0.blocks_total == 6 && s0.block_size == 8 && s0.blocks_used == 0 && s0.n_seq == 0 && s0.kv_bytes > 0, "fresh stats");
    int a = kn_batch_seq_new(b), c = kn_batch_seq_new(b);
    REQUIRE(a == 0 && c == 1, "ids %d %d", a, c);
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (i * 7) % V;
    float *lg = malloc(sizeof(float) * (size_t)V * 3);
    REQUIRE(kn_batch_step(b, &(kn_batch_item){a, tok, 10, true}, 1, lg) == KN_OK, "%s", kn_last_error());
    kn_batch_get_stats(b, &s0);
    CHECK(s0.blocks_used == 2 && s0.n_seq == 2 && s0.steps == 1 && s0.tokens_evaluated == 10, "stats after a step: used %d", s0.blocks_used);
    int32_t bad = V;
    struct { kn_batch_item it[2]; int n; kn_status want; const char *what; } cases[] = {
        {{{7, tok, 1, true}}, 1, KN_ERR_INVALID, "an unknown sequence"},
        {{{2, tok, 1, true}}, 1, KN_ERR_INVALID, "a slot not opened"},
        {{{-1, tok, 1, true}}, 1, KN_ERR_INVALID, "a negative id"},
        {{{c, &bad, 1, true}}, 1, KN_ERR_INVALID, "a token past the vocabulary"},
        {{{a, tok, 1, true}, {c, &bad, 1, true}}, 2, KN_ERR_INVALID, "a bad token in the second item"},
        {{{a, tok, 1, true}, {a, tok, 1, true}}, 2, KN_ERR_INVALID, "a sequence twice"},
        {{{c, tok, 0, true}}, 1, KN_ERR_INVALID, "no tokens"},
        {{{a, tok, 20, true}, {c, tok, 30, true}}, 2, KN_ERR_LIMIT, "more than n_batch"},
        {{{a, tok, 30, true}, {c, tok, 9, true}}, 2, KN_ERR_LIMIT, "more blocks than the pool has (3 + 2 > 4 free)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kn_status st = kn_batch_step(b, cases[i].it, cases[i].n, lg);
        kn_batch_get_stats(b, &s1);
        CHECK(st == cases[i].want && strstr(kn_last_error(), "kn_batch_step"), "%s: status %d, %s", cases[i].what, st, kn_last_error());
        CHECK(!memcmp(&s0, &s1, sizeof s0) && kn_batch_seq_len(b, a) == 10 && kn_batch_seq_len(b, c) == 0, "%s changed something", cases[i].what);
    }
    CHECK(kn_batch_step(b, &(kn_batch_item){c, tok, 1, true}, 1, NULL) == KN_ERR_INVALID && strstr(kn_last_error(), "NULL"),
          "logits wanted, no buffer: %s", kn_last_error());
    CHECK(kn_batch_step(b, &(kn_batch_item){c, tok, 1, true, true}, 1, lg) == KN_ERR_INVALID &&
          strstr(kn_last_error(), "kn_batch_step_top") && kn_batch_seq_len(b, c) == 0,
          "candidates wanted, no arrays: %s", kn_last_error());
    CHECK(kn_batch_step(b, &(kn_batch_item){c, tok, 1, false}, 1, NULL) == KN_OK && kn_batch_seq_len(b, c) == 1,
          "no logits wanted: NULL is fine");
    /* the context length: the model was loaded with 96 */
    kn_batch_free(b);
    o.n_ctx = 256; o.n_batch = 128;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    a = kn_batch_seq_new(b);
    int32_t big[100] = {0};
    CHECK(kn_batch_step(b, &(kn_batch_item){a, big, 97, true}, 1, lg) == KN_ERR_LIMIT && strstr(kn_last_error(), "context length"),
          "97 tokens > n_ctx 96: %s", kn_last_error());
    CHECK(kn_batch_step(b, &(kn_batch_item){a, big, 96, true}, 1, lg) == KN_OK, "96 tokens fit: %s", kn_last_error());
    CHECK(kn_batch_step(b, &(kn_batch_item){a, big, 1, true}, 1, lg) == KN_ERR_LIMIT, "one more does not");
    /* slots */
    CHECK(kn_batch_seq_new(b) == 1 && kn_batch_seq_new(b) == 2 && kn_batch_seq_new(b) == -1 && strstr(kn_last_error(), "slots"),
          "three slots: %s", kn_last_error());
    kn_batch_seq_free(b, 1);
    kn_batch_seq_free(b, 1);              /* twice: a no-op */
    kn_batch_seq_free(b, 99);             /* unknown: a no-op */
    CHECK(kn_batch_seq_new(b) == 1, "a freed slot is reused");
    CHECK(kn_batch_seq_len(b, 9) == -1 && kn_batch_seq_reuse_prefix(b, 9, tok, 5) == -1, "unknown ids");
    kn_batch_free(b);
    kn_batch_free(NULL);
    o.block_size = -1;
    CHECK(kn_batch_new(m, &o, &b) == KN_ERR_INVALID && !b, "bad options: %s", kn_last_error());
    free(lg);
    kn_model_free(m);
}

/* two live sequences share a prompt's full blocks; a third reuses them after
 * both ended; the pool then fills and the cached blocks are evicted */
TEST(batch_prefix_sharing_and_eviction) {
    kn_model *m = fixture();
    REQUIRE(m, "load");
    int V = kn_model_get_config(m)->n_vocab;
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = 4; o.n_ctx = 96; o.block_size = 8; o.n_batch = 96;
    kn_batch *b;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    int32_t p[40];
    g_rng = 5;
    for (int i = 0; i < 40; i++) p[i] = rint_(V);
    float *ref = malloc(sizeof(float) * (size_t)V * 40), *lg = malloc(sizeof(float) * (size_t)V * 2);
    REQUIRE(kn_model_eval(m, p, 40, 0, ref, true) == KN_OK, "%s", kn_last_error());
    int a = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, a, p, 20) == 0, "empty cache");
    REQUIRE(kn_batch_step(b, &(kn_batch_item){a, p, 20, true}, 1, lg) == KN_OK, "%s", kn_last_error());
    CHECK(row_err(lg, ref + 19 * V, V) < 1e-4, "a's prompt");
    kn_batch_stats s;
    kn_batch_get_stats(b, &s);
    CHECK(s.blocks_used == 3 && s.blocks_cached == 0, "a holds 3 blocks (2 full, cached while held): %d %d", s.blocks_used, s.blocks_cached);
    int c = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, c, p, 40) == 16, "c shares a's two full blocks while a lives");
    CHECK(kn_batch_seq_reuse_prefix(b, c, p, 40) == 16, "a second call on a non-empty sequence changes nothing");
    kn_batch_get_stats(b, &s);
    CHECK(s.blocks_used == 3 && s.prefix_tokens_reused == 16, "shared blocks are counted once: %d", s.blocks_used);
    /* both go on together: a from 20, c from 16; neither writes the shared blocks */
    kn_batch_item it[2] = {{a, p + 20, 4, true}, {c, p + 16, 10, true}};
    REQUIRE(kn_batch_step(b, it, 2, lg) == KN_OK, "%s", kn_last_error());
    CHECK(row_err(lg, ref + 23 * V, V) < 1e-4 && row_err(lg + V, ref + 25 * V, V) < 1e-4, "a and c after sharing");
    int32_t other[8];
    for (int i = 0; i < 8; i++) other[i] = (p[16 + i] + 1) % V;        /* c diverges from a inside block 2 */
    it[0] = (kn_batch_item){a, p + 24, 1, true};
    it[1] = (kn_batch_item){c, other, 8, false};
    REQUIRE(kn_batch_step(b, it, 2, lg) == KN_OK, "%s", kn_last_error());
    CHECK(row_err(lg, ref + 24 * V, V) < 1e-4, "a unaffected by c's different tokens");
    kn_batch_seq_free(b, a);
    kn_batch_seq_free(b, c);
    kn_batch_get_stats(b, &s);
    CHECK(s.blocks_used == 0 && s.blocks_cached >= 3 && s.n_seq == 0, "ended: blocks cached %d", s.blocks_cached);
    /* from an ended sequence: p's first three blocks (a filled block 2 at 24) */
    int d = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, d, p, 40) == 24, "d reuses a's three full blocks");
    REQUIRE(kn_batch_step(b, &(kn_batch_item){d, p + 24, 16, true}, 1, lg) == KN_OK, "%s", kn_last_error());
    CHECK(row_err(lg, ref + 39 * V, V) < 1e-4, "d's logits after reuse: %.3g", row_err(lg, ref + 39 * V, V));
    kn_batch_seq_free(b, d);
    /* not on a block boundary minus one: n = 17 may reuse 16, n = 16 only 8 */
    d = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, d, p, 17) == 16, "17 tokens: 16 reused");
    kn_batch_seq_free(b, d);
    d = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, d, p, 16) == 8, "16 tokens: 8 reused (one left to evaluate)");
    kn_batch_seq_free(b, d);
    /* fill the pool with other tokens: the cached blocks are evicted, LRU */
    kn_batch_get_stats(b, &s);
    CHECK(kn_batch_free_tokens(b) == 96, "all 12 blocks free or evictable: %d", kn_batch_free_tokens(b));
    int32_t q[96];
    for (int i = 0; i < 96; i++) q[i] = (p[i % 40] + 3) % V;
    d = kn_batch_seq_new(b);
    REQUIRE(kn_batch_step(b, &(kn_batch_item){d, q, 88, false}, 1, lg) == KN_OK, "%s", kn_last_error());
    kn_batch_get_stats(b, &s);
    CHECK(s.blocks_used == 11 && s.blocks_cached <= 1, "pool full: used %d cached %d", s.blocks_used, s.blocks_cached);
    int e = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, e, p, 40) <= 8, "p's blocks mostly gone");
    kn_batch_seq_free(b, e);
    kn_batch_seq_free(b, d);
    /* twins: two sequences evaluate the same prompt in one step (neither can
     * reuse the other's blocks yet); the second's full blocks stay private,
     * and its own later blocks chain to the first's, so a third sequence
     * reuses the prompt and the second's continuation */
    int32_t w[48];
    for (int i = 0; i < 48; i++) w[i] = (p[i % 40] + (i < 24 ? 5 : 9)) % V;
    a = kn_batch_seq_new(b); c = kn_batch_seq_new(b);
    it[0] = (kn_batch_item){a, w, 24, false};
    it[1] = (kn_batch_item){c, w, 24, false};
    REQUIRE(kn_batch_step(b, it, 2, lg) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_batch_step(b, &(kn_batch_item){c, w + 24, 16, false}, 1, lg) == KN_OK, "%s", kn_last_error());
    kn_batch_seq_free(b, a);
    kn_batch_seq_free(b, c);
    d = kn_batch_seq_new(b);
    CHECK(kn_batch_seq_reuse_prefix(b, d, w, 48) == 40, "the twin's continuation is reachable: %d", kn_batch_seq_len(b, d));
    float *wref = malloc(sizeof(float) * (size_t)V * 48);
    REQUIRE(kn_model_eval(m, w, 48, 0, wref, true) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_batch_step(b, &(kn_batch_item){d, w + 40, 8, true}, 1, lg) == KN_OK, "%s", kn_last_error());
    CHECK(row_err(lg, wref + 47 * V, V) < 1e-4, "logits after reusing a twin chain");
    free(wref);
    kn_batch_seq_free(b, d);
    /* the prefix cache off */
    kn_batch_free(b);
    o.prefix_cache = false;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    a = kn_batch_seq_new(b);
    REQUIRE(kn_batch_step(b, &(kn_batch_item){a, p, 20, true}, 1, lg) == KN_OK, "%s", kn_last_error());
    kn_batch_seq_free(b, a);
    a = kn_batch_seq_new(b);
    kn_batch_get_stats(b, &s);
    CHECK(kn_batch_seq_reuse_prefix(b, a, p, 40) == 0 && s.blocks_cached == 0, "cache off");
    kn_batch_free(b);
    free(ref); free(lg);
    kn_model_free(m);
}

/* a hash hit is verified: the block's tokens and its parent's generation */
TEST(batch_prefix_cache_verifies_hits) {
    kn_model *m = fixture();
    REQUIRE(m, "load");
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = 2; o.n_ctx = 32; o.block_size = 4;
    kn_batch *b;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 8}, t3[4] = {1, 2, 3, 5};
    int x = kn__block_take(b), y = kn__block_take(b);
    memcpy(b->blk_tokens + x * 4, t1, sizeof t1);
    memcpy(b->blk_tokens + y * 4, t2, sizeof t2);
    uint64_t h1 = kn__prefix_hash(0, t1, 4), h2 = kn__prefix_hash(h1, t2, 4);
    kn__block_register(b, x, h1, -1);
    kn__block_register(b, y, h2, x);
    CHECK(kn__block_lookup(b, h1, t1, -1) == x && kn__block_lookup(b, h2, t2, x) == y, "hits");
    CHECK(kn__block_lookup(b, h1, t3, -1) == -1, "same hash, other tokens: a miss (a forced collision)");
    CHECK(kn__block_lookup(b, h2, t2, y) == -1, "other parent: a miss");
    kn__block_release(b, y);
    kn__block_release(b, x);
    CHECK(b->n_cached_idle == 2 && kn__blocks_available(b) == 8, "both cached, evictable");
    /* evict x (the pool's free blocks taken first, then LRU: y was released first) */
    int got[8], n = 0;
    while (n < 8 && (got[n] = kn__block_take(b)) >= 0) n++;
    CHECK(n == 8 && kn__block_take(b) == -1, "8 blocks, then none");
    CHECK(got[6] == y && got[7] == x, "LRU order: y (released first) then x: %d %d", got[6], got[7]);
    for (int i = 0; i < n; i++) kn__block_release(b, got[i]);
    CHECK(kn__block_lookup(b, h1, t1, -1) == -1 && kn__block_lookup(b, h2, t2, x) == -1, "evicted");
    kn_batch_free(b);
    kn_model_free(m);
}

/* greedy continuations of several sequences decoded together equal each
 * sequence's greedy continuation through kn_model_eval */
static int argmax(const float *x, int n) { int k = 0; for (int i = 1; i < n; i++) if (x[i] > x[k]) k = i; return k; }

static void greedy_check(const char *name, kn_model *m, int n_seq, int n_new) {
    int V = kn_model_get_config(m)->n_vocab;
    kn_batch_opts o = kn_batch_defaults();
    o.n_seq_max = n_seq;
    kn_batch *b;
    REQUIRE(kn_batch_new(m, &o, &b) == KN_OK, "%s", kn_last_error());
    int32_t tok[8][64];
    int len[8], seq[8];
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n_seq), *one = malloc(sizeof(float) * (size_t)V);
    g_rng = 99;
    for (int s = 0; s < n_seq; s++) {
        len[s] = 3 + 5 * s;
        for (int i = 0; i < len[s]; i++) tok[s][i] = 1 + rint_(V - 1);
        seq[s] = kn_batch_seq_new(b);
    }
    kn_batch_item it[8];
    for (int s = 0; s < n_seq; s++) it[s] = (kn_batch_item){seq[s], tok[s], len[s], true};
    REQUIRE(kn_batch_step(b, it, n_seq, lg) == KN_OK, "%s", kn_last_error());
    for (int step = 0; step < n_new; step++) {
        for (int s = 0; s < n_seq; s++) { tok[s][len[s]] = argmax(lg + (size_t)s * V, V); it[s] = (kn_batch_item){seq[s], &tok[s][len[s]], 1, true}; len[s]++; }
        REQUIRE(kn_batch_step(b, it, n_seq, lg) == KN_OK, "%s", kn_last_error());
    }
    for (int s = 0; s < n_seq; s++) {
        int p = 3 + 5 * s, same = 1;
        REQUIRE(kn_model_eval(m, tok[s], p, 0, one, false) == KN_OK, "%s", kn_last_error());
        for (int i = p; i < len[s]; i++) {
            if (argmax(one, V) != tok[s][i]) { same = 0; break; }
            REQUIRE(kn_model_eval(m, &tok[s][i], 1, i, one, false) == KN_OK, "%s", kn_last_error());
        }
        CHECK(same, "%s: sequence %d's greedy continuation differs from kn_model_eval's", name, s);
    }
    free(lg); free(one);
    kn_batch_free(b);
}

TEST(batch_greedy_equals_single) {
    const char *s = kn_asset("llama2c/stories260K.bin"), *t = kn_asset("llama2c/tok512.bin");
    const char *sm = smollm2();
    int ran = 0;
    if (s && t) {
        kn_model *m = load(&(model_case){"stories260K", s, t, false, 0}, 256);
        REQUIRE(m, "load");
        greedy_check("stories260K", m, 4, 24);
        kn_model_free(m);
        ran++;
    }
    if (sm) {
        kn_model *m = load(&(model_case){"SmolLM2", sm, NULL, false, 0}, 256);
        REQUIRE(m, "load");
        greedy_check("SmolLM2", m, 4, 16);
        kn_model_free(m);
        ran++;
    }
    if (!ran) SKIP("neither stories260K (KN_ASSETS) nor SmolLM2 (models/, KN_SMOLLM2) is present");
}

/* ---- device backends ----------------------------------------------------------
 * Host memory posing as a device (as tests/test_qwen.c): the engine's device
 * path (pool allocated and zeroed through copy_in, inputs staged, logits
 * copied out) with the cpu backend's kernels. */
static void *fd_alloc(kn_backend *be, size_t n) { (void)be; return kn_backend_cpu()->alloc(kn_backend_cpu(), n); }
static void fd_free(kn_backend *be, void *p) { (void)be; kn_backend_cpu()->free(kn_backend_cpu(), p); }
static kn_status fd_copy(kn_backend *be, void *d, const void *s, size_t n) { (void)be; memcpy(d, s, n); return KN_OK; }
static kn_status fd_compute(kn_backend *be, const kn_exec *e) { (void)be; return kn_backend_cpu()->compute(kn_backend_cpu(), e); }
static kn_backend g_fake = {KN_BACKEND_VERSION, "fake-device", KN_DEVICE_CUDA, fd_alloc, fd_free, fd_copy, fd_copy,
                            fd_compute, NULL, NULL, NULL};

/* KN_LLM_TOP unset (the default): candidates selected on the host from the
 * step's rows, copied back at once, and (KN_LLM_DEVICE_EMBED=0) the token
 * rows looked up on the host and staged; =1: selected in the plan (TOPK),
 * and the token rows gathered in the plan (the default: ids staged instead
 * of rows) */
TEST(batch_device_path) {
    for (int top = 0; top < 2; top++) {
        if (top) setenv("KN_LLM_TOP", "1", 1); else unsetenv("KN_LLM_TOP");
        if (top) unsetenv("KN_LLM_DEVICE_EMBED"); else setenv("KN_LLM_DEVICE_EMBED", "0", 1);
        kn_env_reload();
        model_case mc = {"qwen3 fake device", "tests/fixtures/qwen/qwen3.gguf", NULL, false, 1e-4, &g_fake};
        schedule(&mc, 31, 4, 16, 96 * 4, 64);
        mc = (model_case){"gpt2 fake device", gpt2_path(), NULL, false, 1e-4, &g_fake};
        schedule(&mc, 32, 4, 8, 200, 48);
    }
    unsetenv("KN_LLM_DEVICE_EMBED");
    kn_env_reload();
}

#ifdef KN_CUDA
#include "kiln_cuda.h"
/* the CUDA backend (scripts/cuda_test.sh on a GPU machine): the schedules on
 * the GPU against the GPU's own kn_model_eval, f32 weights */
TEST(batch_cuda) {
    setenv("KN_LLM_TOP", "1", 1);        /* the candidates selected on the GPU */
    kn_env_reload();
    kn_backend *g = kn_backend_cuda();
    if (!g) SKIP("no GPU: %s", kn_last_error());
    model_case mc[16];
    int n = model_cases(mc);
    for (int i = 0; i < n; i++) {
        mc[i].be = g;
        schedule(&mc[i], 3000 + (uint64_t)i, 4, 16, 96 * 4, 64);
        schedule(&mc[i], 4000 + (uint64_t)i, 6, 4, 160, 48);
    }
}
#else
TEST(batch_cuda) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

int main(void) { return kn_test_main(); }
