/*
 * The int8 GEMM's portable half: one unpacker per weight type into the canonical 32-block
 * form of qgemm.h (never re-quantising: q, d and mn reproduce the type's dequantisation
 * exactly, up to the float rounding of d * sub-block scale), and the A / B panel packers.
 * The micro-kernels are in qgemm-x86.c.
 */
#include "backends/cpu/qgemm.h"

static inline float h2f(uint16_t h) {
    return loom__fp16_to_fp32(h);
}

/* Eight bytes at a time (SWAR): loads, stores, and per-byte v - off for v < 128 and
 * off <= 128, which never borrows across bytes: ((v | 0x80) - off) ^ 0x80. */
#define B01 0x0101010101010101ull
static inline uint64_t ld64(const void *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}
static inline void st64(void *p, uint64_t x) {
    memcpy(p, &x, 8);
}
static inline uint64_t sub_bytes(uint64_t v, uint64_t off) {
    return ((v | 0x80 * B01) - off) ^ (0x80 * B01);
}
/* bits 0..7 of b -> bytes 0..7 (0 or 1) */
static inline uint64_t bits8(uint64_t b) {
    return ((((b * B01) & 0x8040201008040201ull) + 0x7f * B01) >> 7) & B01;
}

/* nibbles of a 32-block: qs[j] low is element j, high is element j + 16, minus off */
static inline void nibbles(const uint8_t *qs, int off, int8_t *q) {
    for (int h = 0; h < 2; h++) {
        const uint64_t x = ld64(qs + 8 * h);
        uint64_t lo = x & 0x0f * B01, hi = (x >> 4) & 0x0f * B01;
        if (off) {
            lo = sub_bytes(lo, (uint64_t)off * B01);
            hi = sub_bytes(hi, (uint64_t)off * B01);
        }
        st64(q + 8 * h, lo);
        st64(q + 16 + 8 * h, hi);
    }
}

/* adds bit j of the 32-bit qh as 16 to element j, then subtracts off */
static inline void fifth_bit(const uint8_t *qhb, int off, int8_t *q) {
    uint32_t qh;
    memcpy(&qh, qhb, 4);
    for (int w = 0; w < 4; w++) {
        const uint64_t v = ld64(q + 8 * w) | (bits8((qh >> (8 * w)) & 0xff) << 4);
        st64(q + 8 * w, off ? sub_bytes(v, (uint64_t)off * B01) : v);
    }
}

static void unpack_q8_0(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q8_0 *x = (const loom_block_q8_0 *)row + blk0;
    (void)mn;
    for (int64_t b = 0; b < nblk; b++) {
        memcpy(q + 32 * b, x[b].qs, 32);
        d[b] = h2f(x[b].d);
    }
}

static void unpack_q4_0(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q4_0 *x = (const loom_block_q4_0 *)row + blk0;
    (void)mn;
    for (int64_t b = 0; b < nblk; b++) {
        nibbles(x[b].qs, 8, q + 32 * b);
        d[b] = h2f(x[b].d);
    }
}

static void unpack_q4_1(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q4_1 *x = (const loom_block_q4_1 *)row + blk0;
    for (int64_t b = 0; b < nblk; b++) {
        nibbles(x[b].qs, 0, q + 32 * b);
        d[b] = h2f(x[b].d);
        mn[b] = h2f(x[b].m);
    }
}

static void unpack_q5_0(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q5_0 *x = (const loom_block_q5_0 *)row + blk0;
    (void)mn;
    for (int64_t b = 0; b < nblk; b++) {
        nibbles(x[b].qs, 0, q + 32 * b);
        fifth_bit(x[b].qh, 16, q + 32 * b);
        d[b] = h2f(x[b].d);
    }
}

static void unpack_q5_1(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q5_1 *x = (const loom_block_q5_1 *)row + blk0;
    for (int64_t b = 0; b < nblk; b++) {
        nibbles(x[b].qs, 0, q + 32 * b);
        fifth_bit(x[b].qh, 0, q + 32 * b);
        d[b] = h2f(x[b].d);
        mn[b] = h2f(x[b].m);
    }
}

static void unpack_iq4_nl(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                          float *mn, loom__qgemm_lut16_fn lut16) {
    const loom_block_iq4_nl *x = (const loom_block_iq4_nl *)row + blk0;
    (void)mn;
    lut16(x->qs, sizeof *x, nblk, loom_iq4nl_values, q);
    for (int64_t b = 0; b < nblk; b++)
        d[b] = h2f(x[b].d);
}

/* 2^(e - 128): the scale of MXFP4's doubled e2m1 table */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return loom__f32_from_bits(bits);
}

static void unpack_mxfp4(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                         float *mn, loom__qgemm_lut16_fn lut16) {
    const loom_block_mxfp4 *x = (const loom_block_mxfp4 *)row + blk0;
    (void)mn;
    lut16(x->qs, sizeof *x, nblk, loom_mxfp4_values, q);
    for (int64_t b = 0; b < nblk; b++)
        d[b] = e8m0_half(x[b].e);
}

/* scale and min of sub-block j (0..7) of Q4_K/Q5_K from the 12 packed bytes */
static inline void k4_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K/Q5_K: sub-block j is the low (j even) or high nibbles of qs[32 (j / 2) ..] */
static inline void k4_sub(const uint8_t *qs, int j, int8_t *q) {
    const uint8_t *p = qs + 32 * (j / 2);
    const int sh = 4 * (j % 2);
    for (int w = 0; w < 4; w++)
        st64(q + 8 * w, (ld64(p + 8 * w) >> sh) & 0x0f * B01);
}

static void unpack_q4_K(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q4_K *x = (const loom_block_q4_K *)row + blk0 / 8;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const float D = h2f(x[sb].d), M = h2f(x[sb].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(j, x[sb].scales, &sc, &m);
            k4_sub(x[sb].qs, j, q + 32 * (8 * sb + j));
            d[8 * sb + j] = D * (float)sc;
            mn[8 * sb + j] = -M * (float)m;
        }
    }
}

static void unpack_q5_K(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q5_K *x = (const loom_block_q5_K *)row + blk0 / 8;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const float D = h2f(x[sb].d), M = h2f(x[sb].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            int8_t *o = q + 32 * (8 * sb + j);
            k4_scale_min(j, x[sb].scales, &sc, &m);
            k4_sub(x[sb].qs, j, o);
            for (int w = 0; w < 4; w++) /* fifth bit of element 32 j + l: qh[l] bit j */
                st64(o + 8 * w, ld64(o + 8 * w) | (((ld64(x[sb].qh + 8 * w) >> j) & B01) << 4));
            d[8 * sb + j] = D * (float)sc;
            mn[8 * sb + j] = -M * (float)m;
        }
    }
}

static void unpack_iq4_xs(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                          float *mn, loom__qgemm_lut16_fn lut16) {
    const loom_block_iq4_xs *x = (const loom_block_iq4_xs *)row + blk0 / 8;
    (void)mn;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const float D = h2f(x[sb].d);
        lut16(x[sb].qs, 16, 8, loom_iq4nl_values, q + 256 * sb);
        for (int j = 0; j < 8; j++) {
            const int ls = (((x[sb].scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) |
                            (((x[sb].scales_h >> (2 * j)) & 3) << 4)) -
                           32;
            d[8 * sb + j] = D * (float)ls;
        }
    }
}

/* Q6_K: element 128 h + 32 g + l from ql/qh as the GGUF layout; 16-element scales */
static void unpack_q6_K(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q6_K *x = (const loom_block_q6_K *)row + blk0 / 8;
    (void)mn;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const uint8_t *ql = x[sb].ql, *qh = x[sb].qh;
        const float D = h2f(x[sb].d);
        for (int h = 0; h < 2; h++) {
            int8_t *o = q + 256 * sb + 128 * h;
            for (int l = 0; l < 32; l += 8) {
                const uint64_t l0 = ld64(ql + l), l1 = ld64(ql + 32 + l), hw = ld64(qh + l);
                const uint64_t m4 = 0x0f * B01, m2 = 0x03 * B01, o32 = 32 * B01;
                st64(o + l, sub_bytes((l0 & m4) | ((hw & m2) << 4), o32));
                st64(o + l + 32, sub_bytes((l1 & m4) | (((hw >> 2) & m2) << 4), o32));
                st64(o + l + 64, sub_bytes(((l0 >> 4) & m4) | (((hw >> 4) & m2) << 4), o32));
                st64(o + l + 96, sub_bytes(((l1 >> 4) & m4) | (((hw >> 6) & m2) << 4), o32));
            }
            ql += 64;
            qh += 32;
        }
        for (int s = 0; s < 16; s++)
            d[16 * sb + s] = D * (float)x[sb].scales[s];
    }
}

/* Q2_K/Q3_K 2-bit fields: element 128 h + 32 g + l is qs[32 h + l] >> 2 g */
static inline void k2_fields(const uint8_t *qs, int8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int w = 0; w < 4; w++)
                st64(q + 128 * h + 32 * g + 8 * w,
                     (ld64(qs + 32 * h + 8 * w) >> (2 * g)) & 0x03 * B01);
}

static void unpack_q3_K(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q3_K *x = (const loom_block_q3_K *)row + blk0 / 8;
    (void)mn;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        int8_t *o = q + 256 * sb;
        k2_fields(x[sb].qs, o);
        for (int j = 0; j < 8; j++) /* q - 4 unless hmask[e % 32] bit e / 32 is set */
            for (int w = 0; w < 4; w++) {
                const uint64_t hb = (ld64(x[sb].hmask + 8 * w) >> j) & B01;
                st64(o + 32 * j + 8 * w, sub_bytes(ld64(o + 32 * j + 8 * w), (hb ^ B01) << 2));
            }
        const uint8_t *in = x[sb].scales;
        const float D = h2f(x[sb].d);
        for (int s = 0; s < 16; s++) {
            const int lo = s < 8 ? in[s] & 0x0f : in[s - 8] >> 4;
            const int hi = (in[8 + s % 4] >> (2 * (s / 4))) & 3;
            d[16 * sb + s] = D * (float)((lo | (hi << 4)) - 32);
        }
    }
}

static void unpack_q2_K(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                        float *mn) {
    const loom_block_q2_K *x = (const loom_block_q2_K *)row + blk0 / 8;
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        k2_fields(x[sb].qs, q + 256 * sb);
        const float D = h2f(x[sb].d), M = h2f(x[sb].dmin);
        for (int s = 0; s < 16; s++) {
            d[16 * sb + s] = D * (float)(x[sb].scales[s] & 0x0f);
            mn[16 * sb + s] = -M * (float)(x[sb].scales[s] >> 4);
        }
    }
}

static const loom__qg_type k_q8_0 = {unpack_q8_0, NULL, false, 1, 128},
                           k_q4_0 = {unpack_q4_0, NULL, false, 1, 8},
                           k_q4_1 = {unpack_q4_1, NULL, true, 1, 15},
                           k_q5_0 = {unpack_q5_0, NULL, false, 1, 16},
                           k_q5_1 = {unpack_q5_1, NULL, true, 1, 31},
                           k_iq4_nl = {NULL, unpack_iq4_nl, false, 1, 127},
                           k_mxfp4 = {NULL, unpack_mxfp4, false, 1, 12},
                           k_q4_K = {unpack_q4_K, NULL, true, 1, 15},
                           k_q5_K = {unpack_q5_K, NULL, true, 1, 31},
                           k_iq4_xs = {NULL, unpack_iq4_xs, false, 1, 127},
                           k_q6_K = {unpack_q6_K, NULL, false, 2, 32},
                           k_q3_K = {unpack_q3_K, NULL, false, 2, 4},
                           k_q2_K = {unpack_q2_K, NULL, true, 2, 3};

const loom__qg_type *loom__qg_type_get(loom_type t) {
    switch (t) {
    case LOOM_TYPE_Q6_K:
        return &k_q6_K;
    case LOOM_TYPE_Q3_K:
        return &k_q3_K;
    case LOOM_TYPE_Q2_K:
        return &k_q2_K;
    case LOOM_TYPE_Q8_0:
        return &k_q8_0;
    case LOOM_TYPE_Q4_0:
        return &k_q4_0;
    case LOOM_TYPE_Q4_1:
        return &k_q4_1;
    case LOOM_TYPE_Q5_0:
        return &k_q5_0;
    case LOOM_TYPE_Q5_1:
        return &k_q5_1;
    case LOOM_TYPE_IQ4_NL:
        return &k_iq4_nl;
    case LOOM_TYPE_MXFP4:
        return &k_mxfp4;
    case LOOM_TYPE_Q4_K:
        return &k_q4_K;
    case LOOM_TYPE_Q5_K:
        return &k_q5_K;
    case LOOM_TYPE_IQ4_XS:
        return &k_iq4_xs;
    default:
        return NULL;
    }
}

void loom__qg_scatter_portable(const int8_t *q, const float *d, const float *mn, int mr, int halves,
                               int64_t nblk, void *panel) {
    const int H = halves;
    const size_t ablk = loom__qg_ablk_bytes(mr, H);
    for (int i = 0; i < mr; i++) {
        const int8_t *qi = q + (size_t)i * (size_t)(32 * nblk);
        const float *di = d + (size_t)i * (size_t)(2 * nblk),
                    *mi = mn + (size_t)i * (size_t)(2 * nblk);
        for (int64_t b = 0; b < nblk; b++) {
            char *pb = (char *)panel + (size_t)b * ablk;
            const int8_t *qb = qi + 32 * b;
            int sum[2] = {0, 0};
            for (int g = 0; g < 8; g++) {
                memcpy(pb + (size_t)(4 * (g * mr + i)), qb + 4 * g, 4);
                sum[H == 2 && g >= 4] += qb[4 * g] + qb[4 * g + 1] + qb[4 * g + 2] + qb[4 * g + 3];
            }
            for (int h = 0; h < H; h++) {
                const int32_t corr = -128 * sum[h];
                memcpy(pb + loom__qg_a_d(mr, H, h) + 4 * (size_t)i, &di[H * b + h], 4);
                memcpy(pb + loom__qg_a_corr(mr, H, h) + 4 * (size_t)i, &corr, 4);
                memcpy(pb + loom__qg_a_mn(mr, H, h) + 4 * (size_t)i, &mi[H * b + h], 4);
            }
        }
    }
}

void loom__qg_pack_a(const loom__qg_type *qt, const char *rows_base, size_t row_stride, int rows,
                     int mr, int64_t blk0, int64_t nblk, void *panel, void *tmp,
                     const loom__cpu_simd *simd) {
    const int H = qt->halves;
    const size_t qrow = (size_t)(32 * nblk), frow = (size_t)(2 * nblk);
    int8_t *q = tmp;
    float *d = (float *)(q + (size_t)mr * qrow), *mn = d + (size_t)mr * frow;
    for (int i = 0; i < mr; i++) {
        int8_t *qi = q + (size_t)i * qrow;
        float *di = d + (size_t)i * frow, *mi = mn + (size_t)i * frow;
        if (i < rows) {
            const char *row = rows_base + (size_t)i * row_stride;
            if (qt->unpack_lut)
                qt->unpack_lut(row, blk0, nblk, qi, di, mi, simd->qgemm_lut16);
            else
                qt->unpack(row, blk0, nblk, qi, di, mi);
            if (!qt->has_min)
                for (int64_t b = 0; b < H * nblk; b++)
                    mi[b] = 0.0f;
        } else {
            memset(qi, 0, qrow);
            for (int64_t b = 0; b < H * nblk; b++)
                di[b] = mi[b] = 0.0f;
        }
    }
    (simd->qgemm_scatter ? simd->qgemm_scatter : loom__qg_scatter_portable)(q, d, mn, mr, H, nblk,
                                                                         panel);
}

void loom__qg_pack_b_col(const void *q8a_row, int64_t nblk, int nr, int j, void *panel) {
    const size_t bblk = loom__qg_bblk_bytes(nr);
    void *row = (void *)q8a_row;
    for (int64_t b = 0; b < nblk; b++) {
        char *pb = (char *)panel + (size_t)b * bblk;
        if (!row) {
            for (int g = 0; g < 8; g++)
                memset(pb + 4 * (g * nr + j), 0, 4);
            memset(pb + loom__qg_b_d(nr) + 4 * (size_t)j, 0, 4);
            memset(pb + loom__qg_b_s(nr) + 4 * (size_t)j, 0, 4);
            memset(pb + loom__qg_b_shalf(nr, 0) + 4 * (size_t)j, 0, 4);
            memset(pb + loom__qg_b_shalf(nr, 1) + 4 * (size_t)j, 0, 4);
            continue;
        }
        const int8_t *qs = loom__q8a_qs(row, nblk) + 32 * b;
        int half[2] = {0, 0};
        for (int l = 0; l < 16; l++) {
            half[0] += qs[l];
            half[1] += qs[l + 16];
        }
        for (int g = 0; g < 8; g++) {
            uint32_t w;
            memcpy(&w, qs + 4 * g, 4);
            w ^= 0x80808080u; /* qb + 128 in each byte */
            memcpy(pb + 4 * (g * nr + j), &w, 4);
        }
        const float db = loom__q8a_d(row)[b];
        const float sh[2] = {db * (float)half[0], db * (float)half[1]};
        memcpy(pb + loom__qg_b_d(nr) + 4 * (size_t)j, &db, 4);
        memcpy(pb + loom__qg_b_s(nr) + 4 * (size_t)j, loom__q8a_s(row, nblk) + b, 4);
        memcpy(pb + loom__qg_b_shalf(nr, 0) + 4 * (size_t)j, &sh[0], 4);
        memcpy(pb + loom__qg_b_shalf(nr, 1) + 4 * (size_t)j, &sh[1], 4);
    }
}
