/*
 * Ring and butterfly plans, and the step executor that issues them on the devices.
 *
 * A plan binds its own tensor headers to the caller's memory (a 1-d F32 header placed at
 * the caller's tensor's address in its buffer, so the plan depends only on addresses and
 * can be reused by any tensor at the same place) and to the reducer's device scratch. The
 * adds are one-node graphs whose ADD result is a view of its first source (in place:
 * x += received), issued with loom_backend_graph_compute_async on the device that owns x.
 *
 * Ring (N devices, chunks c = 0..N-1 of n/N elements, the first n%N one larger):
 *   reduce-scatter step k = 0..N-2: device j sends chunk (j-k) mod N to j+1, which adds it
 *   into its own chunk; afterwards device j holds the full sum of chunk (j+1) mod N.
 *   all-gather step k = 0..N-2: device j sends chunk (j+1-k) mod N to j+1, straight into
 *   its tensor. Each device moves 2(N-1)/N of the tensor; one chunk of scratch per device.
 * Butterfly (P = largest power of two <= N, E = N - P excess devices):
 *   fold: device P+i sends its tensor to device i, which adds it;
 *   step s = P/2, P/4, .., 1: device j < P receives j^s's tensor and adds it;
 *   copy back: device i sends the sum to P+i.
 *   Every step receives into its own scratch slot, so no copy can alias another.
 */
#include <string.h>

#include "reduce/reduce-impl.h"

static size_t rd_align(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

/* ---------------------------------------------------------------- scratch */

/* Grows device scratch to at least need[j] bytes. Growing frees every cached plan (they
 * point into the old scratch) after waiting for the devices. */
static loom_status rd_scratch_reserve(loom_reducer *r, const size_t *need) {
    bool grow = false;
    for (int j = 0; j < r->n; j++)
        grow |= need[j] > r->scratch_size[j];
    if (!grow) return LOOM_OK;
    loom__rd_plans_clear(r);
    for (int j = 0; j < r->n; j++) {
        if (need[j] <= r->scratch_size[j]) continue;
        loom_buffer_free(r->scratch[j]);
        r->scratch[j] = NULL;
        r->scratch_size[j] = 0;
        loom_buffer_t buf = loom_backend_alloc_buffer(r->backends[j], need[j]);
        if (!buf) {
            loom_status s = loom_last_status();
            if (s == LOOM_OK) s = LOOM_ERR_DEVICE_OOM;
            return loom_error(s, "allreduce: cannot allocate %zu bytes of scratch on %s: %s",
                              need[j], loom_backend_name(r->backends[j]), loom_last_error());
        }
        r->scratch[j] = buf;
        r->scratch_size[j] = need[j];
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- headers */

/* A 1-d F32 header over the caller's tensor t (same buffer and address). */
static loom_tensor *rd_base(loom_ctx *ctx, loom_tensor *t, int64_t n, int j) {
    loom_tensor *b = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, n);
    if (!b) return NULL;
    loom_format_name(b, "allreduce.x%d", j);
    size_t offset = (size_t)((char *)t->data - (char *)loom_buffer_base(t->buffer));
    if (loom_buffer_alloc_tensor(t->buffer, b, offset) != LOOM_OK) return NULL;
    return b;
}

/* Elements [off, off+cnt) of a base header. */
static loom_tensor *rd_slice(loom_ctx *ctx, loom_tensor *base, int64_t off, int64_t cnt) {
    loom_tensor *v = loom_view_1d(ctx, base, cnt, (size_t)off * sizeof(float));
    if (!v) return NULL;
    if (!v->buffer && loom_buffer_init_view(v) != LOOM_OK) return NULL;
    return v;
}

/* A scratch tensor of cnt elements at byte offset `offset` of device j's scratch. */
static loom_tensor *rd_scratch(loom_reducer *r, loom_ctx *ctx, int j, int64_t cnt, size_t offset) {
    loom_tensor *s = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, cnt);
    if (!s) return NULL;
    loom_format_name(s, "allreduce.scratch%d", j);
    if (loom_buffer_alloc_tensor(r->scratch[j], s, offset) != LOOM_OK) return NULL;
    return s;
}

/* Makes node a view of `of` (written in place) and checks device j can run it. */
static loom_status rd_in_place(loom_reducer *r, loom_tensor *node, loom_tensor *of, int j) {
    node->view_src = of->view_src ? of->view_src : of;
    node->view_offs = of->view_src ? of->view_offs : 0;
    loom_status s = loom_buffer_init_view(node);
    if (s != LOOM_OK) return s;
    if (!loom_backend_supports_op(r->backends[j], node)) {
        return loom_error(LOOM_ERR_UNSUPPORTED, "allreduce: %s does not support %s",
                          loom_backend_name(r->backends[j]), loom_op_name(node->op));
    }
    return LOOM_OK;
}

/* A one-node graph. */
static loom_graph *rd_graph1(loom_ctx *ctx, loom_tensor *node) {
    loom_graph *g = loom_graph_new(ctx, 1);
    if (!g || loom_graph_add_node(g, node) != LOOM_OK) return NULL;
    return g;
}

/* ---------------------------------------------------------------- plan building */

typedef struct rd_builder {
    loom_reducer *r;
    loom__rd_plan *p;
    int max_steps, max_xfers, max_adds;
    loom__rd_step *cur;
} rd_builder;

static void rd_step_begin(rd_builder *b) {
    LOOM_ASSERT(b->p->n_steps < b->max_steps);
    b->cur = &b->p->steps[b->p->n_steps];
    memset(b->cur, 0, sizeof *b->cur);
    b->cur->x0 = b->p->n_xfers;
    b->cur->a0 = b->p->n_adds;
}

static void rd_step_end(rd_builder *b) {
    if (b->cur->nx > 0) b->p->n_steps++; /* a step that moves nothing is dropped */
    b->cur = NULL;
}

static void rd_xfer(rd_builder *b, int src, int dst, const loom_tensor *from, loom_tensor *to) {
    LOOM_ASSERT(b->p->n_xfers < b->max_xfers && src != dst);
    loom__rd_xfer *x = &b->p->xfers[b->p->n_xfers++];
    x->src = src;
    x->dst = dst;
    x->from = from;
    x->to = to;
    uint64_t bytes = loom_nbytes(from);
    if (bytes > b->cur->max_bytes) b->cur->max_bytes = bytes;
    b->p->bytes_moved += bytes;
    b->cur->nx++;
}

/* x += s on device j, in place. */
static loom_status rd_add(rd_builder *b, int j, loom_tensor *x, loom_tensor *s) {
    LOOM_ASSERT(b->p->n_adds < b->max_adds);
    loom_tensor *a = loom_add(b->p->ctx, x, s);
    if (!a) return loom_last_status();
    loom_format_name(a, "allreduce.add%d", j);
    loom_status st = rd_in_place(b->r, a, x, j);
    if (st != LOOM_OK) return st;
    loom_graph *g = rd_graph1(b->p->ctx, a);
    if (!g) return loom_last_status();
    loom__rd_add *ad = &b->p->adds[b->p->n_adds++];
    ad->dev = j;
    ad->g = g;
    b->cur->na++;
    return LOOM_OK;
}

static int rd_mod(int a, int n) {
    return ((a % n) + n) % n;
}

static loom_status rd_build_ring(rd_builder *b, loom_tensor **base, int64_t n) {
    loom_reducer *r = b->r;
    loom_ctx *ctx = b->p->ctx;
    const int N = r->n;
    int64_t cnt[LOOM_REDUCE_MAX_DEVICES], off[LOOM_REDUCE_MAX_DEVICES];
    int64_t q = n / N, rem = n % N;
    for (int c = 0; c < N; c++) {
        cnt[c] = q + (c < rem ? 1 : 0);
        off[c] = c * q + (c < rem ? c : rem);
    }
    /* views of every chunk on every device, and one scratch header per chunk size */
    loom_tensor *v[LOOM_REDUCE_MAX_DEVICES][LOOM_REDUCE_MAX_DEVICES];
    loom_tensor *s[LOOM_REDUCE_MAX_DEVICES][LOOM_REDUCE_MAX_DEVICES];
    memset(v, 0, sizeof v);
    memset(s, 0, sizeof s);
    for (int j = 0; j < N; j++) {
        for (int c = 0; c < N; c++) {
            if (cnt[c] == 0) continue;
            v[j][c] = rd_slice(ctx, base[j], off[c], cnt[c]);
            s[j][c] = rd_scratch(r, ctx, j, cnt[c], 0);
            if (!v[j][c] || !s[j][c]) return loom_last_status();
        }
    }
    for (int k = 0; k < N - 1; k++) { /* reduce-scatter */
        rd_step_begin(b);
        for (int j = 0; j < N; j++) {
            int c = rd_mod(j - k, N), d = (j + 1) % N;
            if (cnt[c] > 0) rd_xfer(b, j, d, v[j][c], s[d][c]);
        }
        for (int j = 0; j < N; j++) {
            int c = rd_mod(j - k, N), d = (j + 1) % N;
            if (cnt[c] == 0) continue;
            loom_status st = rd_add(b, d, v[d][c], s[d][c]);
            if (st != LOOM_OK) return st;
        }
        rd_step_end(b);
    }
    for (int k = 0; k < N - 1; k++) { /* all-gather */
        rd_step_begin(b);
        for (int j = 0; j < N; j++) {
            int c = rd_mod(j + 1 - k, N), d = (j + 1) % N;
            if (cnt[c] > 0) rd_xfer(b, j, d, v[j][c], v[d][c]);
        }
        rd_step_end(b);
    }
    return LOOM_OK;
}

static loom_status rd_build_butterfly(rd_builder *b, loom_tensor **base, int64_t n,
                                      size_t slot_bytes) {
    loom_reducer *r = b->r;
    loom_ctx *ctx = b->p->ctx;
    const int N = r->n;
    int P = 1;
    while (P * 2 <= N)
        P *= 2;
    int slot = 0;
    if (N > P) { /* fold the excess devices into the lower ones */
        rd_step_begin(b);
        loom_tensor *s[LOOM_REDUCE_MAX_DEVICES];
        for (int j = P; j < N; j++) {
            s[j - P] = rd_scratch(r, ctx, j - P, n, 0);
            if (!s[j - P]) return loom_last_status();
            rd_xfer(b, j, j - P, base[j], s[j - P]);
        }
        for (int j = P; j < N; j++) {
            loom_status st = rd_add(b, j - P, base[j - P], s[j - P]);
            if (st != LOOM_OK) return st;
        }
        rd_step_end(b);
        slot++;
    }
    for (int stride = P / 2; stride >= 1; stride /= 2, slot++) {
        rd_step_begin(b);
        loom_tensor *s[LOOM_REDUCE_MAX_DEVICES];
        for (int j = 0; j < P; j++) {
            s[j] = rd_scratch(r, ctx, j, n, (size_t)slot * slot_bytes);
            if (!s[j]) return loom_last_status();
            rd_xfer(b, j ^ stride, j, base[j ^ stride], s[j]);
        }
        for (int j = 0; j < P; j++) {
            loom_status st = rd_add(b, j, base[j], s[j]);
            if (st != LOOM_OK) return st;
        }
        rd_step_end(b);
    }
    if (N > P) { /* copy the sum back to the excess devices */
        rd_step_begin(b);
        for (int j = P; j < N; j++)
            rd_xfer(b, j - P, j, base[j - P], base[j]);
        rd_step_end(b);
    }
    return LOOM_OK;
}

void loom__rd_plan_free(loom__rd_plan *p) {
    if (!p) return;
    loom_ctx_free(p->ctx);
    loom_free(p->steps);
    loom_free(p->xfers);
    loom_free(p->adds);
    loom_free(p);
}

loom__rd_plan *loom__rd_plan_build(loom_reducer *r, loom_allreduce_algo algo, loom_tensor *const *t,
                                   int64_t n_elem) {
    LOOM_ASSERT(algo == LOOM_ALLREDUCE_RING || algo == LOOM_ALLREDUCE_BUTTERFLY ||
                algo == LOOM_ALLREDUCE_NATIVE);
    const int N = r->n;
    const size_t nbytes = (size_t)n_elem * sizeof(float);

    /* scratch first: growing it frees cached plans, never this one */
    size_t need[LOOM_REDUCE_MAX_DEVICES] = {0};
    size_t slot_bytes = 0;
    int P = 1;
    while (P * 2 <= N)
        P *= 2;
    int slots = (N > P ? 1 : 0);
    for (int p2 = P; p2 > 1; p2 /= 2)
        slots++;
    for (int j = 0; j < N; j++) {
        size_t align = loom_buft_alignment(loom_backend_default_buft(r->backends[j]));
        if (algo == LOOM_ALLREDUCE_RING) {
            int64_t chunk = (n_elem + N - 1) / N;
            need[j] = rd_align((size_t)chunk * sizeof(float), align);
        } else if (algo == LOOM_ALLREDUCE_BUTTERFLY && j < P) {
            size_t sb = rd_align(nbytes, align);
            if (sb > slot_bytes) slot_bytes = sb;
        }
    }
    if (algo == LOOM_ALLREDUCE_BUTTERFLY) {
        for (int j = 0; j < P; j++)
            need[j] = (size_t)slots * slot_bytes;
    }
    if (rd_scratch_reserve(r, need) != LOOM_OK) return NULL;

    loom__rd_plan *p = loom_calloc(1, sizeof *p);
    if (!p) {
        loom_error(LOOM_ERR_NOMEM, "allreduce: out of host memory for a plan");
        return NULL;
    }
    p->algo = algo;
    p->n_elem = n_elem;
    for (int j = 0; j < N; j++) {
        p->key_t[j] = t[j];
        p->key_data[j] = t[j]->data;
        p->key_buf[j] = t[j]->buffer;
    }

    rd_builder b = {.r = r, .p = p};
    int n_tensors = 2 * N + 8; /* bases and fills */
    int n_graphs = N;
    if (algo == LOOM_ALLREDUCE_RING) {
        b.max_steps = 2 * (N - 1);
        n_tensors += 2 * N * N + N * (N - 1);
    } else if (algo == LOOM_ALLREDUCE_BUTTERFLY) {
        b.max_steps = slots + (N > P ? 1 : 0);
        n_tensors += 2 * N * slots;
    }
    b.max_xfers = b.max_steps * N;
    b.max_adds = b.max_steps * N;
    n_graphs += b.max_adds;
    loom_ctx_params cp = {
        .mem_size = (size_t)n_tensors * loom_tensor_overhead() +
                    (size_t)n_graphs * loom_graph_overhead(1) + 4096,
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    p->ctx = loom_ctx_new(cp);
    if (b.max_steps > 0) {
        p->steps = loom_calloc((size_t)b.max_steps, sizeof *p->steps);
        p->xfers = loom_calloc((size_t)b.max_xfers, sizeof *p->xfers);
        p->adds = loom_calloc((size_t)b.max_adds, sizeof *p->adds);
    }
    if (!p->ctx || (b.max_steps > 0 && (!p->steps || !p->xfers || !p->adds))) {
        loom__rd_plan_free(p);
        loom_error(LOOM_ERR_NOMEM, "allreduce: out of host memory for a plan");
        return NULL;
    }

    loom_status st = LOOM_OK;
    loom_tensor *base[LOOM_REDUCE_MAX_DEVICES];
    for (int j = 0; j < N && st == LOOM_OK; j++) {
        base[j] = rd_base(p->ctx, t[j], n_elem, j);
        if (!base[j]) {
            st = loom_last_status();
            break;
        }
        /* FILL 0 in place: exact zeros for an empty slice, whatever the memory held */
        loom_tensor *f = loom_fill(p->ctx, base[j], 0.0f);
        if (!f) {
            st = loom_last_status();
            break;
        }
        loom_format_name(f, "allreduce.zero%d", j);
        st = rd_in_place(r, f, base[j], j);
        if (st == LOOM_ERR_UNSUPPORTED) { /* the device refuses FILL: memset instead */
            loom_clear_error();
            st = LOOM_OK;
            continue;
        }
        if (st != LOOM_OK) break;
        p->fill[j] = rd_graph1(p->ctx, f);
        if (!p->fill[j]) st = loom_last_status();
    }
    if (st == LOOM_OK && algo == LOOM_ALLREDUCE_RING) st = rd_build_ring(&b, base, n_elem);
    if (st == LOOM_OK && algo == LOOM_ALLREDUCE_BUTTERFLY) {
        st = rd_build_butterfly(&b, base, n_elem, slot_bytes);
    }
    if (st != LOOM_OK) {
        if (loom_last_status() == LOOM_OK) loom_error(st, "allreduce: cannot build a plan");
        loom__rd_plan_free(p);
        return NULL;
    }
    return p;
}

/* ---------------------------------------------------------------- executing */

static void rd_record(loom_reducer *r, loom_event_t ev, int j) {
    if (ev) {
        loom_event_record(ev, r->backends[j]);
    } else {
        loom__rd_sync(r, j); /* no events: wait for the work itself */
    }
}

static void rd_wait(loom_reducer *r, int j, loom_event_t ev) {
    if (ev) loom_event_wait(r->backends[j], ev);
}

loom_status loom__rd_plan_fill(loom_reducer *r, const loom__rd_plan *p, const bool *empty) {
    if (!empty) return LOOM_OK;
    for (int j = 0; j < r->n; j++) {
        if (!empty[j]) continue;
        if (p->fill[j]) {
            loom_status s = loom_backend_graph_compute_async(r->backends[j], p->fill[j]);
            if (s != LOOM_OK) return s;
        } else {
            loom_tensor *t = p->key_t[j];
            loom__rd_sync(r, j);
            loom_tensor_memset(t, 0, 0, (size_t)p->n_elem * sizeof(float));
        }
    }
    return LOOM_OK;
}

loom_status loom__rd_plan_run(loom_reducer *r, const loom__rd_plan *p) {
    for (int si = 0; si < p->n_steps; si++) {
        const loom__rd_step *st = &p->steps[si];
        uint32_t in[LOOM_REDUCE_MAX_DEVICES] = {0};  /* in[dst]: bit src */
        uint32_t out[LOOM_REDUCE_MAX_DEVICES] = {0}; /* out[src]: bit dst */
        for (int x = st->x0; x < st->x0 + st->nx; x++) {
            in[p->xfers[x].dst] |= 1u << p->xfers[x].src;
            out[p->xfers[x].src] |= 1u << p->xfers[x].dst;
        }
        for (int j = 0; j < r->n; j++) {
            if (out[j]) rd_record(r, r->ready[j], j);
        }
        for (int j = 0; j < r->n; j++) {
            for (int k = 0; k < r->n; k++) {
                if (in[j] & (1u << k)) rd_wait(r, j, r->ready[k]);
            }
        }
        for (int x = st->x0; x < st->x0 + st->nx; x++) {
            const loom__rd_xfer *xf = &p->xfers[x];
            loom_status s = loom_backend_tensor_copy_async(r->backends[xf->src],
                                                           r->backends[xf->dst], xf->from, xf->to);
            if (s != LOOM_OK) return s;
        }
        for (int j = 0; j < r->n; j++) {
            if (in[j]) rd_record(r, r->done[j], j);
        }
        for (int j = 0; j < r->n; j++) { /* readers done before the source goes on */
            for (int k = 0; k < r->n; k++) {
                if (out[j] & (1u << k)) rd_wait(r, j, r->done[k]);
            }
        }
        for (int a = st->a0; a < st->a0 + st->na; a++) {
            loom_status s =
                loom_backend_graph_compute_async(r->backends[p->adds[a].dev], p->adds[a].g);
            if (s != LOOM_OK) return s;
        }
        loom_status s = loom__rd_trace_push(r, st->max_bytes);
        if (s != LOOM_OK) return s;
    }
    return LOOM_OK;
}

void loom__rd_plans_clear(loom_reducer *r) {
    bool any = false;
    for (int i = 0; i < LOOM__RD_N_PLANS; i++)
        any |= r->plans[i] != NULL;
    if (!any) return;
    loom__rd_sync_all(r);
    for (int i = 0; i < LOOM__RD_N_PLANS; i++) {
        loom__rd_plan_free(r->plans[i]);
        r->plans[i] = NULL;
    }
}
