/*
 * Measures this machine's own limits, so benchmark figures can be read as a fraction of
 * what the hardware can do rather than against a datasheet: streaming memory bandwidth
 * (multi-threaded read and copy of a buffer much larger than the caches, best of several
 * runs) and FMA peak (a register-resident FMA loop with the widest SIMD the CPU has, on
 * every thread of a pool).
 */
#ifndef LOOM_BENCH_MACHINE_LIMITS_H
#define LOOM_BENCH_MACHINE_LIMITS_H

#include <stddef.h>

#include "loom/core.h"

typedef struct loom__bench_bandwidth {
    double read_gbps; /* bytes read / s, 1e9 bytes per GB */
    double copy_gbps; /* (bytes read + bytes written) / s */
    size_t bytes;     /* size of the buffer streamed */
    int runs;         /* best of this many */
} loom__bench_bandwidth;

typedef struct loom__bench_peak {
    double gflops;   /* 2 flops per FMA lane, all threads */
    const char *isa; /* "avx512", "avx2", "scalar" */
    int runs;
} loom__bench_peak;

/* Last-level cache size of one instance (sysfs, else the C library; 0 if unknown). */
size_t loom__bench_llc_bytes(void);

/* Streams `bytes` (rounded down to a multiple of 64 * threads) with every thread of tp.
 * LOOM_ERR_NOMEM if the buffer cannot be allocated. */
loom_status loom__bench_measure_bandwidth(loom_threadpool *tp, size_t bytes, int runs,
                                          loom__bench_bandwidth *out);

/* FMA peak with the widest ISA this CPU supports. */
void loom__bench_measure_fma_peak(loom_threadpool *tp, int runs, loom__bench_peak *out);

/* int8 peak: a register-resident loop of independent AVX-512 VNNI vpdpbusd chains (u8 x s8
 * multiply-adds, 2 ops each, in gflops as GOP/s); false (and zeros) without VNNI. */
bool loom__bench_measure_int8_peak(loom_threadpool *tp, int runs, loom__bench_peak *out);

#endif /* LOOM_BENCH_MACHINE_LIMITS_H */
