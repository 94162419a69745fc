/*
 * The demo model: a small llama-style transformer, built from loom ops. One layer is two
 * stages, so a run can place them on different devices by hand:
 *
 *   attention stage: x [n_embd, T] -> x + Wo . attn(rope(Wq . n), rope(Wk . n), Wv . n)
 *                    with n = rms_norm(x) * attn_norm, causal flash attention, GQA
 *   ffn stage:       x [n_embd, T] -> x + Wdown . (silu(Wgate . n) * (Wup . n))
 *                    with n = rms_norm(x) * ffn_norm
 *
 * Weights and inputs are deterministic functions of (seed, layer, tensor), generated on
 * the host in F32 and converted to the weight type, so every run (and a test's scalar
 * reference) sees the same numbers.
 */
#ifndef LOOM_TOOLS_DEMO_BLOCK_H
#define LOOM_TOOLS_DEMO_BLOCK_H

#include "loom/loom.h"

#define LOOM_DEMO_MAX_LAYERS 16

typedef struct loom_demo_hparams {
    int n_embd;      /* model width; n_head * head_dim */
    int n_head;      /* query heads */
    int n_head_kv;   /* key/value heads (GQA: n_head % n_head_kv == 0) */
    int n_ff;        /* FFN hidden width */
    int n_tokens;    /* T: tokens processed at once (positions 0..T-1) */
    int n_layers;    /* 1..LOOM_DEMO_MAX_LAYERS; 2 stages each */
    loom_type wtype; /* type of the matmul weights: f32, f16, bf16, q8_0, q4_0 */
    float eps;       /* rms_norm epsilon */
    float rope_base; /* RoPE frequency base */
    uint64_t seed;   /* weights and inputs */
} loom_demo_hparams;

/* Which tensor of a layer (the order of loom_demo_layer's fields). */
typedef enum loom_demo_weight {
    LOOM_DEMO_ATTN_NORM = 0, /* F32 [n_embd] */
    LOOM_DEMO_WQ,            /* [n_embd, n_embd] */
    LOOM_DEMO_WK,            /* [n_embd, head_dim * n_head_kv] */
    LOOM_DEMO_WV,            /* [n_embd, head_dim * n_head_kv] */
    LOOM_DEMO_WO,            /* [n_embd, n_embd] */
    LOOM_DEMO_FFN_NORM,      /* F32 [n_embd] */
    LOOM_DEMO_W_GATE,        /* [n_embd, n_ff] */
    LOOM_DEMO_W_UP,          /* [n_embd, n_ff] */
    LOOM_DEMO_W_DOWN,        /* [n_ff, n_embd] */
    LOOM_DEMO_N_WEIGHTS
} loom_demo_weight;

/* One layer's weight tensors (NULL for those of the other stage). */
typedef struct loom_demo_layer {
    loom_tensor *w[LOOM_DEMO_N_WEIGHTS];
} loom_demo_layer;

/* Inputs a stage reads besides its weights. */
typedef struct loom_demo_inputs {
    loom_tensor *x;    /* F32 [n_embd, T]: the residual stream entering the stage */
    loom_tensor *pos;  /* I32 [T] (attention only) */
    loom_tensor *mask; /* F32 [T, T], 0 or -INF (causal; attention only) */
} loom_demo_inputs;

/* n_embd 256, 8 heads (4 kv), n_ff 688, 16 tokens, 1 layer, F16 weights, seed 42. */
void loom_demo_hparams_default(loom_demo_hparams *hp);
/* LOOM_ERR_INVALID_ARG naming the bad field (e.g. n_ff not a multiple of a quant block). */
loom_status loom_demo_hparams_check(const loom_demo_hparams *hp);
int loom_demo_head_dim(const loom_demo_hparams *hp);
int loom_demo_n_stages(const loom_demo_hparams *hp);
bool loom_demo_stage_is_attn(int stage);
const char *loom_demo_weight_name(loom_demo_weight w);
/* Shape [ne0 (K, contiguous), ne1] of a weight. */
void loom_demo_weight_shape(const loom_demo_hparams *hp, loom_demo_weight w, int64_t ne[2]);

/* Deterministic F32 values before conversion to the weight type. */
void loom_demo_weight_values(const loom_demo_hparams *hp, int layer, loom_demo_weight w,
                             float *dst);
void loom_demo_input_values(const loom_demo_hparams *hp, float *x /* [n_embd * T] */);

/* Creates the weight tensors of `stage` (no data) in ctx, named "blk.L.NAME". */
loom_status loom_demo_stage_weights_new(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                        loom_demo_layer *out);
/* Creates x (and pos, mask for attention stages) in ctx (no data), flagged as inputs. */
loom_status loom_demo_stage_inputs_new(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                       loom_demo_inputs *out);
/* Builds the stage's ops; returns the stage output [n_embd, T] or NULL. `x` may be the
 * output of a previous stage instead of in->x. */
loom_tensor *loom_demo_stage_build(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                   const loom_demo_layer *w, const loom_demo_inputs *in,
                                   loom_tensor *x);
/* Writes the deterministic values into the stage's (allocated) weights, converting. */
loom_status loom_demo_stage_weights_upload(const loom_demo_hparams *hp, int stage,
                                           const loom_demo_layer *w);
/* Writes pos and mask (if present) of allocated stage inputs. */
loom_status loom_demo_stage_inputs_upload(const loom_demo_hparams *hp, const loom_demo_inputs *in);
/* Bytes a ctx needs for the headers of one stage (weights, inputs, ops) plus a graph. */
size_t loom_demo_stage_ctx_size(void);

#endif /* LOOM_TOOLS_DEMO_BLOCK_H */
