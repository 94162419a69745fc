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

#endif
#endif /* LOOM_CPU_AVX512_INL_H */
