/* handler.c: srv_handle, the part of the server that turns one HTTP request
 * (method, path, Authorization header, body) into a reply, with no network
 * and no engine: tests/test_serve.c and fuzz/fuzz_serve.c drive it directly.
 * Generation requests come back as a parsed job (r->job) that http.c hands
 * to the scheduler. Also the job's queue (shared with the engine thread). */
#include "serve.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- jobs ---------------------------------------------------------------------------------- */
srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, false);
    j->refs = 1;
    return j;
}

void srv_job_unref(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->bias_ids);
    free(j->bias_vals);
    sb_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void srv_job_push(srv_job *j, const char *text, size_t n, int n_gen) {
    pthread_mutex_lock(&j->mu);
    if (n) sb_add(&j->out, text, n);
    j->n_gen = n_gen;
    if (n_gen > 0 && j->t_first == 0) j->t_first = srv_now();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_end(srv_job *j, const char *finish, int err_status, const char *err) {
    pthread_mutex_lock(&j->mu);
    if (!j->done) {
        j->done = true;
        j->finish = finish;
        j->err_status = err_status;
        if (err) snprintf(j->err, sizeof j->err, "%s", err);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- errors --------------------------------------------------------------------------------- */
static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void srv_error_json(sbuf *sb, int status, const char *message, const char *param) {
    jw w;
    jw_init(&w, sb);
    jw_obj(&w);
    jw_key(&w, "error");
    jw_obj(&w);
    jw_kstr(&w, "message", message);
    jw_kstr(&w, "type", error_type(status));
    jw_kstr(&w, "param", param);
    jw_knull(&w, "code");
    jw_obj_end(&w);
    jw_obj_end(&w);
}

void srv_error(srv_resp *r, int status, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_free(&r->body);
    r->status = status;
    r->ctype = "application/json";
    r->static_body = false;
    srv_error_json(&r->body, status, msg, param);
}

void srv_resp_free(srv_resp *r) {
    if (!r->static_body) sb_free(&r->body);
    r->body = (sbuf){0};
    srv_job_unref(r->job);
    r->job = NULL;
}

/* ---- auth ----------------------------------------------------------------------------------- */
/* The comparison touches every byte of the longer of the two strings
 * whatever they hold, so its time tells nothing about where they differ. */
bool srv_auth_ok(const char *api_key, const char *auth) {
    if (!api_key) return true;
    if (!auth) return false;
    static const char bearer[] = "Bearer ";
    size_t nk = strlen(api_key), na = strlen(auth), nb = sizeof bearer - 1;
    size_t want = nb + nk, n = na > want ? na : want;
    unsigned diff = (unsigned)(na ^ want);
    for (size_t i = 0; i < n; i++) {
        unsigned char e = i < nb ? (unsigned char)bearer[i] : i < want ? (unsigned char)api_key[i - nb] : 0;
        unsigned char g = i < na ? (unsigned char)auth[i] : 0;
        diff |= (unsigned)(e ^ g);
    }
    return diff == 0;
}

/* ---- routes --------------------------------------------------------------------------------- */
static void json_reply(srv_resp *r, int status) {
    r->status = status;
    r->ctype = "application/json";
}

static void models(srv_ctx *ctx, srv_resp *r) {
    jw w;
    jw_init(&w, &r->body);
    jw_obj(&w);
    jw_kstr(&w, "object", "list");
    jw_key(&w, "data");
    jw_arr(&w);
    jw_obj(&w);
    jw_kstr(&w, "id", ctx->model_id);
    jw_kstr(&w, "object", "model");
    jw_kint(&w, "created", 0);
    jw_kstr(&w, "owned_by", "kiln");
    jw_kint(&w, "context_length", ctx->n_ctx_seq);
    jw_obj_end(&w);
    jw_arr_end(&w);
    jw_obj_end(&w);
    json_reply(r, 200);
}

static void handle(srv_ctx *ctx, const char *method, const char *path, const char *auth, const char *body,
                   size_t body_len, bool body_too_big, srv_resp *r) {
    size_t plen = strcspn(path, "?#");
    #define IS(p) (plen == sizeof(p) - 1 && !strncmp(path, p, plen))
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    r->ep = IS("/v1/chat/completions") || IS("/chat/completions") ? SRV_EP_CHAT
          : IS("/v1/completions") || IS("/completions") ? SRV_EP_COMPLETIONS
          : IS("/v1/models") || IS("/models") ? SRV_EP_MODELS
          : IS("/health") ? SRV_EP_HEALTH : IS("/metrics") ? SRV_EP_METRICS : SRV_EP_OTHER;
    bool page = IS("/") || IS("/index.html");
    if (r->ep == SRV_EP_HEALTH) {
        if (!get) { srv_error(r, 405, NULL, "%s takes GET", "/health"); return; }
        sb_puts(&r->body, ctx->tok ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}");
        json_reply(r, ctx->tok ? 200 : 503);
        return;
    }
    if (page) {
        /* the page holds no data: it asks for the key itself (the browser
         * cannot send a header when it loads a page), so it needs none */
        if (!get) { srv_error(r, 405, NULL, "/ takes GET"); return; }
        r->status = 200;
        r->ctype = "text/html; charset=utf-8";
        r->body = (sbuf){.p = (char *)srv_page_html, .len = srv_page_html_len, .cap = 0};
        r->static_body = true;
        return;
    }
    if (!srv_auth_ok(ctx->api_key, auth)) {
        srv_error(r, 401, NULL, "a valid API key is required: send the header 'Authorization: Bearer KEY' "
                                      "(the key given to kiln serve --api-key)");
        return;
    }
    switch (r->ep) {
    case SRV_EP_MODELS:
        if (!get) { srv_error(r, 405, NULL, "%.*s takes GET", (int)plen, path); return; }
        models(ctx, r);
        return;
    case SRV_EP_METRICS:
        if (!get) { srv_error(r, 405, NULL, "/metrics takes GET"); return; }
        srv_metrics_text(ctx->metrics, &r->body);
        r->status = 200;
        r->ctype = "text/plain; version=0.0.4; charset=utf-8";
        return;
    case SRV_EP_CHAT:
    case SRV_EP_COMPLETIONS:
        if (!post) { srv_error(r, 405, NULL, "%.*s takes POST", (int)plen, path); return; }
        if (body_too_big) {
            srv_error(r, 413, NULL, "the body is larger than %zu bytes (kiln serve --max-body)", ctx->max_body);
            return;
        }
        if (srv_parse_request(ctx, r->ep == SRV_EP_CHAT ? SRV_CHAT : SRV_COMPLETION, body, body_len, r)) {
            r->job->deadline = srv_now() + ctx->timeout_s;
            r->status = 200;
        }
        return;
    default:
        srv_error(r, 404, NULL, "no such endpoint: %s %.*s (this server has POST /v1/chat/completions, "
                  "POST /v1/completions, GET /v1/models, GET /health, GET /metrics and the chat page at GET /)",
                  method, (int)(plen > 200 ? 200 : plen), path);
    }
    #undef IS
}

void srv_handle(srv_ctx *ctx, const char *method, const char *path, const char *auth, const char *body,
                size_t body_len, bool body_too_big, srv_resp *r) {
    *r = (srv_resp){0};
    handle(ctx, method ? method : "", path ? path : "", auth, body, body_len, body_too_big, r);
    if (r->body.oom) srv_error(r, 500, NULL, "out of memory");
    if (ctx->metrics && !r->job) srv_metrics_request(ctx->metrics, r->ep, r->status);
}
