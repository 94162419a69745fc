/*
 * Ops cases, elementwise family: ADD/SUB/MUL/DIV (with broadcasting), ADD_ID, SCALE, SQR,
 * SQRT, UNARY (silu, gelu, relu), GLU (fused and split, swapped), CLAMP, FILL, and the
 * copies DUP, CONT, CPY (every documented type pair), CONCAT. Odd row lengths and
 * non-contiguous sources throughout.
 *
 * Tolerances: one F32 rounding is 2^-24 relative, so 1e-5 relative is generous for
 * single-operation results; functions of exp/tanh get an absolute term for cancellation
 * near zero; copies and selections (clamp, fill, dup, cont, concat) must be exact;
 * conversions to F16/BF16/Q8_0/Q4_0 get ref_convert_tol (half an ulp / half a step).
 */
#include <math.h>

#include "tests/ops/harness.h"

static const int64_t k_ne0[] = {1, 7, 33, 67, 130};
#define N_NE0 (int)(sizeof k_ne0 / sizeof k_ne0[0])

/* F32 single-rounding elementwise results */
static const ops_tol k_tol_elem = {.atol = 1e-30, .rtol = 1e-5};

/* ---------------------------------------------------------------- binary */

static void binary_case(ops_env *e, ref_binary_op op) {
    static const char *names[] = {"add", "sub", "mul", "div"};
    /* b's shape as a function of a's [n, 3, 2, 2]: same, rows of 1, columns, one row */
    static const int bshape[4][4] = {{1, 1, 1, 1}, {1, 0, 1, 0}, {0, 1, 0, 1}, {1, 0, 0, 0}};
    int v = 0;
    for (int in = 0; in < N_NE0; in++)
        for (int bs = 0; bs < 4; bs++, v++) {
            int64_t n = k_ne0[in];
            int64_t ne[4] = {n, 3, 2, 2}, nb_[4];
            for (int d = 0; d < 4; d++)
                nb_[d] = bshape[bs][d] ? ne[d] : 1;
            ops_layout la = (ops_layout)(v % OPS_LAYOUT_COUNT);
            ops_layout lb = (ops_layout)((v / 2 + 1) % OPS_LAYOUT_COUNT);
            ops_begin(e, "%s a[%lld,3,2,2] %s, b[%lld,%lld,%lld,%lld] %s", names[op], (long long)n,
                      ops_layout_name(la), (long long)nb_[0], (long long)nb_[1], (long long)nb_[2],
                      (long long)nb_[3], ops_layout_name(lb));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 2, la);
            loom_tensor *b = ops_src(e, LOOM_TYPE_F32, nb_[0], nb_[1], nb_[2], nb_[3], lb);
            if (op == REF_DIV) ops_fill(e, b, 0.5, 2.0); /* keep divisors away from 0 */
            loom_ctx *ctx = ops_ctx(e);
            loom_tensor *out = op == REF_ADD   ? loom_add(ctx, a, b)
                               : op == REF_SUB ? loom_sub(ctx, a, b)
                               : op == REF_MUL ? loom_mul(ctx, a, b)
                                               : loom_div(ctx, a, b);
            if (ops_compute(e, out)) {
                ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 3, 2, 2);
                ref_binary(op, &ra, &rb, &exp);
                ops_check(e, out, &exp, k_tol_elem);
            }
            ops_end(e);
        }
}

OPS_CASE(add) {
    binary_case(e, REF_ADD);
}
OPS_CASE(sub) {
    binary_case(e, REF_SUB);
}
OPS_CASE(mul) {
    binary_case(e, REF_MUL);
}
OPS_CASE(div) {
    binary_case(e, REF_DIV);
}

OPS_CASE(add_id) {
    static const int64_t ns[] = {1, 7, 33, 130};
    for (int i = 0; i < 4; i++) {
        int64_t n = ns[i], U = 3, T = 4, E = 5;
        ops_layout la = i % 2 ? OPS_PERM12 : OPS_PADDED;
        ops_begin(e, "add_id n=%lld U=3 T=4 E=5 a %s", (long long)n, ops_layout_name(la));
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, U, T, 1, la);
        loom_tensor *b = ops_src(e, LOOM_TYPE_F32, n, E, 1, 1, i % 2 ? OPS_CONTIG : OPS_PADDED);
        loom_tensor *ids = ops_src(e, LOOM_TYPE_I32, U, T, 1, 1, OPS_CONTIG);
        ops_fill(e, ids, 0, (double)E);
        loom_tensor *out = loom_add_id(ops_ctx(e), a, b, ids);
        if (ops_compute(e, out)) {
            ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b), ri = ops_ref(e, ids);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, U, T, 1);
            ref_add_id(&ra, &rb, &ri, &exp);
            ops_check(e, out, &exp, k_tol_elem);
        }
        ops_end(e);
    }
}

/* ---------------------------------------------------------------- unary-ish */

OPS_CASE(scale) {
    for (int i = 0; i < N_NE0; i++) {
        int64_t n = k_ne0[i];
        ops_layout l = (ops_layout)(i % OPS_LAYOUT_COUNT);
        bool with_bias = i % 2 == 0;
        float s = -1.75f, bias = with_bias ? 0.3125f : 0.0f;
        ops_begin(e, "scale%s n=%lld %s", with_bias ? "_bias" : "", (long long)n,
                  ops_layout_name(l));
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 5, 3, 1, l);
        loom_tensor *out =
            with_bias ? loom_scale_bias(ops_ctx(e), a, s, bias) : loom_scale(ops_ctx(e), a, s);
        if (ops_compute(e, out)) {
            /* the documented parameter words: w0 = s, w1 = b */
            LOOM_CHECK(loom_get_op_params_f32(out, 0) == s);
            LOOM_CHECK(loom_get_op_params_f32(out, 1) == bias);
            ref_tensor ra = ops_ref(e, a);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 5, 3, 1);
            ref_scale(&ra, s, bias, &exp);
            /* a*s + b: two roundings of terms up to 1.75 in size */
            ops_check(e, out, &exp, (ops_tol){.atol = 1e-6, .rtol = 1e-5});
        }
        ops_end(e);
    }
}

OPS_CASE(sqr_sqrt) {
    for (int i = 0; i < N_NE0; i++)
        for (int sq = 0; sq < 2; sq++) {
            int64_t n = k_ne0[i];
            ops_layout l = (ops_layout)((i + sq) % OPS_LAYOUT_COUNT);
            ops_begin(e, "%s n=%lld %s", sq ? "sqrt" : "sqr", (long long)n, ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 4, 2, 3, l);
            if (sq) ops_fill(e, a, 0, 4);
            loom_tensor *out = sq ? loom_sqrt(ops_ctx(e), a) : loom_sqr(ops_ctx(e), a);
            if (ops_compute(e, out)) {
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 4, 2, 3);
                if (sq)
                    ref_sqrt(&ra, &exp);
                else
                    ref_sqr(&ra, &exp);
                ops_check(e, out, &exp, k_tol_elem);
            }
            ops_end(e);
        }
}

OPS_CASE(unary) {
    static const char *names[] = {"silu", "gelu", "relu"};
    for (int op = 0; op < LOOM_UNARY_COUNT; op++)
        for (int i = 0; i < N_NE0; i++) {
            int64_t n = k_ne0[i];
            ops_layout l = (ops_layout)((i + op) % OPS_LAYOUT_COUNT);
            bool named = i % 2 == 1; /* the loom_silu/gelu/relu shorthands */
            ops_begin(e, "%s%s n=%lld %s", names[op], named ? "()" : " via loom_unary",
                      (long long)n, ops_layout_name(l));
            loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 2, l);
            ops_fill(e, a, -6, 6);
            loom_ctx *ctx = ops_ctx(e);
            loom_tensor *out;
            if (!named)
                out = loom_unary(ctx, a, (loom_unary_op)op);
            else if (op == LOOM_UNARY_SILU)
                out = loom_silu(ctx, a);
            else if (op == LOOM_UNARY_GELU)
                out = loom_gelu(ctx, a);
            else
                out = loom_relu(ctx, a);
            if (ops_compute(e, out)) {
                LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), op);
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 3, 2, 2);
                ref_unary((loom_unary_op)op, &ra, &exp);
                /* exp/tanh in float: a few ulps relative; for x -> -6 gelu and silu are
                 * differences of nearly equal terms of size |x|, so an absolute
                 * 6 * 2^-24 * a few is added */
                ops_check(e, out, &exp, (ops_tol){.atol = 2e-6, .rtol = 1e-5});
            }
            ops_end(e);
        }
}

OPS_CASE(glu) {
    static const char *names[] = {"swiglu", "geglu"};
    int v = 0;
    for (int op = 0; op < LOOM_GLU_COUNT; op++)
        for (int fused = 0; fused < 2; fused++)
            for (int swapped = 0; swapped < 2; swapped++)
                for (int i = 0; i < N_NE0; i += 2, v++) {
                    int64_t n = k_ne0[i];
                    ops_layout la = (ops_layout)(v % OPS_LAYOUT_COUNT);
                    ops_layout lb = (ops_layout)((v + 2) % OPS_LAYOUT_COUNT);
                    ops_begin(e, "%s %s%s n=%lld a %s", names[op], fused ? "fused" : "split",
                              swapped ? " swapped" : "", (long long)n, ops_layout_name(la));
                    loom_ctx *ctx = ops_ctx(e);
                    loom_tensor *a, *b = NULL, *out;
                    if (fused) {
                        a = ops_src(e, LOOM_TYPE_F32, 2 * n, 3, 2, 1, la);
                        ops_fill(e, a, -5, 5);
                        out = loom_glu(ctx, a, (loom_glu_op)op, swapped);
                    } else {
                        a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 1, la);
                        b = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 1, lb);
                        ops_fill(e, a, -5, 5);
                        ops_fill(e, b, -5, 5);
                        if (!swapped && op == LOOM_GLU_SWIGLU && v % 2)
                            out = loom_swiglu_split(ctx, a, b);
                        else
                            out = loom_glu_split(ctx, a, b, (loom_glu_op)op);
                        if (swapped && out) loom_set_op_params_i32(out, 1, 1);
                    }
                    if (ops_compute(e, out)) {
                        LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), op);
                        LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 1), swapped);
                        ref_tensor ra = ops_ref(e, a), rb;
                        if (b) rb = ops_ref(e, b);
                        ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 3, 2, 1);
                        ref_glu((loom_glu_op)op, &ra, b ? &rb : NULL, swapped, &exp);
                        /* act(x) * g with |g| <= 5: the unary bound scaled by 5 */
                        ops_check(e, out, &exp, (ops_tol){.atol = 1e-5, .rtol = 2e-5});
                    }
                    ops_end(e);
                }
}

OPS_CASE(clamp) {
    for (int i = 0; i < N_NE0; i++) {
        int64_t n = k_ne0[i];
        ops_layout l = (ops_layout)(i % OPS_LAYOUT_COUNT);
        ops_begin(e, "clamp n=%lld %s", (long long)n, ops_layout_name(l));
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n, 3, 2, 2, l);
        loom_tensor *out = loom_clamp(ops_ctx(e), a, -0.25f, 0.5f);
        if (ops_compute(e, out)) {
            LOOM_CHECK(loom_get_op_params_f32(out, 0) == -0.25f);
            LOOM_CHECK(loom_get_op_params_f32(out, 1) == 0.5f);
            ref_tensor ra = ops_ref(e, a);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 3, 2, 2);
            ref_clamp(&ra, -0.25, 0.5, &exp);
            ops_check(e, out, &exp, (ops_tol){0}); /* min/max are exact */
        }
        ops_end(e);
    }
}

OPS_CASE(fill) {
    static const loom_type types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_I32};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < N_NE0; i += 2) {
            int64_t n = k_ne0[i];
            ops_layout l = t == 0 ? OPS_SCRAMBLED : OPS_CONTIG;
            ops_begin(e, "fill %s n=%lld %s", loom_type_name(types[t]), (long long)n,
                      ops_layout_name(l));
            loom_tensor *a = ops_src(e, types[t], n, 2, 3, 1, l);
            const float value = -0.3710937f;
            loom_tensor *out = loom_fill(ops_ctx(e), a, value);
            if (ops_compute(e, out)) {
                ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 2, 3, 1);
                ref_fill(value, &exp);
                ops_check(e, out, &exp, (ops_tol){0});
            }
            ops_end(e);
        }
}

/* ---------------------------------------------------------------- copies */

static bool is_quant(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr && tr->is_quantized;
}

/* Decoded F32 (I32 for I32) expectation type of a copy into `type`. */
static loom_type exp_type(loom_type t) {
    return t == LOOM_TYPE_I32 ? LOOM_TYPE_I32 : LOOM_TYPE_F32;
}

OPS_CASE(dup_cont) {
    static const loom_type types[] = {LOOM_TYPE_F32,  LOOM_TYPE_F16,  LOOM_TYPE_BF16,
                                      LOOM_TYPE_I32,  LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0,
                                      LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K, LOOM_TYPE_MXFP4};
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++)
        for (int l = 0; l < OPS_LAYOUT_COUNT; l++)
            for (int op = 0; op < 3; op++) { /* dup, cont, cont_4d */
                loom_type type = types[t];
                if (!ops_layout_ok(type, (ops_layout)l)) continue;
                int64_t n = is_quant(type) ? 2 * (loom_blck_size(type) > 32 ? 256 : 32)
                                           : k_ne0[(l + t) % N_NE0];
                static const char *names[] = {"dup", "cont", "cont_4d"};
                ops_begin(e, "%s %s n=%lld %s", names[op], loom_type_name(type), (long long)n,
                          ops_layout_name((ops_layout)l));
                loom_tensor *a = ops_src(e, type, n, 3, 2, 2, (ops_layout)l);
                if (type == LOOM_TYPE_I32) ops_fill(e, a, -100000, 100000);
                loom_ctx *ctx = ops_ctx(e);
                loom_tensor *out;
                int64_t ne[4] = {n, 3, 2, 2};
                if (op == 0) {
                    out = loom_dup(ctx, a);
                } else if (op == 1) {
                    out = loom_cont(ctx, a);
                } else {
                    /* a new shape with the same element count: [n, 2, 3, 2] rows kept
                     * (quantised rows cannot be re-cut), [n*3, 4, 1, 1] otherwise */
                    if (is_quant(type)) {
                        ne[1] = 2;
                        ne[2] = 3;
                    } else {
                        ne[0] = n * 3;
                        ne[1] = 4;
                        ne[2] = 1;
                        ne[3] = 1;
                    }
                    out = loom_cont_4d(ctx, a, ne[0], ne[1], ne[2], ne[3]);
                }
                if (ops_compute(e, out)) {
                    LOOM_CHECK(loom_is_contiguous(out));
                    ref_tensor ra = ops_ref(e, a);
                    ref_tensor exp = ops_expect(e, exp_type(type), ne[0], ne[1], ne[2], ne[3]);
                    ref_copy(&ra, &exp);
                    ops_check_as(e, out, type, &exp, (ops_tol){0}); /* a copy is exact */
                }
                ops_end(e);
            }
}

typedef struct cpy_pair {
    loom_type src, dst;
} cpy_pair;

/* Every conversion docs/ops.md lists for CPY. */
static const cpy_pair k_cpy_pairs[] = {
    {LOOM_TYPE_F32, LOOM_TYPE_F32},
    {LOOM_TYPE_F32, LOOM_TYPE_F16},
    {LOOM_TYPE_F32, LOOM_TYPE_BF16},
    {LOOM_TYPE_F16, LOOM_TYPE_F32},
    {LOOM_TYPE_BF16, LOOM_TYPE_F32},
    {LOOM_TYPE_F32, LOOM_TYPE_Q8_0},
    {LOOM_TYPE_F32, LOOM_TYPE_Q4_0},
    {LOOM_TYPE_Q8_0, LOOM_TYPE_F32},
    {LOOM_TYPE_Q4_0, LOOM_TYPE_F32},
    {LOOM_TYPE_I32, LOOM_TYPE_I32},
    /* the quantised KV-cache types, and decoding of the other block types */
    {LOOM_TYPE_F32, LOOM_TYPE_Q4_1},
    {LOOM_TYPE_F32, LOOM_TYPE_Q5_0},
    {LOOM_TYPE_F32, LOOM_TYPE_Q5_1},
    {LOOM_TYPE_F32, LOOM_TYPE_IQ4_NL},
    {LOOM_TYPE_Q5_1, LOOM_TYPE_F32},
    {LOOM_TYPE_Q3_K, LOOM_TYPE_F32},
    {LOOM_TYPE_IQ4_XS, LOOM_TYPE_F32},
    /* same-type copies: raw bytes, whole blocks */
    {LOOM_TYPE_F16, LOOM_TYPE_F16},
    {LOOM_TYPE_BF16, LOOM_TYPE_BF16},
    {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0},
    {LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_0},
};

/* Per-element conversion tolerance for an expectation of dst's shape (rows of dst). */
static double *cpy_tol(ops_env *e, const ref_tensor *exp, loom_type dst_type) {
    int64_t n = ref_nelements(exp), n0 = exp->ne[0];
    double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
    double *row = ops_scratch(e, sizeof(double) * (size_t)n0);
    for (int64_t r = 0; r < n / n0; r++) {
        for (int64_t i = 0; i < n0; i++) {
            int64_t idx[4];
            ref_unravel(exp->ne, r * n0 + i, idx);
            row[i] = ref_get(exp, idx[0], idx[1], idx[2], idx[3]);
        }
        ref_convert_tol(dst_type, row, n0, tol + r * n0);
    }
    return tol;
}

OPS_CASE(cpy) {
    int v = 0;
    for (size_t p = 0; p < sizeof k_cpy_pairs / sizeof k_cpy_pairs[0]; p++)
        for (int variant = 0; variant < 3; variant++, v++) {
            cpy_pair pr = k_cpy_pairs[p];
            bool q = is_quant(pr.src) || is_quant(pr.dst);
            /* a [a0, 3, 2, 2] copied into b of another shape with as many elements; the
             * quantised side needs rows that are multiples of 32 */
            const bool superblk = (is_quant(pr.src) && loom_blck_size(pr.src) > 32) ||
                                  (is_quant(pr.dst) && loom_blck_size(pr.dst) > 32);
            int64_t a0 = superblk ? 256 : q ? 64 : (variant == 0 ? 7 : 33);
            int64_t na = a0 * 12;
            int64_t b0 = is_quant(pr.dst) ? (variant == 1 ? 32 : 96) : (variant == 0 ? na : 12);
            if (is_quant(pr.src) && !is_quant(pr.dst)) b0 = variant == 2 ? 3 : 48;
            int64_t b1 = na / b0;
            ops_layout la = variant == 0       ? OPS_CONTIG
                            : is_quant(pr.src) ? OPS_PADDED
                                               : (variant == 1 ? OPS_TRANSPOSED : OPS_SCRAMBLED);
            ops_layout lb = variant == 2 ? OPS_PADDED : OPS_CONTIG;
            ops_begin(e, "cpy %s -> %s a[%lld,3,2,2] %s -> b[%lld,%lld] %s", loom_type_name(pr.src),
                      loom_type_name(pr.dst), (long long)a0, ops_layout_name(la), (long long)b0,
                      (long long)b1, ops_layout_name(lb));
            loom_tensor *a = ops_src(e, pr.src, a0, 3, 2, 2, la);
            loom_tensor *b = ops_src(e, pr.dst, b0, b1, 1, 1, lb);
            if (pr.src == LOOM_TYPE_I32) ops_fill(e, a, -1000000, 1000000);
            if (pr.src == LOOM_TYPE_F32 && variant == 1 && a) {
                /* magnitudes that stress F16/BF16 rounding: subnormal F16, near the F16
                 * maximum, thirds */
                ops_set(e, a, 0, 0, 0, 0, 1e-6);
                ops_set(e, a, 1, 0, 0, 0, -3.1e-5);
                ops_set(e, a, 2, 0, 0, 0, 1.0 / 3.0);
                ops_set(e, a, 0, 1, 0, 0, pr.dst == LOOM_TYPE_BF16 ? 1e30 : 65000.0);
                ops_set(e, a, 0, 2, 1, 1, -2.0 / 3.0);
            }
            loom_tensor *out = loom_cpy(ops_ctx(e), a, b);
            if (ops_compute(e, out)) {
                /* the result is a view of b: it writes b's storage */
                const loom_tensor *ro = out, *rb = b;
                while (ro->view_src)
                    ro = ro->view_src;
                while (rb->view_src)
                    rb = rb->view_src;
                LOOM_CHECK(ro == rb);
                ref_tensor ra = ops_ref(e, a);
                ref_tensor exp = ops_expect(e, exp_type(pr.dst), b0, b1, 1, 1);
                ref_copy(&ra, &exp);
                double *tol = cpy_tol(e, &exp, pr.dst);
                ops_check_as(e, out, pr.dst, &exp, (ops_tol){.elem = tol});
            }
            ops_end(e);
        }
}

OPS_CASE(cast) {
    static const cpy_pair pairs[] = {{LOOM_TYPE_F32, LOOM_TYPE_F16},
                                     {LOOM_TYPE_F16, LOOM_TYPE_F32},
                                     {LOOM_TYPE_F32, LOOM_TYPE_BF16},
                                     {LOOM_TYPE_F32, LOOM_TYPE_Q8_0}};
    for (int p = 0; p < 4; p++) {
        int64_t n = is_quant(pairs[p].dst) ? 64 : 67;
        ops_layout l = is_quant(pairs[p].dst) ? OPS_PERM12 : OPS_TRANSPOSED;
        ops_begin(e, "cast %s -> %s n=%lld %s", loom_type_name(pairs[p].src),
                  loom_type_name(pairs[p].dst), (long long)n, ops_layout_name(l));
        loom_tensor *a = ops_src(e, pairs[p].src, n, 5, 2, 1, l);
        loom_tensor *out = loom_cast(ops_ctx(e), a, pairs[p].dst);
        if (ops_compute(e, out)) {
            ref_tensor ra = ops_ref(e, a);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, n, 5, 2, 1);
            ref_copy(&ra, &exp);
            ops_check_as(e, out, pairs[p].dst, &exp,
                         (ops_tol){.elem = cpy_tol(e, &exp, pairs[p].dst)});
        }
        ops_end(e);
    }
}

OPS_CASE(concat) {
    int v = 0;
    for (int t = 0; t < 2; t++)
        for (int dim = 0; dim < 4; dim++)
            for (int i = 0; i < 2; i++, v++) {
                loom_type type = t ? LOOM_TYPE_I32 : LOOM_TYPE_F32;
                int64_t ne[4] = {i ? 33 : 7, 3, 2, 2};
                int64_t nb_[4] = {ne[0], ne[1], ne[2], ne[3]};
                nb_[dim] = dim == 0 ? 5 : 1 + i; /* b differs only along dim */
                ops_layout la = (ops_layout)(v % OPS_LAYOUT_COUNT);
                ops_layout lb = (ops_layout)((v + 3) % OPS_LAYOUT_COUNT);
                ops_begin(e, "concat %s dim %d a[%lld,3,2,2] %s b %s", loom_type_name(type), dim,
                          (long long)ne[0], ops_layout_name(la), ops_layout_name(lb));
                loom_tensor *a = ops_src(e, type, ne[0], ne[1], ne[2], ne[3], la);
                loom_tensor *b = ops_src(e, type, nb_[0], nb_[1], nb_[2], nb_[3], lb);
                if (t) {
                    ops_fill(e, a, -1000, 1000);
                    ops_fill(e, b, -1000, 1000);
                }
                loom_tensor *out = loom_concat(ops_ctx(e), a, b, dim);
                if (ops_compute(e, out)) {
                    LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), dim);
                    int64_t no[4] = {ne[0], ne[1], ne[2], ne[3]};
                    no[dim] += nb_[dim];
                    ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
                    ref_tensor exp = ops_expect(e, type, no[0], no[1], no[2], no[3]);
                    ref_concat(&ra, &rb, dim, &exp);
                    ops_check(e, out, &exp, (ops_tol){0});
                }
                ops_end(e);
            }
}

/* ---------------------------------------------------------------- views of results */

/* RESHAPE / VIEW / PERMUTE / TRANSPOSE of a computed tensor (not of a leaf), consumed by
 * later ops, with three outputs in one graph: the backend must place views of
 * intermediates and read them through their strides. */
OPS_CASE(views_of_results) {
    for (int i = 0; i < 2; i++) {
        int64_t n0 = i ? 33 : 7, n1 = 6, n2 = 4;
        ops_begin(e, "views of add [%lld,6,4]", (long long)n0);
        loom_ctx *ctx = ops_ctx(e);
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, n0, n1, n2, 1, i ? OPS_PADDED : OPS_CONTIG);
        loom_tensor *b = ops_src(e, LOOM_TYPE_F32, n0, n1, n2, 1, OPS_CONTIG);
        loom_tensor *x = loom_add(ctx, a, b);
        /* axis 0 -> 2, 1 -> 0, 2 -> 1: [n1, n2, n0] */
        loom_tensor *o1 = loom_cont(ctx, loom_permute(ctx, x, 2, 0, 1, 3));
        /* the same elements as one long row per (i2): [n0*n1, n2], squared */
        loom_tensor *r = loom_reshape_2d(ctx, x, n0 * n1, n2);
        loom_tensor *o2 = loom_mul(ctx, r, r);
        /* columns 1..n0-1 of every row of x, as [n0-1, n1*n2] rows of stride nb1 */
        loom_tensor *w = x ? loom_view_2d(ctx, x, n0 - 1, n1 * n2, x->nb[1], x->nb[0]) : NULL;
        loom_tensor *o3 = loom_scale(ctx, w, 2.0f);
        ops_output(e, o1);
        ops_output(e, o2);
        if (ops_compute(e, o3)) {
            ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
            ref_tensor rx = ops_expect(e, LOOM_TYPE_F32, n0, n1, n2, 1);
            ref_binary(REF_ADD, &ra, &rb, &rx);
            /* o1: x read through the permuted descriptor */
            ref_tensor px = rx;
            const int axes[4] = {2, 0, 1, 3};
            for (int d = 0; d < 4; d++) {
                px.ne[axes[d]] = rx.ne[d];
                px.nb[axes[d]] = rx.nb[d];
            }
            ref_tensor e1 = ops_expect(e, LOOM_TYPE_F32, n1, n2, n0, 1);
            ref_copy(&px, &e1);
            ops_check(e, o1, &e1, (ops_tol){.rtol = 1e-5});
            /* o2: squares in the same order */
            ref_tensor rr = ops_expect(e, LOOM_TYPE_F32, n0 * n1, n2, 1, 1);
            ref_copy(&rx, &rr);
            ref_tensor e2 = ops_expect(e, LOOM_TYPE_F32, n0 * n1, n2, 1, 1);
            ref_sqr(&rr, &e2);
            ops_check(e, o2, &e2, (ops_tol){.rtol = 1e-5});
            /* o3: 2 * x[1 + i0, r % n1, r / n1] */
            ref_tensor e3 = ops_expect(e, LOOM_TYPE_F32, n0 - 1, n1 * n2, 1, 1);
            for (int64_t row = 0; row < n1 * n2; row++)
                for (int64_t c = 0; c < n0 - 1; c++)
                    ref_set(&e3, c, row, 0, 0, 2 * ref_get(&rx, c + 1, row % n1, row / n1, 0));
            ops_check(e, o3, &e3, (ops_tol){.rtol = 1e-5});
        }
        ops_end(e);
    }
}

/* A mul_mat whose activations are the transpose of a computed tensor. */
OPS_CASE(mul_mat_of_transposed_result) {
    for (int i = 0; i < 2; i++) {
        int64_t K = i ? 67 : 7, M = 5, N = i ? 9 : 1;
        ops_begin(e, "mul_mat(a, transpose(scale(c))) K=%lld N=%lld", (long long)K, (long long)N);
        loom_ctx *ctx = ops_ctx(e);
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, K, M, 1, 1, OPS_CONTIG);
        loom_tensor *c = ops_src(e, LOOM_TYPE_F32, N, K, 1, 1, OPS_CONTIG);
        loom_tensor *out = loom_mul_mat(ctx, a, loom_transpose(ctx, loom_scale(ctx, c, 0.5f)));
        if (ops_compute(e, out)) {
            ref_tensor ra = ops_ref(e, a), rc = ops_ref(e, c);
            ref_tensor sc = ops_expect(e, LOOM_TYPE_F32, N, K, 1, 1);
            ref_scale(&rc, 0.5, 0, &sc);
            ref_tensor bt = sc; /* transposed descriptor of the scaled tensor */
            bt.ne[0] = sc.ne[1];
            bt.ne[1] = sc.ne[0];
            bt.nb[0] = sc.nb[1];
            bt.nb[1] = sc.nb[0];
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, M, N, 1, 1);
            double *sabs = ops_scratch(e, sizeof(double) * (size_t)(M * N));
            ref_mul_mat(&ra, &bt, &exp, sabs, NULL);
            double *tol = ops_scratch(e, sizeof(double) * (size_t)(M * N));
            for (int64_t k = 0; k < M * N; k++)
                tol[k] = 2 * (double)(K + 3) * REF_U * sabs[k];
            ops_check(e, out, &exp, (ops_tol){.elem = tol});
        }
        ops_end(e);
    }
}
