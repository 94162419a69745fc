/*
 * The int8 GEMM of quantised weights (the MM_QGEMM path of ops-matmul.c).
 *
 * Every 32-element block of every supported weight type is unpacked into one canonical
 * form: 32 signed 8-bit integers q, a float scale d and, for types with a min/offset, a
 * float term mn, so that the block's weights are w_k = d * q_k + mn. The activations (b)
 * are quantised once per matmul to 32-element blocks x_k ~ db * qb_k (db = amax / 127, the
 * Q8 activations of cpu-impl.h) with s = db * sum(qb). A block's contribution to a dot is
 *   sum_k w_k x_k = d * db * sum_k q_k qb_k + mn * s,
 * the integer sum done by u8 x s8 instructions (VNNI vpdpbusd): the activations are stored
 * biased, qb + 128 as u8, and each weight block carries corr = -128 * sum_k q_k, the start
 * value of its int32 accumulator, which cancels the bias exactly.
 *
 * Types whose scales cover 16 elements (Q2_K, Q3_K, Q6_K) keep them: their blocks carry
 * two halves (H = 2), each with its own d, corr and mn, and the kernel folds each half of
 * the integer sum separately; the activations then also carry s per half.
 *
 * Panels (a panel is one 64-byte aligned run of blocks; offsets in bytes):
 *   A (weights, MR rows, H halves): per block  int8 q[8][MR][4]  (four consecutive k of
 *     row i at [g][i]: one vpdpbusd lane per row), float d[H][MR], int32 corr[H][MR],
 *     float mn[H][MR]; rows past the matrix are zero.
 *   B (activations, NR columns): per block  u8 q[8][NR][4] (qb + 128), float d[NR],
 *     float s[NR], float s_half[2][NR]; columns past the matrix are zero.
 */
#ifndef LOOM_CPU_QGEMM_H
#define LOOM_CPU_QGEMM_H

#include "backends/cpu/cpu-impl.h"

enum { LOOM_QG_BLK = 32 };

static inline size_t loom__qg_ablk_bytes(int mr, int halves) {
    return (size_t)mr * (LOOM_QG_BLK + 3 * sizeof(float) * (size_t)halves);
}
/* offsets in an A block of d, corr and mn of half h */
static inline size_t loom__qg_a_d(int mr, int halves, int h) {
    (void)halves;
    return (size_t)mr * (LOOM_QG_BLK + 4 * (size_t)h);
}
static inline size_t loom__qg_a_corr(int mr, int halves, int h) {
    return (size_t)mr * (LOOM_QG_BLK + 4 * (size_t)(halves + h));
}
static inline size_t loom__qg_a_mn(int mr, int halves, int h) {
    return (size_t)mr * (LOOM_QG_BLK + 4 * (size_t)(2 * halves + h));
}

static inline size_t loom__qg_bblk_bytes(int nr) {
    return (size_t)nr * (LOOM_QG_BLK + 4 * sizeof(float));
}
/* offsets in a B block of d, s and the half sums */
static inline size_t loom__qg_b_d(int nr) {
    return (size_t)nr * LOOM_QG_BLK;
}
static inline size_t loom__qg_b_s(int nr) {
    return (size_t)nr * (LOOM_QG_BLK + 4);
}
static inline size_t loom__qg_b_shalf(int nr, int h) {
    return (size_t)nr * (LOOM_QG_BLK + 8 + 4 * (size_t)h);
}

/* Blocks [blk0, blk0 + nblk) (32-element units) of one weight row -> q[32 * nblk],
 * d[nblk * H] and mn[nblk * H] (block b, half h at b * H + h; mn untouched for types
 * without a min). For the 256-element super-block types blk0 and nblk are multiples of 8. */
typedef void (*loom__qg_unpack_fn)(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                                   float *mn);
/* The same for the 16-value types (IQ4_NL, IQ4_XS, MXFP4), whose nibbles go through their
 * table with the SIMD table's lut16. */
typedef void (*loom__qg_unpack_lut_fn)(const void *row, int64_t blk0, int64_t nblk, int8_t *q,
                                       float *d, float *mn, loom__qgemm_lut16_fn lut16);

typedef struct loom__qg_type {
    loom__qg_unpack_fn unpack;         /* exactly one of the two is set */
    loom__qg_unpack_lut_fn unpack_lut;
    bool has_min;
    int halves; /* H: scales per 32-block (1, or 2 for 16-element sub-blocks) */
    int qmax;   /* largest |q| the unpacked integers take */
} loom__qg_type;

/* The canonical unpacker of weight type t; NULL when the int8 GEMM does not cover t. */
const loom__qg_type *loom__qg_type_get(loom_type t);

/* Rows [0, rows) (rows <= mr) of weight type t, row i at rows_base + i * row_stride,
 * blocks [blk0, blk0 + nblk) -> one A panel at panel (64-byte aligned): every row is
 * unpacked into tmp (loom__qg_tmp_bytes(mr, nblk), 64-byte aligned: q[mr][32 nblk], then
 * d[mr][2 nblk], mn[mr][2 nblk]) with simd's lut16, then simd's scatter (either NULL: the
 * portable one) lays the rows out as the panel. */
static inline size_t loom__qg_tmp_bytes(int mr, int64_t nblk) {
    return (size_t)mr * (size_t)nblk * (LOOM_QG_BLK + 4 * sizeof(float));
}
void loom__qg_pack_a(const loom__qg_type *qt, const char *rows_base, size_t row_stride, int rows,
                     int mr, int64_t blk0, int64_t nblk, void *panel, void *tmp,
                     const loom__cpu_simd *simd);
/* The portable scatter (loom__qgemm_scatter_fn of cpu-impl.h). */
void loom__qg_scatter_portable(const int8_t *q, const float *d, const float *mn, int mr, int halves,
                               int64_t nblk, void *panel);

/* Column j (< nr) of a B panel of nblk blocks from one Q8 activation row (cpu-impl.h);
 * row == NULL writes a zero column. */
void loom__qg_pack_b_col(const void *q8a_row, int64_t nblk, int nr, int j, void *panel);

#endif /* LOOM_CPU_QGEMM_H */
