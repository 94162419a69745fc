/*
 * The host-staged AllReduce: for devices that cannot copy to each other (p2p=0 sim
 * devices, a mix of unrelated backends), or when forced. Each chunk of the tensor is
 * fetched from every non-empty device into host memory (all devices at once, async), summed
 * on the host in device order, and written back to every device. Chunks are double
 * buffered so the host sums chunk k while the devices already send chunk k+1, and the host
 * memory stays bounded (2 x (N+1) chunks) whatever the tensor size.
 */
#include <string.h>

#include "reduce/reduce-impl.h"

#define LOOM__RD_HOST_CHUNK ((int64_t)1 << 20) /* floats per chunk: 4 MiB */

static float *rd_stage(loom_reducer *r, int parity, int slot) {
    return r->host_stage +
           ((size_t)parity * (size_t)(r->n + 1) + (size_t)slot) * r->host_stage_floats;
}

static void rd_gather(loom_reducer *r, loom_tensor *const *t, const bool *empty, int parity,
                      int64_t off, int64_t cnt) {
    for (int j = 0; j < r->n; j++) {
        if (empty && empty[j]) continue;
        loom_backend_tensor_get_async(r->backends[j], t[j], rd_stage(r, parity, j),
                                      (size_t)off * sizeof(float), (size_t)cnt * sizeof(float));
    }
}

loom_status loom__rd_host_allreduce(loom_reducer *r, loom_tensor *const *t, int64_t n_elem,
                                    const bool *empty) {
    const int N = r->n;
    int64_t chunk = n_elem < LOOM__RD_HOST_CHUNK ? n_elem : LOOM__RD_HOST_CHUNK;
    if ((size_t)chunk > r->host_stage_floats) {
        loom_free(r->host_stage);
        r->host_stage_floats = 0;
        r->host_stage = loom_malloc(2 * (size_t)(N + 1) * (size_t)chunk * sizeof(float));
        if (!r->host_stage) {
            return loom_error(LOOM_ERR_NOMEM,
                              "allreduce (host): out of host memory for %d staging chunks of "
                              "%lld floats",
                              2 * (N + 1), (long long)chunk);
        }
        r->host_stage_floats = (size_t)chunk;
    }
    int n_src = 0;
    for (int j = 0; j < N; j++)
        n_src += !(empty && empty[j]);

    int64_t n_chunks = (n_elem + chunk - 1) / chunk;
    rd_gather(r, t, empty, 0, 0, chunk);
    loom__rd_sync_all(r);
    for (int64_t k = 0; k < n_chunks; k++) {
        int par = (int)(k & 1);
        int64_t off = k * chunk;
        int64_t cnt = n_elem - off < chunk ? n_elem - off : chunk;
        if (k + 1 < n_chunks) {
            int64_t off1 = off + chunk;
            int64_t cnt1 = n_elem - off1 < chunk ? n_elem - off1 : chunk;
            rd_gather(r, t, empty, par ^ 1, off1, cnt1);
        }
        float *acc = rd_stage(r, par, N);
        bool first = true;
        for (int j = 0; j < N; j++) {
            if (empty && empty[j]) continue;
            const float *x = rd_stage(r, par, j);
            if (first) {
                memcpy(acc, x, (size_t)cnt * sizeof(float));
                first = false;
            } else {
                for (int64_t i = 0; i < cnt; i++)
                    acc[i] += x[i];
            }
        }
        if (first) memset(acc, 0, (size_t)cnt * sizeof(float)); /* every device empty */
        for (int j = 0; j < N; j++) {
            loom_backend_tensor_set_async(r->backends[j], t[j], acc, (size_t)off * sizeof(float),
                                          (size_t)cnt * sizeof(float));
        }
        /* the next chunk has arrived and this one is written: both buffers are free */
        loom__rd_sync_all(r);
        uint64_t bytes = (uint64_t)cnt * sizeof(float);
        r->stats.bytes_moved += bytes * (uint64_t)(n_src + N);
        loom_status s = loom__rd_trace_push(r, bytes);
        if (s == LOOM_OK) s = loom__rd_trace_push(r, bytes);
        if (s != LOOM_OK) return s;
    }
    return LOOM_OK;
}

void loom__rd_host_free(loom_reducer *r) {
    loom_free(r->host_stage);
    r->host_stage = NULL;
    r->host_stage_floats = 0;
}
