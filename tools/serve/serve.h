/* serve.h: what the parts of `kiln serve` share (tools/serve/).
 *
 *   http.c     libmicrohttpd glue: one thread per connection, the body read,
 *              the reply queued (streams through a content-reader callback)
 *   handler.c  srv_handle: method, path, Authorization, body -> a finished
 *              reply, or a parsed generation job for the scheduler
 *   api.c      OpenAI request parsing (kn_json) and reply JSON (jw.h)
 *   tools.c    tool calls: request JSON copied for the template, the calls a
 *              model wrote (Qwen/Hermes, Llama 3.x, Mistral syntax) read back
 *   sched.c    the engine thread: admits jobs into a kn_batch between steps,
 *              one kn_batch_step per iteration, samples, streams text
 *   metrics.c  counters and the Prometheus text of GET /metrics
 *   page       GET /: tools/serve/page.html, embedded by scripts/embed_page.py
 *
 * A job is shared by two threads: the HTTP thread that made it (and waits on
 * its text queue) and the engine thread that runs it. Its request part is
 * fixed before it is submitted; the queue part is guarded by its mutex. Each
 * side drops its reference when done (srv_job_unref); the last one frees it.
 */
#ifndef KN_SERVE_H
#define KN_SERVE_H
#include "kiln.h"
#include "kiln_chat.h"
#include "kiln_llm.h"
#include "jw.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum { SRV_MAX_STOP = 8, SRV_MAX_STOP_LEN = 256, SRV_MAX_BIAS = 1024 };

typedef enum srv_kind { SRV_COMPLETION, SRV_CHAT } srv_kind;

typedef struct srv_job {
    /* ---- the request (set by the handler, read-only once submitted) ---- */
    srv_kind kind;
    int32_t *prompt;             /* [n_prompt] token ids                          */
    int n_prompt;
    int max_tokens;              /* new tokens, >= 1 (the context bounds it too)  */
    kn_sampler_params sp;
    char *stop[SRV_MAX_STOP];    /* non-empty UTF-8                               */
    int n_stop;
    int32_t *bias_ids;           /* logit_bias: [n_bias] token ids and the values  */
    float *bias_vals;            /* added to their logits before sampling          */
    int n_bias;
    bool stream, include_usage;
    bool tools;                  /* the request gave tools: read calls out of the reply */
    bool called;                 /* the HTTP side sent tool calls: finish_reason "tool_calls" */
    char id[48];                 /* "chatcmpl-..." / "cmpl-..."                   */
    int64_t created;             /* unix seconds                                  */
    double t_submit;             /* srv_now() when queued                         */
    double deadline;             /* srv_now() after which it is ended (timeout)   */

    /* ---- the queue (guarded by mu) ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sbuf out;                    /* generated text not yet taken by the HTTP side */
    bool done;                   /* no more text will come                        */
    const char *finish;          /* "stop", "length" (done without error)         */
    int err_status;              /* done with an error: HTTP status (else 0)      */
    char err[256];               /* its message                                   */
    int n_gen;                   /* completion tokens so far                      */
    double t_first;              /* first token's time (0 before)                 */
    int refs;

    atomic_bool cancel;          /* the client went away: end it at the next step */

    /* ---- the engine's own (only the engine thread touches these) ---- */
    struct srv_run *run;
} srv_job;

double srv_now(void);            /* monotonic seconds */
srv_job *srv_job_new(void);      /* refs = 1 (the HTTP side's)                    */
void srv_job_unref(srv_job *j);
/* engine side: text produced; ends the job when finish or err_status is set */
void srv_job_push(srv_job *j, const char *text, size_t n, int n_gen);
void srv_job_end(srv_job *j, const char *finish, int err_status, const char *err);

/* ---- metrics (metrics.c): all counters under one mutex ---- */
typedef struct srv_metrics {
    pthread_mutex_t mu;
    int64_t requests[6][6];      /* [endpoint][status class 1xx..5xx, other]      */
    int64_t prompt_tokens, gen_tokens, prefix_reused;
    int64_t ttft_bucket[12], lat_bucket[12];   /* histogram counts, le = SRV_BUCKETS */
    double ttft_sum, lat_sum;
    int64_t ttft_n, lat_n;
    int queue_len, slots_used, slots_total;
    int64_t kv_blocks_used, kv_blocks_total, kv_blocks_cached, kv_bytes;
    int64_t steps, step_tokens, preempted, timeouts, disconnects;
    double started;
} srv_metrics;
typedef enum srv_endpoint { SRV_EP_CHAT, SRV_EP_COMPLETIONS, SRV_EP_MODELS, SRV_EP_HEALTH,
                            SRV_EP_METRICS, SRV_EP_OTHER } srv_endpoint;
void srv_metrics_init(srv_metrics *m);
void srv_metrics_request(srv_metrics *m, srv_endpoint ep, int status);
void srv_metrics_done(srv_metrics *m, const srv_job *j);   /* latency, ttft, tokens */
void srv_metrics_text(srv_metrics *m, sbuf *out);

/* ---- the scheduler (sched.c) ---- */
typedef struct srv_sched srv_sched;
typedef struct srv_sched_opts {
    int n_parallel;              /* sequences at once (kn_batch n_seq_max)        */
    int n_ctx;                   /* KV pool tokens (kn_batch n_ctx), 0 = model's  */
    int n_batch;                 /* most tokens per step                          */
    int max_queue;               /* waiting jobs beyond the running ones          */
} srv_sched_opts;
kn_status srv_sched_new(kn_model *m, const srv_sched_opts *o, srv_metrics *met, srv_sched **out);
/* Queues a job (takes a reference). 429 when the queue is full, 503 when
 * stopping: returns the status and a message, else 0. */
int srv_sched_submit(srv_sched *s, srv_job *j, char *msg, size_t cap);
int srv_sched_pool_tokens(const srv_sched *s);   /* KV tokens of the pool */
/* ends every job (503), stops the thread; later submits answer 503 */
void srv_sched_stop(srv_sched *s);
void srv_sched_free(srv_sched *s);               /* stops it first when running */

/* ---- the request handler (handler.c) ---- */
typedef struct srv_ctx {
    const char *model_id;        /* what /v1/models lists and replies name        */
    const kn_tokenizer *tok;     /* NULL: generation endpoints answer 503         */
    const kn_chat_tmpl *tmpl;    /* NULL: chat answers 400 (the model has none)   */
    int n_ctx_seq;               /* most tokens one sequence may hold (prompt + output) */
    int max_tokens_cap;          /* largest max_tokens accepted                   */
    size_t max_body;             /* bytes                                         */
    const char *api_key;         /* NULL: no auth                                 */
    double timeout_s;            /* per request                                   */
    int n_parallel;
    srv_metrics *metrics;
    srv_sched *sched;            /* NULL: the handler tests, no engine            */
    uint64_t seed_base;          /* requests without a seed draw from it          */
    atomic_uint_fast64_t n_req;  /* ids and seeds                                 */
} srv_ctx;

typedef struct srv_resp {
    int status;
    const char *ctype;           /* static string                                 */
    sbuf body;                   /* the reply, unless job is set                  */
    srv_job *job;                /* set: a generation to submit and then answer   */
    srv_endpoint ep;
    bool static_body;            /* body.p points at static data (the page)       */
} srv_resp;

/* Handles one request: method, path (with any query), the Authorization
 * header (NULL if absent), the body (NULL/0 for none; body_too_big: the
 * client sent more than ctx->max_body and the rest was dropped). Fills r;
 * r->job set means: submit it (srv_sched_submit) and answer from its queue. */
void srv_handle(srv_ctx *ctx, const char *method, const char *path, const char *auth,
                const char *body, size_t body_len, bool body_too_big, srv_resp *r);
void srv_resp_free(srv_resp *r);
/* an OpenAI error object: {"error":{"message","type","param","code"}} */
/* (the error type follows from the status: invalid_request_error, authentication_error, ...) */
void srv_error(srv_resp *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void srv_error_json(sbuf *sb, int status, const char *message, const char *param);
/* constant-time comparison of the Authorization header with "Bearer KEY" */
bool srv_auth_ok(const char *api_key, const char *auth);

/* ---- replies (api.c) ---- */
/* parse a /v1/completions or /v1/chat/completions body into a job; false
 * with the error reply filled in */
bool srv_parse_request(srv_ctx *ctx, srv_kind kind, const char *body, size_t len, srv_resp *r);
/* the non-streaming reply of a finished job */
void srv_reply_full(const srv_ctx *ctx, const srv_job *j, const char *text, size_t n, sbuf *out);
/* one SSE event with text (first: the chat role delta), the closing event
 * with the finish reason (and usage when asked), the [DONE] line */
void srv_sse_chunk(const srv_ctx *ctx, const srv_job *j, const char *text, size_t n, bool first, sbuf *out);
void srv_sse_end(const srv_ctx *ctx, const srv_job *j, sbuf *out);
void srv_sse_error(const srv_job *j, sbuf *out);
/* A stream's next text (n bytes; first: the opening chunk; done: then the
 * closing events): srv_sse_chunk / srv_sse_end, except that with tools the
 * reply is kept in ts and content goes out only as far as it cannot be a
 * tool call (srv_tool_stream_safe), the calls as one delta.tool_calls chunk
 * at the end. ts starts zeroed; sb_free(&ts->acc) after. */
typedef struct srv_tstream { sbuf acc; size_t sent; } srv_tstream;
void srv_sse_text(const srv_ctx *ctx, srv_job *j, srv_tstream *ts, const char *text, size_t n, bool first, bool done,
                  sbuf *out);

/* ---- tool calls (tools.c) ---- */
struct kn_json;
/* a kn_json value written again (numbers keep int/float; nesting over 24
 * levels: false) */
bool srv_json_copy(const struct kn_json *j, int64_t v, jw *w);
typedef struct srv_tool_call { char *name, *args; } srv_tool_call;   /* args: JSON text */
typedef struct srv_tool_calls { srv_tool_call *v; int n; } srv_tool_calls;
/* The calls in a reply's text: true with *content_len (the text before
 * them, trailing whitespace dropped) and tc filled; false (tc empty,
 * *content_len = n) when the text holds no well-formed call. */
bool srv_tool_parse(const char *text, size_t n, size_t *content_len, srv_tool_calls *tc);
void srv_tool_calls_free(srv_tool_calls *tc);
/* Streaming: of the text so far (n bytes, `sent` of them already sent as
 * content), how much may go out as content now: none while the reply could
 * still be one JSON call, and never a call's opening tag (or a part of it)
 * nor the whitespace before it. At least `sent`. */
size_t srv_tool_stream_safe(const char *text, size_t n, size_t sent);
/* call i's id: 9 letters and digits (Mistral's templates insist on 9) */
void srv_tool_call_id(const srv_job *j, int i, char out[10]);
/* the OpenAI tool_calls array (stream: with each call's "index") */
void srv_tool_calls_json(const srv_job *j, const srv_tool_calls *tc, bool stream, jw *w);
/* a stream's chunk carrying the calls (delta.tool_calls) */
void srv_sse_tool_calls(const srv_ctx *ctx, const srv_job *j, const srv_tool_calls *tc, sbuf *out);

/* ---- the page (generated from page.html) ---- */
extern const char srv_page_html[];
extern const size_t srv_page_html_len;

/* ---- HTTP (http.c) ---- */
typedef struct srv_http srv_http;
kn_status srv_http_start(srv_ctx *ctx, const char *host, int port, srv_http **out);
int srv_http_port(const srv_http *h);       /* the bound port (for --port 0) */
void srv_http_stop(srv_http *h);
#endif
