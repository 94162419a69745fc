/*
 * Split tables: parsing (PCRE2 patterns, anchored to the whole name), the built-in tables
 * per architecture, matching, and turning a matched rule into an exact split state.
 */
#define _GNU_SOURCE
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <fcntl.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/rules.h"

typedef struct rule_impl {
    loom_rule pub;
    char *pattern;
    char *source;
    pcre2_code *re;
} rule_impl;

struct loom_rules {
    rule_impl *v;
    int n, cap;
};

/* ---------------------------------------------------------------- built-in tables */

#define COMMON_ATTN                                                                                \
    "token_embd\\.weight            mirrored\n"                                                    \
    "output_norm\\.weight           mirrored\n"                                                    \
    "output\\.weight                1\n"                                                           \
    "rope_(freqs|factors_long|factors_short)\\.weight  mirrored\n"                                 \
    "blk\\.\\d+\\.attn_norm\\.weight  mirrored\n"                                                  \
    "blk\\.\\d+\\.ffn_norm\\.weight   mirrored\n"                                                  \
    "# attention: query heads in groups that share a KV head, so every device keeps\n"             \
    "# whole groups (fewer KV heads than devices leaves some devices empty)\n"                     \
    "blk\\.\\d+\\.attn_q\\.weight     1  qgroup\n"                                                 \
    "blk\\.\\d+\\.attn_[kv]\\.weight  1  kvhead\n"                                                 \
    "blk\\.\\d+\\.attn_qkv\\.weight   fused_qkv\n"                                                 \
    "blk\\.\\d+\\.attn_output\\.weight 0 qgroup\n"                                                 \
    "cache_[kv]_l\\d+               0  kvhead\n"

#define ATTN_BIASES                                                                                \
    "blk\\.\\d+\\.attn_q\\.bias       0  qgroup\n"                                                 \
    "blk\\.\\d+\\.attn_[kv]\\.bias    0  kvhead\n"                                                 \
    "blk\\.\\d+\\.attn_qkv\\.bias     fused_qkv\n"                                                 \
    "blk\\.\\d+\\.attn_output\\.bias  mirrored\n"

#define QK_NORM                                                                                    \
    "# per-head norms: every head uses the same [head_dim] weight\n"                               \
    "blk\\.\\d+\\.attn_[qk]_norm\\.weight  mirrored\n"

#define DENSE_FFN                                                                                  \
    "blk\\.\\d+\\.ffn_(gate|up)\\.weight  1  ffn\n"                                                \
    "blk\\.\\d+\\.ffn_down\\.weight       0  ffn\n"

#define EXPERTS                                                                                    \
    "# experts split along their FFN dim: every device holds a slice of every expert\n"            \
    "blk\\.\\d+\\.ffn_gate_inp\\.weight         mirrored\n"                                        \
    "blk\\.\\d+\\.ffn_(gate|up)_exps\\.weight   1  ffn\n"                                          \
    "blk\\.\\d+\\.ffn_down_exps\\.weight        0  ffn\n"                                          \
    "blk\\.\\d+\\.ffn_(gate|up)_exps\\.bias     0  ffn\n"                                          \
    "blk\\.\\d+\\.ffn_down_exps\\.bias          mirrored\n"

#define SHARED_EXPERT                                                                              \
    "# the shared expert splits like a dense FFN; its sigmoid gate is mirrored\n"                  \
    "blk\\.\\d+\\.ffn_gate_inp_shexp\\.weight   mirrored\n"                                        \
    "blk\\.\\d+\\.ffn_(gate|up)_shexp\\.weight  1  ffn\n"                                          \
    "blk\\.\\d+\\.ffn_down_shexp\\.weight       0  ffn\n"

static const char LLAMA_RULES[] = "# llama / mistral: tensor-parallel split table\n" COMMON_ATTN
    DENSE_FFN;

static const char QWEN2_RULES[] =
    "# qwen2: llama's table plus attention biases\n" COMMON_ATTN ATTN_BIASES DENSE_FFN;

static const char MOE_RULES[] = "# mixtral-style MoE\n" COMMON_ATTN ATTN_BIASES EXPERTS DENSE_FFN;

static const char QWEN2MOE_RULES[] =
    "# qwen2moe: MoE with biases and a gated shared expert\n" COMMON_ATTN ATTN_BIASES EXPERTS
        SHARED_EXPERT;

static const char QWEN3_RULES[] =
    "# qwen3: llama's table plus per-head q/k norms\n" COMMON_ATTN QK_NORM DENSE_FFN;

static const char QWEN3MOE_RULES[] =
    "# qwen3moe: qwen3's attention, MoE FFN\n" COMMON_ATTN QK_NORM EXPERTS;

#define FUSED_GATE_UP                                                                              \
    "# gate and up in one weight: each half split like a dense FFN's\n"                            \
    "blk\\.\\d+\\.ffn_up\\.weight  fused_glu\n"                                                    \
    "blk\\.\\d+\\.ffn_down\\.weight  0  ffn\n"

static const char GPTOSS_RULES[] =
    "# gpt-oss: biases, per-head sinks, MoE with router and expert biases\n" COMMON_ATTN ATTN_BIASES
    "blk\\.\\d+\\.attn_sinks\\.weight          0  qgroup_heads\n"
    "blk\\.\\d+\\.post_attention_norm\\.weight mirrored\n"
    "blk\\.\\d+\\.ffn_gate_inp\\.bias          mirrored\n" EXPERTS;

static const char PHI3_RULES[] =
    "# phi3: fused QKV and fused gate/up, split per part\n" COMMON_ATTN FUSED_GATE_UP;

#define POST_NORMS "blk\\.\\d+\\.post_(attention|ffw)_norm\\.weight  mirrored\n"

static const char GEMMA2_RULES[] =
    "# gemma2: llama's table plus post-attention / post-FFN norms\n" COMMON_ATTN POST_NORMS
        DENSE_FFN;

static const char GEMMA3_RULES[] =
    "# gemma3: gemma2's table plus per-head q/k norms\n" COMMON_ATTN QK_NORM POST_NORMS DENSE_FFN;

static const struct {
    const char *arch;
    const char *text;
} TABLES[] = {
    {"phi3", PHI3_RULES},     {"gpt-oss", GPTOSS_RULES},    {"gemma2", GEMMA2_RULES},
    {"gemma3", GEMMA3_RULES}, {"llama", LLAMA_RULES},       {"mistral", LLAMA_RULES},
    {"mixtral", MOE_RULES},   {"qwen2", QWEN2_RULES},       {"qwen2moe", QWEN2MOE_RULES},
    {"qwen3", QWEN3_RULES},   {"qwen3moe", QWEN3MOE_RULES},
};

const char *loom_rules_builtin_text(const char *arch, bool moe) {
    for (size_t i = 0; i < sizeof TABLES / sizeof TABLES[0]; i++)
        if (strcmp(arch, TABLES[i].arch) == 0)
            return moe && TABLES[i].text == LLAMA_RULES ? MOE_RULES : TABLES[i].text;
    return NULL;
}

loom_status loom_rules_builtin(const char *arch, bool moe, loom_rules **out) {
    const char *text = loom_rules_builtin_text(arch, moe);
    if (!text)
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "rules: no split table for architecture '%s' (llama, mistral, mixtral, "
                          "qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss)",
                          arch);
    char source[64];
    /* "+moe": a dense architecture's file with experts (llama with experts = mixtral) */
    snprintf(source, sizeof source, "builtin:%s%s", arch,
             text != loom_rules_builtin_text(arch, false) ? "+moe" : "");
    return loom_rules_parse(text, source, out);
}

/* ---------------------------------------------------------------- parsing */

void loom_rules_free(loom_rules *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        loom_free(r->v[i].pattern);
        loom_free(r->v[i].source);
        pcre2_code_free(r->v[i].re);
    }
    loom_free(r->v);
    loom_free(r);
}

static loom_status parse_line(loom_rules *r, char *line, const char *source, int lineno) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *fields[4];
    int nf = 0;
    char *save = NULL;
    for (char *tok = strtok_r(line, " \t\r", &save); tok; tok = strtok_r(NULL, " \t\r", &save)) {
        if (nf == 3)
            return loom_error(LOOM_ERR_FORMAT, "%s:%d: too many fields (PATTERN SPLIT [GRANULARITY])",
                              source, lineno);
        fields[nf++] = tok;
    }
    if (nf == 0) return LOOM_OK;
    if (nf < 2)
        return loom_error(LOOM_ERR_FORMAT, "%s:%d: missing split for pattern '%s'", source, lineno,
                          fields[0]);
    if (r->n >= LOOM_RULES_MAX_RULES) /* every name is matched against every rule */
        return loom_error(LOOM_ERR_FORMAT, "%s:%d: more than %d rules", source, lineno,
                          LOOM_RULES_MAX_RULES);
    rule_impl ri = {0};
    const char *sp = fields[1];
    if (strcmp(sp, "mirrored") == 0) ri.pub.split = LOOM_RULE_MIRRORED;
    else if (strcmp(sp, "fused_qkv") == 0) ri.pub.split = LOOM_RULE_FUSED_QKV;
    else if (strcmp(sp, "fused_glu") == 0)
        ri.pub.split = LOOM_RULE_FUSED_GLU;
    else if (sp[0] >= '0' && sp[0] <= '3' && sp[1] == 0) ri.pub.split = (loom_rule_split)(sp[0] - '0');
    else
        return loom_error(
            LOOM_ERR_FORMAT,
            "%s:%d: unknown split '%s' (0, 1, 2, 3, mirrored, fused_qkv or fused_glu)", source,
            lineno, sp);
    ri.pub.unit =
        ri.pub.split == LOOM_RULE_FUSED_GLU ? LOOM_RULE_UNIT_FFN : LOOM_RULE_UNIT_ELEMENTS;
    ri.pub.granularity = 1;
    if (nf == 3) {
        const char *g = fields[2];
        if (strcmp(g, "head") == 0) ri.pub.unit = LOOM_RULE_UNIT_HEAD;
        else if (strcmp(g, "kvhead") == 0) ri.pub.unit = LOOM_RULE_UNIT_KVHEAD;
        else if (strcmp(g, "qgroup") == 0) ri.pub.unit = LOOM_RULE_UNIT_QGROUP;
        else if (strcmp(g, "ffn") == 0) ri.pub.unit = LOOM_RULE_UNIT_FFN;
        else if (strcmp(g, "qgroup_heads") == 0)
            ri.pub.unit = LOOM_RULE_UNIT_QGROUP_HEADS;
        else {
            char *end;
            errno = 0;
            long long v = strtoll(g, &end, 10);
            /* "N" elements, or "Nblocks" / "Nblock": N quant blocks of the tensor's type */
            bool blocks = end != g && (strcmp(end, "blocks") == 0 || strcmp(end, "block") == 0);
            if ((*end && !blocks) || errno || v <= 0 || v > LOOM_RULES_MAX_GRANULARITY)
                return loom_error(LOOM_ERR_FORMAT,
                                  "%s:%d: bad granularity '%s' (a positive integer of elements up "
                                  "to %lld, Nblocks, head, kvhead, qgroup, qgroup_heads or ffn)",
                                  source, lineno, g, (long long)LOOM_RULES_MAX_GRANULARITY);
            ri.pub.granularity = v;
            if (blocks) ri.pub.unit = LOOM_RULE_UNIT_BLOCKS;
        }
        if (ri.pub.split == LOOM_RULE_MIRRORED || ri.pub.split == LOOM_RULE_FUSED_QKV)
            return loom_error(LOOM_ERR_FORMAT, "%s:%d: '%s' takes no granularity", source, lineno, sp);
    }
    /* anchor the pattern to the whole name */
    size_t plen = strlen(fields[0]);
    char *anchored = loom_malloc(plen + 8);
    if (!anchored) return loom_error(LOOM_ERR_NOMEM, "rules: out of memory");
    snprintf(anchored, plen + 8, "^(?:%s)$", fields[0]);
    int err;
    PCRE2_SIZE off;
    ri.re = pcre2_compile((PCRE2_SPTR)anchored, PCRE2_ZERO_TERMINATED, 0, &err, &off, NULL);
    loom_free(anchored);
    if (!ri.re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        size_t at = off >= 4 ? off - 4 : 0;
        /* the reason first and the pattern shortened, so a long pattern cannot push the
         * reason out of the message */
        int shown = plen > 80 ? 80 : (int)plen;
        return loom_error(LOOM_ERR_FORMAT, "%s:%d: bad pattern at offset %zu: %s: '%.*s'%s", source,
                          lineno, at, (const char *)msg, shown, fields[0],
                          plen > 80 ? "... (cut)" : "");
    }
    ri.pattern = loom_strdup(fields[0]);
    ri.source = loom_strdup(source);
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 16;
        rule_impl *v = loom_realloc(r->v, (size_t)cap * sizeof *v);
        if (!v) {
            pcre2_code_free(ri.re);
            loom_free(ri.pattern);
            loom_free(ri.source);
            return loom_error(LOOM_ERR_NOMEM, "rules: out of memory");
        }
        r->v = v;
        r->cap = cap;
    }
    if (!ri.pattern || !ri.source) {
        pcre2_code_free(ri.re);
        loom_free(ri.pattern);
        loom_free(ri.source);
        return loom_error(LOOM_ERR_NOMEM, "rules: out of memory");
    }
    ri.pub.pattern = ri.pattern;
    ri.pub.source = ri.source;
    ri.pub.line = lineno;
    r->v[r->n++] = ri;
    return LOOM_OK;
}

loom_status loom_rules_parse(const char *text, const char *source, loom_rules **out) {
    *out = NULL;
    if (!text) return loom_error(LOOM_ERR_INVALID_ARG, "rules: NULL text");
    loom_rules *r = loom_calloc(1, sizeof *r);
    char *copy = loom_strdup(text);
    if (!r || !copy) {
        loom_free(r);
        loom_free(copy);
        return loom_error(LOOM_ERR_NOMEM, "rules: out of memory");
    }
    int lineno = 0;
    loom_status st = LOOM_OK;
    for (char *p = copy; p && st == LOOM_OK;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        lineno++;
        st = parse_line(r, p, source, lineno);
        p = nl ? nl + 1 : NULL;
    }
    loom_free(copy);
    if (st) {
        loom_rules_free(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

loom_status loom_rules_load_file(const char *path, loom_rules **out) {
    *out = NULL;
    /* a FIFO would block fopen() and /dev/zero would read without end: only a regular file
     * of bounded size, checked before opening and again on the open descriptor */
    struct stat sb;
    if (stat(path, &sb) != 0)
        return loom_error(LOOM_ERR_IO, "rules: cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return loom_error(LOOM_ERR_IO, "rules: '%s' is not a regular file", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return loom_error(LOOM_ERR_IO, "rules: cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return loom_error(LOOM_ERR_IO, "rules: '%s' is not a regular file", path);
    }
    if (sb.st_size > LOOM_RULES_MAX_FILE) {
        close(fd);
        return loom_error(LOOM_ERR_FORMAT, "rules: '%s' is %lld bytes (a rules file is at most %d)",
                          path, (long long)sb.st_size, LOOM_RULES_MAX_FILE);
    }
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *buf = loom_malloc(cap + 1);
    if (!buf) {
        close(fd);
        return loom_error(LOOM_ERR_NOMEM, "rules: out of memory reading '%s'", path);
    }
    /* at most cap bytes: a file that grew past its size since the check is refused */
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            loom_status st =
                loom_error(LOOM_ERR_IO, "rules: error reading '%s': %s", path, strerror(errno));
            close(fd);
            loom_free(buf);
            return st;
        }
        if (k == 0) break;
        n += (size_t)k;
        if (n == cap) {
            close(fd);
            loom_free(buf);
            return loom_error(
                LOOM_ERR_FORMAT,
                "rules: '%s' grew while being read (a rules file is at most %d bytes)", path,
                LOOM_RULES_MAX_FILE);
        }
    }
    close(fd);
    buf[n] = 0;
    /* a NUL would silently end the text: name the line it is on */
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        int line = 1;
        for (const char *p = buf; p < nul; p++)
            line += *p == '\n';
        loom_free(buf);
        return loom_error(LOOM_ERR_FORMAT, "%s:%d: NUL byte at offset %zu (a rules file is text)",
                          path, line, (size_t)(nul - buf));
    }
    loom_status st = loom_rules_parse(buf, path, out);
    loom_free(buf);
    return st;
}

loom_status loom_rules_prepend(loom_rules *base, loom_rules *user) {
    if (!user) return LOOM_OK;
    int n = base->n + user->n;
    if (user->n == 0) { /* an empty file: nothing to add (and no NULL to memcpy) */
        loom_rules_free(user);
        return LOOM_OK;
    }
    rule_impl *v = loom_malloc((size_t)n * sizeof *v);
    if (!v) {
        loom_rules_free(user);
        return loom_error(LOOM_ERR_NOMEM, "rules: out of memory adding %d rules", n);
    }
    memcpy(v, user->v, (size_t)user->n * sizeof *v);
    if (base->n) memcpy(v + user->n, base->v, (size_t)base->n * sizeof *v);
    loom_free(base->v);
    base->v = v;
    base->n = base->cap = n;
    loom_free(user->v);
    loom_free(user);
    return LOOM_OK;
}

int loom_rules_count(const loom_rules *r) { return r->n; }
const loom_rule *loom_rules_get(const loom_rules *r, int i) { return &r->v[i].pub; }

const loom_rule *loom_rules_match(const loom_rules *r, const char *name) {
    pcre2_match_data *md = NULL;
    const loom_rule *hit = NULL;
    for (int i = 0; i < r->n && !hit; i++) {
        if (!md) md = pcre2_match_data_create_from_pattern(r->v[i].re, NULL);
        if (!md) return NULL;
        if (pcre2_match(r->v[i].re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) >= 0)
            hit = &r->v[i].pub;
    }
    if (md) pcre2_match_data_free(md);
    return hit;
}

/* ---------------------------------------------------------------- split states */

static int layer_of(const char *name) {
    const char *p = strstr(name, "blk.");
    if (p) return atoi(p + 4);
    p = strstr(name, "_l");
    if (p && p[2] >= '0' && p[2] <= '9') return atoi(p + 2);
    return 0;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* lcm(a, b) of positive a, b; false when it overflows */
static bool lcm64(int64_t a, int64_t b, int64_t *out) {
    return !loom_mul_overflow_i64(a / gcd64(a, b), b, out);
}

/* Query groups are coarsened to whole quant blocks of attn_output's rows; KV heads follow
 * with the same multiple, so query and KV splits keep agreeing. Checked (the hyperparameters
 * come from a file): false when the unit does not fit in int64. blck: elements per quant
 * block of the tensor's type (for a granularity in blocks). */
static bool unit_elems(const loom_rule *rule, const loom_hparams *hp, int64_t blck,
                       int64_t *out) {
    if (hp->head_dim <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0) return false;
    int64_t qg, l;
    /* one KV head (MQA): its K/V are mirrored, so the query heads split one by one */
    const int64_t heads_per_group = hp->n_head_kv == 1 ? 1 : hp->n_head / hp->n_head_kv;
    if (loom_mul_overflow_i64(hp->head_dim, heads_per_group, &qg) || qg <= 0 ||
        !lcm64(qg, hp->attn_block > 1 ? hp->attn_block : 1, &l))
        return false;
    switch (rule->unit) {
    case LOOM_RULE_UNIT_HEAD:
        *out = hp->head_dim;
        return true;
    case LOOM_RULE_UNIT_KVHEAD:
        return !loom_mul_overflow_i64(hp->head_dim, l / qg, out);
    case LOOM_RULE_UNIT_QGROUP:
        *out = l;
        return true;
    case LOOM_RULE_UNIT_QGROUP_HEADS: /* the same groups counted in heads */
        *out = l / hp->head_dim;
        return true;
    case LOOM_RULE_UNIT_FFN:
        *out = hp->ffn_block > 1 ? hp->ffn_block : 1;
        return true;
    case LOOM_RULE_UNIT_BLOCKS:
        return !loom_mul_overflow_i64(rule->granularity, blck, out);
    default:
        *out = rule->granularity;
        return rule->granularity > 0;
    }
}

/* One segment of size elements in units of g: even, or proportional to weights (-ts) */
static loom_status add_split(loom_split_state *s, int64_t size, int64_t g, int rotation,
                             const float *weights) {
    int64_t counts[LOOM_SPLIT_MAX_DEVICES];
    loom_status st = loom_split_counts(size, g, s->n_devices, rotation, weights, counts);
    return st ? st : loom_split_state_add_segment(s, counts, 1);
}

loom_status loom_rules_split_state(const loom_rules *r, const loom_hparams *hp,
                                   const loom_tensor *t, int n_devices, loom_split_state *out,
                                   const loom_rule **matched) {
    return loom_rules_split_state_weighted(r, hp, t, n_devices, NULL, out, matched);
}

loom_status loom_rules_split_state_weighted(const loom_rules *r, const loom_hparams *hp,
                                            const loom_tensor *t, int n_devices,
                                            const float *weights, loom_split_state *out,
                                            const loom_rule **matched) {
    if (n_devices < 1 || n_devices > LOOM_SPLIT_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "rules: '%s' over %d devices (must be 1..%d)",
                          t->name, n_devices, LOOM_SPLIT_MAX_DEVICES);
    const loom_rule *rule = loom_rules_match(r, t->name);
    if (matched) *matched = rule;
    /* a single KV head cannot be split: every device keeps all of it (MIRRORED) */
    bool mqa_kv =
        hp->n_head_kv == 1 &&
        (rule && (rule->unit == LOOM_RULE_UNIT_KVHEAD || rule->split == LOOM_RULE_FUSED_QKV));
    if (!rule || rule->split == LOOM_RULE_MIRRORED || n_devices == 1 || mqa_kv) {
        loom_split_state_init(out, LOOM_SPLIT_MIRRORED, n_devices);
        return LOOM_OK;
    }
    int rotation = layer_of(t->name) % n_devices;
    int64_t blck = loom_blck_size(t->type);
    loom_status st;
    if (rule->split == LOOM_RULE_FUSED_QKV) {
        const int64_t D = hp->head_dim;
        int64_t Dq, Dkv, Dqkv;
        int axis = loom_n_dims(t) == 1 ? 0 : 1;
        /* checked: the hyperparameters come from a file */
        if (D <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
            loom_mul_overflow_i64(hp->n_head, D, &Dq) ||
            loom_mul_overflow_i64(hp->n_head_kv, D, &Dkv) ||
            loom_add_overflow_i64(Dq, Dkv, &Dqkv) || loom_add_overflow_i64(Dqkv, Dkv, &Dqkv))
            return loom_error(
                LOOM_ERR_INVALID_ARG,
                "rules: '%s' (%s:%d fused_qkv): the q/k/v widths overflow (head_dim %lld, "
                "%lld heads, %lld KV heads)",
                t->name, rule->source, rule->line, (long long)D, (long long)hp->n_head,
                (long long)hp->n_head_kv);
        if (t->ne[axis] != Dqkv)
            return loom_error(LOOM_ERR_SHAPE,
                              "rules: '%s' (%s:%d fused_qkv): ne[%d] = %lld, expected %lld + 2 x %lld",
                              t->name, rule->source, rule->line, axis, (long long)t->ne[axis],
                              (long long)Dq, (long long)Dkv);
        loom_split_state_init(out, (loom_split_axis)axis, n_devices);
        /* the same units as attn_q/k/v and the cache: query groups and KV heads coarsened
         * together to whole blocks of attn_output's type */
        const loom_rule q_unit = {.unit = LOOM_RULE_UNIT_QGROUP},
                        kv_unit = {.unit = LOOM_RULE_UNIT_KVHEAD};
        int64_t qg, kvg;
        if (!unit_elems(&q_unit, hp, blck, &qg) || !unit_elems(&kv_unit, hp, blck, &kvg))
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "rules: '%s' (%s:%d fused_qkv): the split unit overflows", t->name,
                              rule->source, rule->line);
        if ((st = add_split(out, Dq, qg, rotation, weights)) ||
            (st = add_split(out, Dkv, kvg, rotation, weights)) ||
            (st = add_split(out, Dkv, kvg, rotation, weights)))
            return loom_error(st, "rules: '%s' (%s:%d): %s", t->name, rule->source, rule->line,
                              loom_last_error());
        return LOOM_OK;
    }
    if (rule->split == LOOM_RULE_FUSED_GLU) {
        int axis = loom_n_dims(t) == 1 ? 0 : 1;
        int64_t half = t->ne[axis] / 2, g;
        if (!unit_elems(rule, hp, blck, &g))
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "rules: '%s' (%s:%d fused_glu): the split unit overflows", t->name,
                              rule->source, rule->line);
        if (t->ne[axis] != 2 * hp->n_ff)
            return loom_error(
                LOOM_ERR_SHAPE,
                "rules: '%s' (%s:%d fused_glu): ne[%d] = %lld, expected 2 x n_ff %lld", t->name,
                rule->source, rule->line, axis, (long long)t->ne[axis], (long long)hp->n_ff);
        loom_split_state_init(out, (loom_split_axis)axis, n_devices);
        if ((st = add_split(out, half, g, rotation, weights)) ||
            (st = add_split(out, half, g, rotation, weights)))
            return loom_error(st, "rules: '%s' (%s:%d): %s", t->name, rule->source, rule->line,
                              loom_last_error());
        return LOOM_OK;
    }
    int axis = (int)rule->split;
    if (axis >= LOOM_MAX_DIMS || (t->ne[axis] == 1 && axis > 0 && loom_n_dims(t) <= axis))
        return loom_error(LOOM_ERR_SHAPE, "rules: '%s' (%s:%d) splits axis %d of a %d-d tensor",
                          t->name, rule->source, rule->line, axis, loom_n_dims(t));
    int64_t g;
    if (!unit_elems(rule, hp, blck, &g) || (axis == 0 && blck > 1 && !lcm64(g, blck, &g))) /* blocks */
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "rules: '%s' (%s:%d): the split unit overflows (granularity %lld, "
                          "head_dim %lld, block %lld)",
                          t->name, rule->source, rule->line, (long long)rule->granularity,
                          (long long)hp->head_dim, (long long)blck);
    loom_split_state_init(out, (loom_split_axis)axis, n_devices);
    if ((st = add_split(out, t->ne[axis], g, rotation, weights)))
        return loom_error(st, "rules: '%s' (%s:%d): %s", t->name, rule->source, rule->line,
                          loom_last_error());
    return LOOM_OK;
}
