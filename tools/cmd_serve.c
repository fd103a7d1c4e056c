/* cmd_serve.c: `kiln serve`: loads the model, starts the engine thread
 * (tools/serve/sched.c) and the HTTP server (tools/serve/http.c), and runs
 * until SIGINT or SIGTERM, then ends the running requests (503) and stops. */
#include "cli.h"
#include "serve/serve.h"
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;     /* a directory given as dir/ */
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

int cmd_serve(const cli_args *a) {
    /* the signals are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    cli_args la = *a;
    la.ctx = 0;                     /* --ctx sizes the shared KV pool, not the model's own cache */
    kn_model *m = cli_load(&la);
    if (!m) return 1;
    kn_chat_tmpl tmpl = {0};
    bool have_tmpl = true;
    const char *tsrc = a->tmpl ? NULL : kn_model_chat_template(m);
    if (a->tmpl || tsrc) have_tmpl = cli_get_template(m, a, &tmpl);
    else have_tmpl = false;
    if (!have_tmpl)
        fprintf(stderr, "kiln serve: the model has no usable chat template: /v1/chat/completions answers 400 "
                        "(--chat-template chatml|llama2|llama3|smollm|plain picks one)\n");
    if (!kn_model_tokenizer(m)) {
        fprintf(stderr, "kiln serve: the model has no tokenizer; give one with -z FILE\n");
        kn_model_free(m);
        return 1;
    }

    srv_metrics met;
    srv_metrics_init(&met);
    srv_sched_opts so = {.n_parallel = a->parallel, .n_ctx = a->ctx, .n_batch = a->batch ? a->batch : 512,
                         .max_queue = a->queue};
    srv_sched *sched = NULL;
    if (srv_sched_new(m, &so, &met, &sched) != KN_OK) {
        fprintf(stderr, "kiln serve: %s\n", kn_last_error());
        kn_chat_tmpl_free(&tmpl);
        kn_model_free(m);
        return 1;
    }
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) seed = (uint64_t)srv_now() * 2654435761u;
    srv_ctx ctx = {
        .model_id = base_name(a->model),
        .tok = kn_model_tokenizer(m),
        .tmpl = have_tmpl ? &tmpl : NULL,
        .n_ctx_seq = srv_sched_pool_tokens(sched),
        .max_body = (size_t)a->max_body,
        .api_key = a->api_key,
        .timeout_s = a->timeout > 0 ? (double)a->timeout : 1e18,
        .n_parallel = a->parallel,
        .metrics = &met,
        .sched = sched,
        .seed_base = seed,
    };
    ctx.max_tokens_cap = ctx.n_ctx_seq;
    atomic_init(&ctx.n_req, 0);
    srv_http *http = NULL;
    if (srv_http_start(&ctx, a->host, a->port, &http) != KN_OK) {
        fprintf(stderr, "%s\n", kn_last_error());
        srv_sched_free(sched);
        kn_chat_tmpl_free(&tmpl);
        kn_model_free(m);
        return 1;
    }
    const char *h = a->host;
    bool v6 = strchr(h, ':') != NULL;
    fprintf(stderr, "kiln serve: %s on %s, %d slots, %d tokens per request at most; listening on http://%s%s%s:%d/%s\n",
            ctx.model_id, kn_backend_name(kn_model_backend(m)), a->parallel, ctx.n_ctx_seq, v6 ? "[" : "", h,
            v6 ? "]" : "", srv_http_port(http), a->api_key ? " (API key required)" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kiln serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_sched_stop(sched);           /* ends every job: the waiting connections answer and close */
    srv_http_stop(http);
    srv_sched_free(sched);
    kn_chat_tmpl_free(&tmpl);
    kn_model_free(m);
    return 0;
}
