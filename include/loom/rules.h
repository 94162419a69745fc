/*
 * Tensor split tables: which GGUF weight (and KV cache) is split along which axis, in what
 * granularity, across the devices of a meta device. Tables are data, one per architecture,
 * in a small text format; a user file in the same format (`--split-rules FILE`) is checked
 * before the built-in table, so it overrides or extends it.
 *
 * Format: one rule per line; `#` starts a comment; fields separated by blanks:
 *   PATTERN  SPLIT  [GRANULARITY]
 *   PATTERN      a PCRE2 regular expression matched against the whole tensor name
 *   SPLIT        0 | 1 | 2 | 3 (the axis) | mirrored | fused_glu (axis 1 in two halves, gate
 *                and up, each split by the granularity, default ffn: phi3's ffn_up) |
 *                fused_qkv (axis 1 in three segments:
 *                q, k and v, each split by heads)
 *   GRANULARITY  the unit a device's share is a multiple of: a positive integer, or
 *                head (head_dim), kvhead (head_dim), qgroup (head_dim * n_head/n_head_kv:
 *                the query heads that share one KV head, so query and KV splits agree),
 *                ffn (the block length of ffn_down's type, so the FFN's column and row
 *                splits agree when the weights are quantised), qgroup_heads (qgroup
 *                counted in heads, for per-head values such as attention sinks), default 1. qgroup
 * and kvhead are coarsened together to whole blocks of attn_output's type. On axis 0 the type's
 * block length (32 for Q4_0/Q8_0) is always respected too. Counts that do not divide are spread
 * unevenly: the remainder units go to devices (layer + k) mod N, so no device is always short. A
 * line that does not parse is an error naming the file and line.
 */
#ifndef LOOM_RULES_H
#define LOOM_RULES_H

#include "loom/core.h"
#include "loom/model.h"
#include "loom/splitstate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_rules loom_rules;

typedef enum loom_rule_split {
    LOOM_RULE_AXIS_0 = 0,
    LOOM_RULE_AXIS_1 = 1,
    LOOM_RULE_AXIS_2 = 2,
    LOOM_RULE_AXIS_3 = 3,
    LOOM_RULE_MIRRORED = 10,
    LOOM_RULE_FUSED_QKV = 11,
    LOOM_RULE_FUSED_GLU = 12, /* axis 1 (axis 0 of a 1-d bias) in two segments, gate and up */
} loom_rule_split;

typedef enum loom_rule_unit {
    LOOM_RULE_UNIT_ELEMENTS = 0, /* `granularity` elements */
    LOOM_RULE_UNIT_HEAD,
    LOOM_RULE_UNIT_KVHEAD,
    LOOM_RULE_UNIT_QGROUP,
    LOOM_RULE_UNIT_FFN,
    LOOM_RULE_UNIT_BLOCKS, /* `granularity` quant blocks of the tensor's own type ("2blocks") */
    LOOM_RULE_UNIT_QGROUP_HEADS, /* qgroup counted in heads: per-head vectors (sinks) */
} loom_rule_unit;

typedef struct loom_rule {
    const char *pattern;
    loom_rule_split split;
    loom_rule_unit unit;
    int64_t granularity; /* for LOOM_RULE_UNIT_ELEMENTS and LOOM_RULE_UNIT_BLOCKS */
    const char *source;  /* file name or "builtin:llama" */
    int line;
} loom_rule;

/* Parses a table. source names it in errors ("rules.txt:7: unknown split 'x'"). */
LOOM_API loom_status loom_rules_parse(const char *text, const char *source, loom_rules **out);
/* A regular file of at most LOOM_RULES_MAX_FILE bytes with no NUL byte (a FIFO, a device
 * or a directory is refused before it is opened). */
LOOM_API loom_status loom_rules_load_file(const char *path, loom_rules **out);
#define LOOM_RULES_MAX_FILE (1 << 20)
/* The most rules one table may hold (each tensor name is matched against each rule). */
#define LOOM_RULES_MAX_RULES 4096
/* The largest integer GRANULARITY a table may give. */
#define LOOM_RULES_MAX_GRANULARITY ((int64_t)1 << 40)
/* The built-in table for an architecture (llama, mistral, mixtral, qwen2, qwen2moe, qwen3,
 * qwen3moe, gemma2, gemma3, phi3, gpt-oss; a llama or mistral with experts uses the MoE
 * table). LOOM_ERR_UNSUPPORTED naming an unknown one. */
LOOM_API loom_status loom_rules_builtin(const char *arch, bool moe, loom_rules **out);
LOOM_API const char *loom_rules_builtin_text(const char *arch, bool moe);
/* Puts `user`'s rules in front of base's (user is consumed and freed, also on failure).
 * LOOM_ERR_NOMEM leaves base as it was. */
LOOM_API loom_status loom_rules_prepend(loom_rules *base, loom_rules *user);
LOOM_API void loom_rules_free(loom_rules *r);

LOOM_API int loom_rules_count(const loom_rules *r);
LOOM_API const loom_rule *loom_rules_get(const loom_rules *r, int i);
/* The first rule whose pattern matches the whole name, or NULL. */
LOOM_API const loom_rule *loom_rules_match(const loom_rules *r, const char *name);

/* The split state of weight or cache tensor t over n_devices under the rule that matches
 * its name (MIRRORED if none). The layer index (for the rotation) is read from the name
 * ("blk.N." or "_lN"). *matched (optional) receives the rule. Errors name the tensor and
 * the rule (a size that is not a multiple of the granularity, an axis beyond the tensor's
 * dimensions). */
LOOM_API loom_status loom_rules_split_state(const loom_rules *r, const loom_hparams *hp,
                                            const loom_tensor *t, int n_devices,
                                            loom_split_state *out, const loom_rule **matched);
/* The same with device proportions (-ts 3,1): weights (n_devices finite values >= 0 with a
 * positive sum, or NULL for the even split) give each device the floor of its share of
 * the rule's whole units (query groups, KV heads, FFN blocks, experts, quant blocks) and
 * the leftover units in the layer's rotated order to devices of positive weight
 * (loom_split_counts). Every tensor of a layer gets the same counts of the same units, so
 * attention and FFN slices stay aligned; a device of weight 0 gets no slice. */
LOOM_API loom_status loom_rules_split_state_weighted(const loom_rules *r, const loom_hparams *hp,
                                                     const loom_tensor *t, int n_devices,
                                                     const float *weights, loom_split_state *out,
                                                     const loom_rule **matched);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_RULES_H */
