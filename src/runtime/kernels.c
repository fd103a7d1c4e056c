/* kernels.c: the compiler's generated kernels, built once per process.
 *
 * plan.c asks for a group's kernel by its source; a source seen before (the
 * same fused block in each of 30 layers, or the same plan built again) gets
 * the handle built the first time, so a backend compiles (or reads from its
 * disk cache) each distinct kernel once per process. Handles live until the
 * process ends: plans share them and they are small. A build that failed is
 * remembered too (NULL handle), so it is not retried for every plan.
 */
#include "runtime/runtime.h"
#include "core/env.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct built {
    struct built *next;
    kn_backend *be;
    uint64_t hash;
    char *src;
    void *handle;
} built;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static built *g_built[256];
static int g_nbuilt, g_nfailed, g_nreported;

void *kn__kernel_get(kn_backend *be, const char *src, const char *name, bool quiet) {
    uint64_t h = kn__fnv1a(src, strlen(src));
    pthread_mutex_lock(&g_lock);
    built **slot = &g_built[h & 255];
    for (built *b = *slot; b; b = b->next)
        if (b->be == be && b->hash == h && !strcmp(b->src, src)) { pthread_mutex_unlock(&g_lock); return b->handle; }
    /* build under the lock: two threads planning the same kernel build it once */
    char why[1024] = "";
    void *handle = be->kernel_build(be, src, name, why, sizeof why);
    built *b = malloc(sizeof *b);
    char *copy = b ? malloc(strlen(src) + 1) : NULL;
    if (b && copy) {
        strcpy(copy, src);
        *b = (built){*slot, be, h, copy, handle};
        *slot = b;
    } else {
        free(b);   /* not remembered: the next plan asks again */
    }
    if (handle) g_nbuilt++;
    else {
        g_nfailed++;
        if (!quiet && (kn_env_get()->debug || ++g_nreported == 1))
            fprintf(stderr, "kiln: generated kernel %s not built on %s (its nodes run the hand kernels): %s\n",
                    name, be->name, why[0] ? why : "no reason given");
    }
    pthread_mutex_unlock(&g_lock);
    return handle;
}
