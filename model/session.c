/*
 * Sessions: device resolution, weight placement per split mode, the scheduler over
 * [devices..., CPU] (or [Meta(devices), CPU]), and batched evaluation through it. See
 * include/loom/session.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/cpu.h"
#include "loom/session.h"
#include "model/arch-impl.h"

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
    loom_reg_t spec_reg;         /* the reg a sim spec created for this session, or NULL */
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
    /* graphs computed asynchronously (pipeline: the batches of one eval are queued without
     * waiting) whose headers must live until the next synchronize */
    loom_ctx *inflight[LOOM_SCHED_MAX_COPIES];
    int n_inflight;
    /* -ts: per-device proportions (tensor: the rules' weights; layer: layers per device) */
    bool has_ts;
    float ts[MAX_DEVS];
    int64_t layer_count[MAX_DEVS]; /* layer mode with -ts: layers on each device, in order */
    bool reserved; /* the scheduler holds the worst-case plan of (res_n, res_all) */
    int64_t res_n;
    bool res_all;
    /* the shape class of graph_ctx's graph (bg): reused while a batch has the same one */
    bool bg_all, bg_flash;
    bool bg_ok; /* ... and it was computed without a failure since it was built */
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

static bool layer_offloaded(const loom_session *s, int layer) {
    return s->n_dev > 0 && layer >= s->hp.n_layer - s->n_offload;
}

static int layer_device(const loom_session *s, int layer) {
    if (s->has_ts) { /* consecutive runs of layer_count[j] layers */
        int64_t end = 0;
        for (int j = 0; j < s->n_dev; j++)
            if (layer < (end += s->layer_count[j])) return j;
        return s->n_dev - 1;
    }
    return (int)((int64_t)layer * s->n_dev / s->hp.n_layer);
}

int loom_session_layer_device(const loom_session *s, int layer) {
    if (!s || layer < 0 || layer >= s->hp.n_layer || !layer_offloaded(s, layer)) return -1;
    return s->mode == LOOM_SPLIT_MODE_LAYER ? layer_device(s, layer) : 0;
}

/* -ts: n values for the first n listed devices (the rest 0), finite, >= 0, a positive sum
 * over the devices used; ignored without a split (llama.cpp too) */
static loom_status set_tensor_split(loom_session *s, size_t n_listed) {
    if (!s->p.tensor_split || s->p.n_tensor_split <= 0 || s->n_dev < 2 ||
        s->mode == LOOM_SPLIT_MODE_NONE)
        return LOOM_OK;
    if ((size_t)s->p.n_tensor_split > n_listed)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "session: tensor_split has %d proportions for %zu devices",
                          s->p.n_tensor_split, n_listed);
    double sum = 0;
    for (int j = 0; j < s->p.n_tensor_split; j++) {
        float w = s->p.tensor_split[j];
        if (!(w >= 0) || isinf(w) || w > 1e9f)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "session: tensor_split[%d] = %g (must be finite and >= 0)", j,
                              (double)w);
        s->ts[j] = w;
        sum += w;
    }
    if (!(sum > 0))
        return loom_error(LOOM_ERR_INVALID_ARG, "session: tensor_split has no positive proportion");
    s->has_ts = true;
    if (s->mode == LOOM_SPLIT_MODE_LAYER)
        return loom_split_counts(s->hp.n_layer, 1, s->n_dev, 0, s->ts, s->layer_count);
    return LOOM_OK;
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
    return loom_rules_split_state_weighted(s->rules, &s->hp, t, s->n_dev, s->has_ts ? s->ts : NULL,
                                           out, NULL);
}

/* ---------------------------------------------------------------- pipeline, memory */

/* llama.cpp's conditions for pipeline parallelism (llama_context's constructor). */
static bool pipeline_wanted(const loom_session *s) {
    if (s->p.no_pipeline || s->n_dev < 2 || s->mode != LOOM_SPLIT_MODE_LAYER ||
        !s->output_offload || s->p.no_kv_offload)
        return false;
    for (int j = 0; j < s->n_dev; j++) {
        loom_dev_props pr;
        loom_dev_get_props(s->devs[j], &pr);
        if (!pr.caps.async || !pr.caps.events) return false;
    }
    return true;
}

/* Bytes the host can still give: MemAvailable + SwapFree, or free pages where /proc is
 * missing; 0 if unknown (then nothing is checked). */
static uint64_t host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    uint64_t avail = 0, swap = 0;
    bool found = false;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                avail = (uint64_t)kb * 1024, found = true;
            else if (sscanf(line, "SwapFree: %llu kB", &kb) == 1)
                swap = (uint64_t)kb * 1024;
        }
        fclose(f);
    }
    if (!found) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) avail = (uint64_t)pages * (uint64_t)psz;
    }
    return avail + swap;
}

typedef struct mem_need {
    loom_buft_t buft;
    uint64_t weights, kv;
} mem_need;

static void need_add(mem_need *v, int *n, int cap, loom_buft_t buft, uint64_t w, uint64_t kv) {
    int i = 0;
    while (i < *n && v[i].buft != buft)
        i++;
    if (i == *n) {
        if (*n == cap) return; /* more buffer types than devices: cannot happen */
        v[(*n)++] = (mem_need){.buft = buft};
    }
    v[i].weights += w;
    v[i].kv += kv;
}

static double mib(uint64_t b) {
    return (double)b / (1024.0 * 1024.0);
}

/* V's cache type: -ctv when given, else K's */
static loom_type kv_type_v(const loom_session *s) {
    return s->p.kv_type_v_set ? s->p.kv_type_v : s->p.kv_type;
}

/* The most tokens one graph evaluates (-b; llama.cpp's default 512). */
static int64_t batch_size(const loom_session *s) {
    return s->p.n_batch > 0 ? s->p.n_batch : 512;
}

/* The largest batch the sliding-window rings are sized for (0: full-context caches). */
static int64_t swa_batch(const loom_session *s) {
    return s->p.swa_full ? 0 : batch_size(s);
}

/* The weights (every tensor of the file, where place() puts it) and the KV cache of n_ctx
 * positions against what each device and the host have, before anything is allocated. */
static loom_status check_memory(loom_session *s, int64_t n_ctx) {
    mem_need v[MAX_DEVS + 2];
    int n = 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(s->g); i++) {
        const char *name = loom_gguf_tensor_name(s->g, i);
        int layer = -1;
        if (strncmp(name, "blk.", 4) == 0) layer = atoi(name + 4);
        if (layer >= s->hp.n_layer) layer = (int)s->hp.n_layer - 1;
        need_add(v, &n, MAX_DEVS + 2, place(name, layer, s), loom_gguf_tensor_size(s->g, i), 0);
    }
    int64_t per_k, per_v;
    const int64_t Dkv = s->hp.n_head_kv * s->hp.head_dim; /* whole blocks (checked) */
    char name[32];
    for (int il = 0; il < s->hp.n_layer; il++) {
        /* a sliding-window layer holds its ring only */
        const int64_t cells = loom_kv_cache_layer_cells(&s->hp, n_ctx, swa_batch(s), il);
        if (loom_mul_overflow_i64((int64_t)loom_row_size(s->p.kv_type, Dkv), cells, &per_k) ||
            loom_mul_overflow_i64((int64_t)loom_row_size(kv_type_v(s), Dkv), cells, &per_v))
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "session: a KV cache of %lld positions overflows", (long long)n_ctx);
        snprintf(name, sizeof name, "cache_k_l%d", il);
        need_add(v, &n, MAX_DEVS + 2, place(name, il, s), 0, (uint64_t)per_k + (uint64_t)per_v);
    }
    /* under -ts a meta device's weights and KV buffers hold only each member's own slices
     * (meta/buffer.c, packed), so each device needs its own share (ts[j] / sum) */
    double ts_sum = 0;
    for (int d = 0; s->has_ts && d < s->n_dev; d++) ts_sum += s->ts[d];
    const loom_buft_t host = loom_cpu_buffer_type();
    for (int i = 0; i < n; i++) {
        const uint64_t total = v[i].weights + v[i].kv;
        if (v[i].buft == host) {
            uint64_t have = host_available();
            if (have && total > have)
                return loom_error(
                    LOOM_ERR_NOMEM,
                    "session: %.1f MiB of weights and %.1f MiB of KV cache (%lld positions) "
                    "in host memory, which has %.1f MiB available",
                    mib(v[i].weights), mib(v[i].kv), (long long)n_ctx, mib(have));
            continue;
        }
        bool meta = s->meta && v[i].buft == loom_dev_buffer_type(s->meta);
        for (int j = 0; j < s->n_dev; j++) {
            if (!meta && loom_dev_buffer_type(s->devs[j]) != v[i].buft) continue;
            /* a meta device splits the bulk evenly, or by -ts (this device's share) */
            uint64_t w = v[i].weights, kv = v[i].kv;
            if (meta && s->has_ts) {
                w = (uint64_t)ceil((double)v[i].weights * s->ts[j] / ts_sum);
                kv = (uint64_t)ceil((double)v[i].kv * s->ts[j] / ts_sum);
            } else if (meta) {
                w = (v[i].weights + (uint64_t)s->n_dev - 1) / (uint64_t)s->n_dev;
                kv = (v[i].kv + (uint64_t)s->n_dev - 1) / (uint64_t)s->n_dev;
            }
            size_t fr = 0, tot = 0;
            loom_dev_memory(s->devs[j], &fr, &tot);
            if (tot > 0 && w + kv > fr)
                return loom_error(
                    LOOM_ERR_DEVICE_OOM,
                    "session: %.1f MiB of weights and %.1f MiB of KV cache (%lld positions) "
                    "on %s, which has %.1f MiB free of %.1f MiB",
                    mib(w), mib(kv), (long long)n_ctx, loom_dev_name(s->devs[j]), mib(fr),
                    mib(tot));
        }
    }
    return LOOM_OK;
}

/* A scheduler or meta failure while user split rules are in effect: say which of them
 * matched which tensors, so a rule that made a placement impossible is named. */
static loom_status with_rules(loom_session *s, loom_status st) {
    if (st == LOOM_OK || !s->p.split_rules || !s->rules) return st;
    char msg[1024], extra[600];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    size_t n = 0;
    extra[0] = 0;
    for (int r = 0; r < loom_rules_count(s->rules) && n < sizeof extra - 80; r++) {
        const loom_rule *rule = loom_rules_get(s->rules, r);
        if (strcmp(rule->source, s->p.split_rules) != 0) continue;
        char first[48] = "";
        int hits = 0;
        char cname[32];
        for (int64_t i = 0; i < loom_gguf_tensor_count(s->g) + 2 * s->hp.n_layer; i++) {
            const char *name = cname;
            int64_t k = i - loom_gguf_tensor_count(s->g);
            if (k < 0)
                name = loom_gguf_tensor_name(s->g, i);
            else
                snprintf(cname, sizeof cname, "cache_%c_l%lld", k % 2 ? 'v' : 'k',
                         (long long)(k / 2));
            if (loom_rules_match(s->rules, name) != rule) continue;
            if (!hits++) snprintf(first, sizeof first, "%s", name);
        }
        if (!hits) continue;
        n += (size_t)snprintf(extra + n, sizeof extra - n,
                              "%s%s:%d '%.40s' (%d tensors, e.g. %.40s)", n ? "; " : "",
                              rule->source, rule->line, rule->pattern, hits, first);
    }
    if (!n) return st;
    return loom_error(st, "%s [split rules in effect: %s]", msg, extra);
}

/* ---------------------------------------------------------------- lifecycle */

static loom_status reserve(loom_session *s, int64_t n, bool all_logits);

int64_t loom_session_ctx_for(const loom_hparams *hp, int64_t n_ctx) {
    if (n_ctx > 0) return n_ctx;
    if (n_ctx < 0) return hp->n_ctx_train; /* llama.cpp's -c 0: the model's own */
    return hp->n_ctx_train < 2048 ? hp->n_ctx_train : 2048; /* n_ctx_train > 0: validated */
}

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
     * the default sim reg and shift the spec's names; "cpu" needs no module at all (the
     * CUDA module alone, loading cuBLAS, costs ~210 MB of RSS on a host without a GPU) */
    if (strncmp(spec, "sim", 3) != 0 && strcmp(spec, "cpu") != 0 &&
        s->p.n_devs <= 0)
        loom_registry_load_all();
    size_t nd = 0;
    if (s->p.n_devs > 0) { /* the caller's devices */
        if (s->p.n_devs > MAX_DEVS || !s->p.devs)
            return fail(s, loom_error(LOOM_ERR_INVALID_ARG, "session: %d explicit devices (at most %d)",
                                      s->p.n_devs, MAX_DEVS));
        memcpy(s->devs, s->p.devs, (size_t)s->p.n_devs * sizeof *s->devs);
        nd = (size_t)s->p.n_devs;
    } else if (strcmp(spec, "cpu") != 0) {
        if ((st = loom_devices_from_spec(spec, s->devs, MAX_DEVS, &nd))) return fail(s, st);
        if (nd > 0) s->spec_reg = loom_dev_reg(s->devs[0]); /* released at free if a spec made it */
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
    if ((st = set_tensor_split(s, nd))) return fail(s, st);

    s->cpu = loom_cpu_backend_new(s->p.threads);
    if (!s->cpu) return fail(s, loom_last_status());
    if (s->n_dev > 0 && s->mode == LOOM_SPLIT_MODE_TENSOR) {
        if ((st = loom_rules_builtin(s->hp.arch, s->hp.n_expert > 0, &s->rules))) return fail(s, st);
        if (s->p.split_rules) {
            loom_rules *user = NULL;
            if ((st = loom_rules_load_file(s->p.split_rules, &user))) return fail(s, st);
            if ((st = loom_rules_prepend(s->rules, user))) return fail(s, st);
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

    /* tokenizer first: a vocabulary that does not match the model's rows is refused before
     * the weights are loaded (ids the tokenizer lacks would print nothing) */
    /* a file without a vocabulary (tokenizer.ggml.model "none", as llama.cpp's converter
     * writes with --no-vocab) runs ids: the session has no tokenizer */
    if (!loom_tokenizer_declared_none(g) && (st = loom_tokenizer_from_gguf(g, &s->tok)))
        return fail(s, st);
    if (s->tok && loom_tokenizer_n_vocab(s->tok) != s->hp.n_vocab)
        return fail(s, loom_error(LOOM_ERR_FORMAT,
                                  "session: the tokenizer has %d tokens but the model's "
                                  "token_embd/output have %lld rows",
                                  loom_tokenizer_n_vocab(s->tok), (long long)s->hp.n_vocab));

    /* weights, cache: checked against the memory there is before allocating */
    int64_t n_ctx = loom_session_ctx_for(&s->hp, s->p.n_ctx);
    /* a cache split by heads (tensor mode) needs whole blocks per head */
    const bool kv_split = s->mode == LOOM_SPLIT_MODE_TENSOR && s->n_dev > 1 && !s->p.no_kv_offload;
    if ((st = loom_kv_cache_check_type(&s->hp, "K (-ctk)", s->p.kv_type, kv_split)) ||
        (st = loom_kv_cache_check_type(&s->hp, "V (-ctv)", kv_type_v(s), kv_split)))
        return fail(s, st);
    if ((st = check_memory(s, n_ctx))) return fail(s, st);
    loom_model_params mp = {.placement = place,
                            .placement_user_data = s,
                            .progress = s->p.progress,
                            .progress_user_data = s->p.progress_user_data,
                            .no_data = s->p.no_weight_data,
                            .no_mmap = s->p.no_mmap,
                            .load_chunk = s->p.load_chunk};
    if ((st = loom__model_load_hp(g, &s->hp, &mp, &s->model))) return fail(s, st);
    if ((st = loom_kv_cache_new_bounded(s->model, n_ctx, swa_batch(s), s->p.kv_type, kv_type_v(s),
                                        &mp, &s->kv)))
        return fail(s, st);
    size_t graph_size = loom_model_graph_ctx_size(s->model) / loom_tensor_overhead();
    s->sched = loom_sched_new(s->backends, NULL, s->n_backends, graph_size, pipeline_wanted(s),
                              !s->p.no_op_offload);
    if (!s->sched) return fail(s, loom_last_status());
    /* worst cases, as llama.cpp reserves: a full prompt batch, then one token (what
     * generation keeps using), each attending over the whole context */
    int64_t nb = batch_size(s);
    if (nb > n_ctx) nb = n_ctx;
    if (nb > 1 && (st = reserve(s, nb, false))) return fail(s, with_rules(s, st));
    if ((st = reserve(s, 1, false))) return fail(s, with_rules(s, st));
    s->stats.load_us = loom_time_us() - t0;
    *out = s;
    return LOOM_OK;
}

/* Waits for every queued graph, then frees their headers; the status of the wait. */
static loom_status sync_inflight(loom_session *s) {
    loom_status st = LOOM_OK;
    if (s->n_inflight > 0) {
        st = loom_sched_synchronize(s->sched);
        for (int i = 0; i < s->n_inflight; i++)
            loom_ctx_free(s->inflight[i]);
        s->n_inflight = 0;
    }
    return st;
}

void loom_session_free(loom_session *s) {
    if (!s) return;
    sync_inflight(s);
    loom_sched_free(s->sched);
    loom_ctx_free(s->graph_ctx);
    loom_tokenizer_free(s->tok);
    loom_kv_cache_free(s->kv);
    loom_model_free(s->model);
    for (int i = 0; i < s->n_backends; i++)
        if (s->backends[i] != s->cpu) loom_backend_free(s->backends[i]);
    loom_backend_free(s->cpu);
    loom_meta_device_free(s->meta);
    /* a sim spec made a reg for this session alone: free it (nothing of it is used now) */
    if (s->spec_reg) loom_registry_release(s->spec_reg);
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
bool loom_session_pipeline(const loom_session *s) {
    return loom_sched_get_n_copies(s->sched) > 1;
}
int64_t loom_session_n_past(const loom_session *s) { return s->n_past; }
int64_t loom_session_n_ctx(const loom_session *s) { return s->kv->n_ctx; }
const loom_kv_cache *loom_session_kv(const loom_session *s) { return s->kv; }
void loom_session_clear(loom_session *s) { s->n_past = 0; }
void loom_session_get_stats(const loom_session *s, loom_session_stats *out) { *out = s->stats; }

/* ---------------------------------------------------------------- evaluation */

/* Builds the graph of n tokens at position n_past into a fresh graph_ctx, with the
 * no_kv_offload pins applied. */
static loom_status build(loom_session *s, int64_t n, int64_t n_past, bool all_logits) {
    loom_sched_reset(s->sched);
    s->bg_ok = false;
    loom_ctx_free(s->graph_ctx);
    s->graph_ctx = loom_ctx_new(
        (loom_ctx_params){.mem_size = loom_model_graph_ctx_size(s->model), .no_alloc = true});
    if (!s->graph_ctx) return loom_last_status();
    loom_status st =
        loom_model_build_graph(s->model, s->kv, s->graph_ctx, n, n_past, all_logits, &s->bg);
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
    return LOOM_OK;
}

/* Reserves the scheduler's compute buffers for the worst case of a batch of n tokens: at
 * the end of the context, so the attention spans every position. Every later graph of the
 * same kind (n, all_logits) is no larger and has the same topology, so it fits the plan. */
static loom_status reserve(loom_session *s, int64_t n, bool all_logits) {
    all_logits = all_logits && n > 1; /* one token: the same graph either way */
    loom_status st = build(s, n, s->kv->n_ctx - n, all_logits);
    if (st == LOOM_OK) st = loom_sched_reserve(s->sched, s->bg.graph);
    loom_ctx_free(s->graph_ctx); /* the measure graph is spent */
    s->graph_ctx = NULL;
    s->reserved = st == LOOM_OK;
    s->res_n = n;
    s->res_all = all_logits;
    if (st)
        return loom_error(st, "session: reserving compute buffers for %lld tokens: %s",
                          (long long)n, loom_last_error());
    return LOOM_OK;
}

/* Whether the graph the scheduler holds serves a batch of n tokens at n_past as it is:
 * the same shape class (tokens, KV bucket, logits kept, attention kind), computed without
 * a failure, still the scheduler's allocated graph (nothing reserved, split, reset or
 * queued since: a queued graph's context moved to inflight), under the plan reserved for
 * its kind. Only the inputs differ then (positions, cache rows written, masks), which
 * loom_batch_set_inputs writes. */
static bool can_reuse(const loom_session *s, int64_t n, bool all_logits) {
    const bool all = all_logits && n > 1;
    return !s->p.no_graph_reuse && s->graph_ctx && s->bg.graph && s->bg_ok && s->reserved &&
           s->res_n == n && s->res_all == all && s->bg.n_tokens == n && s->bg_all == all &&
           s->bg_flash == !s->model->no_flash_attn &&
           s->bg.n_kv == loom__graph_n_kv(s->n_past, n, s->kv->n_ctx) &&
           loom_sched_is_allocated(s->sched, s->bg.graph);
}

/* Builds and allocates the graph of n tokens at n_past, or keeps the one it has when
 * that one serves (can_reuse). */
static loom_status prepare(loom_session *s, int64_t n, bool all_logits) {
    loom_status st;
    if (can_reuse(s, n, all_logits)) {
        s->bg.n_past = s->n_past;
        s->stats.graphs_reused++;
        return LOOM_OK;
    }
    /* another kind of graph than the plan held: plan its worst case first, so the actual
     * graph (and every later one of its kind) fits without reallocating */
    if (!s->reserved || s->res_n != n || s->res_all != (all_logits && n > 1))
        if ((st = reserve(s, n, all_logits))) return st;
    if ((st = build(s, n, s->n_past, all_logits))) return st;
    s->bg_all = all_logits && n > 1;
    s->bg_flash = !s->model->no_flash_attn;
    if ((st = loom_sched_alloc_graph(s->sched, s->bg.graph))) return st;
    s->stats.graphs_built++;
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
    return with_rules(s, st);
}

loom_status loom_session_eval(loom_session *s, const int32_t *tokens, int64_t n, bool all_logits,
                              float *out) {
    const int64_t V = s->hp.n_vocab;
    int64_t batch = batch_size(s);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return loom_error(LOOM_ERR_INVALID_ARG, "session: token %lld is %d, outside the vocabulary of %lld",
                              (long long)i, tokens[i], (long long)V);
    if (s->n_past + n > s->kv->n_ctx)
        return loom_error(LOOM_ERR_INVALID_ARG, "session: %lld tokens at position %lld exceed the context of %lld",
                          (long long)n, (long long)s->n_past, (long long)s->kv->n_ctx);
    loom_status st = LOOM_OK;
    s->stats.last_copy_mask = 0;
    for (int64_t i0 = 0; i0 < n && st == LOOM_OK; i0 += batch) {
        /* weights read in place from the file: a truncated file would raise SIGBUS */
        if ((st = loom_model_check_file(s->model))) break;
        int64_t nb = n - i0 < batch ? n - i0 : batch;
        bool last = i0 + nb == n;
        /* with pipeline copies, a batch whose logits nobody reads is queued without waiting:
         * the next batch's first layers then run while this one finishes on later devices
         * (the scheduler rotates the copies; its headers live until the next wait) */
        bool queue = !last && !all_logits && loom_sched_get_n_copies(s->sched) > 1;
        if (s->n_inflight == LOOM_SCHED_MAX_COPIES && (st = sync_inflight(s))) break;
        if ((st = prepare(s, nb, all_logits))) break;
        if ((st = loom_batch_set_inputs(&s->bg, tokens + i0))) break;
        if (s->meta) loom_meta_backend_reset_stats(s->backends[0]);
        loom_sched_stats ss;
        loom_sched_get_stats(s->sched, &ss);
        s->stats.last_copy_mask |= 1u << ss.cur_copy;
        if (queue) {
            if ((st = loom_sched_graph_compute_async(s->sched, s->bg.graph))) break;
            s->inflight[s->n_inflight++] = s->graph_ctx;
            s->graph_ctx = NULL;
            s->n_past += nb;
            continue;
        }
        if ((st = loom_sched_graph_compute(s->sched, s->bg.graph))) break;
        if ((st = sync_inflight(s))) break;
        s->bg_ok = true;
        if (all_logits) loom_tensor_get(s->bg.logits, out + i0 * V, 0, (size_t)(nb * V) * sizeof(float));
        else if (last) loom_tensor_get(s->bg.logits, out, 0, (size_t)V * sizeof(float));
        s->n_past += nb;
        if (s->meta) {
            loom_meta_stats ms;
            loom_meta_backend_get_stats(s->backends[0], &ms);
            s->stats.last_reductions = (int)ms.reductions; /* over every meta split */
            s->stats.last_bytes_reduced = ms.bytes_reduced;
            s->stats.last_subgraphs = (int)ms.subgraphs;
            s->stats.last_issue_ns = ms.issue_ns;
            s->stats.last_reduce_ns = ms.reduce_ns;
        }
    }
    if (st) {
        s->bg_ok = false; /* a failed batch's graph is built again */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        sync_inflight(s);
        return with_rules(s, loom_error(st, "%s", msg));
    }
    return LOOM_OK;
}
