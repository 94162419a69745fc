/*
 * The meta device on whole models: stories260K (GQA with 4 KV heads, n_ff 172) with every
 * weight and the KV cache split by the built-in llama rules over 1, 2, 3, 4 and 8 sim
 * devices, computed by the meta backend directly, gives the same logits as one CPU device
 * (prompt batch and token-by-token steps), with exactly two reductions per layer per
 * token, and less activation memory per device as N grows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/meta.h"
#include "loom/model.h"
#include "loom/rules.h"
#include "loom/sim.h"
#include "model/run-simple.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

typedef struct rules_ud {
    loom_rules *rules;
    const loom_hparams *hp;
    int n;
} rules_ud;

static loom_status leaf_state(const loom_tensor *t, loom_split_state *out, void *ud) {
    rules_ud *r = ud;
    if (!t->name[0] || !loom_rules_match(r->rules, t->name)) return LOOM_OK; /* MIRRORED */
    return loom_rules_split_state(r->rules, r->hp, t, r->n, out, NULL);
}

static loom_buft_t place_meta(const char *name, int layer, void *ud) {
    (void)name;
    (void)layer;
    return ud;
}

static float *run_cpu(loom_gguf *g, bool no_fa, const int32_t *ids, int n_prompt, int n_steps, int64_t *n_vocab) {
    loom_model *m = NULL;
    loom_kv_cache *kv = NULL;
    if (loom_model_load(g, NULL, &m) || loom_kv_cache_new(m, 64, LOOM_TYPE_F32, NULL, &kv)) {
        loom_test_fail(__FILE__, __LINE__, "cpu: %s", loom_last_error());
        loom_model_free(m);
        return NULL;
    }
    m->no_flash_attn = no_fa;
    loom_backend_t cpu = loom_cpu_backend_new(2);
    int64_t V = m->hp.n_vocab;
    *n_vocab = V;
    float *out = malloc(sizeof(float) * (size_t)(V * (1 + n_steps)));
    bool ok = loom_model_eval_simple(m, kv, cpu, ids, n_prompt, 0, false, out) == LOOM_OK;
    for (int s = 0; s < n_steps && ok; s++)
        ok = loom_model_eval_simple(m, kv, cpu, &ids[n_prompt + s], 1, n_prompt + s, false,
                                    out + V * (1 + s)) == LOOM_OK;
    if (!ok) loom_test_fail(__FILE__, __LINE__, "cpu run: %s", loom_last_error());
    loom_backend_free(cpu);
    loom_kv_cache_free(kv);
    loom_model_free(m);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

/* Runs g on one CPU device and on a meta device over n_dev sim devices (every weight and
 * the cache split by the built-in rules); logits must agree within tol * max|logit|.
 * reductions_per_layer: what a layer must cost per token (-1: do not check). */
static void compare(loom_gguf *g, int n_dev, bool no_fa, double tol, int reductions_per_layer) {
    const int32_t ids[8] = {1, 303, 307, 261, 278, 300, 72, 310}; /* < 320: every vocab */
    const int n_prompt = 5, n_steps = 3;
    int64_t V = 0;
    float *want = run_cpu(g, no_fa, ids, n_prompt, n_steps, &V);
    LOOM_REQUIRE(want != NULL);

    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n_dev);
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec(spec, &reg) == LOOM_OK);
    loom_dev_t devs[16];
    for (int j = 0; j < n_dev; j++) devs[j] = loom_reg_dev_get(reg, (size_t)j);
    loom_hparams hp;
    LOOM_REQUIRE(loom_hparams_from_gguf(g, &hp) == LOOM_OK);
    rules_ud ud = {.hp = &hp, .n = n_dev};
    LOOM_REQUIRE(loom_rules_builtin(hp.arch, hp.n_expert > 0, &ud.rules) == LOOM_OK);
    loom_dev_t meta = NULL;
    LOOM_REQUIRE(loom_meta_device_new(devs, n_dev, leaf_state, &ud, &meta) == LOOM_OK);
    char name[256];
    snprintf(name, sizeof name, "%s", loom_dev_name(meta));
    LOOM_CHECK(strncmp(name, "Meta(SIM0", 9) == 0);
    loom_buft_t mbuft = loom_dev_buffer_type(meta);
    loom_model_params mp = {.placement = place_meta, .placement_user_data = mbuft};
    loom_model *m = NULL;
    loom_kv_cache *kv = NULL;
    loom_status st = loom_model_load(g, &mp, &m);
    LOOM_CHECK_MSG(st == LOOM_OK, "load: %s", loom_last_error());
    if (m) m->no_flash_attn = no_fa;
    if (st == LOOM_OK) st = loom_kv_cache_new(m, 64, LOOM_TYPE_F32, &mp, &kv);
    LOOM_CHECK_MSG(st == LOOM_OK, "kv: %s", loom_last_error());
    loom_backend_t be = st == LOOM_OK ? loom_dev_init(meta, NULL) : NULL;
    LOOM_CHECK_MSG(be != NULL || st != LOOM_OK, "init: %s", loom_last_error());
    float *got = malloc(sizeof(float) * (size_t)V);
    for (int s = 0; be && s <= n_steps; s++) {
        loom_meta_backend_reset_stats(be);
        st = s == 0 ? loom_model_eval_simple(m, kv, be, ids, n_prompt, 0, false, got)
                    : loom_model_eval_simple(m, kv, be, &ids[n_prompt + s - 1], 1, n_prompt + s - 1, false, got);
        if (!LOOM_CHECK_MSG(st == LOOM_OK, "N=%d step %d: %s", n_dev, s, loom_last_error())) break;
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < V; i++) {
            double d = fabs((double)got[i] - want[V * s + i]);
            if (d > worst) worst = d;
            if (fabs(want[V * s + i]) > scale) scale = fabs(want[V * s + i]);
        }
        LOOM_CHECK_MSG(worst <= tol * (scale > 1 ? scale : 1), "N=%d step %d: max |diff| %g (scale %g)",
                       n_dev, s, worst, scale);
        loom_meta_stats ms;
        loom_meta_backend_get_stats(be, &ms);
        fprintf(stderr, "N=%d step %d: max |diff| %.3g (logit scale %.3g), %d subgraphs, %d reductions, %llu bytes reduced, %s\n",
                n_dev, s, worst, scale, ms.last_subgraphs, ms.last_reductions,
                (unsigned long long)ms.last_bytes_reduced, loom_allreduce_algo_name(ms.last_algo));
        if (n_dev > 1 && reductions_per_layer >= 0)
            LOOM_CHECK_MSG(ms.last_reductions == reductions_per_layer * hp.n_layer,
                           "N=%d: %d reductions, want %lld", n_dev, ms.last_reductions,
                           (long long)(reductions_per_layer * hp.n_layer));
    }
    free(got);
    loom_backend_free(be);
    loom_kv_cache_free(kv);
    loom_model_free(m);
    loom_meta_device_free(meta);
    loom_rules_free(ud.rules);
    loom_sim_reg_free(reg);
    free(want);
}

static void check_stories(int n_dev) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open(path, &g) == LOOM_OK);
    /* a dense layer costs exactly two reductions per token */
    compare(g, n_dev, false, 1e-5, 2);
    loom_gguf_free(g);
}

LOOM_TEST(meta_model, stories_1_device) { check_stories(1); }
LOOM_TEST(meta_model, stories_2_devices) { check_stories(2); }
LOOM_TEST(meta_model, stories_3_devices) { check_stories(3); }
LOOM_TEST(meta_model, stories_4_devices) { check_stories(4); }
LOOM_TEST(meta_model, stories_8_devices) { check_stories(8); }

/* A synthetic model in memory; every case over 1, 2, 3, 4 and 8 devices. */
static void check_synth(const loom_synth_params *p, bool no_fa, double tol, int red_per_layer) {
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(p, &w) == LOOM_OK);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    static const int counts[5] = {1, 2, 3, 4, 8};
    for (int c = 0; c < 5 && loom_test_failures() == 0; c++) compare(g, counts[c], no_fa, tol, red_per_layer);
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

static loom_synth_params small(void) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 64;
    p.n_head = 8;
    p.n_head_kv = 2; /* fewer KV heads than devices at N = 4 and 8 */
    p.n_ff = 100;    /* not divisible by 3, 8 */
    p.n_layer = 2;
    p.n_vocab = 320;
    return p;
}

LOOM_TEST(meta_model, swiglu_gqa_uneven_f32) {
    loom_synth_params p = small();
    check_synth(&p, false, 1e-5, 2);
}

LOOM_TEST(meta_model, soft_max_with_mask_instead_of_flash_attn) {
    loom_synth_params p = small();
    check_synth(&p, true, 1e-5, 2);
}

LOOM_TEST(meta_model, fused_qkv_qwen2_biases) {
    loom_synth_params p = small();
    p.arch = "qwen2";
    p.fused_qkv = true;
    check_synth(&p, false, 1e-5, 2);
}

LOOM_TEST(meta_model, qkv_biases_qwen2) {
    loom_synth_params p = small();
    p.arch = "qwen2";
    p.biases = true;
    check_synth(&p, false, 1e-5, 2);
}

LOOM_TEST(meta_model, moe_topk_expert_biases) {
    loom_synth_params p = small();
    p.arch = "mixtral";
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_ff = 64;
    p.biases = true;
    check_synth(&p, false, 1e-5, -1);
}

LOOM_TEST(meta_model, moe_expert_sum_is_reduced_once) {
    loom_synth_params p = small();
    p.arch = "mixtral";
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_ff = 64;
    /* no down bias: the expert sum absorbs the reduction, two per layer */
    check_synth(&p, false, 1e-5, 2);
}

LOOM_TEST(meta_model, q4_0_weights) {
    loom_synth_params p = small();
    p.wtype = LOOM_TYPE_Q4_0;
    p.n_ff = 96; /* three 32-blocks: uneven over 2, 4, 8 */
    check_synth(&p, false, 1e-4, 2);
}

LOOM_TEST(meta_model, f16_weights) {
    loom_synth_params p = small();
    p.wtype = LOOM_TYPE_F16;
    check_synth(&p, false, 1e-5, 2);
}

/* K-quants: n_ff = 512 is two 256-blocks, so over 3 devices the row-parallel ffn_down's K
 * splits unevenly in whole blocks and over 4 and 8 devices some get empty slices; n_embd
 * 256 is one block, so attn_output's K (256) has a single block to place. */
static loom_synth_params kquant(loom_type wt) {
    loom_synth_params p = small();
    p.n_embd = 256;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 512;
    p.wtype = wt;
    return p;
}

LOOM_TEST(meta_model, q4_K_weights) {
    loom_synth_params p = kquant(LOOM_TYPE_Q4_K);
    check_synth(&p, false, 1e-4, 2);
}

/* A Q4_K_M-style file: Q4_K matrices, Q6_K attn_v / ffn_down / output, Q4_K embeddings. */
LOOM_TEST(meta_model, mixed_q4_K_q6_K_file) {
    loom_synth_params p = kquant(LOOM_TYPE_Q4_K);
    p.wtype_hi = LOOM_TYPE_Q6_K;
    p.embd_type = LOOM_TYPE_Q4_K;
    check_synth(&p, false, 1e-4, 2);
}

/* The other block families through the same splits: legacy (32) and i-quant (256) blocks,
 * with MoE experts of 512 (two blocks) for MXFP4 as gpt-oss stores them. */
LOOM_TEST(meta_model, legacy_and_iq_weights) {
    static const loom_type types[] = {LOOM_TYPE_Q5_1, LOOM_TYPE_IQ4_NL, LOOM_TYPE_IQ4_XS,
                                      LOOM_TYPE_Q3_K};
    for (int i = 0; i < 4 && loom_test_failures() == 0; i++) {
        loom_synth_params p = kquant(types[i]);
        p.n_layer = 1;
        check_synth(&p, false, 1e-4, 2);
    }
}

LOOM_TEST(meta_model, moe_mxfp4_experts) {
    loom_synth_params p = kquant(LOOM_TYPE_MXFP4);
    p.arch = "mixtral";
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_layer = 1;
    check_synth(&p, false, 1e-4, 2);
}
