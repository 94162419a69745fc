/*
 * qdot_bench: the dot kernels of the N = 1 matvec (F16, BF16, Q8_0, Q4_0 from the SIMD
 * table, every other block type from quants-*.c), one core, weights resident in L2, for every
 * SIMD table the CPU has: bytes of weights and ns per block, and the in-cache GB/s one core
 * reaches. This is the compute ceiling of the N = 1 matvec: the matvec reaches the memory
 * bandwidth only when this figure, times the threads, exceeds it. Every kernel's result is
 * checked against the portable instance. Then the activation quantisers, per row.
 *
 *   qdot_bench [--size K] [--reps R] [--small]
 *
 * --reps R: exactly R timed passes of 8 x 64 rows per kernel (1 + 512 R calls, e.g. to count
 * instructions per block under callgrind, which runs the AVX2 and portable tables).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/quants-dot.h"
#include "backends/cpu/repack.h"
#include "bench/bench_rng.h"
#include "loom/loom.h"

/* one weight row against the activations: the SIMD table's own dots for F16, BF16 (f32
 * activations), Q8_0 and Q4_0 (Q8 activation rows), the quants-*.c dots otherwise */
static float dot_one(loom_type t, const loom__cpu_simd *simd, int64_t K, const void *w,
                     const void *y) {
    float out = 0.0f;
    switch (t) {
    case LOOM_TYPE_F16:
        simd->dot_f16(K, w, y, (size_t)K, 1, &out);
        return out;
    case LOOM_TYPE_BF16:
        simd->dot_bf16(K, w, y, (size_t)K, 1, &out);
        return out;
    case LOOM_TYPE_Q8_0:
        simd->dot_q8_0(K / 32, w, y, 0, 1, &out);
        return out;
    case LOOM_TYPE_Q4_0:
        simd->dot_q4_0(K / 32, w, y, 0, 1, &out);
        return out;
    default:
        return loom__cpu_qdot_get(t, simd)(K, w, y);
    }
}

int main(int argc, char **argv) {
    int64_t K = 4096;
    bool small = false;
    int fixed_reps = 0; /* > 0: exactly that many timed passes (for instruction counts) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) {
            small = true;
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            K = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            fixed_reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: qdot_bench [--size K] [--reps R] [--small]\n");
            return 2;
        }
    }
    if (K <= 0 || K % 256) {
        fprintf(stderr, "qdot_bench: --size must be a positive multiple of 256\n");
        return 2;
    }
    static const loom_type types[] = {
        LOOM_TYPE_F16,  LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,   LOOM_TYPE_Q4_0,  LOOM_TYPE_Q4_1,
        LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1, LOOM_TYPE_IQ4_NL, LOOM_TYPE_MXFP4, LOOM_TYPE_Q2_K,
        LOOM_TYPE_Q3_K, LOOM_TYPE_Q4_K, LOOM_TYPE_Q5_K,   LOOM_TYPE_Q6_K,  LOOM_TYPE_IQ4_XS};
    const struct {
        const char *name;
        const loom__cpu_simd *simd;
        bool ok;
    } isas[] = {{"scalar", &loom__cpu_simd_scalar, true},
                {"avx2", &loom__cpu_simd_avx2, loom__cpu_has_avx2()},
                {"avx512", &loom__cpu_simd_avx512, loom__cpu_has_avx512()}};
    const int rows = 64; /* 64 rows of 4096: at most ~150 KiB of weights, in L2 */
    const double min_s = small ? 0.01 : 0.2;
    printf("qdot_bench: K = %lld, %d weight rows in cache, one core\n\n", (long long)K, rows);
    printf("%-7s %-7s %9s %9s %10s %12s\n", "type", "simd", "B/block", "ns/block", "GB/s",
           "vs scalar");
    int failed = 0;
    float *f = malloc(sizeof(float) * (size_t)K * rows);
    uint64_t rng = 42;
    for (int64_t i = 0; i < K * rows; i++)
        f[i] = rng_uniform(&rng);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const loom_type_traits *tr = loom_type_traits_get(types[t]);
        const bool fl = types[t] == LOOM_TYPE_F16 || types[t] == LOOM_TYPE_BF16;
        const bool q8a = types[t] == LOOM_TYPE_Q8_0 || types[t] == LOOM_TYPE_Q4_0;
        const size_t rb = loom_row_size(types[t], K);
        const size_t yb = fl    ? sizeof(float) * (size_t)K
                          : q8a ? loom__q8a_row_bytes(K / 32)
                                : loom_row_size(tr->vec_dot_type, K);
        char *w = malloc(rb * rows), *y = malloc(yb);
        tr->from_float(f, w, K * rows);
        if (fl) /* any row of the same range */
            memcpy(y, f + K, yb);
        else if (q8a)
            loom__cpu_simd_scalar.quantize_q8a(f + K, y, K);
        else
            loom_type_traits_get(tr->vec_dot_type)->from_float(f + K, y, K);
        const int64_t nblk = K / loom_blck_size(types[t]);
        float ref = 0.0f;
        for (size_t s = 0; s < sizeof isas / sizeof isas[0]; s++) {
            if (!isas[s].ok) continue;
            const loom__cpu_simd *simd = isas[s].simd;
            float r0 = dot_one(types[t], simd, K, w, y);
            if (s == 0) ref = r0;
            bool ok = fabsf(r0 - ref) <= 1e-4f * (fabsf(ref) + 1.0f);
            failed += !ok;
            double best = INFINITY, spent = 0;
            volatile float sink = 0;
            int reps = 0;
            while (fixed_reps > 0 ? reps < fixed_reps : spent < min_s || reps < 3) {
                int64_t t0 = loom_time_ns();
                float acc = 0;
                for (int it = 0; it < 8; it++)
                    for (int r = 0; r < rows; r++)
                        acc += dot_one(types[t], simd, K, w + (size_t)r * rb, y);
                sink += acc;
                double dt = (double)(loom_time_ns() - t0) * 1e-9 / (8.0 * rows);
                spent += dt * 8 * rows;
                if (dt < best) best = dt;
                reps++;
            }
            (void)sink;
            printf("%-7s %-7s %9.0f %9.2f %10.1f %12s\n", loom_type_name(types[t]), isas[s].name,
                   (double)rb / (double)nblk, best * 1e9 / (double)nblk, (double)rb / best * 1e-9,
                   ok ? "same" : "DIFFERS");
        }
        /* the 4-row dots over repacked rows (backends/cpu/repack.h), where the table has one */
        const loom__cpu_qdot4_fn dot4 = loom__cpu_qdot4_get(types[t], &loom__cpu_simd_avx512);
        if (dot4 && loom__cpu_has_avx512()) {
            char *wr = malloc(loom__cpu_repack_bytes(types[t], K, rows));
            const size_t gb = (size_t)nblk * loom__cpu_repack_gblk_bytes(types[t]);
            loom__cpu_repack_rows(types[t], K, rows, w, wr);
            bool ok = true;
            for (int g = 0; g < rows / LOOM__RP_ROWS; g++) {
                float out[LOOM__RP_ROWS];
                dot4(K, wr + (size_t)g * gb, y, out);
                for (int l = 0; l < LOOM__RP_ROWS; l++) {
                    const float r1 = dot_one(types[t], &loom__cpu_simd_scalar, K,
                                             w + (size_t)(g * LOOM__RP_ROWS + l) * rb, y);
                    ok = ok && fabsf(out[l] - r1) <= 1e-4f * (fabsf(r1) + 1.0f);
                }
            }
            failed += !ok;
            double best = INFINITY, spent = 0;
            volatile float sink = 0;
            int reps = 0;
            while (fixed_reps > 0 ? reps < fixed_reps : spent < min_s || reps < 3) {
                int64_t t0 = loom_time_ns();
                float acc = 0, out[LOOM__RP_ROWS];
                for (int it = 0; it < 8; it++)
                    for (int g = 0; g < rows / LOOM__RP_ROWS; g++) {
                        dot4(K, wr + (size_t)g * gb, y, out);
                        acc += out[0];
                    }
                sink += acc;
                double dt = (double)(loom_time_ns() - t0) * 1e-9 / (8.0 * rows);
                spent += dt * 8 * rows;
                if (dt < best) best = dt;
                reps++;
            }
            (void)sink;
            printf("%-7s %-7s %9.0f %9.2f %10.1f %12s\n", loom_type_name(types[t]), "avx512x4",
                   (double)rb / (double)nblk, best * 1e9 / (double)nblk, (double)rb / best * 1e-9,
                   ok ? "same" : "DIFFERS");
            free(wr);
        }
        free(w);
        free(y);
    }
    /* the activations are quantised once per matmul, by one thread when N = 1 */
    const loom__cpu_simd *best = loom__cpu_simd_get();
    printf("\nactivation quantisation, one row of K floats, one core (us/row):\n");
    printf("%-7s %12s %12s\n", "type", "from_float", best->name);
    static const loom_type acts[] = {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_1, LOOM_TYPE_Q8_K};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        const loom__cpu_qact_fn fns[2] = {loom_type_traits_get(acts[a])->from_float,
                                          loom__cpu_qact_get(acts[a], best)};
        char *y = malloc(loom_row_size(acts[a], K));
        double us[2];
        for (int v = 0; v < 2; v++) {
            double bt = INFINITY, spent = 0;
            for (int reps = 0; spent < min_s || reps < 3; reps++) {
                int64_t t0 = loom_time_ns();
                for (int it = 0; it < 16; it++)
                    fns[v](f + (it % rows) * K, y, K);
                double dt = (double)(loom_time_ns() - t0) * 1e-9 / 16.0;
                spent += dt * 16;
                if (dt < bt) bt = dt;
            }
            us[v] = bt * 1e6;
        }
        printf("%-7s %12.2f %12.2f\n", loom_type_name(acts[a]), us[0], us[1]);
        free(y);
    }
    free(f);
    if (failed) {
        fprintf(stderr, "qdot_bench: %d kernel(s) differ from the portable one\n", failed);
        return 1;
    }
    return 0;
}
