/*
 * A differential harness for the meta device: a graph built by a callback runs on the CPU
 * backend (the oracle) and on Meta(sim:N), alone or under a scheduler over [Meta, CPU],
 * and every output is compared element by element. Leafs are declared through the
 * builder with the split state the meta device's callback returns for them (by name), and
 * a fill: floats in [-1, 1), or integer ids in [0, range) (distinct per column for
 * SET_ROWS rows). The same callback is run once per backend; it must build the same graph
 * every time (draw any randomness from the builder's seed).
 *
 * Used by the fix tests (a graph per defect) and by the fuzzer (random graphs).
 */
#ifndef LOOM_TESTS_META_DIFF_H
#define LOOM_TESTS_META_DIFF_H

#include "loom/meta.h"
#include "loom/splitstate.h"

#define MD_MAX_LEAVES 96
#define MD_MAX_OUTS 256

typedef enum md_fill {
    MD_FILL_FLOAT, /* uniform in [-1, 1) */
    MD_FILL_IDS,   /* integers in [0, range) */
    MD_FILL_ROWS,  /* integers in [0, range), distinct along axis 0 */
} md_fill;

typedef struct md_leaf {
    loom_tensor *t;
    loom_split_state state;
    md_fill fill;
    int64_t range;
    bool host; /* under a scheduler: lives in a CPU buffer (a graph input) */
} md_leaf;

typedef struct md_builder {
    loom_ctx *ctx;  /* the graph's computed tensors (build ops here) */
    loom_ctx *lctx; /* device leafs (md_leaf_new) */
    loom_ctx *hctx; /* host leafs */
    int n;          /* devices of the meta device (the states' n_devices) */
    uint64_t seed;  /* the case's seed: the builder may draw from it (md_rand) */
    uint64_t rng;   /* reset to seed before every build */
    md_leaf leaves[MD_MAX_LEAVES];
    int n_leaves;
    loom_tensor *outs[MD_MAX_OUTS];
    int n_outs;
    bool failed; /* a builder call failed: the case is a setup error */
    char why[256];
} md_builder;

typedef void (*md_build_fn)(md_builder *b, void *user_data);

/* A deterministic stream for the builder (reset before every build). */
uint64_t md_rand(md_builder *b);
int64_t md_rand_range(md_builder *b, int64_t lo, int64_t hi); /* [lo, hi] */

/* A leaf of type F32 (or I32 for the id fills) named `name` (unique), shape ne (1 for an
 * unused dimension), with split state `state` (NULL: MIRRORED). */
loom_tensor *md_leaf_new(md_builder *b, const char *name, loom_type type, const int64_t ne[4],
                         const loom_split_state *state, md_fill fill, int64_t range);
/* Shorthands: an F32 leaf with an even split along `axis` (LOOM_SPLIT_MIRRORED / PARTIAL
 * for those states), and a leaf with explicit per-device counts along axis. */
loom_tensor *md_f32(md_builder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                    loom_split_axis axis);
loom_tensor *md_f32_counts(md_builder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                           loom_split_axis axis, const int64_t *counts);
/* Marks t an output to compare (a leaf too: its contents after the graph). */
void md_output(md_builder *b, loom_tensor *t);
/* Records a builder failure (a NULL from an op builder). Returns t. */
loom_tensor *md_check(md_builder *b, loom_tensor *t, const char *what);

typedef struct md_config {
    int n;                /* devices, 1..8 */
    const char *sim_opts; /* appended to "sim:N", e.g. ",refuse=rms_norm" (NULL: none) */
    loom_allreduce_algo algo;
    bool sched;    /* under a scheduler over [Meta, CPU]; else the meta backend alone */
    bool nan_fill; /* meta memory pre-filled with NaN (alone only) */
    int repeats;   /* computes of the same graph (>= 1); alone, each after the first marks
                    * one more intermediate OUTPUT (flags changed between runs) */
    uint64_t seed;
} md_config;

typedef enum md_verdict {
    MD_EXACT,   /* every output matches the CPU */
    MD_REFUSED, /* the meta path failed with an error (a clean refusal) */
    MD_WRONG,   /* an output differs, or a crash-free failure the case forbids */
    MD_SETUP,   /* the case could not be built (builder or oracle failed) */
} md_verdict;

typedef struct md_result {
    md_verdict verdict;
    char msg[768];
    int n_nodes;
} md_result;

/* Builds the graph for the CPU and for Meta(sim:n) and compares. */
md_result md_run(const md_config *c, md_build_fn build, void *user_data);

/* "exact", "refused", "WRONG", "setup" */
const char *md_verdict_name(md_verdict v);

#endif /* LOOM_TESTS_META_DIFF_H */
