/*
 * graph.c: compute graphs. A graph is an execution-ordered node list plus leafs (op NONE
 * tensors), built by an iterative depth-first visit from outputs (src[] in order, then the
 * node itself), with an open-addressing visited set so each tensor appears once. Graphs
 * live in a context's arena; the DFS stack is heap memory grown only for deep graphs.
 */
#include <stdatomic.h>

#include "core/core-impl.h"

static atomic_uint_fast64_t loom__next_uid = 1;

uint64_t loom_graph_next_uid(void) {
    return (uint64_t)atomic_fetch_add(&loom__next_uid, 1);
}

/* A power of two >= 4 * size: nodes plus leafs fill at most half of the set. */
static size_t loom__hash_size(size_t size) {
    size_t h = 16;
    while (h < 4 * size)
        h *= 2;
    return h;
}

static size_t loom__graph_payload(size_t size) {
    return loom__align_up(sizeof(loom_graph), sizeof(void *)) +
           (2 * size + loom__hash_size(size)) * sizeof(loom_tensor *);
}

#define LOOM__MAX_GRAPH_SIZE ((size_t)1 << 26)

size_t loom_graph_overhead(size_t size) {
    return loom__graph_obj_size(loom__graph_payload(size));
}

loom_graph *loom_graph_new(loom_ctx *ctx, size_t size) {
    if (!ctx) {
        loom_error(LOOM_ERR_INVALID_ARG, "graph_new: ctx is NULL");
        return NULL;
    }
    if (size == 0 || size > LOOM__MAX_GRAPH_SIZE) {
        loom_error(LOOM_ERR_INVALID_ARG, "graph_new: size %zu is not in [1, %zu]", size,
                   LOOM__MAX_GRAPH_SIZE);
        return NULL;
    }
    size_t free_bytes = 0;
    size_t payload = loom__graph_payload(size);
    uint8_t *p = loom__ctx_alloc_graph(ctx, payload, &free_bytes);
    if (!p) {
        loom_error(LOOM_ERR_FULL,
                   "graph_new: context full: a graph of %zu nodes needs %zu bytes but only %zu "
                   "are free",
                   size, loom_graph_overhead(size), free_bytes);
        return NULL;
    }
    loom_graph *g = (loom_graph *)p;
    loom_tensor **arr = (loom_tensor **)(p + loom__align_up(sizeof(loom_graph), sizeof(void *)));
    memset(arr, 0, (2 * size + loom__hash_size(size)) * sizeof *arr);
    *g = (loom_graph){
        .size = (int)size,
        .nodes = arr,
        .leafs = arr + size,
        .uid = loom_graph_next_uid(),
        .hash_size = loom__hash_size(size),
        .hash_keys = arr + 2 * size,
    };
    return g;
}

static size_t loom__hash_ptr(const loom_tensor *t, size_t mask) {
    uint64_t h = (uint64_t)(uintptr_t)t;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & mask;
}

/* Slot of t, or of the empty slot where it would go. */
static size_t loom__hash_find(const loom_graph *g, const loom_tensor *t) {
    size_t mask = g->hash_size - 1;
    size_t i = loom__hash_ptr(t, mask);
    while (g->hash_keys[i] && g->hash_keys[i] != t)
        i = (i + 1) & mask;
    return i;
}

static bool loom__hash_contains(const loom_graph *g, const loom_tensor *t) {
    return g->hash_keys[loom__hash_find(g, t)] == t;
}

static void loom__hash_insert(loom_graph *g, loom_tensor *t) {
    g->hash_keys[loom__hash_find(g, t)] = t;
}

static void loom__hash_rebuild(loom_graph *g) {
    memset(g->hash_keys, 0, g->hash_size * sizeof *g->hash_keys);
    for (int i = 0; i < g->n_nodes; i++)
        loom__hash_insert(g, g->nodes[i]);
    for (int i = 0; i < g->n_leafs; i++)
        loom__hash_insert(g, g->leafs[i]);
}

typedef struct {
    loom_tensor *t;
    int next_src;
} loom__dfs_frame;

#define LOOM__DFS_LOCAL 128

loom_status loom_graph_build_forward(loom_graph *g, loom_tensor *t) {
    if (!g) return loom_error(LOOM_ERR_INVALID_ARG, "graph_build_forward: graph is NULL");
    if (!t) {
        if (loom_last_status() != LOOM_OK)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "graph_build_forward: tensor is NULL (earlier error: %s)",
                              loom_last_error());
        return loom_error(LOOM_ERR_INVALID_ARG, "graph_build_forward: tensor is NULL");
    }
    if (!g->hash_keys || g->hash_size == 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "graph_build_forward: graph has no visited set (a graph view?)");
    g->uid = loom_graph_next_uid();
    if (loom__hash_contains(g, t)) return LOOM_OK;

    loom__dfs_frame local[LOOM__DFS_LOCAL];
    loom__dfs_frame *stack = local;
    size_t cap = LOOM__DFS_LOCAL, sp = 0;
    int pending_nodes = 0, pending_leafs = 0;
    const int n_nodes0 = g->n_nodes, n_leafs0 = g->n_leafs;
    loom_status st = LOOM_OK;

    loom_tensor *next = t;
    for (;;) {
        if (next) {
            /* push `next`: it is unvisited; check capacity for what it will become */
            bool leaf = next->op == LOOM_OP_NONE;
            if (leaf ? g->n_leafs + pending_leafs >= g->size
                     : g->n_nodes + pending_nodes >= g->size) {
                char shape[96];
                st = loom_error(LOOM_ERR_FULL,
                                "graph_build_forward: graph capacity %d exceeded adding %s '%s' "
                                "%s (%d nodes, %d leafs)",
                                g->size, leaf ? "leaf" : "node", next->name,
                                loom__shape_str(next, shape, sizeof shape),
                                g->n_nodes + pending_nodes, g->n_leafs + pending_leafs);
                break;
            }
            if (sp == cap) {
                size_t ncap = cap * 2;
                loom__dfs_frame *ns;
                if (stack == local) {
                    ns = loom_malloc(ncap * sizeof *ns);
                    if (ns) memcpy(ns, local, sizeof local);
                } else {
                    ns = loom_realloc(stack, ncap * sizeof *ns);
                }
                if (!ns) {
                    st = loom_error(LOOM_ERR_NOMEM,
                                    "graph_build_forward: out of memory for a DFS stack of %zu",
                                    ncap);
                    break;
                }
                stack = ns;
                cap = ncap;
            }
            loom__hash_insert(g, next);
            if (leaf)
                pending_leafs++;
            else
                pending_nodes++;
            stack[sp++] = (loom__dfs_frame){next, 0};
            next = NULL;
        }
        if (sp == 0) break;
        loom__dfs_frame *top = &stack[sp - 1];
        if (top->next_src < LOOM_MAX_SRC) {
            loom_tensor *s = top->t->src[top->next_src++];
            if (s && !loom__hash_contains(g, s)) next = s;
            continue;
        }
        /* every source visited: append */
        loom_tensor *done = top->t;
        sp--;
        if (done->op == LOOM_OP_NONE) {
            g->leafs[g->n_leafs++] = done;
            pending_leafs--;
        } else {
            done->flags |= LOOM_TENSOR_FLAG_COMPUTE;
            g->nodes[g->n_nodes++] = done;
            pending_nodes--;
        }
    }
    if (stack != local) loom_free(stack);
    if (st != LOOM_OK) {
        /* leave the graph as it was before this call */
        g->n_nodes = n_nodes0;
        g->n_leafs = n_leafs0;
        loom__hash_rebuild(g);
    }
    return st;
}

loom_status loom_graph_add_node(loom_graph *g, loom_tensor *t) {
    if (!g) return loom_error(LOOM_ERR_INVALID_ARG, "graph_add_node: graph is NULL");
    if (!t) return loom_error(LOOM_ERR_INVALID_ARG, "graph_add_node: tensor is NULL");
    if (g->n_nodes >= g->size)
        return loom_error(LOOM_ERR_FULL, "graph_add_node: graph capacity %d exceeded adding '%s'",
                          g->size, t->name);
    g->nodes[g->n_nodes++] = t;
    t->flags |= LOOM_TENSOR_FLAG_COMPUTE;
    if (g->hash_keys && g->hash_size && !loom__hash_contains(g, t)) loom__hash_insert(g, t);
    g->uid = loom_graph_next_uid();
    return LOOM_OK;
}

void loom_graph_clear(loom_graph *g) {
    if (!g) return;
    g->n_nodes = 0;
    g->n_leafs = 0;
    if (g->hash_keys) memset(g->hash_keys, 0, g->hash_size * sizeof *g->hash_keys);
    g->uid = loom_graph_next_uid();
}

loom_graph loom_graph_view(const loom_graph *g, int i0, int i1) {
    LOOM_ASSERT(g && 0 <= i0 && i0 <= i1 && i1 <= g->n_nodes);
    return (loom_graph){
        .size = i1 - i0,
        .n_nodes = i1 - i0,
        .n_leafs = 0,
        .nodes = g->nodes + i0,
        .leafs = NULL,
        .uid = loom_graph_next_uid(),
        .hash_size = 0,
        .hash_keys = NULL,
    };
}

loom_tensor *loom_graph_node(const loom_graph *g, int i) {
    if (i < 0) i += g->n_nodes;
    LOOM_ASSERT(i >= 0 && i < g->n_nodes);
    return g->nodes[i];
}

loom_tensor *loom_graph_get_tensor(const loom_graph *g, const char *name) {
    if (!g || !name) return NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i]->name, name) == 0) return g->nodes[i];
    for (int i = 0; i < g->n_leafs; i++)
        if (strcmp(g->leafs[i]->name, name) == 0) return g->leafs[i];
    return NULL;
}
