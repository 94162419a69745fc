/*
 * Scheduler internals shared by the sched sources (and readable by tests): the scheduler object,
 * its per-tensor table, splits and cause codes. The public API is include/loom/sched.h.
 *
 * Files: sched.c (lifecycle, API, allocation), sched_split.c (the five passes and the
 * split cut), sched_graph.c (the allocation graph with its dependency nodes),
 * sched_compute.c (copies, expert-only copies, eval callback), sched_debug.c (the print).
 */
#ifndef LOOM_SCHED_IMPL_H
#define LOOM_SCHED_IMPL_H

#include "backends/backend-impl.h"
#include "loom/sched.h"
#include "sched/ptrmap.h"

/* Why a tensor got its backend (loom_sched_get_tensor_cause prints these). */
typedef enum loom__cause {
    LOOM__CAUSE_NONE = 0,
    LOOM__CAUSE_USR,
    LOOM__CAUSE_DST,   /* 1.dst: its buffer decides */
    LOOM__CAUSE_VSRC1, /* 1.vsrc: its view source's buffer decides */
    LOOM__CAUSE_INP,   /* 1.inp: a user input, on the CPU */
    LOOM__CAUSE_WGT0,  /* 1.wgt<j>: where its weight source j lives (10 codes) */
    LOOM__CAUSE_OFF = LOOM__CAUSE_WGT0 + LOOM_MAX_SRC, /* 1.off: pulled to a device */
    LOOM__CAUSE_GPU_DN,                                /* pass 2 sweeps */
    LOOM__CAUSE_GPU_UP,
    LOOM__CAUSE_ANY_DN,
    LOOM__CAUSE_ANY_UP,
    LOOM__CAUSE_UPG,   /* 3.upg */
    LOOM__CAUSE_BEST,  /* 3.best */
    LOOM__CAUSE_VSRC4, /* 4.vsrc */
    LOOM__CAUSE_CUR,   /* 4.cur */
    LOOM__CAUSE_SUP,   /* 4.sup: first backend that supports it */
    LOOM__CAUSE_CPY,   /* 4.cpy: a copy made by the scheduler */
    LOOM__CAUSE_FBK,   /* 5.fbk: its backend refused it once its inputs were copies */
    LOOM__CAUSE_COUNT
} loom__cause;

const char *loom__cause_name(int cause);

typedef struct loom__split {
    int backend_id;
    int i_start, i_end;   /* node range in the caller's graph */
    loom_tensor **inputs; /* originals copied into this split */
    int n_inputs, cap_inputs;
    loom_graph *graph; /* view of the caller's graph [i_start, i_end), in round storage */
} loom__split;

/* What a round hands to the backends and they may read after compute returns (a sim
 * worker reads graphs and tensor headers when it runs them): the split graph views and the
 * headers of copies and dependency nodes. One per pipeline copy slot; a slot's storage is
 * recycled only once every backend has passed that slot's last event. */
typedef struct loom__round {
    loom_ctx **ctxs; /* chain of no-alloc contexts */
    int n_ctxs, cap_ctxs;
    loom_graph *graphs; /* [cap_graphs]: one per split */
    int cap_graphs;
    bool issued; /* work was issued from this storage and may still run */
} loom__round;

/* A source edit in the caller's graph, so a failed reserve can undo it and retry. */
typedef struct loom__rewrite {
    loom_tensor *node;
    int j;             /* source index, or -1: the view's storage (view_src, view_offs) */
    loom_tensor *orig;
    size_t offs;       /* j = -1: the original view_offs, data and buffer */
    void *data;
    loom_buffer_t buffer;
} loom__rewrite;

struct loom_sched {
    /* set by pass 1 when a pre-allocated CPY/SET_ROWS can run nowhere: its computed
     * source, which the next split attempt makes on the CPU (sched.c split_round) */
    const loom_tensor *want_whole;
    int n_backends;
    loom_backend_t backends[LOOM_SCHED_MAX_BACKENDS];
    loom_buft_t bufts[LOOM_SCHED_MAX_BACKENDS];
    bool op_offload;
    loom_gallocr *galloc; /* buffer id = backend id */

    bool is_reset; /* nothing assigned since the last reset */
    bool is_split; /* `cur_graph` split, not yet allocated */
    bool is_alloc; /* `cur_graph` allocated */
    loom_graph *cur_graph;
    uint64_t cur_uid; /* cur_graph's uid when split (a rebuilt graph may reuse the address) */

    /* per-tensor table: tensor -> dense id -> {backend, cause, copies} */
    loom__ptrmap map;
    int n_ids, cap_ids;
    int8_t *t_backend; /* -1: unassigned */
    uint8_t *t_cause;
    int32_t *t_copies; /* index into copy_pool of n_backends * n_copies slots, or -1 */
    loom_tensor **copy_pool;
    int n_pool, cap_pool;

    /* splits of the current graph */
    loom__split *splits;
    int n_splits, cap_splits;
    loom_tensor **graph_inputs; /* user inputs given pipeline copies */
    int n_graph_inputs, cap_graph_inputs;
    loom__rewrite *rewrites;
    int n_rewrites, cap_rewrites;
    int n_graph_nodes, n_graph_leafs; /* of the caller's graph, at split time */
    uint64_t topology;  /* fingerprint of the split graph (ids of every source, cuts, inputs) */
    int *node_tid;      /* [cap_tmp] table id of each node (during a split) */
    int *src_tid;       /* [cap_tmp * LOOM_MAX_SRC] table id of each source (during a split) */
    uint8_t *node_view; /* [cap_tmp] whether node i is a view op (during a split) */
    int cap_tmp;

    /* the allocation graph: splits with their dependency and copy nodes */
    loom_graph graph;
    int graph_cap_nodes, graph_cap_leafs;
    int *node_ids, *leaf_ids; /* backend (= buffer) id per allocation-graph entry */

    /* pipeline copies */
    int n_copies, cur_copy, next_copy;
    loom_event_t events[LOOM_SCHED_MAX_BACKENDS][LOOM_SCHED_MAX_COPIES];
    /* recorded after a split's input copies: the source backends wait on it before they
     * overwrite what was copied (a copy may run on the destination's stream, later) */
    loom_event_t copies_done[LOOM_SCHED_MAX_BACKENDS];

    /* per-slot round storage (see loom__round) */
    loom__round rounds[LOOM_SCHED_MAX_COPIES];
    size_t ctx_size;

    loom_sched_eval_cb eval_cb;
    void *eval_ud;
    int debug;         /* LOOM_SCHED_DEBUG */
    int debug_realloc; /* LOOM_SCHED_DEBUG_REALLOC */
    int max_split_inputs;
    int n_reallocs;

    /* the first failure of a backend's asynchronous work that a synchronize inside the
     * scheduler saw; returned (and cleared) by the next compute or synchronize call */
    loom_status async_status;
    char async_msg[384];
    /* pending_reads[x]: bit a set while backend x may still be copying out of backend a's
     * memory (an asynchronous copy on x's stream); a host write into that memory waits
     * for copies_done[x] first */
    uint32_t pending_reads[LOOM_SCHED_MAX_BACKENDS];
    /* host_waits[a]: bit x set while backend a, which cannot wait on an event, must have
     * the host wait for copies_done[x] before its memory is written again (its next split,
     * or a copy into it): x may still be copying out of a's memory. Deferred to then
     * instead of waiting at once, so a token's small CPU split does not cost the host a
     * round trip to the devices before it can issue their work. (Every backend today
     * stages a copy out of CPU memory synchronously, so the wait guards later ones.) */
    uint32_t host_waits[LOOM_SCHED_MAX_BACKENDS];
};

/* Synchronizes backend b, keeping the first failure it reports in s->async_status. */
void loom__sched_sync(loom_sched *s, int b);
/* Returns (and clears) a failure kept by loom__sched_sync, as an error naming it. */
loom_status loom__sched_take_status(loom_sched *s);

/* ---- per-tensor table (sched.c) */
static inline int loom__sched_id(const loom_sched *s, const loom_tensor *t) {
    return loom__ptrmap_get(&s->map, t);
}
static inline int loom__sched_backend_of(const loom_sched *s, const loom_tensor *t) {
    int id = loom__ptrmap_get(&s->map, t);
    return id >= 0 ? s->t_backend[id] : -1;
}
/* The id of t, added (unassigned) if absent; -1 on out-of-memory (error recorded). */
int loom__sched_id_insert(loom_sched *s, const loom_tensor *t); /* t must be absent */
static inline int loom__sched_id_add_fast(loom_sched *s, const loom_tensor *t) {
    int id = loom__ptrmap_get(&s->map, t);
    return id >= 0 ? id : loom__sched_id_insert(s, t);
}
int loom__sched_id_add(loom_sched *s, const loom_tensor *t);
/* Copy c of tensor id on backend b, or NULL. */
loom_tensor *loom__sched_copy_get(const loom_sched *s, int id, int b, int c);
loom_status loom__sched_copy_set(loom_sched *s, int id, int b, int c, loom_tensor *copy);
/* A new tensor header in the current round's contexts. */
loom_tensor *loom__sched_new_header(loom_sched *s, const loom_tensor *like);
/* Split graph storage for n splits in the current round. */
loom_status loom__sched_round_graphs(loom_sched *s, int n);

loom_status loom__sched_apply_pins(loom_sched *s); /* sched.c */

/* ---- stages */
loom_status loom__sched_split(loom_sched *s, loom_graph *g);       /* sched_split.c */
loom_status loom__sched_build_graph(loom_sched *s, loom_graph *g); /* sched_graph.c */
loom_status loom__sched_compute_splits(loom_sched *s);             /* sched_compute.c */
void loom__sched_debug_print(const loom_sched *s, loom_graph *g);  /* sched_debug.c */
/* Whether backend b can read t's memory (its buffer, or the buffer type it will get). */
bool loom__sched_buffer_supported(const loom_sched *s, const loom_tensor *t, int b);

#endif /* LOOM_SCHED_IMPL_H */
