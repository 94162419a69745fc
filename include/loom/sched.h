/*
 * loom sched: the graph allocator and the backend scheduler.
 *
 * The graph allocator (loom_gallocr_*) plans where every tensor of a graph lives in one
 * compute buffer per buffer type: it simulates the graph in execution order, frees a
 * tensor as soon as its last consumer (child or view) has run, hands freed bytes to the
 * next tensor from a best-fit free list, lets ops that can run in place take over a dying
 * parent's storage, and opens a new chunk when one allocation would pass the buffer
 * type's max size. It simulates first and allocates once: reserve sizes the buffers for a
 * worst-case graph, alloc_graph stamps the planned offsets into a graph of the same shape.
 * It is usable alone (one buffer type, one buffer).
 *
 * The scheduler (loom_sched_*) runs one graph on several backends. The backend array is the
 * whole policy: index = priority, the last entry must be a CPU device (the universal
 * fallback and the home of graph inputs). A graph goes through three stages, each callable
 * on its own (a later one runs the earlier ones it needs):
 *   1. split   (loom_sched_split_graph): five passes assign a backend to every node, each
 *      with a cause code, then the node list is cut into splits (one backend each) and
 *      sources that live in memory the split's backend cannot read are replaced, in the
 *      caller's graph, by copies named "<backend>#<tensor>#<copy>";
 *   2. alloc   (loom_sched_alloc_graph): one graph allocator over all backends' buffer
 *      types places everything, reallocating only when a node's buffer type changed or the
 *      reserved plan no longer fits;
 *   3. compute (loom_sched_graph_compute[_async]): each split's inputs are copied in (user
 *      inputs eagerly, intermediates after an event), then the split runs on its backend.
 * Because the caller's graph is edited, its tensors must be discarded after
 * loom_sched_reset (or a new graph built) before the next round, as with ggml.
 *
 * Environment: LOOM_SCHED_DEBUG=1 logs splits and their inputs at every split, =2 also
 * every node with its backend, cause and use count (written to stderr as they are);
 * LOOM_SCHED_DEBUG_REALLOC=1 turns an unexpected reallocation (assignment and graph size
 * unchanged) into an error, =2 any reallocation after the first plan;
 * LOOM_SCHED_MAX_SPLIT_INPUTS overrides the per-split input cap (default 30).
 */
#ifndef LOOM_SCHED_H
#define LOOM_SCHED_H

#include "loom/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- graph allocator */

#define LOOM_GALLOC_MAX_CHUNKS 16 /* chunks (separate buffers) per buffer type */

typedef struct loom_gallocr loom_gallocr;

/* One buffer type; NULL with loom_last_error on failure. */
LOOM_API loom_gallocr *loom_gallocr_new(loom_buft_t buft);
/* n buffer types (buffer id i = bufts[i]); identical buffer types share one allocator and
 * one buffer (the later ids report size 0). */
LOOM_API loom_gallocr *loom_gallocr_new_n(const loom_buft_t *bufts, int n_bufs);
LOOM_API void loom_gallocr_free(loom_gallocr *ga); /* NULL is a no-op */

/* Plans g (buffer id 0 for everything) and (re)allocates the buffers so that g, or any
 * graph of the same shape that is no larger, fits. Buffers only grow. On failure
 * (LOOM_ERR_DEVICE_OOM / LOOM_ERR_NOMEM) no buffer is left allocated. */
LOOM_API loom_status loom_gallocr_reserve(loom_gallocr *ga, loom_graph *g);
/* The same with a buffer id per node and per leaf (NULL ids: 0 for every node or leaf). */
LOOM_API loom_status loom_gallocr_reserve_n(loom_gallocr *ga, loom_graph *g,
                                            const int *node_buffer_ids, const int *leaf_buffer_ids);
/* Plans without allocating and writes each buffer id's planned size to sizes[n_bufs]
 * (0 for an id that shares an earlier id's buffer). */
LOOM_API loom_status loom_gallocr_reserve_n_size(loom_gallocr *ga, loom_graph *g,
                                                 const int *node_buffer_ids,
                                                 const int *leaf_buffer_ids, size_t *sizes);
/* Stamps the planned buffer and offset into every unallocated tensor of g (views get their
 * source's buffer). When g does not match the plan (other node or leaf count, other
 * topology, or a tensor larger than planned) a single-buffer allocator re-reserves by
 * itself; a multi-buffer one returns LOOM_ERR_INVALID_ARG (reserve_n first). */
LOOM_API loom_status loom_gallocr_alloc_graph(loom_gallocr *ga, loom_graph *g);
/* Whether g would need a new plan (see alloc_graph). */
LOOM_API bool loom_gallocr_needs_realloc(loom_gallocr *ga, loom_graph *g);
/* Bytes allocated for buffer id (all chunks); 0 if it shares an earlier id's buffer. */
LOOM_API size_t loom_gallocr_get_buffer_size(const loom_gallocr *ga, int buffer_id);
/* Chunks (separate backend buffers) of buffer id. */
LOOM_API int loom_gallocr_get_n_chunks(const loom_gallocr *ga, int buffer_id);

/* ---------------------------------------------------------------- scheduler */

#define LOOM_SCHED_MAX_BACKENDS 16
#define LOOM_SCHED_MAX_COPIES 4        /* pipeline copies of every crossing tensor */
#define LOOM_SCHED_MAX_SPLIT_INPUTS 30 /* a split is cut before it needs more inputs */

typedef struct loom_sched loom_sched;

/* Eval callback. Before a node runs the scheduler asks (ask = true) whether the caller
 * wants to observe it; nodes nobody wants are batched. After a wanted node has run (and its
 * backend is synchronised) the callback is called again with ask = false; returning false
 * then stops the whole graph (later splits do not run). `backend` runs the node. */
typedef bool (*loom_sched_eval_cb)(loom_tensor *t, loom_backend_t backend, bool ask,
                                   void *user_data);

typedef struct loom_sched_stats {
    int n_nodes;        /* nodes of the last split graph */
    int n_leafs;        /* leafs of the last split graph */
    int n_splits;       /* splits of the last split graph */
    int n_inputs;       /* split inputs (tensors copied between backends), all splits */
    int n_graph_inputs; /* user inputs given pipeline copies */
    int n_copies;       /* pipeline copies in use: 1, or LOOM_SCHED_MAX_COPIES */
    int cur_copy;       /* copy index of the current graph */
    int n_alloc_nodes;  /* nodes of the allocation graph (with dependency nodes) */
    int n_reallocs;     /* times compute buffers were planned and allocated */
} loom_sched_stats;

/* backends[n]: priority order, the last a CPU device, n <= LOOM_SCHED_MAX_BACKENDS.
 * bufts: NULL, or one buffer type per backend (NULL entries: the backend's default);
 * each must be supported by its backend. graph_size: expected nodes per graph (a hint;
 * everything grows). parallel: pipeline parallelism (LOOM_SCHED_MAX_COPIES copies of every
 * crossing tensor, rotating per graph). op_offload: let a higher-priority backend run an
 * op whose weight lives in host memory when it asks to (loom_backend_offload_op).
 * Borrowed: backends and buffer types outlive the scheduler. NULL with loom_last_error
 * on failure. */
LOOM_API loom_sched *loom_sched_new(loom_backend_t *backends, loom_buft_t *bufts, int n,
                                    size_t graph_size, bool parallel, bool op_offload);
LOOM_API void loom_sched_free(loom_sched *sched); /* NULL is a no-op */

/* Sizes the compute buffers once for a worst-case graph (split + plan + allocate), keeping
 * user assignments made with set_tensor_backend, then resets. With pipeline copies, a
 * failed allocation is retried once without them (logged; n_copies becomes 1). The graph
 * is edited (sources replaced by copies): discard it afterwards. */
LOOM_API loom_status loom_sched_reserve(loom_sched *sched, loom_graph *measure_graph);
/* Like reserve, but plans without allocating: sizes[n_backends] gets each backend's
 * compute buffer size (0 where it shares an earlier backend's buffer type). */
LOOM_API loom_status loom_sched_reserve_size(loom_sched *sched, loom_graph *measure_graph,
                                             size_t *sizes);
/* Stage 1: assign backends and cut splits (no device memory touched). Starts a new round
 * (pipeline copy rotation). */
LOOM_API loom_status loom_sched_split_graph(loom_sched *sched, loom_graph *g);
/* Stage 2: splits g (unless it was just split) and allocates it. Error if a graph is
 * already allocated (reset first). */
LOOM_API loom_status loom_sched_alloc_graph(loom_sched *sched, loom_graph *g);
/* Stage 3: computes g, allocating it first if needed (and resetting a previous graph).
 * The async form may return before the backends finish; user inputs have already been
 * copied when it returns, so they may be overwritten at once. A split that fails on its
 * device fails the call that waits for it: loom_sched_graph_compute, or the
 * loom_sched_synchronize after the async form (or, if nobody waited, the next call). */
LOOM_API loom_status loom_sched_graph_compute_async(loom_sched *sched, loom_graph *g);
LOOM_API loom_status loom_sched_graph_compute(loom_sched *sched, loom_graph *g);
/* Waits for every backend; returns the first failure of their asynchronous work (a
 * split's graph that failed on its device). The next graph uses copy 0 (so
 * token-by-token generation always sees the same graph). */
LOOM_API loom_status loom_sched_synchronize(loom_sched *sched);
/* Forgets assignments and copies; the previous graph must be discarded. */
LOOM_API void loom_sched_reset(loom_sched *sched);
/* Whether g is the scheduler's allocated graph (the same object, not rebuilt, split or
 * reset since): computing it again needs no split or allocation, only its inputs set. */
LOOM_API bool loom_sched_is_allocated(const loom_sched *sched, const loom_graph *g);

/* Pins t to backend (cause "usr"); survives all passes. Call after reset, before split. */
LOOM_API loom_status loom_sched_set_tensor_backend(loom_sched *sched, loom_tensor *t,
                                                   loom_backend_t backend);
/* The backend t was assigned, or NULL if none. Never inserts. */
LOOM_API loom_backend_t loom_sched_get_tensor_backend(const loom_sched *sched,
                                                      const loom_tensor *t);
/* Why t got its backend: "usr", "1.dst", "1.vsrc", "1.inp", "1.wgt<j>", "1.off",
 * "2.gpu-dn", "2.gpu-up", "2.any-dn", "2.any-up", "3.upg", "3.best", "4.vsrc", "4.cur",
 * "4.sup" (first backend that supports it), "4.cpy" (a copy), "5.fbk" (its backend refused it
 * once its sources were the split's copies: it fell back to the CPU); "" if unassigned. */
LOOM_API const char *loom_sched_get_tensor_cause(const loom_sched *sched, const loom_tensor *t);

LOOM_API void loom_sched_set_eval_callback(loom_sched *sched, loom_sched_eval_cb cb,
                                           void *user_data);
/* Per-split input cap (default LOOM_SCHED_MAX_SPLIT_INPUTS, env overrides); a split is
 * cut before a node would push it past the cap; a single node that alone brings more
 * inputs grows the list, with a warning. */
LOOM_API void loom_sched_set_max_split_inputs(loom_sched *sched, int n);

LOOM_API void loom_sched_get_stats(const loom_sched *sched, loom_sched_stats *out);
LOOM_API int loom_sched_get_n_splits(const loom_sched *sched);
LOOM_API int loom_sched_get_n_copies(const loom_sched *sched);
LOOM_API int loom_sched_get_n_backends(const loom_sched *sched);
LOOM_API loom_backend_t loom_sched_get_backend(const loom_sched *sched, int i);
LOOM_API loom_buft_t loom_sched_get_buffer_type(const loom_sched *sched, loom_backend_t backend);
/* Compute buffer bytes of backend (0 if it shares an earlier backend's buffer type). */
LOOM_API size_t loom_sched_get_buffer_size(const loom_sched *sched, loom_backend_t backend);

/* Split k of the last split graph: its backend, node range [i_start, i_end) in the
 * caller's graph and its inputs (the original tensors that are copied in). */
typedef struct loom_sched_split_info {
    loom_backend_t backend;
    int i_start, i_end;
    int n_inputs;
    loom_tensor *const *inputs; /* borrowed until the next split */
} loom_sched_split_info;
LOOM_API loom_status loom_sched_get_split(const loom_sched *sched, int k,
                                          loom_sched_split_info *out);

/* The debug print (the LOOM_SCHED_DEBUG format) of the graph split or allocated now
 * (nothing after a reset), one line per call of `line` (no trailing newline). level 1:
 * splits and inputs; 2: every node too, with its backend and cause. */
LOOM_API void loom_sched_dump(const loom_sched *sched, int level,
                              void (*line)(const char *text, void *user_data), void *user_data);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SCHED_H */
