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
    const bool wpm =
        loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_WPM; /* normalizes: no round trip */
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
            loom_test_fail(__FILE__, __LINE__, "%s: .out has fewer lines than .inp has cases",
                           vocab);
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
        if (same && len > 0 && !wpm) {
            size_t dn = 0;
            for (size_t i = 0; i < n_got; i++)
                dn += loom_token_to_piece(t, got[i], dec + dn, dn < 16384 ? 16384 - dn : 0);
            bool back =
                spm ? dn == len + 1 && dec[0] == ' ' && memcmp(dec + 1, case_start, len) == 0
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
            LOOM_CHECK_MSG(fam && strcmp(fam, V[i].family) == 0,
                           "%s: pre-tokenizer %s, expected %s", V[i].file, fam ? fam : "(none)",
                           V[i].family);
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
    LOOM_CHECK_EQ_INT(loom_token_to_piece(t, 1, piece, sizeof piece), 0);  /* <s> is control */
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
    const char *tokens[] = {"h",  "e",  "l",    "o",     "w",         "\xC4\xA0",
                            "he", "ll", "hell", "hello", "\xC4\xA0w", "<|end|>"};
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
    for (size_t i = 0; i < n; i++)
        dn += loom_token_to_piece(t, ids[i], dec + dn, sizeof dec - dn);
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
    loom_gguf_set_str(w, "tokenizer.ggml.model", "t5");
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    loom_tokenizer *t = NULL;
    LOOM_CHECK(loom_tokenizer_from_gguf(g, &t) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'t5'");
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

#include "model/tokenizer-impl.h"
#include "tests/model/pretok_vectors.h"

/* Every pre-tokenizer family's split of a set of texts (contractions in any case, digit runs,
 * CJK, Hangul, Cyrillic, Arabic, emoji, combining marks, CR/LF runs, tabs, camelCase, special
 * token look-alikes) equals the one an independent regex engine gives with the published
 * patterns (gen_pretok_vectors.py). */
LOOM_TEST(tokenizer, pretok_splits_match_the_oracle) {
    int n_bad = 0;
    for (size_t c = 0; c < sizeof PRETOK_CASES / sizeof PRETOK_CASES[0]; c++) {
        const pretok_case *pc = &PRETOK_CASES[c];
        loom_pretok p;
        loom_status st = loom__pretok_init(&p, pc->pre);
        LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", pc->pre, loom_last_error());
        LOOM_REQUIRE(st == LOOM_OK);
        const char *text = PRETOK_TEXTS[pc->text];
        size_t *seg = NULL, n = 0;
        LOOM_REQUIRE(loom__pretok_split(&p, text, strlen(text), &seg, &n) == LOOM_OK);
        bool same = n == (size_t)pc->n;
        for (size_t i = 0; same && i < n; i++)
            same = seg[i] == (size_t)pc->len[i];
        if (!same) {
            char gs[1024] = "", ws[1024] = "";
            size_t o = 0;
            for (size_t i = 0; i < n && o < sizeof gs - 8; i++)
                o += (size_t)snprintf(gs + o, sizeof gs - o, " %zu", seg[i]);
            o = 0;
            for (int i = 0; i < pc->n && o < sizeof ws - 8; i++)
                o += (size_t)snprintf(ws + o, sizeof ws - o, " %d", pc->len[i]);
            loom_test_fail(__FILE__, __LINE__, "%s on text %d '%s': want%s got%s", pc->pre,
                           pc->text, text, ws, gs);
            n_bad++;
        }
        loom_free(seg);
        loom__pretok_free(&p);
    }
    LOOM_CHECK_EQ_INT(n_bad, 0);
}

/* ---------------------------------------------------------------- small BPE vocabularies */

typedef struct mem_vocab {
    void *data;
    loom_gguf *g;
    loom_tokenizer *t;
    loom_status st; /* of loom_tokenizer_from_gguf */
} mem_vocab;

/* A BPE vocabulary's writer: tokens, types, merges, pre (NULL: no key), BOS and EOS ids. */
static loom_gguf_writer *bpe_writer(const char *const *tokens, const int32_t *types, size_t n,
                                    const char *const *merges, size_t n_merges, const char *pre,
                                    uint32_t bos, uint32_t eos) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    loom_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) loom_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n);
    loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, types, n);
    loom_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, n_merges);
    loom_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", bos);
    loom_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", eos);
    return w;
}

/* The tokenizer of the vocabulary w holds, written to memory and read back; frees w. */
static mem_vocab vocab_from_writer(loom_gguf_writer *w) {
    mem_vocab v = {0};
    size_t size;
    if (loom_gguf_write_memory(w, &v.data, &size) == LOOM_OK &&
        loom_gguf_open_memory(v.data, size, &v.g) == LOOM_OK)
        v.st = loom_tokenizer_from_gguf(v.g, &v.t);
    else
        v.st = LOOM_ERR_INTERNAL;
    loom_gguf_writer_free(w);
    return v;
}

/* A BPE vocabulary written with the gguf writer; pre NULL leaves tokenizer.ggml.pre out. */
static mem_vocab make_bpe(const char *const *tokens, const int32_t *types, size_t n,
                          const char *const *merges, size_t n_merges, const char *pre,
                          int add_eos /* -1: no key */) {
    loom_gguf_writer *w =
        bpe_writer(tokens, types, n, merges, n_merges, pre, (uint32_t)n - 2, (uint32_t)n - 1);
    if (add_eos >= 0) loom_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos != 0);
    return vocab_from_writer(w);
}

static void free_vocab(mem_vocab *v) {
    loom_tokenizer_free(v->t);
    loom_gguf_free(v->g);
    loom_free(v->data);
}

/* tokens: a b c ab bc abc <s> </s>; merges "a b" (rank 0), "a bc" (1), "b c" (2). "abc":
 * a b c -> (rank 0) ab c; "ab c" is no merge, so it stays [ab, c] although the concatenation
 * "abc" is what "a bc" would make. */
LOOM_TEST(tokenizer, bpe_merges_match_the_exact_pair) {
    const char *tokens[] = {"a", "b", "c", "ab", "bc", "abc", "<s>", "</s>"};
    int32_t types[] = {1, 1, 1, 1, 1, 1, 3, 3};
    const char *merges[] = {"a b", "a bc", "b c"};
    mem_vocab v = make_bpe(tokens, types, 8, merges, 3, "gpt-2", -1);
    LOOM_REQUIRE(v.st == LOOM_OK);
    int32_t ids[8];
    size_t n;
    LOOM_CHECK(loom_tokenize_ex(v.t, "abc", 3, 0, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 2);
    LOOM_CHECK(ids[0] == 3 && ids[1] == 2);
    /* "bc" alone merges by rank 2 */
    LOOM_CHECK(loom_tokenize_ex(v.t, "bc", 2, 0, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 1 && ids[0] == 4);
    /* one long word: "ab" x 50000 merges into 50000 "ab" (queue-based merging, not a rescan
     * of the whole word per merge) */
    enum { REP = 50000 };
    char *longw = malloc(2 * REP);
    int32_t *many = malloc(REP * sizeof *many);
    for (int i = 0; i < REP; i++)
        memcpy(longw + 2 * i, "ab", 2);
    LOOM_CHECK(loom_tokenize_ex(v.t, longw, 2 * REP, 0, many, REP, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, REP);
    int n_ab = 0;
    for (size_t i = 0; i < n && i < REP; i++)
        n_ab += many[i] == 3;
    LOOM_CHECK_EQ_INT(n_ab, REP);
    free(longw);
    free(many);
    free_vocab(&v);
}

/* Llama 3's pre-tokenizer takes a word that is a token whole, merges or not; GPT-2's merges. */
LOOM_TEST(tokenizer, llama3_ignores_merges_for_whole_words) {
    const char *tokens[] = {"h", "i", "hi", "<s>", "</s>"};
    int32_t types[] = {1, 1, 1, 3, 3};
    const char *merges[] = {"x y"};
    mem_vocab l3 = make_bpe(tokens, types, 5, merges, 1, "llama-bpe", -1);
    mem_vocab g2 = make_bpe(tokens, types, 5, merges, 1, "gpt-2", -1);
    LOOM_REQUIRE(l3.st == LOOM_OK && g2.st == LOOM_OK);
    LOOM_CHECK(strcmp(loom_tokenizer_pre(l3.t), "llama3") == 0);
    int32_t ids[8];
    size_t n;
    LOOM_CHECK(loom_tokenize_ex(l3.t, "hi", 2, 0, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 1 && ids[0] == 2);
    LOOM_CHECK(loom_tokenize_ex(g2.t, "hi", 2, 0, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 0 && ids[1] == 1);
    /* Llama 3 vocabularies add a BOS unless the file says otherwise; GPT-2 ones do not */
    LOOM_CHECK(loom_tokenizer_add_bos(l3.t));
    LOOM_CHECK(!loom_tokenizer_add_bos(g2.t));
    LOOM_CHECK(loom_tokenize_ex(l3.t, "hi", 2, LOOM_TOKENIZE_ADD_SPECIAL, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 3 && ids[1] == 2);
    free_vocab(&l3);
    free_vocab(&g2);
}

static char last_warning[512];
static void keep_warning(loom_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == LOOM_LOG_WARN) snprintf(last_warning, sizeof last_warning, "%s", msg);
}

LOOM_TEST(tokenizer, pre_tokenizer_names) {
    const char *tokens[] = {"h", "i", "<s>", "</s>"};
    int32_t types[] = {1, 1, 3, 3};
    const char *merges[] = {"h i"};
    /* an unknown name is an error naming it, not a silent GPT-2 split */
    mem_vocab bad = make_bpe(tokens, types, 4, merges, 1, "no-such-thing", -1);
    LOOM_CHECK(bad.st == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tokenizer.ggml.pre");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'no-such-thing'");
    free_vocab(&bad);
    /* a missing key: the reference engines' fallback, with a warning naming it */
    last_warning[0] = 0;
    loom_log_set(keep_warning, NULL);
    mem_vocab none = make_bpe(tokens, types, 4, merges, 1, NULL, -1);
    loom_log_set(NULL, NULL);
    LOOM_CHECK(none.st == LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(last_warning, "tokenizer.ggml.pre is missing");
    LOOM_CHECK_STR_CONTAINS(last_warning, "'default'");
    if (none.t) LOOM_CHECK(strcmp(loom_tokenizer_pre(none.t), "default") == 0);
    free_vocab(&none);
    /* every alias the converters write maps onto a family that compiles */
    static const struct {
        const char *pre, *family;
    } A[] = {{"llama3", "llama3"},
             {"llama-bpe", "llama3"},
             {"falcon3", "llama3"},
             {"dbrx", "dbrx"},
             {"glm4", "dbrx"},
             {"smaug-bpe", "dbrx"},
             {"qwen2", "qwen2"},
             {"deepseek-r1-qwen", "qwen2"},
             {"gpt-2", "gpt-2"},
             {"mpt", "gpt-2"},
             {"gpt-neox", NULL},
             {"olmo", "gpt-2"},
             {"phi-2", "gpt-2"},
             {"starcoder", "starcoder"},
             {"refact", "starcoder"},
             {"command-r", "starcoder"},
             {"smollm", "starcoder"},
             {"falcon", "falcon"},
             {"deepseek-llm", "deepseek-llm"},
             {"deepseek-coder", "deepseek-coder"},
             {"deepseek-v3", "deepseek-v3"},
             {"gpt-4o", "gpt-4o"},
             {"o200k", "gpt-4o"},
             {"llama4", "gpt-4o"},
             {"tekken", "tekken"},
             {"chameleon", "chameleon"},
             {"bloom", "bloom"},
             {"viking", "viking"},
             {"seed-coder", "seed-coder"},
             {"bailingmoe", "bailingmoe"},
             {"default", "default"}};
    for (size_t i = 0; i < sizeof A / sizeof A[0]; i++) {
        loom_pretok p;
        loom_status st = loom__pretok_init(&p, A[i].pre);
        if (!A[i].family) {
            LOOM_CHECK_MSG(st == LOOM_ERR_UNSUPPORTED, "%s should be unknown", A[i].pre);
            continue;
        }
        LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", A[i].pre, loom_last_error());
        if (st) continue;
        LOOM_CHECK_MSG(strcmp(p.family, A[i].family) == 0, "%s -> %s", A[i].pre, p.family);
        /* only Llama 3 and tekken take whole-word tokens and a BOS of their own */
        bool l3 = !strcmp(p.family, "llama3") || !strcmp(p.family, "tekken");
        LOOM_CHECK_MSG(p.ignore_merges == l3, "%s: ignore_merges %d", A[i].pre, p.ignore_merges);
        LOOM_CHECK_MSG(p.add_bos == (l3 || !strcmp(p.family, "chameleon")), "%s: add_bos %d",
                       A[i].pre, p.add_bos);
        loom__pretok_free(&p);
    }
}

/* Control tokens in the text are those tokens with LOOM_TOKENIZE_PARSE_SPECIAL (loom_tokenize's
 * default) and plain text without; BOS and EOS follow the flags and the vocabulary. */
LOOM_TEST(tokenizer, special_tokens_bos_and_eos) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    loom_tokenizer *t = open_vocab("ggml-vocab-gpt-2.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    int32_t ids[64];
    size_t n;
    const char *s = "a<|endoftext|>b";
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s), LOOM_TOKENIZE_PARSE_SPECIAL, ids, 64, &n) ==
               LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 3);
    LOOM_CHECK_EQ_INT(ids[1], 50256);
    int32_t a = ids[0], b = ids[2];
    LOOM_CHECK(loom_tokenize(t, s, strlen(s), false, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK(n == 3 && ids[0] == a && ids[1] == 50256 && ids[2] == b);
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s), 0, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK(n > 3);
    bool has = false;
    for (size_t i = 0; i < n; i++)
        has |= ids[i] == 50256;
    LOOM_CHECK_MSG(!has, "plain text must not produce <|endoftext|>");
    /* gpt-2 asks for no BOS; an explicit one and an EOS are honoured */
    LOOM_CHECK(!loom_tokenizer_add_bos(t) && !loom_tokenizer_add_eos(t));
    LOOM_CHECK(loom_tokenize_ex(t, "a", 1, LOOM_TOKENIZE_ADD_SPECIAL, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK(n == 1 && ids[0] == a);
    LOOM_CHECK(loom_tokenize_ex(t, "a", 1, LOOM_TOKENIZE_ADD_BOS | LOOM_TOKENIZE_ADD_EOS, ids, 64,
                                &n) == LOOM_OK);
    LOOM_CHECK(n == 3 && ids[0] == 50256 && ids[1] == a && ids[2] == 50256);
    /* text that is not UTF-8 is an error naming the byte */
    LOOM_CHECK(loom_tokenize_ex(t, "ab\xFF", 3, 0, ids, 64, &n) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "byte 2");
    loom_tokenizer_free(t);
    loom_gguf_free(g);

    /* deepseek-coder asks for a BOS (add_bos_token true) */
    t = open_vocab("ggml-vocab-deepseek-coder.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_tokenizer_add_bos(t));
    LOOM_CHECK(loom_tokenize_ex(t, "a", 1, LOOM_TOKENIZE_ADD_SPECIAL, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 32013);
    loom_tokenizer_free(t);
    loom_gguf_free(g);

    /* SentencePiece: "<s>" parsed, the dummy prefix again after it; plain, it is text */
    t = open_vocab("ggml-vocab-llama-spm.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    s = "<s>Hello";
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s), LOOM_TOKENIZE_PARSE_SPECIAL, ids, 64, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 1 && ids[1] == 15043);
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s), 0, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK(n > 2 && ids[0] != 1);
    /* a BOS added to text that starts with one is reported */
    last_warning[0] = 0;
    loom_log_set(keep_warning, NULL);
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s),
                                LOOM_TOKENIZE_PARSE_SPECIAL | LOOM_TOKENIZE_ADD_BOS, ids, 64,
                                &n) == LOOM_OK);
    loom_log_set(NULL, NULL);
    LOOM_CHECK(n == 3 && ids[0] == 1 && ids[1] == 1);
    LOOM_CHECK_STR_CONTAINS(last_warning, "two BOS");
    /* byte fallback: U+1F600 is no token, so "▁" then its four bytes <0xF0><0x9F><0x98><0x80>
     * (byte tokens start at id 3: <0x00>) */
    LOOM_CHECK(loom_tokenize_ex(t, "\xF0\x9F\x98\x80", 4, 0, ids, 64, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 5);
    LOOM_CHECK(ids[0] == 29871 && ids[1] == 3 + 0xF0 && ids[2] == 3 + 0x9F && ids[3] == 3 + 0x98 &&
               ids[4] == 3 + 0x80);
    LOOM_CHECK_STR_CONTAINS(loom_token_text(t, 29871), "\xE2\x96\x81");
    loom_tokenizer_free(t);
    loom_gguf_free(g);
}

/* An add_eos_token vocabulary ends every ADD_SPECIAL tokenization with EOS. */
LOOM_TEST(tokenizer, add_eos_from_the_vocabulary) {
    const char *tokens[] = {"h", "i", "<s>", "</s>"};
    int32_t types[] = {1, 1, 3, 3};
    const char *merges[] = {"h i"};
    mem_vocab v = make_bpe(tokens, types, 4, merges, 1, "gpt-2", 1);
    LOOM_REQUIRE(v.st == LOOM_OK);
    LOOM_CHECK(loom_tokenizer_add_eos(v.t));
    int32_t ids[8];
    size_t n;
    LOOM_CHECK(loom_tokenize_ex(v.t, "h", 1, LOOM_TOKENIZE_ADD_SPECIAL, ids, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 0 && ids[1] == 3);
    free_vocab(&v);
}

/* WordPiece (BERT uncased): every case of the bge vectors (accents stripped, case folded,
 * punctuation split, CJK set apart, emoji unknown), and [CLS] ... [SEP] as the vocabulary's
 * BOS and EOS. */
LOOM_TEST(tokenizer, wordpiece_test_vectors) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    loom_tokenizer *t = open_vocab("ggml-vocab-bert-bge.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_tokenizer_kind_of(t) == LOOM_TOKENIZER_WPM);
    LOOM_CHECK(loom_tokenizer_add_bos(t) && loom_tokenizer_add_eos(t));
    int32_t ids[16];
    size_t n;
    LOOM_CHECK(loom_tokenize_ex(t, "Hello world", 11, LOOM_TOKENIZE_ADD_SPECIAL, ids, 16, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 4 && ids[0] == 101 && ids[1] == 7592 && ids[2] == 2088 && ids[3] == 102);
    /* "[SEP]" written in the text is the token with PARSE_SPECIAL, plain text without */
    LOOM_CHECK(loom_tokenize_ex(t, "a[SEP]", 6, LOOM_TOKENIZE_PARSE_SPECIAL, ids, 16, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 2 && ids[1] == 102);
    LOOM_CHECK(loom_tokenize_ex(t, "a[SEP]", 6, 0, ids, 16, &n) == LOOM_OK);
    LOOM_CHECK(n > 2);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    check_vectors("ggml-vocab-bert-bge.gguf", 46);
}

/* ---------------------------------------------------------------- random texts */

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* A random valid UTF-8 text of ASCII, white space runs, Latin-1, Cyrillic, CJK, Hangul, emoji,
 * combining marks and special-token look-alikes (no U+2581, which SentencePiece reads as a
 * space). Returns its length. */
static size_t random_text(uint64_t *seed, char *buf, size_t cap) {
    static const char *const frags[] = {"<|",    "|>",   "<s>",  "</s>", "[SEP]", "<|endoftext|>",
                                        "  ",    "\n\n", "\r\n", "\t",   "'s",    "'LL",
                                        "123456"};
    static const uint32_t ranges[][2] = {{0x20, 0x7E},     {0xA0, 0xFF},     {0x400, 0x44F},
                                         {0x4E00, 0x4F00}, {0xAC00, 0xAD00}, {0x1F600, 0x1F64F},
                                         {0x300, 0x36F},   {0x9, 0xD}};
    size_t n = 0, want = lcg(seed) % 60;
    while (want-- && n + 16 < cap) {
        uint32_t r = lcg(seed) % 10;
        if (r < 2) {
            const char *f = frags[lcg(seed) % (sizeof frags / sizeof *frags)];
            memcpy(buf + n, f, strlen(f));
            n += strlen(f);
            continue;
        }
        const uint32_t *g = ranges[lcg(seed) % (sizeof ranges / sizeof *ranges)];
        uint32_t cp = g[0] + lcg(seed) % (g[1] - g[0] + 1);
        if (cp < 0x80)
            buf[n++] = (char)cp;
        else if (cp < 0x800) {
            buf[n++] = (char)(0xC0 | (cp >> 6));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[n++] = (char)(0xE0 | (cp >> 12));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)(0xF0 | (cp >> 18));
            buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

/* Byte-level BPE and SentencePiece with byte fallback lose nothing: random texts decode back
 * exactly (SentencePiece: after its dummy-prefix space). Random bytes are an error naming the
 * first bad byte for BPE and WordPiece, never a crash, and SentencePiece spells them in byte
 * tokens. */
LOOM_TEST(tokenizer, random_texts_round_trip) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    static const char *const V[] = {"ggml-vocab-gpt-2.gguf",     "ggml-vocab-deepseek-llm.gguf",
                                    "ggml-vocab-falcon.gguf",    "ggml-vocab-mpt.gguf",
                                    "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf",
                                    "ggml-vocab-bert-bge.gguf"};
    enum { CAP = 4096 };
    char *text = malloc(CAP), *dec = malloc(4 * CAP);
    int32_t *ids = malloc(CAP * sizeof *ids);
    for (size_t v = 0; v < sizeof V / sizeof *V; v++) {
        loom_gguf *g = NULL;
        loom_tokenizer *t = open_vocab(V[v], &g);
        if (!t) {
            loom_gguf_free(g);
            continue;
        }
        loom_tokenizer_kind kind = loom_tokenizer_kind_of(t);
        uint64_t seed = 42 + v;
        int n_bad = 0, n_lossy = 0;
        for (int c = 0; c < 300; c++) {
            size_t len = random_text(&seed, text, CAP), n = 0;
            unsigned flags = (c & 1) ? LOOM_TOKENIZE_PARSE_SPECIAL : 0;
            loom_status st = loom_tokenize_ex(t, text, len, flags, ids, CAP, &n);
            if (st != LOOM_OK) {
                loom_test_fail(__FILE__, __LINE__, "%s: %s", V[v], loom_last_error());
                n_bad++;
                continue;
            }
            if (kind == LOOM_TOKENIZER_WPM || flags)
                continue; /* WordPiece normalizes; control tokens decode empty */
            /* not lossless, as in the reference engines: a byte the vocabulary has no token for
             * (dropped, with a warning at load), and SentencePiece's dummy prefix again after a
             * user-defined token ("</s>" in phi-3) */
            bool lossless = true;
            for (size_t i = 0; kind == LOOM_TOKENIZER_BPE && i < len; i++)
                lossless &= loom__bpe_has_byte(t, (uint8_t)text[i]);
            for (size_t i = 0; kind == LOOM_TOKENIZER_SPM && i < n; i++)
                lossless &= t->type[ids[i]] != LOOM_TOKEN_USER_DEFINED;
            if (!lossless) {
                n_lossy++;
                continue;
            }
            size_t dn = 0;
            for (size_t i = 0; i < n; i++)
                dn += loom_token_to_piece(t, ids[i], dec + dn, 4 * CAP - dn);
            bool back =
                kind == LOOM_TOKENIZER_SPM
                    ? (len == 0 ? dn == 0
                                : dn == len + 1 && dec[0] == ' ' && memcmp(dec + 1, text, len) == 0)
                    : dn == len && memcmp(dec, text, len) == 0;
            if (!back && n_bad++ < 3)
                loom_test_fail(__FILE__, __LINE__, "%s: '%.*s' does not decode back ('%.*s')", V[v],
                               (int)len, text, (int)dn, dec);
        }
        /* random bytes */
        for (int c = 0; c < 100; c++) {
            size_t len = 1 + lcg(&seed) % 40, n = 0;
            for (size_t i = 0; i < len; i++)
                text[i] = (char)(lcg(&seed) & 0xFF);
            text[len / 2] = (char)0xFF; /* never valid UTF-8 */
            loom_status st = loom_tokenize_ex(t, text, len, 0, ids, CAP, &n);
            if (kind == LOOM_TOKENIZER_SPM) {
                LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", V[v], loom_last_error());
            } else {
                LOOM_CHECK_MSG(st == LOOM_ERR_INVALID_ARG, "%s: random bytes gave %d", V[v],
                               (int)st);
                LOOM_CHECK_STR_CONTAINS(loom_last_error(), "not valid UTF-8 at byte");
            }
        }
        LOOM_CHECK_MSG(n_bad == 0, "%s: %d random texts failed", V[v], n_bad);
        LOOM_CHECK_MSG(n_lossy < 100, "%s: %d of 150 texts not checked", V[v], n_lossy);
        loom_tokenizer_free(t);
        loom_gguf_free(g);
    }
    free(text);
    free(dec);
    free(ids);
}

/* Phi-3's special tokens swallow the white space after them (the reference engines set this
 * by model name: GGUF does not carry it); Llama-2's do not. */
LOOM_TEST(tokenizer, phi3_special_tokens_strip_right) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    loom_tokenizer *t = open_vocab("ggml-vocab-phi-3.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    int32_t ids[32];
    size_t n;
    const char *s = "<|user|>\n Hi<|end|>\n";
    LOOM_CHECK(loom_tokenize_ex(t, s, strlen(s), LOOM_TOKENIZE_PARSE_SPECIAL, ids, 32, &n) ==
               LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 3);
    LOOM_CHECK(ids[0] == 32010 && ids[2] == 32007);
    LOOM_CHECK(strcmp(loom_token_text(t, ids[1]), "\xE2\x96\x81Hi") == 0);
    /* "<s>" is excepted: the space after it stays */
    LOOM_CHECK(loom_tokenize_ex(t, "<s> Hi", 6, LOOM_TOKENIZE_PARSE_SPECIAL, ids, 32, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 3 && ids[0] == 1 && strcmp(loom_token_text(t, ids[1]), "\xE2\x96\x81") == 0);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    t = open_vocab("ggml-vocab-llama-spm.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_tokenize_ex(t, "</s>\nHi", 7, LOOM_TOKENIZE_PARSE_SPECIAL, ids, 32, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 4 && ids[0] == 2 && ids[1] == 29871 && ids[2] == 13);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
}

#include "tests/model/bpe_oracle_vectors.h"

/* Llama 3, Qwen2 and GPT-4o tokenization end to end (pre-tokenizer, byte mapping, merges,
 * Llama 3's whole-word tokens) on a small BPE vocabulary of loom's own, against the ids of an
 * independent BPE engine (js-tiktoken; gen_bpe_oracle.py): their real vocabularies are too
 * big to ship as test files. */
LOOM_TEST(tokenizer, llama3_qwen2_gpt4o_match_the_oracle) {
    enum { NT = sizeof ORACLE_TOKENS / sizeof ORACLE_TOKENS[0] };
    static int32_t types[NT];
    for (int i = 0; i < NT; i++)
        types[i] = LOOM_TOKEN_NORMAL;
    const char *pres[] = {"llama-bpe", "qwen2", "gpt-4o"};
    int n_checked = 0;
    for (int p = 0; p < 3; p++) {
        mem_vocab v = make_bpe(ORACLE_TOKENS, types, NT, ORACLE_MERGES,
                               sizeof ORACLE_MERGES / sizeof ORACLE_MERGES[0], pres[p], -1);
        LOOM_CHECK_MSG(v.st == LOOM_OK, "%s: %s", pres[p], loom_last_error());
        if (v.st) continue;
        for (size_t c = 0; c < sizeof ORACLE_CASES / sizeof ORACLE_CASES[0]; c++) {
            const oracle_case *oc = &ORACLE_CASES[c];
            if (strcmp(oc->pre, pres[p])) continue;
            const char *text = ORACLE_TEXTS[oc->text];
            int32_t ids[1024];
            size_t n = 0;
            loom_status st = loom_tokenize_ex(v.t, text, strlen(text), 0, ids, 1024, &n);
            bool same = st == LOOM_OK && n == (size_t)oc->n;
            for (size_t i = 0; same && i < n; i++)
                same = ids[i] == oc->ids[i];
            LOOM_CHECK_MSG(same, "%s text %d '%s': %zu ids, oracle %d", oc->pre, oc->text, text, n,
                           oc->n);
            n_checked++;
        }
        free_vocab(&v);
    }
    LOOM_CHECK_EQ_INT(n_checked, 3 * (int)(sizeof ORACLE_TEXTS / sizeof ORACLE_TEXTS[0]));
}

static char all_warnings[4096];
static void add_warning(loom_log_level level, const char *msg, void *user) {
    (void)user;
    size_t n = strlen(all_warnings);
    if (level == LOOM_LOG_WARN) snprintf(all_warnings + n, sizeof all_warnings - n, "%s\n", msg);
}

/* A BPE vocabulary of h i <s> </s> and the given extra tokens, with an optional
 * tokenizer.ggml.eot_token_id (eot < -1: no key). */
static mem_vocab make_eog_vocab(const char *const *extra, const int32_t *extra_types,
                                size_t n_extra, int64_t eot) {
    const char *tokens[16] = {"h", "i", "<s>", "</s>"};
    int32_t types[16] = {1, 1, 3, 3};
    for (size_t k = 0; k < n_extra; k++) {
        tokens[4 + k] = extra[k];
        types[4 + k] = extra_types[k];
    }
    const char *merges[] = {"h i"};
    loom_gguf_writer *w = bpe_writer(tokens, types, 4 + n_extra, merges, 1, "gpt-2", 2, 3);
    if (eot >= -1) loom_gguf_set_i32(w, "tokenizer.ggml.eot_token_id", (int32_t)eot);
    return vocab_from_writer(w);
}

/* The tokens that end generation: EOS, the end-of-turn token (the key, else found by its
 * text), and the other chat and fill-in-the-middle ends the reference engines stop at; a
 * token found by its text becomes a control token even where the file calls it normal. */
LOOM_TEST(tokenizer, end_of_generation_tokens) {
    const char *extra[] = {"<|eot_id|>", "<|im_end|>", "<|fim_pad|>", "<|start_header_id|>"};
    const int32_t extra_types[] = {1 /* normal in the file */, 3, 3, 3};
    mem_vocab v = make_eog_vocab(extra, extra_types, 4, -2);
    LOOM_REQUIRE(v.st == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eos(v.t), 3);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(v.t), 4);
    const bool want[] = {false, false, false, true, true, true, true, false};
    for (int32_t id = 0; id < 8; id++)
        LOOM_CHECK_MSG(loom_token_is_eog(v.t, id) == want[id], "token %d", id);
    LOOM_CHECK(!loom_token_is_eog(v.t, -1) && !loom_token_is_eog(v.t, 8));
    LOOM_CHECK(loom_token_is_control(v.t, 4));
    char piece[16];
    LOOM_CHECK_EQ_INT(loom_token_to_piece(v.t, 4, piece, sizeof piece), 0);
    int32_t ids[8];
    size_t n;
    LOOM_CHECK(loom_tokenize_ex(v.t, "h<|eot_id|>", 11, LOOM_TOKENIZE_PARSE_SPECIAL, ids, 8, &n) ==
               LOOM_OK);
    LOOM_CHECK(n == 2 && ids[0] == 0 && ids[1] == 4);
    free_vocab(&v);

    /* the key names the end of turn */
    v = make_eog_vocab(extra, extra_types, 4, 7);
    LOOM_REQUIRE(v.st == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(v.t), 7);
    LOOM_CHECK(loom_token_is_eog(v.t, 7) && loom_token_is_eog(v.t, 4));
    free_vocab(&v);

    /* a key out of range is a warning naming it, and the text search stands in */
    all_warnings[0] = 0;
    loom_log_set(add_warning, NULL);
    v = make_eog_vocab(extra, extra_types, 4, 1000);
    loom_log_set(NULL, NULL);
    LOOM_REQUIRE(v.st == LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(all_warnings, "tokenizer.ggml.eot_token_id = 1000");
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(v.t), 4);
    free_vocab(&v);

    /* no end of turn at all: only EOS ends generation */
    v = make_eog_vocab(extra + 3, extra_types + 3, 1, -2);
    LOOM_REQUIRE(v.st == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(v.t), -1);
    for (int32_t id = 0; id < 5; id++)
        LOOM_CHECK_MSG(loom_token_is_eog(v.t, id) == (id == 3), "token %d", id);
    free_vocab(&v);

    /* the shared vocabularies: Phi-3 ends a turn with <|end|>, GPT-2 a text with
     * <|endoftext|>, SentencePiece llama with </s> */
    if (!loom_test_models_dir()) return;
    loom_gguf *g = NULL;
    loom_tokenizer *t = open_vocab("ggml-vocab-phi-3.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_tokenize_ex(t, "<|end|>", 7, LOOM_TOKENIZE_PARSE_SPECIAL, ids, 8, &n) ==
               LOOM_OK);
    LOOM_REQUIRE(n == 1);
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(t), ids[0]);
    LOOM_CHECK(loom_token_is_eog(t, ids[0]) && loom_token_is_eog(t, loom_tokenizer_eos(t)));
    LOOM_CHECK(!loom_token_is_eog(t, loom_tokenizer_bos(t)));
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    t = open_vocab("ggml-vocab-gpt-2.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_token_is_eog(t, 50256));
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    t = open_vocab("ggml-vocab-llama-spm.gguf", &g);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_token_is_eog(t, 2) && !loom_token_is_eog(t, 1));
    LOOM_CHECK_EQ_INT(loom_tokenizer_eot(t), -1);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
}

/* The end-of-generation set and the control tokens of every shared vocabulary, as llama.cpp
 * c392e5094deaf2d1a7c18683214f007fad3fe42b sees them (its debug lines "control token N is
 * not marked as EOG" at load, less the EOS it adds to the set afterwards): ids lo..hi. */
LOOM_TEST(tokenizer, end_of_generation_sets_match_the_oracle) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    static const struct {
        const char *vocab;
        int32_t eog[2];          /* -1: unused */
        int32_t ctrl[3][2];      /* control, not EOG: ranges lo..hi, {-1, -1}: unused */
    } cases[] = {
        {"ggml-vocab-phi-3.gguf", {32000, 32007}, {{0, 1}, {32001, 32006}, {32008, 32010}}},
        {"ggml-vocab-gpt-2.gguf", {50256, -1}, {{-1, -1}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-llama-spm.gguf", {2, -1}, {{1, 1}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-deepseek-coder.gguf", {32014, -1}, {{32013, 32013}, {32015, 32017}, {-1, -1}}},
        {"ggml-vocab-deepseek-llm.gguf", {100001, -1}, {{100000, 100000}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-falcon.gguf", {11, -1}, {{0, 10}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-mpt.gguf", {0, -1}, {{1, 1}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-refact.gguf", {0, -1}, {{1, 18}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-starcoder.gguf", {0, -1}, {{1, 37}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-baichuan.gguf", {2, -1}, {{1, 1}, {-1, -1}, {-1, -1}}},
        {"ggml-vocab-gpt-neox.gguf", {0, -1}, {{1, 1}, {-1, -1}, {-1, -1}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        loom_gguf *g = NULL;
        loom_tokenizer *t = open_vocab(cases[c].vocab, &g);
        LOOM_REQUIRE(t != NULL);
        int bad = 0;
        for (int32_t id = 0; id < loom_tokenizer_n_vocab(t); id++) {
            bool eog = id == cases[c].eog[0] || id == cases[c].eog[1], ctrl = false;
            for (int r = 0; r < 3; r++)
                ctrl |= id >= cases[c].ctrl[r][0] && id <= cases[c].ctrl[r][1];
            if (loom_token_is_eog(t, id) != eog ||
                (loom_token_is_control(t, id) && !loom_token_is_eog(t, id)) != ctrl) {
                if (bad++ < 3)
                    loom_test_fail(__FILE__, __LINE__, "%s: token %d ('%s'): eog %d control %d",
                                   cases[c].vocab, id, loom_token_text(t, id),
                                   loom_token_is_eog(t, id), loom_token_is_control(t, id));
            }
        }
        LOOM_CHECK_EQ_INT(bad, 0);
        loom_tokenizer_free(t);
        loom_gguf_free(g);
    }
}
