/* cli_common.c: model loading and the helpers every subcommand shares (cli.h). */
#include "cli.h"
#ifdef KN_CUDA
#include "kiln_cuda.h"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --backend cpu|cuda (else KN_BACKEND, through kn_backend_default); NULL
 * after a message when the choice cannot be honoured */
kn_backend *cli_pick_backend(const cli_args *a) {
    const char *b = a->backend;
    if (!b) return kn_backend_default();   /* KN_BACKEND=cuda without a GPU: a warning, then the CPU */
    if (!strcmp(b, "cpu")) return kn_backend_cpu();
    if (!strcmp(b, "cuda")) {
#ifdef KN_CUDA
        kn_backend *g = kn_backend_cuda();
        if (!g) fprintf(stderr, "kiln: --backend cuda: %s\n", kn_last_error());
        return g;
#else
        fprintf(stderr, "kiln: --backend cuda: this kiln was built without CUDA; rebuild with `make CUDA=1` on a machine with nvcc\n");
        return NULL;
#endif
    }
    fprintf(stderr, "kiln: --backend must be cpu or cuda, got '%s'\n", b);
    return NULL;
}

kn_model *cli_load(const cli_args *a) {
    if (!a->model) { fprintf(stderr, "kiln: no model given (-m FILE)\n"); return NULL; }
    kn_backend *be = cli_pick_backend(a);
    if (!be) return NULL;
    kn_weight_dtype wd = KN_WEIGHTS_AUTO;
    if (a->gpu_dtype) {
        if (!strcmp(a->gpu_dtype, "bf16")) wd = KN_WEIGHTS_BF16;
        else if (!strcmp(a->gpu_dtype, "f16")) wd = KN_WEIGHTS_F16;
        else if (!strcmp(a->gpu_dtype, "f32")) wd = KN_WEIGHTS_F32;
        else if (!strcmp(a->gpu_dtype, "file")) wd = KN_WEIGHTS_FILE;
        else { fprintf(stderr, "kiln: --gpu-dtype must be bf16, f16, f32 or file, got '%s'\n", a->gpu_dtype); return NULL; }
        if (be->device == KN_DEVICE_HOST) {
            fprintf(stderr, "kiln: --gpu-dtype applies to --backend cuda; the %s backend uses the file's weights\n", kn_backend_name(be));
            return NULL;
        }
    }
    kn_model_opts o = {.tokenizer_path = a->tokenizer, .n_ctx = a->ctx, .n_batch = a->batch, .kv_f16 = a->kv_f16,
                       .backend = be, .weight_dtype = wd, .dist = a->dist};
    kn_model *m;
    if (kn_model_load(a->model, &o, &m) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return NULL; }
    return m;
}

bool cli_print_token(void *ud, int32_t tok, const char *text, size_t len) {
    (void)ud; (void)tok;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

bool cli_get_template(kn_model *m, const cli_args *a, kn_chat_tmpl *t) {
    kn_status st;
    if (a->tmpl) st = kn_chat_template_from_name(a->tmpl, t);
    else if (kn_model_chat_template(m)) {
        st = kn_chat_template_from_string(kn_model_chat_template(m), t);
        /* a template the interpreter refuses: its family, when its markers show one */
        if (st != KN_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", kn_last_error());
            if (kn_chat_template_family_of(kn_model_chat_template(m), t) == KN_OK) {
                static const char *const names[] = {"", "chatml", "llama2", "llama3", "plain"};
                fprintf(stderr, "kiln: the model's chat template cannot run here (%s); rendering the %s format instead\n",
                        why, names[t->format]);
                st = KN_OK;
            } else st = kn_set_error(st, "%s", why);
        }
    }
    else {
        /* base models and the ones kiln train makes carry none: plain text turns */
        fprintf(stderr, "kiln: the model has no chat template; using the plain one (\"User: ...\" lines; "
                        "--chat-template chatml|llama2|llama3|smollm chooses another)\n");
        st = kn_chat_template_from_name("plain", t);
    }
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
    /* the model's template sees its tokenizer's bos_token / eos_token */
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    if (st == KN_OK && t->format == KN_CHAT_JINJA && tok) {
        char bos[128] = "", eos[128] = "";
        size_t n;
        const char *p;
        if (kn_tokenizer_bos(tok) >= 0 && (p = kn_tokenizer_token_text(tok, kn_tokenizer_bos(tok), &n)) && n < sizeof bos)
            { memcpy(bos, p, n); bos[n] = 0; }
        if (kn_tokenizer_eos(tok) >= 0 && (p = kn_tokenizer_token_text(tok, kn_tokenizer_eos(tok), &n)) && n < sizeof eos)
            { memcpy(eos, p, n); eos[n] = 0; }
        kn_chat_template_set_tokens(t, bos, eos);
    }
    return st == KN_OK;
}

char *cli_render(const kn_chat_tmpl *t, const kn_chat_msg *msgs, size_t n) {
    size_t need = 0;
    kn_chat_apply(t, msgs, n, true, NULL, 0, &need);
    char *buf = malloc(need + 1);
    if (buf && kn_chat_apply(t, msgs, n, true, buf, need + 1, &need) != KN_OK) { free(buf); return NULL; }
    return buf;
}

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool cli_show_progress(void *ud, int done, int total) {
    cli_progress *p = ud;
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    if (done == 0) { p->t0 = cli_now_s(); p->shown = false; }
    if (tty && done < total && cli_now_s() - p->t0 >= 1.0) {
        fprintf(stderr, "\rprompt: %d/%d tokens (%d%%)", done, total, (int)(100.0 * done / total));
        fflush(stderr);
        p->shown = true;
    }
    if (p->shown && (done == total || (p->cancel && *p->cancel))) {
        fprintf(stderr, "\r\033[K");      /* erase the line: the reply starts clean */
        fflush(stderr);
        p->shown = false;
    }
    return !(p->cancel && *p->cancel);
}
