/*
 * Byte-level BPE (GPT-2 style, tokenizer.ggml.model = "gpt2").
 *
 * Text is cut into words by the GPT-2 pre-tokenizer pattern (PCRE2, UTF-8 + Unicode
 * properties); each word's bytes are mapped to printable code points (the GPT-2 byte
 * table: printable Latin-1 bytes map to themselves, the rest to U+0100 upward); then the
 * adjacent pair with the lowest merge rank (tokenizer.ggml.merges, "left right" per line)
 * is merged until none applies. Decoding maps the code points back to bytes.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "model/tokenizer-impl.h"

typedef struct bpe_state {
    pcre2_code *re;
    /* merges: hash of "left right" -> rank */
    char **merge_text;
    size_t *merge_len;
    int64_t n_merges;
    int64_t *mmap_slots; /* open addressing over merge indices */
    size_t mmap_cap;
    uint16_t byte_cp[256];   /* byte -> code point */
    int16_t cp_byte[512];    /* code point (< 512) -> byte, -1 if none */
} bpe_state;

static const char *const GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
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

loom_status loom__bpe_init(loom_tokenizer *t, const loom_gguf *g) {
    bpe_state *b = loom_calloc(1, sizeof *b);
    if (!b) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->bpe = b;
    /* GPT-2 byte table */
    for (int i = 0; i < 512; i++) b->cp_byte[i] = -1;
    uint32_t next = 256;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        b->byte_cp[c] = (uint16_t)(printable ? (uint32_t)c : next++);
        b->cp_byte[b->byte_cp[c]] = (int16_t)c;
    }
    int64_t mi = loom_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (mi < 0 || loom_gguf_kv_arr_type(g, mi) != LOOM_GGUF_STRING)
        return loom_error(LOOM_ERR_FORMAT, "tokenizer: a gpt2 vocabulary needs tokenizer.ggml.merges (string array)");
    b->n_merges = (int64_t)loom_gguf_kv_arr_n(g, mi);
    b->merge_text = loom_calloc(b->n_merges ? (size_t)b->n_merges : 1, sizeof(char *));
    b->merge_len = loom_calloc(b->n_merges ? (size_t)b->n_merges : 1, sizeof(size_t));
    size_t cap = 16;
    while (cap < (size_t)b->n_merges * 2) cap <<= 1;
    b->mmap_slots = loom_malloc(cap * sizeof(int64_t));
    b->mmap_cap = cap;
    if (!b->merge_text || !b->merge_len || !b->mmap_slots)
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory for merges");
    for (size_t k = 0; k < cap; k++) b->mmap_slots[k] = -1;
    for (int64_t i = 0; i < b->n_merges; i++) {
        uint64_t len;
        const char *s = loom_gguf_kv_arr_str(g, mi, (uint64_t)i, &len);
        const char *sp = memchr(s, ' ', len);
        if (!sp)
            return loom_error(LOOM_ERR_FORMAT, "tokenizer: merge %lld ('%.*s') has no space", (long long)i, (int)(len > 40 ? 40 : len), s);
        /* stored without the space: the concatenation of the pair */
        b->merge_text[i] = loom_malloc(len);
        if (!b->merge_text[i]) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
        size_t l1 = (size_t)(sp - s);
        memcpy(b->merge_text[i], s, l1);
        memcpy(b->merge_text[i] + l1, sp + 1, len - l1 - 1);
        b->merge_len[i] = len - 1;
        /* a pair may be ambiguous once concatenated; keep the best (first) rank */
        size_t k = hash_bytes(b->merge_text[i], b->merge_len[i]) & (cap - 1);
        bool dup = false;
        while (b->mmap_slots[k] >= 0) {
            int64_t o = b->mmap_slots[k];
            if (b->merge_len[o] == b->merge_len[i] && memcmp(b->merge_text[o], b->merge_text[i], b->merge_len[i]) == 0) {
                dup = true;
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (!dup) b->mmap_slots[k] = i;
    }
    int err;
    PCRE2_SIZE off;
    b->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &err, &off, NULL);
    if (!b->re) return loom_error(LOOM_ERR_INTERNAL, "tokenizer: pre-tokenizer pattern failed to compile at %zu", (size_t)off);
    return LOOM_OK;
}

void loom__bpe_free(loom_tokenizer *t) {
    bpe_state *b = t->bpe;
    if (!b) return;
    if (b->merge_text)
        for (int64_t i = 0; i < b->n_merges; i++) loom_free(b->merge_text[i]);
    loom_free(b->merge_text);
    loom_free(b->merge_len);
    loom_free(b->mmap_slots);
    if (b->re) pcre2_code_free(b->re);
    loom_free(b);
    t->bpe = NULL;
}

static void emit(int32_t id, int32_t *out, size_t cap, size_t *n) {
    if (*n < cap) out[*n] = id;
    (*n)++;
}

/* BPE over one pre-token (already mapped to code points, UTF-8 in w[0..n)). */
static loom_status bpe_word(const loom_tokenizer *t, const bpe_state *b, const char *w, size_t n,
                            int32_t *out, size_t cap, size_t *n_out) {
    /* symbol boundaries: start offsets of code points */
    size_t *start = loom_malloc((n + 1) * sizeof *start);
    if (!start) return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        start[ns++] = i;
        uint8_t c = (uint8_t)w[i];
        i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    }
    start[ns] = n;
    for (;;) {
        int64_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            int64_t r = merge_rank(b, w + start[i], start[i + 2] - start[i]);
            if (r >= 0 && (best < 0 || r < best)) {
                best = r;
                at = i;
            }
        }
        if (best < 0) break;
        memmove(&start[at + 1], &start[at + 2], (ns - at - 1) * sizeof *start);
        ns--;
    }
    for (size_t i = 0; i < ns; i++) {
        int32_t id = loom__tok_find(t, w + start[i], start[i + 1] - start[i]);
        emit(id >= 0 ? id : t->unk, out, cap, n_out);
    }
    loom_free(start);
    return LOOM_OK;
}

loom_status loom__bpe_tokenize(const loom_tokenizer *t, const char *text, size_t len,
                               int32_t *out, size_t cap, size_t *n_out) {
    const bpe_state *b = t->bpe;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
    char *word = loom_malloc(len * 2 + 4);
    if (!md || !word) {
        if (md) pcre2_match_data_free(md);
        loom_free(word);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    }
    loom_status st = LOOM_OK;
    size_t pos = 0;
    while (pos < len && st == LOOM_OK) {
        int rc = pcre2_match(b->re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMATCH) break;
            st = loom_error(LOOM_ERR_FORMAT, "tokenizer: text is not valid UTF-8 near byte %zu", pos);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* cannot happen with this pattern; guard against a loop */
            pos++;
            continue;
        }
        size_t wn = 0;
        for (size_t i = s; i < e; i++) wn += put_utf8(b->byte_cp[(uint8_t)text[i]], word + wn);
        st = bpe_word(t, b, word, wn, out, cap, n_out);
        pos = e;
    }
    pcre2_match_data_free(md);
    loom_free(word);
    return st;
}

size_t loom__bpe_to_piece(const loom_tokenizer *t, int32_t id, char *buf, size_t cap) {
    const bpe_state *b = t->bpe;
    if (t->type[id] == LOOM_TOKEN_CONTROL) return 0;
    const uint8_t *s = (const uint8_t *)t->text[id];
    size_t n = 0;
    for (size_t i = 0; i < t->len[id];) {
        uint32_t cp;
        size_t l;
        if (s[i] < 0x80) { cp = s[i]; l = 1; }
        else if (s[i] < 0xE0 && i + 1 < t->len[id]) { cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu); l = 2; }
        else { cp = 0xFFFF; l = 1; }
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
