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

/* Q8_0: d = max|x| / 127, q = round(x / d) (d = 0 -> q = 0); d stored as fp16. */
void loom__quantize_row_q8_0(const float *x, loom_block_q8_0 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK8_0 == 0);
    for (int64_t b = 0; b < n / LOOM_QK8_0; b++) {
        const float *xb = x + b * LOOM_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < LOOM_QK8_0; j++) {
            float v = fabsf(xb[j]);
            if (v > amax) amax = v;
        }
        float d = amax / 127.0f;
        y[b].d = loom__fp32_to_fp16(d);
        for (int j = 0; j < LOOM_QK8_0; j++)
            y[b].qs[j] = d == 0.0f ? 0 : (int8_t)roundf(xb[j] / d);
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

static const loom_type_traits loom__traits[LOOM_TYPE_COUNT] = {
    [LOOM_TYPE_F32] = {"f32", 1, sizeof(float), false, loom__f32_to_float, loom__f32_from_float},
    [LOOM_TYPE_F16] = {"f16", 1, sizeof(uint16_t), false, loom__f16_to_float, loom__f16_from_float},
    [LOOM_TYPE_BF16] = {"bf16", 1, sizeof(uint16_t), false, loom__bf16_to_float,
                        loom__bf16_from_float},
    [LOOM_TYPE_Q8_0] = {"q8_0", LOOM_QK8_0, sizeof(loom_block_q8_0), true, loom__q8_0_to_float,
                        loom__q8_0_from_float},
    [LOOM_TYPE_Q4_0] = {"q4_0", LOOM_QK4_0, sizeof(loom_block_q4_0), true, loom__q4_0_to_float,
                        loom__q4_0_from_float},
    [LOOM_TYPE_I8] = {"i8", 1, sizeof(int8_t), false, NULL, NULL},
    [LOOM_TYPE_I16] = {"i16", 1, sizeof(int16_t), false, NULL, NULL},
    [LOOM_TYPE_I32] = {"i32", 1, sizeof(int32_t), false, NULL, NULL},
    [LOOM_TYPE_I64] = {"i64", 1, sizeof(int64_t), false, NULL, NULL},
};

_Static_assert(sizeof(loom_block_q8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(loom_block_q4_0) == 18, "Q4_0 block must be 18 bytes");

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
