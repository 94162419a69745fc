/*
 * The scheduler object: construction, the per-tensor table, the round state machine
 * (reset -> split -> alloc -> compute), reserve, reallocation decisions and the getters.
 * The passes live in sched_split.c, the allocation graph in sched_graph.c, execution in
 * sched_compute.c.
 *
 * Rounds: a split edits the caller's graph (sources become copies), so the table and the
 * copies belong to that graph until the next reset. User pins (set_tensor_backend) are
 * kept in their own list and applied at the start of a split; an explicit reset drops
 * them, an automatic one (a new graph given to compute) drops only those a split used.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/galloc-impl.h"
#include "sched/sched-impl.h"

typedef struct loom__pin {
    const loom_tensor *t;
    int backend_id;
    bool used; /* applied by a split since it was set */
} loom__pin;

/* The pins live beside the scheduler (not in sched-impl.h: only this file needs them). */
typedef struct loom__sched_pins {
    loom__pin *pins;
    int n, cap;
} loom__sched_pins;

typedef struct loom__sched_full {
    struct loom_sched s;
    loom__sched_pins pins;
    /* nodes of the graph being split that their backend refused once their sources were
     * replaced by copies (a meta device cannot split a value that arrives whole the way
     * its rule needs): the next attempt places them on the CPU (cause 5.fbk) */
    const loom_tensor **fbk;
    int n_fbk, cap_fbk;
    bool dirty; /* a split ran since the last reset */
} loom__sched_full;

static loom__sched_full *full_of(loom_sched *s) {
    return (loom__sched_full *)s;
}
static const loom__sched_full *cfull_of(const loom_sched *s) {
    return (const loom__sched_full *)s;
}

static const char *const cause_names[LOOM__CAUSE_COUNT] = {
    [LOOM__CAUSE_NONE] = "",           [LOOM__CAUSE_USR] = "usr",
    [LOOM__CAUSE_DST] = "1.dst",       [LOOM__CAUSE_VSRC1] = "1.vsrc",
    [LOOM__CAUSE_INP] = "1.inp",       [LOOM__CAUSE_WGT0 + 0] = "1.wgt0",
    [LOOM__CAUSE_WGT0 + 1] = "1.wgt1", [LOOM__CAUSE_WGT0 + 2] = "1.wgt2",
    [LOOM__CAUSE_WGT0 + 3] = "1.wgt3", [LOOM__CAUSE_WGT0 + 4] = "1.wgt4",
    [LOOM__CAUSE_WGT0 + 5] = "1.wgt5", [LOOM__CAUSE_WGT0 + 6] = "1.wgt6",
    [LOOM__CAUSE_WGT0 + 7] = "1.wgt7", [LOOM__CAUSE_WGT0 + 8] = "1.wgt8",
    [LOOM__CAUSE_WGT0 + 9] = "1.wgt9", [LOOM__CAUSE_OFF] = "1.off",
    [LOOM__CAUSE_GPU_DN] = "2.gpu-dn", [LOOM__CAUSE_GPU_UP] = "2.gpu-up",
    [LOOM__CAUSE_ANY_DN] = "2.any-dn", [LOOM__CAUSE_ANY_UP] = "2.any-up",
    [LOOM__CAUSE_UPG] = "3.upg",       [LOOM__CAUSE_BEST] = "3.best",
    [LOOM__CAUSE_VSRC4] = "4.vsrc",    [LOOM__CAUSE_CUR] = "4.cur",
    [LOOM__CAUSE_SUP] = "4.sup",       [LOOM__CAUSE_CPY] = "4.cpy",
    [LOOM__CAUSE_FBK] = "5.fbk",
};

const char *loom__cause_name(int cause) {
    if (cause < 0 || cause >= LOOM__CAUSE_COUNT || !cause_names[cause]) return "?";
    return cause_names[cause];
}

/* ------------------------------------------------------------------ tensor table */

int loom__sched_id_add(loom_sched *s, const loom_tensor *t) {
    int id = loom__ptrmap_get(&s->map, t);
    if (id >= 0) return id;
    return loom__sched_id_insert(s, t);
}

int loom__sched_id_insert(loom_sched *s, const loom_tensor *t) {
    int id;
    if (s->n_ids == s->cap_ids) {
        int cap = s->cap_ids ? 2 * s->cap_ids : 1024;
        int8_t *b = loom_realloc(s->t_backend, (size_t)cap * sizeof(*b));
        if (b) s->t_backend = b;
        uint8_t *c = b ? loom_realloc(s->t_cause, (size_t)cap * sizeof(*c)) : NULL;
        if (c) s->t_cause = c;
        int32_t *p = c ? loom_realloc(s->t_copies, (size_t)cap * sizeof(*p)) : NULL;
        if (!p) {
            loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for the tensor table");
            return -1;
        }
        s->t_copies = p;
        s->cap_ids = cap;
    }
    if (loom__ptrmap_put(&s->map, t, s->n_ids) != LOOM_OK) return -1;
    id = s->n_ids++;
    s->t_backend[id] = -1;
    s->t_cause[id] = LOOM__CAUSE_NONE;
    s->t_copies[id] = -1;
    return id;
}

loom_tensor *loom__sched_copy_get(const loom_sched *s, int id, int b, int c) {
    int base = s->t_copies[id];
    if (base < 0) return NULL;
    return s->copy_pool[base + b * LOOM_SCHED_MAX_COPIES + c];
}

loom_status loom__sched_copy_set(loom_sched *s, int id, int b, int c, loom_tensor *copy) {
    if (s->t_copies[id] < 0) {
        int block = s->n_backends * LOOM_SCHED_MAX_COPIES;
        if (s->n_pool + block > s->cap_pool) {
            int cap = s->cap_pool ? 2 * s->cap_pool : 64 * block;
            while (cap < s->n_pool + block)
                cap *= 2;
            loom_tensor **p = loom_realloc(s->copy_pool, (size_t)cap * sizeof(*p));
            if (!p) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for copies");
            s->copy_pool = p;
            s->cap_pool = cap;
        }
        memset(&s->copy_pool[s->n_pool], 0, (size_t)block * sizeof(*s->copy_pool));
        s->t_copies[id] = s->n_pool;
        s->n_pool += block;
    }
    s->copy_pool[s->t_copies[id] + b * LOOM_SCHED_MAX_COPIES + c] = copy;
    return LOOM_OK;
}

loom_tensor *loom__sched_new_header(loom_sched *s, const loom_tensor *like) {
    loom__round *r = &s->rounds[s->cur_copy];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (r->n_ctxs > 0) {
            loom_tensor *t = loom_dup_tensor(r->ctxs[r->n_ctxs - 1], like);
            if (t) {
                for (int d = 0; d < LOOM_MAX_DIMS; d++)
                    t->nb[d] = like->nb[d];
                return t;
            }
            if (attempt > 0) return NULL;
            s->ctx_size *= 2; /* full: chain a larger context */
        }
        if (r->n_ctxs == r->cap_ctxs) {
            int cap = r->cap_ctxs ? 2 * r->cap_ctxs : 4;
            loom_ctx **c = loom_realloc(r->ctxs, (size_t)cap * sizeof(*c));
            if (!c) {
                loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for contexts");
                return NULL;
            }
            r->ctxs = c;
            r->cap_ctxs = cap;
        }
        loom_ctx_params p = {.mem_size = s->ctx_size, .mem_buffer = NULL, .no_alloc = true};
        loom_ctx *ctx = loom_ctx_new(p);
        if (!ctx) return NULL;
        r->ctxs[r->n_ctxs++] = ctx;
    }
    return NULL;
}

loom_status loom__sched_round_graphs(loom_sched *s, int n) {
    loom__round *r = &s->rounds[s->cur_copy];
    if (n <= r->cap_graphs) return LOOM_OK;
    int cap = r->cap_graphs ? r->cap_graphs : 16;
    while (cap < n)
        cap *= 2;
    loom_graph *gs = loom_realloc(r->graphs, (size_t)cap * sizeof(*gs));
    if (!gs) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for split graphs");
    r->graphs = gs;
    r->cap_graphs = cap;
    return LOOM_OK;
}

/* Frees the headers of slot c (its work must be done). */
static void round_release(loom_sched *s, int c) {
    loom__round *r = &s->rounds[c];
    if (r->n_ctxs > 1) {
        /* next time: one context as large as this round needed */
        size_t total = 0;
        for (int i = 0; i < r->n_ctxs; i++)
            total += loom_ctx_used(r->ctxs[i]);
        while (s->ctx_size < total + total / 4)
            s->ctx_size *= 2;
    }
    for (int i = 0; i < r->n_ctxs; i++)
        loom_ctx_free(r->ctxs[i]);
    r->n_ctxs = 0;
}

/* Before the current slot's storage is reused: wait until every backend has passed the
 * last event recorded for this slot (the end of the round that last used it). */
static void round_begin(loom_sched *s) {
    loom__round *r = &s->rounds[s->cur_copy];
    if (r->n_ctxs == 0 && !r->issued) return;
    for (int b = 0; b < s->n_backends; b++) {
        loom_event_t ev = s->events[b][s->cur_copy];
        if (ev) {
            loom_event_synchronize(ev);
        } else {
            loom__sched_sync(s, b);
        }
    }
    round_release(s, s->cur_copy);
    r->issued = false;
}

/* ------------------------------------------------------------------ construction */

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    return atoi(v);
}

static void sched_free_events(loom_sched *s) {
    for (int b = 0; b < LOOM_SCHED_MAX_BACKENDS; b++) {
        for (int c = 0; c < LOOM_SCHED_MAX_COPIES; c++) {
            if (s->events[b][c]) loom_event_free(s->events[b][c]);
            s->events[b][c] = NULL;
        }
        if (s->copies_done[b]) loom_event_free(s->copies_done[b]);
        s->copies_done[b] = NULL;
    }
}

loom_sched *loom_sched_new(loom_backend_t *backends, loom_buft_t *bufts, int n, size_t graph_size,
                           bool parallel, bool op_offload) {
    if (!backends || n <= 0) {
        loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_new: need at least one backend (got %d)", n);
        return NULL;
    }
    if (n > LOOM_SCHED_MAX_BACKENDS) {
        loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_new: at most %d backends (got %d)",
                   LOOM_SCHED_MAX_BACKENDS, n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!backends[i]) {
            loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_new: backend %d is NULL", i);
            return NULL;
        }
    }
    loom_dev_t last = loom_backend_device(backends[n - 1]);
    if (loom_dev_get_type(last) != LOOM_DEV_TYPE_CPU) {
        static const char *const kinds[] = {"CPU", "GPU", "accelerator", "meta"};
        loom_dev_type ty = loom_dev_get_type(last);
        loom_error(LOOM_ERR_INVALID_ARG,
                   "loom_sched_new: the last backend must be a CPU device (the fallback for "
                   "every op), but backend %d (%s) is a %s device",
                   n - 1, loom_backend_name(backends[n - 1]),
                   (unsigned)ty < 4 ? kinds[ty] : "unknown");
        return NULL;
    }
    loom_buft_t use_bufts[LOOM_SCHED_MAX_BACKENDS];
    for (int i = 0; i < n; i++) {
        use_bufts[i] = bufts && bufts[i] ? bufts[i] : loom_backend_default_buft(backends[i]);
        if (!use_bufts[i] || !loom_backend_supports_buft(backends[i], use_bufts[i])) {
            loom_error(LOOM_ERR_INVALID_ARG,
                       "loom_sched_new: backend %d (%s) does not support buffer type %s", i,
                       loom_backend_name(backends[i]),
                       use_bufts[i] ? loom_buft_name(use_bufts[i]) : "(none)");
            return NULL;
        }
    }

    loom__sched_full *f = loom_calloc(1, sizeof(*f));
    if (!f) {
        loom_error(LOOM_ERR_NOMEM, "loom_sched_new: out of host memory");
        return NULL;
    }
    loom_sched *s = &f->s;
    s->n_backends = n;
    for (int i = 0; i < n; i++) {
        s->backends[i] = backends[i];
        s->bufts[i] = use_bufts[i];
    }
    s->op_offload = op_offload;
    s->n_copies = parallel ? LOOM_SCHED_MAX_COPIES : 1;
    if (graph_size < 64) graph_size = 64;
    s->ctx_size = 256 * loom_tensor_overhead() + 4096;
    s->debug = env_int("LOOM_SCHED_DEBUG", 0);
    s->debug_realloc = env_int("LOOM_SCHED_DEBUG_REALLOC", 0);
    s->max_split_inputs = env_int("LOOM_SCHED_MAX_SPLIT_INPUTS", LOOM_SCHED_MAX_SPLIT_INPUTS);
    if (s->max_split_inputs < 1) s->max_split_inputs = LOOM_SCHED_MAX_SPLIT_INPUTS;

    /* events order copies between backends; a device without events gets NULL and the
     * scheduler synchronises instead */
    for (int b = 0; b < n; b++) {
        for (int c = 0; c < s->n_copies; c++) {
            s->events[b][c] = loom_event_new(loom_backend_device(backends[b]));
        }
        s->copies_done[b] = loom_event_new(loom_backend_device(backends[b]));
    }
    loom_clear_error();
    s->galloc = loom_gallocr_new_n(s->bufts, n);
    if (!s->galloc || loom__ptrmap_init(&s->map, graph_size * 2) != LOOM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", loom_last_error());
        loom_sched_free(s);
        loom_error(LOOM_ERR_NOMEM, "loom_sched_new: %s", why);
        return NULL;
    }
    s->is_reset = true;
    return s;
}

void loom_sched_free(loom_sched *s) {
    if (!s) return;
    loom__sched_full *f = full_of(s);
    for (int b = 0; b < s->n_backends; b++)
        loom__sched_sync(s, b);
    sched_free_events(s);
    loom_gallocr_free(s->galloc);
    loom__ptrmap_free(&s->map);
    loom_free(s->t_backend);
    loom_free(s->t_cause);
    loom_free(s->t_copies);
    loom_free(s->copy_pool);
    for (int i = 0; i < s->cap_splits; i++)
        loom_free(s->splits[i].inputs);
    loom_free(s->splits);
    loom_free(s->graph_inputs);
    loom_free(s->rewrites);
    loom_free(s->node_tid);
    loom_free(s->src_tid);
    loom_free(s->node_view);
    loom_free(s->graph.nodes);
    loom_free(s->graph.leafs);
    loom_free(s->node_ids);
    loom_free(s->leaf_ids);
    for (int c = 0; c < LOOM_SCHED_MAX_COPIES; c++) {
        round_release(s, c);
        loom_free(s->rounds[c].ctxs);
        loom_free(s->rounds[c].graphs);
    }
    loom_free(f->pins.pins);
    loom_free(f->fbk);
    loom_free(f);
}

/* ------------------------------------------------------------------ rounds */

static void clear_table(loom_sched *s) {
    loom__ptrmap_clear(&s->map);
    s->n_ids = 0;
    s->n_pool = 0;
    s->n_rewrites = 0; /* n_splits and friends stay readable as stats; the round's
                        * headers stay until its slot is reused (round_begin) */
}

/* keep_pending: keep pins set since the last split (an automatic reset) */
static void sched_reset(loom_sched *s, bool keep_pending) {
    loom__sched_full *f = full_of(s);
    if (f->dirty) clear_table(s);
    f->dirty = false;
    int k = 0;
    for (int i = 0; keep_pending && i < f->pins.n; i++) {
        if (!f->pins.pins[i].used) f->pins.pins[k++] = f->pins.pins[i];
    }
    f->pins.n = k;
    s->is_reset = true;
    s->is_split = false;
    s->is_alloc = false;
    s->cur_graph = NULL;
}

void loom_sched_reset(loom_sched *s) {
    if (s) sched_reset(s, false);
}

void loom__sched_sync(loom_sched *s, int b) {
    loom_backend_synchronize_keep(s->backends[b], &s->async_status, s->async_msg,
                                  sizeof s->async_msg);
    s->pending_reads[b] = 0; /* its stream is idle: its copies are done */
    for (int a = 0; a < s->n_backends; a++)
        s->host_waits[a] &= ~(1u << b);
}

loom_status loom__sched_take_status(loom_sched *s) {
    loom_status st = s->async_status;
    if (st == LOOM_OK) return LOOM_OK;
    s->async_status = LOOM_OK;
    return loom_error(st, "sched: a graph failed on a device: %s", s->async_msg);
}

loom_status loom_sched_synchronize(loom_sched *s) {
    if (!s) return LOOM_OK;
    for (int b = 0; b < s->n_backends; b++)
        loom__sched_sync(s, b);
    /* every backend is idle, so no copy slot is in use: the next graph takes copy 0, which
     * keeps token-by-token generation on one stable graph */
    s->next_copy = 0;
    return loom__sched_take_status(s);
}

/* Applies pending pins to the table (after the graph's own tensors got their ids, so ids
 * follow graph order whatever is pinned). */
loom_status loom__sched_apply_pins(loom_sched *s) {
    loom__sched_full *f = full_of(s);
    for (int i = 0; i < f->pins.n; i++) {
        loom__pin *p = &f->pins.pins[i];
        int id = loom__sched_id_add(s, p->t);
        if (id < 0) return loom_last_status();
        s->t_backend[id] = (int8_t)p->backend_id;
        s->t_cause[id] = LOOM__CAUSE_USR;
        p->used = true;
    }
    for (int i = 0; i < f->n_fbk; i++) {
        int id = loom__sched_id_add(s, f->fbk[i]);
        if (id < 0) return loom_last_status();
        if (s->t_cause[id] == LOOM__CAUSE_USR) continue;
        s->t_backend[id] = (int8_t)(s->n_backends - 1);
        s->t_cause[id] = LOOM__CAUSE_FBK;
    }
    return LOOM_OK;
}

/* Puts the caller's graph back as it was before the split (sources edited to copies). */
static void undo_rewrites(loom_sched *s) {
    for (int i = s->n_rewrites - 1; i >= 0; i--) {
        loom__rewrite *r = &s->rewrites[i];
        if (r->j < 0) {
            r->node->view_src = r->orig;
            r->node->view_offs = r->offs;
            r->node->data = r->data;
            r->node->buffer = r->buffer;
        } else {
            r->node->src[r->j] = r->orig;
        }
    }
    s->n_rewrites = 0;
}

static bool is_current(const loom_sched *s, const loom_graph *g);

/* The computed source a CPY or SET_ROWS writes (made on the CPU, it arrives whole, and a
 * whole value can be written into any split of the destination), or NULL. */
static const loom_tensor *whole_source(const loom_tensor *t) {
    if (t->op != LOOM_OP_CPY && t->op != LOOM_OP_SET_ROWS) return NULL;
    const loom_tensor *src = t->src[0];
    return src && src->op != LOOM_OP_NONE ? src : NULL;
}

/* The first node placed on a backend other than the CPU that this backend refuses now
 * that its sources are what the split made them, or NULL. Only a node downstream of a
 * change can change its answer: one that reads a copy or was rebased (the rewrite log), and
 * whatever reads those, transitively (a value that arrives whole changes the split states
 * derived from it). */
static const loom_tensor *refused_as_placed(loom_sched *s, const loom_graph *g) {
    const int cpu = s->n_backends - 1;
    /* only a backend that brackets its queries (split_begin: its answers depend on the
     * graph, as a meta device's split states do) can answer differently now */
    bool asks = false;
    for (int b = 0; b < cpu; b++)
        asks |= s->backends[b]->iface->split_begin != NULL;
    if (!asks || s->n_rewrites == 0) return NULL;
    bool *mark = loom_calloc((size_t)s->n_ids + 1, sizeof *mark);
    if (!mark) return NULL; /* out of memory: keep the split; a refusal fails at compute */
    for (int i = 0; i < s->n_rewrites; i++) {
        int id = loom__sched_id(s, s->rewrites[i].node);
        if (id >= 0 && id < s->n_ids) mark[id] = true;
    }
    const loom_tensor *bad = NULL;
    for (int b = 0; b < s->n_backends; b++)
        loom_backend_split_begin(s->backends[b]);
    for (int i = 0; i < g->n_nodes && !bad; i++) {
        const loom_tensor *t = g->nodes[i];
        int id = s->node_tid[i]; /* the split's ids: node i, and its sources' */
        if (id < 0 || id >= s->n_ids) continue;
        for (int j = 0; j < LOOM_MAX_SRC && !mark[id]; j++) {
            int sid = t->src[j] ? s->src_tid[i * LOOM_MAX_SRC + j] : -1;
            mark[id] = sid >= 0 && sid < s->n_ids && mark[sid];
        }
        int b = s->t_backend[id];
        if (!mark[id] || t->op == LOOM_OP_NONE || b < 0 || b == cpu ||
            !s->backends[b]->iface->split_begin)
            continue;
        if (!loom_backend_supports_op(s->backends[b], t)) bad = t;
    }
    for (int b = 0; b < s->n_backends; b++)
        loom_backend_split_end(s->backends[b]);
    loom_free(mark);
    return bad;
}

static loom_status split_round(loom_sched *s, loom_graph *g) {
    loom__sched_full *f = full_of(s);
    /* splitting the graph of this round again: put its sources back first (its copies are
     * about to be forgotten) */
    if (f->dirty && is_current(s, g)) {
        for (int b = 0; b < s->n_backends; b++)
            loom__sched_sync(s, b);
        undo_rewrites(s);
    }
    if (f->dirty) sched_reset(s, true);
    f->dirty = true;
    s->is_reset = false;
    round_begin(s);
    f->n_fbk = 0;
    s->want_whole = NULL;
    loom_status st = loom__sched_split(s, g);
    /* a node its backend refuses with its sources as placed (copies from another backend
     * arrive whole) falls back to the CPU; a CPY or SET_ROWS writing memory only its
     * backend can use gets its source made on the CPU instead, so that it arrives whole
     * and each device writes its part. Split again until nothing moves (each attempt
     * moves one more node; one already moved ends it with the error). */
    for (;;) {
        const loom_tensor *move = NULL;
        if (st == LOOM_OK) {
            const loom_tensor *bad = refused_as_placed(s, g);
            if (!bad) break;
            move = bad;
            loom_buffer_t home = bad->view_src ? bad->view_src->buffer : bad->buffer;
            if (home && !loom__sched_buffer_supported(s, bad, s->n_backends - 1) &&
                (bad->op == LOOM_OP_CPY || bad->op == LOOM_OP_SET_ROWS || !bad->view_src)) {
                char why[384];
                snprintf(why, sizeof why, "%s", loom_last_error());
                st =
                    loom_error(LOOM_ERR_UNSUPPORTED,
                               "sched: pre-allocated tensor %s (op %s) lives in buffer %s, and "
                               "%s cannot run it with its inputs as placed (%s); no other "
                               "backend can write that buffer",
                               bad->name, loom_op_name(bad->op), loom_buffer_name(home),
                               loom_backend_name(s->backends[loom__sched_backend_of(s, bad)]), why);
                move = whole_source(bad);
            }
        } else {
            move = s->want_whole; /* pass 1: a pre-allocated CPY/SET_ROWS nobody can run */
        }
        s->want_whole = NULL;
        bool seen = !move; /* moved already (or pinned there by the user): give up */
        for (int i = 0; i < f->n_fbk && !seen; i++)
            seen = f->fbk[i] == move;
        if (seen) break;
        if (f->n_fbk == f->cap_fbk) {
            int cap = f->cap_fbk ? 2 * f->cap_fbk : 16;
            const loom_tensor **fbk = loom_realloc(f->fbk, (size_t)cap * sizeof *fbk);
            if (!fbk) {
                st = loom_error(LOOM_ERR_NOMEM, "sched: out of host memory splitting a graph");
                break;
            }
            f->fbk = fbk;
            f->cap_fbk = cap;
        }
        f->fbk[f->n_fbk++] = move;
        LOOM_LOG_DEBUG("sched: %s '%s' runs on %s (its backend refuses it as placed, or a "
                       "consumer needs it whole)",
                       loom_op_name(move->op), move->name,
                       loom_backend_name(s->backends[s->n_backends - 1]));
        undo_rewrites(s);
        for (int i = 0; i < f->pins.n; i++)
            f->pins.pins[i].used = false; /* applied again */
        sched_reset(s, true);
        f->dirty = true;
        s->is_reset = false;
        round_begin(s);
        st = loom__sched_split(s, g);
    }
    if (st == LOOM_OK) st = loom__sched_build_graph(s, g);
    if (st != LOOM_OK) {
        s->is_split = false;
        return st;
    }
    if (s->debug > 0) loom__sched_debug_print(s, g);
    s->is_split = true;
    s->is_alloc = false;
    s->cur_graph = g;
    s->cur_uid = g->uid;
    return LOOM_OK;
}

/* Whether g is the graph of the current round (same object, not rebuilt since). */
static bool is_current(const loom_sched *s, const loom_graph *g) {
    return s->cur_graph == g && s->cur_uid == g->uid;
}

bool loom_sched_is_allocated(const loom_sched *s, const loom_graph *g) {
    return s && g && s->is_alloc && is_current(s, g);
}

static void rotate_copy(loom_sched *s) {
    s->cur_copy = s->next_copy;
    s->next_copy = (s->next_copy + 1) % s->n_copies;
}

loom_status loom_sched_split_graph(loom_sched *s, loom_graph *g) {
    if (!s || !g) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_split_graph: NULL argument");
    rotate_copy(s);
    return split_round(s, g);
}

static void sync_backends(loom_sched *s) {
    /* not loom_sched_synchronize: that would change the copy index */
    for (int b = 0; b < s->n_backends; b++)
        loom__sched_sync(s, b);
}

static loom_status alloc_splits(loom_sched *s) {
    loom__gallocr_set_topology(s->galloc, s->topology);
    loom__galloc_check why = loom__gallocr_check(s->galloc, &s->graph, s->node_ids, s->leaf_ids);
    if (why != LOOM__GALLOC_FITS) {
        if (why != LOOM__GALLOC_NO_PLAN && s->debug_realloc > 0) {
            bool unexpected = why == LOOM__GALLOC_SIZE || why == LOOM__GALLOC_TOPOLOGY;
            if (unexpected || s->debug_realloc > 1) {
                return loom_error(LOOM_ERR_INTERNAL,
                                  "sched: unexpected graph reallocation (%s; graph size = %d, "
                                  "nodes = %d, leafs = %d), LOOM_SCHED_DEBUG_REALLOC = %d",
                                  loom__galloc_check_name(why),
                                  s->graph.n_nodes > s->graph.n_leafs ? s->graph.n_nodes
                                                                      : s->graph.n_leafs,
                                  s->n_graph_nodes, s->n_graph_leafs, s->debug_realloc);
            }
        }
        if (why != LOOM__GALLOC_NO_PLAN) {
            LOOM_LOG_DEBUG("sched: reallocating compute buffers (%s)",
                           loom__galloc_check_name(why));
        }
        /* the arenas may move under the devices: everything must be idle */
        sync_backends(s);
        loom_status st = loom_gallocr_reserve_n(s->galloc, &s->graph, s->node_ids, s->leaf_ids);
        if (st != LOOM_OK) {
            char why[384];
            snprintf(why, sizeof why, "%s", loom_last_error());
            return loom_error(st, "sched: failed to allocate the compute buffers: %s", why);
        }
        s->n_reallocs++;
    }
    return loom__gallocr_stamp(s->galloc, &s->graph);
}

loom_status loom_sched_alloc_graph(loom_sched *s, loom_graph *g) {
    if (!s || !g) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_alloc_graph: NULL argument");
    if (s->is_alloc) {
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "loom_sched_alloc_graph: a graph is already allocated; call "
                          "loom_sched_reset first");
    }
    loom_status st;
    if (!(s->is_split && is_current(s, g))) {
        rotate_copy(s);
        st = split_round(s, g);
        if (st != LOOM_OK) return st;
    }
    st = alloc_splits(s);
    if (st != LOOM_OK) return st;
    s->is_split = false;
    s->is_alloc = true;
    return LOOM_OK;
}

loom_status loom_sched_graph_compute_async(loom_sched *s, loom_graph *g) {
    if (!s || !g) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_graph_compute_async: NULL argument");
    }
    if (!(s->is_alloc && is_current(s, g))) {
        if (s->is_alloc) sched_reset(s, true);
        loom_status st = loom_sched_alloc_graph(s, g);
        if (st != LOOM_OK) return st;
    }
    loom_status st = loom__sched_compute_splits(s);
    if (st != LOOM_OK) {
        s->async_status = LOOM_OK; /* the error returned covers it */
        return st;
    }
    return loom__sched_take_status(s);
}

loom_status loom_sched_graph_compute(loom_sched *s, loom_graph *g) {
    loom_status st = loom_sched_graph_compute_async(s, g);
    if (st == LOOM_OK) st = loom_sched_synchronize(s);
    return st;
}

static loom_status reserve_impl(loom_sched *s, loom_graph *g, size_t *sizes) {
    loom__sched_full *f = full_of(s);
    sync_backends(s);
    if (s->is_alloc || s->is_split) sched_reset(s, true);
    loom_status st = split_round(s, g);
    if (st != LOOM_OK) return st;
    loom__gallocr_set_topology(s->galloc, s->topology);
    if (sizes) {
        st = loom_gallocr_reserve_n_size(s->galloc, &s->graph, s->node_ids, s->leaf_ids, sizes);
    } else {
        st = loom_gallocr_reserve_n(s->galloc, &s->graph, s->node_ids, s->leaf_ids);
        if (st != LOOM_OK && s->n_copies > 1 &&
            (st == LOOM_ERR_DEVICE_OOM || st == LOOM_ERR_NOMEM)) {
            char why[384];
            snprintf(why, sizeof why, "%s", loom_last_error());
            LOOM_LOG_WARN("sched: compute buffer allocation failed (%s), retrying without "
                          "pipeline parallelism",
                          why);
            undo_rewrites(s);
            for (int i = 0; i < f->pins.n; i++)
                f->pins.pins[i].used = false;
            sched_reset(s, true);
            for (int c = 0; c < LOOM_SCHED_MAX_COPIES; c++)
                round_release(s, c); /* idle */
            s->n_copies = 1;
            s->cur_copy = s->next_copy = 0;
            st = split_round(s, g);
            loom__gallocr_set_topology(s->galloc, s->topology);
            if (st == LOOM_OK) {
                st = loom_gallocr_reserve_n(s->galloc, &s->graph, s->node_ids, s->leaf_ids);
            }
        }
        if (st == LOOM_OK) s->n_reallocs++;
    }
    /* the measure graph is spent; keep its stats, drop its assignments */
    sched_reset(s, true);
    return st;
}

loom_status loom_sched_reserve(loom_sched *s, loom_graph *g) {
    if (!s || !g) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_reserve: NULL argument");
    return reserve_impl(s, g, NULL);
}

loom_status loom_sched_reserve_size(loom_sched *s, loom_graph *g, size_t *sizes) {
    if (!s || !g || !sizes) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_reserve_size: NULL argument");
    }
    return reserve_impl(s, g, sizes);
}

/* ------------------------------------------------------------------ assignments */

static int backend_index(const loom_sched *s, loom_backend_t backend) {
    for (int b = 0; b < s->n_backends; b++) {
        if (s->backends[b] == backend) return b;
    }
    return -1;
}

loom_status loom_sched_set_tensor_backend(loom_sched *s, loom_tensor *t, loom_backend_t backend) {
    if (!s || !t) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_set_tensor_backend: NULL argument");
    }
    int b = backend_index(s, backend);
    if (b < 0) {
        return loom_error(LOOM_ERR_NOT_FOUND,
                          "loom_sched_set_tensor_backend: %s is not one of the scheduler's "
                          "backends",
                          backend ? loom_backend_name(backend) : "(null)");
    }
    loom__sched_pins *p = &full_of(s)->pins;
    for (int i = 0; i < p->n; i++) {
        if (p->pins[i].t == t) {
            p->pins[i].backend_id = b;
            p->pins[i].used = false;
            return LOOM_OK;
        }
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        loom__pin *np = loom_realloc(p->pins, (size_t)cap * sizeof(*np));
        if (!np) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory for pins");
        p->pins = np;
        p->cap = cap;
    }
    p->pins[p->n++] = (loom__pin){t, b, false};
    s->is_reset = false;
    return LOOM_OK;
}

static const loom__pin *find_pin(const loom_sched *s, const loom_tensor *t) {
    const loom__sched_pins *p = &cfull_of(s)->pins;
    for (int i = 0; i < p->n; i++) {
        if (p->pins[i].t == t) return &p->pins[i];
    }
    return NULL;
}

loom_backend_t loom_sched_get_tensor_backend(const loom_sched *s, const loom_tensor *t) {
    if (!s || !t) return NULL;
    int b = loom__sched_backend_of(s, t);
    if (b >= 0) return s->backends[b];
    const loom__pin *p = find_pin(s, t);
    return p ? s->backends[p->backend_id] : NULL;
}

const char *loom_sched_get_tensor_cause(const loom_sched *s, const loom_tensor *t) {
    if (!s || !t) return "";
    int id = loom__sched_id(s, t);
    if (id >= 0 && s->t_backend[id] >= 0) return loom__cause_name(s->t_cause[id]);
    return find_pin(s, t) ? "usr" : "";
}

void loom_sched_set_eval_callback(loom_sched *s, loom_sched_eval_cb cb, void *user_data) {
    if (!s) return;
    s->eval_cb = cb;
    s->eval_ud = user_data;
}

void loom_sched_set_max_split_inputs(loom_sched *s, int n) {
    if (s) s->max_split_inputs = n > 0 ? n : LOOM_SCHED_MAX_SPLIT_INPUTS;
}

/* ------------------------------------------------------------------ getters */

void loom_sched_get_stats(const loom_sched *s, loom_sched_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof(*out));
    if (!s) return;
    out->n_nodes = s->n_graph_nodes;
    out->n_leafs = s->n_graph_leafs;
    out->n_splits = s->n_splits;
    for (int k = 0; k < s->n_splits; k++)
        out->n_inputs += s->splits[k].n_inputs;
    out->n_graph_inputs = s->n_graph_inputs;
    out->n_copies = s->n_copies;
    out->cur_copy = s->cur_copy;
    out->n_alloc_nodes = s->graph.n_nodes;
    out->n_reallocs = s->n_reallocs;
}

int loom_sched_get_n_splits(const loom_sched *s) {
    return s ? s->n_splits : 0;
}
int loom_sched_get_n_copies(const loom_sched *s) {
    return s ? s->n_copies : 0;
}
int loom_sched_get_n_backends(const loom_sched *s) {
    return s ? s->n_backends : 0;
}

loom_backend_t loom_sched_get_backend(const loom_sched *s, int i) {
    if (!s || i < 0 || i >= s->n_backends) return NULL;
    return s->backends[i];
}

loom_buft_t loom_sched_get_buffer_type(const loom_sched *s, loom_backend_t backend) {
    int b = s ? backend_index(s, backend) : -1;
    return b >= 0 ? s->bufts[b] : NULL;
}

size_t loom_sched_get_buffer_size(const loom_sched *s, loom_backend_t backend) {
    int b = s ? backend_index(s, backend) : -1;
    return b >= 0 ? loom_gallocr_get_buffer_size(s->galloc, b) : 0;
}

loom_status loom_sched_get_split(const loom_sched *s, int k, loom_sched_split_info *out) {
    if (!s || !out || k < 0 || k >= s->n_splits) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_sched_get_split: no split %d (of %d)", k,
                          s ? s->n_splits : 0);
    }
    const loom__split *sp = &s->splits[k];
    out->backend = s->backends[sp->backend_id];
    out->i_start = sp->i_start;
    out->i_end = sp->i_end;
    out->n_inputs = sp->n_inputs;
    out->inputs = sp->inputs;
    return LOOM_OK;
}
