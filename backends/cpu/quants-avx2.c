/*
 * AVX2 dot products of the block types beyond Q8_0/Q4_0 (the AVX-512 table uses them too):
 * Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 against Q8_0/Q8_1 activations and Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_XS against Q8_K, written with intrinsics: nibbles split with a mask and a
 * shift, 2-bit fields with shifts, the Q5 fifth bits expanded from the 32-bit qh with a byte
 * shuffle, the non-linear grids looked up with pshufb, unsigned x signed byte products with maddubs
 * (signed x signed through the sign trick: |x| * sign(y, x)), integer sub-block scales applied with
 * madd in int32, and one float scale per block. Each function computes exactly what its portable
 * body in quants-legacy.c / quants-k.c computes (the ops suite checks both against the same
 * reference).
 */
#include "backends/cpu/quants-dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/quants-x86-inl.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* fp16 -> f32 with F16C (exact, like loom__fp16_to_fp32) */
#define H(h) _cvtsh_ss(h)

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31) */
AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* bit j of the little-endian u32 at p -> byte j = 0xff when set */
AVX2 static inline __m256i bits32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* unsigned x (bytes) . signed y (bytes): 8 int32 sums of 4 products each */
AVX2 static inline __m256i dot_us(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

/* signed x . signed y */
AVX2 static inline __m256i dot_ss(__m256i x, __m256i y) {
    return dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

AVX2 static inline __m256i load32(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

AVX2 static float dot_q4_1(int64_t n, const void *vx, const void *vy) {
    const loom_block_q4_1 *x = vx;
    const loom_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m256i p = dot_us(nibbles32(x[b].qs), load32(y[b].qs));
        const float d = H(x[b].d) * H(y[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        summ += H(x[b].m) * H(y[b].s);
    }
    return hsum8(acc) + summ;
}

AVX2 static float dot_q5_1(int64_t n, const void *vx, const void *vy) {
    const loom_block_q5_1 *x = vx;
    const loom_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        __m256i q = _mm256_or_si256(nibbles32(x[b].qs),
                                    _mm256_and_si256(bits32(x[b].qh), _mm256_set1_epi8(0x10)));
        const __m256i p = dot_us(q, load32(y[b].qs));
        const float d = H(x[b].d) * H(y[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        summ += H(x[b].m) * H(y[b].s);
    }
    return hsum8(acc) + summ;
}

AVX2 static float dot_q5_0(int64_t n, const void *vx, const void *vy) {
    const loom_block_q5_0 *x = vx;
    const loom_block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        __m256i q = _mm256_or_si256(nibbles32(x[b].qs),
                                    _mm256_and_si256(bits32(x[b].qh), _mm256_set1_epi8(0x10)));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        const __m256i p = dot_ss(q, load32(y[b].qs));
        const float d = H(x[b].d) * H(y[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum8(acc);
}

AVX2 static inline __m256i grid_table(const int8_t *values) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
}

AVX2 static float dot_iq4_nl(int64_t n, const void *vx, const void *vy) {
    const loom_block_iq4_nl *x = vx;
    const loom_block_q8_0 *y = vy;
    const __m256i tab = grid_table(loom_iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m256i q = _mm256_shuffle_epi8(tab, nibbles32(x[b].qs));
        const __m256i p = dot_ss(q, load32(y[b].qs));
        const float d = H(x[b].d) * H(y[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum8(acc);
}

AVX2 static float dot_mxfp4(int64_t n, const void *vx, const void *vy) {
    const loom_block_mxfp4 *x = vx;
    const loom_block_q8_0 *y = vy;
    const __m256i tab = grid_table(loom_mxfp4_values);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m256i q = _mm256_shuffle_epi8(tab, nibbles32(x[b].qs));
        const __m256i p = dot_ss(q, load32(y[b].qs));
        const uint8_t e = x[b].e;
        const float de = loom__f32_from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
        const float d = de * H(y[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum8(acc);
}

/* The 8 scales and 8 mins of a Q4_K/Q5_K block, with word operations on its 12 packed bytes
 * (little-endian): bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes
 * 4-7 the same for the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7
 * (high nibble). (w >> 2) & 0x30 per byte moves a byte's bits 6-7 to bits 4-5. */
static inline void k4_scales_bytes(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t w[3], u[4];
    memcpy(w, q, sizeof w);
    u[0] = w[0] & 0x3f3f3f3fu;
    u[1] = (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u);
    u[2] = w[1] & 0x3f3f3f3fu;
    u[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u);
    memcpy(sc, u, 8);
    memcpy(m, u + 2, 8);
}

/* sum over the 8 sub-blocks of 32 of m[s] * (bsums[2s] + bsums[2s + 1]), with SSE: pairwise sums of
 * the 16 bsums (|sum| <= 4096 fits int16), times the 8 mins, summed (exact, as the scalar loop). */
AVX2 static inline int k4_mins_simd(const uint8_t m[8], const int16_t *bsums) {
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                      _mm_loadu_si128((const __m128i *)(bsums + 8)));
    const __m128i mv = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
    __m128i pr = _mm_madd_epi16(bs, mv);
    pr = _mm_add_epi32(pr, _mm_shuffle_epi32(pr, 0x4e));
    pr = _mm_add_epi32(pr, _mm_shuffle_epi32(pr, 0xb1));
    return _mm_cvtsi128_si32(pr);
}

/* Q4_K and Q5_K (five: the fifth bit of element 64 j + l is qh[l] bit 2 j for the low half,
 * 2 j + 1 for the high), one body instantiated for each */
AVX2 static inline __attribute__((always_inline)) float k45_dot(const bool five, int64_t n,
                                                                const void *vx, const void *vy) {
    const loom_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead((const char *)vx + b * (five ? sizeof(loom_block_q5_K) : sizeof(loom_block_q4_K)), five ? (int)sizeof(loom_block_q5_K) : (int)sizeof(loom_block_q4_K));
        const loom_block_q4_K *x4 = (const loom_block_q4_K *)vx + b;
        const loom_block_q5_K *x5 = (const loom_block_q5_K *)vx + b;
        const uint8_t *qs = five ? x5->qs : x4->qs;
        const uint16_t d = five ? x5->d : x4->d, dmin = five ? x5->dmin : x4->dmin;
        uint8_t sc[8], m[8];
        k4_scales_bytes(five ? x5->scales : x4->scales, sc, m);
        const __m256i qh = five ? load32(x5->qh) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int j = 0; j < 4; j++) {
            const __m256i q4 = load32(qs + 32 * j);
            __m256i lo = _mm256_and_si256(q4, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            if (five) {
                lo = _mm256_or_si256(
                    lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
                hi = _mm256_or_si256(
                    hi,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
            }
            const __m256i plo = _mm256_maddubs_epi16(lo, load32(y[b].qs + 64 * j));
            const __m256i phi = _mm256_maddubs_epi16(hi, load32(y[b].qs + 64 * j + 32));
            sumi =
                _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)sc[2 * j])));
            sumi = _mm256_add_epi32(
                sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[b].d * H(d)), _mm256_cvtepi32_ps(sumi), acc);
        accm += y[b].d * H(dmin) * (float)k4_mins_simd(m, y[b].bsums);
    }
    return hsum8(acc) - accm;
}

AVX2 static float dot_q4_K(int64_t n, const void *vx, const void *vy) {
    return k45_dot(false, n, vx, vy);
}

AVX2 static float dot_q5_K(int64_t n, const void *vx, const void *vy) {
    return k45_dot(true, n, vx, vy);
}

AVX2 static float dot_q6_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q6_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qhp = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            const __m256i l0 = load32(ql), l1 = load32(ql + 32), qh = load32(qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            _Pragma("GCC unroll 8") for (int g = 0; g < 4; g++) {
                const __m256i xs = _mm256_sub_epi8(q[g], off);
                const __m256i yv = load32(y[b].qs + 128 * h + 32 * g);
                const __m256i p =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(xs, xs), _mm256_sign_epi8(yv, xs));
                /* elements 0..15 of the group in the low 128 bits, 16..31 in the high */
                const __m256i s =
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        const float d = y[b].d * H(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

AVX2 static float dot_iq4_xs(int64_t n, const void *vx, const void *vy) {
    const loom_block_iq4_xs *x = vx;
    const loom_block_q8_K *y = vy;
    const __m256i tab = grid_table(loom_iq4nl_values);
    const __m256i lsh_lo = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i lsh_hi = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        __m256i sumi = _mm256_setzero_si256();
        /* the 8 six-bit scales minus 32: low 4 bits at bit 4 s of scales_l, high 2 at 2 s of
         * scales_h */
        uint32_t sl;
        memcpy(&sl, x[b].scales_l, 4);
        int32_t lsv[8];
        _mm256_storeu_si256(
            (__m256i *)lsv,
            _mm256_sub_epi32(
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), lsh_lo),
                                     _mm256_set1_epi32(0x0f)),
                    _mm256_slli_epi32(
                        _mm256_and_si256(
                            _mm256_srlv_epi32(_mm256_set1_epi32((int)x[b].scales_h), lsh_hi),
                            _mm256_set1_epi32(3)),
                        4)),
                _mm256_set1_epi32(32)));
        for (int s = 0; s < 8; s++) {
            const int ls = lsv[s];
            const __m256i q = _mm256_shuffle_epi8(tab, nibbles32(x[b].qs + 16 * s));
            const __m256i yv = load32(y[b].qs + 32 * s);
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
        }
        const float d = y[b].d * H(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

AVX2 static inline int hsum8i(__m256i x) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Q2_K/Q3_K: element 128 h + 32 g + l is (qs[32 h + l] >> 2 g) & 3; its 16-element
 * sub-block is 8 h + 2 g (l < 16) or 8 h + 2 g + 1 */
AVX2 static inline __m256i k2_scales(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

AVX2 static float dot_q2_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q2_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0.0f;
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const uint8_t *sc = x[b].scales;
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int h = 0; h < 2; h++) {
            const __m256i q2 = load32(x[b].qs + 32 * h);
            _Pragma("GCC unroll 8") for (int g = 0; g < 4; g++) {
                const int sb = 8 * h + 2 * g;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * g), m2);
                const __m256i p = _mm256_maddubs_epi16(q, load32(y[b].qs + 128 * h + 32 * g));
                sumi = _mm256_add_epi32(
                    sumi, _mm256_madd_epi16(p, k2_scales(sc[sb] & 0x0f, sc[sb + 1] & 0x0f)));
            }
        }
        const __m128i s8 = _mm_loadu_si128((const __m128i *)sc);
        const __m256i mn16 =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f)));
        const int summ =
            hsum8i(_mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)y[b].bsums)));
        const float d = y[b].d * H(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm += y[b].d * H(x[b].dmin) * (float)summ;
    }
    return hsum8(acc) - accm;
}

AVX2 static float dot_q3_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q3_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, q3_scales(x[b].scales));
        const __m256i hm = load32(x[b].hmask);
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int h = 0; h < 2; h++) {
            const __m256i q2 = load32(x[b].qs + 32 * h);
            _Pragma("GCC unroll 8") for (int g = 0; g < 4; g++) {
                const int sb = 8 * h + 2 * g;
                /* q - 4 unless hmask[l] bit 4 h + g is set */
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + g), one);
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * g), m2);
                q = _mm256_sub_epi8(_mm256_or_si256(q, _mm256_slli_epi16(hb, 2)), four);
                const __m256i yv = load32(y[b].qs + 128 * h + 32 * g);
                const __m256i p =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, k2_scales(sc[sb], sc[sb + 1])));
            }
        }
        const float d = y[b].d * H(x[b].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

void loom__cpu_qdot_avx2(loom__cpu_qdot_set *s) {
    s->q2_K = dot_q2_K;
    s->q3_K = dot_q3_K;
    s->q4_1 = dot_q4_1;
    s->q5_0 = dot_q5_0;
    s->q5_1 = dot_q5_1;
    s->iq4_nl = dot_iq4_nl;
    s->mxfp4 = dot_mxfp4;
    s->q4_K = dot_q4_K;
    s->q5_K = dot_q5_K;
    s->q6_K = dot_q6_K;
    s->iq4_xs = dot_iq4_xs;
}
/* ---------------------------------------------------------------- activation quantisers */

/* The activation rows of the dots above (Q8_0, Q8_1, Q8_K), byte for byte what the types'
 * from_float (core/) writes: the same maxima, the same float operations per element (cvtps
 * rounds to nearest even like lrintf; roundf's half away from zero rebuilt from the truncation),
 * int8 saturation as the clamp. */

AVX2 static inline float hmax8(__m256 x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 int32 (four vectors, in order) -> 32 int8 with saturation, in order */
AVX2 static inline void pack32(__m256i a, __m256i b, __m256i c, __m256i d, int8_t *out) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256((__m256i *)out,
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

AVX2 static inline __m256 absmax32(const float *x, const __m256 sign) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 32; j += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    return m;
}

/* roundf: half away from zero */
AVX2 static inline __m256i roundf8(__m256 v, __m256 sign) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    return _mm256_cvtps_epi32(_mm256_add_ps(t, up));
}

AVX2 static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    loom_block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        if (loom__any_nonfinite(x, 32)) { /* as the portable one: NaN scale, zero quants */
            y[b].d = 0x7e00;
            memset(y[b].qs, 0, 32);
            continue;
        }
        const float amax = hmax8(absmax32(x, sign));
        const float d = amax / 127.0f;
        y[b].d = loom__fp32_to_fp16(d);
        if (d == 0.0f) {
            memset(y[b].qs, 0, 32);
            continue;
        }
        const __m256 vd = _mm256_set1_ps(d);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = roundf8(_mm256_div_ps(_mm256_loadu_ps(x + 8 * j), vd), sign);
        pack32(q[0], q[1], q[2], q[3], y[b].qs);
    }
}

AVX2 static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    loom_block_q8_1 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        if (loom__any_nonfinite(x, 32)) { /* as the portable one: NaN scale and sum */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = y[b].s = 0x7e00;
            continue;
        }
        const float amax = hmax8(absmax32(x, sign));
        const float d = amax / 127.0f, id1 = d ? 1.0f / d : 0.0f;
        const float id = isfinite(id1) ? id1 : 0.0f; /* as the portable one */
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid));
        pack32(q[0], q[1], q[2], q[3], y[b].qs);
        const int sum =
            hsum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        y[b].d = loom__fp32_to_fp16(d);
        y[b].s = loom__fp32_to_fp16(d * (float)sum);
    }
}

AVX2 static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    loom_block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        if (loom__any_nonfinite(x, LOOM_QK_K)) { /* as the portable one: NaN scale */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = NAN;
            continue;
        }
        __m256 mv = _mm256_setzero_ps();
        for (int j = 0; j < LOOM_QK_K; j += 32)
            mv = _mm256_max_ps(mv, absmax32(x + j, sign));
        const float amax = hmax8(mv);
        if (amax == 0.0f || !isfinite(127.0f / amax)) { /* as the portable one */
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* the first x of largest |x|, sign kept */
        const __m256 va = _mm256_set1_ps(amax);
        float m = 0.0f;
        for (int j = 0; j < LOOM_QK_K; j += 8) {
            const int k = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
            if (k) {
                m = x[j + __builtin_ctz((unsigned)k)];
                break;
            }
        }
        const float iscale = -127.0f / m;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < LOOM_QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k)));
            pack32(q[0], q[1], q[2], q[3], y[b].qs + j);
            /* the unclamped values sum as the stored ones: |iscale x| <= 127 */
            y[b].bsums[j / 16] = (int16_t)hsum8i(_mm256_add_epi32(q[0], q[1]));
            y[b].bsums[j / 16 + 1] = (int16_t)hsum8i(_mm256_add_epi32(q[2], q[3]));
        }
        y[b].d = 1.0f / iscale;
    }
}

loom__cpu_qact_fn loom__cpu_qact_avx2(loom_type t) {
    switch (t) {
    case LOOM_TYPE_Q8_0:
        return quantize_q8_0;
    case LOOM_TYPE_Q8_1:
        return quantize_q8_1;
    case LOOM_TYPE_Q8_K:
        return quantize_q8_K;
    default:
        return NULL;
    }
}
#else
void loom__cpu_qdot_avx2(loom__cpu_qdot_set *s) {
    (void)s;
}
loom__cpu_qact_fn loom__cpu_qact_avx2(loom_type t) {
    (void)t;
    return NULL;
}
#endif
