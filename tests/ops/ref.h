/*
 * The scalar reference for every op of docs/ops.md: what the ops tests compare each
 * backend against. Written for clarity, not speed: every element is read through the
 * tensor's byte strides (so any view works), every sum is accumulated in double, and
 * F16/BF16/Q8_0/Q4_0 values are decoded with the type's to_float. Nothing here calls a
 * backend or an op builder; shapes of results are given by the caller (from the docs),
 * never taken from the tensor under test.
 */
#ifndef LOOM_TESTS_OPS_REF_H
#define LOOM_TESTS_OPS_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"

/* A host tensor: type, shape, byte strides and the address of element (0, 0, 0, 0). */
typedef struct ref_tensor {
    loom_type type;
    int64_t ne[4];
    size_t nb[4];
    void *data;
} ref_tensor;

/* unit roundoff of float (2^-24) */
#define REF_U 5.9604644775390625e-08

/* ---------------------------------------------------------------- element access */

/* A contiguous descriptor over `data` (not allocated here). */
ref_tensor ref_contiguous(loom_type type, const int64_t ne[4], void *data);
int64_t ref_nelements(const ref_tensor *t);
/* Bytes spanned by a contiguous tensor of this type and shape. */
size_t ref_contiguous_bytes(loom_type type, const int64_t ne[4]);
/* Element (i0..i3) as a double: floats decoded with to_float (quantised: the block's
 * dequantised value), integers converted. */
double ref_get(const ref_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
/* The ne0 values of row (i1, i2, i3). */
void ref_get_row(const ref_tensor *t, int64_t i1, int64_t i2, int64_t i3, double *row);
/* Stores v in element (i0..i3) of an F32 / I32 / I64 tensor. */
void ref_set(ref_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v);
/* Converts linear row-major index k (i0 fastest) into coordinates of ne. */
void ref_unravel(const int64_t ne[4], int64_t k, int64_t idx[4]);

/* Per element of a row x[0..n), the largest |deq(convert(x)) - x| that converting to `type`
 * may produce when it follows docs/ops.md: F32/I32 0; F16 and BF16 half an ulp
 * (round to nearest); Q8_0 d/2 plus the fp16 rounding of d; Q4_0 |d|/2 (|d| where the
 * nibble clamps at 15) plus the fp16 rounding of d. n must be a multiple of 32 for the
 * quantised types. */
void ref_convert_tol(loom_type type, const double *x, int64_t n, double *tol);

/* ALiBi slope of head h of n_head (1 when max_bias <= 0), as SOFT_MAX defines it. */
double ref_alibi_slope(int h, int n_head, float max_bias);

/* ---------------------------------------------------------------- ops */
/* Every dst is an F32 tensor (I32 where the docs say so) of the documented result shape,
 * owned by the caller. */

/* DUP / CONT / CPY: element k of a in row-major order becomes element k of dst (dst F32:
 * the exact source values; the caller compares converted results with ref_convert_tol). */
void ref_copy(const ref_tensor *a, ref_tensor *dst);

typedef enum ref_binary_op { REF_ADD, REF_SUB, REF_MUL, REF_DIV } ref_binary_op;
void ref_binary(ref_binary_op op, const ref_tensor *a, const ref_tensor *b, ref_tensor *dst);
void ref_add_id(const ref_tensor *a, const ref_tensor *b, const ref_tensor *ids, ref_tensor *dst);
void ref_scale(const ref_tensor *a, double s, double bias, ref_tensor *dst);
void ref_sqr(const ref_tensor *a, ref_tensor *dst);
void ref_sqrt(const ref_tensor *a, ref_tensor *dst);
void ref_unary(loom_unary_op op, const ref_tensor *a, ref_tensor *dst);
double ref_unary_scalar(loom_unary_op op, double x);
/* b NULL: fused form (a [2n, ...]); otherwise split form. */
void ref_glu(loom_glu_op op, const ref_tensor *a, const ref_tensor *b, bool swapped,
             ref_tensor *dst);
void ref_clamp(const ref_tensor *a, double lo, double hi, ref_tensor *dst);
void ref_fill(double v, ref_tensor *dst);
/* sum_abs (optional, one per row): sum |x| of the row, for error bounds. */
void ref_sum_rows(const ref_tensor *a, ref_tensor *dst, double *sum_abs);
void ref_mean(const ref_tensor *a, ref_tensor *dst);
void ref_argmax(const ref_tensor *a, ref_tensor *dst);
void ref_norm(const ref_tensor *a, double eps, ref_tensor *dst);
void ref_rms_norm(const ref_tensor *a, double eps, ref_tensor *dst);

/* MUL_MAT. sum_abs (optional, one per dst element): sum_k |a||b|. q8_err (optional): the
 * most that quantising each 32-block of b to Q8_0 (as docs/ops.md allows for quantised
 * weights) can move the result: sum over blocks of (sum_k |a|) * amax_block(b) *
 * (1/2 + 127 * 2^-11) / 127. */
void ref_mul_mat(const ref_tensor *a, const ref_tensor *b, ref_tensor *dst, double *sum_abs,
                 double *q8_err);
void ref_mul_mat_id(const ref_tensor *as, const ref_tensor *b, const ref_tensor *ids,
                    ref_tensor *dst, double *sum_abs, double *q8_err);

void ref_get_rows(const ref_tensor *a, const ref_tensor *ids, ref_tensor *dst);
/* dst (F32, dst's shape) starts as the decoded initial content of the destination; the
 * rows SET_ROWS writes are overwritten with b's values. written (optional, one per row
 * of dst) is set to 1 for every row written, 0 otherwise. */
void ref_set_rows(const ref_tensor *b, const ref_tensor *ids, ref_tensor *dst, uint8_t *written);

/* mask, sinks optional (NULL). zmax (optional, one per row): max |z| of finite z. */
void ref_soft_max(const ref_tensor *a, const ref_tensor *mask, const ref_tensor *sinks,
                  double scale, float max_bias, ref_tensor *dst, double *zmax);
void ref_rope(const ref_tensor *a, const ref_tensor *pos, const ref_tensor *ff, int n_dims,
              int mode, double freq_base, double freq_scale, ref_tensor *dst);
/* zabs (optional, one per (h, j, s) in that order, h fastest): max over i of
 * scale * sum_d |q||k|, for error bounds. */
void ref_flash_attn_ext(const ref_tensor *q, const ref_tensor *k, const ref_tensor *v,
                        const ref_tensor *mask, const ref_tensor *sinks, double scale,
                        float max_bias, double softcap, ref_tensor *dst, double *zabs);
void ref_concat(const ref_tensor *a, const ref_tensor *b, int dim, ref_tensor *dst);
void ref_argsort(const ref_tensor *a, loom_sort_order order, ref_tensor *dst);
void ref_top_k(const ref_tensor *a, int k, ref_tensor *dst);

#endif /* LOOM_TESTS_OPS_REF_H */
