/*
 * Beyond one process: loom over MPI ranks (dist/). One process per rank, started by an MPI
 * launcher (`mpirun -np N loom run --dist mpi ...`); every rank opens the same model and
 * runs the same graphs. Tensor parallelism across ranks is the ordinary meta device over N
 * *dist devices* MPI0..MPI{N-1}, one per rank: on rank r, member r wraps a real local device
 * (the CPU, or sim:1) and holds and computes rank r's slices; every other member is
 * *remote*: its buffers hold no memory, its graphs are not run here, writes to it are
 * dropped (its own rank writes them), and a read of it is a broadcast from its rank. The
 * meta device's AllReduce finds the dist reg's communicator (get_proc_address
 * comm_init/comm_allreduce_tensor/comm_free): MPI_Allreduce over the local slice.
 * Pipeline parallelism across ranks is the session's layer mode over the same devices: a
 * copy between two dist buffers is MPI point-to-point (the source's rank sends, the
 * destination's rank receives, the others skip it). Hybrid: in layer mode the local device
 * may be a meta device over the rank's own devices (tensor parallelism inside each stage).
 *
 * Every rank must make the same calls in the same order (reads of split tensors and the
 * reductions are collectives). Setup (open, load) does no communication, so a rank that
 * fails there reports it through loom_dist_agree and every rank returns the error.
 *
 * Built without MPI (no libopenmpi-dev at build time) loom_dist_available() is false and
 * loom_dist_init says so.
 */
#ifndef LOOM_DIST_H
#define LOOM_DIST_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_dist loom_dist;

/* Whether this loom was built with MPI. */
LOOM_API bool loom_dist_available(void);
/* Whether the process was started by an MPI launcher (Open MPI's, or a PMI/PMIx one). */
LOOM_API bool loom_dist_launched(void);

/* Initialises MPI (once per process). Fails with a message when loom was built without
 * MPI or the process was not started by a launcher (it would be a lone rank). */
LOOM_API loom_status loom_dist_init(loom_dist **out);
/* Finalises MPI. NULL is a no-op. */
LOOM_API void loom_dist_free(loom_dist *d);
LOOM_API int loom_dist_rank(const loom_dist *d);
LOOM_API int loom_dist_size(const loom_dist *d);

/* Collective: broadcasts bytes from root to every rank. */
LOOM_API loom_status loom_dist_bcast(loom_dist *d, void *data, size_t bytes, int root);
/* Collective: every rank passes its status (and loom_last_error when it is not LOOM_OK);
 * returns LOOM_OK on every rank if all passed LOOM_OK, else on every rank the status of the
 * lowest failing rank with the message "rank R: <its message>". */
LOOM_API loom_status loom_dist_agree(loom_dist *d, loom_status st);
/* What this rank has moved so far: point-to-point messages (a pipeline stage's activations:
 * sent by the source's rank, received by the destination's) and collectives (broadcasts,
 * allreduces, agreements). */
typedef struct loom_dist_stats {
    uint64_t sends, recvs; /* point-to-point messages of this rank */
    uint64_t bytes_sent, bytes_recv;
    uint64_t collectives; /* broadcasts + allreduces + agreements this rank took part in */
    /* through the rank communicator (NCCL), not counted above */
    uint64_t rank_comm_allreduces, rank_comm_sends, rank_comm_recvs;
} loom_dist_stats;
LOOM_API void loom_dist_get_stats(const loom_dist *d, loom_dist_stats *out);

/* Ends every rank at once (MPI_Abort): for a failure in the middle of collective work,
 * where the other ranks wait for this one and a clean return cannot reach them. */
LOOM_API void loom_dist_abort(loom_dist *d, int code);

/* The dist devices MPI0..MPI{N-1} (N = world size; owned by d, valid until loom_dist_free):
 * out[rank] wraps local (borrowed; the CPU device, a sim device, or in layer mode a meta
 * device over local devices), the others are remote.
 * n_threads > 0 sets a CPU local device's threads. Call once. */
LOOM_API loom_status loom_dist_devices(loom_dist *d, loom_dev_t local, int n_threads,
                                       loom_dev_t *out, int cap, int *n_out);
LOOM_API bool loom_dev_is_dist(loom_dev_t dev);
/* The backend of this rank's local device inside a dist backend (a meta backend in the
 * hybrid layout), or NULL for another rank's member or a backend that is not dist. */
LOOM_API loom_backend_t loom_dist_backend_local(loom_backend_t be);
/* Whether dev is a dist device of another rank (no memory, no compute here). */
LOOM_API bool loom_dev_is_remote(loom_dev_t dev);

/* Collective, after loom_dist_devices and before the first evaluation (setup does no
 * other communication, so call it where every rank is known to have got this far): picks
 * how the members' memory crosses ranks. When the local device's reg exports a rank
 * communicator (LOOM_PROC_RANK_COMM, include/loom/backend-impl.h: NCCL for a CUDA device)
 * and every rank can use it, rank 0 makes its id, every rank receives it (MPI_Bcast) and
 * joins (ncclCommInitRank with its local device); the AllReduce of the tensor-parallel
 * members and the point-to-point of the pipeline then move device memory through it.
 * Otherwise (no such communicator on some rank, a CPU or meta local device, or rank 0's
 * LOOM_DIST_NCCL=0) they go through host memory and MPI, as without this call, and
 * loom_dist_comm_describe says why. LOOM_DIST_NCCL=1 makes that fallback an error. A
 * failure of the id or of the init on any rank fails the call on every rank, with the
 * lowest failing rank's message. Calling it again does nothing. */
LOOM_API loom_status loom_dist_comm_setup(loom_dist *d);
/* What moves the members' memory across ranks ("NCCL 2.28.9 across 2 ranks", "MPI through
 * host memory"); *why (if given) is why the host path was taken ("" otherwise). */
LOOM_API const char *loom_dist_comm_describe(const loom_dist *d, const char **why);
LOOM_API bool loom_dist_uses_rank_comm(const loom_dist *d);
/* Uses api as the rank communicator instead of the local device's reg's (another library,
 * or a test's stand-in); before loom_dist_comm_setup. NULL: the reg's again. */
struct loom_rank_comm_iface;
LOOM_API void loom_dist_set_rank_comm(loom_dist *d, const struct loom_rank_comm_iface *api);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_DIST_H */
