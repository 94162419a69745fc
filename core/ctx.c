/*
 * ctx.c: the arena context. One block of memory holds a list of objects (tensor headers,
 * their data unless no_alloc, graphs), each starting on a 64-byte boundary, so a tensor
 * costs exactly loom_tensor_overhead() + its data rounded up to 64. Nothing is freed
 * individually: loom_ctx_free releases the whole arena.
 */
#include <stdio.h>

#include "core/core-impl.h"

enum loom__obj_kind { LOOM__OBJ_TENSOR = 1, LOOM__OBJ_GRAPH = 2 };

/* Header of every arena object; the payload follows it directly. */
typedef struct loom__obj {
    size_t offs; /* payload offset from the arena base */
    size_t size; /* bytes of this object, header included (multiple of 64) */
    struct loom__obj *next;
    int kind;
} loom__obj;

struct loom_ctx {
    uint8_t *mem;    /* arena base, 64-aligned */
    void *owned;     /* what loom_ctx_new allocated (NULL for caller memory) */
    size_t mem_size; /* usable bytes from mem */
    size_t used;     /* bytes used from mem (multiple of 64) */
    bool no_alloc;
    loom__obj *first;
    loom__obj *last;
};

/* The tensor header sits right after the object header; data starts at this offset. */
#define LOOM__TENSOR_OVERHEAD                                                                      \
    loom__align_up(sizeof(loom__obj) + sizeof(loom_tensor), LOOM__MEM_ALIGN)

size_t loom_tensor_overhead(void) {
    return LOOM__TENSOR_OVERHEAD;
}

loom_ctx *loom_ctx_new(loom_ctx_params params) {
    loom_ctx *ctx = loom_calloc(1, sizeof *ctx);
    if (!ctx) {
        loom_error(LOOM_ERR_NOMEM, "ctx_new: out of memory for the context object");
        return NULL;
    }
    ctx->no_alloc = params.no_alloc;
    if (params.mem_buffer) {
        uintptr_t base = (uintptr_t)params.mem_buffer;
        uintptr_t aligned = (base + LOOM__MEM_ALIGN - 1) & ~(uintptr_t)(LOOM__MEM_ALIGN - 1);
        size_t skip = (size_t)(aligned - base);
        ctx->mem = (uint8_t *)aligned;
        ctx->mem_size = params.mem_size > skip ? params.mem_size - skip : 0;
    } else if (params.mem_size > 0) {
        ctx->owned = loom_aligned_alloc(LOOM__MEM_ALIGN, params.mem_size);
        if (!ctx->owned) {
            loom_free(ctx);
            loom_error(LOOM_ERR_NOMEM, "ctx_new: cannot allocate an arena of %zu bytes",
                       params.mem_size);
            return NULL;
        }
        ctx->mem = ctx->owned;
        ctx->mem_size = params.mem_size;
    }
    return ctx;
}

void loom_ctx_free(loom_ctx *ctx) {
    if (!ctx) return;
    loom_aligned_free(ctx->owned);
    loom_free(ctx);
}

size_t loom_ctx_used(const loom_ctx *ctx) {
    return ctx ? ctx->used : 0;
}

bool loom_ctx_get_no_alloc(const loom_ctx *ctx) {
    return ctx->no_alloc;
}

void loom_ctx_set_no_alloc(loom_ctx *ctx, bool no_alloc) {
    ctx->no_alloc = no_alloc;
}

/* Reserves an object of `size` bytes (header included, rounded to 64); NULL if full
 * (no error recorded: the caller names what it wanted). */
static loom__obj *loom__ctx_alloc_obj(loom_ctx *ctx, size_t size, int kind) {
    size = loom__align_up(size, LOOM__MEM_ALIGN);
    if (size > ctx->mem_size - ctx->used) return NULL;
    loom__obj *obj = (loom__obj *)(ctx->mem + ctx->used);
    obj->offs = ctx->used + sizeof(loom__obj);
    obj->size = size;
    obj->next = NULL;
    obj->kind = kind;
    ctx->used += size;
    if (ctx->last)
        ctx->last->next = obj;
    else
        ctx->first = obj;
    ctx->last = obj;
    return obj;
}

void *loom__ctx_alloc_graph(loom_ctx *ctx, size_t payload, size_t *free_out) {
    loom__obj *obj = loom__ctx_alloc_obj(ctx, sizeof(loom__obj) + payload, LOOM__OBJ_GRAPH);
    if (!obj) {
        *free_out = ctx->mem_size - ctx->used;
        return NULL;
    }
    return obj + 1;
}

size_t loom__graph_obj_size(size_t payload) {
    return loom__align_up(sizeof(loom__obj) + payload, LOOM__MEM_ALIGN);
}

/* Bytes of a contiguous tensor of `type`/`ne`; false on overflow. */
static bool loom__data_size(loom_type type, const int64_t ne[LOOM_MAX_DIMS], size_t *out) {
    size_t n = loom_row_size(type, ne[0]);
    for (int i = 1; i < LOOM_MAX_DIMS; i++)
        if (__builtin_mul_overflow(n, (size_t)ne[i], &n)) return false;
    *out = n;
    return true;
}

loom_tensor *loom__new_tensor_impl(loom_ctx *ctx, loom_type type, int n_dims, const int64_t *ne_in,
                                   loom_tensor *view_src, size_t view_offs) {
    if (!ctx) {
        loom_error(LOOM_ERR_INVALID_ARG, "new_tensor: ctx is NULL");
        return NULL;
    }
    if (!loom_type_is_valid((int)type)) {
        loom_error(LOOM_ERR_TYPE, "new_tensor: %d is not a loom type", (int)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > LOOM_MAX_DIMS || !ne_in) {
        loom_error(LOOM_ERR_INVALID_ARG, "new_tensor: n_dims %d is not in [1, %d]", n_dims,
                   LOOM_MAX_DIMS);
        return NULL;
    }
    int64_t ne[LOOM_MAX_DIMS] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++) {
        if (ne_in[i] < 0) {
            loom_error(LOOM_ERR_SHAPE, "new_tensor: ne[%d] = %lld is negative", i,
                       (long long)ne_in[i]);
            return NULL;
        }
        ne[i] = ne_in[i];
    }
    const int64_t blck = loom_blck_size(type);
    if (ne[0] % blck != 0) {
        loom_error(LOOM_ERR_SHAPE, "new_tensor: %s needs ne[0] (%lld) to be a multiple of %lld",
                   loom_type_name(type), (long long)ne[0], (long long)blck);
        return NULL;
    }
    size_t data_size;
    if (!loom__data_size(type, ne, &data_size) || data_size > SIZE_MAX / 2) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "new_tensor: %s [%lld, %lld, %lld, %lld] is too large to address",
                   loom_type_name(type), (long long)ne[0], (long long)ne[1], (long long)ne[2],
                   (long long)ne[3]);
        return NULL;
    }
    if (view_src && view_src->view_src) {
        view_offs += view_src->view_offs;
        view_src = view_src->view_src;
    }
    bool with_data = !view_src && !ctx->no_alloc;
    size_t obj_size = LOOM__TENSOR_OVERHEAD + (with_data ? loom__align_up(data_size, 64) : 0);
    loom__obj *obj = loom__ctx_alloc_obj(ctx, obj_size, LOOM__OBJ_TENSOR);
    if (!obj) {
        loom_error(LOOM_ERR_FULL,
                   "new_tensor: context full: %s [%lld, %lld, %lld, %lld] needs %zu bytes "
                   "(%zu header + %zu data) but only %zu of %zu are free",
                   loom_type_name(type), (long long)ne[0], (long long)ne[1], (long long)ne[2],
                   (long long)ne[3], obj_size, LOOM__TENSOR_OVERHEAD,
                   obj_size - LOOM__TENSOR_OVERHEAD, ctx->mem_size - ctx->used, ctx->mem_size);
        return NULL;
    }
    loom_tensor *t = (loom_tensor *)(obj + 1);
    memset(t, 0, sizeof *t);
    t->type = type;
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        t->ne[i] = ne[i];
    t->nb[0] = loom_type_size(type);
    t->nb[1] = t->nb[0] * (size_t)(ne[0] / blck);
    for (int i = 2; i < LOOM_MAX_DIMS; i++)
        t->nb[i] = t->nb[i - 1] * (size_t)ne[i - 1];
    t->view_src = view_src;
    t->view_offs = view_src ? view_offs : 0;
    if (view_src) {
        t->buffer = view_src->buffer;
        if (view_src->data) t->data = (char *)view_src->data + view_offs;
    } else if (with_data) {
        t->data = (uint8_t *)obj + LOOM__TENSOR_OVERHEAD;
    }
    return t;
}

loom_tensor *loom__new_op_tensor(loom_ctx *ctx, loom_type type, const int64_t ne[LOOM_MAX_DIMS],
                                 loom_op op, int n_src, loom_tensor *const *srcs) {
    LOOM_ASSERT(n_src >= 0 && n_src <= LOOM_MAX_SRC);
    loom_tensor *t = loom__new_tensor_impl(ctx, type, LOOM_MAX_DIMS, ne, NULL, 0);
    if (!t) return NULL;
    t->op = op;
    for (int i = 0; i < n_src; i++)
        t->src[i] = srcs[i];
    return t;
}

loom_tensor *loom_new_tensor(loom_ctx *ctx, loom_type type, int n_dims, const int64_t *ne) {
    return loom__new_tensor_impl(ctx, type, n_dims, ne, NULL, 0);
}

loom_tensor *loom_new_tensor_1d(loom_ctx *ctx, loom_type type, int64_t ne0) {
    return loom__new_tensor_impl(ctx, type, 1, &ne0, NULL, 0);
}

loom_tensor *loom_new_tensor_2d(loom_ctx *ctx, loom_type type, int64_t ne0, int64_t ne1) {
    const int64_t ne[2] = {ne0, ne1};
    return loom__new_tensor_impl(ctx, type, 2, ne, NULL, 0);
}

loom_tensor *loom_new_tensor_3d(loom_ctx *ctx, loom_type type, int64_t ne0, int64_t ne1,
                                int64_t ne2) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    return loom__new_tensor_impl(ctx, type, 3, ne, NULL, 0);
}

loom_tensor *loom_new_tensor_4d(loom_ctx *ctx, loom_type type, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return loom__new_tensor_impl(ctx, type, 4, ne, NULL, 0);
}

loom_tensor *loom_dup_tensor(loom_ctx *ctx, const loom_tensor *a) {
    if (!a) {
        if (loom_last_status() == LOOM_OK)
            loom_error(LOOM_ERR_INVALID_ARG, "dup_tensor: a is NULL");
        return NULL;
    }
    return loom__new_tensor_impl(ctx, a->type, LOOM_MAX_DIMS, a->ne, NULL, 0);
}

loom_tensor *loom_view_tensor(loom_ctx *ctx, loom_tensor *a) {
    if (!a) {
        if (loom_last_status() == LOOM_OK)
            loom_error(LOOM_ERR_INVALID_ARG, "view_tensor: a is NULL");
        return NULL;
    }
    loom_tensor *t = loom__new_tensor_impl(ctx, a->type, LOOM_MAX_DIMS, a->ne, a, 0);
    if (!t) return NULL;
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        t->nb[i] = a->nb[i];
    t->op = LOOM_OP_VIEW;
    t->src[0] = a;
    loom_format_name(t, "%s (view)", a->name);
    return t;
}

static loom_tensor *loom__next_tensor_obj(loom__obj *obj) {
    for (; obj; obj = obj->next)
        if (obj->kind == LOOM__OBJ_TENSOR) return (loom_tensor *)(obj + 1);
    return NULL;
}

loom_tensor *loom_ctx_first_tensor(const loom_ctx *ctx) {
    return ctx ? loom__next_tensor_obj(ctx->first) : NULL;
}

loom_tensor *loom_ctx_next_tensor(const loom_ctx *ctx, const loom_tensor *t) {
    (void)ctx;
    if (!t) return NULL;
    const loom__obj *obj = (const loom__obj *)t - 1;
    return loom__next_tensor_obj(obj->next);
}

loom_tensor *loom_ctx_get_tensor(const loom_ctx *ctx, const char *name) {
    if (!name) return NULL;
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t))
        if (strcmp(t->name, name) == 0) return t;
    return NULL;
}
