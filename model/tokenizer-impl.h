/* Internal state of a tokenizer, shared by the SentencePiece (tokenizer.c) and BPE (bpe.c)
 * halves. */
#ifndef LOOM_TOKENIZER_IMPL_H
#define LOOM_TOKENIZER_IMPL_H

#include "loom/tokenizer.h"

/* tokenizer.ggml.token_type values */
enum {
    LOOM_TOKEN_NORMAL = 1,
    LOOM_TOKEN_UNKNOWN = 2,
    LOOM_TOKEN_CONTROL = 3,
    LOOM_TOKEN_USER_DEFINED = 4,
    LOOM_TOKEN_UNUSED = 5,
    LOOM_TOKEN_BYTE = 6,
};

struct loom_tokenizer {
    loom_tokenizer_kind kind;
    int32_t n_vocab;
    char **text;     /* [n_vocab] NUL-terminated copies */
    size_t *len;     /* [n_vocab] */
    float *score;    /* [n_vocab] SentencePiece scores */
    int32_t *type;   /* [n_vocab] LOOM_TOKEN_* */
    int32_t *map;    /* open-addressing text -> id, capacity map_cap (power of two) */
    size_t map_cap;
    int32_t bos, eos, unk;
    bool add_bos;
    int32_t byte_token[256]; /* SPM: id of <0xXX>, -1 if absent */
    void *bpe;               /* BPE state (bpe.c), NULL for SPM */
};

/* id of the token whose text is s[0..n), or -1 */
int32_t loom__tok_find(const loom_tokenizer *t, const char *s, size_t n);

loom_status loom__bpe_init(loom_tokenizer *t, const loom_gguf *g);
void loom__bpe_free(loom_tokenizer *t);
loom_status loom__bpe_tokenize(const loom_tokenizer *t, const char *text, size_t len,
                               int32_t *out, size_t cap, size_t *n_out);
size_t loom__bpe_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
