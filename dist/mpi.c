/*
 * The MPI transport: init/finalize, broadcast, the float AllReduce under the communicator,
 * the status agreement of loom_dist_agree, and abort. The only file of loom that includes
 * mpi.h. Errors keep Open MPI's default handler (MPI_ERRORS_ARE_FATAL): a broken peer ends
 * every rank with MPI's message instead of leaving the others waiting. A peer that MPI does
 * not see go (it left after MPI_Finalize, or waits in another call) is caught by a deadline:
 * every call that waits for other ranks is non-blocking and tested until LOOM_DIST_TIMEOUT
 * (mpi_wait).
 *
 * The MPI library is loaded when loom_dist_init first needs it (dlopen, RTLD_GLOBAL as MPI's
 * own plugins need), not linked: libloom does not NEED libmpi, so an engine that never uses
 * --dist mpi neither loads it nor needs it installed. mpi.h gives the types and the
 * prototypes (each pointer below has its function's type); Open MPI's predefined handles
 * (MPI_COMM_WORLD, MPI_BYTE, MPI_SUM, ...) are addresses of its globals, looked up the same
 * way (MPICH's are constants). LOOM_MPI_LIB names another library file.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist-impl.h"

/* The MPI functions loom calls, each a pointer of the function's own type. */
#define LOOM__MPI_FNS(X)                                                                           \
    X(Init)                                                                                        \
    X(Initialized)                                                                                 \
    X(Finalized)                                                                                   \
    X(Finalize)                                                                                    \
    X(Comm_dup)                                                                                    \
    X(Comm_free)                                                                                   \
    X(Comm_rank)                                                                                   \
    X(Comm_size)                                                                                   \
    X(Error_string)                                                                                \
    X(Ibcast)                                                                                      \
    X(Isend)                                                                                       \
    X(Irecv)                                                                                       \
    X(Iallreduce)                                                                                  \
    X(Iallgather)                                                                                  \
    X(Test)                                                                                        \
    X(Abort)

#define LOOM__MPI_DECL(n) __typeof__(MPI_##n) *n;
static struct {
    LOOM__MPI_FNS(LOOM__MPI_DECL)
    MPI_Comm comm_world;
    MPI_Datatype byte, flt, int_;
    MPI_Op sum, min;
    bool ok;
    char why[600];
} mpi;
static pthread_once_t mpi_once = PTHREAD_ONCE_INIT;

/* dlsym into a pointer of any type (a function's or a handle's); false when absent */
static bool mpi_sym(void *h, const char *name, void *out, size_t size) {
    void *p = dlsym(h, name);
    if (!p) {
        snprintf(mpi.why, sizeof mpi.why, "the MPI library has no symbol %s", name);
        return false;
    }
    memcpy(out, &p, size);
    return true;
}

static void mpi_load_once(void) {
    const char *env = getenv("LOOM_MPI_LIB");
#ifdef OPEN_MPI
    const char *names[] = {env && env[0] ? env : "libmpi.so.40", "libmpi.so"};
#else
    const char *names[] = {env && env[0] ? env : "libmpi.so.12", "libmpi.so"};
#endif
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) {
        dlerror();
        h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (!h && i == 0) {
            const char *e = dlerror();
            snprintf(mpi.why, sizeof mpi.why, "cannot load the MPI library %s: %s", names[0],
                     e ? e : "not found");
        }
        if (env && env[0]) break; /* the one named, or none */
    }
    if (!h) return;
    bool ok = true;
#define LOOM__MPI_LOAD(n) ok = ok && mpi_sym(h, "MPI_" #n, &mpi.n, sizeof mpi.n);
    LOOM__MPI_FNS(LOOM__MPI_LOAD)
#ifdef OPEN_MPI
    /* The handles are the addresses of Open MPI's predefined objects, looked up in the
     * global scope: a program that links MPI itself and names MPI_COMM_WORLD holds a copy
     * of the object (a copy relocation), which is the one MPI then uses, not its own. */
    void *g = RTLD_DEFAULT;
    ok = ok && mpi_sym(g, "ompi_mpi_comm_world", &mpi.comm_world, sizeof mpi.comm_world) &&
         mpi_sym(g, "ompi_mpi_byte", &mpi.byte, sizeof mpi.byte) &&
         mpi_sym(g, "ompi_mpi_float", &mpi.flt, sizeof mpi.flt) &&
         mpi_sym(g, "ompi_mpi_int", &mpi.int_, sizeof mpi.int_) &&
         mpi_sym(g, "ompi_mpi_op_sum", &mpi.sum, sizeof mpi.sum) &&
         mpi_sym(g, "ompi_mpi_op_min", &mpi.min, sizeof mpi.min);
#else
    mpi.comm_world = MPI_COMM_WORLD;
    mpi.byte = MPI_BYTE;
    mpi.flt = MPI_FLOAT;
    mpi.int_ = MPI_INT;
    mpi.sum = MPI_SUM;
    mpi.min = MPI_MIN;
#endif
    mpi.ok = ok; /* stays mapped: MPI cannot be unloaded and loaded again */
}

/* Loads the MPI library once; false with loom_last_error saying why. */
static bool mpi_load(void) {
    pthread_once(&mpi_once, mpi_load_once);
    if (!mpi.ok) loom_error(LOOM_ERR_UNSUPPORTED, "dist: %s (set LOOM_MPI_LIB)", mpi.why);
    return mpi.ok;
}

static MPI_Comm comm_of(const loom_dist *d) {
    return *(MPI_Comm *)d->comm;
}

bool loom_dist_available(void) {
    return true;
}

static loom_status mpi_error(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    mpi.Error_string(rc, msg, &len);
    return loom_error(LOOM_ERR_DEVICE, "dist: %s failed: %s", what, msg);
}

/* LOOM_DIST_TIMEOUT: seconds a rank waits in one MPI call for its peers (default 300; 0 =
 * for ever), read by loom_dist_init. */
static double wait_limit_s(void) {
    const char *v = getenv("LOOM_DIST_TIMEOUT");
    char *end = NULL;
    double x = v && v[0] ? strtod(v, &end) : 300;
    if (v && v[0] && (!end || *end || !(x >= 0) || x > 1e9)) {
        LOOM_LOG_WARN("dist: LOOM_DIST_TIMEOUT='%s' is not a number of seconds: 300 s", v);
        x = 300;
    }
    return x;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every MPI call that waits for another rank is started non-blocking and finished here:
 * rc is the start's result; the request is tested until done, or until LOOM_DIST_TIMEOUT
 * has passed (a peer rank that died or left without MPI noticing, or that is waiting in
 * another call), which is an error naming the call instead of a hang. The caller ends the
 * ranks (loom_dist_abort). Busy for the first 10 ms (latency), then 50 us sleeps. */
static loom_status mpi_wait(loom_dist *d, int rc, MPI_Request *req, const char *what) {
    if (rc != MPI_SUCCESS) return mpi_error(rc, what);
    const double limit = d->wait_s, t0 = now_s();
    for (unsigned long spin = 0;; spin++) {
        int done = 0;
        rc = mpi.Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, what);
        if (done) return LOOM_OK;
        if ((spin & 63) != 0) continue;
        const double waited = now_s() - t0;
        if (limit > 0 && waited > limit)
            return loom_error(LOOM_ERR_DEVICE,
                              "dist: rank %d of %d: %s did not finish within %g s: a peer rank "
                              "died, left, or is waiting in another call (LOOM_DIST_TIMEOUT)",
                              d->rank, d->size, what, limit);
        if (waited > 0.01) {
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
        }
    }
}

loom_status loom_dist_init(loom_dist **out) {
    *out = NULL;
    if (!loom_dist_launched())
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "--dist mpi: this process was not started by an MPI launcher (run it "
                          "as `mpirun -np N loom ...`); without one it would be a lone rank");
    if (!mpi_load()) return loom_last_status();
    int inited = 0, finalized = 0;
    mpi.Initialized(&inited);
    mpi.Finalized(&finalized);
    if (inited || finalized)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: MPI is already %s in this process",
                          finalized ? "finalized" : "initialized");
    int rc = mpi.Init(NULL, NULL);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init");
    loom_dist *d = loom_calloc(1, sizeof *d);
    MPI_Comm *c = loom_calloc(1, sizeof *c);
    if (!d || !c) {
        loom_free(d);
        loom_free(c);
        mpi.Finalize();
        return loom_error(LOOM_ERR_NOMEM, "dist: out of memory");
    }
    if ((rc = mpi.Comm_dup(mpi.comm_world, c)) != MPI_SUCCESS) {
        loom_free(d);
        loom_free(c);
        mpi.Finalize();
        return mpi_error(rc, "MPI_Comm_dup");
    }
    d->comm = c;
    d->wait_s = wait_limit_s();
    mpi.Comm_rank(*c, &d->rank);
    mpi.Comm_size(*c, &d->size);
    *out = d;
    return LOOM_OK;
}

void loom_dist_free(loom_dist *d) {
    if (!d) return;
    loom__dist_devices_free(d);
    mpi.Comm_free((MPI_Comm *)d->comm);
    loom_free(d->comm);
    loom_free(d);
    mpi.Finalize();
}

loom_status loom_dist_bcast(loom_dist *d, void *data, size_t bytes, int root) {
    if (root < 0 || root >= d->size)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: broadcast root %d of %d ranks", root,
                          d->size);
    d->stats.collectives++;
    for (size_t o = 0; o < bytes;) {
        size_t k = bytes - o < (size_t)INT_MAX ? bytes - o : (size_t)INT_MAX;
        MPI_Request rq;
        int rc = mpi.Ibcast((char *)data + o, (int)k, mpi.byte, root, comm_of(d), &rq);
        loom_status st = mpi_wait(d, rc, &rq, "MPI_Bcast");
        if (st) return st;
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
        MPI_Request rq;
        int rc = d->rank == from
                     ? mpi.Isend((char *)data + o, (int)k, mpi.byte, to, 17, comm_of(d), &rq)
                     : mpi.Irecv((char *)data + o, (int)k, mpi.byte, from, 17, comm_of(d), &rq);
        loom_status st = mpi_wait(d, rc, &rq, d->rank == from ? "MPI_Send" : "MPI_Recv");
        if (st) return st;
        o += k;
    }
    return LOOM_OK;
}

loom_status loom__dist_allreduce_f32(loom_dist *d, float *data, size_t n) {
    d->stats.collectives++;
    for (size_t o = 0; o < n;) {
        size_t k = n - o < (size_t)INT_MAX ? n - o : (size_t)INT_MAX;
        MPI_Request rq;
        int rc = mpi.Iallreduce(MPI_IN_PLACE, data + o, (int)k, mpi.flt, mpi.sum, comm_of(d), &rq);
        loom_status st = mpi_wait(d, rc, &rq, "MPI_Allreduce");
        if (st) return st;
        o += k;
    }
    return LOOM_OK;
}

loom_status loom__dist_allgather(loom_dist *d, const void *mine, void *all, size_t bytes) {
    if (bytes > (size_t)INT_MAX)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: allgather of %zu bytes", bytes);
    d->stats.collectives++;
    MPI_Request rq;
    int rc = mpi.Iallgather(mine, (int)bytes, mpi.byte, all, (int)bytes, mpi.byte, comm_of(d), &rq);
    return mpi_wait(d, rc, &rq, "MPI_Allgather");
}

loom_status loom_dist_agree(loom_dist *d, loom_status st) {
    int mine = st != LOOM_OK ? d->rank : d->size, first = d->size;
    d->stats.collectives++;
    MPI_Request rq;
    int rc = mpi.Iallreduce(&mine, &first, 1, mpi.int_, mpi.min, comm_of(d), &rq);
    loom_status wst = mpi_wait(d, rc, &rq, "MPI_Allreduce (status)");
    if (wst) return wst;
    if (first == d->size) return LOOM_OK;
    struct {
        int status;
        char msg[768];
    } m = {0};
    if (first == d->rank) {
        m.status = (int)st;
        snprintf(m.msg, sizeof m.msg, "%s", loom_last_error());
    }
    rc = mpi.Ibcast(&m, (int)sizeof m, mpi.byte, first, comm_of(d), &rq);
    wst = mpi_wait(d, rc, &rq, "MPI_Bcast (status)");
    if (wst) return wst;
    m.msg[sizeof m.msg - 1] = 0;
    return loom_error((loom_status)m.status, "rank %d: %s", first, m.msg);
}

void loom_dist_abort(loom_dist *d, int code) {
    if (!mpi_load()) abort(); /* no MPI session can exist: nothing to end but this process */
    mpi.Abort(d ? comm_of(d) : mpi.comm_world, code);
}
