/*
 * tensor_test.c: contexts (arena accounting, data alignment, no_alloc, caller memory, a
 * full arena), tensor headers (strides, sizes, contiguity), views and their owner chain,
 * permute/transpose strides checked against element addresses, names and host access.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

static loom_ctx *new_ctx(size_t mem, bool no_alloc) {
    return loom_ctx_new((loom_ctx_params){.mem_size = mem, .no_alloc = no_alloc});
}

LOOM_TEST(tensor, new_tensor_strides_and_alignment) {
    loom_ctx *ctx = new_ctx(1 << 20, false);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 5, 3, 2);
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 64, 3);
    loom_tensor *c = loom_new_tensor_1d(ctx, LOOM_TYPE_F16, 7);
    const int64_t ne4[4] = {2, 3, 4, 5};
    loom_tensor *d = loom_new_tensor(ctx, LOOM_TYPE_I64, 4, ne4);
    LOOM_REQUIRE(a && b && c && d);
    LOOM_CHECK_EQ_INT(a->ne[0], 5);
    LOOM_CHECK_EQ_INT(a->ne[3], 1);
    LOOM_CHECK_EQ_INT(a->nb[0], 4);
    LOOM_CHECK_EQ_INT(a->nb[1], 20);
    LOOM_CHECK_EQ_INT(a->nb[2], 60);
    LOOM_CHECK_EQ_INT(a->nb[3], 120);
    LOOM_CHECK_EQ_INT(loom_nbytes(a), 120);
    LOOM_CHECK_EQ_INT(loom_nelements(a), 30);
    LOOM_CHECK_EQ_INT(loom_nrows(a), 6);
    LOOM_CHECK_EQ_INT(loom_n_dims(a), 3);
    LOOM_CHECK_EQ_INT(loom_n_dims(c), 1);
    LOOM_CHECK_EQ_INT(loom_n_dims(d), 4);
    LOOM_CHECK_EQ_INT(b->nb[0], 34);
    LOOM_CHECK_EQ_INT(b->nb[1], 68);
    LOOM_CHECK_EQ_INT(loom_nbytes(b), 204);
    LOOM_CHECK_EQ_INT(loom_element_size(b), 34);
    LOOM_CHECK_EQ_INT(d->nb[3], 8 * 2 * 3 * 4);
    LOOM_CHECK(loom_is_contiguous(a) && loom_is_contiguous(b) && loom_is_contiguous(d));
    LOOM_CHECK(!loom_is_view(a) && !loom_is_transposed(a) && !loom_is_permuted(a));
    /* data is 64-aligned, inside the arena, and tensors do not overlap */
    loom_tensor *ts[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) {
        LOOM_CHECK(ts[i]->data != NULL);
        LOOM_CHECK((uintptr_t)ts[i]->data % 64 == 0);
        LOOM_CHECK(ts[i]->op == LOOM_OP_NONE && ts[i]->buffer == NULL && ts[i]->flags == 0);
        LOOM_CHECK(ts[i]->name[0] == '\0');
        for (int j = 0; j < 4; j++) {
            if (i == j) continue;
            char *p = ts[i]->data, *q = ts[j]->data;
            LOOM_CHECK(p + loom_nbytes(ts[i]) <= q || q + loom_nbytes(ts[j]) <= p);
            LOOM_CHECK((char *)ts[j] + sizeof(loom_tensor) <= p ||
                       p + loom_nbytes(ts[i]) <= (char *)ts[j]);
        }
    }
    /* exact arena accounting: overhead + data rounded to 64 */
    size_t want = 0;
    for (int i = 0; i < 4; i++)
        want += loom_tensor_overhead() + (loom_nbytes(ts[i]) + 63) / 64 * 64;
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), want);
    loom_ctx_free(ctx);
    loom_ctx_free(NULL);
}

LOOM_TEST(tensor, exact_fit_then_full) {
    /* an arena sized for exactly two tensors holds them, and the third fails cleanly */
    size_t per = loom_tensor_overhead() + 256;
    loom_ctx *ctx = new_ctx(2 * per, false);
    LOOM_REQUIRE(ctx != NULL);
    LOOM_CHECK(loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 64) != NULL);
    LOOM_CHECK(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 8, 8) != NULL);
    loom_clear_error();
    LOOM_CHECK(loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 100, 3) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "context full");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "f16 [100, 3, 1, 1]");
    char needed[64];
    snprintf(needed, sizeof needed, "needs %zu bytes", loom_tensor_overhead() + 640);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), needed);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "only 0 of");
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), 2 * per);
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, bad_shapes_and_types) {
    loom_ctx *ctx = new_ctx(1 << 16, false);
    LOOM_REQUIRE(ctx != NULL);
    loom_clear_error();
    LOOM_CHECK(loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_0, 33, 2) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "q4_0 needs ne[0] (33) to be a multiple of 32");
    LOOM_CHECK(loom_new_tensor_1d(ctx, LOOM_TYPE_F32, -1) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "negative");
    LOOM_CHECK(loom_new_tensor_1d(ctx, (loom_type)5, 4) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_TYPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "5 is not a loom type");
    const int64_t ne[5] = {1, 2, 3, 4, 5};
    LOOM_CHECK(loom_new_tensor(ctx, LOOM_TYPE_F32, 5, ne) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK(loom_new_tensor(ctx, LOOM_TYPE_F32, 0, ne) == NULL);
    LOOM_CHECK(loom_new_tensor_1d(NULL, LOOM_TYPE_F32, 4) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "ctx is NULL");
    /* sizes that overflow size_t are refused, not wrapped */
    LOOM_CHECK(loom_new_tensor_4d(ctx, LOOM_TYPE_F32, 1 << 20, 1 << 20, 1 << 20, 1 << 20) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "too large");
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), 0);
    /* empty tensors are allowed */
    loom_tensor *e = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 0, 5);
    LOOM_REQUIRE(e != NULL);
    LOOM_CHECK_EQ_INT(loom_nbytes(e), 0);
    LOOM_CHECK_EQ_INT(loom_nelements(e), 0);
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, no_alloc_and_caller_memory) {
    loom_ctx *ctx = new_ctx(4 * loom_tensor_overhead(), true);
    LOOM_REQUIRE(ctx != NULL);
    LOOM_CHECK(loom_ctx_get_no_alloc(ctx));
    loom_tensor *big = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4096, 4096);
    LOOM_REQUIRE(big != NULL);
    LOOM_CHECK(big->data == NULL);
    LOOM_CHECK_EQ_INT(loom_ctx_used(ctx), loom_tensor_overhead());
    loom_tensor *v = loom_view_tensor(ctx, big);
    LOOM_REQUIRE(v != NULL);
    LOOM_CHECK(v->data == NULL && v->view_src == big);
    loom_ctx_set_no_alloc(ctx, false);
    LOOM_CHECK(!loom_ctx_get_no_alloc(ctx));
    loom_clear_error();
    LOOM_CHECK(loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 1024) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_FULL);
    loom_ctx_free(ctx);

    /* caller memory, deliberately misaligned: data still lands on 64-byte boundaries */
    size_t size = 8192;
    char *mem = malloc(size + 3);
    LOOM_REQUIRE(mem != NULL);
    ctx = loom_ctx_new((loom_ctx_params){.mem_size = size, .mem_buffer = mem + 3});
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 100);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK((uintptr_t)t->data % 64 == 0);
    LOOM_CHECK((char *)t->data >= mem + 3 && (char *)t->data + 400 <= mem + 3 + size);
    LOOM_CHECK((char *)t >= mem + 3);
    loom_ctx_free(ctx); /* does not free caller memory */
    free(mem);
}

LOOM_TEST(tensor, ctx_iteration_and_lookup) {
    loom_ctx *ctx = new_ctx(1 << 16, true);
    LOOM_REQUIRE(ctx != NULL);
    LOOM_CHECK(loom_ctx_first_tensor(ctx) == NULL);
    loom_tensor *t[5];
    for (int i = 0; i < 5; i++) {
        t[i] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, i + 1);
        LOOM_REQUIRE(t[i] != NULL);
        loom_format_name(t[i], "t%d", i);
        if (i == 2) LOOM_REQUIRE(loom_graph_new(ctx, 8) != NULL); /* not a tensor: skipped */
    }
    int n = 0;
    for (loom_tensor *it = loom_ctx_first_tensor(ctx); it; it = loom_ctx_next_tensor(ctx, it)) {
        LOOM_REQUIRE(n < 5);
        LOOM_CHECK(it == t[n]);
        n++;
    }
    LOOM_CHECK_EQ_INT(n, 5);
    LOOM_CHECK(loom_ctx_get_tensor(ctx, "t3") == t[3]);
    LOOM_CHECK(loom_ctx_get_tensor(ctx, "t9") == NULL);
    loom_ctx_free(ctx);
}

/* Element (i0..i3) of t as its byte offset from t's owner data (plain types). */
static size_t offs_of(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t->view_offs + (size_t)(i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
                                   i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3]);
}

LOOM_TEST(tensor, permute_and_transpose_strides) {
    loom_ctx *ctx = new_ctx(1 << 16, false);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_4d(ctx, LOOM_TYPE_F32, 2, 3, 4, 5);
    LOOM_REQUIRE(a != NULL);
    loom_set_name(a, "a");
    const int perms[3][4] = {{1, 0, 2, 3}, {2, 0, 3, 1}, {3, 2, 1, 0}};
    for (int p = 0; p < 3; p++) {
        const int *ax = perms[p];
        loom_tensor *t = loom_permute(ctx, a, ax[0], ax[1], ax[2], ax[3]);
        LOOM_REQUIRE(t != NULL);
        LOOM_CHECK(t->op == LOOM_OP_PERMUTE && t->view_src == a && t->src[0] == a);
        LOOM_CHECK(t->data == a->data);
        for (int i = 0; i < 4; i++) {
            LOOM_CHECK_EQ_INT(t->op_params[i], ax[i]);
            LOOM_CHECK_EQ_INT(t->ne[ax[i]], a->ne[i]);
        }
        /* element idx of a is element perm(idx) of t: same byte address */
        for (int64_t i3 = 0; i3 < 5; i3++)
            for (int64_t i2 = 0; i2 < 4; i2++)
                for (int64_t i1 = 0; i1 < 3; i1++)
                    for (int64_t i0 = 0; i0 < 2; i0++) {
                        int64_t j[4], i[4] = {i0, i1, i2, i3};
                        for (int k = 0; k < 4; k++)
                            j[ax[k]] = i[k];
                        LOOM_CHECK(offs_of(t, j[0], j[1], j[2], j[3]) ==
                                   offs_of(a, i0, i1, i2, i3));
                    }
        LOOM_CHECK(p == 0 ? loom_is_transposed(t) : true);
        LOOM_CHECK(loom_is_permuted(t));
        LOOM_CHECK(!loom_is_contiguous(t));
        LOOM_CHECK_EQ_INT(loom_nbytes(t), loom_nbytes(a));
        LOOM_CHECK(strcmp(t->name, "a (permuted)") == 0);
    }
    loom_tensor *tr = loom_transpose(ctx, a);
    LOOM_REQUIRE(tr != NULL);
    LOOM_CHECK(tr->op == LOOM_OP_TRANSPOSE && tr->ne[0] == 3 && tr->ne[1] == 2);
    LOOM_CHECK(tr->nb[0] == a->nb[1] && tr->nb[1] == a->nb[0]);
    LOOM_CHECK(loom_is_transposed(tr));
    LOOM_CHECK(strcmp(tr->name, "a (transposed)") == 0);
    /* transposing back gives a's layout, still viewing a directly */
    loom_tensor *tt = loom_transpose(ctx, tr);
    LOOM_REQUIRE(tt != NULL);
    LOOM_CHECK(loom_are_same_layout(tt, a));
    LOOM_CHECK(tt->view_src == a && tt->src[0] == tr);
    loom_clear_error();
    LOOM_CHECK(loom_permute(ctx, a, 0, 1, 1, 3) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "permute: axes (0, 1, 1, 3)");
    LOOM_CHECK(loom_permute(ctx, a, 0, 1, 2, 4) == NULL);
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, view_chains_to_owner) {
    loom_ctx *ctx = new_ctx(1 << 16, false);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 16, 8);
    LOOM_REQUIRE(a != NULL);
    loom_set_name(a, "a");
    loom_tensor *v1 = loom_view_2d(ctx, a, 8, 4, a->nb[1], 2 * a->nb[1]); /* rows 2..5 */
    LOOM_REQUIRE(v1 != NULL);
    LOOM_CHECK(v1->view_src == a && v1->view_offs == 2 * a->nb[1]);
    LOOM_CHECK((char *)v1->data == (char *)a->data + 2 * a->nb[1]);
    LOOM_CHECK(v1->nb[1] == a->nb[1] && v1->nb[2] == 4 * a->nb[1]);
    LOOM_CHECK(!loom_is_contiguous(v1));
    LOOM_CHECK(strcmp(v1->name, "a (view)") == 0);
    loom_tensor *v2 = loom_view_1d(ctx, v1, 4, 3 * sizeof(float)); /* row 2, elems 3..6 */
    LOOM_REQUIRE(v2 != NULL);
    LOOM_CHECK(v2->view_src == a); /* not v1 */
    LOOM_CHECK(v2->src[0] == v1);
    LOOM_CHECK_EQ_INT(v2->view_offs, 2 * a->nb[1] + 12);
    LOOM_CHECK((char *)v2->data == (char *)a->data + 2 * a->nb[1] + 12);
    /* values written through the owner are seen through the views */
    for (int64_t i1 = 0; i1 < 8; i1++)
        for (int64_t i0 = 0; i0 < 16; i0++)
            loom_set_f32_nd(a, i0, i1, 0, 0, (float)(i1 * 100 + i0));
    LOOM_CHECK(loom_get_f32_nd(v1, 5, 1, 0, 0) == 305.0f);
    LOOM_CHECK(loom_get_f32_nd(v2, 0, 0, 0, 0) == 203.0f);
    loom_tensor *r = loom_reshape_2d(ctx, v2, 2, 2);
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(r->view_src == a && r->op == LOOM_OP_RESHAPE);
    LOOM_CHECK(loom_get_f32_nd(r, 1, 1, 0, 0) == 206.0f);
    /* a view past the owner's end is refused */
    loom_clear_error();
    LOOM_CHECK(loom_view_2d(ctx, v1, 8, 7, a->nb[1], 0) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "past the 512 bytes of 'a'");
    LOOM_CHECK(loom_view_1d(ctx, a, 1, 512) == NULL);
    LOOM_CHECK(loom_view_1d(ctx, a, 1, 508) != NULL);
    LOOM_CHECK(loom_view_1d(ctx, a, 2, SIZE_MAX - 2) == NULL);
    /* a whole-tensor view keeps the layout */
    loom_tensor *vt = loom_view_tensor(ctx, v1);
    LOOM_REQUIRE(vt != NULL);
    LOOM_CHECK(loom_are_same_layout(vt, v1) && vt->view_src == a && vt->op == LOOM_OP_VIEW);
    LOOM_CHECK_EQ_INT(vt->view_offs, v1->view_offs);
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, contiguity_rules) {
    loom_ctx *ctx = new_ctx(1 << 16, true);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 4, 1, 3);
    LOOM_REQUIRE(a != NULL);
    /* a size-1 dimension's stride does not matter */
    a->nb[1] = 12345;
    LOOM_CHECK(loom_is_contiguous(a));
    a->nb[2] = 20;
    LOOM_CHECK(!loom_is_contiguous(a));
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4, 3);
    loom_tensor *c = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 2, 1);
    loom_tensor *d = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 3, 3);
    loom_tensor *e = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 4, 3);
    LOOM_REQUIRE(b && c && d && e);
    LOOM_CHECK(loom_can_repeat(c, b) && !loom_can_repeat(d, b) && !loom_can_repeat(b, c));
    LOOM_CHECK(loom_are_same_shape(b, e) && !loom_are_same_layout(b, e));
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, names_flags_params_describe) {
    loom_ctx *ctx = new_ctx(1 << 16, false);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 4, 2);
    LOOM_REQUIRE(t != NULL);
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    loom_set_name(t, longname);
    LOOM_CHECK_EQ_INT(strlen(loom_get_name(t)), LOOM_MAX_NAME - 1);
    loom_format_name(t, "blk.%d.attn_q", 7);
    LOOM_CHECK(strcmp(loom_get_name(t), "blk.7.attn_q") == 0);
    loom_set_input(t);
    loom_set_output(t);
    loom_set_param(t);
    LOOM_CHECK_EQ_INT(t->flags,
                      LOOM_TENSOR_FLAG_INPUT | LOOM_TENSOR_FLAG_OUTPUT | LOOM_TENSOR_FLAG_PARAM);
    loom_set_op_params_f32(t, 3, -2.5f);
    loom_set_op_params_i32(t, 4, -7);
    LOOM_CHECK(loom_get_op_params_f32(t, 3) == -2.5f);
    LOOM_CHECK_EQ_INT(loom_get_op_params_i32(t, 4), -7);
    char buf[128];
    loom_tensor_describe(t, buf, sizeof buf);
    LOOM_CHECK(strcmp(buf, "blk.7.attn_q [4, 2, 1, 1] f16") == 0);
    /* host access through the types */
    loom_set_f32_nd(t, 3, 1, 0, 0, 1.5f);
    LOOM_CHECK(loom_get_f32_nd(t, 3, 1, 0, 0) == 1.5f);
    uint16_t raw;
    memcpy(&raw, (char *)t->data + 3 * 2 + 8, 2);
    LOOM_CHECK_EQ_INT(raw, 0x3e00);
    loom_tensor *i = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 3);
    loom_tensor *bf = loom_new_tensor_1d(ctx, LOOM_TYPE_BF16, 3);
    LOOM_REQUIRE(i && bf);
    loom_set_f32_nd(i, 2, 0, 0, 0, -42.0f);
    LOOM_CHECK(((int32_t *)i->data)[2] == -42 && loom_get_f32_nd(i, 2, 0, 0, 0) == -42.0f);
    loom_set_f32_nd(bf, 1, 0, 0, 0, 3.0f);
    LOOM_CHECK(((uint16_t *)bf->data)[1] == 0x4040 && loom_get_f32_nd(bf, 1, 0, 0, 0) == 3.0f);
    loom_ctx_free(ctx);
}

LOOM_TEST(tensor, status_strings) {
    for (int s = 0; s < LOOM_STATUS_COUNT; s++) {
        const char *str = loom_status_str((loom_status)s);
        LOOM_CHECK(str && *str && strcmp(str, "unknown status") != 0);
        for (int r = 0; r < s; r++)
            LOOM_CHECK(strcmp(str, loom_status_str((loom_status)r)) != 0);
    }
    LOOM_CHECK(strcmp(loom_status_str(LOOM_ERR_NOMEM), "out of memory") == 0);
    LOOM_CHECK(strcmp(loom_status_str((loom_status)99), "unknown status") == 0);
    LOOM_CHECK(strcmp(loom_op_name(LOOM_OP_MUL_MAT), "MUL_MAT") == 0);
    LOOM_CHECK(strcmp(loom_op_name(LOOM_OP_FLASH_ATTN_EXT), "FLASH_ATTN_EXT") == 0);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        LOOM_CHECK(strcmp(loom_op_name((loom_op)op), "(invalid op)") != 0);
    LOOM_CHECK(strcmp(loom_unary_op_name(LOOM_UNARY_GELU), "GELU") == 0);
    LOOM_CHECK(loom_op_is_view(LOOM_OP_PERMUTE) && loom_op_is_view(LOOM_OP_NONE));
    LOOM_CHECK(!loom_op_is_view(LOOM_OP_CPY) && !loom_op_is_view(LOOM_OP_SET_ROWS));
}
