/*
 * `loom gguf FILE --plan --devices sim:N` on every architecture case (called in-process,
 * stdout captured): each file is planned with its own built-in table, and the lines that
 * make each architecture's split distinctive are there (sinks with the query heads,
 * phi3's two-segment fused gate/up, a mirrored single KV head, the shared expert, q/k
 * norms and post norms mirrored).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/model/arch_cases.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tools/cli.h"

/* Runs `loom gguf PATH --plan --devices SPEC`, stdout into a malloc'd string. */
static int plan(const char *path, const char *spec, char **out) {
    char *argv[] = {"gguf", (char *)path, "--plan", "--devices", (char *)spec, NULL};
    return loom_test_capture(loom_cli_gguf, argv, out, NULL);
}

/* The line of tensor `name` in the plan contains `want`. */
static void check_line(const char *out, const char *what, const char *name, const char *want) {
    const char *p = strstr(out, name);
    if (!LOOM_CHECK_MSG(p != NULL, "%s: no line for %s", what, name)) return;
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
    LOOM_CHECK_MSG(strstr(line, want) != NULL, "%s: '%s' lacks '%s'", what, line, want);
}

static const struct {
    const char *case_name, *tensor, *want;
} LINES[] = {
    {"gpt-oss", "blk.0.attn_sinks.weight", "AXIS_0 [2,2]"},
    {"gpt-oss", "blk.0.ffn_gate_inp.bias", "MIRRORED"},
    {"phi3", "blk.0.ffn_up.weight", "AXIS_1 [48,48]+[48,48]"},
    {"phi3", "blk.0.attn_qkv.weight", "AXIS_1 [32,32]+[32,32]+[32,32]"},
    {"llama-mqa", "blk.0.attn_k.weight", "MIRRORED"},
    {"llama-mqa", "blk.0.attn_q.weight", "AXIS_1 [32,32]"},
    {"qwen2moe", "blk.0.ffn_up_shexp.weight", "AXIS_1 [32,32]"},
    {"qwen2moe", "blk.0.ffn_gate_inp_shexp.weight", "MIRRORED"},
    {"qwen3", "blk.0.attn_q_norm.weight", "MIRRORED"},
    {"gemma3", "blk.0.post_ffw_norm.weight", "MIRRORED"},
    {"llama31", "rope_freqs.weight", "MIRRORED"},
    {"phi3-longrope", "rope_factors_long.weight", "MIRRORED"},
};

LOOM_TEST(arch_plan, every_architecture_shows_its_table) {
    char dir[] = "/tmp/loom-arch-plan-XXXXXX";
    LOOM_REQUIRE(mkdtemp(dir) != NULL);
    for (int i = 0; i < arch_case_count(); i++) {
        const arch_case *c = arch_case_get(i);
        void *data = NULL;
        size_t size = 0;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, c->name);
        FILE *f = NULL;
        if (!LOOM_CHECK_MSG(arch_case_write(c, &data, &size) == LOOM_OK &&
                                (f = fopen(path, "wb")) && fwrite(data, 1, size, f) == size,
                            "%s: %s", c->name, loom_last_error())) {
            if (f) fclose(f);
            loom_free(data);
            continue;
        }
        fclose(f);
        loom_free(data);
        char *out = NULL;
        int rc = plan(path, "sim:2", &out);
        LOOM_CHECK_MSG(rc == 0, "%s: loom gguf --plan exited %d", c->name, rc);
        char want[64];
        snprintf(want, sizeof want, "builtin:%s", c->p.arch);
        LOOM_CHECK_MSG(strstr(out, want) != NULL, "%s: the plan does not use %s", c->name, want);
        for (size_t k = 0; k < sizeof LINES / sizeof LINES[0]; k++)
            if (strcmp(LINES[k].case_name, c->name) == 0)
                check_line(out, c->name, LINES[k].tensor, LINES[k].want);
        free(out);
        unlink(path);
    }
    rmdir(dir);
}
