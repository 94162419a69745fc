/*
 * Meta buffers and devices without a model: the name lists the members; set/get of every
 * state (uneven and zero-size slices, fused segments, MIRRORED, a PARTIAL leaf written and
 * read back as its sum), partial-range writes landing in the right bytes of the right
 * device, activation memory per device falling as N grows, the plan cache serving two
 * alternating graphs, and a device running out of memory reported with its name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/meta.h"
#include "loom/sched.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

typedef struct fixture {
    loom_reg_t reg;
    loom_dev_t devs[16];
    loom_dev_t meta;
    int n;
} fixture;

/* The leaf callback: tensors named "s<axis>:<c0>,<c1>,..." are split with those counts,
 * "seg" gets a fused three-segment layout, "partial" is PARTIAL, others MIRRORED. */
static loom_status leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    int n = *(int *)ud;
    if (t->name[0] == 's' && t->name[1] >= '0' && t->name[1] <= '3' && t->name[2] == ':') {
        int64_t c[16] = {0};
        const char *p = t->name + 3;
        for (int j = 0; j < n; j++) {
            c[j] = strtoll(p, (char **)&p, 10);
            if (*p == ',') p++;
        }
        loom_split_state_init(out, (loom_split_axis)(t->name[1] - '0'), n);
        return loom_split_state_add_segment(out, c, 1);
    }
    if (strcmp(t->name, "seg") == 0) { /* axis 0 of 12: [2,2] + [1,1] + [3,3] */
        loom_split_state_init(out, LOOM_SPLIT_AXIS_0, n);
        loom_status st = loom_split_state_add_segment(out, (int64_t[]){2, 2}, 1);
        if (!st) st = loom_split_state_add_segment(out, (int64_t[]){1, 1}, 1);
        if (!st) st = loom_split_state_add_segment(out, (int64_t[]){3, 3}, 1);
        return st;
    }
    if (strcmp(t->name, "partial") == 0) loom_split_state_init(out, LOOM_SPLIT_PARTIAL, n);
    if (strcmp(t->name, "up") == 0) return loom_split_state_even(out, LOOM_SPLIT_AXIS_1, n, t->ne[1], 1, 0);
    if (strcmp(t->name, "down") == 0) return loom_split_state_even(out, LOOM_SPLIT_AXIS_0, n, t->ne[0], 1, 0);
    return LOOM_OK;
}

static int g_n;

static bool setup(fixture *f, int n, const char *opts) {
    memset(f, 0, sizeof *f);
    f->n = n;
    g_n = n;
    char spec[64];
    snprintf(spec, sizeof spec, "sim:%d%s", n, opts ? opts : "");
    if (loom_sim_reg_new_from_spec(spec, &f->reg) != LOOM_OK) return false;
    for (int j = 0; j < n; j++) f->devs[j] = loom_reg_dev_get(f->reg, (size_t)j);
    return loom_meta_device_new(f->devs, n, leaf, &g_n, &f->meta) == LOOM_OK;
}

static void teardown(fixture *f) {
    loom_meta_device_free(f->meta);
    loom_sim_reg_free(f->reg);
}

/* Device j's slice of meta tensor t (a non-view, allocated), as n bytes of F32. */
static loom_tensor slice_of(const loom_tensor *t, int j, size_t n) {
    loom_buffer_t db = loom_meta_buffer_member(t->buffer, j);
    size_t off = loom_meta_buffer_member_offset(t->buffer, t, j);
    LOOM_CHECK(off != SIZE_MAX);
    loom_tensor tmp = *t;
    tmp.buffer = db;
    tmp.data = (char *)loom_buffer_base(db) + off;
    tmp.ne[0] = (int64_t)(n / 4);
    tmp.ne[1] = tmp.ne[2] = tmp.ne[3] = 1;
    tmp.nb[1] = tmp.nb[2] = tmp.nb[3] = n;
    tmp.view_src = NULL;
    return tmp;
}

static void read_slice(const fixture *f, const loom_tensor *t, int j, void *out, size_t n) {
    loom_buffer_t db = loom_meta_buffer_member(t->buffer, j);
    size_t off = loom_meta_buffer_member_offset(t->buffer, t, j);
    LOOM_CHECK(off != SIZE_MAX);
    loom_tensor tmp = *t;
    tmp.buffer = db;
    tmp.data = (char *)loom_buffer_base(db) + off;
    tmp.ne[0] = (int64_t)(n / 4);
    tmp.ne[1] = tmp.ne[2] = tmp.ne[3] = 1;
    tmp.nb[1] = tmp.nb[2] = tmp.nb[3] = n;
    tmp.view_src = NULL;
    (void)f;
    loom_tensor_get(&tmp, out, 0, n);
}

LOOM_TEST(meta_buffer, names_and_memory) {
    fixture f;
    LOOM_REQUIRE(setup(&f, 3, ",mem=1GiB"));
    LOOM_CHECK(strcmp(loom_dev_name(f.meta), "Meta(SIM0,SIM1,SIM2)") == 0);
    LOOM_CHECK(strcmp(loom_buft_name(loom_dev_buffer_type(f.meta)), "Meta(SIM0,SIM1,SIM2)") == 0);
    size_t fr, tot;
    loom_dev_memory(f.meta, &fr, &tot);
    LOOM_CHECK_EQ_INT(tot, 3ull << 30);
    LOOM_CHECK(loom_dev_get_type(f.meta) == LOOM_DEV_TYPE_META);
    loom_backend_t be = loom_dev_init(f.meta, NULL);
    LOOM_REQUIRE(be != NULL);
    LOOM_CHECK(strcmp(loom_backend_name(be), "Meta(SIM0,SIM1,SIM2)") == 0);
    loom_backend_free(be);
    teardown(&f);
}

LOOM_TEST(meta_buffer, set_get_every_state) {
    fixture f;
    LOOM_REQUIRE(setup(&f, 2, NULL));
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead(), .no_alloc = true});
    /* [7, 5]: axis 1 split 3 + 2; axis 0 split 7 + 0 (an empty slice); fused segments */
    loom_tensor *a1 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 7, 5);
    loom_set_name(a1, "s1:3,2");
    loom_tensor *a0 = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 7, 5);
    loom_set_name(a0, "s0:7,0");
    loom_tensor *sg = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 12, 2);
    loom_set_name(sg, "seg");
    loom_tensor *mi = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4, 3);
    loom_set_name(mi, "mirror");
    loom_tensor *pa = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 6);
    loom_set_name(pa, "partial");
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(f.meta));
    LOOM_REQUIRE(buf != NULL);
    float x[35], y[35];
    for (int i = 0; i < 35; i++) x[i] = (float)i + 0.5f;
    loom_tensor *ts[3] = {a1, a0, sg};
    for (int k = 0; k < 3; k++) {
        size_t nb = loom_nbytes(ts[k]);
        loom_tensor_set(ts[k], x, 0, nb);
        memset(y, 0, sizeof y);
        loom_tensor_get(ts[k], y, 0, nb);
        LOOM_CHECK_MSG(memcmp(x, y, nb) == 0, "round trip of '%s'", ts[k]->name);
    }
    /* device slices hold exactly their pieces: a1 rows 0..2 on device 0, 3..4 on 1 */
    float d0[21], d1[14];
    read_slice(&f, a1, 0, d0, sizeof d0);
    read_slice(&f, a1, 1, d1, sizeof d1);
    LOOM_CHECK(d0[0] == x[0] && d0[20] == x[20] && d1[0] == x[21] && d1[13] == x[34]);
    /* seg: each row of 12 is [2 | 2 | 1 | 1 | 3 | 3]: device 1 gets elements 2,3,5,9,10,11 */
    float s1[12];
    read_slice(&f, sg, 1, s1, 6 * 4);
    LOOM_CHECK(s1[0] == x[2] && s1[1] == x[3] && s1[2] == x[5] && s1[3] == x[9] && s1[5] == x[11]);
    /* a partial-range write: elements 10..16 of a1 (rows 1 and 2 on device 0 only) */
    float patch[7] = {-1, -2, -3, -4, -5, -6, -7};
    loom_tensor_set(a1, patch, 10 * 4, sizeof patch);
    loom_tensor_get(a1, y, 0, 35 * 4);
    for (int i = 0; i < 35; i++) {
        float want = i >= 10 && i < 17 ? patch[i - 10] : x[i];
        if (!LOOM_CHECK_MSG(y[i] == want, "element %d: %g, want %g", i, y[i], want)) break;
    }
    read_slice(&f, a1, 1, d1, sizeof d1);
    LOOM_CHECK(d1[0] == x[21]); /* device 1 untouched */
    /* a range straddling the device boundary of a1 (rows 2 and 3) */
    loom_tensor_set(a1, patch, 18 * 4, sizeof patch);
    loom_tensor_get(a1, y, 0, 35 * 4);
    LOOM_CHECK(y[18] == -1 && y[20] == -3 && y[21] == -4 && y[24] == -7 && y[25] == x[25]);
    /* MIRRORED: every device holds it */
    loom_tensor_set(mi, x, 0, 12 * 4);
    for (int j = 0; j < 2; j++) {
        float m[12];
        read_slice(&f, mi, j, m, sizeof m);
        LOOM_CHECK(memcmp(m, x, sizeof m) == 0);
    }
    /* PARTIAL leaf: written as value + zeros, read back as the sum */
    loom_tensor_set(pa, x, 0, 6 * 4);
    float p0[6], p1[6], ps[6];
    read_slice(&f, pa, 0, p0, sizeof p0);
    read_slice(&f, pa, 1, p1, sizeof p1);
    LOOM_CHECK(p0[5] == x[5] && p1[5] == 0.0f);
    loom_tensor_get(pa, ps, 0, sizeof ps);
    for (int i = 0; i < 6; i++) LOOM_CHECK(ps[i] == x[i]);
    /* a device-side partial contribution shows up in the sum */
    float bump[6] = {1, 2, 3, 4, 5, 6};
    loom_tensor d1t = slice_of(pa, 1, sizeof bump);
    loom_tensor_set(&d1t, bump, 0, sizeof bump);
    loom_tensor_get(pa, ps, 0, sizeof ps);
    for (int i = 0; i < 6; i++) LOOM_CHECK(ps[i] == x[i] + bump[i]);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    teardown(&f);
}

/* h = silu(up x x) is split, o = down x h is PARTIAL: the planned compute buffer per device
 * shrinks as N grows (only the split activations shrink). */
static size_t planned_bytes(int n) {
    fixture f;
    if (!setup(&f, n, NULL)) return 0;
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 64 * loom_tensor_overhead() + loom_graph_overhead(64), .no_alloc = true});
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 16);
    loom_tensor *up = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 1024);
    loom_tensor *down = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 64);
    loom_set_name(x, "x");
    loom_set_name(up, "up");
    loom_set_name(down, "down");
    loom_tensor *h = loom_silu(ctx, loom_mul_mat(ctx, up, x));
    loom_tensor *h2 = loom_sqr(ctx, h);
    loom_tensor *o = loom_mul_mat(ctx, down, h2);
    loom_graph *g = loom_graph_new(ctx, 64);
    loom_graph_build_forward(g, o);
    loom_gallocr *ga = loom_gallocr_new(loom_dev_buffer_type(f.meta));
    size_t size = 0;
    if (ga && loom_gallocr_reserve(ga, g) == LOOM_OK) size = loom_gallocr_get_buffer_size(ga, 0);
    else loom_test_fail(__FILE__, __LINE__, "reserve: %s", loom_last_error());
    loom_gallocr_free(ga);
    loom_ctx_free(ctx);
    teardown(&f);
    return size;
}

LOOM_TEST(meta_buffer, activation_memory_falls_with_n) {
    size_t s1 = planned_bytes(1), s2 = planned_bytes(2), s4 = planned_bytes(4);
    fprintf(stderr, "compute buffer per device: N=1 %zu, N=2 %zu, N=4 %zu bytes\n", s1, s2, s4);
    LOOM_CHECK(s1 > 0 && s2 > 0 && s4 > 0);
    LOOM_CHECK(s2 < s1 && s4 < s2);
    /* the split activations (2 x [1024, 16] floats at N=1) dominate: N=4 needs well under half */
    LOOM_CHECK(s4 * 2 < s1);
}

LOOM_TEST(meta_buffer, device_out_of_memory_is_named) {
    fixture f;
    LOOM_REQUIRE(setup(&f, 2, ",mem=1MiB"));
    loom_buffer_t b = loom_buft_alloc_buffer(loom_dev_buffer_type(f.meta), 4u << 20);
    LOOM_CHECK(b == NULL);
    LOOM_CHECK(loom_last_status() == LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "Meta(SIM0,SIM1)");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    teardown(&f);
}

/* Two graphs (a 4-token and a 1-token one) alternating on one meta backend: each plan is
 * built once. */
LOOM_TEST(meta_buffer, plan_cache_holds_alternating_graphs) {
    fixture f;
    LOOM_REQUIRE(setup(&f, 2, NULL));
    loom_backend_t be = loom_dev_init(f.meta, NULL);
    LOOM_REQUIRE(be != NULL);
    loom_ctx *wctx = loom_ctx_new((loom_ctx_params){.mem_size = 8 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *up = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 32, 64);
    loom_tensor *down = loom_new_tensor_2d(wctx, LOOM_TYPE_F32, 64, 32);
    loom_set_name(up, "up");
    loom_set_name(down, "down");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(wctx, loom_dev_buffer_type(f.meta));
    LOOM_REQUIRE(wbuf != NULL);
    float w1[32 * 64], w2[64 * 32];
    for (int i = 0; i < 32 * 64; i++) w1[i] = w2[i] = (float)((i * 37) % 11 - 5) / 16.0f;
    loom_tensor_set(up, w1, 0, sizeof w1);
    loom_tensor_set(down, w2, 0, sizeof w2);
    loom_ctx *ctx[2];
    loom_graph *g[2];
    loom_tensor *x[2], *o[2];
    loom_buffer_t cb[2];
    for (int k = 0; k < 2; k++) {
        ctx[k] = loom_ctx_new((loom_ctx_params){.mem_size = 32 * loom_tensor_overhead() + loom_graph_overhead(32), .no_alloc = true});
        x[k] = loom_new_tensor_2d(ctx[k], LOOM_TYPE_F32, 32, k ? 1 : 4);
        o[k] = loom_mul_mat(ctx[k], down, loom_silu(ctx[k], loom_mul_mat(ctx[k], up, x[k])));
        g[k] = loom_graph_new(ctx[k], 32);
        loom_graph_build_forward(g[k], o[k]);
        cb[k] = loom_alloc_ctx_tensors(ctx[k], loom_dev_buffer_type(f.meta));
        LOOM_REQUIRE(cb[k] != NULL);
        float xin[128];
        for (int i = 0; i < 128; i++) xin[i] = (float)(i % 7) / 7.0f;
        loom_tensor_set(x[k], xin, 0, loom_nbytes(x[k]));
    }
    loom_meta_backend_reset_stats(be);
    for (int r = 0; r < 6; r++) LOOM_CHECK(loom_backend_graph_compute(be, g[r % 2]) == LOOM_OK);
    loom_meta_stats ms;
    loom_meta_backend_get_stats(be, &ms);
    LOOM_CHECK_EQ_INT(ms.graphs, 6);
    LOOM_CHECK_EQ_INT(ms.plans_built, 2);
    LOOM_CHECK_EQ_INT(ms.reductions, 6);
    for (int k = 0; k < 2; k++) {
        loom_buffer_free(cb[k]);
        loom_ctx_free(ctx[k]);
    }
    loom_buffer_free(wbuf);
    loom_ctx_free(wctx);
    loom_backend_free(be);
    teardown(&f);
}

/* A weight split along K times whole activations: every device multiplies by its own
 * K-slice of the activations and the partial sums are reduced (devices with an empty
 * slice contribute zeros). Checked against the CPU for uneven and empty slices. */
static void kslice_case(int n, int64_t K) {
    fixture f;
    LOOM_REQUIRE(setup(&f, n, NULL));
    loom_backend_t be = loom_dev_init(f.meta, NULL);
    loom_backend_t cpu = loom_cpu_backend_new(1);
    LOOM_REQUIRE(be && cpu);
    const int64_t M = 8, N = 3;
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 16 * loom_tensor_overhead() + loom_graph_overhead(16), .no_alloc = true});
    loom_tensor *down = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, M);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
    loom_set_name(down, "down");
    loom_set_name(x, "x");
    loom_tensor *o = loom_mul_mat(ctx, down, x);
    loom_graph *g = loom_graph_new(ctx, 16);
    LOOM_REQUIRE(o && g && loom_graph_build_forward(g, o) == LOOM_OK);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(f.meta));
    LOOM_REQUIRE(buf != NULL);
    float *w = malloc(sizeof(float) * (size_t)(K * M)), *xi = malloc(sizeof(float) * (size_t)(K * N));
    for (int64_t i = 0; i < K * M; i++) w[i] = loom_test_randf(-1, 1);
    for (int64_t i = 0; i < K * N; i++) xi[i] = loom_test_randf(-1, 1);
    loom_tensor_set(down, w, 0, loom_nbytes(down));
    loom_tensor_set(x, xi, 0, loom_nbytes(x));
    loom_split_state s;
    LOOM_CHECK(loom_meta_tensor_state(f.meta, o, false, &s) == LOOM_OK && s.axis == LOOM_SPLIT_PARTIAL);
    LOOM_REQUIRE(loom_backend_graph_compute(be, g) == LOOM_OK);
    float got[24];
    loom_tensor_get(o, got, 0, sizeof(float) * (size_t)(M * N));
    for (int64_t c = 0; c < N; c++)
        for (int64_t r = 0; r < M; r++) {
            double want = 0;
            for (int64_t k = 0; k < K; k++) want += (double)w[r * K + k] * xi[c * K + k];
            LOOM_CHECK_NEAR(got[c * M + r], want, 1e-4);
        }
    free(w);
    free(xi);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    loom_backend_free(cpu);
    loom_backend_free(be);
    teardown(&f);
}

LOOM_TEST(meta_buffer, k_split_weight_times_whole_activations) {
    kslice_case(3, 100); /* 34 + 33 + 33 */
    kslice_case(8, 4);   /* four devices hold nothing of K */
}
