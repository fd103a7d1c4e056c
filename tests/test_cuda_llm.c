/* test_cuda_llm.c: LLM inference on a device backend against the CPU.
 *
 * Every build (CPU only):
 *   - kn_model_load refuses weight_dtype values it cannot honour, before
 *     opening the file;
 *   - a "fake device" (host memory, device field KN_DEVICE_CUDA, the cpu
 *     backend's compute) drives model.c's whole device path (weights
 *     uploaded and converted a block of rows at a time, wq|wk|wv and w1|w3
 *     stacked, inputs and logits staged through copy_in/copy_out) and must
 *     reproduce the host path: f32 weights to 1e-5 relative L2 of the logits
 *     (bf16 2e-2, f16 2e-3: the weights and, in the prompt plan, the
 *     activations rounded, as bf16 autocast does; f16 KV caches: see
 *     f16_cache_tol).
 * With CUDA and a GPU (SKIP otherwise, with the reason):
 *   - the mixed-precision kernels (f32 A x bf16/f16 W on the tensor cores,
 *     f16 GEMV) against a float64 reference of the rounded operands, on fresh
 *     random data with NaN-poisoned outputs;
 *   - logits of kn_backend_cuda() vs the CPU backend's f32-exact path
 *     (KN_QMM_ACT=f32: quantized weights dequantized, f32 activations), as
 *     relative L2 over the vocabulary, with a tolerance per weight dtype
 *     (f32: 1e-4, f16: 2e-2, bf16: 6e-2; see TOL below);
 *   - greedy tokens agree for 24 steps up to the first near tie: a step whose
 *     CPU top-2 logit margin is below 4x the largest logit difference seen
 *     between the two backends on the prompt (after such a step the two runs
 *     may diverge legitimately and comparing further tests nothing);
 *   - a prompt prefilled in chunks of 7 gives the logits of one prefill;
 *   - chat-style KV reuse evaluates only the new tokens and generates what a
 *     fresh model given the whole conversation generates;
 *   - CUDA graphs on and off give the same greedy tokens and logits, and
 *     decode steps are graph replays.
 * Models: a tiny random llm.c GPT-2 written to /tmp, stories260K (llama2.c
 * f32), llama-2-tiny-random.gguf (f16) from KN_ASSETS, and SmolLM2-135M Q4_1
 * from KN_SMOLLM2 or models/ when present.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_backend.h"
#include "kiln_llm.h"
#include "backends/quant/quant.h"      /* defines: kn_quant_force_act_mode */
#include "core/fp16.h"      /* defines: kn_fp32_to_bf16, kn_fp32_to_fp16 and back */
#include "formats/llmc_gpt2.h"  /* defines: kn_llmc_gpt2_write */
#include "formats/gguf_write.h" /* defines: kn_gguf_writer (the quantized test models) */
#include "core/env.h"           /* defines: kn_env_reload (KN_CUDA_GRAPH on and off) */
#include "backends/cuda/epilogue_rule.h"  /* defines: kn_cu_epilogue_rule (the fake device's) */
#include <unistd.h>
#ifdef KN_CUDA
#include "kiln_cuda.h"
#include "backends/cuda/kn_cuda.h"
#include <cuda_runtime.h>
#endif

typedef struct { const char *name, *path, *tok; } model_case;

/* A tiny random llm.c GPT-2 checkpoint (C 32, 4 heads, 2 layers, V 97 padded
 * to 128, 64 positions): the GPT-2 graph (LayerNorm, biases, fused qkv,
 * learned positions, tied output) on the device path. Written once to /tmp. */
static char g_gpt2_path[64];
static void rm_gpt2(void) { if (g_gpt2_path[0]) remove(g_gpt2_path); }
static const char *tiny_gpt2(void) {
    if (g_gpt2_path[0]) return g_gpt2_path;
    kn_llmc_gpt2_config c = {64, 97, 128, 2, 4, 32};
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    if (kn_llmc_gpt2_shapes(&c, sh, NULL)) return NULL;
    const void *pp[KN_GPT2_NPARAMS];
    float *buf[KN_GPT2_NPARAMS];
    kn_test_seed(7);
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) {
        bool gain = p == KN_GPT2_LN1W || p == KN_GPT2_LN2W || p == KN_GPT2_LNFW;
        buf[p] = malloc(sizeof(float) * (size_t)sh[p].numel);
        for (int64_t i = 0; i < sh[p].numel; i++) buf[p][i] = (float)(gain ? kn_test_uniform(0.8, 1.2) : kn_test_uniform(-0.3, 0.3));
        pp[p] = buf[p];
    }
    snprintf(g_gpt2_path, sizeof g_gpt2_path, "/tmp/kn_test_cuda_llm_gpt2_%d.bin", (int)getpid());
    kn_status st = kn_llmc_gpt2_write(g_gpt2_path, &c, KN_F32, pp);
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) free(buf[p]);
    if (st) { g_gpt2_path[0] = 0; return NULL; }
    atexit(rm_gpt2);
    return g_gpt2_path;
}

/* Tiny random llama GGUF files with quantized matrices (C 256, 2 layers, 4
 * heads / 2 KV heads of 64, F 512, V 300, tied output, a placeholder "gpt2"
 * vocabulary of V pieces "t0".. that tokenizes nothing): k = 0 every matrix
 * Q4_0 and the embedding Q8_0; k = 1 the mix of a Q4_K_M file (Q4_K, with
 * attn_v and ffn_down Q6_K, so wq|wk|wv are not stacked on KN_WEIGHTS_FILE;
 * ffn_gate Q5_K, so w1|w3 are not either; the embedding Q6_K). Written once
 * to /tmp. */
static char g_q_path[2][64];
static void rm_q(void) { for (int k = 0; k < 2; k++) if (g_q_path[k][0]) remove(g_q_path[k]); }
static kn_status put_mat(kn_gguf_writer *w, const char *name, kn_dtype t, int64_t rows, int64_t cols, void **keep) {
    float *f = malloc(sizeof(float) * (size_t)(rows * cols));
    size_t rb = kn_dtype_nbytes(t, cols);
    char *q = malloc(rb * (size_t)rows);
    *keep = q;
    if (!f || !q) { free(f); return KN_ERR_NOMEM; }
    double a = 1.0 / sqrt((double)cols) * 1.7;     /* unit-ish activations through the layers */
    for (int64_t i = 0; i < rows * cols; i++) f[i] = (float)kn_test_uniform(-a, a);
    kn_status st = KN_OK;
    for (int64_t r = 0; r < rows && !st; r++) st = kn_quantize_row(t, f + r * cols, q + rb * (size_t)r, cols);
    free(f);
    if (!st) kn_gguf_w_tensor(w, name, t, 2, (int64_t[]){cols, rows}, q);
    return st;
}
static const char *tiny_quant(int k) {
    if (g_q_path[k][0]) return g_q_path[k];
    enum { C = 256, L = 2, H = 4, HKV = 2, F = 512, V = 300, NKEEP = 32 };
    kn_gguf_writer *w = NULL;
    if (kn_gguf_writer_new(&w)) return NULL;
    kn_gguf_w_str(w, "general.architecture", "llama");
    kn_gguf_w_str(w, "general.name", k ? "tiny-random-q4_k_m" : "tiny-random-q4_0");
    kn_gguf_w_u32(w, "llama.context_length", 128);
    kn_gguf_w_u32(w, "llama.embedding_length", C);
    kn_gguf_w_u32(w, "llama.block_count", L);
    kn_gguf_w_u32(w, "llama.feed_forward_length", F);
    kn_gguf_w_u32(w, "llama.attention.head_count", H);
    kn_gguf_w_u32(w, "llama.attention.head_count_kv", HKV);
    kn_gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    static char names[V][8];
    const char *toks[V];
    size_t lens[V];
    for (int i = 0; i < V; i++) { snprintf(names[i], sizeof names[i], "t%d", i); toks[i] = names[i]; lens[i] = strlen(names[i]); }
    kn_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    kn_gguf_w_arr_str(w, "tokenizer.ggml.tokens", V, toks, lens);
    const char *mg[1] = {"t1 t2"};
    size_t ml[1] = {5};
    kn_gguf_w_arr_str(w, "tokenizer.ggml.merges", 1, mg, ml);
    kn_test_seed(90 + (unsigned)k);
    void *keep[NKEEP] = {0};
    float *norms[2 * L + 1];
    int nk = 0;
    kn_dtype q = k ? KN_Q4_K : KN_Q4_0, qv = k ? KN_Q6_K : KN_Q4_0, q1 = k ? KN_Q5_K : KN_Q4_0;
    kn_status st = put_mat(w, "token_embd.weight", k ? KN_Q6_K : KN_Q8_0, V, C, &keep[nk++]);
    for (int i = 0; i < 2 * L + 1; i++) {
        norms[i] = malloc(sizeof(float) * C);
        for (int j = 0; j < C; j++) norms[i][j] = (float)kn_test_uniform(0.8, 1.2);
    }
    kn_gguf_w_tensor_f32(w, "output_norm.weight", 1, (int64_t[]){C}, norms[2 * L]);
    char nm[64];
    for (int l = 0; l < L && !st; l++) {
#define M(suffix, t, r, c) snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l); if (!st) st = put_mat(w, nm, t, r, c, &keep[nk++]);
        M("attn_q", q, C, C) M("attn_k", q, HKV * 64, C) M("attn_v", qv, HKV * 64, C) M("attn_output", q, C, C)
        M("ffn_gate", q1, F, C) M("ffn_up", q, F, C) M("ffn_down", qv, C, F)
#undef M
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        kn_gguf_w_tensor_f32(w, nm, 1, (int64_t[]){C}, norms[2 * l]);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        kn_gguf_w_tensor_f32(w, nm, 1, (int64_t[]){C}, norms[2 * l + 1]);
    }
    snprintf(g_q_path[k], sizeof g_q_path[k], "/tmp/kn_test_cuda_llm_q%d_%d.gguf", k, (int)getpid());
    if (!st) st = kn_gguf_write_file(w, g_q_path[k]);
    if (st) { fprintf(stderr, "  writing %s: %s\n", g_q_path[k], kn_last_error()); g_q_path[k][0] = 0; }
    kn_gguf_writer_free(w);
    for (int i = 0; i < nk; i++) free(keep[i]);
    for (int i = 0; i < 2 * L + 1; i++) free(norms[i]);
    static bool reg;
    if (!reg) { reg = true; atexit(rm_q); }
    return g_q_path[k][0] ? g_q_path[k] : NULL;
}

static int model_cases(model_case *mc) {
    int n = 0;
    const char *gp = tiny_gpt2();
    if (gp) mc[n++] = (model_case){"tiny-gpt2-llmc", gp, NULL};
    for (int k = 0; k < 2; k++) {
        const char *qp = tiny_quant(k);
        if (qp) mc[n++] = (model_case){k ? "tiny-llama-q4_k_m" : "tiny-llama-q4_0", qp, NULL};
    }
    const char *s = kn_asset("llama2c/stories260K.bin"), *t = kn_asset("llama2c/tok512.bin");
    if (s && t) mc[n++] = (model_case){"stories260K", s, t};
    const char *g = kn_asset("gguf/llama-2-tiny-random.gguf");
    if (g) mc[n++] = (model_case){"tiny-random-f16", g, NULL};
    const char *sm = getenv("KN_SMOLLM2");
    if (!sm) sm = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(sm, "rb");
    if (f) { fclose(f); mc[n++] = (model_case){"SmolLM2-135M-Q4_1", sm, NULL}; }
    return n;
}

static kn_model *load_on(const model_case *mc, kn_backend *be, kn_weight_dtype wd, int n_batch, bool kv_f16) {
    kn_model_opts o = {.tokenizer_path = mc->tok, .n_ctx = 64,   /* the tiny GPT-2 has 64 positions */ .n_batch = n_batch, .backend = be,
                       .kv_f16 = kv_f16, .weight_dtype = wd};
    kn_model *m = NULL;
    if (kn_model_load(mc->path, &o, &m) != KN_OK) {
        fprintf(stderr, "  %s on %s: %s\n", mc->name, be ? be->name : "default", kn_last_error());
        return NULL;
    }
    return m;
}

/* prompt tokens: the tokenizer's ids of a short text, or a fixed pattern */
static int prompt_tokens(kn_model *m, int32_t *ids, int cap) {
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int n = 0, V = kn_model_get_config(m)->n_vocab;
    const char *txt = "Once upon a time, the capital of France was";
    if (tok && kn_tokenize(tok, txt, strlen(txt), kn_tokenizer_add_bos(tok), false, ids, cap, &n) == KN_OK && n >= 4)
        return n;
    for (n = 0; n < 12 && n < cap; n++) ids[n] = (int32_t)((n * 7919 + 13) % V);
    return n;
}

static double rel_l2(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d; den += (double)b[i] * b[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1);
}
static const char *wd_name(kn_weight_dtype w) {
    return w == KN_WEIGHTS_F32 ? "f32" : w == KN_WEIGHTS_F16 ? "f16" : w == KN_WEIGHTS_FILE ? "file" : "bf16";
}

/* Two f16 KV caches filled from K, V that differ by float rounding (1e-6)
 * round some elements to neighbouring f16 values, and SmolLM2 amplifies that:
 * the cpu backend against the fake device (cpu compute, stacked matmuls) with
 * f16 caches differ by 5.4e-4 rel L2 while f16 vs f32 caches on the cpu
 * differ by 2.8e-4 (measured 2026-11-21), and the GPU vs the cpu by 5.7e-4.
 * So two f16-cache runs must agree to 3x the f16 cache's own effect d16
 * (floor 1e-5), not to the f32 tolerance. */
static double f16_cache_tol(double d16) { return 3 * d16 > 1e-5 ? 3 * d16 : 1e-5; }

/* ---- CPU only ---------------------------------------------------------------------- */
TEST(weight_dtype_checked) {
    kn_model *m = (kn_model *)1;
    kn_model_opts o = {.weight_dtype = (kn_weight_dtype)77};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_INVALID && m == NULL,
          "out-of-range weight_dtype must be refused before the file is opened: %s", kn_last_error());
    o = (kn_model_opts){.backend = kn_backend_cpu(), .weight_dtype = KN_WEIGHTS_BF16};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_INVALID && strstr(kn_last_error(), "device"),
          "bf16 weights on the cpu backend must be refused with a hint: %s", kn_last_error());
    o = (kn_model_opts){.backend = kn_backend_ref(), .weight_dtype = KN_WEIGHTS_F32};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_INVALID, "ref backend: %s", kn_last_error());
    o = (kn_model_opts){.backend = kn_backend_cpu(), .weight_dtype = KN_WEIGHTS_AUTO};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_IO, "AUTO on the cpu backend is valid: %s", kn_last_error());
    o = (kn_model_opts){.backend = kn_backend_cpu(), .weight_dtype = KN_WEIGHTS_FILE};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_IO, "FILE (what a host backend does) is valid: %s", kn_last_error());
    o = (kn_model_opts){.weight_dtype = (kn_weight_dtype)(KN_WEIGHTS_FILE + 1)};
    CHECK(kn_model_load("/nonexistent/model.gguf", &o, &m) == KN_ERR_INVALID, "one past FILE: %s", kn_last_error());
}

/* kn_model_eval_top of d for token tok at position pos (the prompt before it
 * evaluated) against the host model h's logits of the same step: k distinct
 * ids, logits best first, each within eps of h's logit of that id, none
 * worse than h's k-th best by more than eps (near ties may swap). Returns
 * the number of failures, printing the first. */
static int top_check(kn_model *d, kn_model *h, int32_t tok, int pos, int k, double eps, const char *what) {
    int V = kn_model_get_config(h)->n_vocab, bad = 0;
    float *lh = malloc(sizeof(float) * (size_t)V), *srt = malloc(sizeof(float) * (size_t)V), tv[KN_MODEL_TOP_MAX];
    int32_t ti[KN_MODEL_TOP_MAX];
    if (kn_model_eval(h, &tok, 1, pos, lh, false) || kn_model_eval_top(d, &tok, 1, pos, k, ti, tv)) {
        fprintf(stderr, "  %s: %s\n", what, kn_last_error());
        free(lh); free(srt);
        return 1;
    }
    memcpy(srt, lh, sizeof(float) * (size_t)V);
    for (int i = 0; i < k; i++)          /* the k-th best by partial selection */
        for (int j = i + 1; j < V; j++) if (srt[j] > srt[i]) { float t = srt[i]; srt[i] = srt[j]; srt[j] = t; }
    for (int i = 0; i < k && !bad; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup = dup || ti[j] == ti[i];
        if (ti[i] < 0 || ti[i] >= V || dup || (i && tv[i] > tv[i - 1]) || fabs(tv[i] - lh[ti[i]]) > eps || tv[i] < srt[k - 1] - eps) {
            fprintf(stderr, "  %s: candidate %d: id %d logit %g (host %g, host's k-th best %g, eps %g)\n", what, i, ti[i], tv[i],
                    ti[i] >= 0 && ti[i] < V ? lh[ti[i]] : NAN, srt[k - 1], eps);
            bad++;
        }
    }
    free(lh); free(srt);
    return bad;
}

/* host memory posing as a device: kn_from_ptr refuses it, so model.c takes
 * the upload path; compute is the cpu backend's */
static size_t g_fd_refuse;   /* a test's out-of-memory: allocations of exactly this many bytes fail */
static void *fd_alloc(kn_backend *be, size_t n) { return n && n == g_fd_refuse ? NULL : kn_backend_cpu()->alloc(kn_backend_cpu(), n); }
static void fd_free(kn_backend *be, void *p) { kn_backend_cpu()->free(kn_backend_cpu(), p); }
static kn_status fd_copy(kn_backend *be, void *d, const void *s, size_t n) { memcpy(d, s, n); return KN_OK; }
static kn_status fd_compute(kn_backend *be, const kn_exec *e) { return kn_backend_cpu()->compute(kn_backend_cpu(), e); }
static kn_backend g_fake = {KN_BACKEND_VERSION, "fake-device", KN_DEVICE_CUDA, fd_alloc, fd_free, fd_copy, fd_copy,
                            fd_compute, NULL, NULL, NULL};

TEST(fake_device_matches_host) {
    setenv("KN_LLM_TOP", "1", 1);        /* the step plan's candidates (opt-in on devices) */
    kn_env_reload();
    model_case mc[8];
    int nm = model_cases(mc);
    if (!nm) SKIP("no model: stories260K/tok512 and llama-2-tiny-random.gguf missing under KN_ASSETS");
    kn_quant_force_act_mode(KN_QACT_F32);
    for (int i = 0; i < nm; i++) {
        kn_model *h = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, false);
        CHECK(h, "host load of %s", mc[i].name);
        if (!h) continue;
        int V = kn_model_get_config(h)->n_vocab;
        int32_t ids[64];
        int n = prompt_tokens(h, ids, 64);
        float *lh = malloc(sizeof(float) * (size_t)V), *ld = malloc(sizeof(float) * (size_t)V);
        CHECK(kn_model_eval(h, ids, n, 0, lh, false) == KN_OK, "%s", kn_last_error());
        /* FILE: quantized blocks uploaded raw (stacked where the dtypes agree),
         * multiplied by the cpu backend's quantized matmul as on the host */
        kn_weight_dtype wds[3] = {KN_WEIGHTS_F32, KN_WEIGHTS_BF16, KN_WEIGHTS_FILE};
        for (int w = 0; w < 3; w++) {
            if (w == 1 && strstr(mc[i].name, "SmolLM2")) continue;     /* the slow half-precision CPU matmuls */
            kn_model *d = load_on(&mc[i], &g_fake, wds[w], 5, false);  /* chunks of 5: staging with T < n_batch */
            CHECK(d, "fake-device load of %s", mc[i].name);
            if (!d) continue;
            kn_dtype rw = w == 2 ? kn_model_get_config(h)->weight_type : w ? KN_BF16 : KN_F32;
            CHECK(kn_model_get_config(d)->run_weight_type == rw, "run_weight_type %s, want %s",
                  kn_dtype_name(kn_model_get_config(d)->run_weight_type), kn_dtype_name(rw));
            for (int k = 0; k < V; k++) ld[k] = NAN;
            CHECK(kn_model_eval(d, ids, n, 0, ld, false) == KN_OK, "%s", kn_last_error());
            /* bf16/f16: weights and the prompt plan's activations rounded (cast_prefill);
             * bf16 measured 0.002-0.012 on these models (0.004-0.006 with KN_LLM_PREFILL_CAST=0) */
            double e = rel_l2(ld, lh, V), tol = rw == KN_BF16 ? 2e-2 : rw == KN_F16 ? 2e-3 : 1e-5;
            fprintf(stderr, "  fake device %-18s %-4s weights: logits rel L2 %.3g (tol %.0e)\n", mc[i].name, wd_name(wds[w]), e, tol);
            CHECK(e < tol, "%s %s: rel err %.3g", mc[i].name, wd_name(wds[w]), e);
            /* the step plan's candidates (TOPK on the "device") */
            CHECK(kn_model_top_on_device(d) && !kn_model_top_on_device(h), "%s: candidates on the device only", mc[i].name);
            if (w == 0) {                        /* k out of range: refused with the range, nothing evaluated */
                int32_t bi[KN_MODEL_TOP_MAX + 1];
                float bv[KN_MODEL_TOP_MAX + 1];
                int ks[2] = {0, KN_MODEL_TOP_MAX + 1};
                for (int q = 0; q < 2; q++)
                    CHECK(kn_model_eval_top(d, ids, 1, n, ks[q], bi, bv) == KN_ERR_INVALID && strstr(kn_last_error(), "k = "),
                          "k = %d: %s", ks[q], kn_last_error());
            }
            if (w != 1) CHECK(!top_check(d, h, ids[0], n, 40 < V ? 40 : V, 1e-4, mc[i].name), "%s %s: top candidates", mc[i].name, wd_name(wds[w]));
            kn_model_free(d);
        }
        /* f16 KV caches on both sides (the cast before index_copy, read back by sdpa) */
        kn_model *h16 = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, true);
        kn_model *d16 = load_on(&mc[i], &g_fake, KN_WEIGHTS_F32, 5, true);
        CHECK(h16 && d16, "f16-cache loads of %s", mc[i].name);
        float *l16 = malloc(sizeof(float) * (size_t)V);
        if (h16 && d16 && kn_model_eval(h16, ids, n, 0, l16, false) == KN_OK && kn_model_eval(d16, ids, n, 0, ld, false) == KN_OK) {
            double e = rel_l2(ld, l16, V), c = rel_l2(l16, lh, V);
            fprintf(stderr, "  fake device %-18s f16 KV cache: logits rel L2 %.3g (f16 vs f32 cache %.3g)\n", mc[i].name, e, c);
            CHECK(e < f16_cache_tol(c), "%s f16 cache: rel err %.3g", mc[i].name, e);
        } else CHECK(0, "%s", kn_last_error());
        free(l16);
        kn_model_free(h16); kn_model_free(d16);
        free(lh); free(ld);
        kn_model_free(h);
    }
    kn_quant_force_act_mode(-1);
}

/* The logits [3, V] of a short prompt and two decode steps after it (the
 * same ids for every load of one model), malloc'd; NULL (reported) on failure */
static float *prompt_two_steps(kn_model *d) {
    int V = kn_model_get_config(d)->n_vocab;
    int32_t ids[64];
    int n = prompt_tokens(d, ids, 62);
    ids[n] = ids[1]; ids[n + 1] = ids[2];
    float *lg = malloc(sizeof(float) * (size_t)V * 3);
    bool ok = lg && kn_model_eval(d, ids, n, 0, lg, false) == KN_OK && kn_model_eval(d, ids + n, 1, n, lg + V, false) == KN_OK &&
              kn_model_eval(d, ids + n + 1, 1, n + 1, lg + 2 * V, false) == KN_OK;
    CHECK(ok, "prompt and two steps: %s", kn_last_error());
    if (!ok) { free(lg); return NULL; }
    return lg;
}

/* A device model gathers the token rows from a device copy of an
 * f32/f16/bf16 table (the ids cross the bus, not the rows); with
 * KN_LLM_DEVICE_EMBED=0, and for quantized tables, the host looks them up.
 * Both must give the same bits: a prompt in chunks of 5 and two decode
 * steps, f32 and bf16 weights. */
TEST(fake_device_gathers_tokens) {
    model_case mc[8];
    int nm = model_cases(mc);
    kn_quant_force_act_mode(KN_QACT_F32);
    int gathered = 0;
    for (int i = 0; i < nm; i++) {
        if (strstr(mc[i].name, "SmolLM2")) continue;                  /* slow, and a quantized table like tiny-llama's */
        bool quant_table = strstr(mc[i].name, "tiny-llama") != NULL;  /* Q8_0 / Q6_K token_embd (tiny_quant) */
        for (int w = 0; w < 2; w++) {
            kn_model *d[2];
            for (int h = 0; h < 2; h++) {
                setenv("KN_LLM_DEVICE_EMBED", h ? "0" : "1", 1);
                kn_env_reload();
                d[h] = load_on(&mc[i], &g_fake, w ? KN_WEIGHTS_BF16 : KN_WEIGHTS_F32, 5, false);
            }
            unsetenv("KN_LLM_DEVICE_EMBED");
            kn_env_reload();
            CHECK(d[0] && d[1], "%s: loads", mc[i].name);
            if (!d[0] || !d[1]) { kn_model_free(d[0]); kn_model_free(d[1]); continue; }
            int V = kn_model_get_config(d[0])->n_vocab;
            float *lg[2] = {prompt_two_steps(d[0]), prompt_two_steps(d[1])};
            CHECK(lg[0] && lg[1] && !memcmp(lg[0], lg[1], sizeof(float) * (size_t)V * 3),
                  "%s %s weights: gathered rows' logits differ from the host lookup's", mc[i].name, w ? "bf16" : "f32");
            kn_plan_stats s[2];
            for (int h = 0; h < 2; h++) kn_model_plan_stats(d[h], &s[h]);
            /* the gather is one node more in the step plan (and a cast of 16-bit rows) */
            CHECK(quant_table ? s[0].nodes == s[1].nodes : s[0].nodes > s[1].nodes, "%s: %d nodes a step with the gather, %d without",
                  mc[i].name, s[0].nodes, s[1].nodes);
            gathered += !quant_table;
            /* an id outside the vocabulary: refused before anything runs, as on the host */
            int32_t bad[2] = {1, V};
            float *out = malloc(sizeof(float) * (size_t)V);
            CHECK(out && kn_model_eval(d[0], bad, 2, 0, out, false) == KN_ERR_INVALID && strstr(kn_last_error(), "outside the vocabulary"),
                  "%s", kn_last_error());
            free(out);
            free(lg[0]); free(lg[1]);
            kn_model_free(d[0]); kn_model_free(d[1]);
        }
    }
    kn_quant_force_act_mode(-1);
    if (!gathered) SKIP("no model with an f32/f16/bf16 token table (the tiny GPT-2 could not be written to /tmp)");
}

/* Matmul prologues and epilogues in the step plan (docs/COMPILER.md "Matmul
 * prologues"): a fake device that takes them as the CUDA backend does
 * (its rule, backends/cuda/epilogue_rule.h; f32 products), computing them
 * on the cpu (kn_ref_prologue). Each Llama layer's step runs its q|k|v and gate|up
 * products with the RMS norm before them, the down product with SwiGLU,
 * and the output with the final norm: 3 L + 1 prologues; prompt plans take
 * none. Logits of a prompt and two decode steps match the plain fake
 * device's. */
static bool fdp_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out) {
    (void)be;
    return kn_cu_epilogue_rule(mm, epi, out) && epi->dt == KN_F32 && out == KN_F32;
}
TEST(fake_device_step_prologues) {
    kn_backend pro = g_fake;
    pro.name = "fake-device-prologues";
    pro.epilogue_ok = fdp_epilogue_ok;
    model_case mc[8];
    int nm = model_cases(mc), seen = 0;
    kn_quant_force_act_mode(KN_QACT_F32);
    for (int i = 0; i < nm; i++) {
        if (strcmp(mc[i].name, "stories260K") && strcmp(mc[i].name, "tiny-random-f16")) continue;
        kn_model *d[2] = {load_on(&mc[i], &g_fake, KN_WEIGHTS_F32, 5, false), load_on(&mc[i], &pro, KN_WEIGHTS_F32, 5, false)};
        CHECK(d[0] && d[1], "%s: loads", mc[i].name);
        if (!d[0] || !d[1]) { kn_model_free(d[0]); kn_model_free(d[1]); continue; }
        int V = kn_model_get_config(d[0])->n_vocab, L = kn_model_get_config(d[0])->n_layers;
        float *lg[2] = {prompt_two_steps(d[0]), prompt_two_steps(d[1])};
        double e = lg[0] && lg[1] ? rel_l2(lg[1], lg[0], V * 3) : INFINITY;
        CHECK(e < 1e-5, "%s: logits with prologues rel L2 %.3g from without", mc[i].name, e);
        kn_plan_stats s[2];
        for (int h = 0; h < 2; h++) kn_model_plan_stats(d[h], &s[h]);
        CHECK(s[0].prologues == 0 && s[1].prologues == 3 * L + 1, "%s: %d prologues in the step plan, expected %d (L = %d)",
              mc[i].name, s[1].prologues, 3 * L + 1, L);
        /* records: q|k|v, o (+ residual), gate|up, down (+ residual) a layer, and the output */
        CHECK(s[1].epilogues == 4 * L + 1 && s[1].nodes < s[0].nodes, "%s: %d matmuls with epilogues or prologues, %d nodes against %d",
              mc[i].name, s[1].epilogues, s[1].nodes, s[0].nodes);
        seen++;
        free(lg[0]); free(lg[1]);
        kn_model_free(d[0]); kn_model_free(d[1]);
    }
    kn_quant_force_act_mode(-1);
    if (!seen) SKIP("stories260K and llama-2-tiny-random.gguf missing under KN_ASSETS (scripts/fetch_assets.sh)");
}

/* The device copy of an untied table is an optimisation: where the device
 * has no room for it the model still loads and the host looks the rows up.
 * The f16 table of tiny-random-f16 with f32 weights is the only allocation
 * of V x C x 2 bytes, so refusing that size refuses just the copy. */
TEST(fake_device_table_without_room) {
    model_case mc[8];
    int nm = model_cases(mc), at = -1;
    for (int i = 0; i < nm; i++) if (!strcmp(mc[i].name, "tiny-random-f16")) at = i;
    if (at < 0) SKIP("gguf/llama-2-tiny-random.gguf not found under KN_ASSETS (scripts/fetch_assets.sh)");
    kn_model *d[2];
    d[0] = load_on(&mc[at], &g_fake, KN_WEIGHTS_F32, 5, false);
    CHECK(d[0], "loads with room");
    if (!d[0]) return;
    const kn_model_config *c = kn_model_get_config(d[0]);
    int V = c->n_vocab;
    g_fd_refuse = (size_t)V * (size_t)c->dim * 2;
    d[1] = load_on(&mc[at], &g_fake, KN_WEIGHTS_F32, 5, false);
    g_fd_refuse = 0;
    CHECK(d[1], "loads without room for the table's copy: %s", kn_last_error());
    if (d[1]) {
        int32_t ids[8] = {1, 5, 9, 2, 7, 3, 4, 6};
        float *lg[2] = {malloc(sizeof(float) * (size_t)V), malloc(sizeof(float) * (size_t)V)};
        for (int h = 0; h < 2; h++) CHECK(kn_model_eval(d[h], ids, 8, 0, lg[h], false) == KN_OK, "%s", kn_last_error());
        CHECK(!memcmp(lg[0], lg[1], sizeof(float) * (size_t)V), "the host lookup's logits differ from the gather's");
        kn_plan_stats s[2];
        for (int h = 0; h < 2; h++) kn_model_plan_stats(d[h], &s[h]);
        CHECK(s[1].nodes < s[0].nodes, "without the copy the step plan has no gather: %d nodes against %d", s[1].nodes, s[0].nodes);
        free(lg[0]); free(lg[1]);
    }
    kn_model_free(d[0]); kn_model_free(d[1]);
}

/* ---- GPU ------------------------------------------------------------------------------- */
#ifndef KN_CUDA
TEST(cuda_llm) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
static kn_backend *gpu(void) {
    static kn_backend *g;
    static bool tried;
    if (!tried) { tried = true; g = kn_backend_cuda(); }
    return g;
}
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

static double max_abs(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (!(d <= m)) m = d; }
    return m;
}
static int argmax2(const float *l, int n, double *margin) {
    int b = 0;
    for (int i = 1; i < n; i++) if (l[i] > l[b]) b = i;
    double second = -INFINITY;
    for (int i = 0; i < n; i++) if (i != b && l[i] > second) second = l[i];
    *margin = l[b] - second;
    return b;
}

static float rnd_f(void) { return (float)kn_test_uniform(-1, 1); }

/* C = round(A) @ W^T against float64 of the rounded operands: only the f32
 * accumulation order differs, so 1e-5 relative L2; outputs poisoned with
 * NaN (0xff bytes) first, so an unwritten element fails */
static double mixed_case(kn_dtype wdt, int64_t M, int64_t N, int64_t K, bool gemv) {
    size_t na = (size_t)(M * K), nw = (size_t)(N * K), nc = (size_t)(M * N);
    float *A = malloc(4 * na), *C = malloc(4 * nc);
    uint16_t *W = malloc(2 * nw);
    double *ref = malloc(8 * nc);
    for (size_t i = 0; i < na; i++) A[i] = rnd_f();
    for (size_t i = 0; i < nw; i++) W[i] = wdt == KN_BF16 ? kn_fp32_to_bf16(rnd_f()) : kn_fp32_to_fp16(rnd_f());
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) {
                float a = A[m * K + k];
                if (!gemv) a = wdt == KN_BF16 ? kn_bf16_to_fp32(kn_fp32_to_bf16(a)) : kn_fp16_to_fp32(kn_fp32_to_fp16(a));
                float w = wdt == KN_BF16 ? kn_bf16_to_fp32(W[n * K + k]) : kn_fp16_to_fp32(W[n * K + k]);
                acc += (double)a * w;
            }
            ref[m * N + n] = acc;
        }
    void *dA, *dW, *dC;
    double err = INFINITY;
    if (cudaMalloc(&dA, 4 * na) || cudaMalloc(&dW, 2 * nw) || cudaMalloc(&dC, 4 * nc)) goto out;
    cudaMemcpy(dA, A, 4 * na, cudaMemcpyHostToDevice);
    cudaMemcpy(dW, W, 2 * nw, cudaMemcpyHostToDevice);
    cudaMemset(dC, 0xff, 4 * nc);
    kn_status st = gemv ? (wdt == KN_F16 ? kn_cuda_gemv_f16(dC, dW, dA, NULL, N, K, NULL) : kn_cuda_gemv_bf16(dC, dW, dA, NULL, N, K, NULL))
                        : kn_cuda_gemm_tc_f32a(wdt, true, M, N, K, 1.0f, dA, K, dW, K, dC, KN_F32, N, NULL, NULL);
    if (st) { fprintf(stderr, "  %s\n", kn_last_error()); goto free_dev; }
    if (cudaDeviceSynchronize() || cudaMemcpy(C, dC, 4 * nc, cudaMemcpyDeviceToHost)) goto free_dev;
    {
        double num = 0, den = 0;
        for (size_t i = 0; i < nc; i++) { double d = C[i] - ref[i]; num += d * d; den += ref[i] * ref[i]; }
        err = sqrt(num / (den > 0 ? den : 1));
        for (size_t i = 0; i < nc; i++) if (isnan(C[i])) err = INFINITY;
    }
free_dev:
    cudaFree(dA); cudaFree(dW); cudaFree(dC);
out:
    free(A); free(C); free(W); free(ref);
    return err;
}

TEST(gpu_mixed_precision_kernels) {
    NEED_GPU();
    kn_test_seed(42);
    static const int64_t shapes[][3] = {{1, 576, 576}, {7, 1536, 576}, {130, 200, 172}, {512, 576, 1536}, {33, 49, 8}};
    for (int d = 0; d < 2; d++) {
        kn_dtype wdt = d ? KN_F16 : KN_BF16;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            double e = mixed_case(wdt, shapes[s][0], shapes[s][1], shapes[s][2], false);
            CHECK(e < 1e-5, "gemm_tc_f32a %s M=%lld N=%lld K=%lld: rel err %.3g", kn_dtype_name(wdt),
                  (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2], e);
        }
        static const int64_t gv[][2] = {{576, 576}, {1536, 576}, {49152, 576}, {5, 1536}};
        for (size_t s = 0; s < sizeof gv / sizeof gv[0]; s++) {
            double e = mixed_case(wdt, 1, gv[s][0], gv[s][1], true);
            CHECK(e < 1e-5, "gemv %s N=%lld K=%lld: rel err %.3g", kn_dtype_name(wdt), (long long)gv[s][0], (long long)gv[s][1], e);
        }
    }
}

/* relative L2 tolerance of GPU logits vs the CPU's f32-exact path, per weight
 * dtype: f32 differs by summation order only; f16/bf16 round every weight and
 * every matmul input (11 / 8 significant bits) through all layers */
static double TOL(kn_weight_dtype w) { return w == KN_WEIGHTS_F32 ? 1e-4 : w == KN_WEIGHTS_F16 ? 2e-2 : 6e-2; }
/* FILE: a prompt of more than 8 tokens takes the bf16 GEMM path (as BF16);
 * the f16 test model keeps f16 weights, which round the activations to f16 */

TEST(gpu_logits_and_greedy_match_cpu) {
    NEED_GPU();
    setenv("KN_LLM_TOP", "1", 1);        /* the step's candidates selected on the GPU */
    kn_env_reload();
    model_case mc[8];
    int nm = model_cases(mc);
    if (!nm) SKIP("no model: stories260K/tok512, llama-2-tiny-random.gguf (KN_ASSETS) or SmolLM2 (KN_SMOLLM2) missing");
    kn_quant_force_act_mode(KN_QACT_F32);
    enum { NGEN = 24 };
    for (int i = 0; i < nm; i++) {
        kn_model *c = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, false);
        CHECK(c, "cpu load");
        if (!c) continue;
        int V = kn_model_get_config(c)->n_vocab;
        int32_t ids[64], cg[NGEN];
        double margin[NGEN];
        int n = prompt_tokens(c, ids, 64);
        float *lc = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V), *lc0 = malloc(sizeof(float) * (size_t)V);
        CHECK(kn_model_eval(c, ids, n, 0, lc0, false) == KN_OK, "%s", kn_last_error());
        memcpy(lc, lc0, sizeof(float) * (size_t)V);
        for (int s = 0; s < NGEN; s++) {       /* the CPU's greedy run and its top-2 margins */
            cg[s] = argmax2(lc, V, &margin[s]);
            if (kn_model_eval(c, &cg[s], 1, n + s, lc, false)) { CHECK(0, "%s", kn_last_error()); break; }
        }
        kn_weight_dtype wds[4] = {KN_WEIGHTS_F32, KN_WEIGHTS_F16, KN_WEIGHTS_BF16, KN_WEIGHTS_FILE};
        for (int w = 0; w < 4; w++) {
            kn_model *g = load_on(&mc[i], gpu(), wds[w], 64, false);
            CHECK(g, "gpu load");
            if (!g) continue;
            for (int k = 0; k < V; k++) lg[k] = NAN;
            CHECK(kn_model_eval(g, ids, n, 0, lg, false) == KN_OK, "%s", kn_last_error());
            double e = rel_l2(lg, lc0, V), mx = max_abs(lg, lc0, V), eps = 4 * mx > 1e-3 ? 4 * mx : 1e-3;
            CHECK(e < TOL(wds[w]), "%s %s weights: logits rel L2 %.3g >= %.0e", mc[i].name, wd_name(wds[w]), e, TOL(wds[w]));
            int agree = 0, tie_at = -1;
            for (int s = 0; s < NGEN; s++) {
                double mg;
                int t = argmax2(lg, V, &mg);
                if (t != cg[s]) {
                    if (margin[s] < eps) tie_at = s;
                    else CHECK(0, "%s %s: greedy step %d: gpu %d, cpu %d (cpu margin %.3g >= near-tie %.3g)", mc[i].name,
                               wd_name(wds[w]), s, t, cg[s], margin[s], eps);
                    break;
                }
                agree++;
                if (kn_model_eval(g, &t, 1, n + s, lg, false)) { CHECK(0, "%s", kn_last_error()); break; }
            }
            /* the step's candidates selected on the GPU (a fresh step after
             * the prompt: the greedy run above moved the cache on) */
            CHECK(kn_model_eval(g, ids, n, 0, lg, false) == KN_OK && kn_model_eval(c, ids, n, 0, lc, false) == KN_OK, "%s", kn_last_error());
            CHECK(!top_check(g, c, ids[0], n, KN_MODEL_TOP_MAX < V ? KN_MODEL_TOP_MAX : V, eps, mc[i].name), "%s %s: GPU top candidates",
                  mc[i].name, wd_name(wds[w]));
            fprintf(stderr, "  gpu %-18s %-4s weights: prompt %d tokens, logits rel L2 %.3g max|d| %.3g; greedy agrees %d/%d%s\n",
                    mc[i].name, wd_name(wds[w]), n, e, mx, agree, NGEN, tie_at >= 0 ? " (then a near tie)" : "");
            kn_model_free(g);
        }
        free(lc); free(lg); free(lc0);
        kn_model_free(c);
    }
    kn_quant_force_act_mode(-1);
}

/* KN_WEIGHTS_FILE one token at a time: every matmul is then the quantized
 * GEMV (f32 activations, f32 accumulation: only the summation order differs
 * from the CPU's f32-exact path) or, for the file's f32/f16 matrices, the
 * GEMV of that dtype; 2..8 tokens at once take the M <= 8 GEMV too. So the
 * logits must match the CPU's to 1e-4 (f16 files: 2e-2, their 2..8 rows go
 * through the tensor cores). The weights stay quantized on the device:
 * run_weight_type is the file's. */
TEST(gpu_file_weights_decode_matches_cpu) {
    NEED_GPU();
    model_case mc[8];
    int nm = model_cases(mc);
    if (!nm) SKIP("no model");
    kn_quant_force_act_mode(KN_QACT_F32);
    for (int i = 0; i < nm; i++) {
        kn_model *c = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, false);
        kn_model *g = load_on(&mc[i], gpu(), KN_WEIGHTS_FILE, 64, false);
        CHECK(c && g, "load %s", mc[i].name);
        if (c && g) {
            const kn_model_config *cc = kn_model_get_config(c), *gc = kn_model_get_config(g);
            CHECK(gc->run_weight_type == cc->weight_type, "%s: run_weight_type %s, file %s", mc[i].name,
                  kn_dtype_name(gc->run_weight_type), kn_dtype_name(cc->weight_type));
            int V = cc->n_vocab;
            int32_t ids[64];
            int n = prompt_tokens(c, ids, 64);
            if (n > 12) n = 12;
            float *lc = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
            double worst = 0;
            /* the first 4 tokens one by one, then the next (up to 8) as one M <= 8 batch */
            int pos = 0;
            for (; pos < 4 && pos < n; pos++) {
                for (int k = 0; k < V; k++) lg[k] = NAN;
                if (kn_model_eval(c, &ids[pos], 1, pos, lc, false) || kn_model_eval(g, &ids[pos], 1, pos, lg, false)) {
                    CHECK(0, "%s", kn_last_error()); break;
                }
                double e = rel_l2(lg, lc, V);
                if (!(e <= worst)) worst = e;
            }
            int rest = n - pos < 8 ? n - pos : 8;
            if (rest > 0) {
                for (int k = 0; k < V; k++) lg[k] = NAN;
                if (kn_model_eval(c, &ids[pos], rest, pos, lc, false) || kn_model_eval(g, &ids[pos], rest, pos, lg, false))
                    CHECK(0, "%s", kn_last_error());
                double e = rel_l2(lg, lc, V);
                if (!(e <= worst)) worst = e;
            }
            fprintf(stderr, "  gpu %-18s file weights (%s): %d single tokens + %d rows, worst logits rel L2 %.3g\n", mc[i].name,
                    kn_dtype_name(gc->run_weight_type), pos, rest, worst);
            /* f16/bf16 matrices: 2..8 rows take the tensor-core path, which rounds x to the weight dtype */
            double tol = cc->weight_type == KN_F16 || cc->weight_type == KN_BF16 ? 2e-2 : 1e-4;
            CHECK(worst < tol, "%s file weights, decode rows: logits rel L2 %.3g >= %.0e", mc[i].name, worst, tol);
            free(lc); free(lg);
        }
        kn_model_free(c); kn_model_free(g);
    }
    kn_quant_force_act_mode(-1);
}

/* chunks of 7 (several plan runs, S growing) == one prefill; with f16 KV
 * caches too (the sdpa path that widens half K/V) against the CPU's f16 cache */
TEST(gpu_chunked_prefill_and_f16_cache) {
    NEED_GPU();
    model_case mc[8];
    int nm = model_cases(mc);
    if (!nm) SKIP("no model under KN_ASSETS / KN_SMOLLM2");
    kn_quant_force_act_mode(KN_QACT_F32);
    for (int i = 0; i < nm; i++) {
        kn_model *one = load_on(&mc[i], gpu(), KN_WEIGHTS_F32, 64, false), *ch = load_on(&mc[i], gpu(), KN_WEIGHTS_F32, 7, false);
        kn_model *h16 = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, true), *g16 = load_on(&mc[i], gpu(), KN_WEIGHTS_F32, 64, true);
        kn_model *h32 = load_on(&mc[i], kn_backend_cpu(), KN_WEIGHTS_AUTO, 64, false);
        CHECK(one && ch && h16 && g16 && h32, "load");
        if (one && ch && h16 && g16 && h32) {
            int V = kn_model_get_config(one)->n_vocab;
            int32_t ids[64];
            int n = prompt_tokens(one, ids, 64);
            float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V), *c = malloc(sizeof(float) * (size_t)V);
            CHECK(kn_model_eval(one, ids, n, 0, a, false) == KN_OK && kn_model_eval(ch, ids, n, 0, b, false) == KN_OK, "%s", kn_last_error());
            double e = rel_l2(b, a, V);
            CHECK(e < 1e-5, "%s: chunked prefill rel err %.3g", mc[i].name, e);
            CHECK(kn_model_eval(h16, ids, n, 0, a, false) == KN_OK && kn_model_eval(g16, ids, n, 0, b, false) == KN_OK &&
                  kn_model_eval(h32, ids, n, 0, c, false) == KN_OK, "%s", kn_last_error());
            double e16 = rel_l2(b, a, V), d16 = rel_l2(a, c, V), tol = f16_cache_tol(d16);
            CHECK(e16 < tol, "%s: f16 KV cache gpu vs cpu rel err %.3g >= %.3g (the f16 cache itself moves the cpu's logits by %.3g)",
                  mc[i].name, e16, tol, d16);
            fprintf(stderr, "  gpu %-18s chunks of 7 vs one prefill rel L2 %.3g; f16 KV cache vs cpu %.3g (f16 vs f32 cache on the cpu %.3g)\n",
                    mc[i].name, e, e16, d16);
            free(a); free(b); free(c);
        }
        kn_model_free(one); kn_model_free(ch); kn_model_free(h16); kn_model_free(g16); kn_model_free(h32);
    }
    kn_quant_force_act_mode(-1);
}

/* CUDA graphs (src/runtime/replay.c): greedy decoding with graphs on must
 * give the tokens and logits (bit for bit: a replay launches the same
 * kernels with the same arguments) of a run with graphs off, and decode
 * steps must be replays of one graph (S, the context length, is read from
 * the device by the decode attention). bf16 weights like `kiln bench
 * --gpu-dtype bf16`, with f32 and f16 KV caches. */
static void graphs_on(bool on) {
    setenv("KN_CUDA_GRAPH", on ? "1" : "0", 1);
    kn_env_reload();
}
/* prompt, then ngen greedy steps: tokens to t, every step's logits to lg [ngen+1][V] */
static kn_status greedy_run(kn_model *m, const int32_t *ids, int n, int ngen, int32_t *t, float *lg) {
    int V = kn_model_get_config(m)->n_vocab;
    kn_status st = kn_model_eval(m, ids, n, 0, lg, false);
    for (int s = 0; s < ngen && !st; s++) {
        double mg;
        t[s] = argmax2(lg + (size_t)s * V, V, &mg);
        st = kn_model_eval(m, &t[s], 1, n + s, lg + (size_t)(s + 1) * V, false);
    }
    return st;
}
TEST(gpu_graph_greedy_matches_plain) {
    NEED_GPU();
    model_case mc[8];
    int nm = model_cases(mc);
    const char *extra = getenv("KN_GRAPH_MODEL");   /* e.g. a random SmolLM2-shaped HF directory (scripts/make_random_smollm2.py) */
    if (extra) mc[nm++] = (model_case){"KN_GRAPH_MODEL", extra, NULL};
    if (!nm) SKIP("no model under KN_ASSETS / KN_SMOLLM2");
    enum { NGEN = 24 };
    for (int i = 0; i < nm; i++) {
        for (int kv16 = 0; kv16 < 2; kv16++) {
            kn_model *g = load_on(&mc[i], gpu(), KN_WEIGHTS_BF16, 64, kv16);
            CHECK(g, "gpu load");
            if (!g) continue;
            int V = kn_model_get_config(g)->n_vocab;
            int32_t ids[64], t0[NGEN], t1[NGEN];
            int n = prompt_tokens(g, ids, 32);
            if (n + NGEN > kn_model_n_ctx(g)) n = kn_model_n_ctx(g) - NGEN;
            float *l0 = malloc(sizeof(float) * (size_t)V * (NGEN + 1)), *l1 = malloc(sizeof(float) * (size_t)V * (NGEN + 1));
            kn_plan_stats a, b, c;
            graphs_on(false);
            CHECK(greedy_run(g, ids, n, NGEN, t0, l0) == KN_OK, "graphs off: %s", kn_last_error());
            graphs_on(true);
            kn_model_plan_stats(g, &a);
            CHECK(greedy_run(g, ids, n, NGEN, t1, l1) == KN_OK, "graphs on: %s", kn_last_error());
            kn_model_plan_stats(g, &b);
            int same = 0, bits = 0;
            while (same < NGEN && t0[same] == t1[same]) same++;
            for (size_t k = 0; k < (size_t)V * (NGEN + 1); k++) bits += memcmp(&l0[k], &l1[k], sizeof(float)) != 0;
            uint64_t rep = b.replays - a.replays;
            CHECK(same == NGEN, "%s kv %s: greedy tokens differ at step %d with graphs on", mc[i].name, kv16 ? "f16" : "f32", same);
            CHECK(bits == 0, "%s kv %s: %d logits differ with graphs on", mc[i].name, kv16 ? "f16" : "f32", bits);
            /* the prefill key (T = n) is seen now (graphs off touched no key); decode: step 1 seen, step 2 captured, then replays */
            CHECK(rep >= NGEN - 2, "%s: %llu of %d decode steps replayed", mc[i].name, (unsigned long long)rep, NGEN);
            /* again: the prefill (a matrix-matrix plan: GEMMs, the f32 attention) is captured now, all decode steps replay */
            CHECK(greedy_run(g, ids, n, NGEN, t1, l1) == KN_OK, "graphs on, second run: %s", kn_last_error());
            kn_model_plan_stats(g, &c);
            int same2 = 0, bits2 = 0;
            while (same2 < NGEN && t0[same2] == t1[same2]) same2++;
            for (size_t k = 0; k < (size_t)V * (NGEN + 1); k++) bits2 += memcmp(&l0[k], &l1[k], sizeof(float)) != 0;
            CHECK(same2 == NGEN && bits2 == 0, "%s kv %s, prefill replayed: greedy %d/%d equal, %d logits differ", mc[i].name,
                  kv16 ? "f16" : "f32", same2, NGEN, bits2);
            CHECK(c.replays - b.replays == NGEN + 1, "%s: second run %llu of %d evaluations replayed", mc[i].name,
                  (unsigned long long)(c.replays - b.replays), NGEN + 1);
            fprintf(stderr, "  gpu %-18s bf16 weights, kv %s: graphs on vs off: greedy %d/%d equal, %d logits differ; "
                    "%llu replays, %llu captures, %d kernel nodes a plain step; again (prefill replayed too): %d/%d equal, "
                    "%d logits differ\n", mc[i].name, kv16 ? "f16" : "f32", same, NGEN, bits, (unsigned long long)rep,
                    (unsigned long long)(c.captures - a.captures), b.kernels, same2, NGEN, bits2);
            free(l0); free(l1);
            kn_model_free(g);
        }
    }
    unsetenv("KN_CUDA_GRAPH");
    kn_env_reload();
}

typedef struct { int32_t t[64]; int n; char txt[1024]; size_t len; } tok_log;
static bool log_tok(void *ud, int32_t t, const char *txt, size_t len) {
    tok_log *l = ud;
    if (t >= 0 && l->n < 64) l->t[l->n++] = t;
    if (l->len + len < sizeof l->txt) { memcpy(l->txt + l->len, txt, len); l->len += len; l->txt[l->len] = 0; }
    return true;
}

/* a second chat turn through kn_generate_params.reuse evaluates only the new
 * tokens and generates what a fresh model fed the whole conversation does */
TEST(gpu_kv_reuse) {
    NEED_GPU();
    model_case mc[8];
    int nm = model_cases(mc);
    int k = 0;
    while (k < nm && !mc[k].tok) k++;                  /* stories260K: a model with a tokenizer */
    if (k == nm) SKIP("stories260K/tok512 missing under KN_ASSETS");
    kn_model *m = load_on(&mc[k], gpu(), KN_WEIGHTS_F32, 16, false), *f = load_on(&mc[k], gpu(), KN_WEIGHTS_F32, 16, false);
    REQUIRE(m && f, "load");
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 12;
    gp.sampling.temp = 0;
    kn_kv_tokens kv = {0};
    gp.reuse = &kv;
    tok_log l1 = {0}, l2 = {0}, l3 = {0};
    kn_generate_stats s1, s2, s3;
    const char *p1 = "Once upon a time, there was a little dog.";
    CHECK(kn_generate(m, p1, &gp, log_tok, &l1, &s1) == KN_OK, "%s", kn_last_error());
    /* turn 2 repeats turn 1 and its reply, then adds text */
    char p2[2048];
    snprintf(p2, sizeof p2, "%s%s The dog ran to the park.", p1, l1.txt);
    CHECK(kn_generate(m, p2, &gp, log_tok, &l2, &s2) == KN_OK, "%s", kn_last_error());
    kn_generate_params g2 = gp;
    g2.reuse = NULL;
    CHECK(kn_generate(f, p2, &g2, log_tok, &l3, &s3) == KN_OK, "%s", kn_last_error());
    CHECK(s2.n_prompt < s3.n_prompt, "reuse evaluated %d prompt tokens, a fresh model %d", s2.n_prompt, s3.n_prompt);
    CHECK(l2.n == l3.n && !memcmp(l2.t, l3.t, sizeof(int32_t) * (size_t)l2.n), "turn 2 differs with reuse (%d vs %d tokens)", l2.n, l3.n);
    fprintf(stderr, "  gpu kv reuse: turn 2 evaluated %d of %d prompt tokens; %d generated tokens equal a fresh run's\n",
            s2.n_prompt, s3.n_prompt, l2.n);
    kn_kv_tokens_free(&kv);
    kn_model_free(m); kn_model_free(f);
}
#endif

KN_TEST_MAIN()
