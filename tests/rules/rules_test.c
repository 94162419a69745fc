/*
 * Split tables: parsing and its errors (file and line named), matching order (a user file
 * overrides the built-in table), and the exact split states the built-in llama table gives
 * for stories260K-shaped weights over 2, 3, 4 and 8 devices, including uneven FFN splits
 * rotated by layer, GQA groups with empty devices, fused QKV segments and Q4_0 blocks.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/rules.h"
#include "tests/shim/loom_test.h"

static loom_hparams stories_hp(void) {
    loom_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_embd = 64;
    hp.n_head = 8;
    hp.n_head_kv = 4;
    hp.head_dim = 8;
    hp.n_ff = 172;
    hp.n_layer = 5;
    hp.n_vocab = 512;
    return hp;
}

static loom_tensor *tensor(loom_ctx *ctx, loom_type type, int64_t ne0, int64_t ne1, const char *name) {
    loom_tensor *t = loom_new_tensor_2d(ctx, type, ne0, ne1);
    if (t) loom_set_name(t, name);
    return t;
}

static void check_counts(const loom_split_state *s, int axis, const int64_t *want, int n) {
    LOOM_CHECK_EQ_INT(s->axis, axis);
    for (int j = 0; j < n; j++)
        LOOM_CHECK_MSG(loom_split_state_dev_count(s, j) == want[j], "device %d: %lld, want %lld", j,
                       (long long)loom_split_state_dev_count(s, j), (long long)want[j]);
}

LOOM_TEST(rules, parse_errors_name_file_and_line) {
    loom_rules *r = NULL;
    LOOM_CHECK(loom_rules_parse("a 0\nb sideways\n", "my.rules", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "my.rules:2: unknown split 'sideways'");
    LOOM_CHECK(r == NULL);
    LOOM_CHECK(loom_rules_parse("# c\n\nfoo(\\d 1\n", "x.rules", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "x.rules:3: bad pattern at offset");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'foo(\\d'");
    LOOM_CHECK(loom_rules_parse("a 1 -4\n", "y", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "y:1: bad granularity '-4'");
    LOOM_CHECK(loom_rules_parse("a mirrored 4\n", "y", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "takes no granularity");
    LOOM_CHECK(loom_rules_parse("a\n", "z", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "z:1: missing split");
    LOOM_CHECK(loom_rules_parse("a 1 2 3\n", "z", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "too many fields");
    LOOM_CHECK(loom_rules_load_file("/nonexistent/rules.txt", &r) == LOOM_ERR_IO);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "/nonexistent/rules.txt");
    LOOM_CHECK(loom_rules_builtin("gpt-j", false, &r) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "gpt-j");
}

LOOM_TEST(rules, whole_name_match_and_user_override) {
    loom_rules *base = NULL, *user = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &base) == LOOM_OK);
    const loom_rule *m = loom_rules_match(base, "blk.3.ffn_down.weight");
    LOOM_REQUIRE(m != NULL);
    LOOM_CHECK(m->split == LOOM_RULE_AXIS_0);
    LOOM_CHECK(loom_rules_match(base, "xblk.3.ffn_down.weight") == NULL); /* anchored */
    LOOM_CHECK(loom_rules_match(base, "blk.3.ffn_down.weight.extra") == NULL);
    char path[] = "/tmp/loom_rules_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    const char *text = "blk\\.\\d+\\.ffn_down\\.weight mirrored  # keep down whole\n";
    LOOM_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    LOOM_REQUIRE(loom_rules_load_file(path, &user) == LOOM_OK);
    int n_base = loom_rules_count(base);
    loom_rules_prepend(base, user);
    LOOM_CHECK_EQ_INT(loom_rules_count(base), n_base + 1);
    m = loom_rules_match(base, "blk.3.ffn_down.weight");
    LOOM_REQUIRE(m != NULL);
    LOOM_CHECK(m->split == LOOM_RULE_MIRRORED);
    LOOM_CHECK(strcmp(m->source, path) == 0 && m->line == 1);
    m = loom_rules_match(base, "blk.3.ffn_up.weight"); /* still from the built-in table */
    LOOM_CHECK(m != NULL && strcmp(m->source, "builtin:llama") == 0);
    unlink(path);
    loom_rules_free(base);
}

LOOM_TEST(rules, llama_split_states) {
    loom_hparams hp = stories_hp();
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &r) == LOOM_OK);
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 64 * loom_tensor_overhead(), .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *wq0 = tensor(ctx, LOOM_TYPE_F32, 64, 64, "blk.0.attn_q.weight");
    loom_tensor *wk0 = tensor(ctx, LOOM_TYPE_F32, 64, 32, "blk.0.attn_k.weight");
    loom_tensor *wo1 = tensor(ctx, LOOM_TYPE_F32, 64, 64, "blk.1.attn_output.weight");
    loom_tensor *up0 = tensor(ctx, LOOM_TYPE_F32, 64, 172, "blk.0.ffn_up.weight");
    loom_tensor *up1 = tensor(ctx, LOOM_TYPE_F32, 64, 172, "blk.1.ffn_up.weight");
    loom_tensor *norm = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 64);
    loom_set_name(norm, "blk.0.attn_norm.weight");
    loom_tensor *kc2 = tensor(ctx, LOOM_TYPE_F16, 32, 128, "cache_k_l2");
    loom_split_state s;
    const loom_rule *m;

    /* 2 devices: 4 query groups of 2 heads (16 rows each) -> 2 groups each */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wq0, 2, &s, &m) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){32, 32}, 2);
    LOOM_CHECK(m && m->unit == LOOM_RULE_UNIT_QGROUP);
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wk0, 2, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){16, 16}, 2);
    /* 8 devices: 4 groups -> devices 0..3 one group each, 4..7 empty; K agrees */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wq0, 8, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){16, 16, 16, 16, 0, 0, 0, 0}, 8);
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wk0, 8, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){8, 8, 8, 8, 0, 0, 0, 0}, 8);
    /* layer 1 rotates the remainder by one device */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wo1, 8, &s, NULL) == LOOM_OK);
    check_counts(&s, 0, (int64_t[]){0, 16, 16, 16, 16, 0, 0, 0}, 8);
    /* 3 devices, FFN 172 = 57 * 3 + 1 */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, up0, 3, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){58, 57, 57}, 3);
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, up1, 3, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){57, 58, 57}, 3);
    /* 8 devices: 172 = 21 * 8 + 4 */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, up0, 8, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){22, 22, 22, 22, 21, 21, 21, 21}, 8);
    /* norms mirror; the cache of layer 2 rotates by 2 */
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, norm, 4, &s, NULL) == LOOM_OK);
    LOOM_CHECK(s.axis == LOOM_SPLIT_MIRRORED);
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, kc2, 8, &s, NULL) == LOOM_OK);
    check_counts(&s, 0, (int64_t[]){0, 0, 8, 8, 8, 8, 0, 0}, 8);
    loom_ctx_free(ctx);
    loom_rules_free(r);
}

LOOM_TEST(rules, quant_blocks_and_fused_qkv) {
    loom_hparams hp = stories_hp();
    hp.n_embd = 256;
    hp.n_ff = 96;
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("qwen2", false, &r) == LOOM_OK);
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 32 * loom_tensor_overhead(), .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    /* ffn_down [96, 256] Q4_0 split on axis 0: 96 = 3 blocks of 32 over 2 devices */
    loom_tensor *down = tensor(ctx, LOOM_TYPE_Q4_0, 96, 256, "blk.0.ffn_down.weight");
    loom_split_state s;
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, down, 2, &s, NULL) == LOOM_OK);
    check_counts(&s, 0, (int64_t[]){64, 32}, 2);
    /* ffn_up is F32, but its columns must follow ffn_down's Q4_0 rows: the ffn unit */
    hp.ffn_block = 32;
    loom_tensor *up = tensor(ctx, LOOM_TYPE_F32, 256, 96, "blk.0.ffn_up.weight");
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, up, 2, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){64, 32}, 2);
    /* query groups coarsened to attn_output's blocks, KV heads with them: D 8, 2 heads
     * per group = 16 rows -> 32-row units, KV 16 rows per unit */
    hp.attn_block = 32;
    loom_tensor *wq = tensor(ctx, LOOM_TYPE_F32, 256, 64, "blk.0.attn_q.weight");
    loom_tensor *wk = tensor(ctx, LOOM_TYPE_F32, 256, 32, "blk.0.attn_k.weight");
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wq, 4, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){32, 32, 0, 0}, 4);
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, wk, 4, &s, NULL) == LOOM_OK);
    check_counts(&s, 1, (int64_t[]){16, 16, 0, 0}, 4);
    hp.attn_block = hp.ffn_block = 1;
    /* fused qkv [256, 64 + 2*32]: segments q (2 groups of 16), k and v (2 heads of 8) */
    hp.n_embd = 64;
    loom_tensor *qkv = tensor(ctx, LOOM_TYPE_F32, 64, 128, "blk.0.attn_qkv.weight");
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, qkv, 2, &s, NULL) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, 1);
    LOOM_CHECK_EQ_INT(s.n_segments, 3);
    LOOM_CHECK(s.ne[0][0] == 32 && s.ne[0][1] == 32 && s.ne[1][0] == 16 && s.ne[2][1] == 16);
    LOOM_CHECK_EQ_INT(loom_split_state_total(&s), 128);
    /* a fused tensor of the wrong size is refused, naming it */
    loom_tensor *bad = tensor(ctx, LOOM_TYPE_F32, 64, 100, "blk.1.attn_qkv.weight");
    LOOM_CHECK(loom_rules_split_state(r, &hp, bad, 2, &s, NULL) == LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "blk.1.attn_qkv.weight");
    /* a granularity that does not divide the size is an error naming tensor and rule */
    loom_rules *u = NULL;
    LOOM_REQUIRE(loom_rules_parse("odd 1 7\n", "odd.rules", &u) == LOOM_OK);
    loom_tensor *odd = tensor(ctx, LOOM_TYPE_F32, 8, 20, "odd");
    LOOM_CHECK(loom_rules_split_state(u, &hp, odd, 2, &s, NULL) != LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "odd.rules:1");
    loom_rules_free(u);
    loom_ctx_free(ctx);
    loom_rules_free(r);
}

/* Granularity from the type: a K-quant row splits only in whole 256-element blocks, unevenly
 * and with empty devices where there are fewer blocks than devices (an expert FFN of 512 is
 * two blocks: over 4 devices two are empty); a rule can state its granularity in blocks. */
LOOM_TEST(rules, k_quant_blocks_uneven_and_empty) {
    loom_hparams hp = stories_hp();
    hp.n_embd = 256;
    hp.n_ff = 512;
    loom_rules *r = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &r) == LOOM_OK);
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *down = tensor(ctx, LOOM_TYPE_Q4_K, 512, 256, "blk.0.ffn_down.weight");
    loom_split_state s;
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, down, 4, &s, NULL) == LOOM_OK);
    int64_t blocks = 0, empty = 0;
    for (int j = 0; j < 4; j++) {
        int64_t c = loom_split_state_dev_count(&s, j);
        LOOM_CHECK_MSG(c % 256 == 0, "device %d: %lld elements, not whole blocks", j, (long long)c);
        blocks += c / 256;
        empty += c == 0;
    }
    LOOM_CHECK_EQ_INT(s.axis, 0);
    LOOM_CHECK_EQ_INT(blocks, 2);
    LOOM_CHECK_EQ_INT(empty, 2);
    /* 3 blocks (768) over 2 devices: 2 + 1 */
    loom_tensor *down3 = tensor(ctx, LOOM_TYPE_Q6_K, 768, 256, "blk.1.ffn_down.weight");
    LOOM_REQUIRE(loom_rules_split_state(r, &hp, down3, 2, &s, NULL) == LOOM_OK);
    LOOM_CHECK(loom_split_state_dev_count(&s, 0) + loom_split_state_dev_count(&s, 1) == 768);
    LOOM_CHECK(loom_split_state_dev_count(&s, 0) % 256 == 0 && loom_split_state_dev_count(&s, 1) % 256 == 0);
    LOOM_CHECK(loom_split_state_dev_count(&s, 0) != loom_split_state_dev_count(&s, 1));
    /* "2blocks": Q8_0 rows of 256 move 64 elements at a time; "1block" of Q4_K is 256 */
    loom_rules *u = NULL;
    LOOM_REQUIRE(loom_rules_parse("q8 0 2blocks\nk4 0 1block\n", "blk.rules", &u) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_rules_match(u, "q8")->unit, LOOM_RULE_UNIT_BLOCKS);
    loom_tensor *q8 = tensor(ctx, LOOM_TYPE_Q8_0, 256, 4, "q8");
    LOOM_REQUIRE(loom_rules_split_state(u, &hp, q8, 3, &s, NULL) == LOOM_OK);
    for (int j = 0; j < 3; j++)
        LOOM_CHECK(loom_split_state_dev_count(&s, j) % 64 == 0);
    check_counts(&s, 0, (int64_t[]){128, 64, 64}, 3);
    loom_tensor *k4 = tensor(ctx, LOOM_TYPE_Q4_K, 512, 4, "k4");
    LOOM_REQUIRE(loom_rules_split_state(u, &hp, k4, 3, &s, NULL) == LOOM_OK);
    check_counts(&s, 0, (int64_t[]){256, 256, 0}, 3);
    loom_rules_free(u);
    u = NULL;
    LOOM_CHECK(loom_rules_parse("x 0 2bloks\n", "bad.rules", &u) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "bad.rules:1: bad granularity '2bloks'");
    loom_rules_free(u);
    loom_ctx_free(ctx);
    loom_rules_free(r);
}
