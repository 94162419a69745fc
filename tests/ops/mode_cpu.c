/*
 * ops_test: every ops case on the CPU backend's default SIMD path (the best this machine
 * has), with 1 and with 3 threads, against the scalar reference.
 */
#include <string.h>

#include "loom/cpu.h"
#include "tests/ops/harness.h"

const ops_mode ops_target_mode = {
    .name = "cpu",
    .n_configs = 2,
    .replay = false,
    .open = ops_cpu_open,
    .close = ops_cpu_close,
};

/* The default path is one of the documented three, and a SIMD one where the CPU has
 * AVX2+FMA (otherwise the "default" run would silently test the scalar path twice). */
LOOM_TEST(ops_mode, default_simd_path) {
    const char *name = loom_cpu_simd_name();
    LOOM_REQUIRE(name != NULL);
    LOOM_CHECK_MSG(!strcmp(name, "avx512") || !strcmp(name, "avx2") || !strcmp(name, "scalar"),
                   "loom_cpu_simd_name() = \"%s\"", name);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        LOOM_CHECK_MSG(strcmp(name, "scalar") != 0,
                       "the CPU has AVX2+FMA but the default path is \"%s\"", name);
}
