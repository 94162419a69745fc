/*
 * The benchmarks' random inputs: splitmix64, deterministic and independent of the library
 * under test.
 */
#ifndef LOOM_BENCH_RNG_H
#define LOOM_BENCH_RNG_H

#include <stdint.h>

static inline uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline float rng_uniform(uint64_t *s) {
    return (float)((double)(rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

#endif /* LOOM_BENCH_RNG_H */
