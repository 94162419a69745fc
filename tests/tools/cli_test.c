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

#include "loom/backend.h"
#include "loom/gguf.h"
#include "loom/model.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tests/tools/stories.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

#define LOOM_CHECK_STR_EQ(a, b) LOOM_CHECK_MSG(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))

LOOM_TEST(cli, run_builtin_model_on_sim) {
    char *out, *err;
    char *argv[] = {"run", "--devices", "sim:2", "-n", "8", NULL};
    int rc = loom_test_capture(loom_cli_run, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "Once upon a time");
    /* the figures are on stderr, as llama.cpp's: stdout is the text */
    LOOM_CHECK_STR_CONTAINS(err, "prompt graph: graph nodes = ");
    LOOM_CHECK_STR_CONTAINS(err, "token graph:  graph nodes = ");
    LOOM_CHECK_STR_CONTAINS(err, "graph splits = 2");
    LOOM_CHECK_STR_CONTAINS(err, "tokens/s");
    LOOM_CHECK_STR_CONTAINS(err, "allreduces");
    LOOM_CHECK_STR_CONTAINS(err, "memory per device (at load):");
    LOOM_CHECK(strstr(out, "graph") == NULL && strstr(out, "tokens/s") == NULL);
    free(out);
    free(err);
}

/* llama.cpp's streams: stdout is the prompt and the generated text and nothing else (so
 * `loom run > out.txt` is the text), every figure is on stderr, and --log-disable leaves
 * stderr empty. */
LOOM_TEST(cli, run_stdout_is_the_text_and_log_disable_silences_the_rest) {
    char *out, *err, *out_q, *err_q;
    char *a[] = {"run", "--devices", "sim:2", "-n", "6", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a, &out, &err), 0);
    char *q[] = {"run", "--devices", "sim:2", "-n", "6", "--temp", "0", "--log-disable", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, q, &out_q, &err_q), 0);
    LOOM_CHECK(strncmp(out, "Once upon a time", 16) == 0);
    LOOM_CHECK_STR_EQ(out_q, out); /* the same text, the figures or not */
    const char *figures[] = {
        "memory per device", "model:",       "sampling:",        "load time:",    "prompt:",
        "generation:",       "graph splits", "tensor parallel:", "random weights"};
    for (size_t k = 0; k < sizeof figures / sizeof figures[0]; k++) {
        LOOM_CHECK_MSG(strstr(out, figures[k]) == NULL, "stdout has '%s': %s", figures[k], out);
        LOOM_CHECK_MSG(strstr(err, figures[k]) != NULL, "stderr lacks '%s': %s", figures[k], err);
    }
    LOOM_CHECK_MSG(err_q[0] == 0, "--log-disable left on stderr: '%s'", err_q);
    /* an error is still printed under --log-disable */
    char *b[] = {"run", "-m", "/nonexistent.gguf", "--log-disable", NULL};
    free(out_q);
    free(err_q);
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, b, &out_q, &err_q), 1);
    LOOM_CHECK_STR_CONTAINS(err_q, "/nonexistent.gguf");
    free(out);
    free(err);
    free(out_q);
    free(err_q);
}

LOOM_TEST(cli, run_stories_tensor_parallel_and_logits_out) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[] = "/tmp/loom_logits_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    char *out, *err;
    char *argv[] = {"run",          "-m",     (char *)loom_test_stories(),
                    "--devices",    "sim:3",  "-n",
                    "30",           "--temp", "0",
                    "--logits-out", path,     NULL};
    int rc = loom_test_capture(loom_cli_run, argv, &out, &err);
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
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char html[] = "/tmp/loom_explain_XXXXXX";
    int fd = mkstemp(html);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    char *out, *err;
    char *argv[] = {"explain", "-m", (char *)loom_test_stories(), "--devices", "sim:4", "--html",
                    html,      NULL};
    loom_registry_reset(); /* the sim regs of earlier commands: device names as in a new process */
    int rc = loom_test_capture(loom_cli_explain, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "## SPLIT #1: Meta(SIM0,SIM1,SIM2,SIM3)");
    LOOM_CHECK_STR_CONTAINS(out, "\ngraph nodes = ");
    LOOM_CHECK_STR_CONTAINS(out, "\ngraph splits = 2\n");
    LOOM_CHECK_STR_CONTAINS(out, "\nallreduces = 10\n"); /* 5 layers x 2 */
    LOOM_CHECK_STR_CONTAINS(out, "1.wgt");               /* cause codes are shown */
    /* and explained, once, in the text too (not only on the page) */
    const char *legend = strstr(out, "\ncause codes:\n");
    LOOM_CHECK(legend != NULL && strstr(legend + 1, "\ncause codes:\n") == NULL);
    LOOM_CHECK_STR_CONTAINS(out, "\n  1.wgtN    pass 1: with its weight source N");
    LOOM_CHECK_STR_CONTAINS(out, "\n  2.gpu-dn  pass 2: ");
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
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {"gguf", (char *)loom_test_stories(), "--plan", "--devices", "sim:3", NULL};
    int rc = loom_test_capture(loom_cli_gguf, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "llama.block_count");
    LOOM_CHECK_STR_CONTAINS(out, "AXIS_1 [58,57,57]"); /* blk.0.ffn_up over 3 devices */
    LOOM_CHECK_STR_CONTAINS(out, "builtin:llama");
    free(out);
    free(err);
    char *argv2[] = {"bench",     "-m",        (char *)loom_test_stories(),
                     "--devices", "cpu;sim:2", "-p",
                     "8",         "-n",        "4",
                     "-r",        "1",         "-o",
                     "json",      NULL};
    rc = loom_test_capture(loom_cli_bench, argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "\"devices\": \"sim:2\", \"n_batch\": ");
    LOOM_CHECK_STR_CONTAINS(out, "\"split_mode\": \"tensor\"");
    LOOM_CHECK_STR_CONTAINS(out, "\"allreduces_per_token\": 10.00"); /* 5 layers x 2, tg row */
    free(out);
    free(err);
}

LOOM_TEST(cli, errors_are_one_clear_line) {
    char *out, *err;
    char *a1[] = {"run", "-m", "/nonexistent/model.gguf", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a1, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "/nonexistent/model.gguf");
    free(out);
    free(err);
    char *a2[] = {"run", "--devices", "sim:zero", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a2, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "zero");
    free(out);
    free(err);
    char *a3[] = {"run", "--frobnicate", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a3, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "--frobnicate");
    free(out);
    free(err);
    char rules[] = "/tmp/loom_rules_XXXXXX";
    int fd = mkstemp(rules);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(write(fd, "ok 1\nbad sideways\n", 18) == 18);
    close(fd);
    char *a4[] = {"run", "--devices", "sim:2", "--split-rules", rules, NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a4, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, ":2: unknown split 'sideways'");
    unlink(rules);
    free(out);
    free(err);
    char *a5[] = {"run", "--help", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a5, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "--split-mode");
    free(out);
    free(err);
    char *a6[] = {"gguf", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, a6, &out, &err), 2);
    free(out);
    free(err);
    char *a7[] = {"explain", "--split-mode", "diagonal", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_explain, a7, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "diagonal");
    free(out);
    free(err);
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* ---------------------------------------------------------------- issue 14: llama.cpp flags */

static char *run_text(char **argv, int want_rc) {
    char *out, *err;
    int rc = loom_test_capture(loom_cli_run, argv, &out, &err);
    LOOM_CHECK_MSG(rc == want_rc, "rc %d (want %d), stderr: %s", rc, want_rc, err);
    free(err);
    return out; /* the prompt and the generated text: the figures are on stderr */
}

LOOM_TEST(cli_flags, sampling_flags_and_seed) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    char *g[] = {"run", "-m", m, "-n", "20", "--temp", "0", NULL};
    char *greedy = run_text(g, 0);
    /* min-p 1 keeps only the top token: hot sampling becomes greedy */
    char *a1[] = {"run", "-m", m, "-n", "20", "--temp", "5", "-s", "3", "--min-p", "1", NULL};
    char *minp = run_text(a1, 0);
    LOOM_CHECK_STR_EQ(minp, greedy);
    char *a2[] = {"run", "-m", m, "-n", "20", "--temp", "5", "-s", "3", "--min-p", "0", NULL};
    char *hot = run_text(a2, 0);
    LOOM_CHECK(strcmp(hot, greedy) != 0);
    /* a strong repetition penalty changes greedy text (it repeats "Lily" otherwise) */
    char *a3[] = {"run", "-m",     m,   "-n", "20", "--repeat-penalty", "100", "--repeat-last-n",
                  "-1",  "--temp", "0", NULL};
    char *pen = run_text(a3, 0);
    LOOM_CHECK(strcmp(pen, greedy) != 0);
    char *a3b[] = {"run", "-m",     m,   "-n", "20", "--repeat-penalty", "100", "--repeat-last-n",
                   "0",   "--temp", "0", NULL};
    char *pen0 = run_text(a3b, 0);
    LOOM_CHECK_STR_EQ(pen0, greedy); /* looking back over 0 tokens: off */
    /* the default seed is random and printed; -s with it repeats the run */
    char *out, *err;
    char *a4[] = {"run", "-m", m, "-n", "16", "--temp", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a4, &out, &err), 0);
    const char *sd = strstr(err, "sampling:   seed ");
    LOOM_REQUIRE(sd != NULL);
    LOOM_CHECK_STR_CONTAINS(sd, "(random; -s repeats it)");
    char seed[32];
    LOOM_REQUIRE(sscanf(sd, "sampling:   seed %31s", seed) == 1);
    char *a5[] = {"run", "-m", m, "-n", "16", "--temp", "1", "--seed", seed, NULL};
    char *again = run_text(a5, 0);
    LOOM_CHECK_STR_EQ(again, out);
    free(out);
    free(err);
    free(greedy);
    free(minp);
    free(hot);
    free(pen);
    free(pen0);
    free(again);
}

LOOM_TEST(cli_flags, n_minus_one_prompt_file_and_batches) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    char *out, *err;
    /* -n -1: until the end of text or of the context (-c 40, 5 prompt tokens) */
    char *a1[] = {"run", "-m", m, "-n", "-1", "-c", "40", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a1, &out, &err), 0);
    int n_gen = -1;
    const char *gp = strstr(err, "generation: ");
    LOOM_REQUIRE(gp != NULL);
    LOOM_CHECK(sscanf(gp, "generation: %d tokens", &n_gen) == 1 && n_gen > 20 && n_gen <= 35);
    free(out);
    free(err);
    /* -f: the prompt from a file */
    char path[] = "/tmp/loom_prompt_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(write(fd, "Once upon a time\n", 17) == 17); /* the newline is dropped */
    close(fd);
    char *a2[] = {"run", "-m", m, "-n", "20", "-f", path, "--temp", "0", NULL};
    char *from_file = run_text(a2, 0);
    char *a3[] = {"run", "-m",         m,     "-n",           "20", "-ub", "2", "-b",
                  "3",   "--ctx-size", "64",  "--batch-size", "3",  "-t",  "1", "-ngl",
                  "-1",  "-fa",        "off", "--temp",       "0",  NULL};
    char *small_batches = run_text(a3, 0);
    char *a4[] = {"run",  "-m",      m,      "-n",   "20",     "-fa", "on",
                  "-ctk", "f16",     "-ctv", "f16",  "-ts",    "1,1", "-mg",
                  "0",    "-no-cnv", "-dev", "none", "--temp", "0",   NULL};
    char *f16 = run_text(a4, 0);
    LOOM_CHECK_STR_CONTAINS(from_file, "Once upon a time, there was a little girl named Lily");
    LOOM_CHECK_STR_EQ(small_batches, from_file);
    LOOM_CHECK_STR_CONTAINS(f16, "Once upon a time, there was a little girl named Lily");
    char *a5[] = {"run", "-m", m, "-f", path, "-p", "x", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a5, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "-p and -f");
    free(out);
    free(err);
    unlink(path);
    free(from_file);
    free(small_batches);
    free(f16);
    /* -fa off builds attention as mul_mat + soft_max: no FLASH_ATTN_EXT node */
    char *e1[] = {"explain", "-m", m, "-fa", "off", NULL};
    char *e2[] = {"explain", "-m", m, NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_explain, e2, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "FLASH_ATTN_EXT");
    free(out);
    free(err);
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_explain, e1, &out, &err), 0);
    LOOM_CHECK(strstr(out, "FLASH_ATTN_EXT") == NULL);
    LOOM_CHECK_STR_CONTAINS(out, "SOFT_MAX");
    free(out);
    free(err);
}

/* -ctk/-ctv with block types (issue 14): q8_0 K and V on stories260K tell the greedy story of
 * the f32 cache; a q8_0 cache cannot be split by heads of 8 values (refused, naming why). */
LOOM_TEST(cli_flags, quantised_kv_cache) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    char *a1[] = {"run", "-m", m, "-n", "20", "-ctk", "q8_0", "-ctv", "q8_0", "--temp", "0", NULL};
    char *q8 = run_text(a1, 0);
    LOOM_CHECK_STR_CONTAINS(q8, "Once upon a time, there was a little girl named Lily");
    free(q8);
    char *a2[] = {"run",  "-m",   m,       "-n",  "8",     "-ctk",   "q8_0", "-ctv",
                  "bf16", "-dev", "sim:2", "-sm", "layer", "--temp", "0",    NULL};
    free(run_text(a2, 0));
    char *a3[] = {"run",  "-m",    m,     "-n",     "8",      "-ctk", "q8_0",
                  "-dev", "sim:2", "-sm", "tensor", "--temp", "0",    NULL};
    char *out, *err;
    LOOM_CHECK(loom_test_capture(loom_cli_run, a3, &out, &err) != 0);
    LOOM_CHECK_STR_CONTAINS(err, "head_dim 8 is not whole blocks");
    free(out);
    free(err);
    /* gguf --plan: the same check before the plan; one device plans q8_0 rows */
    char *g1[] = {"gguf", m, "--plan", "--devices", "sim:2", "-ctk", "q8_0", NULL};
    LOOM_CHECK(loom_test_capture(loom_cli_gguf, g1, &out, &err) != 0);
    LOOM_CHECK_STR_CONTAINS(err, "head_dim 8 is not whole blocks");
    free(out);
    free(err);
    char *g2[] = {"gguf", m, "--plan", "--devices", "sim:1", "-ctk", "q8_0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, g2, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "KV q8_0");
    free(out);
    free(err);
}

/* -ts proportions (issue 14): 3,1 over sim:2 (tensor) and 1,0,1 over sim:3 (layer, an empty
 * device) tell the CPU's greedy story; a -ts with more values than devices is refused. */
LOOM_TEST(cli_flags, uneven_tensor_split) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    char *a1[] = {"run", "-m", m, "-n", "20", "-dev", "sim:2", "-ts", "3,1", "--temp", "0", NULL};
    char *t31 = run_text(a1, 0);
    LOOM_CHECK_STR_CONTAINS(t31, "Once upon a time, there was a little girl named Lily");
    free(t31);
    char *a2[] = {"run", "-m",    m,     "-n",    "20",     "-dev", "sim:3",
                  "-sm", "layer", "-ts", "1,0,1", "--temp", "0",    NULL};
    char *t101 = run_text(a2, 0);
    LOOM_CHECK_STR_CONTAINS(t101, "Once upon a time, there was a little girl named Lily");
    free(t101);
    char *a3[] = {"run", "-m", m, "-n", "4", "-dev", "sim:2", "-ts", "1,1,1", "--temp", "0", NULL};
    char *out, *err;
    LOOM_CHECK(loom_test_capture(loom_cli_run, a3, &out, &err) != 0);
    LOOM_CHECK_STR_CONTAINS(err, "3 proportions for 2 devices");
    free(out);
    free(err);
}

/* Each refusal: exit 2 and a line naming the flag, the value and the reason. */
static void refused(loom_test_cmd_fn fn, char **argv, const char *want) {
    char *out, *err;
    int rc = loom_test_capture(fn, argv, &out, &err);
    LOOM_CHECK_MSG(rc == 2, "%s %s: rc %d, stderr: %s", argv[0], argv[1], rc, err);
    LOOM_CHECK_MSG(strstr(err, want) != NULL, "%s %s: stderr '%s' lacks '%s'", argv[0], argv[1],
                   err, want);
    LOOM_CHECK(strchr(err, '\n') == err + strlen(err) - 1); /* one line */
    free(out);
    free(err);
}

LOOM_TEST(cli_flags, refusals_name_the_reason) {
    char *r1[] = {"run", "-sm", "row", NULL};
    refused(loom_cli_run, r1, "row is llama.cpp's split of matrix rows");
    char *r2[] = {"run", "-ctk", "q4_K", NULL};
    refused(loom_cli_run, r2, "-ctk 'q4_K' is not a cache type (f32, f16, bf16, q8_0");
    char *r3[] = {"run", "-ctv", "f8", NULL};
    refused(loom_cli_run, r3, "-ctv 'f8' is not a cache type");
    char *r4[] = {"run", "-ts", "3,x", NULL};
    refused(loom_cli_run, r4, "-ts '3,x': 'x' is not a proportion");
    char *r4b[] = {"run", "-ts", "0,0", NULL};
    refused(loom_cli_run, r4b, "-ts '0,0' has no positive proportion");
    char *r5[] = {"run", "-mg", "1", NULL};
    refused(loom_cli_run, r5, "-mg 1");
    char *r6[] = {"run", "--temp", "nan", NULL}; /* issue 9 item 18 */
    refused(loom_cli_run, r6, "--temp 'nan'");
    char *r7[] = {"run", "--seed", "abc", NULL};
    refused(loom_cli_run, r7, "--seed 'abc' is not a seed");
    char *r8[] = {"run", "-fa", "maybe", NULL};
    refused(loom_cli_run, r8, "-fa 'maybe'");
    char *r9[] = {"run", "--top-p", "1.5", NULL};
    refused(loom_cli_run, r9, "--top-p '1.5'");
    char *r10[] = {"run", "--tmep", "0.8", NULL};
    refused(loom_cli_run, r10, "unknown option '--tmep' (did you mean --temp?");
    char *r11[] = {"bench", "--repetitons", "3", NULL};
    refused(loom_cli_bench, r11, "did you mean --repetitions?");
    char *r12[] = {"explain", "--ctx-sise", "8", NULL};
    refused(loom_cli_explain, r12, "did you mean --ctx-size?");
    char *r13[] = {"run", "--zzzzzzzzzzzz", NULL};
    refused(loom_cli_run, r13, "unknown option '--zzzzzzzzzzzz' (see loom run --help)");
    char *r14[] = {"bench", "--devices", "", NULL}; /* issue 9 item 18 */
    refused(loom_cli_bench, r14, "empty device spec");
    char *r15[] = {"bench", "--devices", "cpu;;sim:2", NULL};
    refused(loom_cli_bench, r15, "empty device spec");
    char *r16[] = {"bench", "-p", "8-4", NULL};
    refused(loom_cli_bench, r16, "'8-4' is not a value or range");
    char *r17[] = {"bench", "-o", "xml", NULL};
    refused(loom_cli_bench, r17, "-o 'xml'");
    char *r18[] = {"run", "--devices", "", NULL};
    refused(loom_cli_run, r18, "--devices is empty");
    /* llama.cpp's device names become a loom spec */
    char *out, *err;
    char *d1[] = {"run", "-dev", "CUDA0,CUDA1", "-n", "1", NULL};
    int rc = loom_test_capture(loom_cli_run, d1, &out, &err);
    if (rc != 0) LOOM_CHECK_STR_CONTAINS(err, "cuda"); /* no CUDA here: the error names it */
    free(out);
    free(err);
}

/* --no-mmap reads the weights instead of using them in place from the mapped file: the
 * load line says so, and the greedy text is the same. */
LOOM_TEST(cli_flags, no_mmap_reads_the_weights_and_changes_no_token) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out[2], *err[2];
    for (int k = 0; k < 2; k++) {
        char *argv[] = {"run", "-m",     (char *)loom_test_stories(), "-n", "16", "--temp", "0",
                        k ? "--no-mmap" : "-t", k ? NULL : "1", NULL};
        int rc = loom_test_capture(loom_cli_run, argv, &out[k], &err[k]);
        LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err[k]);
    }
    LOOM_CHECK_STR_CONTAINS(err[0], "1.17 MB used in place from the mapped file");
    LOOM_CHECK_STR_CONTAINS(err[1], "0.00 MB used in place from the mapped file");
    LOOM_CHECK_STR_EQ(out[0], out[1]); /* the generated text: the whole output */
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(err[k]);
    }
}

LOOM_TEST(cli_flags, help_lists_every_flag_and_verbose_restores_the_log_level) {
    static const char *const run_flags[] = {"-m,",
                                            "-p,",
                                            "-f,",
                                            "-n,",
                                            "-c,",
                                            "--ctx-size",
                                            "-b,",
                                            "--batch-size",
                                            "-ub,",
                                            "--ubatch-size",
                                            "-t,",
                                            "--threads",
                                            "-ngl",
                                            "-sm,",
                                            "-ts,",
                                            "--tensor-split",
                                            "-mg,",
                                            "--main-gpu",
                                            "-dev,",
                                            "-fa,",
                                            "-ctk,",
                                            "-ctv,",
                                            "-s,",
                                            "--seed",
                                            "--temp",
                                            "--top-k",
                                            "--top-p",
                                            "--min-p",
                                            "--repeat-penalty",
                                            "--repeat-last-n",
                                            "--verbose",
                                            "-no-cnv",
                                            "--logits-out",
                                            "--no-mmap",
                                            "--ignore-eos",
                                            "-r,",
                                            "--reverse-prompt",
                                            "-sp,",
                                            "-e,",
                                            "--no-escape",
                                            "--no-display-prompt",
                                            "--presence-penalty",
                                            "--frequency-penalty",
                                            "--mlock",
                                            "--log-disable",
                                            "--no-warmup",
                                            NULL};
    char *out, *err;
    char *h[] = {"run", "--help", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, h, &out, &err), 0);
    for (const char *const *f = run_flags; *f; f++)
        LOOM_CHECK_MSG(strstr(out, *f) != NULL, "run --help lacks %s", *f);
    free(out);
    free(err);
    static const char *const bench_flags[] = {"-p,", "-n,", "-pg",  "-d,", "-r,",  "-o,", "jsonl",
                                              "sql", "-m,", "-sm,", "-t,", "-ngl", NULL};
    char *hb[] = {"bench", "--help", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, hb, &out, &err), 0);
    for (const char *const *f = bench_flags; *f; f++)
        LOOM_CHECK_MSG(strstr(out, *f) != NULL, "bench --help lacks %s", *f);
    free(out);
    free(err);
    loom_log_level before = loom_log_get_level();
    char *v[] = {"run", "--verbose", "-n", "2", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, v, &out, &err), 0);
    LOOM_CHECK_EQ_INT((int)loom_log_get_level(), (int)before);
    free(out);
    free(err);
}

/* ---------------------------------------------------------------- memory, paths, errors */

LOOM_TEST(cli_memory, run_report_matches_the_plan_of_gguf) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *a[] = {"run",       "-m",    (char *)loom_test_stories(),
                 "--devices", "sim:2", "-n",
                 "2",         "-c",    "256",
                 "--temp",    "0",     NULL};
    loom_registry_reset(); /* the sim regs of earlier commands: device names as in a new process */
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a, &out, &err), 0);
    /* KV: 5 layers x (K + V) x 256 positions x (n_head_kv * head_dim = 4 * 8) x f16 (the default,
     * as llama.cpp's), half each */
    char kv[32];
    loom_cli_format_bytes(kv, sizeof kv, 5.0 * 2 * 256 * 32 * 2 / 2);
    LOOM_CHECK_STR_CONTAINS(err, "memory per device (at load):");
    LOOM_CHECK_STR_CONTAINS(err, "weights    KV cache     compute       total        free");
    LOOM_CHECK_STR_CONTAINS(err, kv);
    /* one table row each (the table pads the names) */
    LOOM_CHECK_EQ_INT(count(err, "SIM0  "), 1);
    LOOM_CHECK_EQ_INT(count(err, "SIM1  "), 1);
    LOOM_CHECK_STR_CONTAINS(err, "\n  host ");
    free(out);
    free(err);
    char *g[] = {"gguf", (char *)loom_test_stories(), "--plan", "--devices", "sim:2", "-c", "256",
                 NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, g, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "planned memory per device");
    LOOM_CHECK_STR_CONTAINS(out, kv);
    free(out);
    free(err);
    /* a plan that does not fit is refused, naming the device and both numbers */
    char *g2[] = {"gguf",           (char *)loom_test_stories(),
                  "--plan",         "--devices",
                  "sim:2,mem=1MiB", "-c",
                  "100000",         NULL};
    loom_registry_reset();
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, g2, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "the plan does not fit ");
    LOOM_CHECK_STR_CONTAINS(err, "SIM0: 31.0 MiB planned"); /* 30 MiB of f16 KV per device */
    LOOM_CHECK_STR_CONTAINS(err, "MiB planned (weights + KV cache), 1.0 MiB free");
    free(out);
    free(err);
    /* issue 9 item 18: more devices than a plan covers is refused, not truncated */
    char *g3[] = {"gguf", (char *)loom_test_stories(), "--plan", "--devices", "sim:17", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, g3, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "gives 17 devices; a tensor-parallel plan covers 1..16");
    free(out);
    free(err);
}

/* gguf's model options go through the shared parser: the values and errors of loom run's;
 * a shared option gguf does not take is an unknown one. */
LOOM_TEST(cli_gguf, bad_options_refused_as_loom_run_refuses_them) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    struct {
        char *argv[8];
        const char *want;
    } bad[] = {
        {{"gguf", m, "--plan", "-c", "-1", NULL},
         "loom gguf: -c needs an integer in 0..16777216 (got '-1')"},
        {{"gguf", m, "--plan", "-ctk", "q9_9", NULL},
         "loom gguf: -ctk 'q9_9' is not a cache type (f32, f16"},
        {{"gguf", m, "--plan", "--devices", "", NULL}, "loom gguf: --devices is empty (cpu, sim:N"},
        {{"gguf", m, "--plan", "-c", NULL},
         "loom gguf: -c needs a value (an integer in 0..16777216)"},
        {{"gguf", m, "--plan", "-ctv", "f16", NULL}, "loom gguf: unknown option '-ctv'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out, *err;
        LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, bad[i].argv, &out, &err), 2);
        LOOM_CHECK_STR_CONTAINS(err, bad[i].want);
        free(out);
        free(err);
    }
}

LOOM_TEST(cli_paths, bazel_run_resolves_against_the_working_directory) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char dir[] = "/tmp/loom_bwd_XXXXXX";
    LOOM_REQUIRE(mkdtemp(dir) != NULL);
    char link[4200], logits[4200], html[4200];
    snprintf(link, sizeof link, "%s/model.gguf", dir);
    LOOM_REQUIRE(symlink(loom_test_stories(), link) == 0);
    setenv("BUILD_WORKING_DIRECTORY", dir, 1);
    char *out, *err;
    char *a[] = {"run", "-m", "model.gguf", "-n", "3", "--logits-out", "logits.txt", NULL};
    int rc = loom_test_capture(loom_cli_run, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    free(out);
    free(err);
    char *e[] = {"explain", "-m", "model.gguf", "-q", "--html", "page.html", NULL};
    rc = loom_test_capture(loom_cli_explain, e, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    free(out);
    free(err);
    unsetenv("BUILD_WORKING_DIRECTORY");
    snprintf(logits, sizeof logits, "%s/logits.txt", dir);
    snprintf(html, sizeof html, "%s/page.html", dir);
    LOOM_CHECK(access(logits, R_OK) == 0);
    LOOM_CHECK(access(html, R_OK) == 0);
    unlink(logits);
    unlink(html);
    unlink(link);
    rmdir(dir);
}

LOOM_TEST(cli_errors, logits_out_to_a_full_device_fails) {
    char *out, *err;
    char *a[] = {"run", "-n", "4", "--logits-out", "/dev/full", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "cannot write '/dev/full'");
    free(out);
    free(err);
}

LOOM_TEST(cli_errors, gguf_escapes_control_characters) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    LOOM_REQUIRE(w != NULL);
    LOOM_REQUIRE(loom_gguf_set_str(w, "general.name", "evil\x1b[2J\r\nname\x07") == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_set_str(w, "key\x1b]0;title\x07", "v") == LOOM_OK);
    char path[] = "/tmp/loom_esc_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    LOOM_REQUIRE(loom_gguf_write_file(w, path) == LOOM_OK);
    loom_gguf_writer_free(w);
    char *out, *err;
    char *a[] = {"gguf", path, NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, a, &out, &err), 0);
    LOOM_CHECK(strchr(out, '\x1b') == NULL && strchr(out, '\r') == NULL &&
               strchr(out, '\x07') == NULL);
    LOOM_CHECK_STR_CONTAINS(out, "evil\\x1b[2J\\r\\nname\\x07");
    LOOM_CHECK_STR_CONTAINS(out, "key\\x1b]0;title\\x07");
    free(out);
    free(err);
    unlink(path);
}

/* ---------------------------------------------------------------- bench */

LOOM_TEST(cli_bench, markdown_golden_rows_and_single_device_once) {
    char *out, *err;
    char *a[] = {"bench", "--devices", "cpu;sim:2", "-sm", "layer,tensor", "-p", "4-8+4", "-n",
                 "2",     "-pg",       "4,2",       "-d",  "0,3",          "-r", "2",     NULL};
    int rc = loom_test_capture(loom_cli_bench, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    /* llama-bench's columns, then loom's */
    LOOM_CHECK(
        strncmp(out,
                "| model | size | params | backend | devices | threads | ngl | sm | test | t/s | "
                "allreduces/tok | bytes/tok | nvlink us/tok | pcie4 us/tok |\n| --- |",
                120) == 0);
    /* tests per config: pp4, pp8, tg2, pp4+tg2 at depths 0 and 3 = 8; configs: cpu once
     * (one device: not per split mode), sim:2 layer, sim:2 tensor = 3 */
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 24);
    LOOM_CHECK_EQ_INT(count(out, "| cpu |"), 8);
    LOOM_CHECK_EQ_INT(count(out, "| sim:2 | all | -1 | tensor |"), 8);
    LOOM_CHECK_STR_CONTAINS(out, "| tg2 @ d3 |");
    LOOM_CHECK_STR_CONTAINS(out, "| pp4+tg2 |");
    LOOM_CHECK_STR_CONTAINS(out, "| pp8 @ d3 |");
    LOOM_CHECK_STR_CONTAINS(out, " ± ");
    free(out);
    free(err);
    /* a failed configuration: its own line on stderr, the table stays whole, exit 1 */
    char *b[] = {"bench", "--devices", "sim:2;sim:zero", "-p", "4", "-n", "0", "-r", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, b, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "loom bench: FAILED built-in | sim:zero");
    for (const char *p = out; *p; p = strchr(p, '\n') + 1)
        LOOM_CHECK(*p == '|');
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 1);
    free(out);
    free(err);
}

/* -ts takes llama-bench's list (';' between splits, '/' or ',' between proportions): a
 * configuration per split, its ts in the md column and the tensor_split field; each row
 * runs its own split (a split with more proportions than devices fails only its row); a
 * one-device spec runs once; a value that does not parse is refused before any run. */
LOOM_TEST(cli_bench, tensor_split_list_one_row_per_split) {
    char *out, *err;
    char *a[] = {"bench", "--devices", "cpu;sim:2", "-sm", "tensor", "-ts", "1/1;3,1",
                 "-p",    "4",         "-n",        "0",   "-r",     "1",   NULL};
    int rc = loom_test_capture(loom_cli_bench, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "| ngl | sm | ts | test | t/s |");
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 3);
    LOOM_CHECK_EQ_INT(count(out, "| sim:2 | all | -1 | tensor | 1.00/1.00 | pp4 |"), 1);
    LOOM_CHECK_EQ_INT(count(out, "| sim:2 | all | -1 | tensor | 3.00/1.00 | pp4 |"), 1);
    LOOM_CHECK_EQ_INT(count(out, "| cpu |"), 1);
    /* the one-device row ran once, with no split: llama-bench's ts for none, not the first
     * -ts value */
    LOOM_CHECK_EQ_INT(count(out, "| cpu | all | -1 | none | 0.00 | pp4 |"), 1);
    free(out);
    free(err);
    char *j[] = {"bench", "--devices", "sim:2", "-ts", "1/1;3/1", "-p",   "4",
                 "-n",    "0",         "-r",    "1",   "-o",      "json", NULL};
    rc = loom_test_capture(loom_cli_bench, j, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_EQ_INT(count(out, "\"tensor_split\": "), 2);
    LOOM_CHECK_EQ_INT(count(out, "\"tensor_split\": \"1.00/1.00\""), 1);
    LOOM_CHECK_EQ_INT(count(out, "\"tensor_split\": \"3.00/1.00\""), 1);
    free(out);
    free(err);
    char *c[] = {"bench", "--devices", "sim:2", "-ts", "3,1", "-p",  "4",
                 "-n",    "0",         "-r",    "1",   "-o",  "csv", NULL};
    rc = loom_test_capture(loom_cli_bench, c, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, ",\"3.00/1.00\",");
    free(out);
    free(err);
    /* three proportions over two devices: that row fails, the other stays, exit 1 */
    char *b[] = {"bench", "--devices", "sim:2", "-ts", "1/1;1/1/1", "-p",
                 "4",     "-n",        "0",     "-r",  "1",         NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, b, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "loom bench: FAILED built-in | sim:2 | default | ts "
                                 "1.00/1.00/1.00 | t all | ngl -1 | b 2048 | ub 512 | ctk f16 | "
                                 "ctv f16 | fa -1 | nkvo 0 | mmap 1: session: tensor_split has 3 "
                                 "proportions for 2 devices");
    for (const char *p = out; *p; p = strchr(p, '\n') + 1)
        LOOM_CHECK(*p == '|');
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 1);
    LOOM_CHECK_EQ_INT(count(out, "| 1.00/1.00 | pp4 |"), 1);
    free(out);
    free(err);
    char *r1[] = {"bench", "--devices", "sim:2", "-ts", "1/1;x", NULL};
    refused(loom_cli_bench, r1, "loom bench: -ts 'x': 'x' is not a proportion");
    char *r2[] = {"bench", "--devices", "sim:2", "-ts", "1/1;;2", NULL};
    refused(loom_cli_bench, r2, "loom bench: -ts '1/1;;2' has an empty split");
    char *r3[] = {"bench", "--devices", "sim:2", "-ts", "0/0", NULL};
    refused(loom_cli_bench, r3, "loom bench: -ts '0/0' has no positive proportion");
}

/* llama-bench's per-run lists: every combination of -fa, -ctk, -ctv, -b, -ub, -nkvo and -mmp
 * is a configuration, with a column for each list given; the JSON says what each row ran. */
LOOM_TEST(cli_bench, flash_attn_cache_type_batch_nkvo_and_mmap_lists) {
    char *out, *err;
    char *a[] = {"bench", "-fa", "0,1", "-ub", "2,4", "-p", "4", "-n", "0", "-r", "1", NULL};
    int rc = loom_test_capture(loom_cli_bench, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "| sm | n_ubatch | fa | test | t/s |");
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 4);
    LOOM_CHECK_EQ_INT(count(out, "| none | 2 | 0 | pp4 |"), 1);
    LOOM_CHECK_EQ_INT(count(out, "| none | 2 | 1 | pp4 |"), 1);
    LOOM_CHECK_EQ_INT(count(out, "| none | 4 | 0 | pp4 |"), 1);
    LOOM_CHECK_EQ_INT(count(out, "| none | 4 | 1 | pp4 |"), 1);
    free(out);
    free(err);
    char *j[] = {"bench", "-ctk", "f16,q8_0", "-ctv", "q8_0", "-nkvo", "0,1", "-mmp", "0",    "-b",
                 "8",     "-p",   "4",        "-n",   "0",    "-r",    "1",   "-o",   "json", NULL};
    rc = loom_test_capture(loom_cli_bench, j, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_EQ_INT(count(out, "\"type_k\": \"f16\""), 2);
    LOOM_CHECK_EQ_INT(count(out, "\"type_k\": \"q8_0\""), 2);
    LOOM_CHECK_EQ_INT(count(out, "\"type_v\": \"q8_0\""), 4);
    LOOM_CHECK_EQ_INT(count(out, "\"no_kv_offload\": true"), 2);
    LOOM_CHECK_EQ_INT(count(out, "\"no_kv_offload\": false"), 2);
    LOOM_CHECK_EQ_INT(count(out, "\"use_mmap\": false"), 4);
    LOOM_CHECK_EQ_INT(count(out, "\"n_batch\": 8"), 4);
    free(out);
    free(err);
    char *e0[] = {"bench", "-embd", "0", "-nkvo", "-p", "4", "-n", "0", "-r", "1", NULL};
    rc = loom_test_capture(loom_cli_bench, e0, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "| nkvo | test |");
    LOOM_CHECK_EQ_INT(count(out, "| none | 1 | pp4 |"), 1);
    free(out);
    free(err);
    char *r1[] = {"bench", "-fa", "0,2", NULL};
    refused(loom_cli_bench, r1, "loom bench: -fa '0,2': '2' is not 0, 1, on, off or auto");
    char *r2[] = {"bench", "-ctk", "f16,q9", NULL};
    refused(loom_cli_bench, r2, "loom bench: -ctk 'q9' is not a cache type");
    char *r3[] = {"bench", "-embd", "1", NULL};
    refused(loom_cli_bench, r3, "loom bench: -embd 1: loom has no embeddings-only benchmark");
    char *r4[] = {"bench", "-mmp", "yes", NULL};
    refused(loom_cli_bench, r4, "loom bench: -mmp 'yes': 'yes' is not 0 or 1");
}

LOOM_TEST(cli_bench, json_jsonl_csv_sql_use_llama_bench_field_names) {
    /* llama-bench's field names (its JSON/CSV/SQL printers) for the concepts loom shares */
    static const char *const fields[] = {
        "model_filename", "model_type", "model_size", "model_n_params", "backends",
        "n_batch",        "n_ubatch",   "n_threads",  "type_k",         "type_v",
        "n_gpu_layers",   "split_mode", "main_gpu",   "no_kv_offload",  "flash_attn",
        "tensor_split",   "n_prompt",   "n_gen",      "n_depth",        "test_time",
        "avg_ns",         "stddev_ns",  "avg_ts",     "stddev_ts",      NULL};
    static const char *const loom_fields[] = {
        "allreduces_per_token",    "bytes_reduced_per_token", "proj_nvlink_us_per_token",
        "proj_pcie4_us_per_token", "subgraphs_per_token",     "host_us_per_subgraph",
        "host_us_per_reduction",   "host_us_per_token",       NULL};
    char *out, *err;
    char *j[] = {"bench", "--devices", "sim:2", "-p", "4",    "-n",
                 "2",     "-r",        "2",     "-o", "json", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, j, &out, &err), 0);
    LOOM_CHECK(out[0] == '[' && strstr(out, "}\n]\n") != NULL);
    for (const char *const *f = fields; *f; f++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\": ", *f);
        LOOM_CHECK_MSG(count(out, key) == 2, "json: %s", *f);
    }
    for (const char *const *f = loom_fields; *f; f++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\": ", *f);
        LOOM_CHECK_MSG(count(out, key) == 2, "json: %s", *f);
    }
    LOOM_CHECK_EQ_INT(count(out, "\"samples_ts\": ["), 2);
    /* the tg row of the tensor split measures its host cost; the pp row has none */
    const char *tg = strstr(out, "\"n_gen\": 2");
    LOOM_REQUIRE(tg != NULL);
    const char *sub = strstr(tg, "\"subgraphs_per_token\": "),
               *hu = strstr(tg, "\"host_us_per_token\": ");
    LOOM_REQUIRE(sub && hu);
    LOOM_CHECK(atof(sub + strlen("\"subgraphs_per_token\": ")) >= 2);
    LOOM_CHECK(atof(hu + strlen("\"host_us_per_token\": ")) > 0);
    LOOM_CHECK_STR_CONTAINS(out, "\"subgraphs_per_token\": 0.000");
    LOOM_CHECK_STR_CONTAINS(out, "\"n_prompt\": 0, \"n_gen\": 2, \"n_depth\": 0");
    free(out);
    free(err);
    char *l[] = {"bench", "-p", "4", "-n", "2", "-r", "1", "-o", "jsonl", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, l, &out, &err), 0);
    LOOM_CHECK_EQ_INT(count(out, "\n"), 2);
    LOOM_CHECK_EQ_INT(count(out, "{\"model_filename\": "), 2);
    free(out);
    free(err);
    char *c[] = {"bench", "-p", "4", "-n", "0", "-r", "1", "-o", "csv", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, c, &out, &err), 0);
    for (const char *const *f = fields; *f; f++) {
        const char *h = strstr(out, *f), *nl = strchr(out, '\n');
        LOOM_CHECK_MSG(h && h < nl, "csv header: %s", *f);
    }
    LOOM_CHECK_EQ_INT(count(out, "\n"), 2);
    free(out);
    free(err);
    char *q[] = {"bench", "-p", "4", "-n", "0", "-r", "1", "-o", "sql", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, q, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out,
                            "CREATE TABLE IF NOT EXISTS llama_bench (\n  model_filename TEXT,");
    LOOM_CHECK_STR_CONTAINS(out,
                            "INSERT INTO llama_bench (model_filename, model_type, model_size, ");
    LOOM_CHECK_STR_CONTAINS(out, "VALUES ('built-in', 'llama ");
    free(out);
    free(err);
}

/* ---------------------------------------------------------------- explain --html */

LOOM_TEST(cli_explain, html_page_lanes_memory_timeline_legend_two_batches) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char html[] = "/tmp/loom_page_XXXXXX";
    int fd = mkstemp(html);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    char *out, *err;
    /* 4 KV heads over 8 devices: every layer leaves 4 devices without attention heads */
    char *a[] = {"explain",   "-m",    (char *)loom_test_stories(),
                 "--devices", "sim:8", "--batch",
                 "1,32",      "-q",    "--html",
                 html,        NULL};
    int rc = loom_test_capture(loom_cli_explain, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_EQ_INT(count(out, "\ngraph nodes = "), 2); /* both batches explained */
    LOOM_CHECK_STR_CONTAINS(out, "memory per device");
    FILE *f = fopen(html, "r");
    LOOM_REQUIRE(f != NULL);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(html);
    /* (a) header */
    LOOM_CHECK_STR_CONTAINS(buf, "stories260K.gguf (llama, 5 layers, 8 heads / 4 KV heads");
    LOOM_CHECK_STR_CONTAINS(buf, "<td>split mode</td><td>tensor</td>");
    LOOM_CHECK_STR_CONTAINS(buf, "1 token: ");
    LOOM_CHECK_STR_CONTAINS(buf, "32 tokens: ");
    /* (b) every device, and the idle ones: a layer's K weight on 4 of 8 devices */
    LOOM_CHECK_EQ_INT(count(buf, "\", \"color\": \"#"), 8); /* the devices array */
    LOOM_CHECK_STR_CONTAINS(
        buf, "{\"name\": \"blk.0.attn_k.weight\", \"unit\": \"heads\", \"layers\": 1, "
             "\"per_dev\": [1, 1, 1, 1, 0, 0, 0, 0]}");
    /* (c) memory per device: 8 devices + host */
    LOOM_CHECK_EQ_INT(count(buf, "\"weights\": "), 9);
    /* (d) timelines of both batches with AllReduces and their projections */
    LOOM_CHECK_STR_CONTAINS(buf, "id=\"timeline0\"");
    LOOM_CHECK_STR_CONTAINS(buf, "id=\"timeline1\"");
    LOOM_CHECK_EQ_INT(count(buf, "{\"kind\": \"allreduce\""), 20); /* 10 per batch */
    LOOM_CHECK_STR_CONTAINS(buf, "\"nvlink_us\": ");
    LOOM_CHECK_STR_CONTAINS(buf, "\"pcie4_us\": ");
    /* (e) splits with their input copies, (f) every cause code */
    LOOM_CHECK_STR_CONTAINS(buf, "input copies:");
    static const char *const codes[] = {"usr",   "1.dst",    "1.vsrc",   "1.inp",    "1.wgtN",
                                        "1.off", "2.gpu-dn", "2.gpu-up", "2.any-dn", "2.any-up",
                                        "3.upg", "3.best",   "4.vsrc",   "4.cur",    "4.sup",
                                        "4.cpy", NULL};
    for (const char *const *c = codes; *c; c++) {
        char cell[48];
        snprintf(cell, sizeof cell, "<tr><td><code>%s</code></td>", *c);
        LOOM_CHECK_MSG(strstr(buf, cell) != NULL, "legend lacks %s", *c);
    }
    /* (g) side by side */
    LOOM_CHECK_EQ_INT(count(buf, "<div class=\"col\"><h3>batch "), 2);
    LOOM_CHECK(strstr(buf, "http://") == NULL && strstr(buf, "https://") == NULL);
    free(out);
    free(err);
}

/* A llama of 1 layer (n_embd 8, 2 heads) whose vocabulary has 3 tokens, written here. */
static bool write_vocab3_model(const char *path) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    if (!w) return false;
    loom_status st = LOOM_OK;
    const int64_t E = 8, F = 16, V = 3;
    st = st ? st : loom_gguf_set_str(w, "general.architecture", "llama");
    st = st ? st : loom_gguf_set_u32(w, "llama.context_length", 64);
    st = st ? st : loom_gguf_set_u32(w, "llama.embedding_length", (uint32_t)E);
    st = st ? st : loom_gguf_set_u32(w, "llama.feed_forward_length", (uint32_t)F);
    st = st ? st : loom_gguf_set_u32(w, "llama.block_count", 1);
    st = st ? st : loom_gguf_set_u32(w, "llama.attention.head_count", 2);
    st = st ? st : loom_gguf_set_u32(w, "llama.attention.head_count_kv", 2);
    st = st ? st : loom_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const char *const toks[3] = {"<unk>", "<s>", "</s>"};
    const float scores[3] = {0, 0, 0};
    const int32_t types[3] = {2, 3, 3};
    st = st ? st : loom_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    st = st ? st : loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    st = st ? st : loom_gguf_set_arr(w, "tokenizer.ggml.scores", LOOM_GGUF_FLOAT32, scores, 3);
    st = st ? st : loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, types, 3);
    st = st ? st : loom_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    st = st ? st : loom_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    static float data[16 * 16];
    for (int i = 0; i < 16 * 16; i++)
        data[i] = 0.01f * (float)((i * 7) % 13) - 0.05f;
    static float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f;
    struct {
        const char *name;
        int nd;
        int64_t ne0, ne1;
    } ts[] = {{"token_embd.weight", 2, E, V},     {"output_norm.weight", 1, E, 1},
              {"output.weight", 2, E, V},         {"blk.0.attn_norm.weight", 1, E, 1},
              {"blk.0.attn_q.weight", 2, E, E},   {"blk.0.attn_k.weight", 2, E, E},
              {"blk.0.attn_v.weight", 2, E, E},   {"blk.0.attn_output.weight", 2, E, E},
              {"blk.0.ffn_norm.weight", 1, E, 1}, {"blk.0.ffn_gate.weight", 2, E, F},
              {"blk.0.ffn_up.weight", 2, E, F},   {"blk.0.ffn_down.weight", 2, F, E}};
    for (size_t i = 0; !st && i < sizeof ts / sizeof ts[0]; i++) {
        int64_t ne[2] = {ts[i].ne0, ts[i].ne1};
        st = loom_gguf_add_tensor(w, ts[i].name, LOOM_TYPE_F32, ts[i].nd, ne,
                                  ts[i].nd == 1 ? ones : data);
    }
    st = st ? st : loom_gguf_write_file(w, path);
    loom_gguf_writer_free(w);
    return st == LOOM_OK;
}

/* Issue 9 item 13: bench on a vocabulary of 3 tokens divided by V - 3 = 0 (SIGFPE). */
LOOM_TEST(cli_bench, vocabulary_of_three_tokens) {
    char path[] = "/tmp/loom_vocab3_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    LOOM_REQUIRE(write_vocab3_model(path));
    char *out, *err;
    char *a[] = {"bench", "-m", path, "-p", "4", "-n", "3", "-r", "1", "-o", "jsonl", NULL};
    int rc = loom_test_capture(loom_cli_bench, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_EQ_INT(count(out, "\"model_type\": \"llama "), 2);
    free(out);
    free(err);
    unlink(path);
}

/* README's second example: stories260K over sim:4, greedy, tells this story. */
LOOM_TEST(cli, readme_stories_example) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *a[] = {"run", "-m", (char *)loom_test_stories(), "--devices", "sim:4", "--temp",
                 "0",   NULL};
    char *text = run_text(a, 0);
    LOOM_CHECK_STR_CONTAINS(
        text, "Once upon a time, there was a little girl named Lily. She loved to play "
              "outside in the park. One day, she saw a big, red ball. She wanted to play "
              "with it, but it was too high.");
    free(text);
}

LOOM_TEST(cli_flags, demo_and_devices_name_the_nearest_flag) {
    char *d[] = {"demo", "--layres", "2", NULL};
    refused(loom_cli_demo, d, "unknown option '--layres' (did you mean --layers?");
    char *v[] = {"devices", "--devcies", "sim:2", NULL};
    refused(loom_cli_devices, v, "unknown option '--devcies' (did you mean --devices?");
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
    int rc = loom_test_capture(loom_cli_gguf, argv, &out, &err);
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
    rc = loom_test_capture(loom_cli_gguf, argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "IQ2_XXS");
    LOOM_CHECK_STR_CONTAINS(out, "general.architecture");
    free(out);
    free(err);
    char *argv3[] = {"run", "-m", path, "-n", "2", "--temp", "0", NULL};
    rc = loom_test_capture(loom_cli_run, argv3, &out, &err);
    LOOM_CHECK(rc != 0);
    LOOM_CHECK_STR_CONTAINS(
        err, "tensor 'blk.0.ffn_up.weight' has type IQ2_XXS (16), which loom does not support");
    free(out);
    free(err);
    unlink(path);
    loom_free(data);
}

/* ---------------------------------------------------------------- llama-cli's output flags */

/* A copy of stories260K whose tokenizer.ggml.eos_token_id is `eos` (the u32 after the key
 * patched in place), written under $TEST_TMPDIR; its path in buf, or NULL. */
static const char *stories_with_eos(uint32_t eos, char *buf, size_t cap) {
    size_t n;
    FILE *f = fopen(loom_test_stories(), "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(n);
    bool ok = data && fread(data, 1, n, f) == n;
    fclose(f);
    const char key[] = "tokenizer.ggml.eos_token_id";
    char *at = ok ? memmem(data, n, key, sizeof key - 1) : NULL;
    uint32_t ty = 0;
    if (at) memcpy(&ty, at + sizeof key - 1, 4);
    ok = at && ty == 4 /* GGUF u32 */;
    if (ok) memcpy(at + sizeof key - 1 + 4, &eos, 4);
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(buf, cap, "%s/stories_eos_%u.gguf", dir ? dir : "/tmp", eos);
    FILE *o = ok ? fopen(buf, "wb") : NULL;
    ok = o && fwrite(data, 1, n, o) == n;
    if (o) ok = fclose(o) == 0 && ok;
    free(data);
    return ok ? buf : NULL;
}

/* The greedy story goes "Once upon a time, there was a little girl named Lily". With " Lily"
 * as the end of generation, the run ends before it; --ignore-eos never picks it; -sp prints
 * it and ends; -r ends after its text; escapes are processed in -p and -r unless
 * --no-escape; --no-display-prompt leaves the prompt out; presence and frequency penalties
 * change the greedy text. */
LOOM_TEST(cli_flags, end_of_generation_reverse_prompt_escapes_and_penalties) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    const char *story = "Once upon a time, there was a little girl named Lily";
    char *g[] = {"run", "-m", m, "-n", "40", "--temp", "0", NULL};
    char *greedy = run_text(g, 0);
    LOOM_REQUIRE(strncmp(greedy, story, strlen(story)) == 0);
    /* the id of "▁Lily" */
    loom_gguf *gg = NULL;
    loom_tokenizer *tok = NULL;
    LOOM_REQUIRE(loom_gguf_open(m, &gg) == LOOM_OK);
    LOOM_REQUIRE(loom_tokenizer_from_gguf(gg, &tok) == LOOM_OK);
    int32_t ids[4];
    size_t nt = 0;
    LOOM_REQUIRE(loom_tokenize(tok, "Lily", 4, false, ids, 4, &nt) == LOOM_OK && nt == 1);
    loom_tokenizer_free(tok);
    loom_gguf_free(gg);
    char path[4096];
    LOOM_REQUIRE(stories_with_eos((uint32_t)ids[0], path, sizeof path) != NULL);

    char *a1[] = {"run", "-m", path, "-n", "40", "--temp", "0", NULL};
    char *ended = run_text(a1, 0);
    LOOM_CHECK_STR_EQ(ended, "Once upon a time, there was a little girl named");
    char *a2[] = {"run", "-m", path, "-n", "40", "--ignore-eos", "--temp", "0", NULL};
    char *ignored = run_text(a2, 0);
    LOOM_CHECK_MSG(strstr(ignored, "Lily") == NULL && strlen(ignored) > strlen(story),
                   "--ignore-eos: '%s'", ignored);
    char *a3[] = {"run", "-m", path, "-n", "40", "-sp", "--temp", "0", NULL};
    char *special = run_text(a3, 0);
    LOOM_CHECK_STR_EQ(special, story);
    char *a4[] = {"run",           "-m",     m,   "-n", "40", "-r", "girl", "-r",
                  "never printed", "--temp", "0", NULL};
    char *rp = run_text(a4, 0);
    LOOM_CHECK_STR_EQ(rp, "Once upon a time, there was a little girl");
    char *a5[] = {"run",   "-m",     m,   "-n", "40", "--reverse-prompt",
                  "\\x2c", "--temp", "0", NULL}; /* "," */
    char *rp_esc = run_text(a5, 0);
    LOOM_CHECK_STR_EQ(rp_esc, "Once upon a time,");
    char *a6[] = {"run",    "-m", m,   "-n", "4", "-p", "Once upon a time\\x2c\\tthere",
                  "--temp", "0",  NULL};
    char *esc = run_text(a6, 0);
    LOOM_CHECK_MSG(strncmp(esc, "Once upon a time,\tthere", 23) == 0, "'%s'", esc);
    char *a7[] = {"run", "-m", m, "-n", "4", "--no-escape", "-p", "a\\tb", "--temp", "0", NULL};
    char *raw = run_text(a7, 0);
    LOOM_CHECK_MSG(strncmp(raw, "a\\tb", 4) == 0, "'%s'", raw);
    char *out, *err;
    char *vp[] = {"run", "-m", m, "-n", "1", "--verbose-prompt", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, vp, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(err, "prompt: 5 tokens\n     1 -> '<s>'\n");
    LOOM_CHECK_STR_CONTAINS(err, " -> ' upon'\n");
    free(out);
    free(err);
    char *a8[] = {"run", "-m", m, "-n", "40", "--no-display-prompt", "--temp", "0", NULL};
    char *noprompt = run_text(a8, 0);
    LOOM_CHECK_STR_EQ(noprompt, greedy + strlen("Once upon a time"));
    char *a9[] = {"run", "-m", m, "-n", "40", "--frequency-penalty", "5", "--temp", "0", NULL};
    char *freq = run_text(a9, 0);
    char *a10[] = {"run", "-m", m, "-n", "40", "--presence-penalty", "5", "--temp", "0", NULL};
    char *pres = run_text(a10, 0);
    char *a11[] = {"run",    "-m",
                   m,        "-n",
                   "40",     "--presence-penalty",
                   "0",      "--frequency-penalty",
                   "0",      "--no-warmup",
                   "-e",     "--mlock",
                   "--temp", "0",
                   NULL};
    char *zero = run_text(a11, 0);
    LOOM_CHECK(strcmp(freq, greedy) != 0 && strcmp(pres, greedy) != 0);
    LOOM_CHECK_STR_EQ(zero, greedy);
    /* llama.cpp's values: -n -2 is -n -1, a negative temperature is greedy, top-k -1 is off,
     * -c 0 the training context (2048 for stories260K: 5 prompt tokens, 2043 generated) */
    char *b1[] = {"run", "-m", m, "-n", "-1", "-c", "40", "--temp", "0", NULL};
    char *b2[] = {"run", "-m", m, "-n", "-2", "-c", "40", "--temp", "-1", "--top-k", "-1", NULL};
    char *to_end = run_text(b1, 0), *to_end2 = run_text(b2, 0);
    LOOM_CHECK_STR_EQ(to_end2, to_end);
    free(to_end);
    free(to_end2);
    char *b3[] = {"run", "-m", m, "-n", "-1", "-c", "0", "--temp", "0", NULL};
    char *out0, *err0;
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, b3, &out0, &err0), 0);
    LOOM_CHECK_STR_CONTAINS(err0, "generation: 2043 tokens");
    free(out0);
    free(err0);
    /* chat and interactive modes are refused, naming why */
    char *a12[] = {"run", "-m", m, "-cnv", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a12, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "no conversation or interactive mode");
    free(out);
    free(err);
    char *a13[] = {"run", "-m", m, "-r", "", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a13, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "-r needs a non-empty text");
    free(out);
    free(err);
    unlink(path);
    char *all[] = {greedy, ended, ignored,  special, rp,   rp_esc,
                   esc,    raw,   noprompt, freq,    pres, zero};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* A file without a vocabulary: bench, explain and gguf --plan run it (ids only, as
 * llama-bench), run and tokenize refuse it naming why. */
LOOM_TEST(cli_errors, no_vocabulary_bench_runs_run_refuses) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_layer = 2;
    p.n_vocab = 300;
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(&p, &w) == LOOM_OK);
    LOOM_REQUIRE(loom_gguf_set_str(w, "tokenizer.ggml.model", "none") == LOOM_OK);
    char path[4096];
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(path, sizeof path, "%s/no_vocab.gguf", dir ? dir : "/tmp");
    LOOM_REQUIRE(loom_gguf_write_file(w, path) == LOOM_OK);
    loom_gguf_writer_free(w);
    char *out, *err;
    char *b[] = {"bench", "-m", path, "-p", "4", "-n", "2", "-r", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, b, &out, &err), 0);
    LOOM_CHECK_EQ_INT(count(out, "\n| llama "), 2);
    free(out);
    free(err);
    char *e[] = {"explain", "-m", path, "--devices", "sim:2", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_explain, e, &out, &err), 0);
    free(out);
    free(err);
    char *gp[] = {"gguf", path, "--plan", "--devices", "sim:2", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, gp, &out, &err), 0);
    free(out);
    free(err);
    char *r[] = {"run", "-m", path, "-n", "2", "--temp", "0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, r, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "the model has no vocabulary (tokenizer.ggml.model 'none')");
    free(out);
    free(err);
    char *t[] = {"tokenize", "-m", path, "-p", "hi", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_tokenize, t, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "the file has no vocabulary");
    free(out);
    free(err);
    unlink(path);
}

/* llama.cpp's defaults, warnings and aliases (issue 26): temperature 0.8 and an F16 KV cache
 * by default; -c past the training context and -ngl past the layers are warned about;
 * --temperature, --predict, -ngl all|auto, --list-devices, -f from a pipe and --stdin. */
LOOM_TEST(cli_flags, llama_cpp_defaults_warnings_and_aliases) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *m = (char *)loom_test_stories();
    char *out, *err;
    char *d[] = {"run", "-m", m, "-n", "2", "-c", "256", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, d, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(err, ", temp 0.8, ");
    char kv[32]; /* 5 layers x (K + V) x 256 positions x 32 x f16 */
    loom_cli_format_bytes(kv, sizeof kv, 5.0 * 2 * 256 * 32 * 2);
    LOOM_CHECK_STR_CONTAINS(err, kv);
    LOOM_CHECK(strstr(err, "warning") == NULL);
    free(out);
    free(err);
    /* the aliases give the text of the names they stand for */
    char *g[] = {"run", "-m", m, "-n", "12", "--temp", "0", NULL};
    char *greedy = run_text(g, 0);
    char *al[] = {"run", "-m", m, "--predict", "12", "--temperature", "0", "-ngl", "all", NULL};
    char *alias = run_text(al, 0);
    LOOM_CHECK_STR_EQ(alias, greedy);
    char *au[] = {"run", "-m", m, "-n", "12", "--temp", "0", "-ngl", "auto", NULL};
    char *aut = run_text(au, 0);
    LOOM_CHECK_STR_EQ(aut, greedy);
    /* the warnings, on stderr (the text unchanged) */
    char *w[] = {"run", "-m", m, "-n", "12", "--temp", "0", "-c", "4096", "-ngl", "9", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, w, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(err, "warning: -c 4096 exceeds the model's training context (2048)");
    LOOM_CHECK_STR_CONTAINS(err, "warning: -ngl 9: 5/5 layers on the devices");
    LOOM_CHECK_STR_EQ(out, greedy);
    free(out);
    free(err);
    char *w2[] = {"run", "-m", m, "-n", "1", "-ngl", "3", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, w2, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(err, "-ngl 3: 3/5 layers on the devices\n");
    free(out);
    free(err);
    /* the prompt from a pipe: -f /dev/fd/N, and --stdin */
    int fds[2];
    LOOM_REQUIRE(pipe(fds) == 0);
    LOOM_REQUIRE(write(fds[1], "Once upon a time\n", 17) == 17);
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    char *f[] = {"run", "-m", m, "-n", "12", "--temp", "0", "-f", path, NULL};
    char *piped = run_text(f, 0);
    LOOM_CHECK_STR_EQ(piped, greedy);
    close(fds[0]);
    LOOM_REQUIRE(pipe(fds) == 0);
    LOOM_REQUIRE(write(fds[1], "Once upon a time", 16) == 16);
    close(fds[1]);
    int saved = dup(0);
    LOOM_REQUIRE(saved >= 0 && dup2(fds[0], 0) == 0);
    close(fds[0]);
    char *si[] = {"run", "-m", m, "-n", "12", "--temp", "0", "--stdin", NULL};
    char *stdin_text = run_text(si, 0);
    dup2(saved, 0);
    close(saved);
    LOOM_CHECK_STR_EQ(stdin_text, greedy);
    /* --list-devices: loom devices' list, then exit */
    char *ld[] = {"run", "--list-devices", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, ld, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "CPU");
    free(out);
    free(err);
    free(greedy);
    free(alias);
    free(aut);
    free(piped);
    free(stdin_text);
}

/* A fresh clone (issue 26): -m NAME finds NAME in $LOOM_MODELS_DIR, and the example
 * --split-rules file of examples/ parses, overrides the built-in rule it names and keeps
 * the greedy story. */
LOOM_TEST(cli_flags, models_dir_and_the_example_split_rules) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", loom_test_stories());
    *strrchr(dir, '/') = 0;
    const char *prev = getenv("LOOM_MODELS_DIR");
    char saved[4096];
    snprintf(saved, sizeof saved, "%s", prev ? prev : "");
    setenv("LOOM_MODELS_DIR", dir, 1);
    char *g[] = {"run", "-m", (char *)loom_test_stories(), "-n", "16", "--temp", "0", NULL};
    char *greedy = run_text(g, 0);
    char *b[] = {"run", "-m", "stories260K.gguf", "-n", "16", "--temp", "0", NULL};
    char *bare = run_text(b, 0);
    LOOM_CHECK_STR_EQ(bare, greedy);
    if (prev)
        setenv("LOOM_MODELS_DIR", saved, 1);
    else
        unsetenv("LOOM_MODELS_DIR");
    char *rules = "examples/split-rules/output-mirrored.rules";
    char *out, *err;
    char *p[] = {
        "gguf", (char *)loom_test_stories(), "--plan", "--devices", "sim:2", "--split-rules", rules,
        NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_gguf, p, &out, &err), 0);
    const char *o = strstr(out, "\n  output.weight ");
    LOOM_REQUIRE(o != NULL);
    LOOM_CHECK_STR_CONTAINS(o, "MIRRORED");
    LOOM_CHECK_STR_CONTAINS(o, "output-mirrored.rules:15 /output\\.weight/");
    free(out);
    free(err);
    char *r[] = {"run",
                 "-m",
                 (char *)loom_test_stories(),
                 "-n",
                 "16",
                 "--temp",
                 "0",
                 "--devices",
                 "sim:2",
                 "--split-rules",
                 rules,
                 NULL};
    char *split = run_text(r, 0);
    LOOM_CHECK_STR_EQ(split, greedy);
    free(greedy);
    free(bare);
    free(split);
}

/* A device spec of a known kind with what it does not take says what it takes, instead of
 * calling the kind unknown while listing it (issue 26). */
LOOM_TEST(cli_errors, device_spec_of_a_known_kind_says_what_it_takes) {
    const struct {
        const char *spec, *want;
    } cases[] = {
        {"cpu:2", "device spec 'cpu:2': 'cpu' takes no index or options"},
        {"cpu,threads=4", "'cpu' takes no index or options"},
        {"cuda,0", "'cuda' takes a list of GPU indices after ':' (cuda:0,1)"},
        {"numa,1", "'numa' takes a list of NUMA nodes after ':' (numa:0,1)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *out, *err;
        char *a[] = {"run", "--devices", (char *)cases[k].spec, "-n", "1", NULL};
        LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_run, a, &out, &err), 1);
        LOOM_CHECK_STR_CONTAINS(err, cases[k].want);
        LOOM_CHECK_MSG(strstr(err, "unknown device kind") == NULL, "%s: %s", cases[k].spec, err);
        free(out);
        free(err);
    }
}

/* loom bench's rows feed llama.cpp's scripts/compare-llama-bench.py (issue 26): every JSON
 * row has the keys that script requires (its key properties, build_commit, test_time,
 * avg_ts), the SQL has its table (llama_bench) with its columns; a prompt-only row shows
 * no per-token reductions ("-", null), not zeros; -dev none is the CPU; a FAILED line names
 * the whole configuration. */
LOOM_TEST(cli_bench, rows_feed_compare_llama_bench) {
    static const char *const required[] = {
        "cpu_info",       "gpu_info",   "backends",      "n_gpu_layers", "tensor_buft_overrides",
        "model_filename", "model_type", "n_batch",       "n_ubatch",     "embeddings",
        "cpu_mask",       "cpu_strict", "poll",          "n_threads",    "type_k",
        "type_v",         "use_mmap",   "no_kv_offload", "split_mode",   "main_gpu",
        "tensor_split",   "flash_attn", "n_prompt",      "n_gen",        "n_depth",
        "build_commit",   "test_time",  "avg_ts"};
    static const char *const db[] = {
        "build_commit",   "build_number",   "cpu_info",      "gpu_info",
        "backends",       "model_filename", "model_type",    "model_size",
        "model_n_params", "n_batch",        "n_ubatch",      "n_threads",
        "cpu_mask",       "cpu_strict",     "poll",          "type_k",
        "type_v",         "n_gpu_layers",   "split_mode",    "main_gpu",
        "no_kv_offload",  "flash_attn",     "tensor_split",  "tensor_buft_overrides",
        "use_mmap",       "embeddings",     "no_op_offload", "n_prompt",
        "n_gen",          "n_depth",        "test_time",     "avg_ns",
        "stddev_ns",      "avg_ts",         "stddev_ts"};
    char *out, *err;
    char *j[] = {"bench", "--devices", "sim:2", "-p", "4",     "-n",
                 "2",     "-r",        "1",     "-o", "jsonl", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, j, &out, &err), 0);
    LOOM_CHECK_EQ_INT(count(out, "\n"), 2); /* pp4, tg2 */
    for (const char *line = out; *line; line = strchr(line, '\n') + 1) {
        const char *end = strchr(line, '\n');
        LOOM_REQUIRE(end != NULL);
        for (size_t k = 0; k < sizeof required / sizeof required[0]; k++) {
            char key[64];
            snprintf(key, sizeof key, "\"%s\": ", required[k]);
            const char *at = strstr(line, key);
            LOOM_CHECK_MSG(at && at < end, "a row lacks %s: %.*s", key, (int)(end - line), line);
        }
    }
    LOOM_CHECK_STR_CONTAINS(out, "\"gpu_info\": \"simulated GPU 0 of 2");
    LOOM_CHECK_STR_CONTAINS(out, "\"cpu_strict\": false, \"poll\": 50, \"embeddings\": false");
    /* the prompt row: no reductions per generated token; the tg row: its count */
    LOOM_CHECK_STR_CONTAINS(out, "\"n_gen\": 0");
    LOOM_CHECK_EQ_INT(count(out, "\"allreduces_per_token\": null"), 1);
    LOOM_CHECK_EQ_INT(count(out, "\"allreduces_per_token\": "), 2);
    free(out);
    free(err);
    char *q[] = {"bench", "--devices", "sim:2", "-p", "4", "-n", "0", "-r", "1", "-o", "sql", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, q, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "CREATE TABLE IF NOT EXISTS llama_bench (");
    const char *ins = strstr(out, "INSERT INTO llama_bench (");
    LOOM_REQUIRE(ins != NULL);
    for (size_t k = 0; k < sizeof db / sizeof db[0]; k++) {
        char col[64];
        snprintf(col, sizeof col, "  %s ", db[k]);
        LOOM_CHECK_MSG(strstr(out, col) != NULL, "CREATE TABLE lacks %s", db[k]);
    }
    free(out);
    free(err);
    char *m[] = {"bench", "--devices", "sim:2", "-p", "4", "-n", "0", "-r", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, m, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "| pp4 | ");
    LOOM_CHECK_STR_CONTAINS(out, " | - | - | - | - | - | - |\n"); /* no tg, no profile, no host */
    free(out);
    free(err);
    char *n[] = {"bench", "-dev", "none", "-p", "4", "-n", "0", "-r", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, n, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "| none | ");
    free(out);
    free(err);
    char *f[] = {"bench", "--devices", "sim:zero", "-p",   "4",    "-n",
                 "0",     "-r",        "1",        "-ctk", "q8_0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, f, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "loom bench: FAILED built-in | sim:zero | ");
    LOOM_CHECK_STR_CONTAINS(err, " | t all | ngl -1 | b 2048 | ub 512 | ctk q8_0 | ctv f16 | fa -1 "
                                 "| nkvo 0 | mmap 1: ");
    free(out);
    free(err);
}
