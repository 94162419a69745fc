#define _GNU_SOURCE
/*
 * The llama forward pass end to end on the CPU backend: stories260K (a trained model)
 * writes its known story greedily from "Once upon a time"; batched prompt processing gives
 * the same logits as feeding the tokens one by one through the KV cache; an F16 KV cache
 * agrees with F32; llama-2-tiny-random (F16 weights, 32000 vocab) loads and runs; bad
 * files and unknown architectures are refused with clear errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "loom/tokenizer.h"
#include "model/run-simple.h"
#include "tests/shim/loom_test.h"

typedef struct fixture {
    loom_gguf *g;
    loom_model *m;
    loom_tokenizer *tok;
    loom_kv_cache *kv;
    loom_backend_t cpu;
} fixture;

static bool open_fixture(fixture *f, const char *file, int64_t n_ctx, loom_type kv_type) {
    memset(f, 0, sizeof *f);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", loom_test_models_dir(), file);
    if (loom_gguf_open(path, &f->g) || loom_model_load(f->g, NULL, &f->m) ||
        loom_tokenizer_from_gguf(f->g, &f->tok) ||
        loom_kv_cache_new(f->m, n_ctx, kv_type, NULL, &f->kv)) {
        loom_test_fail(__FILE__, __LINE__, "%s: %s", file, loom_last_error());
        return false;
    }
    f->cpu = loom_cpu_backend_new(2);
    return f->cpu != NULL;
}

static void close_fixture(fixture *f) {
    loom_backend_free(f->cpu);
    loom_kv_cache_free(f->kv);
    loom_tokenizer_free(f->tok);
    loom_model_free(f->m);
    loom_gguf_free(f->g);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

LOOM_TEST(model, stories260k_greedy_story) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    fixture f;
    if (!open_fixture(&f, "stories260K.gguf", 256, LOOM_TYPE_F32)) {
        close_fixture(&f);
        return;
    }
    const loom_hparams *hp = &f.m->hp;
    LOOM_CHECK_EQ_INT(hp->n_embd, 64);
    LOOM_CHECK_EQ_INT(hp->n_layer, 5);
    LOOM_CHECK_EQ_INT(hp->n_head_kv, 4);
    LOOM_CHECK_EQ_INT(hp->n_vocab, 512);
    int32_t ids[64];
    size_t n;
    LOOM_REQUIRE(loom_tokenize(f.tok, "Once upon a time", 16, true, ids, 64, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 5);
    LOOM_CHECK(ids[0] == 1 && ids[1] == 403 && ids[2] == 407 && ids[3] == 261 && ids[4] == 378);
    float logits[512];
    LOOM_REQUIRE(loom_model_eval_simple(f.m, f.kv, f.cpu, ids, 5, 0, false, logits) == LOOM_OK);
    char text[4096] = "";
    size_t tl = 0;
    int64_t pos = 5;
    for (int step = 0; step < 60; step++) {
        int32_t next = argmax(logits, 512);
        if (next == loom_tokenizer_eos(f.tok)) break;
        tl += loom_token_to_piece(f.tok, next, text + tl, sizeof text - tl - 1);
        LOOM_REQUIRE(loom_model_eval_simple(f.m, f.kv, f.cpu, &next, 1, pos++, false, logits) == LOOM_OK);
    }
    text[tl] = 0;
    fprintf(stderr, "stories260K: Once upon a time%s\n", text);
    LOOM_CHECK_STR_CONTAINS(text, "Lily");
    close_fixture(&f);
}

LOOM_TEST(model, batch_equals_token_by_token) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    fixture a, b;
    bool ok = open_fixture(&a, "stories260K.gguf", 64, LOOM_TYPE_F32) &&
              open_fixture(&b, "stories260K.gguf", 64, LOOM_TYPE_F16);
    if (!ok) {
        close_fixture(&a);
        close_fixture(&b);
        return;
    }
    const int32_t ids[7] = {1, 403, 407, 261, 378, 300, 72};
    float *batch = malloc(sizeof(float) * 512 * 7), one[512], half[512];
    LOOM_REQUIRE(loom_model_eval_simple(a.m, a.kv, a.cpu, ids, 7, 0, true, batch) == LOOM_OK);
    /* one by one into a second cache (F16: looser) */
    double worst = 0, worst_half = 0;
    fixture c;
    LOOM_REQUIRE(open_fixture(&c, "stories260K.gguf", 64, LOOM_TYPE_F32));
    for (int t = 0; t < 7; t++) {
        LOOM_REQUIRE(loom_model_eval_simple(c.m, c.kv, c.cpu, &ids[t], 1, t, false, one) == LOOM_OK);
        LOOM_REQUIRE(loom_model_eval_simple(b.m, b.kv, b.cpu, &ids[t], 1, t, false, half) == LOOM_OK);
        for (int i = 0; i < 512; i++) {
            double d = fabs(one[i] - batch[t * 512 + i]);
            double dh = fabs(half[i] - batch[t * 512 + i]);
            if (d > worst) worst = d;
            if (dh > worst_half) worst_half = dh;
        }
    }
    /* F32 everywhere: only summation order differs */
    LOOM_CHECK_MSG(worst < 1e-3, "batched vs sequential logits differ by %g", worst);
    /* an F16 cache rounds K and V to 11 bits */
    LOOM_CHECK_MSG(worst_half < 5e-2, "F16 cache logits differ by %g", worst_half);
    free(batch);
    close_fixture(&a);
    close_fixture(&b);
    close_fixture(&c);
}

LOOM_TEST(model, llama2_tiny_random_f16_runs) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    fixture f;
    if (!open_fixture(&f, "llama-2-tiny-random.gguf", 32, LOOM_TYPE_F32)) {
        close_fixture(&f);
        return;
    }
    LOOM_CHECK_EQ_INT(f.m->hp.n_vocab, 32000);
    int32_t ids[3] = {1, 15043, 3186};
    float *logits = malloc(sizeof(float) * 32000);
    LOOM_REQUIRE(loom_model_eval_simple(f.m, f.kv, f.cpu, ids, 3, 0, false, logits) == LOOM_OK);
    int finite = 0;
    for (int i = 0; i < 32000; i++) finite += isfinite(logits[i]);
    LOOM_CHECK_EQ_INT(finite, 32000);
    free(logits);
    close_fixture(&f);
}

LOOM_TEST(model, unknown_architecture_and_bad_shapes) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    LOOM_REQUIRE(w != NULL);
    loom_gguf_set_str(w, "general.architecture", "gptneox");
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    loom_model *m = NULL;
    LOOM_CHECK(loom_model_load(g, NULL, &m) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unknown architecture 'gptneox'");
    LOOM_CHECK(m == NULL);
    loom_gguf_free(g);
    loom_free(data);

    /* a llama whose token_embd does not match n_embd */
    loom_gguf_set_str(w, "general.architecture", "llama");
    loom_gguf_set_u32(w, "llama.embedding_length", 8);
    loom_gguf_set_u32(w, "llama.block_count", 1);
    loom_gguf_set_u32(w, "llama.attention.head_count", 2);
    loom_gguf_set_u32(w, "llama.feed_forward_length", 16);
    loom_gguf_set_u32(w, "llama.vocab_size", 10);
    float z[16 * 10] = {0};
    loom_gguf_add_tensor(w, "token_embd.weight", LOOM_TYPE_F32, 2, (int64_t[]){16, 10}, z);
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK(loom_model_load(g, NULL, &m) == LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "token_embd.weight");
    loom_gguf_free(g);
    loom_free(data);

    /* missing block_count */
    loom_gguf_writer_free(w);
    w = loom_gguf_writer_new();
    loom_gguf_set_str(w, "general.architecture", "llama");
    loom_gguf_set_u32(w, "llama.embedding_length", 8);
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK(loom_model_load(g, NULL, &m) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "llama.block_count");
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

LOOM_TEST(model, sampler_greedy_seeded_topk) {
    float logits[6] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 1.0f};
    loom_sampler *g = loom_sampler_new(&(loom_sampler_params){.temp = 0});
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(loom_sampler_sample(g, logits, 6), 1);
    loom_sampler_free(g);
    /* top_k = 2: only tokens 1 and 3 can come out; the same seed gives the same draws */
    loom_sampler_params p = {.temp = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 42};
    loom_sampler *s1 = loom_sampler_new(&p), *s2 = loom_sampler_new(&p);
    int count[6] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t a = loom_sampler_sample(s1, logits, 6), b = loom_sampler_sample(s2, logits, 6);
        LOOM_CHECK(a == b);
        count[a]++;
    }
    LOOM_CHECK(count[1] + count[3] == 2000);
    /* p(1)/p(3) = e^0.1 = 1.105: both well represented */
    LOOM_CHECK(count[1] > 900 && count[3] > 800);
    loom_sampler_free(s1);
    loom_sampler_free(s2);
    /* top_p = 0.3 keeps only the best token */
    p.top_k = 0;
    p.top_p = 0.3f;
    loom_sampler *s3 = loom_sampler_new(&p);
    for (int i = 0; i < 100; i++) LOOM_CHECK_EQ_INT(loom_sampler_sample(s3, logits, 6), 1);
    loom_sampler_free(s3);
}

/* llama.cpp's order: the nucleus is taken before the temperature, and min-p after it. With
 * logits 2, 1, 0 the untempered probabilities are .665, .245, .090: top-p 0.85 keeps tokens
 * 0 and 1, and the temperature 0.5 then draws token 1 with e^2 / (e^4 + e^2) = 11.9%. Had the
 * temperature come first (p = .872, .118, .016), the nucleus would hold token 0 alone. min-p
 * 0.3 keeps the logits >= 2 + ln 0.3 = 0.80: tokens 0 and 1 of the three. */
LOOM_TEST(model, sampler_top_p_before_the_temperature_then_min_p) {
    float logits[4] = {2.0f, 1.0f, 0.0f, -30.0f};
    loom_sampler_params p = {.temp = 0.5f, .top_k = 0, .top_p = 0.85f, .seed = 7};
    loom_sampler *s = loom_sampler_new(&p);
    LOOM_REQUIRE(s != NULL);
    int count[4] = {0};
    for (int i = 0; i < 4000; i++)
        count[loom_sampler_sample(s, logits, 4)]++;
    loom_sampler_free(s);
    LOOM_CHECK_EQ_INT(count[2] + count[3], 0);
    LOOM_CHECK_MSG(count[1] > 4000 * 0.09 && count[1] < 4000 * 0.15, "token 1 drawn %d times",
                   count[1]);
    p = (loom_sampler_params){.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 7, .min_p = 0.3f};
    s = loom_sampler_new(&p);
    LOOM_REQUIRE(s != NULL);
    memset(count, 0, sizeof count);
    for (int i = 0; i < 4000; i++)
        count[loom_sampler_sample(s, logits, 4)]++;
    loom_sampler_free(s);
    /* e^2 : e^1 = 73% : 27% */
    LOOM_CHECK_EQ_INT(count[2] + count[3], 0);
    LOOM_CHECK_MSG(count[1] > 4000 * 0.22 && count[1] < 4000 * 0.32, "token 1 drawn %d times",
                   count[1]);
    /* min-p always keeps the top token, even at 1 */
    p.min_p = 1.0f;
    s = loom_sampler_new(&p);
    for (int i = 0; i < 50; i++)
        LOOM_CHECK_EQ_INT(loom_sampler_sample(s, logits, 4), 0);
    loom_sampler_free(s);
}

/* A K-quant file loads and runs; the same file with one tensor's type id changed to one
 * loom has no kernels for (IQ2_XXS, 16: smaller blocks, so the data still fits) still opens
 * but the model load refuses it by tensor name, type name and id. */
LOOM_TEST(model, unsupported_tensor_type_refused_by_name) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 256;
    p.n_ff = 512;
    p.n_layer = 1;
    p.n_vocab = 320;
    p.wtype = LOOM_TYPE_Q4_K;
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(&p, &w) == LOOM_OK);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf_writer_free(w);
    loom_gguf *g = NULL;
    loom_model *m = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK_MSG(loom_model_load(g, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    loom_model_free(m);
    m = NULL;
    loom_gguf_free(g);
    const char *name = "blk.0.ffn_up.weight";
    char *at = memmem(data, size, name, strlen(name));
    LOOM_REQUIRE(at != NULL);
    uint32_t nd, t = 16;
    memcpy(&nd, at + strlen(name), 4);
    memcpy(at + strlen(name) + 4 + 8 * nd, &t, 4);
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK(loom_model_load(g, NULL, &m) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "tensor 'blk.0.ffn_up.weight' has type IQ2_XXS (16), which loom does "
                            "not support");
    LOOM_CHECK(m == NULL);
    loom_gguf_free(g);
    loom_free(data);
}
