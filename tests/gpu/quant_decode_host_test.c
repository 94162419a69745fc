/*
 * The block-type decode and the KV-cache quantisers of backends/cuda/kernels-quant.cuh,
 * compiled for the host (the CUDA qualifiers defined away, each __f*_rn an operation rounded
 * on its own through a volatile), against core's reference dequantisers and quantisers: bit
 * for bit, on quantised data and on random bytes (every scale bit pattern). This runs
 * without a GPU wherever the toolkit's headers are (the GPU tests then hold the compiled
 * kernels to the same functions through the CPU backend).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/core.h"
#include "tests/shim/loom_test.h"

#define __device__
#define __host__
#define __forceinline__ inline
#define __constant__

static float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}
static float __fadd_rn(float a, float b) {
    volatile float r = a + b;
    return r;
}
static float __fsub_rn(float a, float b) {
    volatile float r = a - b;
    return r;
}
static float __fdiv_rn(float a, float b) {
    volatile float r = a / b;
    return r;
}
static float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* the device conversions are held to these by cuda.fp16_conversions_bit_identical_to_cpu */
static float cu_fp16_to_f32(uint16_t h) {
    return loom_fp16_to_fp32(h);
}
static uint16_t cu_f32_to_fp16(float f) {
    return loom_fp32_to_fp16(f);
}

#include "backends/cuda/kernels-quant.cuh"

static const struct {
    loom_type t;
    int cu;
} k_types[] = {
    {LOOM_TYPE_Q8_0, LOOM_CU_Q8_0},     {LOOM_TYPE_Q4_0, LOOM_CU_Q4_0},
    {LOOM_TYPE_Q4_1, LOOM_CU_Q4_1},     {LOOM_TYPE_Q5_0, LOOM_CU_Q5_0},
    {LOOM_TYPE_Q5_1, LOOM_CU_Q5_1},     {LOOM_TYPE_IQ4_NL, LOOM_CU_IQ4_NL},
    {LOOM_TYPE_MXFP4, LOOM_CU_MXFP4},   {LOOM_TYPE_Q2_K, LOOM_CU_Q2_K},
    {LOOM_TYPE_Q3_K, LOOM_CU_Q3_K},     {LOOM_TYPE_Q4_K, LOOM_CU_Q4_K},
    {LOOM_TYPE_Q5_K, LOOM_CU_Q5_K},     {LOOM_TYPE_Q6_K, LOOM_CU_Q6_K},
    {LOOM_TYPE_IQ4_XS, LOOM_CU_IQ4_XS},
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
#define N_VALS 1024 /* four 256-blocks, 32 32-blocks */

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Values in [-3.5, 2.5) with a zero block (32 values), a block of one value and an
 * all-positive block. */
static void values(float *x, uint64_t seed) {
    for (int i = 0; i < N_VALS; i++)
        x[i] = (float)(next(&seed) % 1000000) / 1000000.0f * 6.0f - 3.5f;
    for (int i = 0; i < 32; i++) {
        x[i] = 0.0f;
        x[32 + i] = 1.25f;
        x[64 + i] = fabsf(x[64 + i]) + 0.5f;
    }
}

/* Elements of got and want that differ by bits (NaN matching any NaN). */
static int count_diff(const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i]))) bad++;
    return bad;
}

/* cu_qval value by value and cu_dequant32 chunk by chunk against the type's to_float. */
static void check_decode(loom_type t, int cu, const char *blocks, const char *what) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    const int bs = (int)tr->blck_size, ts = (int)tr->type_size;
    static float want[N_VALS], got[N_VALS], got32[N_VALS];
    tr->to_float(blocks, want, N_VALS);
    for (int i = 0; i < N_VALS; i++)
        got[i] = cu_qval(cu, blocks + (i / bs) * ts, i % bs);
    for (int c = 0; c < N_VALS / 32; c++)
        cu_dequant32(cu, blocks + (c * 32 / bs) * ts, (c * 32) % bs, got32 + 32 * c);
    const int bad = count_diff(got, want, N_VALS), bad32 = count_diff(got32, want, N_VALS);
    LOOM_CHECK_MSG(bad == 0, "%s, %s: cu_qval differs from the reference in %d of %d values",
                   loom_type_name(t), what, bad, N_VALS);
    LOOM_CHECK_MSG(bad32 == 0, "%s, %s: cu_dequant32 differs from the reference in %d of %d",
                   loom_type_name(t), what, bad32, N_VALS);
}

LOOM_TEST(cuda_quant_host, block_sizes_match_core) {
    for (int i = 0; i < N_TYPES; i++) {
        const loom_type_traits *tr = loom_type_traits_get((int)k_types[i].t);
        LOOM_CHECK_MSG(cu_is_quant(k_types[i].cu), "%s", loom_type_name(k_types[i].t));
        LOOM_CHECK_EQ_INT((int64_t)cu_qk(k_types[i].cu), (int64_t)tr->blck_size);
        LOOM_CHECK_EQ_INT((int64_t)cu_qbytes(k_types[i].cu), (int64_t)tr->type_size);
    }
}

LOOM_TEST(cuda_quant_host, decode_bit_identical_to_reference) {
    static char blocks[N_VALS / 32 * 64]; /* the largest block is 210 bytes per 256 values */
    static float x[N_VALS];
    for (int i = 0; i < N_TYPES; i++) {
        const loom_type_traits *tr = loom_type_traits_get((int)k_types[i].t);
        values(x, 0x9e3779b97f4a7c15ull + (uint64_t)i);
        tr->from_float(x, blocks, N_VALS);
        check_decode(k_types[i].t, k_types[i].cu, blocks, "quantised values");
        uint64_t s = 0x2545f4914f6cdd1dull + (uint64_t)i;
        for (size_t b = 0; b < sizeof blocks; b++)
            blocks[b] = (char)(next(&s) >> 56);
        check_decode(k_types[i].t, k_types[i].cu, blocks, "random bytes");
    }
}

LOOM_TEST(cuda_quant_host, kv_quantisers_bit_identical_to_reference) {
    static const loom_type kv[] = {LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
                                   LOOM_TYPE_IQ4_NL};
    static float x[N_VALS];
    static char want[N_VALS], got[N_VALS];
    for (int i = 0; i < 4; i++) {
        const loom_type_traits *tr = loom_type_traits_get((int)kv[i]);
        const int ts = (int)tr->type_size;
        values(x, 0x1234567ull + (uint64_t)i);
        tr->from_float(x, want, N_VALS);
        for (int c = 0; c < N_VALS / 32; c++) {
            char *out = got + c * ts;
            const float *v = x + 32 * c;
            if (kv[i] == LOOM_TYPE_Q4_1) cu_quantize_q_1(v, out, 15);
            if (kv[i] == LOOM_TYPE_Q5_1) cu_quantize_q_1(v, out, 31);
            if (kv[i] == LOOM_TYPE_Q5_0) cu_quantize_q5_0(v, out);
            if (kv[i] == LOOM_TYPE_IQ4_NL) cu_quantize_iq4_nl(v, out);
        }
        int bad = 0;
        for (int c = 0; c < N_VALS / 32; c++)
            bad += memcmp(got + c * ts, want + c * ts, (size_t)ts) != 0;
        LOOM_CHECK_MSG(bad == 0, "%s: %d of %d blocks differ from core's quantiser",
                       loom_type_name(kv[i]), bad, N_VALS / 32);
    }
}

/* The per-type matvec kernels (kernels-mm.cu, issue 25) read value k of a weight row as
 * cu_qval(T, row + blk * nb0, e) with (blk, e) = loom__cu_mmv_pos(k, qk): that walk, value
 * by value over a row of every block type, is the reference's dequantised row. */
LOOM_TEST(cuda_quant_host, matvec_walk_reads_every_value_as_reference) {
    static char blocks[N_VALS / 32 * 64];
    static float x[N_VALS], want[N_VALS], got[N_VALS];
    for (int i = 0; i < N_TYPES; i++) {
        const loom_type_traits *tr = loom_type_traits_get((int)k_types[i].t);
        values(x, 0x51ed27ull + (uint64_t)i);
        tr->from_float(x, blocks, N_VALS);
        tr->to_float(blocks, want, N_VALS);
        const int qk = cu_qk(k_types[i].cu);
        for (int64_t k = 0; k < N_VALS; k++) {
            int64_t blk;
            int e;
            loom__cu_mmv_pos(k, qk, &blk, &e);
            LOOM_REQUIRE(blk * qk + e == k && e >= 0 && e < qk);
            got[k] = cu_qval(k_types[i].cu, blocks + blk * (int64_t)tr->type_size, e);
        }
        const int bad = count_diff(got, want, N_VALS);
        LOOM_CHECK_MSG(bad == 0, "%s: the matvec walk differs from the reference in %d of %d",
                       loom_type_name(k_types[i].t), bad, N_VALS);
    }
}
