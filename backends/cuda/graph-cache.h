/*
 * The CUDA backend's graph cache, free of CUDA so that it builds and is tested on any
 * machine (tests/gpu/graph_cache_test.c, with a stand-in for the captured graphs).
 *
 * A graph's key is every tensor and source pointer, data address, type, op, shape, stride
 * and op param its launches are made of (a copy of the key words is kept, the FNV-1a hash
 * only speeds the search). An entry holds what was captured for its key (`exec`, opaque
 * here: a cudaGraphExec_t in cuda-graph.c, released through the callback given to
 * loom__cuda_gcache_new) or nothing yet.
 *
 * Size: LRU with LOOM_CUDA_GCACHE_MIN entries at first, doubled (up to
 * LOOM_CUDA_GCACHE_MAX) whenever a key comes back that was evicted earlier, as the meta
 * device's plan cache grows (meta/backend.c): tensor split issues 2L+1 subgraphs per token
 * to each device, so a fixed size below that would evict every graph before its replay
 * (L = 64 layers: 129 keys). The last 2 x LOOM_CUDA_GCACHE_MAX evicted hashes are
 * remembered, so any working set up to the maximum is found within a few tokens.
 */
#ifndef LOOM_BACKENDS_CUDA_GRAPH_CACHE_H
#define LOOM_BACKENDS_CUDA_GRAPH_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

#define LOOM_CUDA_GCACHE_MIN 64   /* entries at first */
#define LOOM_CUDA_GCACHE_MAX 4096 /* entries at most */

typedef struct loom__cuda_gentry {
    uint64_t hash;
    uint64_t *key; /* words */
    size_t n;
    void *exec; /* what was captured for this key; NULL until captured */
    uint64_t last_use;
    bool no_capture; /* capture failed once: always eager */
} loom__cuda_gentry;

typedef struct loom__cuda_gcache loom__cuda_gcache;

/* release(exec, ud) frees a captured graph (evicted, cleared or freed); NULL when the cache
 * is out of host memory. */
loom__cuda_gcache *loom__cuda_gcache_new(void (*release)(void *exec, void *ud), void *ud);
void loom__cuda_gcache_free(loom__cuda_gcache *gc);  /* NULL: no-op */
void loom__cuda_gcache_clear(loom__cuda_gcache *gc); /* every entry released; size kept */

/* The entry of g's key when it was seen before (its last use updated), else NULL after
 * remembering the key (evicting the least recently used entry when full, growing first
 * when the key was evicted before). NULL too, remembering nothing, when the host is out of
 * memory. */
loom__cuda_gentry *loom__cuda_gcache_lookup(loom__cuda_gcache *gc, const loom_graph *g);

typedef struct loom__cuda_gcache_stats {
    int capacity, entries;
    uint64_t hits, misses, evictions, grows;
} loom__cuda_gcache_stats;
void loom__cuda_gcache_get_stats(const loom__cuda_gcache *gc, loom__cuda_gcache_stats *out);

#endif /* LOOM_BACKENDS_CUDA_GRAPH_CACHE_H */
