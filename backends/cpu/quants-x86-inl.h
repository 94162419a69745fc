/*
 * Helpers shared by the hand-written quant dots of quants-avx2.c and quants-avx512.c.
 * Compiled with only the `avx2` target, a subset of both files' targets, so they inline
 * into either.
 */
#ifndef LOOM_CPU_QUANTS_X86_INL_H
#define LOOM_CPU_QUANTS_X86_INL_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>

#define LOOM_QX86_INLINE static inline __attribute__((always_inline, target("avx2")))

/* the sum of the 8 floats of x */
LOOM_QX86_INLINE float hsum8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the 16 six-bit scales of a Q3_K block, minus 32, as int8: low 4 bits of scale j in byte j
 * (j < 8, low nibble) or j - 8 (high nibble), high 2 bits in byte 8 + j % 4 at bit 2 (j / 4). One
 * 16-byte load ending with the 12 packed bytes (the 4 before are the block's last qs): dwords
 * [-, w0, w1, w2]; low parts [w0, w1, w0 >> 4, w1 >> 4] & 0x0f, high parts w2 >> 0, 2, 4, 6 & 3. */
LOOM_QX86_INLINE __m128i q3_scales(const uint8_t *scales) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(scales - 4));
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 1)), _mm_setr_epi32(0, 0, 4, 4)),
        _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(3, 3, 3, 3)), _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}

#endif
#endif /* LOOM_CPU_QUANTS_X86_INL_H */
