/*
 * The reducer's ladder and its edges: LOOM_ALLREDUCE, the size threshold, p2p=0 devices
 * (probed and stated), a native communicator (injected, and found through the reg's
 * get_proc_address), devices refusing the ops the reducer needs, a device out of memory,
 * host out-of-memory on every allocation, bad arguments, one device.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "loom/cpu.h"
#include "tests/reduce/reduce_util.h"
#include "tests/shim/loom_test.h"

/* Fills s from seed, reduces with r, checks the exact sum; returns the algorithm used. */
static loom_allreduce_algo reduce_check(loom_reducer *r, rt_set *s, uint64_t seed,
                                        const bool *empty, const char *tag) {
    rt_fill(s, seed, empty);
    float *expected = rt_expected(s, seed, empty);
    loom_status st = loom_reducer_allreduce(r, s->t, empty);
    LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_OK);
    if (st != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s: %s", tag, loom_last_error());
        free(expected);
        return LOOM_ALLREDUCE_COUNT;
    }
    rt_check(s, expected, tag);
    free(expected);
    loom_reducer_stats stats;
    loom_reducer_get_stats(r, &stats);
    return stats.last_algo;
}

LOOM_TEST(reduce_ladder, env_forces_an_algorithm) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:3")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 100, 1)); /* small: auto would pick the butterfly */
    static const struct {
        const char *env;
        loom_allreduce_algo algo;
    } cases[] = {
        {"ring", LOOM_ALLREDUCE_RING},      {"butterfly", LOOM_ALLREDUCE_BUTTERFLY},
        {"host", LOOM_ALLREDUCE_HOST},      {"HOST", LOOM_ALLREDUCE_HOST},
        {"auto", LOOM_ALLREDUCE_BUTTERFLY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("LOOM_ALLREDUCE", cases[i].env, 1);
        loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
        LOOM_REQUIRE(r != NULL);
        loom_allreduce_algo used = reduce_check(r, &s, 10 + i, NULL, cases[i].env);
        LOOM_CHECK_MSG(used == cases[i].algo, "LOOM_ALLREDUCE=%s used %s", cases[i].env,
                       loom_allreduce_algo_name(used));
        loom_reducer_free(r);
    }
    /* an explicit algorithm in the params wins over the environment */
    setenv("LOOM_ALLREDUCE", "ring", 1);
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_HOST);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 20, NULL, "params over env"), LOOM_ALLREDUCE_HOST);
    loom_reducer_free(r);

    /* a bad value is a clear error */
    static const char *bad[] = {"bogus", "rings", "native"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LOOM_ALLREDUCE", bad[i], 1);
        loom_reducer_params p = loom_reducer_params_default();
        r = loom_reducer_new(d.be, d.n, &p);
        LOOM_CHECK(r == NULL);
        LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "LOOM_ALLREDUCE");
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i]);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "butterfly");
        loom_reducer_free(r);
    }
    unsetenv("LOOM_ALLREDUCE");
    rt_set_free(&s);
    rt_devs_close(&d);
}

LOOM_TEST(reduce_ladder, algorithm_names_parse) {
    for (int a = 0; a < LOOM_ALLREDUCE_COUNT; a++) {
        loom_allreduce_algo back = LOOM_ALLREDUCE_COUNT;
        LOOM_CHECK_EQ_INT(loom_allreduce_algo_parse(loom_allreduce_algo_name(a), &back), LOOM_OK);
        LOOM_CHECK_EQ_INT(back, a);
    }
    loom_allreduce_algo x;
    LOOM_CHECK_EQ_INT(loom_allreduce_algo_parse("tree", &x), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'tree'");
}

/* The size threshold: at most butterfly_max_bytes goes to the butterfly, above to the
 * ring; the measured defaults are sane (positive, not growing with the device count). */
LOOM_TEST(reduce_ladder, threshold_splits_butterfly_and_ring) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:4")) return;
    loom_reducer_params p = loom_reducer_params_default();
    p.butterfly_max_bytes = 4096;
    loom_reducer *r = loom_reducer_new(d.be, d.n, &p);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK_EQ_INT(loom_reducer_choose(r, 4096), LOOM_ALLREDUCE_BUTTERFLY);
    LOOM_CHECK_EQ_INT(loom_reducer_choose(r, 4100), LOOM_ALLREDUCE_RING);
    rt_set a, b;
    LOOM_REQUIRE(rt_set_alloc(&a, &d, 1024, 1));
    LOOM_REQUIRE(rt_set_alloc(&b, &d, 1025, 1));
    LOOM_CHECK_EQ_INT(reduce_check(r, &a, 1, NULL, "4096 bytes"), LOOM_ALLREDUCE_BUTTERFLY);
    LOOM_CHECK_EQ_INT(reduce_check(r, &b, 2, NULL, "4100 bytes"), LOOM_ALLREDUCE_RING);
    loom_reducer_free(r);
    rt_set_free(&a);
    rt_set_free(&b);
    for (int n = 2; n <= 16; n++) { /* a sane range: neither "never" nor "always" */
        size_t t = loom_reducer_butterfly_max_bytes(n);
        LOOM_CHECK_MSG(t >= 4096 && t <= ((size_t)64 << 20), "threshold for %d devices is %zu", n,
                       t);
    }
    LOOM_CHECK_EQ_INT(loom_reducer_butterfly_max_bytes(1), 0);
    rt_devs_close(&d);
}

/* Devices that cannot copy to each other: the probe finds out and the ladder stages
 * through host; forced device algorithms still work (the copy wrapper stages); a caller
 * can state p2p=0 for devices that could. */
LOOM_TEST(reduce_ladder, p2p_off_uses_host) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:4,p2p=0")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 5000, 1));
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(!loom_reducer_p2p(r));
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 1, NULL, "p2p=0 auto"), LOOM_ALLREDUCE_HOST);
    bool empty[RT_MAX] = {false, true, false, false};
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 2, empty, "p2p=0 auto, empty"), LOOM_ALLREDUCE_HOST);
    loom_reducer_free(r);
    for (int a = LOOM_ALLREDUCE_RING; a <= LOOM_ALLREDUCE_BUTTERFLY; a++) {
        r = rt_reducer(&d, (loom_allreduce_algo)a);
        LOOM_REQUIRE(r != NULL);
        LOOM_CHECK_EQ_INT(reduce_check(r, &s, 3, empty, "p2p=0 forced"), a);
        loom_reducer_free(r);
    }
    rt_set_free(&s);
    rt_devs_close(&d);

    if (!rt_devs_open(&d, "sim:4")) return;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 5000, 1));
    r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(loom_reducer_p2p(r));
    loom_reducer_free(r);
    loom_reducer_params p = loom_reducer_params_default();
    p.p2p = LOOM_REDUCE_P2P_NO;
    r = loom_reducer_new(d.be, d.n, &p);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(!loom_reducer_p2p(r));
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 4, NULL, "stated p2p=0"), LOOM_ALLREDUCE_HOST);
    loom_reducer_free(r);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* Devices refusing ADD: the ladder falls back to the host path; a forced ring is an error
 * naming the device and the op. Devices refusing FILL still zero empty slices. */
LOOM_TEST(reduce_ladder, refused_ops) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:3,refuse=add")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 700, 1));
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 1, NULL, "refuse=add auto"), LOOM_ALLREDUCE_HOST);
    loom_reducer_free(r);
    r = rt_reducer(&d, LOOM_ALLREDUCE_RING);
    LOOM_REQUIRE(r != NULL);
    rt_fill(&s, 2, NULL);
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, s.t, NULL), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "does not support ADD");
    loom_reducer_free(r);
    rt_set_free(&s);
    rt_devs_close(&d);

    if (!rt_devs_open(&d, "sim:3,refuse=fill")) return;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 700, 1));
    bool empty[RT_MAX] = {false, false, true};
    for (int a = LOOM_ALLREDUCE_RING; a <= LOOM_ALLREDUCE_BUTTERFLY; a++) {
        r = rt_reducer(&d, (loom_allreduce_algo)a);
        LOOM_REQUIRE(r != NULL);
        LOOM_CHECK_EQ_INT(reduce_check(r, &s, 3, empty, "refuse=fill"), a);
        loom_reducer_free(r);
    }
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* A device whose memory cap cannot hold the scratch: an error naming the device, no
 * crash, and the reducer still works afterwards with an algorithm that fits. */
LOOM_TEST(reduce_ladder, device_out_of_memory_is_an_error) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:4,mem=1MiB")) return;
    rt_set s;
    /* 384 KiB per device; the butterfly needs 2 x 384 KiB of scratch beside it */
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 96 * 1024, 1));
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_BUTTERFLY);
    LOOM_REQUIRE(r != NULL);
    rt_fill(&s, 1, NULL);
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, s.t, NULL), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "scratch");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    loom_reducer_stats st;
    loom_reducer_get_stats(r, &st);
    LOOM_CHECK_EQ_INT(st.reductions, 0);
    /* the ring needs a quarter of the tensor: it fits */
    loom_reducer_set_algorithm(r, LOOM_ALLREDUCE_RING);
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 2, NULL, "ring after OOM"), LOOM_ALLREDUCE_RING);
    loom_reducer_free(r);
    rt_set_free(&s);
    rt_devs_close(&d);

    /* devices already full: even the p2p probe does not fit, creation fails cleanly */
    if (!rt_devs_open(&d, "sim:2,mem=1KiB")) return;
    loom_buffer_t hog[2];
    for (int j = 0; j < 2; j++) {
        hog[j] = loom_backend_alloc_buffer(d.be[j], 1024);
        LOOM_REQUIRE(hog[j] != NULL);
    }
    loom_reducer_params p = loom_reducer_params_default();
    r = loom_reducer_new(d.be, d.n, &p);
    LOOM_CHECK(r == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "probe");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    for (int j = 0; j < 2; j++)
        loom_buffer_free(hog[j]);
    r = loom_reducer_new(d.be, d.n, &p);
    LOOM_CHECK(r != NULL);
    loom_reducer_free(r);
    rt_devs_close(&d);
}

/* The largest reducer: 16 devices (ring plans hold 16 x 16 chunk views). */
LOOM_TEST(reduce_ladder, sixteen_devices) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:16")) return;
    static const int64_t sizes[] = {7, 5003};
    for (size_t si = 0; si < 2; si++) {
        rt_set s;
        LOOM_REQUIRE(rt_set_alloc(&s, &d, sizes[si], 1));
        for (int a = LOOM_ALLREDUCE_RING; a <= LOOM_ALLREDUCE_HOST; a++) {
            loom_reducer *r = rt_reducer(&d, (loom_allreduce_algo)a);
            LOOM_REQUIRE(r != NULL);
            LOOM_CHECK_EQ_INT(reduce_check(r, &s, 60 + a, NULL, "16 devices"), a);
            loom_reducer_free(r);
        }
        rt_set_free(&s);
    }
    rt_devs_close(&d);
}

/* Backends without events or async copies (two CPU backends over host memory): the probe
 * finds no direct path, auto stages through host, and the forced device algorithms run
 * with synchronisation in place of events. */
LOOM_TEST(reduce_ladder, cpu_backends_without_events) {
    rt_devs d;
    memset(&d, 0, sizeof d);
    d.n = 3;
    for (int j = 0; j < d.n; j++) {
        d.be[j] = loom_cpu_backend_new(1);
        LOOM_REQUIRE(d.be[j] != NULL);
    }
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 1001, 1));
    bool empty[RT_MAX] = {false, true, false};
    for (int a = LOOM_ALLREDUCE_AUTO; a <= LOOM_ALLREDUCE_HOST; a++) {
        if (a == LOOM_ALLREDUCE_NATIVE) continue;
        loom_reducer *r = rt_reducer(&d, (loom_allreduce_algo)a);
        LOOM_REQUIRE(r != NULL);
        LOOM_CHECK(!loom_reducer_p2p(r));
        loom_allreduce_algo want = a == LOOM_ALLREDUCE_AUTO ? LOOM_ALLREDUCE_HOST : a;
        LOOM_CHECK_EQ_INT(reduce_check(r, &s, 40 + a, NULL, "cpu"), want);
        LOOM_CHECK_EQ_INT(reduce_check(r, &s, 50 + a, empty, "cpu, empty"), want);
        loom_reducer_free(r);
    }
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* ---------------------------------------------------------------- native communicator */

typedef struct fake_comm {
    int n;
    loom_backend_t be[RT_MAX];
    int calls;
    bool decline;
} fake_comm;

static int g_inits, g_frees;
static fake_comm *g_last_comm;
static bool g_decline;

static void *fake_init(loom_backend_t *backends, size_t n) {
    fake_comm *c = calloc(1, sizeof *c);
    c->n = (int)n;
    memcpy(c->be, backends, n * sizeof *backends);
    c->decline = g_decline;
    g_inits++;
    g_last_comm = c;
    return c;
}

/* Sums on the host after waiting for the streams (a stand-in for NCCL). */
static bool fake_allreduce(void *comm, loom_tensor *const *t, size_t n) {
    fake_comm *c = comm;
    c->calls++;
    if (c->decline || (int)n != c->n) return false;
    int64_t ne = loom_nelements(t[0]);
    double *acc = calloc((size_t)ne, sizeof *acc);
    float *x = malloc((size_t)ne * sizeof *x);
    for (size_t j = 0; j < n; j++) {
        loom_backend_synchronize(c->be[j]);
        loom_tensor_get(t[j], x, 0, (size_t)ne * sizeof *x);
        for (int64_t i = 0; i < ne; i++)
            acc[i] += x[i];
    }
    for (int64_t i = 0; i < ne; i++)
        x[i] = (float)acc[i];
    for (size_t j = 0; j < n; j++)
        loom_tensor_set(t[j], x, 0, (size_t)ne * sizeof *x);
    free(acc);
    free(x);
    return true;
}

static void fake_free(void *comm) {
    g_frees++;
    free(comm);
}

static const loom_comm_iface k_fake = {fake_init, fake_allreduce, fake_free};

LOOM_TEST(reduce_ladder, native_communicator_first) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:3")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 3000, 1));
    g_inits = g_frees = 0;
    g_decline = false;
    loom_reducer_params p = loom_reducer_params_default();
    p.comm = &k_fake;
    loom_reducer *r = loom_reducer_new(d.be, d.n, &p);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(loom_reducer_has_comm(r));
    LOOM_CHECK_EQ_INT(g_inits, 1);
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 1, NULL, "native"), LOOM_ALLREDUCE_NATIVE);
    /* an empty device is zeroed before the communicator sees it */
    bool empty[RT_MAX] = {true, false, false};
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 2, empty, "native, empty"), LOOM_ALLREDUCE_NATIVE);
    LOOM_CHECK_EQ_INT(g_last_comm->calls, 2);
    loom_reducer_free(r);
    LOOM_CHECK_EQ_INT(g_frees, 1);

    /* a communicator that declines: the reducer falls back to its own algorithms */
    g_decline = true;
    r = loom_reducer_new(d.be, d.n, &p);
    LOOM_REQUIRE(r != NULL);
    loom_allreduce_algo used = reduce_check(r, &s, 3, empty, "declined");
    LOOM_CHECK(used == LOOM_ALLREDUCE_BUTTERFLY);
    LOOM_CHECK_EQ_INT(g_last_comm->calls, 1);
    loom_reducer_free(r);

    /* no_comm: never asked */
    p.no_comm = true;
    g_inits = 0;
    r = loom_reducer_new(d.be, d.n, &p);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(!loom_reducer_has_comm(r));
    LOOM_CHECK_EQ_INT(g_inits, 0);
    loom_reducer_free(r);
    g_decline = false;
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* The lookup through the reg: a stand-in reg that forwards to the sim reg and adds the
 * LOOM_PROC_COMM_* procs; the sim devices point at it while the reducer is created. */
static loom_reg_t g_inner_reg;

static const char *wrap_name(loom_reg_t reg) {
    (void)reg;
    return "WRAP";
}
static size_t wrap_count(loom_reg_t reg) {
    (void)reg;
    return loom_reg_dev_count(g_inner_reg);
}
static loom_dev_t wrap_dev(loom_reg_t reg, size_t i) {
    (void)reg;
    return loom_reg_dev_get(g_inner_reg, i);
}
static void *wrap_proc(loom_reg_t reg, const char *name) {
    (void)reg;
    if (strcmp(name, LOOM_PROC_COMM_INIT) == 0) return (void *)fake_init;
    if (strcmp(name, LOOM_PROC_COMM_ALLREDUCE) == 0) return (void *)fake_allreduce;
    if (strcmp(name, LOOM_PROC_COMM_FREE) == 0) return (void *)fake_free;
    return loom_reg_get_proc_address(g_inner_reg, name);
}

static const struct loom_reg_i k_wrap_i = {
    .get_name = wrap_name,
    .get_device_count = wrap_count,
    .get_device = wrap_dev,
    .get_proc_address = wrap_proc,
};

LOOM_TEST(reduce_ladder, native_communicator_from_reg) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:2")) return;
    /* the sim reg itself has no communicator */
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(!loom_reducer_has_comm(r));
    loom_reducer_free(r);

    g_inner_reg = d.reg;
    struct loom_reg wrap = {.api_version = LOOM_BACKEND_API_VERSION, .iface = &k_wrap_i};
    for (int j = 0; j < d.n; j++)
        loom_backend_device(d.be[j])->reg = &wrap;
    g_inits = g_frees = 0;
    g_decline = false;
    r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    for (int j = 0; j < d.n; j++)
        loom_backend_device(d.be[j])->reg = d.reg;
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(loom_reducer_has_comm(r));
    LOOM_CHECK_EQ_INT(g_inits, 1);
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 10, 1));
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 9, NULL, "reg communicator"), LOOM_ALLREDUCE_NATIVE);
    loom_reducer_free(r);
    LOOM_CHECK_EQ_INT(g_frees, 1);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* ---------------------------------------------------------------- bad input */

LOOM_TEST(reduce_ladder, bad_arguments) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:2")) return;
    LOOM_CHECK(loom_reducer_new(d.be, 0, NULL) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK(loom_reducer_new(d.be, 17, NULL) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "17 devices");
    loom_backend_t same[2] = {d.be[0], d.be[0]};
    LOOM_CHECK(loom_reducer_new(same, 2, NULL) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "also backend 0");
    loom_backend_t none[2] = {d.be[0], NULL};
    LOOM_CHECK(loom_reducer_new(none, 2, NULL) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "backend 1 is NULL");

    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 64, 4));
    loom_ctx_params cp = {.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    LOOM_REQUIRE(ctx != NULL);

    loom_tensor *t[2] = {s.t[0], NULL};
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tensor 1 is NULL");

    t[1] = s.t[0]; /* the same tensor twice */
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "overlap");

    t[1] = loom_view_2d(ctx, s.whole[1], 32, 4, 32 * sizeof(float), 0); /* other shape */
    LOOM_REQUIRE(t[1] != NULL);
    if (!t[1]->buffer) loom_buffer_init_view(t[1]);
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "differs from tensor 0");

    t[1] = loom_transpose(ctx, s.t[1]); /* not contiguous */
    LOOM_REQUIRE(t[1] != NULL);
    t[0] = loom_transpose(ctx, s.t[0]);
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "not contiguous");

    loom_tensor *h = loom_new_tensor_1d(ctx, LOOM_TYPE_F16, 256);
    LOOM_REQUIRE(h != NULL);
    t[0] = h;
    t[1] = s.t[1];
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_TYPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "f16");

    loom_tensor *u = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 4); /* no buffer */
    t[0] = s.t[0];
    t[1] = u;
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "not allocated");

    /* device 0's tensor given for device 1: SIM1 cannot use SIM0's memory */
    t[0] = s.t[1];
    t[1] = s.t[0];
    LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, t, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "cannot use");

    loom_reducer_stats st;
    loom_reducer_get_stats(r, &st);
    LOOM_CHECK_EQ_INT(st.reductions, 0);
    loom_reducer_free(r);
    loom_ctx_free(ctx);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* One device: nothing moves; an empty slice still becomes exact zeros. */
LOOM_TEST(reduce_ladder, one_device) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:1")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 33, 1));
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 1, NULL, "one device"), LOOM_ALLREDUCE_AUTO);
    bool empty[1] = {true};
    LOOM_CHECK_EQ_INT(reduce_check(r, &s, 2, empty, "one empty device"), LOOM_ALLREDUCE_AUTO);
    loom_reducer_stats st;
    loom_reducer_get_stats(r, &st);
    LOOM_CHECK_EQ_INT(st.bytes_moved, 0);
    LOOM_CHECK_EQ_INT(st.reductions, 2);
    loom_reducer_free(r);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* ---------------------------------------------------------------- host out of memory */

static pthread_t g_oom_thread;
static long g_oom_countdown; /* fail when it reaches 0 (on the test thread only) */
static long g_oom_failed;

static void *oom_malloc(size_t size, void *ud) {
    (void)ud;
    if (pthread_equal(pthread_self(), g_oom_thread) && g_oom_countdown >= 0 &&
        g_oom_countdown-- == 0) {
        g_oom_failed++;
        return NULL;
    }
    return malloc(size);
}
static void *oom_realloc(void *p, size_t size, void *ud) {
    (void)ud;
    if (pthread_equal(pthread_self(), g_oom_thread) && g_oom_countdown >= 0 &&
        g_oom_countdown-- == 0) {
        g_oom_failed++;
        return NULL;
    }
    return realloc(p, size);
}
static void oom_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

/* Every host allocation of creating a reducer and of its first reductions fails once in
 * turn: each run either succeeds with the right sum or reports an error; nothing crashes
 * or leaks (asan). */
LOOM_TEST(reduce_ladder, host_out_of_memory_everywhere) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:3")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 3000, 1));
    static const loom_allreduce_algo algos[] = {LOOM_ALLREDUCE_RING, LOOM_ALLREDUCE_BUTTERFLY,
                                                LOOM_ALLREDUCE_HOST};
    loom_allocator oom = {oom_malloc, oom_realloc, oom_free, NULL};
    g_oom_thread = pthread_self();
    loom_log_level level = loom_log_get_level();
    loom_log_set_level(LOOM_LOG_ERROR); /* sim warns of every command it runs inline */
    for (size_t a = 0; a < 3; a++) {
        int failures = 0;
        for (long k = 0; k < 10000; k++) {
            rt_fill(&s, 7, NULL);
            for (int j = 0; j < d.n; j++)
                loom_backend_synchronize(d.be[j]);
            g_oom_failed = 0;
            g_oom_countdown = k;
            loom_allocator_set(&oom);
            loom_reducer_params p = loom_reducer_params_default();
            p.algorithm = algos[a];
            loom_reducer *r = loom_reducer_new(d.be, d.n, &p);
            loom_status st = r ? loom_reducer_allreduce(r, s.t, NULL) : loom_last_status();
            char msg[256];
            snprintf(msg, sizeof msg, "%s", loom_last_error());
            if (r) loom_reducer_synchronize(r);
            loom_allocator_set(NULL);
            long failed = g_oom_failed;
            g_oom_countdown = -1;
            if (failed == 0) { /* nothing left to fail: this run must have worked */
                LOOM_CHECK_EQ_INT(st, LOOM_OK);
                float *expected = rt_expected(&s, 7, NULL);
                rt_check(&s, expected, loom_allreduce_algo_name(algos[a]));
                free(expected);
                loom_reducer_free(r);
                break;
            }
            if (st == LOOM_OK) { /* survived the failure (a fallback path): still right */
                float *expected = rt_expected(&s, 7, NULL);
                rt_check(&s, expected, "after an absorbed allocation failure");
                free(expected);
            } else {
                failures++;
                LOOM_CHECK_MSG(st == LOOM_ERR_NOMEM || st == LOOM_ERR_DEVICE_OOM,
                               "%s, allocation %ld failed: status %d (%s)",
                               loom_allreduce_algo_name(algos[a]), k, (int)st, msg);
            }
            loom_reducer_free(r);
        }
        LOOM_CHECK_MSG(failures > 0, "%s: no injected failure was reported",
                       loom_allreduce_algo_name(algos[a]));
    }
    loom_log_set_level(level);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* The sim reg's native communicator (backends/sim/sim-backend.c): one command per stream.
 * AUTO picks it on default sim devices; sums are exact (rt_check: bit for bit against the
 * double reference) and bit-identical on every device, with guards intact, for sizes
 * from 1 element to more than a block per rank, with empty devices counting as zeros;
 * the link model is charged what a ring moves. */
LOOM_TEST(reduce_ladder, sim_native_communicator_sums_in_one_command_per_device) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 1}, {1000, 1}, {257, 255}};
    for (int n = 2; n <= 5; n++) {
        char spec[32];
        snprintf(spec, sizeof spec, "sim:%d,comm=1", n);
        rt_devs d;
        if (!rt_devs_open(&d, spec)) return;
        loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
        LOOM_REQUIRE(r != NULL);
        LOOM_CHECK_MSG(loom_reducer_has_comm(r), "%s: no communicator", spec);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            rt_set s;
            LOOM_REQUIRE(rt_set_alloc(&s, &d, shapes[si][0], shapes[si][1]));
            bool empty[RT_MAX] = {false};
            empty[n - 1] = si % 2 == 1; /* a device with nothing to add, every other shape */
            loom_sim_stats before[RT_MAX], after[RT_MAX];
            char tag[64];
            snprintf(tag, sizeof tag, "sim comm, %d devices, %lld elements", n, (long long)s.ne);
            rt_fill(&s, 77 + si, empty);
            float *expected = rt_expected(&s, 77 + si, empty);
            for (int j = 0; j < n; j++)
                loom_sim_dev_stats(loom_reg_dev_get(d.reg, (size_t)j), &before[j]);
            LOOM_CHECK(loom_reducer_allreduce(r, s.t, empty) == LOOM_OK);
            LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_OK);
            loom_reducer_stats rs;
            loom_reducer_get_stats(r, &rs);
            LOOM_CHECK_EQ_INT(rs.last_algo, LOOM_ALLREDUCE_NATIVE);
            /* a ring's volume: device j takes in the N-1 partials of its chunk and the N-1
             * other chunks' sums, and sends as much (its partials, its sum) */
            for (int j = 0; j < n; j++) {
                loom_sim_dev_stats(loom_reg_dev_get(d.reg, (size_t)j), &after[j]);
                uint64_t want = 0;
                for (int k = 0; k < n; k++) {
                    uint64_t chunk = (uint64_t)(s.ne * (k + 1) / n - s.ne * k / n) * 4;
                    want += k == j ? (uint64_t)(n - 1) * chunk : chunk;
                }
                LOOM_CHECK_EQ_INT(after[j].bytes_in - before[j].bytes_in, want);
                LOOM_CHECK_EQ_INT(after[j].bytes_out - before[j].bytes_out, want);
                /* the device thread's time in it is measured (host_sync_ns) */
                LOOM_CHECK(after[j].host_sync_ns > before[j].host_sync_ns);
            }
            LOOM_CHECK_EQ_INT(rt_check(&s, expected, tag), 0);
            free(expected);
            float *first = malloc((size_t)s.ne * sizeof(float));
            float *other = malloc((size_t)s.ne * sizeof(float));
            rt_read(&s, 0, first);
            for (int j = 1; j < n; j++) {
                rt_read(&s, j, other);
                LOOM_CHECK_MSG(memcmp(first, other, (size_t)s.ne * sizeof(float)) == 0,
                               "%s: device %d differs from device 0", tag, j);
            }
            free(first);
            free(other);
            rt_set_free(&s);
        }
        loom_reducer_free(r);
        rt_devs_close(&d);
    }
}

/* Offered only where it changes nothing but host time: comm=0, no p2p, host memory, a
 * timing profile and virtual devices keep the reducer's own (calibrated) steps. */
LOOM_TEST(reduce_ladder, sim_native_communicator_only_where_it_changes_nothing_else) {
    static const char *const specs[] = {"sim:2,comm=0", "sim:2,comm=1,p2p=0",
                                        "sim:2,comm=1,hostmem=1", "sim:2,comm=1,profile=h200",
                                        "sim:2,comm=1,virtual=1"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        rt_devs d;
        if (!rt_devs_open(&d, specs[i])) return;
        loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_AUTO);
        LOOM_REQUIRE(r != NULL);
        LOOM_CHECK_MSG(!loom_reducer_has_comm(r), "%s: a communicator", specs[i]);
        loom_reducer_free(r);
        rt_devs_close(&d);
    }
    loom_sim_config cfg;
    LOOM_CHECK(loom_sim_config_parse("sim:2,comm=2", &cfg) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "comm");
}

/* A graph that fails on a device's worker after it was queued: loom_reducer_synchronize
 * returns the failure with the device's message (the reducer's wait is where it surfaces;
 * it used to return void and the failure was lost for the device's next graph too). */
LOOM_TEST(reduce_ladder, synchronize_reports_a_graph_that_failed_on_a_device) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:2")) return;
    loom_reducer *r = rt_reducer(&d, LOOM_ALLREDUCE_RING);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_OK); /* idle, nothing failed */

    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_tensor *b = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_tensor *c = loom_add(ctx, a, b);
    loom_set_name(c, "bad_add");
    loom_graph *g = loom_graph_new(ctx, 16);
    LOOM_REQUIRE(g && loom_graph_build_forward(g, c) == LOOM_OK);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(loom_reg_dev_get(d.reg, 0)));
    LOOM_REQUIRE(buf != NULL);
    /* the shapes no longer agree: the device accepts the op, its compute refuses the shape */
    b->ne[0] = 5;
    b->nb[1] = b->nb[2] = b->nb[3] = 5 * sizeof(float);
    LOOM_REQUIRE(loom_backend_graph_compute_async(d.be[0], g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "a device failed");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "bad_add");

    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    loom_reducer_free(r);
    rt_devs_close(&d);
}
