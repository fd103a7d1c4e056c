/* kn_bench.h: the clock and the sort order every benchmark driver uses. */
#ifndef KN_BENCH_H
#define KN_BENCH_H
#include <time.h>

/* monotonic wall-clock seconds */
static inline double kn_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* qsort order for doubles (medians of timings) */
static inline int kn_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#endif
