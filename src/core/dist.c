/* dist.c: the communicator of kiln_dist.h: rendezvous over TCP, the control
 * channel, and the collectives on host buffers.
 *
 * Topology: a star. Rank 0 listens on MASTER_ADDR:MASTER_PORT and keeps one
 * socket per other rank; every other rank keeps one socket to rank 0. A
 * collective is: each rank sends a header (kind, bytes, sequence number) and
 * its payload to rank 0; rank 0 checks that every rank called the same
 * collective with the same size at the same point (else it sends every rank
 * an error naming the ranks, so that all of them fail with one message),
 * combines the payloads in rank order and sends the result back. That is
 * O(world) messages through one host: right for CPU ranks, checks, bootstrap
 * ids and the loss; device tensors go through the backend's library (NCCL).
 *
 * Every socket read and write waits at most the communicator's timeout
 * (poll), and sends use MSG_NOSIGNAL: a rank that died is an error, not a
 * SIGPIPE or a hang.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/dist.h"
#include "core/core.h"
#include "core/env.h"
#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MSG_HELLO = 1, MSG_BARRIER, MSG_BCAST, MSG_REDUCE, MSG_CHECK, MSG_ERROR, MSG_GATHER };
#define KN_DIST_MAGIC 0x53444e4bu   /* "KNDS" */

typedef struct msg_hdr {
    uint32_t magic, kind;
    uint64_t bytes;      /* payload size (for HELLO: the world size) */
    uint64_t seq;        /* collective number on this communicator (for HELLO: the rank) */
    uint64_t aux;        /* REDUCE: dtype << 8 | op; BCAST: root */
} msg_hdr;

struct kn_dist {
    int rank, world, local;
    double timeout;      /* seconds */
    int *fd;             /* rank 0: fd[r] for r >= 1; others: fd[0] is rank 0 */
    uint64_t seq;
    void *dev;
    void (*dev_free)(void *);
};

static const char *kind_name(uint32_t k) {
    switch (k) {
    case MSG_BARRIER: return "barrier";
    case MSG_BCAST: return "broadcast";
    case MSG_REDUCE: return "all_reduce";
    case MSG_CHECK: return "check_same";
    case MSG_GATHER: return "all_gather";
    default: return "?";
    }
}

const char *kn__dist_op_name(int op) {
    switch (op) {
    case KN_DIST_SUM: return "sum";
    case KN_DIST_AVG: return "avg";
    case KN_DIST_MAX: return "max";
    case KN_DIST_MIN: return "min";
    default: return "?";
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- socket I/O with a deadline ---------------------------------------------------- */

/* 0 ok; 1 timeout; 2 peer closed; 3 other error (errno) */
static int wait_fd(int fd, short ev, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 1;
        struct pollfd p = {fd, ev, 0};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return 3;
        if (r == 0) continue;
        if (p.revents & POLLNVAL) return 3;
        if (p.revents & ev) return 0;        /* data first: a peer may have written, then closed */
        if (p.revents & (POLLHUP | POLLERR)) return 2;
    }
}

static int send_all(int fd, const void *buf, size_t n, double deadline) {
    const char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w) return w;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) return errno == EPIPE || errno == ECONNRESET ? 2 : 3;
        p += k; n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, double deadline) {
    char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLIN, deadline);
        if (w) return w;
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) return errno == ECONNRESET ? 2 : 3;
        if (k == 0) return 2;
        p += k; n -= (size_t)k;
    }
    return 0;
}

/* The message for an I/O failure with rank `peer` during `what`. */
static kn_status io_error(const kn_dist *d, int code, int peer, const char *what) {
    if (code == 1)
        return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank %d waited %.0f s for rank %d in %s: that rank is stuck, much slower, "
                            "or not calling it (raise KN_DIST_TIMEOUT if it is only slow)", d->rank, d->timeout, peer, what);
    if (code == 2)
        return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank %d lost rank %d during %s: that rank exited or crashed (see its "
                            "output)", d->rank, peer, what);
    return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank %d: socket error with rank %d during %s: %s", d->rank, peer, what,
                        strerror(errno));
}

/* ---- init -------------------------------------------------------------------------- */

static int env_int(const char *name, int dflt, bool *bad) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1 << 20) { *bad = true; return dflt; }
    return (int)v;
}

kn_status kn_dist_init_env(kn_dist **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_dist_init_env: out is NULL");
    *out = NULL;
    bool bad = false;
    int world = env_int("WORLD_SIZE", 1, &bad);
    int rank = env_int("RANK", 0, &bad);
    int local = env_int("LOCAL_RANK", rank, &bad);
    int port = env_int("MASTER_PORT", 29500, &bad);
    if (bad)
        return kn_set_error(KN_ERR_INVALID, "kn_dist: RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be non-negative integers "
                            "(RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s MASTER_PORT=%s)", getenv("RANK") ? getenv("RANK") : "",
                            getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "", getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "",
                            getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "");
    const char *addr = getenv("MASTER_ADDR");
    double timeout = 600;
    const char *ts = kn_env_get()->dist_timeout;
    if (ts && *ts) {
        char *end;
        timeout = strtod(ts, &end);
        if (*end || !(timeout > 0))
            return kn_set_error(KN_ERR_INVALID, "KN_DIST_TIMEOUT='%s': give a number of seconds above 0", ts);
    }
    return kn_dist_init(rank, world, local, addr && *addr ? addr : "127.0.0.1", port, timeout, out);
}

static kn_dist *dist_alloc(int rank, int world, int local, double timeout) {
    kn_dist *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->rank = rank; d->world = world; d->local = local; d->timeout = timeout;
    d->fd = malloc(sizeof *d->fd * (size_t)world);
    if (!d->fd) { free(d); return NULL; }
    for (int i = 0; i < world; i++) d->fd[i] = -1;
    return d;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static kn_status resolve(const char *addr, int port, struct addrinfo **res) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hint;
    memset(&hint, 0, sizeof hint);
    hint.ai_family = AF_INET;
    hint.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(addr, ps, &hint, res);
    if (e) return kn_set_error(KN_ERR_INVALID, "kn_dist: MASTER_ADDR '%s' cannot be resolved: %s", addr, gai_strerror(e));
    return KN_OK;
}

/* Rank 0: listen, take world - 1 HELLOs, answer each once all are in. */
static kn_status init_root(kn_dist *d, const char *addr, int port) {
    struct addrinfo *ai;
    kn_status st = resolve(addr, port, &ai);
    if (st) return st;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (ls < 0) { freeaddrinfo(ai); return kn_set_error(KN_ERR_BACKEND, "kn_dist: socket: %s", strerror(errno)); }
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, ai->ai_addr, ai->ai_addrlen) || listen(ls, d->world)) {
        int e = errno;
        freeaddrinfo(ai); close(ls);
        return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank 0 cannot listen on %s:%d: %s (another job on that port? set "
                            "MASTER_PORT to a free one)", addr, port, strerror(e));
    }
    freeaddrinfo(ai);
    double deadline = now_s() + d->timeout;
    for (int joined = 1; joined < d->world;) {
        int w = wait_fd(ls, POLLIN, deadline);
        if (w) {
            close(ls);
            return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank 0 waited %.0f s at %s:%d and only %d of %d ranks joined; "
                                "start every rank (kiln run --nproc N) with the same MASTER_ADDR/MASTER_PORT",
                                d->timeout, addr, port, joined, d->world);
        }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        set_nodelay(fd);
        msg_hdr h;
        if (recv_all(fd, &h, sizeof h, deadline) || h.magic != KN_DIST_MAGIC || h.kind != MSG_HELLO) { close(fd); continue; }
        int r = (int)h.seq;
        const char *why = NULL;
        if ((int)h.bytes != d->world) why = "another WORLD_SIZE";
        else if (r <= 0 || r >= d->world) why = "a RANK out of range";
        else if (d->fd[r] >= 0) why = "a RANK that already joined";
        if (why) {
            close(fd); close(ls);
            return kn_set_error(KN_ERR_INVALID, "kn_dist: a process joined as rank %d of %d with %s (rank 0 has WORLD_SIZE "
                                "%d); every rank needs a distinct RANK in 0..WORLD_SIZE-1 and the same WORLD_SIZE",
                                r, (int)h.bytes, why, d->world);
        }
        d->fd[r] = fd;
        joined++;
    }
    close(ls);
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_HELLO, (uint64_t)d->world, 0, 0};
        int e = send_all(d->fd[r], &h, sizeof h, deadline);
        if (e) return io_error(d, e, r, "the rendezvous");
    }
    return KN_OK;
}

static kn_status init_peer(kn_dist *d, const char *addr, int port) {
    struct addrinfo *ai;
    kn_status st = resolve(addr, port, &ai);
    if (st) return st;
    double deadline = now_s() + d->timeout;
    int fd = -1;
    while (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) { freeaddrinfo(ai); return kn_set_error(KN_ERR_BACKEND, "kn_dist: socket: %s", strerror(errno)); }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        close(fd); fd = -1;
        if (now_s() > deadline) {
            freeaddrinfo(ai);
            return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank %d could not reach rank 0 at %s:%d for %.0f s; start rank 0 "
                                "(kiln run --nproc N starts all) or fix MASTER_ADDR/MASTER_PORT", d->rank, addr, port, d->timeout);
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(ai);
    set_nodelay(fd);
    d->fd[0] = fd;
    msg_hdr h = {KN_DIST_MAGIC, MSG_HELLO, (uint64_t)d->world, (uint64_t)d->rank, 0};
    int e = send_all(fd, &h, sizeof h, deadline);
    if (!e) e = recv_all(fd, &h, sizeof h, deadline);
    if (e == 2)
        return kn_set_error(KN_ERR_INVALID, "kn_dist: rank 0 refused rank %d of %d (another WORLD_SIZE, or this RANK twice; "
                            "its output says which)", d->rank, d->world);
    if (e) return io_error(d, e, 0, "the rendezvous");
    return KN_OK;
}

kn_status kn_dist_init(int rank, int world, int local, const char *addr, int port, double timeout, kn_dist **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_dist_init: out is NULL");
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || local < 0)
        return kn_set_error(KN_ERR_INVALID, "kn_dist: RANK %d with WORLD_SIZE %d: need 0 <= RANK < WORLD_SIZE", rank, world);
    if (world > 1 && (port <= 0 || port > 65535))
        return kn_set_error(KN_ERR_INVALID, "kn_dist: MASTER_PORT %d is not a TCP port (1..65535)", port);
    if (!(timeout > 0)) return kn_set_error(KN_ERR_INVALID, "kn_dist: timeout %g s: give a positive number", timeout);
    kn_dist *d = dist_alloc(rank, world, local, timeout);
    if (!d) return kn_set_error(KN_ERR_NOMEM, "kn_dist: out of memory");
    if (world > 1) {
        kn_status st = rank == 0 ? init_root(d, addr ? addr : "127.0.0.1", port) : init_peer(d, addr ? addr : "127.0.0.1", port);
        if (st) { kn_dist_free(d); return st; }
    }
    *out = d;
    return KN_OK;
}

/* A graceful close: our side ends, and what the peer still sends is read
 * and dropped for a moment, so that the close is a FIN, not a reset (a
 * reset can destroy the peer's copy of an error message we just sent). */
static void close_gently(int fd) {
    shutdown(fd, SHUT_WR);
    double deadline = now_s() + 0.5;
    char buf[4096];
    while (!wait_fd(fd, POLLIN, deadline) && recv(fd, buf, sizeof buf, 0) > 0) {}
    close(fd);
}

void kn_dist_free(kn_dist *d) {
    if (!d) return;
    if (d->dev && d->dev_free) d->dev_free(d->dev);
    for (int i = 0; i < d->world; i++) if (d->fd[i] >= 0) close_gently(d->fd[i]);
    free(d->fd);
    free(d);
}

int kn_dist_rank(const kn_dist *d) { return d ? d->rank : 0; }
int kn_dist_world(const kn_dist *d) { return d ? d->world : 1; }
int kn_dist_local_rank(const kn_dist *d) { return d ? d->local : 0; }
void *kn__dist_dev(const kn_dist *d) { return d ? d->dev : NULL; }
void kn__dist_set_dev(kn_dist *d, void *dev, void (*dev_free)(void *)) { d->dev = dev; d->dev_free = dev_free; }
double kn__dist_timeout(const kn_dist *d) { return d ? d->timeout : 600; }

/* ---- the collective skeleton ---------------------------------------------------------- */

/* Rank 0's error for every rank: sent as MSG_ERROR with the text. */
static kn_status root_fail(kn_dist *d, double deadline, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static kn_status root_fail(kn_dist *d, double deadline, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_ERROR, strlen(msg) + 1, d->seq, 0};
        if (!send_all(d->fd[r], &h, sizeof h, deadline)) send_all(d->fd[r], msg, h.bytes, deadline);
    }
    return kn_set_error(KN_ERR_INVALID, "kn_dist: %s", msg);
}

/* A non-root rank's reply header: the result follows, or an error from rank 0. */
static kn_status peer_reply(kn_dist *d, msg_hdr *h, uint32_t kind, double deadline) {
    int e = recv_all(d->fd[0], h, sizeof *h, deadline);
    if (e) return io_error(d, e, 0, kind_name(kind));
    if (h->magic != KN_DIST_MAGIC) return kn_set_error(KN_ERR_BACKEND, "kn_dist: rank %d got a corrupt message from rank 0", d->rank);
    if (h->kind == MSG_ERROR) {
        char msg[512] = "";
        size_t n = h->bytes < sizeof msg ? h->bytes : sizeof msg - 1;
        recv_all(d->fd[0], msg, n, deadline);
        msg[sizeof msg - 1] = 0;
        return kn_set_error(KN_ERR_INVALID, "kn_dist: %s (reported by rank 0)", msg);
    }
    return KN_OK;
}

/* Rank 0 reads rank r's header for collective (kind, bytes, aux) and checks it. */
static kn_status root_hdr(kn_dist *d, int r, uint32_t kind, uint64_t bytes, uint64_t aux, double deadline) {
    msg_hdr h;
    int e = recv_all(d->fd[r], &h, sizeof h, deadline);
    if (e) {
        kn_status st = io_error(d, e, r, kind_name(kind));
        char msg[512];
        const char *m = kn_last_error();
        snprintf(msg, sizeof msg, "%s", strncmp(m, "kn_dist: ", 9) ? m : m + 9);
        root_fail(d, deadline, "%s", msg);
        kn_set_error(st, "kn_dist: %s", msg);
        return st;
    }
    if (h.magic != KN_DIST_MAGIC) return root_fail(d, deadline, "rank %d sent a corrupt message", r);
    if (h.kind != kind || h.seq != d->seq)
        return root_fail(d, deadline, "ranks disagree on the order of collectives: collective #%llu is %s on rank 0 but "
                         "%s (#%llu) on rank %d; every rank must run the same steps",
                         (unsigned long long)d->seq, kind_name(kind), kind_name(h.kind), (unsigned long long)h.seq, r);
    if (h.bytes != bytes || h.aux != aux)
        return root_fail(d, deadline, "%s #%llu has %llu bytes (code %llu) on rank 0 but %llu bytes (code %llu) on rank %d; "
                         "the ranks' models or batch shapes differ", kind_name(kind), (unsigned long long)d->seq,
                         (unsigned long long)bytes, (unsigned long long)aux, (unsigned long long)h.bytes,
                         (unsigned long long)h.aux, r);
    return KN_OK;
}

kn_status kn_dist_barrier(kn_dist *d) {
    if (!d || d->world == 1) return KN_OK;
    double deadline = now_s() + d->timeout;
    d->seq++;
    if (d->rank) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_BARRIER, 0, d->seq, 0};
        int e = send_all(d->fd[0], &h, sizeof h, deadline);
        if (e) return io_error(d, e, 0, "barrier");
        return peer_reply(d, &h, MSG_BARRIER, deadline);
    }
    for (int r = 1; r < d->world; r++) {
        kn_status st = root_hdr(d, r, MSG_BARRIER, 0, 0, deadline);
        if (st) return st;
    }
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_BARRIER, 0, d->seq, 0};
        int e = send_all(d->fd[r], &h, sizeof h, deadline);
        if (e) return io_error(d, e, r, "barrier");
    }
    return KN_OK;
}

kn_status kn_dist_broadcast_host(kn_dist *d, void *buf, size_t n, int root) {
    if (!d || d->world == 1) return KN_OK;
    if (root < 0 || root >= d->world) return kn_set_error(KN_ERR_INVALID, "kn_dist_broadcast_host: root %d outside 0..%d", root, d->world - 1);
    if (n && !buf) return kn_set_error(KN_ERR_INVALID, "kn_dist_broadcast_host: buf is NULL");
    double deadline = now_s() + d->timeout;
    d->seq++;
    if (d->rank) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_BCAST, n, d->seq, (uint64_t)root};
        int e = send_all(d->fd[0], &h, sizeof h, deadline);
        if (!e && d->rank == root) e = send_all(d->fd[0], buf, n, deadline);
        if (e) return io_error(d, e, 0, "broadcast");
        kn_status st = peer_reply(d, &h, MSG_BCAST, deadline);
        if (st) return st;
        if (d->rank != root && (e = recv_all(d->fd[0], buf, n, deadline))) return io_error(d, e, 0, "broadcast");
        return KN_OK;
    }
    for (int r = 1; r < d->world; r++) {
        kn_status st = root_hdr(d, r, MSG_BCAST, n, (uint64_t)root, deadline);
        if (st) return st;
        if (r == root) {
            int e = recv_all(d->fd[r], buf, n, deadline);
            if (e) return io_error(d, e, r, "broadcast");
        }
    }
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_BCAST, n, d->seq, (uint64_t)root};
        int e = send_all(d->fd[r], &h, sizeof h, deadline);
        if (!e && r != root) e = send_all(d->fd[r], buf, n, deadline);
        if (e) return io_error(d, e, r, "broadcast");
    }
    return KN_OK;
}

static bool reducible(kn_dtype dt) {
    return dt == KN_F32 || dt == KN_F64 || dt == KN_F16 || dt == KN_BF16 || dt == KN_I32 || dt == KN_I64;
}

kn_status kn_dist_all_reduce_host(kn_dist *d, kn_dtype dt, void *buf, int64_t n, kn_dist_op op) {
    if (!reducible(dt))
        return kn_set_error(KN_ERR_UNSUPPORTED, "kn_dist all_reduce: dtype %s is not supported (f32, f64, f16, bf16, i32, i64)",
                            kn_dtype_name(dt));
    if ((unsigned)op > KN_DIST_MIN) return kn_set_error(KN_ERR_INVALID, "kn_dist all_reduce: unknown reduce op %d", (int)op);
    if (n < 0 || (n && !buf)) return kn_set_error(KN_ERR_INVALID, "kn_dist all_reduce: bad buffer (%lld elements)", (long long)n);
    if (!d || d->world == 1) return KN_OK;          /* avg over one rank: the value itself */
    size_t bytes = kn_dtype_nbytes(dt, n);
    uint64_t aux = (uint64_t)dt << 8 | (uint64_t)op;
    double deadline = now_s() + d->timeout;
    d->seq++;
    if (d->rank) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_REDUCE, bytes, d->seq, aux};
        int e = send_all(d->fd[0], &h, sizeof h, deadline);
        if (!e) e = send_all(d->fd[0], buf, bytes, deadline);
        if (e) return io_error(d, e, 0, "all_reduce");
        kn_status st = peer_reply(d, &h, MSG_REDUCE, deadline);
        if (st) return st;
        if ((e = recv_all(d->fd[0], buf, bytes, deadline))) return io_error(d, e, 0, "all_reduce");
        return KN_OK;
    }
    double *acc = malloc(sizeof *acc * (size_t)(n ? n : 1));
    void *tmp = malloc(bytes ? bytes : 1);
    if (!acc || !tmp) { free(acc); free(tmp); return root_fail(d, deadline, "rank 0 is out of memory for all_reduce of %lld elements", (long long)n); }
    for (int64_t i = 0; i < n; i++) acc[i] = kn_load(dt, buf, i);
    kn_status st = KN_OK;
    for (int r = 1; r < d->world && !st; r++) {
        if ((st = root_hdr(d, r, MSG_REDUCE, bytes, aux, deadline))) break;
        int e = recv_all(d->fd[r], tmp, bytes, deadline);
        if (e) { st = io_error(d, e, r, "all_reduce"); break; }
        for (int64_t i = 0; i < n; i++) {
            double v = kn_load(dt, tmp, i);
            switch (op) {
            case KN_DIST_SUM: case KN_DIST_AVG: acc[i] += v; break;
            case KN_DIST_MAX: if (v > acc[i] || v != v) acc[i] = v; break;
            case KN_DIST_MIN: if (v < acc[i] || v != v) acc[i] = v; break;
            }
        }
    }
    if (!st) {
        for (int64_t i = 0; i < n; i++) kn_store(dt, buf, i, op == KN_DIST_AVG ? acc[i] / d->world : acc[i]);
        for (int r = 1; r < d->world && !st; r++) {
            msg_hdr h = {KN_DIST_MAGIC, MSG_REDUCE, bytes, d->seq, aux};
            int e = send_all(d->fd[r], &h, sizeof h, deadline);
            if (!e) e = send_all(d->fd[r], buf, bytes, deadline);
            if (e) st = io_error(d, e, r, "all_reduce");
        }
    }
    free(acc); free(tmp);
    return st;
}

kn_status kn_dist_check_same(kn_dist *d, const char *what, const char *value) {
    if (!what || !value) return kn_set_error(KN_ERR_INVALID, "kn_dist_check_same: NULL argument");
    if (!d || d->world == 1) return KN_OK;
    double deadline = now_s() + d->timeout;
    size_t n = strlen(value) + 1;
    d->seq++;
    if (d->rank) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_CHECK, n, d->seq, 0};
        int e = send_all(d->fd[0], &h, sizeof h, deadline);
        if (!e) e = send_all(d->fd[0], value, n, deadline);
        if (e) return io_error(d, e, 0, "check_same");
        return peer_reply(d, &h, MSG_CHECK, deadline);
    }
    /* sizes may differ: read each header by hand */
    for (int r = 1; r < d->world; r++) {
        msg_hdr h;
        int e = recv_all(d->fd[r], &h, sizeof h, deadline);
        if (e) return io_error(d, e, r, "check_same");
        if (h.magic != KN_DIST_MAGIC || h.kind != MSG_CHECK || h.seq != d->seq)
            return root_fail(d, deadline, "ranks disagree on the order of collectives: #%llu is check_same(%s) on rank 0 "
                             "but %s on rank %d", (unsigned long long)d->seq, what, kind_name(h.kind), r);
        if (h.bytes > 1 << 20) return root_fail(d, deadline, "rank %d sent a %llu-byte %s", r, (unsigned long long)h.bytes, what);
        char *v = malloc(h.bytes ? h.bytes : 1);
        if (!v) return root_fail(d, deadline, "rank 0 is out of memory");
        if ((e = recv_all(d->fd[r], v, h.bytes, deadline))) { free(v); return io_error(d, e, r, "check_same"); }
        v[h.bytes ? h.bytes - 1 : 0] = 0;
        if (strcmp(v, value)) {
            kn_status st = root_fail(d, deadline, "rank %d has %s \"%s\" but rank 0 has \"%s\"; start every rank with the "
                                     "same options", r, what, v, value);
            free(v);
            return st;
        }
        free(v);
    }
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_CHECK, 0, d->seq, 0};
        int e = send_all(d->fd[r], &h, sizeof h, deadline);
        if (e) return io_error(d, e, r, "check_same");
    }
    return KN_OK;
}

kn_status kn_dist_all_gather_host(kn_dist *d, const void *in, size_t n, void *out) {
    if (n && (!in || !out)) return kn_set_error(KN_ERR_INVALID, "kn_dist_all_gather_host: NULL buffer");
    if (!d || d->world == 1) { if (n && out != in) memmove(out, in, n); return KN_OK; }
    double deadline = now_s() + d->timeout;
    size_t all = n * (size_t)d->world;
    d->seq++;
    if (d->rank) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_GATHER, n, d->seq, 0};
        int e = send_all(d->fd[0], &h, sizeof h, deadline);
        if (!e) e = send_all(d->fd[0], in, n, deadline);
        if (e) return io_error(d, e, 0, "all_gather");
        kn_status st = peer_reply(d, &h, MSG_GATHER, deadline);
        if (st) return st;
        if ((e = recv_all(d->fd[0], out, all, deadline))) return io_error(d, e, 0, "all_gather");
        return KN_OK;
    }
    memmove(out, in, n);
    for (int r = 1; r < d->world; r++) {
        kn_status st = root_hdr(d, r, MSG_GATHER, n, 0, deadline);
        if (st) return st;
        int e = recv_all(d->fd[r], (char *)out + (size_t)r * n, n, deadline);
        if (e) return io_error(d, e, r, "all_gather");
    }
    for (int r = 1; r < d->world; r++) {
        msg_hdr h = {KN_DIST_MAGIC, MSG_GATHER, n, d->seq, 0};
        int e = send_all(d->fd[r], &h, sizeof h, deadline);
        if (!e) e = send_all(d->fd[r], out, all, deadline);
        if (e) return io_error(d, e, r, "all_gather");
    }
    return KN_OK;
}
