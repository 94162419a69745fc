/*
 * The bridge's buffer type and buffers: one loom buffer of the device's buffer type (for a
 * meta device, N member buffers), with ggml's addresses equal to loom's (the same base), so
 * a ggml tensor's twin sits at the same offset. Not host memory: ggml reaches the data only
 * through set/get/memset, which scatter and gather each tensor's slices by its split state.
 */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml/bridge.h"
#include "loom/meta.h"

static const struct ggml_backend_buffer_i lg_buffer_iface;

bool lg_buffer_is_ours(const lg_device *d, const struct ggml_backend_buffer *buf) {
    /* a zero-size buffer ggml makes itself for a probe has our type but no context */
    return buf && buf->buft == &d->gbuft && buf->context &&
           buf->iface.get_base == lg_buffer_iface.get_base;
}

/* ---------------------------------------------------------------- buffer */

static void buf_free(ggml_backend_buffer_t buffer) {
    lg_buffer *b = buffer->context;
    pthread_mutex_lock(&b->d->lock);
    lg_twin_clear(b->d); /* twins may point into this buffer: rebuild them on demand */
    pthread_mutex_unlock(&b->d->lock);
    loom_buffer_free(b->lb);
    free(b);
}

static void *buf_base(ggml_backend_buffer_t buffer) {
    return ((lg_buffer *)buffer->context)->base;
}

static enum ggml_status buf_init_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor *t) {
    (void)buffer;
    (void)t;
    return GGML_STATUS_SUCCESS; /* twins are made when first used */
}

/* Runs fn on t's twin, or says why there is none. */
#define WITH_TWIN(buffer, t, what, body)                                                            \
    do {                                                                                           \
        lg_buffer *b_ = (buffer)->context;                                                         \
        pthread_mutex_lock(&b_->d->lock);                                                          \
        loom_tensor *tw = lg_twin_get(b_->d, (t));                                                 \
        if (tw) {                                                                                  \
            body;                                                                                  \
        } else {                                                                                   \
            lg_log("%s of '%s' on %s failed: %s", what, (t)->name, b_->d->name,                   \
                   loom_last_error());                                                             \
        }                                                                                          \
        pthread_mutex_unlock(&b_->d->lock);                                                        \
    } while (0)

static void buf_memset(ggml_backend_buffer_t buffer, struct ggml_tensor *t, uint8_t value,
                       size_t offset, size_t size) {
    WITH_TWIN(buffer, t, "memset", loom_tensor_memset(tw, value, offset, size));
}

static void buf_set(ggml_backend_buffer_t buffer, struct ggml_tensor *t, const void *data,
                    size_t offset, size_t size) {
    WITH_TWIN(buffer, t, "set_tensor", loom_tensor_set(tw, data, offset, size));
}

static void buf_get(ggml_backend_buffer_t buffer, const struct ggml_tensor *t, void *data,
                    size_t offset, size_t size) {
    /* never leave the caller's memory as it was: a failed read reads as NaN */
    lg_buffer *b = buffer->context;
    pthread_mutex_lock(&b->d->lock);
    loom_tensor *tw = lg_twin_get(b->d, t);
    if (tw) {
        loom_tensor_get(tw, data, offset, size);
    } else {
        lg_log("get_tensor of '%s' on %s failed: %s", t->name, b->d->name, loom_last_error());
        memset(data, 0xff, size);
    }
    pthread_mutex_unlock(&b->d->lock);
}

static void buf_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    lg_buffer *b = buffer->context;
    loom_buffer_clear(b->lb, value);
}

static const struct ggml_backend_buffer_i lg_buffer_iface = {
    .free_buffer = buf_free,
    .get_base = buf_base,
    .init_tensor = buf_init_tensor,
    .memset_tensor = buf_memset,
    .set_tensor = buf_set,
    .get_tensor = buf_get,
    .cpy_tensor = NULL, /* staged through the host */
    .clear = buf_clear,
};

/* ---------------------------------------------------------------- buffer type */

static const char *buft_name(ggml_backend_buffer_type_t buft) {
    return ((lg_device *)buft->context)->name;
}

static ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    lg_device *d = buft->context;
    lg_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        lg_log("%s: no host memory for a buffer", d->name);
        return NULL;
    }
    b->d = d;
    b->lb = loom_buft_alloc_buffer(d->lbuft, size);
    if (!b->lb) {
        lg_log("%s: cannot allocate %zu bytes: %s", d->name, size, loom_last_error());
        free(b);
        return NULL;
    }
    b->base = loom_buffer_base(b->lb);
    if (d->debug) lg_log("%s: a buffer of %zu bytes", d->name, size);
    ggml_backend_buffer_t out = ggml_backend_buffer_init(buft, lg_buffer_iface, b, size);
    if (!out) {
        loom_buffer_free(b->lb);
        free(b);
    }
    return out;
}

static size_t buft_alignment(ggml_backend_buffer_type_t buft) {
    return loom_buft_alignment(((lg_device *)buft->context)->lbuft);
}

static size_t buft_max_size(ggml_backend_buffer_type_t buft) {
    return loom_buft_max_size(((lg_device *)buft->context)->lbuft);
}

/* A tensor's share of the buffer: its largest slice when the rules split it (weights, KV
 * cache), else all of it. Asked of the split callback directly: a header made here for one
 * question must not enter loom's caches, which key on header addresses. */
static size_t buft_alloc_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor *t) {
    lg_device *d = buft->context;
    const size_t full = ggml_nbytes(t);
    if (!loom_type_traits_get((int)t->type)) return full;
    if (!d->owns_meta || d->wrapped || lg_weight_sliced(d, t)) return full;
    loom_tensor x;
    memset(&x, 0, sizeof x);
    x.type = (loom_type)t->type;
    memcpy(x.ne, t->ne, sizeof x.ne);
    memcpy(x.nb, t->nb, sizeof x.nb);
    snprintf(x.name, sizeof x.name, "%s", t->name);
    const int n = loom_meta_n_devices(d->dev);
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_MIRRORED, n);
    if (lg_leaf_state(&x, &s, d) != LOOM_OK || !loom_split_axis_is_dim(s.axis)) return full;
    size_t best = 0;
    for (int j = 0; j < n; j++) {
        const size_t nb = loom_split_state_slice_nbytes(&s, &x, j);
        if (nb > best) best = nb;
    }
    return best;
}

/* The tensors of a list ggml allocates together (a model's weights, the KV cache) placed
 * one after another, each taking its largest slice: what makes the weights of a split
 * model shrink on every member. Views and tensors that already have data take no space. */
static size_t list_layout(ggml_backend_buffer_type_t buft, struct ggml_tensor **ts, int n,
                          size_t *offs) {
    const size_t align = buft_alignment(buft);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (offs) offs[i] = SIZE_MAX;
        if (!ts[i] || ts[i]->view_src || ts[i]->data) continue;
        if (offs) offs[i] = off;
        off += (buft_alloc_size(buft, ts[i]) + align - 1) / align * align;
    }
    return off;
}

static size_t buft_alloc_size_n(ggml_backend_buffer_type_t buft, struct ggml_tensor **ts, int n) {
    return list_layout(buft, ts, n, NULL);
}

static ggml_backend_buffer_t buft_alloc_n(ggml_backend_buffer_type_t buft, struct ggml_tensor **ts,
                                          int n) {
    lg_device *d = buft->context;
    size_t *offs = n > 0 ? calloc((size_t)n, sizeof *offs) : NULL;
    if (n > 0 && !offs) {
        lg_log("%s: no host memory to place %d tensors", d->name, n);
        return NULL;
    }
    const size_t total = list_layout(buft, ts, n, offs);
    if (d->debug) lg_log("%s: %d tensors placed in %zu bytes", d->name, n, total);
    ggml_backend_buffer_t buf = buft_alloc(buft, total ? total : buft_alignment(buft));
    for (int i = 0; buf && i < n; i++) {
        if (offs[i] == SIZE_MAX) continue;
        lg_buffer *b = buf->context;
        if (ggml_backend_tensor_alloc(buf, ts[i], b->base + offs[i]) != GGML_STATUS_SUCCESS) {
            lg_log("%s: cannot place '%s'", d->name, ts[i]->name);
            ggml_backend_buffer_free(buf);
            buf = NULL;
        }
    }
    for (int i = 0; buf && i < n; i++) {
        if (ts[i] && ts[i]->view_src && !ts[i]->buffer && ts[i]->view_src->buffer == buf &&
            ggml_backend_view_init(ts[i]) != GGML_STATUS_SUCCESS) {
            lg_log("%s: cannot place the view '%s'", d->name, ts[i]->name);
            ggml_backend_buffer_free(buf);
            buf = NULL;
        }
    }
    free(offs);
    return buf;
}

static bool buft_is_host(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return false;
}

void lg_buft_init(lg_device *d) {
    d->gbuft = (struct ggml_backend_buffer_type){
        .iface =
            {
                .get_name = buft_name,
                .alloc_buffer = buft_alloc,
                .alloc_buffer_n = buft_alloc_n,
                .get_alignment = buft_alignment,
                .get_max_size = buft_max_size,
                .get_alloc_size = buft_alloc_size,
                .get_alloc_size_n = buft_alloc_size_n,
                .is_host = buft_is_host,
            },
        .device = &d->gdev,
        .context = d,
    };
}
