/*
 * ops_scalar_test: every ops case on the CPU backend capped to the scalar SIMD path
 * (LOOM_CPU_SIMD=scalar), with 1 and with 3 threads, against the scalar reference.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/ops/mode_simd.h"

__attribute__((constructor(101))) static void ops_simd_cap(void) {
    setenv("LOOM_CPU_SIMD", "scalar", 1);
}

static bool ops_open_scalar(int config, ops_backend *out) {
    return ops_simd_open("scalar", config, out);
}

const ops_mode ops_target_mode = {
    .name = "scalar",
    .n_configs = 2,
    .replay = false,
    .open = ops_open_scalar,
    .close = ops_cpu_close,
};

LOOM_TEST(ops_mode, scalar_path_is_used) {
    if (!ops_simd_available("scalar")) LOOM_SKIP("this CPU cannot run the scalar path");
    const char *name = loom_cpu_simd_name();
    LOOM_REQUIRE(name != NULL);
    LOOM_CHECK_MSG(!strcmp(name, "scalar"), "loom_cpu_simd_name() = \"%s\"", name);
}
