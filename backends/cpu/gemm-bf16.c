/*
 * The BF16 GEMM of MUL_MAT with BF16 weights (AVX512_BF16, `vdpbf16ps`): the BGEMM path
 * of ops-matmul.c.
 *
 * b (f32 activations) is rounded once per matmul to bf16 (round to nearest even, as the
 * reference engines' vec_dot_type for BF16 weights) and packed into NR-wide panels of
 * k pairs, uint32 bp[K/2][NR] (low half k even, high half k odd; an odd K's last pair
 * has a zero high half), shared by all threads. Each thread packs MC x KC blocks of a
 * (already bf16: no conversion, a 32-bit transpose) into MR-wide panels uint32
 * ap[kc/2][MR] and runs the MR x NR micro-kernel: per k pair two A loads, NR broadcasts of
 * one b pair and 2 NR `vdpbf16ps` (each lane: c += a_k b_k + a_k+1 b_k+1, the bf16
 * products exact in f32). Loop order and work units are the F32 GEMM's.
 *
 * `vdpbf16ps` treats bf16 subnormal inputs as zero and flushes subnormal results (DAZ/FTZ,
 * round to nearest even); see backends/cpu/README.md for the accuracy choice.
 *
 * Also the BDOT path (fewer columns than the GEMM takes, token generation): b's rows are
 * rounded to bf16 once per matmul the same way, and each weight row is dotted with up to
 * four of them by `vdpbf16ps` straight from memory (loom__cpu_bdot): 64 bytes of weights
 * per instruction instead of a widening, a shift and an FMA per 16 elements.
 */
#include <stdlib.h>

#include "backends/cpu/cpu-impl.h"

enum {
    BG_MR = 32, /* rows of a per tile: two zmm of 16 f32 lanes */
    BG_NR = 12, /* columns per tile: 24 accumulators */
    BG_KC = 256,
    BG_MC = 256,
};

static int64_t bg_ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static bool bgemm_enabled(void) {
    const char *e = getenv("LOOM_CPU_BGEMM");
    return !(e && e[0] == '0');
}

bool loom__cpu_has_avx512bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return loom__cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

bool loom__cpu_bgemm_usable(const loom_tensor *dst, const loom__cpu_simd *simd) {
    const loom_tensor *a = dst->src[0];
    return a->type == LOOM_TYPE_BF16 && a->nb[0] == sizeof(uint16_t) &&
           simd == &loom__cpu_simd_avx512 && loom__cpu_has_avx512bf16() && bgemm_enabled();
}

loom__cpu_work loom__cpu_bgemm_work(const loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t K = a->ne[0], N = b->ne[1];
    const int64_t npan = bg_ceil_div(N, BG_NR), kp = bg_ceil_div(K, 2);
    loom__cpu_work w;
    w.shared = (size_t)(npan * b->ne[2] * b->ne[3]) * (size_t)kp * BG_NR * sizeof(uint32_t);
    w.per_thread = (size_t)BG_MC * (BG_KC / 2) * sizeof(uint32_t) + 64;
    return w;
}

size_t loom__cpu_bdot_row_elems(int64_t K) {
    return (size_t)((K + 31) & ~(int64_t)31); /* whole 64-byte lines per row */
}

void loom__cpu_bdot_round_row(const char *row, size_t nb0, int64_t K, uint16_t *out) {
    const size_t n = loom__cpu_bdot_row_elems(K);
    for (int64_t k = 0; k < K; k++) {
        float x;
        memcpy(&x, row + k * (int64_t)nb0, sizeof x);
        out[k] = loom__fp32_to_bf16(x);
    }
    for (size_t k = (size_t)K; k < n; k++)
        out[k] = 0;
}

/* One bf16 pair (k, k + 1) of b's row; k + 1 == K: a zero high half. */
static uint32_t b_pair(const char *row, size_t nb0, int64_t k, int64_t K) {
    float x[2] = {0.0f, 0.0f};
    memcpy(&x[0], row + k * (int64_t)nb0, sizeof(float));
    if (k + 1 < K) memcpy(&x[1], row + (k + 1) * (int64_t)nb0, sizeof(float));
    return (uint32_t)loom__fp32_to_bf16(x[0]) | (uint32_t)loom__fp32_to_bf16(x[1]) << 16;
}

/* Panels [p0, p1) of b (flat over batch, panel) -> uint32 [K/2][NR], zero past N. */
static void bg_pack_b(const loom_tensor *b, int64_t K, int64_t N, int64_t p0, int64_t p1,
                      uint32_t *bp) {
    const int64_t npan = bg_ceil_div(N, BG_NR), kp = bg_ceil_div(K, 2), B2 = b->ne[2];
    for (int64_t pi = p0; pi < p1; pi++) {
        const int64_t batch = pi / npan, pn = pi % npan;
        uint32_t *dstp = bp + pi * kp * BG_NR;
        for (int j = 0; j < BG_NR; j++) {
            const int64_t n = pn * BG_NR + j;
            if (n >= N) {
                for (int64_t q = 0; q < kp; q++)
                    dstp[q * BG_NR + j] = 0;
                continue;
            }
            const char *row = loom__at(b, 0, n, batch % B2, batch / B2);
            if (b->nb[0] == sizeof(float) && (uintptr_t)row % sizeof(float) == 0) {
                const float *r = (const float *)row;
                const int64_t kv = K & ~(int64_t)1;
                for (int64_t k = 0; k < kv; k += 2)
                    dstp[k / 2 * BG_NR + j] = (uint32_t)loom__fp32_to_bf16(r[k]) |
                                              (uint32_t)loom__fp32_to_bf16(r[k + 1]) << 16;
                if (kv < K) dstp[kv / 2 * BG_NR + j] = loom__fp32_to_bf16(r[kv]);
            } else {
                for (int64_t q = 0; q < kp; q++)
                    dstp[q * BG_NR + j] = b_pair(row, b->nb[0], 2 * q, K);
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/avx512-inl.h"

#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define IBF static inline __attribute__((always_inline)) TBF

/* c[j * ldc + i] (+)= sum over kp pairs of ap[q][i] . bp[q][j] (bf16 pairs), i < mvalid,
 * j < nvalid. */
static TBF void bg_tile(int64_t kp, const uint32_t *ap, const uint32_t *bp, float *c, size_t ldc,
                        int first, int mvalid, int nvalid) {
    __m512 c0[BG_NR], c1[BG_NR];
    _Pragma("GCC unroll 12") for (int j = 0; j < BG_NR; j++) {
        c0[j] = _mm512_setzero_ps();
        c1[j] = _mm512_setzero_ps();
    }
    for (int64_t q = 0; q < kp; q++) {
        const __m512bh a0 = (__m512bh)_mm512_load_si512(ap);
        const __m512bh a1 = (__m512bh)_mm512_load_si512(ap + 16);
        _Pragma("GCC unroll 12") for (int j = 0; j < BG_NR; j++) {
            const __m512bh bj = (__m512bh)_mm512_set1_epi32((int)bp[j]);
            c0[j] = _mm512_dpbf16_ps(c0[j], a0, bj);
            c1[j] = _mm512_dpbf16_ps(c1[j], a1, bj);
        }
        ap += BG_MR;
        bp += BG_NR;
    }
    _Static_assert(BG_MR == 32, "loom__avx512_store_tile32 writes 32-row tiles");
    loom__avx512_store_tile32(c, ldc, c0, c1, BG_NR, first, mvalid, nvalid);
}

/* rows (<= MR) bf16 rows at a (lda bytes apart), elements [0, kc) -> one panel
 * uint32 panel[kc/2][MR] of pairs; rows past `rows` and an odd kc's last high half zero. */
static TBF void bg_pack_a(const char *a, size_t lda, int64_t kc, int rows, uint32_t *panel) {
    const int64_t kp = (kc + 1) / 2, pv = (kc / 2) & ~(int64_t)15; /* full 16-pair groups */
    for (int h = 0; h < BG_MR / 16; h++) {
        for (int64_t q0 = 0; q0 < pv; q0 += 16) {
            __m512i r[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) r[i] =
                16 * h + i < rows ? _mm512_loadu_si512(a + (size_t)(16 * h + i) * lda + q0 * 4)
                                  : _mm512_setzero_si512();
            loom__avx512_transpose16(r);
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
                _mm512_store_si512(panel + (q0 + j) * BG_MR + 16 * h, r[j]);
        }
    }
    for (int64_t q = pv; q < kp; q++) {
        for (int i = 0; i < BG_MR; i++) {
            uint32_t w = 0;
            if (i < rows) {
                const char *e = a + (size_t)i * lda + q * 4;
                uint16_t lo, hi = 0;
                memcpy(&lo, e, sizeof lo);
                if (2 * q + 1 < kc) memcpy(&hi, e + 2, sizeof hi);
                w = (uint32_t)lo | (uint32_t)hi << 16;
            }
            panel[q * BG_MR + i] = w;
        }
    }
}

void loom__cpu_op_mul_mat_bgemm(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1], B2 = b->ne[2], B3 = b->ne[3];
    const int64_t r2 = B2 / a->ne[2], r3 = B3 / a->ne[3];
    const int64_t npan = bg_ceil_div(N, BG_NR), kp = bg_ceil_div(K, 2);
    const int64_t batches = B2 * B3;
    uint32_t *bp = p->wshared;
    int64_t p0, p1;
    loom__range(batches * npan, p->ith, p->nth, &p0, &p1);
    bg_pack_b(b, K, N, p0, p1, bp);
    loom__cpu_barrier(p);

    uint32_t *ap = (uint32_t *)(((uintptr_t)p->wthread + 63) & ~(uintptr_t)63);
    const size_t ldc = dst->nb[1] / sizeof(float);

    /* Work units as the F32 GEMM's. */
    const loom__cpu_gemm_units g = loom__cpu_gemm_units_of(batches, M, npan, BG_MC, BG_MR, p->nth);
    loom__cpu_chunks ch = loom__cpu_chunks_of(p, g.count, 1);
    for (int64_t u; loom__cpu_chunks_item(p, &ch, &u);) {
        const loom__cpu_gemm_unit w = loom__cpu_gemm_unit_at(&g, u, M);
        const int64_t batch = w.batch, mc0 = w.mc0, mlen = w.mlen, pn0 = w.pn0, pn1 = w.pn1;
        const int64_t i2 = batch % B2, i3 = batch / B2;
        const int64_t mpan = bg_ceil_div(mlen, BG_MR);
        const uint32_t *bpan = bp + batch * npan * kp * BG_NR;
        if (pn0 >= pn1) continue;
        for (int64_t k0 = 0; k0 < K; k0 += BG_KC) {
            const int64_t kc = K - k0 < BG_KC ? K - k0 : BG_KC, kcp = (kc + 1) / 2;
            for (int64_t mp = 0; mp < mpan; mp++) {
                const int rows = mlen - mp * BG_MR < BG_MR ? (int)(mlen - mp * BG_MR) : BG_MR;
                const char *arow = loom__at(a, k0, mc0 + mp * BG_MR, i2 / r2, i3 / r3);
                bg_pack_a(arow, a->nb[1], kc, rows, ap + mp * kcp * BG_MR);
            }
            for (int64_t pn = pn0; pn < pn1; pn++) {
                const uint32_t *bpk = bpan + pn * kp * BG_NR + k0 / 2 * BG_NR;
                const int nvalid = N - pn * BG_NR < BG_NR ? (int)(N - pn * BG_NR) : BG_NR;
                for (int64_t mp = 0; mp < mpan; mp++) {
                    const int64_t m = mc0 + mp * BG_MR;
                    const int mvalid = M - m < BG_MR ? (int)(M - m) : BG_MR;
                    bg_tile(kcp, ap + mp * kcp * BG_MR, bpk, loom__at(dst, m, pn * BG_NR, i2, i3),
                            ldc, k0 == 0, mvalid, nvalid);
                }
            }
        }
    }
}

/* out[j] = a . b_j for j < nb (1..4): a bf16 weight row of k elements, b rows of bf16
 * activations ldb elements apart, zero-padded to whole 32-element groups
 * (loom__cpu_bdot_row_elems); the weight row's tail is read under a mask. One row: four
 * accumulator chains (the vdpbf16ps latency); more rows share each weight load. */
TBF void loom__cpu_bdot(int64_t k, const uint16_t *a, const uint16_t *b, size_t ldb, int nb,
                        float *out) {
    const int64_t kv = k & ~(int64_t)31;
    const __mmask32 mt = k > kv ? (__mmask32)((1ull << (k - kv)) - 1) : 0;
    if (nb == 1) {
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        int64_t i = 0;
        for (; i + 128 <= kv; i += 128) {
            loom__cpu_prefetch_ahead(a + i, 128 * (int)sizeof *a);
            s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + i),
                                  (__m512bh)_mm512_loadu_si512(b + i));
            s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_loadu_si512(a + i + 32),
                                  (__m512bh)_mm512_loadu_si512(b + i + 32));
            s2 = _mm512_dpbf16_ps(s2, (__m512bh)_mm512_loadu_si512(a + i + 64),
                                  (__m512bh)_mm512_loadu_si512(b + i + 64));
            s3 = _mm512_dpbf16_ps(s3, (__m512bh)_mm512_loadu_si512(a + i + 96),
                                  (__m512bh)_mm512_loadu_si512(b + i + 96));
        }
        for (; i < kv; i += 32)
            s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_loadu_si512(a + i),
                                  (__m512bh)_mm512_loadu_si512(b + i));
        if (mt)
            s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_maskz_loadu_epi16(mt, a + kv),
                                  (__m512bh)_mm512_loadu_si512(b + kv));
        out[0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
        return;
    }
    __m512 acc[4][2];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= kv; i += 64) {
        loom__cpu_prefetch_ahead(a + i, 64 * (int)sizeof *a);
        const __m512bh a0 = (__m512bh)_mm512_loadu_si512(a + i);
        const __m512bh a1 = (__m512bh)_mm512_loadu_si512(a + i + 32);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            if (j >= nb) break;
            acc[j][0] = _mm512_dpbf16_ps(acc[j][0], a0,
                                         (__m512bh)_mm512_loadu_si512(b + j * ldb + i));
            acc[j][1] = _mm512_dpbf16_ps(acc[j][1], a1,
                                         (__m512bh)_mm512_loadu_si512(b + j * ldb + i + 32));
        }
    }
    for (; i < kv + (mt ? 32 : 0); i += 32) {
        const __m512bh a0 = (__m512bh)(i < kv ? _mm512_loadu_si512(a + i)
                                              : _mm512_maskz_loadu_epi16(mt, a + i));
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            if (j >= nb) break;
            acc[j][0] = _mm512_dpbf16_ps(acc[j][0], a0,
                                         (__m512bh)_mm512_loadu_si512(b + j * ldb + i));
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        if (j >= nb) break;
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]));
    }
}

#else /* not x86-64 GCC/Clang: loom__cpu_has_avx512bf16() is false, never called */

void loom__cpu_bdot(int64_t k, const uint16_t *a, const uint16_t *b, size_t ldb, int nb,
                    float *out) {
    (void)k;
    (void)a;
    (void)b;
    (void)ldb;
    (void)nb;
    (void)out;
    LOOM_ASSERT(0 && "BF16 dot without AVX512_BF16");
}


void loom__cpu_op_mul_mat_bgemm(const loom__cpu_params *p, loom_tensor *dst) {
    (void)p;
    (void)dst;
    LOOM_ASSERT(0 && "BF16 GEMM without AVX512_BF16");
}

#endif
