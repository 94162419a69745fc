/*
 * AVX-512 (F, BW, VL, VNNI) dot products of every block type beyond Q8_0/Q4_0, for the N = 1
 * matvec (token generation), where the AVX2 kernels (quants-avx2.c) could not keep up with the
 * memory bandwidth on two cores. They replace the AVX2 ones in the AVX-512 table (quants-dot.c).
 * A zmm holds 64 weights: 2-bit fields, nibbles and fifth/high bits of a 32-byte group are
 * broadcast to both 256-bit halves and shifted or rotated per 64-bit lane into place, the
 * non-linear grids looked up with pshufb. Products:
 *   - Q2_K..Q6_K: unsigned fields (Q3_K as q2 | hbit << 2, 0..7, Q6_K as 0..63; their -4 / -32
 *     go through the activations' bsums) times the activations with maddubs (no saturation:
 *     63 * 128 * 2 < 2^15), times the 16-bit sub-block scales (spread with vpermw) summed into
 *     int32 with vpdpwssd;
 *   - IQ4_XS and the 32-element types: unsigned values (grids plus 128, Q5_0 with its +16) times
 *     the activations with vpdpbusd, the offset times the activations' sum taken back (bsums, or
 *     a second vpdpbusd), sub-block scales in int32 (IQ4_XS) or per block in float.
 * Every sum is exactly the integer the portable body (quants-k.c, quants-legacy.c) computes; the
 * float scaling per block is the same, summed in another order.
 */
#include "backends/cpu/quants-dot.h"
#include "backends/cpu/repack.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/quants-x86-inl.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define I512 static inline __attribute__((always_inline)) T512

#define H(h) _cvtsh_ss(h)

/* the 32 bytes at p in both 256-bit halves */
I512 __m512i bcast256(const void *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* int16 lane i -> i / 8: with + 4 j, the sub-block of 16 (of four in a zmm) each maddubs
 * pair of zmm j of a super-block belongs to */
static const uint16_t k_sub16[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* Q2_K/Q3_K: zmm j (0..3) of a super-block holds elements 64 j .. 64 j + 63, i.e. half
 * h = j / 2, 2-bit groups g = 2 (j % 2) and + 1 of the 32 bytes qs[32 h ..]: lanes 0-3 shifted by
 * 2 g, lanes 4-7 by 2 g + 2. */
I512 __m512i k2_shift(int j) {
    const long long s = 4 * (j % 2);
    return _mm512_set_epi64(s + 2, s + 2, s + 2, s + 2, s, s, s, s);
}

/* sum over the 16 sub-blocks of 16 of sc[s] * field . y, fields from get(j) for zmm j */
#define K2_SUMI(sumi, scz, idx, y, get)                                                            \
    do {                                                                                           \
        __m512i s2_[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                      \
            const __m512i p_ = _mm512_maddubs_epi16(get(j), _mm512_loadu_si512((y)->qs + 64 * j)); \
            s2_[j % 2] =                                                                           \
                _mm512_dpwssd_epi32(s2_[j % 2], p_, _mm512_permutexvar_epi16((idx)[j], (scz)));    \
        }                                                                                          \
        (sumi) = _mm512_add_epi32(s2_[0], s2_[1]);                                                 \
    } while (0)

T512 static float dot_q2_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q2_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i base = _mm512_loadu_si512(k_sub16);
    __m512i idx[4], sh[4];
    for (int j = 0; j < 4; j++) {
        idx[j] = _mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j)));
        sh[j] = k2_shift(j);
    }
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m256i mn16 =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f)));
        const __m512i scz =
            _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(0x0f))));
        const __m512i q0 = bcast256(x[b].qs), q1 = bcast256(x[b].qs + 32);
        __m512i sumi = _mm512_setzero_si512();
#define Q2_FIELD(j) _mm512_and_si512(_mm512_srlv_epi64((j) < 2 ? q0 : q1, sh[j]), m3)
        K2_SUMI(sumi, scz, idx, &y[b], Q2_FIELD);
#undef Q2_FIELD
        const __m256i mins =
            _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)y[b].bsums));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[b].d * H(x[b].d)), _mm512_cvtepi32_ps(sumi), acc);
        accm =
            _mm256_fmadd_ps(_mm256_set1_ps(y[b].d * H(x[b].dmin)), _mm256_cvtepi32_ps(mins), accm);
    }
    return _mm512_reduce_add_ps(acc) - hsum8(accm);
}

T512 static float dot_q3_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q3_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
    const __m512i base = _mm512_loadu_si512(k_sub16);
    __m512i idx[4], sh[4], rot[4];
    for (int j = 0; j < 4; j++) {
        idx[j] = _mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j)));
        sh[j] = k2_shift(j);
        /* hmask bit 4 h + g of each byte to bit 2: rotate right by (4 h + g - 2) mod 64 */
        const long long bit = 4 * (j / 2) + 2 * (j % 2);
        rot[j] =
            _mm512_set_epi64((bit + 63) % 64, (bit + 63) % 64, (bit + 63) % 64, (bit + 63) % 64,
                             (bit + 62) % 64, (bit + 62) % 64, (bit + 62) % 64, (bit + 62) % 64);
    }
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m256i sc16 = _mm256_cvtepi8_epi16(q3_scales(x[b].scales));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        const __m512i hm = bcast256(x[b].hmask);
        const __m512i q0 = bcast256(x[b].qs), q1 = bcast256(x[b].qs + 32);
        __m512i sumi = _mm512_setzero_si512();
#define Q3_FIELD(j)                                                                                \
    _mm512_ternarylogic_epi64(_mm512_srlv_epi64((j) < 2 ? q0 : q1, sh[j]), m3,                     \
                              _mm512_and_si512(_mm512_rorv_epi64(hm, rot[j]), m4), 0xea)
        K2_SUMI(sumi, scz, idx, &y[b], Q3_FIELD);
#undef Q3_FIELD
        /* the -4 of every element with its high bit clear: 4 * sum sc[s] * bsums[s] */
        const __m256i off =
            _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[b].bsums));
        sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 2)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[b].d * H(x[b].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

T512 static float dot_iq4_xs(int64_t n, const void *vx, const void *vy) {
    const loom_block_iq4_xs *x = vx;
    const loom_block_q8_K *y = vy;
    /* the grid plus 128, unsigned (1..241), in every 128-bit lane */
    const __m512i tab =
        _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)loom_iq4nl_values)),
                        _mm512_set1_epi8((char)0x80));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* 32 bytes of nibbles (two sub-blocks of 32) -> 64-bit lanes [0, 1, 0, 1, 2, 3, 2, 3], the
     * second copy of each 16 bytes shifted by 4: elements in order */
    const __m512i spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    const __m512i nsh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    const __m256i lsh_lo = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i lsh_hi = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m512i sidx[4];
    for (int t = 0; t < 4; t++)
        sidx[t] = _mm512_set_epi32(2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1,
                                   2 * t + 1, 2 * t + 1, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t,
                                   2 * t, 2 * t);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        uint32_t sl;
        memcpy(&sl, x[b].scales_l, 4);
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), lsh_lo),
                                            _mm256_set1_epi32(0x0f));
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32((int)x[b].scales_h), lsh_hi), _mm256_set1_epi32(3));
        const __m256i ls =
            _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        const __m512i lsz = _mm512_castsi256_si512(ls);
        __m512i sumi = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
            const __m512i v = _mm512_permutexvar_epi64(
                spread,
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * t))));
            const __m512i w =
                _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srlv_epi64(v, nsh), m4));
            const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w,
                                                   _mm512_loadu_si512(y[b].qs + 64 * t));
            sumi = _mm512_add_epi32(sumi,
                                    _mm512_mullo_epi32(dp, _mm512_permutexvar_epi32(sidx[t], lsz)));
        }
        /* 128 * sum ls[s] * (sum of the activations of sub-block s) */
        const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[b].bsums),
                                             _mm256_set1_epi16(1));
        sumi = _mm512_sub_epi32(
            sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_mullo_epi32(bs, ls), 7)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[b].d * H(x[b].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Q4_K/Q5_K scales (bytes 0-7) and mins (8-15), as k4_scales_bytes in quants-avx2.c, from the
 * block's first 16 bytes: dwords [d dmin, w0, w1, w2] -> [w0 & 0x3f.., (w2 & 0x0f..) | (w0 >> 2 &
 * 0x30..), w1 & 0x3f.., (w2 >> 4 & 0x0f..) | (w1 >> 2 & 0x30..)] */
I512 __m128i k4_scales(const void *block) {
    const __m128i v = _mm_loadu_si128((const __m128i *)block);
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)), _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi =
        _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 0, 1, 0)), 2),
                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* int16 lane i -> i / 16: with + 2 c, the sub-block of 32 of each maddubs pair of chunk c */
static const uint16_t k_sub32[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* Q4_K/Q5_K: chunk c (64 elements) is qs[32 c .. 32 c + 31] broadcast to both halves, lanes 4-7
 * shifted by 4 (low nibbles, then high: elements in order); Q5_K's fifth bit of element
 * 64 c + 32 half + l is qh[l] bit 2 c + half, rotated to bit 4 */
I512 float k45_dot(const bool five, int64_t n, const void *vx, const void *vy) {
    const loom_block_q8_K *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m16 = _mm512_set1_epi8(0x10);
    const __m512i nsh = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i base = _mm512_loadu_si512(k_sub32);
    __m512i idx[4], rot[4];
    for (int c = 0; c < 4; c++) {
        idx[c] = _mm512_add_epi16(base, _mm512_set1_epi16((short)(2 * c)));
        const long long lo = (2 * c + 60) % 64, hi = (2 * c + 61) % 64; /* (bit - 4) mod 64 */
        rot[c] = _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);
    }
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead((const char *)vx + b * (five ? sizeof(loom_block_q5_K) : sizeof(loom_block_q4_K)), five ? (int)sizeof(loom_block_q5_K) : (int)sizeof(loom_block_q4_K));
        const loom_block_q4_K *x4 = (const loom_block_q4_K *)vx + b;
        const loom_block_q5_K *x5 = (const loom_block_q5_K *)vx + b;
        const uint8_t *qs = five ? x5->qs : x4->qs;
        const uint16_t d = five ? x5->d : x4->d, dmin = five ? x5->dmin : x4->dmin;
        const __m128i scm = k4_scales(five ? (const void *)x5 : (const void *)x4);
        const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scm));
        const __m512i qh = five ? bcast256(x5->qh) : _mm512_setzero_si512();
        __m512i sumi = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            __m512i u = _mm512_srlv_epi64(bcast256(qs + 32 * c), nsh);
            if (five)
                u = _mm512_ternarylogic_epi64(
                    u, m4, _mm512_and_si512(_mm512_rorv_epi64(qh, rot[c]), m16), 0xea);
            else
                u = _mm512_and_si512(u, m4);
            const __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(y[b].qs + 64 * c));
            sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx[c], scz));
        }
        /* sum of m[s] * (bsums[2 s] + bsums[2 s + 1]), four int32 lanes */
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y[b].bsums),
                                          _mm_loadu_si128((const __m128i *)(y[b].bsums + 8)));
        const __m128i mins = _mm_madd_epi16(bs, _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[b].d * H(d)), _mm512_cvtepi32_ps(sumi), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(y[b].d * H(dmin)), _mm_cvtepi32_ps(mins), accm);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(accm);
}

T512 static float dot_q4_K(int64_t n, const void *vx, const void *vy) {
    return k45_dot(false, n, vx, vy);
}

T512 static float dot_q5_K(int64_t n, const void *vx, const void *vy) {
    return k45_dot(true, n, vx, vy);
}

/* Q6_K: zmm j = 2 h + k holds elements 128 h + 64 k .. + 63: the 64 bytes ql[64 h ..] (low
 * nibbles for k = 0, high for k = 1), or-ed with bits 4 k + 2 half .. + 1 of qh[32 h + l] moved to
 * bits 4-5 (half: which 32 of the 64); q - 32 through bsums */
T512 static float dot_q6_K(int64_t n, const void *vx, const void *vy) {
    const loom_block_q6_K *x = vx;
    const loom_block_q8_K *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m48 = _mm512_set1_epi8(0x30);
    const __m512i base = _mm512_loadu_si512(k_sub16);
    const __m512i shl0 = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
    const __m512i shr1 = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    __m512i idx[4];
    for (int j = 0; j < 4; j++)
        idx[j] = _mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j)));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        loom__cpu_prefetch_ahead(x + b, (int)sizeof *x);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        __m512i sumi = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(x[b].ql + 64 * h);
            const __m512i qh = bcast256(x[b].qh + 32 * h);
            const __m512i u0 = _mm512_ternarylogic_epi64(
                ql, m4, _mm512_and_si512(_mm512_sllv_epi64(qh, shl0), m48), 0xea);
            const __m512i u1 =
                _mm512_ternarylogic_epi64(_mm512_srli_epi16(ql, 4), m4,
                                          _mm512_and_si512(_mm512_srlv_epi64(qh, shr1), m48), 0xea);
            const __m512i p0 = _mm512_maddubs_epi16(u0, _mm512_loadu_si512(y[b].qs + 128 * h));
            const __m512i p1 = _mm512_maddubs_epi16(u1, _mm512_loadu_si512(y[b].qs + 128 * h + 64));
            sumi = _mm512_dpwssd_epi32(sumi, p0, _mm512_permutexvar_epi16(idx[2 * h], scz));
            sumi = _mm512_dpwssd_epi32(sumi, p1, _mm512_permutexvar_epi16(idx[2 * h + 1], scz));
        }
        const __m256i off =
            _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[b].bsums));
        sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[b].d * H(x[b].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* ---------------------------------------------------------------- 32-element blocks */

/* Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, four blocks per step, two per zmm: the nibbles of each block
 * broadcast to a 256-bit half and shifted per 64-bit lane (low nibbles, then high: elements in
 * order), Q5's fifth bits or-ed in from the 64-bit mask of the two qh words, the grids (plus 128,
 * unsigned) looked up with pshufb; vpdpbusd against the activations, minus c * sum(y) (also by
 * vpdpbusd) where the weight carries an offset c (Q5_0: 16, grids: 128). The fp16 scales of the
 * four blocks (and Q4_1/Q5_1 mins, the Q8_1 s) come from one 128-byte window with vpermt2w. The
 * last nblk % 4 blocks go to the AVX2 kernel. */
enum { LG_Q4_1, LG_Q5_0, LG_Q5_1, LG_IQ4_NL, LG_MXFP4, LG_COUNT };

static loom__cpu_qdot_fn lg_tail[LG_COUNT]; /* the AVX2 kernels, set once in qdot_init */

/* word indices (into 64 words from a block group's first byte) of the fp16 fields of four
 * consecutive blocks: x's d (and m), then y's d (and s) */
static const uint16_t lg_xidx[LG_COUNT][32] = {
    [LG_Q4_1] = {0, 1, 10, 11, 20, 21, 30, 31},
    [LG_Q5_0] = {0, 11, 22, 33},
    [LG_Q5_1] = {0, 1, 12, 13, 24, 25, 36, 37},
    [LG_IQ4_NL] = {0, 9, 18, 27},
};
static const uint16_t lg_yidx_q8_0[32] = {0, 17, 34, 51};
static const uint16_t lg_yidx_q8_1[32] = {0, 1, 18, 19, 36, 37, 54, 55};

/* the words idx picks from the `bytes` (64 < bytes, all readable) at p, as floats */
I512 __m256 lg_words(const uint8_t *p, int bytes, const uint16_t *idx) {
    const __m512i lo = _mm512_loadu_si512(p);
    const __mmask32 mh = bytes >= 128 ? 0xffffffffu : (__mmask32)((1u << ((bytes - 64) / 2)) - 1u);
    const __m512i hi = _mm512_maskz_loadu_epi16(mh, p + 64);
    const __m512i w = _mm512_permutex2var_epi16(lo, _mm512_loadu_si512(idx), hi);
    return _mm256_cvtph_ps(_mm512_castsi512_si128(w));
}

I512 __m512i lg_nibbles(const uint8_t *qa, const uint8_t *qb, __m512i nsh, __m512i m4) {
    const __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)), 1);
    return _mm512_and_si512(_mm512_srlv_epi64(v, nsh), m4);
}

I512 uint32_t lg_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the e8m0 halves of MXFP4 (as e8m0_half in quants-legacy.c) of four blocks */
I512 __m128 mx_scales(const uint8_t *x) {
    const __m128i e = _mm_setr_epi32(x[0], x[17], x[34], x[51]);
    const __m128i big = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    const __m128i small = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    return _mm_castsi128_ps(_mm_blendv_epi8(big, small, _mm_cmplt_epi32(e, _mm_set1_epi32(2))));
}

I512 float lg_dot(const int T, int64_t n, const void *vx, const void *vy) {
    static const int SX[] = {20, 22, 24, 18, 17}, QS[] = {4, 6, 8, 2, 1}, QH[] = {0, 2, 4, 0, 0};
    const bool q81 = T == LG_Q4_1 || T == LG_Q5_1, q5 = T == LG_Q5_0 || T == LG_Q5_1;
    const bool grid = T == LG_IQ4_NL || T == LG_MXFP4;
    const int sx = SX[T], sy = q81 ? 36 : 34, yq = q81 ? 4 : 2;
    const int64_t nblk = n / 32, n4 = nblk & ~(int64_t)3;
    const uint8_t *x = vx, *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i nsh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    const __m512i tab = _mm512_add_epi8(
        _mm512_broadcast_i32x4(_mm_loadu_si128(
            (const __m128i *)(T == LG_MXFP4 ? loom_mxfp4_values : loom_iq4nl_values))),
        _mm512_set1_epi8((char)0x80));
    const __m512i cvec = _mm512_set1_epi8(T == LG_Q5_0 ? 16 : (char)0x80);
    /* per-block scale lanes: Q8_1 types hold [d, m] pairs (scale at even lanes), others d */
    const __m512i i0 = q81 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
                           : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i i1 = q81 ? _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4)
                           : _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 corr = _mm256_setzero_ps();
    for (int64_t i = 0; i < n4; i += 4) {
        loom__cpu_prefetch_ahead(x + i * sx, 4 * sx);
        const uint8_t *xb = x + i * sx, *yb = y + i * sy;
        __m512i dp[2];
        _Pragma("GCC unroll 4") for (int h = 0; h < 2; h++) {
            const uint8_t *xa = xb + 2 * h * sx, *xc = xa + sx;
            __m512i u = lg_nibbles(xa + QS[T], xc + QS[T], nsh, m4);
            if (q5) {
                const __mmask64 k = (__mmask64)lg_u32(xa + QH[T]) | (__mmask64)lg_u32(xc + QH[T])
                                                                        << 32;
                u = _mm512_mask_blend_epi8(k, u, _mm512_or_si512(u, _mm512_set1_epi8(0x10)));
            }
            if (grid) u = _mm512_shuffle_epi8(tab, u);
            const uint8_t *ya = yb + 2 * h * sy + yq;
            const __m512i yv =
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)ya)),
                                   _mm256_loadu_si256((const __m256i *)(ya + sy)), 1);
            dp[h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv);
            if (T == LG_Q5_0 || grid)
                dp[h] =
                    _mm512_sub_epi32(dp[h], _mm512_dpbusd_epi32(_mm512_setzero_si512(), cvec, yv));
        }
        __m256 sc;
        if (q81) {
            sc =
                _mm256_mul_ps(lg_words(xb, 4 * sx, lg_xidx[T]), lg_words(yb, 4 * sy, lg_yidx_q8_1));
            corr = _mm256_add_ps(corr, sc);
        } else {
            const __m128 dx = T == LG_MXFP4
                                  ? mx_scales(xb)
                                  : _mm256_castps256_ps128(lg_words(xb, 4 * sx, lg_xidx[T]));
            sc = _mm256_castps128_ps256(
                _mm_mul_ps(dx, _mm256_castps256_ps128(lg_words(yb, 4 * sy, lg_yidx_q8_0))));
        }
        const __m512 scz = _mm512_castps256_ps512(sc);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp[0]), _mm512_permutexvar_ps(i0, scz), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp[1]), _mm512_permutexvar_ps(i1, scz), acc1);
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (q81) { /* the m * s products sit at the odd lanes */
        float c[8];
        _mm256_storeu_ps(c, corr);
        r += (c[1] + c[3]) + (c[5] + c[7]);
    }
    if (n4 < nblk) r += lg_tail[T]((nblk - n4) * 32, x + n4 * sx, y + n4 * sy);
    return r;
}

#define LG_DEF(name, T)                                                                            \
    T512 static float dot_##name(int64_t n, const void *x, const void *y) {                        \
        return lg_dot(T, n, x, y);                                                                 \
    }
LG_DEF(q4_1, LG_Q4_1)
LG_DEF(q5_0, LG_Q5_0)
LG_DEF(q5_1, LG_Q5_1)
LG_DEF(iq4_nl, LG_IQ4_NL)
LG_DEF(mxfp4, LG_MXFP4)

/* ---------------------------------------------------------------- repacked rows (repack.h) */

/* The 16 floats of v summed per 128-bit lane: lane l's four -> out[l] */
I512 void sum_lanes4(__m512 v, float *out) {
    float t[16];
    _mm512_storeu_ps(t, v);
    for (int l = 0; l < 4; l++)
        out[l] = (t[4 * l] + t[4 * l + 1]) + (t[4 * l + 2] + t[4 * l + 3]);
}

/* IQ4_NL, 4 rows: per block 8 bytes of fp16 d, then 4 x 16 nibble bytes, one zmm (128-bit
 * lane l: row l); low nibbles are elements 0-15 against the activations' first 16 bytes
 * (broadcast to every lane), high nibbles 16-31 against the next 16. Grid + 128 unsigned
 * with vpdpbusd, minus 128 x the activations' sum (the same for all rows, one pair of
 * vpdpbusd per block for the 4 rows). */
T512 static void dot4_iq4_nl(int64_t n, const void *vx, const void *vy, float *out) {
    const uint8_t *x = vx;
    const loom_block_q8_0 *y = vy;
    const __m512i tab =
        _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)loom_iq4nl_values)),
                        _mm512_set1_epi8((char)0x80));
    const __m512i m4 = _mm512_set1_epi8(0x0f), c128 = _mm512_set1_epi8((char)0x80);
    const __m512i sidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const int64_t nblk = n / 32;
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t *xb = x + b * 72;
        loom__cpu_prefetch_ahead(xb, 72);
        const __m512i q = _mm512_loadu_si512(xb + 8);
        const __m512i lo = _mm512_shuffle_epi8(tab, _mm512_and_si512(q, m4));
        const __m512i hi = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
        const __m512i ylo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)y[b].qs));
        const __m512i yhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y[b].qs + 16)));
        const __m512i dp = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ylo),
                                               hi, yhi);
        const __m512i cr = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, ylo),
                                               c128, yhi);
        const __m128 dx = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)xb));
        const __m512 sc = _mm512_permutexvar_ps(
            sidx, _mm512_castps128_ps512(_mm_mul_ps(dx, _mm_set1_ps(H(y[b].d)))));
        const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(dp, cr));
        if (b & 1)
            acc1 = _mm512_fmadd_ps(v, sc, acc1);
        else
            acc0 = _mm512_fmadd_ps(v, sc, acc0);
    }
    sum_lanes4(_mm512_add_ps(acc0, acc1), out);
}

/* Q4_K, 4 rows (592-byte group blocks, repack.h): per chunk c, two zmm of nibbles (128-bit
 * lane l: row l's 16 bytes of half h), low nibbles sub-block 2c, high ones 2c + 1; vpdpbusd
 * (nibbles unsigned) against the activations' 16-byte pieces broadcast to every lane gives
 * each row's sub-block sums, times the row's scale (unpacked bytes, spread by vpermd) in
 * int32; the mins times the activations' sub-block sums (bsums) the same way, 4 rows at
 * once. The integers are those of the one-row kernel. */
T512 static void dot4_q4_K(int64_t n, const void *vx, const void *vy, float *out) {
    const uint8_t *x = vx;
    const loom_block_q8_K *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* lane 4 r + i -> r (a row's value in its four lanes), and + 4 */
    const __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i quad4 = _mm512_add_epi32(quad, _mm512_set1_epi32(4));
    /* lane 4 r + i -> 4 t + r: sub-block t (of four) of row r in [sub-block][row] int32 lanes */
    __m512i sidx[4];
    for (int t = 0; t < 4; t++)
        sidx[t] = _mm512_add_epi32(quad, _mm512_set1_epi32(4 * t));
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < n / LOOM_QK_K; b++) {
        const uint8_t *xb = x + b * LOOM__RP_Q4K_GBLK;
        loom__cpu_prefetch_ahead(xb, LOOM__RP_Q4K_GBLK);
        const __m512i sc[2] = {_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(xb + 16))),
                               _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(xb + 32)))};
        const int8_t *yq = y[b].qs;
        __m512i sumi = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            const __m512i q0 = _mm512_loadu_si512(xb + 80 + 128 * c);
            const __m512i q1 = _mm512_loadu_si512(xb + 80 + 128 * c + 64);
            const int8_t *yc = yq + 64 * c;
#define Y16(o) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yc + (o))))
            const __m512i lo = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(q0, m4), Y16(0)),
                _mm512_and_si512(q1, m4), Y16(16));
            const __m512i hi = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                    _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), Y16(32)),
                _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), Y16(48));
#undef Y16
            const int s0 = 2 * c, s1 = 2 * c + 1;
            sumi = _mm512_add_epi32(
                sumi, _mm512_mullo_epi32(lo, _mm512_permutexvar_epi32(sidx[s0 % 4], sc[s0 / 4])));
            sumi = _mm512_add_epi32(
                sumi, _mm512_mullo_epi32(hi, _mm512_permutexvar_epi32(sidx[s1 % 4], sc[s1 / 4])));
        }
        /* sum over sub-blocks s of mn[s][r] * (bsums[2 s] + bsums[2 s + 1]) */
        const __m512i ys = _mm512_castsi256_si512(
            _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[b].bsums), _mm256_set1_epi16(1)));
        const __m512i mp = _mm512_add_epi32(
            _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(xb + 48))),
                               _mm512_permutexvar_epi32(quad, ys)),
            _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(xb + 64))),
                               _mm512_permutexvar_epi32(quad4, ys)));
        const __m256i m8 = _mm256_add_epi32(_mm512_castsi512_si256(mp), _mm512_extracti64x4_epi64(mp, 1));
        const __m128i mr = _mm_add_epi32(_mm256_castsi256_si128(m8), _mm256_extracti128_si256(m8, 1));
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xb)),
                                        _mm256_set1_ps(y[b].d));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi),
                              _mm512_permutexvar_ps(quad, _mm512_castps256_ps512(dd)), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(mr), _mm256_extractf128_ps(dd, 1), accm);
    }
    sum_lanes4(acc, out);
    float m[4];
    _mm_storeu_ps(m, accm);
    for (int l = 0; l < 4; l++)
        out[l] -= m[l];
}

/* Q4_0, 4 rows (IQ4_NL's layout) against a Q8 activation row (cpu-impl.h: d[], s[] =
 * d x sum q, then the integers): nibbles unsigned with vpdpbusd, the - 8 of every weight as
 * 8 x dx x s per block, for the 4 rows in one xmm. */
T512 static void dot4_q4_0(int64_t n, const void *vx, const void *vy, float *out) {
    const uint8_t *x = vx;
    const int64_t nblk = n / 32;
    const float *yd = loom__q8a_d((void *)vy), *ys = loom__q8a_s((void *)vy, nblk);
    const int8_t *yq = loom__q8a_qs((void *)vy, nblk);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i sidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t *xb = x + b * 72;
        loom__cpu_prefetch_ahead(xb, 72);
        const __m512i q = _mm512_loadu_si512(xb + 8);
        const __m512i ylo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yq + 32 * b)));
        const __m512i yhi =
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yq + 32 * b + 16)));
        const __m512i dp = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(q, m4), ylo),
            _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), yhi);
        const __m128 dx = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)xb));
        const __m512 sc =
            _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_mul_ps(dx, _mm_set1_ps(yd[b]))));
        accm = _mm_fmadd_ps(dx, _mm_set1_ps(ys[b]), accm);
        if (b & 1)
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), sc, acc1);
        else
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), sc, acc0);
    }
    sum_lanes4(_mm512_add_ps(acc0, acc1), out);
    float m[4];
    _mm_storeu_ps(m, accm);
    for (int l = 0; l < 4; l++)
        out[l] -= 8.0f * m[l];
}

void loom__cpu_qdot4_avx512(loom__cpu_qdot4_fn *iq4_nl, loom__cpu_qdot4_fn *q4_K,
                            loom__cpu_qdot4_fn *q4_0) {
    *iq4_nl = dot4_iq4_nl;
    *q4_K = dot4_q4_K;
    *q4_0 = dot4_q4_0;
}

void loom__cpu_qdot_avx512(loom__cpu_qdot_set *s) {
    lg_tail[LG_Q4_1] = s->q4_1;
    lg_tail[LG_Q5_0] = s->q5_0;
    lg_tail[LG_Q5_1] = s->q5_1;
    lg_tail[LG_IQ4_NL] = s->iq4_nl;
    lg_tail[LG_MXFP4] = s->mxfp4;
    s->q4_1 = dot_q4_1;
    s->q5_0 = dot_q5_0;
    s->q5_1 = dot_q5_1;
    s->iq4_nl = dot_iq4_nl;
    s->mxfp4 = dot_mxfp4;
    s->q2_K = dot_q2_K;
    s->q4_K = dot_q4_K;
    s->q5_K = dot_q5_K;
    s->q6_K = dot_q6_K;
    s->q3_K = dot_q3_K;
    s->iq4_xs = dot_iq4_xs;
}
#else
void loom__cpu_qdot_avx512(loom__cpu_qdot_set *s) {
    (void)s;
}

void loom__cpu_qdot4_avx512(loom__cpu_qdot4_fn *iq4_nl, loom__cpu_qdot4_fn *q4_K,
                            loom__cpu_qdot4_fn *q4_0) {
    *iq4_nl = NULL;
    *q4_K = NULL;
    *q4_0 = NULL;
}
#endif
