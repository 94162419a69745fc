/*
 * `loom plan -m FILE --devices sim:N,profile=P[,link=L] [-c CTX] [-b BATCH] [-ctk T]
 * [-o table|json]`: will the model fit, and how fast would it run? From the GGUF header
 * alone (no weight byte is read, so a 40 GB model plans on a laptop), for each candidate
 * -- one device, tensor parallelism over 2, 4, 8 (up to N) devices, layer split over the
 * same counts -- the bytes per device (weights, KV cache at that context, compute buffers
 * from the scheduler's reserve), whether it fits the profile's memory, and projected
 * prompt and generation tokens/s under sim's timing model. Names the best fitting
 * configuration; when nothing fits, the largest context that does.
 *
 * The bytes are those of the real session (built on sim virtual=1 devices, see plan.h),
 * so they equal what a run allocates; the speeds are projections (docs/projection.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tools/cli.h"
#include "tools/model_cli.h"
#include "tools/plan.h"

/* ---------------------------------------------------------------- one candidate */

void loom_plan_session_bytes(loom_session *s, double *weights, double *kv, double *compute,
                             double *host, double *dev_total, int cap) {
    loom_cli_mem_row rows[LOOM_META_MAX_DEVICES + 2];
    int n = loom_cli_session_memory(s, rows, LOOM_META_MAX_DEVICES + 2);
    *weights = *kv = *compute = *host = 0;
    for (int i = 0; i < n; i++)
        if (!rows[i].dev) *host += rows[i].weights + rows[i].kv + rows[i].compute;
    /* a device's total is its own allocation counter: it also sees what no report lists
     * (the meta device's reduction scratch), counted here as compute */
    double best = -1;
    for (int j = 0; j < loom_session_n_devices(s) && j < cap; j++) {
        loom_dev_t d = loom_session_device(s, j);
        loom_sim_stats st;
        loom_sim_dev_stats(d, &st);
        double total = (double)st.mem_used;
        dev_total[j] = total;
        for (int i = 0; i < n; i++)
            if (rows[i].dev == d && total > best) {
                best = total;
                *weights = rows[i].weights;
                *kv = rows[i].kv;
                *compute = total - rows[i].weights - rows[i].kv;
            }
    }
}

/* Virtual time of the work issued since the last reset: each device's ops plus the link
 * time it waits for (full duplex: copies into it, and its host transfers). Tensor parallelism runs
 * the devices at once (the slowest decides); a layer split runs them one after another for one
 * sequence (their ops add up; links counted once). */
double loom_plan_session_time_us(loom_session *s) {
    double max_t = 0, sum_ops = 0, max_link = 0;
    uint64_t ops = 0; /* none: no profile, no projection (link time alone is not one) */
    for (int j = 0; j < loom_session_n_devices(s); j++) {
        if (!loom_dev_is_sim(loom_session_device(s, j))) continue;
        loom_sim_stats st;
        loom_sim_dev_stats(loom_session_device(s, j), &st);
        double t = st.compute_time_us + st.link_wait_us;
        if (t > max_t) max_t = t;
        sum_ops += st.compute_time_us;
        ops += st.ops;
        if (st.link_wait_us > max_link) max_link = st.link_wait_us;
        loom_sim_dev_reset_stats(loom_session_device(s, j));
    }
    if (ops == 0) return 0;
    return loom_session_split_mode(s) == LOOM_SPLIT_MODE_LAYER ? sum_ops + max_link : max_t;
}

void loom_plan_candidate_eval(const loom_gguf *g, const loom_plan_opts *o, loom_split_mode mode,
                              int n_devices, int64_t n_ctx, loom_plan_candidate *out) {
    memset(out, 0, sizeof *out);
    out->mode = mode;
    out->n_devices = n_devices;
    out->n_ctx = n_ctx;
    char spec[1200];
    snprintf(spec, sizeof spec, "sim:%d%s%s,virtual=1,mem=1024TiB", n_devices,
             o->spec_opts && o->spec_opts[0] ? "," : "", o->spec_opts ? o->spec_opts : "");
    loom_session_params sp = loom_session_params_default();
    sp.devices = spec;
    sp.split_mode = mode;
    sp.threads = 1;
    sp.n_ctx = n_ctx;
    sp.n_batch = o->n_batch;
    sp.kv_type = o->kv_type;
    sp.split_rules = o->split_rules;
    sp.no_weight_data = true;
    loom_session *s = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    if (loom_session_new(NULL, g, &sp, &s)) goto fail;
    const int64_t V = loom_session_model(s)->hp.n_vocab;
    int64_t n_prompt = o->n_batch < loom_session_n_ctx(s) ? o->n_batch : loom_session_n_ctx(s) - 1;
    if (n_prompt < 1) n_prompt = 1;
    logits = malloc((size_t)V * sizeof *logits);
    ids = malloc((size_t)n_prompt * sizeof *ids);
    if (!logits || !ids) {
        loom_error(LOOM_ERR_NOMEM, "plan: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)(V > 1 ? 1 : 0);
    loom_plan_session_time_us(s); /* resets the counters after the load */
    if (loom_session_eval(s, ids, n_prompt, false, logits)) goto fail;
    out->pp_us = loom_plan_session_time_us(s);
    if (loom_session_n_past(s) < loom_session_n_ctx(s)) {
        if (loom_session_eval(s, ids, 1, false, logits)) goto fail;
        out->tg_us = loom_plan_session_time_us(s);
    }
    out->pp_tps = out->pp_us > 0 ? (double)n_prompt / (out->pp_us * 1e-6) : 0;
    out->tg_tps = out->tg_us > 0 ? 1.0 / (out->tg_us * 1e-6) : 0;
    loom_plan_session_bytes(s, &out->weights, &out->kv, &out->compute, &out->host, out->dev_total,
                            16);
    out->fits = out->weights + out->kv + out->compute <= (double)o->dev_mem;
    out->ok = true;
    free(ids);
    free(logits);
    loom_session_free(s);
    return;
fail:
    snprintf(out->err, sizeof out->err, "%s", loom_last_error());
    free(ids);
    free(logits);
    loom_session_free(s);
}

/* ---------------------------------------------------------------- the command */

static void usage(FILE *f) {
    fprintf(f, "usage: loom plan -m FILE --devices sim:N,profile=NAME[,link=PRESET] [-c CTX] "
               "[-b BATCH] [-ctk f32|f16] [-o table|json]\n\n"
               "Plans a GGUF model from its header alone (no weight data is read): for one\n"
               "device, tensor parallelism over 2, 4, 8 devices (up to N) and layer split, the\n"
               "bytes per device (weights, KV cache, compute buffers), whether it fits, and\n"
               "projected prompt (pp) and generation (tg) tokens/s under sim's timing model.\n\n"
               "  -m, --model FILE          GGUF file (its tensor data may be absent)\n"
               "  -dev, --devices SPEC      sim:N with profile= (and link=, mem=): the largest\n"
               "                            device count to consider; default "
               "sim:8,profile=h100-sxm,link=nvlink4\n"
               "  -c, --ctx-size N          context (KV cache) length (default: min(train, 2048))\n"
               "  -b, --batch-size N        prompt tokens per graph (default 512)\n"
               "  -ctk, --cache-type-k T    KV cache type: f32 (default) or f16\n"
               "  --split-rules FILE        split rules that override/extend the built-in table\n"
               "  -o, --output table|json   output format (default table)\n\n"
               "profiles:");
    for (int i = 0; i < loom_sim_profile_count(); i++)
        fprintf(f, " %s", loom_sim_profile_get(i)->name);
    fprintf(f, "\nlinks:   ");
    for (int i = 0; i < loom_sim_link_preset_count(); i++)
        fprintf(f, " %s", loom_sim_link_preset_get(i)->name);
    fprintf(f, "\n");
}

static const char *const plan_names[] = {
    "-h",       "--help",        "-m", "--model",      "--devices", "-dev",           "--device",
    "-c",       "--ctx-size",    "-b", "--batch-size", "-ctk",      "--cache-type-k", "-o",
    "--output", "--split-rules", NULL};

static void mib(char *buf, size_t n, double b) {
    loom_cli_format_bytes(buf, n, b);
}

static void print_table(const loom_plan_candidate *c, int n, int best) {
    printf("  %-7s %7s %11s %11s %11s %11s %5s %10s %10s\n", "split", "devices", "weights",
           "KV cache", "compute", "total", "fits", "pp t/s", "tg t/s");
    for (int i = 0; i < n; i++) {
        if (!c[i].ok) {
            printf("  %-7s %7d  not planned: %s\n", loom_split_mode_name(c[i].mode), c[i].n_devices,
                   c[i].err);
            continue;
        }
        char w[32], k[32], cp[32], t[32];
        mib(w, sizeof w, c[i].weights);
        mib(k, sizeof k, c[i].kv);
        mib(cp, sizeof cp, c[i].compute);
        mib(t, sizeof t, c[i].weights + c[i].kv + c[i].compute);
        printf("  %-7s %7d %11s %11s %11s %11s %5s %10.1f %10.2f%s\n",
               loom_split_mode_name(c[i].mode), c[i].n_devices, w, k, cp, t,
               c[i].fits ? "yes" : "no", c[i].pp_tps, c[i].tg_tps, i == best ? "  <- best" : "");
    }
}

static void print_json(const loom_plan_candidate *c, int n, int best, const int64_t *max_ctx,
                       size_t dev_mem) {
    printf("[\n");
    for (int i = 0; i < n; i++) {
        printf("  {\"split_mode\": \"%s\", \"n_devices\": %d, \"n_ctx\": %lld, \"planned\": %s",
               loom_split_mode_name(c[i].mode), c[i].n_devices, (long long)c[i].n_ctx,
               c[i].ok ? "true" : "false");
        if (c[i].ok) {
            printf(", \"fits\": %s, \"bytes_per_device\": {\"weights\": %.0f, \"kv\": %.0f, "
                   "\"compute\": %.0f}, \"device_memory\": %zu, \"host_bytes\": %.0f, "
                   "\"pp_tps\": %.3f, \"tg_tps\": %.3f",
                   c[i].fits ? "true" : "false", c[i].weights, c[i].kv, c[i].compute, dev_mem,
                   c[i].host, c[i].pp_tps, c[i].tg_tps);
        } else {
            printf(", \"fits\": false, \"error\": \"");
            for (const char *p = c[i].err; *p; p++)
                printf(*p == '"' || *p == '\\'    ? "\\%c"
                       : (unsigned char)*p < 0x20 ? "?"
                                                  : "%c",
                       *p);
            printf("\"");
        }
        printf(", \"best\": %s", i == best ? "true" : "false");
        if (max_ctx[i] >= 0) printf(", \"max_ctx\": %lld", (long long)max_ctx[i]);
        printf("}%s\n", i + 1 < n ? "," : "");
    }
    printf("]\n");
}

/* The largest context (a multiple of 256, at least 256) at which candidate c fits, by
 * bisection over real plans; 0 when even the smallest does not. */
static int64_t largest_ctx(const loom_gguf *g, const loom_plan_opts *o,
                           const loom_plan_candidate *c) {
    int64_t lo = 0, hi = c->n_ctx / 256; /* in units of 256: lo fits (0 = none), hi does not */
    loom_plan_candidate t;
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        loom_plan_candidate_eval(g, o, c->mode, c->n_devices, mid * 256, &t);
        if (t.ok && t.fits)
            lo = mid;
        else
            hi = mid;
    }
    if (lo == 0 && hi >= 1) {
        loom_plan_candidate_eval(g, o, c->mode, c->n_devices, 256, &t);
        if (t.ok && t.fits) lo = 1;
    }
    return lo * 256;
}

int loom_cli_plan(int argc, char **argv) {
    const char *path = NULL, *devices = "sim:8,profile=h100-sxm,link=nvlink4", *rules = NULL;
    char pbuf[4096], rbuf[4096];
    long n_ctx = 0, n_batch = 512;
    bool json = false;
    loom_type kv_type = LOOM_TYPE_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            if (!(path = loom_cli_path(v, pbuf, sizeof pbuf))) return 2;
            i++;
        } else if ((!strcmp(a, "--devices") || !strcmp(a, "-dev") || !strcmp(a, "--device")) && v) {
            devices = v;
            i++;
        } else if (!strcmp(a, "--split-rules") && v) {
            if (!(rules = loom_cli_path(v, rbuf, sizeof rbuf))) return 2;
            i++;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && v) {
            int x;
            if (!loom_cli_parse_int("plan", a, v, 2, 1 << 24, &x)) return 2;
            n_ctx = x;
            i++;
        } else if ((!strcmp(a, "-b") || !strcmp(a, "--batch-size")) && v) {
            int x;
            if (!loom_cli_parse_int("plan", a, v, 1, 1 << 20, &x)) return 2;
            n_batch = x;
            i++;
        } else if ((!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) && v) {
            if (!loom_model_cli_kv_type("plan", a, v, &kv_type)) return 2;
            i++;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && v) {
            if (!strcmp(v, "json"))
                json = true;
            else if (strcmp(v, "table")) {
                fprintf(stderr, "loom plan: %s '%s' (table or json)\n", a, v);
                return 2;
            }
            i++;
        } else {
            bool known = false;
            for (const char *const *n = plan_names; *n && !known; n++)
                known = !strcmp(a, *n);
            if (known)
                fprintf(stderr, "loom plan: %s needs a value\n", a);
            else
                loom_cli_unknown_option("plan", a, plan_names, NULL);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "loom plan: no model given (-m FILE; see loom plan --help)\n");
        return 2;
    }
    loom_sim_config cfg;
    if (strncasecmp(devices, "sim", 3) != 0) {
        fprintf(stderr,
                "loom plan: --devices %s: plans are made on sim device profiles "
                "(--devices sim:N,profile=NAME[,link=PRESET])\n",
                devices);
        return 2;
    }
    if (loom_sim_config_parse(devices, &cfg)) {
        fprintf(stderr, "loom plan: %s\n", loom_last_error());
        return 2;
    }
    if (!cfg.profile[0]) {
        fprintf(stderr,
                "loom plan: --devices %s has no profile= (a projection needs the GPU's figures; "
                "profiles:",
                devices);
        for (int i = 0; i < loom_sim_profile_count(); i++)
            fprintf(stderr, " %s", loom_sim_profile_get(i)->name);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (cfg.n_devices > 16) {
        fprintf(stderr, "loom plan: --devices %s: at most 16 devices\n", devices);
        return 2;
    }
    const char *comma = strchr(devices, ',');
    loom_plan_opts o = {.spec_opts = comma ? comma + 1 : "",
                        .dev_mem = cfg.mem_bytes,
                        .p2p = cfg.p2p,
                        .n_batch = n_batch,
                        .kv_type = kv_type,
                        .split_rules = rules};
    loom_gguf *g = NULL;
    if (loom_gguf_open_header(path, &g)) {
        fprintf(stderr, "loom plan: %s\n", loom_last_error());
        return 1;
    }
    loom_hparams hp;
    if (loom_hparams_from_gguf(g, &hp)) {
        fprintf(stderr, "loom plan: %s\n", loom_last_error());
        loom_gguf_free(g);
        return 1;
    }
    int64_t ctx =
        n_ctx > 0 ? n_ctx : (hp.n_ctx_train > 0 && hp.n_ctx_train < 2048 ? hp.n_ctx_train : 2048);

    /* candidates: 1 device; tensor over 2, 4, 8 and N; layer over the same */
    loom_plan_candidate c[12];
    int64_t max_ctx[12];
    int n = 0;
    int counts[5], n_counts = 0;
    for (int k = 2; k <= 8; k *= 2)
        if (k <= cfg.n_devices) counts[n_counts++] = k;
    if (cfg.n_devices > 1 && (cfg.n_devices & (cfg.n_devices - 1)))
        counts[n_counts++] = cfg.n_devices;
    loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_NONE, 1, ctx, &c[n++]);
    for (int k = 0; k < n_counts; k++)
        loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_TENSOR, counts[k], ctx, &c[n++]);
    for (int k = 0; k < n_counts; k++)
        loom_plan_candidate_eval(g, &o, LOOM_SPLIT_MODE_LAYER, counts[k], ctx, &c[n++]);
    int best = -1, n_ok = 0;
    for (int i = 0; i < n; i++) {
        max_ctx[i] = -1;
        n_ok += c[i].ok;
        if (c[i].ok && c[i].fits && (best < 0 || c[i].tg_tps > c[best].tg_tps)) best = i;
    }
    if (n_ok == 0) {
        fprintf(stderr, "loom plan: no configuration could be planned: %s\n", c[0].err);
        loom_gguf_free(g);
        return 1;
    }
    int widest = -1; /* when nothing fits: the largest context of each candidate */
    if (best < 0)
        for (int i = 0; i < n; i++)
            if (c[i].ok) {
                max_ctx[i] = largest_ctx(g, &o, &c[i]);
                if (widest < 0 || max_ctx[i] > max_ctx[widest]) widest = i;
            }
    if (json) {
        print_json(c, n, best, max_ctx, o.dev_mem);
    } else {
        char mem[32];
        mib(mem, sizeof mem, (double)o.dev_mem);
        printf("plan: %s (%s, %lld layers), context %lld, batch %ld, KV %s\n"
               "devices: up to %d x %s (%s each), link %s (%.0f GB/s, %.1f us%s)\n"
               "bytes per device are those of a real run (the fullest device); speeds are "
               "projections (docs/projection.md)\n",
               path, hp.arch, (long long)hp.n_layer, (long long)ctx, n_batch,
               loom_type_name(kv_type), cfg.n_devices, cfg.profile, mem, cfg.link_name,
               cfg.link.bandwidth_gbps, cfg.link.latency_us, cfg.p2p ? ", P2P" : ", no P2P");
        print_table(c, n, best);
        if (best >= 0) {
            printf("best: %s over %d device%s: %.2f tokens/s generation, %.1f tokens/s prompt\n",
                   loom_split_mode_name(c[best].mode), c[best].n_devices,
                   c[best].n_devices > 1 ? "s" : "", c[best].tg_tps, c[best].pp_tps);
        } else if (widest >= 0 && max_ctx[widest] > 0) {
            printf("nothing fits at context %lld; the largest context that fits: %lld (%s over "
                   "%d devices)\n",
                   (long long)ctx, (long long)max_ctx[widest], loom_split_mode_name(c[widest].mode),
                   c[widest].n_devices);
        } else {
            printf("nothing fits at any context: the weights alone exceed %s per device\n", mem);
        }
    }
    loom_gguf_free(g);
    return 0;
}
