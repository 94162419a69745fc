/*
 * sim computes what the CPU backend computes (the oracle): matmul with F32/F16/Q8_0
 * weights, rms_norm+mul+add chains and softmax, bit-for-bit or within 1e-6. Then the
 * asynchronous machinery under load: two devices computing at once, ordered only by events
 * and async copies, checked against the CPU over many iterations to catch races.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

static loom_ctx *new_ctx(int n_tensors) {
    loom_ctx_params p = {
        .mem_size = (size_t)n_tensors * loom_tensor_overhead() +
                    loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    return loom_ctx_new(p);
}

/* Deterministic values from a tensor name and a seed, so two copies of one graph (one on
 * the CPU, one on sim) get the same inputs. */
static float value_of(const char *name, uint32_t seed, int64_t i) {
    uint32_t h = 2166136261u ^ seed;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    h ^= (uint32_t)i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h & 0xffffff) / (float)0x800000 - 1.0f; /* [-1, 1) */
}

/* Writes the value pattern into an input tensor in its own type (F32/F16/Q8_0/I32). */
static void fill_input(loom_tensor *t, uint32_t seed) {
    int64_t n = loom_nelements(t);
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = value_of(t->name, seed, i);
    size_t bytes = loom_nbytes(t);
    void *raw = malloc(bytes);
    const loom_type_traits *tr = loom_type_traits_get(t->type);
    if (t->type == LOOM_TYPE_F32) {
        memcpy(raw, f, bytes);
    } else if (tr->from_float) {
        tr->from_float(f, raw, n);
    } else {
        memset(raw, 0, bytes);
    }
    loom_tensor_set(t, raw, 0, bytes);
    free(raw);
    free(f);
}

static void fill_inputs(loom_ctx *ctx, uint32_t seed) {
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); t; t = loom_ctx_next_tensor(ctx, t)) {
        if (t->flags & LOOM_TENSOR_FLAG_INPUT) fill_input(t, seed);
    }
}

static loom_tensor *input(loom_ctx *ctx, const char *name, loom_type type, int64_t ne0, int64_t ne1,
                          int64_t ne2) {
    loom_tensor *t = loom_new_tensor_3d(ctx, type, ne0, ne1, ne2);
    if (!t) return NULL;
    loom_set_name(t, name);
    loom_set_input(t);
    return t;
}

typedef loom_tensor *(*build_fn)(loom_ctx *ctx);

static loom_tensor *build_matmul(loom_ctx *ctx, loom_type wtype) {
    loom_tensor *w = input(ctx, "w", wtype, 64, 48, 1);
    loom_tensor *x = input(ctx, "x", LOOM_TYPE_F32, 64, 7, 1);
    return loom_mul_mat(ctx, w, x);
}
static loom_tensor *build_mm_f32(loom_ctx *ctx) {
    return build_matmul(ctx, LOOM_TYPE_F32);
}
static loom_tensor *build_mm_f16(loom_ctx *ctx) {
    return build_matmul(ctx, LOOM_TYPE_F16);
}
static loom_tensor *build_mm_q8(loom_ctx *ctx) {
    return build_matmul(ctx, LOOM_TYPE_Q8_0);
}

static loom_tensor *build_norm_chain(loom_ctx *ctx) {
    loom_tensor *x = input(ctx, "x", LOOM_TYPE_F32, 96, 5, 2);
    for (int l = 0; l < 3; l++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", l);
        loom_tensor *g = input(ctx, name, LOOM_TYPE_F32, 96, 1, 1);
        loom_tensor *h = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), g);
        x = loom_add(ctx, h, x);
    }
    return x;
}

static loom_tensor *build_softmax(loom_ctx *ctx) {
    loom_tensor *a = input(ctx, "a", LOOM_TYPE_F32, 33, 6, 2);
    loom_tensor *mask = input(ctx, "mask", LOOM_TYPE_F32, 33, 6, 1);
    loom_tensor *s1 = loom_soft_max_ext(ctx, a, mask, NULL, 0.7f, 0.0f);
    return loom_add(ctx, s1, loom_soft_max(ctx, a));
}

typedef struct {
    loom_ctx *ctx;
    loom_graph *g;
    loom_tensor *out;
    loom_buffer_t buf;
} run_t;

static bool run_setup(run_t *r, build_fn build, loom_buft_t buft) {
    memset(r, 0, sizeof *r);
    r->ctx = new_ctx(64);
    if (!r->ctx) return false;
    r->out = build(r->ctx);
    if (!r->out) return false;
    loom_set_output(r->out);
    r->g = loom_graph_new(r->ctx, LOOM_DEFAULT_GRAPH_SIZE);
    if (!r->g || loom_graph_build_forward(r->g, r->out) != LOOM_OK) return false;
    r->buf = loom_alloc_ctx_tensors(r->ctx, buft);
    return r->buf != NULL;
}

static void run_free(run_t *r) {
    loom_buffer_free(r->buf);
    loom_ctx_free(r->ctx);
}

/* Runs build on the CPU backend and on a sim device; returns the max abs difference. */
static double cpu_vs_sim(build_fn build, loom_backend_t cpu, loom_backend_t sim, float **out_ref,
                         int64_t *n_out) {
    run_t rc, rs;
    if (!run_setup(&rc, build, loom_backend_default_buft(cpu)) ||
        !run_setup(&rs, build, loom_backend_default_buft(sim))) {
        loom_test_fail(__FILE__, __LINE__, "setup failed: %s", loom_last_error());
        return INFINITY;
    }
    fill_inputs(rc.ctx, 7);
    fill_inputs(rs.ctx, 7);
    double maxdiff = INFINITY;
    if (loom_backend_graph_compute(cpu, rc.g) == LOOM_OK &&
        loom_backend_graph_compute(sim, rs.g) == LOOM_OK) {
        int64_t n = loom_nelements(rc.out);
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        loom_tensor_get(rc.out, a, 0, (size_t)n * sizeof *a);
        loom_tensor_get(rs.out, b, 0, (size_t)n * sizeof *b);
        maxdiff = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            if (!(d <= maxdiff)) maxdiff = d; /* NaN propagates as a failure */
        }
        free(b);
        if (out_ref) {
            *out_ref = a;
            *n_out = n;
        } else {
            free(a);
        }
    } else {
        loom_test_fail(__FILE__, __LINE__, "compute failed: %s", loom_last_error());
    }
    run_free(&rc);
    run_free(&rs);
    return maxdiff;
}

LOOM_TEST(sim_compute, matches_cpu) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,threads=2", &reg) == LOOM_OK);
    loom_backend_t cpu = loom_cpu_backend_new(2);
    loom_backend_t sim = loom_dev_init(loom_reg_dev_get(reg, 1), NULL);
    LOOM_REQUIRE(cpu && sim);
    struct {
        const char *name;
        build_fn build;
    } graphs[] = {
        {"matmul f32", build_mm_f32}, {"matmul f16", build_mm_f16},
        {"matmul q8_0", build_mm_q8}, {"rms_norm+mul+add x3", build_norm_chain},
        {"softmax", build_softmax},
    };
    for (size_t i = 0; i < sizeof graphs / sizeof graphs[0]; i++) {
        float *ref = NULL;
        int64_t n = 0;
        double d = cpu_vs_sim(graphs[i].build, cpu, sim, &ref, &n);
        LOOM_CHECK_MSG(d <= 1e-6, "%s: sim differs from cpu by %g", graphs[i].name, d);
        /* Guard against both being trivially equal (e.g. all zeros). */
        double norm = 0;
        for (int64_t k = 0; k < n; k++)
            norm += fabs(ref[k]);
        LOOM_CHECK_MSG(n > 0 && norm > 1e-3, "%s: output is empty or zero", graphs[i].name);
        free(ref);
    }
    loom_sim_stats st;
    loom_sim_dev_stats(loom_reg_dev_get(reg, 1), &st);
    LOOM_CHECK_EQ_INT(st.graphs, 5);
    LOOM_CHECK(st.nodes >= 5);
    LOOM_CHECK(st.bytes_in > 0 && st.bytes_out > 0);
    loom_backend_free(sim);
    loom_backend_free(cpu);
    loom_sim_reg_free(reg);
}

/* Under a pinning policy each device's worker runs its own queue (synchronize waits
 * instead of running the commands on the caller): the same results, no hang. */
LOOM_TEST(sim_compute, matches_cpu_with_pinned_workers) {
    const loom_affinity pol[] = {LOOM_AFFINITY_COMPACT, LOOM_AFFINITY_NONE};
    for (int k = 0; k < 2; k++) {
        loom_cpu_set_affinity(pol[k]);
        loom_reg_t reg = NULL;
        LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2", &reg) == LOOM_OK);
        loom_backend_t cpu = loom_cpu_backend_new(2);
        loom_backend_t sim = loom_dev_init(loom_reg_dev_get(reg, 0), NULL);
        LOOM_REQUIRE(cpu && sim);
        for (int rep = 0; rep < 3; rep++) {
            double d = cpu_vs_sim(build_mm_q8, cpu, sim, NULL, NULL);
            LOOM_CHECK_MSG(d <= 1e-6, "%s: sim differs from cpu by %g",
                           loom_affinity_name(pol[k]), d);
            d = cpu_vs_sim(build_norm_chain, cpu, sim, NULL, NULL);
            LOOM_CHECK_MSG(d <= 1e-6, "%s: sim differs from cpu by %g",
                           loom_affinity_name(pol[k]), d);
        }
        loom_sim_stats st;
        loom_sim_dev_stats(loom_reg_dev_get(reg, 0), &st);
        LOOM_CHECK_EQ_INT(st.graphs, 6);
        loom_backend_free(sim);
        loom_backend_free(cpu);
        loom_sim_reg_free(reg);
    }
    loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
}

/* An independent check of the F32 matmul on sim: a plain triple loop. */
LOOM_TEST(sim_compute, matmul_against_naive_loop) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &reg) == LOOM_OK);
    loom_backend_t sim = loom_dev_init(loom_reg_dev_get(reg, 0), NULL);
    LOOM_REQUIRE(sim != NULL);
    run_t r;
    LOOM_REQUIRE(run_setup(&r, build_mm_f32, loom_backend_default_buft(sim)));
    fill_inputs(r.ctx, 3);
    LOOM_REQUIRE(loom_backend_graph_compute(sim, r.g) == LOOM_OK);
    float out[48 * 7];
    loom_tensor_get(r.out, out, 0, sizeof out);
    for (int n = 0; n < 7; n++) {
        for (int m = 0; m < 48; m++) {
            double acc = 0;
            for (int k = 0; k < 64; k++) {
                acc += (double)value_of("w", 3, m * 64 + k) * (double)value_of("x", 3, n * 64 + k);
            }
            LOOM_CHECK_NEAR(out[n * 48 + m], acc, 1e-4);
        }
    }
    run_free(&r);
    loom_backend_free(sim);
    loom_sim_reg_free(reg);
}

/* ---------------------------------------------------------------- two devices at once */

enum { D = 256, T = 8, L = 12, DOUT = 64 };

/* Stage 0: a long chain producing X [D, T]. */
static loom_tensor *stage0(loom_ctx *ctx, loom_tensor *x) {
    loom_tensor *w = input(ctx, "w0", LOOM_TYPE_F32, D, D, 1);
    loom_tensor *h = x;
    for (int l = 0; l < L; l++)
        h = loom_rms_norm(ctx, loom_mul_mat(ctx, w, h), 1e-6f);
    return h;
}

/* Stage 1: Y = silu(W1 X) [DOUT, T]. */
static loom_tensor *stage1(loom_ctx *ctx, loom_tensor *x) {
    loom_tensor *w = input(ctx, "w1", LOOM_TYPE_F32, D, DOUT, 1);
    return loom_silu(ctx, loom_mul_mat(ctx, w, x));
}

typedef struct {
    loom_ctx *ctx;
    loom_tensor *x_in, *out;
    loom_graph *g;
    loom_buffer_t buf;
} stage_t;

static bool stage_setup(stage_t *s, int which, loom_tensor *alias_of, loom_buft_t buft) {
    memset(s, 0, sizeof *s);
    s->ctx = new_ctx(64);
    if (!s->ctx) return false;
    s->x_in = loom_new_tensor_2d(s->ctx, LOOM_TYPE_F32, D, T);
    loom_set_name(s->x_in, "x");
    if (alias_of) {
        /* The stage-1 input is stage 0's output itself (shared host memory). */
        size_t off = (size_t)((char *)alias_of->data - (char *)loom_buffer_base(alias_of->buffer));
        if (loom_buffer_alloc_tensor(alias_of->buffer, s->x_in, off) != LOOM_OK) return false;
    }
    s->out = which == 0   ? stage0(s->ctx, s->x_in)
             : which == 1 ? stage1(s->ctx, s->x_in)
                          : stage1(s->ctx, stage0(s->ctx, s->x_in));
    if (!s->out) return false;
    s->g = loom_graph_new(s->ctx, LOOM_DEFAULT_GRAPH_SIZE);
    if (!s->g || loom_graph_build_forward(s->g, s->out) != LOOM_OK) return false;
    s->buf = loom_alloc_ctx_tensors(s->ctx, buft);
    return s->buf != NULL;
}

static void stage_free(stage_t *s) {
    loom_buffer_free(s->buf);
    loom_ctx_free(s->ctx);
}

static void x_values(float *x, int iter) {
    for (int i = 0; i < D * T; i++)
        x[i] = value_of("input", (uint32_t)iter + 100, i);
}

/* Reference: the whole pipeline on the CPU backend for input `x`. */
static void cpu_reference(loom_backend_t cpu, stage_t *ref, const float *x, float *y) {
    loom_tensor_set(ref->x_in, x, 0, sizeof(float) * D * T);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(cpu, ref->g), LOOM_OK);
    loom_tensor_get(ref->out, y, 0, sizeof(float) * DOUT * T);
}

static int count_mismatches(const float *a, const float *b, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!(fabsf(a[i] - b[i]) <= 1e-5f * (1.0f + fabsf(b[i])))) bad++;
    }
    return bad;
}

/* Device 0 computes X and records an event; device 1 waits for it, copies X over and
 * computes on it. Any ordering bug makes device 1 read a stale or half-written X. */
LOOM_TEST(sim_compute, events_and_async_copies_order_two_devices) {
    enum { ITERS = 12 };
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2", &reg) == LOOM_OK);
    loom_dev_t d0 = loom_reg_dev_get(reg, 0), d1 = loom_reg_dev_get(reg, 1);
    loom_backend_t b0 = loom_dev_init(d0, NULL), b1 = loom_dev_init(d1, NULL);
    loom_backend_t cpu = loom_cpu_backend_new(1);
    LOOM_REQUIRE(b0 && b1 && cpu);
    stage_t s0, s1, ref;
    LOOM_REQUIRE(stage_setup(&s0, 0, NULL, loom_dev_buffer_type(d0)));
    LOOM_REQUIRE(stage_setup(&s1, 1, NULL, loom_dev_buffer_type(d1)));
    LOOM_REQUIRE(stage_setup(&ref, 2, NULL, loom_cpu_buffer_type()));
    fill_inputs(s0.ctx, 1);
    fill_inputs(s1.ctx, 1);
    fill_inputs(ref.ctx, 1); /* same names, same seed: same weights */
    loom_event_t ev = loom_event_new(d0);
    LOOM_REQUIRE(ev != NULL);

    static float x[D * T], y[DOUT * T], want[DOUT * T];
    int failed_iters = 0;
    for (int it = 0; it < ITERS; it++) {
        x_values(x, it);
        cpu_reference(cpu, &ref, x, want);
        memset(y, 0, sizeof y);
        loom_backend_tensor_set_async(b0, s0.x_in, x, 0, sizeof x);
        LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b0, s0.g), LOOM_OK);
        loom_event_record(ev, b0);
        loom_event_wait(b1, ev);
        LOOM_CHECK_EQ_INT(loom_backend_tensor_copy_async(b0, b1, s0.out, s1.x_in), LOOM_OK);
        LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b1, s1.g), LOOM_OK);
        loom_backend_tensor_get_async(b1, s1.out, y, 0, sizeof y);
        loom_backend_synchronize(b1);
        if (count_mismatches(y, want, DOUT * T) > 0) failed_iters++;
    }
    LOOM_CHECK_EQ_INT(failed_iters, 0);
    loom_backend_synchronize(b0);
    loom_sim_stats st0, st1;
    loom_sim_dev_stats(d0, &st0);
    loom_sim_dev_stats(d1, &st1);
    LOOM_CHECK_EQ_INT(st0.graphs, ITERS);
    LOOM_CHECK_EQ_INT(st1.graphs, ITERS);
    LOOM_CHECK(st1.bytes_in >= (uint64_t)ITERS * D * T * sizeof(float));

    loom_event_free(ev);
    stage_free(&s0);
    stage_free(&s1);
    stage_free(&ref);
    loom_backend_free(b0);
    loom_backend_free(b1);
    loom_backend_free(cpu);
    loom_sim_reg_free(reg);
}

/* With shared host memory there is no copy at all: only the event orders device 1's read
 * of X after device 0's write. */
LOOM_TEST(sim_compute, event_wait_alone_orders_shared_memory) {
    enum { ITERS = 12 };
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,hostmem=1", &reg) == LOOM_OK);
    loom_dev_t d0 = loom_reg_dev_get(reg, 0), d1 = loom_reg_dev_get(reg, 1);
    loom_backend_t b0 = loom_dev_init(d0, NULL), b1 = loom_dev_init(d1, NULL);
    loom_backend_t cpu = loom_cpu_backend_new(1);
    LOOM_REQUIRE(b0 && b1 && cpu);
    stage_t s0, s1, ref;
    LOOM_REQUIRE(stage_setup(&s0, 0, NULL, loom_dev_buffer_type(d0)));
    LOOM_REQUIRE(stage_setup(&s1, 1, s0.out, loom_dev_buffer_type(d1)));
    LOOM_REQUIRE(stage_setup(&ref, 2, NULL, loom_cpu_buffer_type()));
    LOOM_REQUIRE(s1.x_in->data == s0.out->data);
    fill_inputs(s0.ctx, 1);
    fill_inputs(s1.ctx, 1);
    fill_inputs(ref.ctx, 1);
    loom_event_t ev = loom_event_new(d0);
    LOOM_REQUIRE(ev != NULL);

    static float x[D * T], y[DOUT * T], want[DOUT * T];
    int failed_iters = 0;
    for (int it = 0; it < ITERS; it++) {
        x_values(x, it);
        cpu_reference(cpu, &ref, x, want);
        loom_backend_tensor_set_async(b0, s0.x_in, x, 0, sizeof x);
        LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b0, s0.g), LOOM_OK);
        loom_event_record(ev, b0);
        loom_event_wait(b1, ev);
        LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b1, s1.g), LOOM_OK);
        loom_backend_tensor_get_async(b1, s1.out, y, 0, sizeof y);
        loom_backend_synchronize(b1);
        if (count_mismatches(y, want, DOUT * T) > 0) failed_iters++;
    }
    LOOM_CHECK_EQ_INT(failed_iters, 0);
    loom_sim_stats st;
    loom_sim_dev_stats(d1, &st);
    LOOM_CHECK_EQ_INT(st.bytes_in + st.bytes_out, 0); /* host memory: no link traffic */

    loom_event_free(ev);
    stage_free(&s1); /* s1's x aliases s0's buffer: free s1 first */
    stage_free(&s0);
    stage_free(&ref);
    loom_backend_free(b0);
    loom_backend_free(b1);
    loom_backend_free(cpu);
    loom_sim_reg_free(reg);
}

/* event_synchronize blocks the host until the recorded work is done. */
LOOM_TEST(sim_compute, event_synchronize_waits_for_the_graph) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1,threads=2", &reg) == LOOM_OK);
    loom_dev_t d0 = loom_reg_dev_get(reg, 0);
    loom_backend_t b0 = loom_dev_init(d0, NULL);
    loom_backend_t cpu = loom_cpu_backend_new(1);
    LOOM_REQUIRE(b0 && cpu);
    stage_t s0, ref;
    LOOM_REQUIRE(stage_setup(&s0, 0, NULL, loom_dev_buffer_type(d0)));
    LOOM_REQUIRE(stage_setup(&ref, 0, NULL, loom_cpu_buffer_type()));
    fill_inputs(s0.ctx, 1);
    fill_inputs(ref.ctx, 1);
    loom_event_t ev = loom_event_new(d0);
    LOOM_REQUIRE(ev != NULL);
    loom_event_synchronize(ev); /* never recorded: returns at once */
    static float x[D * T], got[D * T], want[D * T];
    for (int it = 0; it < 6; it++) {
        x_values(x, it);
        loom_tensor_set(ref.x_in, x, 0, sizeof x);
        LOOM_REQUIRE(loom_backend_graph_compute(cpu, ref.g) == LOOM_OK);
        loom_tensor_get(ref.out, want, 0, sizeof want);
        loom_backend_tensor_set_async(b0, s0.x_in, x, 0, sizeof x);
        LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b0, s0.g), LOOM_OK);
        loom_event_record(ev, b0);
        loom_event_synchronize(ev);
        loom_tensor_get(s0.out, got, 0, sizeof got); /* sync read, no backend sync */
        LOOM_CHECK_EQ_INT(count_mismatches(got, want, D * T), 0);
    }
    /* Freeing an event with a record still queued is safe (reference counted). */
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute_async(b0, s0.g), LOOM_OK);
    loom_event_record(ev, b0);
    loom_event_free(ev);
    loom_backend_synchronize(b0);
    stage_free(&s0);
    stage_free(&ref);
    loom_backend_free(b0);
    loom_backend_free(cpu);
    loom_sim_reg_free(reg);
}
