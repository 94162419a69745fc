/*
 * reduce-impl.h: the reducer's internals shared by the files of reduce/ (reducer.c: the
 * object, the ladder and the dispatch; plan.c: ring and butterfly plans and the step
 * executor that issues them; host.c: the host-staged path). Nothing outside reduce/
 * includes it.
 *
 * A plan is everything one reduction of one set of tensors needs, built once and cached:
 * tensor headers (views of the caller's tensors, scratch tensors), one-node ADD graphs made
 * in place, FILL graphs for empty devices, and a list of steps. A step is a set of
 * transfers that run concurrently (each on its destination's stream) followed by the adds
 * that consume them; the executor orders steps with two events per device:
 *   ready[j]  recorded on j before it is read: a receiver waits for it before copying;
 *   done[j]   recorded on j after its copies: every device j read from waits for it before
 *             queueing anything else, so nothing overwrites memory still being read.
 */
#ifndef LOOM_REDUCE_IMPL_H
#define LOOM_REDUCE_IMPL_H

#include "backends/backend-impl.h"
#include "loom/reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM__RD_N_PLANS 8 /* cached plans: a meta graph reduces a few tensors per token */

typedef struct loom__rd_xfer {
    int src, dst;            /* device indices */
    const loom_tensor *from; /* on src */
    loom_tensor *to;         /* on dst */
} loom__rd_xfer;

typedef struct loom__rd_add {
    int dev;
    loom_graph *g; /* one in-place ADD node */
} loom__rd_add;

typedef struct loom__rd_step {
    int x0, nx;         /* xfers[x0 .. x0+nx) */
    int a0, na;         /* adds[a0 .. a0+na) */
    uint64_t max_bytes; /* largest single transfer of the step */
} loom__rd_step;

typedef struct loom__rd_plan {
    /* key: what the plan was built for */
    loom_allreduce_algo algo; /* RING, BUTTERFLY, or NATIVE (fills only) */
    int64_t n_elem;
    loom_tensor *key_t[LOOM_REDUCE_MAX_DEVICES]; /* the tensors of the latest call */
    void *key_data[LOOM_REDUCE_MAX_DEVICES];
    loom_buffer_t key_buf[LOOM_REDUCE_MAX_DEVICES];
    uint64_t last_use; /* LRU stamp */

    loom_ctx *ctx;                             /* every header and graph below */
    loom_graph *fill[LOOM_REDUCE_MAX_DEVICES]; /* in-place FILL 0; NULL: device refuses it */
    loom__rd_step *steps;
    loom__rd_xfer *xfers;
    loom__rd_add *adds;
    int n_steps, n_xfers, n_adds;
    uint64_t bytes_moved; /* total over all transfers */
} loom__rd_plan;

struct loom_reducer {
    int n;
    loom_backend_t backends[LOOM_REDUCE_MAX_DEVICES]; /* borrowed */
    loom_event_t ready[LOOM_REDUCE_MAX_DEVICES];      /* NULL: backend has no events */
    loom_event_t done[LOOM_REDUCE_MAX_DEVICES];
    bool p2p;
    loom_allreduce_algo algo; /* configured: AUTO or forced */
    size_t butterfly_max;     /* bytes */

    /* native communicator */
    loom_comm_iface comm_iface;
    void *comm;

    /* device scratch, grown on demand; plans bind headers to it */
    loom_buffer_t scratch[LOOM_REDUCE_MAX_DEVICES];
    size_t scratch_size[LOOM_REDUCE_MAX_DEVICES];

    loom__rd_plan *plans[LOOM__RD_N_PLANS];
    uint64_t use_clock;

    /* host staging (host.c): 2 parities x (n device slots + 1 accumulator) of chunk floats */
    float *host_stage;
    size_t host_stage_floats; /* per slot */

    /* last call's step trace */
    uint64_t *trace;
    size_t trace_len, trace_cap;

    loom_reducer_stats stats;

    /* the first device failure an internal synchronize saw during this call (a member's
     * asynchronous work failed): the call reports it */
    loom_status sync_status;
    char sync_msg[256];
};

/* plan.c */
/* Builds a plan of `algo` (RING, BUTTERFLY or NATIVE) for tensors of n_elem F32 elements,
 * growing device scratch as needed. NULL with loom_last_error (LOOM_ERR_DEVICE_OOM naming
 * the device, LOOM_ERR_UNSUPPORTED naming a refused op, LOOM_ERR_NOMEM). */
loom__rd_plan *loom__rd_plan_build(loom_reducer *r, loom_allreduce_algo algo, loom_tensor *const *t,
                                   int64_t n_elem);
void loom__rd_plan_free(loom__rd_plan *p);
/* Queues the fills of flagged devices (empty may be NULL). */
loom_status loom__rd_plan_fill(loom_reducer *r, const loom__rd_plan *p, const bool *empty);
/* Queues every step of the plan. */
loom_status loom__rd_plan_run(loom_reducer *r, const loom__rd_plan *p);
/* Frees every cached plan (after synchronising: plans may be in flight). */
void loom__rd_plans_clear(loom_reducer *r);

/* host.c */
/* Gathers, sums and scatters through host memory; returns synchronised. */
loom_status loom__rd_host_allreduce(loom_reducer *r, loom_tensor *const *t, int64_t n_elem,
                                    const bool *empty);
void loom__rd_host_free(loom_reducer *r);

/* reducer.c */
/* Appends a step to the trace of the current call (LOOM_ERR_NOMEM on failure). */
loom_status loom__rd_trace_push(loom_reducer *r, uint64_t max_bytes);
/* Synchronises every backend (loom__rd_sync: the first failure is kept in r->sync_status):
 * used before freeing anything in flight. */
void loom__rd_sync_all(loom_reducer *r);
/* Synchronizes member j, keeping the first failure it reports in r->sync_status. */
void loom__rd_sync(loom_reducer *r, int j);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_REDUCE_IMPL_H */
