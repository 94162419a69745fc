/*
 * The work-split arithmetic of the CUDA kernels (backends/cuda/kernels-math.h, issue 25),
 * compiled for the host, against straightforward references; no GPU needed:
 *
 * - flash-decoding: a row's keys split as the launcher splits them, each split folded tile
 *   by tile as k_flash_attn_tiled folds it (loom__cu_fa_tile_max, then weights expf(z - M)),
 *   the partials merged by the combine kernel's own functions (loom__cu_fa_merge /
 *   _merged_value), against the softmax of the whole row in double (masked keys, rows
 *   entirely masked, sinks, a NaN score, a NaN sink);
 * - the split of the KV range: whole tiles, in order, covering every key once, none empty,
 *   and splitting only launches too small for the GPU;
 * - the tile-skip predicate on a causal mask: hidden exactly when every key of the tile is
 *   past every query of the block;
 * - the matvec work items: every (row, column group, batch) once.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/kernels-math.h"
#include "tests/shim/loom_test.h"

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)(next(s) % 1000003) / 1000003.0f;
}

#define DV 5
#define MAX_KV 5000

/* The reference: softmax over the row's unmasked scores (and the sink) in double, times V.
 * NaN when a score or the sink is NaN; 0 when every key is masked and there is no sink. */
static void reference(const float *z, int nkv, const float (*v)[DV], const float *sink,
                      double *out) {
    double M = -INFINITY;
    bool nan = sink && isnan(*sink);
    for (int i = 0; i < nkv; i++) {
        if (isnan(z[i])) nan = true;
        if (z[i] > M) M = z[i];
    }
    if (sink && *sink > M) M = *sink;
    double S = 0, acc[DV] = {0};
    for (int i = 0; i < nkv && M > -INFINITY; i++) {
        if (z[i] == -INFINITY || isnan(z[i])) continue;
        const double p = exp((double)z[i] - M);
        S += p;
        for (int d = 0; d < DV; d++)
            acc[d] += p * v[i][d];
    }
    if (sink && M > -INFINITY) S += exp((double)*sink - M);
    for (int d = 0; d < DV; d++)
        out[d] = nan ? NAN : S > 0 ? acc[d] / S : 0.0;
}

/* One split's partial [M, S, nan, acc[DV]] over keys [lo, hi), tile by tile as the tiled
 * kernel folds it (its warp max, its warp sum and its accumulator update, in float). */
static void split_partial(const float *z, const float (*v)[DV], int64_t lo, int64_t hi, float *pr) {
    float M = -INFINITY, S = 0.0f, acc[DV] = {0};
    bool nan = false;
    for (int64_t i0 = lo; i0 < hi; i0 += LOOM_CU_FA_TK) {
        const int nk = hi - i0 < LOOM_CU_FA_TK ? (int)(hi - i0) : LOOM_CU_FA_TK;
        float zmax = -INFINITY;
        for (int k = 0; k < nk; k++) {
            const float zk = z[i0 + k];
            if (zk != zk)
                nan = true;
            else
                zmax = fmaxf(zmax, zk);
        }
        float ms;
        if (!loom__cu_fa_tile_max(&M, zmax, &ms)) continue;
        float psum = 0.0f, p[LOOM_CU_FA_TK];
        for (int k = 0; k < nk; k++) {
            const float zk = z[i0 + k];
            p[k] = (zk == -INFINITY || zk != zk) ? 0.0f : expf(zk - M);
            psum += p[k];
        }
        S = S * ms + psum;
        for (int d = 0; d < DV; d++) {
            float a = acc[d] * ms;
            for (int k = 0; k < nk; k++)
                a += p[k] * v[i0 + k][d];
            acc[d] = a;
        }
    }
    pr[0] = M;
    pr[1] = S;
    pr[2] = nan ? 1.0f : 0.0f;
    for (int d = 0; d < DV; d++)
        pr[3 + d] = acc[d];
}

/* Split-and-combine of one row against the reference; false (with a failure) if not. */
static bool check_row(const char *what, const float *z, int nkv, const float (*v)[DV],
                      const float *sink, int splits) {
    static float part[LOOM_CU_FA_MAX_SPLITS * (3 + DV)];
    const int64_t stride = 3 + DV;
    for (int i = 0; i < splits; i++) {
        int64_t lo, hi;
        loom__cu_fa_split_range(nkv, splits, i, &lo, &hi);
        split_partial(z, v, lo, hi, part + i * stride);
    }
    const loom__cu_fa_merged mg = loom__cu_fa_merge(part, splits, stride, sink);
    double want[DV];
    reference(z, nkv, v, sink, want);
    for (int d = 0; d < DV; d++) {
        const float got = loom__cu_fa_merged_value(part, splits, stride, d, &mg);
        const bool ok = isnan(want[d])
                            ? isnan(got) != 0
                            : !isnan(got) && fabs(got - want[d]) <= 2e-6 + 2e-5 * fabs(want[d]);
        if (!ok) {
            loom_test_fail(__FILE__, __LINE__,
                           "%s: nkv %d, %d splits, value %d: split-and-combine %.9g, softmax "
                           "of the whole row %.9g",
                           what, nkv, splits, d, got, want[d]);
            return false;
        }
    }
    return true;
}

static float (*g_v)[DV];
static float *g_z;

static void fill(uint64_t *s, int nkv, float zlo, float zhi) {
    for (int i = 0; i < nkv; i++) {
        g_z[i] = uniform(s, zlo, zhi);
        for (int d = 0; d < DV; d++)
            g_v[i][d] = uniform(s, -1.0f, 1.0f);
    }
}

LOOM_TEST(cuda_kernel_math, flash_decoding_split_and_combine_is_the_softmax_of_the_row) {
    g_v = calloc(MAX_KV, sizeof *g_v);
    g_z = calloc(MAX_KV, sizeof *g_z);
    LOOM_REQUIRE(g_v && g_z);
    static const int lens[] = {1, 31, 32, 33, 257, 1000, 2048, 4097, MAX_KV};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int rows = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int nkv = lens[li];
        /* no split, odd counts, and what the launcher picks for 1, 8 and 64 blocks */
        const int picks[] = {1,
                             3,
                             7,
                             31,
                             loom__cu_fa_splits(1, nkv),
                             loom__cu_fa_splits(8, nkv),
                             loom__cu_fa_splits(64, nkv)};
        for (size_t pi = 0; pi < sizeof picks / sizeof picks[0]; pi++) {
            const int splits = picks[pi];
            if (loom__cu_fa_split_len(nkv, splits) * (splits - 1) >= nkv && splits > 1)
                continue; /* the launcher never asks for splits with nothing to do */
            const float sk = 1.5f;
            /* plain scores, large ones (the max moves from split to split), with a sink */
            fill(&s, nkv, -4.0f, 4.0f);
            rows += check_row("plain", g_z, nkv, (const float(*)[DV])g_v, NULL, splits);
            for (int i = 0; i < nkv; i++)
                g_z[i] = (float)i * 0.05f - 30.0f; /* rising: the last split holds the max */
            rows += check_row("rising", g_z, nkv, (const float(*)[DV])g_v, &sk, splits);
            /* a causal row: keys past position p masked (whole splits masked) */
            fill(&s, nkv, -2.0f, 2.0f);
            const int p = nkv / 3;
            for (int i = p + 1; i < nkv; i++)
                g_z[i] = -INFINITY;
            rows += check_row("causal", g_z, nkv, (const float(*)[DV])g_v, NULL, splits);
            rows += check_row("causal + sink", g_z, nkv, (const float(*)[DV])g_v, &sk, splits);
            /* every key masked: 0 without a sink, 0 with one (its value is 0) */
            for (int i = 0; i < nkv; i++)
                g_z[i] = -INFINITY;
            rows += check_row("all masked", g_z, nkv, (const float(*)[DV])g_v, NULL, splits);
            rows += check_row("all masked + sink", g_z, nkv, (const float(*)[DV])g_v, &sk, splits);
            /* a NaN score in the last key, and a NaN sink: NaN rows */
            fill(&s, nkv, -2.0f, 2.0f);
            g_z[nkv - 1] = NAN;
            rows += check_row("NaN score", g_z, nkv, (const float(*)[DV])g_v, NULL, splits);
            g_z[nkv - 1] = 0.5f;
            const float nan_sink = NAN;
            rows += check_row("NaN sink", g_z, nkv, (const float(*)[DV])g_v, &nan_sink, splits);
        }
    }
    LOOM_CHECK_MSG(rows >= 250, "only %d rows checked", rows);
    free(g_v);
    free(g_z);
}

LOOM_TEST(cuda_kernel_math, kv_split_covers_every_key_once_in_whole_tiles) {
    int split_launches = 0;
    for (int64_t nkv = 1; nkv <= 20000; nkv += nkv < 600 ? 1 : 97) {
        for (int64_t nb = 1; nb <= 300; nb = nb < 8 ? nb + 1 : nb * 2) {
            const int splits = loom__cu_fa_splits(nb, nkv);
            LOOM_REQUIRE(splits >= 1 && splits <= LOOM_CU_FA_MAX_SPLITS);
            if (splits == 1) continue;
            split_launches++;
            /* only launches that leave the GPU idle, over a KV worth splitting */
            LOOM_REQUIRE(nb < LOOM_CU_FA_SPLIT_TARGET / 2);
            LOOM_REQUIRE(nkv >= 2 * LOOM_CU_FA_SPLIT_MIN_KV);
            LOOM_REQUIRE(nb * splits <= LOOM_CU_FA_SPLIT_TARGET + nb);
            int64_t end = 0;
            for (int i = 0; i < splits; i++) {
                int64_t lo, hi;
                loom__cu_fa_split_range(nkv, splits, i, &lo, &hi);
                LOOM_REQUIRE(lo == end);               /* in order, no gap, no overlap */
                LOOM_REQUIRE(hi > lo);                 /* none empty */
                LOOM_REQUIRE(lo % LOOM_CU_FA_TK == 0); /* whole tiles */
                LOOM_REQUIRE(hi - lo >= LOOM_CU_FA_TK || hi == nkv);
                end = hi;
            }
            LOOM_REQUIRE(end == nkv);
        }
    }
    LOOM_CHECK_MSG(split_launches > 1000, "%d split launches checked", split_launches);
    /* decode of a 32-head model with 8 KV heads (one block per KV head) at depth 2048:
     * split into enough blocks to fill the GPU; prefill blocks are not split */
    LOOM_CHECK(loom__cu_fa_splits(8, 2048) >= 8);
    LOOM_CHECK_EQ_INT(loom__cu_fa_splits(8, 100), 1);
    LOOM_CHECK_EQ_INT(loom__cu_fa_splits(4096, 2048), 1);
}

LOOM_TEST(cuda_kernel_math, tile_skip_is_exactly_the_tiles_past_the_causal_diagonal) {
    static float mask[LOOM_CU_FA_TQ * LOOM_CU_FA_TK];
    int hidden = 0;
    for (int q0 = 0; q0 < 300; q0 += LOOM_CU_FA_TQ) {       /* the block's first query position */
        for (int rows = 1; rows <= LOOM_CU_FA_TQ; rows++) { /* a last block may be short */
            for (int i0 = 0; i0 < 400; i0 += LOOM_CU_FA_TK) {
                for (int r = 0; r < rows; r++)
                    for (int k = 0; k < LOOM_CU_FA_TK; k++)
                        mask[r * LOOM_CU_FA_TK + k] = i0 + k <= q0 + r ? 0.0f : -INFINITY;
                const bool want = i0 > q0 + rows - 1; /* the tile starts past the last query */
                const bool got = loom__cu_fa_tile_hidden(mask, rows, LOOM_CU_FA_TK, LOOM_CU_FA_TK);
                LOOM_REQUIRE(got == want);
                hidden += got;
            }
        }
    }
    LOOM_CHECK(hidden > 0);
    /* a NaN or any finite value keeps the tile */
    for (int k = 0; k < LOOM_CU_FA_TK; k++)
        mask[k] = -INFINITY;
    mask[7] = NAN;
    LOOM_CHECK(!loom__cu_fa_tile_hidden(mask, 1, LOOM_CU_FA_TK, LOOM_CU_FA_TK));
    mask[7] = -1e30f;
    LOOM_CHECK(!loom__cu_fa_tile_hidden(mask, 1, LOOM_CU_FA_TK, LOOM_CU_FA_TK));
}

LOOM_TEST(cuda_kernel_math, matvec_items_visit_every_row_column_group_and_batch_once) {
    static const int64_t shp[][4] = {{5, 1, 1, 1}, {17, 3, 4, 1}, {9, 8, 2, 4}, {3, 17, 3, 2}};
    for (size_t si = 0; si < sizeof shp / sizeof shp[0]; si++) {
        const int64_t M = shp[si][0], N = shp[si][1], B2 = shp[si][2], B3 = shp[si][3];
        const int64_t ncg = (N + LOOM_CU_MMV_COLS - 1) / LOOM_CU_MMV_COLS;
        const int64_t n_items = M * ncg * B2 * B3;
        int *seen = calloc((size_t)(M * N * B2 * B3), sizeof *seen);
        LOOM_REQUIRE(seen);
        for (int64_t w = 0; w < n_items; w++) {
            const loom__cu_mmv_item it = loom__cu_mmv_item_of(w, M, N, B2);
            LOOM_REQUIRE(it.m >= 0 && it.m < M && it.i2 >= 0 && it.i2 < B2 && it.i3 >= 0 &&
                         it.i3 < B3 && it.n0 % LOOM_CU_MMV_COLS == 0 && it.nc >= 1 &&
                         it.nc <= LOOM_CU_MMV_COLS && it.n0 + it.nc <= N);
            for (int c = 0; c < it.nc; c++)
                seen[((it.i3 * B2 + it.i2) * N + it.n0 + c) * M + it.m]++;
        }
        for (int64_t o = 0; o < M * N * B2 * B3; o++)
            LOOM_REQUIRE(seen[o] == 1); /* every output once */
        free(seen);
    }
}
