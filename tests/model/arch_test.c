/*
 * Architectures (issue 11): small random-weight GGUFs of every family (the generator is
 * loom_model_synth with the architecture's features switched on), each run on the CPU (the
 * oracle), with tensor parallelism over sim:1/2/3/4/8 and with a layer split over sim:2:
 * every configuration's logits must agree with the CPU's. The CPU's logits are in turn
 * checked against a naive forward pass written independently in arch_ref.c. Features are
 * proven to act (rope_freqs factors equal the matching linear scaling, tied embeddings
 * equal an explicit copy), and keys and tensors loom does not understand are refused by
 * name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/session.h"
#include "model/run-simple.h"
#include "tests/model/arch_cases.h"
#include "tests/model/arch_ref.h"
#include "tests/shim/loom_test.h"

typedef struct config {
    const char *devices;
    loom_split_mode mode;
} config;

static const config CONFIGS[] = {
    {"cpu", LOOM_SPLIT_MODE_NONE},     {"sim:1", LOOM_SPLIT_MODE_TENSOR},
    {"sim:2", LOOM_SPLIT_MODE_TENSOR}, {"sim:3", LOOM_SPLIT_MODE_TENSOR},
    {"sim:4", LOOM_SPLIT_MODE_TENSOR}, {"sim:8", LOOM_SPLIT_MODE_TENSOR},
    {"sim:2", LOOM_SPLIT_MODE_LAYER},
};
#define N_CONFIGS (int)(sizeof CONFIGS / sizeof CONFIGS[0])

#define IDS ARCH_IDS
#define N_PROMPT ARCH_N_PROMPT
#define N_EVAL ARCH_N_EVAL /* a prompt of 5, then 2 single tokens */

/* A synthetic model held in memory. */
typedef struct synth {
    loom_gguf_writer *w;
    void *data;
    size_t size;
    loom_gguf *g;
} synth;

#define base_params arch_base_params

/* Makes the writer; `edit` (optional) may add keys or tensors before it is written. */
static bool synth_open(const loom_synth_params *p, void (*edit)(loom_gguf_writer *w, void *ud),
                       void *ud, synth *s) {
    memset(s, 0, sizeof *s);
    if (loom_model_synth(p, &s->w) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "synth %s: %s", p->arch, loom_last_error());
        return false;
    }
    if (edit) edit(s->w, ud);
    if (loom_gguf_write_memory(s->w, &s->data, &s->size) != LOOM_OK ||
        loom_gguf_open_memory(s->data, s->size, &s->g) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "synth %s: %s", p->arch, loom_last_error());
        return false;
    }
    return true;
}

static void synth_close(synth *s) {
    loom_gguf_free(s->g);
    loom_free(s->data);
    loom_gguf_writer_free(s->w);
}

static loom_session *open_session(const loom_gguf *g, const config *c) {
    loom_session_params p = loom_session_params_default();
    p.devices = c->devices;
    p.split_mode = c->mode;
    p.n_ctx = 64;
    p.threads = 1;
    loom_session *s = NULL;
    if (loom_session_new(NULL, g, &p, &s) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s %s: %s", c->devices, loom_split_mode_name(c->mode),
                       loom_last_error());
        return NULL;
    }
    return s;
}

/* Logits of the last position after each step: [3][V] (prompt, then two tokens). */
static bool run(const loom_gguf *g, const config *c, int64_t V, float *out, int *reductions) {
    loom_session *s = open_session(g, c);
    if (!s) return false;
    loom_status st = loom_session_eval(s, IDS, N_PROMPT, false, out);
    for (int i = N_PROMPT; st == LOOM_OK && i < N_EVAL; i++)
        st = loom_session_eval(s, &IDS[i], 1, false, out + (i - N_PROMPT + 1) * V);
    LOOM_CHECK_MSG(st == LOOM_OK, "%s %s: %s", c->devices, loom_split_mode_name(c->mode),
                   loom_last_error());
    loom_session_stats ss;
    loom_session_get_stats(s, &ss);
    if (reductions) *reductions = ss.last_reductions;
    loom_session_free(s);
    return st == LOOM_OK;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* The CPU against the naive reference, every configuration against the CPU (within tol).
 * The reference computes in double from the dequantised weights: for quantised weights,
 * whose products the CPU takes with quantised activations, it is held to ref_rel times
 * the largest |logit| instead. Returns the reductions per generated token on sim:4. */
static double ref_rel = 0;

static int check_everywhere(const char *what, const loom_gguf *g, double tol) {
    loom_hparams hp;
    if (!LOOM_CHECK_MSG(loom_hparams_from_gguf(g, &hp) == LOOM_OK, "%s: %s", what,
                        loom_last_error()))
        return -1;
    const int64_t V = hp.n_vocab;
    float *ref = calloc((size_t)(3 * V), sizeof *ref), *got = calloc((size_t)(3 * V), sizeof *got);
    float *naive = calloc((size_t)(N_EVAL * V), sizeof *naive);
    int red4 = -1;
    if (run(g, &CONFIGS[0], V, ref, NULL)) {
        if (arch_ref_logits(g, IDS, N_EVAL, naive) == LOOM_OK) {
            double d = max_diff(ref, naive + (N_PROMPT - 1) * V, V);
            d = fmax(d, max_diff(ref + V, naive + N_PROMPT * V, 2 * V));
            fprintf(stderr, "%-10s cpu vs naive reference: max |diff| %.3g\n", what, d);
            double scale = 1;
            for (int64_t i = 0; i < 3 * V; i++)
                scale = fmax(scale, fabs((double)ref[i]));
            double lim = ref_rel > 0 ? ref_rel * scale : tol;
            LOOM_CHECK_MSG(d <= lim, "%s: cpu differs from the naive reference by %g (limit %g)",
                           what, d, lim);
        } else {
            loom_test_fail(__FILE__, __LINE__, "%s: naive reference: %s", what, loom_last_error());
        }
        for (int c = 1; c < N_CONFIGS; c++) {
            int red = 0;
            if (!run(g, &CONFIGS[c], V, got, &red)) continue;
            double d = max_diff(ref, got, 3 * V);
            fprintf(stderr, "%-10s %-5s %-6s: max |diff| vs cpu %.3g, %d reductions per token\n",
                    what, CONFIGS[c].devices, loom_split_mode_name(CONFIGS[c].mode), d, red);
            LOOM_CHECK_MSG(d <= tol, "%s %s %s: logits differ from the cpu's by %g", what,
                           CONFIGS[c].devices, loom_split_mode_name(CONFIGS[c].mode), d);
            if (c == 4) red4 = red;
        }
    }
    free(ref);
    free(got);
    free(naive);
    return red4;
}

static void check_arch(const char *what, const loom_synth_params *p,
                       int want_reductions_per_layer) {
    synth s;
    if (!synth_open(p, NULL, NULL, &s)) return;
    int red = check_everywhere(what, s.g, 2e-4);
    if (want_reductions_per_layer >= 0)
        LOOM_CHECK_MSG(red == want_reductions_per_layer * (int)p->n_layer,
                       "%s: %d reductions per token on sim:4, expected %d per layer", what, red,
                       want_reductions_per_layer);
    synth_close(&s);
}

/* ---------------------------------------------------------------- every architecture */

/* Each case: cpu vs the naive reference, meta(1, 2, 3, 4, 8) and layer split vs cpu, and
 * the reductions per layer per generated token on sim:4. */
LOOM_TEST(arch, every_architecture_everywhere) {
    for (int i = 0; i < arch_case_count(); i++) {
        const arch_case *c = arch_case_get(i);
        void *data = NULL;
        loom_gguf *g = NULL;
        if (!LOOM_CHECK_MSG(arch_case_open(c, &data, &g) == LOOM_OK, "%s: %s", c->name,
                            loom_last_error()))
            continue;
        int red = check_everywhere(c->name, g, 2e-4);
        if (c->reductions_per_layer >= 0)
            LOOM_CHECK_MSG(red == c->reductions_per_layer * (int)c->p.n_layer,
                           "%s: %d reductions per token on sim:4, expected %d per layer x %lld",
                           c->name, red, c->reductions_per_layer, (long long)c->p.n_layer);
        loom_gguf_free(g);
        loom_free(data);
    }
}

/* Every node of every architecture's graph has a name (explain and the scheduler's split
 * inputs print them): not empty, not a bare " (reshaped)" of an unnamed source, and a
 * matmul by a layer's weight is named after it ("attn_q-0"). Prompt and one-token graphs. */
LOOM_TEST(arch, every_node_of_every_architecture_is_named) {
    for (int i = 0; i < arch_case_count(); i++) {
        const arch_case *c = arch_case_get(i);
        void *data = NULL;
        loom_gguf *g = NULL;
        if (!LOOM_CHECK_MSG(arch_case_open(c, &data, &g) == LOOM_OK, "%s: %s", c->name,
                            loom_last_error()))
            continue;
        const config cpu = {"cpu", LOOM_SPLIT_MODE_NONE};
        loom_session *s = open_session(g, &cpu);
        for (int64_t n = 1; s && n <= N_PROMPT; n += N_PROMPT - 1) {
            loom_graph *gf = NULL;
            if (!LOOM_CHECK_MSG(loom_session_plan(s, n, &gf) == LOOM_OK, "%s: %s", c->name,
                                loom_last_error()))
                break;
            int unnamed = 0, layer_mm = 0;
            bool fused = false;
            for (int k = 0; k < gf->n_nodes; k++) {
                const loom_tensor *t = gf->nodes[k];
                if (!t->name[0] || t->name[0] == ' ' || strstr(t->name, "()")) {
                    if (!unnamed++)
                        loom_test_fail(__FILE__, __LINE__,
                                       "%s, batch %lld: node %d (%s) is named '%s'", c->name,
                                       (long long)n, k, loom_op_name(t->op), t->name);
                }
                if (t->op == LOOM_OP_MUL_MAT && !strcmp(t->name, "attn_q-0")) layer_mm++;
                fused = fused || strstr(t->name, "attn_qkv-0") != NULL;
            }
            LOOM_CHECK_MSG(unnamed == 0, "%s, batch %lld: %d unnamed nodes", c->name, (long long)n,
                           unnamed);
            LOOM_CHECK_MSG(layer_mm == 1 || fused, "%s, batch %lld: no matmul named attn_q-0",
                           c->name, (long long)n);
        }
        loom_session_free(s);
        loom_gguf_free(g);
        loom_free(data);
    }
}

/* The attention without flash attention (mul_mat + soft_max with mask and sinks) agrees
 * with the naive reference too; gemma2's score softcap needs flash attention and says so. */
LOOM_TEST(arch, every_architecture_without_flash_attention) {
    for (int i = 0; i < arch_case_count(); i++) {
        const arch_case *c = arch_case_get(i);
        void *data = NULL;
        size_t size = 0;
        loom_gguf *g = NULL;
        loom_model *m = NULL;
        loom_kv_cache *kv = NULL;
        loom_backend_t cpu = loom_cpu_backend_new(1);
        if (!LOOM_CHECK_MSG(arch_case_write(c, &data, &size) == LOOM_OK &&
                                loom_gguf_open_memory(data, size, &g) == LOOM_OK &&
                                loom_model_load(g, NULL, &m) == LOOM_OK &&
                                loom_kv_cache_new(m, 64, LOOM_TYPE_F32, NULL, &kv) == LOOM_OK,
                            "%s: %s", c->name, loom_last_error()))
            goto next;
        m->no_flash_attn = true;
        const int64_t V = m->hp.n_vocab;
        float *got = calloc((size_t)(N_EVAL * V), sizeof *got),
              *want = calloc((size_t)(N_EVAL * V), sizeof *want);
        loom_status st = loom_model_eval_simple(m, kv, cpu, IDS, N_EVAL, 0, true, got);
        if (m->hp.attn_softcap > 0) {
            LOOM_CHECK_MSG(st != LOOM_OK, "%s: softcap without flash attention accepted", c->name);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), "softcapping needs flash attention");
        } else if (LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", c->name, loom_last_error()) &&
                   LOOM_CHECK_MSG(arch_ref_logits(g, IDS, N_EVAL, want) == LOOM_OK, "%s",
                                  loom_last_error())) {
            double d = max_diff(got, want, N_EVAL * V);
            fprintf(stderr, "%-10s no flash attention, cpu vs naive reference: max |diff| %.3g\n",
                    c->name, d);
            LOOM_CHECK_MSG(d <= 2e-4,
                           "%s: no flash attention differs from the naive reference by %g", c->name,
                           d);
            /* only the last position's logits: the last layer runs its query, output
             * projection and FFN on that row alone; same logits as the full batch's last */
            float *last = calloc((size_t)V, sizeof *last);
            st = loom_model_eval_simple(m, kv, cpu, IDS, N_EVAL, 0, false, last);
            if (LOOM_CHECK_MSG(st == LOOM_OK, "%s last only: %s", c->name, loom_last_error())) {
                d = max_diff(last, want + (N_EVAL - 1) * V, V);
                LOOM_CHECK_MSG(d <= 2e-4, "%s: last-only logits differ from the reference by %g",
                               c->name, d);
            }
            free(last);
        }
        free(got);
        free(want);
    next:
        loom_kv_cache_free(kv);
        loom_model_free(m);
        loom_backend_free(cpu);
        loom_gguf_free(g);
        loom_free(data);
    }
}

/* Quantised matrices (Q8_0): the splits keep whole blocks, and meta(N) still equals one
 * device (the naive reference dequantises the same weights). At most 6 layers: the CPU
 * quantises activations to Q8_0 for these products, so a last-bit difference in a partial
 * sum's order can move one activation by a quantisation step, and random-weight networks
 * amplify that with depth (llama at 22 layers: 7e-3 on sim:3; gemma2 at 26: 0.17). */
LOOM_TEST(arch, every_architecture_with_q8_0_weights) {
    for (int i = 0; i < arch_case_count(); i++) {
        arch_case c = *arch_case_get(i);
        c.p.wtype = LOOM_TYPE_Q8_0;
        if (c.p.n_layer > 6) c.p.n_layer = 6;
        void *data = NULL;
        loom_gguf *g = NULL;
        if (!LOOM_CHECK_MSG(arch_case_open(&c, &data, &g) == LOOM_OK, "%s: %s", c.name,
                            loom_last_error()))
            continue;
        char what[64];
        snprintf(what, sizeof what, "%s-q8", c.name);
        ref_rel = 3e-2; /* Q8_0 x Q8_0 products */
        check_everywhere(what, g, 5e-4);
        ref_rel = 0;
        loom_gguf_free(g);
        loom_free(data);
    }
}

/* ---------------------------------------------------------------- llama family */

LOOM_TEST(arch, mistral_and_mixtral) {
    loom_synth_params p = base_params("mistral");
    check_arch("mistral", &p, 2);
    p = base_params("mixtral");
    p.n_expert = 4;
    p.n_expert_used = 2;
    check_arch("mixtral", &p, -1);
}

/* ---------------------------------------------------------------- gemma family */

/* With an output.weight the logits are split over the devices by vocabulary, and the final
 * softcap runs on the split logits. */
LOOM_TEST(arch, gemma2_softcap_on_split_logits) {
    loom_synth_params p = base_params("gemma2");
    p.n_swa = 3;
    check_arch("gemma2-out", &p, 2);
}

LOOM_TEST(arch, sliding_window_changes_the_result) {
    loom_synth_params p = base_params("gemma2");
    p.tied = true;
    const int64_t V = p.n_vocab;
    float *a = calloc((size_t)(3 * V), sizeof *a), *b = calloc((size_t)(3 * V), sizeof *b);
    synth s1, s2;
    p.n_swa = 3;
    bool ok = synth_open(&p, NULL, NULL, &s1);
    p.n_swa = 4096;
    if (ok && synth_open(&p, NULL, NULL, &s2)) {
        LOOM_REQUIRE(run(s1.g, &CONFIGS[0], V, a, NULL));
        LOOM_REQUIRE(run(s2.g, &CONFIGS[0], V, b, NULL));
        /* a window of 3 hides positions the 4096 one shows (7 tokens run) */
        LOOM_CHECK_MSG(max_diff(a, b, 3 * V) > 1e-3, "window 3 vs 4096: %g", max_diff(a, b, 3 * V));
        synth_close(&s2);
    }
    synth_close(&s1);
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- MoE variants */

LOOM_TEST(arch, moe_with_expert_biases) {
    loom_synth_params p = base_params("mixtral");
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_ff = 32;
    p.biases = true;
    check_arch("mixtral-b", &p, -1);
}

/* ---------------------------------------------------------------- gpt-oss */

/* Sinks, alternating windows, YaRN, router and expert biases (ADD_ID), clamped SwiGLU;
 * F32 experts here (the real files' MXFP4 comes with that type). */
LOOM_TEST(arch, gptoss_f16_experts) {
    const arch_case *c = NULL;
    for (int i = 0; i < arch_case_count(); i++)
        if (strcmp(arch_case_get(i)->name, "gpt-oss") == 0) c = arch_case_get(i);
    LOOM_REQUIRE(c != NULL);
    arch_case f16 = *c;
    f16.p.wtype = LOOM_TYPE_F16;
    void *data = NULL;
    size_t size = 0;
    loom_gguf *g = NULL;
    LOOM_REQUIRE(arch_case_write(&f16, &data, &size) == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    check_everywhere("gpt-oss-f16", g, 1e-3);
    loom_gguf_free(g);
    loom_free(data);
}

/* ---------------------------------------------------------------- features act */

static void cpu_logits(const loom_gguf *g, int64_t V, float *out) {
    LOOM_REQUIRE(run(g, &CONFIGS[0], V, out, NULL));
}

static void add_linear_scaling(loom_gguf_writer *w, void *ud) {
    (void)ud;
    loom_gguf_set_str(w, "llama.rope.scaling.type", "linear");
    loom_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f);
}

static void add_uniform_rope_freqs(loom_gguf_writer *w, void *ud) {
    int64_t n = *(int64_t *)ud;
    float f[64];
    for (int64_t i = 0; i < n; i++)
        f[i] = 4.0f;
    loom_gguf_add_tensor(w, "rope_freqs.weight", LOOM_TYPE_F32, 1, (int64_t[]){n}, f);
}

/* theta / freq_factor with every factor 4 is theta * (1/4): the same as linear scaling by
 * 4; and the factors change the logits (they are not ignored). */
LOOM_TEST(arch, rope_freqs_divide_the_frequencies) {
    loom_synth_params p = base_params("llama");
    const int64_t V = p.n_vocab, half = p.n_embd / p.n_head / 2;
    float *a = calloc((size_t)(3 * V), sizeof *a), *b = calloc((size_t)(3 * V), sizeof *b);
    float *c = calloc((size_t)(3 * V), sizeof *c);
    synth s1, s2, s3;
    int64_t n = half;
    if (synth_open(&p, add_linear_scaling, NULL, &s1) &&
        synth_open(&p, add_uniform_rope_freqs, &n, &s2) && synth_open(&p, NULL, NULL, &s3)) {
        cpu_logits(s1.g, V, a);
        cpu_logits(s2.g, V, b);
        cpu_logits(s3.g, V, c);
        LOOM_CHECK_MSG(max_diff(a, b, 3 * V) < 1e-5, "factors 4 vs linear 4: %g",
                       max_diff(a, b, 3 * V));
        LOOM_CHECK_MSG(max_diff(a, c, 3 * V) > 1e-3, "rope scaling changed nothing: %g",
                       max_diff(a, c, 3 * V));
        check_everywhere("rope-x4", s2.g, 2e-4);
    }
    synth_close(&s1);
    synth_close(&s2);
    synth_close(&s3);
    free(a);
    free(b);
    free(c);
}

static void add_output_copy(loom_gguf_writer *w, void *ud) {
    const loom_gguf *tied = ud;
    int64_t ti = loom_gguf_find_tensor(tied, "token_embd.weight");
    int64_t ne[4];
    loom_gguf_tensor_ne(tied, ti, ne);
    loom_gguf_add_tensor(w, "output.weight", LOOM_TYPE_F32, 2, ne, loom_gguf_tensor_data(tied, ti));
}

LOOM_TEST(arch, tied_embeddings_equal_an_explicit_copy) {
    loom_synth_params p = base_params("llama");
    p.tied = true;
    const int64_t V = p.n_vocab;
    float *a = calloc((size_t)(3 * V), sizeof *a), *b = calloc((size_t)(3 * V), sizeof *b);
    synth tied, copy;
    if (synth_open(&p, NULL, NULL, &tied) && synth_open(&p, add_output_copy, tied.g, &copy)) {
        LOOM_CHECK(loom_gguf_find_tensor(tied.g, "output.weight") < 0);
        LOOM_CHECK(loom_gguf_find_tensor(copy.g, "output.weight") >= 0);
        cpu_logits(tied.g, V, a);
        cpu_logits(copy.g, V, b);
        LOOM_CHECK_MSG(max_diff(a, b, 3 * V) == 0.0, "tied vs copy: %g", max_diff(a, b, 3 * V));
        synth_close(&copy);
    }
    synth_close(&tied);
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- refusals */

typedef struct kv_edit {
    const char *key, *str;
    float f;
} kv_edit;

static void add_key(loom_gguf_writer *w, void *ud) {
    const kv_edit *e = ud;
    if (e->str)
        loom_gguf_set_str(w, e->key, e->str);
    else
        loom_gguf_set_f32(w, e->key, e->f);
}

static void expect_refused(const char *arch, const kv_edit *e, const char *needle) {
    loom_synth_params p = base_params(arch);
    synth s;
    if (!synth_open(&p, add_key, (void *)e, &s)) return;
    loom_hparams hp;
    loom_model *m = NULL;
    loom_status st = loom_hparams_from_gguf(s.g, &hp);
    if (st == LOOM_OK) st = loom_model_load(s.g, NULL, &m);
    LOOM_CHECK_MSG(st != LOOM_OK, "%s with %s: accepted", arch, e->key);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), needle);
    loom_model_free(m);
    synth_close(&s);
}

LOOM_TEST(arch, keys_that_change_the_math_are_refused_by_name) {
    expect_refused("llama", &(kv_edit){"llama.attention.sliding_window", NULL, 4096.0f},
                   "llama.attention.sliding_window");
    expect_refused("llama", &(kv_edit){"llama.attention.layer_norm_epsilon", NULL, 1e-5f},
                   "llama.attention.layer_norm_epsilon");
    expect_refused("qwen2", &(kv_edit){"qwen2.rope.scaling.type", "longrope", 0},
                   "qwen2.rope.scaling.type' = 'longrope'");
    expect_refused("qwen2", &(kv_edit){"qwen2.rope.scaling.type", "yarn", 0},
                   "qwen2.rope.scaling.original_context_length");
    expect_refused("llama", &(kv_edit){"llama.rope.scaling.type", "llama3", 0},
                   "rope_freqs.weight");
    expect_refused("llama", &(kv_edit){"llama.attention.value_length", NULL, 8.0f}, "value_length");
    /* gemma3 has no default window */
    loom_synth_params g3 = base_params("gemma3");
    synth s3;
    if (synth_open(&g3, NULL, NULL, &s3)) {
        loom_hparams hp;
        LOOM_CHECK(loom_hparams_from_gguf(s3.g, &hp) == LOOM_ERR_FORMAT);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "gemma3.attention.sliding_window");
        synth_close(&s3);
    }
    /* keys without effect are accepted (no false alarms on real files) */
    loom_synth_params p = base_params("llama");
    synth s;
    kv_edit ok = {"llama.rope.scaling.finetuned", "x", 0};
    if (synth_open(&p, add_key, &ok, &s)) {
        loom_hparams hp;
        LOOM_CHECK_MSG(loom_hparams_from_gguf(s.g, &hp) == LOOM_OK, "%s", loom_last_error());
        synth_close(&s);
    }
}

static void add_stray_tensor(loom_gguf_writer *w, void *ud) {
    (void)ud;
    float f[64] = {0};
    loom_gguf_add_tensor(w, "blk.0.ffn_gate_inp_shexp.weight", LOOM_TYPE_F32, 1, (int64_t[]){64},
                         f);
}

LOOM_TEST(arch, tensors_loom_would_ignore_are_refused_by_name) {
    loom_synth_params p = base_params("llama"); /* dense: a shared-expert gate means nothing */
    synth s;
    if (!synth_open(&p, add_stray_tensor, NULL, &s)) return;
    loom_model *m = NULL;
    LOOM_CHECK(loom_model_load(s.g, NULL, &m) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "blk.0.ffn_gate_inp_shexp.weight");
    loom_model_free(m);
    synth_close(&s);
}

LOOM_TEST(arch, single_kv_head_with_fused_qkv) {
    loom_synth_params p = base_params("llama");
    p.n_head_kv = 1;
    p.fused_qkv = true;
    check_arch("mqa-fused", &p, -1);
}
