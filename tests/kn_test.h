/* kn_test.h: the tiny test harness every tests/test_*.c uses.
 *
 *   #include "kn_test.h"
 *   TEST(add_broadcast) { ... CHECK(cond, "fmt", ...); ... }
 *   TEST(needs_model)   { if (!file) SKIP("asset %s missing", path); ... }
 *   int main(void) { return kn_test_main(); }   // or KN_TEST_MAIN()
 *
 * Each test binary prints one line per test and a summary line
 * "# totals: P F S" that tests/run.sh adds up into the suite's closing line
 * "N passed, N failed, N skipped". A failing CHECK marks the test failed and
 * carries on (so one run shows every broken case); REQUIRE returns at once.
 * Assets are found through KN_ASSETS (default ../shared/assets), see kn_asset().
 */
#ifndef KN_TEST_H
#define KN_TEST_H
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct kn_test_case { const char *name; void (*fn)(void); } kn_test_case;
#define KN_TEST_MAX 1024
static kn_test_case kn__tests[KN_TEST_MAX];
static int kn__ntests;
static int kn__failed_now, kn__skipped_now;
static char kn__skip_why[512];

#define TEST(name)                                                            \
    static void kn_test_##name(void);                                         \
    __attribute__((constructor)) static void kn_test_reg_##name(void) {       \
        if (kn__ntests < KN_TEST_MAX)                                         \
            kn__tests[kn__ntests++] = (kn_test_case){#name, kn_test_##name};  \
    }                                                                         \
    static void kn_test_##name(void)

#define CHECK(cond, ...)                                                      \
    do { if (!(cond)) {                                                       \
        fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
        fprintf(stderr, __VA_ARGS__); fputc('\n', stderr);                    \
        kn__failed_now++; } } while (0)
#define REQUIRE(cond, ...)                                                    \
    do { if (!(cond)) { CHECK(cond, __VA_ARGS__); return; } } while (0)
#define SKIP(...)                                                             \
    do { snprintf(kn__skip_why, sizeof kn__skip_why, __VA_ARGS__);            \
         kn__skipped_now = 1; return; } while (0)

/* Relative error of two arrays: ||a-b|| / max(||b||, tiny); NaN anywhere -> inf. */
static inline double kn_rel_err(const double *a, const double *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        if (isnan(a[i])) continue;
        if (isinf(a[i]) || isinf(b[i])) { if (a[i] != b[i]) return INFINITY; continue; }
        num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i];
    }
    return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1.0);
}
static inline double kn_max_abs_diff_f32(const float *a, const float *b, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* Path of an asset under $KN_ASSETS (default ../shared/assets); NULL if absent. */
static inline const char *kn_asset(const char *rel) {
    static char buf[8][1024]; static int k;
    const char *root = getenv("KN_ASSETS");
    if (!root || !*root) root = "../shared/assets";
    char *p = buf[k++ & 7];
    snprintf(p, 1024, "%s/%s", root, rel);
    struct stat st;
    return stat(p, &st) == 0 ? p : NULL;
}

/* Deterministic test data (splitmix64), so a failure reproduces. */
static unsigned long long kn__rng = 0x9E3779B97F4A7C15ull;
static inline void kn_test_seed(unsigned long long s) { kn__rng = s * 0x9E3779B97F4A7C15ull + 1; }
static inline unsigned long long kn_test_u64(void) {
    unsigned long long z = (kn__rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static inline double kn_test_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(kn_test_u64() >> 11) * (1.0 / 9007199254740992.0);
}
static inline void kn_test_fill_f32(float *x, long n, double lo, double hi) {
    for (long i = 0; i < n; i++) x[i] = (float)kn_test_uniform(lo, hi);
}

static inline int kn_test_main(void) {
    const char *only = getenv("KN_TEST_ONLY");
    int pass = 0, fail = 0, skip = 0;
    for (int i = 0; i < kn__ntests; i++) {
        if (only && *only && !strstr(kn__tests[i].name, only)) continue;
        kn__failed_now = 0; kn__skipped_now = 0; kn__skip_why[0] = 0;
        kn__tests[i].fn();
        if (kn__failed_now) { fail++; printf("FAIL %s\n", kn__tests[i].name); }
        else if (kn__skipped_now) { skip++; printf("skip %s: %s\n", kn__tests[i].name, kn__skip_why); }
        else { pass++; printf("ok   %s\n", kn__tests[i].name); }
        fflush(stdout);
    }
    printf("# totals: %d %d %d\n", pass, fail, skip);
    return fail ? 1 : 0;
}
#define KN_TEST_MAIN() int main(void) { return kn_test_main(); }
#endif
