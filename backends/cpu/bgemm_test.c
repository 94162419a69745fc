/*
 * The BF16 GEMM (MM_BGEMM, gemm-bf16.c) of BF16 weights on a CPU with AVX512_BF16, and the
 * BF16 dots with bf16 activations (MM_BDOT) that take fewer than 8 columns there.
 *
 * Against a double reference of the bf16 weights with the activations rounded to bf16
 * (round to nearest even, computed here independently of the library): only the f32
 * summation remains, so the bound is (K + 8) 2^-24 sum |a_k b_k|, far below one product;
 * a dropped pair, a wrong tail or a mis-strided column fails. Against the F32 GEMM
 * (LOOM_CPU_BGEMM=0, exact f32 activations): the activation rounding, 2^-8 sum |a_k b_k|.
 * Odd M (not a multiple of MR = 32), N (not of NR = 12), K (odd, and beyond one k-block
 * of 256), broadcast batches, strided b (transposed, padded rows), 1 and 3 threads. The
 * path is taken exactly when the CPU has AVX512_BF16 on the AVX-512 table.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu_test_util.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

typedef struct bg_case {
    int64_t K, M, N, A2, B2;
    b_layout lb;
} bg_case;

/* f32 -> bf16 -> f32, round to nearest even (finite inputs), written from the definition:
 * the nearest of the two bf16 neighbours, the even one on a tie. */
static double round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    memcpy(&lo, &lo_bits, sizeof lo);
    memcpy(&hi, &hi_bits, sizeof hi);
    const double dl = fabs((double)x - lo), dh = fabs((double)hi - x);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo_bits >> 16) % 2 == 0 ? lo : hi;
}

static bool bgemm_expected(void) {
    return strcmp(loom__cpu_simd_get()->name, "avx512") == 0 && loom__cpu_has_avx512bf16();
}

static void check_case(bg_case c) {
    loom_ctx *ctx = loom_cpu_test_ctx(64);
    LOOM_REQUIRE(ctx);
    loom_tensor *a = loom_new_tensor_3d(ctx, LOOM_TYPE_BF16, c.K, c.M, c.A2);
    loom_tensor *b = loom_cpu_test_b(ctx, c.K, c.N, c.B2, c.lb, 3, NULL);
    LOOM_REQUIRE(a && b);
    const loom_type_traits *tr = loom_type_traits_get(LOOM_TYPE_BF16);
    float *x = malloc(sizeof(float) * (size_t)c.K);
    float *ad = malloc(sizeof(float) * (size_t)(c.K * c.M * c.A2));
    float *bd = malloc(sizeof(float) * (size_t)(c.K * c.N * c.B2));
    const size_t arow_bytes = loom_row_size(LOOM_TYPE_BF16, c.K);
    for (int64_t r = 0; r < c.M * c.A2; r++) {
        for (int64_t k = 0; k < c.K; k++)
            x[k] = loom_test_randf(-1.0f, 1.0f);
        tr->from_float(x, (char *)a->data + r * arow_bytes, c.K);
        tr->to_float((char *)a->data + r * arow_bytes, ad + r * c.K, c.K);
    }
    for (int64_t r = 0; r < c.N * c.B2; r++)
        for (int64_t k = 0; k < c.K; k++) {
            bd[r * c.K + k] = loom_test_randf(-2.0f, 2.0f);
            loom_set_f32_nd(b, k, r % c.N, r / c.N, 0, bd[r * c.K + k]);
        }
    loom_tensor *d = loom_mul_mat(ctx, a, b);
    LOOM_REQUIRE(d);

    const int64_t n_out = c.M * c.N * c.B2;
    double *ref = malloc(sizeof(double) * (size_t)n_out);
    double *tol = malloc(sizeof(double) * (size_t)n_out);
    double *tol_f32 = malloc(sizeof(double) * (size_t)n_out);
    for (int64_t i2 = 0; i2 < c.B2; i2++)
        for (int64_t n = 0; n < c.N; n++) {
            const float *bc = bd + (i2 * c.N + n) * c.K;
            for (int64_t m = 0; m < c.M; m++) {
                const float *ar = ad + ((i2 / (c.B2 / c.A2)) * c.M + m) * c.K;
                double s = 0, mag = 0;
                for (int64_t k = 0; k < c.K; k++) {
                    s += (double)ar[k] * round_bf16(bc[k]);
                    mag += fabs((double)ar[k] * bc[k]);
                }
                const int64_t o = m + c.M * (n + c.N * i2);
                ref[o] = s;
                tol[o] = (double)(c.K + 8) * 0x1p-24 * mag * 1.01;
                tol_f32[o] = 0x1p-8 * 1.001 * mag + (double)(c.K + 8) * 0x1p-23 * mag;
            }
        }

    unsetenv("LOOM_CPU_SIMD");
    unsetenv("LOOM_CPU_BGEMM");
    const char *fast = c.N >= 8 ? "bgemm" : "bdot", *plain = c.N >= 8 ? "gemm" : "dot";
    const char *path = loom__cpu_mul_mat_path(d, loom__cpu_simd_get());
    LOOM_CHECK_MSG(strcmp(path, bgemm_expected() ? fast : plain) == 0 ||
                       (!bgemm_expected() && c.N >= 8 && !loom__cpu_simd_get()->gemm_tile),
                   "N=%lld: path %s", (long long)c.N, path);
    if (strcmp(path, fast) != 0) goto out; /* no AVX512_BF16 here: nothing to test */

    float *f32 = malloc(sizeof(float) * (size_t)n_out);
    setenv("LOOM_CPU_BGEMM", "0", 1);
    path = loom__cpu_mul_mat_path(d, loom__cpu_simd_get());
    LOOM_CHECK_MSG(strcmp(path, plain) == 0, "LOOM_CPU_BGEMM=0: path %s", path);
    LOOM_CHECK(loom_cpu_test_compute(d, 2) == LOOM_OK);
    memcpy(f32, d->data, sizeof(float) * (size_t)n_out);
    unsetenv("LOOM_CPU_BGEMM");

    for (int threads = 1; threads <= 3; threads += 2) {
        memset(d->data, 0xff, loom_nbytes(d)); /* NaN: unwritten outputs fail */
        loom_status st = loom_cpu_test_compute(d, threads);
        LOOM_CHECK_MSG(st == LOOM_OK, "%s", loom_last_error());
        int bad = 0;
        for (int64_t o = 0; o < n_out && bad < 3; o++) {
            const float got = ((float *)d->data)[o];
            const bool ok_ref = fabs(got - ref[o]) <= tol[o];
            const bool ok_f32 = fabs(got - f32[o]) <= tol_f32[o];
            if (ok_ref && ok_f32) continue;
            bad++;
            loom_test_fail(__FILE__, __LINE__,
                           "K=%lld M=%lld N=%lld A2=%lld B2=%lld layout %d threads=%d: "
                           "out[%lld] = %.9g, reference %.9g (tol %.3g), f32 gemm %.9g (tol %.3g)",
                           (long long)c.K, (long long)c.M, (long long)c.N, (long long)c.A2,
                           (long long)c.B2, (int)c.lb, threads, (long long)o, got, ref[o], tol[o],
                           f32[o], tol_f32[o]);
        }
    }
    free(f32);
out:
    free(x);
    free(ad);
    free(bd);
    free(ref);
    free(tol);
    free(tol_f32);
    loom_ctx_free(ctx);
}

LOOM_TEST(bgemm, odd_tails) {
    const bg_case cases[] = {
        {1, 5, 8, 1, 1, B_CONTIG},        /* K = 1: one half-empty pair */
        {33, 31, 13, 1, 1, B_CONTIG},     /* odd K, M below MR, N past NR */
        {64, 67, 25, 1, 1, B_PADDED},     /* M past two panels, padded b rows */
        {301, 40, 9, 1, 1, B_TRANSPOSED}, /* odd K beyond one k-block, strided b */
        {512, 300, 37, 1, 1, B_CONTIG},   /* M beyond one row block, two k-blocks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i]);
}

/* Fewer than 8 columns (token generation): the BDOT path, every row count 1..7 of b, odd
 * and long K (the masked weight tail, the four-chain one-row loop), strided b. */
LOOM_TEST(bgemm, bdot_few_columns) {
    const bg_case cases[] = {
        {1, 5, 1, 1, 1, B_CONTIG},         /* K = 1: a one-element tail */
        {33, 31, 1, 1, 1, B_CONTIG},       /* a 32-group and a tail */
        {2048, 67, 1, 1, 1, B_PADDED},     /* the four-chain loop, padded b rows */
        {301, 40, 2, 1, 1, B_TRANSPOSED},  /* two rows, strided b */
        {160, 19, 3, 1, 1, B_CONTIG},      /* three rows, 64-group loop then a 32-group */
        {517, 33, 4, 1, 1, B_PADDED},      /* four rows, a tail */
        {96, 35, 7, 1, 1, B_CONTIG},       /* 4 + 3 rows */
        {130, 21, 5, 1, 1, B_TRANSPOSED},  /* 4 + 1 rows */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i]);
    check_case((bg_case){96, 35, 1, 2, 4, B_CONTIG}); /* broadcast batches */
}

LOOM_TEST(bgemm, broadcast_batches) {
    check_case((bg_case){96, 35, 14, 2, 4, B_CONTIG});
    check_case((bg_case){77, 19, 12, 1, 3, B_TRANSPOSED});
}

/* Taken only on the AVX-512 table of a CPU with AVX512_BF16: from 8 columns the GEMM,
 * below that the BF16 dots; the AVX2 and portable tables (LOOM_CPU_SIMD) and
 * LOOM_CPU_BGEMM=0 keep their paths. */
LOOM_TEST(bgemm, path_only_where_supported) {
    loom_ctx *ctx = loom_cpu_test_ctx(4);
    LOOM_REQUIRE(ctx);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_BF16, 64, 16);
    loom_tensor *b8 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 8);
    loom_tensor *b7 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 7);
    loom_tensor *af = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 64, 16);
    loom_tensor *d8 = loom_mul_mat(ctx, a, b8), *d7 = loom_mul_mat(ctx, a, b7);
    loom_tensor *df = loom_mul_mat(ctx, af, b8);
    LOOM_REQUIRE(d8 && d7 && df);
    unsetenv("LOOM_CPU_BGEMM");
    unsetenv("LOOM_CPU_SIMD");
    const bool has = loom__cpu_has_avx512() && loom__cpu_has_avx512bf16();
    LOOM_CHECK_MSG(
        strcmp(loom__cpu_mul_mat_path(d8, loom__cpu_simd_get()), has ? "bgemm" : "gemm") == 0 ||
            !loom__cpu_simd_get()->gemm_tile,
        "has avx512_bf16 %d: path %s", has, loom__cpu_mul_mat_path(d8, loom__cpu_simd_get()));
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d7, loom__cpu_simd_get()), has ? "bdot" : "dot") == 0);
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(df, loom__cpu_simd_get()), "bgemm") != 0);
    /* every other table: never, whatever the CPU has */
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d8, &loom__cpu_simd_avx2), "gemm") == 0);
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d8, &loom__cpu_simd_scalar), "dot") == 0);
    setenv("LOOM_CPU_SIMD", "avx2", 1);
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d8, loom__cpu_simd_get()), "bgemm") != 0);
    unsetenv("LOOM_CPU_SIMD");
    setenv("LOOM_CPU_BGEMM", "0", 1);
    LOOM_CHECK(strcmp(loom__cpu_mul_mat_path(d8, loom__cpu_simd_get()), "bgemm") != 0);
    unsetenv("LOOM_CPU_BGEMM");
    loom_ctx_free(ctx);
}
