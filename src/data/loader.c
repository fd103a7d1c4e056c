/* loader.c: batches over a kn_dataset: seeded shuffling, drop_last, and a
 * background thread that fills the next batch while the caller uses the
 * current one (two host buffers).
 *
 * The stream of batches is a fixed sequence of positions (epoch, index),
 * index = 0 .. nb-1 followed by one end-of-epoch marker (index = nb). The
 * synchronous path and the prefetch thread walk the same sequence with the
 * same fill function, so they give identical batches. The order of epoch e
 * is Fisher-Yates where step i draws from Philox4x32-10 with counter
 * (e << 40 | i) and key seed: a pure function of (seed, epoch).
 * Non-goals: several worker threads (one is enough to hide a memcpy or a
 * decode of a sample; the loader never calls the dataset concurrently). */
#include "kiln_data.h"
#include "kiln.h"
#include "core/core.h"   /* defines: kn_philox4x32 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAMPLES ((int64_t)1 << 40)    /* the counter layout leaves 40 bits for i */

/* ---- shuffling -------------------------------------------------------------- */

/* Uniform in [0, m): high 64 bits of x * m (x 64 random bits), from 32-bit halves. */
static uint64_t mulhi64(uint64_t x, uint64_t m) {
    uint64_t xl = x & 0xffffffffu, xh = x >> 32, ml = m & 0xffffffffu, mh = m >> 32;
    uint64_t ll = xl * ml, lh = xl * mh, hl = xh * ml, hh = xh * mh;
    uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

kn_status kn_shuffle_order(int64_t n, uint64_t seed, int64_t epoch, int64_t *perm) {
    if (n < 0 || n > MAX_SAMPLES || (n && !perm) || epoch < 0 || epoch >= ((int64_t)1 << 24))
        return kn_set_error(KN_ERR_INVALID, "kn_shuffle_order: n = %lld (0..2^40), epoch = %lld (0..2^24) or perm NULL",
                            (long long)n, (long long)epoch);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t r[4];
        kn_philox4x32(((uint64_t)epoch << 40) | (uint64_t)i, seed, r);
        uint64_t j = mulhi64(((uint64_t)r[0] << 32) | r[1], (uint64_t)i + 1);
        int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    return KN_OK;
}

/* ---- loader state ------------------------------------------------------------- */

typedef struct slot {
    int64_t epoch, index, size;          /* size 0: end-of-epoch marker */
    int64_t *indices;                    /* [B]                         */
    void *data[KN_DATA_MAX_FIELDS];      /* field f: [B * sample bytes] */
    kn_status st;
    char err[1024];
    int ready;                           /* filled, not yet consumed    */
} slot;

struct kn_loader {
    kn_dataset *ds;
    kn_loader_opts o;
    int64_t n, nb;                /* samples, batches per epoch                      */
    int nf;
    /* producer side (the thread while it runs, else the caller) */
    int64_t pe, pi;               /* next position to produce                        */
    int64_t *perm;                /* [n] order of epoch perm_epoch (shuffle only)    */
    int64_t perm_epoch;
    /* two buffers */
    slot slots[2];
    int head, tail, held;         /* next to consume, next to fill, handed out (-1)  */
    /* thread */
    pthread_t th;
    bool running, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

kn_loader_opts kn_loader_defaults(void) {
    kn_loader_opts o = {1, false, 0, false, false};
    return o;
}

int64_t kn_loader_n_batches(const kn_loader *l) { return l ? l->nb : 0; }

/* Fill s with the batch at (epoch, index); runs on the producer's thread. */
static void fill(kn_loader *l, slot *s, int64_t epoch, int64_t index) {
    s->epoch = epoch; s->index = index; s->size = 0; s->st = KN_OK; s->err[0] = 0;
    if (index >= l->nb) return;                         /* end-of-epoch marker */
    if (l->o.shuffle && l->perm_epoch != epoch) {
        kn_status st = kn_shuffle_order(l->n, l->o.seed, epoch, l->perm);
        if (st) { s->st = st; snprintf(s->err, sizeof s->err, "%s", kn_last_error()); return; }
        l->perm_epoch = epoch;
    }
    int64_t B = l->o.batch_size, start = index * B;
    int64_t size = l->n - start < B ? l->n - start : B;
    for (int64_t k = 0; k < size; k++) {
        int64_t idx = l->o.shuffle ? l->perm[start + k] : start + k;
        void *dst[KN_DATA_MAX_FIELDS];
        for (int f = 0; f < l->nf; f++) dst[f] = (char *)s->data[f] + (size_t)k * kn_dataset_sample_bytes(l->ds, f);
        s->indices[k] = idx;
        kn_status st = kn_dataset_get(l->ds, idx, dst);
        if (st) {
            s->st = st;
            snprintf(s->err, sizeof s->err, "loader: epoch %lld batch %lld sample %lld: %s", (long long)epoch,
                     (long long)index, (long long)idx, kn_last_error());
            return;
        }
    }
    s->size = size;
}

static void advance(kn_loader *l) {
    if (l->pi < l->nb) l->pi++;
    else { l->pe++; l->pi = 0; }
}

static void *producer(void *arg) {
    kn_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->slots[l->tail].ready) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        slot *s = &l->slots[l->tail];
        int64_t e = l->pe, i = l->pi;
        advance(l);
        pthread_mutex_unlock(&l->mu);
        fill(l, s, e, i);                               /* the slow part, unlocked */
        pthread_mutex_lock(&l->mu);
        s->ready = 1;
        l->tail ^= 1;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static kn_status start_thread(kn_loader *l) {
    l->stop = false;
    l->head = l->tail = 0; l->held = -1;
    l->slots[0].ready = l->slots[1].ready = 0;
    if (pthread_create(&l->th, NULL, producer, l) != 0)
        return kn_set_error(KN_ERR_STATE, "kn_loader: cannot start the prefetch thread; set prefetch = false");
    l->running = true;
    return KN_OK;
}

static void stop_thread(kn_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->th, NULL);
    l->running = false;
}

void kn_loader_free(kn_loader *l) {
    if (!l) return;
    stop_thread(l);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    for (int k = 0; k < 2; k++) {
        free(l->slots[k].indices);
        for (int f = 0; f < l->nf; f++) free(l->slots[k].data[f]);
    }
    free(l->perm);
    free(l);
}

kn_status kn_loader_new(kn_dataset *ds, const kn_loader_opts *opts, kn_loader **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_loader_new: out is NULL");
    *out = NULL;
    if (!ds) return kn_set_error(KN_ERR_INVALID, "kn_loader_new: dataset is NULL");
    kn_loader_opts o = opts ? *opts : kn_loader_defaults();
    if (o.batch_size < 1 || o.batch_size > MAX_SAMPLES)
        return kn_set_error(KN_ERR_INVALID, "kn_loader_new: batch_size = %lld; it must be >= 1", (long long)o.batch_size);
    int64_t n = kn_dataset_len(ds);
    if (n > MAX_SAMPLES) return kn_set_error(KN_ERR_LIMIT, "kn_loader_new: %lld samples (at most 2^40)", (long long)n);
    kn_loader *l = calloc(1, sizeof *l);
    if (!l) return kn_set_error(KN_ERR_NOMEM, "kn_loader_new: out of memory");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->ds = ds; l->o = o; l->n = n; l->nf = kn_dataset_n_fields(ds);
    l->nb = o.drop_last ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
    l->perm_epoch = -1; l->held = -1;
    int64_t B = o.batch_size < n ? o.batch_size : (n ? n : 1);   /* largest batch ever made */
    bool ok = true;
    if (o.shuffle) ok = (l->perm = malloc((size_t)(n ? n : 1) * sizeof *l->perm)) != NULL;
    for (int k = 0; k < (o.prefetch ? 2 : 1) && ok; k++) {
        ok = (l->slots[k].indices = malloc((size_t)B * sizeof(int64_t))) != NULL;
        for (int f = 0; f < l->nf && ok; f++) {
            size_t bytes = (size_t)B * kn_dataset_sample_bytes(ds, f);
            ok = (l->slots[k].data[f] = malloc(bytes ? bytes : 1)) != NULL;
        }
    }
    if (!ok) { kn_loader_free(l); return kn_set_error(KN_ERR_NOMEM, "kn_loader_new: out of memory for batch buffers"); }
    if (o.prefetch) {
        kn_status st = start_thread(l);
        if (st) { kn_loader_free(l); return st; }
    }
    *out = l;
    return KN_OK;
}

kn_status kn_loader_seek(kn_loader *l, int64_t epoch, int64_t index) {
    if (!l) return kn_set_error(KN_ERR_INVALID, "kn_loader_seek: loader is NULL");
    if (epoch < 0 || index < 0 || index > l->nb)
        return kn_set_error(KN_ERR_INVALID, "kn_loader_seek: epoch %lld batch %lld (batches per epoch: %lld)",
                            (long long)epoch, (long long)index, (long long)l->nb);
    stop_thread(l);
    l->pe = epoch; l->pi = index;
    return l->o.prefetch ? start_thread(l) : KN_OK;
}

kn_status kn_loader_next(kn_loader *l, kn_batch *b) {
    if (!l || !b) return kn_set_error(KN_ERR_INVALID, "kn_loader_next: NULL loader or batch");
    slot *s;
    if (l->o.prefetch) {
        if (!l->running)
            return kn_set_error(KN_ERR_STATE, "kn_loader_next: the prefetch thread could not be restarted; "
                                "call kn_loader_seek again or make the loader with prefetch = false");
        pthread_mutex_lock(&l->mu);
        if (l->held >= 0) { l->slots[l->held].ready = 0; l->held = -1; pthread_cond_broadcast(&l->cv); }
        while (!l->slots[l->head].ready) pthread_cond_wait(&l->cv, &l->mu);
        s = &l->slots[l->head];
        l->held = l->head;
        l->head ^= 1;
        pthread_mutex_unlock(&l->mu);
    } else {
        s = &l->slots[0];
        int64_t e = l->pe, i = l->pi;
        advance(l);
        fill(l, s, e, i);
    }
    memset(b, 0, sizeof *b);
    b->epoch = s->epoch; b->index = s->index;
    if (s->st) return kn_set_error(s->st, "%s", s->err);   /* the next call goes on with the next batch */
    b->size = s->size;
    b->indices = s->indices;
    for (int f = 0; f < l->nf; f++) b->data[f] = s->data[f];
    return KN_OK;
}

kn_status kn_batch_write(const kn_batch *b, const kn_dataset *ds, int f, kn_tensor *t) {
    const kn_data_field *fd = kn_dataset_field(ds, f);
    if (!b || !fd || !t || !b->data[f])
        return kn_set_error(KN_ERR_INVALID, "kn_batch_write: NULL batch/tensor or field %d out of range", f);
    int64_t per = 1;
    for (int d = 0; d < fd->ndim; d++) per *= fd->shape[d];
    if (kn_numel(t) != b->size * per)
        return kn_set_error(KN_ERR_INVALID, "kn_batch_write: field '%s' of a batch of %lld holds %lld elements but the "
                            "tensor has %lld; size the tensor [%lld, ...] or set drop_last", fd->name,
                            (long long)b->size, (long long)(b->size * per), (long long)kn_numel(t),
                            (long long)b->size);
    return kn_tensor_write(t, b->data[f], fd->dtype);
}
