/*
 * Tests of the op rule table (splitstate/rules.c): every op of docs/ops.md with the states
 * it accepts, uneven and zero-size counts, and every refusal with its message. Tensors are
 * built with core's builders; leaf states come from a name table.
 */
#include "tests/splitstate/split_test_util.h"

#define F32 LOOM_TYPE_F32
#define I32 LOOM_TYPE_I32
#define M(n) st_kind(LOOM_SPLIT_MIRRORED, n)
#define P(n) st_kind(LOOM_SPLIT_PARTIAL, n)

/* ---------------------------------------------------------------- MUL_MAT */

LOOM_TEST(splitrules, mul_mat_column_and_row_parallel) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 4));
    loom_tensor *x = leaf_t(&f, "x", F32, M(4), 16, 3, 1, 1);
    loom_tensor *wq = leaf_t(&f, "wq", F32, ST_AX(1, 4, 3, 3, 2, 2), 16, 10, 1, 1);
    loom_tensor *wo = leaf_t(&f, "wo", F32, ST_AX(0, 4, 3, 3, 2, 2), 10, 16, 1, 1);
    loom_tensor *wm = leaf_t(&f, "wm", F32, M(4), 16, 16, 1, 1);
    loom_tensor *q = named(loom_mul_mat(f.ctx, wq, x), "q");
    CHECK_DERIVED(&f, q, ST_AX(0, 4, 3, 3, 2, 2)); /* column parallel keeps exact counts */
    loom_tensor *o = named(loom_mul_mat(f.ctx, wo, q), "o");
    CHECK_DERIVED(&f, o, P(4)); /* row parallel */
    loom_split_state s;
    LOOM_REQUIRE(loom_split_ctx_get(f.sc, o, true, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_MIRRORED); /* as its consumers see it */
    CHECK_DERIVED(&f, loom_mul_mat(f.ctx, wm, x), M(4));
    /* tokens split: a mirrored weight passes the split through */
    loom_tensor *xt = leaf_t(&f, "xt", F32, ST_AX(1, 4, 1, 1, 1, 0), 16, 3, 1, 1);
    CHECK_DERIVED(&f, loom_mul_mat(f.ctx, wm, xt), ST_AX(1, 4, 1, 1, 1, 0));
    /* batches split, a broadcast */
    loom_tensor *xb = leaf_t(&f, "xb", F32, ST_AX(2, 4, 2, 1, 1, 0), 16, 3, 4, 1);
    CHECK_DERIVED(&f, loom_mul_mat(f.ctx, wm, xb), ST_AX(2, 4, 2, 1, 1, 0));
    fx_free(&f);
}

LOOM_TEST(splitrules, mul_mat_gqa_batches) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* kq = k [D 4, n_kv 5, Hkv 2] x q [4, T 3, H 6]: 3 query heads per KV head */
    loom_tensor *k = leaf_t(&f, "k", F32, ST_AX(2, 2, 1, 1), 4, 5, 2, 1);
    loom_tensor *q = leaf_t(&f, "q", F32, ST_AX(2, 2, 3, 3), 4, 3, 6, 1);
    loom_tensor *q_bad = leaf_t(&f, "q_bad", F32, ST_AX(2, 2, 4, 2), 4, 3, 6, 1);
    loom_tensor *q_m = leaf_t(&f, "q_m", F32, M(2), 4, 3, 6, 1);
    CHECK_DERIVED(&f, named(loom_mul_mat(f.ctx, k, q), "kq"), ST_AX(2, 2, 3, 3));
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, k, q_bad), "kq_bad"),
                  "mul_mat 'kq_bad': a 'k' AXIS_2 [1,1] and b 'q_bad' AXIS_2 [4,2] are split "
                  "along axis 2 inconsistently (b has 3 matrices per matrix of a)");
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, k, q_m), "kq_m"),
                  "a 'k' AXIS_2 [1,1] is split along axis 2, so b 'q_m' MIRRORED must be split "
                  "along it too");
    loom_tensor *km = leaf_t(&f, "km", F32, M(2), 4, 5, 2, 1);
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, km, q), "kmq"),
                  "b 'q' AXIS_2 [3,3] is split along axis 2 but a 'km' MIRRORED has 2 "
                  "matrices along it; split a along axis 2 too");
    fx_free(&f);
}

LOOM_TEST(splitrules, mul_mat_refusals) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *x = leaf_t(&f, "x", F32, M(2), 8, 3, 1, 1);
    loom_tensor *xk = leaf_t(&f, "xk", F32, ST_AX(0, 2, 4, 4), 8, 3, 1, 1);
    loom_tensor *xr = leaf_t(&f, "xr", F32, ST_AX(1, 2, 2, 1), 8, 3, 1, 1);
    loom_tensor *wk = leaf_t(&f, "wk", F32, ST_AX(0, 2, 2, 6), 8, 6, 1, 1);
    loom_tensor *wr = leaf_t(&f, "wr", F32, ST_AX(1, 2, 3, 3), 8, 6, 1, 1);
    loom_tensor *wm = leaf_t(&f, "wm", F32, M(2), 8, 6, 1, 1);
    /* K-split weight x whole activations: each device takes its K-slice of b: partial */
    CHECK_DERIVED(&f, named(loom_mul_mat(f.ctx, wk, x), "down"), P(2));
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, wk, xk), "down2"),
                  "the contraction dimension K is split differently in a 'wk' AXIS_0 [2,6] and "
                  "b 'xk' AXIS_0 [4,4]");
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, wm, xk), "up"),
                  "b 'xk' AXIS_0 [4,4] is split along K (axis 0), so a 'wm' MIRRORED must be "
                  "split along K the same way");
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, wr, xr), "up2"),
                  "a 2D split (both operands split on their non-contracted axes) is not possible");
    fx_free(&f);
}

LOOM_TEST(splitrules, mul_mat_partial_leafs) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *x = leaf_t(&f, "x", F32, M(2), 8, 3, 1, 1);
    loom_tensor *wp = leaf_t(&f, "wp", F32, P(2), 8, 6, 1, 1);
    loom_tensor *xp = leaf_t(&f, "xp", F32, P(2), 8, 3, 1, 1);
    CHECK_DERIVED(&f, loom_mul_mat(f.ctx, wp, x), P(2)); /* linear in a */
    CHECK_REFUSED(&f, named(loom_mul_mat(f.ctx, wp, xp), "pp"),
                  "mul_mat 'pp': cannot multiply 'wp' PARTIAL by 'xp' PARTIAL");
    fx_free(&f);
}

/* ---------------------------------------------------------------- MUL_MAT_ID */

LOOM_TEST(splitrules, mul_mat_id) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* experts [K 8, M 6, E 4]; b [8, U 2, T 3]; ids [2, 3] */
    loom_tensor *b = leaf_t(&f, "b", F32, M(2), 8, 2, 3, 1);
    loom_tensor *ids = leaf_t(&f, "ids", I32, M(2), 2, 3, 1, 1);
    loom_tensor *up = leaf_t(&f, "up_exps", F32, ST_AX(1, 2, 4, 2), 8, 6, 4, 1);
    loom_tensor *up_out = named(loom_mul_mat_id(f.ctx, up, b, ids), "up_out");
    CHECK_DERIVED(&f, up_out, ST_AX(0, 2, 4, 2));
    loom_tensor *down = leaf_t(&f, "down_exps", F32, ST_AX(0, 2, 4, 2), 6, 8, 4, 1);
    CHECK_DERIVED(&f, loom_mul_mat_id(f.ctx, down, up_out, ids), P(2));
    /* expert parallel: experts split along axis 2 -> a partial sum */
    loom_tensor *ep = leaf_t(&f, "ep_exps", F32, ST_AX(2, 2, 3, 1), 8, 6, 4, 1);
    CHECK_DERIVED(&f, loom_mul_mat_id(f.ctx, ep, b, ids), P(2));
    /* tokens split */
    loom_tensor *bt = leaf_t(&f, "bt", F32, ST_AX(2, 2, 2, 1), 8, 2, 3, 1);
    loom_tensor *idt = leaf_t(&f, "idt", I32, ST_AX(1, 2, 2, 1), 2, 3, 1, 1);
    loom_tensor *em = leaf_t(&f, "em", F32, M(2), 8, 6, 4, 1);
    CHECK_DERIVED(&f, loom_mul_mat_id(f.ctx, em, bt, idt), ST_AX(2, 2, 2, 1));
    loom_tensor *ek = leaf_t(&f, "ek", F32, ST_AX(0, 2, 4, 4), 8, 6, 4, 1);
    CHECK_REFUSED(&f, named(loom_mul_mat_id(f.ctx, ek, b, ids), "moe_k"),
                  "mul_mat_id 'moe_k': the experts 'ek' AXIS_0 [4,4] are split along K (axis 0), "
                  "so b 'b' MIRRORED must be split along K the same way");
    CHECK_REFUSED(&f, named(loom_mul_mat_id(f.ctx, up, b, idt), "moe_ids"),
                  "the ids 'idt' AXIS_1 [2,1] are split");
    fx_free(&f);
}

/* ---------------------------------------------------------------- per-row ops */

LOOM_TEST(splitrules, per_row_ops_pass_rows_refuse_the_row_axis) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *x = leaf_t(&f, "x", F32, ST_AX(1, 2, 4, 2), 8, 6, 1, 1);
    loom_tensor *xr = leaf_t(&f, "xr", F32, ST_AX(0, 2, 4, 4), 8, 6, 1, 1);
    const loom_split_state rows = ST_AX(1, 2, 4, 2);
    CHECK_DERIVED(&f, loom_norm(f.ctx, x, 1e-5f), rows);
    CHECK_DERIVED(&f, loom_rms_norm(f.ctx, x, 1e-5f), rows);
    CHECK_DERIVED(&f, loom_soft_max(f.ctx, x), rows);
    CHECK_DERIVED(&f, loom_argsort(f.ctx, x, LOOM_SORT_DESC), rows);
    CHECK_DERIVED(&f, loom_top_k(f.ctx, x, 3), rows);
    CHECK_DERIVED(&f, loom_sum_rows(f.ctx, x), rows);
    CHECK_DERIVED(&f, loom_mean(f.ctx, x), rows);
    CHECK_DERIVED(&f, loom_argmax(f.ctx, x), ST_AX(0, 2, 4, 2)); /* [ne1] */
    CHECK_REFUSED(&f, named(loom_rms_norm(f.ctx, xr, 1e-5f), "attn_norm-0"),
                  "rms_norm 'attn_norm-0': cannot split along axis 0 (the normalised row)");
    CHECK_REFUSED(&f, named(loom_norm(f.ctx, xr, 1e-5f), "n"),
                  "norm 'n': cannot split along axis 0 (the normalised row)");
    CHECK_REFUSED(&f, named(loom_soft_max(f.ctx, xr), "sm"),
                  "soft_max 'sm': cannot split along axis 0 (the softmax row)");
    CHECK_REFUSED(&f, named(loom_argsort(f.ctx, xr, LOOM_SORT_ASC), "as"),
                  "argsort 'as': cannot split along axis 0 (the sorted row)");
    CHECK_REFUSED(&f, named(loom_top_k(f.ctx, xr, 2), "tk"),
                  "top_k 'tk': cannot split along axis 0 (the row top_k selects from)");
    CHECK_REFUSED(&f, named(loom_argmax(f.ctx, xr), "am"),
                  "argmax 'am': cannot split along axis 0 (the row argmax searches)");
    CHECK_REFUSED(&f, named(loom_sum_rows(f.ctx, xr), "sr"),
                  "sum_rows 'sr': cannot split along axis 0 (the summed row)");
    CHECK_REFUSED(&f, named(loom_mean(f.ctx, xr), "mn"),
                  "mean 'mn': cannot split along axis 0 (the averaged row)");
    /* sums of a partial leaf stay partial; a norm of one is refused */
    loom_tensor *xp = leaf_t(&f, "xp", F32, P(2), 8, 6, 1, 1);
    CHECK_DERIVED(&f, loom_sum_rows(f.ctx, xp), P(2));
    CHECK_DERIVED(&f, loom_mean(f.ctx, xp), P(2));
    CHECK_REFUSED(&f, named(loom_rms_norm(f.ctx, xp, 1e-5f), "np"),
                  "rms_norm 'np': source 'xp' PARTIAL is a sum over devices and rms_norm is not "
                  "linear");
    fx_free(&f);
}

LOOM_TEST(splitrules, soft_max_mask_sinks_alibi) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* scores [n_kv 6, T 3, H 4] split on heads */
    loom_tensor *kq = leaf_t(&f, "kq", F32, ST_AX(2, 2, 3, 1), 6, 3, 4, 1);
    loom_tensor *mask = leaf_t(&f, "mask", F32, M(2), 6, 3, 1, 1);
    loom_tensor *sinks = leaf_t(&f, "sinks", F32, ST_AX(0, 2, 3, 1), 4, 1, 1, 1);
    loom_tensor *sinks_m = leaf_t(&f, "sinks_m", F32, M(2), 4, 1, 1, 1);
    const loom_split_state heads = ST_AX(2, 2, 3, 1);
    CHECK_DERIVED(&f, loom_soft_max_ext(f.ctx, kq, mask, NULL, 0.5f, 0.0f), heads);
    CHECK_DERIVED(&f, loom_soft_max_ext(f.ctx, kq, mask, sinks, 0.5f, 0.0f), heads);
    CHECK_REFUSED(&f, named(loom_soft_max_ext(f.ctx, kq, mask, sinks_m, 0.5f, 0.0f), "sm_s"),
                  "the scores 'kq' AXIS_2 [3,1] are split on heads, so the sinks 'sinks_m' "
                  "MIRRORED must be split along axis 0 the same way");
    CHECK_REFUSED(&f, named(loom_soft_max_ext(f.ctx, kq, mask, NULL, 0.5f, 8.0f), "alibi"),
                  "soft_max 'alibi': ALiBi (max_bias 8) slopes depend on the global head index");
    loom_tensor *mask_h = leaf_t(&f, "mask_h", F32, M(2), 6, 3, 4, 1);
    CHECK_REFUSED(&f, named(loom_soft_max_ext(f.ctx, kq, mask_h, NULL, 0.5f, 0.0f), "sm_h"),
                  "but the mask 'mask_h' MIRRORED is not broadcast along it (ne[2] = 4)");
    /* queries split: the mask rows must follow */
    loom_tensor *kq_t = leaf_t(&f, "kq_t", F32, ST_AX(1, 2, 2, 1), 6, 3, 4, 1);
    loom_tensor *mask_t = leaf_t(&f, "mask_t", F32, ST_AX(1, 2, 2, 1), 6, 3, 1, 1);
    CHECK_DERIVED(&f, loom_soft_max_ext(f.ctx, kq_t, mask_t, NULL, 0.5f, 0.0f), ST_AX(1, 2, 2, 1));
    CHECK_REFUSED(&f, named(loom_soft_max_ext(f.ctx, kq_t, mask, NULL, 0.5f, 0.0f), "sm_t"),
                  "the scores 'kq_t' AXIS_1 [2,1] are split along axis 1 (the queries), so the "
                  "mask 'mask' MIRRORED must be split along axis 1 the same way");
    fx_free(&f);
}

/* ---------------------------------------------------------------- elementwise */

LOOM_TEST(splitrules, binary_ops_same_split_or_broadcast) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 3));
    const loom_split_state cols = ST_AX(1, 3, 2, 2, 0);
    loom_tensor *a = leaf_t(&f, "a", F32, cols, 16, 4, 1, 1);
    loom_tensor *b = leaf_t(&f, "b", F32, cols, 16, 4, 1, 1);
    loom_tensor *bias = leaf_t(&f, "bias", F32, M(3), 16, 1, 1, 1);
    loom_tensor *full = leaf_t(&f, "full", F32, M(3), 16, 4, 1, 1);
    loom_tensor *other = leaf_t(&f, "other", F32, ST_AX(1, 3, 1, 1, 2), 16, 4, 1, 1);
    CHECK_DERIVED(&f, loom_add(f.ctx, a, b), cols);
    CHECK_DERIVED(&f, loom_sub(f.ctx, a, b), cols);
    CHECK_DERIVED(&f, loom_mul(f.ctx, a, b), cols);
    CHECK_DERIVED(&f, loom_div(f.ctx, a, b), cols);
    CHECK_DERIVED(&f, loom_add(f.ctx, a, bias), cols); /* broadcast along the split axis */
    CHECK_DERIVED(&f, loom_mul(f.ctx, full, full), M(3));
    CHECK_REFUSED(&f, named(loom_add(f.ctx, a, full), "a_full"),
                  "add 'a_full': a 'a' AXIS_1 [2,2,0] is split along axis 1 but b 'full' "
                  "MIRRORED has ne[1] = 4; b must be split the same way (or broadcast along axis "
                  "1)");
    CHECK_REFUSED(&f, named(loom_mul(f.ctx, a, other), "a_other"),
                  "mul 'a_other': a 'a' AXIS_1 [2,2,0] and b 'other' AXIS_1 [1,1,2] are split "
                  "differently");
    CHECK_REFUSED(&f, named(loom_sub(f.ctx, full, a), "full_a"),
                  "sub 'full_a': a 'full' MIRRORED is not split but b 'a' AXIS_1 [2,2,0] is");
    fx_free(&f);
}

LOOM_TEST(splitrules, partial_operands_only_in_linear_combinations) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 4));
    loom_tensor *p = leaf_t(&f, "p", F32, P(4), 8, 2, 1, 1);
    loom_tensor *q = leaf_t(&f, "q", F32, P(4), 8, 2, 1, 1);
    loom_tensor *m = leaf_t(&f, "m", F32, M(4), 8, 2, 1, 1);
    CHECK_DERIVED(&f, loom_add(f.ctx, p, q), P(4));
    CHECK_DERIVED(&f, loom_sub(f.ctx, p, q), P(4));
    CHECK_DERIVED(&f, loom_mul(f.ctx, p, m), P(4));
    CHECK_DERIVED(&f, loom_mul(f.ctx, m, p), P(4));
    CHECK_DERIVED(&f, loom_div(f.ctx, p, m), P(4));
    CHECK_REFUSED(&f, named(loom_add(f.ctx, m, p), "mix"),
                  "add 'mix': adding 'p' PARTIAL to 'm' MIRRORED would count the MIRRORED "
                  "operand 4 times");
    CHECK_REFUSED(&f, named(loom_div(f.ctx, m, p), "mdivp"),
                  "dividing by 'p' PARTIAL, a sum over devices, is not linear");
    CHECK_REFUSED(&f, named(loom_mul(f.ctx, p, q), "pq"),
                  "'p' PARTIAL and 'q' PARTIAL are both sums over devices");
    /* unary ops */
    CHECK_DERIVED(&f, loom_scale(f.ctx, p, 2.0f), P(4));
    CHECK_REFUSED(&f, named(loom_scale_bias(f.ctx, p, 2.0f, 0.5f), "sb"),
                  "a scale with a bias (0.5) is not linear");
    CHECK_REFUSED(&f, named(loom_silu(f.ctx, p), "silu_p"),
                  "unary 'silu_p': source 'p' PARTIAL is a sum over devices");
    CHECK_REFUSED(&f, named(loom_sqr(f.ctx, p), "sqr_p"), "sqr 'sqr_p': source 'p' PARTIAL");
    CHECK_DERIVED(&f, loom_fill(f.ctx, p, 1.0f), M(4)); /* the values are not read */
    /* a computed partial (a row-parallel matmul) is reduced before use: the add is fine */
    loom_tensor *wo = leaf_t(&f, "wo", F32, ST_AX(0, 4, 2, 2, 2, 2), 8, 8, 1, 1);
    loom_tensor *h = leaf_t(&f, "h", F32, ST_AX(0, 4, 2, 2, 2, 2), 8, 2, 1, 1);
    loom_tensor *o = loom_mul_mat(f.ctx, wo, h);
    CHECK_DERIVED(&f, o, P(4));
    CHECK_DERIVED(&f, loom_add(f.ctx, m, o), M(4));
    fx_free(&f);
}

LOOM_TEST(splitrules, unary_family_passes_splits) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    const loom_split_state s = ST_AX(0, 2, 6, 2);
    loom_tensor *x = leaf_t(&f, "x", F32, s, 8, 3, 1, 1);
    CHECK_DERIVED(&f, loom_silu(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_gelu(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_relu(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_sqr(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_sqrt(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_clamp(f.ctx, x, -1.0f, 1.0f), s);
    CHECK_DERIVED(&f, loom_scale_bias(f.ctx, x, 2.0f, 1.0f), s);
    CHECK_DERIVED(&f, loom_fill(f.ctx, x, 3.0f), s);
    CHECK_DERIVED(&f, loom_dup(f.ctx, x), s);
    CHECK_DERIVED(&f, loom_cont(f.ctx, x), s);
    fx_free(&f);
}

LOOM_TEST(splitrules, add_id_expert_biases) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* a [n 6, U 2, T 3] + b [6, E 4][ids [2, 3]] */
    const loom_split_state rows = ST_AX(0, 2, 4, 2);
    loom_tensor *a = leaf_t(&f, "a", F32, rows, 6, 2, 3, 1);
    loom_tensor *b = leaf_t(&f, "exp_bias", F32, rows, 6, 4, 1, 1);
    loom_tensor *bm = leaf_t(&f, "bm", F32, M(2), 6, 4, 1, 1);
    loom_tensor *bp = leaf_t(&f, "bp", F32, P(2), 6, 4, 1, 1);
    loom_tensor *ap = leaf_t(&f, "ap", F32, P(2), 6, 2, 3, 1);
    loom_tensor *am = leaf_t(&f, "am", F32, M(2), 6, 2, 3, 1);
    loom_tensor *ids = leaf_t(&f, "ids", I32, M(2), 2, 3, 1, 1);
    CHECK_DERIVED(&f, loom_add_id(f.ctx, a, b, ids), rows);
    CHECK_DERIVED(&f, loom_add_id(f.ctx, am, bm, ids), M(2));
    CHECK_DERIVED(&f, loom_add_id(f.ctx, ap, bp, ids), P(2));
    CHECK_REFUSED(&f, named(loom_add_id(f.ctx, a, bm, ids), "rows_bm"),
                  "add_id 'rows_bm': a 'a' AXIS_0 [4,2] is split along axis 0, so the bias 'bm' "
                  "MIRRORED must be split along axis 0 the same way");
    /* the reference's silent bug: a MIRRORED (reduced) output plus a PARTIAL bias */
    CHECK_REFUSED(&f, named(loom_add_id(f.ctx, am, bp, ids), "moe_out"),
                  "adding 'bp' PARTIAL to 'am' MIRRORED would count the MIRRORED operand 2 "
                  "times; make the bias MIRRORED");
    /* tokens split: ids follow */
    loom_tensor *at = leaf_t(&f, "at", F32, ST_AX(2, 2, 1, 2), 6, 2, 3, 1);
    loom_tensor *idt = leaf_t(&f, "idt", I32, ST_AX(1, 2, 1, 2), 2, 3, 1, 1);
    CHECK_DERIVED(&f, loom_add_id(f.ctx, at, bm, idt), ST_AX(2, 2, 1, 2));
    CHECK_REFUSED(&f, named(loom_add_id(f.ctx, at, bm, ids), "at_ids"),
                  "so the ids 'ids' MIRRORED must be split along axis 1 the same way");
    fx_free(&f);
}

LOOM_TEST(splitrules, rope) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *x = leaf_t(&f, "x", F32, ST_AX(1, 2, 3, 1), 4, 4, 3, 1);
    loom_tensor *pos = leaf_t(&f, "pos", I32, M(2), 3, 1, 1, 1);
    loom_tensor *ff = leaf_t(&f, "ff", F32, M(2), 2, 1, 1, 1);
    CHECK_DERIVED(&f, loom_rope_ext(f.ctx, x, pos, NULL, 4, LOOM_ROPE_TYPE_NEOX, 1e4f, 1.0f),
                  ST_AX(1, 2, 3, 1));
    CHECK_DERIVED(&f, loom_rope_ext(f.ctx, x, pos, ff, 4, LOOM_ROPE_TYPE_NORMAL, 1e4f, 1.0f),
                  ST_AX(1, 2, 3, 1));
    loom_tensor *x0 = leaf_t(&f, "x0", F32, ST_AX(0, 2, 2, 2), 4, 4, 3, 1);
    CHECK_REFUSED(&f, named(loom_rope_ext(f.ctx, x0, pos, NULL, 4, 0, 1e4f, 1.0f), "Qcur-0"),
                  "rope 'Qcur-0': cannot split along axis 0 (the rotated head dimension)");
    loom_tensor *xt = leaf_t(&f, "xt", F32, ST_AX(2, 2, 2, 1), 4, 4, 3, 1);
    loom_tensor *pos_t = leaf_t(&f, "pos_t", I32, ST_AX(0, 2, 2, 1), 3, 1, 1, 1);
    CHECK_DERIVED(&f, loom_rope_ext(f.ctx, xt, pos_t, NULL, 4, 0, 1e4f, 1.0f), ST_AX(2, 2, 2, 1));
    CHECK_REFUSED(&f, named(loom_rope_ext(f.ctx, xt, pos, NULL, 4, 0, 1e4f, 1.0f), "rt"),
                  "'xt' AXIS_2 [2,1] is split along axis 2 (the tokens), so the positions 'pos' "
                  "MIRRORED must be split along axis 0 the same way");
    loom_tensor *xp = leaf_t(&f, "xp", F32, P(2), 4, 4, 3, 1);
    CHECK_DERIVED(&f, loom_rope_ext(f.ctx, xp, pos, NULL, 4, 0, 1e4f, 1.0f), P(2));
    fx_free(&f);
}

/* ---------------------------------------------------------------- attention */

LOOM_TEST(splitrules, flash_attn_heads_and_gqa) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 4));
    /* q [D 4, Nq 3, H 6], k/v [4, Nkv 5, Hk 2]: fewer KV heads than devices */
    loom_tensor *q = leaf_t(&f, "q", F32, ST_AX(2, 4, 3, 3, 0, 0), 4, 3, 6, 1);
    loom_tensor *k = leaf_t(&f, "k", F32, ST_AX(2, 4, 1, 1, 0, 0), 4, 5, 2, 1);
    loom_tensor *v = leaf_t(&f, "v", F32, ST_AX(2, 4, 1, 1, 0, 0), 4, 5, 2, 1);
    loom_tensor *mask = leaf_t(&f, "mask", F32, M(4), 5, 3, 1, 1);
    loom_tensor *fa = named(loom_flash_attn_ext(f.ctx, q, k, v, mask, NULL, 0.5f, 0, 0), "fa");
    CHECK_DERIVED(&f, fa, ST_AX(1, 4, 3, 3, 0, 0)); /* [Dv, H, Nq]: heads on axis 1 */
    loom_tensor *sinks = leaf_t(&f, "sinks", F32, ST_AX(0, 4, 3, 3, 0, 0), 6, 1, 1, 1);
    CHECK_DERIVED(&f, loom_flash_attn_ext(f.ctx, q, k, v, mask, sinks, 0.5f, 0, 0),
                  ST_AX(1, 4, 3, 3, 0, 0));
    loom_tensor *sinks_m = leaf_t(&f, "sinks_m", F32, M(4), 6, 1, 1, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q, k, v, mask, sinks_m, 0.5f, 0, 0), "fs"),
                  "the sinks 'sinks_m' MIRRORED must be split along axis 0 like the heads of q");
    loom_tensor *q_bad = leaf_t(&f, "q_bad", F32, ST_AX(2, 4, 2, 4, 0, 0), 4, 3, 6, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q_bad, k, v, mask, NULL, 0.5f, 0, 0), "fb"),
                  "flash_attn_ext 'fb': q 'q_bad' AXIS_2 [2,4,0,0] and k 'k' AXIS_2 [1,1,0,0] "
                  "split the heads inconsistently: with 3 query heads per KV head every device "
                  "needs 3 times its KV heads");
    loom_tensor *km = leaf_t(&f, "km", F32, M(4), 4, 5, 2, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q, km, km, mask, NULL, 0.5f, 0, 0), "fm"),
                  "q 'q' AXIS_2 [3,3,0,0] is split on heads (axis 2), so k 'km' MIRRORED must be "
                  "split on its heads too");
    loom_tensor *mask_s = leaf_t(&f, "mask_s", F32, ST_AX(1, 4, 1, 1, 1, 0), 5, 3, 1, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q, k, v, mask_s, NULL, 0.5f, 0, 0), "fk"),
                  "the mask 'mask_s' AXIS_1 [1,1,1,0] must be MIRRORED");
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q, k, v, mask, NULL, 0.5f, 8.0f, 0), "fal"),
                  "ALiBi (max_bias 8) slopes depend on the global head index");
    loom_tensor *v_other = leaf_t(&f, "v_other", F32, ST_AX(2, 4, 2, 0, 0, 0), 4, 5, 2, 1);
    CHECK_REFUSED(&f,
                  named(loom_flash_attn_ext(f.ctx, q, k, v_other, mask, NULL, 0.5f, 0, 0), "fv"),
                  "k 'k' AXIS_2 [1,1,0,0] and v 'v_other' AXIS_2 [2,0,0,0] must be split alike");
    fx_free(&f);
}

LOOM_TEST(splitrules, flash_attn_queries_and_refusals) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *q = leaf_t(&f, "q", F32, ST_AX(1, 2, 2, 1), 4, 3, 2, 1);
    loom_tensor *k = leaf_t(&f, "k", F32, M(2), 4, 5, 2, 1);
    loom_tensor *mask = leaf_t(&f, "mask", F32, ST_AX(1, 2, 2, 1), 5, 3, 1, 1);
    loom_tensor *mask_m = leaf_t(&f, "mask_m", F32, M(2), 5, 3, 1, 1);
    CHECK_DERIVED(&f, loom_flash_attn_ext(f.ctx, q, k, k, mask, NULL, 0.5f, 0, 0),
                  ST_AX(2, 2, 2, 1));
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q, k, k, mask_m, NULL, 0.5f, 0, 0), "fq"),
                  "q 'q' AXIS_1 [2,1] is split on queries, so the mask 'mask_m' MIRRORED must be "
                  "split along axis 1 the same way");
    loom_tensor *q0 = leaf_t(&f, "q0", F32, ST_AX(0, 2, 2, 2), 4, 3, 2, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, q0, k, k, NULL, NULL, 0.5f, 0, 0), "f0"),
                  "cannot split q along axis 0 (the head dimension of the dot products)");
    loom_tensor *qm = leaf_t(&f, "qm", F32, M(2), 4, 3, 2, 1);
    loom_tensor *ks = leaf_t(&f, "ks", F32, ST_AX(2, 2, 1, 1), 4, 5, 2, 1);
    /* whole queries (copied in from another backend): each device reads its heads' */
    CHECK_DERIVED(&f, named(loom_flash_attn_ext(f.ctx, qm, ks, ks, NULL, NULL, 0.5f, 0, 0), "fq2"),
                  ST_AX(1, 2, 1, 1));
    loom_tensor *sk = leaf_t(&f, "sk", F32, M(2), 2, 1, 1, 1);
    CHECK_REFUSED(&f, named(loom_flash_attn_ext(f.ctx, qm, ks, ks, NULL, sk, 0.5f, 0, 0), "fq3"),
                  "q 'qm' MIRRORED is not split but k 'ks' AXIS_2 [1,1] is");
    CHECK_DERIVED(&f, loom_flash_attn_ext(f.ctx, qm, k, k, mask_m, NULL, 0.5f, 0, 0), M(2));
    fx_free(&f);
}

/* ---------------------------------------------------------------- rows */

LOOM_TEST(splitrules, get_rows) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *emb = leaf_t(&f, "token_embd", F32, ST_AX(0, 2, 4, 4), 8, 10, 1, 1);
    loom_tensor *ids = leaf_t(&f, "ids", I32, M(2), 3, 1, 1, 1);
    CHECK_DERIVED(&f, loom_get_rows(f.ctx, emb, ids), ST_AX(0, 2, 4, 4));
    loom_tensor *vocab = leaf_t(&f, "vocab_split", F32, ST_AX(1, 2, 5, 5), 8, 10, 1, 1);
    CHECK_REFUSED(&f, named(loom_get_rows(f.ctx, vocab, ids), "inp_embd"),
                  "get_rows 'inp_embd': cannot gather rows from 'vocab_split' AXIS_1 [5,5], split "
                  "along axis 1 (the rows)");
    loom_tensor *embm = leaf_t(&f, "embm", F32, M(2), 8, 10, 1, 1);
    loom_tensor *ids_t = leaf_t(&f, "ids_t", I32, ST_AX(0, 2, 2, 1), 3, 1, 1, 1);
    CHECK_DERIVED(&f, loom_get_rows(f.ctx, embm, ids_t), ST_AX(1, 2, 2, 1));
    loom_tensor *embp = leaf_t(&f, "embp", F32, P(2), 8, 10, 1, 1);
    CHECK_DERIVED(&f, loom_get_rows(f.ctx, embp, ids), P(2));
    fx_free(&f);
}

LOOM_TEST(splitrules, set_rows_kv_cache_writes) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    const loom_split_state heads = ST_AX(0, 2, 4, 4);
    loom_tensor *cache = leaf_t(&f, "cache_k_l0", F32, heads, 8, 10, 1, 1);
    loom_tensor *k = leaf_t(&f, "k_cur", F32, heads, 8, 3, 1, 1);
    loom_tensor *km = leaf_t(&f, "k_m", F32, M(2), 8, 3, 1, 1);
    loom_tensor *idx = leaf_t(&f, "kv_idxs", I32, M(2), 3, 1, 1, 1);
    CHECK_DERIVED(&f, loom_set_rows(f.ctx, cache, k, idx), heads);
    /* whole rows (computed elsewhere and copied in): each device writes its part */
    CHECK_DERIVED(&f, named(loom_set_rows(f.ctx, cache, km, idx), "k_store"), heads);
    /* into a view of the cache: the view's part of the split */
    loom_tensor *half = loom_view_2d(f.ctx, cache, 8, 5, cache->nb[1], 5 * cache->nb[1]);
    CHECK_DERIVED(&f, loom_set_rows(f.ctx, half, k, idx), heads);
    loom_tensor *cache_m = leaf_t(&f, "cache_m", F32, M(2), 8, 10, 1, 1);
    CHECK_DERIVED(&f, loom_set_rows(f.ctx, cache_m, km, idx), M(2));
    CHECK_REFUSED(&f, named(loom_set_rows(f.ctx, cache_m, k, idx), "k_into_m"),
                  "writes 'k_cur' AXIS_0 [4,4] into the MIRRORED destination 'cache_m' MIRRORED");
    loom_tensor *cache_r = leaf_t(&f, "cache_r", F32, ST_AX(1, 2, 5, 5), 8, 10, 1, 1);
    CHECK_REFUSED(&f, named(loom_set_rows(f.ctx, cache_r, k, idx), "k_rows"),
                  "cannot write rows into 'cache_r' AXIS_1 [5,5], split along axis 1 (the rows "
                  "being written)");
    /* a destination without a state of its own follows the rows */
    loom_tensor *scratch = leaf_t(&f, "scratch", F32, st_kind(LOOM_SPLIT_NONE, 2), 8, 10, 1, 1);
    CHECK_DERIVED(&f, loom_set_rows(f.ctx, scratch, k, idx), heads);
    fx_free(&f);
}

/* ---------------------------------------------------------------- copies */

LOOM_TEST(splitrules, cpy_cont_cast) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *a = leaf_t(&f, "a", F32, ST_AX(1, 2, 3, 3), 4, 6, 1, 1);
    loom_tensor *dst = leaf_t(&f, "dst", F32, st_kind(LOOM_SPLIT_NONE, 2), 24, 1, 1, 1);
    CHECK_DERIVED(&f, loom_cpy(f.ctx, a, dst), ST_AX(0, 2, 12, 12)); /* row-major order */
    loom_tensor *dst_m = leaf_t(&f, "dst_m", F32, M(2), 24, 1, 1, 1);
    CHECK_REFUSED(&f, named(loom_cpy(f.ctx, a, dst_m), "to_m"),
                  "cpy 'to_m': copies 'a' AXIS_1 [3,3] (AXIS_0 [12,12] in the destination's "
                  "shape) into 'dst_m' MIRRORED; the destination must be distributed the same way");
    loom_tensor *dst_s = leaf_t(&f, "dst_s", F32, ST_AX(0, 2, 12, 12), 24, 1, 1, 1);
    CHECK_DERIVED(&f, loom_cpy(f.ctx, a, dst_s), ST_AX(0, 2, 12, 12));
    /* casts: a CPY into a new tensor of the result's own */
    loom_tensor *w = leaf_t(&f, "w", F32, ST_AX(0, 2, 32, 32), 64, 2, 1, 1);
    CHECK_DERIVED(&f, loom_cast(f.ctx, w, LOOM_TYPE_Q4_0), ST_AX(0, 2, 32, 32));
    loom_tensor *w2 = leaf_t(&f, "w2", F32, ST_AX(0, 2, 16, 48), 64, 2, 1, 1);
    CHECK_DERIVED(&f, loom_cast(f.ctx, w2, LOOM_TYPE_F16), ST_AX(0, 2, 16, 48));
    CHECK_REFUSED(&f, named(loom_cast(f.ctx, w2, LOOM_TYPE_Q4_0), "w2_cast"),
                  "cpy 'w2_cast': the result would be AXIS_0 [16,48], but a q4_0 row splits "
                  "only at 32-element block boundaries");
    /* a leaf without a state used as an ordinary operand */
    loom_tensor *none = leaf_t(&f, "nostate", F32, st_kind(LOOM_SPLIT_NONE, 2), 4, 6, 1, 1);
    CHECK_REFUSED(&f, named(loom_add(f.ctx, a, none), "a_none"),
                  "add 'a_none': source 'nostate' has no split state (NONE)");
    fx_free(&f);
}

LOOM_TEST(splitrules, concat) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    const loom_split_state sa = ST_AX(0, 2, 2, 2), sb = ST_AX(0, 2, 1, 3);
    loom_tensor *a = leaf_t(&f, "a", F32, sa, 4, 3, 1, 1);
    loom_tensor *b = leaf_t(&f, "b", F32, sb, 4, 3, 1, 1);
    loom_tensor *a2 = leaf_t(&f, "a2", F32, sa, 4, 3, 1, 1);
    loom_tensor *m = leaf_t(&f, "m", F32, M(2), 4, 3, 1, 1);
    /* along the split axis: a's pieces then b's, per device */
    loom_tensor *c0 = loom_concat(f.ctx, a, b, 0);
    loom_split_state s0 = state_of(&f, c0);
    for (int64_t g = 0; g < 8; g++) {
        const loom_split_state *src = g < 4 ? &sa : &sb;
        LOOM_CHECK_EQ_INT(oracle_owner(&s0, g, NULL), oracle_owner(src, g % 4, NULL));
    }
    /* and device 0 holds a's 2 elements before b's 1 */
    int64_t l = -1;
    LOOM_CHECK_EQ_INT(oracle_owner(&s0, 4, &l), 0);
    LOOM_CHECK_EQ_INT(l, 2);
    CHECK_DERIVED(&f, loom_concat(f.ctx, a, a2, 1), sa);
    CHECK_REFUSED(&f, named(loom_concat(f.ctx, a, b, 1), "cat1"),
                  "concat 'cat1': 'a' AXIS_0 [2,2] and 'b' AXIS_0 [1,3] are split differently");
    CHECK_REFUSED(&f, named(loom_concat(f.ctx, a, m, 1), "catm"),
                  "cannot concatenate 'a' AXIS_0 [2,2] and 'm' MIRRORED along axis 1");
    CHECK_DERIVED(&f, loom_concat(f.ctx, m, m, 0), M(2));
    fx_free(&f);
}

LOOM_TEST(splitrules, glu_split_and_fused) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    const loom_split_state s = ST_AX(0, 2, 3, 1);
    loom_tensor *gate = leaf_t(&f, "gate", F32, s, 4, 3, 1, 1);
    loom_tensor *up = leaf_t(&f, "up", F32, s, 4, 3, 1, 1);
    loom_tensor *up2 = leaf_t(&f, "up2", F32, ST_AX(0, 2, 2, 2), 4, 3, 1, 1);
    CHECK_DERIVED(&f, loom_swiglu_split(f.ctx, gate, up), s);
    CHECK_DERIVED(&f, loom_glu_split(f.ctx, gate, up, LOOM_GLU_GEGLU), s);
    CHECK_REFUSED(&f, named(loom_swiglu_split(f.ctx, gate, up2), "ffn_act"),
                  "glu 'ffn_act': 'gate' AXIS_0 [3,1] and 'up2' AXIS_0 [2,2] are split "
                  "differently");
    /* fused [x | g]: each half split alike, as two segments */
    loom_split_state fused;
    loom_split_state_init(&fused, LOOM_SPLIT_AXIS_0, 2);
    ST_ADD(&fused, 1, 3, 1);
    ST_ADD(&fused, 1, 3, 1);
    loom_tensor *xg = leaf_t(&f, "gate_up", F32, fused, 8, 3, 1, 1);
    CHECK_DERIVED(&f, loom_glu(f.ctx, xg, LOOM_GLU_SWIGLU, false), s);
    CHECK_DERIVED(&f, loom_glu(f.ctx, xg, LOOM_GLU_SWIGLU, true), s);
    loom_tensor *even = leaf_t(&f, "gate_up_even", F32, ST_AX(0, 2, 4, 4), 8, 3, 1, 1);
    CHECK_REFUSED(&f, named(loom_glu(f.ctx, even, LOOM_GLU_SWIGLU, false), "fused"),
                  "glu 'fused': the two halves of 'gate_up_even' AXIS_0 [4,4] are split "
                  "differently (x: AXIS_0 [4,0], gate: AXIS_0 [0,4]); split each half as its own "
                  "segment");
    loom_tensor *rows = leaf_t(&f, "gu_rows", F32, ST_AX(1, 2, 2, 1), 8, 3, 1, 1);
    CHECK_DERIVED(&f, loom_glu(f.ctx, rows, LOOM_GLU_GEGLU, false), ST_AX(1, 2, 2, 1));
    fx_free(&f);
}

/* ---------------------------------------------------------------- the table itself */

LOOM_TEST(splitrules, whitelist_and_direct_application) {
    for (int op = 1; op < LOOM_OP_COUNT; op++)
        LOOM_CHECK_MSG(loom_split_op_known((loom_op)op), "no rule for %s",
                       loom_op_name((loom_op)op));
    LOOM_CHECK(!loom_split_op_known(LOOM_OP_NONE));
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    loom_tensor *w = named(loom_new_tensor_2d(ctx, F32, 8, 6), "w");
    loom_tensor *x = named(loom_new_tensor_2d(ctx, F32, 8, 3), "x");
    loom_tensor *y = named(loom_mul_mat(ctx, w, x), "y");
    LOOM_REQUIRE(y);
    const loom_split_state sw = ST_AX(1, 3, 2, 2, 2), sx = M(3);
    const loom_split_state *src[LOOM_MAX_SRC] = {&sw, &sx};
    loom_split_state out;
    LOOM_REQUIRE(loom_split_rule_apply(y, src, NULL, 3, &out) == LOOM_OK);
    const loom_split_state want = ST_AX(0, 3, 2, 2, 2);
    CHECK_STATE(out, want);
    /* a source state missing, or over other devices */
    const loom_split_state *missing[LOOM_MAX_SRC] = {&sw};
    LOOM_CHECK_EQ_INT(loom_split_rule_apply(y, missing, NULL, 3, &out), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "the state of source 1 is missing");
    const loom_split_state sx2 = M(2);
    const loom_split_state *other[LOOM_MAX_SRC] = {&sw, &sx2};
    LOOM_CHECK_EQ_INT(loom_split_rule_apply(y, other, NULL, 3, &out), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "source 'x' is over 2 devices, not 3");
    LOOM_CHECK_EQ_INT(loom_split_rule_apply(w, src, NULL, 3, &out), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'w' is a leaf (op NONE)");
    /* an op id beyond the table */
    loom_tensor fake = *y;
    fake.op = LOOM_OP_COUNT;
    LOOM_CHECK_EQ_INT(loom_split_rule_apply(&fake, src, NULL, 3, &out), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no split rule for this op");
    loom_ctx_free(ctx);
}

LOOM_TEST(splitrules, assume_sync_resolution) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *wp = leaf_t(&f, "bias_p", F32, P(2), 8, 1, 1, 1);
    loom_tensor *w = leaf_t(&f, "w", F32, ST_AX(0, 2, 4, 4), 8, 8, 1, 1);
    loom_tensor *h = leaf_t(&f, "h", F32, ST_AX(0, 2, 4, 4), 8, 1, 1, 1);
    loom_tensor *o = loom_mul_mat(f.ctx, w, h);
    loom_tensor *view = loom_reshape_1d(f.ctx, wp, 8);
    loom_split_state s;
    /* a computed PARTIAL reads as MIRRORED; a PARTIAL leaf and views of it stay PARTIAL */
    LOOM_REQUIRE(loom_split_ctx_get(f.sc, o, false, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_PARTIAL);
    LOOM_REQUIRE(loom_split_ctx_get(f.sc, o, true, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_MIRRORED);
    LOOM_REQUIRE(loom_split_ctx_get(f.sc, wp, true, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_PARTIAL);
    LOOM_REQUIRE(loom_split_ctx_get(f.sc, view, true, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_PARTIAL);
    /* so o (reduced) + the partial bias is refused, while the partial leaf alone is linear */
    loom_tensor *o1 = loom_reshape_1d(f.ctx, o, 8);
    CHECK_REFUSED(&f, named(loom_add(f.ctx, o1, view), "o_plus_bias"),
                  "would count the MIRRORED operand 2 times");
    loom_split_state_init(&s, LOOM_SPLIT_PARTIAL, 2);
    loom_split_state_assume_sync(o, &s);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_MIRRORED);
    loom_split_state_init(&s, LOOM_SPLIT_PARTIAL, 2);
    loom_split_state_assume_sync(wp, &s);
    LOOM_CHECK_EQ_INT(s.axis, LOOM_SPLIT_PARTIAL);
    fx_free(&f);
}
