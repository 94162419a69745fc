/*
 * The machine's topology (through hwloc; topo/ is the only code that includes it):
 * packages, NUMA nodes with their memory, cores, PUs, caches and PCI devices; thread
 * placement policies; memory bound to a NUMA node; ring orders of devices.
 *
 * Source: LOOM_TOPOLOGY=file.xml (an lstopo XML export) or LOOM_TOPOLOGY=synthetic:DESC
 * (hwloc's synthetic syntax, e.g. "synthetic:pack:2 l3:1 core:4 pu:2"), else this machine.
 * A topology that is not this machine's (any XML or synthetic one) is only described:
 * binding threads or memory to it is logged once and skipped, never an error.
 */
#ifndef LOOM_TOPO_H
#define LOOM_TOPO_H

#include <stddef.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_topo loom_topo;

/* source: NULL = LOOM_TOPOLOGY or this machine; "synthetic:DESC"; or an XML path. */
LOOM_API loom_status loom_topo_load(const char *source, loom_topo **out);
LOOM_API void loom_topo_free(loom_topo *t);
/* The process-wide topology (loaded on first use from LOOM_TOPOLOGY or this machine;
 * never freed; NULL with the error set when hwloc cannot load it). Borrowed. */
LOOM_API loom_topo *loom_topo_get(void);

/* Whether the topology is the running machine's (binding is possible). */
LOOM_API bool loom_topo_is_this_system(const loom_topo *t);
/* Where it came from: "this machine", "synthetic:...", or the XML path. */
LOOM_API const char *loom_topo_source(const loom_topo *t);

typedef enum {
    LOOM_TOPO_PACKAGE,
    LOOM_TOPO_NUMA,
    LOOM_TOPO_CORE,
    LOOM_TOPO_PU,
    LOOM_TOPO_L3,
    LOOM_TOPO_PCI, /* PCI devices (hwloc's I/O objects, when the topology has them) */
    LOOM_TOPO_GPU, /* PCI devices of class display/3D (0x03xx) */
} loom_topo_kind;

LOOM_API int loom_topo_count(const loom_topo *t, loom_topo_kind kind);

typedef struct {
    int index;          /* logical index (0..n-1, in topology order) */
    unsigned os_index;  /* the OS's node number */
    int package;        /* logical index of the package holding it, -1 if none */
    uint64_t memory;    /* bytes local to the node */
    int n_cores, n_pus; /* cores and PUs whose memory is this node */
} loom_topo_numa_info;

LOOM_API loom_status loom_topo_numa(const loom_topo *t, int i, loom_topo_numa_info *info);

typedef struct {
    char busid[16]; /* "0000:65:00.0" */
    unsigned vendor, device, class_id;
    int numa;      /* logical index of the nearest NUMA node, -1 if unknown */
    int switch_id; /* logical index of the PCI bridge right above it, -1 if none */
} loom_topo_pci_info;

/* The i-th PCI device of kind (LOOM_TOPO_PCI or LOOM_TOPO_GPU), in topology order. */
LOOM_API loom_status loom_topo_pci(const loom_topo *t, loom_topo_kind kind, int i,
                                   loom_topo_pci_info *info);
/* The index (among kind) of the PCI device with this bus id ("65:00.0" or
 * "0000:65:00.0", case-insensitive), or -1. */
LOOM_API int loom_topo_pci_find(const loom_topo *t, loom_topo_kind kind, const char *busid);

/* Thread placement. none: the OS decides; compact: thread i on the i-th core in topology
 * order (neighbours share caches); spread: threads dealt round-robin over the packages
 * (then NUMA nodes, then cores), for memory bandwidth; numa: each thread confined to a
 * whole NUMA node, threads dealt over the nodes in blocks. */
typedef enum {
    LOOM_AFFINITY_DEFAULT = -1, /* loom_topo_affinity_default */
    LOOM_AFFINITY_NONE = 0,
    LOOM_AFFINITY_COMPACT,
    LOOM_AFFINITY_SPREAD,
    LOOM_AFFINITY_NUMA,
} loom_affinity;

LOOM_API loom_status loom_affinity_parse(const char *s, loom_affinity *out);
LOOM_API const char *loom_affinity_name(loom_affinity a);
/* numa with several NUMA nodes, none otherwise (one node: the OS does as well); why (may
 * be NULL) gets a one-line reason. */
LOOM_API loom_affinity loom_topo_affinity_default(const loom_topo *t, char *why, size_t why_size);

/* The PUs (logical indexes, ascending) thread ith of nth may run on under policy a,
 * inside NUMA node `node` (-1: the whole machine). Returns how many were written (at most
 * cap); 0 means "unbound" (none, or nothing to bind to). */
LOOM_API int loom_topo_thread_pus(const loom_topo *t, loom_affinity a, int node, int ith, int nth,
                                  int *pus, int cap);
/* Binds the calling thread as loom_topo_thread_pus says. Returns true when bound; when it
 * cannot be done (a topology of another machine, a restricted cpuset) logs once per
 * process and returns false. */
LOOM_API bool loom_topo_bind_thread(const loom_topo *t, loom_affinity a, int node, int ith,
                                    int nth);

/* Memory on NUMA node `node` (hwloc membind; page aligned). Falls back to plain aligned
 * memory, logged once, when binding is impossible. Free with loom_topo_free_mem. */
LOOM_API void *loom_topo_alloc_on_node(const loom_topo *t, int node, size_t size);
LOOM_API void loom_topo_free_mem(const loom_topo *t, void *p, size_t size);
/* The logical NUMA node holding most of [p, p+size), -1 when unknown. */
LOOM_API int loom_topo_mem_node(const loom_topo *t, const void *p, size_t size);

/* Ring order: order[k] = which of the n places goes k-th, so that ring neighbours are
 * close. place[i] is a NUMA node (kind LOOM_TOPO_NUMA) or a PCI device index (kind
 * LOOM_TOPO_GPU / LOOM_TOPO_PCI). The order is the depth-first order of the topology tree
 * (same PCI switch, then same NUMA node, then same package), ties kept in input order;
 * why gets a one-line explanation. */
LOOM_API loom_status loom_topo_ring_order(const loom_topo *t, loom_topo_kind kind, const int *place,
                                          int n, int *order, char *why, size_t why_size);

/* A short tree (packages > NUMA nodes > cores/PUs summary, caches, PCI GPUs) into buf,
 * with the given labels attached: label[i] at NUMA node numa[i] (or, when pci[i] >= 0, at
 * GPU pci[i]). Returns the length it needed (like snprintf). */
LOOM_API size_t loom_topo_format(const loom_topo *t, char *buf, size_t size, int n_labels,
                                 const char *const *labels, const int *numa, const int *pci);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TOPO_H */
