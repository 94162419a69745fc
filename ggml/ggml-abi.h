/*
 * The private backend tables of ggml 0.27.0, as this bridge needs them.
 *
 * Debian's libggml-dev (0.27.0-1, the build llama.cpp 1:0.7.0+dfsg-2 links) installs only
 * ggml's public headers; the tables an out-of-tree backend fills are private to ggml. These
 * declarations are written for that ABI: member order and offsets were read off Debian's
 * libggml-base.so.0.27.0 (objdump of the wrappers ggml_backend_graph_compute_async,
 * ggml_backend_synchronize, ggml_backend_free, ggml_backend_buffer_clear/reset/init_tensor,
 * ggml_backend_dev_get_props/supports_op/offload_op, ggml_backend_buft_get_alloc_size/
 * is_host, ggml_backend_reg_get_proc_address; each offset is noted beside its member).
 * Hooks the bridge leaves NULL whose signatures it does not need are `void *` slots.
 *
 * Any other ggml release may lay these out differently: the bridge refuses to register
 * under another GGML_BACKEND_API_VERSION (ggml itself checks the reg's api_version) and
 * scripts/ggml-sandbox.sh pins the Debian version it builds against.
 */
#ifndef LOOM_GGML_ABI_H
#define LOOM_GGML_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ggml-backend.h>
#include <ggml.h>

#define LOOM_GGML_BACKEND_API_VERSION 3 /* ggml 0.27.0 */

/* buffer type: iface, then device (+0x40), context (+0x48) */
struct ggml_backend_buffer_type_i {
    const char *(*get_name)(ggml_backend_buffer_type_t buft);                     /* +0x00 */
    ggml_backend_buffer_t (*alloc_buffer)(ggml_backend_buffer_type_t buft, size_t size);
    /* +0x10, new in 0.27: one buffer for the named tensors (NULL = ggml plans by
     * get_max_size with whole tensor sizes) */
    ggml_backend_buffer_t (*alloc_buffer_n)(ggml_backend_buffer_type_t buft,
                                            struct ggml_tensor **tensors, int n_tensors);
    size_t (*get_alignment)(ggml_backend_buffer_type_t buft);                     /* +0x18 */
    size_t (*get_max_size)(ggml_backend_buffer_type_t buft);                      /* +0x20 */
    size_t (*get_alloc_size)(ggml_backend_buffer_type_t buft, const struct ggml_tensor *t);
    /* +0x30, new in 0.27: the bytes alloc_buffer_n would take */
    size_t (*get_alloc_size_n)(ggml_backend_buffer_type_t buft, struct ggml_tensor **tensors,
                               int n_tensors);
    bool (*is_host)(ggml_backend_buffer_type_t buft); /* +0x38 */
};
struct ggml_backend_buffer_type {
    struct ggml_backend_buffer_type_i iface;
    ggml_backend_dev_t device;
    void *context;
};

/* buffer: iface, then buft (+0x58), context (+0x60), size (+0x68), usage (+0x70) */
struct ggml_backend_buffer_i {
    void (*free_buffer)(ggml_backend_buffer_t buffer);                                /* +0x00 */
    void *(*get_base)(ggml_backend_buffer_t buffer);                                  /* +0x08 */
    enum ggml_status (*init_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *t);
    void (*memset_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *t, uint8_t value,
                          size_t offset, size_t size);                                /* +0x18 */
    void (*set_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *t, const void *data,
                       size_t offset, size_t size);                                   /* +0x20 */
    void (*get_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor *t, void *data,
                       size_t offset, size_t size);                                   /* +0x28 */
    void *set_tensor_2d; /* +0x30, NULL = a loop of set_tensor */
    void *get_tensor_2d; /* +0x38 */
    bool (*cpy_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor *src,
                       struct ggml_tensor *dst);                                      /* +0x40 */
    void (*clear)(ggml_backend_buffer_t buffer, uint8_t value);                        /* +0x48 */
    void (*reset)(ggml_backend_buffer_t buffer);                                       /* +0x50 */
};
struct ggml_backend_buffer {
    struct ggml_backend_buffer_i iface;
    ggml_backend_buffer_type_t buft;
    void *context;
    size_t size;
    enum ggml_backend_buffer_usage usage;
};

/* backend: guid (+0x00), iface (+0x08), device (+0x88), context (+0x90) */
struct ggml_backend_i {
    const char *(*get_name)(ggml_backend_t backend); /* +0x08 */
    void (*free)(ggml_backend_t backend);            /* +0x10 */
    void *set_tensor_async;                          /* +0x18, NULL = synchronous */
    void *get_tensor_async;                          /* +0x20 */
    void *set_tensor_2d_async;                       /* +0x28 */
    void *get_tensor_2d_async;                       /* +0x30 */
    void *cpy_tensor_async;                          /* +0x38 */
    void (*synchronize)(ggml_backend_t backend);     /* +0x40 */
    void *graph_plan_create;                         /* +0x48 */
    void *graph_plan_free;                           /* +0x50 */
    void *graph_plan_update;                         /* +0x58 */
    void *graph_plan_compute;                        /* +0x60 */
    enum ggml_status (*graph_compute)(ggml_backend_t backend, struct ggml_cgraph *g); /* +0x68 */
    void *event_record;                              /* +0x70 */
    void *event_wait;                                /* +0x78 */
    void *graph_optimize;                            /* +0x80 */
};
struct ggml_backend {
    ggml_guid_t guid;
    struct ggml_backend_i iface;
    ggml_backend_dev_t device;
    void *context;
};

/* device: iface, then reg (+0x78), context (+0x80) */
struct ggml_backend_device_i {
    const char *(*get_name)(ggml_backend_dev_t dev);                                 /* +0x00 */
    const char *(*get_description)(ggml_backend_dev_t dev);                          /* +0x08 */
    void (*get_memory)(ggml_backend_dev_t dev, size_t *free, size_t *total);        /* +0x10 */
    enum ggml_backend_dev_type (*get_type)(ggml_backend_dev_t dev);                 /* +0x18 */
    void (*get_props)(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props);  /* +0x20 */
    ggml_backend_t (*init_backend)(ggml_backend_dev_t dev, const char *params);     /* +0x28 */
    ggml_backend_buffer_type_t (*get_buffer_type)(ggml_backend_dev_t dev);          /* +0x30 */
    void *get_host_buffer_type;                                                      /* +0x38 */
    void *buffer_from_host_ptr;                                                      /* +0x40 */
    bool (*supports_op)(ggml_backend_dev_t dev, const struct ggml_tensor *op);      /* +0x48 */
    bool (*supports_buft)(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft); /* +0x50 */
    bool (*offload_op)(ggml_backend_dev_t dev, const struct ggml_tensor *op);       /* +0x58 */
    void *event_new;                                                                 /* +0x60 */
    void *event_free;                                                                /* +0x68 */
    void *event_synchronize;                                                         /* +0x70 */
};
struct ggml_backend_device {
    struct ggml_backend_device_i iface;
    ggml_backend_reg_t reg;
    void *context;
};

/* reg: api_version (+0x00), iface (+0x08), context (+0x28) */
struct ggml_backend_reg_i {
    const char *(*get_name)(ggml_backend_reg_t reg);
    size_t (*get_device_count)(ggml_backend_reg_t reg);
    ggml_backend_dev_t (*get_device)(ggml_backend_reg_t reg, size_t index);
    void *(*get_proc_address)(ggml_backend_reg_t reg, const char *name);
};
struct ggml_backend_reg {
    int api_version;
    struct ggml_backend_reg_i iface;
    void *context;
};

/* exported by libggml-base, declared only in the private headers */
bool ggml_backend_buffer_is_meta(ggml_backend_buffer_t buf);
ggml_backend_buffer_t ggml_backend_buffer_init(ggml_backend_buffer_type_t buft,
                                               struct ggml_backend_buffer_i iface, void *context,
                                               size_t size);

#endif /* LOOM_GGML_ABI_H */
