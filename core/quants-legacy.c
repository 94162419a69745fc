/*
 * quants-legacy.c: the scalar reference quantisers and dequantisers of the 32-element
 * block types beyond Q8_0/Q4_0 (types.c): Q4_1, Q5_0, Q5_1, Q8_1, IQ4_NL and MXFP4. Block
 * layouts are GGUF's (include/loom/core.h), so files written by llama.cpp's quantiser
 * decode unchanged. The quantisers are loom's own (round to nearest on a per-block scale,
 * with one least-squares refinement of the scale for the non-linear IQ4_NL grid); they need
 * not match another engine bit for bit, only decode to the GGUF meaning.
 */
#include "core/core-impl.h"

const int8_t loom_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
const int8_t loom_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static int nearest_int(float x) {
    return (int)lrintf(x);
}

/* 1 / d, or 0 when d is 0 or so small (below 2^-126 / 127) that 1 / d overflows: such a
 * block is zero as stored (its fp16 scale is 0), and x * inf would put NaN or Inf into an
 * integer conversion (garbage quants, different on every SIMD path). */
static float inv_or_zero(float d) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return isfinite(id) ? id : 0.0f;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* nibble j of a 32-block: qs[j] low is x[j], high is x[j + 16] */
static void put_nibbles(uint8_t qs[16], const int q[32]) {
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* ---------------------------------------------------------------- Q4_1 / Q5_1 */

static void min_max(const float *x, int n, float *mn, float *mx) {
    float a = x[0], b = x[0];
    for (int j = 1; j < n; j++) {
        a = x[j] < a ? x[j] : a;
        b = x[j] > b ? x[j] : b;
    }
    *mn = a;
    *mx = b;
}

void loom__quantize_row_q4_1(const float *x, loom_block_q4_1 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK4_1; b++, x += LOOM_QK4_1) {
        if (loom__any_nonfinite(x, 32)) { /* NaN scale: the block reads back NaN */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = y[b].m = 0x7e00;
            continue;
        }
        float mn, mx;
        min_max(x, LOOM_QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = inv_or_zero(d);
        y[b].d = loom__fp32_to_fp16(d);
        y[b].m = loom__fp32_to_fp16(mn);
        int q[32];
        for (int j = 0; j < 32; j++)
            q[j] = clampi(nearest_int((x[j] - mn) * id), 0, 15);
        put_nibbles(y[b].qs, q);
    }
}

void loom__dequantize_row_q4_1(const loom_block_q4_1 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK4_1; b++, y += LOOM_QK4_1) {
        const float d = loom__fp16_to_fp32(x[b].d), m = loom__fp16_to_fp32(x[b].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(x[b].qs[j] & 0x0f) * d + m;
            y[j + 16] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

static void put_q5(uint8_t qs[16], uint8_t qh[4], const int q[32]) {
    uint32_t h = 0;
    int lo[32];
    for (int j = 0; j < 32; j++) {
        lo[j] = q[j] & 0x0f;
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
    }
    put_nibbles(qs, lo);
    memcpy(qh, &h, 4);
}

static void get_q5(const uint8_t qs[16], const uint8_t qh[4], int q[32]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((h >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
    }
}

void loom__quantize_row_q5_1(const float *x, loom_block_q5_1 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK5_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK5_1; b++, x += LOOM_QK5_1) {
        if (loom__any_nonfinite(x, 32)) { /* NaN scale: the block reads back NaN */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = y[b].m = 0x7e00;
            continue;
        }
        float mn, mx;
        min_max(x, LOOM_QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = inv_or_zero(d);
        y[b].d = loom__fp32_to_fp16(d);
        y[b].m = loom__fp32_to_fp16(mn);
        int q[32];
        for (int j = 0; j < 32; j++)
            q[j] = clampi(nearest_int((x[j] - mn) * id), 0, 31);
        put_q5(y[b].qs, y[b].qh, q);
    }
}

void loom__dequantize_row_q5_1(const loom_block_q5_1 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK5_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK5_1; b++, y += LOOM_QK5_1) {
        const float d = loom__fp16_to_fp32(x[b].d), m = loom__fp16_to_fp32(x[b].m);
        int q[32];
        get_q5(x[b].qs, x[b].qh, q);
        for (int j = 0; j < 32; j++)
            y[j] = (float)q[j] * d + m;
    }
}

/* ---------------------------------------------------------------- Q5_0 */

/* the x of largest |x| (first on ties), sign kept */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    }
    return m;
}

void loom__quantize_row_q5_0(const float *x, loom_block_q5_0 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK5_0 == 0);
    for (int64_t b = 0; b < n / LOOM_QK5_0; b++, x += LOOM_QK5_0) {
        if (loom__any_nonfinite(x, 32)) { /* NaN scale: the block reads back NaN */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = 0x7e00;
            continue;
        }
        const float d = signed_absmax(x, 32) / -16.0f, id = inv_or_zero(d);
        y[b].d = loom__fp32_to_fp16(d);
        int q[32];
        for (int j = 0; j < 32; j++)
            q[j] = clampi(nearest_int(x[j] * id) + 16, 0, 31);
        put_q5(y[b].qs, y[b].qh, q);
    }
}

void loom__dequantize_row_q5_0(const loom_block_q5_0 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK5_0 == 0);
    for (int64_t b = 0; b < n / LOOM_QK5_0; b++, y += LOOM_QK5_0) {
        const float d = loom__fp16_to_fp32(x[b].d);
        int q[32];
        get_q5(x[b].qs, x[b].qh, q);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(q[j] - 16) * d;
    }
}

/* ---------------------------------------------------------------- Q8_1 */

void loom__quantize_row_q8_1(const float *x, loom_block_q8_1 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK8_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK8_1; b++, x += LOOM_QK8_1) {
        if (loom__any_nonfinite(x, 32)) { /* NaN scale and sum: every dot reading it is NaN */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = y[b].s = 0x7e00;
            continue;
        }
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = inv_or_zero(d);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[b].qs[j] = (int8_t)clampi(nearest_int(x[j] * id), -128, 127); /* as SIMD packs */
            sum += y[b].qs[j];
        }
        y[b].d = loom__fp32_to_fp16(d);
        y[b].s = loom__fp32_to_fp16(d * (float)sum);
    }
}

void loom__dequantize_row_q8_1(const loom_block_q8_1 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK8_1 == 0);
    for (int64_t b = 0; b < n / LOOM_QK8_1; b++, y += LOOM_QK8_1) {
        const float d = loom__fp16_to_fp32(x[b].d);
        for (int j = 0; j < 32; j++)
            y[j] = (float)x[b].qs[j] * d;
    }
}

/* ---------------------------------------------------------------- non-linear grids */

/* Index of the grid level nearest to v (grid sorted ascending). */
int loom__grid_nearest(const int8_t *grid, int n, float v) {
    int best = 0;
    float err = fabsf(v - (float)grid[0]);
    for (int i = 1; i < n; i++) {
        float e = fabsf(v - (float)grid[i]);
        if (e < err) {
            err = e;
            best = i;
        }
    }
    return best;
}

/* Quantises n values to the IQ4_NL grid: the scale that puts the largest |x| on the
 * extreme level, then one least-squares refit of the scale for the chosen levels. Returns
 * the scale; q gets the level indices. */
float loom__quantize_iq4nl_group(const float *x, int n, int *q) {
    const float m = signed_absmax(x, n);
    if (m == 0.0f) {
        for (int j = 0; j < n; j++)
            q[j] = loom__grid_nearest(loom_iq4nl_values, 16, 0.0f);
        return 0.0f;
    }
    float d = m / (float)loom_iq4nl_values[0];
    for (int it = 0; it < 2; it++) {
        const float id = 1.0f / d;
        float sxl = 0.0f, sll = 0.0f;
        for (int j = 0; j < n; j++) {
            q[j] = loom__grid_nearest(loom_iq4nl_values, 16, x[j] * id);
            float l = (float)loom_iq4nl_values[q[j]];
            sxl += x[j] * l;
            sll += l * l;
        }
        if (it == 0 && sll > 0.0f && sxl != 0.0f) d = sxl / sll;
    }
    return d;
}

void loom__quantize_row_iq4_nl(const float *x, loom_block_iq4_nl *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_NL == 0);
    for (int64_t b = 0; b < n / LOOM_QK4_NL; b++, x += LOOM_QK4_NL) {
        int q[32];
        float d = loom__quantize_iq4nl_group(x, 32, q);
        y[b].d = loom__fp32_to_fp16(d);
        /* re-pick the levels for the scale as stored (fp16) */
        const float ds = loom__fp16_to_fp32(y[b].d);
        if (ds != 0.0f)
            for (int j = 0; j < 32; j++)
                q[j] = loom__grid_nearest(loom_iq4nl_values, 16, x[j] / ds);
        put_nibbles(y[b].qs, q);
    }
}

void loom__dequantize_row_iq4_nl(const loom_block_iq4_nl *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK4_NL == 0);
    for (int64_t b = 0; b < n / LOOM_QK4_NL; b++, y += LOOM_QK4_NL) {
        const float d = loom__fp16_to_fp32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)loom_iq4nl_values[x[b].qs[j] & 0x0f];
            y[j + 16] = d * (float)loom_iq4nl_values[x[b].qs[j] >> 4];
        }
    }
}

/* ---------------------------------------------------------------- MXFP4 */

/* 2^(e - 128): the e8m0 scale halved (the value table holds doubled e2m1 values). */
float loom__e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return loom__f32_from_bits(bits);
}

void loom__quantize_row_mxfp4(const float *x, loom_block_mxfp4 *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_MXFP4 == 0);
    static const int8_t sorted[8] = {0, 1, 2, 3, 4, 6, 8, 12}; /* magnitudes, indices 0..7 */
    for (int64_t b = 0; b < n / LOOM_QK_MXFP4; b++, x += LOOM_QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        /* smallest e with amax / 2^(e - 128) <= 12 */
        int e = 0;
        if (amax > 0.0f) {
            e = 128 + (int)ceilf(log2f(amax / 12.0f));
            e = clampi(e, 1, 254);
            while (e < 254 && amax / loom__e8m0_half((uint8_t)e) > 12.0f)
                e++;
        }
        y[b].e = (uint8_t)e;
        const float d = loom__e8m0_half((uint8_t)e), id = amax > 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int j = 0; j < 32; j++) {
            int mag = loom__grid_nearest(sorted, 8, fabsf(x[j]) * id);
            q[j] = mag == 0 ? 0 : (x[j] < 0 ? mag + 8 : mag);
        }
        put_nibbles(y[b].qs, q);
    }
}

void loom__dequantize_row_mxfp4(const loom_block_mxfp4 *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_MXFP4 == 0);
    for (int64_t b = 0; b < n / LOOM_QK_MXFP4; b++, y += LOOM_QK_MXFP4) {
        const float d = loom__e8m0_half(x[b].e);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)loom_mxfp4_values[x[b].qs[j] & 0x0f];
            y[j + 16] = d * (float)loom_mxfp4_values[x[b].qs[j] >> 4];
        }
    }
}
