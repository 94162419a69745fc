/*
 * The meta device and its buffer type: everything is delegated to the member devices.
 * supports_op needs every member AND the split rule table; memory is summed; caps are
 * ANDed; the name lists the members. The buffer type sizes a tensor by its largest slice.
 */
#include <stdio.h>
#include <string.h>

#include "meta/meta-impl.h"

meta_dev *loom__meta_dev(loom_dev_t dev) { return (meta_dev *)dev->context; }

static void begin_phase(meta_dev *md, int phase) {
    if (md->phase == phase) return;
    loom__meta_end_phase(md);
    loom_split_ctx_begin(md->split);
    md->phase = phase;
}

void loom__meta_split_phase(meta_dev *md) { begin_phase(md, 1); }
void loom__meta_alloc_phase(meta_dev *md) { begin_phase(md, 2); }

void loom__meta_pend_reset(meta_dev *md) { md->n_pend = 0; }

void loom__meta_end_phase(meta_dev *md) {
    if (!md->phase) return;
    md->phase = 0;
    loom__meta_pend_reset(md); /* queries of one allocation window only */
    loom_split_ctx_end(md->split);
}

loom_status loom__meta_state(meta_dev *md, const loom_tensor *t, bool assume_sync,
                             loom_split_state *out) {
    return loom_split_ctx_get(md->split, t, assume_sync, out);
}

/* ---------------------------------------------------------------- buffer type */

static const char *buft_name(loom_buft_t buft) { return ((meta_dev *)buft->context)->name; }

static loom_buffer_t buft_alloc(loom_buft_t buft, size_t size) {
    return loom__meta_buffer_new((meta_dev *)buft->context, size);
}

static size_t buft_alignment(loom_buft_t buft) {
    meta_dev *md = buft->context;
    size_t a = 1;
    for (int j = 0; j < md->n; j++) {
        size_t aj = loom_buft_alignment(loom_dev_buffer_type(md->devs[j]));
        if (aj > a) a = aj;
    }
    return a;
}

static size_t buft_max_size(loom_buft_t buft) {
    meta_dev *md = buft->context;
    size_t m = SIZE_MAX;
    for (int j = 0; j < md->n; j++) {
        size_t mj = loom_buft_max_size(loom_dev_buffer_type(md->devs[j]));
        if (mj < m) m = mj;
    }
    return m;
}

/* Remembers an unplaced storage owner the allocator sized, with its slice per member (a
 * tensor asked again starts the list afresh: a new pass of the allocator). */
static void pend_add(meta_dev *md, const loom_tensor *t, size_t size, const size_t *dev) {
    for (int i = 0; i < md->n_pend; i++)
        if (md->pend[i].t == t) {
            md->n_pend = 0;
            break;
        }
    if (md->n_pend == md->cap_pend) {
        int cap = md->cap_pend ? 2 * md->cap_pend : 64;
        meta_pend *p = cap <= (1 << 20) ? loom_realloc(md->pend, (size_t)cap * sizeof *p) : NULL;
        if (!p) { /* no packed layout for this buffer: it is laid out shared */
            md->n_pend = 0;
            return;
        }
        md->pend = p;
        md->cap_pend = cap;
    }
    meta_pend *e = &md->pend[md->n_pend++];
    e->t = t;
    e->size = size;
    memcpy(e->dev, dev, sizeof e->dev);
}

size_t loom__meta_alloc_size(meta_dev *md, const loom_tensor *t) {
    loom__meta_alloc_phase(md);
    loom_split_state s;
    size_t dev[LOOM_META_MAX_DEVICES] = {0}, best = 0;
    bool split = loom__meta_state(md, t, true, &s) == LOOM_OK && loom_split_axis_is_dim(s.axis);
    for (int j = 0; j < md->n; j++) {
        dev[j] = split ? loom_split_state_slice_nbytes(&s, t, j) : loom_nbytes(t);
        if (dev[j] > best) best = dev[j];
    }
    if (!t->view_src && !t->data) pend_add(md, t, best, dev);
    return best;
}

static size_t buft_alloc_size(loom_buft_t buft, const loom_tensor *t) {
    return loom__meta_alloc_size((meta_dev *)buft->context, t);
}

static const struct loom_buft_i meta_buft_i = {
    .get_name = buft_name,
    .alloc_buffer = buft_alloc,
    .get_alignment = buft_alignment,
    .get_max_size = buft_max_size,
    .get_alloc_size = buft_alloc_size,
};

/* ---------------------------------------------------------------- device */

static const char *dev_name(loom_dev_t dev) { return loom__meta_dev(dev)->name; }

static void dev_memory(loom_dev_t dev, size_t *free_b, size_t *total_b) {
    meta_dev *md = loom__meta_dev(dev);
    size_t f = 0, t = 0;
    for (int j = 0; j < md->n; j++) {
        size_t fj, tj;
        loom_dev_memory(md->devs[j], &fj, &tj);
        f += fj;
        t += tj;
    }
    *free_b = f;
    *total_b = t;
}

static loom_dev_type dev_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_META;
}

/* The members' host buffer type when they all have the same one (host memory every
 * member can read fast), else NULL. */
static loom_buft_t dev_host_buft(loom_dev_t dev) {
    meta_dev *md = loom__meta_dev(dev);
    loom_buft_t h = loom_dev_host_buffer_type(md->devs[0]);
    for (int j = 1; j < md->n && h; j++)
        if (loom_dev_host_buffer_type(md->devs[j]) != h) h = NULL;
    return h;
}

/* Events: one member event per device. NULL if a member has none. */
static loom_event_t dev_event_new(loom_dev_t dev) {
    meta_dev *md = loom__meta_dev(dev);
    meta_event *me = loom_calloc(1, sizeof *me);
    if (!me) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of memory for an event", md->name);
        return NULL;
    }
    me->ev = (struct loom_event){.device = dev, .context = me};
    for (int j = 0; j < md->n; j++) {
        me->m[j] = loom_event_new(md->devs[j]);
        if (!me->m[j]) {
            for (int k = 0; k < j; k++) loom_event_free(me->m[k]);
            loom_free(me);
            return NULL;
        }
    }
    return &me->ev;
}

static void dev_event_free(loom_dev_t dev, loom_event_t ev) {
    meta_event *me = ev->context;
    for (int j = 0; j < loom__meta_dev(dev)->n; j++) loom_event_free(me->m[j]);
    loom_free(me);
}

static void dev_event_synchronize(loom_dev_t dev, loom_event_t ev) {
    meta_event *me = ev->context;
    for (int j = 0; j < loom__meta_dev(dev)->n; j++) loom_event_synchronize(me->m[j]);
}

static void dev_props(loom_dev_t dev, loom_dev_props *p) {
    meta_dev *md = loom__meta_dev(dev);
    p->name = md->name;
    p->description = md->name;
    dev_memory(dev, &p->memory_free, &p->memory_total);
    p->type = LOOM_DEV_TYPE_META;
    /* the AND of the members' caps; a host buffer type only if they all share one */
    p->caps = (loom_dev_caps){.async = true, .host_buffer = true, .events = true};
    for (int j = 0; j < md->n; j++) {
        loom_dev_props pj;
        loom_dev_get_props(md->devs[j], &pj);
        p->caps.async = p->caps.async && pj.caps.async;
        p->caps.host_buffer = p->caps.host_buffer && pj.caps.host_buffer;
        p->caps.events = p->caps.events && pj.caps.events;
    }
    p->caps.host_buffer = p->caps.host_buffer && dev_host_buft(dev) != NULL;
}

static loom_backend_t dev_init(loom_dev_t dev, const char *params) {
    return loom__meta_backend_new(loom__meta_dev(dev), params);
}

static loom_buft_t dev_buft(loom_dev_t dev) { return &loom__meta_dev(dev)->buft; }

static bool dev_supports_op(loom_dev_t dev, const loom_tensor *op) {
    meta_dev *md = loom__meta_dev(dev);
    if (md->phase != 1) loom__meta_end_phase(md); /* inside a split window: keep its batch */
    for (int j = 0; j < md->n; j++)
        if (!loom_dev_supports_op(md->devs[j], op)) return false;
    /* views too: a reshape the table cannot map falls back instead of failing at compute */
    if (!loom_split_ctx_can_split(md->split, op)) return false;
    if (op->op == LOOM_OP_MUL_MAT_ID) { /* expert-parallel needs id remapping (not done) */
        loom_split_state s;
        if (loom__meta_state(md, op->src[0], true, &s) != LOOM_OK || s.axis == LOOM_SPLIT_AXIS_2)
            return false;
    }
    return true;
}

static bool dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    return buft == &loom__meta_dev(dev)->buft;
}

static const struct loom_dev_i meta_dev_i = {
    .get_name = dev_name,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .get_props = dev_props,
    .init_backend = dev_init,
    .get_buffer_type = dev_buft,
    .get_host_buffer_type = dev_host_buft,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_synchronize = dev_event_synchronize,
};

/* Leafs: a tensor that lives outside this device's buffers reaches the devices as a whole
 * copy (the scheduler copies it in), so it is MIRRORED whatever the caller's table says;
 * the rest is the caller's. */
static loom_status leaf_state(const loom_tensor *t, loom_split_state *out, void *ud) {
    meta_dev *md = ud;
    const loom_tensor *owner = t->view_src ? t->view_src : t;
    if (owner->buffer && loom_buffer_buft(owner->buffer) != &md->buft) return LOOM_OK;
    return md->user_leaf ? md->user_leaf(t, out, md->user_data) : LOOM_OK;
}

loom_status loom_meta_device_new(loom_dev_t *devs, int n, loom_split_leaf_fn get_split_state,
                                 void *user_data, loom_dev_t *out) {
    *out = NULL;
    if (n < 1 || n > LOOM_META_MAX_DEVICES || !devs)
        return loom_error(LOOM_ERR_INVALID_ARG, "meta device: %d devices (1..%d)", n,
                          LOOM_META_MAX_DEVICES);
    for (int j = 0; j < n; j++) {
        if (!devs[j]) return loom_error(LOOM_ERR_INVALID_ARG, "meta device: device %d is NULL", j);
        if (loom_dev_get_type(devs[j]) == LOOM_DEV_TYPE_META)
            return loom_error(LOOM_ERR_INVALID_ARG, "meta device: member %d is itself a meta device", j);
        for (int k = 0; k < j; k++)
            if (devs[k] == devs[j])
                return loom_error(LOOM_ERR_INVALID_ARG, "meta device: device %s listed twice",
                                  loom_dev_name(devs[j]));
    }
    meta_dev *md = loom_calloc(1, sizeof *md);
    if (!md) return loom_error(LOOM_ERR_NOMEM, "meta device: out of memory");
    md->n = n;
    memcpy(md->devs, devs, sizeof(loom_dev_t) * (size_t)n);
    md->user_leaf = get_split_state;
    md->user_data = user_data;
    md->split = loom_split_ctx_new(n, leaf_state, md);
    if (!md->split) {
        loom_free(md);
        return loom_last_status();
    }
    size_t o = (size_t)snprintf(md->name, sizeof md->name, "Meta(");
    for (int j = 0; j < n && o < sizeof md->name; j++)
        o += (size_t)snprintf(md->name + o, sizeof md->name - o, "%s%s", j ? "," : "",
                              loom_dev_name(devs[j]));
    if (o < sizeof md->name) snprintf(md->name + o, sizeof md->name - o, ")");
    md->dev = (struct loom_dev){.iface = &meta_dev_i, .reg = NULL, .context = md};
    md->buft = (struct loom_buft){.iface = &meta_buft_i, .device = &md->dev, .context = md};
    *out = &md->dev;
    return LOOM_OK;
}

void loom_meta_device_free(loom_dev_t dev) {
    if (!dev) return;
    meta_dev *md = loom__meta_dev(dev);
    loom__meta_end_phase(md);
    loom_split_ctx_free(md->split);
    loom_free(md->pend);
    loom_free(md);
}

bool loom_dev_is_meta(loom_dev_t dev) { return dev && dev->iface == &meta_dev_i; }
int loom_meta_n_devices(loom_dev_t dev) { return loom__meta_dev(dev)->n; }
loom_dev_t loom_meta_member(loom_dev_t dev, int i) { return loom__meta_dev(dev)->devs[i]; }

loom_status loom_meta_tensor_state(loom_dev_t dev, const loom_tensor *t, bool assume_sync,
                                   loom_split_state *out) {
    loom__meta_end_phase(loom__meta_dev(dev));
    return loom__meta_state(loom__meta_dev(dev), t, assume_sync, out);
}
