/*
 * Byte-level BPE (GPT-2 style, tokenizer.ggml.model = "gpt2").
 *
 * Text is cut into words by the pre-tokenizer tokenizer.ggml.pre names (pretok.c); each
 * word's bytes are mapped to printable code points (the GPT-2 byte table: printable Latin-1
 * bytes map to themselves, the rest to U+0100 upward); then the adjacent pair of symbols
 * whose merge ("left right" in tokenizer.ggml.merges) has the lowest rank is merged (ties:
 * the leftmost) until none applies. Pre-tokenizers that say so (Llama 3) take a word that is
 * itself a token whole. Decoding maps the code points back to bytes.
 */
#include <stdint.h>
#include <string.h>

#include "model/tokenizer-impl.h"

typedef struct bpe_state {
    loom_pretok pre;
    /* merges: hash of "left right" -> rank */
    char **merge_text;
    size_t *merge_len;
    int64_t n_merges;
    int64_t *mmap_slots; /* open addressing over merge indices */
    size_t mmap_cap;
    uint16_t byte_cp[256]; /* byte -> code point */
    int16_t cp_byte[512];  /* code point (< 512) -> byte, -1 if none */
} bpe_state;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int64_t merge_rank(const bpe_state *b, const char *s, size_t n) {
    size_t mask = b->mmap_cap - 1;
    for (size_t k = hash_bytes(s, n) & mask;; k = (k + 1) & mask) {
        int64_t i = b->mmap_slots[k];
        if (i < 0) return -1;
        if (b->merge_len[i] == n && memcmp(b->merge_text[i], s, n) == 0) return i;
    }
}

static size_t put_utf8(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

loom_status loom__bpe_init(loom_tokenizer *t, const loom_gguf *g, const char *pre) {
    bpe_state *b = loom_calloc(1, sizeof *b);
    if (!b) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->bpe = b;
    /* GPT-2 byte table */
    for (int i = 0; i < 512; i++)
        b->cp_byte[i] = -1;
    uint32_t next = 256;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        b->byte_cp[c] = (uint16_t)(printable ? (uint32_t)c : next++);
        b->cp_byte[b->byte_cp[c]] = (int16_t)c;
    }
    int64_t mi = loom_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (mi < 0 || loom_gguf_kv_arr_type(g, mi) != LOOM_GGUF_STRING)
        return loom_error(
            LOOM_ERR_FORMAT,
            "tokenizer: a gpt2 vocabulary needs tokenizer.ggml.merges (string array)");
    b->n_merges = (int64_t)loom_gguf_kv_arr_n(g, mi);
    b->merge_text = loom_calloc(b->n_merges ? (size_t)b->n_merges : 1, sizeof(char *));
    b->merge_len = loom_calloc(b->n_merges ? (size_t)b->n_merges : 1, sizeof(size_t));
    size_t cap = 16;
    while (cap < (size_t)b->n_merges * 2)
        cap <<= 1;
    b->mmap_slots = loom_malloc(cap * sizeof(int64_t));
    b->mmap_cap = cap;
    if (!b->merge_text || !b->merge_len || !b->mmap_slots)
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory for merges");
    for (size_t k = 0; k < cap; k++)
        b->mmap_slots[k] = -1;
    for (int64_t i = 0; i < b->n_merges; i++) {
        uint64_t len;
        const char *s = loom_gguf_kv_arr_str(g, mi, (uint64_t)i, &len);
        /* the separator is the first space after the first character (a token may be " ") */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp)
            return loom_error(LOOM_ERR_FORMAT, "tokenizer: merge %lld ('%.*s') has no space",
                              (long long)i, (int)(len > 40 ? 40 : len), s);
        b->merge_text[i] = loom_malloc(len ? len : 1);
        if (!b->merge_text[i]) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(b->merge_text[i], s, len);
        b->merge_len[i] = len;
        /* a repeated merge keeps its first (best) rank */
        size_t k = hash_bytes(b->merge_text[i], b->merge_len[i]) & (cap - 1);
        bool dup = false;
        while (b->mmap_slots[k] >= 0) {
            int64_t o = b->mmap_slots[k];
            if (b->merge_len[o] == b->merge_len[i] &&
                memcmp(b->merge_text[o], b->merge_text[i], b->merge_len[i]) == 0) {
                dup = true;
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (!dup) b->mmap_slots[k] = i;
    }
    /* A byte no token spells is dropped from text, as the reference engines drop it: say so. */
    int missing = 0, first = -1;
    for (int c = 0; c < 256; c++) {
        if (c == 0xC0 || c == 0xC1 || c >= 0xF5) continue; /* never in UTF-8 text */
        char u[4];
        size_t un = put_utf8(b->byte_cp[c], u);
        if (loom__tok_find(t, u, un) < 0) {
            missing++;
            if (first < 0) first = c;
        }
    }
    if (missing)
        LOOM_LOG_WARN(
            "tokenizer: the vocabulary has no token for %d of the bytes of UTF-8 (the first "
            "is 0x%02X); such bytes are dropped from text, as in the reference engines",
            missing, first);
    return loom__pretok_init(&b->pre, pre);
}

bool loom__bpe_has_byte(const loom_tokenizer *t, uint8_t c) {
    const bpe_state *b = t->bpe;
    char u[4];
    size_t un = put_utf8(b->byte_cp[c], u);
    return loom__tok_find(t, u, un) >= 0;
}

const char *loom__bpe_pre(const loom_tokenizer *t) {
    const bpe_state *b = t->bpe;
    return b ? b->pre.family : NULL;
}

void loom__bpe_free(loom_tokenizer *t) {
    bpe_state *b = t->bpe;
    if (!b) return;
    if (b->merge_text)
        for (int64_t i = 0; i < b->n_merges; i++)
            loom_free(b->merge_text[i]);
    loom_free(b->merge_text);
    loom_free(b->merge_len);
    loom_free(b->mmap_slots);
    loom__pretok_free(&b->pre);
    loom_free(b);
    t->bpe = NULL;
}

static void emit(int32_t id, int32_t *out, size_t cap, size_t *n) {
    if (*n < cap) out[*n] = id;
    (*n)++;
}

/* Rank of the merge "l r" (l = w[a..b), r = w[b..c)), or -1. key: scratch of c - a + 1 bytes. */
static int64_t pair_rank(const bpe_state *b, const char *w, size_t a, size_t m, size_t c,
                         char *key) {
    memcpy(key, w + a, m - a);
    key[m - a] = ' ';
    memcpy(key + m - a + 1, w + m, c - m);
    return merge_rank(b, key, c - a + 1);
}

/* Emits the token of w[s..e); a symbol that is not a token (a merge whose result the vocabulary
 * lacks) is spelled byte by byte, as the reference engines do. */
static void emit_symbol(const loom_tokenizer *t, const char *w, size_t s, size_t e, int32_t *out,
                        size_t cap, size_t *n_out) {
    int32_t id = loom__tok_find(t, w + s, e - s);
    if (id >= 0) {
        emit(id, out, cap, n_out);
        return;
    }
    for (size_t i = s; i < e; i++) {
        int32_t bid = loom__tok_find(t, w + i, 1);
        if (bid < 0) bid = t->unk;
        if (bid >= 0) emit(bid, out, cap, n_out);
    }
}

/* A candidate merge of symbol `left` with the one after it, as queued. */
typedef struct cand {
    int64_t rank;
    size_t left;
    size_t left_len, right_len; /* the pair's lengths when queued: stale once they change */
} cand;

/* min-heap on (rank, left): the lowest rank first, the leftmost among equal ranks */
static bool cand_before(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

typedef struct word_state {
    const bpe_state *b;
    const char *w;
    size_t *start, *len, *next, *prev; /* symbols; len 0: merged into its left neighbour */
    cand *heap;
    size_t n_heap, cap_heap;
    char *key;
} word_state;

static bool queue_pair(word_state *s, size_t l) {
    size_t r = s->next[l];
    if (r == SIZE_MAX) return true;
    int64_t rank = pair_rank(s->b, s->w, s->start[l], s->start[r], s->start[r] + s->len[r], s->key);
    if (rank < 0) return true;
    if (s->n_heap == s->cap_heap) {
        size_t cap = s->cap_heap ? s->cap_heap * 2 : 64;
        cand *v = loom_realloc(s->heap, cap * sizeof *v);
        if (!v) return false;
        s->heap = v;
        s->cap_heap = cap;
    }
    size_t i = s->n_heap++;
    s->heap[i] = (cand){rank, l, s->len[l], s->len[r]};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_before(&s->heap[i], &s->heap[p])) break;
        cand tmp = s->heap[i];
        s->heap[i] = s->heap[p];
        s->heap[p] = tmp;
        i = p;
    }
    return true;
}

static cand pop_pair(word_state *s) {
    cand top = s->heap[0];
    s->heap[0] = s->heap[--s->n_heap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->n_heap && cand_before(&s->heap[l], &s->heap[m])) m = l;
        if (r < s->n_heap && cand_before(&s->heap[r], &s->heap[m])) m = r;
        if (m == i) break;
        cand tmp = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = tmp;
        i = m;
    }
    return top;
}

/* BPE over one pre-token (already mapped to code points, UTF-8 in w[0..n)): merges by a
 * priority queue, O(n log n) in the word's length. */
static loom_status bpe_word(const loom_tokenizer *t, const bpe_state *b, const char *w, size_t n,
                            int32_t *out, size_t cap, size_t *n_out) {
    if (b->pre.ignore_merges) {
        int32_t id = loom__tok_find(t, w, n);
        if (id >= 0) {
            emit(id, out, cap, n_out);
            return LOOM_OK;
        }
    }
    word_state s = {.b = b, .w = w};
    s.start = loom_malloc((n + 1) * sizeof *s.start);
    s.len = loom_malloc((n + 1) * sizeof *s.len);
    s.next = loom_malloc((n + 1) * sizeof *s.next);
    s.prev = loom_malloc((n + 1) * sizeof *s.prev);
    s.key = loom_malloc(n + 2);
    bool ok = s.start && s.len && s.next && s.prev && s.key;
    size_t ns = 0;
    for (size_t i = 0; ok && i < n;) {
        uint8_t c = (uint8_t)w[i];
        size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (l > n - i) l = n - i;
        s.start[ns] = i;
        s.len[ns] = l;
        s.prev[ns] = ns ? ns - 1 : SIZE_MAX;
        s.next[ns] = i + l < n ? ns + 1 : SIZE_MAX;
        ns++;
        i += l;
    }
    for (size_t i = 0; ok && i + 1 < ns; i++)
        ok = queue_pair(&s, i);
    while (ok && s.n_heap) {
        cand c = pop_pair(&s);
        size_t l = c.left, r = s.next[l];
        if (s.len[l] != c.left_len || r == SIZE_MAX || s.len[r] != c.right_len)
            continue; /* stale */
        s.len[l] += s.len[r];
        s.len[r] = 0;
        s.next[l] = s.next[r];
        if (s.next[r] != SIZE_MAX) s.prev[s.next[r]] = l;
        ok = (s.prev[l] == SIZE_MAX || queue_pair(&s, s.prev[l])) && queue_pair(&s, l);
    }
    if (ok)
        for (size_t i = 0; ns > 0 && i != SIZE_MAX; i = s.next[i])
            emit_symbol(t, w, s.start[i], s.start[i] + s.len[i], out, cap, n_out);
    loom_free(s.start);
    loom_free(s.len);
    loom_free(s.next);
    loom_free(s.prev);
    loom_free(s.key);
    loom_free(s.heap);
    return ok ? LOOM_OK : loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
}

loom_status loom__bpe_tokenize(const loom_tokenizer *t, const char *text, size_t len, int32_t *out,
                               size_t cap, size_t *n_out) {
    const bpe_state *b = t->bpe;
    size_t *seg = NULL, n_seg = 0;
    loom_status st = loom__pretok_split(&b->pre, text, len, &seg, &n_seg);
    if (st) return st;
    char *word = loom_malloc(len * 2 + 4); /* each byte maps to a code point of <= 2 bytes */
    if (!word) {
        loom_free(seg);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t pos = 0;
    for (size_t k = 0; k < n_seg && st == LOOM_OK; k++) {
        size_t wn = 0;
        for (size_t i = pos; i < pos + seg[k]; i++)
            wn += put_utf8(b->byte_cp[(uint8_t)text[i]], word + wn);
        st = bpe_word(t, b, word, wn, out, cap, n_out);
        pos += seg[k];
    }
    loom_free(word);
    loom_free(seg);
    return st;
}

size_t loom__bpe_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap) {
    const bpe_state *b = t->bpe;
    if (t->type[id] == LOOM_TOKEN_CONTROL) return 0;
    if (t->type[id] == LOOM_TOKEN_USER_DEFINED) { /* added tokens hold their text as is */
        if (cap) memcpy(buf, t->text[id], t->len[id] < cap ? t->len[id] : cap);
        return t->len[id];
    }
    const uint8_t *s = (const uint8_t *)t->text[id];
    size_t n = 0;
    for (size_t i = 0; i < t->len[id];) {
        uint32_t cp;
        size_t l;
        if (s[i] < 0x80) {
            cp = s[i];
            l = 1;
        } else if (s[i] < 0xE0 && i + 1 < t->len[id]) {
            cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
            l = 2;
        } else {
            cp = 0xFFFF;
            l = 1;
        }
        int byte = cp < 512 ? b->cp_byte[cp] : -1;
        if (byte >= 0) {
            if (n < cap) buf[n] = (char)byte;
            n++;
        } else {
            for (size_t k = 0; k < l; k++) {
                if (n < cap) buf[n] = (char)s[i + k];
                n++;
            }
        }
        i += l;
    }
    return n;
}
