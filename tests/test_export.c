/* test_export.c: train, then generate: the checkpoints of `kiln train char`
 * and `kiln train gpt2` (tools/train.c, included below to run kn_cli_train
 * in-process) load as LLMs through kn_model_load, and kn_model_export_gguf
 * writes them as GGUF files that kiln and llama.cpp load.
 *
 * References: the training module itself (kn_gpt2_forward over the
 * checkpoint's parameters) for the engine's logits; the engine on the
 * checkpoint for the exported GGUF (exact); llama.cpp through
 * scripts/check_gguf_llamacpp.py (llama-cpp-python; skipped with the reason
 * when it is not importable) within 1e-3 relative. Also: writes that fail
 * (a missing directory, a file-size limit standing in for a full disk) leave
 * the previous file intact and name the system's reason.
 */
#include "kn_test.h"
#include "kiln_llm.h"
#include "kiln_train.h"
#include "../tools/train.c"
#include "../tools/cmd_run.c"   /* kn_cli_launch (train --gpus) */
#include "../tools/cli_num.c"   /* train.c parses numbers with it */
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

static char g_dir[256];
static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    if (!g_dir[0]) snprintf(g_dir, sizeof g_dir, "/tmp/kn_test_export_%d", (int)getpid());
    mkdir(g_dir, 0700);
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static void write_text(const char *path, const char *unit, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    for (size_t n = 0; n + strlen(unit) <= bytes; n += strlen(unit)) fputs(unit, f);
    fclose(f);
}

static int train(int n, const char **args) {
    char *argv[64];
    argv[0] = "kiln"; argv[1] = "train";
    for (int i = 0; i < n && i < 60; i++) argv[i + 2] = (char *)args[i];
    kn_clear_error();
    return kn_cli_train(n + 2, argv);
}

/* Trains a tiny model of kind ("char" or "gpt2") on text for 3 steps into ck;
 * extra: more options. */
static int train_tiny(const char *kind, const char *txt, const char *ck, int n_extra, const char **extra) {
    const char *a[64] = {kind, "--data", txt, "--layers", "2", "--dim", "16", "--heads", "2", "--ctx", "16",
                         "--batch", "2", "--steps", "3", "--eval-batches", "1", "--sample-len", "0",
                         "--log-every", "100", "--out", ck};
    int n = 23;
    for (int i = 0; i < n_extra; i++) a[n++] = extra[i];
    return train(n, a);
}

/* The training module's logits [n, V] for ids (the checkpoint's own ids). */
static float *module_logits(const char *ck, int64_t V, const int32_t *ids, int n) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {.vocab = V, .max_seq = 16, .dim = 16, .n_layers = 2, .n_heads = 2};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    float *out = NULL;
    int64_t step;
    if (m && kn_train_load(ck, m, NULL, 0, NULL, &step) == KN_OK) {
        kn_module_train(m, false);
        kn_no_grad_begin(ctx);
        kn_tensor *x = kn_input(ctx, KN_I32, 2, (int64_t[]){1, n});
        kn_tensor *lg = kn_gpt2_forward(m, x);
        kn_no_grad_end(ctx);
        kn_plan *p = lg ? kn_plan_new(ctx, 1, &lg, NULL) : NULL;
        out = malloc(sizeof *out * (size_t)(n * V));
        if (!p || !out || kn_tensor_write(x, ids, KN_I32) || kn_plan_run(p) || kn_tensor_read(lg, out, KN_F32)) {
            free(out);
            out = NULL;
        }
        kn_plan_free(p);
    }
    kn_module_free(m);
    kn_ctx_free(ctx);
    return out;
}

static float *engine_logits(const char *path, const int32_t *ids, int n, int *n_vocab) {
    kn_model *m;
    if (kn_model_load(path, NULL, &m)) return NULL;
    *n_vocab = kn_model_get_config(m)->n_vocab;
    float *out = malloc(sizeof *out * (size_t)(n * *n_vocab));
    if (out && kn_model_eval(m, ids, n, 0, out, true)) { free(out); out = NULL; }
    kn_model_free(m);
    return out;
}

static double max_abs(const float *a, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

/* llama.cpp's logits [n, V] through the script; NULL with why set when it
 * cannot run (why starts with "skip:" when llama_cpp is not installed). */
static float *llamacpp_logits(const char *gguf, const int32_t *ids, int n, int V, char *why, size_t cap) {
    const char *script = "scripts/check_gguf_llamacpp.py";
    if (access(script, R_OK)) { snprintf(why, cap, "skip: %s not found (run from the repository root)", script); return NULL; }
    char cmd[2048], list[512] = "";
    size_t o = 0;
    for (int i = 0; i < n; i++) o += (size_t)snprintf(list + o, sizeof list - o, i ? ",%d" : "%d", ids[i]);
    const char *err = tmp_path("llamacpp.err");
    snprintf(cmd, sizeof cmd, "python3 %s %s %s 2>%s", script, gguf, list, err);
    FILE *p = popen(cmd, "r");
    if (!p) { snprintf(why, cap, "skip: cannot run python3"); return NULL; }
    float *out = malloc(sizeof *out * (size_t)(n * V));
    int nv = -1;
    bool ok = out && fscanf(p, "n_vocab %d", &nv) == 1 && nv == V;
    for (long i = 0; ok && i < (long)n * V; i++) ok = fscanf(p, "%f", &out[i]) == 1;
    int rc = pclose(p);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (rc != 0 || !ok) {
        char msg[400] = "";
        FILE *e = fopen(err, "r");
        if (e) { if (!fgets(msg, sizeof msg, e)) msg[0] = 0; fclose(e); }
        msg[strcspn(msg, "\n")] = 0;
        snprintf(why, cap, "%s%s (exit %d, n_vocab %d)", rc == 3 || rc == 127 ? "skip: " : "", msg, rc, nv);
        free(out);
        out = NULL;
    }
    remove(err);
    return out;
}

/* kiln's logits a [n, V] against llama.cpp's on the same GGUF file: the
 * relative error is printed and checked (<= 1e-3). false, with why set
 * ("skip: ..."), when llama.cpp cannot run here: the caller skips. */
static bool check_llamacpp(const char *gg, const int32_t *ids, int n, int V, const float *a, const char *what,
                           char *why, size_t cap) {
    float *l = llamacpp_logits(gg, ids, n, V, why, cap);
    if (!l && !strncmp(why, "skip:", 5)) return false;
    CHECK(l, "llama.cpp: %s", why);
    if (!l) return true;
    double *da = malloc(sizeof *da * (size_t)(n * V)), *dl = malloc(sizeof *dl * (size_t)(n * V));
    for (long i = 0; da && dl && i < (long)n * V; i++) { da[i] = a[i]; dl[i] = l[i]; }
    double rel = da && dl ? kn_rel_err(dl, da, (long)n * V) : INFINITY;
    printf("  llama.cpp vs kiln logits%s: relative error %.3g over %d positions x %d\n", what, rel, n, V);
    CHECK(rel <= 1e-3, "llama.cpp logits differ from kiln's: relative error %g", rel);
    free(da); free(dl); free(l);
    return true;
}

typedef struct collect { char text[256]; size_t n; int32_t first; int count; } collect;
static bool on_token(void *ud, int32_t tok, const char *text, size_t len) {
    collect *c = ud;
    if (c->count++ == 0) c->first = tok;
    if (c->n + len < sizeof c->text) { memcpy(c->text + c->n, text, len); c->n += len; c->text[c->n] = 0; }
    return true;
}

static int32_t argmax(const float *l, int V) {
    int32_t b = 0;
    for (int v = 1; v < V; v++) if (l[v] > l[b]) b = v;
    return b;
}

/* ---- char ---------------------------------------------------------------------------- */

TEST(char_ckpt_loads_and_matches_the_module) {
    const char *txt = tmp_path("c.txt"), *ck = tmp_path("c.safetensors");
    write_text(txt, "to be or not to be, that is the question.\n", 4000);
    REQUIRE(train_tiny("char", txt, ck, 0, NULL) == 0, "train: %s", kn_last_error());
    char cps[256];
    REQUIRE(kn_ckpt_meta(ck, "char_codepoints", cps, sizeof cps) == KN_OK, "the checkpoint records its characters: %s",
            kn_last_error());
    int64_t V = 1;
    for (const char *p = cps; *p; p++) V += *p == ',';
    const int32_t ids[] = {0, 5, 3, 9, 1, 2, 7, 4};
    int n = 8, nv = 0;
    float *ref = module_logits(ck, V, ids, n);
    float *got = engine_logits(ck, ids, n, &nv);
    REQUIRE(ref && got, "logits: %s", kn_last_error());
    CHECK(nv == V, "engine vocabulary %d, checkpoint %lld", nv, (long long)V);
    double d = kn_max_abs_diff_f32(got, ref, (long)n * V), scale = fmax(1.0, max_abs(ref, (long)n * V));
    CHECK(d <= 1e-5 * scale, "engine vs module logits differ by %g (scale %g)", d, scale);
    printf("  char: engine logits within %.2g of the module's (scale %.2g)\n", d, scale);
    /* greedy generation from text: the first token is the module's argmax */
    kn_model *m;
    REQUIRE(kn_model_load(ck, NULL, &m) == KN_OK, "%s", kn_last_error());
    int32_t pid[4];
    int np = 0;
    REQUIRE(kn_tokenize(kn_model_tokenizer(m), "to b", 4, false, false, pid, 4, &np) == KN_OK && np == 4, "tokenize: %s",
            kn_last_error());
    float *pref = module_logits(ck, V, pid, np);
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 8; gp.sampling.temp = 0;
    collect c = {.first = -1};
    kn_generate_stats gs;
    CHECK(kn_generate(m, "to b", &gp, on_token, &c, &gs) == KN_OK && gs.n_generated == 8, "generate: %s (%d tokens)",
          kn_last_error(), gs.n_generated);
    CHECK(pref && c.first == argmax(pref + (np - 1) * V, (int)V), "greedy token %d, module argmax %d", c.first,
          pref ? argmax(pref + (np - 1) * V, (int)V) : -1);
    CHECK(c.n == 8 && strspn(c.text, "to berniha,qus.\n") == c.n, "generated text '%s' uses the training characters",
          c.text);
    kn_model_free(m);
    free(ref); free(got); free(pref);
}

TEST(char_export_gguf_matches_kiln_and_llamacpp) {
    const char *txt = tmp_path("e.txt"), *ck = tmp_path("e.safetensors"), *gg = tmp_path("e.gguf");
    write_text(txt, "the cat sat on the mat; the dog ate the log!\n", 4000);
    REQUIRE(train_tiny("char", txt, ck, 0, NULL) == 0, "train: %s", kn_last_error());
    REQUIRE(kn_model_export_gguf(ck, NULL, gg) == KN_OK, "export: %s", kn_last_error());
    const int32_t ids[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    int n = 10, nv1 = 0, nv2 = 0;
    float *a = engine_logits(ck, ids, n, &nv1), *b = engine_logits(gg, ids, n, &nv2);
    REQUIRE(a && b && nv1 == nv2, "logits: %s", kn_last_error());
    CHECK(memcmp(a, b, sizeof *a * (size_t)(n * nv1)) == 0, "GGUF logits differ from the checkpoint's (max %g)",
          kn_max_abs_diff_f32(b, a, (long)n * nv1));
    char why[400];
    if (!check_llamacpp(gg, ids, n, nv1, a, "", why, sizeof why)) { free(a); free(b); SKIP("llama.cpp check: %s", why + 6); }
    free(a); free(b);
}

TEST(char_old_or_non_ascii_checkpoints_refused_clearly) {
    const char *txt = tmp_path("u.txt"), *ck = tmp_path("u.safetensors");
    write_text(txt, "caf\xc3\xa9 au lait, s'il vous pla\xc3\xaet.\n", 4000);
    REQUIRE(train_tiny("char", txt, ck, 0, NULL) == 0, "train: %s", kn_last_error());
    kn_model *m = NULL;
    CHECK(kn_model_load(ck, NULL, &m) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "non-ASCII") && !m, "%s",
          kn_last_error());
    CHECK(kn_model_export_gguf(ck, NULL, tmp_path("u.gguf")) == KN_ERR_UNSUPPORTED &&
              access(tmp_path("u.gguf"), F_OK) != 0, "%s", kn_last_error());
    /* a checkpoint without the vocabulary (as before it was recorded) */
    const char *old = tmp_path("old.safetensors");
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {.vocab = 10, .max_seq = 16, .dim = 16, .n_layers = 1, .n_heads = 2};
    kn_module *g = kn_gpt2_new(ctx, &gc);
    const char *meta[] = {"model", "char-gpt", "vocab", "10", "layers", "1", "dim", "16", "heads", "2", "ctx", "16"};
    REQUIRE(kn_train_save(old, g, NULL, 3, 6, meta) == KN_OK, "%s", kn_last_error());
    CHECK(kn_model_load(old, NULL, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "char_codepoints") &&
              strstr(kn_last_error(), "train it again"), "%s", kn_last_error());
    kn_module_free(g);
    kn_ctx_free(ctx);
}

/* ---- gpt2 ------------------------------------------------------------------------------ */

static const char *gpt2_vocab(void) { return kn_asset("gguf/ggml-vocab-gpt-2.gguf"); }

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Trains a compact-vocabulary gpt2 model (or full with full = true) into ck. */
static int train_gpt2_tiny(const char *ck, bool full) {
    const char *txt = tmp_path("g.txt");
    write_text(txt, "Once upon a time there was a little cat. The cat liked milk.<|endoftext|>", 6000);
    const char *extra[] = {"--tokenizer", gpt2_vocab(), "--shards", tmp_path("gshard"), "--full-vocab",
                           full ? "1" : "0"};
    return train_tiny("gpt2", txt, ck, 6, extra);
}

TEST(gpt2_compact_ckpt_loads_expanded_and_generates) {
    if (!gpt2_vocab()) SKIP("gguf/ggml-vocab-gpt-2.gguf missing under KN_ASSETS");
    const char *ck = tmp_path("g.safetensors");
    REQUIRE(train_gpt2_tiny(ck, false) == 0, "train: %s", kn_last_error());
    static char list[1 << 16];
    char vs[32];
    REQUIRE(kn_ckpt_meta(ck, "gpt2_ids", list, sizeof list) == KN_OK && kn_ckpt_meta(ck, "vocab", vs, sizeof vs) == KN_OK,
            "the checkpoint records its GPT-2 ids: %s", kn_last_error());
    int64_t V = atoll(vs);
    int32_t orig[256];
    int no = 0;
    for (char *p = list; *p && no < 256; p += *p == ',') orig[no++] = (int32_t)strtol(p, &p, 10);
    REQUIRE(no == V - 1 && V < 256, "%d ids for vocabulary %lld", no, (long long)V);
    int32_t unseen = 0;                             /* the lowest GPT-2 id not in the list */
    for (int i = 0; i < no && orig[i] == unseen; i++) unseen++;
    const int32_t cids[] = {0, 3, 1, 4, 1, 5, (int32_t)(V - 1), 2};
    int n = 8, nv = 0;
    int32_t gids[8];
    for (int i = 0; i < n; i++) gids[i] = cids[i] == V - 1 ? unseen : orig[cids[i]];
    float *ref = module_logits(ck, V, cids, n);
    float *got = engine_logits(ck, gids, n, &nv);
    REQUIRE(ref && got, "logits: %s", kn_last_error());
    CHECK(nv == 50257, "engine vocabulary %d: the compact model is widened to GPT-2's 50257 ids", nv);
    /* seen ids: the module's logits; each unseen id: the unseen-ids token's
     * logit - log(number unseen), so together they have its probability */
    double d = 0, du = 0, scale = fmax(1.0, max_abs(ref, (long)n * V)), lu = log(50257.0 - no);
    for (int p = 0; p < n; p++) {
        for (int v = 0; v < no; v++) d = fmax(d, fabs((double)got[(size_t)p * nv + orig[v]] - ref[p * V + v]));
        for (int32_t g = 0; g < 50257; g += 97)
            if (!bsearch(&g, orig, (size_t)no, sizeof *orig, cmp_i32))
                du = fmax(du, fabs((double)got[(size_t)p * nv + g] - (ref[p * V + V - 1] - lu)));
    }
    CHECK(d <= 1e-5 * scale, "engine vs module logits differ by %g (scale %g)", d, scale);
    CHECK(du <= 1e-2, "unseen ids' logits differ from the unseen token's - log(n) by %g", du);
    printf("  compact gpt2 widened: seen logits within %.2g of the module's, unseen within %.2g of its target\n", d, du);
    kn_model *m;
    REQUIRE(kn_model_load(ck, NULL, &m) == KN_OK, "%s", kn_last_error());
    kn_generate_params gp = kn_generate_defaults();
    gp.max_tokens = 6; gp.sampling.temp = 0;
    collect c = {.first = -1};
    kn_generate_stats gs;
    CHECK(kn_generate(m, "Once upon a", &gp, on_token, &c, &gs) == KN_OK && gs.n_generated >= 1, "generate: %s",
          kn_last_error());
    kn_model_free(m);
    /* a wrong -z is refused with a message */
    kn_model_opts o = {.tokenizer_path = "/nonexistent/vocab.gguf"};
    CHECK(kn_model_load(ck, &o, &m) != KN_OK && strstr(kn_last_error(), "-z"), "%s", kn_last_error());
    free(ref); free(got);
}

TEST(gpt2_export_gguf_matches_kiln_and_llamacpp) {
    if (!gpt2_vocab()) SKIP("gguf/ggml-vocab-gpt-2.gguf missing under KN_ASSETS");
    const char *ck = tmp_path("gx.safetensors"), *gg = tmp_path("gx.gguf");
    REQUIRE(train_gpt2_tiny(ck, false) == 0, "train: %s", kn_last_error());
    REQUIRE(kn_model_export_gguf(ck, NULL, gg) == KN_OK, "export: %s", kn_last_error());
    const int32_t ids[] = {50256, 7454, 2402, 257, 640, 612, 373};  /* <|endoftext|>Once upon a time there was */
    int n = 7, nv1 = 0, nv2 = 0;
    float *a = engine_logits(ck, ids, n, &nv1), *b = engine_logits(gg, ids, n, &nv2);
    REQUIRE(a && b && nv1 == nv2 && nv1 == 50257, "logits: %s", kn_last_error());
    CHECK(memcmp(a, b, sizeof *a * (size_t)(n * nv1)) == 0, "GGUF logits differ from the checkpoint's (max %g)",
          kn_max_abs_diff_f32(b, a, (long)n * nv1));
    /* the GGUF's own tokenizer encodes like GPT-2 */
    kn_model *m;
    REQUIRE(kn_model_load(gg, NULL, &m) == KN_OK, "%s", kn_last_error());
    int32_t t[16];
    int nt = 0;
    CHECK(kn_tokenize(kn_model_tokenizer(m), "Once upon a time", 16, true, false, t, 16, &nt) == KN_OK && nt == 5 &&
              t[0] == 50256 && t[1] == 7454 && t[4] == 640, "tokens %d: %d %d ... (%s)", nt, t[0], t[1], kn_last_error());
    kn_model_free(m);
    char why[400];
    if (!check_llamacpp(gg, ids, n, nv1, a, " (gpt2)", why, sizeof why)) { free(a); free(b); SKIP("llama.cpp check: %s", why + 6); }
    free(a); free(b);
}

/* A compact model whose final LayerNorm bias is still zero cannot be
 * widened faithfully: refused with what to do. */
TEST(gpt2_compact_untrained_refused_clearly) {
    const char *ck = tmp_path("fresh.safetensors");
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {.vocab = 4, .max_seq = 16, .dim = 16, .n_layers = 1, .n_heads = 2};
    kn_module *g = kn_gpt2_new(ctx, &gc);
    const char *meta[] = {"model", "gpt2", "vocab", "4", "layers", "1", "dim", "16", "heads", "2", "ctx", "16",
                          "gpt2_ids", "11,198,262", "tokenizer", "/nonexistent/v.gguf"};
    REQUIRE(kn_train_save(ck, g, NULL, 0, 8, meta) == KN_OK, "%s", kn_last_error());
    kn_model *m = NULL;
    CHECK(kn_model_load(ck, NULL, &m) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "--full-vocab 1") && !m, "%s",
          kn_last_error());
    CHECK(kn_model_export_gguf(ck, NULL, tmp_path("fresh.gguf")) == KN_ERR_UNSUPPORTED, "%s", kn_last_error());
    kn_module_free(g);
    kn_ctx_free(ctx);
}

TEST(gpt2_full_vocab_ckpt_loads) {
    if (!gpt2_vocab()) SKIP("gguf/ggml-vocab-gpt-2.gguf missing under KN_ASSETS");
    const char *ck = tmp_path("gf.safetensors");
    REQUIRE(train_gpt2_tiny(ck, true) == 0, "train: %s", kn_last_error());
    const int32_t ids[] = {50256, 7454, 2402, 257};
    int nv = 0;
    float *ref = module_logits(ck, 50257, ids, 4), *got = engine_logits(ck, ids, 4, &nv);
    REQUIRE(ref && got && nv == 50257, "logits: %s", kn_last_error());
    double d = kn_max_abs_diff_f32(got, ref, 4L * 50257), scale = fmax(1.0, max_abs(ref, 4L * 50257));
    CHECK(d <= 1e-5 * scale, "engine vs module logits differ by %g", d);
    free(ref); free(got);
}

/* ---- failed writes ---------------------------------------------------------------------- */

/* A file-size limit makes writes past it fail with EFBIG, as a full disk
 * fails them with ENOSPC: the same path through the writers. */
static struct rlimit g_old_fsize;
static void limit_file_size(rlim_t bytes) {
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &g_old_fsize);
    struct rlimit r = {bytes, g_old_fsize.rlim_max};
    setrlimit(RLIMIT_FSIZE, &r);
}
static void unlimit_file_size(void) { setrlimit(RLIMIT_FSIZE, &g_old_fsize); }

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

TEST(failed_writes_keep_the_previous_file_and_say_why) {
    const char *txt = tmp_path("w.txt"), *ck = tmp_path("w.safetensors"), *gg = tmp_path("w.gguf");
    write_text(txt, "abc def ghi\n", 3000);
    REQUIRE(train_tiny("char", txt, ck, 0, NULL) == 0, "train: %s", kn_last_error());
    CHECK(kn_model_export_gguf(ck, NULL, "/nonexistent_kn_dir/x.gguf") == KN_ERR_IO &&
              strstr(kn_last_error(), "No such file or directory"), "%s", kn_last_error());
    REQUIRE(kn_model_export_gguf(ck, NULL, gg) == KN_OK, "%s", kn_last_error());
    long gsize = file_size(gg), csize = file_size(ck);
    char gtmp[600], ctmp[600];
    snprintf(gtmp, sizeof gtmp, "%s.tmp", gg);
    snprintf(ctmp, sizeof ctmp, "%s.tmp", ck);
    /* export again under a limit smaller than the file */
    limit_file_size(4096);
    kn_status st = kn_model_export_gguf(ck, NULL, gg);
    unlimit_file_size();
    CHECK(st == KN_ERR_IO && strstr(kn_last_error(), "File too large"), "export under a size limit: %s",
          kn_last_error());
    CHECK(file_size(gg) == gsize && access(gtmp, F_OK) != 0, "the previous GGUF is intact and no .tmp is left");
    kn_model *m;
    CHECK(kn_model_load(gg, NULL, &m) == KN_OK, "the previous GGUF still loads: %s", kn_last_error());
    kn_model_free(m);
    /* a checkpoint save under the limit (what a periodic save meets on a full disk) */
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {.vocab = 30, .max_seq = 16, .dim = 16, .n_layers = 2, .n_heads = 2};
    kn_module *g = kn_gpt2_new(ctx, &gc);
    limit_file_size(4096);
    st = kn_train_save(ck, g, NULL, 9, 0, NULL);
    unlimit_file_size();
    CHECK(st == KN_ERR_IO && strstr(kn_last_error(), "File too large"), "checkpoint under a size limit: %s",
          kn_last_error());
    CHECK(file_size(ck) == csize && access(ctmp, F_OK) != 0, "the previous checkpoint is intact and no .tmp is left");
    CHECK(kn_model_load(ck, NULL, &m) == KN_OK, "the previous checkpoint still loads: %s", kn_last_error());
    kn_model_free(m);
    kn_module_free(g);
    kn_ctx_free(ctx);
}

/* The CLI side of a failed save: the run stops at once with the reason and
 * the resume command; the earlier checkpoint stays. */
TEST(train_cli_failed_periodic_save_stops_with_reason) {
    const char *txt = tmp_path("p.txt"), *ck = tmp_path("p.safetensors");
    write_text(txt, "abc def ghi\n", 3000);
    const char *extra[] = {"--ckpt-every", "1"};
    REQUIRE(train_tiny("char", txt, ck, 2, extra) == 0, "train: %s", kn_last_error());
    long size = file_size(ck);
    const char *a[] = {"char", "--data", txt, "--layers", "2", "--dim", "16", "--heads", "2", "--ctx", "16",
                       "--batch", "2", "--steps", "6", "--eval-batches", "1", "--sample-len", "0", "--log-every", "100",
                       "--resume", ck, "--ckpt-every", "1"};
    limit_file_size(4096);
    int rc = train(25, a);
    unlimit_file_size();
    CHECK(rc == 1, "exit %d after a failed save", rc);
    char step[16] = "";
    CHECK(file_size(ck) == size && kn_ckpt_meta(ck, "step", step, sizeof step) == KN_OK && !strcmp(step, "3"),
          "the checkpoint of step 3 is intact (step %s)", step);
}

TEST(cleanup) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (g_dir[0] && system(cmd) != 0) SKIP("could not remove %s", g_dir);
}

KN_TEST_MAIN()
