/*
 * Tests of `loom demo` and `loom devices`: the CPU run of the demo block against an
 * independent scalar forward pass (written here from the op semantics in docs/ops.md),
 * the hand split over sim devices against the CPU run, the per-device report, and the
 * command-line behaviour (exit codes, error lines, output).
 */
#define _POSIX_C_SOURCE 200809L /* dup, fileno */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/shim/loom_test.h"
#include "tools/cli.h"
#include "tools/demo_run.h"

/* ---------------------------------------------------------------- scalar reference */

static void ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (float)(x[i] * r) * w[i];
}

/* y[M] = W x, W stored as rows of K (ne0 = K contiguous) */
static void ref_matvec(const float *W, const float *x, int K, int M, float *y) {
    for (int m = 0; m < M; m++) {
        double s = 0;
        for (int k = 0; k < K; k++)
            s += (double)W[(size_t)m * K + k] * x[k];
        y[m] = (float)s;
    }
}

/* NORMAL mode: rotate (v[2i], v[2i+1]) by pos * base^(-2i/d) */
static void ref_rope(float *v, int d, int pos, float base) {
    for (int i = 0; i < d / 2; i++) {
        double theta = pos * pow(base, -2.0 * i / d);
        double c = cos(theta), s = sin(theta), a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = (float)(a * c - b * s);
        v[2 * i + 1] = (float)(a * s + b * c);
    }
}

/* Rounds weights as the weight type stores them (f32 and f16 supported here). */
static void round_to_type(loom_type t, float *w, size_t n) {
    if (t != LOOM_TYPE_F16) return;
    for (size_t i = 0; i < n; i++)
        w[i] = loom_fp16_to_fp32(loom_fp32_to_fp16(w[i]));
}

static float *ref_weight(const loom_demo_hparams *hp, int layer, loom_demo_weight w) {
    int64_t ne[2];
    loom_demo_weight_shape(hp, w, ne);
    float *v = malloc(sizeof(float) * (size_t)(ne[0] * ne[1]));
    loom_demo_weight_values(hp, layer, w, v);
    if (w != LOOM_DEMO_ATTN_NORM && w != LOOM_DEMO_FFN_NORM)
        round_to_type(hp->wtype, v, (size_t)(ne[0] * ne[1]));
    return v;
}

/* The whole model in plain C, token by token; x [n_embd * T] in, out in place. */
static void ref_forward(const loom_demo_hparams *hp, float *x) {
    const int E = hp->n_embd, T = hp->n_tokens, H = hp->n_head, HKV = hp->n_head_kv;
    const int D = E / H, KV = D * HKV, F = hp->n_ff;
    float *n = malloc(sizeof(float) * E), *q = malloc(sizeof(float) * (size_t)E * T);
    float *k = malloc(sizeof(float) * (size_t)KV * T), *v = malloc(sizeof(float) * (size_t)KV * T);
    float *o = malloc(sizeof(float) * E), *y = malloc(sizeof(float) * E);
    float *attn = malloc(sizeof(float) * (size_t)E * T), *p = malloc(sizeof(float) * T);
    float *g = malloc(sizeof(float) * F), *u = malloc(sizeof(float) * F);
    for (int l = 0; l < hp->n_layers; l++) {
        float *an = ref_weight(hp, l, LOOM_DEMO_ATTN_NORM), *wq = ref_weight(hp, l, LOOM_DEMO_WQ);
        float *wk = ref_weight(hp, l, LOOM_DEMO_WK), *wv = ref_weight(hp, l, LOOM_DEMO_WV);
        float *wo = ref_weight(hp, l, LOOM_DEMO_WO), *fn = ref_weight(hp, l, LOOM_DEMO_FFN_NORM);
        float *wg = ref_weight(hp, l, LOOM_DEMO_W_GATE), *wu = ref_weight(hp, l, LOOM_DEMO_W_UP);
        float *wd = ref_weight(hp, l, LOOM_DEMO_W_DOWN);
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(x + (size_t)t * E, an, E, hp->eps, n);
            ref_matvec(wq, n, E, E, q + (size_t)t * E);
            ref_matvec(wk, n, E, KV, k + (size_t)t * KV);
            ref_matvec(wv, n, E, KV, v + (size_t)t * KV);
            for (int h = 0; h < H; h++)
                ref_rope(q + (size_t)t * E + h * D, D, t, hp->rope_base);
            for (int h = 0; h < HKV; h++)
                ref_rope(k + (size_t)t * KV + h * D, D, t, hp->rope_base);
        }
        for (int t = 0; t < T; t++) { /* causal: query t sees keys 0..t */
            for (int h = 0; h < H; h++) {
                int hk = h / (H / HKV);
                const float *qh = q + (size_t)t * E + h * D;
                double mx = -INFINITY, sum = 0;
                for (int i = 0; i <= t; i++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += (double)qh[d] * k[(size_t)i * KV + hk * D + d];
                    p[i] = (float)(s / sqrt((double)D));
                    if (p[i] > mx) mx = p[i];
                }
                for (int i = 0; i <= t; i++)
                    sum += exp(p[i] - mx);
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int i = 0; i <= t; i++)
                        acc += exp(p[i] - mx) / sum * v[(size_t)i * KV + hk * D + d];
                    attn[(size_t)t * E + h * D + d] = (float)acc;
                }
            }
        }
        for (int t = 0; t < T; t++) {
            float *xt = x + (size_t)t * E;
            ref_matvec(wo, attn + (size_t)t * E, E, E, o);
            for (int i = 0; i < E; i++)
                xt[i] += o[i];
            ref_rmsnorm(xt, fn, E, hp->eps, n);
            ref_matvec(wg, n, E, F, g);
            ref_matvec(wu, n, E, F, u);
            for (int i = 0; i < F; i++)
                g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
            ref_matvec(wd, g, F, E, y);
            for (int i = 0; i < E; i++)
                xt[i] += y[i];
        }
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
    }
    free(n), free(q), free(k), free(v), free(o), free(y), free(attn), free(p), free(g), free(u);
}

static void small_hparams(loom_demo_hparams *hp) {
    loom_demo_hparams_default(hp);
    hp->n_embd = 64;
    hp->n_head = 4;
    hp->n_head_kv = 2;
    hp->n_ff = 96;
    hp->n_tokens = 7;
    hp->n_layers = 2;
    hp->wtype = LOOM_TYPE_F32;
}

static double cpu_vs_reference(const loom_demo_hparams *hp) {
    size_t n = (size_t)hp->n_embd * hp->n_tokens;
    float *got = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    loom_demo_diff d = {0};
    loom_status st = loom_demo_run_cpu(hp, 0, got, NULL);
    LOOM_CHECK_MSG(st == LOOM_OK, "cpu run: %s", loom_last_error());
    if (st == LOOM_OK) {
        loom_demo_input_values(hp, ref);
        ref_forward(hp, ref);
        loom_demo_compare(ref, got, n, &d);
        LOOM_CHECK(d.finite);
        LOOM_CHECK(d.max_abs_ref > 0.1); /* the block produced something non-trivial */
    }
    free(got);
    free(ref);
    return st == LOOM_OK && d.finite ? d.rel_l2 : INFINITY;
}

LOOM_TEST(demo, cpu_block_f32_matches_scalar_reference) {
    loom_demo_hparams hp;
    small_hparams(&hp);
    double rel = cpu_vs_reference(&hp);
    LOOM_CHECK_MSG(rel < 1e-5, "relative L2 error %g", rel);
}

LOOM_TEST(demo, cpu_block_default_f16_matches_scalar_reference) {
    loom_demo_hparams hp;
    loom_demo_hparams_default(&hp); /* F16 weights; kernels may round activations to f16 */
    double rel = cpu_vs_reference(&hp);
    LOOM_CHECK_MSG(rel < 5e-3, "relative L2 error %g", rel);
}

/* ---------------------------------------------------------------- split over devices */

static void split_vs_cpu(const char *spec, const loom_demo_hparams *hp, loom_demo_report *rep,
                         int *n_dev_out) {
    loom_dev_t devs[LOOM_DEMO_MAX_DEVICES];
    size_t n_dev = 0;
    *n_dev_out = 0;
    loom_status st = loom_cli_devices_from_spec(spec, devs, LOOM_DEMO_MAX_DEVICES, &n_dev);
    LOOM_CHECK_MSG(st == LOOM_OK, "spec %s: %s", spec, loom_last_error());
    if (st != LOOM_OK) return;
    size_t n = (size_t)hp->n_embd * hp->n_tokens;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    LOOM_CHECK(loom_demo_run_cpu(hp, 0, ref, NULL) == LOOM_OK);
    st = loom_demo_run_devices(hp, devs, (int)n_dev, got, rep);
    LOOM_CHECK_MSG(st == LOOM_OK, "run on %s: %s", spec, loom_last_error());
    if (st == LOOM_OK) {
        loom_demo_diff d;
        loom_demo_compare(ref, got, n, &d);
        LOOM_CHECK(d.finite);
        LOOM_CHECK_MSG(d.rel_l2 <= 1e-5, "%s vs cpu: relative L2 error %g", spec, d.rel_l2);
        *n_dev_out = (int)n_dev;
    }
    free(ref);
    free(got);
}

LOOM_TEST(demo, sim2_split_matches_cpu_and_reports_traffic) {
    loom_demo_hparams hp;
    loom_demo_hparams_default(&hp);
    loom_demo_report rep;
    memset(&rep, 0, sizeof rep);
    int n_dev;
    split_vs_cpu("sim:2", &hp, &rep, &n_dev);
    LOOM_REQUIRE(n_dev == 2);
    LOOM_CHECK(rep.dev[0].is_sim && rep.dev[1].is_sim);
    LOOM_CHECK_EQ_INT(rep.stage_device[0], 0); /* attention */
    LOOM_CHECK_EQ_INT(rep.stage_device[1], 1); /* ffn */
    uint64_t x_bytes = sizeof(float) * (uint64_t)hp.n_embd * hp.n_tokens;
    for (int i = 0; i < 2; i++) {
        const loom_sim_stats *r = &rep.dev[i].run;
        LOOM_CHECK_EQ_INT(r->graphs, 1);
        LOOM_CHECK_EQ_INT(r->nodes > 0, 1);
        LOOM_CHECK_MSG(r->bytes_in >= x_bytes, "%s: %llu bytes in", rep.dev[i].name,
                       (unsigned long long)r->bytes_in);
        LOOM_CHECK_MSG(r->bytes_out >= x_bytes, "%s: %llu bytes out", rep.dev[i].name,
                       (unsigned long long)r->bytes_out);
        LOOM_CHECK(r->link_time_us > 0); /* nvlink: latency and finite bandwidth */
        /* the weights went up before the run: at least the F16 matmul weights */
        LOOM_CHECK(rep.dev[i].upload.bytes_in > (uint64_t)hp.n_embd * hp.n_embd * 2);
    }
    /* the FFN holds two n_ff x n_embd weights and one n_embd x n_ff */
    LOOM_CHECK(rep.dev[1].run.mem_peak >= (size_t)3 * hp.n_embd * hp.n_ff * 2);
}

LOOM_TEST(demo, sim3_two_layers_round_robin) {
    loom_demo_hparams hp;
    small_hparams(&hp);
    loom_demo_report rep;
    memset(&rep, 0, sizeof rep);
    int n_dev;
    split_vs_cpu("sim:3,link=pcie4", &hp, &rep, &n_dev);
    LOOM_REQUIRE(n_dev == 3);
    LOOM_CHECK_EQ_INT(rep.n_stages, 4);
    for (int s = 0; s < 4; s++)
        LOOM_CHECK_EQ_INT(rep.stage_device[s], s % 3);
    LOOM_CHECK_EQ_INT(rep.dev[0].run.graphs, 2);
    LOOM_CHECK_EQ_INT(rep.dev[1].run.graphs, 1);
    LOOM_CHECK_EQ_INT(rep.dev[2].run.graphs, 1);
    LOOM_CHECK_EQ_INT(rep.dev[0].n_copies_in, 2); /* host input, then from the third */
}

LOOM_TEST(demo, single_cpu_device_matches_cpu) {
    loom_demo_hparams hp;
    small_hparams(&hp);
    loom_demo_report rep;
    memset(&rep, 0, sizeof rep);
    int n_dev;
    split_vs_cpu("cpu", &hp, &rep, &n_dev);
    LOOM_REQUIRE(n_dev == 1);
    LOOM_CHECK(!rep.dev[0].is_sim);
    LOOM_CHECK_EQ_INT(rep.dev[0].n_stages, 4);
}

LOOM_TEST(demo, quantized_weights_split_matches_cpu) {
    loom_demo_hparams hp;
    loom_demo_hparams_default(&hp);
    hp.wtype = LOOM_TYPE_Q4_0;
    hp.n_ff = 704; /* a multiple of the 32-value block */
    loom_demo_report rep;
    memset(&rep, 0, sizeof rep);
    int n_dev;
    split_vs_cpu("sim:2", &hp, &rep, &n_dev);
    LOOM_CHECK_EQ_INT(n_dev, 2);
}

/* ---------------------------------------------------------------- errors */

LOOM_TEST(demo, rejects_bad_hparams_with_a_reason) {
    loom_demo_hparams hp;
    loom_demo_hparams_default(&hp);
    hp.wtype = LOOM_TYPE_Q4_0; /* n_ff 688 is not a multiple of 32 */
    LOOM_CHECK_EQ_INT(loom_demo_hparams_check(&hp), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "688");
    float out[1];
    LOOM_CHECK_EQ_INT(loom_demo_run_cpu(&hp, 1, out, NULL), LOOM_ERR_INVALID_ARG);

    loom_demo_hparams_default(&hp);
    hp.n_head_kv = 3;
    LOOM_CHECK_EQ_INT(loom_demo_hparams_check(&hp), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "kv heads 3");
}

/* Runs a subcommand with stdout and stderr captured into buffers. */
static int run_captured(int (*cmd)(int, char **), int argc, const char **argv, char *out,
                        size_t out_size, char *err, size_t err_size) {
    fflush(stdout);
    fflush(stderr);
    FILE *fo = tmpfile(), *fe = tmpfile();
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = cmd(argc, (char **)argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    FILE *fs[2] = {fo, fe};
    char *bufs[2] = {out, err};
    size_t sizes[2] = {out_size, err_size};
    for (int i = 0; i < 2; i++) {
        rewind(fs[i]);
        size_t n = fread(bufs[i], 1, sizes[i] - 1, fs[i]);
        bufs[i][n] = 0;
        fclose(fs[i]);
    }
    return rc;
}

static char g_out[1 << 16], g_err[1 << 12];

LOOM_TEST(cli, demo_agrees_and_prints_each_device) {
    const char *argv[] = {"demo", "--devices", "sim:2", "--tokens", "5"};
    int rc = run_captured(loom_cli_demo, 5, argv, g_out, sizeof g_out, g_err, sizeof g_err);
    LOOM_CHECK_EQ_INT(rc, 0);
    LOOM_CHECK_STR_CONTAINS(g_out, "AGREE");
    LOOM_CHECK_STR_CONTAINS(g_out, "5 tokens");
    LOOM_CHECK_STR_CONTAINS(g_out, "attention");
    LOOM_CHECK_STR_CONTAINS(g_out, "link time");
    LOOM_CHECK_EQ_INT(strlen(g_err), 0);
}

LOOM_TEST(cli, demo_bad_usage_is_one_line_and_exit_2) {
    struct {
        int argc;
        const char *argv[4];
        const char *needle;
    } cases[] = {
        {2, {"demo", "--bogus"}, "unknown option '--bogus'"},
        {3, {"demo", "--type", "q4_0"}, "688"},
        {3, {"demo", "--layers", "0"}, "--layers needs an integer in 1..16 (got '0')"},
        {3, {"demo", "--type", "q9"}, "'q9'"},
        {2, {"demo", "--tokens"}, "--tokens needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_captured(loom_cli_demo, cases[i].argc, cases[i].argv, g_out, sizeof g_out,
                              g_err, sizeof g_err);
        LOOM_CHECK_EQ_INT(rc, 2);
        LOOM_CHECK_STR_CONTAINS(g_err, cases[i].needle);
        const char *nl = strchr(g_err, '\n');
        LOOM_CHECK_MSG(nl && nl[1] == 0, "case %zu: not one line: %s", i, g_err);
    }
}

LOOM_TEST(cli, demo_bad_device_spec_fails_with_the_spec) {
    const char *argv[] = {"demo", "--devices", "nosuchdev:3"};
    int rc = run_captured(loom_cli_demo, 3, argv, g_out, sizeof g_out, g_err, sizeof g_err);
    LOOM_CHECK_EQ_INT(rc, 1);
    LOOM_CHECK_STR_CONTAINS(g_err, "loom demo: ");
    LOOM_CHECK_STR_CONTAINS(g_err, "'nosuchdev:3'");
    LOOM_CHECK_EQ_INT(strlen(g_out), 0);
}

LOOM_TEST(cli, devices_lists_cpu_and_requested_sim) {
    const char *argv[] = {"devices", "--devices", "sim:2,mem=1GiB"};
    int rc = run_captured(loom_cli_devices, 3, argv, g_out, sizeof g_out, g_err, sizeof g_err);
    LOOM_CHECK_EQ_INT(rc, 0);
    char needle[128];
    snprintf(needle, sizeof needle, "registry %s: 1 device", loom_reg_name(loom_cpu_reg()));
    LOOM_CHECK_STR_CONTAINS(g_out, needle);
    snprintf(needle, sizeof needle, "%s  [CPU]", loom_dev_name(loom_cpu_dev()));
    LOOM_CHECK_STR_CONTAINS(g_out, needle);
    /* the spec's two devices are marked, and show its memory cap */
    int marked = 0;
    for (const char *p = g_out; (p = strstr(p, "(from --devices)  [GPU]")); p++)
        marked++;
    LOOM_CHECK_EQ_INT(marked, 2);
    LOOM_CHECK_STR_CONTAINS(g_out, "1.0 GiB free of 1.0 GiB");
    const char *help[] = {"devices", "--help"};
    LOOM_CHECK_EQ_INT(
        run_captured(loom_cli_devices, 2, help, g_out, sizeof g_out, g_err, sizeof g_err), 0);
    LOOM_CHECK_STR_CONTAINS(g_out, "usage: loom devices");
}
