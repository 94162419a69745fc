/*
 * Issue 29 ("never silently wrong, round 3"), each case compared with the CPU backend
 * through the differential harness (meta_diff.h), alone and under a scheduler:
 *   - a PARTIAL bias added to a partial sum whose holder's slice is empty (ADD, ADD_ID);
 *   - the same add where the sum is read elsewhere too (reduced first: device 0 adds);
 *   - CONCAT along the split axis with one operand's slice empty on a device.
 */
#include <stdio.h>
#include <string.h>

#include "loom/sim.h"
#include "tests/meta/meta_diff.h"
#include "tests/shim/loom_test.h"

static const char *g_sim_opts; /* appended to "sim:N" (member refusals) */

/* Runs build over N devices, alone and under a scheduler, over every AllReduce algorithm
 * and with NaN-filled memory; every run must match the CPU exactly. */
static void check_modes(const char *what, md_build_fn build, void *ud, int n_lo, int n_hi,
                        int modes) {
    for (int n = n_lo; n <= n_hi; n++)
        for (int mode = 0; mode < 2; mode++)
            for (int algo = LOOM_ALLREDUCE_AUTO; algo < LOOM_ALLREDUCE_COUNT; algo++) {
                if (algo == LOOM_ALLREDUCE_NATIVE) continue; /* sim has no communicator */
                if (!(modes & (1 << mode))) continue;
                md_config c = {.n = n,
                               .sim_opts = g_sim_opts,
                               .algo = (loom_allreduce_algo)algo,
                               .sched = mode == 1,
                               .nan_fill = mode == 0,
                               .repeats = 2,
                               .seed = 29};
                md_result r = md_run(&c, build, ud);
                LOOM_CHECK_MSG(r.verdict == MD_EXACT, "%s, N=%d, %s, %s: %s: %s", what, n,
                               mode ? "sched" : "alone", loom_allreduce_algo_name(c.algo),
                               md_verdict_name(r.verdict), r.msg);
            }
}

/* Alone and under a scheduler. */
static void check_exact(const char *what, md_build_fn build, void *ud, int n_lo, int n_hi) {
    check_modes(what, build, ud, n_lo, n_hi, 3);
}

enum { K = 6, M = 5, T = 3, E = 4, U = 2 };

/* counts giving the whole of `size` to the last device (the others' slices empty) */
static void last_holds_all(int n, int64_t size, int64_t *counts) {
    for (int j = 0; j < n; j++)
        counts[j] = j == n - 1 ? size : 0;
}

/* o = w x with w split along K, all of it on the last device: the other devices'
 * products are exact zeros. y = o + bias (PARTIAL: device 0 holds it). */
static void build_bias_empty_slice(md_builder *b, void *ud) {
    int64_t counts[LOOM_META_MAX_DEVICES];
    last_holds_all(b->n, K, counts);
    loom_tensor *w = md_f32_counts(b, "w", K, M, 1, LOOM_SPLIT_AXIS_0, counts);
    loom_tensor *x = md_f32(b, "x", K, T, 1, LOOM_SPLIT_MIRRORED);
    loom_tensor *bias = md_f32(b, "bias", M, 1, 1, LOOM_SPLIT_PARTIAL);
    if (b->failed) return;
    loom_tensor *o = md_check(b, loom_mul_mat(b->ctx, w, x), "o");
    if (!o) return;
    loom_tensor *y = md_check(b, loom_add(b->ctx, o, bias), "y");
    if (ud && y) y = md_check(b, loom_add(b->ctx, y, o), "y2"); /* o read twice */
    md_output(b, y);
}

LOOM_TEST(meta_round3, partial_bias_over_an_empty_slice_counts_once) {
    check_exact("o + bias", build_bias_empty_slice, NULL, 1, 4);
}

LOOM_TEST(meta_round3, partial_bias_on_a_sum_read_twice_is_exact) {
    int twice = 1;
    check_exact("(o + bias) + o", build_bias_empty_slice, &twice, 2, 3);
}

/* ADD_ID of an expert bias (PARTIAL) to o [M, U, T], a partial sum over an empty slice */
static void build_add_id_empty_slice(md_builder *b, void *ud) {
    (void)ud;
    int64_t counts[LOOM_META_MAX_DEVICES];
    last_holds_all(b->n, K, counts);
    loom_tensor *w = md_f32_counts(b, "w", K, M, 1, LOOM_SPLIT_AXIS_0, counts);
    loom_tensor *x = md_f32(b, "x", K, U, T, LOOM_SPLIT_MIRRORED);
    loom_tensor *bias = md_f32(b, "ebias", M, E, 1, LOOM_SPLIT_PARTIAL);
    const int64_t ne_ids[4] = {U, T, 1, 1};
    loom_tensor *ids = md_leaf_new(b, "ids", LOOM_TYPE_I32, ne_ids, NULL, MD_FILL_IDS, E);
    if (b->failed) return;
    loom_tensor *o = md_check(b, loom_mul_mat(b->ctx, w, x), "o");
    if (o) md_output(b, md_check(b, loom_add_id(b->ctx, o, bias, ids), "y"));
}

LOOM_TEST(meta_round3, partial_expert_bias_over_an_empty_slice_counts_once) {
    check_exact("add_id(o, bias)", build_add_id_empty_slice, NULL, 1, 4);
}

/* t [8, T] split evenly on axis 0 over 2 devices; concat(t[0:4], t[4:8]) along axis 0:
 * each view lives on one device only, the other's slice of it is empty */
static void build_concat_empty_operand(md_builder *b, void *ud) {
    (void)ud;
    loom_tensor *t = md_f32(b, "t", 8, T, 1, LOOM_SPLIT_AXIS_0);
    if (b->failed) return;
    loom_tensor *sq = md_check(b, loom_sqr(b->ctx, t), "sq");
    if (!sq) return;
    loom_tensor *lo = md_check(b, loom_view_2d(b->ctx, sq, 4, T, sq->nb[1], 0), "lo");
    loom_tensor *hi =
        md_check(b, loom_view_2d(b->ctx, sq, 4, T, sq->nb[1], 4 * sizeof(float)), "hi");
    if (!lo || !hi) return;
    md_output(b, md_check(b, loom_concat(b->ctx, hi, lo, 0), "cat"));
}

LOOM_TEST(meta_round3, concat_with_an_empty_operand_slice_keeps_both_parts) {
    check_exact("concat(hi, lo)", build_concat_empty_operand, NULL, 2, 2);
}

/* A leaf whose state is NONE ("follows the op that writes it") written by CPY, and by
 * SET_ROWS (every row), from a value split along axis 0 (unevenly when uneven is set):
 * the leaf and the op's result read back exactly. */
static void build_none_leaf_written(md_builder *b, void *ud) {
    const bool uneven = ud != NULL;
    loom_split_state none;
    loom_split_state_init(&none, LOOM_SPLIT_NONE, b->n);
    const int64_t ne[4] = {8, T, 1, 1}, ne_rows[4] = {T, 1, 1, 1};
    int64_t counts[LOOM_META_MAX_DEVICES];
    last_holds_all(b->n, 8, counts);
    loom_tensor *t = uneven ? md_f32_counts(b, "t", 8, T, 1, LOOM_SPLIT_AXIS_0, counts)
                            : md_f32(b, "t", 8, T, 1, LOOM_SPLIT_AXIS_0);
    loom_tensor *dst = md_leaf_new(b, "dst", LOOM_TYPE_F32, ne, &none, MD_FILL_FLOAT, 0);
    loom_tensor *rows_dst = md_leaf_new(b, "rows_dst", LOOM_TYPE_F32, ne, &none, MD_FILL_FLOAT, 0);
    loom_tensor *rows = md_leaf_new(b, "rows", LOOM_TYPE_I32, ne_rows, NULL, MD_FILL_ROWS, T);
    if (b->failed) return;
    loom_tensor *sq = md_check(b, loom_sqr(b->ctx, t), "sq");
    if (!sq) return;
    loom_tensor *c = md_check(b, loom_cpy(b->ctx, sq, dst), "cpy");
    loom_tensor *sr = md_check(b, loom_set_rows(b->ctx, rows_dst, sq, rows), "set_rows");
    md_output(b, c);
    md_output(b, sr);
    md_output(b, dst);
    md_output(b, rows_dst);
}

LOOM_TEST(meta_round3, none_leaf_written_by_cpy_or_set_rows_takes_its_layout) {
    check_exact("cpy/set_rows into a NONE leaf", build_none_leaf_written, NULL, 1, 3);
    int uneven = 1;
    check_exact("cpy/set_rows into a NONE leaf, uneven", build_none_leaf_written, &uneven, 2, 3);
}

/* Found by meta_fuzz_test (seed 321, N = 7): v = wv x h split unevenly along its rows
 * (devices without any), reshaped to heads of size 1 or 2 (a split inside a head: the
 * devices cannot map that reshape, which falls back to the CPU), permuted, transposed and
 * made contiguous. */
static void build_uneven_value_heads(md_builder *b, void *ud) {
    int64_t counts[LOOM_META_MAX_DEVICES] = {0};
    const int64_t want[7] = {1, 0, 1, 0, 1, 0, 3};
    for (int j = 0; j < b->n; j++)
        counts[j] = j < 7 ? want[j] : 0;
    if (b->n < 7) { /* the same pattern folded onto fewer devices */
        for (int j = 0; j < b->n; j++)
            counts[j] = 0;
        for (int j = 0; j < 7; j++)
            counts[j % b->n] += want[j];
    }
    loom_tensor *wv = md_f32_counts(b, "wv", 11, 6, 1, LOOM_SPLIT_AXIS_1, counts);
    loom_tensor *h = md_f32(b, "h", 11, T, 1, LOOM_SPLIT_MIRRORED);
    if (b->failed) return;
    loom_tensor *v = md_check(b, loom_mul_mat(b->ctx, wv, h), "v");
    const int64_t hd = ud ? 2 : 1;
    loom_tensor *v3 = v ? md_check(b, loom_reshape_3d(b->ctx, v, hd, 6 / hd, T), "v3") : NULL;
    loom_tensor *vp = v3 ? md_check(b, loom_permute(b->ctx, v3, 0, 2, 1, 3), "vp") : NULL;
    loom_tensor *vt = vp ? md_check(b, loom_transpose(b->ctx, vp), "vt") : NULL;
    md_output(b, vt ? md_check(b, loom_cont(b->ctx, vt), "vtc") : NULL);
}

LOOM_TEST(meta_round3, uneven_value_heads_through_a_fallen_back_reshape) {
    check_exact("cont(transpose(permute(reshape(v))))", build_uneven_value_heads, NULL, 7, 7);
    /* alone, the devices refuse that reshape (a clean error); scheduled, it is exact */
    int hd2 = 1;
    check_modes("cont(transpose(permute(reshape(v)))), heads of 2", build_uneven_value_heads, &hd2,
                2, 7, 2);
}

/* Zero-element tensors: no tokens (T = 0) through a column- then row-parallel pair and a
 * PARTIAL bias; the outputs are empty and nothing fails. */
static void build_zero_tokens(md_builder *b, void *ud) {
    (void)ud;
    loom_tensor *up = md_f32(b, "up", K, M, 1, LOOM_SPLIT_AXIS_1);
    loom_tensor *down = md_f32(b, "down", M, K, 1, LOOM_SPLIT_AXIS_0);
    loom_tensor *x = md_f32(b, "x", K, 0, 1, LOOM_SPLIT_MIRRORED);
    loom_tensor *bias = md_f32(b, "bias", K, 1, 1, LOOM_SPLIT_PARTIAL);
    if (b->failed) return;
    loom_tensor *h = md_check(b, loom_mul_mat(b->ctx, up, x), "h");
    loom_tensor *o =
        h ? md_check(b, loom_mul_mat(b->ctx, down, md_check(b, loom_silu(b->ctx, h), "silu")), "o")
          : NULL;
    md_output(b, o ? md_check(b, loom_add(b->ctx, o, bias), "y") : NULL);
    /* no rows written into a split cache (found by meta_fuzz_test, seed 15) */
    const int64_t ne_c[4] = {M, 4, 1, 1}, ne_r[4] = {0, 1, 1, 1};
    loom_split_state cs;
    if (loom_split_state_even(&cs, LOOM_SPLIT_AXIS_0, b->n, M, 1, 0) != LOOM_OK) return;
    loom_tensor *cache = md_leaf_new(b, "cache", LOOM_TYPE_F32, ne_c, &cs, MD_FILL_FLOAT, 0);
    loom_tensor *rows = md_leaf_new(b, "rows", LOOM_TYPE_I32, ne_r, NULL, MD_FILL_ROWS, 4);
    if (!h || b->failed) return;
    loom_tensor *hc =
        md_check(b, loom_reshape_2d(b->ctx, md_check(b, loom_cont(b->ctx, h), "hc"), M, 0), "hr");
    loom_tensor *w = hc ? md_check(b, loom_set_rows(b->ctx, cache, hc, rows), "set_rows") : NULL;
    md_output(b, w ? md_check(b, loom_scale(b->ctx, w, 2.0f), "cache x 2") : NULL);
}

LOOM_TEST(meta_round3, zero_element_tensors_run) {
    check_exact("T = 0", build_zero_tokens, NULL, 1, 3);
}

/* A zero-size buffer of a meta buffer type (the generic empty buffer) has no members: the
 * question is answered with NULL and a message, not an abort. */
LOOM_TEST(meta_round3, zero_size_meta_buffer_has_no_members) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2", &reg) == LOOM_OK);
    loom_dev_t devs[2] = {loom_reg_dev_get(reg, 0), loom_reg_dev_get(reg, 1)}, meta = NULL;
    LOOM_REQUIRE(loom_meta_device_new(devs, 2, NULL, NULL, &meta) == LOOM_OK);
    loom_buffer_t empty = loom_buft_alloc_buffer(loom_dev_buffer_type(meta), 0);
    LOOM_REQUIRE(empty != NULL);
    LOOM_CHECK(loom_meta_buffer_member(empty, 0) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "a zero-size buffer has no members");
    loom_buffer_t full = loom_buft_alloc_buffer(loom_dev_buffer_type(meta), 64);
    LOOM_REQUIRE(full != NULL);
    LOOM_CHECK(loom_meta_buffer_member(full, 1) != NULL);
    LOOM_CHECK(loom_meta_buffer_member(full, 2) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "member 2 of 2");
    loom_buffer_free(full);
    loom_buffer_free(empty);
    loom_meta_device_free(meta);
    loom_sim_reg_free(reg);
}

/* Issue 29, item 6 (meta_fuzz_test seed 16): the devices refuse SOFT_MAX, so the attention
 * weights are computed on the CPU and come back whole, while V is split on heads: the
 * devices cannot multiply a head-split V by a whole operand the way their rule needs, and
 * under a scheduler that product falls back to the CPU too (exact); alone it is refused. */
static void build_whole_weights_split_values(md_builder *b, void *ud) {
    (void)ud;
    enum { HD = 2, H = 4, NKV = 3 };
    loom_tensor *kq = md_f32(b, "kq", NKV, T, H, LOOM_SPLIT_AXIS_2);
    loom_tensor *vt = md_f32(b, "vt", NKV, HD, H, LOOM_SPLIT_AXIS_2);
    if (b->failed) return;
    loom_tensor *sm = md_check(b, loom_soft_max(b->ctx, kq), "soft_max");
    md_output(b, sm ? md_check(b, loom_mul_mat(b->ctx, vt, sm), "kqv") : NULL);
}

LOOM_TEST(meta_round3, refused_producer_brings_back_a_whole_value_and_its_consumer_falls_back) {
    g_sim_opts = ",refuse=soft_max";
    check_modes("v x soft_max(kq), soft_max refused", build_whole_weights_split_values, NULL, 2, 4,
                2);
    g_sim_opts = NULL;
}

/* Issue 29, item 3: CPY of a value split along one axis (a column-parallel product) into a
 * destination split another way. The devices cannot write it slice to slice; under a
 * scheduler the value is made on the CPU and arrives whole, and each device writes its
 * part of the destination (exact). Alone it is refused with a message. */
static void build_cpy_across_states(md_builder *b, void *ud) {
    const bool other_counts = ud != NULL;
    loom_tensor *w = md_f32(b, "w", K, M, 1, LOOM_SPLIT_AXIS_1);
    loom_tensor *x = md_f32(b, "x", K, T, 1, LOOM_SPLIT_MIRRORED);
    int64_t counts[LOOM_META_MAX_DEVICES];
    last_holds_all(b->n, other_counts ? M : T, counts);
    const int64_t ne[4] = {M, T, 1, 1};
    loom_split_state ds;
    loom_split_state_init(&ds, other_counts ? LOOM_SPLIT_AXIS_0 : LOOM_SPLIT_AXIS_1, b->n);
    if (loom_split_state_add_segment(&ds, counts, 1) != LOOM_OK) return;
    loom_tensor *dst = md_leaf_new(b, "p", LOOM_TYPE_F32, ne, &ds, MD_FILL_FLOAT, 0);
    if (b->failed) return;
    loom_tensor *y = md_check(b, loom_mul_mat(b->ctx, w, x), "y");
    loom_tensor *c = y ? md_check(b, loom_cpy(b->ctx, y, dst), "cpy") : NULL;
    md_output(b, c ? md_check(b, loom_scale(b->ctx, c, 3.0f), "p x 3") : NULL);
    md_output(b, dst);
}

LOOM_TEST(meta_round3, cpy_into_a_destination_split_another_way) {
    check_modes("cpy AXIS_0 -> AXIS_1", build_cpy_across_states, NULL, 2, 3, 2);
    int other = 1;
    check_modes("cpy AXIS_0 -> AXIS_0 (other counts)", build_cpy_across_states, &other, 2, 3, 2);
}
