/*
 * The integer dots of the block types beyond Q8_0/Q4_0 (quants-*.c) on every SIMD table the
 * CPU has, against the portable instance and against a double dot of the dequantised rows.
 * Weight blocks are random bytes (every bit pattern of the fields) or quantised random floats,
 * with random and extreme scales (+-65504, the smallest subnormal, 0, negative; MXFP4
 * exponents 0, 1 and large); activations quantised from floats of magnitudes 1e-3..1e3,
 * zero blocks and outliers; rows of 1..17 blocks, so every unrolled kernel runs its tails.
 * The table's own Q8_0/Q4_0 dots (against 1..4 Q8 activation rows) get two tests of their own
 * below: exact integer sums with unit scales, and random scales against a double dot.
 *
 * Tolerances. The kernels compute the same integers per (sub-)block as the portable body and
 * differ only in the float scaling and summation order: at most a few ulp of each block's
 * terms per block summed, bounded by 1e-6 * nblk * G, where G = sum |x_k y_k| + sum |m_k y_k|
 * (m_k the element's min offset, the dequantised value with its quant field zeroed; 0 for
 * types without mins), 1e-6 being over 16 ulp. Against the double reference, Q4_1/Q5_1 also
 * carry the fp16 rounding of the activations' s = d * sum(q) (relative 2^-11 of |m s|, at most
 * 6e-4 * sum |m_k y_k|).
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/quants-dot.h"
#include "loom/loom.h"
#include "tests/shim/loom_test.h"

typedef struct qd_layout {
    loom_type type;
    size_t h16[2];       /* offsets of fp16 scales in the block (SIZE_MAX: none) */
    size_t e8;           /* offset of the e8m0 exponent (SIZE_MAX: none) */
    size_t q_off, q_len; /* quant fields zeroed to read the min offsets (q_len 0: no mins) */
} qd_layout;

#define NONE SIZE_MAX
static const qd_layout k_layouts[] = {
    {LOOM_TYPE_Q4_1,
     {offsetof(loom_block_q4_1, d), offsetof(loom_block_q4_1, m)},
     NONE,
     offsetof(loom_block_q4_1, qs),
     16},
    {LOOM_TYPE_Q5_0, {offsetof(loom_block_q5_0, d), NONE}, NONE, 0, 0},
    {LOOM_TYPE_Q5_1,
     {offsetof(loom_block_q5_1, d), offsetof(loom_block_q5_1, m)},
     NONE,
     offsetof(loom_block_q5_1, qh),
     20},
    {LOOM_TYPE_IQ4_NL, {offsetof(loom_block_iq4_nl, d), NONE}, NONE, 0, 0},
    {LOOM_TYPE_MXFP4, {NONE, NONE}, offsetof(loom_block_mxfp4, e), 0, 0},
    {LOOM_TYPE_Q2_K,
     {offsetof(loom_block_q2_K, d), offsetof(loom_block_q2_K, dmin)},
     NONE,
     offsetof(loom_block_q2_K, qs),
     64},
    {LOOM_TYPE_Q3_K, {offsetof(loom_block_q3_K, d), NONE}, NONE, 0, 0},
    {LOOM_TYPE_Q4_K,
     {offsetof(loom_block_q4_K, d), offsetof(loom_block_q4_K, dmin)},
     NONE,
     offsetof(loom_block_q4_K, qs),
     128},
    {LOOM_TYPE_Q5_K,
     {offsetof(loom_block_q5_K, d), offsetof(loom_block_q5_K, dmin)},
     NONE,
     offsetof(loom_block_q5_K, qh),
     32 + 128},
    {LOOM_TYPE_Q6_K, {offsetof(loom_block_q6_K, d), NONE}, NONE, 0, 0},
    {LOOM_TYPE_IQ4_XS, {offsetof(loom_block_iq4_xs, d), NONE}, NONE, 0, 0},
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { /* [0, 1) */
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* a finite fp16: mostly magnitudes 2^-14..1 of either sign, a quarter of them extreme */
static uint16_t rng_fp16(uint64_t *s) {
    static const uint16_t extreme[] = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x0000, 0x3c00, 0x0400};
    const uint64_t r = rng_next(s);
    if (r % 4 == 0) return extreme[(r >> 8) % (sizeof extreme / sizeof extreme[0])];
    const uint16_t exp = (uint16_t)(1 + (r >> 16) % 15), mant = (uint16_t)((r >> 24) & 0x3ff);
    return (uint16_t)(((r >> 40) & 1) << 15 | exp << 10 | mant);
}

static uint8_t rng_e8m0(uint64_t *s) {
    static const uint8_t extreme[] = {0, 1, 2, 160};
    const uint64_t r = rng_next(s);
    if (r % 4 == 0) return extreme[(r >> 8) % 4];
    return (uint8_t)(110 + (r >> 16) % 30);
}

/* n random floats, magnitudes chosen per 32: 1e-3..1e2, some all zero, some one outlier 10x
 * (at most 1e3: a Q8_1 block's s = d * sum(q), up to 32 times that, stays a finite fp16) */
static void rng_floats(uint64_t *s, float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        const uint64_t kind = rng_next(s) % 8;
        const double mag = pow(10.0, -3.0 + 5.0 * rng_unit(s));
        for (int64_t j = b; j < b + 32 && j < n; j++)
            x[j] = kind == 0 ? 0.0f : (float)(mag * (2.0 * rng_unit(s) - 1.0));
        if (kind == 1) x[b + (int64_t)(rng_next(s) % 32)] = (float)(mag * 10.0);
    }
}

/* A row of nblk weight blocks: random bytes with random scales, or quantised floats. */
static void make_weights(const qd_layout *L, uint64_t *s, int64_t nblk, void *row, float *tmp) {
    const size_t bs = loom_type_size(L->type);
    const int64_t blk = loom_blck_size(L->type);
    if (rng_next(s) % 2) {
        rng_floats(s, tmp, nblk * blk);
        loom_type_traits_get(L->type)->from_float(tmp, row, nblk * blk);
        return;
    }
    uint8_t *p = row;
    for (size_t i = 0; i < bs * (size_t)nblk; i++)
        p[i] = (uint8_t)rng_next(s);
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t *blkp = p + (size_t)b * bs;
        for (int k = 0; k < 2; k++)
            if (L->h16[k] != NONE) {
                uint16_t h = rng_fp16(s);
                memcpy(blkp + L->h16[k], &h, 2);
            }
        if (L->e8 != NONE) blkp[L->e8] = rng_e8m0(s);
    }
}

typedef struct qd_case {
    int64_t K;
    void *x, *y;
    double ref, g; /* double dot of the dequantised rows; sum |x y| + sum |m y| */
    double gm;     /* sum |m y| */
} qd_case;

static void make_case(const qd_layout *L, uint64_t *s, int64_t nblk, qd_case *c) {
    const loom_type_traits *tr = loom_type_traits_get(L->type);
    const loom_type vt = tr->vec_dot_type;
    const int64_t K = nblk * loom_blck_size(L->type);
    const size_t bs = loom_type_size(L->type);
    c->K = K;
    c->x = malloc(loom_row_size(L->type, K));
    c->y = malloc(loom_row_size(vt, K));
    float *tmp = malloc(sizeof(float) * (size_t)K), *xf = malloc(sizeof(float) * (size_t)K),
          *yf = malloc(sizeof(float) * (size_t)K), *mf = malloc(sizeof(float) * (size_t)K);
    uint8_t *xm = malloc(bs * (size_t)nblk);
    make_weights(L, s, nblk, c->x, tmp);
    rng_floats(s, tmp, K);
    loom_type_traits_get(vt)->from_float(tmp, c->y, K);
    tr->to_float(c->x, xf, K);
    loom_type_traits_get(vt)->to_float(c->y, yf, K);
    memcpy(xm, c->x, bs * (size_t)nblk);
    for (int64_t b = 0; b < nblk; b++)
        memset(xm + (size_t)b * bs + L->q_off, 0, L->q_len);
    if (L->q_len)
        tr->to_float(xm, mf, K);
    else
        memset(mf, 0, sizeof(float) * (size_t)K);
    c->ref = c->g = c->gm = 0;
    for (int64_t k = 0; k < K; k++) {
        c->ref += (double)xf[k] * (double)yf[k];
        c->g += fabs((double)xf[k] * (double)yf[k]) + fabs((double)mf[k] * (double)yf[k]);
        c->gm += fabs((double)mf[k] * (double)yf[k]);
    }
    free(tmp);
    free(xf);
    free(yf);
    free(mf);
    free(xm);
}

static void check_table(const loom__cpu_simd *simd, const char *name) {
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17};
    int cases = 0;
    for (size_t t = 0; t < sizeof k_layouts / sizeof k_layouts[0]; t++) {
        const qd_layout *L = &k_layouts[t];
        const loom__cpu_qdot_fn port = loom__cpu_qdot_get(L->type, &loom__cpu_simd_scalar);
        const loom__cpu_qdot_fn fn = loom__cpu_qdot_get(L->type, simd);
        LOOM_REQUIRE(port != NULL && fn != NULL);
        const bool q8_1 = loom_type_traits_get(L->type)->vec_dot_type == LOOM_TYPE_Q8_1;
        uint64_t rng = 0x5eed0000u + (uint64_t)L->type;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int trial = 0; trial < 12; trial++) {
                qd_case c;
                make_case(L, &rng, sizes[si], &c);
                const double got = fn(c.K, c.x, c.y), want = port(c.K, c.x, c.y);
                const double tol = 1e-6 * (double)sizes[si] * c.g + 1e-37;
                const double tol_ref = 2.0 * tol + (q8_1 ? 6e-4 * c.gm : 0.0);
                LOOM_CHECK_MSG(fabs(got - want) <= tol,
                               "%s %s, %lld blocks, trial %d: %.9g vs portable %.9g (tol %.3g)",
                               name, loom_type_name(L->type), (long long)sizes[si], trial, got,
                               want, tol);
                LOOM_CHECK_MSG(fabs(got - c.ref) <= tol_ref,
                               "%s %s, %lld blocks, trial %d: %.9g vs double %.9g (tol %.3g)", name,
                               loom_type_name(L->type), (long long)sizes[si], trial, got, c.ref,
                               tol_ref);
                free(c.x);
                free(c.y);
                cases++;
            }
    }
    LOOM_CHECK(cases > 0);
}

LOOM_TEST(cpu_qdot, portable_matches_double) {
    check_table(&loom__cpu_simd_scalar, "portable");
}

LOOM_TEST(cpu_qdot, avx2_matches_portable_and_double) {
    if (!loom__cpu_has_avx2()) LOOM_SKIP("no AVX2 on this CPU");
    check_table(&loom__cpu_simd_avx2, "avx2");
}

LOOM_TEST(cpu_qdot, avx512_matches_portable_and_double) {
    if (!loom__cpu_has_avx512()) LOOM_SKIP("no AVX-512 (F/BW/VL/VNNI) on this CPU");
    check_table(&loom__cpu_simd_avx512, "avx512");
}

/* ---------------------------------------------------------------- the table's Q8_0/Q4_0 dots */

/* The SIMD table's dot_q8_0 / dot_q4_0 (one weight row against nb = 1..4 Q8 activation rows,
 * ldb bytes apart) for row lengths that run every unrolled step and tail: 1..17 blocks and
 * around multiples of 8 and 16. */
static const int64_t k_q8a_sizes[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,
                                      14, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 47};

typedef struct q8a_case {
    bool q4; /* Q4_0 weights, else Q8_0 */
    int64_t nblk;
    void *w; /* nblk weight blocks */
    char *y; /* 4 activation rows, ldb bytes apart */
    size_t ldb;
    int8_t *wq; /* weight values per element (Q4_0: nibble - 8) */
} q8a_case;

static void q8a_case_alloc(q8a_case *c, bool q4, int64_t nblk) {
    c->q4 = q4;
    c->nblk = nblk;
    c->w = malloc((q4 ? sizeof(loom_block_q4_0) : sizeof(loom_block_q8_0)) * (size_t)nblk);
    c->ldb = loom__q8a_row_bytes(nblk) + 64; /* rows not back to back */
    c->y = malloc(4 * c->ldb);
    c->wq = malloc(32 * (size_t)nblk);
}

static void q8a_case_free(q8a_case *c) {
    free(c->w);
    free(c->y);
    free(c->wq);
}

/* Random weight bits (every int8 of Q8_0, -128 included; every nibble of Q4_0) with scale
 * `d` for every block, or random scales when d is 0xffff. */
static void q8a_weights(q8a_case *c, uint64_t *s, uint16_t d) {
    for (int64_t b = 0; b < c->nblk; b++) {
        const uint16_t db = d == 0xffff ? rng_fp16(s) : d;
        if (c->q4) {
            loom_block_q4_0 *blk = (loom_block_q4_0 *)c->w + b;
            blk->d = db;
            for (int k = 0; k < 16; k++) {
                blk->qs[k] = (uint8_t)rng_next(s);
                c->wq[32 * b + k] = (int8_t)((blk->qs[k] & 15) - 8);
                c->wq[32 * b + k + 16] = (int8_t)((blk->qs[k] >> 4) - 8);
            }
        } else {
            loom_block_q8_0 *blk = (loom_block_q8_0 *)c->w + b;
            blk->d = db;
            for (int k = 0; k < 32; k++)
                c->wq[32 * b + k] = blk->qs[k] = (int8_t)rng_next(s);
        }
    }
}

static void q8a_dot(const loom__cpu_simd *simd, const q8a_case *c, int nb, float *out) {
    if (c->q4)
        simd->dot_q4_0(c->nblk, c->w, c->y, c->ldb, nb, out);
    else
        simd->dot_q8_0(c->nblk, c->w, c->y, c->ldb, nb, out);
}

static const struct {
    const char *name;
    const loom__cpu_simd *simd;
} k_tables[] = {{"portable", &loom__cpu_simd_scalar},
                {"avx2", &loom__cpu_simd_avx2},
                {"avx512", &loom__cpu_simd_avx512}};

static bool table_ok(int t) {
    return t == 0 || (t == 1 ? loom__cpu_has_avx2() : loom__cpu_has_avx512());
}

/* Unit scales (weights d = 1.0, activations integers with a +-127 in every block, so their d
 * is 1.0): every result is an integer far below 2^24, so each table must return exactly the
 * integer sum of products of every block (a block lost, counted twice, or a product of the
 * wrong pair shows). Outputs past nb stay untouched. */
LOOM_TEST(cpu_qdot, q8_0_q4_0_dots_sum_exact_integers) {
    uint64_t rng = 0x5eed;
    int cases = 0;
    for (int q4 = 0; q4 < 2; q4++)
        for (size_t si = 0; si < sizeof k_q8a_sizes / sizeof k_q8a_sizes[0]; si++) {
            q8a_case c;
            const int64_t nblk = k_q8a_sizes[si], K = 32 * nblk;
            q8a_case_alloc(&c, q4, nblk);
            q8a_weights(&c, &rng, 0x3c00);
            float *x = malloc(sizeof(float) * (size_t)K);
            int64_t want[4] = {0, 0, 0, 0};
            for (int j = 0; j < 4; j++) {
                for (int64_t k = 0; k < K; k++)
                    x[k] = (float)((int)(rng_next(&rng) % 255) - 127);
                for (int64_t b = 0; b < nblk; b++)
                    x[32 * b + (int64_t)(rng_next(&rng) % 32)] =
                        (rng_next(&rng) & 1) ? 127.f : -127.f;
                void *row = c.y + (size_t)j * c.ldb;
                loom__cpu_simd_scalar.quantize_q8a(x, row, K);
                for (int64_t b = 0; b < nblk; b++)
                    LOOM_REQUIRE(loom__q8a_d(row)[b] == 1.0f); /* the premise of the test */
                for (int64_t k = 0; k < K; k++)
                    want[j] += (int64_t)c.wq[k] * (int64_t)x[k];
            }
            for (int t = 0; t < 3; t++) {
                if (!table_ok(t)) continue;
                for (int nb = 1; nb <= 4; nb++) {
                    float out[5] = {-1e30f, -1e30f, -1e30f, -1e30f, -1e30f};
                    q8a_dot(k_tables[t].simd, &c, nb, out);
                    for (int j = 0; j < 5; j++) {
                        const float exp = j < nb ? (float)want[j] : -1e30f;
                        LOOM_CHECK_MSG(out[j] == exp,
                                       "%s %s, %lld blocks, nb %d: out[%d] = %.9g, want %.9g",
                                       k_tables[t].name, q4 ? "q4_0" : "q8_0", (long long)nblk, nb,
                                       j, out[j], exp);
                    }
                    cases++;
                }
            }
            free(x);
            q8a_case_free(&c);
        }
    LOOM_CHECK(cases > 0);
}

/* Random and extreme weight scales, activations of magnitudes 1e-3..1e3: every table against
 * a double dot of the same integers and scales, within 1e-6 * (nblk + 1) * G, G = sum over
 * blocks of |da db| (sum |qa qb| + 8 sum |qb| for Q4_0's offset, applied through s). */
LOOM_TEST(cpu_qdot, q8_0_q4_0_dots_match_double) {
    uint64_t rng = 0xd0d0;
    int cases = 0;
    for (int q4 = 0; q4 < 2; q4++)
        for (size_t si = 0; si < sizeof k_q8a_sizes / sizeof k_q8a_sizes[0]; si++)
            for (int trial = 0; trial < 4; trial++) {
                q8a_case c;
                const int64_t nblk = k_q8a_sizes[si], K = 32 * nblk;
                q8a_case_alloc(&c, q4, nblk);
                q8a_weights(&c, &rng, 0xffff);
                float *x = malloc(sizeof(float) * (size_t)K);
                double want[4] = {0, 0, 0, 0}, g[4] = {0, 0, 0, 0};
                for (int j = 0; j < 4; j++) {
                    rng_floats(&rng, x, K);
                    void *row = c.y + (size_t)j * c.ldb;
                    loom__cpu_simd_scalar.quantize_q8a(x, row, K);
                    const float *yd = loom__q8a_d(row);
                    const int8_t *yq = loom__q8a_qs(row, nblk);
                    for (int64_t b = 0; b < nblk; b++) {
                        const uint16_t dh =
                            q4 ? ((loom_block_q4_0 *)c.w)[b].d : ((loom_block_q8_0 *)c.w)[b].d;
                        const double sc = (double)loom_fp16_to_fp32(dh) * (double)yd[b];
                        int64_t isum = 0, iabs = 0, qabs = 0;
                        for (int k = 0; k < 32; k++) {
                            isum += (int64_t)c.wq[32 * b + k] * yq[32 * b + k];
                            iabs += llabs((int64_t)c.wq[32 * b + k] * yq[32 * b + k]);
                            qabs += abs(yq[32 * b + k]);
                        }
                        want[j] += sc * (double)isum;
                        g[j] += fabs(sc) * (double)(iabs + (q4 ? 8 * qabs : 0));
                    }
                }
                for (int t = 0; t < 3; t++) {
                    if (!table_ok(t)) continue;
                    for (int nb = 1; nb <= 4; nb++) {
                        float out[4];
                        q8a_dot(k_tables[t].simd, &c, nb, out);
                        for (int j = 0; j < nb; j++) {
                            const double tol = 1e-6 * (double)(nblk + 1) * g[j] + 1e-30;
                            LOOM_CHECK_MSG(fabs((double)out[j] - want[j]) <= tol,
                                           "%s %s, %lld blocks, nb %d, trial %d: out[%d] = %.9g, "
                                           "double %.9g (tol %.3g)",
                                           k_tables[t].name, q4 ? "q4_0" : "q8_0", (long long)nblk,
                                           nb, trial, j, out[j], want[j], tol);
                        }
                        cases++;
                    }
                }
                free(x);
                q8a_case_free(&c);
            }
    LOOM_CHECK(cases > 0);
}

/* A row of n floats for the activation quantisers: random magnitudes, plus blocks whose
 * extremes tie (+a and -a, first one wins the sign in Q8_K) and blocks of exact halves
 * (amax 127: d = 1, so x / d and x * id land on k + 0.5 where roundf and lrintf differ). */
static void act_row(uint64_t *s, float *x, int64_t n) {
    rng_floats(s, x, n);
    for (int64_t b = 0; b < n; b += 32) {
        const uint64_t kind = rng_next(s) % 4;
        if (kind == 0) { /* tie of the extremes, either order */
            const float a = x[b] == 0.0f ? 1.0f : fabsf(x[b]) * 3.0f;
            const bool neg_first = rng_next(s) & 1;
            x[b + 3] = neg_first ? -a : a;
            x[b + 17] = neg_first ? a : -a;
        } else if (kind == 1) { /* halves */
            for (int j = 0; j < 32; j++)
                x[b + j] = (float)((int)(rng_next(s) % 253) - 126) + 0.5f;
            x[b + (int64_t)(rng_next(s) % 32)] = (rng_next(s) & 1) ? 127.0f : -127.0f;
        }
    }
}

static void check_quantisers(const loom__cpu_simd *simd, const char *name) {
    static const loom_type acts[] = {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_1, LOOM_TYPE_Q8_K};
    uint64_t rng = 0xac7;
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        const loom__cpu_qact_fn q = loom__cpu_qact_get(acts[a], simd);
        const loom_from_float_fn ref = loom_type_traits_get(acts[a])->from_float;
        LOOM_REQUIRE(q != NULL && ref != NULL);
        for (int64_t nblk = 1; nblk <= 5; nblk++)
            for (int trial = 0; trial < 40; trial++) {
                const int64_t n = nblk * 256;
                const size_t bytes = loom_row_size(acts[a], n);
                float *x = malloc(sizeof(float) * (size_t)n);
                uint8_t *got = malloc(bytes), *want = malloc(bytes);
                act_row(&rng, x, n);
                memset(got, 0xa5, bytes);
                memset(want, 0x5a, bytes);
                q(x, got, n);
                ref(x, want, n);
                size_t diff = 0;
                while (diff < bytes && got[diff] == want[diff])
                    diff++;
                LOOM_CHECK_MSG(diff == bytes, "%s %s, %lld values, trial %d: byte %zu differs",
                               name, loom_type_name(acts[a]), (long long)n, trial, diff);
                free(x);
                free(got);
                free(want);
            }
    }
}

LOOM_TEST(cpu_qdot, activation_quantisers_match_from_float) {
    check_quantisers(&loom__cpu_simd_scalar, "portable");
    if (loom__cpu_has_avx2()) check_quantisers(&loom__cpu_simd_avx2, "avx2");
    if (loom__cpu_has_avx512()) check_quantisers(&loom__cpu_simd_avx512, "avx512");
}
