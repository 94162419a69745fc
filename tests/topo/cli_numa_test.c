/*
 * cli_numa_test.c: the acceptance run of the issue through the `loom` commands, under a
 * two-node synthetic topology: `loom run --devices numa --split-mode tensor` (and layer)
 * prints stories260K's greedy text exactly as `loom run` on the CPU does, says the
 * affinity policy, the device order and a memory row per node; `loom bench --devices "cpu;numa"`
 * has a row per spec; `loom devices --devices numa` attaches each NUMA device to its node; a bad
 * --cpu-affinity is refused by name.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tests/tools/stories.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

__attribute__((constructor)) static void two_nodes(void) {
    setenv("LOOM_TOPOLOGY", "synthetic:pack:2 [numa(memory=1GB)] core:2 pu:1", 1);
}

/* The generated text: stdout up to the blank line before the statistics. */
static char *run_text(const char *devices, const char *mode, char **err) {
    char *a[] = {"run",
                 "-m",
                 (char *)loom_test_stories(),
                 "-n",
                 "40",
                 "--devices",
                 (char *)devices,
                 "-sm",
                 (char *)mode,
                 "--temp",
                 "0",
                 NULL};
    char *out = NULL;
    int rc = loom_test_capture(loom_cli_run, a, &out, err);
    LOOM_CHECK_MSG(rc == 0, "%s %s: rc %d: %s", devices, mode, rc, *err);
    char *end = strstr(out, "\n\n");
    if (end) *end = 0;
    return out;
}

LOOM_TEST(cli_numa, run_tensor_and_layer_print_the_cpu_text) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *err = NULL;
    char *ref = run_text("cpu", "none", &err);
    LOOM_CHECK_STR_CONTAINS(ref, "Once upon a time, there was a little girl named Lily.");
    free(err);
    const char *modes[] = {"tensor", "layer"};
    for (int m = 0; m < 2; m++) {
        char *text = run_text("numa", modes[m], &err);
        LOOM_CHECK_MSG(strcmp(text, ref) == 0, "numa %s: '%s' vs '%s'", modes[m], text, ref);
        LOOM_CHECK_STR_CONTAINS(err, "cpu affinity numa (2 NUMA nodes");
        LOOM_CHECK_STR_CONTAINS(err, "device order numa: ring order 0 || 1");
        /* the memory report has a row per node (each holds its own slices or layers) */
        LOOM_CHECK_STR_CONTAINS(err, "\n  NUMA0  ");
        LOOM_CHECK_STR_CONTAINS(err, "\n  NUMA1  ");
        free(text);
        free(err);
    }
    free(ref);
}

LOOM_TEST(cli_numa, bench_rows_for_cpu_and_numa) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *a[] = {"bench",     "-m",       (char *)loom_test_stories(),
                 "--devices", "cpu;numa", "-p",
                 "8",         "-n",       "4",
                 "-r",        "1",        NULL};
    char *out = NULL, *err = NULL;
    int rc = loom_test_capture(loom_cli_bench, a, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    LOOM_CHECK_STR_CONTAINS(out, "| cpu | all | -1 | none | pp8 |");
    LOOM_CHECK_STR_CONTAINS(out, "| numa | all | -1 | tensor | tg4 |");
    free(out);
    free(err);
}

LOOM_TEST(cli_numa, devices_tree_and_bad_affinity) {
    char *d[] = {"devices", "--devices", "numa", NULL};
    char *out = NULL, *err = NULL;
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_devices, d, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "2 packages, 2 NUMA nodes, 4 cores, 4 PUs");
    LOOM_CHECK_STR_CONTAINS(out, "  package 1\n    NUMA 1 (os 1): 953.7 MiB, 2 cores, 2 PUs  <- "
                                 "NUMA1\n");
    LOOM_CHECK_STR_CONTAINS(out, "buffer type  NUMA1 (alignment 64, host memory)");
    LOOM_CHECK_STR_CONTAINS(out, "cpu affinity: numa");
    free(out);
    free(err);
    char *r[] = {"run", "--cpu-affinity", "tight", NULL};
    int rc = loom_test_capture(loom_cli_run, r, &out, &err);
    LOOM_CHECK(rc != 0);
    LOOM_CHECK_STR_CONTAINS(err, "--cpu-affinity: cpu affinity 'tight' is not one of none, "
                                 "compact, spread, numa");
    free(out);
    free(err);
}
