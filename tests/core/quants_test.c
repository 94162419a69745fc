/*
 * The block types beyond Q8_0/Q4_0 against the GGUF block layouts.
 *
 * decode_*: an element-by-element decoder per type written from the GGUF format's layout
 * (independent of core/quants-*.c: it indexes bytes per element where core works per
 * sub-block): random bytes (with sane fp16 scales) must decode to exactly the same floats
 * through the type's to_float. round_trip: from_float then to_float keeps the RMS error
 * within a bound derived from the step of each type on uniform data (step / sqrt(12)
 * relative to the RMS of U(-1, 1), 1/sqrt(3), with 1.5x slack for the quantised scales),
 * and all-zero blocks decode to exact zeros.
 */
#include <math.h>
#include <string.h>

#include "loom/core.h"
#include "tests/shim/loom_test.h"

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return loom_fp16_to_fp32(h);
}

/* fp16 of a random scale in [0.01, 0.1) at p */
static void put_scale(uint8_t *p) {
    uint16_t h = loom_fp32_to_fp16((float)loom_test_randf(0.01, 0.1));
    memcpy(p, &h, 2);
}

static const int8_t kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                1,    13,   25,  38,  53,  69,  89,  113};
static const float kFP4[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                               -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

/* element e of one block, from its bytes */
static float ref_elem(loom_type t, const uint8_t *b, int e) {
    switch (t) {
    case LOOM_TYPE_Q4_1: { /* d, m, qs[16] */
        int q = e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4;
        return h2f(b) * (float)q + h2f(b + 2);
    }
    case LOOM_TYPE_Q5_0:   /* d, qh[4], qs[16] */
    case LOOM_TYPE_Q5_1: { /* d, m, qh[4], qs[16] */
        const int o = t == LOOM_TYPE_Q5_0 ? 2 : 4;
        uint32_t qh = (uint32_t)b[o] | (uint32_t)b[o + 1] << 8 | (uint32_t)b[o + 2] << 16 |
                      (uint32_t)b[o + 3] << 24;
        int lo = e < 16 ? b[o + 4 + e] & 15 : b[o + 4 + e - 16] >> 4;
        int q = lo | (int)((qh >> e) & 1) << 4;
        return t == LOOM_TYPE_Q5_0 ? h2f(b) * (float)(q - 16) : h2f(b) * (float)q + h2f(b + 2);
    }
    case LOOM_TYPE_IQ4_NL: { /* d, qs[16] */
        int q = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
        return h2f(b) * (float)kIQ4[q];
    }
    case LOOM_TYPE_MXFP4: { /* e8m0, qs[16]; value = fp4 * 2^(e - 127) */
        int q = e < 16 ? b[1 + e] & 15 : b[1 + e - 16] >> 4;
        return kFP4[q] * ldexpf(1.0f, (int)b[0] - 127);
    }
    case LOOM_TYPE_Q2_K: { /* scales[16], qs[64], d, dmin */
        int q = (b[16 + (e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        int sc = b[e / 16];
        return h2f(b + 80) * (float)(sc & 15) * (float)q - h2f(b + 82) * (float)(sc >> 4);
    }
    case LOOM_TYPE_Q3_K: { /* hmask[32], qs[64], scales[12], d */
        int q = (b[32 + (e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        int hbit = (b[e % 32] >> (e / 32)) & 1;
        int j = e / 16;
        const uint8_t *s = b + 96;
        int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        return h2f(b + 108) * (float)((lo | hi << 4) - 32) * (float)(q - (hbit ? 0 : 4));
    }
    case LOOM_TYPE_Q4_K:   /* d, dmin, scales[12], qs[128] */
    case LOOM_TYPE_Q5_K: { /* d, dmin, scales[12], qh[32], qs[128] */
        const uint8_t *s = b + 4;
        int j = e / 32, sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
            m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        }
        const uint8_t *qs = b + (t == LOOM_TYPE_Q4_K ? 16 : 48);
        int q = (qs[(e / 64) * 32 + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15;
        if (t == LOOM_TYPE_Q5_K) q |= ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
        return h2f(b) * (float)sc * (float)q - h2f(b + 2) * (float)m;
    }
    case LOOM_TYPE_Q6_K: { /* ql[128], qh[64], scales[16] (int8), d */
        int h = e / 128, w = e % 128, g = w / 32, l = w % 32;
        int lo = (b[h * 64 + l + 32 * (g & 1)] >> (g >= 2 ? 4 : 0)) & 15;
        int hi = (b[128 + h * 32 + l] >> (2 * g)) & 3;
        return h2f(b + 208) * (float)(int8_t)b[192 + e / 16] * (float)((lo | hi << 4) - 32);
    }
    case LOOM_TYPE_IQ4_XS: { /* d, scales_h (u16), scales_l[4], qs[128] */
        int s = e / 32, w = e % 32;
        int sh = b[2] | b[3] << 8;
        int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
        int q = w < 16 ? b[8 + 16 * s + w] & 15 : b[8 + 16 * s + w - 16] >> 4;
        return h2f(b) * (float)(ls - 32) * (float)kIQ4[q];
    }
    case LOOM_TYPE_Q8_1: /* d, s, qs[32] */
        return h2f(b) * (float)(int8_t)b[4 + e];
    case LOOM_TYPE_Q8_K: { /* f32 d, qs[256], bsums */
        float d;
        memcpy(&d, b, 4);
        return d * (float)(int8_t)b[4 + e];
    }
    default:
        return NAN;
    }
}

/* byte offsets of the fp16 scales to make sane in a random block (-1 ends) */
static void sane_scales(loom_type t, uint8_t *b) {
    static const struct {
        loom_type t;
        int off[2];
    } k[] = {
        {LOOM_TYPE_Q4_1, {0, 2}},    {LOOM_TYPE_Q5_0, {0, -1}},  {LOOM_TYPE_Q5_1, {0, 2}},
        {LOOM_TYPE_IQ4_NL, {0, -1}}, {LOOM_TYPE_Q2_K, {80, 82}}, {LOOM_TYPE_Q3_K, {108, -1}},
        {LOOM_TYPE_Q4_K, {0, 2}},    {LOOM_TYPE_Q5_K, {0, 2}},   {LOOM_TYPE_Q6_K, {208, -1}},
        {LOOM_TYPE_IQ4_XS, {0, -1}}, {LOOM_TYPE_Q8_1, {0, 2}},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].t == t)
            for (int j = 0; j < 2; j++)
                if (k[i].off[j] >= 0) put_scale(b + k[i].off[j]);
    if (t == LOOM_TYPE_MXFP4) b[0] = (uint8_t)(120 + b[0] % 16);
    if (t == LOOM_TYPE_Q8_K) {
        float d = 0.01f;
        memcpy(b, &d, 4);
    }
}

static const loom_type k_types[] = {
    LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0,   LOOM_TYPE_Q5_1,  LOOM_TYPE_Q8_1, LOOM_TYPE_Q2_K,
    LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K,   LOOM_TYPE_Q5_K,  LOOM_TYPE_Q6_K, LOOM_TYPE_Q8_K,
    LOOM_TYPE_IQ4_NL, LOOM_TYPE_IQ4_XS, LOOM_TYPE_MXFP4,
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))

LOOM_TEST(quants, decode_matches_gguf_layout) {
    uint8_t blocks[3 * 292];
    float y[3 * 256];
    for (int i = 0; i < N_TYPES; i++) {
        const loom_type t = k_types[i];
        const loom_type_traits *tr = loom_type_traits_get(t);
        LOOM_REQUIRE(tr && tr->to_float);
        const int bl = (int)tr->blck_size, ts = (int)tr->type_size;
        for (int rep = 0; rep < 20; rep++) {
            for (int j = 0; j < 3 * ts; j++)
                blocks[j] = (uint8_t)(loom_test_rand() & 0xff);
            for (int k = 0; k < 3; k++)
                sane_scales(t, blocks + k * ts);
            tr->to_float(blocks, y, 3 * bl);
            for (int k = 0; k < 3; k++)
                for (int e = 0; e < bl; e++) {
                    float want = ref_elem(t, blocks + k * ts, e);
                    LOOM_CHECK_MSG(y[k * bl + e] == want, "%s block %d elem %d: %g, layout says %g",
                                   tr->name, k, e, y[k * bl + e], want);
                }
        }
    }
}

LOOM_TEST(quants, round_trip) {
    /* RMS error / RMS(x) on U(-1, 1): step / sqrt(12) * sqrt(3) = step / 2, times 1.5 */
    static const struct {
        loom_type t;
        double bound;
    } k[] = {
        {LOOM_TYPE_Q4_1, 1.5 * (2.0 / 15) / 2},
        {LOOM_TYPE_Q5_0, 1.5 * (2.0 / 31) / 2},
        {LOOM_TYPE_Q5_1, 1.5 * (2.0 / 31) / 2},
        {LOOM_TYPE_Q8_1, 1.5 * (2.0 / 254) / 2},
        {LOOM_TYPE_Q2_K, 1.5 * (2.0 / 3) / 2},
        {LOOM_TYPE_Q3_K, 1.5 * (2.0 / 7) / 2},
        {LOOM_TYPE_Q4_K, 1.5 * (2.0 / 15) / 2},
        {LOOM_TYPE_Q5_K, 1.5 * (2.0 / 31) / 2},
        {LOOM_TYPE_Q6_K, 1.5 * (2.0 / 63) / 2},
        {LOOM_TYPE_Q8_K, 1.5 * (2.0 / 254) / 2},
        /* the IQ4 grid's mean gap is 240 / 15 = 16 of 127: like a 16-level uniform grid */
        {LOOM_TYPE_IQ4_NL, 1.5 * (2.0 / 15) / 2},
        {LOOM_TYPE_IQ4_XS, 1.5 * (2.0 / 15) / 2},
        /* e2m1: steps 0.5 (|x| < 2), 1 (< 4), 2 (top) of a range of 6: mean step about 1/6 */
        {LOOM_TYPE_MXFP4, 1.5 * (2.0 / 6) / 2},
    };
    enum { N = 256 * 8 };
    static float x[N], y[N];
    static uint8_t q[N / 256 * 292 + N / 32 * 36]; /* room for the largest block type */
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const loom_type_traits *tr = loom_type_traits_get(k[i].t);
        for (int j = 0; j < N; j++)
            x[j] = (float)loom_test_randf(-1, 1);
        tr->from_float(x, q, N);
        tr->to_float(q, y, N);
        double se = 0, sx = 0;
        for (int j = 0; j < N; j++) {
            se += (double)(x[j] - y[j]) * (x[j] - y[j]);
            sx += (double)x[j] * x[j];
        }
        double rel = sqrt(se / sx);
        LOOM_CHECK_MSG(rel <= k[i].bound, "%s: relative RMS error %.4f > %.4f", tr->name, rel,
                       k[i].bound);
        /* a block of zeros, and a block scaled by 1e3, decode in proportion */
        for (int j = 0; j < N; j++)
            x[j] = j < 256 ? 0.0f : x[j] * 1000.0f;
        tr->from_float(x, q, N);
        tr->to_float(q, y, N);
        for (int j = 0; j < 256; j++)
            LOOM_CHECK_MSG(y[j] == 0.0f, "%s: zero block decodes to %g at %d", tr->name, y[j], j);
        se = sx = 0;
        for (int j = 256; j < N; j++) {
            se += (double)(x[j] - y[j]) * (x[j] - y[j]);
            sx += (double)x[j] * x[j];
        }
        LOOM_CHECK_MSG(sqrt(se / sx) <= k[i].bound, "%s x1000: relative RMS error %.4f", tr->name,
                       sqrt(se / sx));
    }
}

/* Q8_K's bsums are the sums of each 16 quants, which the K-quant dots rely on. */
LOOM_TEST(quants, q8_K_bsums) {
    float x[512];
    loom_block_q8_K b[2];
    for (int j = 0; j < 512; j++)
        x[j] = (float)loom_test_randf(-3, 3);
    loom_type_traits_get(LOOM_TYPE_Q8_K)->from_float(x, b, 512);
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < 16; s++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += b[k].qs[16 * s + l];
            LOOM_CHECK_EQ_INT(b[k].bsums[s], sum);
        }
}
