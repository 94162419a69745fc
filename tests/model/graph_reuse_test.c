/*
 * Graph and schedule reuse (loom_session_params.no_graph_reuse): a session that keeps the
 * previous batch's graph while the shape class repeats gives bit-identical logits to one
 * that builds and schedules every batch afresh, at every step of a run that crosses KV
 * buckets (32-position steps), changes the batch size and the logits kept, switches the
 * attention kind and clears the cache, on the CPU, tensor split over sim:2, layer split
 * over sim:2 and with the cache in host memory. The reusing session must actually reuse
 * (graphs_reused > 0), and must rebuild on every change of class.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/sched.h"
#include "loom/session.h"
#include "tests/shim/loom_test.h"

typedef struct config {
    const char *devices;
    loom_split_mode mode;
    bool no_kv_offload;
} config;

static const config CONFIGS[] = {
    {"cpu", LOOM_SPLIT_MODE_NONE, false},
    {"sim:2", LOOM_SPLIT_MODE_TENSOR, false},
    {"sim:2", LOOM_SPLIT_MODE_LAYER, false},
    {"sim:2", LOOM_SPLIT_MODE_TENSOR, true},
};

static loom_session *open_session(const char *path, const config *c, bool no_reuse) {
    loom_session_params p = loom_session_params_default();
    p.devices = c->devices;
    p.split_mode = c->mode;
    p.no_kv_offload = c->no_kv_offload;
    p.n_ctx = 128;
    p.n_batch = 8;
    p.threads = 1;
    p.no_graph_reuse = no_reuse;
    loom_session *s = NULL;
    if (loom_session_new(path, NULL, &p, &s))
        loom_test_fail(__FILE__, __LINE__, "%s %s: %s", c->devices, loom_split_mode_name(c->mode),
                       loom_last_error());
    return s;
}

/* One step of the run: n tokens (all logits or the last), or a cache clear (n == 0), or
 * an attention switch (n < 0: flash attention off, then on again). */
typedef struct step {
    int n;
    bool all;
} step;

#define MAX_TOK 8
#define MAX_V 512

static void run_both(const char *path, const config *c) {
    loom_session *a = open_session(path, c, false), *b = open_session(path, c, true);
    LOOM_REQUIRE(a && b);
    const int64_t V = loom_session_model(a)->hp.n_vocab;
    LOOM_REQUIRE(V <= MAX_V);
    /* 5-token prompt, singles across the 32 and 64 buckets, batches of 3 (one logit, then
     * all), singles again, a clear and singles from 0, the other attention kind */
    step steps[160];
    int n_steps = 0;
    steps[n_steps++] = (step){5, false};
    for (int i = 0; i < 62; i++)
        steps[n_steps++] = (step){1, false};
    steps[n_steps++] = (step){3, false};
    steps[n_steps++] = (step){3, false};
    steps[n_steps++] = (step){3, true};
    for (int i = 0; i < 4; i++)
        steps[n_steps++] = (step){1, false};
    steps[n_steps++] = (step){0, false};
    for (int i = 0; i < 4; i++)
        steps[n_steps++] = (step){1, false};
    steps[n_steps++] = (step){-1, false};
    for (int i = 0; i < 3; i++)
        steps[n_steps++] = (step){1, false};
    steps[n_steps++] = (step){-1, false};
    for (int i = 0; i < 3; i++)
        steps[n_steps++] = (step){1, false};
    uint32_t seed = 1;
    int evals = 0;
    static float la[MAX_TOK * MAX_V], lb[MAX_TOK * MAX_V];
    loom_model *ma = (loom_model *)loom_session_model(a), *mb = (loom_model *)loom_session_model(b);
    for (int k = 0; k < n_steps; k++) {
        const step *st = &steps[k];
        if (st->n == 0) {
            loom_session_clear(a);
            loom_session_clear(b);
            continue;
        }
        if (st->n < 0) {
            ma->no_flash_attn = mb->no_flash_attn = !ma->no_flash_attn;
            continue;
        }
        int32_t ids[MAX_TOK];
        for (int i = 0; i < st->n; i++) {
            seed = seed * 1664525u + 1013904223u;
            ids[i] = (int32_t)(3 + (seed >> 8) % (uint32_t)(V - 3));
        }
        memset(la, 0, sizeof la);
        memset(lb, 0, sizeof lb);
        loom_status sa = loom_session_eval(a, ids, st->n, st->all, la);
        loom_status sb = loom_session_eval(b, ids, st->n, st->all, lb);
        if (!LOOM_CHECK_MSG(sa == LOOM_OK && sb == LOOM_OK, "%s %s step %d: %s", c->devices,
                            loom_split_mode_name(c->mode), k, loom_last_error()))
            break;
        evals++;
        size_t bytes = (size_t)((st->all ? st->n : 1) * V) * sizeof(float);
        LOOM_CHECK_MSG(memcmp(la, lb, bytes) == 0,
                       "%s %s%s step %d (%d tokens at %lld): reused and fresh logits differ",
                       c->devices, loom_split_mode_name(c->mode), c->no_kv_offload ? " nkvo" : "",
                       k, st->n, (long long)loom_session_n_past(a) - st->n);
        LOOM_CHECK(isfinite(la[0]));
    }
    loom_session_stats sa, sb;
    loom_session_get_stats(a, &sa);
    loom_session_get_stats(b, &sb);
    /* the fresh session builds every batch; the reusing one reuses most singles: within
     * a bucket of 32 positions and one attention kind only the first single builds */
    LOOM_CHECK_MSG(sb.graphs_reused == 0 && sb.graphs_built == (uint64_t)evals,
                   "%s: fresh session built %llu and reused %llu of %d", c->devices,
                   (unsigned long long)sb.graphs_built, (unsigned long long)sb.graphs_reused,
                   evals);
    LOOM_CHECK_MSG(sa.graphs_built + sa.graphs_reused == (uint64_t)evals &&
                       sa.graphs_reused >= (uint64_t)evals * 3 / 4 && sa.graphs_built >= 8,
                   "%s %s: reusing session built %llu and reused %llu of %d", c->devices,
                   loom_split_mode_name(c->mode), (unsigned long long)sa.graphs_built,
                   (unsigned long long)sa.graphs_reused, evals);
    loom_session_free(a);
    loom_session_free(b);
}

LOOM_TEST(graph_reuse, reused_plans_match_fresh_ones) {
    const char *dir = loom_test_models_dir();
    if (!dir) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
    for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++)
        run_both(path, &CONFIGS[c]);
}

/* The scheduler's side of it: a graph is reusable only while it is the allocated one. */
LOOM_TEST(graph_reuse, sched_is_allocated_tracks_the_current_graph) {
    const char *dir = loom_test_models_dir();
    if (!dir) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
    config c = {"cpu", LOOM_SPLIT_MODE_NONE, false};
    loom_session *s = open_session(path, &c, false);
    LOOM_REQUIRE(s);
    loom_graph *g = NULL;
    LOOM_REQUIRE(loom_session_plan(s, 1, &g) == LOOM_OK && g);
    loom_sched *sc = loom_session_sched(s);
    LOOM_CHECK(loom_sched_is_allocated(sc, g));
    LOOM_CHECK(!loom_sched_is_allocated(sc, NULL));
    loom_sched_reset(sc);
    LOOM_CHECK(!loom_sched_is_allocated(sc, g));
    /* a reset scheduler: the next eval must build again, and still be right */
    int32_t tok = 5;
    float l1[MAX_V], l2[MAX_V];
    LOOM_REQUIRE(loom_session_eval(s, &tok, 1, false, l1) == LOOM_OK);
    loom_session_stats ss;
    loom_session_get_stats(s, &ss);
    LOOM_CHECK(ss.graphs_built == 2 && ss.graphs_reused == 0); /* the plan, then the eval */
    loom_session_clear(s);
    loom_sched_reset(sc); /* behind the session's back: no reuse of a forgotten schedule */
    LOOM_REQUIRE(loom_session_eval(s, &tok, 1, false, l2) == LOOM_OK);
    loom_session_get_stats(s, &ss);
    LOOM_CHECK(ss.graphs_built == 3 && ss.graphs_reused == 0);
    LOOM_CHECK(memcmp(l1, l2, sizeof l1) == 0);
    loom_session_free(s);
}
