/*
 * Pass 5 and the allocation graph: where splits are cut (backend change, never a view; a
 * new weight to stage, keeping a partially offloaded model in a bounded compute buffer; a
 * full input list, and the warning when one node alone overflows it), the copies (names,
 * the caller's graph edited to read them, none where memory is shared), the dependency
 * nodes that keep a source alive until its copy, and each backend's graph_optimize hook
 * running on its split before allocation.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

static const tu_cfg k_cfg = {.n_layer = 4, .d = 64, .n_head = 4, .n_ff = 96, .n_out = 48, .T = 6};

LOOM_TEST(sched_split, cut_on_backend_change_never_on_a_view) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[5] = {tu_buft(&d, 0), tu_buft(&d, 1), tu_buft(&d, 0), tu_buft(&d, 1),
                            tu_buft(&d, 2)};
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(s, m.g) == LOOM_OK);
    /* expected splits: one more than the backend changes between consecutive non-view
     * nodes (no weight is staged and no split has many inputs here) */
    int changes = 0;
    loom_backend_t prev = NULL;
    for (int i = 0; i < m.g->n_nodes; i++) {
        if (loom_op_is_view(m.g->nodes[i]->op)) continue;
        loom_backend_t b = loom_sched_get_tensor_backend(s, m.g->nodes[i]);
        if (prev && b != prev) changes++;
        prev = b;
    }
    LOOM_CHECK_EQ_INT(loom_sched_get_n_splits(s), changes + 1);
    for (int k = 0; k < loom_sched_get_n_splits(s); k++) {
        loom_sched_split_info sp;
        LOOM_REQUIRE(loom_sched_get_split(s, k, &sp) == LOOM_OK);
        LOOM_CHECK(!loom_op_is_view(m.g->nodes[sp.i_start]->op) || sp.i_start == 0);
        for (int i = sp.i_start; i < sp.i_end; i++) {
            loom_tensor *n = m.g->nodes[i];
            if (loom_op_is_view(n->op)) continue;
            LOOM_CHECK_MSG(loom_sched_get_tensor_backend(s, n) == sp.backend,
                           "node %d (%s) in split %d", i, n->name, k);
        }
    }
    loom_sched_split_info bad;
    LOOM_CHECK(loom_sched_get_split(s, 99, &bad) == LOOM_ERR_INVALID_ARG);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}

LOOM_TEST(sched_split, copies_are_named_and_the_graph_reads_them) {
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *w = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 16, 16);
    loom_set_name(w, "w");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, tu_buft(&d, 0));
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    loom_ctx *ctx = tu_ctx(32, true);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 16, 4);
    loom_set_name(x, "x");
    loom_set_input(x);
    loom_tensor *mm = loom_mul_mat(ctx, w, x);
    loom_set_name(mm, "mm");
    loom_tensor *out = loom_scale(ctx, mm, 2.0f);
    loom_set_name(out, "out");
    loom_graph *g = tu_graph(ctx, out);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 64, false, false);
    LOOM_REQUIRE(s != NULL);
    /* pin the last node to the CPU: mm must be copied back */
    LOOM_REQUIRE(loom_sched_set_tensor_backend(s, out, d.cpu) == LOOM_OK);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(mm->src[1]->name, "SIM0#x#0");
    LOOM_CHECK(mm->src[1] != x);
    LOOM_CHECK(loom_sched_get_tensor_backend(s, mm->src[1]) == d.backends[0]);
    LOOM_CHECK_STR_CONTAINS(loom_sched_get_tensor_cause(s, mm->src[1]), "4.cpy");
    LOOM_CHECK_STR_CONTAINS(out->src[0]->name, "CPU#mm#0");
    LOOM_CHECK(out->src[1] == NULL || out->src[1] != mm);
    LOOM_CHECK(mm->src[0] == w); /* the weight lives where the op runs: no copy */
    LOOM_CHECK(mm->src[1]->buffer != NULL &&
               loom_buffer_buft(mm->src[1]->buffer) == tu_buft(&d, 0));
    loom_sched_split_info sp0, sp1;
    LOOM_REQUIRE(loom_sched_get_split(s, 0, &sp0) == LOOM_OK);
    LOOM_REQUIRE(loom_sched_get_split(s, 1, &sp1) == LOOM_OK);
    LOOM_CHECK(sp0.backend == d.backends[0] && sp0.n_inputs == 1 && sp0.inputs[0] == x);
    LOOM_CHECK(sp1.backend == d.cpu && sp1.n_inputs == 1 && sp1.inputs[0] == mm);
    loom_sched_stats st;
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_splits, 2);
    LOOM_CHECK_EQ_INT(st.n_inputs, 2);
    LOOM_CHECK_EQ_INT(st.n_nodes, g->n_nodes);
    LOOM_CHECK_EQ_INT(st.n_alloc_nodes, g->n_nodes + 2 * 2); /* a dependency + a copy each */
    /* and it computes: out = 2 * w x */
    tu_fill(w, 3, 0.5f);
    tu_fill(x, 4, 1.0f);
    float *wv = tu_read(w), *xv = tu_read(x); /* x's bytes are reused once it is copied */
    LOOM_REQUIRE(loom_sched_graph_compute(s, g) == LOOM_OK);
    float *ov = tu_read(out);
    double worst = 0;
    for (int n = 0; n < 4; n++) {
        for (int r = 0; r < 16; r++) {
            double acc = 0;
            for (int k = 0; k < 16; k++)
                acc += (double)wv[r * 16 + k] * xv[n * 16 + k];
            double e = fabs(2 * acc - ov[n * 16 + r]);
            if (e > worst) worst = e;
        }
    }
    LOOM_CHECK_MSG(worst < 1e-4, "max error %g", worst);
    free(wv);
    free(xv);
    free(ov);
    loom_sched_free(s);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

/* A partially offloaded model: every layer's weight lives in host memory and is pulled to
 * the device (op offload). Each layer becomes its own split, and the device's compute
 * buffer holds one staged weight at a time, not all of them. */
LOOM_TEST(sched_split, new_weight_to_stage_cuts_and_bounds_memory) {
    enum { L = 6, D = 128, T = 4 };
    tu_devs d;
    const char *spec[] = {"sim:1,offload=1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_ctx *wctx = tu_ctx(L + 2, true);
    loom_tensor *w[L];
    for (int l = 0; l < L; l++) {
        w[l] = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, D, D);
        loom_format_name(w[l], "blk.%d.w", l);
    }
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, loom_cpu_buffer_type());
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    for (int l = 0; l < L; l++)
        tu_fill(w[l], 2, 1.0f / sqrtf(D));

    loom_ctx *ctx = tu_ctx(64, true);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, D, T);
    loom_set_name(x, "x");
    loom_set_input(x);
    loom_tensor *cur = x;
    for (int l = 0; l < L; l++)
        cur = loom_relu(ctx, loom_mul_mat(ctx, w[l], cur));
    loom_set_output(cur);
    loom_graph *g = tu_graph(ctx, cur);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 256, false, true);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_sched_get_n_splits(s), L);
    for (int k = 0; k < loom_sched_get_n_splits(s); k++) {
        loom_sched_split_info sp;
        LOOM_REQUIRE(loom_sched_get_split(s, k, &sp) == LOOM_OK);
        LOOM_CHECK(sp.backend == d.backends[0]);
        bool stages_weight = false;
        for (int j = 0; j < sp.n_inputs; j++)
            stages_weight |= sp.inputs[j] == w[k];
        LOOM_CHECK_MSG(stages_weight, "split %d does not stage blk.%d.w", k, k);
    }
    size_t wsize = loom_nbytes(w[0]);
    size_t dev = loom_sched_get_buffer_size(s, d.backends[0]);
    LOOM_CHECK_MSG(dev < 2 * wsize, "device compute buffer %zu for weights of %zu each", dev,
                   wsize);
    LOOM_CHECK(dev >= wsize);

    tu_fill(x, 5, 1.0f);
    LOOM_REQUIRE(loom_sched_graph_compute(s, g) == LOOM_OK);
    /* reference: the same chain on the host */
    loom_ctx *hctx =
        tu_ctx(64 + (size_t)(L + 1) * 2 * D * T * sizeof(float) / loom_tensor_overhead(), false);
    loom_tensor *hx = loom_new_tensor_2d(hctx, LOOM_TYPE_F32, D, T);
    float *xv = tu_read(x);
    memcpy(hx->data, xv, loom_nbytes(hx));
    free(xv);
    loom_tensor *hc = hx;
    for (int l = 0; l < L; l++)
        hc = loom_relu(hctx, loom_mul_mat(hctx, w[l], hc));
    LOOM_REQUIRE(loom_cpu_graph_compute(tu_graph(hctx, hc), NULL) == LOOM_OK);
    double err = tu_max_rel_err(cur, hc);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g", err);
    loom_ctx_free(hctx);
    loom_sched_free(s);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

/* 40 CPU inputs added one by one on the device: the split is cut before its input list
 * passes the cap; a single node bringing more than the cap grows the list, with a warning. */
LOOM_TEST(sched_split, full_input_list_cuts_and_single_node_grows_with_warning) {
    enum { N = 40 };
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *w = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 8, 8);
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, tu_buft(&d, 0));
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    int caps[3] = {0, 8, 7};
    for (int c = 0; c < 3; c++) {
        loom_ctx *ctx = tu_ctx(4 * N, true);
        loom_tensor *acc = NULL;
        for (int i = 0; i < N; i++) {
            loom_tensor *xi = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 8, 2);
            loom_format_name(xi, "x%d", i);
            loom_set_input(xi);
            acc = acc ? loom_add(ctx, acc, xi) : loom_mul_mat(ctx, w, xi);
        }
        loom_graph *g = tu_graph(ctx, acc);
        loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 256, false, false);
        int cap = caps[c] ? caps[c] : LOOM_SCHED_MAX_SPLIT_INPUTS;
        if (caps[c]) loom_sched_set_max_split_inputs(s, caps[c]);
        LOOM_REQUIRE(loom_sched_split_graph(s, g) == LOOM_OK);
        int n_splits = loom_sched_get_n_splits(s), total = 0;
        LOOM_CHECK_EQ_INT(n_splits, (N + cap - 1) / cap);
        for (int k = 0; k < n_splits; k++) {
            loom_sched_split_info sp;
            loom_sched_get_split(s, k, &sp);
            LOOM_CHECK(sp.backend == d.backends[0]);
            LOOM_CHECK(sp.n_inputs <= cap);
            total += sp.n_inputs;
        }
        LOOM_CHECK_EQ_INT(total, N);
        loom_sched_free(s);
        loom_ctx_free(ctx);
    }
    /* cap 1, one node with two foreign inputs: the list grows and a warning says so */
    loom_ctx *ctx = tu_ctx(16, true);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_tensor *b = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_set_input(a);
    loom_set_input(b);
    loom_tensor *sum = loom_add(ctx, a, b);
    loom_graph *g = tu_graph(ctx, sum);
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 256, false, false);
    loom_sched_set_max_split_inputs(s, 1);
    LOOM_REQUIRE(loom_sched_set_tensor_backend(s, sum, d.backends[0]) == LOOM_OK);
    tu_log_start();
    loom_status st = loom_sched_split_graph(s, g);
    tu_log_stop();
    LOOM_REQUIRE(st == LOOM_OK);
    loom_sched_split_info sp;
    loom_sched_get_split(s, 0, &sp);
    LOOM_CHECK_EQ_INT(sp.n_inputs, 2);
    LOOM_CHECK_EQ_INT(tu_log_count("more than 1 inputs; growing"), 1);
    loom_sched_free(s);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

/* a is last used on the device early, then the device keeps producing same-size tensors,
 * and only much later a CPU node reads a. Without the dependency node, a's bytes would be
 * reused before the CPU split copies it. */
LOOM_TEST(sched_split, dependency_keeps_a_source_alive_until_its_copy) {
    enum { D = 64, N = 8 };
    tu_devs d;
    const char *spec[] = {"sim:1"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *w = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, D, D);
    loom_set_name(w, "w");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, tu_buft(&d, 0));
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    tu_fill(w, 8, 0.1f);

    loom_ctx *ctx = tu_ctx(64, true);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, D);
    loom_set_name(x, "x");
    loom_set_input(x);
    loom_tensor *a = loom_mul_mat(ctx, w, x);
    loom_set_name(a, "a");
    loom_tensor *cur = loom_sqr(ctx, a); /* a's last device consumer */
    for (int i = 0; i < N; i++)
        cur = loom_mul_mat(ctx, w, loom_scale(ctx, cur, 0.5f));
    loom_tensor *late = loom_scale(ctx, a, 3.0f); /* on the CPU, reads a */
    loom_set_name(late, "late");
    loom_tensor *out = loom_add(ctx, late, cur);
    loom_set_output(out);
    loom_graph *g = loom_graph_new(ctx, 256);
    LOOM_REQUIRE(loom_graph_build_forward(g, cur) == LOOM_OK);
    LOOM_REQUIRE(loom_graph_build_forward(g, out) == LOOM_OK); /* late comes after the chain */
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_set_tensor_backend(s, late, d.cpu) == LOOM_OK);
    LOOM_REQUIRE(loom_sched_set_tensor_backend(s, out, d.cpu) == LOOM_OK);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
    /* no device tensor computed after a may share a's bytes */
    int ia = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i] == a) ia = i;
    }
    LOOM_REQUIRE(ia >= 0);
    const char *pa = a->data;
    for (int i = ia + 1; i < g->n_nodes; i++) {
        loom_tensor *t = g->nodes[i];
        if (t->view_src || t->buffer != a->buffer) continue;
        const char *pt = t->data;
        bool disjoint = pt + loom_nbytes(t) <= pa || pa + loom_nbytes(a) <= pt;
        LOOM_CHECK_MSG(disjoint, "node %d (%s) reuses a's bytes before its copy", i, t->name);
    }
    tu_fill(x, 6, 1.0f);
    float *wv = tu_read(w), *xv = tu_read(x);
    LOOM_REQUIRE(loom_sched_graph_compute(s, g) == LOOM_OK);
    /* late == 3 * (w x), computed here */
    float *lv = tu_read(late);
    double worst = 0;
    for (int r = 0; r < D; r++) {
        double acc = 0;
        for (int k = 0; k < D; k++)
            acc += (double)wv[r * D + k] * xv[k];
        double e = fabs(3 * acc - lv[r]);
        if (e > worst) worst = e;
    }
    LOOM_CHECK_MSG(worst < 1e-4, "late differs by %g", worst);
    free(wv);
    free(xv);
    free(lv);
    loom_sched_free(s);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    tu_devs_close(&d);
}

/* ---------------------------------------------------------------- graph_optimize */

/* A spy accelerator on host memory that refuses SQR and records its graph_optimize calls. */
typedef struct spy {
    struct loom_dev dev;
    struct loom_backend be;
    int n_calls;
    int n_nodes_seen;
    int n_allocated_seen; /* nodes that already had memory when the hook ran */
    loom_tensor *first_seen[8];
} spy;

static const char *spy_name(loom_dev_t dev) {
    (void)dev;
    return "SPY";
}
static void spy_memory(loom_dev_t dev, size_t *free_b, size_t *total) {
    (void)dev;
    *free_b = *total = (size_t)1 << 30;
}
static loom_dev_type spy_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_ACCEL;
}
static void spy_props(loom_dev_t dev, loom_dev_props *p) {
    memset(p, 0, sizeof(*p));
    p->name = spy_name(dev);
    p->type = LOOM_DEV_TYPE_ACCEL;
}
static loom_backend_t spy_init(loom_dev_t dev, const char *params) {
    (void)params;
    return &((spy *)dev->context)->be;
}
static loom_buft_t spy_buft(loom_dev_t dev) {
    (void)dev;
    return loom_cpu_buffer_type();
}
static bool spy_supports_op(loom_dev_t dev, const loom_tensor *op) {
    (void)dev;
    return op->op != LOOM_OP_SQR && loom_cpu_supports_op(op);
}
static bool spy_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    (void)dev;
    return loom_buft_is_host(buft);
}
static const struct loom_dev_i spy_dev_i = {
    .get_name = spy_name,
    .get_memory = spy_memory,
    .get_type = spy_type,
    .get_props = spy_props,
    .init_backend = spy_init,
    .get_buffer_type = spy_buft,
    .supports_op = spy_supports_op,
    .supports_buft = spy_supports_buft,
};

static void spy_free(loom_backend_t be) {
    (void)be;
}
static loom_status spy_compute(loom_backend_t be, loom_graph *g) {
    (void)be;
    return loom_cpu_graph_compute(g, NULL);
}
static void spy_optimize(loom_backend_t be, loom_graph *g) {
    spy *sp = be->context;
    if (sp->n_calls < 8) sp->first_seen[sp->n_calls] = g->n_nodes ? g->nodes[0] : NULL;
    sp->n_calls++;
    sp->n_nodes_seen += g->n_nodes;
    for (int i = 0; i < g->n_nodes; i++)
        sp->n_allocated_seen += g->nodes[i]->data != NULL;
}
static const struct loom_backend_i spy_be_i = {
    .free = spy_free,
    .graph_compute = spy_compute,
    .graph_optimize = spy_optimize,
};

LOOM_TEST(sched_split, graph_optimize_runs_on_each_split_before_allocation) {
    spy sp;
    memset(&sp, 0, sizeof(sp));
    sp.dev = (struct loom_dev){&spy_dev_i, NULL, &sp};
    sp.be = (struct loom_backend){&spy_be_i, &sp.dev, &sp};
    loom_backend_t cpu = loom_cpu_backend_new(1);
    loom_backend_t backends[2] = {&sp.be, cpu};

    loom_ctx *wctx = tu_ctx(4, true);
    loom_tensor *w = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 16, 16);
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, loom_cpu_buffer_type());
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    tu_fill(w, 1, 0.2f);
    loom_ctx *ctx = tu_ctx(32, true);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 16, 2);
    loom_set_input(x);
    loom_tensor *a = loom_mul_mat(ctx, w, x); /* SPY */
    loom_tensor *b = loom_sqr(ctx, a);        /* refused: CPU */
    loom_tensor *c = loom_mul_mat(ctx, w, b); /* SPY */
    loom_graph *g = tu_graph(ctx, c);
    loom_sched *s = loom_sched_new(backends, NULL, 2, 64, false, false);
    LOOM_REQUIRE(s != NULL);
    LOOM_REQUIRE(loom_sched_alloc_graph(s, g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_sched_get_n_splits(s), 3);
    LOOM_CHECK_EQ_INT(sp.n_calls, 2); /* the two SPY splits, not the CPU one */
    LOOM_CHECK(sp.first_seen[0] == a);
    LOOM_CHECK(sp.first_seen[1] == c);
    LOOM_CHECK_EQ_INT(sp.n_nodes_seen, 2);
    LOOM_CHECK_EQ_INT(sp.n_allocated_seen, 0); /* before allocation */
    LOOM_CHECK(c->data != NULL);               /* allocated afterwards */
    loom_sched_stats st;
    loom_sched_get_stats(s, &st);
    LOOM_CHECK_EQ_INT(st.n_inputs, 0); /* same memory: no copies */
    tu_fill(x, 2, 1.0f);
    LOOM_REQUIRE(loom_sched_graph_compute(s, g) == LOOM_OK);
    loom_sched_free(s);
    loom_ctx_free(ctx);
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    loom_backend_free(cpu);
}

/* Splitting the graph of the current round again (without a reset) restores its sources
 * first: the result is the same as after one split. */
LOOM_TEST(sched_split, splitting_the_same_graph_again_restores_it_first) {
    tu_devs d;
    const char *spec[] = {"sim:2"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    loom_buft_t bufts[5] = {tu_buft(&d, 0), tu_buft(&d, 1), tu_buft(&d, 0), tu_buft(&d, 1),
                            tu_buft(&d, 2)};
    tu_model m;
    LOOM_REQUIRE(tu_model_new(&m, &k_cfg, bufts));
    loom_sched *s = loom_sched_new(d.backends, NULL, d.n, 1024, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(s, m.g) == LOOM_OK);
    loom_sched_stats first;
    loom_sched_get_stats(s, &first);
    LOOM_REQUIRE(loom_sched_split_graph(s, m.g) == LOOM_OK);
    loom_sched_stats second;
    loom_sched_get_stats(s, &second);
    LOOM_CHECK_EQ_INT(second.n_splits, first.n_splits);
    LOOM_CHECK_EQ_INT(second.n_inputs, first.n_inputs);
    for (int i = 0; i < m.g->n_nodes; i++) {
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            const loom_tensor *src = m.g->nodes[i]->src[j];
            /* a copy of a copy would be named "SIM1#SIM0#..." */
            if (src) LOOM_CHECK(strstr(src->name, "#SIM") == NULL);
        }
    }
    LOOM_REQUIRE(loom_sched_alloc_graph(s, m.g) == LOOM_OK);
    tu_set_inputs(&m.in, 12);
    LOOM_REQUIRE(loom_sched_graph_compute(s, m.g) == LOOM_OK);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 12));
    double err = tu_max_rel_err(m.out, ref.out);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "error %g", err);
    tu_ref_free(&ref);
    loom_sched_free(s);
    tu_model_free(&m);
    tu_devs_close(&d);
}
