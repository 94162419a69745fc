/*
 * Hostile data through the block types (issue #29 item 8): every weight block type with a
 * NaN, +-Inf, 0, subnormal or max-fp16 scale (MXFP4: exponents 0, 1, 254, 255) in one block
 * of a row, and NaN/Inf activations, through dequantisation and through a CPU matmul on every
 * SIMD table this processor has (LOOM_CPU_SIMD=scalar|avx2|avx512).
 *
 * The oracle is a double dot of the dequantised weight row with the f32 activations:
 *  - a NaN anywhere in the oracle (a NaN scale, Inf * 0, a NaN activation) must come out NaN
 *    on every path; an Inf oracle must come out non-finite (the integer dots scale a block
 *    sum once, so Inf * 0 inside a block may become Inf or NaN, never a finite number);
 *  - a finite oracle must come out finite and close (the activations are quantised to the
 *    weight type's vec_dot type, so the tolerance is that of the quantisation: 2% of
 *    sum |w x| plus the fp16 rounding of huge sums);
 *  - the SIMD tables agree with the scalar one in class (NaN, Inf, finite) and value.
 * Odd sizes: a row length that is not a multiple of the block is refused at tensor creation
 * with the type's name; zero rows compute nothing and succeed.
 */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu_test_util.h"
#include "backends/cpu/quants-dot.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

#define NONE SIZE_MAX

/* Where a block's scales live: fp16 d (and dmin/m), or the MXFP4 e8m0 exponent. */
typedef struct hq_layout {
    loom_type type;
    size_t d, m; /* fp16 offsets (NONE: absent) */
    size_t e8;   /* e8m0 offset (NONE: absent) */
} hq_layout;

static const hq_layout k_types[] = {
    {LOOM_TYPE_Q4_0, offsetof(loom_block_q4_0, d), NONE, NONE},
    {LOOM_TYPE_Q4_1, offsetof(loom_block_q4_1, d), offsetof(loom_block_q4_1, m), NONE},
    {LOOM_TYPE_Q5_0, offsetof(loom_block_q5_0, d), NONE, NONE},
    {LOOM_TYPE_Q5_1, offsetof(loom_block_q5_1, d), offsetof(loom_block_q5_1, m), NONE},
    {LOOM_TYPE_Q8_0, offsetof(loom_block_q8_0, d), NONE, NONE},
    {LOOM_TYPE_Q2_K, offsetof(loom_block_q2_K, d), offsetof(loom_block_q2_K, dmin), NONE},
    {LOOM_TYPE_Q3_K, offsetof(loom_block_q3_K, d), NONE, NONE},
    {LOOM_TYPE_Q4_K, offsetof(loom_block_q4_K, d), offsetof(loom_block_q4_K, dmin), NONE},
    {LOOM_TYPE_Q5_K, offsetof(loom_block_q5_K, d), offsetof(loom_block_q5_K, dmin), NONE},
    {LOOM_TYPE_Q6_K, offsetof(loom_block_q6_K, d), NONE, NONE},
    {LOOM_TYPE_IQ4_NL, offsetof(loom_block_iq4_nl, d), NONE, NONE},
    {LOOM_TYPE_IQ4_XS, offsetof(loom_block_iq4_xs, d), NONE, NONE},
    {LOOM_TYPE_MXFP4, NONE, NONE, offsetof(loom_block_mxfp4, e)},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* Hostile fp16 scales and what each is. */
typedef struct hq_scale {
    uint16_t h;
    uint8_t e8; /* the MXFP4 counterpart */
    const char *name;
} hq_scale;

static const hq_scale k_scales[] = {
    {0x7e00, 255, "NaN"},       {0x7c00, 254, "+Inf"},    {0xfc00, 254, "-Inf"},
    {0x0000, 0, "zero"},        {0x0001, 1, "subnormal"}, {0x7bff, 254, "max-half"},
    {0xfbff, 200, "-max-half"},
};
#define N_SCALES (sizeof k_scales / sizeof k_scales[0])

static const char *const k_paths[] = {"scalar", "avx2", "avx512"};

static bool path_available(int i) {
    return i == 0 || (i == 1 && loom__cpu_has_avx2()) || (i == 2 && loom__cpu_has_avx512());
}

typedef enum { CLS_FINITE, CLS_INF, CLS_NAN } cls;

static cls classify(double v) {
    return isnan(v) ? CLS_NAN : isinf(v) ? CLS_INF : CLS_FINITE;
}

static const char *cls_name(cls c) {
    return c == CLS_NAN ? "NaN" : c == CLS_INF ? "Inf" : "finite";
}

/* Random quantised weights: K x M of type t from floats in [-1, 1]. */
static void fill_weights(loom_tensor *w) {
    const loom_type_traits *tr = loom_type_traits_get(w->type);
    const int64_t K = w->ne[0], M = w->ne[1];
    float *tmp = malloc(sizeof(float) * (size_t)K);
    for (int64_t r = 0; r < M; r++) {
        for (int64_t k = 0; k < K; k++)
            tmp[k] = loom_test_randf(-1.0f, 1.0f);
        tr->from_float(tmp, (char *)w->data + (size_t)r * w->nb[1], K);
    }
    free(tmp);
}

/* Block b of row r gets the hostile scale s (in d, and in the min where the type has one). */
static void set_scale(const hq_layout *L, loom_tensor *w, int64_t r, int64_t b, const hq_scale *s,
                      bool also_min) {
    uint8_t *blk = (uint8_t *)w->data + (size_t)r * w->nb[1] + (size_t)b * loom_type_size(L->type);
    if (L->e8 != NONE) blk[L->e8] = s->e8;
    if (L->d != NONE) memcpy(blk + L->d, &s->h, 2);
    if (also_min && L->m != NONE) memcpy(blk + L->m, &s->h, 2);
}

/* out[n][m] on the CPU backend with the given path; false (and a recorded failure) on error. */
static bool cpu_matmul(loom_tensor *w, loom_tensor *x, int path, int threads, float *out) {
    setenv("LOOM_CPU_SIMD", k_paths[path], 1);
    loom_ctx *ctx = loom_cpu_test_ctx(1);
    loom_tensor *y = loom_mul_mat(ctx, w, x);
    bool ok = y != NULL;
    if (ok) {
        const loom_status st = loom_cpu_test_compute(y, threads);
        ok = st == LOOM_OK;
        if (!ok)
            loom_test_fail(__FILE__, __LINE__, "%s matmul failed: %s", loom_type_name(w->type),
                           loom_last_error());
        else
            memcpy(out, y->data, loom_nbytes(y));
    } else {
        loom_test_fail(__FILE__, __LINE__, "%s mul_mat refused: %s", loom_type_name(w->type),
                       loom_last_error());
    }
    loom_ctx_free(ctx);
    unsetenv("LOOM_CPU_SIMD");
    return ok;
}

/* The double oracle of y[n][m] from the dequantised weights; g[n][m] = sum |w x|. */
static void oracle(const loom_tensor *w, const loom_tensor *x, double *ref, double *g) {
    const loom_type_traits *tr = loom_type_traits_get(w->type);
    const int64_t K = w->ne[0], M = w->ne[1], N = x->ne[1];
    float *wf = malloc(sizeof(float) * (size_t)K);
    for (int64_t m = 0; m < M; m++) {
        tr->to_float((const char *)w->data + (size_t)m * w->nb[1], wf, K);
        for (int64_t n = 0; n < N; n++) {
            const float *xr = (const float *)((const char *)x->data + (size_t)n * x->nb[1]);
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                s += (double)wf[k] * (double)xr[k];
                a += fabs((double)wf[k] * (double)xr[k]);
            }
            ref[n * M + m] = s;
            g[n * M + m] = a;
        }
    }
    free(wf);
}

/* Checks every path's matmul of w and x against the oracle. */
/* inf_scale: a block's scale is infinite, so Inf * 0 makes the dequantised oracle NaN where
 * the integer dot, scaling the block's sum once, gives Inf: any non-finite value is right. */
static void check_all_paths(const char *what, loom_tensor *w, loom_tensor *x, bool inf_scale) {
    const int64_t M = w->ne[1], N = x->ne[1];
    double *ref = malloc(sizeof(double) * (size_t)(M * N)),
           *g = malloc(sizeof(double) * (size_t)(M * N));
    float *got = malloc(sizeof(float) * (size_t)(M * N)),
          *scalar = malloc(sizeof(float) * (size_t)(M * N));
    oracle(w, x, ref, g);
    for (int p = 0; p < 3; p++) {
        if (!path_available(p)) continue;
        for (int threads = 1; threads <= (p == 0 ? 2 : 1); threads++) { /* 2: the scalar path */
            if (!cpu_matmul(w, x, p, threads, got)) continue;
            if (p == 0 && threads == 1) memcpy(scalar, got, sizeof(float) * (size_t)(M * N));
            const int before = loom_test_failures();
            for (int64_t i = 0; i < M * N && loom_test_failures() == before; i++) {
                const cls want =
                    inf_scale && classify(ref[i]) == CLS_NAN ? CLS_INF : classify(ref[i]);
                const cls have = classify(got[i]);
                /* sums past the float range (MXFP4 exponent 254) may overflow to Inf */
                if (want == CLS_FINITE && g[i] > 1e37 && have == CLS_INF) continue;
                const bool class_ok =
                    want == CLS_FINITE ? have == CLS_FINITE
                                       : (want == CLS_NAN ? have == CLS_NAN : have != CLS_FINITE);
                LOOM_CHECK_MSG(class_ok, "%s %s %s t%d y[%lld]: %s (%g), oracle %s (%g)", what,
                               loom_type_name(w->type), k_paths[p], threads, (long long)i,
                               cls_name(have), got[i], cls_name(want), ref[i]);
                if (want == CLS_FINITE && have == CLS_FINITE) {
                    const double tol = 0.02 * g[i] + 1e-30;
                    LOOM_CHECK_MSG(fabs(got[i] - ref[i]) <= tol,
                                   "%s %s %s t%d y[%lld]: %.9g, oracle %.9g (tol %.3g)", what,
                                   loom_type_name(w->type), k_paths[p], threads, (long long)i,
                                   got[i], ref[i], tol);
                }
                /* every path agrees with the scalar one in class, and closely in value */
                const cls sc = classify(scalar[i]);
                LOOM_CHECK_MSG(have == sc || (want != CLS_FINITE && sc != CLS_FINITE &&
                                              have != CLS_FINITE && want != CLS_NAN),
                               "%s %s %s t%d y[%lld]: %s, scalar %s", what, loom_type_name(w->type),
                               k_paths[p], threads, (long long)i, cls_name(have), cls_name(sc));
                if (have == CLS_FINITE && sc == CLS_FINITE)
                    LOOM_CHECK_MSG(fabs(got[i] - scalar[i]) <= 1e-5 * g[i] + 1e-30,
                                   "%s %s %s t%d y[%lld]: %.9g, scalar %.9g", what,
                                   loom_type_name(w->type), k_paths[p], threads, (long long)i,
                                   got[i], scalar[i]);
            }
        }
    }
    free(ref);
    free(g);
    free(got);
    free(scalar);
}

static void fill_x(loom_tensor *x) {
    float *xd = x->data;
    for (int64_t i = 0; i < loom_nelements(x); i++)
        xd[i] = loom_test_randf(-1.0f, 1.0f);
}

/* Every type, every hostile scale, in one block of row 1 (of 3 rows), 3 blocks per row, and
 * 5 activation columns (so the GEMM and GEMV paths both run). */
LOOM_TEST(hostile_quant, scales_propagate_on_every_simd_path) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const hq_layout *L = &k_types[t];
        const int64_t blk = loom_blck_size(L->type), K = 3 * blk;
        for (size_t s = 0; s < N_SCALES; s++)
            for (int min_too = 0; min_too <= (L->m != NONE); min_too++)
                for (int64_t N = 1; N <= 5; N += 4) {
                    loom_ctx *ctx = loom_cpu_test_ctx(1);
                    loom_tensor *w = loom_new_tensor_2d(ctx, L->type, K, 3);
                    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
                    LOOM_REQUIRE(w && x);
                    fill_weights(w);
                    fill_x(x);
                    set_scale(L, w, 1, 1, &k_scales[s], min_too);
                    char what[64];
                    snprintf(what, sizeof what, "scale %s%s N=%lld", k_scales[s].name,
                             min_too ? " (min too)" : "", (long long)N);
                    /* dequantisation: a NaN scale makes its block all NaN, others untouched */
                    float *row = malloc(sizeof(float) * (size_t)K);
                    loom_type_traits_get(L->type)->to_float((char *)w->data + w->nb[1], row, K);
                    for (int64_t k = 0; k < K; k++) {
                        const bool in_blk = k >= blk && k < 2 * blk;
                        if (!in_blk)
                            LOOM_CHECK_MSG(isfinite(row[k]),
                                           "%s %s: element %lld outside the block is %g", what,
                                           loom_type_name(L->type), (long long)k, row[k]);
                        else if (k_scales[s].h == 0x7e00 && L->e8 == NONE)
                            LOOM_CHECK_MSG(isnan(row[k]), "%s %s: element %lld is %g, not NaN",
                                           what, loom_type_name(L->type), (long long)k, row[k]);
                    }
                    free(row);
                    /* MXFP4's e8m0 has no NaN or Inf (255 is 2^127, as GGUF writers use it);
                     * exponents 254/255 put the block's products past the float range, where
                     * the order of the float operations decides between a finite value, Inf
                     * and NaN (Inf - Inf across SIMD lanes): those only must not crash. */
                    if (L->e8 != NONE && k_scales[s].e8 >= 254) {
                        float *y = malloc(sizeof(float) * (size_t)(3 * N));
                        for (int p = 0; p < 3; p++)
                            if (path_available(p)) LOOM_CHECK(cpu_matmul(w, x, p, 2, y));
                        free(y);
                    } else {
                        check_all_paths(what, w, x, isinf(loom_fp16_to_fp32(k_scales[s].h)));
                    }
                    loom_ctx_free(ctx);
                }
    }
}

/* A NaN or an Inf in the activations reaches every output that reads it. */
LOOM_TEST(hostile_quant, nan_and_inf_activations_propagate) {
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t t = 0; t < N_TYPES; t++) {
        const hq_layout *L = &k_types[t];
        const int64_t blk = loom_blck_size(L->type), K = 2 * blk;
        for (size_t b = 0; b < 3; b++)
            for (int64_t N = 1; N <= 5; N += 4) {
                loom_ctx *ctx = loom_cpu_test_ctx(1);
                loom_tensor *w = loom_new_tensor_2d(ctx, L->type, K, 3);
                loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
                LOOM_REQUIRE(w && x);
                fill_weights(w);
                fill_x(x);
                ((float *)x->data)[(N - 1) * K + blk + 3] = bad[b];
                char what[64];
                snprintf(what, sizeof what, "activation %g N=%lld", bad[b], (long long)N);
                check_all_paths(what, w, x, false);
                loom_ctx_free(ctx);
            }
    }
}

/* A row length that is not a multiple of the block is refused at creation, naming the type. */
LOOM_TEST(hostile_quant, odd_row_length_refused_naming_type) {
    loom_ctx *ctx = loom_cpu_test_ctx(1);
    for (size_t t = 0; t < N_TYPES; t++) {
        const loom_type ty = k_types[t].type;
        const int64_t blk = loom_blck_size(ty);
        for (int64_t K = blk - 1; K <= blk + 1; K += 2) {
            LOOM_CHECK(loom_new_tensor_2d(ctx, ty, K, 2) == NULL);
            char want[96];
            snprintf(want, sizeof want,
                     "new_tensor: %s needs ne[0] (%lld) to be a multiple of %lld",
                     loom_type_name(ty), (long long)K, (long long)blk);
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
        }
    }
    loom_ctx_free(ctx);
}

/* Zero weight rows, zero activation columns: an empty result, computed without error. */
LOOM_TEST(hostile_quant, zero_rows_compute_empty) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const loom_type ty = k_types[t].type;
        const int64_t K = loom_blck_size(ty);
        for (int c = 0; c < 2; c++) {
            loom_ctx *ctx = loom_cpu_test_ctx(1);
            loom_tensor *w = loom_new_tensor_2d(ctx, ty, K, c == 0 ? 0 : 2);
            loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, c == 0 ? 3 : 0);
            LOOM_REQUIRE(w && x);
            loom_tensor *y = loom_mul_mat(ctx, w, x);
            LOOM_REQUIRE(y != NULL);
            LOOM_CHECK_EQ_INT(loom_nelements(y), 0);
            for (int p = 0; p < 3; p++) {
                if (!path_available(p)) continue;
                setenv("LOOM_CPU_SIMD", k_paths[p], 1);
                const loom_status st = loom_cpu_test_compute(y, 2);
                LOOM_CHECK_MSG(st == LOOM_OK, "%s %s empty matmul: %s", loom_type_name(ty),
                               k_paths[p], loom_last_error());
            }
            unsetenv("LOOM_CPU_SIMD");
            loom_ctx_free(ctx);
        }
    }
}

/* A NaN written into a quantised tensor (a KV cache of that type, through CPY) makes its
 * block read back as NaN, never as finite numbers (nor undefined float-to-int conversions). */
LOOM_TEST(hostile_quant, nan_copied_into_block_type_reads_back_nan) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const loom_type ty = k_types[t].type;
        const int64_t blk = loom_blck_size(ty), K = 2 * blk;
        loom_ctx *ctx = loom_cpu_test_ctx(1);
        loom_tensor *src = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, K);
        loom_tensor *dst = loom_new_tensor_1d(ctx, ty, K);
        LOOM_REQUIRE(src && dst);
        fill_x(src);
        ((float *)src->data)[blk + 5] = NAN;
        loom_tensor *c = loom_cpy(ctx, src, dst);
        if (!c || loom_cpu_test_compute(c, 1) != LOOM_OK) {
            /* a type CPY cannot write is refused by name */
            LOOM_CHECK_STR_CONTAINS(loom_last_error(), loom_type_name(ty));
            fprintf(stderr, "%s: refused: %s\n", loom_type_name(ty), loom_last_error());
            loom_ctx_free(ctx);
            continue;
        }
        float *back = malloc(sizeof(float) * (size_t)K);
        loom_type_traits_get(ty)->to_float(dst->data, back, K);
        for (int64_t k = 0; k < K; k++)
            if (k < blk)
                LOOM_CHECK_MSG(isfinite(back[k]), "%s: element %lld of the clean block is %g",
                               loom_type_name(ty), (long long)k, back[k]);
        LOOM_CHECK_MSG(isnan(back[blk + 5]), "%s: the NaN element reads back %g",
                       loom_type_name(ty), back[blk + 5]);
        free(back);
        loom_ctx_free(ctx);
    }
}

/* An activation block of tiny subnormals (1 / scale overflows to Inf) quantises to zero
 * quants on every table, byte for byte the same (was: x * inf = NaN into an integer
 * conversion, -128 on AVX2 and 0 portable; found by tests/fuzz/quant_fuzz.c). */
LOOM_TEST(hostile_quant, subnormal_activation_blocks_quantise_to_zero_on_every_table) {
    static const loom_type acts[] = {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_1, LOOM_TYPE_Q8_K};
    const loom__cpu_simd *tabs[3] = {&loom__cpu_simd_scalar, &loom__cpu_simd_avx2,
                                     &loom__cpu_simd_avx512};
    float x[256];
    for (int k = 0; k < 256; k++)
        x[k] = k % 3 == 0 ? 0.0f : (k % 2 ? 2.7e-41f : -1e-44f);
    for (size_t a = 0; a < 3; a++) {
        const size_t bytes = loom_row_size(acts[a], 256);
        uint8_t *y[3];
        for (int p = 0; p < 3; p++) {
            y[p] = calloc(1, bytes);
            if (!path_available(p)) continue;
            loom__cpu_qact_get(acts[a], tabs[p])(x, y[p], 256);
            if (p)
                LOOM_CHECK_MSG(memcmp(y[p], y[0], bytes) == 0,
                               "%s: the %s bytes differ from the portable ones",
                               loom_type_name(acts[a]), k_paths[p]);
        }
        /* every quant is zero: the values read back are 0 */
        float back[256];
        loom_type_traits_get(acts[a])->to_float(y[0], back, 256);
        for (int k = 0; k < 256; k++)
            LOOM_CHECK_MSG(back[k] == 0.0f, "%s: element %d reads back %g", loom_type_name(acts[a]),
                           k, back[k]);
        if (acts[a] == LOOM_TYPE_Q8_1) {
            const loom_block_q8_1 *b = (const loom_block_q8_1 *)y[0];
            for (int j = 0; j < 32; j++)
                LOOM_CHECK_EQ_INT(b[0].qs[j], 0);
        }
        if (acts[a] == LOOM_TYPE_Q8_K) {
            const loom_block_q8_K *b = (const loom_block_q8_K *)y[0];
            for (int j = 0; j < 256; j++)
                LOOM_CHECK_EQ_INT(b[0].qs[j], 0);
        }
        for (int p = 0; p < 3; p++)
            free(y[p]);
    }
}
