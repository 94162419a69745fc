/*
 * Every op of docs/ops.md on a CUDA device, compared with the CPU backend (the oracle) on
 * identical inputs: each case builds the same graph twice (once per backend) from a
 * deterministic builder, allocates it on the CPU buffer type and on the CUDA device's,
 * fills the leaves with the same random data, computes, reads the outputs back through
 * their strides and compares them element by element.
 *
 * Inputs: odd sizes, broadcasting, and sources that are strided views (a padded view
 * starting one element in, a transpose, a permutation of dims 1 and 2). Tolerances:
 * copies, conversions, quantisation, indices and sorting must match exactly (the GPU
 * rounds as the CPU does); arithmetic within rtol * |cpu| + atol * max |cpu| of the
 * output, with rtol/atol per family below (float sums in another order, transcendental
 * functions within a few ulps); quantised matmuls also allow for the CPU quantising the
 * activations to Q8_0 (docs/ops.md), about 1% of the output scale.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "tests/gpu/gpu_util.h"

#define OC_MAX_LEAFS 24
#define OC_MAX_OUTS 4

typedef enum { L_CONTIG, L_PADDED, L_TRANSPOSED, L_PERM12 } oc_layout;

/* F_DISTINCT: integers (s0 + 2 i) mod hi for element i (s0 random): distinct within any
 * run of up to hi consecutive elements when hi is odd (row indices that must not repeat). */
/* F_NAN1: uniform, with a NaN at flat element ne0 (the first of row 1). F_STEPS: floats
 * with integer values in [lo, hi) (many ties). */
/* F_EYE: element (i0, i1) is 1 when i0 == i1, else 0 (an identity matrix). */
/* F_NAN_AT1: uniform, with a NaN at flat element 1. F_STEPS_NANS: F_STEPS with about one
 * element in 8 NaN (ties and NaN together). */
/* F_CAUSAL: a causal attention mask [Nkv, Nq]: key i0 is visible (0) to query i1 when
 * i0 <= i1 + hi (hi: the keys before the first query), else -INF. */
typedef enum {
    F_UNIFORM,
    F_INT,
    F_MASK,
    F_DISTINCT,
    F_NAN1,
    F_STEPS,
    F_EYE,
    F_NAN_AT1,
    F_STEPS_NANS,
    F_CAUSAL
} oc_fill_kind;

typedef struct oc_leaf {
    loom_tensor *t;
    oc_fill_kind kind;
    double lo, hi;
} oc_leaf;

typedef struct oc_case {
    loom_ctx *ctx;
    oc_leaf leafs[OC_MAX_LEAFS];
    int n_leafs;
    loom_tensor *outs[OC_MAX_OUTS];
    int n_outs;
} oc_case;

typedef void (*oc_build_fn)(oc_case *c, int v);

/* Block-quantised types (every one the CUDA backend stores). */
static bool is_quant(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr && tr->is_quantized;
}

/* ---------------------------------------------------------------- building */

static loom_tensor *oc_leaf_new(oc_case *c, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                int64_t ne3) {
    loom_tensor *t = loom_new_tensor_4d(c->ctx, type, ne0, ne1, ne2, ne3);
    LOOM_ASSERT(t && c->n_leafs < OC_MAX_LEAFS);
    c->leafs[c->n_leafs++] = (oc_leaf){t, F_UNIFORM, -1.0, 1.0};
    return t;
}

/* A source of shape ne in layout l (a leaf, or a view of one). */
static loom_tensor *oc_src(oc_case *c, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                           int64_t ne3, oc_layout l) {
    if (is_quant(type) && l == L_TRANSPOSED) l = L_PADDED;
    switch (l) {
    case L_PADDED: {
        /* one whole block of padding for quantised types */
        const int64_t pad = is_quant(type) ? loom_blck_size(type) : 3;
        loom_tensor *leaf = oc_leaf_new(c, type, ne0 + pad, ne1, ne2, ne3);
        const size_t off = is_quant(type) ? loom_row_size(type, pad) : loom_type_size(type);
        return loom_view_4d(c->ctx, leaf, ne0, ne1, ne2, ne3, leaf->nb[1], leaf->nb[2], leaf->nb[3],
                            off);
    }
    case L_TRANSPOSED: {
        loom_tensor *leaf = oc_leaf_new(c, type, ne1, ne0, ne2, ne3);
        return loom_transpose(c->ctx, leaf);
    }
    case L_PERM12: {
        loom_tensor *leaf = oc_leaf_new(c, type, ne0, ne2, ne1, ne3);
        return loom_permute(c->ctx, leaf, 0, 2, 1, 3);
    }
    default:
        return oc_leaf_new(c, type, ne0, ne1, ne2, ne3);
    }
}

/* The leaf record under t (t a leaf or a view of one). */
static oc_leaf *oc_leaf_of(oc_case *c, loom_tensor *t) {
    while (t && t->view_src)
        t = t->view_src;
    for (int i = 0; i < c->n_leafs; i++)
        if (c->leafs[i].t == t) return &c->leafs[i];
    return NULL;
}

static void oc_fill(oc_case *c, loom_tensor *t, oc_fill_kind kind, double lo, double hi) {
    oc_leaf *l = oc_leaf_of(c, t);
    LOOM_ASSERT(l != NULL);
    l->kind = kind;
    l->lo = lo;
    l->hi = hi;
}

static void oc_out(oc_case *c, loom_tensor *t) {
    LOOM_ASSERT(c->n_outs < OC_MAX_OUTS);
    c->outs[c->n_outs++] = t;
}

/* ---------------------------------------------------------------- data */

/* The bytes of a leaf: floats uniform in [lo, hi) converted to its type (quantised types
 * quantised row by row), integers uniform in [lo, hi), masks with about a quarter -INF
 * (never element 0 of a row). */
static void oc_leaf_bytes(const oc_leaf *l, uint64_t *rng, void *out) {
    const loom_tensor *t = l->t;
    const int64_t n = loom_nelements(t);
    if (t->type == LOOM_TYPE_I32 || t->type == LOOM_TYPE_I64) {
        const int64_t s0 = (int64_t)floor(gpu_randf(rng, 0, l->hi));
        for (int64_t i = 0; i < n; i++) {
            int64_t v = l->kind == F_DISTINCT ? (s0 + 2 * i) % (int64_t)l->hi
                                              : (int64_t)floor(gpu_randf(rng, l->lo, l->hi));
            if (t->type == LOOM_TYPE_I32) {
                int32_t w = (int32_t)v;
                memcpy((char *)out + 4 * i, &w, 4);
            } else {
                memcpy((char *)out + 8 * i, &v, 8);
            }
        }
        return;
    }
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    LOOM_ASSERT(f);
    for (int64_t i = 0; i < n; i++) {
        f[i] = (float)gpu_randf(rng, l->lo, l->hi);
        if (l->kind == F_MASK && i % t->ne[0] != 0 && (gpu_rand_next(rng) >> 62) == 0)
            f[i] = -INFINITY;
    }
    if (l->kind == F_NAN1 && n > t->ne[0]) f[t->ne[0]] = NAN;
    if (l->kind == F_NAN_AT1 && n > 1) f[1] = NAN;
    if (l->kind == F_STEPS || l->kind == F_STEPS_NANS)
        for (int64_t i = 0; i < n; i++)
            f[i] = floorf(f[i]);
    if (l->kind == F_STEPS_NANS)
        for (int64_t i = 0; i < n; i++)
            if ((gpu_rand_next(rng) >> 61) == 0) f[i] = NAN;
    if (l->kind == F_EYE)
        for (int64_t i = 0; i < n; i++)
            f[i] = i % t->ne[0] == (i / t->ne[0]) % t->ne[1] ? 1.0f : 0.0f;
    if (l->kind == F_CAUSAL)
        for (int64_t i = 0; i < n; i++)
            f[i] = i % t->ne[0] <= (i / t->ne[0]) % t->ne[1] + (int64_t)l->hi ? 0.0f : -INFINITY;
    const loom_type_traits *tr = loom_type_traits_get((int)t->type);
    if (t->type == LOOM_TYPE_F32)
        memcpy(out, f, sizeof(float) * (size_t)n);
    else
        tr->from_float(f, out, n);
    free(f);
}

/* Element (i0, i1, i2, i3) of t, whose storage starts at base (host copy), as a double. */
static double oc_get(const loom_tensor *t, const char *base, int64_t i0, int64_t i1, int64_t i2,
                     int64_t i3) {
    const int64_t blk = loom_blck_size(t->type);
    const char *p = base + (i0 / blk) * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
                    i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
    switch (t->type) {
    case LOOM_TYPE_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return t->type == LOOM_TYPE_F16 ? loom_fp16_to_fp32(h) : loom_bf16_to_fp32(h);
    }
    case LOOM_TYPE_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case LOOM_TYPE_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    default:
        if (is_quant(t->type)) { /* the block's values by core's reference dequantiser */
            float y[256];
            LOOM_ASSERT(blk <= 256);
            loom_type_traits_get((int)t->type)->to_float(p, y, blk);
            return y[i0 % blk];
        }
        return NAN;
    }
}

/* The values of out, row-major, read back from its buffer through its strides. */
static double *oc_read(const loom_tensor *out) {
    const loom_tensor *root = out;
    size_t off = 0;
    while (root->view_src) {
        off += root->view_offs;
        root = root->view_src;
    }
    const size_t size = loom_nbytes(root);
    char *host = malloc(size ? size : 1);
    LOOM_ASSERT(host);
    loom_tensor_get(root, host, 0, size);
    const int64_t n = loom_nelements(out);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    LOOM_ASSERT(v);
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < out->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < out->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < out->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < out->ne[0]; i0++)
                    v[k++] = oc_get(out, host + off, i0, i1, i2, i3);
    free(host);
    return v;
}

/* ---------------------------------------------------------------- running */

typedef struct oc_tol {
    double rtol, atol; /* atol relative to the output's largest |value| */
} oc_tol;

static const oc_tol TOL_EXACT = {0, 0};

typedef struct oc_result {
    double *v[OC_MAX_OUTS];
    int64_t n[OC_MAX_OUTS];
    loom_type type[OC_MAX_OUTS];
    int n_outs;
} oc_result;

/* Builds, allocates, fills and computes case (build, v) on `backend` / `buft`. */
static bool oc_run_one(const char *label, oc_build_fn build, int v, uint64_t seed,
                       loom_backend_t backend, loom_buft_t buft, oc_result *res) {
    memset(res, 0, sizeof *res);
    loom_ctx_params p = {.mem_size = 256 * loom_tensor_overhead() + loom_graph_overhead(512),
                         .no_alloc = true};
    oc_case c;
    memset(&c, 0, sizeof c);
    c.ctx = loom_ctx_new(p);
    LOOM_ASSERT(c.ctx);
    build(&c, v);
    bool ok = c.n_outs > 0;
    for (int i = 0; i < c.n_outs; i++)
        ok = ok && c.outs[i] != NULL;
    if (!ok) {
        loom_test_fail(__FILE__, __LINE__, "%s: the builder refused its inputs: %s", label,
                       loom_last_error());
        loom_ctx_free(c.ctx);
        return false;
    }
    loom_graph *g = loom_graph_new(c.ctx, 512);
    for (int i = 0; i < c.n_outs && ok; i++)
        ok = loom_graph_build_forward(g, c.outs[i]) == LOOM_OK;
    loom_buffer_t buf = ok ? loom_alloc_ctx_tensors(c.ctx, buft) : NULL;
    if (!buf) {
        loom_test_fail(__FILE__, __LINE__, "%s on %s: allocation: %s", label, loom_buft_name(buft),
                       loom_last_error());
        loom_ctx_free(c.ctx);
        return false;
    }
    /* the GPU's leaves count as weights, so MUL_MATs of 16-bit and block weights with more
     * than 8 columns take the tensor cores (converted per call: the graph writes into that
     * buffer too, so the weight cache stays out; tensor_core_weight_cache_follows_writes
     * checks the cache) */
    if (buft != loom_cpu_buffer_type()) loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
    uint64_t rng = seed;
    for (int i = 0; i < c.n_leafs; i++) {
        const size_t size = loom_nbytes(c.leafs[i].t);
        void *bytes = malloc(size ? size : 1);
        LOOM_ASSERT(bytes);
        oc_leaf_bytes(&c.leafs[i], &rng, bytes);
        loom_tensor_set(c.leafs[i].t, bytes, 0, size);
        free(bytes);
    }
    loom_status st = loom_backend_graph_compute(backend, g);
    if (st != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s on %s: compute: %s", label,
                       loom_backend_name(backend), loom_last_error());
        ok = false;
    }
    for (int i = 0; i < c.n_outs && ok; i++) {
        res->v[i] = oc_read(c.outs[i]);
        res->n[i] = loom_nelements(c.outs[i]);
        res->type[i] = c.outs[i]->type;
        res->n_outs = i + 1;
    }
    loom_buffer_free(buf);
    loom_ctx_free(c.ctx);
    return ok;
}

static void oc_result_free(oc_result *r) {
    for (int i = 0; i < r->n_outs; i++)
        free(r->v[i]);
}

typedef struct oc_env {
    loom_backend_t cpu, gpu;
    loom_buft_t gpu_buft;
    int cases, compared;
} oc_env;

/* Runs one case on both backends and compares every output. */
static void oc_check(oc_env *env, const char *label, oc_build_fn build, int v, oc_tol tol) {
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (const char *s = label; *s; s++)
        seed = (seed ^ (unsigned char)*s) * 1099511628211ull;
    seed = (seed ^ (uint64_t)v) * 1099511628211ull | 1;
    oc_result want, got;
    memset(&got, 0, sizeof got); /* freed even when want's run failed */
    bool ok = oc_run_one(label, build, v, seed, env->cpu, loom_cpu_buffer_type(), &want);
    ok = ok && oc_run_one(label, build, v, seed, env->gpu, env->gpu_buft, &got);
    env->cases++;
    for (int o = 0; ok && o < want.n_outs; o++) {
        const bool exact = want.type[o] == LOOM_TYPE_I32 || want.type[o] == LOOM_TYPE_I64 ||
                           (tol.rtol == 0 && tol.atol == 0);
        double scale = 0;
        for (int64_t k = 0; k < want.n[o]; k++)
            if (isfinite(want.v[o][k]) && fabs(want.v[o][k]) > scale) scale = fabs(want.v[o][k]);
        int64_t bad = 0, first = -1;
        for (int64_t k = 0; k < want.n[o]; k++) {
            const double w = want.v[o][k], g = got.v[o][k];
            bool same;
            if (isnan(w))
                same = isnan(g);
            else if (isinf(w) || exact)
                same = g == w;
            else
                same = fabs(g - w) <= tol.atol * scale + tol.rtol * fabs(w);
            if (!same && bad++ == 0) first = k;
        }
        env->compared += (int)want.n[o];
        if (bad) {
            loom_test_fail(__FILE__, __LINE__,
                           "%s (variant %d) output %d: %lld of %lld elements differ from the CPU; "
                           "first at %lld: cuda %.9g, cpu %.9g (scale %.3g, rtol %g, atol %g)",
                           label, v, o, (long long)bad, (long long)want.n[o], (long long)first,
                           got.v[o][first], want.v[o][first], scale, tol.rtol, tol.atol);
        }
    }
    oc_result_free(&want);
    oc_result_free(&got);
}

static bool oc_open(oc_env *env, char *why, size_t size) {
    memset(env, 0, sizeof *env);
    loom_dev_t dev = gpu_device(0, why, size);
    if (!dev) return false;
    env->gpu = loom_dev_init(dev, NULL);
    LOOM_ASSERT(env->gpu != NULL);
    env->gpu_buft = loom_dev_buffer_type(dev);
    env->cpu = loom_cpu_backend_new(2);
    LOOM_ASSERT(env->cpu != NULL);
    return true;
}

static void oc_close(oc_env *env) {
    fprintf(stderr, "%d cases, %d elements compared with the CPU\n", env->cases, env->compared);
    loom_backend_free(env->gpu);
    loom_backend_free(env->cpu);
}

#define OC_TEST(name)                                                                              \
    static void oc_body_##name(oc_env *env);                                                       \
    LOOM_TEST(cuda_ops, name) {                                                                    \
        oc_env env;                                                                                \
        char why[512];                                                                             \
        if (!oc_open(&env, why, sizeof why)) LOOM_SKIP(why);                                       \
        oc_body_##name(&env);                                                                      \
        oc_close(&env);                                                                            \
    }                                                                                              \
    static void oc_body_##name(oc_env *env)

/* ---------------------------------------------------------------- copies */

typedef struct {
    loom_type src, dst;
} cpy_pair;

static const cpy_pair k_cpy_pairs[] = {
    {LOOM_TYPE_F32, LOOM_TYPE_F32},   {LOOM_TYPE_F32, LOOM_TYPE_F16},
    {LOOM_TYPE_F32, LOOM_TYPE_BF16},  {LOOM_TYPE_F16, LOOM_TYPE_F32},
    {LOOM_TYPE_BF16, LOOM_TYPE_F32},  {LOOM_TYPE_F16, LOOM_TYPE_F16},
    {LOOM_TYPE_F32, LOOM_TYPE_Q8_0},  {LOOM_TYPE_F32, LOOM_TYPE_Q4_0},
    {LOOM_TYPE_Q8_0, LOOM_TYPE_F32},  {LOOM_TYPE_Q4_0, LOOM_TYPE_F32},
    {LOOM_TYPE_Q8_0, LOOM_TYPE_Q8_0}, {LOOM_TYPE_I32, LOOM_TYPE_I32},
};
#define N_CPY_PAIRS ((int)(sizeof k_cpy_pairs / sizeof k_cpy_pairs[0]))

/* v = pair * 4 + layout: a [64, 3, 2, 2] in a layout copied into b [128, 6] (or cast). */
static void build_cpy(oc_case *c, int v) {
    const cpy_pair pr = k_cpy_pairs[v / 4];
    const oc_layout l = (oc_layout)(v % 4);
    loom_tensor *a = oc_src(c, pr.src, 64, 3, 2, 2, is_quant(pr.src) ? L_CONTIG : l);
    if (pr.src == LOOM_TYPE_I32) oc_fill(c, a, F_INT, -100000, 100000);
    if (pr.src == LOOM_TYPE_F32 && l == L_PADDED) oc_fill(c, a, F_UNIFORM, -70000, 70000);
    if (v % 2 && pr.src != pr.dst) { /* loom_cpy converts; same-type copies are CONT */
        loom_tensor *b = oc_src(c, pr.dst, 128, 6, 1, 1, L_CONTIG);
        oc_out(c, loom_cpy(c->ctx, a, b));
    } else if (pr.src == pr.dst) {
        oc_out(c, loom_cont(c->ctx, a));
    } else {
        oc_out(c, loom_cast(c->ctx, a, pr.dst));
    }
}

OC_TEST(copies_and_conversions) {
    char label[64];
    for (int v = 0; v < N_CPY_PAIRS * 4; v++) {
        snprintf(label, sizeof label, "cpy %s -> %s", loom_type_name(k_cpy_pairs[v / 4].src),
                 loom_type_name(k_cpy_pairs[v / 4].dst));
        oc_check(env, label, build_cpy, v, TOL_EXACT);
    }
}

static void build_dup_cont(oc_case *c, int v) {
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 7, 5, 3, 2, (oc_layout)(v % 4));
    oc_out(c, v < 4 ? loom_dup(c->ctx, a) : loom_cont_4d(c->ctx, a, 35, 3, 2, 1));
}

OC_TEST(dup_cont) {
    for (int v = 0; v < 8; v++)
        oc_check(env, "dup/cont", build_dup_cont, v, TOL_EXACT);
}

/* ---------------------------------------------------------------- elementwise */

/* v = op * 8 + shape variant */
static void build_binary(oc_case *c, int v) {
    static const int64_t bshape[4][4] = {{13, 5, 3, 2}, {13, 1, 3, 1}, {1, 5, 1, 2}, {13, 5, 1, 1}};
    const int op = v / 8, s = v % 4;
    loom_tensor *a =
        oc_src(c, LOOM_TYPE_F32, 13, 5, 3, 2, (oc_layout)((v / 4) % 2 ? L_PERM12 : L_PADDED));
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, bshape[s][0], bshape[s][1], bshape[s][2],
                            bshape[s][3], (oc_layout)(s % 2 ? L_CONTIG : L_TRANSPOSED));
    if (op == 3) oc_fill(c, b, F_UNIFORM, 0.5, 2.0);
    loom_tensor *(*fn[4])(loom_ctx *, loom_tensor *, loom_tensor *) = {loom_add, loom_sub, loom_mul,
                                                                       loom_div};
    oc_out(c, fn[op](c->ctx, a, b));
}

static void build_add_id(oc_case *c, int v) {
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 7, 3, 4, 1, (oc_layout)(v % 2 ? L_PADDED : L_CONTIG));
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, 7, 5, 1, 1, L_CONTIG);
    loom_tensor *ids = oc_src(c, LOOM_TYPE_I32, 3, 4, 1, 1, L_CONTIG);
    oc_fill(c, ids, F_INT, 0, 5);
    oc_out(c, loom_add_id(c->ctx, a, b, ids));
}

/* v = map * 2 + layout */
static void build_map(oc_case *c, int v) {
    const int m = v / 2;
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 33, 4, 3, 1, v % 2 ? L_TRANSPOSED : L_CONTIG);
    oc_fill(c, a, F_UNIFORM, m == 2 ? 0.1 : -4, 4);
    loom_ctx *x = c->ctx;
    switch (m) {
    case 0:
        oc_out(c, loom_scale_bias(x, a, 0.37f, -0.25f));
        break;
    case 1:
        oc_out(c, loom_sqr(x, a));
        break;
    case 2:
        oc_out(c, loom_sqrt(x, a));
        break;
    case 3:
        oc_out(c, loom_clamp(x, a, -1.5f, 2.25f));
        break;
    case 4:
        oc_out(c, loom_silu(x, a));
        break;
    case 5:
        oc_out(c, loom_gelu(x, a));
        break;
    case 6:
        oc_out(c, loom_relu(x, a));
        break;
    default:
        oc_out(c, loom_fill(x, a, 3.5f));
        break;
    }
}

/* v: bit 0 swapped, bit 1 geglu, bit 2 fused */
static void build_glu(oc_case *c, int v) {
    const loom_glu_op op = v & 2 ? LOOM_GLU_GEGLU : LOOM_GLU_SWIGLU;
    if (v & 4) {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 2 * 19, 3, 2, 1, L_PADDED);
        oc_fill(c, a, F_UNIFORM, -4, 4);
        oc_out(c, loom_glu(c->ctx, a, op, (v & 1) != 0));
    } else {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 19, 3, 2, 1, L_PERM12);
        loom_tensor *b = oc_src(c, LOOM_TYPE_F32, 19, 3, 2, 1, L_CONTIG);
        oc_fill(c, a, F_UNIFORM, -4, 4);
        loom_tensor *x = v & 1 ? b : a, *g = v & 1 ? a : b;
        oc_out(c, loom_glu_split(c->ctx, x, g, op));
    }
}

OC_TEST(elementwise) {
    const oc_tol tol = {1e-6, 1e-7};
    for (int v = 0; v < 32; v++)
        oc_check(env, "binary", build_binary, v, tol);
    for (int v = 0; v < 2; v++)
        oc_check(env, "add_id", build_add_id, v, tol);
    /* transcendental functions: a few ulps apart */
    const oc_tol tol_fn = {1e-5, 1e-6};
    for (int v = 0; v < 16; v++)
        oc_check(env, "map", build_map, v, tol_fn);
    for (int v = 0; v < 8; v++)
        oc_check(env, "glu", build_glu, v, tol_fn);
}

/* ---------------------------------------------------------------- per-row */

static const int64_t k_rows[] = {1, 7, 300, 1031};

/* v = op * 8 + row length * 2 + layout; op 0 sum_rows, 1 mean, 2 norm, 3 rms_norm, 4 argmax */
static void build_rows(oc_case *c, int v) {
    const int op = v / 8;
    const int64_t n = k_rows[(v / 2) % 4];
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, n, 3, 2, 1, v % 2 ? L_PERM12 : L_PADDED);
    loom_ctx *x = c->ctx;
    switch (op) {
    case 0:
        oc_out(c, loom_sum_rows(x, a));
        break;
    case 1:
        oc_out(c, loom_mean(x, a));
        break;
    case 2:
        oc_out(c, loom_norm(x, a, 1e-5f));
        break;
    case 3:
        oc_out(c, loom_rms_norm(x, a, 1e-6f));
        break;
    default: {
        loom_tensor *a2 = oc_src(c, LOOM_TYPE_F32, n, 6, 1, 1, v % 2 ? L_TRANSPOSED : L_PADDED);
        oc_out(c, loom_argmax(x, a2));
        break;
    }
    }
}

/* v = op * 6 + length * 2 + layout; op 0 argsort asc, 1 desc, 2 top_k */
static void build_sort(oc_case *c, int v) {
    static const int64_t lens[3] = {5, 33, 300};
    const int op = v / 6;
    const int64_t n = lens[(v / 2) % 3];
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, n, 3, 2, 1, v % 2 ? L_TRANSPOSED : L_CONTIG);
    if (op < 2)
        oc_out(c, loom_argsort(c->ctx, a, op ? LOOM_SORT_DESC : LOOM_SORT_ASC));
    else
        oc_out(c, loom_top_k(c->ctx, a, (int)(n < 4 ? n : 4)));
}

/* Longer rows and ties: v 0 4096 ascending (the largest bitonic row), 1 5000 descending
 * (two chunks and a merge pass), 2/3 ties (values 0..5, kept in index order)
 * ascending/descending, 4 top_k 8 of 5000, 5 top_k 8 over ties. */
static void build_sort_more(oc_case *c, int v) {
    static const int64_t lens[6] = {4096, 5000, 300, 300, 5000, 300};
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, lens[v], 2, 1, 1, L_CONTIG);
    if (v == 2 || v == 3 || v == 5) oc_fill(c, a, F_STEPS, 0, 6);
    if (v < 4)
        oc_out(c, loom_argsort(c->ctx, a, v == 1 || v == 3 ? LOOM_SORT_DESC : LOOM_SORT_ASC));
    else
        oc_out(c, loom_top_k(c->ctx, a, 8));
}

/* NaN in sorted rows (issue 25): the CPU's merge sort defines where they go (a NaN compares
 * neither way), the GPU must give exactly its permutation. Values 0..9 with ties and about
 * one NaN in 8. v 0/1 300 ascending/descending (one chunk), 2 4096 ascending (a full
 * chunk), 3 5000 descending (two chunks, merged by the CPU's steps), 4 top_k 20 of 9000, 5
 * 9000 ascending with a NaN in row 1 only (row 0 merged by binary search, row 1 by the
 * CPU's steps, in the same launches). */
static void build_sort_nan(oc_case *c, int v) {
    static const int64_t lens[6] = {300, 300, 4096, 5000, 9000, 9000};
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, lens[v], 3, 1, 1, v == 3 ? L_TRANSPOSED : L_CONTIG);
    if (v == 5)
        oc_fill(c, a, F_NAN1, -1, 1);
    else
        oc_fill(c, a, F_STEPS_NANS, 0, 10);
    if (v == 4)
        oc_out(c, loom_top_k(c->ctx, a, 20));
    else
        oc_out(c, loom_argsort(c->ctx, a, v == 1 || v == 3 ? LOOM_SORT_DESC : LOOM_SORT_ASC));
}

OC_TEST(rows_and_sorting) {
    const oc_tol tol = {1e-5, 1e-6};
    for (int v = 0; v < 32; v++)
        oc_check(env, "sum_rows/mean/norm/rms_norm", build_rows, v, tol);
    for (int v = 32; v < 40; v++)
        oc_check(env, "argmax", build_rows, v, TOL_EXACT);
    for (int v = 0; v < 18; v++)
        oc_check(env, "argsort/top_k", build_sort, v, TOL_EXACT);
    for (int v = 0; v < 6; v++)
        oc_check(env, "argsort/top_k (long rows, ties)", build_sort_more, v, TOL_EXACT);
    for (int v = 0; v < 6; v++)
        oc_check(env, "argsort/top_k with NaN", build_sort_nan, v, TOL_EXACT);
}

/* Whole vocabularies (issue 25: the rank count was O(n^2) beyond 4096): v 0 top_k 40 of
 * 152064 over 2 rows, 1 argsort descending of 32000 with ties, 2 top_k 40 of 152064 with a
 * NaN in row 1 (the CPU's steps over the whole row), 3 top_k 8 of 152064 over 60 rows
 * (more rows than the scratch holds at once: two groups). */
static void build_sort_vocab(oc_case *c, int v) {
    static const int64_t lens[4] = {152064, 32000, 152064, 152064}, rows[4] = {2, 3, 2, 60};
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, lens[v], rows[v], 1, 1, L_CONTIG);
    if (v == 1) oc_fill(c, a, F_STEPS, 0, 100);
    if (v == 2) oc_fill(c, a, F_NAN1, -8, 8);
    if (v == 1)
        oc_out(c, loom_argsort(c->ctx, a, LOOM_SORT_DESC));
    else
        oc_out(c, loom_top_k(c->ctx, a, v == 3 ? 8 : 40));
}

OC_TEST(sorting_whole_vocabulary) {
    for (int v = 0; v < 4; v++)
        oc_check(env, "top_k/argsort over a vocabulary", build_sort_vocab, v, TOL_EXACT);
}

/* ---------------------------------------------------------------- attention */

/* v: 0 plain, 1 scale, 2 F32 mask broadcast over dim 2, 3 F16 mask, 4 ALiBi, 5 sinks,
 *    6 sinks + mask over dims 2 and 3, 7 a long row, 8 as 6 with a NaN sink */
static void build_soft_max(oc_case *c, int v) {
    const int64_t n = v == 7 ? 1031 : 33, ne2 = v == 4 ? 5 : 3, ne3 = v == 6 || v == 8 ? 2 : 1;
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, n, 4, ne2, ne3, v % 2 ? L_PADDED : L_CONTIG);
    oc_fill(c, a, F_UNIFORM, -4, 4);
    loom_tensor *mask = NULL, *sinks = NULL;
    if (v >= 2 && v != 5) {
        mask = oc_src(c, v == 3 || v == 7 ? LOOM_TYPE_F16 : LOOM_TYPE_F32, n, 6,
                      v == 6 || v == 8 ? ne2 : 1, v == 6 || v == 8 ? ne3 : 1, L_CONTIG);
        oc_fill(c, mask, F_MASK, -2, 1);
    }
    if (v == 5 || v == 6 || v == 8) {
        sinks = oc_src(c, LOOM_TYPE_F32, ne2, 1, 1, 1, L_CONTIG);
        oc_fill(c, sinks, F_UNIFORM, -2, 3);
    }
    if (v == 8) oc_fill(c, sinks, F_NAN_AT1, -2, 3); /* rows of head 1: NaN, as the CPU */
    if (v == 0)
        oc_out(c, loom_soft_max(c->ctx, a));
    else
        oc_out(c, loom_soft_max_ext(c->ctx, a, mask, sinks, v == 1 ? 0.3f : 0.7f,
                                    v == 4 ? 8.0f : 0.0f));
}

/* v: bit 0 neox, bit 1 freq factors, bit 2 n_dims < D, bit 3 permuted input */
static void build_rope(oc_case *c, int v) {
    const int64_t D = 16, H = 3, T = 5;
    loom_tensor *a = oc_src(c, LOOM_TYPE_F32, D, H, T, 1, v & 8 ? L_PERM12 : L_CONTIG);
    loom_tensor *pos = oc_src(c, LOOM_TYPE_I32, T, 1, 1, 1, L_CONTIG);
    oc_fill(c, pos, F_INT, 0, 4000);
    const int n_dims = v & 4 ? 10 : (int)D;
    loom_tensor *ff = NULL;
    if (v & 2) {
        ff = oc_src(c, LOOM_TYPE_F32, n_dims / 2, 1, 1, 1, L_CONTIG);
        oc_fill(c, ff, F_UNIFORM, 0.5, 4);
    }
    oc_out(c, loom_rope_ext(c->ctx, a, pos, ff, n_dims,
                            v & 1 ? LOOM_ROPE_TYPE_NEOX : LOOM_ROPE_TYPE_NORMAL, 10000.0f,
                            v & 4 ? 0.5f : 1.0f));
}

/* v: bit 0 F16 K/V, bit 1 mask, bit 2 sinks, bit 3 softcap + ALiBi, bit 4 Dv != D */
static void build_flash(oc_case *c, int v) {
    const int64_t D = 40, Dv = v & 16 ? 24 : 40, Nq = 5, Nkv = 37, H = 4, Hk = 2, S = 1;
    const loom_type kv = v & 1 ? LOOM_TYPE_F16 : LOOM_TYPE_F32;
    loom_tensor *q = oc_src(c, LOOM_TYPE_F32, D, Nq, H, S, v & 8 ? L_PERM12 : L_CONTIG);
    loom_tensor *k = oc_src(c, kv, D, Nkv, Hk, S, v & 4 ? L_PADDED : L_CONTIG);
    loom_tensor *vv = oc_src(c, kv, Dv, Nkv, Hk, S, L_CONTIG);
    loom_tensor *mask = NULL, *sinks = NULL;
    if (v & 2) {
        mask = oc_src(c, v & 1 ? LOOM_TYPE_F16 : LOOM_TYPE_F32, Nkv, 8, 1, 1, L_CONTIG);
        oc_fill(c, mask, F_MASK, -1, 0.5);
    }
    if (v & 4) {
        sinks = oc_src(c, LOOM_TYPE_F32, H, 1, 1, 1, L_CONTIG);
        oc_fill(c, sinks, F_UNIFORM, -1, 2);
    }
    oc_out(c, loom_flash_attn_ext(c->ctx, q, k, vv, mask, sinks, 1.0f / sqrtf((float)D),
                                  v & 8 ? 4.0f : 0.0f, v & 8 ? 20.0f : 0.0f));
}

/* Larger heads than build_flash: several query blocks and key tiles (partial last ones),
 * GQA groups of 4, decode (one query), head sizes 128 and 256 (the tiled kernel, 256 with
 * more than 48 KiB of shared memory) and 320 (the one-warp-per-row kernel). */
static void build_flash_big(oc_case *c, int v) {
    static const int64_t shp[4][7] = {
        /* D, Dv, Nkv, Nq, H, Hk, S */
        {128, 128, 100, 9, 8, 2, 2},
        {256, 256, 70, 3, 4, 4, 1},
        {320, 64, 40, 4, 2, 1, 1},
        {64, 64, 33, 1, 32, 8, 1},
    };
    const int64_t *p = shp[v % 4];
    const loom_type kv = v / 4 ? LOOM_TYPE_F16 : LOOM_TYPE_F32;
    loom_tensor *q = oc_src(c, LOOM_TYPE_F32, p[0], p[3], p[4], p[6], L_CONTIG);
    loom_tensor *k = oc_src(c, kv, p[0], p[2], p[5], p[6], L_CONTIG);
    loom_tensor *vv = oc_src(c, kv, p[1], p[2], p[5], p[6], L_CONTIG);
    loom_tensor *mask = NULL;
    if (v / 4) {
        mask = oc_src(c, LOOM_TYPE_F16, p[2], p[3] + 2, 1, 1, L_CONTIG);
        oc_fill(c, mask, F_MASK, -1, 0.5);
    }
    oc_out(c, loom_flash_attn_ext(c->ctx, q, k, vv, mask, NULL, 1.0f / sqrtf((float)p[0]), 0.0f,
                                  0.0f));
}

/* NaN in, NaN out (issue 9): a NaN logit makes its softmax row NaN, a NaN key makes the
 * attention rows of every head reading it NaN; the other rows stay finite. Checked on the
 * GPU alone (the rule, not the CPU's current behaviour). v: 0 soft_max, 1 tiled flash
 * attention (D 64), 2 the one-warp-per-row flash attention (D 320). */
static void build_nan(oc_case *c, int v) {
    if (v == 0) {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 37, 3, 1, 1, L_CONTIG);
        oc_fill(c, a, F_NAN1, -2, 2);
        oc_out(c, loom_soft_max(c->ctx, a));
        return;
    }
    const int64_t D = v == 1 ? 64 : 320, Nkv = 40, Nq = 3, H = 4, Hk = 2;
    loom_tensor *q = oc_src(c, LOOM_TYPE_F32, D, Nq, H, 1, L_CONTIG);
    loom_tensor *k = oc_src(c, LOOM_TYPE_F32, D, Nkv, Hk, 1, L_CONTIG);
    loom_tensor *vv = oc_src(c, LOOM_TYPE_F32, 32, Nkv, Hk, 1, L_CONTIG);
    oc_fill(c, k, F_NAN1, -1, 1); /* key 1 of KV head 0: NaN */
    oc_out(c, loom_flash_attn_ext(c->ctx, q, k, vv, NULL, NULL, 0.125f, 0.0f, 0.0f));
}

/* A NaN sink (issue 25): the CPU makes that head's outputs NaN (docs/ops.md), the GPU gave
 * zeros. Sinks [H] with head 1 NaN, the other heads finite; v 0 the tiled kernel (D 64), 1
 * the one-warp-per-row kernel (D 320). */
static void build_flash_nan_sink(oc_case *c, int v) {
    const int64_t D = v ? 320 : 64, Nkv = 40, Nq = 3, H = 4, Hk = 2;
    loom_tensor *q = oc_src(c, LOOM_TYPE_F32, D, Nq, H, 1, L_CONTIG);
    loom_tensor *k = oc_src(c, LOOM_TYPE_F32, D, Nkv, Hk, 1, L_CONTIG);
    loom_tensor *vv = oc_src(c, LOOM_TYPE_F32, 32, Nkv, Hk, 1, L_CONTIG);
    loom_tensor *sinks = oc_src(c, LOOM_TYPE_F32, H, 1, 1, 1, L_CONTIG);
    oc_fill(c, sinks, F_NAN_AT1, -1, 2);
    oc_out(c,
           loom_flash_attn_ext(c->ctx, q, k, vv, NULL, sinks, 1.0f / sqrtf((float)D), 0.0f, 0.0f));
}

OC_TEST(nan_propagates) {
    for (int v = 0; v < 3; v++) {
        oc_result got;
        if (!oc_run_one("nan", build_nan, v, 42, env->gpu, env->gpu_buft, &got)) continue;
        const double *y = got.v[0];
        int64_t wrong = 0;
        if (v == 0) { /* [37, 3]: row 1 NaN */
            for (int64_t i = 0; i < 3 * 37; i++)
                wrong += (i / 37 == 1) != (isnan(y[i]) != 0);
        } else { /* [32, H=4, Nq=3]: heads 0 and 1 read KV head 0 */
            for (int64_t i = 0; i < 32 * 4 * 3; i++)
                wrong += ((i / 32) % 4 < 2) != (isnan(y[i]) != 0);
        }
        LOOM_CHECK_MSG(wrong == 0,
                       "NaN case %d: %lld elements NaN where they should not be or "
                       "not NaN where they should",
                       v, (long long)wrong);
        oc_result_free(&got);
    }
}

OC_TEST(attention) {
    const oc_tol tol = {1e-5, 1e-6};
    for (int v = 0; v < 9; v++)
        oc_check(env, "soft_max", build_soft_max, v, tol);
    /* theta in double on both; the rotation a few float roundings */
    for (int v = 0; v < 16; v++)
        oc_check(env, "rope", build_rope, v, (oc_tol){1e-5, 1e-6});
    /* online softmax over 37 keys, dot products of 40 in another order */
    for (int v = 0; v < 32; v++)
        oc_check(env, "flash_attn_ext", build_flash, v, (oc_tol){1e-4, 1e-5});
    for (int v = 0; v < 8; v++)
        oc_check(env, "flash_attn_ext (large heads)", build_flash_big, v, (oc_tol){1e-4, 1e-5});
    for (int v = 0; v < 2; v++)
        oc_check(env, "flash_attn_ext (NaN sink)", build_flash_nan_sink, v, (oc_tol){1e-4, 1e-5});
}

/* Flash-decoding and the causal tile skip (issue 25): decode rows over long KV caches,
 * whose few blocks (one per KV head) the kernel splits across the KV length and combines,
 * and causal prefill, whose blocks skip the key tiles past their last query. v: 0 decode,
 * D 64, 32 heads over 8 KV heads, 2048 keys, F32; 1 D 128, 1500 keys (a partial last tile),
 * F16 with a random mask and sinks; 2 D 256 (beyond 48 KiB of shared memory), 2 queries of 4
 * heads over 1 KV head, 700 keys, causal after 698, softcap and ALiBi; 3 D 80, Dv 64, 4096
 * keys, 2 sequences, F16 and a random mask; 4 causal prefill of 200 queries over their 200
 * keys (no split: short KV); 5 64 queries after 960 cached keys, causal (split and
 * skipped tiles together), sinks. */
static void build_flash_split(oc_case *c, int v) {
    static const int64_t shp[6][8] = {
        /* D, Dv, Nkv, Nq, H, Hk, S, mask: 0 none, 1 random, 2 causal */
        {64, 64, 2048, 1, 32, 8, 1, 0}, {128, 128, 1500, 1, 8, 8, 1, 1},
        {256, 256, 700, 2, 4, 1, 1, 2}, {80, 64, 4096, 1, 16, 2, 2, 1},
        {64, 64, 200, 200, 4, 2, 1, 2}, {64, 64, 1024, 64, 8, 8, 1, 2},
    };
    const int64_t *p = shp[v];
    const int64_t D = p[0], Dv = p[1], Nkv = p[2], Nq = p[3], H = p[4], Hk = p[5], S = p[6];
    const loom_type kv = v == 1 || v == 3 ? LOOM_TYPE_F16 : LOOM_TYPE_F32;
    loom_tensor *q = oc_src(c, LOOM_TYPE_F32, D, Nq, H, S, L_CONTIG);
    loom_tensor *k = oc_src(c, kv, D, Nkv, Hk, S, v == 3 ? L_PADDED : L_CONTIG);
    loom_tensor *vv = oc_src(c, kv, Dv, Nkv, Hk, S, L_CONTIG);
    loom_tensor *mask = NULL, *sinks = NULL;
    if (p[7]) {
        mask =
            oc_src(c, kv == LOOM_TYPE_F16 ? LOOM_TYPE_F16 : LOOM_TYPE_F32, Nkv, Nq, 1, 1, L_CONTIG);
        if (p[7] == 1)
            oc_fill(c, mask, F_MASK, -1, 0.5);
        else
            oc_fill(c, mask, F_CAUSAL, 0, (double)(Nkv - Nq));
    }
    if (v == 1 || v == 5) {
        sinks = oc_src(c, LOOM_TYPE_F32, H, 1, 1, 1, L_CONTIG);
        oc_fill(c, sinks, F_UNIFORM, -1, 2);
    }
    oc_out(c, loom_flash_attn_ext(c->ctx, q, k, vv, mask, sinks, 1.0f / sqrtf((float)D),
                                  v == 2 ? 4.0f : 0.0f, v == 2 ? 20.0f : 0.0f));
}

/* Which cases of build_flash_split the launcher splits (kernels-math.h). */
static bool flash_split_expected(int v) {
    return v != 4;
}

OC_TEST(flash_decoding_and_causal_skip) {
    loom_cuda_backend_stats st0, st1;
    loom_cuda_backend_get_stats(env->gpu, &st0);
    int splits = 0;
    for (int v = 0; v < 6; v++) {
        oc_check(env, "flash_attn_ext (split KV / causal skip)", build_flash_split, v,
                 (oc_tol){1e-4, 1e-5});
        splits += flash_split_expected(v);
    }
    loom_cuda_backend_get_stats(env->gpu, &st1);
    LOOM_CHECK_MSG(st1.fa_split_launches - st0.fa_split_launches == (uint64_t)splits,
                   "%llu split launches, expected %d",
                   (unsigned long long)(st1.fa_split_launches - st0.fa_split_launches), splits);
}

/* ---------------------------------------------------------------- rows, concat */

static const loom_type k_row_types[] = {LOOM_TYPE_F32,  LOOM_TYPE_F16,  LOOM_TYPE_BF16,
                                        LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_I32};

/* v = type * 2 + variant (0: a [64, 10], ids [7]; 1: a [64, 10, 2], ids [5, 4, 3]) */
static void build_get_rows(oc_case *c, int v) {
    const loom_type t = k_row_types[v / 2];
    loom_tensor *a, *ids;
    if (v % 2 == 0) {
        a = oc_src(c, t, 64, 10, 1, 1, is_quant(t) ? L_CONTIG : L_PADDED);
        ids = oc_src(c, LOOM_TYPE_I32, 7, 1, 1, 1, L_CONTIG);
    } else {
        a = oc_src(c, t, 64, 10, 2, 1, L_PERM12);
        ids = oc_src(c, LOOM_TYPE_I32, 5, 4, 3, 1, L_PADDED);
    }
    if (t == LOOM_TYPE_I32) oc_fill(c, a, F_INT, -1000, 1000);
    oc_fill(c, ids, F_INT, 0, 10);
    oc_out(c, loom_get_rows(c->ctx, a, ids));
}

/* v = dst type * 4 + ids type * 2 + variant (0: dst [64, 9], b [64, 4]; 1: dst [64, 9, 4],
 * b [64, 3, 2], ids [3, 2]: broadcast over dim 2) */
static void build_set_rows(oc_case *c, int v) {
    const loom_type t = k_row_types[v / 4];
    const loom_type it = (v / 2) % 2 ? LOOM_TYPE_I64 : LOOM_TYPE_I32;
    loom_tensor *dst, *b, *ids;
    if (v % 2 == 0) {
        dst = oc_src(c, t, 64, 9, 1, 1, L_CONTIG);
        b = oc_src(c, LOOM_TYPE_F32, 64, 4, 1, 1, L_PADDED);
        ids = oc_src(c, it, 4, 1, 1, 1, L_CONTIG);
    } else {
        dst = oc_src(c, t, 64, 9, 4, 1, L_CONTIG);
        b = oc_src(c, LOOM_TYPE_F32, 64, 3, 2, 1, L_PERM12);
        ids = oc_src(c, it, 3, 2, 1, 1, L_CONTIG);
    }
    /* distinct rows within each slice, so no two writes race for one row */
    oc_fill(c, ids, F_DISTINCT, 0, 9);
    oc_out(c, loom_set_rows(c->ctx, dst, b, ids));
}

/* v = dim * 2 + type */
static void build_concat(oc_case *c, int v) {
    const int dim = v / 2;
    const loom_type t = v % 2 ? LOOM_TYPE_I32 : LOOM_TYPE_F32;
    int64_t na[4] = {5, 4, 3, 2}, nb[4] = {5, 4, 3, 2};
    nb[dim] = 3;
    loom_tensor *a = oc_src(c, t, na[0], na[1], na[2], na[3], L_PERM12);
    loom_tensor *b = oc_src(c, t, nb[0], nb[1], nb[2], nb[3], v % 2 ? L_CONTIG : L_TRANSPOSED);
    if (t == LOOM_TYPE_I32) {
        oc_fill(c, a, F_INT, -50, 50);
        oc_fill(c, b, F_INT, -50, 50);
    }
    oc_out(c, loom_concat(c->ctx, a, b, dim));
}

OC_TEST(rows_set_rows_concat) {
    for (int v = 0; v < 12; v++)
        oc_check(env, "get_rows", build_get_rows, v, TOL_EXACT);
    /* 5 storage types (I32 is no SET_ROWS destination) */
    for (int v = 0; v < 20; v++)
        oc_check(env, "set_rows", build_set_rows, v, TOL_EXACT);
    for (int v = 0; v < 8; v++)
        oc_check(env, "concat", build_concat, v, TOL_EXACT);
}

/* ---------------------------------------------------------------- matmul */

static const loom_type k_mm_types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                                       LOOM_TYPE_Q4_0};

typedef struct {
    int64_t K, M, N, A2, A3, B2, B3;
    oc_layout la, lb;
} mm_shape;

/* Dot kernel (N <= 8) and cuBLAS (N > 8) paths, in place and through copies. */
static const mm_shape k_mm_shapes[] = {
    {64, 5, 1, 1, 1, 1, 1, L_CONTIG, L_CONTIG},
    {96, 17, 3, 2, 1, 4, 1, L_PADDED, L_TRANSPOSED},
    {64, 9, 8, 1, 2, 2, 4, L_PERM12, L_PADDED},
    {160, 33, 9, 1, 1, 1, 1, L_CONTIG, L_CONTIG},
    {128, 20, 40, 2, 1, 2, 1, L_PADDED, L_PERM12},
    {64, 31, 17, 1, 1, 3, 2, L_TRANSPOSED, L_TRANSPOSED},
    {4096, 6, 12, 1, 1, 1, 1, L_CONTIG, L_PADDED},
    /* strided batched GEMMs: weight batches broadcast in groups (A2 = 2 over B2 = 6), and
     * over both batch dimensions */
    {64, 24, 16, 2, 1, 6, 1, L_CONTIG, L_CONTIG},
    {96, 40, 12, 2, 2, 4, 2, L_PADDED, L_CONTIG}, /* K whole Q8_0/Q4_0 blocks */
};
#define N_MM_SHAPES ((int)(sizeof k_mm_shapes / sizeof k_mm_shapes[0]))

static void build_mul_mat(oc_case *c, int v) {
    const loom_type t = k_mm_types[v / N_MM_SHAPES];
    const mm_shape s = k_mm_shapes[v % N_MM_SHAPES];
    loom_tensor *a = oc_src(c, t, s.K, s.M, s.A2, s.A3, s.la);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, s.K, s.N, s.B2, s.B3, s.lb);
    oc_out(c, loom_mul_mat(c->ctx, a, b));
}

/* v = type * 2 + variant (b with U columns, or one broadcast column) */
static void build_mul_mat_id(oc_case *c, int v) {
    const loom_type t = k_mm_types[v / 2];
    const int64_t K = 64, M = 11, E = 4, U = 2, T = 5;
    loom_tensor *as = oc_src(c, t, K, M, E, 1, is_quant(t) ? L_CONTIG : L_PADDED);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, K, v % 2 ? 1 : U, T, 1, v % 2 ? L_CONTIG : L_PERM12);
    loom_tensor *ids = oc_src(c, LOOM_TYPE_I32, U, T, 1, 1, L_CONTIG);
    oc_fill(c, ids, F_INT, 0, E);
    oc_out(c, loom_mul_mat_id(c->ctx, as, b, ids));
}

/* The routing bucketed by expert (issue 25): more experts and routed pairs than the
 * bucket kernel's block, experts without pairs, and skewed routing. v 0 F32 E 16, U 4, T 37
 * uniform; 1 Q4_0 as 0; 2 F32 every pair to expert 5 (148 pairs in one bucket); 3 F16 as 0
 * with b broadcast (B1 = 1); 4 F32 decode: E 128, U 8, T 1; 5 BF16 E 8, U 2, T 700 (1400
 * pairs, more than one per thread of the bucket kernel). */
static void build_mul_mat_id_routed(oc_case *c, int v) {
    static const loom_type types[6] = {LOOM_TYPE_F32, LOOM_TYPE_Q4_0, LOOM_TYPE_F32,
                                       LOOM_TYPE_F16, LOOM_TYPE_F32,  LOOM_TYPE_BF16};
    static const int64_t shp[6][3] = {/* E, U, T */
                                      {16, 4, 37}, {16, 4, 37}, {16, 4, 37},
                                      {16, 4, 37}, {128, 8, 1}, {8, 2, 700}};
    const int64_t K = 64, M = 11, E = shp[v][0], U = shp[v][1], T = shp[v][2];
    loom_tensor *as = oc_src(c, types[v], K, M, E, 1, L_CONTIG);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, K, v == 3 ? 1 : U, T, 1, L_CONTIG);
    loom_tensor *ids = oc_src(c, LOOM_TYPE_I32, U, T, 1, 1, L_CONTIG);
    oc_fill(c, ids, F_INT, v == 2 ? 5 : 0, v == 2 ? 6 : E);
    oc_out(c, loom_mul_mat_id(c->ctx, as, b, ids));
}

/* v = type * 4 + variant: the cuBLAS path with results in a padded (ldc > M) or a
 * transposed (copied out of a temporary) layout, with weight batches broadcast. */
static void build_mul_mat_strided(oc_case *c, int v) {
    const loom_type t = k_mm_types[v / 4];
    const int64_t K = 64, M = 40, N = 12, A2 = 2, B2 = 4;
    loom_tensor *a = oc_src(c, t, K, M, A2, 1, is_quant(t) ? L_CONTIG : L_PADDED);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, K, N, B2, 1, v % 2 ? L_PERM12 : L_CONTIG);
    loom_tensor *r = loom_mul_mat(c->ctx, a, b);
    if (r && v % 4 < 2) { /* rows of M + 3 floats */
        r->nb[1] = (M + 3) * sizeof(float);
    } else if (r) { /* transposed: element (m, n) at (m N + n) floats */
        r->nb[0] = (size_t)N * sizeof(float);
        r->nb[1] = sizeof(float);
        r->nb[2] = (size_t)(M * N) * sizeof(float);
    }
    if (r) {
        r->nb[2] = r->nb[0] == sizeof(float) ? r->nb[1] * (size_t)N : r->nb[2];
        r->nb[3] = r->nb[2] * (size_t)B2;
    }
    oc_out(c, r);
}

/* Products through the tensor cores (issue 25: cuBLAS with BF16 inputs and FP32
 * accumulation, for weights of a 16-bit or block type and more than 8 columns of b): each
 * product carries the rounding of both inputs to BF16 (at most 2^-9 of each, relative), so
 * |gpu - exact| <= 2^-8 sum_k |a_k b_k| plus the FP32 sums. rtol 4e-3 (> 2^-8) holds that
 * bound whenever the products share a sign (sum |a b| = |sum a b|); for products of mixed
 * signs the error is a sum of independent roundings, about 5e-4 of the output's largest
 * |value| (one standard deviation, uniform inputs), so atol 4e-3 of it is 8 deviations.
 * Block types keep their 2e-2 (the CPU's Q8_0 activations, larger than the BF16 error). */
static const oc_tol TOL_TC = {4e-3, 4e-3};
static const oc_tol TOL_TC_QUANT = {4e-3, 2e-2};

/* The tolerance of a MUL_MAT of weights t with N columns of b on the default path. */
static oc_tol mm_tol(loom_type t, int64_t N) {
    const bool tc = N > 8 && t != LOOM_TYPE_F32;
    if (is_quant(t)) return tc ? TOL_TC_QUANT : (oc_tol){1e-3, 2e-2};
    return tc ? TOL_TC : (oc_tol){1e-5, 1e-5};
}

OC_TEST(matmul) {
    for (int v = 0; v < 5 * N_MM_SHAPES; v++) {
        const loom_type t = k_mm_types[v / N_MM_SHAPES];
        /* float: K products summed in another order (~u sqrt(K) of the output scale);
         * quantised: the CPU's Q8_0 activations (up to 1/254 of each |b| block maximum);
         * more than 8 columns of 16-bit or block weights: the tensor cores (TOL_TC) */
        const oc_tol tol = mm_tol(t, k_mm_shapes[v % N_MM_SHAPES].N);
        char label[64];
        snprintf(label, sizeof label, "mul_mat %s", loom_type_name(t));
        oc_check(env, label, build_mul_mat, v, tol);
    }
    for (int v = 0; v < 10; v++) {
        const loom_type t = k_mm_types[v / 2];
        const oc_tol tol = is_quant(t) ? (oc_tol){1e-3, 2e-2} : (oc_tol){1e-5, 1e-5};
        char label[64];
        snprintf(label, sizeof label, "mul_mat_id %s", loom_type_name(t));
        oc_check(env, label, build_mul_mat_id, v, tol);
    }
    for (int v = 0; v < 6; v++) /* as above: Q4_0 against the CPU's Q8_0 activations */
        oc_check(env, "mul_mat_id, routing bucketed by expert", build_mul_mat_id_routed, v,
                 v == 1 ? (oc_tol){1e-3, 2e-2} : (oc_tol){1e-5, 1e-5});
    for (int v = 0; v < 5 * 4; v++) {
        const loom_type t = k_mm_types[v / 4];
        const oc_tol tol = mm_tol(t, 12);
        char label[64];
        snprintf(label, sizeof label, "mul_mat %s, strided result", loom_type_name(t));
        oc_check(env, label, build_mul_mat_strided, v, tol);
    }
}

/* Weights converted in panels of rows (m0 > 0, a last partial panel): a backend whose
 * conversion budget (LOOM_CUDA_PANEL_BYTES) holds 16 rows of K = 64, against the CPU. The
 * weights' BF16 copy does not fit that budget either, so these stay exact F32 SGEMMs. */
OC_TEST(matmul_panels) {
    setenv("LOOM_CUDA_PANEL_BYTES", "4096", 1);
    loom_backend_t small = loom_dev_init(loom_backend_device(env->gpu), NULL);
    unsetenv("LOOM_CUDA_PANEL_BYTES");
    LOOM_REQUIRE(small != NULL);
    loom_backend_t keep = env->gpu;
    env->gpu = small;
    for (int v = 0; v < 5 * 4; v++) {
        const loom_type t = k_mm_types[v / 4];
        const oc_tol tol = is_quant(t) ? (oc_tol){1e-3, 2e-2} : (oc_tol){1e-5, 1e-5};
        char label[64];
        snprintf(label, sizeof label, "mul_mat %s in panels", loom_type_name(t));
        oc_check(env, label, build_mul_mat_strided, v, tol);
    }
    loom_cuda_backend_stats st;
    loom_cuda_backend_get_stats(small, &st);
    /* the 16 converted (non-F32) cases: 2 weight batches x 3 panels of 16 of the 40 rows x
     * 2 batches of b each (F32 weights are read in place, in strided batched calls) */
    LOOM_CHECK_MSG(st.cublas_calls >= 16 * 12, "%llu cuBLAS calls",
                   (unsigned long long)st.cublas_calls);
    env->gpu = keep;
    loom_backend_free(small);
}

/* LOOM_CUDA_LEGACY_KERNELS=1 (issue 25): the earlier kernels (one matvec and one
 * MUL_MAT_ID kernel for every type, no KV split, no tile skip, F32 SGEMM only) stay
 * selectable for a GPU window to compare, and still match the CPU as before. */
OC_TEST(legacy_kernels_selectable) {
    setenv("LOOM_CUDA_LEGACY_KERNELS", "1", 1);
    loom_backend_t legacy = loom_dev_init(loom_backend_device(env->gpu), NULL);
    unsetenv("LOOM_CUDA_LEGACY_KERNELS");
    LOOM_REQUIRE(legacy != NULL);
    loom_backend_t keep = env->gpu;
    env->gpu = legacy;
    char label[64];
    for (int v = 0; v < 5 * N_MM_SHAPES; v++) {
        const loom_type t = k_mm_types[v / N_MM_SHAPES];
        snprintf(label, sizeof label, "legacy mul_mat %s", loom_type_name(t));
        oc_check(env, label, build_mul_mat, v,
                 is_quant(t) ? (oc_tol){1e-3, 2e-2} : (oc_tol){1e-5, 1e-5});
    }
    for (int v = 0; v < 6; v++)
        oc_check(env, "legacy mul_mat_id", build_mul_mat_id_routed, v,
                 v == 1 ? (oc_tol){1e-3, 2e-2} : (oc_tol){1e-5, 1e-5});
    for (int v = 0; v < 6; v++)
        oc_check(env, "legacy flash_attn_ext", build_flash_split, v, (oc_tol){1e-4, 1e-5});
    loom_cuda_backend_stats st;
    loom_cuda_backend_get_stats(legacy, &st);
    LOOM_CHECK_EQ_INT((int64_t)st.tc_gemms, 0);
    LOOM_CHECK_EQ_INT((int64_t)st.fa_split_launches, 0);
    env->gpu = keep;
    loom_backend_free(legacy);
}

/* The BF16 weight cache of the tensor-core path (issue 25): W [K, M] in its own buffer
 * marked LOOM_BUFFER_USAGE_WEIGHTS, x [K, N], and a graph of 4 nodes (y = W x twice, 2 y +
 * y), so the CUDA backend runs it eagerly, captures it, then replays it. W is converted to
 * BF16 once; rewriting W (loom_tensor_set) must reach the next compute, a replay, whose
 * captured GEMMs read the cache: the results follow the CPU before and after. */
#define WC_RUNS 5
static bool wc_run(loom_backend_t be, loom_buft_t buft, loom_type t, double out[WC_RUNS][4]) {
    const int64_t K = 256, M = 40, N = 24;
    loom_ctx_params p = {.mem_size = 16 * loom_tensor_overhead() + loom_graph_overhead(16),
                         .no_alloc = true};
    loom_ctx *cw = loom_ctx_new(p), *cx = loom_ctx_new(p);
    LOOM_ASSERT(cw && cx);
    loom_tensor *w = loom_new_tensor_2d(cw, t, K, M);
    loom_tensor *x = loom_new_tensor_2d(cx, LOOM_TYPE_F32, K, N);
    loom_tensor *y1 = loom_mul_mat(cx, w, x), *y2 = loom_mul_mat(cx, w, x);
    loom_tensor *r = loom_add(cx, loom_scale(cx, y1, 2.0f), y2);
    loom_graph *g = loom_graph_new(cx, 16);
    LOOM_ASSERT(r && g && loom_graph_build_forward(g, r) == LOOM_OK);
    loom_buffer_t bw = loom_alloc_ctx_tensors(cw, buft), bx = loom_alloc_ctx_tensors(cx, buft);
    LOOM_ASSERT(bw && bx);
    loom_buffer_set_usage(bw, LOOM_BUFFER_USAGE_WEIGHTS);
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    float *f = malloc(sizeof(float) * (size_t)(K * M));
    char *bytes = malloc(loom_nbytes(w));
    float *y = malloc(sizeof(float) * (size_t)(M * N));
    LOOM_ASSERT(f && bytes && y);
    uint64_t rng = 0x5eedull;
    bool ok = true;
    for (int run = 0; run < WC_RUNS && ok; run++) {
        if (run == 0 || run == 3) { /* new weights before the first and the fourth compute */
            for (int64_t i = 0; i < K * M; i++)
                f[i] = (float)gpu_randf(&rng, -1, 1);
            if (t == LOOM_TYPE_F32)
                memcpy(bytes, f, sizeof(float) * (size_t)(K * M));
            else
                tr->from_float(f, bytes, K * M);
            loom_tensor_set(w, bytes, 0, loom_nbytes(w));
        }
        if (run == 0 || run == 4) { /* new activations: the first and the last compute */
            for (int64_t i = 0; i < K * N; i++)
                f[i] = (float)gpu_randf(&rng, -1, 1);
            loom_tensor_set(x, f, 0, sizeof(float) * (size_t)(K * N));
        }
        ok = loom_backend_graph_compute(be, g) == LOOM_OK;
        LOOM_CHECK_MSG(ok, "%s compute %d: %s", loom_backend_name(be), run, loom_last_error());
        if (!ok) break;
        loom_tensor_get(r, y, 0, sizeof(float) * (size_t)(M * N));
        for (int k = 0; k < 3; k++) /* three outputs spread over the result, and the sum */
            out[run][k] = y[(k * 997) % (M * N)];
        double sum = 0;
        for (int64_t i = 0; i < M * N; i++)
            sum += y[i];
        out[run][3] = sum;
    }
    free(f);
    free(bytes);
    free(y);
    loom_buffer_free(bw);
    loom_buffer_free(bx);
    loom_ctx_free(cw);
    loom_ctx_free(cx);
    return ok;
}

OC_TEST(tensor_core_weight_cache_follows_writes) {
    static const loom_type types[] = {LOOM_TYPE_F16,  LOOM_TYPE_BF16, LOOM_TYPE_Q8_0,
                                      LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_K, LOOM_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const loom_type t = types[i];
        loom_cuda_backend_stats s0, s1;
        loom_cuda_backend_get_stats(env->gpu, &s0);
        double want[WC_RUNS][4], got[WC_RUNS][4];
        if (!wc_run(env->cpu, loom_cpu_buffer_type(), t, want)) continue;
        if (!wc_run(env->gpu, env->gpu_buft, t, got)) continue;
        loom_cuda_backend_get_stats(env->gpu, &s1);
        const oc_tol tol = mm_tol(t, 24);
        for (int run = 0; run < WC_RUNS; run++) {
            for (int k = 0; k < 4; k++) {
                /* an output of 3 W x is about 16 (one standard deviation), so 50 is about
                 * the largest (the scale oc_check takes); the sum of the 960 outputs adds
                 * their independent errors: sqrt(960) times that scale */
                const double scale = k == 3 ? 50.0 * 31.0 : 50.0;
                LOOM_CHECK_MSG(fabs(got[run][k] - want[run][k]) <=
                                   tol.atol * scale + tol.rtol * fabs(want[run][k]),
                               "%s, compute %d, value %d: cuda %.9g, cpu %.9g", loom_type_name(t),
                               run, k, got[run][k], want[run][k]);
            }
        }
        /* converted at the first compute and again after the rewrite; read by every
         * matmul launched (eagerly or into the capture) */
        LOOM_CHECK_MSG(s1.wcache_fills - s0.wcache_fills == 2, "%s: %llu conversions",
                       loom_type_name(t), (unsigned long long)(s1.wcache_fills - s0.wcache_fills));
        LOOM_CHECK(s1.wcache_hits - s0.wcache_hits >= 2);
        LOOM_CHECK(s1.tc_gemms > s0.tc_gemms);
        const char *graphs = getenv("LOOM_CUDA_GRAPHS");
        if (!(graphs && strcmp(graphs, "0") == 0)) /* computes 2-5 launched the capture */
            LOOM_CHECK_MSG(s1.graph_launches - s0.graph_launches >= 3, "%llu replays",
                           (unsigned long long)(s1.graph_launches - s0.graph_launches));
    }
}

/* ---------------------------------------------------------------- issue 10: block types */

/* The block types beyond Q8_0/Q4_0 (kernels-quant.cuh): 32-value legacy and i-quants, then
 * the 256-value K-quants and IQ4_XS. */
static const loom_type k_qtypes[] = {LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0,  LOOM_TYPE_Q5_1,
                                     LOOM_TYPE_IQ4_NL, LOOM_TYPE_MXFP4, LOOM_TYPE_Q2_K,
                                     LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K,  LOOM_TYPE_Q5_K,
                                     LOOM_TYPE_Q6_K,   LOOM_TYPE_IQ4_XS};
#define N_QTYPES ((int)(sizeof k_qtypes / sizeof k_qtypes[0]))

/* K of three blocks (an odd count: lanes and threads past the last block idle). */
static int64_t q_k3(loom_type t) {
    return 3 * loom_blck_size(t);
}

/* v = type * 3 + layout: a [3 blocks, 7, 3, 2] (contiguous, rows padded by a block and
 * starting one block in, or dims 1 and 2 permuted) dequantised to F32 by a cast. */
static void build_qdequant(oc_case *c, int v) {
    static const oc_layout ls[3] = {L_CONTIG, L_PADDED, L_PERM12};
    const loom_type t = k_qtypes[v / 3];
    loom_tensor *a = oc_src(c, t, q_k3(t), 7, 3, 2, ls[v % 3]);
    oc_fill(c, a, F_UNIFORM, -3.0, 2.0);
    oc_out(c, loom_cast(c->ctx, a, LOOM_TYPE_F32));
}

/* v = type * 2 + variant (as build_get_rows: a [3 blocks, 10], ids [7]; or a [3 blocks,
 * 10, 2] permuted, ids [5, 4, 3] padded). */
static void build_qget_rows(oc_case *c, int v) {
    const loom_type t = k_qtypes[v / 2];
    loom_tensor *a, *ids;
    if (v % 2 == 0) {
        a = oc_src(c, t, q_k3(t), 10, 1, 1, L_PADDED);
        ids = oc_src(c, LOOM_TYPE_I32, 7, 1, 1, 1, L_CONTIG);
    } else {
        a = oc_src(c, t, q_k3(t), 10, 2, 1, L_PERM12);
        ids = oc_src(c, LOOM_TYPE_I32, 5, 4, 3, 1, L_PADDED);
    }
    oc_fill(c, ids, F_INT, 0, 10);
    oc_out(c, loom_get_rows(c->ctx, a, ids));
}

/* Shapes of the block-type products: N <= 8 the dot kernel (dequantised in registers),
 * N > 8 cuBLAS over weights dequantised once (kernels-quant.cu). K in blocks. */
typedef struct {
    int64_t kb, M, N, A2, B2;
    oc_layout la, lb;
} qmm_shape;

static const qmm_shape k_qmm_shapes[] = {
    {1, 5, 1, 1, 1, L_CONTIG, L_CONTIG},   {3, 7, 3, 1, 1, L_PADDED, L_TRANSPOSED},
    {2, 9, 8, 2, 4, L_PERM12, L_PADDED},   {3, 33, 9, 1, 1, L_CONTIG, L_CONTIG},
    {5, 20, 17, 2, 2, L_PADDED, L_PERM12}, {1, 31, 40, 1, 3, L_CONTIG, L_TRANSPOSED},
};
#define N_QMM_SHAPES ((int)(sizeof k_qmm_shapes / sizeof k_qmm_shapes[0]))

static void build_qmul_mat(oc_case *c, int v) {
    const loom_type t = k_qtypes[v / N_QMM_SHAPES];
    const qmm_shape s = k_qmm_shapes[v % N_QMM_SHAPES];
    const int64_t K = s.kb * loom_blck_size(t);
    loom_tensor *a = oc_src(c, t, K, s.M, s.A2, 1, s.la);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, K, s.N, s.B2, 1, s.lb);
    oc_out(c, loom_mul_mat(c->ctx, a, b));
}

/* v = type * 2 + variant (as build_mul_mat_id, K three blocks). */
static void build_qmul_mat_id(oc_case *c, int v) {
    const loom_type t = k_qtypes[v / 2];
    const int64_t K = q_k3(t), M = 11, E = 4, U = 2, T = 5;
    loom_tensor *as = oc_src(c, t, K, M, E, 1, L_CONTIG);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, K, v % 2 ? 1 : U, T, 1, v % 2 ? L_CONTIG : L_PERM12);
    loom_tensor *ids = oc_src(c, LOOM_TYPE_I32, U, T, 1, 1, L_CONTIG);
    oc_fill(c, ids, F_INT, 0, E);
    oc_out(c, loom_mul_mat_id(c->ctx, as, b, ids));
}

/* v = type: a [3 blocks, 13] as F32 (output 0) and a x I (output 1: the K x K identity as
 * b, N = K > 8, so cuBLAS multiplies the weights dequantised once; an FP32 product with an
 * identity is exact, so output 1 is a's transpose bit for bit). */
static void build_qdequant_once(oc_case *c, int v) {
    const loom_type t = k_qtypes[v];
    const int64_t K = q_k3(t);
    loom_tensor *a = oc_src(c, t, K, 13, 1, 1, L_CONTIG);
    loom_tensor *eye = oc_src(c, LOOM_TYPE_F32, K, K, 1, 1, L_CONTIG);
    oc_fill(c, eye, F_EYE, 0, 1);
    oc_out(c, loom_cast(c->ctx, a, LOOM_TYPE_F32));
    oc_out(c, loom_mul_mat(c->ctx, a, eye));
}

/* The quantised KV-cache types beyond Q8_0/Q4_0: CPY and SET_ROWS quantise F32 into them
 * (cu_quantize32), bit-identical to core's quantisers. */
static const loom_type k_kvq_types[] = {LOOM_TYPE_Q4_1, LOOM_TYPE_Q5_0, LOOM_TYPE_Q5_1,
                                        LOOM_TYPE_IQ4_NL};
#define N_KVQ ((int)(sizeof k_kvq_types / sizeof k_kvq_types[0]))

/* v = type * 4 + variant: 0 a cast of a [96, 5, 3] permuted view, 1 a loom_cpy of a padded
 * [64, 3, 2, 2] into [128, 6]; 2, 3 SET_ROWS as build_set_rows (I32 ids; dst [64, 9] from
 * b [64, 4] padded, or dst [64, 9, 4] from b [64, 3, 2] permuted, broadcast); variant 1
 * has positive values only (Q4_1/Q5_1 min > 0), variant 3 integer steps (many ties). */
static void build_qquantize(oc_case *c, int v) {
    const loom_type t = k_kvq_types[v / 4];
    const int var = v % 4;
    if (var == 0) {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 96, 5, 3, 1, L_PERM12);
        oc_out(c, loom_cast(c->ctx, a, t));
        return;
    }
    if (var == 1) {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 64, 3, 2, 2, L_PADDED);
        oc_fill(c, a, F_UNIFORM, 0.25, 7.0);
        loom_tensor *b = oc_src(c, t, 128, 6, 1, 1, L_CONTIG);
        oc_out(c, loom_cpy(c->ctx, a, b));
        return;
    }
    loom_tensor *dst, *b, *ids;
    if (var == 2) {
        dst = oc_src(c, t, 64, 9, 1, 1, L_CONTIG);
        b = oc_src(c, LOOM_TYPE_F32, 64, 4, 1, 1, L_PADDED);
        ids = oc_src(c, LOOM_TYPE_I32, 4, 1, 1, 1, L_CONTIG);
    } else {
        dst = oc_src(c, t, 64, 9, 4, 1, L_CONTIG);
        b = oc_src(c, LOOM_TYPE_F32, 64, 3, 2, 1, L_PERM12);
        oc_fill(c, b, F_STEPS, -4.0, 4.0);
        ids = oc_src(c, LOOM_TYPE_I32, 3, 2, 1, 1, L_CONTIG);
    }
    oc_fill(c, ids, F_DISTINCT, 0, 9);
    oc_out(c, loom_set_rows(c->ctx, dst, b, ids));
}

OC_TEST(block_types_quantize_exact) {
    char label[64];
    for (int v = 0; v < N_KVQ * 4; v++) {
        snprintf(label, sizeof label, "%s f32 -> %s", v % 4 < 2 ? "cpy" : "set_rows",
                 loom_type_name(k_kvq_types[v / 4]));
        oc_check(env, label, build_qquantize, v, TOL_EXACT);
    }
}

/* Quantised products: the CPU quantises the activations (Q8_0/Q8_1/Q8_K, about 1/254 of
 * each block's largest |b| per product, docs/ops.md), the GPU multiplies F32 activations. */
static const oc_tol TOL_QMM = {1e-3, 2e-2};

OC_TEST(block_types_dequantize_exact) {
    char label[64];
    for (int v = 0; v < N_QTYPES * 3; v++) {
        snprintf(label, sizeof label, "cast %s -> f32", loom_type_name(k_qtypes[v / 3]));
        oc_check(env, label, build_qdequant, v, TOL_EXACT);
    }
    for (int v = 0; v < N_QTYPES * 2; v++) {
        snprintf(label, sizeof label, "get_rows %s", loom_type_name(k_qtypes[v / 2]));
        oc_check(env, label, build_qget_rows, v, TOL_EXACT);
    }
}

/* The dequantise-once kernel (MUL_MAT's F32 cuBLAS path) against the element decoder, which
 * block_types_dequantize_exact holds to the CPU's reference bit for bit: whole weights and
 * in panels of rows (a conversion budget of 4 KiB: one row of K = 768 per panel, m0 > 0),
 * on backends with LOOM_CUDA_LEGACY_KERNELS=1, whose cuBLAS products are all F32. On
 * the default backend the product goes to the tensor cores, whose BF16 inputs hold a
 * rounded to BF16 (and the identity exactly): a x I is then bf16(a) bit for bit, which
 * checks the BF16 conversion and the GEMM's operand layout exactly. */
OC_TEST(block_types_dequantize_once_exact) {
    setenv("LOOM_CUDA_LEGACY_KERNELS", "1", 1);
    loom_backend_t legacy = loom_dev_init(loom_backend_device(env->gpu), NULL);
    setenv("LOOM_CUDA_PANEL_BYTES", "4096", 1);
    loom_backend_t small = loom_dev_init(loom_backend_device(env->gpu), NULL);
    unsetenv("LOOM_CUDA_PANEL_BYTES");
    unsetenv("LOOM_CUDA_LEGACY_KERNELS");
    LOOM_REQUIRE(small != NULL && legacy != NULL);
    for (int v = 0; v < 3 * N_QTYPES; v++) {
        const loom_type t = k_qtypes[v % N_QTYPES];
        const int path = v / N_QTYPES; /* 0 whole F32, 1 F32 panels, 2 tensor cores */
        loom_backend_t be = path == 0 ? legacy : path == 1 ? small : env->gpu;
        oc_result r;
        if (!oc_run_one("dequantize once", build_qdequant_once, v % N_QTYPES, 0x51ull + (uint64_t)v,
                        be, env->gpu_buft, &r))
            continue;
        const int64_t K = q_k3(t), M = 13;
        int64_t bad = 0;
        for (int64_t m = 0; m < M; m++) {
            for (int64_t k = 0; k < K; k++) {
                double want = r.v[0][k + K * m];
                if (path == 2) want = loom_bf16_to_fp32(loom_fp32_to_bf16((float)want));
                if (r.v[1][m + M * k] != want && bad++ == 0)
                    loom_test_fail(__FILE__, __LINE__,
                                   "%s (path %d): a x I at (%lld, %lld) is %.9g, want %.9g",
                                   loom_type_name(t), path, (long long)m, (long long)k,
                                   r.v[1][m + M * k], want);
            }
        }
        env->cases++;
        env->compared += (int)(K * M);
        oc_result_free(&r);
    }
    loom_cuda_backend_stats st;
    loom_cuda_backend_get_stats(env->gpu, &st);
    LOOM_CHECK_MSG(st.tc_gemms >= (uint64_t)N_QTYPES, "%llu tensor-core GEMMs",
                   (unsigned long long)st.tc_gemms);
    loom_cuda_backend_get_stats(legacy, &st);
    LOOM_CHECK_EQ_INT((int64_t)st.tc_gemms, 0);
    loom_backend_free(small);
    loom_backend_free(legacy);
}

OC_TEST(block_types_matmul) {
    char label[64];
    for (int v = 0; v < N_QTYPES * N_QMM_SHAPES; v++) {
        snprintf(label, sizeof label, "mul_mat %s", loom_type_name(k_qtypes[v / N_QMM_SHAPES]));
        oc_check(env, label, build_qmul_mat, v,
                 mm_tol(k_qtypes[v / N_QMM_SHAPES], k_qmm_shapes[v % N_QMM_SHAPES].N));
    }
    for (int v = 0; v < N_QTYPES * 2; v++) {
        snprintf(label, sizeof label, "mul_mat_id %s", loom_type_name(k_qtypes[v / 2]));
        oc_check(env, label, build_qmul_mat_id, v, TOL_QMM);
    }
}

/* An empty slice (K = 0 of a split-K weight on a device with no blocks of it) gives zeros,
 * on the dot kernel and where cuBLAS would take the product. */
static void build_qempty(oc_case *c, int v) {
    loom_tensor *a = oc_src(c, LOOM_TYPE_Q4_K, 0, 6, 1, 1, L_CONTIG);
    loom_tensor *b = oc_src(c, LOOM_TYPE_F32, 0, v ? 12 : 2, 1, 1, L_CONTIG);
    oc_out(c, loom_mul_mat(c->ctx, a, b));
}

OC_TEST(block_types_empty_slice) {
    for (int v = 0; v < 2; v++)
        oc_check(env, "mul_mat Q4_K with K = 0", build_qempty, v, TOL_EXACT);
}

/* The device takes every block type as a weight (MUL_MAT, CAST to F32, CONT) and every
 * quantised result of the CPU contract (F32 -> the KV-cache types). */
OC_TEST(block_types_supported_ops) {
    loom_dev_t dev = loom_backend_device(env->gpu);
    LOOM_REQUIRE(dev != NULL);
    loom_ctx_params p = {.mem_size = 64 * loom_tensor_overhead(), .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(p);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 4);
    for (int i = 0; i < N_QTYPES; i++) {
        const loom_type t = k_qtypes[i];
        loom_tensor *w = loom_new_tensor_2d(ctx, t, 256, 4);
        loom_tensor *mm = loom_mul_mat(ctx, w, x), *cast = loom_cast(ctx, w, LOOM_TYPE_F32);
        loom_tensor *cont = loom_cont(ctx, w);
        LOOM_REQUIRE(mm && cast && cont);
        LOOM_CHECK_MSG(loom_dev_supports_op(dev, mm), "mul_mat %s", loom_type_name(t));
        LOOM_CHECK_MSG(loom_dev_supports_op(dev, cast), "cast %s", loom_type_name(t));
        LOOM_CHECK_MSG(loom_dev_supports_op(dev, cont), "cont %s", loom_type_name(t));
    }
    for (int i = 0; i < N_KVQ; i++) {
        loom_tensor *q = loom_cast(ctx, x, k_kvq_types[i]);
        LOOM_REQUIRE(q != NULL);
        LOOM_CHECK_MSG(loom_dev_supports_op(dev, q), "cast f32 -> %s",
                       loom_type_name(k_kvq_types[i]));
    }
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- issue 13, item 9 */

/* Grids beyond 65,535 blocks: an ADD of 2^25 elements and a softmax over 70,001 rows (the
 * launchers cap the grid and the kernels loop). */
static void build_large(oc_case *c, int v) {
    if (v == 0) {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 4096, 8192, 1, 1, L_CONTIG);
        loom_tensor *b = oc_src(c, LOOM_TYPE_F32, 4096, 8192, 1, 1, L_CONTIG);
        oc_out(c, loom_add(c->ctx, a, b));
    } else {
        loom_tensor *a = oc_src(c, LOOM_TYPE_F32, 8, 70001, 1, 1, L_CONTIG);
        oc_out(c, loom_soft_max(c->ctx, a));
    }
}

OC_TEST(large_grids) {
    oc_check(env, "add of 2^25 elements", build_large, 0, TOL_EXACT);
    oc_check(env, "soft_max over 70001 rows", build_large, 1, (oc_tol){1e-5, 1e-6});
}

/* Every device other than GPU 0 (a few ops of each kind against the CPU). */
OC_TEST(other_gpus) {
    loom_reg_t reg = loom_cuda_reg();
    const size_t n = loom_reg_dev_count(reg);
    int others = 0;
    loom_backend_t keep = env->gpu;
    loom_buft_t keep_buft = env->gpu_buft;
    for (size_t i = 1; i < n; i++) {
        loom_dev_t d = loom_reg_dev_get(reg, i);
        loom_backend_t b = loom_dev_init(d, NULL);
        LOOM_CHECK_MSG(b != NULL, "%s: %s", loom_dev_name(d), loom_last_error());
        if (!b) continue;
        env->gpu = b;
        env->gpu_buft = loom_dev_buffer_type(d);
        for (int v = 0; v < N_MM_SHAPES; v++)
            oc_check(env, "mul_mat F32 on another GPU", build_mul_mat, v, (oc_tol){1e-5, 1e-5});
        for (int v = 0; v < 8; v++)
            oc_check(env, "flash_attn_ext on another GPU", build_flash, v, (oc_tol){1e-4, 1e-5});
        oc_check(env, "cpy on another GPU", build_cpy, 4, TOL_EXACT);
        env->gpu = keep;
        env->gpu_buft = keep_buft;
        loom_backend_free(b);
        others++;
    }
    if (others == 0) LOOM_SKIP("one GPU: no device other than GPU 0");
}
