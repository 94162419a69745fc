/*
 * Helpers for the splitstate tests: state builders, a brute-force ownership oracle that
 * expands a layout element by element (independent of the library's arithmetic), a leaf
 * callback driven by a name table, and a headers-only tensor context.
 */
#ifndef LOOM_SPLIT_TEST_UTIL_H
#define LOOM_SPLIT_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/core.h"
#include "loom/splitstate.h"
#include "tests/shim/loom_test.h"

static inline loom_split_state st_kind(loom_split_axis axis, int n) {
    loom_split_state s;
    loom_split_state_init(&s, axis, n);
    return s;
}

/* One segment: ST_AX(axis, n, c0, c1, ...) with n counts. */
static inline loom_split_state st_ax_arr(int axis, int n, const int64_t *c) {
    loom_split_state s;
    loom_split_state_init(&s, (loom_split_axis)axis, n);
    loom_split_state_add_segment(&s, c, 1);
    return s;
}
#define ST_AX(axis, n, ...) st_ax_arr((axis), (n), (const int64_t[]){__VA_ARGS__})

/* Appends a segment repeated nr times: ST_ADD(&s, nr, c0, c1, ...). */
#define ST_ADD(s, nr, ...) loom_split_state_add_segment((s), (const int64_t[]){__VA_ARGS__}, (nr))

#define I64(x) ((int64_t)(x))

/* A printed state, in one of 8 rotating buffers. */
static inline const char *st_str(const loom_split_state *s) {
    static char buf[8][512];
    static int i = 0;
    i = (i + 1) % 8;
    loom_split_state_format(s, buf[i], sizeof buf[i]);
    return buf[i];
}

/* The oracle: which device holds global index g of a split axis, and where in its slice.
 * Walks the layout one element at a time. Returns -1 if g is outside it. */
static inline int oracle_owner(const loom_split_state *s, int64_t g, int64_t *local) {
    int64_t pos = 0;
    int64_t seen[LOOM_SPLIT_MAX_DEVICES] = {0};
    for (int i = 0; i < s->n_segments; i++)
        for (int64_t r = 0; r < s->nr[i]; r++)
            for (int j = 0; j < s->n_devices; j++)
                for (int64_t e = 0; e < s->ne[i][j]; e++) {
                    if (pos == g) {
                        if (local) *local = seen[j];
                        return j;
                    }
                    pos++;
                    seen[j]++;
                }
    return -1;
}

/* Device owning element idx (multi-index) of a tensor in state s; -1 for every device
 * (MIRRORED / PARTIAL). */
static inline int oracle_owner_nd(const loom_split_state *s, const int64_t idx[4]) {
    if (!loom_split_axis_is_dim(s->axis)) return -1;
    return oracle_owner(s, idx[s->axis], NULL);
}

#define CHECK_STATE(got, want)                                                                     \
    LOOM_CHECK_MSG(loom_split_state_equal(&(got), &(want)), "state %s, expected %s",               \
                   st_str(&(got)), st_str(&(want)))

/* ---------------------------------------------------------------- leaf table */

typedef struct leaf_rule {
    const char *name; /* exact tensor name */
    loom_split_state state;
} leaf_rule;

typedef struct leaf_table {
    leaf_rule rules[64];
    int n;
    int calls;
} leaf_table;

static inline void leaf_set(leaf_table *lt, const char *name, loom_split_state s) {
    for (int i = 0; i < lt->n; i++)
        if (!strcmp(lt->rules[i].name, name)) {
            lt->rules[i].state = s;
            return;
        }
    lt->rules[lt->n].name = name;
    lt->rules[lt->n].state = s;
    lt->n++;
}

/* Unlisted leafs stay MIRRORED. */
static inline loom_status leaf_table_fn(const loom_tensor *t, loom_split_state *out, void *ud) {
    leaf_table *lt = (leaf_table *)ud;
    lt->calls++;
    for (int i = 0; i < lt->n; i++)
        if (!strcmp(lt->rules[i].name, t->name)) {
            *out = lt->rules[i].state;
            return LOOM_OK;
        }
    return LOOM_OK;
}

static inline loom_ctx *headers_ctx(void) {
    loom_ctx_params p = {.mem_size = 8u << 20, .mem_buffer = NULL, .no_alloc = true};
    return loom_ctx_new(p);
}

static inline loom_tensor *named(loom_tensor *t, const char *name) {
    if (t) loom_set_name(t, name);
    return t;
}

/* ---------------------------------------------------------------- fixture */

/* A headers-only context, a leaf table and a split-state context over n devices. */
typedef struct fixture {
    loom_ctx *ctx;
    leaf_table lt;
    loom_split_ctx *sc;
    int n;
} fixture;

static inline bool fx_init(fixture *f, int n) {
    memset(f, 0, sizeof *f);
    f->n = n;
    f->ctx = headers_ctx();
    f->sc = loom_split_ctx_new(n, leaf_table_fn, &f->lt);
    return f->ctx && f->sc;
}

static inline void fx_free(fixture *f) {
    loom_split_ctx_free(f->sc);
    loom_ctx_free(f->ctx);
}

static inline loom_split_state state_of(fixture *f, const loom_tensor *t) {
    loom_split_state s;
    loom_split_state_init(&s, LOOM_SPLIT_NONE, f->n);
    loom_status st = loom_split_ctx_get(f->sc, t, false, &s);
    LOOM_CHECK_MSG(st == LOOM_OK, "state of '%s': %s", t->name, loom_last_error());
    return s;
}

static inline loom_tensor *leaf(fixture *f, const char *name, loom_split_state s, int64_t ne0,
                                int64_t ne1, int64_t ne2) {
    loom_tensor *t = named(loom_new_tensor_3d(f->ctx, LOOM_TYPE_F32, ne0, ne1, ne2), name);
    leaf_set(&f->lt, name, s);
    return t;
}

static inline loom_tensor *leaf_t(fixture *f, const char *name, loom_type type, loom_split_state s,
                                  int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    loom_tensor *t = named(loom_new_tensor_4d(f->ctx, type, ne0, ne1, ne2, ne3), name);
    leaf_set(&f->lt, name, s);
    return t;
}

/* t's derived state is `want`, and can_split agrees. */
#define CHECK_DERIVED(f, t, want)                                                                  \
    do {                                                                                           \
        const loom_tensor *t_ = (t);                                                               \
        LOOM_REQUIRE(t_ != NULL);                                                                  \
        loom_split_state got_ = state_of((f), t_), want_ = (want);                                 \
        CHECK_STATE(got_, want_);                                                                  \
        LOOM_CHECK_MSG(loom_split_ctx_can_split((f)->sc, t_), "can_split '%s': %s", t_->name,      \
                       loom_last_error());                                                         \
    } while (0)

/* t is refused with a message containing msg, and can_split says no. */
#define CHECK_REFUSED(f, t, msg)                                                                   \
    do {                                                                                           \
        const loom_tensor *t_ = (t);                                                               \
        LOOM_REQUIRE(t_ != NULL);                                                                  \
        loom_split_state got_;                                                                     \
        loom_status st_ = loom_split_ctx_get((f)->sc, t_, false, &got_);                           \
        LOOM_CHECK_MSG(st_ == LOOM_ERR_UNSUPPORTED, "'%s' was not refused: %s", t_->name,          \
                       st_ == LOOM_OK ? st_str(&got_) : loom_last_error());                        \
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), msg);                                           \
        LOOM_CHECK(!loom_split_ctx_can_split((f)->sc, t_));                                        \
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), msg);                                           \
    } while (0)

#endif /* LOOM_SPLIT_TEST_UTIL_H */
