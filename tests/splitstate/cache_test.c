/*
 * Tests of loom_split_ctx (splitstate/cache.c): the leaf callback and its validation, error
 * propagation, can_split's "a failing source arrives whole", and a cache that cannot go
 * stale: edits of a tensor's op, params, sources or shape, and edits far upstream, are all
 * seen; unchanged graphs are not rederived; batches validate each tensor once; the bound
 * on entries; cycles; and out-of-memory on every allocation.
 */
#include "tests/splitstate/split_test_util.h"

#define F32 LOOM_TYPE_F32
#define M(n) st_kind(LOOM_SPLIT_MIRRORED, n)

static loom_status failing_leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    (void)out;
    (void)ud;
    if (!strcmp(t->name, "broken")) return loom_error(LOOM_ERR_NOT_FOUND, "no rule for 'broken'");
    if (!strcmp(t->name, "silent")) return LOOM_ERR_INTERNAL; /* no message */
    if (!strcmp(t->name, "three")) {
        loom_split_state_init(out, LOOM_SPLIT_MIRRORED, 3);
        return LOOM_OK;
    }
    return LOOM_OK;
}

LOOM_TEST(splitcache, leaf_callback_results_are_validated) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *w = leaf_t(&f, "blk.0.attn_q.weight", F32, ST_AX(1, 2, 3, 3), 8, 8, 1, 1);
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, w, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "split state AXIS_1 [3,3] of 'blk.0.attn_q.weight': "
                                               "counts sum to 6, but ne[1] = 8");
    /* a consumer reports the root cause; can_split lets the source arrive whole instead */
    loom_tensor *x = leaf_t(&f, "x", F32, M(2), 8, 3, 1, 1);
    loom_tensor *q = named(loom_mul_mat(f.ctx, w, x), "q");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, q, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "counts sum to 6, but ne[1] = 8");
    LOOM_CHECK(loom_split_ctx_can_split(f.sc, q));
    /* fixing the table (and clearing: the callback's answer changed) fixes it */
    leaf_set(&f.lt, "blk.0.attn_q.weight", ST_AX(1, 2, 4, 4));
    loom_split_ctx_clear(f.sc);
    const loom_split_state want = ST_AX(0, 2, 4, 4);
    CHECK_DERIVED(&f, q, want);
    fx_free(&f);

    loom_ctx *ctx = headers_ctx();
    loom_split_ctx *sc = loom_split_ctx_new(2, failing_leaf, NULL);
    LOOM_REQUIRE(ctx && sc);
    loom_tensor *b = named(loom_new_tensor_1d(ctx, F32, 4), "broken");
    loom_tensor *si = named(loom_new_tensor_1d(ctx, F32, 4), "silent");
    loom_tensor *th = named(loom_new_tensor_1d(ctx, F32, 4), "three");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(sc, b, false, &s), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no rule for 'broken'");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(sc, si, false, &s), LOOM_ERR_INTERNAL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "the split-state callback failed for 'silent'");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(sc, th, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "gave 'three' a state over 3 devices, not 2");
    loom_split_ctx_free(sc);
    loom_ctx_free(ctx);
}

LOOM_TEST(splitcache, contexts_and_arguments) {
    LOOM_CHECK(loom_split_ctx_new(0, NULL, NULL) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "0 devices (must be 1..16)");
    LOOM_CHECK(loom_split_ctx_new(17, NULL, NULL) == NULL);
    loom_split_ctx_free(NULL);
    loom_split_ctx *sc = loom_split_ctx_new(16, NULL, NULL);
    LOOM_REQUIRE(sc);
    LOOM_CHECK_EQ_INT(loom_split_ctx_n_devices(sc), 16);
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(sc, NULL, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK(!loom_split_ctx_can_split(sc, NULL));
    /* without a callback every leaf is MIRRORED */
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    loom_tensor *w = loom_new_tensor_2d(ctx, F32, 4, 4);
    LOOM_REQUIRE(loom_split_ctx_get(sc, w, false, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_MIRRORED);
    LOOM_CHECK_EQ_INT(s.n_devices, 16);
    LOOM_CHECK(loom_split_ctx_can_split(sc, w)); /* a leaf */
    loom_split_ctx_free(sc);
    loom_ctx_free(ctx);
}

/* A small chain: x -> rms_norm -> mul(norm w) -> mul_mat(wq) -> reshape -> permute */
typedef struct chain {
    loom_tensor *x, *nw, *wq, *wq2, *norm, *normed, *q, *q3, *qp;
} chain;

static bool build_chain(fixture *f, chain *c) {
    c->x = leaf_t(f, "x", F32, M(2), 8, 3, 1, 1);
    c->nw = leaf_t(f, "norm_w", F32, M(2), 8, 1, 1, 1);
    c->wq = leaf_t(f, "wq", F32, ST_AX(1, 2, 4, 4), 8, 8, 1, 1);
    c->wq2 = leaf_t(f, "wq2", F32, ST_AX(1, 2, 2, 6), 8, 8, 1, 1);
    c->norm = named(loom_rms_norm(f->ctx, c->x, 1e-5f), "norm");
    c->normed = named(loom_mul(f->ctx, c->norm, c->nw), "normed");
    c->q = named(loom_mul_mat(f->ctx, c->wq, c->normed), "q");
    c->q3 = named(loom_reshape_3d(f->ctx, c->q, 2, 4, 3), "q3");
    c->qp = named(loom_permute(f->ctx, c->q3, 0, 2, 1, 3), "qp");
    return c->qp != NULL;
}

LOOM_TEST(splitcache, unchanged_graphs_are_not_rederived) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    loom_split_ctx_stats s0 = loom_split_ctx_get_stats(f.sc);
    const int calls0 = f.lt.calls;
    LOOM_CHECK_EQ_INT(s0.entries, 8); /* 3 leafs + 5 nodes (wq2 is not in the graph) */
    for (int i = 0; i < 3; i++)
        CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    loom_split_ctx_stats s1 = loom_split_ctx_get_stats(f.sc);
    LOOM_CHECK_EQ_INT(s1.computed, s0.computed);
    LOOM_CHECK(s1.hits > s0.hits);
    LOOM_CHECK_EQ_INT(f.lt.calls, calls0);
    fx_free(&f);
}

LOOM_TEST(splitcache, edits_are_seen) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    /* the node's own params (and shape): the identity permutation */
    const loom_tensor saved = *c.qp;
    c.qp->op_params[1] = 1;
    c.qp->op_params[2] = 2;
    memcpy(c.qp->ne, c.q3->ne, sizeof c.qp->ne);
    memcpy(c.qp->nb, c.q3->nb, sizeof c.qp->nb);
    CHECK_DERIVED(&f, c.qp, ST_AX(1, 2, 2, 2));
    *c.qp = saved;
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    /* a source two levels up is swapped: q now uses wq2 */
    c.q->src[0] = c.wq2;
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 1, 3));
    c.q->src[0] = c.wq;
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    /* a leaf four levels up is renamed, and the callback splits it differently: the
     * reference only notices edits of the tensor itself */
    leaf_set(&f.lt, "x_rows", ST_AX(1, 2, 1, 2));
    loom_set_name(c.x, "x_rows");
    loom_split_state s;
    loom_status st = loom_split_ctx_get(f.sc, c.qp, false, &s);
    LOOM_CHECK_EQ_INT(st, LOOM_ERR_UNSUPPORTED); /* column-parallel weight x split rows */
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "mul_mat 'q'");
    loom_set_name(c.x, "x");
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    /* a source's shape, which the consumer's broadcast rule reads: the norm weight stops
     * being a broadcast row (its own state is MIRRORED either way) */
    loom_tensor *h = leaf_t(&f, "h", F32, ST_AX(1, 2, 1, 2), 8, 3, 1, 1);
    loom_tensor *hb = named(loom_mul(f.ctx, h, c.nw), "hb");
    CHECK_DERIVED(&f, hb, ST_AX(1, 2, 1, 2));
    c.nw->ne[1] = 3;
    c.nw->nb[2] = c.nw->nb[3] = c.nw->nb[1] * 3;
    CHECK_REFUSED(&f, hb,
                  "mul 'hb': a 'h' AXIS_1 [1,2] is split along axis 1 but b 'norm_w' "
                  "MIRRORED has ne[1] = 3");
    c.nw->ne[1] = 1;
    c.nw->nb[2] = c.nw->nb[3] = c.nw->nb[1];
    CHECK_DERIVED(&f, hb, ST_AX(1, 2, 1, 2));
    /* an op changed in place: q3 [2, 4, 3] transposed is [4, 2, 3] */
    c.qp->op = LOOM_OP_TRANSPOSE;
    c.qp->ne[0] = 4;
    c.qp->ne[1] = 2;
    c.qp->ne[2] = 3;
    CHECK_DERIVED(&f, c.qp, ST_AX(0, 2, 2, 2));
    *c.qp = saved;
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    fx_free(&f);
}

/* A reused arena: the header of a PARTIAL leaf becomes a computed PARTIAL (same address,
 * name, shape and state). Its consumer reads it reduced now (MIRRORED), so the consumer
 * must rederive though the source's own state did not change (issue 29: the consumer kept
 * the leaf's PARTIAL, and the meta device reduced the value a second time). */
LOOM_TEST(splitcache, an_op_change_with_the_same_state_is_seen_by_consumers) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *w = leaf(&f, "w", ST_AX(0, 2, 4, 4), 8, 4, 1);
    loom_tensor *x = leaf(&f, "x", M(2), 8, 3, 1);
    loom_tensor *p = leaf(&f, "p", st_kind(LOOM_SPLIT_PARTIAL, 2), 4, 3, 1);
    loom_tensor *c = named(loom_scale(f.ctx, p, 2.0f), "c");
    loom_tensor *mm = loom_mul_mat(f.ctx, w, x);
    LOOM_REQUIRE(c && mm);
    CHECK_DERIVED(&f, c, st_kind(LOOM_SPLIT_PARTIAL, 2));
    *p = *mm; /* p's header now holds the product (still PARTIAL), keeping its name */
    loom_set_name(p, "p");
    CHECK_DERIVED(&f, p, st_kind(LOOM_SPLIT_PARTIAL, 2));
    CHECK_DERIVED(&f, c, M(2));
    /* a fresh context agrees */
    loom_split_ctx *fresh = loom_split_ctx_new(2, leaf_table_fn, &f.lt);
    LOOM_REQUIRE(fresh != NULL);
    loom_split_state want, got = state_of(&f, c);
    LOOM_CHECK(loom_split_ctx_get(fresh, c, false, &want) == LOOM_OK);
    CHECK_STATE(got, want);
    loom_split_ctx_free(fresh);
    fx_free(&f);
}

LOOM_TEST(splitcache, an_edit_ripples_only_as_far_as_it_matters) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    loom_split_ctx_stats s0 = loom_split_ctx_get_stats(f.sc);
    /* a leaf's flags change (the callback may read them) and its state does not: only the
     * leaf is asked again */
    loom_set_input(c.x);
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    loom_split_ctx_stats s1 = loom_split_ctx_get_stats(f.sc);
    LOOM_CHECK_EQ_INT(s1.computed - s0.computed, 1);
    LOOM_CHECK_EQ_INT(s1.invalidated - s0.invalidated, 1);
    /* renamed to a name with the same state: its consumer (which names it in messages)
     * rederives too, and nothing beyond */
    leaf_set(&f.lt, "x_again", M(2));
    loom_set_name(c.x, "x_again");
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    loom_split_ctx_stats s2 = loom_split_ctx_get_stats(f.sc);
    LOOM_CHECK_EQ_INT(s2.computed - s1.computed, 2);
    fx_free(&f);
}

LOOM_TEST(splitcache, batches_validate_each_tensor_once) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    loom_tensor *nodes[5] = {c.norm, c.normed, c.q, c.q3, c.qp};
    loom_split_state s;
    for (int i = 0; i < 5; i++)
        LOOM_REQUIRE(loom_split_ctx_get(f.sc, nodes[i], false, &s) == 0);
    /* unbatched: each query walks its whole upstream graph */
    loom_split_ctx_stats a = loom_split_ctx_get_stats(f.sc);
    for (int i = 0; i < 5; i++)
        LOOM_REQUIRE(loom_split_ctx_get(f.sc, nodes[i], false, &s) == 0);
    loom_split_ctx_stats b = loom_split_ctx_get_stats(f.sc);
    /* upstream sizes: norm 2, normed 4, q 6, q3 7, qp 8 */
    LOOM_CHECK_EQ_INT(b.lookups - a.lookups, 2 + 4 + 6 + 7 + 8);
    loom_split_ctx_begin(f.sc);
    loom_split_ctx_begin(f.sc); /* nests */
    for (int i = 0; i < 5; i++)
        LOOM_REQUIRE(loom_split_ctx_get(f.sc, nodes[i], false, &s) == 0);
    LOOM_CHECK(loom_split_ctx_can_split(f.sc, c.qp));
    loom_split_ctx_end(f.sc);
    loom_split_ctx_end(f.sc);
    loom_split_ctx_stats d = loom_split_ctx_get_stats(f.sc);
    LOOM_CHECK_EQ_INT(d.lookups - b.lookups, 8); /* every tensor once */
    LOOM_CHECK_EQ_INT(d.computed, b.computed);
    fx_free(&f);
}

LOOM_TEST(splitcache, whole_graph_in_one_batch) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    loom_graph *g = loom_graph_new(f.ctx, 64);
    LOOM_REQUIRE(g && loom_graph_build_forward(g, c.qp) == LOOM_OK);
    LOOM_REQUIRE(g->n_nodes == 5);
    loom_split_state states[5];
    LOOM_REQUIRE(loom_split_ctx_get_graph(f.sc, g, false, states) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_stats(f.sc).lookups, 8); /* each tensor once */
    for (int i = 0; i < 5; i++) {
        loom_split_state s = state_of(&f, g->nodes[i]);
        CHECK_STATE(states[i], s);
    }
    /* the first failing node stops it, with its message */
    leaf_set(&f.lt, "x", ST_AX(0, 2, 4, 4));
    loom_split_ctx_clear(f.sc);
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_graph(f.sc, g, false, states), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "rms_norm 'norm': cannot split along axis 0");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_graph(f.sc, NULL, false, states), LOOM_ERR_INVALID_ARG);
    fx_free(&f);
}

LOOM_TEST(splitcache, bounded_capacity) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    chain c;
    LOOM_REQUIRE(build_chain(&f, &c));
    loom_split_ctx_set_capacity(f.sc, 4);
    loom_split_state s = state_of(&f, c.qp); /* may exceed the bound within one query */
    const loom_split_state want = ST_AX(2, 2, 2, 2);
    CHECK_STATE(s, want);
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_stats(f.sc).entries, 8);
    CHECK_DERIVED(&f, c.norm, M(2)); /* cleared first, then only what this query needs */
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_stats(f.sc).entries, 2);
    loom_split_ctx_set_capacity(f.sc, 0);
    CHECK_DERIVED(&f, c.qp, ST_AX(2, 2, 2, 2));
    CHECK_DERIVED(&f, c.norm, M(2));
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_stats(f.sc).entries, 8);
    loom_split_ctx_clear(f.sc);
    LOOM_CHECK_EQ_INT(loom_split_ctx_get_stats(f.sc).entries, 0);
    fx_free(&f);
}

LOOM_TEST(splitcache, cycles_are_errors) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *x = leaf_t(&f, "x", F32, M(2), 4, 1, 1, 1);
    loom_tensor *a = named(loom_add(f.ctx, x, x), "a");
    loom_tensor *b = named(loom_add(f.ctx, a, x), "b");
    LOOM_REQUIRE(a && b);
    a->src[1] = b; /* a <- b <- a */
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, b, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "depends on itself (a cycle in the graph)");
    a->src[1] = x;
    CHECK_DERIVED(&f, b, M(2));
    a->src[1] = a; /* its own source */
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, a, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'a' is its own source");
    fx_free(&f);
}

/* ---------------------------------------------------------------- out of memory */

typedef struct oom {
    int budget; /* allocations left before failing; < 0: never fail */
    int fails;
} oom;

static void *oom_malloc(size_t n, void *ud) {
    oom *o = ud;
    if (o->budget == 0) {
        o->fails++;
        return NULL;
    }
    if (o->budget > 0) o->budget--;
    return malloc(n);
}

static void *oom_realloc(void *p, size_t n, void *ud) {
    oom *o = ud;
    if (o->budget == 0) {
        o->fails++;
        return NULL;
    }
    if (o->budget > 0) o->budget--;
    return realloc(p, n);
}

static void oom_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

LOOM_TEST(splitcache, survives_out_of_memory_everywhere) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_split_ctx_free(f.sc); /* re-created under the failing allocator below */
    f.sc = NULL;
    /* a graph deep enough to grow the walk's stack and the table */
    loom_tensor *t = leaf_t(&f, "x", F32, M(2), 8, 3, 1, 1);
    loom_tensor *w = leaf_t(&f, "w", F32, ST_AX(1, 2, 4, 4), 8, 8, 1, 1);
    for (int i = 0; i < 200; i++)
        t = loom_add(f.ctx, t, t);
    loom_tensor *last = named(loom_mul_mat(f.ctx, w, t), "last");
    LOOM_REQUIRE(last);
    int succeeded = 0;
    for (int budget = 0; budget < 1000 && !succeeded; budget++) {
        oom o = {budget, 0};
        loom_allocator a = {oom_malloc, oom_realloc, oom_free, &o};
        loom_allocator_set(&a);
        loom_split_ctx *sc = loom_split_ctx_new(2, leaf_table_fn, &f.lt);
        loom_status st = LOOM_ERR_NOMEM;
        loom_split_state s;
        if (sc) {
            st = loom_split_ctx_get(sc, last, false, &s);
            /* a query after a failure must not see stale walk marks */
            if (st == LOOM_ERR_NOMEM) st = loom_split_ctx_get(sc, last, false, &s);
        }
        loom_allocator_set(NULL);
        if (!sc || st == LOOM_ERR_NOMEM) {
            LOOM_CHECK(o.fails > 0);
            LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
        } else {
            LOOM_CHECK_EQ_INT(st, LOOM_OK);
            const loom_split_state want = ST_AX(0, 2, 4, 4);
            CHECK_STATE(s, want);
            succeeded = o.fails == 0;
        }
        /* with memory back, the same context finishes the job */
        if (sc) {
            LOOM_CHECK_EQ_INT(loom_split_ctx_get(sc, last, false, &s), LOOM_OK);
            loom_split_ctx_free(sc);
        }
    }
    LOOM_CHECK(succeeded);
    fx_free(&f);
}
