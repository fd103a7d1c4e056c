/* test_data.c: datasets, the loader (shuffling, drop_last, prefetch thread),
 * MNIST idx files, char vocabularies, llm.c token shards, GPT-2 document
 * tokenization. Assets come from KN_ASSETS (skipped with the reason when
 * missing). */
#include "kiln.h"
#include "kiln_data.h"
#include "kiln_tokenizer.h"
#include "formats/gguf.h"
#include "kn_test.h"
#include <stdint.h>
#include <unistd.h>
#include <zlib.h>

static char g_tmp[256];
static const char *tmp_path(const char *name) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kn_test_data_%d_%s", (int)getpid(), name);
    return g_tmp;
}
static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}
static bool write_gz(const char *path, const void *data, size_t n) {
    gzFile f = gzopen(path, "wb");
    if (!f) return false;
    bool ok = gzwrite(f, data, (unsigned)n) == (int)n;
    return gzclose(f) == Z_OK && ok;
}
static bool is_perm(const int64_t *p, int64_t n) {
    char *seen = calloc((size_t)n + 1, 1);
    bool ok = seen != NULL;
    for (int64_t i = 0; i < n && ok; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]) ok = false;
        else seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

/* ---- shuffling ------------------------------------------------------------------ */

TEST(shuffle_deterministic) {
    enum { N = 1000 };
    static int64_t a[N], b[N], c[N], d[N];
    REQUIRE(kn_shuffle_order(N, 7, 0, a) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_shuffle_order(N, 7, 0, b) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_shuffle_order(N, 8, 0, c) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_shuffle_order(N, 7, 1, d) == KN_OK, "%s", kn_last_error());
    CHECK(memcmp(a, b, sizeof a) == 0, "same (seed, epoch) gives a different order");
    CHECK(memcmp(a, c, sizeof a) != 0, "seeds 7 and 8 give the same order");
    CHECK(memcmp(a, d, sizeof a) != 0, "epochs 0 and 1 give the same order");
    CHECK(is_perm(a, N) && is_perm(c, N) && is_perm(d, N), "not a permutation");
    int fixed = 0, same_ac = 0;
    for (int i = 0; i < N; i++) { fixed += a[i] == i; same_ac += a[i] == c[i]; }
    /* a random permutation has ~1 fixed point; allow a generous margin */
    CHECK(fixed < 10, "%d fixed points: not shuffled", fixed);
    CHECK(same_ac < 10, "%d positions agree between two seeds", same_ac);
    /* every epoch of several is a permutation; small n work */
    for (int e = 0; e < 5; e++) {
        REQUIRE(kn_shuffle_order(N, 123, e, a) == KN_OK, "%s", kn_last_error());
        CHECK(is_perm(a, N), "epoch %d not a permutation", e);
    }
    int64_t one[1] = {5};
    CHECK(kn_shuffle_order(1, 1, 0, one) == KN_OK && one[0] == 0, "n=1");
    CHECK(kn_shuffle_order(0, 1, 0, NULL) == KN_OK, "n=0");
    CHECK(kn_shuffle_order(-1, 1, 0, a) == KN_ERR_INVALID, "n<0 accepted");
    /* position 0 over many seeds is roughly uniform over 4 items */
    int cnt[4] = {0};
    for (uint64_t s = 0; s < 4000; s++) { int64_t p[4]; kn_shuffle_order(4, s, 0, p); cnt[p[0]]++; }
    for (int k = 0; k < 4; k++) CHECK(cnt[k] > 850 && cnt[k] < 1150, "first element %d drawn %d/4000 times", k, cnt[k]);
}

/* ---- loader ------------------------------------------------------------------------ */

/* dataset of n samples: x = i32[3] {i, 2i, 3i}, y = f32 scalar i + 0.5 */
static kn_dataset *make_arrays(int64_t n) {
    int32_t *x = malloc((size_t)n * 3 * sizeof *x);
    float *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) { x[3 * i] = (int32_t)i; x[3 * i + 1] = (int32_t)(2 * i); x[3 * i + 2] = (int32_t)(3 * i); y[i] = (float)i + 0.5f; }
    kn_data_field f[2] = {{"x", KN_I32, 1, {3}}, {"y", KN_F32, 0, {0}}};
    const void *d[2] = {x, y};
    kn_dataset *ds = NULL;
    if (kn_dataset_from_arrays(n, 2, f, d, true, &ds)) fprintf(stderr, "  dataset: %s\n", kn_last_error());
    free(x); free(y);
    return ds;
}

static bool batch_consistent(const kn_batch *b) {
    const int32_t *x = b->data[0];
    const float *y = b->data[1];
    for (int64_t k = 0; k < b->size; k++) {
        int64_t i = b->indices[k];
        if (x[3 * k] != i || x[3 * k + 1] != 2 * i || x[3 * k + 2] != 3 * i || y[k] != (float)i + 0.5f) return false;
    }
    return true;
}

TEST(loader_sequential) {
    kn_dataset *ds = make_arrays(10);
    REQUIRE(ds, "dataset");
    CHECK(kn_dataset_len(ds) == 10 && kn_dataset_n_fields(ds) == 2 && kn_dataset_sample_bytes(ds, 0) == 12 &&
          kn_dataset_sample_bytes(ds, 1) == 4 && strcmp(kn_dataset_field(ds, 0)->name, "x") == 0, "dataset shape");
    for (int drop = 0; drop < 2; drop++) {
        kn_loader_opts o = kn_loader_defaults();
        o.batch_size = 4; o.drop_last = drop;
        kn_loader *l;
        REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
        CHECK(kn_loader_n_batches(l) == (drop ? 2 : 3), "n_batches %lld", (long long)kn_loader_n_batches(l));
        int64_t want[4] = {4, 4, drop ? 0 : 2, 0};
        int nb = drop ? 3 : 4;
        for (int e = 0; e < 2; e++)
            for (int k = 0; k < nb; k++) {
                kn_batch b;
                REQUIRE(kn_loader_next(l, &b) == KN_OK, "%s", kn_last_error());
                int64_t ws = (k == nb - 1) ? 0 : want[k];
                CHECK(b.size == ws && b.epoch == e && b.index == k, "drop %d epoch %d batch %d: size %lld epoch %lld index %lld",
                      drop, e, k, (long long)b.size, (long long)b.epoch, (long long)b.index);
                for (int64_t j = 0; j < b.size; j++) CHECK(b.indices[j] == 4 * k + j, "unshuffled order");
                CHECK(batch_consistent(&b), "batch data does not match its indices");
            }
        kn_loader_free(l);
    }
    kn_loader_opts o = kn_loader_defaults();
    o.batch_size = 0;
    kn_loader *l = NULL;
    CHECK(kn_loader_new(ds, &o, &l) == KN_ERR_INVALID && !l && strstr(kn_last_error(), "batch_size"), "batch 0: %s", kn_last_error());
    kn_dataset_free(ds);
}

TEST(loader_shuffle_epoch_is_permutation) {
    enum { N = 37 };
    kn_dataset *ds = make_arrays(N);
    REQUIRE(ds, "dataset");
    kn_loader_opts o = kn_loader_defaults();
    o.batch_size = 5; o.shuffle = true; o.seed = 99;
    kn_loader *l;
    REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
    for (int e = 0; e < 3; e++) {
        int64_t got[N], m = 0, perm[N];
        kn_batch b;
        for (;;) {
            REQUIRE(kn_loader_next(l, &b) == KN_OK, "%s", kn_last_error());
            if (!b.size) break;
            CHECK(batch_consistent(&b), "batch data does not match its indices");
            for (int64_t j = 0; j < b.size && m < N; j++) got[m++] = b.indices[j];
        }
        CHECK(m == N && is_perm(got, N), "epoch %d covers %lld samples, not a permutation", e, (long long)m);
        kn_shuffle_order(N, 99, e, perm);
        CHECK(memcmp(got, perm, sizeof got) == 0, "epoch %d order differs from kn_shuffle_order", e);
    }
    kn_loader_free(l);
    kn_dataset_free(ds);
}

/* callback dataset with some work per sample, and an optional failing index */
typedef struct cb_ud { int64_t fail_at; int calls; } cb_ud;
static kn_status cb_get(void *ud, int64_t i, void *const dst[]) {
    cb_ud *u = ud;
    u->calls++;
    if (i == u->fail_at) return kn_set_error(KN_ERR_IO, "sample %lld is unreadable (test)", (long long)i);
    double *x = dst[0];
    uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 64; k++) { h ^= h >> 29; h *= 0xBF58476D1CE4E5B9ull; x[k] = (double)(h >> 11) + (double)i; }
    *(int64_t *)dst[1] = i * 7;
    return KN_OK;
}

typedef struct rec { int64_t size, epoch, index; int64_t idx[8]; double x[8 * 64]; int64_t y[8]; } rec;

static int record(kn_dataset *ds, bool prefetch, bool drop, rec *out, int max) {
    kn_loader_opts o = kn_loader_defaults();
    o.batch_size = 8; o.shuffle = true; o.seed = 2024; o.drop_last = drop; o.prefetch = prefetch;
    kn_loader *l;
    if (kn_loader_new(ds, &o, &l)) return -1;
    int n = 0;
    for (; n < max; n++) {
        kn_batch b;
        if (kn_loader_next(l, &b)) { kn_loader_free(l); return -1; }
        memset(&out[n], 0, sizeof out[n]);
        out[n].size = b.size; out[n].epoch = b.epoch; out[n].index = b.index;
        memcpy(out[n].idx, b.indices, (size_t)b.size * sizeof(int64_t));
        memcpy(out[n].x, b.data[0], (size_t)b.size * 64 * sizeof(double));
        memcpy(out[n].y, b.data[1], (size_t)b.size * sizeof(int64_t));
    }
    kn_loader_free(l);
    return n;
}

TEST(prefetch_matches_sync) {
    cb_ud u = {-1, 0};
    kn_data_field f[2] = {{"x", KN_F64, 1, {64}}, {"y", KN_I64, 0, {0}}};
    kn_dataset *ds;
    REQUIRE(kn_dataset_new(103, 2, f, cb_get, &u, NULL, &ds) == KN_OK, "%s", kn_last_error());
    enum { NB = 14 * 3 + 2 };   /* 13 batches + marker per epoch: three epochs and a bit */
    static rec a[NB], b[NB];
    for (int drop = 0; drop < 2; drop++) {
        REQUIRE(record(ds, false, drop, a, NB) == NB, "sync: %s", kn_last_error());
        REQUIRE(record(ds, true, drop, b, NB) == NB, "prefetch: %s", kn_last_error());
        int diff = 0;
        for (int i = 0; i < NB; i++) diff += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
        CHECK(diff == 0, "drop_last %d: %d of %d batches differ between sync and prefetch", drop, diff, NB);
        int ends = 0;
        for (int i = 0; i < NB; i++) ends += a[i].size == 0;
        CHECK(ends == 3, "drop_last %d: %d end markers in 3+ epochs", drop, ends);
        CHECK(a[12].size == (drop ? 0 : 103 - 96), "last batch size %lld", (long long)a[12].size);
    }
    /* seek: both paths resume at the same place (reference: drop_last off) */
    REQUIRE(record(ds, false, false, a, NB) == NB, "sync: %s", kn_last_error());
    for (int pf = 0; pf < 2; pf++) {
        kn_loader_opts o = kn_loader_defaults();
        o.batch_size = 8; o.shuffle = true; o.seed = 2024; o.prefetch = pf;
        kn_loader *l;
        REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
        kn_batch bt;
        kn_loader_next(l, &bt);
        REQUIRE(kn_loader_seek(l, 2, 5) == KN_OK, "%s", kn_last_error());
        REQUIRE(kn_loader_next(l, &bt) == KN_OK, "%s", kn_last_error());
        const rec *r = &a[2 * 14 + 5];    /* drop_last = 0 recording: 14 positions per epoch */
        CHECK(bt.epoch == 2 && bt.index == 5 && bt.size == r->size &&
              memcmp(bt.indices, r->idx, (size_t)r->size * sizeof(int64_t)) == 0, "prefetch %d: seek gives another batch", pf);
        CHECK(kn_loader_seek(l, 0, 99) == KN_ERR_INVALID, "seek past the end accepted");
        kn_loader_free(l);
    }
    /* clean shutdown at any point: create, consume 0..3 batches, free */
    for (int k = 0; k < 40; k++) {
        kn_loader_opts o = kn_loader_defaults();
        o.batch_size = 3; o.prefetch = true; o.shuffle = k & 1;
        kn_loader *l;
        REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
        for (int j = 0; j < k % 4; j++) { kn_batch bt; kn_loader_next(l, &bt); }
        kn_loader_free(l);
    }
    kn_dataset_free(ds);
}

TEST(loader_error_forwarded) {
    cb_ud u = {21, 0};
    kn_data_field f[2] = {{"x", KN_F64, 1, {64}}, {"y", KN_I64, 0, {0}}};
    kn_dataset *ds;
    REQUIRE(kn_dataset_new(40, 2, f, cb_get, &u, NULL, &ds) == KN_OK, "%s", kn_last_error());
    for (int pf = 0; pf < 2; pf++) {
        kn_loader_opts o = kn_loader_defaults();
        o.batch_size = 8; o.prefetch = pf;
        kn_loader *l;
        REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
        kn_batch b;
        CHECK(kn_loader_next(l, &b) == KN_OK && b.size == 8, "batch 0");
        CHECK(kn_loader_next(l, &b) == KN_OK && b.size == 8, "batch 1");
        kn_clear_error();
        kn_status st = kn_loader_next(l, &b);
        CHECK(st == KN_ERR_IO && strstr(kn_last_error(), "sample 21") && strstr(kn_last_error(), "unreadable"),
              "prefetch %d: status %d, message '%s'", pf, st, kn_last_error());
        CHECK(kn_loader_next(l, &b) == KN_OK && b.index == 3 && b.size == 8, "prefetch %d: goes on after an error", pf);
        kn_loader_free(l);
    }
    kn_dataset_free(ds);
}

TEST(batch_write_into_tensor) {
    kn_dataset *ds = make_arrays(6);
    REQUIRE(ds, "dataset");
    kn_loader_opts o = kn_loader_defaults();
    o.batch_size = 4;
    kn_loader *l;
    REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
    kn_ctx *ctx = kn_ctx_new(NULL);
    int64_t sx[2] = {4, 3}, sy[1] = {4};
    kn_tensor *x = kn_input(ctx, KN_F32, 2, sx), *y = kn_input(ctx, KN_F64, 1, sy);
    kn_batch b;
    REQUIRE(kn_loader_next(l, &b) == KN_OK, "%s", kn_last_error());
    CHECK(kn_batch_write(&b, ds, 0, x) == KN_OK, "%s", kn_last_error());
    CHECK(kn_batch_write(&b, ds, 1, y) == KN_OK, "%s", kn_last_error());
    float xv[12]; double yv[4];
    kn_tensor_read(x, xv, KN_F32);
    kn_tensor_read(y, yv, KN_F64);
    for (int i = 0; i < 4; i++) {
        CHECK(xv[3 * i] == i && xv[3 * i + 2] == 3 * i, "x row %d", i);
        CHECK(yv[i] == i + 0.5, "y %d = %g", i, yv[i]);
    }
    REQUIRE(kn_loader_next(l, &b) == KN_OK && b.size == 2, "short batch");
    CHECK(kn_batch_write(&b, ds, 0, x) == KN_ERR_INVALID && strstr(kn_last_error(), "drop_last"), "%s", kn_last_error());
    CHECK(kn_batch_write(&b, ds, 5, x) == KN_ERR_INVALID, "field out of range accepted");
    kn_ctx_free(ctx);
    kn_loader_free(l);
    kn_dataset_free(ds);
}

TEST(token_windows) {
    int32_t t32[101];
    uint16_t t16[101];
    for (int i = 0; i < 101; i++) { t32[i] = 1000 + i; t16[i] = (uint16_t)(1000 + i); }
    for (int w = 0; w < 2; w++) {
        kn_dataset *ds;
        REQUIRE(kn_dataset_tokens(w ? (const void *)t16 : (const void *)t32, w ? 2 : 4, 101, 8, w == 1, &ds) == KN_OK,
                "%s", kn_last_error());
        CHECK(kn_dataset_len(ds) == 12, "len %lld", (long long)kn_dataset_len(ds));
        int32_t x[8], y[8];
        void *dst[2] = {x, y};
        REQUIRE(kn_dataset_get(ds, 11, dst) == KN_OK, "%s", kn_last_error());
        for (int t = 0; t < 8; t++) CHECK(x[t] == 1088 + t && y[t] == 1089 + t, "window 11 t %d: %d %d", t, x[t], y[t]);
        CHECK(kn_dataset_get(ds, 12, dst) == KN_ERR_INVALID, "index 12 accepted");
        kn_dataset_free(ds);
    }
    kn_dataset *ds = NULL;
    CHECK(kn_dataset_tokens(t32, 4, 8, 8, false, &ds) == KN_ERR_INVALID && !ds, "8 tokens for T = 8 accepted");
    CHECK(kn_dataset_tokens(t32, 3, 101, 8, false, &ds) == KN_ERR_INVALID, "token_bytes 3 accepted");
}

/* ---- MNIST -------------------------------------------------------------------------------- */

TEST(mnist_real_files) {
    const char *ti = kn_asset("datasets/mnist/train-images-idx3-ubyte.gz");
    const char *tl = kn_asset("datasets/mnist/train-labels-idx1-ubyte.gz");
    const char *vi = kn_asset("datasets/mnist/t10k-images-idx3-ubyte.gz");
    const char *vl = kn_asset("datasets/mnist/t10k-labels-idx1-ubyte.gz");
    if (!ti || !tl || !vi || !vl) SKIP("datasets/mnist/*.gz missing under KN_ASSETS");
    kn_mnist *tr = NULL, *te = NULL;
    REQUIRE(kn_mnist_load(ti, tl, &tr) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_mnist_load(vi, vl, &te) == KN_OK, "%s", kn_last_error());
    CHECK(tr->n == 60000 && tr->rows == 28 && tr->cols == 28, "train %lld x %lld x %lld", (long long)tr->n,
          (long long)tr->rows, (long long)tr->cols);
    CHECK(te->n == 10000 && te->rows == 28 && te->cols == 28, "test %lld", (long long)te->n);
    CHECK(tr->labels[0] == 5 && tr->labels[1] == 0 && tr->labels[2] == 4, "first train labels %d %d %d",
          tr->labels[0], tr->labels[1], tr->labels[2]);
    CHECK(te->labels[0] == 7 && te->labels[1] == 2, "first test labels %d %d", te->labels[0], te->labels[1]);
    int64_t cnt[10] = {0};
    for (int64_t i = 0; i < tr->n; i++) cnt[tr->labels[i] < 10 ? tr->labels[i] : 0]++;
    /* published class counts of the training set */
    static const int64_t want[10] = {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949};
    for (int k = 0; k < 10; k++) CHECK(cnt[k] == want[k], "class %d: %lld images", k, (long long)cnt[k]);
    int mx = 0;
    for (int i = 0; i < 784; i++) mx = tr->images[i] > mx ? tr->images[i] : mx;
    CHECK(mx == 255 && tr->images[0] == 0, "first image: max %d, corner %d", mx, tr->images[0]);
    /* f32 dataset through a prefetching loader */
    kn_dataset *ds;
    REQUIRE(kn_mnist_dataset(tr, true, &ds) == KN_OK, "%s", kn_last_error());
    kn_loader_opts o = kn_loader_defaults();
    o.batch_size = 64; o.shuffle = true; o.seed = 1; o.prefetch = true;
    kn_loader *l;
    REQUIRE(kn_loader_new(ds, &o, &l) == KN_OK, "%s", kn_last_error());
    CHECK(kn_loader_n_batches(l) == 938, "batches %lld", (long long)kn_loader_n_batches(l));
    kn_batch b;
    REQUIRE(kn_loader_next(l, &b) == KN_OK && b.size == 64, "%s", kn_last_error());
    const float *x = b.data[0];
    const int32_t *y = b.data[1];
    int bad = 0;
    for (int k = 0; k < 64; k++) {
        int64_t i = b.indices[k];
        bad += y[k] != tr->labels[i];
        for (int p = 0; p < 784; p += 37) bad += x[k * 784 + p] != (float)tr->images[i * 784 + p] / 255.0f;
    }
    CHECK(bad == 0, "%d mismatches between the f32 batch and the raw images", bad);
    kn_loader_free(l);
    kn_dataset_free(ds);
    kn_mnist_free(tr);
    kn_mnist_free(te);
}

static size_t idx_header(unsigned char *p, int type, int nd, const uint32_t *dims) {
    p[0] = p[1] = 0; p[2] = (unsigned char)type; p[3] = (unsigned char)nd;
    for (int d = 0; d < nd; d++) { p[4 + 4 * d] = dims[d] >> 24; p[5 + 4 * d] = (dims[d] >> 16) & 255; p[6 + 4 * d] = (dims[d] >> 8) & 255; p[7 + 4 * d] = dims[d] & 255; }
    return 4 + 4 * (size_t)nd;
}

TEST(idx_corrupt_headers) {
    unsigned char img[16 + 2 * 4 * 4], lab[8 + 2];
    uint32_t di[3] = {2, 4, 4}, dl[1] = {2};
    size_t hi = idx_header(img, 8, 3, di), hl = idx_header(lab, 8, 1, dl);
    for (int i = 0; i < 32; i++) img[hi + i] = (unsigned char)(i * 8);
    lab[hl] = 3; lab[hl + 1] = 9;
    char pi[300], pl[300], pg[300];
    snprintf(pi, sizeof pi, "%s", tmp_path("img.idx"));
    snprintf(pl, sizeof pl, "%s", tmp_path("lab.idx.gz"));
    snprintf(pg, sizeof pg, "%s", tmp_path("img.idx.gz"));
    REQUIRE(write_file(pi, img, sizeof img) && write_gz(pl, lab, sizeof lab) && write_gz(pg, img, sizeof img), "tmp files");
    kn_mnist *m = NULL;
    /* valid: plain images + gzip labels */
    REQUIRE(kn_mnist_load(pi, pl, &m) == KN_OK, "%s", kn_last_error());
    CHECK(m->n == 2 && m->rows == 4 && m->labels[1] == 9 && m->images[17] == 136, "tiny file contents");
    kn_mnist_free(m);
    m = NULL;
    typedef struct bad_case { const char *what; unsigned char *buf; size_t n; bool images; const char *msg; bool gz; } bad_case;
    bad_case cases[8];
    int nc = 0;
    static unsigned char bad_magic[sizeof img], trunc_data[sizeof img], trailing[sizeof img + 3], bad_lab[sizeof lab],
        three_labels[8 + 3], short_hdr[6];
    memcpy(bad_magic, img, sizeof img); bad_magic[3] = 2;                       /* 2050 */
    cases[nc++] = (bad_case){"bad magic", bad_magic, sizeof img, true, "magic 2050", false};
    memcpy(trunc_data, img, sizeof img);
    cases[nc++] = (bad_case){"truncated data", trunc_data, sizeof img - 5, true, "truncated", true};
    memcpy(short_hdr, img, 6);
    cases[nc++] = (bad_case){"truncated header", short_hdr, 6, true, "truncated header", false};
    memcpy(trailing, img, sizeof img); memset(trailing + sizeof img, 1, 3);
    cases[nc++] = (bad_case){"trailing bytes", trailing, sizeof trailing, true, "do not match", false};
    memcpy(bad_lab, lab, sizeof lab); bad_lab[hl + 1] = 10;
    cases[nc++] = (bad_case){"label 10", bad_lab, sizeof lab, false, "not a digit", true};
    uint32_t d3[1] = {3};
    size_t h3 = idx_header(three_labels, 8, 1, d3);
    three_labels[h3] = three_labels[h3 + 1] = three_labels[h3 + 2] = 1;
    cases[nc++] = (bad_case){"count mismatch", three_labels, sizeof three_labels, false, "2 images", false};
    for (int c = 0; c < nc; c++) {
        char p[300];
        snprintf(p, sizeof p, "%s", tmp_path(cases[c].gz ? "bad.gz" : "bad.idx"));
        REQUIRE(cases[c].gz ? write_gz(p, cases[c].buf, cases[c].n) : write_file(p, cases[c].buf, cases[c].n), "tmp");
        kn_clear_error();
        kn_status st = cases[c].images ? kn_mnist_load(p, pl, &m) : kn_mnist_load(pi, p, &m);
        CHECK(st == KN_ERR_FORMAT && !m && strstr(kn_last_error(), cases[c].msg), "%s: status %d, '%s'", cases[c].what,
              st, kn_last_error());
        kn_mnist_free(m);
        m = NULL;
        remove(p);
    }
    /* images file given as labels: the magic says so */
    CHECK(kn_mnist_load(pi, pi, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "expected 2049"), "%s", kn_last_error());
    /* a gzip stream cut in the middle */
    FILE *f = fopen(pg, "rb");
    unsigned char gzbuf[4096];
    size_t gn = f ? fread(gzbuf, 1, sizeof gzbuf, f) : 0;
    if (f) fclose(f);
    REQUIRE(gn > 20, "gz read back");
    char pc[300];
    snprintf(pc, sizeof pc, "%s", tmp_path("cut.gz"));
    REQUIRE(write_file(pc, gzbuf, gn / 2), "tmp");
    CHECK(kn_mnist_load(pc, pl, &m) == KN_ERR_FORMAT && !m, "cut gzip: '%s'", kn_last_error());
    CHECK(kn_mnist_load(tmp_path("does_not_exist"), pl, &m) == KN_ERR_IO && strstr(kn_last_error(), "cannot open"),
          "missing: '%s'", kn_last_error());
    /* generic idx: i32 big endian */
    unsigned char i32f[8 + 8];
    uint32_t d2[1] = {2};
    size_t h2 = idx_header(i32f, 0x0C, 1, d2);
    unsigned char vals[8] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
    memcpy(i32f + h2, vals, 8);
    REQUIRE(write_file(pc, i32f, sizeof i32f), "tmp");
    kn_dtype dt; int nd; int64_t sh[8]; void *data = NULL;
    REQUIRE(kn_idx_read(pc, 0, &dt, &nd, sh, &data) == KN_OK, "%s", kn_last_error());
    CHECK(dt == KN_I32 && nd == 1 && sh[0] == 2 && ((int32_t *)data)[0] == 258 && ((int32_t *)data)[1] == -2, "i32 idx");
    free(data);
    remove(pi); remove(pl); remove(pg); remove(pc);
}

/* ---- text -------------------------------------------------------------------------------------- */

TEST(char_vocab_tinyshakespeare) {
    const char *p = kn_asset("datasets/tinyshakespeare/input.txt");
    if (!p) SKIP("datasets/tinyshakespeare/input.txt missing under KN_ASSETS");
    char *text; size_t len;
    REQUIRE(kn_text_read(p, &text, &len) == KN_OK, "%s", kn_last_error());
    CHECK(len == 1115394, "%zu bytes", len);
    for (int bl = 0; bl < 2; bl++) {
        kn_char_vocab *v;
        REQUIRE(kn_char_vocab_build(text, len, bl, &v) == KN_OK, "%s", kn_last_error());
        CHECK(kn_char_vocab_size(v) == 65, "byte_level %d: vocab %d", bl, kn_char_vocab_size(v));
        CHECK(kn_char_vocab_char(v, 0) == '\n' && kn_char_vocab_char(v, 1) == ' ' && kn_char_vocab_char(v, 64) == 'z',
              "sorted order");
        int32_t *ids = malloc(len * sizeof *ids);
        int64_t n;
        REQUIRE(kn_char_encode(v, text, len, ids, &n) == KN_OK, "%s", kn_last_error());
        CHECK(n == (int64_t)len, "%lld ids", (long long)n);
        /* "First" -> F=18 i=47 r=56 s=57 t=58 in the sorted 65-char vocab */
        CHECK(ids[0] == 18 && ids[1] == 47 && ids[2] == 56 && ids[3] == 57 && ids[4] == 58, "First -> %d %d %d %d %d",
              ids[0], ids[1], ids[2], ids[3], ids[4]);
        char *back = malloc(len);
        size_t bn;
        CHECK(kn_char_decode(v, ids, n, back, len, &bn) == KN_OK && bn == len && memcmp(back, text, len) == 0,
              "decode(encode(text)) != text");
        CHECK(kn_char_decode(v, ids, n, back, 10, &bn) == KN_ERR_LIMIT && bn == len, "small buffer");
        CHECK(kn_char_encode(v, "Zoo~", 4, ids, &n) == KN_ERR_INVALID && strstr(kn_last_error(), "not in the vocabulary"),
              "'~' is not in tinyshakespeare: %s", kn_last_error());
        free(back); free(ids);
        kn_char_vocab_free(v);
    }
    free(text);
}

TEST(char_vocab_utf8) {
    const char *s = "h\xC3\xA9llo w\xC3\xB6rld \xF0\x9F\x98\x80 \xE2\x82\xAC\xC3\xA9";  /* héllo wörld 😀 €é */
    size_t len = strlen(s);
    kn_char_vocab *v, *vb;
    REQUIRE(kn_char_vocab_build(s, len, false, &v) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_char_vocab_build(s, len, true, &vb) == KN_OK, "%s", kn_last_error());
    /* chars: ' ' d h l o r w é ö € 😀 = 11 */
    CHECK(kn_char_vocab_size(v) == 11, "char vocab %d", kn_char_vocab_size(v));
    CHECK(kn_char_vocab_char(v, 10) == 0x1F600 && kn_char_vocab_char(v, 9) == 0x20AC && kn_char_vocab_char(v, 0) == ' ',
          "code point order");
    int32_t ids[64]; int64_t n; char out[64]; size_t on;
    REQUIRE(kn_char_encode(v, s, len, ids, &n) == KN_OK, "%s", kn_last_error());
    CHECK(n == 16, "%lld chars", (long long)n);
    CHECK(kn_char_decode(v, ids, n, out, sizeof out, &on) == KN_OK && on == len && memcmp(out, s, len) == 0, "round trip");
    REQUIRE(kn_char_encode(vb, s, len, ids, &n) == KN_OK && n == (int64_t)len, "byte level ids");
    CHECK(kn_char_decode(vb, ids, n, out, sizeof out, &on) == KN_OK && on == len && memcmp(out, s, len) == 0, "bytes round trip");
    kn_char_vocab *bad = NULL;
    CHECK(kn_char_vocab_build("a\xC3", 2, false, &bad) == KN_ERR_INVALID && !bad && strstr(kn_last_error(), "byte 1"),
          "invalid UTF-8: %s", kn_last_error());
    kn_char_vocab_free(v);
    kn_char_vocab_free(vb);
}

/* ---- shards ------------------------------------------------------------------------------------- */

TEST(shard_round_trip_and_header) {
    enum { N = 5000 };
    static int32_t t[N];
    kn_test_seed(3);
    for (int i = 0; i < N; i++) t[i] = (int32_t)(kn_test_u64() % 65536);
    t[0] = 0; t[1] = 65535;
    char p[300];
    snprintf(p, sizeof p, "%s", tmp_path("shard.bin"));
    REQUIRE(kn_shard_write(p, t, N) == KN_OK, "%s", kn_last_error());
    FILE *f = fopen(p, "rb");
    REQUIRE(f, "open");
    static unsigned char raw[1024 + 2 * N + 16];
    size_t rn = fread(raw, 1, sizeof raw, f);
    fclose(f);
    int32_t h[3];
    memcpy(h, raw, sizeof h);
    CHECK(rn == 1024 + 2 * N && h[0] == 20240520 && h[1] == 1 && h[2] == N, "size %zu header %d %d %d", rn, h[0], h[1], h[2]);
    int zero = 1;
    for (int i = 12; i < 1024; i++) zero &= raw[i] == 0;
    CHECK(zero, "header ints 3..255 are not zero");
    uint16_t first;
    memcpy(&first, raw + 1024 + 2, 2);
    CHECK(first == 65535, "token 1 on disk %u", first);
    uint16_t *back; int64_t n;
    REQUIRE(kn_shard_read(p, &back, &n) == KN_OK, "%s", kn_last_error());
    int bad = n != N;
    for (int i = 0; i < N && !bad; i++) bad += back[i] != t[i];
    CHECK(!bad, "round trip differs");
    free(back);
    /* corruptions, on the memory reader and the file reader */
    struct { const char *what; int off; int32_t val; size_t len; const char *msg; } cs[] = {
        {"magic", 0, 20240521, 1024 + 2 * N, "magic 20240521"},
        {"llama3 magic", 0, 20240801, 1024 + 2 * N, "Llama 3"},
        {"version", 4, 2, 1024 + 2 * N, "version 2"},
        {"count", 8, N + 1, 1024 + 2 * N, "truncated"},
        {"truncated", 8, N, 1024 + 2 * N - 7, "truncated"},
        {"short header", 8, N, 1000, "shorter than"},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        static unsigned char m[1024 + 2 * N];
        memcpy(m, raw, sizeof m);
        memcpy(m + cs[c].off, &cs[c].val, 4);
        uint16_t *tk = NULL;
        CHECK(kn_shard_read_memory(m, cs[c].len, &tk, &n) == KN_ERR_FORMAT && !tk && strstr(kn_last_error(), cs[c].msg),
              "memory %s: '%s'", cs[c].what, kn_last_error());
        REQUIRE(write_file(p, m, cs[c].len), "tmp");
        CHECK(kn_shard_read(p, &tk, &n) == KN_ERR_FORMAT && !tk && strstr(kn_last_error(), cs[c].msg), "file %s: '%s'",
              cs[c].what, kn_last_error());
    }
    int32_t big[2] = {5, 70000};
    CHECK(kn_shard_write(p, big, 2) == KN_ERR_INVALID && strstr(kn_last_error(), "70000"), "%s", kn_last_error());
    remove(p);
}

static kn_tokenizer *gpt2_tok(void) {
    const char *p = kn_asset("gguf/ggml-vocab-gpt-2.gguf");
    if (!p) return NULL;
    kn_gguf *g;
    if (kn_gguf_open(p, &g)) return NULL;
    kn_tokenizer *tok = NULL;
    kn_tokenizer_from_gguf(g, &tok);
    kn_gguf_close(g);
    return tok;
}

TEST(gpt2_documents) {
    kn_tokenizer *tok = gpt2_tok();
    if (!tok) SKIP("gguf/ggml-vocab-gpt-2.gguf missing under KN_ASSETS (or unreadable: %s)", kn_last_error());
    int32_t ids[16]; int n;
    REQUIRE(kn_tokenize(tok, "Hello world", 11, false, false, ids, 16, &n) == KN_OK, "%s", kn_last_error());
    CHECK(n == 2 && ids[0] == 15496 && ids[1] == 995, "Hello world -> %d ids (%d %d)", n, ids[0], ids[1]);
    const char *txt = "Hello world\n<|endoftext|>\n  Hello world \n<|endoftext|>\n\n<|endoftext|>";
    int32_t *d; int64_t dn;
    REQUIRE(kn_tokenize_documents(tok, txt, strlen(txt), "<|endoftext|>", 50256, &d, &dn) == KN_OK, "%s", kn_last_error());
    int32_t want[6] = {50256, 15496, 995, 50256, 15496, 995};
    CHECK(dn == 6 && memcmp(d, want, sizeof want) == 0, "documents -> %lld ids", (long long)dn);
    free(d);
    CHECK(kn_tokenize_documents(tok, txt, 5, NULL, 60000, &d, &dn) == KN_ERR_INVALID, "eot 60000 accepted");
    kn_tokenizer_free(tok);
}

TEST(tinystories_to_shards) {
    kn_tokenizer *tok = gpt2_tok();
    if (!tok) SKIP("gguf/ggml-vocab-gpt-2.gguf missing under KN_ASSETS");
    const char *p = kn_asset("datasets/tinystories/TinyStories-train.first2MiB.txt");
    if (!p) { kn_tokenizer_free(tok); SKIP("datasets/tinystories/TinyStories-train.first2MiB.txt missing under KN_ASSETS"); }
    char *text; size_t len;
    REQUIRE(kn_text_read(p, &text, &len) == KN_OK, "%s", kn_last_error());
    /* a slice of whole stories: up to the separator after 48 KiB */
    const char *cut = strstr(text + 48 * 1024, "<|endoftext|>");
    REQUIRE(cut, "no separator after 48 KiB");
    size_t slen = (size_t)(cut - text) + 13;
    int seps = 0;
    for (const char *q = text; (q = strstr(q, "<|endoftext|>")) && q < text + slen; q += 13) seps++;
    char sp[300], pre[300];
    snprintf(sp, sizeof sp, "%s", tmp_path("stories.txt"));
    snprintf(pre, sizeof pre, "%s", tmp_path("ts"));
    REQUIRE(write_file(sp, text, slen), "tmp");
    int ns = 0; int64_t nt = 0;
    REQUIRE(kn_tokenize_file_to_shards(tok, sp, "<|endoftext|>", 50256, pre, 4096, &ns, &nt) == KN_OK, "%s", kn_last_error());
    CHECK(nt > 8000 && nt < 16000 && ns == (int)((nt + 4095) / 4096), "%lld tokens in %d shards", (long long)nt, ns);
    int32_t *all = malloc((size_t)nt * sizeof *all);
    int64_t m = 0, eots = 0;
    for (int k = 0; k < ns; k++) {
        char sh[320];
        snprintf(sh, sizeof sh, "%s_%06d.bin", pre, k);
        uint16_t *t; int64_t n;
        REQUIRE(kn_shard_read(sh, &t, &n) == KN_OK, "%s", kn_last_error());
        CHECK(n == (k < ns - 1 ? 4096 : nt - 4096 * (ns - 1)), "shard %d has %lld tokens", k, (long long)n);
        for (int64_t i = 0; i < n && m < nt; i++) { all[m++] = t[i]; eots += t[i] == 50256; }
        free(t);
        remove(sh);
    }
    CHECK(m == nt && all[0] == 50256, "tokens read back %lld, first %d", (long long)m, all[0]);
    CHECK(eots == seps, "%lld documents, %d separators (every story ends with one)", (long long)eots, seps);
    /* "One day, a little girl named Lily found a needle in her room." */
    static const int32_t head[] = {3198, 1110, 11, 257, 1310, 2576, 3706, 20037, 1043, 257, 17598, 287, 607, 2119, 13};
    CHECK(memcmp(all + 1, head, sizeof head) == 0, "first story starts %d %d %d %d", all[1], all[2], all[3], all[4]);
    /* decoding the first document gives the first story back */
    int64_t e1 = 1;
    while (e1 < nt && all[e1] != 50256) e1++;
    size_t need = 0;
    char *dec = malloc(64 * 1024);
    REQUIRE(kn_detokenize(tok, all + 1, (int)(e1 - 1), 0, dec, 64 * 1024, &need) == KN_OK, "%s", kn_last_error());
    const char *end1 = strstr(text, "<|endoftext|>");
    size_t l1 = (size_t)(end1 - text);
    while (l1 && (text[l1 - 1] == '\n' || text[l1 - 1] == ' ')) l1--;
    CHECK(need == l1 && memcmp(dec, text, l1) == 0, "first story decodes to %zu bytes, want %zu", need, l1);
    free(dec); free(all); free(text);
    remove(sp);
    kn_tokenizer_free(tok);
}

KN_TEST_MAIN()
