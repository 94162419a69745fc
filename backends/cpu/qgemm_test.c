/*
 * The int8 GEMM of quantised weights (MM_QGEMM, qgemm.h) for every type it covers (every
 * block type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K..Q6_K, IQ4_XS), at odd
 * sizes (M not a multiple of MR, N not of NR, K of one block and beyond one k-block, M
 * beyond one row block), broadcast batches and non-contiguous b (transposed, padded rows).
 *
 * Exact activations: every 32-block of b holds q * 2^-e with integer |q| <= 127, one of
 * them +-127, and e the same over each 256-element chunk, so quantising b to Q8 (blocks of
 * 32 or 256, any rounding rule) is lossless. The int8 GEMM, the F32 GEMM
 * (LOOM_CPU_QGEMM=0) and the portable integer dots (QUANT / QDOT) must then all equal the
 * double dot of the dequantised weights (core's to_float) with b up to float rounding: a
 * bound far below one product |a_k b_k|, so a single wrong weight, scale, min or column
 * fails. Random activations: the int8 GEMM against the same reference within the Q8
 * rounding bound of the activations.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu_test_util.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

typedef struct qg_case {
    int64_t K, M, N, A2, B2;
    b_layout lb;
} qg_case;

typedef enum run_mode { RUN_QGEMM, RUN_AVX2, RUN_F32GEMM, RUN_SCALAR, RUN_MODES } run_mode;
static const char *const k_mode_names[] = {"int8 gemm", "avx2 table", "f32 gemm", "scalar dots"};

static void set_mode(run_mode m) {
    unsetenv("LOOM_CPU_SIMD");
    unsetenv("LOOM_CPU_QGEMM");
    if (m == RUN_F32GEMM) setenv("LOOM_CPU_QGEMM", "0", 1);
    if (m == RUN_SCALAR) setenv("LOOM_CPU_SIMD", "scalar", 1);
    if (m == RUN_AVX2) setenv("LOOM_CPU_SIMD", "avx2", 1);
}

/* b's column n of batch i2: exact (see the top) or uniform in [-1, 1]. */
static void fill_col(float *x, int64_t K, bool exact) {
    for (int64_t c0 = 0; c0 < K; c0 += 256) {
        const float scale = ldexpf(1.0f, -(5 + (int)(loom_test_rand() % 5)));
        for (int64_t k0 = c0; k0 < K && k0 < c0 + 256; k0 += 32) {
            const int peak = (int)(loom_test_rand() % 32);
            for (int l = 0; l < 32; l++) {
                if (!exact) {
                    x[k0 + l] = loom_test_randf(-1.0f, 1.0f);
                    continue;
                }
                int q = (int)(loom_test_rand() % 255) - 127;
                if (l == peak) q = loom_test_rand() % 2 ? 127 : -127;
                x[k0 + l] = (float)q * scale;
            }
        }
    }
}

static void check_case(loom_type type, qg_case c, bool exact) {
    loom_ctx *ctx = loom_cpu_test_ctx(96);
    LOOM_REQUIRE(ctx);
    const loom_type_traits *tr = loom_type_traits_get(type);
    loom_tensor *a = loom_new_tensor_3d(ctx, type, c.K, c.M, c.A2);
    loom_tensor *b = loom_cpu_test_b(ctx, c.K, c.N, c.B2, c.lb, 5, NULL);
    LOOM_REQUIRE(a && b);
    const size_t arow_bytes = loom_row_size(type, c.K);
    float *x = malloc(sizeof(float) * (size_t)c.K);
    float *ad = malloc(sizeof(float) * (size_t)(c.K * c.M * c.A2));
    float *bd = malloc(sizeof(float) * (size_t)(c.K * c.N * c.B2));
    for (int64_t r = 0; r < c.M * c.A2; r++) {
        for (int64_t k = 0; k < c.K; k++)
            x[k] = loom_test_randf(-1.0f, 1.0f);
        tr->from_float(x, (char *)a->data + r * arow_bytes, c.K);
        tr->to_float((char *)a->data + r * arow_bytes, ad + r * c.K, c.K);
    }
    for (int64_t r = 0; r < c.N * c.B2; r++) {
        fill_col(bd + r * c.K, c.K, exact);
        for (int64_t k = 0; k < c.K; k++)
            loom_set_f32_nd(b, k, r % c.N, r / c.N, 0, bd[r * c.K + k]);
    }
    loom_tensor *d = loom_mul_mat(ctx, a, b);
    LOOM_REQUIRE(d);

    /* reference and bounds per output */
    const int64_t n_out = c.M * c.N * c.B2;
    double *ref = malloc(sizeof(double) * (size_t)n_out);
    double *tol[RUN_MODES];
    for (int m = 0; m < RUN_MODES; m++)
        tol[m] = malloc(sizeof(double) * (size_t)n_out);
    const bool q8_1 = tr->vec_dot_type == LOOM_TYPE_Q8_1;
    const double nblk = (double)(c.K / 32);
    for (int64_t i2 = 0; i2 < c.B2; i2++)
        for (int64_t n = 0; n < c.N; n++) {
            const float *bc = bd + (i2 * c.N + n) * c.K;
            for (int64_t m = 0; m < c.M; m++) {
                const float *ar = ad + ((i2 / (c.B2 / c.A2)) * c.M + m) * c.K;
                double s = 0, mag = 0, qerr = 0, s_err = 0;
                for (int64_t k0 = 0; k0 < c.K; k0 += 32) {
                    double amax = 0, asum = 0, bmax = 0, bsum = 0;
                    for (int64_t k = k0; k < k0 + 32; k++) {
                        s += (double)ar[k] * bc[k];
                        mag += fabs((double)ar[k] * bc[k]);
                        amax = fmax(amax, fabs(ar[k]));
                        asum += fabs(ar[k]);
                        bmax = fmax(bmax, fabs(bc[k]));
                        bsum += fabs(bc[k]);
                    }
                    qerr += asum * bmax / 127 * 0.5;
                    s_err += amax * bsum * 0x1p-11; /* Q8_1's fp16 s, which carries the min */
                }
                const int64_t o = m + c.M * (n + c.N * i2);
                ref[o] = s;
                /* int8 GEMM: exact integer block sums, a few roundings per block */
                tol[RUN_QGEMM][o] = (nblk + 8) * 0x1p-22 * mag + (exact ? 0 : 1.0001 * qerr);
                /* the AVX2 table: its int8 GEMM, or the F32 GEMM for types beyond |q| 64 */
                tol[RUN_AVX2][o] = tol[RUN_QGEMM][o] + (double)(c.K + 8) * 0x1p-23 * mag;
                /* float dots over K terms */
                tol[RUN_F32GEMM][o] = (double)(c.K + 8) * 0x1p-23 * mag;
                tol[RUN_SCALAR][o] = tol[RUN_F32GEMM][o] + (q8_1 ? s_err : 0);
            }
        }

    for (int mode = 0; mode < RUN_MODES; mode++) {
        if (!exact && mode != RUN_QGEMM && mode != RUN_AVX2) continue;
        if (mode == RUN_AVX2 && !loom__cpu_has_avx2()) continue;
        set_mode((run_mode)mode);
        const loom__cpu_simd *simd = loom__cpu_simd_get();
        const char *path = loom__cpu_mul_mat_path(d, simd);
        if (mode == RUN_QGEMM && simd->qgemm_tile)
            LOOM_CHECK_MSG(strcmp(path, "qgemm") == 0, "%s N=%lld: path %s, not qgemm",
                           loom_type_name(type), (long long)c.N, path);
        if (mode == RUN_QGEMM && !simd->qgemm_tile) continue; /* no int8 kernel here */
        if (mode == RUN_AVX2 && c.N >= 32) {
            const bool small_q = type != LOOM_TYPE_Q8_0 && type != LOOM_TYPE_IQ4_NL &&
                                 type != LOOM_TYPE_IQ4_XS; /* |q| <= 64 */
            LOOM_CHECK_MSG(strcmp(path, small_q ? "qgemm" : "gemm") == 0, "%s on avx2: path %s",
                           loom_type_name(type), path);
        }
        if (mode == RUN_F32GEMM) { /* the F32 GEMM from 32 columns, below it the dots */
            const bool ok =
                c.N >= 32 ? !strcmp(path, "gemm") : !strcmp(path, "quant") || !strcmp(path, "qdot");
            LOOM_CHECK_MSG(ok || !simd->gemm_tile, "%s N=%lld: path %s", loom_type_name(type),
                           (long long)c.N, path);
        }
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(d->data, 0xff, loom_nbytes(d)); /* NaN: unwritten outputs fail */
            loom_status st = loom_cpu_test_compute(d, threads);
            LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", k_mode_names[mode], loom_last_error());
            int bad = 0;
            for (int64_t o = 0; o < n_out && bad < 3; o++) {
                const float got = ((float *)d->data)[o];
                if (fabs(got - ref[o]) <= tol[mode][o]) continue;
                bad++;
                loom_test_fail(__FILE__, __LINE__,
                               "%s K=%lld M=%lld N=%lld A2=%lld B2=%lld layout %d %s%s threads=%d: "
                               "out[%lld] = %.9g, reference %.9g (tol %.3g)",
                               loom_type_name(type), (long long)c.K, (long long)c.M, (long long)c.N,
                               (long long)c.A2, (long long)c.B2, (int)c.lb, k_mode_names[mode],
                               exact ? "" : " (random b)", threads, (long long)o, got, ref[o],
                               tol[mode][o]);
            }
        }
    }
    set_mode(RUN_QGEMM);
    free(x);
    free(ad);
    free(bd);
    free(ref);
    for (int m = 0; m < RUN_MODES; m++)
        free(tol[m]);
    loom_ctx_free(ctx);
}

static const qg_case k_cases_32[] = {
    {32, 17, 33, 1, 1, B_CONTIG},      /* one block; M, N past a tile */
    {544, 37, 45, 1, 3, B_TRANSPOSED}, /* beyond one k-block (kc tail of one block) */
    {96, 16, 36, 2, 2, B_PADDED},      /* whole tiles, batch per weight */
    {288, 300, 32, 1, 1, B_CONTIG},    /* beyond one row block */
    {64, 21, 25, 1, 1, B_CONTIG},      /* below the F32 GEMM's threshold */
};

static const qg_case k_cases_256[] = {
    {256, 17, 33, 1, 1, B_CONTIG},
    {768, 37, 45, 1, 3, B_TRANSPOSED},
    {512, 300, 40, 2, 2, B_PADDED},
};

static void check_type(loom_type type) {
    const bool sb = loom_blck_size(type) == 256;
    const qg_case *cs = sb ? k_cases_256 : k_cases_32;
    const size_t n = sb ? sizeof k_cases_256 / sizeof *cs : sizeof k_cases_32 / sizeof *cs;
    for (size_t i = 0; i < n; i++) {
        check_case(type, cs[i], true);
        check_case(type, cs[i], false);
    }
}

LOOM_TEST(qgemm, q8_0) {
    check_type(LOOM_TYPE_Q8_0);
}
LOOM_TEST(qgemm, q4_0) {
    check_type(LOOM_TYPE_Q4_0);
}
LOOM_TEST(qgemm, q4_1) {
    check_type(LOOM_TYPE_Q4_1);
}
LOOM_TEST(qgemm, q5_0) {
    check_type(LOOM_TYPE_Q5_0);
}
LOOM_TEST(qgemm, q5_1) {
    check_type(LOOM_TYPE_Q5_1);
}
LOOM_TEST(qgemm, iq4_nl) {
    check_type(LOOM_TYPE_IQ4_NL);
}
LOOM_TEST(qgemm, mxfp4) {
    check_type(LOOM_TYPE_MXFP4);
}
LOOM_TEST(qgemm, q4_K) {
    check_type(LOOM_TYPE_Q4_K);
}
LOOM_TEST(qgemm, q5_K) {
    check_type(LOOM_TYPE_Q5_K);
}
LOOM_TEST(qgemm, iq4_xs) {
    check_type(LOOM_TYPE_IQ4_XS);
}
LOOM_TEST(qgemm, q6_K) {
    check_type(LOOM_TYPE_Q6_K);
}
LOOM_TEST(qgemm, q3_K) {
    check_type(LOOM_TYPE_Q3_K);
}
LOOM_TEST(qgemm, q2_K) {
    check_type(LOOM_TYPE_Q2_K);
}

/* The int8 GEMM is taken exactly for the covered types on a table with the kernel, from
 * the int8 GEMM's column threshold on; never on the portable table or with
 * LOOM_CPU_QGEMM=0. */
LOOM_TEST(qgemm, path_choice) {
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    LOOM_REQUIRE(ctx);
    static const loom_type covered[] = {
        LOOM_TYPE_Q8_0,   LOOM_TYPE_Q4_0,  LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
        LOOM_TYPE_IQ4_NL, LOOM_TYPE_MXFP4, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_IQ4_XS};
    set_mode(RUN_QGEMM);
    const loom__cpu_simd *simd = loom__cpu_simd_get();
    for (size_t i = 0; i < sizeof covered / sizeof covered[0]; i++) {
        loom_tensor *a = loom_new_tensor_2d(ctx, covered[i], 256, 4);
        loom_tensor *d = loom_mul_mat(ctx, a, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 32));
        loom_tensor *d1 = loom_mul_mat(ctx, a, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 1));
        LOOM_REQUIRE(d && d1);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d, simd), simd->qgemm_tile ? "qgemm" : "gemm") ==
                       0 ||
                   !simd->gemm_tile);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d1, simd), "qgemm") != 0);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d, &loom__cpu_simd_scalar), "qgemm") != 0);
        setenv("LOOM_CPU_QGEMM", "0", 1);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d, simd), "qgemm") != 0);
        unsetenv("LOOM_CPU_QGEMM");
    }
    /* thresholds below the F32 GEMM's: from the table's qgemm_min_n columns, and from
     * MM_QGEMM_MIN_N_Q8 (24) for Q8_0/Q4_0, whose QUANT dots win below that */
    if (simd->qgemm_tile) {
        loom_tensor *a8 = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 256, 4);
        loom_tensor *ak = loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_K, 256, 4);
        const int64_t n0 = simd->qgemm_min_n;
        loom_tensor *k_lo =
            loom_mul_mat(ctx, ak, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, n0 - 1));
        loom_tensor *k_at = loom_mul_mat(ctx, ak, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, n0));
        loom_tensor *q_lo = loom_mul_mat(ctx, a8, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 23));
        loom_tensor *q_at = loom_mul_mat(ctx, a8, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 24));
        LOOM_REQUIRE(k_lo && k_at && q_lo && q_at);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(k_lo, simd), "qdot") == 0);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(k_at, simd), "qgemm") == 0);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(q_lo, simd), "quant") == 0);
        LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(q_at, simd), n0 <= 24 ? "qgemm" : "quant") == 0);
    }
    /* float weights keep the F32 GEMM */
    loom_tensor *f = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 256, 4);
    loom_tensor *df = loom_mul_mat(ctx, f, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 64));
    LOOM_REQUIRE(df);
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(df, simd), "qgemm") != 0);
    loom_ctx_free(ctx);
}

/* MUL_MAT_ID with enough slots for its batched path: quantised experts through the int8
 * GEMM, exact activations, against the double reference (and the F32 GEMM, the dots). */
static void check_mmid(loom_type type) {
    const int64_t K = loom_blck_size(type) == 256 ? 512 : 96, M = 37, E = 4, U = 3, T = 30;
    loom_ctx *ctx = loom_cpu_test_ctx(32);
    LOOM_REQUIRE(ctx);
    const loom_type_traits *tr = loom_type_traits_get(type);
    loom_tensor *as = loom_new_tensor_3d(ctx, type, K, M, E);
    loom_tensor *b = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, K, U, T);
    loom_tensor *ids = loom_new_tensor_2d(ctx, LOOM_TYPE_I32, U, T);
    LOOM_REQUIRE(as && b && ids);
    const size_t arow_bytes = loom_row_size(type, K);
    float *x = malloc(sizeof(float) * (size_t)K);
    float *ad = malloc(sizeof(float) * (size_t)(K * M * E));
    for (int64_t r = 0; r < M * E; r++) {
        for (int64_t k = 0; k < K; k++)
            x[k] = loom_test_randf(-1.0f, 1.0f);
        tr->from_float(x, (char *)as->data + r * arow_bytes, K);
        tr->to_float((char *)as->data + r * arow_bytes, ad + r * K, K);
    }
    for (int64_t r = 0; r < U * T; r++) {
        fill_col((float *)b->data + r * K, K, true);
        ((int32_t *)ids->data)[r] = (int32_t)(loom_test_rand() % 3); /* expert 3 unused */
    }
    loom_tensor *d = loom_mul_mat_id(ctx, as, b, ids);
    LOOM_REQUIRE(d);
    for (int mode = 0; mode < RUN_MODES; mode++) {
        if (mode == RUN_AVX2 && !loom__cpu_has_avx2()) continue;
        set_mode((run_mode)mode);
        const loom__cpu_simd *simd = loom__cpu_simd_get();
        if (mode == RUN_QGEMM && simd->qgemm_tile)
            LOOM_CHECK_MSG(strcmp(loom__cpu_mul_mat_path(d, simd), "qgemm") == 0,
                           "%s MUL_MAT_ID: path %s", loom_type_name(type),
                           loom__cpu_mul_mat_path(d, simd));
        memset(d->data, 0xff, loom_nbytes(d));
        LOOM_CHECK_MSG(loom_cpu_test_compute(d, 3) == LOOM_OK, "%s", loom_last_error());
        int bad = 0;
        for (int64_t t = 0; t < T && bad < 3; t++)
            for (int64_t u = 0; u < U && bad < 3; u++) {
                const int32_t e = ((int32_t *)ids->data)[u + U * t];
                const float *bc = (const float *)b->data + (t * U + u) * K;
                for (int64_t m = 0; m < M && bad < 3; m++) {
                    const float *ar = ad + (e * M + m) * K;
                    double s = 0, mag = 0, s_err = 0;
                    for (int64_t k0 = 0; k0 < K; k0 += 32) {
                        double amax = 0, bsum = 0;
                        for (int64_t k = k0; k < k0 + 32; k++) {
                            s += (double)ar[k] * bc[k];
                            mag += fabs((double)ar[k] * bc[k]);
                            amax = fmax(amax, fabs(ar[k]));
                            bsum += fabs(bc[k]);
                        }
                        s_err += amax * bsum * 0x1p-11;
                    }
                    double tol = (double)(K + 8) * 0x1p-22 * mag;
                    if (mode == RUN_SCALAR && tr->vec_dot_type == LOOM_TYPE_Q8_1) tol += s_err;
                    const float got = ((float *)d->data)[m + M * (u + U * t)];
                    if (fabs(got - s) <= tol) continue;
                    bad++;
                    loom_test_fail(__FILE__, __LINE__,
                                   "%s MUL_MAT_ID %s: out[%lld, %lld, %lld] = %.9g, reference "
                                   "%.9g (tol %.3g)",
                                   loom_type_name(type), k_mode_names[mode], (long long)m,
                                   (long long)u, (long long)t, got, s, tol);
                }
            }
    }
    set_mode(RUN_QGEMM);
    free(x);
    free(ad);
    loom_ctx_free(ctx);
}

LOOM_TEST(qgemm, mul_mat_id_every_type) {
    static const loom_type types[] = {
        LOOM_TYPE_Q8_0,   LOOM_TYPE_Q4_0,  LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
        LOOM_TYPE_IQ4_NL, LOOM_TYPE_MXFP4, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K, LOOM_TYPE_IQ4_XS,
        LOOM_TYPE_Q6_K,   LOOM_TYPE_Q3_K,  LOOM_TYPE_Q2_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_mmid(types[i]);
}
