/*
 * ops_attn.c: builders of the attention family: soft_max (scale, mask, ALiBi, sinks),
 * rope_ext (normal and neox) and flash_attn_ext (mask, sinks, GQA, softcap). Shapes and
 * types as docs/ops.md.
 */
#include <stdio.h>

#include "core/core-impl.h"

static bool loom__divides(int64_t x, int64_t y) {
    return y == 0 ? x == 0 : x % y == 0;
}

static bool loom__mask_type_ok(const char *op, const loom_tensor *mask) {
    if (mask->type == LOOM_TYPE_F32 || mask->type == LOOM_TYPE_F16) return true;
    loom_error(LOOM_ERR_TYPE, "%s: mask must be f32 or f16, not %s (mask '%s')", op,
               loom_type_name(mask->type), mask->name);
    return false;
}

loom_tensor *loom_soft_max(loom_ctx *ctx, loom_tensor *a) {
    return loom_soft_max_ext(ctx, a, NULL, NULL, 1.0f, 0.0f);
}

loom_tensor *loom_soft_max_ext(loom_ctx *ctx, loom_tensor *a, loom_tensor *mask, loom_tensor *sinks,
                               float scale, float max_bias) {
    const char *op = "soft_max";
    if (!loom__op_need(op, "a", a)) return NULL;
    if (!loom__op_need_type(op, "a", a, LOOM_TYPE_F32)) return NULL;
    if (!(max_bias >= 0.0f)) {
        loom_error(LOOM_ERR_INVALID_ARG, "soft_max: max_bias (%g) must be >= 0 (a '%s')",
                   (double)max_bias, a->name);
        return NULL;
    }
    char sa[96], sm[96];
    if (mask) {
        if (!loom__mask_type_ok(op, mask)) return NULL;
        if (mask->ne[0] != a->ne[0] || mask->ne[1] < a->ne[1] ||
            !loom__divides(a->ne[2], mask->ne[2]) || !loom__divides(a->ne[3], mask->ne[3])) {
            loom_error(LOOM_ERR_SHAPE,
                       "soft_max: mask %s does not fit a %s: need mask->ne[0] == a->ne[0], "
                       "mask->ne[1] >= a->ne[1], a->ne[2] %% mask->ne[2] == 0, a->ne[3] %% "
                       "mask->ne[3] == 0 (a '%s', mask '%s')",
                       loom__shape_str(mask, sm, sizeof sm), loom__shape_str(a, sa, sizeof sa),
                       a->name, mask->name);
            return NULL;
        }
    }
    if (sinks) {
        if (!loom__op_need_type(op, "sinks", sinks, LOOM_TYPE_F32)) return NULL;
        if (sinks->ne[0] != a->ne[2] || loom_nelements(sinks) != a->ne[2]) {
            loom_error(
                LOOM_ERR_SHAPE, "soft_max: sinks %s must be [a->ne[2] (%lld)] (a '%s', sinks '%s')",
                loom__shape_str(sinks, sm, sizeof sm), (long long)a->ne[2], a->name, sinks->name);
            return NULL;
        }
    }
    loom_tensor *srcs[3] = {a, mask, sinks};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, LOOM_OP_SOFT_MAX, 3, srcs);
    if (!t) return NULL;
    loom_set_op_params_f32(t, 0, scale);
    loom_set_op_params_f32(t, 1, max_bias);
    return t;
}

loom_tensor *loom_rope_ext(loom_ctx *ctx, loom_tensor *a, loom_tensor *pos,
                           loom_tensor *freq_factors, int n_dims, int mode, float freq_base,
                           float freq_scale) {
    const char *op = "rope";
    if (!loom__op_need(op, "a", a) || !loom__op_need(op, "pos", pos)) return NULL;
    if (!loom__op_need_type(op, "a", a, LOOM_TYPE_F32) ||
        !loom__op_need_type(op, "pos", pos, LOOM_TYPE_I32))
        return NULL;
    char s1[96], s2[96];
    if (a->ne[3] != 1) {
        loom_error(LOOM_ERR_SHAPE, "rope: a must be [D, H, T, 1], not %s (a '%s')",
                   loom__shape_str(a, s1, sizeof s1), a->name);
        return NULL;
    }
    if (pos->ne[0] != a->ne[2] || loom_nelements(pos) != a->ne[2]) {
        loom_error(LOOM_ERR_SHAPE, "rope: pos %s must be [a->ne[2] (%lld)] (a '%s', pos '%s')",
                   loom__shape_str(pos, s2, sizeof s2), (long long)a->ne[2], a->name, pos->name);
        return NULL;
    }
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0]) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "rope: n_dims (%d) must be even and in [2, a->ne[0] (%lld)] (a '%s')", n_dims,
                   (long long)a->ne[0], a->name);
        return NULL;
    }
    if (mode != LOOM_ROPE_TYPE_NORMAL && mode != LOOM_ROPE_TYPE_NEOX) {
        loom_error(LOOM_ERR_INVALID_ARG, "rope: mode %d is not NORMAL (0) or NEOX (2) (a '%s')",
                   mode, a->name);
        return NULL;
    }
    if (freq_factors) {
        if (!loom__op_need_type(op, "freq_factors", freq_factors, LOOM_TYPE_F32)) return NULL;
        if (freq_factors->ne[0] < n_dims / 2) {
            loom_error(LOOM_ERR_SHAPE,
                       "rope: freq_factors->ne[0] (%lld) < n_dims / 2 (%d) (freq_factors '%s')",
                       (long long)freq_factors->ne[0], n_dims / 2, freq_factors->name);
            return NULL;
        }
    }
    loom_tensor *srcs[3] = {a, pos, freq_factors};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, LOOM_OP_ROPE, 3, srcs);
    if (!t) return NULL;
    loom_set_op_params_i32(t, 0, n_dims);
    loom_set_op_params_i32(t, 1, mode);
    loom_set_op_params_f32(t, 2, freq_base);
    loom_set_op_params_f32(t, 3, freq_scale);
    return t;
}

/* K/V types: floats, and the block types a quantised KV cache holds (backends say which
 * they read: the CPU reads all of them) */
static bool fa_kv_type(loom_type t) {
    return t == LOOM_TYPE_F32 || t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16 || t == LOOM_TYPE_Q8_0 ||
           t == LOOM_TYPE_Q4_0 || t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_0 ||
           t == LOOM_TYPE_Q5_1 || t == LOOM_TYPE_IQ4_NL;
}

loom_tensor *loom_flash_attn_ext(loom_ctx *ctx, loom_tensor *q, loom_tensor *k, loom_tensor *v,
                                 loom_tensor *mask, loom_tensor *sinks, float scale, float max_bias,
                                 float softcap) {
    const char *op = "flash_attn_ext";
    if (!loom__op_need(op, "q", q) || !loom__op_need(op, "k", k) || !loom__op_need(op, "v", v))
        return NULL;
    if (!loom__op_need_type(op, "q", q, LOOM_TYPE_F32)) return NULL;
    if (!fa_kv_type(k->type) || !fa_kv_type(v->type)) {
        loom_error(LOOM_ERR_TYPE,
                   "flash_attn_ext: k and v must be f32, f16, bf16 or a KV cache block type "
                   "(q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), not %s and %s (k '%s', v '%s')",
                   loom_type_name(k->type), loom_type_name(v->type), k->name, v->name);
        return NULL;
    }
    if (k->ne[0] % loom_blck_size(k->type) || v->ne[0] % loom_blck_size(v->type)) {
        loom_error(LOOM_ERR_SHAPE,
                   "flash_attn_ext: a row of k (%s, %lld values) or v (%s, %lld values) is not "
                   "whole blocks (k '%s', v '%s')",
                   loom_type_name(k->type), (long long)k->ne[0], loom_type_name(v->type),
                   (long long)v->ne[0], k->name, v->name);
        return NULL;
    }
    if (!(max_bias >= 0.0f) || !(softcap >= 0.0f)) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "flash_attn_ext: max_bias (%g) and softcap (%g) must be >= 0 (q '%s')",
                   (double)max_bias, (double)softcap, q->name);
        return NULL;
    }
    char sq[96], sk[96], sv[96];
    if (k->ne[0] != q->ne[0] || v->ne[1] != k->ne[1] || v->ne[2] != k->ne[2] ||
        k->ne[3] != q->ne[3] || v->ne[3] != q->ne[3] || k->ne[2] == 0 || q->ne[2] % k->ne[2] != 0) {
        loom_error(LOOM_ERR_SHAPE,
                   "flash_attn_ext: want q [D, Nq, H, S], k [D, Nkv, Hkv, S], v [Dv, Nkv, Hkv, "
                   "S] with H %% Hkv == 0; got q %s, k %s, v %s (q '%s', k '%s', v '%s')",
                   loom__shape_str(q, sq, sizeof sq), loom__shape_str(k, sk, sizeof sk),
                   loom__shape_str(v, sv, sizeof sv), q->name, k->name, v->name);
        return NULL;
    }
    if (mask) {
        if (!loom__mask_type_ok(op, mask)) return NULL;
        if (mask->ne[0] != k->ne[1] || mask->ne[1] < q->ne[1] || mask->ne[2] != 1 ||
            mask->ne[3] != 1) {
            loom_error(LOOM_ERR_SHAPE,
                       "flash_attn_ext: mask %s must be [Nkv (%lld), >= Nq (%lld), 1, 1] "
                       "(mask '%s')",
                       loom__shape_str(mask, sv, sizeof sv), (long long)k->ne[1],
                       (long long)q->ne[1], mask->name);
            return NULL;
        }
    }
    if (sinks) {
        if (!loom__op_need_type(op, "sinks", sinks, LOOM_TYPE_F32)) return NULL;
        if (sinks->ne[0] != q->ne[2] || loom_nelements(sinks) != q->ne[2]) {
            loom_error(LOOM_ERR_SHAPE, "flash_attn_ext: sinks %s must be [H (%lld)] (sinks '%s')",
                       loom__shape_str(sinks, sv, sizeof sv), (long long)q->ne[2], sinks->name);
            return NULL;
        }
    }
    const int64_t ne[4] = {v->ne[0], q->ne[2], q->ne[1], q->ne[3]};
    loom_tensor *srcs[5] = {q, k, v, mask, sinks};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, ne, LOOM_OP_FLASH_ATTN_EXT, 5, srcs);
    if (!t) return NULL;
    loom_set_op_params_f32(t, 0, scale);
    loom_set_op_params_f32(t, 1, max_bias);
    loom_set_op_params_f32(t, 2, softcap);
    return t;
}
