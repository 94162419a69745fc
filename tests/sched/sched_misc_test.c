/*
 * The scheduler's lifecycle around allocation: reserve sizes once for the worst case and
 * later graphs reuse the plan; reallocation happens only when a node's memory changes
 * (not when it moves between backends sharing a buffer type) or the plan no longer fits;
 * LOOM_SCHED_DEBUG_REALLOC turns the unexpected ones into errors; pipeline copies that do
 * not fit are dropped with a log line; the debug print and the stats; device and host
 * out-of-memory are statuses.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

static const tu_cfg k_cfg = {.n_layer = 2, .d = 64, .n_head = 4, .n_ff = 96, .n_out = 48, .T = 16};

static void place_all(const tu_devs *d, int backend, int n_layer, loom_buft_t *bufts) {
    for (int i = 0; i < n_layer; i++)
        bufts[i] = tu_buft(d, backend);
    bufts[n_layer] = loom_cpu_buffer_type();
}

LOOM_TEST(sched_misc, reserve_once_and_reuse_the_plan) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    place_all(&d, 0, k_cfg.n_layer, bufts);
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    size_t sizes[2] = {0, 0};
    LOOM_REQUIRE(loom_sched_reserve_size(s, m.g, sizes) == LOOM_OK);
    LOOM_CHECK(sizes[0] > 0 && sizes[1] > 0);
    LOOM_CHECK_EQ_INT(loom_sched_get_buffer_size(s, d.backends[0]), 0); /* measured only */
    LOOM_REQUIRE(tu_model_rebuild(&m, k_cfg.T));
    LOOM_REQUIRE(loom_sched_reserve(s, m.g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_sched_get_buffer_size(s, d.backends[0]), sizes[0]);
    LOOM_CHECK_EQ_INT(loom_sched_get_buffer_size(s, d.cpu), sizes[1]);
    loom_sched_stats st;
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_reallocs, 1);
    /* smaller and equal batches: no new plan */
    int batches[] = {16, 4, 1, 16};
    for (int r = 0; r < 4; r++) {
        LOOM_REQUIRE(tu_model_rebuild(&m, batches[r]));
        loom_status cs = loom_sched_graph_compute(s, m.g);
        LOOM_CHECK_MSG(cs == LOOM_OK, "batch %d: %s", batches[r], loom_last_error());
    }
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_reallocs, 1);
    /* a larger batch outgrows it: one reallocation, and the result is still right */
    tu_cfg big = k_cfg;
    big.T = 40;
    LOOM_REQUIRE(tu_model_rebuild(&m, big.T));
    LOOM_CHECK_EQ_INT(loom_sched_alloc_graph(s, m.g), LOOM_ERR_INVALID_ARG); /* reset first */
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "loom_sched_reset");
    loom_sched_reset(s);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    tu_set_inputs(&m.in, 2);
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_reallocs, 2);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &big, 2));
    double err = tu_max_rel_err(m.out, ref.out);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g", err);
    tu_ref_free(&ref);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

static loom_status run_round(loom_sched *s, tu_model *m, int T, loom_tensor **pin_node,
                             loom_backend_t pin_to) {
    loom_sched_reset(s);
    if (!tu_model_rebuild(m, T)) return LOOM_ERR_NOMEM;
    if (pin_node) {
        *pin_node = loom_graph_get_tensor(m->g, "l_out-0");
        loom_status st = loom_sched_set_tensor_backend(s, *pin_node, pin_to);
        if (st != LOOM_OK) return st;
    }
    loom_status st = loom_sched_alloc_graph(s, m->g);
    if (st != LOOM_OK) return st;
    tu_set_inputs(&m->in, 1);
    return loom_sched_graph_compute(s, m->g);
}

LOOM_TEST(sched_misc, reallocation_only_on_memory_change_and_the_tripwire) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    place_all(&d, 0, k_cfg.n_layer, bufts);
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_tensor *pinned = NULL;
    loom_sched_stats st;

    /* LOOM_SCHED_DEBUG_REALLOC=1: a bigger batch (same assignment, same graph size) is an
     * unexpected reallocation; moving a node to other memory is an expected one */
    setenv("LOOM_SCHED_DEBUG_REALLOC", "1", 1);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    unsetenv("LOOM_SCHED_DEBUG_REALLOC");
    LOOM_REQUIRE(run_round(s, &m, 16, NULL, NULL) == LOOM_OK); /* the first plan */
    LOOM_REQUIRE(run_round(s, &m, 16, NULL, NULL) == LOOM_OK);
    loom_status rs = run_round(s, &m, 32, NULL, NULL);
    LOOM_CHECK_EQ_INT(rs, LOOM_ERR_INTERNAL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unexpected graph reallocation");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "LOOM_SCHED_DEBUG_REALLOC = 1");
    LOOM_REQUIRE(run_round(s, &m, 16, &pinned, d.cpu) == LOOM_OK); /* SIM0 -> CPU memory */
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_reallocs, 2);
    loom_sched_free(s);

    /* =2: any reallocation after the first plan */
    setenv("LOOM_SCHED_DEBUG_REALLOC", "2", 1);
    s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    unsetenv("LOOM_SCHED_DEBUG_REALLOC");
    LOOM_REQUIRE(run_round(s, &m, 16, NULL, NULL) == LOOM_OK);
    LOOM_CHECK_EQ_INT(run_round(s, &m, 16, &pinned, d.cpu), LOOM_ERR_INTERNAL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unexpected graph reallocation");
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);

    /* an accelerator sharing the CPU's memory: moving a node between them is free */
    const char *hspec[] = {"sim:1,hostmem=1"};
    LOOM_REQUIRE(tu_devs_open(&d, hspec, 1, 1));
    place_all(&d, 0, k_cfg.n_layer, bufts);
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    setenv("LOOM_SCHED_DEBUG_REALLOC", "2", 1);
    s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    unsetenv("LOOM_SCHED_DEBUG_REALLOC");
    LOOM_REQUIRE(run_round(s, &m, 16, NULL, NULL) == LOOM_OK);
    loom_status hs = run_round(s, &m, 16, &pinned, d.cpu);
    LOOM_CHECK_MSG(hs == LOOM_OK, "%s", loom_last_error());
    LOOM_CHECK(loom_sched_get_tensor_backend(s, pinned) == d.cpu);
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_reallocs, 1);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 1));
    LOOM_CHECK(tu_max_rel_err(m.out, ref.out) < 1e-5);
    tu_ref_free(&ref);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

LOOM_TEST(sched_misc, pipeline_copies_dropped_when_they_do_not_fit) {
    tu_cfg cfg = k_cfg;
    cfg.T = 32;
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    place_all(&d, 0, cfg.n_layer, bufts);
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &cfg, bufts));
    size_t s1[2], s4[2], wbytes = 0;
    for (int i = 0; i < cfg.n_layer; i++)
        wbytes += loom_buffer_size(m.w.buf[i]);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    LOOM_REQUIRE(loom_sched_reserve_size(s, m.g, s1) == LOOM_OK);
    loom_sched_free(s);
    LOOM_REQUIRE(tu_model_rebuild(&m, cfg.T));
    s = loom_sched_new(d.backends, NULL, d.n, 512, true, false);
    LOOM_REQUIRE(loom_sched_reserve_size(s, m.g, s4) == LOOM_OK);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
    LOOM_REQUIRE(s4[0] > s1[0] + 4096);

    /* a device with room for one copy of everything, not four */
    char capped[64];
    snprintf(capped, sizeof capped, "sim:1,mem=%zu", wbytes + (s1[0] + s4[0]) / 2);
    const char *cspec[] = {capped};
    LOOM_REQUIRE(tu_devs_open(&d, cspec, 1, 1));
    place_all(&d, 0, cfg.n_layer, bufts);
    LOOM_REQUIRE(tu_model_new(&m, &cfg, bufts));
    s = loom_sched_new(d.backends, NULL, d.n, 512, true, false);
    LOOM_CHECK_EQ_INT(loom_sched_get_n_copies(s), 4);
    tu_log_start();
    loom_status st = loom_sched_reserve(s, m.g);
    tu_log_stop();
    LOOM_CHECK_EQ_INT(st, LOOM_OK);
    LOOM_CHECK_EQ_INT(tu_log_count("retrying without pipeline parallelism"), 1);
    LOOM_CHECK_EQ_INT(loom_sched_get_n_copies(s), 1);
    LOOM_CHECK_EQ_INT(loom_sched_get_buffer_size(s, d.backends[0]), s1[0]);
    /* and it computes */
    LOOM_REQUIRE(tu_model_rebuild(&m, cfg.T));
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    tu_set_inputs(&m.in, 4);
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &cfg, 4));
    LOOM_CHECK(tu_max_rel_err(m.out, ref.out) < 1e-5);
    tu_ref_free(&ref);
    loom_sched_free(s);

    /* without pipeline copies to drop, running out of device memory is an error */
    snprintf(capped, sizeof capped, "sim:1,mem=%zu", wbytes + s1[0] / 2);
    tu_model_free(&m);
    tu_devs_close(&d);
    LOOM_REQUIRE(tu_devs_open(&d, cspec, 1, 1));
    place_all(&d, 0, cfg.n_layer, bufts);
    LOOM_REQUIRE(tu_model_new(&m, &cfg, bufts));
    s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    LOOM_CHECK_EQ_INT(loom_sched_alloc_graph(s, m.g), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "failed to allocate the compute buffers");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

typedef struct lines {
    int n_split, n_node;
    char first[256];
} lines;

static void count_line(const char *text, void *ud) {
    lines *l = ud;
    if (strncmp(text, "## SPLIT #", 10) == 0) {
        if (l->n_split++ == 0) snprintf(l->first, sizeof l->first, "%s", text);
    }
    if (strncmp(text, "node #", 6) == 0) l->n_node++;
}

LOOM_TEST(sched_misc, debug_print_and_stats) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[3] = {tu_buft(&d, 0), tu_buft(&d, 1), loom_cpu_buffer_type()};
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    setenv("LOOM_SCHED_DEBUG", "2", 1);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 512, false, false);
    unsetenv("LOOM_SCHED_DEBUG");
    /* the print goes to stderr as it is (no log prefix, nothing through the log sink) */
    fflush(stderr);
    FILE *cap = tmpfile();
    LOOM_REQUIRE(cap != NULL);
    int saved = dup(2);
    dup2(fileno(cap), 2);
    tu_log_start();
    loom_status st = loom_sched_alloc_graph(s, m.g);
    tu_log_stop();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n_text = ftell(cap);
    rewind(cap);
    char *text = calloc((size_t)n_text + 1, 1);
    LOOM_REQUIRE(text != NULL);
    LOOM_REQUIRE(fread(text, 1, (size_t)n_text, cap) == (size_t)n_text);
    fclose(cap);
    LOOM_REQUIRE(st == LOOM_OK);
    LOOM_CHECK_EQ_INT(tu_log_count("SPLIT"), 0);
    loom_sched_stats stats;
    loom_sched_get_stats(s, &stats);
    int non_view = 0;
    for (int i = 0; i < m.g->n_nodes; i++)
        non_view += !loom_op_is_view(m.g->nodes[i]->op);
    int n_split_lines = 0, n_node_lines = 0;
    for (const char *p = text; (p = strstr(p, "## SPLIT #")) != NULL; p++)
        n_split_lines++;
    for (const char *p = text; (p = strstr(p, "\nnode #")) != NULL; p++)
        n_node_lines++;
    LOOM_CHECK_EQ_INT(n_split_lines, stats.n_splits);
    LOOM_CHECK_EQ_INT(n_node_lines, non_view);
    LOOM_CHECK(strncmp(text, "## SPLIT #0: SIM0 # 3 inputs: [inp_embd (", 41) == 0);
    LOOM_CHECK(strstr(text, "loom ") == NULL); /* no log prefix */
    LOOM_CHECK_STR_CONTAINS(text, "[ SIM0   1.wgt0] use=");
    LOOM_CHECK_STR_CONTAINS(text, "[ SIM1   1.wgt1]");
    LOOM_CHECK_STR_CONTAINS(text, "[  CPU   1.wgt0]");
    LOOM_CHECK_STR_CONTAINS(text, "SIM1#l_out-0#0");
    LOOM_CHECK(strstr(text, "( 0K)") == NULL && strstr(text, "(  0K)") == NULL); /* units */
    /* every node line's use= is the number of its consumers in the graph */
    for (int i = 0; i < m.g->n_nodes; i++) {
        if (loom_op_is_view(m.g->nodes[i]->op)) continue;
        int uses = 0;
        for (int k = 0; k < m.g->n_nodes; k++)
            for (int j = 0; j < LOOM_MAX_SRC; j++)
                uses += m.g->nodes[k]->src[j] == m.g->nodes[i];
        char head[32], want[32];
        snprintf(head, sizeof head, "\nnode #%3d (", i);
        snprintf(want, sizeof want, " use=%d,c=", uses);
        const char *ln = strstr(text, head), *end = ln ? strchr(ln + 1, '\n') : NULL;
        const char *u = ln ? strstr(ln, " use=") : NULL;
        LOOM_CHECK_MSG(ln && u && (!end || u < end) && strncmp(u, want, strlen(want)) == 0,
                       "node %d: want%s", i, want);
    }
    free(text);
    /* the familiar line, from the stats */
    char line[128];
    snprintf(line, sizeof line, "graph nodes = %d / graph splits = %d", stats.n_nodes,
             stats.n_splits);
    LOOM_CHECK_EQ_INT(stats.n_nodes, m.g->n_nodes);
    LOOM_CHECK_EQ_INT(stats.n_splits, 3); /* SIM0, SIM1, CPU */
    LOOM_CHECK(stats.n_inputs >= 3 + 4);  /* x, pos, mask on SIM0; pos, mask, l_out on SIM1; CPU */
    LOOM_CHECK_EQ_INT(stats.n_copies, 1);
    LOOM_CHECK_STR_CONTAINS(line, "graph splits = 3");
    /* the dump API: level 1 prints only split headers */
    lines l = {0};
    loom_sched_dump(s, 1, count_line, &l);
    LOOM_CHECK_EQ_INT(l.n_split, 3);
    LOOM_CHECK_EQ_INT(l.n_node, 0);
    LOOM_CHECK_STR_CONTAINS(l.first, "SIM0");
    lines l2 = {0};
    loom_sched_dump(s, 2, count_line, &l2);
    LOOM_CHECK_EQ_INT(l2.n_node, non_view);
    loom_sched_reset(s);
    lines l3 = {0};
    loom_sched_dump(s, 2, count_line, &l3); /* nothing after a reset */
    LOOM_CHECK_EQ_INT(l3.n_split, 0);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

/* Every host allocation of a whole round may fail; each failure is a status and nothing
 * leaks (ASan/LSan run this too). */
LOOM_TEST(sched_misc, host_out_of_memory_on_every_path) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[3] = {tu_buft(&d, 0), tu_buft(&d, 1), loom_cpu_buffer_type()};
    tu_cfg cfg = k_cfg;
    cfg.T = 4;
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &cfg, bufts));
    int failed = 0, n;
    for (n = 1; n < 2000; n++) {
        LOOM_REQUIRE(tu_model_rebuild(&m, cfg.T));
        tu_fail_after(n);
        loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 512, n % 2 == 0, false);
        loom_status st = s ? loom_sched_alloc_graph(s, m.g) : loom_last_status();
        tu_fail_stop(); /* computing allocates in the backends, not ours to test here */
        if (st == LOOM_OK) {
            tu_set_inputs(&m.in, 1);
            st = loom_sched_graph_compute(s, m.g);
            LOOM_CHECK(st == LOOM_OK);
        }
        int calls = tu_fail_stop();
        loom_sched_free(s);
        if (st == LOOM_OK && calls < n) break;
        if (st != LOOM_OK) {
            LOOM_CHECK_MSG(st == LOOM_ERR_NOMEM || st == LOOM_ERR_DEVICE_OOM,
                           "n=%d: status %d (%s)", n, st, loom_last_error());
            failed++;
        }
    }
    LOOM_CHECK_MSG(n < 2000, "never succeeded");
    LOOM_CHECK(failed > 10);
    tu_model_free(&m);
    tu_devs_close(&d);
}
