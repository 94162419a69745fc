/*
 * Device dequantisation of every GGUF block type the CUDA backend stores: value e of a
 * block, read bytewise (no alignment needed: MXFP4 blocks are 17 bytes), in exactly the
 * operations and order of core's scalar reference dequantisers (core/quants-legacy.c,
 * core/quants-k.c), with every product and sum rounded on its own (__fmul_rn, __fadd_rn,
 * never a fused multiply-add, which the C11 reference never forms), so the results are
 * bit-identical to the CPU's in F32. Element e of a super-block lives where quants-k.c's
 * header says. Included by kernels-common.cuh (after its fp16 conversion).
 */
#ifndef LOOM_CUDA_KERNELS_QUANT_CUH
#define LOOM_CUDA_KERNELS_QUANT_CUH

#include <stdint.h>

#include "backends/cuda/kernels.h"

/* The 16 levels of IQ4_NL/IQ4_XS and the doubled e2m1 values of MXFP4 (core's tables). */
static __device__ __constant__ const int8_t cu_iq4nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static __device__ __constant__ const int8_t cu_mxfp4_values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                                                   0, -1, -2, -3, -4, -6, -8, -12};

static __host__ __device__ __forceinline__ bool cu_is_quant(int type) {
    return type == LOOM_CU_Q8_0 || type == LOOM_CU_Q4_0 ||
           (type >= LOOM_CU_Q4_1 && type <= LOOM_CU_IQ4_XS);
}

/* Values per block (0: not a block type). */
static __host__ __device__ __forceinline__ int cu_qk(int type) {
    if (type >= LOOM_CU_Q2_K && type <= LOOM_CU_IQ4_XS) return LOOM_CU_QK_K;
    return cu_is_quant(type) ? LOOM_CU_QK : 0;
}

/* Bytes per block (0: not a block type). */
static __host__ __device__ __forceinline__ int cu_qbytes(int type) {
    switch (type) {
    case LOOM_CU_Q8_0:
        return LOOM_CU_Q8_0_BYTES;
    case LOOM_CU_Q4_0:
        return LOOM_CU_Q4_0_BYTES;
    case LOOM_CU_Q4_1:
        return LOOM_CU_Q4_1_BYTES;
    case LOOM_CU_Q5_0:
        return LOOM_CU_Q5_0_BYTES;
    case LOOM_CU_Q5_1:
        return LOOM_CU_Q5_1_BYTES;
    case LOOM_CU_IQ4_NL:
        return LOOM_CU_IQ4_NL_BYTES;
    case LOOM_CU_MXFP4:
        return LOOM_CU_MXFP4_BYTES;
    case LOOM_CU_Q2_K:
        return LOOM_CU_Q2_K_BYTES;
    case LOOM_CU_Q3_K:
        return LOOM_CU_Q3_K_BYTES;
    case LOOM_CU_Q4_K:
        return LOOM_CU_Q4_K_BYTES;
    case LOOM_CU_Q5_K:
        return LOOM_CU_Q5_K_BYTES;
    case LOOM_CU_Q6_K:
        return LOOM_CU_Q6_K_BYTES;
    case LOOM_CU_IQ4_XS:
        return LOOM_CU_IQ4_XS_BYTES;
    default:
        return 0;
    }
}

static __device__ __forceinline__ const uint8_t *cu_u8(const char *p) {
    return (const uint8_t *)p;
}

/* Little-endian u16 at p, bytewise. */
static __device__ __forceinline__ uint16_t cu_rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* fp16 at p as f32 (NaN payloads kept, as the CPU's table). */
static __device__ __forceinline__ float cu_rdh(const uint8_t *p) {
    return cu_fp16_to_f32(cu_rd16(p));
}

/* Nibble of value j (0..31) of a 32-block whose 16 bytes start at qs: qs[j] low is x[j],
 * high is x[j + 16]. */
static __device__ __forceinline__ int cu_nib32(const uint8_t *qs, int j) {
    return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

/* The 5-bit q of Q5_0/Q5_1 value j: nibble | bit j of qh (little-endian u32) << 4. */
static __device__ __forceinline__ int cu_q5(const uint8_t *qh, const uint8_t *qs, int j) {
    const uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
                       ((uint32_t)qh[3] << 24);
    return cu_nib32(qs, j) | (int)(((h >> j) & 1u) << 4);
}

/* 2^(e - 128) (core's loom__e8m0_half). */
static __device__ __forceinline__ float cu_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return __uint_as_float(bits);
}

/* 2-bit q of Q2_K/Q3_K value e. */
static __device__ __forceinline__ int cu_q2_get(const uint8_t *qs, int e) {
    return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* Q3_K's six-bit scale j (0..15) from its 12 packed bytes. */
static __device__ __forceinline__ int cu_q3k_scale(const uint8_t *in, int j) {
    const int lo = j < 8 ? in[j] & 0x0f : in[j - 8] >> 4;
    const int hi = (in[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

/* Q4_K/Q5_K scale and min of sub-block j (0..7) from the 12 packed bytes. */
static __device__ __forceinline__ void cu_k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* x = d * sc * q - dmin * m (Q2_K, Q4_K, Q5_K), in the reference's order. */
static __device__ __forceinline__ float cu_dsq_m(float d, int sc, int q, float dmin, int m) {
    return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)q), __fmul_rn(dmin, (float)m));
}

/* Value e (0 .. cu_qk(type) - 1) of the block at p, as core's reference dequantiser
 * computes it. */
static __device__ __forceinline__ float cu_qval(int type, const char *p, int e) {
    const uint8_t *b = cu_u8(p);
    switch (type) {
    case LOOM_CU_Q8_0: /* d, qs[32] */
        return __fmul_rn((float)(int8_t)b[2 + e], cu_rdh(b));
    case LOOM_CU_Q4_0: /* d, qs[16] */
        return __fmul_rn((float)(cu_nib32(b + 2, e) - 8), cu_rdh(b));
    case LOOM_CU_Q4_1: /* d, m, qs[16] */
        return __fadd_rn(__fmul_rn((float)cu_nib32(b + 4, e), cu_rdh(b)), cu_rdh(b + 2));
    case LOOM_CU_Q5_0: /* d, qh[4], qs[16] */
        return __fmul_rn((float)(cu_q5(b + 2, b + 6, e) - 16), cu_rdh(b));
    case LOOM_CU_Q5_1: /* d, m, qh[4], qs[16] */
        return __fadd_rn(__fmul_rn((float)cu_q5(b + 4, b + 8, e), cu_rdh(b)), cu_rdh(b + 2));
    case LOOM_CU_IQ4_NL: /* d, qs[16] */
        return __fmul_rn(cu_rdh(b), (float)cu_iq4nl_values[cu_nib32(b + 2, e)]);
    case LOOM_CU_MXFP4: /* e, qs[16] */
        return __fmul_rn(cu_e8m0_half(b[0]), (float)cu_mxfp4_values[cu_nib32(b + 1, e)]);
    case LOOM_CU_Q2_K: { /* scales[16], qs[64], d, dmin */
        const uint8_t s = b[e / 16];
        return cu_dsq_m(cu_rdh(b + 80), s & 0x0f, cu_q2_get(b + 16, e), cu_rdh(b + 82), s >> 4);
    }
    case LOOM_CU_Q3_K: { /* hmask[32], qs[64], scales[12], d */
        const int q = cu_q2_get(b + 32, e) - (((b[e % 32] >> (e / 32)) & 1) ? 0 : 4);
        const int ls = cu_q3k_scale(b + 96, e / 16);
        return __fmul_rn(__fmul_rn(cu_rdh(b + 108), (float)(ls - 32)), (float)q);
    }
    case LOOM_CU_Q4_K:   /* d, dmin, scales[12], qs[128] */
    case LOOM_CU_Q5_K: { /* d, dmin, scales[12], qh[32], qs[128] */
        int sc, m;
        cu_k4_scale_min(e / 32, b + 4, &sc, &m);
        const uint8_t *qs = b + (type == LOOM_CU_Q4_K ? 16 : 48);
        int q = (qs[(e / 64) * 32 + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 0x0f;
        if (type == LOOM_CU_Q5_K) q |= ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
        return cu_dsq_m(cu_rdh(b), sc, q, cu_rdh(b + 2), m);
    }
    case LOOM_CU_Q6_K: { /* ql[128], qh[64], scales[16] (int8), d */
        const int n = e / 128, w = e % 128, g = w / 32, l = w % 32;
        const int lo = (b[n * 64 + l + 32 * (g & 1)] >> (g >= 2 ? 4 : 0)) & 0x0f;
        const int hi = (b[128 + n * 32 + l] >> (2 * g)) & 3;
        const int q = lo | (hi << 4);
        return __fmul_rn(__fmul_rn(cu_rdh(b + 208), (float)(int8_t)b[192 + e / 16]),
                         (float)(q - 32));
    }
    case LOOM_CU_IQ4_XS: { /* d, scales_h (u16), scales_l[4], qs[128] */
        const int s = e / 32, j = e % 32;
        const int ls =
            (((b[4 + s / 2] >> (4 * (s % 2))) & 0x0f) | (((cu_rd16(b + 2) >> (2 * s)) & 3) << 4)) -
            32;
        const float dl = __fmul_rn(cu_rdh(b), (float)ls);
        return __fmul_rn(dl, (float)cu_iq4nl_values[cu_nib32(b + 8 + 16 * s, j)]);
    }
    default:
        return 0.0f;
    }
}

/* Values e0 .. e0 + 31 of the block at p (e0 a multiple of 32) into v: the type switch
 * once, so the loop body is one type's decode (unrolled, so v stays in registers and the
 * scale loads are shared). */
static __device__ __forceinline__ void cu_dequant32(int type, const char *p, int e0, float *v) {
#define CU_DQ32(T)                                                                                 \
    case T:                                                                                        \
        _Pragma("unroll") for (int l = 0; l < 32; l++) v[l] = cu_qval(T, p, e0 + l);               \
        break;
    switch (type) {
        CU_DQ32(LOOM_CU_Q8_0)
        CU_DQ32(LOOM_CU_Q4_0)
        CU_DQ32(LOOM_CU_Q4_1)
        CU_DQ32(LOOM_CU_Q5_0)
        CU_DQ32(LOOM_CU_Q5_1)
        CU_DQ32(LOOM_CU_IQ4_NL)
        CU_DQ32(LOOM_CU_MXFP4)
        CU_DQ32(LOOM_CU_Q2_K)
        CU_DQ32(LOOM_CU_Q3_K)
        CU_DQ32(LOOM_CU_Q4_K)
        CU_DQ32(LOOM_CU_Q5_K)
        CU_DQ32(LOOM_CU_Q6_K)
        CU_DQ32(LOOM_CU_IQ4_XS)
    default:
        for (int l = 0; l < 32; l++)
            v[l] = 0.0f;
        break;
    }
#undef CU_DQ32
}

/* ---------------------------------------------------------------- quantisation */

/* The quantisers of the KV-cache block types beyond Q8_0/Q4_0 (CPY / SET_ROWS from F32):
 * core's loom__quantize_row_q4_1 / _q5_0 / _q5_1 / _iq4_nl step for step (each operation
 * rounded on its own, nearest-even integers as lrintf), so the blocks are the CPU's bit for
 * bit. v holds 32 values; out the block (written bytewise). */

static __device__ __forceinline__ void cu_wr16(char *p, uint16_t h) {
    p[0] = (char)(h & 0xff);
    p[1] = (char)(h >> 8);
}

static __device__ __forceinline__ int cu_clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* qs[j] low nibble q[j], high q[j + 16]; for 5-bit q the fifth bits into qh (LE u32). */
static __device__ __forceinline__ void cu_put_q(char *qs, char *qh, const int *q) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++)
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int j = 0; j < 16; j++)
        qs[j] = (char)(uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    if (qh)
        for (int k = 0; k < 4; k++)
            qh[k] = (char)(uint8_t)(h >> (8 * k));
}

/* Q4_1 (qmax 15, block: d, m, qs) and Q5_1 (qmax 31: d, m, qh, qs). */
static __device__ __forceinline__ void cu_quantize_q_1(const float *v, char *out, int qmax) {
    float mn = v[0], mx = v[0];
    for (int j = 1; j < 32; j++) {
        mn = v[j] < mn ? v[j] : mn;
        mx = v[j] > mx ? v[j] : mx;
    }
    const float d = __fdiv_rn(__fsub_rn(mx, mn), (float)qmax);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    cu_wr16(out, cu_f32_to_fp16(d));
    cu_wr16(out + 2, cu_f32_to_fp16(mn));
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = cu_clampi((int)rintf(__fmul_rn(__fsub_rn(v[j], mn), id)), 0, qmax);
    if (qmax == 15)
        cu_put_q(out + 4, NULL, q);
    else
        cu_put_q(out + 8, out + 4, q);
}

/* The value of largest |v| (first on ties), sign kept. */
static __device__ __forceinline__ float cu_signed_absmax32(const float *v) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            m = v[j];
        }
    }
    return m;
}

static __device__ __forceinline__ void cu_quantize_q5_0(const float *v, char *out) {
    const float d = __fdiv_rn(cu_signed_absmax32(v), -16.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    cu_wr16(out, cu_f32_to_fp16(d));
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = cu_clampi((int)rintf(__fmul_rn(v[j], id)) + 16, 0, 31);
    cu_put_q(out + 6, out + 2, q);
}

/* Index of the IQ4_NL level nearest to x (first on ties). */
static __device__ __forceinline__ int cu_iq4nl_nearest(float x) {
    int best = 0;
    float err = fabsf(__fsub_rn(x, (float)cu_iq4nl_values[0]));
    for (int i = 1; i < 16; i++) {
        const float e = fabsf(__fsub_rn(x, (float)cu_iq4nl_values[i]));
        if (e < err) {
            err = e;
            best = i;
        }
    }
    return best;
}

/* IQ4_NL: the scale putting the largest |v| on level 0, one least-squares refit for the
 * chosen levels, the levels re-picked for the scale as stored (fp16). */
static __device__ __forceinline__ void cu_quantize_iq4_nl(const float *v, char *out) {
    int q[32];
    const float m = cu_signed_absmax32(v);
    float d = 0.0f;
    if (m == 0.0f) {
        for (int j = 0; j < 32; j++)
            q[j] = cu_iq4nl_nearest(0.0f);
    } else {
        d = __fdiv_rn(m, (float)cu_iq4nl_values[0]);
        for (int it = 0; it < 2; it++) {
            const float id = __fdiv_rn(1.0f, d);
            float sxl = 0.0f, sll = 0.0f;
            for (int j = 0; j < 32; j++) {
                q[j] = cu_iq4nl_nearest(__fmul_rn(v[j], id));
                const float l = (float)cu_iq4nl_values[q[j]];
                sxl = __fadd_rn(sxl, __fmul_rn(v[j], l));
                sll = __fadd_rn(sll, __fmul_rn(l, l));
            }
            if (it == 0 && sll > 0.0f && sxl != 0.0f) d = __fdiv_rn(sxl, sll);
        }
    }
    const uint16_t h = cu_f32_to_fp16(d);
    cu_wr16(out, h);
    const float ds = cu_fp16_to_f32(h);
    if (ds != 0.0f)
        for (int j = 0; j < 32; j++)
            q[j] = cu_iq4nl_nearest(__fdiv_rn(v[j], ds));
    cu_put_q(out + 2, NULL, q);
}

#endif /* LOOM_CUDA_KERNELS_QUANT_CUH */
