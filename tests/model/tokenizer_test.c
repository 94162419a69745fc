/*
 * Tokenizers: every case of the shared SentencePiece test vectors
 * (ggml-vocab-llama-spm.gguf.inp/.out), decoding round trips, and byte-level BPE on a
 * small vocabulary written with the gguf writer, whose expected merges are worked out by
 * hand in the comments.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gguf.h"
#include "loom/tokenizer.h"
#include "tests/shim/loom_test.h"

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static loom_tokenizer *load_vocab(loom_gguf **g_out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ggml-vocab-llama-spm.gguf", loom_test_models_dir());
    loom_gguf *g = NULL;
    if (loom_gguf_open(path, &g) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s", loom_last_error());
        return NULL;
    }
    loom_tokenizer *t = NULL;
    if (loom_tokenizer_from_gguf(g, &t) != LOOM_OK)
        loom_test_fail(__FILE__, __LINE__, "%s", loom_last_error());
    *g_out = g;
    return t;
}

static loom_tokenizer *open_vocab(const char *name, loom_gguf **g_out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", loom_test_models_dir(), name);
    *g_out = NULL;
    if (loom_gguf_open(path, g_out) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s", loom_last_error());
        return NULL;
    }
    loom_tokenizer *t = NULL;
    if (loom_tokenizer_from_gguf(*g_out, &t) != LOOM_OK)
        loom_test_fail(__FILE__, __LINE__, "%s: %s", name, loom_last_error());
    return t;
}

/* Runs every case of <vocab>.inp against <vocab>.out (ids without BOS, special tokens not
 * parsed: what llama.cpp's test-tokenizer-0 compares) and checks that the ids decode back to
 * the text (" " + text for SentencePiece's dummy prefix). Returns the number of cases. */
static int check_vectors(const char *vocab, int n_expected) {
    const char *dir = loom_test_models_dir();
    loom_gguf *g = NULL;
    loom_tokenizer *t = open_vocab(vocab, &g);
    if (!t) {
        loom_gguf_free(g);
        return -1;
    }
    char path[4096];
    size_t in_size, out_size;
    snprintf(path, sizeof path, "%s/%s.inp", dir, vocab);
    char *inp = read_file(path, &in_size);
    snprintf(path, sizeof path, "%s/%s.out", dir, vocab);
    char *outp = read_file(path, &out_size);
    if (!inp || !outp) {
        loom_test_fail(__FILE__, __LINE__, "%s: cannot read its .inp/.out", vocab);
        free(inp);
        free(outp);
        loom_tokenizer_free(t);
        loom_gguf_free(g);
        return -1;
    }
    const bool spm = loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_SPM;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *case_start = inp;
    char *line = outp;
    int n_cases = 0, n_ok = 0;
    enum { CAP = 1024 };
    int32_t *want = malloc(CAP * sizeof *want), *got = malloc(CAP * sizeof *got);
    char *dec = malloc(16384);
    for (;;) {
        char *end = strstr(case_start, sep);
        if (!end) break;
        size_t len = (size_t)(end - case_start);
        char *nl = strchr(line, '\n');
        if (!nl) {
            loom_test_fail(__FILE__, __LINE__, "%s: .out has fewer lines than .inp has cases", vocab);
            break;
        }
        *nl = 0;
        size_t n_want = 0;
        for (char *p = line; *p && n_want < CAP;) {
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p) break;
            want[n_want++] = (int32_t)v;
            p = q;
        }
        size_t n_got = 0;
        loom_status st = loom_tokenize_ex(t, case_start, len, 0, got, CAP, &n_got);
        bool same = st == LOOM_OK && n_got == n_want && memcmp(got, want, n_want * 4) == 0;
        if (!same) {
            char gs[4096] = "";
            size_t o = 0;
            for (size_t i = 0; i < n_got && i < CAP && o < sizeof gs - 16; i++)
                o += (size_t)snprintf(gs + o, sizeof gs - o, " %d", got[i]);
            loom_test_fail(__FILE__, __LINE__, "%s case %d '%.*s': want '%s' got '%s' (%s)", vocab,
                           n_cases, (int)len, case_start, line, gs, st ? loom_last_error() : "ok");
        }
        n_ok += same;
        n_cases++;
        if (same && len > 0) {
            size_t dn = 0;
            for (size_t i = 0; i < n_got; i++)
                dn += loom_token_to_piece(t, got[i], dec + dn, dn < 16384 ? 16384 - dn : 0);
            bool back = spm ? dn == len + 1 && dec[0] == ' ' && memcmp(dec + 1, case_start, len) == 0
                            : dn == len && memcmp(dec, case_start, len) == 0;
            LOOM_CHECK_MSG(back, "%s case %d does not decode back", vocab, n_cases - 1);
        }
        case_start = end + strlen(sep);
        line = nl + 1;
    }
    LOOM_CHECK_MSG(n_cases == n_expected, "%s: %d cases, expected %d", vocab, n_cases, n_expected);
    LOOM_CHECK_MSG(n_ok == n_cases, "%s: %d of %d cases pass", vocab, n_ok, n_cases);
    free(want);
    free(got);
    free(dec);
    free(inp);
    free(outp);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    return n_cases;
}

LOOM_TEST(tokenizer, spm_test_vectors) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    loom_tokenizer *t = load_vocab(&g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_SPM);
    LOOM_CHECK_EQ_INT(loom_tokenizer_n_vocab(t), 32000);
    LOOM_CHECK_EQ_INT(loom_tokenizer_bos(t), 1);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eos(t), 2);
    LOOM_CHECK(loom_tokenizer_pre(t) == NULL);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    check_vectors("ggml-vocab-llama-spm.gguf", 46);
    check_vectors("ggml-vocab-phi-3.gguf", 46);
}

/* The llama.cpp test vocabularies of byte-level BPE, each with its own tokenizer.ggml.pre. */
LOOM_TEST(tokenizer, bpe_test_vectors) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    static const struct {
        const char *file, *family;
    } V[] = {
        {"ggml-vocab-gpt-2.gguf", "gpt-2"},
        {"ggml-vocab-deepseek-coder.gguf", "deepseek-coder"},
        {"ggml-vocab-deepseek-llm.gguf", "deepseek-llm"},
        {"ggml-vocab-falcon.gguf", "falcon"},
        {"ggml-vocab-mpt.gguf", "gpt-2"},
        {"ggml-vocab-refact.gguf", "starcoder"},
        {"ggml-vocab-starcoder.gguf", "starcoder"},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        loom_gguf *g = NULL;
        loom_tokenizer *t = open_vocab(V[i].file, &g);
        if (t) {
            LOOM_CHECK(loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_BPE);
            const char *fam = loom_tokenizer_pre(t);
            LOOM_CHECK_MSG(fam && strcmp(fam, V[i].family) == 0, "%s: pre-tokenizer %s, expected %s",
                           V[i].file, fam ? fam : "(none)", V[i].family);
        }
        loom_tokenizer_free(t);
        loom_gguf_free(g);
        check_vectors(V[i].file, 46);
    }
}

LOOM_TEST(tokenizer, spm_bos_and_small_buffer) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    loom_tokenizer *t = load_vocab(&g);
    LOOM_REQUIRE(t != NULL);
    int32_t ids[8];
    size_t n;
    LOOM_CHECK(loom_tokenize(t, "Hello world", 11, true, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186);
    LOOM_CHECK(loom_tokenize(t, "Hello world", 11, true, ids, 2, &n) == LOOM_ERR_FULL);
    LOOM_CHECK_EQ_INT(n, 3);
    char piece[16];
    LOOM_CHECK_EQ_INT(loom_token_to_piece(t, 1, piece, sizeof piece), 0); /* <s> is control */
    LOOM_CHECK_EQ_INT(loom_token_to_piece(t, 13, piece, sizeof piece), 1); /* <0x0A> */
    LOOM_CHECK(piece[0] == '\n');
    loom_tokenizer_free(t);
    loom_gguf_free(g);
}

/* A tiny byte-level BPE vocabulary. Merges in rank order: "h e", "l l", "he ll", "hell o",
 * "Ġ w". Tokenizing "hello wow": the pre-tokenizer gives "hello" and " wow"; " " maps to
 * "Ġ" (U+0120). "hello": h e l l o -> (rank 0) he l l o -> (rank 1) he ll o -> (rank 2)
 * hell o -> (rank 3) hello. " wow": Ġ w o w -> (rank 4) Ġw o w; no more merges. */
LOOM_TEST(tokenizer, bpe_merges_by_rank) {
    const char *tokens[] = {"h", "e", "l", "o", "w", "\xC4\xA0", "he", "ll", "hell", "hello",
                            "\xC4\xA0w", "<|end|>"};
    int32_t types[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3};
    const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"};
    loom_gguf_writer *w = loom_gguf_writer_new();
    LOOM_REQUIRE(w != NULL);
    loom_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 12);
    loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, types, 12);
    loom_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 5);
    loom_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 11);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    loom_tokenizer *t = NULL;
    LOOM_REQUIRE(loom_tokenizer_from_gguf(g, &t) == LOOM_OK);
    LOOM_CHECK(loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_BPE);
    int32_t ids[16];
    size_t n;
    LOOM_CHECK(loom_tokenize(t, "hello wow", 9, false, ids, 16, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 4);
    LOOM_CHECK(ids[0] == 9 && ids[1] == 10 && ids[2] == 3 && ids[3] == 4);
    char dec[64];
    size_t dn = 0;
    for (size_t i = 0; i < n; i++) dn += loom_token_to_piece(t, ids[i], dec + dn, sizeof dec - dn);
    LOOM_CHECK(dn == 9 && memcmp(dec, "hello wow", 9) == 0);
    LOOM_CHECK_EQ_INT(loom_token_to_piece(t, 11, dec, sizeof dec), 0);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

LOOM_TEST(tokenizer, bad_vocabularies_are_named) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    LOOM_REQUIRE(w != NULL);
    loom_gguf_set_str(w, "tokenizer.ggml.model", "wordpiece");
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    loom_tokenizer *t = NULL;
    LOOM_CHECK(loom_tokenizer_from_gguf(g, &t) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "wordpiece");
    loom_gguf_free(g);
    loom_free(data);

    loom_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK(loom_tokenizer_from_gguf(g, &t) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tokenizer.ggml.tokens");
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}
