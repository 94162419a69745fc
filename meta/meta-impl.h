/*
 * meta/ internals: the device, buffer type, buffer and backend contexts, and the mapping
 * of a meta tensor to its per-device slices (map.c). Not part of the public API.
 */
#ifndef LOOM_META_IMPL_H
#define LOOM_META_IMPL_H

#include "backends/backend-impl.h"
#include "loom/meta.h"

/* The state a graph_compute laid a computed OUTPUT tensor's data out by, so reading it
 * back (the logits, every token) need not re-derive its state from the whole graph above
 * it. Valid for that header while its address, type, op and shape are unchanged; a host
 * write into the tensor forgets it (loom__meta_out_forget). */
#define LOOM_META_OUT_CACHE 8
typedef struct meta_out {
    const loom_tensor *t; /* NULL: free */
    const void *data;
    loom_type type;
    loom_op op;
    int64_t ne[LOOM_MAX_DIMS];
    size_t nb[LOOM_MAX_DIMS];
    loom_split_state state; /* the true state, a computed PARTIAL taken as reduced */
    uint64_t stamp;         /* LRU */
} meta_out;

/* A tensor the allocator asked the size of (alloc_size) and has not placed yet: a buffer
 * created next for exactly the aligned sum of these is laid out per member (buffer.c). */
typedef struct meta_pend {
    const loom_tensor *t;
    size_t size;                       /* alloc_size: the largest slice */
    size_t dev[LOOM_META_MAX_DEVICES]; /* the slice on each member */
} meta_pend;

typedef struct meta_dev {
    int n;
    loom_dev_t devs[LOOM_META_MAX_DEVICES];
    loom_split_ctx *split; /* states of every tensor this device sees */
    loom_split_leaf_fn user_leaf; /* the caller's callback for static tensors */
    int phase;                    /* 0, or the query window a split-ctx batch spans now:
                                     1 a scheduler's assignment passes, 2 an allocation */
    void *user_data;
    char name[256];
    struct loom_dev dev;
    struct loom_buft buft;
    meta_out outs[LOOM_META_OUT_CACHE];
    uint64_t out_clock;
    meta_pend *pend; /* the allocator's queries since the last buffer (or phase) */
    int n_pend, cap_pend;
} meta_dev;

void loom__meta_pend_reset(meta_dev *md);

void loom__meta_out_publish(meta_dev *md, const loom_tensor *t, const loom_split_state *s);
bool loom__meta_out_find(meta_dev *md, const loom_tensor *t, loom_split_state *s);
void loom__meta_out_forget(meta_dev *md, const loom_tensor *t);

/* Where a tensor placed at meta offset `off` has its slice on each member (packed). */
typedef struct meta_place {
    size_t off, size;
    size_t dev_off[LOOM_META_MAX_DEVICES], dev_size[LOOM_META_MAX_DEVICES];
} meta_place;

/* Two layouts. Shared (place == NULL): every member buffer has the meta size and a slice
 * sits at the tensor's meta offset on every member (compute buffers, whose allocator reuses
 * ranges). Packed: the buffer was made for a known list of tensors placed one after
 * another (weights, KV cache) and member j's buffer holds only member j's slices, one
 * after another; the meta address space is then a reserved, inaccessible range. */
typedef struct meta_buffer {
    meta_dev *md;
    uint64_t id; /* unique per allocation: plans keyed on addresses must not outlive it */
    loom_buffer_t bufs[LOOM_META_MAX_DEVICES];
    void *vbase; /* reserved meta address space (packed, or demoted from it); NULL: bufs[0] */
    size_t vsize;
    meta_place *place; /* packed: sorted by off; NULL: shared */
    int n_place;
    int n_init; /* tensors initialised so far */
} meta_buffer;

/* Member j's byte offset of the slice of the storage owner placed at meta offset `off`
 * (needing `bytes` there); an error naming the tensor when it is not where it was laid out. */
loom_status loom__meta_member_offset(const meta_buffer *mb, const loom_tensor *t, size_t off,
                                     int j, size_t bytes, size_t *out);

meta_dev *loom__meta_dev(loom_dev_t dev);
/* The true (assume_sync false) or consumer (true) state of t; errors from the table. */
loom_status loom__meta_state(meta_dev *md, const loom_tensor *t, bool assume_sync,
                             loom_split_state *out);

/* The slice of meta tensor t on device j, written into *out (a header: type, ne, nb, op,
 * op_params, flags, name; data/buffer pointing into device j's buffer; src[] and
 * view_src NOT set). `state` is t's consumer state (assume_sync). For a view, the slice of
 * its view_src on device j must be given (vsrc_dev); NULL otherwise. */
loom_status loom__meta_slice(meta_dev *md, const loom_tensor *t, const loom_split_state *state,
                             int j, const loom_tensor *vsrc_dev, const loom_split_state *vsrc_state,
                             loom_tensor *out);

/* Windows in which the graph is only queried share one split-ctx batch (each tensor
 * revalidated once instead of once per query): a scheduler's assignment passes (opened and
 * closed by its split_begin/split_end calls) and an allocation (opened by the first
 * alloc_size/init_tensor, closed by anything else: a new split, compute, data access).
 * Edits between windows are always seen. One scheduler at a time per meta device. */
void loom__meta_split_phase(meta_dev *md);
void loom__meta_alloc_phase(meta_dev *md);
void loom__meta_end_phase(meta_dev *md);

/* Bytes of t's largest slice (what the meta buffer type allocates for it). */
size_t loom__meta_alloc_size(meta_dev *md, const loom_tensor *t);

/* A meta event: one event per member device (recorded on each member's stream). */
typedef struct meta_event {
    struct loom_event ev; /* ev.device = the meta device, ev.context = this */
    loom_event_t m[LOOM_META_MAX_DEVICES];
} meta_event;

extern const struct loom_buffer_i loom__meta_buffer_i;
loom_buffer_t loom__meta_buffer_new(meta_dev *md, size_t size);
loom_backend_t loom__meta_backend_new(meta_dev *md, const char *params);

#endif
