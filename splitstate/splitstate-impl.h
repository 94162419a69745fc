/*
 * splitstate internals shared by state.c (the layout algebra), map.c (where a split axis
 * lands in a view or reshape), rules.c (the op table) and cache.c (the context). Not part
 * of loom's public API.
 */
#ifndef LOOM_SPLITSTATE_IMPL_H
#define LOOM_SPLITSTATE_IMPL_H

#include "loom/splitstate.h"

/* Appends `nr` occurrences of a segment with these counts, merging with the last segment
 * when its counts are equal; all-zero counts are dropped. LOOM_ERR_FULL when out of
 * segments (no message recorded: callers word it). */
loom_status loom__split_append(loom_split_state *s, const int64_t *counts, int64_t nr);

/* Rewrites s in normal form (merged repeats, no empty segments). */
void loom__split_normalize(loom_split_state *s);

/* Multiplies (mul > 0) or divides (div > 0; every count must be a multiple) every count. */
void loom__split_scale(loom_split_state *s, int64_t mul, int64_t div);
/* Whether every count is a multiple of m. */
bool loom__split_counts_multiple_of(const loom_split_state *s, int64_t m);
/* Repeats the whole layout k times (k >= 1). LOOM_ERR_FULL when out of segments. */
loom_status loom__split_repeat(loom_split_state *s, int64_t k);

/* Whether the layout of a split axis is its first `period` elements repeated; the period
 * itself is returned in *pattern. */
bool loom__split_periodic(const loom_split_state *s, int64_t period, loom_split_state *pattern);

/* Whether b's layout is a's with every count multiplied by `ratio` (same axis). */
bool loom__split_scaled_equal(const loom_split_state *a, const loom_split_state *b, int64_t ratio);

/* Where a split along axis `axis` of a tensor with geometry (a_ne, a_nb) lands in a view
 * with geometry (v_ne, v_nb) placed `rel` bytes (or units) after a's first element. The
 * layout `in` is in the units of a's axis. On success *out is the view's state (axis and
 * layout in units of the view's dimension). On failure returns LOOM_ERR_UNSUPPORTED and
 * writes a reason (no tensor names) into why. */
loom_status loom__split_map(const int64_t a_ne[4], const int64_t a_nb[4],
                            const loom_split_state *in, const int64_t v_ne[4],
                            const int64_t v_nb[4], int64_t rel, loom_split_state *out, char *why,
                            size_t why_size);

/* The lowercase op name ("rms_norm") into buf. */
const char *loom__split_op_lower(loom_op op, char *buf, size_t size);

#endif /* LOOM_SPLITSTATE_IMPL_H */
