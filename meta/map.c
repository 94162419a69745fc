/*
 * Where a meta tensor's slice lives on device j, and its geometry there.
 *
 * A tensor that owns storage (not a view) is contiguous in its meta buffer at offset o; its
 * slice on device j is the contiguous tensor of the slice's shape at offset o of device j's
 * buffer. A view is mapped through its storage owner: every stride and the offset of the
 * view are decomposed into coordinates of the owner (mixed radix over the owner's
 * contiguous strides) and recomposed with the strides of the owner's slice; along the
 * owner's split axis the offset becomes the position in device j's slice where j's part of
 * the viewed range begins (loom_split_state_sub). The view's shape on device j is its
 * shape cut by its own split state (from the op rule table).
 */
#include <string.h>

#include "meta/meta-impl.h"

static void contiguous_nb(loom_type type, const int64_t ne[4], size_t nb[4]) {
    nb[0] = loom_type_size(type);
    nb[1] = loom_row_size(type, ne[0]);
    nb[2] = nb[1] * (size_t)ne[1];
    nb[3] = nb[2] * (size_t)ne[2];
}

/* Decomposes a byte quantity into coordinates of a contiguous tensor (ne, nb), the highest
 * dimension first; false if it is not a whole number of elements (or blocks). Dimensions
 * of extent 1 take nothing unless they are the outermost. */
static bool decompose(size_t bytes, const int64_t ne[4], const size_t nb[4], int64_t c[4]) {
    size_t rem = bytes;
    for (int k = 3; k >= 0; k--) {
        c[k] = 0;
        if (nb[k] == 0) continue;
        if (k > 0 && ne[k] == 1 && k != 3) continue;
        c[k] = (int64_t)(rem / nb[k]);
        rem -= (size_t)c[k] * nb[k];
    }
    return rem == 0;
}

static size_t recompose(const int64_t c[4], const size_t nb[4]) {
    size_t s = 0;
    for (int k = 0; k < 4; k++) s += (size_t)c[k] * nb[k];
    return s;
}

loom_status loom__meta_slice(meta_dev *md, const loom_tensor *t, const loom_split_state *state,
                             int j, const loom_tensor *vsrc_dev, const loom_split_state *vsrc_state,
                             loom_tensor *out) {
    memset(out, 0, sizeof *out);
    out->type = t->type;
    out->op = t->op;
    memcpy(out->op_params, t->op_params, sizeof out->op_params);
    out->flags = t->flags;
    memcpy(out->name, t->name, sizeof out->name);
    loom_split_state_slice_ne(state, t->ne, j, out->ne);

    if (!t->view_src) {
        /* a whole tensor keeps its own layout on every device (a scheduler's copy of a
         * permuted view is not contiguous); a slice is stored contiguously */
        if (loom_split_axis_is_dim(state->axis))
            contiguous_nb(t->type, out->ne, out->nb);
        else
            memcpy(out->nb, t->nb, sizeof out->nb);
        if (!t->buffer || !t->data)
            return loom_error(LOOM_ERR_INVALID_ARG, "meta: tensor '%s' is not allocated", t->name);
        if (t->buffer->iface != &loom__meta_buffer_i && loom_buffer_buft(t->buffer) == &md->buft &&
            loom_buffer_size(t->buffer) == 0) {
            /* a zero-size buffer of this type (nothing but empty tensors): no memory */
            out->buffer = NULL;
            out->data = NULL;
            return LOOM_OK;
        }
        if (t->buffer->iface != &loom__meta_buffer_i)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "meta: tensor '%s' lives in %s, not in a buffer of %s", t->name,
                              loom_buffer_name(t->buffer), md->name);
        meta_buffer *mb = t->buffer->context;
        size_t off = (size_t)((const char *)t->data - (const char *)loom_buffer_base(t->buffer));
        size_t bytes = loom_split_axis_is_dim(state->axis)
                           ? loom_split_state_slice_nbytes(state, t, j)
                           : loom_nbytes(t);
        loom_status st = loom__meta_member_offset(mb, t, off, j, bytes, &off);
        if (st) return st;
        out->buffer = mb->bufs[j];
        out->data = (char *)loom_buffer_base(mb->bufs[j]) + off;
        return LOOM_OK;
    }

    LOOM_ASSERT(vsrc_dev != NULL);
    const loom_tensor *src = t->view_src;
    out->buffer = vsrc_dev->buffer;
    loom_split_state ss;
    loom_status st = LOOM_OK;
    if (vsrc_state)
        ss = *vsrc_state;
    else if ((st = loom__meta_state(md, src, true, &ss)))
        return st;
    if (!loom_split_axis_is_dim(ss.axis)) {
        /* the owner is whole on every device: the view is too */
        memcpy(out->ne, t->ne, sizeof out->ne);
        memcpy(out->nb, t->nb, sizeof out->nb);
        out->data = (char *)vsrc_dev->data + t->view_offs;
        return LOOM_OK;
    }
    size_t snb[4];
    contiguous_nb(src->type, src->ne, snb);
    const int a = (int)ss.axis;
    const int64_t blck = a == 0 ? loom_blck_size(src->type) : 1;
    int64_t extent = 1; /* elements of the owner's axis a the view spans */
    for (int d = 0; d < 4; d++) {
        int64_t c[4];
        if (t->ne[d] == 1) { /* the stride of a dimension of extent 1 is never used */
            out->nb[d] = d == 0 ? t->nb[0] : out->nb[d - 1] * (size_t)out->ne[d - 1];
            continue;
        }
        if (!decompose(t->nb[d], src->ne, snb, c))
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "meta: view '%s': stride nb[%d] = %zu is not a whole step of '%s'",
                              t->name, d, t->nb[d], src->name);
        out->nb[d] = recompose(c, vsrc_dev->nb);
        extent += (t->ne[d] - 1) * c[a] * blck;
    }
    if (a == 0 && blck > 1) extent += blck - 1; /* the last block is whole */
    int64_t i[4];
    if (!decompose(t->view_offs, src->ne, snb, i))
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "meta: view '%s': offset %zu is not a whole step of '%s'", t->name,
                          t->view_offs, src->name);
    int64_t start = i[a] * blck;
    if (start + extent > src->ne[a]) extent = src->ne[a] - start;
    loom_split_state sub;
    int64_t dev_start[LOOM_SPLIT_MAX_DEVICES];
    st = loom_split_state_sub(&ss, start, extent, &sub, dev_start);
    if (st) return loom_error(st, "meta: view '%s' of '%s': %s", t->name, src->name, loom_last_error());
    i[a] = dev_start[j] / blck;
    out->data = (char *)vsrc_dev->data + recompose(i, vsrc_dev->nb);
    return LOOM_OK;
}
