/*
 * WordPiece (BERT, tokenizer.ggml.model = "bert").
 *
 * The text is normalized as BERT's uncased tokenizer does: control characters, U+0000 and
 * U+FFFD dropped, white space made ' ', CJK ideographs set apart with spaces, accents
 * stripped (NFD, then nonspacing marks removed) and letters lowercased. It is split at white
 * space, and every punctuation character (ASCII punctuation or Unicode P*) is a word of its
 * own. Each word is then cut greedily, longest vocabulary piece first: the GGUF converters
 * store a word-initial piece with a leading U+2581 ("▁hello") and a continuation one bare
 * (BERT's "##llo" is "llo"). A word that cannot be cut completely, or of more than 100
 * characters, is one unknown token. The Unicode data comes from wpm_tables.h (generated).
 */
#include <stdint.h>
#include <string.h>

#include "model/tokenizer-impl.h"
#include "model/wpm_tables.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static unsigned classes(uint32_t cp) {
    size_t lo = 0, hi = N_OF(WPM_CLASS); /* the last run starting at or before cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (WPM_CLASS[mid][0] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return WPM_CLASS[lo][1];
}

/* The row of table (sorted on column 0) for cp, or NULL. */
static const uint32_t *lookup(const uint32_t (*table)[4], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (table[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && table[lo][0] == cp ? table[lo] : NULL;
}

static bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_punct(uint32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126) || (classes(c) & WPM_PUNCT);
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
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The code point at s[*i] (valid UTF-8), advancing *i. */
static uint32_t get_utf8(const char *text, size_t *i) {
    const uint8_t *s = (const uint8_t *)text + *i;
    if (s[0] < 0x80) {
        *i += 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *i += 2;
        return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    }
    if (s[0] < 0xF0) {
        *i += 3;
        return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    }
    *i += 4;
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

typedef struct cps {
    uint32_t *v;
    size_t n, cap;
} cps;

static bool cps_push(cps *c, uint32_t cp) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        uint32_t *v = loom_realloc(c->v, cap * sizeof *v);
        if (!v) return false;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
    return true;
}

/* Accent-stripped, lowercased cp appended to out. */
static bool push_normalized(cps *out, uint32_t cp) {
    uint32_t base[3] = {cp, 0, 0};
    size_t nb = 1;
    if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul syllable: L V (T) jamo */
        uint32_t s = cp - 0xAC00;
        base[0] = 0x1100 + s / 588;
        base[1] = 0x1161 + (s % 588) / 28;
        base[2] = s % 28 ? 0x11A7 + s % 28 : 0;
        nb = base[2] ? 3 : 2;
    } else if (classes(cp) & WPM_MN) {
        return true;
    } else {
        const uint32_t *r = lookup(WPM_STRIP, N_OF(WPM_STRIP), cp);
        if (r) {
            nb = 0;
            for (int k = 1; k < 4 && r[k]; k++)
                base[nb++] = r[k];
        }
    }
    for (size_t k = 0; k < nb; k++) {
        const uint32_t *l = lookup(WPM_LOWER, N_OF(WPM_LOWER), base[k]);
        if (!l) {
            if (!cps_push(out, base[k])) return false;
            continue;
        }
        for (int j = 1; j < 4 && l[j]; j++)
            if (!cps_push(out, l[j])) return false;
    }
    return true;
}

static void emit(int32_t id, int32_t *out, size_t cap, size_t *n) {
    if (*n < cap) out[*n] = id;
    (*n)++;
}

/* WordPiece over the word w[0..n) (code points); buf: scratch of 4 * n + 3 bytes. */
static void wpm_word(const loom_tokenizer *t, const uint32_t *w, size_t n, char *buf, size_t *off,
                     int32_t *out, size_t cap, size_t *n_out) {
    if (n > 100) {
        emit(t->unk, out, cap, n_out);
        return;
    }
    /* byte offset of each code point in buf after the "▁" */
    memcpy(buf, "\xE2\x96\x81", 3);
    size_t b = 3;
    for (size_t i = 0; i < n; i++) {
        off[i] = b;
        b += put_utf8(w[i], buf + b);
    }
    off[n] = b;
    size_t first = *n_out;
    for (size_t s = 0; s < n;) {
        int32_t id = -1;
        size_t e = n;
        for (; e > s; e--) {
            size_t from = s == 0 ? 0 : off[s]; /* a word-initial piece carries the "▁" */
            if ((id = loom__tok_find(t, buf + from, off[e] - from)) >= 0) break;
        }
        if (id < 0) { /* the word cannot be cut: it is one unknown token */
            *n_out = first;
            emit(t->unk, out, cap, n_out);
            return;
        }
        emit(id, out, cap, n_out);
        s = e;
    }
}

loom_status loom__wpm_tokenize(const loom_tokenizer *t, const char *text, size_t len, int32_t *out,
                               size_t cap, size_t *n_out) {
    size_t bad = loom__utf8_invalid_at(text, len);
    if (bad < len)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "tokenizer: the text is not valid UTF-8 at byte %zu (0x%02X)", bad,
                          (unsigned)(uint8_t)text[bad]);
    if (t->unk < 0)
        return loom_error(
            LOOM_ERR_FORMAT,
            "tokenizer: a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id");
    cps norm = {0};
    bool ok = true;
    for (size_t i = 0; i < len && ok;) {
        uint32_t cp = get_utf8(text, &i);
        unsigned c = classes(cp);
        bool tnr = cp == '\t' || cp == '\n' || cp == '\r';
        if (cp == 0 || cp == 0xFFFD ||
            ((c & WPM_OTHER) && !tnr)) { /* dropped before white space is mapped */
            continue;
        } else if (tnr || (c & WPM_WS)) {
            ok = cps_push(&norm, ' ');
        } else if (is_cjk(cp)) {
            ok = cps_push(&norm, ' ') && push_normalized(&norm, cp) && cps_push(&norm, ' ');
        } else {
            ok = push_normalized(&norm, cp);
        }
    }
    char *buf = ok ? loom_malloc(4 * norm.n + 4) : NULL;
    size_t *off = ok ? loom_malloc((norm.n + 1) * sizeof *off) : NULL;
    if (!ok || !buf || !off) {
        loom_free(norm.v);
        loom_free(buf);
        loom_free(off);
        return loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t ws = 0; /* start of the current word */
    for (size_t i = 0; i <= norm.n; i++) {
        bool end = i == norm.n, space = !end && norm.v[i] == ' ',
             punct = !end && !space && is_punct(norm.v[i]);
        if (end || space || punct) {
            if (i > ws) wpm_word(t, norm.v + ws, i - ws, buf, off, out, cap, n_out);
            if (punct) wpm_word(t, norm.v + i, 1, buf, off, out, cap, n_out);
            ws = i + 1;
        }
    }
    loom_free(norm.v);
    loom_free(buf);
    loom_free(off);
    return LOOM_OK;
}
