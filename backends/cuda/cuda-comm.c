/*
 * The CUDA communicator: what the reg exports as LOOM_PROC_COMM_INIT / _ALLREDUCE / _FREE
 * (include/loom/reduce.h), so the reducer's ladder can sum PARTIAL tensors natively.
 *
 *   init       NCCL communicators for the backends' GPUs (ncclCommInitAll), only when every
 *              backend is a CUDA backend of this library on a distinct GPU; otherwise NULL,
 *              and the reducer uses its own algorithms.
 *   allreduce  F32 tensors, queued on the backends' streams in stream order:
 *              - small tensors (<= LOOM_CUDA_ALLREDUCE_ONESHOT_MAX, default 256 KiB) when
 *                every pair of GPUs has peer access: a one-shot kernel on each device reads
 *                every peer's tensor and sums them in device order (bit-identical results
 *                everywhere), into scratch, copied back once all devices have read;
 *              - others: NCCL in F32, out of place into scratch, copied back;
 *              - only when opted in (LOOM_CUDA_ALLREDUCE_BF16=1), tensors of at least
 *                LOOM_CUDA_ALLREDUCE_BF16_MIN bytes (default 1 MiB): converted to BF16,
 *                reduced by NCCL in BF16, converted back. That rounds: each input to 8
 *                significant bits and each of NCCL's partial sums again, an error of about
 *                (N+1) * 2^-8 of the largest |value| for N devices; off by default.
 *              Anything it cannot do (bad tensors, no NCCL, an NCCL or CUDA error) returns
 *              false having changed nothing (every path writes the tensors only after its
 *              last fallible step), and logs why. Any NCCL error, returned by a call or
 *              polled afterwards (ncclCommGetAsyncError), aborts the communicators
 *              (ncclCommAbort, so no half-issued group can hang a stream), marks the
 *              communicator broken (logged once) and makes every later call decline, so
 *              the reducer's ladder takes over at run time.
 *   free       destroys the communicators (aborts them when broken, before waiting for
 *              the streams) and waits for the streams.
 *
 * NCCL itself is loaded lazily (cuda-nccl.h): without it init returns NULL, logged.
 *
 * loom__cuda_comm_init_shared builds one without NCCL whose devices may share a GPU (only
 * the one-shot path), so the one-shot kernel and the run-time decline can be tested on a
 * single GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#include <nccl.h>

#include "backends/cuda/cuda-impl.h"
#include "backends/cuda/cuda-nccl.h"

typedef struct loom__cuda_comm {
    int n;
    loom__cuda_backend *b[LOOM_CU_MAX_PEERS];
    void *nccl[LOOM_CU_MAX_PEERS]; /* ncclComm_t */
    const loom__nccl_api *api;     /* NULL: no NCCL */
    bool have_nccl;
    bool oneshot; /* every device can read every other device's memory */
    bool broken;  /* an NCCL error happened: the communicators are aborted */
    size_t oneshot_max, bf16_min;
    void *scratch[LOOM_CU_MAX_PEERS];
    size_t scratch_size[LOOM_CU_MAX_PEERS];
    cudaEvent_t ev_in[LOOM_CU_MAX_PEERS];   /* device j's input is ready */
    cudaEvent_t ev_read[LOOM_CU_MAX_PEERS]; /* device j has read every input */
} loom__cuda_comm;

#define LOOM_NCCL_CHECK(api, where, call)                                                          \
    loom__nccl_check((api), (api)->call, #call, (where), __FILE__, __LINE__)

/* LOOM_CUDA_COMM_FAULT=nccl (tests only): after each NCCL AllReduce group, the poll of
 * asynchronous errors reports one, as NCCL would after a peer or network failure (a
 * really half-issued group could block inside ncclGroupEnd on connection setup). */
static bool comm_fault_nccl(void) {
    const char *f = getenv("LOOM_CUDA_COMM_FAULT");
    return f && strcmp(f, "nccl") == 0;
}

static loom_status loom__nccl_check(const loom__nccl_api *api, int r, const char *call,
                                    const char *where, const char *file, int line) {
    if (r == ncclSuccess) return LOOM_OK;
    LOOM_LOG_DEBUG("%s:%d: %s: %s -> NCCL result %d", file, line, where, call, r);
    return loom_error(LOOM_ERR_DEVICE, "%s: nccl%s failed: %s (NCCL result %d)", where, call,
                      api->GetErrorString(r), r);
}

/* After any NCCL error: abort every communicator (pending NCCL kernels then exit, so the
 * streams drain) and decline from now on. Logged once. */
static void comm_break(loom__cuda_comm *c, const char *why) {
    if (c->broken) return;
    c->broken = true;
    LOOM_LOG_WARN("CUDA comm: NCCL failed (%s); communicator aborted, loom's own AllReduce is "
                  "used from now on",
                  why);
    for (int j = 0; j < c->n; j++) {
        if (!c->nccl[j]) continue;
        (void)LOOM_CUDA_CHECK(c->b[j]->name, cudaSetDevice(c->b[j]->cd->cuda_id));
        (void)LOOM_NCCL_CHECK(c->api, c->b[j]->name, CommAbort(c->nccl[j]));
        c->nccl[j] = NULL;
    }
}

/* An asynchronous NCCL error of an earlier call (network, peer failure), or LOOM_OK. */
static loom_status comm_poll(loom__cuda_comm *c) {
    for (int j = 0; j < c->n; j++) {
        if (!c->nccl[j]) continue;
        int ae = ncclSuccess;
        loom_status s = LOOM_NCCL_CHECK(c->api, c->b[j]->name, CommGetAsyncError(c->nccl[j], &ae));
        if (s == LOOM_OK && ae != ncclSuccess && ae != ncclInProgress)
            s = loom_error(LOOM_ERR_DEVICE, "%s: NCCL asynchronous error: %s (NCCL result %d)",
                           c->b[j]->name, c->api->GetErrorString(ae), ae);
        if (s != LOOM_OK) return s;
    }
    return LOOM_OK;
}

static void loom__cuda_comm_destroy(loom__cuda_comm *c) {
    for (int j = 0; j < c->n; j++) {
        loom__cuda_backend *cb = c->b[j];
        if (!cb) continue;
        const char *w = cb->name;
        (void)LOOM_CUDA_CHECK(w, cudaSetDevice(cb->cd->cuda_id));
        if (c->nccl[j]) {
            /* a healthy communicator has nothing in flight that could hang: destroy it */
            (void)LOOM_NCCL_CHECK(c->api, w, CommDestroy(c->nccl[j]));
            c->nccl[j] = NULL;
        }
        (void)LOOM_CUDA_CHECK(w, cudaStreamSynchronize(cb->stream));
        if (c->scratch[j]) (void)LOOM_CUDA_CHECK(w, cudaFree(c->scratch[j]));
        if (c->ev_in[j]) (void)LOOM_CUDA_CHECK(w, cudaEventDestroy(c->ev_in[j]));
        if (c->ev_read[j]) (void)LOOM_CUDA_CHECK(w, cudaEventDestroy(c->ev_read[j]));
    }
    loom_free(c);
}

/* The common part of both constructors: CUDA backends only, events, thresholds. */
static loom__cuda_comm *loom__cuda_comm_alloc(loom_backend_t *backends, size_t n) {
    if (!backends || n < 2 || n > LOOM_CU_MAX_PEERS) return NULL;
    loom__cuda_comm *c = loom_calloc(1, sizeof *c);
    if (!c) {
        LOOM_LOG_WARN("CUDA comm: out of host memory");
        return NULL;
    }
    c->n = (int)n;
    for (size_t j = 0; j < n; j++) {
        c->b[j] = loom__cuda_backend_of(backends[j]);
        if (!c->b[j]) {
            LOOM_LOG_INFO("CUDA comm: backend %zu (%s) is not a CUDA backend: no communicator", j,
                          backends[j] ? loom_backend_name(backends[j]) : "NULL");
            c->n = (int)j;
            loom__cuda_comm_destroy(c);
            return NULL;
        }
    }
    for (int j = 0; j < c->n; j++) {
        loom__cuda_backend *cb = c->b[j];
        loom_status s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name,
                                cudaEventCreateWithFlags(&c->ev_in[j], cudaEventDisableTiming));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name,
                                cudaEventCreateWithFlags(&c->ev_read[j], cudaEventDisableTiming));
        if (s != LOOM_OK) {
            LOOM_LOG_WARN("CUDA comm: %s: no communicator", loom_last_error());
            loom__cuda_comm_destroy(c);
            return NULL;
        }
    }
    c->oneshot = true;
    for (int i = 0; i < c->n && c->oneshot; i++)
        for (int j = 0; j < c->n && c->oneshot; j++)
            if (i != j && !loom__cuda_peer_ok(c->b[i]->cd->cuda_id, c->b[j]->cd->cuda_id))
                c->oneshot = false;
    loom__cuda_comm_thresholds(&c->oneshot_max, &c->bf16_min);
    return c;
}

void loom__cuda_comm_thresholds(size_t *oneshot_max, size_t *bf16_min) {
    *oneshot_max = loom__cuda_env_size("LOOM_CUDA_ALLREDUCE_ONESHOT_MAX", (size_t)256 << 10);
    *bf16_min = SIZE_MAX; /* BF16 rounds activations: opt-in only */
    const char *on = getenv("LOOM_CUDA_ALLREDUCE_BF16");
    if (on && on[0] && strcmp(on, "0") != 0) {
        if (strcmp(on, "1") == 0)
            *bf16_min = loom__cuda_env_size("LOOM_CUDA_ALLREDUCE_BF16_MIN", (size_t)1 << 20);
        else
            LOOM_LOG_WARN("CUDA: LOOM_CUDA_ALLREDUCE_BF16='%s' is not 0 or 1; BF16 AllReduce "
                          "stays off",
                          on);
    }
}

void *loom__cuda_comm_init(loom_backend_t *backends, size_t n) {
    loom__cuda_comm *c = loom__cuda_comm_alloc(backends, n);
    if (!c) return NULL;
    int gpus[LOOM_CU_MAX_PEERS];
    for (int j = 0; j < c->n; j++) {
        gpus[j] = c->b[j]->cd->cuda_id;
        for (int i = 0; i < j; i++) {
            if (gpus[i] == gpus[j]) {
                LOOM_LOG_INFO("CUDA comm: %s and %s share GPU %d; NCCL needs distinct GPUs: no "
                              "communicator (loom's own AllReduce is used)",
                              c->b[i]->name, c->b[j]->name, gpus[j]);
                loom__cuda_comm_destroy(c);
                return NULL;
            }
        }
    }
    const char *why = NULL;
    c->api = loom__cuda_nccl(&why);
    if (!c->api) {
        LOOM_LOG_INFO("CUDA comm: %s: no communicator (loom's own AllReduce is used)", why);
        loom__cuda_comm_destroy(c);
        return NULL;
    }
    if (LOOM_NCCL_CHECK(c->api, "CUDA comm", CommInitAll(c->nccl, c->n, gpus)) != LOOM_OK) {
        LOOM_LOG_WARN("%s: no communicator (loom's own AllReduce is used)", loom_last_error());
        memset(c->nccl, 0, sizeof c->nccl);
        loom__cuda_comm_destroy(c);
        return NULL;
    }
    c->have_nccl = true;
    LOOM_LOG_INFO("CUDA comm: NCCL over %d GPUs, one-shot peer kernel %s", c->n,
                  c->oneshot ? "on" : "off (no peer access)");
    return c;
}

void *loom__cuda_comm_init_shared(loom_backend_t *backends, size_t n) {
    loom__cuda_comm *c = loom__cuda_comm_alloc(backends, n);
    if (c && !c->oneshot) {
        LOOM_LOG_INFO("CUDA comm: devices without peer access: no shared communicator");
        loom__cuda_comm_destroy(c);
        return NULL;
    }
    return c;
}

void loom__cuda_comm_free(void *comm) {
    if (comm) loom__cuda_comm_destroy(comm);
}

/* ---------------------------------------------------------------- allreduce */

/* Scratch of `bytes` on device j; growing waits for the stream (the old one may be in use). */
static loom_status comm_scratch(loom__cuda_comm *c, int j, size_t bytes) {
    if (bytes <= c->scratch_size[j]) return LOOM_OK;
    loom__cuda_backend *cb = c->b[j];
    loom_status s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cb->name, cudaStreamSynchronize(cb->stream));
    if (s == LOOM_OK && c->scratch[j]) s = LOOM_CUDA_CHECK(cb->name, cudaFree(c->scratch[j]));
    if (s != LOOM_OK) return s;
    c->scratch[j] = NULL;
    c->scratch_size[j] = 0;
    s = LOOM_CUDA_CHECK(cb->name, cudaMalloc(&c->scratch[j], bytes));
    if (s == LOOM_OK) c->scratch_size[j] = bytes;
    return s;
}

/* Past the last fallible step a failure cannot be undone: it becomes the backend's sticky
 * error, so the next graph_compute reports it. */
static void comm_late_failure(loom__cuda_backend *cb, loom_status s) {
    loom__cuda_backend_set_error(cb, s);
}

static loom_status comm_oneshot(loom__cuda_comm *c, loom_tensor *const *t, int64_t n) {
    const int N = c->n;
    loom_status s = LOOM_OK;
    for (int j = 0; j < N && s == LOOM_OK; j++)
        s = comm_scratch(c, j, (size_t)n * sizeof(float));
    /* every input is ready */
    for (int j = 0; j < N && s == LOOM_OK; j++) {
        loom__cuda_backend *cb = c->b[j];
        s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cb->name, cudaEventRecord(c->ev_in[j], cb->stream));
    }
    loom_cu_ptrs src;
    memset(&src, 0, sizeof src);
    for (int k = 0; k < N; k++)
        src.p[k] = t[k]->data;
    /* each device sums every input into its scratch, then says it has read them */
    for (int j = 0; j < N && s == LOOM_OK; j++) {
        loom__cuda_backend *cb = c->b[j];
        s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        for (int k = 0; k < N && s == LOOM_OK; k++)
            if (k != j)
                s = LOOM_CUDA_CHECK(cb->name, cudaStreamWaitEvent(cb->stream, c->ev_in[k], 0));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name, loom__cu_sum_peers(c->scratch[j], src, N, n, cb->stream));
        if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cb->name, cudaEventRecord(c->ev_read[j], cb->stream));
    }
    if (s != LOOM_OK) return s; /* the tensors are untouched */
    /* once every device has read every input, each copies its sum back */
    for (int j = 0; j < N; j++) {
        loom__cuda_backend *cb = c->b[j];
        s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        for (int k = 0; k < N && s == LOOM_OK; k++)
            if (k != j)
                s = LOOM_CUDA_CHECK(cb->name, cudaStreamWaitEvent(cb->stream, c->ev_read[k], 0));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name, cudaMemcpyAsync(t[j]->data, c->scratch[j],
                                                          (size_t)n * sizeof(float),
                                                          cudaMemcpyDeviceToDevice, cb->stream));
        if (s != LOOM_OK) comm_late_failure(cb, s);
    }
    return LOOM_OK;
}

static loom_status comm_nccl(loom__cuda_comm *c, loom_tensor *const *t, int64_t n, bool bf16) {
    const int N = c->n;
    const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    loom_status s = LOOM_OK;
    for (int j = 0; j < N && s == LOOM_OK; j++)
        s = comm_scratch(c, j, (size_t)n * es);
    for (int j = 0; j < N && s == LOOM_OK && bf16; j++) {
        loom__cuda_backend *cb = c->b[j];
        s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        if (s == LOOM_OK)
            s = LOOM_CUDA_CHECK(cb->name,
                                loom__cu_f32_to_bf16(t[j]->data, c->scratch[j], n, cb->stream));
    }
    if (s != LOOM_OK) return s;
    const loom__nccl_api *api = c->api;
    s = LOOM_NCCL_CHECK(api, "CUDA comm", GroupStart());
    if (s != LOOM_OK) return s;
    loom_status first = LOOM_OK;
    for (int j = 0; j < N; j++) {
        loom__cuda_backend *cb = c->b[j];
        const void *send = bf16 ? c->scratch[j] : t[j]->data;
        s = LOOM_NCCL_CHECK(api, cb->name,
                            AllReduce(send, c->scratch[j], (size_t)n,
                                      bf16 ? ncclBfloat16 : ncclFloat, ncclSum, c->nccl[j],
                                      cb->stream));
        if (s != LOOM_OK && first == LOOM_OK) first = s;
    }
    char msg[512] = "";
    if (first != LOOM_OK) snprintf(msg, sizeof msg, "%s", loom_last_error());
    s = LOOM_NCCL_CHECK(api, "CUDA comm", GroupEnd());
    if (first != LOOM_OK) return loom_error(first, "%s", msg);
    if (s == LOOM_OK) s = comm_poll(c);
    if (s == LOOM_OK && comm_fault_nccl())
        s = loom__nccl_check(api, ncclInternalError, "CommGetAsyncError (injected fault)",
                             "CUDA comm", __FILE__, __LINE__);
    if (s != LOOM_OK) return s; /* the tensors are untouched: only scratch was written */
    for (int j = 0; j < N; j++) {
        loom__cuda_backend *cb = c->b[j];
        s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
        if (s == LOOM_OK)
            s = bf16 ? LOOM_CUDA_CHECK(
                           cb->name, loom__cu_bf16_to_f32(c->scratch[j], t[j]->data, n, cb->stream))
                     : LOOM_CUDA_CHECK(cb->name,
                                       cudaMemcpyAsync(t[j]->data, c->scratch[j],
                                                       (size_t)n * sizeof(float),
                                                       cudaMemcpyDeviceToDevice, cb->stream));
        if (s != LOOM_OK) comm_late_failure(cb, s);
    }
    return LOOM_OK;
}

/* Why the tensors cannot be reduced here, or NULL. */
static const char *comm_check(const loom__cuda_comm *c, loom_tensor *const *t, size_t n) {
    if (!t || n != (size_t)c->n) return "wrong device count";
    for (int j = 0; j < c->n; j++) {
        if (!t[j] || t[j]->type != LOOM_TYPE_F32 || !loom_is_contiguous(t[j]))
            return "not contiguous F32";
        if (loom__cuda_buffer_dev(t[j]->buffer) != c->b[j]->cd) return "not in the device's memory";
        if (loom_nelements(t[j]) != loom_nelements(t[0])) return "element counts differ";
        if (((uintptr_t)t[j]->data) % sizeof(float)) return "misaligned";
    }
    return NULL;
}

bool loom__cuda_comm_allreduce(void *comm, loom_tensor *const *tensors, size_t n) {
    loom__cuda_comm *c = comm;
    if (!c) return false;
    if (!c->broken && c->have_nccl) {
        loom_status ps = comm_poll(c);
        if (ps != LOOM_OK) comm_break(c, loom_last_error());
    }
    if (c->broken) {
        LOOM_LOG_DEBUG("CUDA comm: broken by an earlier NCCL error; declining");
        return false;
    }
    for (size_t i = 0; i < n; i++) /* the tensors are written (weight cache versions) */
        loom__cuda_tensor_touch(tensors[i]);
    const char *why = comm_check(c, tensors, n);
    if (why) {
        LOOM_LOG_DEBUG("CUDA comm: declining: %s", why);
        return false;
    }
    const int64_t ne = loom_nelements(tensors[0]);
    const size_t bytes = (size_t)ne * sizeof(float);
    if (ne == 0) return true;
    loom_status s;
    const char *path;
    if (c->oneshot && bytes <= c->oneshot_max) {
        path = "one-shot";
        s = comm_oneshot(c, tensors, ne);
    } else if (c->have_nccl) {
        const bool bf16 = bytes >= c->bf16_min;
        path = bf16 ? "NCCL bf16" : "NCCL f32";
        s = comm_nccl(c, tensors, ne, bf16);
        if (s != LOOM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            comm_break(c, why);
            loom_error(s, "%s", why);
        }
    } else {
        LOOM_LOG_DEBUG("CUDA comm: no NCCL for %zu bytes (one-shot limit %zu); declining", bytes,
                       c->oneshot_max);
        return false;
    }
    if (s != LOOM_OK) {
        if (c->broken) /* comm_break logged it (once) */
            LOOM_LOG_DEBUG("CUDA comm: %s AllReduce of %zu bytes failed: %s; declining", path,
                           bytes, loom_last_error());
        else
            LOOM_LOG_WARN("CUDA comm: %s AllReduce of %zu bytes failed: %s; declining (loom's "
                          "own AllReduce takes over)",
                          path, bytes, loom_last_error());
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- between ranks */

/* The communicator between processes (LOOM_PROC_RANK_COMM, include/loom/backend-impl.h):
 * one CUDA device per rank, NCCL's ncclCommInitRank with the id dist/ broadcast over MPI.
 * Every call is synchronous: its own stream first waits for every live backend of the
 * device (loom__cuda_dev_order, as a synchronous buffer call does), the NCCL call is
 * queued on it, and the stream is waited for, so the data has moved when the call returns
 * and later work of any backend is ordered after it. An NCCL error (returned, or polled
 * with ncclCommGetAsyncError) aborts the communicator (ncclCommAbort) and fails every later
 * call: dist/ reports it from the next compute and the run ends. */
_Static_assert(sizeof(ncclUniqueId) == sizeof(loom__nccl_id), "ncclUniqueId layout");

typedef struct loom__cuda_rc {
    const loom__nccl_api *api;
    loom__cuda_dev *cd;
    void *nccl; /* ncclComm_t; NULL once aborted */
    cudaStream_t stream;
    int nranks, rank;
    char broken[256]; /* why, once an NCCL error aborted it */
} loom__cuda_rc;

static void rc_put(char *err, size_t cap, const char *msg) {
    if (err && cap) snprintf(err, cap, "%s", msg);
}

static bool rc_usable(loom_dev_t local, char *why, size_t cap) {
    loom__cuda_dev *cd = loom__cuda_dev_of(local);
    char msg[512];
    const char *w = NULL;
    if (!cd) {
        snprintf(msg, sizeof msg, "%s is not a CUDA device", local ? loom_dev_name(local) : "?");
    } else if (cd->n_shared > 1) {
        snprintf(msg, sizeof msg,
                 "%s shares GPU %d with other loom devices (virtual devices); NCCL between "
                 "ranks needs a GPU of its own per rank",
                 cd->name, cd->cuda_id);
    } else if (!loom__cuda_nccl(&w)) {
        snprintf(msg, sizeof msg, "%s", w && w[0] ? w : "NCCL is unavailable");
    } else {
        return true;
    }
    rc_put(why, cap, msg);
    return false;
}

static loom_status rc_nccl_fail(const loom__nccl_api *api, int r, const char *call,
                                const char *where, char *err, size_t cap) {
    loom_status s = loom__nccl_check(api, r, call, where, __FILE__, __LINE__);
    rc_put(err, cap, loom_last_error());
    return s;
}

static loom_status rc_get_id(void *id, char *err, size_t cap) {
    const char *w = NULL;
    const loom__nccl_api *api = loom__cuda_nccl(&w);
    if (!api) {
        rc_put(err, cap, w);
        return LOOM_ERR_UNSUPPORTED;
    }
    loom__nccl_id uid;
    memset(&uid, 0, sizeof uid);
    int r = api->GetUniqueId(&uid);
    if (r != ncclSuccess) return rc_nccl_fail(api, r, "GetUniqueId", "CUDA", err, cap);
    memcpy(id, &uid, sizeof uid);
    return LOOM_OK;
}

static void rc_free(void *comm) {
    loom__cuda_rc *c = comm;
    if (!c) return;
    (void)LOOM_CUDA_CHECK(c->cd->name, cudaSetDevice(c->cd->cuda_id));
    if (c->nccl) (void)LOOM_NCCL_CHECK(c->api, c->cd->name, CommDestroy(c->nccl));
    if (c->stream) (void)LOOM_CUDA_CHECK(c->cd->name, cudaStreamDestroy(c->stream));
    loom_free(c);
}

static loom_status rc_init(loom_dev_t local, int nranks, int rank, const void *id, void **out,
                           char *err, size_t cap) {
    *out = NULL;
    if (!rc_usable(local, err, cap)) return LOOM_ERR_UNSUPPORTED;
    loom__cuda_rc *c = loom_calloc(1, sizeof *c);
    if (!c) {
        rc_put(err, cap, "CUDA: out of host memory");
        return LOOM_ERR_NOMEM;
    }
    c->api = loom__cuda_nccl(NULL);
    c->cd = loom__cuda_dev_of(local);
    c->nranks = nranks;
    c->rank = rank;
    loom_status s = LOOM_CUDA_CHECK(c->cd->name, cudaSetDevice(c->cd->cuda_id));
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(c->cd->name,
                            cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (s != LOOM_OK) {
        rc_put(err, cap, loom_last_error());
        rc_free(c);
        return s;
    }
    loom__nccl_id uid;
    memcpy(&uid, id, sizeof uid);
    int r = c->api->CommInitRank(&c->nccl, nranks, uid, rank);
    if (r != ncclSuccess) {
        c->nccl = NULL;
        s = rc_nccl_fail(c->api, r, "CommInitRank", c->cd->name, err, cap);
        char msg[640];
        snprintf(msg, sizeof msg, "%s (rank %d of %d on GPU %d)", err, rank, nranks,
                 c->cd->cuda_id);
        rc_put(err, cap, msg);
        rc_free(c);
        return s;
    }
    LOOM_LOG_INFO("CUDA: NCCL rank %d of %d on %s (GPU %d)", rank, nranks, c->cd->name,
                  c->cd->cuda_id);
    *out = c;
    return LOOM_OK;
}

enum { RC_ALLREDUCE, RC_SEND, RC_RECV };

/* Seconds a call between ranks may wait before its peers are taken for dead:
 * LOOM_DIST_NCCL_TIMEOUT (default 300; 0 = wait for ever). NCCL reports a peer that exits
 * only when its transport notices; a peer that hangs or was killed mid-collective may
 * leave the stream waiting for ever. */
static double rc_timeout_s(void) {
    const char *v = getenv("LOOM_DIST_NCCL_TIMEOUT");
    char *end = NULL;
    double t = v && v[0] ? strtod(v, &end) : 300.0;
    if (v && v[0] && (end == v || *end || t < 0)) {
        LOOM_LOG_WARN("CUDA: LOOM_DIST_NCCL_TIMEOUT='%s' is not a number of seconds; 300", v);
        t = 300.0;
    }
    return t;
}

static loom_status rc_call(loom__cuda_rc *c, int kind, void *data, size_t count, int peer,
                           char *err, size_t cap) {
    if (c->broken[0]) {
        rc_put(err, cap, c->broken);
        return LOOM_ERR_DEVICE;
    }
    const char *w = c->cd->name;
    loom_status s = LOOM_CUDA_CHECK(w, cudaSetDevice(c->cd->cuda_id));
    if (s == LOOM_OK) s = loom__cuda_dev_order(c->cd, c->stream); /* after earlier work */
    if (s != LOOM_OK) {
        rc_put(err, cap, loom_last_error());
        return s;
    }
    const loom__nccl_api *api = c->api;
    bool nccl_failed = true;
    if (kind == RC_ALLREDUCE)
        s = LOOM_NCCL_CHECK(api, w,
                            AllReduce(data, data, count, ncclFloat, ncclSum, c->nccl, c->stream));
    else if (kind == RC_SEND)
        s = LOOM_NCCL_CHECK(api, w, Send(data, count, ncclInt8, peer, c->nccl, c->stream));
    else
        s = LOOM_NCCL_CHECK(api, w, Recv(data, count, ncclInt8, peer, c->nccl, c->stream));
    /* wait polling NCCL's asynchronous error, as NCCL advises: a peer or network failure
     * would otherwise leave the stream waiting for ever; past the timeout the peers are
     * taken for dead and the communicator is aborted */
    const double timeout = rc_timeout_s();
    const int64_t t0 = loom_time_ns();
    while (s == LOOM_OK) {
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess) {
            nccl_failed = false;
            break;
        }
        if (q != cudaErrorNotReady) {
            nccl_failed = false;
            s = LOOM_CUDA_CHECK(w, q);
            break;
        }
        int ae = ncclSuccess;
        s = LOOM_NCCL_CHECK(api, w, CommGetAsyncError(c->nccl, &ae));
        if (s == LOOM_OK && ae != ncclSuccess && ae != ncclInProgress)
            s = loom_error(LOOM_ERR_DEVICE, "%s: NCCL asynchronous error: %s (NCCL result %d)", w,
                           api->GetErrorString(ae), ae);
        if (s == LOOM_OK && timeout > 0 && (double)(loom_time_ns() - t0) * 1e-9 > timeout) {
            static const char *const what[] = {"AllReduce", "Send to rank", "Recv from rank"};
            char peer_s[16] = "";
            if (kind != RC_ALLREDUCE) snprintf(peer_s, sizeof peer_s, " %d", peer);
            s = loom_error(LOOM_ERR_DEVICE,
                           "%s: rank %d of %d: NCCL %s%s (%zu %s) did not finish within %.0f s: "
                           "a peer rank died or stopped (LOOM_DIST_NCCL_TIMEOUT)",
                           w, c->rank, c->nranks, what[kind], peer_s, count,
                           kind == RC_ALLREDUCE ? "floats" : "bytes", timeout);
        }
        if (s == LOOM_OK) sched_yield();
    }
    if (s == LOOM_OK) return LOOM_OK;
    snprintf(c->broken, sizeof c->broken, "%s", loom_last_error());
    rc_put(err, cap, c->broken);
    if (nccl_failed && c->nccl) { /* nothing may wait on it any more */
        (void)LOOM_NCCL_CHECK(api, w, CommAbort(c->nccl));
        c->nccl = NULL;
    }
    return s;
}

static loom_status rc_allreduce(void *comm, void *data, size_t count, char *err, size_t cap) {
    return rc_call(comm, RC_ALLREDUCE, data, count, -1, err, cap);
}
static loom_status rc_send(void *comm, const void *data, size_t bytes, int peer, char *err,
                           size_t cap) {
    return rc_call(comm, RC_SEND, (void *)data, bytes, peer, err, cap);
}
static loom_status rc_recv(void *comm, void *data, size_t bytes, int peer, char *err, size_t cap) {
    return rc_call(comm, RC_RECV, data, bytes, peer, err, cap);
}

static pthread_once_t loom__rc_once = PTHREAD_ONCE_INIT;
static loom_rank_comm_iface loom__rc_iface;

static void loom__rc_setup(void) {
    const loom__nccl_api *api = loom__cuda_nccl(NULL);
    if (api)
        snprintf(loom__rc_iface.name, sizeof loom__rc_iface.name, "NCCL %d.%d.%d",
                 api->version / 10000, api->version / 100 % 100, api->version % 100);
    else
        snprintf(loom__rc_iface.name, sizeof loom__rc_iface.name, "NCCL");
    loom__rc_iface.id_size = sizeof(ncclUniqueId);
    loom__rc_iface.usable = rc_usable;
    loom__rc_iface.get_id = rc_get_id;
    loom__rc_iface.init = rc_init;
    loom__rc_iface.allreduce_f32 = rc_allreduce;
    loom__rc_iface.send = rc_send;
    loom__rc_iface.recv = rc_recv;
    loom__rc_iface.free = rc_free;
}

const loom_rank_comm_iface *loom__cuda_rank_comm(void) {
    pthread_once(&loom__rc_once, loom__rc_setup);
    return &loom__rc_iface;
}
