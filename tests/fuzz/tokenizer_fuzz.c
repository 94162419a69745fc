#define _GNU_SOURCE /* strdup, strtok_r */
/*
 * libFuzzer target for the tokenizers: arbitrary bytes (invalid UTF-8, NULs, control
 * tokens' text, long runs) tokenized with real vocabularies (LOOM_FUZZ_VOCABS: a
 * colon-separated list of GGUF files, e.g. the SentencePiece llama and the BPE gpt-2 vocabs
 * from ../shared/models). Every id must be in the vocabulary, a too-small buffer must say
 * how many ids are needed (and a retry with that many must give the same ids), and every
 * id must turn back into a piece; never a crash, a hang or a leak.
 *
 * Input: byte 0 = vocab index and add_bos; the rest is the text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/tokenizer.h"

enum { MAX_VOCABS = 4 };
static loom_tokenizer *toks[MAX_VOCABS];
static loom_gguf *files[MAX_VOCABS];
static int n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *env = getenv("LOOM_FUZZ_VOCABS");
    if (!env || !*env) {
        fprintf(stderr, "tokenizer_fuzz: set LOOM_FUZZ_VOCABS to vocab GGUF files\n");
        abort();
    }
    char *copy = strdup(env), *save = NULL;
    for (char *p = strtok_r(copy, ":", &save); p && n_toks < MAX_VOCABS;
         p = strtok_r(NULL, ":", &save)) {
        if (loom_gguf_open(p, &files[n_toks]) != LOOM_OK ||
            loom_tokenizer_from_gguf(files[n_toks], &toks[n_toks]) != LOOM_OK) {
            fprintf(stderr, "tokenizer_fuzz: %s: %s\n", p, loom_last_error());
            abort();
        }
        n_toks++;
    }
    free(copy);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096 || n_toks == 0) return 0;
    const loom_tokenizer *t = toks[data[0] % n_toks];
    const bool bos = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const int32_t V = loom_tokenizer_n_vocab(t);
    size_t cap = len / 4 + 1, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return 0;
    loom_status st = loom_tokenize(t, text, len, bos, ids, cap, &n);
    if (st == LOOM_ERR_FULL) {
        if (n <= cap) __builtin_trap(); /* FULL must say how many are needed */
        int32_t *first = malloc(cap * sizeof *first);
        if (!first) {
            free(ids);
            return 0;
        }
        memcpy(first, ids, cap * sizeof *ids);
        size_t need = n, cap0 = cap;
        free(ids);
        cap = need;
        ids = malloc(cap * sizeof *ids);
        if (!ids) {
            free(first);
            return 0;
        }
        st = loom_tokenize(t, text, len, bos, ids, cap, &n);
        if (st != LOOM_OK || n != need || memcmp(first, ids, cap0 * sizeof *ids) != 0)
            __builtin_trap();
        free(first);
    }
    if (st == LOOM_OK) {
        char piece[256];
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= V) __builtin_trap();
            (void)loom_token_to_piece(t, ids[i], piece, sizeof piece);
            (void)loom_token_text(t, ids[i]);
        }
    }
    (void)loom_token_text(t, -1);
    (void)loom_token_text(t, V);
    free(ids);
    return 0;
}
