/*
 * sim regs and devices: what each simulated GPU answers without execution state (name,
 * memory, caps, supports_op/buft, offload_op), per-device statistics, reg construction
 * and naming (process-wide device numbers: SIM0, SIM1 for a first reg of 2, SIM2.. for a
 * second), the default reg used by the module and static registration, and the
 * proc-address table through which a dynamically loaded sim module exposes its extras
 * (and its own last error).
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, pthread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/sim/sim-impl.h"
#include "loom/cpu.h"

/* ---------------------------------------------------------------- device numbers */

/* Every live sim device has a process-wide number: a reg takes the first run of n free
 * numbers, so its devices are SIM<base>..SIM<base+n-1> and a second live reg continues
 * where the first ends (SIM0, SIM1, then SIM2..); a freed reg's numbers are reused. */
#define LOOM__SIM_MAX_NUMBERS 1024

static pthread_mutex_t loom__sim_number_mu = PTHREAD_MUTEX_INITIALIZER;
static bool loom__sim_number_used[LOOM__SIM_MAX_NUMBERS];

/* The first number of a free run of n, marked used; -1 when there is none. */
static int loom__sim_numbers_take(int n) {
    int base = -1;
    pthread_mutex_lock(&loom__sim_number_mu);
    for (int b = 0; b + n <= LOOM__SIM_MAX_NUMBERS && base < 0; b++) {
        int k = 0;
        while (k < n && !loom__sim_number_used[b + k])
            k++;
        if (k == n) {
            base = b;
        } else {
            b += k; /* b + k is used: the next run starts after it */
        }
    }
    for (int k = 0; base >= 0 && k < n; k++)
        loom__sim_number_used[base + k] = true;
    pthread_mutex_unlock(&loom__sim_number_mu);
    return base;
}

static void loom__sim_numbers_release(int base, int n) {
    pthread_mutex_lock(&loom__sim_number_mu);
    for (int k = 0; k < n; k++)
        loom__sim_number_used[base + k] = false;
    pthread_mutex_unlock(&loom__sim_number_mu);
}

/* ---------------------------------------------------------------- device methods */

static loom__sim_dev *loom__sim_dev_ctx(loom_dev_t dev) {
    return dev->context;
}

static const char *loom__sim_dev_name(loom_dev_t dev) {
    return loom__sim_dev_ctx(dev)->name;
}

static const char *loom__sim_dev_description(loom_dev_t dev) {
    return loom__sim_dev_ctx(dev)->desc;
}

static void loom__sim_dev_memory(loom_dev_t dev, size_t *free, size_t *total) {
    loom__sim_dev *sd = loom__sim_dev_ctx(dev);
    size_t cap = sd->sreg->cfg.mem_bytes;
    pthread_mutex_lock(&sd->mu);
    size_t used = sd->mem_used;
    pthread_mutex_unlock(&sd->mu);
    *free = used < cap ? cap - used : 0;
    *total = cap;
}

static loom_dev_type loom__sim_dev_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_GPU;
}

static void loom__sim_dev_props(loom_dev_t dev, loom_dev_props *props) {
    props->name = loom__sim_dev_name(dev);
    props->description = loom__sim_dev_description(dev);
    loom__sim_dev_memory(dev, &props->memory_free, &props->memory_total);
    props->type = LOOM_DEV_TYPE_GPU;
    props->caps.async = true;
    props->caps.host_buffer = false;
    props->caps.events = true;
}

static loom_backend_t loom__sim_dev_init(loom_dev_t dev, const char *params) {
    return loom__sim_backend_new(loom__sim_dev_ctx(dev), params);
}

static loom_buft_t loom__sim_dev_buft(loom_dev_t dev) {
    loom__sim_dev *sd = loom__sim_dev_ctx(dev);
    return sd->sreg->cfg.host_memory ? loom_cpu_buffer_type() : &sd->buft;
}

bool loom__sim_dev_supports_op(loom__sim_dev *sd, const loom_tensor *op) {
    if ((int)op->op >= 0 && op->op < LOOM_OP_COUNT && sd->sreg->cfg.refuse[op->op]) return false;
    if (loom_op_is_view(op->op)) return true;
    return loom_cpu_supports_op(op);
}

static bool loom__sim_dev_supports_op_m(loom_dev_t dev, const loom_tensor *op) {
    return loom__sim_dev_supports_op(loom__sim_dev_ctx(dev), op);
}

bool loom__sim_dev_supports_buft(loom__sim_dev *sd, loom_buft_t buft) {
    if (buft == &sd->buft) return true;
    return sd->sreg->cfg.host_memory && loom_buft_is_host(buft);
}

static bool loom__sim_dev_supports_buft_m(loom_dev_t dev, loom_buft_t buft) {
    return loom__sim_dev_supports_buft(loom__sim_dev_ctx(dev), buft);
}

static bool loom__sim_dev_offload_op(loom_dev_t dev, const loom_tensor *op) {
    int64_t min = loom__sim_dev_ctx(dev)->sreg->cfg.offload_min_batch;
    return min > 0 && loom_op_batch_size(op) >= min;
}

static const struct loom_dev_i loom__sim_dev_i = {
    .get_name = loom__sim_dev_name,
    .get_description = loom__sim_dev_description,
    .get_memory = loom__sim_dev_memory,
    .get_type = loom__sim_dev_type,
    .get_props = loom__sim_dev_props,
    .init_backend = loom__sim_dev_init,
    .get_buffer_type = loom__sim_dev_buft,
    .supports_op = loom__sim_dev_supports_op_m,
    .supports_buft = loom__sim_dev_supports_buft_m,
    .offload_op = loom__sim_dev_offload_op,
    .event_new = loom__sim_event_new,
    .event_free = loom__sim_event_free,
    .event_synchronize = loom__sim_event_synchronize,
};

loom__sim_dev *loom__sim_dev_of(loom_dev_t dev) {
    if (!dev || dev->iface != &loom__sim_dev_i) return NULL;
    return dev->context;
}

bool loom_dev_is_sim(loom_dev_t dev) {
    return loom__sim_dev_of(dev) != NULL;
}

/* ---------------------------------------------------------------- stats */

void loom_sim_dev_stats(loom_dev_t dev, loom_sim_stats *out) {
    LOOM_ASSERT(out != NULL);
    memset(out, 0, sizeof *out);
    loom__sim_dev *sd = loom__sim_dev_of(dev);
    if (!sd) return;
    pthread_mutex_lock(&sd->mu);
    *out = sd->stats;
    out->mem_used = sd->mem_used;
    out->mem_peak = sd->mem_peak;
    pthread_mutex_unlock(&sd->mu);
}

void loom_sim_dev_reset_stats(loom_dev_t dev) {
    loom__sim_dev *sd = loom__sim_dev_of(dev);
    if (!sd) return;
    pthread_mutex_lock(&sd->mu);
    memset(&sd->stats, 0, sizeof sd->stats);
    sd->mem_peak = sd->mem_used;
    pthread_mutex_unlock(&sd->mu);
}

/* ---------------------------------------------------------------- reg methods */

static loom__sim_reg *loom__sim_reg_ctx(loom_reg_t reg) {
    return reg->context;
}

static const char *loom__sim_reg_name(loom_reg_t reg) {
    return loom__sim_reg_ctx(reg)->name;
}

static size_t loom__sim_reg_dev_count(loom_reg_t reg) {
    return (size_t)loom__sim_reg_ctx(reg)->cfg.n_devices;
}

static loom_dev_t loom__sim_reg_dev_get(loom_reg_t reg, size_t index) {
    loom__sim_reg *sr = loom__sim_reg_ctx(reg);
    return index < (size_t)sr->cfg.n_devices ? &sr->devs[index].dev : NULL;
}

typedef void (*loom__sim_any_fn)(void);

static const struct {
    const char *name;
    loom__sim_any_fn fn;
} loom__sim_procs[] = {
    {"loom_sim_reg_new", (loom__sim_any_fn)loom_sim_reg_new},
    {"loom_sim_reg_new_from_spec", (loom__sim_any_fn)loom_sim_reg_new_from_spec},
    {"loom_sim_reg_free", (loom__sim_any_fn)loom_sim_reg_free},
    {"loom_sim_config_parse", (loom__sim_any_fn)loom_sim_config_parse},
    {"loom_sim_config_default", (loom__sim_any_fn)loom_sim_config_default},
    {"loom_sim_link_preset", (loom__sim_any_fn)loom_sim_link_preset},
    {"loom_sim_link_time_us", (loom__sim_any_fn)loom_sim_link_time_us},
    {"loom_sim_dev_stats", (loom__sim_any_fn)loom_sim_dev_stats},
    {"loom_sim_dev_reset_stats", (loom__sim_any_fn)loom_sim_dev_reset_stats},
    {"loom_sim_backend_hold", (loom__sim_any_fn)loom_sim_backend_hold},
    {"loom_dev_is_sim", (loom__sim_any_fn)loom_dev_is_sim},
    {"loom_sim_reg_default", (loom__sim_any_fn)loom_sim_reg_default},
    {"loom_sim_profile_count", (loom__sim_any_fn)loom_sim_profile_count},
    {"loom_sim_profile_get", (loom__sim_any_fn)loom_sim_profile_get},
    {"loom_sim_profile_find", (loom__sim_any_fn)loom_sim_profile_find},
    {"loom_sim_link_preset_count", (loom__sim_any_fn)loom_sim_link_preset_count},
    {"loom_sim_link_preset_get", (loom__sim_any_fn)loom_sim_link_preset_get},
    {"loom_sim_link_preset_find", (loom__sim_any_fn)loom_sim_link_preset_find},
    {"loom_sim_op_time_us", (loom__sim_any_fn)loom_sim_op_time_us},
    {"loom_sim_op_bytes", (loom__sim_any_fn)loom_sim_op_bytes},
    {"loom_sim_op_flops", (loom__sim_any_fn)loom_sim_op_flops},
    {"loom_sim_allreduce_time_us", (loom__sim_any_fn)loom_sim_allreduce_time_us},
    {LOOM_PROC_COMM_INIT, (loom__sim_any_fn)loom__sim_comm_init},
    {LOOM_PROC_COMM_ALLREDUCE, (loom__sim_any_fn)loom__sim_comm_allreduce},
    {LOOM_PROC_COMM_FREE, (loom__sim_any_fn)loom__sim_comm_free},
    /* this module's own core: callers with another copy import its errors */
    {"loom_last_error", (loom__sim_any_fn)loom_last_error},
    {"loom_last_status", (loom__sim_any_fn)loom_last_status},
};

static void *loom__sim_reg_proc(loom_reg_t reg, const char *name) {
    (void)reg;
    for (size_t i = 0; i < sizeof loom__sim_procs / sizeof loom__sim_procs[0]; i++) {
        if (strcmp(loom__sim_procs[i].name, name) == 0) {
            void *p;
            memcpy(&p, &loom__sim_procs[i].fn, sizeof p);
            return p;
        }
    }
    return NULL;
}

static const struct loom_reg_i loom__sim_reg_i = {
    .get_name = loom__sim_reg_name,
    .get_device_count = loom__sim_reg_dev_count,
    .get_device = loom__sim_reg_dev_get,
    .get_proc_address = loom__sim_reg_proc,
};

/* ---------------------------------------------------------------- construction */

static loom_status loom__sim_check_config(const loom_sim_config *cfg) {
    if (!cfg) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sim_reg_new: NULL config");
    if (cfg->n_devices < 1 || cfg->n_devices > LOOM_SIM_MAX_DEVICES) {
        return loom_error(LOOM_ERR_INVALID_ARG, "sim: device count %d is out of range 1..%d",
                          cfg->n_devices, LOOM_SIM_MAX_DEVICES);
    }
    if (cfg->threads < 1) {
        return loom_error(LOOM_ERR_INVALID_ARG, "sim: threads=%d must be at least 1", cfg->threads);
    }
    if (cfg->offload_min_batch < 0) {
        return loom_error(LOOM_ERR_INVALID_ARG, "sim: offload threshold %lld is negative",
                          (long long)cfg->offload_min_batch);
    }
    if (cfg->profile[0] && loom_sim_profile_find(cfg->profile, NULL) != LOOM_OK) {
        return loom_last_status();
    }
    return LOOM_OK;
}

/* Fills sr (zeroed storage) from cfg. On failure nothing is left to undo. */
static loom_status loom__sim_reg_init(loom__sim_reg *sr, const loom_sim_config *cfg,
                                      bool is_static) {
    loom_status s = loom__sim_check_config(cfg);
    if (s != LOOM_OK) return s;
    int base = loom__sim_numbers_take(cfg->n_devices);
    if (base < 0) {
        return loom_error(LOOM_ERR_FULL,
                          "sim: no run of %d free device numbers (%d simulated devices at most "
                          "alive at once)",
                          cfg->n_devices, LOOM__SIM_MAX_NUMBERS);
    }
    sr->cfg = *cfg;
    sr->cfg.link_name[sizeof sr->cfg.link_name - 1] = '\0';
    sr->cfg.profile[sizeof sr->cfg.profile - 1] = '\0';
    sr->profile = NULL;
    if (sr->cfg.profile[0]) loom_sim_profile_find(sr->cfg.profile, &sr->profile);
    sr->base = base;
    sr->is_static = is_static;
    /* The reg holding SIM0 is "SIM"; another is named by its devices: "SIM2..SIM3", "SIM4". */
    if (base == 0) {
        snprintf(sr->name, sizeof sr->name, "SIM");
    } else if (cfg->n_devices == 1) {
        snprintf(sr->name, sizeof sr->name, "SIM%d", base);
    } else {
        snprintf(sr->name, sizeof sr->name, "SIM%d..SIM%d", base, base + cfg->n_devices - 1);
    }
    sr->reg.api_version = LOOM_BACKEND_API_VERSION;
    sr->reg.iface = &loom__sim_reg_i;
    sr->reg.context = sr;

    char mem[32];
    loom__sim_format_size(cfg->mem_bytes, mem, sizeof mem);
    int i;
    for (i = 0; i < cfg->n_devices; i++) {
        loom__sim_dev *sd = &sr->devs[i];
        if (pthread_mutex_init(&sd->mu, NULL) != 0) break;
        sd->dev.iface = &loom__sim_dev_i;
        sd->dev.reg = &sr->reg;
        sd->dev.context = sd;
        sd->buft.iface = &loom__sim_buft_i;
        sd->buft.device = &sd->dev;
        sd->buft.context = sd;
        sd->sreg = sr;
        sd->index = i;
        snprintf(sd->name, sizeof sd->name, "SIM%d", base + i);
        snprintf(sd->desc, sizeof sd->desc,
                 "simulated GPU %d of %d (%s%s%s%s%s, link %s: %.0f GB/s, %.1f us)", i,
                 cfg->n_devices, sr->profile ? sr->profile->name : "", sr->profile ? ", " : "", mem,
                 cfg->host_memory ? " cap, host memory" : "",
                 cfg->virtual_memory ? ", virtual" : "", sr->cfg.link_name,
                 cfg->link.bandwidth_gbps, cfg->link.latency_us);
    }
    if (i < cfg->n_devices) {
        while (i-- > 0)
            pthread_mutex_destroy(&sr->devs[i].mu);
        loom__sim_numbers_release(base, cfg->n_devices);
        return loom_error(LOOM_ERR_INTERNAL, "sim: cannot initialise a device mutex");
    }
    return LOOM_OK;
}

loom_status loom_sim_reg_new(const loom_sim_config *cfg, loom_reg_t *out) {
    if (!out) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sim_reg_new: NULL out");
    *out = NULL;
    loom_status s = loom__sim_check_config(cfg);
    if (s != LOOM_OK) return s;
    loom__sim_reg *sr = loom_calloc(1, sizeof *sr);
    if (!sr) return loom_error(LOOM_ERR_NOMEM, "sim: out of host memory for a reg");
    s = loom__sim_reg_init(sr, cfg, false);
    if (s != LOOM_OK) {
        loom_free(sr);
        return s;
    }
    *out = &sr->reg;
    return LOOM_OK;
}

loom_status loom_sim_reg_new_from_spec(const char *spec, loom_reg_t *out) {
    if (out) *out = NULL;
    loom_sim_config cfg;
    loom_status s = loom_sim_config_parse(spec, &cfg);
    if (s != LOOM_OK) return s;
    return loom_sim_reg_new(&cfg, out);
}

void loom_sim_reg_free(loom_reg_t reg) {
    if (!reg) return;
    LOOM_ASSERT(reg->iface == &loom__sim_reg_i); /* not a sim reg */
    loom__sim_reg *sr = loom__sim_reg_ctx(reg);
    if (sr->is_static) return;
    for (int i = 0; i < sr->cfg.n_devices; i++) {
        loom__sim_dev *sd = &sr->devs[i];
        /* Every backend and buffer of the reg must be freed first. */
        LOOM_ASSERT(sd->n_backends == 0 && sd->n_buffers == 0);
        pthread_mutex_destroy(&sd->mu);
    }
    loom__sim_numbers_release(sr->base, sr->cfg.n_devices);
    loom_free(sr);
}

/* ---------------------------------------------------------------- default reg */

static loom__sim_reg loom__sim_default_storage;
static loom_reg_t loom__sim_default;
static loom_status loom__sim_default_status;
static char loom__sim_default_msg[512];
static pthread_once_t loom__sim_default_once = PTHREAD_ONCE_INIT;

static void loom__sim_default_init(void) {
    const char *env = getenv("LOOM_SIM_DEVICES");
    const char *spec = env && env[0] ? env : "sim:2";
    loom_sim_config cfg;
    loom_status s = loom_sim_config_parse(spec, &cfg);
    if (s == LOOM_OK) s = loom__sim_reg_init(&loom__sim_default_storage, &cfg, true);
    if (s != LOOM_OK) {
        loom__sim_default_status = s;
        snprintf(loom__sim_default_msg, sizeof loom__sim_default_msg, "LOOM_SIM_DEVICES: %s",
                 loom_last_error());
        return;
    }
    loom__sim_default = &loom__sim_default_storage.reg;
}

loom_reg_t loom_sim_reg_default(void) {
    pthread_once(&loom__sim_default_once, loom__sim_default_init);
    if (!loom__sim_default) loom_error(loom__sim_default_status, "%s", loom__sim_default_msg);
    return loom__sim_default;
}

/* The registry's hooks for a statically linked sim (backends/registry.c: weak references
 * under these names, since libloom defines the loom_sim_* names as forwarders). */
loom_reg_t loom__sim_static_reg_default(void);
loom_status loom__sim_static_reg_new_from_spec(const char *spec, loom_reg_t *out);
void loom__sim_static_reg_free(loom_reg_t reg);

loom_reg_t loom__sim_static_reg_default(void) {
    return loom_sim_reg_default();
}

loom_status loom__sim_static_reg_new_from_spec(const char *spec, loom_reg_t *out) {
    return loom_sim_reg_new_from_spec(spec, out);
}

void loom__sim_static_reg_free(loom_reg_t reg) {
    loom_sim_reg_free(reg);
}
