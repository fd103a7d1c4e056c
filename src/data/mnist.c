/* mnist.c: idx files (MNIST and friends), gzip-compressed or plain.
 *
 * idx layout: magic {0, 0, type, ndim}, then ndim big-endian uint32 dims,
 * then the elements (big-endian for multi-byte types), nothing after. zlib's
 * gzread reads gzip and plain files alike. Non-goals: idx type 0x0B (int16:
 * kiln has no int16 dtype), writing idx files. */
#include "kiln_data.h"
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAX_BYTES ((uint64_t)1 << 36)   /* 64 GiB: anything larger is a corrupt header */

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Read exactly n bytes; returns bytes read (< n at end of file) or -1 on a
 * zlib error (message in *why). */
static int64_t gz_read_all(gzFile f, void *dst, uint64_t n, const char **why) {
    uint64_t got = 0;
    while (got < n) {
        uint64_t want = n - got;
        unsigned chunk = want > (1u << 30) ? (1u << 30) : (unsigned)want;
        int r = gzread(f, (char *)dst + got, chunk);
        if (r < 0) { int e; *why = gzerror(f, &e); return -1; }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    return (int64_t)got;
}

kn_status kn_idx_read(const char *path, uint32_t expect_magic, kn_dtype *dtype, int *ndim,
                      int64_t shape[8], void **data) {
    if (!path || !dtype || !ndim || !shape || !data) return kn_set_error(KN_ERR_INVALID, "kn_idx_read: NULL argument");
    *data = NULL;
    gzFile f = gzopen(path, "rb");
    if (!f) return kn_set_error(KN_ERR_IO, "idx: cannot open '%s'; check the path (KN_ASSETS for the test assets)", path);
    kn_status st = KN_OK;
    const char *why = "";
    unsigned char hdr[4 + 4 * 8];
    void *buf = NULL;
    int64_t r = gz_read_all(f, hdr, 4, &why);
    if (r < 0) { st = kn_set_error(KN_ERR_FORMAT, "idx '%s': %s (corrupt gzip stream?)", path, why); goto done; }
    if (r < 4) { st = kn_set_error(KN_ERR_FORMAT, "idx '%s': truncated header (%lld of 4 magic bytes)", path, (long long)r); goto done; }
    uint32_t magic = be32(hdr);
    int type = hdr[2], nd = hdr[3];
    if (expect_magic && magic != expect_magic) {
        st = kn_set_error(KN_ERR_FORMAT, "idx '%s': magic %u, expected %u (%s); is this the right file?", path, magic,
                          expect_magic, expect_magic == 2051 ? "images" : expect_magic == 2049 ? "labels" : "idx");
        goto done;
    }
    if (hdr[0] || hdr[1] || nd < 1 || nd > 8) {
        st = kn_set_error(KN_ERR_FORMAT, "idx '%s': bad magic 0x%08x (want 00 00 <type> <ndim 1..8>)", path, magic);
        goto done;
    }
    kn_dtype dt;
    switch (type) {
    case 0x08: dt = KN_U8; break;
    case 0x09: dt = KN_I8; break;
    case 0x0C: dt = KN_I32; break;
    case 0x0D: dt = KN_F32; break;
    case 0x0E: dt = KN_F64; break;
    default:
        st = kn_set_error(type == 0x0B ? KN_ERR_UNSUPPORTED : KN_ERR_FORMAT,
                          "idx '%s': element type 0x%02x %s", path, type,
                          type == 0x0B ? "(int16) is not supported" : "is not an idx type (08 09 0B 0C 0D 0E)");
        goto done;
    }
    r = gz_read_all(f, hdr + 4, 4 * (uint64_t)nd, &why);
    if (r < 0) { st = kn_set_error(KN_ERR_FORMAT, "idx '%s': %s (corrupt gzip stream?)", path, why); goto done; }
    if (r < 4 * nd) { st = kn_set_error(KN_ERR_FORMAT, "idx '%s': truncated header (%d dims announced, file ends after %lld bytes of them)", path, nd, (long long)r); goto done; }
    size_t es = kn_dtype_get(dt)->type_size;
    uint64_t total = es;
    for (int d = 0; d < nd; d++) {
        shape[d] = be32(hdr + 4 + 4 * d);
        if (shape[d] == 0) total = 0;
        else if (total && total > IDX_MAX_BYTES / (uint64_t)shape[d]) {
            st = kn_set_error(KN_ERR_FORMAT, "idx '%s': dims give more than %llu bytes; the header is corrupt", path,
                              (unsigned long long)IDX_MAX_BYTES);
            goto done;
        } else total *= (uint64_t)shape[d];
    }
    buf = malloc(total ? (size_t)total : 1);
    if (!buf) { st = kn_set_error(KN_ERR_NOMEM, "idx '%s': out of memory for %llu bytes", path, (unsigned long long)total); goto done; }
    r = gz_read_all(f, buf, total, &why);
    if (r < 0) { st = kn_set_error(KN_ERR_FORMAT, "idx '%s': %s (corrupt gzip stream?)", path, why); goto done; }
    if ((uint64_t)r < total) {
        st = kn_set_error(KN_ERR_FORMAT, "idx '%s': truncated: the dims announce %llu data bytes, the file has %lld",
                          path, (unsigned long long)total, (long long)r);
        goto done;
    }
    unsigned char extra;
    r = gz_read_all(f, &extra, 1, &why);
    if (r != 0) {
        st = kn_set_error(KN_ERR_FORMAT, "idx '%s': %s after the %llu data bytes the dims announce; the dims do not "
                          "match the data", path, r < 0 ? why : "more data", (unsigned long long)total);
        goto done;
    }
    if (es > 1) {                                   /* big endian -> host */
        unsigned char *p = buf;
        for (uint64_t i = 0; i < total; i += es)
            for (size_t a = 0, b = es - 1; a < b; a++, b--) { unsigned char t = p[i + a]; p[i + a] = p[i + b]; p[i + b] = t; }
    }
    *dtype = dt; *ndim = nd;
    *data = buf; buf = NULL;
done:
    free(buf);
    gzclose(f);
    return st;
}

void kn_mnist_free(kn_mnist *m) {
    if (!m) return;
    free(m->images);
    free(m->labels);
    free(m);
}

kn_status kn_mnist_load(const char *images_path, const char *labels_path, kn_mnist **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_mnist_load: out is NULL");
    *out = NULL;
    kn_dtype di, dl;
    int ni, nl;
    int64_t si[8], sl[8];
    void *img = NULL, *lab = NULL;
    kn_status st = kn_idx_read(images_path, 2051, &di, &ni, si, &img);
    if (st) return st;
    st = kn_idx_read(labels_path, 2049, &dl, &nl, sl, &lab);
    if (st) { free(img); return st; }
    if (si[0] != sl[0]) {
        free(img); free(lab);
        return kn_set_error(KN_ERR_FORMAT, "mnist: %lld images in '%s' but %lld labels in '%s'; use files of one split",
                            (long long)si[0], images_path, (long long)sl[0], labels_path);
    }
    const uint8_t *y = lab;
    for (int64_t i = 0; i < sl[0]; i++)
        if (y[i] > 9) {
            int bad = y[i];
            free(img); free(lab);
            return kn_set_error(KN_ERR_FORMAT, "mnist: label %d at index %lld of '%s' is not a digit 0..9", bad,
                                (long long)i, labels_path);
        }
    kn_mnist *m = calloc(1, sizeof *m);
    if (!m) { free(img); free(lab); return kn_set_error(KN_ERR_NOMEM, "mnist: out of memory"); }
    m->n = si[0]; m->rows = si[1]; m->cols = si[2];
    m->images = img; m->labels = lab;
    *out = m;
    return KN_OK;
}

/* as_f32 converts each sample when the loader asks for it (on the prefetch
 * thread when there is one), so no second copy of the images is kept. */
static kn_status mnist_get_f32(void *ud, int64_t index, void *const dst[]) {
    const kn_mnist *m = ud;
    int64_t px = m->rows * m->cols;
    const uint8_t *src = m->images + index * px;
    float *x = dst[0];
    for (int64_t i = 0; i < px; i++) x[i] = (float)src[i] / 255.0f;
    *(int32_t *)dst[1] = m->labels[index];
    return KN_OK;
}

kn_status kn_mnist_dataset(const kn_mnist *m, bool as_f32, kn_dataset **out) {
    if (!m || !out) return kn_set_error(KN_ERR_INVALID, "kn_mnist_dataset: NULL argument");
    if (!as_f32) {
        kn_data_field f[2] = {{"x", KN_U8, 2, {m->rows, m->cols}}, {"y", KN_U8, 0, {0}}};
        const void *d[2] = {m->images, m->labels};
        return kn_dataset_from_arrays(m->n, 2, f, d, false, out);
    }
    kn_data_field f[2] = {{"x", KN_F32, 2, {m->rows, m->cols}}, {"y", KN_I32, 0, {0}}};
    return kn_dataset_new(m->n, 2, f, mnist_get_f32, (void *)m, NULL, out);
}
