/*
 * SIMD dispatch and the portable-C kernel table.
 *
 * The portable table is the plainest correct version of every hot loop: it is what
 * LOOM_CPU_SIMD=scalar runs and what the AVX2/AVX-512 tables are compared with. The
 * choice is made per call from what the processor supports (__builtin_cpu_supports),
 * capped by the environment variable LOOM_CPU_SIMD=scalar|avx2|avx512, so tests can switch
 * paths inside one process with setenv.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu-impl.h"

/* ---------------------------------------------------------------- dot products */

static void scalar_dot_f32(int64_t k, const float *a, const float *b, size_t ldb, int nb,
                           float *out) {
    for (int j = 0; j < nb; j++) {
        const float *y = b + j * ldb;
        float s = 0.0f;
        for (int64_t i = 0; i < k; i++)
            s += a[i] * y[i];
        out[j] = s;
    }
}

static void scalar_dot_f16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
                           float *out) {
    for (int j = 0; j < nb; j++) {
        const float *y = b + j * ldb;
        float s = 0.0f;
        for (int64_t i = 0; i < k; i++)
            s += loom__fp16_to_fp32(a[i]) * y[i];
        out[j] = s;
    }
}

static void scalar_dot_bf16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
                            float *out) {
    for (int j = 0; j < nb; j++) {
        const float *y = b + j * ldb;
        float s = 0.0f;
        for (int64_t i = 0; i < k; i++)
            s += loom__bf16_to_fp32(a[i]) * y[i];
        out[j] = s;
    }
}

static void scalar_dot_q8_0(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb,
                            int nb, float *out) {
    for (int j = 0; j < nb; j++) {
        void *row = (char *)b + j * ldb;
        const float *yd = loom__q8a_d(row);
        const int8_t *yq = loom__q8a_qs(row, nblk);
        float s = 0.0f;
        for (int64_t i = 0; i < nblk; i++) {
            int32_t acc = 0;
            for (int l = 0; l < LOOM_QK8_0; l++)
                acc += (int32_t)a[i].qs[l] * yq[32 * i + l];
            s += (float)acc * (loom__fp16_to_fp32(a[i].d) * yd[i]);
        }
        out[j] = s;
    }
}

static void scalar_dot_q4_0(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb,
                            int nb, float *out) {
    for (int j = 0; j < nb; j++) {
        void *row = (char *)b + j * ldb;
        const float *yd = loom__q8a_d(row);
        const int8_t *yq = loom__q8a_qs(row, nblk);
        float s = 0.0f;
        for (int64_t i = 0; i < nblk; i++) {
            int32_t acc = 0;
            for (int l = 0; l < LOOM_QK4_0 / 2; l++) {
                int lo = (a[i].qs[l] & 0x0f) - 8;
                int hi = (a[i].qs[l] >> 4) - 8;
                acc += lo * yq[32 * i + l] + hi * yq[32 * i + l + LOOM_QK4_0 / 2];
            }
            s += (float)acc * (loom__fp16_to_fp32(a[i].d) * yd[i]);
        }
        out[j] = s;
    }
}

static void scalar_quantize_q8a(const float *x, void *row, int64_t k) {
    const int64_t nblk = k / LOOM_QK8_0;
    float *yd = loom__q8a_d(row), *ys = loom__q8a_s(row, nblk);
    int8_t *yq = loom__q8a_qs(row, nblk);
    for (int64_t i = 0; i < nblk; i++) {
        const float *v = x + i * LOOM_QK8_0;
        if (loom__any_nonfinite(v, LOOM_QK8_0)) { /* NaN scale: every dot reading it is NaN */
            memset(yq + 32 * i, 0, 32);
            yd[i] = ys[i] = NAN;
            continue;
        }
        float amax = 0.0f;
        for (int l = 0; l < LOOM_QK8_0; l++)
            amax = fmaxf(amax, fabsf(v[l]));
        float d = amax / 127.0f;
        int32_t sum = 0;
        for (int l = 0; l < LOOM_QK8_0; l++) {
            /* nearest-even, as the SIMD paths (cvtps2dq) round */
            int q = d != 0.0f ? (int)lrintf(v[l] / d) : 0;
            q = q > 127 ? 127 : q < -128 ? -128 : q; /* saturated as the SIMD packs (d subnormal) */
            yq[32 * i + l] = (int8_t)q;
            sum += q;
        }
        yd[i] = d;
        ys[i] = d * (float)sum;
    }
}

/* ---------------------------------------------------------------- elementwise */

static void scalar_vec_add(int64_t n, float *z, const float *x, const float *y) {
    for (int64_t i = 0; i < n; i++)
        z[i] = x[i] + y[i];
}

static void scalar_vec_mul(int64_t n, float *z, const float *x, const float *y) {
    for (int64_t i = 0; i < n; i++)
        z[i] = x[i] * y[i];
}

static void scalar_vec_scale(int64_t n, float *y, const float *x, float s, float b) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s + b;
}

static void scalar_vec_silu(int64_t n, float *y, const float *x) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void scalar_vec_swiglu(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

static double scalar_vec_exp_sum(int64_t n, float *y, const float *x, float max) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(x[i] - max);
        y[i] = e;
        sum += e;
    }
    return sum;
}

static void scalar_vec_mad_f32(int64_t n, float *y, const float *x, float s) {
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i] * s;
}

static void scalar_dequant_q8_0(const loom_block_q8_0 *x, float *y, int64_t nblk) {
    loom__cpu_dequantize_row_q8_0(x, y, nblk * LOOM_QK8_0);
}

static void scalar_dequant_q4_0(const loom_block_q4_0 *x, float *y, int64_t nblk) {
    loom__cpu_dequantize_row_q4_0(x, y, nblk * LOOM_QK4_0);
}

static void scalar_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = loom__fp16_to_fp32(x[i]);
}

static void scalar_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = loom__fp32_to_fp16(x[i]);
}

/* ---------------------------------------------------------------- flash attention tiles */

static void scalar_fa_kq(int64_t D, const float *q, int nr, const float *k, size_t ldk, int nt,
                         float scale, const float *slope, float *z, size_t ldz, float *zmax,
                         bool *nan) {
    for (int r = 0; r < nr; r++) {
        float *zr = z + (size_t)r * ldz, mx = -INFINITY;
        for (int t = 0; t < nt; t++) {
            if (zr[t] == -INFINITY) continue;
            const float *kt = k + (size_t)t * ldk, *qr = q + (size_t)r * (size_t)D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++)
                s += qr[d] * kt[d];
            float zz = s * scale + slope[r] * zr[t];
            if (zz != zz) {
                nan[r] = true;
                zz = -INFINITY;
            }
            zr[t] = zz;
            mx = zz > mx ? zz : mx;
        }
        zmax[r] = mx;
    }
}

static void scalar_fa_pv(int64_t Dv, const float *w, const float *z, size_t ldz, int nr,
                         const float *v, size_t ldv, int nt, float *acc) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++)
            if (z[(size_t)r * ldz + t] != -INFINITY)
                scalar_vec_mad_f32(Dv, acc + (size_t)r * (size_t)Dv, v + (size_t)t * ldv,
                                   w[(size_t)r * ldz + t]);
}

static bool scalar_rows_to_f32(loom_type t, const void *x, size_t ldx, int nrows, int64_t n,
                               float *y, size_t ldy) {
    if (t != LOOM_TYPE_F32 && t != LOOM_TYPE_F16 && t != LOOM_TYPE_BF16 && t != LOOM_TYPE_Q8_0 &&
        t != LOOM_TYPE_Q4_0)
        return false;
    for (int r = 0; r < nrows; r++)
        loom__cpu_row_to_f32(t, (const char *)x + (size_t)r * ldx, loom_type_size(t), 0, n,
                             y + (size_t)r * ldy);
    return true;
}

const loom__cpu_simd loom__cpu_simd_scalar = {
    .name = "scalar",
    .dot_f32 = scalar_dot_f32,
    .dot_f16 = scalar_dot_f16,
    .dot_bf16 = scalar_dot_bf16,
    .dot_q8_0 = scalar_dot_q8_0,
    .dot_q4_0 = scalar_dot_q4_0,
    .quantize_q8a = scalar_quantize_q8a,
    .gemm_tile = NULL,
    .gemm_mr = 0,
    .gemm_nr = 0,
    .vec_add = scalar_vec_add,
    .vec_mul = scalar_vec_mul,
    .vec_scale = scalar_vec_scale,
    .vec_silu = scalar_vec_silu,
    .vec_swiglu = scalar_vec_swiglu,
    .vec_exp_sum = scalar_vec_exp_sum,
    .vec_mad_f32 = scalar_vec_mad_f32,
    .dequant_q8_0 = scalar_dequant_q8_0,
    .dequant_q4_0 = scalar_dequant_q4_0,
    .f16_to_f32 = scalar_f16_to_f32,
    .f32_to_f16 = scalar_f32_to_f16,
    .fa_kq = scalar_fa_kq,
    .fa_pv = scalar_fa_pv,
    .rows_to_f32 = scalar_rows_to_f32,
};

/* ---------------------------------------------------------------- dispatch */

bool loom__cpu_has_avx2(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool loom__cpu_has_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    /* The AVX-512 table also uses 256-bit VNNI and BW/VL byte ops for the Q8 dots. */
    return loom__cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

const loom__cpu_simd *loom__cpu_simd_get(void) {
    const char *cap = getenv("LOOM_CPU_SIMD");
    int level = 2; /* 0 scalar, 1 avx2, 2 avx512 */
    if (cap && cap[0]) {
        if (strcmp(cap, "scalar") == 0)
            level = 0;
        else if (strcmp(cap, "avx2") == 0)
            level = 1;
        else if (strcmp(cap, "avx512") != 0) {
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                LOOM_LOG_WARN("LOOM_CPU_SIMD='%s' is not one of scalar, avx2, avx512: the best "
                              "this CPU has is used",
                              cap);
        }
    }
#if defined(__x86_64__) && defined(__GNUC__)
    if (level >= 2 && loom__cpu_has_avx512()) return &loom__cpu_simd_avx512;
    if (level >= 1 && loom__cpu_has_avx2()) return &loom__cpu_simd_avx2;
#endif
    return &loom__cpu_simd_scalar;
}

const char *loom_cpu_simd_name(void) {
    return loom__cpu_simd_get()->name;
}
