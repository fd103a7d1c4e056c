/* test_quantize.c: the weight quantizers (src/backends/quant/quantize.c) and
 * `kiln quantize` (kn_model_quantize).
 *
 * References: block bytes from scripts/quant_ref.py (tests/fixtures/quant/
 * quant_ref.bin): the `gguf` package's numpy quantizers for Q4_0..Q8_0 and
 * ggml's own quantize_row_*_ref (through llama-cpp-python's libggml) for
 * every type, K types included; compared byte for byte. Round-trip error
 * bounds per type on random rows (each block's dequantized values within a
 * fraction of its range). The file path: types chosen per tensor (output to
 * Q6_K, fallbacks for rows that are not whole blocks, norms kept), the
 * requantize refusal, errors for unknown types and missing files, and the
 * quantized model's logits against the f32 model's. The K mixes (Q4_K_M,
 * Q5_K_M, Q4_K_S, Q5_K_S) on random llama models with rows of whole K blocks
 * (16 and 9 layers, tied, 8 experts) against llama.cpp's own quantizer.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_llm.h"
#include "kiln_quantize.h"
#include "backends/quant/quant.h"
#include "backends/quant/quantize.h"
#include "formats/gguf.h"
#include "llm/quantize_impl.h"
#include "formats/gguf_write.h"
#include <sys/wait.h>
#include <unistd.h>

static kn_dtype from_ggml(uint32_t t) {
    switch (t) {
    case 2: return KN_Q4_0; case 3: return KN_Q4_1; case 6: return KN_Q5_0; case 7: return KN_Q5_1;
    case 8: return KN_Q8_0; case 12: return KN_Q4_K; case 13: return KN_Q5_K; case 14: return KN_Q6_K;
    default: return KN_DTYPE_COUNT;
    }
}

static bool rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

TEST(block_bytes_match_gguf_and_ggml) {
    const char *path = "tests/fixtures/quant/quant_ref.bin";
    FILE *f = fopen(path, "rb");
    if (!f) SKIP("%s missing (python3 scripts/quant_ref.py)", path);
    char magic[4];
    uint32_t ver, n;
    REQUIRE(rd(f, magic, 4) && !memcmp(magic, "KNQZ", 4) && rd(f, &ver, 4) && ver == 1 && rd(f, &n, 4), "bad header");
    int per[2][16] = {{0}}, bad[2][16] = {{0}};
    for (uint32_t c = 0; c < n; c++) {
        uint32_t gt, src, nx, nb;
        REQUIRE(rd(f, &gt, 4) && rd(f, &src, 4) && rd(f, &nx, 4) && nx < (1u << 20) && src < 2, "case %u header", c);
        float *x = malloc(sizeof *x * nx);
        REQUIRE(x && rd(f, x, sizeof *x * nx) && rd(f, &nb, 4), "case %u data", c);
        unsigned char *want = malloc(nb), *got = malloc(nb + 1);
        REQUIRE(want && got && rd(f, want, nb), "case %u bytes", c);
        kn_dtype t = from_ggml(gt);
        REQUIRE(t != KN_DTYPE_COUNT && kn_dtype_nbytes(t, nx) == nb, "case %u: type %u, %u bytes", c, gt, nb);
        CHECK(kn_quantize_weights(t, x, got, nx) == KN_OK, "%s", kn_last_error());
        per[src][gt]++;
        if (memcmp(got, want, nb)) {
            size_t i = 0;
            while (got[i] == want[i]) i++;
            bad[src][gt]++;
            CHECK(0, "%s (case %u, vs %s): byte %zu of %u differs (%u, want %u)", kn_dtype_name(t), c,
                  src ? "ggml quantize_row_ref" : "gguf numpy", i, nb, got[i], want[i]);
        }
        free(x); free(want); free(got);
    }
    fclose(f);
    for (int s = 0; s < 2; s++)
        for (int g = 0; g < 16; g++)
            if (per[s][g])
                printf("  %-5s vs %-10s %d rows, %d identical\n", kn_dtype_name(from_ggml((uint32_t)g)),
                       s ? "ggml" : "gguf numpy", per[s][g], per[s][g] - bad[s][g]);
    if (!per[1][12]) printf("  (no ggml references in the fixture: it was made without llama_cpp)\n");
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {               /* xorshift, uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2 - 1;
}

/* Each type's dequantized values: every element within tol * (max |x| of its block) */
TEST(round_trip_error_bounds) {
    static const struct { kn_dtype t; double tol; } T[] = {
        {KN_Q4_0, 1.0 / 8}, {KN_Q4_1, 1.05 / 15}, {KN_Q5_0, 1.0 / 16}, {KN_Q5_1, 1.05 / 31}, {KN_Q8_0, 0.51 / 127 + 1e-3},
        {KN_Q4_K, 2.2 / 15}, {KN_Q5_K, 2.2 / 31}, {KN_Q6_K, 1.3 / 32}, {KN_F16, 1e-3}, {KN_BF16, 4e-3}};
    enum { N = 4096 };
    float *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    void *q = malloc(kn_dtype_nbytes(KN_F32, N));
    for (int i = 0; i < N; i++) x[i] = frand() * (i % 512 < 256 ? 0.1f : 3.0f) + (i % 1024 < 512 ? 0 : 0.5f);
    for (size_t k = 0; k < sizeof T / sizeof *T; k++) {
        kn_dtype t = T[k].t;
        REQUIRE(kn_quantize_weights(t, x, q, N) == KN_OK, "%s: %s", kn_dtype_name(t), kn_last_error());
        REQUIRE(kn_dequantize_row(t, q, y, N) == KN_OK, "%s", kn_last_error());
        int bs = t == KN_Q4_K || t == KN_Q5_K || t == KN_Q6_K ? 256 : 32;
        double worst = 0, se = 0, sx = 0;
        for (int b = 0; b < N / bs; b++) {
            float amax = 0;
            for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(x[b * bs + i]));
            for (int i = 0; i < bs; i++) {
                double e = fabs((double)y[b * bs + i] - x[b * bs + i]);
                worst = fmax(worst, e / amax);
                se += e * e; sx += (double)x[b * bs + i] * x[b * bs + i];
            }
        }
        printf("  %-5s max error %.4f of the block's max |x| (bound %.4f), rms error %.4f of rms\n", kn_dtype_name(t), worst,
               T[k].tol, sqrt(se / sx));
        CHECK(worst <= T[k].tol, "%s: error %g of the block maximum > %g", kn_dtype_name(t), worst, T[k].tol);
    }
    /* bad arguments give errors, not crashes */
    CHECK(kn_quantize_weights(KN_Q4_K, x, q, 100) == KN_ERR_INVALID, "n not a multiple of 256");
    CHECK(kn_quantize_weights(KN_Q8_1, x, q, 32) == KN_ERR_UNSUPPORTED, "Q8_1 is no weight type");
    x[5] = NAN;
    CHECK(kn_quantize_weights(KN_Q4_0, x, q, 32) == KN_ERR_INVALID, "NaN refused");
    free(x); free(y); free(q);
}

/* ---- files ------------------------------------------------------------------ */

static char g_dir[128];
static const char *tmp(const char *name) {
    static char buf[8][256];
    static int k;
    if (!g_dir[0]) { snprintf(g_dir, sizeof g_dir, "/tmp/kn_test_quantize_%d", (int)getpid()); mkdir(g_dir, 0700); }
    char *p = buf[k++ & 7];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static const kn_gguf_tensor *tensor(kn_gguf *g, const char *name) { return kn_gguf_find_tensor(g, name); }

/* the qwen3 fixture (bf16, untied head, q/k norms) as an f32 GGUF: the source of the file tests */
static const char *f32_model(void) {
    static char path[256];
    if (path[0]) return path;
    kn_quantize_params p = kn_quantize_defaults();
    p.type = KN_F32;
    snprintf(path, sizeof path, "%s", tmp("qwen3_f32.gguf"));
    if (kn_model_convert_hf("tests/fixtures/qwen/qwen3", path, &p)) { path[0] = 0; return NULL; }
    return path;
}

static float *logits(const char *path, const int32_t *ids, int n, int *V) {
    kn_model *m;
    if (kn_model_load(path, NULL, &m)) return NULL;
    *V = kn_model_get_config(m)->n_vocab;
    float *out = malloc(sizeof *out * (size_t)(n * *V));
    if (out && kn_model_eval(m, ids, n, 0, out, true)) { free(out); out = NULL; }
    kn_model_free(m);
    return out;
}

TEST(file_types_follow_llama_cpp_rules) {
    const char *src = f32_model();
    REQUIRE(src, "convert: %s", kn_last_error());
    static const kn_dtype types[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_F16, KN_BF16};
    const int32_t ids[] = {5, 17, 42, 99, 250, 3, 7, 11};
    int V = 0;
    float *ref = logits(src, ids, 8, &V);
    REQUIRE(ref, "f32 logits: %s", kn_last_error());
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        kn_dtype t = types[k];
        kn_quantize_params p = kn_quantize_defaults();
        p.type = t;
        const char *out = tmp("q.gguf");
        REQUIRE(kn_model_quantize(src, out, &p) == KN_OK, "%s: %s", kn_dtype_name(t), kn_last_error());
        kn_gguf *g;
        REQUIRE(kn_gguf_open(out, &g) == KN_OK, "%s", kn_last_error());
        bool fl = t == KN_F16 || t == KN_BF16;
        /* rows of 64 (hidden) are not whole K blocks: llama.cpp's fallbacks */
        kn_dtype mat = t == KN_Q4_K ? KN_Q5_0 : t == KN_Q5_K ? KN_Q5_1 : t == KN_Q6_K ? KN_Q8_0 : t;
        kn_dtype outw = fl ? t : KN_Q8_0;   /* output [64 x 300]: Q6_K, whose rows of 64 fall back to Q8_0 */
        const kn_gguf_tensor *q = tensor(g, "blk.0.attn_q.weight"), *o = tensor(g, "output.weight"),
                             *e = tensor(g, "token_embd.weight"), *nm = tensor(g, "blk.0.attn_q_norm.weight"),
                             *d = tensor(g, "blk.0.attn_output.weight");
        REQUIRE(q && o && e && nm && d, "tensors missing");
        CHECK(q->type == mat, "%s: attn_q is %s, want %s", kn_dtype_name(t), kn_dtype_name(q->type), kn_dtype_name(mat));
        CHECK(e->type == mat, "%s: token_embd is %s", kn_dtype_name(t), kn_dtype_name(e->type));
        CHECK(o->type == outw, "%s: output is %s, want %s", kn_dtype_name(t), kn_dtype_name(o->type), kn_dtype_name(outw));
        CHECK(nm->type == KN_F32, "norms stay f32");
        /* attn_output rows are 128 = not a K block either */
        CHECK(d->type == mat, "%s: attn_output is %s", kn_dtype_name(t), kn_dtype_name(d->type));
        int64_t ft = -1;
        kn_gguf_get_i64(g, "general.file_type", &ft);
        CHECK(ft == (int64_t)kn__qfile_type(t), "general.file_type %lld", (long long)ft);
        kn_gguf_close(g);
        int V2 = 0;
        float *l = logits(out, ids, 8, &V2);
        REQUIRE(l && V2 == V, "%s logits: %s", kn_dtype_name(t), kn_last_error());
        double *a = malloc(sizeof *a * (size_t)(8 * V)), *b = malloc(sizeof *b * (size_t)(8 * V));
        for (int i = 0; i < 8 * V; i++) { a[i] = l[i]; b[i] = ref[i]; }
        double rel = kn_rel_err(a, b, 8L * V);
        /* a random model has no redundancy: 4-bit moves its logits by ~30%, garbage by ~100% */
        double bound = t == KN_Q4_0 || t == KN_Q4_1 || t == KN_Q4_K ? 0.5 : fl ? 1e-3 : t == KN_Q8_0 ? 0.04 : 0.2;
        printf("  %-5s logits vs f32: relative error %.4f\n", kn_dtype_name(t), rel);
        CHECK(rel < bound, "%s: relative error %g >= %g", kn_dtype_name(t), rel, bound);
        free(a); free(b); free(l);
    }
    free(ref);
}

TEST(requantize_refused_unless_allowed) {
    const char *src = f32_model();
    REQUIRE(src, "convert: %s", kn_last_error());
    kn_quantize_params p = kn_quantize_defaults();
    p.type = KN_Q4_0;
    const char *q4 = tmp("q4.gguf"), *q8 = tmp("q8.gguf");
    REQUIRE(kn_model_quantize(src, q4, &p) == KN_OK, "%s", kn_last_error());
    p.type = KN_Q8_0;
    remove(q8);
    CHECK(kn_model_quantize(q4, q8, &p) == KN_ERR_UNSUPPORTED, "requantize must be refused");
    CHECK(strstr(kn_last_error(), "--allow-requantize") != NULL, "message names the flag: %s", kn_last_error());
    CHECK(access(q8, F_OK) != 0, "no output file after a refusal");
    p.allow_requantize = true;
    CHECK(kn_model_quantize(q4, q8, &p) == KN_OK, "%s", kn_last_error());
    /* same type again: tensors copied as they are, no requantize needed */
    p.allow_requantize = false;
    p.type = KN_Q4_0;
    CHECK(kn_model_quantize(q4, tmp("q4b.gguf"), &p) == KN_OK, "same type is a copy: %s", kn_last_error());
}

TEST(errors_name_the_problem) {
    kn_dtype t;
    CHECK(!kn_quantize_type_from_name("q3_k", &t) && strstr(kn_last_error(), "q4_k"), "%s", kn_last_error());
    CHECK(kn_quantize_type_from_name("Q4_K", &t) && t == KN_Q4_K, "case-insensitive");
    kn_quantize_params q = kn_quantize_defaults();
    CHECK(kn_quantize_parse_type("Q5_K_M", &q) && q.type == KN_Q5_K && q.mix == KN_QUANT_MIX_M, "Q5_K_M");
    CHECK(kn_quantize_parse_type("q4_k_s", &q) && q.type == KN_Q4_K && q.mix == KN_QUANT_MIX_S, "q4_k_s");
    CHECK(kn_quantize_parse_type("q4_k_m", &q) && kn_quantize_parse_type("q6_k", &q) && q.type == KN_Q6_K &&
          q.mix == KN_QUANT_MIX_S, "a plain type resets the mix");
    CHECK(!kn_quantize_parse_type("q8_0_m", &q) && strstr(kn_last_error(), "q4_k_m"), "%s", kn_last_error());
    CHECK(!kn_quantize_parse_type("q3_k_m", &q) && !kn_quantize_parse_type("", &q), "no q3_k_m, no empty name");
    kn_quantize_params p = kn_quantize_defaults();
    CHECK(kn_model_quantize("/nonexistent/x.gguf", tmp("o.gguf"), &p) == KN_ERR_IO && strstr(kn_last_error(), "no such"),
          "%s", kn_last_error());
    const char *src = f32_model();
    REQUIRE(src, "convert: %s", kn_last_error());
    CHECK(kn_model_quantize(src, src, &p) == KN_ERR_INVALID, "in == out refused: %s", kn_last_error());
    CHECK(kn_model_quantize(src, "/nonexistent-dir/o.gguf", &p) == KN_ERR_IO, "unwritable: %s", kn_last_error());
}

/* kiln quantize against llama.cpp's own llama_model_quantize on the same f32
 * file (scripts/quantize_llamacpp.py): every tensor the same type and the
 * same bytes, for each type, default rules and --pure. */
TEST(files_equal_llama_cpp_quantize) {
    static const char *const models[] = {"qwen/qwen3", "arch/mistral", "arch/gemma2", "arch/phi3", "moe/mixtral",
                                         "moe/qwen2moe", "convert/gpt2"};
    static const char *const names[] = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"};
    int files = 0;
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        char dir[128];
        snprintf(dir, sizeof dir, "tests/fixtures/%s", models[m]);
        if (access(dir, R_OK)) continue;
        kn_quantize_params p = kn_quantize_defaults();
        p.type = KN_F32;
        p.no_vocab = true;
        const char *f32 = tmp("lc_f32.gguf");
        char f32b[256];
        snprintf(f32b, sizeof f32b, "%s", f32);
        REQUIRE(kn_model_convert_hf(dir, f32b, &p) == KN_OK, "%s: %s", models[m], kn_last_error());
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            for (int pure = 0; pure < 2; pure++) {
                if (pure && m) continue;                   /* --pure on the first model only */
                kn_quantize_params q = kn_quantize_defaults();
                REQUIRE(kn_quantize_parse_type(names[k], &q), "%s", kn_last_error());
                q.pure = pure;
                char out[256];
                snprintf(out, sizeof out, "%s", tmp("lc_q.gguf"));
                REQUIRE(kn_model_quantize(f32b, out, &q) == KN_OK, "%s %s: %s", models[m], names[k], kn_last_error());
                char cmd[1024], line[512];
                snprintf(cmd, sizeof cmd, "python3 scripts/quantize_llamacpp.py %s %s %s%s 2>&1", f32b, out, names[k],
                         pure ? " --pure" : "");
                FILE *f = popen(cmd, "r");
                REQUIRE(f, "cannot run python3");
                int n = -1, st = -1, sb = -1;
                char first[512] = "";
                while (fgets(line, sizeof line, f)) {
                    if (sscanf(line, "tensors %d same_type %d same_bytes %d", &n, &st, &sb) == 3) continue;
                    if (!first[0]) snprintf(first, sizeof first, "%s", line);
                }
                int rc = pclose(f);
                rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
                if (rc == 3) SKIP("llama_cpp is not installed (pip install llama-cpp-python): %s", first);
                CHECK(rc == 0 && n > 0 && st == n && sb == n, "%s %s%s: %d tensors, %d same type, %d same bytes (%s)",
                      models[m], names[k], pure ? " --pure" : "", n, st, sb, first);
                files++;
            }
    }
    printf("  %d files equal to llama.cpp's llama_model_quantize, tensor for tensor\n", files);
    if (!files) SKIP("no fixture models");
}

/* ---- the K mixes ------------------------------------------------------------ */

/* A random llama-architecture f32 GGUF whose rows are whole K blocks (256
 * wide), so that the per-layer rules, not the fallbacks, decide: n_layer
 * layers, 4 query heads sharing 1 K/V head (GQA 4), an output matrix unless
 * tied, and 8 experts per layer when moe. Values: uniform, each row with its
 * own scale. */
static bool write_llama(const char *path, int n_layer, bool tied, bool moe) {
    enum { C = 256, F = 256, KV = 64, V = 512, E = 8 };
    kn_gguf_writer *w;
    if (kn_gguf_writer_new(&w)) return false;
    kn_gguf_w_str(w, "general.architecture", "llama");
    kn_gguf_w_str(w, "general.name", "random");
    kn_gguf_w_u32(w, "llama.context_length", 256);
    kn_gguf_w_u32(w, "llama.embedding_length", C);
    kn_gguf_w_u32(w, "llama.block_count", (uint32_t)n_layer);
    kn_gguf_w_u32(w, "llama.feed_forward_length", F);
    kn_gguf_w_u32(w, "llama.attention.head_count", 4);
    kn_gguf_w_u32(w, "llama.attention.head_count_kv", 1);
    kn_gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kn_gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    kn_gguf_w_u32(w, "general.file_type", 0);
    if (moe) { kn_gguf_w_u32(w, "llama.expert_count", E); kn_gguf_w_u32(w, "llama.expert_used_count", 2); }
    static const struct { const char *name; int64_t ne0, ne1; } L[] = {
        {"attn_norm.weight", C, 0}, {"attn_q.weight", C, C}, {"attn_k.weight", C, KV}, {"attn_v.weight", C, KV},
        {"attn_output.weight", C, C}, {"ffn_norm.weight", C, 0}, {"ffn_gate.weight", C, F}, {"ffn_up.weight", C, F},
        {"ffn_down.weight", F, C}};
    int64_t total = 2 * (int64_t)V * C + C;
    for (size_t k = 0; k < sizeof L / sizeof *L; k++) total += (int64_t)n_layer * L[k].ne0 * (L[k].ne1 ? L[k].ne1 : 1) * (moe && strstr(L[k].name, "ffn_") && L[k].ne1 ? E : 1);
    total += moe ? (int64_t)n_layer * C * E : 0;
    float *buf = malloc(sizeof *buf * (size_t)total), *at = buf;     /* the writer keeps pointers: one buffer */
    if (!buf) { kn_gguf_writer_free(w); return false; }
    for (int64_t i = 0; i < total; i += 64) {
        float sc = 0.02f + 0.2f * (frand() + 1);
        for (int64_t j = i; j < i + 64 && j < total; j++) buf[j] = frand() * sc;
    }
#define PUT(nm, nd, a, b, c) do { int64_t ne_[3] = {a, b, c}; kn_gguf_w_tensor_f32(w, nm, nd, ne_, at); at += (a) * (b) * (c); } while (0)
    PUT("token_embd.weight", 2, C, V, 1);
    PUT("output_norm.weight", 1, C, 1, 1);
    if (!tied) PUT("output.weight", 2, C, V, 1);
    char nm[96];
    for (int l = 0; l < n_layer; l++)
        for (size_t k = 0; k < sizeof L / sizeof *L; k++) {
            bool ffn = strstr(L[k].name, "ffn_") && L[k].ne1;
            if (moe && ffn) {
                char base[48];
                snprintf(base, sizeof base, "%.*s_exps.weight", (int)(strlen(L[k].name) - 7), L[k].name);
                snprintf(nm, sizeof nm, "blk.%d.%s", l, base);
                PUT(nm, 3, L[k].ne0, L[k].ne1, E);
                if (!strcmp(L[k].name, "ffn_gate.weight")) {
                    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
                    PUT(nm, 2, C, E, 1);
                }
                continue;
            }
            snprintf(nm, sizeof nm, "blk.%d.%s", l, L[k].name);
            if (L[k].ne1) PUT(nm, 2, L[k].ne0, L[k].ne1, 1);
            else PUT(nm, 1, L[k].ne0, 1, 1);
        }
#undef PUT
    kn_status st = kn_gguf_writer_status(w);
    if (!st) st = kn_gguf_write_file(w, path);
    kn_gguf_writer_free(w);
    free(buf);
    return st == KN_OK;
}

static int count_type(kn_gguf *g, const char *part, kn_dtype t) {
    int n = 0;
    for (int64_t i = 0; i < kn_gguf_n_tensors(g); i++) {
        const kn_gguf_tensor *x = kn_gguf_tensor_at(g, i);
        char nm[160];
        snprintf(nm, sizeof nm, "%.*s", (int)x->name.len, x->name.ptr);
        n += strstr(nm, part) && x->type == t;
    }
    return n;
}

/* kiln's Q4_K_M / Q5_K_M (and Q4_K_S / Q5_K_S) files against llama.cpp's
 * llama_model_quantize on the same f32 files: every tensor the same type
 * and the same bytes. Without llama_cpp: the file type, and that the mixes
 * put more bits where the S files do not (a check of kiln alone). */
TEST(k_mixes_equal_llama_cpp_quantize) {
    static const struct { const char *name; int n_layer; bool tied, moe; } M[] = {
        {"dense16", 16, false, false}, {"tied9", 9, true, false}, {"moe8x4", 4, false, true}};
    static const char *const mixes[] = {"q4_k_m", "q5_k_m", "q4_k_s", "q5_k_s"};
    int files = 0;
    bool have_llamacpp = true;
    for (size_t m = 0; m < sizeof M / sizeof *M; m++) {
        char src[256];
        snprintf(src, sizeof src, "%s", tmp("mix_f32.gguf"));
        REQUIRE(write_llama(src, M[m].n_layer, M[m].tied, M[m].moe), "write %s: %s", M[m].name, kn_last_error());
        for (size_t k = 0; k < sizeof mixes / sizeof *mixes; k++) {
            if (k >= 2 && m) continue;                     /* the S mixes on the dense model only */
            kn_quantize_params q = kn_quantize_defaults();
            REQUIRE(kn_quantize_parse_type(mixes[k], &q), "%s", kn_last_error());
            char out[256];
            snprintf(out, sizeof out, "%s", tmp("mix_q.gguf"));
            REQUIRE(kn_model_quantize(src, out, &q) == KN_OK, "%s %s: %s", M[m].name, mixes[k], kn_last_error());
            kn_gguf *g;
            REQUIRE(kn_gguf_open(out, &g) == KN_OK, "%s", kn_last_error());
            int64_t ft = -1;
            kn_gguf_get_i64(g, "general.file_type", &ft);
            static const int64_t FT[] = {15, 17, 14, 16};    /* LLAMA_FTYPE_MOSTLY_Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S */
            CHECK(ft == FT[k], "%s %s: general.file_type %lld, want %lld", M[m].name, mixes[k], (long long)ft, (long long)FT[k]);
            int v6 = count_type(g, "attn_v.weight", KN_Q6_K), d6 = count_type(g, "ffn_down", KN_Q6_K);
            int v8 = count_type(g, "attn_v.weight", KN_Q8_0), k8 = count_type(g, "attn_k.weight", KN_Q8_0);
            printf("  %-8s %-6s attn_v q6_K %d q8_0 %d, attn_k q8_0 %d, ffn_down q6_K %d (of %d layers)\n", M[m].name,
                   mixes[k], v6, v8, k8, d6, M[m].n_layer);
            if (k < 2 && !M[m].moe) CHECK(v6 > 0 && v6 < M[m].n_layer && d6 > 0 && d6 < M[m].n_layer,
                                          "%s %s: an M mix bumps some layers, not all", M[m].name, mixes[k]);
            if (k >= 2) CHECK(v6 == 0 && d6 == 0, "%s %s: no q6_K bumps in an S mix", M[m].name, mixes[k]);
            if (M[m].moe) CHECK(v8 == M[m].n_layer && k8 == M[m].n_layer, "8 experts: attn_k, attn_v q8_0");
            kn_gguf_close(g);
            if (!have_llamacpp) continue;
            char cmd[1024], line[512], first[512] = "";
            snprintf(cmd, sizeof cmd, "python3 scripts/quantize_llamacpp.py %s %s %s 2>&1", src, out, mixes[k]);
            FILE *f = popen(cmd, "r");
            REQUIRE(f, "cannot run python3");
            int n = -1, st = -1, sb = -1;
            while (fgets(line, sizeof line, f)) {
                if (sscanf(line, "tensors %d same_type %d same_bytes %d", &n, &st, &sb) == 3) continue;
                if (!first[0]) snprintf(first, sizeof first, "%s", line);
            }
            int rc = pclose(f);
            rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
            if (rc == 3) { have_llamacpp = false; continue; }
            printf("           llama.cpp: %d tensors, %d same type, %d same bytes\n", n, st, sb);
            CHECK(rc == 0 && n > 0 && st == n && sb == n, "%s %s: %d tensors, %d same type, %d same bytes (%s)",
                  M[m].name, mixes[k], n, st, sb, first);
            files++;
        }
    }
    if (!have_llamacpp) SKIP("llama_cpp is not installed (pip install llama-cpp-python): kiln's mixes checked alone");
    printf("  %d mixed files equal to llama.cpp's, tensor for tensor\n", files);
}

int main(void) { return kn_test_main(); }
