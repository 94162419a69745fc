/*
 * AVX-512F register helpers shared by the AVX-512 kernel files (simd-avx512.c, the
 * AVX512_BF16 GEMM in gemm-bf16.c). Each is compiled with only the `avx512f` target, a
 * subset of every caller's, so it inlines into functions with wider targets.
 */
#ifndef LOOM_CPU_AVX512_INL_H
#define LOOM_CPU_AVX512_INL_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define LOOM_AVX512F_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* The mask of the first min(n, 16) lanes (n >= 0). */
LOOM_AVX512F_INLINE __mmask16 loom__avx512_tail_mask(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1u);
}

/* 16 x 16 transpose of 32-bit words in registers: r[i] lane j <-> r[j] lane i. */
LOOM_AVX512F_INLINE void loom__avx512_transpose16(__m512i r[16]) {
    __m512i t[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0x88);
            t[8 * h + i + 4] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0xdd);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Writes a 32-row register tile (c0: rows 0-15, c1: rows 16-31; nr columns, the caller's
 * constant) to c[j * ldc + i] for j < nvalid, i < mvalid, adding what c holds unless
 * `first`; a full-height tile without masks. */
LOOM_AVX512F_INLINE void loom__avx512_store_tile32(float *c, size_t ldc, __m512 *c0, __m512 *c1,
                                                   int nr, int first, int mvalid, int nvalid) {
    if (mvalid >= 32) {
        _Pragma("GCC unroll 12") for (int j = 0; j < nr; j++) {
            if (j >= nvalid) break;
            float *cj = c + j * ldc;
            if (!first) {
                c0[j] = _mm512_add_ps(c0[j], _mm512_loadu_ps(cj));
                c1[j] = _mm512_add_ps(c1[j], _mm512_loadu_ps(cj + 16));
            }
            _mm512_storeu_ps(cj, c0[j]);
            _mm512_storeu_ps(cj + 16, c1[j]);
        }
        return;
    }
    const __mmask16 m0 = loom__avx512_tail_mask(mvalid),
                    m1 = loom__avx512_tail_mask(mvalid > 16 ? mvalid - 16 : 0);
    _Pragma("GCC unroll 12") for (int j = 0; j < nr; j++) {
        if (j >= nvalid) break;
        float *cj = c + j * ldc;
        if (!first) {
            c0[j] = _mm512_add_ps(c0[j], _mm512_maskz_loadu_ps(m0, cj));
            c1[j] = _mm512_add_ps(c1[j], _mm512_maskz_loadu_ps(m1, cj + 16));
        }
        _mm512_mask_storeu_ps(cj, m0, c0[j]);
        _mm512_mask_storeu_ps(cj + 16, m1, c1[j]);
    }
}

#endif
#endif /* LOOM_CPU_AVX512_INL_H */
