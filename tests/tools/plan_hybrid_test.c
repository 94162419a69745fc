/*
 * `loom plan`, issue 18's leftovers, planned from a copy of stories260K cut after its
 * header and checked against real runs on sim devices with real memory and real weights
 * (each device's own allocation counter, within 1%):
 *  - compute buffers at depth: the plan equals a run that has filled its context to the
 *    last position, at -c 512 and 2048 (tensor over 2, layer over 2);
 *  - -ctk/-ctv: the KV bytes follow the types (f16 half of f32, q8_0 34/32 of a byte per
 *    value), and equal the run's; -ts: the proportions move bytes between devices (layer
 *    split: whole layers; tensor: the fullest device's slice grows), equal to the run's;
 *  - the hybrid: the fewest host layers that fit, planned without computing anything, its
 *    device and host bytes equal to a real -ngl run's, its time accounted from the model
 *    under the "host" profile; `loom plan` offers it only when nothing fits the devices.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tests/tools/plan_run.h"
#include "tests/tools/stories.h"
#include "tools/cli.h"
#include "tools/plan.h"

typedef loom_test_run_cfg cfg;
typedef loom_test_run_bytes bytes;

static loom_plan_opts opts_of(const cfg *c) {
    return (loom_plan_opts){.spec_opts = "profile=rtx-3090,link=pcie4",
                            .dev_mem = (size_t)24 << 30,
                            .n_batch = c->n_batch,
                            .kv_type = c->kv_k,
                            .kv_type_v_set = true,
                            .kv_type_v = c->kv_v,
                            .tensor_split = c->ts,
                            .n_tensor_split = c->n_ts,
                            .host_layers = c->host_layers,
                            .link_gbps = 25.0,
                            .link_us = 8.0};
}

static bool near(double a, double b) {
    return fabs(a - b) <= 0.01 * b;
}

/* Plans c from the header-only copy, checks every device against a real run; returns the
 * plan. */
static loom_plan_candidate check_plan_vs_run(const cfg *c) {
    loom_plan_candidate p;
    memset(&p, 0, sizeof p);
    const char *hdr = loom_test_stories_header_only("stories-header-h.gguf");
    loom_gguf *g = NULL;
    if (!hdr || loom_gguf_open_header(hdr, &g)) {
        loom_test_fail(__FILE__, __LINE__, "cannot open the header-only copy");
        return p;
    }
    loom_plan_opts o = opts_of(c);
    loom_plan_candidate all;
    if (c->host_layers > 0) { /* as loom_plan_hybrid_eval does: the all-on-devices growth */
        loom_plan_opts a = o;
        a.host_layers = 0;
        loom_plan_candidate_eval(g, &a, c->mode, c->n_dev, c->n_ctx, &all);
        o.dev_growth = all.growth;
    }
    loom_plan_candidate_eval(g, &o, c->mode, c->n_dev, c->n_ctx, &p);
    LOOM_CHECK_MSG(p.ok, "not planned: %s", p.err);
    bytes b;
    memset(&b, 0, sizeof b);
    LOOM_CHECK_MSG(loom_test_plan_real_run(c, &b), "the real run failed: %s", loom_last_error());
    for (int j = 0; j < c->n_dev; j++)
        LOOM_CHECK_MSG(near(p.dev_total[j], b.dev[j]),
                       "%s over %d, ctx %lld, device %d: planned %.0f bytes, the run (%s) "
                       "allocated %.0f",
                       loom_split_mode_name(c->mode), c->n_dev, (long long)c->n_ctx, j,
                       p.dev_total[j], c->to_depth ? "at the end of its context" : "pp+tg",
                       b.dev[j]);
    LOOM_CHECK_MSG(near(p.host, b.host_weights + b.host_kv + b.host_compute),
                   "host: planned %.0f bytes, the run allocated %.0f", p.host,
                   b.host_weights + b.host_kv + b.host_compute);
    loom_gguf_free(g);
    return p;
}

LOOM_TEST(plan_depth, compute_buffers_equal_a_run_at_the_end_of_its_context) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    static const int64_t ctxs[] = {512, 2048};
    for (size_t i = 0; i < 2; i++) {
        cfg t = {LOOM_SPLIT_MODE_TENSOR, 2,    ctxs[i], 64, LOOM_TYPE_F32,
                 LOOM_TYPE_F32,          NULL, 0,       0,  true};
        check_plan_vs_run(&t);
        cfg l = t;
        l.mode = LOOM_SPLIT_MODE_LAYER;
        check_plan_vs_run(&l);
    }
}

/* The plan's compute at 2048 is larger than at 512: the attention's buffers span the
 * whole context (the worst case), not the start of the cache. */
LOOM_TEST(plan_depth, compute_grows_with_the_context) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header-h.gguf");
    LOOM_REQUIRE(hdr != NULL);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    cfg c = {LOOM_SPLIT_MODE_TENSOR, 2, 512, 64, LOOM_TYPE_F32, LOOM_TYPE_F32, NULL, 0, 0, false};
    loom_plan_opts o = opts_of(&c);
    loom_plan_candidate a, b;
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 512, &a);
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 2048, &b);
    LOOM_REQUIRE(a.ok && b.ok);
    LOOM_CHECK_MSG(b.compute > a.compute, "compute at 2048 %.0f, at 512 %.0f", b.compute,
                   a.compute);
    loom_gguf_free(g);
}

LOOM_TEST(plan_kv, cache_types_set_the_kv_bytes) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    cfg f32 = {LOOM_SPLIT_MODE_LAYER, 2, 512, 32, LOOM_TYPE_F32, LOOM_TYPE_F32, NULL, 0, 0, false};
    loom_plan_candidate p32 = check_plan_vs_run(&f32);
    cfg f16 = f32;
    f16.kv_k = f16.kv_v = LOOM_TYPE_F16;
    loom_plan_candidate p16 = check_plan_vs_run(&f16);
    cfg mix = f32;
    mix.kv_k = LOOM_TYPE_Q8_0; /* 34 bytes per 32 values */
    mix.kv_v = LOOM_TYPE_F16;
    loom_plan_candidate pm = check_plan_vs_run(&mix);
    LOOM_CHECK_MSG(near(p16.kv, p32.kv / 2), "f16 KV %.0f, f32 %.0f", p16.kv, p32.kv);
    /* K at 34/32 bytes per value and V at 2, against 4 + 4 */
    LOOM_CHECK_MSG(near(pm.kv, p32.kv * (34.0 / 32.0 + 2.0) / 8.0), "q8_0/f16 KV %.0f, f32 %.0f",
                   pm.kv, p32.kv);
    /* tensor split: the same, per device */
    cfg t16 = f16;
    t16.mode = LOOM_SPLIT_MODE_TENSOR;
    check_plan_vs_run(&t16);
}

LOOM_TEST(plan_ts, proportions_move_bytes_between_devices) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    static const float ts41[] = {4, 1}, ts31[] = {3, 1};
    cfg even = {LOOM_SPLIT_MODE_LAYER, 2, 512, 32, LOOM_TYPE_F32, LOOM_TYPE_F32, NULL, 0, 0, false};
    loom_plan_candidate e = check_plan_vs_run(&even);
    cfg l41 = even;
    l41.ts = ts41;
    l41.n_ts = 2;
    loom_plan_candidate l = check_plan_vs_run(&l41);
    /* 4 of the 5 layers on device 0, 1 (and the output) on device 1 */
    LOOM_CHECK_MSG(l.dev_total[0] > e.dev_total[0] && l.dev_total[1] < e.dev_total[1],
                   "-ts 4,1: %.0f / %.0f bytes, even: %.0f / %.0f", l.dev_total[0], l.dev_total[1],
                   e.dev_total[0], e.dev_total[1]);
    /* tensor: heads by 3:1; a meta buffer sizes each tensor by its largest slice on every
     * device, so the fullest device's share (3/4 of the weights that are split) decides */
    cfg t_even = even;
    t_even.mode = LOOM_SPLIT_MODE_TENSOR;
    t_even.kv_k = t_even.kv_v = LOOM_TYPE_F16;
    loom_plan_candidate te = check_plan_vs_run(&t_even);
    cfg t31 = t_even;
    t31.ts = ts31;
    t31.n_ts = 2;
    loom_plan_candidate t = check_plan_vs_run(&t31);
    LOOM_CHECK_MSG(t.kv > te.kv * 1.4 && t.weights > te.weights * 1.2,
                   "-ts 3,1: kv %.0f weights %.0f, even: kv %.0f weights %.0f", t.kv, t.weights,
                   te.kv, te.weights);
}

/* A hybrid with h host layers: the devices' and the host's bytes equal a real -ngl run's
 * (which computes the host layers on the CPU; the plan computes nothing: no graph ran). */
LOOM_TEST(plan_hybrid, bytes_equal_a_real_ngl_run_without_computing) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    for (int h = 1; h <= 3; h += 2) {
        cfg c = {LOOM_SPLIT_MODE_TENSOR, 2,    512, 32, LOOM_TYPE_F32,
                 LOOM_TYPE_F32,          NULL, 0,   h,  false};
        loom_plan_candidate p = check_plan_vs_run(&c);
        LOOM_CHECK_EQ_INT(p.host_layers, h);
        LOOM_CHECK_EQ_INT(p.pp_nodes, 0);
        LOOM_CHECK_EQ_INT(p.tg_nodes, 0);
        LOOM_CHECK(p.host_weights > 0 && p.host_kv > 0);
        cfg one = c;
        one.mode = LOOM_SPLIT_MODE_NONE;
        one.n_dev = 1;
        check_plan_vs_run(&one);
    }
}

/* The host part of a decode step: the host layers' and the output's weight bytes (summed
 * here from the file's tensor table) over the host profile's DDR bandwidth and efficiency,
 * plus its per-op overhead; a prompt batch of 32 stages them over the link when that is
 * faster. */
LOOM_TEST(plan_hybrid, host_time_is_accounted_from_the_model) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header-h.gguf");
    LOOM_REQUIRE(hdr != NULL);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    const loom_sim_profile *host = NULL;
    LOOM_REQUIRE(loom_sim_profile_find("host", &host) == LOOM_OK);
    LOOM_CHECK(host->hbm_gbps > 20 && host->hbm_gbps < 500 && host->fp16_tflops > 0.1 &&
               host->mem_bytes >= ((size_t)16 << 30) && strlen(host->source) > 10);
    double w2 = 0; /* blk.0, blk.1 and output */
    bool tied = loom_gguf_find_tensor(g, "output.weight") < 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        const char *n = loom_gguf_tensor_name(g, i);
        if (!strncmp(n, "blk.0.", 6) || !strncmp(n, "blk.1.", 6) || !strncmp(n, "output", 6) ||
            (tied && !strcmp(n, "token_embd.weight")))
            w2 += (double)loom_gguf_tensor_size(g, i);
    }
    cfg c = {LOOM_SPLIT_MODE_TENSOR, 2, 512, 32, LOOM_TYPE_F32, LOOM_TYPE_F32, NULL, 0, 0, false};
    loom_plan_opts o = opts_of(&c);
    double t = loom_plan_host_time_us(g, &o, 2, 1, 10);
    double want = w2 / (host->hbm_gbps * 1e9) / host->efficiency * 1e6 + 10 * host->launch_us;
    LOOM_CHECK_NEAR(t, want, 1e-6 * want);
    LOOM_CHECK(loom_plan_host_time_us(g, &o, 4, 1, 10) > t); /* more layers, more bytes */
    /* a prompt: never slower than the CPU alone would be */
    double cpu_pp = loom_plan_host_time_us(g, &(loom_plan_opts){.n_batch = 32}, 2, 32, 10);
    LOOM_CHECK(loom_plan_host_time_us(g, &o, 2, 32, 10) <= cpu_pp);

    /* the hybrid's decode time: the devices' share of the all-on-devices run plus this */
    loom_plan_candidate all, hy;
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 512, &all);
    LOOM_REQUIRE(all.ok && all.tg_us > 0 && all.tg_nodes > 0);
    loom_plan_opts tight = o;
    tight.dev_mem = (size_t)(all.weights + all.kv + all.compute) - 1; /* all 5 do not fit */
    loom_plan_hybrid_eval(g, &tight, 2, 512, &all, &hy);
    LOOM_REQUIRE(hy.ok);
    LOOM_CHECK(hy.fits && hy.host_layers >= 1 && hy.host_layers < 5);
    double host_tg =
        loom_plan_host_time_us(g, &o, hy.host_layers, 1, all.tg_nodes * hy.host_layers / 5.0);
    double dev_tg = all.tg_us * (5 - hy.host_layers) / 5.0;
    LOOM_CHECK(hy.tg_us > dev_tg + host_tg && hy.tg_us < dev_tg + host_tg + 100);
    loom_gguf_free(g);
}

/* With too little memory for any split of all the layers, `loom plan` adds the hybrid:
 * the fewest host layers that fit (one fewer does not), named as the best; the JSON marks
 * it; with enough memory there is no hybrid. */
LOOM_TEST(plan_hybrid, offered_only_when_the_devices_alone_do_not_fit) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header-h.gguf");
    LOOM_REQUIRE(hdr != NULL);
    char *out, *err;
    char *a[] = {"plan", "-m",   (char *)hdr, "--devices", "sim:2,profile=rtx-3090,mem=1.5MiB",
                 "-c",   "4096", "-b",        "32",        NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, a, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "hybrid   2+host");
    LOOM_CHECK_STR_CONTAINS(out, "nothing fits the devices alone at context 4096");
    const char *b = strstr(out, "best: hybrid, ");
    LOOM_REQUIRE(b != NULL);
    int on_dev = atoi(b + strlen("best: hybrid, "));
    LOOM_CHECK(on_dev >= 1 && on_dev < 5);
    free(out);
    free(err);

    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_header(hdr, &g) == LOOM_OK);
    loom_plan_opts o = {.spec_opts = "profile=rtx-3090,mem=1.5MiB",
                        .dev_mem = (size_t)3 << 19,
                        .n_batch = 32,
                        .kv_type = LOOM_TYPE_F16}; /* the CLI's default, llama.cpp's */
    loom_plan_candidate c, all;
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 4096, &all);
    o.dev_growth = all.growth;
    o.host_layers = 5 - on_dev;
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 4096, &c);
    LOOM_CHECK(c.ok && c.fits);
    if (o.host_layers > 1) {
        o.host_layers--;
        loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, 2, 4096, &c);
        LOOM_CHECK(c.ok && !c.fits);
    }
    loom_gguf_free(g);

    char *j[] = {"plan", "-m",   (char *)hdr, "--devices", "sim:2,profile=rtx-3090,mem=1.5MiB",
                 "-c",   "4096", "-b",        "32",        "-o",
                 "json", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, j, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "\"hybrid\": true");
    LOOM_CHECK_STR_CONTAINS(out, "\"host\": {\"weights\": ");
    LOOM_CHECK(strstr(out, "\"best\": true") != NULL);
    free(out);
    free(err);

    /* too little for even one layer: the hybrid is shown, not chosen, and said not to fit */
    char *t[] = {"plan", "-m",   (char *)hdr, "--devices", "sim:2,profile=rtx-3090,mem=200KiB",
                 "-c",   "4096", "-b",        "32",        NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, t, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(out, "the hybrid does not fit either");
    LOOM_CHECK(strstr(out, "best:") == NULL && strstr(out, "<- best") == NULL);
    free(out);
    free(err);

    char *k[] = {"plan", "-m",  (char *)hdr, "--devices", "sim:2,profile=rtx-3090",
                 "-c",   "512", "-b",        "32",        NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, k, &out, &err), 0);
    LOOM_CHECK(strstr(out, "hybrid") == NULL);
    free(out);
    free(err);
}

/* -ctk/-ctv/-ts on the command line: shown in the header, refused by name when wrong. */
LOOM_TEST(plan_cli, cache_types_and_tensor_split_options) {
    if (!loom_test_stories()) LOOM_SKIP("shared models not found");
    const char *hdr = loom_test_stories_header_only("stories-header-h.gguf");
    LOOM_REQUIRE(hdr != NULL);
    char *out, *err;
    char *a[] = {"plan", "-m",  (char *)hdr, "--devices", "sim:2,profile=rtx-3090",
                 "-c",   "512", "-ctk",      "q8_0",      "-ctv",
                 "f16",  "-ts", "4,1",       "-o",        "json",
                 NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, a, &out, &err), 0);
    /* layer over 2 with 4:1: device 0 holds more than device 1 */
    const char *l = strstr(out, "\"split_mode\": \"layer\"");
    LOOM_REQUIRE(l != NULL);
    const char *d = strstr(l, "\"device_totals\": [");
    LOOM_REQUIRE(d != NULL);
    double d0 = 0, d1 = 0;
    LOOM_REQUIRE(sscanf(d + strlen("\"device_totals\": ["), "%lf, %lf", &d0, &d1) == 2);
    LOOM_CHECK_MSG(d0 > d1, "-ts 4,1 layer: %.0f / %.0f", d0, d1);
    free(out);
    free(err);
    char *b[] = {"plan", "-m", (char *)hdr, "--devices", "sim:2,profile=rtx-3090",
                 "-ctv", "q9", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, b, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "-ctv 'q9' is not a cache type");
    free(out);
    free(err);
    char *c[] = {"plan", "-m",  (char *)hdr, "--devices", "sim:2,profile=rtx-3090",
                 "-ts",  "0,0", NULL};
    LOOM_CHECK_EQ_INT(loom_test_capture(loom_cli_plan, c, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "no positive proportion");
    free(out);
    free(err);
}
