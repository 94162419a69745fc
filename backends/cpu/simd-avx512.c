/*
 * AVX-512 kernels (F, BW, VL and VNNI): the table loom__cpu_simd_avx512.
 *
 * Compiled with target attributes so the rest of the library stays portable; chosen at
 * run time by loom__cpu_simd_get only when the processor has every feature used here.
 * Each function computes exactly what its portable twin in simd.c computes, up to float
 * summation order (tests compare the two).
 */
#include "backends/cpu/cpu-impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/avx512-inl.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define I512 static inline __attribute__((always_inline)) T512

/* ---------------------------------------------------------------- helpers */

I512 __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

I512 __m512 maskload_f16(__mmask16 m, const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

I512 __m512 load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

I512 __m512 maskload_bf16(__mmask16 m, const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* exp(x), about 1 ulp (Cephes polynomial); 0 below -87.3 (and for -INF). */
I512 __m512 exp512(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.72f);
    const __m512 lo = _mm512_set1_ps(-87.33f);
    __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 y = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(y, n));
}

I512 __m512 silu512(__m512 x) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* ---------------------------------------------------------------- float dot products */

/* NB rows of b at once; a is read once. LOAD converts 16 elements of a to f32. */
#define DOT_BODY(LOAD, MASKLOAD)                                                                   \
    __m512 acc[4][2];                                                                              \
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                          \
        acc[j][0] = _mm512_setzero_ps();                                                           \
        acc[j][1] = _mm512_setzero_ps();                                                           \
    }                                                                                              \
    int64_t i = 0;                                                                                 \
    for (; i + 32 <= k; i += 32) {                                                                 \
        loom__cpu_prefetch_ahead(a + i, 32 * (int)sizeof *a);                                      \
        __m512 a0 = LOAD(a + i), a1 = LOAD(a + i + 16);                                            \
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {                                     \
            acc[j][0] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b + j * ldb + i), acc[j][0]);          \
            acc[j][1] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b + j * ldb + i + 16), acc[j][1]);     \
        }                                                                                          \
    }                                                                                              \
    for (; i < k; i += 16) {                                                                       \
        __mmask16 m = loom__avx512_tail_mask(k - i);                                               \
        __m512 a0 = MASKLOAD(m, a + i);                                                            \
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) acc[j][0] =                           \
            _mm512_fmadd_ps(a0, _mm512_maskz_loadu_ps(m, b + j * ldb + i), acc[j][0]);             \
    }                                                                                              \
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) out[j] =                                  \
        _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]));

I512 __m512 loadu_f32(const float *p) {
    return _mm512_loadu_ps(p);
}
I512 __m512 maskload_f32(__mmask16 m, const float *p) {
    return _mm512_maskz_loadu_ps(m, p);
}

I512 void dot_f32_n(int64_t k, const float *a, const float *b, size_t ldb, float *out,
                    const int NB){DOT_BODY(loadu_f32, maskload_f32)} I512
    void dot_f16_n(int64_t k, const uint16_t *a, const float *b, size_t ldb, float *out,
                   const int NB){DOT_BODY(load_f16, maskload_f16)} I512
    void dot_bf16_n(int64_t k, const uint16_t *a, const float *b, size_t ldb, float *out,
                    const int NB) {
    DOT_BODY(load_bf16, maskload_bf16)
}

/* One row: four independent chains so the FMA latency is hidden. */
static T512 void dot1_f32(int64_t k, const float *a, const float *b, float *out) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
        loom__cpu_prefetch_ahead(a + i, 64 * (int)sizeof *a);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < k; i += 16) {
        __mmask16 m = loom__avx512_tail_mask(k - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    out[0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* One F16 / BF16 row: four chains as dot1_f32 (two leave a matrix-vector product at ~70%
 * of the read bandwidth on 2 threads, four reach ~90%: bench/matmul_bench). */
#define DOT1_BODY(LOAD, MASKLOAD)                                                                  \
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                    \
    int64_t i = 0;                                                                                 \
    for (; i + 64 <= k; i += 64) {                                                                 \
        loom__cpu_prefetch_ahead(a + i, 64 * (int)sizeof *a);                                      \
        s0 = _mm512_fmadd_ps(LOAD(a + i), _mm512_loadu_ps(b + i), s0);                             \
        s1 = _mm512_fmadd_ps(LOAD(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);                   \
        s2 = _mm512_fmadd_ps(LOAD(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);                   \
        s3 = _mm512_fmadd_ps(LOAD(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);                   \
    }                                                                                              \
    for (; i < k; i += 16) {                                                                       \
        __mmask16 m = loom__avx512_tail_mask(k - i);                                               \
        s0 = _mm512_fmadd_ps(MASKLOAD(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);             \
    }                                                                                              \
    out[0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));

static T512 void dot1_f16(int64_t k, const uint16_t *a, const float *b, float *out) {
    DOT1_BODY(load_f16, maskload_f16)
}

static T512 void dot1_bf16(int64_t k, const uint16_t *a, const float *b, float *out) {
    DOT1_BODY(load_bf16, maskload_bf16)
}

static T512 void avx512_dot_f32(int64_t k, const float *a, const float *b, size_t ldb, int nb,
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

static T512 void avx512_dot_f16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
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

static T512 void avx512_dot_bf16(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb,
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

I512 float fp16_1(uint16_t h) {
    return _cvtsh_ss(h);
}

/* Two 32-byte quant payloads (blocks i and i + 1) in one zmm. */
I512 __m512i load2x32(const int8_t *p0, const int8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

I512 float hsum256(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The fp16 scales (first field) of 8 consecutive blocks of W 16-bit words (Q8_0 17, Q4_0 9)
 * as 8 floats: the words 0, W, .., 7 W picked by vpermt2w from the zmm loads that cover them
 * (bytes 0..255 for Q8_0, 0..127 for Q4_0; both inside the 8 blocks), one vcvtph2ps. */
I512 __m256 fp16x8_q8_0(const loom_block_q8_0 *a) {
    const char *p = (const char *)a;
    /* blocks 0..3: words 0, 17, 34, 51 of p[0..127]; 4..7: words 4, 21, 38, 55 of p[128..255] */
    const __m512i idx = _mm512_castsi128_si512(_mm_setr_epi16(0, 17, 34, 51, 4, 21, 38, 55));
    const __m512i lo =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx, _mm512_loadu_si512(p + 64));
    const __m512i hi =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p + 128), idx, _mm512_loadu_si512(p + 192));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi16(0xf0, lo, hi)));
}

I512 __m256 fp16x8_q4_0(const loom_block_q4_0 *a) {
    const char *p = (const char *)a;
    const __m512i idx = _mm512_castsi128_si512(_mm_setr_epi16(0, 9, 18, 27, 36, 45, 54, 63));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx, _mm512_loadu_si512(p + 64))));
}

/* Eight blocks' VNNI sums d0..d3 (two blocks per zmm: d0 = [block 0 x 8 lanes, block 1 x 8],
 * d1 = blocks 2, 3, ...) folded in int32 to 16 lanes, each the sum of 4 of one block's lanes:
 * 128-bit lanes 0, 1 hold blocks [0, 2, 4, 6], lanes 2, 3 blocks [1, 3, 5, 7] (fold_idx
 * spreads the 8 blocks' scales the same way). One cvt, permute and FMA per 8 blocks, not four. */
I512 __m512i fold8(__m512i d0, __m512i d1, __m512i d2, __m512i d3) {
    const __m512i t01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1));
    const __m512i t23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(d2, d3), _mm512_unpackhi_epi32(d2, d3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}
I512 __m512i fold_idx(void) {
    return _mm512_set_epi32(7, 5, 3, 1, 7, 5, 3, 1, 6, 4, 2, 0, 6, 4, 2, 0);
}

/* Q8_0 x Q8, eight blocks per step (two per zmm): |a| (unsigned) times b carrying a's
 * sign, summed by VNNI into 8 int32 lanes per block, folded (fold8) and scaled with the 8
 * blocks' da * db (fp16x8_q8_0: one vcvtph2ps). Blocks past the last multiple of 8 one ymm
 * each. */
I512 void dot_q8_0_n(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb, float *out,
                     const int NB) {
    __m512 acc[4];
    __m256 tail[4];
    const float *yd[4];
    const int8_t *yq[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        acc[j] = _mm512_setzero_ps();
        tail[j] = _mm256_setzero_ps();
        void *row = (char *)b + (j < NB ? j : 0) * ldb;
        yd[j] = loom__q8a_d(row);
        yq[j] = loom__q8a_qs(row, nblk);
    }
    const __m512i fidx = fold_idx();
    int64_t i = 0;
    for (; i + 8 <= nblk; i += 8) {
        loom__cpu_prefetch_ahead(a + i, 8 * (int)sizeof *a);
        __m512i ax[4];
        __mmask64 neg[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i va = load2x32(a[i + 2 * p].qs, a[i + 2 * p + 1].qs);
            ax[p] = _mm512_abs_epi8(va);
            neg[p] = _mm512_movepi8_mask(va);
        }
        const __m256 da = fp16x8_q8_0(a + i);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m512i d[4];
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
                const __m512i vb = _mm512_loadu_si512(yq[j] + 32 * i + 64 * p);
                d[p] = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), ax[p],
                    _mm512_mask_sub_epi8(vb, neg[p], _mm512_setzero_si512(), vb));
            }
            const __m512 sc = _mm512_permutexvar_ps(
                fidx, _mm512_castps256_ps512(_mm256_mul_ps(da, _mm256_loadu_ps(yd[j] + i))));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold8(d[0], d[1], d[2], d[3])), sc, acc[j]);
        }
    }
    for (; i < nblk; i++) {
        __m256i va = _mm256_loadu_si256((const __m256i *)a[i].qs);
        __m256i ax = _mm256_sign_epi8(va, va);
        float da = fp16_1(a[i].d);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m256i sy =
                _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(yq[j] + 32 * i)), va);
            __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
            tail[j] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(da * yd[j][i]), tail[j]);
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) out[j] =
        _mm512_reduce_add_ps(acc[j]) + hsum256(tail[j]);
}

/* Q4_0 x Q8, eight blocks per step: the nibbles (0..15, unsigned) times b by VNNI, folded
 * and scaled as Q8_0; the -8 offset is applied through b's precomputed s = d * sum(q). */
I512 void dot_q4_0_n(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb, float *out,
                     const int NB) {
    __m512 acc[4];
    __m256 tail[4], corr[4];
    float tcorr[4] = {0, 0, 0, 0};
    const float *yd[4], *ys[4];
    const int8_t *yq[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        acc[j] = _mm512_setzero_ps();
        tail[j] = corr[j] = _mm256_setzero_ps();
        void *row = (char *)b + (j < NB ? j : 0) * ldb;
        yd[j] = loom__q8a_d(row);
        ys[j] = loom__q8a_s(row, nblk);
        yq[j] = loom__q8a_qs(row, nblk);
    }
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    const __m512i fidx = fold_idx();
    int64_t i = 0;
    for (; i + 8 <= nblk; i += 8) {
        loom__cpu_prefetch_ahead(a + i, 8 * (int)sizeof *a);
        /* lanes [qs0, qs0, qs1, qs1]; the upper copy of each shifted by 4 -> high nibbles */
        __m512i q[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i v = _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)a[i + 2 * p].qs))),
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)a[i + 2 * p + 1].qs)),
                1);
            q[p] = _mm512_and_si512(_mm512_srlv_epi64(v, shifts), low4);
        }
        const __m256 da = fp16x8_q4_0(a + i);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m512i d[4];
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) d[p] = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(), q[p], _mm512_loadu_si512(yq[j] + 32 * i + 64 * p));
            const __m512 sc = _mm512_permutexvar_ps(
                fidx, _mm512_castps256_ps512(_mm256_mul_ps(da, _mm256_loadu_ps(yd[j] + i))));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold8(d[0], d[1], d[2], d[3])), sc, acc[j]);
            corr[j] = _mm256_fmadd_ps(da, _mm256_loadu_ps(ys[j] + i), corr[j]);
        }
    }
    for (; i < nblk; i++) {
        __m128i t = _mm_loadu_si128((const __m128i *)a[i].qs);
        __m256i qq =
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
        float da = fp16_1(a[i].d);
        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {
            __m256i dot = _mm256_dpbusd_epi32(
                _mm256_setzero_si256(), qq, _mm256_loadu_si256((const __m256i *)(yq[j] + 32 * i)));
            tail[j] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(da * yd[j][i]), tail[j]);
            tcorr[j] += da * ys[j][i];
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) out[j] =
        _mm512_reduce_add_ps(acc[j]) + hsum256(tail[j]) - 8.0f * (hsum256(corr[j]) + tcorr[j]);
}

static T512 void avx512_dot_q8_0(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb,
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

static T512 void avx512_dot_q4_0(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb,
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

static T512 void avx512_quantize_q8a(const float *x, void *row, int64_t k) {
    const int64_t nblk = k / LOOM_QK8_0;
    float *yd = loom__q8a_d(row), *ys = loom__q8a_s(row, nblk);
    int8_t *yq = loom__q8a_qs(row, nblk);
    for (int64_t i = 0; i < nblk; i++) {
        if (loom__any_nonfinite(x + i * 32, 32)) { /* NaN scale: every dot reading it is NaN */
            memset(yq + 32 * i, 0, 32);
            yd[i] = ys[i] = NAN;
            continue;
        }
        __m512 v0 = _mm512_loadu_ps(x + i * 32), v1 = _mm512_loadu_ps(x + i * 32 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f;
        yd[i] = d;
        if (d == 0.0f) {
            memset(yq + 32 * i, 0, 32);
            ys[i] = 0.0f;
            continue;
        }
        __m512 vd = _mm512_set1_ps(d);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_div_ps(v0, vd));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_div_ps(v1, vd));
        _mm_storeu_si128((__m128i *)(yq + 32 * i), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(yq + 32 * i + 16), _mm512_cvtsepi32_epi8(q1));
        ys[i] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* ---------------------------------------------------------------- GEMM micro-kernel */

#define MR 32
#define NR 12

/* c[j * ldc + i] (+)= sum_k ap[k * MR + i] * bp[k * NR + j], i < mvalid, j < nvalid. */
static T512 void avx512_gemm_tile(int64_t kc, const float *ap, const float *bp, float *c,
                                  size_t ldc, int first, int mvalid, int nvalid) {
    __m512 c0[NR], c1[NR];
    _Pragma("GCC unroll 12") for (int j = 0; j < NR; j++) {
        c0[j] = _mm512_setzero_ps();
        c1[j] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 a0 = _mm512_load_ps(ap), a1 = _mm512_load_ps(ap + 16);
        _Pragma("GCC unroll 12") for (int j = 0; j < NR; j++) {
            __m512 bj = _mm512_set1_ps(bp[j]);
            c0[j] = _mm512_fmadd_ps(a0, bj, c0[j]);
            c1[j] = _mm512_fmadd_ps(a1, bj, c1[j]);
        }
        ap += MR;
        bp += NR;
    }
    _Static_assert(MR == 32, "loom__avx512_store_tile32 writes 32-row tiles");
    loom__avx512_store_tile32(c, ldc, c0, c1, NR, first, mvalid, nvalid);
}

/* 16x16 transpose in registers. */
I512 void transpose16(__m512 r[16]) {
    __m512i w[16];
    for (int i = 0; i < 16; i++)
        w[i] = _mm512_castps_si512(r[i]);
    loom__avx512_transpose16(w);
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_castsi512_ps(w[i]);
}

static T512 void avx512_gemm_pack_a(const float *a, size_t lda, int64_t kc, int rows,
                                    float *panel) {
    const int64_t kv = kc & ~(int64_t)15;
    for (int h = 0; h < MR / 16; h++) {
        for (int64_t k0 = 0; k0 < kv; k0 += 16) {
            __m512 r[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) r[i] =
                16 * h + i < rows ? _mm512_loadu_ps(a + (16 * h + i) * lda + k0)
                                  : _mm512_setzero_ps();
            transpose16(r);
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
                _mm512_store_ps(panel + (k0 + j) * MR + 16 * h, r[j]);
        }
    }
    for (int64_t k = kv; k < kc; k++)
        for (int i = 0; i < MR; i++)
            panel[k * MR + i] = i < rows ? a[i * lda + k] : 0.0f;
}

/* ---------------------------------------------------------------- elementwise */

static T512 void avx512_vec_add(int64_t n, float *z, const float *x, const float *y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(z + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(
            z + i, m,
            _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static T512 void avx512_vec_mul(int64_t n, float *z, const float *x, const float *y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(z + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(
            z + i, m,
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static T512 void avx512_vec_scale(int64_t n, float *y, const float *x, float s, float b) {
    __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vs, vb));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), vs, vb));
    }
}

static T512 void avx512_vec_silu(int64_t n, float *y, const float *x) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, silu512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static T512 void avx512_vec_swiglu(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        __m512 v = silu512(_mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, g + i)));
    }
}

static T512 double avx512_vec_exp_sum(int64_t n, float *y, const float *x, float max) {
    __m512 vmax = _mm512_set1_ps(max);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        __m512 e =
            _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax)));
        _mm512_mask_storeu_ps(y + i, m, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(
            s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

static T512 void avx512_vec_mad_f32(int64_t n, float *y, const float *x, float s) {
    __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vs, _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(
            y + i, m,
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), vs, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static T512 void avx512_dequant_q8_0(const loom_block_q8_0 *x, float *y, int64_t nblk) {
    for (int64_t i = 0; i < nblk; i++) {
        __m512 d = _mm512_set1_ps(fp16_1(x[i].d));
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x[i].qs));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x[i].qs + 16)));
        _mm512_storeu_ps(y + 32 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
        _mm512_storeu_ps(y + 32 * i + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
    }
}

static T512 void avx512_dequant_q4_0(const loom_block_q4_0 *x, float *y, int64_t nblk) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t i = 0; i < nblk; i++) {
        __m512 d = _mm512_set1_ps(fp16_1(x[i].d));
        __m128i t = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(t, low4)), eight);
        __m512i hi = _mm512_sub_epi32(
            _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(t, 4), low4)), eight);
        _mm512_storeu_ps(y + 32 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(y + 32 * i + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

static T512 void avx512_f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, load_f16(x + i));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, maskload_f16(m, x + i));
    }
}

static T512 void avx512_f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm256_mask_storeu_epi16(
            y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

/* ---------------------------------------------------------------- flash attention tiles */

/* 16 vectors -> one: lane t is the sum of a[t]'s lanes (a shuffle tree, then one permute
 * that puts the keys back in order). */
I512 __m512 hsum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) b[j] = _mm512_add_ps(
        _mm512_shuffle_f32x4(a[j], a[j + 8], 0x44), _mm512_shuffle_f32x4(a[j], a[j + 8], 0xEE));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) c[j] = _mm512_add_ps(
        _mm512_shuffle_f32x4(b[j], b[j + 4], 0x88), _mm512_shuffle_f32x4(b[j], b[j + 4], 0xDD));
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) d[j] = _mm512_add_ps(
        _mm512_shuffle_ps(c[j], c[j + 2], 0x44), _mm512_shuffle_ps(c[j], c[j + 2], 0xEE));
    __m512 e =
        _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(order, e);
}

/* Dots of one query row against up to 16 key rows (kr[j] = k + row(j) * ldk); ND > 0: D is
 * ND * 16 and the query stays in registers, ND = 0: any D. */
I512 __m512 kq16(const int ND, int64_t D, const float *qr, const float *k, size_t ldk, int n16) {
    __m512 acc[16];
    const float *kr[16];
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
        acc[j] = _mm512_setzero_ps();
        kr[j] = k + (size_t)(j < n16 ? j : n16 - 1) * ldk;
    }
    if (ND > 0) {
        __m512 qv[8];
        _Pragma("GCC unroll 8") for (int c = 0; c < ND; c++) qv[c] = _mm512_loadu_ps(qr + 16 * c);
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
            _Pragma("GCC unroll 8") for (int c = 0; c < ND; c++) acc[j] =
                _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr[j] + 16 * c), acc[j]);
    } else {
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) {
            __m512 qv = _mm512_loadu_ps(qr + d);
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) acc[j] =
                _mm512_fmadd_ps(qv, _mm512_loadu_ps(kr[j] + d), acc[j]);
        }
        if (d < D) {
            __mmask16 m = loom__avx512_tail_mask(D - d);
            __m512 qv = _mm512_maskz_loadu_ps(m, qr + d);
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) acc[j] =
                _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, kr[j] + d), acc[j]);
        }
    }
    return hsum16(acc);
}

/* Dots of two query rows against up to 8 key rows, sharing each key load: lanes 0-7 are
 * q0's, lanes 8-15 q1's. ND as kq16. */
I512 __m512 kq2x8(const int ND, int64_t D, const float *q0, const float *q1, const float *k,
                  size_t ldk, int n8) {
    __m512 acc[16];
    const float *kr[8];
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) kr[j] =
        k + (size_t)(j < n8 ? j : n8 - 1) * ldk;
    if (ND > 0) {
        __m512 a[4], b[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < ND; c++) {
            a[c] = _mm512_loadu_ps(q0 + 16 * c);
            b[c] = _mm512_loadu_ps(q1 + 16 * c);
        }
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            _Pragma("GCC unroll 4") for (int c = 0; c < ND; c++) {
            const __m512 kv = _mm512_loadu_ps(kr[j] + 16 * c);
            acc[j] = _mm512_fmadd_ps(a[c], kv, acc[j]);
            acc[8 + j] = _mm512_fmadd_ps(b[c], kv, acc[8 + j]);
        }
    } else {
        for (int64_t d = 0; d < D; d += 16) {
            const __mmask16 m = loom__avx512_tail_mask(D - d);
            const __m512 a = _mm512_maskz_loadu_ps(m, q0 + d), b = _mm512_maskz_loadu_ps(m, q1 + d);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                const __m512 kv = _mm512_maskz_loadu_ps(m, kr[j] + d);
                acc[j] = _mm512_fmadd_ps(a, kv, acc[j]);
                acc[8 + j] = _mm512_fmadd_ps(b, kv, acc[8 + j]);
            }
        }
    }
    return hsum16(acc);
}

I512 __m512 join256(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

static T512 void avx512_fa_kq(int64_t D, const float *q, int nr, const float *k, size_t ldk, int nt,
                              float scale, const float *slope, float *z, size_t ldz, float *zmax,
                              bool *nan) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    int r = 0;
    /* two rows at a time: each key row loaded once for both */
    for (; r + 1 < nr; r += 2) {
        const float *q0 = q + (size_t)r * (size_t)D, *q1 = q0 + D;
        float *z0 = z + (size_t)r * ldz, *z1 = z0 + ldz;
        const __m512 vslope = join256(_mm256_set1_ps(slope[r]), _mm256_set1_ps(slope[r + 1]));
        __m512 vmax = ninf;
        __mmask16 bad = 0;
        for (int t0 = 0; t0 < nt; t0 += 8) {
            const int n8 = nt - t0 < 8 ? nt - t0 : 8;
            const __mmask8 t8 = (__mmask8)((1u << n8) - 1u);
            const __mmask16 tm = (__mmask16)(t8 | (unsigned)t8 << 8);
            const __m512 m =
                join256(_mm256_maskz_loadu_ps(t8, z0 + t0), _mm256_maskz_loadu_ps(t8, z1 + t0));
            /* unordered: a NaN mask value is a live key whose score is NaN */
            const __mmask16 live = _mm512_mask_cmp_ps_mask(tm, m, ninf, _CMP_NEQ_UQ);
            if (!live) continue; /* z already -INF there */
            const float *kt = k + (size_t)t0 * ldk;
            __m512 s =
                D == 64 ? kq2x8(4, D, q0, q1, kt, ldk, n8) : kq2x8(0, D, q0, q1, kt, ldk, n8);
            s = _mm512_add_ps(_mm512_mul_ps(s, vscale), _mm512_mul_ps(vslope, m));
            const __mmask16 nanm = _mm512_mask_cmp_ps_mask(live, s, s, _CMP_UNORD_Q);
            bad |= nanm;
            s = _mm512_mask_mov_ps(ninf, live & (__mmask16)~nanm, s);
            vmax = _mm512_max_ps(vmax, s);
            _mm256_mask_storeu_ps(z0 + t0, t8, _mm512_castps512_ps256(s));
            _mm256_mask_storeu_ps(z1 + t0, t8,
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
        }
        zmax[r] = _mm512_mask_reduce_max_ps(0x00ff, vmax);
        zmax[r + 1] = _mm512_mask_reduce_max_ps(0xff00, vmax);
        if (bad & 0x00ff) nan[r] = true;
        if (bad & 0xff00) nan[r + 1] = true;
    }
    for (; r < nr; r++) {
        const float *qr = q + (size_t)r * (size_t)D;
        float *zr = z + (size_t)r * ldz;
        const __m512 vslope = _mm512_set1_ps(slope[r]);
        __m512 vmax = ninf;
        __mmask16 bad = 0;
        for (int t0 = 0; t0 < nt; t0 += 16) {
            const int n16 = nt - t0 < 16 ? nt - t0 : 16;
            const __mmask16 tm = loom__avx512_tail_mask(n16);
            const __m512 m = _mm512_maskz_loadu_ps(tm, zr + t0);
            const __mmask16 live = _mm512_mask_cmp_ps_mask(tm, m, ninf, _CMP_NEQ_UQ);
            if (!live) continue;
            const float *kt = k + (size_t)t0 * ldk;
            __m512 s = D == 64    ? kq16(4, D, qr, kt, ldk, n16)
                       : D == 128 ? kq16(8, D, qr, kt, ldk, n16)
                                  : kq16(0, D, qr, kt, ldk, n16);
            s = _mm512_add_ps(_mm512_mul_ps(s, vscale), _mm512_mul_ps(vslope, m));
            const __mmask16 nanm = _mm512_mask_cmp_ps_mask(live, s, s, _CMP_UNORD_Q);
            bad |= nanm;
            s = _mm512_mask_mov_ps(ninf, live & (__mmask16)~nanm, s);
            vmax = _mm512_max_ps(vmax, s);
            _mm512_mask_storeu_ps(zr + t0, tm, s);
        }
        zmax[r] = _mm512_reduce_max_ps(vmax);
        if (bad) nan[r] = true;
    }
}

/* NROW rows of the accumulator, 64 columns from d0 (masks m[c] for the columns present). */
I512 void pv_block(const int NROW, const float *w, const float *z, size_t ldz, const float *v,
                   size_t ldv, int nt, float *acc, int64_t Dv, int64_t d0, const __mmask16 *m) {
    __m512 a[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) a[r][c] =
            _mm512_maskz_loadu_ps(m[c], acc + (size_t)r * (size_t)Dv + d0 + 16 * c);
    for (int t = 0; t < nt; t++) {
        const float *vt = v + (size_t)t * ldv + d0;
        __m512 x[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) x[c] =
            _mm512_maskz_loadu_ps(m[c], vt + 16 * c);
        _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++) {
            if (z[(size_t)r * ldz + t] == -INFINITY) continue;
            const __m512 ws = _mm512_set1_ps(w[(size_t)r * ldz + t]);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) a[r][c] =
                _mm512_fmadd_ps(x[c], ws, a[r][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < NROW; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(acc + (size_t)r * (size_t)Dv + d0 + 16 * c, m[c], a[r][c]);
}

static T512 void avx512_fa_pv(int64_t Dv, const float *w, const float *z, size_t ldz, int nr,
                              const float *v, size_t ldv, int nt, float *acc) {
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int nrr = nr - r0 < 4 ? nr - r0 : 4;
        const float *wr = w + (size_t)r0 * ldz, *zr = z + (size_t)r0 * ldz;
        float *ar = acc + (size_t)r0 * (size_t)Dv;
        for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
            __mmask16 m[4];
            for (int c = 0; c < 4; c++) {
                const int64_t rem = Dv - d0 - 16 * c;
                m[c] = rem > 0 ? loom__avx512_tail_mask(rem) : 0;
            }
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
I512 void half_row_to_f32(const uint16_t *h, int64_t n, float *y, bool bf16) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, bf16 ? load_bf16(h + i) : load_f16(h + i));
    if (i < n) {
        __mmask16 m = loom__avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, bf16 ? maskload_bf16(m, h + i) : maskload_f16(m, h + i));
    }
}

static T512 bool avx512_rows_to_f32(loom_type t, const void *x, size_t ldx, int nrows, int64_t n,
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
            avx512_dequant_q8_0((const loom_block_q8_0 *)row, yr, n / LOOM_QK8_0);
            break;
        case LOOM_TYPE_Q4_0:
            avx512_dequant_q4_0((const loom_block_q4_0 *)row, yr, n / LOOM_QK4_0);
            break;
        default:
            return false;
        }
    }
    return true;
}

const loom__cpu_simd loom__cpu_simd_avx512 = {
    .name = "avx512",
    .dot_f32 = avx512_dot_f32,
    .dot_f16 = avx512_dot_f16,
    .dot_bf16 = avx512_dot_bf16,
    .dot_q8_0 = avx512_dot_q8_0,
    .dot_q4_0 = avx512_dot_q4_0,
    .quantize_q8a = avx512_quantize_q8a,
    .gemm_tile = avx512_gemm_tile,
    .gemm_pack_a = avx512_gemm_pack_a,
    .gemm_mr = MR,
    .gemm_nr = NR,
    .qgemm_tile = loom__qgemm_tile_avx512,
    .qgemm_scatter = loom__qgemm_scatter_avx512,
    .qgemm_lut16 = loom__qgemm_lut16_avx2,
    .qgemm_min_n = 16,
    .qgemm_qmax = 128,
    .qgemm_mr = 16,
    .qgemm_nr = 12,
    .vec_add = avx512_vec_add,
    .vec_mul = avx512_vec_mul,
    .vec_scale = avx512_vec_scale,
    .vec_silu = avx512_vec_silu,
    .vec_swiglu = avx512_vec_swiglu,
    .vec_exp_sum = avx512_vec_exp_sum,
    .vec_mad_f32 = avx512_vec_mad_f32,
    .dequant_q8_0 = avx512_dequant_q8_0,
    .dequant_q4_0 = avx512_dequant_q4_0,
    .f16_to_f32 = avx512_f16_to_f32,
    .f32_to_f16 = avx512_f32_to_f16,
    .fa_kq = avx512_fa_kq,
    .fa_pv = avx512_fa_pv,
    .rows_to_f32 = avx512_rows_to_f32,
};

#else /* not x86-64 GCC/Clang: never selected */

const loom__cpu_simd loom__cpu_simd_avx512 = {.name = "scalar"};

#endif
