/*
 * CUDA memory: each device's buffer type "CUDAk" (cudaMalloc; only set/get/memset/copy and
 * the device's kernels reach it) and the reg's pinned host buffer type "CUDA_Host"
 * (cudaHostAlloc, portable: page-locked for every GPU, so transfers from it are truly
 * asynchronous; host-visible like CPU memory).
 *
 * The synchronous buffer methods use the per-thread default stream of the buffer's GPU,
 * made to wait first for the work issued so far on every live backend of the device
 * (loom__cuda_dev_order: event waits, no host blocking), and then wait for it: a
 * synchronous read right after an async compute sees its results, and a synchronous write
 * does not overtake work still reading the old contents. Copies between device buffers go device to
 * device on one GPU, peer to peer between GPUs that allow it, and are declined otherwise (the
 * caller then stages them through host memory). A failing allocation returns NULL with
 * LOOM_ERR_DEVICE_OOM naming the device and the size.
 */
#define _POSIX_C_SOURCE 200809L /* pthread */
#include <string.h>

#include "backends/cuda/cuda-impl.h"

typedef struct loom__cuda_buffer {
    loom__cuda_dev *cd;
    void *data;
    uint64_t version; /* see loom__cuda_buffer_version; atomic */
} loom__cuda_buffer;

/* Versions of every device buffer of the process: each allocation and each write takes the
 * next, so no two states of any two buffers share one. */
static uint64_t loom__cuda_version_seq;

static uint64_t loom__cuda_next_version(void) {
    return __atomic_add_fetch(&loom__cuda_version_seq, 1, __ATOMIC_RELAXED);
}

void loom__cuda_buffer_touch(loom_buffer_t buf) {
    if (!loom__cuda_buffer_dev(buf)) return;
    loom__cuda_buffer *cb = buf->context;
    __atomic_store_n(&cb->version, loom__cuda_next_version(), __ATOMIC_RELEASE);
}

void loom__cuda_tensor_touch(const loom_tensor *t) {
    if (!t) return;
    loom__cuda_buffer_touch(t->view_src && t->view_src->buffer ? t->view_src->buffer : t->buffer);
}

uint64_t loom__cuda_buffer_version(loom_buffer_t buf) {
    if (!loom__cuda_buffer_dev(buf)) return 0;
    return __atomic_load_n(&((loom__cuda_buffer *)buf->context)->version, __ATOMIC_ACQUIRE);
}

/* Buffer failures in void hooks: logged, since a synchronous set/get has no status. */
static void loom__cuda_buffer_fail(void) {
    LOOM_LOG_ERROR("%s", loom_last_error());
}

/* ---------------------------------------------------------------- device buffers */

static void loom__cuda_buffer_free(loom_buffer_t buf) {
    loom__cuda_buffer *cb = buf->context;
    loom__cuda_dev *cd = cb->cd;
    if (LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id)) != LOOM_OK ||
        LOOM_CUDA_CHECK(cd->name, cudaFree(cb->data)) != LOOM_OK) {
        loom__cuda_buffer_fail();
    }
    pthread_mutex_lock(&cd->mu);
    cd->n_buffers--;
    pthread_mutex_unlock(&cd->mu);
    loom_free(cb);
}

static void *loom__cuda_buffer_base(loom_buffer_t buf) {
    return ((loom__cuda_buffer *)buf->context)->data;
}

static loom__cuda_dev *loom__cuda_buffer_cd(loom_buffer_t buf) {
    return ((loom__cuda_buffer *)buf->context)->cd;
}

/* A synchronous copy on the per-thread stream of cd's GPU, after cd's backends' work. */
static loom_status loom__cuda_copy_sync(loom__cuda_dev *cd, void *dst, const void *src, size_t size,
                                        enum cudaMemcpyKind kind) {
    const char *where = cd->name;
    loom_status s = LOOM_CUDA_CHECK(where, cudaSetDevice(cd->cuda_id));
    if (s == LOOM_OK) s = loom__cuda_dev_order(cd, cudaStreamPerThread);
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(where, cudaMemcpyAsync(dst, src, size, kind, cudaStreamPerThread));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(where, cudaStreamSynchronize(cudaStreamPerThread));
    return s;
}

static void loom__cuda_buffer_memset(loom_buffer_t buf, loom_tensor *t, uint8_t value,
                                     size_t offset, size_t size) {
    loom__cuda_dev *cd = loom__cuda_buffer_cd(buf);
    loom__cuda_buffer_touch(buf);
    loom_status s = LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id));
    if (s == LOOM_OK) s = loom__cuda_dev_order(cd, cudaStreamPerThread);
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(
            cd->name, cudaMemsetAsync((char *)t->data + offset, value, size, cudaStreamPerThread));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cd->name, cudaStreamSynchronize(cudaStreamPerThread));
    if (s != LOOM_OK) loom__cuda_buffer_fail();
}

static void loom__cuda_buffer_set(loom_buffer_t buf, loom_tensor *t, const void *data,
                                  size_t offset, size_t size) {
    loom__cuda_dev *cd = loom__cuda_buffer_cd(buf);
    loom__cuda_buffer_touch(buf);
    if (loom__cuda_copy_sync(cd, (char *)t->data + offset, data, size, cudaMemcpyHostToDevice) !=
        LOOM_OK)
        loom__cuda_buffer_fail();
}

static void loom__cuda_buffer_get(loom_buffer_t buf, const loom_tensor *t, void *data,
                                  size_t offset, size_t size) {
    loom__cuda_dev *cd = loom__cuda_buffer_cd(buf);
    if (loom__cuda_copy_sync(cd, data, (const char *)t->data + offset, size,
                             cudaMemcpyDeviceToHost) != LOOM_OK)
        loom__cuda_buffer_fail();
}

/* Direct copies into this buffer: from host memory, from the same GPU, or from a GPU this
 * one can reach peer to peer. */
static bool loom__cuda_buffer_cpy(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst) {
    loom__cuda_dev *dd = loom__cuda_buffer_cd(buf);
    const size_t n = loom_nbytes(src);
    loom__cuda_dev *sd = loom__cuda_buffer_dev(src->buffer);
    loom_status s;
    loom__cuda_buffer_touch(buf);
    if (sd) {
        if (sd->cuda_id == dd->cuda_id) {
            s = LOOM_CUDA_CHECK(dd->name, cudaSetDevice(dd->cuda_id));
            if (s == LOOM_OK && sd != dd) s = loom__cuda_dev_order(sd, cudaStreamPerThread);
            if (s == LOOM_OK)
                s = loom__cuda_copy_sync(dd, dst->data, src->data, n, cudaMemcpyDeviceToDevice);
        } else if (loom__cuda_peer_ok(dd->cuda_id, sd->cuda_id)) {
            s = LOOM_CUDA_CHECK(dd->name, cudaSetDevice(dd->cuda_id));
            if (s == LOOM_OK) s = loom__cuda_dev_order(sd, cudaStreamPerThread);
            if (s == LOOM_OK) s = loom__cuda_dev_order(dd, cudaStreamPerThread);
            if (s == LOOM_OK)
                s = LOOM_CUDA_CHECK(dd->name,
                                    cudaMemcpyPeerAsync(dst->data, dd->cuda_id, src->data,
                                                        sd->cuda_id, n, cudaStreamPerThread));
            if (s == LOOM_OK)
                s = LOOM_CUDA_CHECK(dd->name, cudaStreamSynchronize(cudaStreamPerThread));
        } else {
            return false;
        }
    } else if (src->buffer && loom_buffer_is_host(src->buffer)) {
        s = loom__cuda_copy_sync(dd, dst->data, src->data, n, cudaMemcpyHostToDevice);
    } else {
        return false;
    }
    if (s != LOOM_OK) loom__cuda_buffer_fail();
    return true;
}

static void loom__cuda_buffer_clear(loom_buffer_t buf, uint8_t value) {
    loom__cuda_dev *cd = loom__cuda_buffer_cd(buf);
    loom__cuda_buffer_touch(buf);
    loom_status s = LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id));
    if (s == LOOM_OK) s = loom__cuda_dev_order(cd, cudaStreamPerThread);
    if (s == LOOM_OK)
        s = LOOM_CUDA_CHECK(cd->name, cudaMemsetAsync(loom__cuda_buffer_base(buf), value, buf->size,
                                                      cudaStreamPerThread));
    if (s == LOOM_OK) s = LOOM_CUDA_CHECK(cd->name, cudaStreamSynchronize(cudaStreamPerThread));
    if (s != LOOM_OK) loom__cuda_buffer_fail();
}

static const struct loom_buffer_i loom__cuda_buffer_i = {
    .free_buffer = loom__cuda_buffer_free,
    .get_base = loom__cuda_buffer_base,
    .memset_tensor = loom__cuda_buffer_memset,
    .set_tensor = loom__cuda_buffer_set,
    .get_tensor = loom__cuda_buffer_get,
    .cpy_tensor = loom__cuda_buffer_cpy,
    .clear = loom__cuda_buffer_clear,
};

loom__cuda_dev *loom__cuda_buffer_dev(loom_buffer_t buf) {
    if (!buf || buf->iface != &loom__cuda_buffer_i) return NULL;
    return loom__cuda_buffer_cd(buf);
}

/* ---------------------------------------------------------------- device buffer type */

static const char *loom__cuda_buft_name(loom_buft_t buft) {
    return ((loom__cuda_dev *)buft->context)->name;
}

static loom_buffer_t loom__cuda_buft_alloc(loom_buft_t buft, size_t size) {
    loom__cuda_dev *cd = buft->context;
    char s_req[32];
    loom__cuda_format_size(size, s_req, sizeof s_req);
    if (LOOM_CUDA_CHECK(cd->name, cudaSetDevice(cd->cuda_id)) != LOOM_OK) return NULL;
    void *data = NULL;
    cudaError_t e = cudaMalloc(&data, size);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        char s_free[32] = "?", s_total[32] = "?";
        if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
            loom__cuda_format_size(f, s_free, sizeof s_free);
            loom__cuda_format_size(t, s_total, sizeof s_total);
        } else {
            (void)cudaGetLastError();
        }
        loom_error(e == cudaErrorMemoryAllocation ? LOOM_ERR_DEVICE_OOM : LOOM_ERR_DEVICE,
                   "%s: out of memory allocating %s (%zu bytes): cudaMalloc failed: %s (%s); "
                   "GPU %d has %s of %s free",
                   cd->name, s_req, size, cudaGetErrorString(e), cudaGetErrorName(e), cd->cuda_id,
                   s_free, s_total);
        return NULL;
    }
    loom__cuda_buffer *cb = loom_malloc(sizeof *cb);
    loom_buffer_t buf = cb ? loom_buffer_init(buft, &loom__cuda_buffer_i, cb, size) : NULL;
    if (!buf) {
        loom_free(cb);
        (void)cudaFree(data);
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for a buffer of %s", cd->name, s_req);
        return NULL;
    }
    cb->cd = cd;
    cb->data = data;
    cb->version = loom__cuda_next_version();
    pthread_mutex_lock(&cd->mu);
    cd->n_buffers++;
    pthread_mutex_unlock(&cd->mu);
    return buf;
}

static size_t loom__cuda_buft_alignment(loom_buft_t buft) {
    (void)buft;
    return LOOM_CUDA_ALIGNMENT;
}

static size_t loom__cuda_buft_max_size(loom_buft_t buft) {
    return ((loom__cuda_dev *)buft->context)->gpu_total_mem;
}

static bool loom__cuda_buft_is_host(loom_buft_t buft) {
    (void)buft;
    return false;
}

const struct loom_buft_i loom__cuda_buft_i = {
    .get_name = loom__cuda_buft_name,
    .alloc_buffer = loom__cuda_buft_alloc,
    .get_alignment = loom__cuda_buft_alignment,
    .get_max_size = loom__cuda_buft_max_size,
    .is_host = loom__cuda_buft_is_host,
};

/* ---------------------------------------------------------------- pinned host buffers */

static void loom__cuda_host_buffer_free(loom_buffer_t buf) {
    loom__cuda_reg *cr = buf->buft->context;
    if (LOOM_CUDA_CHECK(cr->host_name, cudaFreeHost(buf->context)) != LOOM_OK)
        loom__cuda_buffer_fail();
}

static void *loom__cuda_host_buffer_base(loom_buffer_t buf) {
    return buf->context;
}

static void loom__cuda_host_buffer_memset(loom_buffer_t buf, loom_tensor *t, uint8_t value,
                                          size_t offset, size_t size) {
    (void)buf;
    memset((char *)t->data + offset, value, size);
}

static void loom__cuda_host_buffer_set(loom_buffer_t buf, loom_tensor *t, const void *data,
                                       size_t offset, size_t size) {
    (void)buf;
    memcpy((char *)t->data + offset, data, size);
}

static void loom__cuda_host_buffer_get(loom_buffer_t buf, const loom_tensor *t, void *data,
                                       size_t offset, size_t size) {
    (void)buf;
    memcpy(data, (const char *)t->data + offset, size);
}

/* From host memory (memmove) or from a CUDA device buffer (device to host). */
static bool loom__cuda_host_buffer_cpy(loom_buffer_t buf, const loom_tensor *src,
                                       loom_tensor *dst) {
    (void)buf;
    const size_t n = loom_nbytes(src);
    loom__cuda_dev *sd = loom__cuda_buffer_dev(src->buffer);
    if (sd) {
        if (loom__cuda_copy_sync(sd, dst->data, src->data, n, cudaMemcpyDeviceToHost) != LOOM_OK)
            loom__cuda_buffer_fail();
        return true;
    }
    if (src->buffer && loom_buffer_is_host(src->buffer)) {
        memmove(dst->data, src->data, n);
        return true;
    }
    return false;
}

static void loom__cuda_host_buffer_clear(loom_buffer_t buf, uint8_t value) {
    memset(buf->context, value, buf->size);
}

static const struct loom_buffer_i loom__cuda_host_buffer_i = {
    .free_buffer = loom__cuda_host_buffer_free,
    .get_base = loom__cuda_host_buffer_base,
    .memset_tensor = loom__cuda_host_buffer_memset,
    .set_tensor = loom__cuda_host_buffer_set,
    .get_tensor = loom__cuda_host_buffer_get,
    .cpy_tensor = loom__cuda_host_buffer_cpy,
    .clear = loom__cuda_host_buffer_clear,
};

static const char *loom__cuda_host_buft_name(loom_buft_t buft) {
    return ((loom__cuda_reg *)buft->context)->host_name;
}

static loom_buffer_t loom__cuda_host_buft_alloc(loom_buft_t buft, size_t size) {
    loom__cuda_reg *cr = buft->context;
    void *data = NULL;
    cudaError_t e = cudaHostAlloc(&data, size, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char s_req[32];
        loom__cuda_format_size(size, s_req, sizeof s_req);
        loom_error(LOOM_ERR_NOMEM,
                   "%s: cannot allocate %s (%zu bytes) of pinned host memory: cudaHostAlloc "
                   "failed: %s (%s)",
                   cr->host_name, s_req, size, cudaGetErrorString(e), cudaGetErrorName(e));
        return NULL;
    }
    loom_buffer_t buf = loom_buffer_init(buft, &loom__cuda_host_buffer_i, data, size);
    if (!buf) {
        (void)cudaFreeHost(data);
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for a buffer", cr->host_name);
    }
    return buf;
}

static size_t loom__cuda_host_buft_alignment(loom_buft_t buft) {
    (void)buft;
    return LOOM_CUDA_HOST_ALIGNMENT;
}

static bool loom__cuda_host_buft_is_host(loom_buft_t buft) {
    (void)buft;
    return true;
}

const struct loom_buft_i loom__cuda_host_buft_i = {
    .get_name = loom__cuda_host_buft_name,
    .alloc_buffer = loom__cuda_host_buft_alloc,
    .get_alignment = loom__cuda_host_buft_alignment,
    .is_host = loom__cuda_host_buft_is_host,
};
