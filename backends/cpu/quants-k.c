/*
 * Dot products of the 256-element super-block types against Q8_K activations: Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K and IQ4_XS. Per super-block: weights unpacked to int8 (offsets applied
 * where the type has no min), int32 sums per sub-block times the integer sub-block scale,
 * and the mins (Q2_K, Q4_K, Q5_K) through the activation block's bsums. See quants-dot.h
 * for how the bodies are instantiated.
 */
#include "backends/cpu/quants-dot.h"

/* scale and min of sub-block j (0..7) of Q4_K/Q5_K from the 12 packed bytes */
LOOM_QD_INLINE void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K/Q5_K nibbles: chunk c of 64 elements uses qs[32c .. 32c + 31], low then high */
LOOM_QD_INLINE void unpack_k4(const uint8_t *qs, int8_t *q) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 0x0f);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
}

/* Q2_K/Q3_K 2-bit fields: element 128 h + 32 g + l is qs[32 h + l] >> 2 g */
LOOM_QD_INLINE void unpack_k2(const uint8_t *qs, int8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * g + l] = (int8_t)((qs[32 * h + l] >> (2 * g)) & 3);
}

/* one Q4_K/Q5_K super-block: q its unpacked weights, scales its 12 packed bytes */
LOOM_QD_INLINE float k4_block(const int8_t *q, const uint8_t *scales, uint16_t d, uint16_t dmin,
                              const loom_block_q8_K *y) {
    int sumi = 0, summ = 0;
    for (int s = 0; s < 8; s++) {
        int sc, m;
        k4_scale_min(s, scales, &sc, &m);
        sumi += sc * loom__qd_dot_i8(q + 32 * s, y->qs + 32 * s, 32);
        summ += m * (y->bsums[2 * s] + y->bsums[2 * s + 1]);
    }
    return y->d * (loom__qd_h(d) * (float)sumi - loom__qd_h(dmin) * (float)summ);
}

LOOM_QD_INLINE float body_q4_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q4_K *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int8_t q[LOOM_QK_K];
        unpack_k4(x[b].qs, q);
        sum += k4_block(q, x[b].scales, x[b].d, x[b].dmin, &y[b]);
    }
    return sum;
}

LOOM_QD_INLINE float body_q5_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q5_K *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int8_t q[LOOM_QK_K];
        unpack_k4(x[b].qs, q);
        for (int e = 0; e < LOOM_QK_K; e++) /* fifth bit: qh[e % 32] bit e / 32 */
            q[e] = (int8_t)(q[e] | (((x[b].qh[e % 32] >> (e / 32)) & 1) << 4));
        sum += k4_block(q, x[b].scales, x[b].d, x[b].dmin, &y[b]);
    }
    return sum;
}

LOOM_QD_INLINE float body_q2_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q2_K *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int8_t q[LOOM_QK_K];
        unpack_k2(x[b].qs, q);
        int sumi = 0, summ = 0;
        for (int s = 0; s < 16; s++) {
            sumi += (x[b].scales[s] & 0x0f) * loom__qd_dot_i8(q + 16 * s, y[b].qs + 16 * s, 16);
            summ += (x[b].scales[s] >> 4) * y[b].bsums[s];
        }
        sum += y[b].d * (loom__qd_h(x[b].d) * (float)sumi - loom__qd_h(x[b].dmin) * (float)summ);
    }
    return sum;
}

LOOM_QD_INLINE float body_q3_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q3_K *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int8_t q[LOOM_QK_K];
        unpack_k2(x[b].qs, q);
        for (int e = 0; e < LOOM_QK_K; e++) /* q - 4 unless hmask[e % 32] bit e / 32 is set */
            q[e] = (int8_t)(q[e] - (((x[b].hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4));
        const uint8_t *in = x[b].scales;
        int sumi = 0;
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? in[s] & 0x0f : in[s - 8] >> 4;
            int hi = (in[8 + s % 4] >> (2 * (s / 4))) & 3;
            sumi += ((lo | (hi << 4)) - 32) * loom__qd_dot_i8(q + 16 * s, y[b].qs + 16 * s, 16);
        }
        sum += y[b].d * loom__qd_h(x[b].d) * (float)sumi;
    }
    return sum;
}

LOOM_QD_INLINE float body_q6_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q6_K *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int8_t q[LOOM_QK_K];
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        for (int h = 0; h < 2; h++) {
            int8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (int8_t)(((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
                o[l + 32] = (int8_t)(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            ql += 64;
            qh += 32;
        }
        int sumi = 0;
        for (int s = 0; s < 16; s++)
            sumi += x[b].scales[s] * loom__qd_dot_i8(q + 16 * s, y[b].qs + 16 * s, 16);
        sum += y[b].d * loom__qd_h(x[b].d) * (float)sumi;
    }
    return sum;
}

LOOM_QD_INLINE float body_iq4_xs(int64_t n, const void *vx, const void *vy) {
    const loom_block_iq4_xs *x = vx;
    const loom_block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        int sumi = 0;
        for (int s = 0; s < 8; s++) {
            int8_t q[32];
            loom__qd_unpack_lut(x[b].qs + 16 * s, loom_iq4nl_values, q);
            const int ls = (((x[b].scales_l[s / 2] >> (4 * (s % 2))) & 0x0f) |
                            (((x[b].scales_h >> (2 * s)) & 3) << 4)) -
                           32;
            sumi += ls * loom__qd_dot_i8(q, y[b].qs + 32 * s, 32);
        }
        sum += y[b].d * loom__qd_h(x[b].d) * (float)sumi;
    }
    return sum;
}

#define K_TYPES(X, sfx, a)                                                                         \
    X(q2_K, sfx, a)                                                                                \
    X(q3_K, sfx, a) X(q4_K, sfx, a) X(q5_K, sfx, a) X(q6_K, sfx, a) X(iq4_xs, sfx, a)

LOOM_QD_INSTANCES(K_TYPES)

void loom__cpu_qdot_k(loom__cpu_qdot_set *s, int isa) {
    LOOM_QD_SELECT(K_TYPES, s, isa);
}
