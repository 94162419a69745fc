/*
 * The dot-product table of the block types beyond Q8_0/Q4_0, one per SIMD table
 * (portable, AVX2, AVX-512), built once (quants-k.c, quants-legacy.c hold the kernels).
 */
#include <pthread.h>

#include "backends/cpu/quants-dot.h"

static loom__cpu_qdot_set qdot_sets[3];
static pthread_once_t qdot_once = PTHREAD_ONCE_INIT;

static void qdot_init(void) {
    for (int isa = 0; isa < 3; isa++) {
        loom__cpu_qdot_legacy(&qdot_sets[isa], isa);
        loom__cpu_qdot_k(&qdot_sets[isa], isa);
        if (isa > 0) loom__cpu_qdot_avx2(&qdot_sets[isa]);
        if (isa == 2) loom__cpu_qdot_avx512(&qdot_sets[isa]);
    }
}

loom__cpu_qdot_fn loom__cpu_qdot_get(loom_type t, const loom__cpu_simd *simd) {
    pthread_once(&qdot_once, qdot_init);
    const int isa = simd == &loom__cpu_simd_avx512 ? 2 : simd == &loom__cpu_simd_avx2 ? 1 : 0;
    const loom__cpu_qdot_set *s = &qdot_sets[isa];
    switch (t) {
    case LOOM_TYPE_Q4_1:
        return s->q4_1;
    case LOOM_TYPE_Q5_0:
        return s->q5_0;
    case LOOM_TYPE_Q5_1:
        return s->q5_1;
    case LOOM_TYPE_IQ4_NL:
        return s->iq4_nl;
    case LOOM_TYPE_MXFP4:
        return s->mxfp4;
    case LOOM_TYPE_Q2_K:
        return s->q2_K;
    case LOOM_TYPE_Q3_K:
        return s->q3_K;
    case LOOM_TYPE_Q4_K:
        return s->q4_K;
    case LOOM_TYPE_Q5_K:
        return s->q5_K;
    case LOOM_TYPE_Q6_K:
        return s->q6_K;
    case LOOM_TYPE_IQ4_XS:
        return s->iq4_xs;
    default:
        return NULL;
    }
}

loom__cpu_qact_fn loom__cpu_qact_get(loom_type t, const loom__cpu_simd *simd) {
    loom__cpu_qact_fn f = simd == &loom__cpu_simd_scalar ? NULL : loom__cpu_qact_avx2(t);
    return f ? f : loom_type_traits_get(t)->from_float;
}
