/*
 * libFuzzer target for the block types' integer dots (issue #29 item 8): arbitrary weight
 * block bytes (every scale bit pattern: NaN, Inf, subnormal fp16) of the 11 types with a dot
 * of their own, against arbitrary f32 activations (NaN and Inf among them), on the portable,
 * AVX2 and AVX-512 tables. The activation quantisers of the tables must write the same bytes;
 * a NaN activation must come out NaN on every table (a NaN in the dequantised weights may be
 * an Inf scale times a zero quant, which an integer dot scales once: Inf; the NaN scales are
 * backends/cpu:hostile_quant_test's);
 * where the portable dot is NaN every table's is, Inf stays non-finite, a finite result
 * stays finite unless the terms pass the float range. MXFP4 exponents 254/255 and
 * activations past 1e20 (products past the float range, where the float order decides) are
 * left out.
 *
 * Input: byte 0 picks the type, byte 1 the block count (1..4); then the weight blocks, then
 * the activations as raw floats (missing bytes are zero).
 */
#include <cpuid.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "backends/cpu/quants-dot.h"

#define FAIL(what)                                                                                 \
    do {                                                                                           \
        fprintf(stderr,                                                                            \
                "quant_fuzz: %s: %s, %lld blocks, table %d: %.9g, portable %.9g (sum|wx| %g)\n",   \
                what, loom_type_name(t), (long long)nblk, i, r[i], r[0], g);                       \
        abort();                                                                                   \
    } while (0)

static const loom_type TYPES[] = {LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0,  LOOM_TYPE_Q5_1,
                                  LOOM_TYPE_IQ4_NL, LOOM_TYPE_MXFP4, LOOM_TYPE_Q2_K,
                                  LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K,  LOOM_TYPE_Q5_K,
                                  LOOM_TYPE_Q6_K,   LOOM_TYPE_IQ4_XS};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0], MAX_K = 4 * 256 };

/* tables this CPU runs (the build turns __builtin_cpu_supports off: clang 14 and f16c) */
static int n_tables(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 1;
    if (!(b & (1u << 5))) return 1;                                          /* AVX2 */
    return (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) ? 3 : 2; /* F, BW, VL */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int nt;
    if (!nt) nt = n_tables();
    if (size < 2) return 0;
    const loom_type t = TYPES[data[0] % N_TYPES];
    const loom_type_traits *tr = loom_type_traits_get(t);
    const int64_t nblk = 1 + data[1] % 4, K = nblk * loom_blck_size(t);
    const size_t wbytes = loom_row_size(t, K);
    static uint8_t w[MAX_K * 2];
    static float x[MAX_K], wf[MAX_K];
    memset(w, 0, sizeof w);
    memset(x, 0, sizeof x);
    size_t off = 2, n = size - off < wbytes ? size - off : wbytes;
    memcpy(w, data + off, n);
    off += n;
    if (off < size)
        memcpy(x, data + off,
               size - off < sizeof(float) * K ? size - off : sizeof(float) * (size_t)K);
    if (t == LOOM_TYPE_MXFP4)
        for (int64_t b = 0; b < nblk; b++)
            if (w[b * sizeof(loom_block_mxfp4)] >= 254) w[b * sizeof(loom_block_mxfp4)] = 127;
    /* finite activations past 1e20 times the block scales and integer sums pass the float
     * range in some summation orders only (a SIMD table's lanes): the same exemption as MXFP4's
     * largest exponents; NaN and Inf stay */
    for (int64_t k = 0; k < K; k++)
        if (isfinite(x[k]) && fabsf(x[k]) > 1e20f) x[k] = copysignf(1e20f, x[k]);
    tr->to_float(w, wf, K);
    bool any_nan = false;
    double g = 0;
    for (int64_t k = 0; k < K; k++) {
        any_nan |= isnan(x[k]); /* a weight NaN may be Inf * 0, which the dots scale once */
        g += fabs((double)wf[k] * (double)x[k]);
    }
    const loom_type vt = tr->vec_dot_type;
    static uint8_t y[3][MAX_K * 2];
    const loom__cpu_simd *tabs[3] = {&loom__cpu_simd_scalar, &loom__cpu_simd_avx2,
                                     &loom__cpu_simd_avx512};
    float r[3];
    for (int i = 0; i < nt; i++) {
        loom__cpu_qact_get(vt, tabs[i])(x, y[i], K);
        if (i && memcmp(y[i], y[0], loom_row_size(vt, K)) != 0) {
            r[i] = r[0] = 0;
            FAIL("the activation bytes differ");
        }
        r[i] = loom__cpu_qdot_get(t, tabs[i])(K, w, y[i]);
    }
    for (int i = 0; i < nt; i++) {
        if (any_nan && !isnan(r[i])) FAIL("a NaN operand did not reach the result");
        if (!(g < 1e30)) continue; /* past the float range (or Inf * 0): the order decides */
        if (isnan(r[0]) && !isnan(r[i])) FAIL("not NaN where the portable dot is");
        if (isinf(r[0]) && isfinite(r[i])) FAIL("finite where the portable dot is Inf");
        /* finite stays finite (closeness, with tolerances from the terms' magnitudes, mins
         * included, is backends/cpu:qdot_test's: cancelling terms make sum |w x| no bound) */
        if (isfinite(r[0]) && g < 1e30 && !isfinite(r[i]))
            FAIL("not finite where the portable dot is");
    }
    return 0;
}
