/*
 * sim: N simulated GPUs on the CPU. Each device has type GPU, a private non-host buffer
 * type (its memory is an arena that only set/get/copy reach), a worker thread that runs
 * graphs with the CPU kernels (so devices really compute concurrently), events, async
 * copies, a memory cap, configurable op refusals and offload batch threshold, and a link
 * model that accounts virtual time and bytes for every copy.
 *
 * Spec strings: "sim:N[,key=value...]" with keys
 *   mem=SIZE        memory cap per device (bytes, or with KiB/MiB/GiB/KB/MB/GB suffix);
 *                   default 16GiB
 *   link=PRESET     nvlink (NVLink 4: 150 GB/s per direction, 2 us) | pcie4 (25 GB/s,
 *                   8 us) | pcie5 (50 GB/s, 6 us) | none (infinitely fast); default nvlink
 *   bw=GBPS         link bandwidth override, GB/s (1e9 bytes/s)
 *   lat=US          link latency override, microseconds
 *   refuse=OP[+OP]  ops the devices refuse in supports_op (names as loom_op_name,
 *                   case-insensitive: refuse=mul_mat+rope)
 *   offload=N       offload_op batch threshold (default 32, env LOOM_OP_OFFLOAD_MIN_BATCH);
 *                   0 disables offload
 *   threads=N       CPU threads per device worker (default 1)
 *   hostmem=1       the devices use the host (CPU) buffer type instead of private memory
 *                   (an "accelerator" that computes on host memory)
 *   p2p=0           devices cannot copy to each other directly (copies stage via host)
 *   profile=NAME    a GPU profile (h200, h100-sxm, h100-pcie, a100-80g, l40s, rtx-5090,
 *                   rtx-4090, rtx-3090; "host" is the desktop CPU of loom plan's hybrid
 *                   candidate): the devices report its memory (unless mem= is
 *                   given) and every op they run accounts virtual time under the timing
 *                   model (loom_sim_op_time_us); see loom_sim_profile_get for the figures
 *   link=PRESET     also nvlink3/nvlink4/nvlink5/nvswitch, pcie4-nop2p, pcie5-nop2p and
 *                   host-staged (these set p2p=0 unless p2p= is given)
 *   virtual=1       memory is reserved address space only and nothing is copied or
 *                   computed: transfers and ops only account bytes and virtual time (for
 *                   planning a model from its header alone; results are meaningless)
 *   comm=0          no native communicator: the reducer's ring/butterfly steps instead of
 *                   the reg's one-command AllReduce (which is only offered with p2p, private
 *                   memory, no profile and not virtual; see backends/sim/README.md)
 * Bad specs get LOOM_ERR_FORMAT naming the offending part.
 */
#ifndef LOOM_SIM_H
#define LOOM_SIM_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_sim_link {
    double bandwidth_gbps; /* GB/s (1e9 bytes per second), <= 0: infinite */
    double latency_us;     /* per transfer */
} loom_sim_link;

typedef struct loom_sim_config {
    int n_devices;    /* 1..64 */
    size_t mem_bytes; /* cap per device */
    loom_sim_link link;
    char link_name[16]; /* "nvlink", "pcie4", ... or "custom" */
    bool refuse[LOOM_OP_COUNT];
    int64_t offload_min_batch; /* 0: never offload */
    int threads;
    bool host_memory;
    bool p2p;
    char profile[24];    /* "" or a profile name (loom_sim_profile_find) */
    bool virtual_memory; /* virtual=1 */
    bool no_comm;        /* comm=0: no native communicator (the reducer's own steps) */
} loom_sim_config;

/* A GPU's figures for the timing model (one table in backends/sim/sim-profiles.c). */
typedef struct loom_sim_profile {
    const char *name;   /* "rtx-3090" */
    size_t mem_bytes;   /* device memory */
    double hbm_gbps;    /* memory bandwidth, GB/s (1e9 B/s) */
    double fp16_tflops; /* dense FP16/BF16 tensor throughput, TFLOP/s */
    double int8_tops;   /* dense INT8 tensor throughput, TOP/s */
    double launch_us;   /* per kernel */
    double efficiency;  /* achieved fraction of the peaks (0, 1] */
    const char *source; /* where the figures come from */
} loom_sim_profile;

typedef struct loom_sim_link_preset_info {
    const char *name;
    double bandwidth_gbps; /* per direction */
    double latency_us;     /* per transfer */
    bool p2p;              /* direct device-to-device copies */
    const char *source;
} loom_sim_link_preset_info;

LOOM_API int loom_sim_profile_count(void);
LOOM_API const loom_sim_profile *loom_sim_profile_get(int i); /* NULL out of range */
/* LOOM_ERR_NOT_FOUND naming the known profiles otherwise. */
LOOM_API loom_status loom_sim_profile_find(const char *name, const loom_sim_profile **out);
LOOM_API int loom_sim_link_preset_count(void);
LOOM_API const loom_sim_link_preset_info *loom_sim_link_preset_get(int i);
LOOM_API loom_status loom_sim_link_preset_find(const char *name,
                                               const loom_sim_link_preset_info **out);
/* The timing model of one op on a device of profile p (0 for views and NONE), in us:
 * max(bytes / bandwidth, flops / throughput) / efficiency + launch. Quantised matmuls use
 * the INT8 throughput, everything else FP16. */
LOOM_API double loom_sim_op_time_us(const loom_sim_profile *p, const loom_tensor *op);
LOOM_API double loom_sim_op_bytes(const loom_tensor *op);
LOOM_API double loom_sim_op_flops(const loom_tensor *op);
/* A ring AllReduce of `bytes` over n devices: 2 (n - 1) steps of bytes / n over the link
 * (twice as many transfers without p2p: each staged through host). */
LOOM_API double loom_sim_allreduce_time_us(const loom_sim_link *link, bool p2p, int n_devices,
                                           uint64_t bytes);

/* Link presets by name (nvlink, pcie4, pcie5, none, and the others of
 * loom_sim_link_preset_get); LOOM_ERR_NOT_FOUND otherwise. */
LOOM_API loom_status loom_sim_link_preset(const char *name, loom_sim_link *out);
/* Parses "sim:4,mem=2GiB,link=pcie4" (the "sim" prefix optional, "sim" alone = 1). */
LOOM_API loom_status loom_sim_config_parse(const char *spec, loom_sim_config *out);
LOOM_API void loom_sim_config_default(loom_sim_config *out, int n_devices);

/* A new reg of N simulated devices named by process-wide numbers: SIM0..SIM{N-1} when no
 * other sim reg is alive, else the numbering continues (a reg of 2 alive: SIM2, SIM3, ...;
 * the reg is "SIM" when it holds SIM0, else "SIM2..SIM3"). Free with loom_sim_reg_free
 * after every backend and buffer of it is freed. */
LOOM_API loom_status loom_sim_reg_new(const loom_sim_config *cfg, loom_reg_t *out);
LOOM_API loom_status loom_sim_reg_new_from_spec(const char *spec, loom_reg_t *out);
LOOM_API void loom_sim_reg_free(loom_reg_t reg);
/* The process-wide default sim reg (static, never freed; loom_sim_reg_free ignores it),
 * built on first use from env LOOM_SIM_DEVICES or "sim:2". NULL (with loom_last_error)
 * when that spec does not parse. Registered by loom_registry_load_all when sim is linked,
 * and returned by libloom-sim.so's loom_backend_init. */
LOOM_API loom_reg_t loom_sim_reg_default(void);
LOOM_API bool loom_dev_is_sim(loom_dev_t dev);

typedef struct loom_sim_stats {
    uint64_t bytes_in;      /* bytes copied into this device (host->dev, dev->dev) */
    uint64_t bytes_out;     /* bytes copied out of it */
    uint64_t copies;        /* transfers touching this device */
    uint64_t graphs;        /* graph_compute calls executed */
    uint64_t nodes;         /* graph nodes executed */
    double link_time_us;    /* virtual time spent on its links under the link model */
    size_t mem_used;        /* bytes allocated now */
    size_t mem_peak;        /* most bytes allocated at once */
    double compute_time_us; /* virtual time of the ops run, under the profile's timing
                             * model (0 without profile=) */
    uint64_t ops;           /* non-view nodes timed */
    double link_wait_us;    /* link time this device waits for with full-duplex links: its
                             * host transfers, and device-to-device copies into it (a
                             * sender's DMA runs while it works) */
    /* measured host time (wall clock) of the device's worker thread, not the link model:
     * in graph computes, and in synchronisation with other devices (event waits, device
     * copies, the native AllReduce: waiting for the peers and summing) */
    uint64_t host_compute_ns;
    uint64_t host_sync_ns;
} loom_sim_stats;

LOOM_API void loom_sim_dev_stats(loom_dev_t dev, loom_sim_stats *out);
LOOM_API void loom_sim_dev_reset_stats(loom_dev_t dev);
/* Projected time of moving `bytes` over `link` (latency + bytes / bandwidth), in us. */
LOOM_API double loom_sim_link_time_us(const loom_sim_link *link, uint64_t bytes);

/* Test hook: the backend's stream keeps queueing commands but runs none until the host
 * waits for it (loom_backend_synchronize of any sim backend, or loom_event_synchronize of
 * an event last recorded on it); from then on it runs normally. Another stream waiting
 * for it on the device does not release it. So it behaves as a device that runs as late
 * as ordering allows, which makes a missing host-side wait a deterministic wrong result
 * instead of a rare race. */
LOOM_API void loom_sim_backend_hold(loom_backend_t backend);

/* These functions live in the module libloom-sim.so. A program linking libloom calls them
 * as declared here: libloom's definitions forward to the module through the registry
 * (loading the modules with loom_registry_load_all the first time none is registered), and
 * those of a device, backend or reg ask that object's reg, so a device of another backend
 * gets false or zeroed stats. Without the module a call fails as for any failure, with
 * loom_last_error naming libloom-sim.so (a double is NAN, a pointer NULL). The module's own
 * entry points are also reg procs: loom_reg_get_proc_address(reg, "loom_sim_reg_new") etc. */

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SIM_H */
