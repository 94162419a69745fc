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
 * Panels (all offsets in bytes; a panel is one 64-byte aligned run of blocks):
 *   A (weights, MR rows): per block  int8 q[8][MR][4]  (four consecutive k of row i at
 *     [g][i]: one vpdpbusd lane per row), float d[MR], int32 corr[MR], float mn[MR];
 *     rows past the matrix are zero.
 *   B (activations, NR columns): per block  u8 q[8][NR][4] (qb + 128), float d[NR],
 *     float s[NR]; columns past the matrix are zero.
 */
#ifndef LOOM_CPU_QGEMM_H
#define LOOM_CPU_QGEMM_H

#include "backends/cpu/cpu-impl.h"

enum { LOOM_QG_BLK = 32 };

static inline size_t loom__qg_ablk_bytes(int mr) {
    return (size_t)mr * (LOOM_QG_BLK + 3 * sizeof(float));
}
static inline size_t loom__qg_bblk_bytes(int nr) {
    return (size_t)nr * (LOOM_QG_BLK + 2 * sizeof(float));
}

/* Blocks [blk0, blk0 + nblk) (32-element units) of one weight row -> q[32 * nblk],
 * d[nblk] and mn[nblk] (mn untouched for types without a min). For the 256-element
 * super-block types blk0 and nblk are multiples of 8. */
typedef void (*loom__qg_unpack_fn)(const void *row, int64_t blk0, int64_t nblk, int8_t *q, float *d,
                                   float *mn);

typedef struct loom__qg_type {
    loom__qg_unpack_fn unpack;
    bool has_min;
} loom__qg_type;

/* The canonical unpacker of weight type t; NULL when the int8 GEMM does not cover t. */
const loom__qg_type *loom__qg_type_get(loom_type t);

/* Rows [0, rows) (rows <= mr) of weight type t, row i at rows_base + i * row_stride,
 * blocks [blk0, blk0 + nblk) -> one A panel at panel (64-byte aligned). tmp: scratch of
 * 32 * nblk bytes + 2 * nblk floats (64-byte aligned). */
void loom__qg_pack_a(const loom__qg_type *qt, const char *rows_base, size_t row_stride, int rows,
                     int mr, int64_t blk0, int64_t nblk, void *panel, void *tmp);

/* Column j (< nr) of a B panel of nblk blocks from one Q8 activation row (cpu-impl.h);
 * row == NULL writes a zero column. */
void loom__qg_pack_b_col(const void *q8a_row, int64_t nblk, int nr, int j, void *panel);

#endif /* LOOM_CPU_QGEMM_H */
