/*
 * The device interface, for implementers: loom's own backends (cpu, sim, cuda, meta), an
 * engine that brings its own device, and third-party loadable modules. Callers use the
 * thin wrappers of loom/backend.h, never these tables.
 *
 * Objects: a reg enumerates devices; a device answers static questions and creates
 * backends (command streams) and owns buffer types; a buffer type allocates buffers;
 * events order work between backends. Each object is a plain struct {iface, context}
 * that the implementation allocates and owns; loom only calls through the table.
 *
 * Each table is `static const` in its implementation, with designated initializers that
 * name only the hooks it implements. NULL means "use the default", stated beside each
 * hook; "required" hooks must be set.
 *
 * Compatibility rules (this header is public and versioned):
 *   - Append-only: new hooks go at the end of a table, new fields at the end of a struct;
 *     nothing is removed, reordered or changes meaning within one API version.
 *   - LOOM_BACKEND_API_VERSION changes whenever a table or object layout changes. A reg
 *     carries the version it was built for (struct loom_reg.api_version) and a module
 *     exports it (LOOM_BACKEND_MODULE); the registry refuses a mismatch, naming both.
 *   - A device that is not a module (an engine's own) registers with loom_registry_add,
 *     or is handed straight to loom_meta_device_new; it sets api_version the same way.
 *
 * Threading: hooks of one backend object are called from one thread at a time; device,
 * buffer-type and reg hooks may be called from any thread and must not keep unguarded
 * mutable state.
 */
#ifndef LOOM_BACKEND_IMPL_H
#define LOOM_BACKEND_IMPL_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of every table and object layout below. */
#define LOOM_BACKEND_API_VERSION 1

/* ---------------------------------------------------------------- buffer type */

struct loom_buft_i {
    const char *(*get_name)(loom_buft_t buft); /* required */
    /* Returns NULL and records an error (loom_error) on failure. */
    loom_buffer_t (*alloc_buffer)(loom_buft_t buft, size_t size);     /* required */
    size_t (*get_alignment)(loom_buft_t buft);                        /* NULL: 64 */
    size_t (*get_max_size)(loom_buft_t buft);                         /* NULL: SIZE_MAX */
    size_t (*get_alloc_size)(loom_buft_t buft, const loom_tensor *t); /* NULL: nbytes */
    bool (*is_host)(loom_buft_t buft);                                /* NULL: false */
};

struct loom_buft {
    const struct loom_buft_i *iface;
    loom_dev_t device;
    void *context;
};

/* ---------------------------------------------------------------- buffer */

struct loom_buffer_i {
    void (*free_buffer)(loom_buffer_t buf);                        /* NULL: nothing to free */
    void *(*get_base)(loom_buffer_t buf);                          /* required */
    loom_status (*init_tensor)(loom_buffer_t buf, loom_tensor *t); /* NULL: nothing */
    void (*memset_tensor)(loom_buffer_t buf, loom_tensor *t, uint8_t value, size_t offset,
                          size_t size); /* required */
    void (*set_tensor)(loom_buffer_t buf, loom_tensor *t, const void *data, size_t offset,
                       size_t size); /* required */
    void (*get_tensor)(loom_buffer_t buf, const loom_tensor *t, void *data, size_t offset,
                       size_t size); /* required */
    /* Copy src (in any buffer) into dst (in this buffer) directly; false if this buffer
     * cannot read src's memory (the caller then stages through host memory). */
    bool (*cpy_tensor)(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst);
    void (*clear)(loom_buffer_t buf, uint8_t value); /* required */
    void (*reset)(loom_buffer_t buf);                /* NULL: nothing */
};

struct loom_buffer {
    const struct loom_buffer_i *iface;
    loom_buft_t buft;
    void *context;
    size_t size;
    loom_buffer_usage usage;
};

/* A buffer object with the given table (allocated with loom_malloc; freed by
 * loom_buffer_free after iface->free_buffer). NULL on allocation failure. */
LOOM_API loom_buffer_t loom_buffer_init(loom_buft_t buft, const struct loom_buffer_i *iface,
                                        void *context, size_t size);

/* ---------------------------------------------------------------- events */

struct loom_event {
    loom_dev_t device;
    void *context;
};

/* ---------------------------------------------------------------- backend */

struct loom_backend_i {
    const char *(*get_name)(loom_backend_t backend); /* NULL: device name */
    void (*free)(loom_backend_t backend);            /* required; frees the object */
    /* NULL: synchronous buffer set/get. */
    void (*set_tensor_async)(loom_backend_t backend, loom_tensor *t, const void *data,
                             size_t offset, size_t size);
    void (*get_tensor_async)(loom_backend_t backend, const loom_tensor *t, void *data,
                             size_t offset, size_t size);
    /* Issued on the destination backend. false: not possible (the wrapper then
     * synchronises both and copies synchronously). NULL: always false. */
    bool (*cpy_tensor_async)(loom_backend_t backend_src, loom_backend_t backend_dst,
                             const loom_tensor *src, loom_tensor *dst);
    void (*synchronize)(loom_backend_t backend); /* NULL: nothing (sync backend) */
    loom_status (*graph_compute)(loom_backend_t backend, loom_graph *g); /* required */
    void (*graph_optimize)(loom_backend_t backend, loom_graph *g);       /* NULL: nothing */
    void (*event_record)(loom_backend_t backend, loom_event_t ev);       /* NULL: no events */
    void (*event_wait)(loom_backend_t backend, loom_event_t ev);         /* NULL: no events */
    /* A scheduler brackets its assignment passes with these: in between it only asks
     * questions (supports_op, offload_op) and edits nothing, so a backend may cache its
     * answers for that window. NULL: nothing. */
    void (*split_begin)(loom_backend_t backend);
    void (*split_end)(loom_backend_t backend);
    /* The first failure of asynchronously issued work (records the message with
     * loom_error), called by loom_backend_synchronize after `synchronize`: an asynchronous
     * backend keeps a failure until it is reported here, and the next graph_compute after
     * that starts clean (one not reported yet is returned by that graph_compute instead).
     * Reporting must be idempotent until then. NULL: LOOM_OK (graph_compute reports every
     * failure itself: a synchronous backend). */
    loom_status (*get_status)(loom_backend_t backend);
};

struct loom_backend {
    const struct loom_backend_i *iface;
    loom_dev_t device;
    void *context;
};

/* ---------------------------------------------------------------- device */

struct loom_dev_i {
    const char *(*get_name)(loom_dev_t dev);                            /* required */
    const char *(*get_description)(loom_dev_t dev);                     /* NULL: name */
    void (*get_memory)(loom_dev_t dev, size_t *free, size_t *total);    /* required */
    loom_dev_type (*get_type)(loom_dev_t dev);                          /* required */
    void (*get_props)(loom_dev_t dev, loom_dev_props *props);           /* required */
    loom_backend_t (*init_backend)(loom_dev_t dev, const char *params); /* required */
    loom_buft_t (*get_buffer_type)(loom_dev_t dev);                     /* required */
    loom_buft_t (*get_host_buffer_type)(loom_dev_t dev);                /* NULL: none */
    bool (*supports_op)(loom_dev_t dev, const loom_tensor *op);         /* required */
    bool (*supports_buft)(loom_dev_t dev, loom_buft_t buft);            /* required */
    bool (*offload_op)(loom_dev_t dev, const loom_tensor *op);          /* NULL: false */
    loom_event_t (*event_new)(loom_dev_t dev);                          /* NULL: no events */
    void (*event_free)(loom_dev_t dev, loom_event_t ev);
    void (*event_synchronize)(loom_dev_t dev, loom_event_t ev);
};

struct loom_dev {
    const struct loom_dev_i *iface;
    loom_reg_t reg;
    void *context;
};

/* ---------------------------------------------------------------- reg */

struct loom_reg_i {
    const char *(*get_name)(loom_reg_t reg);                     /* required */
    size_t (*get_device_count)(loom_reg_t reg);                  /* required */
    loom_dev_t (*get_device)(loom_reg_t reg, size_t index);      /* required */
    void *(*get_proc_address)(loom_reg_t reg, const char *name); /* NULL: none */
};

struct loom_reg {
    int api_version; /* LOOM_BACKEND_API_VERSION */
    const struct loom_reg_i *iface;
    void *context;
};

/* Whether op's types fit the op contract of docs/ops.md (what the CPU oracle implements);
 * backends narrow it further as they need (backends/op-types.c). */
LOOM_API bool loom__op_types_ok(const loom_tensor *op);
/* The quantised types a copy or SET_ROWS may write from F32 (a quantised KV cache: Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), the one list of them (backends/op-types.c). */
LOOM_API bool loom__op_quant_dst(loom_type t);

/* The entry points every backend module exports: loom_backend_init returns the module's
 * reg (NULL: no backend), loom_backend_api_version the LOOM_BACKEND_API_VERSION it was
 * compiled with. The registry reads the version first and refuses a module built for
 * another one without calling its init. Define both with LOOM_BACKEND_MODULE(fn), fn a
 * `loom_reg_t fn(void)`, once in the module. */
typedef loom_reg_t (*loom_backend_init_fn)(void);
#define LOOM_BACKEND_INIT_SYMBOL "loom_backend_init"
#define LOOM_BACKEND_VERSION_SYMBOL "loom_backend_api_version"

#ifdef __cplusplus
#define LOOM__MODULE_EXTERN extern "C"
#else
#define LOOM__MODULE_EXTERN
#endif
#define LOOM_BACKEND_MODULE(init_fn)                                                               \
    LOOM__MODULE_EXTERN LOOM_API const int loom_backend_api_version;                               \
    LOOM__MODULE_EXTERN LOOM_API loom_reg_t loom_backend_init(void);                               \
    const int loom_backend_api_version = LOOM_BACKEND_API_VERSION;                                 \
    loom_reg_t loom_backend_init(void) {                                                           \
        return init_fn();                                                                          \
    }

/* Optional communicator extras, looked up with loom_reg_get_proc_address. */
#define LOOM_PROC_COMM_INIT "loom_comm_init"
#define LOOM_PROC_COMM_ALLREDUCE "loom_comm_allreduce_tensor"
#define LOOM_PROC_COMM_FREE "loom_comm_free"

/* Optional: a communicator between processes (MPI ranks) for one local device each, which
 * dist/ uses for its members' device buffers (NCCL for CUDA: ncclGetUniqueId on rank 0,
 * the id broadcast by dist over MPI, ncclCommInitRank on every rank). The proc
 * LOOM_PROC_RANK_COMM is a `const loom_rank_comm_iface *(*)(void)`: it may load the library
 * behind it on the first call. Errors are written into the caller's `err` buffer (a module
 * has its own core, so loom_last_error would not reach the caller); every call is made by
 * dist on every rank in the same order. The data calls are synchronous: they wait for
 * every earlier use of the device and return once the data has moved. */
#define LOOM_PROC_RANK_COMM "loom_rank_comm"
#define LOOM_RANK_COMM_ID_MAX 256 /* bytes of the bootstrap id (NCCL's: 128) */
typedef struct loom_rank_comm_iface {
    char name[64];  /* what moves the data, for reports: "NCCL 2.28.9" */
    size_t id_size; /* bytes of the bootstrap id, <= LOOM_RANK_COMM_ID_MAX */
    /* whether this process can join with device `local`; false writes why */
    bool (*usable)(loom_dev_t local, char *why, size_t cap);
    /* rank 0 only: the id every rank joins with */
    loom_status (*get_id)(void *id, char *err, size_t cap);
    /* a communicator of nranks ranks in which this process is `rank`, on `local` */
    loom_status (*init)(loom_dev_t local, int nranks, int rank, const void *id, void **comm,
                        char *err, size_t cap);
    /* sums `count` floats at device address `data` over every rank, in place */
    loom_status (*allreduce_f32)(void *comm, void *data, size_t count, char *err, size_t cap);
    /* point-to-point between two ranks: `bytes` of device memory */
    loom_status (*send)(void *comm, const void *data, size_t bytes, int peer, char *err,
                        size_t cap);
    loom_status (*recv)(void *comm, void *data, size_t bytes, int peer, char *err, size_t cap);
    void (*free)(void *comm); /* NULL: no-op */
} loom_rank_comm_iface;
typedef const loom_rank_comm_iface *(*loom_rank_comm_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BACKEND_IMPL_H */
