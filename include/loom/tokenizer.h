/*
 * Tokenizers from a GGUF vocabulary: SentencePiece ("llama": score-ordered merges of UTF-8
 * symbols with byte fallback) and byte-level BPE ("gpt2": ranked merges over pre-split
 * words, bytes mapped to printable code points).
 */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include "loom/core.h"
#include "loom/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_tokenizer loom_tokenizer;

typedef enum loom_tokenizer_kind {
    LOOM_TOKENIZER_SPM = 0, /* tokenizer.ggml.model = "llama" */
    LOOM_TOKENIZER_BPE = 1, /* tokenizer.ggml.model = "gpt2" */
} loom_tokenizer_kind;

/* Reads tokenizer.ggml.* from g (tokens, scores, token_type, merges, special ids). Errors
 * name the missing or malformed key. The tokenizer copies what it needs: g may be freed. */
LOOM_API loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out);
LOOM_API void loom_tokenizer_free(loom_tokenizer *t);

LOOM_API loom_tokenizer_kind loom_tokenizer_kind_of(const loom_tokenizer *t);
LOOM_API int32_t loom_tokenizer_n_vocab(const loom_tokenizer *t);
LOOM_API int32_t loom_tokenizer_bos(const loom_tokenizer *t); /* -1 if none */
LOOM_API int32_t loom_tokenizer_eos(const loom_tokenizer *t); /* -1 if none */
LOOM_API bool loom_tokenizer_add_bos(const loom_tokenizer *t); /* the vocab's preference */

/* Tokenizes text[0..len). Writes up to cap ids; *n_out is the number of ids the text needs
 * (call again with a bigger buffer if *n_out > cap: LOOM_ERR_FULL). */
LOOM_API loom_status loom_tokenize(const loom_tokenizer *t, const char *text, size_t len,
                                   bool add_bos, int32_t *out, size_t cap, size_t *n_out);
/* The raw vocabulary string of a token ("▁Hello", "<0x0A>"), NULL if out of range. */
LOOM_API const char *loom_token_text(const loom_tokenizer *t, int32_t id);
/* The bytes a token stands for in output text (spaces restored, byte tokens decoded,
 * control tokens empty). Returns the byte count (may exceed cap: then truncated). */
LOOM_API size_t loom_token_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TOKENIZER_H */
