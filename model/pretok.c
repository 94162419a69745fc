/*
 * Pre-tokenizers of byte-level BPE vocabularies, chosen by `tokenizer.ggml.pre`.
 *
 * Each pre-tokenizer is a list of PCRE2 patterns (UTF-8, Unicode properties) applied in
 * turn: a pattern splits every piece left by the previous one into its matches and the
 * text between them (both kept, in order; Hugging Face's Split with behaviour "Isolated"),
 * and a pattern only ever sees one piece (lookarounds and `$` stop at its ends). The
 * patterns are the published pre_tokenizer regexes of each family's tokenizer.json, as the
 * GGUF converters name them. The table below is the whole of the choice: adding a family is
 * adding a row.
 */
#include <string.h>

#include "model/tokenizer-impl.h"

/* The GPT-2 pattern; many families use it alone or after a digit split. */
#define P_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* English contractions, ASCII case-insensitive (as the (?i:...) group of the originals
 * means for these letters, without Unicode case folding of 's' and 'k'). */
#define P_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* Llama 3 (tiktoken cl100k): letters with one leading non-letter, digits in threes. */
#define P_LLAMA3                                                                                   \
    P_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"    \
                   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2: as Llama 3 but single digits. */
#define P_QWEN2                                                                                    \
    P_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"         \
                   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* GPT-4o / o200k (gpt-oss, llama4): case-aware words with a trailing contraction. */
#define P_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define P_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define P_GPT4O                                                                                    \
    "[^\\r\\n\\p{L}\\p{N}]?" P_UPPER "*" P_LOWER "+" P_CONTRACTIONS "?|"                           \
    "[^\\r\\n\\p{L}\\p{N}]?" P_UPPER "+" P_LOWER "*" P_CONTRACTIONS "?|"                           \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral tekken. */
#define P_TEKKEN                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" P_UPPER "*" P_LOWER "+|"                                              \
    "[^\\r\\n\\p{L}\\p{N}]?" P_UPPER "+" P_LOWER "*|"                                              \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek's CJK run (the ranges are the published ones, U+0800..U+4E00 included). */
#define P_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define P_BLOOM " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

static const char *const R_DEFAULT[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", P_GPT2, "\\p{N}+",
                                        "[0-9][0-9][0-9]", NULL};
static const char *const R_GPT2[] = {P_GPT2, NULL};
static const char *const R_LLAMA3[] = {P_LLAMA3, NULL};
static const char *const R_QWEN2[] = {P_QWEN2, NULL};
static const char *const R_GPT4O[] = {P_GPT4O, NULL};
static const char *const R_TEKKEN[] = {P_TEKKEN, NULL};
static const char *const R_STARCODER[] = {"\\p{N}", P_GPT2, NULL};
static const char *const R_FALCON[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", P_GPT2, "[0-9][0-9][0-9]",
                                       NULL};
static const char *const R_DEEPSEEK_CODER[] = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
                                               P_CJK,      "\\p{N}",      NULL};
static const char *const R_DEEPSEEK_LLM[] = {
    "[\\r\\n]",
    /* letters of the Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee ... scripts */
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}"
    "-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}"
    "\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-"
    "\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-"
    "\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-"
    "\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}"
    "-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-"
    "\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-"
    "\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}"
    "-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-"
    "\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-"
    "\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-"
    "\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    /* ASCII and full-width punctuation, general punctuation quotes, CJK symbols */
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$", P_CJK, "\\p{N}+", NULL};
static const char *const R_DEEPSEEK3[] = {
    "\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./"
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const R_BLOOM[] = {P_BLOOM, NULL};
static const char *const R_VIKING[] = {P_BLOOM, "\\p{N}", NULL};
static const char *const R_CHAMELEON[] = {"<sentinel:[0-9]+>",
                                          "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                                          "([\\t\\n]|    |  )",
                                          "\\p{N}",
                                          "[\\p{P}!-/:-@\\[-`{-~]",
                                          P_GPT2,
                                          NULL};
static const char *const R_SEED_CODER[] = {
    P_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const R_BAILING[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL};

enum { F_IGNORE_MERGES = 1, F_ADD_BOS = 2 };

typedef struct pretok_family {
    const char *family;       /* the name errors and logs use */
    const char *const *names; /* tokenizer.ggml.pre values, NULL-terminated */
    const char *const *re;    /* the patterns, NULL-terminated */
    int flags;
} pretok_family;

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

static const pretok_family FAMILIES[] = {
    {"default", NAMES("default"), R_DEFAULT, 0},
    {"llama3",
     NAMES("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
           "lfm2"),
     R_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    /* the Llama 3 pattern, but ordinary merges and no BOS of their own */
    {"dbrx", NAMES("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), R_LLAMA3, 0},
    {"qwen2",
     NAMES("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"),
     R_QWEN2, 0},
    {"gpt-2",
     NAMES("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
           "jina-v2-de", "jina-v2-code", "roberta-bpe", "a.x-4.0", "mellum", "exaone4", "mpt",
           "olmo", "jais", "trillion", "granite-docling"),
     R_GPT2, 0},
    {"starcoder",
     NAMES("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
     R_STARCODER, 0},
    {"falcon", NAMES("falcon"), R_FALCON, 0},
    {"deepseek-llm", NAMES("deepseek-llm"), R_DEEPSEEK_LLM, 0},
    {"deepseek-coder", NAMES("deepseek-coder"), R_DEEPSEEK_CODER, 0},
    {"deepseek-v3", NAMES("deepseek-v3", "hunyuan-dense"), R_DEEPSEEK3, 0},
    {"gpt-4o", NAMES("gpt-4o", "o200k", "llama4", "minimax-m2"), R_GPT4O, 0},
    {"tekken", NAMES("tekken"), R_TEKKEN, F_IGNORE_MERGES | F_ADD_BOS},
    {"bloom", NAMES("bloom", "poro-chat", "gpt3-finnish"), R_BLOOM, 0},
    {"viking", NAMES("viking"), R_VIKING, 0},
    {"chameleon", NAMES("chameleon"), R_CHAMELEON, F_ADD_BOS},
    {"seed-coder", NAMES("seed-coder"), R_SEED_CODER, 0},
    {"bailingmoe", NAMES("bailingmoe", "bailingmoe2", "llada-moe"), R_BAILING, 0},
};

static const pretok_family *find_family(const char *pre) {
    for (size_t f = 0; f < sizeof FAMILIES / sizeof FAMILIES[0]; f++)
        for (const char *const *n = FAMILIES[f].names; *n; n++)
            if (strcmp(*n, pre) == 0) return &FAMILIES[f];
    return NULL;
}

bool loom__pretok_known(const char *pre, bool *adds_bos) {
    const pretok_family *f = find_family(pre);
    if (f && adds_bos) *adds_bos = (f->flags & F_ADD_BOS) != 0;
    return f != NULL;
}

loom_status loom__pretok_init(loom_pretok *p, const char *pre) {
    memset(p, 0, sizeof *p);
    const pretok_family *f = NULL;
    if (!pre) {
        /* What the reference engines do for a BPE vocabulary without the key. */
        LOOM_LOG_WARN("tokenizer: tokenizer.ggml.pre is missing; using the 'default' "
                      "pre-tokenizer (tokenization may differ from the model's own)");
        f = &FAMILIES[0];
    } else if (!(f = find_family(pre))) {
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '%s'", pre);
    }
    p->family = f->family;
    p->ignore_merges = (f->flags & F_IGNORE_MERGES) != 0;
    p->add_bos = (f->flags & F_ADD_BOS) != 0;
    for (const char *const *r = f->re; *r; r++) {
        if (p->n_re == LOOM_PRETOK_MAX_RE) {
            loom__pretok_free(p);
            return loom_error(LOOM_ERR_INTERNAL,
                              "tokenizer: pre-tokenizer '%s' has too many patterns", f->family);
        }
        int err;
        PCRE2_SIZE off;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)*r, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(err, msg, sizeof msg);
            loom__pretok_free(p);
            return loom_error(
                LOOM_ERR_INTERNAL,
                "tokenizer: pre-tokenizer '%s' pattern %d does not compile at %zu: %s", f->family,
                p->n_re, (size_t)off, (const char *)msg);
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to interpreting */
        p->re[p->n_re++] = re;
    }
    return LOOM_OK;
}

void loom__pretok_free(loom_pretok *p) {
    for (int i = 0; i < p->n_re; i++)
        pcre2_code_free(p->re[i]);
    p->n_re = 0;
}

/* Offset just past the UTF-8 sequence at s[i] (s is valid UTF-8). */
static size_t next_char(const char *s, size_t i, size_t n) {
    uint8_t c = (uint8_t)s[i];
    size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return i + l > n ? n : i + l;
}

/* Index of the first byte that is not part of valid UTF-8, or n. */
size_t loom__utf8_invalid_at(const char *text, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t l;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            l = 2, cp = c & 0x1Fu, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            l = 3, cp = c & 0x0Fu, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            l = 4, cp = c & 0x07u, min = 0x10000;
        } else {
            return i;
        }
        if (i + l > n) return i;
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += l;
    }
    return n;
}

typedef struct seglist {
    size_t *len;
    size_t n, cap;
} seglist;

static bool seg_push(seglist *l, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *v = loom_realloc(l->len, cap * sizeof *v);
        if (!v) return false;
        l->len = v;
        l->cap = cap;
    }
    l->len[l->n++] = len;
    return true;
}

loom_status loom__pretok_split(const loom_pretok *p, const char *text, size_t len, size_t **seg_len,
                               size_t *n_seg) {
    *seg_len = NULL;
    *n_seg = 0;
    size_t bad = loom__utf8_invalid_at(text, len);
    if (bad < len)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "tokenizer: the text is not valid UTF-8 at byte %zu (0x%02X)", bad,
                          (unsigned)(uint8_t)text[bad]);
    seglist cur = {0}, next = {0};
    loom_status st = LOOM_OK;
    if (len > 0 && !seg_push(&cur, len))
        st = loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
    pcre2_match_data *md = NULL;
    for (int r = 0; r < p->n_re && st == LOOM_OK; r++) {
        md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md) {
            st = loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
            break;
        }
        next.n = 0;
        size_t base = 0;
        for (size_t s = 0; s < cur.n && st == LOOM_OK; s++) {
            const char *seg = text + base;
            size_t n = cur.len[s], pos = 0, done = 0; /* done: end of the last piece pushed */
            while (pos < n) {
                int rc =
                    pcre2_match(p->re[r], (PCRE2_SPTR)seg, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[128];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    st = loom_error(
                        LOOM_ERR_INTERNAL,
                        "tokenizer: pre-tokenizer '%s' failed on the text near byte %zu: %s",
                        p->family, base + pos, (const char *)msg);
                    break;
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) { /* an empty match splits nothing */
                    pos = next_char(seg, ms, n);
                    continue;
                }
                if ((ms > done && !seg_push(&next, ms - done)) || !seg_push(&next, me - ms)) {
                    st = loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
                    break;
                }
                done = pos = me;
            }
            if (st == LOOM_OK && done < n && !seg_push(&next, n - done))
                st = loom_error(LOOM_ERR_NOMEM, "tokenizer: out of memory");
            base += n;
        }
        pcre2_match_data_free(md);
        seglist tmp = cur;
        cur = next;
        next = tmp;
    }
    loom_free(next.len);
    if (st != LOOM_OK) {
        loom_free(cur.len);
        return st;
    }
    *seg_len = cur.len;
    *n_seg = cur.n;
    return LOOM_OK;
}
