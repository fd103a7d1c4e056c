/* cpu_sort.c: the CPU backend's SORT (src/graph/ops_sort.c states it) for
 * f32 x (any strides) and i64 indices, lines split over the pool.
 *
 * Each f32 value becomes an unsigned 32-bit key whose unsigned order is the
 * sort's order: -0.0 is made 0.0, every NaN the one largest key; the sign
 * bit flipped for positives, all bits for negatives; descending takes ~key.
 * Equal keys then keep their index order because the sort is stable: an LSD
 * radix sort (4 passes of 8 bits, each stable) for long lines, insertion
 * sort of (key, index) for short ones. Same order as the reference's
 * comparison sort: the same total order.
 */
#include "backends/cpu/cpu_impl.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t sort_key(float f, bool desc) {
    uint32_t u;
    if (f == 0.0f) f = 0.0f;                    /* -0.0 == 0.0 */
    memcpy(&u, &f, sizeof u);
    if (f != f) u = 0x7fc00000u;                /* one NaN, above +inf */
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return desc ? ~u : u;
}

typedef struct { const kn_tview *x, *y; int d; bool desc; int64_t n; atomic_int failed; } sort_job;

#define RADIX_MIN 64

static void sort_line(uint32_t *k, int32_t *ix, uint32_t *k2, int32_t *ix2, int64_t n) {
    if (n < RADIX_MIN) {
        for (int64_t i = 1; i < n; i++) {
            uint32_t kv = k[i];
            int32_t iv = ix[i];
            int64_t j = i - 1;
            while (j >= 0 && k[j] > kv) { k[j + 1] = k[j]; ix[j + 1] = ix[j]; j--; }
            k[j + 1] = kv; ix[j + 1] = iv;
        }
        return;
    }
    for (int sh = 0; sh < 32; sh += 8) {
        int64_t cnt[257] = {0};
        for (int64_t i = 0; i < n; i++) cnt[((k[i] >> sh) & 255) + 1]++;
        if (cnt[((k[0] >> sh) & 255) + 1] == n) continue;          /* every key has this byte: nothing moves */
        for (int b = 0; b < 256; b++) cnt[b + 1] += cnt[b];
        for (int64_t i = 0; i < n; i++) {
            int64_t p = cnt[(k[i] >> sh) & 255]++;
            k2[p] = k[i]; ix2[p] = ix[i];
        }
        memcpy(k, k2, sizeof(uint32_t) * (size_t)n);
        memcpy(ix, ix2, sizeof(int32_t) * (size_t)n);
    }
}

static void sort_rows(void *p, int64_t r0, int64_t r1) {
    sort_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int64_t n = j->n;
    uint32_t *k = malloc((sizeof(uint32_t) + sizeof(int32_t)) * 2 * (size_t)n);
    if (!k) { atomic_store(&j->failed, 1); return; }
    uint32_t *k2 = k + n;
    int32_t *ix = (int32_t *)(k2 + n), *ix2 = ix + n;
    int64_t xs = x->st[j->d], ys = y->st[j->d];
    for (int64_t r = r0; r < r1; r++) {
        /* line r: r over the other dims, row-major */
        int64_t xo = 0, yo = 0, lin = r;
        for (int k2d = x->ndim - 1; k2d >= 0; k2d--) {
            if (k2d == j->d) continue;
            int64_t q = lin % x->ne[k2d];
            lin /= x->ne[k2d];
            xo += q * x->st[k2d]; yo += q * y->st[k2d];
        }
        const float *xl = (const float *)x->data + xo;
        for (int64_t i = 0; i < n; i++) { k[i] = sort_key(xl[i * xs], j->desc); ix[i] = (int32_t)i; }
        sort_line(k, ix, k2, ix2, n);
        int64_t *yl = (int64_t *)y->data + yo;
        for (int64_t i = 0; i < n; i++) yl[i * ys] = ix[i];
    }
    free(k);
}

bool kn_cpu_sort(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.sort.dim;
    if (!is_f32(x) || y->dtype != KN_I64 || x->ndim != y->ndim || d >= x->ndim) return false;
    int64_t n = x->ne[d], lines = 1;
    for (int k = 0; k < x->ndim; k++) if (k != d) lines *= x->ne[k];
    if (n == 0 || lines == 0 || n > INT32_MAX) return false;
    sort_job j = {x, y, d, e->node->p.sort.descending, n, 0};
    int64_t work = lines * n * (n < RADIX_MIN ? n / 4 + 1 : 8);
    kn_cpu_par_rows(sort_rows, &j, lines, work);
    return !atomic_load(&j.failed);
}
