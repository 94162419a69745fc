/*
 * Ops cases, matrix products: MUL_MAT and MUL_MAT_ID for F32, F16, BF16, Q8_0 and Q4_0
 * weights; one token (N = 1) and several; broadcasting of the weights over dims 2 and 3;
 * transposed, permuted and row-padded operands; experts with U > 1 and with b->ne1 == 1.
 *
 * Tolerance per result element, from the reference's own bookkeeping:
 *   - float accumulation of K products in any order: 2 (K + 2) 2^-24 sum_k |a b|;
 *   - quantised weights: docs/ops.md lets the backend quantise b to Q8_0 in blocks of 32,
 *     which moves the result by at most sum_blocks (sum |a|) amax(b) (1/2 + 127 2^-11)/127
 *     (ref_mul_mat's q8_err); the weights themselves are compared in their dequantised
 *     form, so their own quantisation error is not part of the bound.
 */
#include <math.h>

#include "tests/ops/harness.h"

static const loom_type k_types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                                    LOOM_TYPE_Q4_0};
#define N_TYPES 5

static bool is_quant(loom_type t) {
    return t == LOOM_TYPE_Q8_0 || t == LOOM_TYPE_Q4_0;
}

/* BF16 weights: the BF16 GEMM (from 8 columns with AVX512_BF16) rounds the activations
 * to bf16 (relative error <= 2^-8 each), so the bound adds 2^-8 sum |a_k b_k|. */
static double *mm_tol(ops_env *e, int64_t n, int64_t K, const double *sabs, const double *q8,
                      bool quant, bool bf16) {
    double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        tol[i] = 2 * (double)(K + 2) * REF_U * (sabs[i] + (quant ? q8[i] : 0)) +
                 (quant ? q8[i] * 1.001 : 0) + (bf16 ? 0x1p-8 * 1.001 * sabs[i] : 0) + 1e-30;
    return tol;
}

typedef struct mm_variant {
    int64_t M, N;
    int64_t A2, A3, B2, B3;
} mm_variant;

static const mm_variant k_mm_variants[] = {
    {5, 1, 1, 1, 1, 1},  /* one token */
    {17, 3, 2, 1, 4, 1}, /* weights broadcast over dim 2 */
    {1, 9, 1, 2, 2, 4},  /* broadcast over dims 2 and 3, one output row */
    {33, 5, 1, 1, 1, 1}, /* enough rows to split across threads */
};
#define N_MM_VARIANTS 4

OPS_CASE(mul_mat) {
    static const int64_t k_float[] = {1, 7, 33, 67, 130};
    static const int64_t k_quant[] = {32, 96, 160, 256};
    static const ops_layout la_float[] = {OPS_CONTIG, OPS_PADDED, OPS_TRANSPOSED, OPS_PERM12};
    static const ops_layout la_quant[] = {OPS_CONTIG, OPS_PADDED, OPS_PERM12, OPS_CONTIG};
    static const ops_layout lb_all[] = {OPS_CONTIG, OPS_TRANSPOSED, OPS_PERM12, OPS_PADDED,
                                        OPS_SCRAMBLED};
    int v = 0;
    for (int t = 0; t < N_TYPES; t++) {
        loom_type type = k_types[t];
        bool q = is_quant(type);
        int nk = q ? 4 : 5;
        for (int ik = 0; ik < nk; ik++)
            for (int iv = 0; iv < N_MM_VARIANTS; iv++, v++) {
                int64_t K = q ? k_quant[ik] : k_float[ik];
                mm_variant mv = k_mm_variants[iv];
                ops_layout la = q ? la_quant[(ik + iv) % 4] : la_float[(ik + iv) % 4];
                ops_layout lb = lb_all[v % 5];
                ops_begin(e,
                          "mul_mat %s K=%lld M=%lld N=%lld a[.., %lld, %lld] %s b[.., %lld, "
                          "%lld] %s",
                          loom_type_name(type), (long long)K, (long long)mv.M, (long long)mv.N,
                          (long long)mv.A2, (long long)mv.A3, ops_layout_name(la), (long long)mv.B2,
                          (long long)mv.B3, ops_layout_name(lb));
                loom_tensor *a = ops_src(e, type, K, mv.M, mv.A2, mv.A3, la);
                loom_tensor *b = ops_src(e, LOOM_TYPE_F32, K, mv.N, mv.B2, mv.B3, lb);
                loom_tensor *out = loom_mul_mat(ops_ctx(e), a, b);
                if (ops_compute(e, out)) {
                    int64_t n = mv.M * mv.N * mv.B2 * mv.B3;
                    ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
                    ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, mv.M, mv.N, mv.B2, mv.B3);
                    double *sabs = ops_scratch(e, sizeof(double) * (size_t)n);
                    double *q8 = ops_scratch(e, sizeof(double) * (size_t)n);
                    ref_mul_mat(&ra, &rb, &exp, sabs, q8);
                    ops_check(
                        e, out, &exp,
                        (ops_tol){.elem = mm_tol(e, n, K, sabs, q8, q, type == LOOM_TYPE_BF16)});
                }
                ops_end(e);
            }
    }
}

/* Values k/8 with |k| <= 8: exact in F32, F16 and BF16, products multiples of 1/64. */
static void fill_grid(ops_env *e, loom_tensor *t, int64_t ne0, int64_t ne1) {
    for (int64_t i1 = 0; i1 < ne1; i1++)
        for (int64_t i0 = 0; i0 < ne0; i0++)
            ops_set(e, t, i0, i1, 0, 0, (double)ops_randi(e, -8, 9) / 8);
}

/* A long reduction. For float weights the inputs are on a grid that makes every partial
 * sum exactly representable in F32 (multiples of 1/64 below 2^18), so any summation order
 * gives the exact result and the tolerance is 0: a dropped tail element or a mis-strided
 * long row cannot hide in a rounding bound. Quantised weights keep the derived bound. */
OPS_CASE(mul_mat_long_k) {
    for (int t = 0; t < N_TYPES; t++) {
        loom_type type = k_types[t];
        bool q = is_quant(type);
        int64_t K = q ? 4096 + 32 : 4099, M = 6, N = 2;
        ops_begin(e, "mul_mat %s K=%lld M=6 N=2", loom_type_name(type), (long long)K);
        loom_tensor *a = ops_src(e, type, K, M, 1, 1, OPS_CONTIG);
        loom_tensor *b = ops_src(e, LOOM_TYPE_F32, K, N, 1, 1, q ? OPS_CONTIG : OPS_PADDED);
        if (!q) {
            fill_grid(e, a, K, M);
            fill_grid(e, b, K, N);
        }
        loom_tensor *out = loom_mul_mat(ops_ctx(e), a, b);
        if (ops_compute(e, out)) {
            ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, M, N, 1, 1);
            double *sabs = ops_scratch(e, sizeof(double) * (size_t)(M * N));
            double *q8 = ops_scratch(e, sizeof(double) * (size_t)(M * N));
            ref_mul_mat(&ra, &rb, &exp, sabs, q8);
            if (q)
                ops_check(
                    e, out, &exp,
                    (ops_tol){.elem = mm_tol(e, M * N, K, sabs, q8, q, type == LOOM_TYPE_BF16)});
            else
                ops_check(e, out, &exp, (ops_tol){0});
        }
        ops_end(e);
    }
}

typedef struct mmid_variant {
    int64_t U, B1, T;
} mmid_variant;

static const mmid_variant k_mmid_variants[] = {
    {3, 3, 4},  /* U > 1, one activation row per slot */
    {3, 1, 4},  /* U > 1, b->ne1 == 1: every slot reads the same row */
    {2, 2, 1},  /* one token */
    {1, 1, 5},  /* one expert per token */
    {3, 3, 30}, /* 90 slots over 4 experts: the batched (GEMM) path */
};

OPS_CASE(mul_mat_id) {
    int v = 0;
    for (int t = 0; t < N_TYPES; t++) {
        loom_type type = k_types[t];
        bool q = is_quant(type);
        for (int iv = 0; iv < 5; iv++, v++) {
            mmid_variant mv = k_mmid_variants[iv];
            int64_t K = q ? (iv % 2 ? 64 : 32) : (iv % 2 ? 33 : 7);
            int64_t M = iv % 2 ? 17 : 5, E = 4;
            ops_layout la = iv % 2 ? OPS_PADDED : OPS_CONTIG;
            ops_layout lb = (ops_layout)(v % 3 == 0   ? OPS_CONTIG
                                         : v % 3 == 1 ? OPS_PADDED
                                                      : OPS_PERM12);
            ops_begin(e, "mul_mat_id %s K=%lld M=%lld E=4 U=%lld B1=%lld T=%lld as %s b %s",
                      loom_type_name(type), (long long)K, (long long)M, (long long)mv.U,
                      (long long)mv.B1, (long long)mv.T, ops_layout_name(la), ops_layout_name(lb));
            loom_tensor *as = ops_src(e, type, K, M, E, 1, la);
            loom_tensor *b = ops_src(e, LOOM_TYPE_F32, K, mv.B1, mv.T, 1, lb);
            loom_tensor *ids = ops_src(e, LOOM_TYPE_I32, mv.U, mv.T, 1, 1, OPS_CONTIG);
            ops_fill(e, ids, 0, (double)E);
            loom_tensor *out = loom_mul_mat_id(ops_ctx(e), as, b, ids);
            if (ops_compute(e, out)) {
                int64_t n = M * mv.U * mv.T;
                ref_tensor ra = ops_ref(e, as), rb = ops_ref(e, b), ri = ops_ref(e, ids);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, M, mv.U, mv.T, 1);
                double *sabs = ops_scratch(e, sizeof(double) * (size_t)n);
                double *q8 = ops_scratch(e, sizeof(double) * (size_t)n);
                ref_mul_mat_id(&ra, &rb, &ri, &exp, sabs, q8);
                ops_check(e, out, &exp, (ops_tol){.elem = mm_tol(e, n, K, sabs, q8, q, false)});
            }
            ops_end(e);
        }
    }
}
