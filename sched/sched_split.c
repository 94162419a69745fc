/*
 * Stage 1 of the scheduler: assign a backend to every tensor of a graph (five passes, each
 * decision with a cause code) and cut the node list into splits, creating the copies a
 * split needs and editing the caller's graph to use them.
 *
 *   pass 1  only the forced tensors: a buffer (1.dst / 1.vsrc; an op no backend can run on
 *           a pre-allocated tensor is an error), a user input (1.inp: the CPU), a weight
 *           source (1.wgt<j>: run where the weight lives, except ROPE and FLASH_ATTN_EXT,
 *           whose small weights must not drag attention around), or a host weight that a
 *           device asks to run anyway (1.off: op offload, by batch size);
 *   pass 2  four sweeps propagate assignments to unassigned neighbours in node order: GPU
 *           down and up (a CPU node stops the carry, so the CPU never spreads between GPU
 *           ops), then any backend down and up; a node is stamped only if the carried
 *           backend supports it; views are skipped;
 *   pass 3  an assigned node moves to a higher-priority backend with the same buffer type
 *           that supports it and its sources (3.upg); an unassigned one goes where most of
 *           its sources can be read (3.best);
 *   pass 4  views follow their source (4.vsrc), leftover sources follow their consumer
 *           (4.cur), anything left takes the first backend that supports it (4.sup), and a
 *           node no backend supports is an error;
 *   pass 5  a split ends where the backend changes (views never cut), where a node needs a
 *           weight staged from memory this backend cannot read while the split already has
 *           inputs (so staged weights of consecutive layers reuse one region), and before
 *           the input list would pass its cap. Sources in unreadable memory get copies
 *           "<backend>#<tensor>#<copy>" and the node is edited to read the copy.
 * User pins ("usr") are applied before pass 1 and never overwritten.
 */
#include <string.h>

#include "sched/sched-impl.h"

/* Metadata ops (and NONE): nothing to compute, placed with their source in pass 4. */
static inline bool is_view_op(loom_op op) {
    return op == LOOM_OP_VIEW || op == LOOM_OP_RESHAPE || op == LOOM_OP_PERMUTE ||
           op == LOOM_OP_TRANSPOSE || op == LOOM_OP_NONE;
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0x100000001B3ull;
}

static inline bool supports_op(const loom_sched *s, int b, const loom_tensor *t) {
    return loom_backend_supports_op(s->backends[b], t);
}

static inline void assign(loom_sched *s, int id, int b, int cause) {
    s->t_backend[id] = (int8_t)b;
    s->t_cause[id] = (uint8_t)cause;
}

/* The buffer that decides where t lives: its view source's, else its own. */
static inline loom_buffer_t home_buffer(const loom_tensor *t) {
    if (t->view_src && t->view_src->buffer) return t->view_src->buffer;
    return t->buffer;
}

static inline bool buft_supported(const loom_sched *s, int b, loom_buft_t buft) {
    return buft == s->bufts[b] || loom_backend_supports_buft(s->backends[b], buft);
}

bool loom__sched_buffer_supported(const loom_sched *s, const loom_tensor *t, int b) {
    loom_buffer_t buf = home_buffer(t);
    loom_buft_t buft = NULL;
    if (buf) {
        buft = loom_buffer_buft(buf);
    } else {
        int tb = loom__sched_backend_of(s, t);
        if (tb == -1 && t->view_src) tb = loom__sched_backend_of(s, t->view_src);
        if (tb != -1) buft = s->bufts[tb];
    }
    return buft && buft_supported(s, b, buft);
}

/* The highest-priority backend that can use t's buffer and run op; -1 if none. */
static int backend_from_buffer(const loom_sched *s, const loom_tensor *t, const loom_tensor *op) {
    loom_buffer_t buf = home_buffer(t);
    if (!buf) return -1;
    loom_buft_t buft = loom_buffer_buft(buf);
    for (int b = 0; b < s->n_backends; b++) {
        if (buft_supported(s, b, buft) && supports_op(s, b, op)) return b;
    }
    return -1;
}

/* The buffer of a weight source (its own or its view source's), or NULL. */
static inline loom_buffer_t weight_buffer(const loom_tensor *src) {
    loom_buffer_t buf = home_buffer(src);
    if (buf && loom_buffer_get_usage(buf) == LOOM_BUFFER_USAGE_WEIGHTS) return buf;
    return NULL;
}

/* Pass 1 for one tensor. Returns the backend (or -1) and its cause; LOOM_ERR_* through
 * *st for a pre-allocated tensor that no backend can run. */
static int backend_from_cur(const loom_sched *s, const loom_tensor *t, int *cause,
                            loom_status *st) {
    loom_buffer_t buf = home_buffer(t);
    if (buf) {
        int b = backend_from_buffer(s, t, t);
        if (b >= 0) {
            *cause = (t->view_src && t->view_src->buffer) ? LOOM__CAUSE_VSRC1 : LOOM__CAUSE_DST;
            return b;
        }
        /* a view op the owner's backend cannot map falls back (pass 4) and reads a copy */
        if (is_view_op(t->op) && t->op != LOOM_OP_NONE && t->view_src) return -1;
        /* a CPY/SET_ROWS its backend cannot run with the value split as it is: the next
         * attempt makes the value on the CPU (it then arrives whole), and the node stays
         * with its memory (checked again once its source is that copy) */
        if ((t->op == LOOM_OP_CPY || t->op == LOOM_OP_SET_ROWS) && t->src[0] &&
            t->src[0]->op != LOOM_OP_NONE) {
            int sid = loom__sched_id(s, t->src[0]);
            if (sid >= 0 && s->t_cause[sid] == LOOM__CAUSE_FBK) {
                loom_buft_t buft = loom_buffer_buft(buf);
                for (int b = 0; b < s->n_backends; b++) {
                    if (!buft_supported(s, b, buft)) continue;
                    *cause = LOOM__CAUSE_DST;
                    return b;
                }
            }
            ((loom_sched *)s)->want_whole = t->src[0];
        }
        *st = loom_error(LOOM_ERR_UNSUPPORTED,
                         "sched: pre-allocated tensor %s (op %s) lives in buffer %s, and no "
                         "backend that can use that buffer can run %s",
                         t->name, loom_op_name(t->op), loom_buffer_name(buf), loom_op_name(t->op));
        return -1;
    }
    if (t->flags & LOOM_TENSOR_FLAG_INPUT) {
        *cause = LOOM__CAUSE_INP;
        return s->n_backends - 1;
    }
    /* ROPE's frequency factors and FLASH_ATTN_EXT's sinks are too small to decide */
    if (t->op == LOOM_OP_ROPE || t->op == LOOM_OP_FLASH_ATTN_EXT) return -1;
    for (int j = 0; j < LOOM_MAX_SRC; j++) {
        const loom_tensor *src = t->src[j];
        if (!src) continue;
        loom_buffer_t wbuf = weight_buffer(src);
        if (!wbuf) continue;
        int sb = backend_from_buffer(s, src, t);
        if (s->op_offload && sb == s->n_backends - 1 && loom_buffer_is_host(wbuf)) {
            for (int b = 0; b < sb; b++) {
                if (supports_op(s, b, t) && loom_backend_offload_op(s->backends[b], t)) {
                    *cause = LOOM__CAUSE_OFF;
                    return b;
                }
            }
        }
        *cause = LOOM__CAUSE_WGT0 + j;
        return sb;
    }
    return -1;
}

static loom_status pass1(loom_sched *s, loom_graph *g, int *nt) {
    /* ids first (they follow graph order: the topology fingerprint relies on it), then the
     * user's pins, then the forced assignments */
    for (int i = 0; i < g->n_leafs; i++) {
        if (loom__sched_id_add_fast(s, g->leafs[i]) < 0) return loom_last_status();
    }
    for (int i = 0; i < g->n_nodes; i++) {
        int id = loom__sched_id_add_fast(s, g->nodes[i]);
        if (id < 0) return loom_last_status();
        nt[i] = id;
        s->node_view[i] = is_view_op(g->nodes[i]->op);
    }
    loom_status st = loom__sched_apply_pins(s);
    if (st != LOOM_OK) return st;
    for (int i = 0; i < g->n_leafs; i++) {
        int id = loom__sched_id(s, g->leafs[i]);
        if (s->t_backend[id] != -1) continue;
        int cause = LOOM__CAUSE_NONE;
        int b = backend_from_cur(s, g->leafs[i], &cause, &st);
        if (st != LOOM_OK) return st;
        if (b >= 0) assign(s, id, b, cause);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        int id = nt[i];
        if (s->t_backend[id] != -1) continue;
        int cause = LOOM__CAUSE_NONE;
        int b = backend_from_cur(s, g->nodes[i], &cause, &st);
        if (st != LOOM_OK) return st;
        if (b >= 0) assign(s, id, b, cause);
    }
    return LOOM_OK;
}

static inline void set_if_supported(loom_sched *s, const loom_tensor *node, int id, int b,
                                    int cause) {
    if (supports_op(s, b, node)) assign(s, id, b, cause);
}

/* Pass 2: the four sweeps. gpu_only: a CPU node clears the carried backend. */
static void sweep(loom_sched *s, loom_graph *g, const int *nt, bool forward, bool gpu_only,
                  int cause) {
    const int cpu = s->n_backends - 1;
    int cur = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        int i = forward ? k : g->n_nodes - 1 - k;
        if (s->node_view[i]) continue;
        int b = s->t_backend[nt[i]];
        if (b != -1) {
            cur = (gpu_only && b == cpu) ? -1 : b;
        } else if (cur != -1) {
            set_if_supported(s, g->nodes[i], nt[i], cur, cause);
        }
    }
}

static void pass3(loom_sched *s, loom_graph *g, const int *nt) {
    for (int i = 0; i < g->n_nodes; i++) {
        if (s->node_view[i]) continue;
        const loom_tensor *node = g->nodes[i];
        int id = nt[i];
        int b = s->t_backend[id];
        if (b == -1) {
            /* best guess: where the most sources can be read without a copy */
            int best = -1, best_n = -1;
            for (int c = 0; c < s->n_backends; c++) {
                if (!supports_op(s, c, node)) continue;
                int n = 0;
                for (int j = 0; j < LOOM_MAX_SRC; j++) {
                    const loom_tensor *src = node->src[j];
                    if (!src) continue;
                    bool assigned =
                        loom__sched_backend_of(s, src) != -1 ||
                        (src->view_src && loom__sched_backend_of(s, src->view_src) != -1);
                    if (assigned && loom__sched_buffer_supported(s, src, c)) n++;
                }
                if (n > best_n) {
                    best_n = n;
                    best = c;
                }
            }
            if (best != -1) assign(s, id, best, LOOM__CAUSE_BEST);
        } else if (s->t_cause[id] != LOOM__CAUSE_USR) {
            /* upgrade: same memory, higher priority (e.g. CPU -> an accelerator on host
             * memory). Stricter than needed: identical buffer type, not merely readable. */
            for (int c = 0; c < b; c++) {
                if (s->bufts[c] != s->bufts[b] || !supports_op(s, c, node)) continue;
                bool ok = true;
                for (int j = 0; j < LOOM_MAX_SRC && ok; j++) {
                    if (node->src[j]) ok = loom__sched_buffer_supported(s, node->src[j], c);
                }
                if (ok) {
                    assign(s, id, c, LOOM__CAUSE_UPG);
                    break;
                }
            }
        }
    }
}

static loom_status pass4(loom_sched *s, loom_graph *g, const int *nt, int *st_ids) {
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *node = g->nodes[i];
        int id = nt[i];
        if (s->t_backend[id] == -1 && node->view_src) {
            /* a view lives with its storage, where that backend can map it; otherwise it
             * falls back like any op (and reads a copy of its source, pass 5) */
            int vb = loom__sched_backend_of(s, node->view_src);
            if (vb != -1 && (node->op == LOOM_OP_NONE || supports_op(s, vb, node)))
                assign(s, id, vb, LOOM__CAUSE_VSRC4);
        }
        for (int b = 0; b < s->n_backends && s->t_backend[id] == -1; b++) {
            set_if_supported(s, node, id, b, LOOM__CAUSE_SUP);
        }
        int nb = s->t_backend[id];
        if (nb == -1) {
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "sched: no backend supports op %s for tensor %s (not even the "
                              "CPU)",
                              loom_op_name(node->op), node->name);
        }
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            loom_tensor *src = node->src[j];
            if (!src) continue;
            int sid = loom__sched_id_add_fast(s, src);
            if (sid < 0) return loom_last_status();
            st_ids[i * LOOM_MAX_SRC + j] = sid;
            if (s->t_backend[sid] != -1) continue;
            int vb = src->view_src ? loom__sched_backend_of(s, src->view_src) : -1;
            if (vb != -1) {
                assign(s, sid, vb, LOOM__CAUSE_VSRC4);
            } else {
                assign(s, sid, nb, LOOM__CAUSE_CUR);
            }
        }
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------------ pass 5 */

static loom_status split_open(loom_sched *s, int backend_id, int i_start) {
    if (s->n_splits == s->cap_splits) {
        int cap = s->cap_splits ? 2 * s->cap_splits : 16;
        loom__split *sp = loom_realloc(s->splits, (size_t)cap * sizeof(*sp));
        if (!sp) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for splits");
        memset(&sp[s->cap_splits], 0, (size_t)(cap - s->cap_splits) * sizeof(*sp));
        s->splits = sp;
        s->cap_splits = cap;
    }
    loom__split *sp = &s->splits[s->n_splits++];
    sp->backend_id = backend_id;
    sp->i_start = i_start;
    sp->i_end = i_start;
    sp->n_inputs = 0;
    return LOOM_OK;
}

static loom_status split_add_input(loom_sched *s, loom__split *sp, loom_tensor *input) {
    if (sp->n_inputs == sp->cap_inputs) {
        int cap = sp->cap_inputs ? 2 * sp->cap_inputs : LOOM_SCHED_MAX_SPLIT_INPUTS;
        loom_tensor **in = loom_realloc(sp->inputs, (size_t)cap * sizeof(*in));
        if (!in) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for split inputs");
        sp->inputs = in;
        sp->cap_inputs = cap;
    }
    if (sp->n_inputs == s->max_split_inputs) {
        LOOM_LOG_WARN("sched: split %d (%s) needs more than %d inputs; growing its input list",
                      (int)(sp - s->splits), loom_backend_name(s->backends[sp->backend_id]),
                      s->max_split_inputs);
    }
    sp->inputs[sp->n_inputs++] = input;
    return LOOM_OK;
}

static loom_status add_graph_input(loom_sched *s, loom_tensor *t) {
    if (s->n_graph_inputs == s->cap_graph_inputs) {
        int cap = s->cap_graph_inputs ? 2 * s->cap_graph_inputs : LOOM_SCHED_MAX_SPLIT_INPUTS;
        loom_tensor **in = loom_realloc(s->graph_inputs, (size_t)cap * sizeof(*in));
        if (!in) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for graph inputs");
        s->graph_inputs = in;
        s->cap_graph_inputs = cap;
    }
    s->graph_inputs[s->n_graph_inputs++] = t;
    return LOOM_OK;
}

static loom_status log_rewrite(loom_sched *s, loom_tensor *node, int j, loom_tensor *orig) {
    if (s->n_rewrites == s->cap_rewrites) {
        int cap = s->cap_rewrites ? 2 * s->cap_rewrites : 64;
        loom__rewrite *r = loom_realloc(s->rewrites, (size_t)cap * sizeof(*r));
        if (!r) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory");
        s->rewrites = r;
        s->cap_rewrites = cap;
    }
    s->rewrites[s->n_rewrites++] =
        (loom__rewrite){node, j, orig, node->view_offs, node->data, node->buffer};
    return LOOM_OK;
}

/* A view op placed on a backend that cannot read its source's memory (the source's
 * backend cannot map it): it reads a copy of its source, so its storage becomes that copy
 * (view_src, view_offs relative to it), logged so the graph can be put back. */
static bool foreign_view(const loom_sched *s, const loom_tensor *node, int nb) {
    const loom_tensor *src = node->src[0];
    if (!src || !node->view_src || node->op == LOOM_OP_NONE) return false;
    return loom__sched_backend_of(s, src) != nb && !loom__sched_buffer_supported(s, src, nb);
}

static loom_status rebase_view(loom_sched *s, loom_tensor *node, loom_tensor *orig_src) {
    loom_status st = log_rewrite(s, node, -1, node->view_src);
    if (st != LOOM_OK) return st;
    node->view_offs -= orig_src->view_src ? orig_src->view_offs : 0;
    node->view_src = node->src[0];
    node->data = NULL; /* placed in the copy by the allocator */
    node->buffer = NULL;
    return LOOM_OK;
}

/* A view whose source was rebased onto a copy in this split (a view upstream fell back)
 * follows it: the same place within its source, now inside that copy. Otherwise it would
 * still address the old storage, laid out by a backend other than the one reading it. */
static loom_status follow_rebased_source(loom_sched *s, loom_tensor *node) {
    loom_tensor *src = node->src[0];
    if (!src || !node->view_src || node->op == LOOM_OP_NONE) return LOOM_OK;
    loom_tensor *owner = src->view_src ? src->view_src : src;
    if (owner == node->view_src) return LOOM_OK;
    bool found = false;
    size_t old = 0; /* src's offset in the old storage */
    for (int i = s->n_rewrites - 1; i >= 0 && !found; i--) {
        if (s->rewrites[i].node != src || s->rewrites[i].j >= 0) continue;
        found = true;
        old = s->rewrites[i].offs;
    }
    if (!found) return LOOM_OK;
    loom_status st = log_rewrite(s, node, -1, node->view_src);
    if (st != LOOM_OK) return st;
    node->view_offs = src->view_offs + (node->view_offs - old);
    node->view_src = owner;
    node->data = NULL; /* placed in the copy by the allocator */
    node->buffer = NULL;
    return LOOM_OK;
}

/* n_copies headers of src on backend b, named "<backend>#<src>#<c>"; copy `self` (or -1)
 * is src itself. Pipeline copies are INPUT|OUTPUT so the allocator gives each its own,
 * never reused, place. */
static loom_status make_copies(loom_sched *s, int sid, loom_tensor *src, int b, int self) {
    for (int c = 0; c < s->n_copies; c++) {
        loom_tensor *copy = src;
        if (c != self) {
            copy = loom__sched_new_header(s, src);
            if (!copy) return loom_last_status();
            loom_format_name(copy, "%s#%s#%d", loom_backend_name(s->backends[b]), src->name, c);
        }
        if (s->n_copies > 1) copy->flags |= LOOM_TENSOR_FLAG_INPUT | LOOM_TENSOR_FLAG_OUTPUT;
        loom_status st = loom__sched_copy_set(s, sid, b, c, copy);
        if (st != LOOM_OK) return st;
        if (c != self) {
            int cid = loom__sched_id_add_fast(s, copy);
            if (cid < 0) return loom_last_status();
            assign(s, cid, b, LOOM__CAUSE_CPY);
        }
    }
    return LOOM_OK;
}

/* Whether the node's source j needs a copy that does not exist yet on backend cur. */
static bool needs_new_copy(const loom_sched *s, const loom_tensor *node, int j, int sid, int cur) {
    const loom_tensor *src = node->src[j];
    for (int k = 0; k < j; k++) {
        if (node->src[k] == src) return false; /* counted already */
    }
    int sb = s->t_backend[sid];
    if (sb == cur || loom__sched_buffer_supported(s, src, cur)) return false;
    return loom__sched_copy_get(s, sid, cur, 0) == NULL;
}

/* A node read by a node of another split gets LOOM_TENSOR_FLAG_EXTERNAL: the backend that
 * computes its split sees only that split, so it must know the value is needed outside
 * (a meta backend would otherwise delay its reduction past its in-split consumers). */
static void mark_external(loom_sched *s, const int *split_of, int n_ids, loom_tensor *src, int sid,
                          int k) {
    if (sid < 0) sid = loom__sched_id(s, src);
    if (sid >= 0 && sid < n_ids && split_of[sid] >= 0 && split_of[sid] != k)
        src->flags |= LOOM_TENSOR_FLAG_EXTERNAL;
}

static loom_status pass5_cut(loom_sched *s, loom_graph *g, const int *nt, const int *st_ids,
                             int *split_of, int n_ids);

static loom_status pass5(loom_sched *s, loom_graph *g, const int *nt, const int *st_ids) {
    s->n_splits = 0;
    s->n_graph_inputs = 0;
    const int n_ids = s->n_ids;
    int *split_of = loom_malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof(int));
    if (!split_of) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory splitting a graph");
    for (int i = 0; i < n_ids; i++) split_of[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->flags &= ~LOOM_TENSOR_FLAG_EXTERNAL;
    loom_status st = pass5_cut(s, g, nt, st_ids, split_of, n_ids);
    loom_free(split_of);
    return st;
}

static loom_status pass5_cut(loom_sched *s, loom_graph *g, const int *nt, const int *st_ids,
                             int *split_of, int n_ids) {
    int first = s->n_backends - 1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!s->node_view[i]) {
            first = s->t_backend[nt[i]];
            break;
        }
    }
    loom_status st = split_open(s, first, 0);
    if (st != LOOM_OK) return st;
    int cur = first;
    /* the topology fingerprint of the allocation graph: every source's table id (ids
     * follow graph order), each node's op, and every input with its split's start */
    uint64_t fp = mix((uint64_t)g->n_nodes, (uint64_t)g->n_leafs);

    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *node = g->nodes[i];
        const int *sids = &st_ids[i * LOOM_MAX_SRC];
        fp = mix(fp, (uint64_t)node->op | ((uint64_t)node->type << 8) |
                         ((uint64_t)(node->flags & 3) << 16));
        const bool foreign = s->node_view[i] && foreign_view(s, node, s->t_backend[nt[i]]);
        if (s->node_view[i] && !foreign) { /* views never cut and never need copies */
            const int k = s->n_splits - 1;
            st = follow_rebased_source(s, node);
            if (st != LOOM_OK) return st;
            for (int j = 0; j < LOOM_MAX_SRC; j++) {
                if (!node->src[j]) continue;
                fp = mix(fp, ((uint64_t)j << 32) | (uint32_t)sids[j]);
                mark_external(s, split_of, n_ids, node->src[j], sids[j], k);
            }
            if (node->view_src) mark_external(s, split_of, n_ids, node->view_src, -1, k);
            if (nt[i] < n_ids) split_of[nt[i]] = k;
            continue;
        }
        int nb = s->t_backend[nt[i]];
        LOOM_ASSERT(nb != -1);
        loom__split *sp = &s->splits[s->n_splits - 1];

        bool cut = nb != cur;
        loom_tensor *src0 = node->src[0];
        if (!cut && sp->n_inputs > 0) {
            int n_new = 0;
            for (int j = 0; j < LOOM_MAX_SRC && !cut; j++) {
                if (!node->src[j] || s->t_backend[sids[j]] == cur) continue;
                if (!needs_new_copy(s, node, j, sids[j], cur)) continue;
                /* a new weight to stage: a new split lets its region be reused */
                if (weight_buffer(node->src[j])) cut = true;
                n_new++;
            }
            if (sp->n_inputs + n_new > s->max_split_inputs) cut = true;
        }
        if (cut) {
            sp->i_end = i;
            st = split_open(s, nb, i);
            if (st != LOOM_OK) return st;
            sp = &s->splits[s->n_splits - 1];
            cur = nb;
        }

        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            loom_tensor *src = node->src[j];
            if (!src) continue;
            int sid = sids[j];
            int sb = s->t_backend[sid];
            LOOM_ASSERT(sb != -1);
            fp = mix(fp, ((uint64_t)j << 32) | (uint32_t)sid);
            mark_external(s, split_of, n_ids, src, sid, s->n_splits - 1);

            if ((src->flags & LOOM_TENSOR_FLAG_INPUT) && s->n_copies > 1 &&
                !loom__sched_copy_get(s, sid, sb, 0)) {
                /* user input: one slot per pipeline copy on its own backend; the caller's
                 * tensor is the slot of the current copy */
                st = make_copies(s, sid, src, sb, s->cur_copy);
                if (st == LOOM_OK) st = add_graph_input(s, src);
                if (st != LOOM_OK) return st;
            }

            if (sb != cur && !loom__sched_buffer_supported(s, src, cur)) {
                if (!loom__sched_copy_get(s, sid, cur, 0)) {
                    /* an input adds a dependency and a copy where its split starts */
                    fp = mix(fp, (uint64_t)sp->i_start << 32 | (uint32_t)sid);
                    st = make_copies(s, sid, src, cur, -1);
                    if (st == LOOM_OK) st = split_add_input(s, sp, src);
                    if (st != LOOM_OK) return st;
                }
                st = log_rewrite(s, node, j, src);
                if (st != LOOM_OK) return st;
                node->src[j] = loom__sched_copy_get(s, sid, cur, s->cur_copy);
            }
        }
        if (foreign && node->src[0] != src0) {
            st = rebase_view(s, node, src0);
            if (st != LOOM_OK) return st;
        }
        if (nt[i] < n_ids) split_of[nt[i]] = s->n_splits - 1;
    }
    s->splits[s->n_splits - 1].i_end = g->n_nodes;
    s->topology = mix(fp, (uint64_t)s->n_copies);
    return LOOM_OK;
}

loom_status loom__sched_split(loom_sched *s, loom_graph *g) {
    s->n_graph_nodes = g->n_nodes;
    s->n_graph_leafs = g->n_leafs;
    g->uid = loom_graph_next_uid(); /* the graph is about to be edited */

    loom_status st = loom__ptrmap_reserve(&s->map, (size_t)(g->n_nodes + g->n_leafs) + 64);
    if (st != LOOM_OK) return st;
    if (g->n_nodes > s->cap_tmp) {
        int cap = g->n_nodes;
        int *nt = loom_realloc(s->node_tid, (size_t)cap * sizeof(*nt));
        if (nt) s->node_tid = nt;
        int *st_ids =
            nt ? loom_realloc(s->src_tid, (size_t)cap * LOOM_MAX_SRC * sizeof(*st_ids)) : NULL;
        if (st_ids) s->src_tid = st_ids;
        uint8_t *vw = st_ids ? loom_realloc(s->node_view, (size_t)cap) : NULL;
        if (!vw) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory splitting a graph");
        s->node_view = vw;
        s->cap_tmp = cap;
    }
    int *nt = s->node_tid, *st_ids = s->src_tid;

    /* passes 1-4 only query the backends; pass 5 edits the graph (input copies) */
    for (int b = 0; b < s->n_backends; b++) loom_backend_split_begin(s->backends[b]);
    st = pass1(s, g, nt);
    if (st == LOOM_OK) {
        sweep(s, g, nt, true, true, LOOM__CAUSE_GPU_DN);
        sweep(s, g, nt, false, true, LOOM__CAUSE_GPU_UP);
        sweep(s, g, nt, true, false, LOOM__CAUSE_ANY_DN);
        sweep(s, g, nt, false, false, LOOM__CAUSE_ANY_UP);
        pass3(s, g, nt);
        st = pass4(s, g, nt, st_ids);
    }
    for (int b = 0; b < s->n_backends; b++) loom_backend_split_end(s->backends[b]);
    if (st != LOOM_OK) return st;
    return pass5(s, g, nt, st_ids);
}
