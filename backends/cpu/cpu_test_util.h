/*
 * Helpers of the CPU backend's own tests (cpu_smoke_test, qgemm_test, bgemm_test): a
 * context and one graph computed on the CPU backend.
 */
#ifndef LOOM_CPU_TEST_UTIL_H
#define LOOM_CPU_TEST_UTIL_H

#include <stddef.h>

#include "loom/cpu.h"

/* An allocating context of mb MiB. */
loom_ctx *loom_cpu_test_ctx(size_t mb);

/* Builds the graph of out and computes it on the CPU backend with `threads` threads
 * (1: no pool). */
loom_status loom_cpu_test_compute(loom_tensor *out, int threads);

#endif /* LOOM_CPU_TEST_UTIL_H */
