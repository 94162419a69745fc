/*
 * The transport of a loom built without MPI: loom_dist_init explains, nothing else can be
 * reached (there is no loom_dist without init).
 */
#include "dist/dist-impl.h"

bool loom_dist_available(void) {
    return false;
}

loom_status loom_dist_init(loom_dist **out) {
    *out = NULL;
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "--dist mpi: this loom was built without MPI (install libopenmpi-dev and "
                      "openmpi-bin, then rebuild)");
}

void loom_dist_free(loom_dist *d) {
    (void)d;
}

loom_status loom_dist_bcast(loom_dist *d, void *data, size_t bytes, int root) {
    (void)d, (void)data, (void)bytes, (void)root;
    return loom_error(LOOM_ERR_UNSUPPORTED, "dist: built without MPI");
}

loom_status loom__dist_send_recv(loom_dist *d, void *data, size_t bytes, int from, int to) {
    (void)d, (void)data, (void)bytes, (void)from, (void)to;
    return loom_error(LOOM_ERR_UNSUPPORTED, "dist: built without MPI");
}

loom_status loom__dist_allreduce_f32(loom_dist *d, float *data, size_t n) {
    (void)d, (void)data, (void)n;
    return loom_error(LOOM_ERR_UNSUPPORTED, "dist: built without MPI");
}

loom_status loom__dist_allgather(loom_dist *d, const void *mine, void *all, size_t bytes) {
    (void)d, (void)mine, (void)all, (void)bytes;
    return loom_error(LOOM_ERR_UNSUPPORTED, "dist: built without MPI");
}

loom_status loom_dist_agree(loom_dist *d, loom_status st) {
    (void)d;
    return st;
}

void loom_dist_abort(loom_dist *d, int code) {
    (void)d, (void)code;
}
