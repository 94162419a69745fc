/*
 * A pointer -> int map with open addressing (linear probing), used by the graph allocator
 * and the scheduler to find per-tensor records. Keys are tensor addresses; values are
 * dense indices into the caller's own record arrays, so growing the table never moves a
 * record. Clearing bumps an epoch (slots of older epochs count as empty), so it costs
 * nothing however large the table is. A slot holds key, value and epoch together: one
 * cache line visit per probe.
 */
#ifndef LOOM_SCHED_PTRMAP_H
#define LOOM_SCHED_PTRMAP_H

#include <stdint.h>

#include "loom/core.h"

typedef struct loom__ptrmap_slot {
    const void *key;
    int32_t val;
    uint32_t epoch; /* in use iff equal to the map's epoch */
} loom__ptrmap_slot;

typedef struct loom__ptrmap {
    loom__ptrmap_slot *slots; /* [cap] */
    uint32_t epoch;           /* bumping it empties the map in O(1) */
    size_t cap;               /* a power of two (0 before init) */
    size_t count;
    int shift; /* 64 - log2(cap) */
} loom__ptrmap;

/* Capacity for at least min_entries at load <= 1/2. LOOM_ERR_NOMEM on failure. */
loom_status loom__ptrmap_init(loom__ptrmap *m, size_t min_entries);
void loom__ptrmap_free(loom__ptrmap *m);
void loom__ptrmap_clear(loom__ptrmap *m);
/* Grows (rehashing) so that min_entries fit at load <= 1/2. */
loom_status loom__ptrmap_reserve(loom__ptrmap *m, size_t min_entries);
/* Inserts or overwrites. LOOM_ERR_NOMEM if the table had to grow and could not. */
loom_status loom__ptrmap_put(loom__ptrmap *m, const void *key, int val);

static inline size_t loom__ptrmap_slot_of(const loom__ptrmap *m, const void *key) {
    uint64_t h = (uint64_t)(uintptr_t)key;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> m->shift);
}

/* The value for key, or -1. */
static inline int loom__ptrmap_get(const loom__ptrmap *m, const void *key) {
    if (m->cap == 0) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = loom__ptrmap_slot_of(m, key);; i = (i + 1) & mask) {
        const loom__ptrmap_slot *s = &m->slots[i];
        if (s->epoch != m->epoch) return -1;
        if (s->key == key) return s->val;
    }
}

#endif /* LOOM_SCHED_PTRMAP_H */
