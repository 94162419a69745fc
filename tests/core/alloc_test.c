/*
 * alloc_test.c: the allocator hook (an allocator that fails after N calls reaches every
 * allocation of contexts, pools and graph builds, which then fail with LOOM_ERR_NOMEM and
 * leak nothing), aligned and overflow-checked allocation, the thread-local last error,
 * and log sink replacement and level filtering.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

typedef struct {
    long calls;      /* malloc + realloc calls seen */
    long fail_after; /* calls that succeed before every later one fails (-1: never) */
    long live;       /* blocks currently allocated */
} fail_alloc;

static void *fa_malloc(size_t size, void *ud) {
    fail_alloc *fa = ud;
    if (fa->fail_after >= 0 && fa->calls++ >= fa->fail_after) return NULL;
    void *p = malloc(size);
    if (p) fa->live++;
    return p;
}

static void *fa_realloc(void *p, size_t size, void *ud) {
    fail_alloc *fa = ud;
    if (fa->fail_after >= 0 && fa->calls++ >= fa->fail_after) return NULL;
    return realloc(p, size);
}

static void fa_free(void *p, void *ud) {
    fail_alloc *fa = ud;
    fa->live--;
    free(p);
}

static void install(fail_alloc *fa, long fail_after) {
    fa->calls = 0;
    fa->fail_after = fail_after;
    fa->live = 0;
    loom_allocator a = {fa_malloc, fa_realloc, fa_free, fa};
    loom_allocator_set(&a);
}

LOOM_TEST(alloc, ctx_new_fails_cleanly_at_every_allocation) {
    fail_alloc fa;
    int failures = 0;
    for (long n = 0; n < 10; n++) {
        install(&fa, n);
        loom_clear_error();
        loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 1 << 16});
        if (!ctx) {
            failures++;
            LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), "ctx_new:");
            LOOM_CHECK_EQ_INT(fa.live, 0);
            continue;
        }
        loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 16, 16);
        LOOM_CHECK(t != NULL); /* the arena needs no further allocation */
        loom_ctx_free(ctx);
        LOOM_CHECK_EQ_INT(fa.live, 0);
        LOOM_CHECK_EQ_INT(fa.calls, n); /* first success: exactly n allocations */
        break;
    }
    LOOM_CHECK_EQ_INT(failures, 2); /* the context object, then the arena */
    loom_clear_error();
    install(&fa, 1);
    LOOM_CHECK(loom_ctx_new((loom_ctx_params){.mem_size = 1 << 16}) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "cannot allocate an arena of 65536 bytes");
    loom_allocator_set(NULL);
}

LOOM_TEST(alloc, threadpool_new_fails_cleanly) {
    fail_alloc fa;
    bool succeeded = false;
    for (long n = 0; n < 10 && !succeeded; n++) {
        install(&fa, n);
        loom_clear_error();
        loom_threadpool *tp = loom_threadpool_new(4);
        if (!tp) {
            LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), "threadpool_new");
            LOOM_CHECK_EQ_INT(fa.live, 0);
            continue;
        }
        succeeded = true;
        loom_threadpool_free(tp);
        LOOM_CHECK_EQ_INT(fa.live, 0);
    }
    LOOM_CHECK(succeeded);
    loom_allocator_set(NULL);
}

LOOM_TEST(alloc, deep_graph_build_survives_oom) {
    enum { DEPTH = 1000 };
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){
        .mem_size = (DEPTH + 4) * loom_tensor_overhead() + loom_graph_overhead(DEPTH + 4),
        .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    for (int i = 0; i < DEPTH; i++)
        t = loom_sqr(ctx, t);
    loom_graph *g = loom_graph_new(ctx, DEPTH + 4);
    LOOM_REQUIRE(t && g);
    fail_alloc fa;
    install(&fa, 0); /* the DFS stack must grow past its local frames, and cannot */
    loom_clear_error();
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, t), LOOM_ERR_NOMEM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "graph_build_forward: out of memory");
    LOOM_CHECK(g->n_nodes == 0 && g->n_leafs == 0);
    install(&fa, 1); /* grows once, then fails on the realloc */
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, t), LOOM_ERR_NOMEM);
    LOOM_CHECK_EQ_INT(fa.live, 0);
    install(&fa, -1);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, t), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, DEPTH);
    LOOM_CHECK_EQ_INT(fa.live, 0);
    loom_allocator_set(NULL);
    loom_ctx_free(ctx);
}

LOOM_TEST(alloc, aligned_calloc_realloc_strdup) {
    fail_alloc fa;
    install(&fa, -1);
    const size_t aligns[] = {1, 8, 16, 64, 4096};
    for (int i = 0; i < 5; i++) {
        void *p = loom_aligned_alloc(aligns[i], 100);
        LOOM_REQUIRE(p != NULL);
        LOOM_CHECK((uintptr_t)p % aligns[i] == 0);
        memset(p, 0xab, 100);
        loom_aligned_free(p);
    }
    loom_aligned_free(NULL);
    LOOM_CHECK_EQ_INT(fa.live, 0);
    loom_clear_error();
    LOOM_CHECK(loom_aligned_alloc(48, 10) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK(loom_aligned_alloc(64, SIZE_MAX - 8) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
    /* calloc: zeroed, and n * size overflow refused without calling the allocator */
    long calls = fa.calls;
    LOOM_CHECK(loom_calloc(SIZE_MAX / 2, 3) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "overflows");
    LOOM_CHECK_EQ_INT(fa.calls, calls);
    unsigned char *z = loom_calloc(10, 7);
    LOOM_REQUIRE(z != NULL);
    bool zero = true;
    for (int i = 0; i < 70; i++)
        zero &= z[i] == 0;
    LOOM_CHECK(zero);
    z = loom_realloc(z, 1000);
    LOOM_REQUIRE(z != NULL);
    LOOM_CHECK(z[69] == 0);
    loom_free(z);
    loom_free(NULL);
    char *s = loom_strdup("loom");
    LOOM_CHECK(s && strcmp(s, "loom") == 0);
    loom_free(s);
    LOOM_CHECK(loom_strdup(NULL) == NULL);
    LOOM_CHECK_EQ_INT(fa.live, 0);
    /* an aligned allocation whose underlying malloc fails */
    install(&fa, 0);
    loom_clear_error();
    LOOM_CHECK(loom_aligned_alloc(64, 100) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
    LOOM_CHECK(loom_malloc(10) == NULL);
    LOOM_CHECK(loom_strdup("x") == NULL);
    loom_allocator_set(NULL);
    void *p = loom_malloc(0); /* size 0 still gives a unique block */
    LOOM_CHECK(p != NULL);
    loom_free(p);
}

static void *other_thread_error(void *arg) {
    (void)arg;
    loom_clear_error();
    loom_error(LOOM_ERR_DEVICE, "thread %d failed", 2);
    return strcmp(loom_last_error(), "thread 2 failed") == 0 ? (void *)1 : NULL;
}

LOOM_TEST(alloc, last_error_is_thread_local) {
    loom_clear_error();
    LOOM_CHECK(strcmp(loom_last_error(), "") == 0);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_error(LOOM_ERR_IO, "reading '%s': %s", "model.gguf", "EOF"),
                      LOOM_ERR_IO);
    pthread_t th;
    LOOM_REQUIRE(pthread_create(&th, NULL, other_thread_error, NULL) == 0);
    void *ok = NULL;
    pthread_join(th, &ok);
    LOOM_CHECK(ok != NULL);
    LOOM_CHECK(strcmp(loom_last_error(), "reading 'model.gguf': EOF") == 0);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_IO);
    /* formatting the last error into a new one is safe */
    loom_error(LOOM_ERR_FORMAT, "loading: %s", loom_last_error());
    LOOM_CHECK(strcmp(loom_last_error(), "loading: reading 'model.gguf': EOF") == 0);
    /* very long messages are truncated, not overflowed */
    char big[5000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    loom_error(LOOM_ERR_INTERNAL, "%s", big);
    LOOM_CHECK(strlen(loom_last_error()) > 500 && strlen(loom_last_error()) < 5000);
    loom_clear_error();
    LOOM_CHECK(strcmp(loom_last_error(), "") == 0 && loom_last_status() == LOOM_OK);
}

typedef struct {
    int n;
    loom_log_level levels[8];
    char msgs[8][128];
} log_capture;

static void capture_sink(loom_log_level level, const char *msg, void *ud) {
    log_capture *c = ud;
    if (c->n < 8) {
        c->levels[c->n] = level;
        strncpy(c->msgs[c->n], msg, sizeof c->msgs[0] - 1);
        c->msgs[c->n][sizeof c->msgs[0] - 1] = 0;
    }
    c->n++;
}

LOOM_TEST(alloc, log_sink_and_level) {
    log_capture c;
    memset(&c, 0, sizeof c);
    loom_log_level saved = loom_log_get_level();
    loom_log_set(capture_sink, &c);
    loom_log_set_level(LOOM_LOG_INFO);
    LOOM_CHECK_EQ_INT(loom_log_get_level(), LOOM_LOG_INFO);
    LOOM_LOG_DEBUG("hidden %d", 1);
    LOOM_LOG_INFO("loaded %d tensors\n", 42);
    LOOM_LOG_WARN("slow path");
    LOOM_LOG_ERROR("bad %s", "thing");
    loom_log(LOOM_LOG_NONE, "never");
    LOOM_CHECK_EQ_INT(c.n, 3);
    LOOM_CHECK(c.levels[0] == LOOM_LOG_INFO && strcmp(c.msgs[0], "loaded 42 tensors") == 0);
    LOOM_CHECK(c.levels[1] == LOOM_LOG_WARN && strcmp(c.msgs[1], "slow path") == 0);
    LOOM_CHECK(c.levels[2] == LOOM_LOG_ERROR && strcmp(c.msgs[2], "bad thing") == 0);
    loom_log_set_level(LOOM_LOG_NONE);
    LOOM_LOG_ERROR("muted");
    LOOM_CHECK_EQ_INT(c.n, 3);
    /* errors are traced at debug level */
    loom_log_set_level(LOOM_LOG_DEBUG);
    loom_error(LOOM_ERR_SHAPE, "mul_mat: mismatch");
    LOOM_CHECK_EQ_INT(c.n, 4);
    LOOM_CHECK(c.levels[3] == LOOM_LOG_DEBUG);
    LOOM_CHECK_STR_CONTAINS(c.msgs[3], "mul_mat: mismatch");
    /* restoring the default sink: the capture sees nothing more */
    loom_log_set(NULL, NULL);
    loom_log_set_level(LOOM_LOG_NONE);
    LOOM_LOG_ERROR("to stderr (muted)");
    LOOM_CHECK_EQ_INT(c.n, 4);
    loom_log_set_level(saved);
}
