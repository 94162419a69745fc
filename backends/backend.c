/*
 * The thin public wrappers of include/loom/backend.h over the tables of
 * backends/backend-impl.h. Each wrapper applies the default documented beside its hook
 * (NULL hook = default), so implementations name only what they do. Also: buffer objects
 * (loom_buffer_init), placing tensors in buffers, allocating a whole context, synchronous
 * tensor access, cross-buffer copies (host memcpy, direct, or staged through host memory)
 * and the op batch size used for offload decisions.
 *
 * A backend module loaded with dlopen carries its own copy of core, so an error it records
 * lands in its own thread-local slot. Where a call into a module can fail (buffer
 * allocation, backend init, graph compute), the wrapper imports the module's message
 * through its reg's "loom_last_error"/"loom_last_status" proc addresses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"

/* ---------------------------------------------------------------- error import */

typedef const char *(*loom__last_error_fn)(void);
typedef loom_status (*loom__last_status_fn)(void);

/* Copies the last error of the module behind `dev` (if it has its own core) into this
 * thread's slot. Returns true when a message was imported. */
static bool loom__import_error(loom_dev_t dev) {
    if (!dev || !dev->reg || !dev->reg->iface || !dev->reg->iface->get_proc_address) {
        return false;
    }
    loom__last_error_fn err_fn =
        (loom__last_error_fn)dev->reg->iface->get_proc_address(dev->reg, "loom_last_error");
    loom__last_status_fn st_fn =
        (loom__last_status_fn)dev->reg->iface->get_proc_address(dev->reg, "loom_last_status");
    if (!err_fn || !st_fn || err_fn == loom_last_error) return false;
    loom_status s = st_fn();
    const char *msg = err_fn();
    if (s == LOOM_OK || !msg || !msg[0]) return false;
    loom_error(s, "%s", msg);
    return true;
}

/* ---------------------------------------------------------------- buffer types */

const char *loom_buft_name(loom_buft_t buft) {
    LOOM_ASSERT(buft != NULL);
    return buft->iface->get_name(buft);
}

/* A zero-size buffer: valid, frees nothing, holds no tensor bytes. */
static char loom__empty_base[1];

static void *loom__empty_get_base(loom_buffer_t buf) {
    (void)buf;
    return loom__empty_base;
}
static void loom__empty_memset(loom_buffer_t buf, loom_tensor *t, uint8_t v, size_t off,
                               size_t size) {
    (void)buf, (void)t, (void)v, (void)off, (void)size;
}
static void loom__empty_set(loom_buffer_t buf, loom_tensor *t, const void *data, size_t off,
                            size_t size) {
    (void)buf, (void)t, (void)data, (void)off, (void)size;
}
static void loom__empty_get(loom_buffer_t buf, const loom_tensor *t, void *data, size_t off,
                            size_t size) {
    (void)buf, (void)t, (void)data, (void)off, (void)size;
}
static void loom__empty_clear(loom_buffer_t buf, uint8_t v) {
    (void)buf, (void)v;
}

static const struct loom_buffer_i loom__empty_buffer_i = {
    .get_base = loom__empty_get_base,
    .memset_tensor = loom__empty_memset,
    .set_tensor = loom__empty_set,
    .get_tensor = loom__empty_get,
    .clear = loom__empty_clear,
};

loom_buffer_t loom_buft_alloc_buffer(loom_buft_t buft, size_t size) {
    LOOM_ASSERT(buft != NULL);
    if (size == 0) {
        loom_buffer_t buf = loom_buffer_init(buft, &loom__empty_buffer_i, NULL, 0);
        if (!buf) loom_error(LOOM_ERR_NOMEM, "%s: out of host memory", loom_buft_name(buft));
        return buf;
    }
    size_t max = loom_buft_max_size(buft);
    if (size > max) {
        loom_error(LOOM_ERR_DEVICE_OOM, "%s: buffer of %zu bytes exceeds the maximum of %zu",
                   loom_buft_name(buft), size, max);
        return NULL;
    }
    loom_clear_error();
    loom_buffer_t buf = buft->iface->alloc_buffer(buft, size);
    if (!buf && !loom__import_error(buft->device) && loom_last_status() == LOOM_OK) {
        loom_error(LOOM_ERR_DEVICE_OOM, "%s: allocation of %zu bytes failed", loom_buft_name(buft),
                   size);
    }
    return buf;
}

size_t loom_buft_alignment(loom_buft_t buft) {
    LOOM_ASSERT(buft != NULL);
    return buft->iface->get_alignment ? buft->iface->get_alignment(buft) : 64;
}

size_t loom_buft_max_size(loom_buft_t buft) {
    LOOM_ASSERT(buft != NULL);
    return buft->iface->get_max_size ? buft->iface->get_max_size(buft) : SIZE_MAX;
}

size_t loom_buft_alloc_size(loom_buft_t buft, const loom_tensor *t) {
    LOOM_ASSERT(buft != NULL && t != NULL);
    return buft->iface->get_alloc_size ? buft->iface->get_alloc_size(buft, t) : loom_nbytes(t);
}

bool loom_buft_is_host(loom_buft_t buft) {
    LOOM_ASSERT(buft != NULL);
    return buft->iface->is_host ? buft->iface->is_host(buft) : false;
}

loom_dev_t loom_buft_device(loom_buft_t buft) {
    LOOM_ASSERT(buft != NULL);
    return buft->device;
}

/* ---------------------------------------------------------------- buffers */

loom_buffer_t loom_buffer_init(loom_buft_t buft, const struct loom_buffer_i *iface, void *context,
                               size_t size) {
    LOOM_ASSERT(iface != NULL && iface->get_base != NULL);
    loom_buffer_t buf = loom_malloc(sizeof *buf);
    if (!buf) return NULL;
    buf->iface = iface;
    buf->buft = buft;
    buf->context = context;
    buf->size = size;
    buf->usage = LOOM_BUFFER_USAGE_ANY;
    return buf;
}

void loom_buffer_free(loom_buffer_t buf) {
    if (!buf) return;
    if (buf->iface->free_buffer) buf->iface->free_buffer(buf);
    loom_free(buf);
}

size_t loom_buffer_size(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return buf->size;
}

void *loom_buffer_base(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return buf->iface->get_base(buf);
}

loom_buft_t loom_buffer_buft(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return buf->buft;
}

const char *loom_buffer_name(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return loom_buft_name(buf->buft);
}

bool loom_buffer_is_host(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return loom_buft_is_host(buf->buft);
}

void loom_buffer_set_usage(loom_buffer_t buf, loom_buffer_usage usage) {
    LOOM_ASSERT(buf != NULL);
    buf->usage = usage;
}

loom_buffer_usage loom_buffer_get_usage(loom_buffer_t buf) {
    LOOM_ASSERT(buf != NULL);
    return buf->usage;
}

void loom_buffer_clear(loom_buffer_t buf, uint8_t value) {
    LOOM_ASSERT(buf != NULL);
    if (buf->size == 0) return;
    buf->iface->clear(buf, value);
}

static loom_status loom__init_tensor(loom_buffer_t buf, loom_tensor *t) {
    if (!buf->iface->init_tensor) return LOOM_OK;
    loom_status s = buf->iface->init_tensor(buf, t);
    if (s != LOOM_OK && loom_last_status() == LOOM_OK) {
        loom_error(s, "%s: cannot initialise tensor '%s'", loom_buffer_name(buf), t->name);
    }
    return s;
}

loom_status loom_buffer_alloc_tensor(loom_buffer_t buf, loom_tensor *t, size_t offset) {
    if (!buf || !t) return loom_error(LOOM_ERR_INVALID_ARG, "loom_buffer_alloc_tensor: NULL");
    if (t->buffer || t->data) {
        return loom_error(LOOM_ERR_INVALID_ARG, "tensor '%s' is already allocated", t->name);
    }
    if (t->view_src) {
        return loom_error(LOOM_ERR_INVALID_ARG, "tensor '%s' is a view: use loom_buffer_init_view",
                          t->name);
    }
    size_t size = loom_buft_alloc_size(buf->buft, t);
    if (offset > buf->size || size > buf->size - offset) {
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "tensor '%s' (%zu bytes at offset %zu) does not fit in buffer %s "
                          "of %zu bytes",
                          t->name, size, offset, loom_buffer_name(buf), buf->size);
    }
    t->buffer = buf;
    t->data = (char *)loom_buffer_base(buf) + offset;
    loom_status s = loom__init_tensor(buf, t);
    if (s != LOOM_OK) {
        t->buffer = NULL;
        t->data = NULL;
    }
    return s;
}

loom_status loom_buffer_init_view(loom_tensor *t) {
    if (!t) return loom_error(LOOM_ERR_INVALID_ARG, "loom_buffer_init_view: NULL tensor");
    if (!t->view_src) {
        return loom_error(LOOM_ERR_INVALID_ARG, "tensor '%s' is not a view", t->name);
    }
    if (!t->view_src->buffer || !t->view_src->data) {
        return loom_error(LOOM_ERR_INVALID_ARG, "view '%s': its source '%s' is not allocated",
                          t->name, t->view_src->name);
    }
    if (t->buffer) {
        return loom_error(LOOM_ERR_INVALID_ARG, "view '%s' is already initialised", t->name);
    }
    t->buffer = t->view_src->buffer;
    t->data = (char *)t->view_src->data + t->view_offs;
    loom_status s = loom__init_tensor(t->buffer, t);
    if (s != LOOM_OK) {
        t->buffer = NULL;
        t->data = NULL;
    }
    return s;
}

static size_t loom__align_up(size_t n, size_t align) {
    return (n + align - 1) / align * align;
}

loom_buffer_t loom_alloc_ctx_tensors(loom_ctx *ctx, loom_buft_t buft) {
    if (!ctx || !buft) {
        loom_error(LOOM_ERR_INVALID_ARG, "loom_alloc_ctx_tensors: NULL context or buffer type");
        return NULL;
    }
    if (!loom_ctx_get_no_alloc(ctx)) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "loom_alloc_ctx_tensors: the context must be no_alloc (its tensors already "
                   "have host data)");
        return NULL;
    }
    size_t align = loom_buft_alignment(buft);
    size_t total = 0;
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t)) {
        if (t->data || t->view_src) continue;
        size_t need = loom__align_up(loom_buft_alloc_size(buft, t), align);
        if (need > SIZE_MAX - total) {
            loom_error(LOOM_ERR_INVALID_ARG, "loom_alloc_ctx_tensors: total size overflows");
            return NULL;
        }
        total += need;
    }
    loom_buffer_t buf = loom_buft_alloc_buffer(buft, total);
    if (!buf) return NULL;

    loom_status s = LOOM_OK;
    size_t offset = 0;
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t && s == LOOM_OK;
         t = loom_ctx_next_tensor(ctx, t)) {
        if (t->data || t->view_src) continue;
        size_t need = loom__align_up(loom_buft_alloc_size(buft, t), align);
        s = loom_buffer_alloc_tensor(buf, t, offset);
        offset += need;
    }
    /* Views of tensors now allocated (view_src chains resolve in creation order). */
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t && s == LOOM_OK;
         t = loom_ctx_next_tensor(ctx, t)) {
        if (t->view_src && !t->buffer && t->view_src->buffer == buf) s = loom_buffer_init_view(t);
    }
    if (s != LOOM_OK) {
        /* Undo: leave every tensor as it was (unallocated) and free the buffer. */
        for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t)) {
            if (t->buffer == buf) {
                t->buffer = NULL;
                t->data = NULL;
                t->extra = NULL;
            }
        }
        loom_buffer_free(buf);
        return NULL;
    }
    return buf;
}

/* ---------------------------------------------------------------- tensor data */

static void loom__check_span(const loom_tensor *t, size_t offset, size_t size) {
    LOOM_ASSERT(t != NULL);
    LOOM_ASSERT(t->buffer != NULL && t->data != NULL); /* tensor not allocated */
    size_t n = loom_nbytes(t);
    LOOM_ASSERT(offset <= n && size <= n - offset); /* write/read beyond the tensor */
}

void loom_tensor_set(loom_tensor *t, const void *data, size_t offset, size_t size) {
    loom__check_span(t, offset, size);
    if (size == 0) return;
    LOOM_ASSERT(data != NULL);
    t->buffer->iface->set_tensor(t->buffer, t, data, offset, size);
}

void loom_tensor_get(const loom_tensor *t, void *data, size_t offset, size_t size) {
    loom__check_span(t, offset, size);
    if (size == 0) return;
    LOOM_ASSERT(data != NULL);
    t->buffer->iface->get_tensor(t->buffer, t, data, offset, size);
}

void loom_tensor_memset(loom_tensor *t, uint8_t value, size_t offset, size_t size) {
    loom__check_span(t, offset, size);
    if (size == 0) return;
    t->buffer->iface->memset_tensor(t->buffer, t, value, offset, size);
}

loom_status loom_tensor_copy(const loom_tensor *src, loom_tensor *dst) {
    if (!src || !dst) return loom_error(LOOM_ERR_INVALID_ARG, "loom_tensor_copy: NULL tensor");
    if (!loom_are_same_layout(src, dst)) {
        return loom_error(LOOM_ERR_SHAPE, "loom_tensor_copy: '%s' and '%s' differ in layout",
                          src->name, dst->name);
    }
    if (src == dst) return LOOM_OK;
    size_t n = loom_nbytes(src);
    loom__check_span(src, 0, n);
    loom__check_span(dst, 0, n);
    if (n == 0 || src->data == dst->data) return LOOM_OK;
    bool src_host = loom_buffer_is_host(src->buffer);
    bool dst_host = loom_buffer_is_host(dst->buffer);
    if (src_host && dst_host) {
        memmove(dst->data, src->data, n);
    } else if (dst->buffer->iface->cpy_tensor &&
               dst->buffer->iface->cpy_tensor(dst->buffer, src, dst)) {
        /* done directly by the destination buffer */
    } else if (src_host) {
        loom_tensor_set(dst, src->data, 0, n);
    } else if (dst_host) {
        loom_tensor_get(src, dst->data, 0, n);
    } else {
        void *tmp = loom_malloc(n);
        if (!tmp) {
            return loom_error(LOOM_ERR_NOMEM,
                              "loom_tensor_copy: no host memory to stage %zu "
                              "bytes from %s to %s",
                              n, loom_buffer_name(src->buffer), loom_buffer_name(dst->buffer));
        }
        loom_tensor_get(src, tmp, 0, n);
        loom_tensor_set(dst, tmp, 0, n);
        loom_free(tmp);
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- events */

loom_event_t loom_event_new(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    if (!dev->iface->event_new) return NULL;
    return dev->iface->event_new(dev);
}

void loom_event_free(loom_event_t ev) {
    if (!ev) return;
    LOOM_ASSERT(ev->device && ev->device->iface->event_free);
    ev->device->iface->event_free(ev->device, ev);
}

void loom_event_record(loom_event_t ev, loom_backend_t backend) {
    LOOM_ASSERT(ev != NULL && backend != NULL);
    LOOM_ASSERT(backend->iface->event_record != NULL); /* backend has no events */
    backend->iface->event_record(backend, ev);
}

void loom_event_synchronize(loom_event_t ev) {
    LOOM_ASSERT(ev != NULL && ev->device != NULL);
    LOOM_ASSERT(ev->device->iface->event_synchronize != NULL);
    ev->device->iface->event_synchronize(ev->device, ev);
}

void loom_event_wait(loom_backend_t backend, loom_event_t ev) {
    LOOM_ASSERT(ev != NULL && backend != NULL);
    LOOM_ASSERT(backend->iface->event_wait != NULL); /* backend has no events */
    backend->iface->event_wait(backend, ev);
}

/* ---------------------------------------------------------------- backends */

const char *loom_backend_name(loom_backend_t backend) {
    LOOM_ASSERT(backend != NULL);
    if (backend->iface->get_name) return backend->iface->get_name(backend);
    return loom_dev_name(backend->device);
}

void loom_backend_free(loom_backend_t backend) {
    if (!backend) return;
    backend->iface->free(backend);
}

loom_dev_t loom_backend_device(loom_backend_t backend) {
    LOOM_ASSERT(backend != NULL);
    return backend->device;
}

loom_buft_t loom_backend_default_buft(loom_backend_t backend) {
    LOOM_ASSERT(backend != NULL);
    return loom_dev_buffer_type(backend->device);
}

loom_buffer_t loom_backend_alloc_buffer(loom_backend_t backend, size_t size) {
    return loom_buft_alloc_buffer(loom_backend_default_buft(backend), size);
}

void loom_backend_tensor_set_async(loom_backend_t backend, loom_tensor *t, const void *data,
                                   size_t offset, size_t size) {
    LOOM_ASSERT(backend != NULL);
    if (!backend->iface->set_tensor_async) {
        loom_tensor_set(t, data, offset, size);
        return;
    }
    loom__check_span(t, offset, size);
    if (size == 0) return;
    LOOM_ASSERT(data != NULL);
    backend->iface->set_tensor_async(backend, t, data, offset, size);
}

void loom_backend_tensor_get_async(loom_backend_t backend, const loom_tensor *t, void *data,
                                   size_t offset, size_t size) {
    LOOM_ASSERT(backend != NULL);
    if (!backend->iface->get_tensor_async) {
        loom_tensor_get(t, data, offset, size);
        return;
    }
    loom__check_span(t, offset, size);
    if (size == 0) return;
    LOOM_ASSERT(data != NULL);
    backend->iface->get_tensor_async(backend, t, data, offset, size);
}

loom_status loom_backend_tensor_copy_async(loom_backend_t backend_src, loom_backend_t backend_dst,
                                           const loom_tensor *src, loom_tensor *dst) {
    LOOM_ASSERT(backend_src != NULL && backend_dst != NULL);
    if (!src || !dst) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_backend_tensor_copy_async: NULL tensor");
    }
    if (!loom_are_same_layout(src, dst)) {
        return loom_error(LOOM_ERR_SHAPE,
                          "loom_backend_tensor_copy_async: '%s' and '%s' differ in layout",
                          src->name, dst->name);
    }
    if (src == dst) return LOOM_OK;
    loom__check_span(src, 0, loom_nbytes(src));
    loom__check_span(dst, 0, loom_nbytes(dst));
    if (backend_dst->iface->cpy_tensor_async &&
        backend_dst->iface->cpy_tensor_async(backend_src, backend_dst, src, dst)) {
        return LOOM_OK;
    }
    /* No direct path: make both streams idle so neither reads or writes mid-copy. */
    loom_backend_synchronize(backend_src);
    loom_backend_synchronize(backend_dst);
    return loom_tensor_copy(src, dst);
}

loom_status loom_backend_synchronize(loom_backend_t backend) {
    LOOM_ASSERT(backend != NULL);
    if (backend->iface->synchronize) backend->iface->synchronize(backend);
    /* the hook records its own message (loom_error) */
    return backend->iface->get_status ? backend->iface->get_status(backend) : LOOM_OK;
}

loom_status loom_backend_synchronize_keep(loom_backend_t backend, loom_status *first, char *msg,
                                          size_t msg_size) {
    loom_status st = loom_backend_synchronize(backend);
    if (st != LOOM_OK && *first == LOOM_OK) {
        *first = st;
        if (msg && msg_size) snprintf(msg, msg_size, "%s", loom_last_error());
    }
    return st;
}

loom_status loom_backend_graph_compute_async(loom_backend_t backend, loom_graph *g) {
    LOOM_ASSERT(backend != NULL);
    if (!g) return loom_error(LOOM_ERR_INVALID_ARG, "loom_backend_graph_compute: NULL graph");
    loom_clear_error();
    loom_status s = backend->iface->graph_compute(backend, g);
    if (s != LOOM_OK && !loom__import_error(backend->device) && loom_last_status() == LOOM_OK) {
        loom_error(s, "%s: graph compute failed", loom_backend_name(backend));
    }
    return s;
}

loom_status loom_backend_graph_compute(loom_backend_t backend, loom_graph *g) {
    loom_status s = loom_backend_graph_compute_async(backend, g);
    if (s != LOOM_OK) return s;
    return loom_backend_synchronize(backend);
}

void loom_backend_graph_optimize(loom_backend_t backend, loom_graph *g) {
    LOOM_ASSERT(backend != NULL);
    if (backend->iface->graph_optimize && g) backend->iface->graph_optimize(backend, g);
}

void loom_backend_split_begin(loom_backend_t backend) {
    if (backend && backend->iface->split_begin) backend->iface->split_begin(backend);
}

void loom_backend_split_end(loom_backend_t backend) {
    if (backend && backend->iface->split_end) backend->iface->split_end(backend);
}

bool loom_backend_supports_op(loom_backend_t backend, const loom_tensor *op) {
    LOOM_ASSERT(backend != NULL);
    return loom_dev_supports_op(backend->device, op);
}

bool loom_backend_supports_buft(loom_backend_t backend, loom_buft_t buft) {
    LOOM_ASSERT(backend != NULL);
    return loom_dev_supports_buft(backend->device, buft);
}

bool loom_backend_offload_op(loom_backend_t backend, const loom_tensor *op) {
    LOOM_ASSERT(backend != NULL);
    return loom_dev_offload_op(backend->device, op);
}

/* ---------------------------------------------------------------- devices */

const char *loom_dev_name(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    return dev->iface->get_name(dev);
}

const char *loom_dev_description(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    if (dev->iface->get_description) return dev->iface->get_description(dev);
    return loom_dev_name(dev);
}

void loom_dev_memory(loom_dev_t dev, size_t *free, size_t *total) {
    LOOM_ASSERT(dev != NULL);
    size_t f = 0, t = 0;
    dev->iface->get_memory(dev, &f, &t);
    if (free) *free = f;
    if (total) *total = t;
}

loom_dev_type loom_dev_get_type(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    return dev->iface->get_type(dev);
}

void loom_dev_get_props(loom_dev_t dev, loom_dev_props *props) {
    LOOM_ASSERT(dev != NULL && props != NULL);
    memset(props, 0, sizeof *props);
    dev->iface->get_props(dev, props);
}

loom_reg_t loom_dev_reg(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    return dev->reg;
}

loom_backend_t loom_dev_init(loom_dev_t dev, const char *params) {
    LOOM_ASSERT(dev != NULL);
    loom_clear_error();
    loom_backend_t b = dev->iface->init_backend(dev, params);
    if (!b && !loom__import_error(dev) && loom_last_status() == LOOM_OK) {
        loom_error(LOOM_ERR_DEVICE, "%s: cannot create a backend", loom_dev_name(dev));
    }
    return b;
}

loom_buft_t loom_dev_buffer_type(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    return dev->iface->get_buffer_type(dev);
}

loom_buft_t loom_dev_host_buffer_type(loom_dev_t dev) {
    LOOM_ASSERT(dev != NULL);
    return dev->iface->get_host_buffer_type ? dev->iface->get_host_buffer_type(dev) : NULL;
}

bool loom_dev_supports_op(loom_dev_t dev, const loom_tensor *op) {
    LOOM_ASSERT(dev != NULL && op != NULL);
    return dev->iface->supports_op(dev, op);
}

bool loom_dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    LOOM_ASSERT(dev != NULL);
    if (!buft) return false;
    return dev->iface->supports_buft(dev, buft);
}

bool loom_dev_offload_op(loom_dev_t dev, const loom_tensor *op) {
    LOOM_ASSERT(dev != NULL && op != NULL);
    return dev->iface->offload_op ? dev->iface->offload_op(dev, op) : false;
}

int64_t loom_op_batch_size(const loom_tensor *op) {
    LOOM_ASSERT(op != NULL);
    switch (op->op) {
    case LOOM_OP_GET_ROWS:
        return 0; /* a lookup: never worth moving a weight for */
    case LOOM_OP_MUL_MAT:
        return op->ne[1];
    case LOOM_OP_MUL_MAT_ID:
        return op->ne[2];
    default:
        return loom_nrows(op);
    }
}

/* ---------------------------------------------------------------- regs */

const char *loom_reg_name(loom_reg_t reg) {
    LOOM_ASSERT(reg != NULL);
    return reg->iface->get_name(reg);
}

size_t loom_reg_dev_count(loom_reg_t reg) {
    LOOM_ASSERT(reg != NULL);
    return reg->iface->get_device_count(reg);
}

loom_dev_t loom_reg_dev_get(loom_reg_t reg, size_t index) {
    LOOM_ASSERT(reg != NULL);
    if (index >= loom_reg_dev_count(reg)) return NULL;
    return reg->iface->get_device(reg, index);
}

void *loom_reg_get_proc_address(loom_reg_t reg, const char *name) {
    LOOM_ASSERT(reg != NULL);
    if (!name || !reg->iface->get_proc_address) return NULL;
    return reg->iface->get_proc_address(reg, name);
}
