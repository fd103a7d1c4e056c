/* threadpool.c: persistent pthread pool for CPU kernels (see threadpool.h).
 *
 * Protocol: the publisher writes the job (fn, ctx, nth), resets the part
 * counter, opens the job (g_open = its generation) and bumps the generation
 * `gen`. Parts are claimed from the counter by whoever comes: the caller
 * first, then every worker that wakes while the job is open. So the caller
 * never waits for a worker that has not been scheduled yet (on a busy machine
 * that can take a time slice): it runs the unclaimed parts itself.
 *
 * Job lifetime: a worker registers in `g_entered` and only then checks that
 * the job it woke for is still open; the caller, once all parts are done,
 * closes the job and waits for `g_entered` to drain (both sides seq_cst, so one
 * of them sees the other). Registered threads are running, so that wait is
 * short; a worker that registers after the close sees it and touches nothing.
 *
 * Workers spin on `gen` for a short while (cheap wake-up for back-to-back
 * jobs), then sleep on a condition variable; the publisher only signals when
 * someone sleeps (Dekker-style again: g_sleepers++ / load gen vs. gen++ / load
 * g_sleepers).
 *
 * One job at a time: `g_run_mu` serializes publishers and resizes. A caller
 * that finds it taken (another thread's job), and any nested call from inside
 * a job, runs all parts serially on its own thread.
 *
 * Non-goals: fairness between competing callers, fork safety.
 */
#include "backends/cpu/threadpool.h"   // defines: kn_pool_*
#include "core/env.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define KN_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define KN_CPU_RELAX() __asm__ volatile("yield")
#else
#define KN_CPU_RELAX() ((void)0)
#endif

enum { KN_POOL_MAX = 512,        /* hard cap on pool size                        */
       KN_SPIN_WORKER = 1 << 14, /* pauses a worker spins before sleeping (~0.2 ms) */
       KN_SPIN_CALLER = 1 << 12  /* pauses the caller spins before it yields     */ };

/* ---- shared state --------------------------------------------------------- */
static pthread_once_t  g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_run_mu = PTHREAD_MUTEX_INITIALIZER;   /* one job / resize at a time */
static pthread_mutex_t g_sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  g_sleep_cv = PTHREAD_COND_INITIALIZER;

static atomic_uint g_gen;          /* job generation; bumped to publish a job     */
static atomic_uint g_open;         /* generation of the open job, 0 when closed   */
static atomic_int  g_sleepers;     /* workers blocked (or about to) on g_sleep_cv */
static atomic_int  g_entered;      /* threads registered in the open job          */
static atomic_int  g_next;         /* next unclaimed part                         */
static atomic_int  g_done;         /* parts finished                              */
static atomic_int  g_stop;         /* workers exit on the next generation         */

static kn_pool_fn g_fn;            /* current job; written only under g_run_mu    */
static void      *g_ctx;
static int        g_nth;

static atomic_int g_size;          /* wanted size incl. the caller (>= 1)         */
static int        g_live;          /* threads running incl. the caller (1 = none) */
static pthread_t  g_tid[KN_POOL_MAX];

static _Thread_local int t_in_job; /* this thread is inside a job: run nested serially */

typedef struct { int idx; unsigned gen0; } worker_arg;   /* idx: for debugging */
static worker_arg g_args[KN_POOL_MAX];

/* ---- sizing ----------------------------------------------------------------- */
static int default_size(void) {
    int want = kn_env_get()->threads;
    if (want > 0) return want < KN_POOL_MAX ? want : KN_POOL_MAX;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n < KN_POOL_MAX ? (int)n : KN_POOL_MAX;
}
static void init_once(void) { atomic_store(&g_size, default_size()); g_live = 1; }

/* ---- workers ---------------------------------------------------------------- */
/* Claim and run parts of the open job until none is left. */
static void run_parts(void) {
    const kn_pool_fn fn = g_fn;
    void *ctx = g_ctx;
    const int nth = g_nth;
    for (int i = atomic_fetch_add(&g_next, 1); i < nth; i = atomic_fetch_add(&g_next, 1)) {
        fn(ctx, i, nth);
        atomic_fetch_add_explicit(&g_done, 1, memory_order_release);
    }
}

static void *worker_main(void *p) {
    const worker_arg *a = p;
    unsigned seen = a->gen0;
    t_in_job = 1;                  /* a worker never publishes jobs itself */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&g_gen, memory_order_acquire)) == seen) {
            if (++spins < KN_SPIN_WORKER) { KN_CPU_RELAX(); continue; }
            pthread_mutex_lock(&g_sleep_mu);
            atomic_fetch_add(&g_sleepers, 1);
            while (atomic_load(&g_gen) == seen) pthread_cond_wait(&g_sleep_cv, &g_sleep_mu);
            atomic_fetch_sub(&g_sleepers, 1);
            pthread_mutex_unlock(&g_sleep_mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&g_stop)) return NULL;
        atomic_fetch_add(&g_entered, 1);                  /* seq_cst: pairs with the close */
        if (atomic_load(&g_open) == g) run_parts();       /* else: closed or a newer job */
        atomic_fetch_sub_explicit(&g_entered, 1, memory_order_release);
    }
}

/* Wake workers for a new generation. Caller holds g_run_mu. */
static void publish(void) {
    atomic_fetch_add(&g_gen, 1);                       /* seq_cst: pairs with g_sleepers++ */
    if (atomic_load(&g_sleepers) > 0) {
        pthread_mutex_lock(&g_sleep_mu);
        pthread_cond_broadcast(&g_sleep_cv);
        pthread_mutex_unlock(&g_sleep_mu);
    }
}

static void spin_until(atomic_int *v, int target) {
    int spins = 0;
    while (atomic_load_explicit(v, memory_order_acquire) != target) {
        if (++spins < KN_SPIN_CALLER) KN_CPU_RELAX();
        else { sched_yield(); spins = 0; }
    }
}

/* Stop and join all workers. Caller holds g_run_mu. */
static void stop_workers(void) {
    if (g_live <= 1) return;
    atomic_store(&g_stop, 1);
    publish();
    for (int i = 1; i < g_live; i++) pthread_join(g_tid[i], NULL);
    atomic_store(&g_stop, 0);
    g_live = 1;
}

/* Start workers up to g_size. Caller holds g_run_mu. On pthread_create failure
 * the pool simply stays smaller. */
static void start_workers(void) {
    if (g_live == g_size) return;
    stop_workers();
    unsigned gen0 = atomic_load(&g_gen);
    int live = 1;
    for (int i = 1; i < g_size; i++) {
        g_args[i] = (worker_arg){i, gen0};
        if (pthread_create(&g_tid[i], NULL, worker_main, &g_args[i]) != 0) break;
        live++;
    }
    g_live = live;
    if (live < g_size) atomic_store(&g_size, live);
}

/* ---- API -------------------------------------------------------------------- */
int kn_pool_nthreads(void) {
    pthread_once(&g_once, init_once);
    return atomic_load_explicit(&g_size, memory_order_relaxed);   /* lock-free: callable inside jobs */
}

void kn_pool_set_threads(int n) {
    pthread_once(&g_once, init_once);
    if (t_in_job) return;                      /* cannot resize from inside a job */
    if (n <= 0) n = default_size();
    if (n > KN_POOL_MAX) n = KN_POOL_MAX;
    pthread_mutex_lock(&g_run_mu);
    if (n != g_size) { stop_workers(); atomic_store(&g_size, n); }
    pthread_mutex_unlock(&g_run_mu);
}

static void run_serial(kn_pool_fn fn, void *ctx, int nth) {
    int was = t_in_job;
    t_in_job = 1;
    for (int i = 0; i < nth; i++) fn(ctx, i, nth);
    t_in_job = was;
}

void kn_pool_run(kn_pool_fn fn, void *ctx, int nth) {
    pthread_once(&g_once, init_once);
    if (nth <= 0) nth = atomic_load_explicit(&g_size, memory_order_relaxed);
    if (nth <= 0) nth = 1;
    if (nth == 1 || t_in_job || pthread_mutex_trylock(&g_run_mu) != 0) {
        run_serial(fn, ctx, nth);
        return;
    }
    start_workers();
    if (g_live == 1) {
        pthread_mutex_unlock(&g_run_mu);
        run_serial(fn, ctx, nth);
        return;
    }
    g_fn = fn; g_ctx = ctx; g_nth = nth;
    atomic_store(&g_next, 0);
    atomic_store(&g_done, 0);
    atomic_store(&g_open, atomic_load(&g_gen) + 1);   /* the generation publish() makes */
    publish();
    t_in_job = 1;
    run_parts();
    t_in_job = 0;
    spin_until(&g_done, nth);          /* parts other threads claimed are finished  */
    atomic_store(&g_open, 0);          /* seq_cst: pairs with the workers' g_entered++ */
    spin_until(&g_entered, 0);         /* no one still reads g_fn/g_ctx/g_nth       */
    pthread_mutex_unlock(&g_run_mu);
}
