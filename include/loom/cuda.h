/*
 * The CUDA backend (backends/cuda/, the module libloom-cuda.so): NVIDIA GPUs with compute
 * capability 8.0 or newer, one loom device per GPU (or several per GPU, for testing
 * multi-device code on one GPU), device and pinned-host buffer types, one CUDA stream per
 * backend, events, async and peer-to-peer copies, every op of docs/ops.md as kernels
 * (cuBLAS for large float products), CUDA graph capture reused while a graph is unchanged,
 * and the NCCL communicator behind the reg's LOOM_PROC_COMM_* proc addresses.
 *
 * A machine without a GPU has a "CUDA" reg with zero devices (never an error or a crash);
 * without a driver the module is not even loaded. loom_devices_from_spec("cuda") then
 * reports "no CUDA devices" and why. Where the toolkit was absent at build time the library
 * is a stub with the same API and zero devices, and no module is built.
 *
 * Environment:
 *   LOOM_CUDA_DEVICES_PER_GPU=N   loom devices per GPU in the default reg (1..8, default 1);
 *                                 each has its own streams and an even share of the memory
 *   LOOM_CUDA_GRAPHS=0            never capture CUDA graphs (default: capture a graph the
 *                                 second time it is computed unchanged, then replay it)
 *   LOOM_OP_OFFLOAD_MIN_BATCH=N   offload_op batch threshold (default 32; 0: never)
 *   LOOM_CUDA_ALLREDUCE_ONESHOT_MAX=BYTES  largest tensor the one-shot peer-to-peer
 *                                 AllReduce kernel takes (default 262144)
 *   LOOM_CUDA_ALLREDUCE_BF16=1    reduce large tensors over NCCL in BF16 (default off: it
 *                                 rounds activations, ~(N+1) * 2^-8 of the largest |value|
 *                                 over N devices); any other value but 0 is logged, stays off
 *   LOOM_CUDA_ALLREDUCE_BF16_MIN=BYTES     with BF16 on, the smallest tensor it takes
 *                                 (default 1048576)
 *   LOOM_CUDA_NCCL=PATH|0         the NCCL library to dlopen (default libnccl.so.2); 0: none
 *   LOOM_CUDA_PANEL_BYTES=BYTES   F32 weight conversion budget of one matmul (default 64 MiB)
 *   LOOM_CUDA_FAULT=capture, LOOM_CUDA_COMM_FAULT=nccl   fault injection for tests
 *   LOOM_CUDA_NO_DRIVER_CHECK=1   load libloom-cuda.so even where libcuda.so.1 (the driver)
 *                                 cannot be loaded (default: loom_registry_load_all skips the
 *                                 module then, without mapping the CUDA runtime and cuBLAS,
 *                                 and a "cuda" spec's error says so)
 */
#ifndef LOOM_CUDA_H
#define LOOM_CUDA_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The process-wide CUDA reg "CUDA" (static, never freed): devices CUDA0..CUDA{n-1}. Zero
 * devices when there is no GPU, no driver, or the backend was built without the toolkit;
 * loom_cuda_no_devices_reason says why. Returned by libloom-cuda.so's loom_backend_init. */
LOOM_API loom_reg_t loom_cuda_reg(void);
/* Why a CUDA reg has no devices ("" when it has some): the CUDA error of the device query,
 * "the CUDA backend was built without the CUDA toolkit", ... */
LOOM_API const char *loom_cuda_no_devices_reason(loom_reg_t reg);

/* A new reg with `per_gpu` loom devices (1..8) on every GPU, named "V<k>-CUDA" with
 * devices "V<k>-CUDA0".., for running multi-device code (the meta device, the reducer) on
 * one GPU: each device has its own streams; copies between devices of one GPU are plain
 * device copies; the NCCL communicator declines devices that share a GPU. Free with
 * loom_cuda_reg_free after every backend and buffer of it. LOOM_ERR_UNSUPPORTED when the
 * backend was built without CUDA; a reg with zero devices when there is no GPU. */
LOOM_API loom_status loom_cuda_reg_new_virtual(int per_gpu, loom_reg_t *out);
LOOM_API void loom_cuda_reg_free(loom_reg_t reg); /* NULL and the static reg: no-op */

LOOM_API bool loom_dev_is_cuda(loom_dev_t dev);

typedef struct loom_cuda_backend_stats {
    uint64_t graphs;             /* graph_compute calls */
    uint64_t graph_captures;     /* CUDA graphs captured and instantiated */
    uint64_t graph_launches;     /* graph_compute calls served by replaying a captured graph */
    uint64_t cublas_calls;       /* GEMMs issued to cuBLAS */
    uint64_t staged_copies;      /* device copies staged through pinned host memory */
    uint64_t peer_copies;        /* device copies between GPUs over peer-to-peer */
    uint64_t staged_host_copies; /* async set/get chunks staged through pinned memory */
    uint64_t tc_gemms;           /* of cublas_calls: BF16 inputs, FP32 accumulation */
    uint64_t wcache_fills;       /* weights converted to BF16 into the weight cache */
    uint64_t wcache_hits;        /* tensor-core matmuls that read a cached weight */
    uint64_t fa_split_launches;  /* FLASH_ATTN_EXT launches split across the KV length */
} loom_cuda_backend_stats;

/* Counters of a CUDA backend (zeros for any other backend). */
LOOM_API void loom_cuda_backend_get_stats(loom_backend_t backend, loom_cuda_backend_stats *out);

/* These functions live in the module libloom-cuda.so. A program linking libloom calls them
 * as declared here: libloom's definitions forward to the module through the registry
 * (loading the modules with loom_registry_load_all the first time none is registered), and
 * those of a device, backend or reg ask that object's reg (another backend's device: false,
 * zeroed stats). Without the module loom_cuda_reg() is NULL and the others fail, with
 * loom_last_error naming libloom-cuda.so. The module's entry points are also reg procs:
 * loom_reg_get_proc_address(reg, "loom_cuda_reg_new_virtual") etc. */

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CUDA_H */
