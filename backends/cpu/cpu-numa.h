/*
 * Between cpu-backend.c and numa.c: a CPU backend object for any CPU-kind device, whose
 * worker threads are placed by an affinity policy inside one NUMA node (node -1: the whole
 * machine). all_threads_bound: the caller of graph_compute only waits, so every thread
 * doing work runs where the policy puts it.
 */
#ifndef LOOM_CPU_NUMA_H
#define LOOM_CPU_NUMA_H

#include "backends/backend-impl.h"
#include "loom/topo.h"

loom_backend_t loom__cpu_backend_new_on(loom_dev_t dev, int n_threads, int node,
                                        loom_affinity policy, bool all_threads_bound);
/* "threads=N" device params (NULL or "" = 0); false with the error set on bad input. */
bool loom__cpu_parse_params(const char *params, int *threads);

#endif /* LOOM_CPU_NUMA_H */
