/*
 * The scalar reference of docs/ops.md (see ref.h). Each function is a direct transcription
 * of the op's line in the docs table: loops over the documented result shape, element
 * reads through strides, double accumulation. It shares no code with any backend.
 */
#include "tests/ops/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

/* ---------------------------------------------------------------- element access */

/* The block types beyond Q8_0/Q4_0 (Q4_1 ... MXFP4) are decoded with the type's to_float,
 * whose layout decoding tests/core/quants_test.c checks against the GGUF block layouts. */
static bool ref__other_quant(loom_type type) {
    const loom_type_traits *tr = loom_type_traits_get((int)type);
    return tr && tr->is_quantized && type != LOOM_TYPE_Q8_0 && type != LOOM_TYPE_Q4_0;
}

static int64_t ref__blck(loom_type type) {
    if (ref__other_quant(type)) return loom_type_traits_get((int)type)->blck_size;
    return (type == LOOM_TYPE_Q8_0 || type == LOOM_TYPE_Q4_0) ? 32 : 1;
}

static size_t ref__type_size(loom_type type) {
    if (ref__other_quant(type)) return loom_type_traits_get((int)type)->type_size;
    switch (type) {
    case LOOM_TYPE_F32:
        return 4;
    case LOOM_TYPE_F16:
        return 2;
    case LOOM_TYPE_BF16:
        return 2;
    case LOOM_TYPE_Q8_0:
        return 2 + 32;
    case LOOM_TYPE_Q4_0:
        return 2 + 16;
    case LOOM_TYPE_I8:
        return 1;
    case LOOM_TYPE_I16:
        return 2;
    case LOOM_TYPE_I32:
        return 4;
    case LOOM_TYPE_I64:
        return 8;
    default:
        abort();
    }
}

ref_tensor ref_contiguous(loom_type type, const int64_t ne[4], void *data) {
    ref_tensor t;
    t.type = type;
    for (int i = 0; i < 4; i++)
        t.ne[i] = ne[i];
    t.nb[0] = ref__type_size(type);
    t.nb[1] = t.nb[0] * (size_t)(ne[0] / ref__blck(type));
    t.nb[2] = t.nb[1] * (size_t)ne[1];
    t.nb[3] = t.nb[2] * (size_t)ne[2];
    t.data = data;
    return t;
}

size_t ref_contiguous_bytes(loom_type type, const int64_t ne[4]) {
    return ref__type_size(type) * (size_t)(ne[0] / ref__blck(type)) * (size_t)ne[1] *
           (size_t)ne[2] * (size_t)ne[3];
}

int64_t ref_nelements(const ref_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

void ref_unravel(const int64_t ne[4], int64_t k, int64_t idx[4]) {
    for (int d = 0; d < 4; d++) {
        idx[d] = k % ne[d];
        k /= ne[d];
    }
}

static const char *ref__at(const ref_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (const char *)t->data + (size_t)(i0 / ref__blck(t->type)) * t->nb[0] +
           (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] + (size_t)i3 * t->nb[3];
}

double ref_get(const ref_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char *p = ref__at(t, i0, i1, i2, i3);
    switch (t->type) {
    case LOOM_TYPE_F32: {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16: {
        float f;
        loom_type_traits_get(t->type)->to_float(p, &f, 1);
        return f;
    }
    case LOOM_TYPE_Q8_0:
    case LOOM_TYPE_Q4_0: {
        float blk[32];
        loom_type_traits_get(t->type)->to_float(p, blk, 32);
        return blk[i0 % 32];
    }
    case LOOM_TYPE_I8:
        return *(const int8_t *)p;
    default:
        if (ref__other_quant(t->type)) {
            float blk[256];
            const loom_type_traits *tr = loom_type_traits_get(t->type);
            tr->to_float(p, blk, tr->blck_size);
            return blk[i0 % tr->blck_size];
        }
        break;
    }
    switch (t->type) {
    case LOOM_TYPE_I16: {
        int16_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case LOOM_TYPE_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case LOOM_TYPE_I64: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return (double)v;
    }
    default:
        abort();
    }
}

void ref_get_row(const ref_tensor *t, int64_t i1, int64_t i2, int64_t i3, double *row) {
    if (t->type == LOOM_TYPE_Q8_0 || t->type == LOOM_TYPE_Q4_0 || ref__other_quant(t->type)) {
        const loom_type_traits *tr = loom_type_traits_get(t->type);
        const int64_t bl = tr->blck_size;
        for (int64_t b = 0; b < t->ne[0] / bl; b++) {
            float blk[256];
            tr->to_float(ref__at(t, b * bl, i1, i2, i3), blk, bl);
            for (int j = 0; j < bl; j++)
                row[b * bl + j] = blk[j];
        }
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
        row[i0] = ref_get(t, i0, i1, i2, i3);
}

void ref_set(ref_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v) {
    char *p = (char *)ref__at(t, i0, i1, i2, i3);
    switch (t->type) {
    case LOOM_TYPE_F32: {
        float f = (float)v;
        memcpy(p, &f, sizeof f);
        return;
    }
    case LOOM_TYPE_I32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, sizeof x);
        return;
    }
    case LOOM_TYPE_I64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, sizeof x);
        return;
    }
    default:
        abort();
    }
}

static double ref__get_lin(const ref_tensor *t, int64_t k) {
    int64_t i[4];
    ref_unravel(t->ne, k, i);
    return ref_get(t, i[0], i[1], i[2], i[3]);
}

static void ref__set_lin(ref_tensor *t, int64_t k, double v) {
    int64_t i[4];
    ref_unravel(t->ne, k, i);
    ref_set(t, i[0], i[1], i[2], i[3], v);
}

void ref_convert_tol(loom_type type, const double *x, int64_t n, double *tol) {
    switch (type) {
    case LOOM_TYPE_F16:
        /* half an ulp: 2^-11 relative for normal values, 2^-25 for subnormals */
        for (int64_t i = 0; i < n; i++)
            tol[i] = fabs(x[i]) * 0x1p-11 + 0x1p-25;
        return;
    case LOOM_TYPE_BF16:
        /* 8 significant bits: half an ulp is 2^-8 relative */
        for (int64_t i = 0; i < n; i++)
            tol[i] = fabs(x[i]) * 0x1p-8 + 1e-38;
        return;
    case LOOM_TYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmax(amax, fabs(x[b * 32 + j]));
            double d = amax / 127;
            /* rounding to the nearest step d/2, plus |q| <= 127 times the fp16 rounding of
             * d (2^-11 relative); a little slack for the float reciprocal */
            double t = (d * 0.5 + 127 * d * 0x1p-11) * (1 + 1e-5) + 1e-30;
            for (int j = 0; j < 32; j++)
                tol[b * 32 + j] = t;
        }
        return;
    case LOOM_TYPE_Q4_0:
        for (int64_t b = 0; b < n / 32; b++) {
            double m = 0;
            for (int j = 0; j < 32; j++)
                if (fabs(x[b * 32 + j]) > fabs(m)) m = x[b * 32 + j];
            double d = m / -8;
            for (int j = 0; j < 32; j++) {
                if (d == 0) {
                    tol[b * 32 + j] = 0;
                    continue;
                }
                /* q = min(15, (int)(x/d + 8.5)): the step |d| rounds to within |d|/2
                 * except where the clamp at 15 cuts in (x/d > 7.5, the opposite sign of
                 * m), which costs up to |d|; |q - 8| <= 8 times the fp16 rounding of d */
                double r = x[b * 32 + j] / d;
                double step = r > 7.4 ? fabs(d) : fabs(d) * 0.5;
                tol[b * 32 + j] = step * (1 + 1e-5) + 8 * fabs(d) * 0x1p-11 + 1e-30;
            }
        }
        return;
    case LOOM_TYPE_Q4_1:
    case LOOM_TYPE_Q5_1: {
        /* loom's quantiser: d = (max - min) / qmax, q = round((x - min) / d): half a step,
         * plus the fp16 rounding of min (2^-11 |min|) and of d (qmax d 2^-11) */
        const double qmax = type == LOOM_TYPE_Q4_1 ? 15 : 31;
        for (int64_t b = 0; b < n / 32; b++) {
            double mn = x[b * 32], mx = x[b * 32];
            for (int j = 0; j < 32; j++) {
                mn = fmin(mn, x[b * 32 + j]);
                mx = fmax(mx, x[b * 32 + j]);
            }
            double d = (mx - mn) / qmax;
            double t = d * 0.5 * (1 + 1e-5) + fabs(mn) * 0x1p-11 + qmax * d * 0x1p-11 + 1e-30;
            for (int j = 0; j < 32; j++)
                tol[b * 32 + j] = t;
        }
        return;
    }
    case LOOM_TYPE_Q5_0:
        for (int64_t b = 0; b < n / 32; b++) {
            double m = 0;
            for (int j = 0; j < 32; j++)
                if (fabs(x[b * 32 + j]) > fabs(m)) m = x[b * 32 + j];
            double d = m / -16;
            for (int j = 0; j < 32; j++) {
                /* q = clamp(round(x / d) + 16, 0, 31): half a step, a whole one where the
                 * clamp at 31 cuts in (x / d > 15.5); |q - 16| <= 16 fp16 roundings of d */
                double r = d == 0 ? 0 : x[b * 32 + j] / d;
                double step = r > 15.4 ? fabs(d) : fabs(d) * 0.5;
                tol[b * 32 + j] = step * (1 + 1e-5) + 16 * fabs(d) * 0x1p-11 + 1e-30;
            }
        }
        return;
    case LOOM_TYPE_IQ4_NL:
        for (int64_t b = 0; b < n / 32; b++) {
            /* the grid's widest gap is 24 of 240 levels over [-127 d, 113 d] with d near
             * amax / 127 (refit by least squares), and the top level 113 d stops short of
             * +amax: 0.2 amax covers both with room for the refit; a misplaced nibble or
             * scale costs about amax */
            double amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmax(amax, fabs(x[b * 32 + j]));
            for (int j = 0; j < 32; j++)
                tol[b * 32 + j] = 0.2 * amax + 1e-30;
        }
        return;
    default:
        for (int64_t i = 0; i < n; i++)
            tol[i] = 0;
        return;
    }
}

double ref_alibi_slope(int h, int n_head, float max_bias) {
    if (max_bias <= 0) return 1.0;
    int n_head_log2 = 1 << (int)floor(log2((double)n_head));
    double m0 = pow(2.0, -(double)max_bias / n_head_log2);
    double m1 = pow(2.0, -((double)max_bias / 2) / n_head_log2);
    return h < n_head_log2 ? pow(m0, h + 1) : pow(m1, 2 * (h - n_head_log2) + 1);
}

/* ---------------------------------------------------------------- copies, elementwise */

void ref_copy(const ref_tensor *a, ref_tensor *dst) {
    int64_t n = ref_nelements(a);
    for (int64_t k = 0; k < n; k++)
        ref__set_lin(dst, k, ref__get_lin(a, k));
}

#define REF_FOR_EACH(t, i0, i1, i2, i3)                                                            \
    for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)                                                    \
        for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)                                                \
            for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++)                                            \
                for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)

void ref_binary(ref_binary_op op, const ref_tensor *a, const ref_tensor *b, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3) {
        double x = ref_get(a, i0, i1, i2, i3);
        double y = ref_get(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        double r = op == REF_ADD ? x + y : op == REF_SUB ? x - y : op == REF_MUL ? x * y : x / y;
        ref_set(dst, i0, i1, i2, i3, r);
    }
}

void ref_add_id(const ref_tensor *a, const ref_tensor *b, const ref_tensor *ids, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, u, t, i3) {
        int64_t e = (int64_t)ref_get(ids, u, t, 0, 0);
        ref_set(dst, i0, u, t, i3, ref_get(a, i0, u, t, i3) + ref_get(b, i0, e, 0, 0));
    }
}

void ref_scale(const ref_tensor *a, double s, double bias, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3)
    ref_set(dst, i0, i1, i2, i3, ref_get(a, i0, i1, i2, i3) * s + bias);
}

void ref_sqr(const ref_tensor *a, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3) {
        double x = ref_get(a, i0, i1, i2, i3);
        ref_set(dst, i0, i1, i2, i3, x * x);
    }
}

void ref_sqrt(const ref_tensor *a, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3) ref_set(dst, i0, i1, i2, i3, sqrt(ref_get(a, i0, i1, i2, i3)));
}

double ref_unary_scalar(loom_unary_op op, double x) {
    switch (op) {
    case LOOM_UNARY_SILU:
        return x / (1 + exp(-x));
    case LOOM_UNARY_GELU:
        return 0.5 * x * (1 + tanh(sqrt(2 / REF_PI) * (x + 0.044715 * x * x * x)));
    case LOOM_UNARY_RELU:
        return x > 0 ? x : 0;
    default:
        abort();
    }
}

void ref_unary(loom_unary_op op, const ref_tensor *a, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3)
    ref_set(dst, i0, i1, i2, i3, ref_unary_scalar(op, ref_get(a, i0, i1, i2, i3)));
}

void ref_glu(loom_glu_op op, const ref_tensor *a, const ref_tensor *b, bool swapped,
             ref_tensor *dst) {
    loom_unary_op act = op == LOOM_GLU_SWIGLU ? LOOM_UNARY_SILU : LOOM_UNARY_GELU;
    REF_FOR_EACH(dst, i0, i1, i2, i3) {
        double x, g;
        if (b) {
            x = ref_get(swapped ? b : a, i0, i1, i2, i3);
            g = ref_get(swapped ? a : b, i0, i1, i2, i3);
        } else {
            int64_t n = dst->ne[0];
            x = ref_get(a, swapped ? i0 + n : i0, i1, i2, i3);
            g = ref_get(a, swapped ? i0 : i0 + n, i1, i2, i3);
        }
        ref_set(dst, i0, i1, i2, i3, ref_unary_scalar(act, x) * g);
    }
}

void ref_clamp(const ref_tensor *a, double lo, double hi, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3)
    ref_set(dst, i0, i1, i2, i3, fmin(fmax(ref_get(a, i0, i1, i2, i3), lo), hi));
}

void ref_fill(double v, ref_tensor *dst) {
    REF_FOR_EACH(dst, i0, i1, i2, i3) ref_set(dst, i0, i1, i2, i3, v);
}

/* ---------------------------------------------------------------- row reductions */

void ref_sum_rows(const ref_tensor *a, ref_tensor *dst, double *sum_abs) {
    int64_t r = 0;
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++, r++) {
                double s = 0, sa = 0;
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    double x = ref_get(a, i0, i1, i2, i3);
                    s += x;
                    sa += fabs(x);
                }
                ref_set(dst, 0, i1, i2, i3, s);
                if (sum_abs) sum_abs[r] = sa;
            }
}

void ref_mean(const ref_tensor *a, ref_tensor *dst) {
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                double s = 0;
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++)
                    s += ref_get(a, i0, i1, i2, i3);
                ref_set(dst, 0, i1, i2, i3, s / (double)a->ne[0]);
            }
}

void ref_argmax(const ref_tensor *a, ref_tensor *dst) {
    for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
        int64_t best = 0;
        double bv = ref_get(a, 0, i1, 0, 0);
        for (int64_t i0 = 1; i0 < a->ne[0]; i0++) {
            double x = ref_get(a, i0, i1, 0, 0);
            if (x > bv) {
                bv = x;
                best = i0;
            }
        }
        ref_set(dst, i1, 0, 0, 0, (double)best);
    }
}

static void ref__norm(const ref_tensor *a, double eps, bool rms, ref_tensor *dst) {
    int64_t n = a->ne[0];
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                ref_get_row(a, i1, i2, i3, x);
                double mean = 0, var = 0;
                if (!rms) {
                    for (int64_t i = 0; i < n; i++)
                        mean += x[i];
                    mean /= (double)n;
                }
                for (int64_t i = 0; i < n; i++)
                    var += (x[i] - mean) * (x[i] - mean);
                var /= (double)n;
                double inv = 1 / sqrt(var + eps);
                for (int64_t i = 0; i < n; i++)
                    ref_set(dst, i, i1, i2, i3, (x[i] - mean) * inv);
            }
    free(x);
}

void ref_norm(const ref_tensor *a, double eps, ref_tensor *dst) {
    ref__norm(a, eps, false, dst);
}

void ref_rms_norm(const ref_tensor *a, double eps, ref_tensor *dst) {
    ref__norm(a, eps, true, dst);
}

/* ---------------------------------------------------------------- matrix products */

/* One dot product of K values with its error-bound terms. */
static double ref__dot(const double *a, const double *b, int64_t K, double *sum_abs,
                       double *q8_err) {
    double s = 0, sa = 0, q8 = 0;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        double amax_b = 0, asum = 0;
        for (int64_t k = k0; k < K && k < k0 + 32; k++) {
            s += a[k] * b[k];
            sa += fabs(a[k] * b[k]);
            amax_b = fmax(amax_b, fabs(b[k]));
            asum += fabs(a[k]);
        }
        q8 += asum * amax_b * (0.5 + 127 * 0x1p-11) / 127;
    }
    if (sum_abs) *sum_abs = sa;
    if (q8_err) *q8_err = q8;
    return s;
}

void ref_mul_mat(const ref_tensor *a, const ref_tensor *b, ref_tensor *dst, double *sum_abs,
                 double *q8_err) {
    int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    double *arows = malloc(sizeof(double) * (size_t)(K * M));
    double *brow = malloc(sizeof(double) * (size_t)K);
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            for (int64_t m = 0; m < M; m++)
                ref_get_row(a, m, i2 / r2, i3 / r3, arows + m * K);
            for (int64_t n = 0; n < N; n++) {
                ref_get_row(b, n, i2, i3, brow);
                for (int64_t m = 0; m < M; m++) {
                    int64_t o = m + M * (n + N * (i2 + b->ne[2] * i3));
                    double r = ref__dot(arows + m * K, brow, K, sum_abs ? &sum_abs[o] : NULL,
                                        q8_err ? &q8_err[o] : NULL);
                    ref_set(dst, m, n, i2, i3, r);
                }
            }
        }
    free(arows);
    free(brow);
}

void ref_mul_mat_id(const ref_tensor *as, const ref_tensor *b, const ref_tensor *ids,
                    ref_tensor *dst, double *sum_abs, double *q8_err) {
    int64_t K = as->ne[0], M = as->ne[1], U = ids->ne[0], T = ids->ne[1], B1 = b->ne[1];
    double *arow = malloc(sizeof(double) * (size_t)K);
    double *brow = malloc(sizeof(double) * (size_t)K);
    for (int64_t t = 0; t < T; t++)
        for (int64_t u = 0; u < U; u++) {
            int64_t e = (int64_t)ref_get(ids, u, t, 0, 0);
            ref_get_row(b, u % B1, t, 0, brow);
            for (int64_t m = 0; m < M; m++) {
                ref_get_row(as, m, e, 0, arow);
                int64_t o = m + M * (u + U * t);
                double r = ref__dot(arow, brow, K, sum_abs ? &sum_abs[o] : NULL,
                                    q8_err ? &q8_err[o] : NULL);
                ref_set(dst, m, u, t, 0, r);
            }
        }
    free(arow);
    free(brow);
}

/* ---------------------------------------------------------------- rows */

void ref_get_rows(const ref_tensor *a, const ref_tensor *ids, ref_tensor *dst) {
    REF_FOR_EACH(dst, i0, x, i1, i2) {
        int64_t r = (int64_t)ref_get(ids, x, i1, i2, 0);
        ref_set(dst, i0, x, i1, i2, ref_get(a, i0, r, i1 % a->ne[2], i2 % a->ne[3]));
    }
}

void ref_set_rows(const ref_tensor *b, const ref_tensor *ids, ref_tensor *dst, uint8_t *written) {
    int64_t R = dst->ne[1], D2 = dst->ne[2], D3 = dst->ne[3];
    int64_t X = b->ne[1], B2 = b->ne[2], B3 = b->ne[3];
    if (written) memset(written, 0, (size_t)(R * D2 * D3));
    for (int64_t i3 = 0; i3 < D3; i3++)
        for (int64_t i2 = 0; i2 < D2; i2++)
            for (int64_t x = 0; x < X; x++) {
                int64_t r = (int64_t)ref_get(ids, x, i2 % B2, i3 % B3, 0);
                for (int64_t i0 = 0; i0 < dst->ne[0]; i0++)
                    ref_set(dst, i0, r, i2, i3, ref_get(b, i0, x, i2 % B2, i3 % B3));
                if (written) written[r + R * (i2 + D2 * i3)] = 1;
            }
}

/* ---------------------------------------------------------------- attention */

void ref_soft_max(const ref_tensor *a, const ref_tensor *mask, const ref_tensor *sinks,
                  double scale, float max_bias, ref_tensor *dst, double *zmax) {
    int64_t n = a->ne[0], r = 0;
    double *z = malloc(sizeof(double) * (size_t)n);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++, r++) {
                double slope = ref_alibi_slope((int)i2, (int)a->ne[2], max_bias);
                double m = -INFINITY, za = 0;
                for (int64_t i = 0; i < n; i++) {
                    z[i] = ref_get(a, i, i1, i2, i3) * scale;
                    if (mask)
                        z[i] += slope * ref_get(mask, i, i1, i2 % mask->ne[2], i3 % mask->ne[3]);
                    m = fmax(m, z[i]);
                    if (isfinite(z[i])) za = fmax(za, fabs(z[i]));
                }
                double s = -INFINITY;
                if (sinks) {
                    s = ref_get(sinks, i2, 0, 0, 0);
                    m = fmax(m, s);
                    za = fmax(za, fabs(s));
                }
                double sum = sinks ? exp(s - m) : 0;
                for (int64_t i = 0; i < n; i++)
                    sum += exp(z[i] - m);
                for (int64_t i = 0; i < n; i++)
                    ref_set(dst, i, i1, i2, i3, exp(z[i] - m) / sum);
                if (zmax) zmax[r] = za;
            }
    free(z);
}

void ref_rope(const ref_tensor *a, const ref_tensor *pos, const ref_tensor *ff, int n_dims,
              int mode, double freq_base, double freq_scale, ref_tensor *dst) {
    REF_FOR_EACH(a, i0, i1, i2, i3) ref_set(dst, i0, i1, i2, i3, ref_get(a, i0, i1, i2, i3));
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t t = 0; t < a->ne[2]; t++)
            for (int64_t h = 0; h < a->ne[1]; h++) {
                double p = ref_get(pos, t, 0, 0, 0);
                for (int i = 0; i < n_dims / 2; i++) {
                    double f = ff ? ref_get(ff, i, 0, 0, 0) : 1.0;
                    double theta = p * freq_scale * pow(freq_base, -2.0 * i / n_dims) / f;
                    int64_t j0 = mode == LOOM_ROPE_TYPE_NEOX ? i : 2 * i;
                    int64_t j1 = mode == LOOM_ROPE_TYPE_NEOX ? i + n_dims / 2 : 2 * i + 1;
                    double x0 = ref_get(a, j0, h, t, i3), x1 = ref_get(a, j1, h, t, i3);
                    ref_set(dst, j0, h, t, i3, x0 * cos(theta) - x1 * sin(theta));
                    ref_set(dst, j1, h, t, i3, x0 * sin(theta) + x1 * cos(theta));
                }
            }
}

void ref_flash_attn_ext(const ref_tensor *q, const ref_tensor *k, const ref_tensor *v,
                        const ref_tensor *mask, const ref_tensor *sinks, double scale,
                        float max_bias, double softcap, ref_tensor *dst, double *zabs) {
    int64_t D = q->ne[0], Nq = q->ne[1], H = q->ne[2], S = q->ne[3];
    int64_t Nkv = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    double *z = malloc(sizeof(double) * (size_t)Nkv);
    double *qr = malloc(sizeof(double) * (size_t)D);
    double *kr = malloc(sizeof(double) * (size_t)D);
    double *acc = malloc(sizeof(double) * (size_t)Dv);
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < Nq; j++)
            for (int64_t h = 0; h < H; h++) {
                int64_t hk = h / (H / Hk);
                double slope = ref_alibi_slope((int)h, (int)H, max_bias);
                double m = -INFINITY, za = 0;
                ref_get_row(q, j, h, s, qr);
                for (int64_t i = 0; i < Nkv; i++) {
                    ref_get_row(k, i, hk, s, kr);
                    double dot = 0, dabs = 0;
                    for (int64_t d = 0; d < D; d++) {
                        dot += qr[d] * kr[d];
                        dabs += fabs(qr[d] * kr[d]);
                    }
                    za = fmax(za, scale * dabs);
                    z[i] = scale * dot;
                    if (softcap > 0) z[i] = softcap * tanh(z[i] / softcap);
                    if (mask) z[i] += slope * ref_get(mask, i, j, 0, 0);
                    m = fmax(m, z[i]);
                }
                double sink = -INFINITY;
                if (sinks) {
                    sink = ref_get(sinks, h, 0, 0, 0);
                    m = fmax(m, sink);
                }
                for (int64_t d = 0; d < Dv; d++)
                    acc[d] = 0;
                if (m > -INFINITY) {
                    double sum = sinks ? exp(sink - m) : 0;
                    for (int64_t i = 0; i < Nkv; i++) {
                        double w = exp(z[i] - m);
                        sum += w;
                        if (w == 0) continue;
                        for (int64_t d = 0; d < Dv; d++)
                            acc[d] += w * ref_get(v, d, i, hk, s);
                    }
                    for (int64_t d = 0; d < Dv; d++)
                        acc[d] /= sum;
                }
                /* all z -INF and no sink: the docs define the output as 0 */
                for (int64_t d = 0; d < Dv; d++)
                    ref_set(dst, d, h, j, s, acc[d]);
                if (zabs) zabs[h + H * (j + Nq * s)] = za;
            }
    free(z);
    free(qr);
    free(kr);
    free(acc);
}

/* ---------------------------------------------------------------- misc */

void ref_concat(const ref_tensor *a, const ref_tensor *b, int dim, ref_tensor *dst) {
    REF_FOR_EACH(dst, i0, i1, i2, i3) {
        int64_t i[4] = {i0, i1, i2, i3};
        double x;
        if (i[dim] < a->ne[dim]) {
            x = ref_get(a, i0, i1, i2, i3);
        } else {
            i[dim] -= a->ne[dim];
            x = ref_get(b, i[0], i[1], i[2], i[3]);
        }
        ref_set(dst, i0, i1, i2, i3, x);
    }
}

/* Stable insertion sort of row indices by value (ties keep the lower index first). */
static void ref__sort_row(const double *x, int64_t n, bool desc, int64_t *idx) {
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i;
        while (j > 0 && (desc ? x[idx[j - 1]] < x[i] : x[idx[j - 1]] > x[i])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

static void ref__sorted(const ref_tensor *a, bool desc, int64_t keep, ref_tensor *dst) {
    int64_t n = a->ne[0];
    double *x = malloc(sizeof(double) * (size_t)n);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                ref_get_row(a, i1, i2, i3, x);
                ref__sort_row(x, n, desc, idx);
                for (int64_t i = 0; i < keep; i++)
                    ref_set(dst, i, i1, i2, i3, (double)idx[i]);
            }
    free(x);
    free(idx);
}

void ref_argsort(const ref_tensor *a, loom_sort_order order, ref_tensor *dst) {
    ref__sorted(a, order == LOOM_SORT_DESC, a->ne[0], dst);
}

void ref_top_k(const ref_tensor *a, int k, ref_tensor *dst) {
    ref__sorted(a, true, k, dst);
}
