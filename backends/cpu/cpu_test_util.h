/*
 * Helpers of the CPU backend's own tests (cpu_smoke_test, qgemm_test, bgemm_test): a
 * context, activations in a chosen layout, and one graph computed on the CPU backend.
 */
#ifndef LOOM_CPU_TEST_UTIL_H
#define LOOM_CPU_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/cpu.h"

/* An allocating context of mb MiB. */
loom_ctx *loom_cpu_test_ctx(size_t mb);

/* How a GEMM test lays out its f32 activations b: contiguous, a transposed view (k
 * strided), or rows padded past K. */
typedef enum b_layout { B_CONTIG, B_TRANSPOSED, B_PADDED } b_layout;

/* b of K x N x B2 floats in layout lb (B_PADDED: pad floats past each row) in ctx, its
 * storage every byte 0x7f (huge values: padding that a kernel reads shows); *src (if not
 * NULL) gets the tensor holding the storage. NULL if ctx is full. */
loom_tensor *loom_cpu_test_b(loom_ctx *ctx, int64_t K, int64_t N, int64_t B2, b_layout lb,
                             int64_t pad, loom_tensor **src);

/* x[0..n) uniform in [lo, hi) from the test shim's seeded generator. */
void loom_cpu_test_fill_f32(float *x, int64_t n, float lo, float hi);

/* A contiguous tensor of t's type holding the given f32 values (quantised through core's
 * traits, row by row). */
void loom_cpu_test_set_from_f32(loom_tensor *t, const float *x);

/* Builds the graph of out and computes it on the CPU backend with `threads` threads
 * (1: no pool). */
loom_status loom_cpu_test_compute(loom_tensor *out, int threads);

#endif /* LOOM_CPU_TEST_UTIL_H */
