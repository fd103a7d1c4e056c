/* http.c: libmicrohttpd glue for `kiln serve`.
 *
 * libmicrohttpd (Debian libmicrohttpd-dev) parses HTTP; we run it with one
 * thread per connection, so a thread may block: a non-streaming request
 * waits for its job in the connection's own thread, and a stream's
 * content-reader callback blocks until the engine has pushed more text. A
 * slow client therefore only slows its own thread; the engine never waits
 * for anyone (a job's queue is an unbounded text buffer). While it waits, a
 * connection watches its socket: a client that has gone away (EOF or an
 * error on the socket) sets the job's cancel flag, and the engine frees the
 * slot at its next step. Everything else (routing, auth, parsing, limits) is
 * srv_handle's (handler.c). */
#include "serve.h"
#include <microhttpd.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct srv_http {
    struct MHD_Daemon *d;
    srv_ctx *ctx;
    int port;
};

/* per connection: the body as it arrives */
typedef struct conn {
    sbuf body;
    bool too_big;
} conn;

/* a streaming reply: owned by its MHD response */
typedef struct stream {
    srv_ctx *ctx;
    srv_job *job;
    int fd;
    sbuf pend;           /* SSE bytes not yet handed to MHD */
    size_t off;
    bool first, finished;
    srv_tstream ts;      /* the reply so far, when it may hold tool calls */
} stream;

/* the peer closed its end or the socket failed (no data is consumed) */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Waits (j->mu held) until the job is done, or (want_text) has text; false
 * when the client went away first. */
static bool wait_job(srv_job *j, int fd, bool want_text) {
    while (!j->done && !(want_text && j->out.len)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && !(want_text && j->out.len) && client_gone(fd)) return false;
    }
    return true;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static enum MHD_Result queue_buf(struct MHD_Connection *c, int status, const char *ctype, sbuf *body, bool is_static) {
    struct MHD_Response *resp;
    if (is_static) resp = MHD_create_response_from_buffer(body->len, body->p, MHD_RESPMEM_PERSISTENT);
    else {
        size_t len = body->len;
        char *p = sb_take(body);
        if (!p) return MHD_NO;
        resp = MHD_create_response_from_buffer(len, p, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(p);
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result queue_error(srv_ctx *ctx, struct MHD_Connection *c, srv_endpoint ep, int status, const char *msg) {
    sbuf b = {0};
    srv_error_json(&b, status, msg, NULL);
    if (ctx->metrics) srv_metrics_request(ctx->metrics, ep, status);
    return queue_buf(c, status, "application/json", &b, false);
}

/* ---- streams ---------------------------------------------------------------------------- */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    srv_job *j = st->job;
    while (st->off == st->pend.len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->pend.len = 0;
        st->off = 0;
        pthread_mutex_lock(&j->mu);
        if (!wait_job(j, st->fd, true)) {
            pthread_mutex_unlock(&j->mu);
            atomic_store(&j->cancel, true);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        sbuf text = j->out;          /* take the text, leave an empty buffer */
        j->out = (sbuf){0};
        bool done = j->done;
        pthread_mutex_unlock(&j->mu);
        bool err = done && j->err_status;
        srv_sse_text(st->ctx, j, &st->ts, text.p ? text.p : "", text.len, st->first, done && !err, &st->pend);
        st->first = false;
        sb_free(&text);
        if (err) srv_sse_error(j, &st->pend);
        if (done) st->finished = true;
        if (st->ts.acc.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->pend.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->pend.len - st->off < max ? st->pend.len - st->off : max;
    memcpy(buf, st->pend.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (!st->finished) atomic_store(&st->job->cancel, true);  /* ended early: the client went away */
    srv_job_unref(st->job);
    sb_free(&st->pend);
    sb_free(&st->ts.acc);
    free(st);
}

/* ---- a generation request ---------------------------------------------------------------- */
static enum MHD_Result run_job(srv_ctx *ctx, struct MHD_Connection *c, srv_resp *r) {
    srv_job *j = r->job;
    char msg[300];
    int status = ctx->sched ? srv_sched_submit(ctx->sched, j, msg, sizeof msg) : 503;
    if (!ctx->sched) snprintf(msg, sizeof msg, "no engine is running");
    if (status) return queue_error(ctx, c, r->ep, status, msg);
    int fd = conn_fd(c);
    if (j->stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) { atomic_store(&j->cancel, true); return MHD_NO; }
        *st = (stream){.ctx = ctx, .job = j, .fd = fd, .first = j->kind == SRV_CHAT};
        r->job = NULL;                /* the stream holds the reference now */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                      stream_free);
        if (!resp) { stream_free(st); return MHD_NO; }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        if (ctx->metrics) srv_metrics_request(ctx->metrics, r->ep, 200);
        enum MHD_Result res = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return res;
    }
    pthread_mutex_lock(&j->mu);
    bool here = wait_job(j, fd, false);
    pthread_mutex_unlock(&j->mu);
    if (!here) {
        atomic_store(&j->cancel, true);
        return MHD_NO;                /* nobody to answer: close the connection */
    }
    if (j->err_status) return queue_error(ctx, c, r->ep, j->err_status, j->err);
    sbuf b = {0};
    srv_reply_full(ctx, j, j->out.p ? j->out.p : "", j->out.len, &b);
    if (ctx->metrics) srv_metrics_request(ctx->metrics, r->ep, 200);
    return queue_buf(c, 200, "application/json", &b, false);
}

/* ---- MHD callbacks ---------------------------------------------------------------------------- */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_http *h = cls;
    conn *cn = *con_cls;
    if (!cn) {                        /* headers read: set up, then take the body */
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->body.len + *upload_size <= h->ctx->max_body) sb_add(&cn->body, upload, *upload_size);
        else { cn->too_big = true; sb_free(&cn->body); }
        *upload_size = 0;
        return MHD_YES;
    }
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    srv_resp r;
    srv_handle(h->ctx, method, url, auth, cn->body.p, cn->body.len, cn->too_big || cn->body.oom, &r);
    sb_free(&cn->body);
    enum MHD_Result res = r.job ? run_job(h->ctx, c, &r) : queue_buf(c, r.status, r.ctype, &r.body, r.static_body);
    srv_resp_free(&r);
    return res;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    conn *cn = *con_cls;
    if (cn) { sb_free(&cn->body); free(cn); }
    *con_cls = NULL;
}

kn_status srv_http_start(srv_ctx *ctx, const char *host, int port, srv_http **out) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int e = getaddrinfo(host, portstr, &hints, &ai);
    if (e) return kn_set_error(KN_ERR_INVALID, "kiln serve: --host %s: %s", host, gai_strerror(e));
    srv_http *h = calloc(1, sizeof *h);
    if (!h) { freeaddrinfo(ai); return kn_set_error(KN_ERR_NOMEM, "kiln serve: out of memory"); }
    h->ctx = ctx;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)512,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return kn_set_error(KN_ERR_IO, "kiln serve: cannot listen on %s port %d (in use? try another --port)", host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di && di->port ? di->port : port;
    *out = h;
    return KN_OK;
}

int srv_http_port(const srv_http *h) { return h->port; }

void srv_http_stop(srv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
