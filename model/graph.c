/*
 * The llama-family forward graph (dense and MoE) and its KV cache. See include/loom/model.h
 * for the shapes of every step. The graph only references weights and cache tensors; the
 * caller allocates its intermediates (scheduler or a plain buffer) and fills its inputs
 * with loom_batch_set_inputs.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "model/arch-impl.h"

/* ---------------------------------------------------------------- KV cache */

bool loom_kv_cache_type_ok(loom_type t) {
    return t == LOOM_TYPE_F32 || t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16 || t == LOOM_TYPE_Q8_0 ||
           t == LOOM_TYPE_Q4_0 || t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_0 ||
           t == LOOM_TYPE_Q5_1 || t == LOOM_TYPE_IQ4_NL;
}

loom_status loom_kv_cache_check_type(const loom_hparams *hp, const char *which, loom_type t,
                                     bool per_head) {
    if (!loom_kv_cache_type_ok(t))
        return loom_error(LOOM_ERR_TYPE,
                          "kv cache: %s type %s is not a cache type (f32, f16, bf16, q8_0, "
                          "q4_0, q4_1, q5_0, q5_1, iq4_nl)",
                          which, loom_type_is_valid((int)t) ? loom_type_name(t) : "?");
    const int64_t blck = loom_blck_size(t), Dkv = hp->n_head_kv * hp->head_dim;
    if (Dkv % blck != 0)
        return loom_error(LOOM_ERR_TYPE,
                          "kv cache: %s type %s stores blocks of %lld values but a cache row "
                          "(%lld KV heads x head_dim %lld) has %lld",
                          which, loom_type_name(t), (long long)blck, (long long)hp->n_head_kv,
                          (long long)hp->head_dim, (long long)Dkv);
    if (per_head && hp->head_dim % blck != 0)
        return loom_error(LOOM_ERR_TYPE,
                          "kv cache: %s type %s stores blocks of %lld values: head_dim %lld is "
                          "not whole blocks, so the cache cannot be split by heads (use f16, "
                          "or split by layer)",
                          which, loom_type_name(t), (long long)blck, (long long)hp->head_dim);
    return LOOM_OK;
}

loom_status loom_kv_cache_new(const loom_model *m, int64_t n_ctx, loom_type type,
                              const loom_model_params *p, loom_kv_cache **out) {
    return loom_kv_cache_new_bounded(m, n_ctx, 0, type, type, p, out);
}

loom_status loom_kv_cache_new_types(const loom_model *m, int64_t n_ctx, loom_type type,
                                    loom_type type_v, const loom_model_params *p,
                                    loom_kv_cache **out) {
    return loom_kv_cache_new_bounded(m, n_ctx, 0, type, type_v, p, out);
}

int64_t loom_kv_cache_swa_cells(const loom_hparams *hp, int64_t n_ctx, int64_t n_batch) {
    bool any = false;
    for (int il = 0; il < hp->n_layer && il < LOOM_MODEL_MAX_LAYERS; il++)
        any |= hp->swa_layer[il];
    if (!any || hp->n_swa <= 0 || n_batch <= 0 || n_ctx <= 0 || hp->n_swa > n_ctx ||
        n_batch > n_ctx)
        return n_ctx;
    int64_t cells = (hp->n_swa - 1 + n_batch + LOOM_KV_PAD - 1) / LOOM_KV_PAD * LOOM_KV_PAD;
    return cells < n_ctx ? cells : n_ctx;
}

int64_t loom_kv_cache_layer_cells(const loom_hparams *hp, int64_t n_ctx, int64_t n_batch, int il) {
    return il >= 0 && il < LOOM_MODEL_MAX_LAYERS && hp->swa_layer[il]
               ? loom_kv_cache_swa_cells(hp, n_ctx, n_batch)
               : n_ctx;
}

loom_status loom_kv_cache_new_bounded(const loom_model *m, int64_t n_ctx, int64_t n_batch,
                                      loom_type type, loom_type type_v, const loom_model_params *p,
                                      loom_kv_cache **out) {
    *out = NULL;
    loom_status st;
    if ((st = loom_kv_cache_check_type(&m->hp, "K", type, false)) ||
        (st = loom_kv_cache_check_type(&m->hp, "V", type_v, false)))
        return st;
    if (n_ctx <= 0) return loom_error(LOOM_ERR_INVALID_ARG, "kv cache: n_ctx %lld", (long long)n_ctx);
    const loom_hparams *hp = &m->hp;
    loom_kv_cache *kv = loom_calloc(1, sizeof *kv);
    if (!kv) return loom_error(LOOM_ERR_NOMEM, "kv cache: out of memory");
    kv->n_ctx = n_ctx;
    kv->n_swa_cells = loom_kv_cache_swa_cells(hp, n_ctx, n_batch);
    kv->type = type;
    kv->type_v = type_v;
    kv->ctx = loom_ctx_new((loom_ctx_params){
        .mem_size = (size_t)(2 * hp->n_layer + 4) * loom_tensor_overhead(), .no_alloc = true});
    kv->buffers = loom_calloc((size_t)(2 * hp->n_layer + 1), sizeof *kv->buffers);
    if (!kv->ctx || !kv->buffers) {
        loom_kv_cache_free(kv);
        return loom_error(LOOM_ERR_NOMEM, "kv cache: out of memory");
    }
    const int64_t Dkv = hp->n_head_kv * hp->head_dim;
    for (int il = 0; il < hp->n_layer && st == LOOM_OK; il++) {
        for (int which = 0; which < 2; which++) {
            loom_tensor *t = loom_new_tensor_2d(kv->ctx, which ? type_v : type, Dkv,
                                                hp->swa_layer[il] ? kv->n_swa_cells : n_ctx);
            if (!t) {
                st = loom_error(LOOM_ERR_NOMEM, "kv cache: %s", loom_last_error());
                break;
            }
            loom_format_name(t, "cache_%c_l%d", which ? 'v' : 'k', il);
            (which ? kv->v : kv->k)[il] = t;
            loom_buft_t buft = p && p->placement ? p->placement(t->name, il, p->placement_user_data) : NULL;
            if (!buft) buft = p && p->default_buft ? p->default_buft : loom_cpu_buffer_type();
            loom_buffer_t buf = loom_buft_alloc_buffer(buft, loom_buft_alloc_size(buft, t));
            if (!buf) {
                st = loom_error(loom_last_status() ? loom_last_status() : LOOM_ERR_DEVICE_OOM,
                                "kv cache: cannot allocate %s on %s: %s", t->name,
                                loom_buft_name(buft), loom_last_error());
                break;
            }
            kv->buffers[kv->n_buffers++] = buf;
            if ((st = loom_buffer_alloc_tensor(buf, t, 0))) break;
            loom_buffer_clear(buf, 0);
        }
    }
    if (st) {
        loom_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return LOOM_OK;
}

void loom_kv_cache_free(loom_kv_cache *kv) {
    if (!kv) return;
    for (int i = 0; i < kv->n_buffers; i++) loom_buffer_free(kv->buffers[i]);
    loom_free(kv->buffers);
    loom_ctx_free(kv->ctx);
    loom_free(kv);
}

/* ---------------------------------------------------------------- graph */

size_t loom_model_graph_ctx_size(const loom_model *m) {
    size_t per_layer = 128 + (size_t)(m->hp.n_expert_used > 0 ? m->hp.n_expert_used * 3 : 0);
    size_t n = 64 + per_layer * (size_t)m->hp.n_layer;
    return n * loom_tensor_overhead() + loom_graph_overhead(n * 2);
}

/* Names the nodes the builders left unnamed, in graph order (sources first): a matmul by a
 * layer's weight "blk.N.attn_q.weight" is "attn_q-N" (as "attn_out-N"), another op with a
 * weight "op(attn_q.bias)-N", any other node "op(src)" after its first source; a view of
 * an unnamed node (" (reshaped)") takes its source's new name. loom explain, the
 * scheduler's split inputs and errors then name every tensor. */
static void name_unnamed(loom_graph *gf) {
    for (int i = 0; i < gf->n_nodes; i++) {
        loom_tensor *t = gf->nodes[i];
        if (t->name[0] && t->name[0] != ' ') continue;
        const loom_tensor *src = t->src[0], *w = NULL;
        if (t->name[0] == ' ') {
            if (!src || !src->name[0]) continue;
            char tail[LOOM_MAX_NAME];
            snprintf(tail, sizeof tail, "%s", t->name);
            loom_format_name(t, "%s%s", src->name, tail);
            continue;
        }
        for (int k = 0; k < LOOM_MAX_SRC && t->src[k] && !w; k++)
            if (t->src[k]->flags & LOOM_TENSOR_FLAG_PARAM && t->src[k]->name[0]) w = t->src[k];
        char op[32];
        snprintf(op, sizeof op, "%s", loom_op_name(t->op));
        for (char *c = op; *c; c++)
            *c = (char)tolower((unsigned char)*c);
        if (!w) {
            loom_format_name(t, "%s(%s)", op, src ? src->name : "");
            continue;
        }
        char stem[LOOM_MAX_NAME];
        const char *n = w->name;
        int layer = -1, skip = 0;
        if (sscanf(n, "blk.%d.%n", &layer, &skip) == 1 && skip > 0) n += skip;
        snprintf(stem, sizeof stem, "%s", n);
        size_t len = strlen(stem);
        if (len > 7 && !strcmp(stem + len - 7, ".weight")) stem[len - 7] = 0;
        char lay[16] = "";
        if (layer >= 0) snprintf(lay, sizeof lay, "-%d", layer);
        if (t->op == LOOM_OP_MUL_MAT || t->op == LOOM_OP_MUL_MAT_ID)
            loom_format_name(t, "%s%s", stem, lay);
        else
            loom_format_name(t, "%s(%s)%s", op, stem, lay);
    }
}

static loom_tensor *add_bias(loom_ctx *ctx, loom_tensor *x, loom_tensor *b) {
    return b ? loom_add(ctx, x, b) : x;
}

/* The first n rows of a cache (through its write node w) as [D, Hk, n]. A head is a whole
 * number of blocks of a block-typed cache, so the view addresses it in place (flash
 * attention dequantises the rows it reads); when it is not (head_dim 8 at q8_0: a block
 * spans heads; only without a tensor split, loom_kv_cache_check_type) or attention is not
 * flash attention (its matmuls take f32/f16 caches), the rows are dequantised to f32 first. */
static loom_tensor *cache_view(loom_ctx *ctx, loom_tensor *w, const loom_tensor *c, int64_t D,
                               int64_t Hk, int64_t n, bool flash) {
    const bool is_float = c->type == LOOM_TYPE_F32 || c->type == LOOM_TYPE_F16;
    if (is_float || (flash && D % loom_blck_size(c->type) == 0))
        return loom_view_3d(ctx, w, D, Hk, n, loom_row_size(c->type, D), c->nb[1], 0);
    loom_tensor *rows = loom_view_2d(ctx, w, D * Hk, n, c->nb[1], 0);
    loom_tensor *f = loom_cast(ctx, rows, LOOM_TYPE_F32);
    return f ? loom_reshape_3d(ctx, f, D, Hk, n) : NULL;
}

/* x [E, T] -> [E, T], attention with the KV cache of layer il. */
static loom_tensor *attention(const loom_model *m, const loom_kv_cache *kv, loom_ctx *ctx,
                              loom_graph *gf, int il, loom_tensor *h, loom_tensor *pos,
                              loom_tensor *mask, loom_tensor *mask_swa, loom_tensor *pos_swa,
                              int64_t T, int64_t Tq, int64_t n_kv, int64_t n_kv_swa) {
    const loom_hparams *hp = &m->hp;
    const loom_layer *L = &m->layers[il];
    const int64_t D = hp->head_dim, H = hp->n_head, Hk = hp->n_head_kv;
    /* queries of the last Tq tokens only (Tq < T: the last layer when only the last token's
     * logits are wanted); keys and values of all T go into the cache */
    const int64_t q0 = T - Tq;
    loom_tensor *pos_q = Tq < T ? loom_view_1d(ctx, pos, Tq, (size_t)q0 * pos->nb[0]) : pos;
    loom_tensor *q, *k, *v;
    if (L->wqkv) {
        loom_tensor *qkv = add_bias(ctx, loom_mul_mat(ctx, L->wqkv, h), L->bqkv); /* [Dq+2Dkv, T] */
        if (!qkv) return NULL;
        size_t es = loom_element_size(qkv);
        q = loom_view_3d(ctx, qkv, D, H, Tq, D * es, qkv->nb[1], (size_t)q0 * qkv->nb[1]);
        k = loom_view_3d(ctx, qkv, D, Hk, T, D * es, qkv->nb[1], (size_t)(D * H) * es);
        v = loom_view_3d(ctx, qkv, D, Hk, T, D * es, qkv->nb[1], (size_t)(D * (H + Hk)) * es);
        q = loom_cont(ctx, q);
        k = loom_cont(ctx, k);
        v = loom_cont(ctx, v);
    } else {
        loom_tensor *hq = Tq < T ? loom_view_2d(ctx, h, h->ne[0], Tq, h->nb[1], (size_t)q0 * h->nb[1])
                                 : h;
        q = add_bias(ctx, loom_mul_mat(ctx, L->wq, hq), L->bq); /* [D*H, Tq] */
        k = add_bias(ctx, loom_mul_mat(ctx, L->wk, h), L->bk);  /* [D*Hk, T] */
        v = add_bias(ctx, loom_mul_mat(ctx, L->wv, h), L->bv);  /* [D*Hk, T] */
        /* the three projections first, so each gets its own buffer and the CPU runs them
         * in one phase (one barrier, not three: the allocator would give k the bytes q's
         * RoPE has just read) */
        if (!q || !k || !v || loom_graph_build_forward(gf, q) || loom_graph_build_forward(gf, k) ||
            loom_graph_build_forward(gf, v))
            return NULL;
        q = loom_reshape_3d(ctx, q, D, H, Tq);
        k = loom_reshape_3d(ctx, k, D, Hk, T);
    }
    if (L->attn_q_norm) q = loom_mul(ctx, loom_rms_norm(ctx, q, hp->rms_eps), L->attn_q_norm);
    if (L->attn_k_norm) k = loom_mul(ctx, loom_rms_norm(ctx, k, hp->rms_eps), L->attn_k_norm);
    const bool swa = hp->swa_layer[il];
    const float base = swa ? hp->rope_freq_base_swa : hp->rope_freq_base;
    /* YaRN's scale is inside its frequency factors */
    const float fscale = hp->rope_yarn ? 1.0f : swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
    /* phi3 longrope: the long factors once the cache is longer than the trained context */
    loom_tensor *rf = m->rope_freqs                                ? m->rope_freqs
                      : m->rope_long && kv->n_ctx > hp->n_ctx_orig ? m->rope_long
                                                                   : m->rope_short;
    q = loom_rope_ext(ctx, q, pos_q, rf, (int)hp->n_rot, hp->rope_type, base, fscale); /* [D, H, Tq] */
    k = loom_rope_ext(ctx, k, pos, rf, (int)hp->n_rot, hp->rope_type, base,
                      fscale); /* [D, Hk, T] */
    if (!q || !k || !v) return NULL;
    loom_format_name(q, "Qcur-%d", il);
    loom_format_name(k, "Kcur-%d", il);

    /* q, k and v first, then the two cache writes next to each other (so a cache in host
     * memory costs one split per layer), then the attention that reads the cache */
    if (loom_graph_build_forward(gf, q) || loom_graph_build_forward(gf, k) ||
        loom_graph_build_forward(gf, v))
        return NULL;
    /* a sliding layer's ring: position p in cell p % cells, the attention over its cells */
    loom_tensor *rows = swa && pos_swa ? pos_swa : pos;
    if (swa) n_kv = n_kv_swa;
    loom_tensor *ks = loom_set_rows(ctx, kv->k[il], loom_reshape_2d(ctx, k, D * Hk, T), rows);
    loom_tensor *vs = loom_set_rows(ctx, kv->v[il], loom_reshape_2d(ctx, v, D * Hk, T), rows);
    if (!ks || !vs) return NULL;
    if (loom_graph_build_forward(gf, ks) || loom_graph_build_forward(gf, vs)) return NULL;

    /* views of the first n_kv rows through the write nodes: [D, Hk, K]; K as [D, K, Hk] */
    loom_tensor *K = cache_view(ctx, ks, kv->k[il], D, Hk, n_kv, !m->no_flash_attn);
    loom_tensor *V = cache_view(ctx, vs, kv->v[il], D, Hk, n_kv, !m->no_flash_attn);
    if (!K || !V) return NULL;
    K = loom_permute(ctx, K, 0, 2, 1, 3);
    loom_tensor *Q = loom_permute(ctx, q, 0, 2, 1, 3); /* [D, T, H] */
    loom_tensor *a;
    const float scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)D);
    if (swa) mask = mask_swa;
    if (Tq < T) mask = loom_view_2d(ctx, mask, mask->ne[0], Tq, mask->nb[1], (size_t)q0 * mask->nb[1]);
    if (!mask) return NULL;
    if (!m->no_flash_attn) {
        a = loom_flash_attn_ext(ctx, Q, K, loom_permute(ctx, V, 0, 2, 1, 3), mask, L->attn_sinks,
                                scale, 0.0f, hp->attn_softcap); /* [D, H, T] */
    } else if (hp->attn_softcap > 0) {
        loom_error(LOOM_ERR_UNSUPPORTED,
                   "model: %s's attention logit softcapping needs flash attention", hp->arch);
        return NULL;
    } else {
        /* kq [K, T, H] (K heads broadcast over their query group), softmax with the mask,
         * then V^T [K, D, Hk] x kq -> [D, T, H] -> [D, H, T] */
        loom_tensor *kq = loom_mul_mat(ctx, K, Q);
        kq = loom_soft_max_ext(ctx, kq, mask, L->attn_sinks, scale, 0.0f);
        loom_tensor *Vt = loom_cont(ctx, loom_permute(ctx, V, 1, 2, 0, 3));
        loom_tensor *kqv = loom_mul_mat(ctx, Vt, kq);
        a = loom_cont(ctx, loom_permute(ctx, kqv, 0, 2, 1, 3));
    }
    a = loom_reshape_2d(ctx, a, D * H, Tq);
    if (!a) return NULL;
    loom_format_name(a, "kqv_out-%d", il);
    loom_tensor *o = add_bias(ctx, loom_mul_mat(ctx, L->wo, a), L->bo); /* [E, T] */
    if (o) loom_format_name(o, "attn_out-%d", il);
    return o;
}

/* sigmoid(x) for x [1, T], as softmax([x, 0])[0] = e^x / (e^x + 1) (no sigmoid op) */
static loom_tensor *sigmoid_row(loom_ctx *ctx, loom_tensor *x) {
    loom_tensor *s =
        loom_soft_max(ctx, loom_concat(ctx, x, loom_fill(ctx, x, 0.0f), 0)); /* [2, T] */
    return s ? loom_cont(ctx, loom_view_2d(ctx, s, 1, s->ne[1], s->nb[1], 0)) : NULL;
}

/* cap * tanh(x / cap) for x [V, T], with tanh(y) = 2 sigmoid(2y) - 1 and the sigmoid as
 * above, on x as [1, V, T] pairs */
static loom_tensor *softcap(loom_ctx *ctx, loom_tensor *x, float cap) {
    loom_tensor *y = loom_reshape_3d(ctx, loom_scale(ctx, x, 2.0f / cap), 1, x->ne[0], x->ne[1]);
    loom_tensor *s =
        loom_soft_max(ctx, loom_concat(ctx, y, loom_fill(ctx, y, 0.0f), 0)); /* [2, V, T] */
    if (!s) return NULL;
    s = loom_cont(ctx, loom_view_3d(ctx, s, 1, s->ne[1], s->ne[2], s->nb[1], s->nb[2], 0));
    return loom_reshape_2d(ctx, loom_scale_bias(ctx, s, 2.0f * cap, -cap), x->ne[0], x->ne[1]);
}

/* The gated FFN: down x (act_glu(gate x h, up x h) * scale), [E, T] -> [E, T]; scale
 * (optional) [1, T] is applied before the down projection, where the FFN dim is still
 * split, so a tensor-parallel FFN still ends in one partial sum */
static loom_tensor *dense_ffn(const loom_model *m, loom_ctx *ctx, loom_tensor *gate,
                              loom_tensor *up, loom_tensor *down, loom_tensor *h,
                              loom_tensor *scale) {
    loom_tensor *x;
    if (!gate) { /* fused: up x h = [gate; up] [2F, T] */
        x = loom_glu(ctx, loom_mul_mat(ctx, up, h), m->hp.ffn_glu, false);
    } else {
        loom_tensor *g = loom_mul_mat(ctx, gate, h); /* [F, T] */
        loom_tensor *u = loom_mul_mat(ctx, up, h);   /* [F, T] */
        x = loom_glu_split(ctx, g, u, m->hp.ffn_glu);
    }
    if (scale) x = loom_mul(ctx, x, scale);
    return loom_mul_mat(ctx, down, x); /* [E, T] */
}

/* h [E, T] -> [E, T] */
static loom_tensor *ffn(const loom_model *m, loom_ctx *ctx, int il, loom_tensor *h, int64_t T) {
    const loom_hparams *hp = &m->hp;
    const loom_layer *L = &m->layers[il];
    if (hp->n_expert == 0) {
        loom_tensor *d = dense_ffn(m, ctx, L->ffn_gate, L->ffn_up, L->ffn_down, h, NULL);
        if (d) loom_format_name(d, "ffn_out-%d", il);
        return d;
    }
    const int64_t E = hp->n_embd, X = hp->n_expert, U = hp->n_expert_used;
    loom_tensor *logits =
        add_bias(ctx, loom_mul_mat(ctx, L->ffn_gate_inp, h), L->ffn_gate_inp_b); /* [X, T] */
    /* gpt-oss: choose by logits, then softmax over the chosen */
    loom_tensor *probs =
        hp->moe_softmax_selected ? logits : loom_soft_max(ctx, logits); /* [X, T] */
    loom_tensor *sel = loom_top_k(ctx, probs, (int)U);                  /* I32 [U, T] */
    loom_tensor *w = loom_get_rows(ctx, loom_reshape_3d(ctx, probs, 1, X, T), sel); /* [1, U, T] */
    if (hp->moe_softmax_selected) {
        w = loom_reshape_3d(ctx, loom_soft_max(ctx, loom_reshape_2d(ctx, w, U, T)), 1, U, T);
    } else if (hp->norm_topk) {
        loom_tensor *ws = loom_sum_rows(ctx, loom_reshape_2d(ctx, w, U, T)); /* [1, T] */
        w = loom_div(ctx, loom_reshape_2d(ctx, w, U, T), ws);               /* [U, T] */
        w = loom_reshape_3d(ctx, w, 1, U, T);
    }
    loom_tensor *h3 = loom_reshape_3d(ctx, h, E, 1, T);
    loom_tensor *g = loom_mul_mat_id(ctx, L->ffn_gate_exps, h3, sel); /* [F, U, T] */
    if (L->ffn_gate_exps_b) g = loom_add_id(ctx, g, L->ffn_gate_exps_b, sel);
    loom_tensor *u = loom_mul_mat_id(ctx, L->ffn_up_exps, h3, sel);   /* [F, U, T] */
    if (L->ffn_up_exps_b) u = loom_add_id(ctx, u, L->ffn_up_exps_b, sel);
    loom_tensor *x;
    if (hp->swiglu_limit > 0) { /* clamped: min(g, l) sigmoid(a min(g, l)) (clamp(u, +-l) + 1) */
        const float a = hp->swiglu_alpha, l = hp->swiglu_limit;
        g = loom_clamp(ctx, g, -INFINITY, l);
        u = loom_clamp(ctx, u, -l, l);
        /* x sigmoid(a x) = silu(a x) / a */
        x = loom_scale(
            ctx, loom_swiglu_split(ctx, loom_scale(ctx, g, a), loom_scale_bias(ctx, u, 1.0f, 1.0f)),
            1.0f / a);
    } else {
        x = loom_swiglu_split(ctx, g, u); /* [F, U, T] */
    }
    loom_tensor *d = loom_mul_mat_id(ctx, L->ffn_down_exps, x, sel);  /* [E, U, T] */
    if (L->ffn_down_exps_b) d = loom_add_id(ctx, d, L->ffn_down_exps_b, sel);
    d = loom_mul(ctx, d, w);                                          /* [E, U, T] */
    if (!d) return NULL;
    /* sum over the U experts: views [E, T] of each slot, added in a chain */
    loom_tensor *sum = loom_view_2d(ctx, d, E, T, d->nb[2], 0);
    for (int64_t k = 1; k < U; k++)
        sum = loom_add(ctx, sum, loom_view_2d(ctx, d, E, T, d->nb[2], (size_t)k * d->nb[1]));
    if (U == 1) sum = loom_cont(ctx, sum);
    if (L->ffn_up_shexp) {
        loom_tensor *gate = L->ffn_gate_inp_shexp /* [E] x [E, T] -> [1, T] */
                                ? sigmoid_row(ctx, loom_mul_mat(ctx, L->ffn_gate_inp_shexp, h))
                                : NULL;
        loom_tensor *sh =
            dense_ffn(m, ctx, L->ffn_gate_shexp, L->ffn_up_shexp, L->ffn_down_shexp, h, gate);
        if (sh) loom_format_name(sh, "ffn_shexp-%d", il);
        sum = loom_add(ctx, sum, sh);
    }
    if (sum) loom_format_name(sum, "ffn_moe_out-%d", il);
    return sum;
}

int64_t loom__graph_n_kv(int64_t n_past, int64_t n_tokens, int64_t n_ctx) {
    const int64_t n_kv = (n_past + n_tokens + LOOM_KV_PAD - 1) / LOOM_KV_PAD * LOOM_KV_PAD;
    return n_kv < n_ctx ? n_kv : n_ctx;
}

loom_status loom_model_build_graph(const loom_model *m, const loom_kv_cache *kv, loom_ctx *ctx,
                                   int64_t n_tokens, int64_t n_past, bool all_logits,
                                   loom_batch_graph *out) {
    memset(out, 0, sizeof *out);
    const loom_hparams *hp = &m->hp;
    if (n_tokens <= 0 || n_past < 0 || n_past + n_tokens > kv->n_ctx)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "model: batch of %lld tokens at position %lld does not fit the context "
                          "of %lld",
                          (long long)n_tokens, (long long)n_past, (long long)kv->n_ctx);
    /* attend over the cache rounded up to a multiple of LOOM_KV_PAD positions (masked):
     * consecutive tokens then build identical graphs, so per-graph plans (the meta
     * device's subgraphs, CUDA graphs) are reused instead of rebuilt every token */
    const int64_t T = n_tokens;
    const int64_t n_kv = loom__graph_n_kv(n_past, n_tokens, kv->n_ctx);
    size_t graph_size = loom_model_graph_ctx_size(m) / loom_tensor_overhead();
    loom_graph *gf = loom_graph_new(ctx, graph_size);
    loom_tensor *tokens = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    loom_tensor *pos = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    bool any_swa = false, all_swa = true;
    for (int il = 0; il < hp->n_layer; il++) {
        any_swa |= hp->swa_layer[il];
        all_swa &= hp->swa_layer[il];
    }
    /* sliding layers in a ring of R cells: the batch and the window before it must fit */
    const int64_t R = kv->n_swa_cells;
    const bool ring = any_swa && R > 0 && R < kv->n_ctx;
    if (ring && hp->n_swa - 1 + T > R)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "model: a batch of %lld tokens does not fit the sliding-window cache "
                          "of %lld cells (window %lld): batches of at most %lld",
                          (long long)T, (long long)R, (long long)hp->n_swa,
                          (long long)(R - hp->n_swa + 1));
    const int64_t n_kv_swa = ring && n_kv > R ? R : n_kv;
    /* every layer sliding (phi3): the one mask is the windowed one */
    loom_tensor *mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, all_swa ? n_kv_swa : n_kv, T);
    loom_tensor *mask_swa = all_swa   ? mask
                            : any_swa ? loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n_kv_swa, T)
                                      : NULL;
    loom_tensor *pos_swa = ring ? loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T) : NULL;
    if (mask_swa) {
        loom_set_name(mask_swa, "kq_mask_swa");
        loom_set_input(mask_swa);
    }
    if (pos_swa) {
        loom_set_name(pos_swa, "inp_pos_swa");
        loom_set_input(pos_swa);
    }
    if (!gf || !tokens || !pos || !mask || (any_swa && !mask_swa) || (ring && !pos_swa))
        return loom_error(LOOM_ERR_NOMEM, "model: graph context too small: %s", loom_last_error());
    loom_set_name(tokens, "inp_tokens");
    loom_set_name(pos, "inp_pos");
    loom_set_name(mask, "kq_mask");
    loom_set_input(tokens);
    loom_set_input(pos);
    loom_set_input(mask);

    loom_tensor *x = loom_get_rows(ctx, m->tok_embd, tokens); /* [E, T] */
    if (x && hp->embd_scale > 0) x = loom_scale(ctx, x, hp->embd_scale);
    if (x) loom_set_name(x, "inp_embd");
    for (int il = 0; il < hp->n_layer && x; il++) {
        const loom_layer *L = &m->layers[il];
        /* only the last token's logits wanted: after the last layer's cache writes, only its
         * row goes on (attention query, output projection, residual, FFN), as in llama.cpp */
        const int64_t Tq = !all_logits && il == hp->n_layer - 1 ? 1 : T;
        loom_tensor *h = loom_mul(ctx, loom_rms_norm(ctx, x, hp->rms_eps), L->attn_norm);
        if (h) loom_format_name(h, "attn_norm-%d", il);
        loom_tensor *a = h ? attention(m, kv, ctx, gf, il, h, pos, mask, mask_swa, pos_swa, T, Tq,
                                       n_kv, n_kv_swa)
                           : NULL;
        if (a && L->attn_post_norm)
            a = loom_mul(ctx, loom_rms_norm(ctx, a, hp->rms_eps), L->attn_post_norm);
        if (x && Tq < T) x = loom_view_2d(ctx, x, x->ne[0], Tq, x->nb[1], (size_t)(T - Tq) * x->nb[1]);
        x = loom_add(ctx, x, a);
        if (x) loom_format_name(x, "ffn_inp-%d", il);
        h = loom_mul(ctx, loom_rms_norm(ctx, x, hp->rms_eps), L->ffn_norm);
        if (h) loom_format_name(h, "ffn_norm-%d", il);
        loom_tensor *f = h ? ffn(m, ctx, il, h, Tq) : NULL;
        if (f && L->ffn_post_norm)
            f = loom_mul(ctx, loom_rms_norm(ctx, f, hp->rms_eps), L->ffn_post_norm);
        x = loom_add(ctx, x, f);
        if (x) loom_format_name(x, "l_out-%d", il);
    }
    /* (no layers: the embedding rows themselves) */
    if (x && !all_logits && x->ne[1] > 1)
        x = loom_view_2d(ctx, x, hp->n_embd, 1, x->nb[1], (size_t)(x->ne[1] - 1) * x->nb[1]);
    x = loom_mul(ctx, loom_rms_norm(ctx, x, hp->rms_eps), m->output_norm);
    if (x) loom_set_name(x, "result_norm");
    loom_tensor *logits = loom_mul_mat(ctx, m->output, x); /* [V, T or 1] */
    if (logits && hp->final_softcap > 0) logits = softcap(ctx, logits, hp->final_softcap);
    if (!logits) return loom_error(loom_last_status() ? loom_last_status() : LOOM_ERR_INTERNAL,
                                   "model: building the graph failed: %s", loom_last_error());
    loom_set_name(logits, "result_output");
    loom_set_output(logits);
    loom_status st = loom_graph_build_forward(gf, logits);
    if (st) return loom_error(st, "model: %s", loom_last_error());
    name_unnamed(gf);
    *out = (loom_batch_graph){.graph = gf,
                              .tokens = tokens,
                              .pos = pos,
                              .mask = mask,
                              .mask_swa = mask_swa,
                              .n_swa = hp->n_swa,
                              .pos_swa = pos_swa,
                              .n_swa_cells = R,
                              .logits = logits,
                              .n_tokens = T,
                              .n_past = n_past,
                              .n_kv = n_kv};
    return LOOM_OK;
}

loom_status loom_batch_set_inputs(const loom_batch_graph *bg, const int32_t *tokens) {
    const int64_t T = bg->n_tokens, K = bg->n_kv;
    /* a generated token's inputs (one position, a mask row of up to 1024 cells) on the
     * stack: no allocation per token; larger batches allocate */
    int32_t pos_small[16];
    float mask_small[1024];
    const bool small = T <= 16 && T * K <= 1024;
    int32_t *pos = small ? pos_small : loom_malloc((size_t)T * sizeof *pos);
    float *mask = small ? mask_small : loom_malloc((size_t)(T * K) * sizeof *mask);
    if (!pos || !mask) {
        if (!small) {
            loom_free(pos);
            loom_free(mask);
        }
        return loom_error(LOOM_ERR_NOMEM, "model: out of memory for the inputs of %lld tokens", (long long)T);
    }
    for (int64_t t = 0; t < T; t++) {
        pos[t] = (int32_t)(bg->n_past + t);
        for (int64_t j = 0; j < K; j++) mask[t * K + j] = j <= bg->n_past + t ? 0.0f : -INFINITY;
    }
    loom_tensor_set(bg->tokens, tokens, 0, (size_t)T * sizeof(int32_t));
    loom_tensor_set(bg->pos, pos, 0, (size_t)T * sizeof(int32_t));
    if (bg->mask != bg->mask_swa)
        loom_tensor_set(bg->mask, mask, 0, (size_t)(T * K) * sizeof(float));
    if (bg->mask_swa) {
        /* also within the window: query position p sees cell j holding position q when
         * q <= p and p - q < n_swa. Without a ring cell j holds position j; in a ring of R
         * cells it holds the last position written to it, last - (last - j) mod R, where
         * last = n_past + T - 1 (negative: never written) */
        const int64_t Ks = bg->mask_swa->ne[0], R = bg->pos_swa ? bg->n_swa_cells : 0;
        const int64_t last = bg->n_past + T - 1;
        for (int64_t t = 0; t < T; t++) {
            const int64_t p = bg->n_past + t;
            for (int64_t j = 0; j < Ks; j++) {
                const int64_t q = R > 0 ? last - (last - j) % R : j;
                mask[t * Ks + j] = q >= 0 && q <= p && p - q < bg->n_swa ? 0.0f : -INFINITY;
            }
        }
        loom_tensor_set(bg->mask_swa, mask, 0, (size_t)(T * Ks) * sizeof(float));
    }
    if (bg->pos_swa) {
        for (int64_t t = 0; t < T; t++)
            pos[t] = (int32_t)((bg->n_past + t) % bg->n_swa_cells);
        loom_tensor_set(bg->pos_swa, pos, 0, (size_t)T * sizeof(int32_t));
    }
    if (!small) {
        loom_free(pos);
        loom_free(mask);
    }
    return LOOM_OK;
}
