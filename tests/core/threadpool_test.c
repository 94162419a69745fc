/*
 * threadpool_test.c: the pool runs fn on every thread with distinct ith, the caller is
 * thread 0, run() returns only when all are done, barriers order phases, and the pool is
 * reusable across many runs. Also loom_n_cpus and the monotonic clock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

typedef struct {
    atomic_int calls;
    atomic_llong sum;
    int nth_seen[64];
    pthread_t thread0;
    bool caller_is_0;
} count_ctx;

static void count_task(int ith, int nth, void *ud) {
    count_ctx *c = ud;
    atomic_fetch_add(&c->calls, 1);
    /* each thread sums its strided share of 0..99999 */
    long long s = 0;
    for (long long i = ith; i < 100000; i += nth)
        s += i;
    atomic_fetch_add(&c->sum, s);
    c->nth_seen[ith] = nth;
    if (ith == 0) c->caller_is_0 = pthread_equal(pthread_self(), c->thread0);
}

LOOM_TEST(threadpool, sum_over_threads) {
    const int sizes[] = {1, 2, 3, 8};
    for (int k = 0; k < 4; k++) {
        int n = sizes[k];
        loom_threadpool *tp = loom_threadpool_new(n);
        LOOM_REQUIRE(tp != NULL);
        LOOM_CHECK_EQ_INT(loom_threadpool_size(tp), n);
        for (int rep = 0; rep < 50; rep++) {
            count_ctx c;
            memset(&c, 0, sizeof c);
            atomic_init(&c.calls, 0);
            atomic_init(&c.sum, 0);
            c.thread0 = pthread_self();
            loom_threadpool_run(tp, count_task, &c);
            /* run returned: every thread has finished */
            LOOM_CHECK_EQ_INT(atomic_load(&c.calls), n);
            LOOM_CHECK_EQ_INT(atomic_load(&c.sum), 99999LL * 100000 / 2);
            LOOM_CHECK(c.caller_is_0);
            for (int i = 0; i < n; i++)
                LOOM_CHECK_EQ_INT(c.nth_seen[i], n);
        }
        loom_threadpool_free(tp);
    }
    loom_threadpool_free(NULL);
}

enum { PHASES = 200, MAXT = 8 };

typedef struct {
    loom_threadpool *tp;
    int slots[MAXT];
    atomic_int violations;
} barrier_ctx;

/* Phase p: every thread writes its slot, then after a barrier checks that all slots hold
 * p: a thread running ahead of a barrier would be caught. */
static void barrier_phase(barrier_ctx *b, int ith, int nth, int p) {
    __atomic_store_n(&b->slots[ith], p, __ATOMIC_RELAXED);
    loom_threadpool_barrier(b->tp);
    for (int j = 0; j < nth; j++)
        if (__atomic_load_n(&b->slots[j], __ATOMIC_RELAXED) != p)
            atomic_fetch_add(&b->violations, 1);
    loom_threadpool_barrier(b->tp);
}

static void barrier_task(int ith, int nth, void *ud) {
    for (int p = 1; p <= PHASES; p++) barrier_phase(ud, ith, nth, p);
}

LOOM_TEST(threadpool, barrier_orders_phases) {
    const int sizes[] = {1, 2, 4, 7};
    for (int k = 0; k < 4; k++) {
        barrier_ctx b;
        memset(&b, 0, sizeof b);
        atomic_init(&b.violations, 0);
        b.tp = loom_threadpool_new(sizes[k]);
        LOOM_REQUIRE(b.tp != NULL);
        for (int rep = 0; rep < 3; rep++) {
            memset(b.slots, 0, sizeof b.slots);
            loom_threadpool_run(b.tp, barrier_task, &b);
        }
        LOOM_CHECK_EQ_INT(atomic_load(&b.violations), 0);
        loom_threadpool_free(b.tp);
    }
}

enum { SLOW_PHASES = 12 };

/* As barrier_task, but in each phase one thread (in turn) arrives 1.5 ms late, longer than
 * any spin (LOOM__SPIN_MAX_NS): the others go to sleep on the futex and must be woken. */
static void slow_barrier_task(int ith, int nth, void *ud) {
    barrier_ctx *b = ud;
    for (int p = 1; p <= SLOW_PHASES; p++) {
        if (p % nth == ith) {
            struct timespec ts = {0, 1500000};
            nanosleep(&ts, NULL);
        }
        barrier_phase(b, ith, nth, p);
    }
}

/* Waits that outlast the spin: late arrivals at the barrier, and runs 3 ms apart (the
 * workers sleep between them). Every phase is still ordered, every run complete, and the
 * process-wide counters count exactly the runs and barriers made. */
LOOM_TEST(threadpool, sleeping_waiters_are_woken) {
    const int sizes[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        barrier_ctx b;
        memset(&b, 0, sizeof b);
        atomic_init(&b.violations, 0);
        b.tp = loom_threadpool_new(sizes[k]);
        LOOM_REQUIRE(b.tp != NULL);
        loom_threadpool_stats s0, s1;
        loom_threadpool_get_stats(&s0);
        for (int rep = 0; rep < 3; rep++) {
            struct timespec ts = {0, 3000000};
            nanosleep(&ts, NULL);
            memset(b.slots, 0, sizeof b.slots);
            loom_threadpool_run(b.tp, slow_barrier_task, &b);
            count_ctx c;
            memset(&c, 0, sizeof c);
            c.thread0 = pthread_self();
            nanosleep(&ts, NULL);
            loom_threadpool_run(b.tp, count_task, &c);
            LOOM_CHECK_EQ_INT(atomic_load(&c.calls), sizes[k]);
            LOOM_CHECK_EQ_INT(atomic_load(&c.sum), 99999LL * 100000 / 2);
        }
        loom_threadpool_get_stats(&s1);
        LOOM_CHECK_EQ_INT(atomic_load(&b.violations), 0);
        LOOM_CHECK_EQ_INT(s1.runs - s0.runs, 6);
        LOOM_CHECK_EQ_INT(s1.barriers - s0.barriers, 3 * 2 * SLOW_PHASES);
        loom_threadpool_free(b.tp);
    }
}

LOOM_TEST(threadpool, bad_sizes_and_cpus) {
    loom_clear_error();
    LOOM_CHECK(loom_threadpool_new(0) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "n_threads 0");
    LOOM_CHECK(loom_threadpool_new(-3) == NULL);
    int n = loom_n_cpus();
    LOOM_CHECK(n >= 1 && n <= 4096);
    int64_t t0 = loom_time_ns(), u0 = loom_time_us();
    volatile double x = 0;
    for (int i = 0; i < 100000; i++)
        x += i;
    int64_t t1 = loom_time_ns(), u1 = loom_time_us();
    LOOM_CHECK(t1 > t0 && u1 >= u0);
    LOOM_CHECK(u1 - u0 <= (t1 - t0) / 1000 + 2);
}
