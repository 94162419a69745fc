/*
 * types_test.c: the type traits, fp16/bf16 conversion against independent references
 * computed with double arithmetic (frexp/ldexp, explicit round-half-even), and the
 * Q8_0/Q4_0 quantisers' round-trip error bounds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core-impl.h"
#include "tests/shim/loom_test.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round half to even of a non-negative double */
static double rne(double n) {
    double fl = floor(n), diff = n - fl;
    if (diff > 0.5) return fl + 1;
    if (diff < 0.5) return fl;
    return fmod(fl, 2.0) == 0.0 ? fl : fl + 1;
}

/* Reference fp16 decode: the value formula of IEEE binary16. */
static double ref_f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (exp == 0)
        v = ldexp(mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

/* Reference fp32 -> fp16 for non-NaN input. */
static uint16_t ref_f32_to_f16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(a)) return sign | 0x7c00;
    if (a == 0) return sign;
    int ex;
    frexp(a, &ex); /* a = m * 2^ex, m in [0.5, 1) */
    double q = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ex - 11);
    double val = rne(a / q) * q;
    if (val >= 65536.0) return sign | 0x7c00;
    if (val < 0x1p-14) return sign | (uint16_t)(val / 0x1p-24);
    double m = frexp(val, &ex);
    return sign | (uint16_t)((ex - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}

/* Reference fp32 -> bf16 for non-NaN input. */
static uint16_t ref_f32_to_bf16(float f) {
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(a)) return sign | 0x7f80;
    if (a == 0) return sign;
    int ex;
    frexp(a, &ex);
    double q = ldexp(1.0, ex - 8);
    if (q < 0x1p-133) q = 0x1p-133;
    double val = rne(a / q) * q;
    if (val >= 0x1p128) return sign | 0x7f80;
    return sign | (uint16_t)(bits_of((float)val) >> 16);
}

LOOM_TEST(types, traits_table) {
    static const struct {
        int type;
        const char *name;
        int64_t blck;
        size_t size;
        bool quant, conv;
    } want[] = {
        {LOOM_TYPE_F32, "f32", 1, 4, false, true},    {LOOM_TYPE_F16, "f16", 1, 2, false, true},
        {LOOM_TYPE_BF16, "bf16", 1, 2, false, true},  {LOOM_TYPE_Q8_0, "q8_0", 32, 34, true, true},
        {LOOM_TYPE_Q4_0, "q4_0", 32, 18, true, true}, {LOOM_TYPE_I8, "i8", 1, 1, false, false},
        {LOOM_TYPE_I16, "i16", 1, 2, false, false},   {LOOM_TYPE_I32, "i32", 1, 4, false, false},
        {LOOM_TYPE_I64, "i64", 1, 8, false, false},
        /* GGUF's block layouts: ids and bytes per block */
        {LOOM_TYPE_Q4_1, "q4_1", 32, 20, true, true},     {LOOM_TYPE_Q5_0, "q5_0", 32, 22, true, true},
        {LOOM_TYPE_Q5_1, "q5_1", 32, 24, true, true},     {LOOM_TYPE_Q8_1, "q8_1", 32, 36, true, true},
        {LOOM_TYPE_Q2_K, "q2_K", 256, 84, true, true},    {LOOM_TYPE_Q3_K, "q3_K", 256, 110, true, true},
        {LOOM_TYPE_Q4_K, "q4_K", 256, 144, true, true},   {LOOM_TYPE_Q5_K, "q5_K", 256, 176, true, true},
        {LOOM_TYPE_Q6_K, "q6_K", 256, 210, true, true},   {LOOM_TYPE_Q8_K, "q8_K", 256, 292, true, true},
        {LOOM_TYPE_IQ4_NL, "iq4_nl", 32, 18, true, true}, {LOOM_TYPE_IQ4_XS, "iq4_xs", 256, 136, true, true},
        {LOOM_TYPE_MXFP4, "mxfp4", 32, 17, true, true},
    };
    int n_valid = 0;
    for (int t = -3; t < LOOM_TYPE_COUNT + 5; t++)
        n_valid += loom_type_is_valid(t);
    LOOM_CHECK_EQ_INT(n_valid, 22);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const loom_type_traits *tr = loom_type_traits_get(want[i].type);
        LOOM_REQUIRE(tr != NULL);
        LOOM_CHECK(strcmp(tr->name, want[i].name) == 0);
        LOOM_CHECK(strcmp(loom_type_name((loom_type)want[i].type), want[i].name) == 0);
        LOOM_CHECK_EQ_INT(tr->blck_size, want[i].blck);
        LOOM_CHECK_EQ_INT(tr->type_size, want[i].size);
        LOOM_CHECK_EQ_INT(loom_blck_size((loom_type)want[i].type), want[i].blck);
        LOOM_CHECK_EQ_INT(loom_type_size((loom_type)want[i].type), want[i].size);
        LOOM_CHECK(tr->is_quantized == want[i].quant);
        LOOM_CHECK((tr->to_float != NULL) == want[i].conv);
        LOOM_CHECK((tr->from_float != NULL) == want[i].conv);
    }
    /* ids a hostile file could carry */
    LOOM_CHECK(loom_type_traits_get(-1) == NULL);
    LOOM_CHECK(loom_type_traits_get(4) == NULL); /* GGUF's removed Q4_2 */
    LOOM_CHECK(loom_type_traits_get(16) == NULL); /* IQ2_XXS: no kernels */
    LOOM_CHECK(loom_type_traits_get(LOOM_TYPE_COUNT) == NULL);
    LOOM_CHECK(loom_type_traits_get(1 << 30) == NULL);
    /* the literal ids GGUF files carry */
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q4_1, 3);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q5_0, 6);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q5_1, 7);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q2_K, 10);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q6_K, 14);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_Q8_K, 15);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_IQ4_NL, 20);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_IQ4_XS, 23);
    LOOM_CHECK_EQ_INT(LOOM_TYPE_MXFP4, 39);
    /* the vector-dot kind: what activations are quantised to */
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_Q4_K)->vec_dot_type, LOOM_TYPE_Q8_K);
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_IQ4_XS)->vec_dot_type, LOOM_TYPE_Q8_K);
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_Q4_1)->vec_dot_type, LOOM_TYPE_Q8_1);
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_Q5_0)->vec_dot_type, LOOM_TYPE_Q8_0);
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_MXFP4)->vec_dot_type, LOOM_TYPE_Q8_0);
    LOOM_CHECK_EQ_INT(loom_type_traits_get(LOOM_TYPE_F16)->vec_dot_type, LOOM_TYPE_F32);
    LOOM_CHECK(!loom_type_traits_get(LOOM_TYPE_Q8_K)->is_weight);
    LOOM_CHECK(loom_type_traits_get(LOOM_TYPE_Q6_K)->is_weight);
}

/* Ids GGUF defines but loom has no kernels for still have names and block geometry, so a
 * file holding them can be listed; ids GGUF does not define have neither. */
LOOM_TEST(types, gguf_type_info) {
    loom_gguf_type_info ti;
    LOOM_REQUIRE(loom_gguf_type_info_get(16, &ti));
    LOOM_CHECK(strcmp(ti.name, "IQ2_XXS") == 0);
    LOOM_CHECK_EQ_INT(ti.blck_size, 256);
    LOOM_CHECK_EQ_INT(ti.type_size, 66);
    LOOM_REQUIRE(loom_gguf_type_info_get(35, &ti));
    LOOM_CHECK(strcmp(ti.name, "TQ2_0") == 0);
    LOOM_REQUIRE(loom_gguf_type_info_get(LOOM_TYPE_Q4_K, &ti));
    LOOM_CHECK(strcmp(ti.name, "Q4_K") == 0);
    LOOM_CHECK_EQ_INT(ti.type_size, 144);
    /* every loom type agrees with its GGUF geometry */
    for (int t = 0; t < LOOM_TYPE_COUNT; t++) {
        const loom_type_traits *tr = loom_type_traits_get(t);
        if (!tr) continue;
        LOOM_REQUIRE(loom_gguf_type_info_get(t, &ti));
        LOOM_CHECK_EQ_INT(ti.blck_size, tr->blck_size);
        LOOM_CHECK_EQ_INT(ti.type_size, tr->type_size);
    }
    LOOM_CHECK(!loom_gguf_type_info_get(4, &ti));
    LOOM_CHECK(!loom_gguf_type_info_get(40, &ti));
    LOOM_CHECK(!loom_gguf_type_info_get(-1, &ti));
    LOOM_CHECK(strcmp(loom_gguf_type_str(99), "unknown") == 0);
    LOOM_CHECK(strcmp(loom_gguf_type_str(19), "IQ1_S") == 0);
}

LOOM_TEST(types, row_size) {
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_F32, 10), 40);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_F16, 10), 20);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_BF16, 7), 14);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_Q8_0, 64), 2 * 34);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_Q4_0, 4096), 128 * 18);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_I64, 3), 24);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_I8, 5), 5);
    LOOM_CHECK_EQ_INT(loom_row_size(LOOM_TYPE_Q8_0, 0), 0);
}

LOOM_TEST(types, fp16_to_fp32_exhaustive) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = loom_fp16_to_fp32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        bool ok;
        if (isnan(want))
            ok = isnan(got) && (signbit(got) != 0) == ((h & 0x8000) != 0);
        else
            ok = (double)got == want && (signbit(got) != 0) == ((h & 0x8000) != 0);
        if (!ok && bad++ < 5) LOOM_CHECK_MSG(ok, "fp16 0x%04x -> %g, want %g", h, got, want);
        /* the table and the inline agree */
        if (bits_of(loom__fp16_table()[h]) != bits_of(got) && bad++ < 5)
            loom_test_fail(__FILE__, __LINE__, "fp16 table differs at 0x%04x", h);
    }
    LOOM_CHECK_EQ_INT(bad, 0);
}

static int check_f16(float f) {
    uint16_t got = loom_fp32_to_fp16(f);
    if (isnan(f)) {
        bool ok = (got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0 &&
                  ((got & 0x8000) != 0) == (signbit(f) != 0);
        if (!ok)
            loom_test_fail(__FILE__, __LINE__, "fp16(NaN 0x%08x) = 0x%04x is not a NaN", bits_of(f),
                           got);
        return !ok;
    }
    uint16_t want = ref_f32_to_f16(f);
    if (got != want)
        loom_test_fail(__FILE__, __LINE__, "fp16(%a = 0x%08x) = 0x%04x, want 0x%04x", (double)f,
                       bits_of(f), got, want);
    return got != want;
}

LOOM_TEST(types, fp32_to_fp16_rounding) {
    int bad = 0;
    /* every fp16 value, each tie between neighbours, and one float ulp either side */
    for (uint32_t h = 0; h < 0x7c00 && bad < 10; h++) {
        float v = (float)ref_f16_value((uint16_t)h);
        float next = (float)(h + 1 < 0x7c00 ? ref_f16_value((uint16_t)(h + 1)) : 65536.0);
        float mid = (float)(((double)v + (double)next) / 2); /* exact in binary32 */
        LOOM_CHECK((double)mid == ((double)v + (double)next) / 2);
        const float cases[] = {v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY),
                               nextafterf(v, INFINITY)};
        for (int i = 0; i < 5; i++) {
            bad += check_f16(cases[i]);
            bad += check_f16(-cases[i]);
        }
    }
    /* ties go to even: 1 + 2^-11 (between 1 and 1+2^-10) -> 1; 1 + 3*2^-11 -> 1 + 2^-9 */
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    /* subnormals: 2^-24 is the smallest; 2^-25 ties to 0; just above rounds to 2^-24 */
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(0x1p-24f), 0x0001);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(0x1p-25f), 0x0000);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(nextafterf(0x1p-25f, 1)), 0x0001);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(3 * 0x1p-25f), 0x0002);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400); /* up to the first normal */
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(1e-30f), 0x0000);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(-1e-30f), 0x8000);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(float_of(0x00000001)), 0x0000); /* fp32 subnormal */
    /* overflow: 65504 is the largest; 65519.99 rounds down, 65520 (a tie) rounds to inf */
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(65504.0f), 0x7bff);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(nextafterf(65520.0f, 0)), 0x7bff);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(65520.0f), 0x7c00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(1e10f), 0x7c00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(-1e10f), 0xfc00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(INFINITY), 0x7c00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(-INFINITY), 0xfc00);
    LOOM_CHECK_EQ_INT(loom_fp32_to_fp16(-0.0f), 0x8000);
    bad += check_f16(NAN);
    bad += check_f16(-NAN);
    bad += check_f16(float_of(0x7f800001)); /* signalling NaN, payload only in low bits */
    bad += check_f16(float_of(0xffc00001));
    /* random bit patterns across the whole float range */
    for (int i = 0; i < 2000000 && bad < 10; i++)
        bad += check_f16(float_of(loom_test_rand()));
    /* random floats in the fp16 range */
    for (int i = 0; i < 500000 && bad < 10; i++)
        bad += check_f16(loom_test_randf(-70000, 70000));
    LOOM_CHECK_EQ_INT(bad, 0);
}

static int check_bf16(float f) {
    uint16_t got = loom_fp32_to_bf16(f);
    if (isnan(f)) {
        bool ok = (got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0 &&
                  ((got & 0x8000) != 0) == (signbit(f) != 0);
        if (!ok)
            loom_test_fail(__FILE__, __LINE__, "bf16(NaN 0x%08x) = 0x%04x is not a NaN", bits_of(f),
                           got);
        return !ok;
    }
    uint16_t want = ref_f32_to_bf16(f);
    if (got != want)
        loom_test_fail(__FILE__, __LINE__, "bf16(%a = 0x%08x) = 0x%04x, want 0x%04x", (double)f,
                       bits_of(f), got, want);
    return got != want;
}

LOOM_TEST(types, bf16_conversion) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = loom_bf16_to_fp32((uint16_t)h);
        LOOM_CHECK(bits_of(f) == h << 16);
        if (!isnan(f) && loom_fp32_to_bf16(f) != h && bad++ < 5)
            loom_test_fail(__FILE__, __LINE__, "bf16 0x%04x does not round-trip", h);
        /* ties (low half exactly 0x8000) and their neighbours, for both parities */
        if ((h & 0x7f80) != 0x7f80) {
            bad += check_bf16(float_of((h << 16) | 0x8000));
            bad += check_bf16(float_of((h << 16) | 0x7fff));
            bad += check_bf16(float_of((h << 16) | 0x8001));
        }
        if (bad > 10) break;
    }
    LOOM_CHECK_EQ_INT(loom_fp32_to_bf16(float_of(0x3f808000)), 0x3f80); /* tie to even (down) */
    LOOM_CHECK_EQ_INT(loom_fp32_to_bf16(float_of(0x3f818000)), 0x3f82); /* tie to even (up) */
    LOOM_CHECK_EQ_INT(loom_fp32_to_bf16(float_of(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
    bad += check_bf16(NAN);
    bad += check_bf16(float_of(0x7f800001)); /* NaN whose payload is below bf16's bits */
    bad += check_bf16(float_of(0xff800001));
    for (int i = 0; i < 2000000 && bad < 10; i++)
        bad += check_bf16(float_of(loom_test_rand()));
    LOOM_CHECK_EQ_INT(bad, 0);
}

LOOM_TEST(types, row_converters_f16_bf16) {
    float x[100], y[100];
    uint16_t h[100];
    for (int i = 0; i < 100; i++)
        x[i] = loom_test_randf(-100, 100);
    const loom_type_traits *f16 = loom_type_traits_get(LOOM_TYPE_F16);
    const loom_type_traits *bf16 = loom_type_traits_get(LOOM_TYPE_BF16);
    const loom_type_traits *f32 = loom_type_traits_get(LOOM_TYPE_F32);
    f16->from_float(x, h, 100);
    for (int i = 0; i < 100; i++)
        LOOM_CHECK_EQ_INT(h[i], ref_f32_to_f16(x[i]));
    f16->to_float(h, y, 100);
    for (int i = 0; i < 100; i++)
        LOOM_CHECK(y[i] == (float)ref_f16_value(h[i]));
    bf16->from_float(x, h, 100);
    for (int i = 0; i < 100; i++)
        LOOM_CHECK_EQ_INT(h[i], ref_f32_to_bf16(x[i]));
    bf16->to_float(h, y, 100);
    for (int i = 0; i < 100; i++)
        LOOM_CHECK(bits_of(y[i]) == (uint32_t)h[i] << 16);
    f32->from_float(x, y, 100);
    LOOM_CHECK(memcmp(x, y, sizeof x) == 0);
}

/* Fills n values with blocks of varied scale, including an all-zero block. */
static void fill_blocks(float *x, int n) {
    for (int i = 0; i < n; i++) {
        int blk = i / 32;
        float scale = blk % 4 == 0 ? 1.0f : blk % 4 == 1 ? 1e-3f : blk % 4 == 2 ? 50.0f : 0.0f;
        x[i] = loom_test_randf(-1, 1) * scale;
    }
}

LOOM_TEST(types, q8_0_round_trip) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static loom_block_q8_0 q[N / 32];
    fill_blocks(x, N);
    const loom_type_traits *tr = loom_type_traits_get(LOOM_TYPE_Q8_0);
    tr->from_float(x, q, N);
    tr->to_float(q, y, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        int imax = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[b * 32 + j]) > amax) amax = fabsf(x[b * 32 + j]), imax = j;
        double d = (double)amax / 127.0;
        LOOM_CHECK_EQ_INT(q[b].d, ref_f32_to_f16(amax / 127.0f));
        double dh = ref_f16_value(q[b].d);
        if (amax == 0) {
            for (int j = 0; j < 32; j++)
                LOOM_CHECK(q[b].qs[j] == 0 && y[b * 32 + j] == 0.0f);
            continue;
        }
        LOOM_CHECK_EQ_INT(abs(q[b].qs[imax]), 127);
        double bound = 0.5 * d + 127 * fabs(dh - d) + 1e-6 * amax;
        for (int j = 0; j < 32; j++) {
            double err = fabs((double)x[b * 32 + j] - (double)y[b * 32 + j]);
            LOOM_CHECK_MSG(err <= bound, "q8_0 block %d elem %d: |%g - %g| > %g", b, j,
                           x[b * 32 + j], y[b * 32 + j], bound);
            /* dequantisation is q * fp16(d) exactly */
            LOOM_CHECK(y[b * 32 + j] == (float)(q[b].qs[j] * (float)dh));
        }
    }
}

LOOM_TEST(types, q4_0_round_trip) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static loom_block_q4_0 q[N / 32];
    fill_blocks(x, N);
    x[5] = -3.0f; /* a block whose largest magnitude is negative */
    x[6] = 2.0f;
    const loom_type_traits *tr = loom_type_traits_get(LOOM_TYPE_Q4_0);
    tr->from_float(x, q, N);
    tr->to_float(q, y, N);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0, m = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[b * 32 + j]) > amax) amax = fabsf(x[b * 32 + j]), m = x[b * 32 + j];
        LOOM_CHECK_EQ_INT(q[b].d, ref_f32_to_f16(m / -8.0f));
        double d = fabs((double)m / 8.0), dh = fabs(ref_f16_value(q[b].d));
        for (int j = 0; j < 32; j++) {
            float xv = x[b * 32 + j], yv = y[b * 32 + j];
            int nib = j < 16 ? (q[b].qs[j] & 15) : (q[b].qs[j - 16] >> 4);
            if (amax == 0) {
                LOOM_CHECK_EQ_INT(nib, 8);
                LOOM_CHECK(yv == 0.0f);
                continue;
            }
            /* x / d in [-8, 8]: rounded to the nearest of -8..7, so 8 clamps to 7 */
            double r = (double)xv / ((double)m / -8.0);
            double bound = (r > 7.5 ? 1.0 : 0.5) * d + 8 * fabs(dh - d) + 1e-6 * amax;
            LOOM_CHECK_MSG(fabs((double)xv - yv) <= bound, "q4_0 block %d elem %d: |%g - %g| > %g",
                           b, j, xv, yv, bound);
            if (xv == m) LOOM_CHECK_EQ_INT(nib, 0); /* the extreme maps to -8 * d */
        }
    }
    LOOM_CHECK(y[5] == (float)(-8 * ref_f16_value(q[0].d)));
}
