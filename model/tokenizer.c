/*
 * SentencePiece tokenizer over a GGUF vocabulary (tokenizer.ggml.model = "llama").
 *
 * Text is prefixed with a space (SentencePiece's add_dummy_prefix), spaces become U+2581
 * ("▁"), and the string is cut into UTF-8 characters. Then, repeatedly, the adjacent pair
 * whose concatenation is a vocabulary token with the highest score is merged (ties: the
 * leftmost pair). Symbols left that are not tokens are spelled with byte tokens <0xXX>.
 * BPE vocabularies (model "gpt2") live in bpe.c.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer-impl.h"

/* ---------------------------------------------------------------- vocabulary map */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

int32_t loom__tok_find(const loom_tokenizer *t, const char *s, size_t n) {
    size_t mask = t->map_cap - 1;
    for (size_t k = hash_bytes(s, n) & mask;; k = (k + 1) & mask) {
        int32_t id = t->map[k];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->text[id], s, n) == 0) return id;
    }
}

static loom_status build_map(loom_tokenizer *t) {
    size_t cap = 16;
    while (cap < (size_t)t->n_vocab * 2)
        cap <<= 1;
    t->map = loom_malloc(cap * sizeof *t->map);
    if (!t->map) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->map_cap = cap;
    for (size_t k = 0; k < cap; k++)
        t->map[k] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t k = hash_bytes(t->text[id], t->len[id]) & (cap - 1);
        bool dup = false;
        while (t->map[k] >= 0) {
            int32_t o = t->map[k];
            if (t->len[o] == t->len[id] && memcmp(t->text[o], t->text[id], t->len[id]) == 0) {
                dup = true; /* keep the first id for a repeated string */
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (!dup) t->map[k] = id;
    }
    return LOOM_OK;
}

/* The tokens found in text before it is tokenized: control, user-defined and unknown ones,
 * longest text first (ties: lower id first). */
typedef struct len_id {
    size_t len;
    int32_t id;
} len_id;

static int by_len_desc(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool is_special_type(int32_t ty) {
    return ty == LOOM_TOKEN_CONTROL || ty == LOOM_TOKEN_USER_DEFINED || ty == LOOM_TOKEN_UNKNOWN;
}

static loom_status build_special(loom_tokenizer *t) {
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        n += t->len[id] > 0 && is_special_type(t->type[id]);
    len_id *v = loom_malloc((n ? n : 1) * sizeof *v);
    t->special = loom_malloc((n ? n : 1) * sizeof *t->special);
    if (!v || !t->special) {
        loom_free(v);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    }
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->len[id] > 0 && is_special_type(t->type[id])) v[n++] = (len_id){t->len[id], id};
    qsort(v, n, sizeof *v, by_len_desc);
    for (size_t i = 0; i < n; i++)
        t->special[i] = v[i].id;
    t->n_special = (int32_t)n;
    loom_free(v);
    return LOOM_OK;
}

static bool set_strip_of(loom_tokenizer *t, const char *text, int how, bool on) {
    int32_t id = loom__tok_find(t, text, strlen(text));
    if (id < 0) return false;
    t->strip[id] = (uint8_t)(on ? t->strip[id] | how : t->strip[id] & ~how);
    return true;
}

/* GGUF files do not carry the added tokens' lstrip / rstrip; the reference engines set them
 * by model for the models whose tokenizers use them, and so does this. */
static loom_status set_strip(loom_tokenizer *t, const loom_gguf *g, const char *pre) {
    char name[128] = "";
    const char *s;
    if (loom_gguf_find_kv(g, "general.name") >= 0 &&
        loom_gguf_get_str(g, "general.name", &s) == LOOM_OK) {
        size_t i = 0;
        for (; s[i] && i + 1 < sizeof name; i++)
            name[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
        name[i] = 0;
    }
    bool phi3 = strstr(name, "phi-3") || strstr(name, "phi3");
    bool jina = pre && (!strcmp(pre, "jina-v2-de") || !strcmp(pre, "jina-v2-es") ||
                        !strcmp(pre, "jina-v2-code"));
    if (!phi3 && !jina) return LOOM_OK;
    t->strip = loom_calloc((size_t)t->n_vocab, 1);
    if (!t->strip) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    if (jina) set_strip_of(t, "<mask>", LOOM_STRIP_LEFT, true);
    if (phi3) { /* Phi-3's chat tokens swallow the white space after them */
        for (int32_t k = 0; k < t->n_special; k++)
            t->strip[t->special[k]] |= LOOM_STRIP_RIGHT;
        set_strip_of(t, "</s>", LOOM_STRIP_RIGHT, true);
        set_strip_of(t, "<unk>", LOOM_STRIP_RIGHT, false);
        set_strip_of(t, "<s>", LOOM_STRIP_RIGHT, false);
        set_strip_of(t, "<|endoftext|>", LOOM_STRIP_RIGHT, false);
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- loading */

static loom_status get_int_or(const loom_gguf *g, const char *key, int64_t dflt, int64_t *out) {
    if (loom_gguf_find_kv(g, key) < 0) {
        *out = dflt;
        return LOOM_OK;
    }
    return loom_gguf_get_int(g, key, out);
}

/* ---------------------------------------------------------------- end of generation */

/* Token texts that end a turn or a text, as the reference engines recognise them (GGUF files
 * often name only the EOS): chat ends (Llama 3, ChatML, Phi-3, Gemma, harmony), Llama 3.1's
 * end of message, and Qwen's fill-in-the-middle padding, repository and file separators. A
 * matching token is treated as a control token, as the reference engines do. */
static const char *const eot_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<EOT>",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>" /* DeepSeek */};
static const char *const eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>",    "<|end|>",     "<|return|>",   "<|call|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",  "<EOT>",        "<|end_of_text|>",
    "<|fim_pad|>",   "<fim-pad>",     "<PAD>",       "<|fim_repo|>", "<|repo_name|>",
    "<fim-repo>",    "<REPO>",        "<|file_sep|>"};

/* Fill-in-the-middle prefix, suffix and middle tokens: control tokens by their text, as the
 * reference engines treat them (they do not end generation). */
static const char *const fim_texts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
    "<|fim_suffix|>", "<fim-suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",  "<SUF>",
    "<|fim_middle|>", "<fim-middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",   "<MID>"};

/* An optional special-token id key: -1 when absent; a value out of range is a warning naming
 * the key, and the id is left unset (the text search may still find the token). */
static loom_status optional_id(const loom_tokenizer *t, const loom_gguf *g, const char *key,
                               int32_t *out) {
    int64_t v;
    loom_status st = get_int_or(g, key, -1, &v);
    if (st) return loom_error(st, "tokenizer: %s", loom_last_error());
    if (v < -1 || v >= t->n_vocab) {
        LOOM_LOG_WARN("tokenizer: %s = %lld is not a token of the vocabulary of %d; ignored", key,
                      (long long)v, t->n_vocab);
        v = -1;
    }
    *out = (int32_t)v;
    return LOOM_OK;
}

/* The vocabulary's tokens with one of the texts become control tokens (and, with `ends`,
 * tokens that end generation). */
static void mark_texts(loom_tokenizer *t, const char *const *texts, size_t n, bool ends) {
    for (size_t k = 0; k < n; k++) {
        int32_t id = loom__tok_find(t, texts[k], strlen(texts[k]));
        if (id < 0) continue;
        t->type[id] = LOOM_TOKEN_CONTROL;
        if (ends) t->eog[id] = 1;
    }
}

/* The set of tokens that end generation: EOS, the end-of-turn and end-of-message tokens (named
 * by tokenizer.ggml.eot_token_id / eom_token_id or found by text), the fill-in-the-middle
 * padding tokens and every token whose text is in eog_texts. */
static loom_status build_eog(loom_tokenizer *t, const loom_gguf *g) {
    static const char *const keys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
                                       "tokenizer.ggml.fim_pad_token_id",
                                       "tokenizer.ggml.fim_rep_token_id",
                                       "tokenizer.ggml.fim_sep_token_id"};
    int32_t ids[5];
    loom_status st;
    for (int k = 0; k < 5; k++)
        if ((st = optional_id(t, g, keys[k], &ids[k]))) return st;
    t->eog = loom_calloc((size_t)t->n_vocab, 1);
    if (!t->eog) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->eot = ids[0];
    for (size_t k = 0; t->eot < 0 && k < sizeof eot_texts / sizeof eot_texts[0]; k++)
        if ((t->eot = loom__tok_find(t, eot_texts[k], strlen(eot_texts[k]))) >= 0)
            t->type[t->eot] = LOOM_TOKEN_CONTROL;
    mark_texts(t, eog_texts, sizeof eog_texts / sizeof eog_texts[0], true);
    mark_texts(t, fim_texts, sizeof fim_texts / sizeof fim_texts[0], false);
    /* the keys' ids; the texts, <|eom_id|> among them, are marked above */
    const int32_t named[] = {t->eos, t->eot, ids[1], ids[2], ids[3], ids[4]};
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++)
        if (named[k] >= 0) t->eog[named[k]] = 1;
    return LOOM_OK;
}

bool loom_token_is_eog(const loom_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}
int32_t loom_tokenizer_eot(const loom_tokenizer *t) {
    return t->eot;
}

bool loom_tokenizer_declared_none(const loom_gguf *g) {
    const char *model = NULL;
    return loom_gguf_find_kv(g, "tokenizer.ggml.model") >= 0 &&
           loom_gguf_get_str(g, "tokenizer.ggml.model", &model) == LOOM_OK &&
           (!strcmp(model, "none") || !strcmp(model, "no_vocab"));
}

loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out) {
    *out = NULL;
    const char *model;
    loom_status st = loom_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st) return loom_error(st, "tokenizer: %s", loom_last_error());
    loom_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0)
        kind = LOOM_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0)
        kind = LOOM_TOKENIZER_BPE;
    else if (strcmp(model, "bert") == 0)
        kind = LOOM_TOKENIZER_WPM;
    else if (loom_tokenizer_declared_none(g))
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "tokenizer: the file has no vocabulary (tokenizer.ggml.model '%s')",
                          model);
    else if (strcmp(model, "t5") == 0)
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "tokenizer: tokenizer.ggml.model 't5' (Unigram) is not implemented "
                          "(llama, gpt2 and bert are supported)");
    else
        return loom_error(
            LOOM_ERR_UNSUPPORTED,
            "tokenizer: unknown tokenizer.ggml.model '%s' (llama, gpt2 and bert are supported)",
            model);
    /* The pre-tokenizer is checked before anything is loaded: an unknown one is an error. */
    const char *pre = NULL;
    if (loom_gguf_find_kv(g, "tokenizer.ggml.pre") >= 0 &&
        (st = loom_gguf_get_str(g, "tokenizer.ggml.pre", &pre)))
        return loom_error(st, "tokenizer: %s", loom_last_error());
    bool pre_adds_bos = false;
    if (kind == LOOM_TOKENIZER_BPE && pre && !loom__pretok_known(pre, &pre_adds_bos))
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '%s'", pre);

    int64_t ki = loom_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (ki < 0 || loom_gguf_kv_type(g, ki) != LOOM_GGUF_ARRAY ||
        loom_gguf_kv_arr_type(g, ki) != LOOM_GGUF_STRING)
        return loom_error(LOOM_ERR_FORMAT,
                          "tokenizer: tokenizer.ggml.tokens is missing or not a string array");
    uint64_t n = loom_gguf_kv_arr_n(g, ki);
    if (n == 0 || n > INT32_MAX)
        return loom_error(LOOM_ERR_FORMAT, "tokenizer: vocabulary of %llu tokens",
                          (unsigned long long)n);

    loom_tokenizer *t = loom_calloc(1, sizeof *t);
    if (!t) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = (int32_t)n;
    t->text = loom_calloc(n, sizeof *t->text);
    t->len = loom_calloc(n, sizeof *t->len);
    t->score = loom_calloc(n, sizeof *t->score);
    t->type = loom_calloc(n, sizeof *t->type);
    if (!t->text || !t->len || !t->score || !t->type) goto oom;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        const char *s = loom_gguf_kv_arr_str(g, ki, i, &len);
        t->text[i] = loom_malloc(len + 1);
        if (!t->text[i]) goto oom;
        memcpy(t->text[i], s, len);
        t->text[i][len] = 0;
        t->len[i] = (size_t)len;
        t->type[i] = LOOM_TOKEN_NORMAL;
    }
    int64_t si = loom_gguf_find_kv(g, "tokenizer.ggml.scores");
    if (si >= 0) {
        if (loom_gguf_kv_arr_type(g, si) != LOOM_GGUF_FLOAT32 || loom_gguf_kv_arr_n(g, si) != n) {
            loom_tokenizer_free(t);
            return loom_error(LOOM_ERR_FORMAT,
                              "tokenizer: tokenizer.ggml.scores must be %llu float32 values",
                              (unsigned long long)n);
        }
        memcpy(t->score, loom_gguf_kv_arr_data(g, si), n * sizeof(float));
    }
    int64_t ti = loom_gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (ti >= 0) {
        if (loom_gguf_kv_arr_type(g, ti) != LOOM_GGUF_INT32 || loom_gguf_kv_arr_n(g, ti) != n) {
            loom_tokenizer_free(t);
            return loom_error(LOOM_ERR_FORMAT,
                              "tokenizer: tokenizer.ggml.token_type must be %llu int32 values",
                              (unsigned long long)n);
        }
        memcpy(t->type, loom_gguf_kv_arr_data(g, ti), n * sizeof(int32_t));
    }
    int64_t bos, eos, unk, cls = -1, sep = -1;
    bool add_bos = kind != LOOM_TOKENIZER_BPE;
    /* BERT: [CLS] text [SEP], CLS and SEP standing for BOS and EOS */
    if (kind == LOOM_TOKENIZER_WPM &&
        ((st = get_int_or(g, "tokenizer.ggml.cls_token_id", -1, &cls)) ||
         (st = get_int_or(g, "tokenizer.ggml.seperator_token_id", -1, &sep)))) {
        loom_tokenizer_free(t);
        return loom_error(st, "tokenizer: %s", loom_last_error());
    }
    if ((st = get_int_or(g, "tokenizer.ggml.bos_token_id", kind == LOOM_TOKENIZER_SPM ? 1 : cls,
                         &bos)) ||
        (st = get_int_or(g, "tokenizer.ggml.eos_token_id", kind == LOOM_TOKENIZER_SPM ? 2 : sep,
                         &eos)) ||
        (st = get_int_or(g, "tokenizer.ggml.unknown_token_id", kind == LOOM_TOKENIZER_SPM ? 0 : -1,
                         &unk))) {
        loom_tokenizer_free(t);
        return loom_error(st, "tokenizer: %s", loom_last_error());
    }
    bool add_eos = kind == LOOM_TOKENIZER_WPM, add_space_prefix = kind == LOOM_TOKENIZER_SPM;
    const char *flag_keys[3] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                "tokenizer.ggml.add_space_prefix"};
    bool *flag_vals[3] = {&add_bos, &add_eos, &add_space_prefix};
    if (kind == LOOM_TOKENIZER_BPE)
        add_bos = pre_adds_bos; /* the family's default (Llama 3: yes) */
    for (int k = 0; k < 3; k++)
        if (loom_gguf_find_kv(g, flag_keys[k]) >= 0 &&
            (st = loom_gguf_get_bool(g, flag_keys[k], flag_vals[k]))) {
            loom_tokenizer_free(t);
            return loom_error(st, "tokenizer: %s", loom_last_error());
        }
    if (bos < -1 || eos < -1 || unk < -1 || bos >= (int64_t)n || eos >= (int64_t)n ||
        unk >= (int64_t)n) {
        loom_tokenizer_free(t);
        return loom_error(
            LOOM_ERR_FORMAT,
            "tokenizer: special token id out of range (bos %lld, eos %lld, unk %lld, vocab %llu)",
            (long long)bos, (long long)eos, (long long)unk, (unsigned long long)n);
    }
    t->bos = (int32_t)bos;
    t->eos = (int32_t)eos;
    t->unk = (int32_t)unk;
    t->add_bos = add_bos;
    t->add_eos = add_eos;
    t->add_space_prefix = add_space_prefix;
    for (int b = 0; b < 256; b++)
        t->byte_token[b] = -1;
    if ((st = build_map(t)) || (st = build_eog(t, g)) || (st = build_special(t)) ||
        (st = set_strip(t, g, pre))) {
        loom_tokenizer_free(t);
        return st;
    }
    if (kind == LOOM_TOKENIZER_WPM) {
        if (t->unk < 0) {
            loom_tokenizer_free(t);
            return loom_error(
                LOOM_ERR_FORMAT,
                "tokenizer: a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id");
        }
    } else if (kind == LOOM_TOKENIZER_SPM) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_token[b] = loom__tok_find(t, name, 6);
        }
    } else if ((st = loom__bpe_init(t, g, pre))) {
        loom_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
oom:
    loom_tokenizer_free(t);
    return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory loading %llu tokens",
                      (unsigned long long)n);
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    if (t->text)
        for (int32_t i = 0; i < t->n_vocab; i++)
            loom_free(t->text[i]);
    loom_free(t->text);
    loom_free(t->len);
    loom_free(t->score);
    loom_free(t->type);
    loom_free(t->map);
    loom_free(t->special);
    loom_free(t->strip);
    loom_free(t->eog);
    loom__bpe_free(t);
    loom_free(t);
}

loom_tokenizer_kind loom_tokenizer_kind_of(const loom_tokenizer *t) {
    return t->kind;
}
int32_t loom_tokenizer_n_vocab(const loom_tokenizer *t) {
    return t->n_vocab;
}
int32_t loom_tokenizer_bos(const loom_tokenizer *t) {
    return t->bos;
}
int32_t loom_tokenizer_eos(const loom_tokenizer *t) {
    return t->eos;
}
bool loom_tokenizer_add_bos(const loom_tokenizer *t) {
    return t->add_bos;
}
bool loom_tokenizer_add_eos(const loom_tokenizer *t) {
    return t->add_eos;
}

bool loom_token_is_control(const loom_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->type[id] == LOOM_TOKEN_CONTROL;
}

const char *loom_token_text(const loom_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->text[id] : NULL;
}

/* ---------------------------------------------------------------- SentencePiece */

typedef struct sym {
    int prev, next;
    const char *s;
    size_t n; /* 0 once merged into its left neighbour */
} sym;

typedef struct bigram {
    int left, right;
    float score;
    size_t n; /* combined length when queued; stale if it changed */
} bigram;

/* max-heap on (score, -left) */
static bool bigram_before(const bigram *a, const bigram *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

typedef struct heap {
    bigram *v;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        bigram *v = loom_realloc(h->v, cap * sizeof *v);
        if (!v) return false;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->v[i] = b;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&h->v[i], &h->v[p])) break;
        bigram tmp = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = tmp;
        i = p;
    }
    return true;
}

static bigram heap_pop(heap *h) {
    bigram top = h->v[0];
    h->v[0] = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && bigram_before(&h->v[l], &h->v[m])) m = l;
        if (r < h->n && bigram_before(&h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        bigram tmp = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = tmp;
        i = m;
    }
    return top;
}

static bool try_bigram(const loom_tokenizer *t, heap *h, const sym *syms, int left, int right) {
    if (left < 0 || right < 0) return true;
    size_t n = syms[left].n + syms[right].n;
    int32_t id = loom__tok_find(t, syms[left].s, n);
    if (id < 0) return true;
    return heap_push(h, (bigram){.left = left, .right = right, .score = t->score[id], .n = n});
}

static size_t utf8_len(uint8_t c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Appends id to out (counting even past cap). */
static void emit(int32_t id, int32_t *out, size_t cap, size_t *n) {
    if (*n < cap) out[*n] = id;
    (*n)++;
}

static loom_status spm_tokenize(const loom_tokenizer *t, const char *text, size_t len, bool prefix,
                                int32_t *out, size_t cap, size_t *n_out) {
    /* (" " if prefix) + text with ' ' -> "\xE2\x96\x81" */
    size_t spaces = 1;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    size_t blen = len + 2 * spaces;
    char *buf = loom_malloc(blen + 1);
    sym *syms = loom_malloc((blen + 1) * sizeof *syms);
    heap h = {0};
    if (!buf || !syms) {
        loom_free(buf);
        loom_free(syms);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
    }
    size_t p = 0;
    if (prefix) {
        memcpy(buf + p, "\xE2\x96\x81", 3);
        p += 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + p, "\xE2\x96\x81", 3);
            p += 3;
        } else {
            buf[p++] = text[i];
        }
    }
    int ns = 0;
    for (size_t i = 0; i < p;) {
        size_t cl = utf8_len((uint8_t)buf[i]);
        if (cl > p - i) cl = p - i; /* a truncated sequence: take what is there */
        syms[ns] = (sym){.prev = ns - 1, .next = i + cl < p ? ns + 1 : -1, .s = buf + i, .n = cl};
        ns++;
        i += cl;
    }
    bool ok = true;
    for (int i = 1; i < ns && ok; i++)
        ok = try_bigram(t, &h, syms, i - 1, i);
    while (ok && h.n) {
        bigram b = heap_pop(&h);
        sym *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = b.left;
        ok = try_bigram(t, &h, syms, l->prev, b.left) && try_bigram(t, &h, syms, b.left, l->next);
    }
    if (!ok) {
        loom_free(h.v);
        loom_free(syms);
        loom_free(buf);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int i = 0; i != -1 && ns > 0; i = syms[i].next) {
        int32_t id = loom__tok_find(t, syms[i].s, syms[i].n);
        if (id >= 0) {
            emit(id, out, cap, n_out);
            continue;
        }
        for (size_t k = 0; k < syms[i].n; k++) {
            int32_t bid = t->byte_token[(uint8_t)syms[i].s[k]];
            emit(bid >= 0 ? bid : t->unk, out, cap, n_out);
        }
    }
    loom_free(h.v);
    loom_free(syms);
    loom_free(buf);
    return LOOM_OK;
}

/* A piece of the text: a special token found in it (tok >= 0) or text between them. */
typedef struct frag {
    size_t off, len;
    int32_t tok;
} frag;

typedef struct fragv {
    frag *v;
    size_t n, cap;
} fragv;

static bool frag_push(fragv *f, frag x) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        frag *v = loom_realloc(f->v, cap * sizeof *v);
        if (!v) return false;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
    return true;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Cuts the special tokens out of text, longest token first (so "<|im_start|>" wins over a
 * shorter token inside it); user-defined tokens always, control and unknown ones only when
 * parse_special. */
static loom_status partition(const loom_tokenizer *t, const char *text, size_t len,
                             bool parse_special, fragv *out) {
    fragv cur = {0}, nxt = {0};
    if (!frag_push(&cur, (frag){0, len, -1}))
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != LOOM_TOKEN_USER_DEFINED) continue;
        const char *tt = t->text[id];
        size_t tl = t->len[id];
        bool any = false;
        for (size_t i = 0; i < cur.n && !any; i++)
            any = cur.v[i].tok < 0 && cur.v[i].len >= tl &&
                  memmem(text + cur.v[i].off, cur.v[i].len, tt, tl) != NULL;
        if (!any) continue;
        nxt.n = 0;
        for (size_t i = 0; i < cur.n; i++) {
            frag f = cur.v[i];
            bool ok = true;
            if (f.tok >= 0) {
                ok = frag_push(&nxt, f);
            } else {
                size_t at = f.off, end = f.off + f.len;
                const char *hit;
                int strip = t->strip ? t->strip[id] : 0;
                while (ok && end - at >= tl && (hit = memmem(text + at, end - at, tt, tl))) {
                    size_t h = (size_t)(hit - text), left_end = h;
                    if (strip & LOOM_STRIP_LEFT)
                        while (left_end > at && is_space(text[left_end - 1]))
                            left_end--;
                    if (left_end > at) ok = frag_push(&nxt, (frag){at, left_end - at, -1});
                    ok = ok && frag_push(&nxt, (frag){h, tl, id});
                    at = h + tl;
                    if (strip & LOOM_STRIP_RIGHT)
                        while (at < end && is_space(text[at]))
                            at++;
                }
                if (ok && at < end) ok = frag_push(&nxt, (frag){at, end - at, -1});
            }
            if (!ok) {
                loom_free(cur.v);
                loom_free(nxt.v);
                return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
            }
        }
        fragv tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    loom_free(nxt.v);
    *out = cur;
    return LOOM_OK;
}

loom_status loom_tokenize_ex(const loom_tokenizer *t, const char *text, size_t len, unsigned flags,
                             int32_t *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    bool bos =
        (flags & LOOM_TOKENIZE_ADD_BOS) || ((flags & LOOM_TOKENIZE_ADD_SPECIAL) && t->add_bos);
    bool eos =
        (flags & LOOM_TOKENIZE_ADD_EOS) || ((flags & LOOM_TOKENIZE_ADD_SPECIAL) && t->add_eos);
    if (bos && t->bos < 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "tokenizer: a BOS token is asked for but the vocabulary has none "
                          "(tokenizer.ggml.bos_token_id)");
    if (eos && t->eos < 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "tokenizer: an EOS token is asked for but the vocabulary has none "
                          "(tokenizer.ggml.eos_token_id)");
    if (len > 0 && !text) return loom_error(LOOM_ERR_INVALID_ARG, "tokenizer: text is NULL");
    if (bos) emit(t->bos, out, cap, n_out);
    loom_status st = LOOM_OK;
    if (len > 0) {
        fragv fr = {0};
        if ((st = partition(t, text, len, (flags & LOOM_TOKENIZE_PARSE_SPECIAL) != 0, &fr)))
            return st;
        bool prev_special =
            true; /* SentencePiece: the dummy prefix at the start, and after each special token */
        for (size_t i = 0; i < fr.n && st == LOOM_OK; i++) {
            frag f = fr.v[i];
            if (f.tok >= 0) {
                emit(f.tok, out, cap, n_out);
                prev_special = true;
            } else if (t->kind == LOOM_TOKENIZER_SPM) {
                st = spm_tokenize(t, text + f.off, f.len, t->add_space_prefix && prev_special, out,
                                  cap, n_out);
                prev_special = false;
            } else if (t->kind == LOOM_TOKENIZER_WPM) {
                st = loom__wpm_tokenize(t, text + f.off, f.len, out, cap, n_out);
            } else {
                st = loom__bpe_tokenize(t, text + f.off, f.len, out, cap, n_out);
            }
        }
        loom_free(fr.v);
    }
    if (st == LOOM_OK && eos) emit(t->eos, out, cap, n_out);
    if (st == LOOM_OK && bos && *n_out >= 2 && cap >= 2 && out[1] == t->bos)
        LOOM_LOG_WARN("tokenizer: the text starts with a BOS token and one was added: the ids "
                      "start with two BOS tokens");
    if (st == LOOM_OK && *n_out > cap)
        return loom_error(LOOM_ERR_FULL, "tokenizer: %zu tokens do not fit in %zu", *n_out, cap);
    return st;
}

loom_status loom_tokenize(const loom_tokenizer *t, const char *text, size_t len, bool add_bos,
                          int32_t *out, size_t cap, size_t *n_out) {
    unsigned flags =
        LOOM_TOKENIZE_PARSE_SPECIAL | (add_bos && t->bos >= 0 ? LOOM_TOKENIZE_ADD_BOS : 0u);
    return loom_tokenize_ex(t, text, len, flags, out, cap, n_out);
}

const char *loom_tokenizer_pre(const loom_tokenizer *t) {
    return t->kind == LOOM_TOKENIZER_BPE ? loom__bpe_pre(t) : NULL;
}

/* ---------------------------------------------------------------- decoding */

size_t loom_token_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    if (t->kind == LOOM_TOKENIZER_BPE) return loom__bpe_to_piece(t, id, buf, cap);
    size_t n = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (n < cap) buf[n] = (c);                                                                 \
        n++;                                                                                       \
    } while (0)
    switch (t->type[id]) {
    case LOOM_TOKEN_BYTE: {
        unsigned v;
        if (sscanf(t->text[id], "<0x%02X>", &v) == 1) PUT((char)v);
        break;
    }
    case LOOM_TOKEN_CONTROL:
    case LOOM_TOKEN_UNUSED:
        break;
    case LOOM_TOKEN_UNKNOWN:
        for (const char *s = "\xE2\x96\x85"; *s; s++)
            PUT(*s);
        break;
    default:
        for (size_t i = 0; i < t->len[id]; i++) {
            if (i + 2 < t->len[id] && memcmp(t->text[id] + i, "\xE2\x96\x81", 3) == 0) {
                PUT(' ');
                i += 2;
            } else {
                PUT(t->text[id][i]);
            }
        }
    }
#undef PUT
    return n;
}
