/*
 * time.c: monotonic clock for benchmarks, timeouts and logs.
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "core/core-impl.h"

int64_t loom_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t loom_time_us(void) {
    return loom_time_ns() / 1000;
}
