/*
 * Helpers shared by the GPU tests (tests/gpu/): finding a CUDA device or skipping with a
 * clear message, the path of a runfile, and a deterministic random stream.
 */
#ifndef LOOM_TESTS_GPU_UTIL_H
#define LOOM_TESTS_GPU_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom/cuda.h"
#include "tests/shim/loom_test.h"

/* Device `index` of the process-wide CUDA reg, or NULL when there is none (why in buf). */
static inline loom_dev_t gpu_device(size_t index, char *why, size_t size) {
    loom_reg_t reg = loom_cuda_reg();
    size_t n = reg ? loom_reg_dev_count(reg) : 0;
    if (index < n) return loom_reg_dev_get(reg, index);
    if (n == 0)
        snprintf(why, size, "no CUDA devices: %s", loom_cuda_no_devices_reason(reg));
    else
        snprintf(why, size, "needs %zu CUDA devices, found %zu", index + 1, n);
    return NULL;
}

/* Declares `loom_dev_t var` = CUDA device 0, or skips the test saying why. */
#define GPU_DEVICE_OR_SKIP(var)                                                                    \
    char var##_why[512];                                                                           \
    loom_dev_t var = gpu_device(0, var##_why, sizeof var##_why);                                   \
    if (!var) LOOM_SKIP(var##_why)

static inline const char *gpu_runfile(const char *rel, char *buf, size_t size) {
    const char *srcdir = getenv("TEST_SRCDIR");
    const char *ws = getenv("TEST_WORKSPACE");
    snprintf(buf, size, "%s/%s/%s", srcdir ? srcdir : ".", ws ? ws : "loom", rel);
    return buf;
}

/* xorshift64*: a deterministic stream independent of the test shim's. */
static inline uint64_t gpu_rand_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

static inline double gpu_randf(uint64_t *s, double lo, double hi) {
    return lo + (hi - lo) * (double)(gpu_rand_next(s) >> 11) * 0x1p-53;
}

#endif /* LOOM_TESTS_GPU_UTIL_H */
