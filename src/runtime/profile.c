/* profile.c: KN_PROFILE, time spent in the backend's compute calls of
 * kn_plan_run, printed at exit (a development aid).
 *
 * Works on one kn_exec per timed call. KN_PROFILE=1 adds up the time per op;
 * KN_PROFILE=shapes also times each distinct (op, operand extents/strides)
 * and prints the 30 costliest, with GFLOP/s for matmuls. The tables are
 * process-wide, filled by every plan run.
 */
#include "runtime/runtime.h"
#include "core/env.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double g_prof_s[KN_OP_COUNT];
static long g_prof_n[KN_OP_COUNT];
static int g_prof = -1;
static double g_fused_s;      /* generated kernels of fused groups (src/compile/) */
static long g_fused_n;
enum { PROF_KEYS = 512 };
static struct { char key[200]; double s, flop; long n; } g_pk[PROF_KEYS];
static int g_npk;

static void prof_view(const kn_tview *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->ne[i]);
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "]/");
    for (int i = 0; i < v->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)v->st[i]);
}
static void prof_shape(const kn_exec *e, double sec) {
    char key[200], d[64], a[64] = "", b[64] = "";
    prof_view(&e->dst, d, sizeof d);
    if (e->nsrc > 0 && e->node->src[0]) prof_view(&e->src[0], a, sizeof a);
    if (e->nsrc > 1 && e->node->src[1]) prof_view(&e->src[1], b, sizeof b);
    snprintf(key, sizeof key, "%s %s <- %s %s", kn_op_name(e->node->op), d, a, b);
    int i = 0;
    while (i < g_npk && strcmp(g_pk[i].key, key)) i++;
    if (i == g_npk) { if (g_npk == PROF_KEYS) return; snprintf(g_pk[g_npk++].key, sizeof g_pk[0].key, "%s", key); }
    g_pk[i].s += sec;
    g_pk[i].n++;
    if (e->node->op == KN_OP_MATMUL && e->src[0].ndim >= 1)
        g_pk[i].flop += 2.0 * (double)kn_tview_numel(&e->dst) * (double)e->src[0].ne[e->src[0].ndim - 1];
}
static void prof_dump_shapes(void) {
    for (int k = 0; k < 30 && k < g_npk; k++) {
        int best = k;
        for (int i = k + 1; i < g_npk; i++) if (g_pk[i].s > g_pk[best].s) best = i;
        if (best != k) { __typeof__(g_pk[0]) t = g_pk[k]; g_pk[k] = g_pk[best]; g_pk[best] = t; }
        fprintf(stderr, "  %7ld x %8.3f ms  %6.1f GFLOP/s  %s\n", g_pk[k].n, 1e3 * g_pk[k].s / (double)g_pk[k].n,
                g_pk[k].flop > 0 ? g_pk[k].flop / g_pk[k].s * 1e-9 : 0.0, g_pk[k].key);
    }
}
static void prof_dump(void) {
    double tot = 0;
    for (int i = 0; i < KN_OP_COUNT; i++) tot += g_prof_s[i];
    tot += g_fused_s;
    fprintf(stderr, "kiln profile (%.3f s in kernels):\n", tot);
    for (int k = 0; k < KN_OP_COUNT; k++) {
        int best = -1;
        for (int i = 0; i < KN_OP_COUNT; i++)
            if (g_prof_n[i] && (best < 0 || g_prof_s[i] > g_prof_s[best])) best = i;
        if (best < 0) break;
        fprintf(stderr, "  %-20s %8ld calls %9.3f s %5.1f%%\n", kn_op_name((kn_op)best), g_prof_n[best], g_prof_s[best],
                100 * g_prof_s[best] / (tot > 0 ? tot : 1));
        g_prof_n[best] = 0;
    }
    if (g_fused_n)
        fprintf(stderr, "  %-20s %8ld calls %9.3f s %5.1f%%\n", "(fused kernels)", g_fused_n, g_fused_s, 100 * g_fused_s / (tot > 0 ? tot : 1));
    if (g_npk) prof_dump_shapes();
}

int kn__profile_mode(void) {
    if (g_prof < 0) {
        g_prof = kn_env_get()->profile;
        if (g_prof) atexit(prof_dump);
    }
    return g_prof;
}

double kn__profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kn__profile_node(int mode, const kn_exec *e, double sec) {
    g_prof_s[e->node->op] += sec;
    g_prof_n[e->node->op]++;
    if (mode == 2) prof_shape(e, sec);
}

void kn__profile_kernel(const char *name, double sec) {
    g_fused_s += sec;
    g_fused_n++;
    if (g_prof != 2) return;
    /* KN_PROFILE=shapes: each generated kernel on its own row, by name */
    char key[200];
    snprintf(key, sizeof key, "(fused) %s", name);
    int i = 0;
    while (i < g_npk && strcmp(g_pk[i].key, key)) i++;
    if (i == g_npk) { if (g_npk == PROF_KEYS) return; snprintf(g_pk[g_npk++].key, sizeof g_pk[0].key, "%s", key); }
    g_pk[i].s += sec;
    g_pk[i].n++;
}
