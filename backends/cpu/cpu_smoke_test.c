/*
 * CPU backend smoke tests: every SIMD path (portable, AVX2, AVX-512) against an
 * independent double-precision reference for matmul of each weight type at odd sizes
 * (one-row, dot and tiled-GEMM paths, batch broadcasting, strided views, MUL_MAT_ID), the
 * vectorised elementwise / softmax / flash-attention paths, the backend objects, and the
 * error paths (unsupported op, bad index, out of memory).
 *
 * The reference dequantises weights with core's type traits (not this backend's code)
 * and accumulates in double. For quantised weights the CPU quantises activations to Q8_0,
 * so the tolerance includes that rounding bound.
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

/* ---------------------------------------------------------------- helpers */

static const char *const k_paths[] = {"scalar", "avx2", "avx512"};

static bool path_available(int i) {
    return i == 0 || (i == 1 && loom__cpu_has_avx2()) || (i == 2 && loom__cpu_has_avx512());
}

static void use_path(int i) {
    setenv("LOOM_CPU_SIMD", k_paths[i], 1);
}

/* Row r of a contiguous tensor as f32, through core's traits. */
static void get_row_f32(const loom_tensor *t, int64_t r, float *y) {
    const loom_type_traits *tr = loom_type_traits_get(t->type);
    tr->to_float((const char *)t->data + r * loom_row_size(t->type, t->ne[0]), y, t->ne[0]);
}

/* ---------------------------------------------------------------- SIMD selection */

LOOM_TEST(cpu_simd, name_follows_env_cap) {
    use_path(0);
    LOOM_CHECK(strcmp(loom_cpu_simd_name(), "scalar") == 0);
    use_path(1);
    LOOM_CHECK(strcmp(loom_cpu_simd_name(), loom__cpu_has_avx2() ? "avx2" : "scalar") == 0);
    unsetenv("LOOM_CPU_SIMD");
    const char *best = loom__cpu_has_avx512() ? "avx512" : loom__cpu_has_avx2() ? "avx2" : "scalar";
    LOOM_CHECK(strcmp(loom_cpu_simd_name(), best) == 0);
}

/* ---------------------------------------------------------------- matmul */

typedef struct mm_case {
    int64_t K, M, N, A2, B2;
} mm_case;

/* dst = a x b on every path and thread count, against the double reference. */
static void check_mul_mat(loom_type type, mm_case c, bool transpose_b) {
    loom_ctx *ctx = loom_cpu_test_ctx(64);
    LOOM_REQUIRE(ctx);
    loom_tensor *a = loom_new_tensor_3d(ctx, type, c.K, c.M, c.A2);
    loom_tensor *b;
    loom_tensor *bsrc = NULL;
    if (transpose_b) {
        /* b as a transposed view of a [N, K, B2] tensor: nb0 != sizeof(float) */
        bsrc = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, c.N, c.K, c.B2);
        b = loom_transpose(ctx, bsrc);
    } else {
        b = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, c.K, c.N, c.B2);
    }
    LOOM_REQUIRE(a && b);
    float *av = malloc(sizeof(float) * (size_t)(c.K * c.M * c.A2));
    loom_cpu_test_fill_f32(av, c.K * c.M * c.A2, -1.0f, 1.0f);
    loom_cpu_test_set_from_f32(a, av);
    if (bsrc)
        loom_cpu_test_fill_f32(bsrc->data, loom_nelements(bsrc), -1.0f, 1.0f);
    else
        loom_cpu_test_fill_f32(b->data, loom_nelements(b), -1.0f, 1.0f);
    loom_tensor *d = loom_mul_mat(ctx, a, b);
    LOOM_REQUIRE(d);

    /* reference: dequantised weights (core's traits), double accumulation, and a bound on
     * the Q8_0 rounding of the activations for quantised weights */
    const int64_t n_out = c.M * c.N * c.B2;
    double *ref = malloc(sizeof(double) * (size_t)n_out),
           *tol = malloc(sizeof(double) * (size_t)n_out);
    double *tol_paths = malloc(sizeof(double) * (size_t)n_out);
    float *arow = malloc(sizeof(float) * (size_t)c.K), *bcol = malloc(sizeof(float) * (size_t)c.K);
    const bool quant = type == LOOM_TYPE_Q8_0 || type == LOOM_TYPE_Q4_0;
    for (int64_t i2 = 0; i2 < c.B2; i2++) {
        for (int64_t n = 0; n < c.N; n++) {
            for (int64_t k = 0; k < c.K; k++)
                bcol[k] = loom_get_f32_nd(b, k, n, i2, 0);
            for (int64_t m = 0; m < c.M; m++) {
                get_row_f32(a, m + c.M * (i2 / (c.B2 / c.A2)), arow);
                double s = 0, mag = 0, qerr = 0;
                for (int64_t k = 0; k < c.K; k++) {
                    s += (double)arow[k] * bcol[k];
                    mag += fabs((double)arow[k] * bcol[k]);
                }
                if (quant) {
                    for (int64_t k0 = 0; k0 < c.K; k0 += 32) {
                        double amax = 0, asum = 0;
                        for (int64_t k = k0; k < k0 + 32; k++) {
                            amax = fmax(amax, fabs(bcol[k]));
                            asum += fabs(arow[k]);
                        }
                        qerr += asum * amax / 127.0 * 0.5;
                    }
                }
                const int64_t o = m + c.M * (n + c.N * i2);
                ref[o] = s;
                /* BF16 on the AVX-512 table of a CPU with AVX512_BF16 (the BF16 GEMM, or
                 * its dots below 8 columns): activations rounded to bf16 */
                const double bf = type == LOOM_TYPE_BF16 ? 0x1p-8 * 1.001 * mag : 0;
                tol[o] = 2e-5 * mag + 1.02 * qerr + bf + 1e-6;
                /* quantised weights with many columns go through the int8 GEMM on SIMD
                 * paths (the F32 GEMM, without activation rounding, on a table without an
                 * int8 kernel for the type), through Q8 dots on the portable one */
                tol_paths[o] = 2e-5 * mag + (quant && c.N >= 32 ? 2.04 * qerr : 0) + bf + 1e-6;
            }
        }
    }

    /* the portable path's result: the SIMD paths see the same quantised activations, so
     * they must agree with it to float summation order */
    float *first = malloc(sizeof(float) * (size_t)n_out);
    bool have_first = false;
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(d->data, 0xff, loom_nbytes(d)); /* NaN: unwritten outputs fail */
            loom_status s = loom_cpu_test_compute(d, threads);
            LOOM_CHECK_MSG(s == LOOM_OK, "%s: %s", k_paths[path], loom_last_error());
            if (!have_first) memcpy(first, d->data, sizeof(float) * (size_t)n_out);
            have_first = true;
            int bad = 0;
            for (int64_t o = 0; o < n_out && bad < 3; o++) {
                float got = ((float *)d->data)[o];
                if (!(fabs(got - first[o]) <= tol_paths[o])) {
                    bad++;
                    loom_test_fail(__FILE__, __LINE__,
                                   "%s K=%lld %s threads=%d: out[%lld] = %.7g, scalar path %.7g",
                                   loom_type_name(type), (long long)c.K, k_paths[path], threads,
                                   (long long)o, got, first[o]);
                }
                if (!(fabs(got - ref[o]) <= tol[o])) {
                    bad++;
                    loom_test_fail(__FILE__, __LINE__,
                                   "%s K=%lld M=%lld N=%lld B2=%lld %s%s threads=%d: out[%lld] = "
                                   "%.7g, reference %.7g (tol %.3g)",
                                   loom_type_name(type), (long long)c.K, (long long)c.M,
                                   (long long)c.N, (long long)c.B2, k_paths[path],
                                   transpose_b ? " (b transposed)" : "", threads, (long long)o, got,
                                   ref[o], tol[o]);
                }
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    free(av);
    free(ref);
    free(tol);
    free(tol_paths);
    free(first);
    free(arow);
    free(bcol);
    loom_ctx_free(ctx);
}

static const mm_case k_mm_cases[] = {
    {64, 7, 1, 1, 1},    /* one token, odd rows */
    {96, 33, 3, 1, 1},   /* small N: dot path with a 3-column group */
    {160, 67, 13, 2, 4}, /* GEMM with edges in M and N, batches broadcast 2 -> 4 */
    {32, 5, 9, 1, 3},    /* tiny K */
    {64, 20, 100, 1, 1}, /* few rows, many columns: GEMM work split by column chunks */
};

static void check_type(loom_type type) {
    for (size_t i = 0; i < sizeof k_mm_cases / sizeof k_mm_cases[0]; i++)
        check_mul_mat(type, k_mm_cases[i], false);
    check_mul_mat(type, (mm_case){64, 19, 5, 1, 2}, true);
}

LOOM_TEST(cpu_matmul, f32_paths_agree) {
    check_type(LOOM_TYPE_F32);
}
LOOM_TEST(cpu_matmul, f16_paths_agree) {
    check_type(LOOM_TYPE_F16);
}
LOOM_TEST(cpu_matmul, bf16_paths_agree) {
    check_type(LOOM_TYPE_BF16);
}
LOOM_TEST(cpu_matmul, q8_0_paths_agree) {
    check_type(LOOM_TYPE_Q8_0);
}
LOOM_TEST(cpu_matmul, q4_0_paths_agree) {
    check_type(LOOM_TYPE_Q4_0);
}

/* K beyond one GEMM k-block, M beyond one row block, N with a partial panel. */
LOOM_TEST(cpu_matmul, gemm_blocks_and_edges) {
    check_mul_mat(LOOM_TYPE_F32, (mm_case){600, 300, 29, 1, 1}, false);
    check_mul_mat(LOOM_TYPE_F16, (mm_case){544, 263, 17, 1, 1}, false);
    check_mul_mat(LOOM_TYPE_Q4_0, (mm_case){544, 45, 20, 1, 1}, false);
    check_mul_mat(LOOM_TYPE_Q8_0, (mm_case){96, 37, 40, 1, 2}, false);
    check_mul_mat(LOOM_TYPE_Q4_0, (mm_case){288, 70, 45, 2, 2}, false);
}

/* a as a transposed view (rows not contiguous along K). */
LOOM_TEST(cpu_matmul, transposed_weights) {
    loom_ctx *ctx = loom_cpu_test_ctx(16);
    const int64_t K = 37, M = 21, N = 11;
    loom_tensor *at = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, M, K); /* stored [M, K] */
    loom_tensor *a = loom_transpose(ctx, at);                       /* view [K, M] */
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
    loom_cpu_test_fill_f32(at->data, M * K, -1, 1);
    loom_cpu_test_fill_f32(b->data, K * N, -1, 1);
    loom_tensor *d = loom_mul_mat(ctx, a, b);
    LOOM_REQUIRE(d);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        LOOM_CHECK(loom_cpu_test_compute(d, 2) == LOOM_OK);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t m = 0; m < M; m++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)loom_get_f32_nd(a, k, m, 0, 0) * loom_get_f32_nd(b, k, n, 0, 0);
                LOOM_CHECK_NEAR(loom_get_f32_nd(d, m, n, 0, 0), s, 1e-4);
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    loom_ctx_free(ctx);
}

static void check_mul_mat_id(loom_type type, int64_t B1) {
    const int64_t K = 64, M = 37, E = 4, U = 2, T = 5;
    loom_ctx *ctx = loom_cpu_test_ctx(16);
    loom_tensor *as = loom_new_tensor_3d(ctx, type, K, M, E);
    loom_tensor *b = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, K, B1, T);
    loom_tensor *ids = loom_new_tensor_2d(ctx, LOOM_TYPE_I32, U, T);
    float *av = malloc(sizeof(float) * (size_t)(K * M * E));
    loom_cpu_test_fill_f32(av, K * M * E, -1, 1);
    loom_cpu_test_set_from_f32(as, av);
    loom_cpu_test_fill_f32(b->data, loom_nelements(b), -1, 1);
    for (int64_t i = 0; i < U * T; i++)
        ((int32_t *)ids->data)[i] = (int32_t)((i * 7 + 1) % 3);
    loom_tensor *d = loom_mul_mat_id(ctx, as, b, ids);
    LOOM_REQUIRE(d);
    float *arow = malloc(sizeof(float) * (size_t)K);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        LOOM_CHECK(loom_cpu_test_compute(d, 3) == LOOM_OK);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t u = 0; u < U; u++) {
                int32_t e = ((int32_t *)ids->data)[u + U * t];
                for (int64_t m = 0; m < M; m++) {
                    get_row_f32(as, m + M * e, arow);
                    double s = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double p = (double)arow[k] * loom_get_f32_nd(b, k, u % B1, t, 0);
                        s += p;
                        mag += fabs(p);
                    }
                    double tol = type == LOOM_TYPE_Q8_0 || type == LOOM_TYPE_Q4_0
                                     ? 0.02 * mag + 1e-3
                                     : 1e-5 * mag + 1e-6;
                    LOOM_CHECK_NEAR(loom_get_f32_nd(d, m, u, t, 0), s, tol);
                }
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    free(av);
    free(arow);
    loom_ctx_free(ctx);
}

LOOM_TEST(cpu_matmul, mul_mat_id_every_type) {
    const loom_type types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                               LOOM_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_mul_mat_id(types[i], 1);
        check_mul_mat_id(types[i], 2);
    }
}

/* ---------------------------------------------------------------- vector paths */

static double silu_ref(double x) {
    return x / (1.0 + exp(-x));
}

/* add (broadcast row), scale, silu and swiglu at odd lengths, every path. */
LOOM_TEST(cpu_vec, elementwise_paths_agree) {
    const int64_t n = 37, rows = 5;
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, rows);
    loom_tensor *y = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, 1);
    loom_cpu_test_fill_f32(x->data, n * rows, -30.0f, 30.0f);
    loom_cpu_test_fill_f32(y->data, n, -2.0f, 2.0f);
    loom_tensor *sum = loom_add(ctx, x, y);
    loom_tensor *prod = loom_mul(ctx, x, y);
    loom_tensor *sc = loom_scale_bias(ctx, x, 0.75f, -0.5f);
    loom_tensor *si = loom_silu(ctx, x);
    loom_tensor *sw = loom_swiglu_split(ctx, x, sum);
    LOOM_REQUIRE(sum && prod && sc && si && sw);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        loom_tensor *outs[] = {sum, prod, sc, si, sw};
        for (int o = 0; o < 5; o++)
            LOOM_CHECK(loom_cpu_test_compute(outs[o], 2) == LOOM_OK);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < n; i++) {
                double xv = loom_get_f32_nd(x, i, r, 0, 0), yv = loom_get_f32_nd(y, i, 0, 0, 0);
                LOOM_CHECK_NEAR(loom_get_f32_nd(sum, i, r, 0, 0), xv + yv, 1e-5);
                LOOM_CHECK_NEAR(loom_get_f32_nd(prod, i, r, 0, 0), xv * yv, 1e-4);
                LOOM_CHECK_NEAR(loom_get_f32_nd(sc, i, r, 0, 0), xv * 0.75 - 0.5, 1e-5);
                LOOM_CHECK_NEAR(loom_get_f32_nd(si, i, r, 0, 0), silu_ref(xv),
                                1e-5 * fabs(xv) + 1e-6);
                LOOM_CHECK_NEAR(loom_get_f32_nd(sw, i, r, 0, 0), silu_ref(xv) * (xv + yv),
                                1e-5 * fabs(xv * (xv + yv)) + 1e-5);
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    loom_ctx_free(ctx);
}

/* softmax with a -INF mask entry and an all-masked row, every path. */
LOOM_TEST(cpu_vec, soft_max_paths_agree) {
    const int64_t n = 21, rows = 3;
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, rows);
    loom_tensor *mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, rows);
    loom_cpu_test_fill_f32(x->data, n * rows, -8.0f, 8.0f);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++)
            loom_set_f32_nd(mask, i, r, 0, 0,
                            (r == 2 || i % 5 == 3) ? -INFINITY : 0.25f * (float)r);
    loom_tensor *sm = loom_soft_max_ext(ctx, x, mask, NULL, 0.5f, 0.0f);
    LOOM_REQUIRE(sm);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        LOOM_CHECK(loom_cpu_test_compute(sm, 1) == LOOM_OK);
        for (int64_t r = 0; r < rows; r++) {
            double z[64], m = -INFINITY, s = 0;
            for (int64_t i = 0; i < n; i++) {
                z[i] = 0.5 * loom_get_f32_nd(x, i, r, 0, 0) + loom_get_f32_nd(mask, i, r, 0, 0);
                m = fmax(m, z[i]);
            }
            for (int64_t i = 0; i < n; i++)
                s += m == -INFINITY ? 0 : exp(z[i] - m);
            for (int64_t i = 0; i < n; i++) {
                double want = m == -INFINITY ? 0.0 : exp(z[i] - m) / s;
                LOOM_CHECK_NEAR(loom_get_f32_nd(sm, i, r, 0, 0), want, 1e-6);
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    loom_ctx_free(ctx);
}

/* flash attention with F16 K/V, GQA, a causal mask and sinks, every path; Nq = 6 takes a
 * full and a partial query block, with q as a permuted view. */
static void check_flash_attn(int64_t Nq, bool permuted_q) {
    const int64_t D = 40, H = 4, Hk = 2, Nkv = 9;
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    loom_tensor *q;
    if (permuted_q) {
        loom_tensor *qs = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, H, Nq);
        loom_cpu_test_fill_f32(qs->data, loom_nelements(qs), -1, 1);
        q = loom_permute(ctx, qs, 0, 2, 1, 3); /* [D, Nq, H], heads innermost in memory */
    } else {
        q = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, Nq, H);
        loom_cpu_test_fill_f32(q->data, loom_nelements(q), -1, 1);
    }
    loom_tensor *k = loom_new_tensor_3d(ctx, LOOM_TYPE_F16, D, Nkv, Hk);
    loom_tensor *v = loom_new_tensor_3d(ctx, LOOM_TYPE_F16, D, Nkv, Hk);
    loom_tensor *mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, Nkv, Nq);
    loom_tensor *sinks = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, H);
    for (int64_t i = 0; i < loom_nelements(k); i++) {
        ((uint16_t *)k->data)[i] = loom_fp32_to_fp16(loom_test_randf(-1, 1));
        ((uint16_t *)v->data)[i] = loom_fp32_to_fp16(loom_test_randf(-1, 1));
    }
    for (int64_t j = 0; j < Nq; j++)
        for (int64_t i = 0; i < Nkv; i++)
            loom_set_f32_nd(mask, i, j, 0, 0, i > Nkv - Nq + j ? -INFINITY : 0.0f);
    loom_cpu_test_fill_f32(sinks->data, H, -1, 1);
    const float scale = 0.3f;
    loom_tensor *o = loom_flash_attn_ext(ctx, q, k, v, mask, sinks, scale, 0.0f, 0.0f);
    LOOM_REQUIRE(o);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        LOOM_CHECK(loom_cpu_test_compute(o, 2) == LOOM_OK);
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / (H / Hk);
            for (int64_t j = 0; j < Nq; j++) {
                double z[32], m = loom_get_f32_nd(sinks, h, 0, 0, 0), s = 0;
                for (int64_t i = 0; i < Nkv; i++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += (double)loom_get_f32_nd(q, d, j, h, 0) *
                               loom_get_f32_nd(k, d, i, hk, 0);
                    z[i] = scale * dot + loom_get_f32_nd(mask, i, j, 0, 0);
                    m = fmax(m, z[i]);
                }
                for (int64_t i = 0; i < Nkv; i++)
                    s += exp(z[i] - m);
                s += exp(loom_get_f32_nd(sinks, h, 0, 0, 0) - m);
                for (int64_t d = 0; d < D; d++) {
                    double want = 0;
                    for (int64_t i = 0; i < Nkv; i++)
                        want += exp(z[i] - m) / s * loom_get_f32_nd(v, d, i, hk, 0);
                    LOOM_CHECK_NEAR(loom_get_f32_nd(o, d, h, j, 0), want, 1e-5);
                }
            }
        }
    }
    unsetenv("LOOM_CPU_SIMD");
    loom_ctx_free(ctx);
}

LOOM_TEST(cpu_vec, flash_attn_f16_paths_agree) {
    check_flash_attn(3, false);
    check_flash_attn(6, true);
}

/* NaN in, NaN out (docs/ops.md): a NaN score of an unmasked key, a NaN in v and a NaN
 * sink each make that query's output NaN, while the other queries stay finite; a NaN
 * logit makes its softmax row NaN. Every path. */
LOOM_TEST(cpu_vec, flash_attn_and_soft_max_propagate_nan) {
    const int64_t D = 8, Nq = 4, Nkv = 5;
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    for (int which = 0; which < 3; which++) { /* NaN in q, in v, in the sink */
        loom_tensor *q = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, Nq, 1);
        loom_tensor *k = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, Nkv, 1);
        loom_tensor *v = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, Nkv, 1);
        loom_tensor *sinks = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 1);
        loom_cpu_test_fill_f32(q->data, loom_nelements(q), -1, 1);
        loom_cpu_test_fill_f32(k->data, loom_nelements(k), -1, 1);
        loom_cpu_test_fill_f32(v->data, loom_nelements(v), -1, 1);
        ((float *)sinks->data)[0] = 0.5f;
        if (which == 0) loom_set_f32_nd(q, 3, 1, 0, 0, NAN); /* query 1 only */
        if (which == 1) loom_set_f32_nd(v, 2, 4, 0, 0, NAN); /* every query reads key 4 */
        if (which == 2) ((float *)sinks->data)[0] = NAN;     /* every query */
        loom_tensor *o = loom_flash_attn_ext(ctx, q, k, v, NULL, sinks, 0.5f, 0.0f, 0.0f);
        LOOM_REQUIRE(o);
        for (int path = 0; path < 3; path++) {
            if (!path_available(path)) continue;
            use_path(path);
            LOOM_CHECK(loom_cpu_test_compute(o, 1) == LOOM_OK);
            for (int64_t j = 0; j < Nq; j++) {
                for (int64_t d = 0; d < D; d++) {
                    /* NaN in v reaches only its own output dimension */
                    bool want_nan = which == 0 ? j == 1 : which == 1 ? d == 2 : true;
                    float y = loom_get_f32_nd(o, d, 0, j, 0);
                    LOOM_CHECK_MSG(want_nan ? isnan(y) : isfinite(y),
                                   "nan case %d path %s query %lld dim %lld: %g", which,
                                   k_paths[path], (long long)j, (long long)d, (double)y);
                }
            }
        }
    }
    /* softmax: row 0 has one NaN logit, row 1 is finite, row 2 is all NaN */
    const int64_t n = 7;
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, n, 3);
    loom_cpu_test_fill_f32(x->data, 3 * n, -2, 2);
    loom_set_f32_nd(x, 4, 0, 0, 0, NAN);
    for (int64_t i = 0; i < n; i++)
        loom_set_f32_nd(x, i, 2, 0, 0, NAN);
    loom_tensor *sm = loom_soft_max_ext(ctx, x, NULL, NULL, 1.0f, 0.0f);
    LOOM_REQUIRE(sm);
    for (int path = 0; path < 3; path++) {
        if (!path_available(path)) continue;
        use_path(path);
        LOOM_CHECK(loom_cpu_test_compute(sm, 1) == LOOM_OK);
        for (int64_t r = 0; r < 3; r++)
            for (int64_t i = 0; i < n; i++) {
                float y = loom_get_f32_nd(sm, i, r, 0, 0);
                LOOM_CHECK_MSG(r == 1 ? isfinite(y) : isnan(y),
                               "softmax path %s row %lld [%lld]: %g", k_paths[path], (long long)r,
                               (long long)i, (double)y);
            }
    }
    unsetenv("LOOM_CPU_SIMD");
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- errors */

LOOM_TEST(cpu_errors, unsupported_op_names_op_tensor_and_types) {
    loom_ctx *ctx = loom_cpu_test_ctx(4);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_I32, 32, 4);
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 2);
    loom_tensor *d = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4, 2);
    d->op = LOOM_OP_MUL_MAT; /* hand-made: the builder would refuse i32 weights */
    d->src[0] = a;
    d->src[1] = b;
    loom_set_name(d, "weird");
    LOOM_CHECK(!loom_cpu_supports_op(d));
    loom_graph *g = loom_graph_new(ctx, 8);
    LOOM_REQUIRE(g && loom_graph_add_node(g, d) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_cpu_graph_compute(g, NULL), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "MUL_MAT");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "weird");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "i32");
    loom_ctx_free(ctx);
}

LOOM_TEST(cpu_errors, get_rows_index_out_of_range) {
    loom_ctx *ctx = loom_cpu_test_ctx(4);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 8, 5);
    loom_tensor *ids = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 3);
    loom_cpu_test_fill_f32(a->data, 40, -1, 1);
    ((int32_t *)ids->data)[0] = 1;
    ((int32_t *)ids->data)[1] = 5; /* R = 5: out of range */
    ((int32_t *)ids->data)[2] = 0;
    loom_tensor *r = loom_get_rows(ctx, a, ids);
    LOOM_REQUIRE(r);
    loom_set_name(r, "emb");
    LOOM_CHECK_EQ_INT(loom_cpu_test_compute(r, 2), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "GET_ROWS 'emb'");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "out of range");
    ((int32_t *)ids->data)[1] = 4;
    LOOM_CHECK_EQ_INT(loom_cpu_test_compute(r, 2), LOOM_OK);
    LOOM_CHECK_NEAR(loom_get_f32_nd(r, 3, 1, 0, 0), loom_get_f32_nd(a, 3, 4, 0, 0), 0);
    loom_ctx_free(ctx);
}

/* Tiny nodes (below the solo cost) run on thread 0 alone without barriers between them;
 * nodes big enough to split run on every thread. A graph alternating both gives the same
 * values on 1, 2 and 3 threads, and a data error in a tiny node followed by big ones
 * comes back as an error (no hang: every thread meets at the next shared barrier). */
LOOM_TEST(cpu_threads, tiny_nodes_run_solo_between_split_nodes) {
    loom_ctx *ctx = loom_cpu_test_ctx(16);
    loom_tensor *emb = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 50);
    loom_tensor *ids = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 3);
    loom_tensor *w1 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 1024);
    loom_tensor *w2 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 512);
    loom_cpu_test_fill_f32(emb->data, 64 * 50, -1, 1);
    loom_cpu_test_fill_f32(w1->data, 64 * 1024, -0.2f, 0.2f);
    loom_cpu_test_fill_f32(w2->data, 1024 * 512, -0.05f, 0.05f);
    int32_t *id = ids->data;
    id[0] = 3, id[1] = 49, id[2] = 0;
    loom_tensor *x = loom_get_rows(ctx, emb, ids);                    /* tiny */
    loom_tensor *y = loom_mul_mat(ctx, w1, loom_scale(ctx, x, 0.5f)); /* tiny, then split */
    loom_tensor *z = loom_scale(ctx, loom_silu(ctx, y), 2.0f);        /* tiny, tiny */
    loom_tensor *o = loom_mul_mat(ctx, w2, z);                        /* split */
    loom_tensor *out = loom_add(ctx, o, o);                           /* tiny */
    LOOM_REQUIRE(out);
    loom_set_name(x, "emb_rows");
    static float ref[512 * 3];
    LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, 1), LOOM_OK);
    memcpy(ref, out->data, sizeof ref);
    /* the values against a direct evaluation of the chain for one column */
    {
        const float *e = (const float *)emb->data + 49 * 64, *a = w1->data, *b = w2->data;
        static float zz[1024];
        for (int m = 0; m < 1024; m++) {
            double acc = 0;
            for (int k = 0; k < 64; k++)
                acc += (double)a[m * 64 + k] * 0.5 * e[k];
            zz[m] = (float)(2.0 * acc / (1.0 + exp(-acc)));
        }
        for (int n = 0; n < 512; n += 37) {
            double acc = 0;
            for (int k = 0; k < 1024; k++)
                acc += (double)b[n * 1024 + k] * zz[k];
            LOOM_CHECK_NEAR(ref[512 + n], 2.0 * acc, 1e-4);
        }
    }
    for (int threads = 2; threads <= 3; threads++) {
        memset(out->data, 0, sizeof ref);
        LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, threads), LOOM_OK);
        const float *got = out->data;
        for (int i = 0; i < 512 * 3; i++)
            LOOM_CHECK_NEAR(got[i], ref[i], 1e-6f * (1.0f + fabsf(ref[i])));
    }
    id[1] = 50; /* out of range: the first (tiny) node fails */
    for (int threads = 1; threads <= 3; threads++) {
        LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, threads), LOOM_ERR_INVALID_ARG);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "GET_ROWS 'emb_rows'");
    }
    loom_ctx_free(ctx);
}

/* Nodes that touch no bytes another node of the phase writes share a phase (graph.c): the
 * Q, K and V projections of one token (QUANT, QDOT and DOT paths, each quantising b in its
 * own scratch) run without a barrier between them, and the values are those of one thread.
 * Phases here: {q, k, v}, then {s = k + v (tiny), o = wo q}, then {out = o + s (tiny)}. */
LOOM_TEST(cpu_threads, independent_nodes_share_a_phase) {
    loom_ctx *ctx = loom_cpu_test_ctx(16);
    const int64_t E = 256;
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, E, 1);
    loom_tensor *wq = loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_0, E, 2 * E);
    loom_tensor *wk = loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_K, E, E);
    loom_tensor *wv = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, E, E);
    loom_tensor *wo = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 2 * E, E);
    static float buf[2 * 256 * 256];
    loom_tensor *ws[] = {wq, wk, wv, wo};
    for (int i = 0; i < 4; i++) {
        loom_cpu_test_fill_f32(buf, loom_nelements(ws[i]), -0.1f, 0.1f);
        loom_cpu_test_set_from_f32(ws[i], buf);
    }
    loom_cpu_test_fill_f32(x->data, E, -1, 1);
    loom_tensor *q = loom_mul_mat(ctx, wq, x), *k = loom_mul_mat(ctx, wk, x);
    loom_tensor *v = loom_mul_mat(ctx, wv, x);
    loom_tensor *sum = loom_add(ctx, k, v);
    loom_tensor *out = loom_add(ctx, loom_mul_mat(ctx, wo, q), sum);
    LOOM_REQUIRE(out);
    static float ref[256];
    LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, 1), LOOM_OK);
    memcpy(ref, out->data, sizeof ref);
    /* one output against a double-precision evaluation of the chain from the same
     * dequantised weights (the activations' Q8 rounding bounds the difference) */
    {
        static float dq[2 * 256 * 256];
        double qv[512], kv = 0, vv = 0, o = 0;
        const int m = 17;
        for (int i = 0; i < 2 * E; i++) {
            loom__cpu_row_to_f32(wq->type, (char *)wq->data + i * wq->nb[1], wq->nb[0], 0, E, dq);
            qv[i] = 0;
            for (int j = 0; j < E; j++)
                qv[i] += (double)dq[j] * ((float *)x->data)[j];
        }
        loom__cpu_row_to_f32(wk->type, (char *)wk->data + m * wk->nb[1], wk->nb[0], 0, E, dq);
        for (int j = 0; j < E; j++)
            kv += (double)dq[j] * ((float *)x->data)[j];
        loom__cpu_row_to_f32(wv->type, (char *)wv->data + m * wv->nb[1], wv->nb[0], 0, E, dq);
        for (int j = 0; j < E; j++)
            vv += (double)dq[j] * ((float *)x->data)[j];
        loom__cpu_row_to_f32(wo->type, (char *)wo->data + m * wo->nb[1], wo->nb[0], 0, 2 * E, dq);
        for (int j = 0; j < 2 * E; j++)
            o += (double)dq[j] * qv[j];
        LOOM_CHECK_NEAR(ref[m], o + kv + vv, 0.02 * (1.0 + fabs(o + kv + vv)));
    }
    for (int threads = 2; threads <= 4; threads++) {
        for (int rep = 0; rep < 10; rep++) {
            memset(out->data, 0, sizeof ref);
            loom_threadpool_stats a, b;
            loom_threadpool_get_stats(&a);
            LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, threads), LOOM_OK);
            loom_threadpool_get_stats(&b);
            /* two barriers between the three phases, none inside the token matmuls */
            LOOM_CHECK_EQ_INT(b.barriers - a.barriers, 2);
            const float *got = out->data;
            for (int i = 0; i < E; i++)
                LOOM_CHECK_NEAR(got[i], ref[i], 1e-6f * (1.0f + fabsf(ref[i])));
        }
    }
    loom_ctx_free(ctx);
}

/* A data error in one of two nodes of the same phase (both split over the threads), or in a
 * tiny node run inside a barrier, stops every thread at the same barrier: an error, never
 * a hang, whichever node fails. */
LOOM_TEST(cpu_threads, error_inside_a_shared_phase) {
    loom_ctx *ctx = loom_cpu_test_ctx(16);
    loom_tensor *ea = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 64);
    loom_tensor *eb = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 64);
    loom_tensor *ia = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 40);
    loom_tensor *ib = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 40);
    loom_cpu_test_fill_f32(ea->data, 1024 * 64, -1, 1);
    loom_cpu_test_fill_f32(eb->data, 1024 * 64, -1, 1);
    loom_tensor *ra = loom_get_rows(ctx, ea, ia), *rb = loom_get_rows(ctx, eb, ib);
    loom_tensor *mid = loom_scale(ctx, loom_add(ctx, ra, rb), 0.5f);
    /* then a tiny node (run inside the next barrier by the last thread to arrive) and a
     * split matmul over its result */
    loom_tensor *ic = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 2);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 64);
    loom_cpu_test_fill_f32(w->data, 1024 * 64, -0.1f, 0.1f);
    loom_tensor *rc = loom_get_rows(ctx, mid, ic);
    loom_tensor *out = loom_mul_mat(ctx, w, rc);
    LOOM_REQUIRE(out);
    loom_set_name(ra, "rows_a");
    loom_set_name(rb, "rows_b");
    loom_set_name(rc, "rows_c");
    ((int32_t *)ic->data)[0] = 39, ((int32_t *)ic->data)[1] = 3;
    int32_t *a = ia->data, *b = ib->data;
    for (int i = 0; i < 40; i++)
        a[i] = i, b[i] = 63 - i;
    for (int threads = 1; threads <= 3; threads++) {
        LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, threads), LOOM_OK);
        LOOM_CHECK_NEAR(
            loom_get_f32_nd(mid, 5, 39, 0, 0),
            0.5f * (loom_get_f32_nd(ea, 5, 39, 0, 0) + loom_get_f32_nd(eb, 5, 24, 0, 0)), 1e-6);
        double dot = 0; /* out[7, 0] = w row 7 . mid row 39 */
        for (int k = 0; k < 1024; k++)
            dot += (double)loom_get_f32_nd(w, k, 7, 0, 0) * loom_get_f32_nd(mid, k, 39, 0, 0);
        LOOM_CHECK_NEAR(loom_get_f32_nd(out, 7, 0, 0, 0), dot, 1e-4);
        for (int bad = 0; bad < 3; bad++) {
            int32_t *ids = bad == 0 ? a : bad == 1 ? b : ic->data;
            const int n = bad == 2 ? 2 : 40;
            for (int rep = 0; rep < 20; rep++) {
                const int at = (rep * 7) % n, keep = ids[at];
                ids[at] = 64 + rep;
                LOOM_CHECK_EQ_INT(loom_cpu_test_compute(out, threads), LOOM_ERR_INVALID_ARG);
                LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad == 0   ? "'rows_a'"
                                                           : bad == 1 ? "'rows_b'"
                                                                      : "'rows_c'");
                ids[at] = keep;
            }
        }
    }
    loom_ctx_free(ctx);
}

static int g_fail_after = -1;
static void *failing_malloc(size_t n, void *ud) {
    (void)ud;
    if (g_fail_after == 0) return NULL;
    if (g_fail_after > 0) g_fail_after--;
    return malloc(n);
}
static void *failing_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    if (g_fail_after == 0) return NULL;
    return realloc(p, n);
}
static void plain_free(void *p, void *ud) {
    (void)ud;
    free(p);
}
static const loom_allocator k_failing = {failing_malloc, failing_realloc, plain_free, NULL};

/* The scratch of a quantised matmul cannot be allocated: NOMEM, no crash, and the same
 * graph computes once memory is back. */
LOOM_TEST(cpu_errors, scratch_out_of_memory) {
    loom_ctx *ctx = loom_cpu_test_ctx(4);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 64, 8);
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 3);
    float av[64 * 8];
    loom_cpu_test_fill_f32(av, 64 * 8, -1, 1);
    loom_cpu_test_set_from_f32(a, av);
    loom_cpu_test_fill_f32(b->data, 64 * 3, -1, 1);
    loom_tensor *d = loom_mul_mat(ctx, a, b);
    loom_graph *g = loom_graph_new(ctx, 8);
    LOOM_REQUIRE(d && g && loom_graph_build_forward(g, d) == LOOM_OK);
    g_fail_after = 0;
    loom_allocator_set(&k_failing);
    loom_status s = loom_cpu_graph_compute(g, NULL);
    loom_allocator_set(NULL);
    g_fail_after = -1;
    LOOM_CHECK_EQ_INT(s, LOOM_ERR_NOMEM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "scratch");
    LOOM_CHECK_EQ_INT(loom_cpu_graph_compute(g, NULL), LOOM_OK);
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- backend objects */

LOOM_TEST(cpu_backend, reg_device_and_buffer_type) {
    loom_reg_t reg = loom_cpu_reg();
    LOOM_CHECK(strcmp(loom_reg_name(reg), "CPU") == 0);
    LOOM_REQUIRE(loom_reg_dev_count(reg) == 1);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    LOOM_CHECK(dev == loom_cpu_dev());
    LOOM_CHECK(strcmp(loom_dev_name(dev), "CPU") == 0);
    LOOM_CHECK_EQ_INT(loom_dev_get_type(dev), LOOM_DEV_TYPE_CPU);
    loom_dev_props props;
    loom_dev_get_props(dev, &props);
    LOOM_CHECK(props.memory_total > 0 && props.memory_free <= props.memory_total);
    LOOM_CHECK(!props.caps.async && !props.caps.host_buffer && !props.caps.events);
    LOOM_CHECK(props.description && props.description[0]);

    loom_buft_t buft = loom_dev_buffer_type(dev);
    LOOM_CHECK(buft == loom_cpu_buffer_type());
    LOOM_CHECK(strcmp(loom_buft_name(buft), "CPU") == 0);
    LOOM_CHECK_EQ_INT(loom_buft_alignment(buft), 64);
    LOOM_CHECK(loom_buft_is_host(buft));
    LOOM_CHECK(loom_dev_supports_buft(dev, buft));
    loom_buffer_t buf = loom_buft_alloc_buffer(buft, 1000);
    LOOM_REQUIRE(buf);
    LOOM_CHECK_EQ_INT(loom_buffer_size(buf), 1000);
    LOOM_CHECK(((uintptr_t)loom_buffer_base(buf) & 63) == 0);
    loom_buffer_clear(buf, 7);
    LOOM_CHECK(((uint8_t *)loom_buffer_base(buf))[999] == 7);
    loom_buffer_free(buf);

    loom_buffer_t empty = loom_buft_alloc_buffer(buft, 0);
    LOOM_CHECK(empty != NULL);
    loom_buffer_free(empty);

    char mem[256];
    loom_buffer_t wrap = loom_cpu_buffer_from_ptr(mem, sizeof mem);
    LOOM_REQUIRE(wrap);
    LOOM_CHECK(loom_buffer_base(wrap) == mem);
    LOOM_CHECK(loom_buffer_is_host(wrap));
    loom_buffer_free(wrap); /* must not free mem */
}

LOOM_TEST(cpu_backend, alloc_failure_names_size) {
    g_fail_after = 0;
    loom_allocator_set(&k_failing);
    loom_buffer_t buf = loom_buft_alloc_buffer(loom_cpu_buffer_type(), 123456);
    loom_allocator_set(NULL);
    g_fail_after = -1;
    LOOM_CHECK(buf == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "123456");
}

LOOM_TEST(cpu_backend, init_params) {
    loom_dev_t dev = loom_cpu_dev();
    loom_backend_t be = loom_dev_init(dev, "threads=2");
    LOOM_REQUIRE(be);
    LOOM_CHECK(loom_backend_is_cpu(be));
    LOOM_CHECK(strcmp(loom_backend_name(be), "CPU") == 0);
    loom_backend_free(be);
    LOOM_CHECK(loom_dev_init(dev, "threads=two") == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "threads=two");
    LOOM_CHECK(loom_dev_init(dev, "colour=blue") == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "colour=blue");
    be = loom_dev_init(dev, NULL);
    LOOM_REQUIRE(be);
    loom_backend_free(be);
}

/* A graph in a CPU buffer, computed by a 2-thread backend, copied between buffers. */
LOOM_TEST(cpu_backend, computes_graph_in_buffers) {
    loom_ctx_params cp = {.mem_size = 1 << 20, .mem_buffer = NULL, .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 19, 6);
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 19, 6);
    loom_tensor *c = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 19, 6);
    loom_tensor *out = loom_silu(ctx, loom_add(ctx, a, b));
    LOOM_REQUIRE(out);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_cpu_buffer_type());
    LOOM_REQUIRE(buf);
    float av[19 * 6], bv[19 * 6];
    loom_cpu_test_fill_f32(av, 19 * 6, -3, 3);
    loom_cpu_test_fill_f32(bv, 19 * 6, -3, 3);
    loom_tensor_set(a, av, 0, sizeof av);
    loom_tensor_set(b, bv, 0, sizeof bv);
    loom_graph *g = loom_graph_new(ctx, 16);
    LOOM_REQUIRE(g && loom_graph_build_forward(g, out) == LOOM_OK);
    loom_backend_t be = loom_cpu_backend_new(2);
    LOOM_REQUIRE(be);
    LOOM_CHECK(loom_backend_supports_op(be, out));
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(be, g), LOOM_OK);
    loom_cpu_backend_set_n_threads(be, 1);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(be, g), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_tensor_copy(out, c), LOOM_OK);
    float cv[19 * 6];
    loom_tensor_get(c, cv, 0, sizeof cv);
    for (int i = 0; i < 19 * 6; i++)
        LOOM_CHECK_NEAR(cv[i], silu_ref((double)av[i] + bv[i]), 1e-5);
    loom_backend_free(be);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
}
