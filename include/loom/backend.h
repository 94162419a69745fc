/*
 * loom backends: reg -> device -> backend, and buffer type -> buffer.
 *
 * A reg is a loaded module (cpu, sim, cuda); it enumerates devices. A device answers
 * static questions (supports_op, memory, caps) without execution state; a backend is a
 * command stream on a device (async set/get/copy, events, graph_compute). A buffer type
 * is a kind of memory (alignment, max size, host-visible or not) owned by a device; a
 * buffer is one allocation of it. Implementations live behind the tables in
 * loom/backend-impl.h; everything here is a thin wrapper that applies defaults.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_buft *loom_buft_t;
typedef struct loom_buffer *loom_buffer_t;
typedef struct loom_event *loom_event_t;
typedef struct loom_backend *loom_backend_t;
typedef struct loom_dev *loom_dev_t;
typedef struct loom_reg *loom_reg_t;

typedef enum loom_buffer_usage {
    LOOM_BUFFER_USAGE_ANY = 0,
    LOOM_BUFFER_USAGE_WEIGHTS = 1,
    LOOM_BUFFER_USAGE_COMPUTE = 2,
} loom_buffer_usage;

typedef enum loom_dev_type {
    LOOM_DEV_TYPE_CPU = 0,   /* the host; the scheduler's universal fallback */
    LOOM_DEV_TYPE_GPU = 1,   /* a device with its own memory */
    LOOM_DEV_TYPE_ACCEL = 2, /* computes on host memory (BLAS-like) */
    LOOM_DEV_TYPE_META = 3,  /* several devices acting as one */
} loom_dev_type;

typedef struct loom_dev_caps {
    bool async;       /* set/get/copy_async and graph_compute do not block */
    bool host_buffer; /* has a pinned host buffer type */
    bool events;      /* supports events */
} loom_dev_caps;

typedef struct loom_dev_props {
    const char *name;
    const char *description;
    size_t memory_free;
    size_t memory_total;
    loom_dev_type type;
    loom_dev_caps caps;
} loom_dev_props;

/* ---------------------------------------------------------------- buffer types */

LOOM_API const char *loom_buft_name(loom_buft_t buft);
/* NULL with loom_last_error (LOOM_ERR_DEVICE_OOM / LOOM_ERR_NOMEM) on failure. A size of
 * 0 yields a valid empty buffer. */
LOOM_API loom_buffer_t loom_buft_alloc_buffer(loom_buft_t buft, size_t size);
LOOM_API size_t loom_buft_alignment(loom_buft_t buft);
LOOM_API size_t loom_buft_max_size(loom_buft_t buft); /* default SIZE_MAX */
/* Bytes a tensor needs in this buffer type (default loom_nbytes). */
LOOM_API size_t loom_buft_alloc_size(loom_buft_t buft, const loom_tensor *t);
LOOM_API bool loom_buft_is_host(loom_buft_t buft); /* default false */
LOOM_API loom_dev_t loom_buft_device(loom_buft_t buft);

/* ---------------------------------------------------------------- buffers */

LOOM_API void loom_buffer_free(loom_buffer_t buf); /* NULL is a no-op */
LOOM_API size_t loom_buffer_size(loom_buffer_t buf);
LOOM_API void *loom_buffer_base(loom_buffer_t buf);
LOOM_API loom_buft_t loom_buffer_buft(loom_buffer_t buf);
LOOM_API const char *loom_buffer_name(loom_buffer_t buf);
LOOM_API bool loom_buffer_is_host(loom_buffer_t buf);
LOOM_API void loom_buffer_set_usage(loom_buffer_t buf, loom_buffer_usage usage);
LOOM_API loom_buffer_usage loom_buffer_get_usage(loom_buffer_t buf);
LOOM_API void loom_buffer_clear(loom_buffer_t buf, uint8_t value);
/* Places t at base + offset (t must not have a buffer; views use loom_buffer_init_view).
 * Runs the buffer's init_tensor hook. */
LOOM_API loom_status loom_buffer_alloc_tensor(loom_buffer_t buf, loom_tensor *t, size_t offset);
/* Gives a view tensor the buffer and address of its view_src. */
LOOM_API loom_status loom_buffer_init_view(loom_tensor *t);

/* Allocates one buffer of `buft` holding every tensor of ctx (which must be no_alloc),
 * aligned; tensors that already have data are skipped. NULL with loom_last_error if a
 * buffer cannot be allocated (then nothing is left allocated). */
LOOM_API loom_buffer_t loom_alloc_ctx_tensors(loom_ctx *ctx, loom_buft_t buft);

/* Synchronous tensor data access (bytes within the tensor's span). */
LOOM_API void loom_tensor_set(loom_tensor *t, const void *data, size_t offset, size_t size);
LOOM_API void loom_tensor_get(const loom_tensor *t, void *data, size_t offset, size_t size);
LOOM_API void loom_tensor_memset(loom_tensor *t, uint8_t value, size_t offset, size_t size);
/* Copies src into dst (same layout), across any two buffers (staged through host). */
LOOM_API loom_status loom_tensor_copy(const loom_tensor *src, loom_tensor *dst);

/* ---------------------------------------------------------------- events */

LOOM_API loom_event_t loom_event_new(loom_dev_t dev); /* NULL if the device has no events */
LOOM_API void loom_event_free(loom_event_t ev);
LOOM_API void loom_event_record(loom_event_t ev, loom_backend_t backend);
LOOM_API void loom_event_synchronize(loom_event_t ev);
/* Makes `backend` wait (asynchronously) until ev has completed. */
LOOM_API void loom_event_wait(loom_backend_t backend, loom_event_t ev);

/* ---------------------------------------------------------------- backends */

LOOM_API const char *loom_backend_name(loom_backend_t backend);
LOOM_API void loom_backend_free(loom_backend_t backend); /* NULL is a no-op */
LOOM_API loom_dev_t loom_backend_device(loom_backend_t backend);
LOOM_API loom_buft_t loom_backend_default_buft(loom_backend_t backend);
LOOM_API loom_buffer_t loom_backend_alloc_buffer(loom_backend_t backend, size_t size);

/* Async variants fall back to the synchronous ones when a backend has no async hook. */
LOOM_API void loom_backend_tensor_set_async(loom_backend_t backend, loom_tensor *t,
                                            const void *data, size_t offset, size_t size);
LOOM_API void loom_backend_tensor_get_async(loom_backend_t backend, const loom_tensor *t,
                                            void *data, size_t offset, size_t size);
/* Copies src to dst; asynchronous when the destination backend can (the source backend
 * must be synchronised or ordered by an event first), synchronous otherwise. */
LOOM_API loom_status loom_backend_tensor_copy_async(loom_backend_t backend_src,
                                                    loom_backend_t backend_dst,
                                                    const loom_tensor *src, loom_tensor *dst);
/* Waits for everything issued to the backend. Returns the first failure of work that ran
 * asynchronously (a graph that failed on the device), with its message, until the next
 * graph_compute: a failure is reported by the call that waits for the failed work. */
LOOM_API loom_status loom_backend_synchronize(loom_backend_t backend);
/* loom_backend_synchronize, keeping the first failure seen over several calls: when it
 * fails and *first is LOOM_OK, *first and msg (msg_size bytes) take its status and
 * message (a later failure leaves them). Returns this call's status. */
LOOM_API loom_status loom_backend_synchronize_keep(loom_backend_t backend, loom_status *first,
                                                   char *msg, size_t msg_size);
/* Runs a graph whose tensors are all allocated in buffers this backend can use. May
 * return before completion on async backends (synchronize to wait, and to learn whether
 * the work succeeded); a failure of earlier asynchronous work that nobody waited for is
 * returned here. The synchronous form returns the failure of this graph's work. */
LOOM_API loom_status loom_backend_graph_compute_async(loom_backend_t backend, loom_graph *g);
LOOM_API loom_status loom_backend_graph_compute(loom_backend_t backend, loom_graph *g);
/* Lets the backend reorder/fuse its graph before allocation (no-op by default). */
LOOM_API void loom_backend_graph_optimize(loom_backend_t backend, loom_graph *g);
/* Bracket a window in which the graph is only queried (supports_op/offload_op), never
 * edited: a scheduler's assignment passes. Backends may cache answers inside it. */
LOOM_API void loom_backend_split_begin(loom_backend_t backend);
LOOM_API void loom_backend_split_end(loom_backend_t backend);
LOOM_API bool loom_backend_supports_op(loom_backend_t backend, const loom_tensor *op);
LOOM_API bool loom_backend_supports_buft(loom_backend_t backend, loom_buft_t buft);
LOOM_API bool loom_backend_offload_op(loom_backend_t backend, const loom_tensor *op);

/* ---------------------------------------------------------------- devices */

LOOM_API const char *loom_dev_name(loom_dev_t dev);
LOOM_API const char *loom_dev_description(loom_dev_t dev);
LOOM_API void loom_dev_memory(loom_dev_t dev, size_t *free, size_t *total);
LOOM_API loom_dev_type loom_dev_get_type(loom_dev_t dev);
LOOM_API void loom_dev_get_props(loom_dev_t dev, loom_dev_props *props);
LOOM_API loom_reg_t loom_dev_reg(loom_dev_t dev);
/* params: optional backend-specific "key=value,..." string (cpu: "threads=N"). */
LOOM_API loom_backend_t loom_dev_init(loom_dev_t dev, const char *params);
LOOM_API loom_buft_t loom_dev_buffer_type(loom_dev_t dev);
LOOM_API loom_buft_t loom_dev_host_buffer_type(loom_dev_t dev); /* NULL if none */
LOOM_API bool loom_dev_supports_op(loom_dev_t dev, const loom_tensor *op);
LOOM_API bool loom_dev_supports_buft(loom_dev_t dev, loom_buft_t buft);
/* Whether the device wants to run op although its weight lives in host memory (batch
 * threshold); default false. */
LOOM_API bool loom_dev_offload_op(loom_dev_t dev, const loom_tensor *op);
/* The batch size of an op for offload decisions (ne[1] of a matmul's activations, ...). */
LOOM_API int64_t loom_op_batch_size(const loom_tensor *op);

/* ---------------------------------------------------------------- registry */

LOOM_API const char *loom_reg_name(loom_reg_t reg);
LOOM_API size_t loom_reg_dev_count(loom_reg_t reg);
LOOM_API loom_dev_t loom_reg_dev_get(loom_reg_t reg, size_t index);
/* Optional extras by name (communicator, sim controls); NULL if absent. */
LOOM_API void *loom_reg_get_proc_address(loom_reg_t reg, const char *name);

/* The global registry. Thread-safe. Registering the same reg twice is a no-op. */
LOOM_API loom_status loom_registry_add(loom_reg_t reg);
/* Loads one module (a shared object exporting `loom_backend_init`, see
 * LOOM_BACKEND_MODULE in loom/backend-impl.h) and registers its reg. A module built for
 * another backend API version is refused, naming both versions. Errors name the path and
 * the reason (dlopen's message, missing entry point, version, ...). */
LOOM_API loom_status loom_registry_load(const char *path, loom_reg_t *out_reg);
/* Registers the linked backends (cpu, and sim when linked), then loads every
 * libloom-<name>.so found in each directory of LOOM_BACKEND_PATH (colon-separated), the
 * directory of the loom library, its loom/ subdirectory (an installed tree: lib/loom/) and
 * the executable's directory, in that order. The first module of a name wins (one whose
 * name is registered already is not loaded), so LOOM_BACKEND_PATH overrides the installed
 * modules. A module that fails to load is logged with the reason and skipped. Returns the
 * number of regs loaded. */
LOOM_API size_t loom_registry_load_all(void);
LOOM_API size_t loom_registry_reg_count(void);
LOOM_API loom_reg_t loom_registry_reg_get(size_t index);
LOOM_API loom_reg_t loom_registry_reg_by_name(const char *name);
LOOM_API size_t loom_registry_dev_count(void);
LOOM_API loom_dev_t loom_registry_dev_get(size_t index);
LOOM_API loom_dev_t loom_registry_dev_by_name(const char *name); /* case-insensitive */
LOOM_API loom_dev_t loom_registry_dev_by_type(loom_dev_type type); /* first of a type */
/* Unregisters everything (tests). Modules stay mapped (a GPU runtime cannot be unloaded
 * safely) and are reused by a later load. Devices and backends obtained earlier must not
 * be used afterwards. */
LOOM_API void loom_registry_reset(void);
/* Unregisters and frees a reg that loom_devices_from_spec created for a spec ("sim:N"),
 * once nothing uses its devices; true if it was such a reg. Any other reg (static, loaded
 * module) is left registered and false is returned. */
LOOM_API bool loom_registry_release(loom_reg_t reg);

/* Resolves a device SPEC into devices: "cpu", "sim:N[,options]" (see loom/sim.h),
 * "cuda:0,1", "cuda", "numa" (one CPU device per NUMA node, see loom/cpu.h), "numa:1,0".
 * Writes up to cap devices; *n_out is the number found. Errors name
 * the bad part of the spec. */
LOOM_API loom_status loom_devices_from_spec(const char *spec, loom_dev_t *devs, size_t cap,
                                            size_t *n_out);
/* "cuda" and "numa" (all devices) come in ring order, neighbours close (same PCIe switch,
 * then NUMA node; GPUs placed through their reg's "loom_dev_pci_bus_id" extra, a
 * `const char *(loom_dev_t)`); explicit lists keep their order. This says the order of the
 * last such spec and why ("" before any). */
LOOM_API const char *loom_devices_last_order(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BACKEND_H */
