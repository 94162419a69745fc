/*
 * loom_split_ctx: the split states of a graph's tensors for one meta device, derived on
 * demand and cached. Leafs ask the leaf callback (validated); computed tensors apply the
 * op rule table to their sources' states, resolved with assume-sync.
 *
 * Why the cache cannot go stale: an entry, keyed on the tensor pointer, keeps a snapshot
 * of the tensor's own fields its state depends on (type, shape, strides, op, params,
 * sources, view placement, name, and for leafs flags and buffer) and the version of each
 * source's entry it was derived from. A source's version changes when its result changes
 * or when a field its consumers read changes (type, op, shape, strides, view placement,
 * name). Every query walks the tensor's upstream graph iteratively (each tensor once per
 * query, or once per begin/end batch), sources before consumers, and rederives any entry
 * whose snapshot or source versions differ; so an edit anywhere upstream is seen, and a
 * rederived entry whose result did not change keeps its version, so an edit ripples only
 * as far as it matters. The cache is bounded (cleared before a query when over capacity),
 * unlike the reference's, and a mismatch rederives one entry rather than dropping them all.
 *
 * Cost: a query validates its whole upstream graph (~300 bytes compared per tensor), so
 * querying every node of a graph one by one is quadratic; batch such loops with
 * loom_split_ctx_begin/end (or use loom_split_ctx_get_graph), which makes them linear.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "splitstate/splitstate-impl.h"

#define N_DEPS (LOOM_MAX_SRC + 1) /* src[] and, for SET_ROWS, view_src */
#define DEFAULT_CAPACITY 16384

typedef struct snapshot {
    loom_type type;
    loom_op op;
    int32_t flags;
    int64_t ne[LOOM_MAX_DIMS];
    size_t nb[LOOM_MAX_DIMS];
    int32_t op_params[LOOM_MAX_OP_PARAMS / sizeof(int32_t)];
    const loom_tensor *src[LOOM_MAX_SRC];
    const loom_tensor *view_src;
    size_t view_offs;
    const void *buffer;
    char name[LOOM_MAX_NAME];
} snapshot;

typedef struct entry {
    const loom_tensor *key;
    /* changes when the result or a field consumers read (type, op, shape, strides, view
     * placement, name) changes; 0: never derived */
    uint64_t version;
    uint64_t validated; /* the pass in which it was last checked */
    uint64_t visiting;  /* the pass in which it is on the walk's stack */
    uint64_t dep_version[N_DEPS];
    snapshot snap;
    bool touched; /* a visible field changed: consumers must rederive */
    loom_status status;
    char *msg;              /* the error message when status != LOOM_OK */
    loom_split_state state; /* the true state (not assume-synced) */
} entry;

typedef struct frame {
    const loom_tensor *t;
    int phase;
} frame;

struct loom_split_ctx {
    int n_devices;
    loom_split_leaf_fn leaf_fn;
    void *user_data;
    pthread_mutex_t lock;
    entry **slots; /* open addressing, capacity a power of two */
    size_t n_slots;
    size_t n_entries;
    size_t capacity; /* max entries before a clear */
    uint64_t pass_counter;
    uint64_t version_counter;
    int batch_depth;
    uint64_t batch_pass;
    frame *stack;
    size_t stack_cap;
    loom_split_ctx_stats stats;
};

/* ---------------------------------------------------------------- the table */

static size_t slot_of(const loom_split_ctx *ctx, const loom_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (ctx->n_slots - 1);
}

static entry *find(const loom_split_ctx *ctx, const loom_tensor *t) {
    if (!ctx->n_slots) return NULL;
    for (size_t i = slot_of(ctx, t);; i = (i + 1) & (ctx->n_slots - 1)) {
        entry *e = ctx->slots[i];
        if (!e) return NULL;
        if (e->key == t) return e;
    }
}

static loom_status grow(loom_split_ctx *ctx) {
    size_t n = ctx->n_slots ? ctx->n_slots * 2 : 256;
    entry **slots = loom_calloc(n, sizeof *slots);
    if (!slots) return loom_error(LOOM_ERR_NOMEM, "split-state cache: out of memory");
    entry **old = ctx->slots;
    size_t n_old = ctx->n_slots;
    ctx->slots = slots;
    ctx->n_slots = n;
    for (size_t i = 0; i < n_old; i++) {
        if (!old[i]) continue;
        size_t j = slot_of(ctx, old[i]->key);
        while (slots[j])
            j = (j + 1) & (n - 1);
        slots[j] = old[i];
    }
    loom_free(old);
    return LOOM_OK;
}

static entry *insert(loom_split_ctx *ctx, const loom_tensor *t) {
    if ((ctx->n_entries + 1) * 2 > ctx->n_slots && grow(ctx) != LOOM_OK) return NULL;
    entry *e = loom_calloc(1, sizeof *e);
    if (!e) {
        loom_error(LOOM_ERR_NOMEM, "split-state cache: out of memory");
        return NULL;
    }
    e->key = t;
    e->status = LOOM_ERR_INTERNAL;
    size_t i = slot_of(ctx, t);
    while (ctx->slots[i])
        i = (i + 1) & (ctx->n_slots - 1);
    ctx->slots[i] = e;
    ctx->n_entries++;
    return e;
}

static void clear_entries(loom_split_ctx *ctx) {
    for (size_t i = 0; i < ctx->n_slots; i++) {
        entry *e = ctx->slots[i];
        if (!e) continue;
        loom_free(e->msg);
        loom_free(e);
        ctx->slots[i] = NULL;
    }
    ctx->n_entries = 0;
}

bool loom_split_partial_bias_add(const loom_tensor *t, const loom_split_state *a_true,
                                 const loom_split_state *b_state) {
    if (!t || (t->op != LOOM_OP_ADD && t->op != LOOM_OP_ADD_ID)) return false;
    const loom_tensor *a = t->src[0], *b = t->src[1];
    if (!a || !b || a == b || !a_true || !b_state) return false;
    const loom_tensor *bl = b->view_src ? b->view_src : b;
    if (bl->op != LOOM_OP_NONE || b_state->axis != LOOM_SPLIT_PARTIAL) return false;
    return a->op != LOOM_OP_NONE && a_true->axis == LOOM_SPLIT_PARTIAL;
}

/* ---------------------------------------------------------------- dependencies, snapshot */

/* The tensors t's state depends on, by slot (NULL where none). */
static void deps_of(const loom_tensor *t, const loom_tensor *deps[N_DEPS]) {
    for (int i = 0; i < N_DEPS; i++)
        deps[i] = NULL;
    if (t->op == LOOM_OP_NONE) return; /* a leaf: the callback reads t itself */
    for (int i = 0; i < LOOM_MAX_SRC; i++)
        deps[i] = t->src[i];
    if (t->op == LOOM_OP_SET_ROWS) deps[LOOM_MAX_SRC] = t->view_src;
}

static void take_snapshot(const loom_tensor *t, snapshot *s) {
    memset(s, 0, sizeof *s);
    s->type = t->type;
    s->op = t->op;
    memcpy(s->ne, t->ne, sizeof s->ne);
    memcpy(s->nb, t->nb, sizeof s->nb);
    memcpy(s->op_params, t->op_params, sizeof s->op_params);
    memcpy(s->src, t->src, sizeof s->src);
    s->view_src = t->view_src;
    s->view_offs = t->view_offs;
    for (size_t i = 0; i < sizeof s->name - 1 && t->name[i]; i++)
        s->name[i] = t->name[i];
    if (t->op == LOOM_OP_NONE) {
        s->flags = t->flags;
        s->buffer = t->buffer;
    }
}

/* Whether a consumer could see the change from a to b: the fields rules read of their
 * sources (and name their sources by in messages), and the op, which decides how a
 * consumer reads the state (assume-sync: a computed PARTIAL reads MIRRORED, a leaf's does
 * not; the PARTIAL-bias predicate asks whether the bias is a leaf). */
static bool visible_change(const snapshot *a, const snapshot *b) {
    return a->type != b->type || a->op != b->op || memcmp(a->ne, b->ne, sizeof a->ne) != 0 ||
           memcmp(a->nb, b->nb, sizeof a->nb) != 0 || a->view_src != b->view_src ||
           a->view_offs != b->view_offs || memcmp(a->name, b->name, sizeof a->name) != 0;
}

/* ---------------------------------------------------------------- deriving one entry */

static void set_result(loom_split_ctx *ctx, entry *e, loom_status status, const char *msg,
                       const loom_split_state *state) {
    bool changed = e->version == 0 || e->status != status || e->touched;
    if (!changed && status == LOOM_OK) changed = memcmp(&e->state, state, sizeof *state) != 0;
    if (!changed && status != LOOM_OK) changed = !e->msg || !msg || strcmp(e->msg, msg) != 0;
    loom_free(e->msg);
    e->msg = NULL;
    if (status != LOOM_OK) e->msg = loom_strdup(msg && msg[0] ? msg : "split state failed");
    e->status = status;
    e->state = *state;
    if (changed) e->version = ++ctx->version_counter;
}

static void derive(loom_split_ctx *ctx, entry *e, const loom_tensor *t) {
    loom_split_state res;
    loom_split_state_init(&res, LOOM_SPLIT_MIRRORED, ctx->n_devices);
    const char *name = t->name[0] ? t->name : "(unnamed)";
    if (t->op == LOOM_OP_NONE) {
        loom_status st = LOOM_OK;
        if (ctx->leaf_fn) {
            loom_clear_error();
            st = ctx->leaf_fn(t, &res, ctx->user_data);
            if (st != LOOM_OK && !loom_last_error()[0])
                loom_error(st, "the split-state callback failed for '%s'", name);
        }
        if (st == LOOM_OK && res.n_devices != ctx->n_devices)
            st = loom_error(LOOM_ERR_INVALID_ARG,
                            "the split-state callback gave '%s' a state over %d devices, not %d",
                            name, res.n_devices, ctx->n_devices);
        if (st == LOOM_OK) st = loom_split_state_validate(&res, t, 1);
        set_result(ctx, e, st, st == LOOM_OK ? NULL : loom_last_error(), &res);
        return;
    }
    const loom_tensor *deps[N_DEPS];
    deps_of(t, deps);
    loom_split_state states[N_DEPS], true0;
    loom_split_state_init(&true0, LOOM_SPLIT_NONE, ctx->n_devices);
    const loom_split_state *src[LOOM_MAX_SRC];
    const loom_split_state *dst = NULL;
    for (int i = 0; i < N_DEPS; i++) {
        if (i < LOOM_MAX_SRC) src[i] = NULL;
        if (!deps[i]) continue;
        if (deps[i] == t) {
            loom_status st = loom_error(LOOM_ERR_INVALID_ARG, "'%s' is its own source", name);
            set_result(ctx, e, st, loom_last_error(), &res);
            return;
        }
        entry *d = find(ctx, deps[i]);
        LOOM_ASSERT(d != NULL);
        if (d->status != LOOM_OK) { /* the root cause, as the source reported it */
            set_result(ctx, e, d->status, d->msg, &res);
            return;
        }
        states[i] = d->state;
        if (i == 0) true0 = d->state;
        loom_split_state_assume_sync(deps[i], &states[i]);
        if (i < LOOM_MAX_SRC)
            src[i] = &states[i];
        else
            dst = &states[i];
    }
    if (src[0] && src[1] && loom_split_partial_bias_add(t, &true0, src[1])) states[0] = true0;
    loom_status st = loom_split_rule_apply(t, src, dst, ctx->n_devices, &res);
    set_result(ctx, e, st, st == LOOM_OK ? NULL : loom_last_error(), &res);
}

/* ---------------------------------------------------------------- the walk */

static loom_status push(loom_split_ctx *ctx, size_t *sp, const loom_tensor *t) {
    if (*sp == ctx->stack_cap) {
        size_t cap = ctx->stack_cap ? ctx->stack_cap * 2 : 64;
        frame *s = loom_realloc(ctx->stack, cap * sizeof *s);
        if (!s) return loom_error(LOOM_ERR_NOMEM, "split-state cache: out of memory");
        ctx->stack = s;
        ctx->stack_cap = cap;
    }
    ctx->stack[(*sp)++] = (frame){t, 0};
    return LOOM_OK;
}

static uint64_t current_pass(loom_split_ctx *ctx) {
    return ctx->batch_depth > 0 ? ctx->batch_pass : ++ctx->pass_counter;
}

/* Validates (rederiving where stale) t and everything upstream of it. */
static loom_status walk(loom_split_ctx *ctx, const loom_tensor *t, uint64_t pass, size_t *psp);

static loom_status resolve(loom_split_ctx *ctx, const loom_tensor *t, uint64_t pass, entry **out) {
    size_t sp = 0;
    loom_status st = walk(ctx, t, pass, &sp);
    if (st != LOOM_OK) { /* out of memory mid-walk: nothing may stay marked on the stack */
        for (size_t i = 0; i < sp; i++) {
            entry *e = find(ctx, ctx->stack[i].t);
            if (e) e->visiting = 0;
        }
        return st;
    }
    *out = find(ctx, t);
    LOOM_ASSERT(*out != NULL);
    return LOOM_OK;
}

static loom_status walk(loom_split_ctx *ctx, const loom_tensor *t, uint64_t pass, size_t *psp) {
    size_t sp = 0;
    loom_status st = push(ctx, &sp, t);
    if (st != LOOM_OK) return st;
    while (sp > 0) {
        *psp = sp;
        frame *f = &ctx->stack[sp - 1];
        const loom_tensor *x = f->t;
        entry *e = find(ctx, x);
        if (e && e->validated == pass) {
            sp--;
            continue;
        }
        if (f->phase == 0) {
            if (!e && !(e = insert(ctx, x))) return LOOM_ERR_NOMEM;
            e->visiting = pass;
            f->phase = 1;
            const loom_tensor *deps[N_DEPS];
            deps_of(x, deps);
            for (int i = 0; i < N_DEPS; i++) {
                if (!deps[i] || deps[i] == x) continue;
                entry *d = find(ctx, deps[i]);
                if (d && d->validated == pass) continue;
                if (d && d->visiting == pass) {
                    /* a cycle: report it on x once its walk completes */
                    continue;
                }
                if ((st = push(ctx, &sp, deps[i])) != LOOM_OK) return st;
            }
            continue;
        }
        /* phase 1: every dependency is validated in this pass */
        ctx->stats.lookups++;
        snapshot snap;
        take_snapshot(x, &snap);
        const loom_tensor *deps[N_DEPS];
        deps_of(x, deps);
        bool fresh = e->version != 0 && memcmp(&snap, &e->snap, sizeof snap) == 0;
        bool cycle = false;
        for (int i = 0; i < N_DEPS; i++) {
            if (!deps[i] || deps[i] == x) continue;
            entry *d = find(ctx, deps[i]);
            if (!d || d->validated != pass) {
                cycle = true;
                fresh = false;
                continue;
            }
            if (d->version != e->dep_version[i]) fresh = false;
        }
        if (fresh) {
            ctx->stats.hits++;
        } else {
            if (e->version != 0) ctx->stats.invalidated++;
            ctx->stats.computed++;
            e->touched = e->version != 0 && visible_change(&e->snap, &snap);
            if (cycle) {
                loom_split_state none;
                loom_split_state_init(&none, LOOM_SPLIT_NONE, ctx->n_devices);
                loom_error(LOOM_ERR_INVALID_ARG, "'%s' depends on itself (a cycle in the graph)",
                           x->name[0] ? x->name : "(unnamed)");
                set_result(ctx, e, LOOM_ERR_INVALID_ARG, loom_last_error(), &none);
            } else {
                derive(ctx, e, x);
            }
            e->snap = snap;
            for (int i = 0; i < N_DEPS; i++) {
                entry *d = deps[i] && deps[i] != x ? find(ctx, deps[i]) : NULL;
                e->dep_version[i] = d ? d->version : 0;
            }
        }
        e->validated = pass;
        e->visiting = 0;
        sp--;
    }
    *psp = 0;
    return LOOM_OK;
}

static void maybe_trim(loom_split_ctx *ctx) {
    if (ctx->batch_depth == 0 && ctx->n_entries > ctx->capacity) clear_entries(ctx);
}

/* ---------------------------------------------------------------- public */

loom_split_ctx *loom_split_ctx_new(int n_devices, loom_split_leaf_fn leaf_fn, void *user_data) {
    if (n_devices < 1 || n_devices > LOOM_SPLIT_MAX_DEVICES) {
        loom_error(LOOM_ERR_INVALID_ARG, "split-state context: %d devices (must be 1..%d)",
                   n_devices, LOOM_SPLIT_MAX_DEVICES);
        return NULL;
    }
    loom_split_ctx *ctx = loom_calloc(1, sizeof *ctx);
    if (!ctx) {
        loom_error(LOOM_ERR_NOMEM, "split-state context: out of memory");
        return NULL;
    }
    if (pthread_mutex_init(&ctx->lock, NULL) != 0) {
        loom_free(ctx);
        loom_error(LOOM_ERR_INTERNAL, "split-state context: cannot create a lock");
        return NULL;
    }
    ctx->n_devices = n_devices;
    ctx->leaf_fn = leaf_fn;
    ctx->user_data = user_data;
    ctx->capacity = DEFAULT_CAPACITY;
    return ctx;
}

void loom_split_ctx_free(loom_split_ctx *ctx) {
    if (!ctx) return;
    clear_entries(ctx);
    loom_free(ctx->slots);
    loom_free(ctx->stack);
    pthread_mutex_destroy(&ctx->lock);
    loom_free(ctx);
}

int loom_split_ctx_n_devices(const loom_split_ctx *ctx) {
    return ctx ? ctx->n_devices : 0;
}

loom_status loom_split_ctx_get(loom_split_ctx *ctx, const loom_tensor *t, bool assume_sync,
                               loom_split_state *out) {
    if (!ctx || !t || !out)
        return loom_error(LOOM_ERR_INVALID_ARG, "split-state context: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    maybe_trim(ctx);
    entry *e = NULL;
    loom_status st = resolve(ctx, t, current_pass(ctx), &e);
    if (st == LOOM_OK && e->status != LOOM_OK) {
        st = e->status;
        loom_error(st, "%s", e->msg ? e->msg : "split state failed (out of memory)");
    }
    if (st == LOOM_OK) {
        *out = e->state;
        if (assume_sync) loom_split_state_assume_sync(t, out);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

bool loom_split_ctx_can_split(loom_split_ctx *ctx, const loom_tensor *op) {
    if (!ctx || !op) {
        loom_error(LOOM_ERR_INVALID_ARG, "split-state context: NULL argument");
        return false;
    }
    if (op->op == LOOM_OP_NONE) return true;
    pthread_mutex_lock(&ctx->lock);
    maybe_trim(ctx);
    const uint64_t pass = current_pass(ctx);
    const loom_tensor *deps[N_DEPS];
    deps_of(op, deps);
    loom_split_state states[N_DEPS], true0;
    loom_split_state_init(&true0, LOOM_SPLIT_NONE, ctx->n_devices);
    const loom_split_state *src[LOOM_MAX_SRC] = {0};
    const loom_split_state *dst = NULL;
    loom_status st = LOOM_OK;
    for (int i = 0; i < N_DEPS && st == LOOM_OK; i++) {
        if (!deps[i]) continue;
        entry *e = NULL;
        if (deps[i] != op) st = resolve(ctx, deps[i], pass, &e);
        if (st != LOOM_OK) break;
        if (e && e->status == LOOM_OK) {
            states[i] = e->state;
            if (i == 0) true0 = e->state;
            loom_split_state_assume_sync(deps[i], &states[i]);
        } else { /* computed elsewhere, arrives whole */
            loom_split_state_init(&states[i], LOOM_SPLIT_MIRRORED, ctx->n_devices);
            if (i == 0) true0 = states[i];
        }
        if (i < LOOM_MAX_SRC)
            src[i] = &states[i];
        else
            dst = &states[i];
    }
    if (st == LOOM_OK) {
        if (src[0] && src[1] && loom_split_partial_bias_add(op, &true0, src[1])) states[0] = true0;
        loom_split_state res;
        st = loom_split_rule_apply(op, src, dst, ctx->n_devices, &res);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st == LOOM_OK;
}

loom_status loom_split_ctx_get_graph(loom_split_ctx *ctx, const loom_graph *g, bool assume_sync,
                                     loom_split_state *states) {
    if (!ctx || !g || !states)
        return loom_error(LOOM_ERR_INVALID_ARG, "split-state context: NULL argument");
    loom_split_ctx_begin(ctx);
    loom_status st = LOOM_OK;
    for (int i = 0; i < g->n_nodes && st == LOOM_OK; i++)
        st = loom_split_ctx_get(ctx, g->nodes[i], assume_sync, &states[i]);
    loom_split_ctx_end(ctx);
    return st;
}

void loom_split_ctx_begin(loom_split_ctx *ctx) {
    if (!ctx) return;
    pthread_mutex_lock(&ctx->lock);
    if (ctx->batch_depth++ == 0) {
        if (ctx->n_entries > ctx->capacity) clear_entries(ctx);
        ctx->batch_pass = ++ctx->pass_counter;
    }
    pthread_mutex_unlock(&ctx->lock);
}

void loom_split_ctx_end(loom_split_ctx *ctx) {
    if (!ctx) return;
    pthread_mutex_lock(&ctx->lock);
    LOOM_ASSERT(ctx->batch_depth > 0);
    ctx->batch_depth--;
    pthread_mutex_unlock(&ctx->lock);
}

void loom_split_ctx_clear(loom_split_ctx *ctx) {
    if (!ctx) return;
    pthread_mutex_lock(&ctx->lock);
    clear_entries(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

void loom_split_ctx_set_capacity(loom_split_ctx *ctx, size_t max_entries) {
    if (!ctx) return;
    pthread_mutex_lock(&ctx->lock);
    ctx->capacity = max_entries ? max_entries : DEFAULT_CAPACITY;
    pthread_mutex_unlock(&ctx->lock);
}

loom_split_ctx_stats loom_split_ctx_get_stats(const loom_split_ctx *ctx) {
    loom_split_ctx_stats s = {0};
    if (!ctx) return s;
    pthread_mutex_lock((pthread_mutex_t *)&ctx->lock);
    s = ctx->stats;
    s.entries = ctx->n_entries;
    pthread_mutex_unlock((pthread_mutex_t *)&ctx->lock);
    return s;
}
