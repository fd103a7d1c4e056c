/* checkpoint.c: named-tensor checkpoints in safetensors, and llm.c GPT-2
 * checkpoints mapped to module names (see kiln_ckpt.h).
 *
 * Both loaders describe the file as a list of entries (name, shape, dtype,
 * bytes) and share one matcher: it pairs entries with the requested names,
 * collects every difference into one report, and only when there is none
 * writes the data into the tensors. Non-goals: streaming huge checkpoints
 * tensor by tensor without a host copy on save. */
#include "kiln_ckpt.h"
#include "kiln.h"
#include "graph/graph.h"            /* defines: kn__alive, kn__storage_owner */
#include "formats/llmc_gpt2.h"      /* defines: kn_llmc_gpt2_open, kn_llmc_gpt2_write_flat */
#include "formats/safetensors.h"    /* defines: kn_safetensors_open, kn_safetensors_write */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable text --------------------------------------------------------- */

typedef struct text { char *p; size_t n, cap; bool oom; } text;

static void tx_printf(text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void tx_printf(text *t, const char *fmt, ...) {
    if (t->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { t->oom = true; return; }
        if (t->p && t->n + (size_t)k < t->cap) { t->n += (size_t)k; return; }
        size_t nc = t->cap ? t->cap * 2 : 256;
        while (nc < t->n + (size_t)k + 1) nc *= 2;
        char *np = realloc(t->p, nc);
        if (!np) { t->oom = true; return; }
        t->p = np; t->cap = nc;
    }
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int d = 0; d < ndim && o < cap; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* ---- entries and the matcher ------------------------------------------------------ */

typedef struct entry {
    const char *name;
    int ndim;
    int64_t shape[KN_ST_MAX_DIMS];
    kn_dtype dtype;
    const void *data;          /* load: file bytes; save: destination in the flat buffer */
    int64_t alt_rows;          /* >= 0: shape[0] may also be alt_rows (a prefix of the rows) */
    bool convert;              /* any float dtype on the tensor side, converted */
} entry;

typedef struct labels {
    const char *op;            /* "kn_ckpt_load"                                  */
    const char *req_only;      /* a requested name the entries lack               */
    const char *entry_only;    /* an entry nobody requested                       */
} labels;

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}
static int cmp_cstr_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Pair names[i] with an entry (which[i], -1 if none); report differences.
 * Returns KN_OK, or KN_ERR_INVALID with a message (and *report if asked). */
static kn_status match(const char *path, const labels *lb, entry *es, int64_t ne, int64_t n, const char *const names[],
                       kn_tensor *const ts[], unsigned flags, int64_t *which, char **report) {
    if (report) *report = NULL;
    if (n < 0 || (n > 0 && (!names || !ts)))
        return kn_set_error(KN_ERR_INVALID, "%s: n = %lld or NULL names/tensors", lb->op, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (!names[i] || !names[i][0])
            return kn_set_error(KN_ERR_INVALID, "%s: name #%lld is NULL or empty", lb->op, (long long)i);
        if (!kn__alive(ts[i]))
            return kn_set_error(KN_ERR_STATE, "%s: tensor '%.100s' is NULL or freed", lb->op, names[i]);
    }
    kn_status st = KN_OK;
    entry **sorted = malloc((size_t)(ne ? ne : 1) * sizeof *sorted);
    const char **snames = malloc((size_t)(n ? n : 1) * sizeof *snames);
    bool *used = calloc((size_t)(ne ? ne : 1), 1);
    text full = {0};
    if (!sorted || !snames || !used) { st = kn_set_error(KN_ERR_NOMEM, "%s: out of memory", lb->op); goto done; }
    for (int64_t i = 0; i < n; i++) snames[i] = names[i];
    qsort(snames, (size_t)n, sizeof *snames, cmp_cstr_ptr);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(snames[i - 1], snames[i]) == 0) {
            st = kn_set_error(KN_ERR_INVALID, "%s: name '%.100s' is given twice", lb->op, snames[i]);
            goto done;
        }
    for (int64_t k = 0; k < ne; k++) sorted[k] = &es[k];
    qsort(sorted, (size_t)ne, sizeof *sorted, cmp_entry_ptr);
    int64_t n_req = 0, n_ent = 0, n_shape = 0, n_dtype = 0;
    for (int64_t i = 0; i < n; i++) {
        entry key = {.name = names[i]}, *kp = &key;
        entry **hit = ne ? bsearch(&kp, sorted, (size_t)ne, sizeof *sorted, cmp_entry_ptr) : NULL;
        which[i] = -1;
        if (!hit) {
            if (!(flags & KN_CKPT_ALLOW_MISSING)) { tx_printf(&full, "%s: %s\n", lb->req_only, names[i]); n_req++; }
            continue;
        }
        entry *e = *hit;
        used[e - es] = true;
        kn_tensor *t = ts[i];
        bool same = t->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++)
            same = t->shape[d] == e->shape[d] || (d == 0 && e->alt_rows >= 0 && t->shape[0] == e->alt_rows);
        const kn_dtype_info *ti = kn_dtype_get(t->dtype);
        bool dt_ok = e->convert ? (ti && ti->is_float) : t->dtype == e->dtype;
        if (!same) {
            char a[160], b[160];
            shape_str(e->ndim, e->shape, a, sizeof a);
            shape_str(t->ndim, t->shape, b, sizeof b);
            tx_printf(&full, "shape: %s is %s in the file, %s in the model\n", names[i], a, b);
            n_shape++;
        }
        if (!dt_ok) {
            tx_printf(&full, "dtype: %s is %s in the file, %s in the model%s\n", names[i], kn_dtype_name(e->dtype),
                      kn_dtype_name(t->dtype), e->convert ? " (needs a float dtype)" : "");
            n_dtype++;
        }
        if (same && dt_ok) which[i] = e - es;
    }
    if (!(flags & KN_CKPT_ALLOW_UNEXPECTED))
        for (int64_t k = 0; k < ne; k++)
            if (!used[k]) { tx_printf(&full, "%s: %s\n", lb->entry_only, es[k].name); n_ent++; }
    if (full.oom) { st = kn_set_error(KN_ERR_NOMEM, "%s: out of memory", lb->op); goto done; }
    int64_t total = n_req + n_ent + n_shape + n_dtype;
    if (total) {
        /* one message: counts, then as many lines as fit, then how to see the rest */
        char msg[1000];
        size_t o = (size_t)snprintf(msg, sizeof msg, "%s: '%.200s' does not match (%lld %s, %lld %s, %lld shape, %lld dtype "
                                    "differences; nothing was written): ", lb->op, path, (long long)n_req, lb->req_only,
                                    (long long)n_ent, lb->entry_only, (long long)n_shape, (long long)n_dtype);
        int64_t shown = 0;
        const char *line = full.p;
        while (line && *line && o < sizeof msg) {
            const char *nl = strchr(line, '\n');
            size_t len = (size_t)(nl - line);
            if (o + len + 2 + 40 >= sizeof msg) break;
            o += (size_t)snprintf(msg + o, sizeof msg - o, "%s%.*s", shown ? "; " : "", (int)len, line);
            shown++;
            line = nl + 1;
        }
        if (shown < total && o < sizeof msg)
            snprintf(msg + o, sizeof msg - o, "; ... %lld more (kn_ckpt_check lists all)", (long long)(total - shown));
        st = kn_set_error(KN_ERR_INVALID, "%s", msg);
        if (report) { *report = full.p; full.p = NULL; }
    }
done:
    free(full.p);
    free(sorted); free(snames); free(used);
    return st;
}

static kn_status check_writable(const char *op, int64_t n, const char *const names[], kn_tensor *const ts[]) {
    for (int64_t i = 0; i < n; i++) {
        kn_tensor *own = kn__storage_owner(ts[i]);
        if (own->op != KN_OP_NONE || !own->buf)
            return kn_set_error(KN_ERR_INVALID, "%s: tensor '%.100s' is a computed node, not storage; load into "
                                "kn_param/kn_empty/kn_input tensors (or views of them)", op, names[i]);
    }
    return KN_OK;
}

/* Write the matched entries into the tensors (dtype conversion by kn_tensor_write). */
static kn_status write_all(const char *op, entry *es, int64_t n, const char *const names[], kn_tensor *const ts[],
                           const int64_t *which) {
    for (int64_t i = 0; i < n; i++) {
        if (which[i] < 0) continue;
        const entry *e = &es[which[i]];
        size_t esz = kn_dtype_get(e->dtype)->type_size;
        const void *src = e->data;
        void *tmp = NULL;
        if ((uintptr_t)src % esz) {                 /* unaligned in the file: copy first */
            size_t nb = kn_dtype_nbytes(e->dtype, kn_numel(ts[i]));
            tmp = malloc(nb ? nb : 1);
            if (!tmp) return kn_set_error(KN_ERR_NOMEM, "%s: out of memory", op);
            memcpy(tmp, src, nb);
            src = tmp;
        }
        kn_status st = kn_tensor_write(ts[i], src, e->dtype);
        free(tmp);
        if (st) {
            char m[512];
            snprintf(m, sizeof m, "%s", kn_last_error());
            return kn_set_error(st, "%s: writing '%.100s': %s", op, names[i], m);
        }
    }
    return KN_OK;
}

/* ---- safetensors ----------------------------------------------------------------------- */

kn_status kn_ckpt_save(const char *path, int64_t n, const char *const names[], kn_tensor *const tensors[],
                       int64_t n_meta, const char *const meta_kv[]) {
    if (!path || n < 0 || (n > 0 && (!names || !tensors)))
        return kn_set_error(KN_ERR_INVALID, "kn_ckpt_save: NULL path/names/tensors or n < 0");
    size_t sn = (size_t)(n ? n : 1);
    kn_dtype *dts = malloc(sn * sizeof *dts);
    int *nds = malloc(sn * sizeof *nds);
    int64_t (*shapes)[KN_ST_MAX_DIMS] = malloc(sn * sizeof *shapes);
    void **datas = calloc(sn, sizeof *datas);
    kn_status st = KN_OK;
    if (!dts || !nds || !shapes || !datas) { st = kn_set_error(KN_ERR_NOMEM, "kn_ckpt_save: out of memory"); goto done; }
    for (int64_t i = 0; i < n; i++) {
        kn_tensor *t = tensors[i];
        const char *nm = names[i] ? names[i] : "(null)";
        if (!kn__alive(t)) { st = kn_set_error(KN_ERR_STATE, "kn_ckpt_save: tensor '%.100s' is NULL or freed", nm); goto done; }
        if (!kn_safetensors_dtype_str(t->dtype)) {
            st = kn_set_error(KN_ERR_UNSUPPORTED, "kn_ckpt_save: tensor '%.100s' is %s, which safetensors cannot hold; "
                              "cast it to f32/f16/bf16 first", nm, kn_dtype_name(t->dtype));
            goto done;
        }
        dts[i] = t->dtype; nds[i] = t->ndim;
        for (int d = 0; d < t->ndim; d++) shapes[i][d] = t->shape[d];
        size_t nb = kn_dtype_nbytes(t->dtype, kn_numel(t));
        datas[i] = malloc(nb ? nb : 1);
        if (!datas[i]) { st = kn_set_error(KN_ERR_NOMEM, "kn_ckpt_save: out of memory for '%.100s' (%zu bytes)", nm, nb); goto done; }
        st = kn_tensor_read(t, datas[i], t->dtype);
        if (st) {
            char m[512];
            snprintf(m, sizeof m, "%s", kn_last_error());
            st = kn_set_error(st, "kn_ckpt_save: reading '%.100s': %s", nm, m);
            goto done;
        }
    }
    st = kn_safetensors_write(path, n, names, dts, nds, (const int64_t(*)[KN_ST_MAX_DIMS])shapes,
                              (const void *const *)datas, n_meta, meta_kv);
done:
    if (datas) for (int64_t i = 0; i < n; i++) free(datas[i]);
    free(datas); free(shapes); free(nds); free(dts);
    return st;
}

static const labels g_load_labels = {"kn_ckpt_load", "missing", "unexpected"};

static kn_status st_load(const char *path, int64_t n, const char *const names[], kn_tensor *const ts[],
                         unsigned flags, bool do_write, char **report) {
    if (report) *report = NULL;
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_ckpt_load: path is NULL");
    kn_safetensors *sf;
    kn_status st = kn_safetensors_open(path, &sf);
    if (st) {
        char m[800];
        snprintf(m, sizeof m, "%s", kn_last_error());
        return kn_set_error(st, "kn_ckpt_load: %s", m);
    }
    int64_t ne = kn_safetensors_n_tensors(sf);
    entry *es = calloc((size_t)(ne ? ne : 1), sizeof *es);
    int64_t *which = malloc((size_t)(n > 0 ? n : 1) * sizeof *which);
    if (!es || !which) { st = kn_set_error(KN_ERR_NOMEM, "kn_ckpt_load: out of memory"); goto done; }
    for (int64_t k = 0; k < ne; k++) {
        const kn_st_tensor *t = kn_safetensors_tensor_at(sf, k);
        es[k].name = t->name; es[k].ndim = t->ndim; es[k].dtype = t->dtype; es[k].data = t->data;
        memcpy(es[k].shape, t->shape, sizeof es[k].shape);
        es[k].alt_rows = -1;
    }
    st = match(path, &g_load_labels, es, ne, n, names, ts, flags, which, report);
    if (!st && do_write) st = check_writable("kn_ckpt_load", n, names, ts);
    if (!st && do_write) st = write_all("kn_ckpt_load", es, n, names, ts, which);
done:
    free(es); free(which);
    kn_safetensors_close(sf);
    return st;
}

kn_status kn_ckpt_load_ex(const char *path, int64_t n, const char *const names[], kn_tensor *const tensors[],
                          unsigned flags) {
    return st_load(path, n, names, tensors, flags, true, NULL);
}
kn_status kn_ckpt_load(const char *path, int64_t n, const char *const names[], kn_tensor *const tensors[]) {
    return st_load(path, n, names, tensors, KN_CKPT_STRICT, true, NULL);
}
kn_status kn_ckpt_check(const char *path, int64_t n, const char *const names[], kn_tensor *const tensors[],
                        unsigned flags, char **report) {
    return st_load(path, n, names, tensors, flags, false, report);
}

kn_status kn_ckpt_meta(const char *path, const char *key, char *buf, size_t cap) {
    if (!path || !key || !buf || !cap) return kn_set_error(KN_ERR_INVALID, "kn_ckpt_meta: NULL argument");
    buf[0] = 0;
    kn_safetensors *sf;
    kn_status st = kn_safetensors_open(path, &sf);
    if (st) return st;
    const char *v = kn_safetensors_metadata(sf, key);
    if (!v) st = kn_set_error(KN_ERR_INVALID, "kn_ckpt_meta: '%.200s' has no metadata key '%.100s'", path, key);
    else if (strlen(v) >= cap) st = kn_set_error(KN_ERR_LIMIT, "kn_ckpt_meta: value of '%.100s' needs %zu bytes", key, strlen(v) + 1);
    else memcpy(buf, v, strlen(v) + 1);
    kn_safetensors_close(sf);
    return st;
}

/* ---- llm.c GPT-2 -------------------------------------------------------------------------
 * Dims: L layers, C channels, V vocab, Vp padded vocab, maxT positions. */

const kn_gpt2_name_map kn_gpt2_names[KN_GPT2_N_KINDS] = {
    {"wte", "wte.weight", false},                       /* [Vp, C] (model: [V, C] or [Vp, C]) */
    {"wpe", "wpe.weight", false},                       /* [maxT, C]                          */
    {"ln1w", "h.%d.ln_1.weight", true},                 /* [C]                                */
    {"ln1b", "h.%d.ln_1.bias", true},
    {"qkvw", "h.%d.attn.c_attn.weight", true},          /* [3C, C]                            */
    {"qkvb", "h.%d.attn.c_attn.bias", true},            /* [3C]                               */
    {"attprojw", "h.%d.attn.c_proj.weight", true},      /* [C, C]                             */
    {"attprojb", "h.%d.attn.c_proj.bias", true},
    {"ln2w", "h.%d.ln_2.weight", true},
    {"ln2b", "h.%d.ln_2.bias", true},
    {"fcw", "h.%d.mlp.c_fc.weight", true},              /* [4C, C]                            */
    {"fcb", "h.%d.mlp.c_fc.bias", true},                /* [4C]                               */
    {"fcprojw", "h.%d.mlp.c_proj.weight", true},        /* [C, 4C]                            */
    {"fcprojb", "h.%d.mlp.c_proj.bias", true},
    {"lnfw", "ln_f.weight", false},                     /* [C]                                */
    {"lnfb", "ln_f.bias", false},
};

kn_status kn_gpt2_param_name(const char *prefix, int kind, int layer, char *buf, size_t cap) {
    if (kind < 0 || kind >= KN_GPT2_N_KINDS || !buf || !cap || layer < 0)
        return kn_set_error(KN_ERR_INVALID, "kn_gpt2_param_name: kind %d (0..15), layer %d or buffer invalid", kind, layer);
    char part[96];
    const kn_gpt2_name_map *m = &kn_gpt2_names[kind];
    if (m->per_layer) snprintf(part, sizeof part, m->format, layer);
    else snprintf(part, sizeof part, "%s", m->format);
    int k = snprintf(buf, cap, "%s%s", prefix ? prefix : "", part);
    if (k < 0 || (size_t)k >= cap) return kn_set_error(KN_ERR_LIMIT, "kn_gpt2_param_name: name needs %d bytes", k + 1);
    return KN_OK;
}

int64_t kn_gpt2_n_named(int n_layers) { return n_layers < 0 ? 0 : 4 + 12 * (int64_t)n_layers; }

/* Entries for a config: kind p's data starts at bases[p] (file mapping or the
 * flat buffer being filled). */
static kn_status gpt2_entries(const kn_llmc_gpt2_config *c, kn_dtype dt, const char *prefix,
                              const char *const bases[KN_GPT2_NPARAMS], entry **out, char **namebuf, int64_t *ne) {
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    kn_status st = kn_llmc_gpt2_shapes(c, sh, NULL);
    if (st) return st;
    int64_t n = kn_gpt2_n_named(c->n_layers);
    size_t plen = prefix ? strlen(prefix) : 0, nlen = plen + 64;
    entry *es = calloc((size_t)n, sizeof *es);
    char *names = malloc((size_t)n * nlen);
    if (!es || !names) { free(es); free(names); return kn_set_error(KN_ERR_NOMEM, "llm.c GPT-2: out of memory"); }
    size_t esz = kn_dtype_get(dt)->type_size;
    int64_t k = 0;
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) {
        const kn_gpt2_name_map *m = &kn_gpt2_names[p];
        int nl = m->per_layer ? c->n_layers : 1;
        size_t per = (size_t)(sh[p].numel / nl) * esz;
        for (int l = 0; l < nl; l++, k++) {
            entry *e = &es[k];
            e->name = names + (size_t)k * nlen;
            kn_gpt2_param_name(prefix, p, l, names + (size_t)k * nlen, nlen);
            e->ndim = m->per_layer ? sh[p].ndim - 1 : sh[p].ndim;
            memcpy(e->shape, sh[p].shape + (m->per_layer ? 1 : 0), sizeof(int64_t) * (size_t)e->ndim);
            e->dtype = dt;
            e->data = bases[p] + (size_t)l * per;
            e->alt_rows = p == KN_GPT2_WTE ? c->vocab_size : -1;
            e->convert = true;
        }
    }
    *out = es; *namebuf = names; *ne = n;
    return KN_OK;
}

kn_status kn_ckpt_load_llmc_gpt2(const char *path, const char *prefix, int64_t n, const char *const names[],
                                 kn_tensor *const tensors[], kn_llmc_gpt2_config *cfg) {
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_ckpt_load_llmc_gpt2: path is NULL");
    kn_llmc_gpt2 *m;
    kn_status st = kn_llmc_gpt2_open(path, &m);
    if (st) return st;
    const kn_llmc_gpt2_config *c = kn_llmc_gpt2_config_of(m);
    entry *es = NULL;
    char *nb = NULL;
    int64_t ne = 0;
    int64_t *which = malloc((size_t)(n > 0 ? n : 1) * sizeof *which);
    if (!which) { st = kn_set_error(KN_ERR_NOMEM, "kn_ckpt_load_llmc_gpt2: out of memory"); goto done; }
    const char *bases[KN_GPT2_NPARAMS];
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) bases[p] = kn_llmc_gpt2_param(m, (kn_gpt2_param)p)->data;
    st = gpt2_entries(c, kn_llmc_gpt2_dtype(m), prefix, bases, &es, &nb, &ne);
    if (st) goto done;
    static const labels lb = {"kn_ckpt_load_llmc_gpt2", "missing", "unexpected"};
    st = match(path, &lb, es, ne, n, names, tensors, KN_CKPT_STRICT, which, NULL);
    if (!st) st = check_writable(lb.op, n, names, tensors);
    if (!st) st = write_all(lb.op, es, n, names, tensors, which);
    if (!st && cfg) *cfg = *c;
done:
    free(which); free(es); free(nb);
    kn_llmc_gpt2_close(m);
    return st;
}

kn_status kn_ckpt_save_llmc_gpt2(const char *path, const kn_llmc_gpt2_config *cfg, kn_dtype dtype,
                                 const char *prefix, int64_t n, const char *const names[],
                                 kn_tensor *const tensors[]) {
    if (!path || !cfg) return kn_set_error(KN_ERR_INVALID, "kn_ckpt_save_llmc_gpt2: NULL path or config");
    if (dtype != KN_F32 && dtype != KN_BF16)
        return kn_set_error(KN_ERR_INVALID, "kn_ckpt_save_llmc_gpt2: dtype %s; llm.c files are f32 or bf16", kn_dtype_name(dtype));
    int64_t numel;
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    kn_status st = kn_llmc_gpt2_shapes(cfg, sh, &numel);
    if (st) return st;
    size_t esz = kn_dtype_get(dtype)->type_size;
    char *flat = calloc((size_t)numel, esz);          /* zero: wte padding rows stay 0 */
    int64_t *which = malloc((size_t)(n > 0 ? n : 1) * sizeof *which);
    entry *es = NULL;
    char *nb = NULL;
    int64_t ne = 0;
    if (!flat || !which) { st = kn_set_error(KN_ERR_NOMEM, "kn_ckpt_save_llmc_gpt2: out of memory"); goto done; }
    const char *bases[KN_GPT2_NPARAMS];
    size_t off = 0;
    for (int p = 0; p < KN_GPT2_NPARAMS; p++) { bases[p] = flat + off; off += (size_t)sh[p].numel * esz; }
    st = gpt2_entries(cfg, dtype, prefix, bases, &es, &nb, &ne);
    if (st) goto done;
    static const labels lb = {"kn_ckpt_save_llmc_gpt2", "not a GPT-2 parameter", "missing"};
    st = match(path, &lb, es, ne, n, names, tensors, KN_CKPT_STRICT, which, NULL);
    for (int64_t i = 0; i < n && !st; i++) {
        st = kn_tensor_read(tensors[i], (void *)es[which[i]].data, dtype);
        if (st) {
            char m[512];
            snprintf(m, sizeof m, "%s", kn_last_error());
            st = kn_set_error(st, "kn_ckpt_save_llmc_gpt2: reading '%.100s': %s", names[i], m);
        }
    }
    if (!st) st = kn_llmc_gpt2_write_flat(path, cfg, dtype, flat);
done:
    free(flat); free(which); free(es); free(nb);
    return st;
}
