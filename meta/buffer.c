/*
 * A meta buffer: one real buffer per device, laid out one of two ways (meta-impl.h).
 * Shared: every member buffer has the meta size and a tensor at offset o of the meta buffer
 * has its slice at offset o of each device buffer (the meta address space is device 0's).
 * Packed: the buffer was made for exactly the tensors the allocator had just sized
 * (loom_alloc_ctx_tensors, the model loader: one after another, aligned), so member j's
 * buffer holds only member j's slices, one after another, and an uneven split (-ts 3/1)
 * takes less memory on the smaller member; the meta address space is a reserved range
 * nobody reads. A packed buffer a graph allocator takes (usage COMPUTE, or a first tensor
 * not where it was laid out) becomes shared before its first tensor.
 * Reads and writes scatter and gather by the tensor's true split state:
 *   split axis  every device's pieces (partial byte ranges too), chunk by chunk;
 *   MIRRORED    writes go to every device, reads come from the first device;
 *   PARTIAL     a write puts the value on device 0 and zeros elsewhere (exact: the sum is
 *               the value); a read returns the sum over devices.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "meta/meta-impl.h"

static char g_empty_base[64]; /* the base of a zero-size meta buffer */

static void mb_destroy(meta_buffer *mb) {
    for (int j = 0; j < mb->md->n; j++)
        loom_buffer_free(mb->bufs[j]);
    if (mb->vbase) munmap(mb->vbase, mb->vsize);
    loom_free(mb->place);
    loom_free(mb);
}

static void mb_free(loom_buffer_t buf) {
    meta_buffer *mb = buf->context;
    memset(mb->md->outs, 0, sizeof mb->md->outs); /* its memory may be handed out again */
    mb_destroy(mb);
}

static void *mb_base(loom_buffer_t buf) {
    meta_buffer *mb = buf->context;
    if (mb->vbase) return mb->vbase;
    void *b = mb->bufs[0] ? loom_buffer_base(mb->bufs[0]) : NULL;
    return b ? b : g_empty_base;
}

/* The last place at meta offset off (zero-size tensors share the offset of the next). */
static const meta_place *place_find(const meta_buffer *mb, size_t off) {
    int lo = 0, hi = mb->n_place; /* first place past off */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (mb->place[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && mb->place[lo - 1].off == off ? &mb->place[lo - 1] : NULL;
}

loom_status loom__meta_member_offset(const meta_buffer *mb, const loom_tensor *t, size_t off, int j,
                                     size_t bytes, size_t *out) {
    if (!mb->place) {
        *out = off;
        return LOOM_OK;
    }
    const meta_place *p = place_find(mb, off);
    if (!p || bytes > p->dev_size[j])
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "%s: tensor '%s' (%zu bytes on %s at offset %zu) is not where the "
                          "buffer laid out its per-device slices",
                          mb->md->name, t->name, bytes, loom_dev_name(mb->md->devs[j]), off);
    *out = p->dev_off[j];
    return LOOM_OK;
}

/* Packed -> shared, before any tensor lives in it: every member gets the meta size. */
static loom_status demote(loom_buffer_t buf, meta_buffer *mb) {
    size_t size = loom_buffer_size(buf);
    for (int j = 0; j < mb->md->n; j++) {
        loom_buffer_free(mb->bufs[j]); /* first, so a memory cap sees only the new size */
        mb->bufs[j] = loom_buft_alloc_buffer(loom_dev_buffer_type(mb->md->devs[j]), size);
        if (!mb->bufs[j])
            return loom_error(loom_last_status() ? loom_last_status() : LOOM_ERR_DEVICE_OOM,
                              "%s: allocating %zu bytes on %s failed: %s", mb->md->name, size,
                              loom_dev_name(mb->md->devs[j]), loom_last_error());
    }
    loom_free(mb->place);
    mb->place = NULL;
    mb->n_place = 0;
    return LOOM_OK;
}

static loom_status mb_init_tensor(loom_buffer_t buf, loom_tensor *t) {
    meta_buffer *mb = buf->context;
    if (mb->place && !t->view_src) {
        size_t off = (size_t)((const char *)t->data - (const char *)mb_base(buf));
        const meta_place *p = place_find(mb, off);
        bool fits = p && loom_buft_alloc_size(&mb->md->buft, t) <= p->size;
        if (!fits || loom_buffer_get_usage(buf) == LOOM_BUFFER_USAGE_COMPUTE) {
            if (mb->n_init > 0)
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "%s: tensor '%s' at offset %zu is not where the buffer laid "
                                  "out its per-device slices",
                                  mb->md->name, t->name, off);
            loom_status st = demote(buf, mb);
            if (st) return st;
        }
    }
    mb->n_init++;
    loom__meta_alloc_phase(mb->md);
    loom_split_state s;
    /* surface an unsplittable tensor at allocation, with the table's message */
    return loom__meta_state(mb->md, t, true, &s);
}

/* Calls fn(dev, dev_byte_offset_in_slice, full_byte_offset, size) for every run of bytes
 * of t's split layout that intersects [offset, offset + size) of the full tensor. */
typedef void (*run_fn)(meta_buffer *mb, int j, loom_tensor *dev, size_t dev_off, size_t full_off,
                       size_t n, void *ud);

static void for_each_run(meta_buffer *mb, const loom_tensor *t, const loom_split_state *s,
                         size_t offset, size_t size, run_fn fn, void *ud) {
    size_t lo = offset, hi = offset + size;
    for (int j = 0; j < mb->md->n; j++) {
        loom_tensor dev;
        if (loom__meta_slice(mb->md, t, s, j, NULL, NULL, &dev) != LOOM_OK) continue;
        for (int seg = 0; seg < s->n_segments; seg++) {
            for (int64_t rep = 0; rep < s->nr[seg]; rep++) {
                loom_split_range r;
                if (loom_split_state_range(s, t, seg, rep, j, &r) != LOOM_OK || r.size_bytes == 0)
                    continue;
                for (int64_t c = 0; c < r.n_chunks; c++) {
                    size_t f0 = (size_t)c * r.chunk_bytes + r.offset_bytes;
                    size_t f1 = f0 + r.size_bytes;
                    if (f1 <= lo || f0 >= hi) continue;
                    size_t a = f0 > lo ? f0 : lo, b = f1 < hi ? f1 : hi;
                    size_t d0 = (size_t)c * r.dev_chunk_bytes + r.dev_offset_bytes + (a - f0);
                    fn(mb, j, &dev, d0, a, b - a, ud);
                }
            }
        }
    }
}

typedef struct io {
    const char *src; /* set: caller's bytes for [offset, offset+size) */
    char *dst;       /* get */
    size_t offset;
    uint8_t value;   /* memset */
} io;

static void run_set(meta_buffer *mb, int j, loom_tensor *dev, size_t dev_off, size_t full_off,
                    size_t n, void *ud) {
    (void)mb;
    (void)j;
    io *x = ud;
    loom_tensor_set(dev, x->src + (full_off - x->offset), dev_off, n);
}

static void run_get(meta_buffer *mb, int j, loom_tensor *dev, size_t dev_off, size_t full_off,
                    size_t n, void *ud) {
    (void)mb;
    (void)j;
    io *x = ud;
    loom_tensor_get(dev, x->dst + (full_off - x->offset), dev_off, n);
}

static void run_memset(meta_buffer *mb, int j, loom_tensor *dev, size_t dev_off, size_t full_off,
                       size_t n, void *ud) {
    (void)mb;
    (void)j;
    (void)full_off;
    io *x = ud;
    loom_tensor_memset(dev, x->value, dev_off, n);
}

static bool out_matches(const meta_out *o, const loom_tensor *t) {
    return o->t == t && o->data == t->data && o->type == t->type && o->op == t->op &&
           memcmp(o->ne, t->ne, sizeof o->ne) == 0 && memcmp(o->nb, t->nb, sizeof o->nb) == 0;
}

void loom__meta_out_publish(meta_dev *md, const loom_tensor *t, const loom_split_state *s) {
    meta_out *slot = &md->outs[0];
    for (int i = 0; i < LOOM_META_OUT_CACHE; i++) {
        meta_out *o = &md->outs[i];
        if (o->t == t) { /* this header's entry, whatever it held */
            slot = o;
            break;
        }
        if (!o->t || (slot->t && o->stamp < slot->stamp)) slot = o;
    }
    *slot = (meta_out){.t = t,
                       .data = t->data,
                       .type = t->type,
                       .op = t->op,
                       .state = *s,
                       .stamp = ++md->out_clock};
    memcpy(slot->ne, t->ne, sizeof slot->ne);
    memcpy(slot->nb, t->nb, sizeof slot->nb);
}

bool loom__meta_out_find(meta_dev *md, const loom_tensor *t, loom_split_state *s) {
    for (int i = 0; i < LOOM_META_OUT_CACHE; i++) {
        if (md->outs[i].t && out_matches(&md->outs[i], t)) {
            *s = md->outs[i].state;
            return true;
        }
    }
    return false;
}

void loom__meta_out_forget(meta_dev *md, const loom_tensor *t) {
    for (int i = 0; i < LOOM_META_OUT_CACHE; i++)
        if (md->outs[i].t == t) md->outs[i].t = NULL;
}

static bool true_state(meta_buffer *mb, const loom_tensor *t, loom_split_state *s) {
    loom__meta_end_phase(mb->md);
    loom_status st = loom__meta_state(mb->md, t, false, s);
    if (st) {
        LOOM_LOG_ERROR("meta: %s", loom_last_error());
        return false;
    }
    /* a computed PARTIAL tensor has been reduced by the time anyone reads it */
    if (s->axis == LOOM_SPLIT_PARTIAL && t->op != LOOM_OP_NONE) loom_split_state_assume_sync(t, s);
    return true;
}

/* Device j's copy of a storage owner that is whole on every device (MIRRORED, PARTIAL). */
static void whole(meta_buffer *mb, const loom_tensor *t, int j, loom_tensor *dev) {
    loom_split_state m;
    loom_split_state_init(&m, LOOM_SPLIT_MIRRORED, mb->md->n);
    loom_status st = loom__meta_slice(mb->md, t, &m, j, NULL, NULL, dev);
    LOOM_ASSERT(st == LOOM_OK);
}

/* Bytes of a view are bytes of its storage owner at view_offs + offset, whatever the
 * view's shape: raw spans are addressed through the owner, which knows its layout. */
static void mb_set(loom_buffer_t buf, loom_tensor *t, const void *data, size_t offset, size_t size) {
    meta_buffer *mb = buf->context;
    if (t->view_src) {
        mb_set(buf, t->view_src, data, t->view_offs + offset, size);
        return;
    }
    loom__meta_out_forget(mb->md, t); /* a host write: its layout is the true state's */
    loom_split_state s;
    if (!true_state(mb, t, &s)) return;
    if (loom_split_axis_is_dim(s.axis)) {
        io x = {.src = data, .offset = offset};
        for_each_run(mb, t, &s, offset, size, run_set, &x);
        return;
    }
    for (int j = 0; j < mb->md->n; j++) {
        loom_tensor dev;
        whole(mb, t, j, &dev);
        if (s.axis == LOOM_SPLIT_PARTIAL && j > 0) loom_tensor_memset(&dev, 0, offset, size);
        else loom_tensor_set(&dev, data, offset, size);
    }
}

static void mb_get(loom_buffer_t buf, const loom_tensor *t, void *data, size_t offset, size_t size) {
    meta_buffer *mb = buf->context;
    if (t->view_src) {
        mb_get(buf, t->view_src, data, t->view_offs + offset, size);
        return;
    }
    loom_split_state s;
    /* what the last graph_compute of t laid it out by, or derived from its graph */
    if (!loom__meta_out_find(mb->md, t, &s) && !true_state(mb, t, &s)) return;
    if (loom_split_axis_is_dim(s.axis)) {
        io x = {.dst = data, .offset = offset};
        for_each_run(mb, t, &s, offset, size, run_get, &x);
        return;
    }
    loom_tensor dev;
    whole(mb, t, 0, &dev);
    loom_tensor_get(&dev, data, offset, size);
    if (s.axis != LOOM_SPLIT_PARTIAL) return;
    /* a PARTIAL leaf: the value is the sum over devices */
    LOOM_ASSERT(t->type == LOOM_TYPE_F32 && offset % 4 == 0 && size % 4 == 0);
    float *acc = data, *tmp = loom_malloc(size ? size : 1);
    if (!tmp) {
        LOOM_LOG_ERROR("meta: out of memory reading PARTIAL tensor '%s'", t->name);
        return;
    }
    for (int j = 1; j < mb->md->n; j++) {
        whole(mb, t, j, &dev);
        loom_tensor_get(&dev, tmp, offset, size);
        for (size_t i = 0; i < size / 4; i++) acc[i] += tmp[i];
    }
    loom_free(tmp);
}

static void mb_memset(loom_buffer_t buf, loom_tensor *t, uint8_t value, size_t offset, size_t size) {
    meta_buffer *mb = buf->context;
    if (t->view_src) {
        mb_memset(buf, t->view_src, value, t->view_offs + offset, size);
        return;
    }
    loom__meta_out_forget(mb->md, t);
    loom_split_state s;
    if (!true_state(mb, t, &s)) return;
    if (loom_split_axis_is_dim(s.axis)) {
        io x = {.value = value, .offset = offset};
        for_each_run(mb, t, &s, offset, size, run_memset, &x);
        return;
    }
    for (int j = 0; j < mb->md->n; j++) {
        loom_tensor dev;
        whole(mb, t, j, &dev);
        loom_tensor_memset(&dev, s.axis == LOOM_SPLIT_PARTIAL && j > 0 ? 0 : value, offset, size);
    }
}

static void mb_clear(loom_buffer_t buf, uint8_t value) {
    meta_buffer *mb = buf->context;
    memset(mb->md->outs, 0, sizeof mb->md->outs); /* every layout it held is gone */
    for (int j = 0; j < mb->md->n; j++) loom_buffer_clear(mb->bufs[j], value);
}

static void mb_reset(loom_buffer_t buf) {
    meta_buffer *mb = buf->context;
    for (int j = 0; j < mb->md->n; j++)
        if (mb->bufs[j]->iface->reset) mb->bufs[j]->iface->reset(mb->bufs[j]);
}

const struct loom_buffer_i loom__meta_buffer_i = {
    .free_buffer = mb_free,
    .get_base = mb_base,
    .init_tensor = mb_init_tensor,
    .memset_tensor = mb_memset,
    .set_tensor = mb_set,
    .get_tensor = mb_get,
    .clear = mb_clear,
    .reset = mb_reset,
};

static size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

/* The packed layout of the tensors the allocator just sized, if `size` is exactly their
 * aligned sum and some member needs less than the meta size; sizes per member in dev[]. */
static bool plan_packed(meta_dev *md, meta_buffer *mb, size_t size, size_t dev[]) {
    size_t align = loom_buft_alignment(&md->buft), total = 0;
    if (md->n_pend == 0 || size == 0) return false;
    /* the latest queries that add up to the size (an allocator's earlier passes, or a
     * placement's own queries after the previous buffer, come before them) */
    int first = -1;
    for (int i = md->n_pend - 1; i >= 0 && total <= size; i--) {
        total += align_up(md->pend[i].size, align);
        if (total == size) first = i;
    }
    if (first < 0) return false;
    int n = md->n_pend - first;
    meta_place *p = loom_calloc((size_t)n, sizeof *p);
    if (!p) return false;
    size_t off = 0;
    memset(dev, 0, sizeof(size_t) * (size_t)md->n);
    for (int i = 0; i < n; i++) {
        const meta_pend *e = &md->pend[first + i];
        p[i].off = off;
        p[i].size = e->size;
        off += align_up(e->size, align);
        for (int j = 0; j < md->n; j++) {
            p[i].dev_off[j] = dev[j];
            p[i].dev_size[j] = e->dev[j];
            dev[j] += align_up(e->dev[j], align);
        }
    }
    bool saves = false;
    for (int j = 0; j < md->n; j++)
        saves = saves || dev[j] < size;
    void *v = saves
                  ? mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                  : MAP_FAILED;
    if (v == MAP_FAILED || (uintptr_t)v % align != 0) {
        if (v != MAP_FAILED) munmap(v, size);
        loom_free(p);
        return false;
    }
    mb->vbase = v;
    mb->vsize = size;
    mb->place = p;
    mb->n_place = n;
    return true;
}

loom_buffer_t loom__meta_buffer_new(meta_dev *md, size_t size) {
    static _Atomic uint64_t next_id = 1;
    meta_buffer *mb = loom_calloc(1, sizeof *mb);
    if (!mb) {
        loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
        return NULL;
    }
    mb->md = md;
    mb->id = next_id++;
    size_t dev[LOOM_META_MAX_DEVICES];
    bool packed = plan_packed(md, mb, size, dev);
    loom__meta_pend_reset(md); /* consumed (or not this buffer's) */
    for (int j = 0; j < md->n; j++) {
        size_t need = packed ? dev[j] : size;
        mb->bufs[j] = loom_buft_alloc_buffer(loom_dev_buffer_type(md->devs[j]), need);
        if (!mb->bufs[j]) {
            loom_status st = loom_last_status() ? loom_last_status() : LOOM_ERR_DEVICE_OOM;
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            mb_destroy(mb);
            loom_error(st, "%s: allocating %zu bytes on %s failed: %s", md->name, need,
                       loom_dev_name(md->devs[j]), why);
            return NULL;
        }
    }
    loom_buffer_t buf = loom_buffer_init(&md->buft, &loom__meta_buffer_i, mb, size);
    if (!buf) {
        mb_destroy(mb);
        loom_error(LOOM_ERR_NOMEM, "meta: out of memory");
    }
    return buf;
}

loom_buffer_t loom_meta_buffer_member(loom_buffer_t buf, int i) {
    if (!buf || buf->iface != &loom__meta_buffer_i) {
        /* a zero-size buffer of a meta buffer type is the generic empty buffer: it has no
         * members (nothing lives in it) */
        loom_error(LOOM_ERR_INVALID_ARG, "loom_meta_buffer_member: %s is not a meta buffer%s",
                   buf ? loom_buffer_name(buf) : "(null)",
                   buf && loom_buffer_size(buf) == 0 ? " (a zero-size buffer has no members)" : "");
        return NULL;
    }
    meta_buffer *mb = buf->context;
    if (i < 0 || i >= mb->md->n) {
        loom_error(LOOM_ERR_INVALID_ARG, "loom_meta_buffer_member: member %d of %d", i, mb->md->n);
        return NULL;
    }
    return mb->bufs[i];
}

size_t loom_meta_buffer_member_offset(loom_buffer_t buf, const loom_tensor *t, int i) {
    if (!buf || buf->iface != &loom__meta_buffer_i || !t || t->view_src || t->buffer != buf) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "loom_meta_buffer_member_offset: '%s' is not a tensor "
                   "owning storage in this meta buffer",
                   t ? t->name : "(null)");
        return SIZE_MAX;
    }
    meta_buffer *mb = buf->context;
    if (i < 0 || i >= mb->md->n) {
        loom_error(LOOM_ERR_INVALID_ARG, "loom_meta_buffer_member_offset: member %d of %d", i,
                   mb->md->n);
        return SIZE_MAX;
    }
    size_t off = (size_t)((const char *)t->data - (const char *)loom_buffer_base(buf)), o;
    return loom__meta_member_offset(mb, t, off, i, 0, &o) == LOOM_OK ? o : SIZE_MAX;
}
