/*
 * Row conversions between f32 and every storage type the kernels read or write: f16,
 * bf16, i32, the Q8_0 / Q4_0 block formats (quantisation exactly as docs/ops.md
 * defines it) and every other block type through its traits (core/quants-*.c). Used by the copy, get_rows and set_rows kernels and by matmul's packing.
 */
#include "backends/cpu/cpu-impl.h"

void loom__cpu_quantize_row_q8_0(const float *x, loom_block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / LOOM_QK8_0; i++) {
        const float *v = x + i * LOOM_QK8_0;
        if (loom__any_nonfinite(v, LOOM_QK8_0)) { /* NaN scale: every read is NaN */
            y[i].d = 0x7e00;
            memset(y[i].qs, 0, sizeof y[i].qs);
            continue;
        }
        float amax = 0.0f;
        for (int l = 0; l < LOOM_QK8_0; l++)
            amax = fmaxf(amax, fabsf(v[l]));
        float d = amax / 127.0f;
        y[i].d = loom__fp32_to_fp16(d);
        for (int l = 0; l < LOOM_QK8_0; l++)
            y[i].qs[l] = (int8_t)(d != 0.0f ? fmaxf(-128.0f, fminf(127.0f, roundf(v[l] / d))) : 0.0f);
    }
}

void loom__cpu_quantize_row_q4_0(const float *x, loom_block_q4_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / LOOM_QK4_0; i++) {
        const float *v = x + i * LOOM_QK4_0;
        if (loom__any_nonfinite(v, LOOM_QK4_0)) { /* NaN scale: the block reads back NaN */
            y[i].d = 0x7e00;
            memset(y[i].qs, 0x88, sizeof y[i].qs);
            continue;
        }
        float amax = 0.0f, max = 0.0f;
        for (int l = 0; l < LOOM_QK4_0; l++) {
            if (fabsf(v[l]) > amax) {
                amax = fabsf(v[l]);
                max = v[l];
            }
        }
        float d = max / -8.0f;
        y[i].d = loom__fp32_to_fp16(d);
        for (int l = 0; l < LOOM_QK4_0 / 2; l++) {
            int q0 = 8, q1 = 8;
            if (d != 0.0f) {
                q0 = (int)(v[l] / d + 8.5f);
                q1 = (int)(v[l + LOOM_QK4_0 / 2] / d + 8.5f);
                q0 = q0 < 15 ? q0 : 15;
                q1 = q1 < 15 ? q1 : 15;
            }
            y[i].qs[l] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void loom__cpu_dequantize_row_q8_0(const loom_block_q8_0 *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n / LOOM_QK8_0; i++) {
        float d = loom__fp16_to_fp32(x[i].d);
        for (int l = 0; l < LOOM_QK8_0; l++)
            y[i * LOOM_QK8_0 + l] = (float)x[i].qs[l] * d;
    }
}

void loom__cpu_dequantize_row_q4_0(const loom_block_q4_0 *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n / LOOM_QK4_0; i++) {
        float d = loom__fp16_to_fp32(x[i].d);
        for (int l = 0; l < LOOM_QK4_0 / 2; l++) {
            y[i * LOOM_QK4_0 + l] = (float)((x[i].qs[l] & 0x0f) - 8) * d;
            y[i * LOOM_QK4_0 + l + LOOM_QK4_0 / 2] = (float)((x[i].qs[l] >> 4) - 8) * d;
        }
    }
}

void loom__cpu_row_to_f32(loom_type type, const void *row, size_t nb0, int64_t i0, int64_t n,
                          float *y) {
    const char *p = row;
    switch (type) {
    case LOOM_TYPE_F32:
        if (nb0 == sizeof(float)) {
            memcpy(y, p + i0 * sizeof(float), (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++)
                memcpy(&y[i], p + (i0 + i) * nb0, sizeof(float));
        }
        return;
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (i0 + i) * nb0, sizeof h);
            y[i] = type == LOOM_TYPE_F16 ? loom__fp16_to_fp32(h) : loom__bf16_to_fp32(h);
        }
        return;
    case LOOM_TYPE_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + (i0 + i) * nb0, sizeof v);
            y[i] = (float)v;
        }
        return;
    default: {
        /* a block type: dequantise the blocks covering [i0, i0 + n) one at a time */
        const loom_type_traits *tr = loom_type_traits_get((int)type);
        LOOM_ASSERT(tr && tr->is_quantized && tr->blck_size <= LOOM_QK_K);
        const int64_t blck = tr->blck_size;
        float tmp[LOOM_QK_K];
        int64_t i = 0;
        while (i < n) {
            int64_t e = i0 + i;
            int64_t blk = e / blck, off = e % blck;
            int64_t take = blck - off < n - i ? blck - off : n - i;
            if (type == LOOM_TYPE_Q8_0)
                loom__cpu_dequantize_row_q8_0((const loom_block_q8_0 *)row + blk, tmp, LOOM_QK8_0);
            else if (type == LOOM_TYPE_Q4_0)
                loom__cpu_dequantize_row_q4_0((const loom_block_q4_0 *)row + blk, tmp, LOOM_QK4_0);
            else
                tr->to_float(p + blk * (int64_t)tr->type_size, tmp, blck);
            memcpy(y + i, tmp + off, (size_t)take * sizeof(float));
            i += take;
        }
        return;
    }
    }
}

void loom__cpu_row_from_f32(loom_type type, const float *x, void *row, size_t nb0, int64_t n) {
    char *p = row;
    switch (type) {
    case LOOM_TYPE_F32:
        if (nb0 == sizeof(float)) {
            memmove(p, x, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++)
                memcpy(p + i * nb0, &x[i], sizeof(float));
        }
        return;
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h =
                type == LOOM_TYPE_F16 ? loom__fp32_to_fp16(x[i]) : loom__fp32_to_bf16(x[i]);
            memcpy(p + i * nb0, &h, sizeof h);
        }
        return;
    case LOOM_TYPE_Q8_0:
        loom__cpu_quantize_row_q8_0(x, row, n);
        return;
    case LOOM_TYPE_Q4_0:
        loom__cpu_quantize_row_q4_0(x, row, n);
        return;
    default: {
        const loom_type_traits *tr = loom_type_traits_get((int)type);
        LOOM_ASSERT(tr && tr->is_quantized && tr->from_float);
        tr->from_float(x, row, n);
        return;
    }
    }
}
