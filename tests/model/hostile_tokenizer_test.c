/*
 * Hostile vocabularies and texts through the tokenizers (issue #29 item 8): empty, duplicate
 * and 1 MiB tokens, merges naming tokens the vocabulary lacks, invalid UTF-8 in the
 * vocabulary and in the text, special tokens that overlap or nest, texts made only of
 * fragments of special tokens, and long inputs, over SentencePiece (llama), byte-level BPE
 * (gpt2, with each family of pre-tokenizer) and WordPiece (bert), with and without special
 * parsing. Each vocabulary either loads or is refused with a message naming what is wrong;
 * each text either tokenizes into ids that are in range and decode, or is refused (invalid
 * UTF-8 where the tokenizer needs code points) with a message; an alarm bounds every case's
 * time, so a hang fails the test instead of the CI job.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/gguf.h"
#include "loom/tokenizer.h"
#include "tests/shim/loom_test.h"

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_BYTE = 6 };

typedef struct vocab {
    const char *model; /* tokenizer.ggml.model */
    const char *pre;   /* tokenizer.ggml.pre, NULL: none */
    int n;
    const char **text;
    size_t *len; /* NULL: strlen */
    int32_t *type;
    const char **merges;
    int n_merges;
    int64_t unk; /* -1: key not written */
} vocab;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "hostile_tokenizer: a case ran past its time bound (a hang)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
    _exit(2);
}

/* A vocabulary: 3 controls, the 256 byte tokens (SPM) or printable bytes (BPE/WPM), then the
 * given extra tokens. */
static loom_status open_vocab(const vocab *v, void **data, loom_gguf **g) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    if (!w) return LOOM_ERR_NOMEM;
    loom_gguf_set_str(w, "general.architecture", "llama");
    loom_gguf_set_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) loom_gguf_set_str(w, "tokenizer.ggml.pre", v->pre);
    loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", v->text, (uint64_t)v->n);
    loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, v->type, (uint64_t)v->n);
    if (v->merges)
        loom_gguf_set_arr_str(w, "tokenizer.ggml.merges", v->merges, (uint64_t)v->n_merges);
    if (v->unk >= 0) loom_gguf_set_i64(w, "tokenizer.ggml.unknown_token_id", v->unk);
    loom_gguf_set_i64(w, "tokenizer.ggml.bos_token_id", 1);
    loom_gguf_set_i64(w, "tokenizer.ggml.eos_token_id", 2);
    size_t size = 0;
    loom_status st = loom_gguf_write_memory(w, data, &size);
    if (!st) st = loom_gguf_open_memory(*data, size, g);
    loom_gguf_writer_free(w);
    return st;
}

/* Tokenizes every text under every flag combination; ids in range and decodable. */
static void tokenize_all(const char *what, const loom_tokenizer *t, const char *const *texts,
                         const size_t *lens, int n_texts) {
    const size_t cap = 1 << 21;
    int32_t *ids = malloc(cap * sizeof *ids);
    char piece[256];
    for (int i = 0; i < n_texts; i++)
        for (unsigned flags = 0; flags < 16; flags += 15) { /* none, and all four */
            size_t n = 0;
            alarm(20);
            const loom_status st = loom_tokenize_ex(t, texts[i], lens[i], flags, ids, cap, &n);
            alarm(0);
            if (st != LOOM_OK) {
                /* a refusal says why (only invalid UTF-8 may be refused) */
                LOOM_CHECK_MSG(strstr(loom_last_error(), "UTF-8") != NULL,
                               "%s text %d flags %u: %s", what, i, flags, loom_last_error());
                continue;
            }
            const int32_t nv = loom_tokenizer_n_vocab(t);
            for (size_t k = 0; k < n; k++) {
                if (ids[k] < 0 || ids[k] >= nv) {
                    LOOM_CHECK_MSG(false, "%s text %d flags %u: id %d of %zu out of [0, %d)", what,
                                   i, flags, ids[k], k, nv);
                    break;
                }
                (void)loom_token_to_piece(t, ids[k], piece, sizeof piece);
            }
        }
    free(ids);
}

/* The hostile texts: invalid UTF-8 (lone continuation, truncated sequence, overlong, surrogate,
 * past U+10FFFF), NULs, fragments of the special tokens, specials glued to each other, and
 * long runs (128 KiB without a space, 32 KiB of specials). */
#define N_TEXTS 12
static void hostile_texts(const char *texts[N_TEXTS], size_t lens[N_TEXTS], char **owned) {
    static const char *const fixed[] = {
        "\x80\x80 abc \xc3",
        "ok \xe2\x82 \xf0\x9f\x98 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xff\xfe",
        "<|im_<|im_st<|im_start<|im_start|<|im_start|>>|>",
        "<a><b><a><<b>>a><ab><a",
        "\0mid\0nul\0",
        "[CLS][SEP][UNK][MASK]##a##",
        "",
        "<s></s><unk><s><s>",
        "   \t\n\r\n  \xc2\xa0\xe3\x80\x80 ",
    };
    int i = 0;
    for (; i < 9; i++) {
        texts[i] = fixed[i];
        lens[i] = i == 4 ? 10 : strlen(fixed[i]);
    }
    const size_t big = 1 << 17;
    char *run = malloc(big), *specials = malloc(big / 4), *mixed = malloc(big / 4);
    for (size_t k = 0; k < big; k++)
        run[k] = (char)('a' + k % 7);
    for (size_t k = 0; k < big / 4; k++) {
        specials[k] = "<a><b>"[k % 6];
        mixed[k] = "x<|im_start|>\xe2\x82\xac y\n"[k % 19];
    }
    texts[i] = run, lens[i++] = big;
    texts[i] = specials, lens[i++] = big / 4;
    texts[i] = mixed, lens[i++] = big / 4;
    owned[0] = run, owned[1] = specials, owned[2] = mixed;
}

/* A vocabulary of `kind` with the common base and the extra tokens appended. */
typedef struct built {
    const char *text[600];
    size_t len[600];
    int32_t type[600];
    char store[600][8];
    int n;
} built;

static void base(built *b, const char *model) {
    b->n = 0;
    const char *ctl[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        b->text[b->n] = ctl[i];
        b->type[b->n++] = i == 0 ? T_UNKNOWN : T_CONTROL;
    }
    const bool spm = strcmp(model, "llama") == 0;
    for (int c = 0; c < 256; c++) {
        if (spm) {
            snprintf(b->store[b->n], 8, "<0x%02X>", c);
            b->type[b->n] = T_BYTE;
        } else {
            if (c < 0x21 || c > 0x7e) continue; /* the printable ASCII bytes */
            b->store[b->n][0] = (char)c;
            b->store[b->n][1] = 0;
            b->type[b->n] = T_NORMAL;
        }
        b->text[b->n] = b->store[b->n];
        b->n++;
    }
}

static void add(built *b, const char *s, int32_t type) {
    b->text[b->n] = s;
    b->type[b->n++] = type;
}

LOOM_TEST(hostile_tokenizer, hostile_vocabularies_load_or_refuse_and_tokenize) {
    signal(SIGALRM, on_alarm);
    const char *texts[N_TEXTS];
    size_t lens[N_TEXTS];
    char *owned[3];
    hostile_texts(texts, lens, owned);
    char *huge = malloc((1 << 20) + 1);
    memset(huge, 'q', 1 << 20);
    huge[1 << 20] = 0;
    static const char *const models[] = {"llama", "gpt2", "gpt2", "gpt2", "bert"};
    static const char *const pres[] = {NULL, "default", "llama3", "qwen2", NULL};
    static const char *const merges[] = {"a b",       "ab c", "zz yy", "<a> <b>", "q q",
                                         "\xff \xfe", "a a",  "a b",   " ",       "x"};
    int loaded = 0, refused = 0;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++)
        for (int variant = 0; variant < 4; variant++) {
            built *b = malloc(sizeof *b);
            base(b, models[m]);
            add(b, "", T_NORMAL); /* empty tokens, normal and special */
            add(b, "", T_CONTROL);
            add(b, "", T_USER);
            add(b, "ab", T_NORMAL); /* duplicates */
            add(b, "ab", T_NORMAL);
            add(b, "<a>", T_USER); /* specials that overlap and nest */
            add(b, "<a><b>", T_CONTROL);
            add(b, "<b>", T_USER);
            add(b, "<", T_CONTROL);
            add(b, "a>", T_USER);
            add(b, "<|im_start|>", T_CONTROL);
            add(b, "<|im_start", T_USER);
            add(b, "\xff\xfe\x80", T_NORMAL); /* invalid UTF-8, normal and special */
            add(b, "\xc0\xaf<", T_USER);
            add(b, "[CLS]", T_CONTROL);
            add(b, "[SEP]", T_CONTROL);
            add(b, "##a", T_NORMAL);
            if (variant >= 1) add(b, huge, T_NORMAL); /* a 1 MiB token */
            if (variant >= 2) add(b, huge, T_USER);
            vocab v = {.model = models[m],
                       .pre = pres[m],
                       .n = b->n,
                       .text = b->text,
                       .type = b->type,
                       /* merges naming missing tokens, invalid UTF-8, no space, specials */
                       .merges = strcmp(models[m], "gpt2") == 0 ? merges : NULL,
                       .n_merges = variant == 3 ? 10 : 8,
                       .unk = 0};
            void *data = NULL;
            loom_gguf *g = NULL;
            LOOM_REQUIRE(open_vocab(&v, &data, &g) == LOOM_OK);
            loom_tokenizer *t = NULL;
            alarm(20);
            const loom_status st = loom_tokenizer_from_gguf(g, &t);
            alarm(0);
            char what[64];
            snprintf(what, sizeof what, "%s/%s variant %d", models[m], pres[m] ? pres[m] : "-",
                     variant);
            if (st != LOOM_OK) {
                refused++;
                LOOM_CHECK(t == NULL);
                LOOM_CHECK_MSG(strncmp(loom_last_error(), "tokenizer: ", 11) == 0, "%s: %s", what,
                               loom_last_error());
                /* the only refusal here: a merge without a space, named */
                LOOM_CHECK_MSG(strstr(loom_last_error(), "has no space") != NULL, "%s: %s", what,
                               loom_last_error());
            } else {
                loaded++;
                LOOM_CHECK_MSG(variant != 3 || v.merges == NULL,
                               "%s: a merge without a space loaded", what);
                tokenize_all(what, t, texts, lens, N_TEXTS);
            }
            loom_tokenizer_free(t);
            loom_gguf_free(g);
            loom_free(data);
            free(b);
        }
    LOOM_CHECK(loaded > 0 && refused > 0);
    free(huge);
    for (int i = 0; i < 3; i++)
        free(owned[i]);
}

/* With special parsing on, a text made of whole specials gives exactly their ids, longest
 * first ("<a><b>" is one control token, not "<a>" then "<b>"); with it off, the user-defined
 * ones are still found and the control ones are text. */
LOOM_TEST(hostile_tokenizer, nested_specials_longest_first) {
    built *b = malloc(sizeof *b);
    base(b, "llama");
    const int a = b->n;
    add(b, "<a>", T_USER);
    const int ab = b->n;
    add(b, "<a><b>", T_CONTROL);
    const int bb = b->n;
    add(b, "<b>", T_USER);
    vocab v = {.model = "llama", .n = b->n, .text = b->text, .type = b->type, .unk = 0};
    void *data = NULL;
    loom_gguf *g = NULL;
    LOOM_REQUIRE(open_vocab(&v, &data, &g) == LOOM_OK);
    loom_tokenizer *t = NULL;
    LOOM_REQUIRE(loom_tokenizer_from_gguf(g, &t) == LOOM_OK);
    int32_t ids[64];
    size_t n = 0;
    const char *text = "<a><b><b><a>";
    LOOM_REQUIRE(loom_tokenize_ex(t, text, strlen(text), LOOM_TOKENIZE_PARSE_SPECIAL, ids, 64,
                                  &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 3);
    if (n == 3) LOOM_CHECK(ids[0] == ab && ids[1] == bb && ids[2] == a);
    LOOM_REQUIRE(loom_tokenize_ex(t, text, strlen(text), 0, ids, 64, &n) == LOOM_OK);
    /* without parsing the control "<a><b>" is text: the user-defined "<a>" and "<b>" match */
    LOOM_CHECK(n >= 4 && ids[0] == a && ids[1] == bb && ids[2] == bb && ids[n - 1] == a);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    loom_free(data);
    free(b);
}
