/*
 * The architectures' hyperparameters as hostile input (issue #29 item 8): sliding windows
 * (negative, 0, larger than the context, INT64_MAX), rope and YaRN floats (NaN, Inf, 0,
 * negative), gemma2's softcaps, expert counts (0, used > total, huge), head counts that do
 * not divide, n_embd 0, a context whose KV cache overflows, and longrope factor arrays of the
 * wrong length. Each is refused at load with the key (or tensor) named, or gives the result
 * of an equivalent sane model: a window at least the context equals no window at all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/session.h"
#include "model/arch-impl.h"
#include "tests/shim/loom_test.h"

typedef enum { K_F32, K_U64, K_I64, K_STR } kind;

typedef struct kv {
    const char *key;
    kind k;
    double f;
    int64_t i;
    const char *s;
} kv;

#define F(key, v)                                                                                  \
    { key, K_F32, v, 0, NULL }
#define U(key, v)                                                                                  \
    { key, K_U64, 0, (int64_t)(v), NULL }
#define I(key, v)                                                                                  \
    { key, K_I64, 0, (int64_t)(v), NULL }
#define S(key, v)                                                                                  \
    { key, K_STR, 0, 0, v }

typedef struct hcase {
    const char *arch;
    kv set[5];        /* up to 5 keys, ending at a NULL key */
    const char *want; /* in the error (NULL: must load) */
} hcase;

static loom_synth_params tiny(const char *arch) {
    loom_synth_params p = loom_synth_params_default();
    p.arch = arch;
    p.n_vocab = 300;
    p.n_embd = 32;
    p.n_layer = 2;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 64;
    p.n_ctx = 64;
    if (strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0 || strcmp(arch, "phi3") == 0 ||
        strcmp(arch, "gpt-oss") == 0)
        p.n_swa = 4;
    if (strcmp(arch, "gpt-oss") == 0 || strcmp(arch, "mixtral") == 0) {
        p.n_expert = 4;
        p.n_expert_used = 2;
    }
    if (strcmp(arch, "gemma3") == 0) p.qk_norm = true;
    if (strcmp(arch, "phi3") == 0) {
        p.fused_gate_up = true;
        p.fused_qkv = true;
        p.longrope = true;
    }
    return p;
}

/* The tiny model of arch with the keys set, opened from memory (data freed by the caller). */
static loom_gguf *open_with(const char *arch, const kv *set, void **data) {
    loom_synth_params sp = tiny(arch);
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&sp, &w)) return NULL;
    for (; set && set->key; set++) {
        switch (set->k) {
        case K_F32:
            loom_gguf_set_f32(w, set->key, (float)set->f);
            break;
        case K_U64:
            loom_gguf_set_u64(w, set->key, (uint64_t)set->i);
            break;
        case K_I64:
            loom_gguf_set_i64(w, set->key, set->i);
            break;
        case K_STR:
            loom_gguf_set_str(w, set->key, set->s);
            break;
        }
    }
    size_t size = 0;
    loom_gguf *g = NULL;
    if (loom_gguf_write_memory(w, data, &size) || loom_gguf_open_memory(*data, size, &g)) g = NULL;
    loom_gguf_writer_free(w);
    return g;
}

/* Loads hyperparameters and model; returns the status, with the model freed. */
static loom_status load(loom_gguf *g) {
    loom_hparams hp;
    loom_status st = loom_hparams_from_gguf(g, &hp);
    if (st) return st;
    loom_model *m = NULL;
    st = loom_model_load(g, NULL, &m);
    loom_model_free(m);
    return st;
}

static void run_cases(const hcase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const hcase *c = &cases[i];
        void *data = NULL;
        loom_gguf *g = open_with(c->arch, c->set, &data);
        LOOM_REQUIRE(g != NULL);
        const loom_status st = load(g);
        if (c->want) {
            LOOM_CHECK_MSG(st != LOOM_OK, "%s: %s (%g / %lld) accepted", c->arch, c->set[0].key,
                           c->set[0].f, (long long)c->set[0].i);
            if (st != LOOM_OK) LOOM_CHECK_STR_CONTAINS(loom_last_error(), c->want);
        } else {
            LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s refused: %s", c->arch, c->set[0].key,
                           loom_last_error());
        }
        loom_gguf_free(g);
        loom_free(data);
    }
}

#define YARN(k, v)                                                                                 \
    {                                                                                              \
        "llama",                                                                                   \
            {S("llama.rope.scaling.type", "yarn"), F("llama.rope.scaling.factor", 4.0),            \
             U("llama.rope.scaling.original_context_length", 16), F(k, v)},                        \
            k                                                                                      \
    }

LOOM_TEST(hostile_hparams, rope_and_yarn_floats_refused_naming_key) {
    static const hcase cases[] = {
        {"llama", {F("llama.rope.scaling.attn_factor", NAN)}, "llama.rope.scaling.attn_factor"},
        {"llama",
         {F("llama.rope.scaling.attn_factor", INFINITY)},
         "llama.rope.scaling.attn_factor"},
        {"llama", {F("llama.rope.scaling.attn_factor", 0.0)}, "llama.rope.scaling.attn_factor"},
        {"llama", {F("llama.rope.scaling.attn_factor", -1.0)}, "llama.rope.scaling.attn_factor"},
        YARN("llama.rope.scaling.yarn_ext_factor", NAN),
        YARN("llama.rope.scaling.yarn_ext_factor", INFINITY),
        YARN("llama.rope.scaling.yarn_ext_factor", -1.0),
        YARN("llama.rope.scaling.yarn_attn_factor", NAN),
        YARN("llama.rope.scaling.yarn_attn_factor", 0.0),
        YARN("llama.rope.scaling.yarn_attn_factor", -2.0),
        YARN("llama.rope.scaling.yarn_beta_fast", NAN),
        YARN("llama.rope.scaling.yarn_beta_fast", 0.0),
        YARN("llama.rope.scaling.yarn_beta_fast", -32.0),
        YARN("llama.rope.scaling.yarn_beta_fast", INFINITY),
        YARN("llama.rope.scaling.yarn_beta_slow", NAN),
        YARN("llama.rope.scaling.yarn_beta_slow", 0.0),
        YARN("llama.rope.scaling.yarn_beta_slow", -1.0),
        {"llama",
         {S("llama.rope.scaling.type", "yarn"), F("llama.rope.scaling.factor", 0.0),
          U("llama.rope.scaling.original_context_length", 16)},
         "llama.rope.scaling.factor"},
        {"llama",
         {S("llama.rope.scaling.type", "yarn"), F("llama.rope.scaling.factor", 4.0),
          I("llama.rope.scaling.original_context_length", -5)},
         "llama.rope.scaling.original_context_length"},
        {"gemma2",
         {F("gemma2.attention.logit_softcapping", NAN)},
         "gemma2.attention.logit_softcapping"},
        {"gemma2",
         {F("gemma2.attention.logit_softcapping", -50.0)},
         "gemma2.attention.logit_softcapping"},
        {"gemma2",
         {F("gemma2.attention.logit_softcapping", INFINITY)},
         "gemma2.attention.logit_softcapping"},
        {"gemma2", {F("gemma2.final_logit_softcapping", NAN)}, "gemma2.final_logit_softcapping"},
        {"gemma2", {F("gemma2.final_logit_softcapping", -30.0)}, "gemma2.final_logit_softcapping"},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    /* sane values still load: YaRN's defaults, and in-range explicit ones */
    static const hcase good[] = {
        YARN("llama.rope.scaling.yarn_ext_factor", 0.0),
        YARN("llama.rope.scaling.yarn_beta_fast", 16.0),
        {"llama", {F("llama.rope.scaling.attn_factor", 1.0)}, NULL},
        {"gemma2", {F("gemma2.final_logit_softcapping", 0.0)}, NULL},
    };
    hcase g2[sizeof good / sizeof good[0]];
    memcpy(g2, good, sizeof good);
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        g2[i].want = NULL;
    run_cases(g2, sizeof g2 / sizeof g2[0]);
}

LOOM_TEST(hostile_hparams, counts_refused_naming_what_is_wrong) {
    static const hcase cases[] = {
        {"llama", {U("llama.embedding_length", 0)}, "n_embd 0"},
        {"llama",
         {U("llama.attention.head_count", 3), U("llama.attention.head_count_kv", 2)},
         "n_head 3, n_head_kv 2 (n_head must be a multiple)"},
        {"llama", {U("llama.attention.head_count_kv", 0)}, "n_head_kv 0"},
        {"llama", {U("llama.block_count", 0)}, "n_layer 0"},
        {"mixtral", {U("mixtral.expert_used_count", 5)}, "expert_used_count 5 of 4 experts"},
        {"mixtral", {U("mixtral.expert_used_count", 0)}, "expert_used_count 0 of 4 experts"},
        {"mixtral", {U("mixtral.expert_count", 1ull << 40)}, "1099511627776 experts"},
        {"mixtral",
         {U("mixtral.expert_used_count", 1ull << 40)},
         "expert_used_count 1099511627776 of 4 experts"},
        {"mixtral", {U("mixtral.expert_count", 0)}, "missing tensor"},
        {"gpt-oss",
         {I("gpt-oss.attention.sliding_window", -1)},
         "gpt-oss.attention.sliding_window -1"},
        {"phi3", {I("phi3.attention.sliding_window", -4)}, "phi3.attention.sliding_window -4"},
        {"gemma2",
         {I("gemma2.attention.sliding_window", INT64_MIN)},
         "gemma2.attention.sliding_window -9223372036854775808"},
        {"gemma3",
         {I("gemma3.attention.sliding_window_pattern", 0)},
         "gemma3.attention.sliding_window_pattern 0"},
        /* attention sinks of 2 heads where the (consistently rewritten) heads are 4 */
        {"gpt-oss",
         {U("gpt-oss.attention.head_count", 4), U("gpt-oss.attention.head_count_kv", 2),
          U("gpt-oss.attention.key_length", 8), U("gpt-oss.attention.value_length", 8)},
         "blk.0.attn_sinks.weight"},
        /* longrope factors whose length is not n_rot / 2 (4 here, the file holds 8) */
        {"phi3", {U("phi3.rope.dimension_count", 8)}, "rope_factors_long.weight"},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* The logits of tokens 5, 6, ..., (n of them) on the CPU, from a session over g. */
static loom_status logits_of(loom_gguf *g, int64_t n_ctx, int n, float *out) {
    loom_session_params p = loom_session_params_default();
    p.n_ctx = n_ctx;
    p.threads = 1;
    loom_session *s = NULL;
    loom_status st = loom_session_new(NULL, g, &p, &s);
    if (st) return st;
    int32_t toks[16];
    for (int i = 0; i < n; i++)
        toks[i] = 5 + i;
    st = loom_session_eval(s, toks, n, false, out);
    loom_session_free(s);
    return st;
}

/* A sliding window at least the context (up to INT64_MAX) is no window: the logits equal a
 * model without one (window 0), on every architecture with windows. */
LOOM_TEST(hostile_hparams, window_past_context_equals_no_window) {
    static const char *const archs[] = {"phi3", "gpt-oss", "gemma2", "gemma3"};
    static const int64_t windows[] = {12, 64, 1000000, INT64_MAX};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char key[64];
        snprintf(key, sizeof key, "%s.attention.sliding_window", archs[a]);
        float ref[300], got[300];
        void *data = NULL;
        const kv none[] = {I(key, 0), {NULL, K_F32, 0, 0, NULL}};
        loom_gguf *g = open_with(archs[a], none, &data);
        LOOM_REQUIRE(g != NULL);
        loom_status st = logits_of(g, 12, 12, ref);
        LOOM_CHECK_MSG(st == LOOM_OK, "%s window 0: %s", archs[a], loom_last_error());
        loom_gguf_free(g);
        loom_free(data);
        if (st) continue;
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
            const kv set[] = {I(key, windows[w]), {NULL, K_F32, 0, 0, NULL}};
            g = open_with(archs[a], set, &data);
            LOOM_REQUIRE(g != NULL);
            st = logits_of(g, 12, 12, got);
            LOOM_CHECK_MSG(st == LOOM_OK, "%s window %lld: %s", archs[a], (long long)windows[w],
                           loom_last_error());
            if (st == LOOM_OK) {
                double worst = 0;
                for (int i = 0; i < 300; i++)
                    worst = fmax(worst, fabs((double)got[i] - ref[i]));
                LOOM_CHECK_MSG(worst <= 1e-4, "%s window %lld: logits differ by %g from no window",
                               archs[a], (long long)windows[w], worst);
            }
            loom_gguf_free(g);
            loom_free(data);
        }
    }
}

/* The model's own context (n_ctx -1) of 2^62 positions: the KV cache size overflows or does
 * not fit, refused before anything is allocated. */
LOOM_TEST(hostile_hparams, huge_training_context_refused_at_session) {
    static const int64_t ctxs[] = {1ll << 62, INT64_MAX, 1ll << 40};
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
        const kv set[] = {U("llama.context_length", ctxs[i]), {NULL, K_F32, 0, 0, NULL}};
        void *data = NULL;
        loom_gguf *g = open_with("llama", set, &data);
        LOOM_REQUIRE(g != NULL);
        loom_session_params p = loom_session_params_default();
        p.n_ctx = -1;
        p.threads = 1;
        loom_session *s = NULL;
        const loom_status st = loom_session_new(NULL, g, &p, &s);
        LOOM_CHECK_MSG(st != LOOM_OK, "context %lld accepted", (long long)ctxs[i]);
        LOOM_CHECK(s == NULL);
        char want[64];
        snprintf(want, sizeof want, "%lld", (long long)ctxs[i]);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
        loom_session_free(s);
        loom_gguf_free(g);
        loom_free(data);
    }
}

/* A block-type weight whose row length is not a multiple of its block (the header patched
 * after writing, as a hostile file would have it) is refused at open, naming the tensor, the
 * type and the block size, for every block type. */
LOOM_TEST(hostile_hparams, block_type_row_not_multiple_refused_at_open) {
    static const loom_type types[] = {
        LOOM_TYPE_Q4_0,   LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_Q8_0,
        LOOM_TYPE_Q2_K,   LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_Q6_K,
        LOOM_TYPE_IQ4_NL, LOOM_TYPE_IQ4_XS, LOOM_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const int64_t blk = loom_blck_size(types[i]);
        const int64_t ne[2] = {2 * blk, 2};
        void *bytes = calloc(1, loom_row_size(types[i], 2 * blk) * 2);
        loom_gguf_writer *w = loom_gguf_writer_new();
        LOOM_REQUIRE(w && bytes);
        LOOM_REQUIRE(loom_gguf_add_tensor(w, "blk.0.attn_q.weight", types[i], 2, ne, bytes) ==
                     LOOM_OK);
        void *data = NULL;
        size_t size = 0;
        LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
        /* ne[0] follows the name and the dimension count: make it one element short */
        const char *name = "blk.0.attn_q.weight";
        uint8_t *p = NULL;
        for (size_t k = 0; k + strlen(name) <= size && !p; k++)
            if (memcmp((uint8_t *)data + k, name, strlen(name)) == 0)
                p = (uint8_t *)data + k + strlen(name) + 4;
        LOOM_REQUIRE(p != NULL);
        const uint64_t odd = (uint64_t)(2 * blk - 1);
        memcpy(p, &odd, 8);
        loom_gguf *g = NULL;
        LOOM_CHECK_EQ_INT(loom_gguf_open_memory(data, size, &g), LOOM_ERR_FORMAT);
        char want[160];
        snprintf(want, sizeof want,
                 "gguf: tensor 'blk.0.attn_q.weight': ne[0] = %lld is not a multiple of the %s "
                 "block size %lld",
                 (long long)odd, loom_type_name(types[i]), (long long)blk);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
        loom_gguf_free(g);
        loom_free(data);
        loom_gguf_writer_free(w);
        free(bytes);
    }
}
