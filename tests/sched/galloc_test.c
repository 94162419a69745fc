/*
 * The graph allocator: the free-list arena on its own (best fit, merging, alignment,
 * chunks, checked against an independent overlap model), then whole graphs: a transformer
 * needs far less than the sum of its tensors and computes the same result as a reference
 * where every tensor has its own memory; no two tensors that are live together share
 * bytes (checked by recomputing liveness here); in-place reuse; chunks under a max size;
 * reserve versus alloc; realloc detection; device and host out-of-memory.
 */
#include <stdlib.h>
#include <string.h>

#include "sched/dynalloc.h"
#include "sched/galloc-impl.h"
#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

/* ---------------------------------------------------------------- the arena */

LOOM_TEST(dynalloc, best_fit_merge_and_alignment) {
    loom__dyn_alloc a;
    loom__dyn_alloc_init(&a, 64, SIZE_MAX);
    loom__dyn_addr p[6];
    size_t sizes[6] = {100, 300, 100, 200, 100, 50};
    for (int i = 0; i < 6; i++) {
        LOOM_REQUIRE(loom__dyn_alloc_alloc(&a, sizes[i], &p[i]) == LOOM_OK);
        LOOM_CHECK_EQ_INT(p[i].offset % 64, 0);
        LOOM_CHECK_EQ_INT(p[i].chunk, 0);
    }
    /* layout by the definition of the arena: 128, 320, 128, 256, 128, 64 bytes, packed */
    LOOM_CHECK_EQ_INT(p[1].offset, 128);
    LOOM_CHECK_EQ_INT(p[3].offset, 128 + 320 + 128);
    LOOM_CHECK_EQ_INT(a.chunks[0].max_size, 128 + 320 + 128 + 256 + 128 + 64);
    /* free two interior holes (320 and 256 bytes): 200 bytes must take the 256 one */
    LOOM_CHECK(loom__dyn_alloc_free(&a, p[1], sizes[1]) == LOOM_OK);
    LOOM_CHECK(loom__dyn_alloc_free(&a, p[3], sizes[3]) == LOOM_OK);
    loom__dyn_addr q;
    LOOM_REQUIRE(loom__dyn_alloc_alloc(&a, 200, &q) == LOOM_OK);
    LOOM_CHECK_EQ_INT(q.offset, p[3].offset);
    /* free neighbours of the 320 hole: they merge into one block of 128 + 320 + 128 */
    LOOM_CHECK(loom__dyn_alloc_free(&a, p[0], sizes[0]) == LOOM_OK);
    LOOM_CHECK(loom__dyn_alloc_free(&a, p[2], sizes[2]) == LOOM_OK);
    loom__dyn_addr r;
    LOOM_REQUIRE(loom__dyn_alloc_alloc(&a, 576, &r) == LOOM_OK);
    LOOM_CHECK_EQ_INT(r.offset, 0);
    size_t hw = a.chunks[0].max_size;
    LOOM_CHECK_EQ_INT(hw, 128 + 320 + 128 + 256 + 128 + 64); /* nothing grew */
    loom__dyn_alloc_release(&a);
}

/* Random allocate/free against a model of live ranges: nothing overlaps, everything is
 * aligned and inside its chunk's high-water mark, and no chunk passes the max size unless a
 * single allocation is larger. */
LOOM_TEST(dynalloc, random_sequences_never_overlap) {
    enum { N = 400 };
    const size_t max_chunk = 1 << 16;
    loom__dyn_alloc a;
    loom__dyn_alloc_init(&a, 32, max_chunk);
    loom__dyn_addr addr[N];
    size_t size[N];
    bool live[N] = {0};
    for (int step = 0; step < 4000; step++) {
        int i = (int)(loom_test_rand() % N);
        if (live[i]) {
            LOOM_REQUIRE(loom__dyn_alloc_free(&a, addr[i], size[i]) == LOOM_OK);
            live[i] = false;
            continue;
        }
        size[i] = 1 + loom_test_rand() % 3000;
        loom_status st = loom__dyn_alloc_alloc(&a, size[i], &addr[i]);
        if (st == LOOM_ERR_FULL) continue;
        LOOM_REQUIRE(st == LOOM_OK);
        live[i] = true;
        LOOM_CHECK_EQ_INT(addr[i].offset % 32, 0);
        size_t end = addr[i].offset + ((size[i] + 31) & ~(size_t)31);
        LOOM_CHECK(end <= a.chunks[addr[i].chunk].max_size);
        if (addr[i].chunk < LOOM_GALLOC_MAX_CHUNKS - 1) LOOM_CHECK(end <= max_chunk);
        for (int j = 0; j < N; j++) {
            if (j == i || !live[j] || addr[j].chunk != addr[i].chunk) continue;
            size_t jend = addr[j].offset + ((size[j] + 31) & ~(size_t)31);
            bool disjoint = end <= addr[j].offset || jend <= addr[i].offset;
            if (!disjoint) {
                (void)LOOM_CHECK_MSG(false, "step %d: [%zu,%zu) overlaps [%zu,%zu)", step,
                                     addr[i].offset, end, addr[j].offset, jend);
                loom__dyn_alloc_release(&a);
                return;
            }
        }
    }
    LOOM_CHECK(a.n_chunks > 1);
    /* one allocation larger than a chunk gets a chunk of its own size */
    loom__dyn_addr big;
    LOOM_REQUIRE(loom__dyn_alloc_alloc(&a, 3 * max_chunk, &big) == LOOM_OK);
    LOOM_CHECK_EQ_INT(big.offset, 0);
    LOOM_CHECK_EQ_INT(a.chunks[big.chunk].max_size, 3 * max_chunk);
    loom__dyn_alloc_release(&a);
}

/* ---------------------------------------------------------------- whole graphs */

static const tu_cfg k_cfg = {.n_layer = 3, .d = 64, .n_head = 4, .n_ff = 128, .n_out = 32, .T = 8};

typedef struct model_case {
    tu_weights w;
    loom_ctx *ctx;
    loom_graph *g;
    tu_inputs in;
    loom_tensor *out;
} model_case;

static bool model_case_new(model_case *m, const tu_cfg *cfg, loom_buft_t wbuft) {
    memset(m, 0, sizeof(*m));
    loom_buft_t bufts[TU_MAX_LAYERS + 1];
    for (int i = 0; i <= cfg->n_layer; i++)
        bufts[i] = wbuft;
    if (!tu_weights_new(&m->w, cfg, bufts)) return false;
    m->ctx = tu_ctx(64 + 40 * (size_t)cfg->n_layer, true);
    m->out = m->ctx ? tu_build(m->ctx, &m->w, &m->in) : NULL;
    if (m->out) loom_set_output(m->out);
    m->g = tu_graph(m->ctx, m->out);
    return m->g != NULL;
}

static void model_case_free(model_case *m) {
    loom_ctx_free(m->ctx);
    tu_weights_free(&m->w);
}

/* Bytes of every tensor the graph computes (views excluded). */
static size_t sum_of_tensors(const loom_graph *g) {
    size_t sum = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!g->nodes[i]->view_src) sum += loom_nbytes(g->nodes[i]);
    }
    return sum;
}

static int index_in(const loom_graph *g, const loom_tensor *t) {
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i] == t) return i;
    }
    return -1;
}

/* Independent liveness: a tensor is live from the node that produces it (-1 for inputs
 * placed up front) to its last consumer, a consumer of a view counting for the viewed
 * tensor; outputs live to the end. Two live-together tensors in the same buffer must not
 * share bytes, except a node written in place over the parent it consumes last. */
static int count_overlaps(const loom_graph *g) {
    int n = g->n_nodes;
    int *first = malloc((size_t)n * sizeof(int)), *last = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        first[i] = i;
        last[i] = (g->nodes[i]->flags & LOOM_TENSOR_FLAG_OUTPUT) ? n : i;
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            const loom_tensor *s = g->nodes[i]->src[j];
            if (!s) continue;
            const loom_tensor *root = s->view_src ? s->view_src : s;
            int k = index_in(g, root);
            if (k >= 0 && last[k] < i) last[k] = i;
        }
    }
    int bad = 0;
    for (int a = 0; a < n; a++) {
        const loom_tensor *ta = g->nodes[a];
        if (ta->view_src || !ta->buffer) continue;
        for (int b = a + 1; b < n; b++) {
            const loom_tensor *tb = g->nodes[b];
            if (tb->view_src || tb->buffer != ta->buffer) continue;
            bool live_together = first[b] <= last[a];
            if (!live_together) continue;
            const char *pa = ta->data, *pb = tb->data;
            bool disjoint = pa + loom_nbytes(ta) <= pb || pb + loom_nbytes(tb) <= pa;
            bool inplace = first[b] == last[a] && pa == pb && loom_are_same_layout(ta, tb);
            if (!disjoint && !inplace) bad++;
        }
    }
    free(first);
    free(last);
    return bad;
}

LOOM_TEST(gallocr, transformer_peak_well_below_sum_and_same_result) {
    model_case m;
    LOOM_REQUIRE(model_case_new(&m, &k_cfg, loom_cpu_buffer_type()));
    loom_gallocr *ga = loom_gallocr_new(loom_cpu_buffer_type());
    LOOM_REQUIRE(ga != NULL);
    LOOM_REQUIRE(loom_gallocr_reserve(ga, m.g) == LOOM_OK);
    size_t peak = loom_gallocr_get_buffer_size(ga, 0);
    size_t sum = sum_of_tensors(m.g);
    LOOM_CHECK_MSG(peak * 3 < sum, "peak %zu is not well below the sum %zu", peak, sum);
    LOOM_CHECK(peak > 0);

    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, m.g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(count_overlaps(m.g), 0);
    tu_set_inputs(&m.in, 11);
    loom_backend_t cpu = loom_cpu_backend_new(2);
    LOOM_REQUIRE(loom_backend_graph_compute(cpu, m.g) == LOOM_OK);

    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 11));
    double err = tu_max_rel_err(m.out, ref.out);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "max relative error %g", err);
    tu_ref_free(&ref);
    loom_backend_free(cpu);
    loom_gallocr_free(ga);
    model_case_free(&m);
}

LOOM_TEST(gallocr, inplace_reuses_dying_parent_only) {
    loom_ctx *ctx = tu_ctx(64, true);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 4);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 32);
    loom_set_name(x, "x");
    loom_set_name(w, "w");
    loom_set_input(x);
    loom_set_input(w);
    loom_tensor *a = loom_mul_mat(ctx, w, x);  /* new memory */
    loom_tensor *b = loom_sqr(ctx, a);         /* a dies here: in place */
    loom_tensor *c = loom_scale(ctx, b, 0.5f); /* b dies here: in place */
    loom_tensor *d = loom_add(ctx, c, a);      /* a is gone... */
    (void)d;
    loom_graph *g = tu_graph(ctx, d);
    /* a is consumed by b and d: not reused by b; b is reused by c */
    loom_gallocr *ga = loom_gallocr_new(loom_cpu_buffer_type());
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, g) == LOOM_OK);
    LOOM_CHECK(b->data != a->data);
    LOOM_CHECK(c->data == b->data);
    LOOM_CHECK(d->data == c->data || d->data == a->data);
    LOOM_CHECK_EQ_INT(count_overlaps(g), 0);
    loom_gallocr_free(ga);

    /* an OUTPUT parent is never overwritten */
    loom_ctx *ctx2 = tu_ctx(64, true);
    loom_tensor *y = loom_new_tensor_1d(ctx2, LOOM_TYPE_F32, 256);
    loom_set_input(y);
    loom_tensor *s1 = loom_sqr(ctx2, y);
    loom_set_output(s1);
    loom_tensor *s2 = loom_sqrt(ctx2, s1);
    loom_graph *g2 = tu_graph(ctx2, s2);
    ga = loom_gallocr_new(loom_cpu_buffer_type());
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, g2) == LOOM_OK);
    LOOM_CHECK(s2->data != s1->data);
    LOOM_CHECK(s1->data == y->data); /* the input dies into s1 */
    loom_gallocr_free(ga);
    loom_ctx_free(ctx2);
    loom_ctx_free(ctx);
}

LOOM_TEST(gallocr, chunks_under_max_size_and_alignment) {
    const size_t max = 12 * 1024, align = 256;
    loom_buft_t small = tu_small_buft(max, align);
    LOOM_REQUIRE(small != NULL);
    model_case m;
    LOOM_REQUIRE(model_case_new(&m, &k_cfg, loom_cpu_buffer_type()));
    loom_gallocr *ga = loom_gallocr_new(small);
    LOOM_REQUIRE(loom_gallocr_reserve(ga, m.g) == LOOM_OK);
    int n_chunks = loom_gallocr_get_n_chunks(ga, 0);
    LOOM_CHECK_MSG(n_chunks > 1, "%d chunks", n_chunks);
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, m.g) == LOOM_OK);
    for (int i = 0; i < m.g->n_nodes; i++) {
        loom_tensor *t = m.g->nodes[i];
        if (t->view_src) continue;
        size_t off = (size_t)((char *)t->data - (char *)loom_buffer_base(t->buffer));
        LOOM_CHECK_EQ_INT(off % align, 0);
        LOOM_CHECK(loom_buffer_size(t->buffer) <= max || loom_nbytes(t) > max);
    }
    LOOM_CHECK_EQ_INT(count_overlaps(m.g), 0);
    tu_set_inputs(&m.in, 5);
    loom_backend_t cpu = loom_cpu_backend_new(1);
    LOOM_REQUIRE(loom_backend_graph_compute(cpu, m.g) == LOOM_OK);
    tu_ref ref;
    LOOM_REQUIRE(tu_ref_compute(&ref, &k_cfg, 5));
    double err = tu_max_rel_err(m.out, ref.out);
    LOOM_CHECK_MSG(err >= 0 && err < 1e-5, "max relative error %g", err);
    tu_ref_free(&ref);
    loom_backend_free(cpu);
    loom_gallocr_free(ga);
    model_case_free(&m);
}

LOOM_TEST(gallocr, reserve_once_then_alloc_without_growth) {
    tu_cfg big = k_cfg, small = k_cfg;
    big.T = 32;
    small.T = 32;
    model_case mb, ms;
    LOOM_REQUIRE(model_case_new(&mb, &big, loom_cpu_buffer_type()));
    loom_gallocr *ga = loom_gallocr_new(loom_cpu_buffer_type());
    LOOM_REQUIRE(loom_gallocr_reserve(ga, mb.g) == LOOM_OK);
    size_t size = loom_gallocr_get_buffer_size(ga, 0);
    int reserves = loom__gallocr_n_reserves(ga);
    /* the same shape again: no new plan, offsets stamped */
    LOOM_REQUIRE(model_case_new(&ms, &small, loom_cpu_buffer_type()));
    LOOM_CHECK(!loom_gallocr_needs_realloc(ga, ms.g));
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, ms.g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom__gallocr_n_reserves(ga), reserves);
    LOOM_CHECK_EQ_INT(loom_gallocr_get_buffer_size(ga, 0), size);
    LOOM_CHECK(ms.out->data != NULL);
    model_case_free(&ms);
    /* a larger batch outgrows the plan: a single-buffer allocator re-plans by itself */
    tu_cfg larger = k_cfg;
    larger.T = 64;
    model_case ml;
    LOOM_REQUIRE(model_case_new(&ml, &larger, loom_cpu_buffer_type()));
    LOOM_CHECK_EQ_INT(loom__gallocr_check(ga, ml.g, NULL, NULL), LOOM__GALLOC_SIZE);
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, ml.g) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom__gallocr_n_reserves(ga), reserves + 1);
    LOOM_CHECK(loom_gallocr_get_buffer_size(ga, 0) > size);
    model_case_free(&ml);
    model_case_free(&mb);
    loom_gallocr_free(ga);
}

/* Same node count and sizes, other wiring: the plan's liveness would be wrong. */
LOOM_TEST(gallocr, topology_change_needs_a_new_plan) {
    loom_tensor *t[2][6];
    loom_ctx *ctx[2];
    loom_graph *g[2];
    for (int v = 0; v < 2; v++) {
        ctx[v] = tu_ctx(64, true);
        loom_tensor *x = loom_new_tensor_1d(ctx[v], LOOM_TYPE_F32, 1024);
        loom_set_input(x);
        t[v][0] = loom_sqr(ctx[v], x);
        t[v][1] = loom_sqrt(ctx[v], t[v][0]);
        t[v][2] = loom_sqr(ctx[v], t[v][1]);
        /* v = 0: the last add reads t1 (kept alive); v = 1: it reads t2 */
        t[v][3] = loom_add(ctx[v], t[v][2], v == 0 ? t[v][1] : t[v][2]);
        g[v] = tu_graph(ctx[v], t[v][3]);
    }
    LOOM_REQUIRE(g[0]->n_nodes == g[1]->n_nodes && g[0]->n_leafs == g[1]->n_leafs);
    loom_gallocr *ga = loom_gallocr_new(loom_cpu_buffer_type());
    LOOM_REQUIRE(loom_gallocr_reserve(ga, g[1]) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom__gallocr_check(ga, g[0], NULL, NULL), LOOM__GALLOC_TOPOLOGY);
    LOOM_REQUIRE(loom_gallocr_alloc_graph(ga, g[0]) == LOOM_OK);
    LOOM_CHECK_EQ_INT(count_overlaps(g[0]), 0);
    loom_gallocr_free(ga);
    loom_ctx_free(ctx[0]);
    loom_ctx_free(ctx[1]);
}

LOOM_TEST(gallocr, multi_buffer_mismatch_is_an_error_and_ids_change_is_seen) {
    loom_buft_t bufts[2] = {loom_cpu_buffer_type(), tu_small_buft(1 << 30, 128)};
    loom_gallocr *ga = loom_gallocr_new_n(bufts, 2);
    LOOM_REQUIRE(ga != NULL);
    loom_ctx *ctx = tu_ctx(16, true);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 64);
    loom_set_input(x);
    loom_tensor *y = loom_sqr(ctx, x);
    loom_tensor *z = loom_sqrt(ctx, loom_scale(ctx, y, 2.0f));
    loom_graph *g = tu_graph(ctx, z);
    int ids0[8] = {0}, ids1[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    LOOM_CHECK(loom_gallocr_alloc_graph(ga, g) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "reserve_n");
    LOOM_REQUIRE(loom_gallocr_reserve_n(ga, g, ids0, NULL) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom__gallocr_check(ga, g, ids0, NULL), LOOM__GALLOC_FITS);
    LOOM_CHECK_EQ_INT(loom__gallocr_check(ga, g, ids1, NULL), LOOM__GALLOC_IDS);
    int bad[8] = {0, 7};
    LOOM_CHECK(loom_gallocr_reserve_n(ga, g, bad, NULL) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "buffer id 7");
    /* identical buffer types share one buffer; the later id reports 0 */
    loom_buft_t same[2] = {loom_cpu_buffer_type(), loom_cpu_buffer_type()};
    loom_gallocr *gs = loom_gallocr_new_n(same, 2);
    LOOM_REQUIRE(loom_gallocr_reserve_n(gs, g, ids1, NULL) == LOOM_OK);
    LOOM_CHECK(loom_gallocr_get_buffer_size(gs, 0) > 0);
    LOOM_CHECK_EQ_INT(loom_gallocr_get_buffer_size(gs, 1), 0);
    size_t sizes[2] = {7, 7};
    LOOM_REQUIRE(loom_gallocr_reserve_n_size(gs, g, ids1, NULL, sizes) == LOOM_OK);
    LOOM_CHECK(sizes[0] > 0);
    LOOM_CHECK_EQ_INT(sizes[1], 0);
    loom_gallocr_free(gs);
    loom_gallocr_free(ga);
    loom_ctx_free(ctx);
}

LOOM_TEST(gallocr, device_out_of_memory_is_a_status) {
    tu_devs d;
    const char *spec[] = {"sim:1,mem=4KiB"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    model_case m;
    LOOM_REQUIRE(model_case_new(&m, &k_cfg, loom_cpu_buffer_type()));
    loom_gallocr *ga = loom_gallocr_new(tu_buft(&d, 0));
    loom_status st = loom_gallocr_reserve(ga, m.g);
    LOOM_CHECK_EQ_INT(st, LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "failed to allocate");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    LOOM_CHECK_EQ_INT(loom_gallocr_get_buffer_size(ga, 0), 0);
    LOOM_CHECK(loom_gallocr_needs_realloc(ga, m.g));
    loom_gallocr_free(ga);
    model_case_free(&m);
    tu_devs_close(&d);
}

/* Every host allocation the allocator makes may fail: each failure is a status, and
 * nothing leaks (the test runs under ASan/LSan too). */
LOOM_TEST(gallocr, host_out_of_memory_on_every_path) {
    model_case m;
    LOOM_REQUIRE(model_case_new(&m, &k_cfg, loom_cpu_buffer_type()));
    int failures = 0, successes = 0;
    for (int n = 1; n < 200; n++) {
        /* stamped tensors keep their data from the previous round: clear it */
        for (int i = 0; i < m.g->n_nodes; i++) {
            m.g->nodes[i]->data = NULL;
            m.g->nodes[i]->buffer = NULL;
        }
        for (int i = 0; i < m.g->n_leafs; i++) {
            if (m.g->leafs[i]->flags & LOOM_TENSOR_FLAG_INPUT) {
                m.g->leafs[i]->data = NULL;
                m.g->leafs[i]->buffer = NULL;
            }
        }
        tu_fail_after(n);
        loom_gallocr *ga = loom_gallocr_new(loom_cpu_buffer_type());
        loom_status st = ga ? loom_gallocr_alloc_graph(ga, m.g) : loom_last_status();
        int calls = tu_fail_stop();
        loom_gallocr_free(ga);
        if (st == LOOM_OK) {
            successes++;
            if (calls < n) break; /* no allocation failed: every path was covered */
        } else {
            LOOM_CHECK_MSG(st == LOOM_ERR_NOMEM || st == LOOM_ERR_DEVICE_OOM,
                           "n=%d: status %d (%s)", n, st, loom_last_error());
            failures++;
        }
    }
    LOOM_CHECK(failures > 3);
    LOOM_CHECK(successes >= 1);
    model_case_free(&m);
}
