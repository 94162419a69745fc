/*
 * Ops cases, row selection: GET_ROWS (every source type, broadcasting over dims 2/3,
 * repeated ids) and SET_ROWS (every destination type, I32 and I64 ids, broadcasting),
 * plus a check that the quantised types' to_float, which the reference relies on, decodes
 * blocks exactly as include/loom/core.h lays them out.
 *
 * GET_ROWS and the untouched rows of SET_ROWS must be exact; written SET_ROWS rows get
 * ref_convert_tol for the destination type.
 */
#include <math.h>
#include <string.h>

#include "tests/ops/harness.h"

static bool is_quant(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr && tr->is_quantized;
}

/* The reference decodes quantised rows with the type's to_float: check that against the
 * block layout of core.h (x = qs * d; Q4_0: low nibble j, high nibble j + 16, minus 8). */
LOOM_TEST(ops_ref, quant_blocks_decode_as_documented) {
    loom_block_q8_0 b8;
    loom_block_q4_0 b4;
    b8.d = loom_fp32_to_fp16(0.0625f);
    b4.d = loom_fp32_to_fp16(-0.5f);
    for (int j = 0; j < 32; j++)
        b8.qs[j] = (int8_t)(j * 7 - 100);
    for (int j = 0; j < 16; j++)
        b4.qs[j] = (uint8_t)((j & 15) | (((15 - j) & 15) << 4));
    float y8[32], y4[32];
    loom_type_traits_get(LOOM_TYPE_Q8_0)->to_float(&b8, y8, 32);
    loom_type_traits_get(LOOM_TYPE_Q4_0)->to_float(&b4, y4, 32);
    for (int j = 0; j < 32; j++) {
        LOOM_CHECK_NEAR(y8[j], (j * 7 - 100) * 0.0625, 0);
        int nib = j < 16 ? j : 15 - (j - 16);
        LOOM_CHECK_NEAR(y4[j], (nib - 8) * -0.5, 0);
    }
    LOOM_CHECK_EQ_INT(sizeof b8, 34);
    LOOM_CHECK_EQ_INT(sizeof b4, 18);
    LOOM_CHECK_EQ_INT(loom_type_size(LOOM_TYPE_Q8_0), 34);
    LOOM_CHECK_EQ_INT(loom_type_size(LOOM_TYPE_Q4_0), 18);
}

/* ---------------------------------------------------------------- get_rows */

typedef struct gr_variant {
    int64_t R, A2, A3; /* a [n, R, A2, A3] */
    int64_t X, B1, B2; /* ids [X, B1, B2] */
} gr_variant;

static const gr_variant k_gr_variants[] = {
    {10, 1, 1, 6, 1, 1}, /* token embedding: a [n, R], ids [X] */
    {5, 2, 3, 4, 2, 3},  /* one ids slice per (i1, i2) slice of a */
    {6, 1, 1, 3, 3, 2},  /* a broadcast over ids' dims 1 and 2 */
    {4, 2, 1, 2, 4, 2},  /* B1 = 2 * A2 (docs: B1 % A2 == 0) */
};

OPS_CASE(get_rows) {
    static const loom_type types[] = {
        LOOM_TYPE_F32,  LOOM_TYPE_F16,  LOOM_TYPE_BF16,   LOOM_TYPE_Q8_0,   LOOM_TYPE_Q4_0,
        LOOM_TYPE_I32,  LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0,   LOOM_TYPE_Q5_1,   LOOM_TYPE_Q2_K,
        LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,   LOOM_TYPE_Q6_K,   LOOM_TYPE_IQ4_NL,
        LOOM_TYPE_IQ4_XS, LOOM_TYPE_MXFP4};
    int v = 0;
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++)
        for (int iv = 0; iv < 4; iv++, v++) {
            loom_type type = types[t];
            gr_variant g = k_gr_variants[iv];
            const int64_t bl = is_quant(type) ? loom_blck_size(type) : 1;
            int64_t n = is_quant(type) ? (iv % 2 ? 2 * bl : bl) : (iv % 2 ? 33 : 7);
            ops_layout la = v % 3 == 0 ? OPS_CONTIG : v % 3 == 1 ? OPS_PADDED : OPS_PERM12;
            ops_layout li = v % 2 ? OPS_PADDED : OPS_CONTIG;
            ops_begin(e, "get_rows %s a[%lld,%lld,%lld,%lld] %s ids[%lld,%lld,%lld] %s",
                      loom_type_name(type), (long long)n, (long long)g.R, (long long)g.A2,
                      (long long)g.A3, ops_layout_name(la), (long long)g.X, (long long)g.B1,
                      (long long)g.B2, ops_layout_name(li));
            loom_tensor *a = ops_src(e, type, n, g.R, g.A2, g.A3, la);
            if (type == LOOM_TYPE_I32) ops_fill(e, a, -1000000, 1000000);
            loom_tensor *ids = ops_src(e, LOOM_TYPE_I32, g.X, g.B1, g.B2, 1, li);
            ops_fill(e, ids, 0, (double)g.R); /* with repeats */
            loom_tensor *out = loom_get_rows(ops_ctx(e), a, ids);
            if (ops_compute(e, out)) {
                loom_type ot = type == LOOM_TYPE_I32 ? LOOM_TYPE_I32 : LOOM_TYPE_F32;
                ref_tensor ra = ops_ref(e, a), ri = ops_ref(e, ids);
                ref_tensor exp = ops_expect(e, ot, n, g.X, g.B1, g.B2);
                ref_get_rows(&ra, &ri, &exp);
                ops_check(e, out, &exp, (ops_tol){0}); /* decoding is exact */
            }
            ops_end(e);
        }
}

/* docs/ops.md gives GET_ROWS I32 ids only. I64 ids must either work like I32 or be
 * refused by the builder with a message; never a wrong result or a crash. */
OPS_CASE(get_rows_i64_ids) {
    ops_begin(e, "get_rows f32 a[7,10] ids i64[6]");
    loom_tensor *a = ops_src(e, LOOM_TYPE_F32, 7, 10, 1, 1, OPS_CONTIG);
    loom_tensor *ids = ops_src(e, LOOM_TYPE_I64, 6, 1, 1, 1, OPS_CONTIG);
    ops_fill(e, ids, 0, 10);
    loom_clear_error();
    loom_tensor *out = loom_get_rows(ops_ctx(e), a, ids);
    if (!out) {
        LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_TYPE);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "get_rows");
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "ids");
    } else if (ops_compute(e, out)) {
        ref_tensor ra = ops_ref(e, a), ri = ops_ref(e, ids);
        ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, 7, 6, 1, 1);
        ref_get_rows(&ra, &ri, &exp);
        ops_check(e, out, &exp, (ops_tol){0});
    }
    ops_end(e);
}

/* ---------------------------------------------------------------- set_rows */

typedef struct sr_variant {
    int64_t R, D2, D3; /* dst [n, R, D2, D3] */
    int64_t X, B2, B3; /* b [n, X, B2, B3], ids [X, B2, B3] */
} sr_variant;

static const sr_variant k_sr_variants[] = {
    {9, 1, 1, 4, 1, 1}, /* a KV-cache write: dst [n, R], b [n, X], ids [X] */
    {7, 4, 2, 3, 2, 1}, /* b and ids broadcast over dst's dims 2 and 3 */
    {5, 2, 3, 5, 2, 3}, /* one slice each, every row written */
};

OPS_CASE(set_rows) {
    static const loom_type types[] = {LOOM_TYPE_F32,  LOOM_TYPE_F16,  LOOM_TYPE_BF16,
                                      LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,
                                      LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_IQ4_NL};
    int v = 0;
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++)
        for (int it = 0; it < 2; it++)
            for (int iv = 0; iv < 3; iv++, v++) {
                loom_type type = types[t], id_type = it ? LOOM_TYPE_I64 : LOOM_TYPE_I32;
                sr_variant s = k_sr_variants[iv];
                int64_t n = is_quant(type) ? (iv == 1 ? 64 : 32) : (iv == 1 ? 33 : 7);
                ops_layout lb = v % 3 == 0 ? OPS_CONTIG : v % 3 == 1 ? OPS_PADDED : OPS_PERM12;
                ops_layout ld = (type == LOOM_TYPE_F32 && v % 2) ? OPS_PADDED : OPS_CONTIG;
                ops_begin(e,
                          "set_rows %s dst[%lld,%lld,%lld,%lld] %s b[.., %lld,%lld,%lld] %s "
                          "ids %s",
                          loom_type_name(type), (long long)n, (long long)s.R, (long long)s.D2,
                          (long long)s.D3, ops_layout_name(ld), (long long)s.X, (long long)s.B2,
                          (long long)s.B3, ops_layout_name(lb), loom_type_name(id_type));
                loom_tensor *dst = ops_src(e, type, n, s.R, s.D2, s.D3, ld);
                loom_tensor *b = ops_src(e, LOOM_TYPE_F32, n, s.X, s.B2, s.B3, lb);
                loom_tensor *ids = ops_src(e, id_type, s.X, s.B2, s.B3, 1, OPS_CONTIG);
                if (ids) {
                    /* distinct rows within each slice: a random prefix of a permutation */
                    for (int64_t j3 = 0; j3 < s.B3; j3++)
                        for (int64_t j2 = 0; j2 < s.B2; j2++) {
                            int64_t perm[16];
                            for (int64_t r = 0; r < s.R; r++)
                                perm[r] = r;
                            for (int64_t r = s.R - 1; r > 0; r--) {
                                int64_t k = ops_randi(e, 0, r + 1), tmp = perm[r];
                                perm[r] = perm[k];
                                perm[k] = tmp;
                            }
                            for (int64_t x = 0; x < s.X; x++)
                                ops_set(e, ids, x, j2, j3, 0, (double)perm[x]);
                        }
                }
                /* the destination before the op, decoded */
                ref_tensor rd0 = ops_ref(e, dst);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, s.R, s.D2, s.D3);
                ref_copy(&rd0, &exp);
                loom_tensor *out = loom_set_rows(ops_ctx(e), dst, b, ids);
                if (ops_compute(e, out)) {
                    const loom_tensor *ro = out, *rd = dst;
                    while (ro->view_src)
                        ro = ro->view_src;
                    while (rd->view_src)
                        rd = rd->view_src;
                    LOOM_CHECK(ro == rd); /* the result is a view of dst */
                    ref_tensor rb = ops_ref(e, b), ri = ops_ref(e, ids);
                    int64_t nrows = s.R * s.D2 * s.D3;
                    uint8_t *written = ops_scratch(e, (size_t)nrows);
                    ref_set_rows(&rb, &ri, &exp, written);
                    double *tol = ops_scratch(e, sizeof(double) * (size_t)(n * nrows));
                    double *row = ops_scratch(e, sizeof(double) * (size_t)n);
                    for (int64_t r = 0; r < nrows; r++) {
                        if (!written[r]) continue; /* untouched rows: exact (tol 0) */
                        int64_t i1 = r % s.R, i2 = (r / s.R) % s.D2, i3 = r / (s.R * s.D2);
                        ref_get_row(&exp, i1, i2, i3, row);
                        ref_convert_tol(type, row, n, tol + r * n);
                    }
                    ops_check_as(e, out, type, &exp, (ops_tol){.elem = tol});
                }
                ops_end(e);
            }
}
