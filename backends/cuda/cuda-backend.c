/*
 * CUDA command streams (backends) and events.
 *
 * A backend is one non-blocking CUDA stream on its device's GPU, with a cuBLAS handle
 * bound to it (and a fixed workspace, so GEMMs can be captured into CUDA graphs), a
 * scratch buffer for graph_compute, and a device error record for the kernels that follow
 * indices. Async set/get are cudaMemcpyAsync on the stream; graph_compute (cuda-graph.c)
 * enqueues kernels; synchronize waits for the stream and harvests asynchronous errors
 * (the kernels' error record is copied back in the same wait).
 *
 * Copies between backends keep sim's ordering contract: the copy runs on the destination
 * stream after all work issued so far on the source stream (a fresh event recorded there
 * for each copy, so copies issued from several threads never share event state).
 * Same GPU: a device copy. Another GPU reachable peer to peer: cudaMemcpyPeerAsync.
 * Otherwise the copy is staged through the destination backend's pinned host buffer:
 * device to host on the source stream, host to device on the destination stream, with a
 * second event keeping the staging buffer from being overwritten while still being read.
 *
 * Async set/get from pageable host memory go through a ring of pinned staging slots
 * (LOOM_CUDA_STAGE_SLOTS x 4 MiB, allocated on first use): a set copies the data into a
 * free slot on the host and queues the slot's upload, so it returns before the transfer
 * completes and overlaps compute; a get queues the download into a slot and a host
 * function that copies the slot out once it arrived (the data is there after
 * synchronize, as for any async get). Pinned memory (CUDA_Host buffers) is copied
 * directly.
 *
 * Hooks without a status (async copies, synchronize, event record/wait) keep their first
 * failure as the backend's sticky error, naming the graph whose work failed (synchronize
 * waits for it). get_status reports it (the call that waited); if nobody asked, the next
 * graph_compute returns it instead.
 *
 * Synchronous buffer calls (cuda-buffer.c) first make their stream wait for every live
 * backend of the device (loom__cuda_dev_order), so a read right after an async compute
 * sees its results.
 */
#define _POSIX_C_SOURCE 200809L /* pthread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-impl.h"

/* ---------------------------------------------------------------- events */

typedef struct loom__cuda_event {
    struct loom_event ev; /* ev.context = this */
    cudaEvent_t event;
    int cuda_id;
} loom__cuda_event;

static loom__cuda_event *loom__cuda_event_of(loom_event_t ev) {
    LOOM_ASSERT(ev != NULL && loom__cuda_dev_of(ev->device) != NULL); /* not a CUDA event */
    return ev->context;
}

loom_event_t loom__cuda_event_new(loom_dev_t dev) {
    loom__cuda_dev *cd = loom__cuda_dev_of(dev);
    loom__cuda_event *ce = loom_calloc(1, sizeof *ce);
    if (!ce) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for an event", cd->name);
        return NULL;
    }
    if (LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id)) != LOOM_OK ||
        LOOM_CUDA_CHECK(cd->name, cudaEventCreateWithFlags(&ce->event, cudaEventDisableTiming)) !=
            LOOM_OK) {
        loom_free(ce);
        return NULL;
    }
    ce->ev.device = dev;
    ce->ev.context = ce;
    ce->cuda_id = cd->cuda_id;
    return &ce->ev;
}

void loom__cuda_event_free(loom_dev_t dev, loom_event_t ev) {
    loom__cuda_event *ce = loom__cuda_event_of(ev);
    /* Released by the driver once a pending record completes. */
    if (LOOM_CUDA_CHECK(loom_dev_name(dev), cudaEventDestroy(ce->event)) != LOOM_OK)
        LOOM_LOG_ERROR("%s", loom_last_error());
    loom_free(ce);
}

void loom__cuda_event_synchronize(loom_dev_t dev, loom_event_t ev) {
    loom__cuda_event *ce = loom__cuda_event_of(ev);
    if (LOOM_CUDA_CHECK(loom_dev_name(dev), cudaEventSynchronize(ce->event)) != LOOM_OK)
        LOOM_LOG_ERROR("%s", loom_last_error());
}

/* ---------------------------------------------------------------- errors */

void loom__cuda_backend_set_error(loom__cuda_backend *cb, loom_status s) {
    LOOM_LOG_ERROR("%s", loom_last_error());
    if (cb->async_status != LOOM_OK) return;
    cb->async_status = s;
    snprintf(cb->async_msg, sizeof cb->async_msg, "%s", loom_last_error());
}

/* Makes the backend's GPU current; a failure becomes the sticky error. */
static bool loom__cuda_use(loom__cuda_backend *cb) {
    loom_status s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
    if (s != LOOM_OK) loom__cuda_backend_set_error(cb, s);
    return s == LOOM_OK;
}

static void loom__cuda_check_async(loom__cuda_backend *cb, loom_status s) {
    if (s != LOOM_OK) loom__cuda_backend_set_error(cb, s);
}

/* ---------------------------------------------------------------- ordering */

loom_status loom__cuda_dev_order(loom__cuda_dev *cd, cudaStream_t stream) {
    loom_status s = LOOM_OK;
    pthread_mutex_lock(&cd->mu);
    for (loom__cuda_backend *cb = cd->backends; cb && s == LOOM_OK; cb = cb->dev_next) {
        /* a stream being captured runs nothing until its graph is launched (and an event
         * recorded into a capture cannot be waited for outside it). The flag, not
         * cudaStreamIsCapturing: a capture begins and ends under cd->mu (cuda-graph.c), so
         * no other host thread can start one between this check and the record. */
        if (cb->capturing) continue;
        s = LOOM_CUDA_CHECK(cd->name, cudaEventRecord(cb->order_ev, cb->stream));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cd->name, cudaStreamWaitEvent(stream, cb->order_ev, 0));
    }
    pthread_mutex_unlock(&cd->mu);
    return s;
}

loom_status loom__cuda_backend_get_status(loom_backend_t backend) {
    loom__cuda_backend *cb = loom__cuda_backend_of(backend);
    if (!cb || cb->async_status == LOOM_OK) return LOOM_OK;
    cb->async_reported = true;
    return loom_error(cb->async_status, "%s", cb->async_msg);
}

/* After the stream went idle (the record was copied to err_host in stream order): an index
 * error written by a kernel becomes the sticky error, and the record is cleared. */
static void loom__cuda_harvest(loom__cuda_backend *cb) {
    const loom_cu_err e = *cb->err_host;
    if (e.code == LOOM_CU_ERR_NONE) return;
    const loom_op op = e.code == LOOM_CU_ERR_GET_ROWS   ? LOOM_OP_GET_ROWS
                       : e.code == LOOM_CU_ERR_SET_ROWS ? LOOM_OP_SET_ROWS
                       : e.code == LOOM_CU_ERR_ADD_ID   ? LOOM_OP_ADD_ID
                                                        : LOOM_OP_MUL_MAT_ID;
    memset(cb->err_host, 0, sizeof *cb->err_host);
    loom_status s = loom_error(
        LOOM_ERR_INVALID_ARG,
        "%s: %s (node %lld of its graph): index %lld out of range [0, %lld); that row was "
        "skipped (in %s)",
        cb->name, loom_op_name(op), (long long)e.node, (long long)e.value, (long long)e.limit,
        cb->last_graph[0] ? cb->last_graph : "the last graph");
    loom__cuda_backend_set_error(cb, s);
    /* later kernels on this stream see a clean record */
    loom__cuda_check_async(
        cb, LOOM_CUDA_CHECK(cb->name,
                            cudaMemsetAsync(cb->err_dev, 0, sizeof *cb->err_dev, cb->stream)));
}

/* ---------------------------------------------------------------- backend methods */

static const struct loom_backend_i loom__cuda_backend_i;

loom__cuda_backend *loom__cuda_backend_of(loom_backend_t b) {
    if (!b || b->iface != &loom__cuda_backend_i) return NULL;
    return b->context;
}

static loom__cuda_backend *loom__cuda_ctx(loom_backend_t b) {
    LOOM_ASSERT(b != NULL && b->iface == &loom__cuda_backend_i);
    return b->context;
}

static const char *loom__cuda_backend_name(loom_backend_t backend) {
    return loom__cuda_ctx(backend)->name;
}

/* Releases everything of a (possibly partly built) backend. */
static void loom__cuda_backend_destroy(loom__cuda_backend *cb) {
    const char *w = cb->name;
    (void)LOOM_CUDA_CHECK(w, cudaSetDevice(cb->cd->cuda_id));
    if (cb->stream) (void)LOOM_CUDA_CHECK(w, cudaStreamSynchronize(cb->stream));
    loom__cuda_gcache_free(cb->gcache);
    for (int i = 0; i < cb->wcache_n; i++)
        (void)LOOM_CUDA_CHECK(w, cudaFree(cb->wcache[i].bf16));
    loom_free(cb->wcache);
    if (cb->cublas) (void)LOOM_CUBLAS_CHECK(w, cublasDestroy(cb->cublas));
    if (cb->cublas_ws) (void)LOOM_CUDA_CHECK(w, cudaFree(cb->cublas_ws));
    if (cb->scratch) (void)LOOM_CUDA_CHECK(w, cudaFree(cb->scratch));
    if (cb->staging) (void)LOOM_CUDA_CHECK(w, cudaFreeHost(cb->staging));
    if (cb->err_host) (void)LOOM_CUDA_CHECK(w, cudaFreeHost(cb->err_host));
    if (cb->err_dev) (void)LOOM_CUDA_CHECK(w, cudaFree(cb->err_dev));
    if (cb->staging_free) (void)LOOM_CUDA_CHECK(w, cudaEventDestroy(cb->staging_free));
    if (cb->order_ev) (void)LOOM_CUDA_CHECK(w, cudaEventDestroy(cb->order_ev));
    for (int k = 0; k < LOOM_CUDA_STAGE_SLOTS; k++)
        if (cb->stage_ev[k]) (void)LOOM_CUDA_CHECK(w, cudaEventDestroy(cb->stage_ev[k]));
    if (cb->stage) (void)LOOM_CUDA_CHECK(w, cudaFreeHost(cb->stage));
    if (cb->stream) (void)LOOM_CUDA_CHECK(w, cudaStreamDestroy(cb->stream));
    if (cb->mu_ok) pthread_mutex_destroy(&cb->staging_mu);
    loom_free(cb);
}

static void loom__cuda_backend_free(loom_backend_t backend) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    loom__cuda_dev *cd = cb->cd;
    pthread_mutex_lock(&cd->mu);
    for (loom__cuda_backend **p = &cd->backends; *p; p = &(*p)->dev_next) {
        if (*p == cb) {
            *p = cb->dev_next;
            break;
        }
    }
    cd->n_backends--;
    pthread_mutex_unlock(&cd->mu);
    loom__cuda_backend_destroy(cb);
}

/* A stream reaches only its own device's memory (the scheduler guarantees it). */
static void loom__cuda_check_tensor(loom__cuda_backend *cb, const loom_tensor *t) {
    LOOM_ASSERT(t->buffer != NULL);
    LOOM_ASSERT(loom__cuda_buffer_dev(t->buffer) == cb->cd);
}

/* ---------------------------------------------------------------- pinned staging */

/* Whether host memory p is pageable (not pinned or managed): such copies are staged. */
static bool loom__cuda_is_pageable(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

/* The staging ring, allocated on first use; false (copy directly) if it cannot be. */
static bool loom__cuda_stage_ready(loom__cuda_backend *cb) {
    if (cb->stage) return true;
    if (cb->stage_failed) return false;
    void *p = NULL;
    loom_status s =
        LOOM_CUDA_CHECK(cb->name, cudaHostAlloc(&p, LOOM_CUDA_STAGE_SLOTS * LOOM_CUDA_STAGE_SLOT,
                                                cudaHostAllocPortable));
    for (int k = 0; k < LOOM_CUDA_STAGE_SLOTS && s == LOOM_OK; k++)
        s = LOOM_CUDA_CHECK(cb->name,
                            cudaEventCreateWithFlags(&cb->stage_ev[k], cudaEventDisableTiming));
    if (s != LOOM_OK) {
        LOOM_LOG_WARN("%s: no pinned staging for async copies (%s); they run unstaged", cb->name,
                      loom_last_error());
        if (p) (void)cudaFreeHost(p);
        cb->stage_failed = true;
        return false;
    }
    cb->stage = p;
    return true;
}

/* The next slot, once its previous transfer (and host copy) completed; NULL on failure
 * (the sticky error is set). */
static char *loom__cuda_stage_slot(loom__cuda_backend *cb, int *k) {
    *k = cb->stage_next;
    cb->stage_next = (cb->stage_next + 1) % LOOM_CUDA_STAGE_SLOTS;
    loom_status s = LOOM_CUDA_CHECK(cb->name, cudaEventSynchronize(cb->stage_ev[*k]));
    if (s != LOOM_OK) {
        loom__cuda_backend_set_error(cb, s);
        return NULL;
    }
    return cb->stage + (size_t)*k * LOOM_CUDA_STAGE_SLOT;
}

static void CUDART_CB loom__cuda_stage_out(void *p) {
    const loom__cuda_stage_get *g = p;
    memcpy(g->dst, g->src, g->size);
}

static void loom__cuda_set_async(loom_backend_t backend, loom_tensor *t, const void *data,
                                 size_t offset, size_t size) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    loom__cuda_check_tensor(cb, t);
    if (!loom__cuda_use(cb) || size == 0) return;
    loom__cuda_tensor_touch(t);
    char *dst = (char *)t->data + offset;
    if (!loom__cuda_is_pageable(data) || !loom__cuda_stage_ready(cb)) {
        loom__cuda_check_async(
            cb, LOOM_CUDA_CHECK(cb->name, cudaMemcpyAsync(dst, data, size, cudaMemcpyHostToDevice,
                                                          cb->stream)));
        return;
    }
    for (size_t done = 0; done < size;) {
        const size_t n = size - done < LOOM_CUDA_STAGE_SLOT ? size - done : LOOM_CUDA_STAGE_SLOT;
        int k;
        char *slot = loom__cuda_stage_slot(cb, &k);
        if (!slot) return;
        memcpy(slot, (const char *)data + done, n);
        loom_status s = LOOM_CUDA_CHECK(
            cb->name, cudaMemcpyAsync(dst + done, slot, n, cudaMemcpyHostToDevice, cb->stream));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name, cudaEventRecord(cb->stage_ev[k], cb->stream));
        if (s != LOOM_OK) {
            loom__cuda_backend_set_error(cb, s);
            return;
        }
        cb->stats.staged_host_copies++;
        done += n;
    }
}

static void loom__cuda_get_async(loom_backend_t backend, const loom_tensor *t, void *data,
                                 size_t offset, size_t size) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    loom__cuda_check_tensor(cb, t);
    if (!loom__cuda_use(cb) || size == 0) return;
    const char *src = (const char *)t->data + offset;
    if (!loom__cuda_is_pageable(data) || !loom__cuda_stage_ready(cb)) {
        loom__cuda_check_async(
            cb, LOOM_CUDA_CHECK(cb->name, cudaMemcpyAsync(data, src, size, cudaMemcpyDeviceToHost,
                                                          cb->stream)));
        return;
    }
    for (size_t done = 0; done < size;) {
        const size_t n = size - done < LOOM_CUDA_STAGE_SLOT ? size - done : LOOM_CUDA_STAGE_SLOT;
        int k;
        char *slot = loom__cuda_stage_slot(cb, &k);
        if (!slot) return;
        cb->stage_get[k] = (loom__cuda_stage_get){(char *)data + done, slot, n};
        loom_status s = LOOM_CUDA_CHECK(
            cb->name, cudaMemcpyAsync(slot, src + done, n, cudaMemcpyDeviceToHost, cb->stream));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(
                cb->name, cudaLaunchHostFunc(cb->stream, loom__cuda_stage_out, &cb->stage_get[k]));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name, cudaEventRecord(cb->stage_ev[k], cb->stream));
        if (s != LOOM_OK) {
            loom__cuda_backend_set_error(cb, s);
            return;
        }
        cb->stats.staged_host_copies++;
        done += n;
    }
}

/* A fresh event recorded on bs's stream: everything issued there so far. The caller makes
 * the destination wait for it, then destroys it (the driver keeps it until it completes). */
static loom_status loom__cuda_mark(loom__cuda_backend *bs, cudaEvent_t *ev) {
    *ev = NULL;
    loom_status s = LOOM_CUDA_CHECK(bs->name, cudaSetDevice(bs->cd->cuda_id));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(bs->name, cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
    if (s == LOOM_OK) {
        s = LOOM_CUDA_CHECK(bs->name, cudaEventRecord(*ev, bs->stream));
        if (s != LOOM_OK) {
            (void)cudaEventDestroy(*ev);
            *ev = NULL;
        }
    }
    return s;
}

/* Staged copy of n bytes between GPUs without peer access (see the file comment); the
 * destination's staging mutex keeps concurrent staged copies into it apart. */
static bool loom__cuda_cpy_staged(loom__cuda_backend *bs, loom__cuda_backend *bd,
                                  const loom_tensor *src, loom_tensor *dst, size_t n) {
    pthread_mutex_lock(&bd->staging_mu);
    /* Grow the staging buffer once nothing reads it any more. */
    if (n > bd->staging_size) {
        loom_status s = LOOM_CUDA_CHECK(bd->name, cudaSetDevice(bd->cd->cuda_id));
        if (s == LOOM_OK) s = LOOM_CUDA_CHECK(bd->name, cudaEventSynchronize(bd->staging_free));
        if (s == LOOM_OK && bd->staging) {
            s = LOOM_CUDA_CHECK(bd->name, cudaFreeHost(bd->staging));
            bd->staging = NULL;
            bd->staging_size = 0;
        }
        void *p = NULL;
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(bd->name, cudaHostAlloc(&p, n, cudaHostAllocPortable));
        if (s != LOOM_OK) {
            pthread_mutex_unlock(&bd->staging_mu);
            LOOM_LOG_WARN("%s: no pinned staging buffer for %zu bytes (%s); copying "
                          "synchronously",
                          bd->name, n, loom_last_error());
            return false;
        }
        bd->staging = p;
        bd->staging_size = n;
    }
    /* Source stream: wait until the staging buffer is free, copy into it, mark it ready. */
    cudaEvent_t ready = NULL;
    loom_status s = LOOM_CUDA_CHECK(bs->name, cudaSetDevice(bs->cd->cuda_id));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(bs->name, cudaStreamWaitEvent(bs->stream, bd->staging_free, 0));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(bs->name, cudaMemcpyAsync(bd->staging, src->data, n,
                                                      cudaMemcpyDeviceToHost, bs->stream));
    if (s == LOOM_OK) s = loom__cuda_mark(bs, &ready);
    if (s != LOOM_OK) {
        pthread_mutex_unlock(&bd->staging_mu);
        loom__cuda_backend_set_error(bs, s);
        return true; /* the failure is reported by the source backend */
    }
    /* Destination stream: wait until it is ready, copy out, mark the buffer free. */
    s = LOOM_CUDA_CHECK(bd->name, cudaSetDevice(bd->cd->cuda_id));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(bd->name, cudaStreamWaitEvent(bd->stream, ready, 0));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(bd->name, cudaMemcpyAsync(dst->data, bd->staging, n,
                                                      cudaMemcpyHostToDevice, bd->stream));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(bd->name, cudaEventRecord(bd->staging_free, bd->stream));
    (void)LOOM_CUDA_CHECK(bs->name, cudaEventDestroy(ready));
    bd->stats.staged_copies++;
    pthread_mutex_unlock(&bd->staging_mu);
    if (s != LOOM_OK) loom__cuda_backend_set_error(bd, s);
    return true;
}

/* Device-to-device copies between CUDA backends of this library (see the file comment);
 * anything else: false (the caller synchronises both and stages through host memory). */
static bool loom__cuda_cpy_async(loom_backend_t backend_src, loom_backend_t backend_dst,
                                 const loom_tensor *src, loom_tensor *dst) {
    loom__cuda_backend *bs = loom__cuda_backend_of(backend_src);
    loom__cuda_backend *bd = loom__cuda_backend_of(backend_dst);
    if (!bs || !bd) return false;
    if (loom__cuda_buffer_dev(src->buffer) != bs->cd ||
        loom__cuda_buffer_dev(dst->buffer) != bd->cd)
        return false;
    loom__cuda_tensor_touch(dst);
    const size_t n = loom_nbytes(src);
    const int sgpu = bs->cd->cuda_id, dgpu = bd->cd->cuda_id;
    if (bs == bd) {
        if (!loom__cuda_use(bd)) return true;
        loom__cuda_check_async(
            bd, LOOM_CUDA_CHECK(bd->name, cudaMemcpyAsync(dst->data, src->data, n,
                                                          cudaMemcpyDeviceToDevice, bd->stream)));
        return true;
    }
    const bool peer = sgpu != dgpu && loom__cuda_peer_ok(dgpu, sgpu);
    if (sgpu != dgpu && !peer) return loom__cuda_cpy_staged(bs, bd, src, dst, n);
    /* Order after the source stream's work so far. */
    cudaEvent_t ev = NULL;
    loom_status s = loom__cuda_mark(bs, &ev);
    if (s != LOOM_OK) {
        loom__cuda_backend_set_error(bs, s);
        return true;
    }
    s = LOOM_CUDA_CHECK(bd->name, cudaSetDevice(dgpu));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(bd->name, cudaStreamWaitEvent(bd->stream, ev, 0));
    if (s == LOOM_OK) {
        if (peer) {
            s = LOOM_CUDA_CHECK(
                bd->name, cudaMemcpyPeerAsync(dst->data, dgpu, src->data, sgpu, n, bd->stream));
            bd->stats.peer_copies++;
        } else {
            s = LOOM_CUDA_CHECK(bd->name, cudaMemcpyAsync(dst->data, src->data, n,
                                                          cudaMemcpyDeviceToDevice, bd->stream));
        }
    }
    (void)LOOM_CUDA_CHECK(bs->name, cudaEventDestroy(ev));
    loom__cuda_check_async(bd, s);
    return true;
}

static void loom__cuda_synchronize(loom_backend_t backend) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    if (!loom__cuda_use(cb)) return;
    /* the kernels' error record comes back with the same wait */
    loom_status s =
        LOOM_CUDA_CHECK(cb->name, cudaMemcpyAsync(cb->err_host, cb->err_dev, sizeof *cb->err_host,
                                                  cudaMemcpyDeviceToHost, cb->stream));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cb->name, cudaStreamSynchronize(cb->stream));
    if (s != LOOM_OK) {
        /* an asynchronous failure: say whose work it was */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        s = loom_error(s, "%s (in the work of %s)", msg,
                       cb->last_graph[0] ? cb->last_graph : "the operations issued so far");
    }
    loom__cuda_check_async(cb, s);
    if (s == LOOM_OK) loom__cuda_harvest(cb);
}

static void loom__cuda_event_record(loom_backend_t backend, loom_event_t ev) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    loom__cuda_event *ce = loom__cuda_event_of(ev);
    LOOM_ASSERT(ce->cuda_id == cb->cd->cuda_id); /* an event is recorded on its own GPU */
    if (!loom__cuda_use(cb)) return;
    loom__cuda_check_async(cb, LOOM_CUDA_CHECK(cb->name, cudaEventRecord(ce->event, cb->stream)));
}

static void loom__cuda_event_wait(loom_backend_t backend, loom_event_t ev) {
    loom__cuda_backend *cb = loom__cuda_ctx(backend);
    loom__cuda_event *ce = loom__cuda_event_of(ev);
    if (!loom__cuda_use(cb)) return;
    loom__cuda_check_async(
        cb, LOOM_CUDA_CHECK(cb->name, cudaStreamWaitEvent(cb->stream, ce->event, 0)));
}

static const struct loom_backend_i loom__cuda_backend_i = {
    .get_name = loom__cuda_backend_name,
    .free = loom__cuda_backend_free,
    .set_tensor_async = loom__cuda_set_async,
    .get_tensor_async = loom__cuda_get_async,
    .cpy_tensor_async = loom__cuda_cpy_async,
    .synchronize = loom__cuda_synchronize,
    .graph_compute = loom__cuda_graph_compute,
    .event_record = loom__cuda_event_record,
    .event_wait = loom__cuda_event_wait,
    .get_status = loom__cuda_backend_get_status, /* called by synchronize once w9a lands */
};

void loom_cuda_backend_get_stats(loom_backend_t backend, loom_cuda_backend_stats *out) {
    LOOM_ASSERT(out != NULL);
    memset(out, 0, sizeof *out);
    loom__cuda_backend *cb = loom__cuda_backend_of(backend);
    if (cb) *out = cb->stats;
}

/* ---------------------------------------------------------------- constructor */

loom_backend_t loom__cuda_backend_new(loom__cuda_dev *cd, const char *params) {
    if (params && params[0]) {
        loom_error(LOOM_ERR_FORMAT, "%s: backend params '%s': the CUDA backend takes no options",
                   cd->name, params);
        return NULL;
    }
    loom__cuda_backend *cb = loom_calloc(1, sizeof *cb);
    if (!cb) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for a backend", cd->name);
        return NULL;
    }
    cb->backend.iface = &loom__cuda_backend_i;
    cb->backend.device = &cd->dev;
    cb->backend.context = cb;
    cb->cd = cd;
    snprintf(cb->name, sizeof cb->name, "%s", cd->name);
    const char *w = cb->name;
    if (pthread_mutex_init(&cb->staging_mu, NULL) != 0) {
        loom_free(cb);
        loom_error(LOOM_ERR_INTERNAL, "%s: cannot initialise a mutex", cd->name);
        return NULL;
    }
    cb->mu_ok = true;
    const char *g = getenv("LOOM_CUDA_GRAPHS");
    cb->graphs_enabled = !(g && strcmp(g, "0") == 0);
    /* tests shrink it to reach the panel path with small weights */
    cb->panel_bytes = loom__cuda_env_size("LOOM_CUDA_PANEL_BYTES", LOOM_CUDA_PANEL_BYTES);
    if (cb->panel_bytes < 1024) cb->panel_bytes = 1024;
    /* a GPU window compares the earlier kernels (and exact F32 GEMMs) with these */
    const char *lk = getenv("LOOM_CUDA_LEGACY_KERNELS");
    cb->legacy_kernels = lk && strcmp(lk, "1") == 0;
    /* BF16 weights kept for the tensor-core GEMM: a quarter of the GPU by default */
    cb->wcache_budget = loom__cuda_env_size("LOOM_CUDA_WCACHE_BYTES", cd->gpu_total_mem / 4);
    /* cuBLAS recommends 32 MiB of workspace on Hopper, 4 MiB before. */
    cb->cublas_ws_size = cd->cc >= 90 ? ((size_t)32 << 20) : ((size_t)4 << 20);

    loom_status s = LOOM_CUDA_CHECK(w, cudaSetDevice(cd->cuda_id));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(w, cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(w, cudaEventCreateWithFlags(&cb->staging_free, cudaEventDisableTiming));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(w, cudaEventCreateWithFlags(&cb->order_ev, cudaEventDisableTiming));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(
            w, cudaHostAlloc((void **)&cb->err_host, sizeof *cb->err_host, cudaHostAllocDefault));
    if (s == LOOM_OK) memset(cb->err_host, 0, sizeof *cb->err_host);
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(w, cudaMalloc((void **)&cb->err_dev, sizeof *cb->err_dev));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(w, cudaMemsetAsync(cb->err_dev, 0, sizeof *cb->err_dev, cb->stream));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(w, cudaMalloc(&cb->cublas_ws, cb->cublas_ws_size));
    if (s == LOOM_OK) s = LOOM_CUBLAS_CHECK(w, cublasCreate(&cb->cublas));
    if (s == LOOM_OK) s = LOOM_CUBLAS_CHECK(w, cublasSetStream(cb->cublas, cb->stream));
    if (s == LOOM_OK)
        s = LOOM_CUBLAS_CHECK(w, cublasSetWorkspace(cb->cublas, cb->cublas_ws, cb->cublas_ws_size));
    if (s == LOOM_OK) {
        cb->gcache = loom__cuda_gcache_new(loom__cuda_graph_exec_release, cb->name);
        if (!cb->gcache)
            s = loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for a graph cache", w);
    }
    if (s != LOOM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        loom__cuda_backend_destroy(cb);
        loom_error(s, "%s", msg);
        return NULL;
    }
    pthread_mutex_lock(&cd->mu);
    cd->n_backends++;
    cb->dev_next = cd->backends;
    cd->backends = cb;
    pthread_mutex_unlock(&cd->mu);
    return &cb->backend;
}
