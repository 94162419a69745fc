/*
 * NUMA devices: reg "NUMA" with one CPU-kind device per NUMA node of the topology
 * (loom_topo_get: this machine, or LOOM_TOPOLOGY). Device "NUMA<i>" runs the CPU kernels on
 * threads confined to node i's cores, and its buffer type "NUMA<i>" allocates on node i
 * (hwloc membind), so the meta device sees N devices with their own memory. Where the
 * topology is not this machine's, both bindings are logged once and skipped: the devices
 * still compute exactly like the CPU device.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu-numa.h"
#include "loom/cpu.h"

#define NUMA_MAX 64
#define NUMA_ALIGNMENT 64

typedef struct numa_dev {
    struct loom_dev dev;
    struct loom_buft buft;
    int node; /* logical NUMA node */
    char name[16];
    char desc[128];
    uint64_t memory;
    int n_pus;
} numa_dev;

static numa_dev numa_devs[NUMA_MAX];
static int numa_n;
static loom_topo *numa_topo;

/* ---------------------------------------------------------------- buffers */

static void *numa_buffer_get_base(loom_buffer_t buf) {
    return buf->context;
}

static void numa_buffer_free(loom_buffer_t buf) {
    loom_topo_free_mem(numa_topo, buf->context, buf->size);
}

static void numa_buffer_memset_tensor(loom_buffer_t buf, loom_tensor *t, uint8_t value,
                                      size_t offset, size_t size) {
    (void)buf;
    memset((char *)t->data + offset, value, size);
}

static void numa_buffer_set_tensor(loom_buffer_t buf, loom_tensor *t, const void *data,
                                   size_t offset, size_t size) {
    (void)buf;
    memcpy((char *)t->data + offset, data, size);
}

static void numa_buffer_get_tensor(loom_buffer_t buf, const loom_tensor *t, void *data,
                                   size_t offset, size_t size) {
    (void)buf;
    memcpy(data, (const char *)t->data + offset, size);
}

static bool numa_buffer_cpy_tensor(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst) {
    (void)buf;
    if (!src->buffer || !loom_buffer_is_host(src->buffer)) return false;
    memcpy(dst->data, src->data, loom_nbytes(src));
    return true;
}

static void numa_buffer_clear(loom_buffer_t buf, uint8_t value) {
    memset(buf->context, value, buf->size);
}

static const struct loom_buffer_i numa_buffer_i = {
    .free_buffer = numa_buffer_free,
    .get_base = numa_buffer_get_base,
    .memset_tensor = numa_buffer_memset_tensor,
    .set_tensor = numa_buffer_set_tensor,
    .get_tensor = numa_buffer_get_tensor,
    .cpy_tensor = numa_buffer_cpy_tensor,
    .clear = numa_buffer_clear,
};

/* ---------------------------------------------------------------- buffer type */

static const char *numa_buft_get_name(loom_buft_t buft) {
    return ((numa_dev *)buft->context)->name;
}

static loom_buffer_t numa_buft_alloc_buffer(loom_buft_t buft, size_t size) {
    numa_dev *nd = buft->context;
    void *base = loom_topo_alloc_on_node(numa_topo, nd->node, size);
    if (!base) {
        loom_error(LOOM_ERR_NOMEM,
                   "%s buffer: cannot allocate %zu bytes (%.1f MiB) on NUMA node %d", nd->name,
                   size, (double)size / (1024.0 * 1024.0), nd->node);
        return NULL;
    }
    loom_buffer_t buf = loom_buffer_init(buft, &numa_buffer_i, base, size);
    if (!buf) {
        loom_topo_free_mem(numa_topo, base, size);
        loom_error(LOOM_ERR_NOMEM, "%s buffer: cannot allocate the buffer object", nd->name);
    }
    return buf;
}

static size_t numa_buft_get_alignment(loom_buft_t buft) {
    (void)buft;
    return NUMA_ALIGNMENT;
}

static bool numa_buft_is_host(loom_buft_t buft) {
    (void)buft;
    return true;
}

static const struct loom_buft_i numa_buft_i = {
    .get_name = numa_buft_get_name,
    .alloc_buffer = numa_buft_alloc_buffer,
    .get_alignment = numa_buft_get_alignment,
    .is_host = numa_buft_is_host,
};

/* ---------------------------------------------------------------- device */

static const char *numa_dev_get_name(loom_dev_t dev) {
    return ((numa_dev *)dev->context)->name;
}

static const char *numa_dev_get_description(loom_dev_t dev) {
    return ((numa_dev *)dev->context)->desc;
}

/* The node's own memory (hwloc reports no free figure per node: free = total). */
static void numa_dev_get_memory(loom_dev_t dev, size_t *free_mem, size_t *total) {
    numa_dev *nd = dev->context;
    if (free_mem) *free_mem = (size_t)nd->memory;
    if (total) *total = (size_t)nd->memory;
}

static loom_dev_type numa_dev_get_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_CPU;
}

static void numa_dev_get_props(loom_dev_t dev, loom_dev_props *props) {
    props->name = numa_dev_get_name(dev);
    props->description = numa_dev_get_description(dev);
    numa_dev_get_memory(dev, &props->memory_free, &props->memory_total);
    props->type = LOOM_DEV_TYPE_CPU;
    props->caps.async = false;
    props->caps.host_buffer = false;
    props->caps.events = false;
}

/* Threads by default: the node's PUs; on a topology of another machine, this machine's
 * CPUs shared out in proportion to the node's PUs (at least 1). */
static int numa_default_threads(const numa_dev *nd) {
    if (loom_topo_is_this_system(numa_topo)) return nd->n_pus > 0 ? nd->n_pus : 1;
    int total = loom_topo_count(numa_topo, LOOM_TOPO_PU);
    int n = total > 0 ? (int)((int64_t)loom_n_cpus() * nd->n_pus / total) : 1;
    return n > 0 ? n : 1;
}

static loom_backend_t numa_dev_init_backend(loom_dev_t dev, const char *params) {
    numa_dev *nd = dev->context;
    int threads = 0;
    if (!loom__cpu_parse_params(params, &threads)) return NULL;
    if (threads <= 0) threads = numa_default_threads(nd);
    loom_affinity a = loom_cpu_affinity(NULL, 0);
    /* on NUMA devices the default keeps every thread on its node */
    if (loom_cpu_affinity_is_default()) a = LOOM_AFFINITY_NUMA;
    return loom__cpu_backend_new_on(dev, threads, nd->node, a, true);
}

static loom_buft_t numa_dev_get_buffer_type(loom_dev_t dev) {
    return &((numa_dev *)dev->context)->buft;
}

static bool numa_dev_supports_op(loom_dev_t dev, const loom_tensor *op) {
    (void)dev;
    return loom_cpu_supports_op(op);
}

/* Its own node's memory and plain host memory; another node's buffers are copied in by
 * the scheduler, so each node computes on local memory (and layer split spreads). */
static bool numa_dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    return buft && (buft == &((numa_dev *)dev->context)->buft || buft == loom_cpu_buffer_type());
}

static const struct loom_dev_i numa_dev_i = {
    .get_name = numa_dev_get_name,
    .get_description = numa_dev_get_description,
    .get_memory = numa_dev_get_memory,
    .get_type = numa_dev_get_type,
    .get_props = numa_dev_get_props,
    .init_backend = numa_dev_init_backend,
    .get_buffer_type = numa_dev_get_buffer_type,
    .supports_op = numa_dev_supports_op,
    .supports_buft = numa_dev_supports_buft,
};

/* ---------------------------------------------------------------- reg */

static const char *numa_reg_get_name(loom_reg_t reg) {
    (void)reg;
    return "NUMA";
}

static size_t numa_reg_get_device_count(loom_reg_t reg) {
    (void)reg;
    return (size_t)numa_n;
}

static loom_dev_t numa_reg_get_device(loom_reg_t reg, size_t index) {
    (void)reg;
    return index < (size_t)numa_n ? &numa_devs[index].dev : NULL;
}

static const struct loom_reg_i numa_reg_i = {
    .get_name = numa_reg_get_name,
    .get_device_count = numa_reg_get_device_count,
    .get_device = numa_reg_get_device,
};

static struct loom_reg numa_reg = {
    .api_version = LOOM_BACKEND_API_VERSION,
    .iface = &numa_reg_i,
    .context = NULL,
};

static pthread_mutex_t numa_mu = PTHREAD_MUTEX_INITIALIZER;

loom_reg_t loom_cpu_numa_reg(void) {
    pthread_mutex_lock(&numa_mu);
    loom_reg_t r = &numa_reg;
    if (!numa_topo) {
        numa_topo = loom_topo_get();
        if (!numa_topo) {
            pthread_mutex_unlock(&numa_mu);
            return NULL; /* the error says why */
        }
        int n = loom_topo_count(numa_topo, LOOM_TOPO_NUMA);
        if (n > NUMA_MAX) n = NUMA_MAX;
        for (int i = 0; i < n; i++) {
            numa_dev *nd = &numa_devs[i];
            loom_topo_numa_info info = {0};
            loom_topo_numa(numa_topo, i, &info);
            nd->node = i;
            nd->memory = info.memory;
            nd->n_pus = info.n_pus;
            snprintf(nd->name, sizeof nd->name, "NUMA%d", i);
            snprintf(nd->desc, sizeof nd->desc, "NUMA node %d (os %u) of %s: %d cores, %d PUs", i,
                     info.os_index, loom_topo_source(numa_topo), info.n_cores, info.n_pus);
            nd->dev = (struct loom_dev){.iface = &numa_dev_i, .reg = &numa_reg, .context = nd};
            nd->buft = (struct loom_buft){.iface = &numa_buft_i, .device = &nd->dev, .context = nd};
        }
        numa_n = n;
    }
    pthread_mutex_unlock(&numa_mu);
    return r;
}
