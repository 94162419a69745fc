/*
 * The pointer map of ptrmap.h: open addressing over tensor addresses, growth by rehash.
 */
#include "sched/ptrmap.h"

#include <string.h>

static loom_status ptrmap_alloc(loom__ptrmap *m, size_t cap) {
    const void **keys = loom_calloc(cap, sizeof(*keys));
    int *vals = loom_malloc(cap * sizeof(*vals));
    if (!keys || !vals) {
        loom_free(keys);
        loom_free(vals);
        return loom_error(LOOM_ERR_NOMEM, "pointer map: cannot allocate %zu slots", cap);
    }
    int bits = 0;
    while (((size_t)1 << bits) < cap) bits++;
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->count = 0;
    m->shift = 64 - bits;
    return LOOM_OK;
}

static size_t cap_for(size_t min_entries) {
    size_t cap = 16;
    while (cap < 2 * min_entries) cap *= 2;
    return cap;
}

loom_status loom__ptrmap_init(loom__ptrmap *m, size_t min_entries) {
    memset(m, 0, sizeof(*m));
    return ptrmap_alloc(m, cap_for(min_entries));
}

void loom__ptrmap_free(loom__ptrmap *m) {
    loom_free(m->keys);
    loom_free(m->vals);
    memset(m, 0, sizeof(*m));
}

void loom__ptrmap_clear(loom__ptrmap *m) {
    if (m->cap) memset(m->keys, 0, m->cap * sizeof(*m->keys));
    m->count = 0;
}

static void put_nogrow(loom__ptrmap *m, const void *key, int val) {
    size_t mask = m->cap - 1;
    for (size_t i = loom__ptrmap_slot(m, key);; i = (i + 1) & mask) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return;
        }
        if (m->keys[i] == NULL) {
            m->keys[i] = key;
            m->vals[i] = val;
            m->count++;
            return;
        }
    }
}

loom_status loom__ptrmap_reserve(loom__ptrmap *m, size_t min_entries) {
    if (m->cap >= 2 * min_entries && m->cap > 0) return LOOM_OK;
    loom__ptrmap old = *m;
    loom_status st = ptrmap_alloc(m, cap_for(min_entries));
    if (st != LOOM_OK) {
        *m = old;
        return st;
    }
    for (size_t i = 0; i < old.cap; i++) {
        if (old.keys[i]) put_nogrow(m, old.keys[i], old.vals[i]);
    }
    loom_free(old.keys);
    loom_free(old.vals);
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
