/*
 * llama-family hyperparameters and weight loading from GGUF.
 *
 * Hyperparameters come from "<arch>.*" keys. Weights are created as headers in a no_alloc
 * context per buffer type (the caller's placement decides the buffer type of each), every
 * shape is checked against the hyperparameters, the buffers are allocated in one go per
 * type, and the bytes are copied from the mapped file with loom_tensor_set (so any buffer
 * kind works: host, a simulated device, a meta device's split buffer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"
#include "loom/cpu.h"

static const struct {
    const char *name;
    int rope_type;
} ARCHS[] = {
    {"llama", LOOM_ROPE_TYPE_NORMAL},
    {"mistral", LOOM_ROPE_TYPE_NORMAL},
    {"mixtral", LOOM_ROPE_TYPE_NORMAL},
    {"qwen2", LOOM_ROPE_TYPE_NEOX},
    {"qwen2moe", LOOM_ROPE_TYPE_NEOX},
};

static loom_status key_int(const loom_gguf *g, const char *arch, const char *suffix, bool required,
                           int64_t dflt, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (loom_gguf_find_kv(g, key) < 0) {
        if (required)
            return loom_error(LOOM_ERR_FORMAT, "model: missing metadata key '%s'", key);
        *out = dflt;
        return LOOM_OK;
    }
    loom_status st = loom_gguf_get_int(g, key, out);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    return LOOM_OK;
}

static loom_status key_float(const loom_gguf *g, const char *arch, const char *suffix, double dflt,
                             double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (loom_gguf_find_kv(g, key) < 0) {
        *out = dflt;
        return LOOM_OK;
    }
    loom_status st = loom_gguf_get_float(g, key, out);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    return LOOM_OK;
}

loom_status loom_hparams_from_gguf(const loom_gguf *g, loom_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    const char *arch;
    loom_status st = loom_gguf_get_str(g, "general.architecture", &arch);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    int ai = -1;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(arch, ARCHS[i].name) == 0) ai = (int)i;
    if (ai < 0)
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "model: unknown architecture '%s' (supported: llama, mistral, mixtral, "
                          "qwen2, qwen2moe)",
                          arch);
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);
    hp->rope_type = ARCHS[ai].rope_type;
    int64_t v;
    if ((st = key_int(g, arch, "embedding_length", true, 0, &hp->n_embd)) ||
        (st = key_int(g, arch, "block_count", true, 0, &hp->n_layer)) ||
        (st = key_int(g, arch, "attention.head_count", true, 0, &hp->n_head)) ||
        (st = key_int(g, arch, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) ||
        (st = key_int(g, arch, "context_length", false, 2048, &hp->n_ctx_train)) ||
        (st = key_int(g, arch, "expert_count", false, 0, &hp->n_expert)) ||
        (st = key_int(g, arch, "expert_used_count", false, 0, &hp->n_expert_used)))
        return st;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_layer > LOOM_MODEL_MAX_LAYERS || hp->n_head % hp->n_head_kv != 0)
        return loom_error(LOOM_ERR_FORMAT,
                          "model: bad hyperparameters: n_embd %lld, n_layer %lld (max %d), n_head "
                          "%lld, n_head_kv %lld (n_head must be a multiple)",
                          (long long)hp->n_embd, (long long)hp->n_layer, LOOM_MODEL_MAX_LAYERS,
                          (long long)hp->n_head, (long long)hp->n_head_kv);
    if ((st = key_int(g, arch, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim)))
        return st;
    if ((st = key_int(g, arch, "rope.dimension_count", false, hp->head_dim, &hp->n_rot))) return st;
    if (hp->n_expert > 0) {
        if ((st = key_int(g, arch, "expert_feed_forward_length", false, -1, &v))) return st;
        if (v < 0 && (st = key_int(g, arch, "feed_forward_length", true, 0, &v))) return st;
        hp->n_ff = v;
        if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)
            return loom_error(LOOM_ERR_FORMAT, "model: expert_used_count %lld of %lld experts",
                              (long long)hp->n_expert_used, (long long)hp->n_expert);
        hp->norm_topk = strcmp(arch, "qwen2moe") != 0;
    } else if ((st = key_int(g, arch, "feed_forward_length", true, 0, &hp->n_ff))) {
        return st;
    }
    double f;
    if ((st = key_float(g, arch, "attention.layer_norm_rms_epsilon", 1e-5, &f))) return st;
    hp->rms_eps = (float)f;
    if ((st = key_float(g, arch, "rope.freq_base", 10000.0, &f))) return st;
    hp->rope_freq_base = (float)f;
    if ((st = key_float(g, arch, "rope.scaling.factor", 1.0, &f))) return st;
    hp->rope_freq_scale = f > 0 ? (float)(1.0 / f) : 1.0f;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return loom_error(LOOM_ERR_FORMAT, "model: rope dimension %lld does not fit head_dim %lld",
                          (long long)hp->n_rot, (long long)hp->head_dim);
    hp->attn_block = hp->ffn_block = 1;
    int64_t ti;
    if ((ti = loom_gguf_find_tensor(g, "blk.0.attn_output.weight")) >= 0)
        hp->attn_block = loom_blck_size(loom_gguf_tensor_type(g, ti));
    if ((ti = loom_gguf_find_tensor(g, "blk.0.ffn_down.weight")) >= 0 ||
        (ti = loom_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight")) >= 0)
        hp->ffn_block = loom_blck_size(loom_gguf_tensor_type(g, ti));
    char key[128];
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    if (loom_gguf_find_kv(g, key) >= 0) {
        if ((st = loom_gguf_get_int(g, key, &hp->n_vocab))) return st;
    } else {
        int64_t ti = loom_gguf_find_tensor(g, "token_embd.weight");
        if (ti < 0) return loom_error(LOOM_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
        int64_t ne[4];
        loom_gguf_tensor_ne(g, ti, ne);
        hp->n_vocab = ne[1];
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- loading */

typedef struct pending {
    loom_tensor *t;
    int64_t gi;   /* gguf tensor index */
    int layer;
    loom_buft_t buft;
} pending;

static loom_status add_weight(loom_model *m, const loom_gguf *g, const loom_model_params *p,
                              const char *name, int layer, bool required, int n_dims,
                              const int64_t *ne, loom_tensor **slot, pending *list, int *n_list) {
    int64_t gi = loom_gguf_find_tensor(g, name);
    if (gi < 0) {
        if (required) return loom_error(LOOM_ERR_FORMAT, "model: missing tensor '%s'", name);
        *slot = NULL;
        return LOOM_OK;
    }
    int64_t fne[4];
    loom_gguf_tensor_ne(g, gi, fne);
    for (int d = 0; d < 4; d++) {
        int64_t want = d < n_dims ? ne[d] : 1;
        if (fne[d] != want)
            return loom_error(LOOM_ERR_SHAPE,
                              "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
                              "[%lld, %lld, %lld] from the hyperparameters",
                              name, (long long)fne[0], (long long)fne[1], (long long)fne[2],
                              (long long)fne[3], (long long)ne[0],
                              (long long)(n_dims > 1 ? ne[1] : 1), (long long)(n_dims > 2 ? ne[2] : 1));
    }
    loom_tensor *t = loom_new_tensor(m->ctx, loom_gguf_tensor_type(g, gi), 4, fne);
    if (!t) return loom_error(LOOM_ERR_NOMEM, "model: cannot create tensor '%s': %s", name, loom_last_error());
    loom_set_name(t, name);
    loom_set_param(t);
    *slot = t;
    loom_buft_t buft = p && p->placement ? p->placement(name, layer, p->placement_user_data) : NULL;
    if (!buft) buft = p && p->default_buft ? p->default_buft : loom_cpu_buffer_type();
    list[*n_list] = (pending){.t = t, .gi = gi, .layer = layer, .buft = buft};
    (*n_list)++;
    return LOOM_OK;
}

loom_status loom_model_load(const loom_gguf *g, const loom_model_params *p, loom_model **out) {
    *out = NULL;
    int64_t t0 = loom_time_us();
    loom_model *m = loom_calloc(1, sizeof *m);
    if (!m) return loom_error(LOOM_ERR_NOMEM, "model: out of memory");
    loom_status st = loom_hparams_from_gguf(g, &m->hp);
    if (st) {
        loom_free(m);
        return st;
    }
    const loom_hparams *hp = &m->hp;
    int64_t n_tensors = loom_gguf_tensor_count(g);
    m->ctx = loom_ctx_new((loom_ctx_params){
        .mem_size = (size_t)(n_tensors + 8) * loom_tensor_overhead(), .no_alloc = true});
    pending *list = loom_calloc((size_t)n_tensors + 1, sizeof *list);
    if (!m->ctx || !list) {
        loom_free(list);
        loom_model_free(m);
        return loom_error(LOOM_ERR_NOMEM, "model: out of memory");
    }
    int n_list = 0;
    const int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff, X = hp->n_expert;
    const int64_t Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
#define W(name, layer, req, nd, slot, ...)                                                         \
    do {                                                                                           \
        int64_t ne_[3] = {__VA_ARGS__};                                                            \
        st = add_weight(m, g, p, name, layer, req, nd, ne_, slot, list, &n_list);                  \
        if (st) goto fail;                                                                         \
    } while (0)
    W("token_embd.weight", -1, true, 2, &m->tok_embd, E, V);
    W("output_norm.weight", -1, true, 1, &m->output_norm, E);
    W("output.weight", -1, false, 2, &m->output, E, V);
    if (!m->output) m->output = m->tok_embd; /* tied embeddings */
    char name[LOOM_MAX_NAME];
    for (int il = 0; il < hp->n_layer; il++) {
        loom_layer *L = &m->layers[il];
#define N(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
        W(N("attn_norm.weight"), il, true, 1, &L->attn_norm, E);
        bool fused = loom_gguf_find_tensor(g, N("attn_qkv.weight")) >= 0;
        if (fused) {
            W(N("attn_qkv.weight"), il, true, 2, &L->wqkv, E, Dq + 2 * Dkv);
            W(N("attn_qkv.bias"), il, false, 1, &L->bqkv, Dq + 2 * Dkv);
        } else {
            W(N("attn_q.weight"), il, true, 2, &L->wq, E, Dq);
            W(N("attn_k.weight"), il, true, 2, &L->wk, E, Dkv);
            W(N("attn_v.weight"), il, true, 2, &L->wv, E, Dkv);
            W(N("attn_q.bias"), il, false, 1, &L->bq, Dq);
            W(N("attn_k.bias"), il, false, 1, &L->bk, Dkv);
            W(N("attn_v.bias"), il, false, 1, &L->bv, Dkv);
        }
        W(N("attn_output.weight"), il, true, 2, &L->wo, Dq, E);
        W(N("attn_output.bias"), il, false, 1, &L->bo, E);
        W(N("ffn_norm.weight"), il, true, 1, &L->ffn_norm, E);
        if (X > 0) {
            W(N("ffn_gate_inp.weight"), il, true, 2, &L->ffn_gate_inp, E, X);
            W(N("ffn_gate_exps.weight"), il, true, 3, &L->ffn_gate_exps, E, F, X);
            W(N("ffn_up_exps.weight"), il, true, 3, &L->ffn_up_exps, E, F, X);
            W(N("ffn_down_exps.weight"), il, true, 3, &L->ffn_down_exps, F, E, X);
            W(N("ffn_gate_exps.bias"), il, false, 2, &L->ffn_gate_exps_b, F, X);
            W(N("ffn_up_exps.bias"), il, false, 2, &L->ffn_up_exps_b, F, X);
            W(N("ffn_down_exps.bias"), il, false, 2, &L->ffn_down_exps_b, E, X);
        } else {
            W(N("ffn_gate.weight"), il, true, 2, &L->ffn_gate, E, F);
            W(N("ffn_up.weight"), il, true, 2, &L->ffn_up, E, F);
            W(N("ffn_down.weight"), il, true, 2, &L->ffn_down, F, E);
        }
#undef N
    }
#undef W
    /* one buffer per distinct buffer type */
    loom_buft_t bufts[64];
    int n_bufts = 0;
    for (int i = 0; i < n_list; i++) {
        int k = 0;
        while (k < n_bufts && bufts[k] != list[i].buft) k++;
        if (k == n_bufts) {
            if (n_bufts == 64) {
                st = loom_error(LOOM_ERR_INVALID_ARG, "model: more than 64 buffer types");
                goto fail;
            }
            bufts[n_bufts++] = list[i].buft;
        }
    }
    m->buffers = loom_calloc((size_t)n_bufts + 1, sizeof *m->buffers);
    if (!m->buffers) {
        st = loom_error(LOOM_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int k = 0; k < n_bufts; k++) {
        /* place this buffer type's tensors one after another, aligned */
        size_t align = loom_buft_alignment(bufts[k]), total = 0;
        for (int i = 0; i < n_list; i++)
            if (list[i].buft == bufts[k])
                total += (loom_buft_alloc_size(bufts[k], list[i].t) + align - 1) / align * align;
        loom_buffer_t buf = loom_buft_alloc_buffer(bufts[k], total);
        if (!buf) {
            st = loom_error(loom_last_status() ? loom_last_status() : LOOM_ERR_DEVICE_OOM,
                            "model: cannot allocate %.1f MiB of weights on %s: %s",
                            (double)total / (1024.0 * 1024.0), loom_buft_name(bufts[k]), loom_last_error());
            goto fail;
        }
        loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
        m->buffers[m->n_buffers++] = buf;
        size_t off = 0;
        for (int i = 0; i < n_list; i++) {
            if (list[i].buft != bufts[k]) continue;
            if ((st = loom_buffer_alloc_tensor(buf, list[i].t, off))) goto fail;
            off += (loom_buft_alloc_size(bufts[k], list[i].t) + align - 1) / align * align;
        }
    }
    size_t total = 0, done = 0;
    for (int i = 0; i < n_list; i++) total += loom_gguf_tensor_size(g, list[i].gi);
    for (int i = 0; i < n_list && !(p && p->no_data); i++) {
        size_t n = loom_gguf_tensor_size(g, list[i].gi);
        const void *src = loom_gguf_tensor_data(g, list[i].gi);
        if (!src && n) {
            st = loom_error(LOOM_ERR_FORMAT,
                            "model: tensor '%s' has no data in the file (a header-only file "
                            "can only be planned)",
                            list[i].t->name);
            goto fail;
        }
        loom_tensor_set(list[i].t, src, 0, n);
        done += n;
        if (p && p->progress) p->progress(done, total, p->progress_user_data);
    }
    m->n_bytes = total;
    loom_free(list);
    m->load_us = loom_time_us() - t0;
    *out = m;
    return LOOM_OK;
fail:
    loom_free(list);
    loom_model_free(m);
    return st;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_buffers; i++) loom_buffer_free(m->buffers[i]);
    loom_free(m->buffers);
    loom_ctx_free(m->ctx);
    loom_free(m);
}

void loom_model_foreach_weight(loom_model *m, void (*fn)(loom_tensor *t, int layer, void *ud),
                               void *ud) {
    for (loom_tensor *t = loom_ctx_first_tensor(m->ctx); t; t = loom_ctx_next_tensor(m->ctx, t)) {
        int layer = -1;
        if (strncmp(t->name, "blk.", 4) == 0) layer = atoi(t->name + 4);
        fn(t, layer, ud);
    }
}
