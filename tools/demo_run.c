/*
 * Runs the demo model on the CPU backend (one graph: the reference) and split by hand over
 * devices (one graph per stage, activations copied device to device, ordered by events).
 * See demo_run.h.
 */
#include "tools/demo_run.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static double ms_since(int64_t t0_ns) {
    return (double)(loom_time_ns() - t0_ns) * 1e-6;
}

/* The status of the last recorded error, or `fallback` when none was recorded. */
static loom_status last_or(loom_status fallback) {
    loom_status s = loom_last_status();
    return s != LOOM_OK ? s : fallback;
}

/* ---------------------------------------------------------------- CPU reference */

loom_status loom_demo_run_cpu(const loom_demo_hparams *hp, int n_threads, float *out,
                              loom_demo_report *rep) {
    loom_status st = loom_demo_hparams_check(hp);
    if (st != LOOM_OK) return st;
    const int nst = loom_demo_n_stages(hp);
    const size_t x_bytes = sizeof(float) * (size_t)hp->n_embd * (size_t)hp->n_tokens;
    loom_ctx_params cp = {.mem_size = loom_demo_stage_ctx_size() * (size_t)nst, .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    if (!ctx) return last_or(LOOM_ERR_NOMEM);
    loom_backend_t be = NULL;
    loom_buffer_t buf = NULL;
    float *x_host = NULL;
    loom_demo_layer layers[2 * LOOM_DEMO_MAX_LAYERS];
    loom_demo_inputs in;

    /* one graph: every stage reads the previous stage's output; pos and mask shared */
    if ((st = loom_demo_stage_inputs_new(ctx, hp, 0, &in)) != LOOM_OK) goto done;
    loom_tensor *x = in.x;
    for (int s = 0; s < nst; s++) {
        if ((st = loom_demo_stage_weights_new(ctx, hp, s, &layers[s])) != LOOM_OK) goto done;
        x = loom_demo_stage_build(ctx, hp, s, &layers[s], &in, x);
    }
    if (!x) {
        st = last_or(LOOM_ERR_INTERNAL);
        goto done;
    }
    loom_set_output(x);
    loom_graph *g = loom_graph_new(ctx, LOOM_DEFAULT_GRAPH_SIZE);
    if (!g) {
        st = last_or(LOOM_ERR_NOMEM);
        goto done;
    }
    if ((st = loom_graph_build_forward(g, x)) != LOOM_OK) goto done;

    be = loom_cpu_backend_new(n_threads);
    if (!be) {
        st = last_or(LOOM_ERR_DEVICE);
        goto done;
    }
    buf = loom_alloc_ctx_tensors(ctx, loom_backend_default_buft(be));
    if (!buf) {
        st = last_or(LOOM_ERR_NOMEM);
        goto done;
    }
    for (int s = 0; s < nst; s++)
        if ((st = loom_demo_stage_weights_upload(hp, s, &layers[s])) != LOOM_OK) goto done;
    if ((st = loom_demo_stage_inputs_upload(hp, &in)) != LOOM_OK) goto done;
    x_host = loom_malloc(x_bytes);
    if (!x_host) {
        st = loom_error(LOOM_ERR_NOMEM, "demo: no host memory for the input");
        goto done;
    }
    loom_demo_input_values(hp, x_host);
    loom_tensor_set(in.x, x_host, 0, x_bytes);

    /* a first run pays for thread start-up and first touches; the second is timed */
    if ((st = loom_backend_graph_compute(be, g)) != LOOM_OK) goto done;
    int64_t t0 = loom_time_ns();
    if ((st = loom_backend_graph_compute(be, g)) != LOOM_OK) goto done;
    if (rep) {
        rep->cpu_ms = ms_since(t0);
        rep->cpu_nodes = g->n_nodes;
        rep->cpu_threads = n_threads > 0 ? n_threads : loom_n_cpus();
    }
    loom_tensor_get(x, out, 0, x_bytes);

done:
    loom_free(x_host);
    loom_buffer_free(buf);
    loom_backend_free(be);
    loom_ctx_free(ctx);
    return st;
}

/* ---------------------------------------------------------------- devices, by hand */

typedef struct stage_rt {
    int dev;           /* index into devs */
    loom_ctx *ctx;     /* headers of weights, inputs and ops */
    loom_buffer_t buf; /* all of them, in the device's buffer type */
    loom_graph *g;
    loom_demo_layer w;
    loom_demo_inputs in;
    loom_tensor *out;   /* [n_embd, T] */
    loom_event_t ready; /* recorded after this stage's graph, when the next is elsewhere */
} stage_rt;

static void stats_delta(const loom_sim_stats *a, const loom_sim_stats *b, loom_sim_stats *d) {
    d->bytes_in = b->bytes_in - a->bytes_in;
    d->bytes_out = b->bytes_out - a->bytes_out;
    d->copies = b->copies - a->copies;
    d->graphs = b->graphs - a->graphs;
    d->nodes = b->nodes - a->nodes;
    d->link_time_us = b->link_time_us - a->link_time_us;
    d->mem_used = b->mem_used;
    d->mem_peak = b->mem_peak;
}

static loom_status build_stage(const loom_demo_hparams *hp, int s, loom_dev_t dev, stage_rt *rt) {
    loom_status st;
    loom_ctx_params cp = {.mem_size = loom_demo_stage_ctx_size(), .no_alloc = true};
    rt->ctx = loom_ctx_new(cp);
    if (!rt->ctx) return last_or(LOOM_ERR_NOMEM);
    if ((st = loom_demo_stage_weights_new(rt->ctx, hp, s, &rt->w)) != LOOM_OK) return st;
    if ((st = loom_demo_stage_inputs_new(rt->ctx, hp, s, &rt->in)) != LOOM_OK) return st;
    rt->out = loom_demo_stage_build(rt->ctx, hp, s, &rt->w, &rt->in, rt->in.x);
    if (!rt->out) return last_or(LOOM_ERR_INTERNAL);
    loom_set_output(rt->out);
    rt->g = loom_graph_new(rt->ctx, LOOM_DEFAULT_GRAPH_SIZE);
    if (!rt->g) return last_or(LOOM_ERR_NOMEM);
    if ((st = loom_graph_build_forward(rt->g, rt->out)) != LOOM_OK) return st;
    for (int i = 0; i < rt->g->n_nodes; i++) {
        const loom_tensor *node = rt->g->nodes[i];
        if (!loom_op_is_view(node->op) && !loom_dev_supports_op(dev, node))
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "demo: device %s does not support %s (node %s of stage %d)",
                              loom_dev_name(dev), loom_op_name(node->op), node->name, s);
    }
    rt->buf = loom_alloc_ctx_tensors(rt->ctx, loom_dev_buffer_type(dev));
    if (!rt->buf) {
        st = last_or(LOOM_ERR_DEVICE_OOM);
        return loom_error(st, "demo: cannot allocate stage %d on %s: %s", s, loom_dev_name(dev),
                          loom_last_error());
    }
    if ((st = loom_demo_stage_weights_upload(hp, s, &rt->w)) != LOOM_OK) return st;
    return loom_demo_stage_inputs_upload(hp, &rt->in);
}

loom_status loom_demo_run_devices(const loom_demo_hparams *hp, loom_dev_t *devs, int n, float *out,
                                  loom_demo_report *rep) {
    loom_status st = loom_demo_hparams_check(hp);
    if (st != LOOM_OK) return st;
    if (n < 1 || n > LOOM_DEMO_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: %d devices (need 1..%d)", n,
                          LOOM_DEMO_MAX_DEVICES);
    const int nst = loom_demo_n_stages(hp);
    const int n_used = n < nst ? n : nst;
    const size_t x_bytes = sizeof(float) * (size_t)hp->n_embd * (size_t)hp->n_tokens;
    stage_rt rt[2 * LOOM_DEMO_MAX_LAYERS];
    loom_backend_t be[LOOM_DEMO_MAX_DEVICES] = {0};
    loom_sim_stats s0[LOOM_DEMO_MAX_DEVICES], s1[LOOM_DEMO_MAX_DEVICES];
    float *x_host = NULL;
    memset(rt, 0, sizeof rt);
    memset(s0, 0, sizeof s0);
    memset(s1, 0, sizeof s1);
    if (rep) {
        rep->n_devices = n;
        rep->n_stages = nst;
        for (int i = 0; i < n; i++) {
            memset(&rep->dev[i], 0, sizeof rep->dev[i]);
            snprintf(rep->dev[i].name, sizeof rep->dev[i].name, "%s", loom_dev_name(devs[i]));
            rep->dev[i].is_sim = loom_dev_is_sim(devs[i]);
        }
    }
    for (int i = 0; i < n; i++)
        if (loom_dev_is_sim(devs[i])) loom_sim_dev_stats(devs[i], &s0[i]);

    for (int i = 0; i < n_used; i++) {
        be[i] = loom_dev_init(devs[i], NULL);
        if (!be[i]) {
            st = last_or(LOOM_ERR_DEVICE);
            goto done;
        }
    }
    for (int s = 0; s < nst; s++) {
        rt[s].dev = s % n;
        if ((st = build_stage(hp, s, devs[rt[s].dev], &rt[s])) != LOOM_OK) goto done;
        if (rep) {
            rep->stage_device[s] = rt[s].dev;
            rep->stage_nodes[s] = rt[s].g->n_nodes;
            rep->dev[rt[s].dev].n_stages++;
        }
    }
    /* events order a device's copy after the previous device's graph; a device without
     * events gets a synchronize instead */
    for (int s = 0; s + 1 < nst; s++)
        if (rt[s + 1].dev != rt[s].dev) rt[s].ready = loom_event_new(devs[rt[s].dev]);
    x_host = loom_malloc(x_bytes);
    if (!x_host) {
        st = loom_error(LOOM_ERR_NOMEM, "demo: no host memory for the input");
        goto done;
    }
    loom_demo_input_values(hp, x_host);
    for (int i = 0; i < n; i++)
        if (loom_dev_is_sim(devs[i])) loom_sim_dev_stats(devs[i], &s1[i]);

    int64_t t0 = loom_time_ns();
    loom_backend_tensor_set_async(be[rt[0].dev], rt[0].in.x, x_host, 0, x_bytes);
    if (rep) rep->dev[rt[0].dev].n_copies_in++;
    if ((st = loom_backend_graph_compute_async(be[rt[0].dev], rt[0].g)) != LOOM_OK) goto done;
    for (int s = 1; s < nst; s++) {
        loom_backend_t src = be[rt[s - 1].dev], dst = be[rt[s].dev];
        if (src != dst) {
            if (rt[s - 1].ready) {
                loom_event_record(rt[s - 1].ready, src);
                loom_event_wait(dst, rt[s - 1].ready);
            } else {
                loom_backend_synchronize(src);
            }
            if (rep) rep->dev[rt[s].dev].n_copies_in++;
        }
        st = loom_backend_tensor_copy_async(src, dst, rt[s - 1].out, rt[s].in.x);
        if (st != LOOM_OK) goto done;
        if ((st = loom_backend_graph_compute_async(dst, rt[s].g)) != LOOM_OK) goto done;
    }
    loom_backend_t last = be[rt[nst - 1].dev];
    loom_backend_tensor_get_async(last, rt[nst - 1].out, out, 0, x_bytes);
    for (int i = 0; i < n_used; i++)
        loom_backend_synchronize(be[i]);
    if (rep) rep->dev_ms = ms_since(t0);

    if (rep) {
        for (int i = 0; i < n; i++) {
            if (!loom_dev_is_sim(devs[i])) continue;
            loom_sim_stats s2;
            loom_sim_dev_stats(devs[i], &s2);
            stats_delta(&s0[i], &s1[i], &rep->dev[i].upload);
            stats_delta(&s1[i], &s2, &rep->dev[i].run);
        }
    }

done:
    for (int i = 0; i < n_used; i++)
        if (be[i]) loom_backend_synchronize(be[i]);
    loom_free(x_host);
    for (int s = 0; s < nst; s++) {
        if (rt[s].ready) loom_event_free(rt[s].ready);
        loom_buffer_free(rt[s].buf);
        loom_ctx_free(rt[s].ctx);
    }
    for (int i = 0; i < n_used; i++)
        loom_backend_free(be[i]);
    return st;
}

/* ---------------------------------------------------------------- comparison */

void loom_demo_compare(const float *ref, const float *got, size_t n, loom_demo_diff *d) {
    double num = 0, den = 0;
    memset(d, 0, sizeof *d);
    d->finite = true;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], g = got[i];
        if (!isfinite(r) || !isfinite(g)) {
            d->finite = false;
            continue;
        }
        double e = fabs(g - r);
        if (e > d->max_abs) d->max_abs = e;
        if (fabs(r) > d->max_abs_ref) d->max_abs_ref = fabs(r);
        num += e * e;
        den += r * r;
    }
    d->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
}
