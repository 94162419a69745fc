/*
 * Running the demo model (demo_block.h): once on the CPU backend as one graph (the
 * reference), and once split by hand across a list of devices, one stage per device in
 * turn (stage s on device s % N: with two devices, attention on the first and FFN on the
 * second), the residual stream copied between devices with loom_backend_tensor_copy_async
 * and ordered with events. Until the scheduler and the meta device exist this is how loom
 * shows a block running on several devices.
 */
#ifndef LOOM_TOOLS_DEMO_RUN_H
#define LOOM_TOOLS_DEMO_RUN_H

#include "loom/sim.h"
#include "tools/demo_block.h"

#define LOOM_DEMO_MAX_DEVICES 64

typedef struct loom_demo_device_report {
    char name[64];
    bool is_sim;
    int n_stages;          /* stages placed on it */
    int n_copies_in;       /* activations copied onto it from another device or host */
    loom_sim_stats upload; /* sim only: the weight and input upload before the run */
    loom_sim_stats run;    /* sim only: the run itself (counters as deltas; mem as after) */
} loom_demo_device_report;

typedef struct loom_demo_report {
    int cpu_threads;
    int cpu_nodes; /* nodes of the CPU graph */
    double cpu_ms; /* compute of the CPU graph, second run (weights resident) */
    int n_devices;
    int n_stages;
    int stage_device[2 * LOOM_DEMO_MAX_LAYERS];
    int stage_nodes[2 * LOOM_DEMO_MAX_LAYERS];
    double dev_ms; /* first input upload to the output being back on the host */
    loom_demo_device_report dev[LOOM_DEMO_MAX_DEVICES];
} loom_demo_report;

typedef struct loom_demo_diff {
    double max_abs;     /* max |got - ref| */
    double rel_l2;      /* ||got - ref||_2 / ||ref||_2 */
    double max_abs_ref; /* max |ref| */
    bool finite;        /* no NaN/Inf in either */
} loom_demo_diff;

/* Computes the block on the CPU backend into out [n_embd * T] (n_threads <= 0: all). */
loom_status loom_demo_run_cpu(const loom_demo_hparams *hp, int n_threads, float *out,
                              loom_demo_report *rep);
/* Computes the block split by hand over devs[0..n) into out [n_embd * T]. */
loom_status loom_demo_run_devices(const loom_demo_hparams *hp, loom_dev_t *devs, int n, float *out,
                                  loom_demo_report *rep);
void loom_demo_compare(const float *ref, const float *got, size_t n, loom_demo_diff *d);

#endif /* LOOM_TOOLS_DEMO_RUN_H */
