/* cli_common.c: model loading and the helpers every subcommand shares (cli.h). */
#include "cli.h"
#include "llm/mapfile.h"   /* defines: kn_open_regular */
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
        else { fprintf(stderr, "kiln: --gpu-dtype must be bf16, f16 or f32, got '%s'\n", a->gpu_dtype); return NULL; }
        if (be->device == KN_DEVICE_HOST) {
            fprintf(stderr, "kiln: --gpu-dtype applies to --backend cuda; the %s backend uses the file's weights\n", kn_backend_name(be));
            return NULL;
        }
    }
    kn_model_opts o = {.tokenizer_path = a->tokenizer, .n_ctx = a->ctx, .n_batch = a->batch, .kv_f16 = a->kv_f16,
                       .backend = be, .weight_dtype = wd};
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
    else if (kn_model_chat_template(m)) st = kn_chat_template_from_string(kn_model_chat_template(m), t);
    else st = kn_set_error(KN_ERR_UNSUPPORTED, "the model file has no chat template; choose one with --chat-template chatml|llama2|llama3");
    if (st) fprintf(stderr, "kiln: %s\n", kn_last_error());
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

char *cli_read_file(const char *opt, const char *path, size_t *len) {
    *len = 0;
    int fd;
    uint64_t size;
    if (kn_open_regular(path, "file", &fd, &size) != KN_OK) {
        fprintf(stderr, "kiln: %s: %s\n", opt, kn_last_error());
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    char *buf = f && size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!buf) {
        fprintf(stderr, "kiln: %s: out of memory reading '%s' (%llu bytes)\n", opt, path, (unsigned long long)size);
        if (f) fclose(f); else close(fd);
        return NULL;
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    bool err = ferror(f) != 0;
    fclose(f);
    if (err) {
        fprintf(stderr, "kiln: %s: cannot read '%s'\n", opt, path);
        free(buf);
        return NULL;
    }
    buf[got] = 0;
    *len = got;
    return buf;
}
