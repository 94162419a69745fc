/*
 * AllReduce algorithms on sim devices: every algorithm (ring, butterfly, host-staged and
 * the auto ladder) against an exact host sum computed in double and against each other,
 * for every device count 2..8 and sizes from 1 element to 64 MiB; ordinary floats within
 * rounding tolerance; devices with empty slices holding NaN; plan reuse; stream ordering
 * with work queued before and after the reduction.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/reduce/reduce_util.h"
#include "tests/shim/loom_test.h"

static const loom_allreduce_algo k_algos[] = {
    LOOM_ALLREDUCE_RING,
    LOOM_ALLREDUCE_BUTTERFLY,
    LOOM_ALLREDUCE_HOST,
    LOOM_ALLREDUCE_AUTO,
};
#define K_N_ALGOS 4

/* Runs reducer r on s (filled from seed, empty flags), checks against the exact sum and
 * that the algorithm used is the one expected. Returns false on a failure. */
static bool run_one(loom_reducer *r, rt_set *s, uint64_t seed, const bool *empty,
                    const float *expected, loom_allreduce_algo want, const char *tag) {
    rt_fill(s, seed, empty);
    loom_status st = loom_reducer_allreduce(r, s->t, empty);
    LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_OK);
    if (st != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s: allreduce failed: %s", tag, loom_last_error());
        return false;
    }
    loom_reducer_stats stats;
    loom_reducer_get_stats(r, &stats);
    if (stats.last_algo != want) {
        loom_test_fail(__FILE__, __LINE__, "%s: used %s, expected %s", tag,
                       loom_allreduce_algo_name(stats.last_algo), loom_allreduce_algo_name(want));
        return false;
    }
    return rt_check(s, expected, tag) == 0;
}

LOOM_TEST(reduce, every_algorithm_every_device_count) {
    /* 1 element, fewer elements than devices, odd sizes, a 2-d tensor, 4 MiB + 28 bytes */
    static const int64_t shapes[][2] = {{1, 1}, {3, 1}, {1000, 1}, {257, 255}, {(1 << 20) + 7, 1}};
    for (int n = 2; n <= 8; n++) {
        char spec[32];
        snprintf(spec, sizeof spec, "sim:%d", n);
        rt_devs d;
        if (!rt_devs_open(&d, spec)) return;
        loom_reducer *r[K_N_ALGOS];
        for (int a = 0; a < K_N_ALGOS; a++)
            r[a] = rt_reducer(&d, k_algos[a]);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            rt_set s;
            LOOM_REQUIRE(rt_set_alloc(&s, &d, shapes[si][0], shapes[si][1]));
            uint64_t seed = 1000u * (uint64_t)n + si;
            float *expected = rt_expected(&s, seed, NULL);
            float *first = malloc((size_t)s.ne * sizeof(float));
            float *other = malloc((size_t)s.ne * sizeof(float));
            for (int a = 0; a < K_N_ALGOS && r[a]; a++) {
                char tag[96];
                snprintf(tag, sizeof tag, "%s, %d devices, %lld elements",
                         loom_allreduce_algo_name(k_algos[a]), n, (long long)s.ne);
                size_t nbytes = (size_t)s.ne * sizeof(float);
                loom_allreduce_algo want = loom_reducer_choose(r[a], nbytes);
                LOOM_CHECK(want != LOOM_ALLREDUCE_AUTO && want != LOOM_ALLREDUCE_NATIVE);
                if (k_algos[a] != LOOM_ALLREDUCE_AUTO) LOOM_CHECK_EQ_INT(want, k_algos[a]);
                run_one(r[a], &s, seed, NULL, expected, want, tag);
                /* the algorithms against each other, device 0 (rt_check covered the rest) */
                rt_read(&s, 0, a == 0 ? first : other);
                if (a > 0) {
                    LOOM_CHECK_MSG(memcmp(first, other, (size_t)s.ne * sizeof(float)) == 0,
                                   "%s differs from ring", tag);
                }
            }
            free(first);
            free(other);
            free(expected);
            rt_set_free(&s);
        }
        for (int a = 0; a < K_N_ALGOS; a++)
            loom_reducer_free(r[a]);
        rt_devs_close(&d);
    }
}

/* 64 MiB per device, once per algorithm, two device counts each: 2, and 3 (not a power of
 * two: the butterfly folds, the ring's chunks are uneven). */
static void large_case(loom_allreduce_algo algo, int n) {
    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n);
    rt_devs d;
    if (!rt_devs_open(&d, spec)) return;
    loom_reducer *r = rt_reducer(&d, algo);
    rt_set s;
    if (r && rt_set_alloc(&s, &d, (int64_t)16 << 20, 1)) {
        uint64_t seed = 77 + (uint64_t)n;
        float *expected = rt_expected(&s, seed, NULL);
        char tag[64];
        snprintf(tag, sizeof tag, "64 MiB %s on %d devices", loom_allreduce_algo_name(algo), n);
        run_one(r, &s, seed, NULL, expected, algo, tag);
        loom_reducer_stats st;
        loom_reducer_get_stats(r, &st);
        LOOM_CHECK_EQ_INT(st.bytes_reduced, (uint64_t)64 << 20);
        /* the volume each algorithm must move, from its definition */
        uint64_t size = (uint64_t)64 << 20, want = 0;
        int p = 1, logp = 0;
        while (p * 2 <= n)
            p *= 2, logp++;
        if (algo == LOOM_ALLREDUCE_RING) want = 2 * (uint64_t)(n - 1) * size;
        if (algo == LOOM_ALLREDUCE_BUTTERFLY) want = ((uint64_t)p * logp + 2u * (n - p)) * size;
        if (algo == LOOM_ALLREDUCE_HOST) want = 2 * (uint64_t)n * size;
        LOOM_CHECK_EQ_INT(st.bytes_moved, want);
        free(expected);
        rt_set_free(&s);
    } else if (r) {
        loom_test_fail(__FILE__, __LINE__, "64 MiB tensors on %d devices: %s", n,
                       loom_last_error());
    }
    loom_reducer_free(r);
    rt_devs_close(&d);
}

LOOM_TEST(reduce, ring_64mib) {
    large_case(LOOM_ALLREDUCE_RING, 2);
    large_case(LOOM_ALLREDUCE_RING, 3);
}

LOOM_TEST(reduce, butterfly_64mib) {
    large_case(LOOM_ALLREDUCE_BUTTERFLY, 2);
    large_case(LOOM_ALLREDUCE_BUTTERFLY, 3);
}

LOOM_TEST(reduce, host_64mib) {
    large_case(LOOM_ALLREDUCE_HOST, 2);
    large_case(LOOM_ALLREDUCE_HOST, 3);
}

/* Ordinary floats: each algorithm within rounding of the double sum, every device of one
 * algorithm bit-identical (mirrored activations must agree exactly), algorithms within
 * rounding of each other. */
LOOM_TEST(reduce, random_floats_within_rounding) {
    const int n = 5;
    rt_devs d;
    if (!rt_devs_open(&d, "sim:5")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, 317, 313));
    const int64_t ne = s.ne;
    float *ref = malloc((size_t)ne * sizeof(float)), *tol = malloc((size_t)ne * sizeof(float));
    float *out0 = malloc((size_t)ne * sizeof(float)), *outj = malloc((size_t)ne * sizeof(float));
    float *prev = malloc((size_t)ne * sizeof(float));
    for (int a = 0; a < 3; a++) {
        loom_reducer *r = rt_reducer(&d, k_algos[a]);
        LOOM_REQUIRE(r != NULL);
        float *in = rt_fill_real(&s, 99);
        for (int64_t i = 0; i < ne; i++) {
            double acc = 0, mag = 0;
            for (int j = 0; j < n; j++) {
                acc += in[(size_t)j * (size_t)ne + (size_t)i];
                mag += fabs(in[(size_t)j * (size_t)ne + (size_t)i]);
            }
            ref[i] = (float)acc;
            tol[i] = (float)(mag * n * 6e-8 + 1e-30); /* (n-1) roundings of at most 2^-24 */
        }
        free(in);
        LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, s.t, NULL), LOOM_OK);
        LOOM_CHECK_EQ_INT(loom_reducer_synchronize(r), LOOM_OK);
        rt_read(&s, 0, out0);
        int bad = 0;
        for (int64_t i = 0; i < ne && bad < 5; i++) {
            if (!(fabsf(out0[i] - ref[i]) <= tol[i])) {
                bad++;
                loom_test_fail(__FILE__, __LINE__, "%s: element %lld: %.9g vs double sum %.9g",
                               loom_allreduce_algo_name(k_algos[a]), (long long)i, (double)out0[i],
                               (double)ref[i]);
            }
        }
        for (int j = 1; j < n; j++) {
            rt_read(&s, j, outj);
            LOOM_CHECK_MSG(memcmp(out0, outj, (size_t)ne * sizeof(float)) == 0,
                           "%s: device %d differs from device 0",
                           loom_allreduce_algo_name(k_algos[a]), j);
        }
        if (a > 0) {
            for (int64_t i = 0, b = 0; i < ne && b < 5; i++) {
                if (!(fabsf(out0[i] - prev[i]) <= 2 * tol[i])) {
                    b++;
                    loom_test_fail(__FILE__, __LINE__, "%s vs %s: element %lld: %.9g vs %.9g",
                                   loom_allreduce_algo_name(k_algos[a]),
                                   loom_allreduce_algo_name(k_algos[a - 1]), (long long)i,
                                   (double)out0[i], (double)prev[i]);
                }
            }
        }
        memcpy(prev, out0, (size_t)ne * sizeof(float));
        loom_reducer_free(r);
    }
    free(ref);
    free(tol);
    free(out0);
    free(outj);
    free(prev);
    rt_set_free(&s);
    rt_devs_close(&d);
}

/* A device whose slice is empty contributes exact zeros even when its memory holds NaN and
 * -inf (0 * NaN would be NaN), and receives the sum. */
LOOM_TEST(reduce, empty_slice_with_nan_contributes_zero) {
    static const int counts[] = {2, 3, 5, 8};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        int n = counts[ci];
        char spec[32];
        snprintf(spec, sizeof spec, "sim:%d", n);
        rt_devs d;
        if (!rt_devs_open(&d, spec)) return;
        rt_set s;
        LOOM_REQUIRE(rt_set_alloc(&s, &d, 4099, 1));
        /* masks: the first device, the last (an excess device of the butterfly when n is
         * not a power of two), all but one, all */
        bool masks[4][RT_MAX];
        memset(masks, 0, sizeof masks);
        masks[0][0] = true;
        masks[1][n - 1] = true;
        for (int j = 0; j < n; j++)
            masks[2][j] = j != n / 2;
        for (int j = 0; j < n; j++)
            masks[3][j] = true;
        for (int a = 0; a < K_N_ALGOS; a++) {
            loom_reducer *r = rt_reducer(&d, k_algos[a]);
            LOOM_REQUIRE(r != NULL);
            for (int m = 0; m < 4; m++) {
                uint64_t seed = 5000 + (uint64_t)(n * 16 + m);
                float *expected = rt_expected(&s, seed, masks[m]);
                char tag[96];
                snprintf(tag, sizeof tag, "%s, %d devices, empty mask %d",
                         loom_allreduce_algo_name(k_algos[a]), n, m);
                run_one(r, &s, seed, masks[m], expected,
                        loom_reducer_choose(r, (size_t)s.ne * sizeof(float)), tag);
                free(expected);
            }
            loom_reducer_free(r);
        }
        rt_set_free(&s);
        rt_devs_close(&d);
    }
}

/* Cached plans: alternating tensor sets, refilled each time, and more sets than the
 * cache holds (eviction while work may be in flight). */
LOOM_TEST(reduce, plans_reused_and_evicted) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:3")) return;
    enum { N_SETS = 11 };
    rt_set s[N_SETS];
    for (int k = 0; k < N_SETS; k++)
        LOOM_REQUIRE(rt_set_alloc(&s[k], &d, 1000 + 31 * k, 1));
    for (int a = 0; a < 2; a++) {
        loom_reducer *r = rt_reducer(&d, k_algos[a]);
        LOOM_REQUIRE(r != NULL);
        for (int round = 0; round < 3; round++) {
            for (int k = 0; k < N_SETS; k++) {
                int kk = round == 1 ? k % 2 : k; /* round 1 alternates two sets */
                uint64_t seed = (uint64_t)(round * 100 + k);
                float *expected = rt_expected(&s[kk], seed, NULL);
                char tag[64];
                snprintf(tag, sizeof tag, "%s round %d set %d",
                         loom_allreduce_algo_name(k_algos[a]), round, kk);
                run_one(r, &s[kk], seed, NULL, expected, k_algos[a], tag);
                free(expected);
            }
        }
        loom_reducer_stats st;
        loom_reducer_get_stats(r, &st);
        LOOM_CHECK_EQ_INT(st.reductions, 3 * N_SETS);
        LOOM_CHECK_EQ_INT(st.by_algo[k_algos[a]], 3 * N_SETS);
        loom_reducer_free(r);
    }
    for (int k = 0; k < N_SETS; k++)
        rt_set_free(&s[k]);
    rt_devs_close(&d);
}

/* An in-place SCALE graph on device j's tensor. */
static loom_graph *scale_graph(loom_ctx *ctx, loom_tensor *t, float f) {
    loom_tensor *node = loom_scale(ctx, t, f);
    if (!node) return NULL;
    node->view_src = t->view_src ? t->view_src : t;
    node->view_offs = t->view_src ? t->view_offs : 0;
    if (loom_buffer_init_view(node) != LOOM_OK) return NULL;
    loom_graph *g = loom_graph_new(ctx, 4);
    if (!g || loom_graph_add_node(g, node) != LOOM_OK) return NULL;
    return g;
}

/* Work queued before the reduction (no host sync) is waited for; work queued after it
 * sees the sum: x/2 on the devices, queue "x *= 2", reduce, queue "x *= 3", then check
 * 3 * sum. */
LOOM_TEST(reduce, stream_order_before_and_after) {
    rt_devs d;
    if (!rt_devs_open(&d, "sim:6")) return;
    rt_set s;
    LOOM_REQUIRE(rt_set_alloc(&s, &d, (1 << 18) + 5, 1));
    loom_ctx_params cp = {.mem_size = 64 * loom_tensor_overhead() + 16 * loom_graph_overhead(4),
                          .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    LOOM_REQUIRE(ctx != NULL);
    loom_graph *twice[RT_MAX], *thrice[RT_MAX];
    for (int j = 0; j < d.n; j++) {
        twice[j] = scale_graph(ctx, s.t[j], 2.0f);
        thrice[j] = scale_graph(ctx, s.t[j], 3.0f);
        LOOM_REQUIRE(twice[j] && thrice[j]);
    }
    float *half = malloc((size_t)s.ne * sizeof(float));
    float *expected = rt_expected(&s, 4242, NULL);
    for (int64_t i = 0; i < s.ne; i++)
        expected[i] *= 3.0f; /* exact: small multiples of 1/64 */
    for (int a = 0; a < 3; a++) {
        loom_reducer *r = rt_reducer(&d, k_algos[a]);
        LOOM_REQUIRE(r != NULL);
        rt_fill(&s, 4242, NULL);
        for (int j = 0; j < d.n; j++) {
            rt_read(&s, j, half);
            for (int64_t i = 0; i < s.ne; i++)
                half[i] *= 0.5f;
            loom_tensor_set(s.t[j], half, 0, (size_t)s.ne * sizeof(float));
        }
        for (int j = 0; j < d.n; j++) {
            LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(d.be[j], twice[j]), LOOM_OK);
        }
        LOOM_CHECK_EQ_INT(loom_reducer_allreduce(r, s.t, NULL), LOOM_OK);
        for (int j = 0; j < d.n; j++) {
            LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(d.be[j], thrice[j]), LOOM_OK);
        }
        for (int j = 0; j < d.n; j++)
            loom_backend_synchronize(d.be[j]);
        char tag[64];
        snprintf(tag, sizeof tag, "%s with queued work", loom_allreduce_algo_name(k_algos[a]));
        rt_check(&s, expected, tag);
        loom_reducer_free(r);
    }
    free(half);
    free(expected);
    loom_ctx_free(ctx);
    rt_set_free(&s);
    rt_devs_close(&d);
}
