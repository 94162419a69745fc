/*
 * Scheduler defects of issue 9, each built deterministically:
 *   - an eager user-input copy must not overwrite bytes that another device is still
 *     copying out of (the copy runs on the reading device's stream); SIM1's stream is held
 *     (loom_sim_backend_hold) so it runs as late as ordering allows;
 *   - a split whose graph fails on its device fails loom_sched_graph_compute (not the
 *     next call), and the next healthy graph succeeds.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched-impl.h"
#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

/* Weights in backend b's memory, usage WEIGHTS, filled deterministically. */
static loom_buffer_t weights_on(loom_ctx *ctx, loom_buft_t buft, uint32_t seed) {
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, buft);
    if (!buf) return NULL;
    loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t))
        tu_fill(t, seed, 0.5f);
    return buf;
}

/* r[n, t] = sum_k a[n, k] * b[t, k] (loom_mul_mat of host arrays) */
static void ref_mul_mat(const float *a, const float *b, int K, int N, int T, double *r) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)a[n * K + k] * b[t * K + k];
            r[t * N + n] = acc;
        }
}

/* t0 = w0 x c on SIM0; t1 = w1 x t0 on SIM1 (t0 copied SIM0 -> SIM1 on SIM1's stream);
 * t2 = w2 x x on SIM0 with x a user input, whose staging copy gets t0's bytes (t0 is dead
 * once copied out); out = t1 + t2. SIM1 runs late: the host must not write x's copy
 * before SIM1 has copied t0. */
LOOM_TEST(sched_fix, eager_input_copy_waits_for_copies_out_of_its_memory) {
    enum { K2 = 48, K = 64, M = 96, T = 4 };
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_ctx *w0ctx = tu_ctx(8, true), *w1ctx = tu_ctx(8, true);
    loom_tensor *w0 = loom_new_tensor_2d(w0ctx, LOOM_TYPE_F32, K2, K);
    loom_tensor *c = loom_new_tensor_2d(w0ctx, LOOM_TYPE_F32, K2, T);
    loom_tensor *w2 = loom_new_tensor_2d(w0ctx, LOOM_TYPE_F32, K, M);
    loom_tensor *w1 = loom_new_tensor_2d(w1ctx, LOOM_TYPE_F32, K, M);
    loom_set_name(w0, "w0");
    loom_set_name(c, "c");
    loom_set_name(w2, "w2");
    loom_set_name(w1, "w1");
    loom_buffer_t b0 = weights_on(w0ctx, tu_buft(&d, 0), 1);
    loom_buffer_t b1 = weights_on(w1ctx, tu_buft(&d, 1), 2);
    LOOM_REQUIRE(b0 && b1);
    float *hw0 = tu_read(w0), *hc = tu_read(c), *hw1 = tu_read(w1), *hw2 = tu_read(w2);

    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 256, false, false);
    LOOM_REQUIRE(s != NULL);
    for (int round = 0; round < 3; round++) {
        loom_ctx *ctx = tu_ctx(32, true);
        loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, T);
        loom_set_name(x, "x");
        loom_set_input(x);
        loom_tensor *t0 = loom_mul_mat(ctx, w0, c);
        loom_tensor *t1 = loom_mul_mat(ctx, w1, t0);
        loom_tensor *t2 = loom_mul_mat(ctx, w2, x);
        loom_tensor *out = loom_add(ctx, t1, t2);
        loom_set_output(out);
        loom_graph *g = tu_graph(ctx, out);
        LOOM_REQUIRE(g != NULL);
        LOOM_REQUIRE(loom_sched_set_tensor_backend(s, out, d.backends[0]) == LOOM_OK);
        LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
        LOOM_REQUIRE(loom_sched_get_n_splits(s) == 3);
        /* the overlap this test is about: x's staging copy on SIM0 reuses t0's bytes */
        LOOM_REQUIRE(t2->src[1] != x && t2->src[1]->buffer != NULL);
        LOOM_CHECK_MSG(t2->src[1]->data == t0->data, "x's copy at %p, t0 at %p", t2->src[1]->data,
                       t0->data);
        LOOM_REQUIRE(t2->src[1]->data == t0->data);
        tu_fill(x, 10 + (uint32_t)round, 1.0f);
        float *hx = tu_read(x);

        loom_sim_backend_hold(d.backends[1]);
        LOOM_REQUIRE(loom_sched_graph_compute_async(s, g) == LOOM_OK);
        LOOM_REQUIRE(loom_sched_synchronize(s) == LOOM_OK);

        double *r0 = malloc(sizeof(double) * K * T), *r1 = malloc(sizeof(double) * M * T),
               *r2 = malloc(sizeof(double) * M * T);
        float *f0 = malloc(sizeof(float) * K * T);
        ref_mul_mat(hw0, hc, K2, K, T, r0);
        for (int i = 0; i < K * T; i++)
            f0[i] = (float)r0[i];
        ref_mul_mat(hw1, f0, K, M, T, r1);
        ref_mul_mat(hw2, hx, K, M, T, r2);
        float *got = tu_read(out);
        int bad = 0;
        for (int i = 0; i < M * T; i++) {
            double want = r1[i] + r2[i];
            if (fabs(got[i] - want) > 1e-3 * (1 + fabs(want))) bad++;
        }
        LOOM_CHECK_MSG(bad == 0, "round %d: %d of %d outputs wrong", round, bad, M * T);
        free(got);
        free(r0);
        free(r1);
        free(r2);
        free(f0);
        free(hx);
        loom_sched_reset(s);
        loom_ctx_free(ctx);
    }
    loom_sched_free(s);
    free(hw0);
    free(hc);
    free(hw1);
    free(hw2);
    loom_buffer_free(b0);
    loom_buffer_free(b1);
    loom_ctx_free(w0ctx);
    loom_ctx_free(w1ctx);
    tu_devs_close(&d);
}

/* A GET_ROWS with an out-of-range row fails inside the SIM0 worker (after compute was
 * queued): the call that computes it fails, naming the cause; the next healthy graph on
 * the same scheduler succeeds. */
static void failing_graph_case(bool on_sim) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, on_sim ? 1 : 0, 1));
    const char *name = loom_backend_name(d.backends[0]);
    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *table = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 8, 5);
    loom_set_name(table, "table");
    loom_buffer_t wb = weights_on(wctx, tu_buft(&d, 0), 3);
    LOOM_REQUIRE(wb != NULL);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 64, false, false);
    LOOM_REQUIRE(s != NULL);
    const int32_t rows[2][3] = {{0, 7, 1}, {4, 0, 2}}; /* 7: out of range */
    for (int round = 0; round < 2; round++) {
        loom_ctx *ctx = tu_ctx(16, true);
        loom_tensor *ids = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 3);
        loom_set_name(ids, "ids");
        loom_set_input(ids);
        loom_tensor *out = loom_scale(ctx, loom_get_rows(ctx, table, ids), 2.0f);
        loom_set_output(out);
        loom_graph *g = tu_graph(ctx, out);
        LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
        LOOM_REQUIRE(loom_sched_get_tensor_backend(s, g->nodes[0]) == d.backends[0]);
        loom_tensor_set(ids, rows[round], 0, sizeof rows[round]);
        loom_status st = loom_sched_graph_compute(s, g);
        if (round == 0) {
            LOOM_CHECK(st != LOOM_OK);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), "out of range");
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), name);
        } else {
            LOOM_CHECK_MSG(st == LOOM_OK, "the healthy graph after a failure: %s",
                           loom_last_error());
            float got[24], tab[40];
            loom_tensor_get(out, got, 0, sizeof got);
            loom_tensor_get(table, tab, 0, sizeof tab);
            for (int r = 0; r < 3; r++)
                for (int i = 0; i < 8; i++)
                    LOOM_CHECK(got[r * 8 + i] == 2.0f * tab[rows[1][r] * 8 + i]);
        }
        loom_sched_reset(s);
        loom_ctx_free(ctx);
    }
    loom_sched_free(s);
    loom_buffer_free(wb);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

LOOM_TEST(sched_fix, failed_device_graph_fails_the_call_that_ran_it) {
    failing_graph_case(true);  /* sim: the failure happens on the worker, after queueing */
    failing_graph_case(false); /* cpu: synchronous */
}
