/*
 * types.c: the traits table of every loom type (block length, block bytes, converters),
 * IEEE fp16 and bf16 conversion, and the Q8_0/Q4_0 quantisers exactly as docs/ops.md
 * states them (the CPU kernels and the test reference share these definitions).
 */
#include <pthread.h>

#include "core/core-impl.h"

/* ---------------------------------------------------------------- fp16 / bf16 */

uint16_t loom_fp32_to_fp16(float f) {
    return loom__fp32_to_fp16(f);
}

float loom_fp16_to_fp32(uint16_t h) {
    return loom__fp16_to_fp32(h);
}

uint16_t loom_fp32_to_bf16(float f) {
    return loom__fp32_to_bf16(f);
}

float loom_bf16_to_fp32(uint16_t h) {
    return loom__bf16_to_fp32(h);
}

static float loom__fp16_tab[1 << 16];
static pthread_once_t loom__fp16_once = PTHREAD_ONCE_INIT;

static void loom__fp16_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++)
        loom__fp16_tab[i] = loom__fp16_to_fp32((uint16_t)i);
}

const float *loom__fp16_table(void) {
    pthread_once(&loom__fp16_once, loom__fp16_table_init);
    return loom__fp16_tab;
}

/* ---------------------------------------------------------------- row converters */

static void loom__f32_to_float(const void *x, float *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void loom__f32_from_float(const float *x, void *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void loom__f16_to_float(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = loom__fp16_to_fp32(h[i]);
}

static void loom__f16_from_float(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = loom__fp32_to_fp16(x[i]);
}

static void loom__bf16_to_float(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = loom__bf16_to_fp32(h[i]);
}

static void loom__bf16_from_float(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = loom__fp32_to_bf16(x[i]);
}

/* Q8_0: d = max|x| / 127, q = round(x / d) (d = 0 -> q = 0); d stored as fp16. A block with
 * a NaN or an Inf gets d = NaN and q = 0. */
void loom__quantize_row_q8_0(const float *x, loom_block_q8_0 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK8_0 == 0);
    for (int64_t b = 0; b < n / LOOM_QK8_0; b++) {
        const float *xb = x + b * LOOM_QK8_0;
        if (loom__any_nonfinite(xb, LOOM_QK8_0)) {
            y[b].d = 0x7e00; /* NaN */
            memset(y[b].qs, 0, sizeof y[b].qs);
            continue;
        }
        float amax = 0.0f;
        for (int j = 0; j < LOOM_QK8_0; j++) {
            float v = fabsf(xb[j]);
            if (v > amax) amax = v;
        }
        float d = amax / 127.0f;
        y[b].d = loom__fp32_to_fp16(d);
        /* saturated as the SIMD packs do: a subnormal d is inexact, and x / d may pass 127 */
        for (int j = 0; j < LOOM_QK8_0; j++)
            y[b].qs[j] = d == 0.0f ? 0 : (int8_t)fmaxf(-128.0f, fminf(127.0f, roundf(xb[j] / d)));
    }
}

void loom__dequantize_row_q8_0(const loom_block_q8_0 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK8_0 == 0);
    for (int64_t b = 0; b < n / LOOM_QK8_0; b++) {
        float d = loom__fp16_to_fp32(x[b].d);
        for (int j = 0; j < LOOM_QK8_0; j++)
            y[b * LOOM_QK8_0 + j] = (float)x[b].qs[j] * d;
    }
}

/* Q4_0: m = the x with the largest |x| (first on ties, sign kept), d = m / -8,
 * q = min(15, (int)(x / d + 8.5)) (d = 0 -> q = 8); qs[j] = q(x[j]) | q(x[j+16]) << 4. */
void loom__quantize_row_q4_0(const float *x, loom_block_q4_0 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_0 == 0);
    const int half = LOOM_QK4_0 / 2;
    for (int64_t b = 0; b < n / LOOM_QK4_0; b++) {
        const float *xb = x + b * LOOM_QK4_0;
        if (loom__any_nonfinite(xb, LOOM_QK4_0)) { /* NaN scale: the block reads back NaN */
            y[b].d = 0x7e00;
            memset(y[b].qs, 0x88, sizeof y[b].qs);
            continue;
        }
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < LOOM_QK4_0; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                m = xb[j];
            }
        }
        float d = m / -8.0f;
        y[b].d = loom__fp32_to_fp16(d);
        for (int j = 0; j < half; j++) {
            int q0 = 8, q1 = 8;
            if (d != 0.0f) {
                q0 = (int)(xb[j] / d + 8.5f);
                q1 = (int)(xb[j + half] / d + 8.5f);
                q0 = q0 > 15 ? 15 : q0;
                q1 = q1 > 15 ? 15 : q1;
            }
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void loom__dequantize_row_q4_0(const loom_block_q4_0 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_0 == 0);
    const int half = LOOM_QK4_0 / 2;
    for (int64_t b = 0; b < n / LOOM_QK4_0; b++) {
        float d = loom__fp16_to_fp32(x[b].d);
        for (int j = 0; j < half; j++) {
            y[b * LOOM_QK4_0 + j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
            y[b * LOOM_QK4_0 + j + half] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

static void loom__q8_0_to_float(const void *x, float *y, int64_t n) {
    loom__dequantize_row_q8_0(x, y, n);
}

static void loom__q8_0_from_float(const float *x, void *y, int64_t n) {
    loom__quantize_row_q8_0(x, y, n);
}

static void loom__q4_0_to_float(const void *x, float *y, int64_t n) {
    loom__dequantize_row_q4_0(x, y, n);
}

static void loom__q4_0_from_float(const float *x, void *y, int64_t n) {
    loom__quantize_row_q4_0(x, y, n);
}

float loom__alibi_slope(float max_bias, int64_t n_head, int64_t h) {
    if (max_bias <= 0.0f || n_head <= 0) return 1.0f;
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    return (uint64_t)h < n_head_log2 ? powf(m0, (float)(h + 1))
                                     : powf(m1, (float)(2 * (h - (int64_t)n_head_log2) + 1));
}

/* ---------------------------------------------------------------- traits */

#define LOOM__QUANT_WRAP(t)                                                                        \
    static void loom__##t##_to_float(const void *x, float *y, int64_t n) {                         \
        loom__dequantize_row_##t(x, y, n);                                                         \
    }                                                                                              \
    static void loom__##t##_from_float(const float *x, void *y, int64_t n) {                       \
        loom__quantize_row_##t(x, y, n);                                                           \
    }
LOOM__QUANT_WRAP(q4_1)
LOOM__QUANT_WRAP(q5_0)
LOOM__QUANT_WRAP(q5_1)
LOOM__QUANT_WRAP(q8_1)
LOOM__QUANT_WRAP(iq4_nl)
LOOM__QUANT_WRAP(mxfp4)
LOOM__QUANT_WRAP(q2_K)
LOOM__QUANT_WRAP(q3_K)
LOOM__QUANT_WRAP(q4_K)
LOOM__QUANT_WRAP(q5_K)
LOOM__QUANT_WRAP(q6_K)
LOOM__QUANT_WRAP(q8_K)
LOOM__QUANT_WRAP(iq4_xs)
#undef LOOM__QUANT_WRAP

#define LOOM__PLAIN(nm, ty, to, from)                                                              \
    {.name = nm, .blck_size = 1, .type_size = sizeof(ty), .is_quantized = false,                   \
     .to_float = to, .from_float = from, .vec_dot_type = LOOM_TYPE_F32, .is_weight = to != NULL}
#define LOOM__QUANT(nm, t, blck, vdt, weight)                                                      \
    {.name = nm, .blck_size = blck, .type_size = sizeof(loom_block_##t), .is_quantized = true,     \
     .to_float = loom__##t##_to_float, .from_float = loom__##t##_from_float,                       \
     .vec_dot_type = vdt, .is_weight = weight}

static const loom_type_traits loom__traits[LOOM_TYPE_COUNT] = {
    [LOOM_TYPE_F32] = LOOM__PLAIN("f32", float, loom__f32_to_float, loom__f32_from_float),
    [LOOM_TYPE_F16] = LOOM__PLAIN("f16", uint16_t, loom__f16_to_float, loom__f16_from_float),
    [LOOM_TYPE_BF16] = LOOM__PLAIN("bf16", uint16_t, loom__bf16_to_float, loom__bf16_from_float),
    [LOOM_TYPE_Q8_0] = LOOM__QUANT("q8_0", q8_0, LOOM_QK8_0, LOOM_TYPE_Q8_0, true),
    [LOOM_TYPE_Q4_0] = LOOM__QUANT("q4_0", q4_0, LOOM_QK4_0, LOOM_TYPE_Q8_0, true),
    [LOOM_TYPE_Q4_1] = LOOM__QUANT("q4_1", q4_1, LOOM_QK4_1, LOOM_TYPE_Q8_1, true),
    [LOOM_TYPE_Q5_0] = LOOM__QUANT("q5_0", q5_0, LOOM_QK5_0, LOOM_TYPE_Q8_0, true),
    [LOOM_TYPE_Q5_1] = LOOM__QUANT("q5_1", q5_1, LOOM_QK5_1, LOOM_TYPE_Q8_1, true),
    [LOOM_TYPE_Q8_1] = LOOM__QUANT("q8_1", q8_1, LOOM_QK8_1, LOOM_TYPE_Q8_1, false),
    [LOOM_TYPE_Q2_K] = LOOM__QUANT("q2_K", q2_K, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_Q3_K] = LOOM__QUANT("q3_K", q3_K, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_Q4_K] = LOOM__QUANT("q4_K", q4_K, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_Q5_K] = LOOM__QUANT("q5_K", q5_K, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_Q6_K] = LOOM__QUANT("q6_K", q6_K, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_Q8_K] = LOOM__QUANT("q8_K", q8_K, LOOM_QK_K, LOOM_TYPE_Q8_K, false),
    [LOOM_TYPE_IQ4_NL] = LOOM__QUANT("iq4_nl", iq4_nl, LOOM_QK4_NL, LOOM_TYPE_Q8_0, true),
    [LOOM_TYPE_IQ4_XS] = LOOM__QUANT("iq4_xs", iq4_xs, LOOM_QK_K, LOOM_TYPE_Q8_K, true),
    [LOOM_TYPE_MXFP4] = LOOM__QUANT("mxfp4", mxfp4, LOOM_QK_MXFP4, LOOM_TYPE_Q8_0, true),
    [LOOM_TYPE_I8] = LOOM__PLAIN("i8", int8_t, NULL, NULL),
    [LOOM_TYPE_I16] = LOOM__PLAIN("i16", int16_t, NULL, NULL),
    [LOOM_TYPE_I32] = LOOM__PLAIN("i32", int32_t, NULL, NULL),
    [LOOM_TYPE_I64] = LOOM__PLAIN("i64", int64_t, NULL, NULL),
};

_Static_assert(sizeof(loom_block_q8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(loom_block_q4_0) == 18, "Q4_0 block must be 18 bytes");
_Static_assert(sizeof(loom_block_q4_1) == 20, "Q4_1 block must be 20 bytes");
_Static_assert(sizeof(loom_block_q5_0) == 22, "Q5_0 block must be 22 bytes");
_Static_assert(sizeof(loom_block_q5_1) == 24, "Q5_1 block must be 24 bytes");
_Static_assert(sizeof(loom_block_q8_1) == 36, "Q8_1 block must be 36 bytes");
_Static_assert(sizeof(loom_block_q2_K) == 84, "Q2_K block must be 84 bytes");
_Static_assert(sizeof(loom_block_q3_K) == 110, "Q3_K block must be 110 bytes");
_Static_assert(sizeof(loom_block_q4_K) == 144, "Q4_K block must be 144 bytes");
_Static_assert(sizeof(loom_block_q5_K) == 176, "Q5_K block must be 176 bytes");
_Static_assert(sizeof(loom_block_q6_K) == 210, "Q6_K block must be 210 bytes");
_Static_assert(sizeof(loom_block_q8_K) == 292, "Q8_K block must be 292 bytes");
_Static_assert(sizeof(loom_block_iq4_nl) == 18, "IQ4_NL block must be 18 bytes");
_Static_assert(sizeof(loom_block_iq4_xs) == 136, "IQ4_XS block must be 136 bytes");
_Static_assert(sizeof(loom_block_mxfp4) == 17, "MXFP4 block must be 17 bytes");

/* Every id GGUF defines (ggml_type), with the block geometry GGUF files use, whether loom
 * computes with it or not; ids 4, 5 and 31..33, 36..38 were removed from the format. */
static const struct {
    const char *name;
    int64_t blck;
    size_t size;
} loom__gguf_types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},        [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};

bool loom_gguf_type_info_get(int type, loom_gguf_type_info *out) {
    const int n = (int)(sizeof loom__gguf_types / sizeof loom__gguf_types[0]);
    if (type < 0 || type >= n || !loom__gguf_types[type].name) return false;
    if (out) {
        out->name = loom__gguf_types[type].name;
        out->blck_size = loom__gguf_types[type].blck;
        out->type_size = loom__gguf_types[type].size;
    }
    return true;
}

const char *loom_gguf_type_str(int type) {
    loom_gguf_type_info ti;
    return loom_gguf_type_info_get(type, &ti) ? ti.name : "unknown";
}

const loom_type_traits *loom_type_traits_get(int type) {
    if (type < 0 || type >= LOOM_TYPE_COUNT || !loom__traits[type].name) return NULL;
    return &loom__traits[type];
}

bool loom_type_is_valid(int type) {
    return loom_type_traits_get(type) != NULL;
}

const char *loom_type_name(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr ? tr->name : "(invalid type)";
}

int64_t loom_blck_size(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    LOOM_ASSERT(tr != NULL);
    return tr->blck_size;
}

size_t loom_type_size(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    LOOM_ASSERT(tr != NULL);
    return tr->type_size;
}

size_t loom_row_size(loom_type t, int64_t ne0) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    LOOM_ASSERT(tr != NULL);
    LOOM_ASSERT(ne0 >= 0 && ne0 % tr->blck_size == 0);
    return tr->type_size * (size_t)(ne0 / tr->blck_size);
}
