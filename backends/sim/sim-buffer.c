/*
 * sim device memory: the private buffer type "SIMk" of each device and its buffers.
 *
 * Memory is real host memory (loom_aligned_alloc) because the CPU kernels compute on it,
 * but by contract only set/get/memset/copy reach it, as with a GPU. Each allocation is
 * charged against the device's memory cap (LOOM_ERR_DEVICE_OOM beyond it), and every
 * transfer in or out (host<->device, device<->device) is charged to the link model:
 * bytes, copies, and latency + bytes / bandwidth of virtual time on each device involved.
 *
 * virtual=1: a buffer is address space only (an anonymous MAP_NORESERVE mapping, so a
 * 40 GB model costs no memory), and set/get/memset/copy/clear move nothing: they only
 * account. Reads of such memory see zeros or whatever was never written.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <string.h>
#include <sys/mman.h>

#include "backends/sim/sim-impl.h"

typedef struct loom__sim_buffer {
    loom__sim_dev *sd;
    void *data;
    size_t mapped; /* virtual=1: the mapping's length (else 0) */
} loom__sim_buffer;

static bool loom__sim_virtual(const loom__sim_dev *sd) {
    return sd->sreg->cfg.virtual_memory;
}

void loom__sim_account(loom__sim_dev *from, loom__sim_dev *to, size_t bytes) {
    loom__sim_dev *ends[2] = {from, to};
    for (int i = 0; i < 2; i++) {
        loom__sim_dev *sd = ends[i];
        if (!sd) continue;
        double t = loom_sim_link_time_us(&sd->sreg->cfg.link, bytes);
        pthread_mutex_lock(&sd->mu);
        if (i == 0) {
            sd->stats.bytes_out += bytes;
        } else {
            sd->stats.bytes_in += bytes;
        }
        sd->stats.copies++;
        sd->stats.link_time_us += t;
        /* full duplex: a device-to-device copy keeps only its receiver waiting */
        if (i == 1 || !to) sd->stats.link_wait_us += t;
        pthread_mutex_unlock(&sd->mu);
    }
}

/* ---------------------------------------------------------------- buffer methods */

static void loom__sim_buffer_free(loom_buffer_t buf) {
    loom__sim_buffer *sb = buf->context;
    loom__sim_dev *sd = sb->sd;
    if (sb->mapped)
        munmap(sb->data, sb->mapped);
    else
        loom_aligned_free(sb->data);
    pthread_mutex_lock(&sd->mu);
    sd->mem_used -= buf->size;
    sd->n_buffers--;
    pthread_mutex_unlock(&sd->mu);
    loom_free(sb);
}

static void *loom__sim_buffer_base(loom_buffer_t buf) {
    return ((loom__sim_buffer *)buf->context)->data;
}

static void loom__sim_buffer_memset(loom_buffer_t buf, loom_tensor *t, uint8_t value, size_t offset,
                                    size_t size) {
    if (loom__sim_virtual(((loom__sim_buffer *)buf->context)->sd)) return;
    memset((char *)t->data + offset, value, size); /* on the device: no link traffic */
}

static void loom__sim_buffer_set(loom_buffer_t buf, loom_tensor *t, const void *data, size_t offset,
                                 size_t size) {
    if (!loom__sim_virtual(((loom__sim_buffer *)buf->context)->sd))
        memcpy((char *)t->data + offset, data, size);
    loom__sim_account(NULL, ((loom__sim_buffer *)buf->context)->sd, size);
}

static void loom__sim_buffer_get(loom_buffer_t buf, const loom_tensor *t, void *data, size_t offset,
                                 size_t size) {
    if (!loom__sim_virtual(((loom__sim_buffer *)buf->context)->sd))
        memcpy(data, (const char *)t->data + offset, size);
    loom__sim_account(((loom__sim_buffer *)buf->context)->sd, NULL, size);
}

/* Direct copies: from host memory, or from a device of the same reg when p2p is on. */
static bool loom__sim_buffer_cpy(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst) {
    loom__sim_dev *dd = ((loom__sim_buffer *)buf->context)->sd;
    size_t n = loom_nbytes(src);
    loom__sim_dev *sdev = loom__sim_buffer_dev(src->buffer);
    if (sdev) {
        if (sdev->sreg != dd->sreg || (sdev != dd && !dd->sreg->cfg.p2p)) return false;
        if (!loom__sim_virtual(dd)) memmove(dst->data, src->data, n);
        if (sdev != dd) loom__sim_account(sdev, dd, n);
        return true;
    }
    if (loom_buffer_is_host(src->buffer)) {
        if (!loom__sim_virtual(dd)) memmove(dst->data, src->data, n);
        loom__sim_account(NULL, dd, n);
        return true;
    }
    return false;
}

static void loom__sim_buffer_clear(loom_buffer_t buf, uint8_t value) {
    if (loom__sim_virtual(((loom__sim_buffer *)buf->context)->sd)) return;
    memset(((loom__sim_buffer *)buf->context)->data, value, buf->size);
}

static const struct loom_buffer_i loom__sim_buffer_i = {
    .free_buffer = loom__sim_buffer_free,
    .get_base = loom__sim_buffer_base,
    .memset_tensor = loom__sim_buffer_memset,
    .set_tensor = loom__sim_buffer_set,
    .get_tensor = loom__sim_buffer_get,
    .cpy_tensor = loom__sim_buffer_cpy,
    .clear = loom__sim_buffer_clear,
};

loom__sim_dev *loom__sim_buffer_dev(loom_buffer_t buf) {
    if (!buf || buf->iface != &loom__sim_buffer_i) return NULL;
    return ((loom__sim_buffer *)buf->context)->sd;
}

/* ---------------------------------------------------------------- buffer type */

static const char *loom__sim_buft_name(loom_buft_t buft) {
    return ((loom__sim_dev *)buft->context)->name;
}

static loom_buffer_t loom__sim_buft_alloc(loom_buft_t buft, size_t size) {
    loom__sim_dev *sd = buft->context;
    size_t cap = sd->sreg->cfg.mem_bytes;
    pthread_mutex_lock(&sd->mu);
    size_t used = sd->mem_used;
    bool fits = used <= cap && size <= cap - used;
    if (fits) {
        sd->mem_used += size;
        if (sd->mem_used > sd->mem_peak) sd->mem_peak = sd->mem_used;
        sd->n_buffers++;
    }
    pthread_mutex_unlock(&sd->mu);
    if (!fits) {
        char s_req[32], s_used[32], s_cap[32];
        loom__sim_format_size(size, s_req, sizeof s_req);
        loom__sim_format_size(used, s_used, sizeof s_used);
        loom__sim_format_size(cap, s_cap, sizeof s_cap);
        loom_error(LOOM_ERR_DEVICE_OOM, "%s: out of memory allocating %s (%s of %s in use)",
                   sd->name, s_req, s_used, s_cap);
        return NULL;
    }
    loom__sim_buffer *sb = loom_malloc(sizeof *sb);
    void *data = NULL;
    size_t mapped = 0;
    if (sb && loom__sim_virtual(sd)) {
        mapped = size ? size : 1;
        data = mmap(NULL, mapped, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (data == MAP_FAILED) data = NULL;
    } else if (sb) {
        data = loom_aligned_alloc(LOOM_SIM_ALIGNMENT, size);
    }
    loom_buffer_t buf = data ? loom_buffer_init(buft, &loom__sim_buffer_i, sb, size) : NULL;
    if (!buf) {
        if (data && mapped)
            munmap(data, mapped);
        else
            loom_aligned_free(data);
        loom_free(sb);
        pthread_mutex_lock(&sd->mu);
        sd->mem_used -= size;
        sd->n_buffers--;
        pthread_mutex_unlock(&sd->mu);
        char s_req[32];
        loom__sim_format_size(size, s_req, sizeof s_req);
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory allocating %s of device memory",
                   sd->name, s_req);
        return NULL;
    }
    sb->sd = sd;
    sb->data = data;
    sb->mapped = mapped;
    return buf;
}

static size_t loom__sim_buft_alignment(loom_buft_t buft) {
    (void)buft;
    return LOOM_SIM_ALIGNMENT;
}

static bool loom__sim_buft_is_host(loom_buft_t buft) {
    (void)buft;
    return false;
}

const struct loom_buft_i loom__sim_buft_i = {
    .get_name = loom__sim_buft_name,
    .alloc_buffer = loom__sim_buft_alloc,
    .get_alignment = loom__sim_buft_alignment,
    .is_host = loom__sim_buft_is_host,
};
