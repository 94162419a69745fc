/*
 * Whole runs through the scheduler (the acceptance checks of the model issue): stories260K
 * greedy from "Once upon a time" gives the same token ids on the CPU, with tensor
 * parallelism over sim:2, sim:3, sim:4 and sim:8, with layer split over sim:2 and with
 * part of the layers left in host memory; llama-2-tiny-random's logits agree within 1e-4
 * across the same configurations; a synthetic MoE model split by tensor agrees with one
 * device; bad device specs and rules files are refused with clear errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/session.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

typedef struct config {
    const char *devices;
    loom_split_mode mode;
    int ngl;
    bool no_kv_offload;
} config;

static const config CONFIGS[] = {
    {"cpu", LOOM_SPLIT_MODE_NONE, -1, false},     {"sim:2", LOOM_SPLIT_MODE_TENSOR, -1, false},
    {"sim:3", LOOM_SPLIT_MODE_TENSOR, -1, false}, {"sim:4", LOOM_SPLIT_MODE_TENSOR, -1, false},
    {"sim:8", LOOM_SPLIT_MODE_TENSOR, -1, false}, {"sim:2", LOOM_SPLIT_MODE_LAYER, -1, false},
    {"sim:1", LOOM_SPLIT_MODE_NONE, 3, false},    {"sim:2", LOOM_SPLIT_MODE_TENSOR, 3, false},
    {"sim:2", LOOM_SPLIT_MODE_TENSOR, -1, true}, {"sim:3", LOOM_SPLIT_MODE_LAYER, -1, true},
};
#define N_CONFIGS (int)(sizeof CONFIGS / sizeof CONFIGS[0])

static loom_session *open_session(const char *path, const loom_gguf *g, const config *c) {
    loom_session_params p = loom_session_params_default();
    p.devices = c->devices;
    p.split_mode = c->mode;
    p.n_gpu_layers = c->ngl;
    p.no_kv_offload = c->no_kv_offload;
    p.n_ctx = 128;
    p.threads = 2;
    loom_session *s = NULL;
    loom_status st = loom_session_new(path, g, &p, &s);
    if (st) loom_test_fail(__FILE__, __LINE__, "%s %s: %s", c->devices, loom_split_mode_name(c->mode), loom_last_error());
    return s;
}

static int argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int)b;
}

LOOM_TEST(session, stories_same_tokens_everywhere) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    int32_t ref[40];
    int n_ref = 0;
    for (int c = 0; c < N_CONFIGS; c++) {
        loom_session *s = open_session(path, NULL, &CONFIGS[c]);
        if (!s) continue;
        const loom_tokenizer *tok = loom_session_tokenizer(s);
        int32_t ids[64];
        size_t n;
        LOOM_REQUIRE(loom_tokenize(tok, "Once upon a time", 16, true, ids, 64, &n) == LOOM_OK);
        float logits[512];
        int32_t out[40];
        int n_out = 0;
        loom_status st = loom_session_eval(s, ids, (int64_t)n, false, logits);
        for (int step = 0; st == LOOM_OK && step < 40; step++) {
            int32_t next = argmax(logits, 512);
            out[n_out++] = next;
            if (next == loom_tokenizer_eos(tok)) break;
            st = loom_session_eval(s, &next, 1, false, logits);
        }
        LOOM_CHECK_MSG(st == LOOM_OK, "%s %s: %s", CONFIGS[c].devices, loom_split_mode_name(CONFIGS[c].mode), loom_last_error());
        loom_session_stats ss;
        loom_session_get_stats(s, &ss);
        char text[1024] = "";
        size_t tl = 0;
        for (int i = 0; i < n_out; i++) tl += loom_token_to_piece(tok, out[i], text + tl, sizeof text - tl - 1);
        text[tl] = 0;
        fprintf(stderr, "%-6s %-6s ngl %2d: graph nodes = %d, splits = %d (prompt) / %d, %d (gen), %d reductions: %.60s...\n",
                CONFIGS[c].devices, loom_split_mode_name(CONFIGS[c].mode), CONFIGS[c].ngl,
                ss.prompt_nodes, ss.prompt_splits, ss.gen_nodes, ss.gen_splits, ss.last_reductions, text);
        if (c == 0) {
            memcpy(ref, out, sizeof(int32_t) * (size_t)n_out);
            n_ref = n_out;
            LOOM_CHECK_STR_CONTAINS(text, "Lily");
        } else {
            LOOM_CHECK_MSG(n_out == n_ref && memcmp(out, ref, sizeof(int32_t) * (size_t)n_out) == 0,
                           "%s %s ngl %d: different tokens", CONFIGS[c].devices,
                           loom_split_mode_name(CONFIGS[c].mode), CONFIGS[c].ngl);
        }
        if (CONFIGS[c].mode == LOOM_SPLIT_MODE_TENSOR && CONFIGS[c].ngl < 0 && !CONFIGS[c].no_kv_offload) {
            /* everything offloaded: the meta device does all but the embedding lookup */
            LOOM_CHECK_MSG(ss.gen_splits <= 2, "%s: %d splits", CONFIGS[c].devices, ss.gen_splits);
            LOOM_CHECK_EQ_INT(ss.last_reductions, 2 * 5);
        }
        loom_session_free(s);
    }
}

static void compare_logits(const char *path, const loom_gguf *g, int64_t V, double tol) {
    const int32_t ids[6] = {1, 15, 290, 300, 270, 99};
    float *ref = malloc(sizeof(float) * (size_t)V * 2), *got = malloc(sizeof(float) * (size_t)V * 2);
    for (int c = 0; c < N_CONFIGS; c++) {
        loom_session *s = open_session(path, g, &CONFIGS[c]);
        if (!s) continue;
        float *dst = c == 0 ? ref : got;
        loom_status st = loom_session_eval(s, ids, 5, false, dst);
        if (st == LOOM_OK) st = loom_session_eval(s, &ids[5], 1, false, dst + V);
        LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", CONFIGS[c].devices, loom_last_error());
        if (c > 0 && st == LOOM_OK) {
            double worst = 0;
            for (int64_t i = 0; i < 2 * V; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
            LOOM_CHECK_MSG(worst <= tol, "%s %s ngl %d: logits differ by %g", CONFIGS[c].devices,
                           loom_split_mode_name(CONFIGS[c].mode), CONFIGS[c].ngl, worst);
        }
        loom_session_free(s);
    }
    free(ref);
    free(got);
}

LOOM_TEST(session, llama2_tiny_random_logits_agree) {
    const char *dir = loom_test_models_dir();
    if (!dir) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[4096];
    snprintf(path, sizeof path, "%s/llama-2-tiny-random.gguf", dir);
    compare_logits(path, NULL, 32000, 1e-4);
}

LOOM_TEST(session, synthetic_moe_tensor_split_agrees) {
    loom_synth_params p = loom_synth_params_default();
    p.arch = "mixtral";
    p.n_embd = 64;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 64;
    p.n_layer = 3;
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_vocab = 320;
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(&p, &w) == LOOM_OK);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    compare_logits(NULL, g, 320, 1e-4);
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

LOOM_TEST(session, bad_inputs_are_named) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_session_params p = loom_session_params_default();
    loom_session *s = NULL;
    p.devices = "sim:banana";
    LOOM_CHECK(loom_session_new(path, NULL, &p, &s) != LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "banana");
    p.devices = "sim:2";
    p.split_rules = "/nonexistent/rules.txt";
    LOOM_CHECK(loom_session_new(path, NULL, &p, &s) == LOOM_ERR_IO);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "/nonexistent/rules.txt");
    p.split_rules = NULL;
    LOOM_CHECK(loom_session_new("/nonexistent/model.gguf", NULL, &p, &s) == LOOM_ERR_IO);
    p.devices = "cpu";
    p.n_ctx = 8;
    LOOM_REQUIRE(loom_session_new(path, NULL, &p, &s) == LOOM_OK);
    int32_t ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    float logits[512];
    LOOM_CHECK(loom_session_eval(s, ids, 10, false, logits) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "exceed the context of 8");
    ids[0] = 9999;
    LOOM_CHECK(loom_session_eval(s, ids, 1, false, logits) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "outside the vocabulary");
    loom_session_free(s);
}

/* A file without a vocabulary (tokenizer.ggml.model "none") runs ids: the session has no
 * tokenizer, and its logits are those of the same weights with one. */
LOOM_TEST(session, no_vocabulary_runs_ids) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_layer = 2;
    p.n_vocab = 300;
    float *logits[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        loom_gguf_writer *w = NULL;
        LOOM_REQUIRE(loom_model_synth(&p, &w) == LOOM_OK);
        if (k) LOOM_REQUIRE(loom_gguf_set_str(w, "tokenizer.ggml.model", "none") == LOOM_OK);
        void *data;
        size_t size;
        LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
        loom_gguf_writer_free(w);
        loom_gguf *g = NULL;
        LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
        loom_session_params sp = loom_session_params_default();
        sp.n_ctx = 16;
        loom_session *s = NULL;
        loom_status st = loom_session_new(NULL, g, &sp, &s);
        LOOM_CHECK_MSG(st == LOOM_OK, "%s", loom_last_error());
        LOOM_REQUIRE(st == LOOM_OK);
        LOOM_CHECK((loom_session_tokenizer(s) == NULL) == (k == 1));
        const int32_t ids[3] = {1, 17, 299};
        logits[k] = malloc(sizeof(float) * 300);
        LOOM_REQUIRE(loom_session_eval(s, ids, 3, false, logits[k]) == LOOM_OK);
        loom_session_free(s);
        loom_gguf_free(g);
        loom_free(data);
    }
    LOOM_CHECK(memcmp(logits[0], logits[1], sizeof(float) * 300) == 0);
    free(logits[0]);
    free(logits[1]);
}
