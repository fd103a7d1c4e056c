/* llama2c.c: llama2.c checkpoint reader (see llama2c.h for the layouts). */
#include "formats/llama2c.h"
#include "formats/mapfile.h"   /* defines: kn_mapfile_open, kn_mapfile_close */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L2C_HEADER_V 256      /* versioned header size                         */
#define L2C_MAX_DIM (1 << 24) /* sanity cap on every header field              */

struct kn_llama2c {
    kn_mapfile *file;
    const uint8_t *base;
    size_t size;
    kn_llama2c_config cfg;
    kn_llama2c_weight w[KN_L2C_COUNT];
};

static const char *g_names[KN_L2C_COUNT] = {
    "token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls",
};

static int32_t rd_i32(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

/* Overflow-checked a*b and a+b on uint64 (sticky failure flag). */
static uint64_t mul(uint64_t a, uint64_t b, bool *ovf) {
    if (a && b > UINT64_MAX / a) { *ovf = true; return 0; }
    return a * b;
}
static uint64_t add(uint64_t a, uint64_t b, bool *ovf) {
    if (b > UINT64_MAX - a) { *ovf = true; return 0; }
    return a + b;
}

/* Place weight `id` at byte offset *off: n copies of rows x cols, fp32 or (q8) int8+scales. */
static void place(kn_llama2c *m, kn_llama2c_wid id, int n, int64_t rows, int64_t cols, bool q8,
                  uint64_t *off, bool *ovf) {
    kn_llama2c_weight *w = &m->w[id];
    uint64_t numel = mul((uint64_t)rows, (uint64_t)cols, ovf);
    w->name = g_names[id];
    w->dtype = q8 ? KN_I8 : KN_F32;
    w->n_layers = n;
    w->rows = rows;
    w->cols = cols;
    uint64_t vbytes = q8 ? numel : mul(numel, 4, ovf);
    uint64_t stride = q8 ? add(numel, mul(numel / (uint64_t)m->cfg.group_size, 4, ovf), ovf) : vbytes;
    w->nbytes = (size_t)vbytes;
    w->layer_stride = (size_t)stride;
    uint64_t total = mul(stride, (uint64_t)n, ovf);
    /* pointers only into the file: with n == 0 copies `total` is 0 while
     * vbytes may still be large, so check the scales' offset on its own */
    uint64_t end = add(*off, total, ovf);      /* add() returns 0 on overflow: test ovf after it */
    if (!*ovf && end <= m->size) {
        w->data = m->base + *off;
        bool scales_in = q8 && *off <= m->size && vbytes <= m->size - *off;
        w->scales = scales_in ? (const float *)(const void *)(m->base + *off + vbytes) : NULL;
    }
    *off = add(*off, total, ovf);
}

#define FAIL(...) return kn_set_error(KN_ERR_FORMAT, __VA_ARGS__)

static kn_status parse(kn_llama2c *m) {
    kn_llama2c_config *c = &m->cfg;
    const uint8_t *b = m->base;
    size_t hdr;
    int32_t h[7];
    if (m->size >= 8 && (uint32_t)rd_i32(b) == KN_LLAMA2C_MAGIC) {
        int32_t version = rd_i32(b + 4);
        if (version != 1 && version != 2)
            FAIL("llama2.c checkpoint has version %d; kiln reads versions 1 (fp32) and 2 (int8) and the "
                 "legacy headerless format", (int)version);
        if (m->size < L2C_HEADER_V)
            FAIL("llama2.c v%d checkpoint: file has %zu bytes, less than the %d-byte header; the file is truncated",
                 (int)version, m->size, L2C_HEADER_V);
        for (int i = 0; i < 7; i++) h[i] = rd_i32(b + 8 + 4 * i);
        uint8_t shared = b[36];
        if (shared > 1) FAIL("llama2.c v%d checkpoint: shared_classifier flag at byte 36 is %u (must be 0 or 1)",
                             (int)version, shared);
        c->shared_classifier = shared;
        c->version = version;
        if (version == 2) {
            int32_t gs = rd_i32(b + 37);
            if (gs <= 0 || gs % 4 != 0)
                FAIL("llama2.c v2 checkpoint: group size %d at byte 37 is not a positive multiple of 4", (int)gs);
            c->group_size = gs;
        }
        if (h[5] <= 0) FAIL("llama2.c v%d checkpoint: vocab_size %d must be positive", (int)version, (int)h[5]);
        hdr = L2C_HEADER_V;
    } else {
        if (m->size < 28)
            FAIL("llama2.c checkpoint: file has %zu bytes, less than the 28-byte legacy header", m->size);
        for (int i = 0; i < 7; i++) h[i] = rd_i32(b + 4 * i);
        c->version = 0;
        c->shared_classifier = h[5] > 0;
        if (h[5] == INT32_MIN) FAIL("llama2.c checkpoint: vocab_size %d is invalid", (int)h[5]);
        if (h[5] < 0) h[5] = -h[5];
        hdr = 28;
    }
    static const char *fn[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (h[i] <= 0 || h[i] > L2C_MAX_DIM)
            FAIL("llama2.c checkpoint: %s = %d is out of range (1..%d); this is not a llama2.c checkpoint "
                 "or it is corrupt", fn[i], (int)h[i], L2C_MAX_DIM);
    c->dim = h[0]; c->hidden_dim = h[1]; c->n_layers = h[2]; c->n_heads = h[3];
    c->n_kv_heads = h[4]; c->vocab_size = h[5]; c->seq_len = h[6];
    if (c->dim % c->n_heads != 0)
        FAIL("llama2.c checkpoint: n_heads %d does not divide dim %d", c->n_heads, c->dim);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        FAIL("llama2.c checkpoint: n_kv_heads %d does not divide n_heads %d", c->n_kv_heads, c->n_heads);
    c->head_size = c->dim / c->n_heads;
    c->kv_dim = c->head_size * c->n_kv_heads;

    int64_t D = c->dim, H = c->hidden_dim, KV = c->kv_dim, V = c->vocab_size;
    int L = c->n_layers;
    uint64_t off = hdr;
    bool ovf = false;
    if (c->version == 0) {
        place(m, KN_L2C_TOKEN_EMBEDDING, 1, V, D, false, &off, &ovf);
        place(m, KN_L2C_RMS_ATT, L, 1, D, false, &off, &ovf);
        place(m, KN_L2C_WQ, L, D, D, false, &off, &ovf);
        place(m, KN_L2C_WK, L, KV, D, false, &off, &ovf);
        place(m, KN_L2C_WV, L, KV, D, false, &off, &ovf);
        place(m, KN_L2C_WO, L, D, D, false, &off, &ovf);
        place(m, KN_L2C_RMS_FFN, L, 1, D, false, &off, &ovf);
        place(m, KN_L2C_W1, L, H, D, false, &off, &ovf);
        place(m, KN_L2C_W2, L, D, H, false, &off, &ovf);
        place(m, KN_L2C_W3, L, H, D, false, &off, &ovf);
        place(m, KN_L2C_RMS_FINAL, 1, 1, D, false, &off, &ovf);
        /* freq_cis_real and freq_cis_imag: seq_len * head_size/2 floats each */
        off = add(off, mul(mul((uint64_t)c->seq_len, (uint64_t)(c->head_size / 2), &ovf), 8, &ovf), &ovf);
        if (!c->shared_classifier) place(m, KN_L2C_WCLS, 1, V, D, false, &off, &ovf);
    } else {
        bool q = c->version == 2;
        place(m, KN_L2C_RMS_ATT, L, 1, D, false, &off, &ovf);
        place(m, KN_L2C_RMS_FFN, L, 1, D, false, &off, &ovf);
        place(m, KN_L2C_RMS_FINAL, 1, 1, D, false, &off, &ovf);
        place(m, KN_L2C_TOKEN_EMBEDDING, 1, V, D, q, &off, &ovf);
        place(m, KN_L2C_WQ, L, D, D, q, &off, &ovf);
        place(m, KN_L2C_WK, L, KV, D, q, &off, &ovf);
        place(m, KN_L2C_WV, L, KV, D, q, &off, &ovf);
        place(m, KN_L2C_WO, L, D, D, q, &off, &ovf);
        place(m, KN_L2C_W1, L, H, D, q, &off, &ovf);
        place(m, KN_L2C_W2, L, D, H, q, &off, &ovf);
        place(m, KN_L2C_W3, L, H, D, q, &off, &ovf);
        if (!c->shared_classifier) place(m, KN_L2C_WCLS, 1, V, D, q, &off, &ovf);
        if (q) {
            static const kn_llama2c_wid mats[] = {KN_L2C_TOKEN_EMBEDDING, KN_L2C_WQ, KN_L2C_WK, KN_L2C_WV,
                                                  KN_L2C_WO, KN_L2C_W1, KN_L2C_W2, KN_L2C_W3};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
                const kn_llama2c_weight *w = &m->w[mats[i]];
                if ((w->rows * w->cols) % c->group_size != 0)
                    FAIL("llama2.c v2 checkpoint: %s has %lld values, not a multiple of the group size %d",
                         w->name, (long long)(w->rows * w->cols), c->group_size);
            }
        }
    }
    if (ovf)
        FAIL("llama2.c checkpoint: the header (dim %d, hidden %d, %d layers, vocab %d, seq %d) implies a size "
             "that overflows; the file is corrupt", c->dim, c->hidden_dim, c->n_layers, c->vocab_size, c->seq_len);
    if (off != m->size)
        FAIL("llama2.c v%d checkpoint: file has %zu bytes but the header (dim %d, hidden %d, %d layers, %d heads, "
             "%d kv heads, vocab %d%s, seq %d) implies %llu; the file is truncated, has extra data, or is not a "
             "llama2.c checkpoint", c->version, m->size, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
             c->n_kv_heads, c->vocab_size, c->shared_classifier ? " shared" : " + classifier", c->seq_len,
             (unsigned long long)off);
    if (c->shared_classifier) {
        m->w[KN_L2C_WCLS] = m->w[KN_L2C_TOKEN_EMBEDDING];
        m->w[KN_L2C_WCLS].name = g_names[KN_L2C_WCLS];
    }
    return KN_OK;
}

void kn_llama2c_close(kn_llama2c *m) {
    if (!m) return;
    kn_mapfile_close(m->file);
    free(m);
}

kn_status kn_llama2c_open_memory(const void *data, size_t size, kn_llama2c **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_llama2c_open_memory: out is NULL");
    *out = NULL;
    if (!data) return kn_set_error(KN_ERR_INVALID, "kn_llama2c_open_memory: data is NULL");
    if ((uintptr_t)data % 4 != 0)
        return kn_set_error(KN_ERR_INVALID, "kn_llama2c_open_memory: data must be 4-byte aligned");
    kn_llama2c *m = calloc(1, sizeof *m);
    if (!m) return kn_set_error(KN_ERR_NOMEM, "out of memory opening a llama2.c checkpoint");
    m->base = data;
    m->size = size;
    kn_status s = parse(m);
    if (s != KN_OK) { kn_llama2c_close(m); return s; }
    *out = m;
    return KN_OK;
}

kn_status kn_llama2c_open(const char *path, kn_llama2c **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_llama2c_open: out is NULL");
    *out = NULL;
    kn_mapfile *f;
    kn_status s = kn_mapfile_open(path, &f);
    if (s != KN_OK) return s;
    kn_llama2c *m = NULL;
    s = kn_llama2c_open_memory(f->data, f->size, &m);
    if (s != KN_OK) return kn_mapfile_fail(f, path, s);
    m->file = f;
    *out = m;
    return KN_OK;
}

const kn_llama2c_config *kn_llama2c_config_of(const kn_llama2c *m) { return m ? &m->cfg : NULL; }

const kn_llama2c_weight *kn_llama2c_weight_of(const kn_llama2c *m, kn_llama2c_wid w) {
    return (m && (unsigned)w < KN_L2C_COUNT) ? &m->w[w] : NULL;
}

const void *kn_llama2c_layer(const kn_llama2c *m, kn_llama2c_wid id, int layer, const float **scales) {
    if (scales) *scales = NULL;
    const kn_llama2c_weight *w = kn_llama2c_weight_of(m, id);
    if (!w || !w->data || layer < 0 || layer >= w->n_layers) return NULL;
    size_t o = (size_t)layer * w->layer_stride;
    if (scales && w->scales) *scales = (const float *)(const void *)((const uint8_t *)w->scales + o);
    return (const uint8_t *)w->data + o;
}
