/*
 * CUDA regs and devices: GPU enumeration (zero devices, never an error, without a GPU or
 * a driver), what each device answers without execution state (name, memory, caps,
 * supports_op/buft, offload_op), peer-access discovery between GPUs, the default reg and
 * the virtual regs (several loom devices per GPU), the proc-address table through which
 * the module exports the communicator and its extras, and the error checks every CUDA and
 * cuBLAS call goes through.
 */
#define _POSIX_C_SOURCE 200809L /* pthread, strtok_r */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-impl.h"
#include "backends/cuda/cuda-nccl.h"

/* ---------------------------------------------------------------- checks */

loom_status loom__cuda_check(cudaError_t err, const char *call, const char *where, const char *file,
                             int line) {
    if (err == cudaSuccess) return LOOM_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    loom_status s = err == cudaErrorMemoryAllocation ? LOOM_ERR_DEVICE_OOM : LOOM_ERR_DEVICE;
    LOOM_LOG_DEBUG("%s:%d: %s: %s -> %s (%d)", file, line, where, call, cudaGetErrorName(err),
                   (int)err);
    return loom_error(s, "%s: %s failed: %s (%s)", where, call, cudaGetErrorString(err),
                      cudaGetErrorName(err));
}

loom_status loom__cublas_check(cublasStatus_t st, const char *call, const char *where,
                               const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return LOOM_OK;
    loom_status s = st == CUBLAS_STATUS_ALLOC_FAILED ? LOOM_ERR_DEVICE_OOM : LOOM_ERR_DEVICE;
    LOOM_LOG_DEBUG("%s:%d: %s: %s -> cuBLAS status %d", file, line, where, call, (int)st);
    return loom_error(s, "%s: %s failed: %s (cuBLAS status %d)", where, call,
                      cublasGetStatusString(st), (int)st);
}

void loom__cuda_format_size(size_t bytes, char *buf, size_t size) {
    const double b = (double)bytes;
    if (bytes >= ((size_t)1 << 30))
        snprintf(buf, size, "%.2f GiB", b / (double)(1u << 30));
    else if (bytes >= ((size_t)1 << 20))
        snprintf(buf, size, "%.2f MiB", b / (double)(1u << 20));
    else if (bytes >= 1024)
        snprintf(buf, size, "%.2f KiB", b / 1024.0);
    else
        snprintf(buf, size, "%zu B", bytes);
}

size_t loom__cuda_env_size(const char *name, size_t def) {
    const char *v = getenv(name);
    if (!v || !v[0]) return def;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') {
        LOOM_LOG_WARN("CUDA: %s='%s' is not a non-negative integer; using %zu", name, v, def);
        return def;
    }
    return (size_t)x;
}

/* ---------------------------------------------------------------- peer access */

static pthread_mutex_t loom__cuda_peer_mu = PTHREAD_MUTEX_INITIALIZER;
static signed char loom__cuda_peer_state[LOOM_CUDA_MAX_GPUS][LOOM_CUDA_MAX_GPUS];

bool loom__cuda_peer_ok(int from, int to) {
    if (from == to) return true;
    if (from < 0 || to < 0 || from >= LOOM_CUDA_MAX_GPUS || to >= LOOM_CUDA_MAX_GPUS) return false;
    pthread_mutex_lock(&loom__cuda_peer_mu);
    signed char st = loom__cuda_peer_state[from][to];
    if (st == 0) {
        int can = 0;
        char where[32];
        snprintf(where, sizeof where, "CUDA GPU %d", from);
        if (LOOM_CUDA_CHECK(where, cudaDeviceCanAccessPeer(&can, from, to)) != LOOM_OK) can = 0;
        if (can) {
            int prev = 0;
            cudaError_t e = cudaGetDevice(&prev);
            if (e == cudaSuccess) e = cudaSetDevice(from);
            if (e == cudaSuccess) {
                e = cudaDeviceEnablePeerAccess(to, 0);
                if (e == cudaErrorPeerAccessAlreadyEnabled) {
                    /* enabled before (by another library): fine, but the error stays
                     * pending and the next launch's cudaGetLastError would report it */
                    (void)cudaGetLastError();
                    e = cudaSuccess;
                }
            }
            if (LOOM_CUDA_CHECK(where, e) != LOOM_OK) {
                LOOM_LOG_WARN("CUDA: cannot enable peer access from GPU %d to GPU %d (%s); copies "
                              "between them are staged through host memory",
                              from, to, loom_last_error());
                can = 0;
            }
            (void)cudaSetDevice(prev);
        }
        st = can ? 1 : -1;
        loom__cuda_peer_state[from][to] = st;
        LOOM_LOG_DEBUG("CUDA: peer access GPU %d -> GPU %d: %s", from, to, can ? "yes" : "no");
    }
    pthread_mutex_unlock(&loom__cuda_peer_mu);
    return st > 0;
}

/* ---------------------------------------------------------------- supported ops */

/* The op/type combinations the kernels implement: those of the CPU oracle (the contract of
 * docs/ops.md, backends/op-types.c), with flash attention limited to head sizes whose
 * per-warp rows fit shared memory. */
/* Storage types the CUDA kernels have: every type of the CPU contract but the activation
 * types Q8_1/Q8_K (kernels-quant.cuh decodes the block types). */
static bool cuda_type_known(loom_type t) {
    switch (t) {
    case LOOM_TYPE_F32:
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
    case LOOM_TYPE_Q8_0:
    case LOOM_TYPE_Q4_0:
    case LOOM_TYPE_Q4_1:
    case LOOM_TYPE_Q5_0:
    case LOOM_TYPE_Q5_1:
    case LOOM_TYPE_IQ4_NL:
    case LOOM_TYPE_MXFP4:
    case LOOM_TYPE_Q2_K:
    case LOOM_TYPE_Q3_K:
    case LOOM_TYPE_Q4_K:
    case LOOM_TYPE_Q5_K:
    case LOOM_TYPE_Q6_K:
    case LOOM_TYPE_IQ4_XS:
    case LOOM_TYPE_I8:
    case LOOM_TYPE_I16:
    case LOOM_TYPE_I32:
    case LOOM_TYPE_I64:
        return true;
    default:
        return false;
    }
}

/* Quantised results the kernels write: the KV-cache types quantised from F32 (CPY,
 * SET_ROWS: the CPU contract's quantised results, loom__op_quant_dst), and any block type
 * copied from the same type (raw blocks). */
static bool cuda_result_ok(const loom_tensor *op) {
    const loom_type_traits *tr = loom_type_traits_get((int)op->type);
    if (!tr || !tr->is_quantized) return true;
    if (loom__op_quant_dst(op->type)) return true;
    return (op->op == LOOM_OP_DUP || op->op == LOOM_OP_CONT || op->op == LOOM_OP_CPY) &&
           op->src[0] && op->src[0]->type == op->type;
}

bool loom__cuda_dev_supports_op(const loom__cuda_dev *cd, const loom_tensor *op) {
    (void)cd;
    if (!loom__op_types_ok(op)) return false;
    if (!cuda_type_known(op->type) || !cuda_result_ok(op)) return false;
    for (int i = 0; i < LOOM_MAX_SRC; i++)
        if (op->src[i] && !cuda_type_known(op->src[i]->type)) return false;
    if (op->op == LOOM_OP_FLASH_ATTN_EXT)
        return op->src[0]->ne[0] <= LOOM_CU_FA_MAX_D && op->src[2]->ne[0] <= LOOM_CU_FA_MAX_D;
    return true;
}

/* ---------------------------------------------------------------- device methods */

static loom__cuda_dev *loom__cuda_dev_ctx(loom_dev_t dev) {
    return dev->context;
}

static const char *loom__cuda_dev_name(loom_dev_t dev) {
    return loom__cuda_dev_ctx(dev)->name;
}

static const char *loom__cuda_dev_description(loom_dev_t dev) {
    return loom__cuda_dev_ctx(dev)->desc;
}

/* The GPU's free and total memory, divided evenly among the loom devices sharing it. */
static void loom__cuda_dev_memory(loom_dev_t dev, size_t *free, size_t *total) {
    loom__cuda_dev *cd = loom__cuda_dev_ctx(dev);
    size_t f = 0, t = cd->gpu_total_mem;
    if (LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id)) == LOOM_OK &&
        LOOM_CUDA_CHECK(cd->name, cudaMemGetInfo(&f, &t)) != LOOM_OK) {
        f = 0;
        t = cd->gpu_total_mem;
    }
    *free = f / (size_t)cd->n_shared;
    *total = t / (size_t)cd->n_shared;
}

static loom_dev_type loom__cuda_dev_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_GPU;
}

static void loom__cuda_dev_props(loom_dev_t dev, loom_dev_props *props) {
    props->name = loom__cuda_dev_name(dev);
    props->description = loom__cuda_dev_description(dev);
    loom__cuda_dev_memory(dev, &props->memory_free, &props->memory_total);
    props->type = LOOM_DEV_TYPE_GPU;
    props->caps.async = true;
    props->caps.host_buffer = true;
    props->caps.events = true;
}

static loom_backend_t loom__cuda_dev_init(loom_dev_t dev, const char *params) {
    return loom__cuda_backend_new(loom__cuda_dev_ctx(dev), params);
}

static loom_buft_t loom__cuda_dev_buft(loom_dev_t dev) {
    return &loom__cuda_dev_ctx(dev)->buft;
}

static loom_buft_t loom__cuda_dev_host_buft(loom_dev_t dev) {
    return &loom__cuda_dev_ctx(dev)->creg->host_buft;
}

static bool loom__cuda_dev_supports_op_m(loom_dev_t dev, const loom_tensor *op) {
    return loom__cuda_dev_supports_op(loom__cuda_dev_ctx(dev), op);
}

/* Kernels read only this device's own memory. */
static bool loom__cuda_dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    return buft == &loom__cuda_dev_ctx(dev)->buft;
}

/* Worth running here although the weight lives in host memory: a batch of at least
 * LOOM_OP_OFFLOAD_MIN_BATCH (default 32; 0 disables), re-read on every call. */
static bool loom__cuda_dev_offload_op(loom_dev_t dev, const loom_tensor *op) {
    const size_t min = loom__cuda_env_size("LOOM_OP_OFFLOAD_MIN_BATCH", 32);
    if (min == 0) return false;
    return loom_op_batch_size(op) >= (int64_t)min &&
           loom__cuda_dev_supports_op(loom__cuda_dev_ctx(dev), op);
}

static const struct loom_dev_i loom__cuda_dev_i = {
    .get_name = loom__cuda_dev_name,
    .get_description = loom__cuda_dev_description,
    .get_memory = loom__cuda_dev_memory,
    .get_type = loom__cuda_dev_type,
    .get_props = loom__cuda_dev_props,
    .init_backend = loom__cuda_dev_init,
    .get_buffer_type = loom__cuda_dev_buft,
    .get_host_buffer_type = loom__cuda_dev_host_buft,
    .supports_op = loom__cuda_dev_supports_op_m,
    .supports_buft = loom__cuda_dev_supports_buft,
    .offload_op = loom__cuda_dev_offload_op,
    .event_new = loom__cuda_event_new,
    .event_free = loom__cuda_event_free,
    .event_synchronize = loom__cuda_event_synchronize,
};

loom__cuda_dev *loom__cuda_dev_of(loom_dev_t dev) {
    if (!dev || dev->iface != &loom__cuda_dev_i) return NULL;
    return dev->context;
}

bool loom_dev_is_cuda(loom_dev_t dev) {
    return loom__cuda_dev_of(dev) != NULL;
}

/* The "loom_dev_pci_bus_id" extra: where the GPU sits, for topo/'s tree and ring order
 * (NULL when unknown). */
static const char *loom__cuda_dev_pci_bus_id(loom_dev_t dev) {
    loom__cuda_dev *cd = loom__cuda_dev_of(dev);
    return cd && cd->pci_bus_id[0] ? cd->pci_bus_id : NULL;
}

/* ---------------------------------------------------------------- reg methods */

static loom__cuda_reg *loom__cuda_reg_ctx(loom_reg_t reg) {
    return reg->context;
}

static const char *loom__cuda_reg_name(loom_reg_t reg) {
    return loom__cuda_reg_ctx(reg)->name;
}

static size_t loom__cuda_reg_dev_count(loom_reg_t reg) {
    return (size_t)loom__cuda_reg_ctx(reg)->n_devices;
}

static loom_dev_t loom__cuda_reg_dev_get(loom_reg_t reg, size_t index) {
    loom__cuda_reg *cr = loom__cuda_reg_ctx(reg);
    return index < (size_t)cr->n_devices ? &cr->devs[index].dev : NULL;
}

typedef void (*loom__cuda_any_fn)(void);

static const struct {
    const char *name;
    loom__cuda_any_fn fn;
} loom__cuda_procs[] = {
    {LOOM_PROC_COMM_INIT, (loom__cuda_any_fn)loom__cuda_comm_init},
    {LOOM_PROC_COMM_ALLREDUCE, (loom__cuda_any_fn)loom__cuda_comm_allreduce},
    {LOOM_PROC_COMM_FREE, (loom__cuda_any_fn)loom__cuda_comm_free},
    {LOOM_PROC_RANK_COMM, (loom__cuda_any_fn)loom__cuda_rank_comm},
    {"loom_cuda_comm_init_shared", (loom__cuda_any_fn)loom__cuda_comm_init_shared},
    {"loom_cuda_reg", (loom__cuda_any_fn)loom_cuda_reg},
    {"loom_cuda_reg_new_virtual", (loom__cuda_any_fn)loom_cuda_reg_new_virtual},
    {"loom_cuda_reg_free", (loom__cuda_any_fn)loom_cuda_reg_free},
    {"loom_cuda_no_devices_reason", (loom__cuda_any_fn)loom_cuda_no_devices_reason},
    {"loom_cuda_backend_get_stats", (loom__cuda_any_fn)loom_cuda_backend_get_stats},
    {"loom_dev_is_cuda", (loom__cuda_any_fn)loom_dev_is_cuda},
    {"loom_dev_pci_bus_id", (loom__cuda_any_fn)loom__cuda_dev_pci_bus_id},
    /* this module's own core: callers with another copy import its errors */
    {"loom_last_error", (loom__cuda_any_fn)loom_last_error},
    {"loom_last_status", (loom__cuda_any_fn)loom_last_status},
};

static void *loom__cuda_reg_proc(loom_reg_t reg, const char *name) {
    (void)reg;
    for (size_t i = 0; i < sizeof loom__cuda_procs / sizeof loom__cuda_procs[0]; i++) {
        if (strcmp(loom__cuda_procs[i].name, name) == 0) {
            void *p;
            memcpy(&p, &loom__cuda_procs[i].fn, sizeof p);
            return p;
        }
    }
    return NULL;
}

static const struct loom_reg_i loom__cuda_reg_i = {
    .get_name = loom__cuda_reg_name,
    .get_device_count = loom__cuda_reg_dev_count,
    .get_device = loom__cuda_reg_dev_get,
    .get_proc_address = loom__cuda_reg_proc,
};

const char *loom_cuda_no_devices_reason(loom_reg_t reg) {
    if (!reg || reg->iface != &loom__cuda_reg_i) return "not a CUDA reg";
    return loom__cuda_reg_ctx(reg)->no_devices_reason;
}

/* ---------------------------------------------------------------- construction */

#define LOOM__CUDA_MAX_SLOTS 64

static pthread_mutex_t loom__cuda_slot_mu = PTHREAD_MUTEX_INITIALIZER;
static bool loom__cuda_slot_used[LOOM__CUDA_MAX_SLOTS];

/* Slot 0 is the default reg's; virtual regs take 1.. */
static int loom__cuda_slot_take(void) {
    int slot = -1;
    pthread_mutex_lock(&loom__cuda_slot_mu);
    for (int i = 1; i < LOOM__CUDA_MAX_SLOTS && slot < 0; i++) {
        if (!loom__cuda_slot_used[i]) {
            loom__cuda_slot_used[i] = true;
            slot = i;
        }
    }
    pthread_mutex_unlock(&loom__cuda_slot_mu);
    return slot;
}

static void loom__cuda_slot_release(int slot) {
    pthread_mutex_lock(&loom__cuda_slot_mu);
    if (slot > 0 && slot < LOOM__CUDA_MAX_SLOTS) loom__cuda_slot_used[slot] = false;
    pthread_mutex_unlock(&loom__cuda_slot_mu);
}

/* Fills cr (zeroed storage): enumerates the GPUs and makes per_gpu loom devices on each
 * usable one. No GPU, no driver or a failing query give zero devices and a reason. */
static void loom__cuda_reg_init(loom__cuda_reg *cr, int per_gpu, int slot, bool is_static) {
    cr->reg.api_version = LOOM_BACKEND_API_VERSION;
    cr->reg.iface = &loom__cuda_reg_i;
    cr->reg.context = cr;
    cr->slot = slot;
    cr->is_static = is_static;
    cr->per_gpu = per_gpu;
    if (slot == 0)
        cr->prefix[0] = '\0';
    else
        snprintf(cr->prefix, sizeof cr->prefix, "V%d-", slot);
    snprintf(cr->name, sizeof cr->name, "%sCUDA", cr->prefix);
    snprintf(cr->host_name, sizeof cr->host_name, "%sCUDA_Host", cr->prefix);

    int n_gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&n_gpus);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(cr->no_devices_reason, sizeof cr->no_devices_reason, "cudaGetDeviceCount: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        LOOM_LOG_INFO("CUDA: no CUDA devices (%s)", cr->no_devices_reason);
        n_gpus = 0;
    } else if (n_gpus == 0) {
        snprintf(cr->no_devices_reason, sizeof cr->no_devices_reason,
                 "cudaGetDeviceCount found no GPU");
    }
    if (n_gpus > LOOM_CUDA_MAX_GPUS) {
        LOOM_LOG_WARN("CUDA: %d GPUs found; using the first %d", n_gpus, LOOM_CUDA_MAX_GPUS);
        n_gpus = LOOM_CUDA_MAX_GPUS;
    }
    int skipped = 0;
    for (int g = 0; g < n_gpus; g++) {
        struct cudaDeviceProp p;
        char where[32];
        snprintf(where, sizeof where, "CUDA GPU %d", g);
        if (LOOM_CUDA_CHECK(where, cudaGetDeviceProperties(&p, g)) != LOOM_OK) {
            LOOM_LOG_WARN("CUDA: GPU %d skipped: %s", g, loom_last_error());
            skipped++;
            continue;
        }
        const int cc = 10 * p.major + p.minor;
        if (cc < LOOM_CUDA_MIN_CC) {
            LOOM_LOG_WARN("CUDA: GPU %d (%s) has compute capability %d.%d; loom's kernels need "
                          "8.0 or newer: skipped",
                          g, p.name, p.major, p.minor);
            skipped++;
            continue;
        }
        char mem[32];
        loom__cuda_format_size(p.totalGlobalMem, mem, sizeof mem);
        for (int v = 0; v < per_gpu && cr->n_devices < LOOM_CUDA_MAX_DEVICES; v++) {
            loom__cuda_dev *cd = &cr->devs[cr->n_devices];
            if (pthread_mutex_init(&cd->mu, NULL) != 0) break;
            cd->dev.iface = &loom__cuda_dev_i;
            cd->dev.reg = &cr->reg;
            cd->dev.context = cd;
            cd->buft.iface = &loom__cuda_buft_i;
            cd->buft.device = &cd->dev;
            cd->buft.context = cd;
            cd->creg = cr;
            cd->index = cr->n_devices;
            cd->cuda_id = g;
            cd->n_shared = per_gpu;
            cd->cc = cc;
            cd->gpu_total_mem = p.totalGlobalMem;
            if (cudaDeviceGetPCIBusId(cd->pci_bus_id, (int)sizeof cd->pci_bus_id, g) != cudaSuccess)
                cd->pci_bus_id[0] = 0;
            snprintf(cd->name, sizeof cd->name, "%sCUDA%d", cr->prefix, cd->index);
            if (per_gpu == 1)
                snprintf(cd->desc, sizeof cd->desc, "%.256s (GPU %d, sm_%d, %s)", p.name, g, cc,
                         mem);
            else
                snprintf(cd->desc, sizeof cd->desc,
                         "%.256s (GPU %d, sm_%d, %s), loom device %d of %d on this GPU", p.name, g,
                         cc, mem, v + 1, per_gpu);
            cr->n_devices++;
        }
    }
    if (cr->n_devices == 0 && n_gpus > 0) {
        snprintf(cr->no_devices_reason, sizeof cr->no_devices_reason,
                 "%d GPU(s) found, %d unusable (compute capability below 8.0 or a failing "
                 "query)",
                 n_gpus, skipped);
    }
    /* The pinned host buffer type belongs to the first device (any GPU reads it). */
    cr->host_buft.iface = &loom__cuda_host_buft_i;
    cr->host_buft.device = cr->n_devices > 0 ? &cr->devs[0].dev : NULL;
    cr->host_buft.context = cr;
    LOOM_LOG_DEBUG("CUDA: reg %s with %d device(s) on %d GPU(s)", cr->name, cr->n_devices, n_gpus);
}

static loom_status loom__cuda_check_per_gpu(int per_gpu) {
    if (per_gpu < 1 || per_gpu > LOOM_CUDA_MAX_PER_GPU) {
        return loom_error(LOOM_ERR_INVALID_ARG, "CUDA: %d devices per GPU is out of range 1..%d",
                          per_gpu, LOOM_CUDA_MAX_PER_GPU);
    }
    return LOOM_OK;
}

loom_status loom_cuda_reg_new_virtual(int per_gpu, loom_reg_t *out) {
    if (!out) return loom_error(LOOM_ERR_INVALID_ARG, "loom_cuda_reg_new_virtual: NULL out");
    *out = NULL;
    loom_status s = loom__cuda_check_per_gpu(per_gpu);
    if (s != LOOM_OK) return s;
    loom__cuda_reg *cr = loom_calloc(1, sizeof *cr);
    if (!cr) return loom_error(LOOM_ERR_NOMEM, "CUDA: out of host memory for a reg");
    int slot = loom__cuda_slot_take();
    if (slot < 0) {
        loom_free(cr);
        return loom_error(LOOM_ERR_FULL, "CUDA: too many virtual CUDA regs alive (%d)",
                          LOOM__CUDA_MAX_SLOTS - 1);
    }
    loom__cuda_reg_init(cr, per_gpu, slot, false);
    *out = &cr->reg;
    return LOOM_OK;
}

void loom_cuda_reg_free(loom_reg_t reg) {
    if (!reg) return;
    LOOM_ASSERT(reg->iface == &loom__cuda_reg_i); /* not a CUDA reg */
    loom__cuda_reg *cr = loom__cuda_reg_ctx(reg);
    if (cr->is_static) return;
    for (int i = 0; i < cr->n_devices; i++) {
        loom__cuda_dev *cd = &cr->devs[i];
        /* Every backend and buffer of the reg must be freed first. */
        LOOM_ASSERT(cd->n_backends == 0 && cd->n_buffers == 0);
        pthread_mutex_destroy(&cd->mu);
    }
    loom__cuda_slot_release(cr->slot);
    loom_free(cr);
}

/* ---------------------------------------------------------------- default reg */

static loom__cuda_reg loom__cuda_default_storage;
static pthread_once_t loom__cuda_default_once = PTHREAD_ONCE_INIT;

static void loom__cuda_default_init(void) {
    size_t per_gpu = loom__cuda_env_size("LOOM_CUDA_DEVICES_PER_GPU", 1);
    if (per_gpu < 1 || per_gpu > LOOM_CUDA_MAX_PER_GPU) {
        LOOM_LOG_WARN("CUDA: LOOM_CUDA_DEVICES_PER_GPU=%zu is out of range 1..%d; using 1", per_gpu,
                      LOOM_CUDA_MAX_PER_GPU);
        per_gpu = 1;
    }
    loom__cuda_reg_init(&loom__cuda_default_storage, (int)per_gpu, 0, true);
}

loom_reg_t loom_cuda_reg(void) {
    pthread_once(&loom__cuda_default_once, loom__cuda_default_init);
    return &loom__cuda_default_storage.reg;
}
