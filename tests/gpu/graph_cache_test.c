/*
 * The CUDA backend's graph cache (backends/cuda/graph-cache.c) with a stand-in for CUDA:
 * graph_compute's flow (the first compute of a key eager, the second captures, later ones
 * replay) where "capturing" allocates a token that the release callback frees and counts.
 * Runs on any machine (no GPU, no toolkit).
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/graph-cache.h"
#include "loom/core.h"
#include "tests/shim/loom_test.h"

typedef struct {
    uint64_t captures, replays, eager, released;
} standin;

static void release_token(void *exec, void *ud) {
    standin *st = ud;
    st->released++;
    free(exec);
}

/* A 4-node graph whose key is `id` (the first node's op param). */
typedef struct {
    loom_tensor t[4];
    loom_tensor *nodes[4];
    loom_graph g;
} fake_graph;

static void fake_init(fake_graph *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 4; i++) {
        f->t[i].type = LOOM_TYPE_F32;
        f->t[i].op = LOOM_OP_ADD;
        f->t[i].ne[0] = 64 + i;
        f->t[i].nb[0] = 4;
        if (i) f->t[i].src[0] = &f->t[i - 1];
        f->nodes[i] = &f->t[i];
    }
    f->g.nodes = f->nodes;
    f->g.n_nodes = 4;
    f->g.size = 4;
}

/* graph_compute of cuda-graph.c, with tokens for CUDA graphs */
static void compute(loom__cuda_gcache *gc, fake_graph *f, int id, standin *st) {
    f->t[0].op_params[0] = id;
    loom__cuda_gentry *e = loom__cuda_gcache_lookup(gc, &f->g);
    if (e && !e->exec && !e->no_capture) {
        e->exec = malloc(8);
        LOOM_REQUIRE(e->exec != NULL);
        st->captures++;
    }
    if (e && e->exec)
        st->replays++;
    else
        st->eager++;
}

/* Tensor split of a 64-layer model: 2L+1 = 129 subgraphs per token on each device. The
 * old fixed 128 entries evicted each one before it came back (nothing replayed); the cache
 * grows to hold them, and from the third token every subgraph is replayed. */
LOOM_TEST(graph_cache, grows_to_replay_129_subgraphs_per_token) {
    standin st = {0};
    loom__cuda_gcache *gc = loom__cuda_gcache_new(release_token, &st);
    LOOM_REQUIRE(gc != NULL);
    fake_graph f;
    fake_init(&f);
    const int n_sub = 2 * 64 + 1, tokens = 8;
    uint64_t replays_last = 0;
    for (int tok = 0; tok < tokens; tok++) {
        const uint64_t before = st.replays;
        for (int k = 0; k < n_sub; k++)
            compute(gc, &f, k, &st);
        replays_last = st.replays - before;
    }
    loom__cuda_gcache_stats cs;
    loom__cuda_gcache_get_stats(gc, &cs);
    LOOM_CHECK_EQ_INT(replays_last, n_sub);
    LOOM_CHECK(cs.capacity >= n_sub && cs.capacity <= 4 * n_sub);
    LOOM_CHECK_EQ_INT(cs.entries, n_sub);
    LOOM_CHECK(cs.grows >= 1);
    /* every key captured once: no capture was evicted and redone after the growth */
    LOOM_CHECK_EQ_INT(st.captures, n_sub);
    loom__cuda_gcache_free(gc);
    LOOM_CHECK_EQ_INT(st.released, st.captures);
}

/* A working set that fits never grows the cache; keys seen only once (never coming back)
 * evict without growing it either. */
LOOM_TEST(graph_cache, no_growth_without_thrashing) {
    standin st = {0};
    loom__cuda_gcache *gc = loom__cuda_gcache_new(release_token, &st);
    LOOM_REQUIRE(gc != NULL);
    fake_graph f;
    fake_init(&f);
    for (int tok = 0; tok < 6; tok++)
        for (int k = 0; k < LOOM_CUDA_GCACHE_MIN / 2; k++)
            compute(gc, &f, k, &st);
    loom__cuda_gcache_stats cs;
    loom__cuda_gcache_get_stats(gc, &cs);
    LOOM_CHECK_EQ_INT(cs.capacity, LOOM_CUDA_GCACHE_MIN);
    /* the first token runs eagerly, the second captures and replays, the rest replay */
    LOOM_CHECK_EQ_INT(st.replays, 5 * (LOOM_CUDA_GCACHE_MIN / 2));
    for (int k = 0; k < 10 * LOOM_CUDA_GCACHE_MIN; k++)
        compute(gc, &f, 100000 + k, &st);
    loom__cuda_gcache_get_stats(gc, &cs);
    LOOM_CHECK_EQ_INT(cs.capacity, LOOM_CUDA_GCACHE_MIN);
    LOOM_CHECK_EQ_INT(cs.entries, LOOM_CUDA_GCACHE_MIN);
    LOOM_CHECK(cs.evictions > 0);
    /* the evicted captures were released at eviction, the rest at free */
    const uint64_t released_before_free = st.released;
    LOOM_CHECK(released_before_free > 0);
    loom__cuda_gcache_free(gc);
    LOOM_CHECK_EQ_INT(st.released, st.captures);
}

/* More subgraphs than the largest cache: it stops at LOOM_CUDA_GCACHE_MAX and keeps
 * evicting (least recently used first), releasing every capture it drops. */
LOOM_TEST(graph_cache, bounded_by_its_maximum) {
    standin st = {0};
    loom__cuda_gcache *gc = loom__cuda_gcache_new(release_token, &st);
    LOOM_REQUIRE(gc != NULL);
    fake_graph f;
    fake_init(&f);
    const int n_sub = LOOM_CUDA_GCACHE_MAX + 100;
    for (int tok = 0; tok < 4; tok++)
        for (int k = 0; k < n_sub; k++)
            compute(gc, &f, k, &st);
    loom__cuda_gcache_stats cs;
    loom__cuda_gcache_get_stats(gc, &cs);
    LOOM_CHECK_EQ_INT(cs.capacity, LOOM_CUDA_GCACHE_MAX);
    LOOM_CHECK_EQ_INT(cs.entries, LOOM_CUDA_GCACHE_MAX);
    LOOM_CHECK(cs.evictions > 0);
    loom__cuda_gcache_clear(gc);
    LOOM_CHECK_EQ_INT(st.released, st.captures);
    loom__cuda_gcache_get_stats(gc, &cs);
    LOOM_CHECK_EQ_INT(cs.entries, 0);
    LOOM_CHECK_EQ_INT(cs.capacity, LOOM_CUDA_GCACHE_MAX); /* the size is kept */
    loom__cuda_gcache_free(gc);
}

/* A changed key word (a data address, a shape) is another graph: never replayed for it. */
LOOM_TEST(graph_cache, a_changed_tensor_is_another_key) {
    standin st = {0};
    loom__cuda_gcache *gc = loom__cuda_gcache_new(release_token, &st);
    LOOM_REQUIRE(gc != NULL);
    fake_graph f;
    fake_init(&f);
    compute(gc, &f, 7, &st);
    compute(gc, &f, 7, &st);
    LOOM_CHECK_EQ_INT(st.replays, 1);
    f.t[2].ne[0]++;
    compute(gc, &f, 7, &st);
    LOOM_CHECK_EQ_INT(st.replays, 1);
    f.t[2].ne[0]--;
    compute(gc, &f, 7, &st);
    LOOM_CHECK_EQ_INT(st.replays, 2);
    loom__cuda_gcache_free(gc);
    LOOM_CHECK_EQ_INT(st.released, st.captures);
}
