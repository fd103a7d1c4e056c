/* test_paged_attn.c: paged attention (KN_OP_PAGED_ATTN) on random data.
 *
 * Each case scatters the K/V rows of a few ragged sequences over randomly
 * chosen pool blocks, picks query rows that mix prefill chunks (several
 * consecutive positions of one sequence) and decode rows (a sequence's last
 * position), in shuffled order, and checks every backend against an oracle
 * written here (keys gathered by position, softmax in double): the reference
 * kernel, and the CPU fast path on each SIMD path the machine has (a small
 * backend counts that the fast path really ran). Unused block-table entries
 * hold -1, so a kernel that reads past a row's last block fails.
 * Tolerances: the reference computes in double and stores f32 (1e-7); the fast path in
 * f32 with an online softmax (2e-5 relative, the sdpa kernels' bound).
 */
#include "kn_test.h"
#include "kiln.h"
#include "backends/backend_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/vec.h"
#include "core/cpu.h"
#include "core/fp16.h"

static int g_hits;
static kn_status fast_compute(kn_backend *be, const kn_exec *e) {
    if (kn_cpu_fast(e)) { if (e->node->op == KN_OP_PAGED_ATTN) g_hits++; return KN_OK; }
    return kn__ref_compute(be, e);
}
static kn_backend g_fast = {
    .version = KN_BACKEND_VERSION, .name = "cpu_paged", .device = KN_DEVICE_HOST,
    .alloc = kn__host_alloc, .free = kn__host_free, .copy_in = kn__host_copy, .copy_out = kn__host_copy,
    .compute = fast_compute,
};

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng; }
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1); }

typedef struct { int H, Hkv, D, bs, n_seq, f16, window, q_heads_first; } pcase;

typedef struct {
    int T, P, MB;
    float *q, *k, *v;            /* q [T, H, D]; pools [Hkv, P, D] as f32 values (f16-rounded when f16) */
    uint16_t *kh, *vh;           /* f16 pools */
    int32_t *bt, *rs, *rp;
} pdata;

static void make(const pcase *c, pdata *d) {
    int len[8], MB = 0, nblk = 0;
    for (int s = 0; s < c->n_seq; s++) {
        len[s] = 1 + (int)(rnd() % 70);
        int nb = (len[s] + c->bs - 1) / c->bs;
        if (nb > MB) MB = nb;
        nblk += nb;
    }
    int n_pool_blocks = nblk + 3;                      /* some blocks nobody uses */
    d->P = n_pool_blocks * c->bs; d->MB = MB + 1;       /* one spare column: -1 */
    int *perm = malloc(sizeof(int) * (size_t)n_pool_blocks);
    for (int i = 0; i < n_pool_blocks; i++) perm[i] = i;
    for (int i = n_pool_blocks - 1; i > 0; i--) { int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    d->bt = malloc(sizeof(int32_t) * (size_t)(c->n_seq * d->MB));
    int at = 0;
    for (int s = 0; s < c->n_seq; s++)
        for (int b = 0; b < d->MB; b++) d->bt[s * d->MB + b] = b * c->bs < len[s] ? perm[at++] : -1;
    free(perm);
    /* rows: per sequence a decode row (its last position) or a chunk ending there */
    int rows[512][2], T = 0;
    for (int s = 0; s < c->n_seq; s++) {
        int n = rnd() % 2 ? 1 : 1 + (int)(rnd() % (uint64_t)len[s]);
        for (int i = len[s] - n; i < len[s]; i++) { rows[T][0] = s; rows[T][1] = i; T++; }
    }
    for (int i = T - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), a = rows[i][0], b = rows[i][1];
        rows[i][0] = rows[j][0]; rows[i][1] = rows[j][1]; rows[j][0] = a; rows[j][1] = b;
    }
    d->T = T;
    d->rs = malloc(sizeof(int32_t) * (size_t)T); d->rp = malloc(sizeof(int32_t) * (size_t)T);
    for (int i = 0; i < T; i++) { d->rs[i] = rows[i][0]; d->rp[i] = rows[i][1]; }
    size_t nq = (size_t)T * c->H * c->D, nk = (size_t)c->Hkv * d->P * c->D;
    d->q = malloc(sizeof(float) * nq); d->k = malloc(sizeof(float) * nk); d->v = malloc(sizeof(float) * nk);
    d->kh = malloc(sizeof(uint16_t) * nk); d->vh = malloc(sizeof(uint16_t) * nk);
    for (size_t i = 0; i < nq; i++) d->q[i] = frand() * 2;
    for (size_t i = 0; i < nk; i++) {
        d->k[i] = frand(); d->v[i] = frand();
        d->kh[i] = kn_fp32_to_fp16(d->k[i]); d->vh[i] = kn_fp32_to_fp16(d->v[i]);
        if (c->f16) { d->k[i] = kn_fp16_to_fp32(d->kh[i]); d->v[i] = kn_fp16_to_fp32(d->vh[i]); }
    }
}
static void drop(pdata *d) { free(d->q); free(d->k); free(d->v); free(d->kh); free(d->vh); free(d->bt); free(d->rs); free(d->rp); }

/* the oracle: keys gathered by position, softmax in double */
static void oracle(const pcase *c, const pdata *d, double *y) {
    int H = c->H, D = c->D, G = c->H / c->Hkv, bs = c->bs;
    double *s = malloc(sizeof(double) * 4096);
    for (int i = 0; i < d->T; i++) {
        int seq = d->rs[i], pos = d->rp[i], j0 = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
        for (int h = 0; h < H; h++) {
            const float *qr = d->q + ((size_t)i * H + h) * D;
            double m = -INFINITY, sum = 0;
            for (int j = j0; j <= pos; j++) {
                int slot = d->bt[seq * d->MB + j / bs] * bs + j % bs;
                const float *kr = d->k + ((size_t)(h / G) * d->P + slot) * D;
                double dot = 0;
                for (int e = 0; e < D; e++) dot += (double)qr[e] * kr[e];
                s[j] = dot / sqrt((double)D);
                if (s[j] > m) m = s[j];
            }
            for (int j = j0; j <= pos; j++) { s[j] = exp(s[j] - m); sum += s[j]; }
            for (int e = 0; e < D; e++) {
                double acc = 0;
                for (int j = j0; j <= pos; j++) {
                    int slot = d->bt[seq * d->MB + j / bs] * bs + j % bs;
                    acc += s[j] * d->v[((size_t)(h / G) * d->P + slot) * D + e];
                }
                y[((size_t)i * H + h) * D + e] = acc / sum;
            }
        }
    }
    free(s);
}

/* runs the op on backend be; y [T, H, D] as double. q_heads_first: q is a
 * permuted view of an [H, T, D] tensor (the model's layout after rope). */
static kn_status run(kn_backend *be, const pcase *c, const pdata *d, double *y) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    int64_t T = d->T, H = c->H, D = c->D;
    kn_tensor *q;
    if (c->q_heads_first) {
        float *qt = malloc(sizeof(float) * (size_t)(T * H * D));
        for (int64_t i = 0; i < T; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t e = 0; e < D; e++) qt[(h * T + i) * D + e] = d->q[(i * H + h) * D + e];
        q = kn_permute(ctx, kn_from_data(ctx, KN_F32, 3, (int64_t[]){H, T, D}, qt), (int[]){1, 0, 2});
        free(qt);
    } else q = kn_from_data(ctx, KN_F32, 3, (int64_t[]){T, H, D}, d->q);
    int64_t ps[3] = {c->Hkv, d->P, D};
    kn_tensor *kp = c->f16 ? kn_from_data(ctx, KN_F16, 3, ps, d->kh) : kn_from_data(ctx, KN_F32, 3, ps, d->k);
    kn_tensor *vp = c->f16 ? kn_from_data(ctx, KN_F16, 3, ps, d->vh) : kn_from_data(ctx, KN_F32, 3, ps, d->v);
    kn_tensor *bt = kn_from_data(ctx, KN_I32, 2, (int64_t[]){c->n_seq, d->MB}, d->bt);
    kn_tensor *rs = kn_from_data(ctx, KN_I32, 1, &T, d->rs), *rp = kn_from_data(ctx, KN_I32, 1, &T, d->rp);
    kn_tensor *o = kn_paged_attn(ctx, q, kp, vp, bt, rs, rp, c->bs, c->window, 0);
    kn_status st = o ? kn_tensor_read(o, y, KN_F64) : kn_ctx_status(ctx);
    kn_ctx_free(ctx);
    return st;
}

static const pcase k_cases[] = {
    {4, 4, 64, 16, 3, 0, 0, 0},     /* MHA */
    {6, 2, 64, 16, 4, 0, 0, 1},     /* GQA 3:1, q a permuted view */
    {9, 3, 80, 32, 3, 0, 0, 0},     /* head dim 80 */
    {4, 1, 37, 1, 3, 0, 0, 1},      /* odd head dim, block size 1, MQA */
    {8, 2, 64, 16, 5, 1, 0, 0},     /* f16 pools */
    {4, 2, 17, 32, 4, 1, 0, 1},     /* f16, odd dim */
    {6, 3, 64, 16, 3, 0, 7, 0},     /* sliding window 7 */
    {4, 4, 24, 16, 2, 1, 20, 1},    /* window over block edges, f16 */
};

static const int k_isas[] = {KN_ISA_SCALAR, KN_ISA_AVX2, KN_ISA_AVX512};
static void force_isa(int isa) { kn_vec_force_isa(isa); kn_cpu_attention_force_isa(isa); kn_sgemm_force_isa(isa); }

TEST(paged_attn_matches_oracle) {
    for (size_t ci = 0; ci < sizeof k_cases / sizeof k_cases[0]; ci++) {
        const pcase *c = &k_cases[ci];
        for (int rep = 0; rep < 3; rep++) {
            pdata d;
            make(c, &d);
            size_t n = (size_t)d.T * c->H * c->D;
            double *want = malloc(sizeof(double) * n), *got = malloc(sizeof(double) * n);
            oracle(c, &d, want);
            kn_status st = run(kn_backend_ref(), c, &d, got);
            CHECK(st == KN_OK && kn_rel_err(got, want, (long)n) < 1e-7, "case %zu rep %d: reference st %d err %.3g (%s)",
                  ci, rep, st, st ? INFINITY : kn_rel_err(got, want, (long)n), st ? kn_last_error() : "");
            for (int ii = 0; ii <= (int)kn_cpu()->isa; ii++) {
                force_isa(k_isas[ii]);
                g_hits = 0;
                st = run(&g_fast, c, &d, got);
                double err = st ? INFINITY : kn_rel_err(got, want, (long)n);
                CHECK(st == KN_OK && err < 2e-5 && g_hits == 1, "case %zu rep %d isa %d: fast path st %d err %.3g hits %d",
                      ci, rep, k_isas[ii], st, err, g_hits);
            }
            force_isa(-1);
            st = run(kn_backend_cpu(), c, &d, got);
            CHECK(st == KN_OK && kn_rel_err(got, want, (long)n) < 2e-5, "case %zu: cpu backend", ci);
            free(want); free(got);
            drop(&d);
        }
    }
}

TEST(paged_attn_bad_indices_are_errors) {
    pcase c = {4, 2, 16, 16, 2, 0, 0, 0};
    pdata d;
    make(&c, &d);
    double *y = malloc(sizeof(double) * (size_t)d.T * c.H * c.D);
    kn_backend *bes[2] = {kn_backend_ref(), &g_fast};
    for (int b = 0; b < 2; b++) {
        int32_t s0 = d.rs[0];
        d.rs[0] = c.n_seq;                                  /* no such sequence */
        CHECK(run(bes[b], &c, &d, y) == KN_ERR_INVALID && strstr(kn_last_error(), "paged_attn"), "backend %d: bad sequence: %s", b, kn_last_error());
        d.rs[0] = s0;
        int32_t p0 = d.rp[0];
        d.rp[0] = d.MB * c.bs;                              /* past the table */
        CHECK(run(bes[b], &c, &d, y) == KN_ERR_INVALID, "backend %d: bad position", b);
        d.rp[0] = p0;
        int32_t b0 = d.bt[d.rs[0] * d.MB];
        d.bt[d.rs[0] * d.MB] = d.P / c.bs;                  /* a block past the pool */
        CHECK(run(bes[b], &c, &d, y) == KN_ERR_INVALID && strstr(kn_last_error(), "block"), "backend %d: bad block: %s", b, kn_last_error());
        d.bt[d.rs[0] * d.MB] = b0;
        CHECK(run(bes[b], &c, &d, y) == KN_OK, "backend %d: restored case runs", b);
    }
    free(y);
    drop(&d);
}

TEST(paged_attn_shape_errors) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_tensor *q = kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 3, 8}), *kp = kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 32, 8});
    kn_tensor *bt = kn_zeros(ctx, KN_I32, 2, (int64_t[]){1, 2}), *r = kn_zeros(ctx, KN_I32, 1, (int64_t[]){2});
    CHECK(!kn_paged_attn(ctx, q, kp, kp, bt, r, r, 16, 0, 0) && strstr(kn_last_error(), "multiple"), "3 heads over 2: %s", kn_last_error());
    kn_ctx_free(ctx);
    ctx = kn_ctx_new(NULL);
    q = kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 4, 8}); kp = kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 32, 8});
    bt = kn_zeros(ctx, KN_I32, 2, (int64_t[]){1, 2}); r = kn_zeros(ctx, KN_I32, 1, (int64_t[]){2});
    CHECK(!kn_paged_attn(ctx, q, kp, kp, bt, r, r, 12, 0, 0) && strstr(kn_last_error(), "block_size"), "12 does not divide 32");
    kn_ctx_free(ctx);
    /* inference only: backward refuses it by name */
    ctx = kn_ctx_new(NULL);
    q = kn_param(ctx, KN_F32, 3, (int64_t[]){2, 4, 8}); kp = kn_zeros(ctx, KN_F32, 3, (int64_t[]){2, 32, 8});
    bt = kn_zeros(ctx, KN_I32, 2, (int64_t[]){1, 2}); r = kn_zeros(ctx, KN_I32, 1, (int64_t[]){2});
    kn_tensor *y = kn_paged_attn(ctx, q, kp, kp, bt, r, r, 16, 0, 0);
    REQUIRE(y, "%s", kn_last_error());
    CHECK(kn_backward(ctx, kn_sum(ctx, y, 0, NULL, false)) == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "paged_attn"),
          "backward: %s", kn_last_error());
    kn_ctx_free(ctx);
}

#ifdef KN_CUDA
#include "kiln_cuda.h"
/* the CUDA kernel (scripts/cuda_test.sh on a GPU machine): f32 math */
TEST(paged_attn_cuda) {
    kn_backend *g = kn_backend_cuda();
    if (!g) SKIP("no GPU: %s", kn_last_error());
    for (size_t ci = 0; ci < sizeof k_cases / sizeof k_cases[0]; ci++) {
        const pcase *c = &k_cases[ci];
        for (int rep = 0; rep < 3; rep++) {
            pdata d;
            make(c, &d);
            size_t n = (size_t)d.T * c->H * c->D;
            double *want = malloc(sizeof(double) * n), *got = malloc(sizeof(double) * n);
            oracle(c, &d, want);
            kn_status st = run(g, c, &d, got);
            double err = st ? INFINITY : kn_rel_err(got, want, (long)n);
            CHECK(st == KN_OK && err < 2e-5, "case %zu rep %d: cuda st %d err %.3g (%s)", ci, rep, st, err, st ? kn_last_error() : "");
            free(want); free(got);
            drop(&d);
        }
    }
}
#else
TEST(paged_attn_cuda) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#endif

int main(void) { return kn_test_main(); }
