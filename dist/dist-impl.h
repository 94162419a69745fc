/*
 * dist/ internals: the process context shared by the transport (mpi.c, or none.c when loom
 * is built without MPI) and the dist reg/devices/buffers/backends (device.c). Only mpi.c
 * includes mpi.h; the communicator handle is an opaque pointer here.
 */
#ifndef LOOM_DIST_IMPL_H
#define LOOM_DIST_IMPL_H

#include "backends/backend-impl.h"
#include "loom/dist.h"

#define LOOM_DIST_MAX_RANKS 16

/* One dist device: member `index` of the meta device, owned by rank `index`. */
typedef struct loom__dist_dev {
    loom_dist *d;
    int index;
    bool remote;         /* another rank's: no memory, no compute in this process */
    loom_dev_t inner;    /* the real local device (remote ones answer static questions with it) */
    int n_threads;       /* a CPU inner backend's threads (<= 0: its default) */
    loom_buffer_t proxy; /* a meta inner device: an empty buffer of its type (device.c) */
    char name[16];       /* "MPI0" */
    char desc[160];
    struct loom_dev dev;
    struct loom_buft buft;
} loom__dist_dev;

/* How the members' device memory crosses ranks (loom_dist_comm_setup). */
typedef enum loom__dist_path {
    LOOM__DIST_PATH_UNSET, /* loom_dist_comm_setup not called: through host memory and MPI */
    LOOM__DIST_PATH_HOST,  /* through host memory and MPI (chosen: see path_why) */
    LOOM__DIST_PATH_RANK,  /* the local device's rank communicator (NCCL) */
} loom__dist_path;

struct loom_dist {
    int rank, size;
    void *comm; /* the transport's communicator (a dup of MPI_COMM_WORLD) */
    double wait_s; /* LOOM_DIST_TIMEOUT: the longest wait in one MPI call, s (0: no limit) */
    struct loom_reg reg;
    loom__dist_dev devs[LOOM_DIST_MAX_RANKS];
    int n_devs; /* 0 until loom_dist_devices */
    loom_dist_stats stats;
    /* the rank communicator (include/loom/backend-impl.h), set up by loom_dist_comm_setup */
    const loom_rank_comm_iface *rc_api; /* injected (loom_dist_set_rank_comm), else NULL */
    bool rc_injected;
    void *rc;              /* its communicator, when path == RANK */
    loom__dist_path path;  /* agreed by every rank */
    bool check_counts;     /* rank 0's LOOM_DIST_CHECK: every rank checks the counts agree */
    char path_why[768];    /* why the host path was chosen */
    char path_desc[160];   /* what the report prints */
    loom_status rc_status; /* a failure of the rank communicator (sticky; the next compute) */
    char rc_msg[768];
};

/* Frees what the dist devices made (their proxy buffers); called by loom_dist_free. */
void loom__dist_devices_free(loom_dist *d);

/* Point-to-point: rank `from` sends bytes to rank `to` (the others do nothing; from == to
 * does nothing). */
loom_status loom__dist_send_recv(loom_dist *d, void *data, size_t bytes, int from, int to);
/* Collective: sums n floats in place over every rank. */
loom_status loom__dist_allreduce_f32(loom_dist *d, float *data, size_t n);
/* Collective: every rank's `bytes` of `mine`, in rank order, into all (size * bytes). */
loom_status loom__dist_allgather(loom_dist *d, const void *mine, void *all, size_t bytes);

#endif /* LOOM_DIST_IMPL_H */
