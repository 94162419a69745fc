/*
 * The ops test harness (see harness.h): one graph at a time, inputs generated on the host,
 * results read back through their strides and compared with the reference or, in a
 * replay mode, with the CPU oracle's results for the same inputs.
 */
#include "tests/ops/harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"

#define OPS_GRAPH_SIZE 256
#define OPS_MAX_TENSORS 128
#define OPS_MAX_LEAFS 32
#define OPS_MAX_ALLOCS 64
#define OPS_MAX_OUTPUTS 8

typedef struct ops_leaf {
    loom_tensor *t;
    unsigned char *host; /* the leaf's bytes, contiguous, uploaded before compute */
    size_t size;
} ops_leaf;

typedef struct ops_record {
    int key;   /* graph number * 64 + check number within the graph */
    double *v; /* the oracle's result, row-major */
    int64_t n;
} ops_record;

struct ops_env {
    const ops_mode *mode;
    int config;
    ops_backend be;
    uint64_t rng;
    /* the graph being built */
    char label[256];
    bool active, computed, failed;
    loom_ctx *ctx;
    loom_buffer_t buf;
    ops_leaf leafs[OPS_MAX_LEAFS];
    int n_leafs;
    void *allocs[OPS_MAX_ALLOCS];
    int n_allocs;
    loom_tensor *outputs[OPS_MAX_OUTPUTS];
    int n_outputs;
    /* replay: results of config 0, one per ops_check call */
    ops_record *records;
    int n_records, cap_records;
    int graph_index, check_index; /* graphs begun in this config; checks in this graph */
};

#define OPS_FAIL(e, ...) ops__fail(e, __VA_ARGS__)

static void ops__fail(ops_env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ops__fail(ops_env *e, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    loom_test_fail(__FILE__, __LINE__, "[%s] %s: %s", e->be.label, e->label, msg);
}

/* ---------------------------------------------------------------- random */

static uint64_t ops__next(ops_env *e) {
    uint64_t x = e->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    e->rng = x;
    return x * 2685821657736338717ull;
}

double ops_randf(ops_env *e, double lo, double hi) {
    return lo + (hi - lo) * (double)(ops__next(e) >> 11) * 0x1p-53;
}

int64_t ops_randi(ops_env *e, int64_t lo, int64_t hi) {
    return lo + (int64_t)(ops__next(e) % (uint64_t)(hi - lo));
}

/* ---------------------------------------------------------------- modes */

bool ops_cpu_open(int config, ops_backend *out) {
    int n = config == 0 ? 1 : 3;
    out->backend = loom_cpu_backend_new(n);
    if (!out->backend) {
        loom_test_fail(__FILE__, __LINE__, "loom_cpu_backend_new(%d): %s", n, loom_last_error());
        return false;
    }
    out->buft = loom_cpu_buffer_type();
    snprintf(out->label, sizeof out->label, "cpu/%s x%d", loom_cpu_simd_name(), n);
    return true;
}

void ops_cpu_close(ops_backend *b) {
    loom_backend_free(b->backend);
}

const char *ops_config_label(ops_env *e) {
    return e->be.label;
}

void ops_run(const char *case_name, void (*body)(ops_env *e)) {
    const ops_mode *m = &ops_target_mode;
    ops_env *e = calloc(1, sizeof *e);
    LOOM_ASSERT(e);
    e->mode = m;
    uint64_t seed = 1;
    for (int c = 0; c < m->n_configs; c++) {
        if (c == 0 || !m->replay)
            seed = (((uint64_t)loom_test_rand() << 32) ^ loom_test_rand()) | 1;
        e->config = c;
        e->rng = seed;
        e->graph_index = 0;
        memset(&e->be, 0, sizeof e->be);
        if (!m->open(c, &e->be)) break;
        snprintf(e->label, sizeof e->label, "%s", case_name);
        body(e);
        if (e->active) ops_end(e);
        m->close(&e->be);
    }
    for (int i = 0; i < e->n_records; i++)
        free(e->records[i].v);
    free(e->records);
    free(e);
}

/* ---------------------------------------------------------------- building */

const char *ops_layout_name(ops_layout l) {
    static const char *names[] = {"contig", "padded", "transposed", "perm12", "scrambled"};
    return l < OPS_LAYOUT_COUNT ? names[l] : "?";
}

bool ops_layout_ok(loom_type type, ops_layout l) {
    const loom_type_traits *tr = loom_type_traits_get((int)type);
    bool quant = tr && tr->is_quantized;
    return !(quant && (l == OPS_TRANSPOSED || l == OPS_SCRAMBLED));
}

void ops_begin(ops_env *e, const char *fmt, ...) {
    if (e->active) ops_end(e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->label, sizeof e->label, fmt, ap);
    va_end(ap);
    e->active = true;
    e->computed = e->failed = false;
    e->graph_index++;
    e->check_index = 0;
    loom_ctx_params p = {
        .mem_size = OPS_MAX_TENSORS * loom_tensor_overhead() + loom_graph_overhead(OPS_GRAPH_SIZE),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    e->ctx = loom_ctx_new(p);
    if (!e->ctx) {
        OPS_FAIL(e, "loom_ctx_new: %s", loom_last_error());
        e->failed = true;
    }
}

loom_ctx *ops_ctx(ops_env *e) {
    return e->ctx;
}

static void *ops__track(ops_env *e, void *p) {
    LOOM_ASSERT(p && e->n_allocs < OPS_MAX_ALLOCS);
    e->allocs[e->n_allocs++] = p;
    return p;
}

void *ops_scratch(ops_env *e, size_t size) {
    return ops__track(e, calloc(1, size ? size : 1));
}

ref_tensor ops_expect(ops_env *e, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return ref_contiguous(type, ne, ops_scratch(e, ref_contiguous_bytes(type, ne)));
}

/* The storage leaf under t and t's byte offset into it. */
static ops_leaf *ops__leaf_of(ops_env *e, const loom_tensor *t, size_t *offset) {
    size_t off = 0;
    while (t->view_src) {
        off += t->view_offs;
        t = t->view_src;
    }
    *offset = off;
    for (int i = 0; i < e->n_leafs; i++)
        if (e->leafs[i].t == t) return &e->leafs[i];
    return NULL;
}

static bool ops__is_quant(loom_type type) {
    const loom_type_traits *tr = loom_type_traits_get((int)type);
    return tr && tr->is_quantized;
}

void ops_fill(ops_env *e, loom_tensor *t, double lo, double hi) {
    size_t off;
    ops_leaf *l = t ? ops__leaf_of(e, t, &off) : NULL;
    if (!l) return;
    loom_tensor *r = l->t;
    int64_t n0 = r->ne[0], nrows = r->ne[1] * r->ne[2] * r->ne[3];
    float *row = malloc(sizeof(float) * (size_t)n0);
    size_t row_bytes = loom_row_size(r->type, n0);
    for (int64_t i = 0; i < nrows; i++) {
        unsigned char *dst = l->host + (size_t)i * row_bytes;
        for (int64_t j = 0; j < n0; j++) {
            switch (r->type) {
            case LOOM_TYPE_I32: {
                int32_t v = (int32_t)ops_randi(e, (int64_t)lo, (int64_t)hi);
                memcpy(dst + 4 * j, &v, 4);
                break;
            }
            case LOOM_TYPE_I64: {
                int64_t v = ops_randi(e, (int64_t)lo, (int64_t)hi);
                memcpy(dst + 8 * j, &v, 8);
                break;
            }
            default:
                row[j] = (float)ops_randf(e, lo, hi);
                break;
            }
        }
        switch (r->type) {
        case LOOM_TYPE_F32:
            memcpy(dst, row, row_bytes);
            break;
        case LOOM_TYPE_F16:
        case LOOM_TYPE_BF16:
            for (int64_t j = 0; j < n0; j++) {
                uint16_t h = r->type == LOOM_TYPE_F16 ? loom_fp32_to_fp16(row[j])
                                                      : loom_fp32_to_bf16(row[j]);
                memcpy(dst + 2 * j, &h, 2);
            }
            break;
        default:
            if (ops__is_quant(r->type)) loom_type_traits_get(r->type)->from_float(row, dst, n0);
            break;
        }
    }
    free(row);
}

loom_tensor *ops_src(ops_env *e, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                     ops_layout l) {
    if (!e->ctx) return NULL;
    LOOM_ASSERT(e->n_leafs < OPS_MAX_LEAFS);
    LOOM_ASSERT(ops_layout_ok(type, l));
    loom_ctx *ctx = e->ctx;
    int64_t blck = ops__is_quant(type) ? loom_blck_size(type) : 1;
    loom_tensor *leaf = NULL, *v = NULL;
    switch (l) {
    case OPS_CONTIG:
        v = leaf = loom_new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3);
        break;
    case OPS_PADDED:
        leaf = loom_new_tensor_4d(ctx, type, ne0 + 2 * blck, ne1, ne2, ne3);
        if (leaf)
            v = loom_view_4d(ctx, leaf, ne0, ne1, ne2, ne3, leaf->nb[1], leaf->nb[2], leaf->nb[3],
                             loom_row_size(type, blck));
        break;
    case OPS_TRANSPOSED:
        leaf = loom_new_tensor_4d(ctx, type, ne1, ne0, ne2, ne3);
        v = loom_transpose(ctx, leaf);
        break;
    case OPS_PERM12:
        leaf = loom_new_tensor_4d(ctx, type, ne0, ne2, ne1, ne3);
        v = loom_permute(ctx, leaf, 0, 2, 1, 3);
        break;
    case OPS_SCRAMBLED:
        leaf = loom_new_tensor_4d(ctx, type, ne1, ne3, ne0, ne2);
        v = loom_permute(ctx, leaf, 1, 3, 0, 2);
        break;
    default:
        break;
    }
    if (!leaf || !v) {
        OPS_FAIL(e, "making a %s source: %s", ops_layout_name(l), loom_last_error());
        e->failed = true;
        return NULL;
    }
    int64_t want[4] = {ne0, ne1, ne2, ne3};
    for (int i = 0; i < 4; i++)
        if (v->ne[i] != want[i]) {
            OPS_FAIL(e, "%s view has ne[%d] = %lld, expected %lld", ops_layout_name(l), i,
                     (long long)v->ne[i], (long long)want[i]);
            e->failed = true;
        }
    loom_format_name(leaf, "src%d", e->n_leafs);
    loom_set_input(leaf);
    ops_leaf *lf = &e->leafs[e->n_leafs++];
    lf->t = leaf;
    lf->size = loom_nbytes(leaf);
    lf->host = calloc(1, lf->size);
    LOOM_ASSERT(lf->host);
    if (type != LOOM_TYPE_I32 && type != LOOM_TYPE_I64) ops_fill(e, leaf, -1, 1);
    return v;
}

void ops_set(ops_env *e, loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v) {
    size_t off;
    ops_leaf *l = t ? ops__leaf_of(e, t, &off) : NULL;
    if (!l) return;
    unsigned char *p = l->host + off + (size_t)i0 * t->nb[0] + (size_t)i1 * t->nb[1] +
                       (size_t)i2 * t->nb[2] + (size_t)i3 * t->nb[3];
    switch (t->type) {
    case LOOM_TYPE_F32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16: {
        uint16_t h =
            t->type == LOOM_TYPE_F16 ? loom_fp32_to_fp16((float)v) : loom_fp32_to_bf16((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case LOOM_TYPE_I32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case LOOM_TYPE_I64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    default:
        LOOM_ASSERT(!"ops_set: unsupported type");
    }
}

ref_tensor ops_ref(ops_env *e, loom_tensor *t) {
    ref_tensor r;
    memset(&r, 0, sizeof r);
    size_t off;
    ops_leaf *l = t ? ops__leaf_of(e, t, &off) : NULL;
    LOOM_ASSERT(l || e->failed);
    if (!l) {
        /* a failed build: zeros of t's shape, so a reference can still run harmlessly */
        if (!t) return ops_expect(e, LOOM_TYPE_F32, 1, 1, 1, 1);
        return ops_expect(e, t->type, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }
    r.type = t->type;
    for (int i = 0; i < 4; i++) {
        r.ne[i] = t->ne[i];
        r.nb[i] = t->nb[i];
    }
    r.data = l->host + off;
    return r;
}

/* ---------------------------------------------------------------- compute */

void ops_output(ops_env *e, loom_tensor *t) {
    LOOM_ASSERT(e->n_outputs < OPS_MAX_OUTPUTS);
    e->outputs[e->n_outputs++] = t;
}

bool ops_compute(ops_env *e, loom_tensor *out) {
    if (e->failed) return false;
    if (!out) {
        OPS_FAIL(e, "the op builder returned NULL: %s", loom_last_error());
        e->failed = true;
        return false;
    }
    ops_output(e, out);
    loom_graph *g = loom_graph_new(e->ctx, OPS_GRAPH_SIZE);
    if (!g) {
        OPS_FAIL(e, "loom_graph_new: %s", loom_last_error());
        e->failed = true;
        return false;
    }
    for (int i = 0; i < e->n_outputs; i++) {
        if (!e->outputs[i]) {
            OPS_FAIL(e, "output %d is NULL: %s", i, loom_last_error());
            e->failed = true;
            return false;
        }
        loom_set_output(e->outputs[i]);
        loom_status st = loom_graph_build_forward(g, e->outputs[i]);
        if (st != LOOM_OK) {
            OPS_FAIL(e, "loom_graph_build_forward: %s", loom_last_error());
            e->failed = true;
            return false;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *n = g->nodes[i];
        if (!loom_op_is_view(n->op) && !loom_backend_supports_op(e->be.backend, n)) {
            OPS_FAIL(e, "%s does not support %s of %s", loom_backend_name(e->be.backend),
                     loom_op_name(n->op), loom_type_name(n->src[0] ? n->src[0]->type : n->type));
            e->failed = true;
            return false;
        }
    }
    e->buf = loom_alloc_ctx_tensors(e->ctx, e->be.buft);
    if (!e->buf) {
        OPS_FAIL(e, "loom_alloc_ctx_tensors: %s", loom_last_error());
        e->failed = true;
        return false;
    }
    for (int i = 0; i < e->n_leafs; i++)
        loom_tensor_set(e->leafs[i].t, e->leafs[i].host, 0, e->leafs[i].size);
    loom_status st = loom_backend_graph_compute(e->be.backend, g);
    if (st != LOOM_OK) {
        OPS_FAIL(e, "graph_compute: %s (%s)", loom_status_str(st), loom_last_error());
        e->failed = true;
        return false;
    }
    e->computed = true;
    return true;
}

/* ---------------------------------------------------------------- checks */

static ops_record *ops__record(ops_env *e, int key) {
    if (e->n_records == e->cap_records) {
        e->cap_records = e->cap_records ? 2 * e->cap_records : 64;
        e->records = realloc(e->records, sizeof(ops_record) * (size_t)e->cap_records);
        LOOM_ASSERT(e->records);
    }
    ops_record *r = &e->records[e->n_records++];
    r->key = key;
    r->v = NULL;
    r->n = 0;
    return r;
}

static const ops_record *ops__find_record(const ops_env *e, int key) {
    for (int i = 0; i < e->n_records; i++)
        if (e->records[i].key == key) return &e->records[i];
    return NULL;
}

void ops_check_as(ops_env *e, loom_tensor *out, loom_type out_type, const ref_tensor *exp,
                  ops_tol tol) {
    bool recording = e->mode->replay && e->config == 0;
    bool replaying = e->mode->replay && e->config > 0;
    int key = e->graph_index * 64 + e->check_index++;
    if (!e->computed || e->failed || !out) return;
    const ops_record *orec = replaying ? ops__find_record(e, key) : NULL;
    /* the oracle failed on this graph (already reported): nothing to compare with */
    if (replaying && (!orec || !orec->v || orec->n != ref_nelements(exp))) return;

    if (out->type != out_type) {
        OPS_FAIL(e, "result type %s, expected %s", loom_type_name(out->type),
                 loom_type_name(out_type));
        return;
    }
    for (int i = 0; i < 4; i++)
        if (out->ne[i] != exp->ne[i]) {
            OPS_FAIL(e, "result shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld, %lld]",
                     (long long)out->ne[0], (long long)out->ne[1], (long long)out->ne[2],
                     (long long)out->ne[3], (long long)exp->ne[0], (long long)exp->ne[1],
                     (long long)exp->ne[2], (long long)exp->ne[3]);
            return;
        }

    /* read the whole storage of out back and view it through out's strides */
    const loom_tensor *root = out;
    size_t off = 0;
    while (root->view_src) {
        off += root->view_offs;
        root = root->view_src;
    }
    size_t size = loom_nbytes(root);
    unsigned char *host = malloc(size ? size : 1);
    LOOM_ASSERT(host);
    loom_tensor_get(root, host, 0, size);
    ref_tensor got = {.type = out->type, .data = host + off};
    for (int i = 0; i < 4; i++) {
        got.ne[i] = out->ne[i];
        got.nb[i] = out->nb[i];
    }

    int64_t n = ref_nelements(exp);
    bool exact = exp->type == LOOM_TYPE_I32 || exp->type == LOOM_TYPE_I64;
    ops_record *rec = recording ? ops__record(e, key) : NULL;
    if (rec) {
        rec->v = malloc(sizeof(double) * (size_t)(n ? n : 1));
        LOOM_ASSERT(rec->v);
        rec->n = n;
    }
    const double *oracle = orec ? orec->v : NULL;
    int64_t bad = 0;
    char first[512] = "";
    double worst = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t i[4];
        ref_unravel(exp->ne, k, i);
        double gv = ref_get(&got, i[0], i[1], i[2], i[3]);
        double ev = oracle ? oracle[k] : ref_get(exp, i[0], i[1], i[2], i[3]);
        if (rec) rec->v[k] = gv;
        double t = exact ? 0 : tol.atol + tol.rtol * fabs(ev) + (tol.elem ? tol.elem[k] : 0);
        bool ok;
        if (isnan(ev))
            ok = isnan(gv);
        else if (isinf(ev))
            ok = gv == ev;
        else
            ok = fabs(gv - ev) <= t;
        if (ok) continue;
        double ratio = t > 0 ? fabs(gv - ev) / t : INFINITY;
        if (bad == 0 || ratio > worst || isnan(ratio)) {
            worst = ratio;
            snprintf(first, sizeof first,
                     "worst at (%lld, %lld, %lld, %lld): got %.9g, expected %.9g, tol %.3g",
                     (long long)i[0], (long long)i[1], (long long)i[2], (long long)i[3], gv, ev, t);
        }
        bad++;
    }
    if (bad)
        OPS_FAIL(e, "%lld of %lld elements differ from the %s; %s", (long long)bad, (long long)n,
                 oracle ? "CPU oracle" : "reference", first);
    if (getenv("OPS_VERBOSE")) {
        /* how much of its tolerance each check used: max |got - exp| / tol */
        double used = 0, maxerr = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t i[4];
            ref_unravel(exp->ne, k, i);
            double gv = ref_get(&got, i[0], i[1], i[2], i[3]);
            double ev = oracle ? oracle[k] : ref_get(exp, i[0], i[1], i[2], i[3]);
            double t = tol.atol + tol.rtol * fabs(ev) + (tol.elem ? tol.elem[k] : 0);
            double d = fabs(gv - ev);
            if (!isfinite(d)) continue;
            maxerr = fmax(maxerr, d);
            if (t > 0)
                used = fmax(used, d / t);
            else if (d > 0)
                used = INFINITY;
        }
        fprintf(stderr, "[%s] %s: max err %.3g, %.1f%% of tolerance\n", e->be.label, e->label,
                maxerr, 100 * used);
    }
    free(host);
}

void ops_check(ops_env *e, loom_tensor *out, const ref_tensor *exp, ops_tol tol) {
    ops_check_as(e, out, exp->type, exp, tol);
}

void ops_end(ops_env *e) {
    loom_buffer_free(e->buf);
    loom_ctx_free(e->ctx);
    for (int i = 0; i < e->n_leafs; i++)
        free(e->leafs[i].host);
    for (int i = 0; i < e->n_allocs; i++)
        free(e->allocs[i]);
    e->buf = NULL;
    e->ctx = NULL;
    e->n_leafs = e->n_allocs = e->n_outputs = 0;
    e->active = e->computed = e->failed = false;
}
