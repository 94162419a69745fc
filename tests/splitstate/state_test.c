/*
 * Tests of the split-state algebra (splitstate/state.c): even, rotated, weighted and
 * block-granular counts, zero-size slices, fused-QKV segments, slice shapes and byte
 * ranges, equality, printing, validation messages and sub-ranges. Layout questions are
 * checked against the element-by-element oracle of split_test_util.h.
 */
#include "tests/splitstate/split_test_util.h"

/* ---------------------------------------------------------------- counts */

LOOM_TEST(splitstate, counts_even_properties) {
    /* every (size, granularity, n, rotation): sum exact, whole units, spread <= 1 unit,
     * and the devices holding an extra unit are rotation, rotation+1, ... */
    const int64_t grans[] = {1, 4, 32, 128};
    for (int gi = 0; gi < 4; gi++)
        for (int n = 1; n <= 8; n++)
            for (int64_t units = 0; units <= 3 * n + 1; units++)
                for (int rot = 0; rot < n; rot++) {
                    int64_t g = grans[gi], c[16];
                    LOOM_REQUIRE(loom_split_counts(units * g, g, n, rot, NULL, c) == LOOM_OK);
                    int64_t sum = 0, base = units / n, rem = units % n;
                    for (int j = 0; j < n; j++) {
                        sum += c[j];
                        LOOM_CHECK(c[j] % g == 0);
                        /* device j is the k-th in rotated order */
                        int k = (j - rot + n) % n;
                        int64_t want = (base + (k < rem ? 1 : 0)) * g;
                        LOOM_CHECK_MSG(c[j] == want,
                                       "size %lld g %lld n %d rot %d: dev %d has "
                                       "%lld, want %lld",
                                       (long long)(units * g), (long long)g, n, rot, j,
                                       (long long)c[j], (long long)want);
                    }
                    LOOM_CHECK_EQ_INT(sum, units * g);
                }
}

LOOM_TEST(splitstate, counts_rotation_balances_layers) {
    /* 10 heads over 4 devices: over 4 layers with rotation = layer, every device holds
     * the same number of heads, although no single layer is even */
    int64_t total[4] = {0};
    for (int layer = 0; layer < 4; layer++) {
        int64_t c[4];
        LOOM_REQUIRE(loom_split_counts(10 * 64, 64, 4, layer, NULL, c) == LOOM_OK);
        for (int j = 0; j < 4; j++)
            total[j] += c[j];
        int64_t lo = c[0], hi = c[0];
        for (int j = 1; j < 4; j++) {
            lo = c[j] < lo ? c[j] : lo;
            hi = c[j] > hi ? c[j] : hi;
        }
        LOOM_CHECK_EQ_INT(hi - lo, 64); /* uneven in every layer */
    }
    for (int j = 0; j < 4; j++)
        LOOM_CHECK_EQ_INT(total[j], 10 * 64);
}

LOOM_TEST(splitstate, counts_errors) {
    int64_t c[4];
    LOOM_CHECK_EQ_INT(loom_split_counts(100, 32, 4, 0, NULL, c), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "cannot split 100 elements in units of 32");
    LOOM_CHECK_EQ_INT(loom_split_counts(64, 1, 0, 0, NULL, c), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "0 devices");
    LOOM_CHECK_EQ_INT(loom_split_counts(64, 1, 17, 0, NULL, c), LOOM_ERR_INVALID_ARG);
    const float zero[2] = {0, 0};
    LOOM_CHECK_EQ_INT(loom_split_counts(64, 1, 2, 0, zero, c), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "sum to 0");
    const float neg[2] = {1, -1};
    LOOM_CHECK_EQ_INT(loom_split_counts(64, 1, 2, 0, neg, c), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "weight 1");
}

LOOM_TEST(splitstate, counts_weighted) {
    int64_t c[4];
    const float w31[2] = {3, 1};
    LOOM_REQUIRE(loom_split_counts(64, 1, 2, 0, w31, c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c[0], 48);
    LOOM_CHECK_EQ_INT(c[1], 16);
    /* a device of weight 0 gets nothing, even with leftovers */
    const float w[4] = {1, 0, 1, 1};
    for (int rot = 0; rot < 4; rot++) {
        LOOM_REQUIRE(loom_split_counts(10 * 32, 32, 4, rot, w, c) == LOOM_OK);
        LOOM_CHECK_EQ_INT(c[1], 0);
        LOOM_CHECK_EQ_INT(c[0] + c[2] + c[3], 320);
        for (int j = 0; j < 4; j++)
            LOOM_CHECK(c[j] % 32 == 0);
        /* each positive-weight device is within one unit of its exact share (10/3 units) */
        for (int j = 0; j < 4; j++)
            if (j != 1) LOOM_CHECK(c[j] == 96 || c[j] == 128);
    }
}

/* ---------------------------------------------------------------- validation */

LOOM_TEST(splitstate, validate_messages) {
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    loom_tensor *w = named(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 176, 8), "blk.0.attn_q.weight");
    LOOM_REQUIRE(w);
    loom_split_state s = ST_AX(0, 4, 48, 48, 40, 36);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "split state AXIS_0 [48,48,40,36] of 'blk.0.attn_q.weight': counts "
                            "sum to 172, but ne[0] = 176");
    s = ST_AX(0, 4, 48, 48, 40, 40);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 16), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "device 2 gets 40 elements, not a multiple of the granularity 16");
    s = ST_AX(0, 4, 48, 48, 40, 40);
    s.ne[0][3] = -8; /* built by hand */
    s.ne[0][2] = 88;
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "negative");
    s = ST_AX(3, 2, 1, 0);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK); /* ne[3] = 1: legal */
    s = st_kind(LOOM_SPLIT_AXIS_1, 2);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "0 segments");
    s = st_kind(LOOM_SPLIT_MIRRORED, 3);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK);
    s.axis = (loom_split_axis)4; /* the reference's off-by-one: axis 4 is not an axis */
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unknown axis 4");
    loom_ctx_free(ctx);
}

LOOM_TEST(splitstate, q4_0_rows_split_at_blocks) {
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    loom_tensor *w = named(loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_0, 128, 16), "ffn_down");
    LOOM_REQUIRE(w);
    loom_split_state s = ST_AX(0, 2, 64, 64);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK);
    s = ST_AX(0, 2, 48, 80);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "device 0 gets 48 elements, but a q4_0 row splits only at 32-element "
                            "block boundaries");
    /* an even split of 128 over 3 devices in units of 32: [64,32,32], rotated */
    LOOM_REQUIRE(loom_split_state_even(&s, LOOM_SPLIT_AXIS_0, 3, 128, 32, 1) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK);
    LOOM_CHECK_EQ_INT(s.ne[0][1], 64);
    /* rows (axis 1) have no block restriction */
    s = ST_AX(1, 3, 5, 5, 6);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 1), LOOM_OK);
    /* the byte range of device 1's slice of a Q4_0 row is whole blocks: 2 x 18 bytes */
    s = ST_AX(0, 2, 32, 96);
    loom_split_range r;
    LOOM_REQUIRE(loom_split_state_range(&s, w, 0, 0, 1, &r) == LOOM_OK);
    LOOM_CHECK_EQ_INT(r.offset, 32);
    LOOM_CHECK_EQ_INT(r.offset_bytes, sizeof(loom_block_q4_0));
    LOOM_CHECK_EQ_INT(r.size_bytes, 3 * sizeof(loom_block_q4_0));
    LOOM_CHECK_EQ_INT(r.chunk_bytes, 4 * sizeof(loom_block_q4_0));
    LOOM_CHECK_EQ_INT(r.dev_chunk_bytes, 3 * sizeof(loom_block_q4_0));
    LOOM_CHECK_EQ_INT(r.n_chunks, 16);
    LOOM_CHECK_EQ_INT(loom_split_state_slice_nbytes(&s, w, 1), 16 * 3 * sizeof(loom_block_q4_0));
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- slices */

LOOM_TEST(splitstate, zero_size_slices) {
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    /* 2 KV heads of 8 over 4 devices: two devices hold nothing */
    loom_tensor *k = named(loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 16, 32), "cache_k_l0");
    LOOM_REQUIRE(k);
    loom_split_state s;
    LOOM_REQUIRE(loom_split_state_even(&s, LOOM_SPLIT_AXIS_0, 4, 16, 8, 0) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, k, 8), LOOM_OK);
    int empty = 0;
    for (int j = 0; j < 4; j++) {
        int64_t ne[4];
        loom_split_state_slice_ne(&s, k->ne, j, ne);
        LOOM_CHECK_EQ_INT(ne[1], 32);
        LOOM_CHECK(ne[0] == 0 || ne[0] == 8);
        if (ne[0] == 0) {
            empty++;
            LOOM_CHECK_EQ_INT(loom_split_state_slice_nbytes(&s, k, j), 0);
            LOOM_CHECK_EQ_INT(loom_split_state_slice_nelements(&s, k, j), 0);
        } else {
            LOOM_CHECK_EQ_INT(loom_split_state_slice_nbytes(&s, k, j), 8 * 32 * 2);
        }
    }
    LOOM_CHECK_EQ_INT(empty, 2);
    /* a zero-size piece still has a well-defined range */
    loom_split_range r;
    LOOM_REQUIRE(loom_split_state_range(&s, k, 0, 0, 3, &r) == LOOM_OK);
    LOOM_CHECK_EQ_INT(r.size, 0);
    LOOM_CHECK_EQ_INT(r.size_bytes, 0);
    LOOM_CHECK_EQ_INT(r.offset, 16);
    loom_ctx_free(ctx);
}

LOOM_TEST(splitstate, fused_qkv_segments_ranges_match_oracle) {
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    /* [n_embd 32, q 24 + k 8 + v 8]: 3 devices, heads of 4; k and v have 2 heads */
    loom_tensor *w = named(loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 40), "blk.0.attn_qkv.weight");
    LOOM_REQUIRE(w);
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_AXIS_1, 3);
    LOOM_REQUIRE(loom_split_state_add_even(&s, 24, 4, 0, 1) == LOOM_OK); /* q: 6 heads */
    LOOM_REQUIRE(loom_split_state_add_even(&s, 8, 4, 0, 1) == LOOM_OK);  /* k: 2 heads */
    LOOM_REQUIRE(loom_split_state_add_even(&s, 8, 4, 0, 1) == LOOM_OK);  /* v: 2 heads */
    LOOM_CHECK_EQ_INT(loom_split_state_validate(&s, w, 4), LOOM_OK);
    char buf[128];
    loom_split_state_format(&s, buf, sizeof buf);
    LOOM_CHECK_STR_CONTAINS(buf, "AXIS_1 [8,8,8]+[4,4,0]+[4,4,0]");
    /* every piece's range agrees with the oracle, element by element */
    int64_t covered = 0;
    for (int seg = 0; seg < s.n_segments; seg++)
        for (int j = 0; j < 3; j++) {
            loom_split_range r;
            LOOM_REQUIRE(loom_split_state_range(&s, w, seg, 0, j, &r) == LOOM_OK);
            LOOM_CHECK_EQ_INT(r.offset_bytes, (size_t)r.offset * 32 * 4);
            LOOM_CHECK_EQ_INT(r.size_bytes, (size_t)r.size * 32 * 4);
            LOOM_CHECK_EQ_INT(r.chunk_bytes, 40 * 32 * 4);
            LOOM_CHECK_EQ_INT(r.n_chunks, 1);
            for (int64_t e = 0; e < r.size; e++) {
                int64_t local = -1;
                LOOM_CHECK_EQ_INT(oracle_owner(&s, r.offset + e, &local), j);
                LOOM_CHECK_EQ_INT(local, r.dev_offset + e);
            }
            covered += r.size;
        }
    LOOM_CHECK_EQ_INT(covered, 40);
    /* device 2 holds q heads only */
    LOOM_CHECK_EQ_INT(loom_split_state_dev_count(&s, 2), 8);
    LOOM_CHECK_EQ_INT(loom_split_state_range(&s, w, 3, 0, 0, NULL), LOOM_ERR_INVALID_ARG);
    loom_split_range r;
    LOOM_CHECK_EQ_INT(loom_split_state_range(&s, w, 3, 0, 0, &r), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "out of range");
    loom_ctx_free(ctx);
}

LOOM_TEST(splitstate, range_of_repeated_segment_matches_oracle) {
    loom_ctx *ctx = headers_ctx();
    LOOM_REQUIRE(ctx);
    loom_tensor *t = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 4, 15, 2);
    LOOM_REQUIRE(t);
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_AXIS_1, 2);
    ST_ADD(&s, 2, 1, 2);
    ST_ADD(&s, 3, 3, 0);
    LOOM_REQUIRE(loom_split_state_validate(&s, t, 1) == LOOM_OK);
    for (int seg = 0; seg < 2; seg++)
        for (int64_t rep = 0; rep < s.nr[seg]; rep++)
            for (int j = 0; j < 2; j++) {
                loom_split_range r;
                LOOM_REQUIRE(loom_split_state_range(&s, t, seg, rep, j, &r) == LOOM_OK);
                for (int64_t e = 0; e < r.size; e++) {
                    int64_t local = -1;
                    LOOM_CHECK_EQ_INT(oracle_owner(&s, r.offset + e, &local), j);
                    LOOM_CHECK_EQ_INT(local, r.dev_offset + e);
                }
                LOOM_CHECK_EQ_INT(r.n_chunks, 2);
                LOOM_CHECK_EQ_INT(r.dev_chunk_bytes,
                                  (size_t)loom_split_state_dev_count(&s, j) * 16);
            }
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- equality, printing */

LOOM_TEST(splitstate, equality_is_layout_equality) {
    loom_split_state a = ST_AX(0, 2, 2, 2), b;
    a.nr[0] = 2;
    loom_split_state_init(&b, LOOM_SPLIT_AXIS_0, 2);
    ST_ADD(&b, 1, 2, 2);
    ST_ADD(&b, 1, 2, 2);
    LOOM_CHECK(loom_split_state_equal(&a, &b));
    ST_ADD(&b, 1, 0, 0); /* an empty segment changes nothing */
    LOOM_CHECK(loom_split_state_equal(&a, &b));
    loom_split_state c = ST_AX(0, 2, 4, 4); /* same per-device totals, other elements */
    LOOM_CHECK(!loom_split_state_equal(&a, &c));
    loom_split_state d = ST_AX(1, 2, 2, 2);
    d.nr[0] = 2;
    LOOM_CHECK(!loom_split_state_equal(&a, &d));
    loom_split_state m2 = st_kind(LOOM_SPLIT_MIRRORED, 2), m3 = st_kind(LOOM_SPLIT_MIRRORED, 3);
    loom_split_state p2 = st_kind(LOOM_SPLIT_PARTIAL, 2);
    LOOM_CHECK(loom_split_state_equal(&m2, &m2));
    LOOM_CHECK(!loom_split_state_equal(&m2, &m3));
    LOOM_CHECK(!loom_split_state_equal(&m2, &p2));
    /* the oracle agrees: equal layouts put every element on the same device */
    for (int64_t g = 0; g < 8; g++)
        LOOM_CHECK_EQ_INT(oracle_owner(&a, g, NULL), oracle_owner(&b, g, NULL));
}

LOOM_TEST(splitstate, printing) {
    char buf[128];
    loom_split_state s = ST_AX(0, 4, 48, 48, 40, 36);
    LOOM_CHECK_EQ_INT(loom_split_state_format(&s, buf, sizeof buf),
                      (int)strlen("AXIS_0 [48,48,40,36]"));
    LOOM_CHECK(!strcmp(buf, "AXIS_0 [48,48,40,36]"));
    s = st_kind(LOOM_SPLIT_MIRRORED, 4);
    loom_split_state_format(&s, buf, sizeof buf);
    LOOM_CHECK(!strcmp(buf, "MIRRORED"));
    s = st_kind(LOOM_SPLIT_PARTIAL, 4);
    loom_split_state_format(&s, buf, sizeof buf);
    LOOM_CHECK(!strcmp(buf, "PARTIAL"));
    s = st_kind(LOOM_SPLIT_NONE, 4);
    loom_split_state_format(&s, buf, sizeof buf);
    LOOM_CHECK(!strcmp(buf, "NONE"));
    s = ST_AX(2, 2, 2, 2);
    s.nr[0] = 3;
    ST_ADD(&s, 1, 1, 0);
    loom_split_state_format(&s, buf, sizeof buf);
    LOOM_CHECK(!strcmp(buf, "AXIS_2 [2,2]x3+[1,0]"));
    /* truncation is safe and reports the full length */
    char small[8];
    int n = loom_split_state_format(&s, small, sizeof small);
    LOOM_CHECK_EQ_INT(n, (int)strlen("AXIS_2 [2,2]x3+[1,0]"));
    LOOM_CHECK_EQ_INT((int)strlen(small), 7);
    LOOM_CHECK(!strcmp(loom_split_axis_name(LOOM_SPLIT_AXIS_3), "AXIS_3"));
    LOOM_CHECK(!strcmp(loom_split_axis_name((loom_split_axis)7), "?"));
}

/* ---------------------------------------------------------------- sub-ranges */

LOOM_TEST(splitstate, sub_ranges_match_oracle) {
    /* a layout with segments and repeats; every sub-range against the oracle */
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_AXIS_0, 3);
    ST_ADD(&s, 1, 4, 0, 2);
    ST_ADD(&s, 3, 1, 2, 1);
    ST_ADD(&s, 1, 0, 0, 5);
    const int64_t total = loom_split_state_total(&s);
    LOOM_REQUIRE(total == 23);
    int tried = 0;
    for (int64_t start = 0; start <= total; start++)
        for (int64_t len = 0; start + len <= total; len++) {
            loom_split_state r;
            int64_t dev_start[3];
            loom_status st = loom_split_state_sub(&s, start, len, &r, dev_start);
            if (st == LOOM_ERR_FULL) continue; /* too many segments: refused, not wrong */
            LOOM_REQUIRE(st == LOOM_OK);
            tried++;
            LOOM_CHECK_EQ_INT(loom_split_state_total(&r), len);
            for (int64_t e = 0; e < len; e++) {
                int64_t l_full = -1, l_sub = -1;
                int j = oracle_owner(&s, start + e, &l_full);
                LOOM_CHECK_EQ_INT(oracle_owner(&r, e, &l_sub), j);
                /* a device's part of the range is contiguous in its slice */
                LOOM_CHECK_EQ_INT(l_full, dev_start[j] + l_sub);
            }
        }
    LOOM_CHECK(tried > 250);
    loom_split_state r;
    LOOM_CHECK_EQ_INT(loom_split_state_sub(&s, 20, 4, &r, NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "outside the axis of 23 elements");
    loom_split_state m = st_kind(LOOM_SPLIT_MIRRORED, 3);
    LOOM_CHECK_EQ_INT(loom_split_state_sub(&m, 0, 1, &r, NULL), LOOM_ERR_INVALID_ARG);
}

LOOM_TEST(splitstate, segments_full_and_bad_input) {
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_AXIS_0, 2);
    for (int i = 0; i < LOOM_SPLIT_MAX_SEGMENTS; i++)
        LOOM_CHECK_EQ_INT(ST_ADD(&s, 1, 1, 1), LOOM_OK);
    LOOM_CHECK_EQ_INT(ST_ADD(&s, 1, 1, 1), LOOM_ERR_FULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "more than 8 segments");
    loom_split_state_init(&s, LOOM_SPLIT_AXIS_0, 2);
    LOOM_CHECK_EQ_INT(ST_ADD(&s, 0, 1, 1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_EQ_INT(ST_ADD(&s, 1, 1, -1), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "device 1 gets -1 elements");
    LOOM_CHECK_EQ_INT(loom_split_state_even(&s, LOOM_SPLIT_MIRRORED, 2, 8, 1, 0),
                      LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "MIRRORED is not an axis");
}
