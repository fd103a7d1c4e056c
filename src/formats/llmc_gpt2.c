/* llmc_gpt2.c: llm.c GPT-2 checkpoint reader and writer (see llmc_gpt2.h). */
#include "formats/llmc_gpt2.h"
#include "formats/mapfile.h"   /* defines: kn_mapfile_open, kn_mapfile_close */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_MAX_FIELD (1 << 24)

struct kn_llmc_gpt2 {
    kn_mapfile *file;
    kn_llmc_gpt2_config cfg;
    kn_dtype dtype;
    int64_t numel;
    kn_llmc_gpt2_tensor p[KN_GPT2_NPARAMS];
};

static const char *g_names[KN_GPT2_NPARAMS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

kn_status kn_llmc_gpt2_shapes(const kn_llmc_gpt2_config *c, kn_llmc_gpt2_tensor out[KN_GPT2_NPARAMS],
                              int64_t *numel) {
    if (!c || !out) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_shapes: NULL argument");
    const int f[6] = {c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->n_layers, c->n_heads, c->channels};
    static const char *fn[6] = {"maxT", "V", "Vp", "L", "NH", "C"};
    for (int i = 0; i < 6; i++)
        if (f[i] <= 0 || f[i] > GPT2_MAX_FIELD)
            return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: %s = %d is out of range (1..%d)", fn[i], f[i], GPT2_MAX_FIELD);
    if (c->padded_vocab_size < c->vocab_size)
        return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: padded vocab Vp = %d is smaller than V = %d",
                            c->padded_vocab_size, c->vocab_size);
    if (c->channels % c->n_heads != 0)
        return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: NH = %d does not divide C = %d", c->n_heads, c->channels);
    int64_t C = c->channels, L = c->n_layers, T = c->max_seq_len, Vp = c->padded_vocab_size;
    /* every field <= 2^24, so 3C and 4C fit; the products are checked below */
    const int64_t sh[KN_GPT2_NPARAMS][4] = {
        {2, Vp, C, 0}, {2, T, C, 0}, {2, L, C, 0}, {2, L, C, 0}, {3, L, 3 * C, C}, {2, L, 3 * C, 0},
        {3, L, C, C}, {2, L, C, 0}, {2, L, C, 0}, {2, L, C, 0}, {3, L, 4 * C, C}, {2, L, 4 * C, 0},
        {3, L, C, 4 * C}, {2, L, C, 0}, {1, C, 0, 0}, {1, C, 0, 0},
    };
    int64_t total = 0;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
        kn_llmc_gpt2_tensor *t = &out[i];
        memset(t, 0, sizeof *t);
        t->name = g_names[i];
        t->ndim = (int)sh[i][0];
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = sh[i][1 + d];
            if (t->numel > INT64_MAX / t->shape[d])
                return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: parameter %s size overflows", t->name);
            t->numel *= t->shape[d];
        }
        if (total > INT64_MAX - t->numel)
            return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: parameter count overflows");
        total += t->numel;
    }
    if (numel) *numel = total;
    return KN_OK;
}

static int32_t rd_i32(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

void kn_llmc_gpt2_close(kn_llmc_gpt2 *m) {
    if (!m) return;
    kn_mapfile_close(m->file);
    free(m);
}

kn_status kn_llmc_gpt2_open_memory(const void *data, size_t size, kn_llmc_gpt2 **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_open_memory: out is NULL");
    *out = NULL;
    if (!data) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_open_memory: data is NULL");
    if ((uintptr_t)data % 4 != 0)
        return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_open_memory: data must be 4-byte aligned");
    const uint8_t *b = data;
    const size_t hdr = KN_LLMC_GPT2_HEADER_INTS * 4;
    if (size < hdr)
        return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: file has %zu bytes, less than the %zu-byte header", size, hdr);
    int32_t magic = rd_i32(b), version = rd_i32(b + 4);
    if (magic != KN_LLMC_GPT2_MAGIC)
        return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: bad magic %d (expected %d); not an llm.c model file "
                            "(tokenizer files use 20240328, state files 20240327)", (int)magic, KN_LLMC_GPT2_MAGIC);
    kn_dtype dt;
    if (version == 3) dt = KN_F32;
    else if (version == 5) dt = KN_BF16;
    else
        return kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: version %d is not supported (3 = fp32, 5 = bf16); "
                            "re-export the model with llm.c's train_gpt2.py", (int)version);
    kn_llmc_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return kn_set_error(KN_ERR_NOMEM, "out of memory opening an llm.c checkpoint");
    m->dtype = dt;
    kn_llmc_gpt2_config *c = &m->cfg;
    c->max_seq_len = rd_i32(b + 8);
    c->vocab_size = rd_i32(b + 12);
    c->n_layers = rd_i32(b + 16);
    c->n_heads = rd_i32(b + 20);
    c->channels = rd_i32(b + 24);
    c->padded_vocab_size = rd_i32(b + 28);
    kn_status s = kn_llmc_gpt2_shapes(c, m->p, &m->numel);
    if (s != KN_OK) { kn_llmc_gpt2_close(m); return s; }
    size_t es = kn_dtype_get(dt)->type_size;
    uint64_t need = (uint64_t)m->numel > (UINT64_MAX - hdr) / es ? UINT64_MAX - hdr : (uint64_t)m->numel * es;
    if (need != size - hdr) {
        kn_status e = kn_set_error(KN_ERR_FORMAT, "llm.c GPT-2: file has %zu bytes but the header (maxT %d, V %d, "
                                   "Vp %d, L %d, NH %d, C %d, %s) implies %llu; the file is truncated or corrupt",
                                   size, c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->n_layers,
                                   c->n_heads, c->channels, kn_dtype_name(dt), (unsigned long long)(need + hdr));
        kn_llmc_gpt2_close(m);
        return e;
    }
    size_t off = hdr;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
        m->p[i].data = b + off;
        m->p[i].nbytes = (size_t)m->p[i].numel * es;
        off += m->p[i].nbytes;
    }
    *out = m;
    return KN_OK;
}

kn_status kn_llmc_gpt2_open(const char *path, kn_llmc_gpt2 **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_open: out is NULL");
    *out = NULL;
    kn_mapfile *f;
    kn_status s = kn_mapfile_open(path, &f);
    if (s != KN_OK) return s;
    kn_llmc_gpt2 *m = NULL;
    s = kn_llmc_gpt2_open_memory(f->data, f->size, &m);
    if (s != KN_OK) return kn_mapfile_fail(f, path, s);
    m->file = f;
    *out = m;
    return KN_OK;
}

const kn_llmc_gpt2_config *kn_llmc_gpt2_config_of(const kn_llmc_gpt2 *m) { return m ? &m->cfg : NULL; }
kn_dtype kn_llmc_gpt2_dtype(const kn_llmc_gpt2 *m) { return m ? m->dtype : KN_F32; }
int64_t kn_llmc_gpt2_numel(const kn_llmc_gpt2 *m) { return m ? m->numel : 0; }
const kn_llmc_gpt2_tensor *kn_llmc_gpt2_param(const kn_llmc_gpt2 *m, kn_gpt2_param p) {
    return (m && (unsigned)p < KN_GPT2_NPARAMS) ? &m->p[p] : NULL;
}

kn_status kn_llmc_gpt2_write(const char *path, const kn_llmc_gpt2_config *c, kn_dtype dtype,
                             const void *const params[KN_GPT2_NPARAMS]) {
    if (!path || !c || !params) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_write: NULL argument");
    if (dtype != KN_F32 && dtype != KN_BF16)
        return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_write: dtype %s is not supported (f32 or bf16)",
                            kn_dtype_name(dtype));
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    kn_status s = kn_llmc_gpt2_shapes(c, sh, NULL);
    if (s != KN_OK) return s;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++)
        if (!params[i]) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_write: parameter %s is NULL", sh[i].name);
    uint8_t hdr[KN_LLMC_GPT2_HEADER_INTS * 4] = {0};
    const int32_t h[8] = {KN_LLMC_GPT2_MAGIC, dtype == KN_F32 ? 3 : 5, c->max_seq_len, c->vocab_size,
                          c->n_layers, c->n_heads, c->channels, c->padded_vocab_size};
    for (int i = 0; i < 8; i++) {
        uint32_t u;
        memcpy(&u, &h[i], 4);
        for (int k = 0; k < 4; k++) hdr[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return kn_set_error(KN_ERR_NOMEM, "out of memory writing '%s'", path);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        s = kn_set_error(KN_ERR_IO, "cannot create '%s'; check the directory exists and is writable", tmp);
        free(tmp);
        return s;
    }
    size_t es = kn_dtype_get(dtype)->type_size;
    bool ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr;
    for (int i = 0; ok && i < KN_GPT2_NPARAMS; i++) {
        size_t nb = (size_t)sh[i].numel * es;
        ok = fwrite(params[i], 1, nb, f) == nb;
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) s = kn_set_error(KN_ERR_IO, "writing '%s' failed (disk full?)", tmp);
    else if (rename(tmp, path) != 0) s = kn_set_error(KN_ERR_IO, "cannot rename '%s' to '%s'", tmp, path);
    if (s != KN_OK) remove(tmp);
    free(tmp);
    return s;
}

kn_status kn_llmc_gpt2_write_flat(const char *path, const kn_llmc_gpt2_config *c, kn_dtype dtype,
                                  const void *params) {
    if (!params || !c) return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_write_flat: NULL argument");
    if (dtype != KN_F32 && dtype != KN_BF16)
        return kn_set_error(KN_ERR_INVALID, "kn_llmc_gpt2_write_flat: dtype %s is not supported (f32 or bf16)",
                            kn_dtype_name(dtype));
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    kn_status s = kn_llmc_gpt2_shapes(c, sh, NULL);
    if (s != KN_OK) return s;
    const void *ptrs[KN_GPT2_NPARAMS];
    size_t es = kn_dtype_get(dtype)->type_size, off = 0;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
        ptrs[i] = (const uint8_t *)params + off;
        off += (size_t)sh[i].numel * es;
    }
    return kn_llmc_gpt2_write(path, c, dtype, ptrs);
}
