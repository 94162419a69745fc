/*
 * The dist reg "MPI" and its devices MPI0..MPI{N-1}, one per rank, as members of an ordinary
 * meta device (include/loom/dist.h). On rank r:
 *   - MPI{r} is local: its buffer type, buffers and backend forward to the real local device
 *     (the CPU or a sim device); a read of its memory is also broadcast from r, because every
 *     other rank reads the same tensor through its remote MPI{r} at the same point;
 *   - every other member is remote: a buffer of the right size with no memory behind it
 *     (writes dropped: the owning rank writes its own slice; reads receive the owner's
 *     broadcast), a backend whose graphs are not run here.
 * Static questions (supports_op, alignment, alloc sizes, memory) are answered by the local
 * device on every member, since every rank runs the same kind of device.
 * The reg exports the communicator contract (LOOM_PROC_COMM_*), so the meta device's
 * reducer sums the local slices with MPI_Allreduce.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dist/dist-impl.h"
#include "loom/cpu.h"

bool loom_dist_launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                       NULL};
    for (const char *const *v = vars; *v; v++)
        if (getenv(*v) && getenv(*v)[0]) return true;
    return false;
}

int loom_dist_rank(const loom_dist *d) {
    return d ? d->rank : 0;
}
int loom_dist_size(const loom_dist *d) {
    return d ? d->size : 1;
}
void loom_dist_get_stats(const loom_dist *d, loom_dist_stats *out) {
    *out = d ? d->stats : (loom_dist_stats){0};
}

static loom__dist_dev *dev_of(loom_dev_t dev) {
    return dev->context;
}

/* ---------------------------------------------------------------- buffers */

typedef struct dist_buffer {
    loom__dist_dev *dd;
    loom_buffer_t inner; /* local only */
    /* remote only: an address range reserved with no access (PROT_NONE, no memory behind
     * it), so its tensors' addresses are unique and a stray access faults */
    void *reserve, *base;
    size_t reserve_size;
} dist_buffer;

static const struct loom_buffer_i dist_buffer_i;

/* Presenting tensors to the inner device. A meta device as the inner device (hybrid: tensor
 * parallelism over a rank's local devices inside a pipeline stage) finds a tensor's slices
 * and its split state through t->buffer: a weight in a buffer that is not the meta
 * device's is taken for a whole copy (MIRRORED), and its slices cannot be found at all. So
 * every call into the inner device sees the tensor (and its storage owner) in the inner
 * buffer, and the dist buffer again after. Static questions (supports_op, alloc sizes)
 * about tensors of any dist buffer, local or remote, see them in a proxy buffer of the
 * inner device's type (same answer on every rank: only the buffer type matters there). */
typedef struct inner_view {
    loom_tensor **t;
    loom_buffer_t *was;
    int n, cap;
    const loom_tensor **seen; /* open addressing: the ancestors already walked */
    size_t seen_cap, n_seen;
    const loom_tensor **stack;
    size_t n_stack, stack_cap;
} inner_view;

static bool inner_is_meta(const loom__dist_dev *dd) {
    return loom_dev_get_type(dd->inner) == LOOM_DEV_TYPE_META;
}

static loom_buffer_t proxy_of(loom__dist_dev *dd) {
    if (!dd->proxy) dd->proxy = loom_buft_alloc_buffer(loom_dev_buffer_type(dd->inner), 0);
    return dd->proxy;
}

/* Points t at the inner buffer of its dist buffer (a remote one, with `proxy`: at the
 * proxy of a meta inner device); recorded in v. */
static bool view_tensor(inner_view *v, loom_tensor *t, bool proxy) {
    if (!t->buffer || t->buffer->iface != &dist_buffer_i) return true;
    dist_buffer *b = t->buffer->context;
    loom_buffer_t to = b->inner ? b->inner : proxy && inner_is_meta(b->dd) ? proxy_of(b->dd) : NULL;
    if (!to) return true;
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 64;
        loom_tensor **nt = loom_realloc(v->t, (size_t)cap * sizeof *nt);
        if (nt) v->t = nt;
        loom_buffer_t *nw = nt ? loom_realloc(v->was, (size_t)cap * sizeof *nw) : NULL;
        if (!nw) return false;
        v->was = nw;
        v->cap = cap;
    }
    v->t[v->n] = t;
    v->was[v->n++] = t->buffer;
    t->buffer = to;
    return true;
}

/* Whether t was seen before (else it is added); false with *oom when the set cannot grow. */
static bool seen_before(inner_view *v, const loom_tensor *t, bool *oom) {
    if (2 * (v->n_seen + 1) > v->seen_cap) {
        size_t cap = v->seen_cap ? 2 * v->seen_cap : 256;
        const loom_tensor **ns = loom_calloc(cap, sizeof *ns);
        if (!ns) {
            *oom = true;
            return false;
        }
        for (size_t i = 0; i < v->seen_cap; i++) {
            if (!v->seen[i]) continue;
            size_t h = ((uintptr_t)v->seen[i] >> 4) & (cap - 1);
            while (ns[h])
                h = (h + 1) & (cap - 1);
            ns[h] = v->seen[i];
        }
        loom_free(v->seen);
        v->seen = ns;
        v->seen_cap = cap;
    }
    size_t h = ((uintptr_t)t >> 4) & (v->seen_cap - 1);
    while (v->seen[h]) {
        if (v->seen[h] == t) return true;
        h = (h + 1) & (v->seen_cap - 1);
    }
    v->seen[h] = t;
    v->n_seen++;
    return false;
}

static bool push(inner_view *v, const loom_tensor *t) {
    if (v->n_stack == v->stack_cap) {
        size_t cap = v->stack_cap ? 2 * v->stack_cap : 64;
        const loom_tensor **ns = loom_realloc(v->stack, cap * sizeof *ns);
        if (!ns) return false;
        v->stack = ns;
        v->stack_cap = cap;
    }
    v->stack[v->n_stack++] = t;
    return true;
}

/* A meta inner device derives a computed tensor's split state from its sources, down to
 * the weights: t and every ancestor are shown in meta buffers (local ones in their inner
 * buffer, remote ones in the proxy). */
static bool view_deep(inner_view *v, const loom_tensor *t0) {
    bool oom = false;
    if (!push(v, t0)) return false;
    while (v->n_stack > 0) {
        loom_tensor *t = (loom_tensor *)v->stack[--v->n_stack];
        if (seen_before(v, t, &oom) || oom) {
            if (oom) return false;
            continue;
        }
        if (!view_tensor(v, t, true)) return false;
        if (t->view_src && !push(v, t->view_src)) return false;
        for (int k = 0; k < LOOM_MAX_SRC; k++)
            if (t->src[k] && !push(v, t->src[k])) return false;
    }
    return true;
}

/* Before a data call (set, get, memset, init) into the inner device about t of dist
 * device dd: a meta inner device sees t and its ancestors in meta buffers; any other
 * sees t and its storage owner in its own buffer. false: out of host memory. */
static bool view_data(inner_view *v, const loom__dist_dev *dd, const loom_tensor *t) {
    if (inner_is_meta(dd)) return view_deep(v, t);
    loom_tensor *m = (loom_tensor *)t;
    return view_tensor(v, m, false) && (!m->view_src || view_tensor(v, m->view_src, false));
}

/* Before a static question (supports_op, alloc size) about op to a meta inner device. */
static bool view_static(inner_view *v, const loom__dist_dev *dd, const loom_tensor *op) {
    return !inner_is_meta(dd) || view_deep(v, op);
}

static void unview(inner_view *v) {
    for (int i = v->n - 1; i >= 0; i--)
        v->t[i]->buffer = v->was[i];
    loom_free(v->t);
    loom_free(v->was);
    loom_free(v->seen);
    loom_free(v->stack);
    *v = (inner_view){0};
}

/* The failure of a view (out of host memory): logged, the call goes ahead unviewed. */
#define VIEW_DATA(v, dd, t)                                                                        \
    do {                                                                                           \
        if (!view_data(v, dd, t)) LOOM_LOG_ERROR("%s: out of host memory", (dd)->name);            \
    } while (0)

static void db_free(loom_buffer_t buf) {
    dist_buffer *b = buf->context;
    if (b->reserve) munmap(b->reserve, b->reserve_size);
    loom_buffer_free(b->inner);
    loom_free(b);
}

/* A remote buffer has no memory: its base is the start of its reserved range (its tensors'
 * data pointers serve the meta device's bookkeeping only). */
static void *db_base(loom_buffer_t buf) {
    dist_buffer *b = buf->context;
    return b->inner ? loom_buffer_base(b->inner) : b->base;
}

static loom_status db_init_tensor(loom_buffer_t buf, loom_tensor *t) {
    dist_buffer *b = buf->context;
    if (!b->inner || !b->inner->iface->init_tensor) return LOOM_OK;
    inner_view v = {0};
    VIEW_DATA(&v, b->dd, t);
    loom_status st = b->inner->iface->init_tensor(b->inner, t);
    unview(&v);
    return st;
}

static void db_memset(loom_buffer_t buf, loom_tensor *t, uint8_t v, size_t off, size_t size) {
    dist_buffer *b = buf->context;
    if (!b->inner) return;
    inner_view iv = {0};
    VIEW_DATA(&iv, b->dd, t);
    b->inner->iface->memset_tensor(b->inner, t, v, off, size);
    unview(&iv);
}

static void db_set(loom_buffer_t buf, loom_tensor *t, const void *data, size_t off, size_t size) {
    dist_buffer *b = buf->context;
    if (!b->inner) return;
    inner_view v = {0};
    VIEW_DATA(&v, b->dd, t);
    b->inner->iface->set_tensor(b->inner, t, data, off, size);
    unview(&v);
}

/* Collective: the owner reads its memory and broadcasts it; every other rank receives. A
 * broken transport ends every rank (MPI's fatal handler), so there is no silent zero. */
static void db_get(loom_buffer_t buf, const loom_tensor *t, void *data, size_t off, size_t size) {
    dist_buffer *b = buf->context;
    if (b->inner) {
        inner_view v = {0};
        VIEW_DATA(&v, b->dd, t);
        b->inner->iface->get_tensor(b->inner, t, data, off, size);
        unview(&v);
    }
    if (b->dd->d->size > 1 && loom_dist_bcast(b->dd->d, data, size, b->dd->index) != LOOM_OK)
        LOOM_LOG_ERROR("%s: %s", b->dd->name, loom_last_error());
}

static void db_clear(loom_buffer_t buf, uint8_t v) {
    dist_buffer *b = buf->context;
    if (b->inner) b->inner->iface->clear(b->inner, v);
}

static void db_reset(loom_buffer_t buf) {
    dist_buffer *b = buf->context;
    if (b->inner && b->inner->iface->reset) b->inner->iface->reset(b->inner);
}

/* ---------------------------------------------------------------- rank communicator */

/* A failure of the rank communicator: kept (the first) until the next compute or
 * synchronize of a dist backend reports it, since the hooks that meet it (a copy, the
 * reducer's communicator) cannot fail the graph themselves. */
static void rank_comm_fail(loom_dist *d, loom_status st, const char *msg) {
    if (d->rc_status != LOOM_OK) return;
    d->rc_status = st ? st : LOOM_ERR_DEVICE;
    snprintf(d->rc_msg, sizeof d->rc_msg, "%s", msg);
    LOOM_LOG_ERROR("dist: rank %d: %s", d->rank, d->rc_msg);
}

/* Point-to-point through the rank communicator: the source's rank sends its device memory,
 * the destination's receives into its own; every other rank does nothing. */
static void rank_comm_p2p(loom_dist *d, void *data, size_t n, int from, int to) {
    if (d->rc_status != LOOM_OK || n == 0 || from == to) return;
    char err[512] = "";
    loom_status st;
    if (d->rank == from) {
        d->stats.rank_comm_sends++;
        st = d->rc_api->send(d->rc, data, n, to, err, sizeof err);
    } else {
        d->stats.rank_comm_recvs++;
        st = d->rc_api->recv(d->rc, data, n, from, err, sizeof err);
    }
    if (st) rank_comm_fail(d, st, err);
}

/* Collective over the rank communicator: the counts are checked first (LOOM_DIST_CHECK,
 * rank 0's, on by default): ranks summing different counts would hang or sum garbage in
 * NCCL, so every rank learns every count and all fail together, naming the ranks. */
static void rank_comm_allreduce(loom_dist *d, loom_tensor *t, size_t ne) {
    if (d->rc_status != LOOM_OK) return;
    if (d->check_counts) {
        int64_t mine[2] = {(int64_t)ne, (int64_t)t->type}, all[2 * LOOM_DIST_MAX_RANKS];
        loom_status st = loom__dist_allgather(d, mine, all, sizeof mine);
        if (st) {
            rank_comm_fail(d, st, loom_last_error());
            return;
        }
        for (int r = 1; r < d->size; r++) {
            if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
            char msg[400];
            snprintf(msg, sizeof msg,
                     "the ranks disagree on an AllReduce ('%s'): rank 0 sums %lld values of %s, "
                     "rank %d %lld values of %s",
                     t->name, (long long)all[0], loom_type_name((loom_type)all[1]), r,
                     (long long)all[2 * r], loom_type_name((loom_type)all[2 * r + 1]));
            rank_comm_fail(d, LOOM_ERR_SHAPE, msg);
            return;
        }
    }
    char err[512] = "";
    d->stats.rank_comm_allreduces++;
    loom_status st = d->rc_api->allreduce_f32(d->rc, t->data, ne, err, sizeof err);
    if (st) rank_comm_fail(d, st, err);
}

/* A copy between two dist buffers (a pipeline stage's activations crossing ranks): the
 * source's rank sends, the destination's rank receives (MPI point-to-point), every other
 * rank does nothing; on one rank it is a local copy through host memory. A source outside
 * the dist buffers is declined (the wrapper writes it from host memory; every rank has it). */
static bool db_cpy(loom_buffer_t buf, const loom_tensor *src, loom_tensor *dst) {
    dist_buffer *db = buf->context;
    if (!src->buffer || src->buffer->iface != &dist_buffer_i) return false;
    dist_buffer *sb = src->buffer->context;
    loom_dist *d = db->dd->d;
    int from = sb->dd->index, to = db->dd->index;
    if (d->rank != from && d->rank != to) return true;
    size_t n = loom_nbytes(src);
    if (d->path == LOOM__DIST_PATH_RANK) {
        rank_comm_p2p(d, d->rank == from ? src->data : dst->data, n, from, to);
        return true;
    }
    void *tmp = loom_malloc(n ? n : 1);
    if (!tmp) return false; /* the wrapper's staged path reports it */
    inner_view v = {0};
    if (d->rank == from) {
        VIEW_DATA(&v, sb->dd, src);
        sb->inner->iface->get_tensor(sb->inner, src, tmp, 0, n);
        unview(&v);
    }
    if (loom__dist_send_recv(d, tmp, n, from, to) != LOOM_OK)
        LOOM_LOG_ERROR("%s: %s", db->dd->name, loom_last_error());
    if (d->rank == to) {
        VIEW_DATA(&v, db->dd, dst);
        db->inner->iface->set_tensor(db->inner, dst, tmp, 0, n);
        unview(&v);
    }
    loom_free(tmp);
    return true;
}

static const struct loom_buffer_i dist_buffer_i = {
    .free_buffer = db_free,
    .get_base = db_base,
    .init_tensor = db_init_tensor,
    .memset_tensor = db_memset,
    .set_tensor = db_set,
    .get_tensor = db_get,
    .cpy_tensor = db_cpy,
    .clear = db_clear,
    .reset = db_reset,
};

/* ---------------------------------------------------------------- buffer type */

static loom_buft_t inner_buft(const loom__dist_dev *dd) {
    return loom_dev_buffer_type(dd->inner);
}

static const char *dbt_name(loom_buft_t buft) {
    return dev_of(buft->device)->name;
}

static loom_buffer_t dbt_alloc(loom_buft_t buft, size_t size) {
    loom__dist_dev *dd = dev_of(buft->device);
    dist_buffer *b = loom_calloc(1, sizeof *b);
    if (!b) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory", dd->name);
        return NULL;
    }
    b->dd = dd;
    if (dd->remote) {
        size_t align = loom_buft_alignment(inner_buft(dd));
        b->reserve_size = (size ? size : 1) + align;
        b->reserve = mmap(NULL, b->reserve_size, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b->reserve == MAP_FAILED) {
            loom_error(LOOM_ERR_NOMEM,
                       "%s: cannot reserve %zu bytes of address space for "
                       "another rank's buffer",
                       dd->name, b->reserve_size);
            loom_free(b);
            return NULL;
        }
        uintptr_t p = (uintptr_t)b->reserve;
        b->base = (void *)((p + align - 1) / align * align);
    } else {
        b->inner = loom_buft_alloc_buffer(inner_buft(dd), size);
        if (!b->inner) {
            loom_error(loom_last_status(), "%s: %s", dd->name, loom_last_error());
            loom_free(b);
            return NULL;
        }
    }
    loom_buffer_t buf = loom_buffer_init(buft, &dist_buffer_i, b, size);
    if (!buf) {
        if (b->reserve) munmap(b->reserve, b->reserve_size);
        loom_buffer_free(b->inner);
        loom_free(b);
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory", dd->name);
    }
    return buf;
}

static size_t dbt_alignment(loom_buft_t buft) {
    return loom_buft_alignment(inner_buft(dev_of(buft->device)));
}

static size_t dbt_max_size(loom_buft_t buft) {
    return loom_buft_max_size(inner_buft(dev_of(buft->device)));
}

static size_t dbt_alloc_size(loom_buft_t buft, const loom_tensor *t) {
    inner_view v = {0};
    (void)view_static(&v, dev_of(buft->device), t); /* unviewed: a larger size, still safe */
    size_t n = loom_buft_alloc_size(inner_buft(dev_of(buft->device)), t);
    unview(&v);
    return n;
}

/* Not host memory, even when the local device's is: a reader must go through get_tensor
 * (a remote member's memory is on another rank). */
static const struct loom_buft_i dist_buft_i = {
    .get_name = dbt_name,
    .alloc_buffer = dbt_alloc,
    .get_alignment = dbt_alignment,
    .get_max_size = dbt_max_size,
    .get_alloc_size = dbt_alloc_size,
};

/* ---------------------------------------------------------------- backends */

typedef struct dist_backend {
    loom__dist_dev *dd;
    loom_backend_t inner; /* local only */
    char name[16];
    loom_status sync_status; /* the inner backend's, from the last synchronize */
    char sync_msg[640];
} dist_backend;

static const char *dbe_name(loom_backend_t be) {
    return ((dist_backend *)be->context)->name;
}

static void dbe_free(loom_backend_t be) {
    dist_backend *b = be->context;
    loom_backend_free(b->inner);
    loom_free(b);
    loom_free(be);
}

static void dbe_synchronize(loom_backend_t be) {
    dist_backend *b = be->context;
    if (!b->inner) return;
    loom_status st = loom_backend_synchronize(b->inner);
    if (st && b->sync_status == LOOM_OK) {
        b->sync_status = st;
        snprintf(b->sync_msg, sizeof b->sync_msg, "%s", loom_last_error());
    }
}

/* A failure of the rank communicator (every later call reports it: the ranks are no longer
 * in step), else the inner backend's asynchronous failure seen by the last synchronize. */
static loom_status dbe_get_status(loom_backend_t be) {
    dist_backend *b = be->context;
    loom_dist *d = b->dd->d;
    if (d->rc_status) return loom_error(d->rc_status, "%s: %s", b->name, d->rc_msg);
    loom_status st = b->sync_status;
    b->sync_status = LOOM_OK;
    return st ? loom_error(st, "%s: %s", b->name, b->sync_msg) : LOOM_OK;
}

/* The tensors of a graph whose buffer is a local dist buffer, pointed at its inner buffer
 * for the inner backend (a sim device reads only its own buffers) and restored after: the
 * meta device reads them through the dist buffer again (the broadcast). */
typedef struct swap_list {
    loom_tensor **t;
    loom_buffer_t *was;
    int n, cap;
} swap_list;

static bool swap_one(swap_list *l, loom_tensor *t) {
    if (!t || !t->buffer || t->buffer->iface != &dist_buffer_i) return true;
    dist_buffer *db = t->buffer->context;
    if (!db->inner) return true;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        loom_tensor **nt = loom_realloc(l->t, (size_t)cap * sizeof *nt);
        if (nt) l->t = nt;
        loom_buffer_t *nw = nt ? loom_realloc(l->was, (size_t)cap * sizeof *nw) : NULL;
        if (!nw) return false;
        l->was = nw;
        l->cap = cap;
    }
    l->t[l->n] = t;
    l->was[l->n++] = t->buffer;
    t->buffer = db->inner;
    return true;
}

static bool swap_in(swap_list *l, loom_graph *g) {
    bool ok = true;
    for (int i = 0; i < g->n_leafs && ok; i++)
        ok = swap_one(l, g->leafs[i]);
    for (int i = 0; i < g->n_nodes && ok; i++) {
        loom_tensor *t = g->nodes[i];
        ok = swap_one(l, t) && swap_one(l, t->view_src);
        for (int k = 0; k < LOOM_MAX_SRC && ok && t->src[k]; k++)
            ok = swap_one(l, t->src[k]) && swap_one(l, t->src[k]->view_src);
    }
    return ok;
}

static void swap_out(swap_list *l) {
    for (int i = l->n - 1; i >= 0; i--)
        l->t[i]->buffer = l->was[i];
    loom_free(l->t);
    loom_free(l->was);
}

static loom_status dbe_compute(loom_backend_t be, loom_graph *g) {
    dist_backend *b = be->context;
    loom_dist *d = b->dd->d;
    if (d->rc_status) return loom_error(d->rc_status, "%s: %s", b->name, d->rc_msg);
    if (!b->inner) return LOOM_OK; /* another rank computes it */
    swap_list l = {0};
    loom_status st =
        swap_in(&l, g) ? LOOM_OK : loom_error(LOOM_ERR_NOMEM, "%s: out of host memory", b->name);
    if (st == LOOM_OK) { /* synchronous: the headers are restored only after the work */
        st = loom_backend_graph_compute(b->inner, g);
        if (st) loom_error(st, "%s: %s", b->name, loom_last_error());
    }
    swap_out(&l);
    return st;
}

static void dbe_optimize(loom_backend_t be, loom_graph *g) {
    dist_backend *b = be->context;
    if (b->inner) loom_backend_graph_optimize(b->inner, g);
}

static const struct loom_backend_i dist_backend_i = {
    .get_name = dbe_name,
    .free = dbe_free,
    .synchronize = dbe_synchronize,
    .graph_compute = dbe_compute,
    .graph_optimize = dbe_optimize,
    .get_status = dbe_get_status,
};

loom_backend_t loom_dist_backend_local(loom_backend_t be) {
    if (!be || be->iface != &dist_backend_i) return NULL;
    return ((dist_backend *)be->context)->inner;
}

/* ---------------------------------------------------------------- devices */

static const char *dd_name(loom_dev_t dev) {
    return dev_of(dev)->name;
}
static const char *dd_desc(loom_dev_t dev) {
    return dev_of(dev)->desc;
}

static void dd_memory(loom_dev_t dev, size_t *free, size_t *total) {
    loom_dev_memory(dev_of(dev)->inner, free, total);
}

/* A rank's CPU is not this process's host (the scheduler's fallback and the memory report
 * treat CPU-type devices as the local host): it computes on host memory, an ACCEL. */
static loom_dev_type dd_type(loom_dev_t dev) {
    loom_dev_type t = loom_dev_get_type(dev_of(dev)->inner);
    return t == LOOM_DEV_TYPE_CPU ? LOOM_DEV_TYPE_ACCEL : t;
}

static void dd_props(loom_dev_t dev, loom_dev_props *p) {
    memset(p, 0, sizeof *p);
    p->name = dd_name(dev);
    p->description = dd_desc(dev);
    dd_memory(dev, &p->memory_free, &p->memory_total);
    p->type = dd_type(dev);
}

static loom_backend_t dd_init_backend(loom_dev_t dev, const char *params) {
    loom__dist_dev *dd = dev_of(dev);
    dist_backend *b = loom_calloc(1, sizeof *b);
    loom_backend_t be = loom_calloc(1, sizeof *be);
    if (!b || !be) {
        loom_free(b);
        loom_free(be);
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory", dd->name);
        return NULL;
    }
    b->dd = dd;
    snprintf(b->name, sizeof b->name, "%s", dd->name);
    if (!dd->remote) {
        b->inner = loom_dev_init(dd->inner, params);
        if (!b->inner) {
            loom_error(loom_last_status(), "%s: %s", dd->name, loom_last_error());
            loom_free(b);
            loom_free(be);
            return NULL;
        }
        if (dd->n_threads > 0 && loom_backend_is_cpu(b->inner))
            loom_cpu_backend_set_n_threads(b->inner, dd->n_threads);
    }
    *be = (struct loom_backend){.iface = &dist_backend_i, .device = dev, .context = b};
    return be;
}

static loom_buft_t dd_buft(loom_dev_t dev) {
    return &dev_of(dev)->buft;
}

static bool dd_supports_op(loom_dev_t dev, const loom_tensor *op) {
    inner_view v = {0};
    if (!view_static(&v, dev_of(dev), op)) {
        unview(&v);
        return false;
    }
    bool ok = loom_dev_supports_op(dev_of(dev)->inner, op);
    unview(&v);
    return ok;
}

static bool dd_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    return buft == &dev_of(dev)->buft;
}

static bool dd_offload_op(loom_dev_t dev, const loom_tensor *op) {
    inner_view v = {0};
    if (!view_static(&v, dev_of(dev), op)) {
        unview(&v);
        return false;
    }
    bool ok = loom_dev_offload_op(dev_of(dev)->inner, op);
    unview(&v);
    return ok;
}

static const struct loom_dev_i dist_dev_i = {
    .get_name = dd_name,
    .get_description = dd_desc,
    .get_memory = dd_memory,
    .get_type = dd_type,
    .get_props = dd_props,
    .init_backend = dd_init_backend,
    .get_buffer_type = dd_buft,
    .supports_op = dd_supports_op,
    .supports_buft = dd_supports_buft,
    .offload_op = dd_offload_op,
};

/* ---------------------------------------------------------------- communicator */

/* A communicator over the N dist devices of one loom_dist, in rank order. */
static void *dist_comm_init(loom_backend_t *backends, size_t n) {
    loom_dist *d = NULL;
    for (size_t j = 0; j < n; j++) {
        loom_dev_t dev = loom_backend_device(backends[j]);
        if (!loom_dev_is_dist(dev)) return NULL;
        loom__dist_dev *dd = dev_of(dev);
        if ((d && dd->d != d) || dd->index != (int)j) return NULL;
        d = dd->d;
    }
    return d && (int)n == d->size ? d : NULL;
}

/* Sums this rank's slice with every other rank's (F32, contiguous; anything else is
 * declined and the ladder continues, which for remote members would be wrong: the meta
 * device only reduces contiguous F32 partial sums, so it does not happen). */
static bool dist_comm_allreduce(void *comm, loom_tensor *const *tensors, size_t n) {
    loom_dist *d = comm;
    loom_tensor *t = tensors[d->rank];
    if ((int)n != d->size || t->type != LOOM_TYPE_F32 || !loom_is_contiguous(t)) return false;
    size_t ne = (size_t)loom_nelements(t);
    if (ne == 0) return true;
    dist_buffer *b = t->buffer ? t->buffer->context : NULL;
    loom_buffer_t inner = b ? b->inner : NULL;
    if (d->path == LOOM__DIST_PATH_RANK) { /* device memory, in place */
        rank_comm_allreduce(d, t, ne);
        return true; /* a failure is reported by the next compute (rank_comm_fail) */
    }
    loom_status st;
    if (inner && loom_buffer_is_host(inner)) {
        st = loom__dist_allreduce_f32(d, t->data, ne);
    } else {
        float *tmp = loom_malloc(ne * sizeof *tmp);
        if (!tmp) return false;
        if (inner) inner->iface->get_tensor(inner, t, tmp, 0, ne * sizeof *tmp);
        st = loom__dist_allreduce_f32(d, tmp, ne);
        if (inner) inner->iface->set_tensor(inner, t, tmp, 0, ne * sizeof *tmp);
        loom_free(tmp);
    }
    if (st) LOOM_LOG_ERROR("dist: %s", loom_last_error());
    return true;
}

static void dist_comm_free(void *comm) {
    (void)comm; /* the loom_dist owns the transport */
}

/* ---------------------------------------------------------------- reg */

static const char *dr_name(loom_reg_t reg) {
    (void)reg;
    return "MPI";
}

static size_t dr_count(loom_reg_t reg) {
    return (size_t)((loom_dist *)reg->context)->n_devs;
}

static loom_dev_t dr_device(loom_reg_t reg, size_t i) {
    loom_dist *d = reg->context;
    return i < (size_t)d->n_devs ? &d->devs[i].dev : NULL;
}

static void *dr_proc(loom_reg_t reg, const char *name) {
    (void)reg;
    if (!strcmp(name, LOOM_PROC_COMM_INIT)) return (void *)dist_comm_init;
    if (!strcmp(name, LOOM_PROC_COMM_ALLREDUCE)) return (void *)dist_comm_allreduce;
    if (!strcmp(name, LOOM_PROC_COMM_FREE)) return (void *)dist_comm_free;
    return NULL;
}

static const struct loom_reg_i dist_reg_i = {
    .get_name = dr_name,
    .get_device_count = dr_count,
    .get_device = dr_device,
    .get_proc_address = dr_proc,
};

void loom__dist_devices_free(loom_dist *d) {
    if (d->rc && d->rc_api && d->rc_api->free) d->rc_api->free(d->rc);
    d->rc = NULL;
    for (int j = 0; j < d->n_devs; j++) {
        loom_buffer_free(d->devs[j].proxy);
        d->devs[j].proxy = NULL;
    }
}

bool loom_dev_is_dist(loom_dev_t dev) {
    return dev && dev->iface == &dist_dev_i;
}
bool loom_dev_is_remote(loom_dev_t dev) {
    return loom_dev_is_dist(dev) && dev_of(dev)->remote;
}

loom_status loom_dist_devices(loom_dist *d, loom_dev_t local, int n_threads, loom_dev_t *out,
                              int cap, int *n_out) {
    *n_out = 0;
    if (!d || !local) return loom_error(LOOM_ERR_INVALID_ARG, "loom_dist_devices: NULL argument");
    if (d->n_devs) return loom_error(LOOM_ERR_INVALID_ARG, "loom_dist_devices: called twice");
    if (loom_dev_is_dist(local))
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: the local device %s must be a real device",
                          loom_dev_name(local));
    if (d->size > LOOM_DIST_MAX_RANKS || d->size > cap)
        return loom_error(LOOM_ERR_INVALID_ARG, "dist: %d ranks (at most %d)", d->size,
                          LOOM_DIST_MAX_RANKS < cap ? LOOM_DIST_MAX_RANKS : cap);
    d->reg = (struct loom_reg){
        .api_version = LOOM_BACKEND_API_VERSION, .iface = &dist_reg_i, .context = d};
    for (int j = 0; j < d->size; j++) {
        loom__dist_dev *dd = &d->devs[j];
        *dd = (loom__dist_dev){
            .d = d, .index = j, .remote = j != d->rank, .inner = local, .n_threads = n_threads};
        snprintf(dd->name, sizeof dd->name, "MPI%d", j);
        if (dd->remote)
            snprintf(dd->desc, sizeof dd->desc, "rank %d of %d (remote)", j, d->size);
        else
            snprintf(dd->desc, sizeof dd->desc, "rank %d of %d: %s", j, d->size,
                     loom_dev_name(local));
        dd->dev = (struct loom_dev){.iface = &dist_dev_i, .reg = &d->reg, .context = dd};
        dd->buft = (struct loom_buft){.iface = &dist_buft_i, .device = &dd->dev, .context = dd};
        out[j] = &dd->dev;
    }
    d->n_devs = d->size;
    *n_out = d->size;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- rank communicator setup */

void loom_dist_set_rank_comm(loom_dist *d, const loom_rank_comm_iface *api) {
    if (!d) return;
    d->rc_api = api;
    d->rc_injected = api != NULL;
}

static const loom_rank_comm_iface *rank_comm_of(loom_dev_t local, char *why, size_t cap) {
    loom_reg_t reg = loom_dev_reg(local);
    void *p = reg ? loom_reg_get_proc_address(reg, LOOM_PROC_RANK_COMM) : NULL;
    if (!p) {
        snprintf(why, cap, "%s (reg %s) has no communicator between ranks", loom_dev_name(local),
                 reg ? loom_reg_name(reg) : "?");
        return NULL;
    }
    loom_rank_comm_get_fn get;
    memcpy(&get, &p, sizeof get);
    const loom_rank_comm_iface *api = get();
    if (!api)
        snprintf(why, cap, "%s: its communicator between ranks is unavailable",
                 loom_dev_name(local));
    return api;
}

/* The mode of LOOM_DIST_NCCL: 0 never (host memory and MPI), 1 required, else automatic. */
enum { RC_OFF, RC_AUTO, RC_REQUIRED };

static loom_status use_host_path(loom_dist *d) {
    d->path = LOOM__DIST_PATH_HOST;
    snprintf(d->path_desc, sizeof d->path_desc, "MPI through host memory");
    LOOM_LOG_INFO("dist: rank %d: %s (%s)", d->rank, d->path_desc, d->path_why);
    return LOOM_OK;
}

/* The id or init failed on some rank (every rank agreed, so every rank is here; the
 * message, loom_last_error, names the rank): an error when LOOM_DIST_NCCL=1, else the
 * host path on every rank, saying why. */
static loom_status setup_failed(loom_dist *d, loom_status st, const loom_rank_comm_iface *api,
                                int mode) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    if (mode == RC_REQUIRED)
        return loom_error(st, "dist: %s across %d ranks: %s", api->name, d->size, msg);
    snprintf(d->path_why, sizeof d->path_why, "%s across %d ranks failed, so not used: %s",
             api->name, d->size, msg);
    if (d->rank == 0) LOOM_LOG_WARN("dist: %s; MPI through host memory instead", d->path_why);
    return use_host_path(d);
}

loom_status loom_dist_comm_setup(loom_dist *d) {
    if (!d) return loom_error(LOOM_ERR_INVALID_ARG, "loom_dist_comm_setup: NULL dist");
    if (d->path != LOOM__DIST_PATH_UNSET) return LOOM_OK; /* every rank set up already */
    if (!d->n_devs)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "loom_dist_comm_setup: no dist devices yet (loom_dist_devices first)");
    loom_dev_t local = d->devs[d->rank].inner;
    /* rank 0's settings lead, so the ranks cannot disagree on them */
    const char *env = getenv("LOOM_DIST_NCCL"), *chk = getenv("LOOM_DIST_CHECK");
    struct {
        int64_t mode, check, id_size;
        char name[64];
    } lead = {!env || !env[0]     ? RC_AUTO
              : !strcmp(env, "0") ? RC_OFF
              : !strcmp(env, "1") ? RC_REQUIRED
                                  : RC_AUTO,
              !(chk && !strcmp(chk, "0")), 0, ""};
    if (env && env[0] && strcmp(env, "0") && strcmp(env, "1") && d->rank == 0)
        LOOM_LOG_WARN("dist: LOOM_DIST_NCCL='%s' is not 0 or 1; automatic choice", env);
    char why[512] = "";
    const loom_rank_comm_iface *api = NULL;
    if (d->rc_injected) {
        api = d->rc_api;
    } else {
        api = rank_comm_of(local, why, sizeof why);
        d->rc_api = api;
    }
    if (api) {
        lead.id_size = (int64_t)api->id_size;
        snprintf(lead.name, sizeof lead.name, "%s", api->name);
    }
    loom_status st = loom_dist_bcast(d, &lead, sizeof lead, 0);
    if (st) return st;
    lead.name[sizeof lead.name - 1] = 0;
    const int mode = (int)lead.mode;
    d->check_counts = lead.check != 0;

    /* 1. may every rank join? (no rank enters an init that another skips) */
    if (mode == RC_OFF) {
        snprintf(d->path_why, sizeof d->path_why,
                 "LOOM_DIST_NCCL=0 (rank 0's) forces the host path");
    } else {
        if (!api) {
            /* why says it (rank_comm_of) */
        } else if (api->id_size == 0 || api->id_size > LOOM_RANK_COMM_ID_MAX ||
                   (int64_t)api->id_size != lead.id_size) {
            snprintf(why, sizeof why, "%s: a bootstrap id of %zu bytes (rank 0's: %lld)", api->name,
                     api->id_size, (long long)lead.id_size);
        } else if (strncmp(api->name, lead.name, sizeof lead.name - 1) != 0) {
            snprintf(why, sizeof why, "%s here, %s on rank 0: every rank needs the same library",
                     api->name, lead.name);
        } else if (!api->usable(local, why, sizeof why)) {
            if (!why[0])
                snprintf(why, sizeof why, "%s cannot use %s", api->name, loom_dev_name(local));
        } else {
            why[0] = 0;
        }
        st = why[0] ? loom_error(LOOM_ERR_UNSUPPORTED, "%s", why) : LOOM_OK;
        st = loom_dist_agree(d, st);
        if (st != LOOM_OK) {
            snprintf(d->path_why, sizeof d->path_why, "%s", loom_last_error());
            if (mode == RC_REQUIRED)
                return loom_error(LOOM_ERR_UNSUPPORTED,
                                  "dist: LOOM_DIST_NCCL=1 but no communicator between ranks: %s",
                                  d->path_why);
        }
    }
    if (mode == RC_OFF || st != LOOM_OK) return use_host_path(d);

    /* 2. rank 0 makes the id; 3. every rank gets it; 4. every rank joins */
    unsigned char id[LOOM_RANK_COMM_ID_MAX] = {0};
    char err[512] = "";
    st = d->rank == 0 ? api->get_id(id, err, sizeof err) : LOOM_OK;
    if (st) loom_error(st, "%s", err);
    st = loom_dist_agree(d, st);
    if (st) return setup_failed(d, st, api, mode);
    st = loom_dist_bcast(d, id, api->id_size, 0); /* MPI itself: no path without it */
    if (st)
        return loom_error(st, "dist: %s across %d ranks: %s", api->name, d->size,
                          loom_last_error());
    void *rc = NULL;
    err[0] = 0;
    st = api->init(local, d->size, d->rank, id, &rc, err, sizeof err);
    if (st) loom_error(st, "%s", err);
    st = loom_dist_agree(d, st);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        if (rc && api->free) api->free(rc);
        loom_error(st, "%s", msg);
        return setup_failed(d, st, api, mode);
    }
    d->rc = rc;
    d->path = LOOM__DIST_PATH_RANK;
    snprintf(d->path_desc, sizeof d->path_desc, "%s across %d ranks", api->name, d->size);
    LOOM_LOG_INFO("dist: rank %d: %s on %s", d->rank, d->path_desc, loom_dev_name(local));
    return LOOM_OK;
}

const char *loom_dist_comm_describe(const loom_dist *d, const char **why) {
    if (why) *why = d && d->path == LOOM__DIST_PATH_HOST ? d->path_why : "";
    if (!d) return "none (one process)";
    if (d->path == LOOM__DIST_PATH_UNSET) return "MPI through host memory (not set up)";
    return d->path_desc;
}

bool loom_dist_uses_rank_comm(const loom_dist *d) {
    return d && d->path == LOOM__DIST_PATH_RANK;
}
