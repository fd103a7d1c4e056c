/* quantize_model.c: `kiln quantize`: GGUF (or Hugging Face, through
 * convert_hf.c) to a GGUF of another tensor type, and the writer both share
 * (kn__qwrite: which tensors are quantized to what, see kiln_quantize.h).
 *
 * Memory: the output's tensors are all held until the file is written (the
 * GGUF writer references them), plus one tensor's f32 values at a time.
 * Which type each tensor gets is quantize_rules.c's (llama.cpp's rules,
 * the *_S and *_M mixes of the K types included).
 * Non-goals: importance matrices, the Q2/Q3/IQ mixes, splitting output files.
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
    /* the K types as llama.cpp's *_S files (LLAMA_FTYPE_MOSTLY_Q4_K_S, Q5_K_S, Q6_K); the *_M
     * files (mix M) are the next number: 15, 17 */
    {"q4_k", KN_Q4_K, 14}, {"q5_k", KN_Q5_K, 16}, {"q6_k", KN_Q6_K, 18},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

bool kn_quantize_parse_type(const char *name, kn_quantize_params *p) {
    char low[16];
    size_t n = name ? strlen(name) : 0;
    if (p && n > 2 && n < sizeof low) {
        for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
        bool m = !strcmp(low + n - 2, "_m"), s = !strcmp(low + n - 2, "_s");
        if (m || s) low[n - 2] = 0;
        kn_dtype t;
        bool k = !strcmp(low, "q4_k") || !strcmp(low, "q5_k");
        if ((k || (!m && !s)) && kn_quantize_type_from_name(low, &t)) {
            p->type = t;
            p->mix = m ? KN_QUANT_MIX_M : KN_QUANT_MIX_S;
            return true;
        }
    } else if (p && n && n < sizeof low && kn_quantize_type_from_name(name, &p->type)) {
        p->mix = KN_QUANT_MIX_S;
        return true;
    }
    kn_set_error(KN_ERR_INVALID, "unknown type '%s'; choose one of q4_k_m, q5_k_m, q4_k_s (= q4_k), q5_k_s (= q5_k), "
                 "q6_k, q8_0, q4_0, q4_1, q5_0, q5_1, f32, f16, bf16", name ? name : "(null)");
    return false;
}

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

static bool is_float(kn_dtype t) { return t == KN_F32 || t == KN_F16 || t == KN_BF16; }

static int64_t numel(const kn__qt *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

kn_status kn__qwrite(kn_gguf_writer *w, kn__qt *ts, int64_t n, const kn_quantize_params *p, const char *path) {
    if (!kn_quantize_weights_supported(p->type))
        return kn_set_error(KN_ERR_UNSUPPORTED, "cannot write %s tensors; the targets are f32, f16, bf16, q4_0, q4_1, "
                            "q5_0, q5_1, q8_0, q4_k, q5_k and q6_k", kn_dtype_name(p->type));
    kn_dtype *type = calloc((size_t)n + 1, sizeof *type);
    void **buf = calloc((size_t)n + 1, sizeof *buf);
    float *tmp = NULL;
    kn_status st = type && buf ? KN_OK : kn_set_error(KN_ERR_NOMEM, "out of memory");
    if (!st) st = kn__qpick_types(ts, n, p, type);
    /* the requantize rule first, so that a refused file costs no work */
    for (int64_t i = 0; i < n && !st; i++) {
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
        uint32_t ft = kn__qfile_type(p->type);
        if (p->mix == KN_QUANT_MIX_M && (p->type == KN_Q4_K || p->type == KN_Q5_K)) ft++;   /* 15 Q4_K_M, 17 Q5_K_M */
        kn_gguf_w_u32(w, "general.file_type", ft);
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
