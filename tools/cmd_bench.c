#define _GNU_SOURCE
/*
 * `loom bench`: a table of prompt and generation speed per configuration (device spec x
 * split mode), like llama-bench: mean and spread over repetitions, reductions and bytes
 * per generated token, and for sim devices the projected communication time per token
 * under the NVLink and PCIe 4 link presets (each reduction costed as a ring:
 * 2(N-1) steps of latency plus 2(N-1)/N of the bytes over one link).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: loom bench [-m FILE] --devices SPEC[;SPEC...] [--split-mode LIST] [-p N] [-n N] [-r N] [-o md|csv|json]\n\n"
               "Measures prompt processing and generation speed per configuration.\n\n"
               "  --devices SPECS        ';'-separated device specs (default cpu)\n"
               "  --split-mode LIST      ','-separated split modes (default: the default per spec)\n"
               "  -p N                   prompt tokens (default 512)\n"
               "  -n N                   generated tokens (default 128)\n"
               "  -r N                   repetitions (default 3)\n"
               "  -o md|csv|json         output format (default md)\n"
               "%s",
            loom_model_opts_help());
}

typedef struct row {
    char devices[64], mode[8];
    double pp_mean, pp_sd, tg_mean, tg_sd;
    double red_per_tok, bytes_per_tok;
    double proj_nvlink_us, proj_pcie_us; /* communication per generated token, sim only */
    int n_dev;
    bool ok;
    char err[160];
} row;

static void stats(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static double ring_us(const loom_sim_link *l, int n, double bytes) {
    if (n < 2) return 0;
    double steps = 2.0 * (n - 1), per_step = bytes / n;
    return steps * loom_sim_link_time_us(l, (uint64_t)per_step);
}

static void bench_one(loom_model_opts *o, const char *devices, loom_split_mode mode, int n_p, int n_g,
                      int reps, row *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->devices, sizeof r->devices, "%s", devices);
    o->sp.devices = devices;
    o->sp.split_mode = mode;
    if (o->sp.n_ctx <= 0) o->sp.n_ctx = n_p + n_g + 8;
    loom_session *s = NULL;
    if (loom_session_new(NULL, o->gguf, &o->sp, &s)) {
        snprintf(r->err, sizeof r->err, "%s", loom_last_error());
        snprintf(r->mode, sizeof r->mode, "%s", loom_split_mode_name(mode));
        return;
    }
    snprintf(r->mode, sizeof r->mode, "%s", loom_split_mode_name(loom_session_split_mode(s)));
    r->n_dev = loom_session_n_devices(s);
    const int64_t V = loom_session_model(s)->hp.n_vocab;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_p > 0 ? n_p : 1));
    float *logits = malloc(sizeof(float) * (size_t)V);
    double pp[64], tg[64];
    uint64_t seed = 7;
    for (int i = 0; i < n_p; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(3 + (seed >> 33) % (uint64_t)(V - 3));
    }
    double red = 0, bytes = 0;
    r->ok = true;
    for (int k = 0; k < reps && r->ok; k++) {
        loom_session_clear(s);
        int64_t t0 = loom_time_us();
        if (n_p > 0 && loom_session_eval(s, ids, n_p, false, logits)) r->ok = false;
        int64_t t1 = loom_time_us();
        int32_t tok = 1;
        red = bytes = 0;
        for (int i = 0; i < n_g && r->ok; i++) {
            if (loom_session_eval(s, &tok, 1, false, logits)) r->ok = false;
            loom_session_stats st;
            loom_session_get_stats(s, &st);
            red += st.last_reductions;
            bytes += (double)st.last_bytes_reduced;
            tok = (int32_t)(3 + (i * 7919) % (V - 3));
        }
        int64_t t2 = loom_time_us();
        pp[k] = n_p * 1e6 / (double)(t1 - t0 > 0 ? t1 - t0 : 1);
        tg[k] = n_g * 1e6 / (double)(t2 - t1 > 0 ? t2 - t1 : 1);
    }
    if (!r->ok) snprintf(r->err, sizeof r->err, "%s", loom_last_error());
    stats(pp, reps, &r->pp_mean, &r->pp_sd);
    stats(tg, reps, &r->tg_mean, &r->tg_sd);
    if (n_g > 0) {
        r->red_per_tok = red / n_g;
        r->bytes_per_tok = bytes / n_g;
    }
    bool sim = r->n_dev > 0 && loom_dev_is_sim(loom_session_device(s, 0));
    if (sim && r->red_per_tok > 0) {
        loom_sim_link nv, pc;
        loom_sim_link_preset("nvlink", &nv);
        loom_sim_link_preset("pcie4", &pc);
        double per = r->bytes_per_tok / r->red_per_tok;
        r->proj_nvlink_us = r->red_per_tok * ring_us(&nv, r->n_dev, per);
        r->proj_pcie_us = r->red_per_tok * ring_us(&pc, r->n_dev, per);
    }
    free(ids);
    free(logits);
    loom_session_free(s);
}

int loom_cli_bench(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *devices = "cpu", *modes = NULL, *fmt = "md";
    int n_p = 512, n_g = 128, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--devices") && v) {
            devices = v;
            i++;
            continue;
        }
        if ((!strcmp(a, "--split-mode") || !strcmp(a, "-sm")) && v) {
            modes = v;
            i++;
            continue;
        }
        int r = loom_model_opts_parse(&o, "bench", argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") && v) {
            if (!loom_cli_parse_int("bench", a, v, 0, 1 << 20, &n_p)) return 2;
            i++;
        } else if (!strcmp(a, "-n") && v) {
            if (!loom_cli_parse_int("bench", a, v, 0, 1 << 20, &n_g)) return 2;
            i++;
        } else if (!strcmp(a, "-r") && v) {
            if (!loom_cli_parse_int("bench", a, v, 1, 64, &reps)) return 2;
            i++;
        } else if (!strcmp(a, "-o") && v) {
            fmt = v;
            if (strcmp(fmt, "md") && strcmp(fmt, "csv") && strcmp(fmt, "json")) {
                fprintf(stderr, "loom bench: -o '%s' (md, csv or json)\n", fmt);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "loom bench: unknown or incomplete option '%s' (see loom bench --help)\n", a);
            return 2;
        }
    }
    if (!loom_model_opts_open(&o, "bench")) return 1;
    loom_split_mode mlist[8];
    int n_modes = 0;
    if (!modes) {
        mlist[n_modes++] = LOOM_SPLIT_MODE_DEFAULT;
    } else {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", modes);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok && n_modes < 8; tok = strtok_r(NULL, ",", &save)) {
            if (loom_split_mode_parse(tok, &mlist[n_modes])) {
                fprintf(stderr, "loom bench: %s\n", loom_last_error());
                loom_model_opts_free(&o);
                return 2;
            }
            n_modes++;
        }
    }
    row rows[64];
    int n_rows = 0;
    char dbuf[512];
    snprintf(dbuf, sizeof dbuf, "%s", devices);
    int64_t n_ctx0 = o.sp.n_ctx;
    char *dsave = NULL;
    for (char *spec = strtok_r(dbuf, ";", &dsave); spec && n_rows < 64; spec = strtok_r(NULL, ";", &dsave))
        for (int m = 0; m < n_modes && n_rows < 64; m++) {
            o.sp.n_ctx = n_ctx0;
            bench_one(&o, spec, mlist[m], n_p, n_g, reps, &rows[n_rows++]);
        }
    const loom_hparams *hp = NULL;
    loom_hparams h;
    if (loom_hparams_from_gguf(o.gguf, &h) == LOOM_OK) hp = &h;
    int failed = 0;
    if (!strcmp(fmt, "md")) {
        printf("model: %s (%s, %lld layers)\n\n", o.model ? o.model : "built-in synthetic", hp ? hp->arch : "?",
               hp ? (long long)hp->n_layer : 0ll);
        printf("| devices | split | pp%d t/s | tg%d t/s | allreduce/tok | bytes/tok | proj nvlink us/tok | proj pcie4 us/tok |\n", n_p, n_g);
        printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    } else if (!strcmp(fmt, "csv")) {
        printf("devices,split,n_prompt,n_gen,pp_tps,pp_sd,tg_tps,tg_sd,allreduce_per_tok,bytes_per_tok,proj_nvlink_us,proj_pcie4_us\n");
    } else {
        printf("[\n");
    }
    for (int i = 0; i < n_rows; i++) {
        row *r = &rows[i];
        if (!r->ok) {
            failed++;
            fprintf(stderr, "loom bench: %s %s: %s\n", r->devices, r->mode, r->err);
        }
        if (!strcmp(fmt, "md"))
            printf("| %s | %s | %.1f ± %.1f | %.1f ± %.1f | %.1f | %.0f | %.1f | %.1f |%s\n", r->devices, r->mode,
                   r->pp_mean, r->pp_sd, r->tg_mean, r->tg_sd, r->red_per_tok, r->bytes_per_tok,
                   r->proj_nvlink_us, r->proj_pcie_us, r->ok ? "" : " FAILED");
        else if (!strcmp(fmt, "csv"))
            printf("%s,%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.2f,%.0f,%.2f,%.2f\n", r->devices, r->mode, n_p, n_g,
                   r->pp_mean, r->pp_sd, r->tg_mean, r->tg_sd, r->red_per_tok, r->bytes_per_tok,
                   r->proj_nvlink_us, r->proj_pcie_us);
        else
            printf("  {\"devices\": \"%s\", \"split\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, "
                   "\"pp_tps\": %.3f, \"pp_sd\": %.3f, \"tg_tps\": %.3f, \"tg_sd\": %.3f, "
                   "\"allreduce_per_tok\": %.2f, \"bytes_per_tok\": %.0f, \"proj_nvlink_us\": %.2f, "
                   "\"proj_pcie4_us\": %.2f, \"ok\": %s}%s\n",
                   r->devices, r->mode, n_p, n_g, r->pp_mean, r->pp_sd, r->tg_mean, r->tg_sd,
                   r->red_per_tok, r->bytes_per_tok, r->proj_nvlink_us, r->proj_pcie_us,
                   r->ok ? "true" : "false", i + 1 < n_rows ? "," : "");
    }
    if (!strcmp(fmt, "json")) printf("]\n");
    loom_model_opts_free(&o);
    return failed ? 1 : 0;
}
