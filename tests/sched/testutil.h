/*
 * Helpers for the scheduler and graph-allocator tests: device sets ([sim..., CPU]), a small
 * llama-shaped model whose weights can be placed per layer in any buffer type, an
 * independent CPU reference (every tensor in its own memory, computed by the CPU backend),
 * deterministic inputs, tensor comparison, a log capture and a failing host allocator.
 */
#ifndef LOOM_TESTS_SCHED_TESTUTIL_H
#define LOOM_TESTS_SCHED_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "loom/cpu.h"
#include "loom/sched.h"
#include "loom/sim.h"

/* ---------------------------------------------------------------- devices */

#define TU_MAX_BACKENDS 20

typedef struct tu_devs {
    loom_reg_t regs[4];
    int n_regs;
    loom_backend_t backends[TU_MAX_BACKENDS]; /* sims in spec order, then the CPU */
    int n;
    loom_backend_t cpu;
} tu_devs;

/* One sim reg per spec ("sim:2,mem=1MiB"), all its devices in order, then a CPU backend
 * (threads as given, <= 0: 2). false on failure (message in loom_last_error). */
bool tu_devs_open(tu_devs *d, const char *const *specs, int n_specs, int cpu_threads);
void tu_devs_close(tu_devs *d);
loom_buft_t tu_buft(const tu_devs *d, int i); /* default buffer type of backend i */

/* ---------------------------------------------------------------- tensors */

loom_ctx *tu_ctx(size_t n_tensors, bool no_alloc);          /* with room for one graph */
float tu_value(const char *name, uint32_t seed, int64_t i); /* deterministic, [-1, 1) */
/* Writes tu_value(name, seed, i) * scale in t's type (F32, F16; I32 gets i % modulo). */
void tu_fill(loom_tensor *t, uint32_t seed, float scale);
/* The F32 contents of t (any memory), malloc'd. */
float *tu_read(const loom_tensor *t);
/* Max |a - b| / (1 + |b|) over all elements (F32, same shape); < 0 on shape mismatch. */
double tu_max_rel_err(const loom_tensor *a, const loom_tensor *b);

/* ---------------------------------------------------------------- the model */

#define TU_MAX_LAYERS 40

typedef struct tu_cfg {
    int n_layer;
    int d;      /* model width */
    int n_head; /* head dim = d / n_head */
    int n_ff;
    int n_out; /* output projection rows */
    int T;     /* tokens in the batch */
} tu_cfg;

typedef struct tu_layer {
    loom_tensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;
} tu_layer;

typedef struct tu_weights {
    tu_cfg cfg;
    tu_layer l[TU_MAX_LAYERS];
    loom_tensor *out_norm, *out;
    loom_ctx *ctx[TU_MAX_LAYERS + 1];
    loom_buffer_t buf[TU_MAX_LAYERS + 1];
} tu_weights;

/* Weights of layer i in bufts[i] (bufts[n_layer] for the output head), usage WEIGHTS,
 * filled deterministically, so two weight sets with different placements hold the same
 * values. */
bool tu_weights_new(tu_weights *w, const tu_cfg *cfg, const loom_buft_t *bufts);
void tu_weights_free(tu_weights *w);

typedef struct tu_inputs {
    loom_tensor *x, *pos, *mask;
} tu_inputs;

/* The forward graph (rms_norm, q/k/v, neox rope, flash attention with a causal mask,
 * swiglu FFN, residuals, output head) of w on inputs created in ctx (flagged INPUT). */
loom_tensor *tu_build(loom_ctx *ctx, const tu_weights *w, tu_inputs *in);
void tu_set_inputs(const tu_inputs *in, uint32_t seed);

/* The independent reference: builds the model on a CPU copy of the weights, allocates every
 * tensor in its own memory and computes it on the CPU backend. Returns the output (owned by
 * *ref). */
typedef struct tu_ref {
    loom_ctx *ctx;
    loom_buffer_t buf;
    loom_backend_t cpu;
    tu_weights w;
    loom_tensor *out;
} tu_ref;
bool tu_ref_compute(tu_ref *ref, const tu_cfg *cfg, uint32_t seed);
void tu_ref_free(tu_ref *ref);

/* A graph of capacity LOOM_DEFAULT_GRAPH_SIZE * 2 in ctx holding out. */
loom_graph *tu_graph(loom_ctx *ctx, loom_tensor *out);

/* A model graph ready for a scheduler: weights placed by bufts, output flagged OUTPUT. */
typedef struct tu_model {
    tu_weights w;
    loom_ctx *ctx;
    loom_graph *g;
    tu_inputs in;
    loom_tensor *out;
} tu_model;
bool tu_model_new(tu_model *m, const tu_cfg *cfg, const loom_buft_t *bufts);
/* A new graph over the same weights (the previous graph is freed). */
bool tu_model_rebuild(tu_model *m, int T);
void tu_model_free(tu_model *m);

/* A host buffer type "SMALL" with the given max size and alignment (buffers come from the
 * CPU buffer type). At most 4 distinct ones per process. */
loom_buft_t tu_small_buft(size_t max_size, size_t alignment);

/* ---------------------------------------------------------------- logs, faults */

/* Captures log lines (all levels) until tu_log_stop. */
void tu_log_start(void);
void tu_log_stop(void);
const char *tu_log_text(void); /* everything captured, one line per message */
int tu_log_count(const char *needle);

/* Host allocations fail from the n-th call on (n >= 1) until tu_fail_stop. */
void tu_fail_after(int n);
int tu_fail_stop(void); /* returns how many allocations were attempted */

#endif /* LOOM_TESTS_SCHED_TESTUTIL_H */
