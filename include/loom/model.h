/*
 * llama-family models from GGUF: hyperparameters from metadata, weights placed by a caller's
 * policy (a buffer type per tensor), the forward graph (dense and MoE), a KV cache, and
 * sampling.
 *
 * The forward graph for a batch of T tokens at positions p0..p0+T-1 (shapes beside each
 * step; E = n_embd, H/Hk = query/KV heads, D = head_dim, V = n_vocab, K = kv length):
 *   x      = get_rows(token_embd [E, V], tokens [T])                  -> [E, T]
 *   per layer:
 *     h    = rms_norm(x) * attn_norm                                 -> [E, T]
 *     q,k,v = wq/wk/wv x h (+ biases)                                -> [D, H|Hk, T]
 *     q,k  = rope(q|k, pos)                                          (normal or neox)
 *     kv cache rows p0.. = k, v (set_rows)                           cache [D*Hk, n_ctx]
 *     a    = flash_attn_ext(q, K[0..K), V[0..K), causal mask)        -> [D, H, T]
 *     x    = x + wo x a (+ bo)
 *     h    = rms_norm(x) * ffn_norm
 *     dense: x = x + w_down x swiglu(w_gate x h, w_up x h)
 *     MoE:   route = top_k(softmax(w_router x h)), experts by mul_mat_id, weighted sum
 *   logits = output x (rms_norm(x) * output_norm)                     -> [V, T or 1]
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "loom/backend.h"
#include "loom/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MODEL_MAX_LAYERS 512

typedef struct loom_hparams {
    char arch[32];         /* "llama", "qwen2", "mixtral", "qwen2moe" ... */
    int64_t n_vocab;
    int64_t n_ctx_train;
    int64_t n_embd;
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;      /* n_embd / n_head unless key_length says otherwise */
    int64_t n_ff;
    int64_t n_rot;         /* rope dims (rope.dimension_count, default head_dim) */
    int rope_type;         /* LOOM_ROPE_TYPE_NORMAL (llama) or _NEOX (qwen2) */
    float rope_freq_base;  /* default 10000 */
    float rope_freq_scale; /* 1 / rope.scaling.factor, default 1 */
    float rms_eps;
    int64_t n_expert;      /* 0 for dense */
    int64_t n_expert_used;
    bool norm_topk;        /* renormalise the selected experts' weights (mixtral: yes) */
    /* block lengths of the quantised types whose rows a tensor split must respect:
     * attn_output's (its rows are the query heads) and ffn_down's (its rows are n_ff) */
    int64_t attn_block, ffn_block;
} loom_hparams;

/* Reads hyperparameters; errors name the missing key or the unknown architecture. */
LOOM_API loom_status loom_hparams_from_gguf(const loom_gguf *g, loom_hparams *hp);

/* Per-layer weights (NULL when absent). */
typedef struct loom_layer {
    loom_tensor *attn_norm, *wq, *wk, *wv, *wqkv, *wo, *bq, *bk, *bv, *bqkv, *bo;
    loom_tensor *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
    loom_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    loom_tensor *ffn_gate_exps_b, *ffn_up_exps_b, *ffn_down_exps_b; /* expert biases */
} loom_layer;

/* Chooses where a weight lives: return a buffer type, or NULL for the default. `layer` is
 * -1 for non-layer tensors (embeddings, output). */
typedef loom_buft_t (*loom_weight_placement_fn)(const char *name, int layer, void *user_data);

typedef struct loom_model_params {
    loom_buft_t default_buft;                /* NULL: the CPU buffer type */
    loom_weight_placement_fn placement;      /* optional */
    void *placement_user_data;
    /* called with bytes loaded so far and in total (for progress display), optional */
    void (*progress)(size_t done, size_t total, void *user_data);
    void *progress_user_data;
    /* allocate and place the weights but copy no bytes (planning from a header-only
     * file, loom_gguf_open_header, on sim virtual=1 devices): the weights are garbage */
    bool no_data;
} loom_model_params;

typedef struct loom_model {
    loom_hparams hp;
    loom_ctx *ctx;                 /* weight headers (no_alloc) */
    loom_tensor *tok_embd, *output_norm, *output; /* output == tok_embd when tied */
    loom_layer layers[LOOM_MODEL_MAX_LAYERS];
    loom_buffer_t *buffers;        /* one per distinct buffer type used */
    int n_buffers;
    size_t n_bytes;                /* weight bytes */
    bool no_flash_attn;            /* attention as mul_mat + soft_max(mask) + mul_mat */
    int64_t load_us;
} loom_model;

/* Creates the weight tensors of g's model (checking every shape against the
 * hyperparameters, with errors naming the tensor), allocates them where `params` says and
 * copies the data in. */
LOOM_API loom_status loom_model_load(const loom_gguf *g, const loom_model_params *params,
                                     loom_model **out);
LOOM_API void loom_model_free(loom_model *m);
/* Calls fn for every weight tensor (layer -1 for globals). */
LOOM_API void loom_model_foreach_weight(loom_model *m,
                                        void (*fn)(loom_tensor *t, int layer, void *ud),
                                        void *ud);

/* ---------------------------------------------------------------- KV cache */

typedef struct loom_kv_cache {
    loom_ctx *ctx;
    loom_tensor *k[LOOM_MODEL_MAX_LAYERS]; /* [D*Hk, n_ctx] */
    loom_tensor *v[LOOM_MODEL_MAX_LAYERS]; /* [D*Hk, n_ctx] */
    loom_buffer_t *buffers;
    int n_buffers;
    int64_t n_ctx;
    loom_type type;
} loom_kv_cache;

/* A cache for n_ctx positions of `type` (F32 or F16); layer l's tensors go to
 * placement(name, l) or default_buft. Zero-filled. */
LOOM_API loom_status loom_kv_cache_new(const loom_model *m, int64_t n_ctx, loom_type type,
                                       const loom_model_params *placement, loom_kv_cache **out);
LOOM_API void loom_kv_cache_free(loom_kv_cache *kv);

/* ---------------------------------------------------------------- graph */

/* Attention spans the cache rounded up to this many positions (the rest masked). */
#define LOOM_KV_PAD 32

/* The inputs of one built graph, to be filled by loom_batch_set_inputs before compute. */
typedef struct loom_batch_graph {
    loom_graph *graph;
    loom_tensor *tokens;  /* I32 [T] */
    loom_tensor *pos;     /* I32 [T] */
    loom_tensor *mask;    /* F32 [K, T] */
    loom_tensor *logits;  /* F32 [V, T] or [V, 1] */
    int64_t n_tokens;
    int64_t n_past;
    int64_t n_kv;         /* K = n_past + n_tokens rounded up to LOOM_KV_PAD (<= n_ctx) */
} loom_batch_graph;

/* Builds the forward graph of n_tokens at positions n_past.. into ctx (no_alloc, big
 * enough: loom_model_graph_ctx_size). all_logits: logits for every position (else the
 * last only). Errors: n_past + n_tokens > cache size, a full context. */
LOOM_API loom_status loom_model_build_graph(const loom_model *m, const loom_kv_cache *kv,
                                            loom_ctx *ctx, int64_t n_tokens, int64_t n_past,
                                            bool all_logits, loom_batch_graph *out);
LOOM_API size_t loom_model_graph_ctx_size(const loom_model *m);
/* Writes tokens, positions and the causal mask into the graph's (allocated) inputs. */
LOOM_API loom_status loom_batch_set_inputs(const loom_batch_graph *bg, const int32_t *tokens);

/* ---------------------------------------------------------------- synthetic models */

/* A llama-family model with deterministic random weights and a small SentencePiece vocab,
 * for tests and for `loom`'s built-in default model. */
typedef struct loom_synth_params {
    const char *arch;     /* "llama" (default), "qwen2", "mixtral" ... */
    int64_t n_vocab;      /* >= 300 (control + byte tokens + letters) */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    int64_t n_expert, n_expert_used; /* 0: dense */
    loom_type wtype;      /* matrices: F32, F16, BF16, Q8_0, Q4_0 (norms and biases F32) */
    bool biases;          /* attention q/k/v biases, and expert biases for MoE */
    bool fused_qkv;       /* one attn_qkv weight instead of q, k, v */
    uint64_t seed;
} loom_synth_params;

LOOM_API loom_synth_params loom_synth_params_default(void);
/* A writer holding the model (write it with loom_gguf_write_file / _memory). */
LOOM_API loom_status loom_model_synth(const loom_synth_params *p, loom_gguf_writer **out);

/* ---------------------------------------------------------------- sampling */

typedef struct loom_sampler_params {
    float temp;   /* <= 0: greedy */
    int top_k;    /* <= 0: off */
    float top_p;  /* >= 1: off */
    uint64_t seed;
} loom_sampler_params;

typedef struct loom_sampler loom_sampler;
LOOM_API loom_sampler *loom_sampler_new(const loom_sampler_params *p); /* NULL on OOM */
LOOM_API void loom_sampler_free(loom_sampler *s);
/* Picks a token from logits[0..n_vocab). Deterministic for a given seed. */
LOOM_API int32_t loom_sampler_sample(loom_sampler *s, const float *logits, int64_t n_vocab);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_MODEL_H */
