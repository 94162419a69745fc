/*
 * `loom plan`: planned from a copy of stories260K truncated after its header (no tensor
 * data at all), the bytes per device equal what a real run allocates on sim devices with
 * real memory and the real weights (each device's own allocation counter, within 1%), for
 * tensor and layer splits; the JSON has the documented fields; when nothing fits it names
 * the largest context that does, and that context really fits while the next step does
 * not; a header-only file cannot be run; unknown profiles are refused by name.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/sim.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tests/tools/plan_run.h"
#include "tests/tools/stories.h"
#include "tools/cli.h"
#include "tools/model_cli.h"
#include "tools/plan.h"

static void check_plan_matches_run(loom_split_mode mode, int n_dev) {
    const char *hdr = loom_test_stories_header_only("stories-header.gguf");
    LOOM_REQUIRE(hdr != NULL);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    loom_plan_opts o = {.spec_opts = "profile=rtx-3090,link=pcie4",
                        .dev_mem = (size_t)24 << 30,
                        .n_batch = 64,
                        .kv_type = LOOM_TYPE_F32};
    loom_plan_candidate c;
    loom_plan_candidate_eval(g, &o, mode, n_dev, 256, &c);
    LOOM_REQUIRE(c.ok);
    LOOM_CHECK(c.fits);
    LOOM_CHECK(c.weights > 0 && c.kv > 0 && c.compute > 0);
    LOOM_CHECK(c.pp_tps > 0 && c.tg_tps > 0);
    const loom_test_run_cfg rc = {mode,          n_dev, 256, 64, LOOM_TYPE_F32,
                                  LOOM_TYPE_F32, NULL,  0,   0,  false};
    loom_test_run_bytes real;
    LOOM_REQUIRE(loom_test_plan_real_run(&rc, &real) && real.n_dev == n_dev);
    for (int j = 0; j < n_dev; j++) {
        LOOM_CHECK_MSG(fabs(c.dev_total[j] - real.dev[j]) <= 0.01 * real.dev[j],
                       "%s over %d, device %d: planned %.0f bytes, the run allocated %.0f",
                       loom_split_mode_name(mode), n_dev, j, c.dev_total[j], real.dev[j]);
    }
    loom_gguf_free(g);
}

LOOM_TEST(plan, tensor_bytes_equal_a_real_run) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    check_plan_matches_run(LOOM_SPLIT_MODE_TENSOR, 2);
    check_plan_matches_run(LOOM_SPLIT_MODE_TENSOR, 4);
}

LOOM_TEST(plan, layer_bytes_equal_a_real_run) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    check_plan_matches_run(LOOM_SPLIT_MODE_LAYER, 2);
    check_plan_matches_run(LOOM_SPLIT_MODE_NONE, 1);
}

LOOM_TEST(plan, header_only_file_cannot_run) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header.gguf");
    LOOM_REQUIRE(hdr != NULL);
    loom_gguf *g = NULL;
    LOOM_CHECK_EQ_INT(loom_gguf_open(hdr, &g), LOOM_ERR_FORMAT); /* the strict open refuses */
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    LOOM_CHECK(loom_gguf_tensor_data(g, 0) == NULL);
    loom_session_params sp = loom_session_params_default();
    sp.devices = "sim:2";
    loom_session *s = NULL;
    LOOM_CHECK_EQ_INT(loom_session_new(NULL, g, &sp, &s), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "has no data in the file");
    loom_gguf_free(g);
}

LOOM_TEST(plan, json_fields_and_best) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header.gguf");
    LOOM_REQUIRE(hdr != NULL);
    char *out, *err;
    char *argv[] = {"plan", "-m",  (char *)hdr, "--devices", "sim:4,profile=rtx-3090,link=pcie4",
                    "-c",   "256", "-b",        "32",        "-o",
                    "json", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, argv, &out, &err), 0);
    LOOM_CHECK(out[0] == '[');
    static const char *const fields[] = {"\"split_mode\": \"tensor\"",
                                         "\"n_devices\": 4",
                                         "\"split_mode\": \"layer\"",
                                         "\"fits\": true",
                                         "\"bytes_per_device\": {\"weights\": ",
                                         "\"kv\": ",
                                         "\"compute\": ",
                                         "\"pp_tps\": ",
                                         "\"tg_tps\": ",
                                         "\"best\": true"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        LOOM_CHECK_STR_CONTAINS(out, fields[i]);
    free(out);
    free(err);

    char *argv2[] = {"plan", "-m", (char *)hdr, "--devices", "sim:2,profile=rtx-9090", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, argv2, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "unknown device profile 'rtx-9090'");
    LOOM_CHECK_STR_CONTAINS(err, "rtx-4090");
    free(out);
    free(err);
}

/* With 1.5 MiB per device nothing fits at 4096 positions (the KV cache alone is 2.5 MiB per
 * device over 2); the plan names a context, which fits, while 256 more does not. */
LOOM_TEST(plan, nothing_fits_names_the_largest_context) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header.gguf");
    LOOM_REQUIRE(hdr != NULL);
    char *out, *err;
    char *argv[] = {"plan", "-m",   (char *)hdr, "--devices", "sim:2,profile=rtx-3090,mem=1.5MiB",
                    "-c",   "4096", "-b",        "32",        NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, argv, &out, &err), 0);
    const char *p = strstr(out, "the largest context that fits: ");
    LOOM_REQUIRE(p != NULL);
    long long ctx = atoll(p + strlen("the largest context that fits: "));
    LOOM_CHECK(ctx >= 256 && ctx < 4096);
    const char *q = strstr(p, "(");
    LOOM_REQUIRE(q != NULL);
    loom_split_mode mode = strncmp(q + 1, "tensor", 6) == 0  ? LOOM_SPLIT_MODE_TENSOR
                           : strncmp(q + 1, "layer", 5) == 0 ? LOOM_SPLIT_MODE_LAYER
                                                             : LOOM_SPLIT_MODE_NONE;
    int n_dev = atoi(strstr(q, "over ") + 5);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    loom_plan_opts o = {.spec_opts = "profile=rtx-3090,mem=1.5MiB",
                        .dev_mem = (size_t)3 << 19,
                        .n_batch = 32,
                        .kv_type = LOOM_TYPE_F16}; /* the CLI's default, llama.cpp's */
    loom_plan_candidate c;
    loom_plan_candidate_eval(g, &o, mode, n_dev, ctx, &c);
    LOOM_CHECK(c.ok && c.fits);
    loom_plan_candidate_eval(g, &o, mode, n_dev, ctx + 256, &c);
    LOOM_CHECK(c.ok && !c.fits);
    loom_gguf_free(g);
    free(out);
    free(err);
}

/* loom bench on profiled sim devices: the projected t/s in its own column/field; without a
 * profile the column is empty ("-" / null), never a copy of the measured figure. */
LOOM_TEST(plan, bench_reports_projection_beside_measured) {
    char *out, *err;
    char *a[] = {
        "bench", "--devices", "sim:2,profile=rtx-4090", "-p", "8", "-n", "2", "-r", "2", "-o",
        "json",  NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, a, &out, &err), 0);
    const char *p = strstr(out, "\"proj_avg_ts\": ");
    LOOM_REQUIRE(p != NULL);
    double proj = atof(p + strlen("\"proj_avg_ts\": "));
    LOOM_CHECK(proj > 0);
    const char *m = strstr(out, "\"avg_ts\": ");
    LOOM_REQUIRE(m != NULL);
    LOOM_CHECK(atof(m + strlen("\"avg_ts\": ")) != proj);
    free(out);
    free(err);
    char *b[] = {"bench", "--devices", "sim:2", "-p", "8", "-n", "0", "-r", "1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, b, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "| projected t/s |");
    LOOM_CHECK_STR_CONTAINS(out, "| - | - |\n"); /* projected t/s, then host us/tok */
    free(out);
    free(err);
    char *c[] = {
        "bench", "--devices", "sim:2,profile=h100-sxm,link=nvlink4", "-p", "8", "-n", "0", "-r",
        "1",     NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_bench, c, &out, &err), 0);
    LOOM_CHECK(strstr(out, "| - | - |\n") == NULL);
    free(out);
    free(err);
}

/* Refusals: one clear line each, usage errors exit 2, a file that cannot be planned 1. */
LOOM_TEST(plan, refusals_name_the_problem) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s/ggml-vocab-llama-spm.gguf", loom_test_models_dir());
    char *out, *err;
    char *b[] = {"plan", "-m", (char *)loom_test_stories(), "--devices", "cuda:0,1", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, b, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "plans are made on sim device profiles");
    free(out);
    free(err);
    char *c[] = {"plan", "-m", vocab, "--devices", "sim:2,profile=l40s", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, c, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "no configuration could be planned");
    LOOM_CHECK_STR_CONTAINS(err, "token_embd.weight");
    free(out);
    free(err);
    char *d[] = {"plan", "-m", (char *)loom_test_stories(), "--devices", "sim:2,profile=l40s", "-o",
                 "xml",  NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, d, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "table or json");
    free(out);
    free(err);
}

/* plan's model options go through the shared parser: the values and errors of loom run's;
 * a shared option plan does not take is an unknown one. */
LOOM_TEST(plan, bad_options_refused_as_loom_run_refuses_them) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    char *m = (char *)loom_test_stories();
    struct {
        char *argv[8];
        const char *want;
    } bad[] = {
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-c", "lots", NULL},
         "loom plan: -c needs an integer in 0..16777216 (got 'lots')"},
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-b", "0", NULL},
         "loom plan: -b needs an integer in 1..1048576 (got '0')"},
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-ctv", "q9_9", NULL},
         "loom plan: -ctv 'q9_9' is not a cache type (f32, f16"},
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-ts", "3,x", NULL},
         "loom plan: -ts '3,x': 'x' is not a proportion"},
        {{"plan", "-m", m, "--devices", "", NULL}, "loom plan: --devices is empty (cpu, sim:N"},
        {{"plan", "--devices", "sim:2,profile=l40s", "-m", NULL}, "loom plan: -m needs a value"},
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-ngl", "2", NULL},
         "loom plan: unknown option '-ngl'"},
        {{"plan", "-m", m, "--devices", "sim:2,profile=l40s", "-c", "1", NULL},
         "loom plan: -c 1: a plan needs a context of at least 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out, *err;
        LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, bad[i].argv, &out, &err), 2);
        LOOM_CHECK_STR_CONTAINS(err, bad[i].want);
        free(out);
        free(err);
    }
}

/* Without profile= (issue 26) the plan answers the fit and leaves the speed out, saying why:
 * the same bytes per device as with a profile of the same memory, no t/s ("-", JSON null),
 * and the fewest devices that fit named. */
LOOM_TEST(plan, without_a_profile_the_fit_alone) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    char *out, *err, *pout, *perr;
    char *a[] = {"plan",
                 "-m",
                 (char *)loom_test_stories(),
                 "--devices",
                 "sim:2,mem=24GiB",
                 "-c",
                 "512",
                 "-o",
                 "json",
                 NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, a, &out, &err), 0);
    char *p[] = {"plan",
                 "-m",
                 (char *)loom_test_stories(),
                 "--devices",
                 "sim:2,profile=rtx-3090,mem=24GiB",
                 "-c",
                 "512",
                 "-o",
                 "json",
                 NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, p, &pout, &perr), 0);
    LOOM_CHECK_STR_CONTAINS(out, "\"pp_tps\": null, \"tg_tps\": null");
    LOOM_CHECK(strstr(pout, "\"tg_tps\": null") == NULL);
    /* the bytes of every candidate: the same with and without the profile */
    const char *x = out, *y = pout;
    int n = 0;
    while ((x = strstr(x, "\"bytes_per_device\": ")) && (y = strstr(y, "\"bytes_per_device\": "))) {
        const char *xe = strchr(x, '}'), *ye = strchr(y, '}');
        LOOM_REQUIRE(xe && ye);
        LOOM_CHECK_MSG(xe - x == ye - y && !memcmp(x, y, (size_t)(xe - x)), "%.*s vs %.*s",
                       (int)(xe - x), x, (int)(ye - y), y);
        x = xe;
        y = ye;
        n++;
    }
    LOOM_CHECK(n >= 3); /* none, tensor 2, layer 2 */
    free(out);
    free(err);
    free(pout);
    free(perr);
    char *t[] = {"plan", "-m", (char *)loom_test_stories(), "--devices", "sim:2", "-c",
                 "512",  NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, t, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "no speed: --devices has no profile=");
    LOOM_CHECK_STR_CONTAINS(out, "fits on the fewest devices: none over 1 device");
    LOOM_CHECK(strstr(out, "tokens/s") == NULL);
    free(out);
    free(err);
}
