/*
 * The meta device: one device that is secretly N. It wraps N real devices and runs every op
 * on all of them at once, each on its own slice of the tensors (tensor parallelism). Above
 * it an unchanged scheduler sees [Meta(...), CPU] and never learns that one entry is N.
 *
 * - Weights and KV cache get their split state from the caller's callback (loom's default
 *   reads the rules/ tables); every computed tensor derives its state from its sources
 *   through the op rule table of splitstate/. An op the table cannot split is refused by
 *   supports_op, so the scheduler places it on another backend.
 * - A meta buffer is N real buffers of the same size. A tensor at offset o of the meta
 *   buffer has its slice at offset o of every device buffer, and the meta buffer type's
 *   alloc size of a tensor is its largest slice: so compute buffers shrink as N grows
 *   (only split tensors shrink; mirrored and partial ones stay whole).
 * - graph_compute cuts the graph into subgraphs at PARTIAL nodes (sums of per-device
 *   partial results, e.g. a row-parallel matmul), issues each subgraph on all devices
 *   concurrently, and AllReduces between them (reduce/: native communicator, ring,
 *   butterfly, host), delaying the reduction past elementwise work against MIRRORED
 *   operands and past the MoE expert sum when that is exact. Built subgraphs are cached
 *   by graph (several entries).
 * - set/get work for every state: split axes scatter/gather (partial ranges too),
 *   MIRRORED writes every device, PARTIAL writes the value to device 0 and zeros
 *   elsewhere and reads the sum.
 */
#ifndef LOOM_META_H
#define LOOM_META_H

#include "loom/backend.h"
#include "loom/reduce.h"
#include "loom/splitstate.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_META_MAX_DEVICES LOOM_SPLIT_MAX_DEVICES

/* A meta device over devs[0..n) (borrowed; they must outlive it; 1..16 distinct devices).
 * get_split_state (NULL: every weight MIRRORED) decides the state of static tensors
 * (weights, KV cache, graph inputs). Named "Meta(SIM0,SIM1)". Free with
 * loom_meta_device_free after every buffer and backend of it. */
LOOM_API loom_status loom_meta_device_new(loom_dev_t *devs, int n,
                                          loom_split_leaf_fn get_split_state, void *user_data,
                                          loom_dev_t *out);
LOOM_API void loom_meta_device_free(loom_dev_t dev);
LOOM_API bool loom_dev_is_meta(loom_dev_t dev);
LOOM_API int loom_meta_n_devices(loom_dev_t dev);
LOOM_API loom_dev_t loom_meta_member(loom_dev_t dev, int i);
/* The split state of t as the meta device sees it (assume_sync: as a consumer sees it). */
LOOM_API loom_status loom_meta_tensor_state(loom_dev_t dev, const loom_tensor *t,
                                            bool assume_sync, loom_split_state *out);

LOOM_API bool loom_backend_is_meta(loom_backend_t backend);
LOOM_API loom_backend_t loom_meta_backend_member(loom_backend_t backend, int i);
/* Member i's buffer of meta buffer buf; NULL (and loom_last_error) when buf is not a meta
 * buffer (a zero-size buffer has no members) or i is out of range. */
LOOM_API loom_buffer_t loom_meta_buffer_member(loom_buffer_t buf, int i);
/* The byte offset in member i's buffer (loom_meta_buffer_member) of the slice of t, a tensor
 * owning storage in meta buffer buf; SIZE_MAX (and loom_last_error) if it is not one. A
 * buffer made for a list of tensors placed one after another (loom_alloc_ctx_tensors, the
 * model loader) holds on each member only that member's slices (an uneven split saves
 * memory on the smaller member); a compute buffer keeps a slice at its meta offset. */
LOOM_API size_t loom_meta_buffer_member_offset(loom_buffer_t buf, const loom_tensor *t, int i);
/* Forces the AllReduce algorithm of a meta backend (AUTO: the ladder / LOOM_ALLREDUCE). */
LOOM_API void loom_meta_backend_set_allreduce(loom_backend_t backend, loom_allreduce_algo algo);

typedef struct loom_meta_stats {
    uint64_t graphs;          /* graph_compute calls */
    uint64_t plans_built;     /* subgraph sets built (a cache miss) */
    uint64_t subgraphs;       /* subgraphs issued, all calls */
    uint64_t reductions;      /* AllReduce calls, all calls */
    uint64_t bytes_reduced;   /* bytes of the reduced tensors (one device's copy) */
    uint64_t delayed;         /* reductions moved past elementwise / expert-sum nodes */
    /* the last graph_compute */
    int last_subgraphs;
    int last_reductions;
    uint64_t last_bytes_reduced;
    loom_allreduce_algo last_algo;
    /* measured host time (wall clock) in graph_compute: issuing subgraphs (fingerprint,
     * plan lookup, the members' graph_compute_async) and issuing reductions (the
     * reducer's calls); with asynchronous members the devices' own time is theirs */
    uint64_t issue_ns;
    uint64_t reduce_ns;
} loom_meta_stats;

LOOM_API void loom_meta_backend_get_stats(loom_backend_t backend, loom_meta_stats *out);
LOOM_API void loom_meta_backend_reset_stats(loom_backend_t backend);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_META_H */
