/*
 * The CUDA backend's graph cache (graph-cache.h): keys, LRU eviction and growth. No CUDA
 * here; cuda-graph.c stores its cudaGraphExec_t in the entries.
 */
#include "backends/cuda/graph-cache.h"

#include <string.h>

#include "loom/core.h"

/* Evicted hashes remembered: a working set of W keys in a cache of c entries brings a key
 * back W - c evictions after it was dropped, so every W the cache could hold (up to its
 * maximum) is seen to thrash; a linear scan, only on a miss of a full cache. */
#define EVICTED (2 * LOOM_CUDA_GCACHE_MAX)

struct loom__cuda_gcache {
    loom__cuda_gentry *e; /* cap entries, the first n used */
    int n, cap;
    uint64_t clock;
    uint64_t *key; /* the key being built */
    size_t key_n, key_cap;
    bool oom;
    uint64_t evicted[EVICTED]; /* ring of recently evicted hashes */
    int n_evicted, evict_next;
    void (*release)(void *exec, void *ud);
    void *ud;
    loom__cuda_gcache_stats st;
};

loom__cuda_gcache *loom__cuda_gcache_new(void (*release)(void *exec, void *ud), void *ud) {
    loom__cuda_gcache *gc = loom_calloc(1, sizeof *gc);
    if (!gc) return NULL;
    gc->e = loom_calloc(LOOM_CUDA_GCACHE_MIN, sizeof *gc->e);
    if (!gc->e) {
        loom_free(gc);
        return NULL;
    }
    gc->cap = LOOM_CUDA_GCACHE_MIN;
    gc->release = release;
    gc->ud = ud;
    return gc;
}

static void gentry_release(loom__cuda_gcache *gc, loom__cuda_gentry *e) {
    if (e->exec && gc->release) gc->release(e->exec, gc->ud);
    loom_free(e->key);
    memset(e, 0, sizeof *e);
}

void loom__cuda_gcache_clear(loom__cuda_gcache *gc) {
    if (!gc) return;
    for (int i = 0; i < gc->n; i++)
        gentry_release(gc, &gc->e[i]);
    gc->n = 0;
}

void loom__cuda_gcache_free(loom__cuda_gcache *gc) {
    if (!gc) return;
    loom__cuda_gcache_clear(gc);
    loom_free(gc->e);
    loom_free(gc->key);
    loom_free(gc);
}

static void key_push(loom__cuda_gcache *gc, uint64_t w) {
    if (gc->oom) return;
    if (gc->key_n == gc->key_cap) {
        size_t cap = gc->key_cap ? 2 * gc->key_cap : 1024;
        uint64_t *p = loom_realloc(gc->key, cap * sizeof *p);
        if (!p) {
            gc->oom = true;
            return;
        }
        gc->key = p;
        gc->key_cap = cap;
    }
    gc->key[gc->key_n++] = w;
}

static void key_push_tensor(loom__cuda_gcache *gc, const loom_tensor *t) {
    key_push(gc, (uint64_t)(uintptr_t)t);
    key_push(gc, (uint64_t)(uintptr_t)t->data);
    key_push(gc, (uint64_t)t->type | ((uint64_t)t->op << 32));
    for (int i = 0; i < LOOM_MAX_DIMS; i++) {
        key_push(gc, (uint64_t)t->ne[i]);
        key_push(gc, (uint64_t)t->nb[i]);
    }
}

/* Builds the key of g; false when the host is out of memory (then no caching). */
static bool key_build(loom__cuda_gcache *gc, const loom_graph *g, uint64_t *hash) {
    gc->key_n = 0;
    gc->oom = false;
    key_push(gc, (uint64_t)g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        key_push_tensor(gc, t);
        for (size_t w = 0; w < LOOM_MAX_OP_PARAMS / sizeof(uint64_t); w++) {
            uint64_t v;
            memcpy(&v, (const char *)t->op_params + w * sizeof v, sizeof v);
            key_push(gc, v);
        }
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (!t->src[j]) continue;
            key_push(gc, 0x5352430000000000ull | (uint64_t)j); /* "SRC" + slot */
            key_push_tensor(gc, t->src[j]);
        }
    }
    if (gc->oom) return false;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < gc->key_n; i++)
        h = (h ^ gc->key[i]) * 1099511628211ull;
    *hash = h;
    return true;
}

/* A key evicted earlier comes back: the working set is larger than the cache; double it
 * (the new half empty). false when it cannot grow. */
static bool grow(loom__cuda_gcache *gc, uint64_t hash) {
    bool thrash = false;
    for (int i = 0; i < gc->n_evicted && !thrash; i++)
        thrash = gc->evicted[i] == hash;
    if (!thrash || gc->cap >= LOOM_CUDA_GCACHE_MAX) return false;
    loom__cuda_gentry *e = loom_realloc(gc->e, (size_t)gc->cap * 2 * sizeof *e);
    if (!e) return false; /* keep the size; evicting still works */
    memset(e + gc->cap, 0, (size_t)gc->cap * sizeof *e);
    gc->e = e;
    gc->cap *= 2;
    gc->st.grows++;
    return true;
}

loom__cuda_gentry *loom__cuda_gcache_lookup(loom__cuda_gcache *gc, const loom_graph *g) {
    uint64_t hash;
    if (!key_build(gc, g, &hash)) return NULL;
    for (int i = 0; i < gc->n; i++) {
        loom__cuda_gentry *e = &gc->e[i];
        if (e->hash == hash && e->n == gc->key_n &&
            memcmp(e->key, gc->key, gc->key_n * sizeof *gc->key) == 0) {
            e->last_use = ++gc->clock;
            gc->st.hits++;
            return e;
        }
    }
    gc->st.misses++;
    uint64_t *copy = loom_malloc(gc->key_n * sizeof *copy);
    if (!copy) return NULL;
    memcpy(copy, gc->key, gc->key_n * sizeof *copy);
    if (gc->n == gc->cap) (void)grow(gc, hash);
    loom__cuda_gentry *e;
    if (gc->n < gc->cap) {
        e = &gc->e[gc->n++];
    } else {
        e = &gc->e[0];
        for (int i = 1; i < gc->n; i++)
            if (gc->e[i].last_use < e->last_use) e = &gc->e[i];
        gc->evicted[gc->evict_next] = e->hash;
        gc->evict_next = (gc->evict_next + 1) % EVICTED;
        if (gc->n_evicted < EVICTED) gc->n_evicted++;
        gc->st.evictions++;
        gentry_release(gc, e);
    }
    e->hash = hash;
    e->key = copy;
    e->n = gc->key_n;
    e->last_use = ++gc->clock;
    return NULL;
}

void loom__cuda_gcache_get_stats(const loom__cuda_gcache *gc, loom__cuda_gcache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!gc) return;
    *out = gc->st;
    out->capacity = gc->cap;
    out->entries = gc->n;
}
