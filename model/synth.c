/*
 * Synthetic llama-family models written with the GGUF writer: deterministic random weights
 * (uniform in +-1/sqrt(fan_in), norms 1) and a small SentencePiece vocabulary (control
 * tokens, the 256 byte tokens, then "▁" + letters and letter pairs with descending scores).
 * They exercise every path a real model does (GQA, MoE with expert biases, fused QKV,
 * quantised weights, biases) and give `loom` a built-in default model.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/model.h"

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s, float a) {
    return a * (2.0f * (float)(next(s) >> 40) / (float)(1ull << 24) - 1.0f);
}

loom_synth_params loom_synth_params_default(void) {
    return (loom_synth_params){.arch = "llama", .n_vocab = 512, .n_embd = 128, .n_layer = 4,
                               .n_head = 8, .n_head_kv = 4, .n_ff = 344, .n_ctx = 512,
                               .wtype = LOOM_TYPE_F32, .seed = 1234};
}

/* Adds a tensor of shape ne filled by fill(): 1 for norms, random otherwise. */
static loom_status add(loom_gguf_writer *w, const char *name, loom_type type, int n_dims,
                       const int64_t *ne, float scale, bool ones, uint64_t *rng, int64_t zero_rows) {
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= ne[d];
    float *f = loom_malloc((size_t)n * sizeof *f);
    if (!f) return loom_error(LOOM_ERR_NOMEM, "synth: out of memory");
    /* ones with a scale: 1 +- scale (norms whose effect a test must see) */
    for (int64_t i = 0; i < n; i++)
        f[i] = ones                    ? 1.0f + (scale > 0 ? uniform(rng, scale) : 0.0f)
               : i / ne[0] < zero_rows ? 0.0f
                                       : uniform(rng, scale);
    const loom_type_traits *tr = loom_type_traits_get(type);
    void *data = f;
    void *conv = NULL;
    if (type != LOOM_TYPE_F32) {
        conv = loom_malloc(loom_row_size(type, ne[0]) * (size_t)(n / ne[0]));
        if (!conv) {
            loom_free(f);
            return loom_error(LOOM_ERR_NOMEM, "synth: out of memory");
        }
        tr->from_float(f, conv, n);
        data = conv;
    }
    loom_status st = loom_gguf_add_tensor(w, name, type, n_dims, ne, data);
    loom_free(f);
    loom_free(conv);
    return st;
}

loom_status loom_model_synth(const loom_synth_params *p, loom_gguf_writer **out) {
    *out = NULL;
    if (p->n_head <= 0 || p->n_head_kv <= 0 || p->n_head % p->n_head_kv ||
        (p->head_dim <= 0 && p->n_embd % p->n_head) || p->head_dim % 2 || p->n_vocab < 300 ||
        p->n_layer <= 0 || p->n_ff <= 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "synth: bad shape (n_vocab >= 300, n_head a multiple of n_head_kv, "
                          "n_embd a multiple of n_head)");
    loom_gguf_writer *w = loom_gguf_writer_new();
    if (!w) return loom_last_status();
    const char *arch = p->arch ? p->arch : "llama";
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    loom_status st = LOOM_OK;
    st = st ? st : loom_gguf_set_str(w, "general.architecture", arch);
    st = st ? st : loom_gguf_set_str(w, "general.name", "loom-synthetic");
    st = st ? st : loom_gguf_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx);
    st = st ? st : loom_gguf_set_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd);
    st = st ? st : loom_gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
    st = st ? st : loom_gguf_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer);
    st = st ? st : loom_gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    st = st ? st : loom_gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    st = st ? st : loom_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    st = st ? st : loom_gguf_set_f32(w, KEY("rope.freq_base"), 10000.0f);
    st = st ? st : loom_gguf_set_u32(w, KEY("vocab_size"), (uint32_t)p->n_vocab);
    if (p->n_expert > 0) {
        st = st ? st : loom_gguf_set_u32(w, KEY("expert_count"), (uint32_t)p->n_expert);
        st = st ? st : loom_gguf_set_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used);
        st = st ? st : loom_gguf_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff);
    }
    if (p->n_ff_shexp > 0)
        st = st ? st
                : loom_gguf_set_u32(w, KEY("expert_shared_feed_forward_length"),
                                    (uint32_t)p->n_ff_shexp);
    const bool gemma = strncmp(arch, "gemma", 5) == 0, gptoss = strcmp(arch, "gpt-oss") == 0;
    if (p->n_swa > 0)
        st = st ? st : loom_gguf_set_u32(w, KEY("attention.sliding_window"), (uint32_t)p->n_swa);
    if (p->head_dim > 0) {
        st = st ? st : loom_gguf_set_u32(w, KEY("attention.key_length"), (uint32_t)p->head_dim);
        st = st ? st : loom_gguf_set_u32(w, KEY("attention.value_length"), (uint32_t)p->head_dim);
    }
#undef KEY
    /* vocabulary */
    const int64_t V = p->n_vocab;
    char **tok = loom_calloc((size_t)V, sizeof *tok);
    float *scores = loom_calloc((size_t)V, sizeof *scores);
    int32_t *types = loom_calloc((size_t)V, sizeof *types);
    char *pool = loom_calloc((size_t)V, 16);
    if (!tok || !scores || !types || !pool) st = st ? st : loom_error(LOOM_ERR_NOMEM, "synth: out of memory");
    for (int64_t i = 0; !st && i < V; i++) {
        char *s = pool + i * 16;
        if (i < 3) {
            snprintf(s, 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
            types[i] = i == 0 ? 2 : 3;
        } else if (i < 259) {
            snprintf(s, 16, "<0x%02X>", (int)(i - 3));
            types[i] = 6;
        } else {
            int64_t k = i - 259; /* ▁, ▁a..▁z, a..z, the pairs aa..zz, then ▁t<k> */
            if (k == 0) snprintf(s, 16, "\xE2\x96\x81");
            else if (k <= 26) snprintf(s, 16, "\xE2\x96\x81%c", (int)('a' + k - 1));
            else if (k <= 52) snprintf(s, 16, "%c", (int)('a' + k - 27));
            else if (k < 53 + 26 * 26)
                snprintf(s, 16, "%c%c", (int)('a' + (k - 53) / 26), (int)('a' + (k - 53) % 26));
            else /* unique pieces past the pairs (the reference engines refuse duplicates) */
                snprintf(s, 16, "\xE2\x96\x81t%u", (unsigned)(k % 100000000)); /* 8 digits */
            types[i] = 1;
            scores[i] = -(float)k;
        }
        tok[i] = s;
    }
    st = st ? st : loom_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    st = st ? st : loom_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)V);
    st = st ? st : loom_gguf_set_arr(w, "tokenizer.ggml.scores", LOOM_GGUF_FLOAT32, scores, (uint64_t)V);
    st = st ? st : loom_gguf_set_arr(w, "tokenizer.ggml.token_type", LOOM_GGUF_INT32, types, (uint64_t)V);
    st = st ? st : loom_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    st = st ? st : loom_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    loom_free(tok);
    loom_free(scores);
    loom_free(types);
    loom_free(pool);

    /* weights */
    uint64_t rng = p->seed;
    const int64_t E = p->n_embd, F = p->n_ff, X = p->n_expert;
    const int64_t D = p->head_dim > 0 ? p->head_dim : E / p->n_head, Fs = p->n_ff_shexp;
    const int64_t Dq = p->n_head * D, Dkv = p->n_head_kv * D;
    const loom_type wt = p->wtype;
    const loom_type wt_hi = p->wtype_hi != LOOM_TYPE_F32 ? p->wtype_hi : wt;
    const float se = 1.0f / sqrtf((float)E), sf = 1.0f / sqrtf((float)F);
    char name[LOOM_MAX_NAME];
    int64_t zero_rows = 0;
#define T(nd, type, scale, ones, ...)                                                              \
    do {                                                                                           \
        int64_t ne_[3] = {__VA_ARGS__};                                                            \
        if (!st) st = add(w, name, type, nd, ne_, scale, ones, &rng, zero_rows);                   \
    } while (0)
#define NAME(...) snprintf(name, sizeof name, __VA_ARGS__)
    NAME("token_embd.weight");
    T(2, p->embd_type, 1.0f, false, E, V);
    NAME("output_norm.weight");
    T(1, LOOM_TYPE_F32, 0, true, E);
    /* zero logits for the control and byte tokens keep generated text readable letters */
    zero_rows = 259;
    NAME("output.weight");
    if (!p->tied) T(2, wt_hi, se, false, E, V);
    zero_rows = 0;
    if (p->rope_freqs && !st) {
        /* llama3-style: high frequencies kept (1), low ones divided by up to 8 */
        float fr[512];
        int64_t n = D / 2;
        for (int64_t i = 0; i < n && i < 512; i++)
            fr[i] = 1.0f + 7.0f * (float)i / (float)(n > 1 ? n - 1 : 1);
        st = loom_gguf_add_tensor(w, "rope_freqs.weight", LOOM_TYPE_F32, 1, (int64_t[]){n}, fr);
    }
    if (p->longrope && !st) { /* phi3-style: long factors up to 6, short ones up to 1.5 */
        float lf[512], sf[512];
        int64_t n = D / 2;
        for (int64_t i = 0; i < n && i < 512; i++) {
            float t = (float)i / (float)(n > 1 ? n - 1 : 1);
            lf[i] = 1.0f + 5.0f * t;
            sf[i] = 1.0f + 0.5f * t;
        }
        st = loom_gguf_add_tensor(w, "rope_factors_long.weight", LOOM_TYPE_F32, 1, (int64_t[]){n},
                                  lf);
        if (!st)
            st = loom_gguf_add_tensor(w, "rope_factors_short.weight", LOOM_TYPE_F32, 1,
                                      (int64_t[]){n}, sf);
    }
    for (int il = 0; il < p->n_layer; il++) {
        NAME("blk.%d.attn_norm.weight", il);
        T(1, LOOM_TYPE_F32, 0, true, E);
        if (p->fused_qkv) {
            NAME("blk.%d.attn_qkv.weight", il);
            T(2, wt, se, false, E, Dq + 2 * Dkv);
        } else {
            NAME("blk.%d.attn_q.weight", il);
            T(2, wt, se, false, E, Dq);
            NAME("blk.%d.attn_k.weight", il);
            T(2, wt, se, false, E, Dkv);
            NAME("blk.%d.attn_v.weight", il);
            T(2, wt_hi, se, false, E, Dkv);
            if (p->biases || p->attn_biases) {
                NAME("blk.%d.attn_q.bias", il);
                T(1, LOOM_TYPE_F32, 0.1f, false, Dq);
                NAME("blk.%d.attn_k.bias", il);
                T(1, LOOM_TYPE_F32, 0.1f, false, Dkv);
                NAME("blk.%d.attn_v.bias", il);
                T(1, LOOM_TYPE_F32, 0.1f, false, Dkv);
            }
        }
        if (p->qk_norm) {
            NAME("blk.%d.attn_q_norm.weight", il);
            T(1, LOOM_TYPE_F32, 0.5f, true, D);
            NAME("blk.%d.attn_k_norm.weight", il);
            T(1, LOOM_TYPE_F32, 0.5f, true, D);
        }
        NAME("blk.%d.attn_output.weight", il);
        T(2, wt, 1.0f / sqrtf((float)Dq), false, Dq, E);
        if (gptoss) { /* output bias, sinks */
            NAME("blk.%d.attn_output.bias", il);
            T(1, LOOM_TYPE_F32, 0.1f, false, E);
            NAME("blk.%d.attn_sinks.weight", il);
            T(1, LOOM_TYPE_F32, 2.0f, false, p->n_head);
        }
        if (gemma) {
            NAME("blk.%d.post_attention_norm.weight", il);
            T(1, LOOM_TYPE_F32, 0.5f, true, E);
            NAME("blk.%d.post_ffw_norm.weight", il);
            T(1, LOOM_TYPE_F32, 0.5f, true, E);
        }
        NAME(gptoss ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", il);
        T(1, LOOM_TYPE_F32, 0, true, E);
        if (X > 0) {
            NAME("blk.%d.ffn_gate_inp.weight", il);
            T(2, LOOM_TYPE_F32, se, false, E, X);
            if (gptoss) {
                NAME("blk.%d.ffn_gate_inp.bias", il);
                T(1, LOOM_TYPE_F32, 0.5f, false, X);
            }
            /* gpt-oss: large enough for its SwiGLU clamp at 7 to act */
            const float sx = gptoss ? 10.0f * se : se;
            NAME("blk.%d.ffn_gate_exps.weight", il);
            T(3, wt, sx, false, E, F, X);
            NAME("blk.%d.ffn_up_exps.weight", il);
            T(3, wt, sx, false, E, F, X);
            NAME("blk.%d.ffn_down_exps.weight", il);
            T(3, wt_hi, sf, false, F, E, X);
            if (p->biases) {
                NAME("blk.%d.ffn_gate_exps.bias", il);
                T(2, LOOM_TYPE_F32, 0.1f, false, F, X);
                NAME("blk.%d.ffn_up_exps.bias", il);
                T(2, LOOM_TYPE_F32, 0.1f, false, F, X);
                NAME("blk.%d.ffn_down_exps.bias", il);
                T(2, LOOM_TYPE_F32, 0.1f, false, E, X);
            }
            if (Fs > 0) {
                NAME("blk.%d.ffn_gate_inp_shexp.weight", il);
                T(1, LOOM_TYPE_F32, 4.0f * se, false, E);
                NAME("blk.%d.ffn_gate_shexp.weight", il);
                T(2, wt, se, false, E, Fs);
                NAME("blk.%d.ffn_up_shexp.weight", il);
                T(2, wt, se, false, E, Fs);
                NAME("blk.%d.ffn_down_shexp.weight", il);
                T(2, wt, 1.0f / sqrtf((float)Fs), false, Fs, E);
            }
        } else {
            if (!p->fused_gate_up) {
                NAME("blk.%d.ffn_gate.weight", il);
                T(2, wt, se, false, E, F);
            }
            NAME("blk.%d.ffn_up.weight", il);
            T(2, wt, se, false, E, p->fused_gate_up ? 2 * F : F);
            NAME("blk.%d.ffn_down.weight", il);
            T(2, wt_hi, sf, false, F, E);
        }
    }
#undef T
#undef NAME
    if (st) {
        loom_gguf_writer_free(w);
        return st;
    }
    *out = w;
    return LOOM_OK;
}
