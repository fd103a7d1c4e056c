/* test_ckpt.c: safetensors checkpoints (round trip bit-exact, mismatch
 * reports, truncated files, PyTorch interop through committed fixtures) and
 * llm.c GPT-2 checkpoints mapped to module names.
 *
 * Fixtures (scripts/ckpt_ref.py): tests/fixtures/ckpt_kiln.safetensors is
 * what kn_ckpt_save writes for the standard tensors below (regenerate with
 * KN_CKPT_FIXTURE_OUT=tests/fixtures/ckpt_kiln.safetensors); the script
 * reads it with torch + safetensors, checks every value, and writes
 * tests/fixtures/ckpt_torch.safetensors (values transformed, one extra
 * tensor), which this test reads back. */
#include "kiln.h"
#include "kiln_ckpt.h"
#include "kiln_nn.h"
#include "formats/llmc_gpt2.h"
#include "formats/safetensors.h"
#include "core/fp16.h"
#include "kn_test.h"
#include <unistd.h>

static char g_tmp[256];
static const char *tmp_path(const char *name) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kn_test_ckpt_%d_%s", (int)getpid(), name);
    return g_tmp;
}
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(sz > 0 ? (size_t)sz : 1);
    *n = b ? fread(b, 1, (size_t)sz, f) : 0;
    fclose(f);
    return b;
}
static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}
static bool same_bytes(kn_tensor *a, kn_tensor *b) {
    if (a->dtype != b->dtype || kn_numel(a) != kn_numel(b)) return false;
    size_t nb = kn_dtype_nbytes(a->dtype, kn_numel(a));
    char *x = malloc(nb + 1), *y = malloc(nb + 1);
    bool ok = kn_tensor_read(a, x, a->dtype) == KN_OK && kn_tensor_read(b, y, b->dtype) == KN_OK && memcmp(x, y, nb) == 0;
    free(x); free(y);
    return ok;
}

/* ---- round trip ------------------------------------------------------------------ */

TEST(roundtrip_bit_exact) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t s1[2] = {7, 5}, s2[1] = {9}, s3[3] = {2, 3, 4}, s4[1] = {6}, s5[2] = {5, 7};
    kn_tensor *w = kn_param(ctx, KN_F32, 2, s1), *b = kn_param(ctx, KN_BF16, 1, s2), *h = kn_param(ctx, KN_F16, 3, s3);
    kn_tensor *step = kn_empty(ctx, KN_I64, 0, NULL), *flags = kn_empty(ctx, KN_BOOL, 1, s4);
    float wv[35];
    kn_test_seed(11);
    kn_test_fill_f32(wv, 35, -3, 3);
    uint32_t nan_bits = 0x7fc01234u, neg0 = 0x80000000u;     /* payload NaN and -0 survive */
    memcpy(&wv[3], &nan_bits, 4);
    memcpy(&wv[4], &neg0, 4);
    wv[5] = INFINITY;
    kn_tensor_write(w, wv, KN_F32);
    uint16_t bv[9], hv[24];
    for (int i = 0; i < 9; i++) bv[i] = (uint16_t)(0x3f80 + 37 * i);
    for (int i = 0; i < 24; i++) hv[i] = (uint16_t)(0x3c00 ^ (i * 977));
    kn_tensor_write(b, bv, KN_BF16);
    kn_tensor_write(h, hv, KN_F16);
    int64_t sv = 123456789012345ll;
    kn_tensor_write(step, &sv, KN_I64);
    uint8_t fv[6] = {1, 0, 0, 1, 1, 0};
    kn_tensor_write(flags, fv, KN_BOOL);
    /* a transposed view is saved as its row-major values */
    kn_tensor *wt = kn_transpose(ctx, w, 0, 1);
    const char *names[6] = {"model.w", "model.b", "model.h", "opt.step", "flags", "wt"};
    kn_tensor *ts[6] = {w, b, h, step, flags, wt};
    const char *meta[4] = {"step", "1200", "note", "\"quoted\" \\ text \xC3\xA9"};
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("rt.safetensors"));
    REQUIRE(kn_ckpt_save(path, 6, names, ts, 2, meta) == KN_OK, "%s", kn_last_error());
    kn_tensor *w2 = kn_empty(ctx, KN_F32, 2, s1), *b2 = kn_empty(ctx, KN_BF16, 1, s2), *h2 = kn_param(ctx, KN_F16, 3, s3);
    kn_tensor *step2 = kn_empty(ctx, KN_I64, 0, NULL), *flags2 = kn_empty(ctx, KN_BOOL, 1, s4);
    kn_tensor *wt2 = kn_empty(ctx, KN_F32, 2, s5);
    kn_tensor *ts2[6] = {w2, b2, h2, step2, flags2, wt2};
    REQUIRE(kn_ckpt_load(path, 6, names, ts2) == KN_OK, "%s", kn_last_error());
    for (int i = 0; i < 6; i++) CHECK(same_bytes(ts[i], ts2[i]), "%s differs after the round trip", names[i]);
    float back[35];
    kn_tensor_read(w2, back, KN_F32);
    CHECK(memcmp(back, wv, sizeof wv) == 0, "f32 bits (NaN payload, -0, inf)");
    char buf[64];
    CHECK(kn_ckpt_meta(path, "step", buf, sizeof buf) == KN_OK && strcmp(buf, "1200") == 0, "meta step '%s'", buf);
    CHECK(kn_ckpt_meta(path, "note", buf, sizeof buf) == KN_OK && strcmp(buf, meta[3]) == 0, "meta note '%s'", buf);
    CHECK(kn_ckpt_meta(path, "none", buf, sizeof buf) == KN_ERR_INVALID && strstr(kn_last_error(), "none"), "absent key");
    CHECK(kn_ckpt_meta(path, "note", buf, 4) == KN_ERR_LIMIT, "small buffer");
    /* the order of the names does not matter */
    const char *names_r[6] = {"wt", "flags", "opt.step", "model.h", "model.b", "model.w"};
    kn_tensor *ts_r[6] = {wt2, flags2, step2, h2, b2, w2};
    CHECK(kn_ckpt_load(path, 6, names_r, ts_r) == KN_OK, "%s", kn_last_error());
    /* saving overwrites an existing file atomically and leaves no .tmp */
    REQUIRE(kn_ckpt_save(path, 1, names, ts, 0, NULL) == KN_OK, "%s", kn_last_error());
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
    remove(path);
    kn_ctx_free(ctx);
}

/* ---- mismatches -------------------------------------------------------------------------- */

TEST(mismatch_lists_every_difference) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s4[1] = {4};
    kn_tensor *a = kn_full(ctx, KN_F32, 2, s23, 1.5), *b = kn_full(ctx, KN_F32, 2, s23, 2.5);
    kn_tensor *c = kn_full(ctx, KN_F16, 1, s4, 3.0), *d = kn_full(ctx, KN_I32, 1, s4, 4.0);
    const char *names[4] = {"a", "b", "c", "d"};
    kn_tensor *ts[4] = {a, b, c, d};
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("mm.safetensors"));
    REQUIRE(kn_ckpt_save(path, 4, names, ts, 0, NULL) == KN_OK, "%s", kn_last_error());
    /* model: a ok, b transposed shape, c f32 instead of f16, e missing; d unexpected */
    float sentinel[6] = {-7, -7, -7, -7, -7, -7};
    kn_tensor *a2 = kn_from_data(ctx, KN_F32, 2, s23, sentinel), *b2 = kn_from_data(ctx, KN_F32, 2, s32, sentinel);
    kn_tensor *c2 = kn_empty(ctx, KN_F32, 1, s4), *e2 = kn_empty(ctx, KN_F32, 1, s4);
    const char *mn[4] = {"a", "b", "c", "e"};
    kn_tensor *mt[4] = {a2, b2, c2, e2};
    kn_status st = kn_ckpt_load(path, 4, mn, mt);
    const char *msg = kn_last_error();
    CHECK(st == KN_ERR_INVALID, "status %d", st);
    CHECK(strstr(msg, "missing: e"), "no 'missing: e' in: %s", msg);
    CHECK(strstr(msg, "unexpected: d"), "no 'unexpected: d' in: %s", msg);
    CHECK(strstr(msg, "shape: b is [2,3] in the file, [3,2] in the model"), "no shape line in: %s", msg);
    CHECK(strstr(msg, "dtype: c is f16 in the file, f32 in the model"), "no dtype line in: %s", msg);
    CHECK(strstr(msg, "1 missing, 1 unexpected, 1 shape, 1 dtype") && strstr(msg, "nothing was written"), "counts: %s", msg);
    CHECK(!strstr(msg, "a is") && !strstr(msg, ": a;"), "'a' matches but is reported: %s", msg);
    float av[6];
    kn_tensor_read(a2, av, KN_F32);
    CHECK(av[0] == -7 && av[5] == -7, "a was written although the load was refused (%g)", av[0]);
    char *rep = NULL;
    CHECK(kn_ckpt_check(path, 4, mn, mt, KN_CKPT_STRICT, &rep) == KN_ERR_INVALID && rep, "check");
    int lines = 0;
    for (const char *q = rep; q && *q; q++) lines += *q == '\n';
    CHECK(lines == 4, "report has %d lines:\n%s", lines, rep ? rep : "");
    free(rep);
    /* tolerant flags: only shape/dtype problems remain */
    CHECK(kn_ckpt_load_ex(path, 4, mn, mt, KN_CKPT_ALLOW_MISSING | KN_CKPT_ALLOW_UNEXPECTED) == KN_ERR_INVALID &&
          !strstr(kn_last_error(), "missing: e") && strstr(kn_last_error(), "shape: b"), "%s", kn_last_error());
    const char *okn[2] = {"a", "e"};
    kn_tensor *okt[2] = {a2, e2};
    CHECK(kn_ckpt_load_ex(path, 2, okn, okt, KN_CKPT_ALLOW_MISSING | KN_CKPT_ALLOW_UNEXPECTED) == KN_OK, "%s", kn_last_error());
    kn_tensor_read(a2, av, KN_F32);
    CHECK(av[0] == 1.5f && av[5] == 1.5f, "a not loaded with flags (%g)", av[0]);
    /* duplicate names, NULL tensors, computed nodes */
    const char *dup[2] = {"a", "a"};
    kn_tensor *dupt[2] = {a2, a2};
    CHECK(kn_ckpt_load(path, 2, dup, dupt) == KN_ERR_INVALID && strstr(kn_last_error(), "twice"), "%s", kn_last_error());
    kn_tensor *nul[1] = {NULL};
    CHECK(kn_ckpt_load(path, 1, okn, nul) == KN_ERR_STATE, "NULL tensor: %s", kn_last_error());
    kn_tensor *node = kn_add(ctx, a2, a2);
    kn_tensor *nodet[4] = {node, kn_empty(ctx, KN_F32, 2, s23), kn_empty(ctx, KN_F16, 1, s4), kn_empty(ctx, KN_I32, 1, s4)};
    CHECK(kn_ckpt_load(path, 4, names, nodet) == KN_ERR_INVALID && strstr(kn_last_error(), "computed node"), "%s", kn_last_error());
    remove(path);
    kn_ctx_free(ctx);
}

TEST(mismatch_many_differences) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t s1[1] = {2};
    kn_tensor *x = kn_full(ctx, KN_F32, 1, s1, 1);
    const char *nx[1] = {"present"};
    kn_tensor *tx[1] = {x};
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("many.safetensors"));
    REQUIRE(kn_ckpt_save(path, 1, nx, tx, 0, NULL) == KN_OK, "%s", kn_last_error());
    enum { N = 200 };
    static char nbuf[N][48];
    const char *names[N];
    kn_tensor *ts[N];
    for (int i = 0; i < N; i++) {
        snprintf(nbuf[i], sizeof nbuf[i], "layers.%d.mlp.weight", i);
        names[i] = nbuf[i];
        ts[i] = kn_empty(ctx, KN_F32, 1, s1);
    }
    CHECK(kn_ckpt_load(path, N, names, ts) == KN_ERR_INVALID, "refused");
    const char *msg = kn_last_error();
    CHECK(strstr(msg, "200 missing, 1 unexpected") && strstr(msg, "more (kn_ckpt_check lists all)"), "%s", msg);
    char *rep = NULL;
    kn_ckpt_check(path, N, names, ts, KN_CKPT_STRICT, &rep);
    int lines = 0;
    for (const char *q = rep; q && *q; q++) lines += *q == '\n';
    CHECK(lines == 201 && rep && strstr(rep, "missing: layers.199.mlp.weight") && strstr(rep, "unexpected: present"),
          "report %d lines", lines);
    free(rep);
    remove(path);
    kn_ctx_free(ctx);
}

TEST(truncated_or_corrupt_files_refused) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t s[2] = {16, 8};
    kn_tensor *w = kn_randn(ctx, KN_F32, 2, s, 5);
    kn_realize(w);
    const char *names[1] = {"w"};
    kn_tensor *ts[1] = {w};
    char path[300], bad[300];
    snprintf(path, sizeof path, "%s", tmp_path("tr.safetensors"));
    snprintf(bad, sizeof bad, "%s", tmp_path("tr_bad.safetensors"));
    REQUIRE(kn_ckpt_save(path, 1, names, ts, 0, NULL) == KN_OK, "%s", kn_last_error());
    size_t n;
    unsigned char *buf = slurp(path, &n);
    REQUIRE(buf && n > 8 + 16 * 8 * 4, "file size %zu", n);
    float sentinel[128];
    for (int i = 0; i < 128; i++) sentinel[i] = 42;
    kn_tensor *dst = kn_from_data(ctx, KN_F32, 2, s, sentinel);
    kn_tensor *dt[1] = {dst};
    size_t cuts[] = {n - 1, n - 300, 40, 9, 8, 4, 0};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        REQUIRE(write_file(bad, buf, cuts[k]), "tmp");
        kn_status st = kn_ckpt_load(bad, 1, names, dt);
        CHECK(st == KN_ERR_FORMAT || st == KN_ERR_IO, "cut at %zu bytes of %zu: status %d (%s)", cuts[k], n, st, kn_last_error());
        CHECK(strstr(kn_last_error(), "kn_ckpt_load"), "message names the call: %s", kn_last_error());
    }
    /* header length pointing past the end; garbage JSON */
    unsigned char *c2 = malloc(n);
    memcpy(c2, buf, n);
    c2[0] = 0xff; c2[1] = 0xff;
    REQUIRE(write_file(bad, c2, n), "tmp");
    CHECK(kn_ckpt_load(bad, 1, names, dt) == KN_ERR_FORMAT, "huge header length: %s", kn_last_error());
    memcpy(c2, buf, n);
    c2[9] = '[';
    REQUIRE(write_file(bad, c2, n), "tmp");
    CHECK(kn_ckpt_load(bad, 1, names, dt) == KN_ERR_FORMAT, "bad JSON: %s", kn_last_error());
    float v[128];
    kn_tensor_read(dst, v, KN_F32);
    int untouched = 1;
    for (int i = 0; i < 128; i++) untouched &= v[i] == 42;
    CHECK(untouched, "a refused file wrote into the tensor");
    CHECK(kn_ckpt_load(tmp_path("missing.safetensors"), 1, names, dt) == KN_ERR_IO, "missing file: %s", kn_last_error());
    free(c2); free(buf);
    remove(path); remove(bad);
    kn_ctx_free(ctx);
}

TEST(save_errors) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t s[1] = {32};
    kn_tensor *q = kn_empty(ctx, KN_Q8_0, 1, s), *f = kn_ones(ctx, KN_F32, 1, s);
    const char *names[2] = {"q", "f"};
    kn_tensor *ts[2] = {q, f};
    CHECK(kn_ckpt_save(tmp_path("e.safetensors"), 1, names, ts, 0, NULL) == KN_ERR_UNSUPPORTED &&
          strstr(kn_last_error(), "q8_0"), "quantized: %s", kn_last_error());
    const char *dup[2] = {"f", "f"};
    kn_tensor *ff[2] = {f, f};
    CHECK(kn_ckpt_save(tmp_path("e.safetensors"), 2, dup, ff, 0, NULL) == KN_ERR_INVALID && strstr(kn_last_error(), "duplicate"),
          "duplicate: %s", kn_last_error());
    CHECK(kn_ckpt_save(tmp_path("e.safetensors"), 1, names + 1, ts + 1, 0, NULL) == KN_OK, "lazy tensor saved: %s", kn_last_error());
    CHECK(kn_ckpt_save("/nonexistent-dir/x.safetensors", 1, names + 1, ts + 1, 0, NULL) == KN_ERR_IO, "bad dir: %s", kn_last_error());
    remove(tmp_path("e.safetensors"));
    kn_ctx_free(ctx);
}

/* ---- PyTorch interop (committed fixtures) --------------------------------------------------
 * The standard tensors; scripts/ckpt_ref.py computes the same formulas. */

#define N_STD 10
static const char *std_names[N_STD] = {"w", "b", "h", "d", "i", "j", "u", "m", "s", "e"};
static void std_tensors(kn_ctx *ctx, kn_tensor *ts[N_STD]) {
    int64_t sw[2] = {3, 4}, sb[1] = {5}, sh[2] = {2, 3}, sd[1] = {2}, si[1] = {3}, sj[2] = {2, 2}, su[1] = {4}, sm[1] = {3},
            se[2] = {0, 3};
    float w[12]; uint16_t b[5], h[6]; double d[2]; int64_t iv[3]; int32_t j[4]; uint8_t u[4], m[3]; float s = 3.5f;
    for (int k = 0; k < 12; k++) w[k] = (float)(k - 5) * 0.25f;
    for (int k = 0; k < 5; k++) b[k] = kn_fp32_to_bf16((float)k * 0.5f - 1.0f);
    for (int k = 0; k < 6; k++) h[k] = kn_fp32_to_fp16((float)k * 0.125f);
    for (int k = 0; k < 2; k++) d[k] = k + 0.1;
    for (int k = 0; k < 3; k++) iv[k] = -((int64_t)1 << 40) + k;
    for (int k = 0; k < 4; k++) j[k] = k * 1000 - 1500;
    for (int k = 0; k < 4; k++) u[k] = (uint8_t)(250 + k);
    for (int k = 0; k < 3; k++) m[k] = k % 2 == 0;
    ts[0] = kn_from_data(ctx, KN_F32, 2, sw, w);
    ts[1] = kn_from_data(ctx, KN_BF16, 1, sb, b);
    ts[2] = kn_from_data(ctx, KN_F16, 2, sh, h);
    ts[3] = kn_from_data(ctx, KN_F64, 1, sd, d);
    ts[4] = kn_from_data(ctx, KN_I64, 1, si, iv);
    ts[5] = kn_from_data(ctx, KN_I32, 2, sj, j);
    ts[6] = kn_from_data(ctx, KN_U8, 1, su, u);
    ts[7] = kn_from_data(ctx, KN_BOOL, 1, sm, m);
    ts[8] = kn_from_data(ctx, KN_F32, 0, NULL, &s);
    ts[9] = kn_empty(ctx, KN_F32, 2, se);
}
static const char *std_meta[4] = {"step", "123", "rng", "0x1234"};

TEST(torch_interop_fixtures) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *ts[N_STD];
    std_tensors(ctx, ts);
    const char *fixture = "tests/fixtures/ckpt_kiln.safetensors";
    const char *out = getenv("KN_CKPT_FIXTURE_OUT");
    if (out && *out) {
        REQUIRE(kn_ckpt_save(out, N_STD, std_names, ts, 2, std_meta) == KN_OK, "%s", kn_last_error());
        fixture = out;
    }
    /* 1. kiln writes today exactly the bytes torch checked */
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("std.safetensors"));
    REQUIRE(kn_ckpt_save(path, N_STD, std_names, ts, 2, std_meta) == KN_OK, "%s", kn_last_error());
    size_t na, nb;
    unsigned char *a = slurp(path, &na), *b = slurp(fixture, &nb);
    REQUIRE(b, "%s unreadable (run from the repository root)", fixture);
    CHECK(a && na == nb && memcmp(a, b, na) == 0, "kn_ckpt_save output differs from %s (%zu vs %zu bytes)", fixture, na, nb);
    free(a); free(b);
    remove(path);
    /* 2. what torch wrote back: floats 2v+1, ints v+1, u8 v-1, bool not, plus "torch_only" */
    const char *tf = "tests/fixtures/ckpt_torch.safetensors";
    kn_tensor *t2[N_STD + 1];
    for (int k = 0; k < N_STD; k++) t2[k] = kn_empty(ctx, ts[k]->dtype, ts[k]->ndim, ts[k]->shape);
    CHECK(kn_ckpt_load(tf, N_STD, std_names, t2) == KN_ERR_INVALID && strstr(kn_last_error(), "unexpected: torch_only"),
          "strict load must refuse the extra tensor: %s", kn_last_error());
    int64_t s2[1] = {2};
    t2[N_STD] = kn_empty(ctx, KN_F32, 1, s2);
    const char *names2[N_STD + 1];
    for (int k = 0; k < N_STD; k++) names2[k] = std_names[k];
    names2[N_STD] = "torch_only";
    REQUIRE(kn_ckpt_load(tf, N_STD + 1, names2, t2) == KN_OK, "%s", kn_last_error());
    int bad = 0;
    for (int k = 0; k < N_STD; k++) {
        int64_t n = kn_numel(ts[k]);
        double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)), *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kn_tensor_read(ts[k], x, KN_F64);
        kn_tensor_read(t2[k], y, KN_F64);
        for (int64_t i = 0; i < n; i++) {
            double want = kn_dtype_get(ts[k]->dtype)->is_float ? 2 * x[i] + 1
                        : ts[k]->dtype == KN_BOOL ? !x[i] : ts[k]->dtype == KN_U8 ? x[i] - 1 : x[i] + 1;
            if (y[i] != want) { bad++; fprintf(stderr, "  %s[%lld] = %.17g, want %.17g\n", std_names[k], (long long)i, y[i], want); }
        }
        free(x); free(y);
    }
    float to[2];
    kn_tensor_read(t2[N_STD], to, KN_F32);
    CHECK(bad == 0 && to[0] == 1 && to[1] == 2, "%d values differ", bad);
    char buf[128];
    CHECK(kn_ckpt_meta(tf, "step", buf, sizeof buf) == KN_OK && strcmp(buf, "124") == 0, "torch metadata step '%s'", buf);
    CHECK(kn_ckpt_meta(tf, "checked_by", buf, sizeof buf) == KN_OK && strstr(buf, "torch"), "checked_by '%s'", buf);
    kn_ctx_free(ctx);
}

/* ---- llm.c GPT-2 ------------------------------------------------------------------------------ */

static const kn_llmc_gpt2_config g_cfg = {8, 10, 16, 2, 2, 4};   /* maxT V Vp L NH C */

/* named tensors for g_cfg with wte [V, C]; random values */
static int64_t gpt2_tensors(kn_ctx *ctx, const char *prefix, char names[][96], const char **np, kn_tensor **ts) {
    int64_t C = g_cfg.channels, T = g_cfg.max_seq_len, V = g_cfg.vocab_size;
    int64_t shapes[16][3] = {{2, V, C}, {2, T, C}, {1, C}, {1, C}, {2, 3 * C, C}, {1, 3 * C}, {2, C, C}, {1, C},
                             {1, C}, {1, C}, {2, 4 * C, C}, {1, 4 * C}, {2, C, 4 * C}, {1, C}, {1, C}, {1, C}};
    int64_t k = 0;
    for (int p = 0; p < 16; p++)
        for (int l = 0; l < (kn_gpt2_names[p].per_layer ? g_cfg.n_layers : 1); l++, k++) {
            kn_gpt2_param_name(prefix, p, l, names[k], 96);
            np[k] = names[k];
            ts[k] = kn_randn(ctx, KN_F32, (int)shapes[p][0], shapes[p] + 1, 1000 + (uint64_t)k);
            kn_realize(ts[k]);
        }
    return k;
}

TEST(llmc_gpt2_mapping) {
    char nm[96];
    CHECK(kn_gpt2_param_name("model.", 4, 3, nm, sizeof nm) == KN_OK && strcmp(nm, "model.h.3.attn.c_attn.weight") == 0, "%s", nm);
    CHECK(kn_gpt2_param_name(NULL, 0, 7, nm, sizeof nm) == KN_OK && strcmp(nm, "wte.weight") == 0, "%s", nm);
    CHECK(kn_gpt2_param_name(NULL, 16, 0, nm, sizeof nm) == KN_ERR_INVALID, "kind 16 accepted");
    CHECK(kn_gpt2_n_named(12) == 148, "124M has %lld named tensors", (long long)kn_gpt2_n_named(12));
    kn_ctx *ctx = kn_ctx_new(NULL);
    static char names[64][96];
    const char *np[64];
    kn_tensor *ts[64];
    int64_t n = gpt2_tensors(ctx, "m.", names, np, ts);
    REQUIRE(n == 28, "%lld names", (long long)n);
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("gpt2.bin"));
    REQUIRE(kn_ckpt_save_llmc_gpt2(path, &g_cfg, KN_F32, "m.", n, np, ts) == KN_OK, "%s", kn_last_error());
    /* the file, read with the llm.c reader: stacked layers, wte padded with zero rows */
    kn_llmc_gpt2 *m;
    REQUIRE(kn_llmc_gpt2_open(path, &m) == KN_OK, "%s", kn_last_error());
    const float *wte = kn_llmc_gpt2_param(m, KN_GPT2_WTE)->data;
    const float *qkv = kn_llmc_gpt2_param(m, KN_GPT2_QKVW)->data;
    float ref[48];
    kn_tensor_read(ts[0], ref, KN_F32);
    CHECK(memcmp(wte, ref, 40 * sizeof(float)) == 0, "wte rows 0..9");
    int zero = 1;
    for (int i = 40; i < 64; i++) zero &= wte[i] == 0;
    CHECK(zero, "wte padding rows are not zero");
    int qi = 0;
    while (strcmp(np[qi], "m.h.1.attn.c_attn.weight")) qi++;
    kn_tensor_read(ts[qi], ref, KN_F32);
    CHECK(memcmp(qkv + 48, ref, 48 * sizeof(float)) == 0, "layer 1 qkvw is the second slab");
    kn_llmc_gpt2_close(m);
    /* load back into fresh tensors (wte as [Vp, C] here: padding rows included) */
    kn_tensor *t2[64];
    for (int64_t k = 0; k < n; k++) t2[k] = kn_empty(ctx, KN_F32, ts[k]->ndim, ts[k]->shape);
    int64_t svp[2] = {16, 4};
    t2[0] = kn_empty(ctx, KN_F32, 2, svp);
    kn_llmc_gpt2_config got;
    REQUIRE(kn_ckpt_load_llmc_gpt2(path, "m.", n, np, t2, &got) == KN_OK, "%s", kn_last_error());
    CHECK(got.padded_vocab_size == 16 && got.n_layers == 2 && got.channels == 4, "config");
    int diff = 0;
    for (int64_t k = 1; k < n; k++) diff += !same_bytes(ts[k], t2[k]);
    CHECK(diff == 0, "%d tensors differ after llm.c round trip", diff);
    float wv[64];
    kn_tensor_read(t2[0], wv, KN_F32);
    kn_tensor_read(ts[0], ref, KN_F32);
    CHECK(memcmp(wv, ref, 40 * sizeof(float)) == 0 && wv[63] == 0, "wte [Vp, C] load");
    /* bf16 file into f32 tensors: values are the bf16 roundings */
    REQUIRE(kn_ckpt_save_llmc_gpt2(path, &g_cfg, KN_BF16, "m.", n, np, ts) == KN_OK, "%s", kn_last_error());
    for (int64_t k = 0; k < n; k++) t2[k] = kn_empty(ctx, KN_F32, ts[k]->ndim, ts[k]->shape);
    REQUIRE(kn_ckpt_load_llmc_gpt2(path, "m.", n, np, t2, NULL) == KN_OK, "%s", kn_last_error());
    kn_tensor_read(t2[4], wv, KN_F32);
    kn_tensor_read(ts[4], ref, KN_F32);
    int64_t n4 = kn_numel(ts[4]);
    for (int64_t i = 0; i < n4; i++) diff += wv[i] != kn_bf16_to_fp32(kn_fp32_to_bf16(ref[i]));
    CHECK(diff == 0, "bf16 values differ from rounding");
    /* mismatch: one name missing, one unknown, one wrong shape; nothing written */
    const char *np2[64];
    memcpy(np2, np, sizeof(char *) * (size_t)n);
    np2[3] = "m.h.9.ln_1.bias";
    int64_t bad_shape[1] = {5};
    kn_tensor *keep = t2[n - 1];
    t2[n - 1] = kn_full(ctx, KN_F32, 1, bad_shape, 0);
    kn_realize(t2[n - 1]);
    float before[32];
    kn_tensor_read(t2[1], before, KN_F32);
    REQUIRE(kn_ckpt_save_llmc_gpt2(path, &g_cfg, KN_F32, "m.", n, np, ts) == KN_OK, "%s", kn_last_error());
    kn_tensor *t3[64];
    for (int64_t k = 0; k < n; k++) t3[k] = t2[k];
    t3[n - 1] = kn_empty(ctx, KN_F32, 1, bad_shape);
    CHECK(kn_ckpt_load_llmc_gpt2(path, "m.", n, np2, t3, NULL) == KN_ERR_INVALID, "mismatch accepted");
    const char *msg = kn_last_error();
    CHECK(strstr(msg, "missing: m.h.9.ln_1.bias") && strstr(msg, "unexpected: ") && strstr(msg, "shape: m.ln_f.bias"),
          "message: %s", msg);
    float after[32];
    kn_tensor_read(t2[1], after, KN_F32);
    CHECK(memcmp(before, after, sizeof before) == 0, "wpe written although refused");
    (void)keep;
    CHECK(kn_ckpt_save_llmc_gpt2(path, &g_cfg, KN_F32, "m.", n - 1, np, ts) == KN_ERR_INVALID &&
          strstr(kn_last_error(), "missing: m.ln_f.bias"), "save with a missing tensor: %s", kn_last_error());
    remove(path);
    kn_ctx_free(ctx);
}

/* The GPT-2 module's own parameter names are exactly the llm.c mapping's. */
TEST(llmc_gpt2_module_names) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_gpt2_cfg gc = {g_cfg.vocab_size, g_cfg.max_seq_len, g_cfg.channels, g_cfg.n_layers, g_cfg.n_heads, 0.0};
    kn_module *mod = kn_gpt2_new(ctx, &gc);
    REQUIRE(mod, "kn_gpt2_new: %s", kn_last_error());
    kn_named_param ps[64];
    int np = kn_module_named_params(mod, true, ps, 64);
    REQUIRE(np > 0 && np <= 64, "%d params", np);
    const char *names[64];
    kn_tensor *ts[64];
    for (int i = 0; i < np; i++) { names[i] = ps[i].name; ts[i] = ps[i].t; }
    char path[300];
    snprintf(path, sizeof path, "%s", tmp_path("mod.bin"));
    CHECK(np == kn_gpt2_n_named(g_cfg.n_layers), "module has %d named tensors, mapping %lld", np,
          (long long)kn_gpt2_n_named(g_cfg.n_layers));
    kn_status st = kn_ckpt_save_llmc_gpt2(path, &g_cfg, KN_F32, "", np, names, ts);
    CHECK(st == KN_OK, "module -> llm.c: %s", kn_last_error());
    if (st == KN_OK) {
        kn_ctx *c2 = kn_ctx_new(NULL);
        kn_module *mod2 = kn_gpt2_new(c2, &gc);
        kn_named_param ps2[64];
        int np2 = kn_module_named_params(mod2, true, ps2, 64);
        const char *n2[64];
        kn_tensor *t2[64];
        for (int i = 0; i < np2; i++) { n2[i] = ps2[i].name; t2[i] = ps2[i].t; }
        CHECK(kn_ckpt_load_llmc_gpt2(path, "", np2, n2, t2, NULL) == KN_OK, "llm.c -> module: %s", kn_last_error());
        int diff = 0;
        for (int i = 0; i < np && i < np2; i++) diff += !same_bytes(ts[i], t2[i]);
        CHECK(diff == 0, "%d tensors differ", diff);
        kn_module_free(mod2);
        kn_ctx_free(c2);
    }
    remove(path);
    kn_module_free(mod);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
