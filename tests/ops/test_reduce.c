/*
 * Ops cases, row reductions: SUM_ROWS, MEAN, ARGMAX, NORM, RMS_NORM, ARGSORT, TOP_K, with
 * odd and long rows, non-contiguous sources, and ties for the index-returning ops.
 *
 * Tolerances are the worst-case bounds of a float accumulation of n terms,
 * (n + 2) * 2^-24 * sum|x|, so any summation order passes and a wrong term does not;
 * index results must match exactly.
 */
#include <math.h>

#include "tests/ops/harness.h"

static const int64_t k_rows[] = {1, 7, 33, 67, 130, 1031};
#define N_ROWS (int)(sizeof k_rows / sizeof k_rows[0])

/* Values on a grid of 1/8 so that rows have many ties. */
static void fill_ties(ops_env *e, loom_tensor *t, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3) {
    for (int64_t i3 = 0; i3 < ne3; i3++)
        for (int64_t i2 = 0; i2 < ne2; i2++)
            for (int64_t i1 = 0; i1 < ne1; i1++)
                for (int64_t i0 = 0; i0 < ne0; i0++)
                    ops_set(e, t, i0, i1, i2, i3, (double)ops_randi(e, -8, 9) / 8);
}

OPS_CASE(sum_rows_mean) {
    for (int mean = 0; mean < 2; mean++)
        for (int i = 0; i < N_ROWS; i++) {
            int64_t n = k_rows[i];
            ops_layout l = (ops_layout)((i + mean) % OPS_LAYOUT_COUNT);
            ops_begin(e, "%s n=%lld %s", mean ? "mean" : "sum_rows", (long long)n,
                      ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 2, l);
            loom_tensor *out = mean ? loom_mean(ops_ctx(e), a) : loom_sum_rows(ops_ctx(e), a);
            if (ops_compute(e, out)) {
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, 1, 3, 2, 2);
                double *sabs = ops_scratch(e, sizeof(double) * 12);
                ref_sum_rows(&ra, &exp, sabs);
                if (mean) ref_mean(&ra, &exp);
                double *tol = ops_scratch(e, sizeof(double) * 12);
                for (int r = 0; r < 12; r++)
                    tol[r] = (double)(n + 2) * REF_U * sabs[r] / (mean ? (double)n : 1.0) + 1e-30;
                ops_check(e, out, &exp, (ops_tol){.rtol = 2 * REF_U, .elem = tol});
            }
            ops_end(e);
        }
}

OPS_CASE(argmax) {
    for (int i = 0; i < N_ROWS; i++) {
        int64_t n = k_rows[i], rows = 9;
        ops_layout l = (ops_layout)(i % 3); /* contig, padded, transposed (2-D) */
        ops_begin(e, "argmax n=%lld %s", (long long)n, ops_layout_name(l));
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, rows, 1, 1, l);
        if (i % 2) {
            fill_ties(e, a, n, rows, 1, 1);
        } else if (a) {
            /* distinct values plus an exact tie for the maximum in some rows */
            for (int64_t r = 0; r < rows; r += 2) {
                int64_t p = ops_randi(e, 0, n), q = ops_randi(e, 0, n);
                ops_set(e, a, p, r, 0, 0, 2.0);
                ops_set(e, a, q, r, 0, 0, 2.0);
            }
        }
        loom_tensor *out = loom_argmax(ops_ctx(e), a);
        if (ops_compute(e, out)) {
            ref_tensor ra = ops_ref(e, a);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_I32, rows, 1, 1, 1);
            ref_argmax(&ra, &exp);
            ops_check(e, out, &exp, (ops_tol){0});
        }
        ops_end(e);
    }
}

OPS_CASE(norm_rms_norm) {
    for (int rms = 0; rms < 2; rms++)
        for (int i = 0; i < N_ROWS; i++) {
            int64_t n = k_rows[i];
            float eps = i % 2 ? 1e-6f : 1e-5f;
            ops_layout l = (ops_layout)((i + rms) % OPS_LAYOUT_COUNT);
            ops_begin(e, "%s n=%lld eps=%g %s", rms ? "rms_norm" : "norm", (long long)n, eps,
                      ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 4, 3, 1, l);
            if (a) {
                /* a constant row (zero variance) and a zero row: eps decides */
                for (int64_t j = 0; j < n; j++) {
                    ops_set(e, a, j, 1, 0, 0, 0.5);
                    ops_set(e, a, j, 2, 1, 0, 0.0);
                }
            }
            loom_ctx *ctx = ops_ctx(e);
            loom_tensor *out = rms ? loom_rms_norm(ctx, a, eps) : loom_norm(ctx, a, eps);
            if (ops_compute(e, out)) {
                LOOM_CHECK(loom_get_op_params_f32(out, 0) == eps);
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 4, 3, 1);
                if (rms)
                    ref_rms_norm(&ra, eps, &exp);
                else
                    ref_norm(&ra, eps, &exp);
                /* mean and variance carry (n + 2) u relative error each; the output
                 * (|y| <= sqrt(n)) inherits it, plus the subtraction of the mean
                 * (error relative to the row's scale, i.e. to |y| + 1) */
                ops_check(e, out, &exp,
                          (ops_tol){.atol = 4 * (double)(n + 8) * REF_U + 1e-6,
                                    .rtol = 4 * (double)(n + 8) * REF_U});
            }
            ops_end(e);
        }
}

OPS_CASE(argsort) {
    for (int order = 0; order < 2; order++)
        for (int i = 0; i < N_ROWS; i++) {
            int64_t n = k_rows[i];
            if (n > 200) continue;
            ops_layout l = (ops_layout)((i + order) % OPS_LAYOUT_COUNT);
            ops_begin(e, "argsort %s n=%lld %s", order ? "desc" : "asc", (long long)n,
                      ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 1, l);
            if (i % 2 == 0) fill_ties(e, a, n, 3, 2, 1);
            loom_tensor *out = loom_argsort(ops_ctx(e), a, (loom_sort_order)order);
            if (ops_compute(e, out)) {
                LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), order);
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_I32, n, 3, 2, 1);
                ref_argsort(&ra, (loom_sort_order)order, &exp);
                ops_check(e, out, &exp, (ops_tol){0});
            }
            ops_end(e);
        }
}

OPS_CASE(top_k) {
    for (int i = 0; i < N_ROWS; i++) {
        int64_t n = k_rows[i];
        if (n > 200) continue;
        int ks[3] = {1, (int)(n > 3 ? 3 : n), (int)n};
        for (int j = 0; j < 3; j++) {
            int k = ks[j];
            ops_layout l = (ops_layout)((i + j) % OPS_LAYOUT_COUNT);
            ops_begin(e, "top_k k=%d n=%lld %s", k, (long long)n, ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 4, 1, 2, l);
            if (j != 1) fill_ties(e, a, n, 4, 1, 2);
            loom_tensor *out = loom_top_k(ops_ctx(e), a, k);
            if (ops_compute(e, out)) {
                LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), k);
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_I32, k, 4, 1, 2);
                ref_top_k(&ra, k, &exp);
                ops_check(e, out, &exp, (ops_tol){0});
            }
            ops_end(e);
        }
    }
}
