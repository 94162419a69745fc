/*
 * NCCL, loaded lazily (cuda-nccl.c): the module does not link libnccl, so a machine without
 * NCCL still loads the CUDA backend with all its devices; only the NCCL communicator is
 * then unavailable (logged once, with the loader's reason), and the reducer's own
 * AllReduce ladder does the reductions.
 *
 * Environment: LOOM_CUDA_NCCL=PATH loads that file instead of "libnccl.so.2" (found by the
 * dynamic loader's search); LOOM_CUDA_NCCL=0 never loads NCCL.
 *
 * cuda-none.c (no toolkit at build time) implements the same two functions, failing.
 */
#ifndef LOOM_CUDA_NCCL_H
#define LOOM_CUDA_NCCL_H

#include <stddef.h>

#include "loom/core.h"

/* ncclUniqueId's layout (nccl.h: struct { char internal[NCCL_UNIQUE_ID_BYTES = 128]; }),
 * passed by value to ncclCommInitRank; cuda-comm.c checks the sizes agree. */
#define LOOM__NCCL_ID_BYTES 128
typedef struct loom__nccl_id {
    char internal[LOOM__NCCL_ID_BYTES];
} loom__nccl_id;

/* Every NCCL entry point the communicator uses, as function pointers (nccl.h's signatures,
 * with NCCL's own types passed as their underlying C types: ncclComm_t is a pointer,
 * ncclResult_t / ncclDataType_t / ncclRedOp_t are ints), plus the library's version. */
typedef struct loom__nccl_api {
    void *handle;   /* dlopen handle */
    int version;    /* ncclGetVersion: 22809 for 2.28.9 */
    char path[256]; /* what was loaded */
    int (*GetVersion)(int *version);
    const char *(*GetErrorString)(int result);
    int (*CommInitAll)(void **comms, int ndev, const int *devlist);
    int (*CommDestroy)(void *comm);
    int (*CommAbort)(void *comm);
    int (*CommGetAsyncError)(void *comm, int *async_error);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    int (*AllReduce)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,
                     void *comm, void *stream);
    /* across processes (dist/: one rank per process, the id broadcast over MPI) */
    int (*GetUniqueId)(loom__nccl_id *id);
    int (*CommInitRank)(void **comm, int nranks, loom__nccl_id id, int rank);
    int (*Send)(const void *sendbuff, size_t count, int datatype, int peer, void *comm,
                void *stream);
    int (*Recv)(void *recvbuff, size_t count, int datatype, int peer, void *comm, void *stream);
} loom__nccl_api;

/* Loads NCCL from `path` (NULL: "libnccl.so.2") into *out. LOOM_ERR_NOT_FOUND when the
 * library cannot be loaded (the loader's message), LOOM_ERR_UNSUPPORTED when it lacks an
 * entry point (named) or is older than 2.12; *out is then zeroed and nothing stays loaded. */
loom_status loom__cuda_nccl_load(const char *path, loom__nccl_api *out);
void loom__cuda_nccl_unload(loom__nccl_api *api); /* zeroed or NULL: no-op */

/* The process-wide NCCL (loaded on the first call, following LOOM_CUDA_NCCL), or NULL
 * when it is unavailable; then *why (if given) says why. The failure is logged once. */
const loom__nccl_api *loom__cuda_nccl(const char **why);

/* The communicator's size thresholds from the environment (cuda-comm.c): the one-shot
 * kernel's largest tensor (LOOM_CUDA_ALLREDUCE_ONESHOT_MAX, default 256 KiB) and the
 * smallest tensor reduced in BF16: SIZE_MAX (never) unless LOOM_CUDA_ALLREDUCE_BF16=1, then
 * LOOM_CUDA_ALLREDUCE_BF16_MIN (default 1 MiB). Any other LOOM_CUDA_ALLREDUCE_BF16 value
 * is logged and BF16 stays off. */
void loom__cuda_comm_thresholds(size_t *oneshot_max, size_t *bf16_min);

/* The communicator between processes that the reg exports as LOOM_PROC_RANK_COMM
 * (include/loom/backend-impl.h; cuda-comm.c): NCCL with one CUDA device per rank. Never
 * NULL where the toolkit was found; its `usable` says why NCCL cannot be used. */
const struct loom_rank_comm_iface *loom__cuda_rank_comm(void);

#endif /* LOOM_CUDA_NCCL_H */
