#define _GNU_SOURCE
/*
 * llama-family hyperparameters and weight loading from GGUF.
 *
 * Hyperparameters come from "<arch>.*" keys. Weights are created as headers in a no_alloc
 * context per buffer type (the caller's placement decides the buffer type of each), every
 * shape is checked against the hyperparameters, the buffers are allocated in one go per
 * type. CPU weights whose file offset is 32-byte aligned are used in place from the model's
 * own private mapping of the file (no copy; the gguf may be freed first); every other
 * weight is copied with loom_tensor_set (so any buffer kind works: host, a simulated
 * device, a meta device's split buffer) in whole-row pieces of at most load_chunk bytes,
 * from the mapping (whose pages are dropped once copied) or, when the file cannot be
 * mapped or no_mmap is set, read through one staging buffer of that size.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "model/arch-impl.h"

#define LOOM_MAX_ROT 1024

static const loom__arch *const ARCHS[] = {
    &loom__arch_llama,    &loom__arch_mistral, &loom__arch_mixtral,  &loom__arch_qwen2,
    &loom__arch_qwen2moe, &loom__arch_qwen3,   &loom__arch_qwen3moe, &loom__arch_gemma2,
    &loom__arch_gemma3,   &loom__arch_phi3,    &loom__arch_gptoss,
};

/* "<arch>." keys every architecture understands: read below, or without effect on the
 * math (context_length is only a default; rope.scaling.finetuned is informational;
 * tensor_data_layout names the one layout there is). A family adds its own (arch-*.c). */
static const char *const COMMON_KEYS[] = {
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "context_length",
    "expert_count",
    "expert_used_count",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "expert_feed_forward_length",
    "feed_forward_length",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.scaling.factor",
    "rope.scale_linear",
    "rope.scaling.type",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "vocab_size",
    "expert_weights_norm",
    "expert_gating_func",
    "tensor_data_layout",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "rope.scaling.attn_factor",
    NULL,
};

loom_status loom__key_int(const loom_gguf *g, const char *arch, const char *suffix, bool required,
                          int64_t dflt, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (loom_gguf_find_kv(g, key) < 0) {
        if (required) return loom_error(LOOM_ERR_FORMAT, "model: missing metadata key '%s'", key);
        *out = dflt;
        return LOOM_OK;
    }
    loom_status st = loom_gguf_get_int(g, key, out);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    return LOOM_OK;
}

loom_status loom__key_float(const loom_gguf *g, const char *arch, const char *suffix, double dflt,
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

/* Every size the graph multiplies: bounded, and the products (q/k/v widths, the fused QKV
 * width) checked, so nothing read from a file can wrap around. */
static loom_status check_sizes(const loom_hparams *hp) {
    int64_t dq, dkv, dqkv;
    const int64_t M = LOOM_MODEL_MAX_DIM;
    if (hp->n_embd > M || hp->n_head > M || hp->n_head_kv > M || hp->head_dim <= 0 ||
        hp->head_dim > M || hp->n_expert < 0 || hp->n_expert > LOOM_MODEL_MAX_EXPERTS ||
        hp->n_ctx_train <= 0 || loom_mul_overflow_i64(hp->n_head, hp->head_dim, &dq) || dq > M ||
        loom_mul_overflow_i64(hp->n_head_kv, hp->head_dim, &dkv) ||
        loom_add_overflow_i64(dq, 2 * dkv, &dqkv) || dqkv > M)
        return loom_error(LOOM_ERR_FORMAT,
                          "model: bad hyperparameters: n_embd %lld, n_head %lld x head_dim %lld, "
                          "n_head_kv %lld, %lld experts, context %lld (each width at most %lld, "
                          "experts at most %d, context > 0)",
                          (long long)hp->n_embd, (long long)hp->n_head, (long long)hp->head_dim,
                          (long long)hp->n_head_kv, (long long)hp->n_expert,
                          (long long)hp->n_ctx_train, (long long)M, LOOM_MODEL_MAX_EXPERTS);
    return LOOM_OK;
}

#define key_int loom__key_int
#define key_float loom__key_float

static bool listed(const char *const *list, const char *suffix) {
    for (; list && *list; list++)
        if (strcmp(*list, suffix) == 0) return true;
    return false;
}

/* Every "<arch>." key must be one loom reads or knows to be without effect. */
static loom_status check_keys(const loom_gguf *g, const loom__arch *a) {
    size_t n = strlen(a->name);
    for (int64_t i = 0; i < loom_gguf_kv_count(g); i++) {
        const char *key = loom_gguf_kv_key(g, i);
        if (strncmp(key, a->name, n) != 0 || key[n] != '.') continue;
        if (!listed(COMMON_KEYS, key + n + 1) && !listed(a->keys, key + n + 1))
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "model: metadata key '%s' is not understood by loom for "
                              "architecture '%s' (it may change the model's math; refusing "
                              "rather than ignoring it)",
                              key, a->name);
    }
    return LOOM_OK;
}

/* rope.scaling.*: none, linear (factor), llama3 (factors in rope_freqs.weight), yarn
 * (factor, original_context_length, yarn_* with the reference's defaults). */
static loom_status read_rope_scaling(const loom_gguf *g, loom_hparams *hp) {
    char key[128];
    const char *type = "linear";
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    loom_status st;
    if (loom_gguf_find_kv(g, key) >= 0 && (st = loom_gguf_get_str(g, key, &type)))
        return loom_error(st, "model: %s", loom_last_error());
    double f;
    if ((st = key_float(g, hp->arch, "rope.scale_linear", 1.0, &f)) ||
        (st = key_float(g, hp->arch, "rope.scaling.factor", f, &f)))
        return st;
    bool has_freqs = loom_gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    /* finite and in range (NaN compares false); 0 means no scaling, as llama.cpp reads it */
    if (!(f >= 0 && f <= 1e6))
        return loom_error(LOOM_ERR_FORMAT,
                          "model: %s.rope.scaling.factor = %g (must be finite, 0 or > 0)", hp->arch,
                          f);
    if (strcmp(type, "none") == 0 || (strcmp(type, "llama3") == 0 && has_freqs)) {
        hp->rope_freq_scale = 1.0f;
    } else if (strcmp(type, "linear") == 0) {
        hp->rope_freq_scale = f > 0 ? (float)(1.0 / f) : 1.0f;
    } else if (strcmp(type, "yarn") == 0) {
        if (!(f > 0))
            return loom_error(LOOM_ERR_FORMAT, "model: %s.rope.scaling.factor %g (must be > 0)",
                              hp->arch, f);
        if (has_freqs)
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "model: YaRN together with 'rope_freqs.weight' is not supported");
        hp->rope_yarn = true;
        hp->rope_freq_scale = (float)(1.0 / f);
        double ext, attn, fast, slow;
        if ((st = key_int(g, hp->arch, "rope.scaling.original_context_length", true, 0,
                          &hp->n_ctx_orig)) ||
            (st = key_float(g, hp->arch, "rope.scaling.yarn_ext_factor", 1.0, &ext)) ||
            (st = key_float(g, hp->arch, "rope.scaling.yarn_attn_factor", 1.0, &attn)) ||
            (st = key_float(g, hp->arch, "rope.scaling.yarn_beta_fast", 32.0, &fast)) ||
            (st = key_float(g, hp->arch, "rope.scaling.yarn_beta_slow", 1.0, &slow)))
            return st;
        if (hp->n_ctx_orig <= 0)
            return loom_error(LOOM_ERR_FORMAT,
                              "model: %s.rope.scaling.original_context_length %lld (must be > 0)",
                              hp->arch, (long long)hp->n_ctx_orig);
        /* finite, and in range (each test fails for NaN): ext_factor 0 turns the ramp off,
         * a negative one would extrapolate backwards; a beta <= 0 puts a log of a negative
         * number (or of infinity) into the correction dims, an attn_factor <= 0 zeroes or
         * flips q.k */
        const struct {
            const char *name;
            double v;
            bool zero_ok;
        } yk[] = {{"yarn_ext_factor", ext, true},
                  {"yarn_attn_factor", attn, false},
                  {"yarn_beta_fast", fast, false},
                  {"yarn_beta_slow", slow, false}};
        for (size_t i = 0; i < sizeof yk / sizeof yk[0]; i++)
            if (!(yk[i].v <= 3.4e38 && (yk[i].zero_ok ? yk[i].v >= 0 : yk[i].v > 0)))
                return loom_error(LOOM_ERR_FORMAT,
                                  "model: %s.rope.scaling.%s = %g (must be finite and %s 0)",
                                  hp->arch, yk[i].name, yk[i].v, yk[i].zero_ok ? ">=" : ">");
        hp->yarn_ext_factor = (float)ext;
        hp->yarn_attn_factor = (float)attn;
        hp->yarn_beta_fast = (float)fast;
        hp->yarn_beta_slow = (float)slow;
    } else if (strcmp(type, "llama3") == 0) {
        return loom_error(LOOM_ERR_FORMAT,
                          "model: '%s' = 'llama3' needs the tensor 'rope_freqs.weight' (the "
                          "per-frequency factors), which the file lacks",
                          key);
    } else {
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "model: '%s' = '%s' is not supported (none, linear, llama3, yarn)", key,
                          type);
    }
    return LOOM_OK;
}

static const loom__arch *find_arch(const char *name) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(name, ARCHS[i]->name) == 0) return ARCHS[i];
    return NULL;
}

loom_status loom_hparams_from_gguf(const loom_gguf *g, loom_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    const char *arch;
    loom_status st = loom_gguf_get_str(g, "general.architecture", &arch);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    const loom__arch *A = find_arch(arch);
    if (!A) {
        char names[256] = "";
        size_t len = 0;
        for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                    ARCHS[i]->name);
        return loom_error(LOOM_ERR_UNSUPPORTED, "model: unknown architecture '%s' (supported: %s)",
                          arch, names);
    }
    if ((st = check_keys(g, A))) return st;
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);
    hp->rope_type = A->rope_type;
    hp->ffn_glu = LOOM_GLU_SWIGLU;
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
    if ((st = key_int(g, arch, "attention.key_length", false, hp->n_embd / hp->n_head,
                      &hp->head_dim)))
        return st;
    if ((st = check_sizes(hp))) return st;
    if ((st = key_int(g, arch, "rope.dimension_count", false, hp->head_dim, &hp->n_rot))) return st;
    if ((st = key_int(g, arch, "attention.value_length", false, hp->head_dim, &v))) return st;
    if (v != hp->head_dim)
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "model: %s.attention.value_length %lld differs from key_length %lld "
                          "(not supported)",
                          arch, (long long)v, (long long)hp->head_dim);
    if (hp->n_expert > 0) {
        if ((st = key_int(g, arch, "expert_feed_forward_length", false, -1, &v))) return st;
        if (v < 0 && (st = key_int(g, arch, "feed_forward_length", true, 0, &v))) return st;
        hp->n_ff = v;
        if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)
            return loom_error(LOOM_ERR_FORMAT, "model: expert_used_count %lld of %lld experts",
                              (long long)hp->n_expert_used, (long long)hp->n_expert);
        hp->norm_topk = true;
        if ((st = key_int(g, arch, "expert_gating_func", false, 1, &v))) return st;
        if (v != 1)
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "model: %s.expert_gating_func %lld is not supported (1 = softmax)",
                              arch, (long long)v);
    } else if ((st = key_int(g, arch, "feed_forward_length", true, 0, &hp->n_ff))) {
        return st;
    } else {
        hp->n_expert_used = 0; /* no experts: a stray expert_used_count means nothing */
    }
    if (hp->n_ff <= 0 || hp->n_ff > LOOM_MODEL_MAX_DIM)
        return loom_error(LOOM_ERR_FORMAT, "model: feed_forward_length %lld (must be 1..%lld)",
                          (long long)hp->n_ff, (long long)LOOM_MODEL_MAX_DIM);
    /* float hyperparameters: finite and in range (NaN compares false everywhere, so each
     * test is written to fail for NaN) */
    double f;
    if ((st = key_float(g, arch, "attention.layer_norm_rms_epsilon", 1e-5, &f))) return st;
    if (!(f > 0 && f < 1))
        return loom_error(LOOM_ERR_FORMAT,
                          "model: %s.attention.layer_norm_rms_epsilon = %g (must be in (0, 1))",
                          arch, f);
    hp->rms_eps = (float)f;
    if ((st = key_float(g, arch, "rope.freq_base", 10000.0, &f))) return st;
    if (!(f > 0 && f <= 3.4e38))
        return loom_error(LOOM_ERR_FORMAT, "model: %s.rope.freq_base = %g (must be finite and > 0)",
                          arch, f);
    hp->rope_freq_base = (float)f;
    if ((st = read_rope_scaling(g, hp))) return st;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return loom_error(LOOM_ERR_FORMAT, "model: rope dimension %lld does not fit head_dim %lld",
                          (long long)hp->n_rot, (long long)hp->head_dim);
    hp->attn_block = hp->ffn_block = 1;
    int64_t ti;
    /* a tensor type loom cannot compute with is refused by name here, before its block
     * size is read (loom_gguf_tensor_check_type) */
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++)
        if ((st = loom_gguf_tensor_check_type(g, i))) return st;
    if ((ti = loom_gguf_find_tensor(g, "blk.0.attn_output.weight")) >= 0)
        hp->attn_block = loom_blck_size(loom_gguf_tensor_type(g, ti));
    if ((ti = loom_gguf_find_tensor(g, "blk.0.ffn_down.weight")) >= 0 ||
        (ti = loom_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight")) >= 0)
        hp->ffn_block = loom_blck_size(loom_gguf_tensor_type(g, ti));
    char key[128];
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    if (loom_gguf_find_kv(g, key) >= 0) {
        if ((st = loom_gguf_get_int(g, key, &hp->n_vocab)))
            return loom_error(st, "model: %s", loom_last_error());
    } else {
        int64_t ti = loom_gguf_find_tensor(g, "token_embd.weight");
        if (ti < 0) return loom_error(LOOM_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
        int64_t ne[4];
        loom_gguf_tensor_ne(g, ti, ne);
        hp->n_vocab = ne[1];
    }
    /* token ids are int32 */
    if (hp->n_vocab <= 0 || hp->n_vocab > INT32_MAX)
        return loom_error(LOOM_ERR_FORMAT, "model: vocabulary of %lld tokens (must be 1..%d)",
                          (long long)hp->n_vocab, INT32_MAX);
    if (A->read && (st = A->read(g, hp))) return st;
    if ((st = key_float(g, arch, "rope.scaling.attn_factor", 1.0, &f))) return st;
    if (!(f > 0 && f <= 3.4e38)) /* 0 would make attention uniform, NaN every logit NaN */
        return loom_error(LOOM_ERR_FORMAT,
                          "model: %s.rope.scaling.attn_factor = %g (must be finite and > 0)", arch,
                          f);
    hp->rope_attn_factor = (float)f;
    if (!hp->rope_yarn && (st = key_int(g, arch, "rope.scaling.original_context_length", false,
                                        hp->n_ctx_train, &hp->n_ctx_orig)))
        return st;
    /* rope multiplies cos and sin by mscale: q.k by mscale^2 (when every dim rotates) */
    double ms = hp->rope_attn_factor;
    if (hp->rope_yarn) {
        ms *= hp->yarn_attn_factor;
        if (hp->yarn_ext_factor != 0.0f) ms *= 1.0 + 0.1 * log(1.0 / hp->rope_freq_scale);
    }
    if (ms != 1.0) {
        if (hp->n_rot != hp->head_dim)
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "model: a rope magnitude scale (%g) with partial rotary dims (%lld "
                              "of %lld) is not supported",
                              ms, (long long)hp->n_rot, (long long)hp->head_dim);
        double base = hp->attn_scale > 0 ? hp->attn_scale : 1.0 / sqrt((double)hp->head_dim);
        hp->attn_scale = (float)(base * ms * ms);
    }
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if (loom_gguf_find_kv(g, key) >= 0 && (st = loom_gguf_get_bool(g, key, &hp->norm_topk)))
        return loom_error(st, "model: %s", loom_last_error());
    return LOOM_OK;
}

/* ---------------------------------------------------------------- loading */

typedef struct pending {
    loom_tensor *t;
    int64_t gi; /* gguf tensor index, -1 for a computed tensor */
    int layer;
    loom_buft_t buft;
    const void *data; /* a computed tensor's bytes */
    bool alias;       /* a CPU weight used in place from the model's mapping of the file */
} pending;

/* A CPU weight is used in place from the mapping when its data starts at a multiple of this
 * (the mapping is page aligned, so the file offset decides; the CPU kernels read weights with
 * unaligned loads and need only the element alignment, 32 covers every block type). */
#define LOOM_MAP_ALIGN 32
/* Device weights are copied in pieces of at most this many bytes (loom_model_params.load_chunk). */
#define LOOM_LOAD_CHUNK_DEFAULT ((size_t)16 << 20)

/* Drops the pages wholly inside [p, p + n) of a private file mapping that was only read:
 * they come back from the file if touched again, so peak RSS stays one chunk. */
static void release_pages(const void *p, size_t n) {
    long ps = sysconf(_SC_PAGESIZE);
    const size_t pg = ps > 0 ? (size_t)ps : 4096;
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Bytes per copy of an n-byte device weight: whole rows, at most `chunk` (one row when a
 * row is larger), at most n. */
static size_t chunk_step(const loom_tensor *t, size_t n, size_t chunk) {
    size_t row = t->nb[1] > 0 && (size_t)t->nb[1] < n ? (size_t)t->nb[1] : n;
    size_t step = row && chunk >= row ? chunk / row * row : row;
    return step < n ? step : n;
}

/* Copies tensor `t` (file bytes at file offset `off`) into its buffer: a host buffer reads
 * straight into place; any other buffer gets pieces of at most `chunk` bytes, from the
 * model's mapping when there is one (released after copying), else through `staging`. */
static loom_status copy_weight(const loom_gguf *g, loom_model *m, loom_tensor *t, uint64_t off,
                               size_t n, size_t chunk, void **staging) {
    if (loom_buffer_is_host(t->buffer)) {
        if (m->map) {
            memcpy(t->data, (const char *)m->map + off, n);
            release_pages((const char *)m->map + off, n);
            return LOOM_OK;
        }
        loom_status st = loom_gguf_read_at(g, off, t->data, n);
        return st ? loom_error(st, "model: tensor '%s': %s", t->name, loom_last_error()) : LOOM_OK;
    }
    size_t step = chunk_step(t, n, chunk);
    if (!m->map && !*staging) {
        *staging = loom_malloc(m->staging_bytes);
        if (!*staging)
            return loom_error(LOOM_ERR_NOMEM, "model: cannot allocate %zu bytes of load staging",
                              m->staging_bytes);
    }
    for (size_t o = 0; o < n; o += step) {
        size_t c = n - o < step ? n - o : step;
        if (m->map) {
            const char *src = (const char *)m->map + off + o;
            loom_tensor_set(t, src, o, c);
            release_pages(src, c);
        } else {
            loom_status st = loom_gguf_read_at(g, off + o, *staging, c);
            if (st) return loom_error(st, "model: tensor '%s': %s", t->name, loom_last_error());
            loom_tensor_set(t, *staging, o, c);
        }
    }
    return LOOM_OK;
}

/* YaRN as ggml's rope computes it: theta_i = p base^(-2i/n) (s (1 - mix_i) + mix_i) with
 * mix_i = ramp(i) ext_factor between the correction dims of beta_fast and beta_slow, and
 * cos and sin times mscale = attn_factor (1 + 0.1 ln(1/s)) (when ext_factor != 0). As
 * rope's frequency divisors: 1 / (s (1 - mix_i) + mix_i); mscale goes into the q.k scale. */
static double yarn_corr_dim(double n_dims, double n_ctx_orig, double beta, double base) {
    return n_dims * log(n_ctx_orig / (beta * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

static void yarn_factors(const loom_hparams *hp, float *ff) {
    const double n = (double)hp->n_rot, s = hp->rope_freq_scale;
    double lo =
        floor(yarn_corr_dim(n, (double)hp->n_ctx_orig, hp->yarn_beta_fast, hp->rope_freq_base));
    double hi =
        ceil(yarn_corr_dim(n, (double)hp->n_ctx_orig, hp->yarn_beta_slow, hp->rope_freq_base));
    lo = fmax(0.0, lo);
    hi = fmin(n - 1.0, hi);
    for (int64_t i = 0; i < hp->n_rot / 2; i++) {
        double y = ((double)i - lo) / fmax(0.001, hi - lo);
        double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * hp->yarn_ext_factor;
        ff[i] = (float)(1.0 / (s * (1.0 - mix) + mix));
    }
}

static loom_status add_weight(loom_model *m, const loom_gguf *g, const loom_model_params *p,
                              const char *name, int layer, bool required, int n_dims,
                              const int64_t *ne, loom_tensor **slot, pending *list, int *n_list) {
    int64_t gi = loom_gguf_find_tensor(g, name);
    if (gi < 0) {
        if (required) return loom_error(LOOM_ERR_FORMAT, "model: missing tensor '%s'", name);
        *slot = NULL;
        return LOOM_OK;
    }
    /* the type was checked with every tensor's in loom_hparams_from_gguf */
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
                              (long long)(n_dims > 1 ? ne[1] : 1),
                              (long long)(n_dims > 2 ? ne[2] : 1));
    }
    loom_tensor *t = loom_new_tensor(m->ctx, loom_gguf_tensor_type(g, gi), 4, fne);
    if (!t)
        return loom_error(LOOM_ERR_NOMEM, "model: cannot create tensor '%s': %s", name,
                          loom_last_error());
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
    loom_hparams hp;
    loom_status st = loom_hparams_from_gguf(g, &hp);
    if (st) return st;
    return loom__model_load_hp(g, &hp, p, out);
}

loom_status loom__model_load_hp(const loom_gguf *g, const loom_hparams *hparams,
                                const loom_model_params *p, loom_model **out) {
    *out = NULL;
    int64_t t0 = loom_time_us();
    loom_model *m = loom_calloc(1, sizeof *m);
    if (m) m->map_fd = -1;
    if (!m) return loom_error(LOOM_ERR_NOMEM, "model: out of memory");
    m->hp = *hparams;
    loom_status st;
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
    W("rope_freqs.weight", -1, false, 1, &m->rope_freqs, hp->n_rot / 2);
    W("rope_factors_long.weight", -1, false, 1, &m->rope_long, hp->n_rot / 2);
    W("rope_factors_short.weight", -1, m->rope_long != NULL, 1, &m->rope_short, hp->n_rot / 2);
    for (int i = 0; i < 3; i++) {
        const loom_tensor *t = i == 0 ? m->rope_freqs : i == 1 ? m->rope_long : m->rope_short;
        if (t && t->type != LOOM_TYPE_F32) {
            st = loom_error(LOOM_ERR_TYPE, "model: tensor '%s' is %s (f32 expected)", t->name,
                            loom_type_name(t->type));
            goto fail;
        }
    }
    if (m->rope_freqs && (m->rope_long || m->rope_short)) {
        st = loom_error(LOOM_ERR_UNSUPPORTED,
                        "model: 'rope_freqs.weight' together with rope_factors_long/short");
        goto fail;
    }
    float yarn[LOOM_MAX_ROT / 2];
    if (hp->rope_yarn) {
        if (hp->n_rot > LOOM_MAX_ROT) {
            st = loom_error(LOOM_ERR_UNSUPPORTED, "model: YaRN with %lld rope dims (at most %d)",
                            (long long)hp->n_rot, LOOM_MAX_ROT);
            goto fail;
        }
        yarn_factors(hp, yarn);
        m->rope_freqs = loom_new_tensor_1d(m->ctx, LOOM_TYPE_F32, hp->n_rot / 2);
        if (!m->rope_freqs) {
            st = loom_error(LOOM_ERR_NOMEM, "model: %s", loom_last_error());
            goto fail;
        }
        loom_set_name(m->rope_freqs, "rope_yarn_factors");
        loom_set_param(m->rope_freqs);
        loom_buft_t buft = p && p->placement
                               ? p->placement("rope_yarn_factors", -1, p->placement_user_data)
                               : NULL;
        if (!buft) buft = p && p->default_buft ? p->default_buft : loom_cpu_buffer_type();
        list[n_list++] =
            (pending){.t = m->rope_freqs, .gi = -1, .layer = -1, .buft = buft, .data = yarn};
    }

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
        if (hp->qk_norm) {
            W(N("attn_q_norm.weight"), il, true, 1, &L->attn_q_norm, hp->head_dim);
            W(N("attn_k_norm.weight"), il, true, 1, &L->attn_k_norm, hp->head_dim);
        }
        W(N("attn_output.weight"), il, true, 2, &L->wo, Dq, E);
        W(N("attn_output.bias"), il, false, 1, &L->bo, E);
        W(N("attn_sinks.weight"), il, false, 1, &L->attn_sinks, hp->n_head);
        if (hp->post_norms) {
            W(N("post_attention_norm.weight"), il, true, 1, &L->attn_post_norm, E);
            W(N("post_ffw_norm.weight"), il, true, 1, &L->ffn_post_norm, E);
            W(N("ffn_norm.weight"), il, true, 1, &L->ffn_norm, E);
        } else if (loom_gguf_find_tensor(g, N("ffn_norm.weight")) < 0 &&
                   loom_gguf_find_tensor(g, N("post_attention_norm.weight")) >= 0) {
            /* gpt-oss names its pre-FFN norm post_attention_norm */
            W(N("post_attention_norm.weight"), il, true, 1, &L->ffn_norm, E);
        } else {
            W(N("ffn_norm.weight"), il, true, 1, &L->ffn_norm, E);
        }
        if (X > 0) {
            W(N("ffn_gate_inp.weight"), il, true, 2, &L->ffn_gate_inp, E, X);
            W(N("ffn_gate_inp.bias"), il, false, 1, &L->ffn_gate_inp_b, X);
            W(N("ffn_gate_exps.weight"), il, true, 3, &L->ffn_gate_exps, E, F, X);
            W(N("ffn_up_exps.weight"), il, true, 3, &L->ffn_up_exps, E, F, X);
            W(N("ffn_down_exps.weight"), il, true, 3, &L->ffn_down_exps, F, E, X);
            W(N("ffn_gate_exps.bias"), il, false, 2, &L->ffn_gate_exps_b, F, X);
            W(N("ffn_up_exps.bias"), il, false, 2, &L->ffn_up_exps_b, F, X);
            W(N("ffn_down_exps.bias"), il, false, 2, &L->ffn_down_exps_b, E, X);
            /* a shared expert (qwen2moe), scaled by sigmoid(ffn_gate_inp_shexp . x) */
            const int64_t Fs = hp->n_ff_shexp > 0 ? hp->n_ff_shexp : F;
            bool shexp = loom_gguf_find_tensor(g, N("ffn_up_shexp.weight")) >= 0;
            W(N("ffn_up_shexp.weight"), il, false, 2, &L->ffn_up_shexp, E, Fs);
            W(N("ffn_gate_shexp.weight"), il, shexp, 2, &L->ffn_gate_shexp, E, Fs);
            W(N("ffn_down_shexp.weight"), il, shexp, 2, &L->ffn_down_shexp, Fs, E);
            W(N("ffn_gate_inp_shexp.weight"), il, false, 1, &L->ffn_gate_inp_shexp, E);
        } else {
            /* no ffn_gate: gate and up fused in ffn_up (phi3), gate rows first */
            bool fused_up = loom_gguf_find_tensor(g, N("ffn_gate.weight")) < 0;
            W(N("ffn_gate.weight"), il, !fused_up, 2, &L->ffn_gate, E, F);
            W(N("ffn_up.weight"), il, true, 2, &L->ffn_up, E, fused_up ? 2 * F : F);
            W(N("ffn_down.weight"), il, true, 2, &L->ffn_down, F, E);
        }
#undef N
    }
#undef W
    /* a tensor the graph would not use is a part of the model loom does not understand:
     * the file's tensors marked by index (linear in tensors + weights), the first unmarked
     * one named */
    bool *used = loom_calloc((size_t)n_tensors + 1, sizeof *used);
    if (!used) {
        st = loom_error(LOOM_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_list; i++)
        if (list[i].gi >= 0) used[list[i].gi] = true;
    int64_t unused = 0;
    while (unused < n_tensors && used[unused])
        unused++;
    loom_free(used);
    if (unused < n_tensors) {
        st = loom_error(LOOM_ERR_UNSUPPORTED,
                        "model: tensor '%s' is not used by loom's %s graph (refusing rather than "
                        "ignoring it)",
                        loom_gguf_tensor_name(g, unused), hp->arch);
        goto fail;
    }
    /* CPU weights at a suitable offset are used in place from a mapping of the file the
     * model owns (so the gguf may be freed after loading); any other weight is copied */
    bool want_map = !(p && (p->no_data || p->no_mmap));
    size_t data_off = loom_gguf_data_offset(g);
    if (want_map) {
        if (loom_gguf_map_file(g, &m->map, &m->map_size) != LOOM_OK) {
            m->map = NULL; /* not mappable (from memory, mmap failed): read instead */
            m->map_size = 0;
        }
    }
    for (int i = 0; m->map && i < n_list; i++) {
        if (list[i].gi < 0 || list[i].buft != loom_cpu_buffer_type()) continue;
        uint64_t off = data_off + loom_gguf_tensor_offset(g, list[i].gi);
        size_t n = loom_gguf_tensor_size(g, list[i].gi);
        list[i].alias = off % LOOM_MAP_ALIGN == 0 && n > 0 && off <= m->map_size &&
                        n <= m->map_size - off; /* a header-only file lacks the bytes */
    }
    /* one buffer per distinct buffer type */
    loom_buft_t bufts[64];
    int n_bufts = 0;
    for (int i = 0; i < n_list; i++) {
        if (list[i].alias) continue;
        int k = 0;
        while (k < n_bufts && bufts[k] != list[i].buft)
            k++;
        if (k == n_bufts) {
            if (n_bufts == 64) {
                st = loom_error(LOOM_ERR_INVALID_ARG, "model: more than 64 buffer types");
                goto fail;
            }
            bufts[n_bufts++] = list[i].buft;
        }
    }
    m->buffers = loom_calloc((size_t)n_bufts + 2, sizeof *m->buffers);
    if (!m->buffers) {
        st = loom_error(LOOM_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int k = 0; k < n_bufts; k++) {
        /* place this buffer type's tensors one after another, aligned */
        size_t align = loom_buft_alignment(bufts[k]), total = 0;
        for (int i = 0; i < n_list; i++)
            if (list[i].buft == bufts[k] && !list[i].alias)
                total += (loom_buft_alloc_size(bufts[k], list[i].t) + align - 1) / align * align;
        loom_buffer_t buf = loom_buft_alloc_buffer(bufts[k], total);
        if (!buf) {
            st = loom_error(loom_last_status() ? loom_last_status() : LOOM_ERR_DEVICE_OOM,
                            "model: cannot allocate %.1f MiB of weights on %s: %s",
                            (double)total / (1024.0 * 1024.0), loom_buft_name(bufts[k]),
                            loom_last_error());
            goto fail;
        }
        loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
        m->buffers[m->n_buffers++] = buf;
        size_t off = 0;
        for (int i = 0; i < n_list; i++) {
            if (list[i].buft != bufts[k] || list[i].alias) continue;
            if ((st = loom_buffer_alloc_tensor(buf, list[i].t, off))) goto fail;
            off += (loom_buft_alloc_size(bufts[k], list[i].t) + align - 1) / align * align;
        }
    }
    /* the aliased weights as one CPU buffer over the span of the mapping they cover */
    bool any_alias = false;
    size_t lo = SIZE_MAX, hi = 0;
    for (int i = 0; i < n_list; i++) {
        if (!list[i].alias) continue;
        any_alias = true;
        size_t o = loom_gguf_tensor_offset(g, list[i].gi);
        if (o < lo) lo = o;
        if (o + loom_gguf_tensor_size(g, list[i].gi) > hi)
            hi = o + loom_gguf_tensor_size(g, list[i].gi);
    }
    if (any_alias) {
        loom_buffer_t buf = loom_cpu_buffer_from_ptr((char *)m->map + data_off + lo, hi - lo);
        if (!buf) {
            st = loom_last_status();
            goto fail;
        }
        loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
        m->buffers[m->n_buffers++] = buf;
        for (int i = 0; i < n_list; i++) {
            if (!list[i].alias) continue;
            if ((st = loom_buffer_alloc_tensor(buf, list[i].t,
                                               loom_gguf_tensor_offset(g, list[i].gi) - lo)))
                goto fail;
            m->n_mapped_bytes += loom_gguf_tensor_size(g, list[i].gi);
        }
    }
    size_t total = 0, done = 0;
    for (int i = 0; i < n_list; i++)
        total += list[i].gi >= 0 ? loom_gguf_tensor_size(g, list[i].gi) : 0;
    size_t chunk = p && p->load_chunk ? p->load_chunk : LOOM_LOAD_CHUNK_DEFAULT;
    void *staging = NULL;
    /* one staging buffer for the whole load, as large as the largest copy needs */
    for (int i = 0; !m->map && i < n_list && !(p && p->no_data); i++) {
        if (list[i].gi < 0 || loom_buffer_is_host(list[i].t->buffer)) continue;
        size_t c = chunk_step(list[i].t, loom_gguf_tensor_size(g, list[i].gi), chunk);
        if (c > m->staging_bytes) m->staging_bytes = c;
    }
    for (int i = 0; i < n_list && !(p && p->no_data); i++) {
        if (list[i].gi < 0) {
            loom_tensor_set(list[i].t, list[i].data, 0, loom_nbytes(list[i].t));
            continue;
        }
        size_t n = loom_gguf_tensor_size(g, list[i].gi);
        uint64_t off = data_off + loom_gguf_tensor_offset(g, list[i].gi);
        if (n && off + n > loom_gguf_file_size(g)) {
            loom_free(staging);
            st = loom_error(LOOM_ERR_FORMAT,
                            "model: tensor '%s' has no data in the file (a header-only file "
                            "can only be planned)",
                            list[i].t->name);
            goto fail;
        }
        if (!list[i].alias && (st = copy_weight(g, m, list[i].t, off, n, chunk, &staging))) {
            loom_free(staging);
            goto fail;
        }
        done += n;
        if (p && p->progress) p->progress(done, total, p->progress_user_data);
    }
    loom_free(staging);
    if (m->map && !any_alias) { /* every weight was copied: the mapping is not needed */
        munmap(m->map, m->map_size);
        m->map = NULL;
        m->map_size = 0;
    }
    if (m->map) { /* weights are read from the file's pages: remember which file it was */
        struct stat sb;
        m->map_fd = loom_gguf_dup_fd(g);
        if (m->map_fd >= 0 && fstat(m->map_fd, &sb) == 0)
            m->map_mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    }
    m->n_bytes = total;
    loom_free(list);
    m->load_us = loom_time_us() - t0;
    if (!(p && p->no_data)) {
        double mb = (double)total / 1e6, ms = (double)m->load_us / 1000.0;
        LOOM_LOG_INFO("model: %.2f MB of weights in %.1f ms (%.0f MB/s): %.2f MB used in place "
                      "from the mapped file, %.2f MB copied (device pieces of at most %zu "
                      "bytes, %s)",
                      mb, ms, ms > 0 ? mb * 1000.0 / ms : 0.0, (double)m->n_mapped_bytes / 1e6,
                      (double)(total - m->n_mapped_bytes) / 1e6, chunk,
                      m->staging_bytes ? "read through a staging buffer" : "from the mapping");
        for (int b = 0; b < m->n_buffers; b++)
            LOOM_LOG_INFO("model: weights buffer on %s: %zu bytes", loom_buffer_name(m->buffers[b]),
                          loom_buffer_size(m->buffers[b]));
    }
    *out = m;
    return LOOM_OK;
fail:
    loom_free(list);
    loom_model_free(m);
    return st;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_buffers; i++)
        loom_buffer_free(m->buffers[i]);
    loom_free(m->buffers);
    loom_ctx_free(m->ctx);
    if (m->map) munmap(m->map, m->map_size);
    if (m->map_fd >= 0) close(m->map_fd);
    loom_free(m);
}

loom_status loom_model_check_file(const loom_model *m) {
    if (!m || !m->map || m->map_fd < 0) return LOOM_OK;
    struct stat sb;
    if (fstat(m->map_fd, &sb) != 0)
        return loom_error(LOOM_ERR_IO, "model: cannot stat the mapped model file: %s",
                          strerror(errno));
    if ((uint64_t)sb.st_size < (uint64_t)m->map_size)
        return loom_error(LOOM_ERR_IO,
                          "model: the model file was truncated from %zu to %lld bytes after it "
                          "was loaded (its weights are read from the file's pages in place); "
                          "restore the file and load the model again",
                          m->map_size, (long long)sb.st_size);
    const int64_t mt = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    if (mt != m->map_mtime_ns)
        return loom_error(LOOM_ERR_IO,
                          "model: the model file was modified after it was loaded (modification "
                          "time %lld.%09lld s, was %lld.%09lld s); its weights are read from the "
                          "file's pages in place and may have changed: load the model again",
                          (long long)(mt / 1000000000), (long long)(mt % 1000000000),
                          (long long)(m->map_mtime_ns / 1000000000),
                          (long long)(m->map_mtime_ns % 1000000000));
    return LOOM_OK;
}

void loom_model_foreach_weight(loom_model *m, void (*fn)(loom_tensor *t, int layer, void *ud),
                               void *ud) {
    for (loom_tensor *t = loom_ctx_first_tensor(m->ctx); t; t = loom_ctx_next_tensor(m->ctx, t)) {
        int layer = -1;
        if (strncmp(t->name, "blk.", 4) == 0) layer = atoi(t->name + 4);
        fn(t, layer, ud);
    }
}
