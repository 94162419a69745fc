/*
 * The CPU backend objects: reg "CPU" with one device "CPU", the host buffer type "CPU"
 * (64-byte aligned, host-visible), buffers over owned or caller memory, and the backend
 * (a command stream that runs graphs synchronously on a thread pool).
 *
 * Every object here is static except buffers and backends; tables are static const with
 * designated initializers naming only the hooks implemented (see backend-impl.h for the
 * defaults of the others).
 */
#define _GNU_SOURCE /* madvise, MADV_HUGEPAGE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu-numa.h"
#include "backends/cpu/repack.h"

#define CPU_NAME "CPU"
#define CPU_ALIGNMENT 64

/* ---------------------------------------------------------------- buffers */

static void *cpu_buffer_get_base(loom_buffer_t buf) {
    return buf->context;
}

static void cpu_buffer_free(loom_buffer_t buf) {
    loom_aligned_free(buf->context);
}

static void cpu_buffer_memset_tensor(loom_buffer_t buf, loom_tensor *t, uint8_t value,
                                     size_t offset, size_t size) {
    (void)buf;
    memset((char *)t->data + offset, value, size);
}

static void cpu_buffer_set_tensor(loom_buffer_t buf, loom_tensor *t, const void *data,
                                  size_t offset, size_t size) {
    (void)buf;
    memcpy((char *)t->data + offset, data, size);
}

static void cpu_buffer_get_tensor(loom_buffer_t buf, const loom_tensor *t, void *data,
                                  size_t offset, size_t size) {
    (void)buf;
    memcpy(data, (const char *)t->data + offset, size);
}

/* Any host-resident source can be read directly. */
static bool cpu_buffer_cpy_tensor(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst) {
    (void)buf;
    if (!src->buffer || !loom_buffer_is_host(src->buffer)) return false;
    memcpy(dst->data, src->data, loom_nbytes(src));
    return true;
}

static void cpu_buffer_clear(loom_buffer_t buf, uint8_t value) {
    memset(buf->context, value, buf->size);
}

static const struct loom_buffer_i cpu_buffer_i = {
    .free_buffer = cpu_buffer_free,
    .get_base = cpu_buffer_get_base,
    .memset_tensor = cpu_buffer_memset_tensor,
    .set_tensor = cpu_buffer_set_tensor,
    .get_tensor = cpu_buffer_get_tensor,
    .cpy_tensor = cpu_buffer_cpy_tensor,
    .clear = cpu_buffer_clear,
};

/* Caller memory: the same, but nothing to free except the repacked copies of its weights
 * (repack.h), which every write into the buffer drops where it overlaps them. */
static void cpu_ptr_buffer_free(loom_buffer_t buf) {
    loom__cpu_repack_drop(buf, NULL, SIZE_MAX);
}

static void cpu_ptr_buffer_memset_tensor(loom_buffer_t buf, loom_tensor *t, uint8_t value,
                                         size_t offset, size_t size) {
    loom__cpu_repack_drop(buf, (char *)t->data + offset, size);
    cpu_buffer_memset_tensor(buf, t, value, offset, size);
}

static void cpu_ptr_buffer_set_tensor(loom_buffer_t buf, loom_tensor *t, const void *data,
                                      size_t offset, size_t size) {
    loom__cpu_repack_drop(buf, (char *)t->data + offset, size);
    cpu_buffer_set_tensor(buf, t, data, offset, size);
}

static bool cpu_ptr_buffer_cpy_tensor(loom_buffer_t buf, const loom_tensor *src,
                                      loom_tensor *dst) {
    if (!src->buffer || !loom_buffer_is_host(src->buffer)) return false;
    loom__cpu_repack_drop(buf, dst->data, loom_nbytes(src));
    return cpu_buffer_cpy_tensor(buf, src, dst);
}

static void cpu_ptr_buffer_clear(loom_buffer_t buf, uint8_t value) {
    loom__cpu_repack_drop(buf, NULL, SIZE_MAX);
    cpu_buffer_clear(buf, value);
}

static const struct loom_buffer_i cpu_buffer_from_ptr_i = {
    .free_buffer = cpu_ptr_buffer_free,
    .get_base = cpu_buffer_get_base,
    .memset_tensor = cpu_ptr_buffer_memset_tensor,
    .set_tensor = cpu_ptr_buffer_set_tensor,
    .get_tensor = cpu_buffer_get_tensor,
    .cpy_tensor = cpu_ptr_buffer_cpy_tensor,
    .clear = cpu_ptr_buffer_clear,
};

bool loom__cpu_buffer_is_caller(loom_buffer_t buf) {
    return buf && buf->iface == &cpu_buffer_from_ptr_i;
}

/* ---------------------------------------------------------------- buffer type */

static const char *cpu_buft_get_name(loom_buft_t buft) {
    (void)buft;
    return CPU_NAME;
}

/* Buffers from this size up ask for transparent huge pages (Linux, where THP is in madvise
 * mode): a token streams every weight once, and with 4 KiB pages a 2 GiB model costs half a
 * million TLB misses per token. The pages are not touched yet, so they fault in as 2 MiB
 * pages where the kernel has them; elsewhere the call fails harmlessly. */
#define CPU_HUGEPAGE_MIN ((size_t)8 << 20)

static void cpu_advise_hugepages(void *base, size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (size < CPU_HUGEPAGE_MIN) return;
    const uintptr_t lo = ((uintptr_t)base + huge - 1) & ~(huge - 1);
    const uintptr_t hi = ((uintptr_t)base + size) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)base;
    (void)size;
#endif
}

static loom_buffer_t cpu_buft_alloc_buffer(loom_buft_t buft, size_t size) {
    /* a zero-size request still gets a valid (aligned, non-NULL) base */
    size_t alloc = size ? (size + CPU_ALIGNMENT - 1) & ~(size_t)(CPU_ALIGNMENT - 1) : CPU_ALIGNMENT;
    if (alloc < size) {
        loom_error(LOOM_ERR_NOMEM, "CPU buffer: size %zu bytes is too large", size);
        return NULL;
    }
    void *base = loom_aligned_alloc(CPU_ALIGNMENT, alloc);
    if (!base) {
        loom_error(LOOM_ERR_NOMEM, "CPU buffer: cannot allocate %zu bytes (%.1f MiB)", size,
                   (double)size / (1024.0 * 1024.0));
        return NULL;
    }
    cpu_advise_hugepages(base, alloc);
    loom_buffer_t buf = loom_buffer_init(buft, &cpu_buffer_i, base, size);
    if (!buf) {
        loom_aligned_free(base);
        loom_error(LOOM_ERR_NOMEM, "CPU buffer: cannot allocate the buffer object for %zu bytes",
                   size);
        return NULL;
    }
    return buf;
}

static size_t cpu_buft_get_alignment(loom_buft_t buft) {
    (void)buft;
    return CPU_ALIGNMENT;
}

static bool cpu_buft_is_host(loom_buft_t buft) {
    (void)buft;
    return true;
}

static const struct loom_buft_i cpu_buft_i = {
    .get_name = cpu_buft_get_name,
    .alloc_buffer = cpu_buft_alloc_buffer,
    .get_alignment = cpu_buft_get_alignment,
    .is_host = cpu_buft_is_host,
};

static struct loom_dev cpu_device;

static struct loom_buft cpu_buft = {
    .iface = &cpu_buft_i,
    .device = &cpu_device,
    .context = NULL,
};

loom_buft_t loom_cpu_buffer_type(void) {
    return &cpu_buft;
}

loom_buffer_t loom_cpu_buffer_from_ptr(void *ptr, size_t size) {
    if (!ptr && size) {
        loom_error(LOOM_ERR_INVALID_ARG, "CPU buffer from pointer: NULL pointer for %zu bytes",
                   size);
        return NULL;
    }
    loom_buffer_t buf = loom_buffer_init(&cpu_buft, &cpu_buffer_from_ptr_i, ptr, size);
    if (!buf)
        loom_error(LOOM_ERR_NOMEM, "CPU buffer from pointer: cannot allocate the buffer object");
    return buf;
}

/* ---------------------------------------------------------------- backend */

typedef struct cpu_backend_ctx {
    int n_threads;
    loom_threadpool *tp; /* NULL until first needed, and when n_threads == 1 */
    void *work;          /* scratch cache, grown as graphs need */
    size_t work_size;
    int node;             /* NUMA node the threads are placed in, -1: the whole machine */
    loom_affinity policy; /* how the workers are pinned (resolved, never DEFAULT) */
    bool all_bound;       /* the caller only waits: every working thread is pinned */
    loom__cpu_adapt adapt;
} cpu_backend_ctx;

/* ---------------------------------------------------------------- affinity */

static _Atomic int cpu_affinity_policy = LOOM_AFFINITY_DEFAULT;

void loom_cpu_set_affinity(loom_affinity policy) {
    atomic_store(&cpu_affinity_policy, (int)policy);
}

bool loom_cpu_affinity_is_default(void) {
    return atomic_load(&cpu_affinity_policy) == LOOM_AFFINITY_DEFAULT;
}

loom_affinity loom_cpu_affinity(char *why, size_t why_size) {
    loom_affinity a = (loom_affinity)atomic_load(&cpu_affinity_policy);
    if (a != LOOM_AFFINITY_DEFAULT) {
        if (why && why_size) snprintf(why, why_size, "set by the caller");
        return a;
    }
    loom_topo *t = loom_topo_get();
    if (!t) {
        if (why && why_size) snprintf(why, why_size, "no topology (%s)", loom_last_error());
        return LOOM_AFFINITY_NONE;
    }
    return loom_topo_affinity_default(t, why, why_size);
}

/* Each worker pins itself once, as the backend's policy says. */
static void cpu_thread_start(int ith, int n_threads, void *data) {
    cpu_backend_ctx *ctx = data;
    loom_topo *t = loom_topo_get();
    if (t) loom_topo_bind_thread(t, ctx->policy, ctx->node, ith, n_threads);
}

static void cpu_backend_free(loom_backend_t backend) {
    cpu_backend_ctx *ctx = backend->context;
    if (ctx->tp) loom_threadpool_free(ctx->tp);
    loom_free(ctx->work);
    loom_free(ctx);
    loom_free(backend);
}

static loom_status cpu_backend_graph_compute(loom_backend_t backend, loom_graph *g) {
    cpu_backend_ctx *ctx = backend->context;
    if ((ctx->n_threads > 1 || (ctx->all_bound && ctx->policy != LOOM_AFFINITY_NONE)) && !ctx->tp) {
        bool pin = ctx->policy != LOOM_AFFINITY_NONE;
        ctx->tp = loom_threadpool_new_ex(ctx->n_threads, pin ? cpu_thread_start : NULL, ctx,
                                         !(pin && ctx->all_bound));
        if (!ctx->tp)
            return loom_error(LOOM_ERR_NOMEM, "CPU backend: cannot start a pool of %d threads",
                              ctx->n_threads);
    }
    return loom__cpu_graph_compute(g, ctx->tp, &ctx->work, &ctx->work_size, &ctx->adapt);
}

static const struct loom_backend_i cpu_backend_i = {
    .free = cpu_backend_free,
    .graph_compute = cpu_backend_graph_compute,
};

static int resolve_threads(int n) {
    return n > 0 ? n : loom_n_cpus();
}

loom_backend_t loom_cpu_backend_new(int n_threads) {
    return loom__cpu_backend_new_on(&cpu_device, n_threads, -1, loom_cpu_affinity(NULL, 0), false);
}

loom_backend_t loom__cpu_backend_new_on(loom_dev_t dev, int n_threads, int node,
                                        loom_affinity policy, bool all_threads_bound) {
    cpu_backend_ctx *ctx = loom_calloc(1, sizeof *ctx);
    loom_backend_t backend = loom_calloc(1, sizeof *backend);
    if (!ctx || !backend) {
        loom_free(ctx);
        loom_free(backend);
        loom_error(LOOM_ERR_NOMEM, "CPU backend: out of memory creating the backend");
        return NULL;
    }
    ctx->n_threads = resolve_threads(n_threads);
    ctx->node = node;
    ctx->policy = policy == LOOM_AFFINITY_DEFAULT ? LOOM_AFFINITY_NONE : policy;
    ctx->all_bound = all_threads_bound;
    backend->iface = &cpu_backend_i;
    backend->device = dev;
    backend->context = ctx;
    return backend;
}

bool loom_backend_is_cpu(loom_backend_t backend) {
    return backend && backend->iface == &cpu_backend_i;
}

void loom_cpu_backend_set_n_threads(loom_backend_t backend, int n_threads) {
    LOOM_ASSERT(loom_backend_is_cpu(backend));
    cpu_backend_ctx *ctx = backend->context;
    int n = resolve_threads(n_threads);
    if (n == ctx->n_threads) return;
    if (ctx->tp) loom_threadpool_free(ctx->tp);
    ctx->tp = NULL;
    ctx->n_threads = n;
}

/* ---------------------------------------------------------------- device */

static const char *cpu_dev_get_name(loom_dev_t dev) {
    (void)dev;
    return CPU_NAME;
}

/* The processor's model name from /proc/cpuinfo, read once. */
static const char *cpu_dev_get_description(loom_dev_t dev) {
    (void)dev;
    static char desc[128];
    static _Atomic int state; /* 0 unread, 1 reading, 2 ready */
    int expected = 0;
    if (atomic_compare_exchange_strong(&state, &expected, 1)) {
        snprintf(desc, sizeof desc, "CPU");
        FILE *f = fopen("/proc/cpuinfo", "r");
        if (f) {
            char line[256];
            while (fgets(line, sizeof line, f)) {
                if (strncmp(line, "model name", 10) != 0) continue;
                const char *v = strchr(line, ':');
                if (!v) break;
                v++;
                while (*v == ' ' || *v == '\t')
                    v++;
                snprintf(desc, sizeof desc, "%s", v);
                desc[strcspn(desc, "\n")] = 0;
                break;
            }
            fclose(f);
        }
        atomic_store(&state, 2);
    }
    while (atomic_load(&state) != 2) {
    }
    return desc;
}

/* MemAvailable / MemTotal from /proc/meminfo, else sysconf. */
static void cpu_dev_get_memory(loom_dev_t dev, size_t *free_mem, size_t *total) {
    (void)dev;
    unsigned long long avail_kb = 0, total_kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        while (fgets(line, sizeof line, f)) {
            unsigned long long v;
            if (sscanf(line, "MemTotal: %llu kB", &v) == 1) total_kb = v;
            if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) avail_kb = v;
        }
        fclose(f);
    }
    size_t t = (size_t)total_kb * 1024, a = (size_t)avail_kb * 1024;
    if (!t) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) t = (size_t)pages * (size_t)page;
#ifdef _SC_AVPHYS_PAGES
        long avail = sysconf(_SC_AVPHYS_PAGES);
        if (avail > 0 && page > 0) a = (size_t)avail * (size_t)page;
#endif
    }
    if (!a) a = t;
    if (free_mem) *free_mem = a;
    if (total) *total = t;
}

static loom_dev_type cpu_dev_get_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_CPU;
}

static void cpu_dev_get_props(loom_dev_t dev, loom_dev_props *props) {
    props->name = cpu_dev_get_name(dev);
    props->description = cpu_dev_get_description(dev);
    cpu_dev_get_memory(dev, &props->memory_free, &props->memory_total);
    props->type = LOOM_DEV_TYPE_CPU;
    props->caps.async = false;
    props->caps.host_buffer = false;
    props->caps.events = false;
}

/* params: "threads=N" (comma-separated key=value; unknown keys are an error). */
bool loom__cpu_parse_params(const char *params, int *threads_out) {
    int threads = 0;
    const char *s = params ? params : "";
    while (*s) {
        size_t len = strcspn(s, ",");
        char item[64];
        if (len >= sizeof item) {
            loom_error(LOOM_ERR_FORMAT, "CPU backend params: item '%.*s...' is too long", 32, s);
            return false;
        }
        memcpy(item, s, len);
        item[len] = 0;
        if (len > 0) {
            char *end = NULL;
            if (strncmp(item, "threads=", 8) == 0) {
                long v = strtol(item + 8, &end, 10);
                if (end == item + 8 || *end || v < 0 || v > 4096) {
                    loom_error(LOOM_ERR_FORMAT,
                               "CPU backend params: '%s': threads must be an integer in [0, 4096]",
                               item);
                    return false;
                }
                threads = (int)v;
            } else {
                loom_error(LOOM_ERR_FORMAT,
                           "CPU backend params: unknown key in '%s' (known: threads)", item);
                return false;
            }
        }
        s += len;
        if (*s == ',') s++;
    }
    *threads_out = threads;
    return true;
}

static loom_backend_t cpu_dev_init_backend(loom_dev_t dev, const char *params) {
    (void)dev;
    int threads = 0;
    if (!loom__cpu_parse_params(params, &threads)) return NULL;
    return loom_cpu_backend_new(threads);
}

static loom_buft_t cpu_dev_get_buffer_type(loom_dev_t dev) {
    (void)dev;
    return &cpu_buft;
}

static bool cpu_dev_supports_op(loom_dev_t dev, const loom_tensor *op) {
    (void)dev;
    return loom_cpu_supports_op(op);
}

static bool cpu_dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    (void)dev;
    return buft && loom_buft_is_host(buft);
}

static const struct loom_dev_i cpu_dev_i = {
    .get_name = cpu_dev_get_name,
    .get_description = cpu_dev_get_description,
    .get_memory = cpu_dev_get_memory,
    .get_type = cpu_dev_get_type,
    .get_props = cpu_dev_get_props,
    .init_backend = cpu_dev_init_backend,
    .get_buffer_type = cpu_dev_get_buffer_type,
    .supports_op = cpu_dev_supports_op,
    .supports_buft = cpu_dev_supports_buft,
};

/* ---------------------------------------------------------------- reg */

static struct loom_reg cpu_reg;

static struct loom_dev cpu_device = {
    .iface = &cpu_dev_i,
    .reg = &cpu_reg,
    .context = NULL,
};

static const char *cpu_reg_get_name(loom_reg_t reg) {
    (void)reg;
    return CPU_NAME;
}

static size_t cpu_reg_get_device_count(loom_reg_t reg) {
    (void)reg;
    return 1;
}

static loom_dev_t cpu_reg_get_device(loom_reg_t reg, size_t index) {
    (void)reg;
    return index == 0 ? &cpu_device : NULL;
}

/* Extras by name. A dlopen'ed module carries its own copy of core, so the registry's
 * wrappers fetch the module's last error through these to pass it on to the caller. */
static void *cpu_reg_get_proc_address(loom_reg_t reg, const char *name) {
    (void)reg;
    if (strcmp(name, "loom_last_error") == 0) return (void *)(uintptr_t)loom_last_error;
    if (strcmp(name, "loom_last_status") == 0) return (void *)(uintptr_t)loom_last_status;
    if (strcmp(name, "loom_cpu_simd_name") == 0) return (void *)(uintptr_t)loom_cpu_simd_name;
    return NULL;
}

static const struct loom_reg_i cpu_reg_i = {
    .get_name = cpu_reg_get_name,
    .get_device_count = cpu_reg_get_device_count,
    .get_device = cpu_reg_get_device,
    .get_proc_address = cpu_reg_get_proc_address,
};

static struct loom_reg cpu_reg = {
    .api_version = LOOM_BACKEND_API_VERSION,
    .iface = &cpu_reg_i,
    .context = NULL,
};

loom_reg_t loom_cpu_reg(void) {
    return &cpu_reg;
}

loom_dev_t loom_cpu_dev(void) {
    return &cpu_device;
}
