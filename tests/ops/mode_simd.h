/*
 * Shared by the capped-SIMD targets (mode_avx2.c, mode_scalar.c): each sets
 * LOOM_CPU_SIMD from a constructor that runs before any other (priority 101), so the
 * CPU backend sees the cap however early it reads the variable, then checks at every
 * open that the backend really runs that path.
 */
#ifndef LOOM_TESTS_OPS_MODE_SIMD_H
#define LOOM_TESTS_OPS_MODE_SIMD_H

#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "tests/ops/harness.h"

/* Whether this CPU can run the path at all (if not, the target's cases are skipped). */
static bool ops_simd_available(const char *path) {
    __builtin_cpu_init();
    if (!strcmp(path, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strcmp(path, "avx512")) return __builtin_cpu_supports("avx512f");
    return true;
}

static bool ops_simd_open(const char *path, int config, ops_backend *out) {
    if (!ops_simd_available(path)) {
        loom_test_skip(__FILE__, __LINE__, "this CPU cannot run the requested SIMD path");
        return false;
    }
    const char *name = loom_cpu_simd_name();
    if (!name || strcmp(name, path) != 0) {
        loom_test_fail(__FILE__, __LINE__,
                       "LOOM_CPU_SIMD=%s is set but the CPU backend runs the \"%s\" path", path,
                       name ? name : "(null)");
        return false;
    }
    return ops_cpu_open(config, out);
}

#endif /* LOOM_TESTS_OPS_MODE_SIMD_H */
