/*
 * -ts / tensor_split (issue 14): uneven proportions. stories260K with 3,1 over sim:2 and
 * 1,0,1 over sim:3 (an empty middle device) gives the CPU's logits in tensor and layer
 * mode; the slices are the proportional shares in whole units (query groups, KV heads,
 * FFN columns; the expected counts are worked out by hand below); layer mode runs of
 * consecutive layers; bad proportions are refused naming the value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/session.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

#define LOOM_REQUIRE_MSG(cond, ...)                                                                \
    do {                                                                                           \
        if (!LOOM_CHECK_MSG(cond, __VA_ARGS__)) return;                                            \
    } while (0)

static loom_session *open_ts(const char *path, const char *devices, loom_split_mode mode,
                             const float *ts, int n_ts) {
    loom_session_params p = loom_session_params_default();
    p.devices = devices;
    p.split_mode = mode;
    p.n_ctx = 64;
    p.threads = 2;
    p.tensor_split = ts;
    p.n_tensor_split = n_ts;
    loom_session *s = NULL;
    if (loom_session_new(path, NULL, &p, &s)) return NULL;
    return s;
}

enum { V = 512 };

/* logits of a 5-token prompt and one more token */
static bool run(loom_session *s, float *out) {
    const int32_t ids[6] = {1, 15, 290, 300, 270, 99};
    return loom_session_eval(s, ids, 5, false, out) == LOOM_OK &&
           loom_session_eval(s, &ids[5], 1, false, out + V) == LOOM_OK;
}

/* elements of t along its split axis on device j, as the meta device holds it */
static int64_t slice(loom_session *s, const loom_tensor *t, int j) {
    loom_split_state st;
    loom_dev_t meta = loom_backend_device(loom_session_meta_backend(s));
    if (loom_meta_tensor_state(meta, t, false, &st)) return -1;
    return loom_split_state_dev_count(&st, j);
}

LOOM_TEST(tensor_split, uneven_proportions_equal_cpu) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    float ref[2 * V], got[2 * V];
    loom_session *s = open_ts(path, "cpu", LOOM_SPLIT_MODE_NONE, NULL, 0);
    LOOM_REQUIRE(s && run(s, ref));
    loom_session_free(s);
    const float ts31[] = {3, 1}, ts101[] = {1, 0, 1}, ts13[] = {1, 3};
    const struct {
        const char *devices;
        loom_split_mode mode;
        const float *ts;
        int n;
    } cases[] = {
        {"sim:2", LOOM_SPLIT_MODE_TENSOR, ts31, 2}, {"sim:3", LOOM_SPLIT_MODE_TENSOR, ts101, 3},
        {"sim:2", LOOM_SPLIT_MODE_TENSOR, ts13, 2}, {"sim:2", LOOM_SPLIT_MODE_LAYER, ts31, 2},
        {"sim:3", LOOM_SPLIT_MODE_LAYER, ts101, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        s = open_ts(path, cases[c].devices, cases[c].mode, cases[c].ts, cases[c].n);
        LOOM_CHECK_MSG(s != NULL, "%s %s: %s", cases[c].devices,
                       loom_split_mode_name(cases[c].mode), loom_last_error());
        if (!s) continue;
        LOOM_CHECK_MSG(run(s, got), "%s: %s", cases[c].devices, loom_last_error());
        double w = 0;
        for (int i = 0; i < 2 * V; i++)
            w = fmax(w, fabs((double)got[i] - ref[i]));
        LOOM_CHECK_MSG(w <= 1e-4, "%s %s case %zu: logits differ from cpu by %g", cases[c].devices,
                       loom_split_mode_name(cases[c].mode), c, w);
        loom_session_free(s);
    }
}

LOOM_TEST(tensor_split, slices_are_proportional_in_whole_units) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    /* stories260K: 8 heads of 8 in 4 query groups of 2, 4 KV heads, n_ff 172 */
    const float ts31[] = {3, 1};
    loom_session *s = open_ts(path, "sim:2", LOOM_SPLIT_MODE_TENSOR, ts31, 2);
    LOOM_REQUIRE_MSG(s != NULL, "%s", loom_last_error());
    const loom_layer *L = &loom_session_model(s)->layers[0];
    /* 3/4 of 4 query groups = 3 groups (6 heads, 48 rows); 3 of 4 KV heads (24) */
    LOOM_CHECK_EQ_INT(slice(s, L->wq, 0), 48);
    LOOM_CHECK_EQ_INT(slice(s, L->wq, 1), 16);
    LOOM_CHECK_EQ_INT(slice(s, L->wk, 0), 24);
    LOOM_CHECK_EQ_INT(slice(s, L->wk, 1), 8);
    LOOM_CHECK_EQ_INT(slice(s, L->wo, 0), 48); /* wo's input columns follow the heads */
    /* 172 FFN columns: 3/4 = 129, 1/4 = 43 */
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_up, 0), 129);
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_up, 1), 43);
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_down, 0), 129);
    /* the K cache follows the KV heads */
    LOOM_CHECK_EQ_INT(slice(s, loom_session_kv(s)->k[0], 0), 24);
    loom_session_free(s);

    /* 1,0,1: the middle device holds no heads and no FFN columns */
    const float ts101[] = {1, 0, 1};
    s = open_ts(path, "sim:3", LOOM_SPLIT_MODE_TENSOR, ts101, 3);
    LOOM_REQUIRE_MSG(s != NULL, "%s", loom_last_error());
    L = &loom_session_model(s)->layers[1];
    LOOM_CHECK_EQ_INT(slice(s, L->wq, 0), 32); /* 2 groups of 2 heads of 8 */
    LOOM_CHECK_EQ_INT(slice(s, L->wq, 1), 0);
    LOOM_CHECK_EQ_INT(slice(s, L->wq, 2), 32);
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_up, 1), 0);
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_up, 0) + slice(s, L->ffn_up, 2), 172);
    LOOM_CHECK_EQ_INT(slice(s, L->ffn_up, 0), 86);
    loom_session_free(s);
}

LOOM_TEST(tensor_split, layer_mode_assignment_counts) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    /* 5 layers by 3,1: floor 3.75 = 3 and floor 1.25 = 1, the leftover layer to device 0 */
    const float ts31[] = {3, 1};
    loom_session *s = open_ts(path, "sim:2", LOOM_SPLIT_MODE_LAYER, ts31, 2);
    LOOM_REQUIRE_MSG(s != NULL, "%s", loom_last_error());
    const int want31[5] = {0, 0, 0, 0, 1};
    for (int il = 0; il < 5; il++)
        LOOM_CHECK_EQ_INT(loom_session_layer_device(s, il), want31[il]);
    loom_session_free(s);
    /* 1,0,1: 2 + 0 + 2 and the leftover to device 0; device 1 holds no layer */
    const float ts101[] = {1, 0, 1};
    s = open_ts(path, "sim:3", LOOM_SPLIT_MODE_LAYER, ts101, 3);
    LOOM_REQUIRE_MSG(s != NULL, "%s", loom_last_error());
    const int want101[5] = {0, 0, 0, 2, 2};
    for (int il = 0; il < 5; il++)
        LOOM_CHECK_EQ_INT(loom_session_layer_device(s, il), want101[il]);
    loom_session_free(s);
    /* without -ts: floor(i * 2 / 5) */
    s = open_ts(path, "sim:2", LOOM_SPLIT_MODE_LAYER, NULL, 0);
    LOOM_REQUIRE(s != NULL);
    const int even[5] = {0, 0, 0, 1, 1};
    for (int il = 0; il < 5; il++)
        LOOM_CHECK_EQ_INT(loom_session_layer_device(s, il), even[il]);
    loom_session_free(s);
}

LOOM_TEST(tensor_split, bad_proportions_are_refused) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    const float neg[] = {1, -1}, zero[] = {0, 0}, three[] = {1, 1, 1}, nan_[] = {1, NAN};
    LOOM_CHECK(open_ts(path, "sim:2", LOOM_SPLIT_MODE_TENSOR, neg, 2) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tensor_split[1] = -1");
    LOOM_CHECK(open_ts(path, "sim:2", LOOM_SPLIT_MODE_TENSOR, nan_, 2) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tensor_split[1] = nan");
    LOOM_CHECK(open_ts(path, "sim:2", LOOM_SPLIT_MODE_LAYER, zero, 2) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no positive proportion");
    LOOM_CHECK(open_ts(path, "sim:2", LOOM_SPLIT_MODE_TENSOR, three, 3) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "3 proportions for 2 devices");
}

static loom_gguf *synth(const loom_synth_params *p, void **data) {
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(p, &w)) return NULL;
    size_t size;
    loom_gguf *g = NULL;
    if (loom_gguf_write_memory(w, data, &size) || loom_gguf_open_memory(*data, size, &g)) g = NULL;
    loom_gguf_writer_free(w);
    return g;
}

/* How far a split run's logits are from the CPU's: the largest and the mean absolute
 * difference, and the largest |logit| of the CPU run (worst < 0: a run failed). */
typedef struct vs_cpu {
    double worst, mean, scale;
} vs_cpu;

static vs_cpu worst_vs_cpu(const loom_gguf *g, int64_t nv, const char *devices, const float *ts,
                           int n_ts, loom_type kv) {
    const int32_t ids[6] = {1, 15, 290, 300, 270, 99};
    float *ref = malloc(sizeof(float) * (size_t)nv * 2),
          *got = malloc(sizeof(float) * (size_t)nv * 2);
    vs_cpu r = {-1, 0, 0};
    for (int c = 0; c < 2; c++) {
        loom_session_params p = loom_session_params_default();
        p.devices = c ? devices : "cpu";
        p.split_mode = c ? LOOM_SPLIT_MODE_TENSOR : LOOM_SPLIT_MODE_NONE;
        p.n_ctx = 64;
        p.threads = 2;
        p.kv_type = kv;
        p.tensor_split = c ? ts : NULL;
        p.n_tensor_split = c ? n_ts : 0;
        loom_session *s = NULL;
        float *o = c ? got : ref;
        if (loom_session_new(NULL, g, &p, &s) || loom_session_eval(s, ids, 5, false, o) ||
            loom_session_eval(s, &ids[5], 1, false, o + nv)) {
            loom_test_fail(__FILE__, __LINE__, "%s: %s", p.devices, loom_last_error());
            loom_session_free(s);
            goto out;
        }
        loom_session_free(s);
    }
    r.worst = 0;
    for (int64_t i = 0; i < 2 * nv; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        r.worst = fmax(r.worst, d);
        r.mean += d / (double)(2 * nv);
        r.scale = fmax(r.scale, fabs((double)ref[i]));
    }
out:
    free(ref);
    free(got);
    return r;
}

/* Float weights: the split only reorders float sums, so logits agree to 1e-4. */
static bool float_close(vs_cpu r) {
    return r.worst >= 0 && r.worst <= 1e-4;
}

/* Q8_0 weights quantise each matmul's activations to 8 bits (a step of 1/127 of a block's
 * largest value). A partial sum that the split adds in another order can differ in its
 * last bit and so round one activation a step the other way, which moves the logits by
 * about that step (~0.4% of the largest logit here, whatever the kernels). A wrong slice
 * moves every logit by its own size. So: at most 1% of the largest logit anywhere, and a
 * mean difference under 0.1% of it. */
static bool quant_close(vs_cpu r) {
    return r.worst >= 0 && r.worst <= 1e-4 + 1e-2 * r.scale && r.mean <= 1e-3 * r.scale;
}

#define CHECK_VS_CPU(close, r, what)                                                               \
    LOOM_CHECK_MSG(close(r), "%s: worst %g, mean %g (largest logit %g)", what, (r).worst,        \
                   (r).mean, (r).scale)

/* q8_0 weights (splits coarsened to whole 32-blocks), a q8_0 cache, and MoE experts, each by
 * 3,1 and 1,0,1 */
LOOM_TEST(tensor_split, synthetic_quantised_and_moe_equal_cpu) {
    const float ts31[] = {3, 1}, ts101[] = {1, 0, 1};
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 256;
    p.n_head = 4;
    p.n_head_kv = 4;
    p.head_dim = 64;
    p.n_ff = 256;
    p.n_layer = 2;
    p.n_vocab = 320;
    p.wtype = LOOM_TYPE_Q8_0;
    void *data = NULL;
    loom_gguf *g = synth(&p, &data);
    LOOM_REQUIRE_MSG(g != NULL, "synth: %s", loom_last_error());
    vs_cpu r1 = worst_vs_cpu(g, 320, "sim:2", ts31, 2, LOOM_TYPE_Q8_0);
    vs_cpu r2 = worst_vs_cpu(g, 320, "sim:3", ts101, 3, LOOM_TYPE_F16);
    CHECK_VS_CPU(quant_close, r1, "q8_0 3,1");
    CHECK_VS_CPU(quant_close, r2, "q8_0 1,0,1");
    loom_gguf_free(g);
    loom_free(data);
    /* head_dim 8 at q8_0: a block of attn_output spans 4 heads, so every attention split is
     * in units of 4 heads (2 units shared 3,1), the FFN in 32-column blocks; q, k, v, o and
     * the cache must still agree */
    p.n_embd = 64;
    p.n_head = 8;
    p.n_head_kv = 8;
    p.head_dim = 0;
    p.n_ff = 128;
    g = synth(&p, &data);
    LOOM_REQUIRE_MSG(g != NULL, "synth: %s", loom_last_error());
    r1 = worst_vs_cpu(g, 320, "sim:2", ts31, 2, LOOM_TYPE_F16);
    r2 = worst_vs_cpu(g, 320, "sim:3", ts101, 3, LOOM_TYPE_F32);
    CHECK_VS_CPU(quant_close, r1, "q8_0 hd8 3,1");
    CHECK_VS_CPU(quant_close, r2, "q8_0 hd8 1,0,1");
    loom_gguf_free(g);
    loom_free(data);

    loom_synth_params q = loom_synth_params_default();
    q.arch = "mixtral";
    q.n_embd = 64;
    q.n_head = 8;
    q.n_head_kv = 2;
    q.n_ff = 64;
    q.n_layer = 2;
    q.n_expert = 4;
    q.n_expert_used = 2;
    q.n_vocab = 320;
    g = synth(&q, &data);
    LOOM_REQUIRE_MSG(g != NULL, "synth: %s", loom_last_error());
    r1 = worst_vs_cpu(g, 320, "sim:2", ts31, 2, LOOM_TYPE_F32);
    r2 = worst_vs_cpu(g, 320, "sim:3", ts101, 3, LOOM_TYPE_F32);
    CHECK_VS_CPU(float_close, r1, "moe 3,1");
    CHECK_VS_CPU(float_close, r2, "moe 1,0,1");
    loom_gguf_free(g);
    loom_free(data);
}
