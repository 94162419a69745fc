/*
 * Helpers for the reduce tests: a set of sim devices with one backend each, and a set of
 * per-device F32 tensors placed between guard regions (so a write outside the tensor is
 * caught), filled with inputs that are a pure function of (seed, device, index).
 *
 * Inputs are multiples of 1/64 in [-1000/64, 1000/64], so every partial sum of up to 16 of
 * them is exact in F32: any correct summation order gives bit-for-bit the reference
 * computed on the host in double, and a wrong or missing contribution cannot hide in
 * rounding. rt_fill_real gives ordinary random floats for the rounding-tolerance checks.
 */
#ifndef LOOM_TESTS_REDUCE_UTIL_H
#define LOOM_TESTS_REDUCE_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/reduce.h"
#include "loom/sim.h"

#define RT_MAX 16
#define RT_GUARD 37 /* guard floats before and after each tensor (odd on purpose) */
#define RT_GUARD_VAL 12345.0f

typedef struct rt_devs {
    loom_reg_t reg;
    int n;
    loom_backend_t be[RT_MAX];
} rt_devs;

/* Opens "sim:N,..." and a backend per device. false (with a test failure) on error.
 * comm=0 is added unless the spec says comm= itself (the reducer's own algorithms). */
bool rt_devs_open(rt_devs *d, const char *spec);
void rt_devs_close(rt_devs *d);

typedef struct rt_set {
    int n;
    int64_t ne; /* elements per tensor */
    loom_ctx *ctx[RT_MAX];
    loom_buffer_t buf[RT_MAX];
    loom_tensor *whole[RT_MAX]; /* guard + tensor + guard */
    loom_tensor *t[RT_MAX];     /* the tensors to reduce: views into whole */
} rt_set;

/* Tensors of shape [ne0, ne1] on every device (ne0*ne1 elements). false on error (the
 * error is left in loom_last_error, no test failure recorded: OOM tests use it). */
bool rt_set_alloc(rt_set *s, const rt_devs *d, int64_t ne0, int64_t ne1);
void rt_set_free(rt_set *s);

/* Input value of device j at element i for a seed (exact multiple of 1/64). */
float rt_val(uint64_t seed, int j, int64_t i);

/* Writes the inputs (guards included) to every device; devices flagged in `empty` get NaN
 * (a quiet NaN, or -inf on odd elements) instead of data. */
void rt_fill(rt_set *s, uint64_t seed, const bool *empty);
/* The exact expected sum (computed in double over non-empty devices), n floats. The caller
 * frees it with free(). */
float *rt_expected(const rt_set *s, uint64_t seed, const bool *empty);
/* Reads every device back and checks guards intact and data == expected bit for bit.
 * `what` prefixes failure messages. Returns the number of mismatching devices. */
int rt_check(const rt_set *s, const float *expected, const char *what);

/* Ordinary random floats in [-1, 1) (not exactly summable) on every device; returns the
 * inputs as n_dev x ne floats (free()). */
float *rt_fill_real(rt_set *s, uint64_t seed);
/* Reads device j's tensor into out (ne floats). */
void rt_read(const rt_set *s, int j, float *out);

/* A reducer with the given forced algorithm (AUTO = ladder), failing the test if NULL. */
loom_reducer *rt_reducer(const rt_devs *d, loom_allreduce_algo algo);

#endif /* LOOM_TESTS_REDUCE_UTIL_H */
