/*
 * reduce: AllReduce (sum) of N same-shape F32 tensors, one per device, in place, so that
 * afterwards every device holds the sum. The meta device uses it to sum the PARTIAL results
 * of its devices between subgraphs; benchmarks and tests use it directly.
 *
 * A reducer is created once for a fixed set of N backends (one per device, N 1..16) and
 * reused for every reduction: it keeps device-resident scratch tensors (allocated from
 * each device's buffer type, grown on demand), events, and a small cache of built plans.
 * Devices do the adds themselves (small ADD graphs on each device's backend) and data
 * moves with loom_backend_tensor_copy_async ordered by events, so all devices work at once.
 *
 * The ladder, picked per call (LOOM_ALLREDUCE_AUTO):
 *   1. the backend's native communicator (NCCL on CUDA), when the devices' reg exports
 *      LOOM_PROC_COMM_INIT/_ALLREDUCE/_FREE (loom/backend-impl.h) with the signatures
 *      below and agrees to the call;
 *   2. host-staged (gather to host, sum, scatter) when the devices cannot copy to each
 *      other (probed at creation, or stated by the caller);
 *   3. butterfly (recursive doubling, non-power-of-two counts folded) up to a size
 *      threshold measured on sim devices (reduce/README.md);
 *   4. ring (reduce-scatter + all-gather over N uneven chunks) above it.
 * The environment variable LOOM_ALLREDUCE=auto|ring|butterfly|host forces one when the
 * caller's params leave the algorithm at AUTO; any other value makes loom_reducer_new fail.
 *
 * A reducer is used by one thread at a time (like the backends it drives).
 *
 * A device flagged "empty" (its slice of the PARTIAL tensor is zero-sized, so it computed
 * nothing) contributes exact zeros whatever its memory holds (NaN included: it is
 * overwritten, never multiplied by 0), and receives the sum like every other device.
 */
#ifndef LOOM_REDUCE_H
#define LOOM_REDUCE_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_REDUCE_MAX_DEVICES 16

/* ---------------------------------------------------------------- native communicator */

/* What a backend reg returns from loom_reg_get_proc_address(reg, LOOM_PROC_COMM_INIT) etc.
 * init: a communicator over backends[0..n) (all devices of this reg), or NULL if it cannot
 *       make one (the reducer then uses its own algorithms).
 * allreduce_tensor: sums tensors[0..n) in place (tensor j contiguous F32 in a buffer of
 *       backends[j]'s device, all the same shape), queued on the backends' streams in
 *       stream order like any other async work; returns false, having changed nothing,
 *       to decline (the reducer then falls back).
 * free: releases the communicator (NULL is a no-op). */
typedef void *(*loom_comm_init_fn)(loom_backend_t *backends, size_t n);
typedef bool (*loom_comm_allreduce_tensor_fn)(void *comm, loom_tensor *const *tensors, size_t n);
typedef void (*loom_comm_free_fn)(void *comm);

typedef struct loom_comm_iface {
    loom_comm_init_fn init;
    loom_comm_allreduce_tensor_fn allreduce_tensor;
    loom_comm_free_fn free;
} loom_comm_iface;

/* ---------------------------------------------------------------- algorithms */

typedef enum loom_allreduce_algo {
    LOOM_ALLREDUCE_AUTO = 0,  /* the ladder; as a "last used" value: nothing had to move */
    LOOM_ALLREDUCE_NATIVE,    /* the backend's communicator */
    LOOM_ALLREDUCE_RING,      /* reduce-scatter + all-gather, 2(N-1) steps of ~size/N */
    LOOM_ALLREDUCE_BUTTERFLY, /* recursive doubling, log2(N) steps of the whole tensor */
    LOOM_ALLREDUCE_HOST,      /* gather to host, sum, scatter */
    LOOM_ALLREDUCE_COUNT
} loom_allreduce_algo;

/* "auto", "native", "ring", "butterfly", "host". */
LOOM_API const char *loom_allreduce_algo_name(loom_allreduce_algo algo);
/* Parses auto|ring|butterfly|host (case-insensitive; "native" too). LOOM_ERR_INVALID_ARG
 * naming the bad value and the accepted ones otherwise. */
LOOM_API loom_status loom_allreduce_algo_parse(const char *s, loom_allreduce_algo *out);

/* ---------------------------------------------------------------- reducer */

typedef struct loom_reducer loom_reducer;

typedef enum loom_reduce_p2p {
    LOOM_REDUCE_P2P_PROBE = -1, /* find out at creation (one tiny copy per device pair) */
    LOOM_REDUCE_P2P_NO = 0,     /* devices cannot copy to each other: stage through host */
    LOOM_REDUCE_P2P_YES = 1,    /* devices copy to each other directly and asynchronously */
} loom_reduce_p2p;

typedef struct loom_reducer_params {
    /* AUTO: LOOM_ALLREDUCE if set, else the ladder. Anything else: always that one. */
    loom_allreduce_algo algorithm;
    loom_reduce_p2p p2p;
    /* Largest tensor (bytes) the ladder gives to the butterfly; 0: the measured default
     * for the device count (loom_reducer_butterfly_max_bytes). */
    size_t butterfly_max_bytes;
    /* Borrowed communicator table used instead of looking one up through the reg (tests,
     * or a caller that owns a communicator library); NULL: look it up. */
    const loom_comm_iface *comm;
    bool no_comm; /* never use a native communicator */
} loom_reducer_params;

/* Defaults: AUTO, P2P_PROBE, measured threshold, communicator looked up. */
LOOM_API loom_reducer_params loom_reducer_params_default(void);

/* A reducer for backends[0..n) (borrowed; they must outlive it), one per device, all
 * distinct. NULL with loom_last_error on bad arguments (LOOM_ERR_INVALID_ARG: n outside
 * 1..16, NULL or repeated backends, a bad LOOM_ALLREDUCE value), host out-of-memory
 * (LOOM_ERR_NOMEM) or a device that cannot hold the probe (LOOM_ERR_DEVICE_OOM). params
 * may be NULL (defaults). */
LOOM_API loom_reducer *loom_reducer_new(loom_backend_t *backends, int n,
                                        const loom_reducer_params *params);
/* Waits for outstanding work, frees scratch, events, plans and the communicator. NULL is
 * a no-op. */
LOOM_API void loom_reducer_free(loom_reducer *r);

LOOM_API int loom_reducer_n_devices(const loom_reducer *r);
/* Whether the devices copy to each other directly (probed or stated at creation). */
LOOM_API bool loom_reducer_p2p(const loom_reducer *r);
/* Whether a native communicator was found and initialised. */
LOOM_API bool loom_reducer_has_comm(const loom_reducer *r);
/* The configured algorithm (AUTO = the ladder) and a way to change it between calls. */
LOOM_API loom_allreduce_algo loom_reducer_get_algorithm(const loom_reducer *r);
LOOM_API void loom_reducer_set_algorithm(loom_reducer *r, loom_allreduce_algo algo);
/* What the reducer would use for a tensor of `nbytes` (never AUTO for N > 1 and nbytes > 0;
 * NATIVE only says the communicator will be asked first). */
LOOM_API loom_allreduce_algo loom_reducer_choose(const loom_reducer *r, size_t nbytes);
/* The measured default butterfly/ring threshold for n devices (bytes). */
LOOM_API size_t loom_reducer_butterfly_max_bytes(int n);

/* Sums tensors[0..n) in place: tensor j, in a buffer backend j can use, contiguous F32,
 * every tensor the same shape and distinct. empty: NULL, or n flags; a flagged device
 * contributes exact zeros. The work is queued on the backends in stream order: work queued
 * earlier on backend j (that produced tensor j) is waited for, and work queued later on
 * backend j sees the sum; call loom_reducer_synchronize (or synchronize every backend)
 * before reading a tensor from the host. The host-staged path returns synchronised.
 * Errors (nothing is left running): LOOM_ERR_INVALID_ARG / _TYPE / _SHAPE for bad tensors,
 * LOOM_ERR_DEVICE_OOM when a device cannot hold the scratch (message names the device),
 * LOOM_ERR_NOMEM, LOOM_ERR_UNSUPPORTED when a forced algorithm needs an op a device
 * refuses; the tensors' contents are then unspecified. */
LOOM_API loom_status loom_reducer_allreduce(loom_reducer *r, loom_tensor *const *tensors,
                                            const bool *empty);
/* Waits until every backend of the reducer is idle. Returns the first failure a backend
 * reported while waiting (work that failed on a device after it was queued, such as the
 * graph that produced a tensor: the error names the device), else LOOM_OK. A failure the
 * reducer saw here is not reported again by the device's next graph_compute, so check it. */
LOOM_API loom_status loom_reducer_synchronize(loom_reducer *r);

typedef struct loom_reducer_stats {
    uint64_t reductions;                    /* allreduce calls that succeeded */
    uint64_t bytes_reduced;                 /* sum of the tensors' sizes (one device) */
    uint64_t bytes_moved;                   /* bytes copied dev->dev, dev->host, host->dev
                                               (NATIVE: the ring's volume, an estimate) */
    uint64_t by_algo[LOOM_ALLREDUCE_COUNT]; /* calls per algorithm actually used */
    loom_allreduce_algo last_algo;          /* of the last successful call */
} loom_reducer_stats;

LOOM_API void loom_reducer_get_stats(const loom_reducer *r, loom_reducer_stats *out);
LOOM_API void loom_reducer_reset_stats(loom_reducer *r);

/* The communication steps of the last successful call, for link-model projections: the
 * steps run one after another, the transfers within a step concurrently over separate
 * links. Writes, for up to `cap` steps, the bytes of the largest single transfer of the
 * step (the host path counts the gather and the scatter of each chunk as steps) and
 * returns the number of steps (0 for NATIVE or when nothing moved). */
LOOM_API size_t loom_reducer_last_steps(const loom_reducer *r, uint64_t *max_bytes, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_REDUCE_H */
