/* ctx.c: contexts own tensor descriptors (an arena freed in one call) and
 * the plan symbols (dynamic sizes); kn__fail, the sticky error of a context.
 * kn_ctx_new itself is in src/runtime/registry.c: it picks the default
 * backend, which core cannot know about (layers only point down). */
#include "core/core.h"
#include "core/env.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_TENSORS 256
struct kn_arena_chunk { kn_arena_chunk *next; int used; kn_tensor t[CHUNK_TENSORS]; };

kn_ctx *kn__ctx_new_on(kn_backend *be) {
    kn_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) { kn_set_error(KN_ERR_NOMEM, "out of memory creating a context"); return NULL; }
    ctx->be = be;
    return ctx;
}

kn_tensor *kn__fail(kn_ctx *ctx, kn_status s, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kn_set_error(s, "%s", msg);
    if (ctx && ctx->status == KN_OK) ctx->status = s;
    if (kn_env_get()->debug) fprintf(stderr, "kiln: %s\n", msg);
    return NULL;
}

static void drop_tensors(kn_ctx *ctx) {
    for (int32_t i = 0; i < ctx->n_all; i++) {
        kn_tensor *t = ctx->all[i];
        kn_buffer_release(t->buf);
        t->buf = NULL;
        t->magic = 0xdeadbeefu;
    }
}

void kn_ctx_free(kn_ctx *ctx) {
    if (!ctx) return;
    drop_tensors(ctx);
    for (kn_arena_chunk *c = ctx->chunks, *n; c; c = n) { n = c->next; free(c); }
    free(ctx->all);
    free(ctx);
}

void kn_ctx_reset(kn_ctx *ctx) {
    if (!ctx) return;
    drop_tensors(ctx);
    /* descriptors stay allocated (marked dead) so stale pointers are detected,
     * not dereferenced into freed memory; new tensors take fresh slots. */
    ctx->status = KN_OK;
    ctx->no_grad = 0;
}

kn_status kn_ctx_status(const kn_ctx *ctx) { return ctx ? ctx->status : KN_ERR_INVALID; }
void kn_ctx_clear_status(kn_ctx *ctx) { if (ctx) ctx->status = KN_OK; }
kn_backend *kn_ctx_backend(const kn_ctx *ctx) { return ctx->be; }
size_t kn_ctx_n_tensors(const kn_ctx *ctx) { return ctx ? (size_t)ctx->n_all : 0; }
void kn_no_grad_begin(kn_ctx *ctx) { ctx->no_grad++; }
void kn_no_grad_end(kn_ctx *ctx) { if (ctx->no_grad > 0) ctx->no_grad--; }

/* A zeroed descriptor from the arena, registered in ctx->all. */
kn_tensor *kn__alloc_tensor(kn_ctx *ctx) {
    if (!ctx->chunks || ctx->chunks->used == CHUNK_TENSORS) {
        kn_arena_chunk *c = calloc(1, sizeof *c);
        if (!c) return NULL;
        c->next = ctx->chunks;
        ctx->chunks = c;
    }
    if (ctx->n_all == ctx->cap_all) {
        int32_t cap = ctx->cap_all ? ctx->cap_all * 2 : 1024;
        kn_tensor **a = realloc(ctx->all, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        ctx->all = a; ctx->cap_all = cap;
    }
    kn_tensor *t = &ctx->chunks->t[ctx->chunks->used++];
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->id = ctx->n_all;
    t->magic = KN_TENSOR_MAGIC;
    ctx->all[ctx->n_all++] = t;
    return t;
}

/* ---- symbols ---- */
int kn_sym_new(kn_ctx *ctx, const char *name, int64_t max) {
    if (ctx->n_syms >= KN_MAX_SYMS) {
        kn__fail(ctx, KN_ERR_LIMIT, "kn_sym_new: at most %d symbols per context", KN_MAX_SYMS);
        return 0;
    }
    if (max < 1) { kn__fail(ctx, KN_ERR_INVALID, "kn_sym_new(%s): max must be >= 1, got %lld", name ? name : "", (long long)max); return 0; }
    int s = ++ctx->n_syms;
    ctx->sym_max[s] = ctx->sym_val[s] = max;
    snprintf(ctx->sym_name[s], sizeof ctx->sym_name[s], "%s", name ? name : "s");
    return s;
}

kn_status kn_sym_set(kn_ctx *ctx, int sym, int64_t value) {
    if (sym < 1 || sym > ctx->n_syms)
        return kn_set_error(KN_ERR_INVALID, "kn_sym_set: no symbol %d in this context", sym);
    if (value < 1 || value > ctx->sym_max[sym])
        return kn_set_error(KN_ERR_LIMIT, "kn_sym_set: symbol '%s' = %lld is outside [1, %lld], the maximum it was declared with",
                            ctx->sym_name[sym], (long long)value, (long long)ctx->sym_max[sym]);
    ctx->sym_val[sym] = value;
    return KN_OK;
}

int64_t kn_sym_value(const kn_ctx *ctx, int sym) {
    return (sym >= 1 && sym <= ctx->n_syms) ? ctx->sym_val[sym] : -1;
}
