/*
 * Implementation of testutil.h. The reference path deliberately avoids the graph
 * allocator and the scheduler: loom_alloc_ctx_tensors gives every tensor its own bytes and
 * the CPU backend computes the whole graph.
 */
#define _POSIX_C_SOURCE 200809L
#include "tests/sched/testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"

/* ---------------------------------------------------------------- devices */

bool tu_devs_open(tu_devs *d, const char *const *specs, int n_specs, int cpu_threads) {
    memset(d, 0, sizeof(*d));
    for (int r = 0; r < n_specs; r++) {
        loom_reg_t reg = NULL;
        if (loom_sim_reg_new_from_spec(specs[r], &reg) != LOOM_OK) {
            tu_devs_close(d);
            return false;
        }
        d->regs[d->n_regs++] = reg;
        for (size_t i = 0; i < loom_reg_dev_count(reg); i++) {
            loom_backend_t be = loom_dev_init(loom_reg_dev_get(reg, i), NULL);
            if (!be || d->n >= TU_MAX_BACKENDS - 1) {
                loom_backend_free(be);
                tu_devs_close(d);
                return false;
            }
            d->backends[d->n++] = be;
        }
    }
    d->cpu = loom_cpu_backend_new(cpu_threads > 0 ? cpu_threads : 2);
    if (!d->cpu) {
        tu_devs_close(d);
        return false;
    }
    d->backends[d->n++] = d->cpu;
    return true;
}

void tu_devs_close(tu_devs *d) {
    for (int i = 0; i < d->n; i++)
        loom_backend_free(d->backends[i]);
    for (int r = 0; r < d->n_regs; r++)
        loom_sim_reg_free(d->regs[r]);
    memset(d, 0, sizeof(*d));
}

loom_buft_t tu_buft(const tu_devs *d, int i) {
    return loom_backend_default_buft(d->backends[i]);
}

/* ---------------------------------------------------------------- tensors */

loom_ctx *tu_ctx(size_t n_tensors, bool no_alloc) {
    loom_ctx_params p = {
        .mem_size = n_tensors * loom_tensor_overhead() +
                    loom_graph_overhead(2 * LOOM_DEFAULT_GRAPH_SIZE) + 4096,
        .mem_buffer = NULL,
        .no_alloc = no_alloc,
    };
    return loom_ctx_new(p);
}

float tu_value(const char *name, uint32_t seed, int64_t i) {
    uint32_t h = 2166136261u ^ seed;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    h ^= (uint32_t)i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h & 0xffffff) / (float)0x800000 - 1.0f;
}

void tu_fill(loom_tensor *t, uint32_t seed, float scale) {
    int64_t n = loom_nelements(t);
    size_t bytes = loom_nbytes(t);
    void *raw = malloc(bytes ? bytes : 1);
    if (t->type == LOOM_TYPE_F32) {
        float *f = raw;
        for (int64_t i = 0; i < n; i++)
            f[i] = scale * tu_value(t->name, seed, i);
    } else if (t->type == LOOM_TYPE_F16) {
        uint16_t *h = raw;
        for (int64_t i = 0; i < n; i++)
            h[i] = loom_fp32_to_fp16(scale * tu_value(t->name, seed, i));
    } else if (t->type == LOOM_TYPE_I32) {
        int32_t *v = raw;
        for (int64_t i = 0; i < n; i++)
            v[i] = (int32_t)i;
    } else {
        memset(raw, 0, bytes);
    }
    loom_tensor_set(t, raw, 0, bytes);
    free(raw);
}

float *tu_read(const loom_tensor *t) {
    size_t bytes = loom_nbytes(t);
    float *f = malloc(bytes ? bytes : 1);
    if (!t->buffer && t->data) {
        memcpy(f, t->data, bytes); /* a tensor of an allocating (host) context */
    } else {
        loom_tensor_get(t, f, 0, bytes);
    }
    return f;
}

double tu_max_rel_err(const loom_tensor *a, const loom_tensor *b) {
    if (!loom_are_same_shape(a, b) || a->type != LOOM_TYPE_F32 || b->type != LOOM_TYPE_F32) {
        return -1.0;
    }
    float *fa = tu_read(a), *fb = tu_read(b);
    double worst = 0;
    int64_t n = loom_nelements(a);
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)fa[i] - (double)fb[i]) / (1.0 + fabs((double)fb[i]));
        if (!(e <= worst)) worst = e; /* NaN propagates */
    }
    free(fa);
    free(fb);
    return worst;
}

/* ---------------------------------------------------------------- the model */

static loom_tensor *weight(loom_ctx *ctx, const char *name, int layer, int64_t ne0, int64_t ne1) {
    loom_tensor *t = ne1 > 0 ? loom_new_tensor_2d(ctx, LOOM_TYPE_F32, ne0, ne1)
                             : loom_new_tensor_1d(ctx, LOOM_TYPE_F32, ne0);
    if (!t) return NULL;
    if (layer >= 0) {
        loom_format_name(t, "blk.%d.%s", layer, name);
    } else {
        loom_set_name(t, name);
    }
    return t;
}

bool tu_weights_new(tu_weights *w, const tu_cfg *cfg, const loom_buft_t *bufts) {
    memset(w, 0, sizeof(*w));
    w->cfg = *cfg;
    if (cfg->n_layer > TU_MAX_LAYERS) return false;
    for (int i = 0; i <= cfg->n_layer; i++) {
        loom_ctx *ctx = tu_ctx(16, true);
        if (!ctx) goto fail;
        w->ctx[i] = ctx;
        if (i < cfg->n_layer) {
            tu_layer *l = &w->l[i];
            l->attn_norm = weight(ctx, "attn_norm", i, cfg->d, 0);
            l->wq = weight(ctx, "attn_q", i, cfg->d, cfg->d);
            l->wk = weight(ctx, "attn_k", i, cfg->d, cfg->d);
            l->wv = weight(ctx, "attn_v", i, cfg->d, cfg->d);
            l->wo = weight(ctx, "attn_output", i, cfg->d, cfg->d);
            l->ffn_norm = weight(ctx, "ffn_norm", i, cfg->d, 0);
            l->w1 = weight(ctx, "ffn_gate", i, cfg->d, cfg->n_ff);
            l->w3 = weight(ctx, "ffn_up", i, cfg->d, cfg->n_ff);
            l->w2 = weight(ctx, "ffn_down", i, cfg->n_ff, cfg->d);
        } else {
            w->out_norm = weight(ctx, "output_norm", -1, cfg->d, 0);
            w->out = weight(ctx, "output", -1, cfg->d, cfg->n_out);
        }
        w->buf[i] = loom_alloc_ctx_tensors(ctx, bufts[i]);
        if (!w->buf[i]) goto fail;
        loom_buffer_set_usage(w->buf[i], LOOM_BUFFER_USAGE_WEIGHTS);
        for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t)) {
            bool norm = strstr(t->name, "norm") != NULL;
            float scale = norm ? 0.5f : 1.0f / sqrtf((float)t->ne[0]);
            tu_fill(t, 7, scale);
            if (norm) {
                /* norms near 1: 1 + 0.5 * u */
                float *f = tu_read(t);
                for (int64_t k = 0; k < t->ne[0]; k++)
                    f[k] += 1.0f;
                loom_tensor_set(t, f, 0, loom_nbytes(t));
                free(f);
            }
        }
    }
    return true;
fail:
    tu_weights_free(w);
    return false;
}

void tu_weights_free(tu_weights *w) {
    for (int i = 0; i <= TU_MAX_LAYERS; i++) {
        loom_buffer_free(w->buf[i]);
        loom_ctx_free(w->ctx[i]);
    }
    memset(w, 0, sizeof(*w));
}

loom_tensor *tu_build(loom_ctx *ctx, const tu_weights *w, tu_inputs *in) {
    const tu_cfg *c = &w->cfg;
    const int hd = c->d / c->n_head;
    in->x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, c->d, c->T);
    in->pos = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, c->T);
    in->mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, c->T, c->T);
    if (!in->x || !in->pos || !in->mask) return NULL;
    loom_set_name(in->x, "inp_embd");
    loom_set_name(in->pos, "inp_pos");
    loom_set_name(in->mask, "kq_mask");
    loom_set_input(in->x);
    loom_set_input(in->pos);
    loom_set_input(in->mask);

    loom_tensor *x = in->x;
    for (int i = 0; i < c->n_layer; i++) {
        const tu_layer *l = &w->l[i];
        loom_tensor *h = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), l->attn_norm);
        loom_tensor *q = loom_reshape_3d(ctx, loom_mul_mat(ctx, l->wq, h), hd, c->n_head, c->T);
        loom_tensor *k = loom_reshape_3d(ctx, loom_mul_mat(ctx, l->wk, h), hd, c->n_head, c->T);
        loom_tensor *v = loom_reshape_3d(ctx, loom_mul_mat(ctx, l->wv, h), hd, c->n_head, c->T);
        q = loom_rope_ext(ctx, q, in->pos, NULL, hd, LOOM_ROPE_TYPE_NEOX, 10000.0f, 1.0f);
        k = loom_rope_ext(ctx, k, in->pos, NULL, hd, LOOM_ROPE_TYPE_NEOX, 10000.0f, 1.0f);
        q = loom_permute(ctx, q, 0, 2, 1, 3);
        k = loom_permute(ctx, k, 0, 2, 1, 3);
        v = loom_permute(ctx, v, 0, 2, 1, 3);
        loom_tensor *a =
            loom_flash_attn_ext(ctx, q, k, v, in->mask, NULL, 1.0f / sqrtf((float)hd), 0.0f, 0.0f);
        a = loom_reshape_2d(ctx, a, c->d, c->T);
        x = loom_add(ctx, x, loom_mul_mat(ctx, l->wo, a));
        loom_format_name(x, "attn_out-%d", i);
        loom_tensor *f = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), l->ffn_norm);
        loom_tensor *g =
            loom_swiglu_split(ctx, loom_mul_mat(ctx, l->w1, f), loom_mul_mat(ctx, l->w3, f));
        x = loom_add(ctx, x, loom_mul_mat(ctx, l->w2, g));
        if (!x) return NULL;
        loom_format_name(x, "l_out-%d", i);
    }
    loom_tensor *h = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), w->out_norm);
    loom_tensor *out = loom_mul_mat(ctx, w->out, h);
    if (out) loom_set_name(out, "result_output");
    return out;
}

void tu_set_inputs(const tu_inputs *in, uint32_t seed) {
    tu_fill(in->x, seed, 1.0f);
    int64_t T = in->pos->ne[0];
    int32_t *pos = malloc((size_t)T * sizeof(*pos));
    for (int64_t i = 0; i < T; i++)
        pos[i] = (int32_t)i;
    loom_tensor_set(in->pos, pos, 0, (size_t)T * sizeof(*pos));
    free(pos);
    float *mask = malloc((size_t)(T * T) * sizeof(*mask));
    for (int64_t j = 0; j < T; j++) {
        for (int64_t i = 0; i < T; i++)
            mask[j * T + i] = i <= j ? 0.0f : -INFINITY;
    }
    loom_tensor_set(in->mask, mask, 0, (size_t)(T * T) * sizeof(*mask));
    free(mask);
}

loom_graph *tu_graph(loom_ctx *ctx, loom_tensor *out) {
    if (!out) return NULL;
    loom_graph *g = loom_graph_new(ctx, 2 * LOOM_DEFAULT_GRAPH_SIZE);
    if (!g || loom_graph_build_forward(g, out) != LOOM_OK) return NULL;
    return g;
}

bool tu_model_new(tu_model *m, const tu_cfg *cfg, const loom_buft_t *bufts) {
    memset(m, 0, sizeof(*m));
    if (!tu_weights_new(&m->w, cfg, bufts)) return false;
    return tu_model_rebuild(m, cfg->T);
}

bool tu_model_rebuild(tu_model *m, int T) {
    loom_ctx_free(m->ctx);
    m->w.cfg.T = T;
    m->ctx = tu_ctx(64 + 40 * (size_t)m->w.cfg.n_layer, true);
    m->out = m->ctx ? tu_build(m->ctx, &m->w, &m->in) : NULL;
    if (m->out) loom_set_output(m->out);
    m->g = tu_graph(m->ctx, m->out);
    return m->g != NULL;
}

void tu_model_free(tu_model *m) {
    loom_ctx_free(m->ctx);
    tu_weights_free(&m->w);
    memset(m, 0, sizeof(*m));
}

bool tu_ref_compute(tu_ref *ref, const tu_cfg *cfg, uint32_t seed) {
    memset(ref, 0, sizeof(*ref));
    loom_buft_t cpu_bufts[TU_MAX_LAYERS + 1];
    for (int i = 0; i <= cfg->n_layer; i++)
        cpu_bufts[i] = loom_cpu_buffer_type();
    if (!tu_weights_new(&ref->w, cfg, cpu_bufts)) return false;
    ref->ctx = tu_ctx(64 + 40 * (size_t)cfg->n_layer, true);
    tu_inputs in;
    ref->out = ref->ctx ? tu_build(ref->ctx, &ref->w, &in) : NULL;
    loom_graph *g = tu_graph(ref->ctx, ref->out);
    ref->buf = g ? loom_alloc_ctx_tensors(ref->ctx, loom_cpu_buffer_type()) : NULL;
    ref->cpu = loom_cpu_backend_new(2);
    if (!ref->buf || !ref->cpu) return false;
    tu_set_inputs(&in, seed);
    return loom_backend_graph_compute(ref->cpu, g) == LOOM_OK;
}

void tu_ref_free(tu_ref *ref) {
    loom_backend_free(ref->cpu);
    loom_buffer_free(ref->buf);
    loom_ctx_free(ref->ctx);
    tu_weights_free(&ref->w);
    memset(ref, 0, sizeof(*ref));
}

/* ---------------------------------------------------------------- a small buffer type */

typedef struct small_buft_ctx {
    size_t max_size, alignment;
} small_buft_ctx;

static const char *small_name(loom_buft_t b) {
    (void)b;
    return "SMALL";
}
static loom_buffer_t small_alloc(loom_buft_t b, size_t size) {
    (void)b;
    return loom_buft_alloc_buffer(loom_cpu_buffer_type(), size);
}
static size_t small_align(loom_buft_t b) {
    return ((small_buft_ctx *)b->context)->alignment;
}
static size_t small_max(loom_buft_t b) {
    return ((small_buft_ctx *)b->context)->max_size;
}
static bool small_is_host(loom_buft_t b) {
    (void)b;
    return true;
}

static const struct loom_buft_i small_buft_i = {
    .get_name = small_name,
    .alloc_buffer = small_alloc,
    .get_alignment = small_align,
    .get_max_size = small_max,
    .is_host = small_is_host,
};

loom_buft_t tu_small_buft(size_t max_size, size_t alignment) {
    static small_buft_ctx ctxs[4];
    static struct loom_buft bufts[4];
    static int n;
    for (int i = 0; i < n; i++) {
        if (ctxs[i].max_size == max_size && ctxs[i].alignment == alignment) return &bufts[i];
    }
    if (n == 4) return NULL;
    ctxs[n] = (small_buft_ctx){max_size, alignment};
    bufts[n] = (struct loom_buft){&small_buft_i, loom_cpu_dev(), &ctxs[n]};
    return &bufts[n++];
}

/* ---------------------------------------------------------------- logs */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_log;
static size_t g_log_len, g_log_cap;
static loom_log_level g_log_prev_level;

static void log_sink(loom_log_level level, const char *msg, void *ud) {
    (void)level;
    (void)ud;
    pthread_mutex_lock(&g_log_mu);
    size_t n = strlen(msg);
    if (g_log_len + n + 2 > g_log_cap) {
        size_t cap = g_log_cap ? g_log_cap : 4096;
        while (cap < g_log_len + n + 2)
            cap *= 2;
        char *p = realloc(g_log, cap);
        if (!p) {
            pthread_mutex_unlock(&g_log_mu);
            return;
        }
        g_log = p;
        g_log_cap = cap;
    }
    memcpy(g_log + g_log_len, msg, n);
    g_log_len += n;
    g_log[g_log_len++] = '\n';
    g_log[g_log_len] = '\0';
    pthread_mutex_unlock(&g_log_mu);
}

void tu_log_start(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log_len = 0;
    if (g_log) g_log[0] = '\0';
    pthread_mutex_unlock(&g_log_mu);
    g_log_prev_level = loom_log_get_level();
    loom_log_set_level(LOOM_LOG_DEBUG);
    loom_log_set(log_sink, NULL);
}

void tu_log_stop(void) {
    loom_log_set(NULL, NULL);
    loom_log_set_level(g_log_prev_level);
}

const char *tu_log_text(void) {
    return g_log ? g_log : "";
}

int tu_log_count(const char *needle) {
    int n = 0;
    for (const char *p = tu_log_text(); (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* ---------------------------------------------------------------- faults */

static int g_fail_at, g_calls;

static void *fail_malloc(size_t size, void *ud) {
    (void)ud;
    if (++g_calls >= g_fail_at) return NULL;
    return malloc(size);
}

static void *fail_realloc(void *p, size_t size, void *ud) {
    (void)ud;
    if (++g_calls >= g_fail_at) return NULL;
    return realloc(p, size);
}

static void fail_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

void tu_fail_after(int n) {
    g_fail_at = n;
    g_calls = 0;
    loom_allocator a = {fail_malloc, fail_realloc, fail_free, NULL};
    loom_allocator_set(&a);
}

int tu_fail_stop(void) {
    loom_allocator_set(NULL);
    return g_calls;
}
