/*
 * Machine limits for the benchmarks: streaming memory bandwidth and FMA peak, measured on
 * this machine with a loom thread pool (see machine_limits.h). The SIMD kernels are
 * compiled per function with target attributes and chosen at run time, so one binary
 * measures AVX-512 where the CPU has it and AVX2 or plain C elsewhere.
 */
#include "bench/machine_limits.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_BENCH_X86 1
#else
#define LOOM_BENCH_X86 0
#endif

/* The loops' results are compared with a value they never take and stored here if equal,
 * so the compiler cannot drop the loops, and threads never actually race on the store. */
static volatile uint64_t loom__bench_sink_u64;
static volatile float loom__bench_sink_f32;
#define SINK_U64(v)                                                                                \
    do {                                                                                           \
        uint64_t sink_v_ = (v);                                                                    \
        if (sink_v_ == 0x5eed5eed5eed5eedull) loom__bench_sink_u64 = sink_v_;                      \
    } while (0)
#define SINK_F32(v)                                                                                \
    do {                                                                                           \
        float sink_v_ = (v);                                                                       \
        if (sink_v_ == -12345.0f) loom__bench_sink_f32 = sink_v_;                                  \
    } while (0)

/* The largest cache level sysfs lists for cpu0, in bytes (0 if none): the size of one
 * instance, which is what one core's working set can use. */
static size_t sysfs_llc_bytes(void) {
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], buf[32];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(path, "r");
        if (!f) continue;
        size_t v = 0;
        if (fgets(buf, sizeof buf, f)) {
            char *end = NULL;
            unsigned long long n = strtoull(buf, &end, 10);
            if (end && (*end == 'K' || *end == 'k')) n <<= 10;
            else if (end && (*end == 'M' || *end == 'm')) n <<= 20;
            v = (size_t)n;
        }
        fclose(f);
        if (level > best_level && v > 0) {
            best_level = level;
            best = v;
        }
    }
    return best;
}

/* The last-level cache one core can use. sysfs first: glibc's sysconf reads CPUID, which in
 * a VM may report the host's whole L3 (384 MiB on the 2-vCPU CI machine, whose sysfs and
 * lscpu say 32 MiB). */
size_t loom__bench_llc_bytes(void) {
    size_t sys = sysfs_llc_bytes();
    if (sys > 0) return sys;
    long l3 = -1, l2 = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (l3 > 0) return (size_t)l3;
    if (l2 > 0) return (size_t)l2;
    return 0;
}

/* ---------------------------------------------------------------- read kernels */

static uint64_t read_scalar(const uint64_t *p, size_t n_u64) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= n_u64; i += 4) {
        a0 ^= p[i + 0];
        a1 ^= p[i + 1];
        a2 ^= p[i + 2];
        a3 ^= p[i + 3];
    }
    for (; i < n_u64; i++)
        a0 ^= p[i];
    return a0 ^ a1 ^ a2 ^ a3;
}

#if LOOM_BENCH_X86
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n_u64) {
    const __m256i *v = (const __m256i *)p;
    size_t n = n_u64 / 4, i = 0;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 4 <= n; i += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i + 0));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + i + 3));
    }
    for (; i < n; i++)
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i));
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3] ^ read_scalar(p + n * 4, n_u64 - n * 4);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint64_t *p, size_t n_u64) {
    const __m512i *v = (const __m512i *)p;
    size_t n = n_u64 / 8, i = 0;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 4 <= n; i += 4) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(v + i + 0));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(v + i + 3));
    }
    for (; i < n; i++)
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(v + i));
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    uint64_t lanes[8];
    _mm512_storeu_si512((void *)lanes, a0);
    uint64_t r = read_scalar(p + n * 8, n_u64 - n * 8);
    for (int j = 0; j < 8; j++)
        r ^= lanes[j];
    return r;
}
#endif

typedef enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512 } bench_isa;

static bench_isa best_isa(void) {
#if LOOM_BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

static const char *isa_name(bench_isa isa) {
    return isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "scalar";
}

/* ---------------------------------------------------------------- bandwidth */

typedef enum { BW_TOUCH, BW_READ, BW_COPY } bw_mode;

typedef struct bw_task {
    loom_threadpool *tp;
    uint8_t *src;
    uint8_t *dst;
    size_t bytes; /* per buffer, a multiple of 64 * nth */
    bw_mode mode;
    bench_isa isa;
    int64_t t0, t1; /* written by thread 0 */
} bw_task;

static void bw_worker(int ith, int nth, void *user_data) {
    bw_task *t = user_data;
    size_t chunk = t->bytes / (size_t)nth;
    uint8_t *src = t->src + (size_t)ith * chunk;
    uint8_t *dst = t->dst + (size_t)ith * chunk;
    if (t->mode == BW_TOUCH) {
        /* first touch from the thread that will stream the chunk (NUMA placement) */
        memset(src, 1 + ith, chunk);
        memset(dst, 0, chunk);
        return;
    }
    loom_threadpool_barrier(t->tp);
    if (ith == 0) t->t0 = loom_time_ns();
    if (t->mode == BW_READ) {
        uint64_t r;
#if LOOM_BENCH_X86
        if (t->isa == ISA_AVX512)
            r = read_avx512((const uint64_t *)src, chunk / 8);
        else if (t->isa == ISA_AVX2)
            r = read_avx2((const uint64_t *)src, chunk / 8);
        else
#endif
            r = read_scalar((const uint64_t *)src, chunk / 8);
        SINK_U64(r);
    } else {
        memcpy(dst, src, chunk);
    }
    loom_threadpool_barrier(t->tp);
    if (ith == 0) t->t1 = loom_time_ns();
}

loom_status loom__bench_measure_bandwidth(loom_threadpool *tp, size_t bytes, int runs,
                                          loom__bench_bandwidth *out) {
    int nth = loom_threadpool_size(tp);
    size_t unit = (size_t)128 * (size_t)nth;
    bytes -= bytes % unit;
    memset(out, 0, sizeof *out);
    if (bytes == 0) return loom_error(LOOM_ERR_INVALID_ARG, "bandwidth test: buffer too small");
    uint8_t *src = loom_aligned_alloc(64, bytes);
    uint8_t *dst = loom_aligned_alloc(64, bytes / 2);
    if (!src || !dst) {
        loom_aligned_free(src);
        loom_aligned_free(dst);
        return loom_error(LOOM_ERR_NOMEM, "bandwidth test: cannot allocate %zu bytes",
                          bytes + bytes / 2);
    }
    bench_isa isa = best_isa();
    /* read: all of src; copy: the first half of src into dst (both far beyond the caches) */
    bw_task rd = {.tp = tp, .src = src, .dst = src, .bytes = bytes, .mode = BW_TOUCH, .isa = isa};
    bw_task cp = {.tp = tp, .src = dst, .dst = dst, .bytes = bytes / 2, .mode = BW_TOUCH};
    loom_threadpool_run(tp, bw_worker, &rd);
    loom_threadpool_run(tp, bw_worker, &cp);
    rd.mode = BW_READ;
    cp.src = src;
    cp.mode = BW_COPY;

    double best_read = 0, best_copy = 0;
    for (int r = 0; r < runs; r++) {
        loom_threadpool_run(tp, bw_worker, &rd);
        double s = (double)(rd.t1 - rd.t0) * 1e-9;
        if (s > 0 && (double)bytes / s > best_read) best_read = (double)bytes / s;
        loom_threadpool_run(tp, bw_worker, &cp);
        s = (double)(cp.t1 - cp.t0) * 1e-9;
        if (s > 0 && (double)bytes / s > best_copy) best_copy = (double)bytes / s;
    }
    loom_aligned_free(src);
    loom_aligned_free(dst);
    out->read_gbps = best_read * 1e-9;
    out->copy_gbps = best_copy * 1e-9; /* bytes/2 read + bytes/2 written */
    out->bytes = bytes;
    out->runs = runs;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- FMA peak */

/* Each kernel keeps its accumulators in registers: ACC independent chains are enough to
 * cover FMA latency times the number of FMA ports on current cores (4 cycles x 2). */
#define FMA_STEP(op, a) a = op(a, x, y)

static double fma_scalar(int64_t iters) {
    float a0 = 1.0f, a1 = 1.1f, a2 = 1.2f, a3 = 1.3f, a4 = 1.4f, a5 = 1.5f, a6 = 1.6f, a7 = 1.7f;
    const float x = 0.9999999f, y = 1e-7f;
    for (int64_t i = 0; i < iters; i++) {
        a0 = a0 * x + y;
        a1 = a1 * x + y;
        a2 = a2 * x + y;
        a3 = a3 * x + y;
        a4 = a4 * x + y;
        a5 = a5 * x + y;
        a6 = a6 * x + y;
        a7 = a7 * x + y;
    }
    SINK_F32(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
    return 2.0 * 8.0 * (double)iters;
}

#if LOOM_BENCH_X86
__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters) {
    const __m256 x = _mm256_set1_ps(0.9999999f), y = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f),
           a3 = _mm256_set1_ps(1.3f), a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f),
           a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f), a8 = _mm256_set1_ps(1.8f),
           a9 = _mm256_set1_ps(1.9f), a10 = _mm256_set1_ps(2.0f), a11 = _mm256_set1_ps(2.1f);
    for (int64_t i = 0; i < iters; i++) {
        FMA_STEP(_mm256_fmadd_ps, a0);
        FMA_STEP(_mm256_fmadd_ps, a1);
        FMA_STEP(_mm256_fmadd_ps, a2);
        FMA_STEP(_mm256_fmadd_ps, a3);
        FMA_STEP(_mm256_fmadd_ps, a4);
        FMA_STEP(_mm256_fmadd_ps, a5);
        FMA_STEP(_mm256_fmadd_ps, a6);
        FMA_STEP(_mm256_fmadd_ps, a7);
        FMA_STEP(_mm256_fmadd_ps, a8);
        FMA_STEP(_mm256_fmadd_ps, a9);
        FMA_STEP(_mm256_fmadd_ps, a10);
        FMA_STEP(_mm256_fmadd_ps, a11);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    SINK_F32(lanes[0] + lanes[7]);
    return 2.0 * 8.0 * 12.0 * (double)iters;
}

__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters) {
    const __m512 x = _mm512_set1_ps(0.9999999f), y = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f),
           a3 = _mm512_set1_ps(1.3f), a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f),
           a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f), a8 = _mm512_set1_ps(1.8f),
           a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f),
           a12 = _mm512_set1_ps(2.2f), a13 = _mm512_set1_ps(2.3f), a14 = _mm512_set1_ps(2.4f),
           a15 = _mm512_set1_ps(2.5f);
    for (int64_t i = 0; i < iters; i++) {
        FMA_STEP(_mm512_fmadd_ps, a0);
        FMA_STEP(_mm512_fmadd_ps, a1);
        FMA_STEP(_mm512_fmadd_ps, a2);
        FMA_STEP(_mm512_fmadd_ps, a3);
        FMA_STEP(_mm512_fmadd_ps, a4);
        FMA_STEP(_mm512_fmadd_ps, a5);
        FMA_STEP(_mm512_fmadd_ps, a6);
        FMA_STEP(_mm512_fmadd_ps, a7);
        FMA_STEP(_mm512_fmadd_ps, a8);
        FMA_STEP(_mm512_fmadd_ps, a9);
        FMA_STEP(_mm512_fmadd_ps, a10);
        FMA_STEP(_mm512_fmadd_ps, a11);
        FMA_STEP(_mm512_fmadd_ps, a12);
        FMA_STEP(_mm512_fmadd_ps, a13);
        FMA_STEP(_mm512_fmadd_ps, a14);
        FMA_STEP(_mm512_fmadd_ps, a15);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    SINK_F32(lanes[0] + lanes[15]);
    return 2.0 * 16.0 * 16.0 * (double)iters;
}
#endif

/* A register-resident kernel run on every thread of a pool, timed between barriers:
 * run(isa, iters) returns the operations one thread did. */
typedef struct peak_task {
    double (*run)(bench_isa isa, int64_t iters);
    bench_isa isa;
    int64_t iters;
    loom_threadpool *tp;
    double per_thread_ops; /* operations one thread did in the last run */
    int64_t t0, t1;
} peak_task;

static void peak_worker(int ith, int nth, void *user_data) {
    peak_task *t = user_data;
    (void)nth;
    loom_threadpool_barrier(t->tp);
    if (ith == 0) t->t0 = loom_time_ns();
    double f = t->run(t->isa, t->iters);
    if (ith == 0) t->per_thread_ops = f;
    loom_threadpool_barrier(t->tp);
    if (ith == 0) t->t1 = loom_time_ns();
}

/* The best of `runs` runs, in G operations/s, after calibrating to about 50 ms per run. */
static double peak_measure(peak_task *t, int runs) {
    t->iters = 1 << 16;
    for (;;) {
        loom_threadpool_run(t->tp, peak_worker, t);
        int64_t ns = t->t1 - t->t0;
        if (ns >= 20 * 1000 * 1000 || t->iters >= ((int64_t)1 << 40)) break;
        t->iters *= ns > 1000000 ? (int64_t)(50e6 / (double)ns) + 1 : 16;
    }
    double best = 0;
    for (int r = 0; r < runs; r++) {
        loom_threadpool_run(t->tp, peak_worker, t);
        double sec = (double)(t->t1 - t->t0) * 1e-9;
        double f = t->per_thread_ops * (double)loom_threadpool_size(t->tp) / sec;
        if (sec > 0 && f > best) best = f;
    }
    return best * 1e-9;
}

static double fma_run(bench_isa isa, int64_t iters) {
#if LOOM_BENCH_X86
    if (isa == ISA_AVX512) return fma_avx512(iters);
    if (isa == ISA_AVX2) return fma_avx2(iters);
#else
    (void)isa;
#endif
    return fma_scalar(iters);
}

void loom__bench_measure_fma_peak(loom_threadpool *tp, int runs, loom__bench_peak *out) {
    peak_task t = {.run = fma_run, .isa = best_isa(), .tp = tp};
    out->gflops = peak_measure(&t, runs);
    out->isa = isa_name(t.isa);
    out->runs = runs;
}

/* ---------------------------------------------------------------- int8 peak */

#if LOOM_BENCH_X86
/* 16 independent vpdpbusd chains: 64 u8 x s8 multiply-adds each (2 ops per pair). Named
 * accumulators, as in fma_avx512: an array of them is kept in memory by the compiler, and
 * the store-to-load chain then halves the measured rate. */
#define VNNI_STEP(a) a = _mm512_dpbusd_epi32(a, x_, y_)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_avx512(int64_t iters) {
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-1);
    __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1), a2 = _mm512_set1_epi32(2),
            a3 = _mm512_set1_epi32(3), a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5),
            a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7), a8 = _mm512_set1_epi32(8),
            a9 = _mm512_set1_epi32(9), a10 = _mm512_set1_epi32(10), a11 = _mm512_set1_epi32(11),
            a12 = _mm512_set1_epi32(12), a13 = _mm512_set1_epi32(13), a14 = _mm512_set1_epi32(14),
            a15 = _mm512_set1_epi32(15);
    __m512i x_ = x, y_ = y; /* opaque: the compiler must not fold the constant products */
    __asm__ volatile("" : "+v"(x_), "+v"(y_));
    for (int64_t i = 0; i < iters; i++) {
        VNNI_STEP(a0);
        VNNI_STEP(a1);
        VNNI_STEP(a2);
        VNNI_STEP(a3);
        VNNI_STEP(a4);
        VNNI_STEP(a5);
        VNNI_STEP(a6);
        VNNI_STEP(a7);
        VNNI_STEP(a8);
        VNNI_STEP(a9);
        VNNI_STEP(a10);
        VNNI_STEP(a11);
        VNNI_STEP(a12);
        VNNI_STEP(a13);
        VNNI_STEP(a14);
        VNNI_STEP(a15);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a12, a13), _mm512_add_epi32(a14, a15)));
    SINK_U64((uint64_t)_mm512_reduce_add_epi64(s)); /* 64 bits: a 32-bit sum could never match the sink value, and the loop would be dropped */
    return 2.0 * 64.0 * 16.0 * (double)iters;
}
#undef VNNI_STEP

static double vnni_run(bench_isa isa, int64_t iters) {
    (void)isa;
    return vnni_avx512(iters);
}
#endif

bool loom__bench_measure_int8_peak(loom_threadpool *tp, int runs, loom__bench_peak *out) {
    memset(out, 0, sizeof *out);
#if LOOM_BENCH_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return false;
    peak_task t = {.run = vnni_run, .tp = tp};
    out->gflops = peak_measure(&t, runs);
    out->isa = "avx512-vnni";
    out->runs = runs;
    return true;
#else
    (void)tp;
    (void)runs;
    return false;
#endif
}
