/*
 * threadpool.c: a fixed pool of persistent worker threads for the CPU kernels. The caller
 * of loom_threadpool_run is thread 0 and works too; workers sleep on a condition variable
 * between runs. The barrier spins briefly, then sleeps on a futex (Linux; elsewhere it
 * yields), so the kernels' per-node barriers stay cheap when the pool has the cores to
 * itself, and a waiter gives its core to a descheduled peer when it does not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "core/core-impl.h"

#define LOOM__MAX_THREADS 1024

struct loom__worker {
    loom_threadpool *tp;
    int ith;
};

struct loom_threadpool {
    int n_threads;
    int n_workers;                /* n_threads - 1, or n_threads when the caller only waits */
    pthread_t *threads;           /* [n_workers]: threads n_threads-n_workers..n_threads-1 */
    struct loom__worker *workers; /* [n_workers] */
    int n_started;
    loom_thread_start_fn start; /* called by each worker once, before its first task */
    void *start_data;

    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    uint64_t generation; /* bumped by each run (under mu) */
    int n_done;          /* workers finished with the current run (under mu) */
    bool stop;
    loom_task_fn fn;
    void *user_data;
    atomic_bool running;

    atomic_int barrier_count;
    atomic_uint barrier_phase;
    atomic_int barrier_sleepers; /* threads in (or entering) a futex wait on barrier_phase */
};

/* Spins before a barrier waiter sleeps: long enough for a balanced node's stragglers on
 * free cores (a few microseconds), short enough not to burn a shared core. */
#define LOOM__BARRIER_SPINS 1000

static void loom__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void *loom__worker_main(void *arg) {
    struct loom__worker *w = arg;
    loom_threadpool *tp = w->tp;
    uint64_t seen = 0;
    if (tp->start) tp->start(w->ith, tp->n_threads, tp->start_data);
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (tp->generation == seen && !tp->stop)
            pthread_cond_wait(&tp->cv_start, &tp->mu);
        if (tp->stop) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->generation;
        loom_task_fn fn = tp->fn;
        void *ud = tp->user_data;
        pthread_mutex_unlock(&tp->mu);

        fn(w->ith, tp->n_threads, ud);

        pthread_mutex_lock(&tp->mu);
        if (++tp->n_done == tp->n_workers) pthread_cond_signal(&tp->cv_done);
        pthread_mutex_unlock(&tp->mu);
    }
}

static void loom__threadpool_stop(loom_threadpool *tp) {
    pthread_mutex_lock(&tp->mu);
    tp->stop = true;
    pthread_cond_broadcast(&tp->cv_start);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_started; i++)
        pthread_join(tp->threads[i], NULL);
    tp->n_started = 0;
}

static void loom__threadpool_destroy(loom_threadpool *tp) {
    pthread_cond_destroy(&tp->cv_done);
    pthread_cond_destroy(&tp->cv_start);
    pthread_mutex_destroy(&tp->mu);
    loom_free(tp->workers);
    loom_free(tp->threads);
    loom_free(tp);
}

loom_threadpool *loom_threadpool_new(int n_threads) {
    return loom_threadpool_new_ex(n_threads, NULL, NULL, true);
}

loom_threadpool *loom_threadpool_new_ex(int n_threads, loom_thread_start_fn start, void *start_data,
                                        bool caller_works) {
    if (n_threads < 1 || n_threads > LOOM__MAX_THREADS) {
        loom_error(LOOM_ERR_INVALID_ARG, "threadpool_new: n_threads %d is not in [1, %d]",
                   n_threads, LOOM__MAX_THREADS);
        return NULL;
    }
    loom_threadpool *tp = loom_calloc(1, sizeof *tp);
    if (!tp) {
        loom_error(LOOM_ERR_NOMEM, "threadpool_new: out of memory for a pool of %d threads",
                   n_threads);
        return NULL;
    }
    tp->n_threads = n_threads;
    tp->n_workers = caller_works ? n_threads - 1 : n_threads;
    tp->start = start;
    tp->start_data = start_data;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_start, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    atomic_init(&tp->running, false);
    atomic_init(&tp->barrier_count, 0);
    atomic_init(&tp->barrier_phase, 0u);
    atomic_init(&tp->barrier_sleepers, 0);
    int nw = tp->n_workers, first = n_threads - nw;
    if (nw > 0) {
        tp->threads = loom_calloc((size_t)nw, sizeof *tp->threads);
        tp->workers = loom_calloc((size_t)nw, sizeof *tp->workers);
        if (!tp->threads || !tp->workers) {
            loom__threadpool_destroy(tp);
            loom_error(LOOM_ERR_NOMEM, "threadpool_new: out of memory for a pool of %d threads",
                       n_threads);
            return NULL;
        }
    }
    for (int i = 0; i < nw; i++) {
        tp->workers[i] = (struct loom__worker){.tp = tp, .ith = first + i};
        int rc = pthread_create(&tp->threads[i], NULL, loom__worker_main, &tp->workers[i]);
        if (rc != 0) {
            loom__threadpool_stop(tp);
            loom__threadpool_destroy(tp);
            loom_error(rc == EAGAIN ? LOOM_ERR_NOMEM : LOOM_ERR_INTERNAL,
                       "threadpool_new: pthread_create failed for thread %d of %d: %s", first + i,
                       n_threads, strerror(rc));
            return NULL;
        }
        tp->n_started++;
    }
    return tp;
}

void loom_threadpool_free(loom_threadpool *tp) {
    if (!tp) return;
    LOOM_ASSERT(!atomic_load(&tp->running));
    loom__threadpool_stop(tp);
    loom__threadpool_destroy(tp);
}

int loom_threadpool_size(const loom_threadpool *tp) {
    return tp ? tp->n_threads : 1;
}

void loom_threadpool_run(loom_threadpool *tp, loom_task_fn fn, void *user_data) {
    LOOM_ASSERT(tp && fn);
    bool was_running = atomic_exchange(&tp->running, true);
    LOOM_ASSERT(!was_running && "threadpool_run is not reentrant");
    if (tp->n_workers == 0) {
        fn(0, 1, user_data);
        atomic_store(&tp->running, false);
        return;
    }
    atomic_store(&tp->barrier_count, 0);
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->user_data = user_data;
    tp->n_done = 0;
    tp->generation++;
    pthread_cond_broadcast(&tp->cv_start);
    pthread_mutex_unlock(&tp->mu);

    if (tp->n_workers < tp->n_threads) fn(0, tp->n_threads, user_data);

    pthread_mutex_lock(&tp->mu);
    while (tp->n_done < tp->n_workers)
        pthread_cond_wait(&tp->cv_done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    atomic_store(&tp->running, false);
}

static void loom__phase_wait(atomic_uint *phase, unsigned seen) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)phase, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)phase, (void)seen;
    sched_yield();
#endif
}

static void loom__phase_wake(atomic_uint *phase) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)phase, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#else
    (void)phase;
#endif
}

/* Sense-reversing barrier: the last thread to arrive resets the count, then advances the
 * phase that the others wait on, spinning first, then sleeping on the phase word (a
 * futex). A sleeper registers before it re-checks the phase and the waker advances the
 * phase before it reads the sleeper count (both sequentially consistent), so either the
 * sleeper sees the new phase or the waker sees the sleeper: no wake-up is lost. */
void loom_threadpool_barrier(loom_threadpool *tp) {
    if (!tp || tp->n_threads == 1) return;
    unsigned phase = atomic_load(&tp->barrier_phase);
    if (atomic_fetch_add(&tp->barrier_count, 1) == tp->n_threads - 1) {
        atomic_store(&tp->barrier_count, 0);
        atomic_fetch_add(&tp->barrier_phase, 1u);
        if (atomic_load(&tp->barrier_sleepers) > 0) loom__phase_wake(&tp->barrier_phase);
        return;
    }
    for (int spins = 0; spins < LOOM__BARRIER_SPINS; spins++) {
        if (atomic_load_explicit(&tp->barrier_phase, memory_order_acquire) != phase) return;
        loom__cpu_relax();
    }
    atomic_fetch_add(&tp->barrier_sleepers, 1);
    while (atomic_load(&tp->barrier_phase) == phase)
        loom__phase_wait(&tp->barrier_phase, phase);
    atomic_fetch_sub(&tp->barrier_sleepers, 1);
}

int loom_n_cpus(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
