/*
 * Sliding-window layers in a bounded KV cache (issue 11): each sliding layer keeps a ring
 * of n_swa - 1 + n_batch cells (rounded up to LOOM_KV_PAD), position p in cell p % cells,
 * masked by the position each cell holds. For every architecture with sliding layers
 * (gemma2, gemma3, phi3, gpt-oss), a prompt several times longer than the ring, evaluated
 * in batches and then token by token, gives the logits of the full-context cache
 * (swa_full) on the CPU and over sim:2 tensor and layer splits; the sliding layers' caches
 * hold the ring only (and the global layers n_ctx); a batch larger than the ring was sized
 * for is refused with a message naming it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/session.h"
#include "tests/model/arch_cases.h"
#include "tests/shim/loom_test.h"

enum { N_CTX = 160, N_BATCH = 5, N_PROMPT = 100, N_GEN = 12 };

typedef struct config {
    const char *devices;
    loom_split_mode mode;
} config;

static const config CONFIGS[] = {
    {"cpu", LOOM_SPLIT_MODE_NONE},
    {"sim:2", LOOM_SPLIT_MODE_TENSOR},
    {"sim:2", LOOM_SPLIT_MODE_LAYER},
};

static loom_session *open_session(const loom_gguf *g, const config *c, bool full) {
    loom_session_params p = loom_session_params_default();
    p.devices = c->devices;
    p.split_mode = c->mode;
    p.n_ctx = N_CTX;
    p.n_batch = N_BATCH;
    p.swa_full = full;
    p.threads = 1;
    loom_session *s = NULL;
    loom_status st = loom_session_new(NULL, g, &p, &s);
    LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", c->devices, loom_last_error());
    return st == LOOM_OK ? s : NULL;
}

/* The prompt's logits at every position, then each generated token's: [N_PROMPT + N_GEN][V] */
static bool run(loom_session *s, const int32_t *ids, int64_t V, float *out) {
    loom_status st = loom_session_eval(s, ids, N_PROMPT, true, out);
    for (int i = N_PROMPT; st == LOOM_OK && i < N_PROMPT + N_GEN; i++)
        st = loom_session_eval(s, &ids[i], 1, false, out + (size_t)i * (size_t)V);
    LOOM_CHECK_MSG(st == LOOM_OK, "eval: %s", loom_last_error());
    return st == LOOM_OK;
}

LOOM_TEST(swa_ring, bounded_cache_equals_the_full_context_cache) {
    int tested = 0;
    for (int ci = 0; ci < arch_case_count(); ci++) {
        const arch_case *c = arch_case_get(ci);
        if (c->p.n_swa <= 0 || strstr(c->name, "-q8") || strcmp(c->name, "gemma2-out") == 0)
            continue;
        void *data = NULL;
        size_t size = 0;
        LOOM_REQUIRE(arch_case_write(c, &data, &size) == LOOM_OK);
        loom_gguf *g = NULL;
        LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
        const int64_t V = c->p.n_vocab;
        int32_t ids[N_PROMPT + N_GEN];
        for (int i = 0; i < N_PROMPT + N_GEN; i++)
            ids[i] = (int32_t)((i * 7 + 3) % V);
        float *ring = malloc(sizeof(float) * (size_t)V * (N_PROMPT + N_GEN));
        float *full = malloc(sizeof(float) * (size_t)V * (N_PROMPT + N_GEN));
        LOOM_REQUIRE(ring && full);
        for (size_t k = 0; k < sizeof CONFIGS / sizeof CONFIGS[0]; k++) {
            const config *cf = &CONFIGS[k];
            loom_session *a = open_session(g, cf, false), *b = open_session(g, cf, true);
            LOOM_REQUIRE(a && b);
            const loom_hparams *hp = &loom_session_model(a)->hp;
            const int64_t cells = loom_kv_cache_swa_cells(hp, N_CTX, N_BATCH);
            const int64_t want =
                (hp->n_swa - 1 + N_BATCH + LOOM_KV_PAD - 1) / LOOM_KV_PAD * LOOM_KV_PAD;
            LOOM_CHECK_EQ_INT(cells, want);
            LOOM_CHECK(cells < N_PROMPT / 2); /* the prompt wraps the ring at least twice */
            /* the sliding layers hold the ring, the global ones the context */
            const loom_kv_cache *ka = loom_session_kv(a), *kb = loom_session_kv(b);
            int n_swa_layers = 0;
            for (int il = 0; il < hp->n_layer; il++) {
                n_swa_layers += hp->swa_layer[il];
                LOOM_CHECK_EQ_INT(ka->k[il]->ne[1], hp->swa_layer[il] ? cells : N_CTX);
                LOOM_CHECK_EQ_INT(ka->v[il]->ne[1], hp->swa_layer[il] ? cells : N_CTX);
                LOOM_CHECK_EQ_INT(kb->k[il]->ne[1], N_CTX);
            }
            LOOM_CHECK(n_swa_layers > 0);
            LOOM_REQUIRE(run(a, ids, V, ring) && run(b, ids, V, full));
            /* the same sums over the window, in the ring's cell order: float rounding only */
            double worst = 0, scale = 0;
            for (size_t i = 0; i < (size_t)V * (N_PROMPT + N_GEN); i++) {
                worst = fmax(worst, fabs((double)ring[i] - full[i]));
                scale = fmax(scale, fabs((double)full[i]));
            }
            fprintf(stderr,
                    "%-14s %s %-6s: %lld of %d cells in %d sliding layers, max |diff| vs full "
                    "%.3g (max |logit| %.3g)\n",
                    c->name, cf->devices, loom_split_mode_name(cf->mode), (long long)cells, N_CTX,
                    n_swa_layers, worst, scale);
            LOOM_CHECK_MSG(worst <= 1e-6 * (1 + scale), "%s %s %s: ring vs full cache differ by %g",
                           c->name, cf->devices, loom_split_mode_name(cf->mode), worst);
            /* a batch larger than the ring was sized for: refused, named */
            loom_session_clear(a);
            loom_graph *pg = NULL;
            LOOM_CHECK(loom_session_plan(a, cells, &pg) == LOOM_ERR_INVALID_ARG);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), "sliding-window cache");
            loom_session_free(a);
            loom_session_free(b);
            tested++;
        }
        free(ring);
        free(full);
        loom_gguf_free(g);
        loom_free(data);
    }
    LOOM_CHECK(tested >= 4 * 3);
}
