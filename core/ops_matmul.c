/*
 * ops_matmul.c: builders of the weight-indexed ops: mul_mat (with batch broadcast),
 * mul_mat_id and add_id (experts selected by ids), get_rows and set_rows. Shapes and
 * types as docs/ops.md.
 */
#include <stdio.h>

#include "core/core-impl.h"

/* x is a multiple of y (y == 0 only divides 0). */
static bool loom__divides(int64_t x, int64_t y) {
    return y == 0 ? x == 0 : x % y == 0;
}

loom_tensor *loom_mul_mat(loom_ctx *ctx, loom_tensor *a, loom_tensor *b) {
    if (!loom__op_need("mul_mat", "a", a) || !loom__op_need("mul_mat", "b", b)) return NULL;
    if (!loom__op_need_float("mul_mat", "a", a) ||
        !loom__op_need_type("mul_mat", "b", b, LOOM_TYPE_F32))
        return NULL;
    if (a->ne[0] != b->ne[0]) {
        loom_error(LOOM_ERR_SHAPE, "mul_mat: a->ne[0] (%lld) != b->ne[0] (%lld) (a '%s', b '%s')",
                   (long long)a->ne[0], (long long)b->ne[0], a->name, b->name);
        return NULL;
    }
    for (int i = 2; i < 4; i++) {
        if (!loom__divides(b->ne[i], a->ne[i])) {
            loom_error(LOOM_ERR_SHAPE,
                       "mul_mat: b->ne[%d] (%lld) is not a multiple of a->ne[%d] (%lld) "
                       "(a '%s', b '%s')",
                       i, (long long)b->ne[i], i, (long long)a->ne[i], a->name, b->name);
            return NULL;
        }
    }
    const int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    loom_tensor *srcs[2] = {a, b};
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, ne, LOOM_OP_MUL_MAT, 2, srcs);
}

loom_tensor *loom_mul_mat_id(loom_ctx *ctx, loom_tensor *as, loom_tensor *b, loom_tensor *ids) {
    const char *op = "mul_mat_id";
    if (!loom__op_need(op, "as", as) || !loom__op_need(op, "b", b) ||
        !loom__op_need(op, "ids", ids))
        return NULL;
    if (!loom__op_need_float(op, "as", as) || !loom__op_need_type(op, "b", b, LOOM_TYPE_F32) ||
        !loom__op_need_type(op, "ids", ids, LOOM_TYPE_I32))
        return NULL;
    char s1[96], s2[96], s3[96];
    if (as->ne[3] != 1 || b->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1) {
        loom_error(LOOM_ERR_SHAPE,
                   "mul_mat_id: want as [K, M, E], b [K, U or 1, T], ids [U, T]; got as %s, b %s, "
                   "ids %s (as '%s', b '%s', ids '%s')",
                   loom__shape_str(as, s1, sizeof s1), loom__shape_str(b, s2, sizeof s2),
                   loom__shape_str(ids, s3, sizeof s3), as->name, b->name, ids->name);
        return NULL;
    }
    if (as->ne[0] != b->ne[0]) {
        loom_error(LOOM_ERR_SHAPE,
                   "mul_mat_id: as->ne[0] (%lld) != b->ne[0] (%lld) (as '%s', b '%s')",
                   (long long)as->ne[0], (long long)b->ne[0], as->name, b->name);
        return NULL;
    }
    if (b->ne[1] != ids->ne[0] && b->ne[1] != 1) {
        loom_error(LOOM_ERR_SHAPE,
                   "mul_mat_id: b->ne[1] (%lld) must be 1 or ids->ne[0] (%lld) (b '%s', ids '%s')",
                   (long long)b->ne[1], (long long)ids->ne[0], b->name, ids->name);
        return NULL;
    }
    if (b->ne[2] != ids->ne[1]) {
        loom_error(LOOM_ERR_SHAPE,
                   "mul_mat_id: b->ne[2] (%lld) != ids->ne[1] (%lld) (b '%s', ids '%s')",
                   (long long)b->ne[2], (long long)ids->ne[1], b->name, ids->name);
        return NULL;
    }
    const int64_t ne[4] = {as->ne[1], ids->ne[0], ids->ne[1], 1};
    loom_tensor *srcs[3] = {as, b, ids};
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, ne, LOOM_OP_MUL_MAT_ID, 3, srcs);
}

loom_tensor *loom_add_id(loom_ctx *ctx, loom_tensor *a, loom_tensor *b, loom_tensor *ids) {
    const char *op = "add_id";
    if (!loom__op_need(op, "a", a) || !loom__op_need(op, "b", b) || !loom__op_need(op, "ids", ids))
        return NULL;
    if (!loom__op_need_type(op, "a", a, LOOM_TYPE_F32) ||
        !loom__op_need_type(op, "b", b, LOOM_TYPE_F32) ||
        !loom__op_need_type(op, "ids", ids, LOOM_TYPE_I32))
        return NULL;
    char s1[96], s2[96], s3[96];
    if (a->ne[3] != 1 || b->ne[2] != 1 || b->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1 ||
        a->ne[0] != b->ne[0] || ids->ne[0] != a->ne[1] || ids->ne[1] != a->ne[2]) {
        loom_error(LOOM_ERR_SHAPE,
                   "add_id: want a [n, U, T], b [n, E], ids [U, T]; got a %s, b %s, ids %s "
                   "(a '%s', b '%s', ids '%s')",
                   loom__shape_str(a, s1, sizeof s1), loom__shape_str(b, s2, sizeof s2),
                   loom__shape_str(ids, s3, sizeof s3), a->name, b->name, ids->name);
        return NULL;
    }
    loom_tensor *srcs[3] = {a, b, ids};
    return loom__new_op_tensor(ctx, LOOM_TYPE_F32, a->ne, LOOM_OP_ADD_ID, 3, srcs);
}

loom_tensor *loom_get_rows(loom_ctx *ctx, loom_tensor *a, loom_tensor *ids) {
    const char *op = "get_rows";
    if (!loom__op_need(op, "a", a) || !loom__op_need(op, "ids", ids)) return NULL;
    if (a->type != LOOM_TYPE_I32 && !loom__op_need_float(op, "a", a)) return NULL;
    if (!loom__op_need_type(op, "ids", ids, LOOM_TYPE_I32)) return NULL;
    if (ids->ne[3] != 1) {
        char s[96];
        loom_error(LOOM_ERR_SHAPE, "get_rows: ids must be [X, B1, B2], not %s (ids '%s')",
                   loom__shape_str(ids, s, sizeof s), ids->name);
        return NULL;
    }
    if (!loom__divides(ids->ne[1], a->ne[2]) || !loom__divides(ids->ne[2], a->ne[3])) {
        char sa[96], si[96];
        loom_error(LOOM_ERR_SHAPE,
                   "get_rows: ids %s does not broadcast over a %s: need ids->ne[1] %% a->ne[2] "
                   "== 0 and ids->ne[2] %% a->ne[3] == 0 (a '%s', ids '%s')",
                   loom__shape_str(ids, si, sizeof si), loom__shape_str(a, sa, sizeof sa), a->name,
                   ids->name);
        return NULL;
    }
    const int64_t ne[4] = {a->ne[0], ids->ne[0], ids->ne[1], ids->ne[2]};
    loom_type type = a->type == LOOM_TYPE_I32 ? LOOM_TYPE_I32 : LOOM_TYPE_F32;
    loom_tensor *srcs[2] = {a, ids};
    return loom__new_op_tensor(ctx, type, ne, LOOM_OP_GET_ROWS, 2, srcs);
}

loom_tensor *loom_set_rows(loom_ctx *ctx, loom_tensor *dst, loom_tensor *b, loom_tensor *ids) {
    const char *op = "set_rows";
    if (!loom__op_need(op, "dst", dst) || !loom__op_need(op, "b", b) ||
        !loom__op_need(op, "ids", ids))
        return NULL;
    if (!loom__op_need_float(op, "dst", dst) || !loom__op_need_type(op, "b", b, LOOM_TYPE_F32))
        return NULL;
    if (ids->type != LOOM_TYPE_I32 && ids->type != LOOM_TYPE_I64) {
        loom_error(LOOM_ERR_TYPE, "set_rows: ids must be i32 or i64, not %s (ids '%s')",
                   loom_type_name(ids->type), ids->name);
        return NULL;
    }
    char sd[96], sb[96], si[96];
    if (dst->ne[0] != b->ne[0]) {
        loom_error(LOOM_ERR_SHAPE,
                   "set_rows: dst->ne[0] (%lld) != b->ne[0] (%lld) (dst '%s', b '%s')",
                   (long long)dst->ne[0], (long long)b->ne[0], dst->name, b->name);
        return NULL;
    }
    if (ids->ne[0] != b->ne[1] || ids->ne[1] != b->ne[2] || ids->ne[2] != b->ne[3] ||
        ids->ne[3] != 1) {
        loom_error(LOOM_ERR_SHAPE,
                   "set_rows: ids %s must be [X, B2, B3] for b %s (b '%s', ids '%s')",
                   loom__shape_str(ids, si, sizeof si), loom__shape_str(b, sb, sizeof sb), b->name,
                   ids->name);
        return NULL;
    }
    if (!loom__divides(dst->ne[2], b->ne[2]) || !loom__divides(dst->ne[3], b->ne[3])) {
        loom_error(LOOM_ERR_SHAPE,
                   "set_rows: b %s does not broadcast over dst %s: need dst->ne[2] %% b->ne[2] "
                   "== 0 and dst->ne[3] %% b->ne[3] == 0 (dst '%s', b '%s')",
                   loom__shape_str(b, sb, sizeof sb), loom__shape_str(dst, sd, sizeof sd),
                   dst->name, b->name);
        return NULL;
    }
    loom_tensor *t = loom__new_view(ctx, op, dst, dst->type, dst->ne, dst->nb, 0, LOOM_OP_SET_ROWS);
    if (!t) return NULL;
    t->src[0] = b;
    t->src[1] = ids;
    loom_format_name(t, "%s (view)", dst->name);
    return t;
}
