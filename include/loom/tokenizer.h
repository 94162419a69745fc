/*
 * Tokenizers from a GGUF vocabulary: SentencePiece ("llama": score-ordered merges of UTF-8
 * symbols with byte fallback) and byte-level BPE ("gpt2": ranked merges over words split by
 * the pre-tokenizer that tokenizer.ggml.pre names, bytes mapped to printable code points).
 * Special tokens (control, user-defined, unknown) written in the text are found first, longest
 * first; user-defined ones always, control and unknown ones only with
 * LOOM_TOKENIZE_PARSE_SPECIAL. WordPiece ("bert": BERT's uncased normalizer, greedy longest
 * pieces) is built too; the other models are refused by name.
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
    LOOM_TOKENIZER_WPM = 2, /* tokenizer.ggml.model = "bert" (WordPiece, uncased BERT) */
} loom_tokenizer_kind;

/* Reads tokenizer.ggml.* from g (tokens, scores, token_type, merges, special ids, add_*_token,
 * pre). Errors name the missing or malformed key; an unknown tokenizer.ggml.pre is an error
 * naming it (LOOM_ERR_UNSUPPORTED), a BPE vocabulary without the key logs a warning and uses
 * the 'default' pre-tokenizer, as llama.cpp does. The tokenizer copies what it needs: g may
 * be freed. */
LOOM_API loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out);
/* Whether g declares that it has no vocabulary (tokenizer.ggml.model "none" or "no_vocab", as
 * llama.cpp's converter writes with --no-vocab); loom_tokenizer_from_gguf refuses such a file. */
LOOM_API bool loom_tokenizer_declared_none(const loom_gguf *g);
LOOM_API void loom_tokenizer_free(loom_tokenizer *t);

LOOM_API loom_tokenizer_kind loom_tokenizer_kind_of(const loom_tokenizer *t);
LOOM_API int32_t loom_tokenizer_n_vocab(const loom_tokenizer *t);
LOOM_API int32_t loom_tokenizer_bos(const loom_tokenizer *t);  /* -1 if none */
LOOM_API int32_t loom_tokenizer_eos(const loom_tokenizer *t);  /* -1 if none */
/* The end-of-turn token ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", ...: the key
 * tokenizer.ggml.eot_token_id, else found by its text), -1 if none. */
LOOM_API int32_t loom_tokenizer_eot(const loom_tokenizer *t);
/* Whether id ends generation: EOS, the end-of-turn and end-of-message tokens, and the other
 * tokens the reference engines stop at (ChatML's <|im_end|>, Phi-3's <|end|>, harmony's
 * <|return|> and <|call|>, Qwen's fill-in-the-middle separators). False out of range. */
LOOM_API bool loom_token_is_eog(const loom_tokenizer *t, int32_t id);
LOOM_API bool loom_tokenizer_add_bos(const loom_tokenizer *t); /* the vocab's preference */
LOOM_API bool loom_tokenizer_add_eos(const loom_tokenizer *t); /* the vocab's preference */
/* The BPE pre-tokenizer family in use ("llama3", "gpt-2", "deepseek-llm", ...; the family a
 * tokenizer.ggml.pre alias maps onto), NULL for SentencePiece. */
LOOM_API const char *loom_tokenizer_pre(const loom_tokenizer *t);

typedef enum loom_tokenize_flags {
    LOOM_TOKENIZE_ADD_SPECIAL = 1u << 0,   /* BOS and EOS as the vocabulary asks (add_*_token) */
    LOOM_TOKENIZE_ADD_BOS = 1u << 1,       /* BOS first, whatever the vocabulary asks */
    LOOM_TOKENIZE_ADD_EOS = 1u << 2,       /* EOS last, whatever the vocabulary asks */
    LOOM_TOKENIZE_PARSE_SPECIAL = 1u << 3, /* control tokens in the text ("<|im_start|>", "<s>")
                                              are those tokens; without it they are plain text */
} loom_tokenize_flags;

/* Tokenizes text[0..len) under flags (loom_tokenize_flags). Writes up to cap ids; *n_out is the
 * number the text needs (LOOM_ERR_FULL if it exceeds cap). A BOS or EOS asked for that the
 * vocabulary lacks is an error naming it; so is text a BPE vocabulary gets that is not UTF-8. */
LOOM_API loom_status loom_tokenize_ex(const loom_tokenizer *t, const char *text, size_t len,
                                      unsigned flags, int32_t *out, size_t cap, size_t *n_out);

/* Tokenizes text[0..len) with special tokens parsed (LOOM_TOKENIZE_PARSE_SPECIAL), and a BOS
 * first if add_bos and the vocabulary has one. Writes up to cap ids; *n_out is the number of
 * ids the text needs (call again with a bigger buffer if *n_out > cap: LOOM_ERR_FULL). */
LOOM_API loom_status loom_tokenize(const loom_tokenizer *t, const char *text, size_t len,
                                   bool add_bos, int32_t *out, size_t cap, size_t *n_out);
/* The raw vocabulary string of a token ("▁Hello", "<0x0A>"), NULL if out of range. */
LOOM_API const char *loom_token_text(const loom_tokenizer *t, int32_t id);
/* Whether id is a control token (BOS, EOS, "<|im_start|>" ...): empty as a piece. */
LOOM_API bool loom_token_is_control(const loom_tokenizer *t, int32_t id);
/* The bytes a token stands for in output text (spaces restored, byte tokens decoded,
 * control tokens empty). Returns the byte count (may exceed cap: then truncated). */
LOOM_API size_t loom_token_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TOKENIZER_H */
