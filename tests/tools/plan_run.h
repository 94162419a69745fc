/*
 * The real runs the `loom plan` tests compare their plans with (plan_test, plan_hybrid_test):
 * stories260K, the full file, on sim devices with real memory and the real weights.
 */
#ifndef LOOM_TESTS_TOOLS_PLAN_RUN_H
#define LOOM_TESTS_TOOLS_PLAN_RUN_H

#include <stdbool.h>

#include "loom/session.h"

typedef struct loom_test_run_cfg {
    loom_split_mode mode;
    int n_dev; /* sim:n_dev,profile=rtx-3090,link=pcie4 */
    int64_t n_ctx, n_batch;
    loom_type kv_k, kv_v;
    const float *ts; /* -ts proportions, or NULL */
    int n_ts;
    int host_layers; /* layers kept in host memory (-ngl 5 - host_layers), 0: none */
    bool to_depth;   /* fill the context to its last position */
} loom_test_run_cfg;

typedef struct loom_test_run_bytes {
    int n_dev;      /* the session's devices */
    double dev[16]; /* each device's own allocation counter (sim mem_used) */
    double host_weights, host_kv, host_compute;
} loom_test_run_bytes;

/* The run of c: a prompt of n_batch tokens, one token, and (to_depth) batches until the
 * context's last position is written; the bytes allocated then. false when a step failed
 * (loom_last_error says why) or the model is not the 5 layers the host layers assume. */
bool loom_test_plan_real_run(const loom_test_run_cfg *c, loom_test_run_bytes *b);

#endif
