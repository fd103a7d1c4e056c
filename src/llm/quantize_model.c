/* quantize_model.c: `kiln quantize`: GGUF (or Hugging Face, through
 * convert_hf.c) to a GGUF of another tensor type, and the writer both share
 * (kn__qwrite: which tensors are quantized to what, see kiln_quantize.h).
 *
 * Memory: the output's tensors are all held until the file is written (the
 * GGUF writer references them), plus one tensor's f32 values at a time.
 * Non-goals: importance matrices, per-layer mixes (llama.cpp's *_M types),
 * splitting output files.
 */
#include "llm/quantize_impl.h"
#include "backends/quant/quant.h"      /* defines: kn_dequantize_row               */
#include "backends/quant/quantize.h"   /* defines: kn_quantize_weights             */
#include "formats/gguf.h"              /* defines: kn_gguf reader                  */
#include "kiln_llm.h"                  /* defines: kn_model_load (is it a model?)  */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

kn_quantize_params kn_quantize_defaults(void) {
    return (kn_quantize_params){.type = KN_Q8_0};
}

static const struct { const char *name; kn_dtype t; uint32_t ftype; } TYPES[] = {
    {"f32", KN_F32, 0}, {"f16", KN_F16, 1}, {"bf16", KN_BF16, 32}, {"q4_0", KN_Q4_0, 2}, {"q4_1", KN_Q4_1, 3},
    {"q5_0", KN_Q5_0, 8}, {"q5_1", KN_Q5_1, 9}, {"q8_0", KN_Q8_0, 7},
    /* the K types as llama.cpp's *_S files (LLAMA_FTYPE_MOSTLY_Q4_K_S, Q5_K_S, Q6_K) */
    {"q4_k", KN_Q4_K, 14}, {"q5_k", KN_Q5_K, 16}, {"q6_k", KN_Q6_K, 18},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

bool kn_quantize_type_from_name(const char *name, kn_dtype *out) {
    char low[16];
    size_t n = name ? strlen(name) : 0;
    if (n && n < sizeof low) {
        for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
        for (size_t i = 0; i < N_TYPES; i++)
            if (!strcmp(low, TYPES[i].name)) { *out = TYPES[i].t; return true; }
    }
    kn_set_error(KN_ERR_INVALID, "unknown type '%s'; choose one of f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                 "q4_k, q5_k, q6_k", name ? name : "(null)");
    return false;
}

uint32_t kn__qfile_type(kn_dtype t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (TYPES[i].t == t) return TYPES[i].ftype;
    return 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static bool is_float(kn_dtype t) { return t == KN_F32 || t == KN_F16 || t == KN_BF16; }

/* Is this a matrix llama.cpp quantizes? (llama-quant.cpp: 2+ dims, a
 * ".weight", not a norm, router, position or token-type table.) */
static bool eligible(const kn__qt *t) {
    return !t->no_quant && t->n_dims >= 2 && ends_with(t->name, ".weight") && !strstr(t->name, "_norm.weight") &&
           !strstr(t->name, "ffn_gate_inp") && strcmp(t->name, "position_embd.weight") &&
           strcmp(t->name, "token_types.weight") && !strstr(t->name, "rope_factors");
}

/* Layer index of "blk.N.*", or -1. */
static int layer_of(const char *name) {
    int l = -1;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

/* The type tensor t gets for target `type` (see kiln_quantize.h); the output
 * matrix is output.weight, or token_embd.weight when there is none. The
 * per-layer bumps are llama.cpp's for its Q4_K_S files (attn_v of layers
 * 0-3 and ffn_down of the first eighth of the layers to Q5_K) and for
 * 8-expert models (attn_v, attn_k to Q8_0); n_layer / n_expert: the file's. */
static kn_dtype pick_type(const kn__qt *t, const kn_quantize_params *p, bool is_output, int n_layer, int n_expert) {
    if (!eligible(t)) return t->keep_type;
    kn_dtype want = p->type;
    if (is_output && !p->pure && !is_float(want) && want != KN_Q8_0) want = KN_Q6_K;
    if (!p->pure && !is_float(want) && !is_output) {
        int l = layer_of(t->name);
        bool v = strstr(t->name, "attn_v.weight") != NULL, k = strstr(t->name, "attn_k.weight") != NULL;
        bool qkv = strstr(t->name, "attn_qkv.weight") != NULL;    /* llama.cpp counts it as attn_v here */
        if (p->type == KN_Q4_K && (v || qkv) && l >= 0 && l < 4) want = KN_Q5_K;
        if (p->type == KN_Q4_K && strstr(t->name, "ffn_down") && l >= 0 && l < n_layer / 8) want = KN_Q5_K;
        if (n_expert == 8 && (v || k)) want = KN_Q8_0;
    }
    int64_t bs = kn_dtype_get(want)->block_size;
    if (t->ne[0] % bs) {
        want = want == KN_Q4_K ? KN_Q5_0 : want == KN_Q5_K ? KN_Q5_1 : want == KN_Q6_K ? KN_Q8_0 : KN_F16;
        if (t->ne[0] % kn_dtype_get(want)->block_size) want = KN_F16;
    }
    return want;
}

static int64_t numel(const kn__qt *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

kn_status kn__qwrite(kn_gguf_writer *w, kn__qt *ts, int64_t n, const kn_quantize_params *p, const char *path) {
    if (!kn_quantize_weights_supported(p->type))
        return kn_set_error(KN_ERR_UNSUPPORTED, "cannot write %s tensors; the targets are f32, f16, bf16, q4_0, q4_1, "
                            "q5_0, q5_1, q8_0, q4_k, q5_k and q6_k", kn_dtype_name(p->type));
    bool has_output = false;
    int n_layer = 0, n_expert = 0;
    for (int64_t i = 0; i < n; i++) {
        has_output |= !strcmp(ts[i].name, "output.weight");
        if (layer_of(ts[i].name) + 1 > n_layer) n_layer = layer_of(ts[i].name) + 1;
        if (strstr(ts[i].name, "_exps.weight") && ts[i].n_dims == 3) n_expert = (int)ts[i].ne[2];
    }
    kn_dtype *type = calloc((size_t)n + 1, sizeof *type);
    void **buf = calloc((size_t)n + 1, sizeof *buf);
    float *tmp = NULL;
    kn_status st = type && buf ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
    /* the requantize rule first, so that a refused file costs no work */
    for (int64_t i = 0; i < n && !st; i++) {
        bool out = has_output ? !strcmp(ts[i].name, "output.weight") : !strcmp(ts[i].name, "token_embd.weight");
        type[i] = pick_type(&ts[i], p, out, n_layer, n_expert);
        if (type[i] != ts[i].src_type && !is_float(ts[i].src_type) && !p->allow_requantize)
            st = kn_set_error(KN_ERR_UNSUPPORTED, "tensor '%s' is already quantized (%s); quantizing it again to %s "
                              "loses accuracy twice. Start from an f32/f16/bf16 file, or pass --allow-requantize",
                              ts[i].name, kn_dtype_name(ts[i].src_type), kn_dtype_name(type[i]));
    }
    uint64_t bytes = 0, elems = 0;
    for (int64_t i = 0; i < n && !st; i++) {
        kn__qt *t = &ts[i];
        int64_t ne = numel(t);
        const void *data;
        if (type[i] == t->src_type && t->raw) {
            data = t->raw;                                  /* already that type: copied as is */
        } else {
            float *nt = realloc(tmp, sizeof *tmp * (size_t)(ne ? ne : 1));
            if (!nt) { st = kn_set_error(KN_ERR_NOMEM, "out of memory for tensor '%s'", t->name); break; }
            tmp = nt;
            buf[i] = malloc(kn_dtype_nbytes(type[i], ne) + 1);
            if (!buf[i]) { st = kn_set_error(KN_ERR_NOMEM, "out of memory for tensor '%s'", t->name); break; }
            if ((st = t->fill(t, tmp))) break;
            if ((st = kn_quantize_weights(type[i], tmp, buf[i], ne))) {
                st = kn_set_error(st, "tensor '%s': %s", t->name, kn_last_error());
                break;
            }
            data = buf[i];
        }
        if (p->verbose)
            fprintf(stderr, "  %-32s [%lld, %lld, %lld] %s -> %s\n", t->name, (long long)t->ne[0],
                    (long long)(t->n_dims > 1 ? t->ne[1] : 1), (long long)(t->n_dims > 2 ? t->ne[2] : 1),
                    kn_dtype_name(t->src_type), kn_dtype_name(type[i]));
        kn_gguf_w_tensor(w, t->name, type[i], t->n_dims, t->ne, data);
        bytes += kn_dtype_nbytes(type[i], ne);
        elems += (uint64_t)ne;
    }
    if (!st) {
        kn_gguf_w_u32(w, "general.quantization_version", 2);
        kn_gguf_w_u32(w, "general.file_type", kn__qfile_type(p->type));
        st = kn_gguf_writer_status(w);
    }
    if (!st) st = kn_gguf_write_file(w, path);
    if (!st && p->verbose)
        fprintf(stderr, "  %lld tensors, %.1f MB of tensor data, %.2f bits per weight\n", (long long)n, bytes / 1e6,
                elems ? 8.0 * (double)bytes / (double)elems : 0.0);
    for (int64_t i = 0; buf && i < n; i++) free(buf[i]);
    free(buf); free(type); free(tmp);
    return st;
}

/* ---- GGUF input ------------------------------------------------------------ */

static kn_status fill_gguf(const kn__qt *t, float *dst) {
    const kn_gguf_tensor *g = t->a;
    kn_status st = kn_dequantize_row(g->type, g->data, dst, numel(t));
    if (st) return kn_set_error(st, "tensor '%s' (%s): cannot read its values: %s", t->name, kn_dtype_name(g->type),
                                kn_last_error());
    return KN_OK;
}

static bool is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    char m[4] = {0};
    bool yes = f && fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
    if (f) fclose(f);
    return yes;
}

static kn_status same_file(const char *in, const char *out) {
    struct stat si, so;
    if (stat(in, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return kn_set_error(KN_ERR_INVALID, "the output '%s' is the input itself; name another file", out);
    return KN_OK;
}

kn_status kn_model_quantize(const char *in, const char *out, const kn_quantize_params *p) {
    if (!in || !out || !p) return kn_set_error(KN_ERR_INVALID, "kn_model_quantize: NULL argument");
    struct stat sb;
    if (stat(in, &sb) != 0) return kn_set_error(KN_ERR_IO, "%s: no such file or directory", in);
    kn_status st = same_file(in, out);
    if (st) return st;
    if (S_ISDIR(sb.st_mode) || !is_gguf(in)) return kn_model_convert_hf(in, out, p);
    kn_gguf *g;
    if ((st = kn_gguf_open(in, &g))) return st;
    kn_gguf_writer *w = NULL;
    int64_t n = kn_gguf_n_tensors(g);
    kn__qt *ts = calloc((size_t)n + 1, sizeof *ts);
    if (!ts) st = kn_set_error(KN_ERR_NOMEM, "out of memory");
    if (!st) st = kn_gguf_writer_new(&w);
    for (int64_t i = 0; i < kn_gguf_n_kv(g) && !st; i++) {
        kn_gguf_str k = kn_gguf_key(g, i);
        if ((k.len == 17 && !memcmp(k.ptr, "general.file_type", 17)) ||
            (k.len == 28 && !memcmp(k.ptr, "general.quantization_version", 28)) ||
            (k.len == 17 && !memcmp(k.ptr, "general.alignment", 17)))
            continue;                                     /* rewritten (the writer aligns to 32) */
        kn_gguf_w_copy_kv(w, g, i);
    }
    for (int64_t i = 0; i < n && !st; i++) {
        const kn_gguf_tensor *gt = kn_gguf_tensor_at(g, i);
        kn__qt *t = &ts[i];
        if (gt->name.len >= sizeof t->name) { st = kn_set_error(KN_ERR_LIMIT, "%s: a tensor name of %llu bytes", in, (unsigned long long)gt->name.len); break; }
        memcpy(t->name, gt->name.ptr, (size_t)gt->name.len);
        t->n_dims = gt->n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = d < gt->n_dims ? gt->ne[d] : 1;
        t->src_type = t->keep_type = gt->type;
        t->raw = gt->data;
        t->fill = fill_gguf;
        t->a = gt;
    }
    if (!st) st = kn_gguf_writer_status(w);
    if (!st) st = kn__qwrite(w, ts, n, p, out);
    if (st && !strstr(kn_last_error(), in)) kn_set_error(st, "%s: %s", in, kn_last_error());
    kn_gguf_writer_free(w);
    free(ts);
    kn_gguf_close(g);
    return st;
}
