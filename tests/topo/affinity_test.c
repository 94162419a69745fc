/*
 * affinity_test.c: the thread pool's start hook (core/threadpool.c) that pinning relies on:
 * every worker calls it once with its own index before any task, and with the caller idle
 * every index runs on a worker that went through the hook. And CPU backends created under
 * each --cpu-affinity policy compute the same as unpinned ones.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

enum { MAXT = 8 };

typedef struct {
    atomic_int starts;
    pthread_t started[MAXT]; /* the thread that called start for index i */
    atomic_int start_count[MAXT];
} hook_ctx;

static void on_start(int ith, int nth, void *ud) {
    hook_ctx *c = ud;
    (void)nth;
    c->started[ith] = pthread_self();
    atomic_fetch_add(&c->start_count[ith], 1);
    atomic_fetch_add(&c->starts, 1);
}

typedef struct {
    pthread_t ran[MAXT];
    atomic_int calls;
} run_ctx;

static void task(int ith, int nth, void *ud) {
    run_ctx *r = ud;
    (void)nth;
    r->ran[ith] = pthread_self();
    atomic_fetch_add(&r->calls, 1);
}

LOOM_TEST(affinity, pool_start_hook_runs_once_per_worker) {
    for (int caller_works = 0; caller_works < 2; caller_works++) {
        for (int n = 1; n <= 4; n++) {
            hook_ctx c;
            memset(&c, 0, sizeof c);
            loom_threadpool *tp = loom_threadpool_new_ex(n, on_start, &c, caller_works != 0);
            LOOM_REQUIRE(tp);
            LOOM_CHECK_EQ_INT(loom_threadpool_size(tp), n);
            for (int rep = 0; rep < 20; rep++) {
                run_ctx r;
                memset(&r, 0, sizeof r);
                loom_threadpool_run(tp, task, &r);
                LOOM_CHECK_EQ_INT(atomic_load(&r.calls), n);
                for (int i = 0; i < n; i++) {
                    bool is_caller = pthread_equal(r.ran[i], pthread_self());
                    if (caller_works && i == 0) {
                        LOOM_CHECK(is_caller);
                    } else {
                        LOOM_CHECK_MSG(!is_caller, "n %d: index %d ran on the caller", n, i);
                        LOOM_CHECK(pthread_equal(r.ran[i], c.started[i]));
                    }
                }
            }
            LOOM_CHECK_EQ_INT(atomic_load(&c.starts), caller_works ? n - 1 : n);
            for (int i = caller_works; i < n; i++)
                LOOM_CHECK_EQ_INT(atomic_load(&c.start_count[i]), 1);
            loom_threadpool_free(tp);
        }
    }
    LOOM_CHECK(loom_threadpool_new_ex(0, on_start, NULL, false) == NULL);
}

/* y = W x on a CPU backend created under policy a. */
static bool matvec(loom_affinity a, float *y, int n) {
    loom_cpu_set_affinity(a);
    loom_backend_t be = loom_cpu_backend_new(3);
    loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
    if (!be) return false;
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 16u << 20});
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, n);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, n);
    float *wd = w->data, *xd = x->data;
    for (int i = 0; i < n * n; i++)
        wd[i] = (float)((i * 7919) % 13) - 6.0f;
    for (int i = 0; i < n; i++)
        xd[i] = (float)(i % 5) * 0.25f;
    loom_tensor *out = loom_mul_mat(ctx, w, x);
    loom_graph *g = loom_graph_new(ctx, 16);
    bool ok = g && loom_graph_build_forward(g, out) == LOOM_OK &&
              loom_backend_graph_compute(be, g) == LOOM_OK;
    if (ok) memcpy(y, out->data, sizeof(float) * (size_t)n);
    loom_ctx_free(ctx);
    loom_backend_free(be);
    return ok;
}

LOOM_TEST(affinity, cpu_backend_same_result_under_every_policy) {
    enum { N = 96 };
    float ref[N], got[N];
    LOOM_REQUIRE(matvec(LOOM_AFFINITY_NONE, ref, N));
    const loom_affinity pol[] = {LOOM_AFFINITY_COMPACT, LOOM_AFFINITY_SPREAD, LOOM_AFFINITY_NUMA,
                                 LOOM_AFFINITY_DEFAULT};
    for (int p = 0; p < 4; p++) {
        LOOM_REQUIRE(matvec(pol[p], got, N));
        LOOM_CHECK_MSG(memcmp(ref, got, sizeof ref) == 0, "policy %s differs",
                       loom_affinity_name(pol[p]));
    }
    /* an explicit policy is reported as the caller's; the default says why */
    char why[128];
    loom_cpu_set_affinity(LOOM_AFFINITY_SPREAD);
    LOOM_CHECK_EQ_INT(loom_cpu_affinity(why, sizeof why), LOOM_AFFINITY_SPREAD);
    LOOM_CHECK(!loom_cpu_affinity_is_default());
    loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
    LOOM_CHECK(loom_cpu_affinity_is_default());
    loom_affinity d = loom_cpu_affinity(why, sizeof why);
    LOOM_CHECK(d == LOOM_AFFINITY_NONE || d == LOOM_AFFINITY_NUMA);
    LOOM_CHECK_STR_CONTAINS(why, "NUMA node");
}
