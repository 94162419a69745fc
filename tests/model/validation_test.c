/*
 * Model files as hostile input (issue 9): every hyperparameter the graph multiplies is
 * bounded and its products checked (n_head * head_dim used to wrap), float hyperparameters
 * must be finite and in range (rope base 0 or inf, NaN scaling, eps 0 were accepted), the
 * vocabulary size must fit int32, the architecture string may not hide a NUL, special token
 * ids below -1 are refused (a negative 64-bit BOS used to become some other token), and a
 * tokenizer whose size differs from the model's token_embd/output rows is refused when the
 * session is created (generated ids the tokenizer lacks used to print nothing).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/session.h"
#include "model/arch-impl.h"
#include "tests/shim/loom_test.h"

static loom_synth_params tiny(void) {
    loom_synth_params p = loom_synth_params_default();
    p.n_vocab = 300;
    p.n_embd = 32;
    p.n_layer = 1;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 64;
    p.n_ctx = 64;
    return p;
}

typedef void (*edit_fn)(loom_gguf_writer *w, const void *arg);

/* The tiny synthetic model with edit applied, opened from memory (data freed by the caller). */
static loom_gguf *open_edited(edit_fn edit, const void *arg, void **data) {
    loom_synth_params sp = tiny();
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&sp, &w)) return NULL;
    if (edit) edit(w, arg);
    size_t size = 0;
    loom_gguf *g = NULL;
    if (loom_gguf_write_memory(w, data, &size) || loom_gguf_open_memory(*data, size, &g)) g = NULL;
    loom_gguf_writer_free(w);
    return g;
}

typedef struct fcase {
    const char *key;
    double value;
} fcase;

static void set_f32(loom_gguf_writer *w, const void *arg) {
    const fcase *c = arg;
    loom_gguf_set_f32(w, c->key, (float)c->value);
}

LOOM_TEST(validation, float_hyperparameters) {
    const fcase bad[] = {
        {"llama.rope.freq_base", 0.0},
        {"llama.rope.freq_base", INFINITY},
        {"llama.rope.freq_base", NAN},
        {"llama.rope.freq_base", -10000.0},
        {"llama.rope.scaling.factor", NAN},
        {"llama.rope.scaling.factor", -2.0},
        {"llama.rope.scaling.factor", INFINITY},
        {"llama.attention.layer_norm_rms_epsilon", 0.0},
        {"llama.attention.layer_norm_rms_epsilon", NAN},
        {"llama.attention.layer_norm_rms_epsilon", -1e-5},
        {"llama.attention.layer_norm_rms_epsilon", INFINITY},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *data = NULL;
        loom_gguf *g = open_edited(set_f32, &bad[i], &data);
        LOOM_REQUIRE(g != NULL);
        loom_hparams hp;
        loom_status st = loom_hparams_from_gguf(g, &hp);
        LOOM_CHECK_MSG(st == LOOM_ERR_FORMAT, "%s = %g accepted", bad[i].key, bad[i].value);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i].key);
        loom_gguf_free(g);
        loom_free(data);
    }
    /* in-range values still load, and scaling factor 0 means none */
    const fcase good[] = {{"llama.rope.freq_base", 500000.0},
                          {"llama.rope.scaling.factor", 0.0},
                          {"llama.rope.scaling.factor", 4.0},
                          {"llama.attention.layer_norm_rms_epsilon", 1e-6}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        void *data = NULL;
        loom_gguf *g = open_edited(set_f32, &good[i], &data);
        LOOM_REQUIRE(g != NULL);
        loom_hparams hp;
        LOOM_CHECK_MSG(loom_hparams_from_gguf(g, &hp) == LOOM_OK, "%s = %g: %s", good[i].key,
                       good[i].value, loom_last_error());
        if (i == 1) LOOM_CHECK(hp.rope_freq_scale == 1.0f);
        if (i == 2) LOOM_CHECK(hp.rope_freq_scale == 0.25f);
        loom_gguf_free(g);
        loom_free(data);
    }
}

typedef struct icase {
    const char *key;
    uint64_t value;
    const char *want; /* in the message */
} icase;

static void set_u64(loom_gguf_writer *w, const void *arg) {
    const icase *c = arg;
    loom_gguf_set_u64(w, c->key, c->value);
}

static void set_heads_that_wrap(loom_gguf_writer *w, const void *arg) {
    (void)arg;
    /* 2^32 heads of 2^32: the product is 2^64, which wrapped to 0 */
    loom_gguf_set_u64(w, "llama.attention.head_count", 1ull << 32);
    loom_gguf_set_u64(w, "llama.attention.head_count_kv", 1ull << 32);
    loom_gguf_set_u64(w, "llama.attention.key_length", 1ull << 32);
    loom_gguf_set_u64(w, "llama.rope.dimension_count", 2);
}

LOOM_TEST(validation, integer_hyperparameters_checked) {
    const icase bad[] = {
        {"llama.attention.key_length", 1ull << 62, "head_dim 4611686018427387904"},
        {"llama.attention.key_length", 1ull << 19, "n_head 2 x head_dim 524288"},
        {"llama.embedding_length", 1ull << 40, "n_embd 1099511627776"},
        {"llama.feed_forward_length", 1ull << 40, "feed_forward_length 1099511627776"},
        {"llama.context_length", 0, "context 0"},
        {"llama.vocab_size", 1ull << 40, "vocabulary of 1099511627776 tokens"},
        {"llama.expert_count", 1ull << 20, "1048576 experts"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *data = NULL;
        loom_gguf *g = open_edited(set_u64, &bad[i], &data);
        LOOM_REQUIRE(g != NULL);
        loom_hparams hp;
        LOOM_CHECK_MSG(loom_hparams_from_gguf(g, &hp) == LOOM_ERR_FORMAT, "%s = %llu accepted",
                       bad[i].key, (unsigned long long)bad[i].value);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i].want);
        loom_gguf_free(g);
        loom_free(data);
    }
    /* a dense model with a stray expert_used_count: ignored, not a huge graph (found by
     * tests/fuzz/model_fuzz.c) */
    const icase stray = {"llama.expert_used_count", 1ull << 40, ""};
    void *data = NULL;
    loom_gguf *g = open_edited(set_u64, &stray, &data);
    LOOM_REQUIRE(g != NULL);
    loom_hparams shp;
    LOOM_CHECK(loom_hparams_from_gguf(g, &shp) == LOOM_OK);
    LOOM_CHECK(shp.n_expert == 0 && shp.n_expert_used == 0);
    loom_gguf_free(g);
    loom_free(data);

    g = open_edited(set_heads_that_wrap, NULL, &data);
    LOOM_REQUIRE(g != NULL);
    loom_hparams hp;
    LOOM_CHECK(loom_hparams_from_gguf(g, &hp) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "n_head 4294967296 x head_dim 4294967296");
    loom_gguf_free(g);
    loom_free(data);
}

LOOM_TEST(validation, architecture_with_nul_refused) {
    /* the writer takes C strings: write the one key by hand */
    uint8_t buf[96], *p = buf;
    uint32_t v3 = 3, type = 8 /* string */;
    uint64_t n_t = 0, n_kv = 1, klen = 20, vlen = 12;
    memcpy(p, "GGUF", 4), p += 4;
    memcpy(p, &v3, 4), p += 4;
    memcpy(p, &n_t, 8), p += 8;
    memcpy(p, &n_kv, 8), p += 8;
    memcpy(p, &klen, 8), p += 8;
    memcpy(p, "general.architecture", 20), p += 20;
    memcpy(p, &type, 4), p += 4;
    memcpy(p, &vlen, 8), p += 8;
    memcpy(p, "llama\0mixtr", 12), p += 12;
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(buf, (size_t)(p - buf), &g) == LOOM_OK);
    loom_hparams hp;
    LOOM_CHECK(loom_hparams_from_gguf(g, &hp) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "contains a NUL byte at 5");
    loom_gguf_free(g);
}

static void set_i64(loom_gguf_writer *w, const void *arg) {
    const icase *c = arg;
    loom_gguf_set_i64(w, c->key, (int64_t)c->value);
}

LOOM_TEST(validation, negative_special_token_ids_refused) {
    /* -4294967295 cast to int32 is 1, a real token */
    const icase bad[] = {
        {"tokenizer.ggml.bos_token_id", (uint64_t)-4294967295ll, "bos -4294967295"},
        {"tokenizer.ggml.eos_token_id", (uint64_t)-2ll, "eos -2"},
        {"tokenizer.ggml.unknown_token_id", (uint64_t)-7ll, "unk -7"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *data = NULL;
        loom_gguf *g = open_edited(set_i64, &bad[i], &data);
        LOOM_REQUIRE(g != NULL);
        loom_tokenizer *t = NULL;
        LOOM_CHECK_MSG(loom_tokenizer_from_gguf(g, &t) == LOOM_ERR_FORMAT, "%s accepted",
                       bad[i].key);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i].want);
        loom_tokenizer_free(t);
        loom_gguf_free(g);
        loom_free(data);
    }
    /* -1 still means "none" */
    const icase none = {"tokenizer.ggml.bos_token_id", (uint64_t)-1ll, ""};
    void *data = NULL;
    loom_gguf *g = open_edited(set_i64, &none, &data);
    LOOM_REQUIRE(g != NULL);
    loom_tokenizer *t = NULL;
    LOOM_CHECK(loom_tokenizer_from_gguf(g, &t) == LOOM_OK);
    LOOM_CHECK(t && loom_tokenizer_bos(t) == -1);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    loom_free(data);
}

/* replaces the tokenizer with one of *(int *)arg (<= 400) tokens */
static void set_vocab(loom_gguf_writer *w, const void *arg) {
    enum { MAX = 400 };
    const int n = *(const int *)arg;
    static char text[MAX][16];
    const char *tok[MAX];
    float scores[MAX] = {0};
    int32_t types[MAX];
    for (int i = 0; i < n && i < MAX; i++) {
        if (i < 3)
            snprintf(text[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(text[i], 16, "<0x%02X>", i - 3);
        else
            snprintf(text[i], 16, "t%d", i);
        tok[i] = text[i];
        types[i] = i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)n);
    loom_gguf_set_arr(w, "tokenizer.ggml.scores", LOOM_GGUF_FLOAT32, scores, (uint64_t)n);
    loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, types, (uint64_t)n);
}

LOOM_TEST(validation, vocabulary_mismatch_refused_at_load) {
    const int sizes[] = {280, 320};
    for (int k = 0; k < 2; k++) {
        void *data = NULL;
        loom_gguf *g = open_edited(set_vocab, &sizes[k], &data);
        LOOM_REQUIRE(g != NULL);
        loom_session_params p = loom_session_params_default();
        p.n_ctx = 32;
        p.threads = 1;
        loom_session *s = NULL;
        LOOM_CHECK(loom_session_new(NULL, g, &p, &s) == LOOM_ERR_FORMAT);
        LOOM_CHECK(s == NULL);
        char want[128];
        snprintf(want, sizeof want,
                 "tokenizer has %d tokens but the model's token_embd/output have 300 rows",
                 sizes[k]);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
        loom_session_free(s);
        loom_gguf_free(g);
        loom_free(data);
    }
    /* the matching size loads */
    const int same = 300;
    void *data = NULL;
    loom_gguf *g = open_edited(set_vocab, &same, &data);
    LOOM_REQUIRE(g != NULL);
    loom_session_params p = loom_session_params_default();
    p.n_ctx = 32;
    p.threads = 1;
    loom_session *s = NULL;
    LOOM_CHECK_MSG(loom_session_new(NULL, g, &p, &s) == LOOM_OK, "%s", loom_last_error());
    loom_session_free(s);
    loom_gguf_free(g);
    loom_free(data);
}

/* adds *(int *)arg tensors the graph does not use, "blk.0.stray_<i>.weight" */
static void add_stray(loom_gguf_writer *w, const void *arg) {
    const float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < *(const int *)arg; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.0.stray_%d.weight", i);
        loom_gguf_add_tensor(w, name, LOOM_TYPE_F32, 1, (const int64_t[]){4}, x);
    }
}

/* A file tensor the graph would not use is refused by name (the first in file order), also
 * among many (the check marks the file's tensors by index: linear, not tensors x weights). */
LOOM_TEST(validation, unused_tensor_named) {
    const int counts[] = {1, 500};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        void *data = NULL;
        loom_gguf *g = open_edited(add_stray, &counts[i], &data);
        LOOM_REQUIRE(g != NULL);
        loom_model *m = NULL;
        LOOM_CHECK_EQ_INT(loom_model_load(g, NULL, &m), LOOM_ERR_UNSUPPORTED);
        LOOM_CHECK(m == NULL);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                                "tensor 'blk.0.stray_0.weight' is not used by loom's llama graph");
        loom_gguf_free(g);
        loom_free(data);
    }
    /* without the strays the same model loads */
    void *data = NULL;
    loom_gguf *g = open_edited(NULL, NULL, &data);
    LOOM_REQUIRE(g != NULL);
    loom_model *m = NULL;
    LOOM_CHECK_EQ_INT(loom_model_load(g, NULL, &m), LOOM_OK);
    loom_model_free(m);
    loom_gguf_free(g);
    loom_free(data);
}

/* The session reads the hyperparameters once and gives them to the loader
 * (loom__model_load_hp): the model takes the ones it is given, the file is not read again;
 * loom_model_load reads them itself. */
LOOM_TEST(validation, model_load_takes_hparams_read_once) {
    void *data = NULL;
    loom_gguf *g = open_edited(NULL, NULL, &data);
    LOOM_REQUIRE(g != NULL);
    loom_hparams hp;
    LOOM_REQUIRE(loom_hparams_from_gguf(g, &hp) == LOOM_OK);
    const float file_eps = hp.rms_eps;
    hp.rms_eps = 0.25f; /* not the file's: seen in the model only if not read again */
    loom_model *m = NULL;
    LOOM_REQUIRE(loom__model_load_hp(g, &hp, NULL, &m) == LOOM_OK);
    LOOM_CHECK(m->hp.rms_eps == 0.25f);
    loom_model_free(m);
    m = NULL;
    LOOM_REQUIRE(loom_model_load(g, NULL, &m) == LOOM_OK);
    LOOM_CHECK(m->hp.rms_eps == file_eps && file_eps != 0.25f);
    loom_model_free(m);
    loom_gguf_free(g);
    loom_free(data);
}
