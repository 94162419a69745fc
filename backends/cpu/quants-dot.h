/*
 * Integer dot products of block-quantised weight rows with quantised activation rows, the
 * way the reference engines compute them: activations as Q8_K (K-quants, IQ4_XS), Q8_0
 * (Q5_0, IQ4_NL, MXFP4) or Q8_1 (Q4_1, Q5_1), one type per weight type (its traits'
 * vec_dot_type). Each block's weights are unpacked to small integers with integer
 * sub-block scales (and mins), multiplied with the activation integers in int32, and scaled
 * once per block, so the result equals the float dot of the dequantised rows up to float
 * rounding of the per-block sums.
 *
 * The bodies are written once (quants-k.c, quants-legacy.c) as always-inline functions and
 * instantiated three times: portable, and inside AVX2+FMA and AVX-512 target functions so
 * the compiler vectorises the integer loops for each; loom__cpu_qdot_get picks the
 * instance of the SIMD table in use.
 */
#ifndef LOOM_CPU_QUANTS_DOT_H
#define LOOM_CPU_QUANTS_DOT_H

#include "backends/cpu/cpu-impl.h"

/* Dot of n elements: x a row of weight blocks, y the matching activation blocks. */
typedef float (*loom__cpu_qdot_fn)(int64_t n, const void *x, const void *y);

typedef struct loom__cpu_qdot_set {
    loom__cpu_qdot_fn q4_1, q5_0, q5_1, iq4_nl, mxfp4;      /* quants-legacy.c */
    loom__cpu_qdot_fn q2_K, q3_K, q4_K, q5_K, q6_K, iq4_xs; /* quants-k.c */
} loom__cpu_qdot_set;

void loom__cpu_qdot_legacy(loom__cpu_qdot_set *s, int isa); /* isa: 0 portable, 1 avx2, 2 avx512 */
void loom__cpu_qdot_k(loom__cpu_qdot_set *s, int isa);
/* Overrides with the hand-written AVX2 kernels (quants-avx2.c) where there are some. */
void loom__cpu_qdot_avx2(loom__cpu_qdot_set *s);
/* Then, in the AVX-512 table, with the AVX-512 (VNNI) kernels (quants-avx512.c). */
void loom__cpu_qdot_avx512(loom__cpu_qdot_set *s);

/* Quantises n floats (a multiple of the block) to activation rows of type Q8_0, Q8_1 or Q8_K,
 * byte for byte what the type's from_float writes. */
typedef void (*loom__cpu_qact_fn)(const float *x, void *y, int64_t n);
/* The AVX2 ones (quants-avx2.c), NULL for other types or without AVX2 support in the build. */
loom__cpu_qact_fn loom__cpu_qact_avx2(loom_type t);
/* The quantiser of activation type t for the given SIMD table (the traits' from_float on the
 * portable table). */
loom__cpu_qact_fn loom__cpu_qact_get(loom_type t, const loom__cpu_simd *simd);

/* The dot of weight type t for the given SIMD table; NULL for types without one (float types,
 * Q8_0/Q4_0, which have their own paths, and the activation types). */
loom__cpu_qdot_fn loom__cpu_qdot_get(loom_type t, const loom__cpu_simd *simd);

#define LOOM_QD_INLINE static inline __attribute__((always_inline))

/* Instantiation. LIST(X, sfx, attr) applies X(name, sfx, attr) to each type name of a file;
 * LOOM_QD_INSTANCES(LIST) defines dot_<name>_<sfx> calling body_<name> for each ISA, and
 * LOOM_QD_SELECT(LIST, s, isa) stores the instances of the given isa into the set s. */
#define LOOM_QD_DEF(name, sfx, attr)                                                               \
    attr static float dot_##name##_##sfx(int64_t n, const void *x, const void *y) {                \
        return body_##name(n, x, y);                                                               \
    }
#define LOOM_QD_SET(name, sfx, s) (s)->name = dot_##name##_##sfx;

#if defined(__x86_64__) && defined(__GNUC__)
#define LOOM_QD_INSTANCES(LIST)                                                                    \
    LIST(LOOM_QD_DEF, scalar, )                                                                    \
    LIST(LOOM_QD_DEF, avx2, __attribute__((target("avx2,fma,f16c"))))                              \
    LIST(LOOM_QD_DEF, avx512, __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"))))
#define LOOM_QD_SELECT(LIST, s, isa)                                                               \
    do {                                                                                           \
        if ((isa) == 2) {                                                                          \
            LIST(LOOM_QD_SET, avx512, s)                                                           \
        } else if ((isa) == 1) {                                                                   \
            LIST(LOOM_QD_SET, avx2, s)                                                             \
        } else {                                                                                   \
            LIST(LOOM_QD_SET, scalar, s)                                                           \
        }                                                                                          \
    } while (0)
#else
#define LOOM_QD_INSTANCES(LIST) LIST(LOOM_QD_DEF, scalar, )
#define LOOM_QD_SELECT(LIST, s, isa)                                                               \
    do {                                                                                           \
        (void)(isa);                                                                               \
        LIST(LOOM_QD_SET, scalar, s)                                                               \
    } while (0)
#endif

LOOM_QD_INLINE float loom__qd_h(uint16_t h) {
    return loom__fp16_to_fp32(h);
}

/* 32 elements from 16 bytes of nibbles through a 16-entry table: qs[j] low is element j,
 * high is element j + 16 (IQ4_NL, IQ4_XS, MXFP4) */
LOOM_QD_INLINE void loom__qd_unpack_lut(const uint8_t *qs, const int8_t *lut, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = lut[qs[j] & 0x0f];
        q[j + 16] = lut[qs[j] >> 4];
    }
}

/* sum of a[i] * b[i] over n int8 pairs, in int32 (n a multiple of 16) */
LOOM_QD_INLINE int loom__qd_dot_i8(const int8_t *a, const int8_t *b, int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (int)a[i] * (int)b[i];
    return s;
}

#endif /* LOOM_CPU_QUANTS_DOT_H */
