/* model_weights.c: what every model loader (model.c, model_hf.c,
 * model_ckpt.c) shares: weights wrapped or converted into kiln tensors, the
 * memory a model owns, error prefixes, a file's magic bytes and loading the
 * tokenizer. A file of its own so that model.c, which dispatches to the
 * loaders, and the loaders do not call each other in a circle. */
#include "llm/model_impl.h"     /* defines: struct kn_model */
#include "core/fp16.h"          /* defines: kn_fp16_to_fp32, kn_bf16_to_fp32 */
#include "formats/gguf.h"       /* defines: kn_gguf_open, kn_gguf_get_str */
#include "formats/mapfile.h"    /* defines: kn_open_regular */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- weights ------------------------------------------------------------------ */
kn_tensor *kn__model_wrap(kn_model *m, kn_dtype dt, int64_t rows, int64_t cols, const void *data, const char *name) {
    int64_t shape[2] = {rows, cols};
    kn_tensor *t = rows == 1 ? kn_from_ptr(m->ctx, dt, 1, &shape[1], (void *)data)
                             : kn_from_ptr(m->ctx, dt, 2, shape, (void *)data);
    if (t) {
        kn_set_name(t, name);
        kn_set_constant(t);          /* a model's weights never change: a backend may keep a packed copy */
    }
    return t;
}

void *kn__model_alloc(kn_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 32;
        void **o = realloc(m->owned, sizeof *o * (size_t)cap);
        if (!o) { kn_set_error(KN_ERR_NOMEM, "out of memory"); return NULL; }
        m->owned = o; m->cap_owned = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) { kn_set_error(KN_ERR_NOMEM, "out of memory for %zu bytes of converted weights", bytes); return NULL; }
    m->owned[m->n_owned++] = p;
    return p;
}

void *kn__lazy_alloc(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
void kn__lazy_free(void *p, size_t bytes) { if (p) munmap(p, bytes ? bytes : 1); }

kn_status kn__model_err_prefix(kn_status st, const char *prefix) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", kn_last_error());
    return kn_set_error(st, "%s: %s", prefix, msg);
}

static void wrap_fail(kn_model *m, const char *name) {
    char pre[160];
    snprintf(pre, sizeof pre, "tensor '%s'", name);
    kn__model_err_prefix(kn_ctx_status(m->ctx) ? kn_ctx_status(m->ctx) : KN_ERR_NOMEM, pre);
}

double kn__model_elem_f64(kn_dtype dt, const void *data, int64_t i) {
    uint16_t h;
    switch (dt) {
    case KN_F16: memcpy(&h, (const char *)data + 2 * i, 2); return kn_fp16_to_fp32(h);
    case KN_BF16: memcpy(&h, (const char *)data + 2 * i, 2); return kn_bf16_to_fp32(h);
    default: { float f; memcpy(&f, (const char *)data + 4 * i, 4); return f; }
    }
}

kn_tensor *kn__model_mat(kn_model *m, kn_dtype dt, int64_t out, int64_t in, const void *data, bool in_out,
                         const char *name) {
    size_t es = kn_dtype_get(dt)->type_size;
    bool quant = kn_dtype_get(dt)->is_quant;
    if (in_out && !kn__model_half_or_f32(dt)) {
        kn_set_error(KN_ERR_UNSUPPORTED, "tensor '%s': %s weights stored [in, out] are not supported; use f32/f16/bf16",
                     name, kn_dtype_name(dt));
        return NULL;
    }
    if (!in_out) {
        if (!quant && (uintptr_t)data % es) {         /* safetensors data need not be aligned */
            size_t nb = kn_dtype_nbytes(dt, out * in);
            void *p = kn__model_alloc(m, nb);
            if (!p) return NULL;
            memcpy(p, data, nb);
            data = p;
        }
        kn_tensor *t = kn__model_wrap(m, dt, out, in, data, name);
        if (!t) wrap_fail(m, name);
        return t;
    }
    /* [in, out] in the file */
    if (dt == KN_F32 && (uintptr_t)data % 4 == 0) {
        kn_tensor *t = kn__model_wrap(m, dt, in, out, data, name);
        kn_tensor *v = t ? kn_transpose(m->ctx, t, 0, 1) : NULL;      /* a view: no copy */
        if (!v) wrap_fail(m, name);
        return v;
    }
    /* f16/bf16 (or misaligned f32): a transposed copy, so each output row is
     * contiguous as the CPU backend's half-precision matmul requires */
    char *p = kn__model_alloc(m, es * (size_t)(out * in));
    if (!p) return NULL;
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            memcpy(p + es * (size_t)(o * in + i), (const char *)data + es * (size_t)(i * out + o), es);
    kn_tensor *t = kn__model_wrap(m, dt, out, in, p, name);
    if (!t) wrap_fail(m, name);
    return t;
}

kn_tensor *kn__model_f32(kn_model *m, kn_dtype dt, int64_t rows, int64_t n, const void *data, const char *name) {
    if (!kn__model_half_or_f32(dt)) {
        kn_set_error(KN_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; norms, biases and position embeddings must be f32, f16 or bf16",
                     name, kn_dtype_name(dt));
        return NULL;
    }
    const void *src = data;
    int64_t numel = (rows ? rows : 1) * n;
    if (dt != KN_F32 || (uintptr_t)data % 4) {
        float *p = kn__model_alloc(m, sizeof(float) * (size_t)numel);
        if (!p) return NULL;
        for (int64_t i = 0; i < numel; i++) p[i] = (float)kn__model_elem_f64(dt, data, i);
        src = p;
    }
    int64_t shape[2] = {rows, n};
    kn_tensor *t = rows ? kn_from_ptr(m->ctx, KN_F32, 2, shape, (void *)src) : kn_from_ptr(m->ctx, KN_F32, 1, &shape[1], (void *)src);
    if (t) kn_set_name(t, name);
    if (!t) wrap_fail(m, name);
    return t;
}

/* The first 12 bytes of a regular file (zeros past its end). On failure the
 * message names `what` and the system's reason; errno is that reason. */
kn_status kn__model_file_magic(const char *path, const char *what, unsigned char mg[12], size_t *got) {
    int fd;
    uint64_t size;
    kn_status st = kn_open_regular(path, what, &fd, &size);
    if (st) return st;
    memset(mg, 0, 12);
    ssize_t r;
    do r = read(fd, mg, 12); while (r < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (r < 0) return kn_set_error(KN_ERR_IO, "cannot read %s '%s': %s", what, path, strerror(e));
    *got = (size_t)r;
    return KN_OK;
}

/* Hugging Face tokenizer.json (a file, or the directory holding it) with
 * tokenizer_config.json beside it; the model's chat template, when it has
 * none yet, is chat_template.jinja beside them (newer downloads keep it
 * there) or else tokenizer_config.json's. */
kn_status kn__model_load_hf_tokenizer(kn_model *m, const char *path_or_dir) {
    kn_status st = kn_tokenizer_load_hf(path_or_dir, &m->tok);
    if (st) return st;
    size_t pl = strlen(path_or_dir);
    bool dir = kn__is_dir(path_or_dir);
    const char *slash = strrchr(path_or_dir, '/');
    int dl = dir ? (int)pl : slash ? (int)(slash - path_or_dir) : -1;   /* the directory part, -1: none */
    char *cj = m->chat_template ? NULL : malloc(pl + 32);
    if (cj) snprintf(cj, pl + 32, "%.*s%schat_template.jinja", dl < 0 ? 0 : dl, path_or_dir, dl < 0 ? "" : "/");
    FILE *f = cj ? fopen(cj, "rb") : NULL;
    free(cj);
    if (f) {
        long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        if (n >= 0 && n < (16L << 20) && fseek(f, 0, SEEK_SET) == 0 && (m->chat_template = malloc((size_t)n + 1))) {
            if (fread(m->chat_template, 1, (size_t)n, f) == (size_t)n) m->chat_template[n] = 0;
            else { free(m->chat_template); m->chat_template = NULL; }
        }
        fclose(f);
    }
    const char *ct = kn_tokenizer_chat_template(m->tok);
    if (ct && !m->chat_template && (m->chat_template = malloc(strlen(ct) + 1))) strcpy(m->chat_template, ct);
    return KN_OK;
}

/* a JSON object's first byte (after whitespace): tokenizer.json */
static bool json_magic(const unsigned char *mg, size_t got) {
    size_t i = 0;
    while (i < got && (mg[i] == ' ' || mg[i] == '\t' || mg[i] == '\n' || mg[i] == '\r')) i++;
    return i < got && mg[i] == '{';
}

kn_status kn__model_load_tokenizer(kn_model *m, const char *path) {
    unsigned char mg[12];
    size_t got = 0;
    kn_status st;
    bool dir = kn__is_dir(path);
    if (!dir && (st = kn__model_file_magic(path, "tokenizer file", mg, &got))) return st;
    int32_t magic = 0;
    if (!dir) memcpy(&magic, mg, 4);
    if (dir) {                               /* a Hugging Face model directory */
        size_t pl = strlen(path);
        char *tj = malloc(pl + 16);
        if (!tj) return kn_set_error(KN_ERR_NOMEM, "out of memory");
        snprintf(tj, pl + 16, "%s/tokenizer.json", path);
        bool have = access(tj, F_OK) == 0;
        free(tj);
        if (!have)
            return kn_set_error(KN_ERR_IO, "tokenizer '%s' is a directory without a tokenizer.json; pass a tokenizer "
                                "file or a Hugging Face model directory", path);
        st = kn__model_load_hf_tokenizer(m, path);
    } else if (json_magic(mg, got)) {
        st = kn__model_load_hf_tokenizer(m, path);
    } else if (got >= 4 && !memcmp(mg, "GGUF", 4)) {
        kn_gguf *g;
        if ((st = kn_gguf_open(path, &g))) return st;
        st = kn_tokenizer_from_gguf(g, &m->tok);
        kn_gguf_str s;
        if (!st && !m->chat_template && kn_gguf_get_str(g, "tokenizer.chat_template", &s)) {
            m->chat_template = malloc(s.len + 1);
            if (m->chat_template) { memcpy(m->chat_template, s.ptr, s.len); m->chat_template[s.len] = 0; }
        }
        kn_gguf_close(g);
    } else if (got >= 4 && magic == 20240328) {
        st = kn_tokenizer_load_llmc(path, &m->tok);          /* decode only: kn_tokenize says so */
    } else {
        st = kn_tokenizer_load_llama2c(path, m->cfg.n_vocab, &m->tok);
    }
    if (st) return st;
    int tv = kn_tokenizer_n_vocab(m->tok);
    if (tv > m->cfg.n_vocab) {
        kn_tokenizer_free(m->tok);
        m->tok = NULL;
        return kn_set_error(KN_ERR_FORMAT, "tokenizer %s has %d tokens but the model's vocabulary has only %d; "
                            "pass the tokenizer that belongs to this model", path, tv, m->cfg.n_vocab);
    }
    return KN_OK;
}
