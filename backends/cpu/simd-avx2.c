/*
 * AVX2 + FMA + F16C kernels: the table loom__cpu_simd_avx2.
 *
 * Compiled with target attributes so the rest of the library stays portable; chosen at
 * run time when the processor has AVX2, FMA and F16C but not the AVX-512 set (or when
 * LOOM_CPU_SIMD=avx2 caps the choice). Same results as the portable twins in simd.c up to
 * float summation order.
 */
#include "backends/cpu/cpu-impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T256 __attribute__((target("avx2,fma,f16c")))
#define I256 static inline __attribute__((always_inline)) T256

/* ---------------------------------------------------------------- helpers */

I256 float hsum256(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

I256 __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

I256 __m256 load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

I256 __m256 loadu_f32(const float *p) {
    return _mm256_loadu_ps(p);
}

/* exp(x), about 1 ulp (Cephes polynomial); 0 below -87.3 (and for -INF). */
I256 __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f);
    __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

I256 __m256 silu256(__m256 x) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* ---------------------------------------------------------------- float dot products */

#define DOT_BODY(LOAD, SCALAR)                                                                     \
    __m256 acc[4][2];                                                                              \
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                          \
        acc[j][0] = _mm256_setzero_ps();                                                           \
        acc[j][1] = _mm256_setzero_ps();                                                           \
    }                                                                                              \
    int64_t i = 0;                                                                                 \
    for (; i + 16 <= k; i += 16) {                                                                 \
        loom__cpu_prefetch_ahead(a + i, 16 * (int)sizeof *a);                                      \
        __m256 a0 = LOAD(a + i), a1 = LOAD(a + i + 8);                                             \
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {                                     \
            acc[j][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + j * ldb + i), acc[j][0]);          \
            acc[j][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b + j * ldb + i + 8), acc[j][1]);      \
        }                                                                                          \
    }                                                                                              \
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {                                         \
        float s = hsum256(_mm256_add_ps(acc[j][0], acc[j][1]));                                    \
        for (int64_t l = i; l < k; l++)                                                            \
            s += SCALAR(a[l]) * b[j * ldb + l];                                                    \
        out[j] = s;                                                                                \
    }

I256 float id_f32(float x) {
    return x;
}

I256 void dot_f32_n(int64_t k, const float *a, const float *b, size_t ldb, float *out,
                    const int NB){DOT_BODY(loadu_f32, id_f32)} I256
    void dot_f16_n(int64_t k, const uint16_t *a, const float *b, size_t ldb, float *out,
                   const int NB){DOT_BODY(load_f16, loom__fp16_to_fp32)} I256
    void dot_bf16_n(int64_t k, const uint16_t *a, const float *b, size_t ldb, float *out,
                    const int NB) {
    DOT_BODY(load_bf16, loom__bf16_to_fp32)
}

static T256 void dot1_f32(int64_t k, const float *a, const float *b, float *out) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        loom__cpu_prefetch_ahead(a + i, 32 * (int)sizeof *a);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < k; i++)
        s += a[i] * b[i];
    out[0] = s;
}

/* One F16 / BF16 row: four chains as dot1_f32. */
#define DOT1_BODY(LOAD, SCALAR)                                                                    \
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                    \
    int64_t i = 0;                                                                                 \
    for (; i + 32 <= k; i += 32) {                                                                 \
        loom__cpu_prefetch_ahead(a + i, 32 * (int)sizeof *a);                                      \
        s0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), s0);                             \
        s1 = _mm256_fmadd_ps(LOAD(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);                     \
        s2 = _mm256_fmadd_ps(LOAD(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);                   \
        s3 = _mm256_fmadd_ps(LOAD(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);                   \
    }                                                                                              \
    for (; i + 8 <= k; i += 8)                                                                     \
        s0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), s0);                             \
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));                \
    for (; i < k; i++)                                                                             \
        s += SCALAR(a[i]) * b[i];                                                                  \
    out[0] = s;

static T256 void dot1_f16(int64_t k, const uint16_t *a, const float *b, float *out) {
    DOT1_BODY(load_f16, loom__fp16_to_fp32)
}

static T256 void dot1_bf16(int64_t k, const uint16_t *a, const float *b, float *out) {
    DOT1_BODY(load_bf16, loom__bf16_to_fp32)
}

static T256 void avx2_dot_f32(int64_t k, const float *a, const float *b, size_t ldb, int nb,
                              float *out) {
    switch (nb) {
    case 1:
        dot1_f32(k, a, b, out);
        break;
    case 2:
        dot_f32_n(k, a, b, ldb, out, 2);
        break;
    case 3:
        dot_f32_n(k, a, b, ldb, out, 3);
        break;
    default:
        dot_f32_n(k, a, b, ldb, out, 4);
        break;
    }
}

static T256 void avx2_dot_f16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
                              float *out) {
    switch (nb) {
    case 1:
        dot1_f16(k, a, b, out);
        break;
    case 2:
        dot_f16_n(k, a, b, ldb, out, 2);
        break;
    case 3:
        dot_f16_n(k, a, b, ldb, out, 3);
        break;
    default:
        dot_f16_n(k, a, b, ldb, out, 4);
        break;
    }
}

static T256 void avx2_dot_bf16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
                               float *out) {
    switch (nb) {
    case 1:
        dot1_bf16(k, a, b, out);
        break;
    case 2:
        dot_bf16_n(k, a, b, ldb, out, 2);
        break;
    case 3:
        dot_bf16_n(k, a, b, ldb, out, 3);
        break;
    default:
        dot_bf16_n(k, a, b, ldb, out, 4);
        break;
    }
}

/* ---------------------------------------------------------------- quantised dots */

/* 32 products of unsigned u and signed s, summed into 8 int32 lanes (no overflow:
 * |u| <= 128, |s| <= 127, pairs fit int16). */
I256 __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

I256 void dot_q8_0_n(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb, float *out,
                     const int NB) {
    __m256 acc[4];
    const float *yd[4];
    const int8_t *yq[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        acc[j] = _mm256_setzero_ps();
        void *row = (char *)b + (j < NB ? j : 0) * ldb;
        yd[j] = loom__q8a_d(row);
        yq[j] = loom__q8a_qs(row, nblk);
    }
    for (int64_t i = 0; i < nblk; i++) {
        loom__cpu_prefetch_ahead(a + i, (int)sizeof *a);
        __m256i va = _mm256_loadu_si256((const __m256i *)a[i].qs);
        __m256i ax = _mm256_sign_epi8(va, va);
        float da = _cvtsh_ss(a[i].d);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m256i sy =
                _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(yq[j] + 32 * i)), va);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(ax, sy)),
                                     _mm256_set1_ps(da * yd[j][i]), acc[j]);
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) out[j] = hsum256(acc[j]);
}

I256 void dot_q4_0_n(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb, float *out,
                     const int NB) {
    __m256 acc[4];
    float corr[4] = {0, 0, 0, 0};
    const float *yd[4], *ys[4];
    const int8_t *yq[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        acc[j] = _mm256_setzero_ps();
        void *row = (char *)b + (j < NB ? j : 0) * ldb;
        yd[j] = loom__q8a_d(row);
        ys[j] = loom__q8a_s(row, nblk);
        yq[j] = loom__q8a_qs(row, nblk);
    }
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < nblk; i++) {
        loom__cpu_prefetch_ahead(a + i, (int)sizeof *a);
        __m128i t = _mm_loadu_si128((const __m128i *)a[i].qs);
        __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), low4);
        float da = _cvtsh_ss(a[i].d);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m256i dot = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)(yq[j] + 32 * i)));
            acc[j] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(da * yd[j][i]), acc[j]);
            corr[j] += da * ys[j][i];
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) out[j] = hsum256(acc[j]) - 8.0f * corr[j];
}

static T256 void avx2_dot_q8_0(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb,
                               int nb, float *out) {
    switch (nb) {
    case 1:
        dot_q8_0_n(nblk, a, b, ldb, out, 1);
        break;
    case 2:
        dot_q8_0_n(nblk, a, b, ldb, out, 2);
        break;
    case 3:
        dot_q8_0_n(nblk, a, b, ldb, out, 3);
        break;
    default:
        dot_q8_0_n(nblk, a, b, ldb, out, 4);
        break;
    }
}

static T256 void avx2_dot_q4_0(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb,
                               int nb, float *out) {
    switch (nb) {
    case 1:
        dot_q4_0_n(nblk, a, b, ldb, out, 1);
        break;
    case 2:
        dot_q4_0_n(nblk, a, b, ldb, out, 2);
        break;
    case 3:
        dot_q4_0_n(nblk, a, b, ldb, out, 3);
        break;
    default:
        dot_q4_0_n(nblk, a, b, ldb, out, 4);
        break;
    }
}

static T256 void avx2_quantize_q8a(const float *x, void *row, int64_t k) {
    const int64_t nblk = k / LOOM_QK8_0;
    float *yd = loom__q8a_d(row), *ys = loom__q8a_s(row, nblk);
    int8_t *yq = loom__q8a_qs(row, nblk);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nblk; i++) {
        if (loom__any_nonfinite(x + i * 32, 32)) { /* NaN scale: every dot reading it is NaN */
            memset(yq + 32 * i, 0, 32);
            yd[i] = ys[i] = NAN;
            continue;
        }
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int l = 0; l < 4; l++) {
            v[l] = _mm256_loadu_ps(x + i * 32 + l * 8);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[l]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f;
        yd[i] = d;
        if (d == 0.0f) {
            memset(yq + 32 * i, 0, 32);
            ys[i] = 0.0f;
            continue;
        }
        __m256 vd = _mm256_set1_ps(d);
        __m256i q[4];
        for (int l = 0; l < 4; l++)
            q[l] = _mm256_cvtps_epi32(_mm256_div_ps(v[l], vd));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* packs interleave 128-bit lanes; the permute restores element order */
        __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
        __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(yq + 32 * i), p8);
        ys[i] = d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* ---------------------------------------------------------------- GEMM micro-kernel */

#define MR 16
#define NR 6

static T256 void avx2_gemm_tile(int64_t kc, const float *ap, const float *bp, float *c, size_t ldc,
                                int first, int mvalid, int nvalid) {
    __m256 c0[NR], c1[NR];
    _Pragma("GCC unroll 6") for (int j = 0; j < NR; j++) {
        c0[j] = _mm256_setzero_ps();
        c1[j] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 a0 = _mm256_load_ps(ap), a1 = _mm256_load_ps(ap + 8);
        _Pragma("GCC unroll 6") for (int j = 0; j < NR; j++) {
            __m256 bj = _mm256_broadcast_ss(bp + j);
            c0[j] = _mm256_fmadd_ps(a0, bj, c0[j]);
            c1[j] = _mm256_fmadd_ps(a1, bj, c1[j]);
        }
        ap += MR;
        bp += NR;
    }
    if (mvalid == MR) {
        _Pragma("GCC unroll 6") for (int j = 0; j < NR; j++) {
            if (j >= nvalid) break;
            float *cj = c + j * ldc;
            if (!first) {
                c0[j] = _mm256_add_ps(c0[j], _mm256_loadu_ps(cj));
                c1[j] = _mm256_add_ps(c1[j], _mm256_loadu_ps(cj + 8));
            }
            _mm256_storeu_ps(cj, c0[j]);
            _mm256_storeu_ps(cj + 8, c1[j]);
        }
    } else {
        float tile[NR][MR];
        _Pragma("GCC unroll 6") for (int j = 0; j < NR; j++) {
            _mm256_storeu_ps(tile[j], c0[j]);
            _mm256_storeu_ps(tile[j] + 8, c1[j]);
        }
        for (int j = 0; j < nvalid; j++)
            for (int i = 0; i < mvalid; i++)
                c[j * ldc + i] = first ? tile[j][i] : c[j * ldc + i] + tile[j][i];
    }
}

/* 8x8 transpose in registers. */
I256 void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
}

static T256 void avx2_gemm_pack_a(const float *a, size_t lda, int64_t kc, int rows, float *panel) {
    const int64_t kv = kc & ~(int64_t)7;
    for (int h = 0; h < MR / 8; h++) {
        for (int64_t k0 = 0; k0 < kv; k0 += 8) {
            __m256 r[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] =
                8 * h + i < rows ? _mm256_loadu_ps(a + (8 * h + i) * lda + k0)
                                 : _mm256_setzero_ps();
            transpose8(r);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                _mm256_store_ps(panel + (k0 + j) * MR + 8 * h, r[j]);
        }
    }
    for (int64_t k = kv; k < kc; k++)
        for (int i = 0; i < MR; i++)
            panel[k * MR + i] = i < rows ? a[i * lda + k] : 0.0f;
}

/* ---------------------------------------------------------------- elementwise */

static T256 void avx2_vec_add(int64_t n, float *z, const float *x, const float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(z + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        z[i] = x[i] + y[i];
}

static T256 void avx2_vec_mul(int64_t n, float *z, const float *x, const float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(z + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        z[i] = x[i] * y[i];
}

static T256 void avx2_vec_scale(int64_t n, float *y, const float *x, float s, float b) {
    __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vs, vb));
    for (; i < n; i++)
        y[i] = fmaf(x[i], s, b);
}

static T256 void avx2_vec_silu(int64_t n, float *y, const float *x) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, silu256(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

static T256 void avx2_vec_swiglu(int64_t n, float *y, const float *x, const float *g) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_mul_ps(silu256(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
    for (; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

static T256 double avx2_vec_exp_sum(int64_t n, float *y, const float *x, float max) {
    __m256 vmax = _mm256_set1_ps(max);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(y + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
    double sum = t[0] + t[1] + t[2] + t[3];
    for (; i < n; i++) {
        float e = expf(x[i] - max);
        y[i] = e;
        sum += e;
    }
    return sum;
}

static T256 void avx2_vec_mad_f32(int64_t n, float *y, const float *x, float s) {
    __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vs, _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += x[i] * s;
}

static T256 void avx2_dequant_q8_0(const loom_block_q8_0 *x, float *y, int64_t nblk) {
    for (int64_t i = 0; i < nblk; i++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        for (int l = 0; l < 4; l++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[i].qs + 8 * l)));
            _mm256_storeu_ps(y + 32 * i + 8 * l, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

static T256 void avx2_dequant_q4_0(const loom_block_q4_0 *x, float *y, int64_t nblk) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < nblk; i++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        __m128i t = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m128i nib[2] = {_mm_and_si128(t, low4), _mm_and_si128(_mm_srli_epi16(t, 4), low4)};
        for (int h = 0; h < 2; h++) {
            __m256i q0 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nib[h]), eight);
            __m256i q1 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(nib[h], 8)), eight);
            _mm256_storeu_ps(y + 32 * i + 16 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(q0), d));
            _mm256_storeu_ps(y + 32 * i + 16 * h + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(q1), d));
        }
    }
}

static T256 void avx2_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, load_f16(x + i));
    for (; i < n; i++)
        y[i] = loom__fp16_to_fp32(x[i]);
}

static T256 void avx2_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = loom__fp32_to_fp16(x[i]);
}

/* ---------------------------------------------------------------- flash attention tiles */

/* lanes [0, n) set (n clamped to 0..8), as a maskload/maskstore mask */
I256 __m256i tail_mask8(int64_t n) {
    const int32_t c = n < 0 ? 0 : n > 8 ? 8 : (int32_t)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 vectors -> one: lane t is the sum of a[t]'s lanes. */
I256 __m256 hsum8(const __m256 *a) {
    __m256 b[4], c[2];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) b[j] = _mm256_add_ps(
        _mm256_permute2f128_ps(a[j], a[j + 4], 0x20), _mm256_permute2f128_ps(a[j], a[j + 4], 0x31));
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) c[j] = _mm256_add_ps(
        _mm256_shuffle_ps(b[j], b[j + 2], 0x44), _mm256_shuffle_ps(b[j], b[j + 2], 0xEE));
    __m256 e =
        _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
    return _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7));
}

/* Dots of one query row against up to 8 key rows. */
I256 __m256 kq8(int64_t D, const float *qr, const float *k, size_t ldk, int n8) {
    __m256 acc[8];
    const float *kr[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
        acc[j] = _mm256_setzero_ps();
        kr[j] = k + (size_t)(j < n8 ? j : n8 - 1) * ldk;
    }
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        __m256 qv = _mm256_loadu_ps(qr + d);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) acc[j] =
            _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[j] + d), acc[j]);
    }
    if (d < D) {
        const __m256i m = tail_mask8(D - d);
        __m256 qv = _mm256_maskload_ps(qr + d, m);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) acc[j] =
            _mm256_fmadd_ps(qv, _mm256_maskload_ps(kr[j] + d, m), acc[j]);
    }
    return hsum8(acc);
}

static T256 void avx2_fa_kq(int64_t D, const float *q, int nr, const float *k, size_t ldk, int nt,
                            float scale, const float *slope, float *z, size_t ldz, float *zmax,
                            bool *nan) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vscale = _mm256_set1_ps(scale);
    for (int r = 0; r < nr; r++) {
        const float *qr = q + (size_t)r * (size_t)D;
        float *zr = z + (size_t)r * ldz;
        const __m256 vslope = _mm256_set1_ps(slope[r]);
        __m256 vmax = ninf;
        int bad = 0;
        for (int t0 = 0; t0 < nt; t0 += 8) {
            const int n8 = nt - t0 < 8 ? nt - t0 : 8;
            const __m256i tm = tail_mask8(n8);
            const __m256 m = _mm256_maskload_ps(zr + t0, tm);
            /* unordered: a NaN mask value is a live key whose score is NaN */
            const __m256 live =
                _mm256_and_ps(_mm256_cmp_ps(m, ninf, _CMP_NEQ_UQ), _mm256_castsi256_ps(tm));
            if (!_mm256_movemask_ps(live)) continue; /* z already -INF there */
            __m256 s = kq8(D, qr, k + (size_t)t0 * ldk, ldk, n8);
            s = _mm256_add_ps(_mm256_mul_ps(s, vscale), _mm256_mul_ps(vslope, m));
            const __m256 nanm = _mm256_and_ps(_mm256_cmp_ps(s, s, _CMP_UNORD_Q), live);
            bad |= _mm256_movemask_ps(nanm);
            s = _mm256_blendv_ps(ninf, s, _mm256_andnot_ps(nanm, live));
            vmax = _mm256_max_ps(vmax, s);
            _mm256_maskstore_ps(zr + t0, tm, s);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        zmax[r] = _mm_cvtss_f32(h);
        if (bad) nan[r] = true;
    }
}

/* NROW rows of the accumulator, 16 columns from d0 (masks m[c] for the columns present). */
I256 void pv_block(const int NROW, const float *w, const float *z, size_t ldz, const float *v,
                   size_t ldv, int nt, float *acc, int64_t Dv, int64_t d0, const __m256i *m) {
    __m256 a[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) a[r][c] =
            _mm256_maskload_ps(acc + (size_t)r * (size_t)Dv + d0 + 8 * c, m[c]);
    for (int t = 0; t < nt; t++) {
        const float *vt = v + (size_t)t * ldv + d0;
        __m256 x[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) x[c] =
            _mm256_maskload_ps(vt + 8 * c, m[c]);
        _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++) {
            if (z[(size_t)r * ldz + t] == -INFINITY) continue;
            const __m256 ws = _mm256_set1_ps(w[(size_t)r * ldz + t]);
            _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) a[r][c] =
                _mm256_fmadd_ps(x[c], ws, a[r][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++)
            _mm256_maskstore_ps(acc + (size_t)r * (size_t)Dv + d0 + 8 * c, m[c], a[r][c]);
}

static T256 void avx2_fa_pv(int64_t Dv, const float *w, const float *z, size_t ldz, int nr,
                            const float *v, size_t ldv, int nt, float *acc) {
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int nrr = nr - r0 < 4 ? nr - r0 : 4;
        const float *wr = w + (size_t)r0 * ldz, *zr = z + (size_t)r0 * ldz;
        float *ar = acc + (size_t)r0 * (size_t)Dv;
        for (int64_t d0 = 0; d0 < Dv; d0 += 16) {
            const __m256i m[2] = {tail_mask8(Dv - d0), tail_mask8(Dv - d0 - 8)};
            switch (nrr) {
            case 1:
                pv_block(1, wr, zr, ldz, v, ldv, nt, ar, Dv, d0, m);
                break;
            case 2:
                pv_block(2, wr, zr, ldz, v, ldv, nt, ar, Dv, d0, m);
                break;
            case 3:
                pv_block(3, wr, zr, ldz, v, ldv, nt, ar, Dv, d0, m);
                break;
            default:
                pv_block(4, wr, zr, ldz, v, ldv, nt, ar, Dv, d0, m);
                break;
            }
        }
    }
}

/* n F16 (or BF16) values -> f32. */
I256 void half_row_to_f32(const uint16_t *h, int64_t n, float *y, bool bf16) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, bf16 ? load_bf16(h + i) : load_f16(h + i));
    for (; i < n; i++)
        y[i] = bf16 ? loom__bf16_to_fp32(h[i]) : loom__fp16_to_fp32(h[i]);
}

static T256 bool avx2_rows_to_f32(loom_type t, const void *x, size_t ldx, int nrows, int64_t n,
                                  float *y, size_t ldy) {
    for (int r = 0; r < nrows; r++) {
        const char *row = (const char *)x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        switch (t) {
        case LOOM_TYPE_F32:
            memcpy(yr, row, (size_t)n * sizeof(float));
            break;
        case LOOM_TYPE_F16: /* inline: rows are short (a head) */
            half_row_to_f32((const uint16_t *)row, n, yr, false);
            break;
        case LOOM_TYPE_BF16:
            half_row_to_f32((const uint16_t *)row, n, yr, true);
            break;
        case LOOM_TYPE_Q8_0:
            avx2_dequant_q8_0((const loom_block_q8_0 *)row, yr, n / LOOM_QK8_0);
            break;
        case LOOM_TYPE_Q4_0:
            avx2_dequant_q4_0((const loom_block_q4_0 *)row, yr, n / LOOM_QK4_0);
            break;
        default:
            return false;
        }
    }
    return true;
}

const loom__cpu_simd loom__cpu_simd_avx2 = {
    .name = "avx2",
    .dot_f32 = avx2_dot_f32,
    .dot_f16 = avx2_dot_f16,
    .dot_bf16 = avx2_dot_bf16,
    .dot_q8_0 = avx2_dot_q8_0,
    .dot_q4_0 = avx2_dot_q4_0,
    .quantize_q8a = avx2_quantize_q8a,
    .gemm_tile = avx2_gemm_tile,
    .gemm_pack_a = avx2_gemm_pack_a,
    .gemm_mr = MR,
    .gemm_nr = NR,
    .qgemm_tile = loom__qgemm_tile_avx2,
    .qgemm_lut16 = loom__qgemm_lut16_avx2,
    .qgemm_mr = 8,
    .qgemm_nr = 4,
    .qgemm_min_n = 32,
    .qgemm_qmax = 64,
    .vec_add = avx2_vec_add,
    .vec_mul = avx2_vec_mul,
    .vec_scale = avx2_vec_scale,
    .vec_silu = avx2_vec_silu,
    .vec_swiglu = avx2_vec_swiglu,
    .vec_exp_sum = avx2_vec_exp_sum,
    .vec_mad_f32 = avx2_vec_mad_f32,
    .dequant_q8_0 = avx2_dequant_q8_0,
    .dequant_q4_0 = avx2_dequant_q4_0,
    .f16_to_f32 = avx2_f16_to_f32,
    .f32_to_f16 = avx2_f32_to_f16,
    .fa_kq = avx2_fa_kq,
    .fa_pv = avx2_fa_pv,
    .rows_to_f32 = avx2_rows_to_f32,
};

#else /* not x86-64 GCC/Clang: never selected */

const loom__cpu_simd loom__cpu_simd_avx2 = {.name = "scalar"};

#endif
