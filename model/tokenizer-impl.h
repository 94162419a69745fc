/* Internal state of a tokenizer, shared by the SentencePiece (tokenizer.c) and BPE (bpe.c)
 * halves. */
#ifndef LOOM_TOKENIZER_IMPL_H
#define LOOM_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

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

/* A BPE pre-tokenizer (pretok.c): its patterns, applied in turn. */
#define LOOM_PRETOK_MAX_RE 8
typedef struct loom_pretok {
    const char *family; /* "llama3", "gpt-2", ... (static) */
    int n_re;
    pcre2_code *re[LOOM_PRETOK_MAX_RE];
    bool ignore_merges; /* a pre-token that is a vocabulary token is taken whole (Llama 3) */
    bool add_bos;       /* the family's BOS default, before tokenizer.ggml.add_bos_token */
} loom_pretok;

/* pre NULL: the key is missing (a warning naming the fallback); unknown: an error naming it. */
loom_status loom__pretok_init(loom_pretok *p, const char *pre);
void loom__pretok_free(loom_pretok *p);
/* Whether pre names a known pre-tokenizer; *adds_bos (may be NULL) gets its BOS default. */
bool loom__pretok_known(const char *pre, bool *adds_bos);
/* Splits text into pieces; *seg_len (loom_malloc'd, NULL if none) gets their byte lengths in
 * order. Invalid UTF-8 is an error naming the byte offset. */
loom_status loom__pretok_split(const loom_pretok *p, const char *text, size_t len, size_t **seg_len,
                               size_t *n_seg);
size_t loom__utf8_invalid_at(const char *text, size_t n);

/* White space a special token found in the text swallows on its left / right. */
enum { LOOM_STRIP_LEFT = 1, LOOM_STRIP_RIGHT = 2 };

struct loom_tokenizer {
    loom_tokenizer_kind kind;
    int32_t n_vocab;
    char **text;   /* [n_vocab] NUL-terminated copies */
    size_t *len;   /* [n_vocab] */
    float *score;  /* [n_vocab] SentencePiece scores */
    int32_t *type; /* [n_vocab] LOOM_TOKEN_* */
    int32_t *map;  /* open-addressing text -> id, capacity map_cap (power of two) */
    size_t map_cap;
    int32_t bos, eos, unk;
    int32_t eot;  /* end of turn, -1 if none */
    uint8_t *eog; /* [n_vocab] 1: the token ends generation (EOS, EOT, EOM, ...) */
    bool add_bos, add_eos;
    bool add_space_prefix; /* SPM: " " before text at the start and after a special token */
    int32_t *special;      /* control / user-defined / unknown ids, longest text first */
    int32_t n_special;
    uint8_t *strip;          /* [n_vocab] LOOM_STRIP_* of special tokens, NULL if none */
    int32_t byte_token[256]; /* SPM: id of <0xXX>, -1 if absent */
    void *bpe;               /* BPE state (bpe.c), NULL for SPM */
};

/* id of the token whose text is s[0..n), or -1 */
int32_t loom__tok_find(const loom_tokenizer *t, const char *s, size_t n);

loom_status loom__bpe_init(loom_tokenizer *t, const loom_gguf *g, const char *pre);
void loom__bpe_free(loom_tokenizer *t);
/* BPE over text that holds no special token; appends to out (counting past cap). */
loom_status loom__bpe_tokenize(const loom_tokenizer *t, const char *text, size_t len, int32_t *out,
                               size_t cap, size_t *n_out);
const char *loom__bpe_pre(const loom_tokenizer *t);
/* Whether the vocabulary has the token of byte c (a byte without one is dropped from text). */
bool loom__bpe_has_byte(const loom_tokenizer *t, uint8_t c);
/* WordPiece (wpm.c) over text that holds no special token. */
loom_status loom__wpm_tokenize(const loom_tokenizer *t, const char *text, size_t len, int32_t *out,
                               size_t cap, size_t *n_out);
size_t loom__bpe_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
