/*
 * ops_elementwise.c: builders of the per-element and per-row ops: binary arithmetic with
 * broadcast, scale, sqr/sqrt, unary activations and GLUs, clamp, fill, row reductions
 * (sum_rows, mean, argmax), norms, argsort/top_k and concat. Shapes and types as
 * docs/ops.md.
 */
#include <stdio.h>

#include "core/core-impl.h"

static loom_tensor *loom__unary_f32(loom_ctx *ctx, const char *opname, loom_tensor *a, loom_op op) {
    if (!loom__op_need(opname, "a", a)) return NULL;
    if (!loom__op_need_type(opname, "a", a, LOOM_TYPE_F32)) return NULL;
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, op, 1, &a);
}

static loom_tensor *loom__binary(loom_ctx *ctx, const char *opname, loom_tensor *a, loom_tensor *b,
                                 loom_op op) {
    if (!loom__op_need(opname, "a", a) || !loom__op_need(opname, "b", b)) return NULL;
    if (!loom__op_need_type(opname, "a", a, LOOM_TYPE_F32) ||
        !loom__op_need_type(opname, "b", b, LOOM_TYPE_F32))
        return NULL;
    if (!loom_can_repeat(b, a)) {
        char sa[96], sb[96];
        loom_error(LOOM_ERR_SHAPE, "%s: b %s cannot be broadcast to a %s (a '%s', b '%s')", opname,
                   loom__shape_str(b, sb, sizeof sb), loom__shape_str(a, sa, sizeof sa), a->name,
                   b->name);
        return NULL;
    }
    loom_tensor *srcs[2] = {a, b};
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, op, 2, srcs);
}

loom_tensor *loom_add(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    return loom__binary(ctx, "add", a, b, LOOM_OP_ADD);
}

loom_tensor *loom_sub(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    return loom__binary(ctx, "sub", a, b, LOOM_OP_SUB);
}

loom_tensor *loom_mul(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    return loom__binary(ctx, "mul", a, b, LOOM_OP_MUL);
}

loom_tensor *loom_div(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    return loom__binary(ctx, "div", a, b, LOOM_OP_DIV);
}

loom_tensor *loom_scale(loom_ctx *ctx, loom_tensor *a, float s) {
    return loom_scale_bias(ctx, a, s, 0.0f);
}

loom_tensor *loom_scale_bias(loom_ctx *ctx, loom_tensor *a, float s, float b) {
    loom_tensor *t = loom__unary_f32(ctx, "scale", a, LOOM_OP_SCALE);
    if (!t) return NULL;
    loom_set_op_params_f32(t, 0, s);
    loom_set_op_params_f32(t, 1, b);
    return t;
}

loom_tensor *loom_sqr(loom_ctx *ctx, loom_tensor *a) {
    return loom__unary_f32(ctx, "sqr", a, LOOM_OP_SQR);
}

loom_tensor *loom_sqrt(loom_ctx *ctx, loom_tensor *a) {
    return loom__unary_f32(ctx, "sqrt", a, LOOM_OP_SQRT);
}

loom_tensor *loom_unary(loom_ctx *ctx, loom_tensor *a, loom_unary_op op) {
    if (!loom__op_need("unary", "a", a)) return NULL;
    if ((int)op < 0 || op >= LOOM_UNARY_COUNT) {
        loom_error(LOOM_ERR_INVALID_ARG, "unary: %d is not a unary op (a '%s')", (int)op, a->name);
        return NULL;
    }
    loom_tensor *t = loom__unary_f32(ctx, "unary", a, LOOM_OP_UNARY);
    if (t) loom_set_op_params_i32(t, 0, (int32_t)op);
    return t;
}

loom_tensor *loom_silu(loom_ctx *ctx, loom_tensor *a) {
    return loom_unary(ctx, a, LOOM_UNARY_SILU);
}

loom_tensor *loom_gelu(loom_ctx *ctx, loom_tensor *a) {
    return loom_unary(ctx, a, LOOM_UNARY_GELU);
}

loom_tensor *loom_relu(loom_ctx *ctx, loom_tensor *a) {
    return loom_unary(ctx, a, LOOM_UNARY_RELU);
}

static bool loom__glu_op_ok(loom_glu_op op, const loom_tensor *a) {
    if ((int)op >= 0 && op < LOOM_GLU_COUNT) return true;
    loom_error(LOOM_ERR_INVALID_ARG, "glu: %d is not a glu op (a '%s')", (int)op, a->name);
    return false;
}

loom_tensor *loom_glu_split(loom_ctx *ctx, loom_tensor *a, loom_tensor *b, loom_glu_op op) {
    if (!loom__op_need("glu", "a", a) || !loom__op_need("glu", "b", b)) return NULL;
    if (!loom__glu_op_ok(op, a)) return NULL;
    if (!loom__op_need_type("glu", "a", a, LOOM_TYPE_F32) ||
        !loom__op_need_type("glu", "b", b, LOOM_TYPE_F32))
        return NULL;
    if (!loom_are_same_shape(a, b)) {
        char sa[96], sb[96];
        loom_error(LOOM_ERR_SHAPE, "glu: a %s and b %s differ in shape (a '%s', b '%s')",
                   loom__shape_str(a, sa, sizeof sa), loom__shape_str(b, sb, sizeof sb), a->name,
                   b->name);
        return NULL;
    }
    loom_tensor *srcs[2] = {a, b};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, LOOM_OP_GLU, 2, srcs);
    if (!t) return NULL;
    loom_set_op_params_i32(t, 0, (int32_t)op);
    loom_set_op_params_i32(t, 1, 0);
    return t;
}

loom_tensor *loom_glu(loom_ctx *ctx, loom_tensor *a, loom_glu_op op, bool swapped) {
    if (!loom__op_need("glu", "a", a)) return NULL;
    if (!loom__glu_op_ok(op, a)) return NULL;
    if (!loom__op_need_type("glu", "a", a, LOOM_TYPE_F32)) return NULL;
    if (a->ne[0] % 2 != 0) {
        loom_error(LOOM_ERR_SHAPE, "glu: fused a->ne[0] (%lld) must be even (a '%s')",
                   (long long)a->ne[0], a->name);
        return NULL;
    }
    const int64_t ne[4] = {a->ne[0] / 2, a->ne[1], a->ne[2], a->ne[3]};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, ne, LOOM_OP_GLU, 1, &a);
    if (!t) return NULL;
    loom_set_op_params_i32(t, 0, (int32_t)op);
    loom_set_op_params_i32(t, 1, swapped ? 1 : 0);
    return t;
}

loom_tensor *loom_swiglu_split(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    return loom_glu_split(ctx, a, b, LOOM_GLU_SWIGLU);
}

loom_tensor *loom_clamp(loom_ctx *ctx, loom_tensor *a, float min, float max) {
    if (!loom__op_need("clamp", "a", a)) return NULL;
    if (!(min <= max)) {
        loom_error(LOOM_ERR_INVALID_ARG, "clamp: min (%g) > max (%g) (a '%s')", (double)min,
                   (double)max, a->name);
        return NULL;
    }
    loom_tensor *t = loom__unary_f32(ctx, "clamp", a, LOOM_OP_CLAMP);
    if (!t) return NULL;
    loom_set_op_params_f32(t, 0, min);
    loom_set_op_params_f32(t, 1, max);
    return t;
}

loom_tensor *loom_fill(loom_ctx *ctx, loom_tensor *a, float value) {
    if (!loom__op_need("fill", "a", a)) return NULL;
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, LOOM_OP_FILL, 1, &a);
    if (t) loom_set_op_params_f32(t, 0, value);
    return t;
}

/* ---------------------------------------------------------------- rows */

static loom_tensor *loom__reduce_rows(loom_ctx *ctx, const char *opname, loom_tensor *a,
                                      loom_op op) {
    if (!loom__op_need(opname, "a", a)) return NULL;
    if (!loom__op_need_type(opname, "a", a, LOOM_TYPE_F32)) return NULL;
    const int64_t ne[4] = {1, a->ne[1], a->ne[2], a->ne[3]};
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, ne, op, 1, &a);
}

loom_tensor *loom_sum_rows(loom_ctx *ctx, loom_tensor *a) {
    return loom__reduce_rows(ctx, "sum_rows", a, LOOM_OP_SUM_ROWS);
}

loom_tensor *loom_mean(loom_ctx *ctx, loom_tensor *a) {
    return loom__reduce_rows(ctx, "mean", a, LOOM_OP_MEAN);
}

loom_tensor *loom_argmax(loom_ctx *ctx, loom_tensor *a) {
    if (!loom__op_need("argmax", "a", a)) return NULL;
    if (!loom__op_need_type("argmax", "a", a, LOOM_TYPE_F32)) return NULL;
    if (a->ne[2] != 1 || a->ne[3] != 1) {
        char s[96];
        loom_error(LOOM_ERR_SHAPE, "argmax: a must be 2-D [ne0, ne1], not %s (a '%s')",
                   loom__shape_str(a, s, sizeof s), a->name);
        return NULL;
    }
    if (a->ne[0] < 1) {
        loom_error(LOOM_ERR_SHAPE, "argmax: a has empty rows (a '%s')", a->name);
        return NULL;
    }
    const int64_t ne[4] = {a->ne[1], 1, 1, 1};
    return loom__new_op_tensor(ctx, LOOM_TYPE_I32, ne, LOOM_OP_ARGMAX, 1, &a);
}

static loom_tensor *loom__norm(loom_ctx *ctx, const char *opname, loom_tensor *a, float eps,
                               loom_op op) {
    if (!loom__op_need(opname, "a", a)) return NULL;
    if (!(eps >= 0.0f)) {
        loom_error(LOOM_ERR_INVALID_ARG, "%s: eps (%g) must be >= 0 (a '%s')", opname, (double)eps,
                   a->name);
        return NULL;
    }
    loom_tensor *t = loom__unary_f32(ctx, opname, a, op);
    if (t) loom_set_op_params_f32(t, 0, eps);
    return t;
}

loom_tensor *loom_norm(loom_ctx *ctx, loom_tensor *a, float eps) {
    return loom__norm(ctx, "norm", a, eps, LOOM_OP_NORM);
}

loom_tensor *loom_rms_norm(loom_ctx *ctx, loom_tensor *a, float eps) {
    return loom__norm(ctx, "rms_norm", a, eps, LOOM_OP_RMS_NORM);
}

loom_tensor *loom_argsort(loom_ctx *ctx, loom_tensor *a, loom_sort_order order) {
    if (!loom__op_need("argsort", "a", a)) return NULL;
    if (order != LOOM_SORT_ASC && order != LOOM_SORT_DESC) {
        loom_error(LOOM_ERR_INVALID_ARG, "argsort: %d is not a sort order (a '%s')", (int)order,
                   a->name);
        return NULL;
    }
    if (!loom__op_need_type("argsort", "a", a, LOOM_TYPE_F32)) return NULL;
    if (a->ne[0] > INT32_MAX) {
        loom_error(LOOM_ERR_SHAPE, "argsort: rows of %lld elements overflow i32 indices (a '%s')",
                   (long long)a->ne[0], a->name);
        return NULL;
    }
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_I32, a->ne, LOOM_OP_ARGSORT, 1, &a);
    if (t) loom_set_op_params_i32(t, 0, (int32_t)order);
    return t;
}

loom_tensor *loom_top_k(loom_ctx *ctx, loom_tensor *a, int k) {
    if (!loom__op_need("top_k", "a", a)) return NULL;
    if (!loom__op_need_type("top_k", "a", a, LOOM_TYPE_F32)) return NULL;
    if (k < 1 || k > a->ne[0]) {
        loom_error(LOOM_ERR_SHAPE, "top_k: k (%d) is not in [1, a->ne[0] (%lld)] (a '%s')", k,
                   (long long)a->ne[0], a->name);
        return NULL;
    }
    const int64_t ne[4] = {k, a->ne[1], a->ne[2], a->ne[3]};
    loom_tensor *t = loom__new_op_tensor(ctx, LOOM_TYPE_I32, ne, LOOM_OP_TOP_K, 1, &a);
    if (t) loom_set_op_params_i32(t, 0, k);
    return t;
}

loom_tensor *loom_concat(loom_ctx *ctx, loom_tensor *a, loom_tensor *b, int dim) {
    if (!loom__op_need("concat", "a", a) || !loom__op_need("concat", "b", b)) return NULL;
    if (dim < 0 || dim >= LOOM_MAX_DIMS) {
        loom_error(LOOM_ERR_INVALID_ARG, "concat: dim %d is not in [0, 3] (a '%s', b '%s')", dim,
                   a->name, b->name);
        return NULL;
    }
    if (a->type != b->type || (a->type != LOOM_TYPE_F32 && a->type != LOOM_TYPE_I32)) {
        loom_error(LOOM_ERR_TYPE,
                   "concat: a and b must both be f32 or both i32, not %s and %s (a '%s', b '%s')",
                   loom_type_name(a->type), loom_type_name(b->type), a->name, b->name);
        return NULL;
    }
    for (int i = 0; i < LOOM_MAX_DIMS; i++) {
        if (i != dim && a->ne[i] != b->ne[i]) {
            loom_error(LOOM_ERR_SHAPE,
                       "concat: a->ne[%d] (%lld) != b->ne[%d] (%lld) concatenating along dim %d "
                       "(a '%s', b '%s')",
                       i, (long long)a->ne[i], i, (long long)b->ne[i], dim, a->name, b->name);
            return NULL;
        }
    }
    int64_t ne[4] = {a->ne[0], a->ne[1], a->ne[2], a->ne[3]};
    ne[dim] += b->ne[dim];
    loom_tensor *srcs[2] = {a, b};
    loom_tensor *t = loom__new_op_tensor(ctx, a->type, ne, LOOM_OP_CONCAT, 2, srcs);
    if (t) loom_set_op_params_i32(t, 0, dim);
    return t;
}
