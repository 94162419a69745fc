/*
 * The graph allocator's simulated arena: offsets, not memory. One per buffer type. Up to
 * LOOM_GALLOC_MAX_CHUNKS chunks (each later becomes one backend buffer); each chunk keeps a
 * free list sorted by offset and a high-water mark (max_size), which is the buffer size
 * the chunk will need. Allocation is best fit over interior free blocks, then the tail
 * block that grows the high-water mark least (or fits tightest under it), then a new
 * chunk. Sizes are rounded up to the alignment, so every offset is aligned.
 */
#ifndef LOOM_SCHED_DYNALLOC_H
#define LOOM_SCHED_DYNALLOC_H

#include "loom/sched.h"

typedef struct loom__dyn_addr {
    int chunk;
    size_t offset; /* bytes from the chunk's base */
} loom__dyn_addr;

typedef struct loom__free_block {
    size_t offset, size; /* bytes */
} loom__free_block;

typedef struct loom__dyn_chunk {
    loom__free_block *blocks; /* sorted by offset; the last one is the tail */
    int n_blocks, cap_blocks;
    size_t max_size; /* high-water mark: end of the furthest allocation */
} loom__dyn_chunk;

typedef struct loom__dyn_alloc {
    size_t alignment;      /* power of two */
    size_t max_chunk_size; /* bytes one chunk may hold (the buffer type's max size) */
    int n_chunks;
    loom__dyn_chunk chunks[LOOM_GALLOC_MAX_CHUNKS];
} loom__dyn_alloc;

void loom__dyn_alloc_init(loom__dyn_alloc *a, size_t alignment, size_t max_chunk_size);
/* Forgets every allocation and chunk (keeps the block arrays for reuse). */
void loom__dyn_alloc_reset(loom__dyn_alloc *a);
void loom__dyn_alloc_release(loom__dyn_alloc *a); /* frees the block arrays */
size_t loom__dyn_alloc_align(const loom__dyn_alloc *a, size_t size);
/* LOOM_ERR_FULL when every chunk is taken, LOOM_ERR_NOMEM for host memory. */
loom_status loom__dyn_alloc_alloc(loom__dyn_alloc *a, size_t size, loom__dyn_addr *out);
loom_status loom__dyn_alloc_free(loom__dyn_alloc *a, loom__dyn_addr addr, size_t size);

#endif /* LOOM_SCHED_DYNALLOC_H */
