#define _GNU_SOURCE
/*
 * Rules files as hostile input (issue 9): a FIFO or a device is refused before it is opened
 * (fopen() used to block on a FIFO and /dev/zero read without end), a file over the size cap
 * or with a NUL byte is refused naming it, an empty file is a table with no rules, a huge
 * granularity or hyperparameters whose split unit overflows give an error naming the rule,
 * loom_rules_prepend reports out-of-memory as a status, and the PCRE2 reason survives a long
 * pattern.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/rules.h"
#include "tests/shim/loom_test.h"

static void tmp_path(char *buf, size_t n, const char *name) {
    const char *d = getenv("TEST_TMPDIR");
    snprintf(buf, n, "%s/%s_%d", d && *d ? d : "/tmp", name, (int)getpid());
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    LOOM_REQUIRE(f != NULL);
    LOOM_CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

LOOM_TEST(rules_hardening, fifo_device_and_directory_refused) {
    char path[4096];
    tmp_path(path, sizeof path, "rules_fifo");
    unlink(path);
    LOOM_REQUIRE(mkfifo(path, 0600) == 0);
    loom_rules *r = (loom_rules *)1;
    LOOM_CHECK(loom_rules_load_file(path, &r) == LOOM_ERR_IO); /* used to block in fopen */
    LOOM_CHECK(r == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "is not a regular file");
    unlink(path);
    LOOM_CHECK(loom_rules_load_file("/dev/zero", &r) == LOOM_ERR_IO); /* used to read forever */
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'/dev/zero' is not a regular file");
    LOOM_CHECK(loom_rules_load_file("/", &r) == LOOM_ERR_IO);
}

LOOM_TEST(rules_hardening, size_cap_nul_and_empty_file) {
    char path[4096];
    tmp_path(path, sizeof path, "rules_big");
    size_t n = (size_t)LOOM_RULES_MAX_FILE + 1;
    char *big = malloc(n);
    LOOM_REQUIRE(big != NULL);
    for (size_t i = 0; i < n; i++)
        big[i] = i % 64 == 63 ? '\n' : '#';
    write_file(path, big, n);
    free(big);
    loom_rules *r = NULL;
    LOOM_CHECK(loom_rules_load_file(path, &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "is 1048577 bytes (a rules file is at most 1048576)");

    /* the rule after the NUL used to be dropped silently */
    static const char nul_text[] = "a 0\nb 1\0c mirrored\n";
    write_file(path, nul_text, sizeof nul_text - 1);
    LOOM_CHECK(loom_rules_load_file(path, &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), ":2: NUL byte at offset 7");
    LOOM_CHECK(r == NULL);

    /* at most LOOM_RULES_MAX_RULES rules (each name is matched against each) */
    char *many = malloc(8 * (LOOM_RULES_MAX_RULES + 1) + 1), *q = many;
    LOOM_REQUIRE(many != NULL);
    for (int i = 0; i <= LOOM_RULES_MAX_RULES; i++)
        q += sprintf(q, "r%04d 0\n", i % 10000);
    LOOM_CHECK(loom_rules_parse(many, "many.rules", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "many.rules:4097: more than 4096 rules");
    many[8 * LOOM_RULES_MAX_RULES] = 0; /* exactly the maximum is fine */
    LOOM_CHECK(loom_rules_parse(many, "many.rules", &r) == LOOM_OK);
    loom_rules_free(r);
    free(many);

    /* an empty file is a table with no rules; prepending it changes nothing */
    write_file(path, "", 0);
    LOOM_REQUIRE(loom_rules_load_file(path, &r) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_rules_count(r), 0);
    loom_rules *base = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &base) == LOOM_OK);
    int n_base = loom_rules_count(base);
    LOOM_CHECK(loom_rules_prepend(base, r) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_rules_count(base), n_base);
    /* and an empty table as the base */
    loom_rules *empty = NULL, *one = NULL;
    LOOM_REQUIRE(loom_rules_parse("", "e", &empty) == LOOM_OK);
    LOOM_REQUIRE(loom_rules_parse("x 1\n", "o", &one) == LOOM_OK);
    LOOM_CHECK(loom_rules_prepend(empty, one) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_rules_count(empty), 1);
    loom_rules_free(empty);
    loom_rules_free(base);
    unlink(path);
}

static int fail_countdown = -1;
static void *fail_malloc(size_t n, void *ud) {
    (void)ud;
    if (fail_countdown == 0) return NULL;
    if (fail_countdown > 0) fail_countdown--;
    return malloc(n);
}
static void *fail_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    return realloc(p, n);
}
static void fail_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

LOOM_TEST(rules_hardening, prepend_out_of_memory_is_a_status) {
    loom_rules *base = NULL, *user = NULL;
    LOOM_REQUIRE(loom_rules_builtin("llama", false, &base) == LOOM_OK);
    LOOM_REQUIRE(loom_rules_parse("a 1\nb mirrored\n", "u", &user) == LOOM_OK);
    int n_base = loom_rules_count(base);
    static const loom_allocator a = {fail_malloc, fail_realloc, fail_free, NULL};
    fail_countdown = 0; /* the next allocation fails (it used to assert) */
    loom_allocator_set(&a);
    loom_status st = loom_rules_prepend(base, user);
    loom_allocator_set(NULL);
    LOOM_CHECK(st == LOOM_ERR_NOMEM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "out of memory");
    LOOM_CHECK_EQ_INT(loom_rules_count(base), n_base);
    const loom_rule *m = loom_rules_match(base, "blk.0.ffn_up.weight");
    LOOM_CHECK(m && strcmp(m->source, "builtin:llama") == 0);
    loom_rules_free(base);
}

LOOM_TEST(rules_hardening, huge_granularity_and_overflowing_unit) {
    loom_rules *r = NULL;
    LOOM_CHECK(loom_rules_parse("a 1 2199023255553\n", "g.rules", &r) ==
               LOOM_ERR_FORMAT); /* 2^41+1 */
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "g.rules:1: bad granularity '2199023255553'");
    LOOM_CHECK(loom_rules_parse("a 1 99999999999999999999\n", "g.rules", &r) == LOOM_ERR_FORMAT);

    /* head_dim * (n_head / n_head_kv) past int64 (hyperparameters from a file) */
    LOOM_REQUIRE(loom_rules_parse("w 1 qgroup\n", "q.rules", &r) == LOOM_OK);
    loom_hparams hp = {0};
    hp.n_head = 16; /* 8 query heads per KV head (one KV head would split heads one by one) */
    hp.n_head_kv = 2;
    hp.head_dim = INT64_MAX / 4;
    hp.attn_block = hp.ffn_block = 1;
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 64);
    loom_set_name(t, "w");
    loom_split_state s;
    LOOM_CHECK(loom_rules_split_state(r, &hp, t, 2, &s, NULL) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'w' (q.rules:1): the split unit overflows");
    loom_rules_free(r);
    /* fused_qkv: n_head * head_dim past int64 (found by tests/fuzz/rules_fuzz.c) */
    LOOM_REQUIRE(loom_rules_parse("w fused_qkv\n", "f.rules", &r) == LOOM_OK);
    hp.head_dim = INT64_MAX;
    hp.n_head = hp.n_head_kv = INT64_MAX;
    LOOM_CHECK(loom_rules_split_state(r, &hp, t, 2, &s, NULL) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "'w' (f.rules:1 fused_qkv): the q/k/v widths overflow");
    loom_rules_free(r);
    loom_ctx_free(ctx);
}

LOOM_TEST(rules_hardening, pcre2_reason_survives_a_long_pattern) {
    size_t n = 3000;
    char *text = malloc(n + 16);
    LOOM_REQUIRE(text != NULL);
    memset(text, 'a', n);
    memcpy(text + n, "( 1\n", 5); /* missing closing parenthesis at the very end */
    loom_rules *r = NULL;
    LOOM_CHECK(loom_rules_parse(text, "long.rules", &r) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "long.rules:1: bad pattern at offset");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "missing closing parenthesis");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "... (cut)");
    free(text);
}
