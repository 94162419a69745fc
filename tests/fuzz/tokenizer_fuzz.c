/*
 * libFuzzer target for the tokenizers: any text, under any flags, against the shared test
 * vocabularies (SentencePiece, byte-level BPE with several pre-tokenizers, WordPiece) must
 * tokenize or be refused with an error (invalid UTF-8 for BPE / WordPiece), and every id
 * must be in range and decode — never crash, hang or read out of bounds. The first input
 * byte picks the vocabulary and the flags. Built and run by tests/fuzz/tokenizer_run.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom/gguf.h"
#include "loom/tokenizer.h"

static const char *const VOCABS[] = {"ggml-vocab-llama-spm.gguf",    "ggml-vocab-gpt-2.gguf",
                                     "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf",
                                     "ggml-vocab-starcoder.gguf",    "ggml-vocab-bert-bge.gguf"};
enum { N_VOCABS = sizeof VOCABS / sizeof VOCABS[0] };
static loom_tokenizer *tok[N_VOCABS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("LOOM_MODELS_DIR");
    if (!dir) dir = "../shared/models";
    loom_log_set_level(LOOM_LOG_ERROR);
    for (int v = 0; v < N_VOCABS; v++) {
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
