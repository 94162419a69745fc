/*
 * Twins: the loom header of every ggml tensor the bridge touches, and the translation of
 * ggml's ops into loom's.
 *
 * A twin is made by loom's own op builder from the twins of the ggml tensor's sources, then
 * checked against the ggml tensor (type, shape, strides, address): what a builder refuses,
 * or builds differently, is an op loom cannot run as ggml means it, and the bridge says so
 * (supports_op false, so ggml's scheduler runs it on the CPU). Twins live in a per-device
 * table keyed by the ggml tensor's address; a record is reused while the ggml tensor and
 * the records of its sources are unchanged (a fingerprint of every field a twin is made
 * from, and the sources' versions), which is what makes a token's graph cheap after the
 * first and keeps one header per tensor for loom's caches.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml/bridge.h"
#include "loom/meta.h"

#define LG_CHUNK 256
#define LG_SCRATCH (64 * 1024)
#define LG_MAX_DEPTH 100000

struct lg_twin {
    const struct ggml_tensor *key;
    struct ggml_tensor seen;        /* the ggml tensor when the twin was made */
    struct lg_twin *src[GGML_MAX_SRC];
    uint64_t src_version[GGML_MAX_SRC];
    struct lg_twin *view;           /* the record of seen.view_src */
    uint64_t view_version;
    uint64_t version; /* bumped whenever t is remade */
    uint64_t pass;    /* the last pass that validated it */
    uint64_t in_graph; /* the last graph_compute pass that ran it */
    bool ok;
    bool probed; /* made for supports_op: tensors placed elsewhere are whole copies */
    const void *owner_ctx; /* the storage owner's buffer context (a probe buffer has none) */
    char err[256];
    loom_tensor t;
};

struct lg_chunk {
    struct lg_chunk *next;
    size_t used;
    lg_twin recs[LG_CHUNK];
};

/* ---------------------------------------------------------------- table */

static size_t hash_ptr(const void *p, size_t n) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (n - 1);
}

static lg_twin *lookup(lg_device *d, const struct ggml_tensor *t) {
    if (!d->n_slots) return NULL;
    for (size_t i = hash_ptr(t, d->n_slots);; i = (i + 1) & (d->n_slots - 1)) {
        lg_twin *r = d->slots[i];
        if (!r) return NULL;
        if (r->key == t) return r;
    }
}

static bool grow(lg_device *d) {
    size_t n = d->n_slots ? d->n_slots * 2 : 1024;
    lg_twin **s = calloc(n, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < d->n_slots; i++) {
        lg_twin *r = d->slots[i];
        if (!r) continue;
        size_t j = hash_ptr(r->key, n);
        while (s[j]) j = (j + 1) & (n - 1);
        s[j] = r;
    }
    free(d->slots);
    d->slots = s;
    d->n_slots = n;
    return true;
}

static lg_twin *insert(lg_device *d, const struct ggml_tensor *t) {
    if ((d->n_used + 1) * 2 > d->n_slots && !grow(d)) return NULL;
    if (!d->chunks || d->chunks->used == LG_CHUNK) {
        struct lg_chunk *c = calloc(1, sizeof *c);
        if (!c) return NULL;
        c->next = d->chunks;
        d->chunks = c;
    }
    lg_twin *r = &d->chunks->recs[d->chunks->used++];
    memset(r, 0, sizeof *r);
    r->key = t;
    size_t i = hash_ptr(t, d->n_slots);
    while (d->slots[i]) i = (i + 1) & (d->n_slots - 1);
    d->slots[i] = r;
    d->n_used++;
    return r;
}

void lg_twin_clear(lg_device *d) {
    if (d->n_slots) memset(d->slots, 0, d->n_slots * sizeof *d->slots);
    d->n_used = 0;
    for (struct lg_chunk *c = d->chunks; c; c = c->next) c->used = 0;
    /* keep one chunk for reuse, free the rest */
    if (d->chunks) {
        struct lg_chunk *c = d->chunks->next;
        d->chunks->next = NULL;
        while (c) {
            struct lg_chunk *n = c->next;
            free(c);
            c = n;
        }
    }
}

/* ---------------------------------------------------------------- translation */

static bool to_loom_type(enum ggml_type t, loom_type *out) {
    if ((int)t < 0 || !loom_type_traits_get((int)t)) return false;
    *out = (loom_type)t;
    return true;
}

static float param_f32(const struct ggml_tensor *t, int i) {
    float f;
    memcpy(&f, &t->op_params[i], sizeof f);
    return f;
}

/* A leaf header with t's type, shape, strides and name (no storage). */
static loom_tensor *leaf_named(loom_ctx *c, const struct ggml_tensor *t, bool copy);
static loom_tensor *leaf(loom_ctx *c, const struct ggml_tensor *t) {
    return leaf_named(c, t, false);
}

/* The same for a whole copy of t, as ggml's scheduler brings a tensor placed elsewhere: its
 * name ("copy of NAME") matches no split rule, so loom sees it MIRRORED. */
static loom_tensor *copy_leaf(loom_ctx *c, const struct ggml_tensor *t) {
    return leaf_named(c, t, true);
}

static loom_tensor *leaf_named(loom_ctx *c, const struct ggml_tensor *t, bool copy) {
    loom_type ty;
    if (!to_loom_type(t->type, &ty)) {
        loom_error(LOOM_ERR_UNSUPPORTED, "'%s': ggml type %s is not a loom type", t->name,
                   ggml_type_name(t->type));
        return NULL;
    }
    loom_tensor *x = loom_new_tensor_4d(c, ty, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    if (!x) return NULL;
    for (int i = 0; i < 4; i++) x->nb[i] = t->nb[i];
    if (copy) loom_format_name(x, "copy of %s", t->name);
    else loom_set_name(x, t->name);
    return x;
}

static loom_glu_op glu_map(enum ggml_glu_op op, bool *ok) {
    *ok = true;
    switch (op) {
    case GGML_GLU_OP_SWIGLU: return LOOM_GLU_SWIGLU;
    case GGML_GLU_OP_GEGLU: return LOOM_GLU_GEGLU;
    default: *ok = false; return LOOM_GLU_SWIGLU;
    }
}

/* t's source i, or NULL: ggml_cast makes a CPY whose second source is the result itself
 * (the destination of the copy), which is no input and no tensor to make a twin of. */
static const struct ggml_tensor *src_of(const struct ggml_tensor *t, int i) {
    return t->src[i] == t ? NULL : t->src[i];
}

/* Whether loom's quantiser into `type` gives ggml's bits: the legacy types round the same
 * way; IQ4_NL (ggml searches its scale, loom rounds to nearest), the K-quants, IQ4_XS and
 * MXFP4 are not claimed, so writes into them run on ggml's CPU. */
static bool same_quantiser(enum ggml_type type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_I32:
        return true;
    default: return false;
    }
}

/* The loom node computing what t computes, built in c from s (the twins of t's sources).
 * NULL with loom_last_error when loom has no such op or the builder refuses it. */
static loom_tensor *build(loom_ctx *c, const struct ggml_tensor *t, loom_tensor **s) {
    const char *op = ggml_op_desc(t);
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (src_of(t, i) && !s[i]) {
            loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': source %d has no loom twin", op, t->name, i);
            return NULL;
        }
    }
    loom_tensor *a = s[0], *b = s[1];
    if ((t->op == GGML_OP_CPY || t->op == GGML_OP_DUP || t->op == GGML_OP_CONT ||
         t->op == GGML_OP_SET_ROWS) &&
        !same_quantiser(t->type)) {
        loom_error(LOOM_ERR_UNSUPPORTED,
                   "%s '%s': loom's quantiser into %s does not give ggml's bits", op, t->name,
                   ggml_type_name(t->type));
        return NULL;
    }
    switch (t->op) {
    case GGML_OP_DUP: return loom_dup(c, a);
    case GGML_OP_CPY: {
        loom_type ty;
        if (t->src[1] != t) return loom_cpy(c, a, b);
        if (!to_loom_type(t->type, &ty)) {
            loom_error(LOOM_ERR_UNSUPPORTED, "CPY '%s': ggml type %s is not a loom type",
                       t->name, ggml_type_name(t->type));
            return NULL;
        }
        return loom_cast(c, a, ty); /* ggml_cast: the result is its own destination */
    }
    case GGML_OP_CONT: return loom_cont_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    case GGML_OP_ADD: return loom_add(c, a, b);
    case GGML_OP_SUB: return loom_sub(c, a, b);
    case GGML_OP_MUL: return loom_mul(c, a, b);
    case GGML_OP_DIV: return loom_div(c, a, b);
    case GGML_OP_ADD_ID: return loom_add_id(c, a, b, s[2]);
    case GGML_OP_SCALE: return loom_scale_bias(c, a, param_f32(t, 0), param_f32(t, 1));
    case GGML_OP_SQR: return loom_sqr(c, a);
    case GGML_OP_SQRT: return loom_sqrt(c, a);
    case GGML_OP_SUM_ROWS: return loom_sum_rows(c, a);
    case GGML_OP_MEAN: return loom_mean(c, a);
    case GGML_OP_ARGMAX: return loom_argmax(c, a);
    case GGML_OP_NORM: return loom_norm(c, a, param_f32(t, 0));
    case GGML_OP_RMS_NORM: return loom_rms_norm(c, a, param_f32(t, 0));
    case GGML_OP_MUL_MAT: return loom_mul_mat(c, a, b);
    case GGML_OP_MUL_MAT_ID: return loom_mul_mat_id(c, a, b, s[2]);
    case GGML_OP_GET_ROWS: return loom_get_rows(c, a, b);
    case GGML_OP_SET_ROWS: {
        /* ggml: src0 the rows, src1 the ids, the destination is what the result views */
        loom_tensor *dst = s[2];
        if (!dst) {
            loom_error(LOOM_ERR_UNSUPPORTED, "SET_ROWS '%s': no destination source", t->name);
            return NULL;
        }
        return loom_set_rows(c, dst, a, b);
    }
    case GGML_OP_RESHAPE: return loom_reshape_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    case GGML_OP_VIEW: {
        /* the offset from a's first element (both share one storage owner) */
        size_t offs = t->view_offs - (t->src[0]->view_src ? t->src[0]->view_offs : 0);
        return loom_view_4d(c, a, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[1], t->nb[2],
                            t->nb[3], offs);
    }
    case GGML_OP_PERMUTE:
        return loom_permute(c, a, t->op_params[0], t->op_params[1], t->op_params[2],
                            t->op_params[3]);
    case GGML_OP_TRANSPOSE: return loom_transpose(c, a);
    case GGML_OP_SOFT_MAX:
        return loom_soft_max_ext(c, a, s[1], s[2], param_f32(t, 0), param_f32(t, 1));
    case GGML_OP_ROPE: {
        const int n_dims = t->op_params[1], mode = t->op_params[2];
        const float ext_factor = param_f32(t, 7), attn_factor = param_f32(t, 8);
        if ((mode != 0 && mode != 2) || ext_factor != 0.0f || attn_factor != 1.0f ||
            t->op_params[15] != 0) {
            loom_error(LOOM_ERR_UNSUPPORTED,
                       "ROPE '%s': mode %d, ext_factor %g, attn_factor %g (loom's ROPE takes the "
                       "normal and neox modes without YaRN terms)",
                       t->name, mode, ext_factor, attn_factor);
            return NULL;
        }
        return loom_rope_ext(c, a, b, s[2], n_dims, mode, param_f32(t, 5), param_f32(t, 6));
    }
    case GGML_OP_FLASH_ATTN_EXT:
        if (t->op_params[4] != 0) {
            loom_error(LOOM_ERR_UNSUPPORTED, "FLASH_ATTN_EXT '%s': n_kv_max %d", t->name,
                       t->op_params[4]);
            return NULL;
        }
        return loom_flash_attn_ext(c, a, b, s[2], s[3], s[4], param_f32(t, 0), param_f32(t, 1),
                                   param_f32(t, 2));
    case GGML_OP_CONCAT: return loom_concat(c, a, b, t->op_params[0]);
    case GGML_OP_UNARY:
        switch (ggml_get_unary_op(t)) {
        case GGML_UNARY_OP_SILU: return loom_unary(c, a, LOOM_UNARY_SILU);
        case GGML_UNARY_OP_GELU: return loom_unary(c, a, LOOM_UNARY_GELU);
        case GGML_UNARY_OP_RELU: return loom_unary(c, a, LOOM_UNARY_RELU);
        default: break;
        }
        break;
    case GGML_OP_GLU: {
        bool ok;
        loom_glu_op g = glu_map(ggml_get_glu_op(t), &ok);
        const bool swapped = t->op_params[1] != 0;
        if (!ok) break;
        if (b) {
            if (swapped) break;
            return loom_glu_split(c, a, b, g);
        }
        return loom_glu(c, a, g, swapped);
    }
    case GGML_OP_ARGSORT:
        return loom_argsort(c, a, t->op_params[0] == GGML_SORT_ORDER_DESC ? LOOM_SORT_DESC
                                                                          : LOOM_SORT_ASC);
    case GGML_OP_TOP_K: return loom_top_k(c, a, (int)t->ne[0]);
    case GGML_OP_CLAMP: return loom_clamp(c, a, param_f32(t, 0), param_f32(t, 1));
    case GGML_OP_FILL: return loom_fill(c, a, param_f32(t, 0));
    default: break;
    }
    loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': no loom op does what ggml's does", op, t->name);
    return NULL;
}

/* x (built) matches t: type, shape and strides. */
static bool matches(const loom_tensor *x, const struct ggml_tensor *t) {
    if ((int)x->type != (int)t->type) {
        loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': loom makes %s, ggml %s", ggml_op_desc(t),
                   t->name, loom_type_name(x->type), ggml_type_name(t->type));
        return false;
    }
    for (int i = 0; i < 4; i++) {
        if (x->ne[i] != t->ne[i] || (t->ne[i] > 1 && x->nb[i] != t->nb[i])) {
            loom_error(LOOM_ERR_UNSUPPORTED,
                       "%s '%s': loom's result has another shape or layout than ggml's "
                       "(dim %d: ne %lld/%lld, nb %zu/%zu)",
                       ggml_op_desc(t), t->name, i, (long long)x->ne[i], (long long)t->ne[i],
                       x->nb[i], t->nb[i]);
            return false;
        }
    }
    return true;
}

/* ---------------------------------------------------------------- twins */

static bool same_tensor(const struct ggml_tensor *a, const struct ggml_tensor *b) {
    return a->type == b->type && a->buffer == b->buffer && a->op == b->op &&
           a->view_src == b->view_src && a->view_offs == b->view_offs && a->data == b->data &&
           memcmp(a->ne, b->ne, sizeof a->ne) == 0 && memcmp(a->nb, b->nb, sizeof a->nb) == 0 &&
           memcmp(a->op_params, b->op_params, sizeof a->op_params) == 0 &&
           memcmp(a->src, b->src, sizeof a->src) == 0 && strcmp(a->name, b->name) == 0;
}

static bool is_view_op(enum ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

/* The tensor whose storage t uses (t itself unless it is a view). */
static const struct ggml_tensor *storage_of(const struct ggml_tensor *t) {
    return t->view_src ? t->view_src : t;
}

/* buf is of this device's type: one of its buffers, or the zero-size buffer (no context)
 * ggml makes to probe a weight. */
static bool our_type(const lg_device *d, const struct ggml_backend_buffer *buf) {
    return buf && buf->buft == &d->gbuft;
}

static bool probe_buffer(const lg_device *d, const struct ggml_backend_buffer *buf) {
    return our_type(d, buf) && !buf->context;
}

/* The result an unplaced chain of views of t looks at (t itself if it is no such view). */
static const struct ggml_tensor *through_views(const struct ggml_tensor *t) {
    while (t && !t->buffer && is_view_op(t->op) && t->src[0]) t = t->src[0];
    return t;
}

/* Remakes r->t from t and the records of its sources. */
/* r->t becomes a storage-less whole copy of t (supports_op's view of a tensor computed or
 * placed elsewhere: ggml's scheduler copies it in whole). Frees c. */
static loom_status take_whole_copy(lg_twin *r, loom_ctx *c, const struct ggml_tensor *t) {
    loom_tensor *x = copy_leaf(c, t);
    if (x) r->t = *x;
    loom_ctx_free(c);
    return x ? LOOM_OK : loom_last_status();
}

static loom_status remake(lg_device *d, lg_twin *r, const struct ggml_tensor *t) {
    memset(&r->t, 0, sizeof r->t);
    /* an unallocated tensor (ggml's scheduler asking supports_op before it allocates) gets a
     * twin without storage: enough for loom to derive its split state */
    const struct ggml_tensor *owner = storage_of(t);
    const bool unallocated = !owner->buffer;
    const bool elsewhere = !unallocated && !lg_buffer_is_ours(d, owner->buffer);
    if (elsewhere && !d->probing) {
        return loom_error(LOOM_ERR_INVALID_ARG, "'%s' (%s) is not in a %s buffer", t->name,
                          ggml_op_desc(t), d->name);
    }
    char scratch[LG_SCRATCH] __attribute__((aligned(64)));
    loom_ctx *c = loom_ctx_new((loom_ctx_params){sizeof scratch, scratch, true});
    if (!c) return loom_last_status();
    /* placed elsewhere (a CPU input, the token embeddings): whatever made it */
    if (elsewhere) return take_whole_copy(r, c, t);
    const lg_buffer *lb = unallocated ? NULL : owner->buffer->context;
    loom_tensor *x = NULL;
    if (t->op == GGML_OP_NONE && t->view_src) {
        /* ggml_view_tensor: a view without an op (whisper.cpp's encoder reads the
         * convolution's output so), the same bytes under another header */
        if (!r->view) {
            loom_ctx_free(c);
            return loom_error(LOOM_ERR_UNSUPPORTED, "'%s': a view of a tensor without a twin",
                              t->name);
        }
        x = loom_view_4d(c, &r->view->t, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[1],
                         t->nb[2], t->nb[3], t->view_offs);
        if (x && !matches(x, t)) x = NULL;
    } else if (t->op == GGML_OP_NONE) {
        x = leaf(c, t);
    } else {
        loom_tensor *s[GGML_MAX_SRC] = {0};
        for (int i = 0; i < GGML_MAX_SRC; i++) s[i] = r->src[i] ? &r->src[i]->t : NULL;
        x = build(c, t, s);
        if (x && !matches(x, t)) x = NULL;
        /* every source the result refers to must be a twin of the table, not a helper the
         * builder made in the scratch arena */
        for (int i = 0; x && i < LOOM_MAX_SRC; i++) {
            if (!x->src[i]) continue;
            bool known = false;
            for (int k = 0; k < GGML_MAX_SRC; k++) known |= s[k] == x->src[i];
            if (!known) {
                loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': loom builds it from a helper node",
                           ggml_op_desc(t), t->name);
                x = NULL;
            }
        }
        if (x && x->view_src && (!r->view || x->view_src != &r->view->t)) {
            loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': loom's result views another tensor",
                       ggml_op_desc(t), t->name);
            x = NULL;
        }
    }
    /* loom cannot compute it: ggml's scheduler will, elsewhere */
    if (!x && d->probing && t->op != GGML_OP_NONE) return take_whole_copy(r, c, t);
    if (!x) {
        loom_status st = loom_last_status();
        loom_ctx_free(c);
        return st ? st : LOOM_ERR_UNSUPPORTED;
    }
    r->t = *x;
    loom_ctx_free(c);
    loom_set_name(&r->t, t->name);
    r->t.buffer = NULL;
    r->t.data = NULL;
    r->t.extra = NULL;
    r->t.flags = 0;
    if (owner->buffer && owner->buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        r->t.flags |= LOOM_TENSOR_FLAG_PARAM;
    if (unallocated) return LOOM_OK;
    loom_status st;
    if (r->t.view_src) {
        st = loom_buffer_init_view(&r->t);
    } else {
        st = loom_buffer_alloc_tensor(lb->lb, &r->t, (size_t)((char *)t->data - lb->base));
    }
    if (st) return st;
    if (r->t.data != t->data) {
        return loom_error(LOOM_ERR_INTERNAL, "'%s': loom places it at %p, ggml at %p", t->name,
                          r->t.data, t->data);
    }
    return LOOM_OK;
}

static lg_twin *get_rec(lg_device *d, const struct ggml_tensor *t, int depth) {
    lg_twin *r = lookup(d, t);
    if (r && r->pass == d->pass) {
        if (!r->ok) loom_error(LOOM_ERR_UNSUPPORTED, "%s", r->err);
        return r->ok ? r : NULL;
    }
    if (depth > LG_MAX_DEPTH) {
        loom_error(LOOM_ERR_UNSUPPORTED, "'%s': sources nested too deep", t->name);
        return NULL;
    }
    lg_twin *src[GGML_MAX_SRC] = {0}, *view = NULL;
    bool ok = true;
    char err[256] = "";
    for (int i = 0; i < GGML_MAX_SRC && ok; i++) {
        if (src_of(t, i) && !(src[i] = get_rec(d, t->src[i], depth + 1))) ok = false;
    }
    if (ok && t->view_src && !(view = get_rec(d, t->view_src, depth + 1))) ok = false;
    if (!ok) snprintf(err, sizeof err, "%s", loom_last_error());
    if (!r && !(r = insert(d, t))) {
        loom_error(LOOM_ERR_NOMEM, "'%s': no memory for its twin", t->name);
        return NULL;
    }
    const struct ggml_tensor *owner = storage_of(t);
    const void *owner_ctx = owner->buffer ? owner->buffer->context : NULL;
    bool fresh = ok && r->ok && r->version && r->probed == d->probing &&
                 r->owner_ctx == owner_ctx && same_tensor(&r->seen, t) &&
                 r->view == view &&
                 (!view || r->view_version == view->version);
    for (int i = 0; fresh && i < GGML_MAX_SRC; i++) {
        fresh = r->src[i] == src[i] && (!src[i] || r->src_version[i] == src[i]->version);
    }
    r->pass = d->pass;
    if (fresh) return r;
    r->seen = *t;
    r->probed = d->probing;
    r->owner_ctx = owner_ctx;
    r->view = view;
    r->view_version = view ? view->version : 0;
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        r->src[i] = src[i];
        r->src_version[i] = src[i] ? src[i]->version : 0;
    }
    r->version++;
    r->ok = ok && remake(d, r, t) == LOOM_OK;
    if (ok && !r->ok) snprintf(err, sizeof err, "%s", loom_last_error());
    snprintf(r->err, sizeof r->err, "%s", err);
    if (!r->ok) loom_error(LOOM_ERR_UNSUPPORTED, "%s", r->err);
    return r->ok ? r : NULL;
}

loom_tensor *lg_twin_get(lg_device *d, const struct ggml_tensor *t) {
    d->pass++;
    lg_twin *r = get_rec(d, t, 0);
    return r ? &r->t : NULL;
}

/* ---------------------------------------------------------------- supports_op */

/* Whether the device accepts op over the sources s (twins) after loom's builder made it. */
static bool accepts(lg_device *d, loom_ctx *c, const struct ggml_tensor *op, loom_tensor **s) {
    loom_tensor *x = build(c, op, s);
    bool ok = x && matches(x, op) && loom_dev_supports_op(d->dev, x);
    if (!ok && d->debug) {
        lg_log("%s refuses %s '%s': %s", d->name, ggml_op_desc(op), op->name,
               x ? (loom_last_error()[0] ? loom_last_error() : "the device refuses it")
                 : loom_last_error());
        for (int i = 0; i < GGML_MAX_SRC && loom_dev_is_meta(d->dev); i++) {
            if (!s[i]) continue;
            loom_split_state st;
            loom_status e = loom_meta_tensor_state(d->dev, s[i], true, &st);
            lg_log("  src %d '%s' op %s buffer %p: state %d (%s)", i, s[i]->name,
                   loom_op_name(s[i]->op), (void *)s[i]->buffer, e ? -1 : (int)st.axis,
                   e ? loom_last_error() : "");
            for (const loom_tensor *v = s[i]; v && v->src[0]; v = v->src[0]) {
                e = loom_meta_tensor_state(d->dev, v->src[0], true, &st);
                lg_log("    <- '%s' op %s buffer %p: state %d", v->src[0]->name,
                       loom_op_name(v->src[0]->op), (void *)v->src[0]->buffer, e ? -1 : (int)st.axis);
            }
        }
    }
    return ok;
}

/* ggml's scheduler will run t here: t reads a tensor already placed in this device's memory
 * (a weight, the cache), or every result it reads is itself anchored (a GLU of two expert
 * matmuls), and the device accepts t. Bounded depth; called with d->lock held (recursive). */
static bool anchored(lg_device *d, const struct ggml_tensor *t) {
    if (is_view_op(t->op) || t->op == GGML_OP_NONE || d->anchor_depth >= 3) return false;
    bool weight = false, all = true, any = false;
    d->anchor_depth++;
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        const struct ggml_tensor *s = src_of(t, i);
        if (!s) continue;
        const struct ggml_tensor *owner = storage_of(s);
        if (our_type(d, owner->buffer) && owner->op == GGML_OP_NONE) {
            weight = true;
            break;
        }
        const struct ggml_tensor *r = through_views(s);
        if (r->op == GGML_OP_NONE || r->buffer) continue; /* an input: placed by ggml */
        any = true;
        if (!anchored(d, r)) all = false;
    }
    d->anchor_depth--;
    return (weight || (any && all)) && lg_supports_op(d, t);
}

bool lg_supports_op(lg_device *d, const struct ggml_tensor *op) {
    if (d->wrapped) return false;
    /* llama.cpp's probe of rope_freqs.weight: a ROPE with every parameter 0 over a weight in
     * a zero-size buffer of ours; the question is whether the factors may live here */
    if (op->op == GGML_OP_ROPE && op->src[2] && probe_buffer(d, op->src[2]->buffer))
        return op->src[2]->type == GGML_TYPE_F32;
    for (int i = 0; d->owns_meta && i < GGML_MAX_SRC; i++) {
        const struct ggml_tensor *s = src_of(op, i);
        if (s && s->op == GGML_OP_NONE && our_type(d, s->buffer) && lg_weight_sliced(d, s))
            return false;
    }
    /* views and leaves are metadata: ggml asks about them for every tensor it places (the
     * KV cache among them), and a device that refuses them cannot hold such tensors */
    if (op->op == GGML_OP_NONE || is_view_op(op->op)) {
        loom_type ty;
        const struct ggml_tensor *owner = storage_of(op);
        /* ggml's probe buffers are of our type; ggml's own meta device (-sm tensor) asks
         * about tensors of its buffers, whose slices are in ours */
        if (!to_loom_type(op->type, &ty) ||
            (owner->buffer && !our_type(d, owner->buffer) &&
             !ggml_backend_buffer_is_meta(owner->buffer)))
            return false;
        /* a view of a result this device will not compute stays with that result: ggml's
         * scheduler would otherwise hand this device a view of another backend's memory */
        const struct ggml_tensor *a = through_views(op->src[0]);
        return !a || a->buffer || a->op == GGML_OP_NONE || lg_supports_op(d, a);
    }
    /* ggml's scheduler asks before it knows where each source will be computed. A source
     * computed here has the split state its op chain derives; one computed elsewhere
     * arrives as a whole copy. The op is accepted only if loom runs it either way, so the
     * graph the scheduler hands over always runs. */
    bool ok = false;
    pthread_mutex_lock(&d->lock);
    char scratch[LG_SCRATCH] __attribute__((aligned(64)));
    loom_ctx *c = loom_ctx_new((loom_ctx_params){sizeof scratch, scratch, true});
    if (c) {
        loom_tensor *derived[GGML_MAX_SRC] = {0}, *whole[GGML_MAX_SRC] = {0};
        bool have = true, any_computed = false;
        d->pass++;
        const bool was_probing = d->probing;
        d->probing = true;
        for (int i = 0; i < GGML_MAX_SRC && have; i++) {
            const struct ggml_tensor *src = src_of(op, i);
            if (!src) continue;
            const struct ggml_tensor *owner = storage_of(src);
            /* a weight in ggml's zero-size probe buffer: llama.cpp asks whether this
             * device can hold it for an op of that kind, over made-up operands; the
             * question is the op's, so the weight counts whole (a split weight meets
             * operands split to match in the real graph) */
            lg_twin *r = NULL;
            if (lg_buffer_is_ours(d, owner->buffer) || !owner->buffer) r = get_rec(d, src, 0);
            whole[i] = copy_leaf(c, src);
            /* placed in our memory already (weights, cache, a view of them): no choice */
            const bool placed = owner->buffer != NULL;
            derived[i] = r ? &r->t : whole[i];
            if (placed && r) whole[i] = derived[i];
            /* a result computed from a weight of this device is computed here (ggml's
             * scheduler runs an op next to its weights) when this device accepts it: it has
             * the derived state, not a whole copy's */
            if (!placed && r && src->op != GGML_OP_NONE) {
                if (anchored(d, src)) whole[i] = derived[i];
                else any_computed = true;
            }
            have = whole[i] && derived[i];
        }
        d->probing = was_probing;
        ok = have && accepts(d, c, op, derived) && (!any_computed || accepts(d, c, op, whole));
        loom_ctx_free(c);
    }
    pthread_mutex_unlock(&d->lock);
    return ok;
}

/* ---------------------------------------------------------------- graph_compute */

/* t's counter in d->op_nodes: its op, or its unary / GLU op after the plain ones. */
static int op_slot(const struct ggml_tensor *t) {
    if (t->op == GGML_OP_UNARY) return GGML_OP_COUNT + (int)ggml_get_unary_op(t);
    if (t->op == GGML_OP_GLU) return GGML_OP_COUNT + GGML_UNARY_OP_COUNT + (int)ggml_get_glu_op(t);
    return (int)t->op;
}

static const char *slot_name(int i) {
    if (i < GGML_OP_COUNT) return ggml_op_name((enum ggml_op)i);
    i -= GGML_OP_COUNT;
    if (i < GGML_UNARY_OP_COUNT) return ggml_unary_op_name((enum ggml_unary_op)i);
    return ggml_glu_op_name((enum ggml_glu_op)(i - GGML_UNARY_OP_COUNT));
}

void lg_log_op_stats(const lg_device *d) {
    enum { N = GGML_OP_COUNT + GGML_UNARY_OP_COUNT + GGML_GLU_OP_COUNT };
    bool done[N] = {0};
    uint64_t total = 0;
    for (int i = 0; i < N; i++) total += d->op_nodes[i];
    char line[2048];
    int len = snprintf(line, sizeof line, "%s ran %llu nodes in %llu graphs", d->name,
                       (unsigned long long)total, (unsigned long long)d->graphs_run);
    for (int k = 0; len < (int)sizeof line; k++) {
        int best = -1;
        for (int i = 0; i < N; i++) {
            if (!done[i] && d->op_nodes[i] && (best < 0 || d->op_nodes[i] > d->op_nodes[best]))
                best = i;
        }
        if (best < 0) break;
        done[best] = true;
        len += snprintf(line + len, sizeof line - (size_t)len, "%s %s %llu", k ? "," : ":",
                        slot_name(best), (unsigned long long)d->op_nodes[best]);
    }
    lg_log("%s", line);
}

enum ggml_status lg_graph_compute(lg_device *d, loom_backend_t b, struct ggml_cgraph *g,
                                  loom_graph **graph, loom_ctx **graph_ctx) {
    const int n = ggml_graph_n_nodes(g);
    pthread_mutex_lock(&d->lock);
    if (!*graph || (*graph)->size < n) {
        loom_ctx_free(*graph_ctx);
        size_t cap = (size_t)(n < 1024 ? 1024 : n * 2);
        *graph_ctx = loom_ctx_new((loom_ctx_params){loom_graph_overhead(cap) + 4096, NULL, true});
        *graph = *graph_ctx ? loom_graph_new(*graph_ctx, cap) : NULL;
        if (!*graph) {
            pthread_mutex_unlock(&d->lock);
            lg_log("%s: no memory for a graph of %d nodes", d->name, n);
            return GGML_STATUS_ALLOC_FAILED;
        }
    }
    loom_graph *lg = *graph;
    loom_graph_clear(lg);
    d->pass++;
    const uint64_t pass = d->pass;
    enum ggml_status ret = GGML_STATUS_SUCCESS;
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *t = ggml_graph_node(g, i);
        if (!(t->flags & GGML_TENSOR_FLAG_COMPUTE)) continue; /* its inputs are never filled */
        /* a view computes nothing: one of another backend's memory (ggml's scheduler puts
         * such views in any split) is that backend's business, and whoever reads it here
         * gets a copy */
        if ((is_view_op(t->op) || t->op == GGML_OP_NONE) && !lg_buffer_is_ours(d, storage_of(t)->buffer))
            continue;
        if (ggml_nelements(t) == 0) continue; /* an empty batch: nothing to compute */
        lg_twin *r = get_rec(d, t, 0);
        if (!r) {
            lg_log("%s: graph node %d (%s '%s'): %s", d->name, i, ggml_op_desc(t), t->name,
                   loom_last_error());
            ret = GGML_STATUS_FAILED;
            break;
        }
        r->in_graph = pass;
        d->op_nodes[op_slot(t)]++;
        r->t.flags = (r->t.flags & LOOM_TENSOR_FLAG_PARAM) | LOOM_TENSOR_FLAG_COMPUTE |
                     LOOM_TENSOR_FLAG_EXTERNAL;
        if (t->flags & GGML_TENSOR_FLAG_INPUT) r->t.flags |= LOOM_TENSOR_FLAG_INPUT;
        if (t->flags & GGML_TENSOR_FLAG_OUTPUT) r->t.flags |= LOOM_TENSOR_FLAG_OUTPUT;
        if (loom_graph_add_node(lg, &r->t) != LOOM_OK) {
            lg_log("%s: graph of %d nodes: %s", d->name, n, loom_last_error());
            ret = GGML_STATUS_FAILED;
            break;
        }
    }
    /* a node another node of this graph reads is not read outside it (as far as ggml's
     * scheduler lets us know: what it reads later it reads back through get_tensor, which
     * sees the true state), so its reduction may be delayed */
    for (int i = 0; ret == GGML_STATUS_SUCCESS && i < lg->n_nodes; i++) {
        loom_tensor *x = lg->nodes[i];
        for (int k = 0; k < LOOM_MAX_SRC; k++) {
            loom_tensor *s = x->src[k];
            if (!s) continue;
            const lg_twin *rs = (const lg_twin *)((const char *)s - offsetof(lg_twin, t));
            if (rs->in_graph == pass && !(s->flags & LOOM_TENSOR_FLAG_OUTPUT))
                s->flags &= ~LOOM_TENSOR_FLAG_EXTERNAL;
        }
    }
    if (ret == GGML_STATUS_SUCCESS && lg->n_nodes > 0) {
        d->graphs_run++;
        loom_status st = loom_backend_graph_compute(b, lg);
        if (st != LOOM_OK) {
            lg_log("%s: graph_compute (%d nodes): %s", d->name, lg->n_nodes, loom_last_error());
            ret = GGML_STATUS_FAILED;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return ret;
}
