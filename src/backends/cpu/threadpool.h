/* threadpool.h: the CPU backend's persistent worker pool.
 *
 * One process-wide pool of pthreads, created on first use and kept alive, so
 * that kernels can fan out thousands of times per second (decode loops) without
 * creating threads. Size: env KN_THREADS, default the number of online cores.
 * The calling thread always takes part; workers spin briefly after each job
 * and then sleep on a condition variable.
 *
 * Non-goals: work stealing, task graphs, barriers inside a job. A job is one
 * function run as fn(ctx, i, nth) for i in [0, nth); split the work in fn.
 *
 *   static void add_rows(void *ctx, int ith, int nth) {
 *       struct job *j = ctx;
 *       int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
 *       ...
 *   }
 *   kn_pool_run(add_rows, &job, 0);      // all pool threads, returns when done
 *
 * Nested calls (from inside a job) and calls that find the pool busy with
 * another thread's job run every part serially on the calling thread, so they
 * are always safe, only not parallel.
 */
#ifndef KN_THREADPOOL_H
#define KN_THREADPOOL_H

typedef void (*kn_pool_fn)(void *ctx, int ith, int nth);

int  kn_pool_nthreads(void);                          /* current size (>= 1)        */
void kn_pool_set_threads(int n);                      /* resize (n <= 0: default)   */
/* Run fn(ctx, i, nth) once for each i in [0, nth), on up to nth threads
 * including the caller, and wait for all. Parts are claimed from a shared
 * counter, so which thread runs which i is not fixed (and the caller runs
 * parts no worker has picked up yet). nth <= 0 means the pool size; nth may
 * exceed the pool size. */
void kn_pool_run(kn_pool_fn fn, void *ctx, int nth);

#endif
