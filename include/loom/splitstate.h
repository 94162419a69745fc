/*
 * loom split states: how one logical tensor is distributed over the N devices of a meta
 * device (tensor parallelism), and the op rule table that derives the state of every
 * computed tensor from the states of its sources. Pure logic: no device is touched.
 *
 * A state is one of
 *   AXIS_0..AXIS_3  each device holds a slice of the tensor along that axis;
 *   MIRRORED        every device holds the whole tensor;
 *   PARTIAL         every device holds a whole-shape tensor, and the true value is the sum
 *                   over devices (the output of a row-parallel matmul, before AllReduce);
 *   NONE            not known / not set (a leaf whose layout follows the op writing it).
 *
 * Layout of a split axis (exact, possibly uneven, possibly zero per device): along the
 * axis the tensor is a sequence of segments; segment s occurs nr[s] times in a row, and
 * every occurrence is cut across the devices in device order, device j taking ne[s][j]
 * elements. Device j's slice is the concatenation, in global order, of its pieces. So
 *   sum_s nr[s] * sum_j ne[s][j] == tensor->ne[axis]
 * and device j's slice has sum_s nr[s] * ne[s][j] elements along the axis (its other
 * dimensions are whole). A fused QKV weight [n_embd, n_q + 2 n_kv] split on axis 1 is three
 * segments {q counts}, {k counts}, {v counts}: every device gets its own heads of each.
 * Two states are equal when they describe the same layout (segmentation is normalised:
 * "[2,2]x2" equals "[2,2]+[2,2]").
 *
 * The rule table (loom_split_rule_apply) covers every op of docs/ops.md. Sources are
 * resolved with the assume-sync rule: a computed source whose state is PARTIAL is seen as
 * MIRRORED, because the meta device reduces it before anything consumes it. Leafs (op NONE)
 * and views of leafs keep PARTIAL (a weight stored as b/N per device is never reduced), and
 * only linear ops accept them. An op the table cannot split gets LOOM_ERR_UNSUPPORTED with
 * a message naming op, tensor and the states that do not fit, e.g.
 *   "rms_norm 'attn_norm-0': cannot split along axis 0 (the normalised row)".
 *
 * loom_split_ctx adds the leaf callback and a cache of derived states that cannot go stale
 * (see loom_split_ctx_get).
 */
#ifndef LOOM_SPLITSTATE_H
#define LOOM_SPLITSTATE_H

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_SPLIT_MAX_DEVICES 16
#define LOOM_SPLIT_MAX_SEGMENTS 8

typedef enum loom_split_axis {
    LOOM_SPLIT_AXIS_0 = 0,
    LOOM_SPLIT_AXIS_1 = 1,
    LOOM_SPLIT_AXIS_2 = 2,
    LOOM_SPLIT_AXIS_3 = 3,
    LOOM_SPLIT_MIRRORED = 10,
    LOOM_SPLIT_PARTIAL = 11,
    LOOM_SPLIT_NONE = 12,
} loom_split_axis;

typedef struct loom_split_state {
    loom_split_axis axis;
    int n_devices;  /* 1..LOOM_SPLIT_MAX_DEVICES */
    int n_segments; /* 0 unless axis is 0..3; then 1..LOOM_SPLIT_MAX_SEGMENTS */
    int64_t nr[LOOM_SPLIT_MAX_SEGMENTS]; /* repeats of each segment (>= 1) */
    /* ne[s][j]: elements along the axis of one occurrence of segment s on device j */
    int64_t ne[LOOM_SPLIT_MAX_SEGMENTS][LOOM_SPLIT_MAX_DEVICES];
} loom_split_state;

/* "AXIS_0".."AXIS_3", "MIRRORED", "PARTIAL", "NONE"; "?" for anything else. */
LOOM_API const char *loom_split_axis_name(loom_split_axis axis);
LOOM_API bool loom_split_axis_is_dim(loom_split_axis axis); /* AXIS_0..AXIS_3 */

/* ---------------------------------------------------------------- building states */

/* A state with no segments: MIRRORED, PARTIAL, NONE, or an axis to which segments are
 * then added. n_devices outside 1..LOOM_SPLIT_MAX_DEVICES is a bug (asserted). */
LOOM_API void loom_split_state_init(loom_split_state *s, loom_split_axis axis, int n_devices);

/* Appends a segment with explicit per-device counts (n_devices of them), repeated nr
 * times. LOOM_ERR_INVALID_ARG for negative counts or nr < 1, LOOM_ERR_FULL beyond
 * LOOM_SPLIT_MAX_SEGMENTS. */
LOOM_API loom_status loom_split_state_add_segment(loom_split_state *s, const int64_t *counts,
                                                  int64_t nr);

/* Splits `size` elements over n_devices in units of `granularity` (a head size, 32 for a
 * Q4_0 row, 1 for none): every device gets floor(units / n) units and the remaining units
 * go one each to devices rotation, rotation+1, ... (mod n), so rotating with the layer
 * index spreads the remainder. weights (optional, n_devices non-negative values with a
 * positive sum) make the split proportional instead: each device gets the floor of its
 * share and the leftover units go, in the same rotated order, to devices of positive
 * weight. Devices may get 0. LOOM_ERR_INVALID_ARG when size is not a multiple of the
 * granularity (naming both), or for a bad count, granularity or weight. */
LOOM_API loom_status loom_split_counts(int64_t size, int64_t granularity, int n_devices,
                                       int rotation, const float *weights, int64_t *counts);

/* Appends one segment of `size` elements split evenly (loom_split_counts, no weights). */
LOOM_API loom_status loom_split_state_add_even(loom_split_state *s, int64_t size,
                                               int64_t granularity, int rotation, int64_t nr);

/* init + one evenly split segment: the common case. */
LOOM_API loom_status loom_split_state_even(loom_split_state *s, loom_split_axis axis, int n_devices,
                                           int64_t size, int64_t granularity, int rotation);

/* ---------------------------------------------------------------- queries */

/* Elements along the axis in the whole tensor (0 unless split). */
LOOM_API int64_t loom_split_state_total(const loom_split_state *s);
/* Elements along the axis on device j (0 unless split). */
LOOM_API int64_t loom_split_state_dev_count(const loom_split_state *s, int dev);

/* The shape of device j's slice of a tensor of shape ne: ne with ne[axis] replaced by the
 * device's count; the whole shape for MIRRORED, PARTIAL and NONE. */
LOOM_API void loom_split_state_slice_ne(const loom_split_state *s, const int64_t ne[4], int dev,
                                        int64_t out[4]);
LOOM_API int64_t loom_split_state_slice_nelements(const loom_split_state *s, const loom_tensor *t,
                                                  int dev);
/* Bytes of device j's slice of t, stored contiguously (block types: rows of whole blocks). */
LOOM_API size_t loom_split_state_slice_nbytes(const loom_split_state *s, const loom_tensor *t,
                                              int dev);

/* One piece of a device's slice: occurrence `rep` of segment `seg` on device `dev`. In a
 * contiguous tensor the axis is cut into chunks (one per index of the dimensions above
 * it); a piece is the same run of every chunk. Byte figures assume contiguous storage of
 * the full tensor and of the device's slice (one element step along the axis is nb[axis]
 * of the contiguous tensor; on axis 0 of a block type offsets and sizes are whole blocks). */
typedef struct loom_split_range {
    int64_t offset;          /* first element along the axis in the full tensor */
    int64_t size;            /* elements along the axis */
    int64_t dev_offset;      /* first element along the axis in the device's slice */
    size_t offset_bytes;     /* offset in bytes within one chunk of the full tensor */
    size_t size_bytes;       /* size in bytes within one chunk */
    size_t dev_offset_bytes; /* offset in bytes within one chunk of the device's slice */
    size_t chunk_bytes;      /* bytes of one chunk of the full tensor (ne[axis] elements) */
    size_t dev_chunk_bytes;  /* bytes of one chunk of the device's slice */
    int64_t n_chunks;        /* number of chunks (product of ne above the axis) */
} loom_split_range;

/* LOOM_ERR_INVALID_ARG for a state that is not split, or seg/rep/dev out of range. For
 * one segment with nr = 1 (the common case), seg = rep = 0 gives device j's whole slice. */
LOOM_API loom_status loom_split_state_range(const loom_split_state *s, const loom_tensor *t,
                                            int seg, int64_t rep, int dev, loom_split_range *out);

/* Same axis and n_devices, and for split axes the same layout. */
LOOM_API bool loom_split_state_equal(const loom_split_state *a, const loom_split_state *b);

/* "AXIS_0 [48,48,40,36]", "AXIS_1 [4,4]+[2,2]+[2,2]", "AXIS_0 [2,2]x3", "MIRRORED",
 * "PARTIAL", "NONE". Returns the length snprintf would (truncates safely). */
LOOM_API int loom_split_state_format(const loom_split_state *s, char *buf, size_t size);

/* Checks that s is a well-formed state for tensor t: n_devices in range; a split axis
 * below 4 with 1..MAX segments, nr >= 1, counts >= 0 summing to t->ne[axis], each count a
 * multiple of `granularity` (<= 1: none) and, on axis 0, of the type's block length.
 * LOOM_ERR_INVALID_ARG with a message naming the tensor, the state and the problem. */
LOOM_API loom_status loom_split_state_validate(const loom_split_state *s, const loom_tensor *t,
                                               int64_t granularity);

/* The layout of the elements [start, start + len) of a split axis, as the state of a view
 * that selects that range (every device's part of a range is contiguous in its slice).
 * dev_start (optional, n_devices entries) receives where each device's part begins in its
 * slice. LOOM_ERR_INVALID_ARG if the range is outside the axis, LOOM_ERR_FULL if the result
 * needs more than LOOM_SPLIT_MAX_SEGMENTS segments. */
LOOM_API loom_status loom_split_state_sub(const loom_split_state *s, int64_t start, int64_t len,
                                          loom_split_state *out, int64_t *dev_start);

/* ---------------------------------------------------------------- the op rule table */

/* Whether the rule table has a rule for op (its whitelist). */
LOOM_API bool loom_split_op_known(loom_op op);

/* The state of t from the states of its sources. src[i] (LOOM_MAX_SRC entries; NULL for
 * an absent source) is the state of t->src[i], already resolved with assume-sync (see
 * loom_split_state_assume_sync). dst is the state of t->view_src for SET_ROWS (the
 * destination), ignored otherwise. Op NONE (a leaf) is not a rule: LOOM_ERR_INVALID_ARG.
 * The result carries exact counts. LOOM_ERR_UNSUPPORTED with a message naming op, tensor
 * and the states that do not fit when the op cannot be split that way. */
LOOM_API loom_status loom_split_rule_apply(const loom_tensor *t, const loom_split_state *const *src,
                                           const loom_split_state *dst, int n_devices,
                                           loom_split_state *out);

/* The state a consumer sees for tensor t of true state s: a computed (not a view, not a
 * leaf) PARTIAL tensor is reduced before use, so it reads as MIRRORED; otherwise s. */
LOOM_API void loom_split_state_assume_sync(const loom_tensor *t, loom_split_state *s);

/* Whether t adds a PARTIAL bias to a partial sum: an ADD or ADD_ID of a computed tensor
 * src[0] whose true state a_true is PARTIAL and a leaf (or a view of one) src[1], another
 * tensor, whose state b_state is PARTIAL (b/N per device, or b on one device). The sum is
 * then read unreduced, the result is PARTIAL and the bias counts once when it is reduced:
 * the rule the split-state cache applies, and the one the meta device delays the sum's
 * reduction past the add for (refusing the graph when it cannot). */
LOOM_API bool loom_split_partial_bias_add(const loom_tensor *t, const loom_split_state *a_true,
                                          const loom_split_state *b_state);

/* ---------------------------------------------------------------- context and cache */

/* The state of a leaf (op NONE: a weight, a KV cache, a graph input). `out` arrives set
 * to MIRRORED over the context's n_devices; the callback may leave it, or set an axis with
 * its segments, PARTIAL, or NONE ("a compute tensor whose layout follows the op that
 * writes it", e.g. the destination of a cast). It returns LOOM_OK, or an error (with
 * loom_error) that loom_split_ctx_get passes on. The table validates what it returns. It
 * runs under the context's lock: it must not call back into the same context. */
typedef loom_status (*loom_split_leaf_fn)(const loom_tensor *t, loom_split_state *out,
                                          void *user_data);

typedef struct loom_split_ctx loom_split_ctx;

typedef struct loom_split_ctx_stats {
    uint64_t lookups;     /* tensors validated or derived */
    uint64_t hits;        /* found in the cache and still valid */
    uint64_t computed;    /* derived (or asked of the callback) afresh */
    uint64_t invalidated; /* cached entries found stale and recomputed */
    size_t entries;       /* entries held now */
} loom_split_ctx_stats;

/* leaf_fn NULL: every leaf is MIRRORED. NULL (loom_last_error) on allocation failure or
 * n_devices out of range. Thread-safe (one lock per context). */
LOOM_API loom_split_ctx *loom_split_ctx_new(int n_devices, loom_split_leaf_fn leaf_fn,
                                            void *user_data);
LOOM_API void loom_split_ctx_free(loom_split_ctx *ctx); /* NULL is a no-op */
LOOM_API int loom_split_ctx_n_devices(const loom_split_ctx *ctx);

/* The state of t. assume_sync false: its true state (PARTIAL where the meta device must
 * reduce); true: as a consumer sees it (loom_split_state_assume_sync). Sources are
 * resolved recursively (iteratively: any graph depth) and cached.
 *
 * The cache cannot go stale: an entry is keyed on the tensor pointer and keeps a snapshot
 * of the fields the state depends on (type, ne, nb, op, op_params, src[], view_src,
 * view_offs, name, and for leafs flags and buffer) plus the version of each source's
 * entry it was derived from; a lookup revalidates the tensor and everything upstream of
 * it (each tensor once per query), so editing any tensor, upstream included, is seen.
 * Failures are cached too (with their message). If the leaf callback's answers change
 * for unchanged tensors, call loom_split_ctx_clear.
 *
 * Cost: one query is linear in the size of t's upstream graph, so querying every node of
 * a graph one at a time is quadratic (about 0.1 s of CPU for 1,500 chained nodes); wrap
 * such loops in loom_split_ctx_begin/end (about 0.5 ms for the same graph). */
LOOM_API loom_status loom_split_ctx_get(loom_split_ctx *ctx, const loom_tensor *t, bool assume_sync,
                                        loom_split_state *out);

/* The states of every node of g, in node order (states: g->n_nodes entries), in one batch.
 * Stops at the first node that fails (its error returned, with loom_last_error). */
LOOM_API loom_status loom_split_ctx_get_graph(loom_split_ctx *ctx, const loom_graph *g,
                                              bool assume_sync, loom_split_state *states);

/* For supports_op: whether the rule table can split op given its sources. A source whose
 * own state cannot be derived counts as MIRRORED (it runs elsewhere and arrives whole).
 * On false, loom_last_error says why. */
LOOM_API bool loom_split_ctx_can_split(loom_split_ctx *ctx, const loom_tensor *op);

/* A batch of queries over tensors the caller does not edit in between (e.g. every node of
 * a graph): inside begin/end each tensor is revalidated at most once, so resolving a whole
 * graph costs O(nodes) instead of O(nodes * depth). Calls nest. */
LOOM_API void loom_split_ctx_begin(loom_split_ctx *ctx);
LOOM_API void loom_split_ctx_end(loom_split_ctx *ctx);

/* Drops every entry. */
LOOM_API void loom_split_ctx_clear(loom_split_ctx *ctx);
/* The cache is cleared before a query when it holds more than `max_entries` (default
 * 65536); 0 restores the default. */
LOOM_API void loom_split_ctx_set_capacity(loom_split_ctx *ctx, size_t max_entries);
LOOM_API loom_split_ctx_stats loom_split_ctx_get_stats(const loom_split_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SPLITSTATE_H */
