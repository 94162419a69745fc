/*
 * Dot products of the 32-element block types beyond Q8_0/Q4_0: Q4_1 and Q5_1 against Q8_1
 * activations (the min term uses the activation block's s = d * sum(q)), Q5_0, IQ4_NL and
 * MXFP4 against Q8_0 activations. See quants-dot.h for how the bodies are instantiated.
 */
#include "backends/cpu/quants-dot.h"

/* nibble j of a 32-block: qs[j] low is element j, high is element j + 16 */
LOOM_QD_INLINE void unpack_nibbles(const uint8_t *qs, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(qs[j] & 0x0f);
        q[j + 16] = (int8_t)(qs[j] >> 4);
    }
}

LOOM_QD_INLINE void unpack_q5(const uint8_t *qs, const uint8_t *qhb, int off, int8_t *q) {
    uint32_t qh;
    memcpy(&qh, qhb, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - off);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
    }
}

LOOM_QD_INLINE float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return loom__f32_from_bits(bits);
}

LOOM_QD_INLINE float body_q4_1(int64_t n, const void *vx, const void *vy) {
    const loom_block_q4_1 *x = vx;
    const loom_block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK4_1; b++) {
        int8_t q[32];
        unpack_nibbles(x[b].qs, q);
        const int s = loom__qd_dot_i8(q, y[b].qs, 32);
        sum += loom__qd_h(x[b].d) * loom__qd_h(y[b].d) * (float)s +
               loom__qd_h(x[b].m) * loom__qd_h(y[b].s);
    }
    return sum;
}

LOOM_QD_INLINE float body_q5_1(int64_t n, const void *vx, const void *vy) {
    const loom_block_q5_1 *x = vx;
    const loom_block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK5_1; b++) {
        int8_t q[32];
        unpack_q5(x[b].qs, x[b].qh, 0, q);
        const int s = loom__qd_dot_i8(q, y[b].qs, 32);
        sum += loom__qd_h(x[b].d) * loom__qd_h(y[b].d) * (float)s +
               loom__qd_h(x[b].m) * loom__qd_h(y[b].s);
    }
    return sum;
}

LOOM_QD_INLINE float body_q5_0(int64_t n, const void *vx, const void *vy) {
    const loom_block_q5_0 *x = vx;
    const loom_block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK5_0; b++) {
        int8_t q[32];
        unpack_q5(x[b].qs, x[b].qh, 16, q);
        sum += loom__qd_h(x[b].d) * loom__qd_h(y[b].d) * (float)loom__qd_dot_i8(q, y[b].qs, 32);
    }
    return sum;
}

LOOM_QD_INLINE float body_iq4_nl(int64_t n, const void *vx, const void *vy) {
    const loom_block_iq4_nl *x = vx;
    const loom_block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK4_NL; b++) {
        int8_t q[32];
        loom__qd_unpack_lut(x[b].qs, loom_iq4nl_values, q);
        sum += loom__qd_h(x[b].d) * loom__qd_h(y[b].d) * (float)loom__qd_dot_i8(q, y[b].qs, 32);
    }
    return sum;
}

LOOM_QD_INLINE float body_mxfp4(int64_t n, const void *vx, const void *vy) {
    const loom_block_mxfp4 *x = vx;
    const loom_block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_MXFP4; b++) {
        int8_t q[32];
        loom__qd_unpack_lut(x[b].qs, loom_mxfp4_values, q);
        sum += e8m0_half(x[b].e) * loom__qd_h(y[b].d) * (float)loom__qd_dot_i8(q, y[b].qs, 32);
    }
    return sum;
}

#define LEGACY_TYPES(X, sfx, a)                                                                    \
    X(q4_1, sfx, a) X(q5_0, sfx, a) X(q5_1, sfx, a) X(iq4_nl, sfx, a) X(mxfp4, sfx, a)

LOOM_QD_INSTANCES(LEGACY_TYPES)

void loom__cpu_qdot_legacy(loom__cpu_qdot_set *s, int isa) {
    LOOM_QD_SELECT(LEGACY_TYPES, s, isa);
}
