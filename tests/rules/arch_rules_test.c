/*
 * The architectures' split tables (issue 11): every built-in table parses and is found by
 * its architecture's name; phi3's fused gate/up splits as two halves, each like a dense
 * FFN (so the local halves stay gate and up); gpt-oss's sinks split with the query heads;
 * a single KV head is MIRRORED (weights and cache) while the query heads split one by one.
 */
#include <stdio.h>
#include <string.h>

#include "loom/rules.h"
#include "tests/shim/loom_test.h"

static const char *const ARCHS[] = {"llama",    "mistral", "mixtral", "qwen2", "qwen2moe", "qwen3",
                                    "qwen3moe", "gemma2",  "gemma3",  "phi3",  "gpt-oss"};

static loom_hparams hparams(const char *arch, int64_t H, int64_t Hk, int64_t D, int64_t F) {
    loom_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "%s", arch);
    hp.n_embd = 64;
    hp.n_head = H;
    hp.n_head_kv = Hk;
    hp.head_dim = D;
    hp.n_ff = F;
    hp.n_layer = 2;
    hp.attn_block = hp.ffn_block = 1;
    return hp;
}

static loom_tensor *tensor(loom_ctx *ctx, int64_t ne0, int64_t ne1, const char *name) {
    loom_tensor *t = ne1 ? loom_new_tensor_2d(ctx, LOOM_TYPE_F32, ne0, ne1)
                         : loom_new_tensor_1d(ctx, LOOM_TYPE_F32, ne0);
    if (t) loom_set_name(t, name);
    return t;
}

static void check_split(const loom_rules *r, const loom_hparams *hp, loom_tensor *t, int n,
                        int axis, const int64_t *want) {
    loom_split_state s;
    if (!LOOM_CHECK_MSG(loom_rules_split_state(r, hp, t, n, &s, NULL) == LOOM_OK, "%s: %s", t->name,
                        loom_last_error()))
        return;
    LOOM_CHECK_MSG((int)s.axis == axis, "%s: axis %d, want %d", t->name, (int)s.axis, axis);
    for (int j = 0; want && j < n; j++)
        LOOM_CHECK_MSG(loom_split_state_dev_count(&s, j) == want[j],
                       "%s device %d: %lld, want %lld", t->name, j,
                       (long long)loom_split_state_dev_count(&s, j), (long long)want[j]);
}

LOOM_TEST(arch_rules, every_architecture_has_a_table) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) {
        loom_rules *r = NULL;
        LOOM_CHECK_MSG(loom_rules_builtin(ARCHS[i], false, &r) == LOOM_OK, "%s: %s", ARCHS[i],
                       loom_last_error());
        if (r)
            LOOM_CHECK_MSG(loom_rules_count(r) > 8, "%s: %d rules", ARCHS[i], loom_rules_count(r));
        loom_rules_free(r);
    }
    loom_rules *r = NULL;
    LOOM_CHECK(loom_rules_builtin("deepseek2", false, &r) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'deepseek2'");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "gpt-oss");
}

LOOM_TEST(arch_rules, phi3_fused_gate_up_splits_in_two_halves) {
    loom_hparams hp = hparams("phi3", 4, 4, 16, 96);
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("phi3", false, &r) == LOOM_OK);
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *up = tensor(ctx, 64, 192, "blk.0.ffn_up.weight");
    loom_split_state s;
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, up, 3, &s, NULL) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_AXIS_1);
    LOOM_CHECK_EQ_INT(s.n_segments, 2);
    for (int seg = 0; seg < 2; seg++)
        for (int j = 0; j < 3; j++)
            LOOM_CHECK_EQ_INT(s.ne[seg][j], 32); /* 96 / 3 of each half */
    /* ffn_down's rows split like one half */
    check_split(r, &hp, tensor(ctx, 96, 64, "blk.0.ffn_down.weight"), 3, LOOM_SPLIT_AXIS_0,
                (int64_t[]){32, 32, 32});
    /* a fused weight that is not 2 x n_ff is refused by name */
    loom_tensor *bad = tensor(ctx, 64, 100, "blk.1.ffn_up.weight");
    LOOM_CHECK(loom_rules_split_state(r, &hp, bad, 2, &s, NULL) == LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "blk.1.ffn_up.weight");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "fused_glu");
    loom_ctx_free(ctx);
    loom_rules_free(r);
}

LOOM_TEST(arch_rules, gptoss_sinks_follow_the_query_heads) {
    loom_hparams hp = hparams("gpt-oss", 8, 2, 16, 32);
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("gpt-oss", true, &r) == LOOM_OK);
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true});
    /* 2 KV groups of 4 query heads over 2 devices: heads 4 + 4, q rows 64 + 64 */
    check_split(r, &hp, tensor(ctx, 64, 128, "blk.0.attn_q.weight"), 2, LOOM_SPLIT_AXIS_1,
                (int64_t[]){64, 64});
    check_split(r, &hp, tensor(ctx, 8, 0, "blk.0.attn_sinks.weight"), 2, LOOM_SPLIT_AXIS_0,
                (int64_t[]){4, 4});
    /* over 4 devices the 2 groups leave two devices empty, alike for q and sinks (layer 1
     * rotates the remainder) */
    check_split(r, &hp, tensor(ctx, 64, 128, "blk.1.attn_q.weight"), 4, LOOM_SPLIT_AXIS_1,
                (int64_t[]){0, 64, 64, 0});
    check_split(r, &hp, tensor(ctx, 8, 0, "blk.1.attn_sinks.weight"), 4, LOOM_SPLIT_AXIS_0,
                (int64_t[]){0, 4, 4, 0});
    check_split(r, &hp, tensor(ctx, 64, 4, "blk.0.ffn_gate_inp.weight"), 2, LOOM_SPLIT_MIRRORED,
                NULL);
    check_split(r, &hp, tensor(ctx, 4, 0, "blk.0.ffn_gate_inp.bias"), 2, LOOM_SPLIT_MIRRORED, NULL);
    loom_ctx_free(ctx);
    loom_rules_free(r);
}

LOOM_TEST(arch_rules, a_single_kv_head_is_mirrored) {
    loom_hparams hp = hparams("llama", 4, 1, 16, 96);
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &r) == LOOM_OK);
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true});
    for (int n = 2; n <= 8; n *= 2) {
        check_split(r, &hp, tensor(ctx, 64, 16, "blk.0.attn_k.weight"), n, LOOM_SPLIT_MIRRORED,
                    NULL);
        check_split(r, &hp, tensor(ctx, 64, 16, "blk.0.attn_v.weight"), n, LOOM_SPLIT_MIRRORED,
                    NULL);
        check_split(r, &hp, tensor(ctx, 16, 64, "cache_k_l0"), n, LOOM_SPLIT_MIRRORED, NULL);
        check_split(r, &hp, tensor(ctx, 64, 96, "blk.0.attn_qkv.weight"), n, LOOM_SPLIT_MIRRORED,
                    NULL);
    }
    /* the 4 query heads split one by one: over 2 devices 2 + 2 (not 4 + 0) */
    check_split(r, &hp, tensor(ctx, 64, 64, "blk.0.attn_q.weight"), 2, LOOM_SPLIT_AXIS_1,
                (int64_t[]){32, 32});
    check_split(r, &hp, tensor(ctx, 64, 64, "blk.0.attn_output.weight"), 2, LOOM_SPLIT_AXIS_0,
                (int64_t[]){32, 32});
    loom_ctx_free(ctx);
    loom_rules_free(r);
}

LOOM_TEST(arch_rules, new_split_words_parse) {
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_parse("a fused_glu\nb fused_glu 32\nc 0 qgroup_heads\n", "t", &r) ==
                 LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_rules_get(r, 0)->split, LOOM_RULE_FUSED_GLU);
    LOOM_CHECK_EQ_INT(loom_rules_get(r, 0)->unit, LOOM_RULE_UNIT_FFN);
    LOOM_CHECK_EQ_INT(loom_rules_get(r, 1)->granularity, 32);
    LOOM_CHECK_EQ_INT(loom_rules_get(r, 2)->unit, LOOM_RULE_UNIT_QGROUP_HEADS);
    loom_rules_free(r);
}
