/*
 * Per-row F32 kernels: SUM_ROWS, MEAN, ARGMAX, NORM, RMS_NORM, SOFT_MAX (scale, mask,
 * ALiBi slopes, sinks), ARGSORT and TOP_K. Threads split rows; sums are accumulated in
 * double so results do not depend on the row length's rounding.
 */
#include "backends/cpu/cpu-impl.h"

static void row_of(const loom_tensor *t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

static float getf(const void *row, int64_t i, size_t nb0) {
    float v;
    memcpy(&v, (const char *)row + i * (int64_t)nb0, sizeof v);
    return v;
}

static void setf(void *row, int64_t i, size_t nb0, float v) {
    memcpy((char *)row + i * (int64_t)nb0, &v, sizeof v);
}

/* Element number `flat` (row-major) of t. */
static void *flat_at(const loom_tensor *t, int64_t flat) {
    int64_t i0 = flat % t->ne[0];
    int64_t r = flat / t->ne[0], i1, i2, i3;
    row_of(t, r, &i1, &i2, &i3);
    return loom__at(t, i0, i1, i2, i3);
}

/* ---------------------------------------------------------------- reductions */

void loom__cpu_op_reduce_rows(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(a, r, &i1, &i2, &i3);
        const void *x = loom__at(a, 0, i1, i2, i3);
        double s = 0.0;
        for (int64_t i = 0; i < n; i++)
            s += getf(x, i, a->nb[0]);
        if (dst->op == LOOM_OP_MEAN) s /= (double)n;
        setf(loom__at(dst, 0, i1, i2, i3), 0, dst->nb[0], (float)s);
    }
}

void loom__cpu_op_argmax(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(a, r, &i1, &i2, &i3);
        const void *x = loom__at(a, 0, i1, i2, i3);
        int32_t best = 0;
        float bv = n > 0 ? getf(x, 0, a->nb[0]) : 0.0f;
        for (int64_t i = 1; i < n; i++) {
            float v = getf(x, i, a->nb[0]);
            if (v > bv || (bv != bv && v == v)) { /* a NaN never wins over a number */
                bv = v;
                best = (int32_t)i;
            }
        }
        memcpy(flat_at(dst, r), &best, sizeof best);
    }
}

void loom__cpu_op_norm(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0];
    const float eps = loom_get_op_params_f32(dst, 0);
    const int64_t n = a->ne[0];
    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(a, r, &i1, &i2, &i3);
        const void *x = loom__at(a, 0, i1, i2, i3);
        void *y = loom__at(dst, 0, i1, i2, i3);
        if (dst->op == LOOM_OP_RMS_NORM) {
            double ss = 0.0;
            for (int64_t i = 0; i < n; i++) {
                double v = getf(x, i, a->nb[0]);
                ss += v * v;
            }
            const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
            for (int64_t i = 0; i < n; i++)
                setf(y, i, dst->nb[0], getf(x, i, a->nb[0]) * scale);
        } else {
            double s = 0.0;
            for (int64_t i = 0; i < n; i++)
                s += getf(x, i, a->nb[0]);
            const double mean = s / (double)n;
            double var = 0.0;
            for (int64_t i = 0; i < n; i++) {
                double d = getf(x, i, a->nb[0]) - mean;
                var += d * d;
            }
            const double scale = 1.0 / sqrt(var / (double)n + (double)eps);
            for (int64_t i = 0; i < n; i++)
                setf(y, i, dst->nb[0], (float)((getf(x, i, a->nb[0]) - mean) * scale));
        }
    }
}

/* ---------------------------------------------------------------- soft_max */

/* ALiBi slope of head h (1 when max_bias == 0), as docs/ops.md defines it. */
static float alibi_slope(float max_bias, int64_t n_head, int64_t h) {
    if (max_bias <= 0.0f) return 1.0f;
    const int64_t n_head_log2 = (int64_t)1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1))
                           : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

void loom__cpu_op_soft_max(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *mask = dst->src[1], *sinks = dst->src[2];
    const float scale = loom_get_op_params_f32(dst, 0);
    const float max_bias = loom_get_op_params_f32(dst, 1);
    const int64_t n = a->ne[0];
    float *z = p->wthread;
    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(a, r, &i1, &i2, &i3);
        const void *x = loom__at(a, 0, i1, i2, i3);
        const float slope = alibi_slope(max_bias, a->ne[2], i2);
        const void *mrow = mask ? loom__at(mask, 0, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : NULL;
        float max = -INFINITY;
        bool nan = false; /* fmaxf ignores NaN: a NaN logit must make the row NaN */
        for (int64_t i = 0; i < n; i++) {
            float v = getf(x, i, a->nb[0]) * scale;
            if (mrow) {
                const char *q = (const char *)mrow + i * (int64_t)mask->nb[0];
                float mv;
                if (mask->type == LOOM_TYPE_F16) {
                    uint16_t h;
                    memcpy(&h, q, sizeof h);
                    mv = loom__fp16_to_fp32(h);
                } else {
                    memcpy(&mv, q, sizeof mv);
                }
                v += slope * mv;
            }
            z[i] = v;
            nan |= v != v;
            max = fmaxf(max, v);
        }
        float sink = -INFINITY;
        if (sinks) {
            memcpy(&sink, flat_at(sinks, i2), sizeof sink);
            nan |= sink != sink;
            max = fmaxf(max, sink);
        }
        void *y = loom__at(dst, 0, i1, i2, i3);
        if (nan) { /* NaN in, NaN out */
            for (int64_t i = 0; i < n; i++)
                setf(y, i, dst->nb[0], NAN);
            continue;
        }
        if (max == -INFINITY) { /* every logit masked, no sink */
            for (int64_t i = 0; i < n; i++)
                setf(y, i, dst->nb[0], 0.0f);
            continue;
        }
        double sum = p->simd->vec_exp_sum(n, z, z, max);
        if (sinks) sum += exp((double)sink - (double)max);
        const float inv = (float)(1.0 / sum);
        if (dst->nb[0] == sizeof(float))
            p->simd->vec_scale(n, y, z, inv, 0.0f);
        else
            for (int64_t i = 0; i < n; i++)
                setf(y, i, dst->nb[0], z[i] * inv);
    }
}

/* ---------------------------------------------------------------- argsort, top_k */

/* Stable merge sort of idx[0:n] by x[idx] (descending when desc): ties keep the lower
 * index first. tmp has room for n indices. */
static void merge_sort(int32_t *idx, int32_t *tmp, int64_t n, const float *x, size_t nb0,
                       bool desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                float vi = getf(x, idx[i], nb0), vj = getf(x, idx[j], nb0);
                bool take_j = desc ? vj > vi : vj < vi;
                tmp[k++] = take_j ? idx[j++] : idx[i++];
            }
            while (i < mid)
                tmp[k++] = idx[i++];
            while (j < hi)
                tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

void loom__cpu_op_argsort(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    const bool top_k = dst->op == LOOM_OP_TOP_K;
    const bool desc = top_k || loom_get_op_params_i32(dst, 0) == LOOM_SORT_DESC;
    const int64_t keep = top_k ? dst->ne[0] : n;
    int32_t *idx = p->wthread, *tmp = idx + n;
    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(a, r, &i1, &i2, &i3);
        const float *x = loom__at(a, 0, i1, i2, i3);
        for (int64_t i = 0; i < n; i++)
            idx[i] = (int32_t)i;
        merge_sort(idx, tmp, n, x, a->nb[0], desc);
        char *y = loom__at(dst, 0, i1, i2, i3);
        for (int64_t i = 0; i < keep; i++)
            memcpy(y + i * (int64_t)dst->nb[0], &idx[i], sizeof(int32_t));
    }
}
