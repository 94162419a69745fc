/*
 * libFuzzer target for the tokenizers: any text, under any flags, against the shared test
 * vocabularies (SentencePiece, byte-level BPE with several pre-tokenizers, WordPiece) must
 * tokenize or be refused with an error (invalid UTF-8 for BPE / WordPiece), and every id
 * must be in range and decode — never crash, hang or read out of bounds. The first input
 * byte picks the vocabulary and the flags (special parsing among them). Besides the shared
 * vocabularies, two hostile ones built here (SentencePiece and byte-level BPE): empty and
 * duplicate tokens, special tokens that overlap and nest ("<a>", "<a><b>", "<", "a>",
 * "<|im_start", "<|im_start|>"), specials of invalid UTF-8, merges naming missing tokens.
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gguf.h"
#include "loom/tokenizer.h"

static const char *const VOCABS[] = {"ggml-vocab-llama-spm.gguf",    "ggml-vocab-gpt-2.gguf",
                                     "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf",
                                     "ggml-vocab-starcoder.gguf",    "ggml-vocab-bert-bge.gguf"};
enum { N_FILES = sizeof VOCABS / sizeof VOCABS[0], N_VOCABS = N_FILES + 2 };
static loom_tokenizer *tok[N_VOCABS];

/* The hostile vocabulary of model "llama" or "gpt2" (see the head of the file). */
static loom_tokenizer *hostile_vocab(const char *model) {
    static char bytes[256][8];
    const char *text[300];
    int32_t type[300];
    int n = 0;
    const char *ctl[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        text[n] = ctl[i];
        type[n++] = i == 0 ? 2 : 3;
    }
    const bool spm = !strcmp(model, "llama");
    for (int c = 0; c < 256; c++) {
        if (spm) {
            snprintf(bytes[c], 8, "<0x%02X>", c);
            type[n] = 6;
        } else {
            if (c < 0x21 || c > 0x7e) continue;
            bytes[c][0] = (char)c;
            type[n] = 1;
        }
        text[n++] = bytes[c];
    }
    static const struct {
        const char *s;
        int32_t type;
    } extra[] = {{"", 1},         {"", 3},          {"", 4},        {"ab", 1},
                 {"ab", 1},       {"<a>", 4},       {"<a><b>", 3},  {"<b>", 4},
                 {"<", 3},        {"a>", 4},        {"<|im_start|>", 3}, {"<|im_start", 4},
                 {"\xff\xfe\x80", 1}, {"\xc0\xaf<", 4}, {"[CLS]", 3},  {"##a", 1}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        text[n] = extra[i].s;
        type[n++] = extra[i].type;
    }
    static const char *const merges[] = {"a b", "ab c", "zz yy", "<a> <b>", "\xff \xfe", "a a"};
    loom_gguf_writer *w = loom_gguf_writer_new();
    loom_tokenizer *t = NULL;
    if (!w) return NULL;
    loom_gguf_set_str(w, "tokenizer.ggml.model", model);
    if (!spm) loom_gguf_set_str(w, "tokenizer.ggml.pre", "llama3");
    loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", text, (uint64_t)n);
    loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, type, (uint64_t)n);
    if (!spm) loom_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 6);
    loom_gguf_set_i64(w, "tokenizer.ggml.unknown_token_id", 0);
    void *data = NULL;
    size_t size = 0;
    loom_gguf *g = NULL;
    if (loom_gguf_write_memory(w, &data, &size) == LOOM_OK &&
        loom_gguf_open_memory(data, size, &g) == LOOM_OK)
        loom_tokenizer_from_gguf(g, &t);
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("LOOM_MODELS_DIR");
    if (!dir) dir = "../shared/models";
    loom_log_set_level(LOOM_LOG_ERROR);
    tok[N_FILES] = hostile_vocab("llama");
    tok[N_FILES + 1] = hostile_vocab("gpt2");
    if (!tok[N_FILES] || !tok[N_FILES + 1]) abort(); /* they load (a test asserts it) */
    for (int v = 0; v < N_FILES; v++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, VOCABS[v]);
        loom_gguf *g = NULL;
        if (loom_gguf_open(path, &g) == LOOM_OK) loom_tokenizer_from_gguf(g, &tok[v]);
        loom_gguf_free(g);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    loom_tokenizer *t = tok[data[0] % N_VOCABS];
    if (!t) return 0;
    unsigned flags = (data[0] / N_VOCABS) & 15u;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n = 0;
    static int32_t ids[1 << 16];
    if (loom_tokenize_ex(t, text, len, flags, ids, sizeof ids / sizeof ids[0], &n) != LOOM_OK)
        return 0;
    char piece[512];
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= loom_tokenizer_n_vocab(t)) abort();
        (void)loom_token_to_piece(t, ids[i], piece, sizeof piece);
    }
    return 0;
}
