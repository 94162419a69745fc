/*
 * The int8 GEMM micro-kernels: AVX-512 VNNI, and an AVX2 one (end of file). The AVX-512
 * kernel (AVX-512 VNNI) over the canonical panels of qgemm.h: a
 * register tile of QG_MR = 16 rows (one zmm, one int32 lane per row) by QG_NR = 12
 * columns. Per 32-element block: the int32 accumulators start at the weights' corr (which
 * cancels the +128 bias of the u8 activations), 8 vpdpbusd per column add four k each,
 * then one convert and one FMA per column fold the block into float accumulators with
 * d * db (and, for types with a min, one more FMA with mn * s). Types with 16-element
 * scales fold each half of the block (4 vpdpbusd per column) on its own.
 */
#include "backends/cpu/qgemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/avx512-inl.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define I512 static inline __attribute__((always_inline)) T512

enum { QG_MR = 16, QG_NR = 12 };

I512 void qg_tile(int64_t nblk, const char *ap, const char *bp, float *c, size_t ldc, int first,
                  int mvalid, int nvalid, const int has_min, const int H) {
    const size_t ablk = loom__qg_ablk_bytes(QG_MR, H), bblk = loom__qg_bblk_bytes(QG_NR);
    __m512 acc[QG_NR];
    _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++, ap += ablk, bp += bblk) {
        const float *bd = (const float *)(bp + loom__qg_b_d(QG_NR));
        _Pragma("GCC unroll 2") for (int h = 0; h < H; h++) {
            const __m512i corr = _mm512_load_si512(ap + loom__qg_a_corr(QG_MR, H, h));
            __m512i iacc[QG_NR];
            _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) iacc[j] = corr;
            _Pragma("GCC unroll 8") for (int g = h * 8 / H; g < (h + 1) * 8 / H; g++) {
                const __m512i a = _mm512_load_si512(ap + 64 * g);
                const char *bg = bp + 4 * QG_NR * g;
                _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) {
                    int32_t w;
                    memcpy(&w, bg + 4 * j, 4);
                    iacc[j] = _mm512_dpbusd_epi32(iacc[j], _mm512_set1_epi32(w), a);
                }
            }
            const __m512 da = _mm512_load_ps((const float *)(ap + loom__qg_a_d(QG_MR, H, h)));
            _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) acc[j] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(iacc[j]), _mm512_mul_ps(da, _mm512_set1_ps(bd[j])), acc[j]);
            if (has_min) {
                const __m512 mn = _mm512_load_ps((const float *)(ap + loom__qg_a_mn(QG_MR, H, h)));
                const float *bs = (const float *)(bp + (H == 1 ? loom__qg_b_s(QG_NR)
                                                               : loom__qg_b_shalf(QG_NR, h)));
                _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) acc[j] =
                    _mm512_fmadd_ps(mn, _mm512_set1_ps(bs[j]), acc[j]);
            }
        }
    }
    const __mmask16 m = loom__avx512_tail_mask(mvalid);
    _Pragma("GCC unroll 12") for (int j = 0; j < QG_NR; j++) {
        if (j >= nvalid) break;
        float *cj = c + j * ldc;
        if (!first) acc[j] = _mm512_add_ps(acc[j], _mm512_maskz_loadu_ps(m, cj));
        _mm512_mask_storeu_ps(cj, m, acc[j]);
    }
}

T512 void loom__qgemm_tile_avx512(int64_t nblk, const void *ap, const void *bp, float *c,
                                  size_t ldc, int first, int has_min, int halves, int mvalid,
                                  int nvalid) {
    if (halves == 2) {
        if (has_min)
            qg_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 1, 2);
        else
            qg_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 0, 2);
    } else if (has_min) {
        qg_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 1, 1);
    } else {
        qg_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 0, 1);
    }
}

/* The A-panel scatter for mr = 16: per block the 16 rows' 32 bytes as a 16 x 8 matrix of
 * dwords, transposed (two 8 x 8 transposes, rows 0-7 and 8-15 in the two 256-bit halves)
 * so that dword g of every row lands in lane i of zmm g; corr from a vpdpbusd with ones;
 * d and mn gathered. Other mr: the portable scatter. */
T512 void loom__qgemm_scatter_avx512(const int8_t *q, const float *d, const float *mn, int mr,
                                     int halves, int64_t nblk, void *panel) {
    if (mr != QG_MR) {
        loom__qg_scatter_portable(q, d, mn, mr, halves, nblk, panel);
        return;
    }
    const int H = halves;
    const size_t ablk = loom__qg_ablk_bytes(QG_MR, H), qrow = (size_t)(32 * nblk);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i rowf =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32((int)(2 * nblk)));
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0),
                  hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int64_t b = 0; b < nblk; b++) {
        char *pb = (char *)panel + (size_t)b * ablk;
        __m512i z[8], t[8], u[8], o[8];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            const int8_t *r0 = q + (size_t)i * qrow + 32 * b, *r1 = r0 + 8 * qrow;
            z[i] =
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)),
                                   _mm256_loadu_si256((const __m256i *)r1), 1);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
        }
        _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
            u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        /* u[c] (c < 4): columns c and c + 4 of rows 0-3 / 8-11; u[c + 4]: of rows 4-7 / 12-15 */
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            o[c] = _mm512_permutex2var_epi64(u[c], lo, u[c + 4]);
            o[c + 4] = _mm512_permutex2var_epi64(u[c], hi, u[c + 4]);
        }
        __m512i sum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            _mm512_store_si512(pb + 64 * g, o[g]);
            sum[H == 2 && g >= 4] = _mm512_dpbusd_epi32(sum[H == 2 && g >= 4], ones, o[g]);
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < H; h++) {
            const __m512i corr =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum[h], 7));
            _mm512_store_si512(pb + loom__qg_a_corr(QG_MR, H, h), corr);
            _mm512_store_ps(pb + loom__qg_a_d(QG_MR, H, h),
                            _mm512_i32gather_ps(rowf, d + H * b + h, 4));
            _mm512_store_ps(pb + loom__qg_a_mn(QG_MR, H, h),
                            _mm512_i32gather_ps(rowf, mn + H * b + h, 4));
        }
    }
}

/* ---------------------------------------------------------------- AVX2 */

#define T256 __attribute__((target("avx2,fma,f16c")))
#define I256 static inline __attribute__((always_inline)) T256

enum { QG2_MR = 8, QG2_NR = 4 };

/* The AVX2 tile, 8 rows (one ymm) by 4 columns: vpmaddubsw (u8 activations x s8 weights,
 * pairs summed in int16) then vpmaddwd with ones (four k per int32 lane, as vpdpbusd).
 * The int16 pair sums cannot saturate for weights with |q| <= 64 (2 * 255 * 64 < 2^15),
 * which is why this table covers only those types (loom__qg_type.qmax). */
I256 void qg2_tile(int64_t nblk, const char *ap, const char *bp, float *c, size_t ldc, int first,
                   int mvalid, int nvalid, const int has_min, const int H) {
    const size_t ablk = loom__qg_ablk_bytes(QG2_MR, H), bblk = loom__qg_bblk_bytes(QG2_NR);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QG2_NR];
    _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++, ap += ablk, bp += bblk) {
        const float *bd = (const float *)(bp + loom__qg_b_d(QG2_NR));
        _Pragma("GCC unroll 2") for (int h = 0; h < H; h++) {
            const __m256i corr =
                _mm256_load_si256((const __m256i *)(ap + loom__qg_a_corr(QG2_MR, H, h)));
            __m256i iacc[QG2_NR];
            _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) iacc[j] = corr;
            _Pragma("GCC unroll 8") for (int g = h * 8 / H; g < (h + 1) * 8 / H; g++) {
                const __m256i a = _mm256_load_si256((const __m256i *)(ap + 32 * g));
                const char *bg = bp + 4 * QG2_NR * g;
                _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) {
                    int32_t w;
                    memcpy(&w, bg + 4 * j, 4);
                    const __m256i p16 = _mm256_maddubs_epi16(_mm256_set1_epi32(w), a);
                    iacc[j] = _mm256_add_epi32(iacc[j], _mm256_madd_epi16(p16, ones));
                }
            }
            const __m256 da = _mm256_load_ps((const float *)(ap + loom__qg_a_d(QG2_MR, H, h)));
            _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) acc[j] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(iacc[j]), _mm256_mul_ps(da, _mm256_set1_ps(bd[j])), acc[j]);
            if (has_min) {
                const __m256 mn = _mm256_load_ps((const float *)(ap + loom__qg_a_mn(QG2_MR, H, h)));
                const float *bs = (const float *)(bp + (H == 1 ? loom__qg_b_s(QG2_NR)
                                                               : loom__qg_b_shalf(QG2_NR, h)));
                _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) acc[j] =
                    _mm256_fmadd_ps(mn, _mm256_set1_ps(bs[j]), acc[j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < QG2_NR; j++) {
        if (j >= nvalid) break;
        float *cj = c + j * ldc;
        if (mvalid == QG2_MR) {
            if (!first) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(cj));
            _mm256_storeu_ps(cj, acc[j]);
            continue;
        }
        float t[QG2_MR];
        _mm256_storeu_ps(t, acc[j]);
        for (int i = 0; i < mvalid; i++)
            cj[i] = first ? t[i] : cj[i] + t[i];
    }
}

T256 void loom__qgemm_tile_avx2(int64_t nblk, const void *ap, const void *bp, float *c, size_t ldc,
                                int first, int has_min, int halves, int mvalid, int nvalid) {
    if (halves == 2) {
        if (has_min)
            qg2_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 1, 2);
        else
            qg2_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 0, 2);
    } else if (has_min) {
        qg2_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 1, 1);
    } else {
        qg2_tile(nblk, ap, bp, c, ldc, first, mvalid, nvalid, 0, 1);
    }
}

/* The table unpack of IQ4_NL, IQ4_XS and MXFP4 (loom__qgemm_lut16_fn): per block one
 * 16-byte load, the nibbles split with a mask and a shift, and two pshufb through the
 * table. */
T256 void loom__qgemm_lut16_avx2(const uint8_t *qs, size_t stride, int64_t n, const int8_t *lut,
                                 int8_t *q) {
    const __m128i tab = _mm_loadu_si128((const __m128i *)lut), m4 = _mm_set1_epi8(0x0f);
    for (int64_t i = 0; i < n; i++, qs += stride, q += 32) {
        const __m128i x = _mm_loadu_si128((const __m128i *)qs);
        _mm_storeu_si128((__m128i *)q, _mm_shuffle_epi8(tab, _mm_and_si128(x, m4)));
        _mm_storeu_si128((__m128i *)(q + 16),
                         _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(x, 4), m4)));
    }
}

#endif
