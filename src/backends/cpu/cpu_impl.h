/* cpu_impl.h: internals shared by the fast CPU backend's files.
 * defines: kn_cpu_par_rows (split a row range over the thread pool). */
#ifndef KN_CPU_IMPL_H
#define KN_CPU_IMPL_H
#include <stdint.h>

/* Below this many elements of work a job runs on the calling thread: waking
 * the pool costs more than the work. */
#define KN_CPU_PAR_MIN 32768

typedef void (*kn_rows_fn)(void *ctx, int64_t r0, int64_t r1);
/* Run fn over rows [0, rows) split across the pool when `work` (elements
 * touched) is at least KN_CPU_PAR_MIN, else on the calling thread. */
void kn_cpu_par_rows(kn_rows_fn fn, void *ctx, int64_t rows, int64_t work);
#endif
