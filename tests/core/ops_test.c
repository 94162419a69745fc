/*
 * ops_test.c: every op builder's result (type, shape, op, sources, params, view-ness) as
 * docs/ops.md states it, and every error path: mismatched shapes, wrong types, bad
 * parameters, NULL sources (the earlier error kept) and a full context.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

#define CHECK_T(t, type_, n0, n1, n2, n3)                                                          \
    do {                                                                                           \
        const loom_tensor *t_ = (t);                                                               \
        LOOM_CHECK_MSG(t_ != NULL, "NULL result: %s", loom_last_error());                          \
        if (t_) {                                                                                  \
            LOOM_CHECK_EQ_INT(t_->type, type_);                                                    \
            LOOM_CHECK_EQ_INT(t_->ne[0], n0);                                                      \
            LOOM_CHECK_EQ_INT(t_->ne[1], n1);                                                      \
            LOOM_CHECK_EQ_INT(t_->ne[2], n2);                                                      \
            LOOM_CHECK_EQ_INT(t_->ne[3], n3);                                                      \
        }                                                                                          \
    } while (0)

/* expr must fail with status and a message containing each needle */
#define EXPECT_FAIL(expr, status, ...)                                                             \
    do {                                                                                           \
        loom_clear_error();                                                                        \
        LOOM_CHECK((expr) == NULL);                                                                \
        LOOM_CHECK_EQ_INT(loom_last_status(), status);                                             \
        const char *needles_[] = {__VA_ARGS__};                                                    \
        for (size_t k_ = 0; k_ < sizeof needles_ / sizeof needles_[0]; k_++)                       \
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), needles_[k_]);                              \
    } while (0)

static loom_ctx *ctx_new(void) {
    return loom_ctx_new((loom_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
}

static loom_tensor *named(loom_tensor *t, const char *name) {
    if (t) loom_set_name(t, name);
    return t;
}

static loom_tensor *t4(loom_ctx *ctx, loom_type type, int64_t n0, int64_t n1, int64_t n2,
                       int64_t n3, const char *name) {
    return named(loom_new_tensor_4d(ctx, type, n0, n1, n2, n3), name);
}

static float pf(const loom_tensor *t, int i) {
    return loom_get_op_params_f32(t, i);
}

LOOM_TEST(ops, copies) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F16, 8, 3, 2, 1, "a");
    loom_tensor *b = t4(ctx, LOOM_TYPE_F32, 4, 12, 1, 1, "b");
    loom_tensor *q = t4(ctx, LOOM_TYPE_Q8_0, 64, 3, 1, 1, "q");
    LOOM_REQUIRE(a && b && q);

    loom_tensor *d = loom_dup(ctx, a);
    CHECK_T(d, LOOM_TYPE_F16, 8, 3, 2, 1);
    LOOM_CHECK(d->op == LOOM_OP_DUP && d->src[0] == a && d->view_src == NULL);
    LOOM_CHECK(strcmp(d->name, "a (copy)") == 0);

    /* cpy: a view of b, converting */
    loom_tensor *c = loom_cpy(ctx, a, b);
    CHECK_T(c, LOOM_TYPE_F32, 4, 12, 1, 1);
    LOOM_CHECK(c->op == LOOM_OP_CPY && c->src[0] == a && c->src[1] == b && c->view_src == b);
    LOOM_CHECK(loom_are_same_layout(c, b));
    LOOM_CHECK(strcmp(c->name, "b (copy of a)") == 0);
    LOOM_CHECK(loom_cpy(ctx, b, q) == NULL); /* 48 != 192 elements */
    loom_tensor *bq = t4(ctx, LOOM_TYPE_F32, 32, 6, 1, 1, "bq");
    CHECK_T(loom_cpy(ctx, bq, q), LOOM_TYPE_Q8_0, 64, 3, 1, 1);
    CHECK_T(loom_cpy(ctx, q, bq), LOOM_TYPE_F32, 32, 6, 1, 1);
    /* same-type copies (the op table allows them): f16, bf16, block types */
    CHECK_T(loom_cpy(ctx, a, t4(ctx, LOOM_TYPE_F16, 48, 1, 1, 1, "h")), LOOM_TYPE_F16, 48, 1, 1, 1);
    CHECK_T(loom_cpy(ctx, t4(ctx, LOOM_TYPE_BF16, 48, 1, 1, 1, "x"),
                     t4(ctx, LOOM_TYPE_BF16, 6, 8, 1, 1, "y")),
            LOOM_TYPE_BF16, 6, 8, 1, 1);
    CHECK_T(loom_cpy(ctx, q, t4(ctx, LOOM_TYPE_Q8_0, 32, 6, 1, 1, "q2")), LOOM_TYPE_Q8_0, 32, 6, 1,
            1);
    CHECK_T(loom_cpy(ctx, t4(ctx, LOOM_TYPE_Q4_K, 256, 2, 1, 1, "k"),
                     t4(ctx, LOOM_TYPE_Q4_K, 512, 1, 1, 1, "k2")),
            LOOM_TYPE_Q4_K, 512, 1, 1, 1);
    EXPECT_FAIL(loom_cpy(ctx, t4(ctx, LOOM_TYPE_F16, 256, 1, 1, 1, "hk"),
                         t4(ctx, LOOM_TYPE_Q4_K, 256, 1, 1, 1, "kq")),
                LOOM_ERR_TYPE, "cpy: no conversion from f16 to q4_K", "'hk'", "'kq'");
    EXPECT_FAIL(loom_cpy(ctx, t4(ctx, LOOM_TYPE_I32, 48, 1, 1, 1, "i"), b), LOOM_ERR_TYPE,
                "cpy: no conversion from i32 to f32");
    CHECK_T(loom_cpy(ctx, t4(ctx, LOOM_TYPE_I32, 48, 1, 1, 1, "i"),
                     t4(ctx, LOOM_TYPE_I32, 6, 8, 1, 1, "j")),
            LOOM_TYPE_I32, 6, 8, 1, 1);
    EXPECT_FAIL(loom_cpy(ctx, a, t4(ctx, LOOM_TYPE_F32, 47, 1, 1, 1, "c")), LOOM_ERR_SHAPE,
                "cpy: a has 48 elements but b has 47");

    /* cont of a non-contiguous view */
    loom_tensor *tr = loom_transpose(ctx, b);
    loom_tensor *ct = loom_cont(ctx, tr);
    CHECK_T(ct, LOOM_TYPE_F32, 12, 4, 1, 1);
    LOOM_CHECK(ct->op == LOOM_OP_CONT && ct->src[0] == tr && loom_is_contiguous(ct));
    LOOM_CHECK(strcmp(ct->name, "b (transposed) (cont)") == 0);
    CHECK_T(loom_cont_4d(ctx, tr, 2, 2, 3, 4), LOOM_TYPE_F32, 2, 2, 3, 4);
    EXPECT_FAIL(loom_cont_4d(ctx, tr, 2, 2, 3, 5), LOOM_ERR_SHAPE,
                "cont: [2, 2, 3, 5] does not hold the 48 elements");
    EXPECT_FAIL(loom_cont_4d(ctx, q, 1, 192, 1, 1), LOOM_ERR_SHAPE, "multiple of 32");

    /* cast: CPY into a new contiguous tensor */
    loom_tensor *k = loom_cast(ctx, b, LOOM_TYPE_BF16);
    CHECK_T(k, LOOM_TYPE_BF16, 4, 12, 1, 1);
    LOOM_CHECK(k->op == LOOM_OP_CPY && k->src[0] == b && k->src[1] == NULL && !k->view_src);
    EXPECT_FAIL(loom_cast(ctx, b, LOOM_TYPE_Q4_0), LOOM_ERR_SHAPE, "multiple of 32");
    EXPECT_FAIL(loom_cast(ctx, b, LOOM_TYPE_I32), LOOM_ERR_TYPE, "no conversion from f32 to i32");
    EXPECT_FAIL(loom_cast(ctx, b, (loom_type)77), LOOM_ERR_TYPE, "77 is not a loom type");
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, binary_broadcast) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 6, 4, 3, 2, "x");
    loom_tensor *row = t4(ctx, LOOM_TYPE_F32, 6, 1, 1, 1, "row");
    loom_tensor *mid = t4(ctx, LOOM_TYPE_F32, 3, 2, 3, 1, "mid");
    loom_tensor *bad = t4(ctx, LOOM_TYPE_F32, 4, 4, 3, 2, "bad");
    loom_tensor *h = t4(ctx, LOOM_TYPE_F16, 6, 1, 1, 1, "h");
    LOOM_REQUIRE(a && row && mid && bad && h);
    loom_tensor *(*fns[4])(loom_ctx *, loom_tensor *, loom_tensor *) = {loom_add, loom_sub,
                                                                        loom_mul, loom_div};
    const loom_op ops[4] = {LOOM_OP_ADD, LOOM_OP_SUB, LOOM_OP_MUL, LOOM_OP_DIV};
    const char *names[4] = {"add:", "sub:", "mul:", "div:"};
    for (int i = 0; i < 4; i++) {
        loom_tensor *r = fns[i](ctx, a, row);
        CHECK_T(r, LOOM_TYPE_F32, 6, 4, 3, 2);
        LOOM_CHECK(r->op == ops[i] && r->src[0] == a && r->src[1] == row);
        CHECK_T(fns[i](ctx, a, mid), LOOM_TYPE_F32, 6, 4, 3, 2);
        CHECK_T(fns[i](ctx, a, a), LOOM_TYPE_F32, 6, 4, 3, 2);
        EXPECT_FAIL(fns[i](ctx, a, bad), LOOM_ERR_SHAPE, names[i],
                    "b [4, 4, 3, 2] cannot be broadcast to a [6, 4, 3, 2]", "'x'", "'bad'");
        EXPECT_FAIL(fns[i](ctx, row, a), LOOM_ERR_SHAPE, names[i], "cannot be broadcast");
        EXPECT_FAIL(fns[i](ctx, a, h), LOOM_ERR_TYPE, names[i], "b must be f32, not f16", "'h'");
        EXPECT_FAIL(fns[i](ctx, h, h), LOOM_ERR_TYPE, "a must be f32, not f16");
    }
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, unary_family) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 10, 3, 2, 1, "a");
    loom_tensor *i = t4(ctx, LOOM_TYPE_I32, 10, 3, 2, 1, "i");
    LOOM_REQUIRE(a && i);
    loom_tensor *s = loom_scale(ctx, a, 0.5f);
    CHECK_T(s, LOOM_TYPE_F32, 10, 3, 2, 1);
    LOOM_CHECK(s->op == LOOM_OP_SCALE && pf(s, 0) == 0.5f && pf(s, 1) == 0.0f);
    s = loom_scale_bias(ctx, a, 2.0f, -1.0f);
    LOOM_REQUIRE(s != NULL);
    LOOM_CHECK(pf(s, 0) == 2.0f && pf(s, 1) == -1.0f);
    LOOM_CHECK(loom_sqr(ctx, a)->op == LOOM_OP_SQR);
    LOOM_CHECK(loom_sqrt(ctx, a)->op == LOOM_OP_SQRT);
    const loom_unary_op uops[3] = {LOOM_UNARY_SILU, LOOM_UNARY_GELU, LOOM_UNARY_RELU};
    loom_tensor *(*ufns[3])(loom_ctx *, loom_tensor *) = {loom_silu, loom_gelu, loom_relu};
    for (int k = 0; k < 3; k++) {
        loom_tensor *u = ufns[k](ctx, a);
        CHECK_T(u, LOOM_TYPE_F32, 10, 3, 2, 1);
        LOOM_CHECK(u->op == LOOM_OP_UNARY && loom_get_op_params_i32(u, 0) == (int32_t)uops[k]);
        LOOM_CHECK(loom_unary(ctx, a, uops[k])->op_params[0] == (int32_t)uops[k]);
    }
    EXPECT_FAIL(loom_unary(ctx, a, LOOM_UNARY_COUNT), LOOM_ERR_INVALID_ARG,
                "unary: 3 is not a unary op");
    EXPECT_FAIL(loom_silu(ctx, i), LOOM_ERR_TYPE, "unary: a must be f32, not i32");
    EXPECT_FAIL(loom_scale(ctx, i, 1), LOOM_ERR_TYPE, "scale:");
    EXPECT_FAIL(loom_sqr(ctx, i), LOOM_ERR_TYPE, "sqr:");
    EXPECT_FAIL(loom_sqrt(ctx, i), LOOM_ERR_TYPE, "sqrt:");

    loom_tensor *c = loom_clamp(ctx, a, -1.0f, 2.0f);
    LOOM_REQUIRE(c != NULL);
    LOOM_CHECK(c->op == LOOM_OP_CLAMP && pf(c, 0) == -1.0f && pf(c, 1) == 2.0f);
    EXPECT_FAIL(loom_clamp(ctx, a, 3.0f, 2.0f), LOOM_ERR_INVALID_ARG, "clamp: min (3) > max (2)");
    EXPECT_FAIL(loom_clamp(ctx, a, NAN, 2.0f), LOOM_ERR_INVALID_ARG, "clamp:");
    EXPECT_FAIL(loom_clamp(ctx, i, 0, 1), LOOM_ERR_TYPE, "clamp:");

    loom_tensor *f = loom_fill(ctx, i, 7.5f); /* any type: only the shape is used */
    CHECK_T(f, LOOM_TYPE_F32, 10, 3, 2, 1);
    LOOM_CHECK(f->op == LOOM_OP_FILL && f->src[0] == i && pf(f, 0) == 7.5f);

    /* glu */
    loom_tensor *b = t4(ctx, LOOM_TYPE_F32, 10, 3, 2, 1, "b");
    loom_tensor *g = loom_glu_split(ctx, a, b, LOOM_GLU_GEGLU);
    CHECK_T(g, LOOM_TYPE_F32, 10, 3, 2, 1);
    LOOM_CHECK(g->op == LOOM_OP_GLU && g->src[0] == a && g->src[1] == b);
    LOOM_CHECK(g->op_params[0] == LOOM_GLU_GEGLU && g->op_params[1] == 0);
    g = loom_swiglu_split(ctx, a, b);
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK(g->op_params[0] == LOOM_GLU_SWIGLU);
    g = loom_glu(ctx, a, LOOM_GLU_SWIGLU, true);
    CHECK_T(g, LOOM_TYPE_F32, 5, 3, 2, 1);
    LOOM_CHECK(g->src[0] == a && g->src[1] == NULL && g->op_params[1] == 1);
    EXPECT_FAIL(loom_glu_split(ctx, a, t4(ctx, LOOM_TYPE_F32, 10, 3, 1, 1, "g"), LOOM_GLU_SWIGLU),
                LOOM_ERR_SHAPE, "glu: a [10, 3, 2, 1] and b [10, 3, 1, 1] differ in shape");
    EXPECT_FAIL(loom_glu(ctx, t4(ctx, LOOM_TYPE_F32, 9, 1, 1, 1, "odd"), LOOM_GLU_SWIGLU, false),
                LOOM_ERR_SHAPE, "glu: fused a->ne[0] (9) must be even", "'odd'");
    EXPECT_FAIL(loom_glu(ctx, a, LOOM_GLU_COUNT, false), LOOM_ERR_INVALID_ARG, "not a glu op");
    EXPECT_FAIL(loom_glu_split(ctx, a, i, LOOM_GLU_SWIGLU), LOOM_ERR_TYPE, "b must be f32");
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, rows_and_norms) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 7, 5, 3, 2, "a");
    loom_tensor *m = t4(ctx, LOOM_TYPE_F32, 7, 5, 1, 1, "m");
    loom_tensor *h = t4(ctx, LOOM_TYPE_F16, 7, 5, 1, 1, "h");
    LOOM_REQUIRE(a && m && h);
    loom_tensor *r = loom_sum_rows(ctx, a);
    CHECK_T(r, LOOM_TYPE_F32, 1, 5, 3, 2);
    LOOM_CHECK(r->op == LOOM_OP_SUM_ROWS);
    r = loom_mean(ctx, a);
    CHECK_T(r, LOOM_TYPE_F32, 1, 5, 3, 2);
    LOOM_CHECK(r->op == LOOM_OP_MEAN);
    r = loom_argmax(ctx, m);
    CHECK_T(r, LOOM_TYPE_I32, 5, 1, 1, 1);
    LOOM_CHECK(r->op == LOOM_OP_ARGMAX);
    EXPECT_FAIL(loom_argmax(ctx, a), LOOM_ERR_SHAPE, "argmax: a must be 2-D", "[7, 5, 3, 2]");
    EXPECT_FAIL(loom_argmax(ctx, h), LOOM_ERR_TYPE, "argmax: a must be f32");
    EXPECT_FAIL(loom_sum_rows(ctx, h), LOOM_ERR_TYPE, "sum_rows:");
    EXPECT_FAIL(loom_mean(ctx, h), LOOM_ERR_TYPE, "mean:");
    r = loom_norm(ctx, a, 1e-5f);
    CHECK_T(r, LOOM_TYPE_F32, 7, 5, 3, 2);
    LOOM_CHECK(r->op == LOOM_OP_NORM && pf(r, 0) == 1e-5f);
    r = loom_rms_norm(ctx, a, 1e-6f);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(r->op == LOOM_OP_RMS_NORM && pf(r, 0) == 1e-6f);
    EXPECT_FAIL(loom_rms_norm(ctx, a, -1.0f), LOOM_ERR_INVALID_ARG, "rms_norm: eps (-1)");
    EXPECT_FAIL(loom_norm(ctx, h, 0.0f), LOOM_ERR_TYPE, "norm:");

    r = loom_argsort(ctx, a, LOOM_SORT_DESC);
    CHECK_T(r, LOOM_TYPE_I32, 7, 5, 3, 2);
    LOOM_CHECK(r->op == LOOM_OP_ARGSORT && r->op_params[0] == LOOM_SORT_DESC);
    EXPECT_FAIL(loom_argsort(ctx, a, (loom_sort_order)2), LOOM_ERR_INVALID_ARG, "argsort:");
    EXPECT_FAIL(loom_argsort(ctx, h, LOOM_SORT_ASC), LOOM_ERR_TYPE, "argsort:");
    r = loom_top_k(ctx, a, 3);
    CHECK_T(r, LOOM_TYPE_I32, 3, 5, 3, 2);
    LOOM_CHECK(r->op == LOOM_OP_TOP_K && r->op_params[0] == 3);
    CHECK_T(loom_top_k(ctx, a, 7), LOOM_TYPE_I32, 7, 5, 3, 2);
    EXPECT_FAIL(loom_top_k(ctx, a, 8), LOOM_ERR_SHAPE, "top_k: k (8) is not in [1, a->ne[0] (7)]");
    EXPECT_FAIL(loom_top_k(ctx, a, 0), LOOM_ERR_SHAPE, "top_k: k (0)");

    /* concat along each dim */
    for (int dim = 0; dim < 4; dim++) {
        int64_t ne[4] = {7, 5, 3, 2};
        ne[dim] = 4;
        loom_tensor *b = t4(ctx, LOOM_TYPE_F32, ne[0], ne[1], ne[2], ne[3], "b");
        loom_tensor *c = loom_concat(ctx, a, b, dim);
        int64_t want[4] = {7, 5, 3, 2};
        want[dim] += 4;
        CHECK_T(c, LOOM_TYPE_F32, want[0], want[1], want[2], want[3]);
        LOOM_CHECK(c && c->op == LOOM_OP_CONCAT && c->op_params[0] == dim && c->src[1] == b);
        if (dim != 0)
            EXPECT_FAIL(loom_concat(ctx, a, b, 0), LOOM_ERR_SHAPE, "concat: a->ne[",
                        "concatenating along dim 0");
    }
    EXPECT_FAIL(loom_concat(ctx, a, a, 4), LOOM_ERR_INVALID_ARG, "concat: dim 4");
    EXPECT_FAIL(loom_concat(ctx, m, h, 1), LOOM_ERR_TYPE, "concat: a and b must both be f32");
    loom_tensor *i1 = t4(ctx, LOOM_TYPE_I32, 2, 2, 1, 1, "i1");
    CHECK_T(loom_concat(ctx, i1, i1, 1), LOOM_TYPE_I32, 2, 4, 1, 1);
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, mul_mat) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    const loom_type wtypes[5] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                                 LOOM_TYPE_Q4_0};
    loom_tensor *x = t4(ctx, LOOM_TYPE_F32, 64, 5, 6, 4, "x");
    for (int i = 0; i < 5; i++) {
        loom_tensor *w = t4(ctx, wtypes[i], 64, 16, 3, 2, "wq");
        loom_tensor *r = loom_mul_mat(ctx, w, x);
        CHECK_T(r, LOOM_TYPE_F32, 16, 5, 6, 4);
        LOOM_CHECK(r && r->op == LOOM_OP_MUL_MAT && r->src[0] == w && r->src[1] == x);
    }
    loom_tensor *w = t4(ctx, LOOM_TYPE_F16, 64, 16, 1, 1, "wq");
    loom_tensor *x63 = t4(ctx, LOOM_TYPE_F32, 63, 2, 1, 1, "x");
    EXPECT_FAIL(loom_mul_mat(ctx, w, x63), LOOM_ERR_SHAPE,
                "mul_mat: a->ne[0] (64) != b->ne[0] (63) (a 'wq', b 'x')");
    loom_tensor *w4 = t4(ctx, LOOM_TYPE_F32, 64, 16, 4, 1, "w4");
    EXPECT_FAIL(loom_mul_mat(ctx, w4, x), LOOM_ERR_SHAPE,
                "mul_mat: b->ne[2] (6) is not a multiple of a->ne[2] (4)");
    loom_tensor *w3 = t4(ctx, LOOM_TYPE_F32, 64, 16, 1, 3, "w3");
    EXPECT_FAIL(loom_mul_mat(ctx, w3, x), LOOM_ERR_SHAPE,
                "b->ne[3] (4) is not a multiple of a->ne[3] (3)");
    EXPECT_FAIL(loom_mul_mat(ctx, w, t4(ctx, LOOM_TYPE_F16, 64, 2, 1, 1, "xh")), LOOM_ERR_TYPE,
                "mul_mat: b must be f32, not f16");
    EXPECT_FAIL(loom_mul_mat(ctx, t4(ctx, LOOM_TYPE_I8, 64, 2, 1, 1, "wi"), x), LOOM_ERR_TYPE,
                "mul_mat: a must be f32/f16/bf16 or a quantised weight type, not i8");

    /* mul_mat_id: experts [K, M, E], b [K, U or 1, T], ids [U, T] -> [M, U, T] */
    loom_tensor *as = t4(ctx, LOOM_TYPE_Q8_0, 64, 16, 8, 1, "experts");
    loom_tensor *ids = t4(ctx, LOOM_TYPE_I32, 2, 5, 1, 1, "ids");
    loom_tensor *b1 = t4(ctx, LOOM_TYPE_F32, 64, 1, 5, 1, "b1");
    loom_tensor *b2 = t4(ctx, LOOM_TYPE_F32, 64, 2, 5, 1, "b2");
    loom_tensor *r = loom_mul_mat_id(ctx, as, b1, ids);
    CHECK_T(r, LOOM_TYPE_F32, 16, 2, 5, 1);
    LOOM_CHECK(r && r->op == LOOM_OP_MUL_MAT_ID && r->src[0] == as && r->src[1] == b1 &&
               r->src[2] == ids);
    CHECK_T(loom_mul_mat_id(ctx, as, b2, ids), LOOM_TYPE_F32, 16, 2, 5, 1);
    EXPECT_FAIL(loom_mul_mat_id(ctx, as, t4(ctx, LOOM_TYPE_F32, 64, 3, 5, 1, "b3"), ids),
                LOOM_ERR_SHAPE, "mul_mat_id: b->ne[1] (3) must be 1 or ids->ne[0] (2)");
    EXPECT_FAIL(loom_mul_mat_id(ctx, as, t4(ctx, LOOM_TYPE_F32, 64, 2, 4, 1, "b4"), ids),
                LOOM_ERR_SHAPE, "mul_mat_id: b->ne[2] (4) != ids->ne[1] (5)");
    EXPECT_FAIL(loom_mul_mat_id(ctx, as, t4(ctx, LOOM_TYPE_F32, 32, 2, 5, 1, "b5"), ids),
                LOOM_ERR_SHAPE, "mul_mat_id: as->ne[0] (64) != b->ne[0] (32)");
    EXPECT_FAIL(loom_mul_mat_id(ctx, as, b2, t4(ctx, LOOM_TYPE_I64, 2, 5, 1, 1, "ids64")),
                LOOM_ERR_TYPE, "mul_mat_id: ids must be i32, not i64");
    EXPECT_FAIL(loom_mul_mat_id(ctx, t4(ctx, LOOM_TYPE_F32, 64, 16, 8, 2, "as4"), b2, ids),
                LOOM_ERR_SHAPE, "mul_mat_id: want as [K, M, E]");

    /* add_id: a [n, U, T] + b [n, E] by ids [U, T] */
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 16, 2, 5, 1, "a");
    loom_tensor *bias = t4(ctx, LOOM_TYPE_F32, 16, 8, 1, 1, "bias");
    r = loom_add_id(ctx, a, bias, ids);
    CHECK_T(r, LOOM_TYPE_F32, 16, 2, 5, 1);
    LOOM_CHECK(r && r->op == LOOM_OP_ADD_ID && r->src[2] == ids);
    EXPECT_FAIL(loom_add_id(ctx, a, t4(ctx, LOOM_TYPE_F32, 15, 8, 1, 1, "b15"), ids),
                LOOM_ERR_SHAPE, "add_id: want a [n, U, T], b [n, E], ids [U, T]", "[15, 8, 1, 1]");
    EXPECT_FAIL(loom_add_id(ctx, a, bias, t4(ctx, LOOM_TYPE_I32, 5, 2, 1, 1, "idsT")),
                LOOM_ERR_SHAPE, "add_id:");
    EXPECT_FAIL(loom_add_id(ctx, a, bias, t4(ctx, LOOM_TYPE_F32, 2, 5, 1, 1, "idsf")),
                LOOM_ERR_TYPE, "add_id: ids must be i32");
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, get_set_rows) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *emb = t4(ctx, LOOM_TYPE_Q4_0, 64, 100, 1, 1, "tok_embd");
    loom_tensor *ids = t4(ctx, LOOM_TYPE_I32, 7, 1, 1, 1, "tokens");
    loom_tensor *r = loom_get_rows(ctx, emb, ids);
    CHECK_T(r, LOOM_TYPE_F32, 64, 7, 1, 1);
    LOOM_CHECK(r && r->op == LOOM_OP_GET_ROWS && r->src[0] == emb && r->src[1] == ids);
    /* broadcast: a [n, R, A2, A3], ids [X, B1, B2] with B1 % A2 == 0, B2 % A3 == 0 */
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 8, 10, 2, 3, "a");
    CHECK_T(loom_get_rows(ctx, a, t4(ctx, LOOM_TYPE_I32, 4, 6, 3, 1, "i")), LOOM_TYPE_F32, 8, 4, 6,
            3);
    CHECK_T(loom_get_rows(ctx, t4(ctx, LOOM_TYPE_I32, 8, 10, 1, 1, "ia"), ids), LOOM_TYPE_I32, 8, 7,
            1, 1);
    EXPECT_FAIL(loom_get_rows(ctx, a, t4(ctx, LOOM_TYPE_I32, 4, 3, 3, 1, "i")), LOOM_ERR_SHAPE,
                "get_rows: ids [4, 3, 3, 1] does not broadcast over a [8, 10, 2, 3]");
    EXPECT_FAIL(loom_get_rows(ctx, a, t4(ctx, LOOM_TYPE_I32, 4, 2, 2, 1, "i")), LOOM_ERR_SHAPE,
                "get_rows:");
    EXPECT_FAIL(loom_get_rows(ctx, a, t4(ctx, LOOM_TYPE_I32, 4, 2, 3, 2, "i")), LOOM_ERR_SHAPE,
                "get_rows: ids must be [X, B1, B2]");
    EXPECT_FAIL(loom_get_rows(ctx, a, t4(ctx, LOOM_TYPE_I64, 4, 1, 1, 1, "i")), LOOM_ERR_TYPE,
                "get_rows: ids must be i32");
    EXPECT_FAIL(loom_get_rows(ctx, t4(ctx, LOOM_TYPE_I16, 4, 1, 1, 1, "s"), ids), LOOM_ERR_TYPE,
                "get_rows: a must be");

    /* set_rows: a KV-cache write, result a view of dst */
    loom_tensor *cache = t4(ctx, LOOM_TYPE_F16, 64, 256, 1, 1, "k_cache");
    loom_tensor *b = t4(ctx, LOOM_TYPE_F32, 64, 7, 1, 1, "k_cur");
    loom_tensor *s = loom_set_rows(ctx, cache, b, ids);
    CHECK_T(s, LOOM_TYPE_F16, 64, 256, 1, 1);
    LOOM_CHECK(s && s->op == LOOM_OP_SET_ROWS && s->view_src == cache && s->src[0] == b &&
               s->src[1] == ids && loom_are_same_layout(s, cache));
    LOOM_CHECK(s && strcmp(s->name, "k_cache (view)") == 0);
    loom_tensor *ids64 = t4(ctx, LOOM_TYPE_I64, 7, 1, 1, 1, "ids64");
    CHECK_T(loom_set_rows(ctx, t4(ctx, LOOM_TYPE_Q8_0, 64, 9, 1, 1, "q"), b, ids64), LOOM_TYPE_Q8_0,
            64, 9, 1, 1);
    /* broadcast over dst dims 2, 3 */
    loom_tensor *d4 = t4(ctx, LOOM_TYPE_F32, 64, 9, 4, 6, "d4");
    loom_tensor *b4 = t4(ctx, LOOM_TYPE_F32, 64, 3, 2, 3, "b4");
    CHECK_T(loom_set_rows(ctx, d4, b4, t4(ctx, LOOM_TYPE_I32, 3, 2, 3, 1, "i4")), LOOM_TYPE_F32, 64,
            9, 4, 6);
    EXPECT_FAIL(loom_set_rows(ctx, d4, t4(ctx, LOOM_TYPE_F32, 64, 3, 3, 3, "b5"),
                              t4(ctx, LOOM_TYPE_I32, 3, 3, 3, 1, "i5")),
                LOOM_ERR_SHAPE,
                "set_rows: b [64, 3, 3, 3] does not broadcast over dst [64, 9, 4, 6]");
    EXPECT_FAIL(loom_set_rows(ctx, cache, b, t4(ctx, LOOM_TYPE_I32, 6, 1, 1, 1, "i6")),
                LOOM_ERR_SHAPE,
                "set_rows: ids [6, 1, 1, 1] must be [X, B2, B3] for b [64, 7, 1, 1]");
    EXPECT_FAIL(loom_set_rows(ctx, cache, t4(ctx, LOOM_TYPE_F32, 32, 7, 1, 1, "b32"), ids),
                LOOM_ERR_SHAPE, "set_rows: dst->ne[0] (64) != b->ne[0] (32)");
    EXPECT_FAIL(loom_set_rows(ctx, cache, b, t4(ctx, LOOM_TYPE_F32, 7, 1, 1, 1, "if")),
                LOOM_ERR_TYPE, "set_rows: ids must be i32 or i64, not f32");
    EXPECT_FAIL(loom_set_rows(ctx, t4(ctx, LOOM_TYPE_I32, 64, 9, 1, 1, "di"), b, ids),
                LOOM_ERR_TYPE, "set_rows: dst must be");
    EXPECT_FAIL(loom_set_rows(ctx, cache, t4(ctx, LOOM_TYPE_F16, 64, 7, 1, 1, "bh"), ids),
                LOOM_ERR_TYPE, "set_rows: b must be f32");
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, reshape_and_views) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 6, 4, 1, 1, "a");
    loom_tensor *r = loom_reshape_1d(ctx, a, 24);
    CHECK_T(r, LOOM_TYPE_F32, 24, 1, 1, 1);
    LOOM_CHECK(r && r->op == LOOM_OP_RESHAPE && r->view_src == a && r->src[0] == a);
    LOOM_CHECK(r && strcmp(r->name, "a (reshaped)") == 0 && loom_is_contiguous(r));
    CHECK_T(loom_reshape_2d(ctx, a, 3, 8), LOOM_TYPE_F32, 3, 8, 1, 1);
    CHECK_T(loom_reshape_3d(ctx, a, 2, 3, 4), LOOM_TYPE_F32, 2, 3, 4, 1);
    CHECK_T(loom_reshape_4d(ctx, a, 1, 2, 3, 4), LOOM_TYPE_F32, 1, 2, 3, 4);
    CHECK_T(loom_reshape(ctx, a, t4(ctx, LOOM_TYPE_I8, 12, 2, 1, 1, "like")), LOOM_TYPE_F32, 12, 2,
            1, 1);
    EXPECT_FAIL(loom_reshape_2d(ctx, a, 5, 5), LOOM_ERR_SHAPE,
                "reshape: [5, 5, 1, 1] does not hold the 24 elements of a 'a'");
    EXPECT_FAIL(loom_reshape_1d(ctx, loom_transpose(ctx, a), 24), LOOM_ERR_SHAPE,
                "reshape: a 'a (transposed)' [4, 6, 1, 1] is not contiguous");
    loom_tensor *q = t4(ctx, LOOM_TYPE_Q8_0, 64, 2, 1, 1, "q");
    CHECK_T(loom_reshape_2d(ctx, q, 32, 4), LOOM_TYPE_Q8_0, 32, 4, 1, 1);
    EXPECT_FAIL(loom_reshape_2d(ctx, q, 16, 8), LOOM_ERR_SHAPE, "multiple of 32");

    loom_tensor *v = loom_view_3d(ctx, a, 2, 2, 2, a->nb[1], 2 * a->nb[1], 8);
    CHECK_T(v, LOOM_TYPE_F32, 2, 2, 2, 1);
    LOOM_CHECK(v && v->op == LOOM_OP_VIEW && v->view_offs == 8 && v->nb[1] == a->nb[1] &&
               v->nb[2] == 2 * a->nb[1] && v->nb[3] == 4 * a->nb[1]);
    v = loom_view_4d(ctx, a, 3, 2, 2, 2, 4, 12, 24, 0);
    CHECK_T(v, LOOM_TYPE_F32, 3, 2, 2, 2);
    LOOM_CHECK(v && v->nb[0] == 4 && v->nb[1] == 4 && v->nb[2] == 12 && v->nb[3] == 24);
    EXPECT_FAIL(loom_view_4d(ctx, a, 3, 2, 2, 2, 4, 12, 96, 0), LOOM_ERR_SHAPE,
                "past the 96 bytes");
    loom_ctx_free(ctx);
}

LOOM_TEST(ops, attention_family) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    /* soft_max */
    loom_tensor *kq = t4(ctx, LOOM_TYPE_F32, 32, 7, 8, 2, "kq");
    loom_tensor *sm = loom_soft_max(ctx, kq);
    CHECK_T(sm, LOOM_TYPE_F32, 32, 7, 8, 2);
    LOOM_CHECK(sm && sm->op == LOOM_OP_SOFT_MAX && pf(sm, 0) == 1.0f && pf(sm, 1) == 0.0f &&
               !sm->src[1] && !sm->src[2]);
    loom_tensor *mask = t4(ctx, LOOM_TYPE_F16, 32, 16, 1, 1, "kq_mask");
    loom_tensor *mask2 = t4(ctx, LOOM_TYPE_F32, 32, 7, 4, 2, "mask2");
    loom_tensor *sinks = t4(ctx, LOOM_TYPE_F32, 8, 1, 1, 1, "sinks");
    sm = loom_soft_max_ext(ctx, kq, mask, sinks, 0.125f, 8.0f);
    CHECK_T(sm, LOOM_TYPE_F32, 32, 7, 8, 2);
    LOOM_CHECK(sm && sm->src[0] == kq && sm->src[1] == mask && sm->src[2] == sinks &&
               pf(sm, 0) == 0.125f && pf(sm, 1) == 8.0f);
    CHECK_T(loom_soft_max_ext(ctx, kq, mask2, NULL, 1, 0), LOOM_TYPE_F32, 32, 7, 8, 2);
    EXPECT_FAIL(
        loom_soft_max_ext(ctx, kq, t4(ctx, LOOM_TYPE_F32, 32, 6, 1, 1, "short"), NULL, 1, 0),
        LOOM_ERR_SHAPE, "soft_max: mask [32, 6, 1, 1] does not fit a [32, 7, 8, 2]");
    EXPECT_FAIL(loom_soft_max_ext(ctx, kq, t4(ctx, LOOM_TYPE_F32, 32, 7, 3, 1, "m3"), NULL, 1, 0),
                LOOM_ERR_SHAPE, "soft_max: mask");
    EXPECT_FAIL(loom_soft_max_ext(ctx, kq, t4(ctx, LOOM_TYPE_BF16, 32, 7, 1, 1, "mb"), NULL, 1, 0),
                LOOM_ERR_TYPE, "soft_max: mask must be f32 or f16, not bf16");
    EXPECT_FAIL(loom_soft_max_ext(ctx, kq, NULL, t4(ctx, LOOM_TYPE_F32, 7, 1, 1, 1, "s7"), 1, 0),
                LOOM_ERR_SHAPE, "soft_max: sinks [7, 1, 1, 1] must be [a->ne[2] (8)]");
    EXPECT_FAIL(loom_soft_max_ext(ctx, kq, NULL, NULL, 1, -1), LOOM_ERR_INVALID_ARG,
                "soft_max: max_bias (-1)");

    /* rope */
    loom_tensor *x = t4(ctx, LOOM_TYPE_F32, 64, 8, 5, 1, "q");
    loom_tensor *pos = t4(ctx, LOOM_TYPE_I32, 5, 1, 1, 1, "pos");
    loom_tensor *ff = t4(ctx, LOOM_TYPE_F32, 16, 1, 1, 1, "ff");
    loom_tensor *rp = loom_rope_ext(ctx, x, pos, ff, 32, LOOM_ROPE_TYPE_NEOX, 10000.0f, 0.5f);
    CHECK_T(rp, LOOM_TYPE_F32, 64, 8, 5, 1);
    LOOM_CHECK(rp && rp->op == LOOM_OP_ROPE && rp->src[1] == pos && rp->src[2] == ff);
    LOOM_CHECK(rp && loom_get_op_params_i32(rp, 0) == 32 &&
               loom_get_op_params_i32(rp, 1) == LOOM_ROPE_TYPE_NEOX && pf(rp, 2) == 10000.0f &&
               pf(rp, 3) == 0.5f);
    CHECK_T(loom_rope_ext(ctx, x, pos, NULL, 64, 0, 1e4f, 1), LOOM_TYPE_F32, 64, 8, 5, 1);
    EXPECT_FAIL(loom_rope_ext(ctx, x, pos, ff, 66, 0, 1e4f, 1), LOOM_ERR_INVALID_ARG,
                "rope: n_dims (66) must be even and in [2, a->ne[0] (64)]");
    EXPECT_FAIL(loom_rope_ext(ctx, x, pos, ff, 31, 0, 1e4f, 1), LOOM_ERR_INVALID_ARG,
                "n_dims (31)");
    EXPECT_FAIL(loom_rope_ext(ctx, x, pos, ff, 32, 1, 1e4f, 1), LOOM_ERR_INVALID_ARG,
                "rope: mode 1");
    EXPECT_FAIL(loom_rope_ext(ctx, x, pos, ff, 64, 0, 1e4f, 1), LOOM_ERR_SHAPE,
                "rope: freq_factors->ne[0] (16) < n_dims / 2 (32)");
    EXPECT_FAIL(
        loom_rope_ext(ctx, x, t4(ctx, LOOM_TYPE_I32, 4, 1, 1, 1, "p4"), NULL, 32, 0, 1e4f, 1),
        LOOM_ERR_SHAPE, "rope: pos [4, 1, 1, 1] must be [a->ne[2] (5)]");
    EXPECT_FAIL(
        loom_rope_ext(ctx, x, t4(ctx, LOOM_TYPE_I64, 5, 1, 1, 1, "p64"), NULL, 32, 0, 1e4f, 1),
        LOOM_ERR_TYPE, "rope: pos must be i32");
    EXPECT_FAIL(
        loom_rope_ext(ctx, t4(ctx, LOOM_TYPE_F32, 64, 8, 5, 2, "x4"), pos, NULL, 32, 0, 1e4f, 1),
        LOOM_ERR_SHAPE, "rope: a must be [D, H, T, 1]");

    /* flash attention: q [D, Nq, H, S], k/v [D, Nkv, Hkv, S] -> [Dv, H, Nq, S] */
    loom_tensor *q = t4(ctx, LOOM_TYPE_F32, 64, 5, 8, 1, "q");
    loom_tensor *k = t4(ctx, LOOM_TYPE_F16, 64, 32, 2, 1, "k");
    loom_tensor *v = t4(ctx, LOOM_TYPE_F16, 48, 32, 2, 1, "v");
    loom_tensor *fm = t4(ctx, LOOM_TYPE_F16, 32, 8, 1, 1, "fa_mask");
    loom_tensor *fa = loom_flash_attn_ext(ctx, q, k, v, fm, sinks, 0.125f, 0.0f, 30.0f);
    CHECK_T(fa, LOOM_TYPE_F32, 48, 8, 5, 1);
    LOOM_CHECK(fa && fa->op == LOOM_OP_FLASH_ATTN_EXT && fa->src[0] == q && fa->src[1] == k &&
               fa->src[2] == v && fa->src[3] == fm && fa->src[4] == sinks);
    LOOM_CHECK(fa && pf(fa, 0) == 0.125f && pf(fa, 1) == 0.0f && pf(fa, 2) == 30.0f);
    CHECK_T(loom_flash_attn_ext(ctx, q, k, v, NULL, NULL, 1, 0, 0), LOOM_TYPE_F32, 48, 8, 5, 1);
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, t4(ctx, LOOM_TYPE_F16, 64, 32, 3, 1, "k3"),
                                    t4(ctx, LOOM_TYPE_F16, 48, 32, 3, 1, "v3"), NULL, NULL, 1, 0,
                                    0),
                LOOM_ERR_SHAPE, "flash_attn_ext: want q [D, Nq, H, S]", "H % Hkv == 0",
                "q [64, 5, 8, 1], k [64, 32, 3, 1]");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, t4(ctx, LOOM_TYPE_F16, 32, 32, 2, 1, "k32"), v, NULL,
                                    NULL, 1, 0, 0),
                LOOM_ERR_SHAPE, "flash_attn_ext:");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, k, t4(ctx, LOOM_TYPE_F16, 48, 31, 2, 1, "v31"), NULL,
                                    NULL, 1, 0, 0),
                LOOM_ERR_SHAPE, "flash_attn_ext:");
    EXPECT_FAIL(
        loom_flash_attn_ext(ctx, q, k, v, t4(ctx, LOOM_TYPE_F16, 32, 4, 1, 1, "m4"), NULL, 1, 0, 0),
        LOOM_ERR_SHAPE, "flash_attn_ext: mask [32, 4, 1, 1] must be [Nkv (32), >= Nq (5), 1, 1]");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, t4(ctx, LOOM_TYPE_I32, 64, 32, 2, 1, "ki"), v, NULL,
                                    NULL, 1, 0, 0),
                LOOM_ERR_TYPE, "flash_attn_ext: k and v must be f32, f16, bf16 or a KV cache");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, t4(ctx, LOOM_TYPE_Q8_1, 64, 32, 2, 1, "kk"), v, NULL,
                                    NULL, 1, 0, 0),
                LOOM_ERR_TYPE, "not q8_1 and f16");
    EXPECT_FAIL(
        loom_flash_attn_ext(ctx, q, k, v, NULL, t4(ctx, LOOM_TYPE_F32, 2, 1, 1, 1, "s2"), 1, 0, 0),
        LOOM_ERR_SHAPE, "flash_attn_ext: sinks [2, 1, 1, 1] must be [H (8)]");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, q, k, v, NULL, NULL, 1, 0, -1), LOOM_ERR_INVALID_ARG,
                "softcap (-1)");
    EXPECT_FAIL(loom_flash_attn_ext(ctx, t4(ctx, LOOM_TYPE_F16, 64, 5, 8, 1, "qh"), k, v, NULL,
                                    NULL, 1, 0, 0),
                LOOM_ERR_TYPE, "flash_attn_ext: q must be f32");
    loom_ctx_free(ctx);
}

/* A NULL source yields NULL and keeps the error recorded by the failed builder. */
LOOM_TEST(ops, null_sources_propagate) {
    loom_ctx *ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 64, 4, 1, 1, "a");
    loom_tensor *i = t4(ctx, LOOM_TYPE_I32, 4, 1, 1, 1, "i");
    LOOM_REQUIRE(a && i);
    loom_tensor *N = NULL;
    size_t used = loom_ctx_used(ctx);
#define NULL_CASES(X)                                                                              \
    X(loom_dup(ctx, N))                                                                            \
    X(loom_cpy(ctx, N, a))                                                                         \
    X(loom_cpy(ctx, a, N))                                                                         \
    X(loom_cont(ctx, N))                                                                           \
    X(loom_cont_4d(ctx, N, 1, 1, 1, 1)) X(loom_cast(ctx, N, LOOM_TYPE_F16)) X(                     \
        loom_add(ctx, N, a)) X(loom_sub(ctx, a, N)) X(loom_mul(ctx, N, N)) X(loom_div(ctx, a, N))  \
        X(loom_add_id(ctx, a, a, N)) X(loom_scale(ctx, N, 1)) X(loom_scale_bias(ctx, N, 1, 1)) X(  \
            loom_sqr(ctx, N)) X(loom_sqrt(ctx, N)) X(loom_sum_rows(ctx, N)) X(loom_mean(ctx, N))   \
            X(loom_argmax(ctx, N)) X(loom_norm(ctx, N, 0)) X(loom_rms_norm(ctx, N, 0)) X(          \
                loom_mul_mat(ctx, N, a)) X(loom_mul_mat(ctx, a, N))                                \
                X(loom_mul_mat_id(ctx, a, a, N)) X(loom_get_rows(ctx, N, i)) X(                    \
                    loom_get_rows(ctx, a, N)) X(loom_set_rows(ctx, N, a, i))                       \
                    X(loom_set_rows(ctx, a, a, N)) X(loom_reshape(ctx, N, a)) X(                   \
                        loom_reshape(ctx, a, N)) X(loom_reshape_1d(ctx, N, 1))                     \
                        X(loom_reshape_2d(ctx, N, 1, 1)) X(loom_reshape_3d(ctx, N, 1, 1, 1)) X(    \
                            loom_reshape_4d(ctx, N, 1, 1, 1, 1))                                   \
                            X(loom_view_1d(ctx, N, 1, 0)) X(loom_view_2d(ctx, N, 1, 1, 4, 0)) X(   \
                                loom_view_3d(ctx, N, 1, 1, 1, 4, 4, 0))                            \
                                X(loom_view_4d(ctx, N, 1, 1, 1, 1, 4, 4, 4, 0)) X(loom_permute(    \
                                    ctx, N, 0, 1, 2,                                               \
                                    3)) X(loom_transpose(ctx, N)) X(loom_soft_max(ctx, N))         \
                                    X(loom_soft_max_ext(ctx, N, a, a, 1, 0)) X(loom_rope_ext(      \
                                        ctx, N, i, NULL, 2,                                        \
                                        0, 1, 1)) X(loom_rope_ext(ctx, a, N, NULL, 2, 0, 1, 1))    \
                                        X(loom_flash_attn_ext(ctx, a, N, a, NULL, NULL, 1, 0, 0))  \
                                            X(loom_concat(ctx, a, N, 0)) X(loom_unary(             \
                                                ctx, N, LOOM_UNARY_SILU)) X(loom_silu(ctx, N))     \
                                                X(loom_gelu(ctx, N)) X(loom_relu(ctx, N)) X(       \
                                                    loom_glu_split(ctx, a, N, LOOM_GLU_SWIGLU))    \
                                                    X(loom_glu(ctx, N, LOOM_GLU_GEGLU, false))     \
                                                        X(loom_swiglu_split(ctx, N, a))            \
                                                            X(loom_argsort(ctx, N, LOOM_SORT_ASC)) \
                                                                X(loom_top_k(ctx, N, 1))           \
                                                                    X(loom_clamp(ctx, N, 0, 1)) X( \
                                                                        loom_fill(ctx, N, 0))      \
                                                                        X(loom_dup_tensor(ctx, N)) \
                                                                            X(loom_view_tensor(    \
                                                                                ctx, N))
    int n = 0;
#define X(call)                                                                                    \
    {                                                                                              \
        loom_error(LOOM_ERR_SHAPE, "earlier failure %d", n);                                       \
        char want[64];                                                                             \
        snprintf(want, sizeof want, "earlier failure %d", n);                                      \
        LOOM_CHECK_MSG((call) == NULL, "%s did not return NULL", #call);                           \
        LOOM_CHECK_MSG(loom_last_status() == LOOM_ERR_SHAPE &&                                     \
                           strcmp(loom_last_error(), want) == 0,                                   \
                       "%s replaced the error with '%s'", #call, loom_last_error());               \
        n++;                                                                                       \
    }
    NULL_CASES(X)
#undef X
    LOOM_CHECK_EQ_INT(n, 58); /* every builder and operand position listed */
    /* with no earlier error, the NULL operand itself is reported */
#define X(call)                                                                                    \
    {                                                                                              \
        loom_clear_error();                                                                        \
        LOOM_CHECK_MSG((call) == NULL, "%s did not return NULL", #call);                           \
        LOOM_CHECK_MSG(loom_last_status() == LOOM_ERR_INVALID_ARG &&                               \
                           strstr(loom_last_error(), "is NULL") != NULL,                           \
                       "%s: '%s'", #call, loom_last_error());                                      \
    }
    NULL_CASES(X)
#undef X
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), used); /* nothing was allocated */
    /* a chain checked once at its end */
    loom_tensor *w = t4(ctx, LOOM_TYPE_F16, 63, 4, 1, 1, "w");
    loom_tensor *y = loom_silu(ctx, loom_add(ctx, loom_mul_mat(ctx, w, a), a));
    LOOM_CHECK(y == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "mul_mat: a->ne[0] (63) != b->ne[0] (64)");
    loom_ctx_free(ctx);
}

/* Every builder fails cleanly (LOOM_ERR_FULL) when its result does not fit. */
LOOM_TEST(ops, full_context) {
    size_t n_src = 9;
    loom_ctx *ctx = loom_ctx_new(
        (loom_ctx_params){.mem_size = n_src * loom_tensor_overhead(), .no_alloc = true});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = t4(ctx, LOOM_TYPE_F32, 64, 4, 2, 1, "a");
    loom_tensor *a2 = t4(ctx, LOOM_TYPE_F32, 64, 4, 1, 1, "a2");
    loom_tensor *ids = t4(ctx, LOOM_TYPE_I32, 4, 2, 1, 1, "ids");
    loom_tensor *e = t4(ctx, LOOM_TYPE_F32, 64, 8, 4, 1, "experts");
    loom_tensor *pos = t4(ctx, LOOM_TYPE_I32, 2, 1, 1, 1, "pos");
    loom_tensor *bias = t4(ctx, LOOM_TYPE_F32, 64, 4, 1, 1, "bias");
    loom_tensor *k = t4(ctx, LOOM_TYPE_F32, 64, 8, 1, 1, "k");
    loom_tensor *ids1 = t4(ctx, LOOM_TYPE_I32, 4, 1, 1, 1, "ids1");
    loom_tensor *q = t4(ctx, LOOM_TYPE_F32, 64, 3, 2, 1, "q");
    LOOM_REQUIRE(a && a2 && ids && e && pos && bias && k && ids1 && q);
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), n_src * loom_tensor_overhead());
#define FULL_CASES(X)                                                                              \
    X(loom_dup(ctx, a))                                                                            \
    X(loom_cpy(ctx, a, a))                                                                         \
    X(loom_cont(ctx, a))                                                                           \
    X(loom_cast(ctx, a, LOOM_TYPE_F16))                                                            \
    X(loom_add(ctx, a, a)) X(loom_sub(ctx, a, a)) X(loom_mul(ctx, a, a)) X(loom_div(ctx, a, a)) X( \
        loom_add_id(ctx, bias, bias, ids1)) X(loom_scale(ctx, a, 2)) X(loom_sqr(ctx, a))           \
        X(loom_sqrt(ctx, a)) X(loom_sum_rows(ctx, a)) X(loom_mean(ctx, a)) X(loom_argmax(ctx, a2)) \
            X(loom_norm(ctx, a, 0)) X(loom_rms_norm(ctx, a, 0)) X(loom_mul_mat(ctx, a, a))         \
                X(loom_mul_mat_id(ctx, e, a, ids)) X(loom_get_rows(ctx, a2, ids1))                 \
                    X(loom_set_rows(ctx, bias, bias, ids1)) X(loom_reshape_1d(ctx, a, 512))        \
                        X(loom_view_1d(ctx, a, 4, 0)) X(loom_permute(ctx, a, 1, 0, 2, 3)) X(       \
                            loom_transpose(ctx, a)) X(loom_soft_max_ext(ctx, a, NULL, NULL, 1, 0)) \
                            X(loom_rope_ext(ctx, a, pos, NULL, 64, 0, 1, 1))                       \
                                X(loom_flash_attn_ext(ctx, q, k, k, NULL, NULL, 1, 0, 0))          \
                                    X(loom_concat(ctx, a, a, 2)) X(loom_silu(ctx, a))              \
                                        X(loom_glu(ctx, a, LOOM_GLU_SWIGLU, false))                \
                                            X(loom_glu_split(ctx, a, a, LOOM_GLU_GEGLU))           \
                                                X(loom_argsort(ctx, a, LOOM_SORT_ASC))             \
                                                    X(loom_top_k(ctx, a, 2))                       \
                                                        X(loom_clamp(ctx, a, 0, 1))                \
                                                            X(loom_fill(ctx, a, 1))                \
                                                                X(loom_dup_tensor(ctx, a))         \
                                                                    X(loom_view_tensor(ctx, a))
#define X(call)                                                                                    \
    {                                                                                              \
        loom_clear_error();                                                                        \
        LOOM_CHECK_MSG((call) == NULL, "%s fit in a full context", #call);                         \
        LOOM_CHECK_MSG(loom_last_status() == LOOM_ERR_FULL &&                                      \
                           strstr(loom_last_error(), "context full") != NULL,                      \
                       "%s: %s", #call, loom_last_error());                                        \
    }
    FULL_CASES(X)
#undef X
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), n_src * loom_tensor_overhead());
    loom_ctx_free(ctx);

    /* the same calls all succeed with room to spare: the failures above were only capacity */
    ctx = ctx_new();
    LOOM_REQUIRE(ctx != NULL);
    a = t4(ctx, LOOM_TYPE_F32, 64, 4, 2, 1, "a");
    a2 = t4(ctx, LOOM_TYPE_F32, 64, 4, 1, 1, "a2");
    ids = t4(ctx, LOOM_TYPE_I32, 4, 2, 1, 1, "ids");
    e = t4(ctx, LOOM_TYPE_F32, 64, 8, 4, 1, "experts");
    pos = t4(ctx, LOOM_TYPE_I32, 2, 1, 1, 1, "pos");
    bias = t4(ctx, LOOM_TYPE_F32, 64, 4, 1, 1, "bias");
    k = t4(ctx, LOOM_TYPE_F32, 64, 8, 1, 1, "k");
    ids1 = t4(ctx, LOOM_TYPE_I32, 4, 1, 1, 1, "ids1");
    q = t4(ctx, LOOM_TYPE_F32, 64, 3, 2, 1, "q");
#define X(call) LOOM_CHECK_MSG((call) != NULL, "%s: %s", #call, loom_last_error());
    FULL_CASES(X)
#undef X
    loom_ctx_free(ctx);
}
