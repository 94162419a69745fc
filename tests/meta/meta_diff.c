/*
 * The differential harness of meta_diff.h: one graph, the CPU backend as the oracle,
 * Meta(sim:N) alone or under a scheduler over [Meta, CPU], outputs compared.
 */
#include "tests/meta/meta_diff.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/sched.h"
#include "loom/sim.h"

#define MD_GRAPH_SIZE 2048
#define MD_TOL 2e-3

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t md_rand(md_builder *b) {
    return splitmix(&b->rng);
}

int64_t md_rand_range(md_builder *b, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + (int64_t)(md_rand(b) % (uint64_t)(hi - lo + 1));
}

static void fail(md_builder *b, const char *fmt, ...) {
    if (b->failed) return;
    b->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
}

loom_tensor *md_check(md_builder *b, loom_tensor *t, const char *what) {
    if (!t) fail(b, "building %s: %s", what, loom_last_error());
    return t;
}

loom_tensor *md_leaf_new(md_builder *b, const char *name, loom_type type, const int64_t ne[4],
                         const loom_split_state *state, md_fill fill, int64_t range) {
    if (b->failed) return NULL;
    if (b->n_leaves == MD_MAX_LEAVES) {
        fail(b, "more than %d leafs", MD_MAX_LEAVES);
        return NULL;
    }
    md_leaf *l = &b->leaves[b->n_leaves];
    memset(l, 0, sizeof *l);
    l->t = loom_new_tensor_4d(b->lctx, type, ne[0], ne[1], ne[2], ne[3]);
    if (!md_check(b, l->t, name)) return NULL;
    loom_set_name(l->t, name);
    if (state)
        l->state = *state;
    else
        loom_split_state_init(&l->state, LOOM_SPLIT_MIRRORED, b->n);
    l->fill = fill;
    l->range = range;
    b->n_leaves++;
    return l->t;
}

loom_tensor *md_f32(md_builder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                    loom_split_axis axis) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    loom_split_state s;
    if (loom_split_axis_is_dim(axis)) {
        if (loom_split_state_even(&s, axis, b->n, ne[axis], 1, 0) != LOOM_OK) {
            fail(b, "leaf %s: %s", name, loom_last_error());
            return NULL;
        }
    } else {
        loom_split_state_init(&s, axis, b->n);
    }
    return md_leaf_new(b, name, LOOM_TYPE_F32, ne, &s, MD_FILL_FLOAT, 0);
}

loom_tensor *md_f32_counts(md_builder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                           loom_split_axis axis, const int64_t *counts) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    loom_split_state s;
    loom_split_state_init(&s, axis, b->n);
    if (loom_split_state_add_segment(&s, counts, 1) != LOOM_OK) {
        fail(b, "leaf %s: %s", name, loom_last_error());
        return NULL;
    }
    return md_leaf_new(b, name, LOOM_TYPE_F32, ne, &s, MD_FILL_FLOAT, 0);
}

void md_output(md_builder *b, loom_tensor *t) {
    if (!t || b->failed) return;
    if (b->n_outs == MD_MAX_OUTS) {
        fail(b, "more than %d outputs", MD_MAX_OUTS);
        return;
    }
    for (int i = 0; i < b->n_outs; i++)
        if (b->outs[i] == t) return;
    if (t->op != LOOM_OP_NONE) loom_set_output(t);
    b->outs[b->n_outs++] = t;
}

const char *md_verdict_name(md_verdict v) {
    switch (v) {
    case MD_EXACT:
        return "exact";
    case MD_REFUSED:
        return "refused";
    case MD_WRONG:
        return "WRONG";
    default:
        return "setup";
    }
}

/* ---------------------------------------------------------------- building and filling */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The leaf's contents, the same for every backend (a function of its name and seed). */
static void leaf_fill(const md_leaf *l, uint64_t seed) {
    const loom_tensor *t = l->t;
    int64_t n = loom_nelements(t);
    uint64_t x = name_hash(t->name) ^ (seed * 0x2545f4914f6cdd1dull);
    if (l->fill == MD_FILL_FLOAT) {
        float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++)
            v[i] = (float)((double)(splitmix(&x) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        loom_tensor_set((loom_tensor *)t, v, 0, sizeof(float) * (size_t)n);
        free(v);
        return;
    }
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int64_t r = l->range > 0 ? l->range : 1;
    if (l->fill == MD_FILL_IDS) {
        for (int64_t i = 0; i < n; i++)
            v[i] = (int32_t)(splitmix(&x) % (uint64_t)r);
    } else { /* distinct along axis 0: a shuffled prefix of [0, r) per column */
        int64_t ne0 = t->ne[0];
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)r);
        for (int64_t c = 0; c * ne0 < n; c++) {
            for (int64_t i = 0; i < r; i++)
                perm[i] = (int32_t)i;
            for (int64_t i = r - 1; i > 0; i--) {
                int64_t k = (int64_t)(splitmix(&x) % (uint64_t)(i + 1));
                int32_t tmp = perm[i];
                perm[i] = perm[k];
                perm[k] = tmp;
            }
            for (int64_t i = 0; i < ne0; i++)
                v[c * ne0 + i] = perm[i % r];
        }
        free(perm);
    }
    loom_tensor_set((loom_tensor *)t, v, 0, sizeof(int32_t) * (size_t)n);
    free(v);
}

static void builder_free(md_builder *b) {
    loom_ctx_free(b->ctx);
    loom_ctx_free(b->lctx);
    loom_ctx_free(b->hctx);
    memset(b, 0, sizeof *b);
}

static loom_ctx *ctx_of(int tensors) {
    return loom_ctx_new((loom_ctx_params){.mem_size = (size_t)tensors * loom_tensor_overhead() +
                                                      3 * loom_graph_overhead(MD_GRAPH_SIZE),
                                          .no_alloc = true});
}

/* Runs the builder into fresh contexts and a graph of its outputs. Host leafs move from
 * lctx to hctx only under a scheduler (host_split). */
static loom_graph *builder_run(md_builder *b, int n, uint64_t seed, md_build_fn build, void *ud) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->seed = b->rng = seed;
    b->ctx = ctx_of(MD_GRAPH_SIZE);
    b->lctx = ctx_of(MD_MAX_LEAVES);
    b->hctx = ctx_of(MD_MAX_LEAVES);
    if (!b->ctx || !b->lctx || !b->hctx) {
        fail(b, "out of memory");
        return NULL;
    }
    build(b, ud);
    if (b->failed) return NULL;
    if (b->n_outs == 0) {
        fail(b, "the builder named no output");
        return NULL;
    }
    loom_graph *g = loom_graph_new(b->ctx, MD_GRAPH_SIZE);
    if (!g) {
        fail(b, "graph: %s", loom_last_error());
        return NULL;
    }
    if (getenv("LOOM_META_DIFF_ALL")) { /* debugging: compare every computed node */
        loom_graph *all = loom_graph_new(b->ctx, MD_GRAPH_SIZE);
        for (int i = 0; all && i < b->n_outs; i++)
            if (b->outs[i]->op != LOOM_OP_NONE) loom_graph_build_forward(all, b->outs[i]);
        if (all) b->n_outs = 0;
        for (int i = 0; all && i < all->n_nodes; i++)
            if (!loom_op_is_view(all->nodes[i]->op)) md_output(b, all->nodes[i]);
    }
    bool any = false;
    for (int i = 0; i < b->n_outs; i++) {
        if (b->outs[i]->op == LOOM_OP_NONE) continue;
        any = true;
        if (loom_graph_build_forward(g, b->outs[i]) != LOOM_OK) {
            fail(b, "graph: %s", loom_last_error());
            return NULL;
        }
    }
    if (!any) fail(b, "no computed output");
    return b->failed ? NULL : g;
}

/* Allocates ctx's tensors in buft (none: NULL, fine). false on failure. */
static bool alloc_ctx(loom_ctx *ctx, loom_buft_t buft, loom_buffer_t *out, bool nan_fill,
                      loom_buffer_usage usage) {
    *out = NULL;
    bool owners = false;
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t))
        owners |= !t->view_src;
    if (owners) {
        *out = loom_alloc_ctx_tensors(ctx, buft);
        if (!*out) return false;
        loom_buffer_set_usage(*out, usage);
        if (nan_fill) loom_buffer_clear(*out, 0xff); /* every F32 a NaN */
    }
    /* views of leafs (a CPY's result, a SET_ROWS's) live in the leafs' buffers */
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t))
        if (t->view_src && !t->buffer && t->view_src->buffer && loom_buffer_init_view(t) != LOOM_OK)
            return false;
    return true;
}

typedef struct outputs {
    float *v[MD_MAX_OUTS];
    int64_t n[MD_MAX_OUTS];
} outputs;

static void outputs_free(outputs *o) {
    for (int i = 0; i < MD_MAX_OUTS; i++)
        free(o->v[i]);
    memset(o, 0, sizeof *o);
}

static void outputs_read(const md_builder *b, outputs *o) {
    for (int i = 0; i < b->n_outs; i++) {
        const loom_tensor *t = b->outs[i];
        int64_t n = loom_nelements(t);
        free(o->v[i]);
        o->v[i] = calloc((size_t)(n ? n : 1), sizeof(float));
        o->n[i] = n;
        if (t->type == LOOM_TYPE_I32) {
            int32_t *tmp = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
            loom_tensor_get(t, tmp, 0, sizeof(int32_t) * (size_t)n);
            for (int64_t k = 0; k < n; k++)
                o->v[i][k] = (float)tmp[k];
            free(tmp);
        } else if (n > 0) {
            loom_tensor_get(t, o->v[i], 0, sizeof(float) * (size_t)n);
        }
    }
}

/* The first difference between got and want, into msg; false when they match. */
static bool outputs_differ(const md_builder *b, const outputs *want, const outputs *got, char *msg,
                           size_t size) {
    for (int i = 0; i < b->n_outs; i++) {
        int bad = 0;
        int64_t first = -1;
        double worst = 0;
        for (int64_t k = 0; k < want->n[i]; k++) {
            double w = want->v[i][k], g = got->v[i][k];
            bool ok = (isnan(w) && isnan(g)) || (isinf(w) && w == g) ||
                      fabs(g - w) <= MD_TOL * (1 + fabs(w));
            if (ok) continue;
            if (first < 0) first = k;
            double e = isfinite(g) ? fabs(g - w) : INFINITY;
            if (e > worst) worst = e;
            bad++;
        }
        if (bad) {
            snprintf(msg, size,
                     "output %d '%s' (%s): %d of %lld elements differ, max error %g; "
                     "element %lld: got %g, want %g",
                     i, b->outs[i]->name, loom_op_name(b->outs[i]->op), bad, (long long)want->n[i],
                     worst, (long long)first, got->v[i][first], want->v[i][first]);
            return true;
        }
    }
    return false;
}

/* ---------------------------------------------------------------- the meta device's leafs */

static md_builder *g_leaf_builder; /* the build the meta device's callback answers for */

static loom_status leaf_state(const loom_tensor *t, loom_split_state *out, void *ud) {
    (void)ud;
    md_builder *b = g_leaf_builder;
    for (int i = 0; b && i < b->n_leaves; i++)
        if (b->leaves[i].t == t) {
            *out = b->leaves[i].state;
            return LOOM_OK;
        }
    return LOOM_OK; /* MIRRORED (a copy the scheduler made, or a foreign leaf) */
}

/* ---------------------------------------------------------------- the run */

static md_result result(md_verdict v, const char *fmt, ...) {
    md_result r = {.verdict = v};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.msg, sizeof r.msg, fmt, ap);
    va_end(ap);
    return r;
}

/* The CPU oracle: every output of the graph computed on one CPU backend. */
static md_result run_cpu(const md_config *c, md_build_fn build, void *ud, outputs *want) {
    md_builder b;
    loom_graph *g = builder_run(&b, c->n, c->seed, build, ud);
    md_result r = {.verdict = MD_EXACT};
    loom_buffer_t bufs[3] = {0};
    loom_backend_t cpu = NULL;
    if (!g) {
        r = result(MD_SETUP, "cpu build: %s", b.why);
        goto done;
    }
    r.n_nodes = g->n_nodes;
    loom_ctx *ctxs[3] = {b.lctx, b.hctx, b.ctx};
    for (int i = 0; i < 3; i++)
        if (!alloc_ctx(ctxs[i], loom_cpu_buffer_type(), &bufs[i], false, LOOM_BUFFER_USAGE_ANY)) {
            r = result(MD_SETUP, "cpu alloc: %s", loom_last_error());
            goto done;
        }
    for (int i = 0; i < b.n_leaves; i++)
        leaf_fill(&b.leaves[i], c->seed);
    cpu = loom_cpu_backend_new(1);
    if (!cpu || loom_backend_graph_compute(cpu, g) != LOOM_OK) {
        r = result(MD_SETUP, "cpu compute: %s", loom_last_error());
        goto done;
    }
    outputs_read(&b, want);
done:
    loom_backend_free(cpu);
    for (int i = 0; i < 3; i++)
        loom_buffer_free(bufs[i]);
    builder_free(&b);
    return r;
}

md_result md_run(const md_config *c, md_build_fn build, void *ud) {
    outputs want = {0}, got = {0};
    md_result r = run_cpu(c, build, ud, &want);
    if (r.verdict != MD_EXACT) {
        outputs_free(&want);
        return r;
    }
    const int n_nodes = r.n_nodes;
    md_builder b;
    memset(&b, 0, sizeof b);
    loom_reg_t reg = NULL;
    loom_dev_t devs[LOOM_META_MAX_DEVICES], meta = NULL;
    loom_backend_t be[2] = {0};
    loom_buffer_t bufs[3] = {0};
    loom_sched *s = NULL;
    char spec[160];
    snprintf(spec, sizeof spec, "sim:%d%s", c->n, c->sim_opts ? c->sim_opts : "");
    if (loom_sim_reg_new_from_spec(spec, &reg) != LOOM_OK) {
        r = result(MD_SETUP, "%s: %s", spec, loom_last_error());
        goto done;
    }
    for (int j = 0; j < c->n; j++)
        devs[j] = loom_reg_dev_get(reg, (size_t)j);
    g_leaf_builder = &b;
    if (loom_meta_device_new(devs, c->n, leaf_state, NULL, &meta) != LOOM_OK) {
        r = result(MD_SETUP, "meta device: %s", loom_last_error());
        goto done;
    }
    loom_graph *g = builder_run(&b, c->n, c->seed, build, ud);
    if (!g) {
        r = result(MD_SETUP, "meta build: %s", b.why);
        goto done;
    }
    /* leafs in meta buffers (host leafs on the CPU under a scheduler), the rest either
     * there too (alone) or where the scheduler puts it */
    if (c->sched) {
        for (int i = 0; i < b.n_leaves; i++)
            if (b.leaves[i].host) {
                r = result(MD_SETUP, "host leafs are not supported yet");
                goto done;
            }
    }
    loom_buft_t mbt = loom_dev_buffer_type(meta);
    if (!alloc_ctx(b.lctx, mbt, &bufs[0], c->nan_fill, LOOM_BUFFER_USAGE_WEIGHTS) ||
        !alloc_ctx(b.hctx, c->sched ? loom_cpu_buffer_type() : mbt, &bufs[1], c->nan_fill,
                   LOOM_BUFFER_USAGE_ANY) ||
        (!c->sched && !alloc_ctx(b.ctx, mbt, &bufs[2], c->nan_fill, LOOM_BUFFER_USAGE_COMPUTE))) {
        r = result(MD_REFUSED, "meta alloc: %s", loom_last_error());
        goto done;
    }
    for (int i = 0; i < b.n_leaves; i++)
        leaf_fill(&b.leaves[i], c->seed);
    if (getenv("LOOM_META_DIFF_DUMP"))
        for (int i = 0; i < b.n_leaves; i++) {
            char st[160];
            loom_split_state_format(&b.leaves[i].state, st, sizeof st);
            fprintf(stderr, "leaf %s [%lld,%lld,%lld]: %s\n", b.leaves[i].t->name,
                    (long long)b.leaves[i].t->ne[0], (long long)b.leaves[i].t->ne[1],
                    (long long)b.leaves[i].t->ne[2], st);
        }
    be[0] = loom_dev_init(meta, NULL);
    if (!be[0]) {
        r = result(MD_SETUP, "meta backend: %s", loom_last_error());
        goto done;
    }
    loom_meta_backend_set_allreduce(be[0], c->algo);
    if (c->sched) {
        be[1] = loom_cpu_backend_new(1);
        s = be[1] ? loom_sched_new(be, NULL, 2, MD_GRAPH_SIZE, false, false) : NULL;
        if (!s) {
            r = result(MD_SETUP, "scheduler: %s", loom_last_error());
            goto done;
        }
    }
    int repeats = c->repeats > 0 ? c->repeats : 1;
    loom_graph *g2 = NULL; /* alternated with g (alone) */
    for (int k = 0; k < repeats; k++) {
        loom_status st =
            c->sched ? loom_sched_graph_compute(s, g) : loom_backend_graph_compute(be[0], g);
        if (st != LOOM_OK) {
            r = result(MD_REFUSED, "%s compute %d: %s", c->sched ? "sched" : "meta", k + 1,
                       loom_last_error());
            goto done;
        }
        outputs_read(&b, &got);
        char why[600];
        if (outputs_differ(&b, &want, &got, why, sizeof why)) {
            r = result(MD_WRONG, "compute %d: %s", k + 1, why);
            goto done;
        }
        if (k + 1 < repeats && !c->sched) {
            /* alternating evaluation: another graph (the first output's alone) in between,
             * whose plan shares the backend's cache; every output must still match after */
            if (!g2 && b.outs[0]->op != LOOM_OP_NONE) {
                g2 = loom_graph_new(b.ctx, MD_GRAPH_SIZE);
                if (g2 && loom_graph_build_forward(g2, b.outs[0]) != LOOM_OK) g2 = NULL;
            }
            if (g2) {
                loom_status st2 = loom_backend_graph_compute(be[0], g2);
                if (st2 != LOOM_OK) {
                    r = result(MD_REFUSED, "meta compute of the first output's graph: %s",
                               loom_last_error());
                    goto done;
                }
                outputs_read(&b, &got);
                if (outputs_differ(&b, &want, &got, why, sizeof why)) {
                    r = result(MD_WRONG, "after the first output's graph: %s", why);
                    goto done;
                }
            }
        }
    }
    r = result(MD_EXACT, "ok");
done:
    r.n_nodes = n_nodes;
    loom_sched_free(s);
    loom_backend_free(be[0]);
    loom_backend_free(be[1]);
    for (int i = 0; i < 3; i++)
        loom_buffer_free(bufs[i]);
    builder_free(&b);
    g_leaf_builder = NULL;
    if (meta) loom_meta_device_free(meta);
    if (reg) loom_sim_reg_free(reg);
    outputs_free(&want);
    outputs_free(&got);
    return r;
}
