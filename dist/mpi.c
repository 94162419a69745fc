/*
 * The MPI transport: init/finalize, broadcast, the float AllReduce under the communicator,
 * the status agreement of loom_dist_agree, and abort. The only file of loom that includes
 * mpi.h. Errors keep Open MPI's default handler (MPI_ERRORS_ARE_FATAL): a broken peer ends
 * every rank with MPI's message instead of leaving the others waiting.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "dist/dist-impl.h"

static MPI_Comm comm_of(const loom_dist *d) {
    return *(MPI_Comm *)d->comm;
}

bool loom_dist_available(void) {
    return true;
}

static loom_status mpi_error(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return loom_error(LOOM_ERR_DEVICE, "dist: %s failed: %s", what, msg);
}

loom_status loom_dist_init(loom_dist **out) {
    *out = NULL;
    if (!loom_dist_launched())
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "--dist mpi: this process was not started by an MPI launcher (run it "
                          "as `mpirun -np N loom ...`); without one it would be a lone rank");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited || finalized)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: MPI is already %s in this process",
                          finalized ? "finalized" : "initialized");
    int rc = MPI_Init(NULL, NULL);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init");
    loom_dist *d = loom_calloc(1, sizeof *d);
    MPI_Comm *c = loom_calloc(1, sizeof *c);
    if (!d || !c) {
        loom_free(d);
        loom_free(c);
        MPI_Finalize();
        return loom_error(LOOM_ERR_NOMEM, "dist: out of memory");
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, c)) != MPI_SUCCESS) {
        loom_free(d);
        loom_free(c);
        MPI_Finalize();
        return mpi_error(rc, "MPI_Comm_dup");
    }
    d->comm = c;
    MPI_Comm_rank(*c, &d->rank);
    MPI_Comm_size(*c, &d->size);
    *out = d;
    return LOOM_OK;
}

void loom_dist_free(loom_dist *d) {
    if (!d) return;
    loom__dist_devices_free(d);
    MPI_Comm_free((MPI_Comm *)d->comm);
    loom_free(d->comm);
    loom_free(d);
    MPI_Finalize();
}

loom_status loom_dist_bcast(loom_dist *d, void *data, size_t bytes, int root) {
    if (root < 0 || root >= d->size)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: broadcast root %d of %d ranks", root,
                          d->size);
    d->stats.collectives++;
    for (size_t o = 0; o < bytes;) {
        size_t k = bytes - o < (size_t)INT_MAX ? bytes - o : (size_t)INT_MAX;
        int rc = MPI_Bcast((char *)data + o, (int)k, MPI_BYTE, root, comm_of(d));
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Bcast");
        o += k;
    }
    return LOOM_OK;
}

loom_status loom__dist_send_recv(loom_dist *d, void *data, size_t bytes, int from, int to) {
    if (from == to || (d->rank != from && d->rank != to)) return LOOM_OK;
    if (d->rank == from) {
        d->stats.sends++;
        d->stats.bytes_sent += bytes;
    } else {
        d->stats.recvs++;
        d->stats.bytes_recv += bytes;
    }
    for (size_t o = 0; o < bytes;) {
        size_t k = bytes - o < (size_t)INT_MAX ? bytes - o : (size_t)INT_MAX;
        int rc = d->rank == from ? MPI_Send((char *)data + o, (int)k, MPI_BYTE, to, 17, comm_of(d))
                                 : MPI_Recv((char *)data + o, (int)k, MPI_BYTE, from, 17,
                                            comm_of(d), MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, d->rank == from ? "MPI_Send" : "MPI_Recv");
        o += k;
    }
    return LOOM_OK;
}

loom_status loom__dist_allreduce_f32(loom_dist *d, float *data, size_t n) {
    d->stats.collectives++;
    for (size_t o = 0; o < n;) {
        size_t k = n - o < (size_t)INT_MAX ? n - o : (size_t)INT_MAX;
        int rc = MPI_Allreduce(MPI_IN_PLACE, data + o, (int)k, MPI_FLOAT, MPI_SUM, comm_of(d));
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
        o += k;
    }
    return LOOM_OK;
}

loom_status loom__dist_allgather(loom_dist *d, const void *mine, void *all, size_t bytes) {
    if (bytes > (size_t)INT_MAX)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: allgather of %zu bytes", bytes);
    d->stats.collectives++;
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm_of(d));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_error(rc, "MPI_Allgather");
}

loom_status loom_dist_agree(loom_dist *d, loom_status st) {
    int mine = st != LOOM_OK ? d->rank : d->size, first = d->size;
    d->stats.collectives++;
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_of(d));
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce (status)");
    if (first == d->size) return LOOM_OK;
    struct {
        int status;
        char msg[768];
    } m = {0};
    if (first == d->rank) {
        m.status = (int)st;
        snprintf(m.msg, sizeof m.msg, "%s", loom_last_error());
    }
    rc = MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, comm_of(d));
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Bcast (status)");
    m.msg[sizeof m.msg - 1] = 0;
    return loom_error((loom_status)m.status, "rank %d: %s", first, m.msg);
}

void loom_dist_abort(loom_dist *d, int code) {
    MPI_Abort(d ? comm_of(d) : MPI_COMM_WORLD, code);
}
