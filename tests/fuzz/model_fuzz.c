/*
 * libFuzzer target for model loading: a small synthetic model (shape chosen by the input)
 * whose metadata the input then overwrites with arbitrary values and types, or a raw GGUF
 * file when the input starts with "GGUF". The hyperparameters must validate or be refused
 * with an error; a model that loads must run one CPU forward pass of two tokens. Never a
 * crash, an overflow, a hang or a leak.
 *
 * Structured input: 8 bytes of shape (arch, vocab, embd, layers, heads, ff, experts,
 * weight type), then records of 10 bytes: key index, value type, 8 value bytes. The
 * architectures include the sliding-window (gemma2/3, phi3 with longrope, gpt-oss with sinks)
 * and qk-norm ones; the keys their windows, softcaps, YaRN and rope attention factors.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "loom/tokenizer.h"
#include "model/run-simple.h"

static loom_backend_t cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    cpu = loom_cpu_backend_new(1);
    if (!cpu) abort();
    return 0;
}

static const char *const KEYS[] = {
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "rope.dimension_count",
    "feed_forward_length",
    "context_length",
    "vocab_size",
    "expert_count",
    "expert_used_count",
    "rope.freq_base",
    "rope.scaling.factor",
    "attention.layer_norm_rms_epsilon",
    "expert_feed_forward_length",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.scaling.original_context_length",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "rope.scaling.attn_factor",
    "attention.logit_softcapping",
    "final_logit_softcapping",
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

static void set_key(loom_gguf_writer *w, const char *arch, const uint8_t *r) {
    char key[128];
    uint8_t k = r[0];
    uint64_t u;
    memcpy(&u, r + 2, 8);
    if (k % 20 == 17) {
        snprintf(key, sizeof key, "general.architecture");
        const char *archs[] = {"llama", "qwen2", "mixtral", "qwen2moe", "mistral", "gptj", ""};
        loom_gguf_set_str(w, key, archs[u % 7]);
        return;
    }
    if (k % 20 == 19) { /* the rope scaling type, so the YaRN keys take effect */
        const char *types[] = {"yarn", "linear", "none", "llama3", "longrope", ""};
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        loom_gguf_set_str(w, key, types[u % 6]);
        return;
    }
    if (k % 20 == 18) {
        const char *ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                             "tokenizer.ggml.unknown_token_id"};
        loom_gguf_set_i64(w, ids[u % 3], (int64_t)(u >> 8) - (int64_t)(1ull << 40));
        return;
    }
    snprintf(key, sizeof key, "%s.%s", arch, KEYS[k % N_KEYS]);
    float f;
    double d;
    switch (r[1] % 8) {
    case 0:
        loom_gguf_set_u32(w, key, (uint32_t)u);
        break;
    case 1:
        loom_gguf_set_i32(w, key, (int32_t)u);
        break;
    case 2:
        loom_gguf_set_u64(w, key, u);
        break;
    case 3:
        loom_gguf_set_i64(w, key, (int64_t)u);
        break;
    case 4:
        memcpy(&f, r + 2, 4);
        loom_gguf_set_f32(w, key, f);
        break;
    case 5:
        memcpy(&d, r + 2, 8);
        loom_gguf_set_f64(w, key, d);
        break;
    case 6:
        loom_gguf_set_bool(w, key, u & 1);
        break;
    default:
        loom_gguf_set_u32(w, key, (uint32_t)(u % 97));
        break; /* small, plausible */
    }
}

static void run(const loom_gguf *g) {
    loom_hparams hp;
    if (loom_hparams_from_gguf(g, &hp) != LOOM_OK) return;
    loom_tokenizer *tok = NULL;
    if (loom_tokenizer_from_gguf(g, &tok) == LOOM_OK) loom_tokenizer_free(tok);
    loom_model *m = NULL;
    if (loom_model_load(g, NULL, &m) != LOOM_OK) return;
    loom_kv_cache *kv = NULL;
    int64_t n_ctx = m->hp.n_ctx_train < 64 ? m->hp.n_ctx_train : 64;
    if (n_ctx >= 2 && loom_kv_cache_new(m, n_ctx, LOOM_TYPE_F32, NULL, &kv) == LOOM_OK) {
        float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
        int32_t toks[2] = {0, m->hp.n_vocab > 1 ? 1 : 0};
        if (logits) (void)loom_model_eval_simple(m, kv, cpu, toks, 2, 0, false, logits);
        free(logits);
        loom_kv_cache_free(kv);
    }
    loom_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 4 && memcmp(data, "GGUF", 4) == 0) {
        loom_gguf *g = NULL;
        if (loom_gguf_open_memory(data, size, &g) == LOOM_OK) run(g);
        loom_gguf_free(g);
        return 0;
    }
    if (size < 8 || size > 8 + 10 * 32) return 0;
    static const char *const archs[] = {"llama",  "qwen2",  "mixtral", "qwen2moe", "gemma2",
                                        "gemma3", "phi3",   "gpt-oss", "qwen3"};
    static const loom_type wtypes[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_Q8_0,
                                       LOOM_TYPE_Q4_0};
    loom_synth_params p = loom_synth_params_default();
    p.arch = archs[data[0] % 9];
    p.n_vocab = 300 + data[1] % 40;
    p.n_embd = 32 * (1 + data[2] % 2);
    p.n_layer = 1 + data[3] % 2;
    p.n_head_kv = 1 + data[4] % 2;
    p.n_head = p.n_head_kv * (1 + (data[4] >> 4) % 4);
    if (p.n_embd % p.n_head) p.n_head = p.n_head_kv;
    p.n_ff = 32 * (1 + data[5] % 3);
    p.n_ctx = 16 + data[5] / 4;
    p.n_expert = data[6] % 3 == 0 ? 0 : 2 + data[6] % 3;
    p.n_expert_used = p.n_expert ? 1 + (data[6] >> 4) % p.n_expert : 0;
    p.wtype = wtypes[data[7] % 4];
    p.biases = data[7] & 0x10;
    p.fused_qkv = data[7] & 0x20;
    if (!strcmp(p.arch, "gemma2") || !strcmp(p.arch, "gemma3") || !strcmp(p.arch, "phi3") ||
        !strcmp(p.arch, "gpt-oss"))
        p.n_swa = data[5] % 8;
    if (!strcmp(p.arch, "gemma3") || !strcmp(p.arch, "qwen3")) p.qk_norm = true;
    if (!strcmp(p.arch, "phi3")) {
        p.fused_gate_up = true;
        p.longrope = data[7] & 0x40;
        p.n_expert = p.n_expert_used = 0;
    }
    if (!strcmp(p.arch, "gpt-oss") && !p.n_expert) {
        p.n_expert = 2;
        p.n_expert_used = 1;
    }
    p.seed = data[0];
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&p, &w) != LOOM_OK) return 0;
    for (size_t off = 8; off + 10 <= size; off += 10)
        set_key(w, p.arch, data + off);
    void *img = NULL;
    size_t n = 0;
    if (loom_gguf_write_memory(w, &img, &n) == LOOM_OK) {
        loom_gguf *g = NULL;
        if (loom_gguf_open_memory(img, n, &g) == LOOM_OK) run(g);
        loom_gguf_free(g);
        loom_free(img);
    }
    loom_gguf_writer_free(w);
    return 0;
}
