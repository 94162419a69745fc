/*
 * The meta backend: N real backends and one reducer. graph_compute maps every tensor of
 * the graph to its per-device slices, cuts the node list into subgraphs at PARTIAL nodes
 * (delaying each reduction past elementwise work against MIRRORED operands and past the
 * MoE expert sum when that is exact), then issues subgraph k on all devices concurrently
 * and AllReduces its last node before subgraph k+1. The built plan is cached per graph
 * (several entries, keyed by a fingerprint of the graph's tensors and addresses),
 * so re-running a graph only re-issues work.
 *
 * A device whose slice of a node is empty skips the node. A PARTIAL node (a contraction)
 * whose source slice is empty on a device is a sum over nothing there: the device fills it
 * with zeros (FILL), so every consumer, a PARTIAL bias added to it or a concatenation,
 * reads a value; nothing downstream is ever dropped. A PARTIAL bias added to a sum that is
 * reduced before the add (read elsewhere too, or computed outside the graph) is added by
 * device 0 alone while the others write their part of the bias, so the add's result is a
 * partial sum again and its reduction counts the bias once.
 */
#include <stdio.h>
#include <string.h>

#include "meta/meta-impl.h"

/* The plan cache starts with PLAN_CACHE_MIN entries and doubles (up to PLAN_CACHE_MAX)
 * whenever a graph comes back whose plan was evicted: a scheduler calls graph_compute once
 * per meta split, so a session needs as many plans as its graphs have meta splits (22 with
 * a device refusing RMS_NORM), and a fixed size would rebuild every plan every eval. */
#define PLAN_CACHE_MIN 8
#define PLAN_CACHE_MAX 1024
#define EVICTED_KEYS 64 /* recently evicted keys remembered to detect thrashing */

typedef struct plan_sub {
    int first, last;    /* node range [first, last] */
    int reduce;         /* node to reduce after the subgraph, or -1 */
    loom_graph graph[LOOM_META_MAX_DEVICES];
    loom_tensor *red[LOOM_META_MAX_DEVICES];
} plan_sub;

typedef struct plan {
    uint64_t key;
    uint64_t used;           /* LRU stamp */
    int n_tensors, cap;
    const loom_tensor **meta;         /* [cap] meta tensor of each mapped index */
    loom_tensor *dev[LOOM_META_MAX_DEVICES];    /* [cap] headers per device */
    loom_tensor *kslice[LOOM_META_MAX_DEVICES]; /* [n_tensors] K-slices of whole activations */
    int *slot;               /* open addressing: meta tensor -> index */
    int slot_cap;
    plan_sub *subs;
    int n_subs;
    int n_delayed;
    /* the graph's OUTPUT nodes (by node index) and the states their data is laid out by,
     * published to the device after each compute (meta_out) */
    int n_outs;
    int *out_node;
    bool *out_owner; /* publish the node's view_src (a NONE leaf it writes), not the node */
    loom_split_state *out_state;
} plan;

typedef struct meta_backend {
    meta_dev *md;
    loom_backend_t be[LOOM_META_MAX_DEVICES];
    loom_reducer *reducer;
    plan **cache; /* [cache_cap] */
    int cache_cap;
    uint64_t evicted[EVICTED_KEYS]; /* ring of keys whose plans were evicted */
    int n_evicted;                  /* filled entries of the ring (at most EVICTED_KEYS) */
    int evict_next;                 /* the ring slot the next eviction overwrites */
    /* graph_key's node table (open addressing over header addresses, key_cap slots) */
    int *key_slot;
    const loom_tensor **key_node;
    int key_cap;
    uint64_t clock;
    loom_meta_stats stats;
    char name[256];
    /* the first failure of a member's asynchronous work, seen by a synchronize; reported
     * by get_status, cleared by the next graph_compute once reported (see backend-impl.h) */
    loom_status async_status;
    bool async_reported;
    char async_msg[384];
} meta_backend;

/* ---------------------------------------------------------------- plan bookkeeping */

static void plan_free(plan *p, int n) {
    if (!p) return;
    for (int s = 0; s < p->n_subs; s++)
        for (int j = 0; j < n; j++) loom_free(p->subs[s].graph[j].nodes);
    loom_free(p->subs);
    for (int j = 0; j < n; j++) {
        loom_free(p->dev[j]);
        loom_free(p->kslice[j]);
    }
    loom_free(p->meta);
    loom_free(p->slot);
    loom_free(p->out_node);
    loom_free(p->out_owner);
    loom_free(p->out_state);
    loom_free(p);
}

static uint64_t ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int plan_find(const plan *p, const loom_tensor *t) {
    int mask = p->slot_cap - 1;
    for (int k = (int)(ptr_hash(t) & (uint64_t)mask);; k = (k + 1) & mask) {
        if (p->slot[k] < 0) return -1;
        if (p->meta[p->slot[k]] == t) return p->slot[k];
    }
}

static void plan_insert(plan *p, const loom_tensor *t, int idx) {
    int mask = p->slot_cap - 1;
    int k = (int)(ptr_hash(t) & (uint64_t)mask);
    while (p->slot[k] >= 0) k = (k + 1) & mask;
    p->slot[k] = idx;
}

/* Pass 1: gives t, and first everything it reads (view source, sources), an index, in
 * dependency order. Grows the index arrays as needed. */
static loom_status plan_collect(plan *p, const loom_tensor *t) {
    if (plan_find(p, t) >= 0) return LOOM_OK;
    loom_status st;
    if (t->view_src && (st = plan_collect(p, t->view_src))) return st;
    for (int k = 0; k < LOOM_MAX_SRC; k++)
        if (t->src[k] && (st = plan_collect(p, t->src[k]))) return st;
    if (p->n_tensors == p->cap) {
        int cap = p->cap * 2;
        const loom_tensor **meta = loom_realloc(p->meta, (size_t)cap * sizeof *meta);
        if (!meta) return loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
        p->meta = meta;
        p->cap = cap;
    }
    if ((p->n_tensors + 1) * 2 > p->slot_cap) {
        int cap = p->slot_cap * 2;
        int *slot = loom_malloc((size_t)cap * sizeof *slot);
        if (!slot) return loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
        loom_free(p->slot);
        p->slot = slot;
        p->slot_cap = cap;
        for (int k = 0; k < cap; k++) p->slot[k] = -1;
        for (int i = 0; i < p->n_tensors; i++) plan_insert(p, p->meta[i], i);
    }
    p->meta[p->n_tensors] = t;
    plan_insert(p, t, p->n_tensors);
    p->n_tensors++;
    return LOOM_OK;
}

static bool state_is(meta_backend *mb, const loom_tensor *t, bool sync, loom_split_axis axis) {
    loom_split_state s;
    return t && loom__meta_state(mb->md, t, sync, &s) == LOOM_OK && s.axis == axis;
}

/* Device j's source k of tensor idx becomes a view of it cut to range r along axis (in
 * elements; axis 0 counted in blocks of the source's type), held in p->kslice. */
static void view_source_part(plan *p, int j, int idx, int k, int axis, const loom_split_range *r) {
    loom_tensor *b = p->dev[j][idx].src[k], *x = &p->kslice[j][idx];
    *x = *b;
    x->ne[axis] = r->size;
    size_t off = axis == 0 ? (size_t)(r->offset / loom_blck_size(b->type)) * b->nb[0]
                           : (size_t)r->offset * b->nb[axis];
    x->data = (char *)b->data + off;
    x->view_src = b->view_src ? b->view_src : b;
    x->view_offs = (size_t)((char *)x->data - (char *)x->view_src->data);
    x->op = LOOM_OP_VIEW;
    memset(x->src, 0, sizeof x->src);
    x->src[0] = b;
    p->dev[j][idx].src[k] = x;
}

/* A matmul whose weight is split along K while its activations are whole on every device
 * (a partial sum): device j multiplies by the K-slice of b that matches its weight rows. */
static loom_status kslice_activations(meta_backend *mb, plan *p, int idx) {
    const loom_tensor *t = p->meta[idx];
    if (t->op != LOOM_OP_MUL_MAT && t->op != LOOM_OP_MUL_MAT_ID) return LOOM_OK;
    loom_split_state sa, sb;
    loom_status st;
    if ((st = loom__meta_state(mb->md, t->src[0], true, &sa)) ||
        (st = loom__meta_state(mb->md, t->src[1], true, &sb)))
        return st;
    if (t->op == LOOM_OP_MUL_MAT_ID && sa.axis == LOOM_SPLIT_AXIS_2)
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "meta: mul_mat_id '%s': experts split along the expert axis need "
                          "per-device expert ids, which loom does not remap; split the experts' "
                          "rows or columns instead",
                          t->name);
    if (sa.axis != LOOM_SPLIT_AXIS_0 || sb.axis != LOOM_SPLIT_MIRRORED) return LOOM_OK;
    for (int j = 0; j < mb->md->n; j++) {
        loom_split_range r;
        if ((st = loom_split_state_range(&sa, t->src[0], 0, 0, j, &r))) return st;
        view_source_part(p, j, idx, 1, 0, &r); /* b is F32: one element a block */
    }
    return LOOM_OK;
}

/* SET_ROWS or CPY of a whole (MIRRORED) source into a split destination, or FLASH_ATTN_EXT
 * of whole queries with k and v split on heads (a value computed elsewhere and copied in
 * whole): device j reads only its part of the source, a view of its copy along the split
 * axis over the range the node's state gives device j. */
static loom_status slice_whole_source(meta_backend *mb, plan *p, int idx, const loom_split_state *s) {
    const loom_tensor *t = p->meta[idx];
    if (!loom_split_axis_is_dim(s->axis) || !state_is(mb, t->src[0], true, LOOM_SPLIT_MIRRORED))
        return LOOM_OK;
    int axis; /* of the source, cut like the node's split axis */
    if (t->op == LOOM_OP_SET_ROWS || t->op == LOOM_OP_CPY) {
        axis = (int)s->axis;
    } else if (t->op == LOOM_OP_FLASH_ATTN_EXT && s->axis == LOOM_SPLIT_AXIS_1) {
        axis = 2; /* the query heads of q [D, Nq, H, S] are the result's axis 1 */
    } else {
        return LOOM_OK;
    }
    for (int j = 0; j < mb->md->n; j++) {
        loom_split_range r;
        loom_status st = loom_split_state_range(s, t, 0, 0, j, &r);
        if (st) return st;
        view_source_part(p, j, idx, 0, axis, &r);
    }
    return LOOM_OK;
}

/* Pass 2: the per-device headers of tensor idx (its dependencies come earlier). layout[x]
 * (NULL: its own state): the state a NONE leaf x takes from the op that writes it. */
static loom_status plan_fill(meta_backend *mb, plan *p, int idx,
                             const loom_split_state *const *layout) {
    const int n = mb->md->n;
    const loom_tensor *t = p->meta[idx];
    int vsrc = t->view_src ? plan_find(p, t->view_src) : -1;
    int srcs[LOOM_MAX_SRC];
    for (int k = 0; k < LOOM_MAX_SRC; k++) srcs[k] = t->src[k] ? plan_find(p, t->src[k]) : -1;
    loom_split_state s;
    loom_status st = loom__meta_state(mb->md, t, true, &s);
    if (st) return st;
    if (layout[idx]) s = *layout[idx];
    for (int j = 0; j < n; j++) {
        loom_tensor *d = &p->dev[j][idx];
        st = loom__meta_slice(mb->md, t, &s, j, vsrc >= 0 ? &p->dev[j][vsrc] : NULL,
                              vsrc >= 0 ? layout[vsrc] : NULL, d);
        if (st) return st;
        if (vsrc >= 0) {
            d->view_src = &p->dev[j][vsrc];
            d->view_offs = (size_t)((char *)d->data - (char *)d->view_src->data);
        }
        for (int k = 0; k < LOOM_MAX_SRC; k++)
            d->src[k] = srcs[k] >= 0 ? &p->dev[j][srcs[k]] : NULL;
    }
    if ((st = slice_whole_source(mb, p, idx, &s))) return st;
    return kslice_activations(mb, p, idx);
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))) * 1099511628211ull; }

/* A tensor's contents: allocation and address, op, type, flags, shape, strides, params,
 * view offset; a leaf's name (it may decide the leaf's split state). Not the header's
 * address: a graph rebuilt for every token (new headers, same memory) is the same plan. */
static uint64_t tensor_key(uint64_t h, const loom_tensor *t) {
    h = mix(h, ptr_hash(t->data));
    /* the allocation, not just its address: a buffer freed and allocated again at the
     * same place holds device buffers elsewhere */
    const loom_tensor *owner = t->view_src ? t->view_src : t;
    if (owner->buffer && owner->buffer->iface == &loom__meta_buffer_i)
        h = mix(h, ((const meta_buffer *)owner->buffer->context)->id);
    h = mix(h, ptr_hash(owner->data));
    h = mix(h, (uint64_t)t->op * 31 + (uint64_t)t->type);
    /* flags decide reductions (OUTPUT, EXTERNAL stop a delay) */
    h = mix(h, (uint64_t)(uint32_t)t->flags);
    if (t->op == LOOM_OP_NONE)
        for (const char *c = t->name; *c; c++) h = mix(h, (uint8_t)*c);
    for (int d = 0; d < 4; d++) h = mix(mix(h, (uint64_t)t->ne[d]), t->nb[d]);
    h = mix(h, t->view_offs);
    for (size_t w = 0; w < LOOM_MAX_OP_PARAMS / sizeof(int32_t); w++) h = mix(h, (uint32_t)t->op_params[w]);
    return h;
}

/* Index of node t in the key table (-1: not a node of the graph). */
static int key_find(const meta_backend *mb, const loom_tensor *t) {
    int mask = mb->key_cap - 1;
    for (int k = (int)(ptr_hash(t) & (uint64_t)mask);; k = (k + 1) & mask) {
        if (mb->key_slot[k] < 0) return -1;
        if (mb->key_node[mb->key_slot[k]] == t) return mb->key_slot[k];
    }
}

/* A fingerprint of everything a plan is derived from: every node and source by contents
 * (tensor_key), and the graph's structure (which node reads which, by node index). Equal
 * fingerprints mean the cached plan is valid, whatever the graph's uid or header
 * addresses. Host out of memory: a fingerprint by header addresses instead. */
static uint64_t graph_key(meta_backend *mb, const loom_graph *g) {
    uint64_t h = mix(0, (uint64_t)g->n_nodes);
    int cap = 64;
    while (cap < 2 * g->n_nodes) cap <<= 1;
    if (cap > mb->key_cap) {
        int *slot = loom_realloc(mb->key_slot, (size_t)cap * sizeof *slot);
        if (slot) mb->key_slot = slot;
        const loom_tensor **node = slot ? loom_realloc(mb->key_node, (size_t)cap * sizeof *node) : NULL;
        if (node) {
            mb->key_node = node;
            mb->key_cap = cap;
        }
    }
    const bool by_index = cap <= mb->key_cap;
    if (by_index) {
        for (int k = 0; k < mb->key_cap; k++) mb->key_slot[k] = -1;
        int mask = mb->key_cap - 1;
        for (int i = 0; i < g->n_nodes; i++) {
            mb->key_node[i] = g->nodes[i];
            int k = (int)(ptr_hash(g->nodes[i]) & (uint64_t)mask);
            while (mb->key_slot[k] >= 0) k = (k + 1) & mask;
            mb->key_slot[k] = i;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        h = tensor_key(h, t);
        if (!by_index) h = mix(h, ptr_hash(t));
        for (int k = 0; k < LOOM_MAX_SRC; k++) {
            const loom_tensor *src = t->src[k];
            int x = src && by_index ? key_find(mb, src) : -1;
            if (!src) h = mix(h, (uint64_t)k);
            else if (x >= 0) h = mix(h, 0x6e6f6465ull + (uint64_t)x); /* node x */
            else h = mix(tensor_key(h, src), by_index ? 0 : ptr_hash(src));
        }
    }
    return h;
}

/* ---------------------------------------------------------------- delayed reduction */

static int use_count(const loom_graph *g, const loom_tensor *t, int from) {
    int n = 0;
    for (int i = from; i < g->n_nodes; i++)
        for (int k = 0; k < LOOM_MAX_SRC; k++) n += g->nodes[i]->src[k] == t;
    return n;
}

static bool reads(const loom_tensor *n, const loom_tensor *t) {
    for (int s = 0; s < LOOM_MAX_SRC; s++)
        if (n->src[s] == t) return true;
    return false;
}

/* Whether node y adds a PARTIAL bias to the partial sum y->src[0] (the split-state rule,
 * loom_split_partial_bias_add, on both addends' true states). */
static bool partial_bias_add(meta_backend *mb, const loom_tensor *y) {
    if ((y->op != LOOM_OP_ADD && y->op != LOOM_OP_ADD_ID) || !y->src[0] || !y->src[1]) return false;
    loom_split_state a, b;
    return loom__meta_state(mb->md, y->src[0], false, &a) == LOOM_OK &&
           loom__meta_state(mb->md, y->src[1], false, &b) == LOOM_OK &&
           loom_split_partial_bias_add(y, &a, &b);
}

static bool is_partial_node(meta_backend *mb, const loom_tensor *t) {
    return t->op != LOOM_OP_NONE && !loom_op_is_view(t->op) &&
           state_is(mb, t, false, LOOM_SPLIT_PARTIAL);
}

/* The last node at or after i up to which the reduction of node i can be delayed. An ADD
 * of two unreduced partial sums of the same shape is itself a partial sum (each device's
 * terms added once): when the next consumer of the chain is such an add and the other
 * addend is the end of another delayable chain made since (a shared expert's down
 * projection next to the routed experts' sum), both chains share one reduction after the
 * add. */
static int delay_reduction(meta_backend *mb, const loom_graph *g, int i) {
    const loom_tensor *cur = g->nodes[i];
    int r = i;
    for (;;) {
        /* read by the caller or by another split of a scheduler: its consumers are not all
         * here, so it must hold the sum when this graph ends */
        if ((cur->flags & (LOOM_TENSOR_FLAG_OUTPUT | LOOM_TENSOR_FLAG_EXTERNAL)) ||
            use_count(g, cur, r + 1) == 0)
            return r;
        /* the next node that consumes cur; nodes in between must not be new partials,
         * except one chain that ends in the other addend of that consumer */
        int k = r + 1, nested_end = -1;
        while (k < g->n_nodes) {
            const loom_tensor *n = g->nodes[k];
            if (reads(n, cur)) break;
            if (is_partial_node(mb, n)) {
                if (nested_end >= 0) return r;
                nested_end = delay_reduction(mb, g, k);
                for (int q = k + 1; q <= nested_end; q++)
                    if (reads(g->nodes[q], cur)) return r; /* cur inside the other chain */
                k = nested_end + 1;
                continue;
            }
            k++;
        }
        if (k >= g->n_nodes) return r;
        const loom_tensor *n = g->nodes[k];
        bool single = use_count(g, cur, r + 1) == 1;
        if (nested_end >= 0) {
            /* only PARTIAL + PARTIAL: cur + the other chain's end, both read once, here */
            const loom_tensor *b = g->nodes[nested_end];
            const loom_tensor *other = n->src[0] == cur ? n->src[1] : n->src[0];
            if (!single || n->op != LOOM_OP_ADD || other != b || b == cur ||
                !loom_are_same_shape(cur, b) || !loom_are_same_shape(n, cur) ||
                (b->flags & (LOOM_TENSOR_FLAG_OUTPUT | LOOM_TENSOR_FLAG_EXTERNAL)) ||
                use_count(g, b, nested_end + 1) != 1)
                return r;
            cur = n;
            r = k;
            continue;
        }
        /* a product with a mirrored gate distributes over the sum */
        if (single && n->op == LOOM_OP_MUL && n->src[0] == cur && n->src[1] != cur &&
            state_is(mb, n->src[1], true, LOOM_SPLIT_MIRRORED)) {
            cur = n;
            r = k;
            continue;
        }
        /* a bias stored as PARTIAL (b/N per device) belongs before the sum */
        if (single && n->src[0] == cur && partial_bias_add(mb, n) &&
            (n->op == LOOM_OP_ADD || state_is(mb, n->src[2], true, LOOM_SPLIT_MIRRORED))) {
            cur = n;
            r = k;
            continue;
        }
        /* MoE expert sum: U views of cur (one per expert slot), each read once, added in
         * one chain (the first add reads two views, each next one the running sum and a
         * view; the running sums read only by the chain) */
        int64_t U = cur->ne[1];
        int uses = use_count(g, cur, r + 1);
        if (U >= 2 && U <= 64 && uses == U) {
            const loom_tensor *acc = NULL;
            const loom_tensor *vset[64];
            int views = 0, consumed = 0, last = -1;
            bool ok = true;
            for (int q = r + 1; q < g->n_nodes && ok && !(views == U && consumed == U); q++) {
                const loom_tensor *n2 = g->nodes[q];
                if (n2->op == LOOM_OP_VIEW && n2->src[0] == cur) {
                    if (use_count(g, n2, q + 1) != 1 ||
                        (n2->flags & (LOOM_TENSOR_FLAG_OUTPUT | LOOM_TENSOR_FLAG_EXTERNAL)))
                        ok = false;
                    else
                        vset[views++] = n2;
                    continue;
                }
                int nv = 0;
                for (int s2 = 0; s2 < LOOM_MAX_SRC; s2++)
                    for (int v = 0; v < views; v++)
                        nv += n2->src[s2] == vset[v];
                bool racc = acc && reads(n2, acc);
                if (nv == 0 && !racc) {
                    if (is_partial_node(mb, n2)) ok = false; /* it would be reduced nowhere */
                    continue;
                }
                if (n2->op != LOOM_OP_ADD || nv != (acc ? 1 : 2) || (acc && !racc) ||
                    (acc &&
                     (use_count(g, acc, last + 1) != 1 ||
                      (acc->flags & (LOOM_TENSOR_FLAG_OUTPUT | LOOM_TENSOR_FLAG_EXTERNAL))))) {
                    ok = false; /* not one chain, or a running sum read elsewhere */
                    break;
                }
                consumed += nv;
                acc = n2;
                last = q;
            }
            if (ok && views == U && consumed == U) {
                cur = acc;
                r = last;
                continue;
            }
        }
        return r;
    }
}

/* ---------------------------------------------------------------- building a plan */

/* Whether t is a CPY or SET_ROWS writing all of a leaf whose state is NONE ("follows the op
 * that writes it"): the leaf is laid out by t's state. */
static bool writes_none_leaf(meta_backend *mb, const loom_tensor *t) {
    const loom_tensor *leaf = t->view_src;
    return (t->op == LOOM_OP_CPY || t->op == LOOM_OP_SET_ROWS) && leaf &&
           leaf->op == LOOM_OP_NONE && t->view_offs == 0 &&
           loom_nelements(t) == loom_nelements(leaf) && leaf->buffer &&
           leaf->buffer->iface == &loom__meta_buffer_i &&
           state_is(mb, leaf, false, LOOM_SPLIT_NONE);
}

/* z becomes a FILL with zeros of d's storage (z may be d itself): a device's terms of a
 * sum over nothing. */
static void zero_fill(loom_tensor *z, const loom_tensor *d) {
    if (z != d) *z = *d;
    z->op = LOOM_OP_FILL;
    memset(z->op_params, 0, sizeof z->op_params); /* value 0.0f */
    memset(z->src, 0, sizeof z->src);
    z->view_src = NULL;
    z->view_offs = 0;
    z->flags |= LOOM_TENSOR_FLAG_COMPUTE;
}

static loom_status plan_build(meta_backend *mb, loom_graph *g, plan **out) {
    const int n = mb->md->n;
    plan *p = loom_calloc(1, sizeof *p);
    if (!p) return loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
    p->cap = g->n_nodes + 16;
    p->slot_cap = 64;
    while (p->slot_cap < p->cap * 2) p->slot_cap <<= 1;
    p->meta = loom_calloc((size_t)p->cap, sizeof *p->meta);
    p->slot = loom_malloc((size_t)p->slot_cap * sizeof *p->slot);
    p->subs = loom_calloc((size_t)g->n_nodes + 1, sizeof *p->subs);
    int *idx = loom_malloc((size_t)(g->n_nodes + 1) * sizeof *idx);
    /* bias_first[i]: node i adds a PARTIAL bias to a sum already reduced (device 0 adds) */
    bool *bias_first = loom_calloc((size_t)g->n_nodes + 1, sizeof *bias_first);
    if (!p->meta || !p->slot || !p->subs || !idx || !bias_first) {
        loom_free(idx);
        loom_free(bias_first);
        plan_free(p, n);
        return loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning %d nodes", g->n_nodes);
    }
    for (int k = 0; k < p->slot_cap; k++) p->slot[k] = -1;
    loom_status st = LOOM_OK;
    loom_split_ctx_begin(mb->md->split);
    for (int i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        /* a view whose storage is not ours (the scheduler keeps views inside a split
         * whatever their backend) computes nothing here; a node that reads it would fail
         * to map below with a message naming it */
        const loom_tensor *t = g->nodes[i], *owner = t->view_src ? t->view_src : t;
        if (loom_op_is_view(t->op) && owner->buffer && owner->buffer->iface != &loom__meta_buffer_i) {
            idx[i] = -1;
            continue;
        }
        st = plan_collect(p, t);
        idx[i] = plan_find(p, t);
    }
    for (int j = 0; j < n && st == LOOM_OK; j++) {
        p->dev[j] = loom_calloc((size_t)p->n_tensors + 1, sizeof(loom_tensor));
        p->kslice[j] = loom_calloc((size_t)p->n_tensors + 1, sizeof(loom_tensor));
        if (!p->dev[j] || !p->kslice[j])
            st = loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
    }
    /* the layout of each OUTPUT node's data once computed (as meta/buffer.c's true_state
     * derives it: a computed PARTIAL is reduced by then), for reading it back cheaply; and
     * of each NONE leaf a CPY or SET_ROWS writes whole (out_owner: the node's view_src),
     * whose device headers take that layout */
    for (int i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_tensor *t = g->nodes[i];
        const bool owner = writes_none_leaf(mb, t);
        if (!owner &&
            (!(t->flags & LOOM_TENSOR_FLAG_OUTPUT) || t->view_src || t->op == LOOM_OP_NONE ||
             !t->buffer || t->buffer->iface != &loom__meta_buffer_i))
            continue;
        if (!p->out_node) {
            p->out_node = loom_malloc((size_t)g->n_nodes * sizeof *p->out_node);
            p->out_owner = loom_malloc((size_t)g->n_nodes * sizeof *p->out_owner);
            p->out_state = loom_malloc((size_t)g->n_nodes * sizeof *p->out_state);
            if (!p->out_node || !p->out_owner || !p->out_state) {
                st = loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
                break;
            }
        }
        loom_split_state *os = &p->out_state[p->n_outs];
        if ((st = loom__meta_state(mb->md, t, false, os))) break;
        if (os->axis == LOOM_SPLIT_PARTIAL) loom_split_state_assume_sync(t, os);
        p->out_owner[p->n_outs] = owner;
        p->out_node[p->n_outs++] = i;
    }
    const loom_split_state **layout = NULL;
    if (st == LOOM_OK && !(layout = loom_calloc((size_t)p->n_tensors + 1, sizeof *layout)))
        st = loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
    for (int k = 0; k < p->n_outs && st == LOOM_OK; k++) {
        int x = p->out_owner[k] ? plan_find(p, g->nodes[p->out_node[k]]->view_src) : -1;
        if (x >= 0 && !layout[x]) layout[x] = &p->out_state[k];
    }
    for (int x = 0; x < p->n_tensors && st == LOOM_OK; x++)
        st = plan_fill(mb, p, x, layout);
    loom_free(layout);

    /* cut into subgraphs */
    int start = 0;
    for (int i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_tensor *t = g->nodes[i];
        bool partial = is_partial_node(mb, t);
        if (!partial && i + 1 < g->n_nodes) continue;
        int r = partial && n > 1 ? delay_reduction(mb, g, i) : i;
        if (r > i) p->n_delayed++;
        plan_sub *sub = &p->subs[p->n_subs++];
        sub->first = start;
        sub->last = r;
        /* an empty sum (no tokens) has nothing to reduce */
        sub->reduce = partial && n > 1 && loom_nelements(g->nodes[r]) > 0 ? r : -1;
        start = r + 1;
        i = r;
    }
    /* a PARTIAL bias added to a partial sum: exact as it is when the sum is still unreduced
     * at the add (each device adds its part of the bias to its terms); when the sum was
     * reduced before (read elsewhere too, or computed outside this graph) every device
     * holds all of it, so device 0 adds its part of the bias and the others write only
     * theirs (bias_first): the result is a partial sum either way, reduced after the add */
    int *node_at = NULL; /* tensor index -> the node index computing it (or -1) */
    for (int i = 0; i < g->n_nodes && st == LOOM_OK && n > 1; i++) {
        if (idx[i] < 0 || !partial_bias_add(mb, g->nodes[i])) continue;
        if (!node_at) {
            node_at = loom_malloc(((size_t)p->n_tensors + 1) * sizeof *node_at);
            if (!node_at) {
                st = loom_error(LOOM_ERR_NOMEM, "meta: out of memory planning");
                break;
            }
            for (int x = 0; x < p->n_tensors; x++)
                node_at[x] = -1;
            for (int q = 0; q < g->n_nodes; q++)
                if (idx[q] >= 0) node_at[idx[q]] = q;
        }
        int ax = plan_find(p, g->nodes[i]->src[0]), k = ax >= 0 ? node_at[ax] : -1;
        bool reduced = k < 0 || k >= i; /* computed outside this graph: reduced there */
        for (int q = 0; q < p->n_subs && !reduced; q++)
            if (p->subs[q].first <= k && k <= p->subs[q].last) reduced = p->subs[q].reduce == k;
        bias_first[i] = reduced;
    }
    loom_free(node_at);
    loom_split_ctx_end(mb->md->split);

    /* per-device node lists, skipping what a device has no data for */
    for (int s = 0; s < p->n_subs && st == LOOM_OK; s++) {
        plan_sub *sub = &p->subs[s];
        int len = sub->last - sub->first + 1;
        for (int j = 0; j < n && st == LOOM_OK; j++) {
            loom_graph *dg = &sub->graph[j];
            dg->nodes = loom_malloc((size_t)len * 2 * sizeof(loom_tensor *));
            if (!dg->nodes) {
                st = loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
                break;
            }
            dg->size = len * 2;
            dg->uid = loom_graph_next_uid();
            for (int i = sub->first; i <= sub->last; i++) {
                int x = idx[i];
                if (x < 0) continue; /* a foreign view */
                loom_tensor *d = &p->dev[j][x];
                if (loom_nelements(d) == 0) continue; /* nothing of it lives here */
                bool empty_src = false;
                for (int k = 0; k < LOOM_MAX_SRC; k++)
                    empty_src |= d->src[k] && loom_nelements(d->src[k]) == 0;
                if (empty_src && d->op == LOOM_OP_SET_ROWS) continue; /* no rows to write */
                if (empty_src && is_partial_node(mb, g->nodes[i])) {
                    /* a contraction over an empty slice: this device's terms are zeros */
                    zero_fill(d, d);
                } else if (bias_first[i] && j > 0) {
                    /* the sum counts on device 0 only: here the result is the bias's part,
                     * written over zeros in place (kslice holds the fill's header) */
                    loom_tensor *z = &p->kslice[j][x];
                    zero_fill(z, d);
                    d->src[0] = z;
                    dg->nodes[dg->n_nodes++] = z;
                }
                dg->nodes[dg->n_nodes++] = d;
            }
            /* each member may fuse or reorder its own subgraph (upstream never asks) */
            if (dg->n_nodes > 0) loom_backend_graph_optimize(mb->be[j], dg);
            if (sub->reduce >= 0) sub->red[j] = &p->dev[j][idx[sub->reduce]];
        }
        if (sub->reduce >= 0) {
            const loom_tensor *t = g->nodes[sub->reduce];
            if (t->type != LOOM_TYPE_F32 || !loom_is_contiguous(t))
                st = loom_error(LOOM_ERR_UNSUPPORTED,
                                "meta: cannot reduce '%s' (%s %s): partial sums must be "
                                "contiguous F32",
                                t->name, loom_op_name(t->op), loom_type_name(t->type));
        }
    }
    loom_free(idx);
    loom_free(bias_first);
    if (st) {
        plan_free(p, n);
        return st;
    }
    *out = p;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- backend interface */

static const char *mbe_name(loom_backend_t backend) {
    return ((meta_backend *)backend->context)->name;
}

static void mbe_synchronize(loom_backend_t backend) {
    meta_backend *mb = backend->context;
    for (int j = 0; j < mb->md->n; j++) {
        const bool had = mb->async_status != LOOM_OK;
        loom_backend_synchronize_keep(mb->be[j], &mb->async_status, mb->async_msg,
                                      sizeof mb->async_msg);
        if (!had && mb->async_status != LOOM_OK) mb->async_reported = false;
    }
}

static loom_status mbe_get_status(loom_backend_t backend) {
    meta_backend *mb = backend->context;
    if (mb->async_status == LOOM_OK) return LOOM_OK;
    mb->async_reported = true;
    return loom_error(mb->async_status, "%s: %s", mb->name, mb->async_msg);
}

static void mbe_free(loom_backend_t backend) {
    meta_backend *mb = backend->context;
    mbe_synchronize(backend);
    for (int c = 0; c < mb->cache_cap; c++) plan_free(mb->cache[c], mb->md->n);
    loom_free(mb->cache);
    loom_free(mb->key_slot);
    loom_free(mb->key_node);
    loom_reducer_free(mb->reducer);
    for (int j = 0; j < mb->md->n; j++) loom_backend_free(mb->be[j]);
    loom_free(mb);
    loom_free(backend);
}

/* A miss on a key evicted earlier means the working set is larger than the cache: double
 * it (the new half is empty). false when it cannot grow. */
static bool cache_grow(meta_backend *mb, uint64_t key) {
    bool thrash = false;
    for (int i = 0; i < mb->n_evicted && !thrash; i++) thrash = mb->evicted[i] == key;
    if (!thrash || mb->cache_cap >= PLAN_CACHE_MAX) return false;
    plan **c = loom_realloc(mb->cache, (size_t)mb->cache_cap * 2 * sizeof *c);
    if (!c) return false; /* keep the size; evicting still works */
    memset(c + mb->cache_cap, 0, (size_t)mb->cache_cap * sizeof *c);
    mb->cache = c;
    mb->cache_cap *= 2;
    return true;
}

static loom_status mbe_compute(loom_backend_t backend, loom_graph *g) {
    meta_backend *mb = backend->context;
    const int n = mb->md->n;
    loom__meta_end_phase(mb->md);
    if (mb->async_status != LOOM_OK) { /* a failure of earlier work */
        loom_status pending = mb->async_status;
        bool reported = mb->async_reported;
        mb->async_status = LOOM_OK;
        mb->async_reported = false;
        if (!reported) return loom_error(pending, "%s: an earlier graph failed: %s", mb->name, mb->async_msg);
    }
    const int64_t t_start = loom_time_ns();
    int64_t t_reduce = 0;
    uint64_t key = graph_key(mb, g);
    plan *p = NULL;
    int victim = 0;
    for (int c = 0; c < mb->cache_cap; c++) {
        if (mb->cache[c] && mb->cache[c]->key == key) {
            p = mb->cache[c];
            break;
        }
        if (!mb->cache[c]) victim = c;
        else if (mb->cache[victim] && mb->cache[c]->used < mb->cache[victim]->used) victim = c;
    }
    if (!p) {
        loom_status st = plan_build(mb, g, &p);
        if (st) return st;
        p->key = key;
        if (mb->cache[victim] && cache_grow(mb, key)) victim = mb->cache_cap / 2;
        if (mb->cache[victim]) {
            mbe_synchronize(backend); /* its graphs may still be queued */
            mb->evicted[mb->evict_next] = mb->cache[victim]->key;
            mb->evict_next = (mb->evict_next + 1) % EVICTED_KEYS;
            if (mb->n_evicted < EVICTED_KEYS) mb->n_evicted++;
            plan_free(mb->cache[victim], n);
        }
        mb->cache[victim] = p;
        mb->stats.plans_built++;
    }
    p->used = ++mb->clock;
    mb->stats.graphs++;
    mb->stats.last_subgraphs = 0;
    mb->stats.last_reductions = 0;
    mb->stats.last_bytes_reduced = 0;
    for (int s = 0; s < p->n_subs; s++) {
        plan_sub *sub = &p->subs[s];
        for (int j = 0; j < n; j++) {
            if (sub->graph[j].n_nodes == 0) continue;
            loom_status st = loom_backend_graph_compute_async(mb->be[j], &sub->graph[j]);
            if (st) return loom_error(st, "%s: device %s: %s", mb->name, loom_backend_name(mb->be[j]), loom_last_error());
        }
        mb->stats.subgraphs++;
        mb->stats.last_subgraphs++;
        if (sub->reduce < 0) continue;
        const int64_t t_r = loom_time_ns();
        loom_status st = loom_reducer_allreduce(mb->reducer, sub->red, NULL);
        t_reduce += loom_time_ns() - t_r;
        if (st) return loom_error(st, "%s: reducing '%s': %s", mb->name, g->nodes[sub->reduce]->name, loom_last_error());
        size_t bytes = loom_nbytes(g->nodes[sub->reduce]);
        mb->stats.reductions++;
        mb->stats.last_reductions++;
        mb->stats.bytes_reduced += bytes;
        mb->stats.last_bytes_reduced += bytes;
    }
    for (int k = 0; k < p->n_outs; k++) {
        const loom_tensor *t = g->nodes[p->out_node[k]];
        loom__meta_out_publish(mb->md, p->out_owner[k] ? t->view_src : t, &p->out_state[k]);
    }
    mb->stats.delayed += (uint64_t)p->n_delayed;
    mb->stats.reduce_ns += (uint64_t)t_reduce;
    mb->stats.issue_ns += (uint64_t)(loom_time_ns() - t_start - t_reduce);
    loom_reducer_stats rs;
    loom_reducer_get_stats(mb->reducer, &rs);
    mb->stats.last_algo = rs.last_algo;
    return LOOM_OK;
}

/* Events are recorded on every member's stream, after everything issued (reductions
 * included). Waiting on a meta event of this device: every member waits for every
 * member's event (the devices exchange data in reductions); a foreign event is waited
 * for on the host. */
static void mbe_event_record(loom_backend_t backend, loom_event_t ev) {
    meta_backend *mb = backend->context;
    meta_event *me = ev->context;
    LOOM_ASSERT(ev->device == &mb->md->dev);
    for (int j = 0; j < mb->md->n; j++) loom_event_record(me->m[j], mb->be[j]);
}

static void mbe_event_wait(loom_backend_t backend, loom_event_t ev) {
    meta_backend *mb = backend->context;
    if (ev->device != &mb->md->dev) {
        loom_event_synchronize(ev);
        return;
    }
    meta_event *me = ev->context;
    for (int j = 0; j < mb->md->n; j++) {
        if (!mb->be[j]->iface->event_wait) {
            loom_event_synchronize(ev);
            return;
        }
    }
    for (int j = 0; j < mb->md->n; j++)
        for (int k = 0; k < mb->md->n; k++) loom_event_wait(mb->be[j], me->m[k]);
}

static void mbe_split_begin(loom_backend_t backend) {
    loom__meta_split_phase(((meta_backend *)backend->context)->md);
}

static void mbe_split_end(loom_backend_t backend) {
    meta_dev *md = ((meta_backend *)backend->context)->md;
    if (md->phase == 1) loom__meta_end_phase(md);
}

static const struct loom_backend_i meta_backend_i = {
    .get_name = mbe_name,
    .free = mbe_free,
    .synchronize = mbe_synchronize,
    .graph_compute = mbe_compute,
    .split_begin = mbe_split_begin,
    .split_end = mbe_split_end,
    .event_record = mbe_event_record,
    .event_wait = mbe_event_wait,
    .get_status = mbe_get_status,
};

loom_backend_t loom__meta_backend_new(meta_dev *md, const char *params) {
    meta_backend *mb = loom_calloc(1, sizeof *mb);
    loom_backend_t b = loom_calloc(1, sizeof *b);
    if (!mb || !b) {
        loom_free(mb);
        loom_free(b);
        loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
        return NULL;
    }
    mb->md = md;
    mb->cache_cap = PLAN_CACHE_MIN;
    mb->cache = loom_calloc((size_t)mb->cache_cap, sizeof *mb->cache);
    if (!mb->cache) {
        loom_free(mb);
        loom_free(b);
        loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
        return NULL;
    }
    size_t o = (size_t)snprintf(mb->name, sizeof mb->name, "Meta(");
    for (int j = 0; j < md->n; j++) {
        mb->be[j] = loom_dev_init(md->devs[j], params);
        if (!mb->be[j]) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            for (int k = 0; k < j; k++) loom_backend_free(mb->be[k]);
            loom_free(mb->cache);
            loom_free(mb);
            loom_free(b);
            loom_error(LOOM_ERR_DEVICE, "meta: cannot start a backend on %s: %s",
                       loom_dev_name(md->devs[j]), why);
            return NULL;
        }
        if (o < sizeof mb->name)
            o += (size_t)snprintf(mb->name + o, sizeof mb->name - o, "%s%s", j ? "," : "",
                                  loom_backend_name(mb->be[j]));
    }
    if (o < sizeof mb->name) snprintf(mb->name + o, sizeof mb->name - o, ")");
    mb->reducer = loom_reducer_new(mb->be, md->n, NULL);
    if (!mb->reducer) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_last_error());
        for (int j = 0; j < md->n; j++) loom_backend_free(mb->be[j]);
        loom_free(mb->cache);
        loom_free(mb);
        loom_free(b);
        loom_error(LOOM_ERR_DEVICE, "meta: cannot set up the AllReduce: %s", why);
        return NULL;
    }
    *b = (struct loom_backend){.iface = &meta_backend_i, .device = &md->dev, .context = mb};
    return b;
}

bool loom_backend_is_meta(loom_backend_t backend) {
    return backend && backend->iface == &meta_backend_i;
}

loom_backend_t loom_meta_backend_member(loom_backend_t backend, int i) {
    LOOM_ASSERT(loom_backend_is_meta(backend));
    return ((meta_backend *)backend->context)->be[i];
}

void loom_meta_backend_set_allreduce(loom_backend_t backend, loom_allreduce_algo algo) {
    LOOM_ASSERT(loom_backend_is_meta(backend));
    loom_reducer_set_algorithm(((meta_backend *)backend->context)->reducer, algo);
}

void loom_meta_backend_get_stats(loom_backend_t backend, loom_meta_stats *out) {
    LOOM_ASSERT(loom_backend_is_meta(backend));
    *out = ((meta_backend *)backend->context)->stats;
}

void loom_meta_backend_reset_stats(loom_backend_t backend) {
    LOOM_ASSERT(loom_backend_is_meta(backend));
    memset(&((meta_backend *)backend->context)->stats, 0, sizeof(loom_meta_stats));
}
