/*
 * Tests of where a split lands through RESHAPE, CONT, VIEW, PERMUTE and TRANSPOSE
 * (splitstate/map.c and the layout rules of rules.c). Every derived state is checked
 * element by element against an oracle: each element of the result must live on the
 * device that holds the source element it shows, and each device's slice of the result
 * must be realisable from its own slice of the source (a row-major reshape for
 * RESHAPE/CONT, a strided view for VIEW).
 */
#include "tests/splitstate/split_test_util.h"

static int64_t flat(const int64_t idx[4], const int64_t ne[4]) {
    return idx[0] + ne[0] * (idx[1] + ne[1] * (idx[2] + ne[2] * idx[3]));
}

static void unflat(int64_t f, const int64_t ne[4], int64_t idx[4]) {
    for (int d = 0; d < 4; d++) {
        idx[d] = ne[d] ? f % ne[d] : 0;
        f = ne[d] ? f / ne[d] : 0;
    }
}

/* The device-local index of a global multi-index along a split axis. */
static int local_index(const loom_split_state *s, const int64_t idx[4], int64_t out[4]) {
    for (int d = 0; d < 4; d++)
        out[d] = idx[d];
    int64_t l = 0;
    int j = oracle_owner(s, idx[s->axis], &l);
    out[s->axis] = l;
    return j;
}

/* The oracle check described at the top. For views, `rel` is the byte offset of v's first
 * element from a's; F32 tensors only. */
static void check_mapping(const loom_tensor *a, const loom_split_state *sa, const loom_tensor *v,
                          const loom_split_state *sv, bool logical, int64_t rel) {
    if (!loom_split_axis_is_dim(sa->axis)) {
        LOOM_CHECK_EQ_INT(sv->axis, sa->axis);
        return;
    }
    LOOM_REQUIRE(loom_split_axis_is_dim(sv->axis));
    LOOM_CHECK_EQ_INT(loom_split_state_total(sv), v->ne[sv->axis]);
    const int64_t na = loom_nelements(a), nv = loom_nelements(v);
    int64_t *by_off = NULL;
    int64_t span = 0;
    if (!logical) {
        LOOM_REQUIRE(a->type == LOOM_TYPE_F32);
        span = (int64_t)loom_nbytes(a) / 4 + 1;
        by_off = malloc((size_t)span * sizeof *by_off);
        for (int64_t i = 0; i < span; i++)
            by_off[i] = -1;
        for (int64_t f = 0; f < na; f++) {
            int64_t idx[4];
            unflat(f, a->ne, idx);
            int64_t off = 0;
            for (int d = 0; d < 4; d++)
                off += idx[d] * (int64_t)a->nb[d];
            by_off[off / 4] = f;
        }
    }
    const int n = sa->n_devices;
    int64_t *dev_off = malloc((size_t)(nv * n) * sizeof *dev_off);
    for (int64_t i = 0; i < nv * n; i++)
        dev_off[i] = -1;
    int bad = 0;
    for (int64_t fv = 0; fv < nv && bad < 5; fv++) {
        int64_t iv[4], ia[4], lv[4], la[4], sne_v[4], sne_a[4];
        unflat(fv, v->ne, iv);
        int64_t fa;
        if (logical) {
            fa = fv;
        } else {
            int64_t off = rel;
            for (int d = 0; d < 4; d++)
                off += iv[d] * (int64_t)v->nb[d];
            LOOM_REQUIRE(off % 4 == 0 && off / 4 < span && by_off[off / 4] >= 0);
            fa = by_off[off / 4];
        }
        unflat(fa, a->ne, ia);
        int ja = local_index(sa, ia, la);
        int jv = local_index(sv, iv, lv);
        if (ja != jv) {
            bad++;
            loom_test_fail(__FILE__, __LINE__,
                           "element %lld of the view is on device %d, its source on %d",
                           (long long)fv, jv, ja);
            continue;
        }
        loom_split_state_slice_ne(sv, v->ne, jv, sne_v);
        loom_split_state_slice_ne(sa, a->ne, ja, sne_a);
        int64_t local_v = flat(lv, sne_v), local_a = flat(la, sne_a);
        if (logical) {
            /* the device reshapes its own slice in row-major order */
            if (local_v != local_a) bad++;
            LOOM_CHECK_MSG(local_v == local_a,
                           "element %lld: local %lld in the result, %lld in "
                           "the source slice",
                           (long long)fv, (long long)local_v, (long long)local_a);
        } else {
            dev_off[jv * nv + local_v] = local_a;
        }
    }
    if (!logical) {
        /* each device's result slice is a strided view of its contiguous source slice */
        for (int j = 0; j < n && bad < 5; j++) {
            int64_t sne_v[4];
            loom_split_state_slice_ne(sv, v->ne, j, sne_v);
            int64_t cnt = sne_v[0] * sne_v[1] * sne_v[2] * sne_v[3];
            if (cnt == 0) continue;
            const int64_t *o = dev_off + j * nv;
            int64_t stride[4] = {0};
            for (int d = 0; d < 4; d++) {
                int64_t e[4] = {0, 0, 0, 0};
                e[d] = 1;
                if (sne_v[d] > 1) stride[d] = o[flat(e, sne_v)] - o[0];
            }
            for (int64_t f = 0; f < cnt; f++) {
                int64_t l[4];
                unflat(f, sne_v, l);
                int64_t want = o[0] + l[0] * stride[0] + l[1] * stride[1] + l[2] * stride[2] +
                               l[3] * stride[3];
                if (o[f] != want) {
                    bad++;
                    loom_test_fail(__FILE__, __LINE__,
                                   "device %d: its slice of the view is not a strided view "
                                   "of its slice of the source (element %lld)",
                                   j, (long long)f);
                    break;
                }
            }
        }
    }
    free(dev_off);
    free(by_off);
}

/* ---------------------------------------------------------------- reshapes */

LOOM_TEST(splitmap, reshape_rows_to_heads) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* [D*H = 24, T = 3], 6 heads of 4 split [2, 4] heads */
    loom_split_state sa = ST_AX(0, 2, 8, 16);
    loom_tensor *a = leaf(&f, "q", sa, 24, 3, 1);
    loom_tensor *v = loom_reshape_3d(f.ctx, a, 4, 6, 3);
    LOOM_REQUIRE(v);
    loom_split_state sv = state_of(&f, v), want = ST_AX(1, 2, 2, 4);
    CHECK_STATE(sv, want);
    check_mapping(a, &sa, v, &sv, true, 0);
    /* and back: [4, 6, 3] heads split -> [24, 3] rows */
    loom_tensor *back = loom_reshape_2d(f.ctx, v, 24, 3);
    loom_split_state sb = state_of(&f, back);
    CHECK_STATE(sb, sa);
    check_mapping(v, &sv, back, &sb, true, 0);
    fx_free(&f);
}

LOOM_TEST(splitmap, reshape_merging_the_split_axis_repeats) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_split_state sa = ST_AX(0, 2, 2, 4);
    loom_tensor *a = leaf(&f, "a", sa, 6, 4, 1);
    loom_tensor *v = loom_reshape_1d(f.ctx, a, 24);
    loom_split_state sv = state_of(&f, v), want = ST_AX(0, 2, 2, 4);
    want.nr[0] = 4;
    CHECK_STATE(sv, want);
    check_mapping(a, &sa, v, &sv, true, 0);
    /* an uneven 3-way split with a zero slice, through two reshapes */
    fixture g;
    LOOM_REQUIRE(fx_init(&g, 3));
    loom_split_state sc = ST_AX(1, 3, 3, 0, 2);
    loom_tensor *c = leaf(&g, "c", sc, 2, 5, 3);
    loom_tensor *c2 = loom_reshape_2d(g.ctx, c, 10, 3);
    loom_split_state s2 = state_of(&g, c2), w2 = ST_AX(0, 3, 6, 0, 4);
    CHECK_STATE(s2, w2);
    check_mapping(c, &sc, c2, &s2, true, 0);
    loom_tensor *c3 = loom_reshape_1d(g.ctx, c2, 30);
    loom_split_state s3 = state_of(&g, c3);
    check_mapping(c2, &s2, c3, &s3, true, 0);
    LOOM_CHECK_EQ_INT(s3.nr[0], 3);
    fx_free(&g);
    fx_free(&f);
}

LOOM_TEST(splitmap, reshape_lands_on_a_lower_dim_when_periodic) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* [8, 3] split as [2,2] twice -> [4, 2, 3]: lands on axis 0 with [2,2] */
    loom_split_state sa = ST_AX(0, 2, 2, 2);
    sa.nr[0] = 2;
    loom_tensor *a = leaf(&f, "a", sa, 8, 3, 1);
    loom_tensor *v = loom_reshape_3d(f.ctx, a, 4, 2, 3);
    loom_split_state sv = state_of(&f, v), want = ST_AX(0, 2, 2, 2);
    CHECK_STATE(sv, want);
    check_mapping(a, &sa, v, &sv, true, 0);
    fx_free(&f);
}

LOOM_TEST(splitmap, reshape_refuses_a_boundary_inside_a_merged_dim) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *a = leaf(&f, "attn_out", ST_AX(0, 2, 6, 2), 8, 3, 1);
    loom_tensor *v = named(loom_reshape_3d(f.ctx, a, 4, 2, 3), "attn_out_3d");
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, v, false, &s), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "reshape 'attn_out_3d': cannot reshape 'attn_out' "
                                               "AXIS_0 [6,2] from [8, 3, 1, 1] to [4, 2, 3, 1]");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "fall inside merged dimensions");
    LOOM_CHECK(!loom_split_ctx_can_split(f.sc, v));
    fx_free(&f);
}

LOOM_TEST(splitmap, cont_of_permuted_is_a_logical_reshape) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* FA-free attention output: [Dv, T, H] heads split -> permute -> cont -> [Dv*H, T] */
    loom_split_state sa = ST_AX(2, 2, 1, 2);
    loom_tensor *a = leaf(&f, "kqv", sa, 4, 5, 3);
    loom_tensor *p = loom_permute(f.ctx, a, 0, 2, 1, 3); /* [4, 3, 5] */
    loom_split_state sp = state_of(&f, p), wp = ST_AX(1, 2, 1, 2);
    CHECK_STATE(sp, wp);
    loom_tensor *c = loom_cont_4d(f.ctx, p, 12, 5, 1, 1);
    loom_split_state sc = state_of(&f, c), wc = ST_AX(0, 2, 4, 8);
    CHECK_STATE(sc, wc);
    check_mapping(p, &sp, c, &sc, true, 0);
    fx_free(&f);
}

/* ---------------------------------------------------------------- views */

LOOM_TEST(splitmap, kv_cache_view_lands_on_heads) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 4));
    /* cache [D 4 x Hkv 4, kv 10], heads [2,1,1,0]; view the first 6 cells as [D, Hkv, 6] */
    loom_split_state sa = ST_AX(0, 4, 8, 4, 4, 0);
    loom_tensor *cache = leaf(&f, "cache_k_l0", sa, 16, 10, 1);
    loom_tensor *v = loom_view_3d(f.ctx, cache, 4, 4, 6, 4 * 4, cache->nb[1], 0);
    LOOM_REQUIRE(v);
    loom_split_state sv = state_of(&f, v), want = ST_AX(1, 4, 2, 1, 1, 0);
    CHECK_STATE(sv, want);
    check_mapping(cache, &sa, v, &sv, false, 0);
    /* permuted for attention: [D, 6, Hkv], heads on axis 2 */
    loom_tensor *p = loom_permute(f.ctx, v, 0, 2, 1, 3);
    loom_split_state sp = state_of(&f, p), wp = ST_AX(2, 4, 2, 1, 1, 0);
    CHECK_STATE(sp, wp);
    /* a view starting at cell 3 */
    loom_tensor *v3 = loom_view_3d(f.ctx, cache, 4, 4, 5, 16, cache->nb[1], 3 * cache->nb[1]);
    loom_split_state s3 = state_of(&f, v3);
    CHECK_STATE(s3, want);
    check_mapping(cache, &sa, v3, &s3, false, 3 * (int64_t)cache->nb[1]);
    fx_free(&f);
}

LOOM_TEST(splitmap, fused_qkv_views_pick_their_segment) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    /* qkv [q 8 + k 4 + v 4, T 3], head dim 2: q heads [2,2], k and v heads [1,1] */
    loom_split_state sa;
    loom_split_state_init(&sa, LOOM_SPLIT_AXIS_0, 2);
    ST_ADD(&sa, 1, 4, 4);
    ST_ADD(&sa, 1, 2, 2);
    ST_ADD(&sa, 1, 2, 2);
    loom_tensor *qkv = leaf(&f, "qkv", sa, 16, 3, 1);
    const size_t es = sizeof(float);
    loom_tensor *q = loom_view_3d(f.ctx, qkv, 2, 4, 3, 2 * es, qkv->nb[1], 0);
    loom_tensor *k = loom_view_3d(f.ctx, qkv, 2, 2, 3, 2 * es, qkv->nb[1], 8 * es);
    loom_tensor *v = loom_view_3d(f.ctx, qkv, 2, 2, 3, 2 * es, qkv->nb[1], 12 * es);
    LOOM_REQUIRE(q && k && v);
    loom_split_state sq = state_of(&f, q), sk = state_of(&f, k), sv = state_of(&f, v);
    loom_split_state wq = ST_AX(1, 2, 2, 2), wk = ST_AX(1, 2, 1, 1);
    CHECK_STATE(sq, wq);
    CHECK_STATE(sk, wk);
    CHECK_STATE(sv, wk);
    check_mapping(qkv, &sa, q, &sq, false, 0);
    check_mapping(qkv, &sa, k, &sk, false, 8 * (int64_t)es);
    check_mapping(qkv, &sa, v, &sv, false, 12 * (int64_t)es);
    /* the device offsets of the K view within each device's slice, from the sub-range */
    int64_t dev_start[2];
    loom_split_state sub;
    LOOM_REQUIRE(loom_split_state_sub(&sa, 8, 4, &sub, dev_start) == LOOM_OK);
    LOOM_CHECK_EQ_INT(dev_start[0], 4);
    LOOM_CHECK_EQ_INT(dev_start[1], 4);
    fx_free(&f);
}

LOOM_TEST(splitmap, moe_expert_slot_views) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_split_state sa = ST_AX(0, 2, 2, 4);
    loom_tensor *a = leaf(&f, "experts_out", sa, 6, 3, 2); /* [n, U, T] */
    for (int slot = 0; slot < 3; slot++) {
        loom_tensor *v = loom_view_2d(f.ctx, a, 6, 2, a->nb[2], (size_t)slot * a->nb[1]);
        LOOM_REQUIRE(v);
        loom_split_state sv = state_of(&f, v);
        CHECK_STATE(sv, sa);
        check_mapping(a, &sa, v, &sv, false, slot * (int64_t)a->nb[1]);
    }
    fx_free(&f);
}

LOOM_TEST(splitmap, view_of_one_index_lives_on_one_device) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_split_state sa = ST_AX(1, 2, 2, 2);
    loom_tensor *a = leaf(&f, "h", sa, 8, 4, 1);
    for (int row = 0; row < 4; row++) {
        loom_tensor *v = loom_view_1d(f.ctx, a, 8, (size_t)row * a->nb[1]);
        LOOM_REQUIRE(v);
        loom_split_state sv = state_of(&f, v);
        loom_split_state want = row < 2 ? ST_AX(1, 2, 1, 0) : ST_AX(1, 2, 0, 1);
        CHECK_STATE(sv, want);
        check_mapping(a, &sa, v, &sv, false, row * (int64_t)a->nb[1]);
    }
    fx_free(&f);
}

LOOM_TEST(splitmap, view_refusals) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *b = leaf(&f, "flat", ST_AX(0, 2, 4, 4), 8, 1, 1);
    loom_tensor *every2 = named(loom_view_2d(f.ctx, b, 1, 4, 2 * sizeof(float), 0), "every2");
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, every2, false, &s), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "view 'every2': cannot map the split of 'flat' "
                            "AXIS_0 [4,4] into the view [1, 4, 1, 1] at offset 0");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "one element in every 2 of the split axis 0");
    LOOM_CHECK(!loom_split_ctx_can_split(f.sc, every2));
    /* a view dimension that straddles the split axis and a lower one */
    loom_tensor *c = leaf(&f, "c", ST_AX(1, 2, 1, 2), 4, 3, 1);
    loom_tensor *odd = named(loom_view_2d(f.ctx, c, 6, 2, 6 * sizeof(float), 0), "odd");
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, odd, false, &s), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "straddles the split axis 1");
    fx_free(&f);
}

LOOM_TEST(splitmap, quantized_view_in_blocks) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 2));
    loom_tensor *w = named(loom_new_tensor_2d(f.ctx, LOOM_TYPE_Q4_0, 64, 4), "wq4");
    leaf_set(&f.lt, "wq4", ST_AX(0, 2, 32, 32));
    /* the second block of every row: all of it is on device 1 */
    loom_tensor *v = loom_view_2d(f.ctx, w, 32, 4, w->nb[1], sizeof(loom_block_q4_0));
    LOOM_REQUIRE(v);
    loom_split_state sv = state_of(&f, v), want = ST_AX(0, 2, 0, 32);
    CHECK_STATE(sv, want);
    /* the whole tensor as [128, 2]: rows merge, the split repeats per row */
    loom_tensor *r = loom_reshape_2d(f.ctx, w, 128, 2);
    loom_split_state sr = state_of(&f, r), wr = ST_AX(0, 2, 32, 32);
    wr.nr[0] = 2;
    CHECK_STATE(sr, wr);
    fx_free(&f);
}

LOOM_TEST(splitmap, permute_and_transpose_follow_the_axes) {
    fixture f;
    LOOM_REQUIRE(fx_init(&f, 3));
    const int perms[4][4] = {{0, 2, 1, 3}, {1, 0, 2, 3}, {2, 0, 1, 3}, {3, 1, 2, 0}};
    for (int axis = 0; axis < 3; axis++) {
        static const char *names[3] = {"x0", "x1", "x2"};
        const int64_t ne[3] = {3, 4, 5};
        loom_split_state sa;
        LOOM_REQUIRE(loom_split_state_even(&sa, (loom_split_axis)axis, 3, ne[axis], 1, axis) ==
                     LOOM_OK);
        loom_tensor *a = leaf(&f, names[axis], sa, 3, 4, 5);
        for (int p = 0; p < 4; p++) {
            loom_tensor *t =
                loom_permute(f.ctx, a, perms[p][0], perms[p][1], perms[p][2], perms[p][3]);
            LOOM_REQUIRE(t);
            loom_split_state st = state_of(&f, t);
            LOOM_CHECK_EQ_INT(st.axis, perms[p][axis]);
            /* the permuted view is a strided view of the same memory: check by address */
            check_mapping(a, &sa, t, &st, false, 0);
        }
        loom_tensor *tr = loom_transpose(f.ctx, a);
        loom_split_state st = state_of(&f, tr);
        LOOM_CHECK_EQ_INT(st.axis, axis == 0 ? 1 : axis == 1 ? 0 : axis);
        check_mapping(a, &sa, tr, &st, false, 0);
    }
    fx_free(&f);
}
