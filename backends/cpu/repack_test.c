/*
 * Repacked weights (repack.h): IQ4_NL, Q4_K and Q4_0 matmul weights in a caller-memory
 * weights buffer (as a mapped model file's) are copied once into rows interleaved by 4 and
 * read from there by the AVX-512 QDOT/QUANT dots (N < 16, Q4_0 < 24) and the int8 GEMM's
 * A packer (beyond).
 *
 * Oracle: a double dot of the dequantised weights (core's to_float) with b, whose columns
 * are exact in Q8 (every 32-block q * 2^-e with integer |q| <= 127, one of them 127, e the
 * same per 256-chunk, as in qgemm_test), so every path must equal it up to float rounding
 * of the per-block sums (bound: 1e-5 of sum |a_k b_k|). Checked for row counts that are not
 * multiples of 4 (tail rows), 1..5, 17 and 33 columns, on every SIMD table the CPU has (the
 * AVX-512 one through the copy, the others through the original after it was advised out)
 * and with LOOM_CPU_REPACK=0; GET_ROWS of the same weight in the same graph reads the
 * original layout; a write into the buffer drops the copy (the next run sees the new
 * weights); freeing the buffer frees the copies.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu_test_util.h"
#include "backends/cpu/repack.h"
#include "loom/backend.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

static void fill_exact(float *x, int64_t K) {
    for (int64_t c0 = 0; c0 < K; c0 += 256) {
        const float scale = ldexpf(1.0f, -(5 + (int)(loom_test_rand() % 5)));
        for (int64_t k0 = c0; k0 < K && k0 < c0 + 256; k0 += 32) {
            const int peak = (int)(loom_test_rand() % 32);
            for (int l = 0; l < 32; l++) {
                int q = (int)(loom_test_rand() % 255) - 127;
                if (l == peak) q = loom_test_rand() % 2 ? 127 : -127;
                x[k0 + l] = (float)q * scale;
            }
        }
    }
}

typedef struct rp_fixture {
    loom_ctx *ctx;
    loom_buffer_t buf;
    void *mem;
    loom_tensor *a, *b, *ids, *mm, *gr;
    float *ad, *bd;
    double *ref, *mag; /* the double dot and sum |a_k b_k| of each output, [n][m] */
    int64_t K, M, N;
} rp_fixture;

/* The reference of every output, from the dequantised weights ad. */
static void reference(rp_fixture *f) {
    for (int64_t n = 0; n < f->N; n++)
        for (int64_t m = 0; m < f->M; m++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < f->K; k++) {
                const double p = (double)f->ad[m * f->K + k] * f->bd[n * f->K + k];
                ref += p;
                mag += fabs(p);
            }
            f->ref[n * f->M + m] = ref;
            f->mag[n * f->M + m] = mag;
        }
}

/* Weights quantised from random floats into the caller buffer; ad gets them dequantised. */
static void write_weights(rp_fixture *f, loom_type type) {
    const loom_type_traits *tr = loom_type_traits_get(type);
    const size_t rb = loom_row_size(type, f->K);
    char *q = malloc(rb * (size_t)f->M);
    float *x = malloc(sizeof(float) * (size_t)f->K);
    LOOM_REQUIRE(q && x);
    for (int64_t r = 0; r < f->M; r++) {
        for (int64_t k = 0; k < f->K; k++)
            x[k] = loom_test_randf(-1.0f, 1.0f);
        tr->from_float(x, q + r * rb, f->K);
        tr->to_float(q + r * rb, f->ad + r * f->K, f->K);
    }
    loom_tensor_set(f->a, q, 0, rb * (size_t)f->M);
    free(q);
    free(x);
    if (f->ref) reference(f);
}

static void setup(rp_fixture *f, loom_type type, int64_t K, int64_t M, int64_t N) {
    memset(f, 0, sizeof *f);
    f->K = K, f->M = M, f->N = N;
    f->ctx = loom_cpu_test_ctx(64);
    LOOM_REQUIRE(f->ctx);
    loom_ctx_set_no_alloc(f->ctx, true);
    f->a = loom_new_tensor_2d(f->ctx, type, K, M);
    loom_ctx_set_no_alloc(f->ctx, false);
    const size_t bytes = loom_row_size(type, K) * (size_t)M;
    f->mem = loom_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    f->buf = loom_cpu_buffer_from_ptr(f->mem, bytes);
    LOOM_REQUIRE(f->a && f->mem && f->buf);
    loom_buffer_set_usage(f->buf, LOOM_BUFFER_USAGE_WEIGHTS);
    LOOM_REQUIRE(loom_buffer_alloc_tensor(f->buf, f->a, 0) == LOOM_OK);
    f->ad = malloc(sizeof(float) * (size_t)(K * M));
    f->bd = malloc(sizeof(float) * (size_t)(K * N));
    LOOM_REQUIRE(f->ad && f->bd);
    f->b = loom_new_tensor_2d(f->ctx, LOOM_TYPE_F32, K, N);
    for (int64_t n = 0; n < N; n++)
        fill_exact(f->bd + n * K, K);
    f->ref = malloc(sizeof(double) * (size_t)(M * N));
    f->mag = malloc(sizeof(double) * (size_t)(M * N));
    LOOM_REQUIRE(f->ref && f->mag);
    write_weights(f, type);
    memcpy(f->b->data, f->bd, sizeof(float) * (size_t)(K * N));
    /* rows to gather: the first, the last (a tail row when M % 4) and one inside a group */
    f->ids = loom_new_tensor_1d(f->ctx, LOOM_TYPE_I32, 3);
    int32_t *id = f->ids->data;
    id[0] = 0, id[1] = (int32_t)(M - 1), id[2] = (int32_t)(M / 2);
    f->mm = loom_mul_mat(f->ctx, f->a, f->b);
    f->gr = loom_get_rows(f->ctx, f->a, f->ids);
    LOOM_REQUIRE(f->mm && f->gr);
}

static void teardown(rp_fixture *f) {
    loom_buffer_free(f->buf);
    loom_aligned_free(f->mem);
    loom_ctx_free(f->ctx);
    free(f->ad);
    free(f->bd);
    free(f->ref);
    free(f->mag);
}

/* MUL_MAT and GET_ROWS of the weight in one graph on `threads` threads. */
static loom_status compute_both(rp_fixture *f, int threads) {
    loom_ctx *gctx = loom_cpu_test_ctx(4);
    loom_graph *g = loom_graph_new(gctx, 64);
    loom_status s = loom_graph_build_forward(g, f->mm);
    if (s == LOOM_OK) s = loom_graph_build_forward(g, f->gr);
    if (s == LOOM_OK) {
        loom_threadpool *tp = threads > 1 ? loom_threadpool_new(threads) : NULL;
        s = loom_cpu_graph_compute(g, tp);
        if (tp) loom_threadpool_free(tp);
    }
    loom_ctx_free(gctx);
    return s;
}

/* Every output against the double dot, every gathered row against the dequantised row. */
static int check_outputs(const rp_fixture *f, const char *what) {
    int bad = 0;
    const float *out = f->mm->data;
    for (int64_t n = 0; n < f->N; n++)
        for (int64_t m = 0; m < f->M; m++) {
            const double ref = f->ref[n * f->M + m], mag = f->mag[n * f->M + m];
            const double got = out[n * (f->mm->nb[1] / sizeof(float)) + m];
            if (fabs(got - ref) > 1e-5 * mag + 1e-30 && bad++ < 3)
                loom_test_fail(__FILE__, __LINE__, "%s: K %lld M %lld N %lld: out[%lld, %lld] = %.9g, reference %.9g "
                            "(bound %.3g)",
                            what, (long long)f->K, (long long)f->M, (long long)f->N, (long long)m,
                            (long long)n, got, ref, 1e-5 * mag);
        }
    const int32_t *id = f->ids->data;
    for (int i = 0; i < 3; i++) {
        const float *row = (const float *)((const char *)f->gr->data + i * f->gr->nb[1]);
        if (memcmp(row, f->ad + id[i] * f->K, sizeof(float) * (size_t)f->K) != 0 && bad++ < 3)
            loom_test_fail(__FILE__, __LINE__, "%s: get_rows of row %d differs from the dequantised weight row", what,
                        id[i]);
    }
    return bad;
}

typedef struct rp_mode {
    const char *name, *simd, *repack;
    bool copied; /* the run reads the repacked copy */
} rp_mode;

static void check_type(loom_type type, int64_t K) {
    const int64_t Ms[] = {4, 7, 13, 67}, Ns[] = {1, 2, 3, 5, 17, 33};
    const bool avx512 = loom__cpu_has_avx512();
    const rp_mode modes[] = {
        {"avx512 repacked", "avx512", NULL, true},
        {"avx512 LOOM_CPU_REPACK=0", "avx512", "0", false},
        {"avx2 (original)", "avx2", NULL, false},
        {"scalar (original)", "scalar", NULL, false},
    };
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
            rp_fixture f;
            setup(&f, type, K, Ms[mi], Ns[ni]);
            for (size_t o = 0; o < sizeof modes / sizeof *modes; o++) {
                const rp_mode *md = &modes[o];
                if (!strcmp(md->simd, "avx512") && !avx512) continue;
                if (!strcmp(md->simd, "avx2") && !loom__cpu_has_avx2()) continue;
                setenv("LOOM_CPU_SIMD", md->simd, 1);
                if (md->repack)
                    setenv("LOOM_CPU_REPACK", md->repack, 1);
                else
                    unsetenv("LOOM_CPU_REPACK");
                for (int threads = 1; threads <= 2; threads++) {
                    memset(f.mm->data, 0x7f, loom_nbytes(f.mm));
                    LOOM_REQUIRE(compute_both(&f, threads) == LOOM_OK);
                    const loom__cpu_repack *rp =
                        loom__cpu_repack_of(f.a, loom__cpu_simd_get());
                    LOOM_CHECK_EQ_INT(rp != NULL, md->copied);
                    char what[96];
                    snprintf(what, sizeof what, "%s %s, %d threads", loom_type_name(type),
                             md->name, threads);
                    if (check_outputs(&f, what)) {
                        teardown(&f);
                        unsetenv("LOOM_CPU_SIMD");
                        unsetenv("LOOM_CPU_REPACK");
                        return;
                    }
                }
            }
            unsetenv("LOOM_CPU_SIMD");
            unsetenv("LOOM_CPU_REPACK");
            size_t before = loom__cpu_repack_count(NULL);
            teardown(&f);
            if (avx512) LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), before - 1);
        }
}

LOOM_TEST(cpu_repack, iq4_nl_every_path_matches_the_double_dot) {
    check_type(LOOM_TYPE_IQ4_NL, 96);
    check_type(LOOM_TYPE_IQ4_NL, 512);
}

LOOM_TEST(cpu_repack, q4_0_every_path_matches_the_double_dot) {
    check_type(LOOM_TYPE_Q4_0, 96);
    check_type(LOOM_TYPE_Q4_0, 512);
}

LOOM_TEST(cpu_repack, q4_K_every_path_matches_the_double_dot) {
    check_type(LOOM_TYPE_Q4_K, 256);
    check_type(LOOM_TYPE_Q4_K, 512);
}

/* A write into the weights buffer drops the copy: the next run reads the new weights. */
LOOM_TEST(cpu_repack, a_write_drops_the_copy) {
    if (!loom__cpu_has_avx512()) LOOM_SKIP("no AVX-512 table on this CPU");
    for (int t = 0; t < 3; t++) {
        const loom_type type = t == 2 ? LOOM_TYPE_Q4_0 : t ? LOOM_TYPE_Q4_K : LOOM_TYPE_IQ4_NL;
        rp_fixture f;
        setup(&f, type, 256, 9, 1);
        LOOM_REQUIRE(compute_both(&f, 2) == LOOM_OK);
        LOOM_CHECK_EQ_INT(check_outputs(&f, "first weights"), 0);
        size_t bytes = 0;
        const size_t n = loom__cpu_repack_count(&bytes);
        LOOM_CHECK_EQ_INT(n, 1);
        /* the copy: at least the weight, at most 1.1x it (the memory figure of the file) */
        LOOM_CHECK(bytes >= loom_nbytes(f.a));
        LOOM_CHECK(bytes * 10 <= loom_nbytes(f.a) * 11);
        write_weights(&f, type);
        LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), n - 1);
        LOOM_REQUIRE(compute_both(&f, 2) == LOOM_OK);
        LOOM_CHECK_EQ_INT(check_outputs(&f, "rewritten weights"), 0);
        LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), n);
        teardown(&f);
        LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), n - 1);
    }
}

/* A caller-memory buffer not marked as weights, and a view of a weight, are never copied
 * (their MUL_MAT reads the original and is still right). */
LOOM_TEST(cpu_repack, only_caller_memory_weights_are_copied) {
    if (!loom__cpu_has_avx512()) LOOM_SKIP("no AVX-512 table on this CPU");
    rp_fixture f;
    setup(&f, LOOM_TYPE_IQ4_NL, 256, 8, 1);
    loom_buffer_set_usage(f.buf, LOOM_BUFFER_USAGE_ANY);
    const size_t n0 = loom__cpu_repack_count(NULL);
    LOOM_REQUIRE(compute_both(&f, 1) == LOOM_OK);
    LOOM_CHECK_EQ_INT(check_outputs(&f, "not weights"), 0);
    LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), n0);
    LOOM_CHECK(loom__cpu_repack_of(f.a, loom__cpu_simd_get()) == NULL);
    /* a view of the weight's first 4 rows */
    loom_buffer_set_usage(f.buf, LOOM_BUFFER_USAGE_WEIGHTS);
    loom_tensor *v = loom_view_2d(f.ctx, f.a, f.K, 4, f.a->nb[1], 0);
    loom_tensor *mm = loom_mul_mat(f.ctx, v, f.b);
    LOOM_REQUIRE(v && mm);
    LOOM_REQUIRE(loom_cpu_test_compute(mm, 1) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), n0);
    for (int m = 0; m < 4; m++)
        LOOM_CHECK_NEAR(((const float *)mm->data)[m], f.ref[m], 1e-5 * f.mag[m]);
    teardown(&f);
}

/* A weight of more than one 1 MiB piece (the copy is made and advised out piece by piece):
 * 917 rows of 2048 IQ4_NL (1152 bytes each): pieces of 912 rows, then 4, then 1 tail row. */
LOOM_TEST(cpu_repack, a_weight_of_several_pieces) {
    if (!loom__cpu_has_avx512()) LOOM_SKIP("no AVX-512 table on this CPU");
    const int64_t Ns[] = {1, 5};
    for (int i = 0; i < 2; i++) {
        rp_fixture f;
        setup(&f, LOOM_TYPE_IQ4_NL, 2048, 917, Ns[i]);
        setenv("LOOM_CPU_SIMD", "avx512", 1);
        LOOM_REQUIRE(compute_both(&f, 2) == LOOM_OK);
        LOOM_CHECK(loom__cpu_repack_of(f.a, loom__cpu_simd_get()) != NULL);
        LOOM_CHECK_EQ_INT(check_outputs(&f, "several pieces"), 0);
        unsetenv("LOOM_CPU_SIMD");
        teardown(&f);
    }
}
