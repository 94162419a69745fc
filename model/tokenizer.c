/*
 * SentencePiece tokenizer over a GGUF vocabulary (tokenizer.ggml.model = "llama").
 *
 * Text is prefixed with a space (SentencePiece's add_dummy_prefix), spaces become U+2581
 * ("▁"), and the string is cut into UTF-8 characters. Then, repeatedly, the adjacent pair
 * whose concatenation is a vocabulary token with the highest score is merged (ties: the
 * leftmost pair). Symbols left that are not tokens are spelled with byte tokens <0xXX>.
 * BPE vocabularies (model "gpt2") live in bpe.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer-impl.h"

/* ---------------------------------------------------------------- vocabulary map */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
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
    while (cap < (size_t)t->n_vocab * 2) cap <<= 1;
    t->map = loom_malloc(cap * sizeof *t->map);
    if (!t->map) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->map_cap = cap;
    for (size_t k = 0; k < cap; k++) t->map[k] = -1;
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

/* ---------------------------------------------------------------- loading */

static loom_status get_int_or(const loom_gguf *g, const char *key, int64_t dflt, int64_t *out) {
    if (loom_gguf_find_kv(g, key) < 0) {
        *out = dflt;
        return LOOM_OK;
    }
    return loom_gguf_get_int(g, key, out);
}

loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out) {
    *out = NULL;
    const char *model;
    loom_status st = loom_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st) return loom_error(st, "tokenizer: %s", loom_last_error());
    loom_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0) kind = LOOM_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0) kind = LOOM_TOKENIZER_BPE;
    else return loom_error(LOOM_ERR_UNSUPPORTED, "tokenizer: unknown tokenizer.ggml.model '%s' (llama and gpt2 are supported)", model);

    int64_t ki = loom_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (ki < 0 || loom_gguf_kv_type(g, ki) != LOOM_GGUF_ARRAY ||
        loom_gguf_kv_arr_type(g, ki) != LOOM_GGUF_STRING)
        return loom_error(LOOM_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens is missing or not a string array");
    uint64_t n = loom_gguf_kv_arr_n(g, ki);
    if (n == 0 || n > INT32_MAX)
        return loom_error(LOOM_ERR_FORMAT, "tokenizer: vocabulary of %llu tokens", (unsigned long long)n);

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
            return loom_error(LOOM_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be %llu float32 values", (unsigned long long)n);
        }
        memcpy(t->score, loom_gguf_kv_arr_data(g, si), n * sizeof(float));
    }
    int64_t ti = loom_gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (ti >= 0) {
        if (loom_gguf_kv_arr_type(g, ti) != LOOM_GGUF_INT32 || loom_gguf_kv_arr_n(g, ti) != n) {
            loom_tokenizer_free(t);
            return loom_error(LOOM_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be %llu int32 values", (unsigned long long)n);
        }
        memcpy(t->type, loom_gguf_kv_arr_data(g, ti), n * sizeof(int32_t));
    }
    int64_t bos, eos, unk;
    bool add_bos = kind == LOOM_TOKENIZER_SPM;
    if ((st = get_int_or(g, "tokenizer.ggml.bos_token_id", kind == LOOM_TOKENIZER_SPM ? 1 : -1, &bos)) ||
        (st = get_int_or(g, "tokenizer.ggml.eos_token_id", kind == LOOM_TOKENIZER_SPM ? 2 : -1, &eos)) ||
        (st = get_int_or(g, "tokenizer.ggml.unknown_token_id", kind == LOOM_TOKENIZER_SPM ? 0 : -1, &unk))) {
        loom_tokenizer_free(t);
        return loom_error(st, "tokenizer: %s", loom_last_error());
    }
    if (loom_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0)
        loom_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    if (bos < -1 || eos < -1 || unk < -1 || bos >= (int64_t)n || eos >= (int64_t)n ||
        unk >= (int64_t)n) {
        loom_tokenizer_free(t);
        return loom_error(LOOM_ERR_FORMAT, "tokenizer: special token id out of range (bos %lld, eos %lld, unk %lld, vocab %llu)",
                          (long long)bos, (long long)eos, (long long)unk, (unsigned long long)n);
    }
    t->bos = (int32_t)bos;
    t->eos = (int32_t)eos;
    t->unk = (int32_t)unk;
    t->add_bos = add_bos;
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    if ((st = build_map(t))) {
        loom_tokenizer_free(t);
        return st;
    }
    if (kind == LOOM_TOKENIZER_SPM) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_token[b] = loom__tok_find(t, name, 6);
        }
    } else if ((st = loom__bpe_init(t, g))) {
        loom_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
oom:
    loom_tokenizer_free(t);
    return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory loading %llu tokens", (unsigned long long)n);
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    if (t->text)
        for (int32_t i = 0; i < t->n_vocab; i++) loom_free(t->text[i]);
    loom_free(t->text);
    loom_free(t->len);
    loom_free(t->score);
    loom_free(t->type);
    loom_free(t->map);
    loom__bpe_free(t);
    loom_free(t);
}

loom_tokenizer_kind loom_tokenizer_kind_of(const loom_tokenizer *t) { return t->kind; }
int32_t loom_tokenizer_n_vocab(const loom_tokenizer *t) { return t->n_vocab; }
int32_t loom_tokenizer_bos(const loom_tokenizer *t) { return t->bos; }
int32_t loom_tokenizer_eos(const loom_tokenizer *t) { return t->eos; }
bool loom_tokenizer_add_bos(const loom_tokenizer *t) { return t->add_bos; }

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

static loom_status spm_tokenize(const loom_tokenizer *t, const char *text, size_t len,
                                int32_t *out, size_t cap, size_t *n_out) {
    /* " " + text with ' ' -> "\xE2\x96\x81" */
    size_t spaces = 1;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
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
    memcpy(buf + p, "\xE2\x96\x81", 3);
    p += 3;
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
    for (int i = 1; i < ns && ok; i++) ok = try_bigram(t, &h, syms, i - 1, i);
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

loom_status loom_tokenize(const loom_tokenizer *t, const char *text, size_t len, bool add_bos,
                          int32_t *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (add_bos && t->bos >= 0) emit(t->bos, out, cap, n_out);
    loom_status st = LOOM_OK;
    if (len > 0) {
        st = t->kind == LOOM_TOKENIZER_SPM ? spm_tokenize(t, text, len, out, cap, n_out)
                                           : loom__bpe_tokenize(t, text, len, out, cap, n_out);
    }
    if (st == LOOM_OK && *n_out > cap)
        return loom_error(LOOM_ERR_FULL, "tokenizer: %zu tokens do not fit in %zu", *n_out, cap);
    return st;
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
        for (const char *s = "\xE2\x96\x85"; *s; s++) PUT(*s);
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
