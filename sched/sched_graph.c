/*
 * The allocation graph: what the graph allocator sees for one round. It is the caller's
 * node list, split by split, with two synthetic nodes before each split per input:
 *   - a dependency node (a view of the input with op NONE and the input as its source,
 *     on the input's backend): the input stays alive until the split that copies it
 *     starts, even if its last real consumer ran long before;
 *   - the input's copy (on the split's backend): it is placed at the start of the split,
 *     not lazily in the middle.
 * Neither is ever computed. With pipeline copies every slot of every graph input and split
 * input is also a leaf (INPUT|OUTPUT), so each slot keeps its own place across rounds.
 * Each split's backend gets its graph_optimize hook on its split before this graph is
 * built, so the two agree on node order.
 */
#include <string.h>

#include "sched/sched-impl.h"

static loom_status grow(loom_sched *s, int n_nodes, int n_leafs) {
    if (n_nodes > s->graph_cap_nodes) {
        int cap = s->graph_cap_nodes ? s->graph_cap_nodes : 256;
        while (cap < n_nodes)
            cap *= 2;
        loom_tensor **nodes = loom_realloc(s->graph.nodes, (size_t)cap * sizeof(*nodes));
        if (nodes) s->graph.nodes = nodes;
        int *ids = nodes ? loom_realloc(s->node_ids, (size_t)cap * sizeof(*ids)) : NULL;
        if (!ids) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory (graph copy)");
        s->node_ids = ids;
        s->graph_cap_nodes = cap;
    }
    if (n_leafs > s->graph_cap_leafs) {
        int cap = s->graph_cap_leafs ? s->graph_cap_leafs : 256;
        while (cap < n_leafs)
            cap *= 2;
        loom_tensor **leafs = loom_realloc(s->graph.leafs, (size_t)cap * sizeof(*leafs));
        if (leafs) s->graph.leafs = leafs;
        int *ids = leafs ? loom_realloc(s->leaf_ids, (size_t)cap * sizeof(*ids)) : NULL;
        if (!ids) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory (graph copy)");
        s->leaf_ids = ids;
        s->graph_cap_leafs = cap;
    }
    s->graph.size =
        s->graph_cap_nodes > s->graph_cap_leafs ? s->graph_cap_nodes : s->graph_cap_leafs;
    return LOOM_OK;
}

/* A node that keeps `input` alive: a view of it (op NONE, so the allocator does not count
 * it as a view) whose only source is the input. */
static loom_tensor *dependency_of(loom_sched *s, loom_tensor *input) {
    loom_tensor *dep = loom__sched_new_header(s, input);
    if (!dep) return NULL;
    dep->op = LOOM_OP_NONE;
    dep->flags = 0;
    memset(dep->src, 0, sizeof(dep->src));
    dep->src[0] = input;
    dep->view_src = input->view_src ? input->view_src : input;
    dep->view_offs = input->view_src ? input->view_offs : 0;
    dep->data = NULL;
    dep->buffer = NULL;
    loom_format_name(dep, "%s (dep)", input->name);
    return dep;
}

static int backend_or_cpu(const loom_sched *s, const loom_tensor *t) {
    int b = loom__sched_backend_of(s, t);
    return b >= 0 ? b : s->n_backends - 1;
}

loom_status loom__sched_build_graph(loom_sched *s, loom_graph *g) {
    int total_inputs = 0;
    for (int k = 0; k < s->n_splits; k++)
        total_inputs += s->splits[k].n_inputs;
    int n_nodes = g->n_nodes + 2 * total_inputs;
    int n_leafs = g->n_leafs;
    if (s->n_copies > 1) n_leafs += (s->n_graph_inputs + total_inputs) * s->n_copies;
    loom_status st = grow(s, n_nodes, n_leafs);
    if (st != LOOM_OK) return st;

    st = loom__sched_round_graphs(s, s->n_splits);
    if (st != LOOM_OK) return st;
    loom_graph *ag = &s->graph;
    int n = 0;
    for (int k = 0; k < s->n_splits; k++) {
        loom__split *sp = &s->splits[k];
        sp->graph = &s->rounds[s->cur_copy].graphs[k];
        *sp->graph = loom_graph_view(g, sp->i_start, sp->i_end);
        loom_backend_graph_optimize(s->backends[sp->backend_id], sp->graph);

        for (int j = 0; j < sp->n_inputs; j++) {
            loom_tensor *input = sp->inputs[j];
            int iid = loom__sched_id(s, input);
            LOOM_ASSERT(iid >= 0);
            loom_tensor *cpy = loom__sched_copy_get(s, iid, sp->backend_id, s->cur_copy);
            LOOM_ASSERT(cpy != NULL);
            loom_tensor *dep = dependency_of(s, input);
            if (!dep) return loom_last_status();
            s->node_ids[n] = s->t_backend[iid];
            ag->nodes[n++] = dep;
            s->node_ids[n] = sp->backend_id;
            ag->nodes[n++] = cpy;
        }
        /* without a graph_optimize hook the split's nodes are where pass 1 saw them */
        bool reordered = s->backends[sp->backend_id]->iface->graph_optimize != NULL;
        for (int i = sp->i_start; i < sp->i_end; i++) {
            loom_tensor *node = g->nodes[i];
            int b = reordered ? backend_or_cpu(s, node) : s->t_backend[s->node_tid[i]];
            s->node_ids[n] = b >= 0 ? b : s->n_backends - 1;
            ag->nodes[n++] = node;
        }
    }
    LOOM_ASSERT(n == n_nodes);
    ag->n_nodes = n;

    int nl = 0;
    if (s->n_copies > 1) {
        for (int i = 0; i < s->n_graph_inputs; i++) {
            loom_tensor *in = s->graph_inputs[i];
            int id = loom__sched_id(s, in);
            int b = s->t_backend[id];
            for (int c = 0; c < s->n_copies; c++) {
                s->leaf_ids[nl] = b;
                ag->leafs[nl++] = loom__sched_copy_get(s, id, b, c);
            }
        }
        for (int k = 0; k < s->n_splits; k++) {
            const loom__split *sp = &s->splits[k];
            for (int j = 0; j < sp->n_inputs; j++) {
                int id = loom__sched_id(s, sp->inputs[j]);
                for (int c = 0; c < s->n_copies; c++) {
                    s->leaf_ids[nl] = sp->backend_id;
                    ag->leafs[nl++] = loom__sched_copy_get(s, id, sp->backend_id, c);
                }
            }
        }
    }
    for (int i = 0; i < g->n_leafs; i++) {
        s->leaf_ids[nl] = backend_or_cpu(s, g->leafs[i]);
        ag->leafs[nl++] = g->leafs[i];
    }
    LOOM_ASSERT(nl == n_leafs);
    ag->n_leafs = nl;
    ag->uid = loom_graph_next_uid();
    ag->hash_size = 0;
    ag->hash_keys = NULL;
    return LOOM_OK;
}
