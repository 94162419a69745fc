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

void loom_plan_session_host_bytes(loom_session *s, double *weights, double *kv, double *compute) {
    loom_cli_mem_row rows[LOOM_META_MAX_DEVICES + 2];
    int n = loom_cli_session_memory(s, rows, LOOM_META_MAX_DEVICES + 2);
    *weights = *kv = *compute = 0;
    for (int i = 0; i < n; i++)
        if (!rows[i].dev) {
            *weights += rows[i].weights;
            *kv += rows[i].kv;
            *compute += rows[i].compute;
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
    sp.kv_type_v_set = o->kv_type_v_set;
    sp.kv_type_v = o->kv_type_v;
    sp.split_rules = o->split_rules;
    sp.no_weight_data = true;
    if (o->tensor_split && o->n_tensor_split > 0) {
        sp.tensor_split = o->tensor_split;
        sp.n_tensor_split = o->n_tensor_split < n_devices ? o->n_tensor_split : n_devices;
    }
    loom_session *s = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    if (o->host_layers > 0) {
        loom_hparams hp;
        if (loom_hparams_from_gguf(g, &hp)) goto fail;
        sp.n_gpu_layers = (int)hp.n_layer - o->host_layers;
        if (sp.n_gpu_layers < 0) sp.n_gpu_layers = 0;
        out->host_layers = (int)hp.n_layer - sp.n_gpu_layers;
        /* the hybrid: nothing is evaluated (host layers would compute on the CPU); the
         * session's own reserve at creation is its worst case (issue 9) */
        if (loom_session_new(NULL, g, &sp, &s)) goto fail;
        goto bytes;
    }
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
    for (int j = 0; j < loom_session_n_devices(s) && j < 16; j++) {
        loom_sim_stats st;
        loom_sim_dev_stats(loom_session_device(s, j), &st);
        out->growth[j] = -(double)st.mem_used;
    }
    if (loom_session_eval(s, ids, n_prompt, false, logits)) goto fail;
    out->pp_us = loom_plan_session_time_us(s);
    if (loom_session_n_past(s) < loom_session_n_ctx(s)) {
        if (loom_session_eval(s, ids, 1, false, logits)) goto fail;
        out->tg_us = loom_plan_session_time_us(s);
    }
    loom_session_stats ss;
    loom_session_get_stats(s, &ss);
    out->pp_nodes = n_prompt > 1 ? ss.prompt_nodes : ss.gen_nodes;
    out->tg_nodes = ss.gen_nodes;
    for (int j = 0; j < loom_session_n_devices(s) && j < 16; j++) {
        loom_sim_stats st;
        loom_sim_dev_stats(loom_session_device(s, j), &st);
        out->growth[j] += (double)st.mem_used;
    }
    out->pp_tps = out->pp_us > 0 ? (double)n_prompt / (out->pp_us * 1e-6) : 0;
    out->tg_tps = out->tg_us > 0 ? 1.0 / (out->tg_us * 1e-6) : 0;
bytes:
    loom_plan_session_bytes(s, &out->weights, &out->kv, &out->compute, &out->host, out->dev_total,
                            16);
    loom_plan_session_host_bytes(s, &out->host_weights, &out->host_kv, &out->host_compute);
    if (out->host_layers > 0 && o->dev_growth) {
        /* what the evaluation the hybrid skips would add (the reducer's scratch) */
        double fullest = -1;
        for (int j = 0; j < n_devices && j < 16; j++) {
            out->dev_total[j] += o->dev_growth[j];
            if (out->dev_total[j] > fullest) fullest = out->dev_total[j];
        }
        out->compute = fullest - out->weights - out->kv;
    }
    out->fits = out->weights + out->kv + out->compute <= (double)o->dev_mem;
    if (out->host_layers > 0 && o->host_mem > 0 && out->host > (double)o->host_mem)
        out->fits = false;
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

/* ---------------------------------------------------------------- the hybrid */

/* Bytes and elements of the weights kept in host memory by a hybrid with host_layers
 * layers there: the first host_layers blocks and the output (output.weight, or the token
 * embeddings it is tied to), as the session places them. */
static void host_weights(const loom_gguf *g, int host_layers, double *bytes, double *elems,
                         bool *quant) {
    *bytes = *elems = 0;
    *quant = false;
    bool has_output = loom_gguf_find_tensor(g, "output.weight") >= 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        const char *name = loom_gguf_tensor_name(g, i);
        bool host = strncmp(name, "blk.", 4) == 0 ? atoi(name + 4) < host_layers
                    : has_output
                        ? strncmp(name, "output", 6) == 0
                        : strcmp(name, "token_embd.weight") == 0 || strncmp(name, "output", 6) == 0;
        if (!host) continue;
        int64_t ne[LOOM_MAX_DIMS];
        loom_gguf_tensor_ne(g, i, ne);
        double n = 1;
        for (int d = 0; d < loom_gguf_tensor_n_dims(g, i); d++)
            n *= (double)ne[d];
        *bytes += (double)loom_gguf_tensor_size(g, i);
        *elems += n;
        if (loom_blck_size(loom_gguf_tensor_type(g, i)) > 1) *quant = true;
    }
}

double loom_plan_host_time_us(const loom_gguf *g, const loom_plan_opts *o, int host_layers,
                              int64_t n_tokens, double n_ops) {
    const loom_sim_profile *hp = NULL;
    if (loom_sim_profile_find("host", &hp)) return 0;
    double bytes, elems;
    bool quant;
    host_weights(g, host_layers, &bytes, &elems, &quant);
    const double eff = hp->efficiency > 0 && hp->efficiency <= 1 ? hp->efficiency : 1.0;
    const double flops = 2.0 * elems * (double)n_tokens; /* one multiply-add per weight */
    double tput = (quant ? hp->int8_tops : hp->fp16_tflops) * 1e12;
    double t_mem = bytes / (hp->hbm_gbps * 1e9), t_flop = flops / tput;
    double cpu = (t_mem > t_flop ? t_mem : t_flop) / eff * 1e6 + n_ops * hp->launch_us;
    if (n_tokens >= 32 && o->link_gbps > 0) {
        /* op offload: the host weights staged to a device over the link, computed there;
         * the device's throughput is that of the GPU profile */
        char name[24] = "";
        const char *p = o->spec_opts ? strstr(o->spec_opts, "profile=") : NULL;
        if (p) {
            size_t n = strcspn(p + 8, ",");
            snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1),
                     p + 8);
        }
        const loom_sim_profile *gp = NULL;
        if (name[0] && loom_sim_profile_find(name, &gp) == LOOM_OK) {
            double gt = (quant ? gp->int8_tops : gp->fp16_tflops) * 1e12;
            double staged = o->link_us + bytes / (o->link_gbps * 1e9) * 1e6 +
                            flops / gt / (gp->efficiency > 0 ? gp->efficiency : 1.0) * 1e6 +
                            n_ops * gp->launch_us;
            if (staged < cpu) cpu = staged;
        }
    }
    return cpu;
}

void loom_plan_hybrid_eval(const loom_gguf *g, const loom_plan_opts *o, int n_devices,
                           int64_t n_ctx, const loom_plan_candidate *all_on_devices,
                           loom_plan_candidate *out) {
    const loom_split_mode mode = n_devices > 1 ? LOOM_SPLIT_MODE_TENSOR : LOOM_SPLIT_MODE_NONE;
    loom_hparams hp;
    if (loom_hparams_from_gguf(g, &hp)) {
        memset(out, 0, sizeof *out);
        out->mode = mode;
        out->n_devices = n_devices;
        snprintf(out->err, sizeof out->err, "%s", loom_last_error());
        return;
    }
    const int L = (int)hp.n_layer;
    loom_plan_opts h = *o;
    if (all_on_devices && all_on_devices->ok) h.dev_growth = all_on_devices->growth;
    /* fits is monotone in the host layers: bisect for the fewest (lo does not fit, hi is
     * the candidate: at most L - 1, so at least one layer stays on the devices; when even
     * that does not fit, the plan of L - 1 says so) */
    int lo = 0, hi = L - 1 > 1 ? L - 1 : 1;
    loom_plan_candidate t;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        h.host_layers = mid;
        loom_plan_candidate_eval(g, &h, mode, n_devices, n_ctx, &t);
        if (t.ok && t.fits)
            hi = mid;
        else
            lo = mid;
    }
    h.host_layers = hi;
    loom_plan_candidate_eval(g, &h, mode, n_devices, n_ctx, out);
    if (!out->ok) return;
    /* times, from the model: the devices' share of the all-on-devices run, the host part,
     * and the activations crossing (to the devices after the host layers, back for the
     * output) */
    const double dev_frac = (double)(L - out->host_layers) / (double)L;
    int64_t n_prompt = o->n_batch < n_ctx ? o->n_batch : n_ctx - 1;
    if (n_prompt < 1) n_prompt = 1;
    double xfer_pp = 0, xfer_tg = 0;
    if (o->link_gbps > 0) {
        double row = (double)hp.n_embd * 4.0;
        xfer_pp = 2.0 * (o->link_us + row * (double)n_prompt / (o->link_gbps * 1e9) * 1e6);
        xfer_tg = 2.0 * (o->link_us + row / (o->link_gbps * 1e9) * 1e6);
    }
    if (all_on_devices && all_on_devices->ok && all_on_devices->pp_us > 0) {
        const double host_frac = (double)out->host_layers / (double)L;
        out->pp_us = all_on_devices->pp_us * dev_frac +
                     loom_plan_host_time_us(g, o, out->host_layers, n_prompt,
                                            all_on_devices->pp_nodes * host_frac) +
                     xfer_pp;
        out->tg_us = all_on_devices->tg_us * dev_frac +
                     loom_plan_host_time_us(g, o, out->host_layers, 1,
                                            all_on_devices->tg_nodes * host_frac) +
                     xfer_tg;
        out->pp_tps = (double)n_prompt / (out->pp_us * 1e-6);
        out->tg_tps = out->tg_us > 0 ? 1.0 / (out->tg_us * 1e-6) : 0;
    }
}

/* ---------------------------------------------------------------- the command */

static void usage(FILE *f) {
    fprintf(f, "usage: loom plan -m FILE --devices sim:N,profile=NAME[,link=PRESET] [-c CTX] "
               "[-b BATCH] [-ctk T] [-ctv T] [-ts LIST] [-o table|json]\n\n"
               "Plans a GGUF model from its header alone (no weight data is read): for one\n"
               "device, tensor parallelism over 2, 4, 8 devices (up to N) and layer split, the\n"
               "bytes per device (weights, KV cache, compute buffers), whether it fits, and\n"
               "projected prompt (pp) and generation (tg) tokens/s under sim's timing model.\n"
               "When nothing fits the devices alone: the hybrid, the fewest layers kept in\n"
               "host memory (-ngl style) under the \"host\" CPU profile.\n\n"
               "  -m, --model FILE          GGUF file (its tensor data may be absent)\n"
               "  -dev, --devices SPEC      sim:N with profile= (and link=, mem=): the largest\n"
               "                            device count to consider; default "
               "sim:8,profile=h100-sxm,link=nvlink4; without profile= the fit\n"
               "                            alone (bytes per device), no speed\n"
               "  -c, --ctx-size N          context (KV cache) length (default: min(train, 2048))\n"
               "  -b, --batch-size N        prompt tokens per graph (default 512)\n"
               "  -ctk, --cache-type-k T    K cache type: f16 (default), f32, bf16, q8_0, q4_0,\n"
               "                            q4_1, q5_0, q5_1, iq4_nl (as in loom run: -ctk\n"
               "                            alone leaves V at f32)\n"
               "  -ctv, --cache-type-v T    V cache type, the same types\n"
               "  -ts, --tensor-split LIST  per-device proportions, e.g. 3,1 (as in loom run)\n"
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

static const char *const plan_names[] = {"-h",
                                         "--help",
                                         "-m",
                                         "--model",
                                         "--devices",
                                         "-dev",
                                         "--device",
                                         "-c",
                                         "--ctx-size",
                                         "-b",
                                         "--batch-size",
                                         "-ctk",
                                         "--cache-type-k",
                                         "-o",
                                         "--output",
                                         "--split-rules",
                                         "-ctv",
                                         "--cache-type-v",
                                         "-ts",
                                         "--tensor-split",
                                         NULL};

static void mib(char *buf, size_t n, double b) {
    loom_cli_format_bytes(buf, n, b);
}

static void print_table(const loom_plan_candidate *c, int n, int best, bool speed) {
    printf("  %-7s %7s %11s %11s %11s %11s %5s %10s %10s\n", "split", "devices", "weights",
           "KV cache", "compute", "total", "fits", "pp t/s", "tg t/s");
    for (int i = 0; i < n; i++) {
        char devs[24];
        if (c[i].host_layers > 0)
            snprintf(devs, sizeof devs, "%d+host", c[i].n_devices);
        else
            snprintf(devs, sizeof devs, "%d", c[i].n_devices);
        const char *split = c[i].host_layers > 0 ? "hybrid" : loom_split_mode_name(c[i].mode);
        if (!c[i].ok) {
            printf("  %-7s %7s  not planned: %s\n", split, devs, c[i].err);
            continue;
        }
        char w[32], k[32], cp[32], t[32];
        mib(w, sizeof w, c[i].weights);
        mib(k, sizeof k, c[i].kv);
        mib(cp, sizeof cp, c[i].compute);
        mib(t, sizeof t, c[i].weights + c[i].kv + c[i].compute);
        char pp[32] = "-", tg[32] = "-"; /* no profile: no speed */
        if (speed) {
            snprintf(pp, sizeof pp, "%.1f", c[i].pp_tps);
            snprintf(tg, sizeof tg, "%.2f", c[i].tg_tps);
        }
        printf("  %-7s %7s %11s %11s %11s %11s %5s %10s %10s%s\n", split, devs, w, k, cp, t,
               c[i].fits ? "yes" : "no", pp, tg, i == best ? "  <- best" : "");
        if (c[i].host_layers > 0) {
            mib(w, sizeof w, c[i].host_weights);
            mib(k, sizeof k, c[i].host_kv);
            mib(cp, sizeof cp, c[i].host_compute);
            mib(t, sizeof t, c[i].host);
            printf("  %-7s %7s %11s %11s %11s %11s  (%d of the layers and the output in host "
                   "memory)\n",
                   "", "host", w, k, cp, t, c[i].host_layers);
        }
    }
}

static void print_json(const loom_plan_candidate *c, int n, int best, const int64_t *max_ctx,
                       size_t dev_mem, bool speed) {
    printf("[\n");
    for (int i = 0; i < n; i++) {
        printf("  {\"split_mode\": \"%s\", \"n_devices\": %d, \"n_ctx\": %lld, \"planned\": %s",
               loom_split_mode_name(c[i].mode), c[i].n_devices, (long long)c[i].n_ctx,
               c[i].ok ? "true" : "false");
        printf(", \"hybrid\": %s, \"host_layers\": %d", c[i].host_layers > 0 ? "true" : "false",
               c[i].host_layers);
        if (c[i].ok) {
            printf(", \"fits\": %s, \"bytes_per_device\": {\"weights\": %.0f, \"kv\": %.0f, "
                   "\"compute\": %.0f}, \"device_memory\": %zu, \"host_bytes\": %.0f, "
                   "\"pp_tps\": ",
                   c[i].fits ? "true" : "false", c[i].weights, c[i].kv, c[i].compute, dev_mem,
                   c[i].host);
            if (speed) /* null without a profile: no speed was projected */
                printf("%.3f, \"tg_tps\": %.3f", c[i].pp_tps, c[i].tg_tps);
            else
                printf("null, \"tg_tps\": null");
            printf(", \"host\": {\"weights\": %.0f, \"kv\": %.0f, \"compute\": %.0f}, "
                   "\"device_totals\": [",
                   c[i].host_weights, c[i].host_kv, c[i].host_compute);
            for (int j = 0; j < c[i].n_devices && j < 16; j++)
                printf("%s%.0f", j ? ", " : "", c[i].dev_total[j]);
            printf("]");
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
    bool json = false;
    /* -m, -dev, -c, -b, -ctk, -ctv, -ts, --split-rules: the shared parser's (the same values
     * and errors as loom run's) */
    loom_model_opts mo;
    loom_model_opts_init(&mo);
    mo.n_batch = 512; /* plan's default batch */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = loom_model_opts_parse_only(&mo, "plan", plan_names, argc, argv, &i))) {
            if (r < 0) return 2;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && v) {
            if (!strcmp(v, "json"))
                json = true;
            else if (strcmp(v, "table")) {
                fprintf(stderr, "loom plan: %s '%s' (table or json)\n", a, v);
                return 2;
            }
            i++;
        } else {
            loom_cli_bad_option("plan", a, plan_names, NULL);
            return 2;
        }
    }
    const char *path = mo.model, *rules = mo.sp.split_rules, *ts = mo.tensor_split;
    const char *devices = mo.sp.devices ? mo.sp.devices : "sim:8,profile=h100-sxm,link=nvlink4";
    const int64_t n_ctx = mo.sp.n_ctx, n_batch = mo.n_batch;
    if (!path) {
        fprintf(stderr, "loom plan: no model given (-m FILE; see loom plan --help)\n");
        return 2;
    }
    if (n_ctx == 1) { /* a plan times a prompt token and a generated one */
        fprintf(stderr, "loom plan: -c 1: a plan needs a context of at least 2\n");
        return 2;
    }
    /* -ctk/-ctv/-ts: checked together as loom run does */
    bool parsed = loom_model_opts_finish(&mo, "plan");
    loom_model_opts_free(&mo); /* keeps the parsed values (mo.sp, mo.ts) */
    if (!parsed) return 2;
    const loom_type kv_type = mo.sp.kv_type, kv_type_v = mo.sp.kv_type_v;
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
    /* without profile= the plan answers the fit alone: a speed needs the GPU's figures */
    const bool speed = cfg.profile[0] != 0;
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
                        .split_rules = rules,
                        .kv_type_v_set = true,
                        .kv_type_v = kv_type_v,
                        .tensor_split = ts ? mo.ts : NULL,
                        .n_tensor_split = ts ? mo.sp.n_tensor_split : 0,
                        .link_gbps = cfg.link.bandwidth_gbps,
                        .link_us = cfg.link.latency_us};
    const loom_sim_profile *host_profile = NULL;
    if (loom_sim_profile_find("host", &host_profile) == LOOM_OK)
        o.host_mem = host_profile->mem_bytes;
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
    int64_t ctx = loom_session_ctx_for(&hp, n_ctx);
    /* -c 0 takes the file's training context, which no option bounds: the same limit as -c */
    if (ctx > (1 << 24)) {
        fprintf(stderr,
                "loom plan: -c 0: the model's training context (%s.context_length) is %lld, "
                "more than the %d positions a plan takes; give -c N\n",
                hp.arch, (long long)ctx, 1 << 24);
        loom_gguf_free(g);
        return 2;
    }

    /* candidates: 1 device; tensor over 2, 4, 8 and N; layer over the same */
    loom_plan_candidate c[13];
    int64_t max_ctx[13];
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
        /* the fastest that fits; without a speed, the first (the fewest devices) */
        if (c[i].ok && c[i].fits && (best < 0 || (speed && c[i].tg_tps > c[best].tg_tps))) best = i;
    }
    const int n_gpu_only = n;
    if (best < 0 && n_ok > 0 && hp.n_layer > 1) {
        /* the hybrid where it applies: the devices alone do not hold the model; tensor over
         * all of them (or the one), the fewest layers in host memory that make it fit */
        const int nd = cfg.n_devices;
        const loom_plan_candidate *all = &c[0];
        for (int i = 0; i < n; i++)
            if (c[i].mode == (nd > 1 ? LOOM_SPLIT_MODE_TENSOR : LOOM_SPLIT_MODE_NONE) &&
                c[i].n_devices == nd)
                all = &c[i];
        loom_plan_hybrid_eval(g, &o, nd, ctx, all, &c[n]);
        max_ctx[n] = -1;
        if (c[n].ok && c[n].fits) best = n;
        n++;
    }
    if (n_ok == 0) {
        fprintf(stderr, "loom plan: no configuration could be planned: %s\n", c[0].err);
        loom_gguf_free(g);
        return 1;
    }
    int widest = -1; /* when nothing fits the devices alone: the largest context of each */
    if (best < 0 || best >= n_gpu_only)
        for (int i = 0; i < n_gpu_only; i++)
            if (c[i].ok) {
                max_ctx[i] = largest_ctx(g, &o, &c[i]);
                if (widest < 0 || max_ctx[i] > max_ctx[widest]) widest = i;
            }
    if (json) {
        print_json(c, n, best, max_ctx, o.dev_mem, speed);
    } else {
        char mem[32];
        mib(mem, sizeof mem, (double)o.dev_mem);
        printf("plan: %s (%s, %lld layers), context %lld, batch %lld, KV %s/%s%s%s\n"
               "devices: up to %d x %s (%s each), link %s (%.0f GB/s, %.1f us%s)\n"
               "bytes per device are those of a real run (the fullest device); %s\n",
               path, hp.arch, (long long)hp.n_layer, (long long)ctx, (long long)n_batch,
               loom_type_name(kv_type), loom_type_name(kv_type_v), ts ? ", -ts " : "", ts ? ts : "",
               cfg.n_devices, speed ? cfg.profile : "sim", mem, cfg.link_name,
               cfg.link.bandwidth_gbps, cfg.link.latency_us, cfg.p2p ? ", P2P" : ", no P2P",
               speed ? "speeds are projections (docs/projection.md)"
                     : "no speed: --devices has no profile= (a projection needs the GPU's "
                       "figures: sim:N,profile=NAME; loom plan --help lists them)");
        print_table(c, n, best, speed);
        if (widest >= 0 && max_ctx[widest] > 0)
            printf("nothing fits the devices alone at context %lld; the largest context that "
                   "fits: %lld (%s over %d devices)\n",
                   (long long)ctx, (long long)max_ctx[widest], loom_split_mode_name(c[widest].mode),
                   c[widest].n_devices);
        else if (widest >= 0)
            printf("nothing fits the devices alone at any context: the weights alone exceed %s "
                   "per device\n",
                   mem);
        if (n > n_gpu_only && best < n_gpu_only)
            printf("the hybrid does not fit either: %s\n",
                   c[n - 1].ok ? "the devices' part or the host's memory is too small"
                               : c[n - 1].err);
        char sp_txt[96] = "";
        if (best >= 0 && speed)
            snprintf(sp_txt, sizeof sp_txt, ": %.2f tokens/s generation, %.1f tokens/s prompt",
                     c[best].tg_tps, c[best].pp_tps);
        if (best >= n_gpu_only) {
            printf("%s: hybrid, %d of %lld layers on %d device%s (%s), %d and the output in host "
                   "memory%s\n",
                   speed ? "best" : "fits", (int)hp.n_layer - c[best].host_layers,
                   (long long)hp.n_layer, c[best].n_devices, c[best].n_devices > 1 ? "s" : "",
                   loom_split_mode_name(c[best].mode), c[best].host_layers, sp_txt);
        } else if (best >= 0) {
            printf("%s: %s over %d device%s%s\n", speed ? "best" : "fits on the fewest devices",
                   loom_split_mode_name(c[best].mode), c[best].n_devices,
                   c[best].n_devices > 1 ? "s" : "", sp_txt);
        }
    }
    loom_gguf_free(g);
    return 0;
}
