/*
 * libggml-loom: loom as an out-of-tree ggml backend (ggml 0.27.0's dynamic-backend ABI).
 *
 * One ggml device per spec of LOOM_GGML_DEVICES ("sim:4;cuda:0,1"): LOOM0, LOOM1, ... each
 * a loom meta device over that spec's devices, so an engine built on ggml (llama.cpp,
 * whisper.cpp) runs loom's tensor parallelism without knowing it. With LOOM_GGML_MEMBERS=1
 * every member is also its own ggml device (LOOM0.0, LOOM0.1, ...), for ggml's own split
 * modes over the same devices.
 *
 * Every ggml tensor that lives in a bridge buffer has a *twin*: a loom tensor header with
 * the same type, shape, strides, storage and, for a computed tensor, the loom op and the
 * twins of its sources. Twins are kept per device in a table keyed by the ggml tensor's
 * address and refreshed when anything they were made from changes (fingerprint), so a
 * graph llama.cpp rebuilds every token over the same memory maps to the same twins and
 * loom's plan cache hits. graph_compute hands the twins of the graph's COMPUTE nodes, in
 * order, to the device's loom backend (the meta backend cuts, splits and reduces).
 */
#ifndef LOOM_GGML_BRIDGE_H
#define LOOM_GGML_BRIDGE_H

#include <pthread.h>

#include "ggml/ggml-abi.h"
#include "loom/backend.h"
#include "loom/core.h"
#include "loom/splitstate.h"

#define LG_MAX_DEVICES 32

typedef struct lg_twin lg_twin;
typedef struct lg_split lg_split;

/* One ggml device of the bridge. */
typedef struct lg_device {
    char name[32];   /* LOOM0, LOOM0.1 */
    char desc[256];  /* "loom meta over SIM0,SIM1 (sim:2)" */
    loom_dev_t dev;  /* the loom device: a meta device, or one member */
    bool owns_meta;  /* dev is a meta device this bridge made */
    bool debug;      /* LOOM_GGML_DEBUG: say why each op is refused */
    bool wrapped;    /* ggml's meta device slices the weights it hands over (-sm tensor) */
    loom_buft_t lbuft;
    struct ggml_backend_device gdev;
    struct ggml_backend_buffer_type gbuft;
    pthread_mutex_t lock; /* the twin table, the scratch arena */
    /* twin table: open addressing over ggml tensor addresses */
    lg_twin **slots;
    size_t n_slots, n_used;
    /* records, in chunks that never move */
    struct lg_chunk *chunks;
    uint64_t pass;       /* bumped per lookup or graph: a twin is validated once per pass */
    bool probing;        /* inside supports_op */
    int anchor_depth;    /* supports_op asking about a source's source */
    /* LOOM_GGML_STATS: what graph_compute ran here (a graph each ggml split on this device),
     * nodes by ggml op; UNARY and GLU nodes by their own op after the plain ones */
    uint64_t graphs_run;
    uint64_t op_nodes[GGML_OP_COUNT + GGML_UNARY_OP_COUNT + GGML_GLU_OP_COUNT];
} lg_device;

/* A bridge buffer: one loom buffer; ggml's addresses are loom's (same base). */
typedef struct lg_buffer {
    lg_device *d;
    loom_buffer_t lb;
    char *base;
} lg_buffer;

/* ---------------------------------------------------------------- twin.c */
/* The twin of t (a tensor in one of d's buffers), made or refreshed with its sources; NULL
 * with loom_last_error when t cannot be expressed in loom (an op or type loom lacks). Call
 * with d->lock held. */
loom_tensor *lg_twin_get(lg_device *d, const struct ggml_tensor *t);
/* Forgets every twin (a buffer was freed; twins are rebuilt on demand). d->lock held. */
void lg_twin_clear(lg_device *d);
/* Whether d can run op: loom has the op, types and shapes, and the device (for a meta
 * device: its rule table) accepts it. */
bool lg_supports_op(lg_device *d, const struct ggml_tensor *op);
/* Runs g's COMPUTE nodes on backend b of device d. */
enum ggml_status lg_graph_compute(lg_device *d, loom_backend_t b, struct ggml_cgraph *g,
                                  loom_graph **scratch, loom_ctx **scratch_ctx);

/* ---------------------------------------------------------------- buffer.c */
void lg_buft_init(lg_device *d);
bool lg_buffer_is_ours(const lg_device *d, const struct ggml_backend_buffer *buf);

/* ---------------------------------------------------------------- device.c */
/* The split-state callback of every meta device of the bridge (rules of the model found
 * through LOOM_GGML_MODEL or the engine's -m argument, LOOM_GGML_SPLIT_RULES in front). */
loom_status lg_leaf_state(const loom_tensor *t, loom_split_state *out, void *user_data);
/* Whether weight t arrives in another shape than the model file's: ggml's own tensor split
 * wraps the device (d->wrapped is set, and said once). Only for meta devices. */
bool lg_weight_sliced(lg_device *d, const struct ggml_tensor *t);
/* The LOOM_GGML_STATS line of the ops d ran: "LOOM0 ran 1234 nodes in 32 graphs: MUL_MAT
 * 300, ADD 280, ..." (most first). */
void lg_log_op_stats(const lg_device *d);
/* Prints "loom-ggml: ..." on stderr. */
void lg_log(const char *fmt, ...) LOOM_PRINTF(1, 2);

#endif /* LOOM_GGML_BRIDGE_H */
