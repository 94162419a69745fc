/*
 * The graph allocator (loom_gallocr): plans a graph's memory by simulating it, then
 * allocates one buffer per chunk of each buffer type once, and stamps offsets.
 *
 * Planning walks the graph twice. A counting pass gives every tensor its number of
 * children (consumers) and views; user inputs are placed at once. The allocation pass
 * then places each node in execution order and, after it, decrements its parents'
 * counts: a parent with no children and no views left is dead and its bytes go back to
 * the free list (a dead view releases its hold on the tensor it views). Graph outputs are
 * never freed. A node whose op can run in place takes over a parent that dies with it
 * (only consumer, no views, same layout, same memory). Tensors that already have data, and
 * views, are never placed. The plan keeps, for every node, leaf and source, its buffer id,
 * chunk, offset and planned size, plus a fingerprint of the graph's topology, so a later
 * graph can be checked against it in one pass.
 */
#include <stdio.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "sched/dynalloc.h"
#include "sched/galloc-impl.h"
#include "sched/ptrmap.h"

typedef struct galloc_hnode {
    int n_children; /* consumers not yet run */
    int n_views;    /* live views of this tensor */
    int buffer_id;
    bool own;          /* holds planned memory now */
    bool placed;       /* got an address in this plan (kept after it is freed) */
    bool counted_view; /* a view node counted in its view_src's n_views */
    bool in_graph;     /* a node or leaf of the planned graph */
    loom__dyn_addr addr;
    size_t size; /* bytes reserved (buffer type alloc size, before alignment) */
} galloc_hnode;

typedef struct galloc_talloc {
    int buffer_id; /* -1: a view or pre-allocated when planned */
    bool internal; /* a node or leaf of the graph: checked at its own position */
    int chunk;
    size_t offset;
    size_t size_max;
} galloc_talloc;

typedef struct galloc_node_plan {
    galloc_talloc dst;
    galloc_talloc src[LOOM_MAX_SRC];
    int alloc_id; /* allocator of the buffer id requested for the node */
} galloc_node_plan;

struct loom_gallocr {
    int n_bufs;
    loom_buft_t *bufts;   /* [n_bufs] */
    int *alloc_of;        /* [n_bufs]: the first buffer id with the same buffer type */
    loom__dyn_alloc *dyn; /* [n_bufs]; entry i used when alloc_of[i] == i */
    loom_buffer_t (*buffers)[LOOM_GALLOC_MAX_CHUNKS]; /* [n_bufs][chunk] */

    loom__ptrmap map; /* tensor -> index into hn */
    galloc_hnode *hn;
    int n_hn, cap_hn;
    loom__ptrmap pos; /* tensor -> position code (topology fingerprint) */

    bool has_plan;
    int plan_nodes, plan_leafs;
    galloc_node_plan *node_plan;
    int cap_node_plan;
    galloc_talloc *leaf_plan;
    int *leaf_alloc_id;
    int cap_leaf_plan;
    uint64_t topo;
    bool ext_topo; /* topology fingerprints come from the caller */
    uint64_t ext_topo_val;
    bool *plain_size; /* [n_bufs]: alloc size is loom_nbytes (no buffer type hook) */
    int n_reserves;
};

/* ------------------------------------------------------------------ construction */

loom_gallocr *loom_gallocr_new_n(const loom_buft_t *bufts, int n_bufs) {
    if (!bufts || n_bufs <= 0) {
        loom_error(LOOM_ERR_INVALID_ARG, "gallocr: need at least one buffer type (got %d)", n_bufs);
        return NULL;
    }
    for (int i = 0; i < n_bufs; i++) {
        if (!bufts[i]) {
            loom_error(LOOM_ERR_INVALID_ARG, "gallocr: buffer type %d is NULL", i);
            return NULL;
        }
    }
    loom_gallocr *ga = loom_calloc(1, sizeof(*ga));
    if (!ga) goto oom;
    ga->n_bufs = n_bufs;
    ga->bufts = loom_calloc((size_t)n_bufs, sizeof(*ga->bufts));
    ga->alloc_of = loom_calloc((size_t)n_bufs, sizeof(*ga->alloc_of));
    ga->dyn = loom_calloc((size_t)n_bufs, sizeof(*ga->dyn));
    ga->buffers = loom_calloc((size_t)n_bufs, sizeof(*ga->buffers));
    ga->plain_size = loom_calloc((size_t)n_bufs, sizeof(*ga->plain_size));
    if (!ga->bufts || !ga->alloc_of || !ga->dyn || !ga->buffers || !ga->plain_size) goto oom;
    for (int i = 0; i < n_bufs; i++) {
        ga->bufts[i] = bufts[i];
        ga->plain_size[i] = bufts[i]->iface->get_alloc_size == NULL;
        ga->alloc_of[i] = i;
        for (int j = 0; j < i; j++) {
            if (bufts[j] == bufts[i]) {
                ga->alloc_of[i] = j;
                break;
            }
        }
        if (ga->alloc_of[i] == i) {
            size_t align = loom_buft_alignment(bufts[i]);
            if (align == 0 || (align & (align - 1)) != 0) {
                loom_gallocr_free(ga);
                loom_error(LOOM_ERR_INVALID_ARG,
                           "gallocr: buffer type %s has alignment %zu, not a power of two",
                           loom_buft_name(bufts[i]), align);
                return NULL;
            }
            loom__dyn_alloc_init(&ga->dyn[i], align, loom_buft_max_size(bufts[i]));
        }
    }
    if (loom__ptrmap_init(&ga->map, 256) != LOOM_OK) goto oom;
    if (loom__ptrmap_init(&ga->pos, 256) != LOOM_OK) goto oom;
    return ga;
oom:
    loom_gallocr_free(ga);
    loom_error(LOOM_ERR_NOMEM, "gallocr: out of host memory creating the allocator");
    return NULL;
}

loom_gallocr *loom_gallocr_new(loom_buft_t buft) {
    return loom_gallocr_new_n(&buft, 1);
}

static void free_buffers(loom_gallocr *ga) {
    for (int b = 0; b < ga->n_bufs; b++) {
        for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++) {
            loom_buffer_free(ga->buffers[b][c]);
            ga->buffers[b][c] = NULL;
        }
    }
}

void loom_gallocr_free(loom_gallocr *ga) {
    if (!ga) return;
    if (ga->buffers) free_buffers(ga);
    if (ga->dyn) {
        for (int i = 0; i < ga->n_bufs; i++)
            loom__dyn_alloc_release(&ga->dyn[i]);
    }
    loom__ptrmap_free(&ga->map);
    loom__ptrmap_free(&ga->pos);
    loom_free(ga->hn);
    loom_free(ga->node_plan);
    loom_free(ga->leaf_plan);
    loom_free(ga->leaf_alloc_id);
    loom_free(ga->bufts);
    loom_free(ga->alloc_of);
    loom_free(ga->dyn);
    loom_free(ga->buffers);
    loom_free(ga->plain_size);
    loom_free(ga);
}

static inline size_t alloc_size(const loom_gallocr *ga, int buffer_id, const loom_tensor *t) {
    return ga->plain_size[buffer_id] ? loom_nbytes(t)
                                     : loom_buft_alloc_size(ga->bufts[buffer_id], t);
}

/* ------------------------------------------------------------------ per-tensor records */

/* The record of t, created if absent; NULL on out-of-memory (error recorded). */
static galloc_hnode *hn_get(loom_gallocr *ga, const loom_tensor *t) {
    int i = loom__ptrmap_get(&ga->map, t);
    if (i >= 0) return &ga->hn[i];
    if (ga->n_hn == ga->cap_hn) {
        int cap = ga->cap_hn ? 2 * ga->cap_hn : 1024;
        galloc_hnode *hn = loom_realloc(ga->hn, (size_t)cap * sizeof(*hn));
        if (!hn) {
            loom_error(LOOM_ERR_NOMEM, "gallocr: out of host memory for tensor records");
            return NULL;
        }
        ga->hn = hn;
        ga->cap_hn = cap;
    }
    if (loom__ptrmap_put(&ga->map, t, ga->n_hn) != LOOM_OK) return NULL;
    galloc_hnode *h = &ga->hn[ga->n_hn++];
    memset(h, 0, sizeof(*h));
    h->buffer_id = -1;
    return h;
}

static galloc_hnode *hn_find(loom_gallocr *ga, const loom_tensor *t) {
    int i = loom__ptrmap_get(&ga->map, t);
    return i >= 0 ? &ga->hn[i] : NULL;
}

/* Which sources an op may overwrite in place: elementwise binary ops any source of the
 * same layout, the rest only their first source (other sources are read across rows). */
static int inplace_src_count(loom_op op) {
    switch (op) {
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        return LOOM_MAX_SRC;
    case LOOM_OP_ADD_ID:
    case LOOM_OP_SCALE:
    case LOOM_OP_SQR:
    case LOOM_OP_SQRT:
    case LOOM_OP_UNARY:
    case LOOM_OP_RMS_NORM:
    case LOOM_OP_SOFT_MAX:
    case LOOM_OP_ROPE:
    case LOOM_OP_FILL:
        return 1;
    default:
        return 0;
    }
}

static loom_status free_node(loom_gallocr *ga, loom_tensor *t, galloc_hnode *h) {
    if (t->flags & LOOM_TENSOR_FLAG_OUTPUT) return LOOM_OK; /* outputs are never freed */
    if (!h->own) return LOOM_OK;
    h->own = false;
    return loom__dyn_alloc_free(&ga->dyn[ga->alloc_of[h->buffer_id]], h->addr, h->size);
}

static loom_status allocate_node(loom_gallocr *ga, loom_tensor *t, int buffer_id) {
    if (t->view_src || t->data || t->buffer) return LOOM_OK; /* views and pre-allocated */
    galloc_hnode *h = hn_get(ga, t);
    if (!h) return loom_last_status();
    if (h->placed) return LOOM_OK;
    h->placed = true;
    h->own = true;
    h->buffer_id = buffer_id;
    loom_buft_t buft = ga->bufts[buffer_id];
    size_t size = alloc_size(ga, buffer_id, t);

    int n_inplace = inplace_src_count(t->op);
    for (int j = 0; j < n_inplace; j++) {
        loom_tensor *parent = t->src[j];
        if (!parent) continue;
        galloc_hnode *ph = hn_find(ga, parent);
        if (!ph || !ph->own) continue; /* external, a view, or already freed */
        if (parent->flags & LOOM_TENSOR_FLAG_OUTPUT) continue;
        if (ph->n_children != 1 || ph->n_views != 0) continue;
        if (ga->alloc_of[ph->buffer_id] != ga->alloc_of[buffer_id]) continue;
        if (ph->size < size || !loom_are_same_layout(t, parent)) continue;
        h->buffer_id = ph->buffer_id;
        h->addr = ph->addr;
        h->size = ph->size;
        ph->own = false; /* the node now owns the bytes; the parent is not freed */
        return LOOM_OK;
    }
    h->size = size;
    loom_status st = loom__dyn_alloc_alloc(&ga->dyn[ga->alloc_of[buffer_id]], size, &h->addr);
    if (st != LOOM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", loom_last_error());
        return loom_error(st, "gallocr: cannot place %s (%zu bytes) in %s: %s", t->name, size,
                          loom_buft_name(buft), why);
    }
    return LOOM_OK;
}

/* t has no children and no views left: free it, or release the view's hold on its source
 * (which may in turn die). */
static loom_status release_dead(loom_gallocr *ga, loom_tensor *t) {
    for (;;) {
        galloc_hnode *h = hn_find(ga, t);
        if (!h) return LOOM_OK;
        if (t->view_src) {
            if (!h->counted_view) return LOOM_OK;
            h->counted_view = false;
            loom_tensor *vs = t->view_src;
            galloc_hnode *vh = hn_find(ga, vs);
            if (!vh) return LOOM_OK;
            LOOM_ASSERT(vh->n_views > 0);
            vh->n_views--;
            if (vh->n_views != 0 || vh->n_children != 0) return LOOM_OK;
            t = vs;
            continue;
        }
        return free_node(ga, t, h);
    }
}

static int buffer_id_at(const int *ids, int i) {
    return ids ? ids[i] : 0;
}

static loom_status plan_graph(loom_gallocr *ga, const loom_graph *g, const int *node_ids,
                              const int *leaf_ids) {
    loom__ptrmap_clear(&ga->map);
    ga->n_hn = 0;
    loom_status st =
        loom__ptrmap_reserve(&ga->map, (size_t)g->n_nodes * 2 + (size_t)g->n_leafs + 16);
    if (st != LOOM_OK) return st;
    for (int b = 0; b < ga->n_bufs; b++) {
        if (ga->alloc_of[b] == b) loom__dyn_alloc_reset(&ga->dyn[b]);
    }

    /* leafs first */
    for (int i = 0; i < g->n_leafs; i++) {
        galloc_hnode *h = hn_get(ga, g->leafs[i]);
        if (!h) return loom_last_status();
        h->in_graph = true;
        st = allocate_node(ga, g->leafs[i], buffer_id_at(leaf_ids, i));
        if (st != LOOM_OK) return st;
    }

    /* count children and views; place inputs now */
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *node = g->nodes[i];
        int bid = buffer_id_at(node_ids, i);
        galloc_hnode *nh = hn_get(ga, node);
        if (!nh) return loom_last_status();
        nh->in_graph = true;
        if (node->view_src && node->op != LOOM_OP_NONE) {
            galloc_hnode *vh = hn_get(ga, node->view_src);
            galloc_hnode *h = vh ? hn_get(ga, node) : NULL;
            if (!h) return loom_last_status();
            vh = hn_find(ga, node->view_src); /* hn_get may have moved the records */
            if (!h->counted_view) {
                h->counted_view = true;
                vh->n_views++;
            }
        }
        if (node->flags & LOOM_TENSOR_FLAG_INPUT) {
            st = allocate_node(ga, node, bid);
            if (st != LOOM_OK) return st;
        }
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            loom_tensor *src = node->src[j];
            if (!src) continue;
            galloc_hnode *sh = hn_get(ga, src);
            if (!sh) return loom_last_status();
            sh->n_children++;
            if (src->flags & LOOM_TENSOR_FLAG_INPUT) {
                st = allocate_node(ga, src, bid);
                if (st != LOOM_OK) return st;
            }
        }
    }

    /* place nodes in order, freeing parents as they die */
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *node = g->nodes[i];
        int bid = buffer_id_at(node_ids, i);
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (!node->src[j]) continue;
            st = allocate_node(ga, node->src[j], bid);
            if (st != LOOM_OK) return st;
        }
        st = allocate_node(ga, node, bid);
        if (st != LOOM_OK) return st;
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            loom_tensor *parent = node->src[j];
            if (!parent) continue;
            galloc_hnode *ph = hn_find(ga, parent);
            LOOM_ASSERT(ph && ph->n_children > 0);
            ph->n_children--;
            if (ph->n_children == 0 && ph->n_views == 0) {
                st = release_dead(ga, parent);
                if (st != LOOM_OK) return st;
            }
        }
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------------ the plan */

static galloc_talloc talloc_of(loom_gallocr *ga, const loom_tensor *t) {
    galloc_talloc ta = {-1, false, 0, 0, 0};
    galloc_hnode *h = hn_find(ga, t);
    ta.internal = h && h->in_graph;
    if (t->view_src || t->data || t->buffer) return ta;
    LOOM_ASSERT(h && h->placed);
    ta.buffer_id = h->buffer_id;
    ta.chunk = h->addr.chunk;
    ta.offset = h->addr.offset;
    ta.size_max = alloc_size(ga, h->buffer_id, t);
    return ta;
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0x100000001B3ull;
}

/* A fingerprint of what liveness and in-place reuse depend on: for every node, its op,
 * type, flags, and where each source and view source sits in the graph. */
static loom_status topology_of(loom_gallocr *ga, const loom_graph *g, uint64_t *out) {
    if (ga->ext_topo) {
        *out = ga->ext_topo_val;
        return LOOM_OK;
    }
    loom__ptrmap_clear(&ga->pos);
    loom_status st = loom__ptrmap_reserve(&ga->pos, (size_t)g->n_nodes + (size_t)g->n_leafs + 16);
    if (st != LOOM_OK) return st;
    for (int i = 0; i < g->n_leafs; i++) {
        st = loom__ptrmap_put(&ga->pos, g->leafs[i], -(i + 2)); /* -1 means absent */
        if (st != LOOM_OK) return st;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        st = loom__ptrmap_put(&ga->pos, g->nodes[i], i + 1);
        if (st != LOOM_OK) return st;
    }
    const uint64_t external = 0x7fffffff;
    uint64_t h = mix(0xcbf29ce484222325ull, (uint64_t)g->n_nodes);
    h = mix(h, (uint64_t)g->n_leafs);
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        /* not the shape: a smaller batch of the same graph must fit the reserved plan */
        h = mix(h, (uint64_t)t->op | ((uint64_t)t->type << 8) | ((uint64_t)(t->flags & 3) << 16) |
                       ((uint64_t)(t->data != NULL) << 20));
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            const loom_tensor *s = t->src[j];
            if (!s) continue;
            int p = loom__ptrmap_get(&ga->pos, s);
            h = mix(h, ((uint64_t)j << 40) | (p != -1 ? (uint64_t)(uint32_t)p : external));
        }
        if (t->view_src) {
            int p = loom__ptrmap_get(&ga->pos, t->view_src);
            h = mix(h, p != -1 ? (uint64_t)(uint32_t)p : external);
        }
    }
    *out = h;
    return LOOM_OK;
}

static loom_status record_plan(loom_gallocr *ga, const loom_graph *g, const int *node_ids,
                               const int *leaf_ids) {
    if (g->n_nodes > ga->cap_node_plan) {
        galloc_node_plan *np = loom_realloc(ga->node_plan, (size_t)g->n_nodes * sizeof(*np));
        if (!np) return loom_error(LOOM_ERR_NOMEM, "gallocr: out of host memory for the plan");
        ga->node_plan = np;
        ga->cap_node_plan = g->n_nodes;
    }
    if (g->n_leafs > ga->cap_leaf_plan) {
        galloc_talloc *lp = loom_realloc(ga->leaf_plan, (size_t)g->n_leafs * sizeof(*lp));
        if (lp) ga->leaf_plan = lp;
        int *la = lp ? loom_realloc(ga->leaf_alloc_id, (size_t)g->n_leafs * sizeof(*la)) : NULL;
        if (!la) return loom_error(LOOM_ERR_NOMEM, "gallocr: out of host memory for the plan");
        ga->leaf_alloc_id = la;
        ga->cap_leaf_plan = g->n_leafs;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *node = g->nodes[i];
        galloc_node_plan *np = &ga->node_plan[i];
        np->dst = talloc_of(ga, node);
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (node->src[j]) {
                np->src[j] = talloc_of(ga, node->src[j]);
            } else {
                np->src[j].buffer_id = -1;
                np->src[j].internal = true;
                np->src[j].size_max = 0;
            }
        }
        np->alloc_id = ga->alloc_of[buffer_id_at(node_ids, i)];
    }
    for (int i = 0; i < g->n_leafs; i++) {
        ga->leaf_plan[i] = talloc_of(ga, g->leafs[i]);
        ga->leaf_alloc_id[i] = ga->alloc_of[buffer_id_at(leaf_ids, i)];
    }
    loom_status st = topology_of(ga, g, &ga->topo);
    if (st != LOOM_OK) return st;
    ga->plan_nodes = g->n_nodes;
    ga->plan_leafs = g->n_leafs;
    return LOOM_OK;
}

static loom_status check_ids(const loom_gallocr *ga, const loom_graph *g, const int *node_ids,
                             const int *leaf_ids) {
    if (!g) return loom_error(LOOM_ERR_INVALID_ARG, "gallocr: NULL graph");
    for (int i = 0; node_ids && i < g->n_nodes; i++) {
        if (node_ids[i] < 0 || node_ids[i] >= ga->n_bufs) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "gallocr: node %d (%s) has buffer id %d, outside [0, %d)", i,
                              g->nodes[i]->name, node_ids[i], ga->n_bufs);
        }
    }
    for (int i = 0; leaf_ids && i < g->n_leafs; i++) {
        if (leaf_ids[i] < 0 || leaf_ids[i] >= ga->n_bufs) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "gallocr: leaf %d (%s) has buffer id %d, outside [0, %d)", i,
                              g->leafs[i]->name, leaf_ids[i], ga->n_bufs);
        }
    }
    return LOOM_OK;
}

static loom_status alloc_buffers(loom_gallocr *ga) {
    for (int b = 0; b < ga->n_bufs; b++) {
        if (ga->alloc_of[b] != b) continue;
        const loom__dyn_alloc *d = &ga->dyn[b];
        for (int c = 0; c < d->n_chunks; c++) {
            size_t need = d->chunks[c].max_size;
            loom_buffer_t buf = ga->buffers[b][c];
            if (buf && loom_buffer_size(buf) >= need) continue;
            /* free first, so a memory cap sees only the new size */
            loom_buffer_free(buf);
            ga->buffers[b][c] = NULL;
            buf = loom_buft_alloc_buffer(ga->bufts[b], need);
            if (!buf) {
                char why[256];
                loom_status st = loom_last_status();
                if (st == LOOM_OK) st = LOOM_ERR_DEVICE_OOM;
                snprintf(why, sizeof why, "%s", loom_last_error());
                free_buffers(ga);
                return loom_error(st,
                                  "gallocr: failed to allocate a %s buffer of %zu bytes "
                                  "(chunk %d): %s",
                                  loom_buft_name(ga->bufts[b]), need, c, why);
            }
            loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_COMPUTE);
            ga->buffers[b][c] = buf;
        }
    }
    return LOOM_OK;
}

static loom_status reserve_impl(loom_gallocr *ga, loom_graph *g, const int *node_ids,
                                const int *leaf_ids, size_t *sizes) {
    if (!ga) return loom_error(LOOM_ERR_INVALID_ARG, "gallocr: NULL allocator");
    loom_status st = check_ids(ga, g, node_ids, leaf_ids);
    if (st != LOOM_OK) return st;
    ga->has_plan = false;
    st = plan_graph(ga, g, node_ids, leaf_ids);
    if (st == LOOM_OK) st = record_plan(ga, g, node_ids, leaf_ids);
    if (st != LOOM_OK) return st;
    if (sizes) {
        for (int b = 0; b < ga->n_bufs; b++) {
            sizes[b] = 0;
            if (ga->alloc_of[b] != b) continue;
            for (int c = 0; c < ga->dyn[b].n_chunks; c++)
                sizes[b] += ga->dyn[b].chunks[c].max_size;
        }
        return LOOM_OK; /* measured only: the plan has no buffers behind it */
    }
    st = alloc_buffers(ga);
    if (st != LOOM_OK) return st;
    ga->has_plan = true;
    ga->n_reserves++;
    return LOOM_OK;
}

loom_status loom_gallocr_reserve_n(loom_gallocr *ga, loom_graph *g, const int *node_buffer_ids,
                                   const int *leaf_buffer_ids) {
    return reserve_impl(ga, g, node_buffer_ids, leaf_buffer_ids, NULL);
}

loom_status loom_gallocr_reserve(loom_gallocr *ga, loom_graph *g) {
    return reserve_impl(ga, g, NULL, NULL, NULL);
}

loom_status loom_gallocr_reserve_n_size(loom_gallocr *ga, loom_graph *g, const int *node_buffer_ids,
                                        const int *leaf_buffer_ids, size_t *sizes) {
    if (!sizes) return loom_error(LOOM_ERR_INVALID_ARG, "gallocr: NULL sizes");
    return reserve_impl(ga, g, node_buffer_ids, leaf_buffer_ids, sizes);
}

/* ------------------------------------------------------------------ check and stamp */

const char *loom__galloc_check_name(loom__galloc_check c) {
    switch (c) {
    case LOOM__GALLOC_FITS:
        return "fits";
    case LOOM__GALLOC_NO_PLAN:
        return "no plan";
    case LOOM__GALLOC_IDS:
        return "buffer type changed";
    case LOOM__GALLOC_SHAPE:
        return "node or leaf count changed";
    case LOOM__GALLOC_SIZE:
        return "a tensor outgrew the plan";
    case LOOM__GALLOC_TOPOLOGY:
        return "topology changed";
    }
    return "?";
}

static bool talloc_fits(const loom_gallocr *ga, const loom_tensor *t, const galloc_talloc *ta) {
    if (t->view_src || t->data || t->buffer) return true;
    if (ta->buffer_id < 0) return false;
    return ta->size_max >= alloc_size(ga, ta->buffer_id, t);
}

static bool needs_placing(const loom_tensor *t) {
    return !t->view_src && !t->data && !t->buffer;
}

loom__galloc_check loom__gallocr_check(loom_gallocr *ga, const loom_graph *g, const int *node_ids,
                                       const int *leaf_ids) {
    if (!ga->has_plan) return LOOM__GALLOC_NO_PLAN;
    if (g->n_nodes != ga->plan_nodes || g->n_leafs != ga->plan_leafs) return LOOM__GALLOC_SHAPE;
    loom__galloc_check why = LOOM__GALLOC_FITS;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *node = g->nodes[i];
        const galloc_node_plan *np = &ga->node_plan[i];
        if (needs_placing(node)) {
            if (node_ids && ga->alloc_of[node_ids[i]] != np->alloc_id) return LOOM__GALLOC_IDS;
            if (why == LOOM__GALLOC_FITS && !talloc_fits(ga, node, &np->dst)) {
                why = LOOM__GALLOC_SIZE;
            }
        }
        for (int j = 0; j < LOOM_MAX_SRC && why == LOOM__GALLOC_FITS; j++) {
            /* sources in the graph are checked at their own position (same topology) */
            if (node->src[j] && !np->src[j].internal &&
                !talloc_fits(ga, node->src[j], &np->src[j])) {
                why = LOOM__GALLOC_SIZE;
            }
        }
    }
    for (int i = 0; i < g->n_leafs; i++) {
        if (!needs_placing(g->leafs[i])) continue;
        if (leaf_ids && ga->alloc_of[leaf_ids[i]] != ga->leaf_alloc_id[i]) return LOOM__GALLOC_IDS;
        if (!talloc_fits(ga, g->leafs[i], &ga->leaf_plan[i])) why = LOOM__GALLOC_SIZE;
    }
    if (why != LOOM__GALLOC_FITS) return why;
    uint64_t topo;
    if (topology_of(ga, g, &topo) != LOOM_OK || topo != ga->topo) return LOOM__GALLOC_TOPOLOGY;
    return LOOM__GALLOC_FITS;
}

bool loom_gallocr_needs_realloc(loom_gallocr *ga, loom_graph *g) {
    return !ga || !g || loom__gallocr_check(ga, g, NULL, NULL) != LOOM__GALLOC_FITS;
}

static loom_status init_tensor(loom_gallocr *ga, loom_tensor *t, const galloc_talloc *ta) {
    if (t->view_src) {
        if (t->buffer) return LOOM_OK;
        if (t->view_src->buffer) return loom_buffer_init_view(t);
        if (t->data) return LOOM_OK; /* a view of caller-owned host data */
        if (t->view_src->data) {
            t->data = (char *)t->view_src->data + t->view_offs;
            return LOOM_OK;
        }
        return loom_error(LOOM_ERR_INVALID_ARG, "gallocr: view %s of %s, which has no memory",
                          t->name, t->view_src->name);
    }
    if (t->data || t->buffer) return LOOM_OK;
    LOOM_ASSERT(ta->buffer_id >= 0);
    loom_buffer_t buf = ga->buffers[ga->alloc_of[ta->buffer_id]][ta->chunk];
    LOOM_ASSERT(buf != NULL);
    LOOM_ASSERT(ta->offset + alloc_size(ga, ta->buffer_id, t) <= loom_buffer_size(buf));
    return loom_buffer_alloc_tensor(buf, t, ta->offset);
}

loom_status loom__gallocr_stamp(loom_gallocr *ga, loom_graph *g) {
    for (int b = 0; b < ga->n_bufs; b++) {
        if (ga->alloc_of[b] != b) continue;
        for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++) {
            loom_buffer_t buf = ga->buffers[b][c];
            if (buf && buf->iface->reset) buf->iface->reset(buf);
        }
    }
    loom_status st;
    for (int i = 0; i < g->n_leafs; i++) {
        st = init_tensor(ga, g->leafs[i], &ga->leaf_plan[i]);
        if (st != LOOM_OK) return st;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *node = g->nodes[i];
        const galloc_node_plan *np = &ga->node_plan[i];
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (!node->src[j]) continue;
            st = init_tensor(ga, node->src[j], &np->src[j]);
            if (st != LOOM_OK) return st;
        }
        st = init_tensor(ga, node, &np->dst);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

loom_status loom_gallocr_alloc_graph(loom_gallocr *ga, loom_graph *g) {
    if (!ga || !g) return loom_error(LOOM_ERR_INVALID_ARG, "gallocr: NULL allocator or graph");
    loom__galloc_check why = loom__gallocr_check(ga, g, NULL, NULL);
    if (why != LOOM__GALLOC_FITS) {
        bool single = true;
        for (int b = 1; b < ga->n_bufs; b++)
            single = single && ga->alloc_of[b] == 0;
        if (!single) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "gallocr: the graph does not fit the plan (%s); call "
                              "loom_gallocr_reserve_n first",
                              loom__galloc_check_name(why));
        }
        loom_status st = loom_gallocr_reserve(ga, g);
        if (st != LOOM_OK) return st;
    }
    return loom__gallocr_stamp(ga, g);
}

size_t loom_gallocr_get_buffer_size(const loom_gallocr *ga, int buffer_id) {
    if (!ga || buffer_id < 0 || buffer_id >= ga->n_bufs) return 0;
    if (ga->alloc_of[buffer_id] != buffer_id) return 0;
    size_t total = 0;
    for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++) {
        if (ga->buffers[buffer_id][c]) total += loom_buffer_size(ga->buffers[buffer_id][c]);
    }
    return total;
}

int loom_gallocr_get_n_chunks(const loom_gallocr *ga, int buffer_id) {
    if (!ga || buffer_id < 0 || buffer_id >= ga->n_bufs) return 0;
    int b = ga->alloc_of[buffer_id];
    int n = 0;
    for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++)
        n += ga->buffers[b][c] != NULL;
    return n;
}

int loom__gallocr_n_reserves(const loom_gallocr *ga) {
    return ga ? ga->n_reserves : 0;
}

void loom__gallocr_set_topology(loom_gallocr *ga, uint64_t fp) {
    ga->ext_topo = true;
    ga->ext_topo_val = fp;
}
