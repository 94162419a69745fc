/*
 * The pointer map of ptrmap.h: open addressing over tensor addresses, growth by rehash,
 * O(1) clearing by epoch.
 */
#include "sched/ptrmap.h"

#include <string.h>

static loom_status ptrmap_alloc(loom__ptrmap *m, size_t cap) {
    loom__ptrmap_slot *slots = loom_calloc(cap, sizeof(*slots));
    if (!slots) return loom_error(LOOM_ERR_NOMEM, "pointer map: cannot allocate %zu slots", cap);
    int bits = 0;
    while (((size_t)1 << bits) < cap)
        bits++;
    m->slots = slots;
    m->epoch = 1;
    m->cap = cap;
    m->count = 0;
    m->shift = 64 - bits;
    return LOOM_OK;
}

static size_t cap_for(size_t min_entries) {
    size_t cap = 16;
    while (cap < 2 * min_entries)
        cap *= 2;
    return cap;
}

loom_status loom__ptrmap_init(loom__ptrmap *m, size_t min_entries) {
    memset(m, 0, sizeof(*m));
    return ptrmap_alloc(m, cap_for(min_entries));
}

void loom__ptrmap_free(loom__ptrmap *m) {
    loom_free(m->slots);
    memset(m, 0, sizeof(*m));
}

void loom__ptrmap_clear(loom__ptrmap *m) {
    m->count = 0;
    if (++m->epoch == 0) { /* wrapped: really clear, once every 2^32 uses */
        if (m->cap) memset(m->slots, 0, m->cap * sizeof(*m->slots));
        m->epoch = 1;
    }
}

static void put_nogrow(loom__ptrmap *m, const void *key, int val) {
    size_t mask = m->cap - 1;
    for (size_t i = loom__ptrmap_slot_of(m, key);; i = (i + 1) & mask) {
        loom__ptrmap_slot *s = &m->slots[i];
        if (s->epoch != m->epoch) {
            s->key = key;
            s->val = val;
            s->epoch = m->epoch;
            m->count++;
            return;
        }
        if (s->key == key) {
            s->val = val;
            return;
        }
    }
}

loom_status loom__ptrmap_reserve(loom__ptrmap *m, size_t min_entries) {
    if (m->cap > 0 && m->cap >= 2 * min_entries) return LOOM_OK;
    loom__ptrmap old = *m;
    loom_status st = ptrmap_alloc(m, cap_for(min_entries));
    if (st != LOOM_OK) {
        *m = old;
        return st;
    }
    for (size_t i = 0; i < old.cap; i++) {
        if (old.slots[i].epoch == old.epoch) put_nogrow(m, old.slots[i].key, old.slots[i].val);
    }
    loom_free(old.slots);
    return LOOM_OK;
}

loom_status loom__ptrmap_put(loom__ptrmap *m, const void *key, int val) {
    LOOM_ASSERT(key != NULL);
    if (2 * (m->count + 1) > m->cap) {
        loom_status st = loom__ptrmap_reserve(m, m->count + 1);
        if (st != LOOM_OK) return st;
    }
    put_nogrow(m, key, val);
    return LOOM_OK;
}
