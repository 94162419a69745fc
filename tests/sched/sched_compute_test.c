/*
 * The scheduler end to end: a llama-shaped model split over [sim, CPU] and [sim, sim, CPU]
 * computes what the CPU alone computes (an independent reference where every tensor has
 * its own memory), round after round; pipeline copies rotate per graph and return to copy
 * 0 after a synchronize; user inputs are copied before compute returns; intermediates
 * cross devices; MUL_MAT_ID copies only the selected experts (bytes checked with the sim
 * counters); the eval callback observes intermediates and stops early.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched-impl.h"
#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

static const tu_cfg k_cfg = {.n_layer = 4, .d = 64, .n_head = 4, .n_ff = 96, .n_out = 48, .T = 6};

/* Weight placement: layer i on backend place[i] (the last entry: the output head). */
static void place(const tu_devs *d, const int *place, int n, loom_buft_t *bufts) {
    for (int i = 0; i < n; i++)
        bufts[i] = tu_buft(d, place[i]);
}

static double run_and_compare(const tu_devs *d, const int *placement, bool parallel, int rounds,
                              loom_sched_stats *stats) {
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    place(d, placement, k_cfg.n_layer + 1, bufts);
    tu_model m;
    if (!tu_model_new(&m, &k_cfg, bufts)) return -1;
    loom_sched *s =
        loom_sched_new((loom_backend_t *)d->backends, NULL, d->n, 1024, parallel, false);
    if (!s) return -2;
    double worst = 0;
    for (int r = 0; r < rounds && worst >= 0; r++) {
        if (r > 0 && !tu_model_rebuild(&m, k_cfg.T)) return -3;
        if (loom_sched_alloc_graph(s, m.g) != LOOM_OK) {
            worst = -4;
            break;
        }
        tu_set_inputs(&m.in, 100 + (uint32_t)r);
        if (loom_sched_graph_compute(s, m.g) != LOOM_OK) {
            worst = -5;
            break;
        }
        tu_ref ref;
        if (!tu_ref_compute(&ref, &k_cfg, 100 + (uint32_t)r)) return -6;
        double e = tu_max_rel_err(m.out, ref.out);
        tu_ref_free(&ref);
        if (e < 0 || !(e <= worst)) worst = e < 0 ? -7 : e;
        loom_sched_get_stats(s, stats);
        loom_sched_reset(s);
    }
    loom_sched_free(s);
    tu_model_free(&m);
    return worst;
}

LOOM_TEST(sched_compute, sim_cpu_matches_cpu_alone) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    int placement[] = {0, 0, 0, 0, 1}; /* layers on SIM0, output head on the CPU */
    loom_sched_stats st;
    double err = run_and_compare(&d, placement, false, 3, &st);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g (%s)", err, loom_last_error());
    LOOM_CHECK(st.n_splits >= 2);
    LOOM_CHECK(st.n_inputs >= 2);
    tu_devs_close(&d);
}

LOOM_TEST(sched_compute, sim_sim_cpu_matches_cpu_alone) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    int placement[] = {0, 0, 1, 1, 2}; /* layer split, output on the CPU */
    loom_sched_stats st;
    double err = run_and_compare(&d, placement, false, 2, &st);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g (%s)", err, loom_last_error());
    LOOM_CHECK(st.n_splits >= 3);
    int interleaved[] = {0, 1, 0, 1, 2};
    err = run_and_compare(&d, interleaved, false, 2, &st);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g (%s)", err, loom_last_error());
    LOOM_CHECK(st.n_splits >= 5);
    /* without p2p the intermediates stage through the host */
    tu_devs_close(&d);
    const char *nop2p[] = {"sim:2,p2p=0"};
    LOOM_REQUIRE(tu_devs_open(&d, nop2p, 1, 2));
    err = run_and_compare(&d, placement, false, 1, &st);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g (%s)", err, loom_last_error());
    tu_devs_close(&d);
}

LOOM_TEST(sched_compute, pipeline_parallel_matches_cpu_alone) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    int placement[] = {0, 0, 1, 1, 2};
    loom_sched_stats st;
    double err = run_and_compare(&d, placement, true, 3, &st);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g (%s)", err, loom_last_error());
    LOOM_CHECK_EQ_INT(st.n_copies, LOOM_SCHED_MAX_COPIES);
    LOOM_CHECK(st.n_graph_inputs >= 3); /* x, pos, mask */
    tu_devs_close(&d);
}

/* The copy a split's node reads: "<backend>#<tensor>#<copy>". */
static const char *copy_suffix_of(loom_sched *s, tu_model *m) {
    (void)s;
    for (int i = 0; i < m->g->n_nodes; i++) {
        loom_tensor *n = m->g->nodes[i];
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (n->src[j] && strstr(n->src[j]->name, "#l_out-1#")) {
                return strrchr(n->src[j]->name, '#');
            }
        }
    }
    return NULL;
}

LOOM_TEST(sched_compute, copies_rotate_per_graph_and_restart_after_synchronize) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    int placement[] = {0, 0, 1, 1, 2};
    place(&d, placement, 5, bufts);
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, true, false);
    LOOM_REQUIRE(s != NULL);
    const char *want[] = {"#0", "#1", "#2", "#3", "#0"};
    for (int r = 0; r < 5; r++) {
        if (r > 0) LOOM_REQUIRE(tu_model_rebuild(&m, k_cfg.T));
        LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
        tu_set_inputs(&m.in, 1);
        const char *suffix = copy_suffix_of(s, &m);
        LOOM_REQUIRE(suffix != NULL);
        LOOM_CHECK_MSG(strcmp(suffix, want[r]) == 0, "round %d uses copy %s, want %s", r, suffix,
                       want[r]);
        /* back to back, no synchronize: the pipeline keeps rotating */
        LOOM_REQUIRE(loom_sched_graph_compute_async(s, m.g) == LOOM_OK);
        loom_sched_reset(s);
    }
    /* a synchronize when nothing is allocated: the next graph takes copy 0 */
    loom_sched_synchronize(s);
    LOOM_REQUIRE(tu_model_rebuild(&m, k_cfg.T));
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(copy_suffix_of(s, &m), "#0");
    tu_set_inputs(&m.in, 3);
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 3));
    double err = tu_max_rel_err(m.out, ref.out);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g", err);
    tu_ref_free(&ref);
    /* token-by-token: compute + synchronize each time, always copy 0 */
    for (int r = 0; r < 3; r++) {
        loom_sched_reset(s);
        LOOM_REQUIRE(tu_model_rebuild(&m, k_cfg.T));
        LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
        LOOM_CHECK_STR_CONTAINS(copy_suffix_of(s, &m), "#0");
        tu_set_inputs(&m.in, 3);
        LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    }
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

/* The caller overwrites an input right after compute_async returns: the result must still
 * be the one of the original input. */
LOOM_TEST(sched_compute, user_inputs_are_copied_before_compute_returns) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    int placement[] = {0, 0, 0, 0, 0};
    place(&d, placement, 5, bufts);
    for (int parallel = 0; parallel < 2; parallel++) {
        tu_model m;
        LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
        loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, parallel, false);
        LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
        tu_set_inputs(&m.in, 21);
        LOOM_REQUIRE(loom_sched_graph_compute_async(s, m.g) == LOOM_OK);
        tu_fill(m.in.x, 999, 100.0f); /* garbage, at once */
        tu_fill(m.in.mask, 998, 100.0f);
        loom_sched_synchronize(s);
        tu_ref ref;
        LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 21));
        double err = tu_max_rel_err(m.out, ref.out);
        LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "parallel=%d: error %g", parallel, err);
        tu_ref_free(&ref);
        loom_sched_free(s);
        tu_model_free(&m);
    }
    tu_devs_close(&d);
}

/* ---------------------------------------------------------------- experts */

static uint64_t bytes_in(loom_backend_t be) {
    loom_sim_stats st;
    loom_sim_dev_stats(loom_backend_device(be), &st);
    return st.bytes_in;
}

LOOM_TEST(sched_compute, mul_mat_id_copies_only_selected_experts) {
    tu_devs d;
    const char *spec[] = {"sim:1,offload=1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    enum { K = 32, M = 24, E = 8, U = 2, T = 3 };
    /* experts in host memory, usage WEIGHTS */
    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *experts = loom_new_tensor_3d(wctx, LOOM_TYPE_F32, K, M, E);
    loom_set_name(experts, "ffn_exps");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, loom_cpu_buffer_type());
    LOOM_REQUIRE(wbuf != NULL);
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    tu_fill(experts, 4, 0.25f);

    const int32_t ids_val[U * T] = {1, 2, 2, 5, 6, 1}; /* experts 1, 2, 5, 6: runs [1,2], [5,6] */
    loom_ctx *ctx = tu_ctx(32, true);
    loom_tensor *b = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, K, U, T);
    loom_tensor *ids = loom_new_tensor_2d(ctx, LOOM_TYPE_I32, U, T);
    loom_set_name(b, "b");
    loom_set_name(ids, "ids");
    loom_set_input(b);
    loom_set_input(ids);
    loom_tensor *r = loom_mul_mat_id(ctx, experts, b, ids);
    loom_set_output(r);
    loom_graph *g = tu_graph(ctx, r);
    LOOM_REQUIRE(g != NULL);

    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 64, false, true);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
    LOOM_CHECK(loom_sched_get_tensor_backend(s, r) == d.backends[0]);
    LOOM_CHECK_STR_CONTAINS(loom_sched_get_tensor_cause(s, r), "1.off");
    tu_fill(b, 9, 1.0f);
    loom_tensor_set(ids, ids_val, 0, sizeof ids_val);
    loom_sim_dev_reset_stats(loom_backend_device(d.backends[0]));
    LOOM_REQUIRE(loom_sched_graph_compute(s, g) == LOOM_OK);

    const size_t es = (size_t)K * M * sizeof(float);
    const size_t pad = es < 512 ? es : 512;
    uint64_t expect = (2 * es + pad) + (2 * es + pad) + loom_nbytes(b) + loom_nbytes(ids);
    LOOM_CHECK_EQ_INT(bytes_in(d.backends[0]), expect);
    LOOM_CHECK(expect < loom_nbytes(experts)); /* less than the whole tensor */

    /* the result: against a host computation of the same op */
    loom_ctx *hctx = tu_ctx(16, false);
    loom_tensor *hb = loom_new_tensor_3d(hctx, LOOM_TYPE_F32, K, U, T);
    loom_tensor *hids = loom_new_tensor_2d(hctx, LOOM_TYPE_I32, U, T);
    float *bv = tu_read(b);
    memcpy(hb->data, bv, loom_nbytes(b));
    memcpy(hids->data, ids_val, sizeof ids_val);
    loom_tensor *hr = loom_mul_mat_id(hctx, experts, hb, hids);
    loom_graph *hg = tu_graph(hctx, hr);
    LOOM_REQUIRE(loom_cpu_graph_compute(hg, NULL) == LOOM_OK);
    float *got = tu_read(r);
    double worst = 0;
    for (int64_t i = 0; i < loom_nelements(r); i++) {
        double e = fabs(got[i] - ((float *)hr->data)[i]);
        if (e > worst) worst = e;
    }
    LOOM_CHECK_MSG(worst < 1e-5, "max error %g", worst);
    free(got);
    free(bv);

    /* an id outside [0, E) is an error naming the ids tensor */
    loom_sched_reset(s);
    loom_ctx *ctx2 = tu_ctx(32, true);
    loom_tensor *b2 = loom_new_tensor_3d(ctx2, LOOM_TYPE_F32, K, U, T);
    loom_tensor *ids2 = loom_new_tensor_2d(ctx2, LOOM_TYPE_I32, U, T);
    loom_set_name(ids2, "bad_ids");
    loom_set_input(b2);
    loom_set_input(ids2);
    loom_graph *g2 = tu_graph(ctx2, loom_mul_mat_id(ctx2, experts, b2, ids2));
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g2) == LOOM_OK);
    tu_fill(b2, 1, 1.0f);
    int32_t bad[U * T] = {0, 1, 2, 9, 3, 4};
    loom_tensor_set(ids2, bad, 0, sizeof bad);
    LOOM_CHECK(loom_sched_graph_compute(s, g2) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "bad_ids");
    loom_sched_synchronize(s);

    loom_sched_free(s);
    loom_ctx_free(ctx2);
    loom_ctx_free(hctx);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

/* ---------------------------------------------------------------- eval callback */

typedef struct observer {
    tu_ref *ref;
    int n_seen, n_checked, n_asked;
    double worst;
    const char *stop_at;
    bool stopped;
} observer;

static bool observe(loom_tensor *t, loom_backend_t backend, bool ask, void *ud) {
    observer *o = ud;
    (void)backend;
    bool wanted = strncmp(t->name, "l_out-", 6) == 0 || strncmp(t->name, "attn_out-", 9) == 0;
    if (ask) {
        o->n_asked++;
        return wanted;
    }
    o->n_seen++;
    loom_tensor *rt = loom_ctx_get_tensor(o->ref->ctx, t->name);
    if (rt) {
        double e = tu_max_rel_err(t, rt);
        if (e < 0 || e > o->worst) o->worst = e < 0 ? 1e9 : e;
        o->n_checked++;
    }
    if (o->stop_at && strcmp(t->name, o->stop_at) == 0) {
        o->stopped = true;
        return false;
    }
    return true;
}

LOOM_TEST(sched_compute, eval_callback_observes_and_stops) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    int placement[] = {0, 1, 0, 1, 2};
    place(&d, placement, 5, bufts);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 8));

    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, false, false);
    observer o = {.ref = &ref};
    loom_sched_set_eval_callback(s, observe, &o);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    tu_set_inputs(&m.in, 8);
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(o.n_seen, 2 * k_cfg.n_layer);
    LOOM_CHECK_EQ_INT(o.n_checked, 2 * k_cfg.n_layer);
    LOOM_CHECK_MSG(o.worst < 1e-5, "observed tensors differ: %g", o.worst);
    LOOM_CHECK(tu_max_rel_err(m.out, ref.out) < 1e-5);

    /* stop at layer 1: nothing after it runs, on any backend */
    loom_sched_reset(s);
    LOOM_REQUIRE(tu_model_rebuild(&m, k_cfg.T));
    observer o2 = {.ref = &ref, .stop_at = "l_out-1"};
    loom_sched_set_eval_callback(s, observe, &o2);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    tu_set_inputs(&m.in, 8);
    loom_tensor_memset(m.out, 0xff, 0, loom_nbytes(m.out)); /* NaN sentinel */
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    LOOM_CHECK(o2.stopped);
    LOOM_CHECK_EQ_INT(o2.n_seen, 4); /* attn_out-0, l_out-0, attn_out-1, l_out-1 */
    float *out = tu_read(m.out);
    LOOM_CHECK(isnan(out[0]));
    free(out);

    loom_sched_free(s);
    tu_model_free(&m);
    tu_ref_free(&ref);
    tu_devs_close(&d);
}

/* Rounds issued back to back without waiting: the graph ends on SIM1 (its result copied
 * into a per-round tensor in SIM1's memory), so compute_async returns while the devices
 * still run, and the next round starts on SIM0 while SIM1 finishes the previous one. Every
 * round must still produce its own result (copy slots, events and the ordering of
 * asynchronous device-to-device copies against later writes). */
LOOM_TEST(sched_compute, back_to_back_async_rounds_are_race_free) {
    enum { R = 6 };
    const tu_cfg cfg = {.n_layer = 4, .d = 128, .n_head = 4, .n_ff = 256, .n_out = 64, .T = 16};
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 2));
    loom_buft_t bufts[5] = {tu_buft(&d, 0), tu_buft(&d, 0), tu_buft(&d, 1), tu_buft(&d, 1),
                            tu_buft(&d, 1)};
    tu_weights w;
    LOOM_REQUIRE(tu_weights_new(&w, &cfg, bufts));
    tu_ref ref[R];
    for (int k = 0; k < R; k++) LOOM_REQUIRE(tu_ref_compute(&ref[k], &cfg, 50 + (uint32_t)k));

    for (int parallel = 0; parallel < 2; parallel++) {
        loom_ctx *dctx = tu_ctx(R + 1, true);
        loom_tensor *dst[R];
        for (int k = 0; k < R; k++) {
            dst[k] = loom_new_tensor_2d(dctx, LOOM_TYPE_F32, cfg.n_out, cfg.T);
            loom_format_name(dst[k], "result-%d", k);
        }
        loom_buffer_t dbuf = loom_alloc_ctx_tensors(dctx, tu_buft(&d, 1));
        LOOM_REQUIRE(dbuf != NULL);
        loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, parallel, false);
        loom_ctx *ctx[R];
        for (int k = 0; k < R; k++) {
            ctx[k] = tu_ctx(64 + 40 * (size_t)cfg.n_layer, true);
            tu_inputs in;
            loom_tensor *out = tu_build(ctx[k], &w, &in);
            loom_graph *g = tu_graph(ctx[k], loom_cpy(ctx[k], out, dst[k]));
            LOOM_REQUIRE(g != NULL);
            LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
            LOOM_CHECK(loom_sched_get_tensor_backend(s, g->nodes[g->n_nodes - 1]) ==
                       d.backends[1]);
            tu_set_inputs(&in, 50 + (uint32_t)k);
            LOOM_REQUIRE(loom_sched_graph_compute_async(s, g) == LOOM_OK);
            loom_sched_reset(s); /* no synchronize: the next round starts at once */
        }
        loom_sched_synchronize(s);
        for (int k = 0; k < R; k++) {
            double err = tu_max_rel_err(dst[k], ref[k].out);
            LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "parallel=%d round %d: error %g", parallel, k,
                           err);
        }
        loom_sched_free(s);
        for (int k = 0; k < R; k++) loom_ctx_free(ctx[k]);
        loom_buffer_free(dbuf);
        loom_ctx_free(dctx);
    }
    for (int k = 0; k < R; k++) tu_ref_free(&ref[k]);
    tu_weights_free(&w);
    tu_devs_close(&d);
}
