/*
 * CUDA backend internals shared by the host files of backends/cuda/ (reg and devices,
 * buffers, backends and events, graph compute, the communicator). Not a public header.
 *
 * Object layout: a loom__cuda_reg holds the reg, its pinned-host buffer type and all its
 * devices inline (the default reg lives in static storage); each device holds its device
 * buffer type inline. A loom device maps to one GPU (cuda_id); several loom devices may
 * share a GPU (virtual devices, for tests on one GPU).
 *
 * Errors: every CUDA runtime / cuBLAS / NCCL call goes through a check (LOOM_CUDA_CHECK,
 * LOOM_CUBLAS_CHECK, and NCCL's in cuda-comm.c) that records a loom_status naming the
 * call, the error and the device, and leaves a debug trace line with the source location.
 * Hooks without a status (async copies, synchronize) keep the first failure as the
 * backend's sticky error, which the next graph_compute returns.
 */
#ifndef LOOM_CUDA_IMPL_H
#define LOOM_CUDA_IMPL_H

#include <pthread.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backends/backend-impl.h"
#include "backends/cuda/graph-cache.h"
#include "backends/cuda/kernels.h"
#include "loom/cuda.h"

#define LOOM_CUDA_MAX_DEVICES 64 /* loom devices per reg */
#define LOOM_CUDA_MAX_GPUS 16
#define LOOM_CUDA_MAX_PER_GPU 8
#define LOOM_CUDA_ALIGNMENT 256                  /* device buffer base and tensor offsets */
#define LOOM_CUDA_HOST_ALIGNMENT 64              /* pinned host buffers */
#define LOOM_CUDA_MIN_CC 80                      /* the kernels are built for sm_80 and sm_90 */
#define LOOM_CUDA_PANEL_BYTES ((size_t)64 << 20) /* default F32 weight conversion budget */

typedef struct loom__cuda_reg loom__cuda_reg;

typedef struct loom__cuda_dev {
    struct loom_dev dev;   /* dev.context = this */
    struct loom_buft buft; /* device memory "CUDAk"; buft.context = this */
    loom__cuda_reg *creg;
    int index;    /* loom device index in the reg */
    int cuda_id;  /* the GPU */
    int n_shared; /* loom devices of this reg on that GPU (1: the GPU is its own) */
    int cc;       /* compute capability, 10 * major + minor */
    size_t gpu_total_mem;
    char pci_bus_id[32]; /* "0000:65:00.0" (cudaDeviceGetPCIBusId), "" if unknown */
    char name[32];       /* "CUDA0", "V1-CUDA0" */
    char desc[512];
    pthread_mutex_t mu;                  /* guards the counters and the list below */
    int n_buffers;                       /* live device buffers */
    int n_backends;                      /* live backends */
    struct loom__cuda_backend *backends; /* live backends (their dev_next), for ordering */
} loom__cuda_dev;

struct loom__cuda_reg {
    struct loom_reg reg;        /* reg.context = this */
    struct loom_buft host_buft; /* pinned host memory; device = the first device */
    char name[16];              /* "CUDA", "V1-CUDA", ... */
    char host_name[24];         /* "CUDA_Host", "V1-CUDA_Host" */
    char prefix[8];             /* "", "V1-", ... */
    int slot;
    bool is_static;
    int per_gpu;
    int n_devices;
    char no_devices_reason[256];
    loom__cuda_dev devs[LOOM_CUDA_MAX_DEVICES];
};

#define LOOM_CUDA_STAGE_SLOTS 4                /* pinned staging of pageable async set/get */
#define LOOM_CUDA_STAGE_SLOT ((size_t)4 << 20) /* bytes per slot */

typedef struct loom__cuda_backend loom__cuda_backend;

/* A weight converted once to BF16 for the tensor-core GEMM (cuda-graph.c): the tensor as
 * MUL_MAT saw it (address, type, shape, strides), the version of its buffer then
 * (loom__cuda_buffer_version; converted again in place when it moved), and the BF16
 * values, [K, M] per batch, batches i2 + A2 i3 one after another. */
typedef struct loom__cuda_wentry {
    const void *data;
    int32_t type; /* loom_type */
    int64_t ne[4];
    size_t nb[4];
    uint64_t version;
    uint16_t *bf16; /* device memory, bytes below */
    size_t bytes;
} loom__cuda_wentry;

/* One chunk of an async get from pageable memory: copied out of the slot by a host
 * function on the stream once the device-to-host copy into it is done. */
typedef struct loom__cuda_stage_get {
    void *dst;
    const void *src;
    size_t size;
} loom__cuda_stage_get;

struct loom__cuda_backend {
    struct loom_backend backend; /* backend.context = this */
    loom__cuda_dev *cd;
    loom__cuda_backend *dev_next; /* the device's list of live backends */
    cudaEvent_t order_ev;         /* recorded by synchronous buffer calls to wait for us */
    char name[48];
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws; /* cuBLAS workspace (fixed, so captured GEMMs never allocate) */
    size_t cublas_ws_size;
    size_t panel_bytes; /* F32 weight conversion budget of one matmul (LOOM_CUDA_PANEL_BYTES) */
    void *scratch;      /* node temporaries: matmul panels, MUL_MAT_ID buckets, long sorts */
    size_t scratch_size;
    loom_cu_err *err_dev;       /* device memory written by the index-checking kernels */
    loom_cu_err *err_host;      /* pinned copy, read back by synchronize */
    pthread_mutex_t staging_mu; /* guards the staging buffer and its event */
    bool mu_ok;                 /* staging_mu initialised */
    void *staging;              /* pinned host staging of copies between GPUs without P2P */
    size_t staging_size;
    cudaEvent_t staging_free; /* recorded on this stream after the last read of staging */
    loom_status async_status; /* first failure of an asynchronous operation, until reported */
    char async_msg[640];
    bool async_reported;  /* get_status returned it: the next graph_compute starts clean */
    uint64_t graph_seq;   /* graph_compute calls that queued work */
    char last_graph[160]; /* "graph #N (M nodes, 'first' .. 'last')": what synchronize waited for */
    /* pinned staging ring for async set/get from pageable memory (lazily allocated) */
    char *stage;
    cudaEvent_t stage_ev[LOOM_CUDA_STAGE_SLOTS]; /* slot k is free once stage_ev[k] completes */
    loom__cuda_stage_get stage_get[LOOM_CUDA_STAGE_SLOTS];
    int stage_next;
    bool stage_failed; /* could not allocate: copy directly (effectively synchronous) */
    bool graphs_enabled;
    bool legacy_kernels; /* LOOM_CUDA_LEGACY_KERNELS=1: the earlier kernels, F32 SGEMM only */
    /* BF16 weights for the tensor-core GEMM, converted once (wcache_budget bytes at most,
     * LOOM_CUDA_WCACHE_BYTES); wcache_graph_ok: the graph being run writes no weights
     * buffer, so its matmuls may read the cache (set by the prepare pass of each compute) */
    loom__cuda_wentry *wcache;
    int wcache_n, wcache_cap;
    size_t wcache_bytes, wcache_budget;
    bool wcache_graph_ok;
    bool capturing; /* its stream is being captured; set and read under cd->mu */
    loom__cuda_gcache *gcache;
    loom_cuda_backend_stats stats;
};

/* ---------------------------------------------------------------- checks (cuda-reg.c) */

/* LOOM_OK for cudaSuccess; otherwise clears the (non-sticky) error, records "<where>:
 * <call> failed: <message> (<name>)" with LOOM_ERR_DEVICE_OOM for an out-of-memory error
 * and LOOM_ERR_DEVICE otherwise, logs a debug trace with file:line, and returns it. */
loom_status loom__cuda_check(cudaError_t err, const char *call, const char *where, const char *file,
                             int line);
loom_status loom__cublas_check(cublasStatus_t st, const char *call, const char *where,
                               const char *file, int line);
#define LOOM_CUDA_CHECK(where, call) loom__cuda_check((call), #call, (where), __FILE__, __LINE__)
#define LOOM_CUBLAS_CHECK(where, call)                                                             \
    loom__cublas_check((call), #call, (where), __FILE__, __LINE__)

/* "3.00 GiB", "1.20 MiB", "512 B". */
void loom__cuda_format_size(size_t bytes, char *buf, size_t size);
/* A non-negative integer from the environment, or def when unset; a bad value is logged
 * and def used. */
size_t loom__cuda_env_size(const char *name, size_t def);

/* ---------------------------------------------------------------- cuda-reg.c */

/* The CUDA device behind dev, or NULL if dev is not a device of this library. */
loom__cuda_dev *loom__cuda_dev_of(loom_dev_t dev);
bool loom__cuda_dev_supports_op(const loom__cuda_dev *cd, const loom_tensor *op);
/* Whether GPU `from` can read GPU `to`'s memory directly; enables peer access (once, for
 * the process) the first time it is asked. Same GPU: true. */
bool loom__cuda_peer_ok(int from, int to);

/* ---------------------------------------------------------------- cuda-buffer.c */

extern const struct loom_buft_i loom__cuda_buft_i;
extern const struct loom_buft_i loom__cuda_host_buft_i;
/* The CUDA device owning buf's device memory, or NULL (host memory or another backend). */
loom__cuda_dev *loom__cuda_buffer_dev(loom_buffer_t buf);
/* A device buffer's version: a process-wide unique number, new at its allocation and at
 * every write through the buffer's or a backend's hooks (memset, set, copies in, clear,
 * async set and copy, allreduce; loom__cuda_buffer_touch), 0 for any other buffer. The
 * BF16 weight cache converts a weight again when its buffer's version moved. */
uint64_t loom__cuda_buffer_version(loom_buffer_t buf);
/* Gives buf (a device buffer; anything else: nothing) a new version. */
void loom__cuda_buffer_touch(loom_buffer_t buf);
/* Touches the buffer holding t (its view source's for a view). */
void loom__cuda_tensor_touch(const loom_tensor *t);

/* ---------------------------------------------------------------- cuda-backend.c */

loom_backend_t loom__cuda_backend_new(loom__cuda_dev *cd, const char *params);
/* The CUDA backend behind b, or NULL if b is not a backend of this library. */
loom__cuda_backend *loom__cuda_backend_of(loom_backend_t b);
/* Keeps the first asynchronous failure (the current loom_last_error) for the next
 * graph_compute, and logs it. */
void loom__cuda_backend_set_error(loom__cuda_backend *cb, loom_status s);
loom_event_t loom__cuda_event_new(loom_dev_t dev);
void loom__cuda_event_free(loom_dev_t dev, loom_event_t ev);
void loom__cuda_event_synchronize(loom_dev_t dev, loom_event_t ev);
/* Makes `stream` (a synchronous buffer call's) wait for all work issued so far on every
 * live backend of cd, so a synchronous set/get is ordered after async computes. */
loom_status loom__cuda_dev_order(loom__cuda_dev *cd, cudaStream_t stream);
/* The backend's asynchronous failure (see w9a's get_status hook): LOOM_OK when none;
 * otherwise records its message and marks it reported, so the next graph_compute starts
 * clean. Idempotent until then. */
loom_status loom__cuda_backend_get_status(loom_backend_t backend);

/* ---------------------------------------------------------------- cuda-graph.c */

loom_status loom__cuda_graph_compute(loom_backend_t backend, loom_graph *g);
/* The graph cache's release callback (ud: the backend's name). */
void loom__cuda_graph_exec_release(void *exec, void *ud);

/* ---------------------------------------------------------------- cuda-comm.c */

void *loom__cuda_comm_init(loom_backend_t *backends, size_t n);
/* A communicator for tests on one GPU: devices may share a GPU, no NCCL (only the one-shot
 * peer-to-peer kernel; larger tensors are declined). */
void *loom__cuda_comm_init_shared(loom_backend_t *backends, size_t n);
bool loom__cuda_comm_allreduce(void *comm, loom_tensor *const *tensors, size_t n);
void loom__cuda_comm_free(void *comm);

#endif /* LOOM_CUDA_IMPL_H */
