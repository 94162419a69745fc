/*
 * `loom bench` lists and ranges as hostile input (issue #29 item 8): lists that multiply into
 * millions of runs are refused before the model is opened, naming each factor's flag, the
 * count and the limit; range steps near LONG_MAX end the range instead of overflowing into
 * values it does not hold (was: "more than 32 values", from signed overflow).
 */
#include <stdlib.h>
#include <string.h>

#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tests/tools/stories.h"
#include "tools/cli.h"

static void refused(char **argv, const char *want) {
    char *out = NULL, *err = NULL;
    const int rc = loom_test_capture(loom_cli_bench, argv, &out, &err);
    LOOM_CHECK_MSG(rc != 0, "bench %s %s accepted", argv[1], argv[2]);
    LOOM_CHECK_STR_CONTAINS(err ? err : "", want);
    LOOM_CHECK(out == NULL || strstr(out, "| llama") == NULL); /* nothing ran */
    free(out);
    free(err);
}

LOOM_TEST(hostile_bench, lists_multiplying_past_the_run_limit_refused_before_loading) {
    /* the model does not exist: the count is refused before it is opened */
    char *a[] = {"bench", "-m",   "/nonexistent.gguf",
                 "-p",    "1-32", "-n",
                 "1-32",  "-d",   "1-32",
                 "-t",    "1-32", "-r",
                 "64",    NULL};
    refused(a, "loom bench: 1 models x 1 device specs (--devices) x 1 split modes (-sm) x 1 "
               "splits (-ts) x 32 combinations (-t, -ngl, -b, -ub, -ctk, -ctv, -nkvo, -fa, -mmp) "
               "x 2048 tests (-p, -n, -pg at each -d) x 64 repetitions (-r) = 4194304 runs, more "
               "than 100000: shorten the lists");
    char *b[] = {"bench",
                 "-m",
                 "/nonexistent.gguf",
                 "--devices",
                 "cpu;sim:2;sim:3;sim:4",
                 "-sm",
                 "none,layer,tensor",
                 "-p",
                 "1-32",
                 "-n",
                 "1-32",
                 "-b",
                 "1-16",
                 "-r",
                 "16",
                 NULL};
    refused(b, "= 196608 runs, more than 100000");
    /* each list alone still stops at 32 values, naming the flag */
    char *c[] = {"bench", "-m", "/nonexistent.gguf", "-p", "1-1048576+1", NULL};
    refused(c, "loom bench: -p '1-1048576+1': more than 32 values");
    char *d[] = {"bench", "-m", "/nonexistent.gguf", "-d", "1-100", NULL};
    refused(d, "loom bench: -d '1-100': more than 32 values");
    /* under the limit the count is no obstacle: the missing file is what is refused */
    char *e[] = {"bench", "-m", "/nonexistent.gguf", "-p", "1-32", "-n", "1-32", "-r", "2", NULL};
    refused(e, "cannot open '/nonexistent.gguf'");
}

/* A step near LONG_MAX: the range holds its first value only. */
LOOM_TEST(hostile_bench, huge_range_steps_end_the_range) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    char *m = (char *)loom_test_stories();
    static const char *const ranges[] = {"2-1000*9223372036854775807", "2-1000+9223372036854775807",
                                         "3-1000*4611686018427387904"};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        char *argv[] = {"bench", "-m", m,     "-p", (char *)ranges[i], "-n", "0", "-r",
                        "1",     "-o", "csv", NULL};
        char *out = NULL, *err = NULL;
        const int rc = loom_test_capture(loom_cli_bench, argv, &out, &err);
        LOOM_CHECK_MSG(rc == 0, "-p %s: exit %d: %s", ranges[i], rc, err ? err : "");
        /* one test (CSV: a header and one row), of n_prompt 2 (or 3), n_gen 0, depth 0 */
        const char *want = ranges[i][0] == '2' ? "\"0.00\",2,0,0," : "\"0.00\",3,0,0,";
        LOOM_CHECK_STR_CONTAINS(out ? out : "", want);
        int lines = 0;
        for (const char *p = out; p && *p; p++)
            lines += *p == '\n';
        LOOM_CHECK_MSG(lines == 2, "-p %s: %d lines (a header and 1 row expected):\n%s", ranges[i],
                       lines, out ? out : "");
        free(out);
        free(err);
    }
}
