/*
 * threadpool.c: a fixed pool of persistent worker threads for the CPU kernels. The caller
 * of loom_threadpool_run is thread 0 and works too. Every wait (a worker for the next run,
 * the caller for the workers, a thread at the barrier) spins first, for an adaptive time
 * (up to a millisecond), then sleeps on a futex (Linux; elsewhere it yields); a wake-up
 * makes a system call only when a waiter is asleep. So a token's graph, with its many
 * short barriers, keeps its threads on their cores, and an idle pool sleeps.
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

/* A 32-bit word threads wait on to change: spin first (adaptive, below), then sleep on it
 * as a futex. A sleeper registers in `sleepers` before it re-checks the word, and a waker
 * changes the word before it reads `sleepers` (both sequentially consistent), so either
 * the sleeper sees the new value or the waker sees the sleeper: no wake-up is lost, and a
 * waker with nobody asleep makes no system call. */
typedef struct loom__waitword {
    atomic_uint word;
    atomic_int sleepers;
    atomic_llong spin_ns; /* the adaptive spin budget (relaxed) */
} loom__waitword;

struct loom_threadpool {
    int n_threads;
    int n_workers;                /* n_threads - 1, or n_threads when the caller only waits */
    pthread_t *threads;           /* [n_workers]: threads n_threads-n_workers..n_threads-1 */
    struct loom__worker *workers; /* [n_workers] */
    int n_started;
    loom_thread_start_fn start; /* called by each worker once, before its first task */
    void *start_data;
    int n_cpus; /* loom_n_cpus() when the pool was made */

    loom__waitword gen;  /* bumped by each run (and by stop): the workers wait on it */
    loom__waitword done; /* workers finished with the current run: the caller waits on it */
    atomic_bool stop;
    loom_task_fn fn; /* written before gen is bumped, read after */
    void *user_data;
    atomic_bool running;

    atomic_int barrier_count;
    loom__waitword barrier; /* word: the barrier's phase */
};

/* Process-wide counters (relaxed; loom_threadpool_get_stats). */
static atomic_ullong loom__tp_barriers, loom__tp_sleeps, loom__tp_wakes, loom__tp_runs;
/* Threads of all live pools with workers (several backends, sim devices, each with a pool):
 * above the cores, waits spin briefly only (LOOM__SPIN_MIN_NS). */
static atomic_int loom__tp_live_threads;

/* How long a waiter spins before it sleeps, adapted per wait word like an adaptive mutex:
 * a wait that ended while spinning raises the budget to twice its length (a token's
 * barriers are microseconds to a few hundred apart, and a sleep costs two context switches
 * and, on a busy machine, the wait to get a core back); a wait that had to sleep halves
 * it. So while the threads have their cores the budget settles above the typical
 * waits and nobody sleeps; when a peer is descheduled (a competing process holds its
 * core), spinning cannot help and the budget falls to LOOM__SPIN_MIN_NS, so a waiter soon
 * gives its core away to that peer. While the live pools have more threads than the
 * process has cores, waits never spin long. */
#define LOOM__SPIN_MAX_NS 1000000LL
#define LOOM__SPIN_MIN_NS 20000LL

static void loom__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void loom__futex_wait(atomic_uint *word, unsigned seen) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)word, (void)seen;
    sched_yield();
#endif
}

static void loom__futex_wake(atomic_uint *word) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

static void loom__ww_init(loom__waitword *w) {
    atomic_init(&w->word, 0u);
    atomic_init(&w->sleepers, 0);
    atomic_init(&w->spin_ns, LOOM__SPIN_MIN_NS);
}

/* After changing w->word: wakes its sleepers, if any (the only system call of a wake-up). */
static void loom__ww_wake(loom__waitword *w) {
    if (atomic_load(&w->sleepers) > 0) {
        atomic_fetch_add_explicit(&loom__tp_wakes, 1, memory_order_relaxed);
        loom__futex_wake(&w->word);
    }
}

/* Returns once w->word differs from seen (acquire). */
static void loom__ww_wait(const loom_threadpool *tp, loom__waitword *w, unsigned seen) {
    if (atomic_load_explicit(&w->word, memory_order_acquire) != seen) return;
    long long budget = atomic_load_explicit(&w->spin_ns, memory_order_relaxed);
    if (atomic_load_explicit(&loom__tp_live_threads, memory_order_relaxed) > tp->n_cpus)
        budget = LOOM__SPIN_MIN_NS;
    const int64_t t0 = loom_time_ns();
    int64_t now = t0;
    bool changed = false;
    while (!changed && now - t0 < budget) {
        /* the clock is read every 32 pauses (about two microseconds here) */
        for (int i = 0; i < 32; i++) {
            if (atomic_load_explicit(&w->word, memory_order_acquire) != seen) {
                changed = true;
                break;
            }
            loom__cpu_relax();
        }
        now = loom_time_ns();
    }
    if (changed) {
        const long long want = 2 * (long long)(now - t0);
        if (want > budget)
            atomic_store_explicit(&w->spin_ns, want < LOOM__SPIN_MAX_NS ? want : LOOM__SPIN_MAX_NS,
                                  memory_order_relaxed);
        return;
    }
    atomic_fetch_add(&w->sleepers, 1);
    while (atomic_load(&w->word) == seen) {
        atomic_fetch_add_explicit(&loom__tp_sleeps, 1, memory_order_relaxed);
        loom__futex_wait(&w->word, seen);
    }
    atomic_fetch_sub(&w->sleepers, 1);
    /* a wait that slept but ended within LOOM__SPIN_MAX_NS would have been cheaper spun
     * (long phases on a quiet machine: f32 weights): spin twice as long next time; one
     * that lasted longer (a descheduled peer, an idle pool) halves the budget */
    const long long waited = (long long)(loom_time_ns() - t0);
    long long next = budget / 2 > LOOM__SPIN_MIN_NS ? budget / 2 : LOOM__SPIN_MIN_NS;
    if (waited < LOOM__SPIN_MAX_NS) next = 2 * waited > budget ? 2 * waited : budget;
    if (next > LOOM__SPIN_MAX_NS) next = LOOM__SPIN_MAX_NS;
    atomic_store_explicit(&w->spin_ns, next, memory_order_relaxed);
}

static void *loom__worker_main(void *arg) {
    struct loom__worker *w = arg;
    loom_threadpool *tp = w->tp;
    unsigned seen = 0;
    if (tp->start) tp->start(w->ith, tp->n_threads, tp->start_data);
    for (;;) {
        loom__ww_wait(tp, &tp->gen, seen);
        seen = atomic_load_explicit(&tp->gen.word, memory_order_acquire);
        if (atomic_load(&tp->stop)) return NULL;
        tp->fn(w->ith, tp->n_threads, tp->user_data);
        if ((int)atomic_fetch_add(&tp->done.word, 1u) + 1 == tp->n_workers)
            loom__ww_wake(&tp->done);
    }
}

static void loom__threadpool_stop(loom_threadpool *tp) {
    atomic_store(&tp->stop, true);
    atomic_fetch_add(&tp->gen.word, 1u);
    loom__ww_wake(&tp->gen);
    for (int i = 0; i < tp->n_started; i++)
        pthread_join(tp->threads[i], NULL);
    tp->n_started = 0;
}

static void loom__threadpool_destroy(loom_threadpool *tp) {
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
    tp->n_cpus = loom_n_cpus();
    loom__ww_init(&tp->gen);
    loom__ww_init(&tp->done);
    loom__ww_init(&tp->barrier);
    atomic_init(&tp->stop, false);
    atomic_init(&tp->running, false);
    atomic_init(&tp->barrier_count, 0);
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
    if (nw > 0) atomic_fetch_add_explicit(&loom__tp_live_threads, n_threads, memory_order_relaxed);
    return tp;
}

void loom_threadpool_free(loom_threadpool *tp) {
    if (!tp) return;
    LOOM_ASSERT(!atomic_load(&tp->running));
    if (tp->n_workers > 0)
        atomic_fetch_sub_explicit(&loom__tp_live_threads, tp->n_threads, memory_order_relaxed);
    loom__threadpool_stop(tp);
    loom__threadpool_destroy(tp);
}

int loom_threadpool_size(const loom_threadpool *tp) {
    return tp ? tp->n_threads : 1;
}

/* The workers wait on gen (spinning while runs follow each other closely), the caller on
 * done; neither hand-over takes a lock, and a wake-up is a system call only when the
 * other side went to sleep. */
void loom_threadpool_run(loom_threadpool *tp, loom_task_fn fn, void *user_data) {
    LOOM_ASSERT(tp && fn);
    bool was_running = atomic_exchange(&tp->running, true);
    LOOM_ASSERT(!was_running && "threadpool_run is not reentrant");
    atomic_fetch_add_explicit(&loom__tp_runs, 1, memory_order_relaxed);
    if (tp->n_workers == 0) {
        fn(0, 1, user_data);
        atomic_store(&tp->running, false);
        return;
    }
    atomic_store(&tp->barrier_count, 0);
    atomic_store(&tp->done.word, 0u);
    tp->fn = fn;
    tp->user_data = user_data;
    atomic_fetch_add(&tp->gen.word, 1u); /* publishes fn, user_data and done = 0 */
    loom__ww_wake(&tp->gen);

    if (tp->n_workers < tp->n_threads) fn(0, tp->n_threads, user_data);

    for (;;) {
        unsigned d = atomic_load_explicit(&tp->done.word, memory_order_acquire);
        if ((int)d == tp->n_workers) break;
        loom__ww_wait(tp, &tp->done, d);
    }
    atomic_store(&tp->running, false);
}

/* Sense-reversing barrier: the last thread to arrive resets the count, then advances the
 * phase that the others wait on (loom__ww_wait: spin, then sleep on the phase word). */
void loom_threadpool_barrier(loom_threadpool *tp) {
    loom_threadpool_barrier_last(tp, NULL, NULL);
}

/* The last thread to arrive has seen every other thread's writes (the arrivals are
 * sequentially consistent read-modify-writes of one counter), runs last(arg), and its
 * writes reach the others through the phase advance they acquire. */
void loom_threadpool_barrier_last(loom_threadpool *tp, void (*last)(void *arg), void *arg) {
    if (!tp || tp->n_threads == 1) {
        if (last) last(arg);
        return;
    }
    unsigned phase = atomic_load(&tp->barrier.word);
    if (atomic_fetch_add(&tp->barrier_count, 1) == tp->n_threads - 1) {
        atomic_store(&tp->barrier_count, 0);
        if (last) last(arg);
        atomic_fetch_add_explicit(&loom__tp_barriers, 1, memory_order_relaxed);
        atomic_fetch_add(&tp->barrier.word, 1u);
        loom__ww_wake(&tp->barrier);
        return;
    }
    loom__ww_wait(tp, &tp->barrier, phase);
}

void loom_threadpool_get_stats(loom_threadpool_stats *out) {
    out->runs = atomic_load_explicit(&loom__tp_runs, memory_order_relaxed);
    out->barriers = atomic_load_explicit(&loom__tp_barriers, memory_order_relaxed);
    out->sleeps = atomic_load_explicit(&loom__tp_sleeps, memory_order_relaxed);
    out->wakes = atomic_load_explicit(&loom__tp_wakes, memory_order_relaxed);
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
