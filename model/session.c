/*
 * Sessions: device resolution, weight placement per split mode, the scheduler over
 * [devices..., CPU] (or [Meta(devices), CPU]), and batched evaluation through it. See
 * include/loom/session.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/session.h"

#define MAX_DEVS 16

struct loom_session {
    loom_session_params p;
    loom_gguf *own_gguf;
    const loom_gguf *g;
    loom_hparams hp;
    loom_split_mode mode;
    int n_dev;
    loom_dev_t devs[MAX_DEVS];
    loom_dev_t meta;             /* tensor mode */
    loom_rules *rules;
    loom_backend_t backends[MAX_DEVS + 1]; /* scheduler order; the CPU last */
    int n_backends;
    loom_backend_t cpu;
    int n_offload;               /* layers on the devices */
    bool output_offload;
    loom_model *model;
    loom_kv_cache *kv;
    loom_tokenizer *tok;
    loom_sched *sched;
    loom_ctx *graph_ctx;         /* the graph of the last eval/plan */
    loom_batch_graph bg;
    int64_t n_past;
    loom_session_stats stats;
};

const char *loom_split_mode_name(loom_split_mode m) {
    switch (m) {
    case LOOM_SPLIT_MODE_NONE: return "none";
    case LOOM_SPLIT_MODE_LAYER: return "layer";
    case LOOM_SPLIT_MODE_TENSOR: return "tensor";
    default: return "default";
    }
}

loom_status loom_split_mode_parse(const char *s, loom_split_mode *out) {
    if (strcmp(s, "none") == 0) *out = LOOM_SPLIT_MODE_NONE;
    else if (strcmp(s, "layer") == 0) *out = LOOM_SPLIT_MODE_LAYER;
    else if (strcmp(s, "tensor") == 0 || strcmp(s, "row") == 0) *out = LOOM_SPLIT_MODE_TENSOR;
    else return loom_error(LOOM_ERR_INVALID_ARG, "unknown split mode '%s' (none, layer, tensor)", s);
    return LOOM_OK;
}

loom_session_params loom_session_params_default(void) {
    return (loom_session_params){.devices = "cpu", .split_mode = LOOM_SPLIT_MODE_DEFAULT,
                                 .n_gpu_layers = -1, .kv_type = LOOM_TYPE_F32};
}

/* ---------------------------------------------------------------- placement */

static int layer_device(const loom_session *s, int layer) {
    return (int)((int64_t)layer * s->n_dev / s->hp.n_layer);
}

static bool layer_offloaded(const loom_session *s, int layer) {
    return s->n_dev > 0 && layer >= s->hp.n_layer - s->n_offload;
}

static loom_buft_t place(const char *name, int layer, void *ud) {
    const loom_session *s = ud;
    loom_buft_t host = loom_cpu_buffer_type();
    if (s->n_dev == 0) return host;
    bool cache = strncmp(name, "cache_", 6) == 0;
    if (cache && s->p.no_kv_offload) return host;
    if (layer < 0) {
        if (strcmp(name, "token_embd.weight") == 0) return host;
        if (!s->output_offload) return host;
        layer = (int)s->hp.n_layer - 1; /* output: with the last layer */
    } else if (!layer_offloaded(s, layer)) {
        return host;
    }
    switch (s->mode) {
    case LOOM_SPLIT_MODE_TENSOR: return loom_dev_buffer_type(s->meta);
    case LOOM_SPLIT_MODE_LAYER: return loom_dev_buffer_type(s->devs[layer_device(s, layer)]);
    default: return loom_dev_buffer_type(s->devs[0]);
    }
}

static loom_status leaf_state(const loom_tensor *t, loom_split_state *out, void *ud) {
    const loom_session *s = ud;
    if (!t->name[0] || !(t->flags & LOOM_TENSOR_FLAG_PARAM || strncmp(t->name, "cache_", 6) == 0))
        return LOOM_OK; /* graph inputs and copies: MIRRORED */
    return loom_rules_split_state(s->rules, &s->hp, t, s->n_dev, out, NULL);
}

/* ---------------------------------------------------------------- lifecycle */

static loom_status fail(loom_session *s, loom_status st) {
    loom_session_free(s);
    return st;
}

loom_status loom_session_new(const char *path, const loom_gguf *g, const loom_session_params *pp,
                             loom_session **out) {
    *out = NULL;
    loom_session *s = loom_calloc(1, sizeof *s);
    if (!s) return loom_error(LOOM_ERR_NOMEM, "session: out of memory");
    s->p = pp ? *pp : loom_session_params_default();
    loom_status st;
    int64_t t0 = loom_time_us();
    if (path) {
        if ((st = loom_gguf_open(path, &s->own_gguf))) return fail(s, st);
        g = s->own_gguf;
    }
    s->g = g;
    if ((st = loom_hparams_from_gguf(g, &s->hp))) return fail(s, st);

    /* devices */
    const char *spec = s->p.devices && *s->p.devices ? s->p.devices : "cpu";
    /* a sim spec makes its own reg (named SIM0..); loading the modules first would add
     * the default sim reg and shift the spec's names */
    if (strncmp(spec, "sim", 3) != 0 && s->p.n_devs <= 0) loom_registry_load_all();
    size_t nd = 0;
    if (s->p.n_devs > 0) { /* the caller's devices */
        if (s->p.n_devs > MAX_DEVS || !s->p.devs)
            return fail(s, loom_error(LOOM_ERR_INVALID_ARG, "session: %d explicit devices (at most %d)",
                                      s->p.n_devs, MAX_DEVS));
        memcpy(s->devs, s->p.devs, (size_t)s->p.n_devs * sizeof *s->devs);
        nd = (size_t)s->p.n_devs;
    } else if (strcmp(spec, "cpu") != 0) {
        if ((st = loom_devices_from_spec(spec, s->devs, MAX_DEVS, &nd))) return fail(s, st);
        if (nd > MAX_DEVS)
            return fail(s, loom_error(LOOM_ERR_INVALID_ARG, "session: %zu devices (at most %d)", nd, MAX_DEVS));
    }
    s->n_dev = (int)nd;
    s->mode = s->p.split_mode;
    if (s->mode == LOOM_SPLIT_MODE_DEFAULT) s->mode = nd > 1 ? LOOM_SPLIT_MODE_TENSOR : LOOM_SPLIT_MODE_NONE;
    if (s->mode == LOOM_SPLIT_MODE_NONE && nd > 1) s->n_dev = 1; /* only the first device */
    if (nd == 0) s->mode = LOOM_SPLIT_MODE_NONE;                 /* the CPU alone */
    s->n_offload = s->p.n_gpu_layers < 0 || s->p.n_gpu_layers > s->hp.n_layer ? (int)s->hp.n_layer
                                                                              : s->p.n_gpu_layers;
    s->output_offload = s->p.n_gpu_layers < 0 || s->p.n_gpu_layers > s->hp.n_layer;

    s->cpu = loom_cpu_backend_new(s->p.threads);
    if (!s->cpu) return fail(s, loom_last_status());
    if (s->n_dev > 0 && s->mode == LOOM_SPLIT_MODE_TENSOR) {
        if ((st = loom_rules_builtin(s->hp.arch, s->hp.n_expert > 0, &s->rules))) return fail(s, st);
        if (s->p.split_rules) {
            loom_rules *user = NULL;
            if ((st = loom_rules_load_file(s->p.split_rules, &user))) return fail(s, st);
            loom_rules_prepend(s->rules, user);
        }
        if ((st = loom_meta_device_new(s->devs, s->n_dev, leaf_state, s, &s->meta))) return fail(s, st);
        s->backends[s->n_backends] = loom_dev_init(s->meta, NULL);
        if (!s->backends[s->n_backends]) return fail(s, loom_last_status());
        s->n_backends++;
    } else {
        for (int j = 0; j < s->n_dev; j++) {
            s->backends[s->n_backends] = loom_dev_init(s->devs[j], NULL);
            if (!s->backends[s->n_backends]) return fail(s, loom_last_status());
            s->n_backends++;
        }
    }
    s->backends[s->n_backends++] = s->cpu;

    /* weights, cache, tokenizer */
    loom_model_params mp = {.placement = place, .placement_user_data = s,
                            .progress = s->p.progress, .progress_user_data = s->p.progress_user_data};
    if ((st = loom_model_load(g, &mp, &s->model))) return fail(s, st);
    int64_t n_ctx = s->p.n_ctx > 0 ? s->p.n_ctx : (s->hp.n_ctx_train < 2048 ? s->hp.n_ctx_train : 2048);
    if ((st = loom_kv_cache_new(s->model, n_ctx, s->p.kv_type, &mp, &s->kv))) return fail(s, st);
    if ((st = loom_tokenizer_from_gguf(g, &s->tok))) return fail(s, st);
    size_t graph_size = loom_model_graph_ctx_size(s->model) / loom_tensor_overhead();
    s->sched = loom_sched_new(s->backends, NULL, s->n_backends, graph_size, false, !s->p.no_op_offload);
    if (!s->sched) return fail(s, loom_last_status());
    s->stats.load_us = loom_time_us() - t0;
    *out = s;
    return LOOM_OK;
}

void loom_session_free(loom_session *s) {
    if (!s) return;
    loom_sched_free(s->sched);
    loom_ctx_free(s->graph_ctx);
    loom_tokenizer_free(s->tok);
    loom_kv_cache_free(s->kv);
    loom_model_free(s->model);
    for (int i = 0; i < s->n_backends; i++)
        if (s->backends[i] != s->cpu) loom_backend_free(s->backends[i]);
    loom_backend_free(s->cpu);
    loom_meta_device_free(s->meta);
    loom_rules_free(s->rules);
    loom_gguf_free(s->own_gguf);
    loom_free(s);
}

const loom_model *loom_session_model(const loom_session *s) { return s->model; }
const loom_tokenizer *loom_session_tokenizer(const loom_session *s) { return s->tok; }
loom_sched *loom_session_sched(const loom_session *s) { return s->sched; }
loom_backend_t loom_session_meta_backend(const loom_session *s) { return s->meta ? s->backends[0] : NULL; }
int loom_session_n_devices(const loom_session *s) { return s->n_dev; }
loom_dev_t loom_session_device(const loom_session *s, int i) { return s->devs[i]; }
loom_split_mode loom_session_split_mode(const loom_session *s) { return s->mode; }
int64_t loom_session_n_past(const loom_session *s) { return s->n_past; }
int64_t loom_session_n_ctx(const loom_session *s) { return s->kv->n_ctx; }
const loom_kv_cache *loom_session_kv(const loom_session *s) { return s->kv; }
void loom_session_clear(loom_session *s) { s->n_past = 0; }
void loom_session_get_stats(const loom_session *s, loom_session_stats *out) { *out = s->stats; }

/* ---------------------------------------------------------------- evaluation */

/* Builds and allocates the graph of n tokens at n_past. */
static loom_status prepare(loom_session *s, int64_t n, bool all_logits) {
    loom_sched_reset(s->sched);
    loom_ctx_free(s->graph_ctx);
    s->graph_ctx = loom_ctx_new(
        (loom_ctx_params){.mem_size = loom_model_graph_ctx_size(s->model), .no_alloc = true});
    if (!s->graph_ctx) return loom_last_status();
    loom_status st = loom_model_build_graph(s->model, s->kv, s->graph_ctx, n, s->n_past, all_logits, &s->bg);
    if (st) return st;
    if (s->p.no_kv_offload && s->n_dev > 0) {
        /* the cache is in host memory: run what reads it there too (as llama.cpp pins its
         * attention output), instead of copying the whole cache to the devices every token */
        const loom_graph *g = s->bg.graph;
        for (int i = 0; i < g->n_nodes; i++) {
            loom_tensor *t = g->nodes[i];
            if (loom_op_is_view(t->op)) continue;
            for (int k = 0; k < LOOM_MAX_SRC; k++) {
                const loom_tensor *src = t->src[k];
                if (src && src->view_src && strncmp(src->view_src->name, "cache_", 6) == 0 &&
                    t->op != LOOM_OP_SET_ROWS) {
                    if ((st = loom_sched_set_tensor_backend(s->sched, t, s->cpu))) return st;
                    break;
                }
            }
        }
    }
    if ((st = loom_sched_alloc_graph(s->sched, s->bg.graph))) return st;
    loom_sched_stats ss;
    loom_sched_get_stats(s->sched, &ss);
    if (n > 1) {
        s->stats.prompt_nodes = ss.n_nodes;
        s->stats.prompt_splits = ss.n_splits;
    } else {
        s->stats.gen_nodes = ss.n_nodes;
        s->stats.gen_splits = ss.n_splits;
    }
    return LOOM_OK;
}

loom_status loom_session_plan(loom_session *s, int64_t n, loom_graph **out) {
    *out = NULL;
    if (s->n_past + n > s->kv->n_ctx)
        return loom_error(LOOM_ERR_INVALID_ARG, "session: %lld tokens at position %lld exceed the context of %lld",
                          (long long)n, (long long)s->n_past, (long long)s->kv->n_ctx);
    loom_status st = prepare(s, n, false);
    if (st == LOOM_OK) *out = s->bg.graph;
    return st;
}

loom_status loom_session_eval(loom_session *s, const int32_t *tokens, int64_t n, bool all_logits,
                              float *out) {
    const int64_t V = s->hp.n_vocab;
    int64_t batch = s->p.n_batch > 0 ? s->p.n_batch : 512;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return loom_error(LOOM_ERR_INVALID_ARG, "session: token %lld is %d, outside the vocabulary of %lld",
                              (long long)i, tokens[i], (long long)V);
    if (s->n_past + n > s->kv->n_ctx)
        return loom_error(LOOM_ERR_INVALID_ARG, "session: %lld tokens at position %lld exceed the context of %lld",
                          (long long)n, (long long)s->n_past, (long long)s->kv->n_ctx);
    for (int64_t i0 = 0; i0 < n; i0 += batch) {
        int64_t nb = n - i0 < batch ? n - i0 : batch;
        bool last = i0 + nb == n;
        loom_status st = prepare(s, nb, all_logits);
        if (st) return st;
        if ((st = loom_batch_set_inputs(&s->bg, tokens + i0))) return st;
        if (s->meta) loom_meta_backend_reset_stats(s->backends[0]);
        if ((st = loom_sched_graph_compute(s->sched, s->bg.graph))) return st;
        if (all_logits) loom_tensor_get(s->bg.logits, out + i0 * V, 0, (size_t)(nb * V) * sizeof(float));
        else if (last) loom_tensor_get(s->bg.logits, out, 0, (size_t)V * sizeof(float));
        s->n_past += nb;
        if (s->meta) {
            loom_meta_stats ms;
            loom_meta_backend_get_stats(s->backends[0], &ms);
            s->stats.last_reductions = (int)ms.reductions; /* over every meta split */
            s->stats.last_bytes_reduced = ms.bytes_reduced;
            s->stats.last_subgraphs = (int)ms.subgraphs;
        }
    }
    return LOOM_OK;
}
