/*
 * The `loom` subcommands as a user runs them (called in-process with argv, stdout and
 * stderr captured): run on the built-in model and on stories260K over sim devices,
 * --logits-out, explain with its summary lines and HTML page, gguf --plan, bench in JSON,
 * and every error as one clear line with the right exit status.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/gguf.h"
#include "loom/model.h"
#include "tests/shim/loom_test.h"
#include "tools/cli.h"

typedef int (*cmd_fn)(int, char **);

/* Runs fn(argv) with stdout/stderr captured into malloc'd strings. */
static int capture(cmd_fn fn, char **argv, char **out, char **err) {
    int argc = 0;
    while (argv[argc])
        argc++;
    fflush(stdout);
    fflush(stderr);
    FILE *fo = tmpfile(), *fe = tmpfile();
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    FILE *fs[2] = {fo, fe};
    char **dst[2] = {out, err};
    for (int k = 0; k < 2; k++) {
        long n = ftell(fs[k]);
        rewind(fs[k]);
        *dst[k] = calloc((size_t)n + 1, 1);
        if (n > 0 && fread(*dst[k], 1, (size_t)n, fs[k]) != (size_t)n) (*dst[k])[0] = 0;
        fclose(fs[k]);
    }
    return rc;
}

static const char *stories(void) {
    static char path[4096];
    if (!loom_test_models_dir()) return NULL;
    snprintf(path, sizeof path, "%s/stories260K.gguf", loom_test_models_dir());
    return path;
}

LOOM_TEST(cli, run_builtin_model_on_sim) {
    char *out, *err;
    char *argv[] = {"run", "--devices", "sim:2", "-n", "8", NULL};
    int rc = capture(loom_cli_run, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "Once upon a time");
    LOOM_CHECK_STR_CONTAINS(out, "prompt graph: graph nodes = ");
    LOOM_CHECK_STR_CONTAINS(out, "token graph:  graph nodes = ");
    LOOM_CHECK_STR_CONTAINS(out, "graph splits = 2");
    LOOM_CHECK_STR_CONTAINS(out, "tokens/s");
    LOOM_CHECK_STR_CONTAINS(out, "allreduces");
    free(out);
    free(err);
}

LOOM_TEST(cli, run_stories_tensor_parallel_and_logits_out) {
    if (!stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[] = "/tmp/loom_logits_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    char *out, *err;
    char *argv[] = {"run",    "-m", (char *)stories(), "--devices", "sim:3", "-n", "30",
                    "--temp", "0",  "--logits-out",    path,        NULL};
    int rc = capture(loom_cli_run, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "Lily");
    /* 5 prompt positions + 29 evaluated generated tokens, each: position then 512 logits */
    FILE *f = fopen(path, "r");
    LOOM_REQUIRE(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    int lines = 0;
    while (getline(&line, &cap, f) > 0) {
        int fields = 0;
        for (char *p = strtok(line, " \n"); p; p = strtok(NULL, " \n"))
            fields++;
        if (!LOOM_CHECK_MSG(fields == 513, "line %d has %d fields", lines, fields)) break;
        lines++;
    }
    free(line);
    fclose(f);
    unlink(path);
    LOOM_CHECK_EQ_INT(lines, 5 + 29);
    free(out);
    free(err);
}

LOOM_TEST(cli, explain_summary_and_html) {
    if (!stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char html[] = "/tmp/loom_explain_XXXXXX";
    int fd = mkstemp(html);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    char *out, *err;
    char *argv[] = {"explain", "-m", (char *)stories(), "--devices", "sim:4", "--html", html, NULL};
    int rc = capture(loom_cli_explain, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "## SPLIT #1: Meta("); /* sim names depend on earlier regs */
    LOOM_CHECK_STR_CONTAINS(out, "SIM3)");
    LOOM_CHECK_STR_CONTAINS(out, "\ngraph nodes = ");
    LOOM_CHECK_STR_CONTAINS(out, "\ngraph splits = 2\n");
    LOOM_CHECK_STR_CONTAINS(out, "\nallreduces = 10\n"); /* 5 layers x 2 */
    LOOM_CHECK_STR_CONTAINS(out, "1.wgt");               /* cause codes are shown */
    LOOM_CHECK_STR_CONTAINS(out, "PARTIAL");
    FILE *f = fopen(html, "r");
    LOOM_REQUIRE(f != NULL);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(html);
    LOOM_CHECK_STR_CONTAINS(buf, "<!doctype html>");
    LOOM_CHECK_STR_CONTAINS(buf, "allreduce");
    LOOM_CHECK(strstr(buf, "http://") == NULL && strstr(buf, "https://") == NULL); /* no network */
    free(out);
    free(err);
}

LOOM_TEST(cli, gguf_plan_and_bench_json) {
    if (!stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {"gguf", (char *)stories(), "--plan", "--devices", "sim:3", NULL};
    int rc = capture(loom_cli_gguf, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "llama.block_count");
    LOOM_CHECK_STR_CONTAINS(out, "AXIS_1 [58,57,57]"); /* blk.0.ffn_up over 3 devices */
    LOOM_CHECK_STR_CONTAINS(out, "builtin:llama");
    free(out);
    free(err);
    char *argv2[] = {"bench",     "-m",        (char *)stories(),
                     "--devices", "cpu;sim:2", "-p",
                     "8",         "-n",        "4",
                     "-r",        "1",         "-o",
                     "json",      NULL};
    rc = capture(loom_cli_bench, argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "\"devices\": \"sim:2\", \"split\": \"tensor\"");
    LOOM_CHECK_STR_CONTAINS(out, "\"allreduce_per_tok\": 10.00");
    LOOM_CHECK_STR_CONTAINS(out, "\"ok\": true");
    free(out);
    free(err);
}

LOOM_TEST(cli, errors_are_one_clear_line) {
    char *out, *err;
    char *a1[] = {"run", "-m", "/nonexistent/model.gguf", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_run, a1, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "/nonexistent/model.gguf");
    free(out);
    free(err);
    char *a2[] = {"run", "--devices", "sim:zero", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_run, a2, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "zero");
    free(out);
    free(err);
    char *a3[] = {"run", "--frobnicate", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_run, a3, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "--frobnicate");
    free(out);
    free(err);
    char rules[] = "/tmp/loom_rules_XXXXXX";
    int fd = mkstemp(rules);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(write(fd, "ok 1\nbad sideways\n", 18) == 18);
    close(fd);
    char *a4[] = {"run", "--devices", "sim:2", "--split-rules", rules, NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_run, a4, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, ":2: unknown split 'sideways'");
    unlink(rules);
    free(out);
    free(err);
    char *a5[] = {"run", "--help", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_run, a5, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "--split-mode");
    free(out);
    free(err);
    char *a6[] = {"gguf", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_gguf, a6, &out, &err), 2);
    free(out);
    free(err);
    char *a7[] = {"explain", "--split-mode", "diagonal", NULL};
    LOOM_CHECK_EQ_INT(capture(loom_cli_explain, a7, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "diagonal");
    free(out);
    free(err);
}

/* A K-quant file: `loom gguf --plan` names the types and shows whole blocks per device
 * (ffn_down's 512 rows are two 256-blocks: over 4 devices two are empty); the same file
 * with one tensor's type id changed to IQ2_XXS still lists, and `loom run` refuses it by
 * tensor, type name and id. */
LOOM_TEST(cli, gguf_quant_types_blocks_and_unsupported) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 256;
    p.n_ff = 512;
    p.n_layer = 1;
    p.n_vocab = 320;
    p.wtype = LOOM_TYPE_Q4_K;
    p.wtype_hi = LOOM_TYPE_Q6_K;
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(&p, &w) == LOOM_OK);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf_writer_free(w);
    char path[] = "/tmp/loom_cli_quant_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(write(fd, data, size) == (ssize_t)size);
    char *out, *err;
    char *argv[] = {"gguf", path, "--plan", "--devices", "sim:4", NULL};
    int rc = capture(loom_cli_gguf, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "Q4_K");
    LOOM_CHECK_STR_CONTAINS(out, "Q6_K");
    LOOM_CHECK_STR_CONTAINS(out, "blocks 1,1,0,0"); /* blk.0.ffn_down */
    free(out);
    free(err);

    const char *name = "blk.0.ffn_up.weight";
    char *at = memmem(data, size, name, strlen(name));
    LOOM_REQUIRE(at != NULL);
    uint32_t nd, t = 16;
    memcpy(&nd, at + strlen(name), 4);
    memcpy(at + strlen(name) + 4 + 8 * nd, &t, 4);
    LOOM_REQUIRE(pwrite(fd, data, size, 0) == (ssize_t)size);
    close(fd);
    char *argv2[] = {"gguf", path, NULL};
    rc = capture(loom_cli_gguf, argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "IQ2_XXS");
    LOOM_CHECK_STR_CONTAINS(out, "general.architecture");
    free(out);
    free(err);
    char *argv3[] = {"run", "-m", path, "-n", "2", NULL};
    rc = capture(loom_cli_run, argv3, &out, &err);
    LOOM_CHECK(rc != 0);
    LOOM_CHECK_STR_CONTAINS(
        err, "tensor 'blk.0.ffn_up.weight' has type IQ2_XXS (16), which loom does not support");
    free(out);
    free(err);
    unlink(path);
    loom_free(data);
}
