/*
 * The demo model (see demo_block.h): hyper-parameters, deterministic weights and inputs,
 * and the graph builders of the attention and FFN stages of a llama-style layer.
 */
#include "tools/demo_block.h"

#include <math.h>
#include <string.h>

static const char *const weight_names[LOOM_DEMO_N_WEIGHTS] = {
    "attn_norm", "attn_q",   "attn_k", "attn_v",   "attn_output",
    "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down",
};

void loom_demo_hparams_default(loom_demo_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_embd = 256;
    hp->n_head = 8;
    hp->n_head_kv = 4;
    hp->n_ff = 688;
    hp->n_tokens = 16;
    hp->n_layers = 1;
    hp->wtype = LOOM_TYPE_F16;
    hp->eps = 1e-5f;
    hp->rope_base = 10000.0f;
    hp->seed = 42;
}

int loom_demo_head_dim(const loom_demo_hparams *hp) {
    return hp->n_embd / hp->n_head;
}

int loom_demo_n_stages(const loom_demo_hparams *hp) {
    return 2 * hp->n_layers;
}

bool loom_demo_stage_is_attn(int stage) {
    return stage % 2 == 0;
}

const char *loom_demo_weight_name(loom_demo_weight w) {
    return (unsigned)w < LOOM_DEMO_N_WEIGHTS ? weight_names[w] : "?";
}

loom_status loom_demo_hparams_check(const loom_demo_hparams *hp) {
    if (hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_ff <= 0 ||
        hp->n_tokens <= 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "demo: n_embd, heads, kv heads, n_ff and tokens must be positive");
    if (hp->n_layers < 1 || hp->n_layers > LOOM_DEMO_MAX_LAYERS)
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: layers %d is not in 1..%d", hp->n_layers,
                          LOOM_DEMO_MAX_LAYERS);
    if (hp->n_embd % hp->n_head != 0)
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: n_embd %d is not a multiple of heads %d",
                          hp->n_embd, hp->n_head);
    if (hp->n_head % hp->n_head_kv != 0)
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: heads %d is not a multiple of kv heads %d",
                          hp->n_head, hp->n_head_kv);
    if (loom_demo_head_dim(hp) % 2 != 0)
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: head_dim %d must be even (RoPE pairs)",
                          loom_demo_head_dim(hp));
    const loom_type_traits *tr = loom_type_traits_get(hp->wtype);
    if (!tr || !tr->from_float ||
        !(hp->wtype == LOOM_TYPE_F32 || hp->wtype == LOOM_TYPE_F16 || hp->wtype == LOOM_TYPE_BF16 ||
          hp->wtype == LOOM_TYPE_Q8_0 || hp->wtype == LOOM_TYPE_Q4_0))
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "demo: weight type %d is not one of f32, f16, bf16, q8_0, q4_0",
                          (int)hp->wtype);
    int64_t blck = tr->blck_size;
    if (hp->n_embd % blck != 0 || hp->n_ff % blck != 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "demo: %s weights need n_embd (%d) and n_ff (%d) to be multiples of "
                          "%lld",
                          tr->name, hp->n_embd, hp->n_ff, (long long)blck);
    if (!(hp->eps > 0) || !(hp->rope_base > 0))
        return loom_error(LOOM_ERR_INVALID_ARG, "demo: eps and rope base must be positive");
    return LOOM_OK;
}

void loom_demo_weight_shape(const loom_demo_hparams *hp, loom_demo_weight w, int64_t ne[2]) {
    int64_t e = hp->n_embd, kv = (int64_t)loom_demo_head_dim(hp) * hp->n_head_kv;
    ne[1] = 1;
    switch (w) {
    case LOOM_DEMO_ATTN_NORM:
    case LOOM_DEMO_FFN_NORM:
        ne[0] = e;
        break;
    case LOOM_DEMO_WQ:
    case LOOM_DEMO_WO:
        ne[0] = e, ne[1] = e;
        break;
    case LOOM_DEMO_WK:
    case LOOM_DEMO_WV:
        ne[0] = e, ne[1] = kv;
        break;
    case LOOM_DEMO_W_GATE:
    case LOOM_DEMO_W_UP:
        ne[0] = e, ne[1] = hp->n_ff;
        break;
    case LOOM_DEMO_W_DOWN:
        ne[0] = hp->n_ff, ne[1] = e;
        break;
    default:
        LOOM_ASSERT(!"bad weight id");
    }
}

/* ---------------------------------------------------------------- deterministic data */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float uniform(uint64_t *s) {
    return (float)((double)(splitmix64(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

void loom_demo_weight_values(const loom_demo_hparams *hp, int layer, loom_demo_weight w,
                             float *dst) {
    int64_t ne[2];
    loom_demo_weight_shape(hp, w, ne);
    uint64_t s = hp->seed * 0x100000001B3ull + (uint64_t)layer * 64 + (uint64_t)w + 1;
    int64_t n = ne[0] * ne[1];
    if (w == LOOM_DEMO_ATTN_NORM || w == LOOM_DEMO_FFN_NORM) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = 1.0f + 0.25f * uniform(&s);
        return;
    }
    /* scaled so every output of a matmul stays of order 1 */
    float scale = 1.0f / sqrtf((float)ne[0]);
    for (int64_t i = 0; i < n; i++)
        dst[i] = scale * uniform(&s);
}

void loom_demo_input_values(const loom_demo_hparams *hp, float *x) {
    uint64_t s = hp->seed ^ 0xA5A5A5A5DEADBEEFull;
    int64_t n = (int64_t)hp->n_embd * hp->n_tokens;
    for (int64_t i = 0; i < n; i++)
        x[i] = uniform(&s);
}

/* ---------------------------------------------------------------- tensors and ops */

size_t loom_demo_stage_ctx_size(void) {
    /* weights (9) + inputs (3) + about 30 ops per stage, with room to spare */
    return loom_tensor_overhead() * 64 + loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE);
}

static int stage_layer(int stage) {
    return stage / 2;
}

loom_status loom_demo_stage_weights_new(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                        loom_demo_layer *out) {
    memset(out, 0, sizeof *out);
    int first = loom_demo_stage_is_attn(stage) ? LOOM_DEMO_ATTN_NORM : LOOM_DEMO_FFN_NORM;
    int last = loom_demo_stage_is_attn(stage) ? LOOM_DEMO_WO : LOOM_DEMO_W_DOWN;
    for (int w = first; w <= last; w++) {
        int64_t ne[2];
        loom_demo_weight_shape(hp, (loom_demo_weight)w, ne);
        bool is_norm = w == LOOM_DEMO_ATTN_NORM || w == LOOM_DEMO_FFN_NORM;
        loom_tensor *t = is_norm ? loom_new_tensor_1d(ctx, LOOM_TYPE_F32, ne[0])
                                 : loom_new_tensor_2d(ctx, hp->wtype, ne[0], ne[1]);
        if (!t) return loom_last_status();
        loom_format_name(t, "blk.%d.%s", stage_layer(stage), weight_names[w]);
        loom_set_param(t);
        out->w[w] = t;
    }
    return LOOM_OK;
}

loom_status loom_demo_stage_inputs_new(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                       loom_demo_inputs *out) {
    memset(out, 0, sizeof *out);
    out->x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, hp->n_embd, hp->n_tokens);
    if (!out->x) return loom_last_status();
    loom_format_name(out->x, "stage%d.x", stage);
    loom_set_input(out->x);
    if (!loom_demo_stage_is_attn(stage)) return LOOM_OK;
    out->pos = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, hp->n_tokens);
    out->mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, hp->n_tokens, hp->n_tokens);
    if (!out->pos || !out->mask) return loom_last_status();
    loom_format_name(out->pos, "stage%d.pos", stage);
    loom_format_name(out->mask, "stage%d.kq_mask", stage);
    loom_set_input(out->pos);
    loom_set_input(out->mask);
    return LOOM_OK;
}

static loom_tensor *build_attn(loom_ctx *ctx, const loom_demo_hparams *hp, const loom_demo_layer *L,
                               const loom_demo_inputs *in, loom_tensor *x) {
    const int64_t T = hp->n_tokens, hd = loom_demo_head_dim(hp);
    loom_tensor *cur = loom_rms_norm(ctx, x, hp->eps);           /* [n_embd, T] */
    cur = loom_mul(ctx, cur, L->w[LOOM_DEMO_ATTN_NORM]);         /* [n_embd, T] */
    loom_tensor *q = loom_mul_mat(ctx, L->w[LOOM_DEMO_WQ], cur); /* [hd*H, T] */
    loom_tensor *k = loom_mul_mat(ctx, L->w[LOOM_DEMO_WK], cur); /* [hd*Hkv, T] */
    loom_tensor *v = loom_mul_mat(ctx, L->w[LOOM_DEMO_WV], cur); /* [hd*Hkv, T] */
    q = loom_reshape_3d(ctx, q, hd, hp->n_head, T);              /* [hd, H, T] */
    k = loom_reshape_3d(ctx, k, hd, hp->n_head_kv, T);           /* [hd, Hkv, T] */
    v = loom_reshape_3d(ctx, v, hd, hp->n_head_kv, T);           /* [hd, Hkv, T] */
    q = loom_rope_ext(ctx, q, in->pos, NULL, (int)hd, LOOM_ROPE_TYPE_NORMAL, hp->rope_base, 1.0f);
    k = loom_rope_ext(ctx, k, in->pos, NULL, (int)hd, LOOM_ROPE_TYPE_NORMAL, hp->rope_base, 1.0f);
    q = loom_permute(ctx, q, 0, 2, 1, 3); /* [hd, T, H] */
    k = loom_permute(ctx, k, 0, 2, 1, 3); /* [hd, T, Hkv] */
    v = loom_permute(ctx, v, 0, 2, 1, 3); /* [hd, T, Hkv] */
    loom_tensor *o = loom_flash_attn_ext(ctx, q, k, v, in->mask, NULL, 1.0f / sqrtf((float)hd),
                                         0.0f, 0.0f); /* [hd,H,T] */
    o = loom_reshape_2d(ctx, o, hd * hp->n_head, T);  /* [n_embd, T] */
    o = loom_mul_mat(ctx, L->w[LOOM_DEMO_WO], o);     /* [n_embd, T] */
    return loom_add(ctx, x, o);
}

static loom_tensor *build_ffn(loom_ctx *ctx, const loom_demo_hparams *hp, const loom_demo_layer *L,
                              loom_tensor *x) {
    loom_tensor *cur = loom_rms_norm(ctx, x, hp->eps); /* [n_embd, T] */
    cur = loom_mul(ctx, cur, L->w[LOOM_DEMO_FFN_NORM]);
    loom_tensor *g = loom_mul_mat(ctx, L->w[LOOM_DEMO_W_GATE], cur); /* [n_ff, T] */
    loom_tensor *u = loom_mul_mat(ctx, L->w[LOOM_DEMO_W_UP], cur);   /* [n_ff, T] */
    loom_tensor *h = loom_swiglu_split(ctx, g, u);                   /* silu(g) * u */
    loom_tensor *d = loom_mul_mat(ctx, L->w[LOOM_DEMO_W_DOWN], h);   /* [n_embd, T] */
    return loom_add(ctx, x, d);
}

loom_tensor *loom_demo_stage_build(loom_ctx *ctx, const loom_demo_hparams *hp, int stage,
                                   const loom_demo_layer *w, const loom_demo_inputs *in,
                                   loom_tensor *x) {
    loom_tensor *out =
        loom_demo_stage_is_attn(stage) ? build_attn(ctx, hp, w, in, x) : build_ffn(ctx, hp, w, x);
    if (out) loom_format_name(out, "stage%d.out", stage);
    return out;
}

loom_status loom_demo_stage_weights_upload(const loom_demo_hparams *hp, int stage,
                                           const loom_demo_layer *w) {
    for (int i = 0; i < LOOM_DEMO_N_WEIGHTS; i++) {
        loom_tensor *t = w->w[i];
        if (!t) continue;
        int64_t n = loom_nelements(t);
        float *vals = loom_malloc(sizeof(float) * (size_t)n);
        void *packed = loom_malloc(loom_nbytes(t));
        if (!vals || !packed) {
            loom_free(vals);
            loom_free(packed);
            return loom_error(LOOM_ERR_NOMEM, "demo: no host memory for weight %s", t->name);
        }
        loom_demo_weight_values(hp, stage_layer(stage), (loom_demo_weight)i, vals);
        loom_type_traits_get(t->type)->from_float(vals, packed, n);
        loom_tensor_set(t, packed, 0, loom_nbytes(t));
        loom_free(vals);
        loom_free(packed);
    }
    return LOOM_OK;
}

loom_status loom_demo_stage_inputs_upload(const loom_demo_hparams *hp, const loom_demo_inputs *in) {
    const int T = hp->n_tokens;
    if (!in->pos) return LOOM_OK;
    int32_t *pos = loom_malloc(sizeof(int32_t) * (size_t)T);
    float *mask = loom_malloc(sizeof(float) * (size_t)T * (size_t)T);
    if (!pos || !mask) {
        loom_free(pos);
        loom_free(mask);
        return loom_error(LOOM_ERR_NOMEM, "demo: no host memory for the attention inputs");
    }
    for (int t = 0; t < T; t++)
        pos[t] = t;
    /* mask[i (key), j (query)]: query j sees keys 0..j */
    for (int j = 0; j < T; j++)
        for (int i = 0; i < T; i++)
            mask[(size_t)j * T + i] = i <= j ? 0.0f : -INFINITY;
    loom_tensor_set(in->pos, pos, 0, sizeof(int32_t) * (size_t)T);
    loom_tensor_set(in->mask, mask, 0, sizeof(float) * (size_t)T * (size_t)T);
    loom_free(pos);
    loom_free(mask);
    return LOOM_OK;
}
