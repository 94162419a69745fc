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
 * The architectures (model/arch-*.c) vary this recipe through loom_hparams and the
 * optional weights: q/k norms, rope factors (llama 3.1, YaRN), attention sinks and
 * softcap, sliding-window layers (a second mask), post norms and GELU (gemma), fused
 * gate/up (phi3), shared experts (qwen2moe), gpt-oss's routing and clamped SwiGLU.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "loom/backend.h"
#include "loom/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MODEL_MAX_LAYERS 512
#define LOOM_MODEL_MAX_DIM ((int64_t)1 << 20) /* n_embd, n_ff, n_head * head_dim, ... */
#define LOOM_MODEL_MAX_EXPERTS 1024

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
    /* architecture extras (defaults: off) */
    int64_t n_ff_shexp;  /* shared-expert FFN length (qwen2moe), 0: none */
    bool qk_norm;        /* per-head RMS norm of q and k before rope (qwen3) */
    float attn_scale;    /* scale of q.k; 0: 1/sqrt(head_dim) */
    float embd_scale;    /* input embeddings multiplied by this; 0: not scaled */
    float attn_softcap;  /* attention logits softcap (gemma2), 0: off */
    float final_softcap; /* output logits: cap * tanh(logits / cap) (gemma2), 0: off */
    int ffn_glu;         /* LOOM_GLU_SWIGLU (default) or LOOM_GLU_GEGLU (gemma) */
    bool post_norms;     /* gemma: post-attention and post-FFN norms */
    int64_t n_swa;       /* sliding window in positions, 0: none */
    float rope_freq_base_swa, rope_freq_scale_swa; /* rope of the sliding-window layers */
    bool swa_layer[LOOM_MODEL_MAX_LAYERS];         /* which layers use the sliding window */
    /* YaRN rope (rope.scaling.type yarn): applied as per-frequency factors and a q.k
     * scale of mscale^2, exactly as ggml's rope computes it */
    bool rope_yarn;
    int64_t n_ctx_orig;     /* rope.scaling.original_context_length, default context_length */
    float rope_attn_factor; /* rope.scaling.attn_factor (phi3 longrope): cos, sin times it */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    /* gpt-oss: routing weights = softmax over the selected experts' logits; experts'
     * clamped SwiGLU: min(g, limit) sigmoid(alpha min(g, limit)) (clamp(u, +-limit) + 1) */
    bool moe_softmax_selected;
    float swiglu_alpha, swiglu_limit; /* 0: plain SwiGLU */
} loom_hparams;

/* Reads hyperparameters; errors name the missing key or the unknown architecture. */
LOOM_API loom_status loom_hparams_from_gguf(const loom_gguf *g, loom_hparams *hp);

/* Per-layer weights (NULL when absent). */
typedef struct loom_layer {
    loom_tensor *attn_norm, *wq, *wk, *wv, *wqkv, *wo, *bq, *bk, *bv, *bqkv, *bo;
    loom_tensor *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
    loom_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    loom_tensor *ffn_gate_exps_b, *ffn_up_exps_b, *ffn_down_exps_b; /* expert biases */
    loom_tensor *attn_q_norm, *attn_k_norm;                         /* [head_dim] (qwen3) */
    loom_tensor *ffn_gate_inp_shexp, *ffn_gate_shexp, *ffn_up_shexp, *ffn_down_shexp;
    loom_tensor *attn_post_norm, *ffn_post_norm; /* gemma */
    loom_tensor *attn_sinks;                     /* [n_head] one extra logit per head (gpt-oss) */
    loom_tensor *ffn_gate_inp_b;                 /* [n_expert] router bias (gpt-oss) */
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
    /* read every weight instead of using CPU weights in place from a mapping of the file */
    bool no_mmap;
    /* device (non-host) weights are copied in pieces of at most this many bytes (whole rows;
     * 0: 16 MiB); without a mapping they pass through one staging buffer of this size */
    size_t load_chunk;
} loom_model_params;

typedef struct loom_model {
    loom_hparams hp;
    loom_ctx *ctx;                 /* weight headers (no_alloc) */
    loom_tensor *tok_embd, *output_norm, *output; /* output == tok_embd when tied */
    loom_tensor *rope_freqs;             /* F32 [n_rot/2] rope frequency divisors (llama 3.1, or
                                          * computed for YaRN: "rope_yarn_factors"), or NULL */
    loom_tensor *rope_long, *rope_short; /* phi3 longrope: rope_factors_long / _short (the
                                          * long ones when the cache exceeds n_ctx_orig) */
    loom_layer layers[LOOM_MODEL_MAX_LAYERS];
    loom_buffer_t *buffers;        /* one per distinct buffer type used */
    int n_buffers;
    size_t n_bytes;                /* weight bytes */
    bool no_flash_attn;            /* attention as mul_mat + soft_max(mask) + mul_mat */
    int64_t load_us;
    void *map;             /* the model's private mapping of the file (NULL: none aliased) */
    size_t map_size;
    size_t n_mapped_bytes; /* weight bytes used in place from `map` */
    size_t staging_bytes;  /* the load's staging buffer (0: none was needed) */
    /* While `map` is set: a descriptor of the mapped file and its modification time at load
     * (ns), which loom_model_check_file compares with the file's (-1: none). */
    int map_fd;
    int64_t map_mtime_ns;
} loom_model;

/* Creates the weight tensors of g's model (checking every shape against the
 * hyperparameters, with errors naming the tensor), allocates them where `params` says and
 * copies the data in. */
LOOM_API loom_status loom_model_load(const loom_gguf *g, const loom_model_params *params,
                                     loom_model **out);
LOOM_API void loom_model_free(loom_model *m);
/* Whether the file the model reads weights from in place (its mapping) is still the one it
 * mapped: LOOM_ERR_IO naming the sizes when it has been truncated (reading a weight past the
 * new end would raise SIGBUS), or naming both times when it has been written since the load
 * (the weights would silently change). LOOM_OK when no weight is read in place. A session
 * calls it before every batch; a file truncated during a computation still raises SIGBUS. */
LOOM_API loom_status loom_model_check_file(const loom_model *m);
/* Calls fn for every weight tensor (layer -1 for globals). */
LOOM_API void loom_model_foreach_weight(loom_model *m,
                                        void (*fn)(loom_tensor *t, int layer, void *ud),
                                        void *ud);

/* ---------------------------------------------------------------- KV cache */

typedef struct loom_kv_cache {
    loom_ctx *ctx;
    loom_tensor *k[LOOM_MODEL_MAX_LAYERS]; /* [D*Hk, n_ctx] (sliding layers: n_swa_cells) */
    loom_tensor *v[LOOM_MODEL_MAX_LAYERS]; /* [D*Hk, n_ctx] (sliding layers: n_swa_cells) */
    loom_buffer_t *buffers;
    int n_buffers;
    int64_t n_ctx;
    loom_type type;   /* K's type */
    loom_type type_v; /* V's type (the same as K's unless made by loom_kv_cache_new_types) */
    /* rows of a sliding-window layer's K and V: a ring of cells, position p in cell
     * p % n_swa_cells (masked by absolute position); n_ctx when not bounded */
    int64_t n_swa_cells;
} loom_kv_cache;

/* A cache for n_ctx positions of `type` (K and V); layer l's tensors go to
 * placement(name, l) or default_buft. Zero-filled. */
LOOM_API loom_status loom_kv_cache_new(const loom_model *m, int64_t n_ctx, loom_type type,
                                       const loom_model_params *placement, loom_kv_cache **out);
/* K and V of different types. The types are those loom_kv_cache_type_ok accepts: f32, f16,
 * bf16 and the block types q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (a row of n_head_kv x
 * head_dim values must be whole blocks). */
LOOM_API loom_status loom_kv_cache_new_types(const loom_model *m, int64_t n_ctx, loom_type type_k,
                                             loom_type type_v, const loom_model_params *placement,
                                             loom_kv_cache **out);
/* The same with every sliding-window layer bounded to loom_kv_cache_swa_cells(hp, n_ctx,
 * n_batch) cells (n_batch: the largest batch a graph will hold; <= 0: not bounded). A
 * graph of more than n_batch tokens at once is then refused. */
LOOM_API loom_status loom_kv_cache_new_bounded(const loom_model *m, int64_t n_ctx, int64_t n_batch,
                                               loom_type type_k, loom_type type_v,
                                               const loom_model_params *placement,
                                               loom_kv_cache **out);
/* Cells of a sliding-window layer's ring: the window plus a batch, n_swa - 1 + n_batch,
 * rounded up to LOOM_KV_PAD, at most n_ctx (n_ctx without sliding layers or n_batch <= 0). */
LOOM_API int64_t loom_kv_cache_swa_cells(const loom_hparams *hp, int64_t n_ctx, int64_t n_batch);
/* Rows of layer il's K and V in such a cache. */
LOOM_API int64_t loom_kv_cache_layer_cells(const loom_hparams *hp, int64_t n_ctx, int64_t n_batch,
                                           int il);
LOOM_API bool loom_kv_cache_type_ok(loom_type t);
/* Whether a cache of type t fits the model (which: "K" or "V", for the message): a cache
 * row is whole blocks, and with per_head (a cache split by heads) so is every head. */
LOOM_API loom_status loom_kv_cache_check_type(const loom_hparams *hp, const char *which,
                                              loom_type t, bool per_head);
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
    loom_tensor *mask_swa; /* F32 [K, T]: causal and within the sliding window, or NULL;
                            * == mask when every layer slides; with a ring, K is its cells
                            * (at most n_swa_cells), each masked by the position it holds */
    int64_t n_swa;
    loom_tensor *pos_swa; /* I32 [T]: the ring cell of each position, or NULL (not bounded) */
    int64_t n_swa_cells;  /* the ring's cells (kv->n_swa_cells) */
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
    loom_type wtype;      /* matrices: F32, F16, BF16 or any quantised weight type (norms and
                             biases F32; K-quants need n_embd, n_ff multiples of 256) */
    /* Mixed-type files (Q4_K_M style): attn_v, ffn_down and output.weight in wtype_hi when it
     * is not F32 (e.g. Q6_K next to Q4_K); token_embd in embd_type (default F32). */
    loom_type wtype_hi;
    loom_type embd_type;
    bool biases;          /* attention q/k/v biases, and expert biases for MoE */
    bool attn_biases;     /* attention biases only (with `biases` off) */
    bool fused_qkv;       /* one attn_qkv weight instead of q, k, v */
    uint64_t seed;
    /* architecture features (all off by default) */
    bool tied;          /* no output.weight: the output reuses token_embd */
    bool rope_freqs;    /* a rope_freqs.weight of llama3-style factors */
    int64_t n_ff_shexp; /* qwen2moe shared expert (with its gate) of this FFN length */
    bool qk_norm;       /* attn_q_norm / attn_k_norm (qwen3) */
    int64_t head_dim;   /* 0: n_embd / n_head; else written as attention.key_length */
    int64_t n_swa;      /* gemma2/3, phi3: attention.sliding_window */
    bool fused_gate_up; /* phi3: one ffn_up [n_embd, 2 n_ff] (gate rows first), no ffn_gate */
    bool longrope;      /* phi3: rope_factors_long / rope_factors_short */
} loom_synth_params;

LOOM_API loom_synth_params loom_synth_params_default(void);
/* A writer holding the model (write it with loom_gguf_write_file / _memory). */
LOOM_API loom_status loom_model_synth(const loom_synth_params *p, loom_gguf_writer **out);

/* ---------------------------------------------------------------- sampling */

/* llama.cpp's chain and order: top-k, then top-p over the softmax of the remaining logits
 * (before the temperature), then min-p (drop a token whose probability is below min_p times
 * the top one's), then the temperature, then a draw. */
typedef struct loom_sampler_params {
    float temp;   /* <= 0: greedy */
    int top_k;    /* <= 0: off */
    float top_p;  /* >= 1: off */
    uint64_t seed;
    float min_p;  /* <= 0: off */
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
