/*
 * Ops cases, the block types beyond Q8_0/Q4_0 as matmul weights: MUL_MAT (one token, a few,
 * and enough columns for the tiled GEMM) and MUL_MAT_ID for Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4, on odd row counts, broadcast batches and
 * padded / permuted / transposed views.
 *
 * The weights are compared in their dequantised form (the reference decodes them with the
 * type's to_float, checked against the GGUF layouts in tests/core/quants_test.c). The
 * backend quantises b to the type's vec_dot_type as the reference engines do: Q8_K (blocks
 * of 256, f32 scale amax / 127), Q8_0 or Q8_1 (blocks of 32, fp16 scale). Per result
 * element the tolerance is then, with B the activation block:
 *   sum_B (sum_{k in B} |a_k|) * amax_B(b) / 127 * (1/2 + [fp16 scale] 127 * 2^-11)
 *     (each activation moves by at most half a step plus the scale's rounding),
 *   + for Q8_1: sum_B max_{k in B} |a_k| * (sum_{k in B} |b_k| + 16 amax_B / 127) * 2^-11
 *     (the fp16 rounding of s = d * sum(q), which carries the weight block's min; the min
 *     decodes exactly at the block's smallest element, so |min| <= max |a_k|),
 *   + 2 (K + 2) 2^-24 (sum |a b| + the terms above) for float accumulation.
 * That worst-case bound is loose (a wrong quarter of a block can hide in it), so where the
 * backend must take the integer-dot path (fewer than 8 columns, and MUL_MAT_ID) the result is
 * instead compared with the float dot of a with b quantised and decoded by core's
 * vec_dot_type quantiser: only float rounding remains, and any unpacking slip shows.
 */
#include <math.h>
#include <stdlib.h>

#include "tests/ops/harness.h"

static const loom_type k_qtypes[] = {
    LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0,   LOOM_TYPE_Q5_1,  LOOM_TYPE_Q2_K,
    LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K,   LOOM_TYPE_Q5_K,  LOOM_TYPE_Q6_K,
    LOOM_TYPE_IQ4_NL, LOOM_TYPE_IQ4_XS, LOOM_TYPE_MXFP4,
};
#define N_QTYPES ((int)(sizeof k_qtypes / sizeof k_qtypes[0]))

/* Activation-quantisation bound of one a row against one b row (both decoded, K long). */
static double act_bound(loom_type wtype, const double *a, const double *b, int64_t K) {
    const loom_type vdt = loom_type_traits_get((int)wtype)->vec_dot_type;
    const int64_t B = loom_blck_size(vdt);
    const bool fp16 = vdt != LOOM_TYPE_Q8_K;
    double t = 0;
    for (int64_t k0 = 0; k0 < K; k0 += B) {
        double sa = 0, amaxb = 0, amaxa = 0, sb = 0;
        for (int64_t k = k0; k < k0 + B; k++) {
            sa += fabs(a[k]);
            sb += fabs(b[k]);
            amaxb = fmax(amaxb, fabs(b[k]));
            amaxa = fmax(amaxa, fabs(a[k]));
        }
        t += sa * amaxb / 127 * (0.5 + (fp16 ? 127 * 0x1p-11 : 0)) * (1 + 1e-5);
        if (vdt == LOOM_TYPE_Q8_1) t += amaxa * (sb + 16 * amaxb / 127) * 0x1p-11 * 1.01;
    }
    return t;
}

/* tol[m + M * col] for dst [M, ncol] from decoded rows of a (M x K) and b (ncol x K). */
static void fill_tol(loom_type wtype, const double *ad, const double *bd, const int32_t *arow_of,
                     int64_t M, int64_t ncol, int64_t K, double *tol) {
    for (int64_t c = 0; c < ncol; c++)
        for (int64_t m = 0; m < M; m++) {
            const double *a = ad + (size_t)(arow_of ? arow_of[c] * M + m : m) * (size_t)K;
            const double *b = bd + (size_t)c * (size_t)K;
            double sab = 0;
            for (int64_t k = 0; k < K; k++)
                sab += fabs(a[k] * b[k]);
            double q = act_bound(wtype, a, b, K);
            tol[m + M * c] = q + 2 * (double)(K + 2) * REF_U * (sab + q) + 1e-30;
        }
}

/* b's row as the backend's integer dot sees it: quantised to a's vec_dot_type with core's
 * quantiser (checked in tests/core) and decoded. */
static void quantised_row(loom_type wtype, double *row, int64_t K) {
    const loom_type_traits *vt =
        loom_type_traits_get((int)loom_type_traits_get((int)wtype)->vec_dot_type);
    float *x = malloc(sizeof(float) * (size_t)K), *y = malloc(sizeof(float) * (size_t)K);
    void *q = malloc(loom_row_size(vt->blck_size == 256 ? LOOM_TYPE_Q8_K : LOOM_TYPE_Q8_1, K));
    for (int64_t k = 0; k < K; k++)
        x[k] = (float)row[k];
    vt->from_float(x, q, K);
    vt->to_float(q, y, K);
    for (int64_t k = 0; k < K; k++)
        row[k] = y[k];
    free(x);
    free(y);
    free(q);
}

/* The tight check of the integer-dot paths: dst[m + M c] against the float dot of the
 * decoded a row with the quantised-then-decoded b row; only float rounding remains
 * (2 (K + 2) 2^-24 sum |a bq|, the per-block scale products included), and for Q8_1 the
 * fp16 rounding of s = d sum(q) that carries the weight block's min (|min| <= max |a|):
 * sum_B max_B |a| sum_B |bq| 2^-11. */
static void tight_expect(loom_type wtype, const double *ad, const double *bqd,
                         const int32_t *arow_of, int64_t M, int64_t ncol, int64_t K, double *exp,
                         double *tol) {
    const bool q81 = loom_type_traits_get((int)wtype)->vec_dot_type == LOOM_TYPE_Q8_1;
    for (int64_t c = 0; c < ncol; c++)
        for (int64_t m = 0; m < M; m++) {
            const double *a = ad + (size_t)(arow_of ? arow_of[c] * M + m : m) * (size_t)K;
            const double *b = bqd + (size_t)c * (size_t)K;
            double s = 0, sab = 0;
            for (int64_t k = 0; k < K; k++) {
                s += a[k] * b[k];
                sab += fabs(a[k] * b[k]);
            }
            double smin = 0;
            for (int64_t k0 = 0; q81 && k0 < K; k0 += 32) {
                double amax = 0, sb = 0;
                for (int64_t k = k0; k < k0 + 32; k++) {
                    amax = fmax(amax, fabs(a[k]));
                    sb += fabs(b[k]);
                }
                smin += amax * sb * 0x1p-11 * 1.01;
            }
            exp[m + M * c] = s;
            tol[m + M * c] = 2 * (double)(K + 2) * REF_U * (sab + smin) + smin + 1e-30;
        }
}

typedef struct qmm_variant {
    int64_t kblocks, M, N, A2, B2;
} qmm_variant;

static const qmm_variant k_qmm[] = {
    {1, 5, 1, 1, 1},   /* one token, one block */
    {3, 17, 3, 1, 2},  /* weights broadcast over dim 2 */
    {2, 33, 40, 1, 1}, /* enough columns for the GEMM path */
    {5, 7, 2, 2, 2},   /* two weight batches */
};

OPS_CASE(mul_mat_quants) {
    static const ops_layout la_all[] = {OPS_CONTIG, OPS_PADDED, OPS_PERM12, OPS_CONTIG};
    static const ops_layout lb_all[] = {OPS_CONTIG, OPS_TRANSPOSED, OPS_PADDED, OPS_SCRAMBLED};
    int v = 0;
    for (int t = 0; t < N_QTYPES; t++)
        for (int iv = 0; iv < 4; iv++, v++) {
            const loom_type type = k_qtypes[t];
            const qmm_variant q = k_qmm[iv];
            const int64_t K = q.kblocks * loom_blck_size(type);
            const ops_layout la = la_all[(t + iv) % 4], lb = lb_all[v % 4];
            ops_begin(e, "mul_mat %s K=%lld M=%lld N=%lld A2=%lld B2=%lld a %s b %s",
                      loom_type_name(type), (long long)K, (long long)q.M, (long long)q.N,
                      (long long)q.A2, (long long)q.B2, ops_layout_name(la), ops_layout_name(lb));
            loom_tensor *a = ops_src(e, type, K, q.M, q.A2, 1, la);
            loom_tensor *b = ops_src(e, LOOM_TYPE_F32, K, q.N, q.B2, 1, lb);
            loom_tensor *out = loom_mul_mat(ops_ctx(e), a, b);
            if (ops_compute(e, out)) {
                const int64_t n = q.M * q.N * q.B2;
                ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, q.M, q.N, q.B2, 1);
                double *sabs = ops_scratch(e, sizeof(double) * (size_t)n);
                double *q8 = ops_scratch(e, sizeof(double) * (size_t)n);
                ref_mul_mat(&ra, &rb, &exp, sabs, q8);
                double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
                double *ad = ops_scratch(e, sizeof(double) * (size_t)(q.M * K));
                double *bd = ops_scratch(e, sizeof(double) * (size_t)(q.N * K));
                for (int64_t i2 = 0; i2 < q.B2; i2++) {
                    for (int64_t m = 0; m < q.M; m++)
                        ref_get_row(&ra, m, i2 / (q.B2 / q.A2), 0, ad + m * K);
                    for (int64_t c = 0; c < q.N; c++)
                        ref_get_row(&rb, c, i2, 0, bd + c * K);
                    fill_tol(type, ad, bd, NULL, q.M, q.N, K, tol + i2 * q.M * q.N);
                    if (q.N < 8) { /* below every GEMM threshold: the integer dots */
                        double *ev = ops_scratch(e, sizeof(double) * (size_t)(q.M * q.N));
                        for (int64_t c = 0; c < q.N; c++)
                            quantised_row(type, bd + c * K, K);
                        tight_expect(type, ad, bd, NULL, q.M, q.N, K, ev, tol + i2 * q.M * q.N);
                        for (int64_t c = 0; c < q.N; c++)
                            for (int64_t m = 0; m < q.M; m++)
                                ref_set(&exp, m, c, i2, 0, ev[m + q.M * c]);
                    }
                }
                ops_check(e, out, &exp, (ops_tol){.elem = tol});
            }
            ops_end(e);
        }
}

OPS_CASE(mul_mat_id_quants) {
    static const struct {
        int64_t U, B1, T;
    } k_v[] = {{2, 2, 3}, {3, 1, 4}, {2, 2, 40}}; /* 80 slots: the batched path */
    for (int t = 0; t < N_QTYPES; t++)
        for (int iv = 0; iv < 3; iv++) {
            const loom_type type = k_qtypes[t];
            const int64_t K = (iv + 1) * loom_blck_size(type), M = iv == 1 ? 9 : 5, E = 4;
            const int64_t U = k_v[iv].U, B1 = k_v[iv].B1, T = k_v[iv].T;
            const ops_layout la = iv == 1 ? OPS_PADDED : OPS_CONTIG;
            const ops_layout lb = iv == 2 ? OPS_PERM12 : OPS_CONTIG;
            ops_begin(e, "mul_mat_id %s K=%lld M=%lld E=4 U=%lld B1=%lld T=%lld as %s b %s",
                      loom_type_name(type), (long long)K, (long long)M, (long long)U, (long long)B1,
                      (long long)T, ops_layout_name(la), ops_layout_name(lb));
            loom_tensor *as = ops_src(e, type, K, M, E, 1, la);
            loom_tensor *b = ops_src(e, LOOM_TYPE_F32, K, B1, T, 1, lb);
            loom_tensor *ids = ops_src(e, LOOM_TYPE_I32, U, T, 1, 1, OPS_CONTIG);
            ops_fill(e, ids, 0, (double)E);
            loom_tensor *out = loom_mul_mat_id(ops_ctx(e), as, b, ids);
            if (ops_compute(e, out)) {
                const int64_t n = M * U * T;
                ref_tensor ra = ops_ref(e, as), rb = ops_ref(e, b), ri = ops_ref(e, ids);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, M, U, T, 1);
                double *sabs = ops_scratch(e, sizeof(double) * (size_t)n);
                double *q8 = ops_scratch(e, sizeof(double) * (size_t)n);
                ref_mul_mat_id(&ra, &rb, &ri, &exp, sabs, q8);
                /* decoded experts [E][M][K]; one b row and one expert per (u, t) column */
                double *ad = ops_scratch(e, sizeof(double) * (size_t)(E * M * K));
                for (int64_t x = 0; x < E; x++)
                    for (int64_t m = 0; m < M; m++)
                        ref_get_row(&ra, m, x, 0, ad + (x * M + m) * K);
                double *bd = ops_scratch(e, sizeof(double) * (size_t)(U * T * K));
                int32_t *ex = ops_scratch(e, sizeof(int32_t) * (size_t)(U * T));
                for (int64_t tt = 0; tt < T; tt++)
                    for (int64_t u = 0; u < U; u++) {
                        ref_get_row(&rb, u % B1, tt, 0, bd + (tt * U + u) * K);
                        ex[tt * U + u] = (int32_t)ref_get(&ri, u, tt, 0, 0);
                    }
                double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
                /* the dot path quantises b for block types: the tight check; the batched
                 * (GEMM) path (80 slots here) keeps b in f32 and takes the bound */
                if (U * T >= 64) {
                    fill_tol(type, ad, bd, ex, M, U * T, K, tol);
                    ops_check(e, out, &exp, (ops_tol){.elem = tol});
                    ops_end(e);
                    continue;
                }
                for (int64_t c = 0; c < U * T; c++)
                    quantised_row(type, bd + c * K, K);
                double *ev = ops_scratch(e, sizeof(double) * (size_t)n);
                tight_expect(type, ad, bd, ex, M, U * T, K, ev, tol);
                for (int64_t tt = 0; tt < T; tt++)
                    for (int64_t u = 0; u < U; u++)
                        for (int64_t m = 0; m < M; m++)
                            ref_set(&exp, m, u, tt, 0, ev[m + M * (tt * U + u)]);
                ops_check(e, out, &exp, (ops_tol){.elem = tol});
            }
            ops_end(e);
        }
}
