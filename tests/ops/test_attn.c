/*
 * Ops cases, attention family: SOFT_MAX (plain; scale; F32/F16 masks with -INF entries,
 * taller than the input and broadcast over dims 2/3; ALiBi; sinks), ROPE (normal and neox,
 * n_dims < head_dim, freq_factors, freq_scale, non-contiguous input) and FLASH_ATTN_EXT
 * (GQA, F16/BF16/Q8_0/Q4_0 K/V, mask, sliding window, sinks, softcap, ALiBi, a fully masked
 * row, Dv != D).
 *
 * Tolerances are derived per element from float error propagation (see each case).
 */
#include <math.h>

#include "tests/ops/harness.h"

/* ---------------------------------------------------------------- soft_max */

typedef struct sm_variant {
    int64_t ne0, ne1, ne2, ne3;
    int mask;                  /* 0 none, 1 F32, 2 F16 */
    int64_t M2, M3, mask_rows; /* mask [ne0, mask_rows >= ne1, M2, M3] */
    bool sinks;
    float scale, max_bias;
} sm_variant;

static const sm_variant k_sm_variants[] = {
    {1, 3, 2, 1, 0, 1, 1, 0, false, 1.0f, 0.0f},     {7, 3, 2, 2, 0, 1, 1, 0, false, 0.7f, 0.0f},
    {33, 4, 3, 1, 1, 1, 1, 7, false, 0.125f, 0.0f},  /* F32 mask, padded rows */
    {67, 5, 2, 2, 2, 2, 1, 5, false, 1.0f, 0.0f},    /* F16 mask per head */
    {130, 3, 5, 1, 1, 1, 1, 4, false, 0.5f, 8.0f},   /* ALiBi, 5 heads (m1 branch) */
    {33, 4, 3, 2, 2, 3, 2, 4, true, 0.3f, 0.0f},     /* sinks, mask over dims 2 and 3 */
    {7, 2, 8, 1, 1, 1, 1, 2, true, 1.0f, 4.0f},      /* sinks + ALiBi, 8 heads */
    {67, 6, 2, 1, 0, 1, 1, 0, true, 1.5f, 0.0f},     /* sinks without mask */
    {1031, 2, 3, 1, 2, 3, 1, 2, false, 0.09f, 0.0f}, /* a long row, F16 mask */
};

OPS_CASE(soft_max) {
    int nv = (int)(sizeof k_sm_variants / sizeof k_sm_variants[0]);
    for (int iv = 0; iv < nv; iv++) {
        sm_variant s = k_sm_variants[iv];
        ops_layout la = (ops_layout)(iv % OPS_LAYOUT_COUNT);
        ops_begin(e,
                  "soft_max [%lld,%lld,%lld,%lld] %s mask=%s[%lld,%lld,%lld] sinks=%d "
                  "scale=%g max_bias=%g",
                  (long long)s.ne0, (long long)s.ne1, (long long)s.ne2, (long long)s.ne3,
                  ops_layout_name(la),
                  s.mask == 0   ? "none"
                  : s.mask == 1 ? "f32"
                                : "f16",
                  (long long)s.mask_rows, (long long)s.M2, (long long)s.M3, s.sinks, s.scale,
                  s.max_bias);
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, s.ne0, s.ne1, s.ne2, s.ne3, la);
        ops_fill(e, a, -4, 4);
        loom_tensor *mask = NULL, *sinks = NULL;
        if (s.mask) {
            loom_type mt = s.mask == 1 ? LOOM_TYPE_F32 : LOOM_TYPE_F16;
            mask = ops_src(e, mt, s.ne0, s.mask_rows, s.M2, s.M3, iv % 2 ? OPS_PADDED : OPS_CONTIG);
            ops_fill(e, mask, -2, 1);
            /* about a quarter -INF, never a whole row (a fully masked row without a sink
             * is 0/0, which the docs leave undefined) */
            for (int64_t i3 = 0; mask && i3 < s.M3; i3++)
                for (int64_t i2 = 0; i2 < s.M2; i2++)
                    for (int64_t i1 = 0; i1 < s.mask_rows; i1++)
                        for (int64_t i0 = 1; i0 < s.ne0; i0++)
                            if (ops_randi(e, 0, 4) == 0)
                                ops_set(e, mask, i0, i1, i2, i3, -INFINITY);
            /* with sinks, one fully masked row: every output 0 */
            if (s.sinks)
                for (int64_t i0 = 0; i0 < s.ne0; i0++)
                    ops_set(e, mask, i0, 1, 0, 0, -INFINITY);
        }
        if (s.sinks) {
            sinks = ops_src(e, LOOM_TYPE_F32, s.ne2, 1, 1, 1, OPS_CONTIG);
            ops_fill(e, sinks, -2, 3);
        }
        loom_tensor *out = (s.mask || s.sinks || s.scale != 1.0f || s.max_bias != 0)
                               ? loom_soft_max_ext(ops_ctx(e), a, mask, sinks, s.scale, s.max_bias)
                               : loom_soft_max(ops_ctx(e), a);
        if (ops_compute(e, out)) {
            LOOM_CHECK(loom_get_op_params_f32(out, 0) == s.scale);
            LOOM_CHECK(loom_get_op_params_f32(out, 1) == s.max_bias);
            ref_tensor ra = ops_ref(e, a), rm, rs;
            if (mask) rm = ops_ref(e, mask);
            if (sinks) rs = ops_ref(e, sinks);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, s.ne0, s.ne1, s.ne2, s.ne3);
            int64_t rows = s.ne1 * s.ne2 * s.ne3, n = rows * s.ne0;
            double *zmax = ops_scratch(e, sizeof(double) * (size_t)rows);
            ref_soft_max(&ra, mask ? &rm : NULL, sinks ? &rs : NULL, s.scale, s.max_bias, &exp,
                         zmax);
            /* z = a*scale + slope*mask in float: ~3u |z|; exp (a few ulps) turns that into
             * relative error; the sum of ne0 + 1 terms adds (ne0 + 1) u; the division u */
            double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
            for (int64_t k = 0; k < n; k++) {
                int64_t idx[4];
                ref_unravel(exp.ne, k, idx);
                double p = ref_get(&exp, idx[0], idx[1], idx[2], idx[3]);
                tol[k] = (8 * zmax[k / s.ne0] + (double)s.ne0 + 32) * REF_U * p + 1e-9;
            }
            ops_check(e, out, &exp, (ops_tol){.elem = tol});
        }
        ops_end(e);
    }
}

/* ---------------------------------------------------------------- rope */

typedef struct rope_variant {
    int64_t D, H, T;
    int n_dims, mode;
    bool ff;
    float freq_base, freq_scale;
} rope_variant;

static const rope_variant k_rope_variants[] = {
    {64, 3, 5, 64, LOOM_ROPE_TYPE_NORMAL, false, 10000.0f, 1.0f},
    {64, 3, 5, 64, LOOM_ROPE_TYPE_NEOX, false, 10000.0f, 1.0f},
    {40, 2, 7, 24, LOOM_ROPE_TYPE_NORMAL, false, 10000.0f, 0.25f}, /* n_dims < head_dim */
    {40, 2, 7, 24, LOOM_ROPE_TYPE_NEOX, true, 500000.0f, 1.0f},
    {128, 4, 3, 96, LOOM_ROPE_TYPE_NEOX, true, 10000.0f, 0.5f},
    {8, 5, 9, 8, LOOM_ROPE_TYPE_NORMAL, true, 100.0f, 1.0f},
    {10, 1, 4, 2, LOOM_ROPE_TYPE_NEOX, false, 10000.0f, 1.0f}, /* one pair */
};

OPS_CASE(rope) {
    int nv = (int)(sizeof k_rope_variants / sizeof k_rope_variants[0]);
    for (int iv = 0; iv < nv; iv++) {
        rope_variant r = k_rope_variants[iv];
        ops_layout la = iv % 3 == 0 ? OPS_CONTIG : iv % 3 == 1 ? OPS_PERM12 : OPS_PADDED;
        ops_begin(e, "rope %s D=%lld H=%lld T=%lld n_dims=%d ff=%d base=%g scale=%g a %s",
                  r.mode == LOOM_ROPE_TYPE_NEOX ? "neox" : "normal", (long long)r.D, (long long)r.H,
                  (long long)r.T, r.n_dims, r.ff, r.freq_base, r.freq_scale, ops_layout_name(la));
        loom_tensor *a = ops_src(e, LOOM_TYPE_F32, r.D, r.H, r.T, 1, la);
        loom_tensor *pos = ops_src(e, LOOM_TYPE_I32, r.T, 1, 1, 1, OPS_CONTIG);
        ops_fill(e, pos, 0, 48);
        loom_tensor *ff = NULL;
        if (r.ff) {
            ff = ops_src(e, LOOM_TYPE_F32, r.n_dims / 2, 1, 1, 1, OPS_CONTIG);
            ops_fill(e, ff, 0.5, 2);
        }
        loom_tensor *out =
            loom_rope_ext(ops_ctx(e), a, pos, ff, r.n_dims, r.mode, r.freq_base, r.freq_scale);
        if (ops_compute(e, out)) {
            LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 0), r.n_dims);
            LOOM_CHECK_EQ_INT(loom_get_op_params_i32(out, 1), r.mode);
            LOOM_CHECK(loom_get_op_params_f32(out, 2) == r.freq_base);
            LOOM_CHECK(loom_get_op_params_f32(out, 3) == r.freq_scale);
            ref_tensor ra = ops_ref(e, a), rp = ops_ref(e, pos), rf;
            if (ff) rf = ops_ref(e, ff);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, r.D, r.H, r.T, 1);
            ref_rope(&ra, &rp, ff ? &rf : NULL, r.n_dims, r.mode, r.freq_base, r.freq_scale, &exp);
            /* Per pair i, theta_i may be computed in float by i repeated products
             * (relative error ~ (i + 4) u, so absolute theta_i (i + 4) u); the rotation
             * moves each output by |x0| + |x1| times that angle error, plus a few u for
             * sin/cos and the products. Dims >= n_dims are copies (tolerance 0). */
            int64_t n = r.D * r.H * r.T;
            double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
            for (int64_t t = 0; t < r.T; t++) {
                double p = ref_get(&rp, t, 0, 0, 0);
                for (int64_t h = 0; h < r.H; h++)
                    for (int i = 0; i < r.n_dims / 2; i++) {
                        double f = ff ? ref_get(&rf, i, 0, 0, 0) : 1.0;
                        double theta =
                            fabs(p) * r.freq_scale * pow(r.freq_base, -2.0 * i / r.n_dims) / f;
                        int64_t j0 = r.mode == LOOM_ROPE_TYPE_NEOX ? i : 2 * i;
                        int64_t j1 = r.mode == LOOM_ROPE_TYPE_NEOX ? i + r.n_dims / 2 : 2 * i + 1;
                        double mag =
                            fabs(ref_get(&ra, j0, h, t, 0)) + fabs(ref_get(&ra, j1, h, t, 0));
                        double tl = mag * (2 * theta * (i + 4) * REF_U + 8 * REF_U) + 1e-7;
                        tol[j0 + r.D * (h + r.H * t)] = tl;
                        tol[j1 + r.D * (h + r.H * t)] = tl;
                    }
            }
            ops_check(e, out, &exp, (ops_tol){.elem = tol});
        }
        ops_end(e);
    }
}

/* ---------------------------------------------------------------- flash_attn_ext */

typedef struct fa_variant {
    int64_t D, Dv, Nq, Nkv, H, Hk, S;
    loom_type tk, tv;
    int mask; /* 0 none, 1 F32, 2 F16 */
    bool sinks;
    bool masked_row; /* one query row entirely -INF */
    float max_bias, softcap;
    int64_t window; /* > 0: query j also masks keys more than window - 1 before its own */
} fa_variant;

static const fa_variant k_fa_variants[] = {
    /* decode step: one query, GQA 4:2, F16 K/V and mask */
    {64, 64, 1, 33, 4, 2, 1, LOOM_TYPE_F16, LOOM_TYPE_F16, 2, false, false, 0.0f, 0.0f, 0},
    /* prompt: Dv != D, GQA 6:2, two sequences, causal F32 mask with a fully masked row */
    {40, 24, 7, 67, 6, 2, 2, LOOM_TYPE_F32, LOOM_TYPE_F32, 1, false, true, 0.0f, 0.0f, 0},
    /* odd head size, MQA 2:1, mixed K F16 / V F32, sinks (fully masked row -> 0), softcap */
    {33, 33, 5, 20, 2, 1, 1, LOOM_TYPE_F16, LOOM_TYPE_F32, 1, true, true, 0.0f, 20.0f, 0},
    /* ALiBi over 5 heads, long KV */
    {16, 16, 4, 130, 5, 5, 1, LOOM_TYPE_F32, LOOM_TYPE_F32, 1, false, false, 8.0f, 0.0f, 0},
    /* no mask, softcap, three sequences, K F32 / V F16 */
    {64, 32, 3, 7, 8, 8, 3, LOOM_TYPE_F32, LOOM_TYPE_F16, 0, true, false, 0.0f, 30.0f, 0},
    /* F16 mask with sinks and ALiBi, GQA 8:2 */
    {32, 32, 2, 9, 8, 2, 1, LOOM_TYPE_F16, LOOM_TYPE_F16, 2, true, false, 4.0f, 0.0f, 0},
    /* GQA 16:2 decode-like block of 3 queries: 24 rows per KV head (two row blocks), three
     * key tiles (the last partial), F16 mask with a fully masked row */
    {64, 64, 3, 150, 16, 2, 1, LOOM_TYPE_F16, LOOM_TYPE_F16, 2, false, true, 0.0f, 0.0f, 0},
    /* a long F16 cache: head size 128, 257 positions */
    {128, 128, 3, 257, 4, 1, 1, LOOM_TYPE_F16, LOOM_TYPE_F16, 2, false, false, 0.0f, 0.0f, 0},
    /* quantised caches (read in tiles through the SIMD table): decode over a Q8_0 cache,
     * GQA 6:2 (3 rows per KV head: a pair and a single row), 200 positions (a partial last
     * tile and 16-key group) */
    {64, 64, 1, 200, 6, 2, 1, LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0, 2, false, false, 0.0f, 0.0f, 0},
    /* Q4_0 K, BF16 V, Dv != D, sinks */
    {32, 64, 2, 100, 4, 4, 1, LOOM_TYPE_Q4_0, LOOM_TYPE_BF16, 1, true, false, 0.0f, 0.0f, 0},
    /* sliding window of 70: the first tile unused by every row, the second used from key 15
     * on; BF16 K of an odd head size, Q4_0 V of 96 (a partial 64-column block) */
    {48, 96, 2, 150, 6, 3, 1, LOOM_TYPE_BF16, LOOM_TYPE_Q4_0, 2, false, false, 0.0f, 0.0f, 70},
    /* softcap over a Q8_0 K, F16 V, head size 128, 9 rows per KV head, a fully masked row */
    {128, 128, 3, 90, 6, 2, 1, LOOM_TYPE_Q8_0, LOOM_TYPE_F16, 1, false, true, 0.0f, 25.0f, 0},
};

OPS_CASE(flash_attn_ext) {
    int nv = (int)(sizeof k_fa_variants / sizeof k_fa_variants[0]);
    for (int iv = 0; iv < nv; iv++) {
        fa_variant f = k_fa_variants[iv];
        float scale = (float)(1.0 / sqrt((double)f.D));
        int64_t mrows = f.Nq + 3; /* the mask may be taller than Nq */
        ops_layout lq = iv % 2 ? OPS_PERM12 : OPS_CONTIG;
        ops_layout lk = iv % 3 == 1 ? OPS_PERM12 : iv % 3 == 2 ? OPS_PADDED : OPS_CONTIG;
        ops_layout lv = iv % 3 == 0 ? OPS_PADDED : iv % 3 == 1 ? OPS_CONTIG : OPS_PERM12;
        ops_begin(e,
                  "flash_attn_ext D=%lld Dv=%lld Nq=%lld Nkv=%lld H=%lld Hk=%lld S=%lld k=%s "
                  "v=%s mask=%d sinks=%d masked_row=%d max_bias=%g softcap=%g q %s k %s v %s",
                  (long long)f.D, (long long)f.Dv, (long long)f.Nq, (long long)f.Nkv,
                  (long long)f.H, (long long)f.Hk, (long long)f.S, loom_type_name(f.tk),
                  loom_type_name(f.tv), f.mask, f.sinks, f.masked_row, f.max_bias, f.softcap,
                  ops_layout_name(lq), ops_layout_name(lk), ops_layout_name(lv));
        loom_tensor *q = ops_src(e, LOOM_TYPE_F32, f.D, f.Nq, f.H, f.S, lq);
        loom_tensor *k = ops_src(e, f.tk, f.D, f.Nkv, f.Hk, f.S, lk);
        loom_tensor *v = ops_src(e, f.tv, f.Dv, f.Nkv, f.Hk, f.S, lv);
        ops_fill(e, q, -2, 2);
        loom_tensor *mask = NULL, *sinks = NULL;
        if (f.mask) {
            mask = ops_src(e, f.mask == 1 ? LOOM_TYPE_F32 : LOOM_TYPE_F16, f.Nkv, mrows, 1, 1,
                           OPS_CONTIG);
            ops_fill(e, mask, -1, 0.5);
            /* causal-style: query j sees keys up to Nkv - Nq + j */
            for (int64_t j = 0; mask && j < f.Nq; j++) {
                for (int64_t i = f.Nkv - f.Nq + j + 1; i < f.Nkv; i++)
                    ops_set(e, mask, i, j, 0, 0, -INFINITY);
                for (int64_t i = 0; f.window > 0 && i <= f.Nkv - f.Nq + j - f.window; i++)
                    ops_set(e, mask, i, j, 0, 0, -INFINITY);
            }
            if (f.masked_row)
                for (int64_t i = 0; i < f.Nkv; i++)
                    ops_set(e, mask, i, f.Nq / 2, 0, 0, -INFINITY);
        }
        if (f.sinks) {
            sinks = ops_src(e, LOOM_TYPE_F32, f.H, 1, 1, 1, OPS_CONTIG);
            ops_fill(e, sinks, -1, 2);
        }
        loom_tensor *out =
            loom_flash_attn_ext(ops_ctx(e), q, k, v, mask, sinks, scale, f.max_bias, f.softcap);
        if (ops_compute(e, out)) {
            LOOM_CHECK(loom_get_op_params_f32(out, 0) == scale);
            LOOM_CHECK(loom_get_op_params_f32(out, 1) == f.max_bias);
            LOOM_CHECK(loom_get_op_params_f32(out, 2) == f.softcap);
            ref_tensor rq = ops_ref(e, q), rk = ops_ref(e, k), rv = ops_ref(e, v), rm, rs;
            if (mask) rm = ops_ref(e, mask);
            if (sinks) rs = ops_ref(e, sinks);
            ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, f.Dv, f.H, f.Nq, f.S);
            int64_t nrow = f.H * f.Nq * f.S, n = nrow * f.Dv;
            double *zabs = ops_scratch(e, sizeof(double) * (size_t)nrow);
            ref_flash_attn_ext(&rq, &rk, &rv, mask ? &rm : NULL, sinks ? &rs : NULL, scale,
                               f.max_bias, f.softcap, &exp, zabs);
            /* The output is a convex combination of V rows, so its error is max|v| times
             * the relative error of the weights plus that of the accumulation. A logit
             * error dz changes the weights by at most 2 dz (relative). dz: float dot of D
             * terms, 2 (D + 2) u of scale sum|q k|; accumulating Nkv weighted rows and
             * normalising, (Nkv + 16) 2u. F16 K/V values are exact in the reference, so
             * they get no extra allowance: docs/ops.md defines the result on the F16
             * values, and a backend that rounds Q or its accumulator to F16 fails here. */
            double vmax = 0;
            for (int64_t s = 0; s < f.S; s++)
                for (int64_t hk = 0; hk < f.Hk; hk++)
                    for (int64_t i = 0; i < f.Nkv; i++)
                        for (int64_t d = 0; d < f.Dv; d++)
                            vmax = fmax(vmax, fabs(ref_get(&rv, d, i, hk, s)));
            double *tol = ops_scratch(e, sizeof(double) * (size_t)n);
            for (int64_t r = 0; r < nrow; r++) {
                double dz = zabs[r] * 2 * (double)(f.D + 2) * REF_U;
                double acc = (double)(f.Nkv + 16) * 2 * REF_U;
                double t = vmax * (4 * dz + acc + 16 * REF_U) + 1e-7;
                for (int64_t d = 0; d < f.Dv; d++)
                    tol[r * f.Dv + d] = t;
            }
            ops_check(e, out, &exp, (ops_tol){.elem = tol});
        }
        ops_end(e);
    }
}
