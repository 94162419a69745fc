/*
 * graph_test.c: graph building. Order (every source before its consumer), no duplicates,
 * leafs = op NONE tensors, COMPUTE flags, a fresh uid on every build or edit, capacity
 * overflow (LOOM_ERR_FULL, graph left as it was), deep chains (the visit is iterative),
 * add_node, clear, views and name lookup.
 */
#include <stdio.h>
#include <string.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

static loom_ctx *ctx_new(size_t mem) {
    return loom_ctx_new((loom_ctx_params){.mem_size = mem, .no_alloc = true});
}

static int index_in(loom_tensor **arr, int n, const loom_tensor *t) {
    int found = -1;
    for (int i = 0; i < n; i++) {
        if (arr[i] == t) {
            if (found >= 0) return -2; /* duplicate */
            found = i;
        }
    }
    return found;
}

/* Independent check of a built graph: every tensor reachable from `out` through src[]
 * appears exactly once, as a leaf iff its op is NONE, and every node's sources come before it;
 * with `exact`, the graph holds nothing else. */
static void check_graph(const loom_graph *g, loom_tensor *out, bool exact) {
    loom_tensor *stack[4096];
    loom_tensor *seen[4096];
    int sp = 0, n_seen = 0;
    stack[sp++] = out;
    while (sp > 0) {
        loom_tensor *t = stack[--sp];
        bool dup = false;
        for (int i = 0; i < n_seen; i++)
            dup |= seen[i] == t;
        if (dup) continue;
        LOOM_REQUIRE(n_seen < 4096);
        seen[n_seen++] = t;
        for (int s = 0; s < LOOM_MAX_SRC; s++)
            if (t->src[s]) {
                LOOM_REQUIRE(sp < 4096);
                stack[sp++] = t->src[s];
            }
    }
    int n_nodes = 0, n_leafs = 0;
    for (int i = 0; i < n_seen; i++) {
        loom_tensor *t = seen[i];
        int ni = index_in(g->nodes, g->n_nodes, t), li = index_in(g->leafs, g->n_leafs, t);
        if (t->op == LOOM_OP_NONE) {
            LOOM_CHECK_MSG(li >= 0 && ni == -1, "leaf '%s': leaf index %d, node index %d", t->name,
                           li, ni);
            n_leafs++;
        } else {
            LOOM_CHECK_MSG(ni >= 0 && li == -1, "node '%s': node index %d, leaf index %d", t->name,
                           ni, li);
            LOOM_CHECK(t->flags & LOOM_TENSOR_FLAG_COMPUTE);
            n_nodes++;
            for (int s = 0; s < LOOM_MAX_SRC; s++) {
                loom_tensor *src = t->src[s];
                if (src && src->op != LOOM_OP_NONE)
                    LOOM_CHECK_MSG(index_in(g->nodes, g->n_nodes, src) < ni,
                                   "'%s' comes before its source '%s'", t->name, src->name);
            }
        }
    }
    if (exact) {
        LOOM_CHECK_EQ_INT(g->n_nodes, n_nodes);
        LOOM_CHECK_EQ_INT(g->n_leafs, n_leafs);
    }
}

LOOM_TEST(graph, build_order_leafs_and_flags) {
    loom_ctx *ctx = ctx_new(1 << 20);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 16, 8);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 16, 4);
    loom_tensor *nw = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 16);
    loom_set_name(w, "w");
    loom_set_name(x, "x");
    loom_set_name(nw, "norm_w");
    loom_tensor *n = loom_rms_norm(ctx, x, 1e-6f);
    loom_set_name(n, "n");
    loom_tensor *nm = loom_mul(ctx, n, nw);
    loom_set_name(nm, "nm");
    loom_tensor *mm = loom_mul_mat(ctx, w, nm);
    loom_set_name(mm, "mm");
    loom_tensor *act = loom_silu(ctx, mm);
    loom_set_name(act, "act");
    /* a diamond: act used twice */
    loom_tensor *y = loom_add(ctx, act, act);
    loom_set_name(y, "y");
    loom_tensor *out = loom_mul(ctx, y, loom_reshape_2d(ctx, act, 8, 4));
    loom_set_name(out, "out");
    LOOM_REQUIRE(out != NULL);

    loom_graph *g = loom_graph_new(ctx, 64);
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(g->size, 64);
    LOOM_CHECK(g->n_nodes == 0 && g->n_leafs == 0 && g->uid != 0);
    uint64_t uid0 = g->uid;
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, out), LOOM_OK);
    check_graph(g, out, true);
    LOOM_CHECK_EQ_INT(g->n_nodes, 7);
    LOOM_CHECK_EQ_INT(g->n_leafs, 3);
    /* depth-first, sources in order, then the node */
    const char *order[7] = {"n", "nm", "mm", "act", "y", "act (reshaped)", "out"};
    for (int i = 0; i < 7; i++)
        LOOM_CHECK_MSG(strcmp(g->nodes[i]->name, order[i]) == 0, "node %d is '%s', want '%s'", i,
                       g->nodes[i]->name, order[i]);
    LOOM_CHECK(g->leafs[0] == w && g->leafs[1] == x && g->leafs[2] == nw);
    LOOM_CHECK(loom_graph_node(g, -1) == out && loom_graph_node(g, 0) == n);
    LOOM_CHECK(!(x->flags & LOOM_TENSOR_FLAG_COMPUTE));
    LOOM_CHECK(g->uid != uid0);
    LOOM_CHECK(loom_graph_get_tensor(g, "mm") == mm);
    LOOM_CHECK(loom_graph_get_tensor(g, "norm_w") == nw);
    LOOM_CHECK(loom_graph_get_tensor(g, "nope") == NULL);

    /* building again from an output already present adds nothing but refreshes the uid */
    uint64_t uid1 = g->uid;
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, act), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 7);
    LOOM_CHECK(g->uid != uid1);
    /* a second output shares the visited set */
    loom_tensor *extra = loom_scale(ctx, mm, 2.0f);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, extra), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 8);
    LOOM_CHECK(loom_graph_node(g, -1) == extra);

    /* clear empties it, and a rebuild gives the same order with a new uid */
    uint64_t uid2 = g->uid;
    loom_graph_clear(g);
    LOOM_CHECK(g->n_nodes == 0 && g->n_leafs == 0 && g->uid != uid2);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, out), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 7);
    check_graph(g, out, true);
    LOOM_CHECK(g->uid > uid2);

    /* views of the node list */
    loom_graph v = loom_graph_view(g, 2, 5);
    LOOM_CHECK(v.n_nodes == 3 && v.nodes[0] == mm && v.n_leafs == 0 && v.uid != g->uid);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(&v, out), LOOM_ERR_INVALID_ARG);
    loom_ctx_free(ctx);
}

LOOM_TEST(graph, uids_are_unique) {
    uint64_t prev = loom_graph_next_uid();
    for (int i = 0; i < 1000; i++) {
        uint64_t u = loom_graph_next_uid();
        LOOM_CHECK(u > prev);
        prev = u;
    }
}

LOOM_TEST(graph, capacity_overflow_leaves_graph_unchanged) {
    loom_ctx *ctx = ctx_new(1 << 20);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    loom_tensor *t = x;
    for (int i = 0; i < 6; i++) {
        t = loom_sqr(ctx, t);
        loom_format_name(t, "s%d", i);
    }
    loom_graph *g = loom_graph_new(ctx, 4);
    LOOM_REQUIRE(g != NULL);
    loom_tensor *s2 = loom_ctx_get_tensor(ctx, "s2");
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, s2), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 3);
    uint64_t uid = g->uid;
    loom_clear_error();
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, t), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "graph capacity 4 exceeded");
    LOOM_CHECK_EQ_INT(g->n_nodes, 3);
    LOOM_CHECK_EQ_INT(g->n_leafs, 1);
    LOOM_CHECK(g->uid != uid);
    /* the visited set was restored: s3 can still be added and s2 is not added twice */
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, loom_ctx_get_tensor(ctx, "s3")), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 4);
    check_graph(g, loom_ctx_get_tensor(ctx, "s3"), true);
    LOOM_CHECK_EQ_INT(loom_graph_add_node(g, t), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "graph_add_node: graph capacity 4 exceeded");

    /* leafs have their own capacity */
    loom_graph *g2 = loom_graph_new(ctx, 2);
    LOOM_REQUIRE(g2 != NULL);
    loom_tensor *l[3];
    for (int i = 0; i < 3; i++)
        l[i] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    loom_tensor *sum = loom_add(ctx, loom_add(ctx, l[0], l[1]), l[2]);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g2, sum), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "adding leaf");
    LOOM_CHECK(g2->n_nodes == 0 && g2->n_leafs == 0);

    loom_clear_error();
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tensor is NULL");
    /* a NULL output from a failed builder carries that builder's message along */
    loom_tensor *bad = loom_add(ctx, x, loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 3));
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, bad), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "add: b [3, 1, 1, 1] cannot be broadcast");
    LOOM_CHECK_EQ_INT(loom_graph_add_node(g, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(NULL, x), LOOM_ERR_INVALID_ARG);
    loom_ctx_free(ctx);
}

LOOM_TEST(graph, deep_chain_is_iterative) {
    /* 200k nested ops: a recursive visit would overflow the stack */
    enum { DEPTH = 200000 };
    size_t mem = (DEPTH + 8) * loom_tensor_overhead() + loom_graph_overhead(DEPTH + 8);
    loom_ctx *ctx = ctx_new(mem);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    loom_tensor *first = NULL, *t = x;
    for (int i = 0; i < DEPTH; i++) {
        t = loom_scale(ctx, t, 1.0f);
        LOOM_REQUIRE(t != NULL);
        if (i == 0) first = t;
    }
    loom_graph *g = loom_graph_new(ctx, DEPTH + 8);
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, t), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, DEPTH);
    LOOM_CHECK_EQ_INT(g->n_leafs, 1);
    LOOM_CHECK(g->nodes[0] == first && g->nodes[DEPTH - 1] == t);
    bool ordered = true;
    for (int i = 1; i < DEPTH; i++)
        ordered &= g->nodes[i]->src[0] == g->nodes[i - 1];
    LOOM_CHECK(ordered);
    loom_ctx_free(ctx);
}

LOOM_TEST(graph, wide_fan_in_random_dag) {
    /* a random DAG checked against the independent reachability walk */
    loom_ctx *ctx = ctx_new(1 << 22);
    LOOM_REQUIRE(ctx != NULL);
    enum { N = 300 };
    loom_tensor *ts[N];
    for (int i = 0; i < 20; i++) {
        ts[i] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
        loom_format_name(ts[i], "leaf%d", i);
    }
    for (int i = 20; i < N; i++) {
        loom_tensor *a = ts[loom_test_rand() % i], *b = ts[loom_test_rand() % i];
        ts[i] = loom_test_rand() % 3 == 0 ? loom_silu(ctx, a) : loom_add(ctx, a, b);
        LOOM_REQUIRE(ts[i] != NULL);
        loom_format_name(ts[i], "op%d", i);
    }
    loom_graph *g = loom_graph_new(ctx, N);
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, ts[N - 1]), LOOM_OK);
    check_graph(g, ts[N - 1], true);
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, ts[N - 2]), LOOM_OK);
    check_graph(g, ts[N - 2], false);
    loom_ctx_free(ctx);
}

LOOM_TEST(graph, add_node_and_full_context) {
    loom_ctx *ctx = ctx_new(1 << 16);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    loom_tensor *a = loom_sqr(ctx, x), *b = loom_sqrt(ctx, a);
    loom_graph *g = loom_graph_new(ctx, 8);
    LOOM_REQUIRE(g != NULL);
    uint64_t uid = g->uid;
    LOOM_CHECK_EQ_INT(loom_graph_add_node(g, b), LOOM_OK); /* no sources visited */
    LOOM_CHECK(g->n_nodes == 1 && g->n_leafs == 0 && g->nodes[0] == b && g->uid != uid);
    LOOM_CHECK(b->flags & LOOM_TENSOR_FLAG_COMPUTE);
    /* a later build does not add b again */
    LOOM_CHECK_EQ_INT(loom_graph_build_forward(g, b), LOOM_OK);
    LOOM_CHECK_EQ_INT(g->n_nodes, 1);
    loom_ctx_free(ctx);

    /* graph overhead is exact: a ctx sized for it holds one graph and no more */
    ctx = ctx_new(loom_graph_overhead(100));
    LOOM_REQUIRE(ctx != NULL);
    LOOM_CHECK(loom_graph_new(ctx, 100) != NULL);
    loom_clear_error();
    LOOM_CHECK(loom_graph_new(ctx, 1) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "graph_new: context full");
    LOOM_CHECK(loom_graph_new(ctx, 0) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    loom_ctx_free(ctx);
}
