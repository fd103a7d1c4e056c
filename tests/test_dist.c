/* test_dist.c: the communicator of kiln_dist.h with real ranks: each test
 * forks one process per rank, which meet over TCP on a free local port.
 * Host collectives against values computed by hand, the graph ops
 * (all_reduce on a strided view, all_gather, reduce_scatter, broadcast) on
 * the CPU backend, every failure the header promises (another value on one
 * rank, collectives out of order, a rank that dies, a rank that stops
 * calling, a bad rendezvous), and data-parallel training: two ranks with half
 * a batch each against one process with the whole batch, and one rank with
 * the communicator against none (the same bits). */
#define _POSIX_C_SOURCE 200809L
#include "kn_test.h"
#include "kiln.h"
#include "kiln_dist.h"
#include "kiln_nn.h"
#include "kiln_llm.h"
#include "kiln_train.h"
#include "kiln_backend.h"
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

typedef int (*rank_fn)(kn_dist *d, int rank, int world, void *arg);

/* Runs fn on `world` forked ranks; status[r] is rank r's exit code (0 = its checks passed). */
static void spawn(int world, double timeout, rank_fn fn, void *arg, int *status) {
    int port = free_port();
    pid_t pid[8];
    for (int r = 0; r < world; r++) {
        fflush(NULL);
        pid[r] = fork();
        if (pid[r] == 0) {
            char lr[16];
            snprintf(lr, sizeof lr, "%d", r);
            setenv("LOCAL_RANK", lr, 1);     /* a device backend: rank r on GPU r */
            kn_dist *d = NULL;
            if (kn_dist_init(r, world, r, "127.0.0.1", port, timeout, &d)) {
                fprintf(stderr, "  rank %d: init: %s\n", r, kn_last_error());
                _exit(90);
            }
            int rc = fn(d, r, world, arg);
            kn_dist_free(d);
            _exit(rc);
        }
    }
    for (int r = 0; r < world; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
}

/* spawn, then every rank must have exited 0 (its checks passed) */
#define SPAWN_OK(world, timeout, fn, arg, what)                                                     \
    do {                                                                                            \
        int st_[8];                                                                                 \
        spawn(world, timeout, fn, arg, st_);                                                        \
        for (int r_ = 0; r_ < (world); r_++) CHECK(st_[r_] == 0, "%s: rank %d exited %d", what, r_, st_[r_]); \
    } while (0)

#define RCHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "  rank %d: FAIL %s: ", rank, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

/* ---- host collectives ---------------------------------------------------------------- */

static int host_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    RCHECK(kn_dist_rank(d) == rank && kn_dist_world(d) == world, "rank/world");
    float f[3] = {(float)rank, 1.5f, -(float)rank * 0.25f};
    RCHECK(!kn_dist_all_reduce_host(d, KN_F32, f, 3, KN_DIST_SUM), "%s", kn_last_error());
    double s = world * (world - 1) / 2.0;
    RCHECK(f[0] == (float)s && f[1] == 1.5f * world && f[2] == (float)(-0.25 * s), "sum %g %g %g", f[0], f[1], f[2]);
    double a[2] = {(double)rank, 10};
    RCHECK(!kn_dist_all_reduce_host(d, KN_F64, a, 2, KN_DIST_AVG), "%s", kn_last_error());
    RCHECK(a[0] == s / world && a[1] == 10, "avg %g %g", a[0], a[1]);
    int64_t big[2] = {((int64_t)1 << 40) + rank, -rank};
    RCHECK(!kn_dist_all_reduce_host(d, KN_I64, big, 2, KN_DIST_MAX), "%s", kn_last_error());
    RCHECK(big[0] == ((int64_t)1 << 40) + world - 1 && big[1] == 0, "max %lld %lld", (long long)big[0], (long long)big[1]);
    uint16_t bf[1];
    float one = (float)(rank + 1);
    memcpy(bf, (char *)&one + 2, 2);                          /* bf16 of small integers: the top half */
    RCHECK(!kn_dist_all_reduce_host(d, KN_BF16, bf, 1, KN_DIST_MIN), "%s", kn_last_error());
    uint32_t u = (uint32_t)bf[0] << 16;
    float got;
    memcpy(&got, &u, 4);
    RCHECK(got == 1.0f, "bf16 min %g", got);
    char msg[32];
    snprintf(msg, sizeof msg, "from %d", rank);
    RCHECK(!kn_dist_broadcast_host(d, msg, sizeof msg, world - 1), "%s", kn_last_error());
    char want[32];
    snprintf(want, sizeof want, "from %d", world - 1);
    RCHECK(!strcmp(msg, want), "broadcast '%s'", msg);
    int32_t mine[2] = {rank, rank * rank}, all[16];
    RCHECK(!kn_dist_all_gather_host(d, mine, sizeof mine, all), "%s", kn_last_error());
    for (int r = 0; r < world; r++) RCHECK(all[2 * r] == r && all[2 * r + 1] == r * r, "gather %d", r);
    RCHECK(!kn_dist_barrier(d), "%s", kn_last_error());
    RCHECK(!kn_dist_check_same(d, "model", "gpt2 2x64"), "%s", kn_last_error());
    return 0;
}

TEST(host_collectives_three_ranks) {
    SPAWN_OK(3, 30, host_ranks, NULL, "host_ranks");
}

/* ---- failures ---------------------------------------------------------------------------- */

static int mismatch_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    kn_status s = kn_dist_check_same(d, "the run", rank == 1 ? "B16" : "B8");
    RCHECK(s != KN_OK, "a differing value passed");
    RCHECK(strstr(kn_last_error(), "rank 1") && strstr(kn_last_error(), "B16") && strstr(kn_last_error(), "B8"),
           "message: %s", kn_last_error());
    return 0;
}

static int order_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    float x = 1;
    kn_status s = rank == 1 ? kn_dist_barrier(d) : kn_dist_all_reduce_host(d, KN_F32, &x, 1, KN_DIST_SUM);
    RCHECK(s != KN_OK, "collectives out of order passed");
    RCHECK(strstr(kn_last_error(), "disagree"), "message: %s", kn_last_error());
    return 0;
}

static int size_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    float x[4] = {0};
    kn_status s = kn_dist_all_reduce_host(d, KN_F32, x, rank == 2 ? 4 : 3, KN_DIST_SUM);
    RCHECK(s != KN_OK, "different sizes passed");
    RCHECK(strstr(kn_last_error(), "rank 2"), "message: %s", kn_last_error());
    return 0;
}

static int dead_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    if (rank == 2) _exit(0);                 /* leaves without a word */
    float x = 1;
    kn_status s = kn_dist_all_reduce_host(d, KN_F32, &x, 1, KN_DIST_SUM);
    RCHECK(s != KN_OK, "a dead rank went unnoticed");
    RCHECK(strstr(kn_last_error(), "rank 2") || strstr(kn_last_error(), "rank 0"), "message: %s", kn_last_error());
    return 0;
}

static int slow_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    if (rank == 1) {
        struct timespec t = {3, 0};
        nanosleep(&t, NULL);
        return 0;                            /* never calls */
    }
    float x = 1;
    kn_status s = kn_dist_all_reduce_host(d, KN_F32, &x, 1, KN_DIST_SUM);
    RCHECK(s != KN_OK, "a stuck rank went unnoticed");
    RCHECK(strstr(kn_last_error(), "waited") && strstr(kn_last_error(), "KN_DIST_TIMEOUT"), "message: %s", kn_last_error());
    return 0;
}

TEST(failures_are_errors_on_every_rank) {
    SPAWN_OK(3, 30, mismatch_ranks, NULL, "check_same");
    SPAWN_OK(3, 30, order_ranks, NULL, "order");
    SPAWN_OK(3, 30, size_ranks, NULL, "size");
    SPAWN_OK(3, 30, dead_ranks, NULL, "dead");
    SPAWN_OK(2, 1, slow_ranks, NULL, "timeout");
}

TEST(rendezvous_errors) {
    kn_dist *d = NULL;
    CHECK(kn_dist_init(2, 2, 0, "127.0.0.1", 29999, 1, &d) != KN_OK && !d, "rank outside the world accepted");
    CHECK(kn_dist_init(0, 2, 0, "127.0.0.1", 70000, 1, &d) != KN_OK, "bad port accepted");
    CHECK(kn_dist_init(0, 2, 0, "no.such.host.invalid", 29999, 1, &d) != KN_OK, "unresolvable address accepted");
    /* a lone rank 1: nobody listens */
    kn_status s = kn_dist_init(1, 2, 1, "127.0.0.1", free_port(), 0.5, &d);
    CHECK(s != KN_OK && strstr(kn_last_error(), "could not reach rank 0"), "lone rank: %s", kn_last_error());
    /* two processes disagreeing on the world size */
    int port = free_port();
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        kn_dist *c = NULL;
        kn_status cs = kn_dist_init(1, 3, 1, "127.0.0.1", port, 5, &c);
        _exit(cs != KN_OK ? 0 : 1);
    }
    s = kn_dist_init(0, 2, 0, "127.0.0.1", port, 5, &d);
    CHECK(s != KN_OK && strstr(kn_last_error(), "WORLD_SIZE"), "world mismatch: %s", kn_last_error());
    int st = 0;
    waitpid(p, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other rank did not fail");
    /* a world of one needs nothing and its collectives leave values as they are */
    REQUIRE(kn_dist_init(0, 1, 0, NULL, 0, 1, &d) == KN_OK, "%s", kn_last_error());
    float x = 2.5f;
    CHECK(!kn_dist_all_reduce_host(d, KN_F32, &x, 1, KN_DIST_AVG) && x == 2.5f, "world 1 avg");
    CHECK(kn_dist_all_reduce_host(d, KN_U8, &x, 1, KN_DIST_SUM) == KN_ERR_UNSUPPORTED, "u8 accepted");
    kn_dist_free(d);
}

/* ---- graph ops on the CPU backend ------------------------------------------------------ */

static int graph_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    kn_ctx_opts co = {kn_backend_cpu()};
    kn_ctx *ctx = kn_ctx_new(&co);
    float xv[12];
    for (int i = 0; i < 12; i++) xv[i] = (float)(i + 100 * rank);
    int64_t s34[2] = {3, 4};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, s34, xv);
    int perm[2] = {1, 0};
    kn_tensor *xt = kn_permute(ctx, x, perm);                              /* [4,3], strided */
    kn_tensor *sum = kn_all_reduce(ctx, xt, d, KN_DIST_SUM);
    kn_tensor *g = kn_all_gather(ctx, kn_slice(ctx, x, 0, 0, 2, 1), d);    /* rows 0..1 of x: [2,4] -> [4,4] */
    kn_tensor *rs = kn_reduce_scatter(ctx, xt, d, KN_DIST_SUM);            /* [4,3] -> [2,3] */
    kn_tensor *bc = kn_broadcast(ctx, x, d, 1);
    RCHECK(sum && g && rs && bc, "%s", kn_last_error());
    kn_tensor *outs[4] = {sum, g, rs, bc};
    kn_plan *p = kn_plan_new(ctx, 4, outs, NULL);
    RCHECK(p && !kn_plan_run(p), "%s", kn_last_error());
    float a[16], b[16], c[6], e[12];
    RCHECK(!kn_tensor_read(sum, a, KN_F32) && !kn_tensor_read(g, b, KN_F32) && !kn_tensor_read(rs, c, KN_F32) &&
           !kn_tensor_read(bc, e, KN_F32), "%s", kn_last_error());
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            double want = 0;
            for (int r = 0; r < world; r++) want += j * 4 + i + 100 * r;
            RCHECK(a[i * 3 + j] == (float)want, "all_reduce [%d,%d] %g vs %g", i, j, a[i * 3 + j], want);
            if (i / 2 == rank) RCHECK(c[(i % 2) * 3 + j] == (float)want, "reduce_scatter [%d,%d]", i, j);
        }
    for (int r = 0; r < world; r++)
        for (int i = 0; i < 8; i++) RCHECK(b[r * 8 + i] == (float)(i + 100 * r), "all_gather %d %d: %g", r, i, b[r * 8 + i]);
    for (int i = 0; i < 12; i++) RCHECK(e[i] == (float)(i + 100), "broadcast %d: %g", i, e[i]);
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return 0;
}

TEST(graph_collectives_cpu) {
    SPAWN_OK(2, 30, graph_ranks, NULL, "graph_ranks");
    kn_ctx_opts co = {kn_backend_cpu()};
    kn_ctx *ctx = kn_ctx_new(&co);
    int64_t s[1] = {4};
    kn_tensor *x = kn_zeros(ctx, KN_F32, 1, s);
    CHECK(!kn_all_reduce(ctx, x, NULL, KN_DIST_SUM), "NULL communicator accepted");
    kn_ctx_free(ctx);
}

/* ---- data-parallel training -------------------------------------------------------------- */

enum { B = 8, IN = 5, HID = 7, OUT = 3, STEPS = 4 };

/* An MLP and its optimizer (AdamW, or g_mlp_kind; clipping on; a loss
 * scaler starting at g_mlp_scale when that is above 0) on rows [row0, row0
 * + nb) of a fixed batch, its step planned, before any step. */
static kn_optim_kind g_mlp_kind = KN_OPTIM_ADAMW;
static double g_mlp_scale;
typedef struct { kn_ctx *ctx; kn_module *net; kn_optim *o; kn_plan *p; kn_loss_scaler *sc; } mlp_run;
static kn_status mlp_new(mlp_run *r, kn_dist *d, bool zero, int row0, int nb) {
    static float xs[B * IN];
    static int64_t ys[B];
    for (int i = 0; i < B * IN; i++) xs[i] = (float)sin(0.7 * i + 0.3);
    for (int i = 0; i < B; i++) ys[i] = (i * 7) % OUT;
    memset(r, 0, sizeof *r);
    r->ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    kn_nn_manual_seed(42);
    r->net = kn_sequential_new(r->ctx, "mlp");
    kn_sequential_add(r->net, kn_linear_new(r->ctx, IN, HID, true));
    kn_sequential_add(r->net, kn_act_new(r->ctx, KN_ACT_TANH));
    kn_sequential_add(r->net, kn_linear_new(r->ctx, HID, OUT, true));
    int64_t sx[2] = {nb, IN}, sy[1] = {nb};
    kn_tensor *x = kn_from_data(r->ctx, KN_F32, 2, sx, xs + row0 * IN), *y = kn_from_data(r->ctx, KN_I64, 1, sy, ys + row0);
    if (g_mlp_scale > 0) x = kn_mul_scalar(r->ctx, x, 64);  /* larger first-layer gradients: the top scale overflows */
    kn_tensor *loss = kn_cross_entropy(r->ctx, kn_module_forward(r->net, x), y, NULL);
    kn_loss_scaler_cfg lc = kn_loss_scaler_defaults();
    lc.init_scale = g_mlp_scale;
    if (g_mlp_scale > 0) r->sc = kn_loss_scaler_new(r->ctx, &lc);
    kn_status st = loss ? kn_backward(r->ctx, r->sc ? kn_loss_scaler_scale(r->sc, loss) : loss) : KN_ERR_INVALID;
    kn_optim_cfg oc = kn_optim_defaults(g_mlp_kind);
    if (g_mlp_kind == KN_OPTIM_SGD) oc.momentum = 0.9;
    oc.lr = 0.05; oc.clip_norm = 0.5;
    if (!st && !(r->o = kn_optim_new(r->ctx, r->net, &oc))) st = KN_ERR_INVALID;
    if (!st && r->sc) st = kn_optim_set_loss_scaler(r->o, r->sc);
    if (!st && d) st = kn_optim_set_dist(r->o, d, 64);      /* small buckets: several of them */
    if (!st && zero) st = kn_optim_set_zero1(r->o, true);
    kn_tensor *outs[64];
    outs[0] = loss;
    int ne = st ? -1 : kn_optim_build(r->o, NULL, outs + 1, 63);
    if (!st && (ne < 0 || !(r->p = kn_plan_new(r->ctx, ne + 1, outs, NULL)))) st = KN_ERR_INVALID;
    return st;
}
static kn_status mlp_steps(mlp_run *r, int n) {
    kn_status st = KN_OK;
    for (int s = 0; s < n && !st; s++) {
        if (!(st = kn_optim_prepare(r->o))) st = kn_plan_run(r->p);
        if (!st && r->sc) st = kn_loss_scaler_update(r->sc, NULL);
    }
    return st;
}
static void mlp_free(mlp_run *r) {
    kn_plan_free(r->p); kn_optim_free(r->o); kn_loss_scaler_free(r->sc); kn_module_free(r->net); kn_ctx_free(r->ctx);
}

/* Trains the MLP for STEPS steps; the parameters after training go into
 * params (flat), the count of moments and momentum buffers this rank keeps
 * into *nstates, the loss scaler's skipped steps into g_mlp_skipped. */
static int64_t g_mlp_skipped;
static kn_status train_mlp_z(kn_dist *d, bool zero, int row0, int nb, float *params, int *np, int *nstates) {
    mlp_run r;
    kn_status st = mlp_new(&r, d, zero, row0, nb);
    if (!st) st = mlp_steps(&r, STEPS);
    g_mlp_skipped = r.sc ? kn_loss_scaler_skipped(r.sc) : 0;
    *np = 0;
    if (nstates) *nstates = 0;
    for (int i = 0; i < kn_optim_n_params(r.o) && !st; i++) {
        kn_tensor *t = kn_optim_param(r.o, i);
        st = kn_tensor_read(t, params + *np, KN_F32);
        *np += (int)kn_numel(t);
        if (nstates) *nstates += (kn_optim_state(r.o, i, "exp_avg") != NULL) + (kn_optim_state(r.o, i, "exp_avg_sq") != NULL) +
                                 (kn_optim_state(r.o, i, "momentum_buffer") != NULL);
    }
    mlp_free(&r);
    return st;
}
static kn_status train_mlp(kn_dist *d, int row0, int nb, float *params, int *np) {
    return train_mlp_z(d, false, row0, nb, params, np, NULL);
}

static int ddp_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    float got[256], want[256];
    int n1, n2;
    RCHECK(!train_mlp(d, rank * (B / world), B / world, got, &n1), "%s", kn_last_error());
    RCHECK(!train_mlp(NULL, 0, B, want, &n2), "%s", kn_last_error());
    RCHECK(n1 == n2 && n1 == IN * HID + HID + HID * OUT + OUT, "parameter counts %d %d", n1, n2);
    double e = 0, m = 0;
    for (int i = 0; i < n1; i++) { e = fmax(e, fabs(got[i] - want[i])); m = fmax(m, fabs(want[i])); }
    RCHECK(e <= 2e-6 * m, "two ranks x %d rows vs one process x %d rows: max diff %g (scale %g)", B / world, B, e, m);
    return 0;
}

TEST(ddp_two_ranks_match_one_process) {
    SPAWN_OK(2, 60, ddp_ranks, NULL, "ddp_ranks");
}

/* ZeRO-1: each rank keeps the Adam moments of its parameters only and the
 * parameters come out with plain data parallelism's bits. The MLP's four,
 * largest first to the least loaded rank: the 5x7 weight (35) to rank 0,
 * then the 7x3 weight (21), the 7 and the 3 biases all to rank 1 (21, 28,
 * 31 against 35). */
static int zero1_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    float got[256], want[256];
    int n1, n2, ns1, ns2;
    RCHECK(!train_mlp_z(d, true, rank * (B / world), B / world, got, &n1, &ns1), "%s", kn_last_error());
    RCHECK(!train_mlp_z(d, false, rank * (B / world), B / world, want, &n2, &ns2), "%s", kn_last_error());
    RCHECK(n1 == n2 && !memcmp(got, want, sizeof(float) * (size_t)n1), "ZeRO-1 and plain data parallel differ");
    RCHECK(ns2 == 8 && ns1 == (rank == 0 ? 2 : 6), "moments kept: %d with ZeRO-1, %d without (want %d and 8)", ns1, ns2,
           rank == 0 ? 2 : 6);
    return 0;
}

/* the same with SGD and momentum: the update built as separate nodes (one
 * state, the momentum buffer: 1 and 3 of them) */
static int zero1_sgd_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    g_mlp_kind = KN_OPTIM_SGD;
    float got[256], want[256];
    int n1, n2, ns1, ns2;
    RCHECK(!train_mlp_z(d, true, rank * (B / world), B / world, got, &n1, &ns1), "%s", kn_last_error());
    RCHECK(!train_mlp_z(d, false, rank * (B / world), B / world, want, &n2, &ns2), "%s", kn_last_error());
    RCHECK(n1 == n2 && !memcmp(got, want, sizeof(float) * (size_t)n1), "ZeRO-1 and plain data parallel differ (SGD)");
    RCHECK(ns2 == 4 && ns1 == (rank == 0 ? 1 : 3), "momentum buffers kept: %d with ZeRO-1, %d without", ns1, ns2);
    return 0;
}

/* the same with a loss scaler that starts at the top of f32 (the inputs
 * x64): its first steps overflow and are skipped (the update selects the
 * old values, the owner sends them), then the scale comes down and the
 * steps are taken; the overflow verdict reads every gradient, so it also
 * tests that the ranks' collectives stay in one order */
static int zero1_scaler_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    g_mlp_scale = 3.4e38;
    float got[256], want[256];
    int n1, n2, ns1, ns2;
    RCHECK(!train_mlp_z(d, true, rank * (B / world), B / world, got, &n1, &ns1), "%s", kn_last_error());
    int64_t sk1 = g_mlp_skipped;
    RCHECK(!train_mlp_z(d, false, rank * (B / world), B / world, want, &n2, &ns2), "%s", kn_last_error());
    RCHECK(n1 == n2 && !memcmp(got, want, sizeof(float) * (size_t)n1), "ZeRO-1 and plain data parallel differ (loss scaler)");
    RCHECK(sk1 == g_mlp_skipped && sk1 >= 1 && sk1 < STEPS, "skipped steps: %lld with ZeRO-1, %lld without (want 1..%d)",
           (long long)sk1, (long long)g_mlp_skipped, STEPS - 1);
    return 0;
}

TEST(zero1_matches_data_parallel_bit_for_bit) {
    SPAWN_OK(2, 60, zero1_ranks, NULL, "zero1_ranks");
    SPAWN_OK(2, 60, zero1_sgd_ranks, NULL, "zero1_sgd_ranks");
    SPAWN_OK(2, 60, zero1_scaler_ranks, NULL, "zero1_scaler_ranks");
}

/* every parameter and optimizer state of r, flat, into v; their count */
static int mlp_flat(mlp_run *r, float *v) {
    int n = 0;
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    for (int i = 0; i < kn_optim_n_params(r->o); i++) {
        kn_tensor *ts[3] = {kn_optim_param(r->o, i), kn_optim_state(r->o, i, names[0]), kn_optim_state(r->o, i, names[1])};
        for (int k = 0; k < 3; k++) {
            if (!ts[k] || kn_tensor_read(ts[k], v + n, KN_F32)) return -1;
            n += (int)kn_numel(ts[k]);
        }
    }
    return n;
}

/* A ZeRO-1 checkpoint is one whole file: two ranks train 3 steps with
 * ZeRO-1 and save (every rank sends its states, rank 0 writes), two train
 * without it and rank 0 saves; one process without a communicator loads
 * each file, and every parameter and moment is equal. Then two ZeRO-1
 * ranks resume from the first file, each taking its own states, and one
 * more step gives plain data parallelism's parameters. */
static int zero1_ckpt_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)arg;
    char pz[64], pd[64];
    snprintf(pz, sizeof pz, "/tmp/kn_zero1_%d.ckpt", (int)getppid());
    snprintf(pd, sizeof pd, "/tmp/kn_ddp_%d.ckpt", (int)getppid());
    int r0 = rank * (B / world), nb = B / world;
    mlp_run a, b;
    RCHECK(!mlp_new(&a, d, true, r0, nb) && !mlp_steps(&a, 3), "zero1 run: %s", kn_last_error());
    RCHECK(!kn_train_save(pz, a.net, a.o, 3, 0, NULL), "zero1 save: %s", kn_last_error());
    RCHECK(!mlp_new(&b, d, false, r0, nb) && !mlp_steps(&b, 3), "ddp run: %s", kn_last_error());
    RCHECK(rank != 0 || !kn_train_save(pd, b.net, b.o, 3, 0, NULL), "ddp save: %s", kn_last_error());
    RCHECK(!kn_dist_barrier(d), "%s", kn_last_error());
    if (rank == 0) {
        static float vz[512], vd[512];
        mlp_run lz, ld;
        int64_t sz, sd;
        RCHECK(!mlp_new(&lz, NULL, false, 0, B) && !kn_train_load(pz, lz.net, lz.o, 0, NULL, &sz), "load zero1 file: %s",
               kn_last_error());
        RCHECK(!mlp_new(&ld, NULL, false, 0, B) && !kn_train_load(pd, ld.net, ld.o, 0, NULL, &sd), "load ddp file: %s",
               kn_last_error());
        int nz = mlp_flat(&lz, vz), nd = mlp_flat(&ld, vd);
        RCHECK(sz == 3 && sd == 3 && nz > 0 && nz == nd && !memcmp(vz, vd, sizeof(float) * (size_t)nz),
               "the ZeRO-1 file differs from the plain one (%d and %d values)", nz, nd);
        mlp_free(&lz); mlp_free(&ld);
    }
    RCHECK(!kn_dist_barrier(d), "%s", kn_last_error());
    mlp_run c;
    int64_t sc;
    RCHECK(!mlp_new(&c, d, true, r0, nb) && !kn_train_load(pz, c.net, c.o, 0, NULL, &sc), "resume: %s", kn_last_error());
    RCHECK(!kn_optim_set_step_count(c.o, sc) && !mlp_steps(&c, 1) && !mlp_steps(&b, 1), "step: %s", kn_last_error());
    static float vc[512], vb[512];
    int nc = 0, nbp = 0;
    for (int i = 0; i < kn_optim_n_params(c.o); i++) {
        kn_tensor *pc = kn_optim_param(c.o, i), *pb = kn_optim_param(b.o, i);
        RCHECK(!kn_tensor_read(pc, vc + nc, KN_F32) && !kn_tensor_read(pb, vb + nbp, KN_F32), "%s", kn_last_error());
        nc += (int)kn_numel(pc); nbp += (int)kn_numel(pb);
    }
    RCHECK(nc == nbp && !memcmp(vc, vb, sizeof(float) * (size_t)nc), "the resumed ZeRO-1 step differs from data parallel's");
    mlp_free(&a); mlp_free(&b); mlp_free(&c);
    RCHECK(!kn_dist_barrier(d), "%s", kn_last_error());
    if (rank == 0) { unlink(pz); unlink(pd); }
    return 0;
}

TEST(zero1_checkpoint_is_one_whole_file) {
    SPAWN_OK(2, 60, zero1_ckpt_ranks, NULL, "zero1_ckpt_ranks");
}

TEST(ddp_world_of_one_is_bit_identical) {
    kn_dist *d;
    REQUIRE(kn_dist_init(0, 1, 0, NULL, 0, 5, &d) == KN_OK, "%s", kn_last_error());
    float a[256], b[256];
    int na, nb;
    REQUIRE(!train_mlp(d, 0, B, a, &na) && !train_mlp(NULL, 0, B, b, &nb), "%s", kn_last_error());
    CHECK(na == nb && !memcmp(a, b, sizeof(float) * (size_t)na), "a world of one changed the bits");
    kn_dist_free(d);
}

/* ---- tensor-parallel inference --------------------------------------------------------- */

static const char *const k_tp_models[] = {
    "tests/fixtures/qwen/qwen2_untied.gguf", "tests/fixtures/qwen/qwen2_tied", "tests/fixtures/qwen/qwen3.gguf",
    "tests/fixtures/arch/mistral.gguf",      "tests/fixtures/arch/gemma2.gguf", "tests/fixtures/arch/gemma3",
    "tests/fixtures/arch/phi3.gguf",         "tests/fixtures/arch/phi3",
};
enum { N_TP = sizeof k_tp_models / sizeof k_tp_models[0], TP_T = 5 };

/* Logits [TP_T, V] of a fixed prompt (all rows), then of one more token after it. */
static kn_status tp_logits(const char *path, kn_dist *d, float *out, int *V) {
    /* KN_TEST_TP_DEVICE=1 with KN_BACKEND=cuda (a machine of 2 GPUs): the same on the
     * GPUs, with f32 weights so that the two ways round alike */
    kn_backend *be = getenv("KN_TEST_TP_DEVICE") ? kn_backend_default() : kn_backend_cpu();
    if (!be) return kn_set_error(KN_ERR_UNSUPPORTED, "no backend: %s", kn_last_error());
    kn_model_opts o = {.n_ctx = 64, .backend = be, .dist = d,
                       .weight_dtype = be->device == KN_DEVICE_HOST ? KN_WEIGHTS_AUTO : KN_WEIGHTS_F32};
    kn_model *m;
    kn_status st = kn_model_load(path, &o, &m);
    if (st) return st;
    *V = kn_model_get_config(m)->n_vocab;
    int32_t toks[TP_T + 1] = {1, 5, 9, 2, 7, 3};
    st = kn_model_eval(m, toks, TP_T, 0, out, true);
    if (!st) st = kn_model_eval(m, toks + TP_T, 1, TP_T, out + (size_t)TP_T * *V, false);
    kn_model_free(m);
    return st;
}

static int tp_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world;
    const char *path = arg;
    static float got[(TP_T + 1) * 4096], want[(TP_T + 1) * 4096];
    int V = 0, V2 = 0;
    RCHECK(!tp_logits(path, d, got, &V), "%s: %s", path, kn_last_error());
    RCHECK(V <= 4096, "vocabulary %d", V);
    RCHECK(!tp_logits(path, NULL, want, &V2), "%s: %s", path, kn_last_error());
    double num = 0, den = 0;
    for (long i = 0; i < (long)(TP_T + 1) * V; i++) { num += (got[i] - want[i]) * (got[i] - want[i]); den += want[i] * want[i]; }
    RCHECK(sqrt(num) <= 1e-5 * sqrt(den), "%s: tensor-parallel logits off by %g relative", path, sqrt(num / den));
    return 0;
}

TEST(tensor_parallel_logits_match_the_whole_model) {
    for (int i = 0; i < N_TP; i++) {
        struct stat sb;
        if (stat(k_tp_models[i], &sb)) { fprintf(stderr, "  (no %s)\n", k_tp_models[i]); continue; }
        SPAWN_OK(2, 60, tp_ranks, (void *)k_tp_models[i], k_tp_models[i]);
    }
}

static int tp_refuse_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    kn_model_opts o = {.n_ctx = 64, .backend = kn_backend_cpu(), .dist = d};
    kn_model *m = NULL;
    kn_status st = kn_model_load("tests/fixtures/moe/mixtral.gguf", &o, &m);
    struct stat sb;
    if (stat("tests/fixtures/moe/mixtral.gguf", &sb)) return 0;
    RCHECK(st == KN_ERR_UNSUPPORTED && !m && strstr(kn_last_error(), "mixtral"), "MoE: %s", kn_last_error());
    return 0;
}

static int tp_three_ranks(kn_dist *d, int rank, int world, void *arg) {
    (void)world; (void)arg;
    float out[8];
    int V;
    kn_status st = tp_logits("tests/fixtures/qwen/qwen3.gguf", d, out, &V);
    RCHECK(st == KN_ERR_UNSUPPORTED && strstr(kn_last_error(), "do not divide"), "3 ranks over 4 heads: %s", kn_last_error());
    return 0;
}

/* Three ranks over a vocabulary of 301: the head's rows go 101, 101 and 99
 * (padded with two zero rows), Q8_0 throughout, the head tied to the
 * embedding. The fixture is dev/quant/rand_gguf's:
 *   rand_gguf tests/fixtures/tp/llama_v301_q8_0.gguf q8_0 96 1 6 3 96 301 */
TEST(tensor_parallel_uneven_vocabulary) {
    const char *path = "tests/fixtures/tp/llama_v301_q8_0.gguf";
    SPAWN_OK(3, 60, tp_ranks, (void *)path, path);
}

TEST(tensor_parallel_refuses_what_it_cannot_split) {
    SPAWN_OK(2, 60, tp_refuse_ranks, NULL, "tp_refuse_ranks");
    /* three ranks do not divide 4 heads */
    SPAWN_OK(3, 60, tp_three_ranks, NULL, "tp_three_ranks");
}

KN_TEST_MAIN()
