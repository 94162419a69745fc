/*
 * ops.c: op names, the checks every builder shares, and the data-movement builders:
 * dup/cpy/cont/cast and the view family (reshape, view, permute, transpose). Shapes and
 * types follow docs/ops.md; a view's view_src is always the storage owner.
 */
#include <stdio.h>

#include "core/core-impl.h"

static const char *const loom__op_names[LOOM_OP_COUNT] = {
    [LOOM_OP_NONE] = "NONE",
    [LOOM_OP_DUP] = "DUP",
    [LOOM_OP_CPY] = "CPY",
    [LOOM_OP_CONT] = "CONT",
    [LOOM_OP_ADD] = "ADD",
    [LOOM_OP_ADD_ID] = "ADD_ID",
    [LOOM_OP_SUB] = "SUB",
    [LOOM_OP_MUL] = "MUL",
    [LOOM_OP_DIV] = "DIV",
    [LOOM_OP_SCALE] = "SCALE",
    [LOOM_OP_SQR] = "SQR",
    [LOOM_OP_SQRT] = "SQRT",
    [LOOM_OP_SUM_ROWS] = "SUM_ROWS",
    [LOOM_OP_MEAN] = "MEAN",
    [LOOM_OP_ARGMAX] = "ARGMAX",
    [LOOM_OP_NORM] = "NORM",
    [LOOM_OP_RMS_NORM] = "RMS_NORM",
    [LOOM_OP_MUL_MAT] = "MUL_MAT",
    [LOOM_OP_MUL_MAT_ID] = "MUL_MAT_ID",
    [LOOM_OP_GET_ROWS] = "GET_ROWS",
    [LOOM_OP_SET_ROWS] = "SET_ROWS",
    [LOOM_OP_RESHAPE] = "RESHAPE",
    [LOOM_OP_VIEW] = "VIEW",
    [LOOM_OP_PERMUTE] = "PERMUTE",
    [LOOM_OP_TRANSPOSE] = "TRANSPOSE",
    [LOOM_OP_SOFT_MAX] = "SOFT_MAX",
    [LOOM_OP_ROPE] = "ROPE",
    [LOOM_OP_FLASH_ATTN_EXT] = "FLASH_ATTN_EXT",
    [LOOM_OP_CONCAT] = "CONCAT",
    [LOOM_OP_UNARY] = "UNARY",
    [LOOM_OP_GLU] = "GLU",
    [LOOM_OP_ARGSORT] = "ARGSORT",
    [LOOM_OP_TOP_K] = "TOP_K",
    [LOOM_OP_CLAMP] = "CLAMP",
    [LOOM_OP_FILL] = "FILL",
};

static const char *const loom__unary_names[LOOM_UNARY_COUNT] = {
    [LOOM_UNARY_SILU] = "SILU",
    [LOOM_UNARY_GELU] = "GELU",
    [LOOM_UNARY_RELU] = "RELU",
};

const char *loom_op_name(loom_op op) {
    if ((int)op < 0 || op >= LOOM_OP_COUNT || !loom__op_names[op]) return "(invalid op)";
    return loom__op_names[op];
}

const char *loom_unary_op_name(loom_unary_op op) {
    if ((int)op < 0 || op >= LOOM_UNARY_COUNT) return "(invalid unary op)";
    return loom__unary_names[op];
}

bool loom_op_is_view(loom_op op) {
    return op == LOOM_OP_NONE || op == LOOM_OP_RESHAPE || op == LOOM_OP_VIEW ||
           op == LOOM_OP_PERMUTE || op == LOOM_OP_TRANSPOSE;
}

/* ---------------------------------------------------------------- shared checks */

bool loom__op_need(const char *op, const char *what, const loom_tensor *t) {
    if (t) return true;
    if (loom_last_status() == LOOM_OK) loom_error(LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, what);
    return false;
}

bool loom__op_need_type(const char *op, const char *what, const loom_tensor *t, loom_type type) {
    if (t->type == type) return true;
    loom_error(LOOM_ERR_TYPE, "%s: %s must be %s, not %s (%s '%s')", op, what, loom_type_name(type),
               loom_type_name(t->type), what, t->name);
    return false;
}

bool loom__op_need_float(const char *op, const char *what, const loom_tensor *t) {
    /* f32/f16/bf16 and every block-quantised weight type (not the activation-only Q8_1
     * and Q8_K, not integers) */
    const loom_type_traits *tr = loom_type_traits_get((int)t->type);
    if (tr && tr->is_weight) return true;
    loom_error(LOOM_ERR_TYPE,
               "%s: %s must be f32/f16/bf16 or a quantised weight type, not %s (%s '%s')", op,
               what, tr ? tr->name : loom_gguf_type_str((int)t->type), what, t->name);
    return false;
}

loom_tensor *loom__new_view(loom_ctx *ctx, const char *opname, loom_tensor *a, loom_type type,
                            const int64_t ne[LOOM_MAX_DIMS], const size_t *nb, size_t offs,
                            loom_op op) {
    loom_tensor *owner = a->view_src ? a->view_src : a;
    size_t base = a->view_src ? a->view_offs : 0;
    /* the span of the view, computed on a scratch header before touching the arena */
    loom_tensor probe;
    memset(&probe, 0, sizeof probe);
    probe.type = type;
    for (int i = 0; i < LOOM_MAX_DIMS; i++) {
        if (ne[i] < 0) {
            loom_error(LOOM_ERR_SHAPE, "%s: ne[%d] = %lld is negative (a '%s')", opname, i,
                       (long long)ne[i], a->name);
            return NULL;
        }
        probe.ne[i] = ne[i];
    }
    if (ne[0] % loom_blck_size(type) != 0) {
        loom_error(LOOM_ERR_SHAPE, "%s: %s needs ne[0] (%lld) to be a multiple of %lld (a '%s')",
                   opname, loom_type_name(type), (long long)ne[0], (long long)loom_blck_size(type),
                   a->name);
        return NULL;
    }
    if (nb) {
        for (int i = 0; i < LOOM_MAX_DIMS; i++)
            probe.nb[i] = nb[i];
    } else {
        probe.nb[0] = loom_type_size(type);
        probe.nb[1] = probe.nb[0] * (size_t)(ne[0] / loom_blck_size(type));
        for (int i = 2; i < LOOM_MAX_DIMS; i++)
            probe.nb[i] = probe.nb[i - 1] * (size_t)ne[i - 1];
    }
    size_t span = loom_nbytes(&probe);
    size_t owner_bytes = loom_nbytes(owner);
    if (base + offs < base || base + offs > owner_bytes || span > owner_bytes - (base + offs)) {
        char s1[96], s2[96];
        loom_error(LOOM_ERR_SHAPE,
                   "%s: view %s at offset %zu spans %zu bytes, past the %zu bytes of '%s' %s "
                   "(a '%s')",
                   opname, loom__shape_str(&probe, s1, sizeof s1), base + offs, span, owner_bytes,
                   owner->name, loom__shape_str(owner, s2, sizeof s2), a->name);
        return NULL;
    }
    loom_tensor *t = loom__new_tensor_impl(ctx, type, LOOM_MAX_DIMS, ne, a, offs);
    if (!t) return NULL;
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        t->nb[i] = probe.nb[i];
    t->op = op;
    t->src[0] = a;
    return t;
}

/* ---------------------------------------------------------------- copies */

loom_tensor *loom_dup(loom_ctx *ctx, loom_tensor *a) {
    if (!loom__op_need("dup", "a", a)) return NULL;
    loom_tensor *t = loom__new_op_tensor(ctx, a->type, a->ne, LOOM_OP_DUP, 1, &a);
    if (t) loom_format_name(t, "%s (copy)", a->name);
    return t;
}

/* The conversions of docs/ops.md (CPY), and a copy between tensors of one type (raw
 * bytes, whole blocks), as the op table (backends/op-types.c) allows. */
static bool loom__cpy_supported(loom_type from, loom_type to) {
    if (from == to) return true;
    if (from == LOOM_TYPE_F32) /* the quantised targets are the KV-cache types */
        return to == LOOM_TYPE_F32 || to == LOOM_TYPE_F16 || to == LOOM_TYPE_BF16 ||
               to == LOOM_TYPE_Q8_0 || to == LOOM_TYPE_Q4_0 || to == LOOM_TYPE_Q4_1 ||
               to == LOOM_TYPE_Q5_0 || to == LOOM_TYPE_Q5_1 || to == LOOM_TYPE_IQ4_NL;
    if (to == LOOM_TYPE_F32) {
        const loom_type_traits *tr = loom_type_traits_get((int)from);
        return tr && tr->is_weight && from != LOOM_TYPE_F32;
    }
    return from == LOOM_TYPE_I32 && to == LOOM_TYPE_I32;
}

loom_tensor *loom_cpy(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    if (!loom__op_need("cpy", "a", a) || !loom__op_need("cpy", "b", b)) return NULL;
    if (loom_nelements(a) != loom_nelements(b)) {
        loom_error(LOOM_ERR_SHAPE,
                   "cpy: a has %lld elements but b has %lld (a '%s' [%lld, %lld, %lld, %lld], "
                   "b '%s' [%lld, %lld, %lld, %lld])",
                   (long long)loom_nelements(a), (long long)loom_nelements(b), a->name,
                   (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                   (long long)a->ne[3], b->name, (long long)b->ne[0], (long long)b->ne[1],
                   (long long)b->ne[2], (long long)b->ne[3]);
        return NULL;
    }
    if (!loom__cpy_supported(a->type, b->type)) {
        loom_error(LOOM_ERR_TYPE, "cpy: no conversion from %s to %s (a '%s', b '%s')",
                   loom_type_name(a->type), loom_type_name(b->type), a->name, b->name);
        return NULL;
    }
    loom_tensor *t = loom__new_view(ctx, "cpy", b, b->type, b->ne, b->nb, 0, LOOM_OP_CPY);
    if (!t) return NULL;
    t->src[0] = a;
    t->src[1] = b;
    if (b->name[0])
        loom_format_name(t, "%s (copy of %s)", b->name, a->name);
    else
        loom_format_name(t, "%s (copy)", a->name);
    return t;
}

loom_tensor *loom_cont(loom_ctx *ctx, loom_tensor *a) {
    if (!loom__op_need("cont", "a", a)) return NULL;
    return loom_cont_4d(ctx, a, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
}

loom_tensor *loom_cont_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                          int64_t ne3) {
    if (!loom__op_need("cont", "a", a)) return NULL;
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    for (int i = 0; i < 4; i++) {
        if (ne[i] < 0) {
            loom_error(LOOM_ERR_SHAPE, "cont: ne[%d] = %lld is negative (a '%s')", i,
                       (long long)ne[i], a->name);
            return NULL;
        }
    }
    int64_t n = 0;
    if (__builtin_mul_overflow(ne0, ne1, &n) || __builtin_mul_overflow(n, ne2, &n) ||
        __builtin_mul_overflow(n, ne3, &n) || n != loom_nelements(a)) {
        loom_error(LOOM_ERR_SHAPE,
                   "cont: [%lld, %lld, %lld, %lld] does not hold the %lld elements of a '%s'",
                   (long long)ne0, (long long)ne1, (long long)ne2, (long long)ne3,
                   (long long)loom_nelements(a), a->name);
        return NULL;
    }
    loom_tensor *t = loom__new_op_tensor(ctx, a->type, ne, LOOM_OP_CONT, 1, &a);
    if (t) loom_format_name(t, "%s (cont)", a->name);
    return t;
}

/* src[0] = a, src[1] = NULL: the CPY kernel converts src[0] into dst, dst's type. */
loom_tensor *loom_cast(loom_ctx *ctx, loom_tensor *a, loom_type type) {
    if (!loom__op_need("cast", "a", a)) return NULL;
    if (!loom_type_is_valid((int)type)) {
        loom_error(LOOM_ERR_TYPE, "cast: %d is not a loom type (a '%s')", (int)type, a->name);
        return NULL;
    }
    if (!loom__cpy_supported(a->type, type)) {
        loom_error(LOOM_ERR_TYPE, "cast: no conversion from %s to %s (a '%s')",
                   loom_type_name(a->type), loom_type_name(type), a->name);
        return NULL;
    }
    if (a->ne[0] % loom_blck_size(type) != 0) {
        loom_error(
            LOOM_ERR_SHAPE, "cast: %s needs a->ne[0] (%lld) to be a multiple of %lld (a '%s')",
            loom_type_name(type), (long long)a->ne[0], (long long)loom_blck_size(type), a->name);
        return NULL;
    }
    loom_tensor *t = loom__new_op_tensor(ctx, type, a->ne, LOOM_OP_CPY, 1, &a);
    if (t) loom_format_name(t, "%s (copy)", a->name);
    return t;
}

/* ---------------------------------------------------------------- views */

static loom_tensor *loom__reshape(loom_ctx *ctx, loom_tensor *a, const int64_t ne[4]) {
    if (!loom__op_need("reshape", "a", a)) return NULL;
    if (!loom_is_contiguous(a)) {
        char s[96];
        loom_error(LOOM_ERR_SHAPE, "reshape: a '%s' %s is not contiguous (use cont first)", a->name,
                   loom__shape_str(a, s, sizeof s));
        return NULL;
    }
    int64_t n = 0;
    for (int i = 0; i < 4; i++) {
        if (ne[i] < 0) {
            loom_error(LOOM_ERR_SHAPE, "reshape: ne[%d] = %lld is negative (a '%s')", i,
                       (long long)ne[i], a->name);
            return NULL;
        }
    }
    if (__builtin_mul_overflow(ne[0], ne[1], &n) || __builtin_mul_overflow(n, ne[2], &n) ||
        __builtin_mul_overflow(n, ne[3], &n) || n != loom_nelements(a)) {
        loom_error(LOOM_ERR_SHAPE,
                   "reshape: [%lld, %lld, %lld, %lld] does not hold the %lld elements of a '%s'",
                   (long long)ne[0], (long long)ne[1], (long long)ne[2], (long long)ne[3],
                   (long long)loom_nelements(a), a->name);
        return NULL;
    }
    loom_tensor *t = loom__new_view(ctx, "reshape", a, a->type, ne, NULL, 0, LOOM_OP_RESHAPE);
    if (t) loom_format_name(t, "%s (reshaped)", a->name);
    return t;
}

loom_tensor *loom_reshape(loom_ctx *ctx, loom_tensor *a, loom_tensor *like) {
    if (!loom__op_need("reshape", "a", a) || !loom__op_need("reshape", "like", like)) return NULL;
    return loom__reshape(ctx, a, like->ne);
}

loom_tensor *loom_reshape_1d(loom_ctx *ctx, loom_tensor *a, int64_t ne0) {
    const int64_t ne[4] = {ne0, 1, 1, 1};
    return loom__reshape(ctx, a, ne);
}

loom_tensor *loom_reshape_2d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1) {
    const int64_t ne[4] = {ne0, ne1, 1, 1};
    return loom__reshape(ctx, a, ne);
}

loom_tensor *loom_reshape_3d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    return loom__reshape(ctx, a, ne);
}

loom_tensor *loom_reshape_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return loom__reshape(ctx, a, ne);
}

static loom_tensor *loom__view(loom_ctx *ctx, loom_tensor *a, const int64_t ne[4], size_t nb1,
                               size_t nb2, size_t nb3, size_t offset) {
    if (!loom__op_need("view", "a", a)) return NULL;
    const size_t nb[4] = {loom_type_size(a->type), nb1, nb2, nb3};
    loom_tensor *t = loom__new_view(ctx, "view", a, a->type, ne, nb, offset, LOOM_OP_VIEW);
    if (t) loom_format_name(t, "%s (view)", a->name);
    return t;
}

loom_tensor *loom_view_1d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, size_t offset) {
    if (!loom__op_need("view", "a", a)) return NULL;
    const int64_t ne[4] = {ne0, 1, 1, 1};
    size_t nb1 = (size_t)(ne0 / loom_blck_size(a->type)) * loom_type_size(a->type);
    return loom__view(ctx, a, ne, nb1, nb1, nb1, offset);
}

loom_tensor *loom_view_2d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, size_t nb1,
                          size_t offset) {
    const int64_t ne[4] = {ne0, ne1, 1, 1};
    return loom__view(ctx, a, ne, nb1, nb1 * (size_t)(ne1 > 0 ? ne1 : 0),
                      nb1 * (size_t)(ne1 > 0 ? ne1 : 0), offset);
}

loom_tensor *loom_view_3d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                          size_t nb1, size_t nb2, size_t offset) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    return loom__view(ctx, a, ne, nb1, nb2, nb2 * (size_t)(ne2 > 0 ? ne2 : 0), offset);
}

loom_tensor *loom_view_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                          int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return loom__view(ctx, a, ne, nb1, nb2, nb3, offset);
}

loom_tensor *loom_permute(loom_ctx *ctx, loom_tensor *a, int axis0, int axis1, int axis2,
                          int axis3) {
    if (!loom__op_need("permute", "a", a)) return NULL;
    const int ax[4] = {axis0, axis1, axis2, axis3};
    bool seen[4] = {false, false, false, false};
    for (int i = 0; i < 4; i++) {
        if (ax[i] < 0 || ax[i] > 3 || seen[ax[i]]) {
            loom_error(LOOM_ERR_INVALID_ARG,
                       "permute: axes (%d, %d, %d, %d) are not a permutation of 0..3 (a '%s')",
                       axis0, axis1, axis2, axis3, a->name);
            return NULL;
        }
        seen[ax[i]] = true;
    }
    int64_t ne[4];
    size_t nb[4];
    for (int i = 0; i < 4; i++) {
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
    }
    loom_tensor *t = loom__new_view(ctx, "permute", a, a->type, ne, nb, 0, LOOM_OP_PERMUTE);
    if (!t) return NULL;
    for (int i = 0; i < 4; i++)
        t->op_params[i] = ax[i];
    loom_format_name(t, "%s (permuted)", a->name);
    return t;
}

loom_tensor *loom_transpose(loom_ctx *ctx, loom_tensor *a) {
    if (!loom__op_need("transpose", "a", a)) return NULL;
    const int64_t ne[4] = {a->ne[1], a->ne[0], a->ne[2], a->ne[3]};
    const size_t nb[4] = {a->nb[1], a->nb[0], a->nb[2], a->nb[3]};
    loom_tensor *t = loom__new_view(ctx, "transpose", a, a->type, ne, nb, 0, LOOM_OP_TRANSPOSE);
    if (!t) return NULL;
    t->op_params[0] = 1;
    t->op_params[1] = 0;
    t->op_params[2] = 2;
    t->op_params[3] = 3;
    loom_format_name(t, "%s (transposed)", a->name);
    return t;
}
